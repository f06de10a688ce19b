// The ONNX reference ops of the misc group (src/cpp/backends/cpu/onnx/onnx_misc*.cpp) through
// onnx_ref::run_node: quantization, integer matmul/conv, losses, DFT/STFT/windows/MelWeightMatrix, Det,
// TfIdfVectorizer, the random generators and the training optimizers. Hand-checked cases (several from the ONNX
// backend tests' generators) plus properties on random inputs checked against naive loops written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/node_kernels.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Values = std::vector<double>;
constexpr double kPi = 3.14159265358979323846;

// float16 storage for the helpers below (converted through float).
struct Fp16 {
  std::uint16_t bits = 0;
  Fp16() = default;
  explicit Fp16(double v) : bits(detail::float_to_half(static_cast<float>(v))) {}
  explicit operator double() const { return detail::half_to_float(bits); }
};

template <typename Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(float{}); return;
    case DType::kFloat64: fn(double{}); return;
    case DType::kInt8: fn(std::int8_t{}); return;
    case DType::kUInt8: fn(std::uint8_t{}); return;
    case DType::kInt16: fn(std::int16_t{}); return;
    case DType::kInt32: fn(std::int32_t{}); return;
    case DType::kInt64: fn(std::int64_t{}); return;
    case DType::kBool: fn(bool{}); return;
    case DType::kFloat16: fn(Fp16{}); return;
    default: FAIL() << "test helper: unsupported dtype " << dtype_name(dtype);
  }
}

Tensor make(const Shape& shape, DType dtype, const Values& values) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(static_cast<std::int64_t>(values.size()), t.numel());
  with_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    for (std::size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(values[i]);
  });
  return t;
}

Tensor scalar(DType dtype, double v) { return make({}, dtype, {v}); }

Values values_of(const Tensor& t) {
  Values out(static_cast<std::size_t>(t.numel()));
  with_type(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(t.data_ptr());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(p[i]);
  });
  return out;
}

Node make_node(const std::string& op, std::size_t inputs, std::size_t outputs, Attributes attrs = {},
               const std::string& domain = "") {
  Node n;
  n.name = op;  // messages then read "Op 'Op'"
  n.op_type = op;
  n.domain = domain;
  for (std::size_t i = 0; i < inputs; ++i) n.inputs.push_back(std::string("i").append(std::to_string(i)));
  for (std::size_t i = 0; i < outputs; ++i) n.outputs.push_back(std::string("o").append(std::to_string(i)));
  n.attrs = std::move(attrs);
  return n;
}

std::vector<Tensor> run(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs) {
  return onnx_ref::run_node(node, opset, inputs);
}

void expect_values(const Tensor& t, const Values& expected, double tol = 0.0) {
  const Values got = values_of(t);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "index " << i;
    } else {
      EXPECT_NEAR(got[i], expected[i], tol + 1e-6 * std::fabs(expected[i])) << "index " << i;
    }
  }
}

Values random_values(std::size_t n, double lo, double hi, std::uint32_t seed, bool integral = false) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Values v(n);
  for (double& x : v) x = integral ? std::floor(dist(gen)) : dist(gen);
  return v;
}

// ---- QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear ------------------------------------------------

TEST(OnnxRefMisc, QuantizeLinearRoundsHalfToEvenAndSaturates) {
  // x / 2 = 0, 1, 1.5, 2.5, -0.5, 300, -300 -> round half even, + 128, saturate to [0, 255].
  const Tensor x = make({7}, DType::kFloat32, {0, 2, 3, 5, -1, 600, -600});
  const auto y = run(make_node("QuantizeLinear", 3, 1), 10,
                     {x, scalar(DType::kFloat32, 2.0), scalar(DType::kUInt8, 128)});
  EXPECT_EQ(y[0].dtype(), DType::kUInt8);
  expect_values(y[0], {128, 129, 130, 130, 128, 255, 0});
  // No zero point: uint8 with zero point 0.
  const auto y2 = run(make_node("QuantizeLinear", 2, 1), 10, {x, scalar(DType::kFloat32, 2.0)});
  expect_values(y2[0], {0, 1, 2, 2, 0, 255, 0});
  // int8 with a zero point of -1.
  const auto y3 = run(make_node("QuantizeLinear", 3, 1), 13,
                      {x, scalar(DType::kFloat32, 2.0), scalar(DType::kInt8, -1)});
  EXPECT_EQ(y3[0].dtype(), DType::kInt8);
  expect_values(y3[0], {-1, 0, 1, 1, -1, 127, -128});
}

