// Data-movement kernels (transpose, concat, slice/expand through strided_gather, gather), where, the comparisons,
// logical_not, integer add/sub/mul/div/neg and casts between any dtypes.
//
// Note [Gather index errors]
// ONNX leaves an out-of-range Gather index undefined; clamping it would hide a bug as a plausible answer. The
// kernel writes zeros for such a row and sets a flag in device memory (one per device). Reading the flag needs a
// synchronization, so it is not read on the hot path: `gather_index_error()` reads (and resets) it on demand, and
// with XPURT_CUDA_RAW_CHECK_INDICES=1 every gather launch synchronizes and raises InvalidArgumentError when the
// flag is set (a debug mode; the cpu kernel always raises).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "core/data_ops.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

__device__ int g_gather_index_error = 0;

// Sizes and strides of up to kMaxDims leading data dimensions, passed by value (gather_nd).
struct Dims {
  std::int64_t size[kMaxDims] = {};
  std::int64_t stride[kMaxDims] = {};
};

// ---- strided gather (slice, expand, run-preserving transpose) ----

// Each thread copies kStridedUnroll words a block apart per step, all loads issued before the stores (one word
// per step left expand and the heads transpose at 64-72% of an H200's copy bandwidth).
constexpr int kStridedUnroll = 4;

template <typename V, typename Index>
__global__ void strided_gather_kernel(const V* x, V* y, Index n, OffsetCalculator<1, Index> calc) {
  const Index step = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x) * kStridedUnroll;
  for (Index base = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) * kStridedUnroll +
                    static_cast<Index>(threadIdx.x);
       base < n; base += step) {
    V values[kStridedUnroll];
#pragma unroll
    for (int u = 0; u < kStridedUnroll; ++u) {
      const Index i = base + static_cast<Index>(u) * static_cast<Index>(blockDim.x);
      if (i < n) {
        Index offsets[1];
        calc.offsets(i, offsets);
        values[u] = x[offsets[0]];
      }
    }
#pragma unroll
    for (int u = 0; u < kStridedUnroll; ++u) {
      const Index i = base + static_cast<Index>(u) * static_cast<Index>(blockDim.x);
      if (i < n) y[i] = values[u];
    }
  }
}

template <typename V>
void launch_strided_gather(const void* x, void* y, const std::vector<std::int64_t>& shape,
                           const std::vector<std::int64_t>& strides, std::int64_t n, cudaStream_t stream) {
  const std::vector<std::int64_t>* const table[1] = {&strides};
  // fits_int32 keeps one grid step of headroom; a step here is kStridedUnroll of them.
  const bool small = n <= std::numeric_limits<std::int32_t>::max() - kMaxBlocks * kThreads * kStridedUnroll;
  if (small && fits_int32(n, shape, {&strides})) {
    strided_gather_kernel<V, std::int32_t><<<grid_for(n, kThreads * kStridedUnroll), kThreads, 0, stream>>>(
        static_cast<const V*>(x), static_cast<V*>(y), static_cast<std::int32_t>(n),
        make_offset_calculator<1, std::int32_t>(shape, table));
  } else {
    strided_gather_kernel<V, std::int64_t><<<grid_for(n, kThreads * kStridedUnroll), kThreads, 0, stream>>>(
        static_cast<const V*>(x), static_cast<V*>(y), n, make_offset_calculator<1, std::int64_t>(shape, table));
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// Drops size-1 dims and merges neighbours that x steps through as one dimension.
void merge_dims(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                std::vector<std::int64_t>* sizes, std::vector<std::int64_t>* steps) {
  sizes->clear();
  steps->clear();
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!sizes->empty() && steps->back() == strides[d] * shape[d]) {
      sizes->back() *= shape[d];
      steps->back() = strides[d];
      continue;
    }
    sizes->push_back(shape[d]);
    steps->push_back(strides[d]);
  }
}

// ---- transpose through shared-memory tiles ----

constexpr int kTile = 32;
constexpr int kTileRows = 8;

// Calls body(offsets, a0, b0) for each (batch, kSide x kSide tile) that this block owns: batches along the grid's
// y, tiles along its x. The body's barriers are reached by the whole block (the walk is uniform per block).
template <int kSide, typename Index, typename Body>
__device__ __forceinline__ void for_each_tile(Index size_a, Index size_b, Index batches,
                                              const OffsetCalculator<2, Index>& batch, Body&& body) {
  const Index tiles_a = (size_a + kSide - 1) / kSide;
  const Index tiles = tiles_a * ((size_b + kSide - 1) / kSide);
  for (Index n = static_cast<Index>(blockIdx.y); n < batches; n += static_cast<Index>(gridDim.y)) {
    Index offsets[2];
    batch.offsets(n, offsets);
    for (Index t = static_cast<Index>(blockIdx.x); t < tiles; t += static_cast<Index>(gridDim.x)) {
      body(offsets, (t % tiles_a) * kSide, (t / tiles_a) * kSide);
    }
  }
}

// For each batch (the dims other than A and B, through `batch`), the tile (a0.., b0..) is read along B (x's
// contiguous dim) and written along A (y's contiguous dim). y[out + b * out_stride_b + a] = x[in + a * in_stride_a
// + b].
template <typename E, typename Index>
__global__ void transpose_tiled_kernel(const E* x, E* y, Index size_a, Index size_b, Index in_stride_a,
                                       Index out_stride_b, Index batches, OffsetCalculator<2, Index> batch) {
  __shared__ E tile[kTile][kTile + 1];
  for_each_tile<kTile>(size_a, size_b, batches, batch, [&](const Index (&offsets)[2], Index a0, Index b0) {
    for (int k = static_cast<int>(threadIdx.y); k < kTile; k += kTileRows) {
      const Index a = a0 + k, b = b0 + static_cast<Index>(threadIdx.x);
      if (a < size_a && b < size_b) tile[k][threadIdx.x] = x[offsets[0] + a * in_stride_a + b];
    }
    __syncthreads();
    for (int k = static_cast<int>(threadIdx.y); k < kTile; k += kTileRows) {
      const Index b = b0 + k, a = a0 + static_cast<Index>(threadIdx.x);
      if (a < size_a && b < size_b) y[offsets[1] + b * out_stride_b + a] = tile[threadIdx.x][k];
    }
    __syncthreads();
  });
}

// Note [Transpose in word pairs]
// 32x32 tiles of 2-byte elements move 64 bytes per warp access, and an H200 ran the NCHW -> NHWC transpose of a
// large float16 tensor at 45% of its copy bandwidth that way. When both transposed dims and every stride are even
// (and x, y 4-byte aligned), a block instead moves a 64x64 tile as 32-bit words: each thread loads the words
// (x[a][b], x[a][b+1]) and (x[a+1][b], x[a+1][b+1]) of two neighbouring rows, swaps their halves with
// __byte_perm into the words (a, a+1) of columns b and b+1, and stores those in shared memory; the write-out then
// stores whole words of y's rows. Warps read and write 128 contiguous bytes, each thread keeps eight loads in
// flight, and the shared-memory word of (column c, row pair p) sits at [c][p ^ (c / 2)], which no two lanes of a
// warp share in either phase.
constexpr int kPairTile = 64;
constexpr std::int64_t kShortSide = 8;  // a transpose with a side shorter than this takes no tiles

