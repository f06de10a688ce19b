// The cuda_raw row kernels and their registration: softmax and log_softmax (softmax.cu) and layer_norm
// (layer_norm.cu).
#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/cuda_utils.h"
#include "core/data_ops.h"
#include "core/fused_elementwise.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"

namespace xpuruntime::cuda_raw {

// softmax along any axis.
void register_softmax(KernelRegistry& registry) {
  add_kernel(registry, "softmax", "softmax along any axis: last-axis rows of up to 16384 halves / 8192 floats read "
             "once into registers (a group of 1-512 threads per row, Note [Register-cached softmax]), longer rows "
             "an online max/sum, a thread per column for inner axes; fp32 math", {"x"}, nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const auto& shape = x.shape();
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               cuda_raw::softmax(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), product(shape, 0, axis),
                                 shape[axis], product(shape, axis + 1, shape.size()), launch.stream.handle);
             });
}

// layer_norm, with an optional residual.
void register_layer_norm(KernelRegistry& registry) {
  add_kernel(registry, "layer_norm", "layer norm over dims axis..end: rows of aligned 16-byte vectors cached in "
             "registers (a warp or a 128/512-thread block per row, one read of the row), other rows a warp (<= 1024 "
             "elements) or a block per row; two-pass mean/variance in fp32; an optional residual is added on the fly "
             "and an optional addend to the output; an optional per-tensor quantized copy of the output written from "
             "registers",
             {"x", "scale", "bias", "residual", "addend"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const Tensor residual = launch.num_inputs > 3 ? launch.input(3) : Tensor();
               const Tensor addend = launch.num_inputs > 4 ? launch.input(4) : Tensor();
               const Tensor& scale = launch.input(1);
               const Tensor& bias = launch.input(2);
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               const auto epsilon = static_cast<float>(launch.desc->attrs.get_float("epsilon", 1e-5));
               LayerNormQuantized quantized;  // Note [Quantized layer norm output]
               if (launch.num_outputs > 1 && launch.output(1).defined()) {
                 const Tensor& yq = launch.output(1);
                 const fused::OutputQuantization q = fused::output_quantization(launch.desc->attrs, yq.dtype());
                 quantized = {yq.data_ptr(), yq.dtype(), q.scale, static_cast<float>(q.zero_point)};
               }
               cuda_raw::layer_norm(x.data_ptr(), residual.defined() ? residual.data_ptr() : nullptr,
                                    scale.defined() ? scale.data_ptr() : nullptr,
                                    bias.defined() ? bias.data_ptr() : nullptr,
                                    addend.defined() ? addend.data_ptr() : nullptr, launch.output(0).data_ptr(),
                                    x.dtype(),
                                    product(x.shape(), 0, axis), product(x.shape(), axis, x.shape().size()), epsilon,
                                    launch.stream.handle, quantized);
             });
}

// log_softmax along any axis.
void register_log_softmax(KernelRegistry& registry) {
  add_kernel(registry, "log_softmax", "x - max - log(sum(exp(x - max))) along any axis, the softmax kernels' layout",
             {"x"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               cuda_raw::log_softmax(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), product(x.shape(), 0, axis),
                                     x.shape()[axis], inner_of(x.shape(), axis), launch.stream.handle);
             });
}

}  // namespace xpuruntime::cuda_raw
