// The data-dependent ops of segmented plans (Note [Segmented plans] in capture_plan.h): NonZero and
// NonMaxSuppression write their result into an output sized for the largest possible result plus a device count,
// so that they launch without a host synchronization (and inside a CUDA graph); the plan reads the counts once, at
// the segment's end.
//
// non_zero: three deterministic passes over tiles of kTile elements (count per tile, exclusive scan of the tile
// counts, write each tile's indices at its offset), so the indices come in row-major order as ONNX's NonZero gives
// them.
// non_max_suppression: the candidates of each (batch, class) ranked by counting (score descending, ties: the smaller
// box index first, as a stable sort does), the suppression bits of every ranked pair (IoU in double, as the reference
// library computes it), then a block per (batch, class) walks them in rank order, each kept box suppressing the later
// ones whose IoU exceeds the threshold (Note [The NMS walk]), and a scan of the kept counts places each (batch,
// class)'s kept triples, in batch, class order, written by a block per (batch, class).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

constexpr int kNonZeroThreads = 256;
constexpr int kNonZeroItems = 8;
constexpr std::int64_t kTile = kNonZeroThreads * kNonZeroItems;

struct Dims {
  std::int64_t size[kNonZeroMaxRank];
  int rank;
};

// Whether element i is nonzero: every bit but the sign bit of a float (so -0.0 is zero and NaN is not), every bit
// of an integer or bool.
template <typename U>
__device__ __forceinline__ bool nonzero_at(const U* x, std::int64_t i, U mask) {
  return (x[i] & mask) != 0;
}

template <typename U>
__global__ void __launch_bounds__(kNonZeroThreads)
    non_zero_count_kernel(const U* x, std::int64_t n, U mask, std::int64_t* tile_counts) {
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * kTile;
  int local = 0;
  for (int k = 0; k < kNonZeroItems; ++k) {
    const std::int64_t i = begin + static_cast<std::int64_t>(threadIdx.x) * kNonZeroItems + k;
    if (i < n && nonzero_at(x, i, mask)) ++local;
  }
  using Scan = cub::BlockScan<int, kNonZeroThreads>;
  __shared__ typename Scan::TempStorage temp;
  int total = 0;
  Scan(temp).ExclusiveSum(local, local, total);
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}

constexpr int kScanThreads = 256;

