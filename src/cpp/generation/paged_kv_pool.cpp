// PagedKvPool (include/xpuruntime/generation.h): fixed-size cache blocks, reference counts, the prefix index.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"

namespace xpuruntime::generation {

// Note [Paged KV pool]
// One tensor per CacheSlot, [heads, num_blocks x block_size, head_dim]: block b is positions [b x B, (b + 1) x B) of
// the position axis, so a run of consecutive blocks is one strided view ([heads, n, head_dim], strides
// [num_blocks x B x head_dim, head_dim, 1]) and read()/write() copy a request's sequence with one Tensor::copy_from
// per run of consecutive block ids (a fresh pool hands out consecutive blocks, so usually one per slot). copy_from
// does the strided copy on the host or with cuda_raw's strided-copy kernel on a GPU. The pool is allocated once;
// allocate() never allocates device memory, so a full pool is a request that waits, not an out-of-memory error.
//
// Reference counts: a block is owned by every request whose block table holds it; prefix sharing adds references
// to full prompt blocks, which are never written again (a request writes only positions past its shared prefix).
// A block whose count drops to 0 is free again (Note [Cached prefixes]).
//
// Note [Cached prefixes]
// A request's prompt blocks are registered under their prefix keys once computed. When the last request holding
// such a block releases it, the block is free but its contents are still that prefix: it stays in the index as a
// cached block (free_blocks() counts it, references() is 0) until allocate() needs it, which takes empty blocks
// first and then cached ones, the least recently released first (dropping their keys). find_prefix() still finds
// a cached block and retain() takes it back, so a request whose prompt starts as a finished one's did (a system
// prompt, a chat's earlier turns, a preempted request coming back) computes only the rest, as vLLM's automatic
// prefix caching. A block is never written while registered: a request writes only positions after its shared
// prefix, into blocks it allocated, and an allocated block has no key until its prompt positions are registered.

PagedKvPool::PagedKvPool(const std::vector<CacheSlot>& slots, std::int64_t num_blocks, std::int64_t block_size,
                         Device device)
    : slots_(slots), block_size_(block_size) {
  XPURT_CHECK(num_blocks > 0 && block_size > 0, "PagedKvPool: num_blocks and block_size must be positive, got ",
              num_blocks, " and ", block_size);
  XPURT_CHECK(!slots.empty(), "PagedKvPool: the model has no cache slots");
  for (const CacheSlot& slot : slots) {
    pools_.push_back(Tensor::zeros({slot.heads, num_blocks * block_size, slot.head_dim}, slot.dtype, device));
  }
  refcount_.assign(static_cast<std::size_t>(num_blocks), 0);
  key_of_.assign(static_cast<std::size_t>(num_blocks), std::nullopt);
  released_at_.assign(static_cast<std::size_t>(num_blocks), 0);
  free_.reserve(static_cast<std::size_t>(num_blocks));
  for (std::int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // back() is the lowest id
}

std::size_t PagedKvPool::bytes() const {
  std::size_t total = 0;
  for (const Tensor& t : pools_) total += t.nbytes();
  return total;
}

std::optional<std::vector<std::int64_t>> PagedKvPool::allocate(std::int64_t count) {
  XPURT_CHECK(count >= 0, "PagedKvPool::allocate: a negative count ", count);
  if (count > free_blocks()) return std::nullopt;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t b = 0;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {  // the least recently released cached block, its prefix forgotten (Note [Cached prefixes])
      b = cached_.begin()->second;
      cached_.erase(cached_.begin());
      prefixes_.erase(*key_of_[static_cast<std::size_t>(b)]);
      key_of_[static_cast<std::size_t>(b)].reset();
    }
    refcount_[static_cast<std::size_t>(b)] = 1;
    out.push_back(b);
  }
  return out;
}

void PagedKvPool::retain(std::int64_t block) {
  XPURT_CHECK(block >= 0 && block < num_blocks(), "PagedKvPool::retain: no block ", block);
  const auto b = static_cast<std::size_t>(block);
  if (refcount_[b] == 0 && key_of_[b]) {  // a cached block taken back (Note [Cached prefixes])
    cached_.erase(released_at_[b]);
  } else {
    XPURT_CHECK(refcount_[b] > 0, "PagedKvPool::retain: block ", block, " is not in use");
  }
  ++refcount_[b];
}

void PagedKvPool::release(const std::vector<std::int64_t>& blocks) {
  // Checked first, so that a bad table releases nothing: each block held at least as often as the table names it
  // (the table's blocks sorted, so that a repeated one is counted once per run of equal ids).
  std::vector<std::int64_t> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size();) {
    const std::int64_t b = sorted[i];
    std::size_t times = 1;
    while (i + times < sorted.size() && sorted[i + times] == b) ++times;
    const bool held =
        b >= 0 && b < num_blocks() && static_cast<std::size_t>(refcount_[static_cast<std::size_t>(b)]) >= times;
    XPURT_CHECK(held, "PagedKvPool::release: block ", b, " is not in use");
    i += times;
  }
  // Last block first: a table's later blocks are cached as released earlier, so they are reused before the blocks
  // their keys chain from (Note [Cached prefixes]: a prefix is found from its first block on).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const std::int64_t b = *it;
    if (--refcount_[static_cast<std::size_t>(b)] > 0) continue;
    if (key_of_[static_cast<std::size_t>(b)]) {  // Note [Cached prefixes]
      released_at_[static_cast<std::size_t>(b)] = ++tick_;
      cached_.emplace(tick_, b);
      continue;
    }
    // Keep free_ descending so that back() stays the lowest id (consecutive blocks for the next request).
    free_.insert(std::upper_bound(free_.begin(), free_.end(), b, std::greater<>()), b);
  }
}

