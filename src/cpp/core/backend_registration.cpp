// The one place that registers every backend of this build (STYLE.md habit 1): the global KernelRegistry, and the
// tables through which core reaches what backends provide outside it (Note [Device kernels table] in
// core/device_kernels.h, Note [Device communicator table] in core/device_communicators.h).
//
// Note [Declared kernels of absent backends]
// A policy file names kernels ("cublasLt", "flash_v2") and must stay valid on a build or machine that lacks
// them: a policy written on a GPU machine loads on a CPU-only build. So a backend this build does not have
// still declares its kernels, as kernels whose `supports` always says why they cannot run. The dispatcher then
// reports that reason (pinned: as an error; preferred: as the reason of the fallback).
#include <mutex>

#include "core/device_communicators.h"
#include "core/device_kernels.h"
#include "core/distributed_ops.h"
#include "core/fused_elementwise.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

class AbsentKernel final : public Kernel {
 public:
  AbsentKernel(KernelInfo info, std::string reason) : Kernel(std::move(info)), reason_(std::move(reason)) {}
  Support accepts(const OpDescriptor&, const ExecutionPolicy&) const override { return Support::no(reason_); }
  std::unique_ptr<KernelPlan> build(const OpDescriptor&, const ExecutionPolicy&, const std::string&) const override {
    throw UnsupportedOperationError(reason_);
  }

 private:
  std::string reason_;
};

[[maybe_unused]] void declare_absent(KernelRegistry& registry, const std::string& backend, const std::vector<std::string>& ops,
                    const std::string& name, const std::string& reason) {
  for (const auto& op : ops) {
    if (registry.find_schema(op) == nullptr || registry.find_kernel(op, name) != nullptr) continue;
    registry.add_kernel(std::make_unique<AbsentKernel>(
        KernelInfo{op, name, backend, DeviceType::kCUDA, true, "not in this build"}, reason));
  }
}

[[maybe_unused]] void declare_absent_backends(KernelRegistry& registry) {
  const std::vector<std::string> elementwise = {
      "softmax", "layer_norm", "gelu", "relu", "sigmoid", "tanh", "silu", "exp", "log", "sqrt", "neg", "abs",
      "erf", "reciprocal", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "cast", "reduce_sum",
      "reduce_mean", "reduce_max", "reduce_min", "reduce_sum_square", "clip", "hard_sigmoid", "hard_swish",
      "leaky_relu", "elu",
      "softplus", "sin", "cos", "floor", "ceil", "round", "sign", "is_nan", "is_inf", "logical_and", "logical_or",
      "logical_xor", "cum_sum", "gather_elements", "gather_nd", "pad", "resize", "tan", "asin", "acos", "atan",
      "sinh", "cosh", "asinh", "acosh", "atanh", "softsign", "selu", "celu", "thresholded_relu", "mish", "log_softmax",
      "prelu", "mod", "one_hot", "trilu", "tile", "scatter_nd", "arg_max", "arg_min", "top_k", "reduce_prod", "non_zero", "non_max_suppression",
      "quantize_linear", "dequantize_linear", "dynamic_quantize_linear"};
  const char* no_cuda = "this xpuruntime was built without CUDA; rebuild with the CUDA toolkit installed "
                        "(cmake -DXPURT_WITH_CUDA=ON)";
  const char* no_cudnn = "this xpuruntime was built without cuDNN; install cuDNN 9 and rebuild "
                         "(cmake -DXPURT_WITH_CUDNN=ON -DCUDNN_ROOT=...)";
#if !XPURT_BACKEND_CUDA_RAW
  declare_absent(registry, "cuda_raw", elementwise, "cuda_raw", no_cuda);
  declare_absent(registry, "cuda_raw", {"attention"}, "flash_v2", no_cuda);
  declare_absent(registry, "cuda_raw", {"conv2d"}, "depthwise", no_cuda);
  declare_absent(registry, "cuda_raw", {"conv2d"}, "grouped_gemm", no_cuda);
  declare_absent(registry, "cuda_raw", {"qconv2d"}, "int8_mma", no_cuda);
  declare_absent(registry, "cuda_raw", {"qconv2d"}, "cuda_raw", no_cuda);
  declare_absent(registry, "cuda_raw", {"qlinear"}, "dp4a", no_cuda);
  declare_absent(registry, "cuda_raw", {"matmul_nbits"}, "cuda_raw", no_cuda);
#endif
#if !XPURT_BACKEND_CODEGEN
  declare_absent(registry, "codegen", {"fused_elementwise"}, "generated", no_cuda);
#endif
#if !XPURT_BACKEND_CUBLAS
  declare_absent(registry, "cublas", {"matmul", "linear"}, "cublas", no_cuda);
  declare_absent(registry, "cublas", {"attention"}, "unfused", no_cuda);
#endif
#if !XPURT_BACKEND_CUBLASLT
  declare_absent(registry, "cublasLt", {"matmul", "linear", "linear_grad_weight", "qlinear", "qlinear_fp8"}, "cublasLt",
                 no_cuda);
#endif
#if !XPURT_BACKEND_NCCL
  {
    const char* no_nccl = XPURT_WITH_CUDA ? "this xpuruntime was built without NCCL's header; install NCCL (nccl.h) "
                                            "and rebuild (cmake -DNCCL_ROOT=...)"
                                          : no_cuda;
    declare_absent(registry, "nccl", distributed::collective_ops(), "nccl", no_nccl);
    for (const auto& entry : distributed::nccl_tuned_kernels()) {
      declare_absent(registry, "nccl", {"all_reduce"}, entry.first, no_nccl);
    }
  }
#endif
#if !XPURT_BACKEND_CUDNN
  declare_absent(registry, "cudnn",
                 {"conv2d", "conv_transpose2d", "conv3d", "conv_transpose3d", "max_pool2d", "avg_pool2d",
                  "global_avg_pool", "batch_norm"},
                 "cudnn", XPURT_WITH_CUDA ? no_cudnn : no_cuda);
  declare_absent(registry, "cudnn", {"conv2d"}, "cudnn_search", XPURT_WITH_CUDA ? no_cudnn : no_cuda);
  declare_absent(registry, "cudnn", {"attention"}, "cudnn", XPURT_WITH_CUDA ? no_cudnn : no_cuda);
#endif
  (void)registry;
  (void)elementwise;
  (void)no_cuda;
  (void)no_cudnn;
}

}  // namespace

