// ContinuousBatcher (include/xpuruntime/generation.h, docs/generation.md "Continuous batching").
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/fnv1a.h"
#include "generation/row_sampler.h"
#include "generation/step_io.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime::generation {

using step_io::ceil_div;

// Note [Continuous batching]
// Requests come and go between decode steps; each keeps its cache in a PagedKvPool (Note [Paged KV pool]) under a
// block table. A step:
//   1. admits waiting requests, first come first served, while fewer than max_batch run and the pool has the
//      blocks the request needs now (Note [Blocks on demand]: its prompt's and its first new token's, or with
//      BlockReservation::kWholeLength its whole length, prompt + new-token limit). A request that does not fit yet
//      waits, and so does every request behind it (no overtaking: a long request is not starved by short ones);
//   2. prefills the admitted requests: those that share nothing together in one padded run; one whose first full
//      prompt blocks equal an earlier request's (the hash of every token up to the block's end) alone, with those
//      blocks taken from the pool and fed as the past, so that only the rest of its prompt is computed (at least one
//      prompt token always is: its logits give the first new token). A request whose first block equals one in the
//      pending group waits for the group's run, so that it shares instead of computing the block again. The
//      present's new positions go into the request's blocks, and its full prompt blocks are registered for later
//      requests, which find them as long as the pool keeps them (Note [Cached prefixes] in paged_kv_pool.cpp);
//   3. runs one decode step of every running request together. The exported model takes its past as one
//      [batch, heads, length, head_dim] tensor, so the batch's past is the requests' caches left-padded to the
//      longest (attention_mask 0 on the padding, position_ids the request's own positions: each row computes what it
//      would alone), or right-padded for GroupQueryAttention models (Note [Padding sides] in generator.cpp). When the batch is the one of the previous step, its past is that step's present (nothing is
//      copied); when a request joined or left, the rows that stay first write the positions they made since the
//      last rebuild into their blocks, then the past is rebuilt from the pool (a "regather", counted in the stats).
// The decode batch therefore costs the model's own Concat of the whole past per step (as Generation does) plus, at
// each change of the batch, one copy of every running request's cache out of and into the pool. On a GPU those copies
// are one strided copy per run of consecutive blocks, row and slot; a gather kernel driven by the block tables (one
// launch per slot) and an attention that reads the blocks in place are not written yet (docs/generation.md).
//
// Note [Prefills over shared pasts]
// A request whose first prompt blocks are in the pool (shared with a running request, or cached from a finished
// one: Note [Cached prefixes]) computes only the rest of its prompt, over those blocks fed as the past. Such requests
// admitted in one step are prefilled in one run, as those without a past are: the past input is [rows, heads, P,
// head_dim] with P the longest shared past, each row's past at the end of its P positions (left-padded with zeros,
// masked), then the fed tokens left-padded to the longest; attention_mask is 1 on the row's past and its tokens,
// and position_ids count each row's tokens from its own past length, so each row computes what it would alone. The
// mask has a hole (the padding between a row's past and its tokens), which a causal mask built from attention_mask
// handles as any padding. This needs the model's position_ids (a model that counts positions itself would count the
// padding) and left padding (GroupQueryAttention places a row's new keys after its seqlens_k, not after the shared
// P): otherwise each such request runs alone, as before. With the static layout the rows, the width and P are
// bucketed like the decode batch's (P to the decode capacities, 64, 128, 256, then multiples of 256), so that many
// requests over a common system prompt make few plans.
//
// Note [Blocks on demand]
// Reserving a request's whole length at admission (prompt + max_new_tokens) never runs out of blocks, but holds
// blocks for tokens that are never made: a request that stops early, or one whose limit is generous, keeps others
// waiting while most of its blocks stay empty. With BlockReservation::kOnDemand (the default, as vLLM does) a request
// is admitted with the blocks of its prompt and of its first new token's position; before each decode step every
// running request whose next position starts a new block takes one (grow_blocks). When the pool has no block left,
// the running request submitted last is preempted (it may be the one asking): its blocks are released, it goes back
// to the waiting queue ahead of every request submitted after it, and when it is admitted again its prompt and the
// tokens it had made are prefilled together (recompute, not a swap to the host: the prefill's last logits give its
// next token, so nothing it made is lost or made twice, and its sampler's stream and repetition history carry on);
// its full prompt blocks stay cached in the pool until reused (Note [Cached prefixes]), so with share_prefixes
// the recompute starts after those still there.
// The request submitted first can always grow (preempting every later one frees every block it does not hold, and
// submit() refused a request whose whole length cannot fit the pool), so the batch always makes progress. Admission
// keeps a block free for each request already running or admitted in the same step (each may need one at the next
// step), so that a request is not admitted only to be preempted at once. stats.preemptions and
// stats.recomputed_tokens count what this costs.

namespace {

// FNV-1a over the previous block's key and this block's tokens: a prompt block's key names every token up to its end.
std::uint64_t block_key(std::uint64_t previous, const std::int64_t* tokens, std::int64_t count) {
  std::uint64_t h = previous ^ detail::kFnv1aOffset;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto v = static_cast<std::uint64_t>(tokens[i]);
    unsigned char bytes[8];  // little-endian, whatever the machine's order
    for (int byte = 0; byte < 8; ++byte) bytes[byte] = static_cast<unsigned char>(v >> (8 * byte));
    h = detail::fnv1a(h, bytes, sizeof(bytes));
  }
  return h;
}

double ms_since(std::chrono::steady_clock::time_point begin) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
}

// The static layout's positions for a reach: a power of two from 64 to 256, then a multiple of 256 (Note [Static
// decode steps of the batcher]).
std::int64_t static_capacity(std::int64_t reach) {
  std::int64_t c = 64;
  while (c < reach && c < 256) c *= 2;
  return c >= reach ? c : ceil_div(reach, 256) * 256;
}

