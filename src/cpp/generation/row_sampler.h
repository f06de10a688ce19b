// Sampling each row of logits where the logits are (Note [Sampling rows where the logits are] in
// core/row_sampling.h): the host implementation, and the dispatch to the CUDA kernel for logits on a GPU. Internal
// header of src/cpp (GenerationConfig.sampling "device" is the public way in).
#pragma once

#include <cstdint>
#include <vector>

#include "core/row_sampling.h"
#include "xpuruntime/export.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::generation {

// The token of one row: `x` its `vocab` float32 logits, `seen` its token ids so far (read when p.penalty != 1).
XPURT_API std::int64_t sample_row_host(const float* x, std::int64_t vocab, const row_sampling::RowParams& p,
                                       const std::vector<std::int64_t>& seen);

// The token of every row of `rows` ([batch, vocab], float32, float16 or bfloat16) by params[r] and seen[r] (one
// entry per row; null: nothing seen): on a CUDA device the sample_rows kernel there, only the tokens copied back
// (UnsupportedOperationError in a build without it); on the CPU sample_row_host. InvalidTypeError for other ranks or
// dtypes, InvalidArgumentError when params or seen do not have a row each.
XPURT_API std::vector<std::int64_t> sample_rows(const Tensor& rows,
                                                const std::vector<row_sampling::RowParams>& params,
                                                const std::vector<const std::vector<std::int64_t>*>& seen);

}  // namespace xpuruntime::generation
