// Selection along an axis: arg_max / arg_min (Note [Split arg reductions]) and top_k (Note [TopK by radix select]).
//
// Note [Split arg reductions]
// arg_max / arg_min had one thread per output walk the axis in order: an argmax over a whole flattened tensor (one
// output) ran on one thread of the GPU, and one over the rows of [batch, vocab] read a row per thread, uncoalesced.
// Now a contiguous axis (inner == 1) takes a warp per (line, split) task, its lanes striding over the split's
// chunk, and a strided axis a thread per (line, split) task with neighbouring lines in neighbouring threads. When the
// lines are too few to fill the GPU (fewer than kArgTargetWarps warps or kArgTargetThreads threads) the axis is split
// into chunks (arg_reduce_geometry: at least kArgRowMinChunk / kArgColumnMinChunk elements), each chunk's candidate
// (value as double, index) goes to the workspace, and arg_finalize_kernel combines a line's candidates with a warp.
// Every combination uses `beats`, a strict order on (value, index) candidates (NaN first, the first NaN among NaNs;
// then the value; ties by the first or, select_last_index, the last index), so the winner is the one the scan in
// order finds, whatever the split or the tree: the same index every run, and the same as the cpu kernel.
// Note [TopK by radix select]
// TopK sorted a whole row per block with a bitonic network in shared memory: rows of at most 4096 elements, and a
// long row with a small k paid for sorting all of it (SSDlite's 90 per-class TopKs, 300 of 3234 scores each, took
// 75 us apiece, a third of the model's run). A row now takes one of two kernels, both a block per row and both
// sorting (key, index) pairs whose unsigned key order is the selection's order (order_key), equal keys by the
// smaller index, so the result does not depend on the launch and matches the cpu kernel:
// - top_k_sort_kernel: the whole row sorted (rows up to kTopKMaxCols, when k is a large part of the row);
// - top_k_radix_kernel (top_k_by_radix_select: any row longer than kTopKMaxCols, or one over kTopKRadixMinCols whose
//   padded k is at most a quarter of its padded length): the k-th largest key found a byte at a time, up to four
//   passes over the row, each a 256-bin shared-memory histogram of the keys still under the prefix and one warp's
//   scan of it from the largest digit down; a pass whose bin holds exactly the keys still needed ends the search.
//   Then one pass in index order takes every key above the prefix and, of the keys equal to it, the ones with the
//   smallest indices (a ballot and warp-count scan per tile ranks them), and only those k are sorted. Rows of any
//   length (up to kTopKMaxAxis), k up to kTopKMaxSelected.
// Note [TopK of few long rows]
// A block per row leaves the GPU idle when the rows are few: one row of a million elements for 100 of them took
// 2186 us on an H100 (one block reads the row up to five times), against PyTorch's 84 us. top_k_split_geometry cuts
// such rows into balanced chunks (at least kTopKSplitMinChunk elements and four times k, up to
// kTopKSplitTargetBlocks blocks in all); the radix kernel runs once per chunk, writing each chunk's k best sorted
// (values and row indices) to the workspace, and once more per row over its splits x k candidates, which maps the
// winners' candidate positions back to row indices. The k best of a row are among the k best of their chunks (the
// order on (key, index) is strict), and two candidates with equal keys sit in the order of their row indices (the
// chunks in row order, each sorted with equal keys by index), so the second pass's ties by position are the row's
// ties by index: the result equals the one-block selection's, bit for bit.
#include <algorithm>
#include <climits>
#include <string>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

__device__ __forceinline__ double as_double(double v) { return v; }
template <typename T>
__device__ __forceinline__ float as_double(T v) {
  return to_float(v);
}

// Whether candidate (va, ia) beats (vb, ib) (Note [Split arg reductions]): any NaN beats any number, the first NaN
// the others; then the larger (max) or smaller value; equal values (-0 == +0), the first index or the last. A strict
// order on the candidates, so any tree of combinations finds the winner the scan in order finds. An index < 0 is no
// candidate (an empty range).
template <typename V>
__device__ __forceinline__ bool beats(V va, std::int64_t ia, V vb, std::int64_t ib, bool max, bool last) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  const bool na = isnan(va), nb = isnan(vb);
  if (na || nb) return na && (!nb || ia < ib);
  if (va != vb) return max ? va > vb : va < vb;
  return last ? ia > ib : ia < ib;
}

