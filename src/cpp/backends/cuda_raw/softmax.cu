// Softmax kernels: along the last axis (rows cached in registers by a group of 1 to 512 threads, or a block per
// row reading it twice for rows too long to cache), along an inner axis (a thread per column, strided), and the
// scaled/masked softmax of the unfused attention.
//
// Note [Register-cached softmax]
// A last-axis softmax is memory-bound: at best it reads each element once and writes it once. The cached kernel
// loads a row once into registers (16-byte vectors when the plain softmax's row is made of whole aligned vectors,
// element by element otherwise and for the attention softmax, whose mask may be strided), takes the row's maximum
// and then the sum of exp(x - max) from registers with shuffle reductions (plus shared memory for block groups),
// and writes exp(x - max) / sum: one read, one write and one exp per element. The group of threads that owns a
// row grows with the row so that no thread holds more than kVectorSlots vectors (Source::kScalarSlots elements):
// one thread per row for the shortest rows, then 2 to 32 lanes (a row of 128 halves is 16 vectors: 4 lanes, 8
// rows a warp), then blocks of 64 to 512 threads (a row of 4096 halves: 128 threads of 4 vectors). Short rows
// thus leave no lane idle, a thread's slots are mostly filled (registers, hence bytes in flight per SM, are not
// spent on empty slots), and a thread issues all its loads (up to 64 bytes) before its first reduction: this is
// what keeps enough bytes in flight to stream at close to the copy bandwidth. When rows are few, groups grow
// further (cached_group) to shorten each thread's serial work. Rows too long to cache (over 16384 halves or 8192
// floats with vectors, 8192 elements otherwise, 4096 for the attention softmax) take the online kernel
// (Note [Online softmax]), which reads the row twice, the second time mostly from L2.
//
// Special values in the cached kernel, as the cpu kernel and torch.softmax: the maximum skips NaN (fmaxf), so a
// NaN entry's exp is NaN, the sum is NaN, and so is the whole row. A +inf entry makes the maximum +inf and its own
// exp(inf - inf) NaN: the row is NaN. -inf entries (masked keys) give exp(-inf) = 0, exactly; a row that is -inf
// everywhere has max = -inf and exp(-inf - -inf) = NaN: NaN, as PyTorch gives. The slots of a thread beyond the
// row's end hold -inf, which adds 0 to a row with a finite maximum and cannot change a row that is NaN anyway.
// A source whose zero_fully_masked_rows() is true (the attention softmax with fully_masked_rows="zero", Note [Fully
// masked attention rows] in cpu_attention.cpp) takes a maximum of -inf as 0: a row that is -inf everywhere then has
// exp(-inf) = 0 everywhere and a sum of 0, and is written as 0 (a factor of 0 for 1 / 0); a NaN entry still makes
// the sum, and so the row, NaN. A finite maximum contributes exp(0) = 1, so no other row has a sum of 0.
// In place (y == x) is safe: every element is read and later written by the same thread, and by no other.
//
// Note [Split softmax]
// A row is one group's work, so a softmax of few long rows (a vocabulary of 128256 at batch 1, a norm over a whole
// feature map) ran on as many blocks as rows: one SM streaming the row twice, the rest idle. When the rows are fewer
// than kSplitTargetBlocks and longer than kSplitMinCols (past the cached kernel's rows), row_split_geometry cuts
// each row into chunks (at least kSplitMinChunk = 2048 elements, a multiple of 8) so that rows x splits blocks fill the GPU:
// softmax_partials_kernel takes each chunk's (max, sum of exp(x - max)) online (Note [Online softmax]) into the
// workspace, then softmax_split_write_kernel has every chunk's block merge its row's pairs (the same strided order and
// tree in every block, so every block of a row gets the same bits) and write its chunk. Two reads of x and one write,
// as the online kernel, but over the whole GPU. Special values as the online kernel.
//
// Note [Online softmax]
// Each thread keeps a running maximum m and a running sum s of exp(x - m) over the entries it reads (when a
// larger entry arrives, s is rescaled by exp(m_old - m_new)); the group then merges the (m, s) pairs. One pass
// over the row finds both, a second pass writes exp(x - m) / s. -inf entries contribute nothing, so a row with
// some -inf entries (masked keys) is exact, and a row that is -inf everywhere ends with m = -inf, s = 0 and
// yields NaN, as PyTorch does, or 0 for a source whose zero_fully_masked_rows() is true. A NaN entry makes its row
// NaN. In-place (y == x) is safe: each element is read for the second time and written by the same thread, after
// the group's merge, which follows every first read.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// Rows too long for the cached kernel take a block of kBlockGroup threads (Note [Online softmax]).
constexpr int kBlockGroup = 512;
// Register slots per thread in the cached kernel (Note [Register-cached softmax]): 16-byte vectors; elements are
// Source::kScalarSlots.
constexpr int kVectorSlots = 4;
// The largest group the cached kernel takes (a block), and the threads per SM that its register use must allow
// (at most 64 registers a thread: the attention source's strided mask addresses would otherwise take twice that).
constexpr int kMaxCachedGroup = 512;
constexpr int kCachedMinThreads = 1024;
// Launches with fewer threads than this are latency-bound: they take larger groups (see cached_group).
constexpr std::int64_t kFewThreads = 16384;

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

