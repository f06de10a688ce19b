// The ONNX reference ops of the tensor group (src/cpp/backends/cpu/onnx/onnx_tensor*.cpp) through
// onnx_ref::run_node: small hand-checked cases per op (every attribute-vs-input form across opsets, negative
// axes, empty tensors) and properties on random inputs against naive loops written here (transposes, slices,
// reductions, Einsum). The ONNX backend node tests (scripts/run_onnx_node_tests.py) cover the same ops end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using F = std::vector<float>;
using I = std::vector<std::int64_t>;

template <typename T>
DType dtype_of();
template <>
DType dtype_of<float>() { return DType::kFloat32; }
template <>
DType dtype_of<std::int64_t>() { return DType::kInt64; }
template <>
DType dtype_of<std::int32_t>() { return DType::kInt32; }
template <>
DType dtype_of<std::int8_t>() { return DType::kInt8; }

template <typename T>
Tensor make(const Shape& shape, const std::vector<T>& values) {
  Tensor t = Tensor::empty(shape, dtype_of<T>());
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) static_cast<T*>(t.data_ptr())[i] = values[i];
  return t;
}
Tensor makef(const Shape& shape, const F& values) { return make<float>(shape, values); }
Tensor makei(const Shape& shape, const I& values) { return make<std::int64_t>(shape, values); }
Tensor makeb(const Shape& shape, const std::vector<int>& values) {
  std::vector<bool> b(values.begin(), values.end());
  Tensor t = Tensor::empty(shape, DType::kBool);
  for (std::size_t i = 0; i < b.size(); ++i) static_cast<bool*>(t.data_ptr())[i] = b[i];
  return t;
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), dtype_of<T>());
  const T* p = static_cast<const T*>(t.data_ptr());
  return std::vector<T>(p, p + t.numel());
}
F valf(const Tensor& t) { return values<float>(t); }
I vali(const Tensor& t) { return values<std::int64_t>(t); }

Tensor random_tensor(const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  for (std::int64_t i = 0; i < t.numel(); ++i) static_cast<float*>(t.data_ptr())[i] = dist(rng);
  return t;
}

struct NodeBuilder {
  Node node;
  NodeBuilder(const std::string& op, std::size_t inputs, std::size_t outputs = 1) {
    node.op_type = op;
    node.name = "n";
    for (std::size_t i = 0; i < inputs; ++i) node.inputs.push_back("x" + std::to_string(i));
    for (std::size_t i = 0; i < outputs; ++i) node.outputs.push_back("y" + std::to_string(i));
  }
  NodeBuilder& attr(const std::string& name, AttrValue value) {
    node.attrs.set(name, std::move(value));
    return *this;
  }
};

std::vector<Tensor> run(const NodeBuilder& b, std::int64_t opset, const std::vector<Tensor>& inputs) {
  return onnx_ref::run_node(b.node, opset, inputs);
}
Tensor run1(const NodeBuilder& b, std::int64_t opset, const std::vector<Tensor>& inputs) {
  return run(b, opset, inputs).at(0);
}

// Value of a contiguous float tensor at a multi-index.
float at(const Tensor& t, const Shape& idx) {
  const Shape strides = contiguous_strides(t.shape());
  std::int64_t o = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) o += idx[d] * strides[d];
  return static_cast<const float*>(t.data_ptr())[o];
}

