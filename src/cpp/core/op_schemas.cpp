// The op schemas: inputs, attributes, policy family and shape inference of every op (docs/ops.md).
// Shape inference is also validation: it names the argument, the expected and the actual value.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/distributed_ops.h"
#include "core/fused_elementwise.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"
#include "core/attention_layout.h"
#include "core/conv_layout.h"
#include "core/shape_str.h"
#include "core/window_geometry.h"

namespace xpuruntime {

namespace {

using Shape = std::vector<std::int64_t>;

using detail::shape_str;

bool is_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}

TensorDesc output_like(const TensorDesc& input, Shape shape) {
  TensorDesc out;
  out.present = true;
  out.dtype = input.dtype;
  out.shape = std::move(shape);
  out.device = input.device;
  return out;
}

// Every present input: a float dtype, the dtype of the first input, on one device.
void check_float_inputs(const OpDescriptor& desc, std::initializer_list<const char*> names) {
  // Runs on every dispatch: names are only turned into strings when a check fails.
  const char* const* name_of = names.begin();
  const auto name = [&](std::size_t k) {
    std::string text = name_of[k];
    if (!text.empty() && text.back() == '?') text.pop_back();
    return text;
  };
  const TensorDesc& first = desc.inputs[0];
  for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
    const TensorDesc& input = desc.inputs[k];
    if (!input.present) continue;
    XPURT_CHECK_TYPE(is_float(input.dtype), "op '", desc.op, "': input '", name(k),
                     "' must be float32, float16 or bfloat16, got ", dtype_name(input.dtype));
    XPURT_CHECK_TYPE(input.dtype == first.dtype, "op '", desc.op, "': input '", name(k), "' must have the dtype of '",
                     name(0), "' (", dtype_name(first.dtype), "), got ", dtype_name(input.dtype));
    XPURT_CHECK(input.device == first.device, "op '", desc.op, "': input '", name(k), "' is on ",
                input.device.str(), " but '", name(0), "' is on ", first.device.str(),
                "; move them to one device first");
  }
}

std::int64_t normalize_axis(std::int64_t axis, int rank, const std::string& op, const char* attr = "axis") {
  // A 0-d tensor has no axis (a reduction listing axis 0 of one indexed its empty shape; the structural fuzzer).
  XPURT_CHECK(axis >= -rank && axis < rank, "op '", op, "': ", attr, "=", axis,
              " is out of range for a tensor of rank ", rank, " (valid: ", -rank, " to ", rank - 1, ")");
  return axis < 0 ? axis + rank : axis;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& op, const char* what) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t da = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const std::int64_t db = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    XPURT_CHECK(da == db || da == 1 || db == 1, "op '", op, "': ", what, " shapes ", shape_str(a), " and ",
                shape_str(b), " cannot be broadcast together (dim ", k, ": ", da, " vs ", db, ")");
    out[k] = da == 1 ? db : da;
  }
  return out;
}

std::vector<std::int64_t> ints_of_size(const Attributes& attrs, const std::string& name, std::size_t size,
                                       const Shape& default_value, const std::string& op) {
  auto values = attrs.get_ints(name, default_value);
  XPURT_CHECK(values.size() == size, "op '", op, "': attribute '", name, "' must have ", size, " values, got ",
              shape_str(values));
  return values;
}

void check_rank(const TensorDesc& input, int rank, const std::string& op, const char* name, const char* layout) {
  XPURT_CHECK(input.dim() == rank, "op '", op, "': input '", name, "' must have rank ", rank, " (", layout,
              "), got shape ", shape_str(input.shape));
}

// ---- shape inference of each op ----

std::vector<TensorDesc> infer_matmul(const OpDescriptor& desc) {
  check_float_inputs(desc, {"a", "b"});
  const TensorDesc& a = desc.inputs[0];
  const TensorDesc& b = desc.inputs[1];
  XPURT_CHECK(a.dim() >= 2 && b.dim() >= 2, "op 'matmul': inputs must have rank >= 2, got a ", shape_str(a.shape),
              " and b ", shape_str(b.shape));
  const std::int64_t m = a.shape[a.dim() - 2], k = a.shape[a.dim() - 1];
  const std::int64_t kb = b.shape[b.dim() - 2], n = b.shape[b.dim() - 1];
  XPURT_CHECK(k == kb, "op 'matmul': a ", shape_str(a.shape), " and b ", shape_str(b.shape),
              " do not chain: a has ", k, " columns, b has ", kb, " rows");
  Shape batch = broadcast_shapes(Shape(a.shape.begin(), a.shape.end() - 2), Shape(b.shape.begin(), b.shape.end() - 2),
                                 "matmul", "batch");
  batch.push_back(m);
  batch.push_back(n);
  return {output_like(a, batch)};
}

// linear's weight (and bias) gradient, one GEMM: grad_weight[N, K] = grad[..., N]^T @ x[..., K] over the flattened
// leading dims (M rows), and with bias=1 also grad_bias[N] = the sum of grad over those rows.
std::vector<TensorDesc> infer_linear_grad_weight(const OpDescriptor& desc) {
  check_float_inputs(desc, {"grad", "x"});
  const TensorDesc& grad = desc.inputs[0];
  const TensorDesc& x = desc.inputs[1];
  XPURT_CHECK(grad.dim() >= 1 && grad.dim() == x.dim() &&
                  std::equal(grad.shape.begin(), grad.shape.end() - 1, x.shape.begin()),
              "op 'linear_grad_weight': grad [..., N] and x [..., K] must have the same leading dims, got grad ",
              shape_str(grad.shape), " and x ", shape_str(x.shape));
  const std::int64_t bias = desc.attrs.get_int("bias", 0);
  XPURT_CHECK(bias == 0 || bias == 1, "op 'linear_grad_weight': bias must be 0 or 1, got ", bias);
  const std::string layout = desc.attrs.get_string("weight_layout", "nk");
  XPURT_CHECK(layout == "nk", "op 'linear_grad_weight': only weight_layout 'nk' ([N, K], PyTorch) is supported, got '",
              layout, "'");
  std::vector<TensorDesc> outputs = {output_like(grad, {grad.shape.back(), x.shape.back()})};
  if (bias == 1) outputs.push_back(output_like(grad, {grad.shape.back()}));
  return outputs;
}

void check_activation(const OpDescriptor& desc, const std::vector<std::string>& valid) {
  const std::string activation = desc.attrs.get_string("activation", "none");
  XPURT_CHECK(std::find(valid.begin(), valid.end(), activation) != valid.end(), "op '", desc.op,
              "': unknown activation '", activation, "'; valid: ", [&] {
                std::string s;
                for (std::size_t k = 0; k < valid.size(); ++k) s += (k ? ", " : "") + valid[k];
                return s;
              }());
}

std::vector<TensorDesc> infer_linear(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x", "weight", "bias?", "residual?"});
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& w = desc.inputs[1];
  const std::string layout = desc.attrs.get_string("weight_layout", "nk");
  XPURT_CHECK(layout == "nk" || layout == "kn", "op 'linear': weight_layout must be 'nk' ([N, K], PyTorch) or "
              "'kn' ([K, N]), got '", layout, "'");
  check_activation(desc, {"none", "relu", "gelu", "gelu_tanh"});
  XPURT_CHECK(x.dim() >= 1, "op 'linear': input 'x' must have rank >= 1");
  check_rank(w, 2, "linear", "weight", layout == "nk" ? "[N, K]" : "[K, N]");
  const std::int64_t k = x.shape.back();
  const std::int64_t wk = layout == "nk" ? w.shape[1] : w.shape[0];
  const std::int64_t n = layout == "nk" ? w.shape[0] : w.shape[1];
  XPURT_CHECK(k == wk, "op 'linear': x ", shape_str(x.shape), " has ", k, " features but weight ",
              shape_str(w.shape), " (layout ", layout, ") expects ", wk);
  if (desc.inputs[2].present) {
    XPURT_CHECK(desc.inputs[2].shape == Shape{n}, "op 'linear': bias must have shape [", n, "], got ",
                shape_str(desc.inputs[2].shape));
  }
  Shape out = x.shape;
  out.back() = n;
  if (desc.inputs.size() > 3 && desc.inputs[3].present) {
    XPURT_CHECK(desc.inputs[3].shape == out, "op 'linear': residual must have the output shape ", shape_str(out),
                ", got ", shape_str(desc.inputs[3].shape));
  }
  return {output_like(x, out)};
}

