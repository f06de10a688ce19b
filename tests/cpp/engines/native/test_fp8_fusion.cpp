// The quantized_fusion pass on float8 chains (Note [Float8 quantized fusion] in
// engines/native/passes/fusion_quantized.cpp) on hand-built graphs: Q(float8e4m3fn) -> DQ -> MatMul(DQ(float8 weight, per channel)) -> Add -> Relu -> Q(float8)
// and DQ -> Gemm(transB, per-tensor weight, C, alpha) become com.xpuruntime:QLinearFp8 with the [K, N] weight
// transposed to [N, K], and compute what the chains computed (through the node kernels); a CUDA plan keeps the shapes
// cuBLASLt's float8 GEMM cannot take unfused with the reason in the notes; mixed int8/float8 chains stay; the whole
// pipeline keeps the float8 weights' DequantizeLinear for the pass (and folds them, disabled).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "engines/native/inference/shape_inference.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/low_bit.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
constexpr DType kFp8 = DType::kFloat8E4M3FN;

Tensor random_float(const Shape& shape, unsigned seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

// float8e4m3fn codes of values uniform in [-range, range] (rounded to nearest even).
Tensor random_fp8(const Shape& shape, unsigned seed, float range) {
  Tensor t = Tensor::empty(shape, kFp8);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-range, range);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = detail::float8_from_double(dist(gen), kFp8);
  return t;
}

Tensor zero_of(DType dtype) {
  Tensor t = Tensor::empty({}, dtype);
  *static_cast<std::uint8_t*>(t.data_ptr()) = 0;
  return t;
}

Tensor scalar(float v) {
  Tensor t = Tensor::empty({}, DType::kFloat32);
  *static_cast<float*>(t.data_ptr()) = v;
  return t;
}

Tensor int64s(const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kInt64);
  std::copy(values.begin(), values.end(), static_cast<std::int64_t*>(t.data_ptr()));
  return t;
}

Node node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
          Attributes attrs = {}) {
  Node n;
  n.op_type = op;
  n.name = op + "_" + outputs.at(0);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attrs = std::move(attrs);
  return n;
}

int count(const Graph& g, const std::string& op_type) {
  int c = 0;
  for (const Node& n : g.nodes) c += n.op_type == op_type ? 1 : 0;
  return c;
}

// x [2, 3, K] -> Q/DQ float8 -> MatMul(DQ(w [K, N] float8, per column)) + b -> Relu -> Q/DQ float8 -> "y", and the
// x flattened to [6, K] -> Q/DQ float8 -> Gemm(DQ(gw [N, K] float8, per tensor), transB, alpha 0.5, C) -> "g" (float).
// `weight_dtype` int8 makes the MatMul's weight int8 (a mixed chain).
Graph fp8_graph(std::int64_t k, std::int64_t n, DType weight_dtype = kFp8) {
  Graph g;
  g.opsets[""] = 21;
  g.inputs = {"x"};
  ValueType x;
  x.has_shape = true;
  for (std::int64_t d : Shape{2, 3, k}) x.shape.emplace_back(d);
  g.types["x"] = x;
  Tensor w = weight_dtype == kFp8 ? random_fp8({k, n}, 2, 300.0f) : Tensor::empty({k, n}, DType::kInt8);
  if (weight_dtype != kFp8) std::fill_n(static_cast<std::int8_t*>(w.data_ptr()), w.numel(), std::int8_t{3});
  g.initializers = {{"sx", scalar(0.01f)},
                    {"zx", zero_of(kFp8)},
                    {"w", w},
                    {"w_scale", random_float({n}, 3, 0.001f, 0.004f)},
                    {"b", random_float({n}, 4, -0.5f, 0.5f)},
                    {"sy", scalar(0.02f)},
                    {"zy", zero_of(kFp8)},
                    {"gw", random_fp8({n, k}, 5, 200.0f)},
                    {"gw_scale", scalar(0.003f)},
                    {"gc", random_float({n}, 6, -1.0f, 1.0f)},
                    {"flat", int64s({6, k})}};
  if (weight_dtype != kFp8) g.initializers["w_scale"] = scalar(0.01f);
  g.nodes = {node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"}),
             node("DequantizeLinear", {"xq", "sx", "zx"}, {"xf"}),
             node("DequantizeLinear", {"w", "w_scale"}, {"wf"}, Attributes().set("axis", std::int64_t{1})),
             node("MatMul", {"xf", "wf"}, {"m"}),
             node("Add", {"m", "b"}, {"mb"}),
             node("Relu", {"mb"}, {"r"}),
             node("QuantizeLinear", {"r", "sy", "zy"}, {"yq"}),
             node("DequantizeLinear", {"yq", "sy", "zy"}, {"y"}),
             node("Reshape", {"x", "flat"}, {"x2"}),
             node("QuantizeLinear", {"x2", "sx", "zx"}, {"x2q"}),
             node("DequantizeLinear", {"x2q", "sx", "zx"}, {"x2f"}),
             node("DequantizeLinear", {"gw", "gw_scale"}, {"gwf"}),
             node("Gemm", {"x2f", "gwf", "gc"}, {"g"},
                  Attributes().set("transB", std::int64_t{1}).set("alpha", 0.5))};
  g.outputs = {"y", "g"};
  g.validate();
  runtime::InferOptions options;
  options.keep_quantized_weights = true;  // the weights' DequantizeLinear stays a node for the pass
  runtime::infer_types(g, options);
  return g;
}

