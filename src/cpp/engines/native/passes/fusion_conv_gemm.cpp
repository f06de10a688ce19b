// Fusions onto the registry's conv2d and linear ops: conv_fusion -> com.xpuruntime:FusedConv, gemm_fusion ->
// com.xpuruntime:Linear (see passes.h, docs/native_engine.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "core/half.h"
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

// The other input of `add` (which reads `value`) when it is a residual: of `value`'s shape and of `dtype`, and the
// sum of the same shape (no broadcast); "" otherwise.
std::string residual_operand(const Graph& g, const Node& add, const std::string& value, DType dtype) {
  const std::string z = other_input(add, value);
  auto z_type = z.empty() ? std::nullopt : value_type(g, z);
  auto own_type = value_type(g, value);
  auto add_type = value_type(g, add.outputs[0]);
  const bool fits = z_type && own_type && z_type->dtype == dtype && same_shape(*z_type, *own_type) &&
                    (!add_type || same_shape(*add_type, *own_type));
  return fits ? z : std::string();
}

// [+ residual]: when the only reader of `out` is an Add of a residual (residual_operand), the Add joins `pattern` and
// `parts`, `out` becomes the sum, and the residual is returned; "" otherwise.
std::string take_residual_add(const Graph& g, const Uses& uses, const Rewriter& rw, DType dtype, std::string& out,
                              std::vector<std::size_t>& pattern, std::vector<std::string>& parts) {
  auto ai = sole_reader(g, uses, rw, out, "Add");
  if (!ai) return {};
  const Node& add = g.nodes[*ai];
  std::string residual = residual_operand(g, add, out, dtype);
  if (residual.empty()) return {};
  pattern.push_back(*ai);
  parts.push_back(describe(add) + " (residual)");
  out = add.outputs[0];
  return residual;
}

// The 2-D weight `w` ([N, K], or [K, N] when `kn`) with each output feature's elements times gamma[feature],
// rounded once to w's dtype; nullopt when a scaled element's magnitude would exceed `limit` or w is not of a float
// type. 16- and 32-bit weights are scaled in float (float64 ones in double), float16 ones eight at a time where the
// CPU converts halves (F16C, the same round-to-nearest-even as detail::float_to_half): ConvNeXt-T's 13 M layer-scaled
// weights took 200 ms of every plan build through doubles (Note [Build phases]).
template <typename T, typename F, typename Load, typename Store>
bool scale_rows(const T* from, T* to, std::int64_t rows, std::int64_t cols, bool per_column,
                const std::vector<F>& gamma, F limit, Load load, Store store) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const F v = load(from[r * cols + c]) * gamma[static_cast<std::size_t>(per_column ? c : r)];
      if (!(std::fabs(v) <= limit)) return false;
      to[r * cols + c] = store(v);
    }
  }
  return true;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// AVX with the OS saving its registers (__builtin_cpu_supports checks both) and F16C (CPUID leaf 1, ECX bit 29:
// clang's __builtin_cpu_supports does not know "f16c").
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  }();
  return has;
}

__attribute__((target("avx,f16c"))) bool scale_half_rows_f16c(const std::uint16_t* from, std::uint16_t* to,
                                                               std::int64_t rows, std::int64_t cols, bool per_column,
                                                               const std::vector<float>& gamma, float limit) {
  const __m256 bound = _mm256_set1_ps(limit);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const __m256 row_gamma = _mm256_set1_ps(gamma[static_cast<std::size_t>(per_column ? 0 : r)]);
    std::int64_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + r * cols + c));
      const __m256 g = per_column ? _mm256_loadu_ps(gamma.data() + c) : row_gamma;
      const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(halves), g);
      // |v| <= limit, false for NaN (ordered, non-signalling).
      if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), bound, _CMP_LE_OQ)) != 0xff) return false;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to + r * cols + c), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; c < cols; ++c) {
      const float v = xpuruntime::detail::half_to_float(from[r * cols + c]) *
                      gamma[static_cast<std::size_t>(per_column ? c : r)];
      if (!(std::fabs(v) <= limit)) return false;
      to[r * cols + c] = xpuruntime::detail::float_to_half(v);
    }
  }
  return true;
}
#endif

std::optional<Tensor> scale_features(const Tensor& w, bool kn, const std::vector<double>& gamma, double limit) {
  const Tensor src = w.contiguous();
  Tensor out = Tensor::empty(w.shape(), w.dtype(), Device::cpu());
  const std::int64_t rows = w.shape()[0], cols = w.shape()[1];
  const std::vector<float> gamma32(gamma.begin(), gamma.end());
  const auto limit32 = static_cast<float>(std::min(limit, 3.40e38));
  bool ok = false;
  switch (w.dtype()) {
    case DType::kFloat32:
      ok = scale_rows(static_cast<const float*>(src.data_ptr()), static_cast<float*>(out.data_ptr()), rows, cols, kn,
                      gamma32, limit32, [](float v) { return v; }, [](float v) { return v; });
      break;
    case DType::kFloat64:
      ok = scale_rows(static_cast<const double*>(src.data_ptr()), static_cast<double*>(out.data_ptr()), rows, cols,
                      kn, gamma, limit, [](double v) { return v; }, [](double v) { return v; });
      break;
    case DType::kFloat16: {
      const auto* from = static_cast<const std::uint16_t*>(src.data_ptr());
      auto* to = static_cast<std::uint16_t*>(out.data_ptr());
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      if (cpu_has_f16c()) {
        ok = scale_half_rows_f16c(from, to, rows, cols, kn, gamma32, limit32);
        break;
      }
#endif
      ok = scale_rows(from, to, rows, cols, kn, gamma32, limit32,
                      [](std::uint16_t v) { return xpuruntime::detail::half_to_float(v); },
                      [](float v) { return xpuruntime::detail::float_to_half(v); });
      break;
    }
    case DType::kBFloat16:
      ok = scale_rows(static_cast<const std::uint16_t*>(src.data_ptr()), static_cast<std::uint16_t*>(out.data_ptr()),
                      rows, cols, kn, gamma32, limit32,
                      [](std::uint16_t v) { return xpuruntime::detail::bfloat16_to_float(v); },
                      [](float v) { return xpuruntime::detail::float_to_bfloat16(v); });
      break;
    default:
      break;
  }
  if (!ok) return std::nullopt;
  return out;
}

