// Checked arithmetic over a window op's geometry (sizes, pads, strides, dilations), shared by the registry's shape
// inference (core/op_schemas.cpp) and the reference library's window ops (backends/cpu/onnx): a sum or product that
// leaves int64 is a malformed model, refused with InvalidArgumentError naming the op or node, never a wrapped size
// that a kernel would later index with. Internal header.
#pragma once

#include <cstdint>

#include "xpuruntime/exceptions.h"

namespace xpuruntime::detail {

// a + b and a * b; on overflow, InvalidArgumentError "<where()>: its window geometry (sizes, pads, strides,
// dilations) overflows 64-bit integers: a + b". `where` (a callable giving the op's or node's name) is called only
// then.
template <typename Where>
std::int64_t window_add(std::int64_t a, std::int64_t b, const Where& where) {
  std::int64_t sum = 0;
  XPURT_CHECK(!__builtin_add_overflow(a, b, &sum), where(), ": its window geometry (sizes, pads, strides, ",
              "dilations) overflows 64-bit integers: ", a, " + ", b);
  return sum;
}
template <typename Where>
std::int64_t window_mul(std::int64_t a, std::int64_t b, const Where& where) {
  std::int64_t product = 0;
  XPURT_CHECK(!__builtin_mul_overflow(a, b, &product), where(), ": its window geometry (sizes, pads, strides, ",
              "dilations) overflows 64-bit integers: ", a, " * ", b);
  return product;
}

}  // namespace xpuruntime::detail
