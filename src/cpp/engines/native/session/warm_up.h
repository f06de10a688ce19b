// Note [Libraries warmed while the model is read] (warm_up.cpp). Internal header.
#pragma once

#include "xpuruntime/device.h"
#include "xpuruntime/kernel_registry.h"  // ExecutionPolicy

namespace xpuruntime::runtime {

// Builds and drops the Kernel::warm_up plan of every kernel that has one on `device` under `policy`, each
// backend's kernels on a thread of their own; returns the wall milliseconds it took. Never throws: failures are
// ignored (a kernel that cannot run is reported by the plan that needs it).
double warm_libraries(Device device, const ExecutionPolicy& policy);

}  // namespace xpuruntime::runtime