TEST(OnnxRefMisc, QuantizeLinearPerAxisAndBlocked) {
  // x [2, 3], per-axis on axis 1 (opset 13): scales 1, 2, 4 and zero points 0, 10, 20.
  const Tensor x = make({2, 3}, DType::kFloat32, {4, 4, 4, -8, 8, 16});
  const Tensor scale = make({3}, DType::kFloat32, {1, 2, 4});
  const Tensor zp = make({3}, DType::kUInt8, {0, 10, 20});
  const auto y = run(make_node("QuantizeLinear", 3, 1), 13, {x, scale, zp});
  expect_values(y[0], {4, 12, 21, 0, 14, 24});
  // axis 0 needs 2 scales; 3 is an error naming the expected size.
  Attributes axis0;
  axis0.set("axis", std::int64_t{0});
  XPURT_EXPECT_THROW_WITH(run(make_node("QuantizeLinear", 3, 1, axis0), 13, {x, scale, zp}), InvalidArgumentError,
                          "size 2");
  // Before opset 13 the scale must be a scalar.
  XPURT_EXPECT_THROW_WITH(run(make_node("QuantizeLinear", 3, 1), 10, {x, scale, zp}), InvalidArgumentError,
                          "scalar before opset 13");
  // Blocked (opset 21): x [2, 4], axis 1, block 2 -> scale [2, 2].
  Attributes blocked;
  blocked.set("axis", std::int64_t{1}).set("block_size", std::int64_t{2});
  const Tensor xb = make({2, 4}, DType::kFloat32, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor sb = make({2, 2}, DType::kFloat32, {1, 2, 0.5, 4});
  const auto yb = run(make_node("QuantizeLinear", 2, 1, blocked), 21, {xb, sb});
  expect_values(yb[0], {1, 2, 2, 2, 10, 12, 2, 2});
  // Opset 21 output_dtype without a zero point: int16 keeps values uint8 would saturate.
  Attributes int16;
  int16.set("output_dtype", std::int64_t{5});
  const auto y16 = run(make_node("QuantizeLinear", 2, 1, int16), 21,
                       {make({2}, DType::kFloat32, {1000, -1000}), scalar(DType::kFloat32, 1)});
  EXPECT_EQ(y16[0].dtype(), DType::kInt16);
  expect_values(y16[0], {1000, -1000});
}

TEST(OnnxRefMisc, DequantizeLinearPerTensorPerAxisAndInt32) {
  const auto y =
      run(make_node("DequantizeLinear", 3, 1), 10,
          {make({4}, DType::kUInt8, {0, 3, 128, 255}), scalar(DType::kFloat32, 2), scalar(DType::kUInt8, 128)});
  EXPECT_EQ(y[0].dtype(), DType::kFloat32);
  expect_values(y[0], {-256, -250, 0, 254});
  // Per-axis on axis 1 of [1, 3, 2] (the ONNX test's layout).
  const Tensor x = make({1, 3, 2}, DType::kUInt8, {3, 89, 34, 200, 74, 59});
  const auto ya = run(make_node("DequantizeLinear", 3, 1), 13,
                      {x, make({3}, DType::kFloat32, {2, 4, 5}), make({3}, DType::kUInt8, {5, 1, 11})});
  expect_values(ya[0], {-4, 168, 132, 796, 315, 240});
  // int32 input without a zero point (bias dequantization).
  const auto yi = run(make_node("DequantizeLinear", 2, 1), 10,
                      {make({2}, DType::kInt32, {-100000, 7}), scalar(DType::kFloat32, 0.5)});
  expect_values(yi[0], {-50000, 3.5});
  // The zero point must have x's dtype.
  XPURT_EXPECT_THROW_WITH(run(make_node("DequantizeLinear", 3, 1), 10,
                              {x, scalar(DType::kFloat32, 1), scalar(DType::kInt8, 0)}),
                          InvalidTypeError, "x_zero_point");
}

TEST(OnnxRefMisc, QuantizeAndDequantizeFloat16Opset19) {
  // float16 input and scale (opset 19+): DequantizeLinear's output takes the scale's dtype.
  const auto q =
      run(make_node("QuantizeLinear", 3, 1), 19,
          {make({3}, DType::kFloat16, {-1.5, 0.25, 10}), scalar(DType::kFloat16, 0.5), scalar(DType::kInt8, 3)});
  expect_values(q[0], {0, 3, 23});  // 0.25 / 0.5 = 0.5 rounds to 0
  const auto d =
      run(make_node("DequantizeLinear", 3, 1), 19, {q[0], scalar(DType::kFloat16, 0.5), scalar(DType::kInt8, 3)});
  EXPECT_EQ(d[0].dtype(), DType::kFloat16);
  expect_values(d[0], {-1.5, 0, 10});
}

TEST(OnnxRefMisc, EmptyTensors) {
  const auto q =
      run(make_node("QuantizeLinear", 2, 1), 13, {make({0, 3}, DType::kFloat32, {}), scalar(DType::kFloat32, 1)});
  EXPECT_EQ(q[0].shape(), (Shape{0, 3}));
  EXPECT_EQ(run(make_node("Det", 1, 1), 11, {make({0, 2, 2}, DType::kFloat32, {})})[0].shape(), (Shape{0}));
  EXPECT_EQ(run(make_node("DFT", 1, 1), 17, {make({0, 4, 1}, DType::kFloat32, {})})[0].shape(), (Shape{0, 4, 2}));
  const auto mm = run(make_node("MatMulInteger", 2, 1), 10,
                      {make({0, 3}, DType::kUInt8, {}), make({3, 2}, DType::kUInt8, Values(6, 1))});
  EXPECT_EQ(mm[0].shape(), (Shape{0, 2}));
  // Zero-length inner dimension: every sum is empty.
  const auto mk = run(make_node("MatMulInteger", 2, 1), 10,
                      {make({2, 0}, DType::kUInt8, {}), make({0, 2}, DType::kUInt8, {})});
  expect_values(mk[0], {0, 0, 0, 0});
  Attributes sum;
  sum.set("reduction", std::string("sum"));
  const auto nll = run(make_node("NegativeLogLikelihoodLoss", 2, 1, sum), 13,
                       {make({0, 3}, DType::kFloat32, {}), make({0}, DType::kInt64, {})});
  expect_values(nll[0], {0});
  // mean over no element is 0 / 0.
  const auto mean = run(make_node("NegativeLogLikelihoodLoss", 2, 1), 13,
                        {make({0, 3}, DType::kFloat32, {}), make({0}, DType::kInt64, {})});
  EXPECT_TRUE(std::isnan(values_of(mean[0])[0]));
}

TEST(OnnxRefMisc, QuantizeDequantizeRoundTripWithinHalfAStep) {
  const Values xs = random_values(200, -3.0, 3.0, 7);
  const Tensor x = make({200}, DType::kFloat32, xs);
  const double scale = 6.0 / 255.0;
  const Tensor s = scalar(DType::kFloat32, scale), zp = scalar(DType::kUInt8, 128);
  const auto q = run(make_node("QuantizeLinear", 3, 1), 13, {x, s, zp});
  const auto d = run(make_node("DequantizeLinear", 3, 1), 13, {q[0], s, zp});
  const Values back = values_of(d[0]);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double clamped = std::min(std::max(xs[i], -128 * scale), 127 * scale);
    EXPECT_LE(std::fabs(back[i] - clamped), scale / 2 + 1e-6) << xs[i];
  }
}

TEST(OnnxRefMisc, DynamicQuantizeLinearMatchesOnnxFormula) {
  const Values xs{0, 2, -3, -2.5, 1.34, 0.5};
  const auto out = run(make_node("DynamicQuantizeLinear", 1, 3), 11, {make({6}, DType::kFloat32, xs)});
  const float scale = (2.0f - -3.0f) / 255.0f;
  const double zp = std::nearbyint(3.0f / scale);
  expect_values(out[1], {scale});
  expect_values(out[2], {zp});
  Values expected;
  for (double v : xs)
    expected.push_back(std::min(255.0, std::max(0.0, std::nearbyint(static_cast<float>(v) / scale) + zp)));
  expect_values(out[0], expected);
  EXPECT_EQ(out[0].dtype(), DType::kUInt8);
  // All zeros: scale 0, zero point 0, y 0 (no division by zero).
  const auto zeros = run(make_node("DynamicQuantizeLinear", 1, 3), 11, {make({3}, DType::kFloat32, {0, 0, 0})});
  expect_values(zeros[0], {0, 0, 0});
  expect_values(zeros[1], {0});
}

// ---- MatMulInteger / QLinearMatMul ----------------------------------------------------------------------------

TEST(OnnxRefMisc, MatMulIntegerMatchesNaiveLoopWithBroadcastAndPerRowZeroPoints) {
  const std::int64_t b = 2, m = 3, k = 5, n = 4;
  const Values av = random_values(static_cast<std::size_t>(b * m * k), -128, 128, 1, true);
  const Values bv = random_values(static_cast<std::size_t>(k * n), 0, 256, 2, true);
  const Values azp{-3, 0, 5}, bzp{1, 2, 3, 250};
  const auto y = run(make_node("MatMulInteger", 4, 1), 10,
                     {make({b, m, k}, DType::kInt8, av), make({k, n}, DType::kUInt8, bv),
                      make({m}, DType::kInt8, azp), make({n}, DType::kUInt8, bzp)});
  ASSERT_EQ(y[0].shape(), (Shape{b, m, n}));
  EXPECT_EQ(y[0].dtype(), DType::kInt32);
  Values expected;
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (std::int64_t l = 0; l < k; ++l)
          acc += (av[static_cast<std::size_t>((bi * m + i) * k + l)] - azp[static_cast<std::size_t>(i)]) *
                 (bv[static_cast<std::size_t>(l * n + j)] - bzp[static_cast<std::size_t>(j)]);
        expected.push_back(acc);
      }
  expect_values(y[0], expected);
  // 1-D operands are promoted and the promoted dimension dropped: [k] x [k, n] -> [n].
  const auto v = run(make_node("MatMulInteger", 2, 1), 10,
                     {make({2}, DType::kUInt8, {1, 2}), make({2, 2}, DType::kUInt8, {3, 4, 5, 6})});
  ASSERT_EQ(v[0].shape(), (Shape{2}));
  expect_values(v[0], {13, 16});
  XPURT_EXPECT_THROW_WITH(run(make_node("MatMulInteger", 2, 1), 10,
                              {make({2, 3}, DType::kUInt8, Values(6, 1)), make({2, 2}, DType::kUInt8, Values(4, 1))}),
                          InvalidArgumentError, "inner dimensions");
}