// Positions [from, from + count) of row `row` of a contiguous [rows, heads, positions, head_dim] cache tensor, as the
// [heads, count, head_dim] view PagedKvPool::read and write take.
Tensor row_positions(const Tensor& t, std::int64_t row, std::int64_t from, std::int64_t count) {
  const std::int64_t heads = t.shape()[1], stride = t.shape()[2], head_dim = t.shape()[3];
  const std::int64_t at = (row * heads * stride + from) * head_dim;
  return Tensor::from_blob(static_cast<char*>(t.data_ptr()) + at * static_cast<std::int64_t>(t.element_size()),
                           {heads, count, head_dim}, {stride * head_dim, head_dim, 1}, t.dtype(), t.device(),
                           t.storage());
}

// Whether `rows` (request ids, -1 for a free row) holds exactly the requests of `running`, in any rows.
bool holds_exactly(const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>& running) {
  const auto held = std::count_if(rows.begin(), rows.end(), [](std::int64_t id) { return id >= 0; });
  return static_cast<std::size_t>(held) == running.size() &&
         std::all_of(running.begin(), running.end(),
                     [&](std::int64_t id) { return std::find(rows.begin(), rows.end(), id) != rows.end(); });
}

// The milliseconds since *at, which becomes now.
double lap(std::chrono::steady_clock::time_point* at) {
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - *at).count();
  *at = now;
  return ms;
}

}  // namespace

struct ContinuousBatcher::Request {
  std::int64_t id = 0;
  GenerationConfig config;
  Sampler sampler;
  std::mt19937_64 rng;
  std::vector<std::int64_t> prompt;
  std::vector<std::int64_t> fed;        // what a prefill computes: the prompt, after a preemption + the tokens made
  std::vector<std::int64_t> generated;
  std::vector<std::int64_t> seen;       // prompt + generated: the repetition penalty's
  std::vector<std::int64_t> blocks;     // the block table
  std::vector<std::uint64_t> keys;      // the prompt's full blocks' prefix keys
  std::int64_t limit_new = 0;
  std::int64_t length = 0;              // positions cached (in the pool up to `synced`, the rest in working_)
  std::int64_t synced = 0;
  bool done = false;

  Request(std::int64_t id_, GenerationConfig c, std::vector<std::int64_t> p)
      : id(id_), config(std::move(c)), sampler(config), rng(Sampler::row_stream(config.seed, id_)),
        prompt(std::move(p)), fed(prompt), seen(prompt) {}
  std::int64_t positions_needed() const { return static_cast<std::int64_t>(prompt.size()) + limit_new; }
  // The positions whose blocks admission takes (Note [Blocks on demand]): the fed tokens' and the first new one's,
  // or the whole length.
  std::int64_t positions_at_admission(BlockReservation reservation) const {
    return reservation == BlockReservation::kOnDemand
               ? std::min(static_cast<std::int64_t>(fed.size()) + 1, positions_needed())
               : positions_needed();
  }
};

void PagedCacheConfig::validate() const {
  auto check = [](bool ok, const char* field, std::int64_t value, const char* rule) {
    if (!ok) {
      throw InvalidArgumentError(detail::str_cat("PagedCacheConfig.", field, " must be ", rule, ", got ", value));
    }
  };
  check(max_batch > 0, "max_batch", max_batch, "positive");
  check(block_size > 0, "block_size", block_size, "positive");
  check(num_blocks >= 0, "num_blocks", num_blocks, ">= 0 (0: max_batch x the blocks of 1024 positions)");
}

std::string PagedCacheConfig::str() const {
  return detail::str_cat("PagedCacheConfig(max_batch=", max_batch, ", block_size=", block_size,
                         ", num_blocks=", num_blocks, ", share_prefixes=", share_prefixes ? "True" : "False",
                         ", reservation='", block_reservation_name(reservation), "')");
}

const char* block_reservation_name(BlockReservation reservation) {
  return reservation == BlockReservation::kOnDemand ? "on_demand" : "whole_length";
}

BlockReservation parse_block_reservation(const std::string& name) {
  if (name == "on_demand") return BlockReservation::kOnDemand;
  if (name == "whole_length") return BlockReservation::kWholeLength;
  throw InvalidArgumentError(
      detail::str_cat("PagedCacheConfig.reservation must be 'on_demand' or 'whole_length', got '", name, "'"));
}

std::string BatcherStats::str() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "requests: " << waiting << " waiting, " << running << " running, "
     << finished << " finished; " << prefills << " prefills in " << prefill_runs << " runs (" << prefill_tokens
     << " tokens computed, "
     << shared_tokens << " shared) in " << prefill_ms << " ms; decode " << decode_steps << " steps, " << decode_tokens
     << " tokens in " << decode_ms << " ms (" << std::setprecision(0) << decode_tokens_per_s() << " tokens/s, up to "
     << max_running << " requests a step, " << regathers << " regathers, " << rows_joined << " joined in place, "
     << preemptions << " preemptions, "
     << recomputed_tokens << " tokens recomputed); ";
  if (decode_steps > 0) {
    const double steps = static_cast<double>(decode_steps);
    const double other = decode_ms - decode_regather_ms - decode_feeds_ms - decode_run_ms - decode_commit_ms -
                         decode_pick_ms;
    os << std::setprecision(3) << "a step regather " << decode_regather_ms / steps << " ms, feeds "
       << decode_feeds_ms / steps << ", run " << decode_run_ms / steps << ", cache commit " << decode_commit_ms / steps
       << ", token pick " << decode_pick_ms / steps << ", other " << std::max(other, 0.0) / steps << "; ";
  }
  os << "pool " << blocks_used << " of " << blocks_total << " blocks of " << block_size << " in use (" << blocks_cached
     << " free ones cached), "
     << std::setprecision(1) << static_cast<double>(pool_bytes) / 1024.0 << " KiB";
  return os.str();
}

