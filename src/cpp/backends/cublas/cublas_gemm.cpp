// The "cublas" kernel of matmul and linear: cublasGemmEx / cublasGemmStridedBatchedEx on row-major tensors
// (Note [Row-major GEMM through column-major cuBLAS]), broadcast batch dims (Note [Broadcast batch dims]), and
// linear's bias + activation as one cuda_raw kernel after the GEMM.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>

#include "backends/cublas/cublas_kernels.h"
#include "core/cublas_utils.h"
#include "core/device_kernels.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cublas {

namespace {

// The most host-side launches one matmul may take (batch dims that broadcast in an interleaved way, e.g.
// a[64, 1, M, K] @ b[1, 64, K, N], need one launch per outer index).
constexpr std::int64_t kMaxLaunches = 1 << 16;

class GemmPlan final : public KernelPlan {
 public:
  GemmPlan(GemmShape shape, DType dtype, cublasComputeType_t compute, bool linear, std::string activation,
           bool has_bias, int device, std::size_t workspace)
      : shape_(std::move(shape)),
        dtype_(dtype),
        compute_(compute),
        linear_(linear),
        activation_(std::move(activation)),
        has_bias_(has_bias),
        device_(device),
        workspace_(workspace) {}

  void run(const KernelLaunch& launch) const override {
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    // cuBLAS's first operand is our right one (b of matmul, the weight of linear), its second our left one.
    const Tensor& lhs = launch.input(1);
    const Tensor& rhs = launch.input(0);
    Tensor& out = launch.output(0);
    if (shape_.empty()) return;
    if (shape_.k == 0) {
      // An empty reduction: the GEMM is all zeros (the bias / activation below still apply).
      XPURT_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream));
    } else {
      const cublasHandle_t handle = thread_cublas_handle(device_, stream);
      bind_workspace(handle, launch.workspace, launch.workspace_bytes);
      gemm(handle, shape_, dtype_, compute_, lhs.data_ptr(), rhs.data_ptr(), out.data_ptr());
    }
    if (linear_ && launch.num_inputs > 3 && launch.input(3).defined()) {
      // The residual, before the bias and the activation: act(x W + bias + residual).
      const auto add_into = required_device_kernel(device_kernels().add_into, "add_into", "cublas linear");
      add_into(out.data_ptr(), launch.input(3).data_ptr(), dtype_, out.numel(), launch.stream.handle);
    }
    if (linear_ && (has_bias_ || activation_ != "none")) {
      const void* bias = has_bias_ ? launch.input(2).data_ptr() : nullptr;
      const auto bias_activation =
          required_device_kernel(device_kernels().bias_activation, "bias_activation", "cublas linear");
      bias_activation(out.data_ptr(), bias, dtype_, shape_.n, shape_.m, activation_, launch.stream.handle);
    }
  }

  std::size_t workspace_bytes() const override { return workspace_; }

  std::string describe() const override {
    std::string text = detail::str_cat("cublas ", shape_.batch > 1 ? "GemmStridedBatchedEx" : "GemmEx", " m=", shape_.m,
                                       " n=", shape_.n, " k=", shape_.k);
    if (shape_.batch > 1) text += detail::str_cat(" batch ", shape_.batch);
    if (shape_.launches() > 1) text += detail::str_cat(" x ", shape_.launches(), " launches");
    text += detail::str_cat(" ", dtype_name(dtype_), " compute ", compute_type_name(compute_));
    if (linear_ && (has_bias_ || activation_ != "none")) {
      text += detail::str_cat(" + cuda_raw bias_activation(", has_bias_ ? "bias, " : "", activation_, ")");
    }
    return text;
  }

 private:
  GemmShape shape_;
  DType dtype_;
  cublasComputeType_t compute_;
  bool linear_;
  std::string activation_;
  bool has_bias_;
  int device_;
  std::size_t workspace_;
};

class GemmKernel final : public Kernel {
 public:
  explicit GemmKernel(const std::string& op)
      : Kernel(KernelInfo{op, "cublas", "cublas", DeviceType::kCUDA, true,
                          op == "linear" ? "cuBLAS GEMM (cublasGemmEx), residual, bias and activation by cuda_raw "
                                           "kernels"
                                         : "cuBLAS GEMM (cublasGemmEx / cublasGemmStridedBatchedEx, broadcast "
                                           "batch dims)",
                          gemm_declaration(op, "cublas")}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (Support device = check_gemm_device(desc, "cublas"); !device) return device;
    if (desc.outputs.empty()) return Support::no("cublas needs the op's outputs inferred first");
    if (op() == "matmul") {
      if (desc.inputs.size() < 2 || desc.inputs[0].dim() < 2 || desc.inputs[1].dim() < 2) {
        return Support::no("cublas matmul needs a[..., M, K] and b[..., K, N]");
      }
      const std::int64_t launches = matmul_outer_launches(desc);
      if (launches > kMaxLaunches) {
        return Support::no(detail::str_cat("cublas matmul: the batch dims of a ", shape_str(desc.inputs[0].shape),
                                           " and b ", shape_str(desc.inputs[1].shape),
                                           " broadcast in a pattern "
                                           "that needs ",
                                           launches, " separate GEMM launches (more than ", kMaxLaunches,
                                           "); expand one operand's batch dims first"));
      }
      const GemmShape shape = matmul_shape(desc);
      if (Support fits = check_int32(shape, "cublas"); !fits) return fits;
    } else {
      if (desc.inputs.size() < 2 || desc.inputs[0].dim() < 1 || desc.inputs[1].dim() != 2) {
        return Support::no("cublas linear needs x[..., K] and weight[N, K] or [K, N]");
      }
      if (Support fits = check_int32(linear_shape(desc), "cublas"); !fits) return fits;
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    if (!record.empty()) {
      throw UnsupportedOperationError(
          detail::str_cat("the cublas kernel makes no choices and has no plan record, but was given one: '", record,
                          "' (a record of another kernel?)"));
    }
    const bool linear = op() == "linear";
    GemmShape shape = linear ? linear_shape(desc) : matmul_shape(desc);
    const DType dtype = desc.inputs[0].dtype;
    const std::string activation = linear ? desc.attrs.get_string("activation", "none") : "none";
    const bool has_bias = linear && desc.inputs.size() > 2 && desc.inputs[2].present;
    const std::size_t workspace =
        shape.empty() || shape.k == 0 ? 0 : default_cublas_workspace(desc.compute_capability, policy.workspace_limit);
    return std::make_unique<GemmPlan>(std::move(shape), dtype, compute_type(dtype, desc.precision), linear, activation,
                                      has_bias, desc.device.index, workspace);
  }
};

}  // namespace

std::unique_ptr<Kernel> make_gemm_kernel(const std::string& op) { return std::make_unique<GemmKernel>(op); }

}  // namespace xpuruntime::cublas
