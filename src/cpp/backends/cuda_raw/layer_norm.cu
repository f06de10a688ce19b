// Layer normalization over the trailing dimensions (x viewed as [rows, cols]). Rows of whole 16-byte vectors
// (every pointer 16-byte aligned, cols a multiple of the vector width, at most 512 * kMaxCachedVectors vectors)
// take the register-cached kernel: each thread loads its vectors once, and the statistics and the output come
// from registers (Note [Register-cached rows], Note [Streaming rows]). Other rows take the scalar kernel: a warp
// per row for short rows, a block per row for long ones.
//
// Note [Register-cached rows]
// A transformer's LayerNorm rows are short (768 to 8192 elements) and there are few of them at batch 1 (one per
// token), so the kernel is latency-bound: what counts is how many dependent trips to memory a row takes. Reading
// the row once into registers with 16-byte loads makes it one trip (the residual's, scale's and bias's loads are
// issued with it) instead of three passes of 2-byte loads; the group size grows with the row (4 to 16 lanes for
// at most two vectors per lane, a warp up to 4 vectors per lane, then 128, 256 or 512 threads) so that no thread
// holds more than kMaxCachedVectors vectors, and short rows (ConvNeXt's 96 channels) do not leave most of a warp
// idle. Groups of up to a warp run in blocks of one warp, which spreads few rows over many SMs.
//
// Note [Streaming rows]
// With many rows the kernel is bound by memory bandwidth instead (a [65536, 4096] float16 x is 512 MiB read and
// written), and what counts is how many bytes each SM keeps in flight. So:
// - The grid is persistent: at most as many blocks as the device holds at once (SMs x resident blocks per SM,
//   queried once per device and instantiation), each group looping over rows a grid's worth of groups apart.
// - A lane's columns are the same in every row, so it loads its vectors of scale and bias once, into registers,
//   rather than 2 x cols more elements per row from L1/L2. They stay packed as loaded and are converted where
//   used (opaque() keeps the compiler from hoisting the conversions out of the row loop into twice the registers).
// - A group issues its next row's loads (into a second register set, packed) as soon as it has converted the
//   current row to fp32, so that row is in flight during the current row's reductions and stores: a thread has a
//   row's loads outstanding nearly all the time, not only until its row's first reduction.
// - Each reduction takes one barrier: shuffles within warps, then one exchange of the warps' partial sums through
//   shared memory; the mean's and the variance's use separate buffers, so a buffer is rewritten only after the
//   other one's barrier, which every thread reaches after reading it.
// Registers bound the bytes in flight: a thread of a 4096-column float16 row holds 32 floats of its row, 16 words
// of the next and 32 of scale and bias; the launch bounds keep that within 96 registers, 5 blocks of 128 threads
// an SM with 64 bytes a thread in flight (128 registers and 512 threads with the residual or the addend). A missing
// scale or bias is held as 1 or -0, which leave every value's bits unchanged, so the output takes no branch on either.
//
// Note [Split layer norm]
// A row is one group's work, so few long rows (GroupNorm at batch 1 becomes a layer_norm of 32 rows, GroupNorm(1) of
// one: a whole feature map) ran on as many blocks as rows. When the rows are fewer than 264 (two blocks an SM) and
// longer than 32768 elements (past the cached kernel's rows), row_split_geometry (softmax.cu) cuts each row into chunks
// (at least 8192 elements, a multiple of 8): layer_norm_partials_kernel takes each chunk's mean and sum
// of squared deviations (two passes over the chunk, the second mostly from L1/L2: Note [Two-pass statistics]) into
// the workspace, then layer_norm_split_write_kernel has every chunk's block combine its row's pairs by Chan's formula
// (a pairwise tree in a fixed shape, each pair in a fixed order: every block of a row gets the same bits) and write
// its chunk, with the residual, scale, bias and addend. The quantized output keeps the row kernels.
//
// Note [Two-pass statistics]
// The mean is computed first, then the variance as the mean of (x - mean)^2, both accumulated in fp32 and
// combined by a fixed-order group reduction. Unlike E[x^2] - E[x]^2 this does not cancel catastrophically when
// |mean| >> std, and unlike Welford it needs no division per element; the price is one more pass over the row:
// over registers in the cached kernel, one more read of the row in the scalar kernel, which the L1/L2 caches
// mostly serve (rows there are at most a few hundred KiB).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include <cuda_fp8.h>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

