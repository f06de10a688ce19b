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
  // Appended after kUInt64 (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h): one byte per element each. The
  // float8 formats are ONNX's (17-20); int4/uint4 are held unpacked, one value per byte (int4 sign-extended into
  // an int8 in [-8, 7], uint4 a uint8 in [0, 15]), and packed two per byte only at the ONNX boundary. They are
  // storage types: QuantizeLinear, DequantizeLinear, Cast, MatMulNBits and data movement take them; every other
  // kernel refuses them.
  kFloat8E4M3FN,
  kFloat8E4M3FNUZ,
  kFloat8E5M2,
  kFloat8E5M2FNUZ,
  kInt4,
  kUInt4,
};

XPURT_API std::size_t dtype_size(DType dtype);
// Canonical name: "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64",
// "bool", "uint16", "uint32", "uint64", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "int4",
// "uint4" (ONNX's names of the last six).
XPURT_API std::string_view dtype_name(DType dtype);
// Accepts canonical names and the usual aliases ("half", "fp16", "bf16", "float", "fp32", "double", "long",
// "int"). Throws InvalidTypeError listing the valid names otherwise.
XPURT_API DType dtype_from_name(std::string_view name);

// The four float8 formats.
inline bool is_float8_dtype(DType dtype) {
  return dtype == DType::kFloat8E4M3FN || dtype == DType::kFloat8E4M3FNUZ || dtype == DType::kFloat8E5M2 ||
         dtype == DType::kFloat8E5M2FNUZ;
}
// int4 and uint4 (held unpacked, one byte per value).
inline bool is_int4_dtype(DType dtype) { return dtype == DType::kInt4 || dtype == DType::kUInt4; }
// The storage-only dtypes (float8, int4, uint4): no arithmetic kernel takes them (see the enum).
inline bool is_low_bit_dtype(DType dtype) { return is_float8_dtype(dtype) || is_int4_dtype(dtype); }

}  // namespace xpuruntime