std::vector<double> add_values(std::vector<double> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

// Explicit pads of a Conv over kernel.size() spatial axes (the begins, then the ends: [top, left, bottom, right] in
// 2-D); nullopt when auto_pad needs unknown input sizes.
std::optional<std::vector<std::int64_t>> resolve_pads(const Node& conv, const std::vector<Dim>& x_shape,
                                                      const std::vector<std::int64_t>& kernel,
                                                      const std::vector<std::int64_t>& strides,
                                                      const std::vector<std::int64_t>& dilations) {
  const std::size_t dims = kernel.size();
  const std::string auto_pad = conv.attrs.get_string("auto_pad", "NOTSET");
  if (auto_pad == "NOTSET") {
    auto pads = conv.attrs.get_ints("pads", std::vector<std::int64_t>(2 * dims, 0));
    if (pads.size() != 2 * dims) return std::nullopt;
    return pads;
  }
  if (auto_pad == "VALID") return std::vector<std::int64_t>(2 * dims, 0);
  if (auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER") return std::nullopt;
  std::vector<std::int64_t> pads(2 * dims, 0);
  for (std::size_t k = 0; k < dims; ++k) {
    const Dim& in = x_shape[2 + k];
    if (!in.known()) return std::nullopt;
    const std::int64_t out = (in.value + strides[k] - 1) / strides[k];
    const std::int64_t total =
        std::max<std::int64_t>(0, (out - 1) * strides[k] + (kernel[k] - 1) * dilations[k] + 1 - in.value);
    const std::int64_t small = total / 2;
    pads[k] = auto_pad == "SAME_UPPER" ? small : total - small;
    pads[k + dims] = total - pads[k];
  }
  return pads;
}

// The activation after a node's output `value`: Relu (ONNX), Gelu (ONNX opset 20, or com.xpuruntime's); sets
// `activation` and returns the node index.
std::optional<std::size_t> activation_after(const Graph& g, const Uses& uses, const Rewriter& rw,
                                            const std::string& value, bool allow_gelu, std::string& activation) {
  const auto& readers = uses.readers(value);
  if (readers.size() != 1 || !uses.only_reader(value, readers[0]) || rw.taken(readers[0])) return std::nullopt;
  const Node& n = g.nodes[readers[0]];
  if (is_onnx(n, "Relu")) {
    activation = "relu";
    return readers[0];
  }
  const auto gelu = allow_gelu ? gelu_activation(n) : std::nullopt;
  if (!gelu) return std::nullopt;
  activation = *gelu;
  return readers[0];
}

// A depthwise convolution's SiLU (Mul(y, Sigmoid(y)), how exporters write it) or HardSwish after `value`, read by
// nothing else; sets `activation` and returns the nodes. cuda_raw's depthwise kernels and the cpu kernel apply them
// (cuDNN runs them as a pass after its epilogue, so other convolutions keep them as nodes, which can join their
// readers' fused kernels): EfficientNet's and MobileNetV3's activation
// after every depthwise convolution was a kernel of its own.
std::vector<std::size_t> depthwise_activation_after(const Graph& g, const Uses& uses, const Rewriter& rw,
                                                    const std::string& value, std::string& activation) {
  if (auto hi = sole_reader(g, uses, rw, value, "HardSwish")) {
    activation = "hard_swish";
    return {*hi};
  }
  const auto& readers = uses.readers(value);
  if (readers.size() != 2 || uses.is_graph_output(value) || uses.read_by_subgraph(value)) return {};
  for (int first = 0; first < 2; ++first) {
    const std::size_t si = readers[first], mi = readers[1 - first];
    const Node& sigmoid = g.nodes[si];
    const Node& mul = g.nodes[mi];
    if (rw.taken(si) || rw.taken(mi) || !is_onnx(sigmoid, "Sigmoid") || !is_onnx(mul, "Mul")) continue;
    if (mul.inputs.size() != 2 || other_input(mul, value) != sigmoid.outputs[0] ||
        !uses.only_reader(sigmoid.outputs[0], mi)) {
      continue;
    }
    activation = "silu";
    return {si, mi};
  }
  return {};
}

// Note [GELU after a convolution]
// SegFormer's Mix-FFN (a depthwise 3x3 between its two Linears) and MaxViT's MBConv follow a depthwise convolution
// with GELU, which was a kernel and a pass over the convolution's output of its own. cuda_raw's depthwise kernels
// apply GELU (erf or tanh form) in their epilogue and cuDNN after its own (Note [cuDNN conv activations after the
// epilogue]), timed against each other, so a depthwise convolution takes the GELU that only it reads (first moved
// before the view chain that SegFormer's flatten(2).transpose(1, 2) puts between them, Note [Unary ops move before
// view chains]; only activations whose chain starts at a convolution move this early). On the CPU
// every convolution does (the cpu kernel's epilogue: wav2vec 2.0's and Whisper's convolutional stems); a CUDA plan
// keeps the GELU after other convolutions, where cuDNN's pass would cost what the node costs.

// Note [ReLU6 in the CPU convolution's epilogue]
// MobileNetV2 (and its DeepLabV3 and SSDLite heads, EfficientNet-Lite) follow most convolutions with ReLU6, which
// PyTorch exports as Clip(x, 0, 6): a pass over the output of its own (5% of the tiny MobileNetV2's CPU run). The cpu
// kernel applies it in its epilogue ("relu6"). On CUDA a depthwise convolution takes it too: cuda_raw's depthwise
// kernels apply it in their epilogue and cuDNN in its pass after (Note [cuDNN conv activations after the epilogue]),
// timed against each other; MobileNetV2's 17 depthwise ReLU6 were half of the 35 Clip nodes that took 21.9% of its
// batch-1 run on an H100 (2026-12-06). Other CUDA convolutions keep the Clip: cuDNN's fused epilogue is ReLU only (its
// pass after costs what the node costs) and a pointwise convolution run as a GEMM (Note [Pointwise convolutions as
// GEMMs]) takes none or relu.
std::optional<std::size_t> relu6_after(const Graph& g, const Uses& uses, const Rewriter& rw, const std::string& value) {
  auto ci = sole_reader(g, uses, rw, value, "Clip");
  if (!ci) return std::nullopt;
  const Node& clip = g.nodes[*ci];
  std::optional<double> lo, hi;
  if (g.opset("") < 11) {
    lo = clip.attrs.get_float("min", -3.4028234663852886e38);
    hi = clip.attrs.get_float("max", 3.4028234663852886e38);
  } else {
    lo = clip.inputs.size() > 1 && !clip.inputs[1].empty() ? scalar_constant(g, clip.inputs[1]) : std::nullopt;
    hi = clip.inputs.size() > 2 && !clip.inputs[2].empty() ? scalar_constant(g, clip.inputs[2]) : std::nullopt;
  }
  if (!lo || !hi || *lo != 0.0 || *hi != 6.0) return std::nullopt;
  return ci;
}

}  // namespace

// Note [3-D convolutions fused]
// A 3-D Conv (video networks: R3D's [B, 3, T, H, W] stacks) ran as cuDNN's convolution, then cudnnAddTensor for its
// bias (a generic NCDHW kernel: 46 us a call on [16, 64, 16, 56, 56] float16, H100), then the residual Add and the
// ReLU as nodes of their own: about 1 ms of R3D-18's 4 ms at batch 16 against torch.compile's one fused pass. So
// conv_fusion takes them as it takes 2-D ones: bias (and a per-channel constant Add), residual and ReLU join one
// FusedConv over a 5-D weight, lowered to conv3d, whose cuDNN plan runs them in the convolution's epilogue
// (cudnnConvolutionBiasActivationForward, as conv2d's does) and whose cpu kernel applies them after the reference
// convolution. Other activations stay nodes (cuDNN's fused forward has ReLU and identity only), and so does a 3-D
// convolution without a bias (the fused forward needs one; BatchNorm folding gives every one of R3D's).

PassResult conv_fusion(Graph& g, const PassContext& ctx) {
  PassResult result{"conv_fusion", 0, {}};
  // Note [GELU after a convolution]: an activation read through a view chain from a convolution comes next to it.
  result.rewrites += move_activations_before_views(
      g, result.notes, [](const Node* producer) { return producer != nullptr && is_onnx(*producer, "Conv"); });
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t ci = 0; ci < g.nodes.size(); ++ci) {
    const Node& conv = g.nodes[ci];
    if (!is_onnx(conv, "Conv") || rw.taken(ci) || conv.inputs.size() < 2 || conv.outputs.size() != 1) continue;
    const Tensor* w = constant(g, conv.inputs[1]);
    auto x_type = value_type(g, conv.inputs[0]);
    if (w == nullptr || (w->dim() != 4 && w->dim() != 5) || !x_type || !x_type->has_shape ||
        x_type->shape.size() != static_cast<std::size_t>(w->dim())) {
      continue;
    }
    const bool three_d = w->dim() == 5;  // Note [3-D convolutions fused]
    const std::size_t spatial = three_d ? 3 : 2;
    const DType dtype = x_type->dtype;
    if (!is_fusable_float(dtype) || w->dtype() != dtype) continue;
    const Tensor* b = conv.has_input(2) ? constant(g, conv.inputs[2]) : nullptr;
    if (conv.has_input(2) && b == nullptr) continue;
    const std::int64_t out_channels = w->shape()[0];
    if (b != nullptr && (b->numel() != out_channels || b->dtype() != dtype)) continue;
    const std::vector<std::int64_t> kernel(w->shape().begin() + 2, w->shape().end());
    if (conv.attrs.has("kernel_shape") && conv.attrs.get_ints("kernel_shape", {}) != kernel) continue;
    const auto strides = conv.attrs.get_ints("strides", std::vector<std::int64_t>(spatial, 1));
    const auto dilations = conv.attrs.get_ints("dilations", std::vector<std::int64_t>(spatial, 1));
    if (strides.size() != spatial || dilations.size() != spatial) continue;
    auto pads = resolve_pads(conv, x_type->shape, kernel, strides, dilations);
    if (!pads) continue;

    std::vector<std::size_t> pattern = {ci};
    std::vector<std::string> parts = {describe(conv)};
    std::string out = conv.outputs[0];
    std::optional<std::vector<double>> bias;
    if (b != nullptr) bias = to_doubles(*b);
    bool bias_changed = false;
    // [+ per-channel constant]
    if (auto ai = sole_reader(g, uses, rw, out, "Add")) {
      const Tensor* c = constant(g, other_input(g.nodes[*ai], out));
      auto values = c ? per_channel_values(*c, out_channels, spatial, static_cast<std::int64_t>(spatial) + 2)
                      : std::nullopt;
      if (values) {
        bias = bias ? add_values(*bias, *values) : *values;
        bias_changed = true;
        pattern.push_back(*ai);
        parts.push_back(describe(g.nodes[*ai]) + " (bias)");
        out = g.nodes[*ai].outputs[0];
      }
    }
    // cuDNN's fused forward needs a bias; a 3-D convolution without one stays as it is (Note [3-D convolutions fused]).
    if (three_d && !bias) continue;
    // [+ residual of the output's shape]
    const std::string residual = take_residual_add(g, uses, rw, dtype, out, pattern, parts);
    std::string activation = "none";
    const std::int64_t group = conv.attrs.get_int("group", 1);
    const bool depthwise = !three_d && group > 1 && group == out_channels && w->shape()[1] == 1;
    const bool more_activations = !three_d && (depthwise || !ctx.device.is_cuda());
    std::optional<std::size_t> relu6;  // Note [ReLU6 in the CPU convolution's epilogue]
    std::optional<std::size_t> gelu;
    if (auto ri = activation_after(g, uses, rw, out, /*allow_gelu=*/false, activation)) {
      pattern.push_back(*ri);
      parts.push_back(describe(g.nodes[*ri]));
      out = g.nodes[*ri].outputs[0];
    } else if (more_activations && (relu6 = relu6_after(g, uses, rw, out))) {
      activation = "relu6";
      pattern.push_back(*relu6);
      parts.push_back(describe(g.nodes[*relu6]) + " (ReLU6)");
      out = g.nodes[*relu6].outputs[0];
    } else if (more_activations && (gelu = activation_after(g, uses, rw, out, /*allow_gelu=*/true, activation))) {
      pattern.push_back(*gelu);  // Note [GELU after a convolution]
      parts.push_back(describe(g.nodes[*gelu]));
      out = g.nodes[*gelu].outputs[0];
    } else if (depthwise) {
      const auto nodes = depthwise_activation_after(g, uses, rw, out, activation);
      for (std::size_t k : nodes) {
        pattern.push_back(k);
        parts.push_back(describe(g.nodes[k]));
      }
      if (!nodes.empty()) out = g.nodes[nodes.back()].outputs[0];
    }

    Node fused;
    fused.name = conv.name;
    fused.domain = kXpurtDomain;
    fused.op_type = "FusedConv";
    std::string bias_name;
    if (bias) {
      bias_name = bias_changed ? add_constant(g, conv.name + "_bias", from_doubles({out_channels}, dtype, *bias))
                               : conv.inputs[2];
      if (!bias_changed && b->shape() != std::vector<std::int64_t>{out_channels}) {
        bias_name = add_constant(g, conv.name + "_bias", from_doubles({out_channels}, dtype, *bias));
      }
    }
    fused.inputs = {conv.inputs[0], conv.inputs[1], bias_name, residual};
    while (!fused.inputs.empty() && fused.inputs.back().empty()) fused.inputs.pop_back();
    fused.outputs = {out};
    fused.attrs.set("strides", strides);
    fused.attrs.set("pads", *pads);
    fused.attrs.set("dilations", dilations);
    fused.attrs.set("group", conv.attrs.get_int("group", 1));
    fused.attrs.set("activation", activation);
    std::string note = "fused ";
    for (std::size_t k = 0; k < parts.size(); ++k) note += (k ? " + " : "") + parts[k];
    note += " -> FusedConv '" + fused.name + "'";
    rw.replace(pattern, {std::move(fused)}, std::move(note));
  }
  rw.apply(result);
  return result;
}

