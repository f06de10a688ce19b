// Generator and Generation: the generation loop (include/xpuruntime/generation.h, docs/generation.md).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "generation/row_sampler.h"
#include "generation/step_io.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime::generation {

// Note [The generation loop]
// A Generation left-pads its rows to the longest prompt (pad_token_id, attention_mask 0) and runs:
//   prefill   the whole padded prompt, past empty: [batch, prompt] tokens in, the cache filled to `prompt`;
//   decode    one token per row: input_ids [batch, 1], attention_mask [batch, length + 1] (the padding still 0),
//             position_ids [batch, 1], the past bound from the cache (Note [Contiguous KV cache]).
// In the recompute form (no cache, or CacheMode::kNone) every step feeds the whole sequence so far. Positions count
// the row's real tokens (transformers' cumsum(mask) - 1, padding at 1), so a left-padded row sees the positions it
// would alone. Only the last position's logits are read (Note [Logits read back] in step_io.cpp): on a CUDA session
// a greedy row's token is their argmax taken on the device, otherwise they come to the host, where the Sampler picks
// each row's token. A row ends at a stop token or when the step limit is reached;
// it is fed pad_token_id afterwards (its outputs are ignored) so that the batch keeps its shape, and the
// Generation is done when every row has ended.

using step_io::ceil_div;
using step_io::host_matrix;
using step_io::positions_of;

// Note [Padding sides]
// A batch's rows have different lengths. transformers' exports take them left-padded: padding first with
// attention_mask 0, so every row's last token is the batch's last position and a step appends one position to all
// rows alike (Note [The generation loop]). ONNX Runtime's GroupQueryAttention reads a row's length from seqlens_k
// (sum(attention_mask) - 1 in onnxruntime-genai's graphs) and takes the row's tokens to be the first seqlens_k + 1
// positions of its cache: rows are right-padded. In that form (PaddingSide::kRight) the prefill feeds the prompts
// right-padded (mask 1 on the prompt, 0 after), the row's first token comes from the logits at its last prompt
// position, and decode step k feeds each row's last token with an attention_mask as wide as the cache's capacity:
// 1 on the row's prompt_length + k positions, 0 on the rest, so that seqlens_k is the row's own position and the
// token's key and value land right after the row's cache, in the shared buffer (Note [Contiguous KV cache]). Every
// decode step then has the same input shapes (ids [batch, 1], mask [batch, capacity], past and present [batch,
// kv_heads, capacity, head_dim]): the native engine plans the decode step once instead of once per length (on the
// test decoder, CPU, the first generation's decode 3.9 -> 0.22 ms per step), which is also what replaying it from a
// CUDA graph needs. position_ids, when the model has them, are the row's own positions.

PaddingSide resolve_padding(const InferenceSession& session, PaddingSide requested) {
  if (requested != PaddingSide::kAuto) return requested;
  for (const NodeExplanation& node : session.explain().nodes) {
    if (node.op_type == "GroupQueryAttention") return PaddingSide::kRight;
  }
  return PaddingSide::kLeft;
}

namespace step_io {

// Note [Static cache layout] in kv_cache.cpp: static needs position_ids and an attention_mask to place the step's
// token. auto takes static wherever the model has both: its decode steps have one shape, so a CUDA session replays
// them from a graph (tests/python/test_generation.py's GPU tests, run on an H200 on 2026-12-02) and every session
// plans them once (the tiny decoder on the CPU: 0.25 against 3.05 ms per step in a first generation, 0.10 against
// 0.15 warm; docs/benchmarks.md); a model without them stays dynamic.
CacheLayout resolve_cache_layout(const DecoderSignature& signature, const GenerationConfig& config) {
  const bool concat_form = !signature.cache.empty() && config.cache != CacheMode::kNone &&
                           config.padding != PaddingSide::kRight;
  const bool placeable = !signature.position_ids.empty() && !signature.attention_mask.empty();
  if (config.cache_layout == CacheLayout::kStatic && concat_form && !placeable) {
    throw UnsupportedOperationError(detail::str_cat(
        "GenerationConfig.cache_layout is 'static' but the model has no ",
        signature.position_ids.empty() ? "position_ids" : "attention_mask",
        " input: a fixed-size past would give its new tokens the wrong positions (", signature.str(),
        "); use cache_layout='dynamic'"));
  }
  if (config.cache_layout != CacheLayout::kAuto) return config.cache_layout;
  return concat_form && placeable ? CacheLayout::kStatic : CacheLayout::kDynamic;
}

}  // namespace step_io

