// ONNX reference ops, quantization: QuantizeLinear, DequantizeLinear (int8/uint8/int16/uint16, float8, int4/uint4;
// per tensor, per axis, blocked), DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, and
// ONNX Runtime's com.microsoft QLinearAdd, QLinearMul, QGemm, MatMulNBits, GatherBlockQuantized and the QOperator
// format's ops (Note [ONNX Runtime's QOperator contrib ops]). See backends/cpu/onnx/onnx_kernels.h.
//
// Note [Quantized arithmetic]
// Quantizing follows ONNX: y = saturate(round_half_even(x / scale) + zero_point), with x / scale computed in
// float32 (as ONNX's reference and ONNX Runtime do, so ties round the same way). The integer ops subtract the
// zero points and accumulate in int32 that wraps on overflow (ONNX's accumulator type; products of 8-bit values
// only overflow past ~33000 terms). The QLinear ops requantize the int32 accumulator as
// real = acc * x_scale * w_scale, then quantize `real` with y_scale and y_zero_point.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "backends/cpu/onnx/onnx_misc.h"

namespace xpuruntime::onnx_ref {
namespace {

using namespace misc;  // NOLINT(google-build-using-namespace): this group's helpers (onnx_misc.h)

using Shape = std::vector<std::int64_t>;

bool is_quantized_int(DType d) { return d == DType::kInt8 || d == DType::kUInt8 || d == DType::kInt16; }

// The quantized types of QuantizeLinear's output and DequantizeLinear's input at `opset`: 8-bit and int16 (int16
// and uint16 from opset 21, accepted earlier as before), float8 from 19, int4/uint4 from 21.
bool is_quantized_type(DType d, std::int64_t opset) {
  if (is_quantized_int(d) || d == DType::kUInt16) return true;
  if (is_float8_dtype(d)) return opset >= 19;
  return is_int4_dtype(d) && opset >= 21;
}

// The saturation range of a quantized integer type.
void quant_range(DType d, double& lo, double& hi) {
  switch (d) {
    case DType::kInt8: lo = -128; hi = 127; return;
    case DType::kUInt8: lo = 0; hi = 255; return;
    case DType::kInt16: lo = -32768; hi = 32767; return;
    case DType::kUInt16: lo = 0; hi = 65535; return;
    case DType::kInt4: lo = -8; hi = 7; return;
    case DType::kUInt4: lo = 0; hi = 15; return;
    case DType::kInt32:
      lo = std::numeric_limits<std::int32_t>::min();
      hi = std::numeric_limits<std::int32_t>::max();
      return;
    default: break;
  }
  XPURT_INTERNAL_ASSERT(false, "quant_range of ", dtype_name(d));
}

// saturate(round_half_even(v) + zero_point), in double (exact for the integer ranges involved).
double quantize_value(float scaled, double zero_point, double lo, double hi) {
  if (std::isnan(scaled)) return zero_point < lo ? lo : (zero_point > hi ? hi : zero_point);
  const double q = round_half_even(static_cast<double>(scaled)) + zero_point;
  return std::min(hi, std::max(lo, q));
}

// Which element of a scale / zero-point tensor applies to each element of the quantized tensor: one for the
// whole tensor, one per index along `axis` (opset 13+), or one per block of `block` indices along `axis`
// (opset 21+, the parameter tensor having the input's rank).
struct ParamIndexer {
  enum class Kind { kTensor, kAxis, kBlocked } kind = Kind::kTensor;
  std::int64_t axis_dim = 1;        // x.shape[axis]
  std::int64_t inner = 1;           // product of x's dims after axis
  std::int64_t block = 1;           // block size (kBlocked)
  std::int64_t param_axis_dim = 1;  // scale.shape[axis] (kBlocked)

  std::int64_t operator()(std::int64_t i) const {
    if (kind == Kind::kTensor) return 0;
    const std::int64_t a = (i / inner) % axis_dim;
    if (kind == Kind::kAxis) return a;
    const std::int64_t outer = i / (inner * axis_dim);
    return (outer * param_axis_dim + a / block) * inner + i % inner;
  }
};

ParamIndexer make_param_indexer(const OpContext& ctx, const Shape& x_shape, const Tensor& scale,
                                const char* scale_name) {
  ParamIndexer ix;
  const std::int64_t block = ctx.opset() >= 21 ? ctx.attr_int("block_size", 0) : 0;
  XPURT_CHECK(block >= 0, ctx.where(), ": block_size must be >= 0, got ", block);
  const Shape& s = scale.shape();
  if (block == 0 && scale.numel() == 1 && s.size() <= 1) return ix;
  const auto rank = static_cast<std::int64_t>(x_shape.size());
  XPURT_CHECK(ctx.opset() >= 13, ctx.where(), ": '", scale_name, "' must be a scalar before opset 13 (got shape ",
              shape_str(s), ")");
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 1), rank, ctx.where());
  ix.axis_dim = x_shape[static_cast<std::size_t>(axis)];
  for (std::int64_t d = axis + 1; d < rank; ++d) ix.inner *= x_shape[static_cast<std::size_t>(d)];
  if (block == 0) {
    XPURT_CHECK(s.size() == 1 && s[0] == ix.axis_dim, ctx.where(), ": per-axis '", scale_name,
                "' must be 1-D of size ", ix.axis_dim, " (input dimension ", axis, " of ", shape_str(x_shape),
                "), got shape ", shape_str(s));
    ix.kind = ParamIndexer::Kind::kAxis;
    return ix;
  }
  XPURT_CHECK(static_cast<std::int64_t>(s.size()) == rank, ctx.where(), ": blocked '", scale_name,
              "' must have the input's rank ", rank, ", got shape ", shape_str(s));
  for (std::int64_t d = 0; d < rank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    const std::int64_t expected = d == axis ? (x_shape[du] + block - 1) / block : x_shape[du];
    XPURT_CHECK(s[du] == expected, ctx.where(), ": blocked '", scale_name, "' of shape ", shape_str(s),
                " does not fit input ", shape_str(x_shape), " with block_size ", block, " on axis ", axis,
                " (dimension ", d, " should be ", expected, ")");
  }
  ix.kind = ParamIndexer::Kind::kBlocked;
  ix.block = block;
  ix.param_axis_dim = s[static_cast<std::size_t>(axis)];
  return ix;
}

void check_same_shape(const OpContext& ctx, const Tensor& scale, const Tensor& zero_point, const char* zp_name) {
  XPURT_CHECK(zero_point.numel() == scale.numel(), ctx.where(), ": '", zp_name, "' has shape ",
              shape_str(zero_point.shape()), " but the scale has shape ", shape_str(scale.shape()));
}

ScratchVector<float> to_floats(const Tensor& t) {
  ScratchVector<float> out(static_cast<std::size_t>(t.numel()));
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = data<T>(t);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(Compute<T>::load(p[i]));
  });
  return out;
}

void check_scale_dtype(const OpContext& ctx, const Tensor& scale, const char* name) {
  XPURT_CHECK_TYPE(is_float_dtype(scale.dtype()), ctx.where(), ": '", name,
                   "' must be a floating-point tensor, got ", dtype_name(scale.dtype()));
}

// QuantizeLinear (Note [Quantized arithmetic]): the output type is the zero point's, else output_dtype (opset 21),
// else uint8. Integer types: saturate(round_half_even(x / scale) + zero_point); float8: x / scale + zero_point
// rounded to nearest even with `saturate` (opset 19; Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h).
void quantize_linear(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  XPURT_CHECK_TYPE(is_float_dtype(x.dtype()) || x.dtype() == DType::kInt32, ctx.where(),
                   ": input 'x' must be float32, float16, bfloat16 or int32, got ", dtype_name(x.dtype()));
  check_scale_dtype(ctx, scale, "y_scale");
  DType out_dtype = DType::kUInt8;
  const std::int64_t output_dtype = ctx.opset() >= 21 ? ctx.attr_int("output_dtype", 0) : 0;
  if (output_dtype != 0) out_dtype = dtype_from_onnx(output_dtype, ctx.where(), "output_dtype");
  ScratchVector<double> zero_points;
  if (ctx.has_input(2)) {
    const Tensor& zp = ctx.input(2);
    XPURT_CHECK_TYPE(output_dtype == 0 || zp.dtype() == out_dtype, ctx.where(), ": output_dtype is ",
                     dtype_name(out_dtype), " but 'y_zero_point' is ", dtype_name(zp.dtype()));
    out_dtype = zp.dtype();
    check_same_shape(ctx, scale, zp, "y_zero_point");
    zero_points = to_doubles(zp);
  }
  if (!is_quantized_type(out_dtype, ctx.opset())) {
    throw UnsupportedOperationError(detail::str_cat(
        ctx.where(), ": quantizing to ", dtype_name(out_dtype), " is not supported at opset ", ctx.opset(),
        " (uint8, int8, int16 and uint16; float8 from opset 19; int4 and uint4 from opset 21)"));
  }
  const bool to_float8 = is_float8_dtype(out_dtype);
  const bool saturate = ctx.attr_int("saturate", 1) != 0;
  const ParamIndexer ix = make_param_indexer(ctx, x.shape(), scale, "y_scale");
  const ScratchVector<float> scales = to_floats(scale);
  double lo = 0, hi = 0;
  if (!to_float8) quant_range(out_dtype, lo, hi);
  const ScratchVector<double> xs = to_doubles(x);
  ScratchVector<double> ys(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const auto p = static_cast<std::size_t>(ix(static_cast<std::int64_t>(i)));
    const float scaled = static_cast<float>(xs[i]) / scales[p];
    const double zero_point = zero_points.empty() ? 0.0 : zero_points[p];
    // float8: the sum rounds once, in store_doubles (a zero point is 0 in practice, which keeps it exact).
    ys[i] = to_float8 ? static_cast<double>(scaled) + zero_point : quantize_value(scaled, zero_point, lo, hi);
  }
  store_doubles(ctx.allocate_output(0, x.shape(), out_dtype), ys, saturate);
}

