// The data-movement ops (transpose, concat, slice, gather, expand), where, the comparisons, logical_not, cast
// between every dtype and integer add/sub/mul/div/neg, through the functional API with the kernel pinned: every
// case runs on the cpu kernel here and on the cuda_raw kernel where a GPU is present (skipped otherwise).
// Data movement is checked bit for bit against an index-mapping reference written in this file, on random bytes
// of every element size; the arithmetic against hand-checked values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Bytes = std::vector<std::uint8_t>;

constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin64 = std::numeric_limits<std::int64_t>::min();

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

Tensor from_bytes(const Shape& shape, DType dtype, const Bytes& bytes) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(t.nbytes(), bytes.size());
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

template <typename T>
Tensor from_values(const Shape& shape, DType dtype, const std::vector<T>& values) {
  EXPECT_EQ(sizeof(T), dtype_size(dtype));
  Bytes bytes(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return from_bytes(shape, dtype, bytes);
}

Bytes bytes_of(const Tensor& tensor) {
  const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  Bytes bytes(host.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), host.data_ptr(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> values_of(const Tensor& tensor) {
  EXPECT_EQ(sizeof(T), tensor.element_size());
  const Bytes bytes = bytes_of(tensor);
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// Random bytes for `dtype` (bool: 0 or 1).
Bytes random_bytes(const Shape& shape, DType dtype, unsigned seed) {
  std::mt19937 gen(seed);
  Bytes bytes(static_cast<std::size_t>(numel_of(shape)) * dtype_size(dtype));
  for (auto& b : bytes) b = static_cast<std::uint8_t>(gen() & (dtype == DType::kBool ? 1u : 0xffu));
  return bytes;
}

Shape unravel(std::int64_t index, const Shape& shape) {
  Shape out(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    out[d] = index % shape[d];
    index /= shape[d];
  }
  return out;
}

std::int64_t ravel(const Shape& index, const Shape& shape) {
  std::int64_t linear = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) linear = linear * shape[d] + index[d];
  return linear;
}

// The bytes of an output of `out_shape` whose element at each index is the source element `source(index)`.
Bytes map_elements(const Bytes& source, std::size_t element_size, const Shape& out_shape,
                   const std::function<std::int64_t(const Shape&)>& source_index) {
  const std::int64_t n = numel_of(out_shape);
  Bytes out(static_cast<std::size_t>(n) * element_size);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t from = source_index(unravel(i, out_shape));
    std::memcpy(out.data() + i * element_size, source.data() + from * element_size, element_size);
  }
  return out;
}

const DType kElementSizes[] = {DType::kUInt8, DType::kBool, DType::kFloat16, DType::kInt32, DType::kFloat64};

// The bytes of the concatenation of `ins` (of `shapes`, elements of `es` bytes) along `axis`, element by element.
Bytes concat_by_index(const std::vector<Bytes>& ins, const std::vector<Shape>& shapes, const Shape& out,
                      std::int64_t axis, std::size_t es) {
  const auto a = static_cast<std::size_t>(axis);
  Bytes expected(static_cast<std::size_t>(numel_of(out)) * es);
  for (std::int64_t i = 0; i < numel_of(out); ++i) {
    Shape index = unravel(i, out);
    std::size_t k = 0;
    while (index[a] >= shapes[k][a]) index[a] -= shapes[k++][a];
    std::memcpy(expected.data() + i * es, ins[k].data() + ravel(index, shapes[k]) * es, es);
  }
  return expected;
}

// ---- the backend under test ----

class DataOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda()) XPURT_SKIP_WITHOUT_GPU();
  }
  bool cuda() const { return GetParam() == "cuda_raw"; }

  // Runs `op` with its kernel pinned to the backend under test; outputs come back on the CPU.
  std::vector<Tensor> call_all(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs = {}) {
    KernelPolicy policy;
    policy.set(op, "pin:" + GetParam());
    ops::CallOptions options;
    options.kernel_policy = &policy;
    std::vector<Tensor> placed;
    for (const auto& input : inputs) placed.push_back(cuda() ? input.to(Device::cuda(0)) : input);
    std::vector<Tensor> outputs = ops::call(op, placed, attrs, options);
    for (auto& output : outputs) {
      EXPECT_EQ(output.device(), cuda() ? Device::cuda(0) : Device::cpu());
      if (cuda()) output = output.to(Device::cpu());
    }
    return outputs;
  }
  Tensor call(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs = {}) {
    return call_all(op, inputs, attrs).at(0);
  }
  // Concatenates random inputs of `shapes` along `axis` and checks every element against the index mapping.
  void expect_concat(const std::vector<Shape>& shapes, std::int64_t axis, DType dtype, unsigned seed) {
    std::vector<Bytes> ins;
    std::vector<Tensor> tensors;
    for (const auto& s : shapes) {
      ins.push_back(random_bytes(s, dtype, seed++));
      tensors.push_back(from_bytes(s, dtype, ins.back()));
    }
    const Tensor y = call("concat", tensors, Attributes().set("axis", axis));
    Shape out = shapes[0];
    for (std::size_t k = 1; k < shapes.size(); ++k) out[static_cast<std::size_t>(axis)] += shapes[k][axis];
    ASSERT_EQ(y.shape(), out);
    EXPECT_EQ(bytes_of(y), concat_by_index(ins, shapes, out, axis, dtype_size(dtype)))
        << dtype_name(dtype) << " axis " << axis << " rank " << out.size();
  }
};

// ---- transpose ----

TEST_P(DataOps, TransposeHandChecked) {
  const Tensor x = from_values<std::int32_t>({2, 3}, DType::kInt32, {0, 1, 2, 3, 4, 5});
  const Tensor y = call("transpose", {x}, Attributes().set("perm", Shape{1, 0}));
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(values_of<std::int32_t>(y), (std::vector<std::int32_t>{0, 3, 1, 4, 2, 5}));
  // No perm: reversed dims.
  const Tensor z = call("transpose", {x});
  EXPECT_EQ(values_of<std::int32_t>(z), (std::vector<std::int32_t>{0, 3, 1, 4, 2, 5}));
}

