// qlinear's int8 GEMM on Hopper's warpgroup tensor cores (wgmma), the requantizing epilogue in registers (Note [int8
// GEMM by wgmma]). Compiled for sm_90a only (the arch-specific instructions): see qlinear_wgmma.h.
#include "backends/cuda_raw/qlinear_wgmma.h"

#include <cuda.h>  // CUtensorMap and its enums (the encoder is reached through the runtime: no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/ptx.cuh"
#include "backends/cuda_raw/quant_epilogue.cuh"
#include "core/cuda_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::cuda_raw {

// Note [int8 GEMM by wgmma]
// cuBLASLt 13's int8 GEMMs on an H100/H200 run its sm80 kernels (mma.sync: docs/benchmarks.md, 2026-12-02), about
// float16's speed, and leave the requantization to a second pass over int32 sums; int8_mma (mma.sync too) is slower
// still. Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) multiplies int8 at twice float16's rate. This kernel:
//  * a block of kWarpgroups x 128 threads computes a (64 kWarpgroups kRowTiles) x 128 tile of y = x w^T (x [M, K]
//    and w [N, K], both K-major, the only layout wgmma takes for 8-bit operands); warpgroup g takes kRowTiles strips
//    of 64 rows from row 64 kRowTiles g, each of its wgmma.m64n128k32 calls 32 bytes of K of one strip (the strips
//    share the weight's fragments: a 256 x 128 tile reads 85 multiply-adds a byte from L2, a 128 x 128 one 64);
//  * K goes by stages of 128 bytes: the block's x rows and w rows of a stage are copied by cp.async (16 bytes a copy,
//    zeros past M, N and K) into shared memory in the 128-byte swizzled layout the wgmma descriptors name (16-byte
//    chunk c of row r at chunk c ^ (r % 8); tiles 1024-byte aligned, so the hardware's swizzle of the address bits
//    4-6 by bits 7-9 finds it), kStages stages in a ring: the copies run kStages - 2 stages ahead of the multiplies,
//    and one stage's wgmma group stays in flight while the next is issued (wgmma.wait_group 1), so a stage is
//    overwritten only after both warpgroups' MMAs on it completed (each waited for it before the barrier that
//    precedes the copy);
//  * the copies are generic-proxy writes and wgmma reads shared memory through the async proxy:
//    fence.proxy.async after the barrier makes them visible to it;
//  * the int32 accumulators (64 a thread: rows r and r + 8, columns 8 i + 2 (lane % 4) + {0, 1}) go through the
//    cpu kernel's epilogue (quant_epilogue.cuh: the same float32 operations, Requantizer's division-free rounding
//    for 8-bit outputs), two neighbouring outputs a store. So the bits equal the cpu kernel's. The block's 128
//    channels' terms (alpha, the int32 bias less the zero point's correction, the float bias) are first laid out in
//    shared memory: read per output from global memory, each load waited behind the previous output's store (the
//    compiler cannot tell that they do not alias), they made a first version spend about 15 us a block in its
//    epilogue (H100, 2026-12-07: BERT-base's GEMMs at a quarter of float16's speed).
// K must be a multiple of 16 (whole 16-byte copies); x and w 16-byte aligned; uint8 x multiplies as stored (u8.s8).
//
// Note [int8 GEMM by wgmma, fed by TMA]
// Timed on an H100 (docs/benchmarks.md, 2026-12-07), the kernel above is latency-bound: the warps that multiply also
// issue the copies, and a block-wide barrier every stage leaves only two stages in flight ahead of the MMAs, so it
// trails cuBLASLt's int8 GEMM. The "tma" pipeline is the warp-specialized form of Hopper's GEMMs (CUTLASS's
// KernelTmaWarpSpecialized, the PTX ISA's mbarrier and cp.async.bulk.tensor): a block of three warpgroups, the first a
// producer whose one thread copies each stage's x rows and w rows by two TMA loads (tensor maps made on the host per
// launch, 128-byte swizzle: the layout the wgmma descriptors name, zeros past M, N and K written by the copy engine)
// and the other two consumers that multiply. Per stage two mbarriers: `full` (the producer's expected bytes; the
// copies complete it) and `empty` (one arrival a consumer thread once its MMAs on the stage finished, checked by
// wgmma.wait_group 1 a stage later). The producer runs up to kStages stages ahead and no warp waits for a copy it
// issued; the producer warpgroup gives its registers to the consumers (setmaxnreg), and its threads lay out the block's
// channel terms in shared memory before the roles split. Tiles of 128 or 256 rows x 128 columns (two consumers of 1
// or 2 strips of 64 rows), or 64 x 128 with one consumer, two blocks an SM (record {"warpgroups": 1, "pipeline":
// "tma"}: not yet run on a GPU, so no tactic: only a record names it); the epilogue is the kernel above's, so the
// bits are the same.