ContinuousBatcher::ContinuousBatcher(const InferenceSession& session, GenerationConfig defaults,
                                     PagedCacheConfig cache)
    : session_(&session), defaults_(std::move(defaults)), cache_config_(cache) {
  defaults_.validate();
  cache_config_.validate();
  signature_ = DecoderSignature::recognise(session.get_inputs(), session.get_outputs());
  if (signature_.cache.empty() || signature_.attention_mask.empty()) {
    throw UnsupportedOperationError(detail::str_cat(
        "ContinuousBatcher needs a decoder with a cache (past_key_values.{i}.key -> present.{i}.key) and an "
        "attention_mask input, to decode requests of different lengths together; this model has ",
        signature_.cache.empty() ? "no cache" : "no attention_mask", " (", signature_.str(),
        "). Use Generator for it"));
  }
  right_padded_ = resolve_padding(session, defaults_.padding) == PaddingSide::kRight;
  static_layout_ = !right_padded_ && defaults_.cache != CacheMode::kNone &&
                   step_io::resolve_cache_layout(signature_, defaults_) == CacheLayout::kStatic;
  in_place_ = static_layout_ && session.engine() == "native";  // Note [Cache appended in place]
  if (cache_config_.num_blocks == 0) {
    cache_config_.num_blocks = cache_config_.max_batch * ceil_div(1024, cache_config_.block_size);
  }
  pool_ = std::make_unique<PagedKvPool>(signature_.cache, cache_config_.num_blocks, cache_config_.block_size,
                                        session.options().device);
}

ContinuousBatcher::~ContinuousBatcher() = default;

std::int64_t ContinuousBatcher::submit(const std::vector<std::int64_t>& prompt, std::optional<GenerationConfig> config) {
  GenerationConfig c = config ? std::move(*config) : defaults_;
  c.validate();
  XPURT_CHECK(!prompt.empty(), "ContinuousBatcher::submit: the prompt is empty (give at least one token, e.g. BOS)");
  for (std::int64_t t : prompt) XPURT_CHECK(t >= 0, "ContinuousBatcher::submit: a negative token id ", t);
  auto r = std::make_unique<Request>(next_id_, std::move(c), prompt);
  const auto prompt_length = static_cast<std::int64_t>(prompt.size());
  r->limit_new = r->config.max_new_tokens;
  if (r->config.max_length > 0) {
    XPURT_CHECK(prompt_length < r->config.max_length, "ContinuousBatcher::submit: the prompt has ", prompt_length,
                " tokens, which already reaches max_length ", r->config.max_length);
    r->limit_new = std::min(r->limit_new, r->config.max_length - prompt_length);
  }
  const std::int64_t blocks = ceil_div(r->positions_needed(), pool_->block_size());
  XPURT_CHECK(blocks <= pool_->num_blocks(), "ContinuousBatcher::submit: the request needs ", blocks,
              " blocks of ", pool_->block_size(), " positions (prompt ", prompt_length, " + up to ", r->limit_new,
              " new tokens) and the pool has ", pool_->num_blocks(),
              ": raise PagedCacheConfig.num_blocks or lower max_new_tokens");
  const std::int64_t id = next_id_++;
  requests_[id] = std::move(r);
  waiting_.push_back(id);
  return id;
}

ContinuousBatcher::Request& ContinuousBatcher::request(std::int64_t id) {
  const auto it = requests_.find(id);
  XPURT_CHECK(it != requests_.end(), "ContinuousBatcher: no request ", id);
  return *it->second;
}

const ContinuousBatcher::Request& ContinuousBatcher::request(std::int64_t id) const {
  const auto it = requests_.find(id);
  XPURT_CHECK(it != requests_.end(), "ContinuousBatcher: no request ", id);
  return *it->second;
}

bool ContinuousBatcher::finished(std::int64_t id) const { return request(id).done; }

const std::vector<std::int64_t>& ContinuousBatcher::tokens(std::int64_t id) const { return request(id).generated; }

std::map<std::int64_t, std::vector<std::int64_t>> ContinuousBatcher::run() {
  while (!idle()) step();
  std::map<std::int64_t, std::vector<std::int64_t>> out;
  for (const auto& [id, r] : requests_) out[id] = r->generated;
  return out;
}

std::vector<BatchEvent> ContinuousBatcher::step() {
  std::vector<BatchEvent> events;
  if (idle()) return events;
  admit(events);
  if (!running_.empty()) grow_blocks();
  if (!running_.empty()) decode(events);
  ++stats_.steps;
  return events;
}

void ContinuousBatcher::admit(std::vector<BatchEvent>& events) {
  // Requests admitted without a shared past are prefilled together (one run, padded), and so are those that share
  // blocks, over their pasts (Note [Prefills over shared pasts]). A request whose first block equals a pending one's
  // waits for that batch to be prefilled (flushed), so that it shares the blocks instead of computing them again.
  std::vector<Request*> pending, over_past;
  auto flush = [&] {
    if (!pending.empty()) prefill(pending, events);
    pending.clear();
  };
  // Rows over different pasts need the model's position_ids and left padding (Note [Prefills over shared pasts]).
  const bool batch_pasts = !right_padded_ && !signature_.position_ids.empty();
  const std::int64_t block = pool_->block_size();
  while (!waiting_.empty() && static_cast<std::int64_t>(running_.size() + pending.size() + over_past.size()) <
                                  cache_config_.max_batch) {
    Request& r = request(waiting_.front());
    const auto prompt_length = static_cast<std::int64_t>(r.fed.size());
    // The prompt's full blocks and their keys; those already in the pool are shared (at least one token computed).
    r.keys.clear();
    std::uint64_t key = 0;
    for (std::int64_t b = 0; (b + 1) * block <= prompt_length; ++b) {
      key = block_key(key, r.fed.data() + b * block, block);
      r.keys.push_back(key);
    }
    if (cache_config_.share_prefixes && !r.keys.empty() &&
        std::any_of(pending.begin(), pending.end(),
                    [&](const Request* p) { return !p->keys.empty() && p->keys.front() == r.keys.front(); })) {
      flush();
      continue;  // look again: the prefixes it may share are registered now
    }
    std::vector<std::int64_t> shared;
    if (cache_config_.share_prefixes) {
      for (std::size_t b = 0; b < r.keys.size() && static_cast<std::int64_t>(b + 1) * block < prompt_length; ++b) {
        const auto found = pool_->find_prefix(r.keys[b]);
        if (!found) break;
        shared.push_back(*found);
      }
    }
    // Note [Blocks on demand]: the prompt's and the first new token's blocks, a block left for every request that
    // runs; or the whole length.
    const bool on_demand = cache_config_.reservation == BlockReservation::kOnDemand;
    const std::int64_t needed = ceil_div(r.positions_at_admission(cache_config_.reservation), block) -
                                static_cast<std::int64_t>(shared.size());
    const auto headroom =
        on_demand ? static_cast<std::int64_t>(running_.size() + pending.size() + over_past.size()) : 0;
    // Shared blocks no request holds are cached free blocks (Note [Cached prefixes] in paged_kv_pool.cpp): taken
    // back before the fresh ones are allocated, which could otherwise reuse them.
    const auto revived = std::count_if(shared.begin(), shared.end(), [&](std::int64_t b) {
      return pool_->references(b) == 0;
    });
    if (pool_->free_blocks() - revived - needed < headroom) break;  // waits (and everyone behind it)
    for (std::int64_t b : shared) pool_->retain(b);
    auto fresh = pool_->allocate(needed);
    XPURT_INTERNAL_ASSERT(fresh.has_value(), "the free blocks were counted");
    r.blocks = shared;
    r.blocks.insert(r.blocks.end(), fresh->begin(), fresh->end());
    r.length = r.synced = static_cast<std::int64_t>(shared.size()) * block;
    waiting_.erase(waiting_.begin());
    if (shared.empty()) {
      pending.push_back(&r);
    } else if (batch_pasts) {
      over_past.push_back(&r);
    } else {
      std::vector<Request*> alone = {&r};
      prefill(alone, events);
    }
  }
  flush();
  if (!over_past.empty()) prefill(over_past, events);
}

