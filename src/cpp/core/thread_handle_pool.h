// Per-(thread, device) library handles, shared by the backends that need them (cuBLAS, cuBLASLt, cuDNN).
// Internal header.
//
// Note [Per-thread handle pools]
// A vendor-library handle (cuBLAS, cuBLASLt, cuDNN) is bound to the device that was current when it was
// created, carries per-handle state (the stream, a workspace) and must not be used by two threads at once;
// creating one is expensive (cudnnCreate loads kernels, cublasCreate allocates device memory). So each thread
// gets its own handle per device, created lazily; when the thread exits, its handles go back to a process-wide
// pool with one free list per device, and the next new thread reuses them (PyTorch's DeviceThreadHandlePool does
// the same). The pools are deliberately never destroyed: destroying handles from a static destructor runs after
// the CUDA runtime may have been torn down at process exit, which fails or crashes inside the library; the driver
// reclaims everything when the process ends. The RAII owners still destroy a handle dropped before that.
#pragma once

#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xpuruntime::detail {

// `Handle`: a movable RAII owner with `static Handle create(int device)` (creating the handle on `device`).
template <typename Handle>
class HandlePool {
 public:
  static HandlePool& instance() {
    static auto* pool = new HandlePool();  // never destroyed: Note [Per-thread handle pools]
    return *pool;
  }

  Handle acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& free = free_[device];
      if (!free.empty()) {
        Handle handle = std::move(free.back());
        free.pop_back();
        return handle;
      }
    }
    return Handle::create(device);
  }

  void release(int device, Handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(std::move(handle));
  }

 private:
  HandlePool() = default;
  std::mutex mutex_;
  std::unordered_map<int, std::vector<Handle>> free_;
};

// The calling thread's handle for `device`: taken from the pool on first use, given back when the thread exits.
template <typename Handle>
const Handle& thread_handle(int device) {
  class ThreadHandles {
   public:
    ThreadHandles() = default;
    ThreadHandles(const ThreadHandles&) = delete;
    ThreadHandles& operator=(const ThreadHandles&) = delete;
    ~ThreadHandles() {
      for (auto& [id, handle] : held_) HandlePool<Handle>::instance().release(id, std::move(handle));
    }
    const Handle& get(int id) {
      auto it = held_.find(id);
      if (it == held_.end()) it = held_.emplace(id, HandlePool<Handle>::instance().acquire(id)).first;
      return it->second;
    }

   private:
    std::unordered_map<int, Handle> held_;
  };
  thread_local ThreadHandles handles;
  return handles.get(device);
}

}  // namespace xpuruntime::detail