// Combines the candidates of a warp's lanes (shuffles in a fixed tree); every lane gets the winner.
template <typename V>
__device__ __forceinline__ void warp_best(V& value, std::int64_t& index, bool max, bool last) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const V v = __shfl_xor_sync(0xffffffffu, value, offset);
    const std::int64_t i = __shfl_xor_sync(0xffffffffu, index, offset);
    if (beats(v, i, value, index, max, last)) {
      value = v;
      index = i;
    }
  }
}

// Contiguous axis (inner == 1): a warp per (line, split) task, task = line * splits + split, lanes striding over the
// split's chunk. One split: the index itself; more: the candidate, for arg_finalize_kernel.
template <typename T>
__global__ void __launch_bounds__(kThreads) arg_rows_kernel(bool max, bool last, const T* x, std::int64_t* y,
                                                            double* values, std::int64_t* indices,
                                                            ArgReduceGeometry g) {
  using V = decltype(as_double(T{}));
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t tasks = g.lines * g.splits;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kThreads / 32);
  // `task` is the same in every lane of a warp: all of them reach the shuffles.
  for (std::int64_t task = static_cast<std::int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; task < tasks;
       task += warps) {
    const std::int64_t line = task / g.splits;
    const std::int64_t begin = (task - line * g.splits) * g.chunk;
    const std::int64_t end = g.axis_size - begin > g.chunk ? begin + g.chunk : g.axis_size;
    const T* row = x + line * g.axis_size;
    V best = V(0);
    std::int64_t at = -1;
#pragma unroll 4
    for (std::int64_t k = begin + lane; k < end; k += 32) {
      const V v = as_double(row[k]);
      if (beats(v, k, best, at, max, last)) {
        best = v;
        at = k;
      }
    }
    warp_best(best, at, max, last);
    if (lane == 0) {
      if (g.splits == 1) {
        y[line] = at;
      } else {
        values[task] = static_cast<double>(best);
        indices[task] = at;
      }
    }
  }
}

// Strided axis (inner > 1): a thread per (line, split) task, lines fastest (neighbouring threads read neighbouring
// elements), walking its chunk in order; candidates at line * splits + split.
template <typename T>
__global__ void arg_columns_kernel(bool max, bool last, const T* x, std::int64_t* y, double* values,
                                   std::int64_t* indices, ArgReduceGeometry g) {
  using V = decltype(as_double(T{}));
  const std::int64_t tasks = g.lines * g.splits;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < tasks; t += stride) {
    const std::int64_t split = t / g.lines;
    const std::int64_t line = t - split * g.lines;
    const std::int64_t o = line / g.inner;
    const std::int64_t base = o * g.axis_size * g.inner + (line - o * g.inner);
    const std::int64_t begin = split * g.chunk;
    const std::int64_t end = g.axis_size - begin > g.chunk ? begin + g.chunk : g.axis_size;
    V best = V(0);
    std::int64_t at = -1;
    for (std::int64_t k = begin; k < end; ++k) {
      const V v = as_double(x[base + k * g.inner]);
      if (beats(v, k, best, at, max, last)) {
        best = v;
        at = k;
      }
    }
    if (g.splits == 1) {
      y[line] = at;
    } else {
      values[line * g.splits + split] = static_cast<double>(best);
      indices[line * g.splits + split] = at;
    }
  }
}

// The second pass: a warp per line combines its splits' candidates (lanes striding, then the shuffle tree).
__global__ void __launch_bounds__(kThreads) arg_finalize_kernel(bool max, bool last, const double* values,
                                                                const std::int64_t* indices, std::int64_t* y,
                                                                std::int64_t lines, std::int64_t splits) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kThreads / 32);
  for (std::int64_t line = static_cast<std::int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; line < lines;
       line += warps) {
    double best = 0.0;
    std::int64_t at = -1;
    for (std::int64_t s = lane; s < splits; s += 32) {
      if (beats(values[line * splits + s], indices[line * splits + s], best, at, max, last)) {
        best = values[line * splits + s];
        at = indices[line * splits + s];
      }
    }
    warp_best(best, at, max, last);
    if (lane == 0) y[line] = at;
  }
}

