#include "xpuruntime/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/profiler.h"

// Note [Caching allocator design]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The allocator follows PyTorch's CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp):
//
// * Sizes. A request is rounded up to a multiple of 512 bytes. Requests up to 1 MiB are "small" and are
//   carved from 2 MiB segments; larger requests are "large" and come from 20 MiB segments when under
//   10 MiB, else from a segment of the request rounded up to 2 MiB. Small and large blocks live in separate
//   pools so that small allocations do not fragment large segments.
// * Best fit per stream. Each pool is an ordered set keyed by (stream, size, address); an allocation takes
//   the smallest free block of its own stream that is large enough. Reusing a block on the stream that
//   freed it is safe without synchronization because the stream executes in order.
// * Split and merge. A block larger than needed is split (small pool: when >= 512 B would remain; large
//   pool: when > 1 MiB would remain); the remainder goes back to the pool. A freed block merges with free
//   neighbours of the same segment, so a segment whose blocks are all free becomes one block again and can
//   be returned by empty_cache().
// * Cross-stream use. record_stream(ptr, s) notes that stream s also uses the block. Its free then records
//   an event on every such stream and the block becomes reusable only when all of them have completed;
//   events are polled at each allocation and waited for on OOM and empty_cache().
// * Out of memory. When the backing fails (or the memory limit would be passed), the allocator waits for
//   pending events, returns every wholly free segment of the default pools, and retries once; then it
//   throws OutOfMemoryError describing the request and the allocator's state.
// * Private pools (graph capture). While a pool is the target for a stream, allocations on that stream
//   are served from the pool's own small/large sets and freed back to them, so a captured graph's
//   addresses are never handed to anyone else while the graph exists. Events are neither polled nor
//   recorded while a capture is underway (both are illegal on a capturing stream); frees that need events
//   are deferred until the last capture ends.

namespace xpuruntime {

std::string format_bytes(std::size_t bytes) {
  char buffer[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) {
    std::snprintf(buffer, sizeof(buffer), "%zu B", bytes);
  } else if (bytes < (1ULL << 20)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f KiB", b / 1024.0);
  } else if (bytes < (1ULL << 30)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f MiB", b / (1024.0 * 1024.0));
  } else if (bytes < (1ULL << 40)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f TiB", b / (1024.0 * 1024.0 * 1024.0 * 1024.0));
  }
  return buffer;
}

// ---------------------------------------------------------------------------------------------------------
// SimulatedMemoryBacking

SimulatedMemoryBacking::SimulatedMemoryBacking(std::size_t capacity) : capacity_(capacity) {}

SimulatedMemoryBacking::~SimulatedMemoryBacking() = default;

void* SimulatedMemoryBacking::allocate(std::size_t bytes) {
  if (bytes > capacity_ - used_) return nullptr;
  void* ptr = std::aligned_alloc(512, (bytes + 511) / 512 * 512);
  if (ptr == nullptr) return nullptr;
  used_ += bytes;
  ++live_;
  return ptr;
}

void SimulatedMemoryBacking::deallocate(void* ptr, std::size_t bytes) {
  std::free(ptr);
  used_ -= bytes;
  --live_;
}

void SimulatedMemoryBacking::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  *free_bytes = capacity_ - used_;
  *total_bytes = capacity_;
}

void* SimulatedMemoryBacking::record_event(StreamId stream) {
  events_.push_back(std::make_unique<SimEvent>(SimEvent{stream, false}));
  return events_.back().get();
}

bool SimulatedMemoryBacking::query_event(void* event) { return static_cast<SimEvent*>(event)->done; }

void SimulatedMemoryBacking::synchronize_event(void* event) { static_cast<SimEvent*>(event)->done = true; }

void SimulatedMemoryBacking::release_event(void* event) {
  auto it = std::find_if(events_.begin(), events_.end(), [&](const auto& e) { return e.get() == event; });
  if (it != events_.end()) events_.erase(it);
}

