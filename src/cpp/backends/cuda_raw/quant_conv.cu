// qconv2d's cuda_raw kernels (quant_conv.h): int8 implicit GEMMs whose int32 accumulators go through the epilogue of
// quant_epilogue.cuh in registers, so that every output equals the cpu kernel's bit for bit (Note [Quantized registry
// ops] in core/op_schemas.cpp).
//
// Note [Int8 convolution on the GPU]
// Three kernels, one launcher (qconv2d), the path chosen when the plan is built (qconv2d_path):
//   kDirect       one thread per output, its whole sum over C/groups x kh x kw in a loop: depthwise convolutions and
//                 other groups of few output channels, where a GEMM tile would be mostly empty.
//   kTiled        a 64 x 64 tile of (output pixels) x (output channels of one group) per block, K in steps of 32
//                 bytes gathered into shared memory as 4-byte words, each thread 4 x 4 accumulators summed with
//                 __dp4a (dp4a.u32.s32 for uint8 x): any layout, stride, padding, dilation and group count.
//   kTensorCore   NHWC, one group, input channels a multiple of 16: mma.sync m16n8k32 (s8.s8 or u8.s8 into s32,
//                 sm_80+) on 128 x 128 (or 64 x 64) tiles, K = (kh, kw, C) in steps of 64 bytes whose 16-byte runs
//                 of channels are loaded whole (x [N, H, W, C] and the OHWI weight both keep them contiguous);
//                 the next step's loads are in flight in registers while the current one multiplies out of a
//                 second shared buffer. Shared rows are 80 bytes (64 + 16), which puts the 8 rows x 4 words a
//                 fragment load reads into 32 different banks.
// The tiled and tensor-core kernels stage their accumulators through shared memory for the epilogue, so that the
// epilogue is one loop (one inlined quantized_store, not one per accumulator: those made nvcc's optimizer run for
// over ten minutes) and neighbouring threads store neighbouring outputs. The layout pass makes the channels-last
// convolutions (nhwc_layout, Note [Channels-last int8 convolutions] in engines/native/passes/layout.cpp), so a
// quantized ResNet's 3x3 and 1x1 convolutions after the stem take the tensor cores.
//
// Zero points: every kernel multiplies x as stored (int8 or uint8) and reads a padded position as x_zero_point
// itself, so that its sum is sum_k x'[k] * w[k] with x' = x inside and x_zero_point outside, and
//   sum_k (x'[k] - x_zero_point) * w[o, k] = sum_k x'[k] * w[o, k] - x_zero_point * sum_k w[o, k]
// (int32, wrapping: equal modulo 2^32). The left side is the cpu kernel's sum (padded positions count as
// x_zero_point, 0 once centred, as ONNX's QLinearConv pads); the correction is one number per output channel, folded
// into the int32 bias by the prologue (cuda_raw::quantized_prologue, QuantPrologueParams in core/device_kernels.h,
// shared with qlinear's kernels). The prologue also makes alpha[o] = float32(double(x_scale) * w_scale[o]), the cpu
// kernel's product. A KernelPlan sees descriptors, not data, so the prologue would run on every launch, before the
// convolution, into the plan's workspace (one small kernel over the weights, one warp per output channel); where the
// weight, w_scale and bias are constants the native engine's quantized_constant_folding pass has made both once (Note
// [Quantized constants folded at build time] in engines/native/passes/quantized_constants.cpp): x_scale is then 1 and
// w_scale is alpha, and zero_point_folded=1 says that the int32 bias holds the correction, so qconv2d launches no
// prologue.
//
// Note [Why not cuDNN's int8 convolution]
// cuDNN's legacy cudnnConvolutionForward takes int8 NHWC x and w (INT8_CONFIG / INT8_EXT_CONFIG, uint8 x too) with
// compute type INT32, but writes y only as INT8 (its own requantization: one float alpha, no zero point, its own
// rounding) or FLOAT (the int32 sum converted to float32, exact only while |sum| <= 2^24, while a 3x3 convolution over
// 512 channels reaches 4608 * 128 * 127 > 7 * 10^7); no configuration writes the int32 sum. Its padding is zeros, not
// x_zero_point, which needs a correction that depends on the output position near the borders. Neither result can be
// requantized to the cpu kernel's bits for every input, so the tensor-core kernel here accumulates in int32 itself.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "backends/cuda_raw/ptx.cuh"
#include "backends/cuda_raw/quant_conv.h"
#include "backends/cuda_raw/quant_conv_mma.h"
#include "backends/cuda_raw/quant_epilogue.cuh"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT(google-build-using-namespace): the backend's own helpers