// Note [Two residuals into two GEMMs]
// Parallel attention and MLP blocks (GPT-NeoX/Pythia, GPT-J, Falcon, Phi-2: x + attn(ln(x)) + mlp(ln(x))) add two
// GEMM outputs and the stream: after the fusion above one Linear takes the other's output as its residual, and the
// stream is still an Add of its own, a kernel per layer. Since a + (b + y) = (a + b) + y, the other Linear (no
// residual, no activation, its output read only as that residual) takes y as its residual, and the first Linear
// writes the Add's sum: the Add goes. Both Linears then run where the Add was (after y exists).
int fold_second_residuals(Graph& g, PassResult& result) {
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t ai = 0; ai < g.nodes.size(); ++ai) {
    const Node& add = g.nodes[ai];
    if (!is_onnx(add, "Add") || add.inputs.size() != 2 || rw.taken(ai)) continue;
    for (std::size_t side = 0; side < 2; ++side) {
      const std::string& a = add.inputs[side];
      auto first = uses.producer(a);
      if (!first || rw.taken(*first) || !uses.only_reader(a, ai)) continue;
      const Node& outer = g.nodes[*first];
      if (outer.domain != kXpurtDomain || outer.op_type != "Linear" || outer.inputs.size() < 4 ||
          outer.inputs[3].empty() || outer.attrs.get_string("activation", "none") != "none") {
        continue;
      }
      const std::string& r = outer.inputs[3];
      auto second = uses.producer(r);
      if (!second || rw.taken(*second) || !uses.only_reader(r, *first)) continue;
      const Node& inner = g.nodes[*second];
      if (inner.domain != kXpurtDomain || inner.op_type != "Linear" ||
          (inner.inputs.size() > 3 && !inner.inputs[3].empty()) ||
          inner.attrs.get_string("activation", "none") != "none") {
        continue;
      }
      auto dtype = value_dtype(g, a);
      const std::string y = dtype ? residual_operand(g, add, a, *dtype) : std::string();
      if (y.empty() || y == r) continue;  // (y cannot depend on a or r: the Add and outer are their only readers)
      Node inner_fused = inner;
      inner_fused.inputs.resize(4);  // an absent bias stays "" before the residual
      inner_fused.inputs[3] = y;
      Node outer_fused = outer;
      outer_fused.outputs = add.outputs;
      const std::string note = detail::str_cat(describe(add), " (", y, " + ", describe(inner), " + ", describe(outer),
                                               ") -> ", y, " the residual of ", describe(inner),
                                               ", whose sum is the residual of ", describe(outer));
      rw.replace({*second, *first, ai}, {std::move(inner_fused), std::move(outer_fused)}, note);
      break;
    }
  }
  return rw.apply(result);
}

