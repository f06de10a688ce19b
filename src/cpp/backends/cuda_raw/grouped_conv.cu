// The gather half of conv2d's "grouped_gemm" kernel (grouped_conv_register.cpp): a channels-last input's patches,
// group by group, as the rows of the GEMMs that cuBLAS runs next.
//
// Note [Grouped convolutions as GEMMs]
// A grouped convolution whose groups each reduce over many values (C/g x kh x kw) is g GEMMs: for group j,
// y[p, j*O/g .. (j+1)*O/g) = col_j[p, :] @ w_j^T, where col_j[p, k] is the input value under tap k of output
// position p (k = (ih * kw + iw) * C/g + c, the order of a channels-last weight [O, kh, kw, C/g], so w_j is its rows
// as they are) and p runs over N x OH x OW. cuBLAS runs the g GEMMs as one strided batch, writing each group's
// columns of y in place (ldc = O). cuDNN's heuristic pick for wav2vec 2.0's positional convolution (768 channels in
// 16 groups, kernel 128 along time, a weight computed at run time) ran at 0.05% of its floor on an H100, 7.0 ms a
// profiled run at batch 1 (docs/benchmarks.md, the 18:34 UTC suite run of 2026-12-06), where its FLOPs are half a
// GFLOP and its GEMMs' reduction is 6144 deep. The gather writes kh x kw copies of the input (the workspace holds
// col for as many positions as its budget allows; more positions take more rounds), so the kernel is for deep
// reductions only (kMinGroupDepth in the registration) and the dispatcher times it against cuDNN's plans
// (Note [Timed first choices] in core/dispatcher.cpp): the faster one runs.
//
// The gather: one thread per 16-byte vector of a group's channels at one tap of one position (2- or 4-byte
// elements one at a time when a group's channels are not a whole number of vectors or x is not 16-byte aligned);
// thread i writes col's element i, so the stores are contiguous; taps past the borders are zeros.
#include <cstdint>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

constexpr int kGatherThreads = 256;

// col[(group * rows + r) * taps + tap][lane] = x[n, iy, ix][group * lanes + lane] or zero, for output positions p0 + r;
// `lanes` vectors V make a group's channels, `pixel` vectors a pixel's.
template <typename V>
__global__ void __launch_bounds__(kGatherThreads)
    grouped_im2col_kernel(const V* __restrict__ x, V* __restrict__ col, GroupedConvGeometry g, std::int64_t p0,
                          std::int64_t rows, std::int64_t lanes, std::int64_t pixel) {
  const std::int64_t taps = g.kh * g.kw;
  const std::int64_t plane = g.oh * g.ow;
  const std::int64_t total = g.groups * rows * taps * lanes;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kGatherThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kGatherThreads + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t lane = i % lanes;
    std::int64_t t = i / lanes;
    const std::int64_t tap = t % taps;
    t /= taps;
    const std::int64_t r = t % rows;
    const std::int64_t group = t / rows;
    const std::int64_t p = p0 + r;
    const std::int64_t n = p / plane;
    const std::int64_t rest = p - n * plane;
    const std::int64_t oy = rest / g.ow;
    const std::int64_t ox = rest - oy * g.ow;
    const std::int64_t iy = oy * g.stride_h - g.pad_h + (tap / g.kw) * g.dilation_h;
    const std::int64_t ix = ox * g.stride_w - g.pad_w + (tap % g.kw) * g.dilation_w;
    V v{};
    if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) v = x[((n * g.h + iy) * g.w + ix) * pixel + group * lanes + lane];
    col[i] = v;
  }
}

template <typename V>
void launch_gather(const void* x, void* col, const GroupedConvGeometry& g, std::int64_t p0, std::int64_t rows,
                   std::int64_t element_bytes, void* stream) {
  const auto per_vector = static_cast<std::int64_t>(sizeof(V)) / element_bytes;
  const std::int64_t lanes = g.group_channels() / per_vector;
  const std::int64_t total = g.groups * rows * g.kh * g.kw * lanes;
  grouped_im2col_kernel<V><<<grid_for(total, kGatherThreads), kGatherThreads, 0, as_stream(stream)>>>(
      static_cast<const V*>(x), static_cast<V*>(col), g, p0, rows, lanes, g.c / per_vector);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace

void grouped_conv_im2col(const void* x, void* col, DType dtype, const GroupedConvGeometry& g, std::int64_t p0,
                         std::int64_t rows, void* stream) {
  XPURT_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16,
              "cuda_raw grouped_conv_im2col: float32, float16 or bfloat16, got ", dtype_name(dtype));
  XPURT_CHECK(g.groups > 0 && g.c % g.groups == 0 && rows >= 0 && p0 >= 0 && p0 + rows <= g.positions(),
              "cuda_raw grouped_conv_im2col: inconsistent geometry");
  if (rows == 0) return;
  const auto element = static_cast<std::int64_t>(dtype_size(dtype));
  const bool vectors = (g.group_channels() * element) % 16 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(col) % 16 == 0;
  if (vectors) return launch_gather<uint4>(x, col, g, p0, rows, element, stream);
  if (element == 2) return launch_gather<std::uint16_t>(x, col, g, p0, rows, element, stream);
  launch_gather<std::uint32_t>(x, col, g, p0, rows, element, stream);
}

}  // namespace xpuruntime::cuda_raw
