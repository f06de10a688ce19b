// ONNX Pad (constant, reflect, edge, wrap; negative pads crop) for any element size and any rank up to kMaxDims:
// a row kernel with 32-bit index math where the sizes fit (Note [Pad rows]; constant pads without crops stage their
// input in shared memory, Note [Constant pad staging]), else one thread per output element that maps each of its
// coordinates back to the input with 64-bit math.
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <cuda_pipeline.h>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// Per dimension, innermost first: output size, input size, input stride, leading pad (negative: cropped).
struct PadGeometry {
  int rank = 0;
  std::int64_t out_size[kMaxDims] = {};
  std::int64_t in_size[kMaxDims] = {};
  std::int64_t in_stride[kMaxDims] = {};
  std::int64_t begin[kMaxDims] = {};
};

// Where coordinate i, outside [0, size), reads in the edge, wrap and reflect modes.
template <typename Index>
__device__ __forceinline__ Index outside_coordinate(Index i, Index size, PadMode mode) {
  switch (mode) {
    case PadMode::kEdge: return i < 0 ? 0 : size - 1;
    case PadMode::kWrap: {
      const Index r = i % size;
      return r < 0 ? r + size : r;
    }
    case PadMode::kReflect: {
      // Reflection without repeating the edge: period 2 * (size - 1). The caller checks size > 1 where a pad
      // reaches here; a lone element (a shifted, unpadded dimension) reflects onto itself rather than dividing by 0.
      if (size == 1) return 0;
      const Index period = 2 * (size - 1);
      Index r = i % period;
      if (r < 0) r += period;
      return r < size ? r : period - r;
    }
    default: return -1;
  }
}

// Out of line for the row kernel, whose unrolled chunks would otherwise hold a copy per element (Note [Pad rows]).
__device__ __noinline__ std::int32_t outside_coordinate_call(std::int32_t i, std::int32_t size, PadMode mode) {
  return outside_coordinate(i, size, mode);
}

// The input coordinate that output coordinate `o` reads along one dimension, or -1 for the constant.
template <typename Index>
__device__ __forceinline__ Index source_coordinate(Index o, Index begin, Index size, PadMode mode) {
  const Index i = o - begin;
  if (i >= 0 && i < size) return i;
  if (mode == PadMode::kConstant) return -1;
  if constexpr (std::is_same_v<Index, std::int32_t>) {
    return outside_coordinate_call(i, size, mode);
  } else {
    return outside_coordinate(i, size, mode);
  }
}

template <typename E>
__global__ void pad_kernel(const E* x, E* y, std::int64_t n, PadGeometry g, PadMode mode, E value) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::int64_t rest = i, offset = 0;
    bool inside = true;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == g.rank) break;
      const std::int64_t q = rest / g.out_size[d];
      const std::int64_t o = rest - q * g.out_size[d];
      rest = q;
      const std::int64_t source = source_coordinate(o, g.begin[d], g.in_size[d], mode);
      inside = inside && source >= 0;
      offset += source * g.in_stride[d];
    }
    y[i] = inside ? x[offset] : value;
  }
}