void ContinuousBatcher::prefill(const std::vector<Request*>& group, std::vector<BatchEvent>& events) {
  // One run for `group`, padded as the decode batch is (left, or right for the GroupQueryAttention form): requests
  // without a past, or requests over their shared pasts (Note [Prefills over shared pasts]).
  const Profiler::Range range = Profiler::range(kPrefillRange);  // Note [Generation ranges]
  const auto begin = std::chrono::steady_clock::now();
  const Device device = session_->options().device;
  const auto rows = static_cast<std::int64_t>(group.size());
  std::int64_t past = 0, width = 0;  // the fed past's and the fed tokens' positions (padding included)
  for (const Request* r : group) {
    past = std::max(past, r->length);
    width = std::max(width, static_cast<std::int64_t>(r->fed.size()) - r->length);
  }
  XPURT_INTERNAL_ASSERT(past == 0 || rows == 1 || !right_padded_, "a right-padded prefill over a past is one row's");
  // The static layout buckets prefills (Note [Static decode steps of the batcher]): the rows as the decode batch's,
  // the width to a multiple of 16 (more left padding), a past as the decode steps' capacity; filler rows are one pad
  // token.
  const bool bucketed = static_layout_ && (past == 0 || !right_padded_);
  const std::int64_t run_rows = bucketed ? step_io::batch_bucket(rows) : rows;
  if (bucketed) width = ceil_div(width, step_io::kPromptBucket) * step_io::kPromptBucket;
  if (bucketed && past > 0) past = static_capacity(past);
  std::vector<std::vector<std::int64_t>> ids, mask;
  std::vector<std::int64_t> offsets;  // where each row's fed tokens start among the `width` positions
  for (const Request* r : group) {
    const std::int64_t own = r->length, fed = static_cast<std::int64_t>(r->fed.size()) - own;
    const std::int64_t at = right_padded_ ? 0 : width - fed;
    std::vector<std::int64_t> row(static_cast<std::size_t>(width), r->config.pad_token_id);
    std::copy(r->fed.begin() + own, r->fed.end(), row.begin() + at);
    std::vector<std::int64_t> m(static_cast<std::size_t>(past + width), 0);
    std::fill_n(m.begin() + (right_padded_ ? 0 : past - own), own, 1);  // its past, at the past's end when left
    std::fill_n(m.begin() + past + at, fed, 1);
    ids.push_back(std::move(row));
    mask.push_back(std::move(m));
    offsets.push_back(at);
  }
  for (std::int64_t filler = rows; filler < run_rows; ++filler) {  // one pad token at the end, its outputs dropped
    std::vector<std::int64_t> m(static_cast<std::size_t>(past + width), 0);
    m.back() = 1;
    ids.emplace_back(static_cast<std::size_t>(width), defaults_.pad_token_id);
    mask.push_back(std::move(m));
  }
  IoBinding binding = session_->io_binding();
  binding.bind_input(signature_.input_ids, step_io::host_matrix(ids, 0, signature_.ids_dtype));
  binding.bind_input(signature_.attention_mask, step_io::host_matrix(mask, 0, signature_.mask_dtype));
  if (!signature_.position_ids.empty()) {  // each row's own: its past's length onwards
    binding.bind_input(signature_.position_ids,
                       step_io::host_matrix(step_io::positions_of(mask), past, signature_.positions_dtype));
  }
  if (!signature_.use_cache_branch.empty()) {
    binding.bind_input(signature_.use_cache_branch, step_io::cache_branch(past > 0));
  }
  for (std::size_t s = 0; s < signature_.cache.size(); ++s) {
    const CacheSlot& slot = signature_.cache[s];
    Tensor past_value = past > 0 ? Tensor::zeros({run_rows, slot.heads, past, slot.head_dim}, slot.dtype, device)
                                 : Tensor::empty({run_rows, slot.heads, past, slot.head_dim}, slot.dtype, device);
    for (std::int64_t i = 0; i < rows; ++i) {
      const Request& r = *group[static_cast<std::size_t>(i)];
      if (r.length == 0) continue;
      const std::int64_t from = right_padded_ ? 0 : past - r.length;  // left-padded: its past ends at `past`
      pool_->read(r.blocks, 0, r.length, s, row_positions(past_value, i, from, r.length));
    }
    binding.bind_input(slot.past_input, past_value);
    binding.bind_output(slot.present_output, device);
  }
  binding.bind_output(signature_.logits, device);  // Note [Logits read back] in step_io.cpp
  session_->run_with_binding(binding);
  const Tensor logits = step_io::bound_output(binding, signature_.logits);
  const std::int64_t total = past + width;
  for (std::size_t s = 0; s < signature_.cache.size(); ++s) {
    const CacheSlot& slot = signature_.cache[s];
    const Tensor present = step_io::bound_output(binding, slot.present_output).contiguous();
    XPURT_CHECK_TYPE(present.dim() == 4 && present.shape()[0] == run_rows && present.shape()[2] == total,
                     "present output '", slot.present_output, "' should be [", run_rows, ", heads, ", total,
                     ", head_dim] after a prefill of ", width, " positions over a past of ", past, "; got ",
                     present.str());
    for (std::int64_t i = 0; i < rows; ++i) {
      Request& r = *group[static_cast<std::size_t>(i)];
      const std::int64_t fed = static_cast<std::int64_t>(r.fed.size()) - r.length;
      // The row's first fed position: after the past (right-padded: after its own past, GroupQueryAttention's rule).
      const std::int64_t first = (right_padded_ ? r.length : past) + offsets[static_cast<std::size_t>(i)];
      pool_->write(r.blocks, r.length, fed, s, row_positions(present, i, first, fed));
    }
  }
  ++stats_.prefill_runs;
  // Each row's last prompt position (a filler row's: the last). A model whose logits hold only the last position
  // (exported with logits_to_keep=1, as transformers' generate computes them) gives it at 0 for left-padded rows.
  XPURT_CHECK_TYPE(logits.dim() == 3, "logits output '", signature_.logits, "' should be [batch, seq, vocab], got ",
                   logits.str());
  const bool last_only = logits.shape()[1] == 1 && width > 1;
  if (last_only && right_padded_) {
    throw UnsupportedOperationError(detail::str_cat(
        "logits output '", signature_.logits, "' holds only the last position (", logits.str(), "), but this batch ",
        "is right-padded (GroupQueryAttention form): a shorter row's last prompt position is not the batch's last"));
  }
  std::vector<std::int64_t> positions(static_cast<std::size_t>(run_rows), last_only ? 0 : width - 1);
  for (std::int64_t i = 0; i < rows && !last_only; ++i) {
    const Request& r = *group[static_cast<std::size_t>(i)];
    positions[static_cast<std::size_t>(i)] =
        offsets[static_cast<std::size_t>(i)] + static_cast<std::int64_t>(r.fed.size()) - r.length - 1;
  }
  const std::vector<std::int64_t> tokens = pick_tokens(logits, positions, group);
  for (std::int64_t i = 0; i < rows; ++i) {
    Request& r = *group[static_cast<std::size_t>(i)];
    const auto length = static_cast<std::int64_t>(r.fed.size());
    ++stats_.prefills;
    stats_.prefill_tokens += length - r.length;
    stats_.shared_tokens += r.length;
    // A preempted request's (Note [Blocks on demand]).
    if (!r.generated.empty()) stats_.recomputed_tokens += length - r.length;
    r.length = r.synced = length;
    // The prompt's full blocks computed here are there for later requests to share.
    for (std::size_t b = 0; b < r.keys.size(); ++b) pool_->register_prefix(r.keys[b], r.blocks[b]);
    if (take_token(r, tokens[static_cast<std::size_t>(i)], events)) running_.push_back(r.id);
  }
  stats_.prefill_ms += ms_since(begin);
}