constexpr std::int64_t kWarpRowMaxCols = 1024;
constexpr int kBlockGroup = 512;

// The byte of the quantized output for the stored value `v` (Note [Quantized layer norm output]): quantize_linear's
// arithmetic per tensor, the division in float32. Integers: round half to even, + the zero point, saturate, a NaN
// quotient the zero point. Float8: + 0 (the zero point: -0 becomes +0), cuda_fp8.h's round to nearest even with
// saturation to +-max, a NaN keeping its sign (cuda_fp8.h would drop it).
// The quotient is __fdiv_rn's, formed from the reciprocal with one Markstein correction where that is exact (the
// product a normal float or zero: Note [Per-tensor float8 quantization without a division] in quantize.cu).
__device__ __forceinline__ std::uint8_t quantized_byte(const LayerNormQuantized& q, float v) {
  float s;
  const float p = __fmul_rn(v, q.reciprocal);
  if (q.reciprocal != 0.0f && (v == 0.0f || (fabsf(p) >= FLT_MIN && fabsf(p) <= FLT_MAX))) {
    const float e = __fmaf_rn(-p, q.scale, v);
    s = e == 0.0f ? p : __fmaf_rn(e, q.reciprocal, p);
  } else {
    s = __fdiv_rn(v, q.scale);
  }
  switch (q.dtype) {
    case DType::kInt8:
    case DType::kUInt8: {
      const bool is_signed = q.dtype == DType::kInt8;
      const float r = isnan(s) ? q.zero_point : rintf(s) + q.zero_point;
      const float level = fminf(fmaxf(r, is_signed ? -128.0f : 0.0f), is_signed ? 127.0f : 255.0f);
      return static_cast<std::uint8_t>(static_cast<int>(level));
    }
    default:
      if (isnan(s)) return signbit(v) ? 0xFF : 0x7F;
      return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(
          s + 0.0f, __NV_SATFINITE, q.dtype == DType::kFloat8E5M2 ? __NV_E5M2 : __NV_E4M3));
  }
}

// One group of kGroup threads per row, grid-stride over rows (uniform per group, so barriers are reached by
// the whole block for block groups).
template <typename T, int kGroup, int kBlock>
__global__ void __launch_bounds__(kBlock) layer_norm_kernel(const T* x, const T* residual, const T* scale,
                                                            const T* bias, const T* addend, T* y, std::int64_t rows,
                                                            std::int64_t cols, float epsilon,
                                                            LayerNormQuantized quantized) {
  static_assert(kBlock % kGroup == 0, "whole groups per block");
  constexpr int kGroupsPerBlock = kBlock / kGroup;
  __shared__ float smem[kGroup / 32];
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const float n = static_cast<float>(cols);
  const std::int64_t group_stride = static_cast<std::int64_t>(gridDim.x) * kGroupsPerBlock;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kGroup; r < rows;
       r += group_stride) {
    const T* in = x + r * cols;
    const T* res = residual != nullptr ? residual + r * cols : nullptr;
    // The row's value: x, or x + residual summed in fp32 (not rounded to T in between, as a separate Add would).
    auto value = [&](std::int64_t c) { return res != nullptr ? to_float(in[c]) + to_float(res[c]) : to_float(in[c]); };
    float sum = 0.0f;
    for (std::int64_t c = lane; c < cols; c += kGroup) sum += value(c);
    const float mean = group_reduce<kGroup>(sum, SumOp{}, smem) / n;
    float squares = 0.0f;
    for (std::int64_t c = lane; c < cols; c += kGroup) {
      const float d = value(c) - mean;
      squares += d * d;
    }
    const float variance = group_reduce<kGroup>(squares, SumOp{}, smem) / n;
    const float rstd = 1.0f / sqrtf(variance + epsilon);
    T* out = y + r * cols;
    for (std::int64_t c = lane; c < cols; c += kGroup) {
      float v = (value(c) - mean) * rstd;
      if (scale != nullptr) v *= to_float(scale[c]);
      if (bias != nullptr) v += to_float(bias[c]);
      if (addend != nullptr) v += to_float(addend[r * cols + c]);
      out[c] = from_float<T>(v);
      if (quantized.y != nullptr) {
        static_cast<std::uint8_t*>(quantized.y)[r * cols + c] = quantized_byte(quantized, to_float(out[c]));
      }
    }
  }
}

