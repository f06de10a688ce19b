// The cpu kernels along one axis (src/cpp/backends/cpu/cpu_scan.cpp: cum_sum, arg_max, arg_min, top_k) against the
// ONNX reference library's CumSum, ArgMax, ArgMin and TopK on the same inputs: the same bits, at odd shapes, every
// axis, the attributes' combinations, ties, NaN and signed zeros, lines long enough to be cut into chunks, thread
// counts 1 to 8, and the launches the kernels decline (outputs overlapping the input), which the reference runs.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_test_runs.h"
#include "core/node_kernels.h"
#include "core/half.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- running the two sides ----

using cpu_test::run_cpu;
using cpu_test::run_reference;

Tensor int64_tensor(const Shape& shape, const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty(shape, DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

// A tensor of `dtype` holding `values` (rounded to nearest even for the narrower floats).
Tensor from_doubles(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::empty(shape, dtype);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    void* p = t.data_ptr();
    switch (dtype) {
      case DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
      case DType::kFloat64: static_cast<double*>(p)[i] = v; break;
      case DType::kFloat16: static_cast<std::uint16_t*>(p)[i] = detail::float_to_half(static_cast<float>(v)); break;
      case DType::kBFloat16:
        static_cast<std::uint16_t*>(p)[i] = detail::float_to_bfloat16(static_cast<float>(v));
        break;
      case DType::kInt32: static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v); break;
      case DType::kInt64: static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v); break;
      default: ADD_FAILURE() << "no test values of " << dtype_name(dtype);
    }
  }
  return t;
}

// Element i of a contiguous tensor as double, for messages.
double element(const Tensor& t, std::int64_t i) {
  const void* p = t.data_ptr();
  switch (t.dtype()) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat64: return static_cast<const double*>(p)[i];
    case DType::kFloat16: return detail::half_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::kBFloat16: return detail::bfloat16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::kInt32: return static_cast<const std::int32_t*>(p)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    default: return kNaN;
  }
}

// The first element at which two tensors' bits differ, or -1.
std::int64_t first_difference(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  const std::size_t size = ca.element_size();
  for (std::int64_t i = 0; i < ca.numel(); ++i) {
    const auto* pa = static_cast<const char*>(ca.data_ptr()) + static_cast<std::size_t>(i) * size;
    const auto* pb = static_cast<const char*>(cb.data_ptr()) + static_cast<std::size_t>(i) * size;
    if (std::memcmp(pa, pb, size) != 0) return i;
  }
  return -1;
}

void expect_same_bits(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::int64_t at = first_difference(actual, expected);
  if (at < 0) return;
  ADD_FAILURE() << what << ": first difference at element " << at << ": " << element(actual.contiguous(), at)
                << " vs the reference's " << element(expected.contiguous(), at);
}

// ---- inputs ----

enum class Fill {
  kNormal,  // floats from N(0, 4); integers in [-1000, 1000]
  kTies,    // integers in [-3, 3]: many equal values
  kNaN,     // kTies with a tenth NaN, element 0 NaN
  kZeros,   // -0, +0, -1 and 1
};

const char* fill_name(Fill fill) {
  switch (fill) {
    case Fill::kNormal: return "normal";
    case Fill::kTies: return "ties";
    case Fill::kNaN: return "nan";
    case Fill::kZeros: return "zeros";
  }
  return "?";
}

constexpr std::array<double, 4> kZeroValues = {-0.0, 0.0, -1.0, 1.0};

bool is_float(DType dtype) { return dtype != DType::kInt32 && dtype != DType::kInt64; }

Tensor make_input(const Shape& shape, DType dtype, Fill fill, unsigned seed) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 4.0);
  std::uniform_int_distribution<int> wide(-1000, 1000), narrow(-3, 3), tenth(0, 9);
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    double& v = values[static_cast<std::size_t>(i)];
    switch (fill) {
      case Fill::kNormal: v = is_float(dtype) ? normal(gen) : wide(gen); break;
      case Fill::kTies: v = narrow(gen); break;
      case Fill::kNaN: v = i == 0 || tenth(gen) == 0 ? kNaN : narrow(gen); break;
      case Fill::kZeros: v = kZeroValues[static_cast<std::size_t>(narrow(gen) & 3)]; break;
    }
  }
  return from_doubles(shape, dtype, values);
}

