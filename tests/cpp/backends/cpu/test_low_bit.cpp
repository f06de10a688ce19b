// The storage-only dtypes (float8, int4/uint4; Note [Float8 and 4-bit dtypes] in
// src/cpp/include/xpuruntime/low_bit.h) and the cpu backend's node kernels that take them: the float8 conversions
// against a table of known values, exhaustively over all 256 bit patterns of each format and against a brute-force
// nearest-value search; int4 packing at odd lengths; QuantizeLinear/DequantizeLinear per tensor, per axis and
// blocked against references written here; Cast; com.microsoft MatMulNBits, QLinearAdd, QLinearMul and QGemm
// against naive loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/low_bit.h"
#include "xpuruntime/onnx_dtype.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
constexpr DType kFloat8Types[] = {DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2,
                                  DType::kFloat8E5M2FNUZ};
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// ---- dtypes ----

TEST(LowBitDTypes, NamesSizesAndOnnxCodes) {
  const std::pair<DType, const char*> names[] = {{DType::kFloat8E4M3FN, "float8e4m3fn"},
                                                 {DType::kFloat8E4M3FNUZ, "float8e4m3fnuz"},
                                                 {DType::kFloat8E5M2, "float8e5m2"},
                                                 {DType::kFloat8E5M2FNUZ, "float8e5m2fnuz"},
                                                 {DType::kInt4, "int4"},
                                                 {DType::kUInt4, "uint4"}};
  for (const auto& [dtype, name] : names) {
    EXPECT_EQ(dtype_name(dtype), name);
    EXPECT_EQ(dtype_from_name(name), dtype);
    EXPECT_EQ(dtype_size(dtype), 1u) << name;
    EXPECT_TRUE(is_low_bit_dtype(dtype));
  }
  EXPECT_FALSE(is_low_bit_dtype(DType::kUInt8));
  const std::pair<int, DType> codes[] = {{17, DType::kFloat8E4M3FN}, {18, DType::kFloat8E4M3FNUZ},
                                         {19, DType::kFloat8E5M2},   {20, DType::kFloat8E5M2FNUZ},
                                         {21, DType::kUInt4},        {22, DType::kInt4}};
  for (const auto& [code, dtype] : codes) {
    DType got = DType::kFloat32;
    EXPECT_TRUE(dtype_from_onnx_type(code, &got)) << code;
    EXPECT_EQ(got, dtype) << code;
  }
  DType unused;
  EXPECT_FALSE(dtype_from_onnx_type(23, &unused));  // float4e2m1
}

// ---- float8 conversions ----

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

