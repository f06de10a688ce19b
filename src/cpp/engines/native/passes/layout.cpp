// nhwc_layout: channels-last convolutions and pools on CUDA (see passes.h, docs/native_engine.md).
//
// Note [Channels last]
// cuDNN's tensor-core convolutions work on NHWC data. Given NCHW float16/bfloat16 tensors it converts x and the
// filter to NHWC and y back, on every call: for ResNet-50 at batch 1 on an H100 those conversions were 160 of the
// run's 218 kernels and 40% of its GPU time. This pass makes the convolutions channels-last instead: every
// FusedConv whose channel counts suit tensor cores (multiples of 8; one group, or several channels per group)
// gets layout=NHWC and a weight permuted to [O, kh, kw, C / group] once, here; a pool reading a channels-last value
// becomes its com.xpuruntime twin with layout=NHWC. Values cross between the layouts through Transpose nodes: one into NHWC where a converted node
// reads a value produced in NCHW (the model's input, say), one back to NCHW after each converted node. The way
// back is only kept where something in NCHW reads it: a chain of converted nodes passes its NHWC values directly,
// so a ResNet runs channels-last from its first converted conv to the global pool, whose [N, 1, 1, C] output is
// NCHW [N, C, 1, 1] by a Reshape (a view). Runs only for CUDA plans (on the CPU the cpu kernels would permute
// through NCHW, which costs).
//
// Note [Grouped convolutions run channels-last]
// A grouped convolution with several channels per group (ResNeXt's 32 groups of 4 to 32 channels, RegNet's groups
// of 8 or more) used to stay NCHW: Transposes on both sides of it in a channels-last network, and cuDNN converting x,
// the filter and y to NHWC inside the call again, or running its grouped direct kernel. On an H200 at batch 1
// (2026-12-03) that was 155 of ResNeXt-50's 493 us of kernels in layout conversions and 68 us in three direct kernels;
// torch.compile runs the same convolutions channels-last through cuDNN's grouped tensor-core kernels. So a grouped
// FusedConv with at least kGroupedNhwcMinChannels input channels per group, and channel counts that are multiples
// of 8 as for one group, becomes layout=NHWC with the weight [O, kh, kw, C / group] (cudnn_conv's NHWC form).
//
// Note [Layouts propagate]
// Converting the tensor-core convolutions alone leaves the models built of depthwise blocks (EfficientNet,
// MobileNet, ConvNeXt) crossing layouts twice per block: their 1x1 convolutions ran channels-last, their depthwise
// convolutions, activations and squeeze-excitation NCHW, and 15% of their GPU time went to the Transposes between.
// So the channels-last values propagate forward through every node that can read them as they are:
//  - a depthwise FusedConv (group == channels == outputs, channels a multiple of 8) whose input is channels-last
//    (cuda_raw's kernel, Note [Channels-last depthwise]; its weight [C, 1, kh, kw] is [C, kh, kw, 1] already);
//  - elementwise ops (activations, Add/Mul/...) whose 4-D operands are channels-last, [N, C, 1, 1] (read as
//    [N, 1, 1, C], a view: squeeze-excitation's scale), constants of shape [C, 1, 1] (permuted once) or
//    one-element; their output is channels-last;
//  - ReduceMean over H and W (the squeeze), which reduces axes 1 and 2 instead;
//  - the exporters' own Transposes: perm [0, 2, 3, 1] of a value with a channels-last twin is that twin (ConvNeXt's
//    permute before its LayerNorm over channels), and perm [0, 3, 1, 2] makes an NCHW value whose twin is its input
//    (the permute back), so a residual Add after it stays channels-last.
// An op whose other operands are NCHW stays NCHW (a Transpose either way), so propagation adds no Transpose: the
// ways back are made only where an NCHW reader is left.
//
// Note [Channels-last int8 convolutions]
// The int8 convolutions of a quantized model (QConv, the quantized_fusion pass's nodes: qconv2d) run on tensor cores
// channels-last only (cuda_raw's "int8_mma", Note [Int8 convolution on the GPU] in backends/cuda_raw/quant_conv.cu:
// x [N, H, W, C] with C a multiple of 16, one group). So a QConv whose input channels suit becomes layout=NHWC with its
// int8 weight permuted to [O, kh, kw, C] once, in plans of any float type, and its int8 (or float) values cross
// between the layouts through the same Transposes; a chain of QConvs (Conv -> Relu -> Q -> DQ -> Conv fused) passes its
// channels-last int8 values directly. The other QConvs (the 3-channel stem, depthwise and grouped ones) stay NCHW
// for cuda_raw's generic kernel.
//
// Note [Stems padded to eight channels]
// An image model's first convolution reads the image's 3 channels, which cuDNN's tensor-core NHWC kernels do not take
// (multiples of 8), so it stayed NCHW and ran cuDNN's non-tensor-core kernels: ResNet-50's 7x7 stem 118 us of its
// 818 us at batch 16 on an H100 (9% of its floor), and 18 us at batch 1; MobileNetV3's, EfficientNet-B0's and RegNet's
// 3x3 stems 31-33 us at batch 16 (the suite's audit, 2026-12-06, docs/benchmarks.md). NVIDIA's own ResNet-50 runs pad
// the image to 4 channels for the same reason. So a one-group FusedConv with 2 to 7 input channels and a
// multiple of 8 output channels runs channels-last on an input padded with zero channels to 8: the image's Transpose
// into NHWC, then a Pad of its channel axis (a few microseconds over the image), and the weight [O, kh, kw, 8] with
// zeros in the added channels, made once here. The zeros add nothing to the sums, so the outputs are the same
// convolution's; the pools and convolutions after it stay channels-last from the image on.

// Note [Quantized values keep their layout]
// Between the int8 convolutions of a quantized ResNet sit the residual blocks' float ops as the QDQ model writes them:
// DequantizeLinear of the identity, Add with the last convolution's float output, Relu, QuantizeLinear. Left NCHW
// they put two Transposes in every block, the convolution's output back to NCHW and the quantized sum into NHWC again:
// 0.31 ms of the int8 ResNet-50's 2.1 ms at batch 16 on an H200 (2026-12-02, float16 plan). Per-tensor QuantizeLinear
// and DequantizeLinear are elementwise (one scale and zero point: operands that broadcast alike in either layout), so
// they propagate the layout as the other elementwise ops do, in any dtype (the int8 values, and the float32 ones of
// a float32 plan's QConv outputs), and a block's values stay channels-last from its first convolution to its last.
//
// Note [Per-sample normalizations are layout-free]
// A normalization over all of a sample's elements (GroupNorm of one group: PoolFormer's and the other MetaFormers'
// norm, which exporters write as Reshape [N, 1, C * H * W], InstanceNormalization and a Reshape back, and which
// op_decomposition turns into a LayerNormalization over that last axis) computes one mean and one variance per
// sample, whatever order the sample's elements are in. Left NCHW between channels-last convolutions and pools, each
// such norm put a Transpose on both sides: 26 of PoolFormer-S12's kernels at batch 1 (47 of its 570 us, H100,
// 2026-12-07). So a Reshape of a channels-last value's NCHW form to [N, 1, ..., 1, C * H * W] ("flat": every axis
// but the first and the last of one element), followed by a chain whose every value is read by the next node alone,
// made of LayerNormalizations over the flat axis (a one-element scale and bias, or none), elementwise ops whose other
// operands are one element, and Reshapes from one flat shape to another, and ending in a Reshape to the same
// [N, C, H, W], runs on the channels-last twin instead: the first Reshape flattens [N, H, W, C], the last one makes
// the twin of the chain's end. Each flat value holds the same elements in another order, and every node of the chain
// treats them alike, so the end's twin holds exactly what the NCHW chain's end does, channels-last. The per-channel
// scale and bias after the norm ([C, 1, 1] constants) then follow as elementwise ops, and the pools after them too.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/conv_layout.h"
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