template <typename Index>
__global__ void __launch_bounds__(kTile * kTileRows) transpose_pairs_kernel(
    const std::uint16_t* x, std::uint16_t* y, Index size_a, Index size_b, Index in_stride_a, Index out_stride_b,
    Index batches, OffsetCalculator<2, Index> batch) {
  constexpr int kPairs = kPairTile / 2;                      // 32-bit words across a tile
  constexpr int kRowPairsPerThread = kPairs / kTileRows;     // 4
  constexpr int kColumnsPerThread = kPairTile / kTileRows;   // 8
  __shared__ std::uint32_t tile[kPairTile][kPairs];          // [column b][row pair], swizzled
  const int lane = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for_each_tile<kPairTile>(size_a, size_b, batches, batch, [&](const Index (&offsets)[2], Index a0, Index b0) {
    const Index b = b0 + 2 * lane;
    std::uint32_t upper[kRowPairsPerThread], lower[kRowPairsPerThread];
#pragma unroll
    for (int k = 0; k < kRowPairsPerThread; ++k) {
      const Index a = a0 + 2 * (ty + k * kTileRows);
      upper[k] = lower[k] = 0;
      if (a < size_a && b < size_b) {  // a + 1 and b + 1 too: both sizes are even
        const std::uint16_t* p = x + offsets[0] + a * in_stride_a + b;
        upper[k] = *reinterpret_cast<const std::uint32_t*>(p);
        lower[k] = *reinterpret_cast<const std::uint32_t*>(p + in_stride_a);
      }
    }
#pragma unroll
    for (int k = 0; k < kRowPairsPerThread; ++k) {
      const int pair = ty + k * kTileRows;
      tile[2 * lane][pair ^ lane] = __byte_perm(upper[k], lower[k], 0x5410);      // column b: x[a][b], x[a+1][b]
      tile[2 * lane + 1][pair ^ lane] = __byte_perm(upper[k], lower[k], 0x7632);  // column b + 1
    }
    __syncthreads();
    const Index a = a0 + 2 * lane;
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      const int column = ty + k * kTileRows;
      const Index bb = b0 + column;
      if (a < size_a && bb < size_b) {
        *reinterpret_cast<std::uint32_t*>(y + offsets[1] + bb * out_stride_b + a) = tile[column][lane ^ (column / 2)];
      }
    }
    __syncthreads();
  });
}

// Note [Transposes of small matrices]
// ShuffleNetV2's channel shuffle in channels-last is a transpose of [N * H * W, 2, C / 2] into [.., C / 2, 2]:
// millions of 2 x 58 matrices. A 64 x 64 tile per matrix left 97% of each block idle (20 us a shuffle at batch 16 on
// an H200, 369 us of a 0.85 ms run). Where the matrices lie one after another in x and in y and several fit in a
// block's shared memory, a block copies a run of whole matrices into shared memory (16-byte words where the run's
// bytes allow), then writes the run of y in order, each element (or 16-byte word of them) gathered from shared
// memory: both sides move contiguous memory. Longer matrices with one short side go to the strided gather (y
// written in order, x read from a few rows at a time); the tiles keep the rest.
constexpr std::int64_t kSmallRunBytes = 8192;  // shared memory per block for a run of small matrices

// Whether matrices of `elements` elements of `element_size` bytes are small ones (at least two fit in a run).
constexpr bool small_matrices(std::int64_t elements, std::int64_t element_size) {
  return elements * element_size <= kSmallRunBytes / 2;
}

template <typename E>
__global__ void __launch_bounds__(kThreads) transpose_small_kernel(const E* x, E* y, std::int64_t matrices,
                                                                   int size_a, int size_b, int per_block,
                                                                   bool words) {
  extern __shared__ __align__(16) unsigned char small_run[];
  E* run = reinterpret_cast<E*>(small_run);
  constexpr int P = 16 / static_cast<int>(sizeof(E));
  const int ab = size_a * size_b;
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  // y's element i of the run: matrix i / ab, at (b, a) = ((i % ab) / A, (i % ab) % A), reads x's (a, b).
  const auto source = [&](int i) {
    const int m = i / ab, r = i - m * ab, b = r / size_a, a = r - b * size_a;
    return run[m * ab + a * size_b + b];
  };
  for (std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x) * per_block; m0 < matrices;
       m0 += static_cast<std::int64_t>(gridDim.x) * per_block) {
    const int count = static_cast<int>(std::min<std::int64_t>(per_block, matrices - m0)) * ab;
    const E* from = x + m0 * ab;
    E* to = y + m0 * ab;
    const bool vectors = words && count % P == 0;
    if (vectors) {
      for (int v = tid; v < count / P; v += threads) {
        reinterpret_cast<uint4*>(run)[v] = reinterpret_cast<const uint4*>(from)[v];
      }
    } else {
      for (int i = tid; i < count; i += threads) run[i] = from[i];
    }
    __syncthreads();
    if (vectors) {
      for (int v = tid; v < count / P; v += threads) {
        union {
          uint4 word;
          E e[P];
        } out;
#pragma unroll
        for (int k = 0; k < P; ++k) out.e[k] = source(v * P + k);
        reinterpret_cast<uint4*>(to)[v] = out.word;
      }
    } else {
      for (int i = tid; i < count; i += threads) to[i] = source(i);
    }
    __syncthreads();
  }
}

// Note [Transposes of small matrices]: false when the matrices are not packed one after another or too large.
template <typename E>
bool launch_transpose_small(const void* x, void* y, std::int64_t size_a, std::int64_t size_b,
                            std::int64_t in_stride_a, std::int64_t out_stride_b,
                            const std::vector<std::int64_t>& batch_sizes, const std::vector<std::int64_t>& batch_in,
                            const std::vector<std::int64_t>& batch_out, cudaStream_t stream) {
  const std::int64_t ab = size_a * size_b;
  const auto es = static_cast<std::int64_t>(sizeof(E));
  if (batch_sizes.size() > 1 || in_stride_a != size_b || out_stride_b != size_a || !small_matrices(ab, es)) {
    return false;
  }
  if (!batch_sizes.empty() && (batch_in[0] != ab || batch_out[0] != ab)) return false;
  const std::int64_t matrices = batch_sizes.empty() ? 1 : batch_sizes[0];
  std::int64_t per_block = kSmallRunBytes / (ab * es);
  const std::int64_t multiple = 16 / std::gcd<std::int64_t>(ab * es, 16);  // matrices per 16-byte boundary
  const bool words = is_aligned(x, 16) && is_aligned(y, 16) && per_block >= multiple;
  if (words) per_block -= per_block % multiple;
  const std::int64_t blocks = (matrices + per_block - 1) / per_block;
  transpose_small_kernel<E><<<grid_for(blocks, 1), kThreads, static_cast<std::size_t>(per_block * ab * es),
                              stream>>>(static_cast<const E*>(x), static_cast<E*>(y), matrices,
                                        static_cast<int>(size_a), static_cast<int>(size_b),
                                        static_cast<int>(per_block), words);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  return true;
}