// Vector slots per thread in the cached kernel (Note [Register-cached rows]): sub-warp groups take rows of at most
// two vectors a lane, warps and blocks rows of up to four.
constexpr int kSubWarpVectors = 2;
constexpr int kMaxCachedVectors = 4;
// Devices whose resident-grid size is cached (Note [Streaming rows]); others query it at every launch.
constexpr int kCachedDevices = 64;

// 16 bytes of a row, as the cached kernel holds them in registers: four 32-bit words.
struct alignas(16) Words {
  std::uint32_t w[4];
};

// The kVec16<T> elements of `v` as floats (exact). The 16-bit types go a pair (a word) at a time.
template <typename T>
__device__ __forceinline__ void unpack(const Words& v, float (&out)[kVec16<T>]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (std::is_same_v<T, float>) {
      out[j] = __uint_as_float(v.w[j]);
    } else if constexpr (std::is_same_v<T, __half>) {
      __half2 pair;
      std::memcpy(&pair, &v.w[j], sizeof(pair));
      const float2 f = __half22float2(pair);
      out[2 * j] = f.x;
      out[2 * j + 1] = f.y;
    } else {
      static_assert(std::is_same_v<T, __nv_bfloat16>, "cuda_raw stores float, __half or __nv_bfloat16");
      out[2 * j] = __uint_as_float(v.w[j] << 16);  // the low half holds the first element
      out[2 * j + 1] = __uint_as_float(v.w[j] & 0xffff0000u);
    }
  }
}

// `in` rounded to nearest into 16 bytes of T: one conversion instruction per pair for the 16-bit types (the same
// rounding as from_float).
template <typename T>
__device__ __forceinline__ Words pack(const float (&in)[kVec16<T>]) {
  Words v;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (std::is_same_v<T, float>) {
      v.w[j] = __float_as_uint(in[j]);
    } else if constexpr (std::is_same_v<T, __half>) {
      const __half2 pair = __floats2half2_rn(in[2 * j], in[2 * j + 1]);
      std::memcpy(&v.w[j], &pair, sizeof(pair));
    } else {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(in[2 * j], in[2 * j + 1]);
      std::memcpy(&v.w[j], &pair, sizeof(pair));
    }
  }
  return v;
}

// Every element of 16 bytes of T set to `value` (exactly representable in T).
template <typename T>
__device__ __forceinline__ Words splat(float value) {
  float values[kVec16<T>];
#pragma unroll
  for (int k = 0; k < kVec16<T>; ++k) values[k] = value;
  return pack<T>(values);
}

// Makes the compiler treat `v` as changed here (no instruction is emitted), so that conversions of v in a loop
// stay in the loop: the cached kernel's scale and bias words would otherwise be converted once, before the row
// loop, into twice as many float registers, which spill (Note [Streaming rows]).
__device__ __forceinline__ void opaque(Words& v) {
  asm volatile("" : "+r"(v.w[0]), "+r"(v.w[1]), "+r"(v.w[2]), "+r"(v.w[3]));
}

// The cached kernel's block: one warp for groups of up to a warp (a warp group's row index is then the block's,
// which takes fewer registers than four warps' rows a block), the group itself for larger ones.
template <int kGroup>
constexpr int kCachedBlock = kGroup < 32 ? 32 : kGroup;

// Blocks per SM that the cached kernel's launch bounds guarantee (Note [Streaming rows]): 640 threads of at most 96
// registers for blocks of 32 and 128 threads (512 threads of 128 registers with the residual's vectors in flight
// too); blocks of 256 and 512 threads get 128 registers.
template <int kGroup, bool kExtraRow>
constexpr int kCachedMinBlocks = std::max(1, (kExtraRow ? 512 : 640) / kCachedBlock<kGroup>);

// The quantized bytes of one stored vector (vector `index` of y), in one 8-byte (16-bit T) or 4-byte (float) store.
template <typename T>
__device__ __forceinline__ void store_quantized(const LayerNormQuantized& q, const Words& stored, std::int64_t index) {
  float values[kVec16<T>];
  unpack<T>(stored, values);
  std::uint8_t bytes[kVec16<T>];
#pragma unroll
  for (int k = 0; k < kVec16<T>; ++k) bytes[k] = quantized_byte(q, values[k]);
  if constexpr (kVec16<T> == 8) {
    uint2 word;
    std::memcpy(&word, bytes, sizeof(word));
    reinterpret_cast<uint2*>(q.y)[index] = word;
  } else {
    std::uint32_t word;
    std::memcpy(&word, bytes, sizeof(word));
    reinterpret_cast<std::uint32_t*>(q.y)[index] = word;
  }
}