namespace {

constexpr int kBK = 128;  // bytes of K per stage: one swizzle row
constexpr int kBN = 128;

// A block of kWarpgroups warpgroups, each taking kRowTiles strips of 64 rows (the same weight fragments for each).
template <int kWarpgroups, int kRowTiles>
struct WgmmaTile {
  static constexpr int kBM = 64 * kWarpgroups * kRowTiles;
  static constexpr int kThreads = 128 * kWarpgroups;
  // 192 KB of stages for the 128- and 256-row tiles (one block an SM: 4 or 2 tiles in flight), 96 KB for the 64-row
  // ones (two blocks an SM, 2 tiles in flight each).
  static constexpr int kStages = kBM == 64 ? 4 : kBM == 128 ? 6 : 4;
  static constexpr int kABytes = kBM * kBK;
  static constexpr int kStageBytes = (kBM + kBN) * kBK;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + the 1024-byte alignment of the ring
};

// The block's output channels' epilogue operands, laid out in shared memory after the main loop (Note [int8 GEMM by
// wgmma]): what quantized_real reads per channel, with the int32 terms summed.
struct ChannelTerms {
  std::uint32_t add;  // int_bias[c] - x_zero_point * w_col_sums[c], wrapping
  float alpha;
  float float_bias;  // 0 without a float bias (+ 0.0f, as the cpu kernel)
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define XPURT_WGMMA 1
#else
#define XPURT_WGMMA 0
#endif

// A K-major operand in 128-byte swizzled rows at `address`: 8-row groups 1024 bytes apart (stride byte offset), the
// leading byte offset unused by this swizzle (1 by convention), layout type 1 (128-byte swizzle) in bits 62-63.
__device__ __forceinline__ std::uint64_t smem_descriptor(std::uint32_t address) {
  return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) | (std::uint64_t{1} << 16) |
         (std::uint64_t{1024 >> 4} << 32) | (std::uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#if XPURT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if XPURT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if XPURT_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

__device__ __forceinline__ void fence_proxy_async() {
#if XPURT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// mbarrier and TMA (Note [int8 GEMM by wgmma, fed by TMA]); `bar` is a shared-memory address.
__device__ __forceinline__ void mbarrier_init(std::uint32_t bar, std::uint32_t count) {
#if XPURT_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void fence_mbarrier_init() {
#if XPURT_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
#if XPURT_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(std::uint32_t bar) {
#if XPURT_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Waits until the phase of parity `parity` completed (a fresh barrier counts parity 1 as completed).
__device__ __forceinline__ void mbarrier_wait(std::uint32_t bar, std::uint32_t parity) {
#if XPURT_WGMMA
  asm volatile(
      "{\n.reg .pred done;\nXPURT_MBARRIER_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra XPURT_MBARRIER_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// The box of `map` at (c0 bytes of K, row c1) into shared memory at `dst`, completing `bar`'s expected bytes.
__device__ __forceinline__ void tma_load_2d(std::uint32_t dst, const CUtensorMap* map, std::uint32_t bar, int c0,
                                            int c1) {
#if XPURT_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
#endif
}

template <bool kIncrease, int kRegisters>
__device__ __forceinline__ void set_max_registers() {
#if XPURT_WGMMA
  if constexpr (kIncrease) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  }
#endif
}

// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous MMAs.
__device__ __forceinline__ void fence_operand(int& r) { asm volatile("" : "+r"(r)::"memory"); }

template <int kRowTiles>
__device__ __forceinline__ void fence_accumulators(int (&acc)[kRowTiles][64]) {
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(acc[r][i]);
  }
}

// d += a (64 x 32 bytes of x) * b (128 x 32 bytes of w)^T, int32 accumulators that wrap; ATYPE u8 or s8 (x's type).
#define XPURT_WGMMA_M64N128K32(ATYPE)                                                                                  \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n128k32.s32." ATYPE ".s8 {"                                                     \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                         \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                               \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                               \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "                              \
      "%64, %65, p;\n}\n"                                                                                              \
      :                                                                                                                \
      "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),                  \
      "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),            \
      "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),          \
      "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),          \
      "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),          \
      "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),          \
      "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),          \
      "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])           \
      : "l"(a), "l"(b), "r"(1))

