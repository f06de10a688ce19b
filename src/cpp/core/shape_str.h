// A shape in a message: "[2, 3, 4]" (or "[2,3,4]" with separator ","). Internal header.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xpuruntime::detail {

inline std::string shape_str(const std::vector<std::int64_t>& shape, std::string_view separator = ", ") {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (k) out += separator;
    out += std::to_string(shape[k]);
  }
  return out + "]";
}

}  // namespace xpuruntime::detail