std::vector<std::int64_t> ContinuousBatcher::pick_tokens(const Tensor& logits,
                                                          const std::vector<std::int64_t>& positions,
                                                          const std::vector<Request*>& rows) {
  // `positions` may hold more rows than `rows`: a static batch's filler rows, whose tokens are dropped.
  const Tensor chosen = step_io::position_rows(logits, positions, signature_.logits);
  // Rows whose config samples where the logits are draw there, each from its request's stream at its own step
  // (Note [Sampling rows where the logits are]); the others as the host Sampler or the device's argmax pick them.
  std::vector<std::int64_t> drawn;
  std::vector<bool> there(rows.size(), false);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    there[i] = rows[i] != nullptr && step_io::samples_where_logits_are(rows[i]->config, chosen);
  }
  if (std::find(there.begin(), there.end(), true) != there.end()) {
    std::vector<row_sampling::RowParams> params;
    std::vector<const std::vector<std::int64_t>*> seen;
    for (std::int64_t i = 0; i < chosen.shape()[0]; ++i) {
      const Request* r = static_cast<std::size_t>(i) < rows.size() ? rows[static_cast<std::size_t>(i)] : nullptr;
      params.push_back(r == nullptr ? row_sampling::RowParams{}
                                    : step_io::row_params(r->config, static_cast<std::uint64_t>(r->id),
                                                          static_cast<std::uint64_t>(r->generated.size())));
      seen.push_back(r == nullptr ? nullptr : &r->seen);
    }
    drawn = sample_rows(chosen, params, seen);
    if (std::find(there.begin(), there.end(), false) == there.end()) {
      drawn.resize(rows.size());
      return drawn;
    }
  }
  const bool greedy =
      std::all_of(rows.begin(), rows.end(), [](const Request* r) { return r == nullptr || r->sampler.argmax_only(); });
  const step_io::PickedTokens picked =
      step_io::pick_tokens(chosen, rows.size(), greedy, [&](std::size_t i, const Tensor& host) {
        if (there[i]) return std::optional<std::int64_t>(drawn[i]);
        if (rows[i] == nullptr) return std::optional<std::int64_t>();  // a free row: no token
        Request& r = *rows[i];
        std::vector<float> values = step_io::host_row(host, static_cast<std::int64_t>(i), signature_.logits);
        return std::optional<std::int64_t>(
            r.sampler.next(values.data(), static_cast<std::int64_t>(values.size()), r.seen, r.rng));
      });
  std::vector<std::int64_t> tokens;
  for (const auto& token : picked.tokens) tokens.push_back(token.value_or(-1));
  return tokens;
}

bool ContinuousBatcher::take_token(Request& r, std::int64_t token, std::vector<BatchEvent>& events) {
  r.generated.push_back(token);
  r.seen.push_back(token);
  const auto& stops = r.config.stop_tokens;
  r.done = std::find(stops.begin(), stops.end(), token) != stops.end() ||
           static_cast<std::int64_t>(r.generated.size()) >= r.limit_new;
  events.push_back(BatchEvent{r.id, token, r.done});
  if (r.done) retire(r);
  return !r.done;
}

void ContinuousBatcher::retire(Request& r) {
  pool_->release(r.blocks);
  r.blocks.clear();
  ++stats_.finished;
}