TEST_P(DataOps, TransposeMatchesIndexMappingForEveryElementSize) {
  struct Case {
    Shape shape;
    Shape perm;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4}, {0, 2, 1}},          {{3, 5, 7, 2}, {2, 0, 3, 1}},  {{2, 33, 3, 65}, {0, 2, 1, 3}},  // BERT
      {{2, 33, 65}, {0, 2, 1}},        {{67, 35}, {1, 0}},            {{1, 1}, {1, 0}},
      {{4, 1, 6}, {2, 1, 0}},          {{0, 3}, {1, 0}},              {{5}, {0}},
      {{2, 3, 4, 5, 6}, {4, 3, 2, 1, 0}}, {{3, 4, 5}, {-1, 0, 1}}};
  unsigned seed = 1;
  for (const DType dtype : kElementSizes) {
    for (const auto& c : cases) {
      const Bytes in = random_bytes(c.shape, dtype, seed++);
      const Tensor y = call("transpose", {from_bytes(c.shape, dtype, in)}, Attributes().set("perm", c.perm));
      const auto rank = static_cast<std::int64_t>(c.shape.size());
      Shape out_shape;
      for (const auto p : c.perm) out_shape.push_back(c.shape[static_cast<std::size_t>(p < 0 ? p + rank : p)]);
      ASSERT_EQ(y.shape(), out_shape);
      const Bytes expected = map_elements(in, dtype_size(dtype), out_shape, [&](const Shape& index) {
        Shape source(c.shape.size());
        for (std::size_t i = 0; i < index.size(); ++i) {
          source[static_cast<std::size_t>(c.perm[i] < 0 ? c.perm[i] + rank : c.perm[i])] = index[i];
        }
        return ravel(source, c.shape);
      });
      EXPECT_EQ(bytes_of(y), expected) << dtype_name(dtype) << " shape rank " << c.shape.size();
    }
  }
}

// ---- slice ----

