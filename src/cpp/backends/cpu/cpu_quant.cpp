// The cpu kernels of the int8 ops qlinear and qconv2d (Note [Quantized registry ops] in core/op_schemas.cpp), and of
// the float8 qlinear_fp8 (run_qlinear_fp8 below). The int8 ones: exact
// integer accumulation (int32 that wraps, as ONNX's accumulator), then the epilogue of the note: alpha, bias,
// activation and the requantization of ONNX's QuantizeLinear (round half to even, saturation).
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "core/half.h"
#include "core/quantize_ops.h"
#include "xpuruntime/low_bit.h"

namespace xpuruntime::cpu {
namespace {

const Tensor* optional_input(const KernelLaunch& launch, std::size_t i) {
  return i < launch.num_inputs && launch.input(i).defined() ? &launch.input(i) : nullptr;
}

// x's zero point: qlinear's input x_zero_point (one element, known only at run time) when given, else the attribute.
std::int32_t x_zero_point(const KernelLaunch& launch) {
  if (const Tensor* zp = optional_input(launch, 4)) {
    return zp->dtype() == DType::kInt8 ? *static_cast<const std::int8_t*>(zp->data_ptr())
                                       : *static_cast<const std::uint8_t*>(zp->data_ptr());
  }
  return static_cast<std::int32_t>(launch.desc->attrs.get_int("x_zero_point", 0));
}

// The values of an int8 or uint8 tensor minus `zero_point`, as int32.
std::vector<std::int32_t> centered(const Tensor& t, std::int32_t zero_point) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(t.numel()));
  if (t.dtype() == DType::kInt8) {
    const auto* p = static_cast<const std::int8_t*>(t.data_ptr());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::int32_t>(p[i]) - zero_point;
  } else {
    const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::int32_t>(p[i]) - zero_point;
  }
  return out;
}

// What follows the accumulation, for output channel c: fixed when the plan runs (the attributes and the small
// inputs w_scale and bias).
class Epilogue {
 public:
  Epilogue(const KernelLaunch& launch, std::int64_t channels) : out_(launch.output(0)) {
    const Attributes& attrs = launch.desc->attrs;
    relu_ = attrs.get_string("activation", "none") == "relu";
    const auto x_scale = static_cast<float>(attrs.get_float("x_scale", 1.0));
    y_scale_ = static_cast<float>(attrs.get_float("y_scale", 1.0));
    y_zero_point_ = static_cast<double>(attrs.get_int("y_zero_point", 0));
    const Tensor* w_scale = optional_input(launch, 2);
    const Tensor* bias = optional_input(launch, 3);
    alpha_.assign(static_cast<std::size_t>(channels), x_scale);
    if (w_scale != nullptr) {
      const auto* s = static_cast<const float*>(w_scale->data_ptr());
      for (std::int64_t c = 0; c < channels; ++c) {
        const float sc = s[w_scale->numel() == 1 ? 0 : c];
        alpha_[static_cast<std::size_t>(c)] = static_cast<float>(static_cast<double>(x_scale) * sc);
      }
    }
    int_bias_.assign(static_cast<std::size_t>(channels), 0);
    float_bias_.assign(static_cast<std::size_t>(channels), 0.0f);
    if (bias != nullptr && bias->dtype() == DType::kInt32) {
      const auto* b = static_cast<const std::int32_t*>(bias->data_ptr());
      int_bias_.assign(b, b + channels);
    } else if (bias != nullptr) {
      const auto* b = static_cast<const float*>(bias->data_ptr());
      float_bias_.assign(b, b + channels);
    }
    if (out_.dtype() == DType::kInt8 || out_.dtype() == DType::kUInt8) {
      quantize_ops::integer_range(out_.dtype(), &lo_, &hi_);
    }
  }