void SimulatedMemoryBacking::complete_stream(StreamId stream) {
  for (auto& e : events_) {
    if (e->stream == stream) e->done = true;
  }
}

std::size_t SimulatedMemoryBacking::pending_events() const {
  return static_cast<std::size_t>(
      std::count_if(events_.begin(), events_.end(), [](const auto& e) { return !e->done; }));
}

// ---------------------------------------------------------------------------------------------------------
// CachingAllocator

namespace {

constexpr std::size_t kMinBlockSize = 512;         // every size is a multiple of this
constexpr std::size_t kSmallSize = 1 << 20;        // largest "small" request
constexpr std::size_t kSmallBuffer = 2 << 20;      // segment size for small requests
constexpr std::size_t kLargeBuffer = 20 << 20;     // segment size for large requests under kMinLargeAlloc
constexpr std::size_t kMinLargeAlloc = 10 << 20;   // from here, segments are sized to the request
constexpr std::size_t kRoundLarge = 2 << 20;       // rounding of request-sized segments
constexpr std::size_t kMaxRequest = 1ULL << 56;    // 64 PiB: no device holds more; avoids size overflow

struct BlockPool;
struct PrivatePool;

struct Block {
  std::size_t size = 0;       // bytes in this block
  std::size_t requested = 0;  // bytes the caller asked for (when allocated)
  char* ptr = nullptr;
  StreamId stream = 0;        // the allocating stream
  BlockPool* pool = nullptr;  // the pool it returns to
  Block* prev = nullptr;      // neighbours within the segment
  Block* next = nullptr;
  bool allocated = false;
  int event_count = 0;              // outstanding events before the block is free
  std::vector<StreamId> stream_uses;  // other streams recorded with record_stream()

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct BlockCompare {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

struct BlockPool {
  std::set<Block*, BlockCompare> blocks;
  bool is_small = false;
  PrivatePool* owner = nullptr;  // nullptr: a default pool
};

struct PrivatePool {
  MempoolId id = 0;
  int use_count = 1;
  std::size_t segments = 0;
  BlockPool small;
  BlockPool large;
};

std::size_t round_size(std::size_t size) {
  return size < kMinBlockSize ? kMinBlockSize : (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::size_t segment_size(std::size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

std::string hex(const void* ptr) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%p", ptr);
  return buffer;
}

}  // namespace

struct CachingAllocator::Impl {
  MemoryBacking* backing = nullptr;
  CachingAllocatorConfig config;
  mutable std::mutex mutex;
  BlockPool small_pool;
  BlockPool large_pool;
  std::unordered_map<void*, Block*> allocated;
  std::vector<Block*> spare_blocks;  // recycled Block objects (avoids new/delete on the hot path)
  std::vector<std::pair<void*, Block*>> outstanding_events;
  std::vector<Block*> deferred_until_no_capture;
  std::map<MempoolId, std::unique_ptr<PrivatePool>> private_pools;
  std::vector<std::pair<MempoolId, StreamId>> captures;  // pools receiving allocations, by stream
  MempoolId next_pool_id = 1;
  MemoryStats stats;
  std::size_t limit = 0;

  Impl() {
    small_pool.is_small = true;
    allocated.reserve(4096);
  }

  ~Impl() {
    for (Block* b : spare_blocks) delete b;
  }

  Block* new_block() {
    if (spare_blocks.empty()) return new Block();
    Block* b = spare_blocks.back();
    spare_blocks.pop_back();
    return b;
  }

  void recycle(Block* b) {
    *b = Block();
    spare_blocks.push_back(b);
  }

  void pool_insert(Block* b) {
    b->pool->blocks.insert(b);
    if (b->is_split()) {
      stats.inactive_split.increase(1);
      stats.inactive_split_bytes.increase(static_cast<std::int64_t>(b->size));
    }
  }

  void pool_erase(Block* b) {
    b->pool->blocks.erase(b);
    if (b->is_split()) {
      stats.inactive_split.decrease(1);
      stats.inactive_split_bytes.decrease(static_cast<std::int64_t>(b->size));
    }
  }

  BlockPool& pool_for(std::size_t size, StreamId stream) {
    if (!captures.empty()) {
      for (const auto& [id, capture_stream] : captures) {
        if (capture_stream == stream) {
          PrivatePool& p = *private_pools.at(id);
          return size <= kSmallSize ? p.small : p.large;
        }
      }
    }
    return size <= kSmallSize ? small_pool : large_pool;
  }

  Block* take_free_block(BlockPool& pool, std::size_t size, StreamId stream) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    pool_erase(b);
    return b;
  }

  void release_segment(Block* b) {
    backing->deallocate(b->ptr, b->size);
    stats.segment.decrease(1);
    stats.reserved_bytes.decrease(static_cast<std::int64_t>(b->size));
    stats.num_device_free += 1;
    if (b->pool->owner != nullptr) b->pool->owner->segments -= 1;
    recycle(b);
  }

  // Returns the wholly free segments of `pool` to the backing.
  void release_free_segments(BlockPool& pool) {
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* b = *it;
      if (!b->is_split()) {
        it = pool.blocks.erase(it);
        release_segment(b);
      } else {
        ++it;
      }
    }
  }

  void release_cached_blocks() {
    synchronize_and_free_events();
    release_free_segments(small_pool);
    release_free_segments(large_pool);
    for (auto it = private_pools.begin(); it != private_pools.end();) {
      PrivatePool& p = *it->second;
      if (p.use_count == 0) {
        release_free_segments(p.small);
        release_free_segments(p.large);
      }
      if (p.use_count == 0 && p.segments == 0) {
        it = private_pools.erase(it);
      } else {
        ++it;
      }
    }
  }

  void synchronize_and_free_events() {
    if (outstanding_events.empty()) return;
    stats.num_sync_all_streams += 1;
    auto events = std::move(outstanding_events);
    outstanding_events.clear();
    for (auto& [event, block] : events) {
      backing->synchronize_event(event);
      backing->release_event(event);
      if (--block->event_count == 0) free_block(block);
    }
  }

  void process_events() {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < outstanding_events.size(); ++i) {
      auto [event, block] = outstanding_events[i];
      if (backing->query_event(event)) {
        backing->release_event(event);
        if (--block->event_count == 0) free_block(block);
      } else {
        outstanding_events[kept++] = outstanding_events[i];
      }
    }
    outstanding_events.resize(kept);
  }

