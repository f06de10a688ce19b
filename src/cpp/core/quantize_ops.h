// The registry ops quantize_linear, dequantize_linear and dynamic_quantize_linear: ONNX's QuantizeLinear,
// DequantizeLinear and DynamicQuantizeLinear as ops every backend may implement (the cpu kernels in
// backends/cpu/cpu_quantize.cpp, the cuda_raw ones in backends/cuda_raw/quantize.cu), so that a QDQ model runs every
// node on the GPU. What their schemas (core/op_schemas_quantize.cpp) and their kernels share. Header only; plain
// functions of values, no state.
//
// Note [Quantize registry ops]
// The arithmetic is the ONNX node kernels' (Note [Quantized arithmetic] in backends/cpu/onnx/onnx_misc_quant.cpp),
// bit for bit, so that lowering a node onto a registry op changes no output:
//   quantize_linear    integer y: saturate(round_half_even(x / scale) + zero_point), x / scale in float32 (16-bit
//                      x and scale widened exactly), a NaN quotient giving zero_point. float8 y: x / scale (float32)
//                      + zero_point added in double and rounded once to the format, to nearest even, with ONNX's
//                      saturation (`saturate`, Note [Float8 and 4-bit dtypes] in xpuruntime/low_bit.h). int4 and
//                      uint4 are held unpacked, one value per byte (int4 sign-extended).
//   dequantize_linear  y = float32(x - zero_point) * scale (the difference exact in double), rounded once to the
//                      scale's dtype, which is the output's.
//   dynamic_quantize_linear  x float32: x_min = min(0, min x), x_max = max(0, max x), y_scale = (x_max - x_min) /
//                      255 (float32), y_zero_point = saturate(round_half_even(-x_min / y_scale)) (0 when y_scale
//                      is 0), y = saturate(round_half_even(x / y_scale) + y_zero_point), all uint8.
// Scales and zero points apply per tensor (one element, rank <= 1) or per index along `axis` (a 1-D tensor of
// x.shape[axis] elements; ParamLayout). ONNX's blocked scales (block_size, opset 21) and its int16/uint16 types are
// not registry forms: the lowering leaves those nodes to their node kernels.
//
// A NaN's sign: a NaN of x (or of the scale) keeps its sign into a float8 output, as the node kernel's arithmetic
// propagates it; a NaN that the division itself makes (0 / 0, inf / inf: a zero or infinite scale) has the sign of
// the platform's default NaN (negative on x86 CPUs, positive on NVIDIA GPUs), so float8 outputs of such invalid scales
// may differ between the cpu and cuda_raw kernels in the sign bit of the NaN only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "xpuruntime/dtype.h"

namespace xpuruntime::quantize_ops {

// What quantize_linear writes and dequantize_linear reads: int8, uint8, int4, uint4 and the four float8 formats.
inline bool is_quantized_dtype(DType d) {
  return d == DType::kInt8 || d == DType::kUInt8 || is_int4_dtype(d) || is_float8_dtype(d);
}

// What dequantize_linear reads: the quantized dtypes and int32 (a bias quantized with scale x_scale * w_scale).
inline bool is_dequantizable_dtype(DType d) { return is_quantized_dtype(d) || d == DType::kInt32; }

// The float side: quantize_linear's x and scale, dequantize_linear's scale and output.
inline bool is_real_dtype(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }

// The saturation range of an integer quantized dtype (int8, uint8, int4, uint4).
inline void integer_range(DType d, int* lo, int* hi) {
  switch (d) {
    case DType::kInt8: *lo = -128; *hi = 127; return;
    case DType::kInt4: *lo = -8; *hi = 7; return;
    case DType::kUInt4: *lo = 0; *hi = 15; return;
    default: *lo = 0; *hi = 255; return;  // kUInt8
  }
}

// quantize_linear's integer level of the float32 quotient `scaled` = x / scale: saturate(round_half_even(scaled) +
// zero_point) within [lo, hi], a NaN quotient giving the zero point (saturated). Also the level of the int8 ops'
// requantizing epilogues (cpu_quant.cpp) and of fused programs' quantized outputs (core/fused_elementwise.h).
inline double integer_level(float scaled, double zero_point, int lo, int hi) {
  const double q = std::isnan(scaled) ? zero_point : std::nearbyint(static_cast<double>(scaled)) + zero_point;
  return std::clamp(q, static_cast<double>(lo), static_cast<double>(hi));
}

// Which element of a scale or zero point applies to element i of x (row-major): the only one, or the one of i's index
// along the axis, (i / inner) % axis_dim.
struct ParamLayout {
  bool per_axis = false;
  std::int64_t axis_dim = 1;  // x.shape[axis]
  std::int64_t inner = 1;     // the product of x's dims after axis

  std::int64_t index(std::int64_t i) const { return per_axis ? (i / inner) % axis_dim : 0; }
};

// Per tensor when `scale` has one element and rank <= 1 (ONNX's rule; `axis` is then not read), else per index along
// `axis` (negative counts from the end). The shapes are the schema's to validate; this only reads them.
inline ParamLayout param_layout(const std::vector<std::int64_t>& x, const std::vector<std::int64_t>& scale,
                                std::int64_t axis) {
  ParamLayout layout;
  std::int64_t count = 1;
  for (const std::int64_t d : scale) count *= d;
  if (count == 1 && scale.size() <= 1) return layout;
  const auto rank = static_cast<std::int64_t>(x.size());
  const std::int64_t a = axis < 0 ? axis + rank : axis;
  layout.per_axis = true;
  layout.axis_dim = x[static_cast<std::size_t>(a)];
  for (std::int64_t d = a + 1; d < rank; ++d) layout.inner *= x[static_cast<std::size_t>(d)];
  return layout;
}

}  // namespace xpuruntime::quantize_ops
