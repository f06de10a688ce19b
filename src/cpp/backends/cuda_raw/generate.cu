// Kernels that generate or place elements: one_hot, trilu, tile, scatter_nd. Data movement by element size
// where the values are only copied (trilu, tile, scatter_nd, one_hot's on/off values).
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

template <typename I, typename E>
__global__ void one_hot_kernel(const I* indices, E* y, std::int64_t n, std::int64_t depth, std::int64_t inner, E on,
                               E off) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t in = i % inner;
    const std::int64_t d = (i / inner) % depth;
    const std::int64_t o = i / (inner * depth);
    std::int64_t index = static_cast<std::int64_t>(indices[o * inner + in]);
    if (index < 0) index += depth;
    y[i] = index == d ? on : off;
  }
}

template <typename E>
__global__ void trilu_kernel(const E* x, E* y, std::int64_t n, std::int64_t rows, std::int64_t cols, std::int64_t k,
                             bool upper) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t j = i % cols;
    const std::int64_t r = (i / cols) % rows;
    const bool keep = upper ? (j - r >= k) : (j - r <= k);
    y[i] = keep ? x[i] : E{};
  }
}

struct TileGeometry {
  int rank = 0;
  std::int64_t out_size[kMaxDims] = {};  // innermost first
  std::int64_t in_size[kMaxDims] = {};
  std::int64_t in_stride[kMaxDims] = {};
};

template <typename E>
__global__ void tile_kernel(const E* x, E* y, std::int64_t n, TileGeometry g) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::int64_t rest = i, offset = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == g.rank) break;
      const std::int64_t q = rest / g.out_size[d];
      offset += ((rest - q * g.out_size[d]) % g.in_size[d]) * g.in_stride[d];
      rest = q;
    }
    y[i] = x[offset];
  }
}

// The tile geometry in 32-bit indices, its sizes as fast divisors (Note [Fast division]).
struct TileGeometry32 {
  int rank = 0;
  FastDivider out_size[kMaxDims];
  FastDivider in_size[kMaxDims];
  std::int32_t in_stride[kMaxDims] = {};
};

constexpr int kTileUnroll = 4;

// tile_kernel when every index fits in int32: kTileUnroll words per thread, all loads before the stores.
template <typename E>
__global__ void __launch_bounds__(kThreads) tile_kernel32(const E* x, E* y, std::int32_t n, TileGeometry32 g) {
  const std::int32_t stride = static_cast<std::int32_t>(blockDim.x * gridDim.x) * kTileUnroll;
  for (std::int32_t base = static_cast<std::int32_t>(blockIdx.x * blockDim.x) * kTileUnroll +
                           static_cast<std::int32_t>(threadIdx.x);
       base < n; base += stride) {
    E words[kTileUnroll];
#pragma unroll
    for (int k = 0; k < kTileUnroll; ++k) {
      const std::int32_t i = base + k * static_cast<std::int32_t>(blockDim.x);
      if (i >= n) break;
      std::int32_t rest = i, offset = 0;
#pragma unroll
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == g.rank) break;
        const std::int32_t q = g.out_size[d].div(rest);
        const std::int32_t o = rest - q * g.out_size[d].value();
        offset += (o - g.in_size[d].div(o) * g.in_size[d].value()) * g.in_stride[d];
        rest = q;
      }
      words[k] = x[offset];
    }
#pragma unroll
    for (int k = 0; k < kTileUnroll; ++k) {
      const std::int32_t i = base + k * static_cast<std::int32_t>(blockDim.x);
      if (i < n) y[i] = words[k];
    }
  }
}

struct NdGeometry {
  std::int64_t size[kMaxDims] = {};
  std::int64_t stride[kMaxDims] = {};
};

// The element of y that slice element `s` of tuple `t` lands on, or -1 for an out-of-range tuple.
template <typename I>
__device__ __forceinline__ std::int64_t scatter_offset(const I* indices, std::int64_t t, int depth, std::int64_t s,
                                                       const NdGeometry& g) {
  std::int64_t offset = s;
  for (int k = 0; k < depth; ++k) {
    std::int64_t index = static_cast<std::int64_t>(indices[t * depth + k]);
    if (index < 0) index += g.size[k];
    if (index < 0 || index >= g.size[k]) return -1;
    offset += index * g.stride[k];
  }
  return offset;
}

// One thread per element of a slice: it walks the tuples in order and writes each update to its place, so for
// duplicate tuples the last one wins, whatever the launch. Out-of-range tuples are skipped.
template <typename E, typename I>
__global__ void scatter_nd_kernel(const I* indices, const E* updates, E* y, std::int64_t tuples, int depth,
                                  std::int64_t slice, NdGeometry g) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t s = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < slice; s += stride) {
    for (std::int64_t t = 0; t < tuples; ++t) {
      const std::int64_t offset = scatter_offset(indices, t, depth, s, g);
      if (offset >= 0) y[offset] = updates[t * slice + s];
    }
  }
}

