// Text generation: a decoder-only model driven token by token (docs/generation.md).
//
//   xpuruntime::InferenceSession session("decoder.onnx");
//   xpuruntime::generation::GenerationConfig config;
//   config.max_new_tokens = 16;
//   xpuruntime::generation::Generator generator(session, config);
//   std::vector<std::vector<std::int64_t>> tokens = generator.generate({{1, 2, 3}, {4, 5}});
//
// The model is an ONNX decoder as exporters write it (Note [Decoder signatures] in generation/decoder_signature.cpp):
// `input_ids` [batch, seq] and optionally `attention_mask` [batch, past + seq], `position_ids` [batch, seq]; a
// logits output [batch, seq, vocab]; and, for the cached form, one past input and one present output per layer
// and per key/value (`past_key_values.{i}.key` -> `present.{i}.key`, [batch, heads, seq, head_dim]). A model
// without cache inputs runs in the recompute form: the whole sequence every step.
//
// Ownership: a Generator refers to its session, which must outlive it and every Generation it starts; a
// Generation owns its cache buffers (on the session's device). Thread-safety: a Generator may start Generations
// from several threads (the session's run is thread-safe); one Generation is used from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "xpuruntime/export.h"
#include "xpuruntime/inference_session.h"

namespace xpuruntime::generation {

// Whether the generator uses the model's cache inputs.
enum class CacheMode {
  kAuto,      // the cache when the model has one, else recompute the whole sequence every step
  kRequired,  // the cache; a model without a recognisable cache is an UnsupportedOperationError
  kNone,      // recompute every step even when the model has a cache (its past inputs fed empty)
};

// Where a batch's shorter rows are padded (Note [Padding sides] in generation/generator.cpp).
enum class PaddingSide {
  kAuto,   // right when the model's attention is ONNX Runtime's GroupQueryAttention, else left
  kLeft,   // transformers' exports: padding first, attention_mask 0 on it, the cache right-aligned
  kRight,  // GroupQueryAttention (its seqlens_k counts a row's positions from 0): tokens first, padding last
};

// Note [Generation ranges]
// Every prefill run and every decode step of a Generation or a ContinuousBatcher runs inside a profiler range of one
// of these names (Profiler::range: a "range" event while a Profiler records, an NVTX range for Nsight), so that a
// profile shows the two phases apart: Profiler::summary(kDecodeRange) is the per-node table of the decode steps
// alone, with their roofline (docs/generation.md, "Profiling a generation").
inline constexpr const char* kPrefillRange = "generation prefill";
inline constexpr const char* kDecodeRange = "generation decode";

// How the Concat form's cache is fed to decode steps (Note [Static cache layout] in generation/kv_cache.cpp).
enum class CacheLayout {
  kAuto,     // static where the model has attention_mask and position_ids inputs, else dynamic
  kDynamic,  // the past exactly as long as the sequence so far: a new input shape, so a new plan, every step
  kStatic,   // the whole fixed-capacity cache, unfilled positions masked: one decode shape (CUDA graph replays)
};

// Where sampled tokens are drawn (Note [Sampling rows where the logits are] in core/row_sampling.h).
enum class SamplingSite {
  kAuto,    // kDevice where the logits are on a GPU, kHost where they are on the CPU
  kHost,    // the Sampler (Note [Sampling]): the logits rows copied to the host; mt19937_64, the same on every platform
  kDevice,  // where the logits are: the sample_rows kernel on a GPU (only the token ids come back), the same
            // definition on the host for a CPU session; Philox, the same tokens every run on one kind of device
};
XPURT_API const char* sampling_site_name(SamplingSite site);  // "auto", "host", "device"
// InvalidArgumentError naming the accepted names for any other.
XPURT_API SamplingSite parse_sampling_site(const std::string& name);

// How tokens are chosen and when generation stops. Valid when default-constructed: greedy, 32 new tokens.
// validate() raises InvalidArgumentError naming the first bad field.
struct XPURT_API GenerationConfig {
  std::int64_t max_new_tokens = 32;   // > 0
  std::int64_t max_length = 0;        // prompt + new tokens of the longest row, at most; 0: no limit beyond the above
  bool do_sample = false;             // false: greedy (argmax after the repetition penalty)
  double temperature = 1.0;           // > 0 when sampling; logits are divided by it
  std::int64_t top_k = 0;             // >= 0; 0: off. Keeps the k most likely tokens
  double top_p = 1.0;                 // in (0, 1]; 1: off. Keeps the smallest set whose probability reaches top_p
  double repetition_penalty = 1.0;    // > 0; 1: off. Tokens seen (prompt included) lose likelihood (CTRL's rule)
  std::uint64_t seed = 0;             // the sampling stream of row r is seeded from (seed, r): same seed, same tokens
  std::vector<std::int64_t> stop_tokens;  // a row ends after producing one of these (it is included in the output)
  std::int64_t pad_token_id = 0;      // fed for left padding and for rows that have ended
  CacheMode cache = CacheMode::kAuto;
  PaddingSide padding = PaddingSide::kAuto;  // kRight needs the model's cache
  CacheLayout cache_layout = CacheLayout::kAuto;  // kStatic needs the model's cache (the Concat form)
  SamplingSite sampling = SamplingSite::kAuto;    // where do_sample and repetition_penalty rows draw their tokens
  void validate() const;
  std::string str() const;
};

// One past input of the model and the present output that continues it.
struct XPURT_API CacheSlot {
  int layer = 0;
  bool is_key = true;            // key or value
  std::string past_input;        // "past_key_values.0.key"
  std::string present_output;    // "present.0.key"
  std::int64_t heads = 0;        // static dimension 1 of [batch, heads, seq, head_dim]
  std::int64_t head_dim = 0;     // static dimension 3
  DType dtype = DType::kFloat32;
};

// What the generator feeds and reads, recognised from a session's inputs and outputs by name and shape.
struct XPURT_API DecoderSignature {
  std::string input_ids;         // int64 or int32 [batch, seq]
  std::string attention_mask;    // empty: the model has none
  std::string position_ids;      // empty: the model has none
  std::string use_cache_branch;  // optimum's merged decoders: bool [1]; empty when absent
  std::string logits;            // [batch, seq, vocab]
  DType ids_dtype = DType::kInt64;
  DType mask_dtype = DType::kInt64;
  DType positions_dtype = DType::kInt64;
  std::vector<CacheSlot> cache;  // empty: no cache (recompute form), sorted by (layer, key before value)
  // Recognises the signature; UnsupportedOperationError naming what is missing or malformed (no input_ids, a past
  // input without its present output, a cache input that is not [batch, heads, seq, head_dim] with static heads
  // and head_dim, ...).
  static DecoderSignature recognise(const std::vector<ValueInfo>& inputs, const std::vector<ValueInfo>& outputs);
  std::string str() const;
};

// Note [KV cache]
// The cache of one Generation, resident on the session's device: for every CacheSlot the past fed to the next step
// and a buffer the step's present is written into. bind() binds both for a step that adds `new_tokens` to the
// `length()` already cached; commit() makes the written present the next past. This is the seam a paged block
// pool (continuous batching: blocks per request, a block table) implements later; today's implementation is
// ContiguousKvCache.
class XPURT_API KvCache {
 public:
  virtual ~KvCache() = default;
  virtual void bind(IoBinding& binding, std::int64_t new_tokens) = 0;
  virtual void commit(std::int64_t new_tokens) = 0;
  virtual std::int64_t length() const = 0;    // positions cached (the longest row's, padding included)
  virtual std::int64_t capacity() const = 0;  // positions that fit
  virtual std::size_t bytes() const = 0;      // device memory held
};

// Two preallocated buffers of `capacity` positions per slot, used in turn (Note [Contiguous KV cache] in
// generation/kv_cache.cpp): step t reads its past from one as a contiguous [batch, heads, length, head_dim] view
// and the engine writes its present into the other, bound as an output, so nothing is allocated and the cache
// never leaves the device. Exceeding `capacity` is an InvalidArgumentError.
class XPURT_API ContiguousKvCache final : public KvCache {
 public:
  // `shared`: one buffer per slot, bound as both the past (all `capacity` positions) and the present, for models
  // that append in place (GroupQueryAttention's shared past/present buffer: Note [Contiguous KV cache]).
  ContiguousKvCache(const std::vector<CacheSlot>& slots, std::int64_t batch, std::int64_t capacity, Device device,
                    bool shared = false);
  bool shared() const { return shared_; }
  void bind(IoBinding& binding, std::int64_t new_tokens) override;
  void commit(std::int64_t new_tokens) override;
  std::int64_t length() const override { return length_; }
  std::int64_t capacity() const override { return capacity_; }
  std::size_t bytes() const override;

