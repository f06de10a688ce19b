// ONNX reference ops (misc group): see src/cpp/core/runtime/onnx_cpu_ops.h.
#include "core/runtime/onnx_cpu_ops.h"

namespace xpuruntime::onnx_ref {

void register_misc_ops(Library& lib) { (void)lib; }

}  // namespace xpuruntime::onnx_ref