// Groups of kGroup threads per row (32 / kGroup rows per block for sub-warp groups), each thread caching up to
// kSubWarpVectors or kMaxCachedVectors 16-byte vectors of the row: vector v of the row is held by lane v % kGroup.
// `vectors` = cols / kVec16<T>. Each group loops over rows gridDim.x * (rows per block) apart, with its lanes'
// scale and bias in registers and the next row's loads issued before the current row's reductions (Note
// [Streaming rows]). Every thread of a block runs the same row iterations (a group past the last row loads and
// stores nothing), so that sub-warp groups shuffle in whole warps and block groups reach every barrier.
template <typename T, int kGroup, bool kResidual, bool kAddend>
__global__ void __launch_bounds__(kCachedBlock<kGroup>, (kCachedMinBlocks<kGroup, kResidual || kAddend>))
    layer_norm_cached_kernel(const T* x, const T* residual, const T* scale, const T* bias, const T* addend, T* y,
                             std::int64_t rows, int vectors, float epsilon, LayerNormQuantized quantized) {
  constexpr int kVec = kVec16<T>;
  constexpr int kSlots = kGroup < 32 ? kSubWarpVectors : kMaxCachedVectors;
  constexpr int kGroupsPerBlock = kCachedBlock<kGroup> / kGroup;
  __shared__ float partials[2][kGroup > 32 ? kGroup / 32 : 1];  // [0]: the sums, [1]: the squares
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int group = static_cast<int>(threadIdx.x) / kGroup;
  const float n = static_cast<float>(vectors) * kVec;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kGroupsPerBlock;
  // A missing scale is 1 and a missing bias -0: x * 1 and x + -0 are x, signed zeros included.
  Words scales[kSlots];
  Words biases[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int v = lane + i * kGroup;
    scales[i] = scale != nullptr && v < vectors ? reinterpret_cast<const Words*>(scale)[v] : splat<T>(1.0f);
    biases[i] = bias != nullptr && v < vectors ? reinterpret_cast<const Words*>(bias)[v] : splat<T>(-0.0f);
  }
  // The group's next row, as loaded: x and, with kResidual, the residual.
  Words next[kSlots];
  Words next_residual[kResidual ? kSlots : 1];
  auto load_row = [&](std::int64_t r) {
    if (r >= rows) return;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const std::int64_t v = lane + i * kGroup;
      if (v < vectors) {
        next[i] = reinterpret_cast<const Words*>(x)[r * vectors + v];
        if constexpr (kResidual) next_residual[i] = reinterpret_cast<const Words*>(residual)[r * vectors + v];
      }
    }
  };
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kGroupsPerBlock;  // the block's first row
  load_row(first + group);
  for (std::int64_t base = first; base < rows; base += row_stride) {
    const std::int64_t r = base + group;
    const bool valid = r < rows;  // false for a group past the last row
    float values[kSlots][kVec];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      opaque(scales[i]);
      opaque(biases[i]);
      if (valid && lane + i * kGroup < vectors) {
        unpack<T>(next[i], values[i]);
        if constexpr (kResidual) {
          // x + residual summed in fp32 (not rounded to T in between, as a separate Add would).
          float added[kVec];
          unpack<T>(next_residual[i], added);
#pragma unroll
          for (int k = 0; k < kVec; ++k) values[i][k] += added[k];
        }
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum += values[i][k];
      }
    }
    // With kAddend, this row's addend: in flight during its reductions, added before the one rounding.
    Words adds[kAddend ? kSlots : 1];
    if constexpr (kAddend) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const std::int64_t v = lane + i * kGroup;
        if (valid && v < vectors) adds[i] = reinterpret_cast<const Words*>(addend)[r * vectors + v];
      }
    }
    load_row(r + row_stride);  // in flight during this row's reductions and stores
    const float mean = group_reduce<kGroup, false>(sum, SumOp{}, partials[0]) / n;
    float squares = 0.0f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (valid && lane + i * kGroup < vectors) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          values[i][k] -= mean;
          squares += values[i][k] * values[i][k];
        }
      }
    }
    const float variance = group_reduce<kGroup, false>(squares, SumOp{}, partials[1]) / n;
    const float rstd = rsqrtf(variance + epsilon);
    Words* out = reinterpret_cast<Words*>(y) + (valid ? r : 0) * vectors;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int v = lane + i * kGroup;
      if (valid && v < vectors) {
        float gains[kVec];
        float shifts[kVec];
        unpack<T>(scales[i], gains);
        unpack<T>(biases[i], shifts);
#pragma unroll
        for (int k = 0; k < kVec; ++k) values[i][k] = values[i][k] * rstd * gains[k] + shifts[k];
        if constexpr (kAddend) {
          float added[kVec];
          unpack<T>(adds[i], added);
#pragma unroll
          for (int k = 0; k < kVec; ++k) values[i][k] += added[k];
        }
        const Words stored = pack<T>(values[i]);
        out[v] = stored;
        if (quantized.y != nullptr) store_quantized<T>(quantized, stored, r * vectors + v);
      }
    }
  }
}

