// ContiguousKvCache (include/xpuruntime/generation.h).
#include <cstdint>
#include <memory>
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
// core/engine.cpp), one more device copy of the cache. Appending only the new positions in place (present aliasing
// past in one max-length buffer, as the issue asks) needs the engine to run Concat(past input, new) -> present output
// as a write of `new` at offset `length` of a strided buffer, which neither engine does yet: a native-engine pass
// for it, and then one buffer per slot here instead of two, is the next step (docs/generation.md).
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

}  // namespace xpuruntime::generation
