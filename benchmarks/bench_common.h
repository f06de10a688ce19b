// Helpers shared by the C++ session benchmarks (ort_direct_bench.cpp, session_direct_bench.cpp): "--flag value"
// argument pairs and percentiles of the timed calls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

// Calls `handle(flag, value)` for every "--flag value" pair of argv; a flag without a value -> invalid_argument.
template <typename Handle>
void for_each_flag(int argc, char** argv, Handle handle) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + flag);
    handle(flag, std::string(argv[++i]));
  }
}

inline bool flag_true(const std::string& value) { return value == "1" || value == "true"; }

// The flags every session benchmark takes: --model (required), --batch, --device, --graphs, --iterations, --warmup.
struct CommonArgs {
  std::string model;
  std::int64_t batch = 1;
  std::string device = "cuda";
  bool graphs = false;
  int iterations = 100;
  int warmup = 10;
};

// Parses argv into `args`: the common flags here, any other through `extra(flag, value)`, which returns false for a
// flag it does not know either (-> invalid_argument). Then checks that --model is given and the counts are valid.
template <typename Extra>
void parse_args(int argc, char** argv, CommonArgs& args, Extra extra) {
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--model") {
      args.model = value;
    } else if (flag == "--batch") {
      args.batch = std::stoll(value);
    } else if (flag == "--device") {
      args.device = value;
    } else if (flag == "--graphs") {
      args.graphs = flag_true(value);
    } else if (flag == "--iterations") {
      args.iterations = std::stoi(value);
    } else if (flag == "--warmup") {
      args.warmup = std::stoi(value);
    } else if (!extra(flag, value)) {
      throw std::invalid_argument("unknown flag " + flag);
    }
  });
  if (args.model.empty()) throw std::invalid_argument("--model is required");
  if (args.iterations < 1 || args.warmup < 0) throw std::invalid_argument("bad --iterations or --warmup");
}

// The q-quantile (0..1) of `samples`, linearly interpolated.
inline double percentile(std::vector<double> samples, double q) {
  std::sort(samples.begin(), samples.end());
  const double position = q * static_cast<double>(samples.size() - 1);
  const auto lo = static_cast<std::size_t>(position);
  const std::size_t hi = std::min(lo + 1, samples.size() - 1);
  return samples[lo] + (samples[hi] - samples[lo]) * (position - static_cast<double>(lo));
}

}  // namespace bench
