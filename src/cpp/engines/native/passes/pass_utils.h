// What the graph passes share: questions about values (constant? read by whom? of which type?), constant
// tensors as doubles and back, and a Rewriter that collects pattern replacements during one scan of the nodes and
// applies them together. Internal header of src/cpp/engines/native/passes/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/fused_elementwise.h"
#include "core/scalar.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::passes::internal {

// Who reads each value of a graph: nodes (by index), the graph outputs, and subgraphs (If/Loop/Scan bodies
// read values of the outer graph by name, invisible in Node::inputs).
class Uses {
 public:
  explicit Uses(const Graph& g);
  const std::vector<std::size_t>& readers(const std::string& value) const;  // node indices, each once
  bool is_graph_output(const std::string& value) const { return outputs_.count(value) != 0; }
  bool read_by_subgraph(const std::string& value) const { return subgraph_reads_.count(value) != 0; }
  // Read by nothing at all (no node, no subgraph, not a graph output).
  bool unused(const std::string& value) const;
  // Read by node `reader` only (not by another node, a subgraph or as a graph output).
  bool only_reader(const std::string& value, std::size_t reader) const;
  // The node producing `value`, or nullopt (graph input, initializer, absent).
  std::optional<std::size_t> producer(const std::string& value) const;

 private:
  std::unordered_map<std::string, std::vector<std::size_t>> readers_;
  std::unordered_map<std::string, std::size_t> producers_;
  std::set<std::string> outputs_;
  std::set<std::string> subgraph_reads_;
};

// Every value name a subgraph (recursively) reads.
void collect_subgraph_reads(const Graph& sub, std::set<std::string>& out);

// A constant: an initializer that is not also a graph input (an initializer named like a graph input is only
// the input's default value, which a caller may override).
bool is_constant(const Graph& g, const std::string& value);
const Tensor* constant(const Graph& g, const std::string& value);  // null unless is_constant
// A one-element numeric constant as double.
std::optional<double> scalar_constant(const Graph& g, const std::string& value);
bool near(double value, double expected, double rel = 1e-3);  // 1e-3: float16 constants round by up to 4.9e-4

// The type of a value: graph.types, else the constant's own type. Null when neither knows it.
std::optional<ValueType> value_type(const Graph& g, const std::string& value);
std::optional<std::vector<std::int64_t>> static_shape(const Graph& g, const std::string& value);
std::optional<DType> value_dtype(const Graph& g, const std::string& value);
ValueType type_of(const Tensor& t);
// float32, float16, bfloat16: what the registry ops behind the fused nodes take.
bool is_fusable_float(DType dtype);
// Dims that are certainly equal: both known and equal, or the same (non-empty) symbol.
bool same_dim(const Dim& a, const Dim& b);
// Both shapes known (rank and every dim in the sense of same_dim) and equal.
bool same_shape(const ValueType& a, const ValueType& b);
// The input of a two-input node `n` (of ONNX op `op_type`) that is a one-element constant close to `expected`;
// returns the index of the other input, or -1.
int scalar_operand(const Graph& g, const Node& n, const std::string& op_type, double expected);
// The DType of an ONNX TensorProto element type code, nullopt for types our Tensor lacks.
std::optional<DType> dtype_from_onnx(std::int64_t code);
// Whether every value of `from` is one of `to`'s, so Cast(Cast(x, to), from) is x (Note [Round-trip casts] in
// elimination.cpp): float16 and bfloat16 in float32 or float64, float32 in float64, an integer type in a wider one
// that holds its whole range, bool in any integer or float type.
bool widens_exactly(DType from, DType to);