// Launches the cached kernel with a persistent grid: a block per 32 / kGroup rows (one for block groups), at most
// as many blocks as the current device holds at once (SMs x resident blocks per SM, queried once per device; Note
// [Streaming rows]).
template <typename T, int kGroup, bool kResidual, bool kAddend>
void launch_cached_kernel(const T* x, const T* residual, const T* scale, const T* bias, const T* addend, T* y,
                          std::int64_t rows, int vectors, float epsilon, const LayerNormQuantized& quantized,
                          cudaStream_t stream) {
  constexpr int kBlock = kCachedBlock<kGroup>;
  auto* kernel = &layer_norm_cached_kernel<T, kGroup, kResidual, kAddend>;
  static std::atomic<std::int64_t> resident_blocks[kCachedDevices];  // 0: not queried yet
  int device = 0;
  XPURT_CUDA_CHECK(cudaGetDevice(&device));
  std::int64_t resident = device < kCachedDevices ? resident_blocks[device].load(std::memory_order_relaxed) : 0;
  if (resident == 0) {
    int sms = 0;
    int per_sm = 0;
    XPURT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    XPURT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlock, 0));
    resident = std::max<std::int64_t>(1, std::int64_t{sms} * per_sm);
    if (device < kCachedDevices) resident_blocks[device].store(resident, std::memory_order_relaxed);
  }
  kernel<<<grid_for(rows, kBlock / kGroup, resident), kBlock, 0, stream>>>(x, residual, scale, bias, addend, y, rows,
                                                                           vectors, epsilon, quantized);
}

// The residual's and the addend's instantiations only when there is one: their vectors take registers (Note
// [Streaming rows]).
template <typename T, int kGroup>
void launch_cached_rows(const T* x, const T* residual, const T* scale, const T* bias, const T* addend, T* y,
                        std::int64_t rows, int vectors, float epsilon, const LayerNormQuantized& q,
                        cudaStream_t stream) {
  if (residual != nullptr && addend != nullptr) {
    launch_cached_kernel<T, kGroup, true, true>(x, residual, scale, bias, addend, y, rows, vectors, epsilon, q, stream);
  } else if (residual != nullptr) {
    launch_cached_kernel<T, kGroup, true, false>(x, residual, scale, bias, addend, y, rows, vectors, epsilon, q,
                                                 stream);
  } else if (addend != nullptr) {
    launch_cached_kernel<T, kGroup, false, true>(x, residual, scale, bias, addend, y, rows, vectors, epsilon, q,
                                                 stream);
  } else {
    launch_cached_kernel<T, kGroup, false, false>(x, residual, scale, bias, addend, y, rows, vectors, epsilon, q,
                                                  stream);
  }
}

