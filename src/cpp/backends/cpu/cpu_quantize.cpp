// The cpu kernels of quantize_linear, dequantize_linear and dynamic_quantize_linear (Note [Quantize registry ops] in
// core/quantize_ops.h): the arithmetic of the ONNX node kernels (backends/cpu/onnx/onnx_misc_quant.cpp) element for
// element, so that the lowering may put a QuantizeLinear/DequantizeLinear node on either and get the same bits; the
// tests (tests/cpp/backends/cpu/test_quantize_ops.cpp) compare the two on random inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "core/half.h"
#include "core/quantize_ops.h"
#include "xpuruntime/low_bit.h"

namespace xpuruntime::cpu {
namespace {

constexpr std::int64_t kGrain = 1 << 14;

// Element i of a float32, float16 or bfloat16 tensor's memory, as float (exact).
float load_real(const void* p, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::kFloat16: return detail::half_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::kBFloat16: return detail::bfloat16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Writes `v` rounded once (to nearest even) to element i of a float32, float16 or bfloat16 tensor's memory.
void store_real(void* p, DType dtype, std::int64_t i, float v) {
  switch (dtype) {
    case DType::kFloat16: static_cast<std::uint16_t*>(p)[i] = detail::float_to_half(v); return;
    case DType::kBFloat16: static_cast<std::uint16_t*>(p)[i] = detail::float_to_bfloat16(v); return;
    default: static_cast<float*>(p)[i] = v; return;
  }
}

// Element i of a quantized (or int32) tensor's memory, as the exact double of its value: int4/uint4 are their
// unpacked bytes (int4 sign-extended), float8 its value.
double load_quantized(const void* p, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kInt4: return static_cast<const std::int8_t*>(p)[i];
    case DType::kUInt8:
    case DType::kUInt4: return static_cast<const std::uint8_t*>(p)[i];
    case DType::kInt32: return static_cast<const std::int32_t*>(p)[i];
    default: return detail::float8_to_float(static_cast<const std::uint8_t*>(p)[i], dtype);
  }
}

std::vector<float> reals_of(const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = load_real(t.data_ptr(), t.dtype(), static_cast<std::int64_t>(i));
  }
  return out;
}

// The zero points (one per scale), or a single 0 when the input is absent.
std::vector<double> zero_points_of(const KernelLaunch& launch, std::size_t count) {
  if (launch.num_inputs < 3 || !launch.input(2).defined()) return std::vector<double>(count, 0.0);
  const Tensor& zp = launch.input(2);
  std::vector<double> out(static_cast<std::size_t>(zp.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = load_quantized(zp.data_ptr(), zp.dtype(), static_cast<std::int64_t>(i));
  }
  return out;
}

quantize_ops::ParamLayout layout_of(const KernelLaunch& launch) {
  return quantize_ops::param_layout(launch.input(0).shape(), launch.input(1).shape(),
                                    launch.desc->attrs.get_int("axis", 1));
}

void run_quantize_linear(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const quantize_ops::ParamLayout layout = layout_of(launch);
  const std::vector<float> scales = reals_of(launch.input(1));
  const std::vector<double> zero_points = zero_points_of(launch, scales.size());
  const DType out = y.dtype();
  const bool saturate = launch.desc->attrs.get_int("saturate", 1) != 0;
  int lo = 0, hi = 0;
  if (!is_float8_dtype(out)) quantize_ops::integer_range(out, &lo, &hi);
  const void* xs = x.data_ptr();
  auto* ys = static_cast<std::uint8_t*>(y.data_ptr());
  parallel_for(x.numel(), context.threads, kGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const auto p = static_cast<std::size_t>(layout.index(i));
      const float scaled = load_real(xs, x.dtype(), i) / scales[p];
      const double zero_point = zero_points[p];
      if (is_float8_dtype(out)) {  // the sum rounds once, to the format
        ys[i] = detail::float8_from_double(static_cast<double>(scaled) + zero_point, out, saturate);
        continue;
      }
      const double level = quantize_ops::integer_level(scaled, zero_point, lo, hi);
      ys[i] = static_cast<std::uint8_t>(static_cast<int>(level));  // int8/int4: two's complement bytes
    }
  });
}

void run_dequantize_linear(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const quantize_ops::ParamLayout layout = layout_of(launch);
  const std::vector<float> scales = reals_of(launch.input(1));
  const std::vector<double> zero_points = zero_points_of(launch, scales.size());
  parallel_for(x.numel(), context.threads, kGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const auto p = static_cast<std::size_t>(layout.index(i));
      const double centered = load_quantized(x.data_ptr(), x.dtype(), i) - zero_points[p];
      store_real(y.data_ptr(), y.dtype(), i, static_cast<float>(centered) * scales[p]);
    }
  });
}

// One thread (the range is a reduction): the node kernel's order of checks, so a non-finite x is reported at its
// first index.
void run_dynamic_quantize_linear(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  const auto* xs = static_cast<const float*>(x.data_ptr());
  const std::int64_t n = x.numel();
  float x_min = 0.0f, x_max = 0.0f;  // the range always includes 0
  for (std::int64_t i = 0; i < n; ++i) {
    XPURT_CHECK(std::isfinite(xs[i]), "op 'dynamic_quantize_linear': input 'x' holds a non-finite value at index ", i);
    x_min = std::min(x_min, xs[i]);
    x_max = std::max(x_max, xs[i]);
  }
  const float scale = (x_max - x_min) / 255.0f;
  double zero_point = 0.0;
  if (scale > 0.0f) zero_point = std::clamp(std::nearbyint(static_cast<double>(-x_min / scale)), 0.0, 255.0);
  auto* ys = static_cast<std::uint8_t*>(launch.output(0).data_ptr());
  parallel_for(n, context.threads, kGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const float scaled = xs[i] / scale;
      ys[i] = scale > 0.0f ? static_cast<std::uint8_t>(quantize_ops::integer_level(scaled, zero_point, 0, 255)) : 0;
    }
  });
  *static_cast<float*>(launch.output(1).data_ptr()) = scale;
  *static_cast<std::uint8_t*>(launch.output(2).data_ptr()) = static_cast<std::uint8_t>(zero_point);
}

}  // namespace

void register_quantize_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "quantize_linear",
                 "reference: x / scale in float32, rounded half to even and saturated (float8: ONNX's Cast rules)",
                 run_quantize_linear, DTypeSet::kAll);
  add_cpu_kernel(registry, "dequantize_linear", "reference: (x - zero_point) * scale in float32, rounded once",
                 run_dequantize_linear, DTypeSet::kAll);
  add_cpu_kernel(registry, "dynamic_quantize_linear",
                 "reference: the range of x and 0, then quantize_linear to uint8 with its scale and zero point",
                 run_dynamic_quantize_linear, DTypeSet::kAll);
}

}  // namespace xpuruntime::cpu
