// op_decomposition: ONNX ops rewritten onto ops the registry runs, so that they run on every device without a kernel
// of their own (Note [Decompositions]):
//   Split (static input shape, constant split sizes or num_outputs) -> one Slice per output;
//   1-D Conv and ConvTranspose (constant weight) -> Unsqueeze + the 2-D op (kernel height 1) + Squeeze: the
//     Unsqueeze and Squeeze are views, and the 2-D Conv takes the conv passes (bias, activation, cuDNN); a pointwise
//     one (kernel 1, stride 1, no padding, up to 4 groups) -> MatMul(W, x) [+ Add(bias)] (Note [Pointwise 1-D
//     convolutions as GEMMs]);
//   LayerNormalization whose constant scale or bias has another float type than X (PyTorch's TorchScript exporter
//     writes float32 statistics beside float16 parameters) -> the same node with the constants in X's type;
//   Clip with run-time bounds, or with constant ones after an elementwise op or a reduction -> Max then Min;
//   variadic Sum / Max / Min and Mean -> chains of two-input nodes (Mean: then a Div by the count);
//   DepthToSpace (DCR, CRD) and SpaceToDepth (static shapes) -> Reshape + Transpose + Reshape;
//   InstanceNormalization and GroupNormalization (constant scale and bias) -> layer_norm (Note [Normalizations onto
//     layer_norm]);
//   ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSumExp (float) -> Abs / Mul / Exp ... and ReduceSum (ReduceMax);
//   Einsum of one or two operands -> Transpose/Reshape around a MatMul (Note [Einsum onto MatMul]); a label repeated
//   within an operand first takes that diagonal (Transpose, Reshape, Gather).
#include <cctype>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"