int PagedKvPool::references(std::int64_t block) const {
  XPURT_CHECK(block >= 0 && block < num_blocks(), "PagedKvPool: no block ", block, " (", num_blocks(), " blocks)");
  return refcount_[static_cast<std::size_t>(block)];
}

std::optional<std::int64_t> PagedKvPool::find_prefix(std::uint64_t key) const {
  const auto it = prefixes_.find(key);
  if (it == prefixes_.end()) return std::nullopt;
  return it->second;
}

void PagedKvPool::register_prefix(std::uint64_t key, std::int64_t block) {
  XPURT_CHECK(references(block) > 0, "PagedKvPool::register_prefix: block ", block, " is not in use");
  if (prefixes_.count(key) != 0 || key_of_[static_cast<std::size_t>(block)]) return;  // first come keeps it
  prefixes_[key] = block;
  key_of_[static_cast<std::size_t>(block)] = key;
}

Tensor PagedKvPool::positions(std::size_t slot, std::int64_t position, std::int64_t count) const {
  const Tensor& pool = pools_.at(slot);
  const std::int64_t head_dim = pool.shape()[2];
  const std::int64_t total = pool.shape()[1];
  auto* data = static_cast<char*>(pool.data_ptr()) +
               position * head_dim * static_cast<std::int64_t>(pool.element_size());
  return Tensor::from_blob(data, {pool.shape()[0], count, head_dim}, {total * head_dim, head_dim, 1}, pool.dtype(),
                           pool.device(), pool.storage());
}

template <typename Copy>
void PagedKvPool::for_each_run(const std::vector<std::int64_t>& table, std::int64_t from, std::int64_t count,
                               const Copy& copy) const {
  XPURT_CHECK(from >= 0 && count >= 0 && from + count <= static_cast<std::int64_t>(table.size()) * block_size_,
              "PagedKvPool: positions [", from, ", ", from + count, ") are outside a block table of ", table.size(),
              " blocks of ", block_size_);
  std::int64_t done = 0;
  while (done < count) {
    // The run starts at logical position from + done; it extends while the next logical block is the next
    // physical one.
    const std::int64_t logical = from + done;
    std::size_t block = static_cast<std::size_t>(logical / block_size_);
    const std::int64_t physical = table[block] * block_size_ + logical % block_size_;
    std::int64_t length = std::min(count - done, block_size_ - logical % block_size_);
    while (done + length < count && block + 1 < table.size() && table[block + 1] == table[block] + 1) {
      ++block;
      length = std::min(count - done, length + block_size_);
    }
    copy(physical, done, length);
    done += length;
  }
}

void PagedKvPool::read(const std::vector<std::int64_t>& table, std::int64_t from, std::int64_t count,
                       std::size_t slot, const Tensor& view) const {
  XPURT_CHECK(view.dim() == 3 && view.shape()[1] == count, "PagedKvPool::read: a view of ", count,
              " positions expected, got ", view.str());
  for_each_run(table, from, count, [&](std::int64_t physical, std::int64_t offset, std::int64_t length) {
    Tensor dst = Tensor::from_blob(static_cast<char*>(view.data_ptr()) +
                                       offset * view.strides()[1] * static_cast<std::int64_t>(view.element_size()),
                                   {view.shape()[0], length, view.shape()[2]}, view.strides(), view.dtype(),
                                   view.device(), view.storage());
    dst.copy_from(positions(slot, physical, length));
  });
}

void PagedKvPool::write(const std::vector<std::int64_t>& table, std::int64_t from, std::int64_t count,
                        std::size_t slot, const Tensor& view) {
  XPURT_CHECK(view.dim() == 3 && view.shape()[1] == count, "PagedKvPool::write: a view of ", count,
              " positions expected, got ", view.str());
  for_each_run(table, from, count, [&](std::int64_t physical, std::int64_t offset, std::int64_t length) {
    const Tensor src = Tensor::from_blob(static_cast<char*>(view.data_ptr()) +
                                             offset * view.strides()[1] * static_cast<std::int64_t>(view.element_size()),
                                         {view.shape()[0], length, view.shape()[2]}, view.strides(), view.dtype(),
                                         view.device(), view.storage());
    Tensor dst = positions(slot, physical, length);
    dst.copy_from(src);
  });
}

}  // namespace xpuruntime::generation