Generator::Generator(const InferenceSession& session, GenerationConfig config)
    : session_(&session), config_(std::move(config)) {
  config_.validate();
  signature_ = DecoderSignature::recognise(session.get_inputs(), session.get_outputs());
  config_.padding = resolve_padding(session, config_.padding);
  config_.cache_layout = step_io::resolve_cache_layout(signature_, config_);
  if (config_.padding == PaddingSide::kRight && signature_.cache.empty()) {
    throw UnsupportedOperationError(detail::str_cat(
        "GenerationConfig.padding is 'right' (the GroupQueryAttention form) but the model has no cache inputs (",
        signature_.str(), ")"));
  }
  if (config_.cache == CacheMode::kRequired && signature_.cache.empty()) {
    throw UnsupportedOperationError(detail::str_cat(
        "GenerationConfig.cache is 'required' but the model has no cache inputs (", signature_.str(),
        "); expected past inputs named like 'past_key_values.0.key' with present outputs like 'present.0.key'"));
  }
}

bool Generator::uses_cache() const { return !signature_.cache.empty() && config_.cache != CacheMode::kNone; }

Generation Generator::start(const std::vector<std::vector<std::int64_t>>& prompts) const {
  return Generation(*session_, signature_, config_, prompts);
}

std::vector<std::vector<std::int64_t>> Generator::generate(const std::vector<std::vector<std::int64_t>>& prompts) const {
  Generation generation = start(prompts);
  while (!generation.done()) generation.step();
  return generation.tokens();
}

// Note [Shape buckets]
// With the static cache layout a generation's decode steps all have one shape, and so do its prefill's; a later
// generation of another batch size, prompt length or token budget would still build (and capture) its own. So the
// static layout rounds each up to a bucket: the batch to 1, 2, 4, 8 or a multiple of 8 (the rows added are one pad
// token each, ended from the start: their outputs are never read and they are not in tokens()), the padded prompt to a
// multiple of 16 (more left padding, masked) and the cache's capacity to a multiple of 64 positions. Generations of
// nearby sizes then run the same plans, and on CUDA replay the same graphs, at the cost of the padding's compute.
// The GroupQueryAttention form (one shared buffer per slot, rows right-padded: Note [Padding sides]) takes the same
// buckets: its prompts are right-padded to the bucket (each row's own length still says where its tokens end) and
// its decode masks are as wide as the bucketed buffer.
namespace {

constexpr std::int64_t kCapacityBucket = 64;

}  // namespace

