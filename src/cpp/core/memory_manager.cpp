#include "xpuruntime/memory_manager.h"

#include <cstdio>
#include <cstdlib>

#include "cuda_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime {

namespace {

constexpr std::size_t kHostAlignment = 64;

#if XPURT_WITH_CUDA
// Note [cudaMalloc during graph capture]: a thread that is capturing may not call cudaMalloc or
// cudaMemGetInfo in the global or thread-local capture modes, yet the caching allocator must grow a graph's
// private pool during capture. Like PyTorch, the allocator switches this thread to relaxed mode for those
// calls; they do not enqueue work, so the capture stays valid.
class RelaxedCaptureGuard {
 public:
  RelaxedCaptureGuard() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureGuard() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureGuard(const RelaxedCaptureGuard&) = delete;
  RelaxedCaptureGuard& operator=(const RelaxedCaptureGuard&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

cudaStream_t native(StreamId stream) { return reinterpret_cast<cudaStream_t>(stream); }

bool query_cuda_event(void* event) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  XPURT_CUDA_CHECK(status);
  return true;
}

// Device memory of one GPU through cudaMalloc/cudaFree, with a pool of reusable events.
class CudaMemoryBacking final : public MemoryBacking {
 public:
  explicit CudaMemoryBacking(int device) : device_(device) {}
  ~CudaMemoryBacking() override {
    for (void* e : spare_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }

  void* allocate(std::size_t bytes) override {
    detail::CudaDeviceGuard guard(device_);
    RelaxedCaptureGuard relaxed;  // Note [cudaMalloc during graph capture]
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    XPURT_CUDA_CHECK(status);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t /*bytes*/) override {
    detail::CudaDeviceGuard guard(device_);
    XPURT_CUDA_CHECK(cudaFree(ptr));
  }

  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    detail::CudaDeviceGuard guard(device_);
    RelaxedCaptureGuard relaxed;  // Note [cudaMalloc during graph capture]
    XPURT_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  }

  void* record_event(StreamId stream) override {
    detail::CudaDeviceGuard guard(device_);
    cudaEvent_t event = nullptr;
    if (spare_events_.empty()) {
      XPURT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = static_cast<cudaEvent_t>(spare_events_.back());
      spare_events_.pop_back();
    }
    XPURT_CUDA_CHECK(cudaEventRecord(event, native(stream)));
    return event;
  }

  bool query_event(void* event) override { return query_cuda_event(event); }
  void synchronize_event(void* event) override {
    XPURT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  void release_event(void* event) override { spare_events_.push_back(event); }

 private:
  int device_;
  std::vector<void*> spare_events_;
};

// Page-locked host memory through cudaHostAlloc. Events are created on the device of the stream they are
// recorded on (pinned memory is shared by all devices).
class PinnedMemoryBacking final : public MemoryBacking {
 public:
  std::string name() const override { return "pinned host"; }

  void* allocate(std::size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    XPURT_CUDA_CHECK(status);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t /*bytes*/) override { XPURT_CUDA_CHECK(cudaFreeHost(ptr)); }

  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    DeviceInfo cpu = DeviceManager::instance().get_device_info(Device::cpu());
    *free_bytes = cpu.free_memory;
    *total_bytes = cpu.total_memory;
  }

  void* record_event(StreamId stream) override {
    int device = 0;
    if (stream != 0) {
      XPURT_CUDA_CHECK(cudaStreamGetDevice(native(stream), &device));
    } else {
      XPURT_CUDA_CHECK(cudaGetDevice(&device));
    }
    detail::CudaDeviceGuard guard(device);
    cudaEvent_t event = nullptr;
    XPURT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    XPURT_CUDA_CHECK(cudaEventRecord(event, native(stream)));
    return event;
  }

