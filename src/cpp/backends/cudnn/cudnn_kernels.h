// The cudnn backend's own CUDA kernels (cudnn_kernels.cu): the small glue cuDNN itself does not provide.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "xpuruntime/dtype.h"

namespace xpuruntime::cudnn {

// Converts the four per-channel parameter vectors of batch norm (scale, bias, mean, var: `channels` elements of
// `dtype` each, float16 or bfloat16) to float32: vector k goes to `out + k * out_stride`. cuDNN's batch norm
// takes float32 parameters whenever x is a 16-bit type. Launches on `stream`; checks the launch.
void launch_batch_norm_params_to_float(DType dtype, const void* const params[4], float* out,
                                       std::int64_t channels, std::size_t out_stride, cudaStream_t stream);

}  // namespace xpuruntime::cudnn
