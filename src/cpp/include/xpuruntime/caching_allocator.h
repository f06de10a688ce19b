// CachingAllocator: a stream-ordered caching allocator in the spirit of PyTorch's CUDACachingAllocator.
//
// See Note [Caching allocator design] in core/caching_allocator.cpp for the rules. In short:
//  - requests are rounded to 512 bytes; <= 1 MiB come from the small pool (2 MiB segments), larger ones from
//    the large pool (20 MiB segments below 10 MiB, else the request rounded up to 2 MiB);
//  - a free block is reused only by allocations on the stream it was allocated on; record_stream() marks
//    other streams that used it, and its free then waits (through events) until those streams are done;
//  - blocks are split on allocation and merged with free neighbours on free;
//  - when the backing memory runs out, cached blocks are released and the allocation retried once, then
//    OutOfMemoryError is thrown with what was asked, allocated, reserved and free;
//  - allocations on a stream that is being captured into a graph go to that graph's private pool.
//
// The raw memory and the events come from a MemoryBacking: CudaMemoryBacking (cudaMalloc, cudaEvent),
// PinnedMemoryBacking (cudaHostAlloc) or SimulatedMemoryBacking (host memory, events completed by hand), which
// makes all of the caching logic testable without a GPU.
//
// Ownership: the allocator owns its backing and every segment it reserved; pointers it returns are owned by
// the caller until free(). Thread-safety: every method is safe to call from several threads (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xpuruntime/export.h"

namespace xpuruntime {

// The native stream handle as an integer; 0 is the legacy default stream.
using StreamId = std::uintptr_t;
// Identifies a private memory pool (graph capture). 0 means "no private pool".
using MempoolId = std::uint64_t;

// Raw memory source under a CachingAllocator. Implementations must be thread-compatible: the allocator calls
// them with its mutex held.
class XPURT_API MemoryBacking {
 public:
  virtual ~MemoryBacking() = default;
  // Human-readable location, used in messages ("cuda:0", "pinned host").
  virtual std::string name() const = 0;
  // Returns nullptr when out of memory; throws for any other failure.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  // Free and total bytes as the device reports them (for OOM messages and limits).
  virtual void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;
  // Events: an opaque token recorded on `stream`; query/synchronize/release it.
  virtual void* record_event(StreamId stream) = 0;
  virtual bool query_event(void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  virtual void release_event(void* event) = 0;
};

// Host memory standing in for a device, with events that complete only when told to. For tests and for the
// benchmarks of the caching logic on machines without a GPU.
class XPURT_API SimulatedMemoryBacking final : public MemoryBacking {
 public:
  // `capacity` bytes may be reserved in total before allocate() reports out of memory.
  explicit SimulatedMemoryBacking(std::size_t capacity);
  ~SimulatedMemoryBacking() override;

  std::string name() const override { return "simulated device"; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  void* record_event(StreamId stream) override;
  bool query_event(void* event) override;
  void synchronize_event(void* event) override;
  void release_event(void* event) override;

  // Marks every event recorded so far on `stream` as complete (the stream "caught up").
  void complete_stream(StreamId stream);
  std::size_t reserved() const { return used_; }
  std::size_t backing_allocations() const { return live_; }
  std::size_t pending_events() const;

 private:
  struct SimEvent {
    StreamId stream;
    bool done;
  };
  std::size_t capacity_;
  std::size_t used_ = 0;
  std::size_t live_ = 0;
  std::vector<std::unique_ptr<SimEvent>> events_;
};

// One statistic: current value, peak, and the running totals of increments and decrements.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // sum of increments
  std::int64_t freed = 0;      // sum of decrements

