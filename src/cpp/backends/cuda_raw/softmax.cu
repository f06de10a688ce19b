// Softmax kernels: along the last axis (a warp or a block per row), along an inner axis (a thread per column,
// strided), and the scaled/masked softmax of the unfused attention.
//
// Note [Online softmax]
// Each thread keeps a running maximum m and a running sum s of exp(x - m) over the entries it reads (when a
// larger entry arrives, s is rescaled by exp(m_old - m_new)); the group then merges the (m, s) pairs. One pass
// over the row finds both, a second pass writes exp(x - m) / s. -inf entries contribute nothing, so a row with
// some -inf entries (masked keys) is exact, and a row that is -inf everywhere ends with m = -inf, s = 0 and
// yields NaN, as PyTorch does. A NaN entry makes its row NaN. In-place (y == x) is safe: each element is read
// for the second time and written by the same thread, after the group's merge, which follows every first read.
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// Rows of at most this many columns take a warp each; longer ones a block of kBlockGroup threads.
constexpr std::int64_t kWarpRowMaxCols = 1024;
constexpr int kBlockGroup = 512;

__device__ __forceinline__ void online_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m == -inf: s == 0 and expf(-inf) == 0
    m = x;
  } else if (x != -INFINITY) {
    s += expf(x - m);  // NaN x: s becomes NaN
  }
}

__device__ __forceinline__ void online_merge(float& m, float& s, float other_m, float other_s) {
  const float merged = fmaxf(m, other_m);
  if (merged == -INFINITY) return;  // both empty so far: s == other_s == 0
  s = s * expf(m - merged) + other_s * expf(other_m - merged);
  m = merged;
}

// Merges (m, s) over a group of kGroup threads, like group_reduce (every thread gets the same bits: the merge
// is commutative). `smem` holds 2 * kGroup / 32 floats.
template <int kGroup>
__device__ __forceinline__ void group_online_merge(float& m, float& s, float* smem) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_m = __shfl_xor_sync(0xffffffffu, m, offset);
    const float other_s = __shfl_xor_sync(0xffffffffu, s, offset);
    online_merge(m, s, other_m, other_s);
  }
  if constexpr (kGroup > 32) {
    constexpr int kWarps = kGroup / 32;
    if ((threadIdx.x & 31) == 0) {
      smem[threadIdx.x / 32] = m;
      smem[kWarps + threadIdx.x / 32] = s;
    }
    __syncthreads();
    m = smem[0];
    s = smem[kWarps];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) online_merge(m, s, smem[w], smem[kWarps + w]);
    __syncthreads();
  }
}

// Row sources: what the softmax of row r reads at column c. `row(r)` does the per-row index math once.
template <typename T>
struct PlainSource {
  const T* x;
  std::int64_t cols;

  struct Row {
    const T* x;
    __device__ __forceinline__ float operator()(std::int64_t c) const { return to_float(x[c]); }
  };
  __device__ __forceinline__ Row row(std::int64_t r) const { return Row{x + r * cols}; }
};

// scores * scale + mask, -inf beyond the causal diagonal; see attention_softmax in cuda_raw_ops.h.
template <typename T>
struct AttentionSource {
  const T* scores;
  const T* mask;  // null: no mask
  std::int64_t sq;
  std::int64_t sk;
  std::int64_t heads;
  std::int64_t mask_strides[4];
  float scale;
  bool causal;

  struct Row {
    const T* scores;
    const T* mask;
    std::int64_t mask_key_stride;
    std::int64_t last_key;  // keys after it are masked (causal); sk - 1 otherwise
    float scale;
    __device__ __forceinline__ float operator()(std::int64_t c) const {
      if (c > last_key) return -INFINITY;
      float v = to_float(scores[c]) * scale;
      if (mask != nullptr) v += to_float(mask[c * mask_key_stride]);
      return v;
    }
  };
  __device__ __forceinline__ Row row(std::int64_t r) const {
    const std::int64_t query = r % sq;
    const std::int64_t batch_head = r / sq;
    const std::int64_t head = batch_head % heads;
    const std::int64_t batch = batch_head / heads;
    const T* mask_row =
        mask != nullptr ? mask + batch * mask_strides[0] + head * mask_strides[1] + query * mask_strides[2] : nullptr;
    return Row{scores + r * sk, mask_row, mask_strides[3], causal ? query : sk - 1, scale};
  }
};

// One group of kGroup threads per row (grid-stride over rows; the loop bounds are uniform per group, and per
// block for block groups, so every thread reaches the barriers). Note [Online softmax].
template <typename T, typename Source, int kGroup, int kBlock>
__global__ void __launch_bounds__(kBlock) softmax_rows_kernel(Source source, T* y, std::int64_t rows,
                                                              std::int64_t cols, bool log_output) {
  static_assert(kBlock % kGroup == 0, "whole groups per block");
  constexpr int kGroupsPerBlock = kBlock / kGroup;
  __shared__ float smem[2 * (kGroup / 32)];
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const std::int64_t group_stride = static_cast<std::int64_t>(gridDim.x) * kGroupsPerBlock;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kGroup; r < rows;
       r += group_stride) {
    const auto row = source.row(r);
    float m = -INFINITY;
    float s = 0.0f;
    for (std::int64_t c = lane; c < cols; c += kGroup) online_add(m, s, row(c));
    group_online_merge<kGroup>(m, s, smem);
    T* out = y + r * cols;
    if (log_output) {  // log_softmax: x - m - log(s)
      const float shift = m + logf(s);
      for (std::int64_t c = lane; c < cols; c += kGroup) out[c] = from_float<T>(row(c) - shift);
    } else {
      for (std::int64_t c = lane; c < cols; c += kGroup) out[c] = from_float<T>(expf(row(c) - m) / s);
    }
  }
}