constexpr std::size_t kWorkspaceAlign = 256;

std::size_t aligned_bytes(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// The output element of pixel m (of N x OH x OW) and output channel o.
template <bool kNhwc>
__device__ __forceinline__ std::int64_t output_index(const QConvDims& d, int m, int o) {
  if constexpr (kNhwc) {
    return static_cast<std::int64_t>(m) * d.o + o;
  } else {
    const int pixels = d.oh * d.ow;
    const int n = m / pixels;
    return (static_cast<std::int64_t>(n) * d.o + o) * pixels + (m - n * pixels);
  }
}

// ---- kDirect ----

// Output element i (in y's layout) per thread, a grid-stride loop; x of type XT (int8 or uint8) read as stored, a
// padded position as zero_point.
template <bool kNhwc, typename XT>
__global__ void __launch_bounds__(kThreads)
    qconv_direct_kernel(const XT* __restrict__ x, const std::int8_t* __restrict__ w, void* y, QConvDims d,
                        QuantEpilogueParams p, int zero_point) {
  const std::int64_t total = static_cast<std::int64_t>(d.m) * d.o;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    int o = 0, n = 0, oy = 0, ox = 0;
    if constexpr (kNhwc) {
      o = static_cast<int>(i % d.o);
      int t = static_cast<int>(i / d.o);
      ox = t % d.ow;
      t /= d.ow;
      oy = t % d.oh;
      n = t / d.oh;
    } else {
      int t = static_cast<int>(i / d.ow);
      ox = static_cast<int>(i - static_cast<std::int64_t>(t) * d.ow);
      oy = t % d.oh;
      t /= d.oh;
      o = t % d.o;
      n = t / d.o;
    }
    const int g = o / d.og;
    const int iy0 = oy * d.sh - d.pt, ix0 = ox * d.sw - d.pl;
    const std::int8_t* wo = w + static_cast<std::int64_t>(o) * d.k;
    std::uint32_t acc = 0;
    for (int r = 0; r < d.kh; ++r) {
      const int iy = iy0 + r * d.dh;
      const bool row_inside = iy >= 0 && iy < d.h;
      for (int s = 0; s < d.kw; ++s) {
        const int ix = ix0 + s * d.dw;
        const bool inside = row_inside && ix >= 0 && ix < d.w;
        for (int c = 0; c < d.cg; ++c) {
          std::int64_t at = 0;
          int tap = 0;
          if constexpr (kNhwc) {  // x [N, H, W, C], w [O, kh, kw, C/g]
            at = ((static_cast<std::int64_t>(n) * d.h + iy) * d.w + ix) * d.c + g * d.cg + c;
            tap = (r * d.kw + s) * d.cg + c;
          } else {  // x [N, C, H, W], w [O, C/g, kh, kw]
            at = ((static_cast<std::int64_t>(n) * d.c + g * d.cg + c) * d.h + iy) * d.w + ix;
            tap = (c * d.kh + r) * d.kw + s;
          }
          const int value = inside ? static_cast<int>(x[at]) : zero_point;
          acc += static_cast<std::uint32_t>(value) * static_cast<std::uint32_t>(static_cast<int>(wo[tap]));
        }
      }
    }
    quantized_store(p, y, i, static_cast<std::int32_t>(acc), o);
  }
}

// ---- kTiled ----

constexpr int kTileM = 64;   // output pixels per block
constexpr int kTileN = 64;   // output channels (of one group) per block
constexpr int kTileK = 32;   // bytes of K per step: 8 words
constexpr int kTileThreads = 256;