TEST(Float8, DecodesKnownValues) {
  struct Case {
    DType dtype;
    std::uint8_t bits;
    float value;
  };
  const Case cases[] = {
      // e4m3fn: bias 7, no infinity, NaN S.1111.111
      {DType::kFloat8E4M3FN, 0x00, 0.0f},
      {DType::kFloat8E4M3FN, 0x80, -0.0f},
      {DType::kFloat8E4M3FN, 0x01, std::ldexp(1.0f, -9)},
      {DType::kFloat8E4M3FN, 0x07, 7 * std::ldexp(1.0f, -9)},
      {DType::kFloat8E4M3FN, 0x08, std::ldexp(1.0f, -6)},
      {DType::kFloat8E4M3FN, 0x38, 1.0f},
      {DType::kFloat8E4M3FN, 0x3A, 1.25f},
      {DType::kFloat8E4M3FN, 0x40, 2.0f},
      {DType::kFloat8E4M3FN, 0x7E, 448.0f},
      {DType::kFloat8E4M3FN, 0xFE, -448.0f},
      {DType::kFloat8E4M3FN, 0x7F, kNaN},
      {DType::kFloat8E4M3FN, 0xFF, kNaN},
      {DType::kFloat8E4M3FN, 0x78, 256.0f},
      // e4m3fnuz: bias 8, NaN 0x80 only
      {DType::kFloat8E4M3FNUZ, 0x00, 0.0f},
      {DType::kFloat8E4M3FNUZ, 0x80, kNaN},
      {DType::kFloat8E4M3FNUZ, 0x40, 1.0f},
      {DType::kFloat8E4M3FNUZ, 0x7F, 240.0f},
      {DType::kFloat8E4M3FNUZ, 0xFF, -240.0f},
      {DType::kFloat8E4M3FNUZ, 0x01, std::ldexp(1.0f, -10)},
      // e5m2: bias 15, infinities, NaN S.11111.{01,10,11}
      {DType::kFloat8E5M2, 0x3C, 1.0f},
      {DType::kFloat8E5M2, 0x7B, 57344.0f},
      {DType::kFloat8E5M2, 0x7C, kInf},
      {DType::kFloat8E5M2, 0xFC, -kInf},
      {DType::kFloat8E5M2, 0x7D, kNaN},
      {DType::kFloat8E5M2, 0xFF, kNaN},
      {DType::kFloat8E5M2, 0x01, std::ldexp(1.0f, -16)},
      {DType::kFloat8E5M2, 0x04, std::ldexp(1.0f, -14)},
      {DType::kFloat8E5M2, 0x80, -0.0f},
      // e5m2fnuz: bias 16, NaN 0x80 only
      {DType::kFloat8E5M2FNUZ, 0x40, 1.0f},
      {DType::kFloat8E5M2FNUZ, 0x7F, 57344.0f},
      {DType::kFloat8E5M2FNUZ, 0x80, kNaN},
      {DType::kFloat8E5M2FNUZ, 0x01, std::ldexp(1.0f, -17)},
      {DType::kFloat8E5M2FNUZ, 0x7C, 32768.0f},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(same_float(detail::float8_to_float(c.bits, c.dtype), c.value))
        << dtype_name(c.dtype) << " 0x" << std::hex << int(c.bits) << " -> "
        << detail::float8_to_float(c.bits, c.dtype);
  }
}

TEST(Float8, EncodesKnownValuesWithRoundingAndSaturation) {
  struct Case {
    DType dtype;
    double value;
    bool saturate;
    std::uint8_t bits;
  };
  const Case cases[] = {
      // ties to even: 1 + 1/16 is halfway between 1.0 (mantissa 000) and 1.125 (001)
      {DType::kFloat8E4M3FN, 1.0625, true, 0x38},
      {DType::kFloat8E4M3FN, 1.1875, true, 0x3A},
      {DType::kFloat8E4M3FN, 1.0626, true, 0x39},
      {DType::kFloat8E4M3FN, -1.1875, true, 0xBA},
      // beyond the largest finite: 448, the tie at 464 goes down to 448 (even), past it NaN without saturation
      {DType::kFloat8E4M3FN, 460.0, false, 0x7E},
      {DType::kFloat8E4M3FN, 464.0, false, 0x7E},
      {DType::kFloat8E4M3FN, 470.0, false, 0x7F},
      {DType::kFloat8E4M3FN, 470.0, true, 0x7E},
      {DType::kFloat8E4M3FN, 1e9, true, 0x7E},
      {DType::kFloat8E4M3FN, -1e9, true, 0xFE},
      {DType::kFloat8E4M3FN, kInf, true, 0x7E},
      {DType::kFloat8E4M3FN, -kInf, true, 0xFE},
      {DType::kFloat8E4M3FN, kInf, false, 0x7F},
      {DType::kFloat8E4M3FN, -kInf, false, 0xFF},
      {DType::kFloat8E4M3FN, kNaN, true, 0x7F},
      {DType::kFloat8E4M3FN, -kNaN, true, 0xFF},
      // subnormals: the smallest is 2^-9; half of it ties to 0, a bit more rounds up
      {DType::kFloat8E4M3FN, std::ldexp(1.0, -10), true, 0x00},
      {DType::kFloat8E4M3FN, std::ldexp(1.5, -10), true, 0x01},
      {DType::kFloat8E4M3FN, std::ldexp(3.0, -10), true, 0x02},
      {DType::kFloat8E4M3FN, -std::ldexp(1.0, -12), true, 0x80},
      {DType::kFloat8E4M3FN, std::ldexp(15.0, -10), true, 0x08},  // 7.5 units rounds to 8: the smallest normal
      // e4m3fnuz: no -0 and no infinity; NaN 0x80
      {DType::kFloat8E4M3FNUZ, -std::ldexp(1.0, -14), true, 0x00},
      {DType::kFloat8E4M3FNUZ, 1000.0, true, 0x7F},
      {DType::kFloat8E4M3FNUZ, -1000.0, true, 0xFF},
      {DType::kFloat8E4M3FNUZ, 1000.0, false, 0x80},
      {DType::kFloat8E4M3FNUZ, kInf, false, 0x80},
      {DType::kFloat8E4M3FNUZ, kNaN, true, 0x80},
      {DType::kFloat8E4M3FNUZ, -0.0, true, 0x00},
      // e5m2: the tie at 61440 rounds to even = infinity, so it overflows
      {DType::kFloat8E5M2, 60000.0, false, 0x7B},
      {DType::kFloat8E5M2, 61440.0, false, 0x7C},
      {DType::kFloat8E5M2, 61440.0, true, 0x7B},
      {DType::kFloat8E5M2, -1e6, false, 0xFC},
      {DType::kFloat8E5M2, kInf, true, 0x7B},
      {DType::kFloat8E5M2, kInf, false, 0x7C},
      {DType::kFloat8E5M2, -kInf, false, 0xFC},
      {DType::kFloat8E5M2, 1.125, true, 0x3C},  // tie -> 1.0
      {DType::kFloat8E5M2, 1.375, true, 0x3E},  // tie between 1.25 (01) and 1.5 (10) -> 1.5
      // e5m2fnuz
      {DType::kFloat8E5M2FNUZ, 1e6, true, 0x7F},
      {DType::kFloat8E5M2FNUZ, 1e6, false, 0x80},
      {DType::kFloat8E5M2FNUZ, -kInf, true, 0xFF},
      {DType::kFloat8E5M2FNUZ, 1.0, true, 0x40},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(int(detail::float8_from_double(c.value, c.dtype, c.saturate)), int(c.bits))
        << dtype_name(c.dtype) << " " << c.value << " saturate " << c.saturate;
  }
}

