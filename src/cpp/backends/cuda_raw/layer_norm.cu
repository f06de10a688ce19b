// Layer normalization over the trailing dimensions (x viewed as [rows, cols]): a warp per row for short rows,
// a block per row for long ones.
//
// Note [Two-pass statistics]
// The mean is computed first, then the variance as the mean of (x - mean)^2, both accumulated in fp32 and
// combined by a fixed-order group reduction. Unlike E[x^2] - E[x]^2 this does not cancel catastrophically when
// |mean| >> std, and unlike Welford it needs no division per element; the price is one more read of the row,
// which the L1/L2 caches mostly serve (rows here are at most a few hundred KiB).
#include <cstdint>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

constexpr std::int64_t kWarpRowMaxCols = 1024;
constexpr int kBlockGroup = 512;

// One group of kGroup threads per row, grid-stride over rows (uniform per group, so barriers are reached by
// the whole block for block groups).
template <typename T, int kGroup, int kBlock>
__global__ void __launch_bounds__(kBlock) layer_norm_kernel(const T* x, const T* residual, const T* scale,
                                                            const T* bias, T* y, std::int64_t rows, std::int64_t cols,
                                                            float epsilon) {
  static_assert(kBlock % kGroup == 0, "whole groups per block");
  constexpr int kGroupsPerBlock = kBlock / kGroup;
  __shared__ float smem[kGroup / 32];
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const float n = static_cast<float>(cols);
  const std::int64_t group_stride = static_cast<std::int64_t>(gridDim.x) * kGroupsPerBlock;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kGroup; r < rows;
       r += group_stride) {
    const T* in = x + r * cols;
    const T* res = residual != nullptr ? residual + r * cols : nullptr;
    // The row's value: x, or x + residual summed in fp32 (not rounded to T in between, as a separate Add would).
    auto value = [&](std::int64_t c) { return res != nullptr ? to_float(in[c]) + to_float(res[c]) : to_float(in[c]); };
    float sum = 0.0f;
    for (std::int64_t c = lane; c < cols; c += kGroup) sum += value(c);
    const float mean = group_reduce<kGroup>(sum, SumOp{}, smem) / n;
    float squares = 0.0f;
    for (std::int64_t c = lane; c < cols; c += kGroup) {
      const float d = value(c) - mean;
      squares += d * d;
    }
    const float variance = group_reduce<kGroup>(squares, SumOp{}, smem) / n;
    const float rstd = 1.0f / sqrtf(variance + epsilon);
    T* out = y + r * cols;
    for (std::int64_t c = lane; c < cols; c += kGroup) {
      float v = (value(c) - mean) * rstd;
      if (scale != nullptr) v *= to_float(scale[c]);
      if (bias != nullptr) v += to_float(bias[c]);
      out[c] = from_float<T>(v);
    }
  }
}

}  // namespace

void layer_norm(const void* x, const void* residual, const void* scale, const void* bias, void* y, DType dtype,
                std::int64_t rows, std::int64_t cols, float epsilon, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  dispatch_float(dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    const auto* residuals = static_cast<const T*>(residual);
    const auto* scales = static_cast<const T*>(scale);
    const auto* biases = static_cast<const T*>(bias);
    auto* ys = static_cast<T*>(y);
    if (cols <= kWarpRowMaxCols) {
      layer_norm_kernel<T, 32, kThreads><<<grid_for(rows, kThreads / 32), kThreads, 0, as_stream(stream)>>>(
          xs, residuals, scales, biases, ys, rows, cols, epsilon);
    } else {
      layer_norm_kernel<T, kBlockGroup, kBlockGroup><<<grid_for(rows, 1), kBlockGroup, 0, as_stream(stream)>>>(
          xs, residuals, scales, biases, ys, rows, cols, epsilon);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