// TopK's order (Note [TopK by radix select]): a float as an unsigned key whose unsigned order is the selection's
// order, the first element the largest key: -0 and +0 are one key, every NaN the positive quiet NaN, which comes
// before +inf when largest and after it when smallest (PyTorch's order; ONNX leaves NaN's place open).
__device__ __forceinline__ unsigned order_key(float v, bool largest) {
  if (v == 0.0f) v = 0.0f;
  unsigned u = v != v ? 0x7fc00000u : __float_as_uint(v);
  u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);  // ascending as unsigned
  return largest ? u : ~u;
}

// Sorts n (a power of two) (key, index) pairs in shared memory, the larger key first and equal keys by the smaller
// index: a bitonic network of compare-exchange pairs, every thread of the block one pair at a time.
__device__ void sort_selected(unsigned* key, int* idx, int n) {
  const int half = n >> 1;
  for (int size = 2; size <= n; size <<= 1) {
    for (int j = size >> 1; j > 0; j >>= 1) {
      for (int p = static_cast<int>(threadIdx.x); p < half; p += static_cast<int>(blockDim.x)) {
        const int i = ((p & ~(j - 1)) << 1) | (p & (j - 1));
        const int q = i + j;
        const bool q_first = key[q] != key[i] ? key[q] > key[i] : idx[q] < idx[i];
        if (((i & size) == 0) == q_first) {
          const unsigned kv = key[i];
          key[i] = key[q];
          key[q] = kv;
          const int iv = idx[i];
          idx[i] = idx[q];
          idx[q] = iv;
        }
      }
      __syncthreads();
    }
  }
}

// The k selected of `row`: the elements and their indices, base + idx (a chunk's offset in its row) or, where
// `map` is set, map[idx] (the row indices of a second pass's candidates).
template <typename T>
__device__ void write_top(const T* row, const int* idx, T* values, std::int64_t* indices, int k,
                          std::int64_t base = 0, const std::int64_t* map = nullptr) {
  for (int i = static_cast<int>(threadIdx.x); i < k; i += static_cast<int>(blockDim.x)) {
    values[i] = row[idx[i]];  // the element itself: its bits, not the key's float
    indices[i] = map != nullptr ? map[idx[i]] : base + idx[i];
  }
}

// A block per row sorts the whole row (cols <= kTopKMaxCols, padded to a power of two).
template <typename T>
__global__ void top_k_sort_kernel(const T* x, T* values, std::int64_t* indices, std::int64_t rows, int cols,
                                  int padded, int k, bool largest) {
  extern __shared__ unsigned char smem[];
  auto* key = reinterpret_cast<unsigned*>(smem);
  int* idx = reinterpret_cast<int*>(key + padded);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    for (int i = static_cast<int>(threadIdx.x); i < padded; i += static_cast<int>(blockDim.x)) {
      key[i] = i < cols ? order_key(to_float(row[i]), largest) : 0u;
      idx[i] = i < cols ? i : INT_MAX;  // padding sorts last
    }
    __syncthreads();
    sort_selected(key, idx, padded);
    write_top(row, idx, values + r * k, indices + r * k, k);
    __syncthreads();
  }
}

// Radix select (Note [TopK by radix select]): a block per task finds the k-th key a byte at a time, gathers the k
// selected elements into shared memory and sorts only them. A task is a chunk of a row (Note [TopK of few long
// rows]): task t is chunk t % splits of row t / splits, elements [s * chunk, min(cols, (s + 1) * chunk)), and writes
// k values and indices at t * k; `map` (second passes, one chunk a row) holds the row indices of the row's elements.
// Any cols; k <= kTopKMaxSelected, every chunk at least k long.
struct RadixState {
  unsigned hist[256];
  int warp_ties[kTopKRadixThreads / 32];
  unsigned digit;
  int need;
  int exact;
  int taken;
};

