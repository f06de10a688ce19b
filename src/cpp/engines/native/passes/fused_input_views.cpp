// fused_input_views: a fused node's input made of Slices, Transposes and Reshapes of a tensor reads that tensor
// through a strided view (Note [Inputs read through a view] in core/fused_elementwise.h).
//
// Note [Fused nodes read their inputs' views]
// Exporters cut packed projections with Slices of the last axis (Phi-3's q, k and v of one GEMM, its gate and up of
// another; GPT-NeoX's per-head q, k, v and the rotary part of each head) and move heads with Transposes. Each Slice or
// Transpose whose result is not one contiguous block is a copy kernel: Phi-3 ran five per layer before its rotary and
// SwiGLU kernels, which at batch 1 cost more than the kernels they fed. A generated kernel reads any strided view at
// no cost (its indexing is baked in), so this pass walks each input of a FusedElementwise back through the view ops
// that made it (Slice with constant starts, ends, axes and positive steps; Transpose; Reshape, Flatten, Squeeze and
// Unsqueeze where the result is expressible as strides of what they read, with static shapes, which a plan's graph
// has) and, where the composed view is not contiguous (a copy would have run), gives the node the chain's source
// with the view instead. The ops the node no longer needs go when nothing else reads them. Values that are views
// already (contiguous blocks) are left alone: they cost nothing. The cpu kernel reads a view a run of its innermost
// axis at a time (rotate_half's reads by a carry walk), so CPU plans take the views too (the tiny exports on this
// project's 2-vCPU machine: Phi-3 137 against 144 us a run with the copies, MaxViT 1.14 against 1.19 ms, the others
// within 1%).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "core/attention_layout.h"
#include "core/fused_elementwise.h"
#include "core/shape_str.h"
#include "engines/native/passes/pass_utils.h"
#include "engines/native/passes/passes.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

using Shape = std::vector<std::int64_t>;


std::optional<std::vector<std::int64_t>> constant_ints(const Graph& g, const Node& n, std::size_t k) {
  if (!n.has_input(k)) return std::nullopt;
  const Tensor* t = constant(g, n.inputs[k]);
  if (t == nullptr) return std::nullopt;
  std::vector<std::int64_t> out;
  for (double x : to_doubles(*t)) {
    out.push_back(x >= 9.2e18 ? INT64_MAX : x <= -9.2e18 ? INT64_MIN : static_cast<std::int64_t>(x));
  }
  return out;
}

// `v` (of `n`'s input) through the Slice `n` whose output is `out` (static): offsets and strides of constant starts,
// axes and positive steps (ONNX's clamping of starts); nullopt for anything else.
std::optional<fused::InputView> sliced(const Graph& g, const Node& n, const fused::InputView& v, const Shape& out) {
  if (g.opset("") < 10 || n.inputs.size() < 3 || out.size() != v.shape.size()) return std::nullopt;
  const auto starts = constant_ints(g, n, 1);
  if (!starts || !constant_ints(g, n, 2)) return std::nullopt;
  const auto rank = static_cast<std::int64_t>(v.shape.size());
  std::vector<std::int64_t> axes(starts->size()), steps(starts->size(), 1);
  for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<std::int64_t>(i);
  if (n.has_input(3)) {
    auto a = constant_ints(g, n, 3);
    if (!a || a->size() != starts->size()) return std::nullopt;
    axes = *a;
  }
  if (n.has_input(4)) {
    auto s = constant_ints(g, n, 4);
    if (!s || s->size() != starts->size()) return std::nullopt;
    steps = *s;
  }
  fused::InputView r = v;
  r.shape = out;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const std::int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (axis < 0 || axis >= rank || steps[i] <= 0) return std::nullopt;
    const auto a = static_cast<std::size_t>(axis);
    const std::int64_t dim = v.shape[a];
    std::int64_t start = (*starts)[i];
    start = std::clamp<std::int64_t>(start < 0 ? (start < -dim ? 0 : start + dim) : start, 0, dim);
    if (out[a] > 0) r.offset += start * v.strides[a];
    r.strides[a] = v.strides[a] * steps[i];
  }
  return r;
}

// Note [Copies through reshapes that strides cannot express]
// MobileViT unfolds each feature map into patches with a Transpose back to NCHW, a Reshape, a Transpose, a Reshape, a
// Transpose and a Reshape, and folds them back the same way: three strided copies each way (20 strided copies and 14
// transposes, 300 us of a 1.9 ms run at batch 16 on an H200). Their composition is no strided view of the result's
// shape, because a Reshape between two Transposes merges axes that are not one run of memory (a patch's rows nh and
// columns nw). It is a strided view of a finer shape, though: a Reshape whose sizes divide each other splits the axes
// it reads and writes into common factors, each with its own stride, so that [B*P, N, C] is its tensor read as
// [B, ph, pw, nh, nw, C] (the same elements in the same row-major order). Such a chain becomes one copy into the finer
// shape and a Reshape of that contiguous copy (no copy). Refined tracks a value as a view over finer axes and, per
// axis of the value, how many finer axes it spans; Transposes move whole groups, Slices take values whose every axis
// is one finer axis, Reshapes refine.
struct Refined {
  fused::InputView view;           // over the finer axes
  std::vector<std::size_t> group;  // per axis of the value: how many consecutive finer axes it spans
};

Refined refined_of(fused::InputView v) {
  const std::size_t rank = v.shape.size();
  return Refined{std::move(v), std::vector<std::size_t>(rank, 1)};
}

// The value's view where each of its axes is one finer axis.
std::optional<fused::InputView> plain(const Refined& r) {
  for (std::size_t n : r.group) {
    if (n != 1) return std::nullopt;
  }
  return r.view;
}

// The value's shape: each axis the product of its finer axes.
Shape logical_shape(const Refined& r) {
  Shape shape;
  std::size_t at = 0;
  for (std::size_t n : r.group) {
    std::int64_t size = 1;
    for (std::size_t k = 0; k < n; ++k) size *= r.view.shape[at + k];
    shape.push_back(size);
    at += n;
  }
  return shape;
}

