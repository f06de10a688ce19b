// ONNX reference ops (nn group): see src/cpp/core/runtime/onnx_cpu_ops.h.
#include "core/runtime/onnx_cpu_ops.h"

namespace xpuruntime::onnx_ref {

void register_nn_ops(Library& lib) { (void)lib; }

}  // namespace xpuruntime::onnx_ref
