// The epilogue of the cublasLt qlinear_fp8 kernel (cublaslt_fp8_epilogue.h). Each thread takes four neighbouring
// outputs of one row (n is a multiple of 4): one 16-byte load of the accumulator, then the cpu kernel's arithmetic
// element by element, so that every output is what the cpu kernel makes of the same accumulator:
//   alpha = float32(double(x_scale) * double(w_scale[c]))    (the cpu kernel forms it in double and rounds once)
//   v     = acc * alpha + bias[c]                            (two float32 roundings, no fused multiply-add; a
//                                                            float16 bias widened exactly)
// Float8 rounding is cuda_fp8.h's __nv_cvt_float_to_fp8 with __NV_SATFINITE: to nearest even, past 448 and
// infinities to +-448, as ONNX's QuantizeLinear with saturate=1 (Note [Float8 on the GPU] in
// backends/cuda_raw/quantize.cu); a NaN keeps its sign here as ONNX and the cpu kernel keep it (0x7F / 0xFF).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cublaslt/cublaslt_fp8_epilogue.h"

namespace xpuruntime::cublaslt {
namespace {

constexpr int kThreads = 256;

__device__ std::uint8_t to_float8e4m3fn(float v) {
  if (isnan(v)) return signbit(v) ? 0xFF : 0x7F;
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__global__ void fp8_epilogue_kernel(Fp8EpilogueParams p, std::int64_t quads) {
  for (std::int64_t q = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t at = q * 4;
    const std::int64_t c0 = at % p.n;  // n % 4 == 0: the four outputs share a row
    const float4 acc = reinterpret_cast<const float4*>(p.accumulator)[q];
    const float a[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t c = c0 + j;
      const double w_scale = static_cast<double>(p.w_scale[p.w_scale_per_channel ? c : 0]);
      const float alpha = __double2float_rn(__dmul_rn(static_cast<double>(p.x_scale), w_scale));
      const float b = p.bias == nullptr ? 0.0f
                      : p.bias_half  ? __half2float(static_cast<const __half*>(p.bias)[c])
                                     : static_cast<const float*>(p.bias)[c];
      float v = __fadd_rn(__fmul_rn(a[j], alpha), b);
      if (p.relu && !(v > 0.0f) && !isnan(v)) v = 0.0f;
      switch (p.output) {
        case Fp8Output::kFloat32:
          static_cast<float*>(p.out)[at + j] = v;
          break;
        case Fp8Output::kFloat16:
          static_cast<__half*>(p.out)[at + j] = __float2half_rn(v);
          break;
        case Fp8Output::kFloat8E4M3FN:
          static_cast<std::uint8_t*>(p.out)[at + j] = to_float8e4m3fn(__fdiv_rn(v, p.y_scale));
          break;
      }
    }
  }
}

// One thread per element of the longest of the three outputs.
__global__ void fp8_prepare_kernel(Fp8PrepareParams p) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (p.bias != nullptr && i < p.n) static_cast<__half*>(p.bias16)[i] = __float2half_rn(p.bias[i]);
  if (p.x_scales != nullptr && i < p.m) p.x_scales[i] = p.x_scale;
  if (p.d_scale != nullptr && i == 0) *p.d_scale = p.d_scale_value;
}

}  // namespace

cudaError_t launch_fp8_prepare(const Fp8PrepareParams& params, cudaStream_t stream) {
  std::int64_t count = params.d_scale != nullptr ? 1 : 0;
  if (params.bias != nullptr) count = params.n > count ? params.n : count;
  if (params.x_scales != nullptr) count = params.m > count ? params.m : count;
  if (count == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  fp8_prepare_kernel<<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t launch_fp8_epilogue(const Fp8EpilogueParams& params, cudaStream_t stream) {
  const std::int64_t quads = params.m * params.n / 4;
  if (quads == 0) return cudaSuccess;
  const std::int64_t wanted = (quads + kThreads - 1) / kThreads;
  const auto blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  fp8_epilogue_kernel<<<blocks, kThreads, 0, stream>>>(params, quads);
  return cudaGetLastError();
}

}  // namespace xpuruntime::cublaslt