  void insert_events(Block* b) {
    std::vector<StreamId> streams = std::move(b->stream_uses);
    b->stream_uses.clear();
    if (config.free_waits_for_own_stream) streams.push_back(b->stream);
    for (StreamId s : streams) {
      void* event = backing->record_event(s);
      b->event_count += 1;
      outstanding_events.emplace_back(event, b);
    }
  }

  bool try_merge(Block* dst, Block* src) {
    if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty()) return false;
    pool_erase(src);
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev != nullptr) dst->prev->next = dst;
    } else {
      dst->next = src->next;
      if (dst->next != nullptr) dst->next->prev = dst;
    }
    dst->size += src->size;
    recycle(src);
    return true;
  }

  // A block whose events are done (or that needed none) goes back to its pool.
  void free_block(Block* b) {
    const auto size = static_cast<std::int64_t>(b->size);
    try_merge(b, b->prev);
    try_merge(b, b->next);
    stats.active.decrease(1);
    stats.active_bytes.decrease(size);
    PrivatePool* owner = b->pool->owner;
    if (owner != nullptr && owner->use_count == 0 && !b->is_split()) {
      release_segment(b);
      if (owner->segments == 0) private_pools.erase(owner->id);
      return;
    }
    pool_insert(b);
  }

  Block* split(Block* b, std::size_t size) {
    const std::size_t remaining = b->size - size;
    const bool should_split = b->pool->is_small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    if (!should_split) return b;
    Block* rest = new_block();
    rest->ptr = b->ptr + size;
    rest->size = remaining;
    rest->stream = b->stream;
    rest->pool = b->pool;
    rest->prev = b;
    rest->next = b->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool_insert(rest);
    return b;
  }

  [[noreturn]] void throw_oom(std::size_t requested, std::size_t segment, const std::string& why) {
    stats.num_ooms += 1;
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    backing->memory_info(&free_bytes, &total_bytes);
    const auto allocated_now = static_cast<std::size_t>(stats.allocated_bytes.current);
    const auto reserved_now = static_cast<std::size_t>(stats.reserved_bytes.current);
    std::string message = detail::str_cat(
        "Out of memory on ", backing->name(), ": tried to allocate ", format_bytes(requested),
        segment != 0 ? detail::str_cat(" (a new segment of ", format_bytes(segment), ")") : std::string(),
        ". ", why, " xpuruntime has ", format_bytes(allocated_now), " allocated and ",
        format_bytes(reserved_now), " reserved (", format_bytes(reserved_now - allocated_now),
        " cached, free for reuse); the device reports ", format_bytes(free_bytes), " free of ",
        format_bytes(total_bytes), " total");
    if (limit != 0) message += detail::str_cat("; memory limit ", format_bytes(limit));
    message +=
        ". Free tensors you no longer need, call empty_cache(), raise the memory limit, or use smaller "
        "inputs.";
    throw OutOfMemoryError(message);
  }

  Block* new_segment(BlockPool& pool, std::size_t size, std::size_t requested, StreamId stream) {
    const std::size_t alloc_size = segment_size(size);
    auto over_limit = [&] {
      return limit != 0 && static_cast<std::size_t>(stats.reserved_bytes.current) + alloc_size > limit;
    };
    if (over_limit()) {
      release_cached_blocks();
      stats.num_alloc_retries += 1;
      if (over_limit()) {
        throw_oom(requested, alloc_size,
                  detail::str_cat("The memory limit of ", format_bytes(limit), " would be exceeded."));
      }
    }
    void* ptr = backing->allocate(alloc_size);
    stats.num_device_alloc += 1;
    if (ptr == nullptr) {
      release_cached_blocks();
      stats.num_alloc_retries += 1;
      ptr = backing->allocate(alloc_size);
      stats.num_device_alloc += 1;
      if (ptr == nullptr) {
        throw_oom(requested, alloc_size, "The device could not provide it.");
      }
    }
    Block* b = new_block();
    b->ptr = static_cast<char*>(ptr);
    b->size = alloc_size;
    b->stream = stream;
    b->pool = &pool;
    if (pool.owner != nullptr) pool.owner->segments += 1;
    stats.segment.increase(1);
    stats.reserved_bytes.increase(static_cast<std::int64_t>(alloc_size));
    return b;
  }

  Block* find_allocated(void* ptr, const char* what) const {
    auto it = allocated.find(ptr);
    XPURT_CHECK(it != allocated.end(), what, "(", hex(ptr), "): not a live allocation of the ", backing->name(),
                " allocator (freed twice, never allocated here, or memory of another device)");
    return it->second;
  }
};