// Note [A Gather of one index is a view]
// PyTorch's select (x[..., i, :]) exports as Gather(x, i, axis) with a rank-0 index: the axis taken at i and dropped,
// which reads no element twice and none out of order, so it is a view: offset + i * stride of the axis, the other axes
// as they were. BLOOM cuts q, k and v out of its [B, S, H, 3, D] projection so (36 copy kernels a run at 12 layers,
// before); as a view op the cut joins the chains the fused kernels and the attention read in place (Note [Attention
// reads packed heads in place]). A Gather of any other index stays a gather.
// A Gather of one constant index (Note [A Gather of one index is a view]).
bool is_select(const Graph& g, const Node& n) {
  if (!is_onnx(n, "Gather") || n.inputs.size() != 2) return false;
  const Tensor* index = constant(g, n.inputs[1]);
  return index != nullptr && index->shape().empty() &&
         (index->dtype() == DType::kInt64 || index->dtype() == DType::kInt32);
}

std::optional<fused::InputView> gathered(const Graph& g, const Node& n, const fused::InputView& v, const Shape& out) {
  if (!is_select(g, n) || out.size() + 1 != v.shape.size()) return std::nullopt;
  const auto picked = constant_ints(g, n, 1);
  const auto rank = static_cast<std::int64_t>(v.shape.size());
  std::int64_t axis = n.attrs.get_int("axis", 0);
  axis = axis < 0 ? axis + rank : axis;
  if (!picked || picked->size() != 1 || axis < 0 || axis >= rank) return std::nullopt;
  const auto a = static_cast<std::size_t>(axis);
  const std::int64_t i = (*picked)[0] < 0 ? (*picked)[0] + v.shape[a] : (*picked)[0];
  if (i < 0 || i >= v.shape[a]) return std::nullopt;
  fused::InputView r;
  r.offset = v.offset + i * v.strides[a];
  for (std::size_t d = 0; d < v.shape.size(); ++d) {
    if (d == a) continue;
    r.shape.push_back(v.shape[d]);
    r.strides.push_back(v.strides[d]);
  }
  if (r.shape != out) return std::nullopt;
  return r;
}

// `r` through the Transpose `n` (its output `out`): each axis of the value moves with its finer axes.
std::optional<Refined> transposed(const Node& n, const Refined& r, const Shape& out) {
  std::vector<std::int64_t> perm = n.attrs.get_ints("perm", {});
  if (perm.empty()) {
    for (std::size_t d = r.group.size(); d-- > 0;) perm.push_back(static_cast<std::int64_t>(d));
  }
  if (perm.size() != r.group.size()) return std::nullopt;
  std::vector<std::size_t> starts(r.group.size(), 0);
  for (std::size_t d = 1; d < r.group.size(); ++d) starts[d] = starts[d - 1] + r.group[d - 1];
  Refined t;
  t.view.offset = r.view.offset;
  for (std::int64_t p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(r.group.size())) return std::nullopt;
    const auto a = static_cast<std::size_t>(p);
    for (std::size_t k = starts[a]; k < starts[a] + r.group[a]; ++k) {
      t.view.shape.push_back(r.view.shape[k]);
      t.view.strides.push_back(r.view.strides[k]);
    }
    t.group.push_back(r.group[a]);
  }
  if (logical_shape(t) != out) return std::nullopt;
  return t;
}

// `r` reshaped to `to`: the common factors of the sizes of `r`'s runs of memory and `to`, from the last axis, a finer
// axis of the result merged with the next where they are one run; nullopt where sizes do not divide each other.
std::optional<Refined> refine(const Refined& r, const Shape& to) {
  Shape dims, strides;  // runs of memory (size-1 axes carry nothing), so that a Reshape may cut one anywhere
  for (std::size_t d = 0; d < r.view.shape.size(); ++d) {
    if (r.view.shape[d] <= 0) return std::nullopt;  // an empty tensor: nothing to read through a view
    if (r.view.shape[d] == 1) continue;
    std::int64_t run = 0, merged = 0;
    if (__builtin_mul_overflow(r.view.strides[d], r.view.shape[d], &run)) return std::nullopt;
    if (!dims.empty() && strides.back() == run) {
      if (__builtin_mul_overflow(dims.back(), r.view.shape[d], &merged)) return std::nullopt;
      dims.back() = merged;
      strides.back() = r.view.strides[d];
      continue;
    }
    dims.push_back(r.view.shape[d]);
    strides.push_back(r.view.strides[d]);
  }
  Refined out;
  out.view.offset = r.view.offset;
  out.group.assign(to.size(), 0);
  Shape sizes, steps;  // the result's finer axes, last first
  std::size_t d = dims.size();
  std::int64_t left = 1, stride = 0;  // what is left of finer axis d, and its stride
  for (std::size_t t = to.size(); t-- > 0;) {
    std::int64_t want = to[t];
    if (want <= 1) {
      sizes.push_back(want);
      steps.push_back(0);
      out.group[t] = 1;
      continue;
    }
    std::size_t made = 0;
    while (want > 1) {
      if (left == 1) {
        if (d == 0) return std::nullopt;
        --d;
        left = dims[d];
        stride = strides[d];
      }
      std::int64_t take = 0;
      if (want % left == 0) {
        take = left;
      } else if (left % want == 0) {
        take = want;
      } else {
        return std::nullopt;
      }
      if (made > 0 && steps.back() * sizes.back() == stride) {
        sizes.back() *= take;  // one run with the axis inside it
      } else {
        sizes.push_back(take);
        steps.push_back(stride);
        ++made;
      }
      stride *= take;
      left /= take;
      want /= take;
    }
    out.group[t] = made;
  }
  if (left != 1 || d != 0 || sizes.size() > fused::kMaxViewRank) return std::nullopt;
  out.view.shape.assign(sizes.rbegin(), sizes.rend());
  out.view.strides.assign(steps.rbegin(), steps.rend());
  return out;
}

