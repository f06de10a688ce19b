// Geometry shared by the schemas (op_schemas_data.cpp) and the kernels (backends/cpu/cpu_data.cpp,
// backends/cuda_raw/) of the data-movement ops: which dtypes they take, how an ONNX Slice resolves its
// starts/ends/steps against a shape, and how the operands of a broadcast map onto the output. Internal header;
// plain functions of values, no state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "xpuruntime/dtype.h"

namespace xpuruntime::data_ops {

// Every dtype a Tensor has but the storage-only ones: the data-movement ops, where, the comparisons and cast
// take them all.
inline bool is_any_supported_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      return true;
    // The storage-only dtypes (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h): cast and the comparisons would
    // read their bytes as integers, so the registry's every-dtype ops refuse them; the ONNX node kernels move them.
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kInt4:
    case DType::kUInt4:
      return false;
  }
  return false;
}

inline bool is_float_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}

// The integer dtypes of the arithmetic ops (add, sub, mul, div, neg).
inline bool is_arithmetic_int_dtype(DType dtype) { return dtype == DType::kInt32 || dtype == DType::kInt64; }

// One dimension of a resolved slice: output index i reads input index start + i * step.
struct SliceDim {
  std::int64_t start = 0;
  std::int64_t step = 1;
  std::int64_t size = 0;  // elements of the output along this dimension
};

// ONNX Slice (opset 13 rules, which also cover the older versions' inputs): negative starts/ends count from
// the end, then starts/ends are clamped to [0, dim] (step > 0) or [0, dim - 1] / [-1, dim - 1] (step < 0), so
// INT64_MAX / INT64_MIN mean "to the end". `step` must not be 0 (the schema checks).
inline SliceDim resolve_slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) {
  SliceDim out;
  out.step = step;
  if (dim <= 0) return out;
  if (start < 0) start = start < -dim ? -1 : start + dim;  // below -dim: clamped below
  if (end < 0) end = end < -dim ? -1 : end + dim;
  if (step > 0) {
    start = std::clamp<std::int64_t>(start, 0, dim);
    end = std::clamp<std::int64_t>(end, 0, dim);
    out.start = start;
    out.size = end > start ? (end - start - 1) / step + 1 : 0;  // no overflow for a huge step
  } else {
    start = std::clamp<std::int64_t>(start, 0, dim - 1);
    end = std::clamp<std::int64_t>(end, -1, dim - 1);
    out.start = start;
    // -step may overflow for INT64_MIN; (start - end) <= dim, so a huge step gives one element.
    const std::int64_t magnitude = step == std::numeric_limits<std::int64_t>::min()
                                       ? std::numeric_limits<std::int64_t>::max()
                                       : -step;
    out.size = start > end ? (start - end - 1) / magnitude + 1 : 0;
  }
  return out;
}

// Strides (in elements) with which a contiguous operand of `shape` is read at each dimension of `out_shape`
// under NumPy broadcasting (right-aligned; 0 along broadcast dimensions).
inline std::vector<std::int64_t> broadcast_strides(const std::vector<std::int64_t>& shape,
                                                   const std::vector<std::int64_t>& out_shape) {
  std::vector<std::int64_t> strides(out_shape.size(), 0);
  std::int64_t stride = 1;
  const std::size_t offset = out_shape.size() - shape.size();
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i + offset] = shape[i] == 1 ? 0 : stride;
    stride *= shape[i];
  }
  return strides;
}

inline std::vector<std::int64_t> contiguous_strides_of(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

}  // namespace xpuruntime::data_ops