// One block: tile_counts becomes its exclusive prefix sum; *count gets the total.
__global__ void __launch_bounds__(kScanThreads)
    non_zero_scan_kernel(std::int64_t* tile_counts, std::int64_t tiles, std::int64_t* count) {
  using Scan = cub::BlockScan<std::int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ std::int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (std::int64_t base = 0; base < tiles; base += kScanThreads) {
    const std::int64_t i = base + threadIdx.x;
    std::int64_t v = i < tiles ? tile_counts[i] : 0;
    std::int64_t total = 0;
    Scan(temp).ExclusiveSum(v, v, total);
    if (i < tiles) tile_counts[i] = v + carry;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = carry;
}

template <typename U>
__global__ void __launch_bounds__(kNonZeroThreads)
    non_zero_write_kernel(const U* x, std::int64_t n, U mask, Dims dims, const std::int64_t* tile_offsets,
                          std::int64_t* y) {
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * kTile + threadIdx.x * kNonZeroItems;
  int local = 0;
  for (int k = 0; k < kNonZeroItems; ++k) {
    const std::int64_t i = begin + k;
    if (i < n && nonzero_at(x, i, mask)) ++local;
  }
  using Scan = cub::BlockScan<int, kNonZeroThreads>;
  __shared__ typename Scan::TempStorage temp;
  int offset = 0;
  Scan(temp).ExclusiveSum(local, offset);
  std::int64_t at = tile_offsets[blockIdx.x] + offset;
  for (int k = 0; k < kNonZeroItems; ++k) {
    const std::int64_t i = begin + k;
    if (i >= n || !nonzero_at(x, i, mask)) continue;
    std::int64_t rest = i;
    for (int d = dims.rank - 1; d >= 0; --d) {
      const std::int64_t size = dims.size[d];
      y[d * n + at] = rest % size;
      rest /= size;
    }
    ++at;
  }
}

template <typename U>
void launch_non_zero(const void* x, std::int64_t n, U mask, const Dims& dims, std::int64_t* y, std::int64_t* count,
                     std::int64_t* tile_counts, cudaStream_t stream) {
  const std::int64_t tiles = (n + kTile - 1) / kTile;
  const auto* xs = static_cast<const U*>(x);
  non_zero_count_kernel<U><<<static_cast<unsigned>(tiles), kNonZeroThreads, 0, stream>>>(xs, n, mask, tile_counts);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  non_zero_scan_kernel<<<1, kScanThreads, 0, stream>>>(tile_counts, tiles, count);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  non_zero_write_kernel<U>
      <<<static_cast<unsigned>(tiles), kNonZeroThreads, 0, stream>>>(xs, n, mask, dims, tile_counts, y);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- NonMaxSuppression ----

template <typename T>
__device__ __forceinline__ double load(const T* p, std::int64_t i) {
  return static_cast<double>(to_float(p[i]));
}

// Corners (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2, as the reference library derives them.
template <typename T>
__device__ void corners_of(const T* box, bool center, double c[4]) {
  const double b0 = load(box, 0), b1 = load(box, 1), b2 = load(box, 2), b3 = load(box, 3);
  if (!center) {
    c[0] = fmin(b0, b2);
    c[1] = fmin(b1, b3);
    c[2] = fmax(b0, b2);
    c[3] = fmax(b1, b3);
  } else {
    c[0] = b1 - b3 / 2;
    c[1] = b0 - b2 / 2;
    c[2] = b1 + b3 / 2;
    c[3] = b0 + b2 / 2;
  }
}

__device__ double iou_of(const double a[4], const double b[4]) {
  const double area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
  if (area_a <= 0 || area_b <= 0) return 0.0;
  const double ih = fmin(a[2], b[2]) - fmax(a[0], b[0]);
  const double iw = fmin(a[3], b[3]) - fmax(a[1], b[1]);
  if (ih <= 0 || iw <= 0) return 0.0;
  const double inter = ih * iw;
  return inter / (area_a + area_b - inter);
}

// Workspace: order int32 [BC * S] (candidates by rank), mask u64 [BC, W, 64 W] (W = ceil(S / 64) tiles of 64 ranked
// candidates: bit j of word [c, r] says candidate r suppresses candidate 64 c + j, for 64 c + j > r; a column's words
// are contiguous, Note [The NMS walk]), nonzero u8 [BC, W, W] (whether tile r's rows have any bit in column c), kept
// int32 [BC * K] (the kept candidates' ranks; the write kernel looks up their boxes), valid and kept counts int32
// [BC], and the rank and offset scratch below.
struct NmsScratch {
  std::int32_t* order;
  std::int32_t* rank;  // int32 [BC * S]: each candidate's rank, summed over the rank kernel's splits
  unsigned long long* mask;
  std::uint8_t* nonzero;
  std::int32_t* kept;
  std::int32_t* valid;
  std::int32_t* kept_count;
  std::int64_t* offset;  // int64 [BC]: where a (batch, class)'s triples start in the output
};

constexpr int kNmsThreads = 256;
constexpr int kNmsWordBits = 64;

__device__ __host__ __forceinline__ std::int64_t words_of(std::int64_t boxes) {
  return (boxes + kNmsWordBits - 1) / kNmsWordBits;
}

// Column c of (batch, class) bc in the mask: the words of every ranked candidate against tile c (64 W of them).
__device__ __forceinline__ unsigned long long* mask_column(const NmsScratch& s, const NmsGeometry& g, std::int64_t bc,
                                                           std::int64_t c) {
  const std::int64_t tiles = words_of(g.boxes);
  return s.mask + (bc * tiles + c) * tiles * kNmsWordBits;
}

template <typename T>
__device__ __forceinline__ bool nms_valid(const T* sc, std::int64_t i, const NmsGeometry& g) {
  return !g.has_score_threshold || load(sc, i) > g.score_threshold;
}

// A block per (batch, class): how many candidates pass the score threshold.
template <typename T>
__global__ void __launch_bounds__(kNmsThreads) nms_count_kernel(const T* scores, NmsGeometry g, NmsScratch s) {
  const std::int64_t bc = blockIdx.x;
  const T* sc = scores + bc * g.boxes;
  int local = 0;
  for (std::int64_t i = threadIdx.x; i < g.boxes; i += blockDim.x) local += nms_valid(sc, i, g) ? 1 : 0;
  using Reduce = cub::BlockReduce<int, kNmsThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int total = Reduce(temp).Sum(local);
  if (threadIdx.x == 0) s.valid[bc] = total;
}

// Grid (candidate tiles, batch * class, splits of the candidates compared against): each candidate's rank by
// counting (score descending, ties: the smaller index first, as a stable sort orders them), each split's count added
// into rank (zeroed before). One class of 27,300 candidates (SSDlite's) is 107 tiles, under one block per SM: the
// splits (chosen in non_max_suppression below) give the GPU enough blocks.
template <typename T>
__global__ void __launch_bounds__(kNmsThreads) nms_rank_kernel(const T* scores, NmsGeometry g, NmsScratch s,
                                                               std::int64_t split_span) {
  const std::int64_t bc = blockIdx.y;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const T* sc = scores + bc * g.boxes;
  __shared__ double tile[kNmsThreads];
  const bool mine = i < g.boxes && nms_valid(sc, i, g);
  const double si = i < g.boxes ? load(sc, i) : 0.0;
  const std::int64_t first = blockIdx.z * split_span, last = min(g.boxes, first + split_span);
  int rank = 0;
  for (std::int64_t base = first; base < last; base += kNmsThreads) {
    __syncthreads();
    const std::int64_t j = base + threadIdx.x;
    // Candidates that fail the threshold never rank ahead: NaN stands for them.
    tile[threadIdx.x] = j < g.boxes && nms_valid(sc, j, g) ? load(sc, j) : nan("");
    __syncthreads();
    if (!mine) continue;
    const int span = static_cast<int>(min(static_cast<std::int64_t>(kNmsThreads), last - base));
    for (int t = 0; t < span; ++t) {
      const double sj = tile[t];
      rank += (sj > si || (sj == si && base + t < i)) ? 1 : 0;
    }
  }
  if (mine && rank != 0) atomicAdd(s.rank + bc * g.boxes + i, rank);
}

// Grid (candidate tiles, batch * class): each valid candidate at its rank.
template <typename T>
__global__ void __launch_bounds__(kNmsThreads) nms_order_kernel(const T* scores, NmsGeometry g, NmsScratch s) {
  const std::int64_t bc = blockIdx.y;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < g.boxes && nms_valid(scores + bc * g.boxes, i, g)) {
    s.order[bc * g.boxes + s.rank[bc * g.boxes + i]] = static_cast<std::int32_t>(i);
  }
}

// Grid (row tiles of 64, column tiles of 64, batch * class), 64 threads: the suppression bits of each ranked
// candidate against the later ones of a column tile, and whether the tile pair has any.
template <typename T>
__global__ void __launch_bounds__(kNmsWordBits) nms_mask_kernel(const T* boxes, NmsGeometry g, NmsScratch s) {
  const std::int64_t bc = blockIdx.z;
  const std::int64_t row_tile = blockIdx.x, col_tile = blockIdx.y;
  const int n = s.valid[bc];
  if (col_tile < row_tile || row_tile * kNmsWordBits >= n || col_tile * kNmsWordBits >= n) return;
  const T* bx = boxes + (bc / g.classes) * g.boxes * 4;
  const std::int32_t* order = s.order + bc * g.boxes;
  __shared__ double cols[kNmsWordBits][4];
  const std::int64_t c = col_tile * kNmsWordBits + threadIdx.x;
  if (c < n) corners_of(bx + static_cast<std::int64_t>(order[c]) * 4, g.center_point_box, cols[threadIdx.x]);
  __syncthreads();
  const std::int64_t r = row_tile * kNmsWordBits + threadIdx.x;
  unsigned long long bits = 0;
  if (r < n) {
    double mine[4];
    corners_of(bx + static_cast<std::int64_t>(order[r]) * 4, g.center_point_box, mine);
    const int span = static_cast<int>(min(static_cast<std::int64_t>(kNmsWordBits), n - col_tile * kNmsWordBits));
    for (int t = 0; t < span; ++t) {
      if (col_tile * kNmsWordBits + t > r && iou_of(mine, cols[t]) > g.iou_threshold) bits |= 1ull << t;
    }
  }
  mask_column(s, g, bc, col_tile)[r] = bits;  // r < 64 W: within the column
  const int any = __syncthreads_or(bits != 0 ? 1 : 0);
  if (threadIdx.x == 0) {
    const std::int64_t tiles = words_of(g.boxes);
    s.nonzero[(bc * tiles + row_tile) * tiles + col_tile] = any != 0 ? 1 : 0;
  }
}

// Note [The NMS walk]
// A block per (batch, class) walks the ranked candidates a tile of 64 at a time: one thread decides the tile's
// candidates against the tile's removal word and its own diagonal words (shared memory only), then every later tile c
// whose words from this tile are not all zero (the nonzero table) ORs the kept rows' words into its removal word, a
// thread per tile, its 64 words contiguous in column c and read with 16-byte loads all in flight together. The walk
// is serial in the tiles, so what a tile costs is latency: the first version ORed the kept rows' whole rows into the
// removal words (a 64-bit division and a dependent load per word), 8.7 ms for SSDlite's 27,300 candidates in one
// class (torchvision's batched NMS offsets each class's boxes so that one class holds them all). With the columns it
// took 5.4 ms (H100, 2026-12-06): the walking thread still read each kept candidate's box index from order[] and
// stored it, a global load the store waited for, one latency per kept candidate. The walk now records the rank (no
// load; the write kernel looks the boxes up in parallel), so a tile costs about two load latencies (the nonzero byte,
// then the words) and the next tile's diagonal is loaded during the walk: 4.6 ms (the same H100 the same day, against
// torchvision's nms 37.4 ms); candidates of different classes never overlap there, so most tile pairs are skipped.
constexpr int kSelectThreads = 512;

__global__ void __launch_bounds__(kSelectThreads) nms_select_kernel(NmsGeometry g, NmsScratch s) {
  extern __shared__ unsigned long long removed[];  // one word per tile
  __shared__ unsigned long long diagonal[kNmsWordBits];
  __shared__ unsigned long long keep_bits;
  __shared__ int count;
  const std::int64_t bc = blockIdx.x;
  const int n = s.valid[bc];
  const std::int64_t tiles = words_of(g.boxes);
  const std::int64_t used = (n + kNmsWordBits - 1) / kNmsWordBits;
  const std::uint8_t* nonzero = s.nonzero + bc * tiles * tiles;
  for (std::int64_t w = threadIdx.x; w < used; w += blockDim.x) removed[w] = 0;
  if (threadIdx.x == 0) count = 0;
  // The diagonal words of tile t: rows 64 t + i of column t, loaded a tile ahead.
  auto diagonal_word = [&](std::int64_t t) -> unsigned long long {
    const std::int64_t r = t * kNmsWordBits + threadIdx.x;
    return t < used && r < n ? mask_column(s, g, bc, t)[r] : 0ull;
  };
  unsigned long long next = threadIdx.x < kNmsWordBits ? diagonal_word(0) : 0ull;
  __syncthreads();
  for (std::int64_t tile = 0; tile < used && count < g.max_per_class; ++tile) {
    if (threadIdx.x < kNmsWordBits) diagonal[threadIdx.x] = next;
    __syncthreads();
    if (threadIdx.x < kNmsWordBits) next = diagonal_word(tile + 1);  // in flight during the walk
    if (threadIdx.x == 0) {
      const int span = static_cast<int>(min(static_cast<std::int64_t>(kNmsWordBits), n - tile * kNmsWordBits));
      unsigned long long word = removed[tile], keep = 0;
      int c = count;
      for (int t = 0; t < span && c < g.max_per_class; ++t) {
        if ((word >> t) & 1ull) continue;
        s.kept[bc * g.max_per_class + c] = static_cast<std::int32_t>(tile * kNmsWordBits + t);  // its rank
        ++c;
        keep |= 1ull << t;
        word |= diagonal[t];
      }
      count = c;
      keep_bits = keep;
    }
    __syncthreads();
    const unsigned long long keep = keep_bits;
    for (std::int64_t col = tile + 1 + threadIdx.x; keep != 0 && col < used; col += blockDim.x) {
      if (nonzero[tile * tiles + col] == 0) continue;
      const auto* words = reinterpret_cast<const ulonglong2*>(mask_column(s, g, bc, col) + tile * kNmsWordBits);
      unsigned long long acc = 0;
#pragma unroll
      for (int k = 0; k < kNmsWordBits / 2; ++k) {
        const unsigned pair = static_cast<unsigned>(keep >> (2 * k)) & 3u;
        if (pair == 0) continue;
        const ulonglong2 v = __ldg(words + k);
        acc |= ((pair & 1u) != 0 ? v.x : 0ull) | ((pair & 2u) != 0 ? v.y : 0ull);
      }
      removed[col] |= acc;  // this thread's tile alone in this pass
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) s.kept_count[bc] = count;
}

// One block: where each (batch, class)'s kept triples start (an exclusive scan of the kept counts, a chunk of
// kOffsetThreads pairs at a time), and the total.
constexpr int kOffsetThreads = 1024;

__global__ void __launch_bounds__(kOffsetThreads) nms_offsets_kernel(std::int64_t pairs, NmsScratch s,
                                                                     std::int64_t* count) {
  using Scan = cub::BlockScan<std::int64_t, kOffsetThreads>;
  __shared__ typename Scan::TempStorage temp;
  std::int64_t carried = 0;
  for (std::int64_t chunk = 0; chunk < pairs; chunk += kOffsetThreads) {
    const std::int64_t bc = chunk + threadIdx.x;
    const std::int64_t kept = bc < pairs ? s.kept_count[bc] : 0;
    std::int64_t offset = 0, chunk_total = 0;
    Scan(temp).ExclusiveSum(kept, offset, chunk_total);
    if (bc < pairs) s.offset[bc] = carried + offset;
    carried += chunk_total;
    __syncthreads();  // temp is reused by the next chunk
  }
  if (threadIdx.x == 0) *count = carried;
}

// A block per (batch, class): its kept triples at its offset.
__global__ void nms_write_kernel(NmsGeometry g, NmsScratch s, std::int64_t* selected) {
  const std::int64_t bc = blockIdx.x;
  const int n = s.kept_count[bc];
  std::int64_t* rows = selected + s.offset[bc] * 3;
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    rows[3 * k] = bc / g.classes;
    rows[3 * k + 1] = bc % g.classes;
    rows[3 * k + 2] = s.order[bc * g.boxes + s.kept[bc * g.max_per_class + k]];  // the kept rank's box
  }
}

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// The workspace's parts at their 256-byte aligned offsets from `base`; `*end`: the bytes they take.
NmsScratch scratch_of(const NmsGeometry& g, void* base, std::size_t* end = nullptr) {
  const auto pairs = static_cast<std::size_t>(g.batches * g.classes);
  const auto boxes = static_cast<std::size_t>(g.boxes);
  const auto tiles = static_cast<std::size_t>(words_of(g.boxes));
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    void* p = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(base) + at);  // base may be null (sizes)
    at += align256(bytes);
    return p;
  };
  NmsScratch s{};
  s.order = static_cast<std::int32_t*>(take(pairs * boxes * sizeof(std::int32_t)));
  s.rank = static_cast<std::int32_t*>(take(pairs * boxes * sizeof(std::int32_t)));
  s.mask = static_cast<unsigned long long*>(take(pairs * tiles * tiles * kNmsWordBits * sizeof(unsigned long long)));
  s.nonzero = static_cast<std::uint8_t*>(take(pairs * tiles * tiles));
  s.kept = static_cast<std::int32_t*>(take(pairs * static_cast<std::size_t>(g.max_per_class) * sizeof(std::int32_t)));
  s.valid = static_cast<std::int32_t*>(take(pairs * sizeof(std::int32_t)));
  s.kept_count = static_cast<std::int32_t*>(take(pairs * sizeof(std::int32_t)));
  s.offset = static_cast<std::int64_t*>(take(pairs * sizeof(std::int64_t)));
  if (end != nullptr) *end = at;
  return s;
}

}  // namespace

