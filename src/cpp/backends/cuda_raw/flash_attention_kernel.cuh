// The flash_v2 attention forward kernel: FlashAttention-2 on tensor cores (mma.sync m16n8k16), for fp16 and bf16,
// head dims 32, 64 and 128, with a causal mask, an explicit additive mask, or none.
//
// Contract (checked by the flash_v2 kernel's supports() in flash_attention.cu, not here):
//   q [B, H, Sq, D], k and v [B, Hkv, Sk, D], o [B, H, Sq, D], one dtype T, element (b, h, s, d) of each at
//   b * stride_b + h * stride_h + s * stride_s + d (Params; [B, H, S, D] or [B, S, H, D] storage, Note [Attention
//   layouts] in core/attention_layout.h: the launcher points q, k, v at the first element of packed parts), with
//   16-byte aligned pointers and strides that are multiples of 8;
//   H % Hkv == 0 (head h reads kv head h / (H / Hkv)); Sq >= 1, Sk >= 1; ceil(Sq / 128) * B * H < 2^31;
//   the optional mask is read at mask[b * stride_b + h * stride_h + i * stride_q + j * stride_k] (strides in
//   elements, 0 where the mask broadcasts), in the dtype T, and added to the scaled scores. A query row whose
//   every score is -inf (an explicit mask only) gets NaN, like the cpu reference and PyTorch's SDPA, or 0 with
//   Params::zero_fully_masked_rows (Note [Fully masked attention rows] in backends/cpu/cpu_attention.cpp).
//   lse (optional) [B, H, Sq] float32: the natural-log log-sum-exp of each row's scores (Note [flash_v2
//   log-sum-exp]).
// Self-contained (CUDA headers only), so that a stand-alone harness can include it as well.
//
// Note [flash_v2 tiling]
// ~~~~~~~~~~~~~~~~~~~~~~
// One CTA of 4 warps owns kBlockM = 128 query rows of one (batch, head); warp w owns rows [32 w, 32 w + 32) as two
// m16 MMA tiles. The CTA walks the keys in tiles of kBlockN (64 for D = 128; 128 for D = 32 and 64 except with an
// explicit mask, whose extra registers need the smaller tile): S = Q K^T on tensor cores into fp32 registers,
// masking, the online softmax update in registers (running row max m and row sum l, exp2 of log2(e)-prescaled
// scores, O rescaled by exp2(m_old - m_new)), P converted to T in registers and used directly as the A operand of
// O += P V (the C fragments of two m16n8 tiles are exactly the A fragment of one m16k16 tile, so P never touches
// shared memory). At the end O is divided by l and written out through shared memory as 16-byte rows.
//
// Why 32 rows per warp: every warp reads the whole K and V tile from shared memory, so the shared-memory bytes per
// MMA fall as the rows per warp grow (256 B per m16n8k16 at 16 rows, 128 B at 32). At 16 rows per warp an
// H100/H200 SM runs out of shared-memory bandwidth (128 B/clock) long before its tensor cores are busy. 32 rows at
// D = 128 hold 128 fp32 O accumulators and 64 S accumulators per thread, so Q stays in shared memory and is re-read
// with ldmatrix (32 B per MMA more), and __launch_bounds__(128, 2) keeps two CTAs on an SM (at most 255 registers
// per thread; ptxas keeps the loop nearly spill-free, a few row sums go to L1-resident local memory).
//
// Shared memory: Q [128][D], K [2][kBlockN][D], V [2][kBlockN][D] in T: 96 KiB at D = 128, 80 KiB at D = 64 (48 KiB
// with an explicit mask), 40 KiB at D = 32 (24 KiB), so two CTAs fit on an SM. Each row of D elements is stored as 16-byte chunks with chunk
// c of row r at position c ^ (r % 8) (an XOR swizzle; D = 32: c ^ ((r / 2) % 4), row_swizzle): the 8 rows one ldmatrix 8x8 reads, and the 8 chunks of a
// row that 8 threads write with cp.async, fall into 8 distinct groups of 4 banks, so neither side has bank
// conflicts and nothing is padded.
//
// Pipeline: K and V are double-buffered. Iteration n waits for tiles K_n, V_n (cp.async.wait_group 0), passes one
// barrier (the tiles are visible to every warp, and every warp is done with buffers of iteration n - 1), issues
// the cp.async copies of K_{n+1}, V_{n+1} into the other buffers, and computes; each copy has a whole iteration of
// tensor-core work to land, and the second CTA on the SM fills what is left. Measured on an H200 (B8 H16 S4096
// D128 bf16), this beat an earlier version of this kernel with FlashAttention-2's single-buffered overlap (V_n
// under S_n, K_{n+1} under P_n V_n) by 2% non-causal and 7% causal; both directions now run at the speed of
// PyTorch's FlashAttention-2 backend (~350 TFLOP/s non-causal). Rows past Sq or Sk are zero-filled by cp.async
// (src-size 0): zero V rows keep 0 * garbage from turning into NaN, and the scores of keys past Sk are set to -inf
// before the softmax.
//
// Causal (top-left aligned, query i sees keys j <= i): a CTA stops after the tile holding key min(Sq, m0 + 128) - 1
// and masks only the tiles that cross the diagonal or run past Sk. The grid has ceil(Sq / 128) * B * H CTAs with
// the query block fastest, so the CTAs in flight share few heads and their K and V stay in L2; within a head the
// heaviest causal blocks go first.
//
// Note [flash_v2 log-sum-exp]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With Params::lse set, the epilogue also writes lse[(b * H + h) * Sq + i] = log(sum_j exp(score_ij)) (natural
// log; score = q k^T * scale + mask, -inf where causal or past Sk): FlashAttention-2's softmax_lse, which PyTorch's
// flash backward takes. The loop keeps the softmax in the log2 domain: p = exp2(s * softmax_scale - m *
// softmax_scale), with s the raw dot product and softmax_scale = scale * log2(e) (no mask), or s already
// s * scale * log2(e) + mask * log2(e) and softmax_scale = 1 (explicit mask). The running max m is reduced over
// the quad at every tile (all 4 lanes of a row hold it); the row sum l is each lane's share until the epilogue
// sums it over the quad. So log2(sum_j exp2(s_j * softmax_scale)) = m * softmax_scale + log2(l), and
// lse = that * ln(2). A row with every score -inf has m = -inf and l = 0: lse = -inf; a NaN score makes l NaN:
// lse = NaN. Lane 0 of the quad writes it, for rows inside Sq only; with lse null the epilogue costs one
// uniform branch.
//
// Note [flash_v2 additive mask]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// MaskMode::kExplicit adds one tensor to the scores: a padding mask, a relative-position bias table (Swin, T5,
// DeBERTa's disentangled terms summed by the graph), ALiBi, or the sum of such terms that attention_fusion builds
// (Note [Attention with additive terms] in fusion_transformer.cpp). Any shape that broadcasts to [B, H, Sq, Sk]
// works without a copy: the launcher turns it into four element strides, 0 along each broadcast (or missing) dim, so
// [1, H, S, S], [B, 1, S, S], [B, H, 1, S], [1, 1, 1, S] and [S, S] all read one element per (b, h, i, j) from
// mask_row[i] + j * stride_k. Each thread reads the 2 x kBlockN / 4 elements of its accumulator rows straight from
// global memory (no shared-memory stage: a bias table shared by every batch and head stays in L2, and the loads of
// one tile are issued before the softmax needs them), converts them to float32, and forms s * scale * log2(e) +
// bias * log2(e) in the S registers before the past-Sk and causal -inf and the online softmax; the softmax then
// runs with a unit scale (Note [flash_v2 log-sum-exp]). Columns past Sk and rows past Sq are clamped into range for
// the load (their scores become -inf or are never stored). The bias is in q's dtype (the schema's contract for this
// kernel; attention_fusion fuses only terms of q's type). -inf entries mask keys; a row masked entirely gets NaN, or 0
// with Params::zero_fully_masked_rows: its running max stays -inf (the loop then subtracts 0, so every p is
// exp2(-inf) = 0, O stays 0 and the row sum l stays 0), and the epilogue multiplies O by 0 instead of 1 / 0. A NaN
// score makes l NaN, which stays NaN either way. With Params::uniform_fully_masked_rows a -inf sum of score and mask
// becomes kUniformMaskedScore (-1e30, in the log2 domain as well: it only has to lie below every finite score, and
// exp2 of it minus a finite max is 0), so a row masked entirely has max -1e30 and weighs every key 1, giving the mean
// of V; keys past Sk and above the causal diagonal are set to -inf after it and stay out.
// With D = 32 and 64 the key tile is 64 instead of 128 (Note [flash_v2 tiling]): the extra row pointers and bias values
// need the registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/attention_layout.h"

