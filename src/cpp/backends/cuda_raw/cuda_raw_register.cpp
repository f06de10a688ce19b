// Registration of the cuda_raw backend: xpuruntime's own CUDA kernels for the elementwise, activation, cast,
// softmax, layer_norm and reduce ops (kernel name "cuda_raw"), and flash attention ("flash_v2",
// flash_attention.cu). Every kernel computes in fp32 (Note [fp32 compute] in cuda_raw_common.cuh), uses no
// atomics (deterministic), and needs contiguous inputs (the functional API makes them so).
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/flash_attention.h"
#include "core/cuda_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

using cuda_raw::BinaryOp;
using cuda_raw::ReduceOp;
using cuda_raw::UnaryOp;

// The oldest architecture the kernels were compiled for (CMAKE_CUDA_ARCHITECTURES), 0 when unknown.
constexpr int kMinArch = XPURT_CUDA_RAW_MIN_ARCH;

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? ", " : "") + std::to_string(shape[k]);
  return out + "]";
}

bool is_kernel_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// What every cuda_raw kernel needs: a CUDA device it was built for, no int8 precision, and float32/float16/
// bfloat16 contiguous inputs (float64 too where `allow_float64`, i.e. for cast). `names`: the schema's input
// names, for the messages.
Support check_common(const OpDescriptor& desc, const ExecutionPolicy& policy, const std::vector<std::string>& names,
                     bool allow_float64 = false) {
  if (!desc.device.is_cuda()) {
    return Support::no(detail::str_cat("runs on CUDA devices; the input is on ", desc.device.str()));
  }
  if (policy.precision == Precision::kInt8) {
    return Support::no("cuda_raw has no int8 kernels; use precision fp32, tf32, fp16 or bf16");
  }
  if (kMinArch > 0 && desc.compute_capability > 0 && desc.compute_capability < kMinArch) {
    return Support::no(detail::str_cat("cuda_raw kernels were built for sm_", kMinArch,
                                       " and newer, this device is sm_", desc.compute_capability,
                                       "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=", desc.compute_capability));
  }
  for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
    const TensorDesc& input = desc.inputs[k];
    if (!input.present) continue;
    const std::string& name = k < names.size() ? names[k] : std::string("input");
    if (!input.device.is_cuda()) {
      return Support::no(detail::str_cat("runs on CUDA devices; input '", name, "' is on ", input.device.str()));
    }
    if (!is_kernel_float(input.dtype) && !(allow_float64 && input.dtype == DType::kFloat64)) {
      return Support::no(detail::str_cat("cuda_raw supports float32, float16 and bfloat16",
                                         allow_float64 ? " (and float64 for cast)" : "", ", got ",
                                         dtype_name(input.dtype), " for input '", name,
                                         "'; cast it or use the cpu kernel"));
    }
    if (input.numel() != 0 && !input.is_contiguous()) {  // an empty tensor has no layout to speak of
      return Support::no(detail::str_cat("needs contiguous input '", name, "' (shape ", shape_str(input.shape),
                                         ", strides ", shape_str(input.strides), "); call contiguous() first"));
    }
  }
  return Support::yes();
}

std::int64_t normalized_axis(std::int64_t axis, int rank) { return axis < 0 ? axis + rank : axis; }

std::int64_t product(const std::vector<std::int64_t>& shape, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t k = begin; k < end; ++k) n *= shape[k];
  return n;
}

// ---- FunctionKernel registration ----

using Extra = std::function<Support(const OpDescriptor&)>;

// Adds the "cuda_raw" kernel of `op`: the common checks, then `extra` (null: none), then `run` on the launch's
// device and stream. `supports` never throws: a malformed attribute becomes the reason.
void add_kernel(KernelRegistry& registry, const std::string& op, const std::string& summary,
                std::vector<std::string> names, Extra extra, FunctionKernel::RunFn run, bool allow_float64 = false) {
  auto supports = [names = std::move(names), extra = std::move(extra), allow_float64](
                      const OpDescriptor& desc, const ExecutionPolicy& policy) -> Support {
    try {
      Support common = check_common(desc, policy, names, allow_float64);
      if (!common) return common;
      return extra ? extra(desc) : Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  };
  auto guarded_run = [run = std::move(run)](const KernelLaunch& launch) {
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    run(launch);
  };
  registry.add_kernel(std::make_unique<FunctionKernel>(
      KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true, summary}, std::move(supports),
      std::move(guarded_run)));
}