// DequantizeLinear: (x - zero_point) * scale in float32, for every quantized type of the opset (float8 values
// exactly as floats).
void dequantize_linear(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  XPURT_CHECK_TYPE(is_quantized_type(x.dtype(), ctx.opset()) || x.dtype() == DType::kInt32, ctx.where(),
                   ": input 'x' must be int8, uint8, int16, uint16 or int32 (float8 from opset 19, int4 and uint4 "
                   "from opset 21), got ", dtype_name(x.dtype()), " at opset ", ctx.opset());
  check_scale_dtype(ctx, scale, "x_scale");
  ScratchVector<double> zero_points;
  if (ctx.has_input(2)) {
    const Tensor& zp = ctx.input(2);
    XPURT_CHECK_TYPE(zp.dtype() == x.dtype(), ctx.where(), ": 'x_zero_point' must have the dtype of 'x' (",
                     dtype_name(x.dtype()), "), got ", dtype_name(zp.dtype()));
    check_same_shape(ctx, scale, zp, "x_zero_point");
    zero_points = to_doubles(zp);
  }
  const ParamIndexer ix = make_param_indexer(ctx, x.shape(), scale, "x_scale");
  const ScratchVector<float> scales = to_floats(scale);
  const ScratchVector<double> xs = to_doubles(x);
  ScratchVector<double> ys(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const auto p = static_cast<std::size_t>(ix(static_cast<std::int64_t>(i)));
    const double centered = xs[i] - (zero_points.empty() ? 0.0 : zero_points[p]);
    ys[i] = static_cast<double>(static_cast<float>(centered) * scales[p]);
  }
  store_doubles(ctx.allocate_output(0, x.shape(), scale.dtype()), ys);
}

void dynamic_quantize_linear(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  XPURT_CHECK_TYPE(x.dtype() == DType::kFloat32, ctx.where(), ": input 'x' must be float32, got ",
                   dtype_name(x.dtype()));
  const float* xs = data<float>(x);
  const std::int64_t n = x.numel();
  float x_min = 0.0f, x_max = 0.0f;  // the range always includes 0
  for (std::int64_t i = 0; i < n; ++i) {
    XPURT_CHECK(std::isfinite(xs[i]), ctx.where(), ": input 'x' holds a non-finite value at index ", i);
    x_min = std::min(x_min, xs[i]);
    x_max = std::max(x_max, xs[i]);
  }
  const float scale = (x_max - x_min) / 255.0f;
  double zero_point = 0.0;
  if (scale > 0.0f) zero_point = std::min(255.0, std::max(0.0, round_half_even(static_cast<double>(-x_min / scale))));
  Tensor& y = ctx.allocate_output(0, x.shape(), DType::kUInt8);
  std::uint8_t* ys = data<std::uint8_t>(y);
  for (std::int64_t i = 0; i < n; ++i) {
    ys[i] = scale > 0.0f ? static_cast<std::uint8_t>(quantize_value(xs[i] / scale, zero_point, 0, 255)) : 0;
  }
  *data<float>(ctx.allocate_output(1, {}, DType::kFloat32)) = scale;
  *data<std::uint8_t>(ctx.allocate_output(2, {}, DType::kUInt8)) = static_cast<std::uint8_t>(zero_point);
}

// ---- integer matmul -------------------------------------------------------------------------------------

// A quantized operand with its zero point subtracted, as int32.
ScratchVector<std::int32_t> load_int32(const Tensor& t) {
  ScratchVector<std::int32_t> out(static_cast<std::size_t>(t.numel()));
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      const T* p = data<T>(t);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::int32_t>(p[i]);
    } else {
      XPURT_INTERNAL_ASSERT(false, "load_int32 of ", dtype_name(t.dtype()));
    }
  });
  return out;
}

void check_quantized_operand(const OpContext& ctx, const Tensor& t, const char* name) {
  XPURT_CHECK_TYPE(t.dtype() == DType::kInt8 || t.dtype() == DType::kUInt8, ctx.where(), ": input '", name,
                   "' must be int8 or uint8, got ", dtype_name(t.dtype()));
}

// The shape a per-row parameter of the left operand takes: a 1-D [M] parameter of an operand [..., M, K]
// applies per row, i.e. it is read as [M, 1]; other shapes broadcast as they are.
Shape row_param_shape(const Tensor& param, const Shape& operand) {
  if (param.dim() == 1 && operand.size() >= 2 && param.numel() > 1) return {param.shape()[0], 1};
  return param.shape();
}

// Values of `param` (read with `param_shape`) broadcast to `target` (numpy rules; the broadcast must give
// `target` itself). `what` names the parameter in errors.
ScratchVector<double> broadcast_param(const OpContext& ctx, const Tensor& param, const Shape& param_shape,
                                    const Shape& target, const std::string& what) {
  const ScratchVector<double> values = to_doubles(param);
  if (values.size() == 1) return ScratchVector<double>(static_cast<std::size_t>(numel_of(target)), values[0]);
  const Shape b = broadcast_shapes(param_shape, target, ctx.where());
  XPURT_CHECK(b == target, ctx.where(), ": '", what, "' of shape ", shape_str(param.shape()),
              " does not broadcast to ", shape_str(target));
  ScratchVector<double> out(static_cast<std::size_t>(numel_of(target)));
  const Shape strides = broadcast_strides(param_shape, target);
  for_each_index2(target, strides, strides, [&](std::int64_t o, std::int64_t, std::int64_t i) {
    out[static_cast<std::size_t>(i)] = values[static_cast<std::size_t>(o)];
  });
  return out;
}

ScratchVector<std::int32_t> centered(const OpContext& ctx, const Tensor& x, const Tensor* zero_point,
                                   const Shape& zp_shape, const char* zp_name) {
  ScratchVector<std::int32_t> v = load_int32(x);
  if (zero_point == nullptr) return v;
  XPURT_CHECK_TYPE(zero_point->dtype() == x.dtype(), ctx.where(), ": '", zp_name, "' must have dtype ",
                   dtype_name(x.dtype()), ", got ", dtype_name(zero_point->dtype()));
  const ScratchVector<double> zp = broadcast_param(ctx, *zero_point, zp_shape, x.shape(), zp_name);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] -= static_cast<std::int32_t>(zp[i]);
  return v;
}

// c[m x n] = a[m x k] * b[k x n] (row-major, contiguous) in int32 arithmetic that wraps on overflow like ONNX's
// int32 accumulator (done in uint32, where wrapping is defined). The inner loop runs along rows of b and c.
void gemm_int32(const std::int32_t* a, const std::int32_t* b, std::int32_t* c, std::int64_t m, std::int64_t n,
                std::int64_t k) {
  ScratchVector<std::uint32_t> row(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), 0u);
    for (std::int64_t l = 0; l < k; ++l) {
      const auto av = static_cast<std::uint32_t>(a[i * k + l]);
      if (av == 0) continue;
      const std::int32_t* pb = b + l * n;
      for (std::int64_t j = 0; j < n; ++j) row[static_cast<std::size_t>(j)] += av * static_cast<std::uint32_t>(pb[j]);
    }
    for (std::int64_t j = 0; j < n; ++j) c[i * n + j] = static_cast<std::int32_t>(row[static_cast<std::size_t>(j)]);
  }
}

// numpy.matmul of two int32 arrays (1-D operands promoted, batch dimensions broadcast), accumulated in wrapping
// int32. `out_shape` gets the result's shape; `full_shape` the shape with both promoted dims kept
// ([..., M, N]).
ScratchVector<std::int32_t> matmul_int(const OpContext& ctx, const ScratchVector<std::int32_t>& a, Shape as,
                                     const ScratchVector<std::int32_t>& b, Shape bs, Shape& out_shape,
                                     Shape& full_shape) {
  XPURT_CHECK(!as.empty() && !bs.empty(), ctx.where(), ": matmul operands must have rank >= 1");
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const std::int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  XPURT_CHECK(bs[bs.size() - 2] == k, ctx.where(), ": inner dimensions differ: A ", shape_str(as), " and B ",
              shape_str(bs));
  const Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  const Shape batch = broadcast_shapes(a_batch, b_batch, ctx.where());
  const Shape sa = broadcast_strides(a_batch, batch), sb = broadcast_strides(b_batch, batch);
  full_shape = batch;
  full_shape.push_back(m);
  full_shape.push_back(n);
  ScratchVector<std::int32_t> out(static_cast<std::size_t>(numel_of(full_shape)));
  auto body = [&](std::int64_t oa, std::int64_t ob, std::int64_t bi) {
    gemm_int32(a.data() + oa * m * k, b.data() + ob * k * n, out.data() + bi * m * n, m, n, k);
  };
  if (batch.empty()) {
    body(0, 0, 0);
  } else {
    for_each_index2(batch, sa, sb, body);
  }
  out_shape = batch;
  if (!a_vec) out_shape.push_back(m);
  if (!b_vec) out_shape.push_back(n);
  return out;
}

