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

// The sizes the kernel reads (32-bit: qconv2d_fits_int32 holds).
struct PDims {
  int n, c, h, w, o, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, k, m;
};

PDims pdims_of(const QConvGeometry& g) {
  PDims d{};
  d.n = g.batch;
  d.c = g.channels;
  d.h = g.in_h;
  d.w = g.in_w;
  d.o = g.out_channels;
  d.oh = g.out_h;
  d.ow = g.out_w;
  d.kh = g.kernel_h;
  d.kw = g.kernel_w;
  d.sh = g.stride_h;
  d.sw = g.stride_w;
  d.pt = g.pad_top;
  d.pl = g.pad_left;
  d.dh = g.dilation_h;
  d.dw = g.dilation_w;
  d.k = g.channels * g.kernel_h * g.kernel_w;
  d.m = g.batch * g.out_h * g.out_w;
  return d;
}

int ceil_div(std::int64_t a, std::int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Four neighbouring outputs index .. index + 3 (channels o .. o + 3) from their accumulators; `valid` of them exist.
// One vector store when all four exist and `vector` (the channel count is a multiple of 4, so index is too).
__device__ __forceinline__ void store_quad(const QuantEpilogueParams& p, void* y, std::int64_t index, const int (&acc)[4],
                                           int o, int valid, bool vector) {
  if (vector && valid == 4) {
    switch (p.out_dtype) {
      case DType::kInt8:
      case DType::kUInt8: {
        const bool is_signed = p.out_dtype == DType::kInt8;
        const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
        std::uint32_t packed = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float level = quantized_level(p, quantized_real(p, acc[e], o + e), lo, hi);
          const std::uint32_t byte = is_signed ? static_cast<std::uint32_t>(static_cast<std::uint8_t>(
                                                     static_cast<std::int8_t>(level)))
                                               : static_cast<std::uint32_t>(static_cast<std::uint8_t>(level));
          packed |= byte << (8 * e);
        }
        reinterpret_cast<std::uint32_t*>(static_cast<std::uint8_t*>(y) + index)[0] = packed;
        return;
      }
      case DType::kFloat16: {
        const __half2 lo = __floats2half2_rn(quantized_real(p, acc[0], o), quantized_real(p, acc[1], o + 1));
        const __half2 hi = __floats2half2_rn(quantized_real(p, acc[2], o + 2), quantized_real(p, acc[3], o + 3));
        uint2 v;
        v.x = *reinterpret_cast<const std::uint32_t*>(&lo);
        v.y = *reinterpret_cast<const std::uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(static_cast<__half*>(y) + index) = v;
        return;
      }
      case DType::kFloat32: {
        const float4 v = make_float4(quantized_real(p, acc[0], o), quantized_real(p, acc[1], o + 1),
                                     quantized_real(p, acc[2], o + 2), quantized_real(p, acc[3], o + 3));
        *reinterpret_cast<float4*>(static_cast<float*>(y) + index) = v;
        return;
      }
      default: {  // kInt32
        const int4 v = make_int4(quantized_raw(p, acc[0], o), quantized_raw(p, acc[1], o + 1),
                                 quantized_raw(p, acc[2], o + 2), quantized_raw(p, acc[3], o + 3));
        *reinterpret_cast<int4*>(static_cast<std::int32_t*>(y) + index) = v;
        return;
      }
    }
  }
  for (int e = 0; e < valid; ++e) quantized_store(p, y, index + e, acc[e], o + e);
}

// One block: kBM output pixels x kBN output channels, kWarpsM x kWarpsN warps of (kBM / kWarpsM) x (kBN / kWarpsN),
// steps [blockIdx.z * steps_per_split, ...) of the reduction. Fragment layouts: ptx::mma_s8_16x8x32.
// Long function: the loads, the pipelined main loop and the two epilogues share the per-thread tables above them.
template <int kBM, int kBN, int kWarpsM, int kWarpsN, bool kUnsigned>
__global__ void __launch_bounds__(kWarpsM* kWarpsN * 32)
    qconv_pipelined_kernel(const std::uint8_t* __restrict__ x, const std::int8_t* __restrict__ w, void* y, PDims d,
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

  // Step `kt` (absolute) into stage buffer `stage`: a run of 16 channels of one tap (C is a multiple of 16).
  auto issue = [&](int stage, int kt) {
    std::uint8_t* a_stage = smem + stage * kStageBytes;
    std::uint8_t* b_stage = a_stage + kBM * kRowBytes;
    const int k = kt * kStepBytes + chunk * 16;
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
    if (s < steps) issue(s, first + s);
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
    if (next < steps) issue(next % kStages, first + next);
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
          if (pixel < d.m && o < d.o) atomicAdd(split_sums + static_cast<std::int64_t>(pixel) * d.o + o, acc[mt][nt][e]);
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
#pragma unroll 1
    for (int i = tid; i < kBM * kBN / 4; i += kThreads) {
      const int pixel = m0 + i / (kBN / 4), o = n0 + (i % (kBN / 4)) * 4;
      if (pixel >= d.m || o >= d.o) continue;
      const std::int64_t index = static_cast<std::int64_t>(pixel) * d.o + o;
      const int valid = min(4, d.o - o);
      int sums[4] = {0, 0, 0, 0};
      for (int e = 0; e < valid; ++e) sums[e] = __ldcg(split_sums + index + e);
      store_quad(p, y, index, sums, o, valid, vector);
    }
    return;
  }

  // One 16-row strip of the warp's tile at a time through shared memory: neighbouring lanes take neighbouring groups
  // of 4 output channels.
  constexpr int kStrip = kWN + 4;  // ints per staged row (16-byte aligned rows)
  static_assert(sizeof(int) * (kThreads / 32) * 16 * kStrip <= kStages * kStageBytes, "the strips fit the buffers");
  int* strip = reinterpret_cast<int*>(smem) + warp * 16 * kStrip;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) strip[(group + 8 * (e >> 1)) * kStrip + nt * 8 + quad * 2 + (e & 1)] = acc[mt][nt][e];
    }
    __syncwarp();
#pragma unroll 1
    for (int i = lane; i < 16 * kWN / 4; i += 32) {
      const int row = i / (kWN / 4), column = (i % (kWN / 4)) * 4;
      const int pixel = m0 + warp_m * kWM + mt * 16 + row;
      const int o = n0 + warp_n * kWN + column;
      if (pixel < d.m && o < d.o) {
        const int4 v = *reinterpret_cast<const int4*>(strip + row * kStrip + column);
        const int sums[4] = {v.x, v.y, v.z, v.w};
        store_quad(p, y, static_cast<std::int64_t>(pixel) * d.o + o, sums, o, min(4, d.o - o), vector);
      }
    }
    __syncwarp();
  }
}

template <int kBM, int kBN, int kWarpsM, int kWarpsN, bool kUnsigned>
void launch_pipelined(const PDims& d, const std::uint8_t* x, const std::int8_t* w, void* y,
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
  out.small_tiles = small_tiles || large_tiles < sms;
  const std::int64_t tiles =
      out.small_tiles ? (m + 63) / 64 * ((g.out_channels + 63) / 64) : large_tiles;
  int wanted = splits;
  if (wanted <= 0) {
    wanted = tiles >= sms ? 1 : static_cast<int>((2 * static_cast<std::int64_t>(sms) + tiles - 1) / std::max<std::int64_t>(tiles, 1));
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
  const PDims d = pdims_of(g);
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