 private:
  struct Buffers {
    CacheSlot slot;
    Tensor buffer[2];
  };
  Tensor view(const Buffers& b, int which, std::int64_t positions) const;
  std::vector<Buffers> buffers_;
  std::int64_t batch_;
  std::int64_t capacity_;
  std::int64_t length_ = 0;
  int current_ = 0;  // the buffer that holds the past
  bool shared_ = false;
};

// One [batch, heads, capacity, head_dim] buffer per slot whose positions stay where they were written (Note [Static
// cache layout] in generation/kv_cache.cpp): the prefill's present is copied into its first positions; each decode
// step feeds the whole buffer as the past, binds the present ([batch, heads, capacity + 1, head_dim]) to a scratch
// buffer and copies the step's position (the last) into the buffer at length(). Every decode step has one shape.
//
// `in_place` (an engine that appends in place, the native one: Note [Cache appended in place] in
// engines/native/plan/capture_plan.cpp): each buffer has one more position, [batch, heads, capacity + 1, head_dim];
// a decode step feeds positions [0, capacity) of it as the past and binds the whole buffer as the present, so the
// step writes only its new position (the last) and no scratch buffer is kept.
class XPURT_API StaticKvCache final : public KvCache {
 public:
  StaticKvCache(const std::vector<CacheSlot>& slots, std::int64_t batch, std::int64_t capacity, Device device,
                bool in_place = false);
  void bind(IoBinding& binding, std::int64_t new_tokens) override;
  void commit(std::int64_t new_tokens) override;
  std::int64_t length() const override { return length_; }
  std::int64_t capacity() const override { return capacity_; }
  std::size_t bytes() const override;
  // Positions [from, from + count) of `t`, [batch, heads, total, head_dim] contiguous, as a strided view (also the
  // continuous batcher's static decode steps').
  static Tensor positions(const Tensor& t, std::int64_t total, std::int64_t from, std::int64_t count);
  bool in_place() const { return in_place_; }

