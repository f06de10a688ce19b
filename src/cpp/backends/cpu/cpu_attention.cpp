// Attention of the cpu backend: y = softmax(q k^T * scale + mask) v per (batch, head), with the S x S scores
// in memory (two GEMMs around a row softmax accumulated in double).
//
// Note [Attention semantics]
//  * Shapes: q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], y [B, H, Sq, Dv]; head h reads kv head
//    h / (H / Hkv) (grouped-query attention; Hkv == H is multi-head, Hkv == 1 multi-query). Each of the four may
//    be held as [B, S, H, D] instead, and q, k, v as parts of a packed [B, S, P, H, D] projection (the `bshd` and
//    `qkv_parts` attributes, Note [Attention layouts] in core/attention_layout.h).
//  * scale: the attribute, or 1/sqrt(D) when it is 0.
//  * mask: additive, broadcast (NumPy rules, right-aligned) to [B, H, Sq, Sk], added after scaling.
//  * causal: top-left aligned, query i sees keys j <= i (PyTorch's is_causal with Sq != Sk). Every row keeps
//    key 0, so causal masking alone never empties a row.
//  * A row whose every visible score is -inf (e.g. a mask of -inf over the whole row) has no softmax: the
//    result is NaN, as in torch.nn.functional.scaled_dot_product_attention; with fully_masked_rows="zero" it is 0,
//    with "uniform" the mean of v over the visible keys (Note [Fully masked attention rows]).
//
// Note [Fully masked attention rows]
//  The attribute fully_masked_rows is "nan" (the default) or "zero". With "zero", a query row whose every visible
//  score (scaled, masked, causal-masked) is -inf gives an output row of 0 instead of NaN; every other row is as with
//  "nan", a row with a NaN score included (it stays NaN). That is softmax, then Where(IsNaN(p), 0, p), then p v, the
//  guard PyTorch's exporters write after the softmax of scaled_dot_product_attention, whenever no score is NaN or
//  +inf (the rows the guard then zeroes are exactly those with every score -inf) and v is finite (0 * v = 0);
//  attention_fusion sets it when it fuses that guard (Note [The NaN guard of fully masked rows] in
//  fusion_transformer.cpp). The log-sum-exp of such a row stays -inf. Kernels: cpu and flash_v2 (its row sum
//  stays 0: 0 is written for 1 / 0) and unfused (cuda_raw's attention softmax writes a 0 row) implement it; cudnn
//  refuses it (cuDNN does not document what its fused softmax gives such a row).
//  With "uniform", every visible score that is -inf (after the mask) takes part as kUniformMaskedScore (-1e30, in
//  core/attention_layout.h), below any finite score: beside a finite score its weight is exp(-1e30 - max) = 0,
//  exactly what -inf gives, and a row of nothing else weighs each visible key 1 / count, so its output is the mean
//  of v over them. That is masked_fill(mask, finfo.min) then softmax, what Hugging Face's DeBERTa (and other
//  eager attentions) write instead of an additive mask: a finite fill that leaves a padded query's row uniform
//  (attention_fusion, Note [Masked-fill scores]); the two agree whenever every finite score of a row exceeds the
//  fill by more than float32's exp range (about 104), which holds for a fill of float16's lowest (-65504) or below.
//  Its log-sum-exp is that of the replaced scores (about -1e30 for such a row). cpu, flash_v2 and unfused
//  implement it; cudnn refuses it.
//
// Note [Attention log-sum-exp]
//  With return_lse=1 the op has a second output lse [B, H, Sq], float32 whatever the input dtype, contiguous:
//  lse[b, h, i] = log(sum_j exp(score_ij)) (natural log) over the keys j row i sees, where score is the scaled,
//  masked, causal-masked score the softmax takes (the first bullets above). This is FlashAttention-2's (and
//  PyTorch's aten::_scaled_dot_product_flash_attention's) `softmax_lse`, from which a backward pass recomputes
//  P = exp(score - lse) without the forward. A row with no finite score (every visible score -inf) has
//  lse = -inf; a row with a NaN score has lse = NaN. The cpu kernel sums the exponentials in double.
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "core/attention_layout.h"