template <typename E>
void launch_transpose_tiled(const void* x, void* y, std::int64_t size_a, std::int64_t size_b, std::int64_t in_stride_a,
                            std::int64_t out_stride_b, const std::vector<std::int64_t>& batch_sizes,
                            const std::vector<std::int64_t>& batch_in, const std::vector<std::int64_t>& batch_out,
                            std::int64_t numel, cudaStream_t stream) {
  std::int64_t batches = 1;
  for (const std::int64_t d : batch_sizes) batches *= d;
  const std::int64_t tiles = ((size_a + kTile - 1) / kTile) * ((size_b + kTile - 1) / kTile);
  const dim3 block(kTile, kTileRows);
  const dim3 grid(grid_for(tiles, 1), static_cast<unsigned>(std::min<std::int64_t>(batches, 65535)));
  const std::vector<std::int64_t>* const table[2] = {&batch_in, &batch_out};
  // The extent check covers every offset: the batch strides plus the tile's own dims.
  std::vector<std::int64_t> all_sizes = batch_sizes, all_in = batch_in, all_out = batch_out;
  all_sizes.insert(all_sizes.end(), {size_a, size_b});
  all_in.insert(all_in.end(), {in_stride_a, 1});
  all_out.insert(all_out.end(), {1, out_stride_b});
  const bool narrow = fits_int32(numel, all_sizes, {&all_in, &all_out});
  if (std::min(size_a, size_b) < kPairTile &&  // Note [Transposes of small matrices]
      launch_transpose_small<E>(x, y, size_a, size_b, in_stride_a, out_stride_b, batch_sizes, batch_in, batch_out,
                                stream)) {
    return;
  }
  const auto even = [](std::int64_t d) { return d % 2 == 0; };
  const bool pairs = sizeof(E) == 2 && is_aligned(x, 4) && is_aligned(y, 4) &&  // Note [Transpose in word pairs]
                     even(size_a) && even(size_b) && even(in_stride_a) && even(out_stride_b) &&
                     std::all_of(batch_in.begin(), batch_in.end(), even) &&
                     std::all_of(batch_out.begin(), batch_out.end(), even);
  if (pairs) {
    const std::int64_t pair_tiles = ((size_a + kPairTile - 1) / kPairTile) * ((size_b + kPairTile - 1) / kPairTile);
    const dim3 pair_grid(grid_for(pair_tiles, 1), grid.y);
    const auto* xs = static_cast<const std::uint16_t*>(x);
    auto* ys = static_cast<std::uint16_t*>(y);
    if (narrow) {
      transpose_pairs_kernel<std::int32_t><<<pair_grid, block, 0, stream>>>(
          xs, ys, static_cast<std::int32_t>(size_a), static_cast<std::int32_t>(size_b),
          static_cast<std::int32_t>(in_stride_a), static_cast<std::int32_t>(out_stride_b),
          static_cast<std::int32_t>(batches), make_offset_calculator<2, std::int32_t>(batch_sizes, table));
    } else {
      transpose_pairs_kernel<std::int64_t><<<pair_grid, block, 0, stream>>>(
          xs, ys, size_a, size_b, in_stride_a, out_stride_b, batches,
          make_offset_calculator<2, std::int64_t>(batch_sizes, table));
    }
  } else if (narrow) {
    transpose_tiled_kernel<E, std::int32_t><<<grid, block, 0, stream>>>(
        static_cast<const E*>(x), static_cast<E*>(y), static_cast<std::int32_t>(size_a),
        static_cast<std::int32_t>(size_b), static_cast<std::int32_t>(in_stride_a),
        static_cast<std::int32_t>(out_stride_b), static_cast<std::int32_t>(batches),
        make_offset_calculator<2, std::int32_t>(batch_sizes, table));
  } else {
    transpose_tiled_kernel<E, std::int64_t><<<grid, block, 0, stream>>>(
        static_cast<const E*>(x), static_cast<E*>(y), size_a, size_b, in_stride_a, out_stride_b, batches,
        make_offset_calculator<2, std::int64_t>(batch_sizes, table));
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- gather ----

// Note [Gather in row tiles]
// Long rows are copied in tiles: a tile is kGatherUnroll * blockDim.x vectors of one output row, each thread
// copying kGatherUnroll of them (loads issued before the stores, for bytes in flight), and the grid strides over
// (row, tile) pairs. One block per row (what this replaced) left a gather of a few huge rows -- the exporter's
// scalar q/k/v select of a whole [3, B, H, S, D] tensor is one row of a third of it -- to a single block: 13.5 ms
// for 128 MiB on an H200, against 60 us at the copy bandwidth. The block is as wide as a row needs (a multiple of
// the warp, at most kThreads), so rows of a few hundred vectors do not idle most of it.
constexpr int kGatherUnroll = 4;

template <typename V, typename IndexT>
__global__ void gather_rows_kernel(const V* data, const IndexT* indices, V* y, std::int64_t rows,
                                   std::int64_t num_indices, std::int64_t axis_size, std::int64_t row_vectors,
                                   std::int64_t tiles_per_row) {
  const std::int64_t tile_vectors = static_cast<std::int64_t>(blockDim.x) * kGatherUnroll;
  const std::int64_t tiles = rows * tiles_per_row;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t r = t / tiles_per_row;
    const std::int64_t first = (t - r * tiles_per_row) * tile_vectors + threadIdx.x;
    const std::int64_t o = r / num_indices;
    std::int64_t index = static_cast<std::int64_t>(indices[r - o * num_indices]);
    if (index < 0) index += axis_size;
    V* out = y + r * row_vectors;
    if (index < 0 || index >= axis_size) {
      if (threadIdx.x == 0) g_gather_index_error = 1;
#pragma unroll
      for (int k = 0; k < kGatherUnroll; ++k) {
        const std::int64_t c = first + static_cast<std::int64_t>(k) * blockDim.x;
        if (c < row_vectors) out[c] = V{};
      }
      continue;
    }
    const V* in = data + (o * axis_size + index) * row_vectors;
    V values[kGatherUnroll];
#pragma unroll
    for (int k = 0; k < kGatherUnroll; ++k) {
      const std::int64_t c = first + static_cast<std::int64_t>(k) * blockDim.x;
      if (c < row_vectors) values[k] = in[c];
    }
#pragma unroll
    for (int k = 0; k < kGatherUnroll; ++k) {
      const std::int64_t c = first + static_cast<std::int64_t>(k) * blockDim.x;
      if (c < row_vectors) out[c] = values[k];
    }
  }
}

// One thread per output vector: short rows (scalar gathers, shape computations).
template <typename V, typename IndexT>
__global__ void gather_elements_kernel(const V* data, const IndexT* indices, V* y, std::int64_t n,
                                       std::int64_t num_indices, std::int64_t axis_size, std::int64_t row_vectors) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / row_vectors;
    const std::int64_t c = i - r * row_vectors;
    const std::int64_t o = r / num_indices;
    std::int64_t index = static_cast<std::int64_t>(indices[r - o * num_indices]);
    if (index < 0) index += axis_size;
    if (index < 0 || index >= axis_size) {
      g_gather_index_error = 1;
      y[i] = V{};
      continue;
    }
    y[i] = data[(o * axis_size + index) * row_vectors + c];
  }
}

template <typename V, typename IndexT>
void launch_gather(const void* data, const void* indices, void* y, std::int64_t outer, std::int64_t axis_size,
                   std::int64_t num_indices, std::int64_t row_bytes, cudaStream_t stream) {
  const std::int64_t row_vectors = row_bytes / static_cast<std::int64_t>(sizeof(V));
  const std::int64_t rows = outer * num_indices;
  const auto* d = static_cast<const V*>(data);
  const auto* idx = static_cast<const IndexT*>(indices);
  auto* out = static_cast<V*>(y);
  if (row_vectors >= 32) {  // Note [Gather in row tiles]
    const std::int64_t per_thread = (row_vectors + kGatherUnroll - 1) / kGatherUnroll;
    const int threads = static_cast<int>(std::min<std::int64_t>(kThreads, (per_thread + 31) / 32 * 32));
    const std::int64_t tile_vectors = static_cast<std::int64_t>(threads) * kGatherUnroll;
    const std::int64_t tiles_per_row = (row_vectors + tile_vectors - 1) / tile_vectors;
    gather_rows_kernel<V, IndexT><<<grid_for(rows * tiles_per_row, 1), threads, 0, stream>>>(
        d, idx, out, rows, num_indices, axis_size, row_vectors, tiles_per_row);
  } else {
    const std::int64_t n = rows * row_vectors;
    gather_elements_kernel<V, IndexT><<<grid_for(n, kThreads), kThreads, 0, stream>>>(d, idx, out, n, num_indices,
                                                                                     axis_size, row_vectors);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// Calls body(V{}) with the widest of uint4/uint2/uint32/uint16/uint8 that divides `bytes` and every address in
// `pointers`.
template <typename Body>
void dispatch_vector(std::int64_t bytes, std::initializer_list<const void*> pointers, Body&& body) {
  const auto fits = [&](std::size_t width) {
    if (bytes % static_cast<std::int64_t>(width) != 0) return false;
    for (const void* p : pointers) {
      if (!is_aligned(p, width)) return false;
    }
    return true;
  };
  if (fits(16)) return body(uint4{});
  if (fits(8)) return body(uint2{});
  if (fits(4)) return body(std::uint32_t{});
  if (fits(2)) return body(std::uint16_t{});
  body(std::uint8_t{});
}

// ---- broadcasting elementwise (where, compare, integer arithmetic) ----

template <typename E, typename Index>
__global__ void where_kernel(const std::uint8_t* cond, const E* a, const E* b, E* y, Index n,
                             OffsetCalculator<3, Index> calc) {
  const Index stride = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) + static_cast<Index>(threadIdx.x);
       i < n; i += stride) {
    Index offsets[3];
    calc.offsets(i, offsets);
    y[i] = cond[offsets[0]] != 0 ? a[offsets[1]] : b[offsets[2]];
  }
}