// Note [Residual in the GEMM]
// Pre-LN transformers (GPT-2, ViT, Llama, Whisper) add every attention and MLP output to the residual stream:
// Add(x, Linear(h)), whose sum the next norm and the next Add both read, so no norm can take it. Each was a kernel of
// its own, 24 per GPT-2 forward, as long as a small GEMM at batch 1. The Linear takes the residual instead:
// cuBLASLt adds it as its C operand (beta = 1) in the same GEMM, before the bias and the activation epilogue (the
// registry op is act(x W + bias + residual)); the cublas kernel adds it after its GEMM. Only where no activation
// was fused, since the model adds after the activation.
PassResult gemm_fusion(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"gemm_fusion", 0, {}};
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t mi = 0; mi < g.nodes.size(); ++mi) {
    const Node& mm = g.nodes[mi];
    const bool is_matmul = is_onnx(mm, "MatMul");
    const bool is_gemm = is_onnx(mm, "Gemm");
    if ((!is_matmul && !is_gemm) || rw.taken(mi) || mm.inputs.size() < 2 || mm.outputs.size() != 1) continue;
    const Tensor* w = constant(g, mm.inputs[1]);
    auto x_dtype = value_dtype(g, mm.inputs[0]);
    if (w == nullptr || w->dim() != 2 || !x_dtype || !is_fusable_float(*x_dtype) || w->dtype() != *x_dtype) continue;
    const DType dtype = *x_dtype;
    std::string layout = "kn";
    std::string weight = mm.inputs[1];
    std::optional<std::vector<double>> bias;
    std::int64_t n_features = w->shape()[1];
    std::vector<std::size_t> pattern = {mi};
    std::vector<std::string> parts = {describe(mm)};
    if (is_gemm) {
      if (mm.attrs.get_int("transA", 0) != 0) continue;
      if (g.opset(mm.domain) < 7 && mm.attrs.get_int("broadcast", 0) == 0 && mm.has_input(2)) continue;
      const double alpha = mm.attrs.get_float("alpha", 1.0);
      const double beta = mm.attrs.get_float("beta", 1.0);
      if (mm.attrs.get_int("transB", 0) != 0) {
        layout = "nk";
        n_features = w->shape()[0];
      }
      if (mm.has_input(2)) {
        const Tensor* c = constant(g, mm.inputs[2]);
        auto values = c ? per_channel_values(*c, n_features, 0, 2) : std::nullopt;
        if (!values) continue;  // a C of shape [M, N] (or not constant) is not a bias
        for (double& v : *values) v *= beta;
        bias = *values;
      }
      if (alpha != 1.0) {
        std::vector<double> scaled = to_doubles(*w);
        for (double& v : scaled) v *= alpha;
        weight = add_constant(g, mm.inputs[1] + "_alpha", from_doubles(w->shape(), dtype, scaled));
      }
    }
    std::string out = mm.outputs[0];
    if (!bias) {
      if (auto ai = sole_reader(g, uses, rw, out, "Add")) {
        const Tensor* c = constant(g, other_input(g.nodes[*ai], out));
        auto x_type = value_type(g, mm.inputs[0]);
        const std::int64_t out_rank = x_type && x_type->has_shape
                                          ? std::max<std::int64_t>(static_cast<std::int64_t>(x_type->shape.size()), 1)
                                          : -1;
        auto values = c ? per_channel_values(*c, n_features, 0, out_rank) : std::nullopt;
        if (values) {
          bias = *values;
          pattern.push_back(*ai);
          parts.push_back(describe(g.nodes[*ai]) + " (bias)");
          out = g.nodes[*ai].outputs[0];
        }
      }
    }
    std::string activation = "none";
    std::optional<Node> reshape_after;  // Gemm -> Reshape -> activation: the Reshape moves after the Linear
    // The Linear takes the Reshape `si` and the node `reader` after it; the Reshape then writes `reader`'s output.
    const auto move_reshape_after = [&](std::size_t si, std::size_t reader, const std::string& role) {
      pattern.push_back(si);
      pattern.push_back(reader);
      parts.push_back(describe(g.nodes[si]));
      parts.push_back(describe(g.nodes[reader]) + role);
      Node moved = g.nodes[si];
      moved.outputs = {g.nodes[reader].outputs[0]};
      reshape_after = std::move(moved);
    };
    if (auto ri = activation_after(g, uses, rw, out, /*allow_gelu=*/true, activation)) {
      pattern.push_back(*ri);
      parts.push_back(describe(g.nodes[*ri]));
      out = g.nodes[*ri].outputs[0];
    } else if (auto si = sole_reader(g, uses, rw, out, "Reshape")) {
      // The exporters' 2-D Gemm of a 3-D activation is reshaped back before its GELU (GPT-2's Conv1D): an
      // elementwise activation commutes with the reshape, so the Linear applies it and the Reshape reads its output.
      const std::string& reshaped = g.nodes[*si].outputs[0];
      if (auto ai = activation_after(g, uses, rw, reshaped, /*allow_gelu=*/true, activation)) {
        move_reshape_after(*si, *ai, "");
      }
    }
    // [+ residual] (Note [Residual in the GEMM]), where no activation was fused.
    std::string residual;
    std::optional<Node> residual_view;  // the residual as the Linear's 2-D output, behind a Gemm's Reshape
    if (activation == "none" && !reshape_after) {
      residual = take_residual_add(g, uses, rw, dtype, out, pattern, parts);
      const auto si = residual.empty() ? sole_reader(g, uses, rw, out, "Reshape") : std::nullopt;
      if (si) {
        // GPT-2's Conv1D: a 2-D Gemm, reshaped back to [B, S, N], then the residual Add. The residual is read as
        // [B * S, N] (a view) and the Reshape moves after the Linear.
        const std::string& reshaped = g.nodes[*si].outputs[0];
        if (auto reshaped_add = sole_reader(g, uses, rw, reshaped, "Add")) {
          const std::string z = residual_operand(g, g.nodes[*reshaped_add], reshaped, dtype);
          if (!z.empty()) {
            residual_view = Node();
            residual_view->name = g.unique_name(mm.name + "_residual_2d");
            residual_view->op_type = "Reshape";
            residual_view->inputs = {z, add_constant(g, mm.name + "_residual_shape", int64_tensor({-1, n_features}))};
            residual = g.unique_name(z + "_2d");
            residual_view->outputs = {residual};
            move_reshape_after(*si, *reshaped_add, " (residual)");
          }
        }
      }
    }
    Node fused;
    fused.name = mm.name;
    fused.domain = kXpurtDomain;
    fused.op_type = "Linear";
    fused.inputs = {mm.inputs[0], weight};
    if (bias) fused.inputs.push_back(add_constant(g, mm.name + "_bias", from_doubles({n_features}, dtype, *bias)));
    if (!residual.empty()) {
      if (!bias) fused.inputs.push_back("");
      fused.inputs.push_back(residual);
    }
    fused.outputs = {out};
    fused.attrs.set("weight_layout", layout);
    fused.attrs.set("activation", activation);
    std::string note = "fused ";
    for (std::size_t k = 0; k < parts.size(); ++k) note += (k ? " + " : "") + parts[k];
    note += " -> Linear '" + fused.name + "'";
    std::vector<Node> replacement;
    if (residual_view) replacement.push_back(std::move(*residual_view));
    replacement.push_back(std::move(fused));
    if (reshape_after) {
      note += " + " + describe(*reshape_after);
      replacement.push_back(std::move(*reshape_after));
    }
    rw.replace(pattern, std::move(replacement), std::move(note));
  }
  rw.apply(result);
  fold_second_residuals(g, result);  // Note [Two residuals into two GEMMs]
  return result;
}

