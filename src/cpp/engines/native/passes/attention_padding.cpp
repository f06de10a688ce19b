// attention_head_padding: an Attention whose head dim no fused kernel takes reads heads padded with zeros, the padding
// made by the projections' own weights.
//
// Note [Head dims padded in the weights]
// The fused attention kernels take head dims that are multiples of 8 (cuDNN's; flash_v2's 32, 64 and 128), and an
// Attention of another head dim runs unfused: its scores written to memory, a softmax kernel, two batched GEMMs.
// MobileViT-S's transformers have 4 heads of 36 and of 60 (its 144 and 240 wide stages): on an H200 two such
// attentions took 138 us of a 1.9 ms run at batch 16, where torch.compile pads the heads to run its flash kernel.
// Zeros added to every q and k head change no score (q . k sums over the head), and zeros added to v only add zero
// columns to the output. So where q, k and v are parts of one packed projection (qkv_fusion's Linear, viewed as
// [B, S, 3, H, D]) read by nothing but the Attention, and the Attention's [B, S, H, D] output is read only through a
// Reshape to [B, S, H * D] by a Linear, both with constant weights, the projection's weights (and bias) get zero
// columns after each head's D, the output projection's weights zero rows where the padded output has its zeros, and
// the Attention runs on heads of D' = D rounded up to a multiple of 8, its scale kept at 1 / sqrt(D): no copy, and
// D' / D more work in the two GEMMs (11% for MobileViT's 36, 7% for 60). CUDA plans only (the cpu kernel takes
// every head dim).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engines/native/passes/pass_utils.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/dtype.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

using Shape = std::vector<std::int64_t>;

// `t` with its features (the columns of a "kn" weight or a bias, the rows of an "nk" weight: `rows`) taken from
// `source` (-1: zero), as raw elements.
Tensor gather_features(const Tensor& t, bool rows, const std::vector<std::int64_t>& source) {
  const Tensor src = t.contiguous();
  const std::size_t e = dtype_size(src.dtype());
  const std::int64_t n = static_cast<std::int64_t>(source.size());
  const std::int64_t other = src.dim() == 2 ? (rows ? src.shape()[1] : src.shape()[0]) : 1;
  const std::int64_t features = src.dim() == 2 ? (rows ? src.shape()[0] : src.shape()[1]) : src.numel();
  const Shape shape = src.dim() == 1 ? Shape{n} : rows ? Shape{n, other} : Shape{other, n};
  Tensor out = Tensor::empty(shape, src.dtype(), Device::cpu());
  out.zero_();
  const auto* from = static_cast<const unsigned char*>(src.data_ptr());
  auto* to = static_cast<unsigned char*>(out.data_ptr());
  for (std::int64_t c = 0; c < n; ++c) {
    const std::int64_t f = source[static_cast<std::size_t>(c)];
    if (f < 0) continue;
    if (rows) {  // a whole row of `other` elements
      std::memcpy(to + static_cast<std::size_t>(c * other) * e, from + static_cast<std::size_t>(f * other) * e,
                  static_cast<std::size_t>(other) * e);
      continue;
    }
    for (std::int64_t o = 0; o < other; ++o) {
      std::memcpy(to + static_cast<std::size_t>(o * n + c) * e, from + static_cast<std::size_t>(o * features + f) * e,
                  e);
    }
  }
  return out;
}

// For gather_features: G groups of d features, each followed by padded - d zeros.
std::vector<std::int64_t> padded_groups(std::int64_t groups, std::int64_t d, std::int64_t padded) {
  std::vector<std::int64_t> source(static_cast<std::size_t>(groups * padded), -1);
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t j = 0; j < d; ++j) source[static_cast<std::size_t>(g * padded + j)] = g * d + j;
  }
  return source;
}

// constant_linear with a weight of a layout this pass pads ("kn" or "nk").
bool paddable_linear(const Graph& g, const Node& l) {
  const std::string layout = l.attrs.get_string("weight_layout", "nk");
  return constant_linear(g, l) && (layout == "kn" || layout == "nk");
}

// The pattern around Attention `a` (Note [Head dims padded in the weights]).
struct Padded {
  std::size_t projection = 0, packed = 0, merge = 0, output = 0;  // Linear, Reshape, Reshape, Linear
  std::int64_t heads = 0, d = 0;
  bool projection_kn = false, output_kn = false;  // the Linears' weight layouts: "kn" or "nk"
};