// NaN-skipping maximum (fmaxf): see Note [Register-cached softmax] for why NaN still reaches the output.
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Row sources: what the softmax of row r reads at column c. `row(r)` does the per-row index math once;
// `load<kPack>(j, out)` reads columns [j * kPack, (j + 1) * kPack) for the cached kernel.
template <typename T>
struct PlainSource {
  static constexpr int kScalarSlots = 16;
  const T* x;
  std::int64_t cols;

  // A row that is -inf everywhere is NaN (Note [Register-cached softmax]).
  __device__ __forceinline__ bool zero_fully_masked_rows() const { return false; }

  struct Row {
    const T* x;
    __device__ __forceinline__ float operator()(std::int64_t c) const { return to_float(x[c]); }
    // kPack > 1: one 16-byte vector load (the row start is then 16-byte aligned).
    template <int kPack>
    __device__ __forceinline__ void load(int j, float (&out)[kPack]) const {
      if constexpr (kPack == 1) {
        out[0] = to_float(x[j]);
      } else {
        const Vec<T, kPack> v = reinterpret_cast<const Vec<T, kPack>*>(x)[j];
#pragma unroll
        for (int k = 0; k < kPack; ++k) out[k] = to_float(v.v[k]);
      }
    }
  };
  __device__ __forceinline__ Row row(std::int64_t r) const { return Row{x + r * cols}; }
};

// scores * scale + mask, -inf beyond the causal diagonal; see attention_softmax in cuda_raw_ops.h.
template <typename T>
struct AttentionSource {
  // Half the plain source's: each element also holds a mask address (a register pair) until its load.
  static constexpr int kScalarSlots = 8;
  const T* scores;
  const T* mask;  // null: no mask
  std::int64_t sq;
  std::int64_t sk;
  std::int64_t heads;
  std::int64_t mask_strides[4];
  float scale;
  bool causal;
  bool zero_rows;  // a row that is -inf everywhere gives 0 (Note [Fully masked attention rows])
  bool uniform_rows;  // -inf scores count as kUniformMaskedScore: such a row gives the mean of v

  __device__ __forceinline__ bool zero_fully_masked_rows() const { return zero_rows; }

  struct Row {
    const T* scores;
    const T* mask;
    std::int64_t mask_key_stride;
    std::int64_t last_key;  // keys after it are masked (causal); sk - 1 otherwise
    float scale;
    bool uniform;
    __device__ __forceinline__ float operator()(std::int64_t c) const {
      if (c > last_key) return -INFINITY;
      float v = to_float(scores[c]) * scale;
      if (mask != nullptr) v += to_float(mask[c * mask_key_stride]);
      return uniform && v == -INFINITY ? kUniformMaskedScore : v;
    }
    template <int kPack>
    __device__ __forceinline__ void load(int j, float (&out)[kPack]) const {
      static_assert(kPack == 1, "the attention softmax reads element by element (the mask may be strided)");
      out[0] = (*this)(j);
    }
  };
  __device__ __forceinline__ Row row(std::int64_t r) const {
    const std::int64_t query = r % sq;
    const std::int64_t batch_head = r / sq;
    const std::int64_t head = batch_head % heads;
    const std::int64_t batch = batch_head / heads;
    const T* mask_row =
        mask != nullptr ? mask + batch * mask_strides[0] + head * mask_strides[1] + query * mask_strides[2] : nullptr;
    return Row{scores + r * sk, mask_row, mask_strides[3], causal ? query : sk - 1, scale, uniform_rows};
  }
};

