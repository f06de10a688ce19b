// The op schema of group_query_attention (Note [Group query attention]; docs/ops.md) and what the lowering and the
// node kernel of ONNX Runtime's com.microsoft GroupQueryAttention share (core/group_query_attention.h).
//
// Note [Group query attention]
// ONNX Runtime's contrib op GroupQueryAttention is the attention of decoders written by onnxruntime-genai's model
// builder: causal attention with grouped KV heads and a KV cache in BNSH layout, rows right-padded. The registry op
// computes what ONNX Runtime's CPU kernel computes (checked against ONNX Runtime 1.29 by
// tests/python/test_group_query_attention.py):
//   query [B, S, N*H] (or packed [B, S, (N + 2K)*H] with key and value absent), key/value [B, S, K*H],
//   past_key/past_value [B, K, P, H] (optional), seqlens_k int32 [B] (each row's total length - 1),
//   cos_cache/sin_cache [M, R/2] (do_rotary), total_sequence_length (an attribute here: the node's scalar input).
//   Query head n reads KV head n / (N / K). The present length is T = max(total_sequence_length, P).
//   first prompt: S == total_sequence_length; past rows p_b = 0. Otherwise (decode, or a later prompt of batch 1)
//   p_b = seqlens_k[b] + 1 - S, which must lie in [0, P].
//   present[b, :, 0:p_b] = past[b, :, 0:p_b]; present[b, :, p_b:p_b+S] = the new keys/values (rotated keys),
//   every other position 0 (ONNX Runtime's CPU kernel zero-fills a present that is not the past's buffer, which
//   is what a Run without I/O binding gives).
//   Rotary (do_rotary): positions s (first prompt) or p_b + s; the first R dims of each head of Q and K rotate,
//   pairs (2i, 2i+1) when rotary_interleaved, else (i, i + R/2), with cos/sin[pos, i].
//   Query s of row b attends to keys [lo, hi) of the present, hi = min(p_b + s + 1, L_b) (L_b = seqlens_k[b] + 1),
//   scores scaled by `scale` (0: 1/sqrt(H)), then softcap * tanh(x / softcap) when softcap > 0, softmax (smooth:
//   exp(x - m) / (sum + exp(-m)) with m = max(0, max x)), times V.
//   local_window_size W > 0 keeps the W most recent keys. Queries past a row's length (right padding of a batched
//   prompt) are what ONNX Runtime computes there, which depends on its kernel: its float32 flash path (softcap 0,
//   no smooth softmax) takes lo = max(p_b + s + 1 - W, 0) and writes 0 for an empty window; its other path (float16,
//   softcap, smooth softmax) takes lo = hi - W when hi > W. The two agree on every query within a row's length.
// Computation in float32 (float16 inputs converted once; rotated Q and K rounded to the input's dtype, as ONNX
// Runtime does), softmax sums in double. Looser than ONNX Runtime: any head size (it asks for a multiple of 8,
// 16 with rotary) and any even rotary dimension up to H.
#include <string>
#include <vector>

#include "core/group_query_attention.h"
#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace gqa {

const std::vector<std::size_t>& registry_inputs() {
  static const std::vector<std::size_t> inputs = {0, 5, 1, 2, 3, 4, 7, 8};
  return inputs;
}