std::optional<Padded> match(const Graph& g, const Uses& uses, std::size_t a_index) {
  const Node& a = g.nodes[a_index];
  if (a.domain != kXpurtDomain || a.op_type != "Attention" || a.inputs.size() < 3 || a.outputs.size() != 1 ||
      a.inputs[0] != a.inputs[1] || a.inputs[1] != a.inputs[2] || a.attrs.get_int("return_lse", 0) != 0 ||
      a.attrs.get_ints("qkv_parts", {}) != std::vector<std::int64_t>{0, 1, 2} ||
      a.attrs.get_string("qkv_packing", "parts_heads") != "parts_heads" ||
      a.attrs.get_ints("bshd", {0, 0, 0, 0}) != std::vector<std::int64_t>{0, 0, 0, 1}) {
    return std::nullopt;
  }
  Padded p;
  const std::string& packed = a.inputs[0];
  const auto five = static_shape(g, packed);
  auto reshape = uses.producer(packed);
  if (!five || five->size() != 5 || (*five)[2] != 3 || !reshape || !is_onnx(g.nodes[*reshape], "Reshape")) {
    return std::nullopt;
  }
  p.packed = *reshape;
  p.heads = (*five)[3];
  p.d = (*five)[4];
  if (p.d % 8 == 0 || p.d > 248) return std::nullopt;
  if (!uses.only_reader(packed, a_index)) return std::nullopt;
  const std::string& projected = g.nodes[p.packed].inputs[0];
  auto projection = uses.producer(projected);
  if (!projection || !uses.only_reader(projected, p.packed) || !paddable_linear(g, g.nodes[*projection]) ||
      g.nodes[*projection].inputs.size() > 3) {
    return std::nullopt;
  }
  p.projection = *projection;
  // The projection writes [.., 3 * H * d] from a [K, 3 * H * d] ("kn") or [3 * H * d, K] weight and a bias of as many.
  const Node& l = g.nodes[p.projection];
  const std::int64_t width = 3 * p.heads * p.d;
  const Shape w = constant(g, l.inputs[1])->shape();
  p.projection_kn = l.attrs.get_string("weight_layout", "nk") == "kn";
  const auto projected_shape = static_shape(g, projected);
  if ((p.projection_kn ? w[1] : w[0]) != width || !projected_shape || projected_shape->back() != width ||
      (l.inputs.size() > 2 && !l.inputs[2].empty() && constant(g, l.inputs[2])->numel() != width)) {
    return std::nullopt;
  }
  const std::string& out = a.outputs[0];
  const auto out_shape = static_shape(g, out);
  if (!out_shape || out_shape->size() != 4 || out_shape->back() != p.d) return std::nullopt;
  const auto& readers = uses.readers(out);
  if (readers.size() != 1 || !uses.only_reader(out, readers[0]) || !is_onnx(g.nodes[readers[0]], "Reshape")) {
    return std::nullopt;
  }
  p.merge = readers[0];
  const std::string& merged = g.nodes[p.merge].outputs[0];
  const auto merged_shape = static_shape(g, merged);
  const auto& merged_readers = uses.readers(merged);
  if (!merged_shape || merged_shape->size() != 3 || merged_shape->back() != p.heads * p.d ||
      merged_readers.size() != 1 || !uses.only_reader(merged, merged_readers[0])) {
    return std::nullopt;
  }
  const Node& o = g.nodes[merged_readers[0]];
  if (!paddable_linear(g, o) || o.inputs[0] != merged) return std::nullopt;
  const Shape wo = constant(g, o.inputs[1])->shape();
  p.output_kn = o.attrs.get_string("weight_layout", "nk") == "kn";
  if ((p.output_kn ? wo[0] : wo[1]) != p.heads * p.d) return std::nullopt;
  p.output = merged_readers[0];
  return p;
}

// `value`'s static shape with its last dim replaced by `last`, as its type.
void set_last_dim(Graph& g, const std::string& value, std::int64_t last) {
  ValueType type = *value_type(g, value);
  type.shape.back() = Dim(last);
  g.types[value] = type;
}

}  // namespace

