// matmul_nbits on the GPU (Note [Int4 weight-only GEMM] in core/op_schemas_int4.cpp): a tensor-core kernel that
// streams the packed int4 weight once and dequantizes it in registers, for the small m of decoding; and the two
// helpers of the large-m path (int4_gemm_register.cpp), which dequantizes the weight into a workspace and runs
// cuBLAS's GEMM on it.
//
// Note [Int4 GEMM on the GPU]
// With m <= 16 rows of x, a GEMM against an int4 weight is bound by the weight's bytes: each code is used m times.
// CUDA-core FMAs cannot keep up at m = 16 on an H200 (16 fp32 FMAs per code take ~3x the time the code's half byte
// takes to arrive), so the kernel multiplies on tensor cores, mma.sync m16n8k16 with float32 accumulation, the m rows
// as the MMA's 16 (rows past m are zeros), 8 weight rows (output columns) as its n:
//  * Lane (g, t) of a warp (g = lane / 4, t = lane % 4) loads 16 bytes (32 codes) of weight row n0 + g with one
//    128-bit load (ld.global.nc, no L1 allocation: the weight is read once), at code offset 128 c + 32 t of the row:
//    the 4 lanes of a row read 64 contiguous bytes per chunk c, and the warp a whole [8 rows x 128 codes] tile.
//  * The codes become float16 (bfloat16) pairs in registers: (w >> s) & 0x000F000F | 0x64006400 is the pair
//    {1024 + q[i], 1024 + q[i + 4]} (0x4300: 128 + q for bfloat16), exact; subtracting {1024 + z, 1024 + z} is exact
//    too, and one multiply by the block's scale rounds once: W in float16 (bfloat16). For float16 one AND-OR takes
//    the high nibbles as they lie, {1024 + 16 q[i + 1], ...}, and one fused multiply-add by 1/16 minus 64 + z makes
//    them exact too (dequantize_two_pairs): one shift per 8 codes instead of three. The magic + z and -(64 + z) pairs
//    and a scale's pair are built from bits (integer ops), with no conversion instruction.
//  * The order of k within an MMA does not matter to its sum, only that A and B agree: the pairs a lane hands to the
//    MMA as its B fragment (logical k 2t, 2t+1 and 2t+8, 2t+9 of column g) are codes (i, i + 4) and (i + 1, i + 5) of
//    its own 8-code word; x's A fragment takes the same k of rows g and g + 8 (two __byte_perm of the 16-byte loads
//    of x, which every one of the block's 8 weight rows x 4 tiles reuses). Eight MMAs consume one 16-byte load.
//  * A block is 8 warps on 1, 2 or 4 such tiles (8, 16 or 32 output columns: its grid's `tiles`) and one 16-row
//    slice of x; its warps take the K chunks in turn (warp w: chunks w, w + 8, ...). Each warp keeps at least
//    kInFlight = 4 16-byte weight loads per lane in flight (max(2, 4 / tiles) chunks ahead), each with its chunk's
//    scales and zero-point byte, which are converted only when the chunk is multiplied: no load waits where it is
//    issued. Rows of x past m read row m - 1 (their MMA rows are never stored): no branch on the row. The warps'
//    float32 sums meet in shared memory in a fixed order. Nsight Compute on the first version (2026-12-03, 8192 x
//    8192, m = 1) found it bound by its instructions, not by memory (issue slots 47% busy at 25% occupancy, 172
//    instructions per 16 bytes of weight per warp, DRAM 25% of its peak), and the same loads without the multiplies
//    ran in half the time: hence the float16 dequantization above, the constants from bits and no branches (1.1-1.7x
//    faster at every shape measured; DRAM still 28% busy, issue slots 49%: the instructions per code are the next
//    limit).
//  * The grid: fewer tiles per block make more blocks (a 4096-column GEMV is 128 blocks of 32 columns, under one per
//    SM, or 256 of 16); more tiles reuse each x fragment over more weight rows but take 128 registers (2 blocks per
//    SM, some spilled) where 1 or 2 take 80 (3 blocks). Every grid timed on the H200 (2026-12-03, docs/benchmarks.md)
//    ranked 2 tiles first, or within 3% of the first, at m <= 8, and 4 tiles at m = 16 (x's fragments: at m = 16, 2
//    tiles took up to 1.7x longer), except where 4 tiles leave SMs without a block; one tile per block is never
//    offered at m > 8 (it would read x from L1 eight times per weight load). So the default is 2 tiles (m <= 8) or 4,
//    falling back to fewer tiles when the blocks would not cover the SMs, and when no grid covers them unsplit, K is
//    also cut into `splits` parts (grid z): each part's sums go to a float32 workspace and a second kernel adds them
//    in order, with the bias, the split chosen by grid_score (the balance of blocks over SMs, bytes in flight per
//    SM). The other grids are tactics, timed under auto:BestPerformance (Note [Tactics] in
//    core/dispatcher.cpp) and replayed from the plan record {"tiles", "splits"}. Results do not depend on the run,
//    nor on the tiles (the same sums in the same order); a split changes the order of the float32 additions.
//
// Note [Int4 GEMM streamed through shared memory]
// At m <= 8 (decoding) the kernel above wastes half of each MMA (rows g + 8 of x repeat rows g) and keeps its loads in
// registers, so the loads of a warp wait behind its multiplies. The streaming kernel (int4_stream_kernel) swaps the
// operands: the weight is the MMA's A (16 weight rows: rows g and g + 8 of a lane's pair of tiles), x^T its B (x's m
// rows as the MMA's 8 columns, rows past m reading row m - 1, never stored), so an MMA consumes 16 weight rows and the
// lane's x fragment is 2 registers, not 4 (m 9-16: kHalves 2, x's rows 8-15 a second MMA on the same weights); and the
// weights go global -> shared memory by cp.async (no registers held while in flight) through a ring of kStages chunks
// per warp (kStreamRingBytes: 4 chunks of one pair of tiles, 2 of two), each lane reading back only the 16 bytes it
// copied (no barrier), the chunk's scales and zero points loaded with it into a register ring. x's row is read 16 bytes
// at a time and unchecked when every chunk lies inside K (kXWholeChunks), the usual case; with blocks of 128 codes or
// more a row's chunk has one scale, so the MMAs take code - zero (exact in float16/bfloat16) and the chunk's float32
// sums are scaled after them (kScaleAfter): 4 fused multiply-adds per chunk and pair instead of 32 half multiplies.
// Blocks of 16 codes keep the other kernel (two scales per word). First timings (H200, 2026-12-03, block 32, m = 1):
// 11008 x 4096 13.97 us against 15.90 for the other kernel's best grid, 8192 x 8192 18.18 against 21.70; by ncu (8192 x
// 8192, 2 tiles) 139 instructions per 16 bytes of weight per lane, issue slots 60% busy, 1.29 waves: hence 4 tiles (one
// wave of 256 blocks at 2 per SM) first where they cover the SMs. At m 9-16 it timed no faster than the kernel above
// until its scales were staged in shared memory (Note [x in shared memory for the streaming kernel]); since, its 4
// tiles are the default there where they cover the SMs, its 2 tiles a tactic (ranked_configs). A deeper ring
// (kDeepRingBytes: 4 chunks a warp at 4 tiles, m <= 8) is a further tactic, for the H100 where this kernel is neither
// at the bandwidth nor at its instructions' limit (2026-12-06: 64% of the copy bandwidth at 8192 x 8192). Nsight
// Compute there (2026-12-07, 4 tiles, m = 1, 116 registers) found it latency-bound: 0.48 warps issued a scheduler, 3.1
// of its 8 cycles per instruction waiting on L1TEX. x read from the ring instead (its rows copied by cp.async with each
// chunk's weights, a __syncwarp after the wait) was timed the same day on an H100 and was slower at every grid (8192 x
// 8192, m = 1: 22.8 against 20.1 us; m = 8: 34.2 against 21.0; 122 registers): x's loads are not what the warps wait
// on, and the tactic was removed. More resident warps were timed too (H100, 2026-12-07, block 32, m = 1): the 2-tile
// kernel capped at 64 registers (4 blocks an SM, 24 bytes spilled) ran 8192 x 8192 in 20.95 us against 22.88 at its 80
// (3 blocks), yet behind the 4 tiles' 19.71 at 116 (2 blocks); the 4 tiles capped at 80 (3 blocks) spilled 96 bytes and
// took 24.69; at 11008 x 4096 both caps were slower. So occupancy helps only where it costs no spills, and neither
// kernel reaches it without a leaner loop: the tactic was not kept. Blocks of 128 codes (kScaleAfter, ONNX Runtime's
// MatMul4BitsQuantizer default) ran 8192 x 8192 at m = 1 in 17.39 us (67% of the copy bandwidth) against 19.95 for
// blocks of 32: the instructions per code, not the bytes, set the pace.
//
// Note [Int4 GEMV with sub-blocks as the MMA's columns]
// At m <= 4 (decoding) both kernels above spend most of their instructions per code on the dequantization (code - zero
// and the multiply by the scale of its 32-code block: a block's codes meet in one MMA with other blocks' codes, so
// the scale goes in before it) and on a warp's per-chunk bookkeeping; the MMA's 8 columns hold x's m rows, the rest
// wasted. The GEMV kernel (int4_gemv_kernel) uses those columns for the blocks instead: lane (g, t) loads 16 bytes (a
// 32-code sub-block) of weight rows g and g + 8 at sub-block t of a 4-sub-block group, so the MMA's k slots of lane t
// (2t, 2t + 1, 2t + 8, 2t + 9) hold sub-block t's codes; x's B fragment carries sub-block c % 4 of x row c / 4 in
// column c (only the lanes with t == c % 4 carry x, the others zeros). D[row][c] is then row's dot product with x over
// one sub-block, so each accumulator is one (row, sub-block, x row) and the scale and zero point apply after the MMA:
//  * the codes go in raw: a LOP3 per pair, (w & 0x000F000F) | 0x6400 6400 = {1024 + q} for the even codes, and
//    (w & 0x00F000F0) | magic = {1024 + 16 q} for the odd ones without a shift (bfloat16: 128 + q, shifted); the
//    products with x are exact in the MMA's float32, and the even and odd codes go to separate accumulators;
//  * y += scale * (even + odd / 16 - C - zero * X) per accumulator, X the sum of x over the sub-block and C = 1024
//    X_even + 64 X_odd (bfloat16: 128 X), both laid out in shared memory with x's fragments once per block (its
//    split's K range). The subtraction cancels about 10 bits of float32's 24 (1024 against codes below 16): the
//    result keeps about 14, above float16's 11;
//  * a warp takes groups w, w + 8, ... (kSpan of them per stage, kStages stages in flight: 8 16-byte weight loads
//    per lane), each block one 16-row tile; the warps' sums meet in shared memory in a fixed order (results do not
//    depend on the run; a K split changes the order of the float32 additions, as above).
// At m = 1 (kWide) a group is 8 sub-blocks and the 8 columns are 8 sub-blocks of x's one row (lane t loads sub-blocks
// t and t + 4: slots 2t, 2t + 1 and 2t + 8, 2t + 9), so no column is wasted; x's B fragments lie in shared memory as
// each lane gives them (a pair beside a zero), which saves the register moves two sources would need. So a code
// costs a LOP3 (and a shift per 8), an eighth of an MMA and its share of 4 float32 operations per (row, sub-block);
// m 3-4 run a second MMA per weight fragment (x rows 2 and 3). Blocks of 16 codes, K not a multiple of 32, x off
// 16-byte alignment or shared memory over 100 KB take the streaming kernel instead.
// Measured (H100, 2026-12-06, docs/benchmarks.md): about 120 SASS instructions per KB of weight in its loop against
// about 205 for the streaming kernel, yet slower at every shape but one (8192 x 8192, m = 1: 24.0 us against 19.7;
// 11008 x 4096, m = 4: 15.39 against 15.41): on the H100 the streaming kernel is not bound by its instructions (63% of
// the measured copy bandwidth at 8192 x 8192), and this kernel waits on its prologue (x, {X, C}, the scales into
// shared memory before the first MMA). So it is a tactic that auto:BestPerformance times, not the default.
//
// Larger m take the library GEMM (int4_gemm_register.cpp): each code is then used often enough that dequantizing the
// weight once per call into a float16 workspace and running cuBLAS on it costs little more than the GEMM itself.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/int4_gemm.h"
#include "backends/cuda_raw/ptx.cuh"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