void matmul_integer(OpContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  check_quantized_operand(ctx, a, "A");
  check_quantized_operand(ctx, b, "B");
  const Tensor* azp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor* bzp = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  const auto ac = centered(ctx, a, azp, azp ? row_param_shape(*azp, a.shape()) : Shape{}, "a_zero_point");
  const auto bc = centered(ctx, b, bzp, bzp ? bzp->shape() : Shape{}, "b_zero_point");
  Shape out_shape, full_shape;
  const auto acc = matmul_int(ctx, ac, a.shape(), bc, b.shape(), out_shape, full_shape);
  Tensor& y = ctx.allocate_output(0, out_shape, DType::kInt32);
  std::copy(acc.begin(), acc.end(), data<std::int32_t>(y));
}

// Quantizes real = acc * scale_product[i] with a scalar y_scale and y_zero_point into output 0.
void requantize(OpContext& ctx, const ScratchVector<double>& real, const Shape& shape, const Tensor& y_scale,
                const Tensor& y_zero_point) {
  check_scale_dtype(ctx, y_scale, "y_scale");
  XPURT_CHECK(y_scale.numel() == 1 && y_zero_point.numel() == 1, ctx.where(),
              ": 'y_scale' and 'y_zero_point' must be scalars (per-tensor), got shapes ", shape_str(y_scale.shape()),
              " and ", shape_str(y_zero_point.shape()));
  const DType out_dtype = y_zero_point.dtype();
  XPURT_CHECK_TYPE(out_dtype == DType::kInt8 || out_dtype == DType::kUInt8, ctx.where(),
                   ": 'y_zero_point' must be int8 or uint8, got ", dtype_name(out_dtype));
  const auto ys = static_cast<float>(read_scalar(y_scale, ctx.where()));
  const double yzp = read_scalar(y_zero_point, ctx.where());
  double lo = 0, hi = 0;
  quant_range(out_dtype, lo, hi);
  ScratchVector<double> q(real.size());
  for (std::size_t i = 0; i < real.size(); ++i) q[i] = quantize_value(static_cast<float>(real[i]) / ys, yzp, lo, hi);
  store_doubles(ctx.allocate_output(0, shape, out_dtype), q);
}

void qlinear_matmul(OpContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& a_scale = ctx.input(1);
  const Tensor& a_zp = ctx.input(2);
  const Tensor& b = ctx.input(3);
  const Tensor& b_scale = ctx.input(4);
  const Tensor& b_zp = ctx.input(5);
  check_quantized_operand(ctx, a, "a");
  check_quantized_operand(ctx, b, "b");
  check_scale_dtype(ctx, a_scale, "a_scale");
  check_scale_dtype(ctx, b_scale, "b_scale");
  const auto ac = centered(ctx, a, &a_zp, row_param_shape(a_zp, a.shape()), "a_zero_point");
  const auto bc = centered(ctx, b, &b_zp, b_zp.shape(), "b_zero_point");
  Shape out_shape, full_shape;
  const auto acc = matmul_int(ctx, ac, a.shape(), bc, b.shape(), out_shape, full_shape);
  // Scales broadcast against the [..., M, N] result: a per-row one as [M, 1], a per-column one as [N].
  const Shape a_scale_shape = a.dim() >= 2 ? row_param_shape(a_scale, a.shape()) : a_scale.shape();
  const auto sa = broadcast_param(ctx, a_scale, a_scale_shape, full_shape, "a_scale");
  const auto sb = broadcast_param(ctx, b_scale, b_scale.shape(), full_shape, "b_scale");
  ScratchVector<double> real(acc.size());
  for (std::size_t i = 0; i < acc.size(); ++i) {
    real[i] = static_cast<double>(static_cast<float>(acc[i]) * static_cast<float>(sa[i]) * static_cast<float>(sb[i]));
  }
  requantize(ctx, real, out_shape, ctx.input(6), ctx.input(7));
}

// ---- integer convolution --------------------------------------------------------------------------------

struct ConvGeometry {
  Shape in, kernel, out, strides, dilations, pads_begin;
  std::int64_t batch = 0, in_channels = 0, out_channels = 0, group = 1;
};

ConvGeometry conv_geometry(const OpContext& ctx, const Shape& x, const Shape& w) {
  XPURT_CHECK(x.size() >= 3 && w.size() == x.size(), ctx.where(), ": expected input [N, C, D1, ...] and weight "
              "[M, C/group, k1, ...] of the same rank >= 3, got ", shape_str(x), " and ", shape_str(w));
  ConvGeometry g;
  const std::size_t sd = x.size() - 2;
  g.batch = x[0];
  g.in_channels = x[1];
  g.out_channels = w[0];
  g.group = ctx.attr_int("group", 1);
  XPURT_CHECK(g.group >= 1 && g.in_channels % g.group == 0 && g.out_channels % g.group == 0 &&
                  w[1] * g.group == g.in_channels,
              ctx.where(), ": group ", g.group, " does not fit input channels ", g.in_channels, " and weight ",
              shape_str(w));
  g.in.assign(x.begin() + 2, x.end());
  g.kernel = ctx.attr_ints("kernel_shape", Shape(w.begin() + 2, w.end()));
  XPURT_CHECK(g.kernel == Shape(w.begin() + 2, w.end()), ctx.where(), ": kernel_shape ", shape_str(g.kernel),
              " differs from the weight's spatial shape ", shape_str(Shape(w.begin() + 2, w.end())));
  g.strides = ctx.attr_ints("strides", Shape(sd, 1));
  g.dilations = ctx.attr_ints("dilations", Shape(sd, 1));
  Shape pads = ctx.attr_ints("pads", Shape(2 * sd, 0));
  XPURT_CHECK(g.strides.size() == sd && g.dilations.size() == sd && pads.size() == 2 * sd, ctx.where(),
              ": strides, dilations and pads must have ", sd, ", ", sd, " and ", 2 * sd, " values");
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  g.out.resize(sd);
  g.pads_begin.resize(sd);
  for (std::size_t d = 0; d < sd; ++d) {
    XPURT_CHECK(g.strides[d] >= 1 && g.dilations[d] >= 1, ctx.where(), ": strides and dilations must be >= 1");
    const std::int64_t extent = g.dilations[d] * (g.kernel[d] - 1) + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      g.out[d] = (g.in[d] + g.strides[d] - 1) / g.strides[d];
      const std::int64_t total = std::max<std::int64_t>(0, (g.out[d] - 1) * g.strides[d] + extent - g.in[d]);
      g.pads_begin[d] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    } else if (auto_pad == "VALID") {
      g.out[d] = g.in[d] >= extent ? (g.in[d] - extent) / g.strides[d] + 1 : 0;
      g.pads_begin[d] = 0;
    } else {
      XPURT_CHECK(auto_pad == "NOTSET", ctx.where(), ": unknown auto_pad '", auto_pad, "'");
      const std::int64_t padded = g.in[d] + pads[d] + pads[d + sd];
      g.out[d] = padded >= extent ? (padded - extent) / g.strides[d] + 1 : 0;
      g.pads_begin[d] = pads[d];
    }
  }
  return g;
}

