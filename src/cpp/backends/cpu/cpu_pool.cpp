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
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"
#include "core/conv_layout.h"

namespace xpuruntime::cpu {

namespace {

struct PoolGeometry : detail::PoolWindow {
  std::int64_t planes = 0, height = 0, width = 0, out_h = 0, out_w = 0;
};

PoolGeometry pool_geometry(const KernelLaunch& launch) {
  const OpDescriptor& desc = *launch.desc;
  const auto& x = launch.input(0).shape();
  const auto& y = launch.output(0).shape();
  PoolGeometry g;
  static_cast<detail::PoolWindow&>(g) = detail::pool_window(desc.attrs, desc.op);
  g.planes = x[0] * x[1];
  g.height = x[2];
  g.width = x[3];
  g.out_h = y[2];
  g.out_w = y[3];
  return g;
}

// Planes per chunk of a pooling loop: ~16K window reads each (small pools run on one thread, Note [CPU worker
// threads] in cpu_threads.cpp).
std::int64_t plane_grain(const PoolGeometry& g) {
  return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(g.out_h * g.out_w * g.kernel[0] * g.kernel[1], 1));
}

// The geometry of every plane of a pooling launch (input, out, row and sums are set per plane or task).
template <typename T>
PoolPlane<T> plane_shape(const PoolGeometry& g) {
  PoolPlane<T> shape;
  shape.height = g.height;
  shape.width = g.width;
  shape.out_h = g.out_h;
  shape.out_w = g.out_w;
  shape.kernel_h = g.kernel[0];
  shape.kernel_w = g.kernel[1];
  shape.stride_h = g.stride[0];
  shape.stride_w = g.stride[1];
  shape.dilation_h = g.dilation[0];
  shape.dilation_w = g.dilation[1];
  shape.pad_top = g.pad_begin[0];
  shape.pad_left = g.pad_begin[1];
  shape.pad_bottom = g.pad_end[0];
  shape.pad_right = g.pad_end[1];
  return shape;
}

// Note [Average pooling of small planes across channels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Pooling by rows (Note [Average pooling by rows]) pays a few short loops per output row, so on small planes the
// loops' setup is the work: the tiny suite's average pools of [3, 64, 16, 16] took 2.6-3.2x ONNX Runtime's time on
// this machine (benchmarks/cpu_pool_bench.py, 2026-12-06, one thread). A float plane of at most kBlockPoolPixels
// pixels is averaged kPoolBlock planes at once instead (IsaKernels::avg_pool_block_f32, compiled per instruction set),
// as Note [Depthwise convolution of small planes across channels] does for convolutions: the planes transposed to
// [pixel][plane], each output's taps summed over a vector of planes in double as by rows (the same values in the
// order the window is read: exact in double for the windows models use, as Note [Average pooling by rows] says), the
// same divisor, transposed back: 1.7x ONNX Runtime's time there. One task per block of planes. Max pooling the same
// way measured no faster than by rows, and stays there.
constexpr std::int64_t kBlockPoolPixels = 1024;

// Planes the block kernel takes: small, several, and no dilation (avg_pool_block_f32 reads contiguous taps).
bool pools_across_channels(const PoolGeometry& g) {
  return g.height * g.width <= kBlockPoolPixels && g.planes >= 2 && g.dilation[0] == 1 && g.dilation[1] == 1;
}

void pool_blocks(const float* in, float* out, const CpuContext& context, const PoolGeometry& g,
                 const PoolPlane<float>& shape, void (*block_kernel)(const PoolBlock&)) {
  const std::int64_t blocks = (g.planes + kPoolBlock - 1) / kPoolBlock;
  const std::int64_t grain = std::max<std::int64_t>(1, plane_grain(g) / kPoolBlock);
  parallel_for(blocks, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<float> scratch(static_cast<std::size_t>(pool_block_scratch(shape)));
    PoolBlock b;
    b.shape = shape;
    b.scratch = scratch.data();
    for (std::int64_t block = begin; block < end; ++block) {
      const std::int64_t p0 = block * kPoolBlock;
      b.planes = std::min(kPoolBlock, g.planes - p0);
      b.x = in + p0 * g.height * g.width;
      b.y = out + p0 * g.out_h * g.out_w;
      block_kernel(b);
    }
  });
}

