// Sampling a token from each row of logits where the logits are (Note [Sampling rows where the logits are]): the
// per-row parameters and the arithmetic that the host implementation (generation/row_sampler.cpp) and the CUDA
// kernel (backends/cuda_raw/sample_rows.cu) share, so that both make the same decisions. Internal header of src/cpp,
// C++17 and CUDA: plain functions, callable on the host and, compiled by nvcc, on the device.
//
// Note [Sampling rows where the logits are]
// The host Sampler (Note [Sampling] in generation/sampler.cpp) needs every sampled row's logits on the host: a
// [batch, vocab] copy and a sort-like walk per row each step (about 2 ms a row for a vocabulary of 128,256 on this
// project's CI machine), which at batch 64 is most of a decode step. Sampling where the logits are keeps them there
// and returns only the token ids. Its definition, the same on every device:
//   1. x = the row's logit as float32; for every token id in the row's `seen` list (repetition penalty p != 1)
//      x = x > 0 ? x / p : x * p, once per id; y = x / temperature (greedy rows: y = x).
//   2. A NaN y anywhere: the token is the first NaN (torch.argmax's rule, as the host Sampler's greedy path).
//   3. Candidates are ordered by y, highest first, ties by the lower id: the order of the composite key
//      order_key(y) << 32 | (2^32 - 1 - id), unique per id, highest first. Greedy rows take the first.
//   4. Weights are fixed-point integers, w = rint(exp(y - max y) * 2^40): sums are exact and do not depend on the
//      order they are added in, so every device's reductions agree bit for bit (the exp itself may differ by an
//      ulp between devices: that is where two devices can differ, at a boundary, and nowhere else).
//   5. top_k > 0: the first top_k candidates are kept. top_p < 1: of those, the first candidates whose weights
//      reach ceil(top_p x their sum) (at least one).
//   6. The draw: r = a 64-bit word of Philox4x32-10 (Random123, SC'11) with the key (seed low, seed high) and the
//      counter (counter low, counter high, stream low, stream high); u = floor(r x S / 2^64) for S the kept weights'
//      sum; the token is the kept candidate, in id order, whose running sum of weights first exceeds u. Any fixed
//      order draws from the same distribution; id order lets a GPU block find it with one prefix sum.
// `stream` names the row (the generator's row index, the batcher's request id) and `counter` its step (the tokens it
// has made), so a row's draws do not depend on the rows it is batched with, and the same seed gives the same tokens
// on the same device, every run. These are not the host Sampler's draws (its mt19937_64 stream is sequential): the
// two are different generators of the same distribution, and GenerationConfig.sampling chooses one.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define XPURT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define XPURT_HOST_DEVICE inline
#endif

namespace xpuruntime::row_sampling {

// One row's parameters (Note [Sampling rows where the logits are]).
struct RowParams {
  float temperature = 1.0f;     // > 0
  float top_p = 1.0f;           // (0, 1]; 1: off
  float penalty = 1.0f;         // the repetition penalty; 1: off
  std::int32_t greedy = 0;      // 1: the first candidate (argmax after the penalty), nothing drawn
  std::int64_t top_k = 0;       // 0: off
  std::uint64_t seed = 0;       // the generator's seed
  std::uint64_t stream = 0;     // the row's stream (row index or request id)
  std::uint64_t counter = 0;    // the row's step
};

constexpr int kWeightBits = 40;  // fixed-point weights: vocabularies up to 2^23 sum below 2^63

// Philox4x32-10: out = the 128-bit block of counter `c` under key `k` (Random123's reference).
XPURT_HOST_DEVICE void philox4x32_10(const std::uint32_t c[4], const std::uint32_t k[2], std::uint32_t out[4]) {
  std::uint32_t x0 = c[0], x1 = c[1], x2 = c[2], x3 = c[3], k0 = k[0], k1 = k[1];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * x0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * x2;
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    x0 = hi1 ^ x1 ^ k0;
    x1 = lo1;
    x2 = hi0 ^ x3 ^ k1;
    x3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = x0;
  out[1] = x1;
  out[2] = x2;
  out[3] = x3;
}

// The row's 64-bit random word for its step (step 6 of the Note).
XPURT_HOST_DEVICE std::uint64_t draw_word(const RowParams& p) {
  const std::uint32_t counter[4] = {static_cast<std::uint32_t>(p.counter), static_cast<std::uint32_t>(p.counter >> 32),
                                    static_cast<std::uint32_t>(p.stream), static_cast<std::uint32_t>(p.stream >> 32)};
  const std::uint32_t key[2] = {static_cast<std::uint32_t>(p.seed), static_cast<std::uint32_t>(p.seed >> 32)};
  std::uint32_t out[4];
  philox4x32_10(counter, key, out);
  return (static_cast<std::uint64_t>(out[0]) << 32) | out[1];
}

// floor(r x total / 2^64): a uniform integer in [0, total) for total > 0.
XPURT_HOST_DEVICE std::uint64_t scale_draw(std::uint64_t r, std::uint64_t total) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(r, total);
#else  // the high word of the 128-bit product from 32-bit halves
  const std::uint64_t a_lo = r & 0xFFFFFFFFu, a_hi = r >> 32, b_lo = total & 0xFFFFFFFFu, b_hi = total >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  const std::uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + (lo_hi & 0xFFFFFFFFu);
  return hi_hi + (hi_lo >> 32) + (lo_hi >> 32) + (middle >> 32);
#endif
}

// A float's bits mapped so that unsigned order is the floats' order (NaN excluded: step 2 handles it first).
XPURT_HOST_DEVICE std::uint32_t order_key(float y) {
  std::uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(y);
#else
  std::memcpy(&bits, &y, sizeof(bits));
#endif
  if (y == 0.0f) bits = 0;  // -0 and +0 are one value
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// Step 3's composite key: higher first means a higher y, then a lower id.
XPURT_HOST_DEVICE std::uint64_t candidate_key(float y, std::int64_t id) {
  return (static_cast<std::uint64_t>(order_key(y)) << 32) | (0xFFFFFFFFu - static_cast<std::uint32_t>(id));
}

// Step 4's weight from e = exp(y - max y) in [0, 1].
XPURT_HOST_DEVICE std::uint64_t fixed_weight(float e) {
  const double scaled = static_cast<double>(e) * static_cast<double>(1ull << kWeightBits);
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(rint(scaled));
#else
  return static_cast<std::uint64_t>(__builtin_rint(scaled));
#endif
}

// Step 1's penalty of one logit.
XPURT_HOST_DEVICE float penalized(float x, float penalty) { return x > 0.0f ? x / penalty : x * penalty; }

// Step 5's mass for top_p: ceil(top_p x total), at least 1 and at most total.
XPURT_HOST_DEVICE std::uint64_t nucleus_mass(float top_p, std::uint64_t total) {
  if (total == 0) return 0;
  const double want = static_cast<double>(top_p) * static_cast<double>(total);
  std::uint64_t m = static_cast<std::uint64_t>(want);
  if (static_cast<double>(m) < want) ++m;
  return m < 1 ? 1 : (m > total ? total : m);
}

}  // namespace xpuruntime::row_sampling