 private:
  struct Buffers {
    CacheSlot slot;
    Tensor cache;    // [batch, heads, capacity (+ 1 in place), head_dim]
    Tensor present;  // [batch, heads, capacity + 1, head_dim]: the decode steps' present; in place: the prefill's
  };
  std::vector<Buffers> buffers_;
  std::int64_t batch_;
  std::int64_t capacity_;
  std::int64_t length_ = 0;
  bool in_place_ = false;
};

// Chooses the next token of one row from its logits (Note [Sampling] in generation/sampler.cpp). Host code on
// float32 logits; greedy rows of a CUDA session take their argmax on the device instead (Note [Logits read back] in
// generation/step_io.cpp), with the same rule. Sampling on the device is not written yet (docs/generation.md).
class XPURT_API Sampler {
 public:
  explicit Sampler(const GenerationConfig& config);
  // Greedy without a repetition penalty: the token is the logits' argmax alone, which a device kernel can take.
  bool argmax_only() const { return !config_.do_sample && config_.repetition_penalty == 1.0; }
  // `logits`: `vocab` float32 values, modified in place. `seen`: the tokens of the row so far (prompt included,
  // padding excluded), for the repetition penalty. `rng`: the row's stream.
  std::int64_t next(float* logits, std::int64_t vocab, const std::vector<std::int64_t>& seen,
                    std::mt19937_64& rng) const;
  // The stream of row `row` under `seed` (splitmix64 of both: independent streams per row).
  static std::mt19937_64 row_stream(std::uint64_t seed, std::int64_t row);