// Warp 0 finds the bin, from the largest digit down, holding the need-th selected key of this pass.
__device__ void find_bin(RadixState& st, int need) {
  const int lane = static_cast<int>(threadIdx.x);
  unsigned c[8];
  unsigned sum = 0;
  for (int j = 0; j < 8; ++j) {
    c[j] = st.hist[255 - 8 * lane - j];
    sum += c[j];
  }
  unsigned inclusive = sum;
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  const unsigned owner = __ballot_sync(0xffffffffu, inclusive >= static_cast<unsigned>(need));
  if (lane == __ffs(static_cast<int>(owner)) - 1) {
    unsigned before = inclusive - sum;
    for (int j = 0; j < 8; ++j) {
      if (before + c[j] >= static_cast<unsigned>(need)) {
        st.digit = static_cast<unsigned>(255 - 8 * lane - j);
        st.need = need - static_cast<int>(before);
        st.exact = before + c[j] == static_cast<unsigned>(need);
        break;
      }
      before += c[j];
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kTopKRadixThreads)
    top_k_radix_kernel(const T* x, T* values, std::int64_t* indices, std::int64_t tasks, std::int64_t splits,
                       std::int64_t cols, std::int64_t chunk, int padded_k, int k, bool largest,
                       const std::int64_t* map) {
  extern __shared__ unsigned char smem[];
  auto* key = reinterpret_cast<unsigned*>(smem);
  int* idx = reinterpret_cast<int*>(key + padded_k);
  __shared__ RadixState st;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int threads = static_cast<int>(blockDim.x);
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const std::int64_t r = task / splits;
    const std::int64_t begin = (task - r * splits) * chunk;
    const std::int64_t len = cols - begin < chunk ? cols - begin : chunk;
    const T* row = x + r * cols + begin;
    unsigned prefix = 0, mask = 0;
    int need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {  // the k-th key, a byte at a time
      for (int b = tid; b < 256; b += threads) st.hist[b] = 0;
      __syncthreads();
      for (std::int64_t i = tid; i < len; i += threads) {
        const unsigned kv = order_key(to_float(row[i]), largest);
        if ((kv & mask) == prefix) atomicAdd(&st.hist[(kv >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (warp == 0) find_bin(st, need);
      __syncthreads();
      prefix |= st.digit << shift;
      mask |= 255u << shift;
      need = st.need;
      const bool exact = st.exact != 0;  // every key under the prefix is selected: no tie left to break
      __syncthreads();                   // before the next pass's histogram (and find_bin) overwrite st
      if (exact) break;
    }
    // Keys above the prefix are selected; of those equal to it, the `need` with the smallest indices, ranked by a
    // scan over tiles of the row in index order.
    if (tid == 0) st.taken = 0;
    for (int i = tid; i < padded_k; i += threads) {
      key[i] = 0u;
      idx[i] = INT_MAX;
    }
    __syncthreads();
    int ties_before = 0;  // the same in every thread
    for (std::int64_t base = 0; base < len; base += threads) {
      const std::int64_t i = base + tid;
      const unsigned kv = i < len ? order_key(to_float(row[i]), largest) : 0u;
      const bool above = i < len && (kv & mask) > prefix;
      const bool tie = i < len && (kv & mask) == prefix;
      const unsigned ties = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) st.warp_ties[warp] = __popc(ties);
      __syncthreads();
      int rank = ties_before + __popc(ties & ((1u << lane) - 1u));
      for (int w = 0; w < threads / 32; ++w) {
        if (w < warp) rank += st.warp_ties[w];
        ties_before += st.warp_ties[w];
      }
      if (above || (tie && rank < need)) {
        const int at = atomicAdd(&st.taken, 1);
        key[at] = kv;
        idx[at] = static_cast<int>(i);
      }
      __syncthreads();  // every read of this tile's warp_ties done before the next tile writes them
    }
    __syncthreads();
    sort_selected(key, idx, padded_k);
    write_top(row, idx, values + task * k, indices + task * k, k, begin, map == nullptr ? nullptr : map + r * cols);
    __syncthreads();
  }
}

// Split heuristics (Note [Split arg reductions]): warps (contiguous axis) or threads (strided axis) that fill an
// H100/H200 several times over, and chunks long enough that the second pass is small.
constexpr std::int64_t kArgTargetWarps = 2048;
constexpr std::int64_t kArgRowMinChunk = 4096;
constexpr std::int64_t kArgTargetThreads = 65536;
constexpr std::int64_t kArgColumnMinChunk = 256;
constexpr std::uint64_t kArgPartialBytes = sizeof(double) + sizeof(std::int64_t);

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::size_t ArgReduceGeometry::workspace_bytes() const {
  return splits > 1 ? static_cast<std::size_t>(lines * splits) * kArgPartialBytes : 0;
}

std::string ArgReduceGeometry::str() const {
  return ::xpuruntime::detail::str_cat(lines, " lines x ", axis_size, " elements, ", inner == 1 ? "row" : "column",
                                       " kernel, ", splits, splits == 1 ? " split" : " splits");
}

ArgReduceGeometry arg_reduce_geometry(std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
                                      std::uint64_t workspace_limit) {
  ArgReduceGeometry g;
  g.lines = outer * inner;
  g.axis_size = axis_size;
  g.inner = inner;
  if (g.lines > 0 && inner == 1 && g.lines < kArgTargetWarps && axis_size >= 2 * kArgRowMinChunk) {
    g.splits = std::min(ceil_div(axis_size, kArgRowMinChunk), ceil_div(kArgTargetWarps, g.lines));
  } else if (g.lines > 0 && inner > 1 && g.lines < kArgTargetThreads && axis_size >= 2 * kArgColumnMinChunk) {
    g.splits = std::min(ceil_div(axis_size, kArgColumnMinChunk), ceil_div(kArgTargetThreads, g.lines));
  }
  if (workspace_limit > 0 && g.splits > 1) {  // as many candidates as the limit holds; none below two
    const auto fit =
        static_cast<std::int64_t>(workspace_limit / (kArgPartialBytes * static_cast<std::uint64_t>(g.lines)));
    if (g.splits > fit) g.splits = fit < 2 ? 1 : fit;
  }
  g.chunk = ceil_div(std::max<std::int64_t>(axis_size, 1), g.splits);
  g.splits = std::max<std::int64_t>(1, ceil_div(axis_size, g.chunk));  // no empty chunk
  return g;
}

void arg_reduce(bool max, bool select_last_index, const void* x, DType dtype, void* y, const ArgReduceGeometry& g,
                void* workspace, void* stream) {
  if (g.lines <= 0) return;
  XPURT_CHECK(g.axis_size > 0, "cuda_raw::arg_reduce: the reduced axis is empty");
  XPURT_CHECK(g.splits == 1 || workspace != nullptr, "cuda_raw::arg_reduce: the plan needs ", g.workspace_bytes(),
              " bytes of workspace, but none was given");
  auto* values = static_cast<double*>(workspace);
  auto* indices = values == nullptr ? nullptr : reinterpret_cast<std::int64_t*>(values + g.lines * g.splits);
  auto* out = static_cast<std::int64_t*>(y);
  const cudaStream_t s = as_stream(stream);
  const std::int64_t tasks = g.lines * g.splits;
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    if (g.inner == 1) {
      arg_rows_kernel<T><<<grid_for(tasks, kThreads / 32), kThreads, 0, s>>>(max, select_last_index, xs, out, values,
                                                                              indices, g);
    } else {
      arg_columns_kernel<T><<<grid_for(tasks, kThreads), kThreads, 0, s>>>(max, select_last_index, xs, out, values,
                                                                          indices, g);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  };
  if (dtype == DType::kFloat64) {
    launch(double{});
  } else {
    dispatch_float(dtype, "arg_max / arg_min", launch);
  }
  if (g.splits > 1) {
    arg_finalize_kernel<<<grid_for(g.lines, kThreads / 32), kThreads, 0, s>>>(max, select_last_index, values, indices,
                                                                             out, g.lines, g.splits);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  }
}

void argmax_rows(const void* x, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t* out, void* workspace,
                 std::size_t workspace_bytes, void* stream) {
  ArgReduceGeometry g = arg_reduce_geometry(rows, cols, 1, workspace_bytes);
  if (workspace == nullptr || workspace_bytes == 0) {  // no workspace: one task per row (a limit of 0 means none)
    g.splits = 1;
    g.chunk = std::max<std::int64_t>(cols, 1);
  }
  arg_reduce(/*max=*/true, /*select_last_index=*/false, x, dtype, out, g, workspace, stream);
}

std::size_t TopKSplit::workspace_bytes() const {
  return splits > 1 ? static_cast<std::size_t>(rows * splits * k) * (value_bytes + sizeof(std::int64_t)) : 0;
}

std::string TopKSplit::str() const {
  return ::xpuruntime::detail::str_cat(rows, " rows x ", cols, " elements, k ", k, ", ", splits,
                                       splits == 1 ? " split" : " splits");
}

TopKSplit top_k_split_geometry(std::int64_t rows, std::int64_t cols, std::int64_t k, DType dtype,
                               std::uint64_t workspace_limit) {
  TopKSplit g;
  g.rows = rows;
  g.cols = cols;
  g.k = k;
  g.value_bytes = dtype_size(dtype);
  const std::int64_t min_chunk = std::max(kTopKSplitMinChunk, 4 * k);
  if (rows > 0 && rows < kTopKSplitTargetBlocks && k > 0 && top_k_supports(cols, k) &&
      top_k_by_radix_select(cols, k) && cols >= 2 * min_chunk) {
    g.splits = std::min(cols / min_chunk, ceil_div(kTopKSplitTargetBlocks, rows));
  }
  if (workspace_limit > 0 && g.splits > 1) {  // as many candidates as the limit holds; none below two
    const std::uint64_t per_split = static_cast<std::uint64_t>(rows * k) * (g.value_bytes + sizeof(std::int64_t));
    const auto fit = static_cast<std::int64_t>(workspace_limit / per_split);
    if (g.splits > fit) g.splits = fit < 2 ? 1 : fit;
  }
  // Balanced chunks: the last is at least cols / splits - splits + 1 >= min_chunk - splits long, over k.
  g.chunk = ceil_div(std::max<std::int64_t>(cols, 1), g.splits);
  g.splits = std::max<std::int64_t>(1, ceil_div(cols, g.chunk));
  return g;
}

void top_k(const void* x, DType dtype, void* values, void* indices, const TopKSplit& g, bool largest,
           void* workspace, void* stream) {
  if (g.rows == 0 || g.k == 0) return;  // an empty result (a segment whose NonZero found nothing gives one)
  XPURT_CHECK(top_k_supports(g.cols, g.k),
              "cuda_raw::top_k: rows of 1 to ", kTopKMaxAxis, " elements, 0 <= k <= cols, and k <= ",
              kTopKMaxSelected, " for rows over ", kTopKMaxCols, " elements; got cols ", g.cols, " and k ", g.k);
  XPURT_CHECK(g.splits == 1 || workspace != nullptr, "cuda_raw::top_k: the plan needs ", g.workspace_bytes(),
              " bytes of workspace, but none was given");
  XPURT_CHECK(g.splits == 1 || g.cols - (g.splits - 1) * g.chunk >= g.k, "cuda_raw::top_k: ", g.str(),
              " leaves a chunk shorter than k");
  const bool radix = g.splits > 1 || top_k_by_radix_select(g.cols, g.k);
  const auto padded = static_cast<int>(top_k_padded(radix ? g.k : g.cols));
  const std::size_t shared = static_cast<std::size_t>(padded) * (sizeof(unsigned) + sizeof(int));
  const int k = static_cast<int>(g.k);
  const cudaStream_t s = as_stream(stream);
  dispatch_float(dtype, "top_k", [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    auto* vs = static_cast<T*>(values);
    auto* is = static_cast<std::int64_t*>(indices);
    if (g.splits > 1) {  // each chunk's k best, then each row's k best of its candidates
      auto* rows_indices = static_cast<std::int64_t*>(workspace);  // first: 8-byte aligned
      auto* candidates = reinterpret_cast<T*>(rows_indices + g.rows * g.splits * g.k);
      const std::int64_t tasks = g.rows * g.splits;
      top_k_radix_kernel<T><<<grid_for(tasks, 1), kTopKRadixThreads, shared, s>>>(
          xs, candidates, rows_indices, tasks, g.splits, g.cols, g.chunk, padded, k, largest, nullptr);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
      const std::int64_t count = g.splits * g.k;
      top_k_radix_kernel<T><<<grid_for(g.rows, 1), kTopKRadixThreads, shared, s>>>(
          candidates, vs, is, g.rows, 1, count, count, padded, k, largest, rows_indices);
    } else if (radix) {
      top_k_radix_kernel<T><<<grid_for(g.rows, 1), kTopKRadixThreads, shared, s>>>(
          xs, vs, is, g.rows, 1, g.cols, g.cols, padded, k, largest, nullptr);
    } else {
      const int threads = std::min(1024, std::max(32, padded / 2));
      top_k_sort_kernel<T><<<grid_for(g.rows, 1), threads, shared, s>>>(
          xs, vs, is, g.rows, static_cast<int>(g.cols), padded, k, largest);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
