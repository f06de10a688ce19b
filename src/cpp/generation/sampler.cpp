// GenerationConfig's checks and the Sampler (include/xpuruntime/generation.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/row_sampling.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"

namespace xpuruntime::generation {

void GenerationConfig::validate() const {
  XPURT_CHECK(max_new_tokens > 0, "GenerationConfig.max_new_tokens must be positive, got ", max_new_tokens);
  XPURT_CHECK(max_length >= 0, "GenerationConfig.max_length must be 0 (no limit) or positive, got ", max_length);
  XPURT_CHECK(std::isfinite(temperature) && temperature > 0, "GenerationConfig.temperature must be positive ",
              "(use do_sample=false for greedy decoding), got ", temperature);
  XPURT_CHECK(top_k >= 0, "GenerationConfig.top_k must be 0 (off) or positive, got ", top_k);
  XPURT_CHECK(top_p > 0 && top_p <= 1, "GenerationConfig.top_p must be in (0, 1], got ", top_p);
  XPURT_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0,
              "GenerationConfig.repetition_penalty must be positive (1: off), got ", repetition_penalty);
  for (std::int64_t t : stop_tokens) XPURT_CHECK(t >= 0, "GenerationConfig.stop_tokens holds a negative id ", t);
  XPURT_CHECK(pad_token_id >= 0, "GenerationConfig.pad_token_id must be a token id (>= 0), got ", pad_token_id);
  XPURT_CHECK(!(padding == PaddingSide::kRight && cache == CacheMode::kNone),
              "GenerationConfig.padding 'right' needs the model's cache (cache='none' recomputes the padded sequence, "
              "which a right-padded row cannot be)");
}

std::string GenerationConfig::str() const {
  std::string stops;
  for (std::int64_t t : stop_tokens) stops += (stops.empty() ? "" : ",") + std::to_string(t);
  const char* cache_mode = cache == CacheMode::kAuto ? "auto" : cache == CacheMode::kRequired ? "required" : "none";
  return detail::str_cat("GenerationConfig(max_new_tokens=", max_new_tokens, ", max_length=", max_length,
                         ", do_sample=", do_sample ? "true" : "false", ", temperature=", temperature,
                         ", top_k=", top_k, ", top_p=", top_p, ", repetition_penalty=", repetition_penalty,
                         ", seed=", seed, ", stop_tokens=[", stops, "], pad_token_id=", pad_token_id,
                         ", cache=", cache_mode, ", padding=",
                         padding == PaddingSide::kAuto ? "auto" : padding == PaddingSide::kLeft ? "left" : "right",
                         ", cache_layout=",
                         cache_layout == CacheLayout::kAuto      ? "auto"
                         : cache_layout == CacheLayout::kDynamic ? "dynamic"
                                                                 : "static",
                         ", sampling=", sampling_site_name(sampling), ")");
}

const char* sampling_site_name(SamplingSite site) {
  return site == SamplingSite::kAuto ? "auto" : site == SamplingSite::kHost ? "host" : "device";
}

SamplingSite parse_sampling_site(const std::string& name) {
  if (name == "auto") return SamplingSite::kAuto;
  if (name == "host") return SamplingSite::kHost;
  if (name == "device") return SamplingSite::kDevice;
  throw InvalidArgumentError(
      detail::str_cat("GenerationConfig.sampling must be 'auto', 'host' or 'device', got '", name, "'"));
}

// Note [Sampling]
// The order is transformers' (its LogitsProcessor list for generate()): the repetition penalty (CTRL: a seen token's
// logit is divided by the penalty when positive, multiplied when negative), then greedy argmax, or temperature,
// top-k, top-p and a draw from what is left. Ties go to the lowest token id everywhere (argmax, and the sort that
// top-k and top-p read), so top_k=1 picks exactly the greedy token; a NaN logit is the greedy token (the first NaN),
// as torch.argmax has it. Top-p keeps the most likely tokens until their probability reaches top_p, always at least
// one. The draw is one uniform double from the row's own mt19937_64 (whose output sequence the C++ standard fixes,
// unlike its distributions'), mapped to 53 bits by hand, and walks the candidates in that order: the same seed gives
// the same tokens on every platform and build. Host code on float32 logits, computed in double.
//
// Note [Sampling without sorting the vocabulary]
// Sorting every candidate cost about 16 ms a row for a Llama-3 vocabulary of 128,256 (temperature alone or with
// top_p=0.9, logits drawn from N(0, 3), temperature 0.8, this project's 2-core CI machine): at batch 8 an eighth of a
// second per decode step whose model ran in 3 ms on an H200. Now 1.3 and 2.1 ms. Only the candidates that top-k,
// top-p and the draw read need their order, so the order is built as a prefix (partial sorts growing by 4x from 256)
// as those walks reach it; without top-k the softmax's normaliser is summed over the vocabulary in id order. A model
// whose probability mass sits in a few hundred tokens thus sorts a few hundred; a flat distribution still sorts most
// of them (a random-weight model's logits: top_p 0.9 keeps 90% of the vocabulary). Each growth selects the next
// prefix (nth_element) and sorts it (std::sort) instead of std::partial_sort's heap, over integer keys (the logit's
// order, then the id) instead of ids compared through the logits; the same order, so the same tokens: such a row went
// from 49 to 17-19 ms (128,256 logits from N(0, 0.05), top_p 0.9, temperature 0.8, one core of this project's
// development machine, 2026-12-06).