constexpr int kChunk = 128;   // codes of a weight row one warp takes per step: 4 lanes x 32
constexpr int kInFlight = 4;  // 16-byte weight loads in flight per lane (at least: tiles of the block x stages, >= 2)
constexpr int kWarps = 8;
constexpr int kBlockThreads = kWarps * 32;
constexpr int kTileChoices[] = {4, 2, 1};  // tiles of 8 output columns per block, in order of preference
constexpr int kStreamMaxRows = 16;         // the streaming kernel's m: x's rows are the MMA's 8 columns, twice
constexpr int kCachedDevices = 64;

template <typename V>
__device__ __forceinline__ V bits_as(std::uint32_t u) {
  V v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

template <typename V>
__device__ __forceinline__ std::uint32_t as_bits(V v) {
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}

// The float16 / bfloat16 specifics: the magic number whose low mantissa bits take a 4-bit code, pairs, the MMA.
template <typename T>
struct Half;

template <>
struct Half<__half> {
  using Pair = __half2;
  static constexpr std::uint32_t kMagic = 0x64006400u;  // 1024.0 in each half; + q in the low 10 mantissa bits
  __device__ static Pair pair(float v) { return __float2half2_rn(v); }
  __device__ static void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Half<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static constexpr std::uint32_t kMagic = 0x43004300u;  // 128.0 in each bfloat16; + q in the low 7 mantissa bits
  __device__ static Pair pair(float v) { return __float2bfloat162_rn(v); }
  __device__ static void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // refused by int4_gemm_mma_refusal below compute capability 8.0
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
  }
};

// (a & kMask) | kMagic in one LOP3: written as two C++ operations, ptxas emits two instructions (an instruction takes
// one immediate), which in the dequantization below was 32 of a chunk's ~235 (SASS, 2026-12-03).
template <std::uint32_t kMask, std::uint32_t kMagic>
__device__ __forceinline__ std::uint32_t and_or(std::uint32_t a) {
  std::uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "n"(kMask), "n"(kMagic));  // 0xEA: (a & b) | c
  return r;
}

// Codes (i, i + 4) of a word shifted right by 4 i, as the pair (code - zero) * scale: exact until the multiply.
// kScaled false: code - zero only (exact), the scale applied after the MMA (Note [Int4 GEMM streamed through shared
// memory]).
template <typename T, bool kScaled>
__device__ __forceinline__ std::uint32_t dequantize_pair(std::uint32_t shifted, typename Half<T>::Pair zero_magic,
                                                         typename Half<T>::Pair scale) {
  using Pair = typename Half<T>::Pair;
  const Pair biased = bits_as<Pair>(and_or<0x000F000Fu, Half<T>::kMagic>(shifted));
  const Pair centred = __hsub2(biased, zero_magic);
  return as_bits(kScaled ? __hmul2(centred, scale) : centred);
}

// float16 only: codes (i, i + 4) and (i + 1, i + 5) of a word shifted right by 4 i (i = 0 or 2) as two pairs. The low
// nibbles' pair is {1024 + q} and the high nibbles' {1024 + 16 q} (bits 4-7 are still inside float16's 10-bit
// mantissa; not bfloat16's 7); subtracting 1024 + z from the first, and 1/16 of the second minus 64 + z in one fused
// multiply-add, are exact, so each pair rounds once, at the multiply by the scale: the bits of dequantize_pair's.
template <bool kScaled>
__device__ __forceinline__ void dequantize_two_pairs(std::uint32_t shifted, __half2 zero_magic, __half2 minus_zero_64,
                                                     __half2 scale, std::uint32_t& low, std::uint32_t& high) {
  const __half2 a = bits_as<__half2>(and_or<0x000F000Fu, Half<__half>::kMagic>(shifted));
  const __half2 b = bits_as<__half2>(and_or<0x00F000F0u, Half<__half>::kMagic>(shifted));
  const __half2 a_centred = __hsub2(a, zero_magic);
  const __half2 b_centred = __hfma2(b, bits_as<__half2>(0x2C002C00u), minus_zero_64);  // 1/16 in each half
  low = as_bits(kScaled ? __hmul2(a_centred, scale) : a_centred);
  high = as_bits(kScaled ? __hmul2(b_centred, scale) : b_centred);
}

// 16 bytes of the weight, read once: streaming (evict first), so that x's fragments stay cached. An intrinsic, not
// inline assembly, so that a load under a condition is predicated rather than branched around.
__device__ __forceinline__ uint4 load_streaming(const std::uint8_t* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Codes [k0, k0 + 8) of one row of x as 4 pairs, zeros past k (the codes of the last block's padding need not be 0).
template <typename T, bool kVectorX>
__device__ __forceinline__ uint4 load_x8(const T* row, int k0, int k) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if constexpr (kVectorX) {  // k is a multiple of 8: a group is all in or all out
    return k0 < k ? __ldg(reinterpret_cast<const uint4*>(row + k0)) : v;
  } else {
    T e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = k0 + i < k ? row[k0 + i] : from_float<T>(0.0f);
    std::memcpy(&v, e, sizeof(v));
    return v;
  }
}

// A scale as a pair of T: its bits twice when it is a T already.
template <typename T, typename S>
__device__ __forceinline__ typename Half<T>::Pair scale_pair(S s) {
  if constexpr (std::is_same_v<S, T>) {
    std::uint16_t b;
    std::memcpy(&b, &s, sizeof(b));
    return bits_as<typename Half<T>::Pair>(static_cast<std::uint32_t>(b) * 0x00010001u);
  } else {
    return Half<T>::pair(to_float(s));
  }
}

// What dequantizes a row's codes of one block (Note [Int4 GEMM on the GPU]): the scale's pair, magic + z in each half
// (built from bits: the magic number's unit in the last place is 1) and, for float16's high nibbles, -(64 + z) (64
// is 0x5400, its unit in the last place 1/16).
template <typename T>
struct DequantConstants {
  typename Half<T>::Pair scale, zero, zero_64;
};

template <typename T, typename S>
__device__ __forceinline__ DequantConstants<T> dequant_constants(S scale, unsigned zero_point) {
  using Pair = typename Half<T>::Pair;
  return {scale_pair<T>(scale), bits_as<Pair>(((Half<T>::kMagic & 0xFFFFu) + zero_point) * 0x00010001u),
          bits_as<Pair>((0xD400u + 16u * zero_point) * 0x00010001u)};
}

// Codes of one 8-code word of a weight row as the 4 pairs an MMA takes: nibbles (0, 4), (1, 5), (2, 6), (3, 7);
// kScaled false: code - zero only (the scale applied after the MMA).
template <typename T, bool kScaled>
__device__ __forceinline__ void dequantize_word(std::uint32_t codes, const DequantConstants<T>& k,
                                                std::uint32_t (&q)[4]) {
  if constexpr (std::is_same_v<T, __half>) {
    dequantize_two_pairs<kScaled>(codes, k.zero, k.zero_64, k.scale, q[0], q[1]);
    dequantize_two_pairs<kScaled>(codes >> 8, k.zero, k.zero_64, k.scale, q[2], q[3]);
  } else {
    q[0] = dequantize_pair<T, kScaled>(codes, k.zero, k.scale);
    q[1] = dequantize_pair<T, kScaled>(codes >> 4, k.zero, k.scale);
    q[2] = dequantize_pair<T, kScaled>(codes >> 8, k.zero, k.scale);
    q[3] = dequantize_pair<T, kScaled>(codes >> 12, k.zero, k.scale);
  }
}

// x's 8 codes (one 16-byte load of a row) as the pairs that meet the weight's pairs of dequantize_word: codes (0, 4),
// (1, 5) for a word's first MMA, (2, 6), (3, 7) for its second.
__device__ __forceinline__ void x_pairs(const uint4& xa, std::uint32_t (&b)[4]) {
  b[0] = __byte_perm(xa.x, xa.z, 0x5410);
  b[1] = __byte_perm(xa.x, xa.z, 0x7632);
  b[2] = __byte_perm(xa.y, xa.w, 0x5410);
  b[3] = __byte_perm(xa.y, xa.w, 0x7632);
}

struct MmaParams {
  int m = 0, n = 0, k = 0;
  int blocks = 0;           // of the packed rows
  int block_shift = 0;      // log2(block_size)
  int row_bytes = 0;        // blocks * block_size / 2
  int row_codes = 0;        // blocks * block_size
  int chunks = 0;           // ceil(row_codes / kChunk)
  int chunks_per_split = 0;
  int zero_row = 0;         // ceil(blocks / 2)
  bool bias_float = false;  // bias is float32 (else T)
};

// What one chunk of one warp needs from memory for the lane's kTiles weight rows: the weights' 16 bytes, the scales
// of the block(s) they fall in and the zero points' byte, loaded together kStages chunks ahead of their use (Note
// [Int4 GEMM on the GPU]); converted only when multiplied, so that no load waits where it is issued.
template <typename S, int kTiles, int kScales>
struct Stage {
  uint4 w[kTiles];
  S scale[kTiles][kScales];
  unsigned zero[kTiles];  // the zero points' byte of the lane's block(s); 0x88 (8 and 8) without zero points
};

template <typename S, int kTiles, int kScales>
__device__ __forceinline__ void load_stage(const MmaParams& p, const std::uint8_t* __restrict__ weight,
                                           const S* __restrict__ scales, const std::uint8_t* __restrict__ zero_points,
                                           int c, bool live_chunk, int n_first, Stage<S, kTiles, kScales>& st) {
  const int kc = c * kChunk + (threadIdx.x & 3) * 32;
  const bool live = live_chunk && kc < p.row_codes;
  const int b = live ? kc >> p.block_shift : 0;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int n = n_first + 8 * j;
    const bool row = live && n < p.n;  // else zeros: a column past n is computed but not stored
    st.w[j] = row ? load_streaming(weight + static_cast<std::int64_t>(n) * p.row_bytes + kc / 2)
                  : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int h = 0; h < kScales; ++h) {
      st.scale[j][h] = row ? __ldg(scales + static_cast<std::int64_t>(n) * p.blocks + b + h) : from_float<S>(0.0f);
    }
    st.zero[j] = row && zero_points != nullptr
                     ? __ldg(zero_points + static_cast<std::int64_t>(n) * p.zero_row + (b >> 1))
                     : 0x88u;
  }
}

// One chunk of one warp: the stage's scales and zero points as pairs, then per 8-code word x's A fragments (rows g
// and g + 8) and 2 MMAs per tile. Every lane runs the MMAs (they are warp-wide): a lane past the packed row (K not a
// multiple of the chunk) multiplies zeros (scale 0).
template <typename T, typename S, int kTiles, bool kBlock16, bool kVectorX, bool kUpper>
__device__ __forceinline__ void multiply_stage(const MmaParams& p, int c, const Stage<S, kTiles, kBlock16 ? 2 : 1>& st,
                                               const T* x0, const T* x1, float (&acc)[kTiles][4]) {
  const int kc = c * kChunk + (threadIdx.x & 3) * 32;  // this lane's first code
  constexpr int kScales = kBlock16 ? 2 : 1;
  const int nibble = kBlock16 ? 0 : (kc >> p.block_shift) & 1;  // of the first block; block 16: blocks b (even), b + 1
  DequantConstants<T> k[kTiles][kScales];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int h = 0; h < kScales; ++h) {
      k[j][h] = dequant_constants<T>(st.scale[j][h], (st.zero[j] >> (4 * (nibble + h))) & 0xFu);
    }
  }
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    // A fragments (Note [Int4 GEMM on the GPU]): steps 2 word (codes 0/4, 1/5 of the word) and 2 word + 1 (2/6, 3/7).
    // Without rows g + 8 (m <= 8: kUpper false) the MMA's upper rows take row g's values again, and are not stored.
    const uint4 xa = load_x8<T, kVectorX>(x0, kc + 8 * word, p.k);
    const uint4 xb = kUpper ? load_x8<T, kVectorX>(x1, kc + 8 * word, p.k) : xa;
    std::uint32_t ra[4], rb[4];  // rows g and g + 8
    x_pairs(xa, ra);
    x_pairs(xb, rb);
    const std::uint32_t a0[4] = {ra[0], rb[0], ra[1], rb[1]};
    const std::uint32_t a1[4] = {ra[2], rb[2], ra[3], rb[3]};
    const int h = kBlock16 ? word >> 1 : 0;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      std::uint32_t q[4];
      dequantize_word<T, true>(word_of(st.w[j], word), k[j][h], q);
      Half<T>::mma(acc[j], a0, q[0], q[1]);
      Half<T>::mma(acc[j], a1, q[2], q[3]);
    }
  }
}

