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

namespace {

// softmax (log_output: log_softmax) along any axis: a last-axis softmax of few long rows splits them (Note [Split
// softmax] in softmax.cu: the plan's geometry and workspace), any other the row or column kernels.
std::unique_ptr<KernelPlan> softmax_plan(const OpDescriptor& desc, const ExecutionPolicy& policy, bool log_output) {
  const std::vector<std::int64_t>& shape = desc.inputs[0].shape;
  const auto axis = static_cast<std::size_t>(normalized_axis(desc.attrs.get_int("axis", -1), desc.inputs[0].dim()));
  const std::int64_t outer = product(shape, 0, axis);
  const std::int64_t inner = product(shape, axis + 1, shape.size());
  const std::string op = log_output ? "log_softmax" : "softmax";
  if (inner == 1) {
    const cuda_raw::RowSplit g = cuda_raw::row_split_geometry(outer, shape[axis], policy.workspace_limit);
    if (g.splits > 1) {
      return std::make_unique<SplitPlan>(g.workspace_bytes(), "cuda_raw " + op + ": " + g.str(),
                                         [g, log_output](const KernelLaunch& launch) {
                                           const Tensor& x = launch.input(0);
                                           cuda_raw::softmax_split(x.data_ptr(), launch.output(0).data_ptr(),
                                                                   x.dtype(), g, log_output, launch.workspace,
                                                                   launch.stream.handle);
                                         });
    }
  }
  const std::int64_t size = shape[axis];
  return std::make_unique<SplitPlan>(0, "cuda_raw " + op, [outer, size, inner, log_output](const KernelLaunch& launch) {
    const Tensor& x = launch.input(0);
    (log_output ? cuda_raw::log_softmax : cuda_raw::softmax)(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(),
                                                             outer, size, inner, launch.stream.handle);
  });
}

}  // namespace

// softmax along any axis.
void register_softmax(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<SplitKernel>(
      "softmax",
      "softmax along any axis: last-axis rows of up to 16384 halves / 8192 floats read once into registers (a group "
      "of 1-512 threads per row, Note [Register-cached softmax]), longer rows an online max/sum, few long rows split "
      "over many blocks (Note [Split softmax]), a thread per column for inner axes; fp32 math",
      nullptr,
      [](const OpDescriptor& desc, const ExecutionPolicy& policy) { return softmax_plan(desc, policy, false); },
      DTypes::kFloat));
}

namespace {

// Input i's data, or null where it is absent.
const void* data_or_null(const KernelLaunch& launch, std::size_t i) {
  if (launch.num_inputs <= i) return nullptr;
  const Tensor& t = launch.input(i);
  return t.defined() ? t.data_ptr() : nullptr;
}

// layer_norm by the row kernels, with the quantized output where there is one.
void run_layer_norm(const KernelLaunch& launch) {
  const Tensor& x = launch.input(0);
  const auto axis = static_cast<std::size_t>(normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
  const auto epsilon = static_cast<float>(launch.desc->attrs.get_float("epsilon", 1e-5));
  LayerNormQuantized quantized;  // Note [Quantized layer norm output]
  if (launch.num_outputs > 1 && launch.output(1).defined()) {
    const Tensor& yq = launch.output(1);
    const fused::OutputQuantization q = fused::output_quantization(launch.desc->attrs, yq.dtype());
    quantized = {yq.data_ptr(), yq.dtype(), q.scale, static_cast<float>(q.zero_point)};
  }
  cuda_raw::layer_norm(x.data_ptr(), data_or_null(launch, 3), data_or_null(launch, 1), data_or_null(launch, 2),
                       data_or_null(launch, 4), launch.output(0).data_ptr(), x.dtype(), product(x.shape(), 0, axis),
                       product(x.shape(), axis, x.shape().size()), epsilon, launch.stream.handle, quantized);
}

// Few long rows without a quantized output split (Note [Split layer norm] in layer_norm.cu: the plan's geometry and
// workspace); any other layer_norm takes the row kernels.
std::unique_ptr<KernelPlan> layer_norm_plan(const OpDescriptor& desc, const ExecutionPolicy& policy) {
  const std::vector<std::int64_t>& shape = desc.inputs[0].shape;
  const auto axis = static_cast<std::size_t>(normalized_axis(desc.attrs.get_int("axis", -1), desc.inputs[0].dim()));
  if (!desc.attrs.has("quantized_dtype")) {
    const cuda_raw::RowSplit g = cuda_raw::row_split_geometry(
        product(shape, 0, axis), product(shape, axis, shape.size()), policy.workspace_limit);
    if (g.splits > 1) {
      const auto epsilon = static_cast<float>(desc.attrs.get_float("epsilon", 1e-5));
      return std::make_unique<SplitPlan>(
          g.workspace_bytes(), "cuda_raw layer_norm: " + g.str(), [g, epsilon](const KernelLaunch& launch) {
            const Tensor& x = launch.input(0);
            cuda_raw::layer_norm_split(x.data_ptr(), data_or_null(launch, 3), data_or_null(launch, 1),
                                       data_or_null(launch, 2), data_or_null(launch, 4), launch.output(0).data_ptr(),
                                       x.dtype(), g, epsilon, launch.workspace, launch.stream.handle);
          });
    }
  }
  return std::make_unique<SplitPlan>(0, "cuda_raw layer_norm", run_layer_norm);
}

}  // namespace

// layer_norm, with an optional residual and addend.
void register_layer_norm(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<SplitKernel>(
      "layer_norm",
      "layer norm over dims axis..end: rows of aligned 16-byte vectors cached in registers (a warp or a 128/512-thread "
      "block per row, one read of the row), other rows a warp (<= 1024 elements) or a block per row, few long rows "
      "split over many blocks (Note [Split layer norm]); two-pass mean/variance in fp32; an optional residual is "
      "added on the fly and an optional addend to the output; an optional per-tensor quantized copy of the output "
      "written from registers",
      [](const OpDescriptor& desc) {
        // Note [Per-row affine of a layer norm]: the cpu kernel's only (op_decomposition gives it to CPU plans).
        return desc.attrs.get_int("row_affine", 0) != 0 ? Support::no("cuda_raw layer_norm takes no row_affine")
                                                        : Support::yes();
      },
      layer_norm_plan, DTypes::kFloat,
      std::vector<std::string>{"x", "scale", "bias", "residual", "addend"}));
}

// log_softmax along any axis.
void register_log_softmax(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<SplitKernel>(
      "log_softmax", "x - max - log(sum(exp(x - max))) along any axis, the softmax kernels' layout",
      nullptr,
      [](const OpDescriptor& desc, const ExecutionPolicy& policy) { return softmax_plan(desc, policy, true); },
      DTypes::kFloat));
}

}  // namespace xpuruntime::cuda_raw
