// Text generation's host parts (include/xpuruntime/generation.h): the Sampler (greedy, ties, temperature, top-k,
// top-p, repetition penalty, seeded streams), GenerationConfig's checks and DecoderSignature's recognition of the
// exporters' names and shapes; the PagedKvPool's blocks, references, prefix index and copies. The loop and the
// ContinuousBatcher against a real model are tests/python/test_generation.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/generation.h"

namespace xpuruntime::generation {
namespace {

GenerationConfig sampling(double temperature = 1.0, std::int64_t top_k = 0, double top_p = 1.0) {
  GenerationConfig c;
  c.do_sample = true;
  c.temperature = temperature;
  c.top_k = top_k;
  c.top_p = top_p;
  return c;
}

std::map<std::int64_t, double> frequencies(const GenerationConfig& config, std::vector<float> logits, int draws) {
  Sampler sampler(config);
  std::mt19937_64 rng = Sampler::row_stream(17, 0);
  std::map<std::int64_t, double> out;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> copy = logits;
    out[sampler.next(copy.data(), static_cast<std::int64_t>(copy.size()), {}, rng)] += 1.0 / draws;
  }
  return out;
}

TEST(Sampler, GreedyTakesTheFirstOfEqualMaxima) {
  Sampler sampler{GenerationConfig{}};
  std::mt19937_64 rng = Sampler::row_stream(0, 0);
  std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sampler.next(logits.data(), 4, {}, rng), 1);
}

