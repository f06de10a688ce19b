// flash_decode: split-K attention for decode steps (Note [Split-K decode attention]); registered and checked in
// flash_attention.cu beside flash_v2, whose Params it takes.
#include "backends/cuda_raw/flash_decode.cuh"

#include <algorithm>
#include <cstdint>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "core/attention_layout.h"

namespace xpuruntime::flash {

// Note [Split-K decode attention]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A decode step's attention has one query row per head (Sq = 1; up to kDecodeMaxSeqQ for speculative steps) against
// the whole cache. flash_v2 gives each (batch, head, 128 query rows) one block that walks every key: at batch 1 that
// is H blocks (32 for a 1B Llama) on a 132-SM device, and each head of a grouped-query group reads its KV head's keys
// again. Here a block owns one KV head and up to kDecodeRows query rows of its group (the group's heads times the
// query positions), so a group's keys and values are read once, and the keys are split among `splits` blocks
// (decode_split: about two blocks per SM in all, at least 128 keys each), as FlashDecoding does.
// Within a block, four warps take tiles of 32 keys in turn. Lane j scores key j of the tile against every row: it
// reads the key's row in 16-byte vectors and the queries from shared memory, pre-scaled into the log2 domain (q *
// scale * log2(e); the mask is added times log2(e), as flash_v2 does). The warp keeps each row's running max m and
// sum l (the online softmax), puts the tile's probabilities in shared memory, then accumulates o[r][d] += p[r][j] *
// v[j][d] with its lanes across d (each value row read once, coalesced). The warps' (m, l, o) merge in shared
// memory. With one split the block writes o / l; otherwise it writes (o, m, l) in float32 to the workspace and a
// second kernel merges the splits of each row: M = max_s m_s, l = sum_s l_s 2^(m_s - M), o = sum_s o_s 2^(m_s - M) /
// l. Masks, fully masked rows and the log-sum-exp follow flash_v2 (Notes [flash_v2 additive mask] and [flash_v2
// log-sum-exp]): a row whose every score is -inf ends with M = -inf and l = 0 (NaN, or 0 with
// zero_fully_masked_rows; with uniform_fully_masked_rows a -inf score is kUniformMaskedScore and the row the mean of
// v), and wherever a max is still -inf the exponents are taken against 0 instead, so that no 2^(-inf + inf) appears.
// Deterministic: each warp, block and split sums its keys in a fixed order, and the merges run in a fixed order.

// Note [Value rows in flight]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A warp's pass over its tile's value rows is 32 loads of one row each (a lane's kD / 32 elements), each followed by
// the multiply-adds that need it. Written as one load per iteration of a loop whose trip count is not a constant,
// the loads went one at a time: 32 memory latencies a tile, and a decode step's split has one or two tiles a warp.
// The kernel took 15.4 us a layer for a 1B Llama's 576 cached positions at batch 1 on an H100, for 1.2 MB of keys
// and values. The loop now loads kValuesInFlight rows before using them (the sums added in the same order, so the
// outputs do not change): 9.2 us a layer (llama_generation_bench --profile, 2026-12-06). Still far from the 1.2 MB's
// bandwidth time: at batch 1 the grid is 8 KV heads x 5 splits, 40 blocks.

namespace {

using device::fast_exp2;  // ex2.approx.ftz: 2^-inf = 0
using device::kLn2;
using device::kLog2e;
using device::to_float;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kValuesInFlight = 8;  // Note [Value rows in flight]
constexpr float kNegInf = -__builtin_huge_valf();

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// What a row's exponents are taken against: its max, or 0 while that is -inf.
__device__ __forceinline__ float exponent_base(float max) { return max == kNegInf ? 0.f : max; }

// kN consecutive elements at `p` (aligned to their size) as float.
template <typename T, int kN>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[kN]) {
  static_assert(kN == 1 || kN == 2 || kN == 4 || kN == 8, "one to eight elements");
  if constexpr (kN == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = to_float(e[i]);
  } else if constexpr (kN == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = to_float(e[i]);
  } else if constexpr (kN == 2) {
    const std::uint32_t raw = *reinterpret_cast<const std::uint32_t*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
    out[0] = to_float(e[0]);
    out[1] = to_float(e[1]);
  } else {
    out[0] = to_float(p[0]);
  }
}

// Element d of query row (b, h, i)'s output from its unnormalised sum `acc`, the row's sum `total` and max `max` (log2
// domain); thread d == 0 also writes the log-sum-exp when asked.
template <typename T>
__device__ __forceinline__ void store_output(const Params& p, int b, int h, int i, int d, float acc, float total,
                                             float max) {
  const bool zero_row = p.zero_fully_masked_rows && total == 0.f;
  const float inverse = total > 0.f ? 1.f / total : (zero_row ? 0.f : __builtin_nanf(""));
  T* o = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + i * p.o_stride[2];
  o[d] = cuda_raw::detail::from_float<T>(zero_row ? 0.f : acc * inverse);
  if (p.lse != nullptr && d == 0) {  // Note [flash_v2 log-sum-exp]
    p.lse[(static_cast<std::int64_t>(b) * p.heads + h) * p.seq_q + i] = (max + log2f(total)) * kLn2;
  }
}

// Row r's score of key `key` (log2 domain, the mask added) for each of this block's `rows` rows, from the key's row
// `k_row` and the pre-scaled queries; -inf for every row when `k_row` is null (past the split's keys).
template <typename T, int kD, bool kMask>
__device__ __forceinline__ void score_key(const Params& p, const float (&q_s)[kDecodeRows][kD],
                                          const T* const* mask_row, int rows, const T* k_row, int key,
                                          float (&s)[kDecodeRows]) {
  constexpr int kR = kDecodeRows;
  if (k_row == nullptr) {
#pragma unroll
    for (int r = 0; r < kR; ++r) s[r] = kNegInf;
    return;
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) s[r] = 0.f;
#pragma unroll
  for (int c = 0; c < kD / 8; ++c) {
    float kf[8];
    load_floats<T, 8>(k_row + c * 8, kf);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float4 a = *reinterpret_cast<const float4*>(&q_s[r][c * 8]);
      const float4 z = *reinterpret_cast<const float4*>(&q_s[r][c * 8 + 4]);
      s[r] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + z.x * kf[4] + z.y * kf[5] + z.z * kf[6] +
              z.w * kf[7];
    }
  }
  if constexpr (kMask) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (r >= rows) continue;
      s[r] += to_float(mask_row[r][key * p.mask_stride_k]) * kLog2e;
      if (p.uniform_fully_masked_rows && s[r] == kNegInf) s[r] = kUniformMaskedScore;
    }
  }
}