template <bool kUnsigned>
__device__ __forceinline__ void wgmma_m64n128k32(int (&d)[64], std::uint64_t a, std::uint64_t b) {
#if XPURT_WGMMA
  if constexpr (kUnsigned) {
    XPURT_WGMMA_M64N128K32("u8");
  } else {
    XPURT_WGMMA_M64N128K32("s8");
  }
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();  // the launcher runs this kernel on compute capability 9.0 only
#endif
}
#undef XPURT_WGMMA_M64N128K32

// One 128-byte K stage of a warpgroup's kRowTiles strips: x's strips at shared address `a` (64 rows of 128 bytes
// each), the weight's 128 rows at `b`; issues the stage's MMAs and returns once the previous stage's are done
// (wgmma.wait_group 1), so the accumulators' registers are fenced on both sides.
template <int kRowTiles, bool kUnsigned>
__device__ __forceinline__ void multiply_stage(int (&acc)[kRowTiles][64], std::uint32_t a, std::uint32_t b) {
  fence_accumulators<kRowTiles>(acc);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kBK / 32; ++step) {
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      wgmma_m64n128k32<kUnsigned>(acc[r], smem_descriptor(a + r * 64 * kBK + step * 32),
                                  smem_descriptor(b + step * 32));
    }
  }
  wgmma_commit();
  wgmma_wait<1>();
  fence_accumulators<kRowTiles>(acc);
}

struct WgmmaParams {
  const std::uint8_t* x;
  const std::uint8_t* w;
  void* y;
  int m, n, k;
  QuantEpilogueParams epilogue;
};

// quantized_raw and quantized_real of accumulator `acc` with the channel's terms: the same operations.
__device__ __forceinline__ std::int32_t channel_raw(const ChannelTerms& t, int acc) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(acc) + t.add);
}

__device__ __forceinline__ float channel_real(const ChannelTerms& t, bool relu, int acc) {
  float v = __fadd_rn(__fmul_rn(static_cast<float>(channel_raw(t, acc)), t.alpha), t.float_bias);
  if (relu && !(v > 0.0f) && !isnan(v)) v = 0.0f;
  return v;
}