// c + the four products of a's and b's bytes (a unsigned when kUnsigned, else signed; b signed), int32 wrapping.
template <bool kUnsigned>
__device__ __forceinline__ int dot4(std::uint32_t a, std::uint32_t b, int c) {
  if constexpr (kUnsigned) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
  } else {
    return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
  }
}

// One block: a kTileM x kTileN tile of group blockIdx.z; each thread gathers two words of A and of B per step and
// keeps 4 x 4 accumulators.
template <bool kNhwc, bool kUnsigned>
__global__ void __launch_bounds__(kTileThreads)
    qconv_tiled_kernel(const std::uint8_t* __restrict__ x, const std::int8_t* __restrict__ w, void* y, QConvDims d,
                       QuantEpilogueParams p, std::uint32_t zero_point_byte) {
  __shared__ std::uint32_t a_tile[kTileK / 4][kTileM];  // 4 consecutive k of one pixel per word
  __shared__ std::uint32_t b_tile[kTileK / 4][kTileN];  // 4 consecutive k of one output channel per word
  __shared__ int k_dy[kTileK], k_dx[kTileK], k_offset[kTileK];  // k_offset < 0: k beyond the reduction
  __shared__ int staged[kTileM][kTileN + 1];                     // the accumulators, for the epilogue
  const int tid = static_cast<int>(threadIdx.x);
  const int g = static_cast<int>(blockIdx.z);
  const int m0 = static_cast<int>(blockIdx.x) * kTileM;
  const int n0 = static_cast<int>(blockIdx.y) * kTileN;

  // What this thread loads: words `word` and `word + 4` of pixel `row` (A) and of output channel `row` (B).
  const int row = tid % kTileM;
  const int word = tid / kTileM;
  const int m = m0 + row;
  const bool m_inside = m < d.m;
  int iy0 = 0, ix0 = 0;
  std::int64_t x_base = 0;
  if (m_inside) {
    const int ox = m % d.ow, t = m / d.ow;
    const int oy = t % d.oh, n = t / d.oh;
    iy0 = oy * d.sh - d.pt;
    ix0 = ox * d.sw - d.pl;
    x_base = kNhwc ? static_cast<std::int64_t>(n) * d.h * d.w * d.c + g * d.cg
                   : (static_cast<std::int64_t>(n) * d.c + g * d.cg) * d.h * d.w;
  }
  const int o_local = n0 + row;
  const bool o_inside = o_local < d.og;
  const std::int8_t* w_row = w + static_cast<std::int64_t>(g * d.og + (o_inside ? o_local : 0)) * d.k;

  const int tx = tid % 16, ty = tid / 16;  // this thread's outputs: pixels ty + 16 i, channels tx + 16 j
  int acc[4][4] = {};
  for (int k0 = 0; k0 < d.k; k0 += kTileK) {
    if (tid < kTileK) {
      const int k = k0 + tid;
      if (k < d.k) {
        int c = 0, r = 0, s = 0;
        if constexpr (kNhwc) {  // w [O, kh, kw, C/g]: k = (r * kw + s) * C/g + c
          c = k % d.cg;
          const int tap = k / d.cg;
          r = tap / d.kw;
          s = tap - r * d.kw;
        } else {  // w [O, C/g, kh, kw]: k = (c * kh + r) * kw + s
          s = k % d.kw;
          const int t = k / d.kw;
          r = t % d.kh;
          c = t / d.kh;
        }
        k_dy[tid] = r * d.dh;
        k_dx[tid] = s * d.dw;
        k_offset[tid] = kNhwc ? c : c * d.h * d.w;
      } else {
        k_dy[tid] = 0;
        k_dx[tid] = 0;
        k_offset[tid] = -1;
      }
    }
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int wi = word + 4 * half;
      std::uint32_t a = 0, b = 0;
#pragma unroll
      for (int byte = 0; byte < 4; ++byte) {
        const int kl = wi * 4 + byte;
        const int offset = k_offset[kl];
        if (offset < 0) continue;  // beyond K: zero in both operands
        if (m_inside) {
          const int iy = iy0 + k_dy[kl], ix = ix0 + k_dx[kl];
          std::uint32_t value = zero_point_byte;
          if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w) {
            const std::int64_t spatial = kNhwc ? (static_cast<std::int64_t>(iy) * d.w + ix) * d.c
                                               : static_cast<std::int64_t>(iy) * d.w + ix;
            value = x[x_base + offset + spatial];
          }
          a |= value << (8 * byte);
        }
        if (o_inside) b |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(w_row[k0 + kl])) << (8 * byte);
      }
      a_tile[wi][row] = a;
      b_tile[wi][row] = b;
    }
    __syncthreads();