template <typename T, int kD, bool kMask>
__global__ void __launch_bounds__(kThreads) flash_decode_kernel(const Params p, const DecodeSplit split,
                                                                float* partial) {
  constexpr int kR = kDecodeRows;
  constexpr int kPerLane = kD / 32;  // output elements per lane
  __shared__ __align__(16) float q_s[kR][kD];
  __shared__ float p_s[kWarps][kR][32];
  __shared__ float m_s[kWarps][kR];
  __shared__ float l_s[kWarps][kR];
  __shared__ float o_s[kWarps][kR][kD];

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int group = p.heads / p.kv_heads;
  const int kv_head = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z) / split.row_chunks;
  const int row0 = (static_cast<int>(blockIdx.z) % split.row_chunks) * kR;
  const int rows = min(kR, group * p.seq_q - row0);
  // Row r of this block: head kv_head * group + (row0 + r) / Sq, query position (row0 + r) % Sq.
  auto head_of = [&](int r) { return kv_head * group + (row0 + r) / p.seq_q; };
  auto position_of = [&](int r) { return (row0 + r) % p.seq_q; };

  for (int idx = static_cast<int>(threadIdx.x); idx < kR * kD; idx += kThreads) {
    const int r = idx / kD, d = idx % kD;
    float value = 0.f;
    if (r < rows) {
      const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + head_of(r) * p.q_stride[1] +
                   position_of(r) * p.q_stride[2];
      value = to_float(q[d]) * p.scale_log2;
    }
    q_s[r][d] = value;
  }
  const T* mask_row[kR] = {};
  if constexpr (kMask) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (r < rows) {
        mask_row[r] = static_cast<const T*>(p.mask) + b * p.mask_stride_b + head_of(r) * p.mask_stride_h +
                      position_of(r) * p.mask_stride_q;
      }
    }
  }
  __syncthreads();

  const int k_begin = static_cast<int>(blockIdx.x) * split.keys_per_split;
  const int k_end = min(p.seq_k, k_begin + split.keys_per_split);
  const T* k_base = static_cast<const T*>(p.k) + b * p.k_stride[0] + kv_head * p.k_stride[1];
  const T* v_base = static_cast<const T*>(p.v) + b * p.v_stride[0] + kv_head * p.v_stride[1];
  float m[kR], l[kR], o[kR][kPerLane];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r] = kNegInf;
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) o[r][e] = 0.f;
  }

  for (int t = k_begin + warp * 32; t < k_end; t += kWarps * 32) {
    const int key = t + lane;
    float s[kR];
    score_key<T, kD, kMask>(p, q_s, mask_row, rows, key < k_end ? k_base + key * p.k_stride[2] : nullptr, key, s);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (r >= rows) continue;
      const float max = fmaxf(m[r], warp_max(s[r]));
      const float base = exponent_base(max);
      const float prob = fast_exp2(s[r] - base);
      const float scale = fast_exp2(m[r] - base);
      l[r] = l[r] * scale + warp_sum(prob);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) o[r][e] *= scale;
      m[r] = max;
      p_s[warp][r][lane] = prob;
    }
    __syncwarp();
    // Note [Value rows in flight]: eight value rows loaded before their multiply-adds, in the same order.
    const int tile_keys = min(32, k_end - t);
    int j = 0;
    for (; j + kValuesInFlight <= tile_keys; j += kValuesInFlight) {
      float vf[kValuesInFlight][kPerLane];
#pragma unroll
      for (int u = 0; u < kValuesInFlight; ++u) {
        load_floats<T, kPerLane>(v_base + (t + j + u) * p.v_stride[2] + lane * kPerLane, vf[u]);
      }
#pragma unroll
      for (int u = 0; u < kValuesInFlight; ++u) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          if (r >= rows) continue;
          const float prob = p_s[warp][r][j + u];
#pragma unroll
          for (int e = 0; e < kPerLane; ++e) o[r][e] += prob * vf[u][e];
        }
      }
    }
    for (; j < tile_keys; ++j) {
      float vf[kPerLane];
      load_floats<T, kPerLane>(v_base + (t + j) * p.v_stride[2] + lane * kPerLane, vf);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r >= rows) continue;
        const float prob = p_s[warp][r][j];
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) o[r][e] += prob * vf[e];
      }
    }
    __syncwarp();
  }