// Two neighbouring outputs (row, c) and (row, c + 1) from their accumulators and the channels' terms t[0], t[1];
// `pair`: both exist and the row's index is even (one store).
template <DType kOut>
__device__ __forceinline__ void store_pair(const QuantEpilogueParams& p, const detail::Requantizer& r, void* y,
                                           std::int64_t index, const ChannelTerms* t, int acc0, int acc1, bool both,
                                           bool pair) {
  if constexpr (kOut == DType::kInt8 || kOut == DType::kUInt8) {
    int level[2];
    const int acc[2] = {acc0, acc1};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float real = channel_real(t[e], p.relu, acc[e]);
      constexpr float lo = kOut == DType::kInt8 ? -128.0f : 0.0f, hi = kOut == DType::kInt8 ? 127.0f : 255.0f;
      level[e] = r.fast ? detail::requantized_int(r, real) : static_cast<int>(detail::quantized_level(p, real, lo, hi));
    }
    auto* out = static_cast<std::uint8_t*>(y) + index;
    if (pair) {
      *reinterpret_cast<std::uint16_t*>(out) =
          static_cast<std::uint16_t>((level[0] & 0xFF) | ((level[1] & 0xFF) << 8));
    } else {
      out[0] = static_cast<std::uint8_t>(level[0]);
      if (both) out[1] = static_cast<std::uint8_t>(level[1]);
    }
  } else if constexpr (kOut == DType::kFloat16) {
    const __half h0 = __float2half_rn(channel_real(t[0], p.relu, acc0));
    const __half h1 = both ? __float2half_rn(channel_real(t[1], p.relu, acc1)) : h0;
    auto* out = static_cast<__half*>(y) + index;
    if (pair) {
      *reinterpret_cast<__half2*>(out) = __halves2half2(h0, h1);
    } else {
      out[0] = h0;
      if (both) out[1] = h1;
    }
  } else {
    static_assert(kOut == DType::kFloat32 || kOut == DType::kInt32, "the int8 ops write int32, float32, float16, "
                  "int8 or uint8");
    using T = std::conditional_t<kOut == DType::kFloat32, float, std::int32_t>;
    const auto value = [&](int acc, const ChannelTerms& terms) {
      if constexpr (kOut == DType::kFloat32) return channel_real(terms, p.relu, acc);
      else return channel_raw(terms, acc);
    };
    auto* out = static_cast<T*>(y) + index;
    const T v0 = value(acc0, t[0]);
    if (pair) {
      using T2 = std::conditional_t<kOut == DType::kFloat32, float2, int2>;
      *reinterpret_cast<T2*>(out) = T2{v0, value(acc1, t[1])};
    } else {
      out[0] = v0;
      if (both) out[1] = value(acc1, t[1]);
    }
  }
}

// Channel c's epilogue terms (quantized_real's per-channel operands, the int32 ones summed).
__device__ __forceinline__ ChannelTerms channel_terms(const QuantEpilogueParams& ep, int c) {
  std::uint32_t add = ep.int_bias != nullptr ? static_cast<std::uint32_t>(ep.int_bias[c]) : 0u;
  if (ep.x_zero_point != nullptr) {
    add -= static_cast<std::uint32_t>(*ep.x_zero_point) * static_cast<std::uint32_t>(ep.w_col_sums[c]);
  }
  return ChannelTerms{add, ep.alpha != nullptr ? ep.alpha[ep.alpha_per_channel ? c : 0] : 1.0f,
                      ep.float_bias != nullptr ? ep.float_bias[c] : 0.0f};
}

// A warpgroup's outputs: its kRowTiles strips of 64 rows from strip `first_strip` of the block's tile at (m0, n0),
// from the accumulators of the m64n128 MMAs (thread `thread` of the warpgroup) and the block's channel terms.
template <int kRowTiles, DType kOut>
__device__ __forceinline__ void store_strips(const WgmmaParams& p, const ChannelTerms* terms,
                                             const int (&acc)[kRowTiles][64], int m0, int n0, int first_strip,
                                             int thread) {
  const QuantEpilogueParams& ep = p.epilogue;
  const detail::Requantizer requant = detail::requantizer(ep.y_scale, ep.y_zero_point, kOut == DType::kInt8);
  const int lane = thread & 31, warp = thread >> 5;
  const bool even_n = p.n % 2 == 0;
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
    const int row0 = m0 + (first_strip + r) * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) {
      const int c = n0 + 8 * i + 2 * (lane & 3);
      if (c >= p.n) continue;
      const bool both = c + 1 < p.n;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        if (row >= p.m) continue;
        store_pair<kOut>(ep, requant, p.y, static_cast<std::int64_t>(row) * p.n + c, terms + (c - n0),
                         acc[r][4 * i + 2 * h], acc[r][4 * i + 2 * h + 1], both, both && even_n);
      }
    }
  }
}