std::string shape_text(const Shape& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

// Shapes and the axes taken of each (negative ones included): lengths 1, 2, 17 and past 1000 along the axis, inner
// 1 and more.
struct Case {
  Shape shape;
  std::int64_t axis;
};
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{1}, 0},          {{2}, 0},           {{17}, -1},         {{1031}, 0},       {{3, 17}, 1},
      {{3, 17}, 0},      {{17, 3}, -2},      {{2, 1}, 1},        {{1, 2}, 0},       {{2, 5, 7}, 1},
      {{2, 5, 7}, 0},    {{2, 5, 7}, -1},    {{1003, 19}, 0},    {{4, 1001, 3}, 1}, {{3, 2, 1000}, 2},
      {{5, 40, 33}, -2}, {{1, 1, 17, 1}, 2}, {{260, 70}, 0},
  };
  return all;
}

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

// ---- cum_sum ----

void check_cum_sum(const Tensor& x, std::int64_t axis, bool exclusive, bool reverse, int threads,
                   const std::string& what) {
  Attributes cpu_attrs;
  cpu_attrs.set("axis", axis).set("exclusive", std::int64_t{exclusive}).set("reverse", std::int64_t{reverse});
  Attributes ref_attrs;
  ref_attrs.set("exclusive", std::int64_t{exclusive}).set("reverse", std::int64_t{reverse});
  const Tensor expected = run_reference("CumSum", {x, int64_tensor({}, {axis})}, ref_attrs, 1)[0];
  const Tensor actual = run_cpu("cum_sum", {x}, cpu_attrs, threads)[0];
  expect_same_bits(actual, expected,
                   what + " exclusive=" + std::to_string(exclusive) + " reverse=" + std::to_string(reverse) +
                       " threads=" + std::to_string(threads));
}

TEST(CpuScan, CumSumMatchesReferenceBits) {
  unsigned seed = 1;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kFloat16,
                      DType::kBFloat16}) {
    for (const Case& c : cases()) {
      for (Fill fill : {Fill::kNormal, Fill::kNaN}) {
        if (fill == Fill::kNaN && !is_float(dtype)) continue;
        const Tensor x = make_input(c.shape, dtype, fill, seed++);
        const std::string what = std::string(dtype_name(dtype)) + " " + shape_text(c.shape) + " axis " +
                                 std::to_string(c.axis) + " " + fill_name(fill);
        for (int flags = 0; flags < 4; ++flags) check_cum_sum(x, c.axis, flags & 1, flags & 2, 1 + flags % 3, what);
      }
    }
  }
}