// cond, a, b and y all of the output's shape, contiguous: 16 bytes of a, b and y and the matching bytes of cond
// per thread and step (the general kernel above moves one element at a time: 40% of the copy bandwidth on float16),
// then a scalar tail.
template <typename E>
__global__ void where_same_shape_kernel(const std::uint8_t* cond, const E* a, const E* b, E* y, std::int64_t n) {
  constexpr int kVec = kVec16<E>;
  using V = Vec<E, kVec>;
  using C = Vec<std::uint8_t, kVec>;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t vectors = n / kVec;
  for (std::int64_t i = first; i < vectors; i += stride) {
    const C c = reinterpret_cast<const C*>(cond)[i];
    const V va = reinterpret_cast<const V*>(a)[i];
    const V vb = reinterpret_cast<const V*>(b)[i];
    V out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = c.v[k] != 0 ? va.v[k] : vb.v[k];
    reinterpret_cast<V*>(y)[i] = out;
  }
  for (std::int64_t i = vectors * kVec + first; i < n; i += stride) y[i] = cond[i] != 0 ? a[i] : b[i];
}

template <typename E>
void launch_where(const void* cond, const void* a, const void* b, void* y, const WhereGeometry& g,
                  cudaStream_t stream) {
  const std::int64_t n = g.numel();
  if (g.same_shape() && is_aligned(cond, kVec16<E>) && is_aligned(a, 16) && is_aligned(b, 16) &&
      is_aligned(y, 16)) {
    const std::int64_t work = std::max<std::int64_t>(n / kVec16<E>, n % kVec16<E>);
    where_same_shape_kernel<E><<<grid_for(work, kThreads), kThreads, 0, stream>>>(
        static_cast<const std::uint8_t*>(cond), static_cast<const E*>(a), static_cast<const E*>(b),
        static_cast<E*>(y), n);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    return;
  }
  const std::vector<std::int64_t>* const table[3] = {&g.strides[0], &g.strides[1], &g.strides[2]};
  const auto* c = static_cast<const std::uint8_t*>(cond);
  if (fits_int32(n, g.shape, {&g.strides[0], &g.strides[1], &g.strides[2]})) {
    where_kernel<E, std::int32_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        c, static_cast<const E*>(a), static_cast<const E*>(b), static_cast<E*>(y), static_cast<std::int32_t>(n),
        make_offset_calculator<3, std::int32_t>(g.shape, table));
  } else {
    where_kernel<E, std::int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        c, static_cast<const E*>(a), static_cast<const E*>(b), static_cast<E*>(y), n,
        make_offset_calculator<3, std::int64_t>(g.shape, table));
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// Values as the comparisons see them: 16-bit floats widened to float, bool normalized to 0/1.
__device__ __forceinline__ float compare_value(__half v) { return __half2float(v); }
__device__ __forceinline__ float compare_value(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T compare_value(T v) {
  return v;
}

// A bool's storage byte compares as its truth value.
struct BoolByte {
  std::uint8_t v;
};
__device__ __forceinline__ std::uint8_t compare_value(BoolByte v) { return v.v != 0 ? 1 : 0; }

template <typename T, typename Index>
__global__ void compare_kernel(CompareOp op, const T* a, const T* b, std::uint8_t* y, Index n,
                               OffsetCalculator<2, Index> calc) {
  const Index stride = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) + static_cast<Index>(threadIdx.x);
       i < n; i += stride) {
    Index offsets[2];
    calc.offsets(i, offsets);
    const auto va = compare_value(a[offsets[0]]);
    const auto vb = compare_value(b[offsets[1]]);
    bool r;
    if (op == CompareOp::kEqual) {
      r = va == vb;
    } else if (op == CompareOp::kLess) {
      r = va < vb;
    } else if (op == CompareOp::kGreater) {
      r = va > vb;
    } else if (op == CompareOp::kAnd) {
      r = va != 0 && vb != 0;
    } else if (op == CompareOp::kOr) {
      r = va != 0 || vb != 0;
    } else {
      r = (va != 0) != (vb != 0);
    }
    y[i] = r ? 1 : 0;
  }
}

template <typename Wrap, typename Index>
__global__ void integer_binary_kernel(BinaryOp op, const Wrap* a, const Wrap* b, Wrap* y, Index n,
                                      OffsetCalculator<2, Index> calc) {
  using U = std::make_unsigned_t<Wrap>;
  const Index stride = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) + static_cast<Index>(threadIdx.x);
       i < n; i += stride) {
    Index offsets[2];
    calc.offsets(i, offsets);
    const Wrap va = a[offsets[0]], vb = b[offsets[1]];
    Wrap r;
    if (op == BinaryOp::kAdd) {
      r = static_cast<Wrap>(static_cast<U>(va) + static_cast<U>(vb));
    } else if (op == BinaryOp::kSub) {
      r = static_cast<Wrap>(static_cast<U>(va) - static_cast<U>(vb));
    } else if (op == BinaryOp::kMul) {
      r = static_cast<Wrap>(static_cast<U>(va) * static_cast<U>(vb));
    } else if (vb == 0) {
      r = 0;  // see integer_binary's contract
    } else if (vb == -1) {
      r = static_cast<Wrap>(U(0) - static_cast<U>(va));
    } else {
      r = va / vb;
    }
    y[i] = r;
  }
}

// ---- cast between any dtypes ----