namespace xpuruntime::cpu {

namespace {

// log(sum_j exp(scores[j])) over scores[0, count) in double, given their max and whether one is NaN (Note
// [Attention log-sum-exp]). Reads `scores` before the softmax overwrites them.
double log_sum_exp(const ScratchVector<double>& scores, std::int64_t count, double max_value, bool nan) {
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(max_value)) return max_value;  // no finite score (-inf), or a +inf score (+inf)
  double sum = 0.0;
  for (std::int64_t j = 0; j < count; ++j) sum += std::exp(scores[static_cast<std::size_t>(j)] - max_value);
  return max_value + std::log(sum);
}

// Note [Attention rows in vectors]
// A float32 attention's softmax took each score through double arithmetic and a std::exp call (the cpu kernel's
// largest cost at transformer sizes). A float32 row of kVectorRowKeys visible keys or more now has its scores scaled
// and masked in float (as torch and the GPU kernels compute them) and goes through IsaKernels::softmax_row_f32 (Note
// [Softmax rows in vectors] in cpu_norm.cpp): vectors, masked scores' e^x exactly 0. At [1, 12, 128, 64] an attention
// went from 1077 to 729 us, at 384 keys from 6900 to 3197 us (this machine, 2026-12-05). Shorter rows (under
// kVectorRowKeys), a row that kernel refuses (a NaN or +inf score, or no finite score) and float64 attentions take
// the double path below unchanged. The log-sum-exp output, when asked for, is summed in double over the same float
// scores, so that an attention with it gives the same bits as one without (Note [Attention log-sum-exp]).
//
// Rows of fewer keys than a few vectors spent most of their time in that kernel's scalar tail. The float scores are
// now held with their row stride rounded up to kRowPad floats (one 512-bit vector) and a row goes through the kernel
// padded with -inf scores to that length, so it is whole vectors (the padding's e^x is 0; the P v GEMM reads only the
// real keys): with that, rows of kVectorRowKeys keys and more gain from the kernel too (cpu_softmax_bench's [1, 12,
// 12, 64] attention, one thread: 0.50x ONNX Runtime's speed before, 0.74-1.01x after in runs minutes apart on a
// noisy VM; [16, 12, 24, 64] 0.61x -> 0.65x).
constexpr std::int64_t kVectorRowKeys = 8;
constexpr std::int64_t kRowPad = 16;

// `keys` rounded up to whole kRowPad vectors.
constexpr std::int64_t padded_keys(std::int64_t keys) { return (keys + kRowPad - 1) / kRowPad * kRowPad; }

bool float_row(float* s, const float* mask, const std::vector<std::int64_t>& mask_strides, std::int64_t i,
               std::int64_t visible, std::int64_t seq_k, std::int64_t ld, float scale, bool uniform_masked_rows,
               const IsaKernels& isa, float* row, float* lse) {
  // Loops the compiler vectorises: the mask's row contiguous (its usual layout) or one value (broadcast over keys).
  const float* mask_row = mask != nullptr ? mask + i * mask_strides[2] : nullptr;
  const std::int64_t mask_step = mask_strides[3];
  if (mask_row == nullptr) {
    for (std::int64_t j = 0; j < visible; ++j) row[j] = s[j] * scale;
  } else if (mask_step == 1) {
    for (std::int64_t j = 0; j < visible; ++j) row[j] = s[j] * scale + mask_row[j];
  } else if (mask_step == 0) {
    const float term = mask_row[0];
    for (std::int64_t j = 0; j < visible; ++j) row[j] = s[j] * scale + term;
  } else {
    for (std::int64_t j = 0; j < visible; ++j) row[j] = s[j] * scale + mask_row[j * mask_step];
  }
  if (uniform_masked_rows) {
    constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < visible; ++j) row[j] = row[j] == kMinusInf ? kUniformMaskedScore : row[j];
  }
  const std::int64_t padded = std::min(padded_keys(visible), ld);
  std::fill(row + visible, row + padded, -std::numeric_limits<float>::infinity());
  if (!isa.softmax_row_f32(row, s, padded)) return false;  // s untouched: the double path recomputes the row
  if (lse != nullptr) {  // a finite maximum here (softmax_row_f32 refused the others)
    double top = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (std::int64_t j = 0; j < visible; ++j) top = std::max(top, static_cast<double>(row[j]));
    for (std::int64_t j = 0; j < visible; ++j) sum += std::exp(static_cast<double>(row[j]) - top);
    *lse = static_cast<float>(top + std::log(sum));
  }
  for (std::int64_t j = padded; j < seq_k; ++j) s[j] = 0.0f;
  return true;
}