#pragma unroll
    for (int wi = 0; wi < kTileK / 4; ++wi) {
      std::uint32_t av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = a_tile[wi][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = b_tile[wi][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = dot4<kUnsigned>(av[i], bv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  // The epilogue through shared memory: one quantized_store in the code (a loop, not 16 inlined copies), and
  // neighbouring threads store neighbouring elements of the output (pixels in NCHW, channels in NHWC).
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) staged[ty + 16 * i][tx + 16 * j] = acc[i][j];
  }
  __syncthreads();
#pragma unroll 1
  for (int i = tid; i < kTileM * kTileN; i += kTileThreads) {
    const int pixel_in_tile = kNhwc ? i / kTileN : i % kTileM;
    const int channel_in_tile = kNhwc ? i % kTileN : i / kTileM;
    const int pixel = m0 + pixel_in_tile, channel = n0 + channel_in_tile;
    if (pixel >= d.m || channel >= d.og) continue;
    const int o = g * d.og + channel;
    quantized_store(p, y, output_index<kNhwc>(d, pixel, o), staged[pixel_in_tile][channel_in_tile], o);
  }
}

// ---- kTensorCore ----

constexpr int kMmaK = 64;             // bytes of K per step
constexpr int kMmaRow = kMmaK + 16;   // bytes per shared row (Note [Int8 convolution on the GPU]: no bank conflicts)

__device__ __forceinline__ std::uint32_t shared_word(const std::uint8_t* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// One block: kBM output pixels x kBN output channels, kWarpsM x kWarpsN warps, each warp (kBM / kWarpsM) x
// (kBN / kWarpsN) of 16 x 8 accumulator tiles. The fragments of mma.m16n8k32 (lane = 4 * group + quad):
//   a[0] = A[group][4 quad .. +3], a[1] = A[group + 8][4 quad ..], a[2] = A[group][16 + 4 quad ..], a[3] = A[group +
//   8][16 + 4 quad ..]; b[0] = B[4 quad .. +3][group], b[1] = B[16 + 4 quad ..][group] (B held as rows of output
//   channels, K contiguous, as the OHWI weight is); d[0], d[1] = D[group][2 quad, 2 quad + 1], d[2], d[3] = D[group
//   + 8][...].
// Long function: the loads, the double-buffered main loop and the epilogue share the per-thread tables above them.
template <int kBM, int kBN, int kWarpsM, int kWarpsN, bool kUnsigned>
__global__ void __launch_bounds__(kWarpsM* kWarpsN * 32)
    qconv_mma_kernel(const std::uint8_t* __restrict__ x, const std::int8_t* __restrict__ w, void* y, QConvDims d,
                     QuantEpilogueParams p, std::uint32_t zero_point_word) {
  constexpr int kBlockThreads = kWarpsM * kWarpsN * 32;
  constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;
  constexpr int kMT = kWM / 16, kNT = kWN / 8;
  constexpr int kRowsPerPass = kBlockThreads / 4;  // 4 chunks of 16 bytes per 64-byte row
  constexpr int kAChunks = kBM / kRowsPerPass, kBChunks = kBN / kRowsPerPass;
  static_assert(kWM % 16 == 0 && kWN % 8 == 0 && kBM % kRowsPerPass == 0 && kBN % kRowsPerPass == 0, "tile shape");
  __shared__ __align__(16) std::uint8_t a_tile[2][kBM][kMmaRow];
  __shared__ __align__(16) std::uint8_t b_tile[2][kBN][kMmaRow];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int group = lane >> 2, quad = lane & 3;
  const int m0 = static_cast<int>(blockIdx.x) * kBM, n0 = static_cast<int>(blockIdx.y) * kBN;
  const int chunk = tid & 3;  // which 16 bytes of each 64-byte row this thread loads

  // The pixels (A rows) and output channels (B rows) this thread loads.
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

  uint4 a_next[kAChunks], b_next[kBChunks];
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const uint4 padded = make_uint4(zero_point_word, zero_point_word, zero_point_word, zero_point_word);
  // Step kt's 16-byte chunks into registers: a run of 16 channels of one tap (C is a multiple of 16).
  auto load = [&](int kt) {
    const int k = kt * kMmaK + chunk * 16;
    const bool k_inside = k < d.k;
    int r = 0, s = 0, c = 0;
    if (k_inside) {
      const int tap = k / d.c;
      c = k - tap * d.c;
      r = tap / d.kw;
      s = tap - r * d.kw;
    }
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      uint4 v = zero;
      if (k_inside && a_inside[i]) {
        const int iy = a_iy0[i] + r * d.dh, ix = a_ix0[i] + s * d.dw;
        if (iy >= 0 && iy < d.h && ix >= 0 && ix < d.w) {
          v = __ldg(reinterpret_cast<const uint4*>(a_image[i] + (static_cast<std::int64_t>(iy) * d.w + ix) * d.c + c));
        } else {
          v = padded;
        }
      }
      a_next[i] = v;
    }
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      b_next[i] = k_inside && b_inside[i] ? __ldg(reinterpret_cast<const uint4*>(b_row[i] + k)) : zero;
    }
  };
  auto store = [&](int buffer) {
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      *reinterpret_cast<uint4*>(&a_tile[buffer][(tid >> 2) + i * kRowsPerPass][chunk * 16]) = a_next[i];
    }
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      *reinterpret_cast<uint4*>(&b_tile[buffer][(tid >> 2) + i * kRowsPerPass][chunk * 16]) = b_next[i];
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
  const int steps = (d.k + kMmaK - 1) / kMmaK;
  load(0);
  store(0);
  __syncthreads();
  for (int kt = 0; kt < steps; ++kt) {
    const int buffer = kt & 1;
    if (kt + 1 < steps) load(kt + 1);  // in flight while this step multiplies
#pragma unroll
    for (int kk = 0; kk < kMmaK; kk += 32) {
      std::uint32_t a[kMT][4], b[kNT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const std::uint8_t* top = &a_tile[buffer][warp_m * kWM + mt * 16 + group][kk + quad * 4];
        const std::uint8_t* bottom = top + 8 * kMmaRow;
        a[mt][0] = shared_word(top);
        a[mt][1] = shared_word(bottom);
        a[mt][2] = shared_word(top + 16);
        a[mt][3] = shared_word(bottom + 16);
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const std::uint8_t* column = &b_tile[buffer][warp_n * kWN + nt * 8 + group][kk + quad * 4];
        b[nt][0] = shared_word(column);
        b[nt][1] = shared_word(column + 16);
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) ptx::mma_s8_16x8x32<kUnsigned>(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
      }
    }
    if (kt + 1 < steps) store(buffer ^ 1);  // the other buffer: last read in step kt - 1, before the barrier
    __syncthreads();
  }

  // The epilogue, one 16-row strip of the warp's tile at a time through shared memory (the A buffers, free after the
  // main loop's last barrier): one quantized_store in the code (a loop, not kMT * kNT * 4 inlined copies), and
  // neighbouring lanes store neighbouring output channels.
  constexpr int kStrip = kWN + 4;  // ints per staged row
  static_assert(sizeof(int) * (kBlockThreads / 32) * 16 * kStrip <= sizeof(a_tile), "the strips fit the A buffers");
  int* strip = reinterpret_cast<int*>(&a_tile[0][0][0]) + warp * 16 * kStrip;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) strip[(group + 8 * (e >> 1)) * kStrip + nt * 8 + quad * 2 + (e & 1)] = acc[mt][nt][e];
    }
    __syncwarp();
