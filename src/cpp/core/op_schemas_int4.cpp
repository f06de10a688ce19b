// The op schema of matmul_nbits, the int4 weight-only GEMM (Note [Int4 weight-only GEMM]; docs/ops.md): its inputs,
// attributes and shape inference, which validates the packed weight, the scales and zero points against x and the
// block size, naming the argument and the expected shape.
//
// Note [Int4 weight-only GEMM]
// matmul_nbits is what a weight-only int4 model's GEMMs become: ONNX Runtime's com.microsoft MatMulNBits (bits=4)
// and the standard DequantizeLinear(int4 constant, blocked scales) -> MatMul that xrt.quantize(precision=
// "int4-weights") writes (the int4_weight_fusion pass, engines/native/passes/fusion_int4.cpp). One canonical layout,
// MatMulNBits' own:
//   x            float32, float16 or bfloat16 [..., K]
//   weight       uint8 [N, n_blocks, block_size / 2], n_blocks = ceil(K / block_size): W[n, k]'s 4-bit code in the
//                low nibble of byte k / 2 of row n when k is even, the high one when odd (k counts along the padded
//                row; codes past K are ignored)
//   scales       [N, n_blocks] (or [N * n_blocks]), float32 or x's dtype
//   zero_points  optional uint8 [N, ceil(n_blocks / 2)] (or flat), two 4-bit zero points a byte, low nibble first;
//                absent: 8 (MatMulNBits' default for unsigned codes; a signed int4 weight q is code q + 8)
//   bias         optional [N], x's dtype or float32
// with block_size (attribute, a power of two >= 16) and bits (attribute, 4). Then
//   W[n, k] = (code[n, k] - zero_point[n, k / block_size]) * scale[n, k / block_size]
//   y[..., n] = sum_k x[..., k] * W[n, k] (+ bias[n])                       in x's dtype, shape [..., N]
// The cpu kernel computes as the MatMulNBits node kernel does, bit for bit: W in float32, the products summed in
// double over k in order, rounded to float once, the bias added in float32. GPU kernels dequantize in registers
// and accumulate in float32 (backends/cuda_raw/int4_gemm.cu).
#include <string>
#include <vector>

#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

using Shape = std::vector<std::int64_t>;

using detail::shape_str;

bool is_x_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// Input `index` (named `name`) is present on x's device with `count` elements, as `shape` or flat; returns nothing,
// throws naming the expected shape.
void check_blocked_input(const OpDescriptor& desc, std::size_t index, const char* name, const Shape& shape) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& t = desc.inputs[index];
  XPURT_CHECK(t.device == x.device, "op 'matmul_nbits': input '", name, "' is on ", t.device.str(), " but 'x' is on ",
              x.device.str(), "; move them to one device first");
  const std::int64_t count = shape[0] * shape[1];
  XPURT_CHECK(t.shape == shape || t.shape == Shape{count}, "op 'matmul_nbits': input '", name, "' must have shape ",
              shape_str(shape), " (or [", count, "]), got ", shape_str(t.shape));
}

