// quantize_linear, dequantize_linear and dynamic_quantize_linear (Note [Quantize registry ops] in
// core/quantize_ops.h) through the functional API with the kernel pinned, against the ONNX node kernels
// (backends/cpu/onnx/onnx_misc_quant.cpp) on the same inputs, bit for bit: every case runs on the cpu kernel here and
// on the cuda_raw kernel where a GPU is present (skipped otherwise). Random inputs at odd shapes, per tensor and per
// axis on several axes, every float dtype on the float side and every quantized dtype, with and without zero points,
// both saturate modes for float8, the values ONNX treats specially (ties, NaN of either sign, infinities, -0,
// overflow), and a sweep of float32 bit patterns through each float8 conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/node_kernels.h"
#include "core/shape_str.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/low_bit.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Bytes = std::vector<std::uint8_t>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

const DType kRealDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const DType kQuantizedDtypes[] = {DType::kInt8,           DType::kUInt8,       DType::kInt4,
                                  DType::kUInt4,          DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ,
                                  DType::kFloat8E5M2,     DType::kFloat8E5M2FNUZ};

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

// ONNX's TensorProto element type of a quantized dtype (QuantizeLinear's output_dtype attribute).
std::int64_t onnx_type(DType d) {
  switch (d) {
    case DType::kInt8: return 3;
    case DType::kUInt8: return 2;
    case DType::kFloat8E4M3FN: return 17;
    case DType::kFloat8E4M3FNUZ: return 18;
    case DType::kFloat8E5M2: return 19;
    case DType::kFloat8E5M2FNUZ: return 20;
    case DType::kUInt4: return 21;
    case DType::kInt4: return 22;
    default: ADD_FAILURE() << "onnx_type of " << dtype_name(d); return 0;
  }
}

Bytes bytes_of(const Tensor& tensor) {
  const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  Bytes bytes(host.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), host.data_ptr(), bytes.size());
  return bytes;
}

// A float32/float16/bfloat16 tensor of `values` (rounded to nearest even for the 16-bit dtypes).
Tensor reals(const Shape& shape, DType dtype, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(static_cast<std::int64_t>(values.size()), t.numel());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat32) {
      static_cast<float*>(t.data_ptr())[i] = values[i];
    } else {
      static_cast<std::uint16_t*>(t.data_ptr())[i] =
          dtype == DType::kFloat16 ? detail::float_to_half(values[i]) : detail::float_to_bfloat16(values[i]);
    }
  }
  return t;
}

Tensor from_bytes(const Shape& shape, DType dtype, const Bytes& bytes) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(t.nbytes(), bytes.size());
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Random values of quantized (or int32) `dtype` as bytes: integers in their range, float8 any of the 256 codes
// (`finite_only`: the finite ones, as a zero point is).
Bytes random_quantized(std::int64_t n, DType dtype, std::mt19937& gen, bool finite_only = false) {
  Bytes bytes(static_cast<std::size_t>(n) * dtype_size(dtype));
  if (dtype == DType::kInt32) {
    std::uniform_int_distribution<std::int32_t> dist(-100000, 100000);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int32_t v = dist(gen);
      std::memcpy(bytes.data() + i * 4, &v, 4);
    }
    return bytes;
  }
  for (auto& b : bytes) {
    if (dtype == DType::kInt4) {
      b = static_cast<std::uint8_t>(static_cast<std::int8_t>(static_cast<int>(gen() % 16) - 8));
    } else if (dtype == DType::kUInt4) {
      b = static_cast<std::uint8_t>(gen() % 16);
    } else {
      b = static_cast<std::uint8_t>(gen() & 0xFFu);
      while (finite_only && is_float8_dtype(dtype) && !std::isfinite(detail::float8_to_float(b, dtype))) {
        b = static_cast<std::uint8_t>(gen() & 0xFFu);
      }
    }
  }
  return bytes;
}

