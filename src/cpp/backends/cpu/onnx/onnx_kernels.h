// The cpu backend's ONNX reference implementations: one CPU implementation per ONNX operator (ai.onnx, ai.onnx.ml
// where present, ai.onnx.preview.training, and the com.xpuruntime nodes of the graph passes), with ONNX's exact
// semantics across opsets (attribute vs input forms, broadcasting, every element type our Tensor has). Each is
// registered as a node kernel of the KernelRegistry (kernel "onnx_ref", backend "cpu": Note [Node kernels] in
// core/kernel_registry.cpp); callers run them through core/node_kernels.h (Note [Two ways a node runs]).
// Internal header of the cpu backend.
//
// An implementation (an OpFn) takes its inputs as contiguous CPU tensors (or sequences and optionals of them,
// value.h: the sequence ops, Optional*, Identity, If, Loop, SequenceMap), reads attributes from the node, allocates
// its outputs through the context and fills them. It throws InvalidArgumentError / InvalidTypeError for inputs ONNX
// forbids (naming the node, the input and the expected and actual values) and UnsupportedOperationError for a legal
// case it does not implement (saying which).
//
// Thread-safety: implementations keep no state and may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/export.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime::onnx_ref {

class XPURT_API OpContext {
 public:
  OpContext(const Node& node, std::int64_t opset, std::vector<Value> inputs)
      : node_(node),
        opset_(opset),
        inputs_(std::move(inputs)),
        outputs_(node.outputs.size()),
        value_outputs_(node.outputs.size()) {}

  const Node& node() const { return node_; }
  std::int64_t opset() const { return opset_; }  // the version of the node's domain the model imports
  std::size_t num_inputs() const { return inputs_.size(); }
  std::size_t num_outputs() const { return outputs_.size(); }
  // Whether input i was given (absent optional inputs are undefined values; an empty optional is given).
  bool has_input(std::size_t i) const { return i < inputs_.size() && inputs_[i].defined(); }
  // Input i: a contiguous CPU tensor. InvalidArgumentError naming the node when a required input is missing,
  // InvalidTypeError when it is a sequence or an optional.
  const Tensor& input(std::size_t i) const;
  // Input i of any kind (a tensor, a sequence, an optional). InvalidArgumentError when it is missing.
  const Value& value(std::size_t i) const;
  // The tensors of input i, a sequence. InvalidTypeError naming the node when it is not a sequence.
  const std::vector<Tensor>& sequence(std::size_t i) const;
  // Whether output i is wanted (an unused optional output has an empty name; computing it anyway is fine).
  bool wants_output(std::size_t i) const { return i < outputs_.size() && !node_.outputs[i].empty(); }
  // Allocates output i (contiguous CPU tensor) and returns it; allocate each output once. With a destination for
  // output i (set_destinations) of this shape and dtype, it is that tensor (not zeroed: the kernel writes every
  // element, as into a new one).
  Tensor& allocate_output(std::size_t i, const std::vector<std::int64_t>& shape, DType dtype);
  // Where allocate_output puts the outputs (NodeKernelIntoFn): into[i] is used when it is a contiguous CPU tensor of
  // the shape and dtype asked and shares no memory with an input (a destination the caller's memory plan gave an
  // input's buffer is left alone, so no kernel reads what it has already overwritten).
  void set_destinations(std::vector<Tensor> into) { destinations_ = std::move(into); }
  bool usable_destination(const Tensor& into, const std::vector<std::int64_t>& shape, DType dtype) const;
  // Sets output i to an existing tensor (e.g. an input, for Identity-like ops: never modify inputs in place).
  void set_output(std::size_t i, Tensor tensor);
  // Sets output i to a value of any kind (a sequence, an optional, or a tensor).
  void set_output(std::size_t i, Value value);
  // The outputs, one per node output (undefined for those not set); the context's outputs are left empty.
  std::vector<Value> take_outputs();

