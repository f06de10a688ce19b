// Reductions (sum, mean, max, min) over any set of axes.
//
// Note [Reduction layout]
// The input's dimensions are classified as kept or reduced; size-1 ones are dropped and neighbours of the
// same kind merged (ReduceGeometry). Each result then reads `count` elements at kept_offset(o) +
// reduced_offset(r). Two kernels cover every layout with coalesced reads:
//  - row: the innermost dimension is reduced, so one result's elements are contiguous at the inner end; a
//    warp (short runs) or a block (long runs) reads them together and combines with a fixed-order tree.
//  - column: the innermost dimension is kept, so neighbouring results read neighbouring elements; one thread
//    per result walks the reduced dimensions.
// When there are too few results to fill the GPU (e.g. a full reduction of a long vector, or a column sum of a
// tall matrix), each result's range is split into `splits` chunks reduced independently into a float workspace,
// and a second kernel combines the partials in order. The split depends on the shape only, never on timing,
// so results are bitwise reproducible: no atomics anywhere.
//
// Note [Middle-axis reductions]
// A channels-last mean over H and W (squeeze-excitation, global pooling, nhwc_layout's ReduceMean) reduces the middle
// axis of [N, H * W, C]: a column reduction whose results are the C neighbouring channels. One thread per result
// walking H * W rows two bytes at a time was latency-bound (36 us for EfficientNet's first squeeze at batch 1, 2.4 MB).
// The middle kernel gives a block up to 32 threads across the channels, each reading 8 channels as 16-byte vectors,
// and 256 / that many rows of threads, each taking every so-many row of the block's range (four rows' loads in flight
// at a time: a thread has few rows, and one load after another was latency-bound, 4.7 us a mean for EfficientNet's
// at batch 1); the rows' partial results combine in shared memory in row order, one thread per result. Splits of the
// row range fill the GPU as above.
//
// Semantics: sums and means accumulate in fp32; the mean of an empty axis is NaN (0/0) and its sum 0, like
// NumPy; max and min propagate NaN (NumPy's max/min, PyTorch's amax/amin).
#include <algorithm>
#include <cstdint>
#include <string>
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
// Row chunks at least this long take a block of kRowBlockGroup threads; shorter ones a warp.
constexpr std::int64_t kRowBlockMinChunk = 4096;
constexpr int kRowBlockGroup = 256;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

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

// Combines p[0, n) into `acc`, lane `lane` of a group of kGroup threads taking every kGroup-th piece: elements up to
// the first 16-byte boundary one at a time, then 16-byte vectors, then the tail one at a time. The order depends on
// n and p's alignment only (fixed for a plan), so results are reproducible.
template <int kGroup, typename T, typename Index, typename Combine>
__device__ __forceinline__ float reduce_contiguous(const T* p, Index n, int lane, Combine combine, float acc) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static_assert(kVec >= 1 && 16 % sizeof(T) == 0, "element sizes divide 16 bytes");
  const auto misalignment = static_cast<Index>((reinterpret_cast<std::uintptr_t>(p) % 16) / sizeof(T));
  const Index head = misalignment == 0 ? Index{0} : min(n, static_cast<Index>(kVec) - misalignment);
  for (Index i = lane; i < head; i += kGroup) acc = combine(acc, to_float(p[i]));
  const auto* vectors = reinterpret_cast<const uint4*>(p + head);
  const Index num_vectors = (n - head) / kVec;
  for (Index v = lane; v < num_vectors; v += kGroup) {
    const uint4 raw = vectors[v];
    T values[kVec];
    memcpy(values, &raw, sizeof(raw));
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc = combine(acc, to_float(values[j]));
  }
  for (Index i = head + num_vectors * kVec + lane; i < n; i += kGroup) acc = combine(acc, to_float(p[i]));
  return acc;
}

