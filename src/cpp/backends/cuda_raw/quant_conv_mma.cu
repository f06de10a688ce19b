// The pipelined tensor-core int8 convolution (quant_conv_mma.h): qconv2d's default path for NHWC convolutions of one
// group whose input channels are a multiple of 16.
//
// Note [Pipelined int8 convolution]
// The first tensor-core kernel (kTensorCore in quant_conv.cu) ran ResNet-50's 52 int8 convolutions at batch 16 in
// 2.06 ms on an H200, about 32 TOPS against the chip's ~1,980: its loads went global -> registers -> shared with one
// step in flight, its fragments were read with 32-bit shared loads (24 per 16 MMAs), and the deep layers, whose
// output is a few tiles, ran on a handful of the 132 multiprocessors. This kernel is the usual Ampere/Hopper
// mma.sync implicit GEMM:
//   - kStages (4) shared buffers filled by cp.async (16 bytes a copy, L1 bypassed), so three steps of 64 bytes of K
//     are in flight while one multiplies; one barrier per step. An input position in the padding is not copied: the
//     thread stores x_zero_point's bytes into shared memory itself (cp.async's zero fill gives zeros, and the cpu
//     kernel pads with the zero point, Note [Int8 convolution on the GPU]); a row past the output or a step past K is
//     zero-filled.
//   - fragments come from ldmatrix.x4: one instruction per 16 x 32-byte A fragment and one per two 8 x 32-byte B
//     fragments (6 per 16 MMAs of a 64 x 32 warp tile). Rows are 80 bytes (64 + 16): the 8 rows an 8x8 matrix load
//     reads start in 8 distinct groups of 4 banks.
//   - tiles: 128 x 128 (8 warps of 64 x 32) when they make at least one block per multiprocessor, else 64 x 64 (4
//     warps of 32 x 32); when even those leave the device mostly idle (batch 1, and the last stages of any CNN), the
//     reduction is split (split-K): block z sums steps [z * steps_per_split, ...) and adds its int32 sums into a
//     zeroed workspace with atomics. Integer addition is associative, so the sum, and the output, are the same bits
//     whatever the order the blocks arrive in. The last block of a tile to arrive (an arrival counter per tile)
//     applies the epilogue to the tile's sums. Split counts are chosen from the shape and the multiprocessor count
//     only (qconv2d_pipeline): two waves of blocks, each split keeping at least 4 steps.
//   - the epilogue is quant_epilogue.cuh's arithmetic (every output equal to the cpu kernel's bit for bit), four
//     neighbouring output channels per thread with one 4-, 8- or 16-byte store when the channel count is a multiple
//     of 4, staged through the (then free) pipeline buffers so that neighbouring lanes store neighbouring outputs.
//     Each thread reads its channels' operands once (ChannelQuad), and the store of four outputs is one outlined
//     function: inlined into unrolled loops it made the kernel 339 KB of code (the 64 x 64 one 183 KB); outlined, 63
//     KB and 54 KB, at the same speed on an H200.
//   - the epilogue's channel operands are loaded into shared memory (TileChannels) when the block starts, so their
//     global loads overlap the first copies; 8-bit outputs are requantized inline (requantized_quad: Note
//     [Requantization without a division] in quant_epilogue.cuh), the other output types through store_quad.
// Measured (H200, 2026-12-02, clock64 stamps per phase in a copy of this kernel): the epilogue, not the main loop, was
// most of the time: 14,000-32,000 cycles a block against 1,000-4,800 for the main loop, because quantized_level's
// __fdiv_rn took its slow path for every zero (half of a ReLU's outputs) and the outlined per-output arithmetic ran
// as one dependent chain per warp. Inline integer requantization made the kernel 1.9-2.5x faster (a batch-1 1x1
// convolution of 3136 x 64 x 64: 10.7 -> 5.7 us; batch 64, 14 x 14, 256 -> 1024: 70 -> 33 us, 199 TOPS); ResNet-50's
// convolutions after the stem went from 0.32-0.36x to 0.48-0.54x cuDNN's float16 (benchmarks/bench_quant_conv.py).
#include <algorithm>
#include <cstdint>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/ptx.cuh"
#include "backends/cuda_raw/quant_conv_mma.h"
#include "backends/cuda_raw/quant_epilogue.cuh"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the backend's own helpers

