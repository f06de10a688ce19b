// Tests of the ONNX reference ops, elementwise group (src/cpp/backends/cpu/onnx/onnx_elementwise.cpp): each
// test builds a Node by hand, runs it through onnx_ref::run_node and checks values computed independently
// (hand-checked cases, and naive per-element references on random inputs for the broadcasting loops).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/tensor.h"

// The library's headers are internal (src/cpp, not on the tests' include path); its entry points are exported.
#include "core/half.h"
#include "core/node_kernels.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

template <typename T>
DType dtype_of();
template <>
DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
DType dtype_of<std::int8_t>() {
  return DType::kInt8;
}
template <>
DType dtype_of<std::uint8_t>() {
  return DType::kUInt8;
}
template <>
DType dtype_of<std::int16_t>() {
  return DType::kInt16;
}
template <>
DType dtype_of<std::int32_t>() {
  return DType::kInt32;
}
template <>
DType dtype_of<std::int64_t>() {
  return DType::kInt64;
}
template <>
DType dtype_of<bool>() {
  return DType::kBool;
}

template <typename T>
Tensor make(const Shape& shape, const std::vector<T>& values) {
  Tensor t = Tensor::empty(shape, dtype_of<T>());
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  auto* p = static_cast<T*>(t.data_ptr());
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

Tensor make_half(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat16);
  auto* p = static_cast<std::uint16_t*>(t.data_ptr());
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = detail::float_to_half(values[i]);
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  EXPECT_EQ(t.dtype(), dtype_of<T>()) << t.str();
  const auto* p = static_cast<const T*>(t.data_ptr());
  return std::vector<T>(p, p + t.numel());
}

std::vector<float> half_values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kFloat16);
  const auto* p = static_cast<const std::uint16_t*>(t.data_ptr());
  std::vector<float> out;
  for (std::int64_t i = 0; i < t.numel(); ++i) out.push_back(detail::half_to_float(p[i]));
  return out;
}

std::vector<float> random_floats(std::int64_t n, unsigned seed, float low = -3.0f, float high = 3.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

Node make_node(const std::string& op, std::size_t num_inputs, std::size_t num_outputs = 1, Attributes attrs = {}) {
  Node node;
  node.name = "n0";
  node.op_type = op;
  // Appended rather than "x" + to_string(i): GCC 12 reports a false -Wrestrict on the latter at -O3.
  for (std::size_t i = 0; i < num_inputs; ++i) node.inputs.push_back(std::string("x").append(std::to_string(i)));
  for (std::size_t i = 0; i < num_outputs; ++i) node.outputs.push_back(std::string("y").append(std::to_string(i)));
  node.attrs = std::move(attrs);
  return node;
}

// Runs `op` at `opset` and returns output 0.
Tensor run1(const std::string& op, std::int64_t opset, const std::vector<Tensor>& inputs, Attributes attrs = {}) {
  Node node = make_node(op, inputs.size(), 1, std::move(attrs));
  std::vector<Tensor> outputs = onnx_ref::run_node(node, opset, inputs);
  EXPECT_EQ(outputs.size(), 1u);
  return outputs.at(0);
}

// Naive broadcasting reference: the element of `shape` at the output's multi-index.
std::int64_t broadcast_offset(const Shape& shape, const Shape& out, std::int64_t linear) {
  std::int64_t offset = 0, stride = 1;
  for (std::size_t i = out.size(); i-- > 0;) {
    const std::int64_t index = linear % out[i];
    linear /= out[i];
    const std::size_t rank_gap = out.size() - shape.size();
    if (i >= rank_gap) {
      const std::int64_t dim = shape[i - rank_gap];
      if (dim != 1) offset += index * stride;
      stride *= dim;
    }
  }
  return offset;
}

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  return n;
}

// ---- arithmetic and broadcasting ----

TEST(OnnxRefElementwise, EveryOpOfTheGroupIsRegistered) {
  const char* ops[] = {"Add",
                       "Sub",
                       "Mul",
                       "Div",
                       "Pow",
                       "Mod",
                       "Neg",
                       "Abs",
                       "Sqrt",
                       "Exp",
                       "Log",
                       "Reciprocal",
                       "Ceil",
                       "Floor",
                       "Round",
                       "Sign",
                       "Sin",
                       "Cos",
                       "Tan",
                       "Asin",
                       "Acos",
                       "Atan",
                       "Sinh",
                       "Cosh",
                       "Asinh",
                       "Acosh",
                       "Atanh",
                       "Erf",
                       "Relu",
                       "LeakyRelu",
                       "Elu",
                       "Selu",
                       "Celu",
                       "PRelu",
                       "Sigmoid",
                       "HardSigmoid",
                       "HardSwish",
                       "Softplus",
                       "Softsign",
                       "Tanh",
                       "ThresholdedRelu",
                       "Shrink",
                       "Mish",
                       "Gelu",
                       "Clip",
                       "Min",
                       "Max",
                       "Mean",
                       "Sum",
                       "Equal",
                       "Greater",
                       "GreaterOrEqual",
                       "Less",
                       "LessOrEqual",
                       "And",
                       "Or",
                       "Xor",
                       "Not",
                       "BitShift",
                       "BitwiseAnd",
                       "BitwiseOr",
                       "BitwiseXor",
                       "BitwiseNot",
                       "IsNaN",
                       "IsInf",
                       "Where",
                       "Cast",
                       "CastLike",
                       "Identity",
                       "Dropout",
                       "Softmax",
                       "LogSoftmax",
                       "Hardmax"};
  for (const char* op : ops) EXPECT_NE(KernelRegistry::global().find_node_kernel("", op), nullptr) << op;
  EXPECT_NE(KernelRegistry::global().find_node_kernel("ai.onnx", "Add"), nullptr);
}

