// Selection along an axis: arg_max / arg_min (a thread per output walks the axis in order) and top_k (a block per
// row sorts the row in shared memory with a bitonic network; ties by the smaller index, so the result does not
// depend on the launch).
#include <string>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

__device__ __forceinline__ double as_double(double v) { return v; }
template <typename T>
__device__ __forceinline__ float as_double(T v) {
  return to_float(v);
}

template <typename T>
__global__ void arg_reduce_kernel(bool max, bool last, const T* x, std::int64_t* y, std::int64_t outer,
                                  std::int64_t axis_size, std::int64_t inner) {
  const std::int64_t lines = outer * inner;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < lines; t += stride) {
    const std::int64_t o = t / inner;
    const std::int64_t base = o * axis_size * inner + (t - o * inner);
    auto best = as_double(x[base]);
    std::int64_t at = 0;
    for (std::int64_t k = 1; k < axis_size; ++k) {
      const auto v = as_double(x[base + k * inner]);
      if (isnan(best)) break;  // the first NaN wins (NumPy)
      const bool better = isnan(v) || (max ? (v > best || (last && v == best)) : (v < best || (last && v == best)));
      if (better) {
        best = v;
        at = k;
      }
    }
    y[t] = at;
  }
}

template <typename T>
__device__ __forceinline__ bool comes_first(float va, int ia, float vb, int ib, bool largest) {
  if (va != vb) return largest ? va > vb : va < vb;
  return ia < ib;
}

template <typename T>
__global__ void top_k_kernel(const T* x, T* values, std::int64_t* indices, std::int64_t rows, int cols, int padded,
                             int k, bool largest) {
  extern __shared__ unsigned char smem[];
  float* key = reinterpret_cast<float*>(smem);
  int* idx = reinterpret_cast<int*>(key + padded);
  const float sentinel = largest ? -INFINITY : INFINITY;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    for (int i = static_cast<int>(threadIdx.x); i < padded; i += static_cast<int>(blockDim.x)) {
      key[i] = i < cols ? to_float(row[i]) : sentinel;
      idx[i] = i < cols ? i : (1 << 30) + i;
    }
    __syncthreads();
    for (int size = 2; size <= padded; size <<= 1) {
      for (int j = size >> 1; j > 0; j >>= 1) {
        for (int i = static_cast<int>(threadIdx.x); i < padded; i += static_cast<int>(blockDim.x)) {
          const int partner = i ^ j;
          if (partner > i) {
            const bool forward = (i & size) == 0;
            const bool partner_first = comes_first<T>(key[partner], idx[partner], key[i], idx[i], largest);
            if (forward == partner_first) {
              const float kv = key[i];
              key[i] = key[partner];
              key[partner] = kv;
              const int iv = idx[i];
              idx[i] = idx[partner];
              idx[partner] = iv;
            }
          }
        }
        __syncthreads();
      }
    }
    for (int i = static_cast<int>(threadIdx.x); i < k; i += static_cast<int>(blockDim.x)) {
      values[r * k + i] = from_float<T>(key[i]);
      indices[r * k + i] = idx[i];
    }
    __syncthreads();
  }
}

}  // namespace

void arg_reduce(bool max, bool select_last_index, const void* x, DType dtype, void* y, std::int64_t outer,
                std::int64_t axis_size, std::int64_t inner, void* stream) {
  const std::int64_t lines = outer * inner;
  if (lines <= 0) return;
  XPURT_CHECK(axis_size > 0, "cuda_raw::arg_reduce: the reduced axis is empty");
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    arg_reduce_kernel<T><<<grid_for(lines, kThreads), kThreads, 0, as_stream(stream)>>>(
        max, select_last_index, static_cast<const T*>(x), static_cast<std::int64_t*>(y), outer, axis_size, inner);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  };
  if (dtype == DType::kFloat64) return launch(double{});
  dispatch_float(dtype, "arg_max / arg_min", launch);
}

void top_k(const void* x, DType dtype, void* values, void* indices, std::int64_t rows, std::int64_t cols,
           std::int64_t k, bool largest, void* stream) {
  if (rows == 0 || k == 0) return;  // an empty result (a segment whose NonZero found nothing gives one)
  XPURT_CHECK(cols >= 1 && cols <= kTopKMaxCols && k >= 0 && k <= cols, "cuda_raw::top_k: rows of 1 to ",
              kTopKMaxCols, " elements and 0 <= k <= cols, got cols ", cols, " and k ", k);
  int padded = 1;
  while (padded < cols) padded <<= 1;
  const int threads = std::min(512, std::max(32, padded / 2));
  const std::size_t shared = static_cast<std::size_t>(padded) * (sizeof(float) + sizeof(int));
  dispatch_float(dtype, "top_k", [&](auto tag) {
    using T = decltype(tag);
    top_k_kernel<T><<<grid_for(rows, 1), threads, shared, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(values), static_cast<std::int64_t*>(indices), rows,
        static_cast<int>(cols), padded, static_cast<int>(k), largest);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