constexpr int kStepBytes = 64;               // bytes of K per pipeline step
constexpr int kRowBytes = kStepBytes + 16;   // bytes per shared row (Note [Pipelined int8 convolution])
constexpr int kStages = 4;
constexpr int kMinStepsPerSplit = 4;
constexpr int kMaxSplits = 32;

int ceil_div(std::int64_t a, std::int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The epilogue's per-channel operands of four neighbouring output channels o .. o + 3, read once per thread from the
// block's TileChannels (the epilogue loops then read no global memory): the int32 bias with the run-time zero point's correction folded in
// (quantized_raw's sum), alpha and the float bias (+0.0 without one, as quantized_real adds).
struct ChannelQuad {
  std::uint32_t bias[4];
  float alpha[4];
  float float_bias[4];
};

// The epilogue's operands of a block's kBN output channels n0 .. n0 + kBN - 1, loaded into shared memory when the
// block starts (their global loads then overlap the pipeline's first copies instead of following the main loop).
template <int kBN>
struct TileChannels {
  std::uint32_t bias[kBN];
  float alpha[kBN];
  float float_bias[kBN];
};

// Fills `t` (threads tid, tid + threads, ...); a channel past the last is given the last one's operands (never stored).
template <int kBN>
__device__ __forceinline__ void load_tile_channels(const QuantEpilogueParams& p, int n0, int channels, int tid,
                                                   int threads, TileChannels<kBN>& t) {
  for (int i = tid; i < kBN; i += threads) {
    const int c = min(n0 + i, channels - 1);
    std::uint32_t bias = p.int_bias != nullptr ? static_cast<std::uint32_t>(p.int_bias[c]) : 0u;
    if (p.x_zero_point != nullptr) {
      bias -= static_cast<std::uint32_t>(*p.x_zero_point) * static_cast<std::uint32_t>(p.w_col_sums[c]);
    }
    t.bias[i] = bias;
    t.alpha[i] = p.alpha != nullptr ? p.alpha[p.alpha_per_channel ? c : 0] : 1.0f;
    t.float_bias[i] = p.float_bias != nullptr ? p.float_bias[c] : 0.0f;
  }
}

// The operands of the tile's channels local .. local + 3 (local a multiple of 4 below kBN).
template <int kBN>
__device__ __forceinline__ ChannelQuad channel_quad(const TileChannels<kBN>& t, int local) {
  ChannelQuad q;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    q.bias[e] = t.bias[local + e];
    q.alpha[e] = t.alpha[local + e];
    q.float_bias[e] = t.float_bias[local + e];
  }
  return q;
}

// quantized_real with the channel's operands in registers: the same float32 operations in the same order.
__device__ __forceinline__ float quad_real(const QuantEpilogueParams& p, const ChannelQuad& q, int acc, int e) {
  const auto total = static_cast<std::int32_t>(static_cast<std::uint32_t>(acc) + q.bias[e]);
  float v = __fadd_rn(__fmul_rn(static_cast<float>(total), q.alpha[e]), q.float_bias[e]);
  if (p.relu && !(v > 0.0f) && !isnan(v)) v = 0.0f;
  return v;
}

// What store_quad needs of QuantEpilogueParams besides the channel operands (passed by value: store_quad is not
// inlined, and a reference to the kernel's parameter would copy the whole struct to local memory).
struct QuadOutput {
  float y_scale;
  float y_zero_point;
  DType out_dtype;
  bool relu;
};

__device__ __forceinline__ QuadOutput quad_output(const QuantEpilogueParams& p) {
  return QuadOutput{p.y_scale, p.y_zero_point, p.out_dtype, p.relu};
}

// The 8-bit outputs' epilogue, inlined (Note [Requantization without a division]): four neighbouring outputs' levels
// packed into one word, byte e of channel o + e; the ReLU is the Requantizer's (made with p.relu). The same levels as
// quad_real and quantized_level give.
__device__ __forceinline__ std::uint32_t requantized_quad(const Requantizer& r, const ChannelQuad& q, int4 sums) {
  const int acc[4] = {sums.x, sums.y, sums.z, sums.w};
  int level[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const auto total = static_cast<std::int32_t>(static_cast<std::uint32_t>(acc[e]) + q.bias[e]);
    level[e] = requantized_int(r, __fadd_rn(__fmul_rn(static_cast<float>(total), q.alpha[e]), q.float_bias[e]));
  }
  // bytes 0 of level[0..3] (two's complement: an int8 level's byte is its int8 bits)
  return __byte_perm(__byte_perm(level[0], level[1], 0x0040), __byte_perm(level[2], level[3], 0x0040), 0x5410);
}

