// ONNX CumSum along the middle axis of [outer, axis_size, inner] (deterministic, no atomics).
//
// Note [Split scans]
// CumSum had one thread per (outer, inner) line walk the axis in order: a cumulative sum of a long vector (one line)
// ran on one thread of the GPU. When the lines are fewer than kScanTargetThreads, the axis is split into chunks
// (cum_sum_geometry: at least kScanMinChunk elements) and the scan runs in three passes, each in a fixed order:
//  1. a thread per (line, chunk) sums its chunk in order into the workspace (neighbouring threads take neighbouring
//     lines when inner > 1, neighbouring chunks otherwise);
//  2. a block per line turns its chunk sums into exclusive offsets in scan order (reverse: from the last chunk): each
//     thread sums a run of chunks in order, thread 0 scans the runs' sums, each thread writes its run's offsets;
//  3. a thread per (line, chunk) scans its chunk again from its offset, writing the outputs.
// Lines that are few and short (a [1, 128] position cumsum) split no further, and one thread walking the axis waits on
// one load after another (8.9 us for 128 int64s): they take a block per line instead (`block`), which scans tiles of
// kBlockScanThreads elements with warp shuffles and carries each tile's total into the next, no workspace needed.
// The chunks follow from the shape and the workspace limit alone, so the bits are the same every run. Integers wrap
// and give the one-thread result exactly; floats (fp32 accumulation, double for float64) add in a different
// association than one walk along the axis, so their rounding differs from the cpu kernel's by a few units.
#include <algorithm>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// The accumulator of each storage type: fp32 for 16-bit floats (Note [fp32 compute]), unsigned for integers (so
// that overflow wraps instead of being undefined).
template <typename T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<__half> {
  using type = float;
};
template <>
struct Accumulator<__nv_bfloat16> {
  using type = float;
};
template <>
struct Accumulator<std::int32_t> {
  using type = std::uint32_t;
};
template <>
struct Accumulator<std::int64_t> {
  using type = std::uint64_t;
};

template <typename T>
__device__ __forceinline__ typename Accumulator<T>::type load_acc(T v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return to_float(v);
  } else {
    return static_cast<typename Accumulator<T>::type>(v);
  }
}

template <typename T>
__device__ __forceinline__ T store_acc(typename Accumulator<T>::type v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return from_float<T>(v);
  } else {
    return static_cast<T>(v);
  }
}

// Split heuristics (Note [Split scans]): threads that fill an H100/H200 several times over; chunks long enough that
// the second pass is small, short enough that a contiguous chunk's thread stays in the cache lines it loaded.
constexpr std::int64_t kScanTargetThreads = 65536;
constexpr std::int64_t kScanMinChunk = 128;
constexpr int kScanOffsetThreads = 256;  // threads of a block of the second pass
constexpr std::uint64_t kScanPartialBytes = 8;
constexpr int kBlockScanThreads = 256;        // threads of a block that scans one line
constexpr std::int64_t kBlockScanMinAxis = 32;  // shorter axes: the walk of a thread is as quick
constexpr unsigned kFullMask = 0xffffffffu;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The offset of a line's first element along the axis: line = o * inner + i.
__device__ __forceinline__ std::int64_t line_base(std::int64_t line, const ScanGeometry& g) {
  const std::int64_t o = line / g.inner;
  return o * g.axis_size * g.inner + (line - o * g.inner);
}