// y[row, col] = sum + bias, or the split's partial sum (blockIdx.z's slice of the workspace).
template <typename T>
__device__ __forceinline__ void store_sum(const MmaParams& p, int row, int col, float sum, const void* bias, T* y,
                                          float* partial) {
  const std::int64_t at = static_cast<std::int64_t>(row) * p.n + col;
  if (partial != nullptr) {
    partial[static_cast<std::int64_t>(blockIdx.z) * p.m * p.n + at] = sum;
    return;
  }
  if (bias != nullptr) {
    sum += p.bias_float ? static_cast<const float*>(bias)[col] : to_float(static_cast<const T*>(bias)[col]);
  }
  y[at] = from_float<T>(sum);
}

// A block: kWarps warps over kTiles tiles of 8 output columns and 16 rows of x; warp w takes the chunks w, w + kWarps,
// ... of its split, kStages of them in flight at a time (kTiles x kStages >= kInFlight 16-byte loads per lane).
template <typename T, typename S, int kTiles, bool kBlock16, bool kVectorX, bool kUpper>
__global__ void __launch_bounds__(kBlockThreads, kTiles == 4 ? 2 : 3)
    int4_mma_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ weight, const S* __restrict__ scales,
                    const std::uint8_t* __restrict__ zero_points, const void* __restrict__ bias, T* __restrict__ y,
                    float* __restrict__ partial, MmaParams p) {
  constexpr int kStages = kInFlight / kTiles > 2 ? kInFlight / kTiles : 2;
  constexpr int kScales = kBlock16 ? 2 : 1;
  constexpr int kColumns = 8 * kTiles;
  __shared__ float sums[kWarps][kTiles][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int n_block = blockIdx.x * kColumns, m_block = blockIdx.y * 16;
  const int n_first = n_block + g;
  const int r0 = m_block + g, r1 = m_block + g + 8;
  // Rows past m read row m - 1: their MMA rows are computed and never stored (no branch on the row in the loop).
  const T* x0 = x + static_cast<std::int64_t>(min(r0, p.m - 1)) * p.k;
  const T* x1 = x + static_cast<std::int64_t>(min(r1, p.m - 1)) * p.k;
  const int c_begin = blockIdx.z * p.chunks_per_split;
  const int c_end = min(p.chunks, c_begin + p.chunks_per_split);
  float acc[kTiles][4] = {};
  Stage<S, kTiles, kScales> stage[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int c = c_begin + warp + s * kWarps;
    load_stage(p, weight, scales, zero_points, c, c < c_end, n_first, stage[s]);
  }
  for (int c = c_begin + warp; c < c_end; c += kStages * kWarps) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int cs = c + s * kWarps;
      if (cs >= c_end) break;  // warp-uniform
      multiply_stage<T, S, kTiles, kBlock16, kVectorX, kUpper>(p, cs, stage[s], x0, x1, acc);
      const int next = cs + kStages * kWarps;  // the stage's next chunk, in flight while the others multiply
      load_stage(p, weight, scales, zero_points, next, next < c_end, n_first, stage[s]);
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sums[warp][j][lane][i] = acc[j][i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTiles * 32 * 4; e += kBlockThreads) {
    const int j = e / 128, l = (e / 4) % 32, i = e % 4;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += sums[w][j][l][i];
    // The accumulator layout of m16n8k16: rows l / 4 and l / 4 + 8, columns 2 (l % 4) and 2 (l % 4) + 1.
    const int row = m_block + (l >> 2) + 8 * (i >> 1);
    const int col = n_block + 8 * j + 2 * (l & 3) + (i & 1);
    if (row >= p.m || col >= p.n) continue;
    store_sum(p, row, col, sum, bias, y, partial);
  }
}

// ---- the streaming kernel of m <= 16 (Note [Int4 GEMM streamed through shared memory]) ----

constexpr int kStreamRingBytes = 4096;                              // a warp's ring of chunks in shared memory
constexpr int kStreamSmemBytes = kWarps * kStreamRingBytes;         // per block (dynamic shared memory)
// The deep ring, a tactic of 4 tiles at m <= 8 (Int4MmaConfig::ring): 4 chunks a warp, so that 3 stay in flight while
// one is multiplied (the default's 2 keep one: about 32 KB a SM at 2 blocks, near what an H100's loaded latency
// needs). Not yet timed on a GPU.
constexpr int kDeepRingBytes = 8192;

// Chunks a warp's ring of kRing bytes holds: each is 64 bytes of 16 weight rows per pair of tiles (1 KB), so 4 or 2
// (the deep ring of two pairs: 4).
template <int kPairs, int kRing>
constexpr int stream_stages() {
  return kRing / (kPairs * 1024);
}

// How the streaming kernel reads x: element by element (K not a multiple of 8 or x unaligned), 16 bytes at a time
// with a check against K, 16 bytes unchecked when every chunk lies whole inside K (K a multiple of kChunk), or, with
// whole chunks, from shared memory where the block's prologue laid out its rows of x as the MMA's B fragments (Note
// [x in shared memory for the streaming kernel]); kXShared and kXScalesShared also read the scales and zero points
// from shared memory, kXScalesShared x from global memory, kXOnlyShared x only from shared memory.
enum StreamX : int {
  kXElements = 0,
  kXVectors = 1,
  kXWholeChunks = 2,
  kXShared = 3,
  kXScalesShared = 4,
  kXOnlyShared = 5,
};
template <int kX>
constexpr bool stages_x() {
  return kX == kXShared || kX == kXOnlyShared;
}
template <int kX>
constexpr bool stages_scales() {
  return kX == kXShared || kX == kXScalesShared;
}

// Note [x in shared memory for the streaming kernel]
// Nsight Compute's stall sampling of the streaming kernel (H100, 2026-12-07, 8192 x 8192, m = 1, blocks of 32) put 31%
// of its warps' stalls on the byte permutes of x's fragments, each waiting on its 16-byte load of x from global memory
// issued a few dozen instructions earlier: every block reads each chunk of x once, so those loads come from L2, not
// L1, at L2's latency. Where x's rows of a block's K range fit in kStreamXLimit bytes, the block's threads copy them
// once into shared memory after issuing the first chunks' weights (whose copies stay in flight meanwhile), as the B
// fragments each 16-byte word gives (codes 0 4, 1 5, 2 6, 3 7: no permute in the loop), at [row][chunk][word][t] with
// a row padded by 64 bytes so that the lanes' rows fall in other banks; the loop reads one 16-byte word of shared
// memory per MMA pair instead of a global load and two permutes. The sums are those of the global loads (the same
// values in the same MMAs). Timed on an H100 (2026-12-07, blocks of 32, m = 1, the grids side by side): 8192 x 8192
// 17.60 us against 19.64 with x from global memory (record {"x": "global"}), 11008 x 4096 13.98 against 14.65, 4096 x
// 4096 7.82 against 8.72. The scales and zero points staged the same way (copied through registers by the prologue,
// read from shared memory in the loop: 85-89 registers instead of 116) were timed slower on another H100 the same day
// (8192 x 8192, m = 1: scales only 20.74 us against 20.15 for nothing staged): the prologue then waits on memory once
// per few scales before its first multiply, and so that variant was not kept.
// The same profile showed most of the loop's integer instructions computing the addresses of each chunk's scales and
// zero points (a 64-bit address and a predicate per row) and their loads waiting in registers a stage ahead. So where
// they fit in kStreamScaleLimit bytes, the prologue also copies the block's rows of scales and zero points over the
// split's blocks into shared memory ([row][block], each row padded by 16 bytes so that the 8 rows a warp reads at once
// fall in other banks), and the loop reads a chunk's with one 32-bit shared address per row. They are copied by
// cp.async (16 or 4 bytes a copy, as the rows' alignment allows; none where it allows neither), committed as one group
// before the first chunks' weights, and waited for before the prologue's barrier: a copy through registers made the
// prologue wait on one round trip to memory per few scales (timed: slower than no staging). Timed on an H100
// (2026-12-07 11:51 UTC, blocks of 32, 4 tiles, one split, the records side by side in one run): 8192 x 8192 m = 1
// 16.98 us with both staged, 18.18 with x only (the earlier default), 17.94 with the scales only, 19.98 with neither;
// m = 8 18.89 / 20.54 / 18.94 / 20.51; m = 16 21.18 / 22.56 / 21.00 / 22.49. Records {"staging": "x" | "scales" |
// "none"} keep the other three.
// 40 KB: 2 rows of K = 8192, 4 of K = 4096; three blocks of the 2-tile kernel (32 KB of ring each) still fit an SM.
constexpr int kStreamXLimit = 40 * 1024;

// 16-byte words of a row of x in the shared layout: the split's chunks times 16, and 4 of padding.
__host__ __device__ constexpr int stream_x_stride(int chunks_per_split) { return chunks_per_split * 16 + 4; }

constexpr int kStreamScaleLimit = 24 * 1024;

// The cp.async piece that copies rows of `stride` bytes from `base`: 16 or 4 bytes (both multiples of it), else 0.
__host__ __device__ inline int stage_piece(std::int64_t stride, const void* base) {
  const auto bits =
      static_cast<std::uint64_t>(stride) | static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(base));
  return bits % 16 == 0 ? 16 : bits % 4 == 0 ? 4 : 0;
}

// Where the prologue puts a block's scales and zero points (rows of 16 kPairs columns over a split's blocks, each from
// the cp.async piece below its first block to the piece past its last): scale rows of `scale_stride` bytes, then zero
// point rows of `zero_stride` bytes (both 128-byte multiples plus 16, so that 8 rows fall in 8 bank groups).
struct StreamScaleLayout {
  int scale_stride = 0, zero_stride = 0, bytes = 0;
};

__host__ __device__ inline StreamScaleLayout stream_scale_layout(const MmaParams& p, int rows, int scale_bytes,
                                                                 bool zero_points) {
  const int block = 1 << p.block_shift;
  const int blocks = min(p.blocks, (p.chunks_per_split * kChunk + block - 1) / block + 1);  // of a split, at most
  StreamScaleLayout l;
  l.scale_stride = (blocks * scale_bytes + 32 + 127) / 128 * 128 + 16;
  l.zero_stride = zero_points ? (blocks / 2 + 2 + 32 + 127) / 128 * 128 + 16 : 0;
  l.bytes = rows * (l.scale_stride + l.zero_stride);
  return l;
}

// Bytes [lo, hi) of `rows` rows (global row r at src + r src_stride, shared row r at dst + r dst_stride) by cp.async
// in pieces of `piece` bytes; rows at or past `live_rows` are zeros.
__device__ __forceinline__ void stage_rows(std::uint32_t dst, int dst_stride, const std::uint8_t* src,
                                           std::int64_t src_stride, int rows, int live_rows, int lo, int hi,
                                           int piece) {
  const int per_row = (hi - lo) / piece;
  for (int e = threadIdx.x; e < rows * per_row; e += kBlockThreads) {
    const int r = e / per_row, i = lo + (e % per_row) * piece;
    const bool live = r < live_rows;
    const std::uint8_t* from = live ? src + r * src_stride + i : src;
    const std::uint32_t to = dst + r * dst_stride + (i - lo);
    piece == 16 ? ptx::cp_async_16(to, from, live ? 16 : 0) : ptx::cp_async_4(to, from, live ? 4 : 0);
  }
}