bool is_nan_code(std::uint8_t bits, DType dtype) { return std::isnan(detail::float8_to_float(bits, dtype)); }

TEST(Float8, EveryBitPatternRoundTrips) {
  for (DType dtype : kFloat8Types) {
    int nans = 0, infinities = 0;
    float previous = -1.0f;
    for (int b = 0; b < 256; ++b) {
      const auto bits = static_cast<std::uint8_t>(b);
      const float value = detail::float8_to_float(bits, dtype);
      if (std::isnan(value)) {
        ++nans;
        for (bool saturate : {true, false}) {
          EXPECT_TRUE(is_nan_code(detail::float8_from_double(value, dtype, saturate), dtype));
        }
        continue;
      }
      if (std::isinf(value)) ++infinities;
      for (bool saturate : {true, false}) {
        if (std::isinf(value) && saturate) continue;  // infinity saturates to the largest finite
        EXPECT_EQ(int(detail::float8_from_double(value, dtype, saturate)), b)
            << dtype_name(dtype) << " 0x" << std::hex << b << " = " << value << " saturate " << saturate;
      }
      if (b < 0x80 && !std::isinf(value)) {  // the positive codes increase with their values
        EXPECT_GT(value, previous) << dtype_name(dtype) << " 0x" << std::hex << b;
        previous = value;
      }
    }
    const bool fnuz = dtype == DType::kFloat8E4M3FNUZ || dtype == DType::kFloat8E5M2FNUZ;
    EXPECT_EQ(nans, fnuz ? 1 : (dtype == DType::kFloat8E5M2 ? 6 : 2)) << dtype_name(dtype);
    EXPECT_EQ(infinities, dtype == DType::kFloat8E5M2 ? 2 : 0) << dtype_name(dtype);
  }
}

// The nearest finite value by search over all codes, ties to the even code: what rounding with saturation gives.
std::uint8_t nearest_code(double x, DType dtype) {
  int best = -1;
  double best_distance = 0.0;
  for (int b = 0; b < 256; ++b) {
    const float v = detail::float8_to_float(static_cast<std::uint8_t>(b), dtype);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(static_cast<double>(v) - x);
    if (best < 0 || d < best_distance || (d == best_distance && (b & 1) == 0 && (best & 1) == 1)) {
      best = b;
      best_distance = d;
    }
  }
  return static_cast<std::uint8_t>(best);
}

