// patch_embedding_gemm: a vision transformer's patch embedding, Conv with a kernel as large as its stride (at least
// 8 x 8), as one Linear over the image's patches (Note [Patch embedding as a GEMM]).
//
// Note [Patch embedding as a GEMM]
// ViT, DeiT, BEiT, CLIP and timm's PatchEmbed cut the image into non-overlapping p x q patches with
// Conv(X [N, C, H, W], W [O, C, p, q], strides [p, q], no padding). Every output is one patch's C * p * q pixels
// times a row of W: a GEMM [N * L, C * p * q] x [C * p * q, O] with L = (H / p) * (W / q) patches. cuDNN runs it as
// a general convolution (174 us at batch 16 for ViT-B/16 on an H200, plus 50 us converting the image to NHWC),
// while the patches are a view of X after one transpose:
//   X -> Reshape [N, C, H/p, p, W/q, q] -> Transpose [0, 2, 4, 1, 3, 5] -> Reshape [N, L, C*p*q]   (one copy)
//     -> Linear(W viewed as [O, C*p*q], weight_layout "nk", bias) -> [N, L, O]
// The models then flatten and transpose the [N, O, H/p, W/q] output to tokens [N, L, O], exactly the Linear's
// output: when the Conv's only reader is that Reshape to [N, O, L] and its only reader the Transpose [0, 2, 1], the
// Linear writes the tokens directly; otherwise a Reshape and a Transpose [0, 3, 1, 2] give back the Conv's output.
// Smaller kernels (ConvNeXt's and Swin's 4 x 4 stems) stay convolutions, which nhwc_layout runs channels-last.
#include <cstring>

#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"