#pragma unroll 1
    for (int i = lane; i < 16 * kWN; i += 32) {
      const int row = i / kWN, column = i % kWN;
      const int pixel = m0 + warp_m * kWM + mt * 16 + row;
      const int o = n0 + warp_n * kWN + column;
      if (pixel < d.m && o < d.o) {
        quantized_store(p, y, static_cast<std::int64_t>(pixel) * d.o + o, strip[row * kStrip + column], o);
      }
    }
    __syncwarp();
  }
}

// ---- launch ----

template <bool kNhwc>
void launch_direct(const QConvDims& d, const QConvArgs& a, const QuantEpilogueParams& p, cudaStream_t stream) {
  const std::int64_t total = static_cast<std::int64_t>(d.m) * d.o;
  const unsigned blocks = grid_for(total, kThreads);
  if (a.x_unsigned) {
    qconv_direct_kernel<kNhwc, std::uint8_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const std::uint8_t*>(a.x), a.w, a.y, d, p, a.x_zero_point);
  } else {
    qconv_direct_kernel<kNhwc, std::int8_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const std::int8_t*>(a.x), a.w, a.y, d, p, a.x_zero_point);
  }
}

template <bool kNhwc>
void launch_tiled(const QConvDims& d, const QConvArgs& a, const QuantEpilogueParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((d.m + kTileM - 1) / kTileM),
                  static_cast<unsigned>((d.og + kTileN - 1) / kTileN), static_cast<unsigned>(d.groups));
  const auto* x = static_cast<const std::uint8_t*>(a.x);
  const std::uint32_t zero_point_byte = static_cast<std::uint32_t>(a.x_zero_point) & 0xffu;
  if (a.x_unsigned) {
    qconv_tiled_kernel<kNhwc, true><<<grid, kTileThreads, 0, stream>>>(x, a.w, a.y, d, p, zero_point_byte);
  } else {
    qconv_tiled_kernel<kNhwc, false><<<grid, kTileThreads, 0, stream>>>(x, a.w, a.y, d, p, zero_point_byte);
  }
}