// A chunk's scale and zero points' byte for each weight row of the lane (rows g and g + 8 of each pair), loaded when
// its weights are issued (kStages chunks ahead of their use) and converted when they are multiplied.
template <typename S, int kRows>
struct StreamSide {
  S scale[kRows];
  unsigned zero[kRows];
};

// Where a lane reads its weight rows: row r of the 2 kPairs (rows g, g + 8 of each pair: column n_block + 8 r + g) at
// the first pointers plus r times the strides.
template <typename S>
struct StreamRows {
  const std::uint8_t* weight;  // row 0's first byte of the lane: row start + 16 t
  const S* scales;
  const std::uint8_t* zeros;   // null without zero points
  std::int64_t weight_stride, scale_stride, zero_stride;  // 8 rows
  unsigned live;               // bit r: row r exists (n < p.n)
};

// Issues chunk c's copies for the lane (cp.async into `stage_address`, zeros past the row or the split) and loads its
// scales and zero points; one commit group per chunk, empty ones included, so that the count of groups in flight
// stays kStages.
template <typename S, int kRows, int kX>
__device__ __forceinline__ void issue_chunk(const MmaParams& p, const StreamRows<S>& rows, int c, int c_end,
                                            std::uint32_t stage_address, StreamSide<S, kRows>& side) {
  const int kc = c * kChunk + (threadIdx.x & 3) * 32;
  const bool live = c < c_end && (kX >= kXWholeChunks || kc < p.row_codes);
  const int b = live ? kc >> p.block_shift : 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const bool on = live && ((rows.live >> r) & 1u) != 0;
    const std::uint8_t* src = rows.weight + r * rows.weight_stride + c * (kChunk / 2);
    ptx::cp_async_16(stage_address + r * 512, on ? src : rows.weight, on ? 16 : 0);
    if constexpr (!stages_scales<kX>()) {  // else read from shared memory when multiplied
      side.scale[r] = on ? __ldg(rows.scales + r * rows.scale_stride + b) : from_float<S>(0.0f);
      side.zero[r] = on && rows.zeros != nullptr ? __ldg(rows.zeros + r * rows.zero_stride + (b >> 1)) : 0x88u;
    }
  }
  ptx::cp_async_commit();
}

// x's 8 codes [k0, k0 + 8) of a row as the B fragments of the chunk's word: codes (0, 4), (1, 5) for its first MMA,
// (2, 6), (3, 7) for its second. `xc`: the row at the lane's first code of the chunk.
template <typename T, int kX>
__device__ __forceinline__ void x_fragments(const MmaParams& p, const T* xc, int kc, int word, std::uint32_t (&b)[4]) {
  uint4 xa;
  if constexpr (stages_x<kX>()) {  // `xc`: the lane's fragment of word 0 in shared memory, laid out already
    xa = reinterpret_cast<const uint4*>(xc)[4 * word];
    b[0] = xa.x;
    b[1] = xa.y;
    b[2] = xa.z;
    b[3] = xa.w;
    return;
  } else if constexpr (kX == kXWholeChunks || kX == kXScalesShared) {
    xa = __ldg(reinterpret_cast<const uint4*>(xc) + word);
  } else {
    xa = load_x8<T, kX == kXVectors>(xc - kc, kc + 8 * word, p.k);
  }
  x_pairs(xa, b);
}

// One chunk of one warp: the weights (rows g, g + 8 of each pair) as the MMA's A, x's row g (and g + 8: kHalves 2) as
// its B column g. `xc`: x's rows at the lane's first code of the chunk. kScaleAfter (blocks of kChunk codes or more,
// so one block per row and chunk): the MMAs take code - zero, and the chunk's sums are scaled in float32 after them.
template <typename T, typename S, int kPairs, int kHalves, int kX, bool kScaleAfter>
__device__ __forceinline__ void multiply_chunk(const MmaParams& p, int c, const uint4 (&w)[2 * kPairs],
                                               const StreamSide<S, 2 * kPairs>& side, const T* const (&xc)[kHalves],
                                               float (&acc)[kPairs][kHalves][4]) {
  constexpr int kRows = 2 * kPairs;
  const int kc = c * kChunk + (threadIdx.x & 3) * 32;
  const int nibble = (kc >> p.block_shift) & 1;
  DequantConstants<T> k[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) k[r] = dequant_constants<T>(side.scale[r], (side.zero[r] >> (4 * nibble)) & 0xFu);
  float chunk_sum[kPairs][kHalves][4] = {};  // kScaleAfter: this chunk's unscaled sums
  float(&sum)[kPairs][kHalves][4] = kScaleAfter ? chunk_sum : acc;
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    std::uint32_t b[kHalves][4];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) x_fragments<T, kX>(p, xc[h], kc, word, b[h]);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      std::uint32_t g0[4], g8[4];  // rows g and g + 8 of the pair
      dequantize_word<T, !kScaleAfter>(word_of(w[2 * j], word), k[2 * j], g0);
      dequantize_word<T, !kScaleAfter>(word_of(w[2 * j + 1], word), k[2 * j + 1], g8);
      const std::uint32_t a0[4] = {g0[0], g8[0], g0[1], g8[1]};
      const std::uint32_t a1[4] = {g0[2], g8[2], g0[3], g8[3]};
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        Half<T>::mma(sum[j][h], a0, b[h][0], b[h][1]);
        Half<T>::mma(sum[j][h], a1, b[h][2], b[h][3]);
      }
    }
  }
  if constexpr (kScaleAfter) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const float row_scale[2] = {to_float(side.scale[2 * j]), to_float(side.scale[2 * j + 1])};  // rows g, g + 8
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][h][i] = fmaf(chunk_sum[j][h][i], row_scale[i >> 1], acc[j][h][i]);
      }
    }
  }
}

// A block: kWarps warps over kPairs pairs of 8-column tiles (16 kPairs output columns, the MMA's 16 rows) and every row
// of x (the MMA's 8 columns; m 9-16: kHalves 2, two MMAs per weight fragment); warp w takes the chunks w, w + kWarps,
// ... of its split, through a ring of kStages chunks in shared memory (Note [Int4 GEMM streamed through shared
// memory]). Blocks of 32 codes or more (one scale per lane and chunk).
template <typename T, typename S, int kPairs, int kHalves, int kX, bool kScaleAfter, int kRing = kStreamRingBytes>
__global__ void __launch_bounds__(kBlockThreads, kPairs * kHalves >= 2 ? 2 : 3)
    int4_stream_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ weight, const S* __restrict__ scales,
                       const std::uint8_t* __restrict__ zero_points, const void* __restrict__ bias, T* __restrict__ y,
                       float* __restrict__ partial, MmaParams p) {
  constexpr int kStages = stream_stages<kPairs, kRing>();
  constexpr int kRows = 2 * kPairs;
  extern __shared__ uint4 stream_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n_block = blockIdx.x * 16 * kPairs;
  StreamRows<S> rows;
  const std::int64_t n0 = n_block + g;  // row 0's column (row r: n0 + 8 r, read only where it exists)
  rows.weight = weight + n0 * p.row_bytes + 16 * t;
  rows.scales = scales + n0 * p.blocks;
  rows.zeros = zero_points != nullptr ? zero_points + n0 * p.zero_row : nullptr;
  rows.weight_stride = 8 * static_cast<std::int64_t>(p.row_bytes);
  rows.scale_stride = 8 * static_cast<std::int64_t>(p.blocks);
  rows.zero_stride = 8 * static_cast<std::int64_t>(p.zero_row);
  rows.live = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows.live |= (n0 + 8 * r < p.n ? 1u : 0u) << r;
  uint4* ring = stream_smem + warp * (kRing / 16);  // [stage][row][lane]
  const std::uint32_t ring_address = ptx::shared_address(ring + lane);
  const int c_first = blockIdx.z * p.chunks_per_split;  // the split's first chunk
  const int c_begin = c_first + warp;
  const int c_end = min(p.chunks, static_cast<int>(blockIdx.z + 1) * p.chunks_per_split);
  float acc[kPairs][kHalves][4] = {};
  // Shared memory after the rings: x's rows (stages_x), then the scales' and zero points' rows (stages_scales).
  const int x_stride = stream_x_stride(p.chunks_per_split);
  uint4* xs = stream_smem + kWarps * (kRing / 16);
  const int b_first = (c_first * kChunk) >> p.block_shift;  // the split's first block
  const StreamScaleLayout scale_layout = stream_scale_layout(p, 16 * kPairs, sizeof(S), zero_points != nullptr);
  char* scale_smem = reinterpret_cast<char*>(xs) + (stages_x<kX>() ? min(p.m, kStreamMaxRows) * x_stride * 16 : 0);
  char* zero_smem = scale_smem + 16 * kPairs * scale_layout.scale_stride;
  int scale_lo = 0, zero_lo = 0;  // the first byte of a global row each shared row starts at
  if constexpr (stages_scales<kX>()) {  // one cp.async group, ahead of the weights' (Note [x in shared memory ...])
    const int b_end = min(p.blocks, ((c_end * kChunk - 1) >> p.block_shift) + 1);
    const int live_rows = min(16 * kPairs, p.n - n_block);
    const std::int64_t scale_row_bytes = static_cast<std::int64_t>(p.blocks) * sizeof(S);
    const int piece = stage_piece(scale_row_bytes, scales);
    scale_lo = b_first * static_cast<int>(sizeof(S)) / piece * piece;
    const int hi =
        min(static_cast<int>(scale_row_bytes), (b_end * static_cast<int>(sizeof(S)) + piece - 1) / piece * piece);
    stage_rows(ptx::shared_address(scale_smem), scale_layout.scale_stride,
               reinterpret_cast<const std::uint8_t*>(scales + static_cast<std::int64_t>(n_block) * p.blocks),
               scale_row_bytes, 16 * kPairs, live_rows, scale_lo, hi, piece);
    if (zero_points != nullptr) {
      const int zpiece = stage_piece(p.zero_row, zero_points);
      zero_lo = (b_first >> 1) / zpiece * zpiece;
      const int zhi = min(p.zero_row, (((b_end - 1) >> 1) + zpiece) / zpiece * zpiece);
      stage_rows(ptx::shared_address(zero_smem), scale_layout.zero_stride,
                 zero_points + static_cast<std::int64_t>(n_block) * p.zero_row, p.zero_row, 16 * kPairs, live_rows,
                 zero_lo, zhi, zpiece);
    }
    ptx::cp_async_commit();
  }
  StreamSide<S, kRows> side[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    issue_chunk<S, kRows, kX>(p, rows, c_begin + s * kWarps, c_end, ring_address + s * kRows * 512, side[s]);
  }
  // x's row g at the lane's codes (rows past m read row m - 1: their MMA columns are never stored); stages_x: the
  // lane's fragments of the split's first chunk in shared memory, laid out here while the first chunks are in flight
  // (four loads a thread issued before their stores).
  const T* xrow[kHalves];
  if constexpr (stages_x<kX>()) {
    const int per_row = (c_end - c_first) * (kChunk / 8), total = min(p.m, 8 * kHalves) * per_row;
    for (int e0 = threadIdx.x; e0 < total; e0 += 4 * kBlockThreads) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = e0 + u * kBlockThreads, r = e / per_row, j = e % per_row;  // row r's codes 8 j .. 8 j + 7
        const T* x_row = x + static_cast<std::int64_t>(r) * p.k + c_first * kChunk;
        if (e < total) v[u] = __ldg(reinterpret_cast<const uint4*>(x_row) + j);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = e0 + u * kBlockThreads, r = e / per_row, j = e % per_row;
        if (e >= total) break;
        std::uint32_t b[4];
        x_pairs(v[u], b);
        // chunk j / 16, its lane t = j / 4 % 4, word j % 4: at [r][chunk][word][t]
        xs[r * x_stride + ((j >> 4) * 4 + (j & 3)) * 4 + ((j >> 2) & 3)] = make_uint4(b[0], b[1], b[2], b[3]);
      }
    }
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      xrow[h] = reinterpret_cast<const T*>(xs + min(g + 8 * h, p.m - 1) * x_stride + t);
    }
  } else {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) xrow[h] = x + static_cast<std::int64_t>(min(g + 8 * h, p.m - 1)) * p.k + 32 * t;
  }
  if constexpr (stages_scales<kX>()) ptx::cp_async_wait<kStages>();  // the scales' group: the oldest
  if constexpr (stages_x<kX>() || stages_scales<kX>()) __syncthreads();  // x, the scales, the zero points laid out
  // The lane's row g of the scales and zero points (row r of its pairs: + 8 r rows), at its first block.
  const S* scale_row = reinterpret_cast<const S*>(scale_smem + g * scale_layout.scale_stride + b_first * sizeof(S) -
                                                  scale_lo);
  const std::uint8_t* zero_row = reinterpret_cast<const std::uint8_t*>(zero_smem) + g * scale_layout.zero_stride +
                                 (b_first >> 1) - zero_lo;
  for (int c = c_begin; c < c_end; c += kStages * kWarps) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int cs = c + s * kWarps;
      if (cs >= c_end) break;  // warp-uniform
      ptx::cp_async_wait<kStages - 1>();  // chunk cs's group: the oldest of the kStages in flight
      uint4 w[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) w[r] = ring[(s * kRows + r) * 32 + lane];
      const T* xc[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {  // kXShared: 16 words (T * 8) a chunk
        xc[h] = xrow[h] + (stages_x<kX>() ? (cs - c_first) * 16 * 8 : cs * kChunk);
      }
      if constexpr (stages_scales<kX>()) {  // the chunk's scales and zero points from shared memory
        const int b = (cs * kChunk + 32 * t) >> p.block_shift;
        const int zb = (b >> 1) - (b_first >> 1);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          side[s].scale[r] = *reinterpret_cast<const S*>(reinterpret_cast<const char*>(scale_row) +
                                                         8 * r * scale_layout.scale_stride + (b - b_first) * sizeof(S));
          side[s].zero[r] = zero_points != nullptr ? zero_row[8 * r * scale_layout.zero_stride + zb] : 0x88u;
        }
      }
      multiply_chunk<T, S, kPairs, kHalves, kX, kScaleAfter>(p, cs, w, side[s], xc, acc);
      issue_chunk<S, kRows, kX>(p, rows, cs + kStages * kWarps, c_end, ring_address + s * kRows * 512, side[s]);
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // every ring drained: the shared memory now holds the warps' sums
  constexpr int kSlices = kPairs * kHalves;  // accumulator sets of a lane: [pair][half]
  float* sums = reinterpret_cast<float*>(stream_smem);  // [warp][pair][half][lane][4]
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[(((warp * kPairs + j) * kHalves + h) * 32 + lane) * 4 + i] = acc[j][h][i];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kSlices * 128; e += kBlockThreads) {
    const int slice = e / 128, j = slice / kHalves, h = slice % kHalves, l = (e / 4) % 32, i = e % 4;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += sums[((w * kSlices + slice) * 32 + l) * 4 + i];
    // The accumulators of m16n8k16 with W as A and x^T as B: D[l / 4 (+ 8)][2 (l % 4) (+ 1)] = y^T, x rows from 8 h.
    const int row = 8 * h + 2 * (l & 3) + (i & 1);
    const int col = n_block + 16 * j + (l >> 2) + 8 * (i >> 1);
    if (row >= p.m || col >= p.n) continue;
    store_sum(p, row, col, sum, bias, y, partial);
  }
}