TEST(OnnxRefMisc, QLinearMatMulOnnxExample) {
  const Tensor a = make({2, 4}, DType::kUInt8, {208, 236, 0, 238, 3, 214, 255, 29});
  const Tensor b = make({4, 3}, DType::kUInt8, {152, 51, 244, 60, 26, 255, 0, 127, 246, 127, 254, 247});
  const auto y = run(make_node("QLinearMatMul", 8, 1), 10,
                     {a, make({1}, DType::kFloat32, {0.0066}), make({1}, DType::kUInt8, {113}), b,
                      make({1}, DType::kFloat32, {0.00705}), make({1}, DType::kUInt8, {114}),
                      make({1}, DType::kFloat32, {0.0107}), make({1}, DType::kUInt8, {118})});
  EXPECT_EQ(y[0].dtype(), DType::kUInt8);
  expect_values(y[0], {168, 115, 255, 1, 66, 151});
}

TEST(OnnxRefMisc, QLinearMatMulPerRowAndPerColumnScales) {
  // a [2, 2] with per-row scales, b [2, 2] with per-column scales; y = round(acc * sa[i] * sb[j] / 0.5) + 10.
  const Tensor a = make({2, 2}, DType::kInt8, {1, 2, 3, 4});
  const Tensor b = make({2, 2}, DType::kInt8, {5, 6, 7, 8});
  const auto y = run(make_node("QLinearMatMul", 8, 1), 10,
                     {a, make({2}, DType::kFloat32, {1, 0.5}), make({2}, DType::kInt8, {0, 1}), b,
                      make({2}, DType::kFloat32, {0.25, 2}), make({2}, DType::kInt8, {1, 0}),
                      scalar(DType::kFloat32, 0.5), scalar(DType::kInt8, 10)});
  EXPECT_EQ(y[0].dtype(), DType::kInt8);
  // Centered: a = [[1, 2], [2, 3]], b = [[4, 6], [6, 8]] -> acc = [[16, 22], [26, 36]].
  // 26 * 0.5 * 0.25 / 0.5 = 6.5 rounds half to even: 6.
  expect_values(y[0], {16 * 0.25 / 0.5 + 10, 22 * 2 / 0.5 + 10, 6 + 10, 36 * 0.5 * 2 / 0.5 + 10});
}

// ---- ConvInteger / QLinearConv --------------------------------------------------------------------------------

TEST(OnnxRefMisc, ConvIntegerOnnxExamplesAndNaiveGroupedConv) {
  const Tensor x = make({1, 1, 3, 3}, DType::kUInt8, {2, 3, 4, 5, 6, 7, 8, 9, 10});
  const Tensor w = make({1, 1, 2, 2}, DType::kUInt8, {1, 1, 1, 1});
  const auto y = run(make_node("ConvInteger", 3, 1), 10, {x, w, scalar(DType::kUInt8, 1)});
  ASSERT_EQ(y[0].shape(), (Shape{1, 1, 2, 2}));
  expect_values(y[0], {12, 16, 24, 28});
  Attributes pads;
  pads.set("pads", Shape{1, 1, 1, 1});
  const auto yp = run(make_node("ConvInteger", 3, 1, pads), 10, {x, w, scalar(DType::kUInt8, 1)});
  expect_values(yp[0], {1, 3, 5, 3, 5, 12, 16, 9, 11, 24, 28, 15, 7, 15, 17, 9});

  // Grouped, strided, dilated, SAME_UPPER 2-D conv with per-channel weight zero points vs a naive loop.
  const std::int64_t n = 2, c = 4, h = 6, wd = 5, m = 6, group = 2, kh = 3, kw = 2;
  const Values xv = random_values(static_cast<std::size_t>(n * c * h * wd), -128, 128, 3, true);
  const Values wv = random_values(static_cast<std::size_t>(m * (c / group) * kh * kw), -128, 128, 4, true);
  const Values wzp{1, -2, 3, 0, 5, -6};
  Attributes attrs;
  attrs.set("group", group)
      .set("strides", Shape{2, 1})
      .set("dilations", Shape{1, 2})
      .set("auto_pad", std::string("SAME_UPPER"));
  const auto yg = run(make_node("ConvInteger", 4, 1, attrs), 10,
                      {make({n, c, h, wd}, DType::kInt8, xv), make({m, c / group, kh, kw}, DType::kInt8, wv),
                       scalar(DType::kInt8, -7), make({m}, DType::kInt8, wzp)});
  const std::int64_t oh = 3, ow = 5;  // ceil(6 / 2), ceil(5 / 1)
  ASSERT_EQ(yg[0].shape(), (Shape{n, m, oh, ow}));
  // SAME_UPPER: total pad = (out - 1) * stride + (k - 1) * dilation + 1 - in; begin = total / 2.
  const std::int64_t pad_h = ((oh - 1) * 2 + (kh - 1) + 1 - h) / 2, pad_w = ((ow - 1) + (kw - 1) * 2 + 1 - wd) / 2;
  Values expected;
  for (std::int64_t ni = 0; ni < n; ++ni)
    for (std::int64_t mi = 0; mi < m; ++mi)
      for (std::int64_t y0 = 0; y0 < oh; ++y0)
        for (std::int64_t x0 = 0; x0 < ow; ++x0) {
          double acc = 0;
          const std::int64_t g = mi / (m / group);
          for (std::int64_t ci = 0; ci < c / group; ++ci)
            for (std::int64_t a = 0; a < kh; ++a)
              for (std::int64_t bb = 0; bb < kw; ++bb) {
                const std::int64_t iy = y0 * 2 - pad_h + a, ix = x0 - pad_w + bb * 2;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                const double xval =
                    xv[static_cast<std::size_t>(((ni * c + g * (c / group) + ci) * h + iy) * wd + ix)] + 7;
                const double wval = wv[static_cast<std::size_t>(((mi * (c / group) + ci) * kh + a) * kw + bb)] -
                                    wzp[static_cast<std::size_t>(mi)];
                acc += xval * wval;
              }
          expected.push_back(acc);
        }
  expect_values(yg[0], expected);

  // 1-D, VALID, uint8 without zero points: y[i] = x[2i] * 1 + x[2i + 1] * 2 + x[2i + 2] * 3.
  Attributes valid;
  valid.set("auto_pad", std::string("VALID")).set("strides", Shape{2});
  const auto y1 = run(make_node("ConvInteger", 2, 1, valid), 10,
                      {make({1, 1, 6}, DType::kUInt8, {1, 2, 3, 4, 5, 6}), make({1, 1, 3}, DType::kUInt8, {1, 2, 3})});
  ASSERT_EQ(y1[0].shape(), (Shape{1, 1, 2}));
  expect_values(y1[0], {1 + 4 + 9, 3 + 8 + 15});
}