template <int kBM, int kBN, int kWarpsM, int kWarpsN>
void launch_mma(const QConvDims& d, const QConvArgs& a, const QuantEpilogueParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((d.m + kBM - 1) / kBM), static_cast<unsigned>((d.o + kBN - 1) / kBN));
  constexpr int threads = kWarpsM * kWarpsN * 32;
  const auto* x = static_cast<const std::uint8_t*>(a.x);
  const std::uint32_t zero_point_word = (static_cast<std::uint32_t>(a.x_zero_point) & 0xffu) * 0x01010101u;
  if (a.x_unsigned) {
    qconv_mma_kernel<kBM, kBN, kWarpsM, kWarpsN, true><<<grid, threads, 0, stream>>>(x, a.w, a.y, d, p,
                                                                                      zero_point_word);
  } else {
    qconv_mma_kernel<kBM, kBN, kWarpsM, kWarpsN, false><<<grid, threads, 0, stream>>>(x, a.w, a.y, d, p,
                                                                                       zero_point_word);
  }
}

}  // namespace

bool qconv2d_fits_int32(const QConvGeometry& g) {
  // A margin below INT32_MAX: tile origins and their row offsets are formed past the last element.
  constexpr std::int64_t kLimit = std::numeric_limits<std::int32_t>::max() - (std::int64_t{1} << 20);
  const auto product = [](std::initializer_list<std::int64_t> sizes) {
    std::int64_t n = 1;
    for (const std::int64_t s : sizes) {
      if (s < 0) return std::numeric_limits<std::int64_t>::max();
      n *= std::max<std::int64_t>(s, 1);
      if (n > kLimit) return n;
    }
    return n;
  };
  const std::int64_t groups = std::max(g.groups, 1);
  return product({g.batch, g.channels, g.in_h, g.in_w}) <= kLimit &&
         product({g.batch, g.out_channels, g.out_h, g.out_w}) <= kLimit &&
         product({g.out_channels, g.channels / groups, g.kernel_h, g.kernel_w}) <= kLimit &&
         // padded coordinates: oy * stride + r * dilation stays within int32
         product({g.out_h + 1, g.stride_h}) + product({g.kernel_h, g.dilation_h}) <= kLimit &&
         product({g.out_w + 1, g.stride_w}) + product({g.kernel_w, g.dilation_w}) <= kLimit && g.groups <= 65535;
}