// Window arithmetic naming op `op` on overflow (core/window_geometry.h).
std::int64_t window_add(const std::string& op, std::int64_t a, std::int64_t b) {
  return detail::window_add(a, b, [&op] { return "op '" + op + "'"; });
}
std::int64_t window_mul(const std::string& op, std::int64_t a, std::int64_t b) {
  return detail::window_mul(a, b, [&op] { return "op '" + op + "'"; });
}

// Outputs of a window op along one axis. Checks that the padded extent the windows span,
// (out - 1) * stride + dilation * (kernel - 1) + 1, fits int64 (the kernels' phase-split planes are that long).
std::int64_t pooled_size(const std::string& op, std::int64_t in, std::int64_t kernel, std::int64_t stride,
                         std::int64_t pad_begin, std::int64_t pad_end, std::int64_t dilation, bool ceil_mode) {
  const std::int64_t effective = window_add(op, window_mul(op, dilation, kernel - 1), 1);
  const std::int64_t span = window_add(op, window_add(op, window_add(op, in, pad_begin), pad_end), -effective);
  if (span < 0) return 0;
  std::int64_t out = (ceil_mode ? window_add(op, span, stride - 1) / stride : span / stride) + 1;
  // PyTorch/ONNX rule: the last window must start inside the input or the leading padding.
  if (ceil_mode && (out - 1) * stride >= in + pad_begin) --out;
  window_add(op, window_mul(op, out - 1, stride), effective);
  return out;
}

// Outputs of a transposed convolution along one axis:
// stride * (in - 1) + output_padding + dilation * (kernel - 1) + 1 - pad_begin - pad_end.
std::int64_t transposed_size(const std::string& op, std::int64_t in, std::int64_t kernel, std::int64_t stride,
                             std::int64_t pad_begin, std::int64_t pad_end, std::int64_t dilation,
                             std::int64_t output_padding) {
  const std::int64_t spread = window_add(op, window_mul(op, stride, in - 1), output_padding);
  const std::int64_t extent = window_add(op, spread, window_add(op, window_mul(op, dilation, kernel - 1), 1));
  return window_add(op, extent, -window_add(op, pad_begin, pad_end));
}

std::vector<TensorDesc> infer_conv2d(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x", "weight", "bias?", "residual?"});
  const bool nhwc = detail::is_nhwc(desc.attrs, "conv2d");
  check_rank(desc.inputs[0], 4, "conv2d", "x", nhwc ? "[N, H, W, C]" : "[N, C, H, W]");
  check_rank(desc.inputs[1], 4, "conv2d", "weight", nhwc ? "[O, kh, kw, C/groups]" : "[O, C/groups, kh, kw]");
  // The checks below read NCHW dims; NHWC shapes are mapped onto them (and the output back).
  const Shape x = detail::as_nchw(desc.inputs[0].shape, nhwc);
  const Shape w = detail::as_nchw(desc.inputs[1].shape, nhwc);
  check_activation(desc, {"none", "relu", "silu", "hard_swish", "relu6", "gelu", "gelu_tanh"});
  const auto strides = ints_of_size(desc.attrs, "strides", 2, {1, 1}, "conv2d");
  const auto pads = ints_of_size(desc.attrs, "pads", 4, {0, 0, 0, 0}, "conv2d");
  const auto dilations = ints_of_size(desc.attrs, "dilations", 2, {1, 1}, "conv2d");
  const std::int64_t groups = desc.attrs.get_int("groups", 1);
  for (int k = 0; k < 2; ++k) {
    XPURT_CHECK(strides[k] >= 1 && dilations[k] >= 1, "op 'conv2d': strides and dilations must be >= 1, got ",
                shape_str(strides), " and ", shape_str(dilations));
  }
  for (const auto p : pads) XPURT_CHECK(p >= 0, "op 'conv2d': pads must be >= 0, got ", shape_str(pads));
  XPURT_CHECK(groups >= 1 && x[1] % groups == 0 && w[0] % groups == 0, "op 'conv2d': groups=", groups,
              " must divide the input channels (", x[1], ") and the output channels (", w[0], ")");
  XPURT_CHECK(w[1] * groups == x[1], "op 'conv2d': weight ", shape_str(desc.inputs[1].shape), " expects ",
              w[1] * groups, " input channels (groups=", groups, "), x ", shape_str(desc.inputs[0].shape), " has ",
              x[1]);
  const std::int64_t oh = pooled_size("conv2d", x[2], w[2], strides[0], pads[0], pads[2], dilations[0], false);
  const std::int64_t ow = pooled_size("conv2d", x[3], w[3], strides[1], pads[1], pads[3], dilations[1], false);
  XPURT_CHECK(oh > 0 && ow > 0, "op 'conv2d': the kernel ", w[2], "x", w[3], " (dilations ", shape_str(dilations),
              ") does not fit the padded input ", x[2] + pads[0] + pads[2], "x", x[3] + pads[1] + pads[3]);
  const Shape out = nhwc ? Shape{x[0], oh, ow, w[0]} : Shape{x[0], w[0], oh, ow};
  if (desc.inputs[2].present) {
    XPURT_CHECK(desc.inputs[2].shape == Shape{w[0]}, "op 'conv2d': bias must have shape [", w[0], "], got ",
                shape_str(desc.inputs[2].shape));
  }
  if (desc.inputs[3].present) {
    XPURT_CHECK(desc.inputs[3].shape == out, "op 'conv2d': residual must have the output shape ", shape_str(out),
                ", got ", shape_str(desc.inputs[3].shape));
  }
  return {output_like(desc.inputs[0], out)};
}

// Note [Quantized registry ops]
// qlinear and qconv2d are the int8 GEMM and convolution a quantized model's DequantizeLinear -> MatMul/Gemm/Conv ->
// [bias] [Relu] [QuantizeLinear] chain (and ONNX's QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger) becomes
// (the quantized_fusion pass, the lowering). With x int8 or uint8, weight int8 (symmetric: no weight zero point):
//   acc[m, n] = sum_k (x[m, k] - x_zero_point) * w[k, n]         int32, wrapping as ONNX's int32 accumulator
//   acc      += bias[n]                                          when bias is int32 (units of x_scale * w_scale[n])
//   real      = float32(acc) * alpha[n] (+ bias[n] when float32)  alpha[n] = float32(x_scale * w_scale[n])
//   real      = max(real, 0) when activation=relu
//   y         = real (float32, or rounded to float16), or saturate(round_half_even(real / y_scale) + y_zero_point)
//               for int8/uint8 (real / y_scale in float32, as ONNX's QuantizeLinear); output_dtype=int32: acc itself
// qconv2d takes conv2d's layout attribute: NHWC (x [N, H, W, C], weight [O, kh, kw, C/groups]) is what the nhwc_layout
// pass makes for the tensor-core kernel (Note [Channels-last int8 convolutions] in engines/native/passes/layout.cpp).
// The per-tensor parameters are attributes (constants in every model the pass fuses; a CUDA plan passes them to its
// epilogue as host scalars), the per-output-channel weight scale an input [N] (or [1]): cuBLASLt's alpha vector
// (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO) is alpha[n], a float bias its BIAS epilogue, and a nonzero
// x_zero_point a per-column correction x_zero_point * sum_k w[k, n] that the GPU kernels fold into the int32 bias
// (Note [Signed operands of the int8 GEMMs] in core/quantized_gemm.h). qlinear also takes the zero point as an input
// (x_zero_point, one element of x's dtype) when it is known only at run time: ONNX Runtime's quantize_dynamic writes
// DynamicQuantizeLinear -> MatMulInteger(x_q, W, x_zp), which the quantized_fusion pass makes a qlinear of output
// int32 with that input. Where the weight, w_scale and bias are constants, the quantized_constant_folding pass makes
// alpha and the folded int32 bias constants of the plan (x_scale 1, w_scale = alpha; Note [Quantized constants folded
// at build time] in engines/native/passes/quantized_constants.cpp), so the GPU kernels launch no prologue.
bool is_int8_or_uint8(DType d) { return d == DType::kInt8 || d == DType::kUInt8; }