// Runs an instruction set's plane kernel (`f32` or `f64`, by T) on every (n, c) plane of the launch, with `shape`'s
// geometry and per task a scratch row of shape.row_length T and `sums` doubles; with a `block` kernel (null: none),
// float planes of at most kBlockPoolPixels pixels kPoolBlock at a time instead (Note [Average pooling of small planes
// across channels]).
template <typename T>
void pool_planes(const KernelLaunch& launch, const CpuContext& context, const PoolGeometry& g,
                 const PoolPlane<T>& shape, void (*f32)(const PoolPlane<float>&), void (*f64)(const PoolPlane<double>&),
                 std::int64_t sums, void (*block)(const PoolBlock&)) {
  InputBuffer<T> x(launch.input(0));
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  T* out = y.data();
  if (g.out_h <= 0 || g.out_w <= 0) {
    y.commit();
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (block != nullptr && pools_across_channels(g)) {
      pool_blocks(in, out, context, g, shape, block);
      y.commit();
      return;
    }
  }
  void (*kernel)(const PoolPlane<T>&) = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    kernel = f32;
  } else {
    kernel = f64;
  }
  parallel_for(g.planes, context.threads, plane_grain(g), [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<T> row(static_cast<std::size_t>(shape.row_length));
    ScratchVector<double> column_sums(static_cast<std::size_t>(sums));
    PoolPlane<T> plane = shape;
    plane.row = row.data();
    plane.sums = column_sums.data();
    for (std::int64_t p = begin; p < end; ++p) {
      plane.input = in + p * g.height * g.width;
      plane.out = out + p * g.out_h * g.out_w;
      kernel(plane);
    }
  });
  y.commit();
}

// Note [Max pooling by rows]
// The max over a kh x kw window is the max along its kw columns of the max down its kh rows, so each output row takes
// the column-wise max of its window's input rows (kh vectorised passes over whole input rows; rows outside the input
// skipped), written into the middle of a scratch row whose ends are -inf (the left and right padding), and then the max
// along that row over each output's kw columns, with no bounds tests (strides 1 and 2 known to the compiler, so that
// those loops vectorise). That is kh * width + kw * out_w comparisons per output row instead of kh * kw per output, and
// no padded copy of the plane: a window loop over a phase-split copy (Note [Phase-split planes] in cpu_conv.cpp) took
// 4x ONNX Runtime's time on ResNet's 3x3 stride-2 pools (2026-12-03, this machine: 534 against 126 us for [1, 64, 112,
// 112]). Padding never wins; a window whose rows are all outside the input (dilations) gives -inf; a NaN anywhere in a
// window makes its output NaN.
template <typename T>
void run_max_pool(const KernelLaunch& launch, const CpuContext& context) {
  const PoolGeometry g = pool_geometry(launch);
  PoolPlane<T> shape = plane_shape<T>(g);
  const std::int64_t reach = (g.out_w - 1) * g.stride[1] + (g.kernel[1] - 1) * g.dilation[1] + 1;
  shape.row_length = std::max(g.pad_begin[1] + g.width, reach);
  pool_planes(launch, context, g, shape, context.isa->max_pool_plane_f32, context.isa->max_pool_plane_f64, 0, nullptr);
}

// Note [Average pooling by rows]
// Per output row, the column sums of its window's input rows (in double, a pass the compiler vectorises), then each
// output's sum over its columns of them (a vectorised loop for the outputs whose windows lie inside the input's
// columns, strides 1 and 2 known to the compiler), divided by Note [Pooling windows]' divisor. The sums add the same
// values as a window loop, columns first instead of rows first, in double (exact for the window sizes models use
// unless their values' magnitudes span more than 2^29), rounded once to T. A window loop per output took 9x ONNX
// Runtime's time on [1, 64, 112, 112] (2026-12-03, this machine: 1152 against 128 us, 3x3 stride 2).
template <typename T>
void run_avg_pool(const KernelLaunch& launch, const CpuContext& context) {
  const PoolGeometry g = pool_geometry(launch);
  PoolPlane<T> shape = plane_shape<T>(g);
  shape.count_include_pad = launch.desc->attrs.get_int("count_include_pad", 0) != 0;
  pool_planes(launch, context, g, shape, context.isa->avg_pool_plane_f32, context.isa->avg_pool_plane_f64,
              g.width + g.out_w, context.isa->avg_pool_block_f32);
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
