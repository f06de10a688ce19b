// Allocator hot path: allocate+free pairs of 4 KiB, 1 MiB and 64 MiB.
//
//   xpuruntime CachingAllocator on cuda:0 (raw pointers, and through DataPtr/MemoryManager)
//   raw cudaMalloc + cudaFree
//   the caching logic over simulated memory (runs on machines without a GPU)
//
// Prints one JSON object per line: {"impl": ..., "bytes": ..., "us_per_pair": ...}. Each figure is the best
// of 7 repeats of N pairs (after a warm-up), divided by N.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "xpuruntime/caching_allocator.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/memory_manager.h"

#if XPURT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using xpuruntime::CachingAllocator;
using xpuruntime::Device;

double best_us_per_iteration(int iterations, const std::function<void()>& body) {
  for (int i = 0; i < std::max(1, iterations / 10); ++i) body();
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) body();
    const auto end = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(end - start).count() / iterations);
  }
  return best;
}

void report(const char* impl, std::size_t bytes, double us) {
  std::printf("{\"impl\": \"%s\", \"bytes\": %zu, \"us_per_pair\": %.4f}\n", impl, bytes, us);
  std::fflush(stdout);
}

}  // namespace

int main() {
  const std::size_t sizes[] = {4096, 1 << 20, 64 << 20};
  for (std::size_t bytes : sizes) {
    CachingAllocator simulated(std::make_unique<xpuruntime::SimulatedMemoryBacking>(1ULL << 30));
    report("xpuruntime caching (simulated memory)", bytes,
           best_us_per_iteration(200000, [&] { simulated.free(simulated.allocate(bytes, 0)); }));
  }
  if (xpuruntime::DeviceManager::instance().get_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device (%s): device benchmarks skipped\n",
                 xpuruntime::DeviceManager::instance().cuda_unavailable_reason().c_str());
    return 0;
  }
#if XPURT_WITH_CUDA
  const Device gpu = Device::cuda(0);
  auto& mm = xpuruntime::MemoryManager::instance();
  CachingAllocator& allocator = mm.device_allocator(gpu);
  const auto stream = xpuruntime::StreamManager::instance().default_stream(gpu);
  for (std::size_t bytes : sizes) {
    report("xpuruntime CachingAllocator (C++)", bytes,
           best_us_per_iteration(200000, [&] { allocator.free(allocator.allocate(bytes, stream.id())); }));
    report("xpuruntime MemoryManager DataPtr (C++)", bytes,
           best_us_per_iteration(200000, [&] { auto p = mm.allocate(gpu, bytes, stream); }));
    const int raw_iterations = bytes >= (64u << 20) ? 200 : 2000;
    report("cudaMalloc+cudaFree (C++)", bytes, best_us_per_iteration(raw_iterations, [&] {
             void* p = nullptr;
             if (cudaMalloc(&p, bytes) != cudaSuccess || cudaFree(p) != cudaSuccess) std::abort();
           }));
  }
#endif
  return 0;
}