// Writes columns [j * kPack, (j + 1) * kPack) of a row from `values` (one 16-byte store when kPack > 1).
template <typename T, int kPack>
__device__ __forceinline__ void store_pack(T* row, int j, const float (&values)[kPack]) {
  if constexpr (kPack == 1) {
    row[j] = from_float<T>(values[0]);
  } else {
    Vec<T, kPack> v;
#pragma unroll
    for (int k = 0; k < kPack; ++k) v.v[k] = from_float<T>(values[k]);
    reinterpret_cast<Vec<T, kPack>*>(row)[j] = v;
  }
}

// Note [Register-cached softmax]. A group of kGroup threads per row, kBlock / kGroup rows per block; pack j of
// the row (columns [j * kPack, (j + 1) * kPack), cols / kPack packs, cols a multiple of kPack) is held by lane
// j % kGroup in slot j / kGroup. Every thread of a block runs the same row iterations (a group past the last row
// loads and stores nothing), so sub-warp groups shuffle in whole warps and block groups reach every barrier.
template <typename T, typename Source, int kPack, int kSlots, int kGroup, int kBlock>
__global__ void __launch_bounds__(kBlock, kCachedMinThreads / kBlock)
    softmax_cached_kernel(Source source, T* y, std::int64_t rows, int cols, bool log_output) {
  static_assert(kBlock % kGroup == 0 && kBlock % 32 == 0, "whole groups and warps per block");
  constexpr int kRowsPerBlock = kBlock / kGroup;
  __shared__ float smem[kGroup >= 32 ? kGroup / 32 : 1];
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int packs = cols / kPack;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock;
  for (std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock; first < rows;
       first += row_stride) {
    const std::int64_t r = first + static_cast<std::int64_t>(threadIdx.x) / kGroup;
    const std::int64_t row = r < rows ? r : 0;
    const int count = r < rows ? packs : 0;          // the row's packs; none past the last row
    const int used = (count + kGroup - 1) / kGroup;  // slots that some lane of the group fills
    const auto in = source.row(row);
    float values[kSlots][kPack];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int j = lane + i * kGroup;
      if (j < count) {
        in.template load<kPack>(j, values[i]);
      } else {
#pragma unroll
        for (int k = 0; k < kPack; ++k) values[i][k] = -INFINITY;
      }
    }
    // Slots at or past `used` are -inf in every lane: skipping them changes nothing but the work.
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i < used) {
#pragma unroll
        for (int k = 0; k < kPack; ++k) m = fmaxf(m, values[i][k]);
      }
    }
    m = group_reduce<kGroup>(m, MaxOp{}, smem);
    const bool zero_rows = source.zero_fully_masked_rows();
    if (zero_rows && m == -INFINITY) m = 0.0f;  // every exp below is then 0 (NaN for a NaN entry)
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i < used) {
#pragma unroll
        for (int k = 0; k < kPack; ++k) {
          const float e = expf(values[i][k] - m);
          if (!log_output) values[i][k] = e;
          s += e;
        }
      }
    }
    s = group_reduce<kGroup>(s, SumOp{}, smem);
    // log_softmax: x - (m + log(s)); softmax: exp(x - m) * (1 / s).
    const float shift = log_output ? m + logf(s) : 0.0f;
    const float factor = log_output ? 1.0f : (zero_rows && s == 0.0f ? 0.0f : 1.0f / s);
    T* out = y + row * static_cast<std::int64_t>(cols);
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int j = lane + i * kGroup;
      if (j < count) {
        float w[kPack];
#pragma unroll
        for (int k = 0; k < kPack; ++k) w[k] = (values[i][k] - shift) * factor;
        store_pack<T, kPack>(out, j, w);
      }
    }
  }
}