// Note [Node kernels]: the reference implementations are kernels of the cpu backend in the one KernelRegistry, keyed
// by (domain, op_type), listed sorted, one per key; run_node finds them there and names an op that has none.
TEST(OnnxRefElementwise, ReferenceOpsAreNodeKernelsOfTheCpuBackend) {
  const std::vector<const NodeKernelInfo*> all = KernelRegistry::global().node_kernels();
  ASSERT_GT(all.size(), 150u);
  for (std::size_t k = 0; k < all.size(); ++k) {
    EXPECT_EQ(all[k]->name, "onnx_ref") << all[k]->key();
    EXPECT_EQ(all[k]->backend, "cpu") << all[k]->key();
    EXPECT_TRUE(static_cast<bool>(all[k]->run)) << all[k]->key();
    if (k > 0) {
      EXPECT_LT(all[k - 1]->key(), all[k]->key());
    }
  }
  const NodeKernelInfo* add = KernelRegistry::global().find_node_kernel("", "Add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->key(), "Add");
  EXPECT_EQ(KernelRegistry::global().find_node_kernel("ai.onnx", "Add"), add);
  const NodeKernelInfo* adam = KernelRegistry::global().find_node_kernel("ai.onnx.preview.training", "Adam");
  ASSERT_NE(adam, nullptr);
  EXPECT_EQ(adam->key(), "ai.onnx.preview.training:Adam");
  EXPECT_EQ(KernelRegistry::global().find_node_kernel("", "Adam"), nullptr);
  EXPECT_NE(KernelRegistry::global().find_node_kernel(kXpurtDomain, "FusedConv"), nullptr);  // the passes' nodes
  EXPECT_TRUE(onnx_ref::has_node_kernel("ai.onnx", "Relu"));
  EXPECT_FALSE(onnx_ref::has_node_kernel("", "NoSuchOp"));

  Node node;
  node.op_type = "NoSuchOp";
  node.name = "n";
  node.outputs = {"y"};
  XPURT_EXPECT_THROW_WITH(onnx_ref::run_node(node, 17, {}), UnsupportedOperationError,
                          "no CPU implementation of the ONNX op NoSuchOp (node 'n')");

  // A registry of its own: what is added is found under its normalised domain; a second kernel of a key is refused.
  KernelRegistry registry;
  NodeKernelInfo info;
  info.domain = "ai.onnx";
  info.op_type = "Twice";
  info.run = [](const Node&, std::int64_t, const std::vector<Value>& inputs, const ValueLookup&) { return inputs; };
  registry.add_node_kernel(info);
  ASSERT_NE(registry.find_node_kernel("", "Twice"), nullptr);
  EXPECT_EQ(registry.find_node_kernel("", "Twice")->domain, "");
  XPURT_EXPECT_THROW_WITH(registry.add_node_kernel(info), XpuRuntimeError, "ONNX op registered twice: Twice");
}

TEST(OnnxRefElementwise, BinaryBroadcastingMatchesNaiveReference) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}}, {{2, 3, 4}, {3, 1}},          {{2, 1, 4}, {3, 1}},
      {{1}, {5, 2}},          {{}, {2, 3}},     {{4, 1, 3, 1}, {1, 5, 1, 2}}, {{2, 3, 4, 5}, {1, 3, 1, 1}},
      {{3, 1, 5}, {1, 4, 1}}};
  unsigned seed = 1;
  for (const auto& [sa, sb] : cases) {
    Shape out(std::max(sa.size(), sb.size()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::int64_t da = i < out.size() - sa.size() ? 1 : sa[i - (out.size() - sa.size())];
      const std::int64_t db = i < out.size() - sb.size() ? 1 : sb[i - (out.size() - sb.size())];
      out[i] = std::max(da, db);
    }
    const auto a = random_floats(numel(sa), seed++);
    const auto b = random_floats(numel(sb), seed++);
    for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
      const Tensor y = run1(op, 14, {make(sa, a), make(sb, b)});
      ASSERT_EQ(y.shape(), out) << op;
      const auto got = values_of<float>(y);
      for (std::int64_t i = 0; i < numel(out); ++i) {
        const float x = a[static_cast<std::size_t>(broadcast_offset(sa, out, i))];
        const float z = b[static_cast<std::size_t>(broadcast_offset(sb, out, i))];
        const float want = std::string(op) == "Add"   ? x + z
                           : std::string(op) == "Sub" ? x - z
                           : std::string(op) == "Mul" ? x * z
                                                      : x / z;
        ASSERT_FLOAT_EQ(got[static_cast<std::size_t>(i)], want) << op << " element " << i;
      }
    }
  }
}

TEST(OnnxRefElementwise, EmptyTensorsBroadcast) {
  const Tensor y = run1("Add", 14, {make<float>({0, 3}, {}), make<float>({3}, {1, 2, 3})});
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  EXPECT_EQ(y.numel(), 0);
}

TEST(OnnxRefElementwise, IntegerDivisionTruncatesAndChecksZero) {
  const Tensor y = run1("Div", 14, {make<std::int32_t>({4}, {-7, 7, -7, 7}), make<std::int32_t>({4}, {2, 2, -2, -2})});
  EXPECT_EQ(values_of<std::int32_t>(y), (std::vector<std::int32_t>{-3, 3, 3, -3}));
  const Tensor m = run1("Div", 14, {make<std::int8_t>({1}, {-128}), make<std::int8_t>({1}, {-1})});
  EXPECT_EQ(values_of<std::int8_t>(m), (std::vector<std::int8_t>{-128}));  // wraps, no trap
  XPURT_EXPECT_THROW_WITH(run1("Div", 14, {make<std::int64_t>({2}, {1, 2}), make<std::int64_t>({2}, {1, 0})}),
                          InvalidArgumentError, "division by zero");
}