std::size_t non_zero_workspace_bytes(std::int64_t numel) {
  return static_cast<std::size_t>(std::max<std::int64_t>(1, (numel + kTile - 1) / kTile)) * sizeof(std::int64_t);
}

void non_zero(const void* x, DType dtype, const std::vector<std::int64_t>& shape, void* y, void* count, void* workspace,
              void* stream) {
  XPURT_CHECK(!shape.empty() && shape.size() <= static_cast<std::size_t>(kNonZeroMaxRank),
              "cuda_raw::non_zero: rank 1 to ", kNonZeroMaxRank, ", got ", shape.size());
  Dims dims{};
  dims.rank = static_cast<int>(shape.size());
  std::int64_t n = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    dims.size[d] = shape[d];
    n *= shape[d];
  }
  auto* out = static_cast<std::int64_t*>(y);
  auto* total = static_cast<std::int64_t*>(count);
  const cudaStream_t s = as_stream(stream);
  if (n == 0) {
    XPURT_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(std::int64_t), s));
    return;
  }
  // The columns past the count are zero (as the cpu kernel leaves them): the output never holds stale bytes.
  XPURT_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(n * dims.rank) * sizeof(std::int64_t), s));
  auto* tiles = static_cast<std::int64_t*>(workspace);
  switch (dtype) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
      return launch_non_zero<std::uint8_t>(x, n, 0xffu, dims, out, total, tiles, s);
    case DType::kInt16:
    case DType::kUInt16:
      return launch_non_zero<std::uint16_t>(x, n, 0xffffu, dims, out, total, tiles, s);
    case DType::kFloat16:
    case DType::kBFloat16:
      return launch_non_zero<std::uint16_t>(x, n, 0x7fffu, dims, out, total, tiles, s);
    case DType::kInt32:
    case DType::kUInt32:
      return launch_non_zero<std::uint32_t>(x, n, 0xffffffffu, dims, out, total, tiles, s);
    case DType::kFloat32:
      return launch_non_zero<std::uint32_t>(x, n, 0x7fffffffu, dims, out, total, tiles, s);
    case DType::kInt64:
    case DType::kUInt64:
      return launch_non_zero<unsigned long long>(x, n, ~0ull, dims, out, total, tiles, s);
    case DType::kFloat64:
      return launch_non_zero<unsigned long long>(x, n, 0x7fffffffffffffffull, dims, out, total, tiles, s);
    default:
      throw UnsupportedOperationError(
          ::xpuruntime::detail::str_cat("cuda_raw::non_zero does not take ", dtype_name(dtype)));
  }
}

