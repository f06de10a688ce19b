// Reductions (sum, mean, max, min) over any set of axes.
//
// Note [Reduction layout]
// The input's dimensions are classified as kept or reduced; size-1 ones are dropped and neighbours of the
// same kind merged (ReduceGeometry). Each result then reads `count` elements at kept_offset(o) +
// reduced_offset(r). Three kernels cover every layout with coalesced reads:
//  - row: the innermost dimension is reduced, so one result's elements are contiguous at the inner end; a group
//    of threads reads them together and combines with a fixed-order tree. When they are one contiguous run (a
//    single reduced dimension, the innermost) the contiguous-row kernel reads it in 16-byte vectors (Note
//    [Contiguous row reductions]); otherwise a warp (short runs) or a block (long runs) computes offsets.
//  - column: the innermost dimension is kept, so neighbouring results read neighbouring elements; one thread
//    per result walks the reduced dimensions.
//  - middle: a column reduction over one dimension right outside the inner one (Note [Middle-axis reductions]).
// When there are too few results to fill the GPU (e.g. a full reduction of a long vector, or a column sum of a
// tall matrix), each result's range is split into `splits` chunks reduced independently into a float workspace,
// and a second kernel combines the partials in a fixed order (reduce_finalize_kernel). The split depends on the
// shape only, never on timing, so results are bitwise reproducible: no atomics anywhere.
//
// Note [Contiguous row reductions]
// Streaming a tensor at copy speed needs many bytes in flight per SM and no idle threads. The first row kernel
// gave each row of 4096 a block of 256 threads: two 16-byte loads a thread, then two barriers to combine, a new
// block per row (65% of copy bandwidth for [16384, 4096] float16 on an H200). The contiguous-row kernel gives
// each task (a row, or a chunk of one when split) a group of threads sized to its work and to the task count
// (contiguous_row_group):
//  - each thread issues kRowVectorsInFlight 16-byte loads (vectors lane, lane + group, ...) before combining
//    any (eight: with four, float16 sums of rows of 4096 stayed at 45 us), the last round's guarded, and keeps
//    one accumulator per element of a vector (independent chains);
//  - short runs take part of a warp (2 to 16 threads: rows of 64 halves no longer leave 24 lanes of 32 idle);
//    runs up to a few thousand elements a warp, combined by shuffles alone; a warp or fewer per task whenever
//    tasks * group reaches kRowFillThreads (enough loads in flight for an H100/H200);
//  - few long tasks widen the group to 64-256 threads (the whole block, combined through shared memory) until
//    the GPU is full or each thread has one round of loads.
// On an H200 (float16, one run each): [16384, 4096] over its rows 46.8 -> 33.7 us (the copy of as many bytes
// read and written takes 66 us), max 53.2 -> 35.1 us, [65536, 1000] 40.0 -> 33.2 us, [1048576, 64] 231 -> 45 us;
// a full reduction of 64M elements (1024 splits) 63.5 -> 37.6 us, most of it the second pass now a warp per output.
// Rows of 4096 float32 stay near read bandwidth but ran 4% slower (62.5 -> 65.3 us): a warp per row has four
// rounds of loads there, so the last wave of warps drags.
// Elements before the run's first 16-byte boundary and after its last one (any alignment, any length) are read
// with guarded scalar loads, all issued at once (combine_edge). The combination order depends on the run's length,
// alignment and group only, so a plan gives the same bits every run. The loop over tasks is uniform across the
// block (a group past the last task reduces nothing) so that every lane reaches the shuffles and barriers.
//
// Note [Middle-axis reductions]
// A channels-last mean over H and W (squeeze-excitation, global pooling, nhwc_layout's ReduceMean) reduces the middle
// axis of [N, H * W, C]: a column reduction whose results are the C neighbouring channels; so is a channel reduction
// of NCHW ([N, C, H * W] over C). One thread per result walking the rows two bytes at a time was latency-bound (36 us
// for EfficientNet's first squeeze at batch 1, 2.4 MB). The middle kernel gives a block up to kMiddleMaxVectors
// threads across the inner axis, each reading 8 results as 16-byte vectors, and 256 / that many rows of threads, each
// taking every so-many row of the block's range with kMiddleLoadsInFlight 16-byte loads in flight (a thread has few
// rows, and one load after another was latency-bound, 4.7 us a mean for EfficientNet's at batch 1); the rows'
// partial results combine in shared memory in row order, one thread per result. Splits of the row range fill the GPU
// as above. Rounds of loads end with guarded loads rather than a remainder loop one row at a time, and each thread
// steps its rows by a pointer stride: the NCHW channel mean of [64, 256, 64, 64] float16 went 42.4 -> 35.3 us on
// an H200 with four loads in flight (bfloat16 42.6 -> 35.1 us). Eight were no faster for float16 and slower for
// bfloat16, but eight is the configuration whose results were checked on the GPU, so eight it is until four is.
//
// Note [Block reductions]
// Integer reductions (int32/int64 sum, max, min, prod) and reduce_prod of floats run the block kernel: a block of 256
// threads strides over a task's elements and combines them in a fixed tree (integers in their unsigned type, so sums
// and products wrap; float products in fp32). It had one block per result, so a full reduction ran on one block of
// the GPU: `torch.isinf(x).any()` and `(x > 0).all()` export as Cast(bool -> int64) and ReduceMax/ReduceMin, which
// for a 40 MiB tensor took 1.08 ms on an H200 (37 GB/s). Like the float kernels, a result's range is now split when
// the results are fewer than kBlockTargetBlocks blocks (block_reduce_splits: chunks of at least kBlockMinChunk
// elements): one block per (result, split) writes its partial to the workspace (8 bytes a partial, the plan's
// workspace_bytes()), and block_finalize_kernel combines each result's partials with the same strided loop and tree
// (a full reduction of 10M elements: 2048 blocks of 5120, then one block over 2048 partials). The split follows from
// the shape and the workspace limit only, so the bits do not change from run to run; integer results do not depend
// on the order at all, float products round differently from the one-block order but the same way every run.
// A thread issues kBlockLoads loads before it combines any, and a contiguous range is read without an offset
// calculator (64-bit divisions per element): with chunks of 8192 and one load after another, T5's 12 `isinf(x).any()`
// guards (65,536 int64 elements each, in L2) took 12.8 us apiece on an H100, 36% of its run at batch 1, about 32
// dependent loads of L2 latency a thread (the 18:34 UTC suite run, 2026-12-06); chunks are now 2048 elements, one
// round of loads a thread.
//
// Semantics: sums and means accumulate in fp32; the mean of an empty axis is NaN (0/0) and its sum 0, like
// NumPy; max and min propagate NaN (NumPy's max/min, PyTorch's amax/amin).
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// Split heuristics (Note [Reduction layout]). About 1024 groups or 64Ki threads fill an H100/H200 (132 SMs)
// several times over; chunks stay long enough that the second pass is negligible.
constexpr std::int64_t kRowTargetGroups = 1024;
constexpr std::int64_t kRowMinChunk = 8192;
constexpr std::int64_t kColumnTargetThreads = 65536;
constexpr std::int64_t kColumnMinChunk = 256;
// Strided rows: chunks at least this long take a block of kRowBlockGroup threads; shorter ones a warp.
constexpr std::int64_t kRowBlockMinChunk = 4096;
constexpr int kRowBlockGroup = 256;
// Contiguous rows (Note [Contiguous row reductions]): 16-byte loads a thread issues before combining any, and the
// threads whose loads in flight keep an H100/H200 streaming (half of 132 SMs x 2048).
constexpr int kRowVectorsInFlight = 8;
constexpr std::int64_t kRowFillThreads = 131072;

