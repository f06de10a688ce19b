// The kernels of the cublas backend (registered by register_cublas, cublas_register.cpp). The cuBLAS plumbing they
// share with the cublasLt backend is in core/cublas_utils.h. Internal header: only compiled with XPURT_WITH_CUDA.
#pragma once

#include <memory>
#include <string>

#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cublas {

// "cublas" for op "matmul" or "linear": cublasGemmEx / cublasGemmStridedBatchedEx, linear's bias and
// activation by the cuda_raw bias_activation kernel (through the device kernels table, core/device_kernels.h).
std::unique_ptr<Kernel> make_gemm_kernel(const std::string& op);
// "unfused" for op "attention": S = scale Q K^T, softmax (cuda_raw), O = P V; S lives in the workspace.
std::unique_ptr<Kernel> make_unfused_attention_kernel();

}  // namespace xpuruntime::cublas