// `v` through the view op `n` (its output `out`, static), or nullopt where it is not one this pass composes.
std::optional<fused::InputView> through(const Graph& g, const Node& n, const fused::InputView& v, const Shape& out) {
  if (is_onnx(n, "Slice")) return sliced(g, n, v, out);
  if (is_onnx(n, "Gather")) return gathered(g, n, v, out);
  if (is_onnx(n, "Transpose")) {
    auto t = transposed(n, refined_of(v), out);
    return t ? plain(*t) : std::nullopt;
  }
  if (is_onnx(n, "Reshape") || is_onnx(n, "Flatten") || is_onnx(n, "Squeeze") || is_onnx(n, "Unsqueeze")) {
    auto r = refine(refined_of(v), out);  // a view of `out`'s shape where each axis is one run or part of one
    return r ? plain(*r) : std::nullopt;
  }
  return std::nullopt;
}

bool is_view_op(const Graph& g, const Node& n) {
  return is_onnx(n, "Slice") || is_onnx(n, "Transpose") || is_onnx(n, "Reshape") || is_onnx(n, "Flatten") ||
         is_onnx(n, "Squeeze") || is_onnx(n, "Unsqueeze") || is_select(g, n);
}

// Whether the view op `n` copies: its result, over a contiguous input, is not one block.
bool copies(const Graph& g, const Node& n, const Shape& in, const Shape& out) {
  auto v = through(g, n, contiguous_view(in), out);
  return !v || !is_block(*v);
}

// The view ops that made `value`, walked back (last first, at most 16) while their input and output shapes are
// static; `source` gets the value the first of them reads (`value` itself when none made it).
std::vector<std::size_t> view_ops_back(const Graph& g, const Uses& uses, const std::string& value,
                                       std::string* source) {
  std::vector<std::size_t> ops;
  *source = value;
  while (ops.size() < 16) {
    auto p = uses.producer(*source);
    if (!p) break;
    const Node& n = g.nodes[*p];
    if (!is_view_op(g, n) || n.inputs.empty() || n.outputs.size() != 1 || !static_shape(g, n.inputs[0]) ||
        !static_shape(g, n.outputs[0])) {
      break;
    }
    ops.push_back(*p);
    *source = n.inputs[0];
  }
  return ops;
}

// The view ops that made `value`, composed forward from the furthest tensor they read (as `start` of its shape) by
// `step` (the composed value through one op, or nullopt where it cannot go: the chain starts again after that op).
template <typename V>
struct Composed {
  std::string source;
  V value;
  std::vector<std::size_t> nodes;  // the view ops composed, in graph order
  int copies = 0;                  // how many of them copy
};
template <typename V, typename Start, typename Step>
std::optional<Composed<V>> composed_chain(const Graph& g, const Uses& uses, const std::string& value, Start start,
                                          Step step) {
  std::string at;
  const std::vector<std::size_t> ops = view_ops_back(g, uses, value, &at);  // last first
  if (ops.empty()) return std::nullopt;
  Composed<V> chain;
  chain.source = at;
  const Shape source = *static_shape(g, at);
  for (std::int64_t d : source) {
    if (d <= 0) return std::nullopt;  // nothing to read (and no size to divide by: refine)
  }
  chain.value = start(source);
  for (std::size_t i = ops.size(); i-- > 0;) {
    const Node& n = g.nodes[ops[i]];
    const Shape out = *static_shape(g, n.outputs[0]);
    for (std::int64_t d : out) {
      if (d <= 0) return std::nullopt;  // nothing to read
    }
    if (std::optional<V> next = step(n, chain.value, out)) {
      chain.value = std::move(*next);
      chain.nodes.push_back(ops[i]);
      chain.copies += copies(g, n, *static_shape(g, n.inputs[0]), out);
    } else {  // start again after it
      chain.source = n.outputs[0];
      chain.value = start(out);
      chain.nodes.clear();
      chain.copies = 0;
    }
  }
  if (chain.nodes.empty()) return std::nullopt;
  return chain;
}

}  // namespace

// The ops walked back while their input and output shapes are static, then composed forward from the first whose
// input the view can start from (a Reshape that strides cannot express starts the chain after it).
std::optional<ViewChain> internal::view_chain(const Graph& g, const Uses& uses, const std::string& value) {
  auto chain = composed_chain<fused::InputView>(
      g, uses, value, contiguous_view,
      [&](const Node& n, const fused::InputView& v, const Shape& out) { return through(g, n, v, out); });
  if (!chain || is_block(chain->value)) return std::nullopt;
  return ViewChain{chain->source, chain->value, chain->nodes, chain->copies};
}

