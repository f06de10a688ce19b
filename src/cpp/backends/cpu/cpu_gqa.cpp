// The cpu kernel of group_query_attention (Note [Group query attention] in core/op_schemas_gqa.cpp): ONNX Runtime's
// GroupQueryAttention as its CPU kernel computes it, in float32 with softmax sums in double. It is also what the
// com.microsoft GroupQueryAttention node kernel runs (backends/cpu/onnx/onnx_contrib_attention.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {
namespace {

// The sizes of one launch and where each new row's query, key and value start in the (maybe packed) inputs.
struct GqaDims {
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head = 0, past = 0, present = 0, total = 0;
  std::int64_t q_stride = 0, kv_stride = 0, k_offset = 0, v_offset = 0;  // per (b, s) row, in elements
  bool packed = false, first_prompt = false;
};

GqaDims dims_of(const KernelLaunch& launch) {
  const Attributes& a = launch.desc->attrs;
  const Tensor& q = launch.input(0);
  GqaDims d;
  d.batch = q.shape()[0];
  d.seq = q.shape()[1];
  d.heads = a.get_int("num_heads", 1);
  d.kv_heads = a.get_int("kv_num_heads", 1);
  d.packed = !launch.input(2).defined();
  d.head = q.shape()[2] / (d.packed ? d.heads + 2 * d.kv_heads : d.heads);
  d.past = launch.input(4).defined() ? launch.input(4).shape()[2] : 0;
  d.total = a.get_int("total_sequence_length", 1);
  d.present = std::max(d.total, d.past);
  d.first_prompt = d.seq == d.total;
  d.q_stride = q.shape()[2];
  d.kv_stride = d.packed ? d.q_stride : d.kv_heads * d.head;
  d.k_offset = d.packed ? d.heads * d.head : 0;
  d.v_offset = d.packed ? (d.heads + d.kv_heads) * d.head : 0;
  return d;
}

ScratchVector<float> floats_of(const Tensor& t) {
  ScratchVector<float> out(static_cast<std::size_t>(t.numel()));
  load_elements(t.data_ptr(), t.dtype(), out.data(), t.numel());
  return out;
}

// Rounds `values` to `dtype` (float16 inputs: the rotated Q and K are stored in the input's dtype, as ONNX Runtime
// stores them, before attention reads them).
void round_to(ScratchVector<float>& values, DType dtype) {
  if (dtype == DType::kFloat32) return;
  std::vector<std::uint16_t> bits(values.size());
  const auto n = static_cast<std::int64_t>(values.size());
  store_elements(values.data(), bits.data(), dtype, n);
  load_elements(bits.data(), dtype, values.data(), n);
}

// Rotates the first 2 * half dims of `x` (one head of one row) at position `pos`.
void rotate(float* x, const float* cos, const float* sin, std::int64_t half, bool interleaved) {
  for (std::int64_t i = 0; i < half; ++i) {
    const std::int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const float a = x[i0], b = x[i1];
    x[i0] = a * cos[i] - b * sin[i];
    x[i1] = a * sin[i] + b * cos[i];
  }
}

// Each row's past length p_b (Note [Group query attention]), checked against the inputs.
std::vector<std::int64_t> past_rows(const GqaDims& d, const std::int32_t* seqlens) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(d.batch));
  for (std::int64_t b = 0; b < d.batch; ++b) {
    const std::int64_t length = std::int64_t{seqlens[b]} + 1;
    XPURT_CHECK(length >= 1 && length <= d.present, "op 'group_query_attention': seqlens_k[", b, "] = ", seqlens[b],
                " is out of range [0, ", d.present, ")");
    const std::int64_t p = d.first_prompt ? 0 : length - d.seq;
    XPURT_CHECK(d.first_prompt || p >= 0, "op 'group_query_attention': seqlens_k[", b, "] = ", seqlens[b],
                " is too small for sequence length ", d.seq);
    XPURT_CHECK(p <= d.past, "op 'group_query_attention': seqlens_k[", b, "] = ", seqlens[b], " needs ", p,
                " past rows, but the past key/value hold ", d.past);
    rows[static_cast<std::size_t>(b)] = p;
  }
  return rows;
}