// Note [Pad rows]
// The general kernel spends most of its time on one 64-bit division per dimension and element. When every offset
// fits in int32 (the usual case), pad_rows_kernel runs instead:
// - The host first simplifies the geometry without changing which element any output reads: it drops the
//   unpadded dimensions of size 1 and merges neighbouring unpadded dimensions (begin 0, same size in and out), whose
//   coordinates map to themselves. x[64, 256, 64, 64] padded along H and W becomes [16384, 64, 64] to [16384, 66, 66].
//   Geometries left with more than kMaxPadOuter dimensions above the innermost take the general kernel (the row
//   kernel's per-dimension code is unrolled, and its size costs instruction fetches).
// - The output is then rows of the innermost (simplified) dimension, written in chunks of kVec consecutive elements
//   (16 bytes, one vector store) that may span two rows: kVec is 1 when y is not 16-byte aligned or the rows are
//   shorter than 16 bytes. A chunk finds its row with one fast division by the row width (Note [Fast division] in
//   cuda_raw_common.cuh) and that row's input offset with one per outer dimension (-1: the row lies in the
//   constant padding).
// - A thread handles kPadChunksPerThread chunks a step, blockDim.x chunks apart (coalesced). A chunk whose elements
//   all read the interior of one input row (the bulk of a pad's output: about 7 of the 8.25 chunks of each
//   66-wide row above) is a contiguous run of x: the thread loads the one or two 16-byte words that hold it
//   (aligned in memory, whatever x's own alignment: in_phase), for every such chunk before the first store, and
//   shifts each run into place in registers (shift_window). A run whose words would reach outside x gathers.
// - The other chunks (those that cross a row end or touch the padding) then gather element by element, one chunk
//   at a time, which keeps one copy of that code (their inputs are mostly in L1: the neighbouring chunks' words
//   brought them): only the column's source coordinate is computed along the row, in 32-bit arithmetic, and the
//   edge, wrap and reflect mappings of out-of-range coordinates are out of line (outside_coordinate_call). At
//   kVec 1 every chunk gathers, all loads of a step before its stores. Thread 0 of block 0 writes the last
//   n % kVec elements.
// Both paths and the general kernel read the same element for every output (source_coordinate), so they give the
// same bytes.
// Constant pads without crops, whose rows are at least 16 bytes wide into a 16-byte aligned y, take
// pad_constant_staged_kernel instead (Note [Constant pad staging]): edge, reflect and wrap pads and crops stay here.
constexpr int kPadChunksPerThread = 4;
constexpr int kMaxPadOuter = 4;  // outer dimensions of a simplified geometry; more take the general kernel

struct PadRows {
  FastDivider width;          // output size of the innermost dimension
  std::int32_t in_width = 0;  // its input size
  std::int32_t begin = 0;     // its leading pad
  std::int32_t in_numel = 0;  // elements of x
  std::int32_t in_phase = 0;  // elements of x's 16-byte word before x (x's address % 16 / its element size)
  int outer = 0;              // the dimensions above it, innermost first:
  FastDivider out_size[kMaxPadOuter];
  std::int32_t in_size[kMaxPadOuter] = {};
  std::int32_t in_stride[kMaxPadOuter] = {};
  std::int32_t outer_begin[kMaxPadOuter] = {};
};

// The input offset of the first element of output row `row`, or -1 when the row lies in the constant padding.
__device__ __forceinline__ std::int32_t pad_row_offset(const PadRows& g, std::int32_t row, PadMode mode) {
  std::int32_t offset = 0;
  bool inside = true;
#pragma unroll
  for (int d = 0; d < kMaxPadOuter; ++d) {
    if (d == g.outer) break;
    std::int32_t o = row;  // the outermost dimension takes the rest
    if (d + 1 < g.outer) {
      row = g.out_size[d].div(o);
      o -= row * g.out_size[d].value();
    }
    const std::int32_t source = source_coordinate(o, g.outer_begin[d], g.in_size[d], mode);
    inside = inside && source >= 0;
    offset += source * g.in_stride[d];
  }
  return inside ? offset : -1;
}

// Output elements [first, first + kVec) (only the first `count` when !kFull), the first at `column` of output row
// `row` whose input offset is `row_offset`, element by element into `out`; they span at most two rows.
template <bool kFull, typename E, int kVec>
__device__ __forceinline__ void gather_chunk(const E* x, const PadRows& g, PadMode mode, E value, std::int32_t row,
                                             std::int32_t column, std::int32_t row_offset, int count,
                                             Vec<E, kVec>& out) {
  const std::int32_t width = g.width.value();
  // The next row exists whenever an element of the chunk lies in it (the element is < n).
  const std::int32_t next_offset = column + (kFull ? kVec : count) > width ? pad_row_offset(g, row + 1, mode) : -1;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (kFull || k < count) {
      const bool next = column + k >= width;
      const std::int32_t offset = next ? next_offset : row_offset;
      const std::int32_t source = source_coordinate(next ? column + k - width : column + k, g.begin, g.in_width, mode);
      out.v[k] = offset >= 0 && source >= 0 ? x[offset + source] : value;
    }
  }
}

