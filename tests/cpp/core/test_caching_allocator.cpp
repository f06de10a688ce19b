// The caching logic, tested over simulated memory (no GPU needed).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/caching_allocator.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {
namespace {

constexpr std::size_t kMiB = 1 << 20;
constexpr StreamId kStreamA = 0x100;
constexpr StreamId kStreamB = 0x200;

struct Fixture : ::testing::Test {
  explicit Fixture(std::size_t capacity = 1024 * kMiB) {
    auto b = std::make_unique<SimulatedMemoryBacking>(capacity);
    backing = b.get();
    allocator = std::make_unique<CachingAllocator>(std::move(b));
  }
  SimulatedMemoryBacking* backing;
  std::unique_ptr<CachingAllocator> allocator;
};

using CachingAllocatorTest = Fixture;

TEST_F(CachingAllocatorTest, RoundsSizesAndUsesSegmentSizesPerPool) {
  void* p = allocator->allocate(1, kStreamA);
  EXPECT_EQ(allocator->allocation_size(p), 512u);
  void* q = allocator->allocate(513, kStreamA);
  EXPECT_EQ(allocator->allocation_size(q), 1024u);
  MemoryStats s = allocator->stats();
  EXPECT_EQ(s.segment.current, 1);  // both small requests share one 2 MiB segment
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(2 * kMiB));
  void* large = allocator->allocate(kMiB + 1, kStreamA);  // large: a 20 MiB segment
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(22 * kMiB));
  void* huge = allocator->allocate(33 * kMiB + 5, kStreamA);  // >= 10 MiB: rounded to 2 MiB
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>((22 + 34) * kMiB));
  for (void* ptr : {p, q, large, huge}) allocator->free(ptr);
  EXPECT_EQ(allocator->stats().allocated_bytes.current, 0);
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>((22 + 34) * kMiB));
}

TEST_F(CachingAllocatorTest, ReusesFreedBlocksOnTheSameStreamWithoutNewSegments) {
  void* p = allocator->allocate(4096, kStreamA);
  allocator->free(p);
  const auto device_allocs = allocator->stats().num_device_alloc;
  for (int i = 0; i < 100; ++i) {
    void* q = allocator->allocate(4096, kStreamA);
    EXPECT_EQ(q, p);
    allocator->free(q);
  }
  EXPECT_EQ(allocator->stats().num_device_alloc, device_allocs);
}

TEST_F(CachingAllocatorTest, DoesNotReuseBlocksAcrossStreams) {
  void* p = allocator->allocate(4096, kStreamA);
  allocator->free(p);
  void* q = allocator->allocate(4096, kStreamB);
  EXPECT_NE(q, p);
  EXPECT_EQ(allocator->stats().segment.current, 2);
  allocator->free(q);
}

TEST_F(CachingAllocatorTest, SplitsAndMergesBlocks) {
  void* a = allocator->allocate(1000, kStreamA);
  void* b = allocator->allocate(1000, kStreamA);
  void* c = allocator->allocate(1000, kStreamA);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 1024);
  EXPECT_EQ(static_cast<char*>(c) - static_cast<char*>(b), 1024);
  auto snap = allocator->snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].blocks.size(), 4u);  // a, b, c and the rest
  allocator->free(b);
  EXPECT_EQ(allocator->stats().inactive_split.current, 2);  // b and the rest
  allocator->free(a);                                      // merges with b
  snap = allocator->snapshot();
  EXPECT_EQ(snap[0].blocks.size(), 3u);
  EXPECT_EQ(snap[0].blocks[0].size, 2048u);
  allocator->free(c);  // everything merges into one block
  snap = allocator->snapshot();
  ASSERT_EQ(snap[0].blocks.size(), 1u);
  EXPECT_EQ(snap[0].blocks[0].size, 2 * kMiB);
  EXPECT_EQ(allocator->stats().inactive_split.current, 0);
  EXPECT_EQ(allocator->stats().inactive_split_bytes.current, 0);
}

TEST_F(CachingAllocatorTest, LargeBlocksAreSplitOnlyWhenMoreThanOneMiBRemains) {
  void* a = allocator->allocate(19 * kMiB + 512, kStreamA);  // 20 MiB segment, remainder < 1 MiB: no split
  EXPECT_EQ(allocator->allocation_size(a), 20 * kMiB);
  allocator->free(a);
  void* b = allocator->allocate(2 * kMiB, kStreamA);  // 18 MiB remain: split
  EXPECT_EQ(allocator->allocation_size(b), 2 * kMiB);
  void* c = allocator->allocate(2 * kMiB, kStreamA);
  EXPECT_EQ(static_cast<char*>(c) - static_cast<char*>(b), static_cast<std::ptrdiff_t>(2 * kMiB));
  allocator->free(b);
  allocator->free(c);
}