namespace {


// `r` through the view op `n` (its output `out`), or nullopt where it is not one this composes.
std::optional<Refined> through_refined(const Graph& g, const Node& n, const Refined& r, const Shape& out) {
  if (is_onnx(n, "Transpose")) return transposed(n, r, out);
  if (is_onnx(n, "Slice") || is_onnx(n, "Gather")) {
    auto v = plain(r);
    if (!v) return std::nullopt;
    auto s = is_onnx(n, "Slice") ? sliced(g, n, *v, out) : gathered(g, n, *v, out);
    if (!s) return std::nullopt;
    return refined_of(std::move(*s));
  }
  if (is_onnx(n, "Reshape") || is_onnx(n, "Flatten") || is_onnx(n, "Squeeze") || is_onnx(n, "Unsqueeze")) {
    return refine(r, out);
  }
  return std::nullopt;
}

// The view ops that made `value`, composed over finer axes (Note [Copies through reshapes that strides cannot
// express]).
std::optional<Composed<Refined>> refined_composition(const Graph& g, const Uses& uses, const std::string& value) {
  return composed_chain<Refined>(
      g, uses, value, [](const Shape& shape) { return refined_of(contiguous_view(shape)); },
      [&](const Node& n, const Refined& r, const Shape& out) { return through_refined(g, n, r, out); });
}

// Note [Copies through reshapes that strides cannot express]: the view ops that made `value` over finer axes, where
// they copy.
std::optional<Composed<Refined>> refined_chain(const Graph& g, const Uses& uses, const std::string& value) {
  auto chain = refined_composition(g, uses, value);
  if (!chain || is_block(chain->value.view)) return std::nullopt;
  return chain;
}

// Note [Unary ops move before view chains]
// A 1-D convolution runs channels-last as a 2-D one between an Unsqueeze and a Squeeze (op_decomposition) with the
// layout's Transposes around it, and Whisper's and wav2vec 2.0's stems put a GELU between one such convolution and
// the next: NHWC -> Transpose -> Squeeze -> Gelu -> Unsqueeze -> Transpose -> NHWC, two copies. An elementwise op of
// one input commutes with view ops, so where it reads a chain of them (each value read only by the next op, over as
// many elements as the chain's source) it moves before the chain and reads the source, and the chain writes what the
// op wrote: the op runs over as many elements as before, and the chains on either side of it meet (there their
// composition reads the source in order: a Reshape, Note [View chains that are reshapes]). Not a fused program that
// reduces over rows or rotates halves of the last axis: those depend on the shape they read.
bool unary_elementwise(const Graph& g, const Node& n) {
  static const std::set<std::string> onnx_unary = {
      "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "HardSigmoid",
      "HardSwish", "Softplus", "Elu", "LeakyRelu", "Selu", "Celu", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign"};
  if (n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  // A fused program that reduces over rows or rotates halves of the last axis depends on the shape it reads.
  bool fused = n.op_type == "FusedElementwise" && !n.attrs.has("input_views") && !n.attrs.has("pieces") &&
               n.attrs.get_int("row_axes", 0) == 0;
  if (fused && n.domain == kXpurtDomain) {
    try {
      const fused::Program program = fused::parse(n.attrs.get_string("program", ""), 1);
      fused = !program.reduces() && !program.rotates();
    } catch (const std::exception&) {
      fused = false;
    }
  }
  const bool unary = (n.domain.empty() && onnx_unary.count(n.op_type) != 0) ||
                     (n.domain == kXpurtDomain && (n.op_type == "Gelu" || fused));
  const auto in = value_dtype(g, n.inputs[0]), out = value_dtype(g, n.outputs[0]);
  return unary && in && out && *in == *out;
}

// The view ops that made `value` (read only by node `reader`), last first, each value read only by the next op;
// `source` gets what the first reads and `copying` how many of them copy.
std::vector<std::size_t> private_view_chain(const Graph& g, const Uses& uses, std::string value, std::size_t reader,
                                            std::string* source, int* copying) {
  std::vector<std::size_t> chain;
  *copying = 0;
  while (chain.size() < 16) {
    const auto p = uses.producer(value);
    if (!p || !is_view_op(g, g.nodes[*p]) || !uses.only_reader(value, reader) || uses.is_graph_output(value)) break;
    const Node& v = g.nodes[*p];
    const auto in = static_shape(g, v.inputs[0]), out = static_shape(g, v.outputs[0]);
    if (v.outputs.size() != 1 || !in || !out) break;
    *copying += copies(g, v, *in, *out) ? 1 : 0;
    chain.push_back(*p);
    reader = *p;
    value = v.inputs[0];
  }
  *source = value;
  return chain;
}

int move_unary_before_views(Graph& g, std::vector<std::string>& notes,
                            const std::function<bool(const Node* producer)>& from = {}) {
  const Uses uses(g);
  std::map<std::size_t, std::vector<Node>> before;
  std::set<std::size_t> moved;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& u = g.nodes[i];
    if (!unary_elementwise(g, u)) continue;
    std::string at;
    int copying = 0;
    const std::vector<std::size_t> chain = private_view_chain(g, uses, u.inputs[0], i, &at, &copying);
    const auto source = static_shape(g, at), read = static_shape(g, u.inputs[0]);
    if (copying == 0 || !source || !read || numel_of(*source) != numel_of(*read) || !value_type(g, at)) continue;
    if (from) {
      const auto p = uses.producer(at);
      if (!from(p ? &g.nodes[*p] : nullptr)) continue;
    }
    Node op = u;
    const std::string activated = g.unique_name(at + "_" + u.op_type);
    ValueType type = *value_type(g, at);
    type.dtype = *value_dtype(g, u.outputs[0]);
    g.types[activated] = type;
    op.inputs = {at};
    op.outputs = {activated};
    g.nodes[chain.back()].inputs[0] = activated;
    g.types.erase(u.inputs[0]);
    g.nodes[chain.front()].outputs[0] = u.outputs[0];
    notes.push_back(detail::str_cat(describe(u), " moved before the ", chain.size(), " view op(s) that made its input",
                                    " (it reads ", at, ")"));
    before[chain.back()].push_back(std::move(op));
    moved.insert(i);
  }
  if (!moved.empty()) insert_before(g, std::move(before), moved);
  return static_cast<int>(moved.size());
}

// Note [View chains that are reshapes]
// SegFormer (like PVT and other vision transformers with convolutions between their attention blocks) makes a feature
// map of its tokens [B, H * W, C] with a Transpose(0, 2, 1) and a Reshape to [B, C, H, W], and tokens of a feature
// map with a Reshape and a Transpose back. Where nhwc_layout runs the convolution between them channels-last, it adds a
// Transpose to NHWC before and one back to NCHW after, and each chain's composition is no movement at all: the tokens
// read as [B, H, W, C], the NHWC output read as tokens. A chain of view ops with a copy in it whose composition reads
// every element of its source in the source's own order (a block view at offset 0 over as many elements) is a
// Reshape of the source: the chain's last op becomes that Reshape, and the rest go when nothing else reads them
// (SegFormer's tiny export: 19 Transposes in its CUDA plan, 2 strided copies each way around every convolution).
int collapse_reshape_chains(Graph& g, const Uses& uses, std::vector<std::string>& notes) {
  int collapsed = 0;
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    Node& n = g.nodes[i];
    if (!is_view_op(g, n) || n.outputs.size() != 1 || uses.unused(n.outputs[0])) continue;
    auto chain = refined_composition(g, uses, n.outputs[0]);
    if (!chain || chain->copies < 1 || !is_block(chain->value.view) || chain->value.view.offset != 0) continue;
    const auto in = static_shape(g, chain->source), out = static_shape(g, n.outputs[0]);
    if (!in || !out || numel_of(*in) != numel_of(*out)) continue;
    std::string note = describe(n) + " and the view ops before it (";
    for (std::size_t op : chain->nodes) note += (op == chain->nodes.front() ? "" : ", ") + describe(g.nodes[op]);
    notes.push_back(detail::str_cat(note, ", ", chain->copies, " copies) -> a Reshape of ", chain->source,
                                    " (the same elements in the same order)"));
    n = reshape_node(g, n.name + "_as_reshape", chain->source, *out, n.outputs[0]);
    ++collapsed;
  }
  return collapsed;
}

// Note [Chains of copies become one]
// Where a value that some other op reads is made by a chain of view ops of which two or more copy (GPT-NeoX: a head
// Transpose of its packed projection, a Slice of q, k or v from it, a Slice of the rotary part: three strided copies,
// one after the other), the chain's last op becomes one FusedElementwise copy ("f32 x0", exact in every float dtype)
// reading the chain's source through the composed view: one pass over memory instead of one per op. The chain's
// other ops go when nothing else reads them. Nodes are taken from the last back, so that a long chain collapses
// whole before its prefixes are looked at.
int collapse_copy_chains(Graph& g, const Uses& uses, std::vector<std::string>& notes) {  // NOLINT: see above
  int collapsed = 0;
  std::map<std::size_t, std::vector<Node>> before;  // the copies into finer shapes, before their Reshapes
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    Node& n = g.nodes[i];
    if (!is_view_op(g, n) || n.outputs.size() != 1 || uses.unused(n.outputs[0])) continue;
    auto chain = refined_chain(g, uses, n.outputs[0]);
    auto dtype = value_dtype(g, n.outputs[0]);
    if (!chain || chain->copies < 2 || !dtype || !is_fusable_float(*dtype)) continue;
    std::string note = describe(n) + " and the view ops before it (";
    for (std::size_t op : chain->nodes) note += (op == chain->nodes.front() ? "" : ", ") + describe(g.nodes[op]);
    Node copy;
    copy.name = n.name + "_copy";
    copy.domain = kXpurtDomain;
    copy.op_type = "FusedElementwise";
    copy.inputs = {chain->source};
    copy.outputs = n.outputs;
    copy.attrs.set("program", std::string("f32 x0"));
    copy.attrs.set("output_dtype", std::string(dtype_name(*dtype)));
    fused::set_input_views(&copy.attrs, {chain->value.view});
    note += detail::str_cat(", ", chain->copies, " copies) -> one copy of ", chain->source, " through a strided view");
    if (plain(chain->value)) {
      notes.push_back(note + ", FusedElementwise '" + copy.name + "'");
      n = std::move(copy);
    } else {  // Note [Copies through reshapes that strides cannot express]
      const std::string finer = g.unique_name(n.outputs[0] + "_finer");
      copy.outputs = {finer};
      ValueType type;
      type.dtype = *dtype;
      type.has_shape = true;
      for (std::int64_t d : chain->value.view.shape) type.shape.push_back(Dim(d));
      g.types[finer] = type;
      notes.push_back(detail::str_cat(note, " of shape ", detail::shape_str(chain->value.view.shape, ","),
                                      ", FusedElementwise '", copy.name, "', and a Reshape"));
      Node reshape = reshape_node(g, n.name + "_unfiner", finer, *static_shape(g, n.outputs[0]), n.outputs[0]);
      before[i].push_back(std::move(copy));
      g.nodes[i] = std::move(reshape);
    }
    ++collapsed;
  }
  if (!before.empty()) insert_before(g, std::move(before));
  return collapsed;
}