PassResult attention_head_padding(Graph& g, const PassContext& ctx) {  // Note [Head dims padded in the weights]
  PassResult result{"attention_head_padding", 0, {}};
  if (!ctx.device.is_cuda()) return result;
  const Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto p = match(g, uses, i);
    if (!p) continue;
    const std::int64_t d = p->d, padded = (d + 7) / 8 * 8, h = p->heads;
    // The projection: [K, 3 * H * d] ("kn") or [3 * H * d, K] ("nk") and its bias -> 3 * H * padded.
    Node& projection = g.nodes[p->projection];
    const std::vector<std::int64_t> qkv = padded_groups(3 * h, d, padded);
    projection.inputs[1] = add_constant(g, projection.inputs[1] + "_padded",
                                        gather_features(*constant(g, projection.inputs[1]), !p->projection_kn, qkv));
    if (projection.inputs.size() > 2 && !projection.inputs[2].empty()) {
      projection.inputs[2] = add_constant(g, projection.inputs[2] + "_padded",
                                          gather_features(*constant(g, projection.inputs[2]), false, qkv));
    }
    set_last_dim(g, projection.outputs[0], 3 * h * padded);
    // The packed view [B, S, 3, H, padded], the Attention (its scale kept at 1 / sqrt(d)), the merge to H * padded.
    Node& packed = g.nodes[p->packed];
    Shape five = *static_shape(g, packed.outputs[0]);
    five.back() = padded;
    packed.inputs[1] = add_constant(g, packed.name + "_padded_shape", int64_tensor(five));
    set_last_dim(g, packed.outputs[0], padded);
    Node& a = g.nodes[i];
    if (a.attrs.get_float("scale", 0.0) == 0.0) a.attrs.set("scale", 1.0 / std::sqrt(static_cast<double>(d)));
    set_last_dim(g, a.outputs[0], padded);
    Node& merge = g.nodes[p->merge];
    Shape three = *static_shape(g, merge.outputs[0]);
    three.back() = h * padded;
    merge.inputs[1] = add_constant(g, merge.name + "_padded_shape", int64_tensor(three));
    set_last_dim(g, merge.outputs[0], h * padded);
    // The output projection reads zeros where the padded heads have them: zero rows ("kn") or columns ("nk").
    Node& output = g.nodes[p->output];
    output.inputs[1] = add_constant(g, output.inputs[1] + "_padded",
                                    gather_features(*constant(g, output.inputs[1]), p->output_kn,
                                                    padded_groups(h, d, padded)));
    result.notes.push_back(detail::str_cat(describe(a), ": heads of ", d, " padded to ", padded, " in the weights of ",
                                           describe(projection), " and ", describe(output)));
    ++result.rewrites;
  }
  if (result.rewrites > 0) {  // the unpadded weights and shapes nothing reads now
    PassResult dead = dead_node_elimination(g, ctx);
    result.notes.insert(result.notes.end(), dead.notes.begin(), dead.notes.end());
  }
  return result;
}

// Note [Unequal q, k and v parts padded in the weights]
// LeViT projects each head's q, k and v with one Linear as [q (dk), k (dk), v (dv)], keys narrower than values (16
// and 32 in LeViT-128S: attention ratio 2), and attention_fusion reads the three as parts of the projection viewed per
// head (qkv_packing "heads_parts": q part 0 and k part 1 of [B, S, H, P, dk], v part 1 of [B, S, H, P', dv]). No
// fused kernel takes keys narrower than values (cuDNN's and flash_v2 need D = Dv), so the attentions ran unfused:
// their scores in memory, a softmax kernel and two batched GEMMs, 33-38% of LeViT's run at 0-5% of their floor
// (H100, 2026-12-07).
// Zeros added to each q and k head change no score, so where the projection is a constant Linear reached through
// Reshapes that keep its features last, read by nothing but the three views, and dv is a multiple of 8 wider than dk,
// the projection's weights and bias are laid out per head as [q, zeros, k, zeros, v] with q and k padded to dv, and
// the Attention reads one view [B, S, H, 3, dv] with parts 0, 1 and 2 (its scale kept at 1 / sqrt(dk)): the heads
// the fused kernels take, (3 dv) / (2 dk + dv) of the projection's GEMM (1.5x for LeViT's 16 and 32), no copy. Runs
// after fused_input_views, which makes the per-head part views, and linear_epilogue_fusion, which puts LinearNorm's
// batch norm into the Linear (Note [Feature maps through a Reshape]). CUDA plans only.

