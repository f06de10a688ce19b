// Sampling rows where the logits are (Note [Sampling rows where the logits are] in core/row_sampling.h): the shared
// arithmetic (Philox against Random123's known answers, the draw's scaling, the candidate order), the host
// implementation's definition (greedy, NaN, top-k, top-p, the penalty, the distribution, reproducibility) and, on a
// GPU, the sample_rows kernel against the host implementation at odd vocabulary sizes in every float dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/half.h"
#include "core/row_sampling.h"
#include "generation/row_sampler.h"
#include "generation/step_io.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::generation {
namespace {

namespace rs = row_sampling;

rs::RowParams sampled(float temperature = 1.0f, std::int64_t top_k = 0, float top_p = 1.0f) {
  rs::RowParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = 7;
  return p;
}

std::int64_t draw(const std::vector<float>& x, rs::RowParams p, std::uint64_t counter,
                  const std::vector<std::int64_t>& seen = {}) {
  p.counter = counter;
  return sample_row_host(x.data(), static_cast<std::int64_t>(x.size()), p, seen);
}

std::vector<float> normal_logits(std::int64_t vocab, std::uint64_t seed, float sigma = 3.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(static_cast<std::size_t>(vocab));
  for (float& v : x) v = normal(rng);
  return x;
}

// `x` as a host [rows, vocab] tensor of `dtype`, and (through *rounded) the float32 values it holds.
Tensor as_rows(const std::vector<float>& x, std::int64_t rows, DType dtype, std::vector<float>* rounded) {
  const std::int64_t vocab = static_cast<std::int64_t>(x.size()) / rows;
  Tensor t = Tensor::empty({rows, vocab}, dtype);
  rounded->resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::kFloat32) {
      static_cast<float*>(t.data_ptr())[i] = (*rounded)[i] = x[i];
    } else if (dtype == DType::kFloat16) {
      const std::uint16_t h = detail::float_to_half(x[i]);
      static_cast<std::uint16_t*>(t.data_ptr())[i] = h;
      (*rounded)[i] = detail::half_to_float(h);
    } else {
      const std::uint16_t b = detail::float_to_bfloat16(x[i]);
      static_cast<std::uint16_t*>(t.data_ptr())[i] = b;
      (*rounded)[i] = detail::bfloat16_to_float(b);
    }
  }
  return t;
}

TEST(RowSampling, PhiloxMatchesRandom123sKnownAnswers) {
  const std::uint32_t cases[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
       0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
       0x24126ea1}};
  for (const auto& c : cases) {
    std::uint32_t out[4];
    rs::philox4x32_10(c, c + 4, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], c[6 + i]) << i;
  }
}

TEST(RowSampling, ScaledDrawsAreTheHighWordOfTheProduct) {
  EXPECT_EQ(rs::scale_draw(std::uint64_t{1} << 63, 10), 5u);
  EXPECT_EQ(rs::scale_draw(~std::uint64_t{0}, 1000), 999u);
  EXPECT_EQ(rs::scale_draw(0, 1000), 0u);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {  // against long double for totals below 2^40 (64-bit mantissa: exact enough)
    const std::uint64_t r = rng(), total = rng() >> 24;
    const auto expected = static_cast<std::uint64_t>(std::floor(static_cast<long double>(r) / 18446744073709551616.0L *
                                                                static_cast<long double>(total)));
    const std::uint64_t got = rs::scale_draw(r, total);
    EXPECT_TRUE(got == expected || got + 1 == expected || got == expected + 1) << r << " " << total;
    EXPECT_LT(got, total);
  }
}