std::vector<Tensor> run(const Graph& g, const Tensor& x) {
  std::vector<Tensor> out;
  for (const Value& v : onnx_ref::run_graph(g, {Value(x)}, {})) out.push_back(v.tensor());
  return out;
}

// One float8 step of |v| (e4m3fn: 3 mantissa bits; subnormals 2^-9), times the scale.
double fp8_step(double v, double scale) {
  const double a = std::fabs(v) / scale;
  if (a < std::ldexp(1.0, -6)) return std::ldexp(1.0, -9) * scale;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 3) * scale;
}

TEST(Fp8Fusion, ChainsBecomeQLinearFp8AndComputeTheSame) {
  for (const auto& [k, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{13, 7}, {64, 24}}) {
    const Graph g = fp8_graph(k, n);
    Graph out = g;
    passes::PassContext ctx;
    ctx.keep_quantized_weights = true;
    const passes::PassResult r = passes::quantized_fusion(out, ctx);
    ASSERT_EQ(count(out, "QLinearFp8"), 2) << out.str();
    EXPECT_EQ(count(out, "QLinear"), 0);
    EXPECT_EQ(count(out, "MatMul") + count(out, "Gemm"), 0) << out.str();
    for (const Node& f : out.nodes) {
      if (f.op_type != "QLinearFp8") continue;
      EXPECT_EQ(f.domain, kXpurtDomain);
      EXPECT_EQ(f.attrs.get_string("weight_layout", ""), "nk");
      EXPECT_FALSE(f.attrs.has("x_zero_point"));
      const Tensor& w = out.initializers.at(f.inputs[1]);
      EXPECT_EQ(w.dtype(), kFp8);
      EXPECT_EQ(w.shape(), (Shape{n, k}));
      if (f.outputs[0] == "yq") {
        EXPECT_EQ(f.attrs.get_string("output_dtype", ""), "float8e4m3fn");
        EXPECT_EQ(f.attrs.get_string("activation", ""), "relu");
        EXPECT_NEAR(f.attrs.get_float("y_scale", 0), 0.02, 1e-9);
        // The MatMul's [K, N] weight transposed into [N, K].
        const auto* t = static_cast<const std::uint8_t*>(w.data_ptr());
        const auto* o = static_cast<const std::uint8_t*>(g.initializers.at("w").data_ptr());
        for (std::int64_t r0 = 0; r0 < k; ++r0) {
          for (std::int64_t c = 0; c < n; ++c) ASSERT_EQ(t[c * k + r0], o[r0 * n + c]);
        }
        EXPECT_EQ(f.inputs.size(), 4u);  // x, weight, w_scale, bias
      } else {
        EXPECT_EQ(f.outputs[0], "g");
        EXPECT_EQ(f.attrs.get_string("output_dtype", ""), "float32");
        // alpha folded into the per-tensor weight scale, C into the bias.
        EXPECT_NEAR(*static_cast<const float*>(out.initializers.at(f.inputs[2]).data_ptr()), 0.5f * 0.003f, 1e-9);
      }
    }
    bool noted = false;
    for (const std::string& note : r.notes) noted |= note.find("QLinearFp8") != std::string::npos;
    EXPECT_TRUE(noted);
    const Tensor x = random_float({2, 3, k}, 7, -3.0f, 3.0f);
    const std::vector<Tensor> want = run(g, x), got = run(out, x);
    ASSERT_EQ(want.size(), 2u);
    ASSERT_EQ(got.size(), 2u);
    // y (requantized): within one float8 step, and equal almost everywhere.
    const Tensor wy = ops::cast(want[0], DType::kFloat32), gy = ops::cast(got[0], DType::kFloat32);
    int differing = 0;
    for (std::int64_t i = 0; i < wy.numel(); ++i) {
      const double a = static_cast<const float*>(wy.data_ptr())[i], b = static_cast<const float*>(gy.data_ptr())[i];
      ASSERT_LE(std::fabs(a - b), fp8_step(std::max(std::fabs(a), std::fabs(b)), 0.02) * 1.0001) << i;
      differing += a != b ? 1 : 0;
    }
    EXPECT_LE(differing * 10, wy.numel());
    // g (float): float32 rounding of the sums.
    const auto* pa = static_cast<const float*>(want[1].data_ptr());
    const auto* pb = static_cast<const float*>(got[1].data_ptr());
    for (std::int64_t i = 0; i < want[1].numel(); ++i) EXPECT_NEAR(pa[i], pb[i], 1e-4 * (1 + std::fabs(pa[i]))) << i;
  }
}