// Note [Sibling GEMMs of one fused node become one]
// Decoders project one normalized input several times: Llama-style MLPs gate and up (Llama, Mistral, Qwen, Gemma; T5
// v1.1's gated GELU), read by one fused kernel (SwiGLU); Llama-style attention q, k and v, each Reshaped to heads,
// q and k read by their rotary kernels and v by the Attention. Each is a GEMM of N columns where one of the summed
// width does the same work in one launch with wider tiles (at batch 1 each is too small to fill the GPU). Linears of
// one input x with constant weights of one dtype, layout and depth, the same attributes (activation included: it
// applies column by column) and no residual become one Linear over the weights concatenated along N (the biases too,
// zeros where one has none) when every reader of each output takes a view: a FusedElementwise (not yet reading
// views) reads its part through one, directly or through a Reshape that splits the last axis into heads; an
// Attention reads a part that went through such a Reshape as part p of the merged output viewed as [B, S, P, H, D]
// (qkv_parts; only where every part has the same width, so not grouped-query attention's v, which stays a GEMM of
// its own). This is Phi-3's own form (Note [Fused nodes read their inputs' views]). The merged Linear and its packed
// view go where the first Linear was.
struct Part {
  std::size_t linear = 0;
  std::optional<std::size_t> reshape;  // to [B, S, H, D]
  std::int64_t width = 0, start = 0;
  Shape read_shape;  // what the readers read: the Linear's output, or the Reshape's [B, S, H, D]
  std::vector<std::pair<std::size_t, std::size_t>> fused_reads;  // (node, input)
  std::optional<std::pair<std::size_t, std::size_t>> attention;  // (node, slot)
};

bool mergeable_linear(const Graph& g, const Node& l) {
  return constant_linear(g, l) && !(l.inputs.size() > 3 && !l.inputs[3].empty());  // no residual
}

// How `value` (a Linear's output, or its Reshape's) is read, into `part`; false when some reader takes no view.
bool view_readers(const Graph& g, const Uses& uses, const std::string& value, bool heads, Part* part) {
  if (uses.is_graph_output(value) || uses.read_by_subgraph(value) || uses.readers(value).empty()) return false;
  for (std::size_t r : uses.readers(value)) {
    const Node& n = g.nodes[r];
    if (n.domain == kXpurtDomain && n.op_type == "FusedElementwise" && !n.attrs.has("input_views") &&
        !n.attrs.has("pieces")) {
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        if (n.inputs[k] == value) part->fused_reads.emplace_back(r, k);
      }
      continue;
    }
    if (!heads || n.domain != kXpurtDomain || n.op_type != "Attention" || part->attention) return false;
    const std::vector<std::int64_t> bshd = n.attrs.get_ints("bshd", {0, 0, 0, 0});
    const std::vector<std::int64_t> parts = n.attrs.get_ints("qkv_parts", {-1, -1, -1});
    int slot = -1;
    for (std::size_t t = 0; t < 3 && t < n.inputs.size(); ++t) {
      if (n.inputs[t] == value) slot = slot == -1 ? static_cast<int>(t) : -2;
    }
    if (slot < 0 || bshd.size() != 4 || parts.size() != 3 || bshd[static_cast<std::size_t>(slot)] != 1 ||
        parts[static_cast<std::size_t>(slot)] >= 0) {
      return false;
    }
    part->attention = std::make_pair(r, static_cast<std::size_t>(slot));
  }
  return true;
}

