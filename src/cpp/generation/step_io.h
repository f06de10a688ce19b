// What a generation step feeds and reads, shared by Generation (generator.cpp) and ContinuousBatcher
// (continuous_batcher.cpp): integer matrices for input_ids / attention_mask / position_ids, and the last position's
// logits of one row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xpuruntime/inference_session.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::generation::step_io {

// A host [rows, width - from] tensor of `dtype` (int64 or int32) from columns from.. of equally long rows.
Tensor host_matrix(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t from, DType dtype);

// transformers' position_ids: cumsum(mask) - 1, with padding at 1.
std::vector<std::vector<std::int64_t>> positions_of(const std::vector<std::vector<std::int64_t>>& mask);

// The `vocab` logits of the last position of row `row` of `logits` ([batch, seq, vocab], float32 / float16 /
// bfloat16, any device), as float32. InvalidTypeError for another dtype or rank, naming the output `name`.
std::vector<float> last_position_logits(const Tensor& logits, std::int64_t row, const std::string& name);

// The logits of position `position` of row `row` (last_position_logits for any position).
std::vector<float> position_logits(const Tensor& logits, std::int64_t row, std::int64_t position,
                                   const std::string& name);

// The output `name` of `binding` after its run (an internal error when it was not bound).
Tensor bound_output(const IoBinding& binding, const std::string& name);

// optimum's use_cache_branch feed: a bool [1] on the host.
Tensor cache_branch(bool value);

// a / b rounded up, for a >= 0 and b > 0 (blocks of a length, buckets of a size).
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace xpuruntime::generation::step_io