 private:
  GenerationConfig config_;
};

// Where a generation's time went, prefill and decode apart (issue 44 item 4; docs/generation.md "Statistics"): host
// wall time of each step (its run, the logits read back, the sampling), so a step's figure includes the device work it
// waited for. The cache's figures are taken when stats() is called.
struct XPURT_API GenerationStats {
  std::int64_t prefill_tokens = 0;  // positions the prefill fed: batch x the longest prompt (padding included)
  double prefill_ms = 0.0;
  std::int64_t decode_steps = 0;    // steps after the prefill
  std::int64_t decode_tokens = 0;   // tokens those steps made (rows that had ended make none)
  double decode_ms = 0.0;
  // Where the decode steps' wall time went (Note [Where a decode step goes] in generator.cpp): the feeds made and
  // bound, the run (its launch or CUDA graph replay and the wait for the device), the cache's commit, the tokens
  // picked (read back or sampled); the rest of decode_ms is the generation's own bookkeeping.
  double decode_feeds_ms = 0.0;
  double decode_run_ms = 0.0;
  double decode_commit_ms = 0.0;
  double decode_pick_ms = 0.0;
  std::int64_t cache_length = 0;    // KvCache::length(), 0 without a cache
  std::int64_t cache_capacity = 0;
  std::size_t cache_bytes = 0;

  double prefill_tokens_per_s() const { return prefill_ms > 0 ? prefill_tokens * 1e3 / prefill_ms : 0.0; }
  double decode_tokens_per_s() const { return decode_ms > 0 ? decode_tokens * 1e3 / decode_ms : 0.0; }
  double ms_per_decode_step() const { return decode_steps > 0 ? decode_ms / static_cast<double>(decode_steps) : 0.0; }
  // cache_length / cache_capacity, 0 without a cache.
  double cache_occupancy() const {
    return cache_capacity > 0 ? static_cast<double>(cache_length) / static_cast<double>(cache_capacity) : 0.0;
  }
  // Per decode step: "feeds 0.021 ms, run 1.850, cache commit 0.012, token pick 0.030, other 0.004".
  std::string step_breakdown() const;
  // "prefill 24 tokens in 1.2 ms (20000 tokens/s); decode 15 steps, 45 tokens in 9.0 ms (0.60 ms/step, 5000
  // tokens/s); cache 19 of 40 positions (48%), 12.2 KiB"
  std::string str() const;
};

class Generator;

// `requested` with kAuto resolved for `session`: kRight when the session's model uses com.microsoft
// GroupQueryAttention (seen in explain()'s nodes: the native engine lists them when the session is made; an
// onnxruntime-engine session lists them only after a run, so kAuto is kLeft there: give kRight, as the Python API
// and the CLI do after reading the model file), else kLeft.
XPURT_API PaddingSide resolve_padding(const InferenceSession& session, PaddingSide requested);

// One batch being generated: prefill on the first step(), one decode step per later call.
class XPURT_API Generation {
 public:
  // One token per row for this step; std::nullopt for a row that had already ended. Raises InvalidArgumentError
  // when called after done().
  std::vector<std::optional<std::int64_t>> step();
  bool done() const { return done_; }
  // The new tokens of each row so far (the prompt left out; a stop token that ended a row included).
  const std::vector<std::vector<std::int64_t>>& tokens() const { return generated_; }
  std::int64_t steps() const { return steps_; }
  // Prefill and decode times and the cache's size and occupancy so far.
  GenerationStats stats() const;
  bool uses_cache() const { return cache_ != nullptr; }
  const KvCache* cache() const { return cache_.get(); }
  // What this generation runs, as text: the model's signature, the rows (and a bucket's filler rows), the padding,
  // the cache's form, layout, size and occupancy, and the prefill and the decode steps apart (tokens, time,
  // tokens/s), each line saying why where there is a choice (docs/generation.md "What a generation explains").
  std::string explain() const;