// ---- the GEMV kernel of m <= 4 (Note [Int4 GEMV with sub-blocks as the MMA's columns]) ----

constexpr int kGemvMaxRows = 4;
constexpr int kSubBlock = 32;                            // codes of one lane's 16 bytes of a weight row
constexpr std::size_t kGemvSmemLimit = 100 * 1024;       // two blocks per SM (x's fragments: 2 bytes a code and row)

// The raw codes of one 8-code word as 4 pairs, without a subtraction or a multiply, as the GEMV's MMAs take them:
// pairs 0 and 2 (codes 0/4 and 2/6, the word's even k) are {1024 + q} (bfloat16: 128 + q), pairs 1 and 3 (codes 1/5,
// 3/7, odd k) float16's {1024 + 16 q} where the codes lie (no shift) and bfloat16's {128 + q} shifted down (its 7-bit
// mantissa has no room for 16 q). Once the odd sums are multiplied by kOddFactor, kEven / kOdd are what the even /
// odd sums carry besides q x, per unit of x.
template <typename T>
struct RawCodes;

template <>
struct RawCodes<__half> {
  static constexpr float kOddFactor = 0.0625f;  // (1024 + 16 q) / 16 = 64 + q
  static constexpr float kEven = 1024.0f, kOdd = 64.0f;
  __device__ static void pairs(std::uint32_t w, std::uint32_t (&p)[4]) {
    p[0] = and_or<0x000F000Fu, Half<__half>::kMagic>(w);
    p[1] = and_or<0x00F000F0u, Half<__half>::kMagic>(w);
    const std::uint32_t w8 = w >> 8;
    p[2] = and_or<0x000F000Fu, Half<__half>::kMagic>(w8);
    p[3] = and_or<0x00F000F0u, Half<__half>::kMagic>(w8);
  }
};

template <>
struct RawCodes<__nv_bfloat16> {
  static constexpr float kOddFactor = 1.0f;
  static constexpr float kEven = 128.0f, kOdd = 128.0f;
  __device__ static void pairs(std::uint32_t w, std::uint32_t (&p)[4]) {
    p[0] = and_or<0x000F000Fu, Half<__nv_bfloat16>::kMagic>(w);
    p[1] = and_or<0x000F000Fu, Half<__nv_bfloat16>::kMagic>(w >> 4);
    p[2] = and_or<0x000F000Fu, Half<__nv_bfloat16>::kMagic>(w >> 8);
    p[3] = and_or<0x000F000Fu, Half<__nv_bfloat16>::kMagic>(w >> 12);
  }
};

// The GEMV kernel's group: kSubs sub-blocks of 32 codes of a row, lane t's the sub-blocks t (and t + 4: kWide, at
// m = 1, where the MMA's 8 columns are 8 sub-blocks of x's one row; else 4 sub-blocks times 2 rows of x).
template <bool kWide>
struct GemvShape {
  static constexpr int kSubs = kWide ? 8 : 4;
  static constexpr int kHalves = kSubs / 4;      // 16-byte loads per row and group
  static constexpr int kSpan = kWide ? 1 : 2;    // groups per stage: 2 loads per row and stage
};

// What kSpan consecutive groups need from memory: the lane's sub-blocks of its rows g and g + 8 of the block's 16-row
// tile, loaded kStages stages ahead of their use. The scales and zero points come from shared memory.
template <bool kWide>
struct GemvStage {
  uint4 w[GemvShape<kWide>::kSpan][2][GemvShape<kWide>::kHalves];  // [group][row g, g + 8][half]
};

// Groups [c, c + kSpan): `weight` is the lane's row g at group 0 (row g + 8 at + row_stride); a load at or past
// `w_groups[r][h]` (past the split or the packed row; 0 for a row past N) is zeros.
template <bool kWide>
__device__ __forceinline__ void load_gemv_stage(const std::uint8_t* weight, std::int64_t row_stride,
                                                const int (&w_groups)[2][GemvShape<kWide>::kHalves], int c,
                                                GemvStage<kWide>& st) {
  using G = GemvShape<kWide>;
#pragma unroll
  for (int j = 0; j < G::kSpan; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int h = 0; h < G::kHalves; ++h) {
        st.w[j][r][h] = c + j < w_groups[r][h]
                            ? load_streaming(weight + r * row_stride + (c + j) * (G::kSubs * 16) + h * 64)
                            : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
}

// One group of one warp: the MMAs on the raw codes (the even codes' pairs into `even`, the odd codes' into `odd`; x's
// fragments `xf` from shared memory, per word the pairs (0, 4), (2, 6), (1, 5), (3, 7)), then each accumulator
// (row, sub-block, x row) corrected and scaled:
//   out += scale * (even + kOddFactor odd - C - zero X)
// (X = the sum of x over the sub-block, C = kEven X_even + kOdd X_odd) with {X, C} of the lane's two sub-blocks
// `xc[set]`, and `scale` / `zero` [row g, g + 8][column 2 t, 2 t + 1]. kWide: xf[0][2 i], [2 i + 1] are the B
// fragments of word i's 4 MMAs as the lane gives them (sub-block t's pairs as b0, or t + 4's as b1, or zeros);
// else xf[set] x rows 2 set and + 1, 2 MMAs per word and set.
template <typename T, int kSets, bool kWide>
__device__ __forceinline__ void multiply_gemv_group(const uint4 (&w)[2][GemvShape<kWide>::kHalves],
                                                    const uint4 (&xf)[kSets][kWide ? 8 : 4],
                                                    const float4 (&xc)[kSets], const float (&scale)[2][2],
                                                    const float (&zero)[2][2], float (&out)[kSets][4]) {
  float even[kSets][4] = {}, odd[kSets][4] = {};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kWide) {
      std::uint32_t p[2][2][4];  // [row g, g + 8][half]
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int h = 0; h < 2; ++h) RawCodes<T>::pairs(word_of(w[r][h], i), p[r][h]);
      }
      const std::uint32_t a0[4] = {p[0][0][0], p[1][0][0], p[0][1][0], p[1][1][0]};
      const std::uint32_t a2[4] = {p[0][0][2], p[1][0][2], p[0][1][2], p[1][1][2]};
      const std::uint32_t a1[4] = {p[0][0][1], p[1][0][1], p[0][1][1], p[1][1][1]};
      const std::uint32_t a3[4] = {p[0][0][3], p[1][0][3], p[0][1][3], p[1][1][3]};
      Half<T>::mma(even[0], a0, xf[0][2 * i].x, xf[0][2 * i].y);
      Half<T>::mma(even[0], a2, xf[0][2 * i].z, xf[0][2 * i].w);
      Half<T>::mma(odd[0], a1, xf[0][2 * i + 1].x, xf[0][2 * i + 1].y);
      Half<T>::mma(odd[0], a3, xf[0][2 * i + 1].z, xf[0][2 * i + 1].w);
    } else {
      std::uint32_t pg[4], p8[4];
      RawCodes<T>::pairs(word_of(w[0][0], i), pg);
      RawCodes<T>::pairs(word_of(w[1][0], i), p8);
      const std::uint32_t a_even[4] = {pg[0], p8[0], pg[2], p8[2]};
      const std::uint32_t a_odd[4] = {pg[1], p8[1], pg[3], p8[3]};
#pragma unroll
      for (int s = 0; s < kSets; ++s) {
        Half<T>::mma(even[s], a_even, xf[s][i].x, xf[s][i].y);
        Half<T>::mma(odd[s], a_odd, xf[s][i].z, xf[s][i].w);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSets; ++s) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, c = e & 1;
      const float x_sum = c ? xc[s].z : xc[s].x, correction = c ? xc[s].w : xc[s].y;
      const float raw = fmaf(odd[s][e], RawCodes<T>::kOddFactor, even[s][e]);
      out[s][e] = fmaf(scale[r][c], raw - fmaf(zero[r][c], x_sum, correction), out[s][e]);
    }
  }
}

// The GEMV kernel's shared memory (byte offsets, each 16-byte aligned) for a split of `subs` sub-blocks, m rows of x
// and rows of `blocks` scales of `scale_bytes` and `zero_row` zero-point bytes: x's fragments [sub-block][x row]
// (`frag` bytes: per word of the sub-block the pairs (0, 4), (2, 6), (1, 5), (3, 7); kWide 128, each pair beside a
// zero as the B fragments of the lanes that carry it), as many bytes of zeros (what the lanes that carry no x read),
// {X, C} [x row][sub-block], the block's 16 rows of scales and of zero points as they lie in memory, and the warps'
// sums.
struct GemvSmem {
  int zeros = 0, table = 0, scales = 0, zero_points = 0, sums = 0, bytes = 0;
};