// The 16 bytes at byte `shift` (0 to 15) of the 32 bytes lo, hi (little-endian, as in memory): a word select in two
// steps of 8 and 4 bytes, then a funnel shift for the rest, all on registers.
__device__ __forceinline__ uint4 shift_window(uint4 lo, uint4 hi, int shift) {
  const std::uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  std::uint32_t u[6];
#pragma unroll
  for (int i = 0; i < 6; ++i) u[i] = (shift & 8) != 0 ? w[i + 2] : w[i];
  std::uint32_t v[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) v[i] = (shift & 4) != 0 ? u[i + 1] : u[i];
  const auto bits = static_cast<std::uint32_t>(shift & 3) * 8;
  return {__funnelshift_r(v[0], v[1], bits), __funnelshift_r(v[1], v[2], bits), __funnelshift_r(v[2], v[3], bits),
          __funnelshift_r(v[3], v[4], bits)};
}

// Where a chunk starts: its output row, its column in that row and the row's input offset (pad_row_offset).
struct ChunkStart {
  std::int32_t row, column, offset;
};

__device__ __forceinline__ ChunkStart chunk_start(const PadRows& g, std::int32_t first, PadMode mode) {
  const std::int32_t row = g.width.div(first);
  return {row, first - row * g.width.value(), pad_row_offset(g, row, mode)};
}

