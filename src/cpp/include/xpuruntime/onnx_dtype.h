// ONNX's tensor element types (TensorProto.DataType codes) as xpuruntime dtypes: what the ONNX import, the native
// engine's passes and the cpu backend's ONNX node kernels (Cast's `to`, ConstantOfShape's value, ...) share. Core
// header: no ONNX library needed.
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>

#include "xpuruntime/dtype.h"
#include "xpuruntime/export.h"

namespace xpuruntime {

// ONNX's TensorProto.DataType code -> the xpuruntime dtype; false when xpuruntime tensors have none (strings,
// complex, float4e2m1). float8 (17-20) and int4/uint4 (22/21) map to their storage-only dtypes (Note [Float8 and
// 4-bit dtypes], xpuruntime/low_bit.h). `name` (optional) receives ONNX's name of the type ("uint16").
XPURT_API bool dtype_from_onnx_type(std::int64_t code, DType* dtype, std::string* name = nullptr);

}  // namespace xpuruntime