void declare_pytorch_kernels(KernelRegistry& registry) {
  struct Entry {
    const char* name;
    const char* summary;
  };
  const std::vector<Entry> gemm = {
      {"torch", "PyTorch's own dispatch (its default GEMM library)"},
      {"torch_cublas", "PyTorch's GEMM with torch.backends.cuda.preferred_blas_library('cublas')"},
      {"torch_cublaslt", "PyTorch's GEMM with torch.backends.cuda.preferred_blas_library('cublaslt')"}};
  const std::vector<Entry> conv = {
      {"torch", "PyTorch's own dispatch"},
      {"torch_cudnn", "PyTorch's cuDNN convolution (torch.backends.cudnn enabled)"}};
  const std::vector<Entry> attention = {
      {"torch", "PyTorch's own scaled_dot_product_attention dispatch (its backend priority)"},
      {"torch_flash", "PyTorch's FlashAttention-2 backend (SDPBackend.FLASH_ATTENTION)"},
      {"torch_efficient", "PyTorch's memory-efficient attention backend (SDPBackend.EFFICIENT_ATTENTION)"},
      {"torch_math", "PyTorch's math (composite) attention backend (SDPBackend.MATH)"},
      {"torch_cudnn", "PyTorch's cuDNN attention backend (SDPBackend.CUDNN_ATTENTION)"}};
  const auto declare = [&](const std::string& op, const std::vector<Entry>& entries) {
    if (registry.find_schema(op) == nullptr) return;
    for (const Entry& e : entries) registry.add_external_kernel({op, e.name, "pytorch", e.summary});
  };
  declare("matmul", gemm);
  declare("linear", gemm);
  declare("conv2d", conv);
  declare("attention", attention);
}

KernelRegistry& KernelRegistry::global() {
  static KernelRegistry registry;
  static std::once_flag once;
  std::call_once(once, [] {
    register_ops(registry);
    // Priority order among kernels of one op is registration order: cuBLASLt before cuBLAS for GEMM, flash_v2
    // (cuda_raw) before the unfused attention (cublas); the CPU reference last. GPU kernels only support
    // CUDA descriptors, so the order among devices does not matter.
#if XPURT_BACKEND_CUBLASLT
    register_cublaslt(registry);
#endif
#if XPURT_BACKEND_CUDA_RAW
    register_cuda_raw_depthwise(registry);  // ranks before cuDNN for the depthwise convolutions it takes
    register_cuda_raw_grouped_conv(registry);  // before cuDNN for the deep grouped convolutions it takes
#endif
#if XPURT_BACKEND_CUDNN
    register_cudnn(registry);
#endif
#if XPURT_BACKEND_CUDA_RAW
    register_cuda_raw(registry);
#endif
#if XPURT_BACKEND_CUDNN
    register_cudnn_attention(registry);  // after flash_v2; ranks first on large problems (ranks_first)
#endif
#if XPURT_BACKEND_CUBLAS
    register_cublas(registry);
#endif
#if XPURT_BACKEND_CODEGEN
    register_codegen(registry);
#endif
#if XPURT_BACKEND_NCCL
    register_nccl(registry);
#endif
    register_cpu(registry);
    declare_absent_backends(registry);
    declare_pytorch_kernels(registry);
  });
  return registry;
}

const DeviceKernels& device_kernels() {
  static const DeviceKernels table = [] {
    DeviceKernels filled;
#if XPURT_BACKEND_CUDA_RAW
    register_cuda_raw_device_kernels(filled);
#endif
    return filled;
  }();
  return table;
}

namespace distributed {

const DeviceCommunicators& device_communicators() {
  static const DeviceCommunicators table = [] {
    DeviceCommunicators filled;
#if XPURT_BACKEND_NCCL
    register_nccl_communicators(filled);
#endif
    return filled;
  }();
  return table;
}

}  // namespace distributed

#if !XPURT_BACKEND_CODEGEN
namespace fused {

std::string compile_cubin(const std::string&, const std::string&, int) {
  throw UnsupportedOperationError("this xpuruntime was built without the codegen backend (no CUDA toolkit found); "
                                  "install the CUDA toolkit and rebuild");
}

}  // namespace fused
#endif

}  // namespace xpuruntime