void ContinuousBatcher::grow_blocks() {
  // Note [Blocks on demand]: oldest first, so that the requests submitted last are the ones preempted.
  const std::int64_t block = pool_->block_size();
  std::vector<std::int64_t> order = running_;  // (a request readmitted after a preemption runs after later ones)
  std::sort(order.begin(), order.end());
  for (std::int64_t id : order) {
    Request& r = request(id);
    while (!r.blocks.empty() && static_cast<std::int64_t>(r.blocks.size()) * block <= r.length) {
      if (auto fresh = pool_->allocate(1)) {
        r.blocks.push_back(fresh->front());
        continue;
      }
      Request& victim = request(*std::max_element(running_.begin(), running_.end()));
      preempt(victim);
      if (&victim == &r) break;
    }
  }
}

void ContinuousBatcher::preempt(Request& r) {
  // Its cache is dropped (the rows that stay are written back at the regather, this one is skipped: nothing left
  // to write); its prompt and the tokens it made are prefilled again at its next admission (Note [Blocks on demand]).
  pool_->release(r.blocks);
  r.blocks.clear();
  r.keys.clear();
  r.length = r.synced = 0;
  r.fed = r.prompt;
  r.fed.insert(r.fed.end(), r.generated.begin(), r.generated.end());
  running_.erase(std::find(running_.begin(), running_.end(), r.id));
  waiting_.insert(std::lower_bound(waiting_.begin(), waiting_.end(), r.id), r.id);  // ahead of those after it
  ++stats_.preemptions;
}

// Note [Static decode steps of the batcher]
// The batcher's decode steps fed the batch's past exactly as long as its longest request, so every step had a new
// shape (the past grows by one) and so did every change of the batch: on the native engine each was a new plan with
// its own memory arena, built on first use, and none replayed a CUDA graph. With the static layout (GenerationConfig
// cache_layout, "auto" where the model has position_ids and an attention_mask: Note [Static cache layout] in
// kv_cache.cpp) a regather makes the batch's past a fixed-size buffer instead: its rows are the running batch's bucket
// (step_io::batch_bucket: 1, 2, 4, 8, then multiples of 8; filler rows are one pad token whose outputs are dropped)
// and its positions cover every step until the batch next changes (the longest request plus the most new tokens a
// running request may still make), rounded up to a power of two from 64 up to 256 and to a multiple of 256 above. A
// step feeds the whole buffer with the positions not filled yet masked, binds the present to a scratch buffer of one
// more position and copies that last position into the buffer (one strided copy per slot, as StaticKvCache::commit).
// On the native engine the buffer has one position more instead of a scratch buffer, and a step binds the present to
// it with the past its first positions (as StaticKvCache in place): the step writes only its new position.
// Every step between two changes of the batch has one shape, and batches of nearby sizes and lengths share it: few
// plans, and on CUDA replayed graphs. The rows' caches stay left-padded within the filled positions, so each row
// still computes what it would alone.

void ContinuousBatcher::regather() {
  const Device device = session_->options().device;
  // The rows that stay write what they made since the last rebuild into their blocks.
  for (std::size_t row = 0; row < working_rows_.size(); ++row) {
    if (working_rows_[row] < 0) continue;  // a free row (Note [Rows that stay where they are])
    Request& r = request(working_rows_[row]);
    if (r.done || r.synced == r.length) continue;
    // rows are left-padded to the filled positions, or right-padded (Note [Padding sides] in generator.cpp)
    const std::int64_t at = right_padded_ ? r.synced : working_length_ - r.length + r.synced;
    for (std::size_t s = 0; s < signature_.cache.size(); ++s) {
      pool_->write(r.blocks, r.synced, r.length - r.synced, s,
                   row_positions(working_[s], static_cast<std::int64_t>(row), at, r.length - r.synced));
    }
    r.synced = r.length;
  }
  // The new batch's past, from the pool, each row left-padded to the longest (zeros: masked).
  std::int64_t longest = 0;
  std::int64_t remaining = 0;  // the most new tokens a running request may still make
  for (std::int64_t id : running_) {
    const Request& r = request(id);
    longest = std::max(longest, r.length);
    remaining = std::max(remaining, r.limit_new - static_cast<std::int64_t>(r.generated.size()));
  }
  const auto batch = static_cast<std::int64_t>(running_.size());
  working_batch_ = static_layout_ ? step_io::batch_bucket(batch) : batch;
  working_capacity_ = static_layout_ ? static_capacity(longest + std::max<std::int64_t>(remaining, 1)) : longest;
  working_.clear();
  scratch_.clear();
  const std::int64_t stride = working_capacity_ + (in_place_ ? 1 : 0);  // positions per row of the buffer
  for (std::size_t s = 0; s < signature_.cache.size(); ++s) {
    const CacheSlot& slot = signature_.cache[s];
    Tensor w = Tensor::zeros({working_batch_, slot.heads, stride, slot.head_dim}, slot.dtype, device);
    for (std::int64_t row = 0; row < batch; ++row) {
      const Request& r = request(running_[static_cast<std::size_t>(row)]);
      pool_->read(r.blocks, 0, r.length, s, row_positions(w, row, right_padded_ ? 0 : longest - r.length, r.length));
    }
    working_.push_back(std::move(w));
    if (static_layout_ && !in_place_) {
      scratch_.push_back(
          Tensor::empty({working_batch_, slot.heads, working_capacity_ + 1, slot.head_dim}, slot.dtype, device));
    }
  }
  working_rows_ = running_;
  if (static_layout_) working_rows_.resize(static_cast<std::size_t>(working_batch_), -1);  // filler rows: free
  working_length_ = longest;
  ++stats_.regathers;
}