template <typename E, int kVec>
__global__ void __launch_bounds__(kThreads) pad_rows_kernel(const E* x, E* y, std::int32_t n, PadRows g,
                                                            PadMode mode, E value) {
  using V = Vec<E, kVec>;
  constexpr bool kWindows = kVec * sizeof(E) == 16;  // runs of kVec elements are 16-byte words
  const std::int32_t width = g.width.value();
  const std::int32_t chunks = n / kVec;  // whole ones; the tail below
  const auto block_chunks = static_cast<std::int32_t>(blockDim.x) * kPadChunksPerThread;
  const auto step = static_cast<std::int32_t>(gridDim.x) * block_chunks;
  for (auto chunk = static_cast<std::int32_t>(blockIdx.x * block_chunks + threadIdx.x); chunk < chunks;
       chunk += step) {
    if constexpr (kWindows) {
      uint4 lo[kPadChunksPerThread], hi[kPadChunksPerThread];
      int shift[kPadChunksPerThread];  // >= 0: the chunk's run starts at this byte of lo
      unsigned gathered = 0;           // bit u: chunk u gathers
#pragma unroll
      for (int u = 0; u < kPadChunksPerThread; ++u) {  // every load before the first store
        const std::int32_t c = chunk + u * static_cast<std::int32_t>(blockDim.x);
        shift[u] = -1;
        if (c >= chunks) continue;
        const ChunkStart at = chunk_start(g, c * kVec, mode);
        const std::int32_t in_column = at.column - g.begin;
        if (at.offset >= 0 && at.column + kVec <= width && in_column >= 0 && in_column + kVec <= g.in_width) {
          const std::int32_t start = g.in_phase + at.offset + in_column;  // counted from x's first word
          const std::int32_t word = (start & ~(kVec - 1)) - g.in_phase;   // the run's first word, from x
          const std::int32_t skip = start & (kVec - 1);                   // elements of it before the run
          if (word >= 0 && word <= g.in_numel - (skip == 0 ? kVec : 2 * kVec)) {  // the words lie within x
            const auto* words = reinterpret_cast<const uint4*>(x + word);
            lo[u] = words[0];
            hi[u] = skip == 0 ? lo[u] : words[1];
            shift[u] = skip * static_cast<int>(sizeof(E));
            continue;
          }
        }
        gathered |= 1u << u;
      }
#pragma unroll
      for (int u = 0; u < kPadChunksPerThread; ++u) {
        const std::int32_t c = chunk + u * static_cast<std::int32_t>(blockDim.x);
        if (shift[u] >= 0) *reinterpret_cast<uint4*>(y + c * kVec) = shift_window(lo[u], hi[u], shift[u]);
      }
      // The other chunks one at a time (Note [Pad rows]).
#pragma unroll 1
      for (int u = 0; gathered != 0; ++u, gathered >>= 1) {
        if ((gathered & 1) == 0) continue;
        const std::int32_t c = chunk + u * static_cast<std::int32_t>(blockDim.x);
        const ChunkStart at = chunk_start(g, c * kVec, mode);
        V out;
        gather_chunk<true>(x, g, mode, value, at.row, at.column, at.offset, kVec, out);
        *reinterpret_cast<V*>(y + c * kVec) = out;
      }
    } else {
      V out[kPadChunksPerThread];
#pragma unroll
      for (int u = 0; u < kPadChunksPerThread; ++u) {  // every load before the first store
        const std::int32_t c = chunk + u * static_cast<std::int32_t>(blockDim.x);
        if (c >= chunks) continue;
        const ChunkStart at = chunk_start(g, c * kVec, mode);
        gather_chunk<true>(x, g, mode, value, at.row, at.column, at.offset, kVec, out[u]);
      }
#pragma unroll
      for (int u = 0; u < kPadChunksPerThread; ++u) {
        const std::int32_t c = chunk + u * static_cast<std::int32_t>(blockDim.x);
        if (c < chunks) *reinterpret_cast<V*>(y + c * kVec) = out[u];
      }
    }
  }
  const std::int32_t tail = chunks * kVec;
  if (tail < n && blockIdx.x == 0 && threadIdx.x == 0) {
    const ChunkStart at = chunk_start(g, tail, mode);
    V out;
    gather_chunk<false>(x, g, mode, value, at.row, at.column, at.offset, n - tail, out);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (k < n - tail) y[tail + k] = out.v[k];
    }
  }
}

// Note [Constant pad staging]
// A constant pad whose pads are all >= 0 (nothing cropped) reads every element of x exactly once, in order: the
// output's interior elements, in output order, are x[0], x[1], ... So the number of interior elements before output
// element e (pad_position's `before`) is also the index in x of the first interior element at or after e, and a
// block's tile of output [e0, e1) reads exactly x[before(e0), before(e1)): one contiguous span, whatever the pads.
// pad_constant_staged_kernel, used for such pads of rows at least 16 bytes wide into a 16-byte aligned y:
// - A block owns one tile of kThreads * kStagedChunks chunks of 16 bytes of output. Its threads copy the tile's span
//   of x into shared memory as aligned 16-byte words with asynchronous copies (cp.async: no registers held while
//   they fly; only words that reach past either end of x go element by element). While the copies fly, they tabulate
//   in shared memory where each row the tile touches starts (its `before` and whether it lies inside along every
//   outer dimension) and the lane masks of every run of lanes [a, b) of a 16-byte chunk.
// - A chunk then needs one fast division (its row and column) and two table reads. Its interior lanes are at most two
//   runs, the end of its row's interior and the start of the next row's (rows are >= 16 bytes), and each run is
//   consecutive staged elements: the chunk reads two 16-byte windows of the staged span shifted into place in
//   registers (shift_window), and takes each lane from the first window, the second or the constant by the two runs'
//   lane masks. Every chunk runs the same instructions: no thread diverges on the pattern of pads.
// On an H200 this moved a 1-pixel pad of x[256, 256, 64, 64] (float16, rows of 132 bytes) from 37% of the copy
// bandwidth (the row kernel, whose chunks at row ends gathered element by element) to 85%; the asynchronous copies
// alone took it from 56% to 85% (loads in registers held occupancy at 3 blocks per SM, and a block waited for them
// before it computed anything). Every output element gets the element source_coordinate picks, so the bytes equal
// the other kernels'.
constexpr int kStagedChunks = 4;     // 16-byte chunks of output a thread writes
constexpr int kStagedMinBlocks = 6;  // resident blocks per SM the register budget must allow