Generation::Generation(const InferenceSession& session, const DecoderSignature& signature,
                       const GenerationConfig& config, const std::vector<std::vector<std::int64_t>>& prompts)
    : session_(&session), signature_(signature), config_(config), sampler_(config) {
  XPURT_CHECK(!prompts.empty(), "generate: the batch holds no prompt");
  rows_ = static_cast<std::int64_t>(prompts.size());
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    XPURT_CHECK(!prompts[r].empty(), "generate: prompt ", r, " is empty (give at least one token, e.g. BOS)");
    for (std::int64_t t : prompts[r]) XPURT_CHECK(t >= 0, "generate: prompt ", r, " holds a negative token id ", t);
    prompt_length_ = std::max(prompt_length_, static_cast<std::int64_t>(prompts[r].size()));
  }
  const bool ragged = std::any_of(prompts.begin(), prompts.end(),
                                  [&](const auto& p) { return static_cast<std::int64_t>(p.size()) != prompt_length_; });
  XPURT_CHECK(!ragged || !signature_.attention_mask.empty(), "generate: prompts of different lengths are ",
              "left-padded, which needs an attention_mask input; the model has none (run them one at a time)");
  limit_new_ = config_.max_new_tokens;
  if (config_.max_length > 0) {
    XPURT_CHECK(prompt_length_ < config_.max_length, "generate: the longest prompt has ", prompt_length_,
                " tokens, which already reaches max_length ", config_.max_length);
    limit_new_ = std::min(limit_new_, config_.max_length - prompt_length_);
  }
  const bool cached = !signature_.cache.empty() && config_.cache != CacheMode::kNone;
  static_layout_ = cached && config_.padding != PaddingSide::kRight && config_.cache_layout == CacheLayout::kStatic;
  const bool shared_buffer = cached && config_.padding == PaddingSide::kRight;  // the GroupQueryAttention form
  batch_ = rows_;
  std::int64_t capacity = prompt_length_ + limit_new_;
  if (static_layout_ || shared_buffer) {  // Note [Shape buckets]
    batch_ = step_io::batch_bucket(rows_);
    prompt_length_ = ceil_div(prompt_length_, step_io::kPromptBucket) * step_io::kPromptBucket;
    capacity = ceil_div(prompt_length_ + limit_new_, kCapacityBucket) * kCapacityBucket;
  }
  const std::vector<std::int64_t> filler{config_.pad_token_id};
  for (std::int64_t r = 0; r < batch_; ++r) {
    const auto& prompt = r < rows_ ? prompts[static_cast<std::size_t>(r)] : filler;
    const std::size_t pad = static_cast<std::size_t>(prompt_length_) - prompt.size();
    std::vector<std::int64_t> row(pad, config_.pad_token_id);
    row.insert(row.end(), prompt.begin(), prompt.end());
    std::vector<std::int64_t> mask(pad, 0);
    mask.resize(row.size(), 1);
    sequence_.push_back(std::move(row));
    mask_.push_back(std::move(mask));
    seen_.push_back(prompt);
    rngs_.push_back(Sampler::row_stream(config_.seed, r));
    prompt_lengths_.push_back(static_cast<std::int64_t>(prompt.size()));
  }
  generated_.resize(static_cast<std::size_t>(rows_));
  ended_.assign(static_cast<std::size_t>(batch_), false);
  std::fill(ended_.begin() + rows_, ended_.end(), true);  // the bucket's filler rows
  if (static_layout_) {
    // The native engine appends a bound present in place (Note [Cache appended in place]); others take the scratch.
    cache_ = std::make_unique<StaticKvCache>(signature_.cache, batch_, capacity, session.options().device,
                                             /*in_place=*/session.engine() == "native");
  } else if (cached) {
    // The GroupQueryAttention form appends in place into one shared buffer (Note [Contiguous KV cache]).
    cache_ = std::make_unique<ContiguousKvCache>(signature_.cache, batch_, capacity, session.options().device,
                                                 /*shared=*/config_.padding == PaddingSide::kRight);
  }
  right_padded_ = cache_ != nullptr && config_.padding == PaddingSide::kRight;
}