TEST(OnnxRefMisc, QLinearConvOnnxExampleAndBias) {
  const Tensor x = make({1, 1, 7, 7}, DType::kUInt8,
                        {255, 174, 162, 25,  203, 168, 58,  15,  59,  237, 95,  129, 0,   64,  56,  242, 153,
                         221, 168, 12,  166, 232, 178, 186, 195, 237, 162, 237, 188, 39,  124, 77,  80,  102,
                         43,  127, 230, 21,  83,  41,  40,  134, 255, 154, 92,  141, 42,  148, 247});
  const std::vector<Tensor> inputs{x,
                                   scalar(DType::kFloat32, 0.00369204697),
                                   scalar(DType::kUInt8, 132),
                                   make({1, 1, 1, 1}, DType::kUInt8, {0}),
                                   make({1}, DType::kFloat32, {0.00172794575}),
                                   make({1}, DType::kUInt8, {255}),
                                   scalar(DType::kFloat32, 0.00162681262),
                                   scalar(DType::kUInt8, 123)};
  const auto y = run(make_node("QLinearConv", 8, 1), 10, inputs);
  expect_values(y[0], {0,   81,  93,  230, 52,  87,  197, 240, 196, 18,  160, 126, 255, 191, 199, 13,  102,
                       34,  87,  243, 89,  23,  77,  69,  60,  18,  93,  18,  67,  216, 131, 178, 175, 153,
                       212, 128, 25,  234, 172, 214, 215, 121, 0,   101, 163, 114, 213, 107, 8});
  // A bias adds to the int32 accumulator before requantization: with acc = (x - 132) * -255 and a bias of
  // 1000, y = round((acc + 1000) * x_scale * w_scale / y_scale) + 123.
  std::vector<Tensor> with_bias = inputs;
  with_bias.push_back(make({1}, DType::kInt32, {1000}));
  const auto yb = run(make_node("QLinearConv", 9, 1), 10, with_bias);
  const Values xs = values_of(x);
  Values expected;
  for (double v : xs) {
    const float real = static_cast<float>((v - 132) * -255 + 1000) * 0.00369204697f * 0.00172794575f;
    const double q = std::nearbyint(static_cast<double>(real / 0.00162681262f)) + 123;
    expected.push_back(std::min(255.0, std::max(0.0, q)));
  }
  expect_values(yb[0], expected);
}

// ---- losses ---------------------------------------------------------------------------------------------------

TEST(OnnxRefMisc, NegativeLogLikelihoodLossReductionsWeightsAndIgnoreIndex) {
  // input [N=2, C=3, d=2], target [2, 2].
  const Values in{-1, -2, -3, -4, -5, -6, -0.5, -1.5, -2.5, -3.5, -4.5, -5.5};
  const Tensor input = make({2, 3, 2}, DType::kFloat32, in);
  const Tensor target = make({2, 2}, DType::kInt64, {0, 2, 1, 1});
  // loss[n, d] = -input[n, target, d]: (0,0)->1, (0,1)->6, (1,0)->2.5, (1,1)->3.5.
  Attributes none;
  none.set("reduction", std::string("none"));
  const auto l0 = run(make_node("NegativeLogLikelihoodLoss", 2, 1, none), 13, {input, target});
  ASSERT_EQ(l0[0].shape(), (Shape{2, 2}));
  expect_values(l0[0], {1, 6, 2.5, 3.5});
  const auto lm = run(make_node("NegativeLogLikelihoodLoss", 2, 1), 13, {input, target});
  ASSERT_EQ(lm[0].dim(), 0);
  expect_values(lm[0], {13.0 / 4});
  Attributes sum;
  sum.set("reduction", std::string("sum"));
  expect_values(run(make_node("NegativeLogLikelihoodLoss", 2, 1, sum), 13, {input, target})[0], {13});
  // Weights [0.5, 1, 2]: weighted mean = (0.5*1 + 2*6 + 1*2.5 + 1*3.5) / (0.5 + 2 + 1 + 1).
  const Tensor weight = make({3}, DType::kFloat32, {0.5, 1, 2});
  expect_values(run(make_node("NegativeLogLikelihoodLoss", 3, 1), 13, {input, target, weight})[0],
                {(0.5 + 12 + 2.5 + 3.5) / 4.5});
  // ignore_index 1 (may also be outside [0, C)): the two class-1 elements drop out of sum and count.
  Attributes ignore;
  ignore.set("ignore_index", std::int64_t{1});
  expect_values(run(make_node("NegativeLogLikelihoodLoss", 2, 1, ignore), 13, {input, target})[0], {3.5});
  Attributes ignore_neg;
  ignore_neg.set("ignore_index", std::int64_t{-1});
  const auto li = run(make_node("NegativeLogLikelihoodLoss", 2, 1, ignore_neg), 13,
                      {input, make({2, 2}, DType::kInt64, {-1, 2, 1, -1})});
  expect_values(li[0], {(6 + 2.5) / 2});
  // A target outside [0, C) that is not ignored is an error naming it.
  XPURT_EXPECT_THROW_WITH(
      run(make_node("NegativeLogLikelihoodLoss", 2, 1), 13, {input, make({2, 2}, DType::kInt64, {0, 3, 1, 1})}),
      InvalidArgumentError, "target value 3");
}

TEST(OnnxRefMisc, SoftmaxCrossEntropyLossEqualsNllOfLogSoftmax) {
  const std::int64_t n = 3, c = 5, d1 = 2, d2 = 2;
  const Values scores = random_values(static_cast<std::size_t>(n * c * d1 * d2), -4, 4, 11);
  const Values labels{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 2, 2};
  const Values weights{0.2, 1.0, 0.7, 1.5, 0.1};
  Attributes attrs;
  attrs.set("reduction", std::string("mean")).set("ignore_index", std::int64_t{4});
  const auto out = run(make_node("SoftmaxCrossEntropyLoss", 3, 2, attrs), 13,
                       {make({n, c, d1, d2}, DType::kFloat64, scores), make({n, d1, d2}, DType::kInt32, labels),
                        make({c}, DType::kFloat64, weights)});
  ASSERT_EQ(out[1].shape(), (Shape{n, c, d1, d2}));
  const std::int64_t d = d1 * d2;
  Values log_prob(scores.size());
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < d; ++j) {
      double sum = 0;
      for (std::int64_t k = 0; k < c; ++k) sum += std::exp(scores[static_cast<std::size_t>((i * c + k) * d + j)]);
      for (std::int64_t k = 0; k < c; ++k) {
        const auto idx = static_cast<std::size_t>((i * c + k) * d + j);
        log_prob[idx] = scores[idx] - std::log(sum);
      }
      const auto label = static_cast<std::int64_t>(labels[static_cast<std::size_t>(i * d + j)]);
      if (label == 4) continue;
      const double w = weights[static_cast<std::size_t>(label)];
      num += -log_prob[static_cast<std::size_t>((i * c + label) * d + j)] * w;
      den += w;
    }
  expect_values(out[1], log_prob, 1e-12);
  expect_values(out[0], {num / den}, 1e-12);
  // Without the optional output only the loss is computed; 'none' keeps the target's shape.
  Attributes none;
  none.set("reduction", std::string("none"));
  const auto l = run(make_node("SoftmaxCrossEntropyLoss", 2, 1, none), 13,
                     {make({2, 2}, DType::kFloat32, {0, 0, 1, 3}), make({2}, DType::kInt64, {0, 1})});
  expect_values(l[0], {std::log(2.0), std::log(1 + std::exp(-2.0))}, 1e-6);
}