// Where output element `e` lies (row, column, whether its row is inside along every outer dimension) and how many
// interior elements precede it (Note [Constant pad staging]); for a constant pad without cropping.
struct PadPosition {
  std::int32_t row, column, before;
  bool row_inside;
};

__device__ __forceinline__ PadPosition pad_position(const PadRows& g, std::int32_t e) {
  PadPosition p;
  p.row = g.width.div(e);
  p.column = e - p.row * g.width.value();
  std::int32_t o[kMaxPadOuter];  // the row's outer coordinates, innermost first
  std::int32_t rest = p.row;
#pragma unroll
  for (int d = 0; d < kMaxPadOuter; ++d) {
    if (d == g.outer) break;
    o[d] = rest;  // the outermost dimension takes the rest
    if (d + 1 < g.outer) {
      rest = g.out_size[d].div(o[d]);
      o[d] -= rest * g.out_size[d].value();
    }
  }
  // From the outermost dimension in: whole input slices before the coordinate, then, while inside, the next one.
  p.before = 0;
  p.row_inside = true;
#pragma unroll
  for (int d = kMaxPadOuter - 1; d >= 0; --d) {
    if (d >= g.outer || !p.row_inside) continue;
    const std::int32_t i = o[d] - g.outer_begin[d];
    p.before += min(max(i, 0), g.in_size[d]) * g.in_stride[d];
    p.row_inside = i >= 0 && i < g.in_size[d];
  }
  if (p.row_inside) p.before += min(max(p.column - g.begin, 0), g.in_width);
  return p;
}

// A row of the output (Note [Constant pad staging]).
struct RowStart {
  std::int32_t before;  // interior elements before the row's first element
  std::int32_t inside;  // the row lies inside along every outer dimension
};

// The kVec staged elements from element `start` (>= 0) on, as one vector: the two words that hold them, shifted into
// place.
template <typename E>
__device__ __forceinline__ uint4 staged_window(const Vec<E, kVec16<E>>* words, std::int32_t start) {
  constexpr int kVec = kVec16<E>;
  const std::int32_t w0 = start / kVec;  // start >= 0
  return shift_window(*reinterpret_cast<const uint4*>(&words[w0]), *reinterpret_cast<const uint4*>(&words[w0 + 1]),
                      (start - w0 * kVec) * static_cast<int>(sizeof(E)));
}