// Note [Rows that stay where they are]
// With the static layout a change of the batch need not rebuild the batch's past (regather: every running request's
// cache written back to the pool and copied into a new buffer, two passes over the whole batch's cache). A request
// that leaves (finished or preempted) frees its row: its positions are masked from then on and its next occupant
// overwrites them. A request that joins is copied from the pool into a free row (a finished request's, or a filler
// row of the bucket), its positions ending where every row's do (working_length_), when it is no longer than that.
// The rows that stay are not copied at all; the positions they made since their prefill stay only in the buffer
// (the pool gets them at the next full regather, or never when the request finishes first). A full regather still
// happens when the buffer's positions run out, when a joining request does not fit (longer than the filled
// positions, or no row free) and when the running requests fit a smaller bucket (the step would compute the free
// rows for nothing). stats.rows_joined counts the requests that joined in place, stats.regathers the rebuilds.
bool ContinuousBatcher::join_in_place() {
  if (!static_layout_ || working_.empty() || working_length_ >= working_capacity_ ||
      step_io::batch_bucket(static_cast<std::int64_t>(running_.size())) < working_batch_) {
    return false;
  }
  const auto runs = [&](std::int64_t id) { return std::find(running_.begin(), running_.end(), id) != running_.end(); };
  std::vector<std::int64_t> rows = working_rows_;
  for (std::int64_t& id : rows) {
    if (id >= 0 && !runs(id)) id = -1;
  }
  std::vector<std::size_t> joined;
  for (std::int64_t id : running_) {
    if (std::find(rows.begin(), rows.end(), id) != rows.end()) continue;
    const auto free = std::find(rows.begin(), rows.end(), -1);
    if (free == rows.end() || request(id).length > working_length_) return false;
    *free = id;
    joined.push_back(static_cast<std::size_t>(free - rows.begin()));
  }
  for (std::size_t row : joined) {
    const Request& r = request(rows[row]);
    for (std::size_t s = 0; s < signature_.cache.size(); ++s) {  // its positions end at working_length_
      pool_->read(r.blocks, 0, r.length, s,
                  row_positions(working_[s], static_cast<std::int64_t>(row), working_length_ - r.length, r.length));
    }
  }
  working_rows_ = std::move(rows);
  stats_.rows_joined += static_cast<std::int64_t>(joined.size());
  return true;
}

void ContinuousBatcher::decode(std::vector<BatchEvent>& events) {
  const Profiler::Range range = Profiler::range(kDecodeRange);  // Note [Generation ranges]
  const auto begin = std::chrono::steady_clock::now();
  auto at = begin;  // Note [Where a decode step goes] in generator.cpp
  const Device device = session_->options().device;
  // The batch changed, or its buffer is full: rows join in place or the past is rebuilt (Note [Rows that stay where
  // they are]).
  const bool changed = static_layout_ ? !holds_exactly(working_rows_, running_) : working_rows_ != running_;
  if ((changed || (static_layout_ && working_length_ >= working_capacity_)) && !join_in_place()) regather();
  stats_.decode_regather_ms += lap(&at);
  const auto batch = static_cast<std::int64_t>(running_.size());
  const std::int64_t rows = static_layout_ ? working_batch_ : batch;
  // Each row's request (null: a free or filler row of the static layout).
  std::vector<Request*> group;
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t id = working_rows_[static_cast<std::size_t>(row)];
    group.push_back(id >= 0 ? &request(id) : nullptr);
  }
  // The past fed: the filled positions, or the static layout's whole buffer (Note [Static decode steps of the
  // batcher]).
  const std::int64_t past = static_layout_ ? working_capacity_ : working_length_;
  // One flat buffer each, written once (as Generation's static decode feeds: generator.cpp).
  std::vector<std::int64_t> ids(static_cast<std::size_t>(rows)), positions(static_cast<std::size_t>(rows), 0);
  std::vector<std::int64_t> mask(static_cast<std::size_t>(rows * (past + 1)), 0);
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t* m = mask.data() + row * (past + 1);
    const auto at_row = static_cast<std::size_t>(row);
    if (group[at_row] == nullptr) {  // a free or filler row: it sees only its own token
      m[past] = 1;
      ids[at_row] = defaults_.pad_token_id;
      continue;
    }
    const Request& r = *group[at_row];
    ids[at_row] = r.generated.back();
    if (right_padded_) {
      std::fill_n(m, r.length + 1, 1);
    } else {  // the row's cache, left-padded within the filled positions, and the step's own token (the last)
      std::fill(m + (working_length_ - r.length), m + working_length_, 1);
      m[past] = 1;
    }
    positions[at_row] = r.length;
  }
  IoBinding binding = session_->io_binding();
  binding.bind_input(signature_.input_ids, step_io::host_tensor(ids, {rows, 1}, signature_.ids_dtype));
  binding.bind_input(signature_.attention_mask, step_io::host_tensor(mask, {rows, past + 1}, signature_.mask_dtype));
  if (!signature_.position_ids.empty()) {
    binding.bind_input(signature_.position_ids, step_io::host_tensor(positions, {rows, 1}, signature_.positions_dtype));
  }
  if (!signature_.use_cache_branch.empty()) {
    binding.bind_input(signature_.use_cache_branch, step_io::cache_branch(true));
  }
  for (std::size_t s = 0; s < signature_.cache.size(); ++s) {
    if (in_place_) {  // the past the buffer's first positions, the present all of it (Note [Cache appended in place])
      binding.bind_input(signature_.cache[s].past_input,
                         StaticKvCache::positions(working_[s], working_capacity_ + 1, 0, working_capacity_));
      binding.bind_output(signature_.cache[s].present_output, working_[s]);
      continue;
    }
    binding.bind_input(signature_.cache[s].past_input, working_[s]);
    if (static_layout_) {
      binding.bind_output(signature_.cache[s].present_output, scratch_[s]);
    } else {
      binding.bind_output(signature_.cache[s].present_output, device);
    }
  }
  binding.bind_output(signature_.logits, device);  // Note [Logits read back] in step_io.cpp
  stats_.decode_feeds_ms += lap(&at);
  session_->run_with_binding(binding);
  stats_.decode_run_ms += lap(&at);
  const Tensor logits = step_io::bound_output(binding, signature_.logits);
  if (static_layout_) {  // the step's position into the buffer (Note [Static decode steps of the batcher])
    const std::int64_t total = working_capacity_ + (in_place_ ? 1 : 0);
    std::vector<Tensor> into;
    std::vector<Tensor> from;
    for (std::size_t s = 0; s < signature_.cache.size(); ++s) {
      into.push_back(StaticKvCache::positions(working_[s], total, working_length_, 1));
      from.push_back(StaticKvCache::positions(in_place_ ? working_[s] : scratch_[s], working_capacity_ + 1,
                                              working_capacity_, 1));
    }
    copy_tensors(into, from);  // one launch on CUDA (Note [Copies in one launch] in core/tensor.cpp)
  }
  for (std::size_t s = 0; s < signature_.cache.size() && !static_layout_; ++s) {
    const CacheSlot& slot = signature_.cache[s];
    Tensor present = step_io::bound_output(binding, slot.present_output).contiguous();
    XPURT_CHECK_TYPE(present.dim() == 4 && present.shape()[0] == batch && present.shape()[2] == working_length_ + 1,
                     "present output '", slot.present_output, "' should be [", batch, ", heads, ",
                     working_length_ + 1, ", head_dim] after a decode step; got ", present.str());
    working_[s] = std::move(present);
  }
  ++working_length_;
  stats_.decode_commit_ms += lap(&at);
  XPURT_CHECK_TYPE(logits.dim() == 3, "logits output '", signature_.logits, "' should be [batch, seq, vocab], got ",
                   logits.str());
  const std::vector<std::int64_t> tokens =
      pick_tokens(logits, std::vector<std::int64_t>(static_cast<std::size_t>(rows), logits.shape()[1] - 1), group);
  stats_.decode_pick_ms += lap(&at);
  for (std::int64_t row = 0; row < rows; ++row) {
    Request* r = group[static_cast<std::size_t>(row)];
    if (r == nullptr) continue;
    ++r->length;
    take_token(*r, tokens[static_cast<std::size_t>(row)], events);
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [&](std::int64_t id) { return request(id).done; }),
                 running_.end());
  ++stats_.decode_steps;
  stats_.decode_tokens += batch;
  stats_.max_running = std::max(stats_.max_running, batch);
  stats_.decode_ms += ms_since(begin);
}