// torch.argmax's rule, which the device's argmax_rows keeps too (Note [Logits read back]): the first NaN wins.
TEST(Sampler, GreedyTakesTheFirstNaNAsTorchArgmaxDoes) {
  Sampler sampler{GenerationConfig{}};
  EXPECT_TRUE(sampler.argmax_only());
  std::mt19937_64 rng = Sampler::row_stream(0, 0);
  std::vector<float> logits{0.5f, 2.0f, NAN, 7.0f, NAN};
  EXPECT_EQ(sampler.next(logits.data(), 5, {}, rng), 2);
  std::vector<float> first{NAN, 9.0f};
  EXPECT_EQ(sampler.next(first.data(), 2, {}, rng), 0);
  std::vector<float> masked{-INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ(sampler.next(masked.data(), 3, {}, rng), 0);
  GenerationConfig penalised;
  penalised.repetition_penalty = 1.2;
  EXPECT_FALSE(Sampler(penalised).argmax_only());
  EXPECT_FALSE(Sampler(sampling(1.0, 0)).argmax_only());
}

// Note [Sampling without sorting the vocabulary]: the prefix-sorted sampler draws what a full sort of the candidates
// draws, token for token, over random logits with many ties (-0 and +0 among them), every combination of top-k and top-p and two
// temperatures (the reference here is the sampler before the change: sort everything, sum in that order).
std::int64_t full_sort_reference(const GenerationConfig& c, std::vector<float> l, std::mt19937_64& rng) {
  std::vector<std::int64_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::int64_t a, std::int64_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  std::size_t keep = c.top_k > 0 ? std::min(order.size(), static_cast<std::size_t>(c.top_k)) : order.size();
  const double top = l[order.front()] / c.temperature;
  std::vector<double> probs(keep);
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += probs[i] = std::exp(l[order[i]] / c.temperature - top);
  if (c.top_p < 1.0) {
    double cumulative = 0;
    std::size_t cut = 0;
    while (cut < keep) {
      cumulative += probs[cut++] / total;
      if (cumulative >= c.top_p) break;
    }
    keep = cut;
    total = std::accumulate(probs.begin(), probs.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    cumulative += probs[i];
    if (u < cumulative) return order[i];
  }
  return order[keep - 1];
}

TEST(Sampler, PrefixSortingDrawsWhatAFullSortDraws) {
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> level(-40, 40);
  for (const std::int64_t vocab : {7, 300, 5000}) {
    std::vector<float> logits(static_cast<std::size_t>(vocab));
    for (float& v : logits) v = static_cast<float>(level(gen)) / 8.0f;  // eighths: many ties
    for (std::size_t i = 0; i < logits.size(); i += 3) {
      if (logits[i] == 0.0f) logits[i] = -0.0f;  // -0 ties with +0
    }
    for (const std::int64_t k : {0, 1, 5, 400}) {
      for (const double p : {1.0, 0.9, 0.3}) {
        for (const double t : {0.7, 1.5}) {
          const GenerationConfig c = sampling(t, k, p);
          Sampler sampler(c);
          std::mt19937_64 ours = Sampler::row_stream(5, vocab), theirs = Sampler::row_stream(5, vocab);
          for (int draw = 0; draw < 50; ++draw) {
            std::vector<float> copy = logits;
            ASSERT_EQ(sampler.next(copy.data(), vocab, {}, ours), full_sort_reference(c, logits, theirs))
                << "vocab " << vocab << " top_k " << k << " top_p " << p << " temperature " << t << " draw " << draw;
          }
        }
      }
    }
  }
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperature) {
  std::vector<float> logits{0.1f, 3.0f, 3.0f, 2.9f, -4.0f};
  const auto f = frequencies(sampling(5.0, 1), logits, 200);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f.begin()->first, 1);
}

TEST(Sampler, DrawsFollowTheSoftmaxUnderTemperatureTopKAndTopP) {
  const std::vector<float> logits{2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f};
  const auto softmax = [&](double t, const std::vector<int>& keep) {
    std::map<std::int64_t, double> p;
    double total = 0;
    for (int i : keep) total += std::exp(logits[static_cast<std::size_t>(i)] / t);
    for (int i : keep) p[i] = std::exp(logits[static_cast<std::size_t>(i)] / t) / total;
    return p;
  };
  const auto expect_close = [](const std::map<std::int64_t, double>& got, const std::map<std::int64_t, double>& want) {
    for (std::int64_t token = 0; token < 6; ++token) {
      const double g = got.count(token) ? got.at(token) : 0.0;
      const double w = want.count(token) ? want.at(token) : 0.0;
      EXPECT_NEAR(g, w, 0.02) << "token " << token;
    }
  };
  const int n = 20000;
  expect_close(frequencies(sampling(1.0), logits, n), softmax(1.0, {0, 1, 2, 3, 4, 5}));
  expect_close(frequencies(sampling(0.5), logits, n), softmax(0.5, {0, 1, 2, 3, 4, 5}));
  expect_close(frequencies(sampling(1.0, 3), logits, n), softmax(1.0, {5, 0, 1}));
  // p(5) = 0.605: top_p 0.6 keeps it alone, 0.7 adds token 0.
  expect_close(frequencies(sampling(1.0, 0, 0.6), logits, n), softmax(1.0, {5}));
  expect_close(frequencies(sampling(1.0, 0, 0.7), logits, n), softmax(1.0, {5, 0}));
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  GenerationConfig c;
  c.repetition_penalty = 2.0;
  Sampler sampler(c);
  std::mt19937_64 rng = Sampler::row_stream(0, 0);
  std::vector<float> logits{3.0f, 2.0f, -1.0f};
  // 3 -> 1.5 (seen twice, penalised once), 2 stays, -1 -> -2: token 1 wins.
  EXPECT_EQ(sampler.next(logits.data(), 3, {0, 2, 0}, rng), 1);
  EXPECT_FLOAT_EQ(logits[0], 1.5f);
  EXPECT_FLOAT_EQ(logits[1], 2.0f);
  EXPECT_FLOAT_EQ(logits[2], -2.0f);
}

TEST(Sampler, StreamsAreFixedPerSeedAndRow) {
  std::mt19937_64 a = Sampler::row_stream(42, 0);
  std::mt19937_64 b = Sampler::row_stream(42, 0);
  std::mt19937_64 c = Sampler::row_stream(42, 1);
  std::mt19937_64 d = Sampler::row_stream(43, 0);
  const std::uint64_t first = a();
  EXPECT_EQ(first, b());
  EXPECT_NE(first, c());
  EXPECT_NE(first, d());
}

TEST(GenerationConfig, ChecksEveryField) {
  EXPECT_NO_THROW(GenerationConfig{}.validate());
  const auto bad = [](auto edit, const char* field) {
    GenerationConfig c;
    edit(c);
    XPURT_EXPECT_THROW_WITH(c.validate(), InvalidArgumentError, field);
  };
  bad([](GenerationConfig& c) { c.top_p = 0; }, "top_p");
  bad([](GenerationConfig& c) { c.top_p = 1.01; }, "top_p");
  bad([](GenerationConfig& c) { c.temperature = -0.5; }, "temperature");
  bad([](GenerationConfig& c) { c.temperature = NAN; }, "temperature");
  bad([](GenerationConfig& c) { c.top_k = -1; }, "top_k");
  bad([](GenerationConfig& c) { c.max_new_tokens = 0; }, "max_new_tokens");
  bad([](GenerationConfig& c) { c.max_length = -3; }, "max_length");
  bad([](GenerationConfig& c) { c.repetition_penalty = 0; }, "repetition_penalty");
  bad([](GenerationConfig& c) { c.stop_tokens = {4, -1}; }, "stop_tokens");
  bad([](GenerationConfig& c) { c.pad_token_id = -1; }, "pad_token_id");
  bad(
      [](GenerationConfig& c) {
        c.padding = PaddingSide::kRight;
        c.cache = CacheMode::kNone;
      },
      "padding");
  GenerationConfig right;
  right.padding = PaddingSide::kRight;
  EXPECT_NO_THROW(right.validate());
  EXPECT_NE(right.str().find("padding=right"), std::string::npos);
}

ValueInfo info(const std::string& name, DType dtype, std::vector<std::string> shape) {
  ValueInfo v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  return v;
}

std::vector<ValueInfo> cache_values(const std::string& past, const std::string& present, bool inputs, int layers) {
  std::vector<ValueInfo> out;
  for (int l = 0; l < layers; ++l) {
    for (const char* kind : {"value", "key"}) {  // out of order on purpose: slots are sorted
      const std::string name = (inputs ? past : present) + std::to_string(l) + "." + kind;
      out.push_back(info(name, DType::kFloat16, {"batch", "4", inputs ? "past" : "total", "16"}));
    }
  }
  return out;
}

TEST(GenerationStats, RatesAndOccupancyWithoutDividingByZero) {
  GenerationStats empty;
  EXPECT_EQ(empty.prefill_tokens_per_s(), 0.0);
  EXPECT_EQ(empty.decode_tokens_per_s(), 0.0);
  EXPECT_EQ(empty.ms_per_decode_step(), 0.0);
  EXPECT_EQ(empty.cache_occupancy(), 0.0);
  EXPECT_NE(empty.str().find("no cache"), std::string::npos) << empty.str();
  GenerationStats s;
  s.prefill_tokens = 24;
  s.prefill_ms = 2.0;
  s.decode_steps = 4;
  s.decode_tokens = 10;
  s.decode_ms = 5.0;
  s.cache_length = 30;
  s.cache_capacity = 40;
  s.cache_bytes = 3 * 1024;
  s.decode_feeds_ms = 0.4;  // Note [Where a decode step goes]: per step 0.1, 0.8, 0.05, 0.2, the rest 0.1
  s.decode_run_ms = 3.2;
  s.decode_commit_ms = 0.2;
  s.decode_pick_ms = 0.8;
  EXPECT_DOUBLE_EQ(s.prefill_tokens_per_s(), 12000.0);
  EXPECT_DOUBLE_EQ(s.decode_tokens_per_s(), 2000.0);
  EXPECT_DOUBLE_EQ(s.ms_per_decode_step(), 1.25);
  EXPECT_DOUBLE_EQ(s.cache_occupancy(), 0.75);
  EXPECT_EQ(s.str(), "prefill 24 tokens in 2.00 ms (12000 tokens/s); decode 4 steps, 10 tokens in 5.00 ms (1.25 "
                     "ms/step, 2000 tokens/s); a step feeds 0.100 ms, run 0.800, cache commit 0.050, token pick "
                     "0.200, other 0.100; cache 30 of 40 positions (75%), 3.0 KiB");
}

// ---- PagedKvPool (Note [Paged KV pool]) ----

CacheSlot float_slot(int layer, bool key) {
  CacheSlot s;
  s.layer = layer;
  s.is_key = key;
  s.past_input = "past." + std::to_string(layer) + (key ? ".key" : ".value");
  s.present_output = "present." + std::to_string(layer) + (key ? ".key" : ".value");
  s.heads = 2;
  s.head_dim = 3;
  return s;
}

// A [heads, count, head_dim] host tensor whose element (h, p, d) is base + 100 h + 10 p + d.
Tensor numbered(std::int64_t heads, std::int64_t count, std::int64_t head_dim, float base) {
  Tensor t = Tensor::empty({heads, count, head_dim}, DType::kFloat32);
  auto* v = static_cast<float*>(t.data_ptr());
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t p = 0; p < count; ++p) {
      for (std::int64_t d = 0; d < head_dim; ++d) v[(h * count + p) * head_dim + d] = base + 100 * h + 10 * p + d;
    }
  }
  return t;
}