TEST(RowSampling, CandidateKeysOrderByValueThenLowerId) {
  const std::vector<float> ascending = {-INFINITY, -1e30f, -2.5f, -1e-40f, -0.0f, 1e-40f, 1.0f, 3e38f, INFINITY};
  for (std::size_t i = 1; i < ascending.size(); ++i) {
    if (ascending[i - 1] == ascending[i]) continue;
    EXPECT_LT(rs::order_key(ascending[i - 1]), rs::order_key(ascending[i])) << ascending[i];
  }
  EXPECT_EQ(rs::order_key(-0.0f), rs::order_key(0.0f));
  EXPECT_GT(rs::candidate_key(1.0f, 3), rs::candidate_key(1.0f, 4));  // ties: the lower id first
  EXPECT_GT(rs::candidate_key(1.5f, 9), rs::candidate_key(1.0f, 0));
}

TEST(RowSampler, GreedyRowsTakeTheArgmaxAfterThePenalty) {
  rs::RowParams greedy;
  greedy.greedy = 1;
  EXPECT_EQ(draw({1.0f, 5.0f, 5.0f, 2.0f}, greedy, 0), 1);  // ties: the first
  greedy.penalty = 2.0f;
  EXPECT_EQ(draw({1.0f, 5.0f, 4.0f, 2.0f}, greedy, 0, {1, 1}), 2);  // 5 / 2 once, not twice
  EXPECT_EQ(draw({-1.0f, -0.75f, -0.5f}, greedy, 0, {2}), 1);        // a negative logit is multiplied
  EXPECT_EQ(draw({1.0f, NAN, 9.0f, NAN}, sampled(), 0), 1);          // the first NaN, sampled or not
}

TEST(RowSampler, TopK1AndATinyTopPAreGreedy) {
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> x = normal_logits(1000, seed);
    const auto best = std::max_element(x.begin(), x.end()) - x.begin();
    for (std::uint64_t counter = 0; counter < 5; ++counter) {
      EXPECT_EQ(draw(x, sampled(0.7f, 1), counter), best);
      EXPECT_EQ(draw(x, sampled(1.3f, 0, 1e-6f), counter), best);
    }
  }
}

TEST(RowSampler, DrawsFollowTheSoftmaxWithinTopKAndTopP) {
  const std::vector<float> x = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f};
  const auto softmax = [&](float temperature, const std::set<std::int64_t>& kept) {
    std::map<std::int64_t, double> p;
    double total = 0;
    for (std::int64_t i : kept) total += std::exp(x[static_cast<std::size_t>(i)] / temperature);
    for (std::int64_t i : kept) p[i] = std::exp(x[static_cast<std::size_t>(i)] / temperature) / total;
    return p;
  };
  struct Case {
    rs::RowParams params;
    std::set<std::int64_t> kept;
  };
  // top_p 0.8 at temperature 1: 3.0 (0.63), 2.0 (0.23) reach 0.86 -> {5, 0}.
  const std::vector<Case> cases = {{sampled(0.8f), {0, 1, 2, 3, 4, 5}},
                                   {sampled(1.0f, 3), {5, 0, 1}},
                                   {sampled(1.0f, 0, 0.8f), {5, 0}},
                                   {sampled(2.0f, 4, 0.9f), {5, 0, 1, 2}}};
  constexpr int kDraws = 40000;
  for (const Case& c : cases) {
    std::map<std::int64_t, double> seen;
    for (int i = 0; i < kDraws; ++i) seen[draw(x, c.params, static_cast<std::uint64_t>(i))] += 1.0 / kDraws;
    const auto expected = softmax(c.params.temperature, c.kept);
    for (const auto& [token, share] : seen) EXPECT_EQ(c.kept.count(token), 1u) << token << " was drawn";
    for (const auto& [token, p] : expected) {
      EXPECT_NEAR(seen[token], p, 5 * std::sqrt(p * (1 - p) / kDraws) + 1e-9) << "token " << token;
    }
  }
}