namespace xpuruntime::flash {

enum class MaskMode : int {
  kNone = 0,      // every key is visible
  kCausal = 1,    // key j is visible to query i iff j <= i
  kExplicit = 2,  // an additive mask tensor, plus the causal rule when Params::causal is set
};

// Everything the kernel reads; plain values, passed by value as the kernel parameter.
struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  const void* mask = nullptr;  // MaskMode::kExplicit only
  float* lse = nullptr;        // [B, H, Sq] log-sum-exp of each row (Note [flash_v2 log-sum-exp]); null: not written
  std::int64_t mask_stride_b = 0;
  std::int64_t mask_stride_h = 0;
  std::int64_t mask_stride_q = 0;
  std::int64_t mask_stride_k = 0;
  // Element strides {b, h, s} of q, k, v and o (d is contiguous); multiples of 8 (16-byte rows).
  std::int64_t q_stride[3] = {};
  std::int64_t k_stride[3] = {};
  std::int64_t v_stride[3] = {};
  std::int64_t o_stride[3] = {};
  int batch = 0;
  int heads = 0;
  int kv_heads = 0;
  int seq_q = 0;
  int seq_k = 0;
  float scale_log2 = 0.f;  // softmax scale * log2(e)
  bool causal = false;     // read by MaskMode::kExplicit (the other modes carry it in the template)
  // A row whose every score is -inf (row sum 0) gets 0 rather than NaN (Note [flash_v2 additive mask]).
  bool zero_fully_masked_rows = false;
  // -inf scores after the mask count as kUniformMaskedScore: a fully masked row gets the mean of V over its keys
  // (fully_masked_rows="uniform", Note [Fully masked attention rows] in backends/cpu/cpu_attention.cpp).
  bool uniform_fully_masked_rows = false;
};