DType quantized_output_dtype(const OpDescriptor& desc) {
  const std::string out = desc.attrs.get_string("output_dtype", "float32");
  if (out == "int8") return DType::kInt8;
  if (out == "uint8") return DType::kUInt8;
  if (out == "float16") return DType::kFloat16;
  if (out == "int32") return DType::kInt32;
  XPURT_CHECK(out == "float32", "op '", desc.op,
              "': output_dtype must be int8, uint8, float32, float16 or int32, got '", out, "'");
  return DType::kFloat32;
}

// The dtypes, the weight scale's and the bias's shapes ([n_out] or, for the scale, [1]) and the attributes of a
// qlinear/qconv2d; returns the output dtype.
DType check_quantized_op(const OpDescriptor& desc, std::int64_t n_out) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& w = desc.inputs[1];
  XPURT_CHECK_TYPE(is_int8_or_uint8(x.dtype), "op '", desc.op, "': input 'x' must be int8 or uint8, got ",
                   dtype_name(x.dtype));
  XPURT_CHECK_TYPE(w.dtype == DType::kInt8, "op '", desc.op, "': input 'weight' must be int8 (symmetric), got ",
                   dtype_name(w.dtype));
  const DType out = quantized_output_dtype(desc);
  const bool raw = out == DType::kInt32;
  const TensorDesc& w_scale = desc.inputs[2];
  const TensorDesc& bias = desc.inputs[3];
  if (w_scale.present) {
    XPURT_CHECK_TYPE(w_scale.dtype == DType::kFloat32, "op '", desc.op, "': input 'w_scale' must be float32, got ",
                     dtype_name(w_scale.dtype));
    XPURT_CHECK(!raw, "op '", desc.op, "': output_dtype int32 (the accumulator) takes no 'w_scale'");
    XPURT_CHECK(w_scale.shape == Shape{n_out} || w_scale.numel() == 1, "op '", desc.op, "': w_scale must have shape [",
                n_out, "] (per output channel) or one element, got ", shape_str(w_scale.shape));
  }
  if (bias.present) {
    XPURT_CHECK_TYPE(bias.dtype == DType::kInt32 || (bias.dtype == DType::kFloat32 && !raw), "op '", desc.op,
                     "': input 'bias' must be int32", raw ? "" : " or float32", ", got ", dtype_name(bias.dtype));
    XPURT_CHECK(bias.shape == Shape{n_out}, "op '", desc.op, "': bias must have shape [", n_out, "], got ",
                shape_str(bias.shape));
  }
  for (const TensorDesc* t : {&x, &w, &w_scale, &bias}) {
    XPURT_CHECK(!t->present || t->device == x.device, "op '", desc.op, "': every input must be on ", x.device.str(),
                "; one is on ", t->device.str());
  }
  check_activation(desc, {"none", "relu"});
  XPURT_CHECK(!raw || desc.attrs.get_string("activation", "none") == "none", "op '", desc.op,
              "': output_dtype int32 (the accumulator) takes no activation");
  const std::int64_t x_zp = desc.attrs.get_int("x_zero_point", 0);
  const bool x_signed = x.dtype == DType::kInt8;
  XPURT_CHECK(x_signed ? x_zp >= -128 && x_zp <= 127 : x_zp >= 0 && x_zp <= 255, "op '", desc.op, "': x_zero_point ",
              x_zp, " is out of range for ", dtype_name(x.dtype));
  if (!raw) {
    const double x_scale = desc.attrs.get_float("x_scale", 0.0);
    XPURT_CHECK(std::isfinite(x_scale) && x_scale > 0, "op '", desc.op, "': x_scale must be > 0, got ", x_scale);
  }
  if (out == DType::kInt8 || out == DType::kUInt8) {
    const double y_scale = desc.attrs.get_float("y_scale", 0.0);
    XPURT_CHECK(std::isfinite(y_scale) && y_scale > 0, "op '", desc.op, "': y_scale must be > 0 for output ",
                dtype_name(out), ", got ", y_scale);
    const std::int64_t y_zp = desc.attrs.get_int("y_zero_point", 0);
    XPURT_CHECK(out == DType::kInt8 ? y_zp >= -128 && y_zp <= 127 : y_zp >= 0 && y_zp <= 255, "op '", desc.op,
                "': y_zero_point ", y_zp, " is out of range for ", dtype_name(out));
  }
  return out;
}

std::vector<TensorDesc> infer_qlinear(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& w = desc.inputs[1];
  const std::string layout = desc.attrs.get_string("weight_layout", "kn");
  XPURT_CHECK(layout == "nk" || layout == "kn", "op 'qlinear': weight_layout must be 'kn' ([K, N]) or 'nk' ([N, K]), "
              "got '", layout, "'");
  XPURT_CHECK(x.dim() >= 1, "op 'qlinear': input 'x' must have rank >= 1");
  check_rank(w, 2, "qlinear", "weight", layout == "nk" ? "[N, K]" : "[K, N]");
  const std::int64_t k = x.shape.back();
  const std::int64_t wk = layout == "nk" ? w.shape[1] : w.shape[0];
  const std::int64_t n = layout == "nk" ? w.shape[0] : w.shape[1];
  XPURT_CHECK(k == wk, "op 'qlinear': x ", shape_str(x.shape), " has ", k, " features but weight ",
              shape_str(w.shape), " (layout ", layout, ") expects ", wk);
  TensorDesc out = output_like(x, x.shape);
  out.shape.back() = n;
  out.dtype = check_quantized_op(desc, n);
  // A zero point known only when the op runs (MatMulInteger after DynamicQuantizeLinear): one element of x's dtype,
  // in place of the attribute.
  if (desc.inputs.size() > 4 && desc.inputs[4].present) {
    const TensorDesc& zp = desc.inputs[4];
    XPURT_CHECK_TYPE(zp.dtype == x.dtype, "op 'qlinear': input 'x_zero_point' must have x's dtype ",
                     dtype_name(x.dtype), ", got ", dtype_name(zp.dtype));
    XPURT_CHECK(zp.numel() == 1 && zp.dim() <= 1, "op 'qlinear': input 'x_zero_point' must have one element (shape "
                "[] or [1]), got ", shape_str(zp.shape));
    XPURT_CHECK(zp.device == x.device, "op 'qlinear': every input must be on ", x.device.str(),
                "; x_zero_point is on ", zp.device.str());
    XPURT_CHECK(desc.attrs.get_int("x_zero_point", 0) == 0, "op 'qlinear': x_zero_point is given both as an input "
                "and as a nonzero attribute");
  }
  return {out};
}