// Passes 1 (kWrite false: the chunk's sum into sums[line * splits + split]) and 3 (kWrite: the outputs, from the
// chunk's offset in sums, or 0 with one split); a thread per (line, split) task. Split `split` covers scan positions
// [split * chunk, ...), position k being element axis_size - 1 - k when `reverse`.
template <typename T, bool kWrite>
__global__ void cum_sum_kernel(const T* x, T* y, typename Accumulator<T>::type* sums, ScanGeometry g, bool exclusive,
                               bool reverse) {
  using Acc = typename Accumulator<T>::type;
  const std::int64_t tasks = g.lines * g.splits;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < tasks; t += stride) {
    // inner > 1: lines fastest (coalesced across threads); inner == 1: splits fastest (neighbouring chunks).
    std::int64_t line, split;
    if (g.inner > 1) {
      split = t / g.lines;
      line = t - split * g.lines;
    } else {
      line = t / g.splits;
      split = t - line * g.splits;
    }
    const std::int64_t base = line_base(line, g);
    const std::int64_t begin = split * g.chunk;
    const std::int64_t end = g.axis_size - begin > g.chunk ? begin + g.chunk : g.axis_size;
    Acc sum = kWrite && g.splits > 1 ? sums[line * g.splits + split] : Acc(0);
    for (std::int64_t k = begin; k < end; ++k) {
      const std::int64_t at = base + (reverse ? g.axis_size - 1 - k : k) * g.inner;
      const Acc v = load_acc(x[at]);
      if (kWrite && exclusive) y[at] = store_acc<T>(sum);
      sum += v;
      if (kWrite && !exclusive) y[at] = store_acc<T>(sum);
    }
    if (!kWrite) sums[line * g.splits + split] = sum;
  }
}

// Pass 2: a block per line turns the line's `splits` chunk sums (in scan order) into exclusive offsets, in place.
template <typename Acc>
__global__ void __launch_bounds__(kScanOffsetThreads) cum_sum_offsets_kernel(Acc* sums, std::int64_t lines,
                                                                             std::int64_t splits) {
  __shared__ Acc runs[kScanOffsetThreads];
  const std::int64_t run = (splits + kScanOffsetThreads - 1) / kScanOffsetThreads;  // chunks a thread takes
  for (std::int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    Acc* p = sums + line * splits;
    const std::int64_t begin = static_cast<std::int64_t>(threadIdx.x) * run;
    const std::int64_t end = splits - begin > run ? begin + run : splits;
    Acc total = Acc(0);
    for (std::int64_t s = begin; s < end; ++s) total += p[s];
    runs[threadIdx.x] = total;
    __syncthreads();
    if (threadIdx.x == 0) {
      Acc offset = Acc(0);
      for (int r = 0; r < kScanOffsetThreads; ++r) {
        const Acc v = runs[r];
        runs[r] = offset;
        offset += v;
      }
    }
    __syncthreads();
    Acc offset = runs[threadIdx.x];
    for (std::int64_t s = begin; s < end; ++s) {
      const Acc v = p[s];
      p[s] = offset;
      offset += v;
    }
    __syncthreads();
  }
}

// A block per line (Note [Split scans], `block`): each tile of kBlockScanThreads scan positions is scanned by warp
// shuffles, then across the tile's warps, then offset by the totals of the tiles before it. A fixed association, so
// the bits do not depend on the launch.
template <typename T>
__global__ void __launch_bounds__(kBlockScanThreads) cum_sum_block_kernel(const T* x, T* y, ScanGeometry g,
                                                                          bool exclusive, bool reverse) {
  using Acc = typename Accumulator<T>::type;
  constexpr int kWarps = kBlockScanThreads / 32;
  __shared__ Acc warp_sums[kWarps];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  for (std::int64_t line = blockIdx.x; line < g.lines; line += gridDim.x) {
    const std::int64_t base = line_base(line, g);
    Acc carry = Acc(0);
    for (std::int64_t tile = 0; tile < g.axis_size; tile += kBlockScanThreads) {
      const std::int64_t k = tile + threadIdx.x;
      const std::int64_t at = base + (reverse ? g.axis_size - 1 - k : k) * g.inner;
      const Acc v = k < g.axis_size ? load_acc(x[at]) : Acc(0);
      Acc inclusive = v;
      for (int d = 1; d < 32; d <<= 1) {
        const Acc n = __shfl_up_sync(kFullMask, inclusive, d);
        if (lane >= d) inclusive += n;
      }
      const Acc before = __shfl_up_sync(kFullMask, inclusive, 1);
      if (lane == 31) warp_sums[warp] = inclusive;
      __syncthreads();
      if (warp == 0) {
        Acc w = lane < kWarps ? warp_sums[lane] : Acc(0);
        for (int d = 1; d < kWarps; d <<= 1) {
          const Acc n = __shfl_up_sync(kFullMask, w, d);
          if (lane >= d) w += n;
        }
        if (lane < kWarps) warp_sums[lane] = w;
      }
      __syncthreads();
      const Acc offset = warp > 0 ? carry + warp_sums[warp - 1] : carry;
      if (k < g.axis_size) {
        y[at] = store_acc<T>(exclusive ? (lane > 0 ? offset + before : offset) : offset + inclusive);
      }
      carry += warp_sums[kWarps - 1];
      __syncthreads();  // warp_sums is read before the next tile writes it
    }
  }
}

}  // namespace