// The definition's steps 3-6 read literally: every candidate sorted by key, top_k and top_p cut from the sorted list.
std::int64_t draw_by_sorting(const std::vector<float>& x, const rs::RowParams& p) {
  const auto vocab = static_cast<std::int64_t>(x.size());
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] / p.temperature;
  const float top = *std::max_element(y.begin(), y.end());
  const auto key = [&](std::int64_t i) { return rs::candidate_key(y[static_cast<std::size_t>(i)], i); };
  const auto weight = [&](std::int64_t i) {
    const float v = y[static_cast<std::size_t>(i)];
    return v == top ? (std::uint64_t{1} << rs::kWeightBits) : rs::fixed_weight(std::exp(v - top));
  };
  std::vector<std::int64_t> order(x.size());
  for (std::int64_t i = 0; i < vocab; ++i) order[static_cast<std::size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return key(a) > key(b); });
  std::size_t kept = order.size();
  if (p.top_k > 0 && p.top_k < vocab) kept = static_cast<std::size_t>(p.top_k);
  if (p.top_p < 1.0f) {
    std::uint64_t sum = 0, running = 0;
    for (std::size_t j = 0; j < kept; ++j) sum += weight(order[j]);
    const std::uint64_t mass = rs::nucleus_mass(p.top_p, sum);
    for (std::size_t j = 0; j < kept; ++j) {
      running += weight(order[j]);
      if (running >= mass) {
        kept = j + 1;
        break;
      }
    }
  }
  const std::uint64_t threshold = key(order[kept - 1]);
  std::uint64_t total = 0, running = 0;
  for (std::int64_t i = 0; i < vocab; ++i) total += key(i) >= threshold ? weight(i) : 0;
  const std::uint64_t u = rs::scale_draw(rs::draw_word(p), total);
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (key(i) < threshold) continue;
    running += weight(i);
    if (u < running) return i;
  }
  return -1;
}

TEST(RowSampler, TheSelectionsDrawWhatSortingEveryCandidateDraws) {
  // Near-uniform rows (a nucleus of most of the vocabulary, the selection's many rounds) and peaked ones, with ties.
  for (const std::int64_t vocab : {1, 2, 33, 257, 1000, 4099, 50000}) {
    for (const float sigma : {0.05f, 4.0f}) {
      std::vector<float> x = normal_logits(vocab, static_cast<std::uint64_t>(vocab) * 3 + 1, sigma);
      for (std::size_t i = 3; i < x.size(); i += 7) x[i] = x[i - 3];
      for (const std::int64_t top_k : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, vocab - 1}) {
        for (const float top_p : {1.0f, 0.95f, 0.5f, 0.01f}) {
          for (std::uint64_t counter = 0; counter < 3; ++counter) {
            rs::RowParams p = sampled(0.8f, top_k, top_p);
            p.counter = counter;
            ASSERT_EQ(draw(x, p, counter), draw_by_sorting(x, p))
                << "vocab " << vocab << ", sigma " << sigma << ", top_k " << top_k << ", top_p " << top_p;
          }
        }
      }
    }
  }
}

TEST(RowSampler, APenaltyMakesSeenTokensRarer) {
  const std::vector<float> x = {1.0f, 1.0f, 1.0f, 1.0f};
  rs::RowParams p = sampled();
  p.penalty = 3.0f;
  int drawn = 0;
  for (std::uint64_t i = 0; i < 4000; ++i) drawn += draw(x, p, i, {2, 2}) == 2 ? 1 : 0;
  // exp(1/3) / (3 e + exp(1/3)) = 0.145
  EXPECT_NEAR(drawn / 4000.0, 0.1446, 0.025);
}

TEST(RowSampler, TheSameSeedStreamAndStepGiveTheSameToken) {
  const std::vector<float> x = normal_logits(50257, 4, 1.0f);
  std::vector<std::int64_t> first, again, other_stream, other_seed;
  for (std::uint64_t counter = 0; counter < 64; ++counter) {
    rs::RowParams p = sampled(0.9f, 50, 0.95f);
    first.push_back(draw(x, p, counter));
    again.push_back(draw(x, p, counter));
    p.stream = 1;
    other_stream.push_back(draw(x, p, counter));
    p.stream = 0;
    p.seed = 8;
    other_seed.push_back(draw(x, p, counter));
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other_stream);
  EXPECT_NE(first, other_seed);
}