// The group for rows of `packs` packs held in at most `slots` slots a thread (packs <= kMaxCachedGroup * slots):
// the smallest that holds the row; with 16-byte vectors at least two lanes (so that each load instruction of a
// group covers whole 32-byte sectors); and, while the launch has fewer than kFewThreads threads (few rows: the
// kernel is latency-bound), larger groups with fewer packs per thread, as long as every lane gets a pack.
inline int cached_group(std::int64_t packs, std::int64_t rows, std::int64_t slots, bool vectors) {
  constexpr int kGroups[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, kMaxCachedGroup};
  constexpr int kLast = static_cast<int>(sizeof(kGroups) / sizeof(kGroups[0])) - 1;
  int k = 0;
  while (k < kLast && packs > kGroups[k] * slots) ++k;
  if (vectors && packs >= 2 && k == 0) k = 1;
  while (k < kLast && rows * kGroups[k] < kFewThreads && kGroups[k + 1] <= packs) ++k;
  return kGroups[k];
}

// Sub-warp and warp groups take blocks of one warp while rows are few (spreading them over the SMs), of four
// warps otherwise; block groups take one row per block.
template <typename T, typename Source, int kPack, int kGroup>
void launch_cached_group(const Source& source, T* y, std::int64_t rows, int cols, bool log_output,
                         cudaStream_t stream) {
  constexpr int kSlots = kPack == 1 ? Source::kScalarSlots : kVectorSlots;
  if constexpr (kGroup > 32) {
    softmax_cached_kernel<T, Source, kPack, kSlots, kGroup, kGroup>
        <<<grid_for(rows, 1), kGroup, 0, stream>>>(source, y, rows, cols, log_output);
  } else {
    constexpr int kRowsPerWarp = 32 / kGroup;
    if (rows <= std::int64_t{1024} * kRowsPerWarp) {
      softmax_cached_kernel<T, Source, kPack, kSlots, kGroup, 32>
          <<<grid_for(rows, kRowsPerWarp), 32, 0, stream>>>(source, y, rows, cols, log_output);
    } else {
      softmax_cached_kernel<T, Source, kPack, kSlots, kGroup, 128>
          <<<grid_for(rows, 4 * kRowsPerWarp), 128, 0, stream>>>(source, y, rows, cols, log_output);
    }
  }
}

// Launches the cached kernel with packs of kPack columns (cols a multiple of kPack; 16-byte aligned rows when
// kPack > 1); false when the row is too long to cache.
template <typename T, int kPack, typename Source>
bool launch_cached(const Source& source, T* y, std::int64_t rows, std::int64_t cols, bool log_output,
                   cudaStream_t stream) {
  constexpr std::int64_t kSlots = kPack == 1 ? Source::kScalarSlots : kVectorSlots;
  const std::int64_t packs = cols / kPack;
  if (packs > kMaxCachedGroup * kSlots) return false;
  const int c = static_cast<int>(cols);
  switch (cached_group(packs, rows, kSlots, kPack > 1)) {
    case 1: launch_cached_group<T, Source, kPack, 1>(source, y, rows, c, log_output, stream); break;
    case 2: launch_cached_group<T, Source, kPack, 2>(source, y, rows, c, log_output, stream); break;
    case 4: launch_cached_group<T, Source, kPack, 4>(source, y, rows, c, log_output, stream); break;
    case 8: launch_cached_group<T, Source, kPack, 8>(source, y, rows, c, log_output, stream); break;
    case 16: launch_cached_group<T, Source, kPack, 16>(source, y, rows, c, log_output, stream); break;
    case 32: launch_cached_group<T, Source, kPack, 32>(source, y, rows, c, log_output, stream); break;
    case 64: launch_cached_group<T, Source, kPack, 64>(source, y, rows, c, log_output, stream); break;
    case 128: launch_cached_group<T, Source, kPack, 128>(source, y, rows, c, log_output, stream); break;
    case 256: launch_cached_group<T, Source, kPack, 256>(source, y, rows, c, log_output, stream); break;
    default: launch_cached_group<T, Source, kPack, kMaxCachedGroup>(source, y, rows, c, log_output, stream); break;
  }
  return true;
}