#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (lane == 0) {
      m_s[warp][r] = m[r];
      l_s[warp][r] = l[r];
    }
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) o_s[warp][r][lane * kPerLane + e] = o[r][e];
  }
  __syncthreads();
  const std::int64_t rows_all = static_cast<std::int64_t>(p.batch) * p.heads * p.seq_q;
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * kD; idx += kThreads) {
    const int r = idx / kD, d = idx % kD;
    float max = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max = fmaxf(max, m_s[w][r]);
    const float base = exponent_base(max);
    float total = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = fast_exp2(m_s[w][r] - base);
      total += l_s[w][r] * f;
      acc += o_s[w][r][d] * f;
    }
    const int h = head_of(r), i = position_of(r);
    if (gridDim.x == 1) {
      store_output<T>(p, b, h, i, d, acc, total, max);
    } else {
      const std::int64_t row = (static_cast<std::int64_t>(b) * p.heads + h) * p.seq_q + i;
      float* out = partial + (static_cast<std::int64_t>(blockIdx.x) * rows_all + row) * (kD + 2);
      out[d] = acc;
      if (d == 0) {
        out[kD] = max;
        out[kD + 1] = total;
      }
    }
  }
}

// One warp per query row: the splits' partial results merged (Note [Split-K decode attention]).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) flash_decode_combine_kernel(const Params p, int splits,
                                                                        const float* partial) {
  constexpr int kPerLane = kD / 32;
  const std::int64_t rows_all = static_cast<std::int64_t>(p.batch) * p.heads * p.seq_q;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows_all) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float max = kNegInf;
  for (int s = 0; s < splits; ++s) max = fmaxf(max, partial[(s * rows_all + row) * (kD + 2) + kD]);
  const float base = exponent_base(max);
  float total = 0.f, acc[kPerLane] = {};
  for (int s = 0; s < splits; ++s) {
    const float* part = partial + (s * rows_all + row) * (kD + 2);
    const float f = fast_exp2(part[kD] - base);
    total += part[kD + 1] * f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[e] += part[lane + 32 * e] * f;
  }
  const int i = static_cast<int>(row % p.seq_q);
  const int h = static_cast<int>(row / p.seq_q % p.heads);
  const int b = static_cast<int>(row / (static_cast<std::int64_t>(p.seq_q) * p.heads));
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) store_output<T>(p, b, h, i, lane + 32 * e, acc[e], total, max);
}

