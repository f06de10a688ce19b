// ONNX's tensor element types as xpuruntime dtypes (see onnx_dtype.h).
#include "xpuruntime/onnx_dtype.h"

#include <map>
#include <utility>

namespace xpuruntime {

bool dtype_from_onnx_type(std::int64_t code, DType* dtype, std::string* name) {
  static const std::map<std::int64_t, std::pair<const char*, int>> types = {
      {1, {"float", static_cast<int>(DType::kFloat32)}},     {2, {"uint8", static_cast<int>(DType::kUInt8)}},
      {3, {"int8", static_cast<int>(DType::kInt8)}},         {4, {"uint16", static_cast<int>(DType::kUInt16)}},
      {5, {"int16", static_cast<int>(DType::kInt16)}},       {6, {"int32", static_cast<int>(DType::kInt32)}},
      {7, {"int64", static_cast<int>(DType::kInt64)}},       {8, {"string", -1}},
      {9, {"bool", static_cast<int>(DType::kBool)}},         {10, {"float16", static_cast<int>(DType::kFloat16)}},
      {11, {"double", static_cast<int>(DType::kFloat64)}},   {12, {"uint32", static_cast<int>(DType::kUInt32)}},
      {13, {"uint64", static_cast<int>(DType::kUInt64)}},    {14, {"complex64", -1}},
      {15, {"complex128", -1}},                              {16, {"bfloat16", static_cast<int>(DType::kBFloat16)}},
      {17, {"float8e4m3fn", static_cast<int>(DType::kFloat8E4M3FN)}},
      {18, {"float8e4m3fnuz", static_cast<int>(DType::kFloat8E4M3FNUZ)}},
      {19, {"float8e5m2", static_cast<int>(DType::kFloat8E5M2)}},
      {20, {"float8e5m2fnuz", static_cast<int>(DType::kFloat8E5M2FNUZ)}},
      {21, {"uint4", static_cast<int>(DType::kUInt4)}},
      {22, {"int4", static_cast<int>(DType::kInt4)}},
      {23, {"float4e2m1", -1}}};
  auto it = types.find(code);
  if (name != nullptr) *name = it == types.end() ? "unknown" : it->second.first;
  if (it == types.end() || it->second.second < 0) return false;
  if (dtype != nullptr) *dtype = static_cast<DType>(it->second.second);
  return true;
}

}  // namespace xpuruntime
