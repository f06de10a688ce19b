// quantized_constant_folding: the per-channel constants of the int8 ops' epilogue (alpha, and the zero point's
// correction folded into the int32 bias) computed once while the plan is built, instead of by a prologue kernel at
// every launch (see passes.h, docs/native_engine.md, Note [Quantized registry ops] in core/op_schemas.cpp).
//
// Note [Quantized constants folded at build time]
// The GPU kernels of qlinear and qconv2d need, per output channel o, alpha[o] = float32(double(x_scale) *
// double(w_scale[o])) and an int32 bias that holds the zero point's correction (Note [Signed operands of the int8
// GEMMs] in core/quantized_gemm.h, Note [Int8 convolution on the GPU] in backends/cuda_raw/quant_conv.cu). A kernel
// plan sees descriptors, not data, so without this pass they come from cuda_raw::quantized_prologue, one small
// kernel before every int8 GEMM and convolution (54 launches per run of an int8 ResNet-50). When the weight, w_scale
// and bias of a QLinear / QConv are constants, this pass computes them here, as new constants, by rewrites that keep
// the op's result bit for bit (every kernel, the cpu one included, computes the same numbers from the new operands):
// - alpha: w_scale becomes alpha (float32, one element or one per output channel, computed exactly as the prologue
//   and the cpu kernel compute it) and x_scale becomes 1: float32(double(1) * double(a)) == a for every float a. The
//   GPU launchers read w_scale as alpha when x_scale is 1 (QLinearProblem::alpha_is_w_scale, cuda_raw::qconv2d).
// - qlinear's zero point: sum_k (x - zp) * w + bias == sum_k x * w + (bias - zp * sum_k w[k, n]) modulo 2^32, so the
//   pass makes bias - zp * colsum[n] a constant int32 bias (int32 that wraps, as the prologue makes it) and sets
//   x_zero_point to 0. The kernel that multiplies x as stored (cuda_raw's int8_mma, mma.sync u8.s8 or s8.s8: the
//   first choice where it fits) then has no correction left to make; those that take a uint8 x as x - 128 (cuBLASLt's,
//   dp4a; Note [Signed operands of the int8 GEMMs]) still fold 128 * colsum at each run, cuBLASLt in the prologue
//   launch that makes its x - 128 copy anyway.
// - qconv2d's zero point also fills the padded positions (as ONNX's QLinearConv pads), so it stays; the pass makes
//   the int32 bias bias[o] - x_zero_point * sum_k w[o, k] and sets zero_point_folded=1, which tells the kernels that
//   the correction is in the bias: acc = sum_k x'[k] * w[o, k] + bias'[o] with x' = x inside the image and
//   x_zero_point at padded positions (the GPU kernels' sum; the cpu kernel computes it so when the flag is set).
// A float32 bias has no room for an int32 correction, so with a float bias and a zero point to fold the correction
// stays with the prologue (alpha is still folded). A run-time x_zero_point (qlinear's input 4) is not folded.
// int32 arithmetic wraps, as the prologue's: colsum and bias are computed as uint32.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

bool has_input(const Node& n, std::size_t i) { return i < n.inputs.size() && !n.inputs[i].empty(); }

// The weight's sum over k of output channel o, for every o (uint32: int32 that wraps, as the prologue's sum).
// `channels_first`: the weight is [O, ...] (qconv2d, qlinear's weight_layout=nk), else [K, O].
std::vector<std::uint32_t> channel_sums(const Tensor& weight, bool channels_first) {
  const Tensor w = weight.contiguous();
  const std::int64_t channels = channels_first ? w.shape()[0] : w.shape()[1];
  const std::int64_t k = channels > 0 ? w.numel() / channels : 0;
  const auto* data = static_cast<const std::int8_t*>(w.data_ptr());
  std::vector<std::uint32_t> sums(static_cast<std::size_t>(channels), 0u);
  for (std::int64_t o = 0; o < channels; ++o) {
    std::uint32_t sum = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      sum += static_cast<std::uint32_t>(channels_first ? data[o * k + j] : data[j * channels + o]);
    }
    sums[static_cast<std::size_t>(o)] = sum;
  }
  return sums;
}

// alpha = float32(double(float32(x_scale)) * double(w_scale[i])) for each of w_scale's elements (one 1 without it).
Tensor alpha_of(double x_scale_attribute, const Tensor* w_scale) {
  const auto x_scale = static_cast<double>(static_cast<float>(x_scale_attribute));
  const std::int64_t count = w_scale != nullptr ? w_scale->numel() : 1;
  Tensor alpha = Tensor::empty({count}, DType::kFloat32, Device::cpu());
  auto* out = static_cast<float*>(alpha.data_ptr());
  const Tensor scales = w_scale != nullptr ? w_scale->contiguous() : Tensor();
  for (std::int64_t i = 0; i < count; ++i) {
    const double s = w_scale != nullptr ? static_cast<double>(static_cast<const float*>(scales.data_ptr())[i]) : 1.0;
    out[i] = static_cast<float>(x_scale * s);
  }
  return alpha;
}

