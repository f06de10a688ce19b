// conv2d of the cpu backend: im2col + GEMM per (image, group), then bias, residual and ReLU in one pass.
//
// For image n and group g, with Cg = C / groups input and Og = O / groups output channels:
//   col[(c * kh + i) * kw + j, oh * OW + ow] = x[n, g * Cg + c, oh * sh - pad_top + i * dh,
//                                                ow * sw - pad_left + j * dw]   (0 outside the input)
//   y[n, g * Og + o, :] = W[g * Og + o, :] (Cg * kh * kw) @ col
// A 1x1 kernel with unit strides and no padding reads x directly (col would be a copy of it).
#include <string>
#include <vector>

#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {

namespace {

template <typename T>
void run_conv2d(const KernelLaunch& launch, const CpuContext& context) {
  const OpDescriptor& desc = *launch.desc;
  const Tensor& x_tensor = launch.input(0);
  const Tensor& w_tensor = launch.input(1);
  Tensor& y_tensor = launch.output(0);
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  const std::int64_t groups = desc.attrs.get_int("groups", 1);
  const Activation activation = activation_from_name(desc.attrs.get_string("activation", "none"));

  const std::int64_t batch = x_tensor.shape()[0], channels = x_tensor.shape()[1];
  const std::int64_t height = x_tensor.shape()[2], width = x_tensor.shape()[3];
  const std::int64_t out_channels = w_tensor.shape()[0];
  const std::int64_t kh = w_tensor.shape()[2], kw = w_tensor.shape()[3];
  const std::int64_t out_h = y_tensor.shape()[2], out_w = y_tensor.shape()[3];
  const std::int64_t cg = channels / groups, og = out_channels / groups;
  const std::int64_t depth = cg * kh * kw;    // GEMM K
  const std::int64_t pixels = out_h * out_w;  // GEMM N

  InputBuffer<T> x(x_tensor);
  InputBuffer<T> w(w_tensor);
  InputBuffer<T> bias(launch.num_inputs > 2 ? launch.input(2) : Tensor());
  InputBuffer<T> residual(launch.num_inputs > 3 ? launch.input(3) : Tensor());
  OutputBuffer<T> y(y_tensor);

  const bool direct = kh == 1 && kw == 1 && strides[0] == 1 && strides[1] == 1 && pads[0] == 0 && pads[1] == 0 &&
                      pads[2] == 0 && pads[3] == 0;
  ScratchVector<T> col(direct ? 0 : static_cast<std::size_t>(depth * pixels));
  for (std::int64_t n = 0; n < batch; ++n) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const T* image = x.data() + (n * channels + g * cg) * height * width;
      const T* columns = image;
      if (!direct) {
        parallel_for(depth, context.threads, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(pixels, 1)),
                     [&](std::int64_t begin, std::int64_t end) {
                       for (std::int64_t row = begin; row < end; ++row) {
                         const std::int64_t c = row / (kh * kw);
                         const std::int64_t i = (row / kw) % kh;
                         const std::int64_t j = row % kw;
                         const T* plane = image + c * height * width;
                         T* out = col.data() + row * pixels;
                         for (std::int64_t oh = 0; oh < out_h; ++oh) {
                           const std::int64_t ih = oh * strides[0] - pads[0] + i * dilations[0];
                           T* out_row = out + oh * out_w;
                           if (ih < 0 || ih >= height) {
                             std::fill(out_row, out_row + out_w, T(0));
                             continue;
                           }
                           const T* in_row = plane + ih * width;
                           for (std::int64_t ow = 0; ow < out_w; ++ow) {
                             const std::int64_t iw = ow * strides[1] - pads[1] + j * dilations[1];
                             out_row[ow] = iw >= 0 && iw < width ? in_row[iw] : T(0);
                           }
                         }
                       }
                     });
        columns = col.data();
      }
      gemm<T>(context, false, og, pixels, depth, w.data() + g * og * depth, depth, columns, pixels,
              y.data() + (n * out_channels + g * og) * pixels, pixels);
    }
  }

  if (bias.data() != nullptr || residual.data() != nullptr || activation != Activation::kNone) {
    T* out = y.data();
    const T* b = bias.data();
    const T* r = residual.data();
    parallel_for(batch * out_channels, context.threads,
                 std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(pixels, 1)),
                 [&](std::int64_t begin, std::int64_t end) {
                   for (std::int64_t plane = begin; plane < end; ++plane) {
                     const T bias_value = b != nullptr ? b[plane % out_channels] : T(0);
                     T* row = out + plane * pixels;
                     const T* res = r != nullptr ? r + plane * pixels : nullptr;
                     for (std::int64_t p = 0; p < pixels; ++p) {
                       T value = row[p] + bias_value;
                       if (res != nullptr) value += res[p];
                       row[p] = apply_activation(activation, value);
                     }
                   }
                 });
  }
  y.commit();
}

}  // namespace

void register_conv_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "conv2d",
                 "reference conv2d: im2col + GEMM per image and group, bias/residual/ReLU epilogue (NHWC "
                 "through NCHW copies)",
                 nhwc_through_nchw([](const KernelLaunch& launch, const CpuContext& context) {
                   dispatch_compute_type(launch.desc->inputs[0].dtype,
                                         [&](auto zero) { run_conv2d<decltype(zero)>(launch, context); });
                 }));
}

}  // namespace xpuruntime::cpu
