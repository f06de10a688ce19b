// Running ONNX nodes through the KernelRegistry's node kernels (Note [Node kernels] in kernel_registry.cpp): the one
// way the native engine, constant folding and the control-flow kernels reach the ONNX reference implementations of
// the cpu backend. Internal header of src/cpp.
//
// Note [Two ways a node runs]
// The native engine runs a node in one of two ways (engines/native/lowering/lowering.cpp decides, explain() says
// which):
//  * lowered onto a KernelRegistry op ("conv2d", "linear", "attention", ...): the Dispatcher picks a kernel under
//    the KernelPolicy, output shapes are known at build time, the memory planner places the outputs, and the node
//    can be captured into a CUDA graph. This is the fast path, on every device.
//  * run by its node kernel (kernel name "onnx_ref", backend "cpu"): ONNX's full semantics, output shapes known only
//    when it runs (NonZero, Unique, shapes given as runtime inputs, ...). Used on the CPU for nodes that have no
//    registry lowering (or whose dtypes the registry op does not take), and by constant folding on every device.
// The cpu backend's node kernels take their inputs as contiguous CPU tensors (or sequences and optionals of them,
// value.h) and throw InvalidArgumentError / InvalidTypeError for inputs ONNX forbids (naming the node, the input and
// the expected and actual values) and UnsupportedOperationError for a legal case they do not implement (saying
// which); backends/cpu/onnx/onnx_kernels.h gives their contract.
//
// Thread-safety: free functions over the process-wide registry; node kernels keep no state and may run
// concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xpuruntime/export.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime::onnx_ref {

using xpuruntime::ValueLookup;

// Runs `node` on CPU values through its node kernel in KernelRegistry::global() (undefined values for absent optional
// inputs). Returns one value per node output (undefined for unused optional outputs the kernel skipped).
// UnsupportedOperationError when no node kernel implements the node's (domain, op_type).
XPURT_API std::vector<Value> run_node_values(const Node& node, std::int64_t opset, const std::vector<Value>& inputs,
                                             const ValueLookup& outer = {});
// run_node_values for tensors: InvalidTypeError when the node makes a sequence or an optional.
XPURT_API std::vector<Tensor> run_node(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs,
                                       const ValueLookup& outer = {});
// run_node writing each tensor output into into[i] where the kernel can (NodeKernelIntoFn): the returned tensor then
// shares into[i]'s memory, so a caller that wants its result there skips a copy.
XPURT_API std::vector<Tensor> run_node_into(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs,
                                            const std::vector<Tensor>& into);
// Whether a node kernel implements (domain, op_type) ("ai.onnx" and "" are the same domain).
XPURT_API bool has_node_kernel(const std::string& domain, const std::string& op_type);

// `value` as a value of the `declared` type wants it: a tensor or a sequence where an optional is declared is
// wrapped in one (a Loop body whose optional loop-carried input receives the sequence its last iteration made, as
// ONNX's Loop test with an optional sequence does); anything else as it is.
XPURT_API Value conform_value(const Value& value, const ValueType* declared);

// Runs a subgraph (an If branch, a Loop, Scan or SequenceMap body): binds `inputs` to body.inputs in order
// (conform_value to their declared types), runs the nodes in order through run_node_values (names not defined in
// the body are resolved through `outer`), returns body.outputs (conformed to theirs). InvalidArgumentError for a
// wrong input count or a name defined nowhere.
XPURT_API std::vector<Value> run_graph(const Graph& body, const std::vector<Value>& inputs, const ValueLookup& outer);

// The names a subgraph reads from its enclosing scopes (free variables, nested subgraphs included), sorted.
XPURT_API std::vector<std::string> outer_names(const Graph& body);

}  // namespace xpuruntime::onnx_ref