template <int kHeadDim, MaskMode kMode>
struct TileConfig {
  static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 128, "flash_v2 instantiates head dims 32, 64, 128");
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kHeadDim <= 64 && kMode != MaskMode::kExplicit ? 128 : 64;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;  // 32: two m16 tiles
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kHeadDim * 2;
};

constexpr int kFlashBlockM = 128;

// The number of CTAs a launch needs (the grid is one-dimensional, so this must stay below 2^31).
inline long long flash_forward_blocks(int batch, int heads, int seq_q) {
  return static_cast<long long>((seq_q + kFlashBlockM - 1) / kFlashBlockM) * batch * heads;
}

namespace device {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1; `src_bytes` 0 writes zeros (and reads nothing).
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a * b for one m16n8k16 tile: a = 4 registers of the row-major A fragment, b0/b1 the column-major B
// fragment, d the 4 fp32 accumulators (rows g and g + 8, columns 2c and 2c + 1 with g = lane / 4, c = lane % 4).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> one register of two T, the first in the low half (the element order of MMA fragments).
template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

// The swizzle of row `row` of a [rows][kHeadDim] tile (Note [flash_v2 tiling]): its 16-byte chunk c sits at c ^ this.
// Rows of 128 or 256 bytes use row % 8; the 64-byte rows of D = 32 (4 chunks, two rows per 128-byte line) use
// (row / 2) % 4, so the 8 rows of an ldmatrix 8x8 (and the chunks 8 threads copy) still fall into 8 distinct groups of
// 4 banks. Either way the swizzle of a row only depends on row % 8.
template <int kHeadDim>
__device__ __forceinline__ int row_swizzle(int row) {
  return kHeadDim >= 64 ? (row & 7) : ((row >> 1) & 3);
}

// Issues the cp.async copies of rows [0, kRows) of a [rows][kHeadDim] tile into swizzled shared memory (Note
// [flash_v2 tiling]); rows at or past `rows_valid` become zeros. `fallback`: any valid global address (src-size 0
// reads nothing from it).
template <typename T, int kRows, int kHeadDim, int kThreads>
__device__ __forceinline__ void load_tile(std::uint32_t smem, const T* tile, std::int64_t row_stride, int rows_valid,
                                          const T* fallback, int tid) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "tile does not split evenly over the threads");
  const int chunk = tid % kChunks;
  const int row0 = tid / kChunks;
  // kRowsPerPass is a multiple of 8, so every row this thread copies has the same row % 8.
  const std::uint32_t dst0 = smem + row0 * (kHeadDim * 2) + ((chunk ^ row_swizzle<kHeadDim>(row0)) * 16);
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    const bool valid = row < rows_valid;
    const T* src = valid ? tile + row * row_stride + chunk * 8 : fallback;
    cp_async_16(dst0 + pass * kRowsPerPass * (kHeadDim * 2), src, valid ? 16 : 0);
  }
}