// N-D grouped convolution of centered int32 operands: per image and group, the receptive fields are gathered
// into a [C/group * K, out positions] matrix (padding reads as 0, i.e. as the zero point), then one int32 GEMM
// with the group's [M/group, C/group * K] weights.
ScratchVector<std::int32_t> conv_int(const ConvGeometry& g, const ScratchVector<std::int32_t>& x,
                                   const ScratchVector<std::int32_t>& w) {
  const std::size_t sd = g.in.size();
  const std::int64_t in_size = numel_of(g.in), out_size = numel_of(g.out), k_size = numel_of(g.kernel);
  const std::int64_t cpg = g.in_channels / g.group, mpg = g.out_channels / g.group;
  ScratchVector<std::int32_t> y(static_cast<std::size_t>(g.batch * g.out_channels * out_size));
  if (y.empty()) return y;
  // For each (kernel element, output position): the input offset within one channel, or -1 in the padding.
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(k_size * out_size));
  Shape kpos(sd), opos(sd);
  for (std::int64_t k = 0; k < k_size; ++k) {
    std::int64_t r = k;
    for (std::size_t d = sd; d-- > 0;) {
      kpos[d] = r % g.kernel[d];
      r /= g.kernel[d];
    }
    for (std::int64_t o = 0; o < out_size; ++o) {
      std::int64_t ro = o, off = 0;
      for (std::size_t d = sd; d-- > 0;) {
        opos[d] = ro % g.out[d];
        ro /= g.out[d];
      }
      for (std::size_t d = 0; d < sd && off >= 0; ++d) {
        const std::int64_t p = opos[d] * g.strides[d] - g.pads_begin[d] + kpos[d] * g.dilations[d];
        off = p < 0 || p >= g.in[d] ? -1 : off * g.in[d] + p;
      }
      offsets[static_cast<std::size_t>(k * out_size + o)] = off;
    }
  }
  ScratchVector<std::int32_t> columns(static_cast<std::size_t>(cpg * k_size * out_size));
  for (std::int64_t n = 0; n < g.batch; ++n) {
    for (std::int64_t grp = 0; grp < g.group; ++grp) {
      for (std::int64_t c = 0; c < cpg; ++c) {
        const std::int32_t* px = x.data() + (n * g.in_channels + grp * cpg + c) * in_size;
        std::int32_t* col = columns.data() + c * k_size * out_size;
        for (std::int64_t i = 0; i < k_size * out_size; ++i) {
          const std::int64_t off = offsets[static_cast<std::size_t>(i)];
          col[i] = off >= 0 ? px[off] : 0;
        }
      }
      gemm_int32(w.data() + grp * mpg * cpg * k_size, columns.data(),
                 y.data() + (n * g.out_channels + grp * mpg) * out_size, mpg, out_size, cpg * k_size);
    }
  }
  return y;
}

Shape conv_output_shape(const ConvGeometry& g) {
  Shape s{g.batch, g.out_channels};
  s.insert(s.end(), g.out.begin(), g.out.end());
  return s;
}

// The per-output-channel form of a weight parameter: a 1-D [M] tensor is read as [M, 1, 1, ...].
Shape channel_param_shape(const Tensor& param, std::size_t rank) {
  if (param.dim() != 1 || param.numel() == 1) return param.shape();
  Shape s(rank, 1);
  s[0] = param.shape()[0];
  return s;
}

void check_scalar_param(const OpContext& ctx, const Tensor& t, const char* name) {
  XPURT_CHECK(t.numel() == 1, ctx.where(), ": '", name, "' must be a scalar, got shape ", shape_str(t.shape()));
}

void conv_integer(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  check_quantized_operand(ctx, x, "x");
  check_quantized_operand(ctx, w, "w");
  const ConvGeometry g = conv_geometry(ctx, x.shape(), w.shape());
  const Tensor* xzp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor* wzp = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  if (xzp != nullptr) check_scalar_param(ctx, *xzp, "x_zero_point");
  const auto xc = centered(ctx, x, xzp, xzp ? xzp->shape() : Shape{}, "x_zero_point");
  const auto wc = centered(ctx, w, wzp, wzp ? channel_param_shape(*wzp, w.shape().size()) : Shape{}, "w_zero_point");
  const auto acc = conv_int(g, xc, wc);
  Tensor& y = ctx.allocate_output(0, conv_output_shape(g), DType::kInt32);
  std::copy(acc.begin(), acc.end(), data<std::int32_t>(y));
}

void qlinear_conv(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& x_scale = ctx.input(1);
  const Tensor& x_zp = ctx.input(2);
  const Tensor& w = ctx.input(3);
  const Tensor& w_scale = ctx.input(4);
  const Tensor& w_zp = ctx.input(5);
  check_quantized_operand(ctx, x, "x");
  check_quantized_operand(ctx, w, "w");
  check_scale_dtype(ctx, x_scale, "x_scale");
  check_scale_dtype(ctx, w_scale, "w_scale");
  check_scalar_param(ctx, x_scale, "x_scale");
  check_scalar_param(ctx, x_zp, "x_zero_point");
  const ConvGeometry g = conv_geometry(ctx, x.shape(), w.shape());
  XPURT_CHECK(w_scale.numel() == 1 || (w_scale.dim() == 1 && w_scale.numel() == g.out_channels), ctx.where(),
              ": 'w_scale' must be a scalar or 1-D of size ", g.out_channels, ", got shape ",
              shape_str(w_scale.shape()));
  XPURT_CHECK(w_zp.numel() == 1 || (w_zp.dim() == 1 && w_zp.numel() == g.out_channels), ctx.where(),
              ": 'w_zero_point' must be a scalar or 1-D of size ", g.out_channels, ", got shape ",
              shape_str(w_zp.shape()));
  const auto xc = centered(ctx, x, &x_zp, x_zp.shape(), "x_zero_point");
  const auto wc = centered(ctx, w, &w_zp, channel_param_shape(w_zp, w.shape().size()), "w_zero_point");
  auto acc = conv_int(g, xc, wc);
  const Shape out_shape = conv_output_shape(g);
  const std::int64_t out_size = numel_of(g.out);
  if (ctx.has_input(8)) {
    const Tensor& bias = ctx.input(8);
    XPURT_CHECK_TYPE(bias.dtype() == DType::kInt32, ctx.where(), ": bias 'B' must be int32, got ",
                     dtype_name(bias.dtype()));
    XPURT_CHECK(bias.numel() == g.out_channels, ctx.where(), ": bias 'B' must have ", g.out_channels,
                " values, got shape ", shape_str(bias.shape()));
    const std::int32_t* pb = data<std::int32_t>(bias);
    for (std::size_t i = 0; i < acc.size(); ++i) {
      const auto m = static_cast<std::int64_t>(i) / out_size % g.out_channels;
      acc[i] = static_cast<std::int32_t>(static_cast<std::int64_t>(acc[i]) + pb[m]);
    }
  }
  const auto xs = static_cast<float>(read_scalar(x_scale, ctx.where()));
  const ScratchVector<float> ws = to_floats(w_scale);
  ScratchVector<double> real(acc.size());
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const auto m = static_cast<std::size_t>(static_cast<std::int64_t>(i) / out_size % g.out_channels);
    real[i] = static_cast<double>(static_cast<float>(acc[i]) * xs * ws[ws.size() == 1 ? 0 : m]);
  }
  requantize(ctx, real, out_shape, ctx.input(6), ctx.input(7));
}

// ---- com.microsoft contrib ops (ONNX Runtime's, which quantized exports carry) ----------------------------

// The int8/uint8 scalar zero point `t` (absent: 0) and a scalar scale, as QLinearAdd/QLinearMul/QGemm read them.
double optional_zero_point(const OpContext& ctx, std::size_t index, DType operand, const char* name) {
  if (!ctx.has_input(index)) return 0.0;
  const Tensor& zp = ctx.input(index);
  XPURT_CHECK_TYPE(zp.dtype() == operand, ctx.where(), ": '", name, "' must have dtype ", dtype_name(operand),
                   ", got ", dtype_name(zp.dtype()));
  check_scalar_param(ctx, zp, name);
  return read_scalar(zp, ctx.where());
}

float scalar_scale(const OpContext& ctx, std::size_t index, const char* name) {
  const Tensor& scale = ctx.input(index);
  check_scale_dtype(ctx, scale, name);
  check_scalar_param(ctx, scale, name);
  return static_cast<float>(read_scalar(scale, ctx.where()));
}

// com.microsoft QLinearAdd / QLinearMul: C = quantize(dequantize(A) op dequantize(B)) with NumPy broadcasting,
// per-tensor scales and zero points (absent zero points are 0), int8 or uint8, C of A's type. The dequantized
// operands and the result are float32, as ONNX Runtime computes them.
void qlinear_binary(OpContext& ctx, bool multiply) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(3);
  check_quantized_operand(ctx, a, "A");
  XPURT_CHECK_TYPE(b.dtype() == a.dtype(), ctx.where(), ": input 'B' must have the dtype of 'A' (",
                   dtype_name(a.dtype()), "), got ", dtype_name(b.dtype()));
  const float as = scalar_scale(ctx, 1, "A_scale"), bs = scalar_scale(ctx, 4, "B_scale");
  const float cs = scalar_scale(ctx, 6, "C_scale");
  const double azp = optional_zero_point(ctx, 2, a.dtype(), "A_zero_point");
  const double bzp = optional_zero_point(ctx, 5, a.dtype(), "B_zero_point");
  const double czp = optional_zero_point(ctx, 7, a.dtype(), "C_zero_point");
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), ctx.where());
  const ScratchVector<double> av = to_doubles(a), bv = to_doubles(b);
  double lo = 0, hi = 0;
  quant_range(a.dtype(), lo, hi);
  ScratchVector<double> q(static_cast<std::size_t>(numel_of(out_shape)));
  for_each_index2(out_shape, broadcast_strides(a.shape(), out_shape), broadcast_strides(b.shape(), out_shape),
                  [&](std::int64_t oa, std::int64_t ob, std::int64_t i) {
                    const float x = static_cast<float>(av[static_cast<std::size_t>(oa)] - azp) * as;
                    const float y = static_cast<float>(bv[static_cast<std::size_t>(ob)] - bzp) * bs;
                    q[static_cast<std::size_t>(i)] = quantize_value((multiply ? x * y : x + y) / cs, czp, lo, hi);
                  });
  store_doubles(ctx.allocate_output(0, out_shape, a.dtype()), q);
}