TEST(Float8, RoundingMatchesANearestValueSearch) {
  std::mt19937 gen(41);
  for (DType dtype : kFloat8Types) {
    const double max = detail::float8_format(dtype).max_finite;
    std::vector<double> xs;
    // Every midpoint between neighbouring positive values (ties), and random values over the whole range.
    for (int b = 1; b < 0x7F; ++b) {
      const double lo = detail::float8_to_float(static_cast<std::uint8_t>(b), dtype);
      const double hi = detail::float8_to_float(static_cast<std::uint8_t>(b + 1), dtype);
      if (std::isfinite(hi)) xs.push_back((lo + hi) / 2);
    }
    std::uniform_real_distribution<double> exponent(-20.0, std::log2(max) + 1.0);
    for (int i = 0; i < 3000; ++i) xs.push_back(std::exp2(exponent(gen)));
    for (double x : xs) {
      for (double s : {x, -x}) {
        const std::uint8_t got = detail::float8_from_double(static_cast<float>(s), dtype, true);
        const std::uint8_t want = nearest_code(static_cast<float>(s), dtype);
        const float gv = detail::float8_to_float(got, dtype), wv = detail::float8_to_float(want, dtype);
        ASSERT_TRUE(gv == wv) << dtype_name(dtype) << " " << s << ": got 0x" << std::hex << int(got) << " want 0x"
                              << int(want);
      }
    }
  }
}

// ---- int4 ----

TEST(Int4, PacksTwoPerByteLowNibbleFirstAtOddLengths) {
  const std::vector<std::uint8_t> values = {1, 2, 3};
  std::uint8_t packed[2] = {0xAA, 0xAA};
  detail::pack_int4(values.data(), 3, packed);
  EXPECT_EQ(packed[0], 0x21);
  EXPECT_EQ(packed[1], 0x03);  // the last high nibble is 0
  const std::int8_t negatives[] = {-1, -8};
  detail::pack_int4(reinterpret_cast<const std::uint8_t*>(negatives), 2, packed);
  EXPECT_EQ(packed[0], 0x8F);
  std::mt19937 gen(7);
  for (DType dtype : {DType::kInt4, DType::kUInt4}) {
    std::uniform_int_distribution<int> dist(detail::int4_min(dtype), detail::int4_max(dtype));
    for (std::size_t n : {0u, 1u, 2u, 3u, 5u, 8u, 31u, 33u}) {
      std::vector<std::uint8_t> in(n), out(n, 0x55), bytes(detail::int4_packed_bytes(n));
      for (auto& v : in) v = static_cast<std::uint8_t>(static_cast<std::int8_t>(dist(gen)));
      detail::pack_int4(in.data(), n, bytes.data());
      detail::unpack_int4(bytes.data(), n, dtype, out.data());
      EXPECT_EQ(in, out) << dtype_name(dtype) << " n " << n;
      EXPECT_TRUE(detail::int4_in_range(out.data(), n, dtype));
    }
  }
  const std::uint8_t wide[] = {7, 8};
  std::size_t bad = 0;
  EXPECT_FALSE(detail::int4_in_range(wide, 2, DType::kInt4, &bad));
  EXPECT_EQ(bad, 1u);
  EXPECT_TRUE(detail::int4_in_range(wide, 2, DType::kUInt4));
  EXPECT_EQ(detail::int4_from_double(2.5, DType::kInt4), 2);    // ties to even
  EXPECT_EQ(detail::int4_from_double(-9.7, DType::kInt4), -8);  // saturates
  EXPECT_EQ(detail::int4_from_double(100, DType::kUInt4), 15);
  EXPECT_EQ(detail::int4_from_double(-3, DType::kUInt4), 0);
}

// ---- node kernels ----

Node make_node(const std::string& op, std::size_t inputs, Attributes attrs = {}, const std::string& domain = "") {
  Node n;
  n.name = op;
  n.op_type = op;
  n.domain = domain;
  for (std::size_t i = 0; i < inputs; ++i) n.inputs.push_back("i" + std::to_string(i));
  n.outputs.push_back("o0");
  n.attrs = std::move(attrs);
  return n;
}