Node make_node(const std::string& op, std::size_t inputs, std::size_t outputs, Attributes attrs = {}) {
  Node n;
  n.name = op;
  n.op_type = op;
  for (std::size_t i = 0; i < inputs; ++i) n.inputs.push_back("i" + std::to_string(i));
  for (std::size_t i = 0; i < outputs; ++i) n.outputs.push_back("o" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

// Two outputs agree bit for bit, except that any NaN matches any NaN when `nan_any` (a float output: the GPU's
// arithmetic does not keep a NaN's sign or payload).
void expect_same(const Tensor& got, const Tensor& expected, const std::string& what, bool nan_any = false) {
  ASSERT_EQ(got.dtype(), expected.dtype()) << what;
  ASSERT_EQ(got.shape(), expected.shape()) << what;
  const Bytes a = bytes_of(got), b = bytes_of(expected);
  const std::size_t size = dtype_size(got.dtype());
  int reported = 0;
  for (std::size_t i = 0; i < a.size() / size; ++i) {
    if (std::memcmp(a.data() + i * size, b.data() + i * size, size) == 0) continue;
    if (nan_any && got.dtype() == DType::kFloat32) {
      float x, y;
      std::memcpy(&x, a.data() + i * size, 4);
      std::memcpy(&y, b.data() + i * size, 4);
      if (std::isnan(x) && std::isnan(y)) continue;
    }
    if (nan_any && size == 2) {  // float16 / bfloat16: exponent all ones and a nonzero mantissa
      std::uint16_t x, y;
      std::memcpy(&x, a.data() + i * size, 2);
      std::memcpy(&y, b.data() + i * size, 2);
      const std::uint16_t exp_mask = got.dtype() == DType::kFloat16 ? 0x7C00 : 0x7F80;
      const auto is_nan = [&](std::uint16_t v) { return (v & exp_mask) == exp_mask && (v & ~exp_mask & 0x7FFF) != 0; };
      if (is_nan(x) && is_nan(y)) continue;
    }
    ADD_FAILURE() << what << ": element " << i << " differs (got byte 0x" << std::hex << +a[i * size] << ", expected 0x"
                  << +b[i * size] << std::dec << ")";
    if (++reported == 5) return;
  }
}

class QuantizeOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda()) XPURT_SKIP_WITHOUT_GPU();
  }
  bool cuda() const { return GetParam() == "cuda_raw"; }

  // Runs `op` with its kernel pinned to the backend under test; outputs come back on the CPU.
  std::vector<Tensor> call(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs) {
    KernelPolicy policy;
    policy.set(op, "pin:" + GetParam());
    ops::CallOptions options;
    options.kernel_policy = &policy;
    std::vector<Tensor> placed;
    for (const auto& input : inputs) placed.push_back(cuda() && input.defined() ? input.to(Device::cuda(0)) : input);
    std::vector<Tensor> outputs = ops::call(op, placed, attrs, options);
    for (auto& output : outputs) {
      EXPECT_EQ(output.device(), cuda() ? Device::cuda(0) : Device::cpu());
      output = output.to(Device::cpu());
    }
    return outputs;
  }

  // quantize_linear of x against the node kernel (opset 21, which takes every dtype here).
  void expect_quantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, DType out, std::int64_t axis,
                       int saturate, const std::string& what) {
    Attributes node_attrs;
    node_attrs.set("axis", axis).set("saturate", std::int64_t{saturate});
    if (!zero_point.defined()) node_attrs.set("output_dtype", onnx_type(out));
    const std::vector<Tensor> node_inputs =
        zero_point.defined() ? std::vector<Tensor>{x, scale, zero_point} : std::vector<Tensor>{x, scale};
    const Tensor expected =
        onnx_ref::run_node(make_node("QuantizeLinear", node_inputs.size(), 1, node_attrs), 21, node_inputs).at(0);
    Attributes attrs;
    attrs.set("axis", axis).set("saturate", std::int64_t{saturate}).set("output_dtype", std::string(dtype_name(out)));
    const Tensor got = call("quantize_linear", {x, scale, zero_point}, attrs).at(0);
    expect_same(got, expected, what);
  }

  void expect_dequantize(const Tensor& x, const Tensor& scale, const Tensor& zero_point, std::int64_t axis,
                         const std::string& what) {
    Attributes attrs;
    attrs.set("axis", axis);
    const std::vector<Tensor> node_inputs =
        zero_point.defined() ? std::vector<Tensor>{x, scale, zero_point} : std::vector<Tensor>{x, scale};
    const Tensor expected =
        onnx_ref::run_node(make_node("DequantizeLinear", node_inputs.size(), 1, attrs), 21, node_inputs).at(0);
    const Tensor got = call("dequantize_linear", {x, scale, zero_point}, attrs).at(0);
    expect_same(got, expected, what, /*nan_any=*/true);
  }
};

