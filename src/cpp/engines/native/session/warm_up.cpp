// Warming the vendor libraries on a helper thread while a CUDA session reads its model (see warm_up.h).
//
// Note [Libraries warmed while the model is read]
// A vendor library's first use in a process costs more than most plans' kernel selection: cuBLASLt's (its handle,
// kernel modules and heuristic) about 100 ms on an H200, cuDNN's 20-60 ms. With the build cache replaying the
// decisions (Note [Build cache]), that first use was the longest part of a CNN's kernel selection
// (benchmarks/session_create_bench.py). So creating a CUDA session starts a helper thread before the ONNX import
// that builds, for each kernel that has one, the small plan of Kernel::warm_up and throws it away: the libraries
// load while the model is read and the graph passes run. Each backend's kernels warm on a thread of their own, so
// the libraries load side by side (one after the other, cuDNN's and cuBLASLt's took 150-230 ms, longer than a CNN's
// import and passes; side by side the warm creation of ResNet-50 went from 297 to 184 ms and EfficientNet-B0's from
// 221 to 151 ms on an H200, docs/benchmarks.md). The handles a thread created go back to the per-thread pools when
// it ends (Note [Per-thread handle pools]) for the selection threads to take. Creation does not wait for it (a small
// model's plan may be built before the libraries are loaded): the session keeps its future, its destruction waits
// for it, and explain().build lists its time once it is done. Its failures are ignored: a kernel that cannot run is
// reported by the plan that needs it.
#include "engines/native/session/warm_up.h"

#include <chrono>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/build_clock.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::runtime {

double warm_libraries(Device device, const ExecutionPolicy& policy) {
  const auto start = std::chrono::steady_clock::now();
  try {
    DeviceManager::instance().check_device(device);
    const int compute_capability = DeviceManager::instance().get_device_info(device).compute_capability();
    const KernelRegistry& registry = KernelRegistry::global();
    // Per backend, its kernels' problems. The backends warm at once, one thread each: their libraries load apart.
    std::map<std::string, std::vector<std::pair<const Kernel*, OpDescriptor>>> by_backend;
    for (const std::string& op : registry.ops()) {
      for (const Kernel* kernel : registry.kernels(op)) {
        std::optional<OpDescriptor> desc = kernel->warm_up(device);
        if (!desc) continue;
        desc->compute_capability = compute_capability;
        desc->precision = kernel_precision(policy.precision);
        by_backend[kernel->info().backend].emplace_back(kernel, std::move(*desc));
      }
    }
    std::vector<std::future<void>> backends;
    for (auto& [backend, problems] : by_backend) {
      backends.push_back(std::async(std::launch::async, [&registry, &policy, &problems = problems] {
        for (auto& [kernel, desc] : problems) {
          try {
            registry.infer(desc);
            if (kernel->supports(desc, policy)) (void)kernel->build(desc, policy, "");
          } catch (const std::exception&) {
            // Ignored (see the Note); the next kernel is warmed all the same.
          }
        }
      }));
    }
    for (std::future<void>& backend : backends) backend.wait();
  } catch (const std::exception&) {
    // No usable device: the session's creation reports it.
  }
  return detail::ms_since(start);
}

}  // namespace xpuruntime::runtime
