// OpDescriptor: what a kernel is asked to run — the op, the layout of its inputs, its attributes and the
// device — without the data. Kernels answer `supports(OpDescriptor)`, the dispatcher keys its decisions and
// the autotune cache on `OpDescriptor::signature()`.
//
// Ownership: plain values, copyable. Thread-safety: none needed (immutable once built).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/export.h"

namespace xpuruntime {

class Tensor;

// One input or output as a kernel sees it. `present == false` marks an optional input that was not given
// (e.g. the bias of `linear`).
struct XPURT_API TensorDesc {
  bool present = false;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements; contiguous when built from a contiguous tensor
  Device device;
  std::uint32_t alignment = 256;  // largest power of two (<= 256) dividing the data address, in bytes
  // The engine runs this input from one constant of its plan: the same tensor, bytes unchanged, on every launch of
  // the step. A kernel may keep what it derives from it (packed weights: Note [Weights packed once per plan] in
  // backends/cpu/cpu_gemm.cpp). Not part of the signature: it changes no kernel's choice.
  bool constant = false;

  static TensorDesc of(const Tensor& tensor);  // an undefined tensor gives `present == false`
  // The largest power of two (<= 256) dividing `data`'s address, in bytes: what `alignment` records.
  static std::uint32_t alignment_of(const void* data);
  // A present, contiguous tensor of `shape` (what a kernel is asked about before any data exists).
  static TensorDesc contiguous(const std::vector<std::int64_t>& shape, DType dtype, Device device,
                               std::uint32_t alignment = 256);
  std::int64_t numel() const;
  bool is_contiguous() const;
  int dim() const { return static_cast<int>(shape.size()); }
  std::string str() const;  // "float16[8,128,64]" (+ ":strided" when not contiguous)
};

// Attribute values: integers, floats, strings and lists of integers or floats.
using AttrValue = std::variant<std::int64_t, double, std::string, std::vector<std::int64_t>, std::vector<double>>;

// Named attributes, kept sorted so that the signature is canonical.
class XPURT_API Attributes {
 public:
  Attributes() = default;
  Attributes& set(const std::string& name, AttrValue value);
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // Typed getters: the default when absent; InvalidArgumentError when present with another type.
  std::int64_t get_int(const std::string& name, std::int64_t default_value) const;
  double get_float(const std::string& name, double default_value) const;  // also accepts an integer
  std::string get_string(const std::string& name, const std::string& default_value) const;
  std::vector<std::int64_t> get_ints(const std::string& name, const std::vector<std::int64_t>& default_value) const;
  std::vector<double> get_floats(const std::string& name, const std::vector<double>& default_value) const;
  const std::map<std::string, AttrValue>& values() const { return values_; }
  std::string str() const;  // "{axis=1,epsilon=1e-05}"

 private:
  std::map<std::string, AttrValue> values_;
};

// The precision and determinism the ExecutionPolicy asks of kernels (copied into every descriptor).
// kFP8 and kInt4Weights (and kInt8 for a float model) name what a session's quantization decisions make of the
// model (ExecutionPolicy::quantization): its QDQ nodes carry the precision, the other ops compute as under fp32.
enum class Precision : std::uint8_t { kFP32, kTF32, kFP16, kBF16, kInt8, kFP8, kInt4Weights };
// "fp32", "tf32", "fp16", "bf16", "int8", "fp8", "int4-weights"
XPURT_API const char* precision_name(Precision precision);
// The precision kernels see (OpDescriptor::precision) under a policy's: fp8 and int4-weights are carried by the
// model's QDQ nodes (their types and scales), so every other op computes as under fp32.
inline Precision kernel_precision(Precision precision) {
  return precision == Precision::kFP8 || precision == Precision::kInt4Weights ? Precision::kFP32 : precision;
}

struct XPURT_API OpDescriptor {
  std::string op;                   // fine-grained op name: "matmul", "linear", "conv2d", "softmax", ...
  std::vector<TensorDesc> inputs;   // in the op schema's order; optional ones may be absent
  std::vector<TensorDesc> outputs;  // filled by the op schema's shape inference
  Attributes attrs;
  Device device;                    // where the op runs (the device of its inputs)
  int compute_capability = 0;       // major * 10 + minor of a CUDA device, 0 on CPU
  Precision precision = Precision::kFP32;
  bool deterministic = false;

  // Canonical text identifying everything that can change a kernel's choice or plan, e.g.
  // "matmul(float16[64,128],float16[128,32]){} cuda:0 sm90 fp32". Keys the plan and autotune caches.
  std::string signature() const;
};

}  // namespace xpuruntime
