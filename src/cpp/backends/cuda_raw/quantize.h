// The cuda_raw launchers of quantize_linear, dequantize_linear and dynamic_quantize_linear (quantize.cu; Note
// [Quantize registry ops] in core/quantize_ops.h), registered by quantize_register.cpp. The contract of
// cuda_raw_kernels.h holds: device pointers of the current device, `stream` a cudaStream_t as void*, nothing
// synchronized, zero-sized work enqueues nothing (but dynamic_quantize_linear still writes its scale and zero point),
// UnsupportedOperationError for a dtype the launcher does not handle, raised before anything is enqueued.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/quantize_ops.h"
#include "xpuruntime/dtype.h"

namespace xpuruntime::cuda_raw {

// One quantize_linear or dequantize_linear launch over n contiguous elements.
struct QuantizeArgs {
  const void* x = nullptr;
  DType x_dtype = DType::kFloat32;
  const void* scale = nullptr;  // float32, float16 or bfloat16; one element, or one per index of the axis
  DType scale_dtype = DType::kFloat32;
  const void* zero_point = nullptr;  // of the quantized side's dtype, as many as the scale; null: zeros
  void* y = nullptr;
  DType y_dtype = DType::kUInt8;
  std::int64_t n = 0;
  quantize_ops::ParamLayout layout;  // which scale applies to each element
  bool saturate = true;              // quantize to float8: out-of-range values to +-max (else Inf or NaN)
};

// y (int8, uint8, int4, uint4 or a float8, one byte each) = x (float32, float16, bfloat16) quantized.
void quantize_linear(const QuantizeArgs& args, void* stream);
// y (the scale's dtype) = x (int8, uint8, int32, int4, uint4 or a float8) dequantized.
void dequantize_linear(const QuantizeArgs& args, void* stream);

// The workspace dynamic_quantize_linear needs for n elements: the per-block minima and maxima.
std::size_t dynamic_quantize_workspace_bytes(std::int64_t n);
// ONNX's DynamicQuantizeLinear of n float32 values, without a host synchronization: one pass of per-block ranges into
// `workspace`, then one that combines them (every block the same way, so the same bits) and quantizes. A non-finite x
// cannot raise here (the cpu kernel does): y_scale is then Inf or NaN, y and y_zero_point 0.
void dynamic_quantize_linear(const float* x, std::int64_t n, std::uint8_t* y, float* y_scale,
                             std::uint8_t* y_zero_point, void* workspace, void* stream);

}  // namespace xpuruntime::cuda_raw