// Block reductions (integers, reduce_prod; Note [Block reductions]): split while the tasks are fewer than
// kBlockTargetBlocks, into chunks of at least kBlockMinChunk elements (kBlockLoads a thread of a 256-thread block:
// one round of loads in flight).
constexpr std::int64_t kBlockTargetBlocks = 2048;
constexpr int kBlockLoads = 8;
constexpr std::int64_t kBlockMinChunk = 256 * kBlockLoads;
constexpr std::uint64_t kBlockPartialBytes = 8;  // the widest partial: the uint64 of an int64 reduction

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The splits of each result's range for the block kernel (Note [Block reductions]): one when the results fill the
// GPU or are short, and no more than `workspace_limit` (0: none) holds partials for.
std::int64_t block_reduce_splits(std::int64_t outputs, std::int64_t count, std::uint64_t workspace_limit,
                                 std::int64_t scale) {
  const std::int64_t min_chunk = kBlockMinChunk * scale;
  if (outputs <= 0 || outputs >= kBlockTargetBlocks || count < 2 * min_chunk) return 1;
  std::int64_t splits = std::min(ceil_div(count, min_chunk), ceil_div(kBlockTargetBlocks, outputs));
  if (workspace_limit > 0) {
    const auto fit =
        static_cast<std::int64_t>(workspace_limit / (kBlockPartialBytes * static_cast<std::uint64_t>(outputs)));
    if (splits > fit) splits = fit < 2 ? 1 : fit;
  }
  return splits;
}

template <ReduceOp kOp>
struct Reducer {
  __device__ __forceinline__ static float identity() {
    if constexpr (kOp == ReduceOp::kMax) {
      return -INFINITY;
    } else if constexpr (kOp == ReduceOp::kMin) {
      return INFINITY;
    } else {
      return 0.0f;
    }
  }
  __device__ __forceinline__ float operator()(float a, float b) const {
    if constexpr (kOp == ReduceOp::kMax) {
      return max_nan(a, b);
    } else if constexpr (kOp == ReduceOp::kMin) {
      return min_nan(a, b);
    } else {
      return a + b;
    }
  }
  // What an element adds: its square for reduce_sum_square (in float32, from the loaded value), else itself. The
  // partials of a split and the lanes' accumulators combine with operator(), unsquared.
  __device__ __forceinline__ static float element(float x) {
    if constexpr (kOp == ReduceOp::kSumSquare) {
      return x * x;
    } else {
      return x;
    }
  }
  __device__ __forceinline__ static float finalize(float value, std::int64_t count) {
    if constexpr (kOp == ReduceOp::kMean) {
      return value / static_cast<float>(count);  // count == 0: 0 / 0 = NaN, like NumPy
    } else {
      return value;
    }
  }
};

// Index: int32 when the input's elements (and so every offset, the input being contiguous) fit, else int64
// (Note [Launch shapes]).
template <typename Index>
struct ReduceArgs {
  OffsetCalculator<1, Index> kept;
  OffsetCalculator<1, Index> reduced;
  Index outputs;
  Index count;
  Index splits;
  Index chunk;
};

template <typename Index>
__device__ __forceinline__ Index offset_of(const OffsetCalculator<1, Index>& calc, Index i) {
  Index offset[1];
  calc.offsets(i, offset);
  return offset[0];
}

// Row kernel for reduced elements that are not one contiguous run: one group of kGroup threads (a warp, or the
// block) per (output, split) task, task = output * splits + split, each element's offset computed.
template <typename T, ReduceOp kOp, int kGroup, int kBlock, typename Index>
__global__ void __launch_bounds__(kBlock) reduce_row_kernel(const T* x, T* y, float* partial,
                                                            ReduceArgs<Index> args) {
  constexpr int kGroupsPerBlock = kBlock / kGroup;
  __shared__ float smem[kGroup / 32];
  const Reducer<kOp> combine{};
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const Index tasks = args.outputs * args.splits;
  const Index group_stride = static_cast<Index>(gridDim.x) * kGroupsPerBlock;
  for (Index task = static_cast<Index>(blockIdx.x) * kGroupsPerBlock + static_cast<Index>(threadIdx.x) / kGroup;
       task < tasks; task += group_stride) {
    const Index output = task / args.splits;
    const Index begin = (task - output * args.splits) * args.chunk;
    const Index end = args.count - begin > args.chunk ? begin + args.chunk : args.count;
    const T* base = x + offset_of(args.kept, output);
    float acc = Reducer<kOp>::identity();
    for (Index r = begin + lane; r < end; r += kGroup) {
      acc = combine(acc, Reducer<kOp>::element(to_float(base[offset_of(args.reduced, r)])));
    }
    acc = group_reduce<kGroup>(acc, combine, smem);
    if (lane == 0) {
      if (args.splits == 1) {
        y[output] = from_float<T>(Reducer<kOp>::finalize(acc, args.count));
      } else {
        partial[task] = acc;
      }
    }
  }
}