TEST_F(CachingAllocatorTest, RecordStreamDefersReuseUntilTheOtherStreamIsDone) {
  void* p = allocator->allocate(4096, kStreamA);
  allocator->record_stream(p, kStreamB);
  allocator->free(p);
  EXPECT_EQ(backing->pending_events(), 1u);
  EXPECT_EQ(allocator->stats().active.current, 1);  // pending free
  void* q = allocator->allocate(4096, kStreamA);
  EXPECT_NE(q, p) << "a block used on another stream was reused before that stream finished";
  backing->complete_stream(kStreamB);
  void* r = allocator->allocate(4096, kStreamA);  // events are polled here: p is free again
  EXPECT_EQ(r, p);
  allocator->free(q);
  allocator->free(r);
  EXPECT_EQ(allocator->stats().active.current, 0);
}

TEST_F(CachingAllocatorTest, EmptyCacheWaitsForEventsAndReturnsWholeSegments) {
  void* p = allocator->allocate(4096, kStreamA);
  void* q = allocator->allocate(30 * kMiB, kStreamA);
  void* keep = allocator->allocate(3 * kMiB, kStreamA);
  allocator->record_stream(p, kStreamB);
  allocator->free(p);
  allocator->free(q);
  allocator->empty_cache();
  MemoryStats s = allocator->stats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.segment.current, 1);  // only the segment of `keep` stays
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(20 * kMiB));
  EXPECT_EQ(backing->reserved(), 20 * kMiB);
  allocator->free(keep);
  allocator->empty_cache();
  EXPECT_EQ(backing->reserved(), 0u);
  EXPECT_EQ(allocator->stats().num_device_free, 3);
}

struct SmallCapacity : Fixture {
  SmallCapacity() : Fixture(64 * kMiB) {}
};

TEST_F(SmallCapacity, OutOfMemoryReleasesTheCacheAndRetries) {
  void* a = allocator->allocate(40 * kMiB, kStreamA);
  allocator->free(a);  // cached: the backing has 24 MiB free
  void* b = allocator->allocate(50 * kMiB, kStreamA);  // needs the cache released
  MemoryStats s = allocator->stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.segment.current, 1);
  allocator->free(b);
}

TEST_F(SmallCapacity, OutOfMemoryErrorSaysWhatWasAskedAllocatedReservedAndFree) {
  void* a = allocator->allocate(40 * kMiB, kStreamA);
  try {
    allocator->allocate(30 * kMiB, kStreamA);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tried to allocate 30.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("40.00 MiB allocated"), std::string::npos) << m;
    EXPECT_NE(m.find("40.00 MiB reserved"), std::string::npos) << m;
    EXPECT_NE(m.find("24.00 MiB free of 64.00 MiB"), std::string::npos) << m;
  }
  EXPECT_EQ(allocator->stats().num_ooms, 1);
  // Nothing was lost: the live allocation is intact and the allocator still works.
  EXPECT_TRUE(allocator->owns(a));
  void* b = allocator->allocate(10 * kMiB, kStreamA);
  allocator->free(b);
  allocator->free(a);
}

TEST_F(SmallCapacity, RequestsLargerThanTheDeviceFailImmediately) {
  XPURT_EXPECT_THROW_WITH(allocator->allocate(1ULL << 40, kStreamA), OutOfMemoryError, "more than the device's total");
  EXPECT_EQ(allocator->stats().num_device_alloc, 0);
  XPURT_EXPECT_THROW_WITH(allocator->allocate(static_cast<std::size_t>(-1), kStreamA), InvalidArgumentError, "absurd");
}

TEST_F(CachingAllocatorTest, MemoryLimitCapsReservedBytes) {
  allocator->set_memory_limit(30 * kMiB);
  void* a = allocator->allocate(20 * kMiB, kStreamA);
  XPURT_EXPECT_THROW_WITH(allocator->allocate(12 * kMiB, kStreamA), OutOfMemoryError, "memory limit of 30.00 MiB");
  allocator->free(a);
  void* b = allocator->allocate(28 * kMiB, kStreamA);  // the cached 20 MiB segment is released to make room
  EXPECT_EQ(allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(28 * kMiB));
  allocator->free(b);
  allocator->set_memory_limit(0);
  void* c = allocator->allocate(100 * kMiB, kStreamA);
  allocator->free(c);
}

