// The int4_weight_fusion pass (Note [Int4 weight fusion] in engines/native/passes/fusion_int4.cpp) on hand-built
// graphs: DequantizeLinear(int4/uint4 constant, blocked along K) -> MatMul [+ Add bias] and -> Gemm (transB, C) become
// com.xpuruntime:MatMulNBits with the weights repacked (the graph computes the same before and after, through the node
// kernels); ONNX Runtime's MatMulNBits converts where matmul_nbits takes it and stays (with its reason) where it does
// not; near misses are left to the folding; and the whole pipeline (runtime::optimize) keeps the int4 weights'
// DequantizeLinear for the pass unless it is disabled.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "engines/native/inference/shape_inference.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

Tensor random_float(const Shape& shape, unsigned seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

// Unpacked int4 (int8 in [-8, 7]) or uint4 (uint8 in [0, 15]) values (Note [Float8 and 4-bit dtypes]).
Tensor random_int4(const Shape& shape, DType dtype, unsigned seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(dtype == DType::kInt4 ? -8 : 0, dtype == DType::kInt4 ? 7 : 15);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(dist(gen)));
  return t;
}

Node node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
          Attributes attrs = {}, const std::string& domain = "") {
  Node n;
  n.op_type = op;
  n.domain = domain;
  n.name = op + "_" + outputs.at(0);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attrs = std::move(attrs);
  return n;
}

Graph graph(std::vector<Node> nodes, std::map<std::string, Tensor> constants, const Shape& x_shape,
            std::vector<std::string> outputs) {
  Graph g;
  g.opsets[""] = 21;
  g.opsets["com.microsoft"] = 1;
  g.inputs = {"x"};
  ValueType x;
  x.has_shape = true;
  for (std::int64_t d : x_shape) x.shape.emplace_back(d);
  g.types["x"] = x;
  g.initializers = std::move(constants);
  g.nodes = std::move(nodes);
  g.outputs = std::move(outputs);
  g.validate();
  runtime::InferOptions options;
  options.keep_int4_weights = true;  // the int4 weights' DequantizeLinear stays a node for the pass
  runtime::infer_types(g, options);
  return g;
}

int count(const Graph& g, const std::string& op_type) {
  int c = 0;
  for (const Node& n : g.nodes) c += n.op_type == op_type ? 1 : 0;
  return c;
}

const Node* find(const Graph& g, const std::string& op_type, const std::string& domain) {
  for (const Node& n : g.nodes) {
    if (n.op_type == op_type && n.domain == domain) return &n;
  }
  return nullptr;
}

std::vector<Tensor> run(const Graph& g, const Tensor& x) {
  std::vector<Tensor> out;
  for (const Value& v : onnx_ref::run_graph(g, {Value(x)}, {})) out.push_back(v.tensor());
  return out;
}

// Within float32 rounding of the sums (the fused node sums in double, the MatMul in float).
void expect_close(const std::vector<Tensor>& want, const std::vector<Tensor>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].shape(), got[i].shape());
    const Tensor a = ops::cast(want[i], DType::kFloat32), b = ops::cast(got[i], DType::kFloat32);
    const auto* pa = static_cast<const float*>(a.data_ptr());
    const auto* pb = static_cast<const float*>(b.data_ptr());
    for (std::int64_t k = 0; k < a.numel(); ++k) EXPECT_NEAR(pa[k], pb[k], 1e-5 * (1 + std::fabs(pa[k]))) << k;
  }
}

struct DqCase {
  std::int64_t k, n, dq_block;
  DType dtype;
  bool zero_points;
  std::int64_t expected_block;
};

TEST(Int4WeightFusion, DequantizeMatMulBiasBecomesMatMulNBits) {
  const DqCase cases[] = {
      {40, 6, 16, DType::kInt4, false, 16},   // K not a multiple of the block: the last one padded
      {64, 5, 32, DType::kUInt4, true, 32},   // uint4 with zero points
      {96, 3, 48, DType::kInt4, true, 16},    // a block of 48 -> blocks of 16 with repeated scales
      {300, 7, 128, DType::kInt4, false, 128},
  };
  unsigned seed = 1;
  for (const DqCase& c : cases) {
    const std::int64_t kb = (c.k + c.dq_block - 1) / c.dq_block;
    std::map<std::string, Tensor> constants = {{"w", random_int4({c.k, c.n}, c.dtype, seed++)},
                                               {"s", random_float({kb, c.n}, seed++, 0.01f, 0.1f)},
                                               {"b", random_float({c.n}, seed++, -1.0f, 1.0f)}};
    std::vector<std::string> dq_inputs = {"w", "s"};
    if (c.zero_points) {
      constants["z"] = random_int4({kb, c.n}, c.dtype, seed++);
      dq_inputs.push_back("z");
    }
    Graph g = graph({node("DequantizeLinear", dq_inputs, {"wf"},
                          Attributes().set("axis", std::int64_t{0}).set("block_size", c.dq_block)),
                     node("MatMul", {"x", "wf"}, {"m"}), node("Add", {"m", "b"}, {"y"})},
                    constants, {2, 3, c.k}, {"y"});
    Graph out = g;
    passes::PassContext ctx;
    ctx.keep_int4_weights = true;
    const passes::PassResult r = passes::int4_weight_fusion(out, ctx);
    EXPECT_EQ(r.rewrites, 1) << out.str();
    ASSERT_EQ(out.nodes.size(), 1u) << out.str();  // DQ, MatMul and the bias Add are one node
    const Node* fused = find(out, "MatMulNBits", kXpurtDomain);
    ASSERT_NE(fused, nullptr) << out.str();
    EXPECT_EQ(fused->attrs.get_int("block_size", 0), c.expected_block);
    ASSERT_EQ(fused->inputs.size(), 5u);  // x, weight, scales, zero points (absent when all are 8), bias
    EXPECT_EQ(fused->inputs[3].empty(), !c.zero_points && c.dtype == DType::kInt4);
    EXPECT_EQ(out.initializers.count("w"), 0u);  // the unpacked weight went
    const Tensor x = random_float({2, 3, c.k}, seed++, -1.0f, 1.0f);
    expect_close(run(g, x), run(out, x));
  }
}

