#include "cudnn_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

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

namespace {

template <typename T>
__global__ void crop_kernel(const T* in, T* out, std::int64_t total, std::int64_t in_h, std::int64_t in_w,
                            std::int64_t out_h, std::int64_t out_w, std::int64_t top, std::int64_t left) {
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t w = idx % out_w;
    const std::int64_t rest = idx / out_w;
    const std::int64_t h = rest % out_h;
    const std::int64_t plane = rest / out_h;
    out[idx] = in[(plane * in_h + h + top) * in_w + w + left];
  }
}

}  // namespace

void launch_crop_2d(std::size_t element_size, const void* in, void* out, std::int64_t planes, std::int64_t in_h,
                    std::int64_t in_w, std::int64_t out_h, std::int64_t out_w, std::int64_t top, std::int64_t left,
                    cudaStream_t stream) {
  const std::int64_t total = planes * out_h * out_w;
  if (total <= 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((total + kThreads - 1) / kThreads, 65535));
  if (element_size == 2) {
    crop_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(in),
                                                 static_cast<std::uint16_t*>(out), total, in_h, in_w, out_h, out_w,
                                                 top, left);
  } else if (element_size == 4) {
    crop_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint32_t*>(in),
                                                 static_cast<std::uint32_t*>(out), total, in_h, in_w, out_h, out_w,
                                                 top, left);
  } else {
    throw XpuRuntimeError(detail::str_cat("internal error (please report): crop of ", element_size, "-byte elements"));
  }
  XPURT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace xpuruntime::cudnn