// Note [Float8 quantized linear]
// qlinear_fp8 is what a float8 QDQ chain DequantizeLinear(float8e4m3fn) -> MatMul/Gemm -> [bias] [Relu] ->
// [QuantizeLinear(float8e4m3fn)] becomes (the quantized_fusion pass; xrt.quantize(precision="fp8") writes such
// chains). With x and weight float8e4m3fn (no zero points: ONNX's float8 zero points are 0 in these models):
//   acc[m, n] = sum_k float(x[m, k]) * float(w[k, n])            float32 accumulation (the products are exact)
//   real      = acc * alpha[n] + bias[n]                         alpha[n] = float32(x_scale * w_scale[n]); a
//                                                                float16 bias (a float16 plan's) widened exactly
//   real      = max(real, 0) when activation=relu
//   y         = real (float32, or rounded to float16), or float8e4m3fn(real / y_scale) for output_dtype=float8e4m3fn:
//               the division in float32, then round to nearest even and saturate to +-448 (ONNX's QuantizeLinear
//               with saturate=1; NaN stays NaN)
// The unfused chain dequantizes first and sums x_scale * x * w_scale[n] * w; the two differ only by float32 rounding
// (and the order of the sums), so kernels agree with the cpu kernel to a tolerance, not bit for bit.
// fast_accumulation=1 (ExecutionPolicy.fp8_fast_accumulation) lets a kernel keep partial sums in fewer bits than
// float32 (Hopper's float8 tensor cores without promotion: Note [cuBLASLt float8 GEMMs]); the cpu kernel's sums stay
// float32, so the attribute only widens the tolerance between them.
std::vector<TensorDesc> infer_qlinear_fp8(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  const TensorDesc& w = desc.inputs[1];
  const std::string layout = desc.attrs.get_string("weight_layout", "kn");
  XPURT_CHECK(layout == "nk" || layout == "kn", "op 'qlinear_fp8': weight_layout must be 'kn' ([K, N]) or 'nk' "
              "([N, K]), got '", layout, "'");
  XPURT_CHECK(x.dim() >= 1, "op 'qlinear_fp8': input 'x' must have rank >= 1");
  check_rank(w, 2, "qlinear_fp8", "weight", layout == "nk" ? "[N, K]" : "[K, N]");
  XPURT_CHECK_TYPE(x.dtype == DType::kFloat8E4M3FN && w.dtype == DType::kFloat8E4M3FN, "op 'qlinear_fp8': x and "
                   "weight must be float8e4m3fn, got ", dtype_name(x.dtype), " and ", dtype_name(w.dtype));
  const std::int64_t k = x.shape.back();
  const std::int64_t wk = layout == "nk" ? w.shape[1] : w.shape[0];
  const std::int64_t n = layout == "nk" ? w.shape[0] : w.shape[1];
  XPURT_CHECK(k == wk, "op 'qlinear_fp8': x ", shape_str(x.shape), " has ", k, " features but weight ",
              shape_str(w.shape), " (layout ", layout, ") expects ", wk);
  const TensorDesc& w_scale = desc.inputs[2];
  const TensorDesc& bias = desc.inputs[3];
  XPURT_CHECK(w_scale.present, "op 'qlinear_fp8': input 'w_scale' is required");
  XPURT_CHECK_TYPE(w_scale.dtype == DType::kFloat32, "op 'qlinear_fp8': input 'w_scale' must be float32, got ",
                   dtype_name(w_scale.dtype));
  XPURT_CHECK(w_scale.shape == Shape{n} || w_scale.numel() == 1, "op 'qlinear_fp8': w_scale must have shape [", n,
              "] (per output channel) or one element, got ", shape_str(w_scale.shape));
  if (bias.present) {
    XPURT_CHECK_TYPE(bias.dtype == DType::kFloat32 || bias.dtype == DType::kFloat16,
                     "op 'qlinear_fp8': input 'bias' must be float32 or float16, got ", dtype_name(bias.dtype));
    XPURT_CHECK(bias.shape == Shape{n}, "op 'qlinear_fp8': bias must have shape [", n, "], got ",
                shape_str(bias.shape));
  }
  for (const TensorDesc* t : {&w, &w_scale, &bias}) {
    XPURT_CHECK(!t->present || t->device == x.device, "op 'qlinear_fp8': every input must be on ", x.device.str(),
                "; one is on ", t->device.str());
  }
  check_activation(desc, {"none", "relu"});
  const double x_scale = desc.attrs.get_float("x_scale", 0.0);
  XPURT_CHECK(std::isfinite(x_scale) && x_scale > 0, "op 'qlinear_fp8': x_scale must be > 0, got ", x_scale);
  const std::int64_t fast = desc.attrs.get_int("fast_accumulation", 0);
  XPURT_CHECK(fast == 0 || fast == 1, "op 'qlinear_fp8': fast_accumulation must be 0 or 1, got ", fast);
  const std::string out_name = desc.attrs.get_string("output_dtype", "float32");
  TensorDesc out = output_like(x, x.shape);
  out.shape.back() = n;
  if (out_name == "float8e4m3fn") {
    out.dtype = DType::kFloat8E4M3FN;
    const double y_scale = desc.attrs.get_float("y_scale", 0.0);
    XPURT_CHECK(std::isfinite(y_scale) && y_scale > 0, "op 'qlinear_fp8': y_scale must be > 0 for output "
                "float8e4m3fn, got ", y_scale);
  } else {
    XPURT_CHECK(out_name == "float32" || out_name == "float16", "op 'qlinear_fp8': output_dtype must be "
                "float8e4m3fn, float32 or float16, got '", out_name, "'");
    out.dtype = out_name == "float16" ? DType::kFloat16 : DType::kFloat32;
  }
  return {out};
}

// conv2d's geometry (a float32 copy of x and the weight, no bias; layout NCHW or NHWC as conv2d's), then the
// quantized operands.
std::vector<TensorDesc> infer_qconv2d(const OpDescriptor& desc) {
  const bool nhwc = detail::is_nhwc(desc.attrs, "qconv2d");
  check_rank(desc.inputs[0], 4, "qconv2d", "x", nhwc ? "[N, H, W, C]" : "[N, C, H, W]");
  check_rank(desc.inputs[1], 4, "qconv2d", "weight", nhwc ? "[O, kh, kw, C/groups]" : "[O, C/groups, kh, kw]");
  OpDescriptor geometry;
  geometry.op = "qconv2d";
  geometry.attrs = desc.attrs;
  geometry.attrs.set("activation", std::string("none"));
  geometry.inputs = {desc.inputs[0], desc.inputs[1], TensorDesc(), TensorDesc()};
  geometry.inputs[0].dtype = geometry.inputs[1].dtype = DType::kFloat32;
  geometry.inputs[1].device = geometry.inputs[0].device;
  TensorDesc out = infer_conv2d(geometry).at(0);
  out.dtype = check_quantized_op(desc, desc.inputs[1].shape[0]);
  // zero_point_folded=1: the int32 bias holds the zero point's correction (Note [Quantized constants folded at build
  // time] in engines/native/passes/quantized_constants.cpp).
  const std::int64_t folded = desc.attrs.get_int("zero_point_folded", 0);
  XPURT_CHECK(folded == 0 || folded == 1, "op 'qconv2d': zero_point_folded must be 0 or 1, got ", folded);
  XPURT_CHECK(folded == 0 || (desc.inputs[3].present && desc.inputs[3].dtype == DType::kInt32), "op 'qconv2d': "
              "zero_point_folded=1 needs the int32 bias that holds the zero point's correction");
  return {out};
}