__host__ __device__ inline int align16(int bytes) { return (bytes + 15) / 16 * 16; }

__host__ __device__ inline GemvSmem gemv_smem(int subs, int m, int sets, int blocks, int scale_bytes, int zero_row) {
  const int frag = m == 1 ? 128 : 64;
  GemvSmem l;
  l.zeros = subs * m * frag;
  l.table = l.zeros + frag;
  l.scales = align16(l.table + m * subs * 8);
  l.zero_points = align16(l.scales + 16 * blocks * scale_bytes);
  l.sums = align16(l.zero_points + 16 * zero_row);
  l.bytes = l.sums + kWarps * sets * 32 * 4;
  return l;
}

// The sub-blocks of a split's tables: its chunks (128 codes) rounded up to whole groups.
__host__ __device__ inline int gemv_subs(const MmaParams& p, bool wide) {
  const int halves = wide ? 2 : 1;
  return 4 * halves * ((p.chunks_per_split + halves - 1) / halves);
}

// Copies `bytes` bytes from global to shared memory with the block's threads: 16 bytes at a time where both are
// 16-byte aligned (the block's rows of scales and zero points start at a multiple of 16 rows), else byte by byte.
__device__ __forceinline__ void copy_to_shared(char* dst, const void* src, int bytes) {
  const auto* from = static_cast<const std::uint8_t*>(src);
  int done = 0;
  if ((reinterpret_cast<std::uintptr_t>(src) & 15u) == 0) {
    done = bytes / 16 * 16;
    for (int i = threadIdx.x * 16; i < done; i += kBlockThreads * 16) {
      *reinterpret_cast<uint4*>(dst + i) = __ldg(reinterpret_cast<const uint4*>(from + i));
    }
  }
  for (int i = done + static_cast<int>(threadIdx.x); i < bytes; i += kBlockThreads) dst[i] = from[i];
}

// x's fragments and {X, C} of the split's `subs` sub-blocks (from sub-block `sub0`) in shared memory: one thread per
// (x row, sub-block).
template <typename T, bool kWide>
__device__ __forceinline__ void lay_out_x(const MmaParams& p, const T* __restrict__ x, int sub0, int subs, char* smem,
                                          float2* table) {
  for (int e = threadIdx.x; e < p.m * subs; e += kBlockThreads) {
    const int row = e / subs, local = e % subs, sub = sub0 + local;
    float even = 0.0f, odd = 0.0f;
    uint4* frag = reinterpret_cast<uint4*>(smem + (local * p.m + row) * (kWide ? 128 : 64));
    const bool low = (local & 4) == 0;  // kWide: sub-block t of its group (b0), else t + 4 (b1)
    const bool inside = sub * kSubBlock < p.k;
    const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<std::int64_t>(row) * p.k +
                                                      (inside ? sub * kSubBlock : 0));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = inside ? __ldg(src + i) : make_uint4(0u, 0u, 0u, 0u);
      std::uint32_t b[4];
      x_pairs(v, b);
      if constexpr (kWide) {
        frag[2 * i] = low ? make_uint4(b[0], 0u, b[2], 0u) : make_uint4(0u, b[0], 0u, b[2]);
        frag[2 * i + 1] = low ? make_uint4(b[1], 0u, b[3], 0u) : make_uint4(0u, b[1], 0u, b[3]);
      } else {
        frag[i] = make_uint4(b[0], b[2], b[1], b[3]);
      }
      const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        even += to_float(bits_as<T>(words[h] & 0xFFFFu));
        odd += to_float(bits_as<T>(words[h] >> 16));
      }
    }
    table[e] = make_float2(even + odd, RawCodes<T>::kEven * even + RawCodes<T>::kOdd * odd);
  }
}

// The warps' sums of rows g and g + 8 into shared memory [warp][set][x row % 2][16 rows]: the lane's two columns,
// then (kWide: the 4 lanes of the row, all sub-blocks of x's row) lanes t and t ^ 1 (the other two sub-blocks; lanes
// t = 0 and 2 then hold x rows 2 s and 2 s + 1).
template <int kSets, bool kWide>
__device__ __forceinline__ void gemv_warp_sums(const float (&out)[kSets][4], float* sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int s = 0; s < kSets; ++s) {
    float upper = out[s][0] + out[s][1], lower = out[s][2] + out[s][3];
    upper += __shfl_xor_sync(0xFFFFFFFFu, upper, 1);
    lower += __shfl_xor_sync(0xFFFFFFFFu, lower, 1);
    if constexpr (kWide) {
      upper += __shfl_xor_sync(0xFFFFFFFFu, upper, 2);
      lower += __shfl_xor_sync(0xFFFFFFFFu, lower, 2);
    }
    if (kWide ? t == 0 : (t & 1) == 0) {
      float* at = sums + ((warp * kSets + s) * 2 + (kWide ? 0 : t >> 1)) * 16;
      at[g] = upper;
      at[g + 8] = lower;
    }
  }
}

// A block: kWarps warps over one tile of 16 output columns and every row of x (m <= 4: kSets MMAs per weight
// fragment, 2 rows of x each; kWide at m = 1: groups of 8 sub-blocks); warp w takes the groups kSpan w, ... of its
// split (kStages stages of kSpan groups in flight), their first stages issued before the block lays out x's
// fragments, {X, C} and its rows' scales and zero points in shared memory. Last the warps' sums meet in shared memory
// in a fixed order.
template <typename T, typename S, int kSets, bool kWide>
__global__ void __launch_bounds__(kBlockThreads, 2)
    int4_gemv_kernel(const T* __restrict__ x, const std::uint8_t* __restrict__ weight, const S* __restrict__ scales,
                     const std::uint8_t* __restrict__ zero_points, const void* __restrict__ bias, T* __restrict__ y,
                     float* __restrict__ partial, MmaParams p) {
  using G = GemvShape<kWide>;
  constexpr int kStages = 2;                // 2 16-byte weight loads per row, lane and stage
  constexpr int kStep = G::kSpan * kWarps;  // groups between a warp's stages
  extern __shared__ uint4 gemv_smem_raw[];
  auto* smem = reinterpret_cast<char*>(gemv_smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // The split's groups (a split starts at a whole group: chunks_per_split is a multiple of kHalves when split).
  const int g_begin = blockIdx.z * p.chunks_per_split / G::kHalves;
  const int g_end = (min(p.chunks, static_cast<int>(blockIdx.z + 1) * p.chunks_per_split) + G::kHalves - 1) /
                    G::kHalves;
  const int subs = gemv_subs(p, kWide);
  const int n0 = blockIdx.x * 16;
  const GemvSmem layout = gemv_smem(subs, p.m, kSets, p.blocks, sizeof(S), p.zero_row);
  // The lane's weight rows (g, g + 8), and the groups below which its sub-blocks lie inside the split and the row.
  const int row_subs = p.row_codes / kSubBlock;
  const std::uint8_t* w_lane = weight + static_cast<std::int64_t>(min(n0 + g, p.n - 1)) * p.row_bytes + 16 * t;
  const std::int64_t w_stride = 8 * static_cast<std::int64_t>(p.row_bytes);
  int w_groups[2][G::kHalves];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int h = 0; h < G::kHalves; ++h) {
      const int inside = max(0, (row_subs - t - 4 * h + G::kSubs - 1) / G::kSubs);
      w_groups[r][h] = n0 + g + 8 * r < p.n ? min(g_end, inside) : 0;
    }
  }
  GemvStage<kWide> stage[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int c = g_begin + G::kSpan * warp + s * kStep;
    if (c < g_end) load_gemv_stage<kWide>(w_lane, w_stride, w_groups, c, stage[s]);
  }
  auto* table = reinterpret_cast<float2*>(smem + layout.table);
  lay_out_x<T, kWide>(p, x, G::kSubs * g_begin, subs, smem, table);
  if (threadIdx.x < (kWide ? 8 : 4)) {
    reinterpret_cast<uint4*>(smem + layout.zeros)[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
  }
  const int tile_rows = min(16, p.n - n0);
  copy_to_shared(smem + layout.scales, scales + static_cast<std::int64_t>(n0) * p.blocks,
                 tile_rows * p.blocks * static_cast<int>(sizeof(S)));
  if (zero_points != nullptr) {
    copy_to_shared(smem + layout.zero_points, zero_points + static_cast<std::int64_t>(n0) * p.zero_row,
                   tile_rows * p.zero_row);
  }
  __syncthreads();
  // Where the lane reads x (Note [Int4 GEMV with sub-blocks as the MMA's columns]). kWide: column g is sub-block g of
  // the group, carried by the lane with t == g (as b0) or t + 4 == g (b1). Else column g is sub-block g % 4 of x row
  // g / 4 + 2 s, carried by the lanes with t == g % 4. The others read the zeros. {X, C}: the lane's columns 2 t,
  // 2 t + 1.
  constexpr int kFragBytes = kWide ? 128 : 64;
  int x_offset[kSets], x_step[kSets], xc_at[kSets];
#pragma unroll
  for (int f = 0; f < kSets; ++f) {
    const int row = kWide ? 0 : (g >> 2) + 2 * f;
    const bool carries = kWide ? g == t || g == t + 4 : (g & 3) == t && row < p.m;
    x_offset[f] = carries ? ((kWide ? g : t) * p.m + row) * kFragBytes : layout.zeros;
    x_step[f] = carries ? G::kSubs * p.m * kFragBytes : 0;
  }
#pragma unroll
  for (int s = 0; s < kSets; ++s) {
    // x row t / 2 + 2 s (past m: never stored) at sub-block 2 (t % 2); kWide: x row 0 at sub-block 2 t.
    xc_at[s] = kWide ? 2 * t : min((t >> 1) + 2 * s, p.m - 1) * subs + 2 * (t & 1);
  }
  const S* scale_rows = reinterpret_cast<const S*>(smem + layout.scales) + g * p.blocks;
  const std::uint8_t* zero_rows = reinterpret_cast<const std::uint8_t*>(smem + layout.zero_points) + g * p.zero_row;
  const int shift = p.block_shift - 5;  // a scale's block holds 2^shift sub-blocks
  const bool row_live[2] = {n0 + g < p.n, n0 + g + 8 < p.n};  // rows past N read no scale (never stored)
  const int first_sub = kWide ? 2 * t : 2 * (t & 1);  // of the lane's columns, in a group
  float out[kSets][4] = {};
  for (int c = g_begin + G::kSpan * warp; c < g_end; c += kStages * kStep) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int cs = c + s * kStep;
      if (cs >= g_end) break;  // warp-uniform
#pragma unroll
      for (int j = 0; j < G::kSpan; ++j) {
        const int group = cs + j;
        if (group >= g_end) break;  // warp-uniform
        const int local = group - g_begin;
        uint4 xf[kSets][kWide ? 8 : 4];
        float4 xc[kSets];
#pragma unroll
        for (int f = 0; f < kSets; ++f) {
          const uint4* fr = reinterpret_cast<const uint4*>(smem + x_offset[f] + local * x_step[f]);
#pragma unroll
          for (int i = 0; i < (kWide ? 8 : 4); ++i) xf[f][i] = fr[i];
        }
#pragma unroll
        for (int h = 0; h < kSets; ++h) {
          xc[h] = *reinterpret_cast<const float4*>(table + xc_at[h] + G::kSubs * local);
        }
        // The scales and zero points of the lane's sub-blocks sub and sub + 1 (one zero-point byte holds both); a
        // sub-block past the packed row reads the row's last (its x and weights are zeros: no NaN from past the rows).
        const int sub = G::kSubs * group + first_sub;
        const int b0 = min(sub >> shift, p.blocks - 1), b1 = min((sub + 1) >> shift, p.blocks - 1);
        float scale[2][2], zero[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const bool live = row_live[r];
          const S* sr = scale_rows + 8 * r * p.blocks;
          scale[r][0] = live ? to_float(sr[b0]) : 0.0f;
          scale[r][1] = live ? to_float(sr[b1]) : 0.0f;
          const unsigned byte = zero_points != nullptr && live ? zero_rows[8 * r * p.zero_row + (b0 >> 1)] : 0x88u;
          zero[r][0] = static_cast<float>((byte >> (4 * (b0 & 1))) & 0xFu);
          zero[r][1] = static_cast<float>((byte >> (4 * (b1 & 1))) & 0xFu);
        }
        multiply_gemv_group<T, kSets, kWide>(stage[s].w[j], xf, xc, scale, zero, out);
      }
      const int next = cs + kStages * kStep;
      if (next < g_end) load_gemv_stage<kWide>(w_lane, w_stride, w_groups, next, stage[s]);
    }
  }
  auto* sums = reinterpret_cast<float*>(smem + layout.sums);
  gemv_warp_sums<kSets, kWide>(out, sums);
  __syncthreads();
  constexpr int kOutputs = kSets * 2 * 16;
  for (int e = threadIdx.x; e < kOutputs; e += kBlockThreads) {
    const int row = e / 16, col = n0 + e % 16;  // x row 2 s + parity
    if (row >= p.m || col >= p.n) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += sums[w * kOutputs + e];
    store_sum(p, row, col, sum, bias, y, partial);
  }
}