// com.microsoft QGemm: Y = alpha * a_scale * b_scale * ((A' - a_zero_point)(B' - b_zero_point) + C), A' and B'
// transposed by transA/transB, the int32 bias C broadcast to [M, N], b_scale and b_zero_point (as many values as
// b_scale, as ONNX Runtime checks) per tensor or per column [N]. Quantized with y_scale and y_zero_point when y_scale is given (y_zero_point's type, else uint8),
// float32 otherwise.
void qgemm(OpContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(3);
  check_quantized_operand(ctx, a, "A");
  check_quantized_operand(ctx, b, "B");
  XPURT_CHECK(a.dim() == 2 && b.dim() == 2, ctx.where(), ": 'A' and 'B' must be 2-D, got ", shape_str(a.shape()),
              " and ", shape_str(b.shape()));
  const bool ta = ctx.attr_int("transA", 0) != 0, tb = ctx.attr_int("transB", 0) != 0;
  const std::int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
  const std::int64_t n = tb ? b.shape()[0] : b.shape()[1], kb = tb ? b.shape()[1] : b.shape()[0];
  XPURT_CHECK(k == kb, ctx.where(), ": inner dimensions differ: A ", shape_str(a.shape()), " (transA ", ta,
              ") and B ", shape_str(b.shape()), " (transB ", tb, ")");
  const float a_scale = scalar_scale(ctx, 1, "a_scale");
  const double a_zp = optional_zero_point(ctx, 2, a.dtype(), "a_zero_point");
  const Tensor& b_scale = ctx.input(4);
  check_scale_dtype(ctx, b_scale, "b_scale");
  XPURT_CHECK(b_scale.numel() == 1 || b_scale.numel() == n, ctx.where(), ": 'b_scale' must be a scalar or hold ",
              n, " values (one per column), got shape ", shape_str(b_scale.shape()));
  const ScratchVector<float> bsc = to_floats(b_scale);
  ScratchVector<double> b_zp(1, 0.0);
  if (ctx.has_input(5)) {
    const Tensor& zp = ctx.input(5);
    XPURT_CHECK_TYPE(zp.dtype() == b.dtype(), ctx.where(), ": 'b_zero_point' must have dtype ", dtype_name(b.dtype()),
                     ", got ", dtype_name(zp.dtype()));
    XPURT_CHECK(zp.numel() == b_scale.numel(), ctx.where(), ": 'b_zero_point' must have as many values as "
                "'b_scale' (", b_scale.numel(), "), got shape ", shape_str(zp.shape()));
    b_zp = to_doubles(zp);
  }
  const ScratchVector<double> av = to_doubles(a), bv = to_doubles(b);
  // Centered [M, K] and [K, N] operands, then one int32 GEMM (wrapping, Note [Quantized arithmetic]).
  ScratchVector<std::int32_t> ac(static_cast<std::size_t>(m * k)), bc(static_cast<std::size_t>(k * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t l = 0; l < k; ++l) {
      ac[static_cast<std::size_t>(i * k + l)] =
          static_cast<std::int32_t>(av[static_cast<std::size_t>(ta ? l * m + i : i * k + l)] - a_zp);
    }
  }
  for (std::int64_t l = 0; l < k; ++l) {
    for (std::int64_t j = 0; j < n; ++j) {
      const double zp = b_zp[b_zp.size() == 1 ? 0 : static_cast<std::size_t>(j)];
      bc[static_cast<std::size_t>(l * n + j)] =
          static_cast<std::int32_t>(bv[static_cast<std::size_t>(tb ? j * k + l : l * n + j)] - zp);
    }
  }
  ScratchVector<std::int32_t> acc(static_cast<std::size_t>(m * n));
  gemm_int32(ac.data(), bc.data(), acc.data(), m, n, k);
  if (ctx.has_input(6)) {
    const Tensor& c = ctx.input(6);
    XPURT_CHECK_TYPE(c.dtype() == DType::kInt32, ctx.where(), ": 'C' must be int32, got ", dtype_name(c.dtype()));
    const auto cv = broadcast_param(ctx, c, c.shape(), Shape{m, n}, "C");
    for (std::size_t i = 0; i < acc.size(); ++i) {
      acc[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(acc[i]) +
                                         static_cast<std::uint32_t>(static_cast<std::int32_t>(cv[i])));
    }
  }
  const auto alpha = static_cast<float>(ctx.attr_float("alpha", 1.0));
  ScratchVector<double> real(acc.size());
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const float multiplier = alpha * a_scale * bsc[bsc.size() == 1 ? 0 : i % static_cast<std::size_t>(n)];
    real[i] = static_cast<double>(static_cast<float>(acc[i]) * multiplier);
  }
  if (!ctx.has_input(7)) {
    store_doubles(ctx.allocate_output(0, {m, n}, DType::kFloat32), real);
    return;
  }
  const float y_scale = scalar_scale(ctx, 7, "y_scale");
  const DType out_dtype = ctx.has_input(8) ? ctx.input(8).dtype() : DType::kUInt8;
  XPURT_CHECK_TYPE(out_dtype == DType::kInt8 || out_dtype == DType::kUInt8, ctx.where(),
                   ": 'y_zero_point' must be int8 or uint8, got ", dtype_name(out_dtype));
  const double y_zp = optional_zero_point(ctx, 8, out_dtype, "y_zero_point");
  double lo = 0, hi = 0;
  quant_range(out_dtype, lo, hi);
  ScratchVector<double> q(real.size());
  for (std::size_t i = 0; i < real.size(); ++i) {
    q[i] = quantize_value(static_cast<float>(real[i]) / y_scale, y_zp, lo, hi);
  }
  store_doubles(ctx.allocate_output(0, {m, n}, out_dtype), q);
}

