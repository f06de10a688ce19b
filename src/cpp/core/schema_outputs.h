// What the op schemas' shape inference shares when it describes an output (op_schemas_data.cpp,
// op_schemas_quantize.cpp). Internal header; plain functions of values.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "xpuruntime/op_descriptor.h"

namespace xpuruntime {

// A present output of `shape` and `dtype` on the device of `like` (an input of the op).
inline TensorDesc output_of(const TensorDesc& like, std::vector<std::int64_t> shape, DType dtype) {
  TensorDesc out;
  out.present = true;
  out.dtype = dtype;
  out.shape = std::move(shape);
  out.device = like.device;
  return out;
}

}  // namespace xpuruntime