// Linear `l`'s output as a part whose readers all take views, or nullopt.
std::optional<Part> view_part(const Graph& g, const Uses& uses, std::size_t l) {
  const std::string& out = g.nodes[l].outputs[0];
  auto shape = static_shape(g, out);
  if (!shape || shape->empty()) return std::nullopt;
  Part part;
  part.linear = l;
  part.width = shape->back();
  part.read_shape = *shape;
  const auto& readers = uses.readers(out);
  if (readers.size() == 1 && is_onnx(g.nodes[readers[0]], "Reshape") && uses.only_reader(out, readers[0])) {
    const Node& reshape = g.nodes[readers[0]];
    auto heads = static_shape(g, reshape.outputs[0]);
    if (!heads || heads->size() != shape->size() + 1 || heads->back() <= 0 ||
        !std::equal(shape->begin(), shape->end() - 1, heads->begin()) ||
        (*heads)[heads->size() - 2] * heads->back() != part.width) {
      return std::nullopt;
    }
    part.reshape = readers[0];
    part.read_shape = *heads;
    if (!view_readers(g, uses, reshape.outputs[0], /*heads=*/true, &part)) return std::nullopt;
    return part;
  }
  if (!view_readers(g, uses, out, /*heads=*/false, &part)) return std::nullopt;
  return part;
}

// The parts of x's Linears that can merge (same weights' dtype, layout, depth and attributes); the Attention-read
// ones only where every part has one width (the packed view). Fewer than two: none.
std::vector<Part> mergeable_parts(const Graph& g, const Uses& uses, const std::vector<std::size_t>& linears) {
  std::vector<Part> parts;
  const Node& first = g.nodes[linears[0]];
  const Tensor& w0 = *constant(g, first.inputs[1]);
  const bool kn = first.attrs.get_string("weight_layout", "nk") == "kn";
  for (std::size_t l : linears) {
    const Node& n = g.nodes[l];
    const Tensor& w = *constant(g, n.inputs[1]);
    const bool same_depth = w.shape()[kn ? 0 : 1] == w0.shape()[kn ? 0 : 1];
    if (n.attrs.str() != first.attrs.str() || w.dtype() != w0.dtype() || !same_depth) continue;
    const Tensor* b = n.inputs.size() > 2 && !n.inputs[2].empty() ? constant(g, n.inputs[2]) : nullptr;
    if (b != nullptr && (b->dtype() != w.dtype() || b->numel() != w.shape()[kn ? 1 : 0])) continue;
    auto part = view_part(g, uses, l);
    if (part && part->width == w.shape()[kn ? 1 : 0]) parts.push_back(std::move(*part));
  }
  bool one_width = true;
  for (const Part& p : parts) one_width = one_width && p.width == parts[0].width;
  if (!one_width) {
    parts.erase(std::remove_if(parts.begin(), parts.end(), [](const Part& p) { return p.attention.has_value(); }),
                parts.end());
  }
  if (parts.size() < 2) parts.clear();
  return parts;
}

// The merged weights (concatenated_weights) and biases (zeros where a part has none; undefined when none has one)
// of `parts`, in order.
std::pair<Tensor, Tensor> concatenated(const Graph& g, const std::vector<Part>& parts, std::int64_t total) {
  std::vector<const Node*> linears;
  for (const Part& p : parts) linears.push_back(&g.nodes[p.linear]);
  const bool kn = linears[0]->attrs.get_string("weight_layout", "nk") == "kn";
  const Tensor w = concatenated_weights(g, linears, std::vector<double>(linears.size(), 1.0), kn);
  const std::size_t item = dtype_size(w.dtype());
  Tensor bias = Tensor::zeros({total}, w.dtype());
  bool any_bias = false;
  for (const Part& p : parts) {
    const Node& n = g.nodes[p.linear];
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const Tensor b = constant(g, n.inputs[2])->contiguous();
      std::memcpy(static_cast<char*>(bias.data_ptr()) + static_cast<std::size_t>(p.start) * item, b.data_ptr(),
                  static_cast<std::size_t>(p.width) * item);
      any_bias = true;
    }
  }
  return {w, any_bias ? bias : Tensor()};
}