// Stores `valid` bytes of `packed` at y + index: one 4-byte store when all four exist and `vector`.
__device__ __forceinline__ void store_packed(void* y, std::int64_t index, std::uint32_t packed, int valid,
                                             bool vector) {
  auto* out = static_cast<std::uint8_t*>(y) + index;
  if (vector && valid == 4) {
    *reinterpret_cast<std::uint32_t*>(out) = packed;
  } else {
    for (int e = 0; e < valid; ++e) out[e] = static_cast<std::uint8_t>(packed >> (8 * e));
  }
}

// Four neighbouring outputs index .. index + 3 (the channels of `q`) from their accumulators; `valid` of them exist.
// One 4-, 8- or 16-byte store when all four exist and `vector` (the channel count is a multiple of 4, so index is too).
// Not inlined (Note [Pipelined int8 convolution]: the code's size): one copy of the five output types' arithmetic.
__device__ __noinline__ void store_quad(QuadOutput out_desc, const ChannelQuad& q, void* y, std::int64_t index,
                                        int4 sums, int valid, bool vector) {
  QuantEpilogueParams p;
  p.y_scale = out_desc.y_scale;
  p.y_zero_point = out_desc.y_zero_point;
  p.relu = out_desc.relu;
  p.out_dtype = out_desc.out_dtype;
  const int acc[4] = {sums.x, sums.y, sums.z, sums.w};
  switch (p.out_dtype) {
    case DType::kInt8:
    case DType::kUInt8: {
      const bool is_signed = p.out_dtype == DType::kInt8;
      const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
      std::uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int level = static_cast<int>(quantized_level(p, quad_real(p, q, acc[e], e), lo, hi));
        packed |= (static_cast<std::uint32_t>(level) & 0xffu) << (8 * e);
      }
      auto* out = static_cast<std::uint8_t*>(y) + index;
      if (vector && valid == 4) {
        *reinterpret_cast<std::uint32_t*>(out) = packed;
      } else {
        for (int e = 0; e < valid; ++e) out[e] = static_cast<std::uint8_t>(packed >> (8 * e));
      }
      return;
    }
    case DType::kFloat16: {
      __half h[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) h[e] = __float2half_rn(quad_real(p, q, acc[e], e));
      auto* out = static_cast<__half*>(y) + index;
      if (vector && valid == 4) {
        *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(h);
      } else {
        for (int e = 0; e < valid; ++e) out[e] = h[e];
      }
      return;
    }
    case DType::kFloat32: {
      float f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) f[e] = quad_real(p, q, acc[e], e);
      auto* out = static_cast<float*>(y) + index;
      if (vector && valid == 4) {
        *reinterpret_cast<float4*>(out) = make_float4(f[0], f[1], f[2], f[3]);
      } else {
        for (int e = 0; e < valid; ++e) out[e] = f[e];
      }
      return;
    }
    default: {  // kInt32: the accumulator and the bias
      int r[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) r[e] = static_cast<std::int32_t>(static_cast<std::uint32_t>(acc[e]) + q.bias[e]);
      auto* out = static_cast<std::int32_t*>(y) + index;
      if (vector && valid == 4) {
        *reinterpret_cast<int4*>(out) = make_int4(r[0], r[1], r[2], r[3]);
      } else {
        for (int e = 0; e < valid; ++e) out[e] = r[e];
      }
      return;
    }
  }
}