// Calls fn(index) for every multi-index of `shape` in row-major order.
template <typename Fn>
void for_each(const Shape& shape, Fn&& fn) {
  std::int64_t total = 1;
  for (std::int64_t d : shape) total *= d;
  Shape idx(shape.size(), 0);
  for (std::int64_t i = 0; i < total; ++i) {
    fn(idx);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// ---- constants and shapes ----

// Note [Scalars read from tensors]: Range's start, limit and delta must hold one element each. An empty limit read
// past its allocation (a garbage tensor of 120,064 elements at run time, a crash when folded); now it is a typed error
// naming the input, and one-element tensors of rank 0 or 1 still work, exactly for int64 values past 2^53.
TEST(OnnxRefTensor, RangeReadsEachScalarOnlyFromOneElement) {
  const NodeBuilder range("Range", 3);
  const Tensor zero = makei({}, {0}), one = makei({}, {1});
  XPURT_EXPECT_THROW_WITH(run1(range, 11, {zero, makei({0}, {}), one}), InvalidArgumentError,
                          "input 'limit': expected a scalar (one element), got a tensor of 0 elements");
  XPURT_EXPECT_THROW_WITH(run1(range, 11, {makei({2}, {0, 1}), makei({}, {3}), one}), InvalidArgumentError,
                          "input 'start': expected a scalar (one element), got a tensor of 2 elements");
  XPURT_EXPECT_THROW_WITH(run1(range, 11, {zero, makei({}, {3}), makef({0}, {})}), InvalidTypeError, "input 2");
  const Tensor r = run1(range, 11, {makei({1}, {2}), makei({}, {7}), makei({}, {2})});
  ASSERT_EQ(r.shape(), Shape({3}));
  EXPECT_EQ(std::vector<std::int64_t>(static_cast<const std::int64_t*>(r.data_ptr()),
                                      static_cast<const std::int64_t*>(r.data_ptr()) + 3),
            I({2, 4, 6}));
  const std::int64_t big = (std::int64_t{1} << 60) + 1;  // not a double
  const Tensor b = run1(range, 11, {makei({}, {big}), makei({}, {big + 2}), one});
  ASSERT_EQ(b.numel(), 2);
  EXPECT_EQ(static_cast<const std::int64_t*>(b.data_ptr())[1], big + 1);
}

TEST(OnnxRefTensor, ConstantForms) {
  NodeBuilder floats("Constant", 0);
  floats.attr("value_floats", std::vector<double>{1.5, -2.0});
  Tensor t = run1(floats, 13, {});
  EXPECT_EQ(t.shape(), Shape({2}));
  EXPECT_EQ(valf(t), F({1.5f, -2.0f}));

  NodeBuilder one_int("Constant", 0);
  one_int.attr("value_int", std::int64_t{7});
  t = run1(one_int, 13, {});
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(vali(t), I({7}));

  NodeBuilder tensor("Constant", 0);
  tensor.node.tensor_attrs["value"] = makei({2, 2}, {1, 2, 3, 4});
  t = run1(tensor, 9, {});
  EXPECT_EQ(t.shape(), Shape({2, 2}));
  EXPECT_EQ(vali(t), I({1, 2, 3, 4}));

  NodeBuilder strings("Constant", 0);
  strings.node.string_list_attrs["value_strings"] = {"a"};
  XPURT_EXPECT_THROW_WITH(run1(strings, 13, {}), UnsupportedOperationError, "string");
}

TEST(OnnxRefTensor, ConstantOfShapeAndShapeAndSize) {
  NodeBuilder cos("ConstantOfShape", 1);
  cos.node.tensor_attrs["value"] = makei({1}, {5});
  Tensor t = run1(cos, 9, {makei({2}, {2, 3})});
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  EXPECT_EQ(vali(t), I(6, 5));
  NodeBuilder cos_default("ConstantOfShape", 1);
  t = run1(cos_default, 9, {makei({0}, {})});  // empty shape: a scalar 0.0f
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(valf(t), F({0.0f}));

  const Tensor x = Tensor::zeros({2, 3, 4, 5}, DType::kFloat32);
  EXPECT_EQ(vali(run1(NodeBuilder("Shape", 1), 13, {x})), I({2, 3, 4, 5}));
  NodeBuilder sliced("Shape", 1);
  sliced.attr("start", std::int64_t{1}).attr("end", std::int64_t{-1});
  EXPECT_EQ(vali(run1(sliced, 15, {x})), I({3, 4}));
  NodeBuilder clamped("Shape", 1);
  clamped.attr("start", std::int64_t{-10}).attr("end", std::int64_t{10});
  EXPECT_EQ(vali(run1(clamped, 15, {x})), I({2, 3, 4, 5}));
  EXPECT_EQ(vali(run1(NodeBuilder("Size", 1), 13, {x})), I({120}));
}

TEST(OnnxRefTensor, ReshapeZeroMinusOneAllowzero) {
  const Tensor x = makef({2, 3, 4}, F(24, 1.0f));
  EXPECT_EQ(run1(NodeBuilder("Reshape", 2), 13, {x, makei({3}, {0, -1, 2})}).shape(), Shape({2, 6, 2}));
  EXPECT_EQ(run1(NodeBuilder("Reshape", 2), 13, {x, makei({1}, {-1})}).shape(), Shape({24}));
  NodeBuilder old("Reshape", 1);
  old.attr("shape", std::vector<std::int64_t>{4, -1});
  EXPECT_EQ(run1(old, 1, {x}).shape(), Shape({4, 6}));
  NodeBuilder allowzero("Reshape", 2);
  allowzero.attr("allowzero", std::int64_t{1});
  const Tensor empty = Tensor::empty({0, 3}, DType::kFloat32);
  EXPECT_EQ(run1(allowzero, 14, {empty, makei({2}, {3, 0})}).shape(), Shape({3, 0}));
  XPURT_EXPECT_THROW_WITH(run1(NodeBuilder("Reshape", 2), 13, {x, makei({2}, {5, -1})}), InvalidArgumentError,
                          "Reshape 'n'");
}

TEST(OnnxRefTensor, FlattenSqueezeUnsqueeze) {
  const Tensor x = makef({2, 1, 3, 1}, F(6, 0.0f));
  NodeBuilder flatten("Flatten", 1);
  flatten.attr("axis", std::int64_t{-1});
  EXPECT_EQ(run1(flatten, 13, {x}).shape(), Shape({6, 1}));
  NodeBuilder flatten0("Flatten", 1);
  flatten0.attr("axis", std::int64_t{0});
  EXPECT_EQ(run1(flatten0, 13, {x}).shape(), Shape({1, 6}));

  EXPECT_EQ(run1(NodeBuilder("Squeeze", 1), 13, {x}).shape(), Shape({2, 3}));
  EXPECT_EQ(run1(NodeBuilder("Squeeze", 2), 13, {x, makei({0}, {})}).shape(), Shape({2, 3}));
  NodeBuilder squeeze_attr("Squeeze", 1);
  squeeze_attr.attr("axes", std::vector<std::int64_t>{-1});
  EXPECT_EQ(run1(squeeze_attr, 11, {x}).shape(), Shape({2, 1, 3}));
  EXPECT_EQ(run1(NodeBuilder("Squeeze", 2), 13, {x, makei({1}, {1})}).shape(), Shape({2, 3, 1}));
  XPURT_EXPECT_THROW_WITH(run1(NodeBuilder("Squeeze", 2), 13, {x, makei({1}, {0})}), InvalidArgumentError,
                          "cannot squeeze");

  const Tensor y = makef({3, 4}, F(12, 0.0f));
  NodeBuilder unsqueeze_attr("Unsqueeze", 1);
  unsqueeze_attr.attr("axes", std::vector<std::int64_t>{0, 3});
  EXPECT_EQ(run1(unsqueeze_attr, 11, {y}).shape(), Shape({1, 3, 4, 1}));
  EXPECT_EQ(run1(NodeBuilder("Unsqueeze", 2), 13, {y, makei({2}, {-1, 1})}).shape(), Shape({3, 1, 4, 1}));
}

// ---- data movement ----

TEST(OnnxRefTensor, TransposeMatchesNaiveLoop) {
  std::mt19937 rng(1);
  const Tensor x = random_tensor({2, 3, 4, 5}, rng);
  NodeBuilder b("Transpose", 1);
  b.attr("perm", std::vector<std::int64_t>{2, 0, 3, 1});
  const Tensor y = run1(b, 13, {x});
  ASSERT_EQ(y.shape(), Shape({4, 2, 5, 3}));
  for_each(y.shape(), [&](const Shape& i) { EXPECT_EQ(at(y, i), at(x, {i[1], i[3], i[0], i[2]})); });
  const Tensor rev = run1(NodeBuilder("Transpose", 1), 13, {x});  // default: reversed dims
  ASSERT_EQ(rev.shape(), Shape({5, 4, 3, 2}));
  for_each(rev.shape(), [&](const Shape& i) { EXPECT_EQ(at(rev, i), at(x, {i[3], i[2], i[1], i[0]})); });
}

TEST(OnnxRefTensor, ConcatAndSplit) {
  NodeBuilder concat("Concat", 3);
  concat.attr("axis", std::int64_t{-1});
  const Tensor c = run1(concat, 13,
                        {makef({2, 1}, {1, 2}), makef({2, 0}, {}), makef({2, 2}, {3, 4, 5, 6})});
  EXPECT_EQ(c.shape(), Shape({2, 3}));
  EXPECT_EQ(valf(c), F({1, 3, 4, 2, 5, 6}));

  const Tensor x = makef({2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  NodeBuilder attr_split("Split", 1, 2);
  attr_split.attr("axis", std::int64_t{1}).attr("split", std::vector<std::int64_t>{2, 3});
  auto parts = run(attr_split, 11, {x});
  EXPECT_EQ(valf(parts[0]), F({0, 1, 5, 6}));
  EXPECT_EQ(valf(parts[1]), F({2, 3, 4, 7, 8, 9}));
  NodeBuilder input_split("Split", 2, 2);
  input_split.attr("axis", std::int64_t{-1});
  parts = run(input_split, 13, {x, makei({2}, {4, 1})});
  EXPECT_EQ(valf(parts[1]), F({4, 9}));
  NodeBuilder num_outputs("Split", 1, 3);
  num_outputs.attr("axis", std::int64_t{1}).attr("num_outputs", std::int64_t{3});
  parts = run(num_outputs, 18, {x});  // ceil(5/3) = 2: sizes 2, 2, 1
  EXPECT_EQ(parts[2].shape(), Shape({2, 1}));
  EXPECT_EQ(valf(parts[1]), F({2, 3, 7, 8}));
  NodeBuilder equal("Split", 1, 2);
  parts = run(equal, 13, {x});  // axis 0, equal halves
  EXPECT_EQ(valf(parts[1]), F({5, 6, 7, 8, 9}));
  XPURT_EXPECT_THROW_WITH(run(input_split, 13, {x, makei({2}, {4, 2})}), InvalidArgumentError, "sum to");
}

TEST(OnnxRefTensor, SliceStepsClampingAndOldForm) {
  const Tensor x = makef({10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto slice = [&](I starts, I ends, I axes, I steps) {
    const auto n = static_cast<std::int64_t>(starts.size());
    return valf(run1(NodeBuilder("Slice", 5), 13,
                     {x, makei({n}, starts), makei({n}, ends), makei({n}, axes), makei({n}, steps)}));
  };
  EXPECT_EQ(slice({1}, {8}, {0}, {3}), F({1, 4, 7}));
  EXPECT_EQ(slice({-1}, {-100}, {0}, {-4}), F({9, 5, 1}));
  EXPECT_EQ(slice({20}, {-100}, {0}, {-1}), F({9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(slice({-3}, {std::numeric_limits<std::int64_t>::max()}, {-1}, {1}), F({7, 8, 9}));
  EXPECT_TRUE(slice({5}, {2}, {0}, {1}).empty());
  const Tensor empty = Tensor::empty({0, 3}, DType::kFloat32);
  const Tensor e = run1(NodeBuilder("Slice", 5), 13,
                        {empty, makei({1}, {-1}), makei({1}, {-100}), makei({1}, {0}), makei({1}, {-1})});
  EXPECT_EQ(e.shape(), Shape({0, 3}));

  std::mt19937 rng(2);
  const Tensor m = random_tensor({4, 6}, rng);
  NodeBuilder old("Slice", 1);
  old.attr("starts", std::vector<std::int64_t>{1, -4}).attr("ends", std::vector<std::int64_t>{3, 100});
  const Tensor y = run1(old, 1, {m});
  ASSERT_EQ(y.shape(), Shape({2, 4}));
  for_each(y.shape(), [&](const Shape& i) { EXPECT_EQ(at(y, i), at(m, {i[0] + 1, i[1] + 2})); });
  // Default axes and steps (inputs 3 and 4 absent).
  const Tensor z = run1(NodeBuilder("Slice", 3), 10, {m, makei({2}, {0, 1}), makei({2}, {-1, 6})});
  ASSERT_EQ(z.shape(), Shape({3, 5}));
  EXPECT_EQ(at(z, {2, 4}), at(m, {2, 5}));
}

TEST(OnnxRefTensor, RandomSlicesMatchNaiveIndexing) {
  std::mt19937 rng(6);
  const Tensor x = random_tensor({5, 7}, rng);
  std::uniform_int_distribution<std::int64_t> bound(-9, 9), step_dist(-3, 3);
  for (int trial = 0; trial < 200; ++trial) {
    const I starts = {bound(rng), bound(rng)}, ends = {bound(rng), bound(rng)};
    I steps = {step_dist(rng), step_dist(rng)};
    for (auto& s : steps) s = s == 0 ? 1 : s;
    const Tensor y = run1(NodeBuilder("Slice", 5), 13,
                          {x, makei({2}, starts), makei({2}, ends), makei({2}, {0, 1}), makei({2}, steps)});
    // The spec's clamping (for negative steps starts clamp to [0, dim-1], ends to [-1, dim-1]), one axis at a
    // time.
    std::vector<std::vector<std::int64_t>> picked(2);
    for (std::size_t a = 0; a < 2; ++a) {
      const std::int64_t dim = x.shape()[a];
      for (std::int64_t i = 0; i < dim; ++i) {
        std::int64_t s = starts[a] < 0 ? starts[a] + dim : starts[a];
        std::int64_t e = ends[a] < 0 ? ends[a] + dim : ends[a];
        if (steps[a] > 0) {
          s = std::clamp<std::int64_t>(s, 0, dim);
          e = std::clamp<std::int64_t>(e, 0, dim);
          const std::int64_t v = s + i * steps[a];
          if (v < e) picked[a].push_back(v);
        } else {
          s = std::clamp<std::int64_t>(s, 0, dim - 1);
          e = std::clamp<std::int64_t>(e, -1, dim - 1);
          const std::int64_t v = s - i * -steps[a];
          if (v > e) picked[a].push_back(v);
        }
      }
    }
    ASSERT_EQ(y.shape(), Shape({static_cast<std::int64_t>(picked[0].size()),
                                static_cast<std::int64_t>(picked[1].size())}))
        << "starts " << starts[0] << "," << starts[1] << " ends " << ends[0] << "," << ends[1] << " steps "
        << steps[0] << "," << steps[1];
    for_each(y.shape(), [&](const Shape& i) {
      const auto r = static_cast<std::size_t>(i[0]), c = static_cast<std::size_t>(i[1]);
      EXPECT_EQ(at(y, i), at(x, {picked[0][r], picked[1][c]}));
    });
  }
}

TEST(OnnxRefTensor, PadModesIn2D) {
  std::mt19937 rng(7);
  const Tensor x = random_tensor({3, 4}, rng);
  const I pads = {2, 1, 3, 5};  // begin rows, begin cols, end rows, end cols
  for (const std::string mode : {"reflect", "edge", "wrap"}) {
    NodeBuilder b("Pad", 2);
    b.attr("mode", mode);
    const Tensor y = run1(b, 19, {x, makei({4}, pads)});
    ASSERT_EQ(y.shape(), Shape({8, 10}));
    auto source = [&](std::int64_t i, std::int64_t n) {
      if (mode == "edge") return std::clamp<std::int64_t>(i, 0, n - 1);
      if (mode == "wrap") return ((i % n) + n) % n;
      while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;  // numpy's reflect, folded repeatedly
      return i;
    };
    for_each(y.shape(), [&](const Shape& i) {
      EXPECT_EQ(at(y, i), at(x, {source(i[0] - 2, 3), source(i[1] - 1, 4)})) << mode;
    });
  }
}

TEST(OnnxRefTensor, ExpandTileAndPad) {
  const Tensor e = run1(NodeBuilder("Expand", 2), 13, {makef({3, 1}, {1, 2, 3}), makei({3}, {2, 1, 2})});
  EXPECT_EQ(e.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(valf(e), F({1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  const Tensor t = run1(NodeBuilder("Tile", 2), 13, {makef({2}, {1, 2}), makei({1}, {3})});
  EXPECT_EQ(valf(t), F({1, 2, 1, 2, 1, 2}));
  const Tensor t2 = run1(NodeBuilder("Tile", 2), 13, {makef({2, 2}, {1, 2, 3, 4}), makei({2}, {2, 0})});
  EXPECT_EQ(t2.shape(), Shape({4, 0}));
  // Tile-1: (input, tiles, axis).
  const Tensor t1 = run1(NodeBuilder("Tile", 3), 1, {makef({2, 2}, {1, 2, 3, 4}), makei({}, {2}), makei({}, {1})});
  EXPECT_EQ(t1.shape(), Shape({2, 4}));
  EXPECT_EQ(valf(t1), F({1, 2, 1, 2, 3, 4, 3, 4}));

  const Tensor x = makef({4}, {1, 2, 3, 4});
  auto pad = [&](const std::string& mode, I pads, std::int64_t opset) {
    NodeBuilder b("Pad", 3);
    b.attr("mode", mode);
    return valf(run1(b, opset, {x, makei({2}, pads), makef({}, {9})}));
  };
  EXPECT_EQ(pad("constant", {2, 1}, 13), F({9, 9, 1, 2, 3, 4, 9}));
  EXPECT_EQ(pad("constant", {-1, 1}, 13), F({2, 3, 4, 9}));
  EXPECT_EQ(pad("reflect", {2, 2}, 13), F({3, 2, 1, 2, 3, 4, 3, 2}));
  EXPECT_EQ(pad("edge", {2, 1}, 13), F({1, 1, 1, 2, 3, 4, 4}));
  EXPECT_EQ(pad("wrap", {2, 3}, 19), F({3, 4, 1, 2, 3, 4, 1, 2, 3}));
  NodeBuilder old("Pad", 1);
  old.attr("pads", std::vector<std::int64_t>{1, 0}).attr("value", 5.0);
  EXPECT_EQ(valf(run1(old, 2, {x})), F({5, 1, 2, 3, 4}));
  // Opset 18: pads of the listed axes only.
  const Tensor m = makef({2, 2}, {1, 2, 3, 4});
  const Tensor p = run1(NodeBuilder("Pad", 4), 18, {m, makei({2}, {1, 0}), Tensor(), makei({1}, {-1})});
  EXPECT_EQ(p.shape(), Shape({2, 3}));
  EXPECT_EQ(valf(p), F({0, 1, 2, 0, 3, 4}));
}

TEST(OnnxRefTensor, RangeTriluEyeLike) {
  const Tensor r = run1(NodeBuilder("Range", 3), 11, {makef({}, {1}), makef({}, {2}), makef({}, {0.25f})});
  EXPECT_EQ(valf(r), F({1, 1.25f, 1.5f, 1.75f}));
  const Tensor ri = run1(NodeBuilder("Range", 3), 11, {makei({}, {10}), makei({}, {4}), makei({}, {-3})});
  EXPECT_EQ(vali(ri), I({10, 7}));

  const Tensor x = makef({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(valf(run1(NodeBuilder("Trilu", 1), 14, {x})), F({1, 2, 3, 0, 5, 6, 0, 0, 9}));
  NodeBuilder lower("Trilu", 2);
  lower.attr("upper", std::int64_t{0});
  EXPECT_EQ(valf(run1(lower, 14, {x, makei({}, {-1})})), F({0, 0, 0, 4, 0, 0, 7, 8, 0}));

  NodeBuilder eye("EyeLike", 1);
  eye.attr("k", std::int64_t{1}).attr("dtype", std::int64_t{7});
  const Tensor e = run1(eye, 9, {makef({2, 3}, F(6, 0.0f))});
  EXPECT_EQ(vali(e), I({0, 1, 0, 0, 0, 1}));
}

TEST(OnnxRefTensor, DepthToSpaceModesAndSpaceToDepthInverse) {
  F v(16);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor x = makef({1, 4, 2, 2}, v);  // channel c holds 4c..4c+3
  NodeBuilder dcr("DepthToSpace", 1);
  dcr.attr("blocksize", std::int64_t{2});
  const Tensor y = run1(dcr, 13, {x});
  ASSERT_EQ(y.shape(), Shape({1, 1, 4, 4}));
  // DCR: out[0, 0, 2h+i, 2w+j] = x[0, 2i+j, h, w].
  for_each({2, 2, 2, 2}, [&](const Shape& s) {
    EXPECT_EQ(at(y, {0, 0, 2 * s[0] + s[2], 2 * s[1] + s[3]}), at(x, {0, 2 * s[2] + s[3], s[0], s[1]}));
  });
  NodeBuilder crd("DepthToSpace", 1);
  crd.attr("blocksize", std::int64_t{2}).attr("mode", std::string("CRD"));
  const Tensor z = run1(crd, 13, {makef({1, 8, 1, 1}, {0, 1, 2, 3, 4, 5, 6, 7})});
  EXPECT_EQ(valf(z), F({0, 1, 2, 3, 4, 5, 6, 7}));  // CRD: channel c*4 + 2i + j
  NodeBuilder s2d("SpaceToDepth", 1);
  s2d.attr("blocksize", std::int64_t{2});
  std::mt19937 rng(3);
  const Tensor r = random_tensor({2, 3, 4, 6}, rng);
  const Tensor back = run1(dcr, 13, {run1(s2d, 13, {r})});
  EXPECT_EQ(valf(back), valf(r));
}

// ---- index ops ----

TEST(OnnxRefTensor, GatherFamily) {
  const Tensor x = makef({3, 2}, {1, 2, 3, 4, 5, 6});
  NodeBuilder g("Gather", 2);
  Tensor y = run1(g, 13, {x, makei({2, 2}, {0, -1, 2, 1})});
  EXPECT_EQ(y.shape(), Shape({2, 2, 2}));
  EXPECT_EQ(valf(y), F({1, 2, 5, 6, 5, 6, 3, 4}));
  NodeBuilder g1("Gather", 2);
  g1.attr("axis", std::int64_t{1});
  y = run1(g1, 13, {x, make<std::int32_t>({}, {1})});
  EXPECT_EQ(y.shape(), Shape({3}));
  EXPECT_EQ(valf(y), F({2, 4, 6}));
  XPURT_EXPECT_THROW_WITH(run1(g, 13, {x, makei({1}, {3})}), InvalidArgumentError, "out of range");

  NodeBuilder ge("GatherElements", 2);
  ge.attr("axis", std::int64_t{1});
  y = run1(ge, 13, {x, makei({3, 2}, {1, 0, 1, 1, -2, 0})});
  EXPECT_EQ(valf(y), F({2, 1, 4, 4, 5, 5}));

  NodeBuilder gnd("GatherND", 2);
  y = run1(gnd, 13, {makef({2, 2}, {0, 1, 2, 3}), makei({2, 2}, {0, 0, 1, 1})});
  EXPECT_EQ(valf(y), F({0, 3}));
  y = run1(gnd, 13, {makef({2, 2}, {0, 1, 2, 3}), makei({2, 1}, {1, 0})});
  EXPECT_EQ(valf(y), F({2, 3, 0, 1}));
  NodeBuilder batched("GatherND", 2);
  batched.attr("batch_dims", std::int64_t{1});
  y = run1(batched, 12, {makef({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7}), makei({2, 1}, {1, 0})});
  EXPECT_EQ(y.shape(), Shape({2, 2}));
  EXPECT_EQ(valf(y), F({2, 3, 4, 5}));
}

TEST(OnnxRefTensor, ScatterFamily) {
  const Tensor x = makef({1, 5}, {1, 2, 3, 4, 5});
  NodeBuilder se("ScatterElements", 3);
  se.attr("axis", std::int64_t{1});
  Tensor y = run1(se, 13, {x, makei({1, 2}, {1, -2}), makef({1, 2}, {10, 20})});
  EXPECT_EQ(valf(y), F({1, 10, 3, 20, 5}));
  NodeBuilder add("ScatterElements", 3);
  add.attr("axis", std::int64_t{1}).attr("reduction", std::string("add"));
  y = run1(add, 16, {x, makei({1, 2}, {1, 1}), makef({1, 2}, {10, 20})});
  EXPECT_EQ(valf(y), F({1, 32, 3, 4, 5}));
  NodeBuilder mx("ScatterElements", 3);
  mx.attr("axis", std::int64_t{1}).attr("reduction", std::string("max"));
  y = run1(mx, 18, {x, makei({1, 2}, {0, 4}), makef({1, 2}, {0, 7})});
  EXPECT_EQ(valf(y), F({1, 2, 3, 4, 7}));
  XPURT_EXPECT_THROW_WITH(run1(mx, 16, {x, makei({1, 1}, {0}), makef({1, 1}, {0})}), InvalidArgumentError,
                          "reduction");
  NodeBuilder scatter("Scatter", 3);
  y = run1(scatter, 9, {makef({2, 2}, {0, 0, 0, 0}), makei({1, 2}, {1, 0}), makef({1, 2}, {5, 6})});
  EXPECT_EQ(valf(y), F({0, 6, 5, 0}));

  const Tensor d = makef({4, 2}, {1, 1, 2, 2, 3, 3, 4, 4});
  y = run1(NodeBuilder("ScatterND", 3), 13, {d, makei({2, 1}, {2, 0}), makef({2, 2}, {7, 8, 9, 10})});
  EXPECT_EQ(valf(y), F({9, 10, 2, 2, 7, 8, 4, 4}));
  NodeBuilder mul("ScatterND", 3);
  mul.attr("reduction", std::string("mul"));
  y = run1(mul, 16, {d, makei({2, 2}, {3, 1, 3, 1}), makef({2}, {2, 5})});
  EXPECT_EQ(valf(y), F({1, 1, 2, 2, 3, 3, 4, 40}));
}

TEST(OnnxRefTensor, OneHotCompressNonZero) {
  NodeBuilder oh("OneHot", 3);
  oh.attr("axis", std::int64_t{0});
  const Tensor y = run1(oh, 11, {makei({3}, {0, -1, 5}), makef({}, {3}), makef({2}, {0, 1})});
  EXPECT_EQ(y.shape(), Shape({3, 3}));
  EXPECT_EQ(valf(y), F({1, 0, 0, 0, 0, 0, 0, 1, 0}));  // -1 -> 2; 5 out of range: all off

  const Tensor x = makef({3, 2}, {1, 2, 3, 4, 5, 6});
  NodeBuilder c("Compress", 2);
  c.attr("axis", std::int64_t{0});
  EXPECT_EQ(valf(run1(c, 11, {x, makeb({2}, {0, 1})})), F({3, 4}));
  EXPECT_EQ(valf(run1(NodeBuilder("Compress", 2), 11, {x, makeb({5}, {0, 1, 0, 0, 1})})), F({2, 5}));

  const Tensor nz = run1(NodeBuilder("NonZero", 1), 13, {makef({2, 2}, {1, 0, 0, 3})});
  EXPECT_EQ(nz.shape(), Shape({2, 2}));
  EXPECT_EQ(vali(nz), I({0, 1, 0, 1}));
  EXPECT_EQ(run1(NodeBuilder("NonZero", 1), 13, {makef({0, 3}, {})}).shape(), Shape({2, 0}));
}

TEST(OnnxRefTensor, UniqueSortedUnsortedAndAxis) {
  const Tensor x = makef({6}, {2, 1, 1, 3, 4, 3});
  NodeBuilder sorted("Unique", 1, 4);
  auto out = run(sorted, 11, {x});
  EXPECT_EQ(valf(out[0]), F({1, 2, 3, 4}));
  EXPECT_EQ(vali(out[1]), I({1, 0, 3, 4}));
  EXPECT_EQ(vali(out[2]), I({1, 0, 0, 2, 3, 2}));
  EXPECT_EQ(vali(out[3]), I({2, 1, 2, 1}));
  NodeBuilder unsorted("Unique", 1, 4);
  unsorted.attr("sorted", std::int64_t{0});
  out = run(unsorted, 11, {x});
  EXPECT_EQ(valf(out[0]), F({2, 1, 3, 4}));
  EXPECT_EQ(vali(out[1]), I({0, 1, 3, 4}));
  EXPECT_EQ(vali(out[2]), I({0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(vali(out[3]), I({1, 2, 2, 1}));
  NodeBuilder axis("Unique", 1, 4);
  axis.attr("axis", std::int64_t{0});
  out = run(axis, 11, {makef({3, 2}, {1, 0, 0, 1, 1, 0})});
  EXPECT_EQ(out[0].shape(), Shape({2, 2}));
  EXPECT_EQ(valf(out[0]), F({0, 1, 1, 0}));
  EXPECT_EQ(vali(out[2]), I({1, 0, 1}));
}

TEST(OnnxRefTensor, ReverseSequence) {
  NodeBuilder b("ReverseSequence", 2);
  b.attr("batch_axis", std::int64_t{0}).attr("time_axis", std::int64_t{1});
  const Tensor y = run1(b, 10, {makef({2, 3}, {1, 2, 3, 4, 5, 6}), makei({2}, {2, 3})});
  EXPECT_EQ(valf(y), F({2, 1, 3, 6, 5, 4}));
  const Tensor z = run1(NodeBuilder("ReverseSequence", 2), 10, {makef({3, 2}, {1, 4, 2, 5, 3, 6}), makei({2}, {1, 3})});
  EXPECT_EQ(valf(z), F({1, 6, 2, 5, 3, 4}));
}

// ---- reductions ----

// Reduces x (float) over `axes` with a naive loop: init/step/finish.
template <typename Step, typename Finish>
std::vector<double> naive_reduce(const Tensor& x, const std::vector<bool>& reduce, double init, Step step,
                                 Finish finish) {
  Shape out_shape;
  for (std::size_t d = 0; d < reduce.size(); ++d) out_shape.push_back(reduce[d] ? 1 : x.shape()[d]);
  std::int64_t total = 1;
  for (std::int64_t d : out_shape) total *= d;
  std::vector<double> acc(static_cast<std::size_t>(total), init);
  std::vector<std::int64_t> count(acc.size(), 0);
  const Shape out_strides = contiguous_strides(out_shape);
  for_each(x.shape(), [&](const Shape& i) {
    std::int64_t o = 0;
    for (std::size_t d = 0; d < i.size(); ++d) o += (reduce[d] ? 0 : i[d]) * out_strides[d];
    acc[static_cast<std::size_t>(o)] = step(acc[static_cast<std::size_t>(o)], static_cast<double>(at(x, i)));
    ++count[static_cast<std::size_t>(o)];
  });
  for (std::size_t k = 0; k < acc.size(); ++k) acc[k] = finish(acc[k], static_cast<double>(count[k]));
  return acc;
}

TEST(OnnxRefTensor, ReductionsMatchNaiveLoops) {
  std::mt19937 rng(4);
  const Tensor x = random_tensor({3, 4, 5}, rng);
  const std::vector<bool> reduce = {true, false, true};
  auto id = [](double a, double) { return a; };
  struct Case {
    const char* op;
    std::vector<double> expected;
  };
  const std::vector<Case> cases = {
      {"ReduceSum", naive_reduce(x, reduce, 0, [](double a, double v) { return a + v; }, id)},
      {"ReduceMean", naive_reduce(x, reduce, 0, [](double a, double v) { return a + v; },
                                  [](double a, double n) { return a / n; })},
      {"ReduceMax", naive_reduce(x, reduce, -1e30, [](double a, double v) { return std::max(a, v); }, id)},
      {"ReduceMin", naive_reduce(x, reduce, 1e30, [](double a, double v) { return std::min(a, v); }, id)},
      {"ReduceProd", naive_reduce(x, reduce, 1, [](double a, double v) { return a * v; }, id)},
      {"ReduceL1", naive_reduce(x, reduce, 0, [](double a, double v) { return a + std::abs(v); }, id)},
      {"ReduceL2", naive_reduce(x, reduce, 0, [](double a, double v) { return a + v * v; },
                                [](double a, double) { return std::sqrt(a); })},
      {"ReduceSumSquare", naive_reduce(x, reduce, 0, [](double a, double v) { return a + v * v; }, id)},
      {"ReduceLogSumExp", naive_reduce(x, reduce, 0, [](double a, double v) { return a + std::exp(v); },
                                       [](double a, double) { return std::log(a); })},
  };
  for (const Case& c : cases) {
    for (std::int64_t opset : {11, 13, 18}) {
      const bool axes_input = opset >= (std::string(c.op) == "ReduceSum" ? 13 : 18);
      NodeBuilder b(c.op, axes_input ? 2 : 1);
      if (!axes_input) b.attr("axes", std::vector<std::int64_t>{0, -1});
      const Tensor y = axes_input ? run1(b, opset, {x, makei({2}, {0, -1})}) : run1(b, opset, {x});
      ASSERT_EQ(y.shape(), Shape({1, 4, 1})) << c.op;
      const F got = valf(y);
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], c.expected[i], 1e-4 * (1 + std::abs(c.expected[i]))) << c.op << " opset " << opset;
      }
    }
  }
  const Tensor logsum = run1(NodeBuilder("ReduceLogSum", 1), 13, {makef({2, 2}, {1, 2, 3, 4})});
  EXPECT_NEAR(valf(logsum)[0], std::log(10.0f), 1e-6);
}

TEST(OnnxRefTensor, ReductionKeepdimsNoopEmptyAndIntegers) {
  const Tensor x = makef({2, 3}, {1, 2, 3, 4, 5, 6});
  NodeBuilder drop("ReduceSum", 2);
  drop.attr("keepdims", std::int64_t{0});
  Tensor y = run1(drop, 13, {x, makei({1}, {1})});
  EXPECT_EQ(y.shape(), Shape({2}));
  EXPECT_EQ(valf(y), F({6, 15}));
  y = run1(drop, 13, {x});  // no axes: everything
  EXPECT_EQ(y.dim(), 0);
  EXPECT_EQ(valf(y), F({21}));
  NodeBuilder noop("ReduceSum", 2);
  noop.attr("noop_with_empty_axes", std::int64_t{1});
  y = run1(noop, 13, {x, makei({0}, {})});
  EXPECT_EQ(y.shape(), Shape({2, 3}));
  EXPECT_EQ(valf(y), valf(x));

  const Tensor empty = Tensor::empty({2, 0}, DType::kFloat32);
  NodeBuilder sum_empty("ReduceSum", 2);
  EXPECT_EQ(valf(run1(sum_empty, 13, {empty, makei({1}, {1})})), F({0, 0}));
  NodeBuilder prod_empty("ReduceProd", 1);
  prod_empty.attr("axes", std::vector<std::int64_t>{1});
  EXPECT_EQ(valf(run1(prod_empty, 13, {empty})), F({1, 1}));
  NodeBuilder max_empty("ReduceMax", 1);
  max_empty.attr("axes", std::vector<std::int64_t>{1});
  EXPECT_EQ(valf(run1(max_empty, 13, {empty}))[0], -std::numeric_limits<float>::infinity());

  const Tensor xi = makei({2, 2}, {std::int64_t{1} << 60, 1, 3, 4});
  NodeBuilder isum("ReduceSum", 1);
  isum.attr("axes", std::vector<std::int64_t>{1});
  EXPECT_EQ(vali(run1(isum, 11, {xi})), I({(std::int64_t{1} << 60) + 1, 7}));  // exact in int64
  NodeBuilder imean("ReduceMean", 1);
  imean.attr("axes", std::vector<std::int64_t>{0});
  EXPECT_EQ(vali(run1(imean, 11, {makei({2, 2}, {1, 2, 4, 5})})), I({2, 3}));  // truncated like numpy astype

  // float16 (1.0 = 0x3C00, 2.0 = 0x4000, 3.0 = 0x4200) sums in float.
  Tensor h = Tensor::empty({3}, DType::kFloat16);
  const std::uint16_t bits[3] = {0x3C00, 0x4000, 0x3C00};
  std::memcpy(h.data_ptr(), bits, sizeof(bits));
  const Tensor hs = run1(NodeBuilder("ReduceSum", 1), 13, {h});
  EXPECT_EQ(hs.dtype(), DType::kFloat16);
  std::uint16_t got = 0;
  std::memcpy(&got, hs.data_ptr(), 2);
  EXPECT_EQ(got, 0x4400);  // 4.0
}

TEST(OnnxRefTensor, ArgMaxArgMinTopK) {
  const Tensor x = makef({2, 3}, {1, 5, 5, 7, 0, 7});
  NodeBuilder amax("ArgMax", 1);
  amax.attr("axis", std::int64_t{1});
  EXPECT_EQ(vali(run1(amax, 13, {x})), I({1, 0}));
  NodeBuilder last("ArgMax", 1);
  last.attr("axis", std::int64_t{-1}).attr("keepdims", std::int64_t{0}).attr("select_last_index", std::int64_t{1});
  const Tensor l = run1(last, 13, {x});
  EXPECT_EQ(l.shape(), Shape({2}));
  EXPECT_EQ(vali(l), I({2, 2}));
  NodeBuilder amin("ArgMin", 1);
  EXPECT_EQ(vali(run1(amin, 13, {x})), I({0, 1, 0}));

  NodeBuilder topk("TopK", 2, 2);
  auto out = run(topk, 11, {x, makei({1}, {2})});
  EXPECT_EQ(valf(out[0]), F({5, 5, 7, 7}));
  EXPECT_EQ(vali(out[1]), I({1, 2, 0, 2}));
  NodeBuilder smallest("TopK", 2, 2);
  smallest.attr("largest", std::int64_t{0}).attr("axis", std::int64_t{0});
  out = run(smallest, 11, {x, makei({1}, {1})});
  EXPECT_EQ(valf(out[0]), F({1, 0, 5}));
  EXPECT_EQ(vali(out[1]), I({0, 1, 0}));
  NodeBuilder old("TopK", 1, 2);
  old.attr("k", std::int64_t{1});
  out = run(old, 1, {x});
  EXPECT_EQ(valf(out[0]), F({5, 7}));
}

TEST(OnnxRefTensor, CumSumForms) {
  const Tensor x = makef({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(valf(run1(NodeBuilder("CumSum", 2), 14, {x, makei({}, {1})})), F({1, 3, 6, 4, 9, 15}));
  NodeBuilder b("CumSum", 2);
  b.attr("exclusive", std::int64_t{1}).attr("reverse", std::int64_t{1});
  EXPECT_EQ(valf(run1(b, 14, {x, make<std::int32_t>({1}, {-1})})), F({5, 3, 0, 11, 6, 0}));
  EXPECT_EQ(valf(run1(NodeBuilder("CumSum", 2), 14, {x, makei({}, {0})})), F({1, 2, 3, 5, 7, 9}));
}

TEST(OnnxRefTensor, OldOpsetFormsAndOtherDtypes) {
  NodeBuilder concat("Concat", 2);  // Concat-1: axis defaults to 1
  EXPECT_EQ(run1(concat, 1, {makef({1, 1}, {1}), makef({1, 2}, {2, 3})}).shape(), Shape({1, 3}));
  NodeBuilder split("Split", 2, 2);  // Split-1: sizes as the second input
  auto parts = run(split, 1, {makef({3}, {1, 2, 3}), makei({2}, {1, 2})});
  EXPECT_EQ(valf(parts[1]), F({2, 3}));
  NodeBuilder pad("Pad", 1);  // Pad-1: "paddings"
  pad.attr("paddings", std::vector<std::int64_t>{0, 1}).attr("mode", std::string("edge"));
  EXPECT_EQ(valf(run1(pad, 1, {makef({2}, {1, 2})})), F({1, 2, 2}));

  // Data movement copies bits: int8 and bool through Gather and Transpose.
  const Tensor i8 = make<std::int8_t>({2, 2}, {-1, 2, -3, 4});
  EXPECT_EQ(values<std::int8_t>(run1(NodeBuilder("Transpose", 1), 13, {i8})), std::vector<std::int8_t>({-1, -3, 2, 4}));
  const Tensor b = makeb({3}, {1, 0, 1});
  const Tensor gb = run1(NodeBuilder("Gather", 2), 13, {b, makei({2}, {1, 2})});
  ASSERT_EQ(gb.dtype(), DType::kBool);
  EXPECT_FALSE(static_cast<const bool*>(gb.data_ptr())[0]);
  EXPECT_TRUE(static_cast<const bool*>(gb.data_ptr())[1]);

  // Integer reductions, arg and top-k stay exact.
  const Tensor i32 = make<std::int32_t>({2, 2}, {-5, -7, 3, -1});
  NodeBuilder rmax("ReduceMax", 1);
  rmax.attr("axes", std::vector<std::int64_t>{1});
  EXPECT_EQ(values<std::int32_t>(run1(rmax, 13, {i32})), std::vector<std::int32_t>({-5, 3}));
  NodeBuilder amin("ArgMin", 1);
  amin.attr("axis", std::int64_t{1}).attr("keepdims", std::int64_t{0});
  EXPECT_EQ(vali(run1(amin, 13, {i32})), I({1, 1}));
  EXPECT_EQ(values<std::int32_t>(run1(NodeBuilder("CumSum", 2), 14, {i32, makei({}, {0})})),
            std::vector<std::int32_t>({-5, -7, -2, -8}));
  auto top = run(NodeBuilder("TopK", 2, 2), 11, {makei({4}, {3, 9, 1, 9}), makei({1}, {3})});
  EXPECT_EQ(vali(top[0]), I({9, 9, 3}));
  EXPECT_EQ(vali(top[1]), I({1, 3, 0}));
}

// ---- Einsum ----

Tensor einsum(const std::string& equation, const std::vector<Tensor>& inputs) {
  NodeBuilder b("Einsum", inputs.size());
  b.attr("equation", equation);
  return run1(b, 12, inputs);
}

TEST(OnnxRefTensor, EinsumAgainstNaiveLoops) {
  std::mt19937 rng(5);
  const Tensor a = random_tensor({3, 4}, rng);
  const Tensor b = random_tensor({4, 5}, rng);
  for (const std::string eq : {"ij,jk->ik", "ij,jk"}) {
    const Tensor y = einsum(eq, {a, b});
    ASSERT_EQ(y.shape(), Shape({3, 5}));
    for_each(y.shape(), [&](const Shape& i) {
      double s = 0;
      for (std::int64_t j = 0; j < 4; ++j) s += double(at(a, {i[0], j})) * at(b, {j, i[1]});
      EXPECT_NEAR(at(y, i), s, 1e-5);
    });
  }
  const Tensor t = einsum("ij->ji", {a});
  for_each(t.shape(), [&](const Shape& i) { EXPECT_EQ(at(t, i), at(a, {i[1], i[0]})); });
  EXPECT_EQ(einsum("ji", {a}).shape(), Shape({4, 3}));  // implicit output "ij": the transpose

  const Tensor sq = random_tensor({4, 4}, rng);
  const Tensor diag = einsum("ii->i", {sq});
  const Tensor trace = einsum("ii", {sq});
  double tr = 0;
  for (std::int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(valf(diag)[static_cast<std::size_t>(i)], at(sq, {i, i}));
    tr += at(sq, {i, i});
  }
  EXPECT_EQ(trace.dim(), 0);
  EXPECT_NEAR(valf(trace)[0], tr, 1e-5);

  // Broadcast ellipsis: [2,1,3,4] x [3,4,5] -> [2,3,3,5].
  const Tensor p = random_tensor({2, 1, 3, 4}, rng);
  const Tensor q = random_tensor({3, 4, 5}, rng);
  const Tensor bm = einsum("...ij,...jk->...ik", {p, q});
  ASSERT_EQ(bm.shape(), Shape({2, 3, 3, 5}));
  for_each(bm.shape(), [&](const Shape& i) {
    double s = 0;
    for (std::int64_t j = 0; j < 4; ++j) s += double(at(p, {i[0], 0, i[2], j})) * at(q, {i[1], j, i[3]});
    EXPECT_NEAR(at(bm, i), s, 1e-5);
  });
  const Tensor sum = einsum("ij->", {a});
  double total = 0;
  for (float v : valf(a)) total += v;
  EXPECT_NEAR(valf(sum)[0], total, 1e-4);
  XPURT_EXPECT_THROW_WITH(einsum("ij,jk->ik", {a, a}), InvalidArgumentError, "sizes");
}

}  // namespace
}  // namespace xpuruntime