// One block of kBlockM query rows of one head (Note [flash_v2 tiling]): the prologue (shared-memory carve-up,
// ldmatrix bases, Q and the first K/V tile in flight), the loop over key tiles (the next tile's copies, S = Q K^T,
// masking, online softmax, O += P V) and the epilogue (O / l and the log-sum-exp out).
// Long function: a CUDA kernel whose stages share the accumulators and fragments held in registers (O, S, P, the
// row max and sum, the ldmatrix addresses); splitting them into __device__ functions is possible but passing those
// arrays by reference risks the compiler spilling them to local memory or reordering the cp.async pipeline, which
// only a GPU benchmark would show.
template <typename T, int kHeadDim, MaskMode kMode>
__global__ void __launch_bounds__(TileConfig<kHeadDim, kMode>::kThreads, 2)
    flash_forward_kernel(const Params params) {
  using Config = TileConfig<kHeadDim, kMode>;
  constexpr int kD = kHeadDim;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kThreads = Config::kThreads;
  constexpr int kRowBytes = kD * 2;
  constexpr int kNTiles = kBlockN / 8;  // n8 tiles of S per m16 tile
  constexpr int kDTiles = kD / 8;       // n8 tiles of O per m16 tile
  constexpr std::uint32_t kTileBytes = kBlockN * kRowBytes;
  constexpr float kNegInf = -__builtin_huge_valf();
  static_assert(kBlockM == kFlashBlockM, "flash_forward_blocks assumes 128-row query blocks");

  // 1024-byte alignment: the ldmatrix addresses below XOR the chunk index into the address bits, which needs
  // every row to start at a multiple of its size (128 or 256 bytes).
  extern __shared__ __align__(1024) unsigned char smem[];
  const std::uint32_t smem_q = shared_address(smem);
  const std::uint32_t smem_k = smem_q + kBlockM * kRowBytes;  // two stages of kTileBytes
  const std::uint32_t smem_v = smem_k + 2 * kTileBytes;       // two stages of kTileBytes

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = lane / 4;     // g: the accumulator rows g and g + 8 of an m16 tile
  const int in_group = lane % 4;  // c: the accumulator columns 2c and 2c + 1 of an n8 tile

  // Query block fastest (K and V of one head stay in L2); heaviest causal blocks first.
  const int num_m_blocks = (params.seq_q + kBlockM - 1) / kBlockM;
  const int linear = static_cast<int>(blockIdx.x);
  const int bh = linear / num_m_blocks;
  const int m_block = num_m_blocks - 1 - linear % num_m_blocks;
  const int b = bh / params.heads;
  const int h = bh % params.heads;
  const int kv_head = h / (params.heads / params.kv_heads);
  const int m0 = m_block * kBlockM;
  const int seq_q = params.seq_q;
  const int seq_k = params.seq_k;

  const T* q_all = static_cast<const T*>(params.q);
  const std::int64_t q_row = params.q_stride[2], k_row = params.k_stride[2], v_row = params.v_stride[2],
                     o_row = params.o_stride[2];
  const T* q = q_all + b * params.q_stride[0] + h * params.q_stride[1] + m0 * q_row;
  const T* k = static_cast<const T*>(params.k) + b * params.k_stride[0] + kv_head * params.k_stride[1];
  const T* v = static_cast<const T*>(params.v) + b * params.v_stride[0] + kv_head * params.v_stride[1];
  T* o = static_cast<T*>(params.o) + b * params.o_stride[0] + h * params.o_stride[1] + m0 * o_row;

  const bool causal = kMode == MaskMode::kCausal || (kMode == MaskMode::kExplicit && params.causal);
  const int m_end = min(seq_q, m0 + kBlockM);                // one past the last query row of this block
  const int n_end = causal ? min(seq_k, m_end) : seq_k;      // one past the last key any row here sees
  const int num_n_blocks = (n_end + kBlockN - 1) / kBlockN;  // >= 1: key 0 is visible to every row

  // Per-lane ldmatrix base addresses. Q (A operand; the x4's matrices are rows 0-7 / rows 8-15 / the same two
  // with k + 8): lane l addresses row l % 16, chunk l / 16. K (B operand of Q K^T, two n8 tiles per x4): lane l
  // addresses key (l % 8) + 8 (l / 16), chunk (l / 8) % 2. V (B operand of P V through .trans, two n8 tiles of D
  // per x4): lane l addresses key l % 16, chunk l / 16. Every such row has row % 8 == lane % 8, and the k-step
  // (or D pair) index is XORed in later as `step * 32`, i.e. chunk (2 step + x) ^ (row % 8).
  const int swizzle = row_swizzle<kD>(lane & 7);  // every row below has row % 8 == lane % 8
  const std::uint32_t q_lane =
      smem_q + (warp * Config::kRowsPerWarp + (lane & 15)) * kRowBytes + (((lane >> 4) ^ swizzle) * 16);
  const std::uint32_t k_lane =
      smem_k + ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes + ((((lane >> 3) & 1) ^ swizzle) * 16);
  const std::uint32_t v_lane = smem_v + (lane & 15) * kRowBytes + (((lane >> 4) ^ swizzle) * 16);

  // Explicit mask: one row pointer per accumulator row of this thread (rows past Sq clamped into range; their
  // results are never stored).
  const T* mask_row[2][2] = {};
  if constexpr (kMode == MaskMode::kExplicit) {
    const T* mask = static_cast<const T*>(params.mask) + b * params.mask_stride_b + h * params.mask_stride_h;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = min(m0 + warp * Config::kRowsPerWarp + t * 16 + group + half * 8, seq_q - 1);
        mask_row[t][half] = mask + row * params.mask_stride_q;
      }
    }
  }

  float o_acc[2][kDTiles][4];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int j = 0; j < kDTiles; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) o_acc[t][j][r] = 0.f;
    }
  }
  float row_max[2][2] = {{kNegInf, kNegInf}, {kNegInf, kNegInf}};
  float row_sum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // this thread's share; summed over the quad at the end
  // With an explicit mask the scores move into the log2 domain before the mask is added (s * scale * log2e +
  // mask * log2e), so the softmax below runs with a unit scale; otherwise the scale folds into one FFMA.
  const float softmax_scale = kMode == MaskMode::kExplicit ? 1.f : params.scale_log2;

  load_tile<T, kBlockM, kD, kThreads>(smem_q, q, q_row, m_end - m0, q_all, tid);
  load_tile<T, kBlockN, kD, kThreads>(smem_k, k, k_row, min(kBlockN, seq_k), k, tid);
  load_tile<T, kBlockN, kD, kThreads>(smem_v, v, v_row, min(kBlockN, seq_k), v, tid);
  cp_async_commit();

  for (int n_block = 0; n_block < num_n_blocks; ++n_block) {
    const int n0 = n_block * kBlockN;
    const std::uint32_t stage = (n_block & 1) * kTileBytes;
    cp_async_wait_all();  // this thread's copies of K_n, V_n (and Q) landed
    __syncthreads();      // ... everyone's; and every warp is done with the buffers of iteration n - 1
    if (n_block + 1 < num_n_blocks) {
      const int next = n0 + kBlockN;
      const std::uint32_t other = kTileBytes - stage;
      load_tile<T, kBlockN, kD, kThreads>(smem_k + other, k + next * k_row, k_row, min(kBlockN, seq_k - next), k,
                                          tid);
      load_tile<T, kBlockN, kD, kThreads>(smem_v + other, v + next * v_row, v_row, min(kBlockN, seq_k - next), v,
                                          tid);
    }
    cp_async_commit();

    // S = Q K^T over this key tile.
    float s[2][kNTiles][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) s[t][j][r] = 0.f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      std::uint32_t a[2][4];
      ldmatrix_x4(a[0], q_lane ^ (kk * 32));
      ldmatrix_x4(a[1], (q_lane + 16 * kRowBytes) ^ (kk * 32));
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        std::uint32_t kb[4];
        ldmatrix_x4(kb, (k_lane + stage + np * 16 * kRowBytes) ^ (kk * 32));
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          mma_16816<T>(s[t][2 * np], a[t], kb[0], kb[1]);
          mma_16816<T>(s[t][2 * np + 1], a[t], kb[2], kb[3]);
        }
      }
    }

    if constexpr (kMode == MaskMode::kExplicit) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int col = min(n0 + j * 8 + 2 * in_group + (r & 1), seq_k - 1);
            const float bias = to_float(mask_row[t][r >> 1][col * params.mask_stride_k]);
            s[t][j][r] = s[t][j][r] * params.scale_log2 + bias * kLog2e;
            // fully_masked_rows="uniform": before the past-Sk and causal -inf below, which stay -inf.
            if (params.uniform_fully_masked_rows && s[t][j][r] == kNegInf) s[t][j][r] = kUniformMaskedScore;
          }
        }
      }
    }
    // Keys past Sk, and keys after the query under the causal rule, get -inf.
    const bool tile_needs_mask = n0 + kBlockN > seq_k || (causal && n0 + kBlockN - 1 > m0);
    if (tile_needs_mask) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int row = m0 + warp * Config::kRowsPerWarp + t * 16 + group + (r >> 1) * 8;
            const int col = n0 + j * 8 + 2 * in_group + (r & 1);
            if (col >= seq_k || (causal && col > row)) s[t][j][r] = kNegInf;
          }
        }
      }
    }

    // Online softmax; P (in T) replaces S as the A operand of P V.
    std::uint32_t p[2][kBlockN / 16][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float tile_max = kNegInf;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          tile_max = fmaxf(tile_max, fmaxf(s[t][j][2 * half], s[t][j][2 * half + 1]));
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[t][half], tile_max);
        // A row with every key so far masked (only an explicit mask can do that) keeps max -inf; subtracting 0
        // instead keeps its exponentials at 0 rather than NaN.
        const float max_used = new_max == kNegInf ? 0.f : new_max;
        const float rescale = fast_exp2((row_max[t][half] - max_used) * softmax_scale);
        row_max[t][half] = new_max;
        row_sum[t][half] *= rescale;
