// MemoryManager: where every byte of xpuruntime memory comes from.
//
//  - CUDA devices: one CachingAllocator per device over cudaMalloc (created on first use).
//  - Pinned host memory: one CachingAllocator over cudaHostAlloc whose freed blocks wait for their streams.
//  - CPU: 64-byte-aligned host memory, counted in the same statistics shape.
//
// Ownership: a process-wide singleton that lives until the process ends (never destroyed, so memory freed
// during interpreter shutdown is still safe). Allocations are returned as DataPtr, a move-only owner that
// frees on destruction. Thread-safety: every method is safe from several threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "xpuruntime/caching_allocator.h"
#include "xpuruntime/device.h"
#include "xpuruntime/export.h"
#include "xpuruntime/stream_manager.h"

namespace xpuruntime {

// Note [Run memory budgets]
// ExecutionPolicy.memory_limit caps a plan's peak when it is built (arena + workspace + constants), but some
// memory is only known when a run makes it: the outputs of dynamic and reference-library steps (shapes computed
// from values, sequences, If/Loop bodies), the values of data-dependent size. A MemoryBudget caps those: while a
// MemoryBudgetScope is open on a thread, every MemoryManager allocation made by that thread (host, device or
// pinned) is charged to the budget before it is made, and released when the memory is freed, even after the
// scope has closed (a run's outputs handed to the caller stay charged until they die). An allocation that would
// take the budget past its limit raises OutOfMemoryError without allocating, and the run's error names the node
// (Note [Errors name their node]); the session stays usable. Each run has a budget of its own (the limit less the
// plan's peak), so outputs an earlier run returned do not count against the next. Kernels' scratch memory is
// charged too (Note [Scratch memory under the budget]), also on the workers of their parallel loops; concurrent
// runs have budgets of their own.
class XPURT_API MemoryBudget {
 public:
  // `what` names the budget in errors ("ExecutionPolicy.memory_limit = 64 MiB less the plan's peak of 12 MiB").
  MemoryBudget(std::size_t limit, std::string what)
      : limit_(limit), what_([what = std::move(what)] { return what; }) {}
  // The same, with the name written only when an error needs it (a run's budget is made on every run).
  MemoryBudget(std::size_t limit, std::function<std::string()> what) : limit_(limit), what_(std::move(what)) {}
  // Reserves `bytes` for an allocation on `device`; OutOfMemoryError (nothing reserved) past the limit.
  void charge(std::size_t bytes, Device device);
  void release(std::size_t bytes) noexcept { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  std::size_t used() const { return used_.load(std::memory_order_relaxed); }
  std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }  // the most in use at once
  std::size_t limit() const { return limit_; }

 private:
  const std::size_t limit_;
  const std::function<std::string()> what_;
  std::atomic<std::size_t> used_{0};
  std::atomic<std::size_t> peak_{0};
};

// Charges this thread's MemoryManager allocations to `budget` until destroyed (scopes nest; null: none).
class XPURT_API MemoryBudgetScope {
 public:
  explicit MemoryBudgetScope(std::shared_ptr<MemoryBudget> budget);
  ~MemoryBudgetScope();
  MemoryBudgetScope(const MemoryBudgetScope&) = delete;
  MemoryBudgetScope& operator=(const MemoryBudgetScope&) = delete;
  static const std::shared_ptr<MemoryBudget>& current();

 private:
  std::shared_ptr<MemoryBudget> previous_;
};

// Note [Scratch memory under the budget]
// Kernels that need host scratch memory of the size of their tensors (the reference library converts its inputs
// to double, keeps whole intermediate results, builds im2col columns) hold it in ScratchVector rather than
// std::vector. Its allocator takes the budget open on the thread that makes the vector (Note [Run memory
// budgets]) and charges every allocation to it before making it, so ExecutionPolicy.memory_limit covers that
// memory too: scratch past the limit raises OutOfMemoryError naming the node, before anything is allocated, and
// the bytes are released when the vector frees them (the allocator travels with the memory on moves and swaps).
// With no budget open it is std::allocator.
template <typename T>
class BudgetAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  BudgetAllocator() noexcept : budget_(MemoryBudgetScope::current()) {}
  template <typename U>
  BudgetAllocator(const BudgetAllocator<U>& other) noexcept : budget_(other.budget()) {}  // NOLINT: rebinding

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (budget_) budget_->charge(bytes, Device::cpu());
    try {
      return static_cast<T*>(::operator new(bytes));
    } catch (...) {
      if (budget_) budget_->release(bytes);
      throw;
    }
  }
  void deallocate(T* ptr, std::size_t n) noexcept {
    if (budget_) budget_->release(n * sizeof(T));
    ::operator delete(ptr);
  }
  const std::shared_ptr<MemoryBudget>& budget() const noexcept { return budget_; }

  template <typename U>
  bool operator==(const BudgetAllocator<U>& other) const noexcept {
    return budget_ == other.budget();
  }
  template <typename U>
  bool operator!=(const BudgetAllocator<U>& other) const noexcept {
    return budget_ != other.budget();
  }

 private:
  std::shared_ptr<MemoryBudget> budget_;
};