namespace xpuruntime::passes {
namespace {

using namespace internal;
using Ints = std::vector<std::int64_t>;


// A node of `op_type` taking `axes` as an attribute (before opset `input_since`) or a constant input.
Node with_axes(Graph& g, const std::string& op_type, const std::string& name, const std::string& in,
               const std::string& out, const Ints& axes, std::int64_t opset, std::int64_t input_since) {
  Node n;
  n.op_type = op_type;
  n.name = g.unique_name(name);
  n.inputs = {in};
  n.outputs = {out};
  if (opset < input_since) {
    n.attrs.set("axes", axes);
  } else {
    n.inputs.push_back(add_constant(g, n.name + "_axes", int64_tensor(axes)));
  }
  return n;
}

// A new value named after `hint`, of `dtype` and `shape` (recorded in g.types for the passes after this one).
std::string new_value(Graph& g, const std::string& hint, DType dtype, const Ints& shape) {
  const std::string name = g.unique_name(hint);
  ValueType t;
  t.dtype = dtype;
  t.has_shape = true;
  for (const std::int64_t d : shape) t.shape.emplace_back(d);
  g.types[name] = t;
  return name;
}

std::int64_t product_of(const Ints& shape, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t k = begin; k < end; ++k) n *= shape[k];
  return n;
}

// Note [Normalizations onto layer_norm]: InstanceNormalization and GroupNormalization normalize each (sample,
// group) over the group's channels and every spatial position. Viewed as [N, G, C/G * S] that is a LayerNormalization
// over the last axis without scale and bias (the xpuruntime LayerNormalization, which every device runs), then the
// per-channel scale and bias as a Mul and an Add on the [N, C, ...] view (broadcast [C, 1, ...] constants).
// On the CPU the per-channel scale and bias go into the LayerNormalization itself (Note [Per-row affine of a layer
// norm] in core/op_schemas.cpp): one value a row where each (sample, group) is one channel (InstanceNormalization),
// one a run of S elements of the grouped row otherwise. The Mul and Add were a pass of their own over the output, 1.4
// of the 3.0 ms of an InstanceNormalization of [2, 64, 128, 128] at one thread (2026-12-07). CUDA plans keep the Mul
// and Add, which join the generated kernels of what follows.
std::vector<Node> normalization_onto_layer_norm(Graph& g, const Node& n, const Ints& x_shape, DType dtype,
                                                std::int64_t groups, const Tensor& scale, const Tensor& bias,
                                                double epsilon, bool row_affine) {
  const std::int64_t batch = x_shape[0], channels = x_shape[1];
  const std::int64_t spatial = product_of(x_shape, 2, x_shape.size());
  const Ints grouped = {batch, groups, channels / groups * spatial};
  row_affine = row_affine && spatial > 0;  // affine_run must divide a row of elements
  // Per-channel scale and bias, [C, 1, ..., 1] (or [C] for the per-row affine); a per-group one
  // (GroupNormalization-18) repeats along its channels.
  Ints affine_shape(x_shape.size() - 1, 1);
  affine_shape[0] = channels;
  if (row_affine) affine_shape = {channels};
  const auto per_channel = [&](const Tensor& t) {
    const std::vector<double> values = to_doubles(t);
    std::vector<double> out(static_cast<std::size_t>(channels));
    const bool per_group = values.size() != static_cast<std::size_t>(channels);
    for (std::int64_t c = 0; c < channels; ++c) {
      out[static_cast<std::size_t>(c)] = values[static_cast<std::size_t>(per_group ? c / (channels / groups) : c)];
    }
    return from_doubles(affine_shape, dtype, out);
  };
  std::vector<Node> nodes;
  Attributes ln;
  ln.set("epsilon", epsilon);
  const auto push_norm = [&](std::vector<std::string> inputs, const std::string& output) {
    Node norm = make_node(g, "LayerNormalization", n.name + "_norm", std::move(inputs), {output}, ln);
    norm.domain = kXpurtDomain;
    nodes.push_back(std::move(norm));
  };
  const auto affine_inputs = [&](const std::string& x) -> std::vector<std::string> {
    return {x, add_constant(g, n.name + "_scale", per_channel(scale)),
            add_constant(g, n.name + "_bias", per_channel(bias))};
  };
  if (row_affine) ln.set("row_affine", std::int64_t{1});
  if (row_affine && groups == channels) {  // over the spatial axes of x itself: rows of (sample, channel)
    ln.set("axis", std::int64_t{2});
    push_norm(affine_inputs(n.inputs[0]), n.outputs[0]);
    return nodes;
  }
  ln.set("axis", std::int64_t{-1});
  if (row_affine) ln.set("affine_run", spatial);  // the grouped view's rows, a run of S elements per channel
  const std::string viewed = new_value(g, n.outputs[0] + "_grouped", dtype, grouped);
  nodes.push_back(reshape_node(g, n.name + "_group", n.inputs[0], grouped, viewed));
  const std::string normalized = new_value(g, n.outputs[0] + "_normalized", dtype, grouped);
  push_norm(row_affine ? affine_inputs(viewed) : std::vector<std::string>{viewed}, normalized);
  if (row_affine) {
    nodes.push_back(reshape_node(g, n.name + "_ungroup", normalized, x_shape, n.outputs[0]));
    return nodes;
  }
  const std::string back = new_value(g, n.outputs[0] + "_ungrouped", dtype, x_shape);
  nodes.push_back(reshape_node(g, n.name + "_ungroup", normalized, x_shape, back));
  const std::string scaled = new_value(g, n.outputs[0] + "_scaled", dtype, x_shape);
  nodes.push_back(make_node(g, "Mul", n.name + "_scale", {back, add_constant(g, n.name + "_scale", per_channel(scale))},
                            {scaled}));
  nodes.push_back(make_node(g, "Add", n.name + "_bias", {scaled, add_constant(g, n.name + "_bias", per_channel(bias))},
                            {n.outputs[0]}));
  return nodes;
}

// The reduce node `op_type` over `axes` (an attribute before `axes_input_since`, else a constant input).
Node reduce_node(Graph& g, const std::string& op_type, const std::string& name, const std::string& in,
                 const std::string& out, const Ints& axes, bool axes_given, std::int64_t keepdims,
                 std::int64_t opset) {
  const std::int64_t input_since = op_type == "ReduceSum" ? 13 : 18;
  Node r = make_node(g, op_type, name, {in}, {out});
  r.attrs.set("keepdims", keepdims);
  if (axes_given) {
    if (opset < input_since) {
      r.attrs.set("axes", axes);
    } else {
      r.inputs.push_back(add_constant(g, name + "_axes", int64_tensor(axes)));
    }
  }
  return r;
}

// Note [Einsum onto MatMul]: an Einsum of one or two operands whose labels each appear once per operand (no
// ellipsis; diagonals are taken first: take_diagonals) is a batched matrix product between transposes and
// reshapes. Each label is a batch label
// (in both operands and the output), a contracted label (in both, not in the output), a free label of one operand
// (in it and the output) or a summed label of one operand (in it only: a ReduceSum first). A is permuted to [batch,
// free A, contracted] and viewed as [batch, M, K], B to [batch, contracted, free B] as [batch, K, N]; MatMul gives
// [batch, M, N], viewed as [batch, free A, free B] and permuted into the output's order. The batch labels keep their
// own dims (a view only where free or contracted labels group): '...hid,...hjd->...hij' over [B, windows, heads, N,
// d] stays a 5-D MatMul of the operands as they are, the form attention_fusion reads (MaxViT's attention), not a
// 3-D one between Reshapes. One operand: a ReduceSum over its summed
// labels and a Transpose.
struct EinsumSpec {
  std::vector<std::string> inputs;  // one label string per operand
  std::string output;
};

std::optional<EinsumSpec> parse_einsum(const std::string& equation, std::size_t operands) {
  std::string eq;
  for (const char ch : equation) {
    if (ch != ' ') eq += ch;
  }
  const std::size_t arrow = eq.find("->");
  if (arrow == std::string::npos || eq.find('.') != std::string::npos) return std::nullopt;
  EinsumSpec spec;
  spec.output = eq.substr(arrow + 2);
  std::string lhs = eq.substr(0, arrow);
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = lhs.find(',', start);
    spec.inputs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (spec.inputs.size() != operands) return std::nullopt;
  for (const std::string& labels : spec.inputs) {
    for (const char label : labels) {
      if (!std::isalpha(static_cast<unsigned char>(label))) return std::nullopt;  // a malformed label
    }
  }
  for (std::size_t k = 0; k < spec.output.size(); ++k) {
    if (spec.output.find(spec.output[k], k + 1) != std::string::npos) return std::nullopt;
  }
  return spec;
}

// Permutes `from` (labels `have`, shape `shape`) into label order `want` (a permutation of `have`); appends the node
// when the order changes and returns the permuted value.
std::string permute_labels(Graph& g, std::vector<Node>& nodes, const std::string& name, const std::string& from,
                           const std::string& have, const std::string& want, const Ints& shape, DType dtype) {
  if (have == want) return from;
  Ints perm, permuted;
  for (const char label : want) {
    const auto at = static_cast<std::int64_t>(have.find(label));
    perm.push_back(at);
    permuted.push_back(shape[static_cast<std::size_t>(at)]);
  }
  const std::string out = new_value(g, name, dtype, permuted);
  Attributes a;
  a.set("perm", perm);
  nodes.push_back(make_node(g, "Transpose", name, {from}, {out}, a));
  return out;
}

// Sums `from` over the labels of `labels` not in `keep` (keepdims 0); returns the value and its labels/shape.
std::string sum_labels(Graph& g, std::vector<Node>& nodes, const std::string& name, const std::string& from,
                       std::string* labels, Ints* shape, const std::string& keep, DType dtype, std::int64_t opset) {
  Ints axes, kept_shape;
  std::string kept;
  for (std::size_t k = 0; k < labels->size(); ++k) {
    if (keep.find((*labels)[k]) == std::string::npos) {
      axes.push_back(static_cast<std::int64_t>(k));
    } else {
      kept += (*labels)[k];
      kept_shape.push_back((*shape)[k]);
    }
  }
  if (axes.empty()) return from;
  const std::string out = new_value(g, name, dtype, kept_shape);
  nodes.push_back(reduce_node(g, "ReduceSum", name, from, out, axes, true, 0, opset));
  *labels = kept;
  *shape = kept_shape;
  return out;
}

// A label repeated within one operand ("ii", "bjj") takes the diagonal of those axes: the two axes are moved last
// (Transpose), merged (Reshape to [..., n * n]) and the diagonal gathered (Gather of 0, n + 1, 2 (n + 1), ...),
// leaving the label once; repeated until every label of the operand is distinct. False when the repeated axes
// differ in size.
bool take_diagonals(Graph& g, std::vector<Node>& nodes, const std::string& name, std::string* value,
                    std::string* labels, Ints* shape, DType dtype) {
  for (;;) {
    std::size_t first = std::string::npos, second = std::string::npos;
    for (std::size_t k = 0; k < labels->size() && first == std::string::npos; ++k) {
      const std::size_t again = labels->find((*labels)[k], k + 1);
      if (again != std::string::npos) first = k, second = again;
    }
    if (first == std::string::npos) return true;
    const std::int64_t n = (*shape)[first];
    if ((*shape)[second] != n) return false;
    std::string rest;
    Ints rest_shape;
    for (std::size_t k = 0; k < labels->size(); ++k) {
      if (k == first || k == second) continue;
      rest += (*labels)[k];
      rest_shape.push_back((*shape)[k]);
    }
    const char label = (*labels)[first];
    std::string moved = *labels;
    moved.erase(second, 1);
    moved.erase(first, 1);
    Ints perm;
    for (std::size_t k = 0; k < labels->size(); ++k) {
      if (k != first && k != second) perm.push_back(static_cast<std::int64_t>(k));
    }
    perm.push_back(static_cast<std::int64_t>(first));
    perm.push_back(static_cast<std::int64_t>(second));
    Ints moved_shape = rest_shape;
    moved_shape.push_back(n);
    moved_shape.push_back(n);
    const std::string t = new_value(g, name + "_diag_t", dtype, moved_shape);
    Attributes a;
    a.set("perm", perm);
    nodes.push_back(make_node(g, "Transpose", name + "_diag_t", {*value}, {t}, a));
    Ints merged = rest_shape;
    merged.push_back(n * n);
    const std::string flat = new_value(g, name + "_diag_flat", dtype, merged);
    nodes.push_back(reshape_node(g, name + "_diag_flat", t, merged, flat));
    Ints picks;
    for (std::int64_t i = 0; i < n; ++i) picks.push_back(i * (n + 1));
    Ints diag_shape = rest_shape;
    diag_shape.push_back(n);
    const std::string diag = new_value(g, name + "_diag", dtype, diag_shape);
    Attributes ga;
    ga.set("axis", static_cast<std::int64_t>(rest_shape.size()));
    nodes.push_back(
        make_node(g, "Gather", name + "_diag", {flat, add_constant(g, name + "_diag_idx", int64_tensor(picks))}, {diag},
                  ga));
    *value = diag;
    *labels = rest + label;
    *shape = diag_shape;
  }
}

// The decomposition's last value becomes the Einsum's output: the last node writes it directly (an Identity there
// would stand between the MatMul and what reads it, where attention_fusion looks for the MatMul), or an Identity
// copies it when no node of the decomposition wrote it.
void write_einsum_output(Graph& g, std::vector<Node>& nodes, const Node& n, const std::string& value) {
  if (!nodes.empty() && nodes.back().outputs.size() == 1 && nodes.back().outputs[0] == value) {
    nodes.back().outputs[0] = n.outputs[0];
    g.types.erase(value);
    return;
  }
  nodes.push_back(make_node(g, "Identity", n.name + "_out", {value}, {n.outputs[0]}));
}

std::optional<std::vector<Node>> einsum_nodes(Graph& g, const Node& n, std::int64_t opset) {
  if (opset < 12) return std::nullopt;  // Einsum-12 is the first (reduce_node writes ReduceSum's axes either way)
  const auto spec = parse_einsum(n.attrs.get_string("equation", ""), n.inputs.size());
  if (!spec || n.inputs.empty() || n.inputs.size() > 2) return std::nullopt;
  const auto dtype = value_dtype(g, n.inputs[0]);
  const auto out_shape = static_shape(g, n.outputs[0]);
  if (!dtype || !is_fusable_float(*dtype) || !out_shape) return std::nullopt;
  std::vector<std::string> labels = spec->inputs;
  std::vector<Ints> shapes;
  for (std::size_t k = 0; k < n.inputs.size(); ++k) {
    const auto shape = static_shape(g, n.inputs[k]);
    if (!shape || shape->size() != labels[k].size()) return std::nullopt;
    shapes.push_back(*shape);
  }
  std::vector<Node> nodes;
  std::string operands[2] = {n.inputs[0], n.inputs.size() > 1 ? n.inputs[1] : std::string()};
  for (std::size_t k = 0; k < n.inputs.size(); ++k) {
    if (!take_diagonals(g, nodes, n.name + "_in" + std::to_string(k), &operands[k], &labels[k], &shapes[k], *dtype)) {
      return std::nullopt;
    }
  }
  if (n.inputs.size() == 1) {
    std::string labels0 = labels[0];
    Ints shape0 = shapes[0];
    const std::string summed = sum_labels(g, nodes, n.name + "_sum", operands[0], &labels0, &shape0, spec->output,
                                          *dtype, opset);
    if (labels0.size() != spec->output.size()) return std::nullopt;
    const std::string out = permute_labels(g, nodes, n.name + "_order", summed, labels0, spec->output, shape0, *dtype);
    write_einsum_output(g, nodes, n, out);
    return nodes;
  }
  const std::string& out = spec->output;
  // Labels of one operand that the other and the output lack are summed away first.
  std::string values[2] = {operands[0], operands[1]};
  for (int k = 0; k < 2; ++k) {
    values[k] = sum_labels(g, nodes, n.name + "_sum" + std::to_string(k), values[k], &labels[static_cast<size_t>(k)],
                           &shapes[static_cast<size_t>(k)], labels[static_cast<size_t>(1 - k)] + out, *dtype, opset);
  }
  std::string batch, contracted, free_a, free_b;
  std::map<char, std::int64_t> size;
  for (int k = 0; k < 2; ++k) {
    for (std::size_t d = 0; d < labels[static_cast<size_t>(k)].size(); ++d) {
      const char label = labels[static_cast<size_t>(k)][d];
      const std::int64_t extent = shapes[static_cast<size_t>(k)][d];
      auto [it, fresh] = size.emplace(label, extent);
      if (!fresh && it->second != extent) return std::nullopt;  // broadcasting labels: not this decomposition
    }
  }
  for (const char label : labels[0]) {
    const bool in_b = labels[1].find(label) != std::string::npos;
    const bool in_out = out.find(label) != std::string::npos;
    (in_b ? (in_out ? batch : contracted) : free_a) += label;
  }
  for (const char label : labels[1]) {
    if (labels[0].find(label) == std::string::npos) free_b += label;
  }
  for (const char label : out) {
    if (size.count(label) == 0) return std::nullopt;
  }
  const auto extent = [&](const std::string& ls) {
    std::int64_t p = 1;
    for (const char l : ls) p *= size[l];
    return p;
  };
  const std::int64_t M = extent(free_a), K = extent(contracted), N = extent(free_b);
  const std::string a = permute_labels(g, nodes, n.name + "_a", values[0], labels[0], batch + free_a + contracted,
                                       shapes[0], *dtype);
  const std::string b = permute_labels(g, nodes, n.name + "_b", values[1], labels[1], batch + contracted + free_b,
                                       shapes[1], *dtype);
  // The batch labels keep a dim each (MatMul broadcasts over leading dims; Note [Einsum onto MatMul]); only a group
  // of free or contracted labels other than one label is merged by a Reshape.
  Ints batch_dims;
  for (const char l : batch) batch_dims.push_back(size[l]);
  const auto batched = [&](std::int64_t rows, std::int64_t cols) {
    Ints shape = batch_dims;
    shape.insert(shape.end(), {rows, cols});
    return shape;
  };
  const auto viewed = [&](const std::string& value, const std::string& suffix, const Ints& shape, bool merge) {
    if (!merge) return value;
    const std::string view = new_value(g, n.name + suffix, *dtype, shape);
    nodes.push_back(reshape_node(g, n.name + suffix, value, shape, view));
    return view;
  };
  const std::string a3 = viewed(a, "_a3", batched(M, K), free_a.size() != 1 || contracted.size() != 1);
  const std::string b3 = viewed(b, "_b3", batched(K, N), contracted.size() != 1 || free_b.size() != 1);
  const std::string product = new_value(g, n.name + "_product", *dtype, batched(M, N));
  nodes.push_back(make_node(g, "MatMul", n.name + "_matmul", {a3, b3}, {product}));
  const std::string order = batch + free_a + free_b;
  Ints unfolded;
  for (const char l : order) unfolded.push_back(size[l]);
  const std::string full = viewed(product, "_unfolded", unfolded, free_a.size() != 1 || free_b.size() != 1);
  const std::string result = permute_labels(g, nodes, n.name + "_order", full, order, out, unfolded, *dtype);
  write_einsum_output(g, nodes, n, result);
  return nodes;
}

// Split (static input shape, constant split sizes or num_outputs) -> one Slice per output.
void decompose_split(Graph& g, const Node& n, std::size_t i, std::int64_t opset, Rewriter& rewriter) {
  const auto shape = static_shape(g, n.inputs[0]);
  if (!shape) return;
  const auto rank = static_cast<std::int64_t>(shape->size());
  std::int64_t axis = n.attrs.get_int("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return;
  const Ints sizes = split_sizes(g, n, opset, (*shape)[axis]);
  if (sizes.empty()) return;
  std::vector<Node> slices;
  std::int64_t start = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (n.outputs[k].empty()) {
      start += sizes[k];
      continue;
    }
    Node s;
    s.op_type = "Slice";
    s.name = g.unique_name(n.name + "_part" + std::to_string(k));
    s.outputs = {n.outputs[k]};
    s.inputs = {n.inputs[0]};
    if (opset < 10) {
      s.attrs.set("starts", Ints{start});
      s.attrs.set("ends", Ints{start + sizes[k]});
      s.attrs.set("axes", Ints{axis});
    } else {
      s.inputs.push_back(add_constant(g, s.name + "_starts", int64_tensor({start})));
      s.inputs.push_back(add_constant(g, s.name + "_ends", int64_tensor({start + sizes[k]})));
      s.inputs.push_back(add_constant(g, s.name + "_axes", int64_tensor({axis})));
    }
    start += sizes[k];
    slices.push_back(std::move(s));
  }
  rewriter.replace({i}, std::move(slices),
                   describe(n) + " -> " + std::to_string(sizes.size()) + " Slice(s) along axis " +
                       std::to_string(axis));
}

// Note [Pointwise 1-D convolutions as GEMMs]
// A 1-D Conv of kernel 1, stride 1 and no padding is a GEMM per sample: y[n] = W x[n] (+ b), W [O, C] read by every
// sample (one strided batch, W's stride 0). SqueezeBERT is made of them ([N, 768, 128], groups 1 and 4): as 2-D
// convolutions of height 1 they ran on cuDNN's grouped kernels at 1% of their floor, 86% of the run at batch 1 (H100,
// 2026-12-07). With groups the weight becomes block-diagonal [O, C] (zeros between the groups): one GEMM doing
// `groups` times the arithmetic, which up to kPointwiseMaxGroups groups costs less than the grouped convolution's
// kernels (a GEMM at these sizes waits on memory, not on arithmetic); more groups stay convolutions. The bias is an
// Add of b as [O, 1] after the MatMul, which joins its readers' fused kernel.
constexpr std::int64_t kPointwiseMaxGroups = 4;

bool pointwise_conv_1d_as_matmul(Graph& g, const Node& n, std::size_t i, const Tensor& w, const ValueType& x,
                                 const Ints& pads, Rewriter& rewriter) {
  const std::int64_t groups = n.attrs.get_int("group", 1);
  if (n.op_type != "Conv" || w.shape()[2] != 1 || n.attrs.get_ints("strides", {1}) != Ints{1} ||
      pads != Ints{0, 0} || groups < 1 || groups > kPointwiseMaxGroups || !is_fusable_float(w.dtype()) ||
      x.dtype != w.dtype()) {
    return false;
  }
  const std::int64_t out = w.shape()[0], in_per_group = w.shape()[1];
  if (out % groups != 0 || !x.shape[1].known() || x.shape[1].value != in_per_group * groups) return false;
  const bool bias = n.has_input(2);
  if (bias && constant(g, n.inputs[2])->numel() != out) return false;
  const std::int64_t in = in_per_group * groups, out_per_group = out / groups;
  const Tensor wc = w.contiguous();
  Tensor dense = Tensor::empty({out, in}, wc.dtype());
  const auto element = static_cast<std::size_t>(dtype_size(wc.dtype()));
  auto* to = static_cast<std::uint8_t*>(dense.data_ptr());
  const auto* from = static_cast<const std::uint8_t*>(wc.data_ptr());
  std::memset(to, 0, static_cast<std::size_t>(dense.nbytes()));
  for (std::int64_t o = 0; o < out; ++o) {  // row o: its group's columns from w[o, :, 0]
    const std::int64_t column = (o / out_per_group) * in_per_group;
    std::memcpy(to + static_cast<std::size_t>(o * in + column) * element,
                from + static_cast<std::size_t>(o * in_per_group) * element,
                static_cast<std::size_t>(in_per_group) * element);
  }
  ValueType y = x;
  y.shape[1] = Dim(out);
  const std::string product = bias ? g.unique_name(n.outputs[0] + "_matmul") : n.outputs[0];
  if (bias) g.types[product] = y;
  std::vector<Node> parts = {
      make_node(g, "MatMul", n.name, {add_constant(g, n.name + "_weight_matrix", dense), n.inputs[0]}, {product})};
  if (bias) {
    const Tensor& b = *constant(g, n.inputs[2]);
    const std::string column =
        add_constant(g, n.name + "_bias_column", from_doubles({out, 1}, b.dtype(), to_doubles(b)));
    parts.push_back(make_node(g, "Add", n.name + "_bias", {product, column}, {n.outputs[0]}));
  }
  rewriter.replace({i}, std::move(parts),
                   describe(n) + " (1-D, kernel 1, " + std::to_string(groups) + (groups == 1 ? " group" : " groups") +
                       ") -> MatMul(W, x)" + (bias ? " + Add(bias)" : ""));
  return true;
}

// 1-D Conv and ConvTranspose (constant weight) -> Unsqueeze + the 2-D op (kernel height 1) + Squeeze, or a pointwise
// Conv -> MatMul (Note [Pointwise 1-D convolutions as GEMMs]).
void decompose_conv_1d(Graph& g, const Node& n, std::size_t i, std::int64_t opset, Rewriter& rewriter) {
  const Tensor* w = constant(g, n.inputs[1]);
  const auto x = value_type(g, n.inputs[0]);
  if (w == nullptr || w->dim() != 3 || !x || !x->has_shape || x->shape.size() != 3) return;
  if (n.has_input(2) && !is_constant(g, n.inputs[2])) return;
  const std::string auto_pad = n.attrs.get_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID") return;
  const Ints pads = n.attrs.get_ints("pads", {0, 0});
  if (pads.size() != 2) return;
  if (pointwise_conv_1d_as_matmul(g, n, i, *w, *x, pads, rewriter)) return;
  Node conv = n;
  conv.name = n.name;
  const std::string x4 = g.unique_name(n.inputs[0] + "_2d");
  const std::string y4 = g.unique_name(n.outputs[0] + "_2d");
  Node unsqueeze = with_axes(g, "Unsqueeze", n.name + "_unsqueeze", n.inputs[0], x4, {2}, opset, 13);
  const Tensor wc = w->contiguous();
  Tensor w4 = Tensor::empty({wc.shape()[0], wc.shape()[1], 1, wc.shape()[2]}, wc.dtype());
  std::memcpy(w4.data_ptr(), wc.data_ptr(), static_cast<std::size_t>(wc.nbytes()));
  conv.inputs[0] = x4;
  conv.inputs[1] = add_constant(g, n.name + "_weight_2d", w4);
  conv.outputs = {y4};
  conv.attrs.set("kernel_shape", Ints{1, w->shape()[2]});
  conv.attrs.set("strides", Ints{1, n.attrs.get_ints("strides", {1})[0]});
  conv.attrs.set("dilations", Ints{1, n.attrs.get_ints("dilations", {1})[0]});
  conv.attrs.set("pads", Ints{0, pads[0], 0, pads[1]});
  if (auto_pad != "NOTSET") conv.attrs.set("auto_pad", auto_pad);
  // ConvTranspose's: the new height axis has no output padding and an output height of 1.
  if (n.attrs.has("output_padding")) {
    conv.attrs.set("output_padding", Ints{0, n.attrs.get_ints("output_padding", {0})[0]});
  }
  if (n.attrs.has("output_shape")) conv.attrs.set("output_shape", Ints{1, n.attrs.get_ints("output_shape", {1})[0]});
  Node squeeze = with_axes(g, "Squeeze", n.name + "_squeeze", y4, n.outputs[0], {2}, opset, 13);
  ValueType t4 = *x;
  t4.shape.insert(t4.shape.begin() + 2, Dim(std::int64_t{1}));
  g.types[x4] = t4;
  rewriter.replace({i}, {unsqueeze, conv, squeeze},
                   describe(n) + " (1-D) -> Unsqueeze + 2-D " + n.op_type + " + Squeeze");
}

// Clip with run-time bounds, or after an elementwise op (Note [Clips between elementwise ops]) -> Max then Min.
void decompose_clip(Graph& g, const Node& n, std::size_t i, std::int64_t /*opset*/, Rewriter& rewriter) {
  // Bounds computed at run time (T5's fp16 clamp to finfo.max, or finfo.max - 1000 after an overflow):
  // Max(x, min) then Min(., max), the same values (NaN kept; min > max gives max, like np.clip).
  std::vector<Node> parts;
  std::string current = n.inputs[0];
  for (std::size_t k = 1; k < 3; ++k) {
    if (!n.has_input(k)) continue;
    const bool last = k == 2 || !n.has_input(2);
    Node bound;
    bound.op_type = k == 1 ? "Max" : "Min";
    bound.name = g.unique_name(n.name + (k == 1 ? "_min" : "_max"));
    bound.inputs = {current, n.inputs[k]};
    bound.outputs = {last ? n.outputs[0] : g.unique_name(n.outputs[0] + "_lower")};
    if (!last) {
      if (const ValueType* t = g.type(n.inputs[0])) g.types[bound.outputs[0]] = *t;
    }
    current = bound.outputs[0];
    parts.push_back(std::move(bound));
  }
  rewriter.replace({i}, std::move(parts), describe(n) + " -> Max/Min");
}

// Variadic Sum / Max / Min and Mean -> chains of two-input nodes (Mean: then a Div by the count).
void decompose_variadic(Graph& g, const Node& n, std::size_t i, std::int64_t /*opset*/, Rewriter& rewriter) {
  // Variadic forms -> a chain of two-input nodes (Mean: the Sum chain, then a Div by the count).
  const auto dtype = value_dtype(g, n.inputs[0]);
  const auto out_shape = static_shape(g, n.outputs[0]);
  if (!dtype || !out_shape || (n.op_type == "Mean" && !is_fusable_float(*dtype))) return;
  const std::string pairwise = n.op_type == "Mean" ? "Sum" : n.op_type;
  std::vector<Node> parts;
  std::string current = n.inputs[0];
  for (std::size_t k = 1; k < n.inputs.size(); ++k) {
    const bool last = k + 1 == n.inputs.size() && n.op_type != "Mean";
    const std::string out = last ? n.outputs[0] : new_value(g, n.outputs[0] + "_partial", *dtype, *out_shape);
    parts.push_back(make_node(g, pairwise, n.name + "_part" + std::to_string(k), {current, n.inputs[k]}, {out}));
    current = out;
  }
  if (n.op_type == "Mean") {
    const std::string count = add_constant(
        g, n.name + "_count", from_doubles({}, *dtype, {static_cast<double>(n.inputs.size())}));
    parts.push_back(make_node(g, "Div", n.name + "_mean", {current, count}, {n.outputs[0]}));
  } else if (n.inputs.size() == 1) {
    parts.push_back(make_node(g, "Identity", n.name + "_single", {current}, {n.outputs[0]}));
  }
  const std::string what = describe(n) + " -> " + std::to_string(n.inputs.size()) + "-input chain of " + pairwise +
                           (n.op_type == "Mean" ? " + Div" : "");
  rewriter.replace({i}, std::move(parts), what);
}

// DepthToSpace (DCR, CRD) and SpaceToDepth (static shapes) -> Reshape + Transpose + Reshape.
void decompose_depth_space(Graph& g, const Node& n, std::size_t i, std::int64_t /*opset*/, Rewriter& rewriter) {
  const auto x = static_shape(g, n.inputs[0]);
  const auto dtype = value_dtype(g, n.inputs[0]);
  const std::int64_t b = n.attrs.get_int("blocksize", 0);
  if (!x || !dtype || x->size() != 4 || b <= 0) return;
  const std::int64_t N = (*x)[0], C = (*x)[1], H = (*x)[2], W = (*x)[3];
  Ints split, perm, out;
  if (n.op_type == "DepthToSpace") {
    if (C % (b * b) != 0) return;
    const bool crd = n.attrs.get_string("mode", "DCR") == "CRD";
    split = crd ? Ints{N, C / (b * b), b, b, H, W} : Ints{N, b, b, C / (b * b), H, W};
    perm = crd ? Ints{0, 1, 4, 2, 5, 3} : Ints{0, 3, 4, 1, 5, 2};
    out = {N, C / (b * b), H * b, W * b};
  } else {
    if (H % b != 0 || W % b != 0) return;
    split = {N, C, H / b, b, W / b, b};
    perm = {0, 3, 5, 1, 2, 4};
    out = {N, C * b * b, H / b, W / b};
  }
  Ints permuted;
  for (const std::int64_t p : perm) permuted.push_back(split[static_cast<std::size_t>(p)]);
  const std::string six = new_value(g, n.outputs[0] + "_blocks", *dtype, split);
  const std::string moved = new_value(g, n.outputs[0] + "_moved", *dtype, permuted);
  Attributes t;
  t.set("perm", perm);
  rewriter.replace({i},
                   {reshape_node(g, n.name + "_split", n.inputs[0], split, six),
                    make_node(g, "Transpose", n.name + "_move", {six}, {moved}, t),
                    reshape_node(g, n.name + "_merge", moved, out, n.outputs[0])},
                   describe(n) + " -> Reshape + Transpose + Reshape");
}

// InstanceNormalization and GroupNormalization (constant scale and bias) -> layer_norm.
void decompose_normalization(Graph& g, const Node& n, std::size_t i, bool row_affine, Rewriter& rewriter) {
  // Note [Normalizations onto layer_norm]
  const auto x = static_shape(g, n.inputs[0]);
  const auto dtype = value_dtype(g, n.inputs[0]);
  const Tensor* scale = constant(g, n.inputs[1]);
  const Tensor* bias = constant(g, n.inputs[2]);
  if (!x || !dtype || x->size() < 3 || !is_fusable_float(*dtype) || scale == nullptr || bias == nullptr) return;
  const std::int64_t channels = (*x)[1];
  const std::int64_t groups = n.op_type == "InstanceNormalization" ? channels : n.attrs.get_int("num_groups", 0);
  if (groups <= 0 || channels % groups != 0) return;
  if ((scale->numel() != channels && scale->numel() != groups) || bias->numel() != scale->numel()) return;
  const double epsilon = n.attrs.get_float("epsilon", 1e-5);
  row_affine = row_affine && product_of(*x, 2, x->size()) > 0;  // as normalization_onto_layer_norm decides
  const char* how = !row_affine         ? " -> Reshape + LayerNormalization + Reshape + Mul + Add"
                    : groups == channels ? " -> LayerNormalization over the spatial axes (per-row affine)"
                                         : " -> Reshape + LayerNormalization (per-channel runs) + Reshape";
  rewriter.replace({i}, normalization_onto_layer_norm(g, n, *x, *dtype, groups, *scale, *bias, epsilon, row_affine),
                   describe(n) + how);
}

// ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSumExp (float) -> Abs / Mul / Exp ... and ReduceSum (ReduceMax).
void decompose_reduction(Graph& g, const Node& n, std::size_t i, std::int64_t opset, Rewriter& rewriter) {
  const auto x = static_shape(g, n.inputs[0]);
  const auto dtype = value_dtype(g, n.inputs[0]);
  const auto y = static_shape(g, n.outputs[0]);
  if (!x || !dtype || !y || !is_fusable_float(*dtype)) return;
  Ints axes;
  bool axes_given = false;
  if (opset < 18) {
    axes_given = n.attrs.has("axes");
    axes = n.attrs.get_ints("axes", {});
  } else if (n.has_input(1)) {
    const Tensor* t = constant(g, n.inputs[1]);
    if (t == nullptr || t->dtype() != DType::kInt64) return;
    const auto* p = static_cast<const std::int64_t*>(t->data_ptr());
    axes.assign(p, p + t->numel());
    axes_given = true;
  }
  if (axes_given && axes.empty() && n.attrs.get_int("noop_with_empty_axes", 0) != 0) return;
  const std::int64_t keepdims = n.attrs.get_int("keepdims", 1);
  Ints kept_shape = *x;  // the reduced shape with keepdims=1
  for (std::size_t d = 0; d < kept_shape.size(); ++d) {
    bool reduced = !axes_given || axes.empty();
    for (const std::int64_t a : axes) reduced = reduced || (a < 0 ? a + static_cast<std::int64_t>(x->size()) : a) ==
                                                               static_cast<std::int64_t>(d);
    if (reduced) kept_shape[d] = 1;
  }
  std::vector<Node> parts;
  const std::string in = n.inputs[0];
  if (n.op_type == "ReduceLogSumExp") {
    // log(sum(exp(x - m))) + m with m = max(x) over the axes: no overflow for large x.
    const std::string m = new_value(g, n.outputs[0] + "_max", *dtype, kept_shape);
    parts.push_back(reduce_node(g, "ReduceMax", n.name + "_max", in, m, axes, axes_given, 1, opset));
    const std::string shifted = new_value(g, n.outputs[0] + "_shifted", *dtype, *x);
    parts.push_back(make_node(g, "Sub", n.name + "_shift", {in, m}, {shifted}));
    const std::string e = new_value(g, n.outputs[0] + "_exp", *dtype, *x);
    parts.push_back(make_node(g, "Exp", n.name + "_exp", {shifted}, {e}));
    const std::string sum = new_value(g, n.outputs[0] + "_sum", *dtype, kept_shape);
    parts.push_back(reduce_node(g, "ReduceSum", n.name + "_sum", e, sum, axes, axes_given, 1, opset));
    const std::string log = new_value(g, n.outputs[0] + "_log", *dtype, kept_shape);
    parts.push_back(make_node(g, "Log", n.name + "_log", {sum}, {log}));
    const std::string total = keepdims ? n.outputs[0] : new_value(g, n.outputs[0] + "_kept", *dtype, kept_shape);
    parts.push_back(make_node(g, "Add", n.name + "_add", {log, m}, {total}));
    if (!keepdims) parts.push_back(reshape_node(g, n.name + "_squeeze", total, *y, n.outputs[0]));
  } else {
    const std::string term = new_value(g, n.outputs[0] + "_term", *dtype, *x);
    if (n.op_type == "ReduceL1") {
      parts.push_back(make_node(g, "Abs", n.name + "_abs", {in}, {term}));
    } else {
      parts.push_back(make_node(g, "Mul", n.name + "_square", {in, in}, {term}));
    }
    const bool root = n.op_type == "ReduceL2";
    const std::string sum = root ? new_value(g, n.outputs[0] + "_sum", *dtype, *y) : n.outputs[0];
    parts.push_back(reduce_node(g, "ReduceSum", n.name + "_sum", term, sum, axes, axes_given, keepdims, opset));
    if (root) parts.push_back(make_node(g, "Sqrt", n.name + "_sqrt", {sum}, {n.outputs[0]}));
  }
  rewriter.replace({i}, std::move(parts), describe(n) + " -> elementwise ops and ReduceSum/ReduceMax");
}

// Einsum of one or two operands -> Transpose/Reshape around a MatMul (Note [Einsum onto MatMul]).
void decompose_einsum(Graph& g, const Node& n, std::size_t i, std::int64_t opset, Rewriter& rewriter) {
  // Note [Einsum onto MatMul]
  auto nodes = einsum_nodes(g, n, opset);
  if (!nodes) return;
  rewriter.replace({i}, std::move(*nodes), describe(n) + " -> Transpose/Reshape + MatMul (+ ReduceSum)");
}

// LayerNormalization whose constant scale or bias has another float type than X -> the same node with the
// constants in X's type.
void convert_layer_norm_constants(Graph& g, const Node& n, std::size_t i, std::int64_t /*opset*/, Rewriter& rewriter) {
  const auto x = value_dtype(g, n.inputs[0]);
  if (!x || !is_fusable_float(*x)) return;
  Node fixed = n;
  bool changed = false;
  for (std::size_t k = 1; k < n.inputs.size() && k < 3; ++k) {
    const Tensor* c = n.has_input(k) ? constant(g, n.inputs[k]) : nullptr;
    if (c == nullptr || c->dtype() == *x || !is_fusable_float(c->dtype())) continue;
    fixed.inputs[k] = add_constant(g, n.inputs[k] + "_" + std::string(dtype_name(*x)),
                                   from_doubles(c->shape(), *x, to_doubles(*c)));
    changed = true;
  }
  if (changed) {
    rewriter.replace({i}, {fixed}, describe(n) + ": scale/bias converted to " + std::string(dtype_name(*x)));
  }
}

// Note [Linears over an inner axis]
// CaiT's talking heads mix the heads of the scores with a Linear between permutes (`proj_l(attn.permute(0, 2, 3,
// 1)).permute(0, 3, 1, 2)`): Transpose (axis a moved last, the others in order) -> MatMul(., W [K, N]) [-> Add(b,
// one value per output feature)] -> Transpose (the last axis back to a). Two copies of the whole tensor around a GEMM
// of K = H. The same product, with x viewed as [outer, K, inner] (the dims before a, a, the dims after it), is
// MatMul(W^T [N, K], x) [+ b as [N, 1]] -> [outer, N, inner], viewed back as x's shape with N at axis a: one batched
// GEMM over x where it is (both Reshapes are views; W^T is a constant node the plan folds, the bias a [N, 1]
// constant). The same products and sums, in a GEMM's own order of accumulation. Everything between the two
// Transposes must be read by the next node only, and the dims after a must hold at least kInnerLinearMinColumns
// elements.

// The batched GEMM's columns (the elements after axis a) below which the rewrite is not made: a batch of GEMMs that
// thin is slower than the two transposes and one GEMM over all the rows.
constexpr std::int64_t kInnerLinearMinColumns = 32;

// The axis a permutation `perm` moves last, keeping the others in order (not the identity), or nullopt.
std::optional<std::int64_t> axis_moved_last(const Ints& perm) {
  const auto rank = static_cast<std::int64_t>(perm.size());
  if (rank < 3 || perm.back() < 0 || perm.back() >= rank - 1) return std::nullopt;
  const std::int64_t a = perm.back();
  for (std::int64_t k = 0, next = 0; k + 1 < rank; ++k, ++next) {
    if (next == a) ++next;
    if (perm[static_cast<std::size_t>(k)] != next) return std::nullopt;
  }
  return a;
}

// Whether `perm` moves the last axis back to `a` (the inverse of the permutation axis_moved_last accepts).
bool moves_last_axis_to(const Ints& perm, std::int64_t a) {
  const auto rank = static_cast<std::int64_t>(perm.size());
  for (std::int64_t k = 0; k < rank; ++k) {
    const std::int64_t want = k < a ? k : (k == a ? rank - 1 : k - 1);
    if (perm[static_cast<std::size_t>(k)] != want) return false;
  }
  return true;
}

void decompose_inner_axis_linear(Graph& g, const Node& t1, std::size_t i, const Uses& uses, Rewriter& rewriter) {
  // Note [Linears over an inner axis]
  const Ints perm = t1.attrs.get_ints("perm", {});
  const auto x = static_shape(g, t1.inputs[0]);
  const auto dtype = value_dtype(g, t1.inputs[0]);
  const auto a = axis_moved_last(perm);
  if (!x || !dtype || !is_fusable_float(*dtype) || !a || x->size() != perm.size()) return;
  const auto mm = sole_reader(g, uses, rewriter, t1.outputs[0], "MatMul");
  if (!mm || g.nodes[*mm].inputs.size() != 2 || g.nodes[*mm].inputs[0] != t1.outputs[0]) return;
  const Node& matmul = g.nodes[*mm];
  const Tensor* w = constant(g, matmul.inputs[1]);
  const std::int64_t k = (*x)[static_cast<std::size_t>(*a)];
  if (w == nullptr || w->shape().size() != 2 || w->shape()[0] != k || w->dtype() != *dtype) return;
  const std::int64_t n = w->shape()[1];
  std::vector<std::size_t> pattern = {i, *mm};
  std::string last = matmul.outputs[0];
  std::optional<std::vector<double>> bias;  // one constant value per output feature, added after the MatMul
  if (const auto add = sole_reader(g, uses, rewriter, last, "Add")) {
    const Node& plus = g.nodes[*add];
    const Tensor* c = plus.inputs.size() == 2 ? constant(g, other_input(plus, last)) : nullptr;
    if (c == nullptr || c->numel() != n || c->dtype() != *dtype) return;
    bias = per_channel_values(*c, n, 0, static_cast<std::int64_t>(x->size()));  // not past x's rank
    if (!bias) return;
    pattern.push_back(*add);
    last = plus.outputs[0];
  }
  const auto t2 = sole_reader(g, uses, rewriter, last, "Transpose");
  if (!t2 || !moves_last_axis_to(g.nodes[*t2].attrs.get_ints("perm", {}), *a)) return;
  pattern.push_back(*t2);
  if (rewriter.any_taken(pattern)) return;
  const std::int64_t outer = product_of(*x, 0, static_cast<std::size_t>(*a));
  const std::int64_t inner = product_of(*x, static_cast<std::size_t>(*a) + 1, x->size());
  if (inner < kInnerLinearMinColumns) return;  // many thin GEMMs: the transposes and one GEMM are cheaper
  const std::string name = t1.name + "_inner_linear";
  std::vector<Node> nodes;
  const std::string x3 = new_value(g, name + "_x", *dtype, {outer, k, inner});
  nodes.push_back(reshape_node(g, name + "_x", t1.inputs[0], {outer, k, inner}, x3));
  const std::string wt = new_value(g, name + "_wt", *dtype, {n, k});
  Attributes swap;
  swap.set("perm", Ints{1, 0});
  nodes.push_back(make_node(g, "Transpose", name + "_wt", {matmul.inputs[1]}, {wt}, swap));
  std::string y = new_value(g, name + "_y", *dtype, {outer, n, inner});
  nodes.push_back(make_node(g, "MatMul", name, {wt, x3}, {y}));
  if (bias) {
    const std::string column = add_constant(g, name + "_b", from_doubles({n, 1}, *dtype, *bias));
    const std::string biased = new_value(g, name + "_yb", *dtype, {outer, n, inner});
    nodes.push_back(make_node(g, "Add", name + "_bias", {y, column}, {biased}));
    y = biased;
  }
  Ints out = *x;
  out[static_cast<std::size_t>(*a)] = n;
  nodes.push_back(reshape_node(g, name + "_out", y, out, g.nodes[*t2].outputs[0]));
  rewriter.replace(pattern, std::move(nodes),
                   "Transpose -> " + describe(matmul) + (bias ? " + bias" : "") + " -> Transpose over axis " +
                       std::to_string(*a) + " -> one MatMul of W^T and x viewed as [" + std::to_string(outer) + ", " +
                       std::to_string(k) + ", " + std::to_string(inner) + "] (Note [Linears over an inner axis])");
}

}  // namespace

