// The int8 GEMM pieces of the cuda_raw backend (Note [Quantized registry ops] in core/op_schemas.cpp): the epilogue
// that turns an int32 accumulator into qlinear's / qconv2d's output (quantized_epilogue, through the device kernels
// table for the library GEMMs), the per-run operands of that epilogue (quantized_prologue), and the dp4a kernel of
// qlinear with its epilogue fused (qlinear_dp4a, the fallback for the GEMMs cuBLASLt refuses). Every one rounds as the
// cpu kernel does (quant_epilogue.cuh), so the GPU results equal the cpu kernel's bit for bit.
#include <cstdint>
#include <type_traits>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "backends/cuda_raw/quant_epilogue.cuh"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// ---- the epilogue ----

// out[i] from acc[i] for `count` elements; channel (i / inner) % channels, with 32-bit index math (FastDivider).
__global__ void quantized_epilogue_kernel32(const std::int32_t* acc, void* out, std::int32_t count,
                                            FastDivider inner, FastDivider channels, QuantEpilogueParams p) {
  const std::int32_t stride = static_cast<std::int32_t>(blockDim.x * gridDim.x);
  for (std::int32_t i = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x); i < count; i += stride) {
    const std::int32_t outer = inner.value() == 1 ? i : inner.div(i);
    const std::int32_t c = outer - channels.div(outer) * channels.value();
    quantized_store(p, out, i, acc[i], c);
  }
}

// Note [The epilogue pass in rows of four]
// After a library GEMM (cuBLASLt's int32 sums) the epilogue is a pass over memory whose floor is the int32 read:
// [2048, 768] took 10 us on an H200 (2026-12-02, BERT-base batch 16, 72 launches a run, 0.7 ms of its 3.3 ms) one
// element per thread, the output dtype switched per element and quantized_level's __fdiv_rn on its slow path for every
// zero. Where the channel is the innermost dimension (inner == 1, a GEMM's [M, N] output), N is a multiple of 4 and the
// pointers are aligned, each thread takes four consecutive outputs of one row: one 16-byte load of sums, the four
// channels' operands, one store; the output dtype is a template argument and 8-bit levels come from a Requantizer
// made once per thread (Note [Requantization without a division]), which gives quantized_level's levels.
template <DType kOut>
__device__ __forceinline__ void store_four(const QuantEpilogueParams& p, const Requantizer& r, void* out,
                                           std::int32_t v, int4 sums, std::int32_t c) {
  const std::int32_t acc[4] = {sums.x, sums.y, sums.z, sums.w};
  if constexpr (kOut == DType::kInt32) {
    int4 raw;
    raw.x = quantized_raw(p, acc[0], c);
    raw.y = quantized_raw(p, acc[1], c + 1);
    raw.z = quantized_raw(p, acc[2], c + 2);
    raw.w = quantized_raw(p, acc[3], c + 3);
    static_cast<int4*>(out)[v] = raw;
  } else if constexpr (kOut == DType::kFloat32) {
    float4 real;
    real.x = quantized_real(p, acc[0], c);
    real.y = quantized_real(p, acc[1], c + 1);
    real.z = quantized_real(p, acc[2], c + 2);
    real.w = quantized_real(p, acc[3], c + 3);
    static_cast<float4*>(out)[v] = real;
  } else if constexpr (kOut == DType::kFloat16) {
    Vec<__half, 4> half;
#pragma unroll
    for (int e = 0; e < 4; ++e) half.v[e] = __float2half_rn(quantized_real(p, acc[e], c + e));
    static_cast<Vec<__half, 4>*>(out)[v] = half;
  } else {
    static_assert(kOut == DType::kInt8 || kOut == DType::kUInt8, "the int8 ops write int32, float, int8 or uint8");
    constexpr float kLo = kOut == DType::kInt8 ? -128.0f : 0.0f, kHi = kOut == DType::kInt8 ? 127.0f : 255.0f;
    std::uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float real = quantized_real(p, acc[e], c + e);
      const int level = r.fast ? requantized_int(r, real) : static_cast<int>(quantized_level(p, real, kLo, kHi));
      word |= (static_cast<std::uint32_t>(level) & 0xffu) << (8 * e);
    }
    static_cast<std::uint32_t*>(out)[v] = word;
  }
}

