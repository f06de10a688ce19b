// The epilogue of the int8 ops qlinear and qconv2d on the GPU (QuantEpilogueParams in core/device_kernels.h, Note
// [Quantized registry ops] in core/op_schemas.cpp): one device function that every cuda_raw kernel producing an int8
// op's output calls per element, so the fused kernels (an int8 convolution with its epilogue in registers) and the
// separate epilogue pass after a library GEMM (cuda_raw::quantized_epilogue) round the same way as the cpu kernel.
// Included by .cu files only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/device_kernels.h"

namespace xpuruntime::cuda_raw::detail {

// The real value of accumulator `acc` of output channel c, after the bias, the scales and the activation.
__device__ __forceinline__ float quantized_real(const QuantEpilogueParams& p, std::int32_t acc, std::int64_t c) {
  auto wrapped = static_cast<std::uint32_t>(acc);  // int32 sums wrap, as ONNX's accumulator (and the cpu kernel)
  if (p.int_bias != nullptr) wrapped += static_cast<std::uint32_t>(p.int_bias[c]);
  if (p.x_zero_point != nullptr) {
    wrapped -= static_cast<std::uint32_t>(*p.x_zero_point) * static_cast<std::uint32_t>(p.w_col_sums[c]);
  }
  const auto total = static_cast<std::int32_t>(wrapped);
  float v = __fmul_rn(static_cast<float>(total), p.alpha[p.alpha_per_channel ? c : 0]);
  // + 0.0f without a float bias, as the cpu kernel: a product that underflows to -0.0 becomes +0.0 there too.
  v = __fadd_rn(v, p.float_bias != nullptr ? p.float_bias[c] : 0.0f);
  if (p.relu && !(v > 0.0f) && !isnan(v)) v = 0.0f;
  return v;
}

// The int32 accumulator itself, after the bias and the run-time zero point (output_dtype=int32).
__device__ __forceinline__ std::int32_t quantized_raw(const QuantEpilogueParams& p, std::int32_t acc, std::int64_t c) {
  auto wrapped = static_cast<std::uint32_t>(acc);
  if (p.int_bias != nullptr) wrapped += static_cast<std::uint32_t>(p.int_bias[c]);
  if (p.x_zero_point != nullptr) {
    wrapped -= static_cast<std::uint32_t>(*p.x_zero_point) * static_cast<std::uint32_t>(p.w_col_sums[c]);
  }
  return static_cast<std::int32_t>(wrapped);
}

// ONNX's QuantizeLinear of `real`: saturate(round_half_even(real / y_scale) + y_zero_point), the division in float32.
__device__ __forceinline__ float quantized_level(const QuantEpilogueParams& p, float real, float lo, float hi) {
  const float scaled = __fdiv_rn(real, p.y_scale);
  if (isnan(scaled)) return fminf(hi, fmaxf(lo, p.y_zero_point));
  return fminf(hi, fmaxf(lo, rintf(scaled) + p.y_zero_point));
}

// Note [Requantization without a division]
// quantized_level's __fdiv_rn is a reciprocal, three fused multiply-adds and a range check whose slow path (a
// subroutine of about 50 instructions) it also takes for a zero dividend: half of a ReLU's outputs. In the int8
// convolution's epilogue that made about two thirds of the kernel's time (H200, 2026-12-02: a batch-1 1x1 convolution
// 10.8 us, 4.6 us without its epilogue). Requantizer divides as Markstein's correction does, with the reciprocal of
// y_scale made once per thread: q0 = real * RN(1 / y_scale), r = real - q0 * y_scale (exact, one fma),
// q = RN(q0 + r * RN(1 / y_scale)) is the correctly rounded quotient when the reciprocal is correctly rounded and
// nothing over- or underflows (Markstein's theorem; Handbook of Floating-Point Arithmetic, 2nd ed., 4.7). Where it
// could fail the level does not depend on it: |q0| >= 2^23 saturates whatever its last bit (the levels are within
// +-2^9 of the zero point), and a quotient below one half rounds to 0 from either side. A y_scale that is not a
// positive normal float, or whose reciprocal is not normal, keeps __fdiv_rn (Requantizer::fast). Checked on an H200
// (2026-12-02): over every float a with a / y_scale in [1/2, 2^23), both signs, for 64 scales (2.6e10 quotients), 6
// quotients differed from __fdiv_rn's (one: 29774016 / 3.54933953, a quotient near 2^23, whose level saturates); over
// 8 x 2^30 random pairs (a any bits, NaN and infinities included; y_scale in 2^-100 .. 2^100; both output types; ReLU
// or not) no level differed from quantized_level's.
//
// requantized_int is the level as an integer in fewer operations, for kernels that store many outputs per thread:
// the rounding and the conversion are one cvt.rni (saturating; NaN gives 0, so the level of a NaN is the zero point
// without a test, as quantized_level's), the clamp is done in integers, and a ReLU is the lower bound raised to the
// zero point: for y_scale > 0 a real <= 0 (or NaN) has a level <= the zero point, which is the level of 0. A
// Requantizer made with relu = true gives the levels of quantized_level(relu(real)); `fast` is false (use
// quantized_level) where y_scale is not a positive normal float or its reciprocal is not normal.
struct Requantizer {
  float y_scale, reciprocal, zero_point, lo, hi;
  int int_lo, int_hi, int_zero_point;  // the clamp in integers, relative to the zero point
  bool fast;
};

// A Requantizer onto the integer levels [lo, hi] (int8, uint8, int4 or uint4: |lo|, hi < 2^9).
__device__ __forceinline__ Requantizer requantizer_range(float y_scale, float zero_point, float lo, float hi,
                                                         bool relu = false) {
  Requantizer r;
  r.y_scale = y_scale;
  r.reciprocal = __frcp_rn(y_scale);
  r.zero_point = zero_point;
  r.lo = lo;
  r.hi = hi;
  constexpr float kMinNormal = 1.17549435e-38f, kMax = 3.40282347e+38f;
  r.fast = y_scale >= kMinNormal && y_scale <= kMax && r.reciprocal >= kMinNormal && r.reciprocal <= kMax &&
           zero_point >= r.lo && zero_point <= r.hi && zero_point == rintf(zero_point);
  r.int_zero_point = r.fast ? static_cast<int>(zero_point) : 0;
  r.int_lo = static_cast<int>(relu && r.fast ? fmaxf(r.lo, zero_point) : r.lo) - r.int_zero_point;
  r.int_hi = static_cast<int>(r.hi) - r.int_zero_point;
  return r;
}

__device__ __forceinline__ Requantizer requantizer(float y_scale, float zero_point, bool is_signed, bool relu = false) {
  return requantizer_range(y_scale, zero_point, is_signed ? -128.0f : 0.0f, is_signed ? 127.0f : 255.0f, relu);
}

// real / y_scale for a `fast` Requantizer, correctly rounded where the level depends on it.
__device__ __forceinline__ float requantized_quotient(const Requantizer& r, float real) {
  float scaled = __fmul_rn(real, r.reciprocal);
  if (fabsf(scaled) < 8388608.0f) scaled = __fmaf_rn(__fmaf_rn(-scaled, r.y_scale, real), r.reciprocal, scaled);
  return scaled;
}

// quantized_level(real) (the Requantizer's relu is not applied here), as quantized_level computes it.
__device__ __forceinline__ float requantized_level(const Requantizer& r, float real) {
  const float scaled = r.fast ? requantized_quotient(r, real) : __fdiv_rn(real, r.y_scale);
  if (isnan(scaled)) return fminf(r.hi, fmaxf(r.lo, r.zero_point));
  return fminf(r.hi, fmaxf(r.lo, rintf(scaled) + r.zero_point));
}

// The level of relu(real) (Requantizer made with relu) or of real as an integer, for a `fast` Requantizer only.
__device__ __forceinline__ int requantized_int(const Requantizer& r, float real) {
  const int level = __float2int_rn(requantized_quotient(r, real));
  return min(r.int_hi, max(r.int_lo, level)) + r.int_zero_point;
}

// Writes out[i] (of kOut, which is p.out_dtype) from accumulator `acc` of output channel c. Kernels that store many
// outputs per thread from unrolled loops take the output dtype as a template argument and call this one: a switch
// per store, unrolled, makes nvcc's optimizer take minutes.
template <DType kOut>
__device__ __forceinline__ void quantized_store_as(const QuantEpilogueParams& p, void* out, std::int64_t i,
                                                   std::int32_t acc, std::int64_t c) {
  if constexpr (kOut == DType::kInt32) {
    static_cast<std::int32_t*>(out)[i] = quantized_raw(p, acc, c);
  } else if constexpr (kOut == DType::kFloat32) {
    static_cast<float*>(out)[i] = quantized_real(p, acc, c);
  } else if constexpr (kOut == DType::kFloat16) {
    static_cast<__half*>(out)[i] = __float2half_rn(quantized_real(p, acc, c));
  } else if constexpr (kOut == DType::kInt8) {
    static_cast<std::int8_t*>(out)[i] =
        static_cast<std::int8_t>(quantized_level(p, quantized_real(p, acc, c), -128.0f, 127.0f));
  } else {
    static_assert(kOut == DType::kUInt8, "the int8 ops write int32, float32, float16, int8 or uint8");
    static_cast<std::uint8_t*>(out)[i] =
        static_cast<std::uint8_t>(quantized_level(p, quantized_real(p, acc, c), 0.0f, 255.0f));
  }
}

// Writes out[i] (of p.out_dtype) from accumulator `acc` of output channel c.
__device__ __forceinline__ void quantized_store(const QuantEpilogueParams& p, void* out, std::int64_t i,
                                                std::int32_t acc, std::int64_t c) {
  switch (p.out_dtype) {
    case DType::kInt32: return quantized_store_as<DType::kInt32>(p, out, i, acc, c);
    case DType::kFloat32: return quantized_store_as<DType::kFloat32>(p, out, i, acc, c);
    case DType::kFloat16: return quantized_store_as<DType::kFloat16>(p, out, i, acc, c);
    case DType::kInt8: return quantized_store_as<DType::kInt8>(p, out, i, acc, c);
    default:  // kUInt8: the launchers check the dtype before anything is enqueued
      return quantized_store_as<DType::kUInt8>(p, out, i, acc, c);
  }
}

}  // namespace xpuruntime::cuda_raw::detail
