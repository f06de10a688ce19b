// max_pool2d and avg_pool2d on the GPU for every window cuDNN's pooling descriptor cannot take: ceil_mode sizes
// past the floor size (GoogLeNet's and Inception's 3x3 stride-2 pools), asymmetric pads, dilations (Note [Pooling
// windows] in backends/cpu/cpu_pool.cpp gives the semantics, which both kernels follow). One thread per output element,
// NCHW or NHWC (the output's memory order is the thread order, so a warp's stores are contiguous in either layout),
// fp32 compute (Note [fp32 compute]); cuDNN stays first where it accepts (its registration comes before).
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

template <typename I>
struct PoolGeometry {
  I c, h, w, out_h, out_w;
  I kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dilation_h, dilation_w;
  bool nhwc, count_include_pad;
};

template <typename I>
PoolGeometry<I> geometry_of(const PoolParams& p) {
  PoolGeometry<I> g;
  g.c = static_cast<I>(p.c);
  g.h = static_cast<I>(p.h);
  g.w = static_cast<I>(p.w);
  g.out_h = static_cast<I>(p.out_h);
  g.out_w = static_cast<I>(p.out_w);
  g.kernel_h = static_cast<I>(p.kernel[0]);
  g.kernel_w = static_cast<I>(p.kernel[1]);
  g.stride_h = static_cast<I>(p.stride[0]);
  g.stride_w = static_cast<I>(p.stride[1]);
  g.pad_top = static_cast<I>(p.pad_begin[0]);
  g.pad_left = static_cast<I>(p.pad_begin[1]);
  g.pad_bottom = static_cast<I>(p.pad_end[0]);
  g.pad_right = static_cast<I>(p.pad_end[1]);
  g.dilation_h = static_cast<I>(p.dilation[0]);
  g.dilation_w = static_cast<I>(p.dilation[1]);
  g.nhwc = p.nhwc;
  g.count_include_pad = p.count_include_pad;
  return g;
}

// Output element i (in the output's memory order) as (the input's offset of its (n, c) at row 0, column 0, oh, ow).
template <typename I>
__device__ __forceinline__ void locate(const PoolGeometry<I>& g, I i, I& base, I& oh, I& ow) {
  if (g.nhwc) {
    const I c = i % g.c;
    I rest = i / g.c;
    ow = rest % g.out_w;
    rest /= g.out_w;
    oh = rest % g.out_h;
    base = rest / g.out_h * g.h * g.w * g.c + c;
  } else {
    ow = i % g.out_w;
    I rest = i / g.out_w;
    oh = rest % g.out_h;
    base = rest / g.out_h * g.h * g.w;  // rest / out_h = n * C + c
  }
}

// Max (kMax): the largest value at the window's positions inside the input (padding never wins); -inf when none is
// (dilations); NaN when any is NaN. Average: the window's sum over its positions inside the input, divided by
// PyTorch's divisor: the window clipped to the padded input when count_include_pad (a ceil_mode window's overhang past
// the trailing padding never counts), else clipped to the input.
template <typename T, typename I, bool kMax>
__global__ void pool_kernel(const T* __restrict__ x, T* __restrict__ y, PoolGeometry<I> g, I total) {
  const I column = g.nhwc ? g.c : 1, row = g.w * column;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    I base, oh, ow;
    locate(g, i, base, oh, ow);
    I h0 = oh * g.stride_h - g.pad_top, w0 = ow * g.stride_w - g.pad_left;
    if constexpr (kMax) {
      float best = -INFINITY;
      bool nan = false;
      for (I kh = 0; kh < g.kernel_h; ++kh) {
        const I h = h0 + kh * g.dilation_h;
        if (h < 0 || h >= g.h) continue;
        for (I kw = 0; kw < g.kernel_w; ++kw) {
          const I w = w0 + kw * g.dilation_w;
          if (w < 0 || w >= g.w) continue;
          const float v = to_float(x[base + h * row + w * column]);
          nan |= v != v;
          best = fmaxf(best, v);
        }
      }
      y[i] = from_float<T>(nan ? NAN : best);
    } else {
      I h1 = min(h0 + g.kernel_h, g.h + g.pad_bottom), w1 = min(w0 + g.kernel_w, g.w + g.pad_right);
      const I padded = (h1 - h0) * (w1 - w0);
      h0 = max(h0, I{0});
      w0 = max(w0, I{0});
      h1 = min(h1, g.h);
      w1 = min(w1, g.w);
      float sum = 0.0f;
      for (I h = h0; h < h1; ++h) {
        for (I w = w0; w < w1; ++w) sum += to_float(x[base + h * row + w * column]);
      }
      const I divisor = g.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
      y[i] = from_float<T>(sum / static_cast<float>(max(divisor, I{1})));
    }
  }
}

template <typename T, typename I>
void launch_pool(const PoolParams& p, const void* x, void* y, void* stream) {
  const PoolGeometry<I> g = geometry_of<I>(p);
  const auto total = static_cast<I>(p.n * p.c * p.out_h * p.out_w);
  const unsigned blocks = grid_for(total, kThreads);
  auto* kernel = p.max ? pool_kernel<T, I, true> : pool_kernel<T, I, false>;
  kernel<<<blocks, kThreads, 0, as_stream(stream)>>>(static_cast<const T*>(x), static_cast<T*>(y), g, total);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace

void pool2d(const PoolParams& p, const void* x, void* y, DType dtype, void* stream) {
  const std::int64_t total = p.n * p.c * p.out_h * p.out_w;
  if (total == 0) return;
  // 32-bit index math (Note [Launch shapes]) when every offset of the input and output, and the window's reach, fit.
  const std::int64_t reach = (p.out_h * p.stride[0] + p.kernel[0] * p.dilation[0]) *
                             (p.out_w * p.stride[1] + p.kernel[1] * p.dilation[1]) * p.n * p.c;
  const bool small = std::max({total, p.n * p.c * p.h * p.w, reach}) < std::numeric_limits<std::int32_t>::max() / 2;
  dispatch_float(dtype, "pooling", [&](auto t) {
    using T = decltype(t);
    small ? launch_pool<T, std::int32_t>(p, x, y, stream) : launch_pool<T, std::int64_t>(p, x, y, stream);
  });
}

}  // namespace xpuruntime::cuda_raw