void check_supported(const Node& node) {
  const std::string where = detail::str_cat("com.microsoft GroupQueryAttention '", node.name, "'");
  const Attributes& a = node.attrs;
  XPURT_CHECK(a.get_int("num_heads", 0) > 0 && a.get_int("kv_num_heads", 0) > 0, where,
              ": attributes num_heads and kv_num_heads must be given and > 0, got ", a.get_int("num_heads", 0), " and ",
              a.get_int("kv_num_heads", 0));
  XPURT_CHECK(a.get_int("num_heads", 0) % a.get_int("kv_num_heads", 1) == 0, where, ": num_heads (",
              a.get_int("num_heads", 0), ") must be a multiple of kv_num_heads (", a.get_int("kv_num_heads", 0), ")");
  const std::int64_t window = a.get_int("local_window_size", -1);
  XPURT_CHECK(window == -1 || window > 0, where, ": local_window_size must be -1 (no window) or > 0, got ", window);
  const auto unsupported = [&](const std::string& what) {
    throw UnsupportedOperationError(detail::str_cat(
        where, ": ", what, " is not implemented by xpuruntime's native engine (group_query_attention, docs/ops.md); "
        "run the model with engine=\"onnxruntime\""));
  };
  if (a.get_string("k_quant_type", "NONE") != "NONE" || a.get_string("v_quant_type", "NONE") != "NONE" ||
      a.get_int("kv_cache_bit_width", 0) != 0) {
    unsupported("the quantized KV cache (k_quant_type, v_quant_type, kv_cache_bit_width)");
  }
  if (a.get_int("sliding_window_cache", 0) != 0) unsupported("attribute sliding_window_cache=1");
  if (a.get_int("qk_output", 0) != 0) unsupported("attribute qk_output");
  static const char* const kInputs[] = {"position_ids", "attention_bias", "head_sink", "k_scale",
                                        "v_scale",      "q_norm_weight",  "k_norm_weight"};
  for (std::size_t i = 9; i < node.inputs.size(); ++i) {
    if (node.has_input(i)) {
      unsupported(detail::str_cat("input ", i, " (", i - 9 < 7 ? kInputs[i - 9] : "unknown", ")"));
    }
  }
  for (std::size_t o = 3; o < node.outputs.size(); ++o) {
    if (!node.outputs[o].empty()) unsupported(detail::str_cat("output ", o, " (output_qk)"));
  }
  XPURT_CHECK(node.has_input(0) && node.has_input(5) && node.has_input(kTotalSequenceLengthInput), where,
              ": inputs query (0), seqlens_k (5) and total_sequence_length (6) are required");
}

Attributes registry_attributes(const Attributes& node_attrs, std::int64_t total_sequence_length) {
  Attributes a;
  a.set("num_heads", node_attrs.get_int("num_heads", 0))
      .set("kv_num_heads", node_attrs.get_int("kv_num_heads", 0))
      .set("total_sequence_length", total_sequence_length)
      .set("scale", node_attrs.get_float("scale", 0.0))
      .set("softcap", node_attrs.get_float("softcap", 0.0))
      .set("local_window_size", node_attrs.get_int("local_window_size", -1))
      .set("do_rotary", node_attrs.get_int("do_rotary", 0))
      .set("rotary_interleaved", node_attrs.get_int("rotary_interleaved", 0))
      .set("smooth_softmax", node_attrs.get_int("smooth_softmax", 0));
  return a;
}

}  // namespace gqa