// Row kernel: one group of kGroup threads per (output, split) task, task = output * splits + split. kContiguous:
// the reduced elements of a result are one contiguous run (one reduced dimension of stride 1), read in 16-byte
// vectors without per-element offset arithmetic.
template <typename T, ReduceOp kOp, int kGroup, int kBlock, bool kContiguous, typename Index>
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
    if constexpr (kContiguous) {
      acc = reduce_contiguous<kGroup>(base + begin, end - begin, lane, combine, acc);
    } else {
      for (Index r = begin + lane; r < end; r += kGroup) {
        acc = combine(acc, to_float(base[offset_of(args.reduced, r)]));
      }
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
    for (Index r = begin; r < end; ++r) acc = combine(acc, to_float(base[offset_of(args.reduced, r)]));
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
constexpr int kMiddleUnroll = 4;                    // rows a thread loads before combining them

template <typename T, ReduceOp kOp>
__global__ void __launch_bounds__(kThreads) reduce_middle_kernel(const T* x, T* y, float* partial, std::int64_t inner,
                                                                  std::int64_t count, std::int64_t chunk,
                                                                  std::int64_t splits, int vectors) {
  constexpr int V = kMiddleElements;
  constexpr int kLoad = kVec16<T>;
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
  if (ty < rows && c < inner) {
    const T* base = x + o * count * inner + c;
    std::int64_t r = begin + ty;
    // kMiddleUnroll rows' loads in flight before any is combined (a thread's rows are few: latency, not bandwidth,
    // bounds it); the rows still combine in ascending order, so the result does not depend on the unrolling.
    for (; r + (kMiddleUnroll - 1) * rows < end; r += kMiddleUnroll * rows) {
      Vec<T, kLoad> v[kMiddleUnroll][V / kLoad];
#pragma unroll
      for (int u = 0; u < kMiddleUnroll; ++u) {
#pragma unroll
        for (int part = 0; part < V / kLoad; ++part) {
          v[u][part] = *reinterpret_cast<const Vec<T, kLoad>*>(base + (r + u * rows) * inner + part * kLoad);
        }
      }
#pragma unroll
      for (int u = 0; u < kMiddleUnroll; ++u) {
#pragma unroll
        for (int part = 0; part < V / kLoad; ++part) {
#pragma unroll
          for (int i = 0; i < kLoad; ++i) {
            acc[part * kLoad + i] = combine(acc[part * kLoad + i], to_float(v[u][part].v[i]));
          }
        }
      }
    }
    for (; r < end; r += rows) {
      const T* p = base + r * inner;
#pragma unroll
      for (int part = 0; part < V / kLoad; ++part) {
        const Vec<T, kLoad> v = *reinterpret_cast<const Vec<T, kLoad>*>(p + part * kLoad);
#pragma unroll
        for (int i = 0; i < kLoad; ++i) acc[part * kLoad + i] = combine(acc[part * kLoad + i], to_float(v.v[i]));
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

// Second pass: combines each output's partials in split order.
template <typename T, ReduceOp kOp>
__global__ void reduce_finalize_kernel(const float* partial, T* y, std::int64_t outputs, std::int64_t splits,
                                       std::int64_t count) {
  const Reducer<kOp> combine{};
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t output = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; output < outputs;
       output += stride) {
    const float* p = partial + output * splits;
    float acc = p[0];
    for (std::int64_t s = 1; s < splits; ++s) acc = combine(acc, p[s]);
    y[output] = from_float<T>(Reducer<kOp>::finalize(acc, count));
  }
}

// The row kernel with groups of kGroup threads, kBlock per block, over `tasks` tasks.
template <typename T, ReduceOp kOp, int kGroup, int kBlock, typename Index>
void launch_rows(bool contiguous, std::int64_t tasks, const T* x, T* y, float* partial, const ReduceArgs<Index>& args,
                 cudaStream_t stream) {
  const auto grid = grid_for(tasks, kBlock / kGroup);
  if (contiguous) {
    reduce_row_kernel<T, kOp, kGroup, kBlock, true, Index><<<grid, kBlock, 0, stream>>>(x, y, partial, args);
  } else {
    reduce_row_kernel<T, kOp, kGroup, kBlock, false, Index><<<grid, kBlock, 0, stream>>>(x, y, partial, args);
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
  } else if (geometry.chunk >= kRowBlockMinChunk) {
    launch_rows<T, kOp, kRowBlockGroup, kRowBlockGroup>(contiguous, tasks, x, y, partial, args, stream);
  } else {
    launch_rows<T, kOp, 32, kThreads>(contiguous, tasks, x, y, partial, args, stream);
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
  if (geometry.splits > 1) {
    reduce_finalize_kernel<T, kOp><<<grid_for(geometry.outputs, kThreads), kThreads, 0, stream>>>(
        partial, y, geometry.outputs, geometry.splits, geometry.count);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  }
}

}  // namespace

std::size_t ReduceGeometry::workspace_bytes() const {
  return splits > 1 ? static_cast<std::size_t>(outputs * splits) * sizeof(float) : 0;
}

std::string ReduceGeometry::str() const {
  return ::xpuruntime::detail::str_cat(outputs, " outputs x ", count, " elements, ",
                                       inner_reduced ? "row" : (middle ? "middle" : "column"), " kernel, ", splits,
                                       splits == 1 ? " split" : " splits");
}

bool reduce_geometry(const std::vector<std::int64_t>& shape, const std::vector<bool>& reduced,
                     std::uint64_t workspace_limit, ReduceGeometry* geometry, std::string* why_not) {
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
  // reductions]).
  g.middle = !g.inner_reduced && g.reduced_sizes.size() == 1 && g.kept_sizes.size() <= 2 &&
             g.reduced_strides[0] == g.kept_sizes.back() && g.kept_sizes.back() % kMiddleElements == 0 &&
             (g.kept_sizes.size() == 1 || g.kept_strides[0] == g.count * g.kept_sizes.back());
  if (g.middle) {
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
  if (workspace_limit > 0 && g.splits > 1) {  // as many partials as the limit holds; none below two
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
      case ReduceOp::kProd: return float_prod(geometry, x, y, dtype, stream);
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

// One block per result: the threads stride over its `count` elements, then combine in a fixed tree, so the bits
// never depend on timing (sums and products of integers wrap).
template <typename T>
__global__ void block_reduce_kernel(ReduceOp op, const T* x, T* y, std::int64_t outputs, std::int64_t count,
                                    OffsetCalculator<1, std::int64_t> kept,
                                    OffsetCalculator<1, std::int64_t> reduced) {
  using A = typename BlockAcc<T>::type;
  __shared__ A partial[kThreads];
  A identity;
  if (op == ReduceOp::kSum) {
    identity = A(0);
  } else if (op == ReduceOp::kProd) {
    identity = A(1);
  } else {
    identity = BlockAcc<T>::load(op == ReduceOp::kMax ? std::numeric_limits<T>::lowest()
                                                      : std::numeric_limits<T>::max());
  }
  for (std::int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    std::int64_t base[1];
    kept.offsets(o, base);
    A acc = identity;
    for (std::int64_t r = threadIdx.x; r < count; r += blockDim.x) {
      std::int64_t offset[1];
      reduced.offsets(r, offset);
      acc = block_combine<T>(op, acc, BlockAcc<T>::load(x[base[0] + offset[0]]));
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half >>= 1) {
      if (static_cast<int>(threadIdx.x) < half) {
        partial[threadIdx.x] = block_combine<T>(op, partial[threadIdx.x], partial[threadIdx.x + half]);
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) y[o] = BlockAcc<T>::store(partial[0]);
    __syncthreads();
  }
}

template <typename T>
void launch_block_reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, void* stream) {
  const std::vector<std::int64_t>* const kept_table[1] = {&geometry.kept_strides};
  const std::vector<std::int64_t>* const reduced_table[1] = {&geometry.reduced_strides};
  const auto kept = make_offset_calculator<1, std::int64_t>(geometry.kept_sizes, kept_table);
  const auto reduced = make_offset_calculator<1, std::int64_t>(geometry.reduced_sizes, reduced_table);
  block_reduce_kernel<T><<<grid_for(geometry.outputs, 1), kThreads, 0, as_stream(stream)>>>(
      op, static_cast<const T*>(x), static_cast<T*>(y), geometry.outputs, geometry.count, kept, reduced);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace

void integer_reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* stream) {
  XPURT_CHECK(op != ReduceOp::kMean, "cuda_raw::integer_reduce: mean has no integer kernel");
  if (geometry.outputs == 0) return;
  XPURT_CHECK(geometry.count > 0 || op == ReduceOp::kSum || op == ReduceOp::kProd,
              "cuda_raw::integer_reduce: max/min of an empty axis");
  if (dtype == DType::kInt32) return launch_block_reduce<std::int32_t>(op, geometry, x, y, stream);
  XPURT_CHECK(dtype == DType::kInt64, "cuda_raw::integer_reduce: int32 or int64, got ", dtype_name(dtype));
  launch_block_reduce<std::int64_t>(op, geometry, x, y, stream);
}

void float_prod(const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* stream) {
  if (geometry.outputs == 0) return;
  dispatch_float(dtype, "reduce_prod", [&](auto tag) {
    using T = decltype(tag);
    launch_block_reduce<T>(ReduceOp::kProd, geometry, x, y, stream);
  });
}

}  // namespace xpuruntime::cuda_raw
