// ONNX Runtime's com.microsoft GroupQueryAttention and the registry op it becomes, group_query_attention (Note
// [Group query attention] in core/op_schemas_gqa.cpp; docs/ops.md). Shared by the native engine's lowering and the
// cpu backend's node kernel, so that both accept and refuse the same nodes with the same messages.
#pragma once

#include <cstdint>
#include <vector>

#include "xpuruntime/graph.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::gqa {

// The node's inputs: query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
// sin_cache, then the ones group_query_attention does not implement (position_ids, attention_bias, head_sink,
// k_scale, v_scale, q_norm_weight, k_norm_weight).
inline constexpr std::size_t kTotalSequenceLengthInput = 6;

// The node inputs that become the registry op's inputs, in its order (query, seqlens_k, key?, value?, past_key?,
// past_value?, cos_cache?, sin_cache?).
const std::vector<std::size_t>& registry_inputs();

// Throws UnsupportedOperationError naming the first attribute, input or output of `node` (a com.microsoft
// GroupQueryAttention) that group_query_attention does not implement (KV-cache quantization, the sliding-window
// cache, qk_output, position_ids, attention_bias, head_sink, the Q/K norm weights), and InvalidArgumentError for a
// required attribute that is missing or out of range (num_heads, kv_num_heads, local_window_size).
void check_supported(const Node& node);

// The registry op's attributes for `node_attrs` (already checked by check_supported), with the value of the
// node's total_sequence_length input.
Attributes registry_attributes(const Attributes& node_attrs, std::int64_t total_sequence_length);

}  // namespace xpuruntime::gqa
