// Layer normalization over the trailing dimensions (x viewed as [rows, cols]). Rows of whole 16-byte vectors
// (every pointer 16-byte aligned, cols a multiple of the vector width, at most kMaxCachedVectors vectors per
// thread) take the register-cached kernel: each thread loads its vectors once, and the statistics and the output
// come from registers (Note [Register-cached rows]). Other rows take the scalar kernel: a warp per row for short
// rows, a block per row for long ones.
//
// Note [Register-cached rows]
// A transformer's LayerNorm rows are short (768 to 8192 elements) and there are few of them at batch 1 (one per
// token), so the kernel is latency-bound: what counts is how many dependent trips to memory a row takes. Reading
// the row once into registers with 16-byte loads makes it one trip (plus one for the residual, issued together)
// instead of three passes of 2-byte loads; the group size grows with the row (4 to 32 lanes for about two vectors
// per lane, a warp up to 4 vectors per lane, then 128 or 512 threads) so that no thread holds more than
// kMaxCachedVectors vectors, and short rows (ConvNeXt's 96 channels) do not leave most of a warp idle.
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

constexpr int kMaxCachedVectors = 4;

// Group of kGroup threads per row (kBlock / kGroup rows per block), each thread caching up to kMaxCachedVectors
// 16-byte vectors of the row: vector v of the row is held by lane v % kGroup. `vectors` = cols / kVec16<T>. The
// scale and bias vectors are loaded with the row, before the statistics, so that a row takes one trip to memory.
// Every thread of a block runs the same number of row iterations (a group past the last row loads nothing), so that
// sub-warp groups (kGroup < 32) shuffle in whole warps.
template <typename T, int kGroup, int kBlock>
__global__ void __launch_bounds__(kBlock) layer_norm_cached_kernel(const T* x, const T* residual, const T* scale,
                                                                   const T* bias, T* y, std::int64_t rows,
                                                                   int vectors, float epsilon) {
  static_assert(kBlock % kGroup == 0 && kBlock % 32 == 0, "whole groups and warps per block");
  constexpr int kVec = kVec16<T>;
  using V = Vec<T, kVec>;
  constexpr int kGroupsPerBlock = kBlock / kGroup;
  __shared__ float smem[kGroup >= 32 ? kGroup / 32 : 1];
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const float n = static_cast<float>(vectors) * kVec;
  const std::int64_t group_stride = static_cast<std::int64_t>(gridDim.x) * kGroupsPerBlock;
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * kGroupsPerBlock; base < rows;
       base += group_stride) {
    const std::int64_t r = base + threadIdx.x / kGroup;
    const int count = r < rows ? vectors : 0;  // the row's vectors; none past the last row
    const std::int64_t row = r < rows ? r : 0;
    const V* in = reinterpret_cast<const V*>(x) + row * vectors;
    const V* res = residual != nullptr ? reinterpret_cast<const V*>(residual) + row * vectors : nullptr;
    float values[kMaxCachedVectors][kVec];
    V scales[kMaxCachedVectors];
    V biases[kMaxCachedVectors];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxCachedVectors; ++i) {
      const int v = lane + i * kGroup;
      if (v < count) {
        const V a = in[v];
        if (scale != nullptr) scales[i] = reinterpret_cast<const V*>(scale)[v];
        if (bias != nullptr) biases[i] = reinterpret_cast<const V*>(bias)[v];
        if (res != nullptr) {
          const V b = res[v];
#pragma unroll
          for (int k = 0; k < kVec; ++k) values[i][k] = to_float(a.v[k]) + to_float(b.v[k]);
        } else {
#pragma unroll
          for (int k = 0; k < kVec; ++k) values[i][k] = to_float(a.v[k]);
        }
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum += values[i][k];
      }
    }
    const float mean = group_reduce<kGroup>(sum, SumOp{}, smem) / n;
    float squares = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxCachedVectors; ++i) {
      if (lane + i * kGroup < count) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float d = values[i][k] - mean;
          squares += d * d;
        }
      }
    }
    const float variance = group_reduce<kGroup>(squares, SumOp{}, smem) / n;
    const float rstd = 1.0f / sqrtf(variance + epsilon);
    V* out = reinterpret_cast<V*>(y) + row * vectors;