template <typename E>
__global__ void __launch_bounds__(kThreads, kStagedMinBlocks)
    pad_constant_staged_kernel(const E* x, E* y, std::int32_t n, PadRows g, E value) {
  constexpr int kVec = kVec16<E>;
  constexpr int kTile = kThreads * kStagedChunks * kVec;  // output elements of a block
  // The span (at most kTile elements), its partial words at both ends, a word of slack before it and two after it
  // (windows of unused lanes reach there).
  constexpr int kWords = kThreads * kStagedChunks + 5;
  constexpr int kTileRows = kTile / kVec + 2;  // rows a tile touches (width >= kVec), and the next
  constexpr int kMasks = (kVec + 1) * (kVec + 1);
  using V = Vec<E, kVec>;
  __shared__ V staged[kWords];
  __shared__ RowStart row_start[kTileRows];
  __shared__ uint4 lane_mask[kMasks];  // [a * (kVec + 1) + b]: lanes a .. b - 1 set
  const auto e0 = static_cast<std::int32_t>(blockIdx.x) * kTile;
  const std::int32_t e1 = min(e0 + kTile, n);
  const std::int32_t i0 = pad_position(g, e0).before;
  const std::int32_t i1 = e1 == n ? g.in_numel : pad_position(g, e1).before;
  const std::int32_t first_word = (g.in_phase + i0) / kVec;
  const std::int32_t words = (g.in_phase + i1 + kVec - 1) / kVec - first_word;
  const std::int32_t skew = first_word * kVec - g.in_phase - kVec;  // the element of x at staged element 0
  // The span into shared memory, asynchronously (no registers held while the loads fly).
  for (auto w = static_cast<std::int32_t>(threadIdx.x); w < words; w += kThreads) {
    const std::int32_t start = skew + (w + 1) * kVec;
    if (start >= 0 && start <= g.in_numel - kVec) {
      __pipeline_memcpy_async(&staged[w + 1], x + start, sizeof(V));
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        staged[w + 1].v[k] = start + k >= 0 && start + k < g.in_numel ? x[start + k] : value;
      }
    }
  }
  __pipeline_commit();
  const std::int32_t width = g.width.value();
  const std::int32_t row0 = g.width.div(e0);
  const std::int32_t rows = g.width.div(e1 - 1) + 2 - row0;
  for (auto r = static_cast<std::int32_t>(threadIdx.x); r < rows; r += kThreads) {
    const std::int64_t at = static_cast<std::int64_t>(row0 + r) * width;
    if (at >= n) {
      row_start[r] = {g.in_numel, 0};
    } else {
      const PadPosition p = pad_position(g, static_cast<std::int32_t>(at));
      row_start[r] = {p.before, p.row_inside ? 1 : 0};
    }
  }
  for (auto m = static_cast<std::int32_t>(threadIdx.x); m < kMasks; m += kThreads) {
    V mask;
#pragma unroll
    for (int k = 0; k < kVec; ++k) mask.v[k] = k >= m / (kVec + 1) && k < m % (kVec + 1) ? static_cast<E>(~E{0}) : E{0};
    lane_mask[m] = *reinterpret_cast<const uint4*>(&mask);
  }
  __pipeline_wait_prior(0);
  __syncthreads();
  V fill;
#pragma unroll
  for (int k = 0; k < kVec; ++k) fill.v[k] = value;
  const uint4 value_words = *reinterpret_cast<const uint4*>(&fill);
#pragma unroll
  for (int u = 0; u < kStagedChunks; ++u) {
    const std::int32_t first = e0 + (u * kThreads + static_cast<std::int32_t>(threadIdx.x)) * kVec;
    if (first >= e1) break;
    const std::int32_t row = g.width.div(first);
    const std::int32_t column = first - row * width;
    const RowStart here = row_start[row - row0];
    const RowStart below = row_start[row - row0 + 1];
    // Interior lanes: [a1, b1) in this row, [a2, b2) in the next (width >= kVec: no further).
    const std::int32_t in_column = column - g.begin;
    std::int32_t a1 = 0, b1 = 0;
    if (here.inside != 0) {
      a1 = min(max(-in_column, 0), kVec);
      b1 = max(min(g.in_width - in_column, kVec), a1);
    }
    const std::int32_t k2 = width - column;  // the next row's first lane (>= kVec: none)
    std::int32_t a2 = kVec, b2 = kVec;
    if (below.inside != 0 && k2 < kVec) {
      a2 = min(k2 + g.begin, kVec);
      b2 = max(min(k2 + g.begin + g.in_width, kVec), a2);
    }
    // Staged index of lane a1's element (when a1 < b1), then of lane a2's.
    const std::int32_t s1 = here.before + (here.inside != 0 ? min(max(in_column, 0), g.in_width) : 0) - skew;
    const uint4 va = staged_window<E>(staged, s1 - a1);
    const uint4 vb = staged_window<E>(staged, s1 + (b1 - a1) - a2);
    const uint4 ma = lane_mask[a1 * (kVec + 1) + b1];
    const uint4 mb = lane_mask[a2 * (kVec + 1) + b2];
    uint4 o;
    o.x = (va.x & ma.x) | (vb.x & mb.x) | (value_words.x & ~(ma.x | mb.x));
    o.y = (va.y & ma.y) | (vb.y & mb.y) | (value_words.y & ~(ma.y | mb.y));
    o.z = (va.z & ma.z) | (vb.z & mb.z) | (value_words.z & ~(ma.z | mb.z));
    o.w = (va.w & ma.w) | (vb.w & mb.w) | (value_words.w & ~(ma.w | mb.w));
    const V out = *reinterpret_cast<const V*>(&o);
    if (first + kVec <= n) {
      *reinterpret_cast<V*>(y + first) = out;
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (first + k < n) y[first + k] = out.v[k];
      }
    }
  }
}