 private:
  friend class Generator;
  Generation(const InferenceSession& session, const DecoderSignature& signature, const GenerationConfig& config,
             const std::vector<std::vector<std::int64_t>>& prompts);
  std::vector<std::pair<std::string, Tensor>> feeds(bool prefill) const;
  // `times` (decode steps): the run's and the commit's milliseconds are added to decode_run_ms, decode_commit_ms.
  Tensor run(const std::vector<std::pair<std::string, Tensor>>& feeds, std::int64_t new_tokens,
             GenerationStats* times = nullptr);
  std::vector<std::pair<std::string, Tensor>> right_padded_feeds(bool prefill) const;
  std::vector<std::pair<std::string, Tensor>> static_decode_feeds() const;
  std::vector<std::int64_t> logits_positions(const Tensor& logits, bool prefill) const;
  void finish_step(const std::vector<std::optional<std::int64_t>>& chosen);

  const InferenceSession* session_;
  DecoderSignature signature_;
  GenerationConfig config_;
  Sampler sampler_;
  std::int64_t rows_ = 0;            // the caller's prompts
  std::int64_t batch_ = 0;           // rows run: rows_, or its bucket (Note [Shape buckets] in generator.cpp)
  std::int64_t prompt_length_ = 0;   // the longest prompt, or its bucket (rows are left-padded to it)
  std::int64_t limit_new_ = 0;       // new tokens at most (max_new_tokens, cut by max_length)
  std::vector<std::vector<std::int64_t>> sequence_;  // per row: padding + prompt + generated (what is fed)
  std::vector<std::vector<std::int64_t>> mask_;      // per row: 0 for padding, 1 otherwise
  std::vector<std::vector<std::int64_t>> seen_;      // per row: prompt + generated (the repetition penalty's)
  std::vector<std::vector<std::int64_t>> generated_;
  std::vector<std::int64_t> prompt_lengths_;
  bool right_padded_ = false;        // Note [Padding sides]
  bool static_layout_ = false;       // Note [Static cache layout]: decode feeds the whole fixed-size cache
  bool argmax_on_device_ = false;    // the last step's tokens were picked on the device (Note [Logits read back])
  bool sampled_where_logits_are_ = false;  // the last step's tokens were drawn by sample_rows
  std::vector<std::mt19937_64> rngs_;
  std::vector<bool> ended_;
  std::unique_ptr<KvCache> cache_;  // null in the recompute form
  std::int64_t steps_ = 0;
  bool done_ = false;
  GenerationStats stats_;  // the cache's fields are filled by stats()
};

class XPURT_API Generator {
 public:
  // Validates `config` and recognises the model's signature (both raise as their functions say). `session` must
  // outlive the generator and its generations.
  Generator(const InferenceSession& session, GenerationConfig config);
  // Starts a batch: one prompt per row (each non-empty; rows of different lengths are left-padded, which needs an
  // attention_mask input). InvalidArgumentError for an empty batch or prompt.
  Generation start(const std::vector<std::vector<std::int64_t>>& prompts) const;
  // Runs a batch to the end; the new tokens of each row.
  std::vector<std::vector<std::int64_t>> generate(const std::vector<std::vector<std::int64_t>>& prompts) const;
  const DecoderSignature& signature() const { return signature_; }
  const GenerationConfig& config() const { return config_; }
  // Whether generations use the model's cache (the signature has one and the config does not say kNone).
  bool uses_cache() const;
  // The padding side its generations use (config.padding, kAuto resolved: Note [Padding sides]).
  PaddingSide padding() const { return config_.padding; }
  CacheLayout cache_layout() const { return config_.cache_layout; }  // resolved: kStatic or kDynamic