// Combines the elements of p[0, n), n < 16 bytes' worth, that lane `lane` of kGroup threads takes into `acc`: a fixed
// number of guarded loads, all issued before any is combined (not a loop of unknown length).
template <ReduceOp kOp, int kGroup, typename T, typename Index>
__device__ __forceinline__ void combine_edge(const T* p, int lane, Index n, float& acc) {
  constexpr int kLoads = (kVec16<T> + kGroup - 1) / kGroup;
  const Reducer<kOp> combine{};
  float values[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    if (lane + k * kGroup < n) values[k] = Reducer<kOp>::element(to_float(p[lane + k * kGroup]));
  }
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    if (lane + k * kGroup < n) acc = combine(acc, values[k]);
  }
}

// Combines p[0, n), lane `lane` of a group of kGroup threads taking its share (Note [Contiguous row reductions]):
// the elements before the first 16-byte boundary, the 16-byte vectors lane, lane + kGroup, ... in rounds of
// kRowVectorsInFlight loads with one accumulator per element of a vector, and the elements after the last vector.
template <ReduceOp kOp, int kGroup, typename T, typename Index>
__device__ __forceinline__ float reduce_contiguous(const T* p, Index n, int lane) {
  constexpr int kVec = kVec16<T>;
  constexpr int kRound = kRowVectorsInFlight;
  const Reducer<kOp> combine{};
  float acc[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = Reducer<kOp>::identity();
  const auto misalignment = static_cast<Index>((reinterpret_cast<std::uintptr_t>(p) % 16) / sizeof(T));
  const Index head = misalignment == 0 ? Index{0} : min(n, static_cast<Index>(kVec) - misalignment);
  combine_edge<kOp, kGroup>(p, lane, head, acc[0]);
  const auto* vectors = reinterpret_cast<const Vec<T, kVec>*>(p + head);
  const Index num_vectors = (n - head) / kVec;
  for (Index v = lane; v < num_vectors; v += kRound * kGroup) {
    Vec<T, kVec> loaded[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      if (v + u * kGroup < num_vectors) loaded[u] = vectors[v + u * kGroup];
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      if (v + u * kGroup < num_vectors) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] = combine(acc[j], Reducer<kOp>::element(to_float(loaded[u].v[j])));
      }
    }
  }
  const Index tail = head + num_vectors * kVec;
  combine_edge<kOp, kGroup>(p + tail, lane, n - tail, acc[1 % kVec]);
  float result = acc[0];
#pragma unroll
  for (int j = 1; j < kVec; ++j) result = combine(result, acc[j]);
  return result;
}

// Contiguous-row kernel (Note [Contiguous row reductions]): groups of kGroup threads, one per (output, split) task
// (task = output * splits + split). kGroup <= 32: aligned parts of a warp, kBlock / kGroup groups a block; kGroup >
// 32: the whole block.
template <typename T, ReduceOp kOp, int kGroup, int kBlock, typename Index>
__global__ void __launch_bounds__(kBlock) reduce_contiguous_rows_kernel(const T* x, T* y, float* partial,
                                                                        ReduceArgs<Index> args) {
  static_assert(kGroup <= 32 ? kBlock % 32 == 0 : kGroup == kBlock, "groups are parts of warps or the block");
  constexpr int kGroupsPerBlock = kBlock / kGroup;
  __shared__ float smem[kGroup > 32 ? kGroup / 32 : 1];
  const Reducer<kOp> combine{};
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const Index group = static_cast<Index>(threadIdx.x) / kGroup;
  const Index tasks = args.outputs * args.splits;
  const Index stride = static_cast<Index>(gridDim.x) * kGroupsPerBlock;
  // `first` is the same in every thread of the block: all of them reach group_reduce's shuffles and barriers.
  for (Index first = static_cast<Index>(blockIdx.x) * kGroupsPerBlock; first < tasks; first += stride) {
    const Index task = first + group;
    Index output = 0;
    float acc = Reducer<kOp>::identity();
    if (task < tasks) {
      output = task / args.splits;
      const Index begin = (task - output * args.splits) * args.chunk;
      const Index end = args.count - begin > args.chunk ? begin + args.chunk : args.count;
      acc = reduce_contiguous<kOp, kGroup>(x + offset_of(args.kept, output) + begin, end - begin, lane);
    }
    acc = group_reduce<kGroup>(acc, combine, smem);
    if (task < tasks && lane == 0) {
      if (args.splits == 1) {
        y[output] = from_float<T>(Reducer<kOp>::finalize(acc, args.count));
      } else {
        partial[task] = acc;
      }
    }
  }
}

// Threads per task of the contiguous-row kernel (Note [Contiguous row reductions]): enough that one round of
// loads covers the run, at most a warp while the tasks fill the GPU, at most 256 otherwise.
int contiguous_row_group(std::int64_t tasks, std::int64_t chunk, int vector_elements) {
  const std::int64_t vectors = ceil_div(chunk, vector_elements);
  int group = 2;
  while (group < 32 && group * kRowVectorsInFlight < vectors) group *= 2;
  while (group < kRowBlockGroup && tasks * group < kRowFillThreads && group * kRowVectorsInFlight < vectors) {
    group *= 2;
  }
  return group;
}

// Column kernel: one thread per (output, split) task; outputs vary fastest across threads so that
// neighbouring threads read neighbouring elements. Partials are stored at output * splits + split.
template <typename T, ReduceOp kOp, typename Index>
__global__ void reduce_column_kernel(const T* x, T* y, float* partial, ReduceArgs<Index> args) {
  const Reducer<kOp> combine{};
  const Index tasks = args.outputs * args.splits;
  const Index stride = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x);
  for (Index task = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) + static_cast<Index>(threadIdx.x);
       task < tasks; task += stride) {
    const Index split = task / args.outputs;
    const Index output = task - split * args.outputs;
    const Index begin = split * args.chunk;
    const Index end = args.count - begin > args.chunk ? begin + args.chunk : args.count;
    const T* base = x + offset_of(args.kept, output);
    float acc = Reducer<kOp>::identity();
    for (Index r = begin; r < end; ++r) {
      acc = combine(acc, Reducer<kOp>::element(to_float(base[offset_of(args.reduced, r)])));
    }
    if (args.splits == 1) {
      y[output] = from_float<T>(Reducer<kOp>::finalize(acc, args.count));
    } else {
      partial[output * args.splits + split] = acc;
    }
  }
}