// Fills `rows` (Note [Pad rows]) and returns true when the int32 kernel covers the pad; false leaves it to the
// general kernel. Shapes innermost first, as in PadGeometry.
bool make_pad_rows(const PadGeometry& g, std::int64_t n, std::int64_t in_numel, PadRows* rows) {
  constexpr std::int64_t kInt32 = std::numeric_limits<std::int32_t>::max();
  // Headroom for the grid-stride steps (at most kMaxBlocks * kThreads * kPadChunksPerThread chunks); sizes and pads
  // below 2^30 keep o - begin and the reflect period 2 * (size - 1) in int32.
  constexpr std::int64_t kDimLimit = std::int64_t{1} << 30;
  if (g.rank == 0 || in_numel == 0 || n > kInt32 - 2 * kMaxBlocks * kThreads * kPadChunksPerThread ||
      in_numel > kInt32 - 64) {
    return false;
  }
  struct Dim {
    std::int64_t out, in, begin, stride;
  };
  std::vector<Dim> dims;
  for (int d = 0; d < g.rank; ++d) {
    const bool unpadded = g.begin[d] == 0 && g.in_size[d] == g.out_size[d];
    if (unpadded && g.in_size[d] == 1) continue;
    if (unpadded && !dims.empty() && dims.back().begin == 0 && dims.back().in == dims.back().out) {
      // Contiguous: the dropped dimensions between the two have size 1.
      dims.back().out *= g.out_size[d];
      dims.back().in *= g.in_size[d];
      continue;
    }
    dims.push_back({g.out_size[d], g.in_size[d], g.begin[d], g.in_stride[d]});
  }
  if (dims.empty()) dims.push_back({1, 1, 0, 1});
  if (dims.size() > static_cast<std::size_t>(kMaxPadOuter) + 1) return false;
  for (const Dim& d : dims) {
    if (d.out >= kDimLimit || d.in >= kDimLimit || d.begin >= kDimLimit || d.begin <= -kDimLimit) return false;
  }
  rows->width = FastDivider(dims[0].out);
  rows->in_width = static_cast<std::int32_t>(dims[0].in);
  rows->begin = static_cast<std::int32_t>(dims[0].begin);
  rows->in_numel = static_cast<std::int32_t>(in_numel);
  rows->outer = static_cast<int>(dims.size()) - 1;
  for (int d = 0; d < rows->outer; ++d) {
    const Dim& dim = dims[static_cast<std::size_t>(d) + 1];
    rows->out_size[d] = FastDivider(dim.out);
    rows->in_size[d] = static_cast<std::int32_t>(dim.in);
    rows->in_stride[d] = static_cast<std::int32_t>(dim.stride);
    rows->outer_begin[d] = static_cast<std::int32_t>(dim.begin);
  }
  return true;
}

