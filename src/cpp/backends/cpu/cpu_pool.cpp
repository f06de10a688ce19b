// Pooling of the cpu backend: max_pool2d, avg_pool2d, global_avg_pool (NCHW), one (n, c) plane per task.
//
// Note [Pooling windows]
// Output (oh, ow) covers rows oh * stride_h - pad_top + i * dilation_h, i < kernel_h (likewise columns);
// the output size (op_schemas.cpp) follows PyTorch/ONNX, ceil_mode included (a last window that would start
// in the trailing padding is dropped).
//  * max: the largest value among the window's positions inside the input (padding never wins). A window
//    with no position inside the input (possible only with dilations) gives -inf. NaN propagates.
//  * avg (PyTorch's rule, asymmetric pads generalised): the window is clipped first to the padded input,
//    [start, min(start + kernel, size + pad_end)), whose length is the divisor when count_include_pad; then to
//    the input itself, whose length is the divisor otherwise. So with ceil_mode a window that overhangs the
//    trailing padding does not count the overhang even when count_include_pad.
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"

namespace xpuruntime::cpu {

namespace {

struct PoolGeometry {
  std::int64_t planes, height, width, out_h, out_w;
  std::int64_t kernel[2], stride[2], pad_begin[2], pad_end[2], dilation[2];
};

PoolGeometry pool_geometry(const KernelLaunch& launch) {
  const OpDescriptor& desc = *launch.desc;
  const auto& x = launch.input(0).shape();
  const auto& y = launch.output(0).shape();
  const auto kernel = desc.attrs.get_ints("kernel_shape", {1, 1});
  const auto strides = desc.attrs.get_ints("strides", kernel);
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations =
      desc.op == "max_pool2d" ? desc.attrs.get_ints("dilations", {1, 1}) : std::vector<std::int64_t>{1, 1};
  PoolGeometry g{};
  g.planes = x[0] * x[1];
  g.height = x[2];
  g.width = x[3];
  g.out_h = y[2];
  g.out_w = y[3];
  for (int d = 0; d < 2; ++d) {
    g.kernel[d] = kernel[d];
    g.stride[d] = strides[d];
    g.pad_begin[d] = pads[d];
    g.pad_end[d] = pads[d + 2];
    g.dilation[d] = dilations[d];
  }
  return g;
}

// Planes per chunk of a pooling loop: ~16K window reads each (small pools run on one thread, Note [CPU worker
// threads] in cpu_threads.cpp).
std::int64_t plane_grain(const PoolGeometry& g) {
  return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(g.out_h * g.out_w * g.kernel[0] * g.kernel[1], 1));
}

// Max pooling as a window loop over a phase-split plane padded with -inf (Note [Phase-split planes] in
// cpu_conv.cpp; cpu_isa.h): padding never wins, and a window with no position inside the input gives -inf.
template <typename T>
void run_max_pool(const KernelLaunch& launch, const CpuContext& context) {
  const PoolGeometry g = pool_geometry(launch);
  InputBuffer<T> x(launch.input(0));
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  T* out = y.data();
  if (g.out_h <= 0 || g.out_w <= 0) {
    y.commit();
    return;
  }
  const PhaseGeometry phases =
      phase_geometry(g.out_h, g.out_w, g.kernel[0], g.kernel[1], g.stride, g.dilation, g.pad_begin[0], g.pad_begin[1]);
  const std::vector<std::int64_t> offsets = phase_offsets(phases, g.kernel[0], g.kernel[1], g.dilation);
  const IsaKernels& isa = *context.isa;
  parallel_for(g.planes, context.threads, plane_grain(g), [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<T> padded(static_cast<std::size_t>(phase_plane_size(phases)));
    ScratchVector<T> wide(static_cast<std::size_t>(g.out_h * phases.row_stride));
    WindowPlane<T> window = window_plane(phases, offsets, g.out_h, g.out_w, padded.data(), wide.data());
    for (std::int64_t plane = begin; plane < end; ++plane) {
      const T* src = in + plane * g.height * g.width;
      window.out = out + plane * g.out_h * g.out_w;
      if constexpr (std::is_same_v<T, float>) {
        isa.fill_phase_f32(phases, src, g.height, g.width, -std::numeric_limits<float>::infinity(), padded.data());
        isa.max_window_f32(window);
      } else {
        isa.fill_phase_f64(phases, src, g.height, g.width, -std::numeric_limits<double>::infinity(), padded.data());
        isa.max_window_f64(window);
      }
    }
  });
  y.commit();
}

template <typename T>
void run_avg_pool(const KernelLaunch& launch, const CpuContext& context) {
  const PoolGeometry g = pool_geometry(launch);
  const bool count_include_pad = launch.desc->attrs.get_int("count_include_pad", 0) != 0;
  InputBuffer<T> x(launch.input(0));
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  T* out = y.data();
  parallel_for(g.planes, context.threads, plane_grain(g), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t plane = begin; plane < end; ++plane) {
      const T* src = in + plane * g.height * g.width;
      T* dst = out + plane * g.out_h * g.out_w;
      for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
        const std::int64_t h0 = oh * g.stride[0] - g.pad_begin[0];
        const std::int64_t h1 = std::min(h0 + g.kernel[0], g.height + g.pad_end[0]);
        const std::int64_t hs = std::max<std::int64_t>(h0, 0), he = std::min(h1, g.height);
        for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
          const std::int64_t w0 = ow * g.stride[1] - g.pad_begin[1];
          const std::int64_t w1 = std::min(w0 + g.kernel[1], g.width + g.pad_end[1]);
          const std::int64_t ws = std::max<std::int64_t>(w0, 0), we = std::min(w1, g.width);
          double sum = 0.0;
          for (std::int64_t ih = hs; ih < he; ++ih) {
            for (std::int64_t iw = ws; iw < we; ++iw) sum += static_cast<double>(src[ih * g.width + iw]);
          }
          const std::int64_t count = count_include_pad
                                         ? (h1 - h0) * (w1 - w0)
                                         : std::max<std::int64_t>(he - hs, 0) * std::max<std::int64_t>(we - ws, 0);
          dst[oh * g.out_w + ow] = static_cast<T>(sum / static_cast<double>(count));
        }
      }
    }
  });
  y.commit();
}