// Elements of a numeric CPU tensor as double (16-bit floats converted); and a new tensor from doubles (rounded to
// `dtype`, integers truncated): core's (core/scalar.h), which kernels use too.
using detail::to_doubles;
using detail::to_int64s;
// A Slice (opset 10+) of one axis with step 1 and constant starts/ends/axes/steps, on an input of rank `rank`: the
// axis (in [0, rank)) and the start and end as written (negative ones count from the end; the caller clamps them).
struct SliceRange {
  std::int64_t axis = 0, start = 0, end = 0;
};
std::optional<SliceRange> single_axis_slice(const Graph& g, const Node& n, std::int64_t rank);
// The values of a constant that adds one value per channel/feature: `count` values along the axis at
// `axis_from_end` (0 = last) of an output of rank `out_rank` (unknown: -1), or one value for all. Nullopt when
// the constant is not of that form (or would broadcast the output to a bigger shape).
std::optional<std::vector<double>> per_channel_values(const Tensor& c, std::int64_t count, std::size_t axis_from_end,
                                                      std::int64_t out_rank);
// The constant axes of a Reduce*/Squeeze/Unsqueeze node: its input 1 from opset `input_since` of its domain on, its
// `axes` attribute before that; nullopt when absent (the op's every-axis default) or not constant.
std::optional<std::vector<std::int64_t>> constant_axes(const Graph& g, const Node& n, std::int64_t input_since);
using detail::from_doubles;

// A 1-D int64 CPU tensor holding `values` (shapes, axes, sizes of the nodes the passes make).
Tensor int64_tensor(const std::vector<std::int64_t>& values);
// The sizes a Split node (of the given opset) cuts `dim` into: its split input or attribute, else equal parts
// (num_outputs from opset 18, a smaller last part allowed); empty when they are not known while the plan is built.
std::vector<std::int64_t> split_sizes(const Graph& g, const Node& n, std::int64_t opset, std::int64_t dim);
// Adds a constant under a new name derived from `hint` (and its type to graph.types); returns the name.
std::string add_constant(Graph& g, const std::string& hint, const Tensor& t);
// Removes initializers in `candidates` that no node (or subgraph) reads and that are not graph outputs.
void remove_unused_constants(Graph& g, const std::set<std::string>& candidates);

// Folds every node whose inputs are all constants (ONNX domains; not Random*/Bernoulli, not a weight's
// DequantizeLinear while ctx.keep_quantized_weights) into constants, in one sweep; returns how many. What the
// constant_folding pass runs (folding.cpp).
int fold_constants(Graph& g, const PassContext& ctx, PassResult& result);

// The input of a binary node that is not `value` ("" when both or neither are). Node must have two inputs.
std::string other_input(const Node& n, const std::string& value);

// Collects replacements found during one scan over g.nodes and applies them at the end: the nodes of a pattern
// are removed and the new nodes are placed where the last node of the pattern was (every input of the pattern is
// produced before that point, so the order stays topological). A node belongs to at most one pattern per scan.
class Rewriter {
 public:
  explicit Rewriter(Graph& g) : g_(g), taken_(g.nodes.size(), false) {}
  bool taken(std::size_t i) const { return taken_[i]; }
  bool any_taken(const std::vector<std::size_t>& nodes) const;
  void replace(const std::vector<std::size_t>& pattern, std::vector<Node> new_nodes, std::string note);
  // Rebuilds g.nodes (then validates the graph), removes the constants only the replaced nodes read, and returns
  // the number of replacements.
  int apply(PassResult& result);

 private:
  Graph& g_;
  std::vector<bool> taken_;
  std::map<std::size_t, std::vector<Node>> inserted_;  // position (last node of a pattern) -> new nodes
  std::vector<std::string> notes_;
};

// The node reading `value` when it is the only reader (no other node, subgraph or graph output reads it), is the ONNX
// op `op_type` and is not taken by `rw` yet.
std::optional<std::size_t> sole_reader(const Graph& g, const Uses& uses, const Rewriter& rw, const std::string& value,
                                       const char* op_type);

// The Reshapes that read `value` one after another, each the sole reader of the one before and not taken by `rw`,
// all of static shape (none where `value`'s shape is not static); `end` is the last one's output (`value` when none).
struct ReshapeChain {
  std::vector<std::size_t> reshapes;
  std::string end;
};
ReshapeChain reshape_chain(const Graph& g, const Uses& uses, const Rewriter& rw, const std::string& value);