template <DType kOut>
__global__ void quantized_epilogue_rows_kernel(const int4* acc, void* out, std::int32_t vectors,
                                               FastDivider channel_vectors, QuantEpilogueParams p) {
  // relu = false: quantized_real has applied it, and a Requantizer's level of 0 is the zero point either way.
  const Requantizer r = requantizer(p.y_scale, p.y_zero_point, kOut == DType::kInt8);
  const std::int32_t stride = static_cast<std::int32_t>(blockDim.x * gridDim.x);
  for (std::int32_t v = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x); v < vectors; v += stride) {
    const std::int32_t row = channel_vectors.div(v);
    const std::int32_t c = (v - row * channel_vectors.value()) * 4;
    store_four<kOut>(p, r, out, v, acc[v], c);
  }
}

template <DType kOut>
void launch_epilogue_rows(const std::int32_t* acc, void* out, std::int64_t count, std::int64_t channels,
                          const QuantEpilogueParams& params, void* stream) {
  const std::int64_t vectors = count / 4;
  quantized_epilogue_rows_kernel<kOut><<<grid_for(vectors, kThreads), kThreads, 0, as_stream(stream)>>>(
      reinterpret_cast<const int4*>(acc), out, static_cast<std::int32_t>(vectors), FastDivider(channels / 4), params);
}

__global__ void quantized_epilogue_kernel64(const std::int32_t* acc, void* out, std::int64_t count,
                                            std::int64_t inner, std::int64_t channels, QuantEpilogueParams p) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    quantized_store(p, out, i, acc[i], (i / inner) % channels);
  }
}

// Throws, before anything is enqueued, for params that break QuantEpilogueParams' contract.
void check_quantized_epilogue(const QuantEpilogueParams& params, const char* who) {
  switch (params.out_dtype) {
    case DType::kInt32:
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kInt8:
    case DType::kUInt8:
      break;
    default:
      throw UnsupportedOperationError(::xpuruntime::detail::str_cat(
          who, ": the int8 ops' epilogue writes int32, float32, float16, int8 or uint8, got ",
          dtype_name(params.out_dtype)));
  }
  XPURT_CHECK(params.out_dtype == DType::kInt32 || params.alpha != nullptr, who,
              ": an epilogue with output ", dtype_name(params.out_dtype), " needs alpha");
  XPURT_CHECK(params.x_zero_point == nullptr || params.w_col_sums != nullptr, who,
              ": a run-time x_zero_point needs the weight's column sums (w_col_sums)");
  XPURT_CHECK(params.y_scale > 0.0f, who, ": y_scale must be > 0, got ", params.y_scale);
}

// ---- the prologue (QuantPrologueParams in core/device_kernels.h) ----

constexpr int kColumnsPerWarpBlock = kThreads / 32;  // one warp per column of an [N, K] weight

// The sum of the four int8 lanes of `word`.
__device__ __forceinline__ std::int32_t byte_sum(std::int32_t word) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
  return __dp4a(word, 0x01010101, 0);
#else
  return static_cast<std::int8_t>(word) + static_cast<std::int8_t>(word >> 8) + static_cast<std::int8_t>(word >> 16) +
         static_cast<std::int8_t>(word >> 24);
#endif
}