void add_unary(KernelRegistry& registry, const std::string& op, UnaryOp kind, const std::string& what) {
  add_kernel(registry, op, what + ", 16-byte vectorized grid-stride kernel, fp32 compute", {"x"}, nullptr,
             [kind](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               cuda_raw::unary(kind, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(),
                               launch.stream.handle);
             });
}

void add_binary(KernelRegistry& registry, const std::string& op, BinaryOp kind) {
  add_kernel(
      registry, op,
      op + "(a, b) with NumPy broadcasting (stride tables, up to 8 merged dims); vectorized for equal shapes",
      {"a", "b"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        cuda_raw::BroadcastGeometry geometry;
        std::string why_not;
        if (!cuda_raw::broadcast_geometry(desc.inputs[0].shape, desc.inputs[1].shape, desc.outputs[0].shape,
                                          &geometry, &why_not)) {
          return Support::no(why_not);
        }
        return Support::yes();
      },
      [kind](const KernelLaunch& launch) {
        const Tensor& a = launch.input(0);
        const Tensor& b = launch.input(1);
        Tensor& y = launch.output(0);
        cuda_raw::BroadcastGeometry geometry;
        std::string why_not;
        if (!cuda_raw::broadcast_geometry(a.shape(), b.shape(), y.shape(), &geometry, &why_not)) {
          throw UnsupportedOperationError(why_not);
        }
        cuda_raw::binary(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry, launch.stream.handle);
      });
}

// ---- reductions: a Kernel with a plan (the geometry and its workspace) ----

std::vector<bool> reduced_flags(const OpDescriptor& desc) {
  const int rank = desc.inputs[0].dim();
  const auto axes = desc.attrs.get_ints("axes", {});
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (const std::int64_t axis : axes) {
    const std::int64_t a = normalized_axis(axis, rank);
    XPURT_CHECK(a >= 0 && a < rank, "op '", desc.op, "': axis ", axis, " is out of range for rank ", rank);
    reduced[static_cast<std::size_t>(a)] = true;
  }
  return reduced;
}

class ReducePlan final : public KernelPlan {
 public:
  ReducePlan(std::string op, ReduceOp kind, cuda_raw::ReduceGeometry geometry)
      : op_(std::move(op)), kind_(kind), geometry_(std::move(geometry)) {}

  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= geometry_.workspace_bytes(), "cuda_raw ", op_, ": the plan needs ",
                geometry_.workspace_bytes(), " bytes of workspace (workspace_bytes()), the launch gives ",
                launch.workspace_bytes);
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    const Tensor& x = launch.input(0);
    cuda_raw::reduce(kind_, geometry_, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), launch.workspace,
                     launch.stream.handle);
  }
  std::size_t workspace_bytes() const override { return geometry_.workspace_bytes(); }
  std::string describe() const override { return "cuda_raw " + op_ + ": " + geometry_.str(); }

 private:
  std::string op_;
  ReduceOp kind_;
  cuda_raw::ReduceGeometry geometry_;
};

class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(const std::string& op, ReduceOp kind)
      : Kernel(KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true,
                          op + " over any axes: a warp/block per row or a thread per column, split into two "
                               "deterministic passes when outputs are few; fp32 accumulation"}),
        kind_(kind) {}

  Support supports(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    try {
      Support common = check_common(desc, policy, {"x"});
      if (!common) return common;
      cuda_raw::ReduceGeometry geometry;
      std::string why_not;
      if (!cuda_raw::reduce_geometry(desc.inputs[0].shape, reduced_flags(desc), policy.workspace_limit, &geometry,
                                     &why_not)) {
        return Support::no(why_not);
      }
      return Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  }

  // The geometry follows from the descriptor and the workspace limit alone, so nothing is recorded; a record is
  // accepted and ignored, as FunctionKernel does.
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string&) const override {
    cuda_raw::ReduceGeometry geometry;
    std::string why_not;
    if (!cuda_raw::reduce_geometry(desc.inputs[0].shape, reduced_flags(desc), policy.workspace_limit, &geometry,
                                   &why_not)) {
      throw UnsupportedOperationError(why_not);
    }
    return std::make_unique<ReducePlan>(desc.op, kind_, std::move(geometry));
  }

 private:
  ReduceOp kind_;
};

}  // namespace