Sampler::Sampler(const GenerationConfig& config) : config_(config) { config_.validate(); }

std::mt19937_64 Sampler::row_stream(std::uint64_t seed, std::int64_t row) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(row + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return std::mt19937_64(z ^ (z >> 31));
}

namespace {

void apply_repetition_penalty(float* logits, std::int64_t vocab, const std::vector<std::int64_t>& seen,
                              double penalty) {
  if (penalty == 1.0) return;
  std::vector<bool> done(static_cast<std::size_t>(vocab), false);
  for (std::int64_t t : seen) {
    if (t < 0 || t >= vocab || done[static_cast<std::size_t>(t)]) continue;
    done[static_cast<std::size_t>(t)] = true;
    float& l = logits[t];
    l = l > 0 ? static_cast<float>(l / penalty) : static_cast<float>(l * penalty);
  }
}

// The first NaN, else the first of the largest values: torch.argmax's rule, and the device's (argmax_rows).
std::int64_t argmax(const float* logits, std::int64_t vocab) {
  std::int64_t best = 0;
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) return i;
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace

std::int64_t Sampler::next(float* logits, std::int64_t vocab, const std::vector<std::int64_t>& seen,
                           std::mt19937_64& rng) const {
  XPURT_CHECK(vocab > 0, "Sampler: empty logits");
  apply_repetition_penalty(logits, vocab, seen, config_.repetition_penalty);
  if (!config_.do_sample) return argmax(logits, vocab);
  // Candidates by logit, highest first, ties by id (Note [Sampling without sorting the vocabulary]): only the prefix
  // that top-k, top-p and the draw read is ordered.
  // They are sorted as integers: row_sampling::candidate_key (the logit's order, then the lower id) orders them as
  // "higher logit first, ties by the lower id" does, -0 and +0 equal, and integer keys in an array sort several times
  // faster than ids compared through the logits.
  std::vector<std::uint64_t> keys(static_cast<std::size_t>(vocab));
  for (std::int64_t id = 0; id < vocab; ++id) {
    keys[static_cast<std::size_t>(id)] = row_sampling::candidate_key(logits[id], id);
  }
  const std::greater<std::uint64_t> before;
  const auto id_at = [&](std::size_t i) {
    return static_cast<std::int64_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(keys[i]));
  };
  std::size_t keep = keys.size();
  std::size_t sorted = 0;  // keys[0, sorted) are in their final place
  const auto sort_prefix = [&](std::size_t n) {
    n = std::min(n, keep);
    if (n <= sorted) return;
    // The n - sorted first of the rest, then their order: partial_sort's result (`before` is a strict total order,
    // ties broken by id), but a selection and an introsort rather than a heap over most of a flat vocabulary.
    const auto first = keys.begin() + static_cast<std::ptrdiff_t>(sorted);
    const auto middle = keys.begin() + static_cast<std::ptrdiff_t>(n);
    if (middle != keys.end()) std::nth_element(first, middle, keys.end(), before);
    std::sort(first, middle, before);
    sorted = n;
  };
  if (config_.top_k > 0 && static_cast<std::size_t>(config_.top_k) < keep) {
    keep = static_cast<std::size_t>(config_.top_k);
    sort_prefix(keep);
  }
  // Softmax of logits / temperature over the candidates, in double, relative to the largest.
  const std::int64_t best = sorted > 0 ? id_at(0) : argmax(logits, vocab);
  const double top = logits[best] / config_.temperature;
  const auto weight = [&](std::int64_t id) { return std::exp(logits[id] / config_.temperature - top); };
  double total = 0;
  if (sorted == keep) {  // top-k: its candidates, in their order
    for (std::size_t i = 0; i < keep; ++i) total += weight(id_at(i));
  } else {
    for (std::int64_t id = 0; id < vocab; ++id) total += weight(id);
  }
  // The prefix grows by a factor of 4 from 256 until what is read lies in it (the nucleus, the drawn token).
  const auto grow = [&](std::size_t i) {
    if (i >= sorted) sort_prefix(std::max<std::size_t>(256, sorted * 4));
  };
  if (config_.top_p < 1.0) {
    double cumulative = 0;
    std::size_t cut = 0;
    while (cut < keep) {
      grow(cut);
      cumulative += weight(id_at(cut)) / total;
      ++cut;
      if (cumulative >= config_.top_p) break;
    }
    keep = cut;
    total = 0;
    for (std::size_t i = 0; i < keep; ++i) total += weight(id_at(i));
  }
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    grow(i);
    cumulative += weight(id_at(i));
    if (u < cumulative) return id_at(i);
  }
  sort_prefix(keep);
  return id_at(keep - 1);
}

}  // namespace xpuruntime::generation
