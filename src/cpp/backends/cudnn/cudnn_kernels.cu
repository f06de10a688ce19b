#include "cudnn_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_utils.h"

namespace xpuruntime::cudnn {

namespace {

struct ParamPointers {
  const void* params[4];
};

__device__ inline float to_float(__half value) { return __half2float(value); }
__device__ inline float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }

// grid: (ceil(channels / blockDim.x), 4); blockIdx.y picks the parameter vector.
template <typename T>
__global__ void params_to_float_kernel(ParamPointers pointers, float* out, std::int64_t channels,
                                       std::size_t out_stride) {
  const std::int64_t channel = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (channel >= channels) return;
  const T* in = static_cast<const T*>(pointers.params[blockIdx.y]);
  out[blockIdx.y * out_stride + channel] = to_float(in[channel]);
}

}  // namespace

void launch_batch_norm_params_to_float(DType dtype, const void* const params[4], float* out,
                                       std::int64_t channels, std::size_t out_stride, cudaStream_t stream) {
  if (channels <= 0) return;
  ParamPointers pointers{{params[0], params[1], params[2], params[3]}};
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((channels + kThreads - 1) / kThreads), 4);
  if (dtype == DType::kFloat16) {
    params_to_float_kernel<__half><<<grid, kThreads, 0, stream>>>(pointers, out, channels, out_stride);
  } else if (dtype == DType::kBFloat16) {
    params_to_float_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(pointers, out, channels, out_stride);
  } else {
    throw XpuRuntimeError(detail::str_cat("internal error (please report): batch norm parameters to convert must be "
                                          "float16 or bfloat16, got ", dtype_name(dtype)));
  }
  XPURT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace xpuruntime::cudnn