CachingAllocator::CachingAllocator(std::unique_ptr<MemoryBacking> backing, CachingAllocatorConfig config)
    : backing_(std::move(backing)), impl_(std::make_unique<Impl>()) {
  XPURT_CHECK(backing_ != nullptr, "CachingAllocator needs a MemoryBacking, got nullptr");
  impl_->backing = backing_.get();
  impl_->config = config;
}

CachingAllocator::~CachingAllocator() {
  // Return what is cached; live allocations are the caller's leak and are left alone.
  try {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->release_cached_blocks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpuruntime: error while destroying the %s allocator: %s\n", backing_->name().c_str(),
                 e.what());
  }
}

void* CachingAllocator::allocate(std::size_t bytes, StreamId stream) {
  if (bytes == 0) return nullptr;
  XPURT_CHECK(bytes <= kMaxRequest, "allocate(", bytes, " bytes) on ", backing_->name(),
              ": the size is absurd (more than ", format_bytes(kMaxRequest), "); was a negative size converted?");
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.outstanding_events.empty() && s.captures.empty()) s.process_events();
  const std::size_t size = round_size(bytes);
  BlockPool& pool = s.pool_for(size, stream);
  Block* b = s.take_free_block(pool, size, stream);
  if (b == nullptr) {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (size > kSmallSize) {
      s.backing->memory_info(&free_bytes, &total_bytes);
      if (size > total_bytes) {
        s.throw_oom(bytes, 0, detail::str_cat("That is more than the device's total memory."));
      }
    }
    b = s.new_segment(pool, size, bytes, stream);
  }
  s.split(b, size);
  b->allocated = true;
  b->requested = bytes;
  s.allocated.emplace(b->ptr, b);
  const auto block_size = static_cast<std::int64_t>(b->size);
  s.stats.allocation.increase(1);
  s.stats.allocated_bytes.increase(block_size);
  s.stats.requested_bytes.increase(static_cast<std::int64_t>(bytes));
  s.stats.active.increase(1);
  s.stats.active_bytes.increase(block_size);
  if (profiler::recording()) {  // Note [Profiler off cost] (profiler.h)
    profiler::record_allocation(backing_->name(), "allocate", block_size, s.stats.allocated_bytes.current, b->ptr);
  }
  return b->ptr;
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.allocated.find(ptr);
  if (it == s.allocated.end()) s.find_allocated(ptr, "free");  // throws with the explanation
  Block* b = it->second;
  s.allocated.erase(it);
  b->allocated = false;
  s.stats.allocation.decrease(1);
  s.stats.allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
  s.stats.requested_bytes.decrease(static_cast<std::int64_t>(b->requested));
  if (profiler::recording()) {
    profiler::record_allocation(backing_->name(), "free", static_cast<std::int64_t>(b->size),
                                s.stats.allocated_bytes.current, ptr);
  }
  if (!b->stream_uses.empty() || s.config.free_waits_for_own_stream) {
    if (!s.captures.empty()) {
      s.deferred_until_no_capture.push_back(b);
    } else {
      s.insert_events(b);
    }
  } else {
    s.free_block(b);
  }
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mutex);
  Block* b = s.find_allocated(ptr, "record_stream");
  if (stream == b->stream) return;
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
}