BatcherStats ContinuousBatcher::stats() const {
  BatcherStats out = stats_;
  out.waiting = static_cast<std::int64_t>(waiting_.size());
  out.running = static_cast<std::int64_t>(running_.size());
  out.blocks_total = pool_->num_blocks();
  out.blocks_used = pool_->num_blocks() - pool_->free_blocks();
  out.blocks_cached = pool_->cached_blocks();
  out.block_size = pool_->block_size();
  out.pool_bytes = pool_->bytes();
  return out;
}

}  // namespace xpuruntime::generation

namespace xpuruntime::generation {

std::string ContinuousBatcher::explain() const {
  std::ostringstream os;
  const BatcherStats st = stats();
  std::int64_t shared = 0;
  for (std::int64_t b = 0; b < pool_->num_blocks(); ++b) shared += pool_->references(b) > 1 ? 1 : 0;
  os << "ContinuousBatcher: up to " << cache_config_.max_batch << " requests a step; pool of " << st.blocks_total
     << " blocks x " << st.block_size << " positions (" << signature_.cache.size() << " cache slots, "
     << std::fixed << std::setprecision(1)
     << static_cast<double>(st.pool_bytes) / (st.pool_bytes < (1u << 20) ? 1024.0 : 1024.0 * 1024.0)
     << (st.pool_bytes < (1u << 20) ? " KiB), " : " MiB), ")
     << st.blocks_used << " in use, " << shared << " shared by more than one request, " << st.blocks_cached
     << " free but holding a finished request's prefix (Note [Cached prefixes]); prefix sharing "
     << (cache_config_.share_prefixes ? "on" : "off") << "; rows " << (right_padded_ ? "right" : "left")
     << "-padded\n";
  if (cache_config_.reservation == BlockReservation::kOnDemand) {
    os << "blocks: on demand (Note [Blocks on demand]): a request's prompt at admission, one more as decoding fills "
          "one, the request submitted last preempted and recomputed when none is free; "
       << st.preemptions << " preemptions, " << st.recomputed_tokens << " tokens recomputed\n";
  } else {
    os << "blocks: a request's whole length (prompt + max_new_tokens) reserved at admission, never preempted\n";
  }
  os << "decode: ";
  if (static_layout_) {
    std::size_t bytes = 0;  // the working buffers and the scratch presents, beside the pool
    for (const Tensor& t : working_) bytes += t.nbytes();
    for (const Tensor& t : scratch_) bytes += t.nbytes();
    os << "static layout (Note [Static decode steps of the batcher]): the batch's past a buffer of " << working_batch_
       << " rows x " << working_capacity_ << " positions, " << working_length_ << " filled, one shape until the batch "
       << "changes; " << std::setprecision(1) << static_cast<double>(bytes) / (1024.0 * 1024.0)
       << (in_place_ ? " MiB, the present bound over it (a step writes only its new position, Note [Cache appended in "
                       "place])\n"
                     : " MiB with the step's present\n");
  } else {
    os << "dynamic layout: the batch's past as long as its longest request, a new shape every step\n";
  }
  os << "requests: " << st.waiting << " waiting, " << st.running << " running, " << st.finished << " finished\n";
  auto describe = [&](std::int64_t id, const char* state) {
    const Request& r = request(id);
    os << "  request " << id << "  " << state << "  prompt " << r.prompt.size() << ", generated "
       << r.generated.size() << " of " << r.limit_new;
    if (!r.blocks.empty()) {
      os << ", cached " << r.length << " of " << r.blocks.size() * static_cast<std::size_t>(pool_->block_size())
         << " positions in its blocks, blocks [";
      for (std::size_t b = 0; b < r.blocks.size(); ++b) {
        const int refs = pool_->references(r.blocks[b]);
        os << (b ? ", " : "") << r.blocks[b] << (refs > 1 ? "*" + std::to_string(refs) : "");
      }
      os << "]";
    } else {
      os << ", needs " << ceil_div(r.positions_at_admission(cache_config_.reservation), pool_->block_size())
         << " blocks";
      if (!r.generated.empty()) os << " (preempted: its " << r.fed.size() << " tokens are prefilled again)";
    }
    os << "\n";
  };
  for (std::int64_t id : running_) describe(id, "running");
  for (std::int64_t id : waiting_) describe(id, "waiting");
  os << "(block*n: shared by n requests)";
  return os.str();
}

}  // namespace xpuruntime::generation