bool qconv2d_tensor_core_fits(const QConvGeometry& g) {
  return g.nhwc && g.groups == 1 && g.channels > 0 && g.channels % 16 == 0 && (g.out_channels + 63) / 64 <= 65535;
}

QConvPath qconv2d_path(const QConvGeometry& g, bool tensor_core, int sms) {
  if (tensor_core && qconv2d_tensor_core_fits(g)) {
    return qconv2d_pipeline(g, false, sms).small_tiles ? QConvPath::kPipelined64 : QConvPath::kPipelined;
  }
  const int groups = std::max(g.groups, 1);
  const int per_group_out = g.out_channels / groups;
  const std::int64_t k = static_cast<std::int64_t>(g.channels / groups) * g.kernel_h * g.kernel_w;
  return per_group_out >= 16 && k >= 16 ? QConvPath::kTiled : QConvPath::kDirect;
}

const char* qconv2d_path_name(QConvPath path) {
  switch (path) {
    case QConvPath::kDirect: return "direct (one thread per output)";
    case QConvPath::kTiled: return "dp4a implicit GEMM, 64x64 tiles";
    case QConvPath::kTensorCore: return "tensor-core implicit GEMM (mma.sync m16n8k32), 128x128 tiles";
    case QConvPath::kTensorCore64: return "tensor-core implicit GEMM (mma.sync m16n8k32), 64x64 tiles";
    case QConvPath::kPipelined:
      return "pipelined tensor-core implicit GEMM (cp.async, ldmatrix, mma.sync), 128x128 tiles";
    case QConvPath::kPipelined64:
      return "pipelined tensor-core implicit GEMM (cp.async, ldmatrix, mma.sync), 64x64 tiles";
  }
  return "";
}

namespace {

bool pipelined(QConvPath path) { return path == QConvPath::kPipelined || path == QConvPath::kPipelined64; }

// The pipeline of a pipelined path with `splits` ranges (the plan's choice, qconv2d_splits).
QConvPipeline pipeline_of(const QConvGeometry& g, QConvPath path, int splits) {
  return qconv2d_pipeline(g, path == QConvPath::kPipelined64, 1, std::max(splits, 1));
}

std::size_t prologue_workspace_bytes(const QConvGeometry& g) {
  return 2 * aligned_bytes(static_cast<std::size_t>(std::max(g.out_channels, 0)) * sizeof(std::int32_t));
}

}  // namespace

int qconv2d_splits(const QConvGeometry& g, QConvPath path, int sms) {
  return pipelined(path) ? qconv2d_pipeline(g, path == QConvPath::kPipelined64, sms).splits : 1;
}

std::size_t qconv2d_workspace_bytes(const QConvGeometry& g, QConvPath path, int splits) {
  const std::size_t split_bytes =
      pipelined(path) && splits > 1 ? qconv2d_pipeline_workspace_bytes(g, pipeline_of(g, path, splits)) : 0;
  return prologue_workspace_bytes(g) + split_bytes;
}