// ---- DFT / STFT / windows / MelWeightMatrix --------------------------------------------------------------------

std::vector<std::complex<double>> naive_dft(const std::vector<std::complex<double>>& x, bool inverse) {
  const std::size_t n = x.size();
  std::vector<std::complex<double>> y(n);
  for (std::size_t k = 0; k < n; ++k) {
    for (std::size_t j = 0; j < n; ++j) {
      const double angle = (inverse ? 2 : -2) * kPi * static_cast<double>(k * j) / static_cast<double>(n);
      y[k] += x[j] * std::complex<double>(std::cos(angle), std::sin(angle));
    }
    if (inverse) y[k] /= static_cast<double>(n);
  }
  return y;
}

TEST(OnnxRefMisc, DftRealInputKnownSpectrumOnesidedAndLength) {
  // DFT of [1, 2, 3, 4] = [10, -2+2i, -2, -2-2i].
  const Tensor x = make({1, 4, 1}, DType::kFloat32, {1, 2, 3, 4});
  const auto y = run(make_node("DFT", 1, 1), 17, {x});
  ASSERT_EQ(y[0].shape(), (Shape{1, 4, 2}));
  expect_values(y[0], {10, 0, -2, 2, -2, 0, -2, -2}, 1e-5);
  Attributes onesided;
  onesided.set("onesided", std::int64_t{1});
  const auto yo = run(make_node("DFT", 1, 1, onesided), 17, {x});
  ASSERT_EQ(yo[0].shape(), (Shape{1, 3, 2}));
  expect_values(yo[0], {10, 0, -2, 2, -2, 0}, 1e-5);
  // dft_length 6 zero-pads; 2 truncates.
  const auto y6 = run(make_node("DFT", 2, 1), 17, {x, scalar(DType::kInt64, 6)});
  ASSERT_EQ(y6[0].shape(), (Shape{1, 6, 2}));
  const auto ref6 = naive_dft({1, 2, 3, 4, 0, 0}, false);
  Values e6;
  for (const auto& v : ref6) e6.insert(e6.end(), {v.real(), v.imag()});
  expect_values(y6[0], e6, 1e-5);
  expect_values(run(make_node("DFT", 2, 1), 17, {x, scalar(DType::kInt64, 2)})[0], {3, 0, -1, 0}, 1e-5);
}

TEST(OnnxRefMisc, DftComplexAxesInverseAndOpset20AxisInput) {
  // [batch 2, 3, 5, complex]: transform over axis 2 (length 5) and axis 1 (length 3), compared with naive_dft.
  const Values v = random_values(2 * 3 * 5 * 2, -1, 1, 5);
  const Tensor x = make({2, 3, 5, 2}, DType::kFloat64, v);
  auto at = [&](std::int64_t b, std::int64_t i, std::int64_t j) {
    const auto idx = static_cast<std::size_t>(((b * 3 + i) * 5 + j) * 2);
    return std::complex<double>(v[idx], v[idx + 1]);
  };
  for (const bool inverse : {false, true}) {
    Attributes a2;
    a2.set("axis", std::int64_t{2}).set("inverse", std::int64_t{inverse ? 1 : 0});
    const Values got = values_of(run(make_node("DFT", 1, 1, a2), 17, {x})[0]);
    // Opset 20: the axis is an input (here -2, the same axis).
    Attributes inv;
    inv.set("inverse", std::int64_t{inverse ? 1 : 0});
    const Values got20 =
        values_of(run(make_node("DFT", 3, 1, inv), 20, {x, Tensor(), scalar(DType::kInt64, -2)})[0]);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < 3; ++i) {
        std::vector<std::complex<double>> row;
        for (std::int64_t j = 0; j < 5; ++j) row.push_back(at(b, i, j));
        const auto ref = naive_dft(row, inverse);
        for (std::int64_t j = 0; j < 5; ++j) {
          const auto idx = static_cast<std::size_t>(((b * 3 + i) * 5 + j) * 2);
          EXPECT_NEAR(got[idx], ref[static_cast<std::size_t>(j)].real(), 1e-12);
          EXPECT_NEAR(got[idx + 1], ref[static_cast<std::size_t>(j)].imag(), 1e-12);
          EXPECT_NEAR(got20[idx], ref[static_cast<std::size_t>(j)].real(), 1e-12);
        }
      }
  }
  // Default axis 1 (opset 17): forward then inverse gives the input back.
  const auto fwd = run(make_node("DFT", 1, 1), 17, {x});
  Attributes inverse;
  inverse.set("inverse", std::int64_t{1});
  expect_values(run(make_node("DFT", 1, 1, inverse), 17, {fwd[0]})[0], v, 1e-12);
  // Axis out of range (the last, complex dimension) and a one-sided forward transform of complex input are
  // rejected.
  Attributes bad;
  bad.set("axis", std::int64_t{3});
  XPURT_EXPECT_THROW_WITH(run(make_node("DFT", 1, 1, bad), 17, {x}), InvalidArgumentError, "axis 3");
  Attributes onesided;
  onesided.set("onesided", std::int64_t{1});
  XPURT_EXPECT_THROW_WITH(run(make_node("DFT", 1, 1, onesided), 17, {x}), InvalidArgumentError, "needs a real input");
}

TEST(OnnxRefMisc, DftMatchesDirectSumForSmoothAndPrimeLengths) {
  // The FFT's factorizations: powers of two, mixed radices, a prime, a prime square, an audio frame (400).
  for (const std::int64_t n : {1, 2, 8, 12, 30, 64, 97, 121, 400}) {
    const Values v = random_values(static_cast<std::size_t>(2 * n), -1, 1, static_cast<std::uint32_t>(n));
    std::vector<std::complex<double>> x;
    for (std::int64_t j = 0; j < n; ++j)
      x.emplace_back(v[static_cast<std::size_t>(2 * j)], v[static_cast<std::size_t>(2 * j + 1)]);
    for (const bool inverse : {false, true}) {
      Attributes a;
      a.set("inverse", std::int64_t{inverse ? 1 : 0});
      const Values got = values_of(run(make_node("DFT", 1, 1, a), 17, {make({1, n, 2}, DType::kFloat64, v)})[0]);
      const auto ref = naive_dft(x, inverse);
      for (std::int64_t k = 0; k < n; ++k) {
        EXPECT_NEAR(got[static_cast<std::size_t>(2 * k)], ref[static_cast<std::size_t>(k)].real(), 1e-9)
            << n << " " << k;
        EXPECT_NEAR(got[static_cast<std::size_t>(2 * k + 1)], ref[static_cast<std::size_t>(k)].imag(), 1e-9)
            << n << " " << k;
      }
    }
  }
}