Tensor floats(const Shape& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor bytes(const Shape& shape, DType dtype, const std::vector<int>& v) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::size_t i = 0; i < v.size(); ++i) p[i] = static_cast<std::uint8_t>(v[i]);
  return t;
}

std::vector<float> float_values(const Tensor& t) {
  const auto* p = static_cast<const float*>(t.data_ptr());
  return std::vector<float>(p, p + t.numel());
}

std::vector<int> byte_values(const Tensor& t) {
  std::vector<int> out;
  const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    out.push_back(t.dtype() == DType::kInt4 ? static_cast<std::int8_t>(p[i]) : p[i]);
  }
  return out;
}

std::vector<float> random_floats(std::size_t n, float lo, float hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(LowBitQdq, Float8PerTensorAndPerAxisAgainstTheConversion) {
  const std::vector<float> x = random_floats(24, -900.0f, 900.0f, 3);
  for (DType dtype : kFloat8Types) {
    // per tensor, zero point 0 of the float8 type, opset 19
    const Tensor zp = bytes({}, dtype, {0});
    const auto q = onnx_ref::run_node(make_node("QuantizeLinear", 3), 19, {floats({4, 6}, x), floats({}, {2.0f}), zp});
    ASSERT_EQ(q[0].dtype(), dtype);
    const std::vector<int> got = byte_values(q[0]);
    for (std::size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(got[i], detail::float8_from_double(x[i] / 2.0f, dtype, true)) << dtype_name(dtype) << " " << x[i];
    }
    // saturate = 0: what does not fit is NaN (or infinity for e5m2)
    Attributes no_sat;
    no_sat.set("saturate", std::int64_t{0});
    const auto q2 =
        onnx_ref::run_node(make_node("QuantizeLinear", 3, no_sat), 19, {floats({1}, {1e6f}), floats({}, {1.0f}), zp});
    EXPECT_EQ(byte_values(q2[0])[0], detail::float8_from_double(1e6, dtype, false));
    // dequantize per axis 1 (6 scales)
    const std::vector<float> scales = {1, 2, 0.5f, 4, 0.25f, 8};
    Attributes axis1;
    axis1.set("axis", std::int64_t{1});
    const auto d = onnx_ref::run_node(make_node("DequantizeLinear", 2, axis1), 19, {q[0], floats({6}, scales)});
    const std::vector<float> dv = float_values(d[0]);
    for (std::size_t i = 0; i < dv.size(); ++i) {
      EXPECT_EQ(dv[i], detail::float8_to_float(static_cast<std::uint8_t>(got[i]), dtype) * scales[i % 6]);
    }
  }
  // float8 before opset 19 is refused, naming the opset.
  try {
    onnx_ref::run_node(make_node("QuantizeLinear", 3), 13,
                       {floats({1}, {1.0f}), floats({}, {1.0f}), bytes({}, DType::kFloat8E4M3FN, {0})});
    FAIL() << "float8 at opset 13 was accepted";
  } catch (const UnsupportedOperationError& e) {
    EXPECT_NE(std::string(e.what()).find("float8 from opset 19"), std::string::npos) << e.what();
  }
}

TEST(LowBitQdq, Int4BlockedAgainstAReference) {
  // x [4, 10] quantized along axis 1 in blocks of 4 (3 blocks, the last one short), int4 and uint4.
  const std::vector<float> x = random_floats(40, -3.0f, 3.0f, 11);
  const std::vector<float> s = random_floats(12, 0.2f, 0.6f, 12);
  for (DType dtype : {DType::kInt4, DType::kUInt4}) {
    std::vector<int> zps(12);
    for (std::size_t i = 0; i < zps.size(); ++i) zps[i] = dtype == DType::kInt4 ? int(i % 5) - 2 : int(i % 7) + 4;
    Attributes a;
    a.set("axis", std::int64_t{1});
    a.set("block_size", std::int64_t{4});
    const Tensor zp = bytes({4, 3}, dtype, zps);
    const auto q =
        onnx_ref::run_node(make_node("QuantizeLinear", 3, a), 21, {floats({4, 10}, x), floats({4, 3}, s), zp});
    ASSERT_EQ(q[0].dtype(), dtype);
    const std::vector<int> got = byte_values(q[0]);
    const auto d = onnx_ref::run_node(make_node("DequantizeLinear", 3, a), 21, {q[0], floats({4, 3}, s), zp});
    const std::vector<float> dv = float_values(d[0]);
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 10; ++c) {
        const int i = r * 10 + c, p = r * 3 + c / 4;
        const double lo = dtype == DType::kInt4 ? -8 : 0, hi = dtype == DType::kInt4 ? 7 : 15;
        const double want = std::min(hi, std::max(lo, double(std::nearbyint(x[i] / s[p])) + zps[p]));
        EXPECT_EQ(got[i], want) << dtype_name(dtype) << " at " << r << "," << c;
        EXPECT_EQ(dv[i], static_cast<float>(got[i] - zps[p]) * s[p]);
      }
    }
    // output_dtype without a zero point
    Attributes b = a;
    b.set("output_dtype", std::int64_t{dtype == DType::kInt4 ? 22 : 21});
    const auto q2 = onnx_ref::run_node(make_node("QuantizeLinear", 2, b), 21, {floats({4, 10}, x), floats({4, 3}, s)});
    EXPECT_EQ(q2[0].dtype(), dtype);
  }
  // A blocked scale of the wrong shape names the dimension.
  Attributes a;
  a.set("axis", std::int64_t{1});
  a.set("block_size", std::int64_t{4});
  EXPECT_THROW(
      onnx_ref::run_node(make_node("DequantizeLinear", 2, a), 21,
                         {bytes({2, 8}, DType::kInt4, std::vector<int>(16, 1)), floats({2, 3}, {1, 1, 1, 1, 1, 1})}),
      InvalidArgumentError);
}