TEST_F(CachingAllocatorTest, DoubleFreeAndForeignPointersAreErrors) {
  void* p = allocator->allocate(100, kStreamA);
  allocator->free(p);
  XPURT_EXPECT_THROW_WITH(allocator->free(p), InvalidArgumentError, "freed twice");
  int local = 0;
  XPURT_EXPECT_THROW_WITH(allocator->free(&local), InvalidArgumentError, "not a live allocation");
  XPURT_EXPECT_THROW_WITH(allocator->record_stream(p, kStreamB), InvalidArgumentError, "not a live allocation");
  allocator->free(nullptr);  // allowed, like free(NULL)
  EXPECT_EQ(allocator->allocate(0, kStreamA), nullptr);
}

TEST_F(CachingAllocatorTest, StatisticsTrackCurrentPeakAllocatedAndFreed) {
  void* a = allocator->allocate(1000, kStreamA);
  void* b = allocator->allocate(3000, kStreamA);
  allocator->free(a);
  MemoryStats s = allocator->stats();
  EXPECT_EQ(s.allocation.current, 1);
  EXPECT_EQ(s.allocation.peak, 2);
  EXPECT_EQ(s.allocation.allocated, 2);
  EXPECT_EQ(s.allocation.freed, 1);
  EXPECT_EQ(s.allocated_bytes.current, 3072);
  EXPECT_EQ(s.allocated_bytes.peak, 4096);
  EXPECT_EQ(s.requested_bytes.current, 3000);
  allocator->reset_peak_stats();
  EXPECT_EQ(allocator->stats().allocated_bytes.peak, 3072);
  allocator->free(b);
}

TEST_F(CachingAllocatorTest, PrivatePoolServesOnlyItsStreamAndStaysReserved) {
  const MempoolId pool = allocator->create_pool();
  allocator->begin_allocate_to_pool(pool, kStreamA);
  void* in_pool = allocator->allocate(4096, kStreamA);
  void* outside = allocator->allocate(4096, kStreamB);  // other streams use the default pools
  allocator->free(in_pool);                             // back to the private pool
  void* again = allocator->allocate(4096, kStreamA);
  EXPECT_EQ(again, in_pool);
  allocator->free(again);
  allocator->end_allocate_to_pool(pool);

  void* after = allocator->allocate(4096, kStreamA);  // capture over: the pool's blocks are not handed out
  EXPECT_NE(after, in_pool);
  auto snap = allocator->snapshot();
  EXPECT_EQ(std::count_if(snap.begin(), snap.end(), [&](const SegmentInfo& s) { return s.pool == pool; }), 1);
  allocator->empty_cache();  // does not touch a live pool
  snap = allocator->snapshot();
  EXPECT_EQ(std::count_if(snap.begin(), snap.end(), [&](const SegmentInfo& s) { return s.pool == pool; }), 1);
  allocator->release_pool(pool);  // the graph is gone: its free segments are returned
  snap = allocator->snapshot();
  EXPECT_EQ(std::count_if(snap.begin(), snap.end(), [&](const SegmentInfo& s) { return s.pool == pool; }), 0);
  allocator->free(after);
  allocator->free(outside);
  XPURT_EXPECT_THROW_WITH(allocator->release_pool(pool), InvalidArgumentError, "no such live private pool");
}

TEST_F(CachingAllocatorTest, ReleasedPoolReturnsSegmentsWhenItsLastBlockIsFreed) {
  const MempoolId pool = allocator->create_pool();
  allocator->begin_allocate_to_pool(pool, kStreamA);
  void* p = allocator->allocate(4096, kStreamA);
  allocator->end_allocate_to_pool(pool);
  const auto reserved = allocator->stats().reserved_bytes.current;
  allocator->release_pool(pool);
  EXPECT_EQ(allocator->stats().reserved_bytes.current, reserved);  // p still lives in it
  allocator->free(p);
  EXPECT_EQ(allocator->stats().reserved_bytes.current, reserved - static_cast<std::int64_t>(2 * kMiB));
}

TEST_F(CachingAllocatorTest, SharedPoolNeedsEveryHolderToRelease) {
  const MempoolId pool = allocator->create_pool();
  allocator->retain_pool(pool);
  allocator->begin_allocate_to_pool(pool, kStreamA);
  allocator->free(allocator->allocate(4096, kStreamA));
  allocator->end_allocate_to_pool(pool);
  allocator->release_pool(pool);
  EXPECT_EQ(allocator->stats().segment.current, 1);
  allocator->release_pool(pool);
  EXPECT_EQ(allocator->stats().segment.current, 0);
}