  // Writes element i of the output from the accumulator of output channel c.
  void store(std::int64_t i, std::int64_t c, std::uint32_t wrapped_acc) const {
    const auto k = static_cast<std::size_t>(c);
    const auto acc = static_cast<std::int32_t>(wrapped_acc + static_cast<std::uint32_t>(int_bias_[k]));
    switch (out_.dtype()) {
      case DType::kInt32:
        static_cast<std::int32_t*>(out_.data_ptr())[i] = acc;
        return;
      case DType::kFloat32:
        static_cast<float*>(out_.data_ptr())[i] = real(acc, k);
        return;
      case DType::kFloat16:
        static_cast<std::uint16_t*>(out_.data_ptr())[i] = detail::float_to_half(real(acc, k));
        return;
      case DType::kInt8:
        static_cast<std::int8_t*>(out_.data_ptr())[i] = static_cast<std::int8_t>(quantize(real(acc, k)));
        return;
      case DType::kUInt8:
        static_cast<std::uint8_t*>(out_.data_ptr())[i] = static_cast<std::uint8_t>(quantize(real(acc, k)));
        return;
      default:
        XPURT_INTERNAL_ASSERT(false, "qlinear/qconv2d output of dtype ", dtype_name(out_.dtype()));
    }
  }

 private:
  float real(std::int32_t acc, std::size_t c) const {
    const float v = static_cast<float>(acc) * alpha_[c] + float_bias_[c];
    return relu_ && !(v > 0.0f) && !std::isnan(v) ? 0.0f : v;
  }
  // ONNX's QuantizeLinear: saturate(round_half_even(real / y_scale) + y_zero_point), the division in float32.
  double quantize(float real) const {
    return quantize_ops::integer_level(real / y_scale_, y_zero_point_, lo_, hi_);
  }

  Tensor& out_;
  bool relu_ = false;
  float y_scale_ = 1.0f;
  double y_zero_point_ = 0;
  int lo_ = 0, hi_ = 0;
  std::vector<float> alpha_, float_bias_;
  std::vector<std::int32_t> int_bias_;
};

void run_qlinear(const KernelLaunch& launch, const CpuContext& context) {
  const OpDescriptor& desc = *launch.desc;
  const Tensor& x = launch.input(0);
  const Tensor& w = launch.input(1);
  const bool nk = desc.attrs.get_string("weight_layout", "kn") == "nk";
  const std::int64_t k = x.shape().back();
  const std::int64_t n = nk ? w.shape()[0] : w.shape()[1];
  const std::int64_t m = k > 0 ? x.numel() / k : launch.output(0).numel() / std::max<std::int64_t>(n, 1);
  const std::vector<std::int32_t> xc = centered(x, x_zero_point(launch));
  std::vector<std::int32_t> wc = centered(w, 0);
  if (nk) {  // to [K, N], so that the inner loop runs along rows of the weight and of the output
    std::vector<std::int32_t> kn(wc.size());
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t l = 0; l < k; ++l) {
        kn[static_cast<std::size_t>(l * n + r)] = wc[static_cast<std::size_t>(r * k + l)];
      }
    }
    wc.swap(kn);
  }
  const Epilogue epilogue(launch, n);
  parallel_for(m, context.threads, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(n * k, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 std::vector<std::uint32_t> row(static_cast<std::size_t>(n));
                 for (std::int64_t i = begin; i < end; ++i) {
                   std::fill(row.begin(), row.end(), 0u);
                   for (std::int64_t l = 0; l < k; ++l) {
                     const auto a = static_cast<std::uint32_t>(xc[static_cast<std::size_t>(i * k + l)]);
                     if (a == 0) continue;
                     const std::int32_t* b = wc.data() + l * n;
                     for (std::int64_t j = 0; j < n; ++j) {
                       row[static_cast<std::size_t>(j)] += a * static_cast<std::uint32_t>(b[j]);
                     }
                   }
                   for (std::int64_t j = 0; j < n; ++j) epilogue.store(i * n + j, j, row[static_cast<std::size_t>(j)]);
                 }
               });
}