// Middle kernel (Note [Middle-axis reductions]): block (inner chunk, split, outer); thread (tx, ty) reduces 8 results
// at inner offset c over rows begin + ty, begin + ty + rows, ... of its split's range.
constexpr int kMiddleElements = 8;
constexpr int kMiddleMaxVectors = 32;
constexpr std::int64_t kMiddleTargetBlocks = 264;  // two per SM of an H100/H200
constexpr std::int64_t kMiddleMinRows = 4;          // rows per thread at the least, before splitting further
constexpr int kMiddleLoadsInFlight = 8;             // 16-byte loads a thread issues before combining any
constexpr std::int64_t kMiddleMaxOuter = 65535;     // blocks along a grid's z dimension

template <typename T, ReduceOp kOp>
__global__ void __launch_bounds__(kThreads) reduce_middle_kernel(const T* x, T* y, float* partial, std::int64_t inner,
                                                                  std::int64_t count, std::int64_t chunk,
                                                                  std::int64_t splits, int vectors) {
  constexpr int V = kMiddleElements;
  constexpr int kLoad = kVec16<T>;
  constexpr int kParts = V / kLoad;                          // 16-byte loads per row
  constexpr int kRound = kMiddleLoadsInFlight / kParts;     // rows per round of loads
  __shared__ float rows_acc[kThreads * V];
  const Reducer<kOp> combine{};
  const int tx = static_cast<int>(threadIdx.x) % vectors, ty = static_cast<int>(threadIdx.x) / vectors;
  const int rows = static_cast<int>(blockDim.x) / vectors;
  const std::int64_t c = (static_cast<std::int64_t>(blockIdx.x) * vectors + tx) * V;
  const std::int64_t split = blockIdx.y, o = blockIdx.z;
  const std::int64_t begin = split * chunk;
  const std::int64_t end = count - begin > chunk ? begin + chunk : count;
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = Reducer<kOp>::identity();
  if (c < inner) {
    const T* base = x + o * count * inner + c;
    const std::int64_t row_step = static_cast<std::int64_t>(rows) * inner;
    // kRound rows' loads in flight before any is combined (a thread's rows are few: latency, not bandwidth, bounds
    // it); the rows still combine in ascending order, so the result does not depend on the rounds.
    for (std::int64_t r = begin + ty; r < end; r += kRound * rows) {
      const T* p = base + r * inner;
      Vec<T, kLoad> v[kRound][kParts];
#pragma unroll
      for (int u = 0; u < kRound; ++u) {
        if (r + u * rows < end) {
#pragma unroll
          for (int part = 0; part < kParts; ++part) {
            v[u][part] = *reinterpret_cast<const Vec<T, kLoad>*>(p + u * row_step + part * kLoad);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kRound; ++u) {
        if (r + u * rows < end) {
#pragma unroll
          for (int part = 0; part < kParts; ++part) {
#pragma unroll
            for (int i = 0; i < kLoad; ++i) {
              acc[part * kLoad + i] = combine(acc[part * kLoad + i], Reducer<kOp>::element(to_float(v[u][part].v[i])));
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) rows_acc[threadIdx.x * V + i] = acc[i];
  __syncthreads();
  // One thread per result of the block (vectors * 8 of them) combines the rows' partials in row order: thread j's
  // are rows_acc[t * vectors * 8 + j]. (Eight chains of `rows` steps in each of `vectors` threads had made this
  // combine the kernel's longest part.)
  const int results = vectors * V;
  for (int j = static_cast<int>(threadIdx.x); j < results; j += static_cast<int>(blockDim.x)) {
    const std::int64_t first = (static_cast<std::int64_t>(blockIdx.x) * vectors + j / V) * V;
    if (first >= inner) continue;
    float value = rows_acc[j];
#pragma unroll 8
    for (int t = 1; t < rows; ++t) value = combine(value, rows_acc[t * results + j]);
    const std::int64_t out = o * inner + first + j % V;
    if (splits == 1) {
      y[out] = from_float<T>(Reducer<kOp>::finalize(value, count));
    } else {
      partial[out * splits + split] = value;
    }
  }
}

// The middle kernel's threads across the inner axis (in vectors of 8 results) and blocks along it.
int middle_vectors(std::int64_t inner) {
  const std::int64_t vectors = inner / kMiddleElements;
  const std::int64_t chunks = ceil_div(vectors, kMiddleMaxVectors);
  return static_cast<int>(ceil_div(vectors, chunks));
}

// Second pass: combines each output's partials in a fixed order. kGroup 1: a thread per output, in split order;
// kGroup 32 (kFinalizeWarpSplits or more partials): a warp per output, lane l taking partials l, l + 32, ... and
// a shuffle tree the rest (one thread walking a thousand partials had been most of a full reduction's time).
constexpr std::int64_t kFinalizeWarpSplits = 32;

template <typename T, ReduceOp kOp, int kGroup>
__global__ void __launch_bounds__(kThreads) reduce_finalize_kernel(const float* partial, T* y, std::int64_t outputs,
                                                                    std::int64_t splits, std::int64_t count) {
  constexpr int kGroupsPerBlock = kThreads / kGroup;
  const Reducer<kOp> combine{};
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const std::int64_t group = static_cast<std::int64_t>(threadIdx.x) / kGroup;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kGroupsPerBlock;
  // `first` is the same in every thread of a warp: all of its lanes reach the shuffles.
  for (std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kGroupsPerBlock; first < outputs;
       first += stride) {
    const std::int64_t output = first + group;
    float acc = Reducer<kOp>::identity();
    if (output < outputs) {
      const float* p = partial + output * splits;
      for (std::int64_t s = lane; s < splits; s += kGroup) acc = combine(acc, p[s]);
    }
    acc = group_reduce<kGroup>(acc, combine, nullptr);  // a warp or less: no shared memory
    if (output < outputs && lane == 0) y[output] = from_float<T>(Reducer<kOp>::finalize(acc, count));
  }
}

// The strided row kernel with groups of kGroup threads, kBlock per block, over `tasks` tasks.
template <typename T, ReduceOp kOp, int kGroup, int kBlock, typename Index>
void launch_rows(std::int64_t tasks, const T* x, T* y, float* partial, const ReduceArgs<Index>& args,
                 cudaStream_t stream) {
  reduce_row_kernel<T, kOp, kGroup, kBlock, Index><<<grid_for(tasks, kBlock / kGroup), kBlock, 0, stream>>>(
      x, y, partial, args);
}

// The contiguous-row kernel with groups of kGroup threads (a block of kThreads for warps and parts of warps).
template <typename T, ReduceOp kOp, int kGroup, typename Index>
void launch_contiguous_rows(std::int64_t tasks, const T* x, T* y, float* partial, const ReduceArgs<Index>& args,
                            cudaStream_t stream) {
  constexpr int kBlock = kGroup <= 32 ? kThreads : kGroup;
  reduce_contiguous_rows_kernel<T, kOp, kGroup, kBlock, Index>
      <<<grid_for(tasks, kBlock / kGroup), kBlock, 0, stream>>>(x, y, partial, args);
}

template <typename T, ReduceOp kOp, typename Index>
void launch_contiguous_rows(int group, std::int64_t tasks, const T* x, T* y, float* partial,
                            const ReduceArgs<Index>& args, cudaStream_t stream) {
  switch (group) {
    case 2: return launch_contiguous_rows<T, kOp, 2>(tasks, x, y, partial, args, stream);
    case 4: return launch_contiguous_rows<T, kOp, 4>(tasks, x, y, partial, args, stream);
    case 8: return launch_contiguous_rows<T, kOp, 8>(tasks, x, y, partial, args, stream);
    case 16: return launch_contiguous_rows<T, kOp, 16>(tasks, x, y, partial, args, stream);
    case 32: return launch_contiguous_rows<T, kOp, 32>(tasks, x, y, partial, args, stream);
    case 64: return launch_contiguous_rows<T, kOp, 64>(tasks, x, y, partial, args, stream);
    case 128: return launch_contiguous_rows<T, kOp, 128>(tasks, x, y, partial, args, stream);
    default:
      XPURT_INTERNAL_ASSERT(group == kRowBlockGroup, "contiguous row group ", group);
      return launch_contiguous_rows<T, kOp, kRowBlockGroup>(tasks, x, y, partial, args, stream);
  }
}

template <typename T, ReduceOp kOp, typename Index>
void launch_reduce_kernel(const ReduceGeometry& geometry, const T* x, T* y, float* partial, cudaStream_t stream) {
  const std::vector<std::int64_t>* const kept_strides[1] = {&geometry.kept_strides};
  const std::vector<std::int64_t>* const reduced_strides[1] = {&geometry.reduced_strides};
  ReduceArgs<Index> args;
  args.kept = make_offset_calculator<1, Index>(geometry.kept_sizes, kept_strides);
  args.reduced = make_offset_calculator<1, Index>(geometry.reduced_sizes, reduced_strides);
  args.outputs = static_cast<Index>(geometry.outputs);
  args.count = static_cast<Index>(geometry.count);
  args.splits = static_cast<Index>(geometry.splits);
  args.chunk = static_cast<Index>(geometry.chunk);
  const std::int64_t tasks = geometry.outputs * geometry.splits;
  const bool contiguous = geometry.reduced_sizes.size() == 1 && geometry.reduced_strides[0] == 1;
  if (geometry.middle && is_aligned(x, 16)) {
    const int vectors = middle_vectors(geometry.inner);
    const dim3 grid(static_cast<unsigned>(ceil_div(geometry.inner / kMiddleElements, vectors)),
                    static_cast<unsigned>(geometry.splits),
                    static_cast<unsigned>(geometry.outputs / geometry.inner));
    reduce_middle_kernel<T, kOp><<<grid, vectors * (kThreads / vectors), 0, stream>>>(
        x, y, partial, geometry.inner, geometry.count, geometry.chunk, geometry.splits, vectors);
  } else if (!geometry.inner_reduced) {
    reduce_column_kernel<T, kOp, Index><<<grid_for(tasks, kThreads), kThreads, 0, stream>>>(x, y, partial, args);
  } else if (contiguous) {
    const int group = contiguous_row_group(tasks, geometry.chunk, kVec16<T>);
    launch_contiguous_rows<T, kOp, Index>(group, tasks, x, y, partial, args, stream);
  } else if (geometry.chunk >= kRowBlockMinChunk) {
    launch_rows<T, kOp, kRowBlockGroup, kRowBlockGroup>(tasks, x, y, partial, args, stream);
  } else {
    launch_rows<T, kOp, 32, kThreads>(tasks, x, y, partial, args, stream);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

template <typename T, ReduceOp kOp>
void launch_reduce(const ReduceGeometry& geometry, const T* x, T* y, float* partial, cudaStream_t stream) {
  // Input elements, at least outputs * splits (the tasks) and outputs * count (every offset, contiguous input).
  const std::int64_t elements = geometry.outputs * std::max<std::int64_t>(geometry.count, geometry.splits);
  if (fits_int32(elements, {}, {})) {
    launch_reduce_kernel<T, kOp, std::int32_t>(geometry, x, y, partial, stream);
  } else {
    launch_reduce_kernel<T, kOp, std::int64_t>(geometry, x, y, partial, stream);
  }
  if (geometry.splits >= kFinalizeWarpSplits) {
    reduce_finalize_kernel<T, kOp, 32><<<grid_for(geometry.outputs, kThreads / 32), kThreads, 0, stream>>>(
        partial, y, geometry.outputs, geometry.splits, geometry.count);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  } else if (geometry.splits > 1) {
    reduce_finalize_kernel<T, kOp, 1><<<grid_for(geometry.outputs, kThreads), kThreads, 0, stream>>>(
        partial, y, geometry.outputs, geometry.splits, geometry.count);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  }
}

}  // namespace

std::size_t ReduceGeometry::workspace_bytes() const {
  return splits > 1 ? static_cast<std::size_t>(outputs * splits) * (block ? kBlockPartialBytes : sizeof(float)) : 0;
}

std::string ReduceGeometry::str() const {
  return ::xpuruntime::detail::str_cat(outputs, " outputs x ", count, " elements, ",
                                       block ? "block" : inner_reduced ? "row" : (middle ? "middle" : "column"),
                                       " kernel, ", splits, splits == 1 ? " split" : " splits");
}

bool reduce_geometry(const std::vector<std::int64_t>& shape, const std::vector<bool>& reduced,
                     std::uint64_t workspace_limit, ReduceGeometry* geometry, std::string* why_not, bool block,
                     std::int64_t block_chunk_scale) {
  XPURT_INTERNAL_ASSERT(shape.size() == reduced.size(), "shape and reduced flags disagree");
  *geometry = ReduceGeometry();
  ReduceGeometry& g = *geometry;
  g.outputs = 1;
  g.count = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) (reduced[d] ? g.count : g.outputs) *= shape[d];
  // Contiguous strides of the input.
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d > 1; --d) {
    strides[d - 2] = strides[d - 1] * std::max<std::int64_t>(shape[d - 1], 1);
  }
  int last_kind = -1;  // kind of the previous dimension kept in the geometry: 0 kept, 1 reduced
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const int kind = reduced[d] ? 1 : 0;
    auto& sizes = kind == 1 ? g.reduced_sizes : g.kept_sizes;
    auto& dim_strides = kind == 1 ? g.reduced_strides : g.kept_strides;
    if (kind == last_kind) {  // adjacent in a contiguous input: one dimension
      sizes.back() *= shape[d];
      dim_strides.back() = strides[d];
    } else {
      sizes.push_back(shape[d]);
      dim_strides.push_back(strides[d]);
    }
    last_kind = kind;
  }
  g.inner_reduced = last_kind == 1;
  if (g.count == 0) {  // an empty axis: every output is the identity; nothing to read or index
    g.reduced_sizes.clear();
    g.reduced_strides.clear();
    g.inner_reduced = false;
    g.chunk = 0;
    return true;
  }
  if (g.kept_sizes.size() > static_cast<std::size_t>(kMaxDims) ||
      g.reduced_sizes.size() > static_cast<std::size_t>(kMaxDims)) {
    *why_not = ::xpuruntime::detail::str_cat(
        "cuda_raw reduces with at most ", kMaxDims, " kept and ", kMaxDims,
        " reduced dimensions after merging neighbours, this input needs ", g.kept_sizes.size(), " and ",
        g.reduced_sizes.size(), "; reduce in two steps or use the cpu kernel");
    return false;
  }
  // [outer, count, inner]: one reduced dimension right outside the innermost kept one (Note [Middle-axis
  // reductions]); outer is the grid's z dimension, at most 65535.
  g.middle = !g.inner_reduced && g.reduced_sizes.size() == 1 && g.kept_sizes.size() <= 2 &&
             g.reduced_strides[0] == g.kept_sizes.back() && g.kept_sizes.back() % kMiddleElements == 0 &&
             (g.kept_sizes.size() == 1 || g.kept_strides[0] == g.count * g.kept_sizes.back()) &&
             g.outputs / g.kept_sizes.back() <= kMiddleMaxOuter;
  g.block = block;
  if (block) {
    g.middle = false;
    g.splits = block_reduce_splits(g.outputs, g.count, workspace_limit,
                                   std::max<std::int64_t>(1, block_chunk_scale));
  } else if (g.middle) {
    g.inner = g.kept_sizes.back();
    const int vectors = middle_vectors(g.inner);
    const std::int64_t rows = kThreads / vectors;
    const std::int64_t blocks = ceil_div(g.inner / kMiddleElements, vectors) * (g.outputs / g.inner);
    g.splits = std::max<std::int64_t>(
        1, std::min(ceil_div(kMiddleTargetBlocks, blocks), g.count / (rows * kMiddleMinRows)));
  } else if (g.inner_reduced && g.outputs < kRowTargetGroups && g.count >= 2 * kRowMinChunk) {
    g.splits = std::min(ceil_div(g.count, kRowMinChunk), ceil_div(kRowTargetGroups, g.outputs));
  } else if (!g.inner_reduced && g.outputs < kColumnTargetThreads && g.count >= 2 * kColumnMinChunk) {
    g.splits = std::min(ceil_div(g.count, kColumnMinChunk), ceil_div(kColumnTargetThreads, g.outputs));
  }
  if (!block && workspace_limit > 0 && g.splits > 1) {  // as many partials as the limit holds; none below two
    const std::uint64_t partial_bytes = sizeof(float) * static_cast<std::uint64_t>(g.outputs);
    const auto fit = static_cast<std::int64_t>(workspace_limit / partial_bytes);
    if (g.splits > fit) g.splits = fit < 2 ? 1 : fit;
  }
  g.chunk = ceil_div(g.count, g.splits);
  g.splits = ceil_div(g.count, g.chunk);  // no empty chunk
  return true;
}

void reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* workspace,
            void* stream) {
  if (geometry.outputs <= 0) return;
  XPURT_CHECK(geometry.workspace_bytes() == 0 || workspace != nullptr, "cuda_raw reduce: the plan needs ",
              geometry.workspace_bytes(), " bytes of workspace, but none was given");
  dispatch_float(dtype, "reduce", [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    auto* ys = static_cast<T*>(y);
    auto* partial = static_cast<float*>(workspace);
    const cudaStream_t s = as_stream(stream);
    switch (op) {
      case ReduceOp::kSum: return launch_reduce<T, ReduceOp::kSum>(geometry, xs, ys, partial, s);
      case ReduceOp::kMean: return launch_reduce<T, ReduceOp::kMean>(geometry, xs, ys, partial, s);
      case ReduceOp::kMax: return launch_reduce<T, ReduceOp::kMax>(geometry, xs, ys, partial, s);
      case ReduceOp::kMin: return launch_reduce<T, ReduceOp::kMin>(geometry, xs, ys, partial, s);
      case ReduceOp::kSumSquare: return launch_reduce<T, ReduceOp::kSumSquare>(geometry, xs, ys, partial, s);
      case ReduceOp::kProd: return float_prod(geometry, x, y, dtype, workspace, stream);
    }
  });
}

namespace {

// The value type a block reduction combines in: unsigned for integers (wrapping sums and products), float for
// 16-bit floats (Note [fp32 compute]).
template <typename T>
struct BlockAcc {
  using type = std::make_unsigned_t<T>;
  __device__ static type load(T v) { return static_cast<type>(v); }
  __device__ static T store(type v) { return static_cast<T>(v); }
};
template <>
struct BlockAcc<float> {
  using type = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <>
struct BlockAcc<__half> {
  using type = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct BlockAcc<__nv_bfloat16> {
  using type = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename T>
__device__ __forceinline__ typename BlockAcc<T>::type block_combine(ReduceOp op, typename BlockAcc<T>::type a,
                                                                    typename BlockAcc<T>::type b) {
  using A = typename BlockAcc<T>::type;
  if (op == ReduceOp::kSum) return static_cast<A>(a + b);
  if (op == ReduceOp::kProd) return static_cast<A>(a * b);
  // max/min compare as T (signed); floats never take this path
  const T ta = BlockAcc<T>::store(a), tb = BlockAcc<T>::store(b);
  if (op == ReduceOp::kMax) return tb > ta ? b : a;
  return tb < ta ? b : a;
}

template <typename T>
__device__ __forceinline__ typename BlockAcc<T>::type block_identity(ReduceOp op) {
  using A = typename BlockAcc<T>::type;
  if (op == ReduceOp::kSum) return A(0);
  if (op == ReduceOp::kProd) return A(1);
  return BlockAcc<T>::load(op == ReduceOp::kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
}

// Combines the block's kThreads values in a fixed tree; thread 0 gets the result. Ends with a barrier, so that the
// block may reuse `partial`.
template <typename T>
__device__ __forceinline__ typename BlockAcc<T>::type block_tree(ReduceOp op, typename BlockAcc<T>::type acc,
                                                                 typename BlockAcc<T>::type* partial) {
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) {
      partial[threadIdx.x] = block_combine<T>(op, partial[threadIdx.x], partial[threadIdx.x + half]);
    }
    __syncthreads();
  }
  const typename BlockAcc<T>::type result = partial[0];
  __syncthreads();
  return result;
}

// Task `task` (= output * splits + split) of a block reduction: its output, its range [begin, end) of the output's
// `count` elements, and the output's first element.
struct BlockTask {
  std::int64_t output, begin, end, base;
};
__device__ __forceinline__ BlockTask block_task(std::int64_t task, std::int64_t splits, std::int64_t count,
                                                std::int64_t chunk, const OffsetCalculator<1, std::int64_t>& kept) {
  BlockTask t;
  t.output = task / splits;
  t.begin = (task - t.output * splits) * chunk;
  t.end = count - t.begin > chunk ? t.begin + chunk : count;
  std::int64_t base[1];
  kept.offsets(t.output, base);
  t.base = base[0];
  return t;
}

// One block per (output, split) task, task = output * splits + split (Note [Block reductions]): the threads
// stride over the split's chunk of the result's `count` elements, then combine in a fixed tree, so the bits never
// depend on timing (sums and products of integers wrap). One split: the result itself; more: the partial, which
// block_finalize_kernel combines.
template <typename T, bool kContiguous>
__global__ void __launch_bounds__(kThreads) block_reduce_kernel(ReduceOp op, const T* x, T* y,
                                                                typename BlockAcc<T>::type* partials,
                                                                std::int64_t outputs, std::int64_t count,
                                                                std::int64_t splits, std::int64_t chunk,
                                                                OffsetCalculator<1, std::int64_t> kept,
                                                                OffsetCalculator<1, std::int64_t> reduced) {
  using A = typename BlockAcc<T>::type;
  __shared__ A partial[kThreads];
  const A identity = block_identity<T>(op);
  for (std::int64_t task = blockIdx.x; task < outputs * splits; task += gridDim.x) {
    const BlockTask t = block_task(task, splits, count, chunk, kept);
    const std::int64_t o = t.output, begin = t.begin, end = t.end;
    const std::int64_t base[1] = {t.base};
    A acc = identity;
    // Rounds of kBlockLoads loads in flight; the thread combines its elements in ascending order, as one at a time.
    const std::int64_t step = blockDim.x;
    for (std::int64_t r0 = begin + threadIdx.x; r0 < end; r0 += step * kBlockLoads) {
      T v[kBlockLoads];
#pragma unroll
      for (int k = 0; k < kBlockLoads; ++k) {
        const std::int64_t r = r0 + k * step;
        if (r < end) {
          if constexpr (kContiguous) {
            v[k] = x[base[0] + r];
          } else {
            std::int64_t offset[1];
            reduced.offsets(r, offset);
            v[k] = x[base[0] + offset[0]];
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kBlockLoads; ++k) {
        if (r0 + k * step < end) acc = block_combine<T>(op, acc, BlockAcc<T>::load(v[k]));
      }
    }
    acc = block_tree<T>(op, acc, partial);
    if (threadIdx.x == 0) {
      if (splits == 1) {
        y[o] = BlockAcc<T>::store(acc);
      } else {
        partials[task] = acc;
      }
    }
  }
}

// The second pass of a split block reduction: one block per output combines its `splits` partials (strided over
// the threads, then the fixed tree), in an order that depends on `splits` only.
template <typename T>
__global__ void __launch_bounds__(kThreads) block_finalize_kernel(ReduceOp op,
                                                                  const typename BlockAcc<T>::type* partials, T* y,
                                                                  std::int64_t outputs, std::int64_t splits) {
  using A = typename BlockAcc<T>::type;
  __shared__ A partial[kThreads];
  for (std::int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    A acc = block_identity<T>(op);
    for (std::int64_t s = threadIdx.x; s < splits; s += blockDim.x) {
      acc = block_combine<T>(op, acc, partials[o * splits + s]);
    }
    acc = block_tree<T>(op, acc, partial);
    if (threadIdx.x == 0) y[o] = BlockAcc<T>::store(acc);
  }
}

// Note [Bools 16 at a time]
// Any (reduce_max) and all (reduce_min) of bools, whose bytes are 0 or 1 (Note [Reductions of predicates]): where a
// result's range is contiguous, each thread reads 16 bytes a load, kBlockLoads loads in flight, and looks for the
// byte that decides the result (any: a nonzero byte, all: a zero byte, found in a 32-bit word w as
// (w - 0x01010101) & ~w & 0x80808080); the head before the first 16-byte boundary and the tail go a byte at a time.
// The block's threads meet in __syncthreads_or; the result (or the split's partial, combined by
// block_finalize_kernel<uint8_t>) is 0 or 1. The splits' chunks are 32 times the block kernel's (block_chunk_scale:
// two rounds of loads a thread): a full reduction of 65,536 bools (T5's guard at batch 1) is one block, one launch.
__device__ __forceinline__ bool has_zero_byte(unsigned w) { return ((w - 0x01010101u) & ~w & 0x80808080u) != 0; }
__device__ __forceinline__ bool decides(bool any, uint4 v) {
  if (any) return (v.x | v.y | v.z | v.w) != 0;
  return has_zero_byte(v.x) || has_zero_byte(v.y) || has_zero_byte(v.z) || has_zero_byte(v.w);
}

__global__ void __launch_bounds__(kThreads) bool_reduce_kernel(bool any, const std::uint8_t* x, std::uint8_t* y,
                                                               std::uint8_t* partials, std::int64_t outputs,
                                                               std::int64_t count, std::int64_t splits,
                                                               std::int64_t chunk,
                                                               OffsetCalculator<1, std::int64_t> kept) {
  for (std::int64_t task = blockIdx.x; task < outputs * splits; task += gridDim.x) {
    const BlockTask t = block_task(task, splits, count, chunk, kept);
    const std::int64_t o = t.output, begin = t.begin, end = t.end;
    const std::uint8_t* p = x + t.base;
    const auto misaligned = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p + begin) & 15u);
    const std::int64_t head = misaligned == 0 ? 0 : 16 - misaligned;  // bytes before the first 16-byte boundary
    const std::int64_t body = end - begin > head ? begin + head : end;
    const std::int64_t vectors = (end - body) / 16;
    bool hit = false;
    for (std::int64_t i = begin + threadIdx.x; i < body; i += blockDim.x) hit |= any ? p[i] != 0 : p[i] == 0;
    const auto* v = reinterpret_cast<const uint4*>(p + body);
    const std::int64_t step = blockDim.x;
    for (std::int64_t j0 = threadIdx.x; j0 < vectors && !hit; j0 += step * kBlockLoads) {
      uint4 w[kBlockLoads];
#pragma unroll
      for (int k = 0; k < kBlockLoads; ++k) {
        if (j0 + k * step < vectors) w[k] = v[j0 + k * step];
      }
#pragma unroll
      for (int k = 0; k < kBlockLoads; ++k) {
        if (j0 + k * step < vectors) hit |= decides(any, w[k]);
      }
    }
    for (std::int64_t i = body + vectors * 16 + threadIdx.x; i < end; i += blockDim.x) {
      hit |= any ? p[i] != 0 : p[i] == 0;
    }
    hit = __syncthreads_or(hit) != 0;
    if (threadIdx.x == 0) {
      const std::uint8_t result = any ? hit : !hit;
      if (splits == 1) {
        y[o] = result;
      } else {
        partials[task] = result;
      }
    }
  }
}

template <typename T>
void launch_block_reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, void* workspace,
                         void* stream) {
  using A = typename BlockAcc<T>::type;
  const std::vector<std::int64_t>* const kept_table[1] = {&geometry.kept_strides};
  const std::vector<std::int64_t>* const reduced_table[1] = {&geometry.reduced_strides};
  const auto kept = make_offset_calculator<1, std::int64_t>(geometry.kept_sizes, kept_table);
  const auto reduced = make_offset_calculator<1, std::int64_t>(geometry.reduced_sizes, reduced_table);
  XPURT_INTERNAL_ASSERT(geometry.block, "cuda_raw block reduce: a geometry made for the float kernels");
  const std::int64_t splits = geometry.splits;
  XPURT_CHECK(splits == 1 || workspace != nullptr, "cuda_raw reduce: the plan needs ", geometry.workspace_bytes(),
              " bytes of workspace, but none was given");
  auto* partials = static_cast<A*>(workspace);
  const cudaStream_t s = as_stream(stream);
  // One reduced dimension of stride 1: the range of every result is contiguous.
  const bool contiguous = geometry.reduced_sizes.size() == 1 && geometry.reduced_strides[0] == 1;
  bool bools = false;  // contiguous bools take their own first pass (Note [Bools 16 at a time])
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    bools = contiguous;
    if (bools) {
      bool_reduce_kernel<<<grid_for(geometry.outputs * splits, 1), kThreads, 0, s>>>(
          op == ReduceOp::kMax, static_cast<const std::uint8_t*>(x), static_cast<std::uint8_t*>(y), partials,
          geometry.outputs, geometry.count, splits, geometry.chunk, kept);
    }
  }
  if (!bools) {
    auto* kernel = contiguous ? block_reduce_kernel<T, true> : block_reduce_kernel<T, false>;
    kernel<<<grid_for(geometry.outputs * splits, 1), kThreads, 0, s>>>(op, static_cast<const T*>(x),
                                                                       static_cast<T*>(y), partials, geometry.outputs,
                                                                       geometry.count, splits, geometry.chunk, kept,
                                                                       reduced);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  if (splits > 1) {
    block_finalize_kernel<T><<<grid_for(geometry.outputs, 1), kThreads, 0, s>>>(op, partials, static_cast<T*>(y),
                                                                                geometry.outputs, splits);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  }
}

}  // namespace

void integer_reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* workspace,
                    void* stream) {
  XPURT_CHECK(op != ReduceOp::kMean, "cuda_raw::integer_reduce: mean has no integer kernel");
  if (geometry.outputs == 0) return;
  XPURT_CHECK(geometry.count > 0 || op == ReduceOp::kSum || op == ReduceOp::kProd,
              "cuda_raw::integer_reduce: max/min of an empty axis");
  if (dtype == DType::kInt32) return launch_block_reduce<std::int32_t>(op, geometry, x, y, workspace, stream);
  if (dtype == DType::kBool) {  // any (max) and all (min) of bytes that are 0 or 1
    XPURT_CHECK(op == ReduceOp::kMax || op == ReduceOp::kMin, "cuda_raw::integer_reduce: bools take max and min");
    return launch_block_reduce<std::uint8_t>(op, geometry, x, y, workspace, stream);
  }
  XPURT_CHECK(dtype == DType::kInt64, "cuda_raw::integer_reduce: int32, int64 or bool, got ", dtype_name(dtype));
  launch_block_reduce<std::int64_t>(op, geometry, x, y, workspace, stream);
}

void float_prod(const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* workspace, void* stream) {
  if (geometry.outputs == 0) return;
  dispatch_float(dtype, "reduce_prod", [&](auto tag) {
    using T = decltype(tag);
    launch_block_reduce<T>(ReduceOp::kProd, geometry, x, y, workspace, stream);
  });
}

}  // namespace xpuruntime::cuda_raw