// Launches the register-cached kernel when the row fits it (Note [Register-cached rows]); false otherwise.
template <typename T>
bool launch_cached(const T* x, const T* residual, const T* scale, const T* bias, const T* addend, T* y,
                   std::int64_t rows, std::int64_t cols, float epsilon, const LayerNormQuantized& q,
                   cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  if (cols % kVec != 0) return false;
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(residual),
                        static_cast<const void*>(scale), static_cast<const void*>(bias),
                        static_cast<const void*>(addend), static_cast<const void*>(y)}) {
    if (p != nullptr && !is_aligned(p, 16)) return false;
  }
  if (q.y != nullptr && !is_aligned(q.y, 16)) return false;
  const std::int64_t vectors = cols / kVec;
  const int v = static_cast<int>(vectors);
  // About two vectors per lane: ConvNeXt's rows of 96 channels (12 vectors) take 8 lanes, not a warp of which 20
  // lanes would idle.
  if (vectors <= 4 * kSubWarpVectors) {
    launch_cached_rows<T, 4>(x, residual, scale, bias, addend, y, rows, v, epsilon, q, stream);
  } else if (vectors <= 8 * kSubWarpVectors) {
    launch_cached_rows<T, 8>(x, residual, scale, bias, addend, y, rows, v, epsilon, q, stream);
  } else if (vectors <= 16 * kSubWarpVectors) {
    launch_cached_rows<T, 16>(x, residual, scale, bias, addend, y, rows, v, epsilon, q, stream);
  } else if (vectors <= 32 * kMaxCachedVectors) {
    launch_cached_rows<T, 32>(x, residual, scale, bias, addend, y, rows, v, epsilon, q, stream);
  } else if (vectors <= 128 * kMaxCachedVectors) {
    launch_cached_rows<T, 128>(x, residual, scale, bias, addend, y, rows, v, epsilon, q, stream);
  } else if (vectors <= 256 * kMaxCachedVectors) {
    launch_cached_rows<T, 256>(x, residual, scale, bias, addend, y, rows, v, epsilon, q, stream);
  } else if (vectors <= 512 * kMaxCachedVectors) {
    launch_cached_rows<T, 512>(x, residual, scale, bias, addend, y, rows, v, epsilon, q, stream);
  } else {
    return false;
  }
  return true;
}

// ---- few long rows (Note [Split layer norm]) ----

// A chunk's (or chunks') element count, mean and sum of squared deviations.
struct Moments {
  float n;
  float mean;
  float m2;
};

// Chan et al.'s combination of two sets' moments; `a` is the set of lower indices (the order fixes the bits).
__device__ __forceinline__ Moments combine_moments(const Moments& a, const Moments& b) {
  if (b.n == 0.0f) return a;
  if (a.n == 0.0f) return b;
  const float n = a.n + b.n;
  const float d = b.mean - a.mean;
  const float f = b.n / n;
  return {n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f};
}

// The block's moments combined: pairs of neighbouring lanes, then of neighbouring pairs, ... (each lane of a pair
// combines them in the same order, so the whole warp ends with the same bits), then the warps in order.
__device__ Moments block_moments(Moments v, float* smem) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const Moments other{__shfl_xor_sync(0xffffffffu, v.n, offset), __shfl_xor_sync(0xffffffffu, v.mean, offset),
                        __shfl_xor_sync(0xffffffffu, v.m2, offset)};
    v = (lane & offset) != 0 ? combine_moments(other, v) : combine_moments(v, other);
  }
  constexpr int kWarps = kBlockGroup / 32;
  if (lane == 0) {
    smem[threadIdx.x / 32] = v.n;
    smem[kWarps + threadIdx.x / 32] = v.mean;
    smem[2 * kWarps + threadIdx.x / 32] = v.m2;
  }
  __syncthreads();
  v = {smem[0], smem[kWarps], smem[2 * kWarps]};
  for (int w = 1; w < kWarps; ++w) v = combine_moments(v, {smem[w], smem[kWarps + w], smem[2 * kWarps + w]});
  __syncthreads();
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kBlockGroup)
    layer_norm_partials_kernel(const T* x, const T* residual, float2* partials, std::int64_t tasks,
                               std::int64_t cols, std::int64_t chunk, std::int64_t splits) {
  __shared__ float smem[kBlockGroup / 32];
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const auto [row, begin, end] = row_chunk(task, splits, chunk, cols);
    const T* in = x + row * cols;
    const T* res = residual != nullptr ? residual + row * cols : nullptr;
    auto value = [&](std::int64_t c) { return res != nullptr ? to_float(in[c]) + to_float(res[c]) : to_float(in[c]); };
    float sum = 0.0f;
    for (std::int64_t c = begin + threadIdx.x; c < end; c += kBlockGroup) sum += value(c);
    const float mean = group_reduce<kBlockGroup>(sum, SumOp{}, smem) / static_cast<float>(end - begin);
    float squares = 0.0f;
    for (std::int64_t c = begin + threadIdx.x; c < end; c += kBlockGroup) {
      const float d = value(c) - mean;
      squares += d * d;
    }
    squares = group_reduce<kBlockGroup>(squares, SumOp{}, smem);
    if (threadIdx.x == 0) partials[task] = make_float2(mean, squares);
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockGroup)
    layer_norm_split_write_kernel(const T* x, const T* residual, const T* scale, const T* bias, const T* addend, T* y,
                                  const float2* partials, std::int64_t tasks, std::int64_t cols, std::int64_t chunk,
                                  std::int64_t splits, float epsilon) {
  __shared__ float smem[3 * (kBlockGroup / 32)];
  for (std::int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const auto [row, begin, end] = row_chunk(task, splits, chunk, cols);
    // Lane k of the block holds chunks k, k + kBlockGroup, ... combined in order (splits <= kBlockGroup in practice).
    Moments v{0.0f, 0.0f, 0.0f};
    for (std::int64_t k = threadIdx.x; k < splits; k += kBlockGroup) {
      const float2 p = partials[row * splits + k];
      const std::int64_t size = std::min(chunk, cols - k * chunk);
      v = combine_moments(v, {static_cast<float>(size), p.x, p.y});
    }
    v = block_moments(v, smem);
    const float rstd = rsqrtf(v.m2 / static_cast<float>(cols) + epsilon);
    const std::int64_t base = row * cols;
    for (std::int64_t c = begin + threadIdx.x; c < end; c += kBlockGroup) {
      const float value = residual != nullptr ? to_float(x[base + c]) + to_float(residual[base + c])
                                              : to_float(x[base + c]);
      float out = (value - v.mean) * rstd;
      if (scale != nullptr) out *= to_float(scale[c]);
      if (bias != nullptr) out += to_float(bias[c]);
      if (addend != nullptr) out += to_float(addend[base + c]);
      y[base + c] = from_float<T>(out);
    }
  }
}

}  // namespace