// com.microsoft MatMulNBits (ONNX Runtime's contrib op; ORT's MatMul4BitsQuantizer writes it): Y = A @ W^T (+ bias)
// with W [N, K] dequantized from `bits`-bit codes in blocks of block_size along K:
//   B           uint8 [N, ceil(K / block_size), block_size * bits / 8], codes packed low bits first along K;
//   scales      [N * n_blocks] (or [N, n_blocks]), A's float type;
//   zero_points optional: uint8 packed like B, ceil(n_blocks * bits / 8) bytes per row of N, or A's float type
//               unpacked [N * n_blocks]; absent: 2^(bits - 1);
//   g_idx       optional int32 [K]: the block of each k (absent: k / block_size);
//   bias        optional [N].
// W[n, k] = (code - zero_point) * scale in float32; the products are summed in double and rounded once to float
// (accuracy_level, which lets ONNX Runtime quantize A to int8, is not followed: the reference is exact).
void matmul_nbits(OpContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor& scales = ctx.input(2);
  XPURT_CHECK_TYPE(is_float_dtype(a.dtype()), ctx.where(), ": input 'A' must be a float tensor, got ",
                   dtype_name(a.dtype()));
  check_scale_dtype(ctx, scales, "scales");
  XPURT_CHECK(ctx.has_attr("K") && ctx.has_attr("N") && ctx.has_attr("block_size"), ctx.where(),
              ": attributes K, N and block_size are required");
  const std::int64_t k = ctx.attr_int("K", 0), n = ctx.attr_int("N", 0);
  const std::int64_t bits = ctx.attr_int("bits", 4), block = ctx.attr_int("block_size", 0);
  XPURT_CHECK(bits == 2 || bits == 4 || bits == 8, ctx.where(), ": bits must be 2, 4 or 8, got ", bits);
  XPURT_CHECK(block >= 16 && (block & (block - 1)) == 0, ctx.where(),
              ": block_size must be a power of two >= 16, got ", block);
  XPURT_CHECK(k > 0 && n > 0, ctx.where(), ": K and N must be positive, got ", k, " and ", n);
  XPURT_CHECK(a.dim() >= 1 && a.shape().back() == k, ctx.where(), ": input 'A' ", shape_str(a.shape()),
              " must end in K = ", k);
  const std::int64_t blocks = (k + block - 1) / block, blob = block * bits / 8;
  XPURT_CHECK_TYPE(b.dtype() == DType::kUInt8, ctx.where(), ": input 'B' must be uint8, got ", dtype_name(b.dtype()));
  XPURT_CHECK(b.numel() == n * blocks * blob, ctx.where(), ": input 'B' ", shape_str(b.shape()), " must be [", n,
              ", ", blocks, ", ", blob, "] for K ", k, ", N ", n, ", bits ", bits, ", block_size ", block);
  XPURT_CHECK(scales.numel() == n * blocks, ctx.where(), ": 'scales' must hold N * n_blocks = ", n * blocks,
              " values, got shape ", shape_str(scales.shape()));
  const ScratchVector<float> sc = to_floats(scales);
  const auto mask = static_cast<unsigned>((1 << bits) - 1);
  // zero point of (row j, block blk)
  const std::int64_t zp_row_bytes = (blocks * bits + 7) / 8;
  ScratchVector<float> zps(static_cast<std::size_t>(n * blocks), static_cast<float>(1 << (bits - 1)));
  if (ctx.has_input(3)) {
    const Tensor& zp = ctx.input(3);
    if (zp.dtype() == DType::kUInt8) {
      XPURT_CHECK(zp.numel() == n * zp_row_bytes, ctx.where(), ": packed uint8 'zero_points' must hold ",
                  n * zp_row_bytes, " bytes (", zp_row_bytes, " per row), got shape ", shape_str(zp.shape()));
      const auto* pz = data<std::uint8_t>(zp);
      for (std::int64_t j = 0; j < n; ++j) {
        for (std::int64_t blk = 0; blk < blocks; ++blk) {
          const std::int64_t bit = blk * bits;
          const unsigned byte = pz[j * zp_row_bytes + bit / 8];
          zps[static_cast<std::size_t>(j * blocks + blk)] = static_cast<float>((byte >> (bit % 8)) & mask);
        }
      }
    } else {
      XPURT_CHECK_TYPE(zp.dtype() == scales.dtype(), ctx.where(), ": 'zero_points' must be uint8 (packed) or ",
                       dtype_name(scales.dtype()), " (the scales' type), got ", dtype_name(zp.dtype()));
      XPURT_CHECK(zp.numel() == n * blocks, ctx.where(), ": 'zero_points' of ", dtype_name(zp.dtype()),
                  " must hold ", n * blocks, " values, got shape ", shape_str(zp.shape()));
      zps = to_floats(zp);
    }
  }
  ScratchVector<std::int64_t> block_of(static_cast<std::size_t>(k));
  for (std::int64_t l = 0; l < k; ++l) block_of[static_cast<std::size_t>(l)] = l / block;
  if (ctx.has_input(4)) {
    const ScratchVector<std::int64_t> g = read_indices(ctx.input(4), ctx.where() + " input 'g_idx'");
    XPURT_CHECK(static_cast<std::int64_t>(g.size()) == k, ctx.where(), ": 'g_idx' must hold K = ", k, " values");
    for (std::int64_t l = 0; l < k; ++l) {
      const std::int64_t blk = g[static_cast<std::size_t>(l)];
      XPURT_CHECK(blk >= 0 && blk < blocks, ctx.where(), ": g_idx[", l, "] = ", blk, " is not a block in [0, ",
                  blocks, ")");
      block_of[static_cast<std::size_t>(l)] = blk;
    }
  }
  // W [N, K] dequantized.
  const auto* pb = data<std::uint8_t>(b);
  ScratchVector<float> w(static_cast<std::size_t>(n * k));
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t l = 0; l < k; ++l) {
      const std::int64_t bit = (l % block) * bits;
      const unsigned byte = pb[(j * blocks + l / block) * blob + bit / 8];
      const auto code = static_cast<float>((byte >> (bit % 8)) & mask);
      const auto p = static_cast<std::size_t>(j * blocks + block_of[static_cast<std::size_t>(l)]);
      w[static_cast<std::size_t>(j * k + l)] = (code - zps[p]) * sc[p];
    }
  }
  ScratchVector<float> bias;
  if (ctx.has_input(5)) {
    const Tensor& bt = ctx.input(5);
    XPURT_CHECK(bt.numel() == n, ctx.where(), ": 'bias' must hold N = ", n, " values, got shape ",
                shape_str(bt.shape()));
    bias = to_floats(bt);
  }
  const ScratchVector<float> av = to_floats(a);
  const std::int64_t rows = a.numel() / k;
  ScratchVector<double> y(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = av.data() + r * k;
    for (std::int64_t j = 0; j < n; ++j) {
      const float* wj = w.data() + j * k;
      double sum = 0.0;
      for (std::int64_t l = 0; l < k; ++l) sum += static_cast<double>(x[l]) * static_cast<double>(wj[l]);
      const auto value = static_cast<float>(sum);
      y[static_cast<std::size_t>(r * n + j)] =
          static_cast<double>(bias.empty() ? value : value + bias[static_cast<std::size_t>(j)]);
    }
  }
  Shape out_shape = a.shape();
  out_shape.back() = n;
  store_doubles(ctx.allocate_output(0, out_shape, a.dtype()), y);
}

// Note [ONNX Runtime's QOperator contrib ops]
// onnxruntime.quantization's QOperator format writes, around QLinearConv and QLinearMatMul, com.microsoft ops that
// take int8/uint8 tensors with per-tensor scales and zero points: QLinearSigmoid, QLinearLeakyRelu, QLinearConcat,
// QLinearGlobalAveragePool, QLinearAveragePool and QLinearSoftmax. Each value is dequantized in float32
// ((x - zero_point) * scale), the float op applied, and the result quantized: saturate(round_half_even(v / y_scale)
// + y_zero_point). ONNX Runtime computes the unary ones and Concat through a table of the 256 codes made by that same
// float arithmetic, so the bytes agree; its global average pool scales the integer sum once (x_scale / (y_scale *
// pixels), float32), as here; its softmax reads exp from a table in float32 and may differ by one step.
// QLinearAveragePool is AveragePool (average_pool, onnx_common.h: the float op's output shape, pads, auto_pad,
// ceil_mode and count_include_pad) over the dequantized values, summed and divided in double where ONNX Runtime sums
// in float32, so a value may round one step apart. One case differs by more: with ceil_mode, a last window that runs
// past the end padding counts, under count_include_pad, only its taps inside the padded input (ONNX's AveragePool,
// PyTorch and ONNX Runtime's own float AveragePool), where ONNX Runtime's QLinearAveragePool divides by the whole
// kernel. channels_last reads and writes [N, spatial..., C]; ONNX Runtime's schema has no dilations, so a node with
// them is refused.

// The quantized operand `x` (input 0) with scale/zero point at inputs 1, 2 and the output's at 3, 4 (the layout of
// QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax).
struct QuantizedUnary {
  const Tensor* x = nullptr;
  float x_scale = 1, y_scale = 1;
  double x_zero = 0, y_zero = 0, lo = 0, hi = 0;
};

QuantizedUnary quantized_unary(OpContext& ctx) {
  QuantizedUnary q;
  q.x = &ctx.input(0);
  check_quantized_operand(ctx, *q.x, "X");
  q.x_scale = scalar_scale(ctx, 1, "X_scale");
  q.x_zero = optional_zero_point(ctx, 2, q.x->dtype(), "X_zero_point");
  q.y_scale = scalar_scale(ctx, 3, "Y_scale");
  q.y_zero = optional_zero_point(ctx, 4, q.x->dtype(), "Y_zero_point");
  quant_range(q.x->dtype(), q.lo, q.hi);
  return q;
}

// QLinearSigmoid / QLinearLeakyRelu (Note [ONNX Runtime's QOperator contrib ops]): y = quantize(f(dequantize(x))).
template <typename F>
void qlinear_pointwise(OpContext& ctx, F f) {
  const QuantizedUnary q = quantized_unary(ctx);
  const ScratchVector<double> xv = to_doubles(*q.x);
  ScratchVector<double> out(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const float real = static_cast<float>(xv[i] - q.x_zero) * q.x_scale;
    out[i] = quantize_value(f(real) / q.y_scale, q.y_zero, q.lo, q.hi);
  }
  store_doubles(ctx.allocate_output(0, q.x->shape(), q.x->dtype()), out);
}

// The offset of pixel p of channel ch in image b of a [N, C, pixels...] tensor (channels_last: [N, pixels..., C]).
std::size_t pixel_offset(bool channels_last, std::int64_t b, std::int64_t ch, std::int64_t p, std::int64_t channels,
                         std::int64_t pixels) {
  return static_cast<std::size_t>(channels_last ? (b * pixels + p) * channels + ch : (b * channels + ch) * pixels + p);
}

// QLinearGlobalAveragePool: the mean over the spatial axes of [N, C, ...] (channels_last: [N, ..., C]), the output
// [N, C, 1, ...] ([N, 1, ..., C]).
void qlinear_global_average_pool(OpContext& ctx) {
  const QuantizedUnary q = quantized_unary(ctx);
  const Shape& shape = q.x->shape();
  XPURT_CHECK(shape.size() >= 3, ctx.where(), ": 'X' must have rank 3 or more, got ", shape_str(shape));
  const bool last = ctx.attr_int("channels_last", 0) != 0;
  const std::int64_t n = shape[0], c = last ? shape.back() : shape[1];
  const std::int64_t pixels = numel_of(shape) / std::max<std::int64_t>(n * c, 1);
  Shape out_shape(shape.size(), 1);
  out_shape[0] = n;
  out_shape[last ? shape.size() - 1 : 1] = c;
  const ScratchVector<double> xv = to_doubles(*q.x);
  const float scale = q.x_scale / (q.y_scale * static_cast<float>(pixels));
  ScratchVector<double> out(static_cast<std::size_t>(n * c));
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t ch = 0; ch < c; ++ch) {
      double sum = 0;  // of integers: exact
      for (std::int64_t p = 0; p < pixels; ++p) {
        sum += xv[pixel_offset(last, b, ch, p, c, pixels)];
      }
      const double centred = sum - q.x_zero * static_cast<double>(pixels);
      out[static_cast<std::size_t>(b * c + ch)] = quantize_value(static_cast<float>(centred) * scale, q.y_zero, q.lo,
                                                                 q.hi);
    }
  }
  store_doubles(ctx.allocate_output(0, out_shape, q.x->dtype()), out);
}