int merge_sibling_gemms(Graph& g, std::vector<std::string>& notes) {
  Rewriter rw(g);
  const Uses uses(g);
  std::set<std::string> old_constants;
  std::set<std::size_t> viewing;  // readers given views by a merge (one merge each)
  std::map<std::string, std::vector<std::size_t>> by_x;
  std::vector<std::string> order;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (!mergeable_linear(g, g.nodes[i])) continue;
    auto& group = by_x[g.nodes[i].inputs[0]];
    if (group.empty()) order.push_back(g.nodes[i].inputs[0]);
    group.push_back(i);
  }
  for (const std::string& x : order) {
    const std::vector<std::size_t>& linears = by_x[x];
    if (linears.size() < 2) continue;
    std::vector<Part> parts = mergeable_parts(g, uses, linears);
    if (parts.empty()) continue;
    // No reader shared with another merge. The merged nodes go where the first Linear was (they read only x, which
    // is there, and every reader of a part comes after that part's Linear).
    std::vector<std::size_t> pattern;
    std::set<std::size_t> readers;
    bool shared = false;
    for (const Part& p : parts) {
      pattern.push_back(p.linear);
      if (p.reshape) pattern.push_back(*p.reshape);
      for (const auto& [node, input] : p.fused_reads) readers.insert(node);
      if (p.attention) readers.insert(p.attention->first);
    }
    for (std::size_t r : readers) shared = shared || viewing.count(r) > 0;
    if (shared || rw.any_taken(pattern)) continue;
    std::int64_t total = 0;
    for (Part& p : parts) {
      p.start = total;
      total += p.width;
    }
    const Node& first = g.nodes[parts[0].linear];
    auto [w, bias] = concatenated(g, parts, total);
    Node merged = first;
    merged.name = first.name + "_merged";
    merged.inputs = {x, add_constant(g, first.name + "_merged_weight", w)};
    if (bias.defined()) merged.inputs.push_back(add_constant(g, first.name + "_merged_bias", bias));
    merged.outputs = {g.unique_name(first.outputs[0] + "_merged")};
    std::vector<Node> replacement = {merged};
    std::string packed;  // the merged output as [B, S, P, H, D], for the Attention-read parts
    std::map<std::size_t, fused::InputViews> new_views;  // per fused reader (no views before: view_readers)
    std::string note = "merged";
    for (const Part& p : parts) {
      const Node& l = g.nodes[p.linear];
      note += (p.start ? " + " : " ") + describe(l);
      old_constants.insert(l.inputs[1]);
      if (l.inputs.size() > 2 && !l.inputs[2].empty()) old_constants.insert(l.inputs[2]);
      for (const auto& [node, input] : p.fused_reads) {
        Node& reader = g.nodes[node];
        fused::InputViews& views = new_views[node];
        views.resize(reader.inputs.size());
        fused::InputView v = contiguous_view(p.read_shape);  // a row of `total` from column p.start
        v.offset = p.start;
        const std::size_t outer = p.read_shape.size() - (p.reshape ? 2 : 1);
        for (std::size_t d = 0; d < outer; ++d) v.strides[d] = v.strides[d] / p.width * total;
        views[input] = v;
        reader.inputs[input] = merged.outputs[0];
        viewing.insert(node);
      }
      if (p.attention) {
        Node& attention = g.nodes[p.attention->first];
        const std::size_t slot = p.attention->second;
        if (packed.empty()) {
          Shape shape(p.read_shape.begin(), p.read_shape.end() - 2);  // [B, S]
          shape.push_back(total / p.width);
          shape.push_back(p.read_shape[p.read_shape.size() - 2]);
          shape.push_back(p.read_shape.back());
          packed = g.unique_name(merged.outputs[0] + "_packed");
          replacement.push_back(reshape_node(g, merged.name + "_packed", merged.outputs[0], shape, packed));
        }
        std::vector<std::int64_t> bshd = attention.attrs.get_ints("bshd", {0, 0, 0, 0});
        std::vector<std::int64_t> qkv = attention.attrs.get_ints("qkv_parts", {-1, -1, -1});
        bshd[slot] = 0;
        qkv[slot] = p.start / p.width;
        attention.attrs.set("bshd", bshd);
        attention.attrs.set("qkv_parts", qkv);
        attention.inputs[slot] = packed;
        viewing.insert(p.attention->first);
      }
    }
    for (const auto& [node, views] : new_views) fused::set_input_views(&g.nodes[node].attrs, views);
    notes.push_back(detail::str_cat(note, " -> Linear '", merged.name, "' (", total, " columns), read through views"));
    std::sort(pattern.begin(), pattern.end());
    rw.replace({pattern.front()}, std::move(replacement), notes.back());  // the first Linear (the lowest index)
    rw.replace(std::vector<std::size_t>(pattern.begin() + 1, pattern.end()), {}, "  (merged into " + merged.name + ")");
  }
  PassResult applied;
  const int merged = rw.apply(applied);
  remove_unused_constants(g, old_constants);
  return merged;
}

// Note [Attention reads packed heads in place]
// An Attention input made by view ops out of a projection (or by the one copy a chain of them became, Note [Chains of
// copies become one]) whose [B, H, S, D] view is a part of a packed layout, [B, S, P, H, D] (P projections side by
// side) or [B, S, H, P, D] (each head's q, k and v side by side: GPT-NeoX's and BLOOM's query_key_value Linear), is
// read by the Attention itself as that part (`qkv_parts`, `qkv_packing`, Note [Attention layouts] in
// core/attention_layout.h) through a Reshape of the projection, which is a view: GPT-NeoX's v, whose head transpose and
// slice were a copy kernel per layer. P = 1 is a plain [B, S, H, D] tensor (`bshd`). The node's other packed inputs
// fix the packing; a view that fits neither stays as it is. An input already read as [B, S, H, D] (`bshd`: its head
// transpose folded into the attention) is looked at as its [B, H, S, D] view the same way (BLOOM's q, k and v: a
// Gather of one index out of [B, S, H, 3, D], Note [A Gather of one index is a view]).
std::optional<std::pair<std::string, fused::InputView>> source_view(const Graph& g, const Uses& uses,
                                                                    const std::string& value) {
  if (auto chain = view_chain(g, uses, value)) return std::make_pair(chain->source, chain->view);
  auto p = uses.producer(value);
  if (!p) return std::nullopt;
  const Node& f = g.nodes[*p];
  if (f.domain != kXpurtDomain || f.op_type != "FusedElementwise" || f.inputs.size() != 1 ||
      f.attrs.get_string("program", "") != "f32 x0" || value_dtype(g, f.inputs[0]) != value_dtype(g, value)) {
    return std::nullopt;
  }
  const auto stored = static_shape(g, f.inputs[0]);
  if (!stored) return std::nullopt;
  const fused::InputViews views = fused::input_views(f.attrs, {*stored});
  if (views.empty() || !views[0]) return std::nullopt;
  return std::make_pair(f.inputs[0], *views[0]);
}

// The part of a packed layout that `v` ([B, H, S, D] over a tensor of `total` elements) reads: {packing, P, p}, or
// nullopt. `packing` is the one the node's other inputs fixed ("" when none has).
struct PackedPart {
  std::string packing;
  std::int64_t parts = 0, part = 0;
};
std::optional<PackedPart> packed_part_of(const fused::InputView& v, std::int64_t total, const std::string& packing) {
  if (v.shape.size() != 4) return std::nullopt;
  const std::int64_t b = v.shape[0], h = v.shape[1], s = v.shape[2], d = v.shape[3];
  if (b <= 0 || h <= 0 || s <= 0 || d <= 0 || total % (b * s) != 0) return std::nullopt;
  const std::int64_t row = total / (b * s);  // a token's elements: P * H * D
  if ((d > 1 && v.strides[3] != 1) || (s > 1 && v.strides[2] != row) || (b > 1 && v.strides[0] != s * row) ||
      row % (h * d) != 0) {
    return std::nullopt;
  }
  const std::int64_t parts = row / (h * d);
  for (const char* order : {"parts_heads", "heads_parts"}) {
    if (!packing.empty() && packing != order) continue;
    const bool heads_outer = std::string(order) == "heads_parts";
    const std::int64_t head_stride = heads_outer ? parts * d : d, part_stride = heads_outer ? d : h * d;
    if ((h > 1 && v.strides[1] != head_stride) || v.offset % part_stride != 0 || v.offset / part_stride >= parts) {
      continue;
    }
    return PackedPart{order, parts, v.offset / part_stride};
  }
  return std::nullopt;
}