template <int kWarpgroups, int kRowTiles, bool kUnsigned, DType kOut>
__global__ void __launch_bounds__(WgmmaTile<kWarpgroups, kRowTiles>::kThreads)
    qlinear_wgmma_kernel(const WgmmaParams p) {
  using Tile = WgmmaTile<kWarpgroups, kRowTiles>;
  extern __shared__ __align__(1024) unsigned char smem[];
  const std::uint32_t ring = (ptx::shared_address(smem) + 1023) & ~1023u;
  const int tid = static_cast<int>(threadIdx.x);
  const int m0 = static_cast<int>(blockIdx.x) * Tile::kBM, n0 = static_cast<int>(blockIdx.y) * kBN;
  const int k_tiles = (p.k + kBK - 1) / kBK;

  // Stage `stage` <- K tile `kt` of the block's x rows (then its w rows), 16 bytes a copy, swizzled.
  const auto copy_tile = [&](int stage, int kt) {
    const std::uint32_t tile = ring + static_cast<std::uint32_t>(stage * Tile::kStageBytes);
    const int k0 = kt * kBK;
    constexpr int kCopies = (Tile::kBM + kBN) * (kBK / 16) / Tile::kThreads;
    static_assert((Tile::kBM + kBN) * (kBK / 16) % Tile::kThreads == 0, "whole copies per thread");
#pragma unroll
    for (int j = 0; j < kCopies; ++j) {
      const int i = tid + j * Tile::kThreads;
      const int row = i >> 3, chunk = i & 7;
      const bool is_x = row < Tile::kBM;
      const int r = is_x ? row : row - Tile::kBM;
      const int g = (is_x ? m0 : n0) + r;
      const int kk = k0 + chunk * 16;
      const bool inside = g < (is_x ? p.m : p.n) && kk < p.k;
      const std::uint8_t* src = (is_x ? p.x : p.w) + (inside ? static_cast<std::int64_t>(g) * p.k + kk : 0);
      const std::uint32_t dst = tile + static_cast<std::uint32_t>((is_x ? 0 : Tile::kABytes) + r * kBK +
                                                                  ((chunk ^ (r & 7)) << 4));
      ptx::cp_async_16(dst, src, inside ? 16 : 0);
    }
  };

  int acc[kRowTiles][64];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[r][i] = 0;
  }
  const int group = tid / 128;
#pragma unroll
  for (int s = 0; s < Tile::kStages - 2; ++s) {
    if (s < k_tiles) copy_tile(s, s);
    ptx::cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<Tile::kStages - 3>();  // this thread's copies of tile kt landed
    __syncthreads();                    // everyone's, and every MMA on tile kt - 2's stage done
    fence_proxy_async();
    const std::uint32_t tile = ring + static_cast<std::uint32_t>((kt % Tile::kStages) * Tile::kStageBytes);
    // this warpgroup's MMAs on tile kt - 1 are done after it
    multiply_stage<kRowTiles, kUnsigned>(acc, tile + static_cast<std::uint32_t>(group * kRowTiles * 64 * kBK),
                                         tile + static_cast<std::uint32_t>(Tile::kABytes));
    const int next = kt + Tile::kStages - 2;  // into the stage of tile kt - 2
    if (next < k_tiles) copy_tile(next % Tile::kStages, next);
    ptx::cp_async_commit();
  }
  wgmma_wait<0>();
  fence_accumulators<kRowTiles>(acc);

  // The block's channels' terms into shared memory (the ring is free once every copy landed and every MMA is done):
  // read once per channel from global memory, and then from shared memory, which the output stores cannot alias.
  const QuantEpilogueParams& ep = p.epilogue;
  ptx::cp_async_wait<0>();
  __syncthreads();
  auto* terms = reinterpret_cast<ChannelTerms*>(smem + (ring - ptx::shared_address(smem)));
  for (int j = tid; j < kBN; j += Tile::kThreads) terms[j] = channel_terms(ep, min(n0 + j, p.n - 1));
  __syncthreads();
  store_strips<kRowTiles, kOut>(p, terms, acc, m0, n0, group * kRowTiles, tid & 127);
}