TEST(PagedKvPool, AllocatesLowestBlocksFirstAndReferenceCounts) {
  PagedKvPool pool({float_slot(0, true), float_slot(0, false)}, 6, 4, Device::cpu());
  EXPECT_EQ(pool.num_blocks(), 6);
  EXPECT_EQ(pool.free_blocks(), 6);
  EXPECT_EQ(pool.bytes(), 2u * 2 * 6 * 4 * 3 * sizeof(float));
  const auto a = pool.allocate(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<std::int64_t>{0, 1}));
  const auto b = pool.allocate(3);
  EXPECT_EQ(*b, (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_FALSE(pool.allocate(2).has_value());  // one left: nothing taken
  EXPECT_EQ(pool.free_blocks(), 1);
  pool.retain(0);
  EXPECT_EQ(pool.references(0), 2);
  pool.release(*a);
  EXPECT_EQ(pool.references(0), 1);
  EXPECT_EQ(pool.references(1), 0);
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_EQ(*pool.allocate(1), (std::vector<std::int64_t>{1}));  // the lowest free block again
  EXPECT_THROW(pool.release({5}), InvalidArgumentError);           // never allocated
  EXPECT_THROW(pool.retain(5), InvalidArgumentError);
  EXPECT_THROW(PagedKvPool({float_slot(0, true)}, 0, 4, Device::cpu()), InvalidArgumentError);
}

TEST(PagedKvPool, PrefixesOutliveTheirRequestsUntilTheirBlockIsReused) {
  // Note [Cached prefixes]
  PagedKvPool pool({float_slot(0, true)}, 4, 2, Device::cpu());
  const auto a = *pool.allocate(2);
  pool.register_prefix(11, a[0]);
  pool.register_prefix(22, a[1]);
  pool.register_prefix(11, a[1]);  // a key keeps its first block
  EXPECT_EQ(pool.find_prefix(11), a[0]);
  EXPECT_EQ(pool.find_prefix(22), a[1]);
  EXPECT_FALSE(pool.find_prefix(33).has_value());
  pool.retain(a[0]);
  pool.release(a);  // a[0] still held once, a[1] free but cached
  EXPECT_EQ(pool.find_prefix(11), a[0]);
  EXPECT_EQ(pool.find_prefix(22), a[1]);
  EXPECT_EQ(pool.references(a[1]), 0);
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.cached_blocks(), 1);
  pool.release({a[0]});
  EXPECT_EQ(pool.cached_blocks(), 2);
  pool.retain(a[0]);  // taken back from the cache
  EXPECT_EQ(pool.references(a[0]), 1);
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.free_blocks(), 3);
  // Empty blocks go first, then cached ones: a[1] is reused last and forgets its prefix then.
  EXPECT_EQ(*pool.allocate(2), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(pool.find_prefix(22), a[1]);
  EXPECT_EQ(*pool.allocate(1), (std::vector<std::int64_t>{a[1]}));
  EXPECT_FALSE(pool.find_prefix(22).has_value());
  EXPECT_EQ(pool.find_prefix(11), a[0]);
  EXPECT_FALSE(pool.allocate(1).has_value());
  EXPECT_THROW(pool.retain(a[1] + 10), InvalidArgumentError);
}

