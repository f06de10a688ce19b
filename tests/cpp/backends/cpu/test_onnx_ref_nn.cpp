// The ONNX reference ops of the nn group (src/cpp/backends/cpu/onnx/onnx_nn*.cpp) through onnx_ref::run_node:
// MatMul/Gemm/Conv/ConvTranspose against naive loops written here on random inputs (broadcasting, groups,
// dilations, strides, pads, 1-D/2-D/3-D), hand-checked pooling, normalization, Resize, NonMaxSuppression and RNN
// cases, and the errors ONNX-invalid inputs raise. The ONNX backend node tests (scripts/run_onnx_node_tests.py)
// cover the same ops end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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

Tensor makef(const Shape& shape, const F& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) static_cast<float*>(t.data_ptr())[i] = values[i];
  return t;
}
Tensor makei(const Shape& shape, const I& values) {
  Tensor t = Tensor::empty(shape, DType::kInt64);
  for (std::size_t i = 0; i < values.size(); ++i) static_cast<std::int64_t*>(t.data_ptr())[i] = values[i];
  return t;
}
F valf(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  const float* p = static_cast<const float*>(t.data_ptr());
  return F(p, p + t.numel());
}
I vali(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kInt64);
  const auto* p = static_cast<const std::int64_t*>(t.data_ptr());
  return I(p, p + t.numel());
}
Tensor random_tensor(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  for (std::int64_t i = 0; i < t.numel(); ++i) static_cast<float*>(t.data_ptr())[i] = dist(rng);
  return t;
}

struct NodeBuilder {
  Node node;
  NodeBuilder(const std::string& op, std::size_t inputs, std::size_t outputs = 1) {
    node.op_type = op;
    node.name = "n";
    // Names appended rather than concatenated with operator+: GCC 12 at -O3 reports a false -Wrestrict there.
    for (std::size_t i = 0; i < inputs; ++i) node.inputs.push_back(std::string("x").append(std::to_string(i)));
    for (std::size_t i = 0; i < outputs; ++i) node.outputs.push_back(std::string("y").append(std::to_string(i)));
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

void expect_near_all(const F& actual, const std::vector<double>& expected, double tol = 1e-4) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], tol * (1 + std::fabs(expected[i]))) << "at " << i;
  }
}

Shape strides_of(const Shape& shape) {
  Shape s(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// ---- MatMul / Gemm ----

TEST(OnnxRefNn, MatMulBroadcastAndVectorsAgainstNaiveLoops) {
  std::mt19937 rng(1);
  struct Case {
    Shape a, b, out;
  };
  const std::vector<Case> cases = {
      {{3, 4}, {4, 5}, {3, 5}},
      {{2, 1, 3, 4}, {3, 4, 2}, {2, 3, 3, 2}},
      {{4}, {4, 5}, {5}},
      {{2, 3, 4}, {4}, {2, 3}},
      {{4}, {4}, {}},
      {{0, 3}, {3, 2}, {0, 2}},
      {{2, 3, 0}, {0, 2}, {2, 3, 2}},
  };
  for (const Case& c : cases) {
    const Tensor a = random_tensor(c.a, rng), b = random_tensor(c.b, rng);
    const Tensor y = run1(NodeBuilder("MatMul", 2), 13, {a, b});
    ASSERT_EQ(y.shape(), c.out);
    // Naive: promote to >= 2-D, broadcast batch.
    Shape as = c.a, bs = c.b;
    if (as.size() == 1) as.insert(as.begin(), 1);
    if (bs.size() == 1) bs.push_back(1);
    const std::int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
    const std::size_t batch_rank = std::max(as.size(), bs.size()) - 2;
    Shape batch(batch_rank, 1);
    for (std::size_t i = 0; i < batch_rank; ++i) {
      const std::int64_t ai = static_cast<std::int64_t>(i) - static_cast<std::int64_t>(batch_rank - (as.size() - 2));
      const std::int64_t bi = static_cast<std::int64_t>(i) - static_cast<std::int64_t>(batch_rank - (bs.size() - 2));
      const std::int64_t da = ai >= 0 ? as[static_cast<std::size_t>(ai)] : 1,
                         db = bi >= 0 ? bs[static_cast<std::size_t>(bi)] : 1;
      batch[i] = std::max(da, db);
    }
    std::int64_t nb = 1;
    for (std::int64_t d : batch) nb *= d;
    std::vector<double> expected;
    const F av = valf(a), bv = valf(b);
    for (std::int64_t bi = 0; bi < nb; ++bi) {
      // Decompose bi into the batch index, then into a's and b's batch offsets.
      std::int64_t rem = bi, aoff = 0, boff = 0, astride = m * k, bstride = k * n;
      for (std::size_t d = batch_rank; d-- > 0;) {
        const std::int64_t idx = rem % batch[d];
        rem /= batch[d];
        const std::int64_t ad = static_cast<std::int64_t>(d) - static_cast<std::int64_t>(batch_rank - (as.size() - 2));
        const std::int64_t bd = static_cast<std::int64_t>(d) - static_cast<std::int64_t>(batch_rank - (bs.size() - 2));
        if (ad >= 0) {
          if (as[static_cast<std::size_t>(ad)] != 1) aoff += idx * astride;
          astride *= as[static_cast<std::size_t>(ad)];
        }
        if (bd >= 0) {
          if (bs[static_cast<std::size_t>(bd)] != 1) boff += idx * bstride;
          bstride *= bs[static_cast<std::size_t>(bd)];
        }
      }
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::int64_t p = 0; p < k; ++p)
            s += static_cast<double>(av[static_cast<std::size_t>(aoff + i * k + p)]) *
                 bv[static_cast<std::size_t>(boff + p * n + j)];
          expected.push_back(s);
        }
      }
    }
    expect_near_all(valf(y), expected);
  }
}