TEST_F(CachingAllocatorTest, FreesNeedingEventsAreDeferredDuringCapture) {
  void* p = allocator->allocate(4096, kStreamB);
  allocator->record_stream(p, kStreamA);
  const MempoolId pool = allocator->create_pool();
  allocator->begin_allocate_to_pool(pool, kStreamA);
  allocator->free(p);
  EXPECT_EQ(backing->pending_events(), 0u) << "an event was recorded while a capture was underway";
  XPURT_EXPECT_THROW_WITH(allocator->empty_cache(), InvalidArgumentError, "capture is underway");
  allocator->end_allocate_to_pool(pool);
  EXPECT_EQ(backing->pending_events(), 1u);
  backing->complete_stream(kStreamA);
  allocator->empty_cache();
  allocator->release_pool(pool);
  EXPECT_EQ(allocator->stats().reserved_bytes.current, 0);
}

TEST_F(CachingAllocatorTest, PinnedStyleFreesWaitForTheirOwnStream) {
  CachingAllocatorConfig config;
  config.free_waits_for_own_stream = true;
  auto b = std::make_unique<SimulatedMemoryBacking>(64 * kMiB);
  SimulatedMemoryBacking* sim = b.get();
  CachingAllocator pinned(std::move(b), config);
  void* p = pinned.allocate(4096, kStreamA);
  pinned.free(p);
  void* q = pinned.allocate(4096, kStreamA);
  EXPECT_NE(q, p);  // queued copies may still read p
  sim->complete_stream(kStreamA);
  void* r = pinned.allocate(4096, kStreamA);
  EXPECT_EQ(r, p);
  pinned.free(q);
  pinned.free(r);
  sim->complete_stream(kStreamA);
  pinned.empty_cache();
}

TEST_F(CachingAllocatorTest, RandomWorkloadKeepsInvariants) {
  std::mt19937 rng(1234);
  std::vector<std::pair<void*, std::size_t>> live;
  std::uniform_int_distribution<int> op(0, 2);
  std::uniform_int_distribution<std::size_t> small(1, 1 << 20);
  std::uniform_int_distribution<std::size_t> large((1 << 20) + 1, 24 << 20);
  std::uniform_int_distribution<int> pick_stream(0, 1);
  for (int i = 0; i < 3000; ++i) {
    if (op(rng) != 0 || live.empty()) {
      const std::size_t n = (i % 5 == 0) ? large(rng) : small(rng);
      void* p = allocator->allocate(n, pick_stream(rng) ? kStreamA : kStreamB);
      live.emplace_back(p, n);
    } else {
      std::uniform_int_distribution<std::size_t> which(0, live.size() - 1);
      const std::size_t k = which(rng);
      allocator->free(live[k].first);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    if (live.size() > 40) {
      allocator->free(live.front().first);
      live.erase(live.begin());
    }
  }
  // No two live allocations overlap, and every byte the stats claim is accounted for in the snapshot.
  std::vector<std::pair<char*, std::size_t>> ranges;
  for (auto [p, n] : live) ranges.emplace_back(static_cast<char*>(p), allocator->allocation_size(p));
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first);
  std::int64_t snapshot_reserved = 0;
  std::int64_t snapshot_allocated = 0;
  for (const SegmentInfo& s : allocator->snapshot()) {
    snapshot_reserved += static_cast<std::int64_t>(s.size);
    for (const auto& b : s.blocks) snapshot_allocated += b.allocated ? static_cast<std::int64_t>(b.size) : 0;
  }
  MemoryStats s = allocator->stats();
  EXPECT_EQ(s.reserved_bytes.current, snapshot_reserved);
  EXPECT_EQ(s.allocated_bytes.current, snapshot_allocated);
  EXPECT_EQ(static_cast<std::size_t>(s.reserved_bytes.current), backing->reserved());
  for (auto [p, n] : live) allocator->free(p);
  allocator->empty_cache();
  EXPECT_EQ(backing->reserved(), 0u);
  EXPECT_EQ(allocator->stats().active_bytes.current, 0);
}

TEST_F(CachingAllocatorTest, IsSafeFromSeveralThreads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const StreamId stream = 0x1000 + static_cast<StreamId>(t);
      for (int i = 0; i < 2000; ++i) {
        void* p = allocator->allocate(static_cast<std::size_t>(512 * (1 + i % 7)), stream);
        std::memset(p, t, 512);
        allocator->free(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(allocator->stats().allocation.current, 0);
  EXPECT_EQ(allocator->stats().allocation.allocated, 8000);
}

}  // namespace
}  // namespace xpuruntime
