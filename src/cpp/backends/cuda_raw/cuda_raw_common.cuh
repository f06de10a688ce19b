// Device and launch helpers shared by the cuda_raw kernels (included by .cu files only).
//
// Note [fp32 compute]
// Every kernel loads its 16-bit inputs, converts them to float, computes and accumulates in float, and rounds
// once on the store. The 16-bit formats are only storage formats here; results match the cpu reference, which
// does the same, up to the rounding of the last step.
//
// Note [Launch shapes]
// Elementwise kernels use grid-stride loops with 256 threads per block and at most kMaxBlocks blocks, so any
// element count (64-bit) is covered by one launch and the grid stays within limits. Kernels whose element
// offsets all fit in int32 are instantiated with 32-bit index math (divisions by 64-bit numbers are several
// times slower on the GPU); others use 64-bit indices.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "core/cuda_utils.h"
#include "xpuruntime/exceptions.h"

// After every kernel launch (STYLE.md habit 4): a bad configuration surfaces here, not at the next sync.
#define XPURT_CUDA_RAW_LAUNCH_CHECK() XPURT_CUDA_CHECK(cudaGetLastError())

namespace xpuruntime::cuda_raw::detail {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65536;

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Blocks for `work` items handled `per_block` at a time, within [1, max_blocks] (see Note [Launch shapes]).
inline unsigned grid_for(std::int64_t work, std::int64_t per_block, std::int64_t max_blocks = kMaxBlocks) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, max_blocks));
}

inline bool is_aligned(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

// ---- dtype dispatch ----

// Calls `body(T{})` with T the storage type of `dtype` (float, __half, __nv_bfloat16).
template <typename Body>
void dispatch_float(DType dtype, const char* what, Body&& body) {
  switch (dtype) {
    case DType::kFloat32: body(float{}); return;
    case DType::kFloat16: body(__half{}); return;
    case DType::kBFloat16: body(__nv_bfloat16{}); return;
    default:
      throw UnsupportedOperationError(::xpuruntime::detail::str_cat(
          "cuda_raw ", what, " handles float32, float16 and bfloat16 tensors, got ", dtype_name(dtype),
          "; convert with cast or use the cpu kernel"));
  }
}

// ---- conversions (Note [fp32 compute]) ----

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "cuda_raw stores float, __half or __nv_bfloat16");
    return __float2bfloat16_rn(v);
  }
}

// `kSize` elements loaded or stored with one instruction (16 bytes for the 16-byte vectors used here).
template <typename T, int kSize>
struct alignas(sizeof(T) * kSize) Vec {
  T v[kSize];
};

// Elements of T in 16 bytes.
template <typename T>
constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// ---- math ----