// Direct NCHW convolution: padded positions hold x_zero_point, 0 once centered (as ONNX's QLinearConv pads). With
// zero_point_folded=1 the int32 bias already holds -x_zero_point * sum_k w[o, k] (Note [Quantized constants folded at
// build time] in engines/native/passes/quantized_constants.cpp): x is summed as stored and the padded positions as
// x_zero_point, as the GPU kernels sum. Layout NHWC runs through NCHW copies (nhwc_through_nchw, cpu_common.h).
void run_qconv2d(const KernelLaunch& launch, const CpuContext& context) {
  const OpDescriptor& desc = *launch.desc;
  const Tensor& x = launch.input(0);
  const Tensor& w = launch.input(1);
  const Tensor& y = launch.output(0);
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  const std::int64_t groups = desc.attrs.get_int("groups", 1);
  const std::int64_t batch = x.shape()[0], channels = x.shape()[1], h = x.shape()[2], wd = x.shape()[3];
  const std::int64_t out_channels = w.shape()[0], cg = w.shape()[1], kh = w.shape()[2], kw = w.shape()[3];
  const std::int64_t oh = y.shape()[2], ow = y.shape()[3];
  const std::int64_t og = out_channels / groups;
  const auto zero_point = static_cast<std::int32_t>(desc.attrs.get_int("x_zero_point", 0));
  const bool folded = desc.attrs.get_int("zero_point_folded", 0) != 0;
  const std::vector<std::int32_t> xc = centered(x, folded ? 0 : zero_point);
  const auto padding = static_cast<std::uint32_t>(folded ? zero_point : 0);  // a padded position, centered
  const std::vector<std::int32_t> wc = centered(w, 0);
  const Epilogue epilogue(launch, out_channels);
  // One task per (image, output channel) plane.
  const std::int64_t plane_work = std::max<std::int64_t>(oh * ow * cg * kh * kw, 1);
  parallel_for(batch * out_channels, context.threads, std::max<std::int64_t>(1, 16384 / plane_work),
               [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t plane = begin; plane < end; ++plane) {
      const std::int64_t b = plane / out_channels, o = plane % out_channels, g = o / og;
      const std::int32_t* wo = wc.data() + o * cg * kh * kw;
      for (std::int64_t p = 0; p < oh; ++p) {
        for (std::int64_t q = 0; q < ow; ++q) {
          std::uint32_t acc = 0;
          for (std::int64_t c = 0; c < cg; ++c) {
            const std::int32_t* xp = xc.data() + (b * channels + g * cg + c) * h * wd;
            const std::int32_t* wp = wo + c * kh * kw;
            for (std::int64_t r = 0; r < kh; ++r) {
              const std::int64_t yy = p * strides[0] - pads[0] + r * dilations[0];
              const bool row = yy >= 0 && yy < h;
              if (!row && padding == 0) continue;
              for (std::int64_t s = 0; s < kw; ++s) {
                const std::int64_t xx = q * strides[1] - pads[1] + s * dilations[1];
                const bool inside = row && xx >= 0 && xx < wd;
                if (!inside && padding == 0) continue;
                const std::uint32_t v = inside ? static_cast<std::uint32_t>(xp[yy * wd + xx]) : padding;
                acc += v * static_cast<std::uint32_t>(wp[r * kw + s]);
              }
            }
          }
          epilogue.store(plane * oh * ow + p * ow + q, o, acc);
        }
      }
    }
  });
}