TEST(OnnxRefMisc, DftOnesidedInverseIsIrfft) {
  // rfft then irfft gives the real signal back: even length (n = 2 * (bins - 1) by default) and odd length
  // (dft_length given), at opset 17 and, with the axis as an input, at opset 20.
  Attributes rfft;
  rfft.set("onesided", std::int64_t{1});
  Attributes irfft;
  irfft.set("onesided", std::int64_t{1}).set("inverse", std::int64_t{1});
  for (const Values& signal : {Values{1, -2, 3, 4}, Values{1, 2, -3, 4, 5}}) {
    const auto n = static_cast<std::int64_t>(signal.size());
    const Tensor x = make({1, n, 1}, DType::kFloat64, signal);
    const auto spectrum = run(make_node("DFT", 1, 1, rfft), 17, {x});
    ASSERT_EQ(spectrum[0].shape(), (Shape{1, n / 2 + 1, 2}));
    const auto back = n % 2 == 0 ? run(make_node("DFT", 1, 1, irfft), 17, {spectrum[0]})
                                 : run(make_node("DFT", 2, 1, irfft), 17, {spectrum[0], scalar(DType::kInt64, n)});
    ASSERT_EQ(back[0].shape(), (Shape{1, n, 1}));
    expect_values(back[0], signal, 1e-12);
    const auto back20 = run(make_node("DFT", 3, 1, irfft), 20,
                            {spectrum[0], scalar(DType::kInt64, n), scalar(DType::kInt64, 1)});
    expect_values(back20[0], signal, 1e-12);
  }
  // The imaginary parts of the DC and Nyquist bins cannot come from a real signal and are ignored (as numpy).
  const Tensor odd_dc = make({1, 3, 2}, DType::kFloat64, {4, 7, 0, 0, 0, 5});
  expect_values(run(make_node("DFT", 1, 1, irfft), 17, {odd_dc})[0], {1, 1, 1, 1}, 1e-12);
  // A real input is not a one-sided spectrum.
  XPURT_EXPECT_THROW_WITH(run(make_node("DFT", 1, 1, irfft), 17, {make({1, 3, 1}, DType::kFloat32, {1, 2, 3})}),
                          InvalidArgumentError, "complex one-sided spectrum");
}

TEST(OnnxRefMisc, StftFramesEqualWindowedDfts) {
  const Values sig = random_values(20, -1, 1, 9);
  const Tensor signal = make({1, 20, 1}, DType::kFloat32, sig);
  const Values window{0.1, 0.5, 1.0, 0.5, 0.1, 0.05};
  const auto y = run(make_node("STFT", 3, 1), 17,
                     {signal, scalar(DType::kInt64, 4), make({6}, DType::kFloat32, window)});
  const std::int64_t frames = (20 - 6) / 4 + 1, bins = 6 / 2 + 1;
  ASSERT_EQ(y[0].shape(), (Shape{1, frames, bins, 2}));
  const Values got = values_of(y[0]);
  for (std::int64_t f = 0; f < frames; ++f) {
    std::vector<std::complex<double>> frame;
    for (std::int64_t j = 0; j < 6; ++j) {
      frame.emplace_back(
          static_cast<float>(sig[static_cast<std::size_t>(f * 4 + j)]) * window[static_cast<std::size_t>(j)], 0);
    }
    const auto ref = naive_dft(frame, false);
    for (std::int64_t k = 0; k < bins; ++k) {
      const auto idx = static_cast<std::size_t>((f * bins + k) * 2);
      EXPECT_NEAR(got[idx], ref[static_cast<std::size_t>(k)].real(), 1e-5);
      EXPECT_NEAR(got[idx + 1], ref[static_cast<std::size_t>(k)].imag(), 1e-5);
    }
  }
  // frame_length without a window, two-sided.
  Attributes twosided;
  twosided.set("onesided", std::int64_t{0});
  const auto y2 = run(make_node("STFT", 4, 1, twosided), 17,
                      {signal, scalar(DType::kInt64, 5), Tensor(), scalar(DType::kInt64, 8)});
  ASSERT_EQ(y2[0].shape(), (Shape{1, 3, 8, 2}));
  // A complex signal, two-sided: frame 1 (samples 5..12) against the direct sum; one-sided is rejected.
  const Values csig = random_values(2 * 20, -1, 1, 10);
  const Tensor complex_signal = make({1, 20, 2}, DType::kFloat64, csig);
  const Values yc = values_of(run(make_node("STFT", 4, 1, twosided), 17,
                                  {complex_signal, scalar(DType::kInt64, 5), Tensor(), scalar(DType::kInt64, 8)})[0]);
  std::vector<std::complex<double>> frame1;
  for (std::size_t j = 5; j < 13; ++j) frame1.emplace_back(csig[2 * j], csig[2 * j + 1]);
  const auto ref1 = naive_dft(frame1, false);
  for (std::size_t k = 0; k < 8; ++k) {
    EXPECT_NEAR(yc[(8 + k) * 2], ref1[k].real(), 1e-12);
    EXPECT_NEAR(yc[(8 + k) * 2 + 1], ref1[k].imag(), 1e-12);
  }
  XPURT_EXPECT_THROW_WITH(run(make_node("STFT", 4, 1), 17,
                              {complex_signal, scalar(DType::kInt64, 5), Tensor(), scalar(DType::kInt64, 8)}),
                          InvalidArgumentError, "real signal");
  XPURT_EXPECT_THROW_WITH(
      run(make_node("STFT", 4, 1), 17,
          {signal, scalar(DType::kInt64, 4), make({6}, DType::kFloat32, window), scalar(DType::kInt64, 5)}),
      InvalidArgumentError, "frame_length 5");
}

TEST(OnnxRefMisc, CosineWindowsPeriodicSymmetricAndDtype) {
  expect_values(run(make_node("HannWindow", 1, 1), 17, {scalar(DType::kInt32, 4)})[0], {0, 0.5, 1, 0.5}, 1e-7);
  Attributes symmetric;
  symmetric.set("periodic", std::int64_t{0});
  expect_values(run(make_node("HannWindow", 1, 1, symmetric), 17, {scalar(DType::kInt64, 5)})[0], {0, 0.5, 1, 0.5, 0},
                1e-7);
  const double a0 = 25.0 / 46.0, a1 = 21.0 / 46.0;
  expect_values(run(make_node("HammingWindow", 1, 1), 17, {scalar(DType::kInt32, 4)})[0],
                {a0 - a1, a0, a0 + a1, a0}, 1e-7);
  Attributes dbl;
  dbl.set("output_datatype", std::int64_t{11});
  const auto b = run(make_node("BlackmanWindow", 1, 1, dbl), 17, {scalar(DType::kInt32, 4)});
  EXPECT_EQ(b[0].dtype(), DType::kFloat64);
  // 0.42 - 0.5 cos(2 pi n / 4) + 0.08 cos(4 pi n / 4).
  expect_values(b[0], {0.0, 0.34, 1.0, 0.34}, 1e-12);
}