// Note [Feature maps through a Reshape]
// LeViT's every Linear is a LinearNorm: the GEMM over [B, N, C], then BatchNorm1d over its rows flattened to
// [B * N, C], which the exporter writes as a Reshape between the two; in a CUDA plan the norm is a Mul and an Add by
// per-feature constants (Note [Batch norms without a convolution become an affine map]), and with the Reshape in
// between neither joined the GEMM: one more bandwidth-bound kernel after each of LeViT's GEMMs. A Reshape
// that keeps the last axis (the features) commutes with a per-feature scale and shift, so this pass folds them
// into the Linear as it would without the Reshape, and the Reshape (a view) moves after the Linear.
//
// Note [Residuals through views]
// The residual Add may sit behind views too: LeViT's LinearNorm is followed by a second Reshape back to [B, N, C] and
// then the residual Add (5 Adds of the tiny export's 71 nodes were kernels of their own after the folding above).
// An Add of two tensors of one shape commutes with a Reshape applied to both, so the Linear takes the residual read
// in its own output's shape (a Reshape of the residual, a view) and every Reshape between the Linear and the Add
// becomes one Reshape after the Linear, to the Add's static shape. Unlike a per-feature constant the residual needs no
// axis kept in place: any chain of Reshapes with static shapes.

namespace {

// Whether the Reshapes of `chain` from Linear output `value` keep its `n_features` feature axis last and the chain's
// end is read by a Mul or an Add alone (what linear_epilogue_fusion folds per feature: Note [Feature maps through a
// Reshape]).
bool features_stay_last(const Graph& g, const Uses& uses, const Rewriter& rw, const std::string& value,
                        const ReshapeChain& chain, std::int64_t n_features) {
  if (chain.reshapes.empty()) return false;
  const auto before = static_shape(g, value);
  const auto after = static_shape(g, chain.end);
  if (!before || !after || before->empty() || after->empty() || before->back() != n_features ||
      after->back() != n_features) {
    return false;
  }
  return sole_reader(g, uses, rw, chain.end, "Mul") || sole_reader(g, uses, rw, chain.end, "Add");
}

}  // namespace