// The online kernel for rows too long to cache: a block of kGroup threads per row, grid-stride over rows (the
// loop bounds are uniform per block, so every thread reaches the barriers). Note [Online softmax].
template <typename T, typename Source, int kGroup>
__global__ void __launch_bounds__(kGroup) softmax_rows_kernel(Source source, T* y, std::int64_t rows,
                                                              std::int64_t cols, bool log_output) {
  __shared__ float smem[2 * (kGroup / 32)];
  const int lane = static_cast<int>(threadIdx.x);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const auto row = source.row(r);
    float m = -INFINITY;
    float s = 0.0f;
    for (std::int64_t c = lane; c < cols; c += kGroup) online_add(m, s, row(c));
    group_online_merge<kGroup>(m, s, smem);
    T* out = y + r * cols;
    if (log_output) {  // log_softmax: x - m - log(s)
      const float shift = m + logf(s);
      for (std::int64_t c = lane; c < cols; c += kGroup) out[c] = from_float<T>(row(c) - shift);
    } else if (source.zero_fully_masked_rows() && s == 0.0f) {  // every entry -inf (a NaN one makes s NaN)
      for (std::int64_t c = lane; c < cols; c += kGroup) out[c] = from_float<T>(0.0f);
    } else {
      for (std::int64_t c = lane; c < cols; c += kGroup) out[c] = from_float<T>(expf(row(c) - m) / s);
    }
  }
}