  // Attribute helpers (the node's attrs; defaults as in the ONNX spec).
  std::int64_t attr_int(const std::string& name, std::int64_t def) const { return node_.attrs.get_int(name, def); }
  double attr_float(const std::string& name, double def) const { return node_.attrs.get_float(name, def); }
  std::string attr_string(const std::string& name, const std::string& def) const {
    return node_.attrs.get_string(name, def);
  }
  std::vector<std::int64_t> attr_ints(const std::string& name, const std::vector<std::int64_t>& def) const {
    return node_.attrs.get_ints(name, def);
  }
  std::vector<double> attr_floats(const std::string& name, const std::vector<double>& def) const {
    return node_.attrs.get_floats(name, def);
  }
  bool has_attr(const std::string& name) const;  // in any of the node's attribute maps
  const Tensor* attr_tensor(const std::string& name) const;  // null when absent

  // "Conv 'conv1'": for error messages.
  std::string where() const;
  // The name of the value the node reads as input i ("" when absent).
  const std::string& input_name(std::size_t i) const {
    static const std::string none;
    return i < node_.inputs.size() ? node_.inputs[i] : none;
  }

  // The enclosing scope's values (for control-flow ops, whose bodies read them by name); empty at top level
  // unless the engine supplies it.
  const ValueLookup& outer() const { return outer_; }
  void set_outer(ValueLookup outer) { outer_ = std::move(outer); }

 private:
  const Node& node_;
  std::int64_t opset_;
  std::vector<Value> inputs_;
  std::vector<Tensor> outputs_;       // tensor outputs (allocate_output hands out references into it)
  std::vector<Value> value_outputs_;  // sequence and optional outputs
  std::vector<Tensor> destinations_;  // set_destinations
  ValueLookup outer_;
};

using OpFn = std::function<void(OpContext&)>;

// What each source file's registration function takes: adds its implementations to a KernelRegistry as node
// kernels of the cpu backend (NodeKernelInfo: name "onnx_ref", backend "cpu"). The node kernel runs `fn` on the
// node's inputs made contiguous (a copy of those that are not, also inside sequences and optionals).
class NodeKernelRegistrar {
 public:
  explicit NodeKernelRegistrar(KernelRegistry& registry) : registry_(registry) {}
  // `domain`: "" (or "ai.onnx") for ai.onnx. InternalError when (domain, op_type) is registered already.
  void add(const std::string& domain, const std::string& op_type, OpFn fn);

 private:
  KernelRegistry& registry_;
};

// The cpu backend's node kernels, every source file's (called by register_cpu).
void register_onnx_node_kernels(KernelRegistry& registry);

// Registration, one function per source file of src/cpp/backends/cpu/onnx/ (called by register_onnx_node_kernels).
void register_elementwise_ops(NodeKernelRegistrar& kernels);   // onnx_elementwise.cpp: math, logic, Cast, Softmax...
void register_tensor_ops(NodeKernelRegistrar& kernels);        // onnx_tensor.cpp: shape/data movement, reductions
void register_nn_ops(NodeKernelRegistrar& kernels);            // onnx_nn.cpp: MatMul, Gemm, Conv, pools, norms, RNNs
void register_misc_ops(NodeKernelRegistrar& kernels);          // onnx_misc.cpp: quantization, signal, training, ...
void register_control_flow_ops(NodeKernelRegistrar& kernels);  // onnx_control_flow.cpp: If, Loop, Scan
void register_sequence_ops(NodeKernelRegistrar& kernels);      // onnx_sequence.cpp: Sequence*, Optional*, ...
// onnx_fused.cpp: the com.xpuruntime nodes the graph passes make, each as its registry op on the CPU.
void register_fused_ops(NodeKernelRegistrar& kernels);
// onnx_contrib_attention.cpp: ONNX Runtime's com.microsoft GroupQueryAttention (registry op group_query_attention).
void register_contrib_attention_ops(NodeKernelRegistrar& kernels);

}  // namespace xpuruntime::onnx_ref