  bool query_event(void* event) override { return query_cuda_event(event); }
  void synchronize_event(void* event) override {
    XPURT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  void release_event(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
};
#endif

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// DataPtr

DataPtr& DataPtr::operator=(DataPtr&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = other.ptr_;
    size_ = other.size_;
    device_ = other.device_;
    allocator_ = other.allocator_;
    budget_ = std::move(other.budget_);
    other.ptr_ = nullptr;
    other.size_ = 0;
    other.allocator_ = nullptr;
  }
  return *this;
}

void DataPtr::reset() noexcept {
  if (ptr_ == nullptr) return;
  try {
    if (allocator_ != nullptr) {
      allocator_->free(ptr_);
    } else {
      MemoryManager::instance().free_host(ptr_, size_);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpuruntime: error while freeing %zu bytes on %s: %s\n", size_, device_.str().c_str(),
                 e.what());
  }
  if (budget_) {
    budget_->release(size_);
    budget_.reset();
  }
  ptr_ = nullptr;
  size_ = 0;
  allocator_ = nullptr;
}

void DataPtr::record_stream(const StreamView& stream) const {
  if (allocator_ == nullptr || ptr_ == nullptr || stream.device.is_cpu()) return;
  XPURT_CHECK(device_.is_cpu() || stream.device == device_, "record_stream: memory on ", device_.str(),
              " cannot be used on a stream of ", stream.device.str());
  allocator_->record_stream(ptr_, stream.id());
}

// ---------------------------------------------------------------------------------------------------------
// MemoryBudget (Note [Run memory budgets])

namespace {
thread_local std::shared_ptr<MemoryBudget> current_budget;

}  // namespace

void MemoryBudget::charge(std::size_t bytes, Device device) {
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || used > limit_ - bytes) {
      throw OutOfMemoryError(detail::str_cat("Out of memory: allocating ", format_bytes(bytes), " on ", device.str(),
                                             " would take this run past its budget (", what_(), "); ",
                                             format_bytes(used), " of it are in use. Raise the limit or give the "
                                             "model smaller inputs."));
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (used + bytes > peak && !peak_.compare_exchange_weak(peak, used + bytes, std::memory_order_relaxed)) {
  }
}

MemoryBudgetScope::MemoryBudgetScope(std::shared_ptr<MemoryBudget> budget) : previous_(std::move(current_budget)) {
  current_budget = std::move(budget);
}

MemoryBudgetScope::~MemoryBudgetScope() { current_budget = std::move(previous_); }

const std::shared_ptr<MemoryBudget>& MemoryBudgetScope::current() { return current_budget; }

// ---------------------------------------------------------------------------------------------------------
// MemoryManager

MemoryManager& MemoryManager::instance() {
  static MemoryManager* manager = new MemoryManager();  // never destroyed: frees at shutdown stay valid
  return *manager;
}

MemoryManager::MemoryManager() {
  device_allocators_.resize(static_cast<std::size_t>(DeviceManager::instance().get_device_count()));
}

CachingAllocator& MemoryManager::device_allocator(Device device) {
  XPURT_CHECK(device.is_cuda(), "device_allocator needs a CUDA device, got ", device.str());
  DeviceManager::instance().check_device(device);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = device_allocators_[static_cast<std::size_t>(device.index)];
  if (!slot) {
#if XPURT_WITH_CUDA
    slot = std::make_unique<CachingAllocator>(std::make_unique<CudaMemoryBacking>(device.index));
#endif
  }
  return *slot;
}

CachingAllocator& MemoryManager::pinned_allocator() {
#if !XPURT_WITH_CUDA
  XPURT_THROW_NO_CUDA_BUILD("Pinned host memory");
#else
  if (!DeviceManager::instance().cuda_available()) {
    throw CudaError("Pinned host memory needs a CUDA device, but none is available: " +
                    DeviceManager::instance().cuda_unavailable_reason());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!pinned_allocator_) {
    CachingAllocatorConfig config;
    config.free_waits_for_own_stream = true;
    pinned_allocator_ = std::make_unique<CachingAllocator>(std::make_unique<PinnedMemoryBacking>(), config);
  }
  return *pinned_allocator_;
#endif
}

DataPtr MemoryManager::allocate(Device device, std::size_t bytes) {
  if (device.is_cpu()) return allocate(device, bytes, StreamView());
  return allocate(device, bytes, StreamManager::instance().current_stream(device));
}

DataPtr MemoryManager::allocate(Device device, std::size_t bytes, const StreamView& stream) {
  return charged(device, bytes, [&] { return allocate_uncharged(device, bytes, stream); });
}

template <typename F>
DataPtr MemoryManager::charged(Device device, std::size_t bytes, F&& allocate) {
  std::shared_ptr<MemoryBudget> budget = current_budget;  // Note [Run memory budgets]
  if (!budget || bytes == 0) return allocate();
  budget->charge(bytes, device);
  DataPtr out;
  try {
    out = allocate();
  } catch (...) {
    budget->release(bytes);
    throw;
  }
  if (!out) {
    budget->release(bytes);
    return out;
  }
  out.budget_ = std::move(budget);
  return out;
}

DataPtr MemoryManager::allocate_uncharged(Device device, std::size_t bytes, const StreamView& stream) {
  DataPtr out;
  out.device_ = device;
  out.size_ = bytes;
  if (device.is_cpu()) {
    DeviceManager::instance().check_device(device);
    out.ptr_ = allocate_host(bytes);
    if (out.ptr_ == nullptr) out.size_ = 0;
    return out;
  }
  XPURT_CHECK(stream.device == device, "allocate on ", device.str(), " with a stream of ", stream.device.str(),
              "; pass a stream of the same device");
  CachingAllocator& allocator = device_allocator(device);
  out.ptr_ = allocator.allocate(bytes, stream.id());
  out.allocator_ = out.ptr_ != nullptr ? &allocator : nullptr;
  if (out.ptr_ == nullptr) out.size_ = 0;
  return out;
}

DataPtr MemoryManager::allocate_pinned(std::size_t bytes, const StreamView& stream) {
  return charged(Device::cpu(), bytes, [&] { return allocate_pinned_uncharged(bytes, stream); });
}

DataPtr MemoryManager::allocate_pinned_uncharged(std::size_t bytes, const StreamView& stream) {
  CachingAllocator& allocator = pinned_allocator();
  DataPtr out;
  out.device_ = Device::cpu();
  out.ptr_ = allocator.allocate(bytes, stream.device.is_cpu() ? 0 : stream.id());
  out.size_ = out.ptr_ != nullptr ? bytes : 0;
  out.allocator_ = out.ptr_ != nullptr ? &allocator : nullptr;
  return out;
}

void* MemoryManager::allocate_host(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  XPURT_CHECK(bytes <= (1ULL << 56), "allocate(", bytes, " bytes) on cpu: the size is absurd; was a negative size "
              "converted?");
  const std::size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  {
    std::lock_guard<std::mutex> lock(host_mutex_);
    if (host_limit_ != 0 && static_cast<std::size_t>(host_stats_.allocated_bytes.current) + rounded > host_limit_) {
      host_stats_.num_ooms += 1;
      throw OutOfMemoryError(detail::str_cat(
          "Out of memory on cpu: tried to allocate ", format_bytes(bytes), " but ",
          format_bytes(static_cast<std::size_t>(host_stats_.allocated_bytes.current)),
          " are allocated and the memory limit is ", format_bytes(host_limit_),
          ". Free tensors you no longer need or raise the limit (set_memory_limit)."));
    }
  }
  void* ptr = std::aligned_alloc(kHostAlignment, rounded);
  std::lock_guard<std::mutex> lock(host_mutex_);
  if (ptr == nullptr) {
    host_stats_.num_ooms += 1;
    throw OutOfMemoryError(detail::str_cat(
        "Out of memory on cpu: tried to allocate ", format_bytes(bytes), "; ",
        format_bytes(static_cast<std::size_t>(host_stats_.allocated_bytes.current)),
        " are allocated by xpuruntime and the system reports ",
        format_bytes(DeviceManager::instance().get_device_info(Device::cpu()).free_memory), " available"));
  }
  const auto size = static_cast<std::int64_t>(rounded);
  host_stats_.allocation.increase(1);
  host_stats_.allocated_bytes.increase(size);
  host_stats_.requested_bytes.increase(static_cast<std::int64_t>(bytes));
  host_stats_.reserved_bytes.increase(size);
  host_stats_.segment.increase(1);
  host_stats_.num_device_alloc += 1;
  if (profiler::recording()) {  // Note [Profiler off cost] (profiler.h)
    profiler::record_allocation("cpu", "allocate", size, host_stats_.allocated_bytes.current, ptr);
  }
  return ptr;
}

void MemoryManager::free_host(void* ptr, std::size_t bytes) noexcept {
  const auto size = static_cast<std::int64_t>((bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
  {
    std::lock_guard<std::mutex> lock(host_mutex_);
    host_stats_.allocation.decrease(1);
    host_stats_.allocated_bytes.decrease(size);
    host_stats_.requested_bytes.decrease(static_cast<std::int64_t>(bytes));
    host_stats_.reserved_bytes.decrease(size);
    host_stats_.segment.decrease(1);
    host_stats_.num_device_free += 1;
    if (profiler::recording()) profiler::record_allocation("cpu", "free", size, host_stats_.allocated_bytes.current, ptr);
  }
  std::free(ptr);
}

void MemoryManager::empty_cache(Device device) {
  DeviceManager::instance().check_device(device);
  if (device.is_cuda()) {
    device_allocator(device).empty_cache();
  } else if (pinned_allocator_) {
    pinned_allocator_->empty_cache();
  }
}

void MemoryManager::empty_cache() {
  std::vector<CachingAllocator*> allocators;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& a : device_allocators_) {
      if (a) allocators.push_back(a.get());
    }
    if (pinned_allocator_) allocators.push_back(pinned_allocator_.get());
  }
  for (CachingAllocator* a : allocators) a->empty_cache();
}

MemoryStats MemoryManager::get_stats(Device device) {
  DeviceManager::instance().check_device(device);
  if (device.is_cuda()) return device_allocator(device).stats();
  std::lock_guard<std::mutex> lock(host_mutex_);
  MemoryStats out = host_stats_;
  out.memory_limit = static_cast<std::int64_t>(host_limit_);
  return out;
}

MemoryStats MemoryManager::get_pinned_stats() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pinned_allocator_) return MemoryStats{};
  }
  return pinned_allocator_->stats();
}