TEST(OnnxRefElementwise, IntegerArithmeticWraps) {
  const Tensor y = run1("Add", 14, {make<std::uint8_t>({2}, {250, 3}), make<std::uint8_t>({2}, {10, 4})});
  EXPECT_EQ(values_of<std::uint8_t>(y), (std::vector<std::uint8_t>{4, 7}));
  const std::int32_t big = std::numeric_limits<std::int32_t>::max();
  const Tensor z = run1("Mul", 14, {make<std::int32_t>({1}, {big}), make<std::int32_t>({1}, {2})});
  EXPECT_EQ(values_of<std::int32_t>(z), (std::vector<std::int32_t>{-2}));
}

TEST(OnnxRefElementwise, ModFollowsDivisorSignOrCFmod) {
  const auto x = make<std::int64_t>({6}, {-4, 7, 5, 4, -7, 8});
  const auto d = make<std::int64_t>({6}, {2, -3, 8, -2, 3, 5});
  EXPECT_EQ(values_of<std::int64_t>(run1("Mod", 13, {x, d})), (std::vector<std::int64_t>{0, -2, 5, 0, 2, 3}));
  Attributes fmod;
  fmod.set("fmod", std::int64_t{1});
  EXPECT_EQ(values_of<std::int64_t>(run1("Mod", 13, {x, d}, fmod)), (std::vector<std::int64_t>{0, 1, 5, 0, -1, 3}));

  const auto xf = make<double>({6}, {-4.3, 7.2, 5.0, 4.3, -7.2, 8.0});
  const auto df = make<double>({6}, {2.1, -3.4, 8.0, -2.1, 3.4, 5.0});
  const auto c_fmod = values_of<double>(run1("Mod", 13, {xf, df}, fmod));
  const auto py_mod = values_of<double>(run1("Mod", 13, {xf, df}));
  const std::vector<double> want_c = {-0.1, 0.4, 5.0, 0.1, -0.4, 3.0};
  const std::vector<double> want_py = {2.0, -3.0, 5.0, -2.0, 3.0, 3.0};  // Python: -4.3 % 2.1 == 2.0
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(c_fmod[i], want_c[i], 1e-9) << i;
    EXPECT_NEAR(py_mod[i], want_py[i], 1e-9) << i;
  }
  XPURT_EXPECT_THROW_WITH(run1("Mod", 13, {make<std::int32_t>({1}, {3}), make<std::int32_t>({1}, {0})}),
                          InvalidArgumentError, "modulo by zero");
}

TEST(OnnxRefElementwise, ModPropertiesOnRandomIntegers) {
  // For every a, b != 0: a == trunc(a / b) * b + fmod(a, b), and Mod (fmod=0) has the divisor's sign and
  // differs from the C remainder by 0 or b.
  std::mt19937 gen(17);
  std::uniform_int_distribution<int> dist(-50, 50);
  std::vector<std::int32_t> a, b;
  for (int i = 0; i < 256; ++i) {
    a.push_back(dist(gen));
    int d = dist(gen);
    b.push_back(d == 0 ? 7 : d);
  }
  Attributes fmod;
  fmod.set("fmod", std::int64_t{1});
  const auto q = values_of<std::int32_t>(run1("Div", 14, {make<std::int32_t>({256}, a), make<std::int32_t>({256}, b)}));
  const auto c =
      values_of<std::int32_t>(run1("Mod", 13, {make<std::int32_t>({256}, a), make<std::int32_t>({256}, b)}, fmod));
  const auto m = values_of<std::int32_t>(run1("Mod", 13, {make<std::int32_t>({256}, a), make<std::int32_t>({256}, b)}));
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(q[i] * b[i] + c[i], a[i]) << a[i] << " / " << b[i];
    EXPECT_LT(std::abs(c[i]), std::abs(b[i]));
    EXPECT_TRUE(m[i] == 0 || (m[i] < 0) == (b[i] < 0)) << a[i] << " mod " << b[i] << " = " << m[i];
    EXPECT_TRUE(m[i] == c[i] || m[i] == c[i] + b[i]) << a[i] << " mod " << b[i];
  }
}

