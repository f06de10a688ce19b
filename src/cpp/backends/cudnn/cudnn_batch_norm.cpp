// The batch_norm kernel of the cudnn backend (docs/ops.md), named "cudnn": inference batch norm over axis 1
// through cudnnBatchNormalizationForwardInference in spatial mode, for x [N, C, ...] of any rank >= 2 (viewed as
// the packed NCHW tensor [N, C, prod(spatial), 1], which is the same memory).
//
// cuDNN takes the per-channel parameters (scale, bias, mean, var) in float32 whenever x is float16 or bfloat16
// (the BN descriptor cudnnDeriveBNTensorDescriptor derives is float32), while the op gives them in x's dtype. The
// plan then asks for a small workspace (4 vectors of C floats) and converts them there with a tiny kernel of this
// backend (cudnn_kernels.cu) before each call: they are runtime inputs, so this cannot happen at build time.
#include <cmath>
#include <memory>
#include <string>

#include "cudnn_kernels.h"
#include "cudnn_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

namespace {

using cudnn::kOne;
using cudnn::kZero;

constexpr const char* kLabel = "cudnn batch_norm";

struct BatchNormShape {
  DType dtype = DType::kFloat32;
  std::int64_t n = 0, c = 0, spatial = 1;  // x viewed as [n, c, spatial, 1]
  double epsilon = 1e-5;
};

BatchNormShape batch_norm_shape(const OpDescriptor& desc) {
  BatchNormShape s;
  const TensorDesc& x = desc.inputs[0];
  s.dtype = x.dtype;
  s.n = x.shape[0];
  s.c = x.shape[1];
  for (int k = 2; k < x.dim(); ++k) s.spatial *= x.shape[k];
  s.epsilon = desc.attrs.get_float("epsilon", 1e-5);
  return s;
}

// Float offset between the converted parameter vectors in the workspace: C floats rounded up to 256 bytes, so
// that every vector is as aligned as the workspace itself.
std::size_t param_stride(std::int64_t channels) {
  constexpr std::size_t kFloatsPer256Bytes = 64;
  return (static_cast<std::size_t>(channels) + kFloatsPer256Bytes - 1) / kFloatsPer256Bytes * kFloatsPer256Bytes;
}

// What batch_norm's declaration (cudnn::declaration, element-size aligned) cannot say.
Support batch_norm_supports(const OpDescriptor& desc) {
  try {
    Support limits = cudnn::check_limits(desc, kLabel);
    if (!limits) return limits;
    if (desc.inputs.size() != 5 || desc.inputs[0].dim() < 2 || desc.outputs.size() != 1) {
      return Support::no(detail::str_cat(kLabel, " needs x [N, C, ...] and scale, bias, mean, var [C] with the "
                                         "output inferred (call KernelRegistry::infer first)"));
    }
    const double epsilon = desc.attrs.get_float("epsilon", 1e-5);
    if (!std::isfinite(epsilon) || epsilon < CUDNN_BN_MIN_EPSILON) {
      return Support::no(detail::str_cat(kLabel, " needs a finite epsilon >= ", CUDNN_BN_MIN_EPSILON, ", got ",
                                         epsilon));
    }
    return Support::yes();
  } catch (const std::exception& e) {
    return Support::no(detail::str_cat(kLabel, ": ", e.what()));
  }
}

class BatchNormPlan final : public KernelPlan {
 public:
  BatchNormPlan(const BatchNormShape& shape, int device) : shape_(shape), device_(device) {
    cudnn::set_nchw(x_, shape_.dtype, shape_.n, shape_.c, shape_.spatial, 1);
    XPURT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(params_.get(), x_.get(), CUDNN_BATCHNORM_SPATIAL));
    if (convert_params()) workspace_ = 4 * param_stride(shape_.c) * sizeof(float);
  }

  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= workspace_, kLabel, ": the plan needs ", workspace_,
                " bytes of workspace, the launch gives ", launch.workspace_bytes);
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    cudnnHandle_t handle = cudnn::thread_handle(device_, stream);
    const void* params[4] = {launch.input(1).data_ptr(), launch.input(2).data_ptr(), launch.input(3).data_ptr(),
                             launch.input(4).data_ptr()};
    if (convert_params()) {
      auto* converted = static_cast<float*>(launch.workspace);
      const std::size_t stride = param_stride(shape_.c);
      cudnn::launch_batch_norm_params_to_float(shape_.dtype, params, converted, shape_.c, stride, stream);
      for (std::size_t k = 0; k < 4; ++k) params[k] = converted + k * stride;
    }
    XPURT_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
        handle, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_.get(), launch.input(0).data_ptr(), x_.get(),
        launch.output(0).data_ptr(), params_.get(), params[0], params[1], params[2], params[3], shape_.epsilon));
  }

  std::size_t workspace_bytes() const override { return workspace_; }

  std::string describe() const override {
    return detail::str_cat("cudnn batch norm inference (spatial), x as [", shape_.n, ", ", shape_.c, ", ",
                           shape_.spatial, ", 1]", convert_params() ? ", parameters converted to float32" : "");
  }

 private:
  bool convert_params() const { return shape_.dtype != DType::kFloat32; }

  BatchNormShape shape_;
  int device_;
  std::size_t workspace_ = 0;
  cudnn::TensorDescriptor x_;       // x and y
  cudnn::TensorDescriptor params_;  // [1, C, 1, 1], float32 for 16-bit x
};

class CudnnBatchNormKernel final : public Kernel {
 public:
  explicit CudnnBatchNormKernel(KernelInfo info) : Kernel(std::move(info)) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    return batch_norm_supports(desc);
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string&) const override {
    if (desc.outputs[0].numel() == 0) return std::make_unique<cudnn::EmptyPlan>();
    return std::make_unique<BatchNormPlan>(batch_norm_shape(desc), desc.device.index);
  }
};

}  // namespace

void register_cudnn_batch_norm(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<CudnnBatchNormKernel>(
      KernelInfo{"batch_norm", "cudnn", "cudnn", DeviceType::kCUDA, true,
                 "cuDNN inference batch norm (spatial mode, any rank >= 2); 16-bit parameters converted to float32 "
                 "in a small workspace",
                 cudnn::declaration(kLabel)}));
}

}  // namespace xpuruntime