// A source element as a double (floats: exact) or a long long (integers and bool: exact).
__device__ __forceinline__ double cast_source(float v) { return v; }
__device__ __forceinline__ double cast_source(double v) { return v; }
__device__ __forceinline__ double cast_source(__half v) { return __half2float(v); }
__device__ __forceinline__ double cast_source(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ long long cast_source(std::int8_t v) { return v; }
__device__ __forceinline__ long long cast_source(std::uint8_t v) { return v; }
__device__ __forceinline__ long long cast_source(std::int16_t v) { return v; }
__device__ __forceinline__ long long cast_source(std::int32_t v) { return v; }
__device__ __forceinline__ long long cast_source(std::int64_t v) { return v; }
__device__ __forceinline__ long long cast_source(BoolByte v) { return v.v != 0 ? 1 : 0; }

template <typename To>
__device__ __forceinline__ To saturate(double v) {
  if (isnan(v)) return To(0);
  const double lowest = static_cast<double>(std::numeric_limits<To>::lowest());
  const double upper = static_cast<double>(std::numeric_limits<To>::max()) + 1.0;  // a power of two: exact
  if (v <= lowest) return std::numeric_limits<To>::lowest();
  if (v >= upper) return std::numeric_limits<To>::max();
  return static_cast<To>(v);  // truncates toward zero
}

template <typename To>
__device__ __forceinline__ To wrap_int(long long v) {
  return static_cast<To>(static_cast<std::make_unsigned_t<To>>(static_cast<unsigned long long>(v)));
}

template <typename Source>
__device__ __forceinline__ void store_cast(void* y, std::int64_t i, DType to, Source v) {
  constexpr bool kFromFloat = std::is_same_v<Source, double>;
  switch (to) {
    case DType::kFloat16:
      if constexpr (kFromFloat) {
        static_cast<__half*>(y)[i] = __double2half(v);
      } else {
        static_cast<__half*>(y)[i] = __ll2half_rn(v);
      }
      return;
    case DType::kBFloat16:
      if constexpr (kFromFloat) {
        static_cast<__nv_bfloat16*>(y)[i] = __double2bfloat16(v);
      } else {
        static_cast<__nv_bfloat16*>(y)[i] = __ll2bfloat16_rn(v);
      }
      return;
    case DType::kFloat32: static_cast<float*>(y)[i] = static_cast<float>(v); return;
    case DType::kFloat64: static_cast<double*>(y)[i] = static_cast<double>(v); return;
    case DType::kBool: static_cast<std::uint8_t*>(y)[i] = v != 0 ? 1 : 0; return;
    default: break;
  }
  if constexpr (kFromFloat) {
    switch (to) {
      case DType::kInt8: static_cast<std::int8_t*>(y)[i] = saturate<std::int8_t>(v); return;
      case DType::kUInt8: static_cast<std::uint8_t*>(y)[i] = saturate<std::uint8_t>(v); return;
      case DType::kInt16: static_cast<std::int16_t*>(y)[i] = saturate<std::int16_t>(v); return;
      case DType::kInt32: static_cast<std::int32_t*>(y)[i] = saturate<std::int32_t>(v); return;
      case DType::kInt64: static_cast<std::int64_t*>(y)[i] = saturate<std::int64_t>(v); return;
      default: return;
    }
  } else {
    switch (to) {
      case DType::kInt8: static_cast<std::int8_t*>(y)[i] = wrap_int<std::int8_t>(v); return;
      case DType::kUInt8: static_cast<std::uint8_t*>(y)[i] = wrap_int<std::uint8_t>(v); return;
      case DType::kInt16: static_cast<std::int16_t*>(y)[i] = wrap_int<std::int16_t>(v); return;
      case DType::kInt32: static_cast<std::int32_t*>(y)[i] = wrap_int<std::int32_t>(v); return;
      case DType::kInt64: static_cast<std::int64_t*>(y)[i] = wrap_int<std::int64_t>(v); return;
      default: return;
    }
  }
}

template <typename From>
__global__ void cast_any_kernel(const From* x, void* y, DType to, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    store_cast(y, i, to, cast_source(x[i]));
  }
}

// Calls body(T{}) with the storage type of any dtype (bool as BoolByte).
template <typename Body>
void dispatch_any(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kFloat16: return body(__half{});
    case DType::kBFloat16: return body(__nv_bfloat16{});
    case DType::kFloat32: return body(float{});
    case DType::kFloat64: return body(double{});
    case DType::kInt8: return body(std::int8_t{});
    case DType::kUInt8: return body(std::uint8_t{});
    case DType::kInt16: return body(std::int16_t{});
    case DType::kInt32: return body(std::int32_t{});
    case DType::kInt64: return body(std::int64_t{});
    case DType::kBool: return body(BoolByte{});
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kInt4:
    case DType::kUInt4:
      break;  // refused by the kernels' supports() (is_cuda_raw_dtype in cuda_raw_register.cpp)
  }
  throw UnsupportedOperationError(
      ::xpuruntime::detail::str_cat("cuda_raw has no kernels for ", dtype_name(dtype), "; use the cpu backend"));
}

__global__ void logical_not_kernel(const std::uint8_t* x, std::uint8_t* y, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = x[i] != 0 ? 0 : 1;
  }
}

template <typename T>
__global__ void integer_neg_kernel(const T* x, T* y, std::int64_t n) {
  using U = std::make_unsigned_t<T>;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = static_cast<T>(U(0) - static_cast<U>(x[i]));
  }
}

std::vector<std::int64_t> contiguous_strides_for(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

}  // namespace

// ---- strided gather ----

void strided_gather(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& shape,
                    const std::vector<std::int64_t>& strides, void* stream) {
  XPURT_CHECK(strides.size() == shape.size(), "cuda_raw::strided_gather: ", strides.size(), " strides for rank ",
              shape.size());
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  if (n == 0) return;
  std::vector<std::int64_t> sizes, steps;
  merge_dims(shape, strides, &sizes, &steps);
  const auto es = static_cast<std::int64_t>(element_size);
  if (sizes.empty() || (sizes.size() == 1 && steps[0] == 1)) {  // one contiguous run
    XPURT_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<std::size_t>(n * es), cudaMemcpyDeviceToDevice,
                                     as_stream(stream)));
    return;
  }
  if (sizes.size() > static_cast<std::size_t>(kMaxDims)) {  // rare: the general copy peels leading dims
    strided_copy(x, y, element_size == 1 ? DType::kUInt8 : element_size == 2 ? DType::kInt16
                       : element_size == 4 ? DType::kInt32 : DType::kInt64,
                 sizes, steps, contiguous_strides_for(sizes), stream);
    return;
  }
  // Vectors along the inner run when it is contiguous in x: the widest width that divides the run and every
  // stride in bytes and both base addresses.
  std::int64_t width = es;
  if (steps.back() == 1) {
    for (const std::int64_t candidate : {16, 8, 4, 2}) {
      if (candidate <= es) break;
      bool ok = (sizes.back() * es) % candidate == 0 && is_aligned(x, static_cast<std::size_t>(candidate)) &&
                is_aligned(y, static_cast<std::size_t>(candidate));
      for (std::size_t d = 0; ok && d + 1 < steps.size(); ++d) ok = (steps[d] * es) % candidate == 0;
      if (ok) {
        width = candidate;
        break;
      }
    }
  }
  if (width != es) {
    const std::int64_t per = width / es;
    sizes.back() /= per;
    for (std::size_t d = 0; d + 1 < steps.size(); ++d) steps[d] /= per;
    n /= per;
  }
  const cudaStream_t s = as_stream(stream);
  switch (width) {
    case 16: return launch_strided_gather<uint4>(x, y, sizes, steps, n, s);
    case 8: return launch_strided_gather<uint2>(x, y, sizes, steps, n, s);
    case 4: return launch_strided_gather<std::uint32_t>(x, y, sizes, steps, n, s);
    case 2: return launch_strided_gather<std::uint16_t>(x, y, sizes, steps, n, s);
    case 1: return launch_strided_gather<std::uint8_t>(x, y, sizes, steps, n, s);
    default: XPURT_INTERNAL_ASSERT(false, "strided_gather: element size ", element_size);
  }
}

// ---- transpose ----