template <typename T, int kD, bool kMask>
cudaError_t launch(const Params& p, const DecodeSplit& split, float* workspace, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(split.splits), static_cast<unsigned>(p.kv_heads),
                  static_cast<unsigned>(p.batch * split.row_chunks));
  flash_decode_kernel<T, kD, kMask><<<grid, kThreads, 0, stream>>>(p, split, workspace);
  if (split.splits > 1) {
    const std::int64_t rows_all = static_cast<std::int64_t>(p.batch) * p.heads * p.seq_q;
    flash_decode_combine_kernel<T, kD><<<static_cast<unsigned>((rows_all + kWarps - 1) / kWarps), kThreads, 0,
                                         stream>>>(p, split.splits, workspace);
  }
  return cudaGetLastError();
}

template <typename T, int kD>
cudaError_t launch_for_mask(const Params& p, bool mask, const DecodeSplit& split, float* workspace,
                            cudaStream_t stream) {
  return mask ? launch<T, kD, true>(p, split, workspace, stream) : launch<T, kD, false>(p, split, workspace, stream);
}

template <typename T>
cudaError_t launch_for_head_dim(const Params& p, int head_dim, bool mask, const DecodeSplit& split, float* workspace,
                                cudaStream_t stream) {
  switch (head_dim) {
    case 32: return launch_for_mask<T, 32>(p, mask, split, workspace, stream);
    case 64: return launch_for_mask<T, 64>(p, mask, split, workspace, stream);
    case 128: return launch_for_mask<T, 128>(p, mask, split, workspace, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

DecodeSplit decode_split(const Params& params, int multiprocessors) {
  DecodeSplit split;
  const int group = params.heads / std::max(params.kv_heads, 1);
  split.row_chunks = (group * params.seq_q + kDecodeRows - 1) / kDecodeRows;
  const long long blocks = static_cast<long long>(params.batch) * params.kv_heads * split.row_chunks;
  const long long wanted = 2LL * std::max(multiprocessors, 1);
  const long long most = std::max(1, (params.seq_k + 127) / 128);
  const long long splits = std::clamp((wanted + blocks - 1) / std::max(blocks, 1LL), 1LL, most);
  split.keys_per_split = static_cast<int>(((params.seq_k + splits - 1) / splits + 31) / 32 * 32);
  split.splits = (params.seq_k + split.keys_per_split - 1) / split.keys_per_split;
  return split;
}

std::size_t decode_workspace_bytes(const Params& params, int head_dim, const DecodeSplit& split) {
  if (split.splits <= 1) return 0;
  const auto rows = static_cast<std::size_t>(params.batch) * params.heads * params.seq_q;
  return static_cast<std::size_t>(split.splits) * rows * static_cast<std::size_t>(head_dim + 2) * sizeof(float);
}

cudaError_t launch_flash_decode(const Params& params, DType dtype, int head_dim, bool mask, const DecodeSplit& split,
                                float* workspace, cudaStream_t stream) {
  if (params.causal || (split.splits > 1 && workspace == nullptr)) return cudaErrorInvalidValue;
  return dtype == DType::kBFloat16
             ? launch_for_head_dim<__nv_bfloat16>(params, head_dim, mask, split, workspace, stream)
             : launch_for_head_dim<__half>(params, head_dim, mask, split, workspace, stream);
}

}  // namespace xpuruntime::flash