// alpha[c] and int_bias[c] of column c, its column sum `sum` (0 when not read).
__device__ __forceinline__ void finish_column(const QuantPrologueParams& p, std::int64_t c, std::uint32_t sum) {
  if (p.alpha != nullptr && (p.alpha_per_channel || c == 0)) {
    const float scale = p.w_scale != nullptr ? p.w_scale[p.alpha_per_channel ? c : 0] : 1.0f;
    p.alpha[c] = __double2float_rn(__dmul_rn(static_cast<double>(p.x_scale), static_cast<double>(scale)));
  }
  if (p.int_bias != nullptr) {
    std::uint32_t b = p.bias != nullptr ? static_cast<std::uint32_t>(p.bias[c]) : 0u;
    b += static_cast<std::uint32_t>(p.zero_point_correction) * sum;
    if (p.x_zero_point != nullptr) {
      const std::int32_t zp = p.x_zero_point_signed ? *static_cast<const std::int8_t*>(p.x_zero_point)
                                                    : *static_cast<const std::uint8_t*>(p.x_zero_point);
      b -= static_cast<std::uint32_t>(zp) * sum;
    }
    p.int_bias[c] = static_cast<std::int32_t>(b);
  }
}

// Blocks [0, column_blocks) make the columns' operands: with `warp_columns` one warp per column of an [N, K] weight
// (its row, read in 4-byte words when `weight_words`), else one thread per column (a [K, N] weight read down its
// column, coalesced across the threads). The other blocks write x ^ 0x80 (16 bytes at a time when `x_vectors`).
__global__ void quantized_prologue_kernel(QuantPrologueParams p, std::int64_t channels, bool sums, bool warp_columns,
                                          bool weight_words, unsigned column_blocks, bool x_vectors) {
  if (blockIdx.x < column_blocks) {
    if (warp_columns) {
      const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColumnsPerWarpBlock + threadIdx.x / 32;
      const int lane = static_cast<int>(threadIdx.x & 31);
      if (c >= channels) return;  // the whole warp
      const std::int8_t* row = p.weight + c * p.k;
      std::uint32_t sum = 0;
      if (weight_words) {
        const auto* words = reinterpret_cast<const std::int32_t*>(row);
        for (std::int64_t j = lane; j < p.k / 4; j += 32) sum += static_cast<std::uint32_t>(byte_sum(words[j]));
      } else {
        for (std::int64_t j = lane; j < p.k; j += 32) sum += static_cast<std::uint32_t>(row[j]);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) finish_column(p, c, sum);
      return;
    }
    const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    std::uint32_t sum = 0;
    if (sums) {
      for (std::int64_t j = 0; j < p.k; ++j) sum += static_cast<std::uint32_t>(p.weight[j * channels + c]);
    }
    finish_column(p, c, sum);
    return;
  }
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x - column_blocks) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x - column_blocks) * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (x_vectors) {
    const std::int64_t vectors = p.x_count / 16;
    for (std::int64_t i = first; i < vectors; i += stride) {
      uint4 v = reinterpret_cast<const uint4*>(p.x)[i];
      v.x ^= 0x80808080u;
      v.y ^= 0x80808080u;
      v.z ^= 0x80808080u;
      v.w ^= 0x80808080u;
      reinterpret_cast<uint4*>(p.x_signed)[i] = v;
    }
    done = vectors * 16;
  }
  for (std::int64_t i = done + first; i < p.x_count; i += stride) {
    p.x_signed[i] = static_cast<std::int8_t>(p.x[i] ^ 0x80u);
  }
}

// ---- the dp4a GEMM (Note [The dp4a kernel of qlinear]) ----
//
// Note [The dp4a kernel of qlinear]
// The kernel of qlinear for what cuBLASLt refuses (K or N not a multiple of 4, misaligned operands, a [K, N] weight,
// K past 131071, devices without IMMA): each block computes a 64 x 64 tile of y with 256 threads, 4 x 4 outputs a
// thread, stepping K by 64 bytes: both operands' tiles go to shared memory as 32-bit words of 4 consecutive k (x and
// an [N, K] weight read a word at a time when K % 4 == 0 and the pointer is 4-byte aligned, else byte by byte; a
// [K, N] weight byte by byte down its columns, coalesced across the threads), past-the-end bytes 0, the next tile
// loaded into registers while this one is multiplied. __dp4a adds four int8 products into an int32 that wraps, as
// the cpu kernel's accumulator does; a uint8 x is x ^ 0x80 on load (Note [Signed operands of the int8 GEMMs]) and
// the epilogue (quant_epilogue.cuh) is applied to the accumulators in registers.

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileWords = 16;  // 64 bytes of K per step
constexpr int kTilePad = 4;     // words: keeps each row 16-byte aligned, 2-way bank conflicts on the stores
constexpr int kTileLoads = kTileM * kTileWords / kThreads;  // words each thread loads per operand and step