// Values for quantizing to `dtype` with scales near `scale`: most in and around the representable range (a few past
// it), some exact ties of the integer grid, and the special values at fixed places.
std::vector<float> quantize_inputs(std::int64_t n, DType dtype, float scale, std::mt19937& gen) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-14, 10);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (is_float8_dtype(dtype)) {  // spread over the float8 exponents, past the largest value and into subnormals
      v[i] = unit(gen) * std::ldexp(scale, octave(gen) + (dtype == DType::kFloat8E4M3FN ? 0 : 6));
    } else if (i % 7 == 3) {  // a tie: k + 0.5 steps
      v[i] = (static_cast<float>(static_cast<int>(gen() % 40)) - 20.5f) * scale;
    } else {
      v[i] = unit(gen) * 300.0f * scale;
    }
  }
  const float specials[] = {kNaN, -kNaN, kInf, -kInf, -0.0f, 0.0f, 1e30f, -1e30f};
  for (std::size_t k = 0; k < sizeof(specials) / sizeof(specials[0]) && k * 11 < v.size(); ++k) {
    v[k * 11] = specials[k];
  }
  return v;
}

struct Geometry {
  Shape x;
  std::int64_t axis;  // -99: per tensor

  // How many scales: x.shape[axis] per axis, else 1.
  std::int64_t params() const {
    if (axis == -99) return 1;
    const auto rank = static_cast<std::int64_t>(x.size());
    return x[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)];
  }
};

const Geometry kGeometries[] = {{{37}, -99},       {{3, 5, 7}, -99}, {{3, 5, 7}, 0},   {{3, 5, 7}, 1},
                                {{3, 5, 7}, -1},   {{2, 1, 9, 4}, 2}, {{1029}, 0},     {{4, 2, 131}, 1},
                                {{0, 3}, 1},       {{}, -99}};

std::vector<float> random_scales(std::int64_t count, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(0.01f, 0.2f);
  std::vector<float> s(static_cast<std::size_t>(count));
  for (float& v : s) v = dist(gen);
  return s;
}

TEST_P(QuantizeOps, QuantizeMatchesTheNodeKernel) {
  std::mt19937 gen(7);
  for (const Geometry& g : kGeometries) {
    const bool per_axis = g.axis != -99;
    const std::int64_t axis = per_axis ? g.axis : 1;
    const std::int64_t count = g.params();
    const Shape param_shape = per_axis ? Shape{count} : Shape{};
    for (const DType real : kRealDtypes) {
      for (const DType out : kQuantizedDtypes) {
        for (const bool with_zero_point : {false, true}) {
          for (const int saturate : {1, 0}) {
            if (saturate == 0 && !is_float8_dtype(out)) continue;
            const std::vector<float> scales = random_scales(count, gen);
            const Tensor x = reals(g.x, real, quantize_inputs(numel_of(g.x), out, scales[0], gen));
            const Tensor scale = reals(param_shape, real, scales);
            Tensor zero_point;
            if (with_zero_point) zero_point = from_bytes(param_shape, out, random_quantized(count, out, gen, true));
            expect_quantize(x, scale, zero_point, out, axis, saturate,
                            detail::str_cat("quantize ", detail::shape_str(g.x, ","), " axis ", g.axis, " ",
                                            dtype_name(real), " -> ", dtype_name(out), with_zero_point ? " zp" : "",
                                            " saturate ", saturate));
          }
        }
      }
    }
  }
}

// One scale and zero point for the whole tensor (Note [Per-tensor quantization without a division] on the GPU): random
// float bit patterns (NaN, infinities, subnormals, zeros of both signs) and values around the integer grid, with
// scales whose reciprocal is normal and ones whose is not (1e38) or that are not normal (2e-39), every integer
// output type, with and without a zero point, and a length with a tail past the 16-byte vectors.
TEST_P(QuantizeOps, PerTensorQuantizeOnBitPatterns) {
  std::mt19937 gen(23);
  const std::int64_t n = (1 << 14) + 13;
  for (const float s : {0.05f, 3.7e-5f, 7.0f, 1e38f, 2e-39f}) {
    std::vector<float> values(static_cast<std::size_t>(n));
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (i % 3 == 0) {
        const std::uint32_t bits = static_cast<std::uint32_t>(gen());
        std::memcpy(&values[i], &bits, 4);
      } else if (i % 3 == 1) {
        values[i] = (static_cast<float>(static_cast<int>(gen() % 600)) - 300.5f) * s;  // ties of the grid
      } else {
        values[i] = unit(gen) * 200.0f * s;
      }
    }
    for (const DType real : kRealDtypes) {
      const Tensor x = reals({n}, real, values);
      const Tensor scale = reals({}, real, {s});
      for (const DType out : {DType::kInt8, DType::kUInt8, DType::kInt4, DType::kUInt4}) {
        expect_quantize(x, scale, {}, out, 1, 1,
                        detail::str_cat("per tensor ", dtype_name(real), " -> ", dtype_name(out), " scale ", s));
        const Tensor zp = from_bytes({}, out, random_quantized(1, out, gen, true));
        expect_quantize(x, scale, zp, out, 1, 1,
                        detail::str_cat("per tensor ", dtype_name(real), " -> ", dtype_name(out), " zp, scale ", s));
      }
    }
  }
}