 private:
  const InferenceSession* session_;
  GenerationConfig config_;
  DecoderSignature signature_;
};

// ---- Continuous batching over a paged cache (Note [Continuous batching] in generation/continuous_batcher.cpp) ----

// When a ContinuousBatcher takes a request's cache blocks (Note [Blocks on demand] in
// generation/continuous_batcher.cpp).
enum class BlockReservation {
  kOnDemand,     // the prompt's blocks (and the first new token's) at admission, one more whenever decoding fills a
                 // block; when the pool has none left, the request submitted last is preempted and recomputed later
  kWholeLength,  // every block of the prompt and the new-token limit at admission: never preempts, runs fewer at once
};
XPURT_API const char* block_reservation_name(BlockReservation reservation);  // "on_demand", "whole_length"
// InvalidArgumentError naming the accepted names for any other.
XPURT_API BlockReservation parse_block_reservation(const std::string& name);

// How a ContinuousBatcher holds its requests' caches. validate() raises InvalidArgumentError naming the bad field.
struct XPURT_API PagedCacheConfig {
  std::int64_t max_batch = 8;     // requests decoded together at most (> 0)
  std::int64_t block_size = 16;   // positions per block (> 0)
  std::int64_t num_blocks = 0;    // blocks in the pool; 0: max_batch x the blocks of 1024 positions
  bool share_prefixes = true;     // a prompt's full blocks equal to another request's are shared, not recomputed
  BlockReservation reservation = BlockReservation::kOnDemand;
  void validate() const;
  std::string str() const;
};

// A pool of fixed-size cache blocks on one device: for every CacheSlot one tensor [heads, num_blocks x block_size,
// head_dim], so that block b holds positions [b x block_size, (b + 1) x block_size) of whichever request owns it.
// Blocks are reference counted (a shared prefix block has one reference per request using it) and a full prompt
// block can be registered under the hash of the tokens up to its end, for later requests to find (prefix sharing).
// A registered block that no request holds any more stays findable, its contents kept, until allocate() needs it for
// something else (the least recently released first): Note [Cached prefixes] in generation/paged_kv_pool.cpp.
class XPURT_API PagedKvPool {
 public:
  PagedKvPool(const std::vector<CacheSlot>& slots, std::int64_t num_blocks, std::int64_t block_size, Device device);
  std::int64_t block_size() const { return block_size_; }
  std::int64_t num_blocks() const { return static_cast<std::int64_t>(refcount_.size()); }
  // Blocks no request holds: empty ones and cached ones (cached_blocks()), which allocate() may take.
  std::int64_t free_blocks() const { return static_cast<std::int64_t>(free_.size() + cached_.size()); }
  // Free blocks that still hold a registered prefix, findable by find_prefix() until allocate() reuses them.
  std::int64_t cached_blocks() const { return static_cast<std::int64_t>(cached_.size()); }
  std::size_t bytes() const;
  // `count` unused blocks (reference count 1): empty ones first, lowest ids first, then cached ones, the least
  // recently released first (their prefixes leave the index); std::nullopt when fewer are free (nothing taken).
  std::optional<std::vector<std::int64_t>> allocate(std::int64_t count);
  // One more reference to a block in use, or a cached block taken back (reference count 1).
  void retain(std::int64_t block);
  // Drops one reference of each; a block whose count reaches 0 is free again: empty, or cached while it holds a
  // registered prefix.
  void release(const std::vector<std::int64_t>& blocks);
  int references(std::int64_t block) const;
  // The prefix index: the block registered under `key` (the hash of the tokens up to the block's end), if any.
  std::optional<std::int64_t> find_prefix(std::uint64_t key) const;
  void register_prefix(std::uint64_t key, std::int64_t block);
  // Copies positions [from, from + count) of the sequence held by `table` (its blocks in order) for slot `slot`
  // to / from `view`, a [heads, count, head_dim] tensor on the pool's device (any strides): one copy per run of
  // consecutive blocks.
  void read(const std::vector<std::int64_t>& table, std::int64_t from, std::int64_t count, std::size_t slot,
            const Tensor& view) const;
  void write(const std::vector<std::int64_t>& table, std::int64_t from, std::int64_t count, std::size_t slot,
             const Tensor& view);