constexpr float kSqrtHalf = 0.70710678118654752440f;    // 1 / sqrt(2)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kGeluTanhCubic = 0.044715f;

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * kSqrtHalf)); }
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x)));
}
// NaN stays NaN (PyTorch's relu does the same).
__device__ __forceinline__ float relu(float x) { return x < 0.0f ? 0.0f : x; }
// min(max(x, 0), 6), NaN staying NaN.
__device__ __forceinline__ float relu6(float x) { return x < 0.0f ? 0.0f : (x > 6.0f ? 6.0f : x); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// PyTorch's: x * min(1, max(0, x / 6 + 1 / 2)).
__device__ __forceinline__ float hard_swish(float x) { return x * fminf(1.0f, fmaxf(0.0f, x * (1.0f / 6.0f) + 0.5f)); }

// NaN-propagating max/min (NumPy's maximum/minimum, PyTorch's amax/amin): a NaN on either side wins.
__device__ __forceinline__ float max_nan(float a, float b) { return (isnan(a) || a > b) ? a : b; }
__device__ __forceinline__ float min_nan(float a, float b) { return (isnan(a) || a < b) ? a : b; }

// ---- reductions ----

// The combination of `v` over the kGroup threads of a group: an aligned part of a warp (kGroup 2 to 16, every
// lane of the warp calling), a warp (kGroup == 32) or the whole block (kGroup == blockDim.x, a multiple of 32).
// Every thread of the group gets the same bits: the butterfly pairs each lane with its partner in a commutative
// operation, and the per-warp results are combined in one fixed order. `smem` holds kGroup / 32 floats; it may be
// reused after the call (the call ends with a barrier), unless kReusable is false: a caller that alternates between
// two buffers needs no barrier to guard a buffer's reuse (layer_norm's Note [Streaming rows]). Block groups: every
// thread of the block must call it.
template <int kGroup, bool kReusable = true, typename Combine>
__device__ __forceinline__ float group_reduce(float v, Combine combine, float* smem) {
  static_assert(kGroup % 32 == 0 || 32 % kGroup == 0, "groups are whole warps or aligned parts of one");
  // Every lane of the warp takes part (a sub-warp group's warp runs its groups in step).
#pragma unroll
  for (int offset = kGroup < 32 ? kGroup / 2 : 16; offset > 0; offset >>= 1) {
    v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  if constexpr (kGroup > 32) {
    constexpr int kWarps = kGroup / 32;
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    v = smem[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = combine(v, smem[w]);
    if constexpr (kReusable) __syncthreads();
  }
  return v;
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Task `task` of a split of few long rows (RowSplit in cuda_raw_kernels.h: rows x splits tasks, row-major, chunks of
// `chunk` elements of rows of `cols`): its row and the [begin, end) of its chunk.
struct RowChunk {
  std::int64_t row;
  std::int64_t begin;
  std::int64_t end;
};
__device__ __forceinline__ RowChunk row_chunk(std::int64_t task, std::int64_t splits, std::int64_t chunk,
                                              std::int64_t cols) {
  const std::int64_t row = task / splits;
  const std::int64_t begin = (task - row * splits) * chunk;
  return {row, begin, begin + chunk < cols ? begin + chunk : cols};
}

// ---- strided indexing (Note [Coalesced geometry] in elementwise.cu) ----

// Note [Fast division]
// n / d for a divisor d fixed at launch, as a multiply-high, an add and a shift instead of the ~20 instructions
// of a 32-bit division (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994; the
// same scheme as PyTorch's IntDivider): with s the smallest shift where 2^s >= d and
// m = floor(2^32 * (2^s - d) / d) + 1 (< 2^32), n / d == (umulhi(n, m) + n) >> s for 1 <= d <= INT32_MAX and
// 0 <= n <= INT32_MAX (the sum cannot overflow 32 bits there).
struct FastDivider {
  std::uint32_t divisor = 1;
  std::uint32_t magic = 1;
  std::uint32_t shift = 0;

  FastDivider() = default;
  explicit FastDivider(std::int64_t d) : divisor(static_cast<std::uint32_t>(d)) {
    XPURT_INTERNAL_ASSERT(d >= 1 && d <= std::numeric_limits<std::int32_t>::max(), "FastDivider: divisor ", d);
    while ((std::uint64_t{1} << shift) < divisor) ++shift;
    magic = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << shift) - divisor)) /
                                       divisor + 1);
  }
  __device__ __forceinline__ std::int32_t div(std::int32_t n) const {
    const auto u = static_cast<std::uint32_t>(n);
    return static_cast<std::int32_t>((__umulhi(u, magic) + u) >> shift);
  }
  __device__ __forceinline__ std::int32_t value() const { return static_cast<std::int32_t>(divisor); }
};

// Maps a linear index over `sizes` (row-major) to an element offset per operand. Dimensions are stored
// innermost first so that the unrolled loop indexes the arrays statically (they stay in registers/param space).
template <int kArgs, typename Index>
struct OffsetCalculator {
  int rank = 0;
  Index sizes[kMaxDims] = {};
  Index strides[kArgs][kMaxDims] = {};

  __device__ __forceinline__ void offsets(Index linear, Index (&out)[kArgs]) const {
#pragma unroll
    for (int a = 0; a < kArgs; ++a) out[a] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == rank) break;
      Index index = linear;  // the outermost dimension takes the rest: no division
      if (d + 1 < rank) {
        const Index quotient = linear / sizes[d];
        index = linear - quotient * sizes[d];
        linear = quotient;
      }
#pragma unroll
      for (int a = 0; a < kArgs; ++a) out[a] += index * strides[a][d];
    }
  }
};

// `sizes` and each of `strides` outermost first (as tensors store them); at most kMaxDims dimensions.
template <int kArgs, typename Index>
OffsetCalculator<kArgs, Index> make_offset_calculator(const std::vector<std::int64_t>& sizes,
                                                      const std::vector<std::int64_t>* const (&strides)[kArgs]) {
  XPURT_INTERNAL_ASSERT(sizes.size() <= static_cast<std::size_t>(kMaxDims), "rank ", sizes.size());
  OffsetCalculator<kArgs, Index> calc;
  calc.rank = static_cast<int>(sizes.size());
  for (int d = 0; d < calc.rank; ++d) {
    const std::size_t from = sizes.size() - 1 - static_cast<std::size_t>(d);
    calc.sizes[d] = static_cast<Index>(sizes[from]);
    for (int a = 0; a < kArgs; ++a) calc.strides[a][d] = static_cast<Index>((*strides[a])[from]);
  }
  return calc;
}

// Whether `numel` elements and every offset a view of `sizes`/`strides` reaches fit in int32. The element count
// keeps a grid's worth of headroom so that `i += gridDim.x * blockDim.x` cannot overflow in a grid-stride loop.
inline bool fits_int32(std::int64_t numel, const std::vector<std::int64_t>& sizes,
                       const std::vector<const std::vector<std::int64_t>*>& strides) {
  constexpr std::int64_t kLimit = std::numeric_limits<std::int32_t>::max();
  if (numel > kLimit - kMaxBlocks * kThreads) return false;
  for (const auto* operand : strides) {
    std::int64_t extent = 0;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      const std::int64_t stride = (*operand)[d] < 0 ? -(*operand)[d] : (*operand)[d];
      if (stride > kLimit) return false;
      extent += (sizes[d] - 1) * stride;
      if (extent > kLimit) return false;
    }
  }
  return true;
}