// One block: kBM output pixels x kBN output channels, kWarpsM x kWarpsN warps of (kBM / kWarpsM) x (kBN / kWarpsN),
// steps [blockIdx.z * steps_per_split, ...) of the reduction. Fragment layouts: ptx::mma_s8_16x8x32.
// Long function: the loads, the pipelined main loop and the two epilogues share the per-thread tables above them.
template <int kBM, int kBN, int kWarpsM, int kWarpsN, bool kUnsigned>
__global__ void __launch_bounds__(kWarpsM* kWarpsN * 32)
    qconv_pipelined_kernel(const std::uint8_t* __restrict__ x, const std::int8_t* __restrict__ w, void* y, QConvDims d,
                           QuantEpilogueParams p, std::uint32_t zero_point_word, int steps_per_split,
                           std::int32_t* split_sums, unsigned* tile_arrivals) {
  constexpr int kThreads = kWarpsM * kWarpsN * 32;
  constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;
  constexpr int kMT = kWM / 16, kNT = kWN / 8;
  constexpr int kRowsPerPass = kThreads / 4;  // 4 chunks of 16 bytes per 64-byte row
  constexpr int kAChunks = kBM / kRowsPerPass, kBChunks = kBN / kRowsPerPass;
  constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
  static_assert(kWM % 16 == 0 && kNT % 2 == 0 && kBM % kRowsPerPass == 0 && kBN % kRowsPerPass == 0, "tile shape");
  extern __shared__ __align__(16) std::uint8_t smem[];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int m0 = static_cast<int>(blockIdx.x) * kBM, n0 = static_cast<int>(blockIdx.y) * kBN;
  const int chunk = tid & 3;  // which 16 bytes of each 64-byte row this thread copies
  __shared__ TileChannels<kBN> tile_channels;  // read after the main loop's barriers
  load_tile_channels(p, n0, d.o, tid, kThreads, tile_channels);

  int a_iy0[kAChunks], a_ix0[kAChunks];
  const std::uint8_t* a_image[kAChunks];
  bool a_inside[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int m = m0 + (tid >> 2) + i * kRowsPerPass;
    a_inside[i] = m < d.m;
    const int mm = a_inside[i] ? m : 0;
    const int ox = mm % d.ow, t = mm / d.ow;
    const int oy = t % d.oh, n = t / d.oh;
    a_iy0[i] = oy * d.sh - d.pt;
    a_ix0[i] = ox * d.sw - d.pl;
    a_image[i] = x + static_cast<std::int64_t>(n) * d.h * d.w * d.c;
  }
  const std::int8_t* b_row[kBChunks];
  bool b_inside[kBChunks];
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) {
    const int o = n0 + (tid >> 2) + i * kRowsPerPass;
    b_inside[i] = o < d.o;
    b_row[i] = w + static_cast<std::int64_t>(b_inside[i] ? o : 0) * d.k;
  }
  const uint4 padded = make_uint4(zero_point_word, zero_point_word, zero_point_word, zero_point_word);

  const int total_steps = (d.k + kStepBytes - 1) / kStepBytes;
  const int first = static_cast<int>(blockIdx.z) * steps_per_split;
  const int steps = max(0, min(total_steps - first, steps_per_split));

  // This thread's next chunk of K: k = ((r * kw + s) * C + c), advanced by one step per issue() (the steps are
  // issued in order), so that only the first is found by division.
  int next_k = first * kStepBytes + chunk * 16;
  int next_r, next_s, next_c;
  {
    const int tap = next_k / d.c;
    next_c = next_k - tap * d.c;
    next_r = tap / d.kw;
    next_s = tap - next_r * d.kw;
  }
  // The next step into stage buffer `stage`: a run of 16 channels of one tap (C is a multiple of 16).
  auto issue = [&](int stage) {
    std::uint8_t* a_stage = smem + stage * kStageBytes;
    std::uint8_t* b_stage = a_stage + kBM * kRowBytes;
    const int k = next_k, r = next_r, s = next_s, c = next_c;
    const bool k_inside = k < d.k;
    next_k += kStepBytes;
    next_c += kStepBytes;
    while (next_c >= d.c) {
      next_c -= d.c;
      if (++next_s == d.kw) {
        next_s = 0;
        ++next_r;
      }
    }
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      std::uint8_t* dst = a_stage + ((tid >> 2) + i * kRowsPerPass) * kRowBytes + chunk * 16;
      const int iy = a_iy0[i] + r * d.dh, ix = a_ix0[i] + s * d.dw;
      if (k_inside && a_inside[i] && !(iy >= 0 && iy < d.h && ix >= 0 && ix < d.w)) {
        *reinterpret_cast<uint4*>(dst) = padded;
      } else {
        const bool copy = k_inside && a_inside[i];
        const std::uint8_t* src = copy ? a_image[i] + (static_cast<std::int64_t>(iy) * d.w + ix) * d.c + c : x;
        ptx::cp_async_16(ptx::shared_address(dst), src, copy ? 16 : 0);
      }
    }
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      std::uint8_t* dst = b_stage + ((tid >> 2) + i * kRowsPerPass) * kRowBytes + chunk * 16;
      const bool copy = k_inside && b_inside[i];
      ptx::cp_async_16(ptx::shared_address(dst), copy ? b_row[i] + k : w, copy ? 16 : 0);
    }
  };

  int acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0;
    }
  }

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue(s);
    ptx::cp_async_commit();
  }
  // ldmatrix rows and byte offsets of this lane (ptx::ldmatrix_x4): A's matrices are (rows 0-7 | 8-15) x (bytes
  // 0-15 | 16-31) in that order; B's are (n-tile nt | nt + 1) x (bytes 0-15 | 16-31), bytes first.
  const int a_row = warp_m * kWM + (lane & 15), a_byte = (lane >> 4) * 16;
  const int b_row_l = warp_n * kWN + ((lane >> 4) & 1) * 8 + (lane & 7), b_byte = ((lane >> 3) & 1) * 16;
  for (int it = 0; it < steps; ++it) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // step it has landed for every thread; every warp is done with the buffer reloaded below
    const int next = it + kStages - 1;
    if (next < steps) issue(next % kStages);
    ptx::cp_async_commit();
    const std::uint8_t* a_stage = smem + (it % kStages) * kStageBytes;
    const std::uint8_t* b_stage = a_stage + kBM * kRowBytes;