TEST(PagedKvPool, ReusesASequencesLastCachedBlockFirst) {
  // A table released at once is cached last block first, so its first block (where a prefix is found from) stays.
  PagedKvPool pool({float_slot(0, true)}, 3, 2, Device::cpu());
  const auto a = *pool.allocate(3);
  for (std::size_t b = 0; b < a.size(); ++b) pool.register_prefix(100 + b, a[b]);
  pool.release(a);
  EXPECT_EQ(pool.cached_blocks(), 3);
  EXPECT_EQ(*pool.allocate(1), (std::vector<std::int64_t>{a[2]}));
  EXPECT_EQ(*pool.allocate(1), (std::vector<std::int64_t>{a[1]}));
  EXPECT_EQ(pool.find_prefix(100), a[0]);
}

TEST(PagedKvPool, AReleaseOfABadTableReleasesNothing) {
  PagedKvPool pool({float_slot(0, true)}, 3, 2, Device::cpu());
  const auto a = *pool.allocate(2);
  EXPECT_THROW(pool.release({a[0], a[1], a[1]}), InvalidArgumentError);  // a[1] is held once
  EXPECT_EQ(pool.references(a[0]), 1);
  EXPECT_EQ(pool.references(a[1]), 1);
  EXPECT_EQ(pool.free_blocks(), 1);
}