// The epilogue's parameters, the prologue, then the path's kernel.
void qconv2d(const QConvGeometry& g, const QConvArgs& a, QConvPath path, void* workspace, void* stream, int splits) {
  switch (a.out_dtype) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kInt32:
      break;
    default:
      throw UnsupportedOperationError(::xpuruntime::detail::str_cat(
          "cuda_raw qconv2d writes int8, uint8, float32, float16 or int32, got ", dtype_name(a.out_dtype)));
  }
  XPURT_CHECK(qconv2d_fits_int32(g), "cuda_raw qconv2d: the convolution's sizes exceed its 32-bit indexing");
  const bool tensor_core = path == QConvPath::kTensorCore || path == QConvPath::kTensorCore64 || pipelined(path);
  XPURT_CHECK(!tensor_core || qconv2d_tensor_core_fits(g),
              "cuda_raw qconv2d: the tensor-core path takes NHWC, one group and channels a multiple of 16");
  const QConvDims d = qconv_dims_of(g);
  if (static_cast<std::int64_t>(d.m) * d.o == 0) return;
  const cudaStream_t s = as_stream(stream);

  // The epilogue's per-channel operands (Note [Int8 convolution on the GPU]): quantized_prologue (quant_gemm.cu) on
  // the weight as [O, k], which both layouts' weights are. None when the plan's constants already hold them (Note
  // [Quantized constants folded at build time] in engines/native/passes/quantized_constants.cpp): with x_scale 1,
  // w_scale is alpha (float32(double(1) * s) == s); with zero_point_folded, the int32 bias holds the correction.
  const bool needs_alpha = a.out_dtype != DType::kInt32;
  const bool alpha_given = needs_alpha && a.x_scale == 1.0f && a.w_scale != nullptr;
  const bool folds = a.x_zero_point != 0 && !a.zero_point_folded;
  const auto* int_bias = a.bias != nullptr && a.bias_int ? static_cast<const std::int32_t*>(a.bias) : nullptr;
  QuantPrologueParams prologue;
  prologue.x_scale = a.x_scale;
  prologue.w_scale = a.w_scale;
  prologue.alpha_per_channel = a.w_scale != nullptr && a.w_scale_count != 1;
  prologue.bias = int_bias;
  prologue.weight = a.w;
  prologue.weight_nk = true;
  prologue.k = d.k;
  prologue.zero_point_correction = -a.x_zero_point;
  if ((needs_alpha && !alpha_given) || folds) {
    XPURT_CHECK(workspace != nullptr, "cuda_raw qconv2d: needs qconv2d_workspace_bytes() of workspace");
    prologue.alpha = needs_alpha && !alpha_given ? static_cast<float*>(workspace) : nullptr;
    prologue.int_bias = folds ? reinterpret_cast<std::int32_t*>(static_cast<char*>(workspace) +
                                                                prologue_workspace_bytes(g) / 2)
                              : nullptr;
    quantized_prologue(prologue, d.o, stream);
  }
  QuantEpilogueParams p;
  p.alpha = alpha_given ? a.w_scale : prologue.alpha;
  p.alpha_per_channel = prologue.alpha_per_channel;
  p.int_bias = folds ? prologue.int_bias : int_bias;
  p.float_bias = a.bias != nullptr && !a.bias_int ? static_cast<const float*>(a.bias) : nullptr;
  p.relu = a.relu;
  p.y_scale = a.y_scale;
  p.y_zero_point = static_cast<float>(a.y_zero_point);
  p.out_dtype = a.out_dtype;

  switch (path) {
    case QConvPath::kDirect:
      if (g.nhwc) {
        launch_direct<true>(d, a, p, s);
      } else {
        launch_direct<false>(d, a, p, s);
      }
      break;
    case QConvPath::kTiled:
      if (g.nhwc) {
        launch_tiled<true>(d, a, p, s);
      } else {
        launch_tiled<false>(d, a, p, s);
      }
      break;
    case QConvPath::kTensorCore:
      launch_mma<128, 128, 2, 4>(d, a, p, s);
      break;
    case QConvPath::kTensorCore64:
      launch_mma<64, 64, 2, 2>(d, a, p, s);
      break;
    case QConvPath::kPipelined:
    case QConvPath::kPipelined64:
      qconv2d_pipelined(g, a.x, a.x_unsigned, a.x_zero_point, a.w, a.y, p, pipeline_of(g, path, splits),
                        workspace != nullptr ? static_cast<char*>(workspace) + prologue_workspace_bytes(g) : nullptr,
                        stream);
      return;  // its launcher checks its launch
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace xpuruntime::cuda_raw