void layer_norm_split(const void* x, const void* residual, const void* scale, const void* bias, const void* addend,
                      void* y, DType dtype, const RowSplit& g, float epsilon, void* workspace, void* stream) {
  if (g.splits <= 1) {
    layer_norm(x, residual, scale, bias, addend, y, dtype, g.rows, g.cols, epsilon, stream);
    return;
  }
  XPURT_CHECK(workspace != nullptr, "cuda_raw::layer_norm_split: the plan needs ", g.workspace_bytes(),
              " bytes of workspace, but none was given");
  auto* partials = static_cast<float2*>(workspace);
  const std::int64_t tasks = g.rows * g.splits;
  dispatch_float(dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    const auto* residuals = static_cast<const T*>(residual);
    layer_norm_partials_kernel<T><<<grid_for(tasks, 1), kBlockGroup, 0, as_stream(stream)>>>(
        xs, residuals, partials, tasks, g.cols, g.chunk, g.splits);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    layer_norm_split_write_kernel<T><<<grid_for(tasks, 1), kBlockGroup, 0, as_stream(stream)>>>(
        xs, residuals, static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<const T*>(addend),
        static_cast<T*>(y), partials, tasks, g.cols, g.chunk, g.splits, epsilon);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

void layer_norm(const void* x, const void* residual, const void* scale, const void* bias, const void* addend, void* y,
                DType dtype, std::int64_t rows, std::int64_t cols, float epsilon, void* stream,
                const LayerNormQuantized& quantized_in) {
  if (rows <= 0 || cols <= 0) return;
  LayerNormQuantized quantized = quantized_in;
  const float reciprocal = 1.0f / quantized.scale;
  quantized.reciprocal = std::isnormal(quantized.scale) && std::isnormal(reciprocal) ? reciprocal : 0.0f;
  dispatch_float(dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    const auto* residuals = static_cast<const T*>(residual);
    const auto* scales = static_cast<const T*>(scale);
    const auto* biases = static_cast<const T*>(bias);
    const auto* addends = static_cast<const T*>(addend);
    auto* ys = static_cast<T*>(y);
    if (launch_cached(xs, residuals, scales, biases, addends, ys, rows, cols, epsilon, quantized, as_stream(stream))) {
      // register-cached rows
    } else if (cols <= kWarpRowMaxCols) {
      layer_norm_kernel<T, 32, kThreads><<<grid_for(rows, kThreads / 32), kThreads, 0, as_stream(stream)>>>(
          xs, residuals, scales, biases, addends, ys, rows, cols, epsilon, quantized);
    } else {
      layer_norm_kernel<T, kBlockGroup, kBlockGroup><<<grid_for(rows, 1), kBlockGroup, 0, as_stream(stream)>>>(
          xs, residuals, scales, biases, addends, ys, rows, cols, epsilon, quantized);
    }
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