// Note [Clips between elementwise ops]
// A Clip with constant bounds runs as a kernel of its own (cuda_raw's clip on the GPU), and the elementwise fusion's
// programs have Max and Min but no Clip: F.normalize's clamp_min(eps) between its ReduceL2 and its Div (Swin V2's
// cosine attention normalises q and k so in each of its 12 blocks) split what would be one row program. A Clip whose
// input an elementwise op or a reduction writes becomes Max(x, min) then Min(., max), as with run-time bounds, and
// joins that op's program; after any other producer it stays (a convolution's ReLU6 goes into its epilogue: Note
// [ReLU6 in the CPU convolution's epilogue] in fusion_conv_gemm.cpp).
bool clip_after_elementwise(const Graph& g, const std::unordered_map<std::string, std::string>& producers,
                            const Node& clip) {
  static const std::set<std::string> kProducers = {
      "Add",  "Sub",       "Mul",        "Div",        "Pow",     "Sqrt",          "Exp",
      "Log",  "Abs",       "Neg",        "Reciprocal", "Erf",     "Sigmoid",       "Tanh",
      "Relu", "ReduceSum", "ReduceMean", "ReduceMax",  "ReduceL1", "ReduceL2",     "ReduceSumSquare"};
  const auto it = producers.find(clip.inputs[0]);
  if (it == producers.end() || !kProducers.count(it->second)) return false;
  const auto dtype = value_dtype(g, clip.inputs[0]);
  return dtype && is_fusable_float(*dtype);
}