template <typename T>
void run_global_avg_pool(const KernelLaunch& launch, const CpuContext& context) {
  const auto& shape = launch.input(0).shape();
  const std::int64_t planes = shape[0] * shape[1];
  const std::int64_t size = shape[2] * shape[3];
  InputBuffer<T> x(launch.input(0));
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  T* out = y.data();
  parallel_for(planes, context.threads, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(size, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t plane = begin; plane < end; ++plane) {
                   double sum = 0.0;
                   for (std::int64_t i = 0; i < size; ++i) sum += static_cast<double>(in[plane * size + i]);
                   out[plane] = static_cast<T>(sum / static_cast<double>(size));
                 }
               });
  y.commit();
}

template <typename T>
struct MaxPool {
  static void run(const KernelLaunch& l, const CpuContext& c) { run_max_pool<T>(l, c); }
};
template <typename T>
struct AvgPool {
  static void run(const KernelLaunch& l, const CpuContext& c) { run_avg_pool<T>(l, c); }
};
template <typename T>
struct GlobalAvgPool {
  static void run(const KernelLaunch& l, const CpuContext& c) { run_global_avg_pool<T>(l, c); }
};

}  // namespace

void register_pool_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "max_pool2d", "reference max pooling (ceil_mode, dilations; NaN propagates; NHWC through NCHW)",
                 nhwc_through_nchw(typed_run<MaxPool>()));
  add_cpu_kernel(registry, "avg_pool2d",
                 "reference average pooling (PyTorch divisor rules, ceil_mode, count_include_pad; NHWC through NCHW)",
                 nhwc_through_nchw(typed_run<AvgPool>()));
  add_cpu_kernel(registry, "global_avg_pool", "reference mean over H and W, accumulated in double (NHWC through NCHW)",
                 nhwc_through_nchw(typed_run<GlobalAvgPool>()));
}

}  // namespace xpuruntime::cpu