std::vector<std::pair<std::string, Tensor>> Generation::right_padded_feeds(bool prefill) const {
  // Note [Padding sides]: prefill [batch, prompt] right-padded; decode step k one token per row, the mask 1 on the
  // row's prompt_length + k positions of prompt + k.
  const std::int64_t k = prefill ? 0 : steps_;
  const std::int64_t width = prefill ? prompt_length_ : cache_->capacity();  // the shared buffer's (bucketed) length
  std::vector<std::vector<std::int64_t>> ids, mask, positions;
  for (std::int64_t r = 0; r < batch_; ++r) {
    const auto row = static_cast<std::size_t>(r);
    const std::int64_t length = prompt_lengths_[row];
    std::vector<std::int64_t> m(static_cast<std::size_t>(width), 0);
    std::fill_n(m.begin(), length + k, 1);
    if (prefill) {
      std::vector<std::int64_t> tokens = seen_[row];
      tokens.resize(static_cast<std::size_t>(prompt_length_), config_.pad_token_id);
      ids.push_back(std::move(tokens));
      std::vector<std::int64_t> p(static_cast<std::size_t>(prompt_length_));
      for (std::int64_t j = 0; j < prompt_length_; ++j) p[static_cast<std::size_t>(j)] = j < length ? j : 1;
      positions.push_back(std::move(p));
    } else {
      ids.push_back({ended_[row] ? config_.pad_token_id : generated_[row].back()});
      positions.push_back({length + k - 1});
    }
    mask.push_back(std::move(m));
  }
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back(signature_.input_ids, host_matrix(ids, 0, signature_.ids_dtype));
  if (!signature_.attention_mask.empty()) {
    out.emplace_back(signature_.attention_mask, host_matrix(mask, 0, signature_.mask_dtype));
  }
  if (!signature_.position_ids.empty()) {
    out.emplace_back(signature_.position_ids, host_matrix(positions, 0, signature_.positions_dtype));
  }
  if (!signature_.use_cache_branch.empty()) {
    out.emplace_back(signature_.use_cache_branch, step_io::cache_branch(!prefill));
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Generation::static_decode_feeds() const {
  // Note [Static cache layout]: the past is the whole cache; the mask covers its filled positions, 0 on the rest,
  // and 1 for the new token (the present's last position). Each row is written once into one flat buffer, and only
  // the new token's position is summed: building a vector for each row and every position of every row took 0.26
  // ms a step at batch 64 and 577 positions on this machine's CPU, 0.056 ms now (the tests' tiny decoder widened to
  // 640 positions, 48 new tokens after 400; on the H100 the 1B Llama's batch-64 feeds took 0.34-0.64 ms a step).
  const std::int64_t capacity = cache_->capacity();
  const auto rows = static_cast<std::int64_t>(mask_.size());
  std::vector<std::int64_t> ids(static_cast<std::size_t>(rows)), position(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> mask(static_cast<std::size_t>(rows * (capacity + 1)), 0);
  for (std::size_t r = 0; r < mask_.size(); ++r) {
    const std::vector<std::int64_t>& m = mask_[r];  // the past's positions, then the new token's
    std::int64_t* row = mask.data() + static_cast<std::int64_t>(r) * (capacity + 1);
    std::copy(m.begin(), m.end() - 1, row);
    row[capacity] = 1;
    ids[r] = sequence_[r].back();
    position[r] = step_io::last_position_of(m);  // positions_of's value at the new token
  }
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back(signature_.input_ids, step_io::host_tensor(ids, {rows, 1}, signature_.ids_dtype));
  out.emplace_back(signature_.attention_mask, step_io::host_tensor(mask, {rows, capacity + 1}, signature_.mask_dtype));
  out.emplace_back(signature_.position_ids, step_io::host_tensor(position, {rows, 1}, signature_.positions_dtype));
  if (!signature_.use_cache_branch.empty()) out.emplace_back(signature_.use_cache_branch, step_io::cache_branch(true));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Generation::feeds(bool prefill) const {
  if (right_padded_) return right_padded_feeds(prefill);
  if (static_layout_ && !prefill) return static_decode_feeds();
  // The cached decode step feeds only the last position; the prefill and the recompute form feed everything.
  const std::int64_t length = static_cast<std::int64_t>(sequence_.front().size());
  const std::int64_t from = cache_ && !prefill ? length - 1 : 0;
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back(signature_.input_ids, host_matrix(sequence_, from, signature_.ids_dtype));
  if (!signature_.attention_mask.empty()) {
    out.emplace_back(signature_.attention_mask, host_matrix(mask_, 0, signature_.mask_dtype));
  }
  if (!signature_.position_ids.empty()) {
    out.emplace_back(signature_.position_ids, host_matrix(positions_of(mask_), from, signature_.positions_dtype));
  }
  if (!signature_.use_cache_branch.empty()) {
    out.emplace_back(signature_.use_cache_branch, step_io::cache_branch(cache_ != nullptr && !prefill));
  }
  if (!cache_) {
    // The recompute form of a model with a cache: its past fed empty, its present ignored.
    for (const CacheSlot& slot : signature_.cache) {
      out.emplace_back(slot.past_input,
                       Tensor::empty({batch_, slot.heads, 0, slot.head_dim}, slot.dtype, session_->options().device));
    }
  }
  return out;
}

namespace {

double ms_since(std::chrono::steady_clock::time_point* from) {
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - *from).count();
  *from = now;
  return ms;
}

}  // namespace

// Note [Where a decode step goes]
// A decode step's wall time is host work around one run: its feeds made and bound (ids, mask and positions copied to
// the device), the run (a CUDA graph replay and the wait for it: the run's one synchronization), the cache's commit
// (its new positions moved, Note [Static cache layout]) and the tokens picked (the device's argmax read back, or the
// logits read back and sampled). GenerationStats keeps each part's sum over the decode steps, explain() and str()
// print them, so that the host's share of a step (what a faster kernel cannot win back) is measured, not guessed.
Tensor Generation::run(const std::vector<std::pair<std::string, Tensor>>& feeds, std::int64_t new_tokens,
                       GenerationStats* times) {
  auto at = std::chrono::steady_clock::now();
  IoBinding binding = session_->io_binding();
  for (const auto& [name, value] : feeds) binding.bind_input(name, value);
  binding.bind_output(signature_.logits, session_->options().device);  // Note [Logits read back]
  if (cache_) cache_->bind(binding, new_tokens);
  if (times != nullptr) times->decode_feeds_ms += ms_since(&at);
  session_->run_with_binding(binding);
  if (times != nullptr) times->decode_run_ms += ms_since(&at);
  if (cache_) cache_->commit(new_tokens);
  if (times != nullptr) times->decode_commit_ms += ms_since(&at);
  return step_io::bound_output(binding, signature_.logits);
}

std::vector<std::int64_t> Generation::logits_positions(const Tensor& logits, bool prefill) const {
  XPURT_CHECK_TYPE(logits.dim() == 3 && logits.shape()[0] == batch_, "logits output '", signature_.logits,
                   "' should be [batch, seq, vocab] with batch ", batch_, ", got ", logits.str());
  // A right-padded prefill's row ends at its own last prompt position (Note [Padding sides]).
  std::vector<std::int64_t> positions(static_cast<std::size_t>(batch_), logits.shape()[1] - 1);
  if (right_padded_ && prefill && logits.shape()[1] == 1 && prompt_length_ > 1) {
    throw UnsupportedOperationError(detail::str_cat(
        "logits output '", signature_.logits, "' holds only the last position (", logits.str(), "), but the prompts ",
        "are right-padded (GroupQueryAttention form): a shorter row's last prompt position is not the batch's last"));
  }
  if (right_padded_ && prefill) {
    for (std::int64_t r = 0; r < batch_; ++r) {
      positions[static_cast<std::size_t>(r)] = prompt_lengths_[static_cast<std::size_t>(r)] - 1;
    }
  }
  return positions;
}

std::vector<std::optional<std::int64_t>> Generation::step() {
  XPURT_CHECK(!done_, "Generation::step: the generation is done (", steps_, " steps)");
  const auto begin = std::chrono::steady_clock::now();
  const bool prefill = steps_ == 0;
  const std::int64_t new_tokens = prefill ? prompt_length_ : 1;
  // Note [Generation ranges]: the profiler (and Nsight, through NVTX) sees the prefill and the decode steps apart.
  const Profiler::Range range = Profiler::range(prefill ? kPrefillRange : kDecodeRange);
  GenerationStats times;  // Note [Where a decode step goes]
  auto at = std::chrono::steady_clock::now();
  const std::vector<std::pair<std::string, Tensor>> step_feeds = feeds(prefill);
  times.decode_feeds_ms = ms_since(&at);
  const Tensor logits = run(step_feeds, new_tokens, &times);
  at = std::chrono::steady_clock::now();
  // Only the rows' positions are read; greedy tokens are picked where the logits are (Note [Logits read back]).
  const Tensor rows = step_io::position_rows(logits, logits_positions(logits, prefill), signature_.logits);
  sampled_where_logits_are_ = step_io::samples_where_logits_are(config_, rows);
  step_io::PickedTokens picked;
  if (sampled_where_logits_are_) {  // Note [Sampling rows where the logits are]: row r's stream r, its step steps_
    std::vector<row_sampling::RowParams> params;
    std::vector<const std::vector<std::int64_t>*> seen;
    for (std::int64_t r = 0; r < rows.shape()[0]; ++r) {
      params.push_back(step_io::row_params(config_, static_cast<std::uint64_t>(r), static_cast<std::uint64_t>(steps_)));
      seen.push_back(static_cast<std::size_t>(r) < seen_.size() ? &seen_[static_cast<std::size_t>(r)] : nullptr);
    }
    const std::vector<std::int64_t> drawn = sample_rows(rows, params, seen);
    picked.tokens.assign(drawn.begin(), drawn.begin() + std::min<std::int64_t>(batch_, rows.shape()[0]));
  } else {
    picked = step_io::pick_tokens(
        rows, static_cast<std::size_t>(batch_), sampler_.argmax_only(),
        [&](std::size_t r, const Tensor& host) -> std::optional<std::int64_t> {
          if (ended_[r]) return std::nullopt;
          std::vector<float> row = step_io::host_row(host, static_cast<std::int64_t>(r), signature_.logits);
          return sampler_.next(row.data(), static_cast<std::int64_t>(row.size()), seen_[r], rngs_[r]);
        });
  }
  times.decode_pick_ms = ms_since(&at);
  argmax_on_device_ = picked.on_device;
  std::vector<std::optional<std::int64_t>> chosen = std::move(picked.tokens);
  for (std::size_t r = 0; r < chosen.size(); ++r) {
    if (ended_[r]) chosen[r].reset();  // a row that had ended makes no token (the device's argmax took one anyway)
  }
  finish_step(chosen);
  chosen.resize(static_cast<std::size_t>(rows_));  // the bucket's filler rows are not the caller's
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  if (prefill) {
    stats_.prefill_tokens = batch_ * prompt_length_;
    stats_.prefill_ms = ms;
  } else {
    ++stats_.decode_steps;
    stats_.decode_tokens += static_cast<std::int64_t>(
        std::count_if(chosen.begin(), chosen.end(), [](const auto& token) { return token.has_value(); }));
    stats_.decode_ms += ms;
    stats_.decode_feeds_ms += times.decode_feeds_ms;
    stats_.decode_run_ms += times.decode_run_ms;
    stats_.decode_commit_ms += times.decode_commit_ms;
    stats_.decode_pick_ms += times.decode_pick_ms;
  }
  return chosen;
}

GenerationStats Generation::stats() const {
  GenerationStats out = stats_;
  if (cache_) {
    out.cache_length = cache_->length();
    out.cache_capacity = cache_->capacity();
    out.cache_bytes = cache_->bytes();
  }
  return out;
}

std::string Generation::explain() const {
  std::ostringstream os;
  const GenerationStats st = stats();
  const std::int64_t longest = *std::max_element(prompt_lengths_.begin(), prompt_lengths_.begin() + rows_);
  os << "model: " << signature_.str() << "\n";
  os << "rows: " << rows_;
  if (batch_ != rows_) {
    os << ", run as a batch of " << batch_ << " (filler rows " << batch_ - rows_
       << ": the static layout's shape bucket, Note [Shape buckets])";
  }
  os << "; longest prompt " << longest << " tokens, fed as " << prompt_length_ << " positions ("
     << (right_padded_ ? "right" : "left") << "-padded" << (prompt_length_ > longest ? ", bucketed" : "")
     << "); up to " << limit_new_ << " new tokens per row\n";
  os << "cache: ";
  if (!cache_) {
    os << (signature_.cache.empty() ? "none: the model has no cache inputs" : "not used (cache='none')")
       << "; every step recomputes the whole sequence\n";
  } else {
    if (right_padded_) {
      os << "one shared buffer per slot, appended in place (GroupQueryAttention form, Note [Contiguous KV cache])";
    } else if (static_layout_) {
      os << "static layout: every decode step feeds the whole fixed-size cache, one decode shape (Note [Static cache "
            "layout])";
      const auto* fixed = dynamic_cast<const StaticKvCache*>(cache_.get());
      if (fixed != nullptr && fixed->in_place()) {
        os << ", the present bound over the past so that a step writes only its new position (Note [Cache appended "
              "in place])";
      }
    } else {
      os << "dynamic layout: the past as long as the sequence so far, a new shape every step (cache_layout='static' "
            "gives every decode step one shape)";
    }
    os << "; " << signature_.cache.size() << " slots, each " << batch_ << " rows x " << st.cache_capacity
       << " positions, "
       << std::fixed << std::setprecision(1) << static_cast<double>(st.cache_bytes) / 1024.0 << " KiB on "
       << session_->options().device.str() << "; " << st.cache_length << " positions filled ("
       << std::setprecision(0) << st.cache_occupancy() * 100.0 << "%)\n";
  }
  os << std::fixed << std::setprecision(2);
  os << "prefill: " << (steps_ > 0 ? "" : "not run yet; ") << st.prefill_tokens << " tokens in " << st.prefill_ms
     << " ms (" << std::setprecision(0) << st.prefill_tokens_per_s() << " tokens/s)\n";
  os << std::setprecision(2) << "decode: " << st.decode_steps << " steps, " << st.decode_tokens << " tokens in "
     << st.decode_ms << " ms (" << st.ms_per_decode_step() << " ms/step, " << std::setprecision(0)
     << st.decode_tokens_per_s() << " tokens/s)\n";
  if (st.decode_steps > 0) {
    os << std::setprecision(3) << "decode step: " << st.step_breakdown() << " (Note [Where a decode step goes])\n";
  }
  os << "tokens: ";
  if (steps_ == 0) {
    os << "none picked yet\n";
  } else if (argmax_on_device_) {
    os << "greedy, the argmax taken on " << session_->options().device.str()
       << "; only the token ids come back (Note [Logits read back])\n";
  } else if (sampled_where_logits_are_) {
    os << "drawn where the logits are (" << session_->options().device.str()
       << ", sample_rows: sampling='device', Philox per row and step; Note [Sampling rows where the logits are])\n";
  } else {
    os << "picked on the host by the Sampler from each row's last logits ("
       << (sampler_.argmax_only() ? "greedy; the argmax runs on the device only for CUDA sessions"
                                  : "sampling or a repetition penalty: host code")
       << ", Note [Sampling])\n";
  }
  os << "profile: the prefill and the decode steps run in the profiler ranges '" << kPrefillRange << "' and '"
     << kDecodeRange << "' (Note [Generation ranges])";
  return os.str();
}

std::string GenerationStats::str() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "prefill " << prefill_tokens << " tokens in " << prefill_ms << " ms ("
     << std::setprecision(0) << prefill_tokens_per_s() << " tokens/s); decode " << decode_steps << " steps, "
     << decode_tokens << " tokens in " << std::setprecision(2) << decode_ms << " ms (" << ms_per_decode_step()
     << " ms/step, " << std::setprecision(0) << decode_tokens_per_s() << " tokens/s); ";
  if (decode_steps > 0) os << "a step " << step_breakdown() << "; ";
  if (cache_capacity > 0) {
    os << "cache " << cache_length << " of " << cache_capacity << " positions (" << cache_occupancy() * 100.0
       << "%), " << std::setprecision(1) << static_cast<double>(cache_bytes) / 1024.0 << " KiB";
  } else {
    os << "no cache";
  }
  return os.str();
}

std::string GenerationStats::step_breakdown() const {
  const double steps = static_cast<double>(std::max<std::int64_t>(decode_steps, 1));
  const double other = decode_ms - decode_feeds_ms - decode_run_ms - decode_commit_ms - decode_pick_ms;
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << "feeds " << decode_feeds_ms / steps << " ms, run " << decode_run_ms / steps
     << ", cache commit " << decode_commit_ms / steps << ", token pick " << decode_pick_ms / steps << ", other "
     << std::max(other, 0.0) / steps;
  return os.str();
}

void Generation::finish_step(const std::vector<std::optional<std::int64_t>>& chosen) {
  ++steps_;
  bool all_ended = true;
  for (std::size_t r = 0; r < chosen.size(); ++r) {
    const std::int64_t token = chosen[r].value_or(config_.pad_token_id);
    sequence_[r].push_back(token);
    mask_[r].push_back(1);
    if (chosen[r]) {
      generated_[r].push_back(token);
      seen_[r].push_back(token);
      const auto& stops = config_.stop_tokens;
      if (std::find(stops.begin(), stops.end(), token) != stops.end()) ended_[r] = true;
    }
    if (steps_ >= limit_new_) ended_[r] = true;
    all_ended = all_ended && ended_[r];
  }
  done_ = all_ended;
}

}  // namespace xpuruntime::generation