TEST(PagedKvPool, WritesAndReadsSequencesAcrossScatteredBlocks) {
  PagedKvPool pool({float_slot(0, true), float_slot(1, true)}, 8, 3, Device::cpu());
  // A sequence of 10 positions over blocks 5, 6 (consecutive: one run), 1 and 3.
  const std::vector<std::int64_t> table = {5, 6, 1, 3};
  const Tensor first = numbered(2, 7, 3, 0.0f);
  const Tensor rest = numbered(2, 3, 3, 1000.0f);
  pool.write(table, 0, 7, 0, first);
  pool.write(table, 7, 3, 0, rest);
  pool.write(table, 0, 7, 1, numbered(2, 7, 3, 5000.0f));
  // Read positions 2 .. 9 into a strided view (a [2, 8, 3] window of a [2, 12, 3] tensor).
  Tensor big = Tensor::zeros({2, 12, 3}, DType::kFloat32);
  const Tensor window = Tensor::from_blob(static_cast<float*>(big.data_ptr()) + 4 * 3, {2, 8, 3}, {36, 3, 1},
                                          DType::kFloat32, Device::cpu(), big.storage());
  pool.read(table, 2, 8, 0, window);
  const auto* v = static_cast<const float*>(big.data_ptr());
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t p = 0; p < 12; ++p) {
      for (std::int64_t d = 0; d < 3; ++d) {
        const std::int64_t position = p - 4 + 2;  // the sequence position this element holds
        float want = 0.0f;
        if (p >= 4) want = position < 7 ? 100 * h + 10 * position + d : 1000 + 100 * h + 10 * (position - 7) + d;
        EXPECT_EQ(v[(h * 12 + p) * 3 + d], want) << "h " << h << " p " << p << " d " << d;
      }
    }
  }
  Tensor other = Tensor::empty({2, 7, 3}, DType::kFloat32);
  pool.read(table, 0, 7, 1, other);
  EXPECT_EQ(static_cast<const float*>(other.data_ptr())[3 * 3 + 1], 5000.0f + 10 * 3 + 1);
  EXPECT_THROW(pool.read(table, 5, 8, 0, Tensor::empty({2, 8, 3}, DType::kFloat32)), InvalidArgumentError);
  EXPECT_THROW(pool.read(table, 0, 4, 0, Tensor::empty({2, 5, 3}, DType::kFloat32)), InvalidArgumentError);
}

TEST(PagedCacheConfig, ChecksEveryField) {
  PagedCacheConfig c;
  EXPECT_NO_THROW(c.validate());
  c.block_size = 0;
  EXPECT_THROW(c.validate(), InvalidArgumentError);
  c = PagedCacheConfig{};
  c.max_batch = 0;
  EXPECT_THROW(c.validate(), InvalidArgumentError);
  c = PagedCacheConfig{};
  c.num_blocks = -1;
  EXPECT_THROW(c.validate(), InvalidArgumentError);
  EXPECT_NE(PagedCacheConfig{}.str().find("block_size=16"), std::string::npos);
  EXPECT_NE(PagedCacheConfig{}.str().find("reservation='on_demand'"), std::string::npos);
}