TEST(LowBitCast, Float8AndInt4BothWays) {
  Attributes to_e4m3;
  to_e4m3.set("to", std::int64_t{17});
  const Tensor x = floats({5}, {1.0625f, 1000.0f, -kInf, kNaN, -0.0f});
  const auto y = onnx_ref::run_node(make_node("Cast", 1, to_e4m3), 19, {x});
  EXPECT_EQ(byte_values(y[0]), (std::vector<int>{0x38, 0x7E, 0xFE, 0x7F, 0x80}));
  Attributes no_sat = to_e4m3;
  no_sat.set("saturate", std::int64_t{0});
  const auto y2 = onnx_ref::run_node(make_node("Cast", 1, no_sat), 19, {x});
  EXPECT_EQ(byte_values(y2[0]), (std::vector<int>{0x38, 0x7F, 0xFF, 0x7F, 0x80}));
  Attributes to_float;
  to_float.set("to", std::int64_t{1});
  const auto back = float_values(onnx_ref::run_node(make_node("Cast", 1, to_float), 19, {y[0]})[0]);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 448.0f);
  EXPECT_TRUE(std::isnan(back[3]));
  Attributes to_int4;
  to_int4.set("to", std::int64_t{22});
  const auto i4 = onnx_ref::run_node(make_node("Cast", 1, to_int4), 21, {floats({4}, {2.5f, -9.0f, 7.4f, -0.6f})});
  EXPECT_EQ(i4[0].dtype(), DType::kInt4);
  EXPECT_EQ(byte_values(i4[0]), (std::vector<int>{2, -8, 7, -1}));
  const auto f = float_values(onnx_ref::run_node(make_node("Cast", 1, to_float), 21, {i4[0]})[0]);
  EXPECT_EQ(f, (std::vector<float>{2, -8, 7, -1}));
  // Other kernels refuse the storage types, saying which ops take them.
  try {
    onnx_ref::run_node(make_node("Relu", 1), 19, {y[0]});
    FAIL() << "Relu took float8";
  } catch (const InvalidTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("float8e4m3fn"), std::string::npos) << e.what();
  }
}