 private:
  // The pool's [heads, count, head_dim] view of physical positions [position, position + count) of `slot`.
  Tensor positions(std::size_t slot, std::int64_t position, std::int64_t count) const;
  template <typename Copy>
  void for_each_run(const std::vector<std::int64_t>& table, std::int64_t from, std::int64_t count,
                    const Copy& copy) const;
  std::vector<CacheSlot> slots_;
  std::vector<Tensor> pools_;
  std::int64_t block_size_;
  std::vector<int> refcount_;
  std::vector<std::int64_t> free_;                             // empty free blocks, kept descending (back() lowest)
  std::map<std::uint64_t, std::int64_t> cached_;               // free blocks with a prefix, by release tick
  std::vector<std::uint64_t> released_at_;                     // block -> its release tick while cached
  std::uint64_t tick_ = 0;
  std::unordered_map<std::uint64_t, std::int64_t> prefixes_;   // key -> block
  std::vector<std::optional<std::uint64_t>> key_of_;           // block -> its key
};

// A token one step of a ContinuousBatcher made for a request.
struct XPURT_API BatchEvent {
  std::int64_t request = 0;
  std::int64_t token = 0;
  bool finished = false;  // the request's last token (a stop token or its length limit)
};

// What a ContinuousBatcher has done and holds (docs/generation.md "Continuous batching").
struct XPURT_API BatcherStats {
  std::int64_t waiting = 0, running = 0, finished = 0;
  std::int64_t steps = 0;            // step() calls that ran the model
  std::int64_t prefills = 0;         // requests prefilled
  std::int64_t prefill_runs = 0;     // model runs that prefilled them (requests sharing nothing go together)
  std::int64_t prefill_tokens = 0;   // prompt positions the prefills computed (shared prefix positions excluded)
  std::int64_t shared_tokens = 0;    // prompt positions taken from shared blocks instead of computed
  std::int64_t decode_steps = 0;
  std::int64_t decode_tokens = 0;
  std::int64_t max_running = 0;      // the most requests decoded in one step
  std::int64_t regathers = 0;        // decode steps whose batch's past was rebuilt from the pool
  std::int64_t rows_joined = 0;      // requests that joined the decode batch in a free row, nothing else copied
  std::int64_t preemptions = 0;      // running requests sent back to wait for blocks (Note [Blocks on demand])
  std::int64_t recomputed_tokens = 0;  // positions the prefills of preempted requests computed again
  double prefill_ms = 0.0, decode_ms = 0.0;
  // Where the decode steps' time went (Note [Where a decode step goes] in generator.cpp), summed: the past rebuilt
  // from the pool when the batch changed, the feeds made and bound, the run, the cache's new positions moved, the
  // tokens picked; the rest of decode_ms is bookkeeping.
  double decode_regather_ms = 0.0, decode_feeds_ms = 0.0, decode_run_ms = 0.0, decode_commit_ms = 0.0;
  double decode_pick_ms = 0.0;
  std::int64_t blocks_total = 0, blocks_used = 0, block_size = 0;
  std::int64_t blocks_cached = 0;    // free blocks still holding a released request's prefix (Note [Cached prefixes])
  std::size_t pool_bytes = 0;
  double decode_tokens_per_s() const { return decode_ms > 0 ? decode_tokens * 1e3 / decode_ms : 0.0; }
  std::string str() const;
};

// Serves many requests with one decoder session: requests are submitted at any time, join the running batch between
// decode steps (after their own prefill) and leave it when they finish; their caches live in a PagedKvPool. The model
// must have a cache and an attention_mask input (UnsupportedOperationError otherwise). Not thread-safe: one thread
// calls submit() and step().
class XPURT_API ContinuousBatcher {
 public:
  ContinuousBatcher(const InferenceSession& session, GenerationConfig defaults, PagedCacheConfig cache = {});
  ~ContinuousBatcher();
  ContinuousBatcher(const ContinuousBatcher&) = delete;
  ContinuousBatcher& operator=(const ContinuousBatcher&) = delete;
  // Queues a request (its own GenerationConfig, else the defaults); returns its id (0, 1, ...). InvalidArgumentError
  // for an empty prompt, a bad config, or a request whose prompt and new tokens could never fit the pool.
  std::int64_t submit(const std::vector<std::int64_t>& prompt, std::optional<GenerationConfig> config = std::nullopt);
  // Admits waiting requests while the batch and the pool have room (first come, first served: a request that does
  // not fit yet waits, and so do those behind it), prefills each, gives every running request the block its next
  // position needs (preempting the requests submitted last when the pool has none: Note [Blocks on demand]), then
  // runs one decode step of the running batch. The tokens made, in order; empty when there was nothing to do.
  std::vector<BatchEvent> step();
  bool idle() const { return waiting_.empty() && running_.empty(); }
  bool finished(std::int64_t request) const;
  // The request's new tokens so far (InvalidArgumentError for an unknown id).
  const std::vector<std::int64_t>& tokens(std::int64_t request) const;
  // Steps until idle; every request's tokens by id.
  std::map<std::int64_t, std::vector<std::int64_t>> run();
  BatcherStats stats() const;
  // What the batcher holds, as text: the pool (blocks, bytes, in use, shared) and every waiting and running request
  // (its length, its reserved positions, its block table and which of its blocks are shared).
  std::string explain() const;
  const PagedCacheConfig& cache_config() const { return cache_config_; }
  const DecoderSignature& signature() const { return signature_; }

