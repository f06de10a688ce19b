// sample_rows: one token from each row of logits, on the device (Note [Sampling rows where the logits are] in
// core/row_sampling.h: its definition, which the host implementation in generation/row_sampler.cpp shares).
//
// Note [Sampling rows in one block]
// A block of kSampleThreads threads per row, over the row's float32 values y in the workspace:
//   - y written (penalty and temperature applied), then one reduction for the first NaN and the largest y;
//   - top_k: a radix select of the top_k-th largest candidate key (64 bits, 8 passes of 8-bit digits from the top:
//     a 256-bin histogram of the candidates matching the digits chosen so far, integer atomics in shared memory, then
//     one thread walks the bins from the highest). Candidate keys are unique (the id is part of them), so "key >= the
//     selected key" keeps exactly top_k. The lanes of a warp that add to one bin add their values first and one of
//     them adds the sum (Note [Histograms of similar keys]);
//   - top_p: the same select over the kept candidates' fixed-point weights instead of counts, down to the exact key
//     where the running weight from the top first reaches ceil(top_p x the kept sum);
//   - the draw: each thread sums the kept weights of a contiguous chunk of ids, a block-wide exclusive scan gives each
//     chunk's start, and the thread whose chunk holds u walks it.
// Every sum is an integer sum, so its value does not depend on the order the atomics and the scan add in: the
// tokens are the same every run. About 20 passes over the row's values (all of them when top_k and top_p are set);
// the rows run in parallel, one block each.
#include <cstdint>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "core/row_sampling.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers
namespace rs = ::xpuruntime::row_sampling;

constexpr int kSampleThreads = 1024;
constexpr int kWarps = kSampleThreads / 32;

struct RowState {
  std::uint64_t threshold;  // the smallest kept candidate key (0: every candidate)
  std::uint64_t total;      // the kept weights' sum
  std::uint64_t remaining;  // a select's count or weight still to find
  float top;                // the largest y
  std::int64_t first_nan;
};

__device__ __forceinline__ std::uint64_t weight_of(float y, float top) {
  return y == top ? (1ull << rs::kWeightBits) : rs::fixed_weight(expf(y - top));
}

// Sum of `v` over the block (every thread gets it); `scratch` holds kWarps values.
__device__ std::uint64_t block_sum(std::uint64_t v, std::uint64_t* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  std::uint64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  return total;
}

// The exclusive prefix of `v` over the block's threads in order; `scratch` holds kWarps values.
__device__ std::uint64_t block_exclusive_scan(std::uint64_t v, std::uint64_t* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  std::uint64_t inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const std::uint64_t up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  std::uint64_t before = 0;
  for (int w = 0; w < warp; ++w) before += scratch[w];
  return before + inclusive - v;
}

// Note [Histograms of similar keys]
// The high digits of the keys of one row are nearly all equal (logits of similar size share their exponent), so
// nearly every candidate of a pass adds to one or two bins: one shared-memory atomic per candidate would serialise
// the whole row's adds on one address, some twenty passes of them. add_to_bin makes one atomic per distinct bin per
// warp instead: the lanes are grouped by bin (__match_any_sync), each group sums its values by
// shuffles within the group, and its lowest lane adds the sum. Every lane of the warp must call it together (the loops
// that call it step whole warps over the row); `active` false adds nothing.
__device__ __forceinline__ void add_to_bin(std::uint64_t* bins, bool active, unsigned bin, std::uint64_t value) {
  const unsigned lane = threadIdx.x % 32;
  const unsigned peers = __match_any_sync(0xffffffffu, active ? bin : 256u + lane);
  if (!active) return;
  std::uint64_t sum = 0;
  if (peers == 0xffffffffu) {  // the whole warp in one bin: a butterfly
    sum = value;
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  } else {
    for (unsigned rest = peers; rest != 0; rest &= rest - 1) sum += __shfl_sync(peers, value, __ffs(rest) - 1);
  }
  if (static_cast<int>(lane) == __ffs(peers) - 1) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&bins[bin]), static_cast<unsigned long long>(sum));
  }
}

