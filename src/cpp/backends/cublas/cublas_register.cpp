// Registration of the cublas backend: matmul and linear ("cublas"), attention ("unfused").
#include "backends/cublas/cublas_kernels.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

void register_cublas(KernelRegistry& registry) {
  registry.add_kernel(cublas::make_gemm_kernel("matmul"));
  registry.add_kernel(cublas::make_gemm_kernel("linear"));
  registry.add_kernel(cublas::make_unfused_attention_kernel());
}

}  // namespace xpuruntime