// ---- elementwise ----

// y[i] = fn(x[i]) for n elements: 16-byte vectors when both pointers are 16-byte aligned, then a scalar tail
// (any n). `x == y` is allowed: each element is read and written by the same thread.
//
// Note [Unary loads in flight]
// On large tensors a thread loads kUnroll vectors (a block's stride apart, so that a warp's accesses stay contiguous)
// before it computes and stores any. With one vector per thread, erf GELU on 256 MiB of float16 ran at 67% of an
// H200's copy bandwidth: its math is long enough that the loads stopped overlapping it (a standalone run of the same
// math: 174 us with one vector per thread, 157 us with four, 153 us with eight, against a 129 us copy). Tensors
// below kUnaryUnrollFrom vectors keep one vector per thread, so that they still spread over every SM.
constexpr int kUnaryUnroll = 8;
constexpr std::int64_t kUnaryUnrollFrom = std::int64_t{1} << 21;

template <typename T, typename Fn, int kUnroll>
__global__ void __launch_bounds__(kThreads) unary_kernel(const T* x, T* y, std::int64_t n, bool vectorized, Fn fn) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vectorized) {
    constexpr int kVec = kVec16<T>;
    using V = Vec<T, kVec>;
    const std::int64_t vectors = n / kVec;
    const V* xv = reinterpret_cast<const V*>(x);
    V* yv = reinterpret_cast<V*>(y);
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; i < vectors;
         i += stride * kUnroll) {
      V in[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t j = i + static_cast<std::int64_t>(u) * blockDim.x;
        if (j < vectors) in[u] = xv[j];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t j = i + static_cast<std::int64_t>(u) * blockDim.x;
        if (j >= vectors) break;
        V out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) out.v[k] = from_float<T>(fn(to_float(in[u].v[k])));
        yv[j] = out;
      }
    }
    tail = vectors * kVec;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) y[i] = from_float<T>(fn(to_float(x[i])));
}

template <typename T, typename Fn>
void launch_unary(const void* x, void* y, std::int64_t n, Fn fn, void* stream) {
  if (n <= 0) return;
  const bool vectorized = is_aligned(x, 16) && is_aligned(y, 16);
  const std::int64_t vectors = n / kVec16<T>;
  const auto* xs = static_cast<const T*>(x);
  auto* ys = static_cast<T*>(y);
  if (vectorized && vectors >= kUnaryUnrollFrom) {  // Note [Unary loads in flight]
    const std::int64_t work = (vectors + kUnaryUnroll - 1) / kUnaryUnroll;
    unary_kernel<T, Fn, kUnaryUnroll>
        <<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(xs, ys, n, true, fn);
  } else {
    const std::int64_t work = vectorized ? std::max<std::int64_t>(vectors, n % kVec16<T>) : n;
    unary_kernel<T, Fn, 1><<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(xs, ys, n, vectorized, fn);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- launch helpers shared by the data kernels ----

// Calls body(E{}) with the unsigned integer type of `element_size` bytes (1, 2, 4 or 8): kernels that only move
// elements are instantiated per size, not per dtype.
template <typename Body>
void dispatch_element_size(std::size_t element_size, const char* what, Body&& body) {
  switch (element_size) {
    case 1: return body(std::uint8_t{});
    case 2: return body(std::uint16_t{});
    case 4: return body(std::uint32_t{});
    case 8: return body(std::uint64_t{});
    default: XPURT_INTERNAL_ASSERT(false, what, ": element size ", element_size);
  }
}

// The element of type E whose bits are the low sizeof(E) bytes of `bits` (a constant converted on the host).
template <typename E>
E element_of(std::uint64_t bits) {
  E value;
  std::memcpy(&value, &bits, sizeof(E));  // little-endian: the low bytes hold the element
  return value;
}

// Calls launch(n, calc) over a two-operand broadcast geometry, with 32-bit indices when they fit.
template <typename Launch>
void with_index_type(const BroadcastGeometry& g, Launch&& launch) {
  const std::vector<std::int64_t>* const table[2] = {&g.a_strides, &g.b_strides};
  if (fits_int32(g.numel(), g.shape, {&g.a_strides, &g.b_strides})) {
    launch(static_cast<std::int32_t>(g.numel()), make_offset_calculator<2, std::int32_t>(g.shape, table));
  } else {
    launch(g.numel(), make_offset_calculator<2, std::int64_t>(g.shape, table));
  }
}

}  // namespace xpuruntime::cuda_raw::detail
