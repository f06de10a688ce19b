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

// out[p, h, w] = in[p, h + top, w + left] for `planes` planes of out_h x out_w elements of `element_size` bytes (2 or
// 4) from planes of in_h x in_w: the crop of a transposed convolution with asymmetric pads (Note [ConvTranspose as
// backward data]). Launches on `stream`; checks the launch.
void launch_crop_2d(std::size_t element_size, const void* in, void* out, std::int64_t planes, std::int64_t in_h,
                    std::int64_t in_w, std::int64_t out_h, std::int64_t out_w, std::int64_t top, std::int64_t left,
                    cudaStream_t stream);

}  // namespace xpuruntime::cudnn