// ONNX ConvTranspose in 2-D: y[N, O, oh, ow] with O = weight[1] * groups and
// oh = strides * (H - 1) + output_padding + dilations * (kh - 1) + 1 - pad_top - pad_bottom (likewise ow).
std::vector<TensorDesc> infer_conv_transpose2d(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x", "weight", "bias?"});
  check_rank(desc.inputs[0], 4, "conv_transpose2d", "x", "[N, C, H, W]");
  check_rank(desc.inputs[1], 4, "conv_transpose2d", "weight", "[C, O/groups, kh, kw]");
  const Shape& x = desc.inputs[0].shape;
  const Shape& w = desc.inputs[1].shape;
  const auto strides = ints_of_size(desc.attrs, "strides", 2, {1, 1}, "conv_transpose2d");
  const auto pads = ints_of_size(desc.attrs, "pads", 4, {0, 0, 0, 0}, "conv_transpose2d");
  const auto dilations = ints_of_size(desc.attrs, "dilations", 2, {1, 1}, "conv_transpose2d");
  const auto output_padding = ints_of_size(desc.attrs, "output_padding", 2, {0, 0}, "conv_transpose2d");
  const std::int64_t groups = desc.attrs.get_int("groups", 1);
  for (int k = 0; k < 2; ++k) {
    XPURT_CHECK(strides[k] >= 1 && dilations[k] >= 1, "op 'conv_transpose2d': strides and dilations must be >= 1, "
                "got ", shape_str(strides), " and ", shape_str(dilations));
    XPURT_CHECK(output_padding[k] >= 0 && output_padding[k] < std::max(strides[k], dilations[k]),
                "op 'conv_transpose2d': output_padding must be >= 0 and smaller than the stride or the dilation, got ",
                shape_str(output_padding));
  }
  for (const auto p : pads) XPURT_CHECK(p >= 0, "op 'conv_transpose2d': pads must be >= 0, got ", shape_str(pads));
  XPURT_CHECK(groups >= 1 && x[1] % groups == 0, "op 'conv_transpose2d': groups=", groups,
              " must divide the input channels (", x[1], ")");
  XPURT_CHECK(w[0] == x[1], "op 'conv_transpose2d': weight ", shape_str(w), " expects ", w[0],
              " input channels, x ", shape_str(x), " has ", x[1]);
  const std::int64_t o = w[1] * groups;
  const auto length = [&](int k) {
    return transposed_size("conv_transpose2d", x[2 + k], w[2 + k], strides[k], pads[k], pads[2 + k], dilations[k],
                           output_padding[k]);
  };
  const std::int64_t oh = length(0);
  const std::int64_t ow = length(1);
  XPURT_CHECK(oh > 0 && ow > 0, "op 'conv_transpose2d': the pads ", shape_str(pads), " leave no output");
  if (desc.inputs[2].present) {
    XPURT_CHECK(desc.inputs[2].shape == Shape{o}, "op 'conv_transpose2d': bias must have shape [", o, "], got ",
                shape_str(desc.inputs[2].shape));
  }
  return {output_like(desc.inputs[0], Shape{x[0], o, oh, ow})};
}

// ONNX Conv and ConvTranspose in 3-D: x [N, C, D, H, W]; conv3d's weight [O, C/groups, kd, kh, kw], output
// sizes as conv2d's per axis; conv_transpose3d's weight [C, O/groups, kd, kh, kw], sizes as conv_transpose2d's.
// pads: (d, h, w begins, then d, h, w ends).
std::vector<TensorDesc> infer_conv3d_like(const OpDescriptor& desc, bool transpose) {
  const std::string op = desc.op;
  if (transpose) {
    check_float_inputs(desc, {"x", "weight", "bias?"});
  } else {  // Note [3-D convolutions fused]: conv3d takes conv_fusion's residual and ReLU
    check_float_inputs(desc, {"x", "weight", "bias?", "residual?"});
    check_activation(desc, {"none", "relu"});
  }
  check_rank(desc.inputs[0], 5, op, "x", "[N, C, D, H, W]");
  check_rank(desc.inputs[1], 5, op, "weight", transpose ? "[C, O/groups, kd, kh, kw]" : "[O, C/groups, kd, kh, kw]");
  const Shape& x = desc.inputs[0].shape;
  const Shape& w = desc.inputs[1].shape;
  const auto strides = ints_of_size(desc.attrs, "strides", 3, {1, 1, 1}, op);
  const auto pads = ints_of_size(desc.attrs, "pads", 6, {0, 0, 0, 0, 0, 0}, op);
  const auto dilations = ints_of_size(desc.attrs, "dilations", 3, {1, 1, 1}, op);
  const auto output_padding = ints_of_size(desc.attrs, "output_padding", 3, {0, 0, 0}, op);
  const std::int64_t groups = desc.attrs.get_int("groups", 1);
  for (int k = 0; k < 3; ++k) {
    XPURT_CHECK(strides[k] >= 1 && dilations[k] >= 1, "op '", op, "': strides and dilations must be >= 1, got ",
                shape_str(strides), " and ", shape_str(dilations));
    XPURT_CHECK(output_padding[k] >= 0 && (!transpose || output_padding[k] < std::max(strides[k], dilations[k])),
                "op '", op, "': output_padding must be >= 0 and smaller than the stride or the dilation, got ",
                shape_str(output_padding));
  }
  for (const auto p : pads) XPURT_CHECK(p >= 0, "op '", op, "': pads must be >= 0, got ", shape_str(pads));
  XPURT_CHECK(groups >= 1 && x[1] % groups == 0, "op '", op, "': groups=", groups, " must divide the input channels (",
              x[1], ")");
  std::int64_t o = 0;
  if (transpose) {
    XPURT_CHECK(w[0] == x[1], "op '", op, "': weight ", shape_str(w), " expects ", w[0], " input channels, x ",
                shape_str(x), " has ", x[1]);
    o = w[1] * groups;
  } else {
    XPURT_CHECK(w[0] % groups == 0 && w[1] * groups == x[1], "op '", op, "': weight ", shape_str(w), " expects ",
                w[1] * groups, " input channels with groups=", groups, " (and output channels divisible by it), x ",
                shape_str(x), " has ", x[1]);
    o = w[0];
  }
  Shape out = {x[0], o};
  for (int k = 0; k < 3; ++k) {
    const std::int64_t in = x[2 + static_cast<std::size_t>(k)], kernel = w[2 + static_cast<std::size_t>(k)];
    const std::int64_t n =
        transpose ? transposed_size(op, in, kernel, strides[k], pads[k], pads[3 + k], dilations[k], output_padding[k])
                  : pooled_size(op, in, kernel, strides[k], pads[k], pads[3 + k], dilations[k], false);
    XPURT_CHECK(n > 0, "op '", op, "': no output along spatial axis ", k, " (input ", shape_str(x), ", weight ",
                shape_str(w), ", pads ", shape_str(pads), ")");
    out.push_back(n);
  }
  if (desc.inputs[2].present) {
    XPURT_CHECK(desc.inputs[2].shape == Shape{o}, "op '", op, "': bias must have shape [", o, "], got ",
                shape_str(desc.inputs[2].shape));
  }
  if (!transpose && desc.inputs[3].present) {
    XPURT_CHECK(desc.inputs[3].shape == out, "op '", op, "': residual must have the output shape ", shape_str(out),
                ", got ", shape_str(desc.inputs[3].shape));
  }
  return {output_like(desc.inputs[0], out)};
}

std::vector<TensorDesc> infer_pool(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x"});
  const bool nhwc = detail::is_nhwc(desc.attrs, desc.op);
  check_rank(desc.inputs[0], 4, desc.op, "x", nhwc ? "[N, H, W, C]" : "[N, C, H, W]");
  const Shape x = detail::as_nchw(desc.inputs[0].shape, nhwc);  // NCHW dims
  const auto result = [&](std::int64_t oh, std::int64_t ow) {
    return std::vector<TensorDesc>{
        output_like(desc.inputs[0], nhwc ? Shape{x[0], oh, ow, x[1]} : Shape{x[0], x[1], oh, ow})};
  };
  if (desc.op == "global_avg_pool") return result(1, 1);
  XPURT_CHECK(desc.attrs.has("kernel_shape"), "op '", desc.op, "': attribute 'kernel_shape' is required");
  const auto kernel = ints_of_size(desc.attrs, "kernel_shape", 2, {}, desc.op);
  const auto strides = ints_of_size(desc.attrs, "strides", 2, kernel, desc.op);
  const auto pads = ints_of_size(desc.attrs, "pads", 4, {0, 0, 0, 0}, desc.op);
  const auto dilations = desc.op == "max_pool2d" ? ints_of_size(desc.attrs, "dilations", 2, {1, 1}, desc.op)
                                                 : Shape{1, 1};
  const bool ceil_mode = desc.attrs.get_int("ceil_mode", 0) != 0;
  for (int k = 0; k < 2; ++k) {
    XPURT_CHECK(kernel[k] >= 1 && strides[k] >= 1 && dilations[k] >= 1, "op '", desc.op,
                "': kernel_shape, strides and dilations must be >= 1");
    const std::int64_t effective = window_add(desc.op, window_mul(desc.op, dilations[k], kernel[k] - 1), 1);
    XPURT_CHECK(pads[k] >= 0 && pads[k + 2] >= 0 && pads[k] < effective && pads[k + 2] < effective, "op '", desc.op,
                "': pads ", shape_str(pads), " must be >= 0 and smaller than the kernel ", shape_str(kernel));
  }
  const std::int64_t oh = pooled_size(desc.op, x[2], kernel[0], strides[0], pads[0], pads[2], dilations[0], ceil_mode);
  const std::int64_t ow = pooled_size(desc.op, x[3], kernel[1], strides[1], pads[1], pads[3], dilations[1], ceil_mode);
  XPURT_CHECK(oh > 0 && ow > 0, "op '", desc.op, "': the window ", shape_str(kernel),
              " does not fit the padded input of ", shape_str(desc.inputs[0].shape));
  return result(oh, ow);
}