TEST(OnnxRefElementwise, CastRoundTrips) {
  // int32 -> float64 -> int32 is exact; float32 -> float16 -> float32 is within half precision.
  std::vector<std::int32_t> ints = {
      0, 1, -1, 123456789, std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()};
  Attributes to_double, to_int32, to_half, to_float;
  to_double.set("to", std::int64_t{11});
  to_int32.set("to", std::int64_t{6});
  to_half.set("to", std::int64_t{10});
  to_float.set("to", std::int64_t{1});
  const Tensor d = run1("Cast", 13, {make<std::int32_t>({6}, ints)}, to_double);
  EXPECT_EQ(values_of<std::int32_t>(run1("Cast", 13, {d}, to_int32)), ints);
  const auto f = random_floats(100, 23, -1000.0f, 1000.0f);
  const auto back = values_of<float>(run1("Cast", 13, {run1("Cast", 13, {make<float>({100}, f)}, to_half)}, to_float));
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(back[i], f[i], std::fabs(f[i]) * (1.0f / 2048.0f)) << f[i];
  // A cast to the same dtype copies; an empty one copies nothing (and reads no null pointer).
  EXPECT_EQ(values_of<float>(run1("Cast", 13, {make<float>({2}, {1.5f, -2.0f})}, to_float)),
            (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(run1("Cast", 13, {make<float>({0, 4}, {})}, to_float).numel(), 0);
}

TEST(OnnxRefElementwise, PowMixedTypes) {
  // float ** int64, int64 ** float (computed in double, truncated), int ** int (exact).
  const Tensor a = run1("Pow", 15, {make<float>({3}, {1, 2, 3}), make<std::int64_t>({3}, {4, 5, 6})});
  EXPECT_EQ(values_of<float>(a), (std::vector<float>{1, 32, 729}));
  const Tensor b = run1("Pow", 15, {make<std::int64_t>({3}, {2, 3, 4}), make<float>({3}, {0.5f, 2.0f, -1.0f})});
  EXPECT_EQ(values_of<std::int64_t>(b), (std::vector<std::int64_t>{1, 9, 0}));
  const Tensor c = run1("Pow", 15, {make<std::int64_t>({2}, {3, 3037000499}), make<std::int64_t>({2}, {39, 2})});
  EXPECT_EQ(values_of<std::int64_t>(c), (std::vector<std::int64_t>{4052555153018976267, 9223372030926249001}));
  const Tensor d = run1("Pow", 15, {make<float>({2, 2}, {1, 2, 3, 4}), make<float>({}, {2})});
  EXPECT_EQ(values_of<float>(d), (std::vector<float>{1, 4, 9, 16}));
  // Before opset 12 base and exponent must share a type.
  EXPECT_THROW(run1("Pow", 7, {make<float>({1}, {2}), make<std::int64_t>({1}, {2})}), InvalidTypeError);
}

TEST(OnnxRefElementwise, LegacyBroadcastWithAxis) {
  Attributes attrs;
  attrs.set("broadcast", std::int64_t{1});
  attrs.set("axis", std::int64_t{1});
  // A [2,3,2] + B [3] at axis 1: B aligns with dim 1.
  std::vector<float> a(12);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  const Tensor y = run1("Add", 6, {make<float>({2, 3, 2}, a), make<float>({3}, {100, 200, 300})}, attrs);
  const auto got = values_of<float>(y);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(got[i], a[i] + 100.0f * static_cast<float>((i / 2) % 3 + 1)) << i;
}

TEST(OnnxRefElementwise, TypeAndShapeErrors) {
  XPURT_EXPECT_THROW_WITH(run1("Add", 14, {make<float>({2}, {1, 2}), make<double>({2}, {1, 2})}), InvalidTypeError,
                          "float64");
  XPURT_EXPECT_THROW_WITH(run1("Add", 14, {make<float>({2}, {1, 2}), make<float>({3}, {1, 2, 3})}),
                          InvalidArgumentError, "broadcast");
  XPURT_EXPECT_THROW_WITH(run1("Sqrt", 13, {make<std::int32_t>({1}, {4})}), InvalidTypeError, "int32");
  XPURT_EXPECT_THROW_WITH(run1("And", 7, {make<float>({1}, {1}), make<float>({1}, {1})}), InvalidTypeError, "bool");
}

// ---- unary math and activations ----

TEST(OnnxRefElementwise, UnaryMathMatchesStd) {
  const auto x = random_floats(64, 7, 0.1f, 0.9f);  // inside every function's domain
  struct Case {
    const char* op;
    double (*fn)(double);
  };
  const Case cases[] = {
      {"Sqrt", [](double v) { return std::sqrt(v); }},        {"Exp", [](double v) { return std::exp(v); }},
      {"Log", [](double v) { return std::log(v); }},          {"Sin", [](double v) { return std::sin(v); }},
      {"Cos", [](double v) { return std::cos(v); }},          {"Tan", [](double v) { return std::tan(v); }},
      {"Asin", [](double v) { return std::asin(v); }},        {"Acos", [](double v) { return std::acos(v); }},
      {"Atan", [](double v) { return std::atan(v); }},        {"Sinh", [](double v) { return std::sinh(v); }},
      {"Cosh", [](double v) { return std::cosh(v); }},        {"Asinh", [](double v) { return std::asinh(v); }},
      {"Atanh", [](double v) { return std::atanh(v); }},      {"Tanh", [](double v) { return std::tanh(v); }},
      {"Erf", [](double v) { return std::erf(v); }},          {"Reciprocal", [](double v) { return 1.0 / v; }},
      {"Acosh", [](double v) { return std::acosh(v + 1.0); }}};
  for (const Case& c : cases) {
    std::vector<float> in = x;
    if (std::string(c.op) == "Acosh") {
      for (float& v : in) v += 1.0f;
    }
    const auto got = values_of<float>(run1(c.op, 13, {make<float>({8, 8}, in)}));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = c.fn(static_cast<double>(x[i]));
      EXPECT_NEAR(got[i], want, 1e-6 * std::max(1.0, std::fabs(want))) << c.op << " at " << x[i];
    }
  }
}

TEST(OnnxRefElementwise, RoundingAndSign) {
  const auto x = make<float>({8}, {-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 2.6f, -0.0f});
  EXPECT_EQ(values_of<float>(run1("Round", 11, {x})), (std::vector<float>{-2, -2, -0, 0, 2, 2, 3, -0}));
  EXPECT_EQ(values_of<float>(run1("Ceil", 13, {x})), (std::vector<float>{-2, -1, -0, 1, 2, 3, 3, -0}));
  EXPECT_EQ(values_of<float>(run1("Floor", 13, {x})), (std::vector<float>{-3, -2, -1, 0, 1, 2, 2, -0}));
  EXPECT_EQ(values_of<float>(run1("Sign", 13, {x})), (std::vector<float>{-1, -1, -1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(values_of<std::int16_t>(run1("Sign", 13, {make<std::int16_t>({3}, {-7, 0, 9})})),
            (std::vector<std::int16_t>{-1, 0, 1}));
  EXPECT_EQ(values_of<std::int32_t>(run1("Abs", 13, {make<std::int32_t>({3}, {-7, 0, 9})})),
            (std::vector<std::int32_t>{7, 0, 9}));
  EXPECT_EQ(values_of<std::int64_t>(run1("Neg", 13, {make<std::int64_t>({2}, {-7, 9})})),
            (std::vector<std::int64_t>{7, -9}));
}

TEST(OnnxRefElementwise, Activations) {
  const auto x = make<float>({5}, {-2.0f, -0.5f, 0.0f, 0.5f, 2.0f});
  EXPECT_EQ(values_of<float>(run1("Relu", 14, {x})), (std::vector<float>{0, 0, 0, 0.5f, 2}));
  EXPECT_EQ(values_of<std::int8_t>(run1("Relu", 14, {make<std::int8_t>({2}, {-3, 3})})),
            (std::vector<std::int8_t>{0, 3}));
  Attributes alpha;
  alpha.set("alpha", 0.1);
  const auto leaky = values_of<float>(run1("LeakyRelu", 16, {x}, alpha));
  EXPECT_FLOAT_EQ(leaky[0], -0.2f);
  EXPECT_FLOAT_EQ(leaky[4], 2.0f);
  const auto elu = values_of<float>(run1("Elu", 6, {x}));
  EXPECT_FLOAT_EQ(elu[0], std::expm1(-2.0f));
  const auto selu = values_of<float>(run1("Selu", 6, {x}));
  EXPECT_NEAR(selu[0], 1.0507010 * 1.6732632 * std::expm1(-2.0), 1e-5);
  EXPECT_NEAR(selu[4], 1.0507010 * 2.0, 1e-5);
  const auto hs = values_of<float>(run1("HardSigmoid", 6, {x}));
  EXPECT_FLOAT_EQ(hs[0], 0.1f);
  EXPECT_FLOAT_EQ(hs[3], 0.6f);
  const auto hswish = values_of<float>(run1("HardSwish", 14, {make<float>({3}, {-4.0f, 1.0f, 4.0f})}));
  EXPECT_FLOAT_EQ(hswish[0], 0.0f);
  EXPECT_FLOAT_EQ(hswish[1], 1.0f * (1.0f / 6.0f + 0.5f));
  EXPECT_FLOAT_EQ(hswish[2], 4.0f);
  // Softplus stays finite and exact for large inputs (a naive log(exp(x) + 1) overflows).
  const auto sp = values_of<float>(run1("Softplus", 1, {make<float>({3}, {-100.0f, 0.0f, 100.0f})}));
  EXPECT_NEAR(sp[0], std::exp(-100.0f), 1e-40);
  EXPECT_FLOAT_EQ(sp[1], std::log(2.0f));
  EXPECT_FLOAT_EQ(sp[2], 100.0f);
  const auto sig = values_of<float>(run1("Sigmoid", 13, {make<float>({3}, {-200.0f, 0.0f, 200.0f})}));
  EXPECT_EQ(sig, (std::vector<float>{0.0f, 0.5f, 1.0f}));
  const auto gelu = values_of<float>(run1("Gelu", 20, {x}));
  EXPECT_NEAR(gelu[4], 2.0 * 0.5 * (1.0 + std::erf(2.0 / std::sqrt(2.0))), 1e-6);
  Attributes tanh_approx;
  tanh_approx.set("approximate", std::string("tanh"));
  const auto gelu_tanh = values_of<float>(run1("Gelu", 20, {x}, tanh_approx));
  EXPECT_NEAR(gelu_tanh[4], 0.5 * 2.0 * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (2.0 + 0.044715 * 8.0))), 1e-6);
  const auto mish = values_of<float>(run1("Mish", 18, {x}));
  EXPECT_NEAR(mish[4], 2.0 * std::tanh(std::log1p(std::exp(2.0))), 1e-6);
  const auto celu = values_of<float>(run1("Celu", 12, {x}, alpha));
  EXPECT_NEAR(celu[0], 0.1 * std::expm1(-2.0 / 0.1), 1e-6);
  Attributes shrink;
  shrink.set("bias", 1.5);
  shrink.set("lambd", 1.0);
  EXPECT_EQ(values_of<float>(run1("Shrink", 9, {x}, shrink)), (std::vector<float>{-0.5f, 0, 0, 0, 0.5f}));
  EXPECT_EQ(values_of<float>(run1("ThresholdedRelu", 10, {x})), (std::vector<float>{0, 0, 0, 0, 2}));
  EXPECT_EQ(values_of<float>(run1("Softsign", 1, {x})),
            (std::vector<float>{-2.0f / 3, -0.5f / 1.5f, 0, 0.5f / 1.5f, 2.0f / 3}));
}

TEST(OnnxRefElementwise, PReluBroadcastsSlopePerChannel) {
  std::vector<float> x(12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 6.0f;
  const Tensor y = run1("PRelu", 16, {make<float>({1, 3, 4}, x), make<float>({3, 1}, {0.1f, 0.2f, 0.3f})});
  const auto got = values_of<float>(y);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float slope = 0.1f * static_cast<float>(i / 4 + 1);
    EXPECT_FLOAT_EQ(got[i], x[i] < 0 ? x[i] * slope : x[i]) << i;
  }
  EXPECT_THROW(run1("PRelu", 16, {make<float>({3}, {1, 2, 3}), make<float>({2, 3}, {1, 2, 3, 4, 5, 6})}),
               InvalidArgumentError);
}

TEST(OnnxRefElementwise, HalfComputesInFloat) {
  const Tensor y = run1("Exp", 13, {make_half({3}, {0.0f, 1.0f, -1.0f})});
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  const auto got = half_values(y);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_NEAR(got[1], std::exp(1.0f), 2e-3);
  EXPECT_NEAR(got[2], std::exp(-1.0f), 1e-3);
  const Tensor s = run1("Add", 14, {make_half({2}, {1.5f, 2.0f}), make_half({1}, {0.25f})});
  EXPECT_EQ(half_values(s), (std::vector<float>{1.75f, 2.25f}));
  // bfloat16 likewise, rounded back to nearest-even: 1 + 2^-7 is representable, 3 + 2^-7 is a tie that rounds to 3.
  Tensor bf = Tensor::empty({2}, DType::kBFloat16);
  auto* bits = static_cast<std::uint16_t*>(bf.data_ptr());
  bits[0] = detail::float_to_bfloat16(1.0f);
  bits[1] = detail::float_to_bfloat16(3.0f);
  Tensor small = Tensor::empty({}, DType::kBFloat16);
  *static_cast<std::uint16_t*>(small.data_ptr()) = detail::float_to_bfloat16(std::ldexp(1.0f, -7));
  const Tensor sum = run1("Add", 14, {bf, small});
  ASSERT_EQ(sum.dtype(), DType::kBFloat16);
  const auto* out = static_cast<const std::uint16_t*>(sum.data_ptr());
  EXPECT_EQ(detail::bfloat16_to_float(out[0]), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(detail::bfloat16_to_float(out[1]), 3.0f);  // 3 + 2^-7 rounds back to 3 (ulp 2^-6)
}

TEST(OnnxRefElementwise, ClipAttributesAndInputs) {
  Attributes attrs;
  attrs.set("min", -1.0);
  attrs.set("max", 1.0);
  const auto x = make<float>({4}, {-2.0f, -0.5f, 0.5f, 2.0f});
  EXPECT_EQ(values_of<float>(run1("Clip", 6, {x}, attrs)), (std::vector<float>{-1, -0.5f, 0.5f, 1}));
  // Opset 11+: optional inputs; a missing min leaves the low side open.
  const std::vector<Tensor> only_max = {x, Tensor(), make<float>({}, {0.0f})};
  EXPECT_EQ(values_of<float>(run1("Clip", 13, only_max)), (std::vector<float>{-2, -0.5f, 0, 0}));
  const std::vector<Tensor> ints = {make<std::int8_t>({3}, {-100, 5, 100}), make<std::int8_t>({}, {-10}),
                                    make<std::int8_t>({}, {10})};
  EXPECT_EQ(values_of<std::int8_t>(run1("Clip", 13, ints)), (std::vector<std::int8_t>{-10, 5, 10}));
  // min > max: every value becomes max.
  EXPECT_EQ(values_of<float>(run1("Clip", 13, {x, make<float>({}, {2.0f}), make<float>({}, {1.0f})})),
            (std::vector<float>{1, 1, 1, 1}));
  // Infinities pass through when no bound is given.
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(values_of<float>(run1("Clip", 13, {make<float>({2}, {-inf, inf})})), (std::vector<float>{-inf, inf}));
}

// ---- variadic ----

TEST(OnnxRefElementwise, VariadicOpsBroadcast) {
  const auto a = make<float>({2, 1}, {1, 5});
  const auto b = make<float>({3}, {2, 4, 6});
  const auto c = make<float>({}, {3});
  EXPECT_EQ(values_of<float>(run1("Max", 13, {a, b, c})), (std::vector<float>{3, 4, 6, 5, 5, 6}));
  EXPECT_EQ(values_of<float>(run1("Min", 13, {a, b, c})), (std::vector<float>{1, 1, 1, 2, 3, 3}));
  EXPECT_EQ(values_of<float>(run1("Sum", 13, {a, b, c})), (std::vector<float>{6, 8, 10, 10, 12, 14}));
  EXPECT_EQ(values_of<float>(run1("Mean", 13, {a, b, c})),
            (std::vector<float>{2, 8.0f / 3, 10.0f / 3, 10.0f / 3, 4, 14.0f / 3}));
  EXPECT_EQ(values_of<float>(run1("Sum", 13, {b})), (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(
      values_of<std::uint8_t>(run1("Max", 13, {make<std::uint8_t>({2}, {1, 200}), make<std::uint8_t>({2}, {3, 4})})),
      (std::vector<std::uint8_t>{3, 200}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto with_nan = values_of<float>(run1("Max", 13, {make<float>({2}, {nan, 1}), make<float>({2}, {1, 2})}));
  EXPECT_TRUE(std::isnan(with_nan[0]));
  EXPECT_EQ(with_nan[1], 2.0f);
  // Empty inputs (no storage): an empty output of the broadcast shape (the structure fuzzer's UBSan finding: the first
  // input's 0 bytes were copied from a null pointer).
  for (const char* op : {"Max", "Min", "Sum"}) {
    const Tensor empty = run1(op, 13, {make<std::uint8_t>({0, 3}, {}), make<std::uint8_t>({3}, {1, 2, 3})});
    EXPECT_EQ(empty.shape(), (std::vector<std::int64_t>{0, 3})) << op;
    EXPECT_EQ(run1(op, 13, {make<std::uint8_t>({0}, {}), make<std::uint8_t>({0}, {})}).numel(), 0) << op;
  }
  EXPECT_EQ(run1("Mean", 13, {make<float>({0, 2}, {}), make<float>({2}, {1, 2})}).numel(), 0);
}

// ---- comparisons, logic, bitwise, Where ----

TEST(OnnxRefElementwise, ComparisonsAndLogic) {
  const auto a = make<std::int32_t>({2, 2}, {1, 2, 3, 4});
  const auto b = make<std::int32_t>({2}, {2, 2});
  EXPECT_EQ(values_of<bool>(run1("Equal", 13, {a, b})), (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(values_of<bool>(run1("Greater", 13, {a, b})), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(values_of<bool>(run1("GreaterOrEqual", 16, {a, b})), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(values_of<bool>(run1("Less", 13, {a, b})), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(values_of<bool>(run1("LessOrEqual", 16, {a, b})), (std::vector<bool>{true, true, false, false}));
  const auto p = make<bool>({4}, {true, true, false, false});
  const auto q = make<bool>({4}, {true, false, true, false});
  EXPECT_EQ(values_of<bool>(run1("And", 7, {p, q})), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(values_of<bool>(run1("Or", 7, {p, q})), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(values_of<bool>(run1("Xor", 7, {p, q})), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(values_of<bool>(run1("Not", 1, {p})), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(values_of<bool>(run1("Equal", 13, {p, q})), (std::vector<bool>{true, false, false, true}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const auto f = make<float>({4}, {nan, inf, -inf, 1.0f});
  EXPECT_EQ(values_of<bool>(run1("IsNaN", 13, {f})), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(values_of<bool>(run1("IsInf", 10, {f})), (std::vector<bool>{false, true, true, false}));
  Attributes neg_only;
  neg_only.set("detect_positive", std::int64_t{0});
  EXPECT_EQ(values_of<bool>(run1("IsInf", 10, {f}, neg_only)), (std::vector<bool>{false, false, true, false}));
}

TEST(OnnxRefElementwise, BitwiseAndShifts) {
  const auto a = make<std::int32_t>({3}, {0b1100, -1, 7});
  const auto b = make<std::int32_t>({3}, {0b1010, 0x0f, 0});
  EXPECT_EQ(values_of<std::int32_t>(run1("BitwiseAnd", 18, {a, b})), (std::vector<std::int32_t>{0b1000, 0x0f, 0}));
  EXPECT_EQ(values_of<std::int32_t>(run1("BitwiseOr", 18, {a, b})), (std::vector<std::int32_t>{0b1110, -1, 7}));
  EXPECT_EQ(values_of<std::int32_t>(run1("BitwiseXor", 18, {a, b})), (std::vector<std::int32_t>{0b0110, -16, 7}));
  EXPECT_EQ(values_of<std::int32_t>(run1("BitwiseNot", 18, {a})), (std::vector<std::int32_t>{~0b1100, 0, -8}));
  Attributes left, right;
  left.set("direction", std::string("LEFT"));
  right.set("direction", std::string("RIGHT"));
  const auto x = make<std::uint8_t>({3}, {16, 4, 1});
  const auto s = make<std::uint8_t>({3}, {1, 6, 9});
  EXPECT_EQ(values_of<std::uint8_t>(run1("BitShift", 11, {x, s}, left)), (std::vector<std::uint8_t>{32, 0, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(run1("BitShift", 11, {x, s}, right)), (std::vector<std::uint8_t>{8, 0, 0}));
  EXPECT_THROW(run1("BitShift", 11, {x, s}), InvalidArgumentError);  // direction is required
}

TEST(OnnxRefElementwise, WhereBroadcastsThreeWays) {
  const auto cond = make<bool>({2, 1}, {true, false});
  const auto a = make<std::int64_t>({3}, {1, 2, 3});
  const auto b = make<std::int64_t>({}, {-1});
  const Tensor y = run1("Where", 16, {cond, a, b});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of<std::int64_t>(y), (std::vector<std::int64_t>{1, 2, 3, -1, -1, -1}));
  // Random check against the naive reference, float.
  const Shape sc = {4, 1, 5}, sa = {3, 1}, sb = {1, 3, 5}, so = {4, 3, 5};
  std::mt19937 gen(3);
  std::vector<bool> cv;
  for (std::int64_t i = 0; i < numel(sc); ++i) cv.push_back(gen() % 2 == 0);
  const auto av = random_floats(numel(sa), 4), bv = random_floats(numel(sb), 5);
  const auto got = values_of<float>(run1("Where", 16, {make<bool>(sc, cv), make<float>(sa, av), make<float>(sb, bv)}));
  for (std::int64_t i = 0; i < numel(so); ++i) {
    const bool c = cv[static_cast<std::size_t>(broadcast_offset(sc, so, i))];
    const float want = c ? av[static_cast<std::size_t>(broadcast_offset(sa, so, i))]
                         : bv[static_cast<std::size_t>(broadcast_offset(sb, so, i))];
    ASSERT_EQ(got[static_cast<std::size_t>(i)], want) << i;
  }
}

// ---- Cast, Identity, Dropout ----

TEST(OnnxRefElementwise, CastConversions) {
  Attributes to_int;
  to_int.set("to", std::int64_t{6});  // INT32
  const auto x = make<float>({5}, {-1.7f, -0.2f, 0.0f, 2.9f, 1e20f});
  EXPECT_EQ(values_of<std::int32_t>(run1("Cast", 13, {x}, to_int)),
            (std::vector<std::int32_t>{-1, 0, 0, 2, std::numeric_limits<std::int32_t>::max()}));
  Attributes to_bool;
  to_bool.set("to", std::int64_t{9});
  EXPECT_EQ(values_of<bool>(run1("Cast", 13, {x}, to_bool)), (std::vector<bool>{true, true, false, true, true}));
  Attributes to_half;
  to_half.set("to", std::int64_t{10});
  const Tensor h = run1("Cast", 13, {make<double>({3}, {0.5, 65504.0, 1e6})}, to_half);
  EXPECT_EQ(half_values(h), (std::vector<float>{0.5f, 65504.0f, std::numeric_limits<float>::infinity()}));
  // Just above a float16 tie: rounds up (through float, rounding to nearest twice would give 1.0).
  const Tensor tie =
      run1("Cast", 13, {make<double>({1}, {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30)})}, to_half);
  EXPECT_EQ(half_values(tie), (std::vector<float>{1.0f + std::ldexp(1.0f, -10)}));
  Attributes to_float;
  to_float.set("to", std::int64_t{1});
  EXPECT_EQ(values_of<float>(run1("Cast", 13, {h}, to_float)),
            (std::vector<float>{0.5f, 65504.0f, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(values_of<std::int64_t>(run1("Cast", 13, {make<bool>({2}, {true, false})},
                                         [] {
                                           Attributes a;
                                           a.set("to", std::int64_t{7});
                                           return a;
                                         }())),
            (std::vector<std::int64_t>{1, 0}));
  // Opset 1 names the type.
  Attributes named;
  named.set("to", std::string("DOUBLE"));
  EXPECT_EQ(values_of<double>(run1("Cast", 1, {make<std::int8_t>({2}, {-3, 4})}, named)),
            (std::vector<double>{-3.0, 4.0}));
  Attributes to_string;
  to_string.set("to", std::int64_t{8});
  XPURT_EXPECT_THROW_WITH(run1("Cast", 13, {x}, to_string), UnsupportedOperationError, "string");
  const Tensor like = run1("CastLike", 15, {x, make<std::int16_t>({1}, {0})});
  EXPECT_EQ(values_of<std::int16_t>(like), (std::vector<std::int16_t>{-1, 0, 0, 2, 32767}));
}

TEST(OnnxRefElementwise, IdentityAndDropoutInference) {
  const auto x = make<float>({3}, {1, 2, 3});
  const Tensor id = run1("Identity", 16, {x});
  EXPECT_EQ(values_of<float>(id), (std::vector<float>{1, 2, 3}));

  Node dropout = make_node("Dropout", 1, 2);
  auto out = onnx_ref::run_node(dropout, 13, {x});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(values_of<bool>(out[1]), (std::vector<bool>{true, true, true}));
  // Opset 7-9: the mask has the input's type.
  out = onnx_ref::run_node(dropout, 7, {x});
  EXPECT_EQ(values_of<float>(out[1]), (std::vector<float>{1, 1, 1}));
  // Training mode: ratio 0 is the identity, ratio > 0 is random (unsupported).
  Node training = make_node("Dropout", 3, 2);
  out = onnx_ref::run_node(training, 13, {x, make<float>({}, {0.0f}), make<bool>({}, {true})});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{1, 2, 3}));
  EXPECT_THROW(onnx_ref::run_node(training, 13, {x, make<float>({}, {0.5f}), make<bool>({}, {true})}),
               UnsupportedOperationError);
  out = onnx_ref::run_node(training, 13, {x, make<float>({}, {0.5f}), make<bool>({}, {false})});
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{1, 2, 3}));
}

// ---- Softmax family ----

TEST(OnnxRefElementwise, SoftmaxAxisSemanticsByOpset) {
  const Shape shape = {2, 3, 4};
  const auto v = random_floats(24, 11);
  const auto x = make<float>(shape, v);
  Attributes axis1;
  axis1.set("axis", std::int64_t{1});
  // Opset 13: along dim 1 only; each (i, :, k) column sums to 1.
  const auto y13 = values_of<float>(run1("Softmax", 13, {x}, axis1));
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 4; ++k) {
      double sum = 0, denom = 0;
      for (int j = 0; j < 3; ++j)
        denom += std::exp(static_cast<double>(v[static_cast<std::size_t>(i * 12 + j * 4 + k)]));
      for (int j = 0; j < 3; ++j) {
        const std::size_t idx = static_cast<std::size_t>(i * 12 + j * 4 + k);
        EXPECT_NEAR(y13[idx], std::exp(static_cast<double>(v[idx])) / denom, 1e-6);
        sum += y13[idx];
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
  // Opset 11: flattened to [2, 12]; each of the 2 rows sums to 1.
  const auto y11 = values_of<float>(run1("Softmax", 11, {x}, axis1));
  for (int i = 0; i < 2; ++i) {
    double denom = 0;
    for (int j = 0; j < 12; ++j) denom += std::exp(static_cast<double>(v[static_cast<std::size_t>(i * 12 + j)]));
    for (int j = 0; j < 12; ++j) {
      const std::size_t idx = static_cast<std::size_t>(i * 12 + j);
      EXPECT_NEAR(y11[idx], std::exp(static_cast<double>(v[idx])) / denom, 1e-6);
    }
  }
  // LogSoftmax == log(Softmax); large inputs stay finite.
  const auto log13 = values_of<float>(run1("LogSoftmax", 13, {x}, axis1));
  for (std::size_t i = 0; i < 24; ++i) EXPECT_NEAR(log13[i], std::log(y13[i]), 1e-5);
  const auto big = values_of<float>(run1("LogSoftmax", 13, {make<float>({2}, {1000.0f, 1001.0f})}));
  EXPECT_NEAR(big[0], -1.0 - std::log1p(std::exp(-1.0)), 1e-5);
}

TEST(OnnxRefElementwise, HardmaxPicksFirstMaximum) {
  const auto x = make<float>({2, 3}, {3, 1, 3, -1, 5, 0});
  EXPECT_EQ(values_of<float>(run1("Hardmax", 13, {x})), (std::vector<float>{1, 0, 0, 0, 1, 0}));
  Attributes axis0;
  axis0.set("axis", std::int64_t{0});
  EXPECT_EQ(values_of<float>(run1("Hardmax", 13, {x}, axis0)), (std::vector<float>{1, 0, 1, 0, 1, 0}));
  // Opset 11, axis 0: the whole tensor is one row.
  EXPECT_EQ(values_of<float>(run1("Hardmax", 11, {x}, axis0)), (std::vector<float>{0, 0, 0, 0, 1, 0}));
}

}  // namespace
}  // namespace xpuruntime
