// Dispatch overhead: the cost of a policy lookup plus a launch for a tiny op, from C++.
//
// For each device (cpu, and cuda:0 when present) and each path it times, per call:
//   select   Dispatcher::select on an already-decided signature (descriptor, signature, cache lookup)
//   call     ops::call of a 1-element `add` (policy lookup + descriptor + outputs + launch); on CUDA the stream
//            is synchronized once per batch, so the figure is the host-side cost of issuing the op
// Prints one JSON object per line: {"device": ..., "path": ..., "us_per_call": ...} (best of 7 batches).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "xpuruntime/device_manager.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/stream_manager.h"

using namespace xpuruntime;

namespace {

template <typename Fn>
double best_us(Fn&& fn, int iterations, const Device& device) {
  for (int i = 0; i < iterations / 10 + 1; ++i) fn();
  double best = 1e30;
  for (int repeat = 0; repeat < 7; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) fn();
    if (device.is_cuda()) StreamManager::instance().current_stream(device).synchronize();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, us / iterations);
  }
  return best;
}

void report(const Device& device, const char* path, double us) {
  std::printf("{\"device\": \"%s\", \"path\": \"%s\", \"us_per_call\": %.3f}\n", device.str().c_str(), path, us);
}

}  // namespace

int main() {
  std::vector<Device> devices = {Device::cpu()};
  if (DeviceManager::instance().get_device_count() > 0) devices.push_back(Device::cuda(0));
  for (const Device& device : devices) {
    Tensor a = Tensor::zeros({1}, DType::kFloat32, device);
    Tensor b = Tensor::zeros({1}, DType::kFloat32, device);
    auto dispatcher = ops::dispatcher_for(KernelPolicy(), ExecutionPolicy());
    OpDescriptor desc = make_op_descriptor("add", {a, b}, {}, ExecutionPolicy());
    dispatcher->select(desc);
    report(device, "select", best_us([&] {
             OpDescriptor d = make_op_descriptor("add", {a, b}, {}, ExecutionPolicy());
             dispatcher->select(d);
           }, 20000, device));
    report(device, "call", best_us([&] { ops::add(a, b); }, 20000, device));
  }
  return 0;
}