std::vector<TensorDesc> infer_batch_norm(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x", "scale", "bias", "mean", "var"});
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK(x.dim() >= 2, "op 'batch_norm': input 'x' must have rank >= 2 ([N, C, ...]), got ", shape_str(x.shape));
  const char* names[] = {"x", "scale", "bias", "mean", "var"};
  for (int k = 1; k < 5; ++k) {
    XPURT_CHECK(desc.inputs[k].shape == Shape{x.shape[1]}, "op 'batch_norm': '", names[k], "' must have shape [",
                x.shape[1], "], got ", shape_str(desc.inputs[k].shape));
  }
  return {output_like(x, x.shape)};
}

std::vector<TensorDesc> infer_softmax(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x"});
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK(x.dim() >= 1, "op 'softmax': input 'x' must have rank >= 1");
  normalize_axis(desc.attrs.get_int("axis", -1), x.dim(), desc.op);
  return {output_like(x, x.shape)};
}

std::vector<TensorDesc> infer_layer_norm(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x", "scale?", "bias?", "residual?", "addend?"});
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK(x.dim() >= 1, "op 'layer_norm': input 'x' must have rank >= 1");
  for (std::size_t k = 3; k < 5; ++k) {  // residual (added before) and addend (added after): x's shape
    if (desc.inputs.size() <= k || !desc.inputs[k].present) continue;
    XPURT_CHECK(desc.inputs[k].shape == x.shape, "op 'layer_norm': ", k == 3 ? "residual" : "addend",
                " must have x's shape ", shape_str(x.shape), ", got ", shape_str(desc.inputs[k].shape));
  }
  const std::int64_t axis = normalize_axis(desc.attrs.get_int("axis", -1), x.dim(), desc.op);
  XPURT_CHECK(desc.attrs.get_float("epsilon", 1e-5) > 0, "op 'layer_norm': epsilon must be > 0");
  const Shape normalized(x.shape.begin() + axis, x.shape.end());
  // Note [Per-row affine of a layer norm]
  // With row_affine=1 the scale and bias are not over the normalized dims but one value per run of affine_run
  // elements of a row (the whole row when affine_run is 0), repeating: run j of the whole tensor (row r's run k is run
  // r * runs + k) takes scale[j % P] and bias[j % P] (P their length, dividing the runs), y = (x - mean) * inv_std *
  // scale + bias. It is InstanceNormalization's per-channel affine over the [N, C, S] view (one run a row) and
  // GroupNormalization's over [N, G, C/G * S] (runs of S), applied while the row is written instead of in a pass of its
  // own (op_decomposition gives it to CPU plans; the CUDA kernel does not take it).
  if (desc.attrs.get_int("row_affine", 0) != 0) {
    std::int64_t rows = 1, size = 1;
    for (std::int64_t d = 0; d < axis; ++d) rows *= x.shape[static_cast<std::size_t>(d)];
    for (std::int64_t d : normalized) size *= d;
    const std::int64_t run = desc.attrs.get_int("affine_run", 0);
    XPURT_CHECK(run >= 0 && (run == 0 || (size > 0 && size % run == 0)), "op 'layer_norm': affine_run=", run,
                " must be 0 (the row) or divide the row's ", size, " elements");
    const std::int64_t runs = rows * (run > 0 ? size / run : 1);
    std::int64_t period = 0;
    for (int k = 1; k < 3; ++k) {
      if (!desc.inputs[k].present) continue;
      const Shape& s = desc.inputs[k].shape;
      XPURT_CHECK(s.size() == 1 && s[0] >= 1 && runs % s[0] == 0 && (period == 0 || s[0] == period),
                  "op 'layer_norm': with row_affine=1 '", k == 1 ? "scale" : "bias", "' must be 1-D with a length "
                  "that divides the ", runs, " runs (and equals the other's), got ", shape_str(s));
      period = s[0];
    }
  }
  for (int k = 1; k < 3 && desc.attrs.get_int("row_affine", 0) == 0; ++k) {
    if (!desc.inputs[k].present) continue;
    XPURT_CHECK(desc.inputs[k].shape == normalized, "op 'layer_norm': '", k == 1 ? "scale" : "bias",
                "' must have shape ", shape_str(normalized), " (x.shape[axis:]), got ",
                shape_str(desc.inputs[k].shape));
  }
  if (!desc.attrs.has("quantized_dtype")) return {output_like(x, x.shape)};
  // Note [Quantized layer norm output]
  // The elementwise_fusion pass gives a LayerNormalization the per-tensor QuantizeLinear that reads its output (the
  // Q before the next GEMM of a quantized transformer, which the residual path reads in float too): the kernel
  // writes y and QuantizeLinear(y) from the same registers, the second as quantize_linear computes it from y as
  // stored (rounded to y's dtype), with the fused programs' quantized outputs' rules (Note [Quantized output of a
  // fused program] in core/fused_elementwise.h: int8/uint8 levels, float8 codes with zero point 0, saturating).
  const DType quantized = dtype_from_name(desc.attrs.get_string("quantized_dtype", ""));
  XPURT_CHECK_TYPE(fused::quantized_output(quantized), "op 'layer_norm': quantized_dtype must be int8, uint8, "
                   "float8e4m3fn or float8e5m2, got ", dtype_name(quantized));
  fused::output_quantization(desc.attrs, quantized);  // y_scale and y_zero_point
  TensorDesc yq = output_like(x, x.shape);
  yq.dtype = quantized;
  return {output_like(x, x.shape), yq};
}

std::vector<TensorDesc> infer_unary(const OpDescriptor& desc) {
  check_float_inputs(desc, {"x"});
  if (desc.op == "gelu") {
    const std::string approximate = desc.attrs.get_string("approximate", "none");
    XPURT_CHECK(approximate == "none" || approximate == "tanh", "op 'gelu': approximate must be 'none' or 'tanh', "
                "got '", approximate, "'");
  }
  return {output_like(desc.inputs[0], desc.inputs[0].shape)};
}