TEST(OnnxRefNn, MatMulIntegersAndErrors) {
  Tensor a = Tensor::empty({2, 2}, DType::kInt32), b = Tensor::empty({2, 2}, DType::kInt32);
  const std::int32_t av[] = {1, 2, 3, 4}, bv[] = {5, 6, 7, 8};
  std::copy(av, av + 4, static_cast<std::int32_t*>(a.data_ptr()));
  std::copy(bv, bv + 4, static_cast<std::int32_t*>(b.data_ptr()));
  const Tensor y = run1(NodeBuilder("MatMul", 2), 13, {a, b});
  ASSERT_EQ(y.dtype(), DType::kInt32);
  const auto* p = static_cast<const std::int32_t*>(y.data_ptr());
  EXPECT_EQ(std::vector<std::int32_t>(p, p + 4), (std::vector<std::int32_t>{19, 22, 43, 50}));
  XPURT_EXPECT_THROW_WITH(run1(NodeBuilder("MatMul", 2), 13, {makef({2, 3}, F(6, 1)), makef({2, 3}, F(6, 1))}),
                          InvalidArgumentError, "inner dimensions");
}

TEST(OnnxRefNn, GemmAttributesAgainstNaive) {
  std::mt19937 rng(2);
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (const Shape& cshape : {Shape{}, Shape{1}, Shape{5}, Shape{3, 1}, Shape{3, 5}}) {
        const std::int64_t M = 3, N = 5, K = 4;
        const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, rng);
        const Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, rng);
        const Tensor c = random_tensor(cshape, rng);
        NodeBuilder nb("Gemm", 3);
        nb.attr("transA", std::int64_t{ta}).attr("transB", std::int64_t{tb}).attr("alpha", 0.5).attr("beta", 2.0);
        const Tensor y = run1(nb, 13, {a, b, c});
        ASSERT_EQ(y.shape(), Shape({M, N}));
        const F av = valf(a), bv = valf(b), cv = valf(c);
        const Shape cst = cshape.size() == 2 ? Shape{cshape[0] == 1 ? 0 : cshape[1], cshape[1] == 1 ? 0 : 1}
                                             : Shape{0, cshape.empty() || cshape[0] == 1 ? 0 : 1};
        std::vector<double> expected;
        for (std::int64_t i = 0; i < M; ++i) {
          for (std::int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (std::int64_t p = 0; p < K; ++p) {
              s += static_cast<double>(av[static_cast<std::size_t>(ta ? p * M + i : i * K + p)]) *
                   bv[static_cast<std::size_t>(tb ? j * K + p : p * N + j)];
            }
            expected.push_back(0.5 * s + 2.0 * cv[static_cast<std::size_t>(i * cst[0] + j * cst[1])]);
          }
        }
        expect_near_all(valf(y), expected);
      }
    }
  }
  // C is optional from opset 11.
  const Tensor y = run1(NodeBuilder("Gemm", 2), 11, {makef({1, 2}, {1, 2}), makef({2, 1}, {3, 4})});
  EXPECT_EQ(valf(y), F({11}));
}

// ---- Conv / ConvTranspose ----

struct ConvCase {
  Shape x, w;
  Shape strides, dilations, pads;
  std::int64_t group;
};

// Direct convolution in double.
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, const ConvCase& c, Shape& out_shape) {
  const std::size_t rank = c.x.size() - 2;
  const std::int64_t N = c.x[0], C = c.x[1], M = c.w[0], Cg = C / c.group, Mg = M / c.group;
  Shape out_sp(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    out_sp[d] =
        (c.x[d + 2] + c.pads[d] + c.pads[d + rank] - ((c.w[d + 2] - 1) * c.dilations[d] + 1)) / c.strides[d] + 1;
  }
  out_shape = {N, M};
  out_shape.insert(out_shape.end(), out_sp.begin(), out_sp.end());
  const F xv = valf(x), wv = valf(w), bv = valf(b);
  const Shape xs = strides_of(c.x), ws = strides_of(c.w);
  std::vector<double> y;
  const Shape ksp(c.w.begin() + 2, c.w.end());
  std::int64_t out_total = 1, k_total = 1;
  for (std::int64_t v : out_sp) out_total *= v;
  for (std::int64_t v : ksp) k_total *= v;
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t m = 0; m < M; ++m) {
      const std::int64_t g = m / Mg;
      for (std::int64_t o = 0; o < out_total; ++o) {
        Shape oi(rank);
        std::int64_t rem = o;
        for (std::size_t d = rank; d-- > 0;) {
          oi[d] = rem % out_sp[d];
          rem /= out_sp[d];
        }
        double s = bv[static_cast<std::size_t>(m)];
        for (std::int64_t ci = 0; ci < Cg; ++ci) {
          for (std::int64_t kk = 0; kk < k_total; ++kk) {
            Shape ki(rank);
            std::int64_t r2 = kk;
            for (std::size_t d = rank; d-- > 0;) {
              ki[d] = r2 % ksp[d];
              r2 /= ksp[d];
            }
            std::int64_t xoff = n * xs[0] + (g * Cg + ci) * xs[1], woff = m * ws[0] + ci * ws[1];
            bool inside = true;
            for (std::size_t d = 0; d < rank; ++d) {
              const std::int64_t pos = oi[d] * c.strides[d] - c.pads[d] + ki[d] * c.dilations[d];
              if (pos < 0 || pos >= c.x[d + 2]) inside = false;
              xoff += pos * xs[d + 2];
              woff += ki[d] * ws[d + 2];
            }
            if (inside)
              s += static_cast<double>(xv[static_cast<std::size_t>(xoff)]) * wv[static_cast<std::size_t>(woff)];
          }
        }
        y.push_back(s);
      }
    }
  }
  return y;
}