// A float32 scale with float16 x (the node kernel and the registry op take any float scale).
TEST_P(QuantizeOps, QuantizeTakesAScaleOfAnotherFloatDtype) {
  std::mt19937 gen(11);
  const std::vector<float> scales = random_scales(5, gen);
  const Tensor x = reals({3, 5, 2}, DType::kFloat16, quantize_inputs(30, DType::kInt8, scales[0], gen));
  expect_quantize(x, reals({5}, DType::kFloat32, scales), {}, DType::kInt8, 1, 1, "float16 x, float32 scale");
  expect_quantize(x, reals({5}, DType::kBFloat16, scales), {}, DType::kFloat8E4M3FN, 1, 1, "bfloat16 scale");
}

// Every float8 conversion on float32 bit patterns: each exponent and sign with the mantissas that decide a rounding
// (ties, one past, one short), then random patterns; scale 1.
TEST_P(QuantizeOps, Float8ConversionsMatchOnBitPatternSweeps) {
  std::vector<float> values;
  for (std::uint32_t sign = 0; sign < 2; ++sign) {
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (std::uint32_t top = 0; top < 32; ++top) {
        for (const std::uint32_t low : {0u, 1u, 0x3FFFFu}) {
          const std::uint32_t bits = (sign << 31) | (exponent << 23) | (top << 18) | low;
          float f;
          std::memcpy(&f, &bits, 4);
          values.push_back(f);
        }
      }
    }
  }
  std::mt19937 gen(3);
  while (values.size() < (1u << 18)) {
    const std::uint32_t bits = static_cast<std::uint32_t>(gen());
    float f;
    std::memcpy(&f, &bits, 4);
    values.push_back(f);
  }
  const auto n = static_cast<std::int64_t>(values.size());
  const Tensor x = reals({n}, DType::kFloat32, values);
  const Tensor one = reals({}, DType::kFloat32, {1.0f});
  for (const DType out : {DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2, DType::kFloat8E5M2FNUZ}) {
    for (const int saturate : {1, 0}) {
      expect_quantize(x, one, {}, out, 1, saturate,
                      detail::str_cat("sweep -> ", dtype_name(out), " saturate ", saturate));
    }
    // A nonzero zero point: the sum in double, rounded once.
    const Tensor zp = from_bytes({}, out, {0x21});
    expect_quantize(x, one, zp, out, 1, 1, detail::str_cat("sweep -> ", dtype_name(out), " with zero point"));
  }
}

TEST_P(QuantizeOps, DequantizeMatchesTheNodeKernel) {
  std::mt19937 gen(13);
  for (const Geometry& g : kGeometries) {
    const bool per_axis = g.axis != -99;
    const std::int64_t axis = per_axis ? g.axis : 1;
    const std::int64_t count = g.params();
    const Shape param_shape = per_axis ? Shape{count} : Shape{};
    std::vector<DType> inputs(std::begin(kQuantizedDtypes), std::end(kQuantizedDtypes));
    inputs.push_back(DType::kInt32);
    for (const DType real : kRealDtypes) {
      for (const DType in : inputs) {
        for (const bool with_zero_point : {false, true}) {
          const Tensor x = from_bytes(g.x, in, random_quantized(numel_of(g.x), in, gen));
          const Tensor scale = reals(param_shape, real, random_scales(count, gen));
          Tensor zero_point;
          if (with_zero_point) zero_point = from_bytes(param_shape, in, random_quantized(count, in, gen, true));
          expect_dequantize(x, scale, zero_point, axis,
                            detail::str_cat("dequantize ", detail::shape_str(g.x, ","), " axis ", g.axis, " ",
                                            dtype_name(in), " -> ", dtype_name(real), with_zero_point ? " zp" : ""));
        }
      }
    }
  }
}