std::size_t nms_workspace_bytes(const NmsGeometry& g) {
  std::size_t bytes = 0;
  scratch_of(g, nullptr, &bytes);  // offsets only: nothing is dereferenced
  return bytes;
}

void non_max_suppression(const void* boxes, const void* scores, DType dtype, const NmsGeometry& g, void* selected,
                         void* count, void* workspace, void* stream) {
  const cudaStream_t s = as_stream(stream);
  auto* total = static_cast<std::int64_t*>(count);
  const std::int64_t pairs = g.batches * g.classes;
  if (pairs == 0 || g.boxes == 0 || g.max_per_class == 0) {
    XPURT_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(std::int64_t), s));
    return;
  }
  XPURT_CUDA_CHECK(
      cudaMemsetAsync(selected, 0, static_cast<std::size_t>(pairs * g.max_per_class * 3) * sizeof(std::int64_t), s));
  const NmsScratch scratch = scratch_of(g, workspace);
  const std::int64_t tiles = (g.boxes + kNmsWordBits - 1) / kNmsWordBits;
  XPURT_CHECK(tiles <= 65535 && pairs <= 65535, "cuda_raw::non_max_suppression: up to 65535 (batch, class) pairs and ",
              65535 * kNmsWordBits, " boxes, got ", pairs, " and ", g.boxes);
  const std::size_t removed_bytes = static_cast<std::size_t>(tiles) * sizeof(unsigned long long);
  XPURT_CHECK(removed_bytes <= 48 * 1024, "cuda_raw::non_max_suppression: up to ", 48 * 1024 / 8 * kNmsWordBits,
              " boxes per class, got ", g.boxes);
  dispatch_float(dtype, "non_max_suppression", [&](auto tag) {
    using T = decltype(tag);
    const auto* sc = static_cast<const T*>(scores);
    nms_count_kernel<T><<<static_cast<unsigned>(pairs), kNmsThreads, 0, s>>>(sc, g, scratch);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    const std::int64_t candidate_tiles = (g.boxes + kNmsThreads - 1) / kNmsThreads;
    // Splits of the compared candidates until the rank kernel has about 512 blocks (4 per SM), each split at least a
    // shared-memory tile.
    const std::int64_t splits = std::clamp<std::int64_t>(512 / (candidate_tiles * pairs), 1, candidate_tiles);
    const std::int64_t split_span = (candidate_tiles + splits - 1) / splits * kNmsThreads;
    XPURT_CUDA_CHECK(cudaMemsetAsync(scratch.rank, 0, static_cast<std::size_t>(pairs * g.boxes) * sizeof(std::int32_t),
                                     s));
    const dim3 rank_grid(static_cast<unsigned>(candidate_tiles), static_cast<unsigned>(pairs),
                         static_cast<unsigned>((g.boxes + split_span - 1) / split_span));
    nms_rank_kernel<T><<<rank_grid, kNmsThreads, 0, s>>>(sc, g, scratch, split_span);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    nms_order_kernel<T><<<dim3(rank_grid.x, rank_grid.y), kNmsThreads, 0, s>>>(sc, g, scratch);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    const dim3 mask_grid(static_cast<unsigned>(tiles), static_cast<unsigned>(tiles), static_cast<unsigned>(pairs));
    nms_mask_kernel<T><<<mask_grid, kNmsWordBits, 0, s>>>(static_cast<const T*>(boxes), g, scratch);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
  nms_select_kernel<<<static_cast<unsigned>(pairs), kSelectThreads, removed_bytes, s>>>(g, scratch);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  nms_offsets_kernel<<<1, kOffsetThreads, 0, s>>>(pairs, scratch, total);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  nms_write_kernel<<<static_cast<unsigned>(pairs), 128, 0, s>>>(g, scratch, static_cast<std::int64_t*>(selected));
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace xpuruntime::cuda_raw