NodeBuilder conv_node(const std::string& op, const ConvCase& c) {
  NodeBuilder nb(op, 3);
  nb.attr("strides", c.strides).attr("dilations", c.dilations).attr("pads", c.pads).attr("group", c.group);
  return nb;
}

TEST(OnnxRefNn, ConvAgainstDirectConvolution) {
  std::mt19937 rng(3);
  const std::vector<ConvCase> cases = {
      {{1, 1, 5, 5}, {1, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1},
      {{2, 4, 7, 6}, {6, 2, 3, 2}, {2, 1}, {1, 2}, {1, 0, 2, 1}, 2},
      {{1, 3, 9}, {4, 3, 3}, {2}, {3}, {2, 1}, 1},
      {{1, 2, 4, 5, 3}, {2, 1, 2, 3, 2}, {1, 2, 1}, {1, 1, 2}, {0, 1, 1, 1, 0, 0}, 2},
      {{2, 3, 4, 4}, {5, 3, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 1},  // 1x1: the direct GEMM path
  };
  for (const ConvCase& c : cases) {
    const Tensor x = random_tensor(c.x, rng), w = random_tensor(c.w, rng), b = random_tensor({c.w[0]}, rng);
    Shape out_shape;
    const std::vector<double> expected = naive_conv(x, w, b, c, out_shape);
    const Tensor y = run1(conv_node("Conv", c), 11, {x, w, b});
    ASSERT_EQ(y.shape(), out_shape);
    expect_near_all(valf(y), expected);
  }
}

TEST(OnnxRefNn, ConvAutoPadAndBasicValues) {
  // The ONNX basic_conv case: 5x5 input 0..24, 3x3 ones kernel, pads 1: corners sum 4 values.
  F xs(25);
  for (int i = 0; i < 25; ++i) xs[static_cast<std::size_t>(i)] = static_cast<float>(i);
  const Tensor x = makef({1, 1, 5, 5}, xs), w = makef({1, 1, 3, 3}, F(9, 1.0f));
  NodeBuilder nb("Conv", 2);
  nb.attr("pads", Shape{1, 1, 1, 1});
  const F y = valf(run1(nb, 11, {x, w}));
  EXPECT_EQ(y[0], 12.0f);    // 0+1+5+6
  EXPECT_EQ(y[12], 108.0f);  // 9 * 12
  NodeBuilder same("Conv", 2);
  same.attr("auto_pad", std::string("SAME_UPPER")).attr("strides", Shape{2, 2});
  const Tensor ys = run1(same, 11, {x, w});
  EXPECT_EQ(ys.shape(), Shape({1, 1, 3, 3}));
  // SAME_UPPER with stride 2 on 5: total pad 2, one each side: first output = 0+1+5+6.
  EXPECT_EQ(valf(ys)[0], 12.0f);
  XPURT_EXPECT_THROW_WITH(run1(NodeBuilder("Conv", 2), 11, {x, makef({1, 2, 3, 3}, F(18, 1.0f))}), InvalidArgumentError,
                          "input channels");
}

TEST(OnnxRefNn, ConvTransposeIsTheAdjointOfConv) {
  // <conv(x, w), y> == <x, conv_transpose(y, w)> for matching strides/pads/dilations/groups.
  std::mt19937 rng(4);
  struct Case {
    Shape x, w, strides, dilations, pads;
    std::int64_t group;
  };
  const std::vector<Case> cases = {
      {{1, 2, 7, 6}, {4, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 1},
      {{2, 4, 8}, {6, 2, 3}, {3}, {2}, {2, 1}, 2},
      {{1, 2, 5, 4, 4}, {2, 2, 2, 3, 2}, {1, 2, 1}, {2, 1, 1}, {0, 1, 0, 1, 0, 1}, 1},
  };
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.x, rng), w = random_tensor(c.w, rng);
    NodeBuilder conv("Conv", 2);
    conv.attr("strides", c.strides).attr("dilations", c.dilations).attr("pads", c.pads).attr("group", c.group);
    const Tensor cx = run1(conv, 11, {x, w});
    const Tensor y = random_tensor(cx.shape(), rng);
    // ConvTranspose weight layout is [C_in_of_transpose = M, C/group, k...]: the same tensor w.
    NodeBuilder ct("ConvTranspose", 2);
    ct.attr("strides", c.strides).attr("dilations", c.dilations).attr("pads", c.pads).attr("group", c.group);
    // The transposed conv's natural output can be shorter than x (the stride remainder): output_padding adds it.
    const std::size_t rank = c.x.size() - 2;
    Shape output_padding(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      const std::int64_t natural =
          c.strides[d] * (cx.shape()[d + 2] - 1) + (c.w[d + 2] - 1) * c.dilations[d] + 1 - c.pads[d] - c.pads[d + rank];
      output_padding[d] = c.x[d + 2] - natural;
    }
    ct.attr("output_padding", output_padding);
    const Tensor ty = run1(ct, 11, {y, w});
    ASSERT_EQ(ty.shape(), c.x);
    double lhs = 0, rhs = 0;
    const F cxv = valf(cx), yv = valf(y), xv = valf(x), tyv = valf(ty);
    for (std::size_t i = 0; i < cxv.size(); ++i) lhs += static_cast<double>(cxv[i]) * yv[i];
    for (std::size_t i = 0; i < xv.size(); ++i) rhs += static_cast<double>(xv[i]) * tyv[i];
    EXPECT_NEAR(lhs, rhs, 1e-3 * (1 + std::fabs(lhs)));
  }
}

TEST(OnnxRefNn, ConvTransposeShapesAndValues) {
  // ONNX's convtranspose case: 3x3 input 0..8, two 3x3 ones kernels -> 5x5.
  F xs(9);
  for (int i = 0; i < 9; ++i) xs[static_cast<std::size_t>(i)] = static_cast<float>(i);
  const Tensor x = makef({1, 1, 3, 3}, xs), w = makef({1, 2, 3, 3}, F(18, 1.0f));
  const Tensor y = run1(NodeBuilder("ConvTranspose", 2), 11, {x, w});
  ASSERT_EQ(y.shape(), Shape({1, 2, 5, 5}));
  const F yv = valf(y);
  const F row0 = {0, 1, 3, 3, 2};
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(yv[i], row0[i]);
  EXPECT_EQ(yv[12], 36.0f);  // the center sees all 9 inputs
  NodeBuilder padded("ConvTranspose", 2);
  padded.attr("strides", Shape{3, 2}).attr("output_padding", Shape{1, 1});
  EXPECT_EQ(run1(padded, 11, {x, w}).shape(), Shape({1, 2, 10, 8}));
  NodeBuilder same("ConvTranspose", 2);
  same.attr("strides", Shape{2, 2}).attr("auto_pad", std::string("SAME_UPPER"));
  EXPECT_EQ(run1(same, 11, {x, w}).shape(), Shape({1, 2, 6, 6}));
}

TEST(OnnxRefNn, Col2ImAndDeformConv) {
  // ONNX's Col2Im example: blocks [1, 5] over a 5x5 image put column w of the input at image column w.
  F xs(25);
  for (int i = 0; i < 25; ++i) xs[static_cast<std::size_t>(i)] = static_cast<float>(i + 1);
  const Tensor img = run1(NodeBuilder("Col2Im", 3), 18, {makef({1, 5, 5}, xs), makei({2}, {5, 5}), makei({2}, {1, 5})});
  ASSERT_EQ(img.shape(), Shape({1, 1, 5, 5}));
  const F iv = valf(img);
  for (std::size_t h = 0; h < 5; ++h) {
    for (std::size_t w = 0; w < 5; ++w) EXPECT_EQ(iv[h * 5 + w], static_cast<float>(w * 5 + h + 1));
  }
  // DeformConv with zero offsets and a unit mask is Conv.
  std::mt19937 rng(7);
  const Tensor x = random_tensor({1, 4, 6, 5}, rng), w = random_tensor({4, 2, 3, 2}, rng), b = random_tensor({4}, rng);
  NodeBuilder conv("Conv", 3);
  conv.attr("group", std::int64_t{2}).attr("pads", Shape{1, 0, 1, 1}).attr("strides", Shape{2, 1});
  const Tensor expected = run1(conv, 11, {x, w, b});
  const Shape os = expected.shape();
  NodeBuilder dc("DeformConv", 5);
  dc.attr("group", std::int64_t{2}).attr("pads", Shape{1, 0, 1, 1}).attr("strides", Shape{2, 1});
  dc.attr("offset_group", std::int64_t{2});
  const Tensor offsets = makef({1, 2 * 2 * 6, os[2], os[3]}, F(static_cast<std::size_t>(24 * os[2] * os[3]), 0.0f));
  const Tensor mask = makef({1, 2 * 6, os[2], os[3]}, F(static_cast<std::size_t>(12 * os[2] * os[3]), 1.0f));
  const F dy = valf(run1(dc, 19, {x, w, offsets, b, mask}));
  const F ey = valf(expected);
  std::vector<double> ed(ey.begin(), ey.end());
  expect_near_all(dy, ed);
  // An offset of exactly one row reads the next row (a 1x1 kernel over [[1, 2], [3, 4]]).
  NodeBuilder shift("DeformConv", 3);
  const F shifted = valf(run1(
      shift, 19,
      {makef({1, 1, 2, 2}, {1, 2, 3, 4}), makef({1, 1, 1, 1}, {1}), makef({1, 2, 2, 2}, {1, 1, 1, 1, 0, 0, 0, 0})}));
  EXPECT_EQ(shifted, F({3, 4, 0, 0}));
}

// ---- pools ----

TEST(OnnxRefNn, MaxPoolWithIndicesAndCeilMode) {
  F xs(16);
  for (int i = 0; i < 16; ++i) xs[static_cast<std::size_t>(i)] = static_cast<float>((i * 7) % 16);
  const Tensor x = makef({1, 1, 4, 4}, xs);
  NodeBuilder nb("MaxPool", 1, 2);
  nb.attr("kernel_shape", Shape{2, 2}).attr("strides", Shape{2, 2});
  auto out = run(nb, 12, {x});
  ASSERT_EQ(out[0].shape(), Shape({1, 1, 2, 2}));
  const F y = valf(out[0]);
  const I idx = vali(out[1]);
  for (std::size_t o = 0; o < 4; ++o) {
    EXPECT_EQ(y[o], xs[static_cast<std::size_t>(idx[o])]);
    const std::int64_t r0 = static_cast<std::int64_t>(o / 2) * 2, c0 = static_cast<std::int64_t>(o % 2) * 2;
    float best = -1;
    for (std::int64_t r = r0; r < r0 + 2; ++r) {
      for (std::int64_t c = c0; c < c0 + 2; ++c) best = std::max(best, xs[static_cast<std::size_t>(r * 4 + c)]);
    }
    EXPECT_EQ(y[o], best);
  }
  // Column-major indices: (h, w) -> h + w * H.
  nb.attr("storage_order", std::int64_t{1});
  const I cidx = vali(run(nb, 12, {x})[1]);
  for (std::size_t o = 0; o < 4; ++o) EXPECT_EQ(cidx[o], (idx[o] / 4) + (idx[o] % 4) * 4);
  // ceil_mode: 4 with kernel 3 stride 2 -> 2 outputs instead of 1.
  NodeBuilder ceil("MaxPool", 1);
  ceil.attr("kernel_shape", Shape{3, 3}).attr("strides", Shape{2, 2}).attr("ceil_mode", std::int64_t{1});
  EXPECT_EQ(run1(ceil, 12, {x}).shape(), Shape({1, 1, 2, 2}));
}

TEST(OnnxRefNn, AveragePoolPaddingCounts) {
  const Tensor x = makef({1, 1, 2, 2}, {1, 2, 3, 4});
  NodeBuilder nb("AveragePool", 1);
  nb.attr("kernel_shape", Shape{2, 2}).attr("pads", Shape{1, 1, 1, 1});
  // Corner window holds one real value.
  EXPECT_EQ(valf(run1(nb, 11, {x})), F({1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4}));
  nb.attr("count_include_pad", std::int64_t{1});
  EXPECT_EQ(valf(run1(nb, 11, {x}))[0], 0.25f);
  NodeBuilder lp("LpPool", 1);
  lp.attr("kernel_shape", Shape{2, 2});
  EXPECT_NEAR(valf(run1(lp, 11, {x}))[0], std::sqrt(30.0f), 1e-5);
  EXPECT_EQ(valf(run1(NodeBuilder("GlobalAveragePool", 1), 11, {x})), F({2.5f}));
  EXPECT_EQ(valf(run1(NodeBuilder("GlobalMaxPool", 1), 11, {x})), F({4}));
}

TEST(OnnxRefNn, MaxUnpoolInvertsMaxPoolIndices) {
  const Tensor x = makef({1, 1, 2, 2}, {5, 6, 7, 8});
  const Tensor idx = makei({1, 1, 2, 2}, {5, 7, 13, 15});
  NodeBuilder nb("MaxUnpool", 2);
  nb.attr("kernel_shape", Shape{2, 2}).attr("strides", Shape{2, 2});
  const Tensor y = run1(nb, 11, {x, idx});
  ASSERT_EQ(y.shape(), Shape({1, 1, 4, 4}));
  F expected(16, 0.0f);
  expected[5] = 5;
  expected[7] = 6;
  expected[13] = 7;
  expected[15] = 8;
  EXPECT_EQ(valf(y), expected);
}

// ---- normalizations ----

TEST(OnnxRefNn, LayerAndGroupNormalizationStatistics) {
  std::mt19937 rng(5);
  const Tensor x = random_tensor({2, 3, 4}, rng, -3, 3);
  NodeBuilder ln("LayerNormalization", 3, 3);
  ln.attr("axis", std::int64_t{-2});
  auto out = run(ln, 17, {x, makef({3, 4}, F(12, 1.0f)), makef({4}, F(4, 0.0f))});
  ASSERT_EQ(out[1].shape(), Shape({2, 1, 1}));
  const F y = valf(out[0]), xv = valf(x), mean = valf(out[1]), inv = valf(out[2]);
  for (std::size_t r = 0; r < 2; ++r) {
    double m = 0, v = 0, xm = 0;
    for (std::size_t i = 0; i < 12; ++i) {
      m += y[r * 12 + i];
      xm += xv[r * 12 + i];
    }
    for (std::size_t i = 0; i < 12; ++i) v += y[r * 12 + i] * y[r * 12 + i];
    EXPECT_NEAR(m / 12, 0.0, 1e-5);
    EXPECT_NEAR(v / 12, 1.0, 1e-3);
    EXPECT_NEAR(mean[r], xm / 12, 1e-5);
    EXPECT_NEAR((xv[r * 12] - mean[r]) * inv[r], y[r * 12], 1e-5);
  }
  // GroupNormalization (opset 18, scale per group): groups of 2 channels over [1, 4, 3].
  const Tensor gx = random_tensor({1, 4, 3}, rng);
  NodeBuilder gn("GroupNormalization", 3);
  gn.attr("num_groups", std::int64_t{2});
  const F gy = valf(run1(gn, 18, {gx, makef({2}, {2, 1}), makef({2}, {1, 0})}));
  for (std::size_t g = 0; g < 2; ++g) {
    double m = 0;
    for (std::size_t i = 0; i < 6; ++i) m += gy[g * 6 + i];
    EXPECT_NEAR(m / 6, g == 0 ? 1.0 : 0.0, 1e-5);
  }
  // Opset 21: one scale/bias per channel.
  const F cy = valf(run1(gn, 21, {gx, makef({4}, {1, 1, 1, 1}), makef({4}, {0, 1, 2, 3})}));
  // Channels 0, 1 form group 0 (zero mean over both), so their outputs average to the mean of biases 0 and 1.
  for (std::size_t g = 0; g < 2; ++g) {
    double pair = 0;
    for (std::size_t i = 0; i < 6; ++i) pair += cy[g * 6 + i];
    EXPECT_NEAR(pair / 6, g == 0 ? 0.5 : 2.5, 1e-5);
  }
}

TEST(OnnxRefNn, BatchNormalizationInferenceAndTraining) {
  const Tensor x = makef({2, 2, 1}, {1, 2, 3, 4});
  const Tensor scale = makef({2}, {1, 2}), bias = makef({2}, {0, 1}), mean = makef({2}, {1, 2}),
               var = makef({2}, {4, 1});
  NodeBuilder nb("BatchNormalization", 5);
  nb.attr("epsilon", 0.0);
  EXPECT_EQ(valf(run1(nb, 15, {x, scale, bias, mean, var})), F({0, 1, 1, 5}));
  NodeBuilder tr("BatchNormalization", 5, 3);
  tr.attr("epsilon", 0.0).attr("training_mode", std::int64_t{1}).attr("momentum", 0.5);
  auto out = run(tr, 15, {x, scale, bias, mean, var});
  // Channel 0 holds {1, 3}: batch mean 2, var 1; channel 1 {2, 4}: mean 3, var 1.
  EXPECT_EQ(valf(out[0]), F({-1, -1, 1, 3}));
  EXPECT_EQ(valf(out[1]), F({1.5f, 2.5f}));
  EXPECT_EQ(valf(out[2]), F({2.5f, 1}));
}

TEST(OnnxRefNn, InstanceNormLrnMvnLpNorm) {
  const Tensor x = makef({1, 2, 2}, {1, 3, 2, 2});
  const F in = valf(run1(NodeBuilder("InstanceNormalization", 3), 6, {x, makef({2}, {1, 1}), makef({2}, {0, 5})}));
  EXPECT_NEAR(in[0], -1.0f, 1e-4);
  EXPECT_NEAR(in[1], 1.0f, 1e-4);
  EXPECT_NEAR(in[2], 5.0f, 1e-4);
  NodeBuilder lrn("LRN", 1);
  lrn.attr("size", std::int64_t{3}).attr("alpha", 3.0).attr("beta", 1.0).attr("bias", 1.0);
  // Channel 0 sees channels 0 and 1: 1 + 3/3 * (1 + 4) = 6.
  EXPECT_NEAR(valf(run1(lrn, 13, {makef({1, 2, 1}, {1, 2})}))[0], 1.0f / 6, 1e-6);
  NodeBuilder mvn("MeanVarianceNormalization", 1);
  mvn.attr("axes", Shape{2});
  const F m = valf(run1(mvn, 13, {x}));
  EXPECT_NEAR(m[0], -1.0f, 1e-6);
  EXPECT_NEAR(m[2], 0.0f, 1e-6);
  NodeBuilder lp("LpNormalization", 1);
  lp.attr("p", std::int64_t{1});
  EXPECT_EQ(valf(run1(lp, 1, {makef({2}, {1, 3})})), F({0.25f, 0.75f}));
}

// ---- Resize and friends ----

TEST(OnnxRefNn, ResizeModes) {
  const Tensor x = makef({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor empty_roi = makef({0}, {});
  NodeBuilder nearest("Resize", 3);
  const Tensor up = run1(nearest, 13, {x, empty_roi, makef({4}, {1, 1, 2, 3})});
  ASSERT_EQ(up.shape(), Shape({1, 1, 4, 6}));
  EXPECT_EQ(valf(up), F({1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4}));
  NodeBuilder linear("Resize", 4);
  linear.attr("mode", std::string("linear")).attr("coordinate_transformation_mode", std::string("align_corners"));
  const Tensor lin = run1(linear, 13, {x, Tensor(), Tensor(), makei({4}, {1, 1, 3, 3})});
  EXPECT_EQ(valf(lin), F({1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4}));
  // Cubic at scale 1 with half_pixel is the identity.
  NodeBuilder cubic("Resize", 3);
  cubic.attr("mode", std::string("cubic"));
  EXPECT_EQ(valf(run1(cubic, 13, {x, Tensor(), makef({4}, {1, 1, 1, 1})})), valf(x));
  // Opset 18 axes + keep_aspect_ratio_policy: sizes [4, 3] on a 2x2 image, not_larger -> scale 1.5 -> 3x3.
  NodeBuilder keep("Resize", 4);
  keep.attr("axes", Shape{2, 3}).attr("keep_aspect_ratio_policy", std::string("not_larger"));
  EXPECT_EQ(run1(keep, 18, {x, Tensor(), Tensor(), makei({2}, {4, 3})}).shape(), Shape({1, 1, 3, 3}));
  XPURT_EXPECT_THROW_WITH(run1(nearest, 13, {x, Tensor(), Tensor()}), InvalidArgumentError, "scales");
  // A scale or size whose output dim is past int64's range is a typed error, not an undefined conversion (UBSan found
  // the scale case through fuzz_model_structure_native).
  XPURT_EXPECT_THROW_WITH(run1(nearest, 13, {x, empty_roi, makef({4}, {1, 1, 1e30f, 1})}), InvalidArgumentError,
                          "larger than any tensor can be");
  const std::int64_t largest = std::numeric_limits<std::int64_t>::max();
  XPURT_EXPECT_THROW_WITH(run1(keep, 18, {x, Tensor(), Tensor(), makei({2}, {largest, largest})}), InvalidArgumentError,
                          "larger than any tensor can be");
  XPURT_EXPECT_THROW_WITH(
      run1(NodeBuilder("Resize", 4), 13, {x, Tensor(), makef({4}, {1, 1, 2, 2}), makei({4}, {1, 1, 4, 4})}),
      InvalidArgumentError, "both");
}

TEST(OnnxRefNn, ResizeAntialiasStretchesTheFilter) {
  // Linear, scale 0.5, half_pixel: output 0 samples x = 0.5 with the filter stretched to 4 taps
  // (0.125, 0.375, 0.375, 0.125) at -1..2 (edge-clamped): 0.125 + 0.375 + 0.75 + 0.375.
  NodeBuilder nb("Resize", 3);
  nb.attr("mode", std::string("linear")).attr("antialias", std::int64_t{1});
  const Tensor x = makef({1, 1, 1, 4}, {1, 2, 3, 4});
  const F y = valf(run1(nb, 18, {x, Tensor(), makef({4}, {1, 1, 1, 0.5f})}));
  ASSERT_EQ(y.size(), 2u);
  EXPECT_NEAR(y[0], 1.625f, 1e-6);
  EXPECT_NEAR(y[1], 3.375f, 1e-6);
  // Without antialias the same resize is plain linear at x = 0.5 and 2.5.
  nb.attr("antialias", std::int64_t{0});
  EXPECT_EQ(valf(run1(nb, 18, {x, Tensor(), makef({4}, {1, 1, 1, 0.5f})})), F({1.5f, 3.5f}));
}

TEST(OnnxRefNn, UpsampleAndGridSample) {
  const Tensor x = makef({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor up = run1(NodeBuilder("Upsample", 2), 9, {x, makef({4}, {1, 1, 2, 2})});
  EXPECT_EQ(valf(up), F({1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // Upsample-7 takes the scales as an attribute.
  NodeBuilder up7("Upsample", 1);
  up7.attr("scales", std::vector<double>{1, 1, 1, 3});
  EXPECT_EQ(valf(run1(up7, 7, {x})), F({1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}));
  // Resize-10 nearest rounds up along a shrinking axis (ONNX's Resize-10 test: [1 2 3 4] * 0.6 -> [1 3]).
  const Tensor row = makef({1, 1, 1, 4}, {1, 2, 3, 4});
  EXPECT_EQ(valf(run1(NodeBuilder("Resize", 2), 10, {row, makef({4}, {1, 1, 1, 0.6f})})), F({1, 3}));
  // align_corners grid at the corners and the center.
  NodeBuilder gs("GridSample", 2);
  gs.attr("align_corners", std::int64_t{1});
  const Tensor grid = makef({1, 1, 3, 2}, {-1, -1, 1, 1, 0, 0});
  EXPECT_EQ(valf(run1(gs, 16, {x, grid})), F({1, 4, 2.5f}));
  // zeros padding outside, border clamps.
  const Tensor outside = makef({1, 1, 1, 2}, {3, 0});
  EXPECT_EQ(valf(run1(gs, 16, {x, outside}))[0], 0.0f);
  gs.attr("padding_mode", std::string("border"));
  EXPECT_EQ(valf(run1(gs, 16, {x, outside}))[0], 3.0f);
}

TEST(OnnxRefNn, AffineGridAndMaxRoiPool) {
  // The identity transform gives the base grid: pixel centers in [-1, 1] (align_corners=0) as (x, y).
  NodeBuilder ag("AffineGrid", 2);
  const F g = valf(run1(ag, 20, {makef({1, 2, 3}, {1, 0, 0, 0, 1, 0}), makei({4}, {1, 1, 2, 2})}));
  EXPECT_EQ(g, F({-0.5f, -0.5f, 0.5f, -0.5f, -0.5f, 0.5f, 0.5f, 0.5f}));
  ag.attr("align_corners", std::int64_t{1});
  const F gc = valf(run1(ag, 20, {makef({1, 2, 3}, {2, 0, 0.5f, 0, 1, 0}), makei({4}, {1, 1, 1, 2})}));
  EXPECT_EQ(gc, F({-1.5f, 0, 2.5f, 0}));  // x scaled by 2 and shifted by 0.5; H == 1 gives y = 0
  // MaxRoiPool: the whole 4x4 image in 2x2 bins holds each quadrant's max.
  F xs(16);
  for (int i = 0; i < 16; ++i) xs[static_cast<std::size_t>(i)] = static_cast<float>(i);
  NodeBuilder mrp("MaxRoiPool", 2);
  mrp.attr("pooled_shape", Shape{2, 2});
  EXPECT_EQ(valf(run1(mrp, 1, {makef({1, 1, 4, 4}, xs), makef({1, 5}, {0, 0, 0, 3, 3})})), F({5, 7, 13, 15}));
  // A batch index or coordinate no int64 holds (NaN, 1e30) is a typed error, not an undefined conversion.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  XPURT_EXPECT_THROW_WITH(run1(mrp, 1, {makef({1, 1, 4, 4}, xs), makef({1, 5}, {nan, 0, 0, 3, 3})}),
                          InvalidArgumentError, "batch index");
  XPURT_EXPECT_THROW_WITH(run1(mrp, 1, {makef({1, 1, 4, 4}, xs), makef({1, 5}, {0, 0, 0, 1e30f, 3})}),
                          InvalidArgumentError, "is not a pixel position");
}

TEST(OnnxRefNn, RoiAlignAverageOfConstantIsConstant) {
  const Tensor x = makef({1, 1, 4, 4}, F(16, 3.0f));
  NodeBuilder nb("RoiAlign", 3);
  nb.attr("output_height", std::int64_t{2})
      .attr("output_width", std::int64_t{2})
      .attr("sampling_ratio", std::int64_t{2});
  const Tensor y = run1(nb, 16, {x, makef({1, 4}, {0.5f, 0.5f, 2.5f, 2.5f}), makei({1}, {0})});
  ASSERT_EQ(y.shape(), Shape({1, 1, 2, 2}));
  for (float v : valf(y)) EXPECT_NEAR(v, 3.0f, 1e-6);
  // The adaptive sampling grid (sampling_ratio 0) of an absurd or NaN ROI is a typed error, not an endless loop or an
  // undefined conversion.
  NodeBuilder adaptive("RoiAlign", 3);
  adaptive.attr("output_height", std::int64_t{2}).attr("output_width", std::int64_t{2});
  EXPECT_NEAR(valf(run1(adaptive, 16, {x, makef({1, 4}, {0.5f, 0.5f, 2.5f, 2.5f}), makei({1}, {0})}))[0], 3.0f, 1e-6);
  XPURT_EXPECT_THROW_WITH(run1(adaptive, 16, {x, makef({1, 4}, {0, 0, 1e30f, 2}), makei({1}, {0})}),
                          InvalidArgumentError, "needs a sampling grid of");
  XPURT_EXPECT_THROW_WITH(run1(adaptive, 16, {x, makef({1, 4}, {0, 0, 2, -1e30f}), makei({1}, {0})}),
                          InvalidArgumentError, "needs a sampling grid of");
  XPURT_EXPECT_THROW_WITH(run1(adaptive, 16, {x, makef({1, 4}, {0, std::numeric_limits<float>::quiet_NaN(), 2, 2}),
                                              makei({1}, {0})}),
                          InvalidArgumentError, "needs a sampling grid of");
}

TEST(OnnxRefNn, NonMaxSuppressionSuppressesByIou) {
  // ONNX's suppress_by_IOU case.
  const Tensor boxes = makef(
      {1, 6, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.1f, 0, -0.1f, 1, 0.9f, 0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100, 1, 101});
  const Tensor scores = makef({1, 1, 6}, {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f});
  const I selected = vali(run1(NodeBuilder("NonMaxSuppression", 5), 11,
                               {boxes, scores, makei({1}, {3}), makef({1}, {0.5f}), makef({1}, {0.0f})}));
  EXPECT_EQ(selected, I({0, 0, 3, 0, 0, 0, 0, 0, 5}));
}

// ---- recurrent ----

TEST(OnnxRefNn, RnnGruLstmHandChecked) {
  // One step, hidden 1, input 1: RNN h = tanh(w x + r h0 + wb + rb).
  const Tensor x = makef({1, 1, 1}, {0.5f});
  NodeBuilder rnn("RNN", 6, 2);
  rnn.attr("hidden_size", std::int64_t{1});
  auto out = run(rnn, 14,
                 {x, makef({1, 1, 1}, {2}), makef({1, 1, 1}, {3}), makef({1, 2}, {0.1f, 0.2f}), Tensor(),
                  makef({1, 1, 1}, {0.5f})});
  EXPECT_NEAR(valf(out[1])[0], std::tanh(1 + 1.5 + 0.3), 1e-6);
  // GRU with zero weights: z = r = 0.5, h~ = 0 -> h = 0.5 * h0.
  NodeBuilder gru("GRU", 6, 2);
  gru.attr("hidden_size", std::int64_t{1});
  out = run(gru, 14,
            {x, makef({1, 3, 1}, F(3, 0)), makef({1, 3, 1}, F(3, 0)), Tensor(), Tensor(), makef({1, 1, 1}, {0.8f})});
  EXPECT_NEAR(valf(out[1])[0], 0.4f, 1e-6);
  // LSTM with zero weights and bias c-gate 1: i = f = o = 0.5, c~ = tanh(1); c = 0.5 c0 + 0.5 tanh(1).
  NodeBuilder lstm("LSTM", 8, 3);
  lstm.attr("hidden_size", std::int64_t{1});
  out = run(lstm, 14,
            {x, makef({1, 4, 1}, F(4, 0)), makef({1, 4, 1}, F(4, 0)), makef({1, 8}, {0, 0, 0, 1, 0, 0, 0, 0}), Tensor(),
             Tensor(), makef({1, 1, 1}, {0.2f})});
  const double c = 0.5 * 0.2 + 0.5 * std::tanh(1.0);
  EXPECT_NEAR(valf(out[2])[0], c, 1e-6);
  EXPECT_NEAR(valf(out[1])[0], 0.5 * std::tanh(c), 1e-6);
}

TEST(OnnxRefNn, BidirectionalSequenceLensAndLayout) {
  std::mt19937 rng(6);
  const std::int64_t T = 4, B = 2, In = 3, H = 2;
  const Tensor x = random_tensor({T, B, In}, rng);
  const Tensor w = random_tensor({2, 3 * H, In}, rng), r = random_tensor({2, 3 * H, H}, rng);
  const Tensor b = random_tensor({2, 6 * H}, rng);
  const Tensor lens = Tensor::empty({B}, DType::kInt32);
  static_cast<std::int32_t*>(lens.data_ptr())[0] = 4;
  static_cast<std::int32_t*>(lens.data_ptr())[1] = 2;
  NodeBuilder gru("GRU", 5, 2);
  gru.attr("hidden_size", H)
      .attr("direction", std::string("bidirectional"))
      .attr("linear_before_reset", std::int64_t{1});
  auto out = run(gru, 14, {x, w, r, b, lens});
  ASSERT_EQ(out[0].shape(), Shape({T, 2, B, H}));
  const F y = valf(out[0]), yh = valf(out[1]);
  auto yat = [&](std::int64_t t, std::int64_t d, std::int64_t bb, std::int64_t h) {
    return y[static_cast<std::size_t>(((t * 2 + d) * B + bb) * H + h)];
  };
  for (std::int64_t h = 0; h < H; ++h) {
    // Forward Y_h is Y at the last valid step; reverse Y_h is Y at t = 0.
    EXPECT_EQ(yh[static_cast<std::size_t>((0 * B + 0) * H + h)], yat(3, 0, 0, h));
    EXPECT_EQ(yh[static_cast<std::size_t>((0 * B + 1) * H + h)], yat(1, 0, 1, h));
    EXPECT_EQ(yh[static_cast<std::size_t>((1 * B + 1) * H + h)], yat(0, 1, 1, h));
    // Steps past a sequence's length are zero.
    EXPECT_EQ(yat(2, 0, 1, h), 0.0f);
    EXPECT_EQ(yat(3, 1, 1, h), 0.0f);
  }
  // layout = 1 gives the same values, batch-major.
  Tensor xb = Tensor::empty({B, T, In}, DType::kFloat32);
  const F xv = valf(x);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t bb = 0; bb < B; ++bb) {
      for (std::int64_t i = 0; i < In; ++i) {
        static_cast<float*>(xb.data_ptr())[(bb * T + t) * In + i] = xv[static_cast<std::size_t>((t * B + bb) * In + i)];
      }
    }
  }
  gru.attr("layout", std::int64_t{1});
  auto outb = run(gru, 14, {xb, w, r, b, lens});
  ASSERT_EQ(outb[0].shape(), Shape({B, T, 2, H}));
  const F yb = valf(outb[0]);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t d = 0; d < 2; ++d) {
      for (std::int64_t bb = 0; bb < B; ++bb) {
        for (std::int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(yb[static_cast<std::size_t>(((bb * T + t) * 2 + d) * H + h)], yat(t, d, bb, h));
        }
      }
    }
  }
}

}  // namespace
}  // namespace xpuruntime