// y = the sum of the splits' partial sums, in split order, + bias.
template <typename T>
__global__ void int4_sum_splits_kernel(const float* __restrict__ partial, const void* __restrict__ bias,
                                       bool bias_float, T* __restrict__ y, std::int64_t mn, int n, int splits) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < mn;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[s * mn + i];
    if (bias != nullptr) {
      const auto col = static_cast<int>(i % n);
      sum += bias_float ? static_cast<const float*>(bias)[col] : to_float(static_cast<const T*>(bias)[col]);
    }
    y[i] = from_float<T>(sum);
  }
}

MmaParams mma_params(const Int4GemmArgs& a, int splits) {
  MmaParams p;
  p.m = static_cast<int>(a.m);
  p.n = static_cast<int>(a.n);
  p.k = static_cast<int>(a.k);
  p.blocks = static_cast<int>(a.blocks());
  while ((std::int64_t{1} << p.block_shift) < a.block) ++p.block_shift;
  p.row_codes = static_cast<int>(a.blocks() * a.block);
  p.row_bytes = p.row_codes / 2;
  p.chunks = (p.row_codes + kChunk - 1) / kChunk;
  p.chunks_per_split = (p.chunks + splits - 1) / splits;
  p.zero_row = (p.blocks + 1) / 2;
  p.bias_float = a.bias_dtype == DType::kFloat32;
  return p;
}

// Bytes of shared memory x's rows take in the streaming kernel's shared layout (Note [x in shared memory for the
// streaming kernel]): min(m, 16) rows of stream_x_stride 16-byte words.
int stream_x_bytes(const MmaParams& p) {
  return std::min(p.m, kStreamMaxRows) * stream_x_stride(p.chunks_per_split) * 16;
}

// Calls body(T{}, S{}) for x's dtype T (float16, bfloat16) and the scales' S (T or float).
template <typename Body>
void dispatch_int4(const Int4GemmArgs& a, Body&& body) {
  const bool float_scales = a.scale_dtype == DType::kFloat32;
  if (a.x_dtype == DType::kFloat16) {
    float_scales ? body(__half{}, float{}) : body(__half{}, __half{});
  } else {
    XPURT_INTERNAL_ASSERT(a.x_dtype == DType::kBFloat16, "int4 mma kernel of x ", dtype_name(a.x_dtype));
    float_scales ? body(__nv_bfloat16{}, float{}) : body(__nv_bfloat16{}, __nv_bfloat16{});
  }
}

// Resident blocks per SM of the mma kernel of each tile count, and the SMs, on the current device (queried once).
struct Residency {
  int sms = 1;
  int per_sm[3] = {1, 1, 1};  // of kTileChoices
  int stream_per_sm[2] = {1, 1};  // of the streaming kernel, tiles 4 and 2
  int gemv_per_sm = 1;            // of the GEMV kernel (with 24 KB of shared memory: K = 4096 at m = 2)
};

Residency query_residency(int device) {
  Residency r;
  XPURT_CUDA_CHECK(cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, device));
  const auto per_sm = [](auto kernel, int shared_bytes) {
    int blocks = 0;
    XPURT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kBlockThreads, shared_bytes));
    return std::max(blocks, 1);
  };
  r.sms = std::max(r.sms, 1);
  r.per_sm[0] = per_sm(int4_mma_kernel<__half, __half, 4, false, true, true>, 0);
  r.per_sm[1] = per_sm(int4_mma_kernel<__half, __half, 2, false, true, true>, 0);
  r.per_sm[2] = per_sm(int4_mma_kernel<__half, __half, 1, false, true, true>, 0);
  r.stream_per_sm[0] = per_sm(int4_stream_kernel<__half, __half, 2, 1, kXWholeChunks, false>, kStreamSmemBytes);
  r.stream_per_sm[1] = per_sm(int4_stream_kernel<__half, __half, 1, 1, kXWholeChunks, false>, kStreamSmemBytes);
  r.gemv_per_sm = per_sm(int4_gemv_kernel<__half, __half, 1, true>, 24 * 1024);
  return r;
}

Residency residency() {
  static std::once_flag once[kCachedDevices];
  static Residency cached[kCachedDevices];
  int device = 0;
  XPURT_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kCachedDevices) return query_residency(device);
  std::call_once(once[device], [device] { cached[device] = query_residency(device); });
  return cached[device];
}

std::size_t workspace_of(const Int4GemmArgs& a, int splits) {
  return splits > 1 ? static_cast<std::size_t>(splits) * static_cast<std::size_t>(a.m * a.n) * 4 : 0;
}

// How well a grid of `blocks` blocks keeps the weight streaming: the balance of its blocks over the SMs (the busiest
// SM's share against an even one), times the bytes in flight on an SM against what hides the memory's latency (two
// resident blocks); a split pays a second pass over its partial sums.
double grid_score(std::int64_t blocks, int splits, const Residency& r, int per_sm) {
  const std::int64_t per_busiest = (blocks + r.sms - 1) / r.sms;
  const double balance = static_cast<double>(blocks) / static_cast<double>(per_busiest * r.sms);
  const double depth = std::min(1.0, static_cast<double>(std::min<std::int64_t>(per_busiest, per_sm)) / 2.0);
  return balance * depth * (splits > 1 ? 0.9 : 1.0);
}

// Whether the GEMV kernel takes `a` at `splits` (x's alignment is checked at the launch): m <= 4, blocks of 32 codes
// or more, K a multiple of 32 (a sub-block of x is all inside K or all outside), its shared memory within the default
// limit.
bool gemv_takes(const Int4GemmArgs& a, int splits) {
  if (a.m > kGemvMaxRows || a.m < 1 || a.block < kSubBlock || a.k % kSubBlock != 0) return false;
  const MmaParams p = mma_params(a, splits);
  const bool wide = a.m == 1;
  if (wide && splits > 1 && p.chunks_per_split % 2 != 0) return false;  // a split of whole 8-sub-block groups
  const int scale_bytes = a.scale_dtype == DType::kFloat32 ? 4 : 2;
  const GemvSmem l = gemv_smem(gemv_subs(p, wide), p.m, p.m > 2 ? 2 : 1, p.blocks, scale_bytes, p.zero_row);
  return static_cast<std::size_t>(l.bytes) <= kGemvSmemLimit;
}

// Every grid the kernels can take for `a`, the default first (Note [Int4 GEMM on the GPU], "The grid"): the
// preferred kernel and tiles for m (m <= 8 and blocks of 32 codes or more: the streaming kernel's 4 tiles, then its
// 2, then the other kernel's 1; other m <= 8: the other kernel's 2, then 1; m 9-16 and blocks of 32 codes or more:
// the streaming kernel's 4 tiles, then the other kernel's 2 (H100, 2026-12-07, its scales staged: 4 streaming tiles
// 1-7% faster than the other kernel's 4 at three shapes and both block sizes, 2 streaming tiles 8-23% slower than its
// 2 at N = 4096, where 2 tiles are chosen); m > 16: the other kernel's 4, then 2) with the first of them whose unsplit
// blocks cover every SM; when none does, the best grid_score. The others, the streaming kernel's at m <= 16 among
// them, follow by score (the tactics that autotuning times).
std::vector<Int4MmaConfig> ranked_configs(const Int4GemmArgs& a) {
  const Residency r = residency();
  const MmaParams p = mma_params(a, 1);
  const auto blocks_of = [&](int tiles, int splits) {
    return (a.n + 8 * tiles - 1) / (8 * tiles) * ((a.m + 15) / 16) * splits;
  };
  const bool small = a.m <= kStreamMaxRows && a.block >= 32;  // the streaming kernel's problems
  std::vector<std::pair<double, Int4MmaConfig>> scored;
  for (int s = 1; s <= kInt4MaxSplits && (s == 1 || p.chunks / s >= 2 * kWarps); ++s) {
    const bool gemv = gemv_takes(a, s);
    for (int i = 0; i < (gemv ? 6 : small ? 5 : 3); ++i) {
      const bool stream = i == 3 || i == 4;  // the streaming kernel's tiles 4 and 2
      const bool gemv_kernel = i == 5;       // the GEMV kernel (tiles 2)
      const int tiles = gemv_kernel ? 2 : stream ? kTileChoices[i - 3] : kTileChoices[i];
      // Rows of x past 8: one tile per block would read x's fragments from L1 8 times per weight load.
      if (a.m > 8 && tiles == 1) continue;
      const Int4MmaConfig c = int4_gemm_mma_config(a, tiles, s, stream, gemv_kernel);
      const int per_sm = gemv_kernel ? r.gemv_per_sm : stream ? r.stream_per_sm[i - 3] : r.per_sm[i];
      scored.emplace_back(grid_score(blocks_of(tiles, s), s, r, per_sm), c);
      if (stream && tiles == 4 && a.m <= 8) {  // the deep ring: a tactic beside it (same blocks)
        scored.emplace_back(scored.back().first, int4_gemm_mma_config(a, tiles, s, true, false, kDeepRingBytes));
      }
    }
  }
  // Scores within 0.02 count as equal: a stable sort on the score rounded down to that step keeps the order above.
  std::stable_sort(scored.begin(), scored.end(), [](const auto& x, const auto& y) {
    return std::floor(x.first / 0.02) > std::floor(y.first / 0.02);
  });
  // The GEMV kernel and the deep ring are never preferred: tactics only (timed slower on an H100, and not yet timed).
  using Preference = std::vector<std::pair<int, bool>>;  // (tiles, stream) in order
  const Preference preferred = a.m > 8 && small ? Preference{{4, true}, {2, false}}
                               : a.m > 8        ? Preference{{4, false}, {2, false}}
                               : small          ? Preference{{4, true}, {2, true}, {1, false}}
                                                : Preference{{2, false}, {1, false}};
  for (const auto& [tiles, stream] : preferred) {
    if (blocks_of(tiles, 1) < r.sms) continue;
    const auto it = std::find_if(scored.begin(), scored.end(), [&, tiles = tiles, stream = stream](const auto& e) {
      return e.second.tiles == tiles && e.second.splits == 1 && e.second.stream == stream && !e.second.gemv &&
             e.second.ring == 0;
    });
    std::rotate(scored.begin(), it, it + 1);  // to the front, the others in their order
    break;
  }
  std::vector<Int4MmaConfig> out;
  for (const auto& entry : scored) out.push_back(entry.second);
  return out;
}

}  // namespace