 private:
  struct Request;
  void admit(std::vector<BatchEvent>& events);
  void prefill(const std::vector<Request*>& group, std::vector<BatchEvent>& events);
  void decode(std::vector<BatchEvent>& events);
  void regather();
  // Note [Rows that stay where they are]: false when the batch's past must be rebuilt instead.
  bool join_in_place();
  // Note [Blocks on demand]: every running request's block for the position the next step writes.
  void grow_blocks();
  void preempt(Request& r);
  // Each row's token from its logits at `positions` (Note [Logits read back] in generation/step_io.cpp).
  std::vector<std::int64_t> pick_tokens(const Tensor& logits, const std::vector<std::int64_t>& positions,
                                        const std::vector<Request*>& rows);
  bool take_token(Request& r, std::int64_t token, std::vector<BatchEvent>& events);
  void retire(Request& r);
  Request& request(std::int64_t id);
  const Request& request(std::int64_t id) const;

  const InferenceSession* session_;
  GenerationConfig defaults_;
  PagedCacheConfig cache_config_;
  DecoderSignature signature_;
  std::unique_ptr<PagedKvPool> pool_;
  std::map<std::int64_t, std::unique_ptr<Request>> requests_;
  std::vector<std::int64_t> waiting_;   // FIFO
  std::vector<std::int64_t> running_;   // the decode batch, in its rows' order
  std::vector<std::int64_t> working_rows_;  // the request of each row `working_` holds (-1: a free row, static
                                            // layout: Note [Rows that stay where they are])
  std::vector<Tensor> working_;         // per slot: the batch's past [rows, heads, working_length_, head_dim]; with
                                        // the static layout [working_batch_, heads, working_capacity_ (+ 1 in
                                        // place), head_dim]
  std::int64_t working_length_ = 0;     // positions of working_ that hold the rows' caches
  bool static_layout_ = false;          // Note [Static decode steps of the batcher] (continuous_batcher.cpp)
  std::int64_t working_batch_ = 0;      // static layout: the rows run (the running batch's bucket)
  std::int64_t working_capacity_ = 0;   // static layout: the positions working_ holds
  std::vector<Tensor> scratch_;         // static layout: per slot, the bound present [rows, heads, capacity + 1, ...]
  bool in_place_ = false;               // static layout on the native engine: the present bound over the past, no
                                        // scratch (Note [Cache appended in place])
  bool right_padded_ = false;  // Note [Padding sides]
  std::int64_t next_id_ = 0;
  BatcherStats stats_;
};

}  // namespace xpuruntime::generation