void register_cuda_raw(KernelRegistry& registry) {
  // ---- elementwise (math) ----
  add_unary(registry, "exp", UnaryOp::kExp, "exp(x)");
  add_unary(registry, "log", UnaryOp::kLog, "log(x)");
  add_unary(registry, "sqrt", UnaryOp::kSqrt, "sqrt(x)");
  add_unary(registry, "neg", UnaryOp::kNeg, "-x");
  add_unary(registry, "abs", UnaryOp::kAbs, "|x|");
  add_unary(registry, "erf", UnaryOp::kErf, "erf(x)");
  add_unary(registry, "reciprocal", UnaryOp::kReciprocal, "1 / x");
  // ---- activations ----
  add_unary(registry, "relu", UnaryOp::kRelu, "max(x, 0) (NaN stays NaN)");
  add_unary(registry, "sigmoid", UnaryOp::kSigmoid, "1 / (1 + exp(-x))");
  add_unary(registry, "tanh", UnaryOp::kTanh, "tanh(x)");
  add_unary(registry, "silu", UnaryOp::kSilu, "x * sigmoid(x)");
  add_kernel(registry, "gelu", "GELU (erf form, or the tanh approximation with approximate='tanh'), 16-byte "
             "vectorized grid-stride kernel, fp32 compute", {"x"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const bool tanh_form = launch.desc->attrs.get_string("approximate", "none") == "tanh";
               cuda_raw::unary(tanh_form ? UnaryOp::kGeluTanh : UnaryOp::kGelu, x.data_ptr(),
                               launch.output(0).data_ptr(), x.dtype(), x.numel(), launch.stream.handle);
             });
  // ---- binary ----
  add_binary(registry, "add", BinaryOp::kAdd);
  add_binary(registry, "sub", BinaryOp::kSub);
  add_binary(registry, "mul", BinaryOp::kMul);
  add_binary(registry, "div", BinaryOp::kDiv);
  add_binary(registry, "pow", BinaryOp::kPow);
  add_binary(registry, "maximum", BinaryOp::kMaximum);
  add_binary(registry, "minimum", BinaryOp::kMinimum);
  // ---- cast ----
  add_kernel(
      registry, "cast", "conversion between float32, float16, bfloat16 and float64 (round to nearest even)", {"x"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        const DType to = desc.outputs[0].dtype;
        if (!is_kernel_float(to) && to != DType::kFloat64) {
          return Support::no(detail::str_cat("cuda_raw casts to float32, float16, bfloat16 or float64, got ",
                                             dtype_name(to)));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        Tensor& y = launch.output(0);
        cuda_raw::cast(x.data_ptr(), x.dtype(), y.data_ptr(), y.dtype(), x.numel(), launch.stream.handle);
      },
      /*allow_float64=*/true);
  // ---- softmax ----
  add_kernel(registry, "softmax", "softmax along any axis: a warp (<= 1024 columns) or a block per row for the "
             "last axis, a thread per column for inner axes; online max/sum in fp32", {"x"}, nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const auto& shape = x.shape();
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               cuda_raw::softmax(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), product(shape, 0, axis),
                                 shape[axis], product(shape, axis + 1, shape.size()), launch.stream.handle);
             });
  // ---- layer_norm ----
  add_kernel(registry, "layer_norm", "layer norm over dims axis..end: a warp (<= 1024 elements) or a block per "
             "row, two-pass mean/variance in fp32", {"x", "scale", "bias"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const Tensor& scale = launch.input(1);
               const Tensor& bias = launch.input(2);
               const auto axis = static_cast<std::size_t>(
                   normalized_axis(launch.desc->attrs.get_int("axis", -1), x.dim()));
               const auto epsilon = static_cast<float>(launch.desc->attrs.get_float("epsilon", 1e-5));
               cuda_raw::layer_norm(x.data_ptr(), scale.defined() ? scale.data_ptr() : nullptr,
                                    bias.defined() ? bias.data_ptr() : nullptr, launch.output(0).data_ptr(), x.dtype(),
                                    product(x.shape(), 0, axis), product(x.shape(), axis, x.shape().size()), epsilon,
                                    launch.stream.handle);
             });
  // ---- reductions ----
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_sum", ReduceOp::kSum));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_mean", ReduceOp::kMean));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_max", ReduceOp::kMax));
  registry.add_kernel(std::make_unique<ReduceKernel>("reduce_min", ReduceOp::kMin));
  // ---- attention: flash_v2 (flash_attention.cu) ----
  register_flash_attention(registry);
}

}  // namespace xpuruntime