#pragma unroll
    for (int kk = 0; kk < kStepBytes; kk += 32) {
      std::uint32_t a[kMT][4], b[kNT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        ptx::ldmatrix_x4(a[mt], ptx::shared_address(a_stage + (a_row + mt * 16) * kRowBytes + kk + a_byte));
      }
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        std::uint32_t r[4];
        ptx::ldmatrix_x4(r, ptx::shared_address(b_stage + (b_row_l + nt * 8) * kRowBytes + kk + b_byte));
        b[nt][0] = r[0];
        b[nt][1] = r[1];
        b[nt + 1][0] = r[2];
        b[nt + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) ptx::mma_s8_16x8x32<kUnsigned>(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
      }
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers are free for the epilogue

  const int group = lane >> 2, quad = lane & 3;
  const bool vector = (d.o & 3) == 0;
  if (split_sums != nullptr) {
    // Split-K (Note [Pipelined int8 convolution]): add this range's sums, then the tile's last block finishes it.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pixel = m0 + warp_m * kWM + mt * 16 + group + 8 * (e >> 1);
          const int o = n0 + warp_n * kWN + nt * 8 + quad * 2 + (e & 1);
          if (pixel < d.m && o < d.o) {
            atomicAdd(split_sums + static_cast<std::int64_t>(pixel) * d.o + o, acc[mt][nt][e]);
          }
        }
      }
    }
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    if (tid == 0) {
      const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
      last = atomicAdd(tile_arrivals + tile, 1u) == gridDim.z - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Thread tid takes the same 4 channels in every row (kThreads is a multiple of kBN / 4): their operands once,
    // then every row's sums loaded before any is stored (the loads in flight together).
    constexpr int kGroups = kBN / 4, kRowsPerThread = kBM * kBN / 4 / kThreads;
    static_assert(kThreads % kGroups == 0, "fixed channels per thread");
    const int o = n0 + (tid % kGroups) * 4;
    if (o >= d.o) return;
    const ChannelQuad q = channel_quad(tile_channels, o - n0);
    const int valid = min(4, d.o - o);
    const QuadOutput out_desc = quad_output(p);
    const Requantizer requant = requantizer(p.y_scale, p.y_zero_point, p.out_dtype == DType::kInt8, p.relu);
    const bool eight_bit = (p.out_dtype == DType::kInt8 || p.out_dtype == DType::kUInt8) && requant.fast;
    // Four rows' sums in flight at a time; the loop over the groups is not unrolled (the code's size).
    static_assert(kRowsPerThread % 4 == 0, "rows in groups of four");
#pragma unroll 1
    for (int r0 = 0; r0 < kRowsPerThread; r0 += 4) {
      int4 sums[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int pixel = m0 + (r0 + r) * (kThreads / kGroups) + tid / kGroups;
        const std::int32_t* row = split_sums + static_cast<std::int64_t>(min(pixel, d.m - 1)) * d.o + o;
        if (vector) {
          sums[r] = __ldcg(reinterpret_cast<const int4*>(row));
        } else {
          sums[r].x = __ldcg(row);
          sums[r].y = valid > 1 ? __ldcg(row + 1) : 0;
          sums[r].z = valid > 2 ? __ldcg(row + 2) : 0;
          sums[r].w = valid > 3 ? __ldcg(row + 3) : 0;
        }
      }
      if (eight_bit) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int pixel = m0 + (r0 + r) * (kThreads / kGroups) + tid / kGroups;
          const std::uint32_t packed = requantized_quad(requant, q, sums[r]);
          if (pixel < d.m) store_packed(y, static_cast<std::int64_t>(pixel) * d.o + o, packed, valid, vector);
        }
        continue;
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // four call sites of the outlined store: sums stays in registers
        const int pixel = m0 + (r0 + r) * (kThreads / kGroups) + tid / kGroups;
        if (pixel < d.m) {
          store_quad(out_desc, q, y, static_cast<std::int64_t>(pixel) * d.o + o, sums[r], valid, vector);
        }
      }
    }
    return;
  }

  // One 16-row strip of the warp's tile at a time through shared memory: lane l takes the 4 channels (l % 8) * 4 ..
  // of the warp's 32 columns in rows l / 8, l / 8 + 4, ..., so its channel operands are read once.
  static_assert(kWN == 32, "the strip epilogue maps a lane to 4 of 32 columns");
  constexpr int kStrip = kWN + 4;  // ints per staged row (16-byte aligned rows)
  static_assert(sizeof(int) * (kThreads / 32) * 16 * kStrip <= kStages * kStageBytes, "the strips fit the buffers");
  int* strip = reinterpret_cast<int*>(smem) + warp * 16 * kStrip;
  const int column = (lane & 7) * 4;
  const int o = n0 + warp_n * kWN + column;
  const ChannelQuad q = channel_quad(tile_channels, o - n0);
  const int valid = min(4, d.o - o);
  const QuadOutput out_desc = quad_output(p);
  const Requantizer requant = requantizer(p.y_scale, p.y_zero_point, p.out_dtype == DType::kInt8, p.relu);
  const bool eight_bit = (p.out_dtype == DType::kInt8 || p.out_dtype == DType::kUInt8) && requant.fast;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<int2*>(strip + (group + 8 * h) * kStrip + nt * 8 + quad * 2) =
            make_int2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
    }
    __syncwarp();
    if (valid > 0 && eight_bit) {
      // The four rows' levels computed together (16 independent chains), then stored.
      std::uint32_t packed[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = (lane >> 3) + 4 * j;
        packed[j] = requantized_quad(requant, q, *reinterpret_cast<const int4*>(strip + row * kStrip + column));
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int pixel = m0 + warp_m * kWM + mt * 16 + (lane >> 3) + 4 * j;
        if (pixel < d.m) store_packed(y, static_cast<std::int64_t>(pixel) * d.o + o, packed[j], valid, vector);
      }
    } else if (valid > 0) {
#pragma unroll 1
      for (int j = 0; j < 4; ++j) {
        const int row = (lane >> 3) + 4 * j;
        const int pixel = m0 + warp_m * kWM + mt * 16 + row;
        if (pixel < d.m) {
          store_quad(out_desc, q, y, static_cast<std::int64_t>(pixel) * d.o + o,
                     *reinterpret_cast<const int4*>(strip + row * kStrip + column), valid, vector);
        }
      }
    }
    __syncwarp();
  }
}