// The fewest input channels per group for which a grouped FusedConv runs channels-last (Note [Grouped convolutions
// run channels-last]); one channel per group is a depthwise convolution, which has its own rule.
constexpr std::int64_t kGroupedNhwcMinChannels = 4;

bool is_half_float(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// The 4-D shape of `value` when it is known, static and of a 16-bit float type.
std::optional<std::vector<std::int64_t>> half_4d_shape(const Graph& g, const std::string& value) {
  auto type = value_type(g, value);
  if (!type || !is_half_float(type->dtype)) return std::nullopt;
  auto shape = static_shape(g, value);
  if (!shape || shape->size() != 4) return std::nullopt;
  return shape;
}

// [O, I, kh, kw] elements of type T at `from` -> [O, kh, kw, I] at `to`, written in order.
template <typename T>
void permute_oihw_to_ohwi(const T* from, T* to, std::int64_t o, std::int64_t in, std::int64_t kh, std::int64_t kw) {
  const std::int64_t taps = kh * kw;
  for (std::int64_t a = 0; a < o; ++a) {
    const T* filter = from + a * in * taps;
    for (std::int64_t t = 0; t < taps; ++t) {
      for (std::int64_t c = 0; c < in; ++c) *to++ = filter[c * taps + t];
    }
  }
}

// A copy of the 4-D constant `w` [O, I, kh, kw] as [O, kh, kw, I]. Typed by element size: an element-wise memcpy
// made this 100-200 ms of ResNet-50's plan build (Note [Build phases]).
Tensor ohwi_from_oihw(const Tensor& w) {
  const auto& s = w.shape();
  const std::int64_t o = s[0], in = s[1], kh = s[2], kw = s[3];
  const Tensor src = w.contiguous();
  Tensor dst = Tensor::empty({o, kh, kw, in}, w.dtype());
  switch (dtype_size(w.dtype())) {
    case 1:
      permute_oihw_to_ohwi(static_cast<const std::uint8_t*>(src.data_ptr()), static_cast<std::uint8_t*>(dst.data_ptr()),
                           o, in, kh, kw);
      break;
    case 2:
      permute_oihw_to_ohwi(static_cast<const std::uint16_t*>(src.data_ptr()),
                           static_cast<std::uint16_t*>(dst.data_ptr()), o, in, kh, kw);
      break;
    case 4:
      permute_oihw_to_ohwi(static_cast<const std::uint32_t*>(src.data_ptr()),
                           static_cast<std::uint32_t*>(dst.data_ptr()), o, in, kh, kw);
      break;
    default:
      permute_oihw_to_ohwi(static_cast<const std::uint64_t*>(src.data_ptr()),
                           static_cast<std::uint64_t*>(dst.data_ptr()), o, in, kh, kw);
      break;
  }
  return dst;
}

// An NCHW FusedConv with a constant 4-D weight of its 16-bit float input's type: the input's shape and the weight.
struct HalfConv {
  std::vector<std::int64_t> x;
  const Tensor* w = nullptr;
};
std::optional<HalfConv> half_nchw_conv(const Graph& g, const Node& n) {
  if (n.domain != kXpurtDomain || n.op_type != "FusedConv" || n.outputs.size() != 1) return std::nullopt;
  if (n.attrs.get_string("layout", "NCHW") != "NCHW") return std::nullopt;
  const Tensor* w = n.inputs.size() > 1 ? constant(g, n.inputs[1]) : nullptr;
  auto x = half_4d_shape(g, n.inputs[0]);
  if (w == nullptr || w->dim() != 4 || !x || w->dtype() != *value_dtype(g, n.inputs[0])) return std::nullopt;
  return HalfConv{*x, w};
}

// Whether FusedConv `n` is worth running channels-last (Note [Channels last], Note [Grouped convolutions run
// channels-last]).
bool convertible_conv(const Graph& g, const Node& n) {
  auto conv = half_nchw_conv(g, n);
  if (!conv || conv->x[1] % 8 != 0 || conv->w->shape()[0] % 8 != 0) return false;
  const std::int64_t group = n.attrs.get_int("group", 1);
  return group == 1 || (group > 1 && conv->x[1] % group == 0 && conv->x[1] / group >= kGroupedNhwcMinChannels);
}

// The channels a stem's input is padded to (Note [Stems padded to eight channels]).
constexpr std::int64_t kStemChannels = 8;

// A one-group 16-bit FusedConv of 2 to kStemChannels - 1 input channels and a multiple of 8 output channels, its
// output shape known (Note [Stems padded to eight channels]). One channel (wav2vec 2.0's raw audio) is left as it is:
// its NCHW and NHWC orders are the same bytes, and padding it would read eight times what the convolution needs.
bool padded_stem_conv(const Graph& g, const Node& n) {
  auto conv = half_nchw_conv(g, n);
  if (!conv || conv->x[1] < 2 || conv->x[1] >= kStemChannels || conv->w->shape()[0] % 8 != 0) return false;
  return n.attrs.get_int("group", 1) == 1 && conv->w->shape()[1] == conv->x[1] && half_4d_shape(g, n.outputs[0]);
}

// `w` [O, I, kh, kw] as [O, kh, kw, channels], the channels past I zeros (Note [Stems padded to eight channels]).
Tensor ohwi_padded(const Tensor& w, std::int64_t channels) {
  const Tensor ohwi = ohwi_from_oihw(w);
  const auto& s = ohwi.shape();
  Tensor out = Tensor::empty({s[0], s[1], s[2], channels}, w.dtype());
  const std::size_t row = static_cast<std::size_t>(s[3]) * dtype_size(w.dtype());
  const std::size_t padded = static_cast<std::size_t>(channels) * dtype_size(w.dtype());
  auto* to = static_cast<std::uint8_t*>(out.data_ptr());
  const auto* from = static_cast<const std::uint8_t*>(ohwi.data_ptr());
  std::memset(to, 0, static_cast<std::size_t>(out.nbytes()));
  for (std::int64_t r = 0; r < s[0] * s[1] * s[2]; ++r) {
    std::memcpy(to + static_cast<std::size_t>(r) * padded, from + static_cast<std::size_t>(r) * row, row);
  }
  return out;
}

// A QConv (the int8 convolution, Note [Channels-last int8 convolutions]) worth running channels-last: NCHW, one group,
// a constant int8 weight [O, C, kh, kw] and a 4-D input of known shape whose channels are a multiple of 16.
bool convertible_qconv(const Graph& g, const Node& n) {
  if (n.domain != kXpurtDomain || n.op_type != "QConv" || n.outputs.size() != 1 || n.inputs.size() < 2) return false;
  if (n.attrs.get_string("layout", "NCHW") != "NCHW" || n.attrs.get_int("groups", 1) != 1) return false;
  const Tensor* w = constant(g, n.inputs[1]);
  const auto x = static_shape(g, n.inputs[0]);
  return w != nullptr && w->dtype() == DType::kInt8 && w->dim() == 4 && x && x->size() == 4 && (*x)[1] > 0 &&
         (*x)[1] % 16 == 0 && (*x)[1] == w->shape()[1];
}

// The ONNX pool `n` as a channels-last com.xpuruntime node reading `x` (NHWC) into `y`; false when its
// attributes are outside what the registry pools take (auto_pad SAME_*, storage order, the Indices output).
bool nhwc_pool(const Node& n, const std::string& x, const std::string& y, Node* out) {
  const bool global = is_onnx(n, "GlobalAveragePool");
  const bool max = is_onnx(n, "MaxPool");
  if (!global && !max && !is_onnx(n, "AveragePool")) return false;
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) return false;
  out->name = n.name;
  out->domain = kXpurtDomain;
  out->op_type = n.op_type;
  out->inputs = {x};
  out->outputs = {y};
  out->attrs.set("layout", std::string("NHWC"));
  if (global) return true;
  const std::string auto_pad = n.attrs.get_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID") return false;
  if (n.attrs.get_int("storage_order", 0) != 0) return false;
  const auto kernel = n.attrs.get_ints("kernel_shape", {});
  if (kernel.size() != 2) return false;
  const auto pads = auto_pad == "VALID" ? std::vector<std::int64_t>{0, 0, 0, 0}
                                        : n.attrs.get_ints("pads", {0, 0, 0, 0});
  if (pads.size() != 4) return false;
  out->attrs.set("kernel_shape", kernel);
  out->attrs.set("strides", n.attrs.get_ints("strides", {1, 1}));
  out->attrs.set("pads", pads);
  out->attrs.set("ceil_mode", n.attrs.get_int("ceil_mode", 0));
  if (max) {
    out->attrs.set("dilations", n.attrs.get_ints("dilations", {1, 1}));
  } else {
    if (n.attrs.get_ints("dilations", {1, 1}) != std::vector<std::int64_t>{1, 1}) return false;
    out->attrs.set("count_include_pad", n.attrs.get_int("count_include_pad", 0));
  }
  return true;
}

