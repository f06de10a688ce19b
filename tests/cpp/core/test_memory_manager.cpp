#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"

#if XPURT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace xpuruntime {
namespace {

TEST(MemoryManager, CpuAllocationsAreAlignedCountedAndFreedByTheirOwner) {
  auto& mm = MemoryManager::instance();
  const auto before = mm.get_stats(Device::cpu());
  {
    DataPtr p = mm.allocate(Device::cpu(), 1000);
    ASSERT_TRUE(p);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.get()) % 64, 0u);
    std::memset(p.get(), 1, 1000);
    EXPECT_EQ(mm.get_stats(Device::cpu()).allocation.current, before.allocation.current + 1);
  }
  EXPECT_EQ(mm.get_stats(Device::cpu()).allocation.current, before.allocation.current);
}

TEST(MemoryManager, MoveAssignmentReleasesTheOldAllocation) {
  auto& mm = MemoryManager::instance();
  const auto base = mm.get_stats(Device::cpu()).allocation.current;
  DataPtr a = mm.allocate(Device::cpu(), 100);
  DataPtr b = mm.allocate(Device::cpu(), 200);
  EXPECT_EQ(mm.get_stats(Device::cpu()).allocation.current, base + 2);
  void* b_ptr = b.get();
  a = std::move(b);
  EXPECT_EQ(mm.get_stats(Device::cpu()).allocation.current, base + 1);
  EXPECT_EQ(a.get(), b_ptr);
  EXPECT_EQ(b.get(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  a.reset();
  EXPECT_EQ(mm.get_stats(Device::cpu()).allocation.current, base);
}

TEST(MemoryManager, CpuMemoryLimitRaisesOutOfMemory) {
  auto& mm = MemoryManager::instance();
  mm.set_memory_limit(Device::cpu(), 1 << 20);
  XPURT_EXPECT_THROW_WITH(mm.allocate(Device::cpu(), 2 << 20), OutOfMemoryError, "memory limit is 1.00 MiB");
  mm.set_memory_limit(Device::cpu(), 0);
  DataPtr ok = mm.allocate(Device::cpu(), 2 << 20);
  EXPECT_TRUE(ok);
}

TEST(MemoryManager, BudgetScopesChargeTheirThreadsAllocationsUntilFreed) {  // Note [Run memory budgets]
  auto& mm = MemoryManager::instance();
  auto budget = std::make_shared<MemoryBudget>(1000, "a test's 1000 bytes");
  DataPtr kept;
  {
    MemoryBudgetScope scope(budget);
    EXPECT_EQ(MemoryBudgetScope::current(), budget);
    DataPtr a = mm.allocate(Device::cpu(), 600);
    EXPECT_EQ(budget->used(), 600u);
    XPURT_EXPECT_THROW_WITH(mm.allocate(Device::cpu(), 401), OutOfMemoryError, "a test's 1000 bytes");
    EXPECT_EQ(budget->used(), 600u);  // the refused allocation reserved nothing
    {
      MemoryBudgetScope none(nullptr);  // scopes nest: nothing is charged in here
      DataPtr free_of_charge = mm.allocate(Device::cpu(), 5000);
      EXPECT_EQ(budget->used(), 600u);
    }
    std::thread other([&] { DataPtr elsewhere = mm.allocate(Device::cpu(), 5000); });  // other threads: not charged
    other.join();
    kept = mm.allocate(Device::cpu(), 400);  // exactly the rest
    EXPECT_EQ(budget->used(), 1000u);
    a = DataPtr();  // move-assigning releases the old charge
    EXPECT_EQ(budget->used(), 400u);
  }
  EXPECT_EQ(MemoryBudgetScope::current(), nullptr);
  DataPtr outside = mm.allocate(Device::cpu(), 5000);
  EXPECT_EQ(budget->used(), 400u);  // what was allocated in the scope stays charged until freed
  DataPtr moved = std::move(kept);
  EXPECT_EQ(budget->used(), 400u);
  moved.reset();
  EXPECT_EQ(budget->used(), 0u);
}

TEST(MemoryManager, WithoutGpuCudaMemoryRaisesCudaError) {
  if (DeviceManager::instance().get_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  auto& mm = MemoryManager::instance();
  XPURT_EXPECT_THROW_WITH(mm.allocate(Device::cuda(0), 16), CudaError, "no CUDA device is available");
  XPURT_EXPECT_THROW_WITH(mm.allocate_pinned(16), CudaError, "Pinned host memory");
  XPURT_EXPECT_THROW_WITH(mm.get_stats(Device::cuda(0)), CudaError, "cuda:0");
}

#if XPURT_WITH_CUDA
TEST(MemoryManagerGpu, AllocatesUsableDeviceMemoryAndCachesIt) {
  XPURT_SKIP_WITHOUT_GPU();
  auto& mm = MemoryManager::instance();
  const Device gpu = Device::cuda(0);
  const StreamView stream = StreamManager::instance().default_stream(gpu);
  void* first = nullptr;
  {
    DataPtr p = mm.allocate(gpu, 1 << 20, stream);
    first = p.get();
    ASSERT_EQ(cudaMemset(p.get(), 7, 1 << 20), cudaSuccess);
    unsigned char host = 0;
    ASSERT_EQ(cudaMemcpy(&host, static_cast<char*>(p.get()) + 12345, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host, 7);
  }
  const auto allocs = mm.get_stats(gpu).num_device_alloc;
  DataPtr again = mm.allocate(gpu, 1 << 20, stream);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(mm.get_stats(gpu).num_device_alloc, allocs);
}

// Blocks a stream until released, so that tests can hold work "in flight" deterministically.
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB wait(void* self) {
    while (!static_cast<StreamGate*>(self)->open.load()) std::this_thread::yield();
  }
};

TEST(MemoryManagerGpu, CrossStreamFreeWaitsForTheOtherStream) {
  XPURT_SKIP_WITHOUT_GPU();
  auto& mm = MemoryManager::instance();
  const Device gpu = Device::cuda(0);
  Stream producer = Stream::create(gpu);
  Stream consumer = Stream::create(gpu);
  StreamGate gate;
  DataPtr p = mm.allocate(gpu, 1 << 16, producer);
  void* address = p.get();
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(consumer.handle()), &StreamGate::wait, &gate), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(address, 1, 1 << 16, static_cast<cudaStream_t>(consumer.handle())), cudaSuccess);
  p.record_stream(consumer);
  p.reset();  // the consumer has not run yet: the block must not be reused
  DataPtr q = mm.allocate(gpu, 1 << 16, producer);
  EXPECT_NE(q.get(), address);
  gate.open = true;
  consumer.synchronize();
  DataPtr r = mm.allocate(gpu, 1 << 16, producer);  // the event completed: reusable now
  EXPECT_EQ(r.get(), address);
}

TEST(MemoryManagerGpu, OutOfMemoryIsTypedAndLosesNothing) {
  XPURT_SKIP_WITHOUT_GPU();
  auto& mm = MemoryManager::instance();
  const Device gpu = Device::cuda(0);
  DataPtr keep = mm.allocate(gpu, 4 << 20);
  const DeviceInfo info = DeviceManager::instance().get_device_info(gpu);
  XPURT_EXPECT_THROW_WITH(mm.allocate(gpu, info.total_memory * 2), OutOfMemoryError, "tried to allocate");
  XPURT_EXPECT_THROW_WITH(mm.allocate(gpu, info.free_memory + (1ULL << 30)),
                          OutOfMemoryError, "the device reports");
  mm.set_memory_limit(gpu, 64 << 20);
  XPURT_EXPECT_THROW_WITH(mm.allocate(gpu, 100 << 20), OutOfMemoryError, "memory limit");
  mm.set_memory_limit(gpu, 0);
  EXPECT_GE(mm.get_stats(gpu).num_ooms, 3);
  EXPECT_TRUE(mm.device_allocator(gpu).owns(keep.get()));
  ASSERT_EQ(cudaMemset(keep.get(), 0, 4 << 20), cudaSuccess);
}

TEST(MemoryManagerGpu, PinnedMemoryIsPageLockedAndReused) {
  XPURT_SKIP_WITHOUT_GPU();
  auto& mm = MemoryManager::instance();
  DataPtr p = mm.allocate_pinned(1 << 20);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p.get()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  void* address = p.get();
  p.reset();
  DeviceManager::instance().synchronize(Device::cuda(0));
  DataPtr q = mm.allocate_pinned(1 << 20);
  EXPECT_EQ(q.get(), address);
}
#endif

}  // namespace
}  // namespace xpuruntime