// ---- the warp-specialized pipeline (Note [int8 GEMM by wgmma, fed by TMA]) ----

// kConsumers consumer warpgroups of kRowTiles strips each and one producer warpgroup. Two consumers: one block an SM
// (192 KB of stages), the producer's registers given to the consumers; one consumer of one strip (64-row tiles): 96
// KB of stages and at most 128 registers a thread, so two blocks share an SM and one's epilogue overlaps the other's
// multiplies.
template <int kConsumers, int kRowTiles>
struct TmaTile {
  static_assert((kConsumers == 2 && (kRowTiles == 1 || kRowTiles == 2)) || (kConsumers == 1 && kRowTiles == 1),
                "2 consumers of 1 or 2 strips, or 1 consumer of 1 strip");
  static constexpr int kBM = 64 * kConsumers * kRowTiles;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlocksPerSm = kConsumers == 1 ? 2 : 1;
  static constexpr int kABytes = kBM * kBK;
  static constexpr int kStageBytes = (kBM + kBN) * kBK;
  static constexpr int kStages = kBM == 128 ? 6 : 4;  // 192 KB of stages, or 96 KB for the 64-row tiles
  // The ring (1024-byte aligned), then a full and an empty mbarrier a stage, then the block's channel terms.
  static constexpr int kBarrierOffset = kStages * kStageBytes;
  static constexpr int kTermsOffset = kBarrierOffset + 16 * kStages;
  static constexpr int kSmemBytes = kTermsOffset + kBN * static_cast<int>(sizeof(ChannelTerms)) + 1024;
};

template <int kConsumers, int kRowTiles, bool kUnsigned, DType kOut>
__global__ void __launch_bounds__(TmaTile<kConsumers, kRowTiles>::kThreads,
                                  TmaTile<kConsumers, kRowTiles>::kBlocksPerSm)
    qlinear_wgmma_tma_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                             const WgmmaParams p) {
  using Tile = TmaTile<kConsumers, kRowTiles>;
  extern __shared__ __align__(1024) unsigned char smem[];
  const std::uint32_t base = ptx::shared_address(smem);
  const std::uint32_t ring = (base + 1023) & ~1023u;
  const std::uint32_t full = ring + Tile::kBarrierOffset, empty = full + 8 * Tile::kStages;
  auto* terms = reinterpret_cast<ChannelTerms*>(smem + (ring - base) + Tile::kTermsOffset);
  const int tid = static_cast<int>(threadIdx.x);
  const int m0 = static_cast<int>(blockIdx.x) * Tile::kBM, n0 = static_cast<int>(blockIdx.y) * kBN;
  const int k_tiles = (p.k + kBK - 1) / kBK;
  if (tid == 0) {
    for (int s = 0; s < Tile::kStages; ++s) {
      mbarrier_init(full + 8 * s, 1);
      mbarrier_init(empty + 8 * s, 128 * kConsumers);  // one arrival a consumer thread
    }
    fence_mbarrier_init();
  }
  if (tid < kBN) terms[tid] = channel_terms(p.epilogue, min(n0 + tid, p.n - 1));
  __syncthreads();

  if (tid < 128) {  // the producer warpgroup
    if constexpr (Tile::kBlocksPerSm == 1) set_max_registers<false, 40>();
    if (tid == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % Tile::kStages;
        mbarrier_wait(empty + 8 * s, ((kt / Tile::kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(full + 8 * s, Tile::kStageBytes);
        const std::uint32_t tile = ring + static_cast<std::uint32_t>(s * Tile::kStageBytes);
        tma_load_2d(tile, &x_map, full + 8 * s, kt * kBK, m0);
        tma_load_2d(tile + Tile::kABytes, &w_map, full + 8 * s, kt * kBK, n0);
      }
    }
    return;
  }
  if constexpr (Tile::kBlocksPerSm == 1) set_max_registers<true, 232>();
  const int group = tid / 128 - 1, thread = tid & 127;
  int acc[kRowTiles][64];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[r][i] = 0;
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % Tile::kStages;
    mbarrier_wait(full + 8 * s, (kt / Tile::kStages) & 1);  // the stage's copies landed
    const std::uint32_t tile = ring + static_cast<std::uint32_t>(s * Tile::kStageBytes);
    // this warpgroup's MMAs on tile kt - 1 are done after it: that stage may be refilled
    multiply_stage<kRowTiles, kUnsigned>(acc, tile + static_cast<std::uint32_t>(group * kRowTiles * 64 * kBK),
                                         tile + static_cast<std::uint32_t>(Tile::kABytes));
    // Every consumer thread arrives: a branch on the lane while MMAs are in flight made ptxas serialize them (C7515).
    if (kt > 0) mbarrier_arrive(empty + 8 * ((kt - 1) % Tile::kStages));
  }
  wgmma_wait<0>();
  fence_accumulators<kRowTiles>(acc);
  store_strips<kRowTiles, kOut>(p, terms, acc, m0, n0, group * kRowTiles, thread);
}

// cuTensorMapEncodeTiled, from the driver through the runtime (the library does not link libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    XPURT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                      &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw CudaError("int8_wgmma qlinear: the CUDA driver has no cuTensorMapEncodeTiled (it needs CUDA 12)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A [rows, k] byte matrix read in boxes of 128 bytes of K x `box_rows` rows, 128-byte swizzled, zeros outside.
CUtensorMap tensor_map(const void* data, int rows, int k, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims,
                                          strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw CudaError("int8_wgmma qlinear: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(r) +
                       ") for a [" + std::to_string(rows) + ", " + std::to_string(k) + "] operand");
  }
  return map;
}

