#include "xpuruntime/dtype.h"

#include <array>
#include <utility>

#include "xpuruntime/exceptions.h"

namespace xpuruntime {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
    case DType::kUInt16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
    case DType::kUInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kUInt64:
      return 8;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kInt4:   // unpacked: one byte per value (Note [Float8 and 4-bit dtypes])
    case DType::kUInt4:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kFloat8E4M3FN: return "float8e4m3fn";
    case DType::kFloat8E4M3FNUZ: return "float8e4m3fnuz";
    case DType::kFloat8E5M2: return "float8e5m2";
    case DType::kFloat8E5M2FNUZ: return "float8e5m2fnuz";
    case DType::kInt4: return "int4";
    case DType::kUInt4: return "uint4";
  }
  return "unknown";
}

DType dtype_from_name(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, DType>, 29> kNames = {{
      {"float16", DType::kFloat16}, {"half", DType::kFloat16},     {"fp16", DType::kFloat16},
      {"bfloat16", DType::kBFloat16}, {"bf16", DType::kBFloat16},  {"float32", DType::kFloat32},
      {"float", DType::kFloat32},   {"fp32", DType::kFloat32},     {"float64", DType::kFloat64},
      {"double", DType::kFloat64},  {"fp64", DType::kFloat64},     {"int8", DType::kInt8},
      {"uint8", DType::kUInt8},     {"int16", DType::kInt16},      {"short", DType::kInt16},
      {"int32", DType::kInt32},     {"int", DType::kInt32},        {"int64", DType::kInt64},
      {"long", DType::kInt64},      {"bool", DType::kBool},        {"uint16", DType::kUInt16},
      {"uint32", DType::kUInt32},   {"uint64", DType::kUInt64},
      {"float8e4m3fn", DType::kFloat8E4M3FN}, {"float8e4m3fnuz", DType::kFloat8E4M3FNUZ},
      {"float8e5m2", DType::kFloat8E5M2},     {"float8e5m2fnuz", DType::kFloat8E5M2FNUZ},
      {"int4", DType::kInt4},                 {"uint4", DType::kUInt4},
  }};
  for (const auto& [n, d] : kNames) {
    if (n == name) return d;
  }
  throw InvalidTypeError(detail::str_cat("Unknown dtype \"", name,
                                         "\"; expected one of float16, bfloat16, float32, float64, int8, uint8, "
                                         "int16, uint16, int32, uint32, int64, uint64, bool, float8e4m3fn, "
                                         "float8e4m3fnuz, float8e5m2, float8e5m2fnuz, int4, uint4 (aliases: "
                                         "half, fp16, bf16, float, fp32, double, fp64, short, int, long)"));
}

}  // namespace xpuruntime