std::vector<TensorDesc> infer_matmul_nbits(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& w = desc.inputs[1];
  const TensorDesc& scales = desc.inputs[2];
  XPURT_CHECK_TYPE(is_x_dtype(x.dtype), "op 'matmul_nbits': input 'x' must be float32, float16 or bfloat16, got ",
                   dtype_name(x.dtype));
  XPURT_CHECK(x.dim() >= 1 && x.shape.back() >= 1, "op 'matmul_nbits': input 'x' must have rank >= 1 and K >= 1, "
              "got ", shape_str(x.shape));
  const std::int64_t bits = desc.attrs.get_int("bits", 4);
  XPURT_CHECK(bits == 4, "op 'matmul_nbits': bits must be 4 (MatMulNBits of other widths runs on its node kernel), "
              "got ", bits);
  XPURT_CHECK(desc.attrs.has("block_size"), "op 'matmul_nbits': attribute 'block_size' is required");
  const std::int64_t block = desc.attrs.get_int("block_size", 0);
  XPURT_CHECK(block >= 16 && (block & (block - 1)) == 0, "op 'matmul_nbits': block_size must be a power of two >= 16, "
              "got ", block);
  const std::int64_t k = x.shape.back();
  const std::int64_t blocks = (k + block - 1) / block;
  XPURT_CHECK_TYPE(w.dtype == DType::kUInt8, "op 'matmul_nbits': input 'weight' must be uint8 (two 4-bit codes a "
                   "byte), got ", dtype_name(w.dtype));
  XPURT_CHECK(w.dim() == 3 && w.shape[1] == blocks && w.shape[2] == block / 2, "op 'matmul_nbits': input 'weight' "
              "must be [N, ", blocks, ", ", block / 2, "] for K = ", k, " and block_size ", block, ", got ",
              shape_str(w.shape));
  XPURT_CHECK(w.device == x.device, "op 'matmul_nbits': input 'weight' is on ", w.device.str(), " but 'x' is on ",
              x.device.str(), "; move them to one device first");
  const std::int64_t n = w.shape[0];
  XPURT_CHECK_TYPE(scales.dtype == DType::kFloat32 || scales.dtype == x.dtype, "op 'matmul_nbits': input 'scales' "
                   "must be float32 or x's dtype (", dtype_name(x.dtype), "), got ", dtype_name(scales.dtype));
  check_blocked_input(desc, 2, "scales", {n, blocks});
  if (desc.inputs.size() > 3 && desc.inputs[3].present) {
    XPURT_CHECK_TYPE(desc.inputs[3].dtype == DType::kUInt8, "op 'matmul_nbits': input 'zero_points' must be uint8 "
                     "(two 4-bit zero points a byte), got ", dtype_name(desc.inputs[3].dtype));
    check_blocked_input(desc, 3, "zero_points", {n, (blocks + 1) / 2});
  }
  if (desc.inputs.size() > 4 && desc.inputs[4].present) {
    const TensorDesc& bias = desc.inputs[4];
    XPURT_CHECK_TYPE(bias.dtype == DType::kFloat32 || bias.dtype == x.dtype, "op 'matmul_nbits': input 'bias' must "
                     "be float32 or x's dtype (", dtype_name(x.dtype), "), got ", dtype_name(bias.dtype));
    XPURT_CHECK(bias.shape == Shape{n}, "op 'matmul_nbits': bias must have shape [", n, "], got ",
                shape_str(bias.shape));
    XPURT_CHECK(bias.device == x.device, "op 'matmul_nbits': input 'bias' is on ", bias.device.str(),
                " but 'x' is on ", x.device.str(), "; move them to one device first");
  }
  TensorDesc out;
  out.present = true;
  out.dtype = x.dtype;
  out.shape = x.shape;
  out.shape.back() = n;
  out.device = x.device;
  return {out};
}

}  // namespace

void register_int4_ops(KernelRegistry& registry) {
  OpSchema schema;
  schema.name = "matmul_nbits";
  schema.family = "matmul_nbits";
  schema.inputs = {"x", "weight", "scales", "zero_points?", "bias?"};
  schema.doc = "int4 weight-only GEMM (Note [Int4 weight-only GEMM]): x [..., K] float32/float16/bfloat16, weight "
               "uint8 [N, ceil(K / block_size), block_size / 2] (MatMulNBits' packed codes), scales [N, n_blocks] "
               "float32 or x's dtype, zero_points uint8 packed [N, ceil(n_blocks / 2)] (absent: 8), bias [N]; "
               "block_size (a power of two >= 16), bits=4 -> y [..., N] in x's dtype";
  schema.infer = infer_matmul_nbits;
  registry.add_schema(std::move(schema));
}

}  // namespace xpuruntime