// The Linear activation a GELU node computes ("gelu" or "gelu_tanh"): an ONNX Gelu or a com.xpuruntime one whose
// approximation is "none" or "tanh"; nullopt for any other node.
std::optional<std::string> gelu_activation(const Node& n);

// A default-domain node of `op_type`, named after `name` (made unique in g).
Node make_node(Graph& g, const std::string& op_type, const std::string& name, std::vector<std::string> inputs,
               std::vector<std::string> outputs, Attributes attrs = {});
// `from` -> Reshape(a new int64 constant `shape`) -> `to`.
Node reshape_node(Graph& g, const std::string& name, const std::string& from, const std::vector<std::int64_t>& shape,
                  const std::string& to);

// The constant weights of `linears` (com.xpuruntime Linears of one weight layout and dtype), each times its scale,
// side by side along N: [K, sum N] for "kn", [sum N, K] for "nk" (qkv_fusion's q, k and v; fused_input_views' sibling
// GEMMs).
Tensor concatenated_weights(const Graph& g, const std::vector<const Node*>& linears, const std::vector<double>& scales,
                            bool kn);

// "Conv 'c1'"
std::string describe(const Node& n);

// g's nodes with `before[i]` placed before node i and the nodes in `dropped` left out (a pass that gives node i
// inputs made by new nodes: views of what it read).
void insert_before(Graph& g, std::map<std::size_t, std::vector<Node>> before,
                   const std::set<std::size_t>& dropped = {});

// The row-major view of a tensor of `shape`: what a fused node reads of an input without a view.
fused::InputView contiguous_view(const std::vector<std::int64_t>& shape);
// Whether `v` reads one contiguous block (size-1 axes aside): then its tensor is a view already.
bool is_block(const fused::InputView& v);
// The number of elements of a static shape.
std::int64_t numel_of(const std::vector<std::int64_t>& shape);

// A com.xpuruntime Linear of one output whose weight is a 2-D constant and whose bias is a constant or absent (its
// residual, input 3, may be anything).
bool constant_linear(const Graph& g, const Node& l);

// A value made by view ops (Slice, Transpose, Reshape, Flatten, Squeeze, Unsqueeze) of a tensor, as a strided view of
// that tensor (Note [Inputs read through a view] in core/fused_elementwise.h).
struct ViewChain {
  std::string source;
  fused::InputView view;
  std::vector<std::size_t> nodes;  // the view ops read through, in graph order
  int copies = 0;                  // how many of them copy (their result is not a block of what they read)
};
// The view of `value` over the furthest tensor that view ops made it from; nullopt where no view op made it or the
// view is one contiguous block (a view already: nothing to save). fused_input_views.cpp.
std::optional<ViewChain> view_chain(const Graph& g, const Uses& uses, const std::string& value);

// Note [Unary ops move before view chains] (fused_input_views.cpp) for the unary ops whose view chain starts at a
// value whose producer (null: a graph input or constant) `from` accepts; returns how many moved, a note each.
int move_activations_before_views(Graph& g, std::vector<std::string>& notes,
                                  const std::function<bool(const Node* producer)>& from);

// Note [Patterns check arity]
// A pattern reads the inputs and outputs its operator's schema promises (a MatMul's two inputs, a Softmax's output).
// The importer refuses nodes that break their schema (Note [Models checked against ONNX's schemas]), and the passes
// do not rely on it alone: every match of an ONNX node goes through is_onnx(), which also checks the node's arity
// against what every version of the operator takes, and the passes that dispatch on op_type skip nodes for which
// has_onnx_arity() is false. A node that fails is left alone for the lowering, which reports it.

using passes::has_onnx_arity;  // passes.h

// Whether `n` is the ONNX op `op_type` (the default domain) with an arity its schema allows.
inline bool is_onnx(const Node& n, const char* op_type) {
  return (n.domain.empty() || n.domain == "ai.onnx") && n.op_type == op_type && has_onnx_arity(n);
}

}  // namespace xpuruntime::passes::internal