template <int kBM, int kBN, int kWarpsM, int kWarpsN, bool kUnsigned>
void launch_pipelined(const QConvDims& d, const std::uint8_t* x, const std::int8_t* w, void* y,
                      const QuantEpilogueParams& p, std::uint32_t zero_point_word, const QConvPipeline& pipeline,
                      std::int32_t* split_sums, unsigned* tile_arrivals, cudaStream_t stream) {
  constexpr int kThreads = kWarpsM * kWarpsN * 32;
  constexpr int kSmem = kStages * (kBM + kBN) * kRowBytes;
  auto* kernel = &qconv_pipelined_kernel<kBM, kBN, kWarpsM, kWarpsN, kUnsigned>;
  if constexpr (kSmem > 48 * 1024) {
    // Over the 48 KiB default: raised on the current device (cheap, and idempotent per device).
    XPURT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(d.m, kBM)), static_cast<unsigned>(ceil_div(d.o, kBN)),
                  static_cast<unsigned>(pipeline.splits));
  kernel<<<grid, kThreads, kSmem, stream>>>(x, w, y, d, p, zero_point_word, pipeline.steps_per_split, split_sums,
                                             tile_arrivals);
}

std::size_t align_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

QConvPipeline qconv2d_pipeline(const QConvGeometry& g, bool small_tiles, int sms, int splits) {
  QConvPipeline out;
  const std::int64_t m = static_cast<std::int64_t>(g.batch) * g.out_h * g.out_w;
  const std::int64_t k = static_cast<std::int64_t>(g.channels) * g.kernel_h * g.kernel_w;
  const int steps = std::max(ceil_div(k, kStepBytes), 1);
  sms = std::max(sms, 1);
  const std::int64_t large_tiles = (m + 127) / 128 * ((g.out_channels + 127) / 128);
  // 64 x 64 tiles also where 128 output channels would be half empty (the first stage of a ResNet).
  out.small_tiles = small_tiles || large_tiles < sms || g.out_channels <= 64;
  const std::int64_t tiles =
      out.small_tiles ? (m + 63) / 64 * ((g.out_channels + 63) / 64) : large_tiles;
  int wanted = splits;
  if (wanted <= 0) {
    const std::int64_t waves_of_two = 2 * static_cast<std::int64_t>(sms) + tiles - 1;
    wanted = tiles >= sms ? 1 : static_cast<int>(waves_of_two / std::max<std::int64_t>(tiles, 1));
    wanted = std::min(wanted, std::max(steps / kMinStepsPerSplit, 1));
  }
  wanted = std::clamp(wanted, 1, std::min(kMaxSplits, steps));
  out.steps_per_split = ceil_div(steps, wanted);
  out.splits = ceil_div(steps, out.steps_per_split);  // no empty split
  return out;
}