TEST(Int4WeightFusion, GemmWithTransposedWeightAndC) {
  const std::int64_t k = 70, n = 9, block = 32, kb = 3;
  std::map<std::string, Tensor> constants = {{"w", random_int4({n, k}, DType::kInt4, 31)},
                                             {"s", random_float({n, kb}, 32, 0.01f, 0.1f)},
                                             {"z", Tensor::zeros({n, kb}, DType::kInt4)},
                                             {"c", random_float({1, n}, 33, -1.0f, 1.0f)}};
  Graph g = graph({node("DequantizeLinear", {"w", "s", "z"}, {"wf"},
                        Attributes().set("axis", std::int64_t{1}).set("block_size", block)),
                   node("Gemm", {"x", "wf", "c"}, {"y"}, Attributes().set("transB", std::int64_t{1}))},
                  constants, {4, k}, {"y"});
  Graph out = g;
  passes::PassContext ctx;
  ctx.keep_int4_weights = true;
  EXPECT_EQ(passes::int4_weight_fusion(out, ctx).rewrites, 1);
  const Node* fused = find(out, "MatMulNBits", kXpurtDomain);
  ASSERT_NE(fused, nullptr) << out.str();
  ASSERT_EQ(fused->inputs.size(), 5u);
  EXPECT_TRUE(fused->inputs[3].empty());  // int4 zero points 0 are codes 8: the default, dropped
  EXPECT_EQ(out.initializers.at(fused->inputs[4]).shape(), (Shape{n}));  // C [1, N] as the op's [N]
  const Tensor x = random_float({4, k}, 34, -1.0f, 1.0f);
  expect_close(run(g, x), run(out, x));
}

// ORT's MatMulNBits node with the given attributes and inputs.
Graph ms_graph(std::int64_t bits, bool g_idx, bool float_zero_points) {
  const std::int64_t k = 48, n = 5, block = 16, blocks = 3;
  std::map<std::string, Tensor> constants = {{"B", Tensor::zeros({n, blocks, block * bits / 8}, DType::kUInt8)},
                                             {"scales", random_float({n * blocks}, 41, 0.01f, 0.1f)}};
  std::vector<std::string> inputs = {"x", "B", "scales", "", "", ""};
  std::mt19937 gen(42);
  auto* b = static_cast<std::uint8_t*>(constants["B"].data_ptr());
  for (std::int64_t i = 0; i < constants["B"].numel(); ++i) b[i] = static_cast<std::uint8_t>(gen() & 0xFF);
  if (float_zero_points) {
    constants["zp"] = random_float({n * blocks}, 43, 0.0f, 15.0f);
    inputs[3] = "zp";
  } else {
    constants["zp"] = Tensor::zeros({n * 2}, DType::kUInt8);
    static_cast<std::uint8_t*>(constants["zp"].data_ptr())[3] = 0x5A;
    inputs[3] = "zp";
  }
  if (g_idx) {
    constants["g"] = Tensor::zeros({k}, DType::kInt32);
    inputs[4] = "g";
  }
  constants["bias"] = random_float({n}, 44, -1.0f, 1.0f);
  inputs[5] = "bias";
  Attributes attrs;
  attrs.set("K", k).set("N", n).set("bits", bits).set("block_size", block);
  return graph({node("MatMulNBits", inputs, {"y"}, attrs, "com.microsoft")}, constants, {3, k}, {"y"});
}