// ScatterND with a reduction: as scatter_nd_kernel, each step combining in fp32 (integers in their own type) and
// storing back in the element type, so duplicates combine in tuple order exactly as the reference library does.
template <typename T>
__device__ __forceinline__ T scatter_combine(T a, T b, int reduction) {
  if constexpr (std::is_integral_v<T>) {
    switch (reduction) {
      case 1: return static_cast<T>(a + b);
      case 2: return static_cast<T>(a * b);
      case 3: return a > b ? a : b;
      default: return a < b ? a : b;
    }
  } else {
    const float x = to_float(a), y = to_float(b);
    switch (reduction) {
      case 1: return from_float<T>(x + y);
      case 2: return from_float<T>(x * y);
      case 3: return from_float<T>(fmaxf(x, y));
      default: return from_float<T>(fminf(x, y));
    }
  }
}

template <typename T, typename I>
__global__ void scatter_nd_reduce_kernel(const I* indices, const T* updates, T* y, std::int64_t tuples, int depth,
                                         std::int64_t slice, NdGeometry g, int reduction) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t s = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < slice; s += stride) {
    for (std::int64_t t = 0; t < tuples; ++t) {
      const std::int64_t offset = scatter_offset(indices, t, depth, s, g);
      if (offset >= 0) y[offset] = scatter_combine(y[offset], updates[t * slice + s], reduction);
    }
  }
}

}  // namespace

