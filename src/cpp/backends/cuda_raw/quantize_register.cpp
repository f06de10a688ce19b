// The cuda_raw kernels of quantize_linear, dequantize_linear and dynamic_quantize_linear (quantize.cu; Note [Quantize
// registry ops] in core/quantize_ops.h) and their registration. Declared like every cuda_raw kernel
// (cuda_raw::declaration), with the quantized dtypes, which no other cuda_raw kernel takes, listed per input.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda_raw/cuda_raw_register.h"
#include "backends/cuda_raw/quantize.h"
#include "core/cuda_utils.h"
#include "core/quantize_ops.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::cuda_raw {

namespace {

using WorkspaceFn = std::function<std::size_t(const OpDescriptor&)>;

// A plan that runs `run` on the launch's device with `bytes` of workspace.
class QuantizePlan final : public KernelPlan {
 public:
  QuantizePlan(std::string op, std::size_t bytes, const FunctionKernel::RunFn* run)
      : op_(std::move(op)), bytes_(bytes), run_(run) {}
  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= bytes_, "cuda_raw ", op_, ": the plan needs ", bytes_,
                " bytes of workspace (workspace_bytes()), the launch gives ", launch.workspace_bytes);
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    (*run_)(launch);
  }
  std::size_t workspace_bytes() const override { return bytes_; }

 private:
  std::string op_;
  std::size_t bytes_;
  const FunctionKernel::RunFn* run_;  // owned by the kernel, which the registry keeps for the life of the process
};

// The schema validates everything these kernels depend on, so the declaration is the whole of what they take.
class QuantizeKernel final : public Kernel {
 public:
  QuantizeKernel(const std::string& op, const std::string& summary, KernelDecl decl, WorkspaceFn workspace,
                 FunctionKernel::RunFn run)
      : Kernel(KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true, summary, std::move(decl)}),
        workspace_(std::move(workspace)),
        run_(std::move(run)) {}

  Support accepts(const OpDescriptor&, const ExecutionPolicy&) const override { return Support::yes(); }
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string&) const override {
    return std::make_unique<QuantizePlan>(desc.op, workspace_ ? workspace_(desc) : 0, &run_);
  }

 private:
  WorkspaceFn workspace_;
  FunctionKernel::RunFn run_;
};

DTypeSet real_dtypes() {
  return {{DType::kFloat32, DType::kFloat16, DType::kBFloat16}, "float32, float16 or bfloat16"};
}

DTypeSet quantized_dtypes(bool with_int32) {
  DTypeSet set{{DType::kInt8, DType::kUInt8, DType::kInt4, DType::kUInt4, DType::kFloat8E4M3FN,
                DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2, DType::kFloat8E5M2FNUZ},
               "int8, uint8, int4, uint4 or a float8"};
  if (with_int32) {
    set.dtypes.push_back(DType::kInt32);
    set.text = "int8, uint8, int32, int4, uint4 or a float8";
  }
  return set;
}

// cuda_raw::declaration with the dtypes of each input (x, scale, zero_point) instead of one set for all.
KernelDecl declaration_with(const std::string& op, std::vector<std::string> names, std::vector<DTypeSet> inputs) {
  KernelDecl decl = declaration(op, std::move(names), DTypes::kAll);
  decl.dtypes = {};  // any: input_dtypes says what each input takes
  decl.input_dtypes = std::move(inputs);
  return decl;
}

QuantizeArgs args_of(const KernelLaunch& launch) {
  const Tensor& x = launch.input(0);
  const Tensor& scale = launch.input(1);
  const bool has_zero_point = launch.num_inputs > 2 && launch.input(2).defined();
  Tensor& y = launch.output(0);
  QuantizeArgs args;
  args.x = x.data_ptr();
  args.x_dtype = x.dtype();
  args.scale = scale.data_ptr();
  args.scale_dtype = scale.dtype();
  args.zero_point = has_zero_point ? launch.input(2).data_ptr() : nullptr;
  args.y = y.data_ptr();
  args.y_dtype = y.dtype();
  args.n = x.numel();
  args.layout = quantize_ops::param_layout(x.shape(), scale.shape(), launch.desc->attrs.get_int("axis", 1));
  args.saturate = launch.desc->attrs.get_int("saturate", 1) != 0;
  return args;
}

}  // namespace

// quantize_linear, dequantize_linear, dynamic_quantize_linear.
void register_quantize(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<QuantizeKernel>(
      "quantize_linear",
      "x / scale rounded half to even and saturated, per tensor or per axis; float8 through cuda_fp8.h (fnuz: own "
      "conversion); vectorized grid-stride kernel",
      declaration_with("quantize_linear", {"x", "scale", "zero_point"},
                       {real_dtypes(), real_dtypes(), quantized_dtypes(false)}),
      nullptr, [](const KernelLaunch& launch) { cuda_raw::quantize_linear(args_of(launch), launch.stream.handle); }));
  registry.add_kernel(std::make_unique<QuantizeKernel>(
      "dequantize_linear",
      "(x - zero_point) * scale in float32, per tensor or per axis, rounded once; vectorized grid-stride kernel",
      declaration_with("dequantize_linear", {"x", "scale", "zero_point"},
                       {quantized_dtypes(true), real_dtypes(), quantized_dtypes(true)}),
      nullptr, [](const KernelLaunch& launch) { cuda_raw::dequantize_linear(args_of(launch), launch.stream.handle); }));
  registry.add_kernel(std::make_unique<QuantizeKernel>(
      "dynamic_quantize_linear",
      "per-block ranges, then every block combines them and quantizes to uint8; no host synchronization "
      "(a non-finite x gives y_scale Inf or NaN instead of an error)",
      declaration_with("dynamic_quantize_linear", {"x"}, {DTypeSet{{DType::kFloat32}, "float32"}}),
      [](const OpDescriptor& desc) { return cuda_raw::dynamic_quantize_workspace_bytes(desc.inputs[0].numel()); },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        cuda_raw::dynamic_quantize_linear(static_cast<const float*>(x.data_ptr()), x.numel(),
                                          static_cast<std::uint8_t*>(launch.output(0).data_ptr()),
                                          static_cast<float*>(launch.output(1).data_ptr()),
                                          static_cast<std::uint8_t*>(launch.output(2).data_ptr()), launch.workspace,
                                          launch.stream.handle);
      }));
}

}  // namespace xpuruntime::cuda_raw