void transpose(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& shape,
               const std::vector<std::int64_t>& perm, void* stream) {
  XPURT_CHECK(perm.size() == shape.size(), "cuda_raw::transpose: perm has ", perm.size(), " entries for rank ",
              shape.size());
  const std::vector<std::int64_t> in_strides = contiguous_strides_for(shape);
  std::vector<std::int64_t> out_shape, strides;
  std::int64_t n = 1;
  for (const std::int64_t p : perm) {
    out_shape.push_back(shape[static_cast<std::size_t>(p)]);
    strides.push_back(in_strides[static_cast<std::size_t>(p)]);
    n *= shape[static_cast<std::size_t>(p)];
  }
  if (n == 0) return;
  std::vector<std::int64_t> sizes, steps;
  merge_dims(out_shape, strides, &sizes, &steps);
  // Run-preserving (x's innermost dim stays innermost, or everything merged into one run): strided runs.
  if (sizes.empty() || steps.back() == 1 || sizes.size() > static_cast<std::size_t>(kMaxDims) + 2) {
    strided_gather(x, y, element_size, out_shape, strides, stream);
    return;
  }
  // The innermost dim of x (stride 1) is output dim `q`; y's innermost dim (A) reads x at stride steps.back().
  std::size_t q = sizes.size();
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (steps[d] == 1) q = d;
  }
  XPURT_INTERNAL_ASSERT(q < sizes.size(), "transpose: no unit-stride dim after merging");
  const std::vector<std::int64_t> out_strides = contiguous_strides_for(sizes);
  std::vector<std::int64_t> batch_sizes, batch_in, batch_out;
  for (std::size_t d = 0; d + 1 < sizes.size(); ++d) {
    if (d == q) continue;
    batch_sizes.push_back(sizes[d]);
    batch_in.push_back(steps[d]);
    batch_out.push_back(out_strides[d]);
  }
  const std::int64_t size_a = sizes.back(), size_b = sizes[q];
  const std::int64_t in_stride_a = steps.back(), out_stride_b = out_strides[q];
  if (std::min(size_a, size_b) < kShortSide &&
      !small_matrices(size_a * size_b, static_cast<std::int64_t>(element_size))) {  // Note [Transposes of small matrices]
    strided_gather(x, y, element_size, out_shape, strides, stream);
    return;
  }
  const cudaStream_t s = as_stream(stream);
  switch (element_size) {
    case 1:
      return launch_transpose_tiled<std::uint8_t>(x, y, size_a, size_b, in_stride_a, out_stride_b, batch_sizes,
                                                  batch_in, batch_out, n, s);
    case 2:
      return launch_transpose_tiled<std::uint16_t>(x, y, size_a, size_b, in_stride_a, out_stride_b, batch_sizes,
                                                   batch_in, batch_out, n, s);
    case 4:
      return launch_transpose_tiled<std::uint32_t>(x, y, size_a, size_b, in_stride_a, out_stride_b, batch_sizes,
                                                   batch_in, batch_out, n, s);
    case 8:
      return launch_transpose_tiled<std::uint64_t>(x, y, size_a, size_b, in_stride_a, out_stride_b, batch_sizes,
                                                   batch_in, batch_out, n, s);
    default: XPURT_INTERNAL_ASSERT(false, "transpose: element size ", element_size);
  }
}

// ---- concat ----

namespace {

// Note [Concat in one kernel]
// Up to kConcatInputs inputs side by side in one launch: each thread copies V-sized words (16, 8, 4, 2 or 1 bytes:
// the largest that divides every row and aligns every pointer) of the output, finding its input by a binary search
// of the column ends, which each block first copies to shared memory (searching the parameter bank itself would
// serialise a warp's divergent reads). More inputs take one launch per kConcatInputs of them, each writing its
// window of the output's rows. One 2-D memcpy per input copies rows of as little as 64 bytes (the rotary
// embedding's cat(-x2, x1)) at a small fraction of the copy bandwidth, and costs a launch per input: DenseNet-121's
// 58 channel concatenations of up to 25 inputs were 461 such copies, 530 us of a 1.28 ms run on an H200.
constexpr int kConcatInputs = 64;

struct ConcatArgs {
  const void* inputs[kConcatInputs];
  std::int64_t ends[kConcatInputs];  // in words: the column of this launch's window past input k
  int count;
};

// y's rows are `out_row` words; this launch writes columns [column, column + row) of each of them.
template <typename V>
__global__ void concat_kernel(ConcatArgs args, V* __restrict__ y, std::int64_t row, std::int64_t out_row,
                              std::int64_t column, std::int64_t n) {
  __shared__ std::int64_t ends[kConcatInputs];
  for (int k = static_cast<int>(threadIdx.x); k < args.count; k += static_cast<int>(blockDim.x)) ends[k] = args.ends[k];
  __syncthreads();
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    const std::int64_t r = i / row, c = i - r * row;
    int lo = 0, hi = args.count - 1;  // the first k with c < ends[k]
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (c < ends[mid]) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const std::int64_t begin = lo == 0 ? 0 : ends[lo - 1];
    const std::int64_t width = ends[lo] - begin;
    y[r * out_row + column + c] = static_cast<const V*>(args.inputs[lo])[r * width + (c - begin)];
  }
}

template <typename V>
void launch_concat(const std::vector<const void*>& inputs, const std::vector<std::int64_t>& row_bytes, void* y,
                   std::int64_t outer, std::int64_t out_row_bytes, cudaStream_t s) {
  const std::int64_t word = static_cast<std::int64_t>(sizeof(V));
  const std::int64_t out_row = out_row_bytes / word;
  std::int64_t column = 0;
  for (std::size_t first = 0; first < inputs.size(); first += kConcatInputs) {
    ConcatArgs args{};
    const std::size_t count = std::min(inputs.size() - first, static_cast<std::size_t>(kConcatInputs));
    std::int64_t end = 0;
    for (std::size_t k = 0; k < count; ++k) {
      end += row_bytes[first + k] / word;
      args.inputs[k] = inputs[first + k];
      args.ends[k] = end;
    }
    args.count = static_cast<int>(count);
    const std::int64_t n = outer * end;
    concat_kernel<V><<<grid_for(n, kThreads), kThreads, 0, s>>>(args, static_cast<V*>(y), end, out_row, column, n);
    XPURT_CUDA_CHECK(cudaGetLastError());
    column += end;
  }
}

}  // namespace

void concat(const std::vector<const void*>& inputs, const std::vector<std::int64_t>& row_bytes, void* y,
            std::int64_t outer, void* stream) {
  XPURT_CHECK(inputs.size() == row_bytes.size(), "cuda_raw::concat: ", inputs.size(), " inputs but ",
              row_bytes.size(), " row sizes");
  std::int64_t out_row = 0;
  for (const std::int64_t bytes : row_bytes) out_row += bytes;
  if (outer == 0 || out_row == 0) return;
  // Empty inputs take no columns: they stay out of the kernel's list.
  std::vector<const void*> used;
  std::vector<std::int64_t> used_bytes;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (row_bytes[k] > 0) {
      used.push_back(inputs[k]);
      used_bytes.push_back(row_bytes[k]);
    }
  }
  auto fits = [&](std::size_t w) {  // Note [Concat in one kernel]
    if (out_row % static_cast<std::int64_t>(w) != 0 || !is_aligned(y, w)) return false;
    for (std::size_t k = 0; k < used.size(); ++k) {
      if (used_bytes[k] % static_cast<std::int64_t>(w) != 0 || !is_aligned(used[k], w)) return false;
    }
    return true;
  };
  std::size_t word = 16;
  while (word > 1 && !fits(word)) word /= 2;
  const cudaStream_t s = as_stream(stream);
  switch (word) {
    case 16: return launch_concat<uint4>(used, used_bytes, y, outer, out_row, s);
    case 8: return launch_concat<std::uint64_t>(used, used_bytes, y, outer, out_row, s);
    case 4: return launch_concat<std::uint32_t>(used, used_bytes, y, outer, out_row, s);
    case 2: return launch_concat<std::uint16_t>(used, used_bytes, y, outer, out_row, s);
    default: return launch_concat<std::uint8_t>(used, used_bytes, y, outer, out_row, s);
  }
}

// ---- gather ----