int attention_reads_packed_heads(Graph& g, std::vector<std::string>& notes) {
  const Uses uses(g);
  std::map<std::size_t, std::vector<Node>> before;  // node index -> Reshapes to insert before it
  int folded = 0;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (n.domain != kXpurtDomain || n.op_type != "Attention" || n.inputs.size() < 3) continue;
    std::vector<std::int64_t> bshd = n.attrs.get_ints("bshd", {0, 0, 0, 0});
    std::vector<std::int64_t> parts = n.attrs.get_ints("qkv_parts", {-1, -1, -1});
    if (bshd.size() != 4 || parts.size() != 3) continue;
    std::string packing;
    if (std::any_of(parts.begin(), parts.end(), [](std::int64_t p) { return p >= 0; })) {
      packing = n.attrs.get_string("qkv_packing", "parts_heads");
    }
    std::string note;
    for (std::size_t t = 0; t < 3; ++t) {
      if (parts[t] >= 0) continue;
      auto source = source_view(g, uses, n.inputs[t]);
      const auto stored = source ? static_shape(g, source->first) : std::nullopt;
      if (!stored || source->second.shape.size() != 4) continue;
      std::int64_t total = 1;
      for (std::int64_t d : *stored) total *= d;
      fused::InputView v = source->second;
      if (bshd[t] != 0) {  // a [B, S, H, D] input (its head transpose folded): its view as [B, H, S, D]
        std::swap(v.shape[1], v.shape[2]);
        std::swap(v.strides[1], v.strides[2]);
      }
      auto part = packed_part_of(v, total, packing);
      if (!part) continue;
      Shape shape = {v.shape[0], v.shape[2], v.shape[1], v.shape[3]};  // [B, S, H, D], P = 1
      if (part->parts > 1) {
        shape.insert(shape.begin() + (part->packing == "heads_parts" ? 3 : 2), part->parts);
        parts[t] = part->part;
        packing = part->packing;
        bshd[t] = 0;  // a packed input's flag is 0 (Note [Attention layouts])
      } else {
        bshd[t] = 1;
      }
      const std::string to = g.unique_name(source->first + "_heads");
      before[i].push_back(reshape_node(g, n.name + "_" + AttentionLayout::name(t) + "_heads", source->first, shape,
                                       to));
      note += detail::str_cat(note.empty() ? "" : ", ", AttentionLayout::name(t), " = ",
                              part->parts > 1 ? detail::str_cat("part ", part->part, " of ") : std::string(),
                              source->first, " as ", detail::shape_str(shape, ","));
      n.inputs[t] = to;
    }
    if (note.empty()) continue;
    n.attrs.set("bshd", bshd);
    n.attrs.set("qkv_parts", parts);
    if (!packing.empty()) n.attrs.set("qkv_packing", packing);
    notes.push_back(describe(n) + " reads " + note + " in place");
    ++folded;
  }
  if (folded > 0) insert_before(g, std::move(before));
  return folded;
}

}  // namespace

int internal::move_activations_before_views(Graph& g, std::vector<std::string>& notes,
                                            const std::function<bool(const Node* producer)>& from) {
  return move_unary_before_views(g, notes, from);
}

PassResult fused_input_views(Graph& g, const PassContext& ctx) {
  PassResult result{"fused_input_views", 0, {}};
  if (!ctx.fuse_elementwise) return result;
  // A policy rule for slice or transpose keeps those nodes as the user chose.
  if (ctx.keep_unfused && (ctx.keep_unfused("slice") || ctx.keep_unfused("transpose"))) return result;
  result.rewrites += merge_sibling_gemms(g, result.notes);  // Note [Sibling GEMMs of one fused node become one]
  const Uses uses(g);
  for (Node& n : g.nodes) {
    if (n.domain != kXpurtDomain || n.op_type != "FusedElementwise" || n.attrs.has("input_views") ||
        n.attrs.has("pieces")) {
      continue;
    }
    fused::InputViews views(n.inputs.size());
    std::string note;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      auto chain = view_chain(g, uses, n.inputs[k]);
      if (!chain) continue;
      note += detail::str_cat(note.empty() ? "" : ", ", "x", k, " = ", chain->source, " through");
      for (std::size_t op : chain->nodes) note += " " + describe(g.nodes[op]);
      n.inputs[k] = chain->source;
      views[k] = std::move(chain->view);
    }
    if (note.empty()) continue;
    fused::set_input_views(&n.attrs, views);
    result.notes.push_back(describe(n) + " reads " + note + " as strided views");
    ++result.rewrites;
  }
  // The view ops read by nothing now go; then the chains other ops still read collapse (Note [Chains of copies
  // become one]), and what that leaves unread goes too.
  auto drop_dead = [&] {
    PassResult dead = dead_node_elimination(g, ctx);
    result.notes.insert(result.notes.end(), dead.notes.begin(), dead.notes.end());
  };
  if (result.rewrites > 0) drop_dead();
  const int attention = attention_reads_packed_heads(g, result.notes);  // Note [Attention reads packed heads ...]
  if (attention > 0) drop_dead();
  result.rewrites += attention;
  result.rewrites += move_unary_before_views(g, result.notes);  // Note [Unary ops move before view chains]
  const int reshapes = collapse_reshape_chains(g, Uses(g), result.notes);  // Note [View chains that are reshapes]
  if (reshapes > 0) drop_dead();
  result.rewrites += reshapes;
  const int collapsed = collapse_copy_chains(g, Uses(g), result.notes);
  if (collapsed > 0) drop_dead();
  result.rewrites += collapsed;
  return result;
}

}  // namespace xpuruntime::passes
