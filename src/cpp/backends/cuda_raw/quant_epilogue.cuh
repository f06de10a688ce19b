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