// The depthwise FusedConv `n` (weight [C, 1, kh, kw], C == outputs == group) in a 16-bit float, which runs
// channels-last where its input already is (Note [Layouts propagate]; cuda_raw's tiled kernel for channels that are
// multiples of 8, its generic one for the others).
bool depthwise_conv(const Graph& g, const Node& n) {
  auto conv = half_nchw_conv(g, n);
  if (!conv) return false;
  const std::int64_t c = conv->x[1];
  return c > 1 && n.attrs.get_int("group", 1) == c && conv->w->shape()[0] == c && conv->w->shape()[1] == 1;
}

// Note [Feature maps of tokens]
// Vision transformers with convolutions between their blocks (SegFormer's Mix-FFN, PVT v2's, CvT's) make a feature
// map of their tokens [B, H * W, C] as Reshape(Transpose(tokens, [0, 2, 1]), [B, C, H, W]), and tokens of the
// convolution's output by the way back: an NCHW value whose channels-last reading [B, H, W, C] is the tokens
// themselves. Such a value counts as channels-last for a depthwise FusedConv reading it: the Transpose to NHWC that
// the conversion adds, with the chain before it, is a Reshape of the tokens, and so is the way back with the Reshape
// and Transpose to tokens after it (Note [View chains that are reshapes] in fused_input_views.cpp, later in the
// pipeline, makes them so). SegFormer's depthwise convolutions ran NCHW between two strided copies each.
bool channels_last_for_free(const Graph& g, const Uses& uses, const std::string& value) {
  const auto shape = static_shape(g, value);
  if (!shape || shape->size() != 4) return false;
  const auto chain = internal::view_chain(g, uses, value);
  if (!chain || chain->view.offset != 0 || chain->view.shape != *shape) return false;
  const auto source = static_shape(g, chain->source);
  if (!source || internal::numel_of(*source) != internal::numel_of(*shape)) return false;
  fused::InputView nhwc;  // the view read as [N, H, W, C]: one block in that order
  for (const std::size_t d : {std::size_t{0}, std::size_t{2}, std::size_t{3}, std::size_t{1}}) {
    nhwc.shape.push_back(chain->view.shape[d]);
    nhwc.strides.push_back(chain->view.strides[d]);
  }
  return internal::is_block(nhwc);
}

// Note [Pointwise convolutions as GEMMs]
// A 1x1 convolution (stride 1, no padding, one group) is, channels-last, a GEMM over the channel axis: [N * H * W, C]
// times [C, O]. Where C or O is not a multiple of 8 cuDNN's tensor-core NHWC kernels do not take it (convertible_conv
// leaves it NCHW), and cuDNN's NCHW path converted x, the filter and y to NHWC inside every call: ShuffleNetV2's
// branches of 58 and 116 channels spent 370 of their 776 us of kernels per run in those conversions at batch 1
// (H200, 2026-12-04) against torch.compile's 292 us in all. So such a FusedConv with activation none or relu becomes
// a Linear over the channels-last twin of its input (weight [O, C], "nk"; its bias, residual and activation the
// Linear's), which cuBLASLt runs with kernels for any row alignment.
//
// Note [Pointwise convolutions for the GEMM's epilogue]
// A pointwise convolution whose output goes only to what a GEMM's epilogue takes and cuDNN's does not -- a GELU
// (cuBLASLt's GELU epilogue; cuDNN runs it as a pass of its own after, Note [cuDNN conv activations after the
// epilogue]) or a Mul by a constant (a layer scale, which linear_epilogue_fusion folds into the weights, and the
// residual Add after it) -- becomes the Linear too, whatever its channels: MetaFormer blocks (PoolFormer's MLP,
// 1x1 conv -> GELU -> 1x1 conv -> layer scale -> residual) and MaxViT's MBConv kept a GELU kernel and a layer-scale
// kernel per block beside cuDNN's convolutions.
bool pointwise_gemm_conv(const Graph& g, const Node& n, bool epilogue_for_gemm) {
  auto conv = half_nchw_conv(g, n);
  if (!conv) return false;
  const auto& w = conv->w->shape();
  if (w[2] != 1 || w[3] != 1 || w[1] != conv->x[1] || n.attrs.get_int("group", 1) != 1) return false;
  // cuDNN's tensor-core kernels take it (convertible_conv), unless the GEMM's epilogue takes what follows
  if (conv->x[1] % 8 == 0 && w[0] % 8 == 0 && !epilogue_for_gemm) return false;
  for (const char* name : {"strides", "dilations"}) {
    for (std::int64_t v : n.attrs.get_ints(name, {1, 1})) {
      if (v != 1) return false;
    }
  }
  for (std::int64_t v : n.attrs.get_ints("pads", {0, 0, 0, 0})) {
    if (v != 0) return false;
  }
  const std::string activation = n.attrs.get_string("activation", "none");
  return activation == "none" || activation == "relu";
}