namespace xpuruntime::passes {
namespace {

using namespace internal;
using Ints = std::vector<std::int64_t>;

constexpr std::int64_t kMinPatchPixels = 64;  // p * q: 8 x 8 and larger patches

// `t` (its dtype) with the shape `dims`.
ValueType with_shape(const ValueType& t, const std::vector<Dim>& dims) {
  ValueType out = t;
  out.has_shape = true;
  out.shape = dims;
  return out;
}

}  // namespace

PassResult patch_embedding_gemm(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"patch_embedding_gemm", 0, {}};
  const Uses uses(g);
  Rewriter rw(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node conv = g.nodes[i];
    if (!is_onnx(conv, "Conv") || rw.taken(i) || conv.inputs.size() < 2 || conv.outputs.size() != 1) continue;
    const Tensor* w = constant(g, conv.inputs[1]);
    const auto x = value_type(g, conv.inputs[0]);
    if (w == nullptr || w->dim() != 4 || !x || !x->has_shape || x->shape.size() != 4) continue;
    if (conv.has_input(2) && !is_constant(g, conv.inputs[2])) continue;
    if (!is_fusable_float(x->dtype) || w->dtype() != x->dtype) continue;
    const std::int64_t out_channels = w->shape()[0], channels = w->shape()[1], p = w->shape()[2], q = w->shape()[3];
    if (p * q < kMinPatchPixels || conv.attrs.get_int("group", 1) != 1) continue;
    const std::string auto_pad = conv.attrs.get_string("auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "VALID") continue;
    if (conv.attrs.get_ints("strides", {1, 1}) != Ints{p, q} || conv.attrs.get_ints("dilations", {1, 1}) != Ints{1, 1} ||
        conv.attrs.get_ints("pads", {0, 0, 0, 0}) != Ints{0, 0, 0, 0} ||
        conv.attrs.get_ints("kernel_shape", {p, q}) != Ints{p, q}) {
      continue;
    }
    const Dim& batch = x->shape[0];
    const Dim &c = x->shape[1], &h = x->shape[2], &wd = x->shape[3];
    if (!c.known() || c.value != channels || !h.known() || !wd.known() || h.value % p != 0 || wd.value % q != 0) continue;
    const std::int64_t hp = h.value / p, wq = wd.value / q, patches = hp * wq, k = channels * p * q;

    // Look ahead: Reshape to [N, O, L] then Transpose [0, 2, 1] (flatten(2).transpose(1, 2)) -> the tokens.
    std::vector<std::size_t> pattern = {i};
    std::string tokens;
    if (const auto r = sole_reader(g, uses, rw, conv.outputs[0], "Reshape")) {
      const auto flat = value_type(g, g.nodes[*r].outputs[0]);
      if (flat && flat->has_shape && flat->shape.size() == 3 && same_dim(flat->shape[0], batch) &&
          flat->shape[1] == Dim(out_channels) && flat->shape[2] == Dim(patches)) {
        if (const auto t = sole_reader(g, uses, rw, g.nodes[*r].outputs[0], "Transpose")) {
          if (g.nodes[*t].attrs.get_ints("perm", {}) == Ints{0, 2, 1}) {
            pattern = {i, *r, *t};
            tokens = g.nodes[*t].outputs[0];
          }
        }
      }
    }

    std::vector<Node> nodes;
    const std::string base = conv.name.empty() ? conv.outputs[0] : conv.name;
    const std::string split = g.unique_name(conv.inputs[0] + "_patches_6d");
    g.types[split] = with_shape(*x, {batch, Dim(channels), Dim(hp), Dim(p), Dim(wq), Dim(q)});
    nodes.push_back(reshape_node(g, base + "_patch_view", conv.inputs[0], {0, channels, hp, p, wq, q}, split));
    const std::string moved = g.unique_name(conv.inputs[0] + "_patches_moved");
    g.types[moved] = with_shape(*x, {batch, Dim(hp), Dim(wq), Dim(channels), Dim(p), Dim(q)});
    nodes.push_back(make_node(g, "Transpose", base + "_patch_gather", {split}, {moved},
                              Attributes().set("perm", Ints{0, 2, 4, 1, 3, 5})));
    const std::string rows = g.unique_name(conv.inputs[0] + "_patches");
    g.types[rows] = with_shape(*x, {batch, Dim(patches), Dim(k)});
    nodes.push_back(reshape_node(g, base + "_patch_rows", moved, {0, patches, k}, rows));

    Tensor weight = w->contiguous();  // [O, C, p, q] is [O, C*p*q] row-major: weight_layout "nk"
    Tensor weight_2d = Tensor::empty({out_channels, k}, weight.dtype());
    std::memcpy(weight_2d.data_ptr(), weight.data_ptr(), static_cast<std::size_t>(weight.nbytes()));
    Node linear;
    linear.name = g.unique_name(base + "_linear");
    linear.domain = kXpurtDomain;
    linear.op_type = "Linear";
    linear.inputs = {rows, add_constant(g, base + "_weight_2d", weight_2d)};
    if (conv.has_input(2)) linear.inputs.push_back(conv.inputs[2]);
    linear.attrs.set("weight_layout", std::string("nk"));
    linear.attrs.set("activation", std::string("none"));
    std::string note = describe(conv) + " (" + std::to_string(p) + "x" + std::to_string(q) + " patches) -> ";
    if (!tokens.empty()) {
      linear.outputs = {tokens};
      nodes.push_back(std::move(linear));
      note += "patch Transpose + Linear writing the tokens of " + describe(g.nodes[pattern[2]]);
    } else {
      const std::string flat = g.unique_name(conv.outputs[0] + "_tokens");
      g.types[flat] = with_shape(*x, {batch, Dim(patches), Dim(out_channels)});
      linear.outputs = {flat};
      nodes.push_back(std::move(linear));
      const std::string grid = g.unique_name(conv.outputs[0] + "_nhwc");
      g.types[grid] = with_shape(*x, {batch, Dim(hp), Dim(wq), Dim(out_channels)});
      nodes.push_back(reshape_node(g, base + "_grid", flat, {0, hp, wq, out_channels}, grid));
      nodes.push_back(make_node(g, "Transpose", base + "_nchw", {grid}, {conv.outputs[0]},
                                Attributes().set("perm", Ints{0, 3, 1, 2})));
      note += "patch Transpose + Linear + Transpose to NCHW";
    }
    rw.replace(pattern, std::move(nodes), note);
  }
  rw.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