template <typename T>
using ScratchVector = std::vector<T, BudgetAllocator<T>>;

// Owns one allocation; frees it (back to its allocator) when destroyed or reset.
class XPURT_API DataPtr {
 public:
  DataPtr() = default;
  DataPtr(DataPtr&& other) noexcept { *this = std::move(other); }
  DataPtr& operator=(DataPtr&& other) noexcept;
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  ~DataPtr() { reset(); }

  void* get() const { return ptr_; }
  std::size_t size() const { return size_; }
  Device device() const { return device_; }
  bool pinned() const { return allocator_ != nullptr && device_.is_cpu(); }
  explicit operator bool() const { return ptr_ != nullptr; }
  // Frees now. Errors while freeing are reported to stderr, never thrown (destructor path).
  void reset() noexcept;
  // Marks the memory as used on `stream` (see CachingAllocator::record_stream). No-op for plain CPU memory.
  void record_stream(const StreamView& stream) const;

 private:
  friend class MemoryManager;
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
  Device device_;
  CachingAllocator* allocator_ = nullptr;  // nullptr: plain host memory
  std::shared_ptr<MemoryBudget> budget_;   // charged for size_ (Note [Run memory budgets]), else null
};

class XPURT_API MemoryManager {
 public:
  static MemoryManager& instance();
  MemoryManager(const MemoryManager&) = delete;
  MemoryManager& operator=(const MemoryManager&) = delete;

  // `bytes` on `device`, stream-ordered on `stream` (CUDA). Throws OutOfMemoryError, CudaError when the
  // device is unavailable, InvalidArgumentError for a stream of another device.
  DataPtr allocate(Device device, std::size_t bytes, const StreamView& stream);
  DataPtr allocate(Device device, std::size_t bytes);  // on the current stream of `device`
  // Page-locked host memory (needs a CUDA device), reusable once copies queued on `stream` have finished.
  DataPtr allocate_pinned(std::size_t bytes, const StreamView& stream = {});

  // The caching allocator of a CUDA device (created on first use; throws CudaError if unavailable).
  CachingAllocator& device_allocator(Device device);
  CachingAllocator& pinned_allocator();

  // Returns cached, unused memory of `device` to the system (CUDA devices; pinned memory for the CPU).
  void empty_cache(Device device);
  void empty_cache();  // every device and the pinned pool
  MemoryStats get_stats(Device device);
  MemoryStats get_pinned_stats();
  void reset_peak_stats(Device device);
  std::size_t get_allocated_size(Device device);  // bytes handed out now
  std::size_t get_reserved_size(Device device);   // bytes held from the system now
  // Caps the bytes reserved on `device` (0 = no cap). For the CPU it caps plain host allocations.
  void set_memory_limit(Device device, std::size_t bytes);
  std::size_t get_memory_limit(Device device);

 private:
  MemoryManager();
  void* allocate_host(std::size_t bytes);
  void free_host(void* ptr, std::size_t bytes) noexcept;
  friend class DataPtr;
  DataPtr allocate_uncharged(Device device, std::size_t bytes, const StreamView& stream);
  DataPtr allocate_pinned_uncharged(std::size_t bytes, const StreamView& stream);
  template <typename F>
  DataPtr charged(Device device, std::size_t bytes, F&& allocate);  // Note [Run memory budgets]

  std::mutex mutex_;
  std::vector<std::unique_ptr<CachingAllocator>> device_allocators_;
  std::unique_ptr<CachingAllocator> pinned_allocator_;
  std::mutex host_mutex_;
  MemoryStats host_stats_;
  std::size_t host_limit_ = 0;
};

}  // namespace xpuruntime
