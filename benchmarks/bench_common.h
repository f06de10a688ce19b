// Helpers shared by the C++ session benchmarks (ort_direct_bench.cpp, session_direct_bench.cpp): "--flag value"
// argument pairs and percentiles of the timed calls.
#pragma once

#include <algorithm>
#include <cstddef>
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

// The q-quantile (0..1) of `samples`, linearly interpolated.
inline double percentile(std::vector<double> samples, double q) {
  std::sort(samples.begin(), samples.end());
  const double position = q * static_cast<double>(samples.size() - 1);
  const auto lo = static_cast<std::size_t>(position);
  const std::size_t hi = std::min(lo + 1, samples.size() - 1);
  return samples[lo] + (samples[hi] - samples[lo]) * (position - static_cast<double>(lo));
}

}  // namespace bench
