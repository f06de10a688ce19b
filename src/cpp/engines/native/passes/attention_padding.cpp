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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engines/native/passes/pass_utils.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/dtype.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

using Shape = std::vector<std::int64_t>;

// `w` [R, G * d] -> [R, G * padded] (zero columns after each of the G groups of d), as raw elements.
Tensor pad_columns(const Tensor& w, std::int64_t rows, std::int64_t groups, std::int64_t d, std::int64_t padded) {
  const Tensor src = w.contiguous();
  Tensor out = Tensor::empty(rows == 1 && src.dim() == 1 ? Shape{groups * padded} : Shape{rows, groups * padded},
                             src.dtype(), Device::cpu());
  out.zero_();
  const std::size_t e = dtype_size(src.dtype());
  const auto* from = static_cast<const unsigned char*>(src.data_ptr());
  auto* to = static_cast<unsigned char*>(out.data_ptr());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      std::memcpy(to + static_cast<std::size_t>((r * groups + g) * padded) * e,
                  from + static_cast<std::size_t>((r * groups + g) * d) * e, static_cast<std::size_t>(d) * e);
    }
  }
  return out;
}

// `w` [G * d, C] -> [G * padded, C] (zero rows after each of the G groups of d rows).
Tensor pad_rows(const Tensor& w, std::int64_t groups, std::int64_t d, std::int64_t padded) {
  const Tensor src = w.contiguous();
  const std::int64_t columns = src.shape()[1];
  Tensor out = Tensor::empty({groups * padded, columns}, src.dtype(), Device::cpu());
  out.zero_();
  const std::size_t row = static_cast<std::size_t>(columns) * dtype_size(src.dtype());
  const auto* from = static_cast<const unsigned char*>(src.data_ptr());
  auto* to = static_cast<unsigned char*>(out.data_ptr());
  for (std::int64_t g = 0; g < groups; ++g) {
    std::memcpy(to + static_cast<std::size_t>(g * padded) * row, from + static_cast<std::size_t>(g * d) * row,
                static_cast<std::size_t>(d) * row);
  }
  return out;
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
    const Tensor& w = *constant(g, projection.inputs[1]);
    projection.inputs[1] = add_constant(g, projection.inputs[1] + "_padded",
                                        p->projection_kn ? pad_columns(w, w.shape()[0], 3 * h, d, padded)
                                           : pad_rows(w, 3 * h, d, padded));
    if (projection.inputs.size() > 2 && !projection.inputs[2].empty()) {
      projection.inputs[2] =
          add_constant(g, projection.inputs[2] + "_padded", pad_columns(*constant(g, projection.inputs[2]), 1, 3 * h,
                                                                        d, padded));
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
    const Tensor& wo = *constant(g, output.inputs[1]);
    output.inputs[1] = add_constant(g, output.inputs[1] + "_padded",
                                    p->output_kn ? pad_rows(wo, h, d, padded)
                                                 : pad_columns(wo, wo.shape()[0], h, d, padded));
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

}  // namespace xpuruntime::passes