TEST(RowSampler, RowsOfEveryFloatDtypeOnTheHost) {
  const std::int64_t vocab = 37;
  const std::vector<float> x = normal_logits(vocab * 3, 11);
  std::vector<rs::RowParams> params = {sampled(0.8f, 5), sampled(1.0f, 0, 0.9f), sampled()};
  params[2].greedy = 1;
  const std::vector<std::int64_t> seen = {3};
  const std::vector<const std::vector<std::int64_t>*> lists = {nullptr, &seen, nullptr};
  std::vector<float> rounded;
  const Tensor rows = as_rows(x, 3, DType::kFloat32, &rounded);
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {  // the values the dtype holds
    const Tensor typed = as_rows(x, 3, dtype, &rounded);
    const std::vector<std::int64_t> got = sample_rows(typed, params, lists);
    ASSERT_EQ(got.size(), 3u);
    for (std::int64_t r = 0; r < 3; ++r) {
      EXPECT_EQ(got[static_cast<std::size_t>(r)],
                sample_row_host(rounded.data() + r * vocab, vocab, params[static_cast<std::size_t>(r)],
                                r == 1 ? seen : std::vector<std::int64_t>{}));
    }
  }
  XPURT_EXPECT_THROW_WITH(sample_rows(rows, {params[0]}, lists), InvalidArgumentError, "3 rows but 1 parameter");
  XPURT_EXPECT_THROW_WITH(sample_rows(Tensor::empty({3}, DType::kFloat32), params, lists), InvalidTypeError,
                          "[batch, vocab]");
  XPURT_EXPECT_THROW_WITH(sample_rows(Tensor::empty({3, 4}, DType::kInt64), params, lists), InvalidTypeError,
                          "float32, float16 or bfloat16");
}

// ---- GPU: the sample_rows kernel against the host implementation ----