namespace {

// Where the q, k and v parts of a per-head packed projection are (Note [Unequal q, k and v parts padded in the
// weights]).
struct Parts {
  std::size_t linear = 0;
  std::vector<std::size_t> chain;  // the Reshapes from the Linear's output to the viewed value, in order
  std::string viewed;               // what the three views read
  std::int64_t heads = 0, width = 0, dk = 0, dv = 0;  // width: one head's q, k and v elements (2 dk + dv)
  std::array<std::int64_t, 3> offset{};               // of q, k and v in a head
  bool kn = false;
};

// The Reshape that alone makes view `value` of `viewed` as [B, S, H, P, D], and its shape.
std::optional<Shape> part_view(const Graph& g, const Uses& uses, const std::string& value, std::string* viewed) {
  const auto r = uses.producer(value);
  const auto shape = static_shape(g, value);
  if (!r || !is_onnx(g.nodes[*r], "Reshape") || !shape || shape->size() != 5) return std::nullopt;
  *viewed = g.nodes[*r].inputs[0];
  return shape;
}

std::optional<Parts> match_parts(const Graph& g, const Uses& uses, std::size_t ai) {
  const Node& a = g.nodes[ai];
  const auto parts = a.attrs.get_ints("qkv_parts", {});
  const auto bshd = a.attrs.get_ints("bshd", {0, 0, 0, 0});
  if (a.domain != kXpurtDomain || a.op_type != "Attention" || a.inputs.size() < 3 || a.outputs.size() != 1 ||
      a.attrs.get_int("return_lse", 0) != 0 || a.attrs.get_string("qkv_packing", "parts_heads") != "heads_parts" ||
      parts.size() != 3 || bshd.size() != 4 || bshd[0] != 0 || bshd[1] != 0 || bshd[2] != 0) {
    return std::nullopt;
  }
  Parts p;
  std::array<Shape, 3> views;
  std::set<std::string> view_values;
  for (std::size_t i = 0; i < 3; ++i) {
    std::string viewed;
    const auto shape = part_view(g, uses, a.inputs[i], &viewed);
    if (!shape || parts[i] < 0 || (i > 0 && viewed != p.viewed) || !uses.only_reader(a.inputs[i], ai)) {
      return std::nullopt;
    }
    p.viewed = viewed;
    views[i] = *shape;
    view_values.insert(a.inputs[i]);
  }
  p.heads = views[0][2];
  p.dk = views[0][4];
  p.dv = views[2][4];
  p.width = views[0][3] * p.dk;
  for (std::size_t i = 0; i < 3; ++i) {
    if (views[i][2] != p.heads || views[i][3] * views[i][4] != p.width || views[i][0] != views[0][0] ||
        views[i][1] != views[0][1]) {
      return std::nullopt;
    }
    p.offset[i] = parts[i] * views[i][4];
  }
  if (views[1][4] != p.dk || p.dv % 8 != 0 || p.dk >= p.dv || p.width != 2 * p.dk + p.dv) return std::nullopt;
  // q, k and v are three disjoint runs of a head.
  if (p.offset[0] == p.offset[1] || p.offset[2] + p.dv > p.width) return std::nullopt;
  // Only the views read the viewed value; back from it through Reshapes that keep H * width last, to the Linear.
  if (uses.is_graph_output(p.viewed) || uses.read_by_subgraph(p.viewed)) return std::nullopt;
  for (const std::size_t r : uses.readers(p.viewed)) {
    if (view_values.count(g.nodes[r].outputs[0]) == 0) return std::nullopt;
  }
  const std::int64_t features = p.heads * p.width;
  std::string value = p.viewed;
  for (int steps = 0; steps < 4; ++steps) {
    const auto shape = static_shape(g, value);
    const auto producer = uses.producer(value);
    if (!shape || shape->empty() || shape->back() != features || !producer) return std::nullopt;
    const Node& n = g.nodes[*producer];
    if (n.domain == kXpurtDomain && n.op_type == "Linear") {
      const std::string act = n.attrs.get_string("activation", "none");
      if (!paddable_linear(g, n) || n.inputs.size() > 3 || (act != "none" && act != "relu" && act != "gelu")) {
        return std::nullopt;  // zero columns stay zero through these activations only
      }
      const Shape w = constant(g, n.inputs[1])->shape();
      p.kn = n.attrs.get_string("weight_layout", "nk") == "kn";
      if ((p.kn ? w[1] : w[0]) != features || (n.has_input(2) && constant(g, n.inputs[2])->numel() != features)) {
        return std::nullopt;
      }
      p.linear = *producer;
      std::reverse(p.chain.begin(), p.chain.end());
      return p;
    }
    if (!is_onnx(n, "Reshape") || uses.is_graph_output(n.inputs[0]) || uses.read_by_subgraph(n.inputs[0]) ||
        uses.readers(n.inputs[0]).size() != 1) {
      return std::nullopt;
    }
    p.chain.push_back(*producer);
    value = n.inputs[0];
  }
  return std::nullopt;
}

}  // namespace