__device__ __forceinline__ std::int32_t dot4(std::int32_t a, std::int32_t b, std::int32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
  return __dp4a(a, b, c);
#else
  std::uint32_t sum = static_cast<std::uint32_t>(c);
  for (int i = 0; i < 4; ++i) {
    sum += static_cast<std::uint32_t>(static_cast<std::int8_t>(a >> (8 * i)) * static_cast<std::int8_t>(b >> (8 * i)));
  }
  return static_cast<std::int32_t>(sum);
#endif
}

struct Dp4aOperands {
  const std::uint8_t* x = nullptr;
  const std::uint8_t* w = nullptr;
  std::int64_t m = 0, n = 0, k = 0;
  bool x_words = false;      // x read 4 bytes at a time
  bool w_words = false;      // an [N, K] weight read 4 bytes at a time
  std::uint32_t x_flip = 0;  // 0x80808080 for a uint8 x
};

// The word of bytes [kk, kk + 4) of row `row` of a K-contiguous [rows, K] operand, each byte ^ flip, 0 past the end.
__device__ __forceinline__ std::int32_t row_word(const std::uint8_t* base, std::int64_t rows, std::int64_t k,
                                                 std::int64_t row, std::int64_t kk, bool words, std::uint32_t flip) {
  if (row >= rows || kk >= k) return 0;
  const std::uint8_t* at = base + row * k + kk;
  if (words) return static_cast<std::int32_t>(*reinterpret_cast<const std::uint32_t*>(at) ^ flip);
  std::uint32_t v = 0;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    if (kk + b < k) v |= static_cast<std::uint32_t>(at[b] ^ (flip & 0xffu)) << (8 * b);
  }
  return static_cast<std::int32_t>(v);
}

// The word of bytes w[kk .. kk + 3, col] of a [K, N] weight, 0 past the end.
__device__ __forceinline__ std::int32_t column_word(const std::uint8_t* w, std::int64_t n, std::int64_t k,
                                                    std::int64_t col, std::int64_t kk) {
  if (col >= n) return 0;
  std::uint32_t v = 0;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    if (kk + b < k) v |= static_cast<std::uint32_t>(w[(kk + b) * n + col]) << (8 * b);
  }
  return static_cast<std::int32_t>(v);
}

template <bool kWeightNk, DType kOut>
__global__ void __launch_bounds__(kThreads) qlinear_dp4a_kernel(Dp4aOperands o, void* out, QuantEpilogueParams p) {
  __shared__ alignas(16) std::int32_t xs[kTileWords][kTileM + kTilePad];
  __shared__ alignas(16) std::int32_t ws[kTileWords][kTileN + kTilePad];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16;
  const int ty = tid / 16;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.x) * kTileM;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.y) * kTileN;
  std::int32_t acc[4][4] = {};
  std::int32_t xr[kTileLoads];
  std::int32_t wr[kTileLoads];
  auto load = [&](std::int64_t k0) {
#pragma unroll
    for (int r = 0; r < kTileLoads; ++r) {
      const int idx = tid + kThreads * r;
      xr[r] = row_word(o.x, o.m, o.k, m0 + idx / kTileWords, k0 + 4 * (idx % kTileWords), o.x_words, o.x_flip);
      if constexpr (kWeightNk) {
        wr[r] = row_word(o.w, o.n, o.k, n0 + idx / kTileWords, k0 + 4 * (idx % kTileWords), o.w_words, 0u);
      } else {
        wr[r] = column_word(o.w, o.n, o.k, n0 + idx % kTileN, k0 + 4 * (idx / kTileN));
      }
    }
  };
  load(0);
  for (std::int64_t k0 = 0; k0 < o.k; k0 += 4 * kTileWords) {
#pragma unroll
    for (int r = 0; r < kTileLoads; ++r) {
      const int idx = tid + kThreads * r;
      xs[idx % kTileWords][idx / kTileWords] = xr[r];
      if constexpr (kWeightNk) {
        ws[idx % kTileWords][idx / kTileWords] = wr[r];
      } else {
        ws[idx / kTileN][idx % kTileN] = wr[r];
      }
    }
    __syncthreads();
    if (k0 + 4 * kTileWords < o.k) load(k0 + 4 * kTileWords);
#pragma unroll
    for (int word = 0; word < kTileWords; ++word) {
      const int4 a = *reinterpret_cast<const int4*>(&xs[word][ty * 4]);
      const int4 b = *reinterpret_cast<const int4*>(&ws[word][tx * 4]);
      const std::int32_t av[4] = {a.x, a.y, a.z, a.w};
      const std::int32_t bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = dot4(av[i], bv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t row = m0 + ty * 4 + i;
    if (row >= o.m) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t col = n0 + tx * 4 + j;
      if (col < o.n) quantized_store_as<kOut>(p, out, row * o.n + col, acc[i][j], col);
    }
  }
}

}  // namespace