const char* int4_gemm_mma_refusal(const Int4GemmArgs& a, int compute_capability) {
  if (a.x_dtype != DType::kFloat16 && a.x_dtype != DType::kBFloat16) {
    return "the tensor-core kernel takes float16 or bfloat16 x (float32 x runs the dequantize + cuBLAS path)";
  }
  if (compute_capability > 0 && compute_capability < 80) return "the tensor-core kernel needs compute capability 8.0";
  if ((a.blocks() * a.block) % 32 != 0) return "packed rows not a multiple of 16 bytes (an odd number of 16-blocks)";
  const std::int64_t limit = std::numeric_limits<std::int32_t>::max();
  if (a.m > limit || a.n > limit || a.k > limit || a.n * (a.blocks() * a.block / 2) > limit) {
    return "sizes beyond int32";
  }
  if (!is_aligned(a.weight, 16)) return "the weight is not 16-byte aligned";
  return nullptr;
}

std::vector<Int4MmaConfig> int4_gemm_mma_configs(const Int4GemmArgs& a) { return ranked_configs(a); }

Int4MmaConfig int4_gemm_mma_config(const Int4GemmArgs& a, int tiles, int splits, bool stream, bool gemv, int ring,
                                   Int4Staging staging) {
  XPURT_INTERNAL_ASSERT((tiles == 1 || tiles == 2 || tiles == 4) && splits >= 1 && splits <= kInt4MaxSplits &&
                            (!stream || tiles != 1) && (!gemv || (tiles == 2 && !stream)) &&
                            (ring == 0 || (ring == kDeepRingBytes && stream && tiles == 4)) &&
                            (staging == Int4Staging::kAll || stream),
                        "int4 tensor-core kernel: tiles ", tiles, ", splits ", splits, ", stream ", stream, ", gemv ",
                        gemv, ", ring ", ring, ", staging ", static_cast<int>(staging));
  Int4MmaConfig c;
  c.tiles = tiles;
  c.splits = splits;
  c.stream = stream;
  c.gemv = gemv;
  c.ring = ring;
  c.staging = staging;
  c.workspace_bytes = workspace_of(a, splits);
  return c;
}

void int4_gemm_mma(const Int4GemmArgs& a, const Int4MmaConfig& config, void* workspace, void* stream) {
  if (a.m == 0 || a.n == 0) return;
  // A stream record at m > 16 or blocks of 16 runs the other kernel of the same grid (a GEMV record too).
  const bool stream_kernel = (config.stream || config.gemv) && a.m <= kStreamMaxRows;
  const MmaParams p = mma_params(a, config.splits);
  const int columns = 8 * config.tiles;
  const dim3 grid(static_cast<unsigned>((a.n + columns - 1) / columns), static_cast<unsigned>((a.m + 15) / 16),
                  static_cast<unsigned>(config.splits));
  auto* partial = config.splits > 1 ? static_cast<float*>(workspace) : nullptr;
  XPURT_INTERNAL_ASSERT(config.splits == 1 || workspace != nullptr, "int4 mma kernel: no workspace for its splits");
  const bool block16 = a.block == 16;
  const bool vector_x = a.k % 8 == 0 && is_aligned(a.x, 16);
  const bool upper = a.m > 8;  // rows g + 8 of the MMA hold rows of x (else they repeat rows g: not stored)
  // A GEMV record where the GEMV kernel does not take the problem runs the streaming kernel of the same grid.
  const bool gemv_kernel = config.gemv && vector_x && gemv_takes(a, config.splits);
  dispatch_int4(a, [&](auto t, auto s) {
    using T = decltype(t);
    using S = decltype(s);
    // Every kernel here takes the same arguments; `smem` bytes of dynamic shared memory.
    auto launch_with = [&](auto kernel, int smem) {
      if (smem > 48 * 1024) {  // raised on the current device (cheap, and idempotent per device)
        XPURT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      }
      kernel<<<grid, kBlockThreads, smem, as_stream(stream)>>>(static_cast<const T*>(a.x), a.weight,
                                                               static_cast<const S*>(a.scales), a.zero_points, a.bias,
                                                               static_cast<T*>(a.y), partial, p);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    };
    if (gemv_kernel) {
      const int sets = a.m > 2 ? 2 : 1;
      const int smem = gemv_smem(gemv_subs(p, a.m == 1), p.m, sets, p.blocks, sizeof(S), p.zero_row).bytes;
      auto launch_gemv = [&](auto kernel) { launch_with(kernel, smem); };
      if (a.m == 1) {
        launch_gemv(int4_gemv_kernel<T, S, 1, true>);
      } else {
        sets == 2 ? launch_gemv(int4_gemv_kernel<T, S, 2, false>) : launch_gemv(int4_gemv_kernel<T, S, 1, false>);
      }
    } else {
      auto launch = [&](auto kernel) { launch_with(kernel, 0); };
      // The kernel of this grid and layout: x read element by element (not vector_x) always takes rows g + 8.
      auto by_layout = [&](auto tiles, auto block16_constant) {
        constexpr int kTiles = decltype(tiles)::value;
        constexpr bool kBlock16 = decltype(block16_constant)::value;
        if constexpr (kTiles != 1) {
          if (stream_kernel && !kBlock16) {
            auto launch_stream = [&](auto kernel, int smem = kStreamSmemBytes) { launch_with(kernel, smem); };
            auto by_halves = [&](auto halves) {
              constexpr int kHalves = decltype(halves)::value;
              // The deep ring (a tactic of 4 tiles at m <= 8, x read whole chunks: at m 9-16 its kernel spills) or the
              // default one.
              // x, the scales and the zero points from shared memory where they fit (Note [x in shared memory for
              // the streaming kernel]), as far as the record's staging allows.
              const int x_bytes = stream_x_bytes(p);
              const int scale_bytes =
                  stream_scale_layout(p, 8 * kTiles, sizeof(S), a.zero_points != nullptr).bytes;
              const bool scales_fit =
                  scale_bytes <= kStreamScaleLimit && stage_piece(a.blocks() * sizeof(S), a.scales) != 0 &&
                  (a.zero_points == nullptr || stage_piece(p.zero_row, a.zero_points) != 0);
              const bool scales_shared =
                  scales_fit && (config.staging == Int4Staging::kAll || config.staging == Int4Staging::kScales);
              const bool x_shared = x_bytes <= kStreamXLimit &&
                                    (config.staging == Int4Staging::kAll || config.staging == Int4Staging::kX);
              auto launch_whole = [&](auto scale_after) {
                constexpr bool kAfter = decltype(scale_after)::value;
                constexpr int kPairs = kTiles / 2;
                auto launch_ring = [&](auto ring) {
                  constexpr int kRing = decltype(ring)::value;
                  if (x_shared && scales_shared) {
                    launch_stream(int4_stream_kernel<T, S, kPairs, kHalves, kXShared, kAfter, kRing>,
                                  kWarps * kRing + x_bytes + scale_bytes);
                  } else if (x_shared) {
                    launch_stream(int4_stream_kernel<T, S, kPairs, kHalves, kXOnlyShared, kAfter, kRing>,
                                  kWarps * kRing + x_bytes);
                  } else if (scales_shared) {
                    launch_stream(int4_stream_kernel<T, S, kPairs, kHalves, kXScalesShared, kAfter, kRing>,
                                  kWarps * kRing + scale_bytes);
                  } else {
                    launch_stream(int4_stream_kernel<T, S, kPairs, kHalves, kXWholeChunks, kAfter, kRing>,
                                  kWarps * kRing);
                  }
                };
                if constexpr (kTiles == 4 && kHalves == 1) {
                  if (config.ring == kDeepRingBytes) {
                    launch_ring(std::integral_constant<int, kDeepRingBytes>{});
                    return;
                  }
                }
                launch_ring(std::integral_constant<int, kStreamRingBytes>{});
              };
              if (!vector_x) {
                launch_stream(int4_stream_kernel<T, S, kTiles / 2, kHalves, kXElements, false>);
              } else if (a.k % kChunk != 0 || p.row_codes != a.k) {
                launch_stream(int4_stream_kernel<T, S, kTiles / 2, kHalves, kXVectors, false>);
              } else if (a.block >= kChunk) {  // one block per row and chunk: the scale after the MMAs
                launch_whole(std::true_type{});
              } else {
                launch_whole(std::false_type{});
              }
            };
            upper ? by_halves(std::integral_constant<int, 2>{}) : by_halves(std::integral_constant<int, 1>{});
            return;
          }
        }
        if (!vector_x) {
          launch(int4_mma_kernel<T, S, kTiles, kBlock16, false, true>);
        } else if (upper) {
          launch(int4_mma_kernel<T, S, kTiles, kBlock16, true, true>);
        } else {
          launch(int4_mma_kernel<T, S, kTiles, kBlock16, true, false>);
        }
      };
      auto by_block = [&](auto tiles) {
        block16 ? by_layout(tiles, std::true_type{}) : by_layout(tiles, std::false_type{});
      };
      switch (config.tiles) {
        case 4: by_block(std::integral_constant<int, 4>{}); break;
        case 2: by_block(std::integral_constant<int, 2>{}); break;
        default: by_block(std::integral_constant<int, 1>{}); break;
      }
    }
    if (partial != nullptr) {
      const std::int64_t mn = a.m * a.n;
      int4_sum_splits_kernel<T><<<grid_for(mn, kThreads), kThreads, 0, as_stream(stream)>>>(
          partial, a.bias, p.bias_float, static_cast<T*>(a.y), mn, p.n, config.splits);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    }
  });
}

// ---- the large-m path's helpers ----

namespace {

template <typename T, typename S>
__global__ void int4_dequantize_kernel(const std::uint8_t* __restrict__ weight, const S* __restrict__ scales,
                                       const std::uint8_t* __restrict__ zero_points, T* __restrict__ out,
                                       std::int64_t n0, std::int64_t k, std::int64_t blocks, std::int64_t block) {
  const std::int64_t row = n0 + blockIdx.y;
  const std::int64_t row_bytes = blocks * block / 2, zero_row = (blocks + 1) / 2;
  const std::uint8_t* codes = weight + row * row_bytes;
  T* dst = out + static_cast<std::int64_t>(blockIdx.y) * k;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < k;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = i / block;
    const unsigned byte = codes[i / 2];
    const auto code = static_cast<float>((byte >> (4 * (i & 1))) & 0xFu);
    float zero = 8.0f;
    if (zero_points != nullptr) {
      zero = static_cast<float>((zero_points[row * zero_row + b / 2] >> (4 * (b & 1))) & 0xFu);
    }
    dst[i] = from_float<T>((code - zero) * to_float(scales[row * blocks + b]));
  }
}

template <typename T>
__global__ void int4_add_bias_kernel(T* __restrict__ y, const void* __restrict__ bias, bool bias_float,
                                     std::int64_t mn, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < mn;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t col = i % n;
    const float b = bias_float ? static_cast<const float*>(bias)[col] : to_float(static_cast<const T*>(bias)[col]);
    y[i] = from_float<T>(to_float(y[i]) + b);
  }
}

}  // namespace

void int4_dequantize_rows(const Int4GemmArgs& a, std::int64_t n0, std::int64_t rows, void* out, DType out_dtype,
                          void* stream) {
  if (rows == 0 || a.k == 0) return;
  XPURT_INTERNAL_ASSERT(rows <= 65535 && n0 + rows <= a.n, "int4_dequantize_rows: rows ", n0, " + ", rows);
  const dim3 grid(grid_for(a.k, kThreads, 64), static_cast<unsigned>(rows));
  dispatch_float(out_dtype, "int4 dequantize", [&](auto t) {
    using T = decltype(t);
    dispatch_float(a.scale_dtype, "int4 dequantize scales", [&](auto s) {
      using S = decltype(s);
      int4_dequantize_kernel<T, S><<<grid, kThreads, 0, as_stream(stream)>>>(
          a.weight, static_cast<const S*>(a.scales), a.zero_points, static_cast<T*>(out), n0, a.k, a.blocks(),
          a.block);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    });
  });
}

void int4_add_bias(const Int4GemmArgs& a, void* stream) {
  const std::int64_t mn = a.m * a.n;
  if (mn == 0 || a.bias == nullptr) return;
  dispatch_float(a.x_dtype, "int4 bias", [&](auto t) {
    using T = decltype(t);
    int4_add_bias_kernel<T><<<grid_for(mn, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<T*>(a.y), a.bias, a.bias_dtype == DType::kFloat32, mn, a.n);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