#pragma unroll
    for (int i = 0; i < kMaxCachedVectors; ++i) {
      const int v = lane + i * kGroup;
      if (v < count) {
        V o;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          float w = (values[i][k] - mean) * rstd;
          if (scale != nullptr) w *= to_float(scales[i].v[k]);
          if (bias != nullptr) w += to_float(biases[i].v[k]);
          o.v[k] = from_float<T>(w);
        }
        out[v] = o;
      }
    }
  }
}

// Sub-warp and warp groups: kGroup lanes per row, blocks of one warp while rows are few (spreading them over the
// SMs: GPT-2 at batch 1 has 128 rows) and of four warps otherwise.
template <typename T, int kGroup>
void launch_group_rows(const T* x, const T* residual, const T* scale, const T* bias, T* y, std::int64_t rows,
                       int vectors, float epsilon, cudaStream_t stream) {
  constexpr int kRowsPerWarp = 32 / kGroup;
  if (rows <= std::int64_t{1024} * kRowsPerWarp) {
    layer_norm_cached_kernel<T, kGroup, 32><<<grid_for(rows, kRowsPerWarp), 32, 0, stream>>>(
        x, residual, scale, bias, y, rows, vectors, epsilon);
  } else {
    layer_norm_cached_kernel<T, kGroup, 128><<<grid_for(rows, 4 * kRowsPerWarp), 128, 0, stream>>>(
        x, residual, scale, bias, y, rows, vectors, epsilon);
  }
}

// Launches the register-cached kernel when the row fits it (Note [Register-cached rows]); false otherwise.
template <typename T>
bool launch_cached(const T* x, const T* residual, const T* scale, const T* bias, T* y, std::int64_t rows,
                   std::int64_t cols, float epsilon, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  if (cols % kVec != 0) return false;
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(residual),
                        static_cast<const void*>(scale), static_cast<const void*>(bias),
                        static_cast<const void*>(y)}) {
    if (p != nullptr && !is_aligned(p, 16)) return false;
  }
  const std::int64_t vectors = cols / kVec;
  const int v = static_cast<int>(vectors);
  // About two vectors per lane: ConvNeXt's rows of 96 channels (12 vectors) take 8 lanes, not a warp of which 20
  // lanes would idle.
  if (vectors <= 8) {
    launch_group_rows<T, 4>(x, residual, scale, bias, y, rows, v, epsilon, stream);
  } else if (vectors <= 16) {
    launch_group_rows<T, 8>(x, residual, scale, bias, y, rows, v, epsilon, stream);
  } else if (vectors <= 32) {
    launch_group_rows<T, 16>(x, residual, scale, bias, y, rows, v, epsilon, stream);
  } else if (vectors <= 32 * kMaxCachedVectors) {
    launch_group_rows<T, 32>(x, residual, scale, bias, y, rows, v, epsilon, stream);
  } else if (vectors <= 128 * kMaxCachedVectors) {
    layer_norm_cached_kernel<T, 128, 128><<<grid_for(rows, 1), 128, 0, stream>>>(
        x, residual, scale, bias, y, rows, v, epsilon);
  } else if (vectors <= 512 * kMaxCachedVectors) {
    layer_norm_cached_kernel<T, 512, 512><<<grid_for(rows, 1), 512, 0, stream>>>(
        x, residual, scale, bias, y, rows, v, epsilon);
  } else {
    return false;
  }
  return true;
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
    if (launch_cached(xs, residuals, scales, biases, ys, rows, cols, epsilon, as_stream(stream))) {
      // register-cached rows
    } else if (cols <= kWarpRowMaxCols) {
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