// Note [Rows picked in parallel]: sampled rows of a large vocabulary are picked on several threads, each row's token
// where it belongs (a row that needs none stays empty); an exception is rethrown, the lowest row's when several
// throw; greedy rows and small vocabularies stay on the calling thread.
TEST(StepIo, SampledRowsOfALargeVocabularyArePickedInParallel) {
  const std::int64_t rows = 9, vocab = 5000;
  const auto logits_with_peaks = [](std::int64_t count, std::int64_t width) {
    Tensor t = Tensor::empty({count, width}, DType::kFloat32);
    auto* x = static_cast<float*>(t.data_ptr());
    for (std::int64_t i = 0; i < count * width; ++i) x[i] = 0.0f;
    for (std::int64_t r = 0; r < count; ++r) x[r * width + (r * 37) % width] = 1.0f;
    return t;
  };
  std::mutex lock;
  std::set<std::thread::id> threads;
  const auto argmax_of = [&](std::size_t i, const Tensor& host) -> std::optional<std::int64_t> {
    {
      const std::lock_guard<std::mutex> guard(lock);
      threads.insert(std::this_thread::get_id());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // so that the threads' rows overlap
    if (i == 4) return std::nullopt;
    const std::vector<float> row = step_io::host_row(host, static_cast<std::int64_t>(i), "logits");
    return static_cast<std::int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  const Tensor large = logits_with_peaks(rows, vocab);
  const step_io::PickedTokens picked = step_io::pick_tokens(large, rows, false, argmax_of);
  ASSERT_EQ(picked.tokens.size(), static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    if (r == 4) {
      EXPECT_FALSE(picked.tokens[4].has_value());
    } else {
      EXPECT_EQ(picked.tokens[static_cast<std::size_t>(r)], (r * 37) % vocab) << "row " << r;
    }
  }
  if (std::thread::hardware_concurrency() > 1) {
    EXPECT_GT(threads.size(), 1u);
  }
  const auto failing = [](std::size_t i, const Tensor&) -> std::optional<std::int64_t> {
    if (i == 3 || i == 6) throw InvalidArgumentError("row " + std::to_string(i));
    return 0;
  };
  try {
    step_io::pick_tokens(large, rows, false, failing);
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("row 3"), std::string::npos) << e.what();
  }
  for (const bool greedy : {true, false}) {
    threads.clear();
    const Tensor logits = greedy ? large : logits_with_peaks(rows, 100);
    const step_io::PickedTokens serial = step_io::pick_tokens(logits, rows, greedy, argmax_of);
    EXPECT_EQ(threads, std::set<std::thread::id>{std::this_thread::get_id()}) << (greedy ? "greedy" : "small");
    EXPECT_EQ(serial.tokens[2], greedy ? 74 : 74 % 100);
  }
}

TEST(RowSamplerGpu, TheKernelDrawsWhatTheHostDraws) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  std::size_t compared = 0, equal = 0;
  for (const std::int64_t vocab : {1, 37, 1000, 4099, 32000, 128256}) {
    for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const std::int64_t rows = 6;
      const std::vector<float> x = normal_logits(rows * vocab, rng(), 3.0f);
      std::vector<float> rounded;
      const Tensor device = as_rows(x, rows, dtype, &rounded).to(Device::cuda(0));
      std::vector<rs::RowParams> params = {sampled(0.8f), sampled(1.0f, 40), sampled(0.7f, 0, 0.9f),
                                           sampled(1.2f, 100, 0.5f), sampled(), sampled()};
      params[4].greedy = 1;
      params[4].penalty = 1.5f;
      params[5].penalty = 1.3f;
      std::vector<std::int64_t> seen;
      for (int i = 0; i < 50; ++i) seen.push_back(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(vocab)));
      const std::vector<const std::vector<std::int64_t>*> lists = {nullptr, nullptr, nullptr, &seen, &seen, &seen};
      for (std::uint64_t step = 0; step < 8; ++step) {
        for (auto& p : params) p.counter = step;
        const std::vector<std::int64_t> got = sample_rows(device, params, lists);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t want =
              sample_row_host(rounded.data() + r * vocab, vocab, params[static_cast<std::size_t>(r)],
                              lists[static_cast<std::size_t>(r)] ? seen : std::vector<std::int64_t>{});
          ASSERT_GE(got[static_cast<std::size_t>(r)], 0);
          ASSERT_LT(got[static_cast<std::size_t>(r)], vocab);
          if (params[static_cast<std::size_t>(r)].greedy) {
            EXPECT_EQ(got[static_cast<std::size_t>(r)], want) << "greedy row, vocab " << vocab;
          }
          ++compared;
          equal += got[static_cast<std::size_t>(r)] == want ? 1 : 0;
        }
      }
    }
  }
  // The two differ only where the device's expf and the host's differ by an ulp at a boundary (the Note).
  EXPECT_GE(static_cast<double>(equal), 0.99 * static_cast<double>(compared)) << equal << " of " << compared;
}

TEST(RowSamplerGpu, TheKernelIsReproducibleAndFindsNaN) {
  XPURT_SKIP_WITHOUT_GPU();
  const std::int64_t vocab = 50257;
  std::vector<float> x = normal_logits(2 * vocab, 9, 2.0f);
  x[static_cast<std::size_t>(vocab + 777)] = NAN;
  std::vector<float> rounded;
  const Tensor device = as_rows(x, 2, DType::kFloat32, &rounded).to(Device::cuda(0));
  const std::vector<rs::RowParams> params = {sampled(0.9f, 0, 0.95f), sampled(0.9f, 0, 0.95f)};
  const std::vector<const std::vector<std::int64_t>*> lists = {nullptr, nullptr};
  const std::vector<std::int64_t> first = sample_rows(device, params, lists);
  EXPECT_EQ(first[1], 777);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sample_rows(device, params, lists), first);
}

}  // namespace
}  // namespace xpuruntime::generation
