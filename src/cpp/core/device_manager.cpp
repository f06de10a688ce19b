#include "xpuruntime/device_manager.h"

#include <unistd.h>

#include <fstream>
#include <optional>
#include <thread>

#include "cuda_utils.h"
#include "device_kernels.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

namespace {

thread_local std::optional<Device> t_current_device;

std::string read_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "CPU";
}

std::size_t read_available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return static_cast<std::size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

std::string DeviceInfo::str() const {
  if (device.is_cpu()) {
    return detail::str_cat("cpu: ", name, ", ", sm_count, " cores, ", total_memory >> 20, " MiB");
  }
  return detail::str_cat(device.str(), ": ", name, ", sm_", compute_capability_major, compute_capability_minor, ", ",
                         sm_count, " SMs, ", total_memory >> 20, " MiB");
}

DeviceManager& DeviceManager::instance() {
  static DeviceManager* manager = new DeviceManager();  // never destroyed: usable during shutdown
  return *manager;
}

DeviceManager::DeviceManager() {
  cpu_info_.device = Device::cpu();
  cpu_info_.name = read_cpu_model();
  cpu_info_.total_memory =
      static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  cpu_info_.sm_count = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  cpu_info_.supports_fp16 = __builtin_cpu_supports("avx512fp16");
  cpu_info_.supports_bf16 = __builtin_cpu_supports("avx512bf16");
  cpu_info_.supports_int8 = __builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avxvnni");
#elif defined(__x86_64__) && defined(__clang__)
  // clang (the sanitizer builds) knows fewer feature names: avx512fp16 and avxvnni stay unreported there.
  __builtin_cpu_init();
  cpu_info_.supports_bf16 = __builtin_cpu_supports("avx512bf16");
  cpu_info_.supports_int8 = __builtin_cpu_supports("avx512vnni");
#endif

#if XPURT_WITH_CUDA
  runtime_version_ = CUDART_VERSION;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) runtime_version_ = runtime;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) driver_version_ = driver;
  (void)cudaGetLastError();
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    cuda_count_ = 0;
    unavailable_reason_ = detail::str_cat("cudaGetDeviceCount failed with ", cudaGetErrorName(status), " (",
                                          cudaGetErrorString(status), ")");
    if (driver_version_ == 0) unavailable_reason_ += "; no NVIDIA driver is installed or loadable";
  } else if (count == 0) {
    unavailable_reason_ = "the CUDA driver reports no devices (check CUDA_VISIBLE_DEVICES)";
  } else {
    cuda_count_ = count;
  }
#else
  unavailable_reason_ = "this xpuruntime was built without CUDA (rebuild with the CUDA toolkit installed)";
#endif
}

int DeviceManager::get_device_count() const { return cuda_count_; }

void DeviceManager::mark_faulted(int index, const std::string& what) {
  if (index < 0 || index >= kMaxTrackedDevices) return;
  std::lock_guard<std::mutex> lock(fault_mutex_);
  if (faulted_[index].load()) return;  // the first fault is the cause; later ones follow from it
  faults_[index] = what;
  faulted_[index].store(true);
}

std::string DeviceManager::fault(int index) const {
  if (index < 0 || index >= kMaxTrackedDevices) return {};
  std::lock_guard<std::mutex> lock(fault_mutex_);
  return faults_[index];
}

void DeviceManager::inject_fault_for_testing(Device device) {
  check_device(device);
  XPURT_CHECK(device.is_cuda(), "inject_fault_for_testing needs a CUDA device, got ", device.str());
  // Note [Device kernels table] (core/device_kernels.h): the cuda_raw backend's kernel, null in a CPU build.
  const auto inject_fault = device_kernels().inject_fault;
  if (inject_fault == nullptr) throw UnsupportedOperationError("inject_fault_for_testing needs the cuda_raw backend");
#if XPURT_WITH_CUDA  // a CPU build has no inject_fault: it threw above
  detail::CudaDeviceGuard guard(device.index);
#endif
  inject_fault(nullptr);
}

