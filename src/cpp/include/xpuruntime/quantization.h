// Quantization decisions and the one writer of QDQ models (docs/quantization.md).
//
// The Python SDK's planner (xpuruntime.quantization.plan: calibration, weight scales, the exclude list) makes the
// *decisions*, one JSON document (format "xpuruntime.quantization/1"); everything below is what C++ does with them:
// QuantizationDecisions reads and validates that document (ExecutionPolicy::quantization holds it, so policy files
// carry it), and apply_quantization writes the QDQ model of a float ONNX model under it. The Python quantizer calls
// apply_quantization too (through the bindings), so a model quantized in Python, replayed from a decisions file, or
// built by a C++ InferenceSession whose policy carries the decisions is the same bytes (Note [Decisions, then the
// model] in frontends/onnx/onnx_quantize.cpp).
//
// QuantizationDecisions is implemented in core (core/quantization_decisions.cpp); apply_quantization and
// upgrade_opset by the ONNX frontend (frontends/onnx/onnx_quantize.cpp), compiled into the same library.
//
// Ownership: plain values. Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/export.h"

namespace xpuruntime {

// One activation's QuantizeLinear/DequantizeLinear pair: per-tensor scale and zero point.
struct XPURT_API QuantizedActivation {
  std::string dtype;  // "int8", "uint8" or "float8e4m3fn"
  float scale = 1.0f;
  std::int64_t zero_point = 0;
};

// One constant's stored form (a weight, or an int32 bias) and its DequantizeLinear.
struct XPURT_API QuantizedConstant {
  std::string dtype;               // weights "int8", "float8e4m3fn" or "int4"; biases "int32"
  bool has_axis = false;           // false: one scale for the tensor
  std::int64_t axis = 0;
  std::int64_t block_size = 0;     // int4 blocks along `axis`; 0: none
  std::vector<float> scale;        // row-major over scale_shape
  std::vector<std::int64_t> scale_shape;  // the scale tensor's dims: {} for one scale, {n} per axis, blocked: the
                                          // weight's dims with ceil(dim / block_size) on `axis`
};

struct XPURT_API QuantizationDecisions {
  static constexpr const char* kFormat = "xpuruntime.quantization/1";

  std::string precision;                  // "int8", "fp8" or "int4-weights"
  std::vector<std::string> nodes;         // node keys quantized: the node's name, or "<op_type>_<index>"
  std::vector<std::pair<std::string, std::string>> excluded;  // node key -> why it stays float
  std::map<std::string, QuantizedActivation> activations;     // by value name
  std::map<std::string, QuantizedConstant> weights;           // by initializer name
  std::map<std::string, QuantizedConstant> biases;            // by initializer name
  std::string model_sha256;               // of the float model they were made for ("" when absent)

  // Parses and validates the JSON the Python quantizer writes (QuantizationResult.decisions): the format, every
  // key known (an unknown key, at the top or in an entry, is an InvalidArgumentError naming it and the valid ones),
  // the types and values (dtypes, positive finite scales, scale counts against scale_shape). `what` names the
  // document in messages.
  static QuantizationDecisions from_json(const std::string& text, const std::string& what = "quantization decisions");
  // The canonical JSON of a valid document: keys sorted, compact, numbers as they were (a float32 scale written by
  // Python reads back as the same float32). InvalidArgumentError as from_json.
  static std::string canonical_json(const std::string& text, const std::string& what = "quantization decisions");
  // One line for explain(): "quantization: 3 nodes quantized (int8), 1 excluded".
  std::string summary() const;
};

// The default-domain ONNX opset each precision's QDQ form needs: int8 13, fp8 19, int4-weights 21.
XPURT_API int quantization_opset(const std::string& precision);

struct XPURT_API ApplyQuantizationOptions {
  // Nodes (keys as in QuantizationDecisions::nodes) left float although the decisions quantize them (the
  // sensitivity analysis measures nodes one at a time with it).
  std::vector<std::string> skip_nodes;
  // Folder of the model's external-data files, for weights stored there (read, quantized and stored inline); "":
  // a weight with external data is refused.
  std::string model_dir;
};

// The QDQ model of the serialized float ONNX model `model_bytes` under `decisions`, serialized deterministically:
// QuantizeLinear/DequantizeLinear pairs before each quantized node's activations, its weights stored quantized with
// a DequantizeLinear (int32 biases likewise), the opset raised as upgrade_opset does, unused initializers dropped.
// The same inputs give the same bytes. InvalidArgumentError for a model that does not parse, a decision naming a
// node or value the model lacks, an opset that cannot be raised safely.
XPURT_API std::string apply_quantization(const std::string& model_bytes, const QuantizationDecisions& decisions,
                                         const ApplyQuantizationOptions& options = {});

// `model_bytes` with its default-domain opset import raised to at least `needed` and its IR version to what that
// opset requires, when every default-domain op means the same under both (Note [Opset upgrades the quantizer makes]
// in frontends/onnx/onnx_quantize.cpp; Reduce*-18 and Split-18 nodes are rewritten); the model unchanged when its
// opset is already `needed` or newer. `*version` (when given): the opset afterwards. InvalidArgumentError naming
// the blocking ops and `why` otherwise.
XPURT_API std::string upgrade_opset(const std::string& model_bytes, int needed, const std::string& why,
                                    int* version = nullptr);

}  // namespace xpuruntime