// The elementwise ops whose output keeps its operands' layout (Note [Layouts propagate]); Clip's bounds and
// PRelu's slope are operands like the others.
bool layout_free(const Node& n) {
  static const std::set<std::string> kOnnx = {
      "Add",  "Sub", "Mul",     "Div", "Pow",     "Max",        "Min",         "Relu",      "Sigmoid",
      "Tanh", "Erf", "Exp",     "Log", "Sqrt",    "Reciprocal", "Neg",         "Abs",       "HardSigmoid",
      "HardSwish",   "Clip",    "LeakyRelu",      "Elu",        "Softplus",    "PRelu",     "Cast"};
  if (n.outputs.size() != 1 || n.inputs.empty()) return false;
  if (n.domain == kXpurtDomain) return n.op_type == "Gelu";
  // Per-tensor QuantizeLinear / DequantizeLinear (Note [Quantized values keep their layout]): a per-axis or blocked
  // scale is not one element, so operand_kind makes such a node stay NCHW.
  if ((n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear") && (n.domain.empty() || n.domain == "ai.onnx")) {
    return n.attrs.get_int("block_size", 0) == 0;
  }
  return (n.domain.empty() || n.domain == "ai.onnx") && kOnnx.count(n.op_type) != 0;
}

// A constant [C, 1, 1] or [1, C, 1, 1] as [1, 1, C] or [1, 1, 1, C] (the same elements in the same order).
Tensor channels_last_constant(const Tensor& t) {
  std::vector<std::int64_t> shape = t.shape();
  const std::size_t c = shape.size() - 3;
  std::rotate(shape.begin() + static_cast<std::ptrdiff_t>(c), shape.begin() + static_cast<std::ptrdiff_t>(c) + 1,
              shape.end());
  const Tensor src = t.contiguous();
  Tensor out = Tensor::empty(shape, t.dtype());
  std::memcpy(out.data_ptr(), src.data_ptr(), src.nbytes());
  return out;
}

// How a channels-last elementwise node reads one operand (Note [Layouts propagate]).
enum class Operand : std::uint8_t {
  kTransposed,  // only through a Transpose: the node stays NCHW
  kTwin,        // channels-last already
  kSame,        // one element: broadcasts alike in either layout
  kConstant,    // [C, 1, 1] or [1, C, 1, 1]: permuted once
  kView,        // [N, C, 1, 1]: read as [N, 1, 1, C] through a Reshape
};

Node transpose_node(const std::string& name, const std::string& in, const std::string& out,
                    const std::vector<std::int64_t>& perm) {
  Node t;
  t.name = name;
  t.op_type = "Transpose";
  t.inputs = {in};
  t.outputs = {out};
  t.attrs.set("perm", perm);
  return t;
}

// One walk of nhwc_layout over g's nodes (Note [Channels last], Note [Layouts propagate]): the NCHW -> channels-last
// map and what the walk made so far. rewrite() takes the nodes in order; each of its cases (convert_conv,
// convert_qconv, follow_pool, fold_transpose, convert_reduce_mean, convert_elementwise) either handles the node and
// returns true, or returns false having added no node. finish() puts the new nodes into g.
class NhwcRewriter {
 public:
  NhwcRewriter(Graph& g, PassResult& result) : g_(g), result_(result), original_uses_(g) {
    nodes_.reserve(g.nodes.size() * 2);
  }

  void rewrite(const Node& original) {
    Node n = original;
    for (std::string& in : n.inputs) in = current(in);
    if (!original.outputs.empty() && folded_.count(original.outputs[0]) != 0) return;  // a channel shuffle's part
    if (convert_pointwise(original, n) || convert_conv(original, n) || convert_padded_stem(original, n) ||
        convert_qconv(original, n)) {
      return;
    }
    if (close_flat_chain(original, n)) return;
    const bool nhwc_input = !n.inputs.empty() && nhwc_of_.count(n.inputs[0]) != 0;
    if (open_flat_chain(original, n, nhwc_input) || follow_pool(n, nhwc_input) ||
        fold_transpose(original, n, nhwc_input) || convert_reduce_mean(original, n, nhwc_input) ||
        convert_elementwise(original, n) || convert_concat(original, n) ||
        convert_channel_slice(original, n, nhwc_input) || convert_channel_shuffle(original, n, nhwc_input)) {
      return;
    }
    nodes_.push_back(n);
  }

  // g's nodes become the rewritten ones, without the ways back to NCHW that nothing reads (Note [Channels last]).
  void finish() {
    g_.nodes = std::move(nodes_);
    if (result_.rewrites == 0) return;
    const Uses uses(g_);
    std::vector<Node> kept;
    for (Node& n : g_.nodes) {
      if (n.outputs.size() == 1 && back_values_.count(n.outputs[0]) != 0 && uses.unused(n.outputs[0])) continue;
      kept.push_back(std::move(n));
    }
    g_.nodes = std::move(kept);
    replaced_weights_.insert(shape_constants_.begin(), shape_constants_.end());
    remove_unused_constants(g_, replaced_weights_);
  }

 private:
  // A name unused in g and not made here yet.
  std::string fresh(const std::string& hint) {
    std::string name = g_.unique_name(hint);
    for (int k = 2; taken_names_.count(name) != 0; ++k) name = g_.unique_name(detail::str_cat(hint, "_", k));
    taken_names_.insert(name);
    return name;
  }

  // A [N, C, 1, 1] value and its [N, 1, 1, C] twin have one memory order: a Reshape (a view) between them.
  void reshape_node(const std::string& value, const std::string& to, const std::vector<std::int64_t>& shape) {
    Node reshape;
    reshape.name = fresh(value + (shape[3] == 1 ? "_to_nchw" : "_to_nhwc"));
    reshape.op_type = "Reshape";
    reshape.inputs = {value, add_constant(g_, to + "_shape", int64_tensor(shape))};
    shape_constants_.insert(reshape.inputs[1]);
    reshape.outputs = {to};
    nodes_.push_back(std::move(reshape));
  }

  // The channels-last twin of `value`, made by a Transpose into NHWC (a Reshape for [N, C, 1, 1]) when it has none
  // yet.
  std::string to_nhwc(const std::string& value) {
    auto it = nhwc_of_.find(value);
    if (it != nhwc_of_.end()) return it->second;
    const std::string twin = fresh(value + "_nhwc");
    auto shape = static_shape(g_, value);
    if (shape && shape->size() == 4 && (*shape)[2] == 1 && (*shape)[3] == 1) {
      reshape_node(value, twin, detail::nchw_to_nhwc(*shape));
    } else {
      nodes_.push_back(transpose_node(fresh(value + "_to_nhwc"), value, twin, {0, 2, 3, 1}));
    }
    nhwc_of_[value] = twin;
    return twin;
  }

  // After a converted node wrote `twin`: the NCHW `value` back, for the readers that stay NCHW.
  void back_to_nchw(const std::string& value, const std::string& twin, const std::vector<std::int64_t>& nchw_shape) {
    if (nchw_shape[2] == 1 && nchw_shape[3] == 1) {
      reshape_node(twin, value, nchw_shape);
    } else {
      nodes_.push_back(transpose_node(fresh(value + "_to_nchw"), twin, value, {0, 3, 1, 2}));
    }
    nhwc_of_[value] = twin;
    back_values_.insert(value);
  }

  // The converted node `converted` writing `twin` in place of n's NCHW output of shape `y_shape`.
  void add_converted(const Node& n, Node converted, const std::string& twin, const std::vector<std::int64_t>& y_shape,
                     const char* how) {
    result_.notes.push_back(detail::str_cat(describe(n), how));
    nodes_.push_back(std::move(converted));
    back_to_nchw(n.outputs[0], twin, y_shape);
    ++result_.rewrites;
  }

  // How a converted elementwise node with output [N, C, H, W] `out` reads operand `value` (`typed`: its name in the
  // original graph, which has its type).
  Operand operand_kind(const std::string& value, const std::string& typed, const std::vector<std::int64_t>& out) const {
    if (nhwc_of_.count(value) != 0) return Operand::kTwin;
    auto shape = static_shape(g_, typed);
    if (!shape) return Operand::kTransposed;
    std::int64_t numel = 1;
    for (std::int64_t d : *shape) numel *= d;
    if (numel == 1) return Operand::kSame;
    const std::size_t rank = shape->size();
    if (rank < 3 || rank > 4 || (*shape)[rank - 1] != 1 || (*shape)[rank - 2] != 1 || (*shape)[rank - 3] != out[1]) {
      return Operand::kTransposed;
    }
    if (rank == 4 && (*shape)[0] != 1 && (*shape)[0] != out[0]) return Operand::kTransposed;
    if (constant(g_, value) != nullptr) return Operand::kConstant;
    return rank == 4 ? Operand::kView : Operand::kTransposed;
  }

  // `value`, or the twin a folded Transpose's output `value` equals.
  const std::string& current(const std::string& value) const {
    auto it = renamed_.find(value);
    return it == renamed_.end() ? value : it->second;
  }

  // Whether the [N, C, 1, 1] output of elementwise node `p` is read only by elementwise nodes that will convert (one
  // of their other operands is channels-last already): then `p` converts too, its inputs read through views, so that
  // it stays in one fused kernel with its reader (squeeze-excitation's Sigmoid before the scaling Mul).
  bool readers_convert(const Node& p) const {
    const auto y = static_shape(g_, p.outputs[0]);
    if (!y || y->size() != 4 || (*y)[2] != 1 || (*y)[3] != 1) return false;
    const std::string& value = p.outputs[0];
    if (original_uses_.is_graph_output(value) || original_uses_.read_by_subgraph(value)) return false;
    const auto& readers = original_uses_.readers(value);
    return !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](std::size_t r) {
      const Node& reader = g_.nodes[r];
      if (!layout_free(reader)) return false;
      return std::any_of(reader.inputs.begin(), reader.inputs.end(), [&](const std::string& in) {
        return in != value && nhwc_of_.count(current(in)) != 0;
      });
    });
  }

  // A tensor-core FusedConv, or a depthwise one whose input is channels-last: layout=NHWC with an OHWI weight. One
  // whose output shape is not known stays as it is (and no other case looks at it).
  bool convert_conv(const Node& original, const Node& n) {
    if (!convertible_conv(g_, original) &&
        !(depthwise_conv(g_, original) && (nhwc_of_.count(n.inputs[0]) != 0 ||  // Note [Feature maps of tokens]
                                           channels_last_for_free(g_, original_uses_, original.inputs[0])))) {
      return false;
    }
    const auto y_shape = half_4d_shape(g_, n.outputs[0]);
    if (!y_shape) {
      nodes_.push_back(n);
      return true;
    }
    const std::string x = to_nhwc(n.inputs[0]);
    add_nhwc_conv(n, x, ohwi_from_oihw(*constant(g_, n.inputs[1])), "_ohwi", *y_shape, " -> NHWC");
    return true;
  }

  // FusedConv `n` channels-last: reading `x` (NHWC), its weight `w` [O, kh, kw, C] a constant named after n's weight
  // with `suffix`, its residual's twin, writing a twin of its output of shape `y_shape`.
  void add_nhwc_conv(const Node& n, const std::string& x, const Tensor& w, const char* suffix,
                     const std::vector<std::int64_t>& y_shape, const std::string& how) {
    Node conv = n;
    conv.inputs[0] = x;
    replaced_weights_.insert(n.inputs[1]);
    conv.inputs[1] = add_constant(g_, n.inputs[1] + suffix, w);
    if (n.inputs.size() > 3 && !n.inputs[3].empty()) conv.inputs[3] = to_nhwc(n.inputs[3]);
    const std::string twin = fresh(n.outputs[0] + "_nhwc");
    conv.outputs = {twin};
    conv.attrs.set("layout", std::string("NHWC"));
    add_converted(n, std::move(conv), twin, y_shape, how.c_str());
  }

  // A stem convolution of fewer than 8 input channels: channels-last on its input padded to 8 channels (Note [Stems
  // padded to eight channels]).
  bool convert_padded_stem(const Node& original, const Node& n) {
    if (!padded_stem_conv(g_, original)) return false;
    const auto y_shape = half_4d_shape(g_, n.outputs[0]);
    const std::int64_t channels = half_4d_shape(g_, original.inputs[0])->at(1);
    Node pad;
    pad.name = fresh(n.name + "_pad_channels");
    pad.op_type = "Pad";
    pad.inputs = {to_nhwc(n.inputs[0]),
                  add_constant(g_, n.name + "_channel_pads", int64_tensor({0, 0, 0, 0, 0, 0, 0,
                                                                           kStemChannels - channels}))};
    shape_constants_.insert(pad.inputs[1]);
    const std::string x = fresh(n.inputs[0] + "_nhwc_padded");
    pad.outputs = {x};
    nodes_.push_back(std::move(pad));
    add_nhwc_conv(n, x, ohwi_padded(*constant(g_, n.inputs[1]), kStemChannels), "_ohwi_padded", *y_shape,
                  detail::str_cat(" -> NHWC on its input padded from ", channels, " to ", kStemChannels, " channels"));
    return true;
  }

  // Whether FusedConv `original` (no activation, no residual) is read by nothing but a GELU or a Mul by a constant
  // (Note [Pointwise convolutions for the GEMM's epilogue]).
  bool epilogue_for_gemm(const Node& original) const {
    if (original.attrs.get_string("activation", "none") != "none" ||
        (original.inputs.size() > 3 && !original.inputs[3].empty())) {
      return false;
    }
    const std::string& y = original.outputs[0];
    const auto& readers = original_uses_.readers(y);
    if (readers.size() != 1 || original_uses_.is_graph_output(y) || original_uses_.read_by_subgraph(y)) return false;
    const Node& r = g_.nodes[readers[0]];
    if (internal::gelu_activation(r)) return true;
    return is_onnx(r, "Mul") && r.inputs.size() == 2 && is_constant(g_, r.inputs[r.inputs[0] == y ? 1 : 0]);
  }

  // A pointwise FusedConv whose channels cuDNN's NHWC kernels do not take, or whose epilogue the GEMM takes: a Linear
  // over the channels-last twin of its input (Note [Pointwise convolutions as GEMMs]).
  bool convert_pointwise(const Node& original, const Node& n) {
    if (!pointwise_gemm_conv(g_, original, epilogue_for_gemm(original))) return false;
    const auto y_shape = half_4d_shape(g_, n.outputs[0]);
    if (!y_shape) return false;
    const Tensor w = constant(g_, n.inputs[1])->contiguous();  // [O, C, 1, 1]: [O, C] in the same order
    Tensor w2 = Tensor::empty({w.shape()[0], w.shape()[1]}, w.dtype());
    std::memcpy(w2.data_ptr(), w.data_ptr(), static_cast<std::size_t>(w.nbytes()));
    replaced_weights_.insert(n.inputs[1]);
    Node linear;
    linear.name = n.name;
    linear.domain = kXpurtDomain;
    linear.op_type = "Linear";
    linear.inputs = {to_nhwc(n.inputs[0]), add_constant(g_, n.inputs[1] + "_nk", w2),
                     n.inputs.size() > 2 ? n.inputs[2] : std::string()};
    if (n.inputs.size() > 3 && !n.inputs[3].empty()) linear.inputs.push_back(to_nhwc(n.inputs[3]));
    linear.attrs.set("activation", n.attrs.get_string("activation", "none"));
    linear.attrs.set("weight_layout", std::string("nk"));
    const std::string twin = fresh(n.outputs[0] + "_nhwc");
    linear.outputs = {twin};
    add_converted(n, std::move(linear), twin, *y_shape, " -> Linear over the channels of NHWC");
    return true;
  }

  // Note [Channel concatenations, slices and shuffles follow]
  // Networks that split and join channels (ShuffleNet's channel split, concatenation and shuffle; Inception's and
  // DenseNet's concatenations) put two Transposes around each of those ops when they stay NCHW. Channels-last they are
  // the same ops on axis 3: a Concat along channels of channels-last values, a Slice of channels of one, and the
  // channel shuffle the exporters write (Reshape [N, G, C/G, H, W], Transpose (0, 2, 1, 3, 4), Reshape [N, C, H, W])
  // as Reshape [N, H, W, G, C/G], Transpose (0, 1, 2, 4, 3), Reshape [N, H, W, C].

  // A Concat along channels of which at least as many inputs are channels-last as not (the others get their twin,
  // made once: DenseNet's first block joins the stem's NCHW pool to each of its layers' outputs).
  bool convert_concat(const Node& original, const Node& n) {
    if (!is_onnx(n, "Concat") || n.outputs.size() != 1 || n.inputs.empty()) return false;
    const auto y_shape = half_4d_shape(g_, original.outputs[0]);
    const std::int64_t axis = n.attrs.get_int("axis", 0);
    if (!y_shape || (axis != 1 && axis != -3)) return false;
    std::size_t twins = 0;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      if (nhwc_of_.count(n.inputs[i]) != 0) {
        ++twins;
      } else if (!half_4d_shape(g_, original.inputs[i])) {
        return false;
      }
    }
    if (2 * twins < n.inputs.size()) return false;
    Node concat = n;
    for (std::string& in : concat.inputs) in = to_nhwc(in);
    concat.attrs.set("axis", std::int64_t{3});
    const std::string twin = fresh(n.outputs[0] + "_nhwc");
    concat.outputs = {twin};
    add_converted(n, std::move(concat), twin, *y_shape, " -> NHWC (axis 3)");
    return true;
  }

  // A Slice of channels (constant starts, ends, steps; axis 1 only) of a channels-last value.
  bool convert_channel_slice(const Node& original, const Node& n, bool nhwc_input) {
    if (!nhwc_input || !is_onnx(n, "Slice") || g_.opset("") < 10 || n.outputs.size() != 1 || n.inputs.size() < 4) {
      return false;
    }
    const auto y_shape = half_4d_shape(g_, original.outputs[0]);
    const auto axes = constant(g_, n.inputs[3]);
    if (!y_shape || axes == nullptr || constant(g_, n.inputs[1]) == nullptr || constant(g_, n.inputs[2]) == nullptr ||
        (n.inputs.size() > 4 && !n.inputs[4].empty() && constant(g_, n.inputs[4]) == nullptr)) {
      return false;
    }
    const std::vector<double> a = to_doubles(*axes);
    if (a.size() != 1 || (a[0] != 1 && a[0] != -3)) return false;
    Node slice = n;
    slice.inputs[0] = nhwc_of_[n.inputs[0]];
    slice.inputs[3] = add_constant(g_, n.name + "_nhwc_axes", int64_tensor({3}));
    shape_constants_.insert(slice.inputs[3]);
    const std::string twin = fresh(n.outputs[0] + "_nhwc");
    slice.outputs = {twin};
    add_converted(n, std::move(slice), twin, *y_shape, " -> NHWC (axis 3)");
    return true;
  }

  // The node reading `value` alone (no other reader, not a graph output) when it is the ONNX op `op_type`.
  std::optional<std::size_t> only_reader(const std::string& value, const char* op_type) const {
    if (original_uses_.is_graph_output(value) || original_uses_.read_by_subgraph(value)) return std::nullopt;
    const auto& readers = original_uses_.readers(value);
    if (readers.size() != 1 || !is_onnx(g_.nodes[readers[0]], op_type)) return std::nullopt;
    return readers[0];
  }

  // The channel shuffle of a channels-last value.
  bool convert_channel_shuffle(const Node& original, const Node& n, bool nhwc_input) {
    if (!nhwc_input || !is_onnx(n, "Reshape") || n.outputs.size() != 1) return false;
    const auto x = half_4d_shape(g_, original.inputs[0]);
    const auto split = static_shape(g_, original.outputs[0]);
    if (!x || !split || split->size() != 5) return false;
    const std::int64_t groups = (*split)[1];
    if ((*split)[0] != (*x)[0] || groups * (*split)[2] != (*x)[1] || (*split)[3] != (*x)[2] || (*split)[4] != (*x)[3]) {
      return false;
    }
    const auto t = only_reader(original.outputs[0], "Transpose");
    if (!t || g_.nodes[*t].attrs.get_ints("perm", {}) != std::vector<std::int64_t>{0, 2, 1, 3, 4}) return false;
    const auto r = only_reader(g_.nodes[*t].outputs[0], "Reshape");
    const std::string& y = r ? g_.nodes[*r].outputs[0] : std::string();
    const auto y_shape = r ? half_4d_shape(g_, y) : std::nullopt;
    if (!y_shape || *y_shape != *x || original_uses_.is_graph_output(y)) return false;
    const std::vector<std::int64_t>& s = *x;  // [N, C, H, W]
    const std::string split_twin = fresh(n.outputs[0] + "_nhwc"), moved = fresh(n.outputs[0] + "_nhwc_shuffled");
    reshape_node(nhwc_of_[n.inputs[0]], split_twin, {s[0], s[2], s[3], groups, s[1] / groups});
    nodes_.push_back(transpose_node(fresh(n.name + "_nhwc"), split_twin, moved, {0, 1, 2, 4, 3}));
    const std::string twin = fresh(y + "_nhwc");
    reshape_node(moved, twin, detail::nchw_to_nhwc(s));
    folded_.insert(g_.nodes[*t].outputs[0]);
    folded_.insert(y);
    back_to_nchw(y, twin, s);
    result_.notes.push_back(detail::str_cat(describe(n), ", ", describe(g_.nodes[*t]), ", ", describe(g_.nodes[*r]),
                                            " (a channel shuffle of ", groups, " groups) -> NHWC"));
    ++result_.rewrites;
    return true;
  }

  // An int8 convolution for the tensor cores (Note [Channels-last int8 convolutions]): layout=NHWC with an OHWI
  // weight. One whose output shape is not known stays as it is.
  bool convert_qconv(const Node& original, const Node& n) {
    if (!convertible_qconv(g_, original)) return false;
    const auto y_shape = static_shape(g_, n.outputs[0]);
    if (!y_shape || y_shape->size() != 4) {
      nodes_.push_back(n);
      return true;
    }
    Node conv = n;
    conv.inputs[0] = to_nhwc(n.inputs[0]);
    replaced_weights_.insert(n.inputs[1]);
    conv.inputs[1] = add_constant(g_, n.inputs[1] + "_ohwi", ohwi_from_oihw(*constant(g_, n.inputs[1])));
    const std::string twin = fresh(n.outputs[0] + "_nhwc");
    conv.outputs = {twin};
    conv.attrs.set("layout", std::string("NHWC"));
    add_converted(n, std::move(conv), twin, *y_shape, " -> NHWC (int8, tensor cores)");
    return true;
  }

  // A pool whose input is already channels-last follows it.
  bool follow_pool(const Node& n, bool nhwc_input) {
    if (!nhwc_input || n.outputs.empty()) return false;
    const auto y_shape = half_4d_shape(g_, n.outputs[0]);
    Node pool;
    const std::string twin = y_shape ? fresh(n.outputs[0] + "_nhwc") : std::string();
    if (!y_shape || !nhwc_pool(n, nhwc_of_[n.inputs[0]], twin, &pool)) return false;
    add_converted(n, std::move(pool), twin, *y_shape, " -> NHWC");
    return true;
  }

  // The exporters' permutes (Note [Layouts propagate]).
  bool fold_transpose(const Node& original, const Node& n, bool nhwc_input) {
    if (!is_onnx(n, "Transpose") || n.outputs.size() != 1 || !half_4d_shape(g_, original.inputs[0])) return false;
    const auto perm = n.attrs.get_ints("perm", {});
    const std::string& y = n.outputs[0];
    if (perm == std::vector<std::int64_t>{0, 2, 3, 1} && nhwc_input && !original_uses_.is_graph_output(y) &&
        !original_uses_.read_by_subgraph(y)) {
      renamed_[y] = nhwc_of_[n.inputs[0]];
      result_.notes.push_back(detail::str_cat(describe(n), " -> its input's channels-last twin"));
      ++result_.rewrites;
      return true;
    }
    if (perm == std::vector<std::int64_t>{0, 3, 1, 2} && nhwc_of_.count(y) == 0) {
      nodes_.push_back(n);
      nhwc_of_[y] = n.inputs[0];
      back_values_.insert(y);
      return true;
    }
    return false;
  }

  // Note [Per-sample normalizations are layout-free]: whether `shape` is flat for `batch` ([N, 1, ..., 1, M], rank
  // 2 or more) with M = `per_sample` elements.
  static bool flat_shape(const std::vector<std::int64_t>& shape, std::int64_t batch, std::int64_t per_sample) {
    if (shape.size() < 2 || shape.front() != batch || shape.back() != per_sample) return false;
    return std::all_of(shape.begin() + 1, shape.end() - 1, [](std::int64_t d) { return d == 1; });
  }

  // Whether node `m` of a flat chain maps its flat input `value` to a flat output, treating every element of a
  // sample alike: a LayerNormalization over the flat axis with one-element (or no) scale and bias, an elementwise op
  // whose other operands have one element, or a Reshape to another flat shape.
  bool flat_step(const Node& m, const std::string& value, std::int64_t batch, std::int64_t per_sample) const {
    const auto y = static_shape(g_, m.outputs.empty() ? std::string() : m.outputs[0]);
    if (!y || !flat_shape(*y, batch, per_sample) || m.inputs.empty()) return false;
    const auto one_element = [&](const std::string& v) {
      const auto s = static_shape(g_, v);
      return s && internal::numel_of(*s) == 1;
    };
    if (is_onnx(m, "Reshape")) return m.inputs[0] == value;
    if (m.op_type == "LayerNormalization" && (m.domain == kXpurtDomain || is_onnx(m, "LayerNormalization"))) {
      if (m.inputs[0] != value) return false;
      const auto x = static_shape(g_, value);
      if (!x || m.attrs.has("affine_run") || m.attrs.get_int("row_affine", 0) != 0) return false;
      const std::int64_t rank = static_cast<std::int64_t>(x->size());
      std::int64_t axis = m.attrs.get_int("axis", -1);
      axis = axis < 0 ? axis + rank : axis;
      for (std::size_t k = 1; k < m.outputs.size(); ++k) {  // the mean and inverse deviation: per sample anyway,
        if (!m.outputs[k].empty() && !original_uses_.unused(m.outputs[k])) return false;  // but not made here
      }
      return axis >= 1 && axis < rank &&
             std::all_of(m.inputs.begin() + 1, m.inputs.end(), [&](const std::string& v) {
               return v.empty() || one_element(v);
             });
    }
    if (!layout_free(m)) return false;
    for (std::size_t k = 0; k < m.inputs.size(); ++k) {
      if (m.inputs[k].empty() || m.inputs[k] == value) continue;
      if (!one_element(m.inputs[k])) return false;
    }
    return std::count(m.inputs.begin(), m.inputs.end(), value) == 1;
  }

  // The first Reshape of a flat chain over a channels-last value (Note [Per-sample normalizations are layout-free]):
  // the chain is checked to its end, this Reshape flattens the twin, and the chain's last Reshape is marked for
  // close_flat_chain. The nodes between stay as they are (their values are flat either way).
  bool open_flat_chain(const Node& original, const Node& n, bool nhwc_input) {
    if (!nhwc_input || !is_onnx(n, "Reshape") || n.outputs.size() != 1) return false;
    const auto x = half_4d_shape(g_, original.inputs[0]);
    const auto y = static_shape(g_, original.outputs[0]);
    if (!x) return false;
    const std::int64_t batch = (*x)[0], per_sample = (*x)[1] * (*x)[2] * (*x)[3];
    if (!y || !flat_shape(*y, batch, per_sample)) return false;
    std::string value = original.outputs[0];
    for (int steps = 0; steps < 16; ++steps) {
      if (original_uses_.is_graph_output(value) || original_uses_.read_by_subgraph(value)) return false;
      const auto& readers = original_uses_.readers(value);
      if (readers.size() != 1) return false;
      const Node& m = g_.nodes[readers[0]];
      const auto end = is_onnx(m, "Reshape") && m.outputs.size() == 1 ? half_4d_shape(g_, m.outputs[0]) : std::nullopt;
      if (end && *end == *x && m.inputs[0] == value) {
        if (steps == 0) return false;  // a Reshape there and back: nothing between to run channels-last
        flat_ends_.insert(m.outputs[0]);
        Node flat = n;
        if (n.inputs.size() > 1) replaced_weights_.insert(n.inputs[1]);  // removed where nothing else reads it
        flat.inputs = {nhwc_of_[n.inputs[0]], add_constant(g_, n.name + "_flat_shape", int64_tensor(*y))};
        shape_constants_.insert(flat.inputs[1]);
        result_.notes.push_back(detail::str_cat(describe(n), " ... ", describe(m), " (a per-sample chain of ", steps,
                                                " nodes) -> over NHWC"));
        nodes_.push_back(std::move(flat));
        ++result_.rewrites;
        return true;
      }
      if (!flat_step(m, value, batch, per_sample)) return false;
      value = m.outputs[0];
    }
    return false;
  }

  // The last Reshape of a flat chain that open_flat_chain took: it makes the twin of its NCHW output.
  bool close_flat_chain(const Node& original, const Node& n) {
    if (original.outputs.size() != 1 || flat_ends_.count(original.outputs[0]) == 0) return false;
    const std::vector<std::int64_t> nchw = *half_4d_shape(g_, original.outputs[0]);  // the chain's input's shape
    const std::string twin = fresh(n.outputs[0] + "_nhwc");
    Node reshape = n;
    if (n.inputs.size() > 1) replaced_weights_.insert(n.inputs[1]);
    reshape.inputs = {n.inputs[0],
                      add_constant(g_, n.name + "_nhwc_shape", int64_tensor(detail::nchw_to_nhwc(nchw)))};
    shape_constants_.insert(reshape.inputs[1]);
    reshape.outputs = {twin};
    nodes_.push_back(std::move(reshape));
    back_to_nchw(n.outputs[0], twin, nchw);
    return true;
  }

  // The squeeze of a squeeze-excitation: the mean over H and W.
  bool convert_reduce_mean(const Node& original, const Node& n, bool nhwc_input) {
    if (!is_onnx(n, "ReduceMean") || !nhwc_input || n.outputs.size() != 1) return false;
    auto axes = constant_axes(g_, n, 18);
    const auto x_shape = half_4d_shape(g_, original.inputs[0]);
    if (!axes || !x_shape) return false;
    std::set<std::int64_t> normalized;
    for (std::int64_t a : *axes) normalized.insert(a < 0 ? a + 4 : a);
    const bool keep = n.attrs.get_int("keepdims", 1) != 0;
    const auto y_shape = static_shape(g_, n.outputs[0]);
    if (normalized != std::set<std::int64_t>{2, 3} || !y_shape) return false;
    Node mean = n;
    mean.inputs = {nhwc_of_[n.inputs[0]]};
    if (g_.opset(n.domain) >= 18) {
      mean.inputs.push_back(add_constant(g_, n.name + "_hw_axes", int64_tensor({1, 2})));
    } else {
      mean.attrs.set("axes", std::vector<std::int64_t>{1, 2});
    }
    // keepdims=0: [N, C] either way.
    const std::string twin = keep ? fresh(n.outputs[0] + "_nhwc") : n.outputs[0];
    mean.outputs = {twin};
    result_.notes.push_back(detail::str_cat(describe(n), " -> over axes 1, 2 of NHWC"));
    nodes_.push_back(std::move(mean));
    if (keep) back_to_nchw(n.outputs[0], twin, *y_shape);
    ++result_.rewrites;
    return true;
  }

  // Elementwise ops with a channels-last operand and none that would need a Transpose.
  bool convert_elementwise(const Node& original, const Node& n) {
    if (!layout_free(n)) return false;
    // Any dtype: the twins of a quantized model are int8 and float32 values too (Note [Quantized values keep their
    // layout]); a float32 model has no twins to propagate.
    auto y_shape = static_shape(g_, n.outputs[0]);
    if (y_shape && y_shape->size() != 4) y_shape.reset();
    bool any_twin = false, feasible = y_shape.has_value();
    std::vector<Operand> kinds(n.inputs.size(), Operand::kSame);  // an absent optional input stays absent
    for (std::size_t i = 0; feasible && i < n.inputs.size(); ++i) {
      if (n.inputs[i].empty()) continue;
      kinds[i] = operand_kind(n.inputs[i], original.inputs[i], *y_shape);
      any_twin = any_twin || kinds[i] == Operand::kTwin;
      feasible = kinds[i] != Operand::kTransposed;
    }
    if (!feasible || !(any_twin || readers_convert(original))) return false;
    Node converted = n;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const std::string& in = n.inputs[i];
      if (kinds[i] == Operand::kTwin || kinds[i] == Operand::kView) {
        converted.inputs[i] = to_nhwc(in);
      } else if (kinds[i] == Operand::kConstant) {
        auto it = constant_twins_.find(in);
        if (it == constant_twins_.end()) {
          it = constant_twins_.emplace(in, add_constant(g_, in + "_nhwc", channels_last_constant(*constant(g_, in))))
                   .first;
        }
        converted.inputs[i] = it->second;
      }
    }
    const std::string twin = fresh(n.outputs[0] + "_nhwc");
    converted.outputs = {twin};
    add_converted(n, std::move(converted), twin, *y_shape, " -> NHWC");
    return true;
  }

  Graph& g_;
  PassResult& result_;
  // Uses of the original graph: an exporter's Transpose folds only where its output is not a graph output or read
  // by a subgraph (its name must stay).
  const Uses original_uses_;
  std::vector<Node> nodes_;                                 // the rewritten nodes, in order
  std::unordered_map<std::string, std::string> nhwc_of_;   // an NCHW value -> its channels-last twin
  std::set<std::string> back_values_;                       // outputs of the Transposes back to NCHW made here
  std::set<std::string> replaced_weights_;
  std::set<std::string> shape_constants_;                   // of the Reshapes back to NCHW
  std::set<std::string> taken_names_;                       // names made here (not in g until the end)
  std::unordered_map<std::string, std::string> renamed_;   // a folded Transpose's output -> the twin it equals
  std::unordered_map<std::string, std::string> constant_twins_;  // [C, 1, 1] constants -> [1, 1, C]
  std::set<std::string> folded_;  // outputs of a channel shuffle's Transpose and last Reshape, made channels-last
  // The outputs of the last Reshapes of flat chains (Note [Per-sample normalizations are layout-free]).
  std::set<std::string> flat_ends_;
};

}  // namespace

PassResult nhwc_layout(Graph& g, const PassContext& ctx) {
  PassResult result{"nhwc_layout", 0, {}};
  if (!ctx.device.is_cuda()) return result;
  NhwcRewriter rewriter(g, result);
  // Copies, not moves: fresh() asks the graph for unused names, so every node must stay in g.nodes until the end.
  for (const Node& original : g.nodes) rewriter.rewrite(original);
  rewriter.finish();
  return result;
}

}  // namespace xpuruntime::passes