TEST(PagedCacheConfig, ReservationNamesRoundTrip) {
  for (const BlockReservation r : {BlockReservation::kOnDemand, BlockReservation::kWholeLength}) {
    EXPECT_EQ(parse_block_reservation(block_reservation_name(r)), r);
  }
  EXPECT_STREQ(block_reservation_name(BlockReservation::kWholeLength), "whole_length");
  try {
    parse_block_reservation("lazy");
    FAIL() << "an unknown reservation was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("'on_demand' or 'whole_length', got 'lazy'"), std::string::npos) << e.what();
  }
}

TEST(DecoderSignature, RecognisesTransformersExports) {
  std::vector<ValueInfo> inputs{info("input_ids", DType::kInt64, {"batch", "seq"}),
                                info("attention_mask", DType::kInt64, {"batch", "total"}),
                                info("position_ids", DType::kInt32, {"batch", "seq"})};
  for (const ValueInfo& v : cache_values("past_key_values.", "", true, 3)) inputs.push_back(v);
  std::vector<ValueInfo> outputs{info("logits", DType::kFloat16, {"batch", "seq", "100"})};
  for (const ValueInfo& v : cache_values("", "present.", false, 3)) outputs.push_back(v);
  const DecoderSignature s = DecoderSignature::recognise(inputs, outputs);
  EXPECT_EQ(s.logits, "logits");
  EXPECT_EQ(s.positions_dtype, DType::kInt32);
  ASSERT_EQ(s.cache.size(), 6u);
  EXPECT_EQ(s.cache[0].past_input, "past_key_values.0.key");
  EXPECT_EQ(s.cache[0].present_output, "present.0.key");
  EXPECT_EQ(s.cache[1].past_input, "past_key_values.0.value");
  EXPECT_EQ(s.cache[5].layer, 2);
  EXPECT_EQ(s.cache[5].heads, 4);
  EXPECT_EQ(s.cache[5].head_dim, 16);
  EXPECT_EQ(s.cache[5].dtype, DType::kFloat16);
  EXPECT_NE(s.str().find("3 layers"), std::string::npos) << s.str();
}

TEST(DecoderSignature, RefusesWhatItCannotFeed) {
  const std::vector<ValueInfo> ids{info("input_ids", DType::kInt64, {"batch", "seq"})};
  const std::vector<ValueInfo> logits{info("logits", DType::kFloat32, {"batch", "seq", "10"})};
  EXPECT_TRUE(DecoderSignature::recognise(ids, logits).cache.empty());
  XPURT_EXPECT_THROW_WITH(DecoderSignature::recognise({info("tokens", DType::kInt64, {"b", "s"})}, logits),
                          UnsupportedOperationError, "input_ids");
  std::vector<ValueInfo> with_past = ids;
  with_past.push_back(info("past_key_values.0.key", DType::kFloat32, {"b", "2", "p", "8"}));
  XPURT_EXPECT_THROW_WITH(DecoderSignature::recognise(with_past, logits), UnsupportedOperationError,
                          "no present output");
  std::vector<ValueInfo> outs = logits;
  outs.push_back(info("present.0.key", DType::kFloat32, {"b", "heads", "t", "8"}));
  XPURT_EXPECT_THROW_WITH(DecoderSignature::recognise(with_past, outs), UnsupportedOperationError,
                          "static heads and head_dim");
  std::vector<ValueInfo> extra = ids;
  extra.push_back(info("past_0", DType::kFloat32, {"2", "b", "2", "p", "8"}));
  XPURT_EXPECT_THROW_WITH(DecoderSignature::recognise(extra, logits), UnsupportedOperationError, "not supported yet");
  XPURT_EXPECT_THROW_WITH(
      DecoderSignature::recognise(ids, {info("last_hidden_state", DType::kFloat32, {"b", "s", "32"})}),
      UnsupportedOperationError, "hidden states");
  XPURT_EXPECT_THROW_WITH(DecoderSignature::recognise(ids, {info("a", DType::kFloat32, {"b", "s", "3"}),
                                                           info("b", DType::kFloat32, {"b", "s", "3"})}),
                          UnsupportedOperationError, "logits");
}

}  // namespace
}  // namespace xpuruntime::generation