void qlinear_dp4a(const QLinearDp4a& args, void* stream) {
  check_quantized_epilogue(args.epilogue, "cuda_raw::qlinear_dp4a");
  XPURT_CHECK(args.m >= 0 && args.n >= 0 && args.k >= 0, "cuda_raw::qlinear_dp4a: m ", args.m, ", n ", args.n,
              " and k ", args.k, " must be >= 0");
  if (args.m == 0 || args.n == 0) return;
  const std::int64_t row_tiles = (args.m + kTileM - 1) / kTileM;
  const std::int64_t column_tiles = (args.n + kTileN - 1) / kTileN;
  XPURT_CHECK(row_tiles <= std::numeric_limits<std::int32_t>::max() && column_tiles <= 65535,
              "cuda_raw::qlinear_dp4a: ", args.m, " x ", args.n, " outputs take more tiles than one grid holds");
  Dp4aOperands o;
  o.x = static_cast<const std::uint8_t*>(args.x);
  o.w = reinterpret_cast<const std::uint8_t*>(args.weight);
  o.m = args.m;
  o.n = args.n;
  o.k = args.k;
  o.x_words = args.k % 4 == 0 && is_aligned(args.x, 4);
  o.w_words = args.weight_nk && args.k % 4 == 0 && is_aligned(args.weight, 4);
  o.x_flip = args.x_unsigned ? 0x80808080u : 0u;
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(column_tiles));
  const auto launch = [&](auto nk, auto out_dtype) {
    qlinear_dp4a_kernel<decltype(nk)::value, decltype(out_dtype)::value>
        <<<grid, kThreads, 0, as_stream(stream)>>>(o, args.out, args.epilogue);
  };
  const auto with_layout = [&](auto out_dtype) {
    if (args.weight_nk) {
      launch(std::true_type{}, out_dtype);
    } else {
      launch(std::false_type{}, out_dtype);
    }
  };
  switch (args.epilogue.out_dtype) {
    case DType::kInt32: with_layout(std::integral_constant<DType, DType::kInt32>{}); break;
    case DType::kFloat32: with_layout(std::integral_constant<DType, DType::kFloat32>{}); break;
    case DType::kFloat16: with_layout(std::integral_constant<DType, DType::kFloat16>{}); break;
    case DType::kInt8: with_layout(std::integral_constant<DType, DType::kInt8>{}); break;
    default: with_layout(std::integral_constant<DType, DType::kUInt8>{}); break;  // checked above
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

void quantized_prologue(const QuantPrologueParams& params, std::int64_t channels, void* stream) {
  const bool columns = params.alpha != nullptr || params.int_bias != nullptr;
  const bool sums = params.int_bias != nullptr && (params.zero_point_correction != 0 || params.x_zero_point != nullptr);
  XPURT_CHECK(channels >= 0 && params.k >= 0 && params.x_count >= 0, "cuda_raw::quantized_prologue: channels ",
              channels, ", k ", params.k, " and x_count ", params.x_count, " must be >= 0");
  XPURT_CHECK(!sums || params.weight != nullptr || params.k == 0,
              "cuda_raw::quantized_prologue: folding a zero point needs the weight");
  XPURT_CHECK((params.x == nullptr) == (params.x_signed == nullptr),
              "cuda_raw::quantized_prologue: x and x_signed are given together");
  const bool warp_columns = sums && params.weight_nk && params.k > 0;
  // Without a bias to make, a per-tensor alpha is the one column's work.
  const std::int64_t columns_made =
      params.int_bias == nullptr && !params.alpha_per_channel ? std::min<std::int64_t>(channels, 1) : channels;
  unsigned column_blocks = 0;
  if (columns && columns_made > 0) {
    const std::int64_t per_block = warp_columns ? kColumnsPerWarpBlock : kThreads;
    const std::int64_t blocks = (columns_made + per_block - 1) / per_block;
    XPURT_CHECK(blocks < (std::int64_t{1} << 30), "cuda_raw::quantized_prologue: ", channels, " channels are too many");
    column_blocks = static_cast<unsigned>(blocks);
  }
  const bool flip = params.x_signed != nullptr && params.x_count > 0;
  const bool x_vectors = flip && is_aligned(params.x, 16) && is_aligned(params.x_signed, 16);
  const unsigned flip_blocks = flip ? grid_for(x_vectors ? params.x_count / 16 + 1 : params.x_count, kThreads) : 0;
  if (column_blocks + flip_blocks == 0) return;
  const bool weight_words = warp_columns && params.k % 4 == 0 && is_aligned(params.weight, 4);
  quantized_prologue_kernel<<<column_blocks + flip_blocks, kThreads, 0, as_stream(stream)>>>(
      params, columns_made, sums, warp_columns, weight_words, column_blocks, x_vectors);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

void quantized_epilogue(const std::int32_t* acc, void* out, std::int64_t count, std::int64_t channels,
                        std::int64_t inner, const QuantEpilogueParams& params, void* stream) {
  check_quantized_epilogue(params, "cuda_raw::quantized_epilogue");
  XPURT_CHECK(count >= 0 && channels >= 1 && inner >= 1, "cuda_raw::quantized_epilogue: count ", count,
              ", channels ", channels, " and inner ", inner, " must be >= 0, >= 1 and >= 1");
  if (count == 0) return;
  const unsigned blocks = grid_for(count, kThreads);
  const std::size_t out_bytes = dtype_size(params.out_dtype);
  if (inner == 1 && channels % 4 == 0 && count % channels == 0 && count <= std::numeric_limits<std::int32_t>::max() &&
      is_aligned(acc, 16) && is_aligned(out, 4 * out_bytes)) {
    switch (params.out_dtype) {  // Note [The epilogue pass in rows of four]
      case DType::kInt32: launch_epilogue_rows<DType::kInt32>(acc, out, count, channels, params, stream); break;
      case DType::kFloat32: launch_epilogue_rows<DType::kFloat32>(acc, out, count, channels, params, stream); break;
      case DType::kFloat16: launch_epilogue_rows<DType::kFloat16>(acc, out, count, channels, params, stream); break;
      case DType::kInt8: launch_epilogue_rows<DType::kInt8>(acc, out, count, channels, params, stream); break;
      default: launch_epilogue_rows<DType::kUInt8>(acc, out, count, channels, params, stream); break;
    }
  } else if (count <= std::numeric_limits<std::int32_t>::max()) {
    // inner and channels beyond the count never divide anything but 0: clamp them into the divider's range.
    quantized_epilogue_kernel32<<<blocks, kThreads, 0, as_stream(stream)>>>(
        acc, out, static_cast<std::int32_t>(count), FastDivider(std::min(inner, count)),
        FastDivider(std::min(channels, count)), params);
  } else {
    quantized_epilogue_kernel64<<<blocks, kThreads, 0, as_stream(stream)>>>(acc, out, count, inner, channels, params);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace xpuruntime::cuda_raw