  void increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
};

// Statistics of one allocator (the names follow torch.cuda.memory_stats()).
struct MemoryStats {
  Stat allocation;            // live allocations handed to callers
  Stat segment;               // segments reserved from the backing (cudaMalloc'ed)
  Stat active;                // blocks allocated or waiting for stream events
  Stat inactive_split;        // free blocks that are parts of split segments
  Stat allocated_bytes;       // bytes handed to callers (rounded sizes)
  Stat requested_bytes;       // bytes callers asked for
  Stat reserved_bytes;        // bytes reserved from the backing
  Stat active_bytes;
  Stat inactive_split_bytes;
  std::int64_t num_alloc_retries = 0;  // allocations that had to release the cache and retry
  std::int64_t num_ooms = 0;           // OutOfMemoryError thrown
  std::int64_t num_device_alloc = 0;   // calls into the backing (cudaMalloc)
  std::int64_t num_device_free = 0;    // segments returned (cudaFree)
  std::int64_t num_sync_all_streams = 0;  // times outstanding events were waited for (OOM, empty_cache)
  std::int64_t memory_limit = 0;       // bytes, 0 = no limit
};

// One reserved segment and its blocks, as snapshot() reports them.
struct SegmentInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  StreamId stream = 0;
  bool is_large = false;
  MempoolId pool = 0;  // 0 = the default pools
  struct BlockInfo {
    std::size_t size = 0;
    std::size_t requested_size = 0;
    bool allocated = false;
    bool pending_events = false;
  };
  std::vector<BlockInfo> blocks;
};

struct CachingAllocatorConfig {
  // When true (pinned host memory), a freed block is reused only after an event recorded at free time on
  // its own stream has completed, because the host may touch it before queued copies finish. Default false
  // (device memory: stream order makes reuse on the same stream safe).
  bool free_waits_for_own_stream = false;
};

class XPURT_API CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<MemoryBacking> backing, CachingAllocatorConfig config = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns memory for `bytes` (0 is allowed and returns nullptr) usable on `stream`.
  // Throws OutOfMemoryError, or InvalidArgumentError for sizes no device could hold.
  void* allocate(std::size_t bytes, StreamId stream);
  // Returns `ptr` to the cache. Throws InvalidArgumentError for a pointer this allocator did not hand out
  // (or already freed). free(nullptr) does nothing.
  void free(void* ptr);
  // Marks `ptr` as used on `stream` too: its free will wait until the work queued on `stream` is done.
  void record_stream(void* ptr, StreamId stream);
  // True when `ptr` is a live allocation of this allocator.
  bool owns(void* ptr) const;
  // The rounded size of the live allocation at `ptr` (throws when not owned).
  std::size_t allocation_size(void* ptr) const;

  // Waits for outstanding frees and returns every unused segment to the backing.
  void empty_cache();
  MemoryStats stats() const;
  void reset_peak_stats();
  // Caps reserved bytes (0 = no cap). Allocations that would pass it release the cache, then throw OOM.
  void set_memory_limit(std::size_t bytes);
  std::size_t memory_limit() const;
  std::vector<SegmentInfo> snapshot() const;
  MemoryBacking& backing() { return *backing_; }

  // Private pools for graph capture: while a pool is the target for `stream`, allocations on that stream are
  // served from (and freed back to) the pool only; its memory stays reserved until release_pool() and until
  // its blocks are all freed.
  // create_pool() returns a pool held once; retain_pool() adds a holder (a second graph sharing it);
  // release_pool() drops one, and a pool without holders returns its memory as its blocks are freed.
  MempoolId create_pool();
  void retain_pool(MempoolId pool);
  void begin_allocate_to_pool(MempoolId pool, StreamId stream);
  void end_allocate_to_pool(MempoolId pool);
  void release_pool(MempoolId pool);

  struct Impl;

 private:
  std::unique_ptr<MemoryBacking> backing_;
  std::unique_ptr<Impl> impl_;
};

// Formats a byte count for messages: "512 B", "2.00 MiB", "1.50 GiB".
XPURT_API std::string format_bytes(std::size_t bytes);

}  // namespace xpuruntime