std::vector<TensorDesc> infer_fused_elementwise(const OpDescriptor& desc) {
  XPURT_CHECK(!desc.inputs.empty(), "op 'fused_elementwise' needs at least one input");
  Shape out;
  std::vector<Shape> stored;
  for (const TensorDesc& x : desc.inputs) stored.push_back(x.shape);
  // What the program reads: an input with a view (Note [Inputs read through a view]) is read as the view's shape.
  const fused::InputViews views = fused::input_views(desc.attrs, stored);
  const std::vector<Shape> shapes = fused::read_shapes(views, stored);
  for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
    const TensorDesc& x = desc.inputs[k];
    if (x.dtype != DType::kFloat32 && x.dtype != DType::kFloat16 && x.dtype != DType::kBFloat16) {
      throw InvalidTypeError(detail::str_cat("op 'fused_elementwise': input ", k, " is ", dtype_name(x.dtype),
                                             "; the inputs are float32, float16 or bfloat16"));
    }
  }
  const fused::Pieces pieces = fused::pieces(desc.attrs, desc.inputs.size());
  if (!pieces.empty()) {  // Note [Pieces of a concatenation]: the pieces' shapes, their programs, rotate_half's axis
    out = fused::pieces_output_shape(pieces, shapes);
    fused::piece_layouts(pieces, shapes, views, out);
  } else {
    for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
      out = k == 0 ? shapes[k] : broadcast_shapes(out, shapes[k], desc.op, "input");
    }
    // The kernels' own checks, at plan time: the program, row_axes against the output's rank, rotate_half's axis.
    const fused::Program program = fused::parse(desc.attrs.get_string("program", ""), desc.inputs.size());
    fused::check_rotate_half(program, fused::layout(shapes, out, desc.attrs.get_int("row_axes", 0), views));
  }
  DType dtype = desc.inputs[0].dtype;
  if (desc.attrs.has("output_dtype")) {
    dtype = dtype_from_name(desc.attrs.get_string("output_dtype", ""));
    if (fused::quantized_output(dtype)) {
      fused::output_quantization(desc.attrs, dtype);  // Note [Quantized output of a fused program]
    } else if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
      throw InvalidTypeError(detail::str_cat("op 'fused_elementwise': output_dtype ", dtype_name(dtype),
                                             "; the output is float32, float16, bfloat16, or int8/uint8/float8e4m3fn/"
                                             "float8e5m2 with y_scale and y_zero_point"));
    }
  }
  TensorDesc y = output_like(desc.inputs[0], out);
  y.dtype = dtype;
  return {y};
}

std::vector<TensorDesc> infer_binary(const OpDescriptor& desc) {
  check_float_inputs(desc, {"a", "b"});
  return {output_like(desc.inputs[0], broadcast_shapes(desc.inputs[0].shape, desc.inputs[1].shape, desc.op, "input"))};
}

std::vector<TensorDesc> infer_reduce(const OpDescriptor& desc) {
  const DType dtype = desc.inputs[0].dtype;
  const bool float_only = desc.op == "reduce_mean" || desc.op == "reduce_sum_square";
  // max and min of bools: any and all (ONNX ReduceMax/ReduceMin-20; Note [Reductions of predicates])
  const bool any_all = dtype == DType::kBool && (desc.op == "reduce_max" || desc.op == "reduce_min");
  if (float_only || (dtype != DType::kInt32 && dtype != DType::kInt64 && !any_all)) {
    check_float_inputs(desc, {"x"});  // sum, max, min and prod also take int32/int64
  }
  const TensorDesc& x = desc.inputs[0];
  auto axes = desc.attrs.get_ints("axes", {});
  const bool keepdims = desc.attrs.get_int("keepdims", 1) != 0;
  std::vector<bool> reduced(x.shape.size(), axes.empty());
  for (auto axis : axes) {
    const auto a = normalize_axis(axis, x.dim(), desc.op, "axes");
    XPURT_CHECK(!reduced[a], "op '", desc.op, "': axis ", axis, " is listed twice in 'axes'");
    reduced[a] = true;
  }
  Shape out;
  for (int k = 0; k < x.dim(); ++k) {
    if (!reduced[k]) {
      out.push_back(x.shape[k]);
    } else {
      XPURT_CHECK(x.shape[k] > 0 || desc.op == "reduce_sum" || desc.op == "reduce_mean" || desc.op == "reduce_prod" ||
                      desc.op == "reduce_sum_square",
                  "op '", desc.op,
                  "': cannot reduce an empty axis ", k);
      if (keepdims) out.push_back(1);
    }
  }
  return {output_like(x, out)};
}

std::vector<TensorDesc> infer_attention(const OpDescriptor& desc) {
  check_float_inputs(desc, {"q", "k", "v", "mask?"});
  // The checks below read the [B, H, S, D] views of tensors held as [B, S, H, D] or packed (Note [Attention
  // layouts]).
  const AttentionLayout layout = AttentionLayout::of(desc.attrs);
  const auto dims = layout.dims(desc.inputs[0].shape, desc.inputs[1].shape, desc.inputs[2].shape);
  TensorDesc q = desc.inputs[0], k = desc.inputs[1], v = desc.inputs[2];
  q.shape = dims[0];
  k.shape = dims[1];
  v.shape = dims[2];
  check_rank(q, 4, "attention", "q", "[B, H, Sq, D]");
  check_rank(k, 4, "attention", "k", "[B, Hkv, Sk, D]");
  check_rank(v, 4, "attention", "v", "[B, Hkv, Sk, Dv]");
  XPURT_CHECK(k.shape[0] == q.shape[0] && v.shape[0] == q.shape[0], "op 'attention': q, k, v must share the batch "
              "size; got q ", shape_str(q.shape), ", k ", shape_str(k.shape), ", v ", shape_str(v.shape));
  XPURT_CHECK(k.shape[1] == v.shape[1] && k.shape[1] >= 1 && q.shape[1] % k.shape[1] == 0,
              "op 'attention': k and v must have the same number of heads Hkv dividing q's heads H; got q ",
              shape_str(q.shape), ", k ", shape_str(k.shape), ", v ", shape_str(v.shape));
  XPURT_CHECK(k.shape[3] == q.shape[3], "op 'attention': q and k must have the same head dim; got q ",
              shape_str(q.shape), " and k ", shape_str(k.shape));
  XPURT_CHECK(v.shape[2] == k.shape[2], "op 'attention': k and v must have the same sequence length; got k ",
              shape_str(k.shape), " and v ", shape_str(v.shape));
  const Shape scores = {q.shape[0], q.shape[1], q.shape[2], k.shape[2]};
  if (desc.inputs[3].present) {
    const Shape& mask = desc.inputs[3].shape;
    XPURT_CHECK(mask.size() <= 4 && broadcast_shapes(mask, scores, "attention", "mask") == scores,
                "op 'attention': mask ", shape_str(mask), " must broadcast to the scores' shape ",
                shape_str(scores), " [B, H, Sq, Sk]");
  }
  const double scale = desc.attrs.get_float("scale", 0.0);
  XPURT_CHECK(std::isfinite(scale) && scale >= 0, "op 'attention': scale must be >= 0 (0 = 1/sqrt(D)), got ", scale);
  const std::int64_t return_lse = desc.attrs.get_int("return_lse", 0);
  XPURT_CHECK(return_lse == 0 || return_lse == 1, "op 'attention': return_lse must be 0 or 1, got ", return_lse);
  fully_masked_rows_of(desc.attrs);  // "nan", "zero" or "uniform" (Note [Fully masked attention rows])
  std::vector<TensorDesc> outputs = {
      output_like(q, layout.stored_output(layout.dims(desc.inputs[0].shape, desc.inputs[1].shape,
                                                      desc.inputs[2].shape)[3]))};
  if (return_lse == 1) {
    // lse [B, H, Sq] float32 whatever q's dtype: Note [Attention log-sum-exp] in cpu_attention.cpp.
    TensorDesc lse = output_like(q, {q.shape[0], q.shape[1], q.shape[2]});
    lse.dtype = DType::kFloat32;
    outputs.push_back(std::move(lse));
  }
  return outputs;
}

}  // namespace

void register_data_ops(KernelRegistry& registry);  // op_schemas_data.cpp: data movement, every-dtype ops
void register_int4_ops(KernelRegistry& registry);  // op_schemas_int4.cpp: matmul_nbits
void register_gqa_ops(KernelRegistry& registry);   // op_schemas_gqa.cpp: group_query_attention
void register_quantize_ops(KernelRegistry& registry);  // op_schemas_quantize.cpp: (de)quantize_linear