TEST(Int4WeightFusion, MatMulNBitsConvertsWhereTheOpTakesIt) {
  const Graph g = ms_graph(4, false, false);
  Graph out = g;
  const passes::PassResult r = passes::int4_weight_fusion(out, {});
  EXPECT_EQ(r.rewrites, 1);
  const Node* fused = find(out, "MatMulNBits", kXpurtDomain);
  ASSERT_NE(fused, nullptr) << out.str();
  EXPECT_EQ(fused->inputs, (std::vector<std::string>{"x", "B", "scales", "zp", "bias"}));
  const Tensor x = random_float({3, 48}, 45, -1.0f, 1.0f);
  const std::vector<Tensor> want = run(g, x), got = run(out, x);
  ASSERT_EQ(want[0].nbytes(), got[0].nbytes());
  EXPECT_EQ(std::memcmp(want[0].data_ptr(), got[0].data_ptr(), want[0].nbytes()), 0);  // the same arithmetic
  // bits 8, g_idx and float zero points stay for the node kernel, with the reason in the notes.
  for (const auto& [bits, g_idx, float_zp, reason] :
       {std::tuple{std::int64_t{8}, false, false, "bits=8"}, std::tuple{std::int64_t{4}, true, false, "g_idx"},
        std::tuple{std::int64_t{4}, false, true, "zero points are not packed uint8"}}) {
    Graph kept = ms_graph(bits, g_idx, float_zp);
    const passes::PassResult rk = passes::int4_weight_fusion(kept, {});
    EXPECT_EQ(rk.rewrites, 0);
    ASSERT_EQ(rk.notes.size(), 1u);
    EXPECT_NE(rk.notes[0].find(reason), std::string::npos) << rk.notes[0];
    EXPECT_NE(find(kept, "MatMulNBits", "com.microsoft"), nullptr);
  }
}

TEST(Int4WeightFusion, NearMissesAreFoldedAsBefore) {
  // A block of 8 (not a multiple of 16) and a MatMul whose int4 weight is its first operand: left alone; with
  // keep_int4_weights the pass folds their DequantizeLinear as the folding would have.
  std::map<std::string, Tensor> constants = {{"w", random_int4({16, 4}, DType::kInt4, 51)},
                                             {"s", random_float({2, 4}, 52, 0.01f, 0.1f)},
                                             {"w2", random_int4({5, 16}, DType::kInt4, 53)},
                                             {"s2", random_float({1}, 54, 0.01f, 0.1f)}};
  Graph g = graph({node("DequantizeLinear", {"w", "s"}, {"wf"},
                        Attributes().set("axis", std::int64_t{0}).set("block_size", std::int64_t{8})),
                   node("MatMul", {"x", "wf"}, {"y"}), node("DequantizeLinear", {"w2", "s2"}, {"w2f"}),
                   node("MatMul", {"w2f", "x"}, {"y2"})},
                  constants, {16, 16}, {"y", "y2"});
  Graph out = g;
  passes::PassContext ctx;
  ctx.keep_int4_weights = true;
  const passes::PassResult r = passes::int4_weight_fusion(out, ctx);
  EXPECT_EQ(find(out, "MatMulNBits", kXpurtDomain), nullptr) << out.str();
  EXPECT_EQ(count(out, "DequantizeLinear"), 0) << out.str();  // folded
  EXPECT_EQ(count(out, "MatMul"), 2);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes[0].find("not a multiple of 16"), std::string::npos) << r.notes[0];
  const Tensor x = random_float({16, 16}, 55, -1.0f, 1.0f);
  expect_close(run(g, x), run(out, x));
  // Switched off (fuse_int4_weights false): nothing fused, nothing folded by this pass.
  Graph off = g;
  passes::PassContext no;
  no.fuse_int4_weights = false;
  EXPECT_EQ(passes::int4_weight_fusion(off, no).rewrites, 0);
  EXPECT_EQ(count(off, "DequantizeLinear"), 2);
}

TEST(Int4WeightFusion, TheFoldingKeepsInt4WeightsForThePass) {
  const std::int64_t k = 64, n = 8;
  const std::map<std::string, Tensor> constants = {{"w", random_int4({k, n}, DType::kInt4, 61)},
                                                   {"s", random_float({2, n}, 62, 0.01f, 0.1f)}};
  for (bool disabled : {false, true}) {
    Graph g;
    g.opsets[""] = 21;
    g.inputs = {"x"};
    ValueType x;
    x.has_shape = true;
    x.shape = {Dim(3), Dim(k)};
    g.types["x"] = x;
    g.initializers = constants;
    g.nodes = {node("DequantizeLinear", {"w", "s"}, {"wf"},
                    Attributes().set("axis", std::int64_t{0}).set("block_size", std::int64_t{32})),
               node("MatMul", {"x", "wf"}, {"y"})};
    g.outputs = {"y"};
    g.validate();
    runtime::InferOptions options;
    options.fuse_int4_weights = true;
    const std::set<std::string> off = disabled ? std::set<std::string>{"int4_weight_fusion"} : std::set<std::string>{};
    runtime::optimize(g, options, off);
    EXPECT_EQ(find(g, "MatMulNBits", kXpurtDomain) != nullptr, !disabled) << g.str();
    EXPECT_EQ(count(g, "DequantizeLinear"), 0) << g.str();  // fused, or folded into a float weight
  }
}

}  // namespace
}  // namespace xpuruntime