bool gather_checks_enabled() {
  // Read at every launch (cheap next to the launch) so that a test or a debugging session can switch it on.
  const char* value = std::getenv("XPURT_CUDA_RAW_CHECK_INDICES");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

bool gather_index_error(bool reset) {
  XPURT_CUDA_CHECK(cudaDeviceSynchronize());
  int flag = 0;
  XPURT_CUDA_CHECK(cudaMemcpyFromSymbol(&flag, g_gather_index_error, sizeof(flag)));
  if (reset && flag != 0) {
    const int zero = 0;
    XPURT_CUDA_CHECK(cudaMemcpyToSymbol(g_gather_index_error, &zero, sizeof(zero)));
  }
  return flag != 0;
}

void gather(const void* data, const void* indices, DType index_dtype, void* y, std::size_t element_size,
            std::int64_t outer, std::int64_t axis_size, std::int64_t num_indices, std::int64_t inner, void* stream) {
  XPURT_CHECK(index_dtype == DType::kInt32 || index_dtype == DType::kInt64,
              "cuda_raw::gather: indices must be int32 or int64, got ", dtype_name(index_dtype));
  const std::int64_t row_bytes = inner * static_cast<std::int64_t>(element_size);
  if (outer == 0 || num_indices == 0 || row_bytes == 0) return;
  const cudaStream_t s = as_stream(stream);
  const bool check = gather_checks_enabled();
  if (check) gather_index_error(true);  // a flag left by earlier unchecked launches is not this launch's error
  dispatch_vector(row_bytes, {data, y}, [&](auto vector) {
    using V = decltype(vector);
    if (index_dtype == DType::kInt32) {
      launch_gather<V, std::int32_t>(data, indices, y, outer, axis_size, num_indices, row_bytes, s);
    } else {
      launch_gather<V, std::int64_t>(data, indices, y, outer, axis_size, num_indices, row_bytes, s);
    }
  });
  if (check) {
    XPURT_CUDA_CHECK(cudaStreamSynchronize(s));
    XPURT_CHECK(!gather_index_error(true), "op 'gather': an index is out of range for the gathered axis of size ",
                axis_size, " (valid: ", -axis_size, " to ", axis_size - 1,
                "); found by XPURT_CUDA_RAW_CHECK_INDICES=1");
  }
}

// ---- gather_elements, gather_nd ----

namespace {

// GatherElements: one thread per output element. `calc` maps the output's linear index to the data offset of
// the element with the same coordinates (axis coordinate excluded, its stride in `axis_stride`) and to the
// axis coordinate itself (operand 1: strides 1 along the axis, 0 elsewhere).
template <typename E, typename IndexT>
__global__ void gather_along_axis_kernel(const E* data, const IndexT* indices, E* y, std::int64_t n,
                                         OffsetCalculator<1, std::int64_t> calc, std::int64_t axis_size,
                                         std::int64_t axis_stride) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::int64_t offset[1];
    calc.offsets(i, offset);
    std::int64_t index = static_cast<std::int64_t>(indices[i]);
    if (index < 0) index += axis_size;
    if (index < 0 || index >= axis_size) {
      g_gather_index_error = 1;
      y[i] = E{};
      continue;
    }
    y[i] = data[offset[0] + index * axis_stride];
  }
}

// GatherND: one thread per output element (b, t, s).
template <typename E, typename IndexT>
__global__ void gather_nd_kernel(const E* data, const IndexT* indices, E* y, std::int64_t n, std::int64_t tuples,
                                 int depth, std::int64_t slice, std::int64_t batch_stride, Dims dims) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t row = i / slice;  // b * tuples + t
    const std::int64_t s = i - row * slice;
    const std::int64_t b = row / tuples;
    const IndexT* tuple = indices + row * depth;
    std::int64_t offset = b * batch_stride + s;
    bool valid = true;
    for (int k = 0; k < depth; ++k) {
      std::int64_t index = static_cast<std::int64_t>(tuple[k]);
      if (index < 0) index += dims.size[k];
      valid = valid && index >= 0 && index < dims.size[k];
      offset += index * dims.stride[k];
    }
    if (!valid) {
      g_gather_index_error = 1;
      y[i] = E{};
      continue;
    }
    y[i] = data[offset];
  }
}

void check_index_dtype(DType index_dtype, const char* what) {
  XPURT_CHECK(index_dtype == DType::kInt32 || index_dtype == DType::kInt64, "cuda_raw::", what,
              ": indices must be int32 or int64, got ", dtype_name(index_dtype));
}

// Runs `launch` under Note [Gather index errors]'s debug mode: with XPURT_CUDA_RAW_CHECK_INDICES=1, synchronizes
// and raises when the launch met an out-of-range index.
template <typename Launch>
void with_index_check(const char* op, cudaStream_t stream, Launch&& launch) {
  const bool check = gather_checks_enabled();
  if (check) gather_index_error(true);
  launch();
  if (check) {
    XPURT_CUDA_CHECK(cudaStreamSynchronize(stream));
    XPURT_CHECK(!gather_index_error(true), "op '", op, "': an index is out of range; found by "
                "XPURT_CUDA_RAW_CHECK_INDICES=1");
  }
}

}  // namespace