void register_ops(KernelRegistry& registry) {
  // `outputs`: the outputs' names where an op has optional ones (empty: one output, "y").
  auto add = [&](std::string name, std::string family, std::vector<std::string> inputs, std::string doc,
                 std::function<std::vector<TensorDesc>(const OpDescriptor&)> infer,
                 std::vector<std::string> outputs = {}) {
    OpSchema schema;
    schema.name = std::move(name);
    schema.family = std::move(family);
    schema.inputs = std::move(inputs);
    if (!outputs.empty()) schema.outputs = std::move(outputs);
    schema.doc = std::move(doc);
    schema.infer = std::move(infer);
    registry.add_schema(std::move(schema));
  };
  add("matmul", "matmul", {"a", "b"}, "a[..., M, K] @ b[..., K, N], batch dims broadcast", infer_matmul);
  add("linear", "matmul", {"x", "weight", "bias?", "residual?"},
      "act(x @ W^T + bias + residual); activation=none|relu|gelu|gelu_tanh, weight_layout=nk|kn", infer_linear);
  add("linear_grad_weight", "matmul", {"grad", "x"},
      "linear's weight gradient grad[..., N]^T @ x[..., K] -> [N, K]; bias=1 also returns the bias gradient "
      "(grad summed over its leading dims) -> [N]",
      infer_linear_grad_weight);
  add("conv2d", "conv", {"x", "weight", "bias?", "residual?"},
      "act(conv(x, w) + bias + residual); layout=NCHW (default) or NHWC (x [N,H,W,C], weight [O,kh,kw,C/groups]); "
      "strides, pads (t,l,b,r), dilations, groups, activation=none|relu",
      infer_conv2d);
  add("qlinear", "qmatmul", {"x", "weight", "w_scale?", "bias?", "x_zero_point?"},
      "int8 GEMM (Note [Quantized registry ops]): x int8/uint8 [..., K], weight int8 [K, N] (weight_layout=kn) or "
      "[N, K] (nk), w_scale float32 [N] or one element, bias int32 or float32 [N], x_zero_point one element of x's "
      "dtype (a run-time zero point, in place of the attribute); x_scale, x_zero_point, y_scale, y_zero_point, "
      "activation=none|relu, output_dtype=int8|uint8|float32|float16|int32 (the accumulator)",
      infer_qlinear);
  add("qlinear_fp8", "qmatmul", {"x", "weight", "w_scale", "bias?"},
      "float8 GEMM (Note [Float8 quantized linear]): x float8e4m3fn [..., K], weight float8e4m3fn [K, N] "
      "(weight_layout=kn) or [N, K] (nk), w_scale float32 [N] or one element, bias float32 or float16 [N]; x_scale, "
      "activation=none|relu, output_dtype=float8e4m3fn (with y_scale)|float32|float16, fast_accumulation=0|1",
      infer_qlinear_fp8);
  add("qconv2d", "qconv", {"x", "weight", "w_scale?", "bias?"},
      "int8 convolution (Note [Quantized registry ops]): x int8/uint8, weight int8 [O, C/groups, kh, kw], "
      "w_scale float32 [O] or one element, bias int32 or float32 [O]; conv2d's strides, pads, dilations, groups and "
      "layout=NCHW (default) or NHWC (x [N,H,W,C], weight [O,kh,kw,C/groups], y [N,OH,OW,O]); qlinear's scales, "
      "zero points, activation and output_dtype; zero_point_folded=1: the int32 bias already holds "
      "-x_zero_point * sum w[o] (x_zero_point then only fills the padding)",
      infer_qconv2d);
  add("conv_transpose2d", "conv", {"x", "weight", "bias?"},
      "ONNX ConvTranspose in 2-D: x[N,C,H,W], weight [C, O/groups, kh, kw]; strides, pads (t,l,b,r), dilations, "
      "groups, output_padding (h,w)",
      infer_conv_transpose2d);
  add("conv3d", "conv", {"x", "weight", "bias?", "residual?"},
      "act(conv(x, w) + bias + residual) in 3-D: x[N,C,D,H,W], weight [O, C/groups, kd, kh, kw]; strides (3), pads "
      "(d,h,w begins, then ends), dilations (3), groups, activation=none|relu",
      [](const OpDescriptor& d) { return infer_conv3d_like(d, false); });
  add("conv_transpose3d", "conv", {"x", "weight", "bias?"},
      "ONNX ConvTranspose in 3-D: x[N,C,D,H,W], weight [C, O/groups, kd, kh, kw]; strides, pads, dilations, groups, "
      "output_padding (3 each; pads 6)",
      [](const OpDescriptor& d) { return infer_conv3d_like(d, true); });
  add("max_pool2d", "pool", {"x"}, "max pooling, layout=NCHW|NHWC; kernel_shape, strides, pads, dilations, ceil_mode",
      infer_pool);
  add("avg_pool2d", "pool", {"x"}, "average pooling, layout=NCHW|NHWC; kernel_shape, strides, pads, ceil_mode, "
      "count_include_pad",
      infer_pool);
  add("global_avg_pool", "pool", {"x"}, "mean over H and W, layout=NCHW|NHWC", infer_pool);
  add("batch_norm", "batch_norm", {"x", "scale", "bias", "mean", "var"},
      "inference batch norm over axis 1; epsilon=1e-5", infer_batch_norm);
  add("softmax", "softmax", {"x"}, "softmax along axis (default -1)", infer_softmax);
  // Two outputs: y, and with quantized_dtype set y quantized per tensor (Note [Quantized layer norm output]).
  add("layer_norm", "layer_norm", {"x", "scale?", "bias?", "residual?", "addend?"},
      "normalize x (+ residual) over dims axis.. (default -1), then + addend (a res-post-norm block's residual); "
      "epsilon=1e-5; quantized_dtype=int8|uint8|float8e4m3fn|float8e5m2 with y_scale, y_zero_point: second output "
      "QuantizeLinear(y); row_affine=1: scale and bias [P] give run j (runs of affine_run elements, default the "
      "row) scale[j % P], bias[j % P] (Note [Per-row affine of a layer norm])",
      infer_layer_norm, {"y", "y_quantized?"});
  add("gelu", "activation", {"x"}, "GELU; approximate=none|tanh", infer_unary);
  add("fused_elementwise", "fusion", {"x..."},
      "a chain of elementwise ops, casts and row reductions as one kernel (Note [Fused elementwise programs]); "
      "program=\"mul x0 x1; sigmoid t0\": float32 math, float inputs broadcast to the output; row_axes=0 (the "
      "reductions' trailing axes); output_dtype=(input 0's); input_views (Note [Inputs read through a view]); "
      "pieces=[axis, n_0, n_1, ...] with programs joined by '|': a concatenation of programs (Note [Pieces of a "
      "concatenation])",
      infer_fused_elementwise);
  for (const char* op : {"relu", "sigmoid", "tanh", "silu"}) {
    add(op, "activation", {"x"}, std::string(op) + "(x)", infer_unary);
  }
  for (const char* op : {"exp", "log", "sqrt", "abs", "erf", "reciprocal"}) {
    add(op, "elementwise", {"x"}, std::string(op) + "(x)", infer_unary);
  }
  for (const char* op : {"pow", "maximum", "minimum"}) {
    add(op, "elementwise", {"a", "b"}, std::string(op) + "(a, b) with NumPy broadcasting", infer_binary);
  }
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"}) {
    add(op, "reduce", {"x"}, "reduce over axes (empty = all); keepdims=1; sum/max/min/prod also int32/int64, max/min "
        "also bool (any/all)",
        infer_reduce);
  }
  add("reduce_sum_square", "reduce", {"x"}, "sum of x * x over axes (empty = all), each square in float32 or wider; "
      "keepdims=1; float only", infer_reduce);
  // Two outputs: y, and with return_lse=1 the log-sum-exp of each score row (the second output is absent otherwise).
  add("attention", "attention", {"q", "k", "v", "mask?"},
      "softmax(q k^T * scale + mask) v; [B, H, S, D], causal=0, scale=0 (1/sqrt(D)), GQA when Hkv divides H; "
      "return_lse=0 (1: second output lse [B, H, Sq] float32, log sum exp of the scores); fully_masked_rows=\"nan\" "
      "(\"zero\": a row whose every score is -inf gives 0, not NaN; \"uniform\": the mean of v)",
      infer_attention, {"y", "lse?"});
  register_data_ops(registry);
  register_int4_ops(registry);
  register_gqa_ops(registry);
  register_quantize_ops(registry);
  distributed::register_collective_schemas(registry);
}

}  // namespace xpuruntime