// A MatMulNBits reference: unpack B and the zero points as written in ORT's contrib op spec, dequantize, matmul.
std::vector<float> matmul_nbits_reference(const std::vector<float>& a, std::int64_t rows, std::int64_t k,
                                          std::int64_t n, std::int64_t block, const std::vector<std::uint8_t>& b,
                                          const std::vector<float>& scales, const std::vector<std::uint8_t>* zp,
                                          const std::vector<float>& bias) {
  const std::int64_t blocks = (k + block - 1) / block, blob = block / 2, zp_row = (blocks + 1) / 2;
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t l = 0; l < k; ++l) {
      const std::int64_t blk = l / block, within = l % block;
      const std::uint8_t byte = b[static_cast<std::size_t>(j * blocks * blob + blk * blob + within / 2)];
      const int code = within % 2 == 0 ? byte & 0xF : byte >> 4;
      int zero = 8;
      if (zp != nullptr) {
        const std::uint8_t zb = (*zp)[static_cast<std::size_t>(j * zp_row + blk / 2)];
        zero = blk % 2 == 0 ? zb & 0xF : zb >> 4;
      }
      w[static_cast<std::size_t>(j * k + l)] =
          static_cast<float>(code - zero) * scales[static_cast<std::size_t>(j * blocks + blk)];
    }
  }
  std::vector<float> y(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t l = 0; l < k; ++l)
        sum += double(a[static_cast<std::size_t>(r * k + l)]) * w[static_cast<std::size_t>(j * k + l)];
      y[static_cast<std::size_t>(r * n + j)] =
          static_cast<float>(sum) + (bias.empty() ? 0.0f : bias[static_cast<std::size_t>(j)]);
    }
  }
  return y;
}

TEST(ContribQuant, MatMulNBitsAgainstDequantizeThenMatMul) {
  const std::int64_t k = 40, n = 3, block = 16, blocks = 3, blob = 8, rows = 6;  // K not a multiple of the block
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<std::uint8_t> b(static_cast<std::size_t>(n * blocks * blob)), zp(static_cast<std::size_t>(n * 2));
  for (auto& v : b) v = static_cast<std::uint8_t>(byte(gen));
  for (auto& v : zp) v = static_cast<std::uint8_t>(byte(gen));
  const std::vector<float> scales = random_floats(static_cast<std::size_t>(n * blocks), 0.01f, 0.1f, 6);
  const std::vector<float> a = random_floats(static_cast<std::size_t>(rows * k), -1.0f, 1.0f, 7);
  const std::vector<float> bias = {0.5f, -1.0f, 2.0f};
  Attributes attrs;
  attrs.set("K", k);
  attrs.set("N", n);
  attrs.set("bits", std::int64_t{4});
  attrs.set("block_size", block);
  Tensor bt = Tensor::empty({n, blocks, blob}, DType::kUInt8);
  std::memcpy(bt.data_ptr(), b.data(), b.size());
  Tensor zt = Tensor::empty({n * 2}, DType::kUInt8);
  std::memcpy(zt.data_ptr(), zp.data(), zp.size());
  // A [2, 3, K] with packed zero points and a bias; then without zero points (8) or bias.
  Node node = make_node("MatMulNBits", 6, attrs, "com.microsoft");
  node.inputs[4] = "";  // no g_idx
  const auto y = onnx_ref::run_node(
      node, 1, {floats({2, 3, k}, a), bt, floats({n * blocks}, scales), zt, Tensor(), floats({n}, bias)});
  ASSERT_EQ(y[0].shape(), (Shape{2, 3, n}));
  const auto want = matmul_nbits_reference(a, rows, k, n, block, b, scales, &zp, bias);
  const auto got = float_values(y[0]);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f * (1 + std::fabs(want[i])));
  const auto y2 = onnx_ref::run_node(make_node("MatMulNBits", 3, attrs, "com.microsoft"), 1,
                                     {floats({rows, k}, a), bt, floats({n, blocks}, scales)});
  const auto want2 = matmul_nbits_reference(a, rows, k, n, block, b, scales, nullptr, {});
  const auto got2 = float_values(y2[0]);
  for (std::size_t i = 0; i < want2.size(); ++i) EXPECT_NEAR(got2[i], want2[i], 1e-5f * (1 + std::fabs(want2[i])));
  // B of the wrong shape names the expected one.
  try {
    onnx_ref::run_node(
        make_node("MatMulNBits", 3, attrs, "com.microsoft"), 1,
        {floats({rows, k}, a), Tensor::zeros({n, blocks, 4}, DType::kUInt8), floats({n, blocks}, scales)});
    FAIL() << "a B of the wrong shape was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 3, 8]"), std::string::npos) << e.what();
  }
}

