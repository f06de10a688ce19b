// The 64-bit FNV-1a step, the one hash of the project's keys and fingerprints: policy fingerprints (fnv1a_hex,
// policy_serialization.h), the generated kernels' names and source hashes (fused::hash_hex, from an offset basis of
// its own), the device constants' fingerprints (capture_plan.cpp) and the paged cache's prefix keys
// (continuous_batcher.cpp). Header only; not a cryptographic hash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace xpuruntime::detail {

inline constexpr std::uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;

// `hash` (kFnv1aOffset to start) continued over the `n` bytes at `data`.
inline std::uint64_t fnv1a(std::uint64_t hash, const void* data, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

}  // namespace xpuruntime::detail
