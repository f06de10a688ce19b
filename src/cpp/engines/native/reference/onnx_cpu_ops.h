// The ONNX reference op library: one CPU implementation per ONNX operator (ai.onnx, ai.onnx.ml where present,
// ai.onnx.preview.training), with ONNX's exact semantics across opsets (attribute vs input forms, broadcasting,
// every element type our Tensor has). Internal header.
//
// Note [Two ways a node runs]
// The native engine runs a node in one of two ways (engines/native/lowering.cpp decides, explain() says which):
//  * lowered onto a KernelRegistry op ("conv2d", "linear", "attention", ...): the Dispatcher picks a kernel under
//    the KernelPolicy, output shapes are known at build time, the memory planner places the outputs, and the node
//    can be captured into a CUDA graph. This is the fast path, on every device.
//  * run by this library (kernel name "onnx_ref", backend "cpu"): ONNX's full semantics, output shapes known only
//    when it runs (NonZero, Unique, shapes given as runtime inputs, ...). Used on the CPU for nodes that have no
//    registry lowering (or whose dtypes the registry op does not take), and by constant folding on every device.
// An op implementation takes its inputs as contiguous CPU tensors (or sequences and optionals of them, value.h:
// the sequence ops, Optional*, Identity, If, Loop, SequenceMap), reads attributes from the node, allocates its
// outputs through the context and fills them. It throws InvalidArgumentError / InvalidTypeError for inputs ONNX
// forbids (naming the node, the input and the expected and actual values) and UnsupportedOperationError for a
// legal case it does not implement (saying which).
//
// Ownership: the library is process-wide, populated once. Thread-safety: implementations keep no state and may
// run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/export.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime::onnx_ref {

// Resolves a value of an enclosing graph by name (the outer scope of an If/Loop/Scan/SequenceMap body); an
// undefined value when the name is unknown there.
using ValueLookup = std::function<Value(const std::string&)>;

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
  // Allocates output i (contiguous CPU tensor) and returns it; allocate each output once.
  Tensor& allocate_output(std::size_t i, const std::vector<std::int64_t>& shape, DType dtype);
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
  ValueLookup outer_;
};

using OpFn = std::function<void(OpContext&)>;

// The library: (domain, op_type) -> implementation. `since` is the first opset version the implementation
// covers (it must handle every later version's differences itself, reading ctx.opset()).
class XPURT_API Library {
 public:
  static Library& global();  // every op registered
  void add(const std::string& domain, const std::string& op_type, OpFn fn);
  const OpFn* find(const std::string& domain, const std::string& op_type) const;  // null when absent
  std::vector<std::string> ops() const;  // "Add", "ai.onnx.ml:LabelEncoder", ... sorted

 private:
  std::map<std::pair<std::string, std::string>, OpFn> ops_;
};

// Runs `node` on CPU values (undefined values for absent optional inputs; non-contiguous tensors, also inside
// sequences and optionals, are made contiguous). Returns one value per node output (undefined for unused optional
// outputs the op skipped). UnsupportedOperationError when the library has no implementation for the node's op.
XPURT_API std::vector<Value> run_node_values(const Node& node, std::int64_t opset, const std::vector<Value>& inputs,
                                             const ValueLookup& outer = {});
// run_node_values for tensors: InvalidTypeError when the node makes a sequence or an optional.
XPURT_API std::vector<Tensor> run_node(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs,
                                       const ValueLookup& outer = {});

// `value` as a value of the `declared` type wants it: a tensor or a sequence where an optional is declared is
// wrapped in one (a Loop body whose optional loop-carried input receives the sequence its last iteration made, as
// ONNX's Loop test with an optional sequence does); anything else as it is.
XPURT_API Value conform_value(const Value& value, const ValueType* declared);

// Runs a subgraph (an If branch, a Loop, Scan or SequenceMap body): binds `inputs` to body.inputs in order
// (conform_value to their declared types), runs the nodes in order through this library (names not defined in the
// body are resolved through `outer`), returns body.outputs (conformed to theirs). InvalidArgumentError for a wrong
// input count or a name defined nowhere.
XPURT_API std::vector<Value> run_graph(const Graph& body, const std::vector<Value>& inputs, const ValueLookup& outer);

// The names a subgraph reads from its enclosing scopes (free variables, nested subgraphs included), sorted.
XPURT_API std::vector<std::string> outer_names(const Graph& body);

// Registration, one function per source file of src/cpp/backends/cpu/onnx/ (called by Library::global()).
void register_elementwise_ops(Library& lib);   // onnx_elementwise.cpp: math, logic, activations, Cast, Softmax...
void register_tensor_ops(Library& lib);        // onnx_tensor.cpp: shape/data movement, reductions, index ops
void register_nn_ops(Library& lib);            // onnx_nn.cpp: MatMul, Gemm, Conv, pools, norms, RNNs, Resize...
void register_misc_ops(Library& lib);          // onnx_misc.cpp: quantization, signal, training, losses, ...
void register_control_flow_ops(Library& lib);  // onnx_control_flow.cpp: If, Loop, Scan
void register_sequence_ops(Library& lib);      // onnx_sequence.cpp: Sequence*, SplitToSequence, Optional*, ...

}  // namespace xpuruntime::onnx_ref
