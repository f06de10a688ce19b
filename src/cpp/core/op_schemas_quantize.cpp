// The op schemas of quantize_linear, dequantize_linear and dynamic_quantize_linear (Note [Quantize registry ops] in
// core/quantize_ops.h; docs/ops.md): their inputs, attributes and shape inference, which validates the dtypes, the
// scale's and zero point's shapes against x and the attributes, naming the argument and the expected value.
#include <string>
#include <vector>

#include "core/quantize_ops.h"
#include "core/schema_outputs.h"
#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

using Shape = std::vector<std::int64_t>;

using detail::shape_str;

void check_device(const OpDescriptor& desc, std::size_t index, const char* name) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& input = desc.inputs[index];
  XPURT_CHECK(input.device == x.device, "op '", desc.op, "': input '", name, "' is on ", input.device.str(),
              " but 'x' is on ", x.device.str(), "; move them to one device first");
}

// The scale (input 1) and the zero point (input 2, optional, of dtype `zero_point_dtype`) against x: a float scale,
// per tensor (one element, rank <= 1) or per axis (1-D of x.shape[axis] elements), and a zero point of the scale's
// element count.
void check_params(const OpDescriptor& desc, DType zero_point_dtype) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& scale = desc.inputs[1];
  const TensorDesc& zero_point = desc.inputs[2];
  XPURT_CHECK_TYPE(quantize_ops::is_real_dtype(scale.dtype), "op '", desc.op,
                   "': input 'scale' must be float32, float16 or bfloat16, got ", dtype_name(scale.dtype));
  check_device(desc, 1, "scale");
  const bool per_tensor = scale.numel() == 1 && scale.dim() <= 1;
  if (!per_tensor) {
    const std::int64_t axis = desc.attrs.get_int("axis", 1);
    const std::int64_t rank = x.dim();
    XPURT_CHECK(axis >= -rank && axis < rank, "op '", desc.op, "': axis=", axis, " is out of range for x of rank ",
                rank, " (valid: ", -rank, " to ", rank - 1, "); a per-axis scale needs an axis of x");
    const std::int64_t dim = x.shape[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)];
    XPURT_CHECK(scale.dim() == 1 && scale.shape[0] == dim, "op '", desc.op, "': 'scale' must have one element (per "
                "tensor) or shape [", dim, "] (per axis ", axis, " of x ", shape_str(x.shape), "), got ",
                shape_str(scale.shape), "; blocked scales (ONNX's block_size) run on the ONNX node kernels");
  }
  if (!zero_point.present) return;
  check_device(desc, 2, "zero_point");
  XPURT_CHECK_TYPE(zero_point.dtype == zero_point_dtype, "op '", desc.op, "': input 'zero_point' must be ",
                   dtype_name(zero_point_dtype), ", got ", dtype_name(zero_point.dtype));
  XPURT_CHECK(zero_point.numel() == scale.numel(), "op '", desc.op, "': 'zero_point' has shape ",
              shape_str(zero_point.shape), " but 'scale' has shape ", shape_str(scale.shape),
              " (one zero point per scale)");
}

// x float; y of `output_dtype` (an attribute, a dtype name), else of the zero point's dtype, else uint8.
std::vector<TensorDesc> infer_quantize_linear(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& zero_point = desc.inputs[2];
  XPURT_CHECK_TYPE(quantize_ops::is_real_dtype(x.dtype), "op 'quantize_linear': input 'x' must be float32, float16 "
                   "or bfloat16, got ", dtype_name(x.dtype));
  DType out = zero_point.present ? zero_point.dtype : DType::kUInt8;
  if (desc.attrs.has("output_dtype")) {
    out = dtype_from_name(desc.attrs.get_string("output_dtype", "uint8"));
    XPURT_CHECK_TYPE(!zero_point.present || zero_point.dtype == out, "op 'quantize_linear': output_dtype is ",
                     dtype_name(out), " but 'zero_point' is ", dtype_name(zero_point.dtype));
  }
  XPURT_CHECK_TYPE(quantize_ops::is_quantized_dtype(out), "op 'quantize_linear': the output must be int8, uint8, "
                   "int4, uint4, float8e4m3fn, float8e4m3fnuz, float8e5m2 or float8e5m2fnuz, got ", dtype_name(out),
                   " (int16/uint16 run on the ONNX node kernel)");
  const std::int64_t saturate = desc.attrs.get_int("saturate", 1);
  XPURT_CHECK(saturate == 0 || saturate == 1, "op 'quantize_linear': saturate must be 0 or 1, got ", saturate);
  check_params(desc, out);
  return {output_of(x, x.shape, out)};
}

// x quantized (or int32); y of the scale's dtype.
std::vector<TensorDesc> infer_dequantize_linear(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK_TYPE(quantize_ops::is_dequantizable_dtype(x.dtype), "op 'dequantize_linear': input 'x' must be int8, "
                   "uint8, int32, int4, uint4, float8e4m3fn, float8e4m3fnuz, float8e5m2 or float8e5m2fnuz, got ",
                   dtype_name(x.dtype), " (int16/uint16 run on the ONNX node kernel)");
  check_params(desc, x.dtype);
  return {output_of(x, x.shape, desc.inputs[1].dtype)};
}

// x float32 -> y uint8 (x's shape), y_scale float32 [], y_zero_point uint8 [].
std::vector<TensorDesc> infer_dynamic_quantize_linear(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK_TYPE(x.dtype == DType::kFloat32, "op 'dynamic_quantize_linear': input 'x' must be float32, got ",
                   dtype_name(x.dtype));
  return {output_of(x, x.shape, DType::kUInt8), output_of(x, {}, DType::kFloat32), output_of(x, {}, DType::kUInt8)};
}

}  // namespace

// Called by register_ops (core/op_schemas.cpp).
void register_quantize_ops(KernelRegistry& registry) {
  OpSchema quantize;
  quantize.name = "quantize_linear";
  quantize.family = "quantize";
  quantize.inputs = {"x", "scale", "zero_point?"};
  quantize.doc = "ONNX QuantizeLinear (Note [Quantize registry ops]): x float32/float16/bfloat16, scale per tensor or "
                 "per axis, zero_point of the output dtype; axis (1), saturate (1, float8), output_dtype (the zero "
                 "point's, else uint8): int8, uint8, int4, uint4 or a float8";
  quantize.infer = infer_quantize_linear;
  registry.add_schema(std::move(quantize));

  OpSchema dequantize;
  dequantize.name = "dequantize_linear";
  dequantize.family = "quantize";
  dequantize.inputs = {"x", "scale", "zero_point?"};
  dequantize.doc = "ONNX DequantizeLinear (Note [Quantize registry ops]): x int8/uint8/int32/int4/uint4/float8, scale "
                   "per tensor or per axis, zero_point of x's dtype; axis (1); y of the scale's dtype";
  dequantize.infer = infer_dequantize_linear;
  registry.add_schema(std::move(dequantize));

  OpSchema dynamic;
  dynamic.name = "dynamic_quantize_linear";
  dynamic.family = "quantize";
  dynamic.inputs = {"x"};
  dynamic.outputs = {"y", "y_scale", "y_zero_point"};
  dynamic.doc = "ONNX DynamicQuantizeLinear (Note [Quantize registry ops]): x float32 -> y uint8, y_scale float32 [], "
                "y_zero_point uint8 [] from the range of x and 0";
  dynamic.infer = infer_dynamic_quantize_linear;
  registry.add_schema(std::move(dynamic));
}

}  // namespace xpuruntime