template <typename T, typename Source>
void launch_softmax_rows(const Source& source, T* y, std::int64_t rows, std::int64_t cols, cudaStream_t stream,
                         bool log_output = false) {
  if (rows <= 0 || cols <= 0) return;
  if (cols <= kWarpRowMaxCols) {
    constexpr int kBlock = kThreads;
    softmax_rows_kernel<T, Source, 32, kBlock>
        <<<grid_for(rows, kBlock / 32), kBlock, 0, stream>>>(source, y, rows, cols, log_output);
  } else {
    softmax_rows_kernel<T, Source, kBlockGroup, kBlockGroup>
        <<<grid_for(rows, 1), kBlockGroup, 0, stream>>>(source, y, rows, cols, log_output);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// Softmax along the middle axis of [outer, axis_size, inner] (inner > 1): one thread per (outer, inner)
// column; neighbouring threads read neighbouring elements.
template <typename T>
__global__ void softmax_inner_kernel(const T* x, T* y, std::int64_t outer, std::int64_t axis_size,
                                     std::int64_t inner, bool log_output) {
  const std::int64_t columns = outer * inner;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < columns; t += stride) {
    const std::int64_t o = t / inner;
    const std::int64_t base = o * axis_size * inner + (t - o * inner);
    float m = -INFINITY;
    float s = 0.0f;
    for (std::int64_t k = 0; k < axis_size; ++k) online_add(m, s, to_float(x[base + k * inner]));
    const float shift = m + logf(s);
    for (std::int64_t k = 0; k < axis_size; ++k) {
      const float v = to_float(x[base + k * inner]);
      y[base + k * inner] = from_float<T>(log_output ? v - shift : expf(v - m) / s);
    }
  }
}

}  // namespace

namespace {

void softmax_any(const void* x, void* y, DType dtype, std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
                 bool log_output, void* stream) {
  if (outer <= 0 || axis_size <= 0 || inner <= 0) return;
  dispatch_float(dtype, log_output ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    if (inner == 1) {
      launch_softmax_rows<T>(PlainSource<T>{static_cast<const T*>(x), axis_size}, static_cast<T*>(y), outer,
                             axis_size, as_stream(stream), log_output);
      return;
    }
    softmax_inner_kernel<T><<<grid_for(outer * inner, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), outer, axis_size, inner, log_output);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace

void softmax(const void* x, void* y, DType dtype, std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
             void* stream) {
  softmax_any(x, y, dtype, outer, axis_size, inner, false, stream);
}

void log_softmax(const void* x, void* y, DType dtype, std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
                 void* stream) {
  softmax_any(x, y, dtype, outer, axis_size, inner, true, stream);
}

void softmax_lastdim(const void* x, void* y, DType dtype, std::int64_t rows, std::int64_t cols, void* stream) {
  dispatch_float(dtype, "softmax", [&](auto tag) {
    using T = decltype(tag);
    launch_softmax_rows<T>(PlainSource<T>{static_cast<const T*>(x), cols}, static_cast<T*>(y), rows, cols,
                           as_stream(stream));
  });
}

void attention_softmax(void* scores, DType dtype, std::int64_t batch_heads, std::int64_t heads, std::int64_t sq,
                       std::int64_t sk, float scale, bool causal, const void* mask,
                       const std::vector<std::int64_t>& mask_strides, void* stream) {
  XPURT_CHECK(heads >= 1 && batch_heads >= 0 && batch_heads % heads == 0, "cuda_raw::attention_softmax: heads (",
              heads, ") must be >= 1 and divide batch_heads (", batch_heads, ")");
  XPURT_CHECK(sq >= 0 && sk >= 0, "cuda_raw::attention_softmax: sq and sk must be >= 0, got ", sq, " and ", sk);
  XPURT_CHECK(mask == nullptr || mask_strides.size() == 4, "cuda_raw::attention_softmax: mask_strides must have 4 "
              "entries (the [B, H, Sq, Sk] strides of the mask in elements), got ", mask_strides.size());
  dispatch_float(dtype, "attention softmax", [&](auto tag) {
    using T = decltype(tag);
    AttentionSource<T> source{static_cast<const T*>(scores), static_cast<const T*>(mask), sq, sk, heads,
                              {0, 0, 0, 0}, scale, causal};
    if (mask != nullptr) {
      for (int k = 0; k < 4; ++k) source.mask_strides[k] = mask_strides[static_cast<std::size_t>(k)];
    }
    launch_softmax_rows<T>(source, static_cast<T*>(scores), batch_heads * sq, sk, as_stream(stream));
  });
}

}  // namespace xpuruntime::cuda_raw