template <int kConsumers, int kRowTiles, bool kUnsigned, DType kOut>
void launch_tma(const WgmmaParams& p, cudaStream_t stream) {
  using Tile = TmaTile<kConsumers, kRowTiles>;
  auto* kernel = qlinear_wgmma_tma_kernel<kConsumers, kRowTiles, kUnsigned, kOut>;
  XPURT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const CUtensorMap x_map = tensor_map(p.x, p.m, p.k, Tile::kBM);
  const CUtensorMap w_map = tensor_map(p.w, p.n, p.k, kBN);
  const dim3 grid(static_cast<unsigned>((p.m + Tile::kBM - 1) / Tile::kBM),
                  static_cast<unsigned>((p.n + kBN - 1) / kBN));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(x_map, w_map, p);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

template <int kWarpgroups, int kRowTiles, bool kUnsigned, DType kOut>
void launch(const WgmmaParams& p, cudaStream_t stream) {
  using Tile = WgmmaTile<kWarpgroups, kRowTiles>;
  auto* kernel = qlinear_wgmma_kernel<kWarpgroups, kRowTiles, kUnsigned, kOut>;
  // Over the 48 KiB default: raised on the current device (cheap, and idempotent per device).
  XPURT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const dim3 grid(static_cast<unsigned>((p.m + Tile::kBM - 1) / Tile::kBM),
                  static_cast<unsigned>((p.n + kBN - 1) / kBN));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// kTma: the TMA pipeline with kWarpgroups consumer warpgroups (Note [int8 GEMM by wgmma, fed by TMA]).
template <bool kTma, int kWarpgroups, int kRowTiles, bool kUnsigned, DType kOut>
void launch_any(const WgmmaParams& p, cudaStream_t stream) {
  if constexpr (kTma) {
    launch_tma<kWarpgroups, kRowTiles, kUnsigned, kOut>(p, stream);
  } else {
    launch<kWarpgroups, kRowTiles, kUnsigned, kOut>(p, stream);
  }
}

template <bool kTma, int kWarpgroups, int kRowTiles, bool kUnsigned>
void launch_out(const WgmmaParams& p, cudaStream_t stream) {
  switch (p.epilogue.out_dtype) {
    case DType::kInt8: return launch_any<kTma, kWarpgroups, kRowTiles, kUnsigned, DType::kInt8>(p, stream);
    case DType::kUInt8: return launch_any<kTma, kWarpgroups, kRowTiles, kUnsigned, DType::kUInt8>(p, stream);
    case DType::kFloat16: return launch_any<kTma, kWarpgroups, kRowTiles, kUnsigned, DType::kFloat16>(p, stream);
    case DType::kFloat32: return launch_any<kTma, kWarpgroups, kRowTiles, kUnsigned, DType::kFloat32>(p, stream);
    case DType::kInt32: return launch_any<kTma, kWarpgroups, kRowTiles, kUnsigned, DType::kInt32>(p, stream);
    default:
      throw InvalidArgumentError("int8_wgmma qlinear writes int8, uint8, float16, float32 or int32");
  }
}

}  // namespace

bool qlinear_wgmma_sizes_fit(std::int64_t m, std::int64_t n, std::int64_t k) {
  constexpr std::int64_t kMax = std::int64_t{1} << 30;
  return m > 0 && n > 0 && k > 0 && m < kMax && k < kMax && n <= std::int64_t{65535} * kBN;  // grid.y: N's tiles
}

int qlinear_wgmma_stages(int warpgroups, int row_tiles, bool tma) {
  if (tma && warpgroups == 1) return TmaTile<1, 1>::kStages;
  if (tma) return row_tiles == 1 ? TmaTile<2, 1>::kStages : TmaTile<2, 2>::kStages;
  if (warpgroups == 1) return row_tiles == 1 ? WgmmaTile<1, 1>::kStages : WgmmaTile<1, 2>::kStages;
  return row_tiles == 1 ? WgmmaTile<2, 1>::kStages : WgmmaTile<2, 2>::kStages;
}

void qlinear_wgmma(const QLinearWgmmaArgs& args, void* stream) {
  XPURT_INTERNAL_ASSERT(args.k % 16 == 0 && qlinear_wgmma_sizes_fit(args.m, args.n, args.k),
                        "int8_wgmma qlinear: K a multiple of 16 and sizes below 2^30");
  XPURT_INTERNAL_ASSERT((args.warpgroups == 1 || args.warpgroups == 2) && (args.row_tiles == 1 || args.row_tiles == 2),
                        "int8_wgmma qlinear: 1 or 2 warpgroups of 1 or 2 row tiles");
  WgmmaParams p;
  p.x = static_cast<const std::uint8_t*>(args.x);
  p.w = reinterpret_cast<const std::uint8_t*>(args.weight);
  p.y = args.out;
  p.m = static_cast<int>(args.m);
  p.n = static_cast<int>(args.n);
  p.k = static_cast<int>(args.k);
  p.epilogue = args.epilogue;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool u = args.x_unsigned;
  if (args.tma) {
    XPURT_INTERNAL_ASSERT(args.warpgroups == 2 || args.row_tiles == 1,
                          "int8_wgmma qlinear: the TMA pipeline's one consumer warpgroup takes one strip");
    if (args.warpgroups == 1) return u ? launch_out<true, 1, 1, true>(p, s) : launch_out<true, 1, 1, false>(p, s);
    if (args.row_tiles == 1) return u ? launch_out<true, 2, 1, true>(p, s) : launch_out<true, 2, 1, false>(p, s);
    return u ? launch_out<true, 2, 2, true>(p, s) : launch_out<true, 2, 2, false>(p, s);
  }
  if (args.warpgroups == 1) {
    if (args.row_tiles == 1) return u ? launch_out<false, 1, 1, true>(p, s) : launch_out<false, 1, 1, false>(p, s);
    return u ? launch_out<false, 1, 2, true>(p, s) : launch_out<false, 1, 2, false>(p, s);
  }
  if (args.row_tiles == 1) return u ? launch_out<false, 2, 1, true>(p, s) : launch_out<false, 2, 1, false>(p, s);
  return u ? launch_out<false, 2, 2, true>(p, s) : launch_out<false, 2, 2, false>(p, s);
}

}  // namespace xpuruntime::cuda_raw
