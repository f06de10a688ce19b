// DType: the element types of xpuruntime tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "xpuruntime/export.h"

namespace xpuruntime {

enum class DType : std::uint8_t {
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
  // Appended after kBool so that the earlier dtypes keep their numeric values.
  kUInt16,
  kUInt32,
  kUInt64,
};

XPURT_API std::size_t dtype_size(DType dtype);
// Canonical name: "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64",
// "bool", "uint16", "uint32", "uint64".
XPURT_API std::string_view dtype_name(DType dtype);
// Accepts canonical names and the usual aliases ("half", "fp16", "bf16", "float", "fp32", "double", "long",
// "int"). Throws InvalidTypeError listing the valid names otherwise.
XPURT_API DType dtype_from_name(std::string_view name);

}  // namespace xpuruntime