void gather_elements(const void* data, const std::vector<std::int64_t>& data_shape, const void* indices,
                     DType index_dtype, const std::vector<std::int64_t>& index_shape, std::int64_t axis, void* y,
                     std::size_t element_size, void* stream) {
  check_index_dtype(index_dtype, "gather_elements");
  XPURT_CHECK(data_shape.size() == index_shape.size() && data_shape.size() <= static_cast<std::size_t>(kMaxDims) &&
                  axis >= 0 && axis < static_cast<std::int64_t>(data_shape.size()),
              "cuda_raw::gather_elements: data ", data_shape.size(), "-D and indices ", index_shape.size(),
              "-D must have one rank <= ", kMaxDims, " and axis ", axis, " must be inside it");
  std::int64_t n = 1;
  for (const std::int64_t d : index_shape) n *= d;
  if (n == 0) return;
  const std::vector<std::int64_t> data_strides = data_ops::contiguous_strides_of(data_shape);
  std::vector<std::int64_t> strides = data_strides;
  strides[static_cast<std::size_t>(axis)] = 0;
  const std::vector<std::int64_t>* const table[1] = {&strides};
  const auto calc = make_offset_calculator<1, std::int64_t>(index_shape, table);
  const cudaStream_t s = as_stream(stream);
  const std::int64_t axis_size = data_shape[static_cast<std::size_t>(axis)];
  const std::int64_t axis_stride = data_strides[static_cast<std::size_t>(axis)];
  with_index_check("gather_elements", s, [&] { dispatch_element_size(element_size, "gather_elements", [&](auto tag) {
    using E = decltype(tag);
    if (index_dtype == DType::kInt32) {
      gather_along_axis_kernel<E, std::int32_t><<<grid_for(n, kThreads), kThreads, 0, s>>>(
          static_cast<const E*>(data), static_cast<const std::int32_t*>(indices), static_cast<E*>(y), n, calc,
          axis_size, axis_stride);
    } else {
      gather_along_axis_kernel<E, std::int64_t><<<grid_for(n, kThreads), kThreads, 0, s>>>(
          static_cast<const E*>(data), static_cast<const std::int64_t*>(indices), static_cast<E*>(y), n, calc,
          axis_size, axis_stride);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  }); });
}

void gather_nd(const void* data, const std::vector<std::int64_t>& data_shape, const void* indices, DType index_dtype,
               std::int64_t batch, std::int64_t tuples, std::int64_t depth, void* y, std::size_t element_size,
               void* stream) {
  check_index_dtype(index_dtype, "gather_nd");
  XPURT_CHECK(depth >= 1 && depth <= kMaxDims && depth <= static_cast<std::int64_t>(data_shape.size()),
              "cuda_raw::gather_nd: index depth ", depth, " must be in [1, min(", kMaxDims, ", ", data_shape.size(),
              ")]");
  Dims dims;
  const std::vector<std::int64_t> strides = data_ops::contiguous_strides_of(data_shape);
  for (std::int64_t k = 0; k < depth; ++k) {
    dims.size[k] = data_shape[static_cast<std::size_t>(k)];
    dims.stride[k] = strides[static_cast<std::size_t>(k)];
  }
  std::int64_t slice = 1, batch_stride = 1;
  for (std::size_t k = 0; k < data_shape.size(); ++k) {
    batch_stride *= data_shape[k];
    if (static_cast<std::int64_t>(k) >= depth) slice *= data_shape[k];
  }
  const std::int64_t n = batch * tuples * slice;
  if (n == 0) return;
  const cudaStream_t s = as_stream(stream);
  with_index_check("gather_nd", s, [&] { dispatch_element_size(element_size, "gather_nd", [&](auto tag) {
    using E = decltype(tag);
    if (index_dtype == DType::kInt32) {
      gather_nd_kernel<E, std::int32_t><<<grid_for(n, kThreads), kThreads, 0, s>>>(
          static_cast<const E*>(data), static_cast<const std::int32_t*>(indices), static_cast<E*>(y), n, tuples,
          static_cast<int>(depth), slice, batch_stride, dims);
    } else {
      gather_nd_kernel<E, std::int64_t><<<grid_for(n, kThreads), kThreads, 0, s>>>(
          static_cast<const E*>(data), static_cast<const std::int64_t*>(indices), static_cast<E*>(y), n, tuples,
          static_cast<int>(depth), slice, batch_stride, dims);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  }); });
}

// ---- where ----

std::int64_t WhereGeometry::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

bool WhereGeometry::same_shape() const {  // merged like BroadcastGeometry::same_shape
  return shape.empty() || (shape.size() == 1 && strides[0][0] == 1 && strides[1][0] == 1 && strides[2][0] == 1);
}

bool where_geometry(const std::vector<std::int64_t>& cond, const std::vector<std::int64_t>& a,
                    const std::vector<std::int64_t>& b, const std::vector<std::int64_t>& out, WhereGeometry* geometry,
                    std::string* why_not) {
  *geometry = WhereGeometry();
  std::int64_t numel = 1;
  for (const std::int64_t d : out) numel *= d;
  if (numel == 0) {
    geometry->shape = {0};
    for (auto& s : geometry->strides) s = {1};
    return true;
  }
  const std::vector<std::int64_t>* operands[3] = {&cond, &a, &b};
  std::vector<std::int64_t> full[3];
  for (int k = 0; k < 3; ++k) {
    full[k].assign(out.size(), 0);
    std::int64_t stride = 1;
    const std::vector<std::int64_t>& shape = *operands[k];
    for (std::size_t j = 0; j < shape.size(); ++j) {
      const std::size_t d = shape.size() - 1 - j;
      full[k][out.size() - 1 - j] = shape[d] == 1 ? 0 : stride;
      stride *= shape[d];
    }
  }
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    bool mergeable = !geometry->shape.empty();
    for (int k = 0; k < 3 && mergeable; ++k) mergeable = geometry->strides[k].back() == full[k][d] * out[d];
    if (mergeable) {
      geometry->shape.back() *= out[d];
      for (int k = 0; k < 3; ++k) geometry->strides[k].back() = full[k][d];
      continue;
    }
    geometry->shape.push_back(out[d]);
    for (int k = 0; k < 3; ++k) geometry->strides[k].push_back(full[k][d]);
  }
  if (geometry->shape.size() > static_cast<std::size_t>(kMaxDims)) {
    *why_not = ::xpuruntime::detail::str_cat("cuda_raw where broadcasts over at most ", kMaxDims,
                                             " dimensions after merging, these shapes need ", geometry->shape.size(),
                                             "; use the cpu kernel");
    return false;
  }
  return true;
}

void where(const void* cond, const void* a, const void* b, void* y, std::size_t element_size,
           const WhereGeometry& geometry, void* stream) {
  if (geometry.numel() <= 0) return;
  const cudaStream_t s = as_stream(stream);
  switch (element_size) {
    case 1: return launch_where<std::uint8_t>(cond, a, b, y, geometry, s);
    case 2: return launch_where<std::uint16_t>(cond, a, b, y, geometry, s);
    case 4: return launch_where<std::uint32_t>(cond, a, b, y, geometry, s);
    case 8: return launch_where<std::uint64_t>(cond, a, b, y, geometry, s);
    default: XPURT_INTERNAL_ASSERT(false, "where: element size ", element_size);
  }
}

// ---- comparisons, logical_not ----

void compare(CompareOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
             void* stream) {
  if (geometry.numel() <= 0) return;
  const cudaStream_t s = as_stream(stream);
  dispatch_any(dtype, [&](auto tag) {
    using T = decltype(tag);
    with_index_type(geometry, [&](auto n, const auto& calc) {
      using Index = decltype(n);
      compare_kernel<T, Index><<<grid_for(n, kThreads), kThreads, 0, s>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<std::uint8_t*>(y), n, calc);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    });
  });
}

void logical_not(const void* x, void* y, std::int64_t n, void* stream) {
  if (n <= 0) return;
  logical_not_kernel<<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
      static_cast<const std::uint8_t*>(x), static_cast<std::uint8_t*>(y), n);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- integer arithmetic ----

void integer_binary(BinaryOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
                    void* stream) {
  XPURT_CHECK(op == BinaryOp::kAdd || op == BinaryOp::kSub || op == BinaryOp::kMul || op == BinaryOp::kDiv,
              "cuda_raw::integer_binary: only add, sub, mul and div take integers");
  if (geometry.numel() <= 0) return;
  const cudaStream_t s = as_stream(stream);
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    with_index_type(geometry, [&](auto n, const auto& calc) {
      using Index = decltype(n);
      integer_binary_kernel<T, Index><<<grid_for(n, kThreads), kThreads, 0, s>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n, calc);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    });
  };
  if (dtype == DType::kInt32) {
    run(std::int32_t{});
  } else if (dtype == DType::kInt64) {
    run(std::int64_t{});
  } else {
    throw UnsupportedOperationError(::xpuruntime::detail::str_cat("cuda_raw integer arithmetic takes int32 and "
                                                                  "int64, got ", dtype_name(dtype)));
  }
}

void integer_neg(const void* x, void* y, DType dtype, std::int64_t n, void* stream) {
  if (n <= 0) return;
  const cudaStream_t s = as_stream(stream);
  if (dtype == DType::kInt32) {
    integer_neg_kernel<std::int32_t><<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<const std::int32_t*>(x), static_cast<std::int32_t*>(y), n);
  } else if (dtype == DType::kInt64) {
    integer_neg_kernel<std::int64_t><<<grid_for(n, kThreads), kThreads, 0, s>>>(
        static_cast<const std::int64_t*>(x), static_cast<std::int64_t*>(y), n);
  } else {
    throw UnsupportedOperationError(::xpuruntime::detail::str_cat("cuda_raw integer neg takes int32 and int64, got ",
                                                                  dtype_name(dtype)));
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- cast ----

void cast_any(const void* x, DType from, void* y, DType to, std::int64_t n, void* stream) {
  if (n <= 0) return;
  if (from == to) {
    XPURT_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<std::size_t>(n) * dtype_size(from), cudaMemcpyDeviceToDevice,
                                     as_stream(stream)));
    return;
  }
  dispatch_any(from, [&](auto tag) {
    using From = decltype(tag);
    cast_any_kernel<From><<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(static_cast<const From*>(x), y,
                                                                                     to, n);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
