// Registration of the cublasLt backend: matmul, linear and linear_grad_weight ("cublasLt"), and the int8 qlinear
// ("cublasLt", cublaslt_qlinear.cpp) and the float8 qlinear_fp8 ("cublasLt", cublaslt_qlinear_fp8.cpp).
#include <memory>
#include <string>

#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace cublaslt {
// Defined in cublaslt_gemm.cpp: the "cublasLt" kernel of `op` ("matmul", "linear" or "linear_grad_weight").
std::unique_ptr<Kernel> make_gemm_kernel(const std::string& op);
// Defined in cublaslt_qlinear.cpp: the "cublasLt" kernel of qlinear (Note [cuBLASLt int8 GEMMs]).
std::unique_ptr<Kernel> make_qlinear_kernel();
// Defined in cublaslt_qlinear_fp8.cpp: the "cublasLt" kernel of qlinear_fp8 (Note [cuBLASLt float8 GEMMs]).
std::unique_ptr<Kernel> make_qlinear_fp8_kernel();
}  // namespace cublaslt

void register_cublaslt(KernelRegistry& registry) {
  registry.add_kernel(cublaslt::make_gemm_kernel("matmul"));
  registry.add_kernel(cublaslt::make_gemm_kernel("linear"));
  registry.add_kernel(cublaslt::make_gemm_kernel("linear_grad_weight"));
  registry.add_kernel(cublaslt::make_qlinear_kernel());
  registry.add_kernel(cublaslt::make_qlinear_fp8_kernel());
}

}  // namespace xpuruntime