// The softmax of every row of [rows, cols]: the cached kernel (16-byte vectors for plain rows of whole aligned
// vectors, elements otherwise), else the online kernel.
template <typename T, typename Source>
void launch_softmax_rows(const Source& source, T* y, std::int64_t rows, std::int64_t cols, cudaStream_t stream,
                         bool log_output = false) {
  if (rows <= 0 || cols <= 0) return;
  bool cached = false;
  if constexpr (std::is_same_v<Source, PlainSource<T>>) {
    constexpr int kVec = kVec16<T>;
    if (cols % kVec == 0 && is_aligned(source.x, 16) && is_aligned(y, 16)) {
      cached = launch_cached<T, kVec>(source, y, rows, cols, log_output, stream);
    }
  }
  if (!cached) cached = launch_cached<T, 1>(source, y, rows, cols, log_output, stream);
  if (!cached) {
    softmax_rows_kernel<T, Source, kBlockGroup>
        <<<grid_for(rows, 1), kBlockGroup, 0, stream>>>(source, y, rows, cols, log_output);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- few long rows (Note [Split softmax]) ----

constexpr std::int64_t kSplitTargetBlocks = 264;  // two blocks per SM of an H100 (132 SMs)
constexpr std::int64_t kSplitMinCols = 32768;
// Chunks of 2048 (4 elements a thread of a 512-thread block): with 8192 a norm over a 200704-element map (PoolFormer's
// GroupNorm(1) at batch 1) ran on 25 blocks, two launches of about 5 us each for 1.2 MB of traffic, each block's
// threads waiting on 16 rounds of loads; 98 blocks of 2048 take one round.
constexpr std::int64_t kSplitMinChunk = 2048;

template <typename T>
__global__ void __launch_bounds__(kBlockGroup)
    softmax_partials_kernel(const T* x, float2* partials, std::int64_t tasks, std::int64_t cols, std::int64_t chunk,
                            std::int64_t splits) {
  __shared__ float smem[2 * (kBlockGroup / 32)];
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const auto [row, begin, end] = row_chunk(task, splits, chunk, cols);
    const T* in = x + row * cols;
    float m = -INFINITY;
    float s = 0.0f;
    for (std::int64_t c = begin + threadIdx.x; c < end; c += kBlockGroup) online_add(m, s, to_float(in[c]));
    group_online_merge<kBlockGroup>(m, s, smem);  // ends with a barrier: smem is free for the next task
    if (threadIdx.x == 0) partials[task] = make_float2(m, s);
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockGroup)
    softmax_split_write_kernel(const T* x, T* y, const float2* partials, std::int64_t tasks, std::int64_t cols,
                               std::int64_t chunk, std::int64_t splits, bool log_output) {
  __shared__ float smem[2 * (kBlockGroup / 32)];
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const auto [row, begin, end] = row_chunk(task, splits, chunk, cols);
    float m = -INFINITY;
    float s = 0.0f;
    for (std::int64_t k = threadIdx.x; k < splits; k += kBlockGroup) {
      const float2 p = partials[row * splits + k];
      online_merge(m, s, p.x, p.y);
    }
    group_online_merge<kBlockGroup>(m, s, smem);
    const T* in = x + row * cols;
    T* out = y + row * cols;
    if (log_output) {
      const float shift = m + logf(s);
      for (std::int64_t c = begin + threadIdx.x; c < end; c += kBlockGroup) {
        out[c] = from_float<T>(to_float(in[c]) - shift);
      }
    } else {
      for (std::int64_t c = begin + threadIdx.x; c < end; c += kBlockGroup) {
        out[c] = from_float<T>(expf(to_float(in[c]) - m) / s);
      }
    }
  }
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

std::size_t RowSplit::workspace_bytes() const {
  return splits > 1 ? static_cast<std::size_t>(rows * splits) * sizeof(float2) : 0;
}

std::string RowSplit::str() const {
  return ::xpuruntime::detail::str_cat(rows, " rows x ", cols, " elements, ", splits,
                                       splits == 1 ? " split" : " splits");
}

RowSplit row_split_geometry(std::int64_t rows, std::int64_t cols, std::uint64_t workspace_limit) {
  RowSplit g;
  g.rows = rows;
  g.cols = cols;
  if (rows > 0 && rows < kSplitTargetBlocks && cols > kSplitMinCols) {
    g.splits = std::min((cols + kSplitMinChunk - 1) / kSplitMinChunk, (kSplitTargetBlocks + rows - 1) / rows);
  }
  if (workspace_limit > 0 && g.splits > 1) {  // as many pairs as the limit holds; none below two
    const auto fit = static_cast<std::int64_t>(workspace_limit / (sizeof(float2) * static_cast<std::uint64_t>(rows)));
    if (g.splits > fit) g.splits = fit < 2 ? 1 : fit;
  }
  g.chunk = (std::max<std::int64_t>(cols, 1) + g.splits - 1) / g.splits;
  g.chunk = (g.chunk + 7) / 8 * 8;  // chunks start at 16-byte boundaries of 16-bit rows
  g.splits = std::max<std::int64_t>(1, (cols + g.chunk - 1) / g.chunk);  // no empty chunk
  return g;
}

void softmax_split(const void* x, void* y, DType dtype, const RowSplit& g, bool log_output, void* workspace,
                   void* stream) {
  if (g.splits <= 1) {
    softmax_any(x, y, dtype, g.rows, g.cols, 1, log_output, stream);
    return;
  }
  XPURT_CHECK(workspace != nullptr, "cuda_raw::softmax_split: the plan needs ", g.workspace_bytes(),
              " bytes of workspace, but none was given");
  auto* partials = static_cast<float2*>(workspace);
  const std::int64_t tasks = g.rows * g.splits;
  dispatch_float(dtype, log_output ? "log_softmax" : "softmax", [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    softmax_partials_kernel<T><<<grid_for(tasks, 1), kBlockGroup, 0, as_stream(stream)>>>(xs, partials, tasks, g.cols,
                                                                                          g.chunk, g.splits);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    softmax_split_write_kernel<T><<<grid_for(tasks, 1), kBlockGroup, 0, as_stream(stream)>>>(
        xs, static_cast<T*>(y), partials, tasks, g.cols, g.chunk, g.splits, log_output);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

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
                       std::int64_t sk, float scale, bool causal, FullyMaskedRows rows, const void* mask,
                       const std::vector<std::int64_t>& mask_strides, void* stream) {
  XPURT_CHECK(heads >= 1 && batch_heads >= 0 && batch_heads % heads == 0, "cuda_raw::attention_softmax: heads (",
              heads, ") must be >= 1 and divide batch_heads (", batch_heads, ")");
  XPURT_CHECK(sq >= 0 && sk >= 0, "cuda_raw::attention_softmax: sq and sk must be >= 0, got ", sq, " and ", sk);
  XPURT_CHECK(mask == nullptr || mask_strides.size() == 4, "cuda_raw::attention_softmax: mask_strides must have 4 "
              "entries (the [B, H, Sq, Sk] strides of the mask in elements), got ", mask_strides.size());
  dispatch_float(dtype, "attention softmax", [&](auto tag) {
    using T = decltype(tag);
    AttentionSource<T> source{static_cast<const T*>(scores), static_cast<const T*>(mask), sq, sk, heads,
                              {0, 0, 0, 0}, scale, causal, rows == FullyMaskedRows::kZero,
                              rows == FullyMaskedRows::kUniform};
    if (mask != nullptr) {
      for (int k = 0; k < 4; ++k) source.mask_strides[k] = mask_strides[static_cast<std::size_t>(k)];
    }
    launch_softmax_rows<T>(source, static_cast<T*>(scores), batch_heads * sq, sk, as_stream(stream));
  });
}

}  // namespace xpuruntime::cuda_raw
