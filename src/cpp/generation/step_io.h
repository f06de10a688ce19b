// What a generation step feeds and reads, shared by Generation (generator.cpp) and ContinuousBatcher
// (continuous_batcher.cpp): integer matrices for input_ids / attention_mask / position_ids, and the last position's
// logits of one row.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/row_sampling.h"
#include "xpuruntime/generation.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::generation::step_io {

// A host [rows, width - from] tensor of `dtype` (int64 or int32) from columns from.. of equally long rows.
Tensor host_matrix(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t from, DType dtype);
// A host tensor of `shape` and `dtype` (int64 or int32) holding `values` in row-major order.
Tensor host_tensor(const std::vector<std::int64_t>& values, const std::vector<std::int64_t>& shape, DType dtype);

// transformers' position_ids: cumsum(mask) - 1, with padding at 1.
std::vector<std::vector<std::int64_t>> positions_of(const std::vector<std::vector<std::int64_t>>& mask);
// positions_of's last value of one non-empty mask row, without the others.
std::int64_t last_position_of(const std::vector<std::int64_t>& mask);

// The rows of `logits` ([batch, seq, vocab], any device) at `positions` (one per row) as a contiguous [batch, vocab]
// on the logits' device (Note [Logits read back] in step_io.cpp): the output itself when seq is 1, else one copy of
// those positions there. InvalidTypeError naming the output `name` for another rank or a position out of range.
Tensor position_rows(const Tensor& logits, const std::vector<std::int64_t>& positions, const std::string& name);

// Row `row` of `rows` ([batch, vocab], float32 / float16 / bfloat16, on the host) as float32. InvalidTypeError for
// another dtype, naming the output `name`.
XPURT_API std::vector<float> host_row(const Tensor& rows, std::int64_t row, const std::string& name);

// The tokens of a step, picked from `rows` (position_rows) for rows [0, count) (Note [Logits read back]).
struct PickedTokens {
  std::vector<std::optional<std::int64_t>> tokens;
  bool on_device = false;  // the argmax was taken where the logits are
};

// When `argmax_only` (every row's Sampler is greedy without a penalty: Sampler::argmax_only) and `rows` is on a CUDA
// device of a build with the argmax_rows kernel, every row's argmax there (Note [Sampling]'s rule: NaN first, ties to
// the lowest id), only the tokens copied back; otherwise `rows` comes to the host once and `sample(i, host_rows)`
// picks row i's token (host_row gives its logits), or nullopt for a row that needs none. Sampled rows of a large
// vocabulary are picked on several threads at once (Note [Rows picked in parallel] in step_io.cpp): `sample` must
// touch only row i's state; an exception it throws is rethrown, the lowest row's when several throw.
using PickRow = std::function<std::optional<std::int64_t>(std::size_t, const Tensor&)>;
XPURT_API PickedTokens pick_tokens(const Tensor& rows, std::size_t count, bool argmax_only, const PickRow& sample);

// The output `name` of `binding` after its run (an internal error when it was not bound).
Tensor bound_output(const IoBinding& binding, const std::string& name);

// optimum's use_cache_branch feed: a bool [1] on the host.
Tensor cache_branch(bool value);

// a / b rounded up, for a >= 0 and b > 0 (blocks of a length, buckets of a size).
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The static layout's prompt (prefill width) bucket (Note [Shape buckets] in generator.cpp): a multiple of 16.
constexpr std::int64_t kPromptBucket = 16;

// The static layout's batch bucket (Note [Shape buckets] in generator.cpp): 1, 2, 4, 8, then a multiple of 8.
inline std::int64_t batch_bucket(std::int64_t rows) {
  if (rows <= 8) {
    std::int64_t b = 1;
    while (b < rows) b *= 2;
    return b;
  }
  return ceil_div(rows, 8) * 8;
}

// Whether a row of `config` whose logits are `logits` draws its tokens with sample_rows (Note [Sampling rows where the
// logits are] in core/row_sampling.h): GenerationConfig.sampling "device", or "auto" where the logits are on a GPU
// (a CPU session's "auto" stays the host Sampler, the same tokens on every platform), for a row that samples or has
// a repetition penalty (a plain greedy row takes the argmax path either way).
inline bool samples_where_logits_are(const GenerationConfig& config, const Tensor& logits) {
  const bool there = config.sampling == SamplingSite::kDevice ||
                     (config.sampling == SamplingSite::kAuto && logits.device().is_cuda());
  return there && (config.do_sample || config.repetition_penalty != 1.0);
}

// The sample_rows parameters of a row of `config`: its stream (row index or request id) and its step.
row_sampling::RowParams row_params(const GenerationConfig& config, std::uint64_t stream, std::uint64_t counter);

// `config.cache_layout` with kAuto resolved for a decoder of `signature` (Note [Static cache layout] in kv_cache.cpp);
// UnsupportedOperationError for kStatic on a model that cannot place a step's token (generator.cpp).
CacheLayout resolve_cache_layout(const DecoderSignature& signature, const GenerationConfig& config);

}  // namespace xpuruntime::generation::step_io