double quantize_ref(double real, double scale, double zero_point, double lo, double hi) {
  return std::min(hi, std::max(lo, std::nearbyint(static_cast<float>(real) / static_cast<float>(scale)) + zero_point));
}

TEST(ContribQuant, QLinearAddMulAndQGemmAgainstAReference) {
  // QLinearAdd / QLinearMul on uint8 with broadcasting: A [2, 3], B [3].
  const std::vector<int> av = {0, 50, 100, 150, 200, 255}, bv = {10, 128, 240};
  const float as = 0.05f, bs = 0.1f, cs = 0.2f;
  const int azp = 100, bzp = 128, czp = 90;
  for (bool mul : {false, true}) {
    const auto y =
        onnx_ref::run_node(make_node(mul ? "QLinearMul" : "QLinearAdd", 8, {}, "com.microsoft"), 1,
                           {bytes({2, 3}, DType::kUInt8, av), floats({}, {as}), bytes({}, DType::kUInt8, {azp}),
                            bytes({3}, DType::kUInt8, bv), floats({}, {bs}), bytes({}, DType::kUInt8, {bzp}),
                            floats({}, {cs}), bytes({}, DType::kUInt8, {czp})});
    const auto got = byte_values(y[0]);
    for (int i = 0; i < 6; ++i) {
      const float x = static_cast<float>(av[i] - azp) * as, z = static_cast<float>(bv[i % 3] - bzp) * bs;
      EXPECT_EQ(got[i], quantize_ref(mul ? x * z : x + z, cs, czp, 0, 255)) << (mul ? "mul " : "add ") << i;
    }
  }
  // QGemm int8, transB, per-column b_scale, int32 bias, quantized and float outputs.
  const std::vector<int> a = {1, -2, 3, 4, 5, -6}, b = {7, 8, -9, 10, 11, 12, -1, 2, 3};  // A [2, 3], B^T [3, 3]
  const std::vector<float> b_scale = {0.1f, 0.2f, 0.3f};
  const std::vector<int> c = {100, -50, 7};
  Attributes attrs;
  attrs.set("transB", std::int64_t{1});
  attrs.set("alpha", 0.5);
  std::vector<Tensor> inputs = {
      bytes({2, 3}, DType::kInt8, a),   floats({}, {0.25f}),  bytes({}, DType::kInt8, {1}),
      bytes({3, 3}, DType::kInt8, b),   floats({3}, b_scale), bytes({3}, DType::kInt8, {0, 1, -1}),
      Tensor::empty({3}, DType::kInt32)};
  std::memcpy(inputs[6].data_ptr(), c.data(), 3 * sizeof(int));
  const auto yf = float_values(onnx_ref::run_node(make_node("QGemm", 7, attrs, "com.microsoft"), 1, inputs)[0]);
  inputs.push_back(floats({}, {0.3f}));
  inputs.push_back(bytes({}, DType::kInt8, {-5}));
  const auto yq = onnx_ref::run_node(make_node("QGemm", 9, attrs, "com.microsoft"), 1, inputs);
  EXPECT_EQ(yq[0].dtype(), DType::kInt8);
  const auto q = byte_values(yq[0]);
  const int bzps[3] = {0, 1, -1};
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      std::int64_t acc = c[j];
      for (int l = 0; l < 3; ++l) acc += (a[i * 3 + l] - 1) * (b[j * 3 + l] - bzps[j]);
      const float real = static_cast<float>(acc) * (0.5f * 0.25f * b_scale[j]);
      EXPECT_FLOAT_EQ(yf[static_cast<std::size_t>(i * 3 + j)], real);
      EXPECT_EQ(static_cast<std::int8_t>(q[static_cast<std::size_t>(i * 3 + j)]),
                quantize_ref(real, 0.3, -5, -128, 127));
    }
  }
}

}  // namespace
}  // namespace xpuruntime