std::size_t qconv2d_pipeline_workspace_bytes(const QConvGeometry& g, const QConvPipeline& pipeline) {
  if (pipeline.splits <= 1) return 0;
  const std::int64_t m = static_cast<std::int64_t>(g.batch) * g.out_h * g.out_w;
  const int tile = pipeline.small_tiles ? 64 : 128;
  const std::int64_t tiles = (m + tile - 1) / tile * ((g.out_channels + tile - 1) / tile);
  return align_up(static_cast<std::size_t>(m) * static_cast<std::size_t>(g.out_channels) * sizeof(std::int32_t)) +
         align_up(static_cast<std::size_t>(tiles) * sizeof(unsigned));
}

void qconv2d_pipelined(const QConvGeometry& g, const void* x, bool x_unsigned, int x_zero_point, const std::int8_t* w,
                       void* y, const QuantEpilogueParams& p, const QConvPipeline& pipeline, void* workspace,
                       void* stream) {
  const QConvDims d = qconv_dims_of(g);
  const cudaStream_t s = as_stream(stream);
  std::int32_t* split_sums = nullptr;
  unsigned* tile_arrivals = nullptr;
  if (pipeline.splits > 1) {
    XPURT_CHECK(workspace != nullptr, "cuda_raw qconv2d: a split launch needs its workspace");
    const std::size_t bytes = qconv2d_pipeline_workspace_bytes(g, pipeline);
    split_sums = static_cast<std::int32_t*>(workspace);
    tile_arrivals = reinterpret_cast<unsigned*>(
        static_cast<char*>(workspace) +
        align_up(static_cast<std::size_t>(d.m) * static_cast<std::size_t>(d.o) * sizeof(std::int32_t)));
    XPURT_CUDA_CHECK(cudaMemsetAsync(workspace, 0, bytes, s));
  }
  const auto* xb = static_cast<const std::uint8_t*>(x);
  const std::uint32_t zero_point_word = (static_cast<std::uint32_t>(x_zero_point) & 0xffu) * 0x01010101u;
  if (pipeline.small_tiles) {
    if (x_unsigned) {
      launch_pipelined<64, 64, 2, 2, true>(d, xb, w, y, p, zero_point_word, pipeline, split_sums, tile_arrivals, s);
    } else {
      launch_pipelined<64, 64, 2, 2, false>(d, xb, w, y, p, zero_point_word, pipeline, split_sums, tile_arrivals, s);
    }
  } else if (x_unsigned) {
    launch_pipelined<128, 128, 2, 4, true>(d, xb, w, y, p, zero_point_word, pipeline, split_sums, tile_arrivals, s);
  } else {
    launch_pipelined<128, 128, 2, 4, false>(d, xb, w, y, p, zero_point_word, pipeline, split_sums, tile_arrivals, s);
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace xpuruntime::cuda_raw