// qlinear_fp8 (Note [Float8 quantized linear] in core/op_schemas.cpp): float8e4m3fn decoded exactly (a table of the
// 256 codes), float32 products and sums in k order, then alpha, bias, relu and ONNX's saturating float8 rounding.
void run_qlinear_fp8(const KernelLaunch& launch, const CpuContext& context) {
  const OpDescriptor& desc = *launch.desc;
  const Tensor& x = launch.input(0);
  const Tensor& w = launch.input(1);
  const Tensor& w_scale = launch.input(2);
  const Tensor* bias = optional_input(launch, 3);
  Tensor& y = launch.output(0);
  const bool nk = desc.attrs.get_string("weight_layout", "kn") == "nk";
  const std::int64_t k = x.shape().back();
  const std::int64_t n = nk ? w.shape()[0] : w.shape()[1];
  const std::int64_t m = y.numel() / std::max<std::int64_t>(n, 1);
  std::array<float, 256> decode{};
  for (std::size_t c = 0; c < decode.size(); ++c) {
    decode[c] = detail::float8_to_float(static_cast<std::uint8_t>(c), DType::kFloat8E4M3FN);
  }
  const auto* xq = static_cast<const std::uint8_t*>(x.data_ptr());
  const auto* wq = static_cast<const std::uint8_t*>(w.data_ptr());
  std::vector<float> wf(static_cast<std::size_t>(k * n));  // [K, N]
  for (std::int64_t r = 0; r < k; ++r) {
    for (std::int64_t c = 0; c < n; ++c) {
      wf[static_cast<std::size_t>(r * n + c)] = decode[nk ? wq[c * k + r] : wq[r * n + c]];
    }
  }
  const auto x_scale = desc.attrs.get_float("x_scale", 1.0);
  const auto y_scale = static_cast<float>(desc.attrs.get_float("y_scale", 1.0));
  const bool relu = desc.attrs.get_string("activation", "none") == "relu";
  const auto* s = static_cast<const float*>(w_scale.data_ptr());
  std::vector<float> alpha(static_cast<std::size_t>(n)), shift(static_cast<std::size_t>(n), 0.0f);
  for (std::int64_t c = 0; c < n; ++c) {
    alpha[static_cast<std::size_t>(c)] = static_cast<float>(x_scale * s[w_scale.numel() == 1 ? 0 : c]);
    if (bias == nullptr) continue;
    const void* b = bias->data_ptr();
    shift[static_cast<std::size_t>(c)] = bias->dtype() == DType::kFloat16
                                             ? detail::half_to_float(static_cast<const std::uint16_t*>(b)[c])
                                             : static_cast<const float*>(b)[c];
  }
  const DType out = y.dtype();
  parallel_for(m, context.threads, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(n * k, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 std::vector<float> row(static_cast<std::size_t>(n));
                 for (std::int64_t i = begin; i < end; ++i) {
                   std::fill(row.begin(), row.end(), 0.0f);
                   for (std::int64_t l = 0; l < k; ++l) {
                     const float a = decode[xq[i * k + l]];
                     const float* b = wf.data() + l * n;
                     for (std::int64_t j = 0; j < n; ++j) row[static_cast<std::size_t>(j)] += a * b[j];
                   }
                   for (std::int64_t j = 0; j < n; ++j) {
                     const auto c = static_cast<std::size_t>(j);
                     float v = row[c] * alpha[c] + shift[c];
                     if (relu && !(v > 0.0f) && !std::isnan(v)) v = 0.0f;
                     const std::int64_t at = i * n + j;
                     if (out == DType::kFloat32) {
                       static_cast<float*>(y.data_ptr())[at] = v;
                     } else if (out == DType::kFloat16) {
                       static_cast<std::uint16_t*>(y.data_ptr())[at] = detail::float_to_half(v);
                     } else {
                       static_cast<std::uint8_t*>(y.data_ptr())[at] =
                           detail::float8_from_double(static_cast<double>(v / y_scale), DType::kFloat8E4M3FN);
                     }
                   }
                 }
               });
}

}  // namespace

void register_quantized_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "qlinear",
                 "reference int8 GEMM: int32 accumulation, then alpha, bias, relu and ONNX's requantization",
                 run_qlinear, DTypeSet::kQuantized);
  add_cpu_kernel(registry, "qconv2d",
                 "reference int8 direct convolution: int32 accumulation, then alpha, bias, relu and ONNX's "
                 "requantization (layout NHWC through NCHW copies)",
                 nhwc_through_nchw(run_qconv2d), DTypeSet::kQuantized);
  add_cpu_kernel(registry, "qlinear_fp8",
                 "reference float8 GEMM: float8e4m3fn decoded exactly, float32 sums, then alpha, bias, relu and "
                 "ONNX's saturating float8 rounding",
                 run_qlinear_fp8, DTypeSet::kAll);
}

}  // namespace xpuruntime::cpu