void MemoryManager::reset_peak_stats(Device device) {
  DeviceManager::instance().check_device(device);
  if (device.is_cuda()) {
    device_allocator(device).reset_peak_stats();
    return;
  }
  std::lock_guard<std::mutex> lock(host_mutex_);
  for (Stat* s : {&host_stats_.allocation, &host_stats_.segment, &host_stats_.allocated_bytes,
                  &host_stats_.requested_bytes, &host_stats_.reserved_bytes}) {
    s->reset_peak();
  }
}

std::size_t MemoryManager::get_allocated_size(Device device) {
  return static_cast<std::size_t>(get_stats(device).allocated_bytes.current);
}

std::size_t MemoryManager::get_reserved_size(Device device) {
  return static_cast<std::size_t>(get_stats(device).reserved_bytes.current);
}

void MemoryManager::set_memory_limit(Device device, std::size_t bytes) {
  DeviceManager::instance().check_device(device);
  if (device.is_cuda()) {
    device_allocator(device).set_memory_limit(bytes);
    return;
  }
  std::lock_guard<std::mutex> lock(host_mutex_);
  host_limit_ = bytes;
}

std::size_t MemoryManager::get_memory_limit(Device device) {
  DeviceManager::instance().check_device(device);
  if (device.is_cuda()) return device_allocator(device).memory_limit();
  std::lock_guard<std::mutex> lock(host_mutex_);
  return host_limit_;
}

}  // namespace xpuruntime
