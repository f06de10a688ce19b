// Graph: what to run (runtime_graph_capture.md section 1). The native engine's IR, close to ONNX's: values are
// named, nodes are ONNX nodes (ONNX domains, plus the "com.xpuruntime" domain of fused nodes made by the graph
// passes), constants are CPU tensors. A Graph knows no kernels and no devices: the CapturePlan fixes those.
//
//   Graph g = import_onnx(bytes, {});        // onnx_import.h
//   g.validate();                             // topological order, every input produced once
//   for (const Node& n : g.nodes) ...
//
// Ownership: plain values (tensors share storage when a Graph is copied: constants are never written).
// Thread-safety: none (build-time object); a built CapturePlan owns its own copy.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "xpuruntime/dtype.h"
#include "xpuruntime/export.h"
#include "xpuruntime/op_descriptor.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime {

// The domain of nodes made by xpuruntime's graph passes (FusedConv, Linear, Attention, ...).
inline constexpr const char* kXpurtDomain = "com.xpuruntime";

// One dimension of a value's shape: a size, a symbol ("batch") or unknown (value < 0, symbol empty).
struct XPURT_API Dim {
  std::int64_t value = -1;
  std::string symbol;
  Dim() = default;
  Dim(std::int64_t v) : value(v) {}  // NOLINT(google-explicit-constructor): Dim d = 3 reads well
  explicit Dim(std::string s) : symbol(std::move(s)) {}
  bool known() const { return value >= 0; }
  std::string str() const;  // "3", "batch" or "?"
  bool operator==(const Dim& other) const { return value == other.value && symbol == other.symbol; }
};

// The type of a value: its kind (a tensor, a sequence of tensors, an optional: value.h), the element type and,
// when known, the shape of the tensor - or of the tensors a sequence or optional holds (ONNX gives one shape for
// every element of a sequence).
struct XPURT_API ValueType {
  ValueKind kind = ValueKind::kTensor;
  ValueKind element_kind = ValueKind::kTensor;  // kOptional: what it holds (kTensor or kSequence)
  DType dtype = DType::kFloat32;
  bool has_shape = false;       // false: rank unknown
  std::vector<Dim> shape;
  bool is_tensor() const { return kind == ValueKind::kTensor; }
  bool fully_known() const;     // a tensor with has_shape and every dim known (false for sequences and optionals)
  std::vector<std::int64_t> sizes() const;  // the sizes (InternalError unless fully_known())
  std::string str() const;      // "float32[batch,3,224,224]", "seq(float32[?])", "optional(seq(int64[3]))"
  // The ONNX-style type: "tensor(float32)", "seq(tensor(float32))", "optional(seq(tensor(int64)))".
  std::string type_str() const;
  // A sequence of tensors of `element` (its dtype and shape).
  static ValueType sequence_of(const ValueType& element);
  // An optional holding `element` (a tensor or sequence type).
  static ValueType optional_of(const ValueType& element);
  // What an optional holds (a tensor or sequence type), or the element tensor type of a sequence.
  ValueType element() const;
};

class Graph;

// An ONNX node. Attributes of ONNX's scalar and list types are in `attrs`; tensor, string-list and subgraph
// attributes in their own maps.
struct XPURT_API Node {
  std::string name;
  std::string op_type;
  std::string domain;                 // "" (= ai.onnx), "ai.onnx.ml", "com.xpuruntime", ...
  std::vector<std::string> inputs;    // value names; "" marks an absent optional input
  std::vector<std::string> outputs;   // value names; "" marks an unused optional output
  Attributes attrs;
  std::map<std::string, Tensor> tensor_attrs;
  std::map<std::string, std::vector<std::string>> string_list_attrs;
  std::map<std::string, std::shared_ptr<Graph>> graph_attrs;
  std::map<std::string, ValueType> type_attrs;  // TYPE_PROTO attributes (Optional's `type`)

  bool has_input(std::size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  std::string str() const;  // "Conv 'conv1' (x, w, b) -> (y)"
};

class XPURT_API Graph {
 public:
  std::string name;
  std::vector<Node> nodes;                       // in a topological order once validate() passed
  std::vector<std::string> inputs;               // graph inputs (initializers excluded), in order
  std::vector<std::string> outputs;              // graph outputs, in order
  std::map<std::string, Tensor> initializers;    // constants (CPU tensors), by value name
  std::map<std::string, ValueType> types;        // known types, by value name (inputs, outputs, inferred)
  std::map<std::string, std::int64_t> opsets;    // domain -> opset version ("" = ai.onnx)
  std::int64_t ir_version = 8;
  std::string producer;                          // "pytorch 2.11", ...

  std::int64_t opset(const std::string& domain = "") const;  // 0 when the model does not import `domain`
  bool is_constant(const std::string& value) const { return initializers.count(value) != 0; }
  const ValueType* type(const std::string& value) const;     // null when unknown

  // Checks the graph: node names unique (missing ones are named "<op_type>_<index>"), every value produced
  // exactly once (by an input, an initializer or a node), every node input produced, outputs produced; sorts the
  // nodes topologically (stable). InvalidArgumentError naming the node and value otherwise (cycles included).
  void validate();

  // Indices of the nodes that read each value (after validate()).
  std::unordered_map<std::string, std::vector<std::size_t>> consumers() const;
  // Index of the node producing each value.
  std::unordered_map<std::string, std::size_t> producers() const;
  // A value name not used yet, from `hint` ("x" -> "x", "x_1", ...).
  std::string unique_name(const std::string& hint) const;
  std::string str() const;  // one line per node, for debugging and tests
};

}  // namespace xpuruntime