PassResult op_decomposition(Graph& g, const PassContext& ctx) {
  PassResult result{"op_decomposition", 0, {}};
  const std::int64_t opset = g.opset("");
  Rewriter rewriter(g);
  std::unordered_map<std::string, std::string> producers;  // value -> the op type of the ONNX node writing it
  for (const Node& n : g.nodes) {
    if (!n.domain.empty()) continue;
    for (const std::string& out : n.outputs) producers[out] = n.op_type;
  }
  const Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node n = g.nodes[i];
    if (!n.domain.empty() || rewriter.taken(i) || !has_onnx_arity(n)) continue;
    if (n.op_type == "Transpose" && n.inputs.size() == 1 && opset >= 5) {  // Reshape's shape input: opset 5
      decompose_inner_axis_linear(g, n, i, uses, rewriter);
    } else if (n.op_type == "Split" && !n.inputs.empty()) {
      decompose_split(g, n, i, opset, rewriter);
    } else if ((n.op_type == "Conv" || n.op_type == "ConvTranspose") && n.inputs.size() >= 2) {
      decompose_conv_1d(g, n, i, opset, rewriter);
    } else if (n.op_type == "Clip" && opset >= 11 && !n.inputs.empty() &&
               ((n.has_input(1) && !is_constant(g, n.inputs[1])) || (n.has_input(2) && !is_constant(g, n.inputs[2])) ||
                ((n.has_input(1) || n.has_input(2)) && clip_after_elementwise(g, producers, n)))) {
      decompose_clip(g, n, i, opset, rewriter);
    } else if ((n.op_type == "Sum" || n.op_type == "Max" || n.op_type == "Min" || n.op_type == "Mean") &&
               !n.inputs.empty() && (n.inputs.size() != 2 || n.op_type == "Mean") && opset >= 8) {
      decompose_variadic(g, n, i, opset, rewriter);
    } else if ((n.op_type == "DepthToSpace" || n.op_type == "SpaceToDepth") && !n.inputs.empty() && opset >= 5) {
      decompose_depth_space(g, n, i, opset, rewriter);
    } else if ((n.op_type == "InstanceNormalization" || n.op_type == "GroupNormalization") && n.inputs.size() >= 3 &&
               opset >= 7) {  // the Mul and Add broadcast (opset 7+), the Reshapes take shape inputs (5+)
      decompose_normalization(g, n, i, /*row_affine=*/!ctx.device.is_cuda(), rewriter);
    } else if ((n.op_type == "ReduceL1" || n.op_type == "ReduceL2" || n.op_type == "ReduceSumSquare" ||
                n.op_type == "ReduceLogSumExp") && !n.inputs.empty() && opset >= 7) {
      decompose_reduction(g, n, i, opset, rewriter);
    } else if (n.op_type == "Einsum") {
      decompose_einsum(g, n, i, opset, rewriter);
    } else if (n.op_type == "LayerNormalization" && n.inputs.size() >= 2) {
      convert_layer_norm_constants(g, n, i, opset, rewriter);
    }
  }
  rewriter.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