PassResult attention_part_padding(Graph& g, const PassContext& ctx) {
  // Note [Unequal q, k and v parts padded in the weights]
  PassResult result{"attention_part_padding", 0, {}};
  if (!ctx.device.is_cuda()) return result;
  const Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto p = match_parts(g, uses, i);
    if (!p) continue;
    const std::int64_t h = p->heads, dv = p->dv, packed = 3 * dv;
    std::vector<std::int64_t> source(static_cast<std::size_t>(h * packed), -1);
    const std::array<std::int64_t, 3> lengths = {p->dk, p->dk, dv};
    for (std::int64_t head = 0; head < h; ++head) {
      for (std::size_t part = 0; part < 3; ++part) {
        for (std::int64_t j = 0; j < lengths[part]; ++j) {
          source[static_cast<std::size_t>(head * packed + static_cast<std::int64_t>(part) * dv + j)] =
              head * p->width + p->offset[part] + j;
        }
      }
    }
    Node& linear = g.nodes[p->linear];
    linear.inputs[1] = add_constant(g, linear.inputs[1] + "_parts_padded",
                                    gather_features(*constant(g, linear.inputs[1]), !p->kn, source));
    if (linear.has_input(2)) {
      linear.inputs[2] = add_constant(g, linear.inputs[2] + "_parts_padded",
                                      gather_features(*constant(g, linear.inputs[2]), false, source));
    }
    set_last_dim(g, linear.outputs[0], h * packed);
    for (const std::size_t r : p->chain) {
      Node& reshape = g.nodes[r];
      Shape shape = *static_shape(g, reshape.outputs[0]);
      shape.back() = h * packed;
      reshape.inputs[1] = add_constant(g, reshape.name + "_parts_padded_shape", int64_tensor(shape));
      set_last_dim(g, reshape.outputs[0], h * packed);
    }
    // One view [B, S, H, 3, dv] for the three, made by the q view's Reshape; the k and v views go unread.
    Node& a = g.nodes[i];
    Node& view = g.nodes[*uses.producer(a.inputs[0])];
    Shape five = *static_shape(g, a.inputs[0]);
    five[3] = 3;
    five[4] = dv;
    view.inputs[1] = add_constant(g, view.name + "_parts_padded_shape", int64_tensor(five));
    g.types[view.outputs[0]].shape = std::vector<Dim>(five.begin(), five.end());
    if (a.attrs.get_float("scale", 0.0) == 0.0) a.attrs.set("scale", 1.0 / std::sqrt(static_cast<double>(p->dk)));
    a.inputs[1] = a.inputs[2] = a.inputs[0];
    a.attrs.set("qkv_parts", std::vector<std::int64_t>{0, 1, 2});
    result.notes.push_back(detail::str_cat(describe(a), ": q and k heads of ", p->dk, " padded to v's ", dv,
                                           " in the weights of ", describe(linear)));
    ++result.rewrites;
  }
  if (result.rewrites > 0) {  // the old views and weights nothing reads now
    PassResult dead = dead_node_elimination(g, ctx);
    result.notes.insert(result.notes.end(), dead.notes.begin(), dead.notes.end());
  }
  return result;
}

}  // namespace xpuruntime::passes
