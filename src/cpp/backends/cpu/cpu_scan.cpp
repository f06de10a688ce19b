// Kernels along one axis of the cpu backend: cum_sum, arg_max / arg_min and top_k (cpu_common.h). Until they land,
// every launch takes the ONNX reference library's kernel (each returns false).
#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {

bool cum_sum_fast(const KernelLaunch&, const CpuContext&) { return false; }
bool arg_extreme_fast(const KernelLaunch&, const CpuContext&) { return false; }
bool top_k_fast(const KernelLaunch&, const CpuContext&) { return false; }

}  // namespace xpuruntime::cpu