TEST(OnnxRefMisc, MelWeightMatrixOnnxExample) {
  const auto y = run(make_node("MelWeightMatrix", 5, 1), 17,
                     {scalar(DType::kInt32, 8), scalar(DType::kInt32, 16), scalar(DType::kInt32, 8192),
                      scalar(DType::kFloat32, 0), scalar(DType::kFloat32, 4096)});
  ASSERT_EQ(y[0].shape(), (Shape{9, 8}));
  Values expected(72, 0.0);
  // Row, column of the ones in the ONNX example's expected matrix.
  for (const auto& [r, c] :
       std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 2}, {1, 3}, {2, 4}, {3, 5}, {4, 6}, {5, 7}}) {
    expected[static_cast<std::size_t>(r * 8 + c)] = 1.0;
  }
  expect_values(y[0], expected);
}

// ---- Det ------------------------------------------------------------------------------------------------------

TEST(OnnxRefMisc, DetBatchedWithPivotingAndSingular) {
  // [[1,2],[3,4]] -> -2; a 3x3 that needs a row swap -> det computed by cofactors; singular -> 0.
  const Tensor x = make({3, 3, 3}, DType::kFloat64,
                        {1, 2, 0, 3, 4, 0, 0, 0, 1,   // -2
                         0, 2, 1, 1, 0, 3, 4, 1, 0,   // 0*(0-3) - 2*(0-12) + 1*(1-0) = 25
                         1, 2, 3, 2, 4, 6, 7, 8, 9}); // 0
  const auto y = run(make_node("Det", 1, 1), 11, {x});
  ASSERT_EQ(y[0].shape(), (Shape{3}));
  expect_values(y[0], {-2, 25, 0}, 1e-12);
  const auto y2 = run(make_node("Det", 1, 1), 11, {make({2, 2}, DType::kFloat32, {2, 1, 1, 3})});
  ASSERT_EQ(y2[0].dim(), 0);
  expect_values(y2[0], {5}, 1e-6);
  XPURT_EXPECT_THROW_WITH(run(make_node("Det", 1, 1), 11, {make({2, 3}, DType::kFloat32, Values(6, 1))}),
                          InvalidArgumentError, "[*, M, M]");
}

// ---- TfIdfVectorizer ------------------------------------------------------------------------------------------

Attributes tfidf_attrs(std::int64_t min_gram, std::int64_t max_gram, std::int64_t skip, const std::string& mode) {
  Attributes a;
  a.set("mode", mode).set("min_gram_length", min_gram).set("max_gram_length", max_gram).set("max_skip_count", skip);
  a.set("ngram_counts", Shape{0, 4}).set("ngram_indexes", Shape{0, 1, 2, 3, 4, 5, 6});
  a.set("pool_int64s", Shape{2, 3, 5, 4, 5, 6, 7, 8, 6, 7});
  return a;
}

TEST(OnnxRefMisc, TfIdfVectorizerOnnxExamples) {
  const Tensor x = make({12}, DType::kInt32, {1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8});
  expect_values(run(make_node("TfIdfVectorizer", 1, 1, tfidf_attrs(2, 2, 0, "TF")), 9, {x})[0], {0, 0, 0, 0, 1, 1, 1});
  expect_values(run(make_node("TfIdfVectorizer", 1, 1, tfidf_attrs(2, 2, 5, "TF")), 9, {x})[0], {0, 0, 0, 0, 1, 3, 1});
  expect_values(run(make_node("TfIdfVectorizer", 1, 1, tfidf_attrs(1, 2, 5, "TF")), 9, {x})[0], {0, 3, 1, 0, 1, 3, 1});
  const Tensor xb = make({2, 6}, DType::kInt64, {1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8});
  const auto yb = run(make_node("TfIdfVectorizer", 1, 1, tfidf_attrs(2, 2, 5, "TF")), 9, {xb});
  ASSERT_EQ(yb[0].shape(), (Shape{2, 7}));
  expect_values(yb[0], {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1});
  // IDF / TFIDF with weights.
  Attributes idf = tfidf_attrs(1, 2, 5, "IDF");
  idf.set("weights", std::vector<double>{1, 2, 3, 4, 5, 6, 7});
  expect_values(run(make_node("TfIdfVectorizer", 1, 1, idf), 9, {x})[0], {0, 2, 3, 0, 5, 6, 7});
  Attributes tfidf = tfidf_attrs(1, 2, 5, "TFIDF");
  tfidf.set("weights", std::vector<double>{1, 2, 3, 4, 5, 6, 7});
  expect_values(run(make_node("TfIdfVectorizer", 1, 1, tfidf), 9, {x})[0], {0, 6, 3, 0, 5, 18, 7});
  Node strings = make_node("TfIdfVectorizer", 1, 1, tfidf_attrs(1, 2, 0, "TF"));
  strings.string_list_attrs["pool_strings"] = {"a", "b"};
  EXPECT_THROW(run(strings, 9, {x}), UnsupportedOperationError);
}

// ---- random ---------------------------------------------------------------------------------------------------

TEST(OnnxRefMisc, RandomOpsSeededRangesAndMoments) {
  Attributes uniform;
  uniform.set("shape", Shape{100, 50}).set("low", -2.0).set("high", 3.0).set("seed", 5.0);
  const Values u1 = values_of(run(make_node("RandomUniform", 0, 1, uniform), 1, {})[0]);
  const Values u2 = values_of(run(make_node("RandomUniform", 0, 1, uniform), 1, {})[0]);
  EXPECT_EQ(u1, u2);  // same seed, same values
  double mean = 0;
  for (double v : u1) {
    EXPECT_GE(v, -2.0);
    EXPECT_LT(v, 3.0);
    mean += v / static_cast<double>(u1.size());
  }
  EXPECT_NEAR(mean, 0.5, 0.1);
  Attributes normal;
  normal.set("shape", Shape{5000}).set("mean", 1.0).set("scale", 2.0).set("dtype", std::int64_t{11}).set("seed", 1.0);
  const auto n = run(make_node("RandomNormal", 0, 1, normal), 1, {});
  EXPECT_EQ(n[0].dtype(), DType::kFloat64);
  const Values nv = values_of(n[0]);
  const double m = std::accumulate(nv.begin(), nv.end(), 0.0) / 5000;
  double var = 0;
  for (double v : nv) var += (v - m) * (v - m) / 5000;
  EXPECT_NEAR(m, 1.0, 0.15);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.15);
  // *Like: the input's shape and dtype; a different seed gives different values.
  Attributes like;
  like.set("seed", 6.0);
  const auto l = run(make_node("RandomUniformLike", 1, 1, like), 1, {make({3, 4}, DType::kFloat64, Values(12, 0))});
  EXPECT_EQ(l[0].shape(), (Shape{3, 4}));
  EXPECT_EQ(l[0].dtype(), DType::kFloat64);
  EXPECT_EQ(run(make_node("RandomNormalLike", 1, 1), 1, {make({7}, DType::kFloat32, Values(7, 0))})[0].numel(), 7);
  XPURT_EXPECT_THROW_WITH(run(make_node("RandomNormalLike", 1, 1), 1, {make({2}, DType::kInt32, {0, 0})}),
                          InvalidTypeError, "dtype");
}

