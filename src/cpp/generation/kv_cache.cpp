// ContiguousKvCache (include/xpuruntime/generation.h).
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"

namespace xpuruntime::generation {

// Note [Contiguous KV cache]
// A decoder exported with a cache computes present = Concat(past, new) per layer: its present is its past with the
// step's positions appended, [batch, heads, length + new, head_dim]. Each slot has two buffers of capacity
// [batch, heads, capacity, head_dim] allocated once on the session's device. A step feeds the past as the first
// batch*heads*length*head_dim elements of one buffer, read as a contiguous [batch, heads, length, head_dim] tensor
// (so the engine takes it as it is: no staging copy), and binds the present output (IoBinding) to the same prefix of
// the other buffer at length + new; commit() swaps the two. The cache therefore never leaves the device and nothing
// is allocated per step.
//
// What is still copied per step, and why: the model's own Concat reads the whole past and writes the whole present
// (that is what the exported graph says). The onnxruntime engine writes present straight into the bound buffer;
// the native engine computes it in its plan's memory and copies it into the bound buffer (Note [I/O binding] in
// core/engine.cpp), one more device copy of the cache. The native engine appends in place when the present is bound
// over the past (Note [Cache appended in place] in engines/native/plan/capture_plan.cpp), which the static layout
// below does (one buffer of capacity + 1 positions per slot); this dynamic layout's present is one position longer
// than its past, so for a batch of more than one row it would be a strided view of a max-length buffer, which I/O
// binding does not take as an output: it keeps its two buffers.
//
// The shared form (`shared`): ONNX Runtime's GroupQueryAttention appends in place when its past and present are the
// same buffer (past_present_share_buffer): the past input is then the whole [batch, heads, capacity, head_dim] buffer,
// the step's keys and values are written at each row's own positions (seqlens_k), and the present output is that same
// buffer. The cache then holds one buffer per slot, binds it as both, and nothing copies the cache at all: the
// "present aliases past" of issue 44, on the engines whose GroupQueryAttention implements it (ONNX Runtime's; an engine
// that computes the present elsewhere still gives the right tokens, copying it into the bound buffer).
//
// The padded layout is one length for the whole batch: rows of different prompt lengths are left-padded to the
// longest, and the padding is masked by attention_mask. A paged pool (blocks per request) lifts that, behind the
// same KvCache interface.

ContiguousKvCache::ContiguousKvCache(const std::vector<CacheSlot>& slots, std::int64_t batch, std::int64_t capacity,
                                     Device device, bool shared)
    : batch_(batch), capacity_(capacity), shared_(shared) {
  XPURT_CHECK(batch > 0 && capacity > 0, "ContiguousKvCache: batch and capacity must be positive, got ", batch,
              " and ", capacity);
  buffers_.reserve(slots.size());
  for (const CacheSlot& slot : slots) {
    Buffers b{slot, {}};
    b.buffer[0] = Tensor::zeros({batch, slot.heads, capacity, slot.head_dim}, slot.dtype, device);
    b.buffer[1] = shared ? b.buffer[0] : Tensor::zeros({batch, slot.heads, capacity, slot.head_dim}, slot.dtype, device);
    buffers_.push_back(std::move(b));
  }
}

Tensor ContiguousKvCache::view(const Buffers& b, int which, std::int64_t positions) const {
  const Tensor& buffer = b.buffer[which];
  const std::vector<std::int64_t> shape{batch_, b.slot.heads, positions, b.slot.head_dim};
  return Tensor::from_blob(buffer.data_ptr(), shape, {}, buffer.dtype(), buffer.device(), buffer.storage(),
                           buffer.nbytes());
}

void ContiguousKvCache::bind(IoBinding& binding, std::int64_t new_tokens) {
  XPURT_CHECK(new_tokens > 0, "KvCache::bind: a step adds at least one position, got ", new_tokens);
  XPURT_CHECK(length_ + new_tokens <= capacity_, "the cache holds ", capacity_, " positions; this step needs ",
              length_ + new_tokens, " (raise max_length or lower max_new_tokens)");
  for (const Buffers& b : buffers_) {
    if (shared_) {
      binding.bind_input(b.slot.past_input, b.buffer[0]);
      binding.bind_output(b.slot.present_output, b.buffer[0]);
      continue;
    }
    binding.bind_input(b.slot.past_input, view(b, current_, length_));
    binding.bind_output(b.slot.present_output, view(b, 1 - current_, length_ + new_tokens));
  }
}

void ContiguousKvCache::commit(std::int64_t new_tokens) {
  XPURT_INTERNAL_ASSERT(length_ + new_tokens <= capacity_, "commit past the cache's capacity");
  length_ += new_tokens;
  if (!shared_) current_ = 1 - current_;
}

std::size_t ContiguousKvCache::bytes() const {
  std::size_t total = 0;
  for (const Buffers& b : buffers_) total += b.buffer[0].nbytes() + (shared_ ? 0 : b.buffer[1].nbytes());
  return total;
}

// Note [Static cache layout]
// In the Concat form (present = Concat(past, new)) the past is as long as the sequence so far, so every decode step
// has a new input shape: the native engine builds a plan per length on the first generation to reach it (27 ms a step
// on an H200 for the tiny test decoder, 2026-12-02) and a CUDA graph replays only when a later generation comes back
// to the same lengths. The static layout (transformers' StaticCache, for exports that take attention_mask and
// position_ids) feeds every decode step the whole fixed-capacity cache instead:
//   prefill   as in the dynamic layout: the padded prompt with an empty past; its present [batch, heads, prompt,
//             head_dim] is copied into positions [0, prompt) of the cache buffer;
//   decode    the past is the whole [batch, heads, capacity, head_dim] buffer, attention_mask [batch, capacity + 1]:
//             the row's mask over the positions filled so far, 0 over the rest, 1 for the new token (the present's
//             last position); position_ids the row's own. The present, [batch, heads, capacity + 1, head_dim], is
//             bound to a scratch buffer, and its last position is copied to position length() of the cache (one
//             strided copy per slot). The unfilled positions hold zeros or an earlier generation's values; the mask
//             keeps them out of every row's attention (for one new token the exporters' causal mask allows every
//             key, so the padding mask alone decides).
// Every decode step then has one input signature, so the native engine plans it once and replays it from a CUDA
// graph from its second run. What it costs: each step attends over `capacity` positions instead of the length so
// far, and the model's Concat still copies the whole cache into the present. Models without position_ids cannot use
// it (their positions would come from the past's length, which is now the capacity): kStatic refuses them and kAuto
// keeps them dynamic.

//
// In place (an engine that appends a bound present in place: Note [Cache appended in place] in
// engines/native/plan/capture_plan.cpp): each slot's one buffer is [batch, heads, capacity + 1, head_dim]. A decode
// step feeds its positions [0, capacity) as the past (a strided view: the buffer's rows are one position longer) and
// binds the whole buffer as the present, whose leading capacity positions are then that past: the engine writes only
// the step's new position, the last, and commit copies it to position length(). The prefill binds a present of its
// own (its past is empty), copied into positions [0, prompt). Nothing copies the cache during a decode step, and the
// scratch buffer of the other form is not needed.

StaticKvCache::StaticKvCache(const std::vector<CacheSlot>& slots, std::int64_t batch, std::int64_t capacity,
                             Device device, bool in_place)
    : batch_(batch), capacity_(capacity), in_place_(in_place) {
  XPURT_CHECK(batch > 0 && capacity > 0, "StaticKvCache: batch and capacity must be positive, got ", batch, " and ",
              capacity);
  buffers_.reserve(slots.size());
  for (const CacheSlot& slot : slots) {
    const std::int64_t positions = in_place ? capacity + 1 : capacity;
    Tensor scratch;
    if (!in_place) scratch = Tensor::zeros({batch, slot.heads, capacity + 1, slot.head_dim}, slot.dtype, device);
    buffers_.push_back(
        {slot, Tensor::zeros({batch, slot.heads, positions, slot.head_dim}, slot.dtype, device), std::move(scratch)});
  }
}

Tensor StaticKvCache::positions(const Tensor& t, std::int64_t total, std::int64_t from, std::int64_t count) {
  const std::int64_t heads = t.shape()[1], head_dim = t.shape()[3];
  const std::size_t offset = static_cast<std::size_t>(from * head_dim) * t.element_size();
  return Tensor::from_blob(static_cast<char*>(t.data_ptr()) + offset, {t.shape()[0], heads, count, head_dim},
                           {heads * total * head_dim, total * head_dim, head_dim, 1}, t.dtype(), t.device(),
                           t.storage(), t.nbytes() - offset);
}

void StaticKvCache::bind(IoBinding& binding, std::int64_t new_tokens) {
  XPURT_CHECK(new_tokens > 0, "KvCache::bind: a step adds at least one position, got ", new_tokens);
  XPURT_CHECK(length_ + new_tokens <= capacity_, "the cache holds ", capacity_, " positions; this step needs ",
              length_ + new_tokens, " (raise max_length or lower max_new_tokens)");
  XPURT_CHECK(length_ == 0 || new_tokens == 1, "StaticKvCache: a decode step adds one position, got ", new_tokens);
  for (Buffers& b : buffers_) {
    if (length_ == 0 && in_place_) {  // the prefill: an empty past, a present of its own
      b.present = Tensor::empty({batch_, b.slot.heads, new_tokens, b.slot.head_dim}, b.cache.dtype(), b.cache.device());
      binding.bind_input(b.slot.past_input, positions(b.cache, capacity_ + 1, 0, 0));
      binding.bind_output(b.slot.present_output, b.present);
      continue;
    }
    if (in_place_) {  // a decode step: the past is the buffer's first capacity positions, the present all of it
      binding.bind_input(b.slot.past_input, positions(b.cache, capacity_ + 1, 0, capacity_));
      binding.bind_output(b.slot.present_output, b.cache);
      continue;
    }
    if (length_ == 0) {  // the prefill: an empty past, the present the scratch buffer's first positions, contiguous
      const std::vector<std::int64_t> empty{batch_, b.slot.heads, 0, b.slot.head_dim};
      binding.bind_input(b.slot.past_input, Tensor::from_blob(b.cache.data_ptr(), empty, {}, b.cache.dtype(),
                                                              b.cache.device(), b.cache.storage(), b.cache.nbytes()));
      const std::vector<std::int64_t> shape{batch_, b.slot.heads, new_tokens, b.slot.head_dim};
      binding.bind_output(b.slot.present_output, Tensor::from_blob(b.present.data_ptr(), shape, {}, b.present.dtype(),
                                                                   b.present.device(), b.present.storage(),
                                                                   b.present.nbytes()));
      continue;
    }
    binding.bind_input(b.slot.past_input, b.cache);
    binding.bind_output(b.slot.present_output, b.present);
  }
}

void StaticKvCache::commit(std::int64_t new_tokens) {
  XPURT_INTERNAL_ASSERT(length_ + new_tokens <= capacity_, "commit past the cache's capacity");
  const std::int64_t total = in_place_ ? capacity_ + 1 : capacity_;
  std::vector<Tensor> into;
  std::vector<Tensor> from;
  for (const Buffers& b : buffers_) {
    into.push_back(positions(b.cache, total, length_, new_tokens));
    // The prefill's present is its first positions, contiguous; a decode step's is the scratch buffer's last one, or
    // in place the buffer's own last (positions() views of one buffer, disjoint: no staging copy).
    from.push_back(length_ == 0 ? positions(b.present, new_tokens, 0, new_tokens)
                   : in_place_  ? positions(b.cache, total, capacity_, 1)
                                : positions(b.present, capacity_ + 1, capacity_, 1));
  }
  // One launch for every slot on CUDA (Note [Copies in one launch] in core/tensor.cpp), done before the next step
  // reads the cache.
  copy_tensors(into, from);
  if (in_place_ && length_ == 0) {
    for (Buffers& b : buffers_) b.present = Tensor();  // the prefill's present is in the buffer now
  }
  length_ += new_tokens;
}

std::size_t StaticKvCache::bytes() const {
  std::size_t total = 0;
  for (const Buffers& b : buffers_) total += b.cache.nbytes() + (b.present.defined() ? b.present.nbytes() : 0);
  return total;
}

}  // namespace xpuruntime::generation