// The int32 bias `bias` (0 where null) + correction * sums[o], wrapping.
Tensor folded_bias(const Tensor* bias, std::int32_t correction, const std::vector<std::uint32_t>& sums) {
  const auto channels = static_cast<std::int64_t>(sums.size());
  Tensor out = Tensor::empty({channels}, DType::kInt32, Device::cpu());
  auto* values = static_cast<std::int32_t*>(out.data_ptr());
  const Tensor given = bias != nullptr ? bias->contiguous() : Tensor();
  for (std::int64_t o = 0; o < channels; ++o) {
    std::uint32_t b = bias != nullptr ? static_cast<std::uint32_t>(static_cast<const std::int32_t*>(given.data_ptr())[o])
                                      : 0u;
    b += static_cast<std::uint32_t>(correction) * sums[static_cast<std::size_t>(o)];
    values[o] = static_cast<std::int32_t>(b);
  }
  return out;
}

// alpha into w_scale, x_scale 1 (Note [Quantized constants folded at build time]); false when there is nothing to
// fold (an int32 output, alpha already there) or w_scale is not a float32 constant.
bool fold_alpha(Graph& g, Node& n, std::set<std::string>& replaced) {
  if (n.attrs.get_string("output_dtype", "float32") == "int32") return false;
  const double x_scale = n.attrs.get_float("x_scale", 1.0);
  const bool scaled = has_input(n, 2);
  if (scaled && static_cast<float>(x_scale) == 1.0f) return false;
  const Tensor* w_scale = scaled ? constant(g, n.inputs[2]) : nullptr;
  if (scaled && (w_scale == nullptr || w_scale->dtype() != DType::kFloat32)) return false;
  const std::string alpha = add_constant(g, n.name + "_alpha", alpha_of(x_scale, w_scale));
  if (scaled) replaced.insert(n.inputs[2]);
  if (n.inputs.size() < 3) n.inputs.resize(3);
  n.inputs[2] = alpha;
  n.attrs.set("x_scale", 1.0);
  return true;
}

// The zero point's correction into a constant int32 bias (Note [Quantized constants folded at build time]); the
// attribute change (qlinear: x_zero_point = s; qconv2d: zero_point_folded=1) is the caller's. False when there is
// nothing to fold or the bias is not an int32 constant (a float bias, one known only at run time).
bool fold_bias(Graph& g, Node& n, std::int32_t correction, bool channels_first, std::set<std::string>& replaced) {
  if (correction == 0) return false;
  const Tensor* weight = constant(g, n.inputs[1]);
  if (weight == nullptr || weight->dtype() != DType::kInt8 || weight->dim() < 2) return false;
  const bool biased = has_input(n, 3);
  const Tensor* bias = biased ? constant(g, n.inputs[3]) : nullptr;
  if (biased && (bias == nullptr || bias->dtype() != DType::kInt32)) return false;
  const std::vector<std::uint32_t> sums = channel_sums(*weight, channels_first);
  if (bias != nullptr && bias->numel() != static_cast<std::int64_t>(sums.size())) return false;
  const std::string folded = add_constant(g, n.name + "_folded_bias", folded_bias(bias, correction, sums));
  if (biased) replaced.insert(n.inputs[3]);
  if (n.inputs.size() < 4) n.inputs.resize(4);
  n.inputs[3] = folded;
  return true;
}

// One QLinear or QConv: what was folded, for the pass's note ("" when nothing).
std::string fold_node(Graph& g, Node& n, std::set<std::string>& replaced) {
  const bool conv = n.op_type == "QConv";
  std::string what;
  if (fold_alpha(g, n, replaced)) what = "alpha";
  const std::int64_t zero_point = n.attrs.get_int("x_zero_point", 0);
  if (conv) {
    if (n.attrs.get_int("zero_point_folded", 0) == 0 &&
        fold_bias(g, n, static_cast<std::int32_t>(-zero_point), true, replaced)) {
      n.attrs.set("zero_point_folded", std::int64_t{1});
      what += std::string(what.empty() ? "" : " and ") + "the zero point " + std::to_string(zero_point) +
              "'s correction into the int32 bias";
    }
    return what;
  }
  if (has_input(n, 4)) return what;  // a run-time zero point
  const bool nk = n.attrs.get_string("weight_layout", "kn") == "nk";
  if (fold_bias(g, n, static_cast<std::int32_t>(-zero_point), nk, replaced)) {
    n.attrs.set("x_zero_point", std::int64_t{0});
    what += std::string(what.empty() ? "" : " and ") + "the zero point " + std::to_string(zero_point) +
            "'s correction into the int32 bias (x_zero_point 0)";
  }
  return what;
}

}  // namespace

PassResult quantized_constant_folding(Graph& g, const PassContext&) {
  PassResult result{"quantized_constant_folding", 0, {}};
  std::set<std::string> replaced;
  for (Node& n : g.nodes) {
    if (n.domain != kXpurtDomain || (n.op_type != "QLinear" && n.op_type != "QConv") || n.inputs.size() < 2) continue;
    const std::string what = fold_node(g, n, replaced);
    if (what.empty()) continue;
    ++result.rewrites;
    result.notes.push_back("folded " + what + " of " + n.op_type + " '" + n.name + "' into constants");
  }
  remove_unused_constants(g, replaced);
  g.validate();
  return result;
}

}  // namespace xpuruntime::passes