std::size_t ScanGeometry::workspace_bytes() const {
  return splits > 1 ? static_cast<std::size_t>(lines * splits) * kScanPartialBytes : 0;
}

std::string ScanGeometry::str() const {
  if (block) return ::xpuruntime::detail::str_cat(lines, " lines x ", axis_size, " elements, a block per line");
  return ::xpuruntime::detail::str_cat(lines, " lines x ", axis_size, " elements, ", splits,
                                       splits == 1 ? " split" : " splits");
}

ScanGeometry cum_sum_geometry(std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
                              std::uint64_t workspace_limit) {
  ScanGeometry g;
  g.lines = outer * inner;
  g.axis_size = axis_size;
  g.inner = inner;
  if (g.lines > 0 && g.lines < kScanTargetThreads && axis_size >= 2 * kScanMinChunk) {
    g.splits = std::min(ceil_div(axis_size, kScanMinChunk), ceil_div(kScanTargetThreads, g.lines));
  }
  if (workspace_limit > 0 && g.splits > 1) {  // as many sums as the limit holds; none below two
    const auto fit =
        static_cast<std::int64_t>(workspace_limit / (kScanPartialBytes * static_cast<std::uint64_t>(g.lines)));
    if (g.splits > fit) g.splits = fit < 2 ? 1 : fit;
  }
  g.chunk = ceil_div(std::max<std::int64_t>(axis_size, 1), g.splits);
  g.splits = std::max<std::int64_t>(1, ceil_div(axis_size, g.chunk));  // no empty chunk
  g.block = g.splits == 1 && g.lines > 0 && g.lines < kScanTargetThreads && axis_size >= kBlockScanMinAxis;
  return g;
}

void cum_sum(const void* x, void* y, DType dtype, const ScanGeometry& g, bool exclusive, bool reverse,
             void* workspace, void* stream) {
  if (g.lines == 0 || g.axis_size == 0) return;
  XPURT_CHECK(g.splits == 1 || workspace != nullptr, "cuda_raw::cum_sum: the plan needs ", g.workspace_bytes(),
              " bytes of workspace, but none was given");
  const cudaStream_t s = as_stream(stream);
  const unsigned grid = grid_for(g.lines * g.splits, kThreads);
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename Accumulator<T>::type;
    auto* sums = static_cast<Acc*>(workspace);
    const auto* xs = static_cast<const T*>(x);
    auto* ys = static_cast<T*>(y);
    if (g.block) {
      cum_sum_block_kernel<T><<<grid_for(g.lines, 1), kBlockScanThreads, 0, s>>>(xs, ys, g, exclusive, reverse);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
      return;
    }
    if (g.splits > 1) {
      cum_sum_kernel<T, false><<<grid, kThreads, 0, s>>>(xs, ys, sums, g, exclusive, reverse);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
      cum_sum_offsets_kernel<Acc><<<grid_for(g.lines, 1), kScanOffsetThreads, 0, s>>>(sums, g.lines, g.splits);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    }
    cum_sum_kernel<T, true><<<grid, kThreads, 0, s>>>(xs, ys, sums, g, exclusive, reverse);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  };
  switch (dtype) {
    case DType::kFloat32: return launch(float{});
    case DType::kFloat64: return launch(double{});
    case DType::kFloat16: return launch(__half{});
    case DType::kBFloat16: return launch(__nv_bfloat16{});
    case DType::kInt32: return launch(std::int32_t{});
    case DType::kInt64: return launch(std::int64_t{});
    default:
      throw UnsupportedOperationError(::xpuruntime::detail::str_cat(
          "cuda_raw cum_sum handles float32, float16, bfloat16, float64, int32 and int64, got ", dtype_name(dtype)));
  }
}

}  // namespace xpuruntime::cuda_raw