namespace {

using Shape = std::vector<std::int64_t>;
using detail::shape_str;

bool present(const OpDescriptor& desc, std::size_t i) { return i < desc.inputs.size() && desc.inputs[i].present; }

// Input `i` named `name` is `shape` in query's dtype and on its device.
void check_like_query(const OpDescriptor& desc, std::size_t i, const char* name, const Shape& shape) {
  const TensorDesc& q = desc.inputs[0];
  const TensorDesc& t = desc.inputs[i];
  XPURT_CHECK_TYPE(t.dtype == q.dtype, "op 'group_query_attention': input '", name, "' must be ", dtype_name(q.dtype),
                   " like 'query', got ", dtype_name(t.dtype));
  XPURT_CHECK(t.shape == shape, "op 'group_query_attention': input '", name, "' must have shape ", shape_str(shape),
              ", got ", shape_str(t.shape));
  XPURT_CHECK(t.device == q.device, "op 'group_query_attention': input '", name, "' is on ", t.device.str(),
              " but 'query' is on ", q.device.str());
}

std::vector<TensorDesc> infer_group_query_attention(const OpDescriptor& desc) {
  const TensorDesc& q = desc.inputs[0];
  const Attributes& a = desc.attrs;
  const std::int64_t heads = a.get_int("num_heads", 0), kv_heads = a.get_int("kv_num_heads", 0);
  const std::int64_t total = a.get_int("total_sequence_length", 0), window = a.get_int("local_window_size", -1);
  XPURT_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "op 'group_query_attention': num_heads (", heads,
              ") must be a positive multiple of kv_num_heads (", kv_heads, ")");
  XPURT_CHECK(total >= 1, "op 'group_query_attention': total_sequence_length must be >= 1, got ", total);
  XPURT_CHECK(window == -1 || window > 0, "op 'group_query_attention': local_window_size must be -1 or > 0, got ",
              window);
  XPURT_CHECK_TYPE(q.dtype == DType::kFloat32 || q.dtype == DType::kFloat16,
                   "op 'group_query_attention': input 'query' must be float32 or float16, got ", dtype_name(q.dtype));
  XPURT_CHECK(q.dim() == 3, "op 'group_query_attention': input 'query' must be [batch, sequence, hidden], got ",
              shape_str(q.shape));
  const std::int64_t batch = q.shape[0], seq = q.shape[1];
  const bool packed = !present(desc, 2);
  XPURT_CHECK(packed == !present(desc, 3), "op 'group_query_attention': inputs 'key' and 'value' must both be given "
              "or both be absent (packed QKV)");
  const std::int64_t parts = packed ? heads + 2 * kv_heads : heads;
  XPURT_CHECK(q.shape[2] > 0 && q.shape[2] % parts == 0, "op 'group_query_attention': the last dim of 'query' (",
              q.shape[2], ") must be a positive multiple of ",
              packed ? "num_heads + 2 * kv_num_heads (" : "num_heads (", parts, ")");
  const std::int64_t head = q.shape[2] / parts;
  if (!packed) {
    check_like_query(desc, 2, "key", {batch, seq, kv_heads * head});
    check_like_query(desc, 3, "value", {batch, seq, kv_heads * head});
  }
  XPURT_CHECK(present(desc, 4) == present(desc, 5), "op 'group_query_attention': inputs 'past_key' and 'past_value' "
              "must both be given or both be absent");
  std::int64_t past = 0;
  if (present(desc, 4)) {
    const TensorDesc& pk = desc.inputs[4];
    XPURT_CHECK(pk.dim() == 4, "op 'group_query_attention': input 'past_key' must be [batch, kv_num_heads, "
                "past_sequence, head_size], got ", shape_str(pk.shape));
    past = pk.shape[2];
    check_like_query(desc, 4, "past_key", {batch, kv_heads, past, head});
    check_like_query(desc, 5, "past_value", {batch, kv_heads, past, head});
  }
  const TensorDesc& seqlens = desc.inputs[1];
  XPURT_CHECK_TYPE(seqlens.dtype == DType::kInt32, "op 'group_query_attention': input 'seqlens_k' must be int32, got ",
                   dtype_name(seqlens.dtype));
  XPURT_CHECK(seqlens.shape == Shape{batch}, "op 'group_query_attention': input 'seqlens_k' must have shape [",
              batch, "], got ", shape_str(seqlens.shape));
  const bool first_prompt = seq == total;
  XPURT_CHECK(first_prompt || seq == 1 || batch == 1, "op 'group_query_attention': sequence length ", seq,
              " differs from total_sequence_length ", total, " (not a first prompt), so it must be 1 (decoding) or "
              "the batch must be 1 (a later prompt), got batch ", batch);
  if (a.get_int("do_rotary", 0) != 0) {
    XPURT_CHECK(present(desc, 6) && present(desc, 7), "op 'group_query_attention': do_rotary=1 needs inputs "
                "'cos_cache' and 'sin_cache'");
    const TensorDesc& cos = desc.inputs[6];
    XPURT_CHECK(cos.dim() == 2 && cos.shape[1] >= 1 && cos.shape[1] * 2 <= head && cos.shape[0] >= total,
                "op 'group_query_attention': input 'cos_cache' must be [max_position >= ", total,
                ", rotary_dim / 2 <= ", head / 2, "], got ", shape_str(cos.shape));
    check_like_query(desc, 6, "cos_cache", cos.shape);
    check_like_query(desc, 7, "sin_cache", cos.shape);
  }
  const std::int64_t present_length = std::max(total, past);
  TensorDesc out;
  out.present = true;
  out.dtype = q.dtype;
  out.device = q.device;
  out.shape = {batch, seq, heads * head};
  TensorDesc cache = out;
  cache.shape = {batch, kv_heads, present_length, head};
  return {out, cache, cache};
}

}  // namespace

void register_gqa_ops(KernelRegistry& registry) {
  OpSchema schema;
  schema.name = "group_query_attention";
  schema.family = "attention";
  schema.inputs = {"query", "seqlens_k", "key?", "value?", "past_key?", "past_value?", "cos_cache?", "sin_cache?"};
  schema.outputs = {"output", "present_key", "present_value"};
  schema.doc = "ONNX Runtime's GroupQueryAttention (Note [Group query attention]): query [B, S, N*H] (or packed "
               "QKV), key/value [B, S, K*H], past_key/past_value [B, K, P, H], seqlens_k int32 [B], cos/sin caches; "
               "num_heads, kv_num_heads, total_sequence_length, scale=0, softcap=0, local_window_size=-1, "
               "do_rotary=0, rotary_interleaved=0, smooth_softmax=0 -> output [B, S, N*H], present_key/value "
               "[B, K, max(total, P), H]";
  schema.infer = infer_group_query_attention;
  registry.add_schema(std::move(schema));
}

}  // namespace xpuruntime