TEST_P(DataOps, SliceFollowsOnnxClampingAndNegativeSteps) {
  std::vector<std::int64_t> ten(10);
  for (int i = 0; i < 10; ++i) ten[static_cast<std::size_t>(i)] = i;
  const Tensor x = from_values<std::int64_t>({10}, DType::kInt64, ten);
  const auto slice = [&](Shape starts, Shape ends, Shape steps) {
    Attributes attrs;
    attrs.set("starts", starts).set("ends", ends);
    if (!steps.empty()) attrs.set("steps", steps);
    return values_of<std::int64_t>(call("slice", {x}, attrs));
  };
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(slice({-3}, {kMax64}, {}), (V{7, 8, 9}));
  EXPECT_EQ(slice({8}, {1}, {-3}), (V{8, 5, 2}));
  EXPECT_EQ(slice({100}, {-100}, {-1}), (V{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(slice({-1}, {kMin64}, {-4}), (V{9, 5, 1}));
  EXPECT_EQ(slice({-100}, {3}, {}), (V{0, 1, 2}));
  EXPECT_EQ(slice({2}, {2}, {}), V{});
  EXPECT_EQ(slice({1}, {9}, {3}), (V{1, 4, 7}));
  EXPECT_EQ(slice({0}, {10}, {kMax64}), (V{0}));

  // 2-D: rows 0 and 2, columns from 3 down past 0 in steps of 2, given with negative axes.
  std::vector<float> twelve(12);
  for (int i = 0; i < 12; ++i) twelve[static_cast<std::size_t>(i)] = static_cast<float>(i);
  const Tensor m = from_values<float>({3, 4}, DType::kFloat32, twelve);
  Attributes attrs;
  attrs.set("starts", Shape{0, -1}).set("ends", Shape{3, -5}).set("axes", Shape{-2, -1}).set("steps", Shape{2, -2});
  const Tensor y = call("slice", {m}, attrs);
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(values_of<float>(y), (std::vector<float>{3, 1, 11, 9}));
  // Only axis 1 given: axis 0 stays whole.
  const Tensor z = call("slice", {m}, Attributes().set("starts", Shape{1}).set("ends", Shape{3}).set("axes", Shape{1}));
  EXPECT_EQ(values_of<float>(z), (std::vector<float>{1, 2, 5, 6, 9, 10}));
}

TEST_P(DataOps, SliceMatchesIndexMappingForEveryElementSize) {
  const Shape shape = {5, 6, 37};
  unsigned seed = 100;
  for (const DType dtype : kElementSizes) {
    const Bytes in = random_bytes(shape, dtype, seed++);
    // rows 1..4, columns 5 down to 1 step -2, inner 3..35 (contiguous run of 32)
    Attributes attrs;
    attrs.set("starts", Shape{1, 5, 3}).set("ends", Shape{4, 0, 35}).set("steps", Shape{1, -2, 1});
    const Tensor y = call("slice", {from_bytes(shape, dtype, in)}, attrs);
    ASSERT_EQ(y.shape(), (Shape{3, 3, 32}));
    const Bytes expected = map_elements(in, dtype_size(dtype), y.shape(), [&](const Shape& i) {
      return ravel({1 + i[0], 5 - 2 * i[1], 3 + i[2]}, shape);
    });
    EXPECT_EQ(bytes_of(y), expected) << dtype_name(dtype);
  }
}

// ---- concat ----

TEST_P(DataOps, ConcatTakesAnyNumberOfInputs) {
  const Tensor a = from_values<std::int32_t>({2, 1}, DType::kInt32, {1, 2});
  const Tensor b = from_values<std::int32_t>({2, 2}, DType::kInt32, {3, 4, 5, 6});
  const Tensor empty = Tensor::empty({2, 0}, DType::kInt32);
  const Tensor y = call("concat", {a, b, empty, a}, Attributes().set("axis", std::int64_t{-1}));
  EXPECT_EQ(y.shape(), (Shape{2, 4}));
  EXPECT_EQ(values_of<std::int32_t>(y), (std::vector<std::int32_t>{1, 3, 4, 1, 2, 5, 6, 2}));
  const Tensor one = call("concat", {b}, Attributes().set("axis", std::int64_t{0}));
  EXPECT_EQ(values_of<std::int32_t>(one), (std::vector<std::int32_t>{3, 4, 5, 6}));
}

TEST_P(DataOps, ConcatMatchesIndexMappingForEveryElementSize) {
  unsigned seed = 200;
  for (const DType dtype : kElementSizes) {
    for (const std::int64_t axis : {0, 1, 2}) {
      std::vector<Shape> shapes = {{3, 5, 7}, {3, 5, 7}, {3, 5, 7}};
      shapes[1][static_cast<std::size_t>(axis)] = 2;
      shapes[2][static_cast<std::size_t>(axis)] = 9;
      expect_concat(shapes, axis, dtype, seed);
      seed += 3;
    }
  }
}

// ---- gather ----

TEST_P(DataOps, GatherEmbeddingRowsWithNegativeIndices) {
  for (const std::int64_t hidden : {5, 64, 768}) {  // short rows (a thread per element) and long ones (a block)
    const Shape shape = {7, hidden};
    const Bytes table = random_bytes(shape, DType::kFloat32, static_cast<unsigned>(hidden));
    for (const DType index_dtype : {DType::kInt64, DType::kInt32}) {
      const std::vector<std::int64_t> index = {2, -1, 0, 6, -7, 3};
      const Tensor indices = index_dtype == DType::kInt64
                                 ? from_values<std::int64_t>({2, 3}, DType::kInt64, index)
                                 : from_values<std::int32_t>({2, 3}, DType::kInt32, {2, -1, 0, 6, -7, 3});
      const Tensor y = call("gather", {from_bytes(shape, DType::kFloat32, table), indices});
      ASSERT_EQ(y.shape(), (Shape{2, 3, hidden}));
      const Bytes expected = map_elements(table, 4, y.shape(), [&](const Shape& i) {
        std::int64_t row = index[static_cast<std::size_t>(i[0] * 3 + i[1])];
        if (row < 0) row += 7;
        return row * hidden + i[2];
      });
      EXPECT_EQ(bytes_of(y), expected) << "hidden " << hidden << " " << dtype_name(index_dtype);
    }
  }
}

TEST_P(DataOps, GatherAlongInnerAxesAndScalarIndices) {
  unsigned seed = 300;
  const Shape shape = {3, 4, 5};
  for (const DType dtype : kElementSizes) {
    const Bytes in = random_bytes(shape, dtype, seed++);
    const Tensor x = from_bytes(shape, dtype, in);
    // axis 1 with indices [2, 2] (one repeated, one negative)
    const Tensor indices = from_values<std::int64_t>({2, 2}, DType::kInt64, {3, -4, 0, 3});
    const Tensor y = call("gather", {x, indices}, Attributes().set("axis", std::int64_t{1}));
    ASSERT_EQ(y.shape(), (Shape{3, 2, 2, 5}));
    const std::vector<std::int64_t> index = {3, 0, 0, 3};
    EXPECT_EQ(bytes_of(y), map_elements(in, dtype_size(dtype), y.shape(), [&](const Shape& i) {
                return ravel({i[0], index[static_cast<std::size_t>(i[1] * 2 + i[2])], i[3]}, shape);
              })) << dtype_name(dtype);
    // a scalar index along the last axis drops the axis
    const Tensor scalar = from_values<std::int32_t>({}, DType::kInt32, {-2});
    const Tensor z = call("gather", {x, scalar}, Attributes().set("axis", std::int64_t{-1}));
    ASSERT_EQ(z.shape(), (Shape{3, 4}));
    EXPECT_EQ(bytes_of(z), map_elements(in, dtype_size(dtype), z.shape(), [&](const Shape& i) {
                return ravel({i[0], i[1], 3}, shape);
              })) << dtype_name(dtype);
  }
}

TEST(DataOpsCpu, GatherOutOfRangeIndexIsAnError) {
  KernelPolicy policy;
  policy.set("gather", "pin:cpu");
  ops::CallOptions options;
  options.kernel_policy = &policy;
  const Tensor data = Tensor::zeros({4, 3}, DType::kFloat32);
  const Tensor indices = from_values<std::int64_t>({2}, DType::kInt64, {1, 4});
  XPURT_EXPECT_THROW_WITH(ops::call("gather", {data, indices}, {}, options), InvalidArgumentError,
                          "index 4 at position [1] of 'indices' is out of range for axis 0 of size 4");
  const Tensor negative = from_values<std::int64_t>({1}, DType::kInt64, {-5});
  XPURT_EXPECT_THROW_WITH(ops::call("gather", {data, negative}, {}, options), InvalidArgumentError, "valid: -4 to 3");
}

// ---- expand ----

TEST_P(DataOps, ExpandBroadcastsBothWays) {
  const Tensor x = from_values<std::int16_t>({3, 1}, DType::kInt16, {1, 2, 3});
  const Tensor y = call("expand", {x}, Attributes().set("shape", Shape{2, 1, 4}));
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  std::vector<std::int16_t> expected;
  for (int b = 0; b < 2; ++b)
    for (std::int16_t r = 1; r <= 3; ++r)
      for (int c = 0; c < 4; ++c) expected.push_back(r);
  EXPECT_EQ(values_of<std::int16_t>(y), expected);
  // A shape of ones keeps x's dims.
  const Tensor z = call("expand", {x}, Attributes().set("shape", Shape{1}));
  EXPECT_EQ(z.shape(), (Shape{3, 1}));
  EXPECT_EQ(values_of<std::int16_t>(z), (std::vector<std::int16_t>{1, 2, 3}));

  unsigned seed = 400;
  for (const DType dtype : kElementSizes) {
    const Shape in_shape = {1, 5, 1, 33};
    const Bytes in = random_bytes(in_shape, dtype, seed++);
    const Tensor e = call("expand", {from_bytes(in_shape, dtype, in)}, Attributes().set("shape", Shape{3, 1, 4, 33}));
    ASSERT_EQ(e.shape(), (Shape{3, 5, 4, 33}));
    EXPECT_EQ(bytes_of(e), map_elements(in, dtype_size(dtype), e.shape(),
                                        [&](const Shape& i) { return i[1] * 33 + i[3]; }))
        << dtype_name(dtype);
  }
}

// ---- where, comparisons, logical_not ----

TEST_P(DataOps, WhereBroadcastsThreeOperands) {
  const Tensor cond = from_values<std::uint8_t>({2, 1}, DType::kBool, {1, 0});
  const Tensor a = from_values<std::int64_t>({1, 3}, DType::kInt64, {1, 2, 3});
  const Tensor b = from_values<std::int64_t>({1}, DType::kInt64, {-9});
  const Tensor y = call("where", {cond, a, b});
  ASSERT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of<std::int64_t>(y), (std::vector<std::int64_t>{1, 2, 3, -9, -9, -9}));

  unsigned seed = 500;
  for (const DType dtype : kElementSizes) {
    const Shape cs = {4, 1, 7}, as = {3, 1}, bs = {4, 3, 7};
    const Bytes c = random_bytes(cs, DType::kBool, seed++);
    const Bytes av = random_bytes(as, dtype, seed++);
    const Bytes bv = random_bytes(bs, dtype, seed++);
    const Tensor w = call("where", {from_bytes(cs, DType::kBool, c), from_bytes(as, dtype, av),
                                    from_bytes(bs, dtype, bv)});
    ASSERT_EQ(w.shape(), bs);
    const std::size_t es = dtype_size(dtype);
    Bytes expected(static_cast<std::size_t>(numel_of(bs)) * es);
    for (std::int64_t i = 0; i < numel_of(bs); ++i) {
      const Shape k = unravel(i, bs);
      const bool take_a = c[static_cast<std::size_t>(k[0] * 7 + k[2])] != 0;
      const std::uint8_t* from = take_a ? av.data() + k[1] * es : bv.data() + i * es;
      std::memcpy(expected.data() + i * es, from, es);
    }
    EXPECT_EQ(bytes_of(w), expected) << dtype_name(dtype);
  }
}

TEST_P(DataOps, ComparisonsGiveBool) {
  const Tensor a = from_values<std::int32_t>({2, 3}, DType::kInt32, {1, 5, -3, 7, 0, 2});
  const Tensor b = from_values<std::int32_t>({3}, DType::kInt32, {1, 6, -4});
  using B = std::vector<std::uint8_t>;
  const Tensor eq = call("equal", {a, b});
  EXPECT_EQ(eq.dtype(), DType::kBool);
  EXPECT_EQ(values_of<std::uint8_t>(eq), (B{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(call("less", {a, b})), (B{0, 1, 0, 0, 1, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(call("greater", {a, b})), (B{0, 0, 1, 1, 0, 1}));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor f = from_values<float>({4}, DType::kFloat32, {nan, 1.0f, -0.0f, 2.5f});
  const Tensor g = from_values<float>({4}, DType::kFloat32, {nan, nan, 0.0f, 2.25f});
  EXPECT_EQ(values_of<std::uint8_t>(call("equal", {f, g})), (B{0, 0, 1, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(call("less", {f, g})), (B{0, 0, 0, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(call("greater", {f, g})), (B{0, 0, 0, 1}));
  // float16 compares by value: 0x3c00 is 1.0, 0x3c01 is 1.0009765625, 0x8000 is -0.
  const Tensor h = from_values<std::uint16_t>({3}, DType::kFloat16, {0x3c00, 0x3c01, 0x8000});
  const Tensor k = from_values<std::uint16_t>({3}, DType::kFloat16, {0x3c01, 0x3c00, 0x0000});
  EXPECT_EQ(values_of<std::uint8_t>(call("less", {h, k})), (B{1, 0, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(call("equal", {h, k})), (B{0, 0, 1}));
  const Tensor p = from_values<std::uint8_t>({3}, DType::kBool, {1, 0, 1});
  const Tensor q = from_values<std::uint8_t>({1}, DType::kBool, {1});
  EXPECT_EQ(values_of<std::uint8_t>(call("equal", {p, q})), (B{1, 0, 1}));
  EXPECT_EQ(values_of<std::uint8_t>(call("logical_not", {p})), (B{0, 1, 0}));
}

// ---- cast ----

TEST_P(DataOps, CastBetweenEveryKindOfDtype) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor f = from_values<float>({9}, DType::kFloat32, {-2.7f, 2.7f, -0.5f, nan, 1e10f, -1e10f, inf, 300.0f,
                                                             -5.0f});
  const auto to = [&](const Tensor& x, const char* dtype) {
    return call("cast", {x}, Attributes().set("to", std::string(dtype)));
  };
  EXPECT_EQ(values_of<std::int32_t>(to(f, "int32")),
            (std::vector<std::int32_t>{-2, 2, 0, 0, std::numeric_limits<std::int32_t>::max(),
                                       std::numeric_limits<std::int32_t>::min(),
                                       std::numeric_limits<std::int32_t>::max(), 300, -5}));
  EXPECT_EQ(values_of<std::uint8_t>(to(f, "uint8")), (std::vector<std::uint8_t>{0, 2, 0, 0, 255, 0, 255, 255, 0}));
  EXPECT_EQ(values_of<std::int8_t>(to(f, "int8")), (std::vector<std::int8_t>{-2, 2, 0, 0, 127, -128, 127, 127, -5}));
  EXPECT_EQ(values_of<std::uint8_t>(to(f, "bool")), (std::vector<std::uint8_t>{1, 1, 1, 1, 1, 1, 1, 1, 1}));
  const Tensor zeros = from_values<float>({2}, DType::kFloat32, {0.0f, -0.0f});
  EXPECT_EQ(values_of<std::uint8_t>(to(zeros, "bool")), (std::vector<std::uint8_t>{0, 0}));

  const Tensor i64 = from_values<std::int64_t>({5}, DType::kInt64, {300, -1, 2049, (std::int64_t{1} << 40) + 1, 0});
  EXPECT_EQ(values_of<std::int8_t>(to(i64, "int8")), (std::vector<std::int8_t>{44, -1, 1, 1, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(to(i64, "uint8")), (std::vector<std::uint8_t>{44, 255, 1, 1, 0}));
  EXPECT_EQ(values_of<std::int32_t>(to(i64, "int32")), (std::vector<std::int32_t>{300, -1, 2049, 1, 0}));
  // 2049 is a tie between the float16 values 2048 and 2050: to even (2048, 0x6800).
  EXPECT_EQ(values_of<std::uint16_t>(to(i64, "float16"))[2], 0x6800);
  EXPECT_EQ(values_of<float>(to(i64, "float32")),
            (std::vector<float>{300.0f, -1.0f, 2049.0f, 1099511627776.0f, 0.0f}));
  EXPECT_EQ(values_of<double>(to(i64, "float64"))[3], 1099511627777.0);
  EXPECT_EQ(values_of<std::uint8_t>(to(i64, "bool")), (std::vector<std::uint8_t>{1, 1, 1, 1, 0}));

  const Tensor flags = from_values<std::uint8_t>({3}, DType::kBool, {1, 0, 1});
  EXPECT_EQ(values_of<float>(to(flags, "float32")), (std::vector<float>{1.0f, 0.0f, 1.0f}));
  EXPECT_EQ(values_of<std::int64_t>(to(flags, "int64")), (std::vector<std::int64_t>{1, 0, 1}));
  // float16 -2.5 (0xc100) and 65504 (0x7bff) to int64.
  const Tensor h = from_values<std::uint16_t>({2}, DType::kFloat16, {0xc100, 0x7bff});
  EXPECT_EQ(values_of<std::int64_t>(to(h, "int64")), (std::vector<std::int64_t>{-2, 65504}));
  // Float -> float still rounds once (the elementwise path).
  EXPECT_EQ(values_of<std::uint16_t>(to(from_values<float>({1}, DType::kFloat32, {1.0f}), "float16"))[0], 0x3c00);
}

// ---- integer arithmetic ----

TEST_P(DataOps, IntegerArithmeticWrapsAndTruncates) {
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  const Tensor a = from_values<std::int32_t>({6}, DType::kInt32, {kMax, -7, 7, kMin, 9, -9});
  const Tensor b = from_values<std::int32_t>({6}, DType::kInt32, {1, 2, -2, -1, 3, 4});
  using V = std::vector<std::int32_t>;
  EXPECT_EQ(values_of<std::int32_t>(call("add", {a, b})), (V{kMin, -5, 5, kMax, 12, -5}));
  EXPECT_EQ(values_of<std::int32_t>(call("sub", {a, b})), (V{kMax - 1, -9, 9, kMin + 1, 6, -13}));
  EXPECT_EQ(values_of<std::int32_t>(call("mul", {a, b})), (V{kMax, -14, -14, kMin, 27, -36}));
  EXPECT_EQ(values_of<std::int32_t>(call("div", {a, b})), (V{kMax, -3, -3, kMin, 3, -2}));
  EXPECT_EQ(values_of<std::int32_t>(call("neg", {a})), (V{-kMax, 7, -7, kMin, -9, 9}));

  const Tensor c = from_values<std::int64_t>({2, 2}, DType::kInt64, {10, -10, 1 << 20, 5});
  const Tensor d = from_values<std::int64_t>({2}, DType::kInt64, {3, -4});
  EXPECT_EQ(values_of<std::int64_t>(call("div", {c, d})), (std::vector<std::int64_t>{3, 2, 349525, -1}));
  EXPECT_EQ(values_of<std::int64_t>(call("mul", {c, d})), (std::vector<std::int64_t>{30, 40, 3 << 20, -20}));
}

TEST(DataOpsCpu, IntegerDivisionByZeroIsAnError) {
  KernelPolicy policy;
  policy.set("div", "pin:cpu");
  ops::CallOptions options;
  options.kernel_policy = &policy;
  const Tensor a = from_values<std::int64_t>({2}, DType::kInt64, {1, 2});
  const Tensor b = from_values<std::int64_t>({2}, DType::kInt64, {1, 0});
  XPURT_EXPECT_THROW_WITH(ops::call("div", {a, b}, {}, options), InvalidArgumentError, "integer division by zero");
}

// ---- what only the GPU does differently (Note [Gather index errors] in backends/cuda_raw/data.cu) ----


std::vector<Tensor> call_on_gpu(const std::string& op, const std::vector<Tensor>& inputs) {
  KernelPolicy policy;
  policy.set(op, "pin:cuda_raw");
  ops::CallOptions options;
  options.kernel_policy = &policy;
  std::vector<Tensor> placed;
  for (const auto& input : inputs) placed.push_back(input.to(Device::cuda(0)));
  std::vector<Tensor> outputs = ops::call(op, placed, {}, options);
  for (auto& output : outputs) output = output.to(Device::cpu());
  return outputs;
}

TEST(DataOpsGpu, GatherOutOfRangeWritesZerosAndRaisesWhenChecked) {
  XPURT_SKIP_WITHOUT_GPU();
  const Tensor data = from_values<float>({4, 3}, DType::kFloat32, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const Tensor bad = from_values<std::int64_t>({2}, DType::kInt64, {1, 4});
  {
    ScopedEnv off("XPURT_CUDA_RAW_CHECK_INDICES", "0");
    const Tensor y = call_on_gpu("gather", {data, bad}).at(0);
    EXPECT_EQ(values_of<float>(y), (std::vector<float>{4, 5, 6, 0, 0, 0}));
  }
  ScopedEnv on("XPURT_CUDA_RAW_CHECK_INDICES", "1");
  XPURT_EXPECT_THROW_WITH(call_on_gpu("gather", {data, bad}), InvalidArgumentError,
                          "found by XPURT_CUDA_RAW_CHECK_INDICES=1");
  // In-range indices pass the check (the flag of the failed launch was reset).
  const Tensor good = from_values<std::int64_t>({2}, DType::kInt64, {-4, 3});
  EXPECT_EQ(values_of<float>(call_on_gpu("gather", {data, good}).at(0)),
            (std::vector<float>{1, 2, 3, 10, 11, 12}));
}

TEST(DataOpsGpu, IntegerDivisionByZeroGivesZero) {
  XPURT_SKIP_WITHOUT_GPU();
  const Tensor a = from_values<std::int32_t>({3}, DType::kInt32, {7, -7, 5});
  const Tensor b = from_values<std::int32_t>({3}, DType::kInt32, {0, 2, 0});
  EXPECT_EQ(values_of<std::int32_t>(call_on_gpu("div", {a, b}).at(0)), (std::vector<std::int32_t>{0, -3, 0}));
}

// ---- validation ----

TEST(DataOpsSchema, ValidationNamesTheArgument) {
  const Tensor x = Tensor::zeros({2, 3}, DType::kFloat32);
  XPURT_EXPECT_THROW_WITH(ops::call("transpose", {x}, Attributes().set("perm", Shape{0, 0})), InvalidArgumentError,
                          "not a permutation");
  XPURT_EXPECT_THROW_WITH(ops::call("transpose", {x}, Attributes().set("perm", Shape{0})), InvalidArgumentError,
                          "must have 2 entries");
  XPURT_EXPECT_THROW_WITH(
      ops::call("slice", {x}, Attributes().set("starts", Shape{0}).set("ends", Shape{1}).set("steps", Shape{0})),
      InvalidArgumentError, "steps must not be 0");
  XPURT_EXPECT_THROW_WITH(ops::call("slice", {x}, Attributes().set("starts", Shape{0})), InvalidArgumentError,
                          "'starts' and 'ends' are required");
  XPURT_EXPECT_THROW_WITH(ops::call("gather", {x, x}), InvalidTypeError, "'indices' must be int32 or int64");
  XPURT_EXPECT_THROW_WITH(ops::call("expand", {x}, Attributes().set("shape", Shape{2, 4})), InvalidArgumentError,
                          "cannot be broadcast");
  XPURT_EXPECT_THROW_WITH(ops::call("where", {x, x, x}), InvalidTypeError, "'cond' must be bool");
  XPURT_EXPECT_THROW_WITH(ops::call("concat", {x, Tensor::zeros({3, 3}, DType::kFloat32)},
                                    Attributes().set("axis", std::int64_t{1})),
                          InvalidArgumentError, "in every dimension but axis 1");
  XPURT_EXPECT_THROW_WITH(ops::call("concat", {x, Tensor::zeros({2, 3}, DType::kInt32)},
                                    Attributes().set("axis", std::int64_t{0})),
                          InvalidTypeError, "must have the dtype of");
  XPURT_EXPECT_THROW_WITH(ops::call("concat", {x}), InvalidArgumentError, "'axis' is required");
  XPURT_EXPECT_THROW_WITH(ops::call("logical_not", {x}), InvalidTypeError, "must be bool");
  XPURT_EXPECT_THROW_WITH(ops::call("less", {Tensor::zeros({2}, DType::kBool), Tensor::zeros({2}, DType::kBool)}),
                          InvalidTypeError, "bool inputs are only for 'equal'");
  XPURT_EXPECT_THROW_WITH(ops::call("add", {Tensor::zeros({2}, DType::kInt8), Tensor::zeros({2}, DType::kInt8)}),
                          InvalidTypeError, "int32 or int64, got int8");
}

TEST(DataOpsSchema, VariadicInputsAreCountedOnce) {
  const OpSchema& schema = KernelRegistry::global().schema("concat");
  EXPECT_TRUE(schema.is_variadic());
  EXPECT_EQ(schema.num_required_inputs(), 1u);
  EXPECT_FALSE(KernelRegistry::global().schema("add").is_variadic());
  OpDescriptor desc;
  desc.op = "concat";
  desc.attrs.set("axis", std::int64_t{0});
  XPURT_EXPECT_THROW_WITH(KernelRegistry::global().infer(desc), InvalidArgumentError, "takes 1 or more inputs");
  desc.inputs = {TensorDesc::contiguous({2}, DType::kFloat32, Device::cpu()), TensorDesc{}};
  XPURT_EXPECT_THROW_WITH(KernelRegistry::global().infer(desc), InvalidArgumentError, "input 1 ('x...') is required");
  desc.inputs.assign(5, TensorDesc::contiguous({2}, DType::kFloat32, Device::cpu()));
  KernelRegistry::global().infer(desc);
  EXPECT_EQ(desc.inputs.size(), 5u);
  EXPECT_EQ(desc.outputs.at(0).shape, (Shape{10}));
}

TEST(DataOpsSchema, TheCpuKernelsSayWhichDtypesTheyTake) {
  OpDescriptor desc;
  desc.op = "pow";
  desc.inputs = {TensorDesc::contiguous({2}, DType::kInt32, Device::cpu()),
                 TensorDesc::contiguous({2}, DType::kInt32, Device::cpu())};
  desc.outputs = {desc.inputs[0]};
  desc.device = Device::cpu();
  const Support pow = KernelRegistry::global().find_kernel("pow", "cpu")->supports(desc, ExecutionPolicy{});
  EXPECT_FALSE(pow.ok());
  EXPECT_NE(pow.reason().find("int32"), std::string::npos) << pow.reason();
  desc.op = "add";
  EXPECT_TRUE(KernelRegistry::global().find_kernel("add", "cpu")->supports(desc, ExecutionPolicy{}).ok());
}

// ---- the ONNX ops beyond the core set (hand-checked here; every dtype and odd shapes in the conformance suite) ----

TEST_P(DataOps, PadModesHandChecked) {
  const Tensor x = from_values<std::int32_t>({1, 3}, DType::kInt32, {1, 2, 3});
  const auto pad = [&](const std::string& mode) {
    return values_of<std::int32_t>(call("pad", {x}, Attributes().set("pads", Shape{0, 2, 0, 1}).set("mode", mode)
                                                        .set("value", 9.0)));
  };
  EXPECT_EQ(pad("constant"), (std::vector<std::int32_t>{9, 9, 1, 2, 3, 9}));
  EXPECT_EQ(pad("edge"), (std::vector<std::int32_t>{1, 1, 1, 2, 3, 3}));
  EXPECT_EQ(pad("reflect"), (std::vector<std::int32_t>{3, 2, 1, 2, 3, 2}));
  EXPECT_EQ(pad("wrap"), (std::vector<std::int32_t>{2, 3, 1, 2, 3, 1}));
}

TEST_P(DataOps, GatherNdAndGatherElementsHandChecked) {
  const Tensor data = from_values<std::int32_t>({2, 3}, DType::kInt32, {10, 11, 12, 20, 21, 22});
  const Tensor tuples = from_values<std::int64_t>({2, 2}, DType::kInt64, {1, 2, 0, -1});
  EXPECT_EQ(values_of<std::int32_t>(call("gather_nd", {data, tuples})), (std::vector<std::int32_t>{22, 12}));
  const Tensor rows = from_values<std::int64_t>({2, 1}, DType::kInt64, {1, 0});  // tuples of depth 1: whole rows
  EXPECT_EQ(values_of<std::int32_t>(call("gather_nd", {data, rows})),
            (std::vector<std::int32_t>{20, 21, 22, 10, 11, 12}));
  const Tensor along = from_values<std::int64_t>({2, 2}, DType::kInt64, {2, 0, -1, 1});
  EXPECT_EQ(values_of<std::int32_t>(call("gather_elements", {data, along}, Attributes().set("axis", std::int64_t{1}))),
            (std::vector<std::int32_t>{12, 10, 22, 21}));
}

TEST_P(DataOps, CumSumTileTriluHandChecked) {
  const Tensor x = from_values<std::int64_t>({2, 3}, DType::kInt64, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values_of<std::int64_t>(call("cum_sum", {x}, Attributes().set("axis", std::int64_t{1}))),
            (std::vector<std::int64_t>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(values_of<std::int64_t>(call("cum_sum", {x}, Attributes().set("axis", std::int64_t{1})
                                                          .set("exclusive", std::int64_t{1})
                                                          .set("reverse", std::int64_t{1}))),
            (std::vector<std::int64_t>{5, 3, 0, 11, 6, 0}));
  EXPECT_EQ(values_of<std::int64_t>(call("tile", {x}, Attributes().set("repeats", Shape{1, 2}))),
            (std::vector<std::int64_t>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}));
  EXPECT_EQ(values_of<std::int64_t>(call("trilu", {x}, Attributes().set("upper", std::int64_t{0}))),
            (std::vector<std::int64_t>{1, 0, 0, 4, 5, 0}));
}

TEST_P(DataOps, TopKGivesValuesAndIndices) {
  const Tensor x = from_values<float>({2, 4}, DType::kFloat32, {1, 4, 4, 2, -1, 0, -3, 7});
  const std::vector<Tensor> out = call_all("top_k", {x}, Attributes().set("k", std::int64_t{2}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(values_of<float>(out[0]), (std::vector<float>{4, 4, 7, 0}));
  EXPECT_EQ(values_of<std::int64_t>(out[1]), (std::vector<std::int64_t>{1, 2, 3, 1}));  // ties: the smaller index
}

TEST_P(DataOps, LogicalOpsAndIsNan) {
  const Tensor a = from_values<std::uint8_t>({4}, DType::kBool, {0, 0, 1, 1});
  const Tensor b = from_values<std::uint8_t>({4}, DType::kBool, {0, 1, 0, 1});
  EXPECT_EQ(values_of<std::uint8_t>(call("logical_and", {a, b})), (std::vector<std::uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(values_of<std::uint8_t>(call("logical_or", {a, b})), (std::vector<std::uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(values_of<std::uint8_t>(call("logical_xor", {a, b})), (std::vector<std::uint8_t>{0, 1, 1, 0}));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Tensor x = from_values<float>({4}, DType::kFloat32, {1, nan, inf, -inf});
  EXPECT_EQ(values_of<std::uint8_t>(call("is_nan", {x})), (std::vector<std::uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(call("is_inf", {x}, Attributes().set("detect_negative", std::int64_t{0}))),
            (std::vector<std::uint8_t>{0, 0, 1, 0}));
}

// Shapes past the cuda_raw kernels' fast-path thresholds (Notes [Gather in row tiles] and [Tile in wide words], the
// same-shape where in backends/cuda_raw; several transpose tiles and partial ones, odd and even; wide concat rows).
TEST_P(DataOps, LargeShapesTakeTheTiledPathsAndMatchIndexMapping) {
  unsigned seed = 900;
  for (const DType dtype : kElementSizes) {
    const std::size_t es = dtype_size(dtype);
    for (const auto& c : std::vector<std::pair<Shape, Shape>>{
             {{130, 67}, {1, 0}}, {{3, 129, 65}, {0, 2, 1}}, {{2, 5, 70, 66}, {0, 2, 3, 1}},
             // even dims and strides: 2-byte elements take word pairs (Note [Transpose in word pairs])
             {{130, 66}, {1, 0}}, {{3, 66, 130}, {0, 2, 1}}, {{2, 6, 70, 66}, {0, 2, 3, 1}}, {{2, 2}, {1, 0}},
             {{4, 2, 6}, {2, 1, 0}}}) {
      const Shape& shape = c.first;
      const Shape& perm = c.second;
      const Bytes in = random_bytes(shape, dtype, seed++);
      const Tensor y = call("transpose", {from_bytes(shape, dtype, in)}, Attributes().set("perm", perm));
      Shape out_shape;
      for (const auto p : perm) out_shape.push_back(shape[static_cast<std::size_t>(p)]);
      EXPECT_EQ(bytes_of(y), map_elements(in, es, out_shape, [&](const Shape& index) {
                  Shape source(shape.size());
                  for (std::size_t i = 0; i < index.size(); ++i) source[static_cast<std::size_t>(perm[i])] = index[i];
                  return ravel(source, shape);
                })) << "transpose " << dtype_name(dtype) << " rank " << shape.size();
    }
    // gather: a scalar index selecting one huge row, embedding rows of several sizes
    for (const Shape& shape : {Shape{3, 40, 1000}, Shape{50, 300}, Shape{9, 1001}}) {
      const Bytes in = random_bytes(shape, dtype, seed++);
      const Tensor x = from_bytes(shape, dtype, in);
      const std::int64_t inner = numel_of(shape) / shape[0];
      const Tensor scalar = from_values<std::int64_t>({}, DType::kInt64, {-2});
      const Tensor z = call("gather", {x, scalar});
      EXPECT_EQ(bytes_of(z), map_elements(in, es, z.shape(), [&](const Shape& i) {
                  return (shape[0] - 2) * inner + ravel(i, Shape(shape.begin() + 1, shape.end()));
                })) << "gather scalar " << dtype_name(dtype);
      const std::vector<std::int64_t> rows = {1, -1, 0, 2, 2};
      const Tensor indices = from_values<std::int64_t>({5}, DType::kInt64, rows);
      const Tensor g = call("gather", {x, indices});
      EXPECT_EQ(bytes_of(g), map_elements(in, es, g.shape(), [&](const Shape& i) {
                  const std::int64_t row = rows[static_cast<std::size_t>(i[0])];
                  return (row < 0 ? row + shape[0] : row) * inner + ravel(Shape(i.begin() + 1, i.end()),
                                                                           Shape(shape.begin() + 1, shape.end()));
                })) << "gather rows " << dtype_name(dtype);
    }
    // concat of wide rows, along the last axis and along the first
    expect_concat({{3, 1100}, {3, 1500}, {3, 2048}}, 1, dtype, seed);
    expect_concat({{700, 9}, {300, 9}, {1, 9}}, 0, dtype, seed + 3);
    seed += 6;
    // tile: a repeated innermost dim (wide words when its run allows), unrepeated inner dims merged
    for (const auto& c : std::vector<std::pair<Shape, Shape>>{
             {{3, 40}, {2, 3}}, {{2, 3, 8}, {2, 1, 1}}, {{5, 7}, {1, 3}}, {{4, 16}, {3, 1}},
             {{37, 3, 136}, {2, 3, 2}}, {{513, 9}, {3, 5}}}) {  // several words per thread, odd runs
      const Shape& shape = c.first;
      const Shape& repeats = c.second;
      const Bytes in = random_bytes(shape, dtype, seed++);
      const Tensor y = call("tile", {from_bytes(shape, dtype, in)}, Attributes().set("repeats", repeats));
      EXPECT_EQ(bytes_of(y), map_elements(in, es, y.shape(), [&](const Shape& index) {
                  Shape source(index.size());
                  for (std::size_t d = 0; d < index.size(); ++d) source[d] = index[d] % shape[d];
                  return ravel(source, shape);
                })) << "tile " << dtype_name(dtype) << " " << shape.size();
    }
    // where with every operand of the output's shape (the vectorized path), odd sizes for the scalar tail
    for (const Shape& shape : {Shape{1003}, Shape{8, 257}, Shape{64}}) {
      const Bytes c = random_bytes(shape, DType::kBool, seed++), a = random_bytes(shape, dtype, seed++),
                  b = random_bytes(shape, dtype, seed++);
      const Tensor y = call("where", {from_bytes(shape, DType::kBool, c), from_bytes(shape, dtype, a),
                                      from_bytes(shape, dtype, b)});
      Bytes expected(a.size());
      for (std::int64_t i = 0; i < numel_of(shape); ++i) {
        std::memcpy(expected.data() + i * es, (c[static_cast<std::size_t>(i)] ? a : b).data() + i * es, es);
      }
      EXPECT_EQ(bytes_of(y), expected) << "where " << dtype_name(dtype) << " " << numel_of(shape);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DataOps, ::testing::Values(std::string("cpu"), std::string("cuda_raw")),
                         [](const ::testing::TestParamInfo<std::string>& backend) { return backend.param; });

}  // namespace
}  // namespace xpuruntime