#pragma unroll
        for (int j = 0; j < kDTiles; ++j) {
          o_acc[t][j][2 * half] *= rescale;
          o_acc[t][j][2 * half + 1] *= rescale;
        }
        const float max_scaled = max_used * softmax_scale;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          const float p0 = fast_exp2(s[t][j][2 * half] * softmax_scale - max_scaled);
          const float p1 = fast_exp2(s[t][j][2 * half + 1] * softmax_scale - max_scaled);
          row_sum[t][half] += p0 + p1;
          // S n8 tile j holds P columns 8j..8j+7: A fragment k-step j / 2, register (j % 2) * 2 + half.
          p[t][j / 2][(j % 2) * 2 + half] = pack2<T>(p0, p1);
        }
      }
    }

    // O += P V.
#pragma unroll
    for (int ks = 0; ks < kBlockN / 16; ++ks) {
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, (v_lane + stage + ks * 16 * kRowBytes) ^ (dp * 32));
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          mma_16816<T>(o_acc[t][2 * dp], p[t][ks], vb[0], vb[1]);
          mma_16816<T>(o_acc[t][2 * dp + 1], p[t][ks], vb[2], vb[3]);
        }
      }
    }
  }

  // Epilogue: O / l into this warp's own 32 rows of the Q buffer (no other warp reads them), then 16-byte rows
  // out to global memory. The last iteration committed an empty cp.async group: nothing is in flight.
  __syncwarp();
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float total = row_sum[t][half];
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      // total == 0: every score of the row is -inf (an explicit mask only); NaN, as in the cpu reference, or 0
      // (O is 0 there) with zero_fully_masked_rows. A NaN total stays NaN.
      const bool zero_row = params.zero_fully_masked_rows && total == 0.f;
      const float inverse = total > 0.f ? 1.f / total : (zero_row ? 0.f : __builtin_nanf(""));
      const int row = warp * Config::kRowsPerWarp + t * 16 + group + half * 8;
      if (params.lse != nullptr && in_group == 0 && m0 + row < seq_q) {  // Note [flash_v2 log-sum-exp]
        params.lse[static_cast<std::int64_t>(bh) * seq_q + m0 + row] =
            (row_max[t][half] * softmax_scale + log2f(total)) * kLn2;
      }
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        const std::uint32_t packed = pack2<T>(o_acc[t][j][2 * half] * inverse, o_acc[t][j][2 * half + 1] * inverse);
        const std::uint32_t address = smem_q + row * kRowBytes + ((j ^ row_swizzle<kD>(row)) * 16) + in_group * 4;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(packed) : "memory");
      }
    }
  }
  __syncwarp();
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int pass = 0; pass < Config::kRowsPerWarp * kChunks / 32; ++pass) {
    const int index = pass * 32 + lane;
    const int row = warp * Config::kRowsPerWarp + index / kChunks;
    const int chunk = index % kChunks;
    if (m0 + row < seq_q) {
      uint4 value;
      const std::uint32_t address = smem_q + row * kRowBytes + ((chunk ^ row_swizzle<kD>(row)) * 16);
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
                   : "r"(address)
                   : "memory");
      *reinterpret_cast<uint4*>(o + row * o_row + chunk * 8) = value;
    }
  }
}

}  // namespace device

// Launches one instantiation on `stream` (on the current device) and returns the first CUDA error; the caller
// checks it. The kernel's dynamic shared-memory limit (over the 48 KiB default) is raised once per device.
template <typename T, int kHeadDim, MaskMode kMode>
cudaError_t launch_flash_forward(const Params& params, cudaStream_t stream) {
  using Config = TileConfig<kHeadDim, kMode>;
  auto* kernel = &device::flash_forward_kernel<T, kHeadDim, kMode>;
  static std::atomic<std::uint64_t> configured_devices{0};  // bit d: done on device d (d < 64)
  int device_index = 0;
  cudaError_t status = cudaGetDevice(&device_index);
  if (status != cudaSuccess) return status;
  const std::uint64_t bit = device_index < 64 ? std::uint64_t{1} << device_index : 0;
  if (bit == 0 || (configured_devices.load(std::memory_order_acquire) & bit) == 0) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSmemBytes);
    if (status != cudaSuccess) return status;
    configured_devices.fetch_or(bit, std::memory_order_acq_rel);
  }
  const long long blocks = flash_forward_blocks(params.batch, params.heads, params.seq_q);
  kernel<<<static_cast<unsigned int>(blocks), Config::kThreads, Config::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace xpuruntime::flash
