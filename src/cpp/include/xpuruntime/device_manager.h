// DeviceManager: discovers the CPU and every CUDA device and answers what each can do.
//
// Ownership: a process-wide singleton (instance()), created on first use and never destroyed.
// Thread-safety: all methods are safe to call from several threads. The current device is per thread.
// Without a CUDA driver or GPU (or in a build without CUDA) there are zero CUDA devices; nothing fails until a
// CUDA device is asked for, which raises CudaError naming the reason (see cuda_unavailable_reason()).
#pragma once

#include <atomic>
#include <mutex>

#include <cstddef>
#include <string>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/export.h"

namespace xpuruntime {

struct XPURT_API DeviceInfo {
  Device device;                     // default: cpu
  int device_id = 0;                 // index within its type (same as device.index)
  std::string name;                  // "NVIDIA H200", or the CPU model name
  std::size_t total_memory = 0;      // bytes (host RAM for the CPU)
  std::size_t free_memory = 0;       // bytes, read when the info was queried
  int compute_capability_major = 0;  // 0 for the CPU
  int compute_capability_minor = 0;
  int sm_count = 0;                  // streaming multiprocessors; for the CPU, its logical cores
  std::size_t l2_cache_bytes = 0;    // the GPU's L2 cache (50 MiB on an H100); 0 for the CPU
  bool supports_fp16 = false;        // native half arithmetic (CUDA >= 5.3; CPU: AVX512-FP16)
  bool supports_bf16 = false;        // native bfloat16 (CUDA >= 8.0; CPU: AVX512-BF16)
  bool supports_int8 = false;        // int8 dot products (CUDA >= 6.1 dp4a; CPU: AVX512-VNNI/AVX-VNNI)
  bool supports_fp8 = false;         // fp8 tensor cores (CUDA >= 8.9)
  int driver_version = 0;            // cudaDriverGetVersion (e.g. 13000), 0 for the CPU
  int runtime_version = 0;           // cudaRuntimeGetVersion, 0 for the CPU
  std::string pci_bus_id;            // "0000:17:00.0" for CUDA devices, empty for the CPU

  std::string str() const;           // one-line summary
  // major * 10 + minor (90 for an H100 or H200): what OpDescriptor::compute_capability and kernel records hold.
  int compute_capability() const { return compute_capability_major * 10 + compute_capability_minor; }
};

class XPURT_API DeviceManager {
 public:
  static DeviceManager& instance();

  DeviceManager(const DeviceManager&) = delete;
  DeviceManager& operator=(const DeviceManager&) = delete;

  // Number of CUDA devices (0 without a driver/GPU or without CUDA in this build).
  int get_device_count() const;
  bool cuda_available() const { return get_device_count() > 0; }
  // Why there are no CUDA devices ("" when there are some).
  const std::string& cuda_unavailable_reason() const { return unavailable_reason_; }

  // The CPU device first, then cuda:0..N-1, with free memory read now.
  std::vector<DeviceInfo> get_all_devices() const;
  // Throws CudaError for a CUDA device that does not exist (naming the reason), InvalidArgumentError for a
  // negative index.
  DeviceInfo get_device_info(Device device) const;

  // Throws unless `device` can be used (see get_device_info), and CudaError when it had a sticky fault earlier in
  // this process (Note [Sticky CUDA errors]). Cheap: call it before touching a device.
  void check_device(Device device) const;

  // Note [Sticky CUDA errors]
  // A kernel fault (illegal address, illegal instruction, device-side assert, ...) corrupts the CUDA context of
  // the process: every later CUDA call on that device fails, at random places. The first such error (seen by the
  // CUDA check that throws it) marks the device faulted with that message; from then on check_device, and so every
  // session run, op call, allocation and copy on it, raises CudaError saying the device is unusable, why, and that
  // only a new process recovers it.
  void mark_faulted(int index, const std::string& what);
  // The fault that made cuda:`index` unusable, or "" when none.
  std::string fault(int index) const;
  // For tests of the above, in a process of their own: launches a kernel on `device`'s default stream that stores to
  // an unmapped address, so that the next synchronization fails with a sticky cudaErrorIllegalAddress.
  void inject_fault_for_testing(Device device);

  // The calling thread's current device: cuda:N after set_current_device(cuda:N), else cuda:0 when a GPU
  // exists, else cpu. Setting a CUDA device also makes it current for the CUDA runtime on this thread.
  Device get_current_device() const;
  void set_current_device(Device device);

  // Waits for all work on `device` (every stream). A no-op for the CPU.
  void synchronize(Device device) const;

  int driver_version() const { return driver_version_; }    // 0 when no driver
  int runtime_version() const { return runtime_version_; }  // 0 without CUDA

 private:
  DeviceManager();
  DeviceInfo query_cuda(int index) const;

  static constexpr int kMaxTrackedDevices = 64;
  std::atomic<bool> faulted_[kMaxTrackedDevices] = {};
  mutable std::mutex fault_mutex_;
  std::string faults_[kMaxTrackedDevices];
  int cuda_count_ = 0;
  int driver_version_ = 0;
  int runtime_version_ = 0;
  std::string unavailable_reason_;
  DeviceInfo cpu_info_;
};

}  // namespace xpuruntime