// Applies rotary embeddings to the query heads and the new key heads of `qkv` (rows [B*S, stride]).
void apply_rotary(const KernelLaunch& launch, const GqaDims& d, const std::vector<std::int64_t>& past,
                  ScratchVector<float>& q, ScratchVector<float>& k) {
  const ScratchVector<float> cos = floats_of(launch.input(6));
  const ScratchVector<float> sin = floats_of(launch.input(7));
  const std::int64_t half = launch.input(6).shape()[1];
  const bool interleaved = launch.desc->attrs.get_int("rotary_interleaved", 0) != 0;
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t s = 0; s < d.seq; ++s) {
      const std::int64_t pos = (d.first_prompt ? 0 : past[static_cast<std::size_t>(b)]) + s;
      const float* c = cos.data() + pos * half;
      const float* sn = sin.data() + pos * half;
      float* qrow = q.data() + (b * d.seq + s) * d.q_stride;
      for (std::int64_t n = 0; n < d.heads; ++n) rotate(qrow + n * d.head, c, sn, half, interleaved);
      float* krow = k.data() + (b * d.seq + s) * d.kv_stride + d.k_offset;
      for (std::int64_t n = 0; n < d.kv_heads; ++n) rotate(krow + n * d.head, c, sn, half, interleaved);
    }
  }
}

// present[b, h] = past rows [0, p_b), the new rows at [p_b, p_b + S), zeros elsewhere.
ScratchVector<float> build_present(const GqaDims& d, const Tensor& past_tensor, const ScratchVector<float>& fresh,
                                   std::int64_t offset, const std::vector<std::int64_t>& past) {
  ScratchVector<float> present(static_cast<std::size_t>(d.batch * d.kv_heads * d.present * d.head), 0.0f);
  const ScratchVector<float> old = past_tensor.defined() ? floats_of(past_tensor) : ScratchVector<float>();
  for (std::int64_t b = 0; b < d.batch; ++b) {
    const std::int64_t p = past[static_cast<std::size_t>(b)];
    for (std::int64_t h = 0; h < d.kv_heads; ++h) {
      float* dst = present.data() + (b * d.kv_heads + h) * d.present * d.head;
      if (p > 0) std::copy_n(old.data() + (b * d.kv_heads + h) * d.past * d.head, p * d.head, dst);
      for (std::int64_t s = 0; s < d.seq; ++s) {
        const float* src = fresh.data() + (b * d.seq + s) * d.kv_stride + offset + h * d.head;
        std::copy_n(src, d.head, dst + (p + s) * d.head);
      }
    }
  }
  return present;
}

// The scoring options of one launch.
struct GqaScoring {
  double scale = 1.0, softcap = 0.0;
  std::int64_t window = -1;
  bool smooth = false;
  bool flash_window = false;  // ONNX Runtime's float32 flash path's window for padded queries (Note [Group ...])
};

// One (batch row, query head): output rows [S, H] at `out` (row stride heads * head).
void attend(const GqaDims& d, const GqaScoring& sc, const float* q, const float* keys, const float* values,
            std::int64_t length, std::int64_t past, float* out) {
  std::vector<double> scores(static_cast<std::size_t>(d.present));
  for (std::int64_t s = 0; s < d.seq; ++s) {
    float* o = out + s * d.heads * d.head;
    std::fill_n(o, d.head, 0.0f);
    const std::int64_t end = past + s + 1;
    const std::int64_t hi = std::min(end, length);
    std::int64_t lo = 0;
    if (sc.window > 0) lo = sc.flash_window ? std::max<std::int64_t>(end - sc.window, 0)
                                            : (hi > sc.window ? hi - sc.window : 0);
    if (lo >= hi) continue;
    const float* qs = q + s * d.q_stride;
    double top = sc.smooth ? 0.0 : -INFINITY;
    for (std::int64_t t = lo; t < hi; ++t) {
      double dot = 0.0;
      for (std::int64_t i = 0; i < d.head; ++i) dot += double{qs[i]} * double{keys[t * d.head + i]};
      double x = static_cast<float>(dot * sc.scale);
      if (sc.softcap > 0.0) x = sc.softcap * std::tanh(x / sc.softcap);
      scores[static_cast<std::size_t>(t)] = x;
      top = std::max(top, x);
    }
    double sum = sc.smooth ? std::exp(-top) : 0.0;
    for (std::int64_t t = lo; t < hi; ++t) {
      scores[static_cast<std::size_t>(t)] = std::exp(scores[static_cast<std::size_t>(t)] - top);
      sum += scores[static_cast<std::size_t>(t)];
    }
    std::vector<double> acc(static_cast<std::size_t>(d.head), 0.0);
    for (std::int64_t t = lo; t < hi; ++t) {
      const double p = scores[static_cast<std::size_t>(t)] / sum;
      for (std::int64_t i = 0; i < d.head; ++i) acc[static_cast<std::size_t>(i)] += p * values[t * d.head + i];
    }
    for (std::int64_t i = 0; i < d.head; ++i) o[i] = static_cast<float>(acc[static_cast<std::size_t>(i)]);
  }
}