template <typename E, int kVec>
void launch_pad_rows(const void* x, void* y, std::int64_t n, const PadRows& rows, PadMode mode, E value,
                     cudaStream_t stream) {
  pad_rows_kernel<E, kVec><<<grid_for(n / kVec, kThreads * kPadChunksPerThread), kThreads, 0, stream>>>(
      static_cast<const E*>(x), static_cast<E*>(y), static_cast<std::int32_t>(n), rows, mode, value);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace

void pad(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& in_shape,
         const std::vector<std::int64_t>& out_shape, const std::vector<std::int64_t>& begins, PadMode mode,
         std::uint64_t value_bits, void* stream) {
  XPURT_CHECK(in_shape.size() == out_shape.size() && begins.size() == in_shape.size() &&
                  in_shape.size() <= static_cast<std::size_t>(kMaxDims),
              "cuda_raw::pad: input rank ", in_shape.size(), ", output rank ", out_shape.size(), " and ",
              begins.size(), " leading pads must agree and be <= ", kMaxDims);
  std::int64_t n = 1, in_numel = 1;
  for (std::size_t d = 0; d < out_shape.size(); ++d) {
    n *= out_shape[d];
    in_numel *= in_shape[d];
  }
  if (n == 0) return;
  XPURT_CHECK(in_numel > 0 || mode == PadMode::kConstant, "cuda_raw::pad: an empty input can only be padded with a "
              "constant");
  PadGeometry g;
  g.rank = static_cast<int>(in_shape.size());
  std::int64_t stride = 1;
  for (int d = 0; d < g.rank; ++d) {
    const std::size_t from = in_shape.size() - 1 - static_cast<std::size_t>(d);
    XPURT_CHECK(mode != PadMode::kReflect || in_shape[from] > 1 || out_shape[from] == in_shape[from],
                "cuda_raw::pad: reflect mode needs more than one element along padded dimension ", from);
    g.out_size[d] = out_shape[from];
    g.in_size[d] = in_shape[from];
    g.in_stride[d] = stride;
    g.begin[d] = begins[from];
    stride *= in_shape[from];
  }
  const cudaStream_t s = as_stream(stream);
  PadRows rows;
  const bool fast = make_pad_rows(g, n, in_numel, &rows);
  bool staged = mode == PadMode::kConstant;  // and nothing cropped (Note [Constant pad staging])
  for (int d = 0; d < g.rank; ++d) staged = staged && g.begin[d] >= 0 && g.out_size[d] >= g.begin[d] + g.in_size[d];
  dispatch_element_size(element_size, "pad", [&](auto tag) {
    using E = decltype(tag);
    const E value = element_of<E>(value_bits);
    if (!fast) {
      pad_kernel<E><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const E*>(x), static_cast<E*>(y), n, g,
                                                               mode, value);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    } else if (is_aligned(y, 16) && rows.width.divisor >= static_cast<std::uint32_t>(kVec16<E>)) {
      rows.in_phase = static_cast<std::int32_t>(reinterpret_cast<std::uintptr_t>(x) % 16 / sizeof(E));
      if (staged) {  // Note [Constant pad staging]
        constexpr std::int64_t kTile = std::int64_t{kThreads} * kStagedChunks * kVec16<E>;
        pad_constant_staged_kernel<E><<<static_cast<unsigned>((n + kTile - 1) / kTile), kThreads, 0, s>>>(
            static_cast<const E*>(x), static_cast<E*>(y), static_cast<std::int32_t>(n), rows, value);
        XPURT_CUDA_RAW_LAUNCH_CHECK();
        return;
      }
      launch_pad_rows<E, kVec16<E>>(x, y, n, rows, mode, value, s);  // a chunk spans at most two rows
    } else {
      launch_pad_rows<E, 1>(x, y, n, rows, mode, value, s);
    }
  });
}

}  // namespace xpuruntime::cuda_raw