// Note [Layer scale in the GEMM]
// ConvNeXt (and CaiT, BEiT, DINOv2 blocks) end with layer scale and the residual: x + gamma * Linear(h), a per-feature
// constant gamma. The exporters put the block's closing permute between the Linear and the Mul, so gemm_fusion cannot
// see the pattern; once nhwc_layout has dropped the permute, Mul(gamma, Linear) + Add are one bandwidth-bound kernel
// per block (98 us of ConvNeXt-T's 1.36 ms at batch 16 on an H100). This pass scales the Linear's weight columns and
// bias by gamma at build time (gamma (x W + b) = x (W gamma) + b gamma) and hands the Add to the GEMM as its residual
// (Note [Residual in the GEMM]). The scaled weights are rounded once to the weights' dtype; a float16 gamma outside
// [2^-8, 2^8] or a scaled weight that would overflow keeps the Mul (ConvNeXt's untrained 1e-6 would push weights into
// float16's subnormals). A per-feature constant added after the Linear (or after its layer scale: MobileBERT's NoNorm,
// x * s + t, after every bottleneck and feed-forward GEMM) joins the bias, b s + t computed once in double and rounded
// once; the residual Add may still follow.
PassResult linear_epilogue_fusion(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"linear_epilogue_fusion", 0, {}};
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t li = 0; li < g.nodes.size(); ++li) {
    const Node& linear = g.nodes[li];
    if (linear.domain != kXpurtDomain || linear.op_type != "Linear" || rw.taken(li) || linear.outputs.size() != 1 ||
        linear.attrs.get_string("activation", "none") != "none" || linear.inputs.size() > 3) {
      continue;
    }
    const Tensor* w = constant(g, linear.inputs[1]);
    const Tensor* b = linear.has_input(2) ? constant(g, linear.inputs[2]) : nullptr;
    auto out_type = value_type(g, linear.outputs[0]);
    if (w == nullptr || w->dim() != 2 || (linear.has_input(2) && b == nullptr) || !out_type || !out_type->has_shape) {
      continue;
    }
    const DType dtype = w->dtype();
    const bool kn = linear.attrs.get_string("weight_layout", "nk") == "kn";
    const std::int64_t n_features = kn ? w->shape()[1] : w->shape()[0];
    std::vector<std::size_t> pattern = {li};
    std::vector<std::string> parts = {describe(linear)};
    std::string out = linear.outputs[0];
    // A GELU or Relu after a Linear made by an earlier pass (Note [Pointwise convolutions for the GEMM's epilogue]):
    // the Linear's activation; nothing after it folds (the op adds the residual before its activation).
    std::string activation = "none";
    if (auto ai = activation_after(g, uses, rw, out, /*allow_gelu=*/true, activation)) {
      Node fused = linear;
      fused.attrs.set("activation", activation);
      fused.outputs = g.nodes[*ai].outputs;
      rw.replace({li, *ai}, {std::move(fused)},
                 detail::str_cat("fused ", describe(linear), " + ", describe(g.nodes[*ai]), " -> Linear '",
                                 linear.name, "' (activation ", activation, ")"));
      continue;
    }
    std::string weight = linear.inputs[1];
    std::string bias = linear.has_input(2) ? linear.inputs[2] : std::string();
    // Note [Feature maps through a Reshape]: Reshapes that keep the feature axis last may sit before the Mul.
    std::vector<std::size_t> views;  // the Reshapes taken: one Reshape after the Linear replaces them
    const ReshapeChain chain = reshape_chain(g, uses, rw, out);
    if (features_stay_last(g, uses, rw, out, chain, n_features)) {
      views = chain.reshapes;
      out = chain.end;
      out_type = value_type(g, out);
    }
    if (auto mi = sole_reader(g, uses, rw, out, "Mul")) {
      const Node& mul = g.nodes[*mi];
      const Tensor* c = constant(g, other_input(mul, out));
      auto mul_type = value_type(g, mul.outputs[0]);
      auto gamma = c ? per_channel_values(*c, n_features, 0, static_cast<std::int64_t>(out_type->shape.size()))
                     : std::nullopt;
      const double limit = dtype == DType::kFloat16 ? 65504.0 : dtype == DType::kBFloat16 ? 3.38e38 : 3.40e38;
      bool fits = gamma.has_value() && mul_type && same_shape(*mul_type, *out_type) && mul_type->dtype == dtype &&
                  (b == nullptr || b->numel() == n_features);
      for (std::size_t n = 0; fits && n < gamma->size(); ++n) {
        const double a = std::fabs((*gamma)[n]);
        fits = std::isfinite(a) && (dtype != DType::kFloat16 || (a >= 0x1p-8 && a <= 0x1p8));
      }
      std::optional<Tensor> scaled = fits ? scale_features(*w, kn, *gamma, limit) : std::nullopt;
      if (scaled) {
        weight = add_constant(g, linear.inputs[1] + "_scaled", *scaled);
        if (b != nullptr) {
          std::vector<double> bias_values = to_doubles(*b);
          for (std::size_t n = 0; n < bias_values.size(); ++n) bias_values[n] *= (*gamma)[n];
          bias = add_constant(g, linear.inputs[2] + "_scaled", from_doubles(b->shape(), b->dtype(), bias_values));
        }
        pattern.push_back(*mi);
        parts.push_back(describe(mul) + " (layer scale)");
        out = mul.outputs[0];
      }
    }
    // A per-feature constant added next (MobileBERT's NoNorm, x * s + t, after its GEMMs): into the bias.
    if (auto ai = sole_reader(g, uses, rw, out, "Add")) {
      const Node& add = g.nodes[*ai];
      const Tensor* c = constant(g, other_input(add, out));
      const Tensor* current = bias.empty() ? nullptr : constant(g, bias);
      auto add_type = value_type(g, add.outputs[0]);
      auto shift = c ? per_channel_values(*c, n_features, 0, static_cast<std::int64_t>(out_type->shape.size()))
                     : std::nullopt;
      if (shift && add_type && same_shape(*add_type, *out_type) && add_type->dtype == dtype &&
          (bias.empty() || (current != nullptr && current->numel() == n_features))) {
        std::vector<double> values = current != nullptr ? to_doubles(*current) : std::vector<double>(n_features, 0.0);
        for (std::size_t n = 0; n < values.size(); ++n) values[n] += (*shift)[n];
        bias = add_constant(g, linear.name + "_bias_shifted",
                            from_doubles({n_features}, current != nullptr ? current->dtype() : dtype, values));
        pattern.push_back(*ai);
        parts.push_back(describe(add) + " (per-feature constant, into the bias)");
        out = add.outputs[0];
      }
    }
    // The residual Add, behind Reshapes or not (Note [Residuals through views]).
    const ReshapeChain tail = reshape_chain(g, uses, rw, out);
    std::string after = tail.end;
    std::string residual = take_residual_add(g, uses, rw, dtype, after, pattern, parts);
    if (!residual.empty()) {
      views.insert(views.end(), tail.reshapes.begin(), tail.reshapes.end());
      out = after;
    }
    if (pattern.size() == 1) continue;
    const auto linear_shape = static_shape(g, linear.outputs[0]);
    const auto out_shape = static_shape(g, out);
    if (!views.empty() && (!linear_shape || !out_shape)) continue;
    std::vector<Node> replacement;
    if (!views.empty() && !residual.empty()) {  // the residual read in the Linear's shape
      Node view;
      view.name = g.unique_name(linear.name + "_residual_view");
      view.op_type = "Reshape";
      view.inputs = {residual, add_constant(g, linear.name + "_residual_shape", int64_tensor(*linear_shape))};
      residual = g.unique_name(residual + "_as_" + linear.name);
      view.outputs = {residual};
      replacement.push_back(std::move(view));
    }
    Node fused = linear;
    fused.inputs = {linear.inputs[0], weight};
    if (!bias.empty() || !residual.empty()) fused.inputs.push_back(bias);
    if (!residual.empty()) fused.inputs.push_back(residual);
    fused.outputs = {views.empty() ? out : linear.outputs[0]};
    std::string note = "fused ";
    for (std::size_t k = 0; k < parts.size(); ++k) note += (k ? " + " : "") + parts[k];
    note += " -> Linear '" + linear.name + "'";
    replacement.push_back(std::move(fused));
    if (!views.empty()) {  // one Reshape of the fused Linear writes what the last fused node wrote
      Node moved;
      moved.name = g.nodes[views.front()].name;
      moved.op_type = "Reshape";
      moved.inputs = {linear.outputs[0], add_constant(g, linear.name + "_out_shape", int64_tensor(*out_shape))};
      moved.outputs = {out};
      note += detail::str_cat(" + ", views.size(), " Reshape(s) as one after it");
      replacement.push_back(std::move(moved));
      pattern.insert(pattern.end(), views.begin(), views.end());
    }
    rw.replace(pattern, std::move(replacement), note);
  }
  rw.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