TEST(OnnxRefMisc, BernoulliExtremesAndFrequency) {
  Attributes seeded;
  seeded.set("seed", 3.0);
  const auto y = run(make_node("Bernoulli", 1, 1, seeded), 15, {make({4}, DType::kFloat64, {0, 1, 0, 1})});
  EXPECT_EQ(y[0].dtype(), DType::kFloat64);
  expect_values(y[0], {0, 1, 0, 1});
  Attributes as_bool;
  as_bool.set("dtype", std::int64_t{9});
  const auto b = run(make_node("Bernoulli", 1, 1, as_bool), 15, {make({4000}, DType::kFloat32, Values(4000, 0.25))});
  EXPECT_EQ(b[0].dtype(), DType::kBool);
  const Values bv = values_of(b[0]);
  EXPECT_NEAR(std::accumulate(bv.begin(), bv.end(), 0.0) / 4000, 0.25, 0.03);
  XPURT_EXPECT_THROW_WITH(run(make_node("Bernoulli", 1, 1), 15, {make({1}, DType::kFloat32, {1.5})}),
                          InvalidArgumentError, "outside [0, 1]");
}

// ---- ai.onnx.preview.training ---------------------------------------------------------------------------------

constexpr const char* kTraining = "ai.onnx.preview.training";

TEST(OnnxRefMisc, AdagradTwoVariables) {
  Attributes a;
  a.set("norm_coefficient", 0.001).set("epsilon", 1e-5).set("decay_factor", 0.1);
  const auto out = run(make_node("Adagrad", 8, 4, a, kTraining), 1,
                       {scalar(DType::kFloat32, 0.1), scalar(DType::kInt64, 1), make({1}, DType::kFloat32, {1.0}),
                        make({2}, DType::kFloat32, {1.0, 2.0}), make({1}, DType::kFloat32, {-1.0}),
                        make({2}, DType::kFloat32, {-1.0, -3.0}), make({1}, DType::kFloat32, {2.0}),
                        make({2}, DType::kFloat32, {4.0, 1.0})});
  auto step = [](double x, double g, double h, Values& x_new, Values& h_new) {
    const double r = 0.1 / (1 + 1 * 0.1), gr = 0.001 * x + g, hn = h + gr * gr;
    x_new.push_back(x - r * gr / (std::sqrt(hn) + 1e-5));
    h_new.push_back(hn);
  };
  Values x1, h1, x2, h2;
  step(1.0, -1.0, 2.0, x1, h1);
  step(1.0, -1.0, 4.0, x2, h2);
  step(2.0, -3.0, 1.0, x2, h2);
  expect_values(out[0], x1, 1e-6);
  expect_values(out[1], x2, 1e-6);
  expect_values(out[2], h1, 1e-6);
  expect_values(out[3], h2, 1e-6);
}

TEST(OnnxRefMisc, MomentumStandardAndNesterov) {
  for (const std::string mode : {"standard", "nesterov"}) {
    Attributes a;
    a.set("norm_coefficient", 0.001).set("alpha", 0.95).set("beta", 0.1).set("mode", mode);
    for (const std::int64_t t : {0, 3}) {
      const auto out =
          run(make_node("Momentum", 5, 2, a, kTraining), 1,
              {scalar(DType::kFloat64, 0.1), scalar(DType::kInt64, t), make({2}, DType::kFloat64, {1.2, 2.8}),
               make({2}, DType::kFloat64, {-0.94, -2.5}), make({2}, DType::kFloat64, {1.7, 3.6})});
      Values xs{1.2, 2.8}, gs{-0.94, -2.5}, vs{1.7, 3.6}, x_new, v_new;
      for (std::size_t i = 0; i < 2; ++i) {
        const double gr = 0.001 * xs[i] + gs[i], beta = t > 0 ? 0.1 : 1.0;
        const double v = 0.95 * vs[i] + beta * gr;
        v_new.push_back(v);
        x_new.push_back(mode == "standard" ? xs[i] - 0.1 * v : xs[i] - 0.1 * (gr + 0.95 * v));
      }
      expect_values(out[0], x_new, 1e-12);
      expect_values(out[1], v_new, 1e-12);
    }
  }
  // Momentum's attributes are required.
  XPURT_EXPECT_THROW_WITH(run(make_node("Momentum", 5, 2, {}, kTraining), 1,
                              {scalar(DType::kFloat32, 0.1), scalar(DType::kInt64, 0), make({1}, DType::kFloat32, {1}),
                               make({1}, DType::kFloat32, {1}), make({1}, DType::kFloat32, {1})}),
                          InvalidArgumentError, "alpha");
}

TEST(OnnxRefMisc, AdamWithBiasCorrection) {
  Attributes a;
  a.set("norm_coefficient", 0.001).set("alpha", 0.95).set("beta", 0.1).set("epsilon", 1e-7)
      .set("norm_coefficient_post", 0.01);
  const auto out = run(make_node("Adam", 6, 3, a, kTraining), 1,
                       {scalar(DType::kFloat64, 0.1), scalar(DType::kInt64, 2), make({2}, DType::kFloat64, {1.2, 2.8}),
                        make({2}, DType::kFloat64, {-0.94, -2.5}), make({2}, DType::kFloat64, {1.7, 3.6}),
                        make({2}, DType::kFloat64, {0.1, 0.1})});
  Values xs{1.2, 2.8}, gs{-0.94, -2.5}, vs{1.7, 3.6}, hs{0.1, 0.1}, x_new, v_new, h_new;
  const double r = 0.1 * std::sqrt(1 - 0.1 * 0.1) / (1 - 0.95 * 0.95);
  for (std::size_t i = 0; i < 2; ++i) {
    const double gr = 0.001 * xs[i] + gs[i];
    const double v = 0.95 * vs[i] + 0.05 * gr, h = 0.1 * hs[i] + 0.9 * gr * gr;
    v_new.push_back(v);
    h_new.push_back(h);
    x_new.push_back(0.99 * (xs[i] - r * v / (std::sqrt(h) + 1e-7)));
  }
  expect_values(out[0], x_new, 1e-12);
  expect_values(out[1], v_new, 1e-12);
  expect_values(out[2], h_new, 1e-12);
}

TEST(OnnxRefMisc, OptimizerDefaultsFollowTheSchema) {
  // Adam without attributes: alpha 0.9, beta 0.999, epsilon 1e-6 (float32 values), no norm coefficients; T = 0
  // means no bias correction.
  const auto out = run(make_node("Adam", 6, 3, {}, kTraining), 1,
                       {scalar(DType::kFloat64, 0.5), scalar(DType::kInt64, 0), make({1}, DType::kFloat64, {1.0}),
                        make({1}, DType::kFloat64, {2.0}), make({1}, DType::kFloat64, {0.0}),
                        make({1}, DType::kFloat64, {0.0})});
  const double alpha = 0.9f, beta = 0.999f, eps = 1e-6f;
  const double v = (1 - alpha) * 2.0, h = (1 - beta) * 4.0;
  expect_values(out[0], {1.0 - 0.5 * v / (std::sqrt(h) + eps)}, 1e-12);
  // Adagrad without attributes: epsilon 1e-6, no decay.
  const auto ag = run(make_node("Adagrad", 5, 2, {}, kTraining), 1,
                      {scalar(DType::kFloat64, 0.5), scalar(DType::kInt64, 7), make({1}, DType::kFloat64, {1.0}),
                       make({1}, DType::kFloat64, {2.0}), make({1}, DType::kFloat64, {0.0})});
  expect_values(ag[0], {1.0 - 0.5 * 2.0 / (2.0 + eps)}, 1e-12);
}

}  // namespace
}  // namespace xpuruntime