bool CachingAllocator::owns(void* ptr) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->allocated.count(ptr) != 0;
}

std::size_t CachingAllocator::allocation_size(void* ptr) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->find_allocated(ptr, "allocation_size")->size;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  XPURT_CHECK(impl_->captures.empty(), "empty_cache() on ", backing_->name(),
              " while a graph capture is underway; call it after capture_end()");
  impl_->release_cached_blocks();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  MemoryStats out = impl_->stats;
  out.memory_limit = static_cast<std::int64_t>(impl_->limit);
  return out;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  MemoryStats& st = impl_->stats;
  for (Stat* stat : {&st.allocation, &st.segment, &st.active, &st.inactive_split, &st.allocated_bytes,
                     &st.requested_bytes, &st.reserved_bytes, &st.active_bytes, &st.inactive_split_bytes}) {
    stat->reset_peak();
  }
}

void CachingAllocator::set_memory_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->limit = bytes;
}

std::size_t CachingAllocator::memory_limit() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->limit;
}

std::vector<SegmentInfo> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Impl& s = *impl_;
  std::unordered_set<const Block*> heads;
  auto add_head = [&](const Block* b) {
    while (b->prev != nullptr) b = b->prev;
    heads.insert(b);
  };
  for (const BlockPool* pool : {&s.small_pool, &s.large_pool}) {
    for (const Block* b : pool->blocks) add_head(b);
  }
  for (const auto& [id, p] : s.private_pools) {
    for (const BlockPool* pool : {&p->small, &p->large}) {
      for (const Block* b : pool->blocks) add_head(b);
    }
  }
  for (const auto& [ptr, b] : s.allocated) add_head(b);
  for (const auto& [event, b] : s.outstanding_events) add_head(b);
  for (const Block* b : s.deferred_until_no_capture) add_head(b);

  std::vector<SegmentInfo> out;
  for (const Block* head : heads) {
    SegmentInfo seg;
    seg.address = reinterpret_cast<std::uintptr_t>(head->ptr);
    seg.stream = head->stream;
    seg.is_large = !head->pool->is_small;
    seg.pool = head->pool->owner != nullptr ? head->pool->owner->id : 0;
    for (const Block* b = head; b != nullptr; b = b->next) {
      seg.size += b->size;
      seg.blocks.push_back({b->size, b->allocated ? b->requested : 0, b->allocated,
                            b->event_count > 0 || (!b->allocated && !b->stream_uses.empty())});
    }
    out.push_back(std::move(seg));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return out;
}