template <typename T>
void run_attention(const KernelLaunch& launch, const CpuContext& context) {
  const OpDescriptor& desc = *launch.desc;
  const Tensor& q_tensor = launch.input(0);
  const Tensor& k_tensor = launch.input(1);
  const Tensor& v_tensor = launch.input(2);
  const Tensor mask_tensor = launch.num_inputs > 3 ? launch.input(3) : Tensor();
  // [B, H, S, D] views of what may be held as [B, S, H, D] (Note [Attention layouts]).
  const AttentionLayout layout = AttentionLayout::of(desc.attrs);
  const auto dims = layout.dims(q_tensor.shape(), k_tensor.shape(), v_tensor.shape());
  const std::int64_t batch = dims[0][0], heads = dims[0][1];
  const std::int64_t seq_q = dims[0][2], head_dim = dims[0][3];
  const std::int64_t kv_heads = dims[1][1], seq_k = dims[1][2];
  const std::int64_t value_dim = dims[2][3];
  // Plain references, not a structured binding: the per-head lambda below captures them (clang before 16 cannot
  // capture a binding).
  const auto views = layout.views(q_tensor.shape(), k_tensor.shape(), v_tensor.shape());
  const auto& qv = views[0];
  const auto& kv_view = views[1];
  const auto& vv = views[2];
  const auto& yv = views[3];
  const std::int64_t group = heads / kv_heads;
  const bool causal = desc.attrs.get_int("causal", 0) != 0;
  const FullyMaskedRows masked_rows = fully_masked_rows_of(desc.attrs);  // Note [Fully masked attention rows]
  const bool zero_masked_rows = masked_rows == FullyMaskedRows::kZero;
  const bool uniform_masked_rows = masked_rows == FullyMaskedRows::kUniform;
  double scale = desc.attrs.get_float("scale", 0.0);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const IsaKernels& isa = isa_of(context);

  InputBuffer<T> q(q_tensor);
  InputBuffer<T> k(k_tensor);
  InputBuffer<T> v(v_tensor);
  InputBuffer<T> mask(mask_tensor);
  OutputBuffer<T> y(launch.output(0));
  // Note [Attention log-sum-exp]: the op schema made output 1 float32 [B, H, Sq] when return_lse is 1.
  float* lse = nullptr;
  if (desc.attrs.get_int("return_lse", 0) != 0) {
    XPURT_INTERNAL_ASSERT(launch.num_outputs == 2 && launch.output(1).dtype() == DType::kFloat32 &&
                              launch.output(1).numel() == batch * heads * seq_q,
                          "attention with return_lse=1 needs a float32 [B, H, Sq] second output");
    lse = static_cast<float*>(launch.output(1).data_ptr());
  }
  std::vector<std::int64_t> mask_strides(4, 0);
  if (mask.data() != nullptr) mask_strides = broadcast_strides(mask_tensor.shape(), {batch, heads, seq_q, seq_k});

  // Note [Attention rows in vectors]: float rows that take the vector kernel are held kRowPad-aligned.
  const bool vector_rows = std::is_same_v<T, float> && seq_k >= kVectorRowKeys;
  const std::int64_t ld = vector_rows ? padded_keys(seq_k) : seq_k;
  // One (batch, head): its scores in `scores` (seq_q x ld), its GEMMs and rows on `ctx`'s threads.
  const auto run_head = [&](std::int64_t b, std::int64_t h, const CpuContext& ctx, T* scores) {
    const std::int64_t kv = h / group;
    const T* q_head = q.data() + qv.offset + b * qv.stride_b + h * qv.stride_h;
    const T* k_head = k.data() + kv_view.offset + b * kv_view.stride_b + kv * kv_view.stride_h;
    const T* v_head = v.data() + vv.offset + b * vv.stride_b + kv * vv.stride_h;
    T* y_head = y.data() + yv.offset + b * yv.stride_b + h * yv.stride_h;
    float* lse_head = lse != nullptr ? lse + (b * heads + h) * seq_q : nullptr;
    gemm<T>(ctx, true, seq_q, seq_k, head_dim, q_head, qv.stride_s, k_head, kv_view.stride_s, scores, ld);
    const T* mask_head = mask.data() != nullptr ? mask.data() + b * mask_strides[0] + h * mask_strides[1] : nullptr;
    parallel_for(seq_q, ctx.threads,
                 std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(seq_k, 1)),
                 [&](std::int64_t begin, std::int64_t end) {
                   ScratchVector<double> row(static_cast<std::size_t>(seq_k));
                   ScratchVector<float> row_f32(vector_rows ? static_cast<std::size_t>(ld) : 0);
                   for (std::int64_t i = begin; i < end; ++i) {
                     T* s = scores + i * ld;
                     const std::int64_t visible = causal ? std::min(seq_k, i + 1) : seq_k;
                     if constexpr (std::is_same_v<T, float>) {  // Note [Attention rows in vectors]
                       if (visible >= kVectorRowKeys &&
                           float_row(s, mask_head, mask_strides, i, visible, seq_k, ld, static_cast<float>(scale),
                                     uniform_masked_rows, isa, row_f32.data(),
                                     lse_head != nullptr ? lse_head + i : nullptr)) {
                         continue;
                       }
                     }
                     double max_value = -std::numeric_limits<double>::infinity();
                     bool nan = false;
                     for (std::int64_t j = 0; j < visible; ++j) {
                       double value = static_cast<double>(s[j]) * scale;
                       if (mask_head != nullptr) {
                         value += static_cast<double>(mask_head[i * mask_strides[2] + j * mask_strides[3]]);
                       }
                       if (uniform_masked_rows && value == -std::numeric_limits<double>::infinity()) {
                         value = static_cast<double>(kUniformMaskedScore);
                       }
                       row[j] = value;
                       nan = nan || value != value;
                       max_value = std::max(max_value, value);
                     }
                     if (lse_head != nullptr) {
                       lse_head[i] = static_cast<float>(log_sum_exp(row, visible, max_value, nan));
                     }
                     if (zero_masked_rows && !nan && max_value == -std::numeric_limits<double>::infinity()) {
                       for (std::int64_t j = 0; j < seq_k; ++j) s[j] = T(0);  // every visible score -inf
                       continue;
                     }
                     double sum = 0.0;
                     for (std::int64_t j = 0; j < visible; ++j) {
                       // exp in the compute type, the sum in double; NaN when max_value is -inf (no
                       // visible key).
                       row[j] = static_cast<double>(std::exp(static_cast<T>(row[j] - max_value)));
                       sum += row[j];
                     }
                     for (std::int64_t j = 0; j < visible; ++j) {
                       s[j] = nan ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(row[j] / sum);
                     }
                     for (std::int64_t j = visible; j < seq_k; ++j) s[j] = T(0);
                   }
                 });
    gemm<T>(ctx, false, seq_q, value_dim, seq_k, scores, ld, v_head, vv.stride_s, y_head, yv.stride_s);
  };
  // Note [Attention heads over the threads]
  // The heads ran one after another, each GEMM and row loop spread over the threads: a head's GEMMs of under 256K
  // multiply-adds run on one thread (packed_gemm: small products do not wake threads), so short sequences left all
  // but one core idle. With at least two heads per thread, the threads now take whole heads, each on one thread (its
  // GEMMs' and rows' bits do not depend on the thread count, so neither do the outputs); otherwise as before.
  const std::int64_t all_heads = batch * heads;
  if (context.threads > 1 && all_heads >= 2 * context.threads) {
    CpuContext one = context;
    one.threads = 1;
    parallel_for(all_heads, context.threads, 1, [&](std::int64_t begin, std::int64_t end) {
      ScratchVector<T> scores(static_cast<std::size_t>(seq_q * ld));
      for (std::int64_t i = begin; i < end; ++i) run_head(i / heads, i % heads, one, scores.data());
    });
  } else {
    ScratchVector<T> scores(static_cast<std::size_t>(seq_q * ld));
    for (std::int64_t i = 0; i < all_heads; ++i) run_head(i / heads, i % heads, context, scores.data());
  }
  y.commit();
}

template <typename T>
struct Attention {
  static void run(const KernelLaunch& l, const CpuContext& c) { run_attention<T>(l, c); }
};

}  // namespace

void register_attention_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "attention",
                 "reference attention: q k^T GEMM, scaled/masked/causal softmax (sums in double), P v GEMM (GQA, any "
                 "head dim, log-sum-exp output)",
                 typed_run<Attention>());
}

}  // namespace xpuruntime::cpu