// The reference sums int32 in int64 and narrows: sums past int32's range wrap the same way.
TEST(CpuScan, CumSumInt32WrapsLikeReference) {
  std::vector<double> big(3000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = (i % 3 == 2 ? -1.0 : 1.0) * (1 << 30) + static_cast<double>(i);
  for (const Shape& shape : {Shape{3000}, Shape{3, 1000}, Shape{1000, 3}}) {
    const Tensor x = from_doubles(shape, DType::kInt32, big);
    check_cum_sum(x, 0, false, false, 2, "int32 " + shape_text(shape));
    check_cum_sum(x, -1, true, true, 2, "int32 " + shape_text(shape));
  }
}

// Large enough for the blocks of lanes and the lines to be split among threads; 1, 2 and 8 threads give the same bits.
TEST(CpuScan, CumSumSameBitsOnEveryThreadCount) {
  for (const Case& c : {Case{{4099, 101}, 0}, Case{{7, 30011}, 1}, Case{{1, 100003}, -1}, Case{{33, 257, 9}, 1}}) {
    const Tensor x = make_input(c.shape, DType::kFloat32, Fill::kNormal, 7);
    Attributes attrs;
    attrs.set("axis", c.axis).set("reverse", std::int64_t{1});
    const Tensor one = run_cpu("cum_sum", {x}, attrs, 1)[0];
    for (int threads : {2, 8}) {
      expect_same_bits(run_cpu("cum_sum", {x}, attrs, threads)[0], one,
                       shape_text(c.shape) + " threads=" + std::to_string(threads));
    }
    check_cum_sum(x, c.axis, false, true, 2, "float32 " + shape_text(c.shape));
  }
}

// In place (the output is the input's buffer) the kernel runs; an output shifted by one element over the input it
// declines, and the reference library gives the answer.
TEST(CpuScan, CumSumInPlaceAndOverlappingOutputs) {
  const Tensor x = make_input({50, 41}, DType::kFloat32, Fill::kNormal, 11);
  Attributes attrs;
  attrs.set("axis", std::int64_t{0});
  const Tensor expected = run_reference("CumSum", {x, int64_tensor({}, {0})}, {}, 1)[0];

  Tensor in_place = Tensor::empty(x.shape(), DType::kFloat32);
  in_place.copy_from(x);
  run_cpu("cum_sum", {in_place}, attrs, 2, {in_place});
  expect_same_bits(in_place, expected, "in place");

  auto buffer = std::make_shared<std::vector<float>>(static_cast<std::size_t>(x.numel() + 1));
  std::memcpy(buffer->data(), x.data_ptr(), x.nbytes());
  const Tensor input = Tensor::from_blob(buffer->data(), x.shape(), {}, DType::kFloat32, Device::cpu(), buffer);
  Tensor shifted = Tensor::from_blob(buffer->data() + 1, x.shape(), {}, DType::kFloat32, Device::cpu(), buffer);
  run_cpu("cum_sum", {input}, attrs, 2, {shifted});
  expect_same_bits(shifted, expected, "output one element past the input");
}

// ---- arg_max, arg_min ----

void check_arg(const std::string& op, const Tensor& x, std::int64_t axis, bool keepdims, bool last, int threads,
               const std::string& what) {
  Attributes attrs;
  attrs.set("axis", axis).set("keepdims", std::int64_t{keepdims}).set("select_last_index", std::int64_t{last});
  const Tensor expected = run_reference(op == "arg_max" ? "ArgMax" : "ArgMin", {x}, attrs, 1)[0];
  const Tensor actual = run_cpu(op, {x}, attrs, threads)[0];
  expect_same_bits(actual, expected,
                   op + " " + what + " keepdims=" + std::to_string(keepdims) + " last=" + std::to_string(last) +
                       " threads=" + std::to_string(threads));
}

TEST(CpuScan, ArgMaxArgMinMatchReference) {
  unsigned seed = 100;
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases()) {
      for (Fill fill : {Fill::kNormal, Fill::kTies, Fill::kNaN, Fill::kZeros}) {
        const Tensor x = make_input(c.shape, dtype, fill, seed++);
        const std::string what = std::string(dtype_name(dtype)) + " " + shape_text(c.shape) + " axis " +
                                 std::to_string(c.axis) + " " + fill_name(fill);
        for (int flags = 0; flags < 4; ++flags) {
          check_arg(flags < 2 ? "arg_max" : "arg_min", x, c.axis, flags & 1, (flags >> 1) ^ (flags & 1),
                    1 + flags % 2, what);
        }
      }
    }
  }
}

// Lines too few for the threads are cut into chunks whose bests combine: the same indices on every thread count,
// NaN at element 0 or later included.
TEST(CpuScan, ArgLongLinesCutIntoChunks) {
  unsigned seed = 200;
  for (const Case& c : {Case{{1, 100003}, 1}, Case{{3, 50001}, -1}, Case{{70001, 2}, 0}}) {
    for (Fill fill : {Fill::kNormal, Fill::kTies, Fill::kNaN}) {
      Tensor x = make_input(c.shape, DType::kFloat32, fill, seed++);
      if (fill == Fill::kNaN) {  // NaN only later in the lines: element 0 then competes
        auto* p = static_cast<float*>(x.data_ptr());
        for (std::int64_t i = 0; i < x.numel(); ++i) {
          if (std::isnan(p[i]) && i % 7 != 0) p[i] = static_cast<float>(i % 5);
        }
        p[0] = 1.0f;
      }
      const std::string what = shape_text(c.shape) + " " + fill_name(fill);
      for (int threads : {1, 2, 4, 8}) {
        for (const char* op : {"arg_max", "arg_min"}) {
          check_arg(op, x, c.axis, false, false, threads, what);
          check_arg(op, x, c.axis, true, true, threads, what);
        }
      }
    }
  }
}

// ---- top_k ----

void check_top_k(const Tensor& x, std::int64_t axis, std::int64_t k, bool largest, bool sorted, int threads,
                 const std::string& what) {
  Attributes cpu_attrs;
  cpu_attrs.set("k", k).set("axis", axis).set("largest", std::int64_t{largest}).set("sorted", std::int64_t{sorted});
  Attributes ref_attrs;
  ref_attrs.set("axis", axis).set("largest", std::int64_t{largest}).set("sorted", std::int64_t{sorted});
  const std::vector<Tensor> expected = run_reference("TopK", {x, int64_tensor({1}, {k})}, ref_attrs, 2);
  const std::vector<Tensor> actual = run_cpu("top_k", {x}, cpu_attrs, threads);
  const std::string full = what + " k=" + std::to_string(k) + " largest=" + std::to_string(largest) +
                           " sorted=" + std::to_string(sorted) + " threads=" + std::to_string(threads);
  expect_same_bits(actual[0], expected[0], full + " values");
  expect_same_bits(actual[1], expected[1], full + " indices");
}