void DeviceManager::check_device(Device device) const {
  XPURT_CHECK(device.index >= 0, "Expected a non-negative device index, but got ", device.index);
  if (device.is_cpu()) {
    XPURT_CHECK(device.index == 0, "There is one CPU device (index 0), but got cpu:", device.index);
    return;
  }
  if (device.index < cuda_count_) {
    if (device.index < kMaxTrackedDevices && faulted_[device.index].load(std::memory_order_relaxed)) {
      throw CudaError(detail::str_cat(device.str(), " is unusable: an earlier CUDA error in this process was sticky (",
                                      fault(device.index), "); every later use of this device fails, and only a new "
                                      "process recovers it (Note [Sticky CUDA errors])"));
    }
    return;
  }
  if (cuda_count_ == 0) {
    throw CudaError(detail::str_cat(device.str(), " was requested but no CUDA device is available (the only device "
                                    "here is cpu): ", unavailable_reason_));
  }
  throw CudaError(detail::str_cat(device.str(), " was requested but only ", cuda_count_, " CUDA device",
                                  cuda_count_ == 1 ? "" : "s", " (cuda:0..cuda:", cuda_count_ - 1, ") exist"));
}

DeviceInfo DeviceManager::query_cuda(int index) const {
  DeviceInfo info;
  info.device = Device::cuda(index);
  info.device_id = index;
#if XPURT_WITH_CUDA
  cudaDeviceProp prop{};
  XPURT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  info.name = prop.name;
  info.total_memory = prop.totalGlobalMem;
  info.compute_capability_major = prop.major;
  info.compute_capability_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.l2_cache_bytes = prop.l2CacheSize > 0 ? static_cast<std::size_t>(prop.l2CacheSize) : 0;
  const int cc = prop.major * 10 + prop.minor;
  info.supports_fp16 = cc >= 53;
  info.supports_bf16 = cc >= 80;
  info.supports_int8 = cc >= 61;
  info.supports_fp8 = cc >= 89;
  info.driver_version = driver_version_;
  info.runtime_version = runtime_version_;
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), index) == cudaSuccess) info.pci_bus_id = bus;
  (void)cudaGetLastError();
  {
    detail::CudaDeviceGuard guard(index);
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    XPURT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    info.free_memory = free_bytes;
  }
#endif
  return info;
}

DeviceInfo DeviceManager::get_device_info(Device device) const {
  check_device(device);
  if (device.is_cpu()) {
    DeviceInfo info = cpu_info_;
    info.free_memory = read_available_host_memory();
    return info;
  }
  return query_cuda(device.index);
}

std::vector<DeviceInfo> DeviceManager::get_all_devices() const {
  std::vector<DeviceInfo> out;
  out.push_back(get_device_info(Device::cpu()));
  for (int i = 0; i < cuda_count_; ++i) out.push_back(query_cuda(i));
  return out;
}

Device DeviceManager::get_current_device() const {
  if (t_current_device) return *t_current_device;
#if XPURT_WITH_CUDA
  if (cuda_count_ > 0) {
    int current = 0;
    XPURT_CUDA_CHECK(cudaGetDevice(&current));
    return Device::cuda(current);
  }
#endif
  return Device::cpu();
}

void DeviceManager::set_current_device(Device device) {
  check_device(device);
#if XPURT_WITH_CUDA
  if (device.is_cuda()) XPURT_CUDA_CHECK(cudaSetDevice(device.index));
#endif
  t_current_device = device;
}

void DeviceManager::synchronize(Device device) const {
  check_device(device);
#if XPURT_WITH_CUDA
  if (device.is_cuda()) {
    detail::CudaDeviceGuard guard(device.index);
    XPURT_CUDA_CHECK(cudaDeviceSynchronize());
  }
#endif
}

}  // namespace xpuruntime