TEST_P(QuantizeOps, DynamicQuantizeMatchesTheNodeKernel) {
  std::mt19937 gen(17);
  const Shape shapes[] = {{1}, {7}, {3, 5, 7}, {1029}, {4, 1000, 33}, {0, 4}};
  for (const Shape& shape : shapes) {
    for (const int sign : {0, 1, -1}) {  // both signs, positive only (x_min = 0), negative only (x_max = 0)
      std::uniform_real_distribution<float> dist(sign > 0 ? 0.0f : -3.0f, sign < 0 ? 0.0f : 5.0f);
      std::vector<float> values(static_cast<std::size_t>(numel_of(shape)));
      for (float& v : values) v = dist(gen);
      const Tensor x = reals(shape, DType::kFloat32, values);
      const std::vector<Tensor> expected = onnx_ref::run_node(make_node("DynamicQuantizeLinear", 1, 3), 11, {x});
      const std::vector<Tensor> got = call("dynamic_quantize_linear", {x}, {});
      ASSERT_EQ(got.size(), 3u);
      const std::string what = detail::str_cat("dynamic ", detail::shape_str(shape, ","), " sign ", sign);
      for (std::size_t k = 0; k < 3; ++k) expect_same(got[k], expected[k], what + " output " + std::to_string(k));
    }
  }
  // Zeros of both signs: scale +0, zero point 0, y 0 (over many blocks on the GPU).
  std::vector<float> zero_values(100000, 0.0f);
  for (std::size_t i = 0; i < zero_values.size(); i += 3) zero_values[i] = -0.0f;
  const Tensor zeros = reals({100000}, DType::kFloat32, zero_values);
  const std::vector<Tensor> got = call("dynamic_quantize_linear", {zeros}, {});
  const std::vector<Tensor> expected = onnx_ref::run_node(make_node("DynamicQuantizeLinear", 1, 3), 11, {zeros});
  for (std::size_t k = 0; k < 3; ++k) expect_same(got[k], expected[k], "signed zeros, output " + std::to_string(k));
}

// The node kernel raises on a non-finite x, and so does the cpu kernel; the cuda_raw kernel cannot without a host
// synchronization and says so through its outputs (quantize.h): y_scale not finite, y and the zero point 0.
TEST_P(QuantizeOps, DynamicQuantizeOfNonFiniteValues) {
  for (const float bad : {kNaN, kInf, -kInf}) {
    const Tensor x = reals({6}, DType::kFloat32, {1.0f, -2.0f, bad, 3.0f, 0.5f, -0.25f});
    if (!cuda()) {
      XPURT_EXPECT_THROW_WITH(call("dynamic_quantize_linear", {x}, {}), InvalidArgumentError, "non-finite value");
      continue;
    }
    const std::vector<Tensor> got = call("dynamic_quantize_linear", {x}, {});
    EXPECT_FALSE(std::isfinite(*static_cast<const float*>(got[1].data_ptr())));
    EXPECT_EQ(bytes_of(got[0]), Bytes(6, 0));
    EXPECT_EQ(bytes_of(got[2]), Bytes(1, 0));
  }
}

// The registry ops' typed errors (the schemas, the same on every backend).
TEST_P(QuantizeOps, SchemasNameWhatIsWrong) {
  const Tensor x = reals({2, 3}, DType::kFloat32, {1, 2, 3, 4, 5, 6});
  const Tensor scale3 = reals({3}, DType::kFloat32, {1, 1, 1});
  const Tensor scale4 = reals({4}, DType::kFloat32, {1, 1, 1, 1});
  Attributes axis1;
  axis1.set("axis", std::int64_t{1});
  XPURT_EXPECT_THROW_WITH(call("quantize_linear", {x, scale4, {}}, axis1), InvalidArgumentError, "shape [3]");
  XPURT_EXPECT_THROW_WITH(call("quantize_linear", {x, reals({2, 3}, DType::kFloat32, {1, 1, 1, 1, 1, 1}), {}}, axis1),
                          InvalidArgumentError, "blocked scales");
  Attributes int16;
  int16.set("output_dtype", std::string("int16"));
  XPURT_EXPECT_THROW_WITH(call("quantize_linear", {x, scale3, {}}, int16), InvalidTypeError, "int16/uint16");
  const Tensor zp8 = from_bytes({3}, DType::kInt8, Bytes(3, 0));
  Attributes uint8_out;
  uint8_out.set("output_dtype", std::string("uint8"));
  XPURT_EXPECT_THROW_WITH(call("quantize_linear", {x, scale3, zp8}, uint8_out), InvalidTypeError,
                          "output_dtype is uint8 but 'zero_point' is int8");
  XPURT_EXPECT_THROW_WITH(call("dequantize_linear", {x, scale3, {}}, axis1), InvalidTypeError, "input 'x' must be");
  XPURT_EXPECT_THROW_WITH(call("dynamic_quantize_linear", {reals({2}, DType::kFloat16, {1, 2})}, {}), InvalidTypeError,
                          "must be float32");
}

INSTANTIATE_TEST_SUITE_P(Backends, QuantizeOps, ::testing::Values(std::string("cpu"), std::string("cuda_raw")),
                         [](const ::testing::TestParamInfo<std::string>& backend) { return backend.param; });

}  // namespace
}  // namespace xpuruntime