// QLinearAveragePool (Note [ONNX Runtime's QOperator contrib ops]): AveragePool over the dequantized
// [N, C, spatial...] (channels_last: [N, spatial..., C], the output laid out the same way).
void qlinear_average_pool(OpContext& ctx) {
  const QuantizedUnary q = quantized_unary(ctx);
  const Shape& shape = q.x->shape();
  XPURT_CHECK(shape.size() >= 3, ctx.where(), ": 'X' must be [N, C, spatial...] (channels_last: [N, spatial..., C]) ",
              "of rank 3 or more, got ", shape_str(shape));
  XPURT_CHECK(!ctx.has_attr("dilations"), ctx.where(), ": QLinearAveragePool has no 'dilations' attribute (ONNX ",
              "Runtime's schema); remove it, or dequantize and use AveragePool for a dilated pool");
  const bool last = ctx.attr_int("channels_last", 0) != 0;
  const std::int64_t n = shape[0], c = last ? shape.back() : shape[1];
  const std::int64_t images = std::max<std::int64_t>(n * c, 1);
  const std::int64_t pixels = numel_of(shape) / images;
  Shape planar = shape;  // [N, C, spatial...]
  if (last) {
    planar.pop_back();
    planar.insert(planar.begin() + 1, c);
  }
  const ScratchVector<double> xv = to_doubles(*q.x);
  ScratchVector<double> real(xv.size());
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t ch = 0; ch < c; ++ch) {
      for (std::int64_t p = 0; p < pixels; ++p) {
        const double code = xv[pixel_offset(last, b, ch, p, c, pixels)];
        real[pixel_offset(false, b, ch, p, c, pixels)] = static_cast<float>(code - q.x_zero) * q.x_scale;
      }
    }
  }
  ScratchVector<double> mean;
  Shape out_shape = average_pool(ctx, planar, real, mean);
  const std::int64_t out_pixels = numel_of(out_shape) / images;
  ScratchVector<double> out(mean.size());
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t ch = 0; ch < c; ++ch) {
      for (std::int64_t p = 0; p < out_pixels; ++p) {
        const auto value = static_cast<float>(mean[pixel_offset(false, b, ch, p, c, out_pixels)]);
        out[pixel_offset(last, b, ch, p, c, out_pixels)] = quantize_value(value / q.y_scale, q.y_zero, q.lo, q.hi);
      }
    }
  }
  if (last) {
    out_shape.erase(out_shape.begin() + 1);
    out_shape.push_back(c);
  }
  store_doubles(ctx.allocate_output(0, out_shape, q.x->dtype()), out);
}

// QLinearSoftmax: softmax along `axis` (attribute `opset` < 13: over every axis from `axis` on, as Softmax-1/11).
void qlinear_softmax(OpContext& ctx) {
  const QuantizedUnary q = quantized_unary(ctx);
  const Shape& shape = q.x->shape();
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", -1), static_cast<std::int64_t>(shape.size()),
                                           ctx.where());
  const SoftmaxLayout layout = softmax_layout(shape, axis, ctx.attr_int("opset", 13) < 13);
  const std::int64_t outer = layout.outer, len = layout.n, inner = layout.inner;
  const ScratchVector<double> xv = to_doubles(*q.x);
  ScratchVector<double> out(xv.size());
  ScratchVector<float> e(static_cast<std::size_t>(len));
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t in = 0; in < inner; ++in) {
      const auto at = [&](std::int64_t j) { return static_cast<std::size_t>((o * len + j) * inner + in); };
      double top = xv[at(0)];
      for (std::int64_t j = 1; j < len; ++j) top = std::max(top, xv[at(j)]);
      float sum = 0;
      for (std::int64_t j = 0; j < len; ++j) {
        e[static_cast<std::size_t>(j)] = std::exp(static_cast<float>(xv[at(j)] - top) * q.x_scale);
        sum += e[static_cast<std::size_t>(j)];
      }
      for (std::int64_t j = 0; j < len; ++j) {
        out[at(j)] = quantize_value(e[static_cast<std::size_t>(j)] / sum / q.y_scale, q.y_zero, q.lo, q.hi);
      }
    }
  }
  store_doubles(ctx.allocate_output(0, shape, q.x->dtype()), out);
}

// QLinearConcat: inputs Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per operand; each operand requantized
// to Y's scale and zero point (kept as it is when they are equal), then joined along `axis` as Concat joins.
void qlinear_concat(OpContext& ctx) {
  XPURT_CHECK(ctx.num_inputs() >= 5 && (ctx.num_inputs() - 2) % 3 == 0, ctx.where(),
              ": expected Y_scale, Y_zero_point and triples (X, X_scale, X_zero_point), got ", ctx.num_inputs(),
              " inputs");
  const std::size_t operands = (ctx.num_inputs() - 2) / 3;
  const Tensor& first = ctx.input(2);
  check_quantized_operand(ctx, first, "X");
  const float y_scale = scalar_scale(ctx, 0, "Y_scale");
  const double y_zero = optional_zero_point(ctx, 1, first.dtype(), "Y_zero_point");
  double lo = 0, hi = 0;
  quant_range(first.dtype(), lo, hi);
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), first.dim(), ctx.where());
  std::vector<Tensor> requantized(operands);
  std::vector<const Tensor*> inputs;
  for (std::size_t i = 0; i < operands; ++i) {
    const Tensor& x = ctx.input(2 + 3 * i);
    XPURT_CHECK_TYPE(x.dtype() == first.dtype(), ctx.where(), ": operand ", i, " must be ", dtype_name(first.dtype()),
                     ", got ", dtype_name(x.dtype()));
    const float scale = scalar_scale(ctx, 3 + 3 * i, "X_scale");
    const double zero = optional_zero_point(ctx, 4 + 3 * i, x.dtype(), "X_zero_point");
    if (scale == y_scale && zero == y_zero) {
      inputs.push_back(&x);
      continue;
    }
    ScratchVector<double> v = to_doubles(x);
    for (double& e : v) e = quantize_value(static_cast<float>(e - zero) * scale / y_scale, y_zero, lo, hi);
    requantized[i] = Tensor::empty(x.shape(), x.dtype());
    store_doubles(requantized[i], v);
    inputs.push_back(&requantized[i]);
  }
  Tensor& out = ctx.allocate_output(0, concat_shape(inputs, axis, ctx.where(), "operand"), first.dtype());
  concat_into(inputs, axis, out);
}

// ---- GatherBlockQuantized ----

// The codes of a GatherBlockQuantized operand as a row-major array of `shape` (its logical shape): uint8 with `bits` <
// 8 holds 8 / bits codes a byte along its last axis, low bits first (a row's last byte may be partly unused, as a
// zero point's row of an odd count of blocks); every other type is one code an element.
struct BlockCodes {
  const Tensor* t = nullptr;
  std::int64_t bits = 8;
  Shape shape;             // logical
  std::int64_t row_bytes = 0;  // packed: bytes a row of the last axis

  double at(std::int64_t flat) const {
    if (row_bytes == 0) return byte_value(data<std::uint8_t>(*t)[flat], t->dtype());
    const std::int64_t per = 8 / bits, cols = shape.back();
    const std::int64_t row = flat / cols, col = flat % cols;
    const unsigned byte = data<std::uint8_t>(*t)[row * row_bytes + col / per];
    return static_cast<double>((byte >> ((col % per) * bits)) & ((1u << bits) - 1));
  }
};

BlockCodes block_codes(const OpContext& ctx, const Tensor& t, std::int64_t bits, Shape logical, const char* name) {
  BlockCodes c{&t, bits, std::move(logical), 0};
  if (t.dtype() == DType::kUInt8 && bits < 8) {
    const std::int64_t cols = c.shape.empty() ? 1 : c.shape.back();
    c.row_bytes = (cols * bits + 7) / 8;
    Shape packed = c.shape;
    if (!packed.empty()) packed.back() = c.row_bytes;
    XPURT_CHECK(t.shape() == packed, ctx.where(), ": '", name, "' ", shape_str(t.shape()), " must be ",
                shape_str(packed), " (", bits, "-bit codes packed ", 8 / bits, " a byte along the last axis)");
  } else {
    XPURT_CHECK(t.shape() == c.shape, ctx.where(), ": '", name, "' has shape ", shape_str(t.shape()), ", expected ",
                shape_str(c.shape));
  }
  return c;
}