void run_group_query_attention(const KernelLaunch& launch, const CpuContext& context) {
  const GqaDims d = dims_of(launch);
  const Attributes& a = launch.desc->attrs;
  const DType dtype = launch.input(0).dtype();
  const Tensor& seqlens_tensor = launch.input(1);
  const auto* seqlens = static_cast<const std::int32_t*>(seqlens_tensor.data_ptr());
  const std::vector<std::int64_t> past = past_rows(d, seqlens);
  ScratchVector<float> q = floats_of(launch.input(0));
  ScratchVector<float> k = d.packed ? ScratchVector<float>() : floats_of(launch.input(2));
  const ScratchVector<float> v = d.packed ? ScratchVector<float>() : floats_of(launch.input(3));
  if (a.get_int("do_rotary", 0) != 0) {
    apply_rotary(launch, d, past, q, d.packed ? q : k);
    round_to(q, dtype);
    if (!d.packed) round_to(k, dtype);
  }
  const ScratchVector<float> keys = build_present(d, launch.input(4), d.packed ? q : k, d.k_offset, past);
  const ScratchVector<float> values = build_present(d, launch.input(5), d.packed ? q : v, d.v_offset, past);
  GqaScoring sc;
  const double scale = a.get_float("scale", 0.0);
  sc.scale = scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(static_cast<float>(d.head))) : scale;
  sc.scale = static_cast<float>(sc.scale);
  sc.softcap = static_cast<float>(a.get_float("softcap", 0.0));
  sc.window = a.get_int("local_window_size", -1);
  sc.smooth = a.get_int("smooth_softmax", 0) != 0;
  sc.flash_window = dtype == DType::kFloat32 && a.get_float("softcap", 0.0) == 0.0 && !sc.smooth;
  ScratchVector<float> out(static_cast<std::size_t>(d.batch * d.seq * d.heads * d.head));
  const std::int64_t group = d.heads / d.kv_heads;
  parallel_for(d.batch * d.heads, context.threads, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t b = i / d.heads, n = i % d.heads;
      const std::int64_t cache = (b * d.kv_heads + n / group) * d.present * d.head;
      attend(d, sc, q.data() + b * d.seq * d.q_stride + n * d.head, keys.data() + cache, values.data() + cache,
             std::int64_t{seqlens[b]} + 1, past[static_cast<std::size_t>(b)],
             out.data() + b * d.seq * d.heads * d.head + n * d.head);
    }
  });
  store_elements(out.data(), launch.output(0).data_ptr(), dtype, static_cast<std::int64_t>(out.size()));
  if (launch.num_outputs > 1 && launch.output(1).defined()) {
    store_elements(keys.data(), launch.output(1).data_ptr(), dtype, static_cast<std::int64_t>(keys.size()));
  }
  if (launch.num_outputs > 2 && launch.output(2).defined()) {
    store_elements(values.data(), launch.output(2).data_ptr(), dtype, static_cast<std::int64_t>(values.size()));
  }
}

}  // namespace

void register_gqa_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "group_query_attention",
                 "reference grouped-query attention with a KV cache (ONNX Runtime's GroupQueryAttention): float32, "
                 "softmax sums in double",
                 run_group_query_attention, DTypeSet::kAll);
}

}  // namespace xpuruntime::cpu