MempoolId CachingAllocator::create_pool() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto pool = std::make_unique<PrivatePool>();
  pool->id = impl_->next_pool_id++;
  pool->small.is_small = true;
  pool->small.owner = pool.get();
  pool->large.owner = pool.get();
  const MempoolId id = pool->id;
  impl_->private_pools.emplace(id, std::move(pool));
  return id;
}

void CachingAllocator::retain_pool(MempoolId pool) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->private_pools.find(pool);
  XPURT_CHECK(it != impl_->private_pools.end() && it->second->use_count > 0, "retain_pool(", pool,
              "): no such live private pool on ", backing_->name());
  it->second->use_count += 1;
}

void CachingAllocator::begin_allocate_to_pool(MempoolId pool, StreamId stream) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl& s = *impl_;
  auto it = s.private_pools.find(pool);
  XPURT_CHECK(it != s.private_pools.end() && it->second->use_count > 0, "begin_allocate_to_pool(", pool,
              "): no such live private pool on ", backing_->name(), "; create it with create_pool()");
  for (const auto& [id, capture_stream] : s.captures) {
    XPURT_CHECK(capture_stream != stream, "begin_allocate_to_pool(", pool, "): stream ", hex(reinterpret_cast<void*>(stream)),
                " already allocates to pool ", id);
  }
  s.captures.emplace_back(pool, stream);
}

void CachingAllocator::end_allocate_to_pool(MempoolId pool) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl& s = *impl_;
  auto it = std::find_if(s.captures.begin(), s.captures.end(), [&](const auto& c) { return c.first == pool; });
  XPURT_CHECK(it != s.captures.end(), "end_allocate_to_pool(", pool, "): the pool is not receiving allocations");
  s.captures.erase(it);
  if (s.captures.empty() && !s.deferred_until_no_capture.empty()) {
    auto deferred = std::move(s.deferred_until_no_capture);
    s.deferred_until_no_capture.clear();
    for (Block* b : deferred) {
      if (!b->stream_uses.empty() || s.config.free_waits_for_own_stream) {
        s.insert_events(b);
      } else {
        s.free_block(b);
      }
    }
  }
}

void CachingAllocator::release_pool(MempoolId pool) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl& s = *impl_;
  auto it = s.private_pools.find(pool);
  XPURT_CHECK(it != s.private_pools.end() && it->second->use_count > 0, "release_pool(", pool,
              "): no such live private pool on ", backing_->name());
  PrivatePool& p = *it->second;
  p.use_count -= 1;
  if (p.use_count == 0) {
    s.release_free_segments(p.small);
    s.release_free_segments(p.large);
    if (p.segments == 0) s.private_pools.erase(it);
  }
}

}  // namespace xpuruntime