// com.microsoft GatherBlockQuantized (ONNX Runtime's contrib op: quantized embedding tables, as onnxruntime-genai's
// int4 models and MatMul4BitsQuantizer write them): Gather of `data` along gather_axis, each value dequantized with
// the scale (and zero point) of its block of block_size values along quantize_axis.
//   data        rank r: uint8 (bits 2, 4 or 8; below 8 packed along the last axis, low bits first; gather_axis 0),
//               int4/uint4, or float8 (bits ignored);
//   indices     int32/int64, any shape, values in [-s, s) along gather_axis (negative from the end); an index outside
//               that range gives zeros (the op's definition, unlike Gather);
//   scales      rank r, float32/float16/bfloat16: data's logical shape with ceil(d / block_size) along quantize_axis
//               (block_size 0, float8 only: one block); float8: a dimension of 1 on another axis broadcasts;
//   zero_points optional, data's type (uint8 packed like data): absent, 2^(bits - 1) for uint8 and 0 for int4/uint4;
//               never for float8.
// output[...] = (code - zero_point) * scale in float32, rounded to the scales' type, of shape
// data.shape[:gather_axis] + indices.shape + data.shape[gather_axis + 1:] (data's logical shape). Only the gathered
// values are dequantized.
void gather_block_quantized(OpContext& ctx) {
  const Tensor& dat = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const Tensor& scales = ctx.input(2);
  check_scale_dtype(ctx, scales, "scales");
  XPURT_CHECK_TYPE(scales.dtype() != DType::kFloat64, ctx.where(), ": 'scales' must be float32, float16 or bfloat16");
  const bool float8 = is_float8_dtype(dat.dtype());
  const std::int64_t bits = float8 ? 8 : ctx.attr_int("bits", 4);
  XPURT_CHECK_TYPE(float8 || dat.dtype() == DType::kUInt8 || is_int4_dtype(dat.dtype()), ctx.where(),
                   ": input 'data' must be uint8, int4, uint4 or a float8 type, got ", dtype_name(dat.dtype()));
  XPURT_CHECK(dat.dtype() != DType::kUInt8 || bits == 2 || bits == 4 || bits == 8, ctx.where(),
              ": bits must be 2, 4 or 8 for uint8 data, got ", bits);
  XPURT_CHECK(dat.dim() >= 1, ctx.where(), ": input 'data' must have rank >= 1");
  const auto r = static_cast<std::int64_t>(dat.dim());
  Shape logical = dat.shape();
  if (dat.dtype() == DType::kUInt8) logical.back() *= 8 / bits;
  const std::int64_t gather_axis = normalize_axis(ctx.attr_int("gather_axis", 0), r, ctx.where() + " gather_axis");
  const std::int64_t quantize_axis =
      normalize_axis(ctx.attr_int("quantize_axis", 1), r, ctx.where() + " quantize_axis");
  XPURT_CHECK(dat.dtype() != DType::kUInt8 || gather_axis == 0, ctx.where(),
              ": gather_axis must be 0 for uint8 data, got ", gather_axis);
  const std::int64_t block = ctx.attr_int("block_size", 128);
  XPURT_CHECK((block >= 16 && (block & (block - 1)) == 0) || (float8 && block == 0), ctx.where(),
              ": block_size must be a power of two >= 16", float8 ? " or 0" : "", ", got ", block);
  const std::int64_t qdim = logical[static_cast<std::size_t>(quantize_axis)];
  const std::int64_t block_len = block == 0 ? std::max<std::int64_t>(qdim, 1) : block;
  XPURT_CHECK(scales.dim() == dat.dim(), ctx.where(), ": 'scales' ", shape_str(scales.shape()),
              " must have data's rank ", r);
  for (std::int64_t a = 0; a < r; ++a) {
    const std::int64_t want = a == quantize_axis ? (qdim + block_len - 1) / block_len : logical[a];
    const std::int64_t got = scales.shape()[static_cast<std::size_t>(a)];
    XPURT_CHECK(got == want || (float8 && a != quantize_axis && got == 1), ctx.where(), ": 'scales' ",
                shape_str(scales.shape()), " must be ", want, " along axis ", a, " (data ", shape_str(logical),
                ", quantize_axis ", quantize_axis, ", block_size ", block, ")");
  }
  const BlockCodes codes = block_codes(ctx, dat, bits, logical, "data");
  std::optional<BlockCodes> zeros;
  if (ctx.has_input(3)) {
    XPURT_CHECK(!float8, ctx.where(), ": float8 data takes no 'zero_points' (its quantization is symmetric)");
    XPURT_CHECK_TYPE(ctx.input(3).dtype() == dat.dtype(), ctx.where(), ": 'zero_points' must have data's type (",
                     dtype_name(dat.dtype()), "), got ", dtype_name(ctx.input(3).dtype()));
    zeros = block_codes(ctx, ctx.input(3), bits, scales.shape(), "zero_points");
  }
  const double default_zero = dat.dtype() == DType::kUInt8 ? static_cast<double>(1 << (bits - 1)) : 0.0;
  const ScratchVector<std::int64_t> idx = read_indices(indices, ctx.where() + " input 'indices'");
  const std::int64_t outer = numel_of(Shape(logical.begin(), logical.begin() + gather_axis));
  const std::int64_t s = logical[static_cast<std::size_t>(gather_axis)];
  const std::int64_t inner = numel_of(Shape(logical.begin() + gather_axis + 1, logical.end()));
  Shape out_shape(logical.begin(), logical.begin() + gather_axis);
  out_shape.insert(out_shape.end(), indices.shape().begin(), indices.shape().end());
  out_shape.insert(out_shape.end(), logical.begin() + gather_axis + 1, logical.end());
  // Row-major strides of data's logical shape and of the scales (0 where a scale broadcasts).
  std::vector<std::int64_t> stride(static_cast<std::size_t>(r), 1), scale_stride(static_cast<std::size_t>(r), 1);
  for (std::int64_t a = r - 2; a >= 0; --a) {
    stride[a] = stride[a + 1] * logical[a + 1];
    scale_stride[a] = scale_stride[a + 1] * scales.shape()[a + 1];
  }
  const ScratchVector<float> sc = to_floats(scales);
  const auto count = static_cast<std::int64_t>(idx.size());
  ScratchVector<double> out(static_cast<std::size_t>(outer * count * inner), 0.0);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t j = 0; j < count; ++j) {
      std::int64_t row = idx[static_cast<std::size_t>(j)];
      if (row < 0) row += s;
      if (row < 0 || row >= s) continue;  // zeros
      for (std::int64_t i = 0; i < inner; ++i) {
        const std::int64_t flat = (o * s + row) * inner + i;
        std::int64_t param = 0;
        for (std::int64_t a = 0; a < r; ++a) {
          std::int64_t coord = (flat / stride[a]) % logical[a];
          if (a == quantize_axis) coord /= block_len;
          if (scales.shape()[a] == 1) coord = 0;
          param += coord * scale_stride[a];
        }
        const double zero = zeros ? zeros->at(param) : default_zero;
        const auto centered = static_cast<float>(codes.at(flat) - zero);
        out[static_cast<std::size_t>((o * count + j) * inner + i)] =
            static_cast<double>(centered * sc[static_cast<std::size_t>(param)]);
      }
    }
  }
  store_doubles(ctx.allocate_output(0, out_shape, scales.dtype()), out);
}

}  // namespace

void register_misc_quantization_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "QuantizeLinear", quantize_linear);
  kernels.add("", "DequantizeLinear", dequantize_linear);
  kernels.add("", "DynamicQuantizeLinear", dynamic_quantize_linear);
  kernels.add("", "MatMulInteger", matmul_integer);
  kernels.add("", "QLinearMatMul", qlinear_matmul);
  kernels.add("", "ConvInteger", conv_integer);
  kernels.add("", "QLinearConv", qlinear_conv);
  kernels.add("com.microsoft", "QLinearAdd", [](OpContext& ctx) { qlinear_binary(ctx, false); });
  kernels.add("com.microsoft", "QLinearMul", [](OpContext& ctx) { qlinear_binary(ctx, true); });
  kernels.add("com.microsoft", "QGemm", qgemm);
  kernels.add("com.microsoft", "QLinearSigmoid",
              [](OpContext& ctx) { qlinear_pointwise(ctx, [](float v) { return 1.0f / (1.0f + std::exp(-v)); }); });
  kernels.add("com.microsoft", "QLinearLeakyRelu", [](OpContext& ctx) {
    const auto alpha = static_cast<float>(ctx.attr_float("alpha", 0.01));
    qlinear_pointwise(ctx, [alpha](float v) { return v >= 0.0f ? v : alpha * v; });
  });
  kernels.add("com.microsoft", "QLinearGlobalAveragePool", qlinear_global_average_pool);
  kernels.add("com.microsoft", "QLinearAveragePool", qlinear_average_pool);
  kernels.add("com.microsoft", "QLinearSoftmax", qlinear_softmax);
  kernels.add("com.microsoft", "QLinearConcat", qlinear_concat);
  kernels.add("com.microsoft", "MatMulNBits", matmul_nbits);
  kernels.add("com.microsoft", "GatherBlockQuantized", gather_block_quantized);
}

}  // namespace xpuruntime::onnx_ref