// The largest candidate key whose count (by_weight false) or weight from the top reaches state.remaining, among
// candidates with key >= state.threshold (Note [Sampling rows in one block]).
__device__ std::uint64_t radix_select(const float* y, std::int64_t vocab, bool by_weight, RowState& state,
                                      std::uint64_t* bins) {
  std::uint64_t prefix = 0, mask = 0;
  for (int digit = 7; digit >= 0; --digit) {
    const int shift = digit * 8;
    for (int b = threadIdx.x; b < 256; b += blockDim.x) bins[b] = 0;
    __syncthreads();
    for (std::int64_t warp_start = threadIdx.x - threadIdx.x % 32; warp_start < vocab; warp_start += blockDim.x) {
      const std::int64_t i = warp_start + threadIdx.x % 32;
      const float v = i < vocab ? y[i] : 0.0f;
      const std::uint64_t key = rs::candidate_key(v, i);
      const bool active = i < vocab && key >= state.threshold && (key & mask) == prefix;
      add_to_bin(bins, active, static_cast<unsigned>((key >> shift) & 255),
                 active && by_weight ? weight_of(v, state.top) : 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = 0;
      for (int b = 255; b >= 0; --b) {
        if (bins[b] >= state.remaining && bins[b] > 0) {
          chosen = b;
          break;
        }
        state.remaining -= bins[b];
      }
      prefix |= static_cast<std::uint64_t>(chosen) << shift;
      bins[256] = prefix;
      bins[257] = state.remaining;
    }
    __syncthreads();
    prefix = bins[256];
    mask |= 255ull << shift;
    if (threadIdx.x != 0) state.remaining = bins[257];
    __syncthreads();
  }
  return prefix;
}

template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    sample_rows_kernel(const T* logits, std::int64_t vocab, const rs::RowParams* params,
                       const std::int64_t* seen_offsets, const std::int64_t* seen, float* workspace,
                       std::int64_t* out) {
  __shared__ std::uint64_t bins[258];
  __shared__ std::uint64_t scratch[kWarps];
  __shared__ float top_scratch[kWarps];
  __shared__ std::int64_t nan_scratch[kWarps];
  const std::int64_t row = blockIdx.x;
  const rs::RowParams p = params[row];
  const T* x = logits + row * vocab;
  float* y = workspace + row * vocab;
  const float scale = p.greedy ? 1.0f : p.temperature;
  // 1. y, with the penalty (recomputed from the logits, so a repeated id is penalised once).
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) y[i] = to_float(x[i]) / scale;
  __syncthreads();
  if (p.penalty != 1.0f && seen_offsets != nullptr) {
    for (std::int64_t s = seen_offsets[row] + threadIdx.x; s < seen_offsets[row + 1]; s += blockDim.x) {
      const std::int64_t id = seen[s];
      if (id >= 0 && id < vocab) y[id] = rs::penalized(to_float(x[id]), p.penalty) / scale;
    }
  }
  __syncthreads();
  // 2. the first NaN and the largest y.
  RowState state{0, 0, 0, -INFINITY, -1};
  float top = -INFINITY;
  std::int64_t first_nan = vocab;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = y[i];
    if (isnan(v)) {
      first_nan = min(first_nan, i);
    } else {
      top = fmaxf(top, v);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    first_nan = min(first_nan, static_cast<std::int64_t>(__shfl_xor_sync(0xffffffffu, first_nan, offset)));
  }
  if (threadIdx.x % 32 == 0) {
    top_scratch[threadIdx.x / 32] = top;
    nan_scratch[threadIdx.x / 32] = first_nan;
  }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {
    top = fmaxf(top, top_scratch[w]);
    first_nan = min(first_nan, nan_scratch[w]);
  }
  if (first_nan < vocab) {
    if (threadIdx.x == 0) out[row] = first_nan;
    return;
  }
  state.top = top;
  // 3. greedy: the highest candidate key.
  if (p.greedy) {
    state.remaining = 1;
    const std::uint64_t key = radix_select(y, vocab, false, state, bins);
    if (threadIdx.x == 0) out[row] = static_cast<std::int64_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(key));
    return;
  }
  // 5. top_k, then top_p.
  if (p.top_k > 0 && p.top_k < vocab) {
    state.remaining = static_cast<std::uint64_t>(p.top_k);
    state.threshold = radix_select(y, vocab, false, state, bins);
  }
  const auto kept_sum = [&] {
    std::uint64_t sum = 0;
    for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (rs::candidate_key(y[i], i) >= state.threshold) sum += weight_of(y[i], top);
    }
    return block_sum(sum, scratch);
  };
  if (p.top_p < 1.0f) {
    state.remaining = rs::nucleus_mass(p.top_p, kept_sum());
    state.threshold = radix_select(y, vocab, true, state, bins);
  }
  // 6. the draw, in id order (-1 stays only if no chunk held u, which integer sums rule out: the caller checks).
  if (threadIdx.x == 0) out[row] = -1;
  const std::uint64_t total = kept_sum();
  const std::uint64_t u = rs::scale_draw(rs::draw_word(p), total);
  const std::int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const std::int64_t begin = min(vocab, threadIdx.x * chunk), end = min(vocab, begin + chunk);
  std::uint64_t mine = 0;
  for (std::int64_t i = begin; i < end; ++i) {
    if (rs::candidate_key(y[i], i) >= state.threshold) mine += weight_of(y[i], top);
  }
  std::uint64_t running = block_exclusive_scan(mine, scratch);
  if (u >= running && u < running + mine) {
    for (std::int64_t i = begin; i < end; ++i) {
      if (rs::candidate_key(y[i], i) < state.threshold) continue;
      running += weight_of(y[i], top);
      if (u < running) {
        out[row] = i;
        break;
      }
    }
  }
}

}  // namespace

void sample_rows(const void* logits, DType dtype, std::int64_t rows, std::int64_t vocab, const void* params,
                 const std::int64_t* seen_offsets, const std::int64_t* seen, float* workspace, std::int64_t* out,
                 void* stream) {
  if (rows == 0) return;
  XPURT_CHECK(vocab > 0 && vocab < (std::int64_t{1} << 23), "cuda_raw::sample_rows: vocabularies of 1 to 2^23 - 1 ",
              "tokens (fixed-point weights), got ", vocab);
  dispatch_float(dtype, "sample_rows", [&](auto tag) {
    using T = decltype(tag);
    sample_rows_kernel<T><<<static_cast<unsigned>(rows), kSampleThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(logits), vocab, static_cast<const rs::RowParams*>(params), seen_offsets, seen,
        workspace, out);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