TEST(Fp8Fusion, CudaPlansKeepShapesCublasLtCannotTake) {
  passes::PassContext ctx;
  ctx.keep_quantized_weights = true;
  ctx.device = Device::cuda(0);
  Graph odd = fp8_graph(13, 7);  // K = 13: not a multiple of 16
  const passes::PassResult r = passes::quantized_fusion(odd, ctx);
  EXPECT_EQ(count(odd, "QLinearFp8"), 0) << odd.str();
  EXPECT_EQ(count(odd, "MatMul"), 1);
  int kept = 0;
  for (const std::string& note : r.notes) {
    kept += note.find("kept") != std::string::npos && note.find("K a multiple of 16") != std::string::npos &&
            note.find("K = 13") != std::string::npos;
  }
  EXPECT_EQ(kept, 2);
  // The weights' DQs the pass did not fuse are folded (into float constants).
  EXPECT_EQ(count(odd, "DequantizeLinear"), 3) << odd.str();  // x's, y's and nothing else
  Graph fits = fp8_graph(64, 24);
  passes::quantized_fusion(fits, ctx);
  EXPECT_EQ(count(fits, "QLinearFp8"), 2) << fits.str();
  Graph narrow = fp8_graph(32, 6);  // N = 6: not a multiple of 4
  passes::quantized_fusion(narrow, ctx);
  EXPECT_EQ(count(narrow, "QLinearFp8"), 0) << narrow.str();
}

TEST(Fp8Fusion, MixedChainsAndTheSwitchLeaveTheGraphAlone) {
  passes::PassContext ctx;
  ctx.keep_quantized_weights = true;
  Graph mixed = fp8_graph(16, 8, DType::kInt8);  // float8 x with an int8 weight: the MatMul stays
  passes::quantized_fusion(mixed, ctx);
  EXPECT_EQ(count(mixed, "MatMul"), 1) << mixed.str();
  EXPECT_EQ(count(mixed, "QLinearFp8"), 1) << mixed.str();  // the Gemm's chain is float8 throughout
  // The whole list, as runtime::optimize runs it: fused; with the pass disabled: the weights' DQs folded instead.
  const Graph g = fp8_graph(16, 8);
  Graph piped = g;
  passes::run_passes(piped, ctx);
  EXPECT_EQ(count(piped, "QLinearFp8"), 2) << piped.str();
  Graph off = g;
  passes::run_passes(off, {}, {"quantized_fusion"});
  EXPECT_EQ(count(off, "QLinearFp8"), 0);
  EXPECT_EQ(count(off, "Linear"), 2) << off.str();  // the float GEMMs of the folded weights
}

}  // namespace
}  // namespace xpuruntime