TEST(CpuScan, TopKMatchesReference) {
  unsigned seed = 300;
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases()) {
      const std::int64_t rank = static_cast<std::int64_t>(c.shape.size());
      const std::int64_t length = c.shape[static_cast<std::size_t>(c.axis < 0 ? c.axis + rank : c.axis)];
      for (Fill fill : {Fill::kNormal, Fill::kTies, Fill::kNaN, Fill::kZeros}) {
        const Tensor x = make_input(c.shape, dtype, fill, seed++);
        const std::string what = std::string(dtype_name(dtype)) + " " + shape_text(c.shape) + " axis " +
                                 std::to_string(c.axis) + " " + fill_name(fill);
        int flags = 0;
        for (std::int64_t k : {std::int64_t{0}, std::int64_t{1}, (length + 1) / 2, length}) {
          ++flags;
          check_top_k(x, c.axis, k, flags & 1, flags & 2, 1 + flags % 2, what);
          check_top_k(x, c.axis, k, !(flags & 1), true, 2, what);
        }
      }
    }
  }
}

// Long lines (and long blocks of few lanes) are cut into chunks whose k best merge into the line's; a line with a
// NaN is selected again as the reference does. Every thread count gives the reference's bits.
TEST(CpuScan, TopKLongLinesMergeChunks) {
  unsigned seed = 400;
  const struct {
    Shape shape;
    std::int64_t axis;
    std::int64_t k;
  } long_cases[] = {{{1, 100003}, 1, 1}, {{1, 100003}, 1, 1000}, {{2, 70001}, -1, 7},
                    {{50000, 3}, 0, 5},  {{20011, 40}, 0, 3},    {{1, 100003}, 1, 100003}};
  for (const auto& c : long_cases) {
    for (Fill fill : {Fill::kNormal, Fill::kTies, Fill::kNaN}) {
      Tensor x = make_input(c.shape, DType::kFloat32, fill, seed++);
      if (fill == Fill::kNaN) {  // one NaN in a single line
        auto* p = static_cast<float*>(x.data_ptr());
        for (std::int64_t i = 0; i < x.numel(); ++i) {
          if (std::isnan(p[i])) p[i] = static_cast<float>(i % 11);
        }
        p[x.numel() / 2] = std::numeric_limits<float>::quiet_NaN();
      }
      const std::string what = shape_text(c.shape) + " " + fill_name(fill);
      for (int threads : {1, 2, 4, 8}) {
        check_top_k(x, c.axis, c.k, threads % 2 == 0, true, threads, what);
      }
    }
  }
}

// Outputs overlapping the input: top_k declines them (values in the input's own buffer, k = length) and the
// reference library answers; so does arg_max for an output inside the input's buffer.
TEST(CpuScan, DeclinedOverlappingOutputsStillRight) {
  for (const Shape& shape : {Shape{40, 33}, Shape{1, 2000}}) {
    const Tensor x = make_input(shape, DType::kFloat32, Fill::kTies, 500);
    const std::vector<Tensor> expected =
        run_reference("TopK", {x, int64_tensor({1}, {shape[0]})}, Attributes().set("axis", std::int64_t{0}), 2);
    Tensor shared = Tensor::empty(shape, DType::kFloat32);
    shared.copy_from(x);
    Attributes attrs;
    attrs.set("k", shape[0]).set("axis", std::int64_t{0});
    const std::vector<Tensor> out = run_cpu("top_k", {shared}, attrs, 2, {shared, Tensor::empty(shape, DType::kInt64)});
    expect_same_bits(out[0], expected[0], "top_k values into its input " + shape_text(shape));
    expect_same_bits(out[1], expected[1], "top_k indices " + shape_text(shape));
  }
  const Tensor x = make_input({64, 16}, DType::kFloat32, Fill::kTies, 501);
  const Tensor expected = run_reference("ArgMax", {x}, Attributes().set("axis", std::int64_t{0}), 1)[0];
  Tensor shared = Tensor::empty(x.shape(), DType::kFloat32);
  shared.copy_from(x);
  // The 16 int64 results overlay the first 32 floats of the input, which the reference reads before it writes.
  Tensor into = Tensor::from_blob(shared.data_ptr(), {1, 16}, {}, DType::kInt64, Device::cpu(), shared.storage());
  run_cpu("arg_max", {shared}, Attributes().set("axis", std::int64_t{0}), 2, {into});
  expect_same_bits(into, expected, "arg_max into its input");
}

}  // namespace
}  // namespace xpuruntime