void one_hot(const void* indices, DType index_dtype, void* y, std::size_t element_size, std::int64_t outer,
             std::int64_t depth, std::int64_t inner, std::uint64_t on_bits, std::uint64_t off_bits, void* stream) {
  const std::int64_t n = outer * depth * inner;
  if (n <= 0) return;
  dispatch_element_size(element_size, "one_hot", [&](auto tag) {
    using E = decltype(tag);
    const auto launch = [&](auto index_tag) {
      using I = decltype(index_tag);
      one_hot_kernel<I, E><<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
          static_cast<const I*>(indices), static_cast<E*>(y), n, depth, inner, element_of<E>(on_bits),
          element_of<E>(off_bits));
    };
    if (index_dtype == DType::kInt32) {
      launch(std::int32_t{});
    } else {
      XPURT_CHECK(index_dtype == DType::kInt64, "cuda_raw::one_hot: indices must be int32 or int64");
      launch(std::int64_t{});
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

void trilu(const void* x, void* y, std::size_t element_size, std::int64_t batch, std::int64_t rows, std::int64_t cols,
           std::int64_t k, bool upper, void* stream) {
  const std::int64_t n = batch * rows * cols;
  if (n <= 0) return;
  dispatch_element_size(element_size, "trilu", [&](auto tag) {
    using E = decltype(tag);
    trilu_kernel<E><<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<const E*>(x), static_cast<E*>(y), n, rows, cols, k, upper);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

void tile(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& in_shape,
          const std::vector<std::int64_t>& out_shape, void* stream) {
  XPURT_CHECK(in_shape.size() == out_shape.size() && in_shape.size() <= static_cast<std::size_t>(kMaxDims),
              "cuda_raw::tile: ranks ", in_shape.size(), " and ", out_shape.size(), " must agree and be <= ", kMaxDims);
  std::int64_t n = 1;
  for (const std::int64_t d : out_shape) n *= d;
  if (n == 0) return;
  // Note [Tile in wide words]
  // Innermost dims that are not repeated merge into the next one out (their elements stay one contiguous run of
  // the input and of each output copy), and the innermost dim then moves in the widest word (up to 16 bytes) that
  // divides its input run and aligns both pointers: a repeat wraps at a multiple of the run, so never inside a
  // word. A thread per 2-byte element, with a 64-bit division and modulo per dim, copied a tile at 12% of an
  // H200's copy bandwidth (71% in 16-byte words); where every index fits in int32 the divisions are fast ones
  // (Note [Fast division]) and each thread keeps kTileUnroll loads in flight.
  std::vector<std::int64_t> ins(in_shape.rbegin(), in_shape.rend()), outs(out_shape.rbegin(), out_shape.rend());
  while (ins.size() > 1 && ins[0] == outs[0]) {
    ins[1] *= ins[0];
    outs[1] *= outs[0];
    ins.erase(ins.begin());
    outs.erase(outs.begin());
  }
  std::size_t word = element_size;
  if (!ins.empty()) {
    const std::int64_t run = ins[0] * static_cast<std::int64_t>(element_size);
    for (std::size_t w = 16; w > element_size; w /= 2) {
      if (run % static_cast<std::int64_t>(w) == 0 && is_aligned(x, w) && is_aligned(y, w)) {
        word = w;
        break;
      }
    }
    const std::int64_t per_word = static_cast<std::int64_t>(word / element_size);
    ins[0] /= per_word;
    outs[0] /= per_word;
    n /= per_word;
  }
  TileGeometry g;
  g.rank = static_cast<int>(ins.size());
  std::int64_t stride = 1;
  for (int d = 0; d < g.rank; ++d) {
    g.out_size[d] = outs[static_cast<std::size_t>(d)];
    g.in_size[d] = ins[static_cast<std::size_t>(d)];
    g.in_stride[d] = stride;
    stride *= ins[static_cast<std::size_t>(d)];
  }
  // 32-bit indices when the output fits, the grid's stride included (the input is never larger).
  const bool narrow = n <= std::numeric_limits<std::int32_t>::max() - kMaxBlocks * kThreads;
  TileGeometry32 g32;
  if (narrow) {
    g32.rank = g.rank;
    for (int d = 0; d < g.rank; ++d) {
      g32.out_size[d] = FastDivider(g.out_size[d]);
      g32.in_size[d] = FastDivider(g.in_size[d]);
      g32.in_stride[d] = static_cast<std::int32_t>(g.in_stride[d]);
    }
  }
  const auto launch = [&](auto tag) {
    using E = decltype(tag);
    if (narrow) {
      tile_kernel32<E><<<grid_for(n, kThreads * kTileUnroll, kMaxBlocks / kTileUnroll), kThreads, 0,
                         as_stream(stream)>>>(static_cast<const E*>(x), static_cast<E*>(y),
                                              static_cast<std::int32_t>(n), g32);
    } else {
      tile_kernel<E><<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(static_cast<const E*>(x),
                                                                                static_cast<E*>(y), n, g);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  };
  if (word == 16) {
    launch(uint4{});
  } else {
    dispatch_element_size(word, "tile", launch);
  }
}

void scatter_nd(const void* data, const void* indices, DType index_dtype, const void* updates, void* y,
                std::size_t element_size, const std::vector<std::int64_t>& data_shape, std::int64_t tuples,
                std::int64_t depth, void* stream, DType dtype, int reduction) {
  XPURT_CHECK(depth >= 1 && depth <= kMaxDims && depth <= static_cast<std::int64_t>(data_shape.size()),
              "cuda_raw::scatter_nd: index depth ", depth, " must be in [1, min(", kMaxDims, ", rank)]");
  std::int64_t numel = 1, slice = 1;
  for (std::size_t d = 0; d < data_shape.size(); ++d) {
    numel *= data_shape[d];
    if (static_cast<std::int64_t>(d) >= depth) slice *= data_shape[d];
  }
  const cudaStream_t s = as_stream(stream);
  if (numel > 0 && y != data) {
    XPURT_CUDA_CHECK(cudaMemcpyAsync(y, data, static_cast<std::size_t>(numel) * element_size,
                                     cudaMemcpyDeviceToDevice, s));
  }
  if (tuples == 0 || slice == 0) return;
  NdGeometry g;
  std::int64_t stride = slice;
  for (std::int64_t k = depth - 1; k >= 0; --k) {
    g.size[k] = data_shape[static_cast<std::size_t>(k)];
    g.stride[k] = stride;
    stride *= data_shape[static_cast<std::size_t>(k)];
  }
  if (reduction != 0) {
    const auto launch = [&](auto tag) {
      using T = decltype(tag);
      if (index_dtype == DType::kInt32) {
        scatter_nd_reduce_kernel<T, std::int32_t><<<grid_for(slice, kThreads), kThreads, 0, s>>>(
            static_cast<const std::int32_t*>(indices), static_cast<const T*>(updates), static_cast<T*>(y), tuples,
            static_cast<int>(depth), slice, g, reduction);
      } else {
        scatter_nd_reduce_kernel<T, std::int64_t><<<grid_for(slice, kThreads), kThreads, 0, s>>>(
            static_cast<const std::int64_t*>(indices), static_cast<const T*>(updates), static_cast<T*>(y), tuples,
            static_cast<int>(depth), slice, g, reduction);
      }
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    };
    if (dtype == DType::kInt32) return launch(std::int32_t{});
    if (dtype == DType::kInt64) return launch(std::int64_t{});
    return dispatch_float(dtype, "scatter_nd with a reduction", launch);
  }
  dispatch_element_size(element_size, "scatter_nd", [&](auto tag) {
    using E = decltype(tag);
    if (index_dtype == DType::kInt32) {
      scatter_nd_kernel<E, std::int32_t><<<grid_for(slice, kThreads), kThreads, 0, s>>>(
          static_cast<const std::int32_t*>(indices), static_cast<const E*>(updates), static_cast<E*>(y), tuples,
          static_cast<int>(depth), slice, g);
    } else {
      scatter_nd_kernel<E, std::int64_t><<<grid_for(slice, kThreads), kThreads, 0, s>>>(
          static_cast<const std::int64_t*>(indices), static_cast<const E*>(updates), static_cast<E*>(y), tuples,
          static_cast<int>(depth), slice, g);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

namespace {
__global__ void fault_kernel(int* address) { *address = 1; }
}  // namespace

// A store to an unmapped address: cudaErrorIllegalAddress at the next synchronization (tests of Note [Sticky CUDA
// errors] in device_manager.h).
void inject_fault(void* stream) {
  fault_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(reinterpret_cast<int*>(static_cast<std::uintptr_t>(16)));
}

}  // namespace xpuruntime::cuda_raw
