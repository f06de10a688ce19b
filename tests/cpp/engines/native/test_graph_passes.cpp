// The native engine's graph passes (src/cpp/engines/native/passes/passes.h) on hand-built graphs: each pass rewrites what it
// should, leaves alone what it should not (non-constant weights, a reader outside the pattern, a wrong axis...),
// and preserves the numerics: every graph is evaluated before and after with a small reference interpreter (ONNX
// nodes through onnx_ref::run_node, the com.xpuruntime nodes through their registry ops on the CPU).
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "core/node_kernels.h"
#include "engines/native/passes/passes.h"
#include "engines/native/inference/shape_inference.h"
#include "test_utils.h"
#include "xpuruntime/capture_plan.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/onnx_import.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Values = std::vector<float>;
using Feeds = std::map<std::string, Tensor>;

std::int64_t I(std::int64_t v) { return v; }

Tensor make(const Shape& shape, const Values& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(float));  // empty: no data
  return t;
}

Tensor make_i64(const Shape& shape, const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty(shape, DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

Tensor scalar(float v) { return make({}, {v}); }

Tensor random(const Shape& shape, unsigned seed, float low = -1.0f, float high = 1.0f) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  Values v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return make(shape, v);
}

Values values(const Tensor& t) {
  Values v(static_cast<std::size_t>(t.numel()));
  if (t.dtype() == DType::kFloat32 && !v.empty()) {
    std::memcpy(v.data(), t.contiguous().data_ptr(), v.size() * sizeof(float));
  }
  return v;
}

ValueType type(const std::vector<Dim>& shape, DType dtype = DType::kFloat32) {
  ValueType vt;
  vt.dtype = dtype;
  vt.has_shape = true;
  vt.shape = shape;
  return vt;
}

Node node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
          Attributes attrs = {}, const std::string& name = "") {
  Node n;
  n.op_type = op;
  n.name = name.empty() ? op + "_" + outputs.at(0) : name;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attrs = std::move(attrs);
  return n;
}

// A graph under construction: inputs and constants with their types.
struct Builder {
  Graph g;
  Builder() { g.opsets[""] = 17; }
  Builder& input(const std::string& name, const std::vector<Dim>& shape) {
    g.inputs.push_back(name);
    g.types[name] = type(shape);
    return *this;
  }
  Builder& constant(const std::string& name, const Tensor& t) {
    g.initializers[name] = t;
    return *this;
  }
  Builder& add(Node n) {
    g.nodes.push_back(std::move(n));
    return *this;
  }
  Builder& typed(const std::string& value, const std::vector<Dim>& shape) {
    g.types[value] = type(shape);
    return *this;
  }
  Graph build(std::vector<std::string> outputs) {
    g.outputs = std::move(outputs);
    g.validate();
    return g;
  }
};

std::vector<Tensor> run_fused_in_library(const Node& n, const std::vector<Tensor>& in);

std::vector<Tensor> run_fused_in_library(const Node& n, const std::vector<Tensor>& in);

std::vector<Tensor> run_fused(const Node& n, const std::vector<Tensor>& in) {
  auto input = [&](std::size_t i) { return i < in.size() ? in[i] : Tensor(); };
  Attributes a;
  if (n.op_type == "FusedConv" && in.size() > 1 && in[1].dim() == 5) return run_fused_in_library(n, in);  // conv3d
  if (n.op_type == "FusedConv") {
    a.set("strides", n.attrs.get_ints("strides", {1, 1}))
        .set("pads", n.attrs.get_ints("pads", {0, 0, 0, 0}))
        .set("dilations", n.attrs.get_ints("dilations", {1, 1}))
        .set("groups", n.attrs.get_int("group", 1))
        .set("activation", n.attrs.get_string("activation", "none"))
        .set("layout", n.attrs.get_string("layout", "NCHW"));
    return ops::call("conv2d", {input(0), input(1), input(2), input(3)}, a);
  }
  if (n.op_type == "MaxPool" || n.op_type == "AveragePool" || n.op_type == "GlobalAveragePool") {
    return run_fused_in_library(n, in);  // the channels-last pools of nhwc_layout
  }
  if (n.op_type == "Linear") {
    a.set("weight_layout", n.attrs.get_string("weight_layout", "nk"))
        .set("activation", n.attrs.get_string("activation", "none"));
    return ops::call("linear", {input(0), input(1), input(2), input(3)}, a);  // input 3: the residual
  }
  if (n.op_type == "Gelu") {
    return {ops::gelu(input(0), n.attrs.get_string("approximate", "none"))};
  }
  if (n.op_type == "FusedElementwise") return ops::call("fused_elementwise", in, n.attrs);  // program, row_axes, ...
  if (n.op_type == "QLinear" || n.op_type == "QConv") return run_fused_in_library(n, in);  // quantized_fusion
  if (n.op_type == "LayerNormalization") {
    a.set("axis", n.attrs.get_int("axis", -1)).set("epsilon", n.attrs.get_float("epsilon", 1e-5));
    // input 3: the residual, input 4: the addend
    return ops::call("layer_norm", {input(0), input(1), input(2), input(3), input(4)}, a);
  }
  if (n.op_type == "Attention") {
    // Other layouts (Note [Attention layouts]) and fully masked rows of 0 (Note [Fully masked attention rows]) as the
    // library runs them: the cpu kernel reads them in place.
    if (n.attrs.has("bshd") || n.attrs.has("qkv_parts") || n.attrs.has("fully_masked_rows")) {
      return run_fused_in_library(n, in);
    }
    return {ops::attention(input(0), input(1), input(2), input(3), n.attrs.get_int("causal", 0) != 0,
                           n.attrs.get_float("scale", 0.0))};
  }
  ADD_FAILURE() << "unknown fused node " << n.str();
  return {};
}

// The com.xpuruntime nodes as their cpu node kernels run them (backends/cpu/onnx/onnx_fused.cpp, registered in the
// KernelRegistry by register_cpu).
std::vector<Tensor> run_fused_in_library(const Node& n, const std::vector<Tensor>& in) {
  if (KernelRegistry::global().find_node_kernel(n.domain, n.op_type) == nullptr) {
    ADD_FAILURE() << "no node kernel of " << n.domain << ":" << n.op_type;
    return {};
  }
  return onnx_ref::run_node(n, 1, in);
}

// The reference interpreter: every node in order. `types` (optional) receives the type of every value computed;
// `library_fused`: the com.xpuruntime nodes run through their node kernels instead of the test's own mapping.
std::vector<Tensor> run_graph(const Graph& g, const Feeds& feeds, std::map<std::string, ValueType>* types = nullptr,
                              bool library_fused = false) {
  std::map<std::string, Tensor> env = g.initializers;
  for (const auto& [name, t] : feeds) env[name] = t;
  for (const Node& n : g.nodes) {
    std::vector<Tensor> in;
    for (const auto& name : n.inputs) in.push_back(name.empty() ? Tensor() : env.at(name));
    std::vector<Tensor> out = n.domain != kXpurtDomain
                                  ? onnx_ref::run_node(n, g.opset(n.domain), in)
                                  : (library_fused ? run_fused_in_library(n, in) : run_fused(n, in));
    for (std::size_t k = 0; k < n.outputs.size() && k < out.size(); ++k) {
      if (n.outputs[k].empty() || !out[k].defined()) continue;
      env[n.outputs[k]] = out[k];
      if (types) {
        std::vector<Dim> dims(out[k].shape().begin(), out[k].shape().end());
        (*types)[n.outputs[k]] = type(dims, out[k].dtype());
      }
    }
  }
  std::vector<Tensor> outputs;
  for (const auto& name : g.outputs) outputs.push_back(env.at(name));
  return outputs;
}

std::vector<Tensor> to_float32(std::vector<Tensor> list) {
  for (Tensor& t : list) t = ops::cast(t, DType::kFloat32);
  return list;
}

void expect_close(const std::vector<Tensor>& expected, const std::vector<Tensor>& actual, double rtol = 1e-4,
                  double atol = 1e-5) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(expected[i].shape(), actual[i].shape()) << "output " << i;
    ASSERT_EQ(expected[i].dtype(), actual[i].dtype()) << "output " << i;
    const Values e = values(expected[i]), a = values(actual[i]);
    for (std::size_t k = 0; k < e.size(); ++k) {
      ASSERT_NEAR(a[k], e[k], atol + rtol * std::fabs(e[k])) << "output " << i << " element " << k;
    }
  }
}

int count(const Graph& g, const std::string& op_type) {
  int c = 0;
  for (const Node& n : g.nodes) c += n.op_type == op_type ? 1 : 0;
  return c;
}

const Node* find(const Graph& g, const std::string& op_type) {
  for (const Node& n : g.nodes) {
    if (n.op_type == op_type) return &n;
  }
  return nullptr;
}

// Runs one pass on a copy of `g` and checks the outputs are unchanged on `feeds`; returns the rewritten graph.
Graph run_pass(const Graph& g, passes::PassResult (*pass)(Graph&, const passes::PassContext&), const Feeds& feeds,
               int* rewrites = nullptr, const passes::PassContext& ctx = {}) {
  Graph rewritten = g;
  const passes::PassResult r = pass(rewritten, ctx);
  if (rewrites) *rewrites = r.rewrites;
  rewritten.validate();
  EXPECT_EQ(rewritten.inputs, g.inputs);
  EXPECT_EQ(rewritten.outputs, g.outputs);
  expect_close(run_graph(g, feeds), run_graph(rewritten, feeds));
  return rewritten;
}

// ---- the pass list ----

TEST(GraphPasses, ListAndUnknownNames) {
  std::vector<std::string> names;
  for (const auto& p : passes::all_passes()) {
    names.push_back(p.name);
    EXPECT_FALSE(p.doc.empty()) << p.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"constant_folding", "shape_folding", "predicate_reduction",
                                             "identity_elimination", "dead_node_elimination", "tensor_parallel",
                                             "op_decomposition",
                                             "group_query_attention_decomposition", "int4_weight_fusion",
                                             "quantized_fusion", "conv_bn_folding",
                                             "gelu_fusion",
                                             "layer_norm_fusion", "residual_layer_norm_fusion",
                                             "post_norm_residual_fusion", "attention_fusion",
                                             "patch_embedding_gemm", "gemm_fusion", "qkv_fusion",
                                             "attention_head_padding", "conv_fusion",
                                             "nhwc_layout", "quantized_constant_folding",
                                             "linear_epilogue_fusion", "norm_affine_folding",
                                             "elementwise_fusion", "fused_input_views", "attention_part_padding",
                                             "concat_fusion"}));
  Graph g = Builder().input("x", {2}).add(node("Relu", {"x"}, {"y"})).build({"y"});
  XPURT_EXPECT_THROW_WITH(passes::run_passes(g, {}, {"gemm_fusoin"}), InvalidArgumentError,
                          "unknown graph pass 'gemm_fusoin' in the disabled passes; valid names: constant_folding, "
                          "shape_folding");
}

// Note [Patterns check arity]: a graph built without the importer's schema check (here by hand) may hold a MatMul with
// one input feeding a Softmax; attention_fusion read the MatMul's second input (a crash). Every pass leaves such a
// node alone, and the nodes of a well-formed attention still fuse.
TEST(GraphPasses, PatternsSkipNodesThatBreakTheirArity) {
  EXPECT_FALSE(passes::has_onnx_arity(node("MatMul", {"x"}, {"m"})));
  EXPECT_TRUE(passes::has_onnx_arity(node("MatMul", {"x", "y"}, {"m"})));
  Node no_output;
  no_output.op_type = "Softmax";
  no_output.inputs = {"x"};
  EXPECT_FALSE(passes::has_onnx_arity(no_output));
  EXPECT_TRUE(passes::has_onnx_arity(node("Concat", {"a", "b", "c", "d"}, {"y"})));
  for (const char* op : {"MatMul", "Add", "Mul", "Div", "Transpose", "Reshape", "Gemm", "Conv"}) {
    Graph g = Builder()
                  .input("x", {1, 2, 4, 4})
                  .add(node(op, {"x"}, {"m"}))
                  .add(node("Softmax", {"m"}, {"s"}))
                  .add(node(op, {"s"}, {"y"}))
                  .build({"y"});
    const std::size_t before = g.nodes.size();
    EXPECT_NO_THROW(passes::run_passes(g, {})) << op;
    EXPECT_EQ(g.nodes.size(), before) << op;
  }
}

// A malformed model may declare a shape with more elements than int64 holds: no pass may treat it as static (they
// multiply sizes and strides freely), and the passes run through such a graph without overflowing (UBSan checks).
TEST(GraphPasses, ShapesWithMoreElementsThanInt64HoldsAreNotStatic) {
  const std::int64_t huge = std::int64_t{1} << 32;
  Builder b;
  b.input("x", {huge, huge, 3})
      .constant("to", make_i64({2}, {huge, huge * 3}))
      .add(node("Transpose", {"x"}, {"t"}, Attributes().set("perm", std::vector<std::int64_t>{1, 0, 2})))
      .typed("t", {huge, huge, 3})
      .add(node("Reshape", {"t", "to"}, {"r"}))
      .typed("r", {huge, huge * 3})
      .add(node("Relu", {"r"}, {"y"}))
      .typed("y", {huge, huge * 3});
  Graph g = b.build({"y"});
  const std::size_t before = g.nodes.size();
  EXPECT_NO_THROW(passes::run_passes(g, {}));
  EXPECT_EQ(g.nodes.size(), before);  // nothing fused or moved through a shape that is not static
}

// An empty tensor through a chain of views (the structural fuzzer's finding: a Reshape of a [0, ...] value divided by
// its zero size while composing the views): the passes leave it alone.
TEST(GraphPasses, EmptyTensorsThroughViewChainsAreLeftAlone) {
  Builder b;
  b.input("x", {4, 0, 6})
      .constant("to", make_i64({2}, {0, 24}))
      .add(node("Transpose", {"x"}, {"t"}, Attributes().set("perm", std::vector<std::int64_t>{1, 0, 2})))
      .typed("t", {0, 4, 6})
      .add(node("Reshape", {"t", "to"}, {"r"}))
      .typed("r", {0, 24})
      .add(node("Relu", {"r"}, {"y"}))
      .typed("y", {0, 24});
  Graph g = b.build({"y"});
  EXPECT_NO_THROW(passes::run_passes(g, {}));
}

// ---- op_decomposition ----

Tensor int64s(const std::vector<std::int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::kInt64);
  std::copy(v.begin(), v.end(), static_cast<std::int64_t*>(t.data_ptr()));
  return t;
}

// Note [Shapes without stand-ins]: Conv (1-, 2- and 3-D, pads, strides, dilations, auto_pad) and Split (sizes as an
// input, as an attribute, equal parts, opset 18's uneven last part) get their output shapes from ONNX's formulas in
// type inference; each must be the shape the reference library's run gives.
TEST(GraphPasses, ConvAndSplitShapesFollowTheirFormulas) {
  struct Case {
    std::string op;
    std::int64_t opset;
    Shape x;
    Shape w;  // Conv: the weight; Split: the sizes input (empty: none)
    Attributes attrs;
    int outputs = 1;
  };
  const auto attrs = [](std::vector<std::pair<std::string, std::vector<std::int64_t>>> ints, std::string auto_pad = "") {
    Attributes a;
    for (auto& [name, v] : ints) a.set(name, v);
    if (!auto_pad.empty()) a.set("auto_pad", auto_pad);
    return a;
  };
  Attributes split_attr;
  split_attr.set("split", std::vector<std::int64_t>{2, 5});
  split_attr.set("axis", std::int64_t{1});
  Attributes last_axis;
  last_axis.set("axis", std::int64_t{-1});
  Attributes axis1;
  axis1.set("axis", std::int64_t{1});
  Attributes depthwise = attrs({{"strides", {2, 3}}}, "SAME_UPPER");
  depthwise.set("group", std::int64_t{2});
  const std::vector<Case> cases = {
      {"Conv", 17, {2, 3, 31}, {5, 3, 3}, attrs({{"pads", {1, 1}}})},
      {"Conv", 17, {1, 4, 30}, {6, 4, 4}, attrs({{"strides", {3}}, {"dilations", {2}}})},
      {"Conv", 17, {3, 2, 11, 7}, {4, 2, 3, 2}, attrs({{"strides", {2, 1}}, {"pads", {0, 1, 2, 0}}})},
      {"Conv", 17, {1, 2, 9, 10}, {4, 1, 3, 3}, depthwise},
      {"Conv", 17, {1, 2, 9, 10}, {3, 2, 4, 2}, attrs({{"dilations", {2, 3}}}, "VALID")},
      {"Conv", 17, {2, 2, 5, 6, 7}, {2, 2, 2, 3, 1}, attrs({{"strides", {1, 2, 3}}, {"pads", {1, 0, 0, 0, 1, 2}}})},
      {"Split", 13, {2, 9, 4}, {4, 5}, axis1, 2},
      {"Split", 11, {3, 7}, {}, split_attr, 2},
      {"Split", 13, {6, 5}, {}, {}, 3},
      {"Split", 18, {2, 3, 10}, {}, last_axis, 4},
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE(detail::str_cat(c.op, " case ", k));
    Builder b;
    b.g.opsets[""] = c.opset;
    b.input("x", std::vector<Dim>(c.x.begin(), c.x.end()));
    std::vector<std::string> outs;
    for (int o = 0; o < c.outputs; ++o) outs.push_back("y" + std::to_string(o));
    std::vector<Tensor> inputs = {random(c.x, 300 + static_cast<unsigned>(k))};
    Node n = node(c.op, {"x"}, outs, c.attrs);
    if (c.op == "Conv") {
      b.constant("w", random(c.w, 400));
      n.inputs.push_back("w");
      inputs.push_back(random(c.w, 400));
    } else if (!c.w.empty()) {
      b.constant("sizes", int64s(c.w));
      n.inputs.push_back("sizes");
      inputs.push_back(int64s(c.w));
    }
    if (c.op == "Split" && c.opset >= 18) n.attrs.set("num_outputs", std::int64_t{c.outputs});
    b.add(n);
    Graph g = b.build(outs);
    runtime::InferOptions options;
    options.fold_constants = false;
    runtime::infer_types(g, options);
    const std::vector<Tensor> expected = onnx_ref::run_node(n, c.opset, inputs);
    ASSERT_EQ(expected.size(), outs.size());
    for (std::size_t o = 0; o < outs.size(); ++o) {
      const ValueType* vt = g.type(outs[o]);
      ASSERT_NE(vt, nullptr) << outs[o];
      ASSERT_TRUE(vt->fully_known()) << outs[o];
      EXPECT_EQ(vt->sizes(), expected[o].shape()) << outs[o];
      EXPECT_EQ(vt->dtype, expected[o].dtype()) << outs[o];
    }
  }
}

TEST(GraphPasses, OpDecompositionSplitsIntoSlices) {
  for (const std::int64_t opset : {13, 18}) {
    Builder b;
    b.g.opsets[""] = opset;
    b.input("x", {3, 7, 5});
    Attributes a;
    a.set("axis", std::int64_t{1});
    if (opset == 18) {
      a.set("num_outputs", std::int64_t{3});  // 7 in parts of ceil(7/3) = 3: 3, 3, 1
      b.add(node("Split", {"x"}, {"a", "b", "c"}, a));
    } else {
      b.constant("sizes", int64s({2, 4, 1}));
      b.add(node("Split", {"x", "sizes"}, {"a", "b", "c"}, a));
    }
    Graph g = b.build({"c", "a", "b"});
    int rewrites = 0;
    Graph r = run_pass(g, passes::op_decomposition, {{"x", random({3, 7, 5}, 3)}}, &rewrites);
    EXPECT_EQ(rewrites, 1);
    EXPECT_EQ(count(r, "Split"), 0);
    EXPECT_EQ(count(r, "Slice"), 3);
  }
}

TEST(GraphPasses, OpDecompositionRunsConv1dAsConv2dBetweenViews) {
  Builder b;
  b.input("x", {2, 3, 11}).constant("w", random({4, 3, 3}, 4)).constant("bias", random({4}, 5));
  Attributes a;
  a.set("pads", std::vector<std::int64_t>{1, 2}).set("strides", std::vector<std::int64_t>{2});
  a.set("dilations", std::vector<std::int64_t>{2});
  b.add(node("Conv", {"x", "w", "bias"}, {"y"}, a));
  Graph g = b.build({"y"});
  int rewrites = 0;
  Graph r = run_pass(g, passes::op_decomposition, {{"x", random({2, 3, 11}, 6)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);
  EXPECT_EQ(count(r, "Unsqueeze"), 1);
  EXPECT_EQ(count(r, "Squeeze"), 1);
  ASSERT_NE(find(r, "Conv"), nullptr);
  EXPECT_EQ(find(r, "Conv")->attrs.get_ints("pads", {}), (std::vector<std::int64_t>{0, 1, 0, 2}));
}

// Note [Clips between elementwise ops]: a Clip with constant bounds after Sqrt becomes Max (min only) or Max and Min;
// one that clips a graph input stays.
TEST(GraphPasses, OpDecompositionTurnsClipsAfterElementwiseOpsIntoMaxAndMin) {
  Builder b;
  b.input("x", {2, 3}).constant("lo", scalar(0.5f)).constant("hi", scalar(1.5f));
  b.add(node("Abs", {"x"}, {"a"})).add(node("Sqrt", {"a"}, {"r"}));
  b.add(node("Clip", {"r", "lo"}, {"c1"}));
  b.add(node("Clip", {"r", "lo", "hi"}, {"c2"}));
  b.add(node("Clip", {"x", "lo", "hi"}, {"c3"}));
  b.typed("a", {2, 3}).typed("r", {2, 3});
  Graph g = b.build({"c1", "c2", "c3"});
  int rewrites = 0;
  Graph r = run_pass(g, passes::op_decomposition, {{"x", random({2, 3}, 25)}}, &rewrites);
  EXPECT_EQ(rewrites, 2) << r.str();
  EXPECT_EQ(count(r, "Clip"), 1);
  EXPECT_EQ(count(r, "Max"), 2);
  EXPECT_EQ(count(r, "Min"), 1);
  EXPECT_EQ(find(r, "Clip")->inputs[0], "x");
}

TEST(GraphPasses, OpDecompositionGivesLayerNormConstantsTheInputsType) {
  Builder b;
  b.input("x", {2, 6}).constant("scale", ops::cast(random({6}, 7), DType::kFloat16));
  b.constant("bias", ops::cast(random({6}, 8), DType::kFloat16));
  b.add(node("LayerNormalization", {"x", "scale", "bias"}, {"y"}));
  Graph g = b.build({"y"});
  Graph r = g;
  EXPECT_EQ(passes::op_decomposition(r, {}).rewrites, 1);
  const Node* ln = find(r, "LayerNormalization");
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(r.initializers.at(ln->inputs[1]).dtype(), DType::kFloat32);
  EXPECT_EQ(r.initializers.at(ln->inputs[2]).dtype(), DType::kFloat32);
  const Tensor x = random({2, 6}, 9);
  expect_close(run_graph(g, {{"x", x}}), run_graph(r, {{"x", x}}), 1e-3, 1e-3);
}

TEST(GraphPasses, RunPassesHonoursDisabledAndCallsInferTypes) {
  Builder b;
  b.input("x", {2, 4}).constant("w", random({4, 3}, 1)).constant("bias", random({3}, 2));
  b.add(node("MatMul", {"x", "w"}, {"m"})).add(node("Add", {"m", "bias"}, {"y"}));
  Graph g = b.typed("m", {2, 3}).typed("y", {2, 3}).build({"y"});
  Graph off = g;
  auto results = passes::run_passes(off, {}, {"gemm_fusion"});
  for (const auto& r : results) EXPECT_NE(r.pass, "gemm_fusion");
  EXPECT_EQ(count(off, "MatMul"), 1);
  int calls = 0;
  passes::PassContext ctx;
  ctx.infer_types = [&](Graph&) { ++calls; };
  Graph on = g;
  results = passes::run_passes(on, ctx);
  EXPECT_EQ(count(on, "Linear"), 1);
  EXPECT_EQ(calls, 1);  // only gemm_fusion rewrote something
  const Feeds feeds = {{"x", random({2, 4}, 3)}};
  expect_close(run_graph(g, feeds), run_graph(on, feeds));
}

// ---- constant_folding ----

TEST(ConstantFolding, FoldsConstantChainsKeepsOutputNamesAndSkipsRandomAndBigOutputs) {
  Builder b;
  b.input("x", {2, 3}).constant("a", random({2, 3}, 4)).constant("c", scalar(2.0f));
  b.add(node("Mul", {"a", "c"}, {"ac"})).add(node("Exp", {"ac"}, {"e"})).add(node("Add", {"x", "e"}, {"y"}));
  b.add(node("Neg", {"a"}, {"const_out"}));
  b.add(node("RandomNormal", {}, {"noise"}, Attributes().set("shape", std::vector<std::int64_t>{2, 3})));
  b.add(node("Mul", {"noise", "c"}, {"noise2"}));
  Graph g = b.build({"y", "const_out", "noise2"});
  Graph folded = g;
  auto r = passes::constant_folding(folded, {});
  EXPECT_EQ(r.rewrites, 3);  // Mul, Exp, Neg
  EXPECT_EQ(count(folded, "Exp"), 0);
  EXPECT_EQ(count(folded, "RandomNormal"), 1);
  EXPECT_EQ(count(folded, "Mul"), 1);  // the one reading the random tensor
  EXPECT_TRUE(folded.is_constant("const_out"));
  EXPECT_EQ(folded.outputs, g.outputs);
  const Feeds feeds = {{"x", random({2, 3}, 5)}};
  auto before = run_graph(g, feeds), after = run_graph(folded, feeds);
  before.pop_back();  // the random output differs run to run
  after.pop_back();
  expect_close(before, after);

  passes::PassContext small;
  small.max_folded_bytes = 8;  // 2x3 floats are 24 bytes
  Graph kept = g;
  r = passes::constant_folding(kept, small);
  EXPECT_EQ(r.rewrites, 0);
  EXPECT_EQ(count(kept, "Exp"), 1);
}

TEST(ConstantFolding, PredictsExpandingOutputsBeforeRunningThem) {
  Builder b;
  b.input("x", {2});
  b.constant("huge", make_i64({3}, {100000, 100000, 100000})).constant("small", make_i64({2}, {4, 2}));
  b.constant("start", make_i64({}, {0}))
      .constant("limit", make_i64({}, {1000000000}))
      .constant("step", make_i64({}, {1}));
  b.add(node("ConstantOfShape", {"huge"}, {"big"}));
  b.add(node("ConstantOfShape", {"small"}, {"fine"}));
  b.add(node("Range", {"start", "limit", "step"}, {"r"}));
  b.add(node("Expand", {"fine", "huge"}, {"e"}));
  Graph g = b.build({"big", "fine", "r", "e"});
  auto r = passes::constant_folding(g, {});
  EXPECT_EQ(r.rewrites, 1);  // only the 4x2 ConstantOfShape
  EXPECT_TRUE(g.is_constant("fine"));
  EXPECT_EQ(g.nodes.size(), 3u);
  int predicted = 0;  // kept without being run
  for (const auto& note : r.notes) predicted += note.find("exceed max_folded_bytes") != std::string::npos ? 1 : 0;
  EXPECT_EQ(predicted, 3);
}

TEST(ConstantFolding, OverridableInitializersAreNotConstants) {
  Builder b;
  b.input("a", {2}).constant("a", make({2}, {1, 2})).constant("c", make({2}, {3, 4}));
  b.add(node("Add", {"a", "c"}, {"y"}));
  Graph g = b.build({"y"});
  EXPECT_EQ(passes::constant_folding(g, {}).rewrites, 0);
  EXPECT_EQ(count(g, "Add"), 1);
}

// ---- shape_folding ----

TEST(ShapeFolding, FoldsShapeChainsToAFixedPoint) {
  Builder b;
  b.input("x", {2, 3, 4}).constant("idx", make_i64({1}, {0})).constant("minus1", make_i64({1}, {-1}));
  b.add(node("Shape", {"x"}, {"s"}));
  b.add(node("Gather", {"s", "idx"}, {"batch"}, Attributes().set("axis", I(0))));
  b.add(node("Concat", {"batch", "minus1"}, {"target"}, Attributes().set("axis", I(0))));
  b.add(node("Reshape", {"x", "target"}, {"flat"}));
  b.add(node("Size", {"x"}, {"n"}));
  Graph g = b.typed("flat", {2, 12}).build({"flat", "n"});
  int rewrites = 0;
  Graph folded = run_pass(g, passes::shape_folding, {{"x", random({2, 3, 4}, 6)}}, &rewrites);
  EXPECT_EQ(rewrites, 4);  // Shape, Size, then Gather and Concat
  EXPECT_EQ(folded.nodes.size(), 1u);
  const Node* reshape = find(folded, "Reshape");
  ASSERT_NE(reshape, nullptr);
  ASSERT_TRUE(folded.is_constant(reshape->inputs[1]));
  const Tensor& target = folded.initializers.at(reshape->inputs[1]);
  EXPECT_EQ(std::vector<std::int64_t>(static_cast<const std::int64_t*>(target.data_ptr()),
                                      static_cast<const std::int64_t*>(target.data_ptr()) + 2),
            (std::vector<std::int64_t>{2, -1}));
}

TEST(ShapeFolding, NeedsKnownDimsAndHonoursStartEnd) {
  Builder b;
  b.input("x", {Dim(std::string("batch")), 3, 4});
  b.add(node("Shape", {"x"}, {"all"}));
  b.add(node("Shape", {"x"}, {"tail"}, Attributes().set("start", I(1))));
  b.add(node("Size", {"x"}, {"n"}));
  Graph g = b.build({"all", "tail", "n"});
  g.opsets[""] = 15;
  auto r = passes::shape_folding(g, {});
  EXPECT_EQ(r.rewrites, 1);
  EXPECT_EQ(count(g, "Shape"), 1);
  EXPECT_EQ(count(g, "Size"), 1);
  ASSERT_TRUE(g.is_constant("tail"));
  EXPECT_EQ(g.initializers.at("tail").shape(), (Shape{2}));
  EXPECT_EQ(static_cast<const std::int64_t*>(g.initializers.at("tail").data_ptr())[1], 4);
}

// ---- identity_elimination ----

TEST(IdentityElimination, RemovesNoOpsAndRewiresReaders) {
  Builder b;
  b.input("x", {2, 3}).constant("same", make_i64({2}, {2, 3})).constant("other", make_i64({2}, {3, 2}));
  b.add(node("Relu", {"x"}, {"r"}));
  b.add(node("Identity", {"r"}, {"i1"}));
  b.add(node("Dropout", {"i1"}, {"d", ""}));
  b.add(node("Cast", {"d"}, {"c"}, Attributes().set("to", I(1))));  // float -> float
  b.add(node("Reshape", {"c", "same"}, {"rs"}));
  b.add(node("Cast", {"rs"}, {"c64"}, Attributes().set("to", I(11))));  // float -> double: kept
  b.add(node("Reshape", {"rs", "other"}, {"t"}));                       // another shape: kept
  b.add(node("Neg", {"t"}, {"n"}));
  b.add(node("Identity", {"n"}, {"y"}));            // produces a graph output
  b.add(node("Identity", {"x"}, {"passthrough"}));  // graph input -> graph output
  b.typed("r", {2, 3}).typed("i1", {2, 3}).typed("d", {2, 3}).typed("c", {2, 3}).typed("rs", {2, 3});
  Graph g = b.build({"y", "passthrough", "c64"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::identity_elimination, {{"x", random({2, 3}, 7)}}, &rewrites);
  EXPECT_EQ(rewrites, 5);
  EXPECT_EQ(count(out, "Identity"), 1);  // the passthrough
  EXPECT_EQ(count(out, "Dropout"), 0);
  EXPECT_EQ(count(out, "Cast"), 1);
  EXPECT_EQ(count(out, "Reshape"), 1);
  EXPECT_EQ(find(out, "Neg")->outputs[0], "y");  // renamed to the graph output
  EXPECT_EQ(find(out, "Cast")->inputs[0], "r");
}

// Note [Round-trip casts]: float -> double -> float is float again (the readers of the second Cast read x); float ->
// float16 -> float narrows and stays; the first Cast stays while something else reads it.
TEST(IdentityElimination, RoundTripCastsThroughAWiderTypeGo) {
  Builder b;
  b.input("x", {2, 3});
  b.add(node("Relu", {"x"}, {"r"}));
  b.add(node("Cast", {"r"}, {"wide"}, Attributes().set("to", I(11))));   // float -> double
  b.add(node("Cast", {"wide"}, {"back"}, Attributes().set("to", I(1))));  // double -> float: r itself
  b.add(node("Neg", {"back"}, {"y"}));
  b.add(node("Cast", {"r"}, {"half"}, Attributes().set("to", I(10))));      // float -> float16: narrows
  b.add(node("Cast", {"half"}, {"rounded"}, Attributes().set("to", I(1))));  // kept: not r's values
  b.add(node("Neg", {"rounded"}, {"z"}));
  b.typed("r", {2, 3});
  Graph g = b.build({"y", "z", "wide"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::identity_elimination, {{"x", random({2, 3}, 8)}}, &rewrites);
  EXPECT_EQ(rewrites, 1) << out.str();
  const Node* neg = find(out, "Neg");
  ASSERT_NE(neg, nullptr);
  EXPECT_EQ(neg->inputs[0], "r");
  EXPECT_EQ(count(out, "Cast"), 3);  // the widening one (a graph output reads it) and the narrowing pair
}

// Note [Reductions of predicates]: T5's guard, where(isinf(x.double()).any(), a, b), and an all() over an axis whose
// float result something reads: the reductions read the bools, the IsInf reads x, and identity_elimination then
// takes out the cast back to bool; the values stay (x with and without an infinity).
TEST(PredicateReduction, ReductionsReadTheBoolsAndIsInfTheNarrowValue) {
  Builder b;
  b.input("x", {3, 4}).constant("a", make({1}, {1.0f})).constant("c", make({1}, {2.0f}));
  b.constant("zero", make({1}, {0.0f}));
  b.add(node("Cast", {"x"}, {"xd"}, Attributes().set("to", I(11))));     // float -> double
  b.add(node("IsInf", {"xd"}, {"inf"}));
  b.add(node("Cast", {"inf"}, {"flags"}, Attributes().set("to", I(7))));  // bool -> int64
  b.add(node("ReduceMax", {"flags"}, {"m"}, Attributes().set("keepdims", I(0))));
  b.add(node("Cast", {"m"}, {"any"}, Attributes().set("to", I(9))));  // int64 -> bool
  b.add(node("Where", {"any", "a", "c"}, {"y"}));
  b.add(node("Greater", {"x", "zero"}, {"positive"}));
  b.add(node("Cast", {"positive"}, {"pf"}, Attributes().set("to", I(1))));  // bool -> float
  b.add(node("ReduceMin", {"pf"}, {"all"}, Attributes().set("axes", std::vector<std::int64_t>{1})));
  b.add(node("Neg", {"all"}, {"z"}));
  b.g.types["xd"] = type({3, 4}, DType::kFloat64);
  b.g.types["inf"] = type({3, 4}, DType::kBool);
  b.g.types["flags"] = type({3, 4}, DType::kInt64);
  b.g.types["m"] = type({}, DType::kInt64);
  b.g.types["positive"] = type({3, 4}, DType::kBool);
  b.typed("pf", {3, 4}).typed("all", {3, 1});
  Graph g = b.build({"y", "z"});
  Tensor with_inf = random({3, 4}, 41);
  static_cast<float*>(with_inf.data_ptr())[5] = INFINITY;
  for (const Tensor& x : {random({3, 4}, 40), with_inf}) {
    int rewrites = 0;
    Graph out = run_pass(g, passes::predicate_reduction, {{"x", x}}, &rewrites);
    EXPECT_EQ(rewrites, 3) << out.str();
    EXPECT_EQ(find(out, "IsInf")->inputs[0], "x");
    EXPECT_EQ(find(out, "ReduceMax")->inputs[0], "inf");
    EXPECT_EQ(find(out, "ReduceMin")->inputs[0], "positive");
    out = run_pass(out, passes::identity_elimination, {{"x", x}}, &rewrites);
    EXPECT_EQ(rewrites, 1) << out.str();  // the int64 round trip of the any
    out = run_pass(out, passes::dead_node_elimination, {{"x", x}}, &rewrites);
    EXPECT_EQ(count(out, "Cast"), 1) << out.str();  // the all's float for the Neg
    EXPECT_EQ(find(out, "Where")->inputs[0], find(out, "ReduceMax")->outputs[0]);
    const std::vector<Tensor> y = run_graph(out, {{"x", x}});
    EXPECT_EQ(values(y[0])[0], x.data_ptr() == with_inf.data_ptr() ? 1.0f : 2.0f);
  }
}

// Note [Expands before broadcasting ops]: an Expand read by Div, whose other operand has the expanded shape, goes;
// one read by a MatMul, one whose reader would broadcast to less without it, and a pair read by one Mul stay.
TEST(IdentityElimination, ExpandsBeforeBroadcastingOpsGo) {
  Builder b;
  b.input("x", {2, 3, 4}).input("v", {2, 3, 1}).input("m", {4, 5}).input("s", {1});
  b.constant("shape", make_i64({3}, {2, 3, 4}));
  b.add(node("Expand", {"v", "shape"}, {"e1"})).add(node("Div", {"x", "e1"}, {"y1"}));
  b.add(node("Expand", {"v", "shape"}, {"e2"})).add(node("MatMul", {"e2", "m"}, {"y2"}));
  b.add(node("Expand", {"v", "shape"}, {"e3"})).add(node("Add", {"e3", "s"}, {"y3"}));
  b.add(node("Expand", {"v", "shape"}, {"e4"})).add(node("Expand", {"v", "shape"}, {"e5"}));
  b.add(node("Mul", {"e4", "e5"}, {"y4"}));
  for (const char* e : {"e1", "e2", "e3", "e4", "e5"}) b.typed(e, {2, 3, 4});
  b.typed("y1", {2, 3, 4}).typed("y2", {2, 3, 5}).typed("y3", {2, 3, 4}).typed("y4", {2, 3, 4});
  Graph g = b.build({"y1", "y2", "y3", "y4"});
  int rewrites = 0;
  const Feeds feeds = {{"x", random({2, 3, 4}, 21)}, {"v", random({2, 3, 1}, 22)}, {"m", random({4, 5}, 23)},
                       {"s", random({1}, 24)}};
  Graph out = run_pass(g, passes::identity_elimination, feeds, &rewrites);
  EXPECT_EQ(rewrites, 1) << out.str();
  EXPECT_EQ(count(out, "Expand"), 4);
  EXPECT_EQ(find(out, "Div")->inputs[1], "v");
}

// A Pad by zeros (torchvision's Swin at sizes its windows divide) is a no-op; one that pads stays.
TEST(IdentityElimination, PadsByZerosGo) {
  Builder b;
  b.input("x", {2, 3, 4}).constant("zeros", make_i64({6}, {0, 0, 0, 0, 0, 0}));
  b.constant("ones", make_i64({6}, {0, 0, 1, 0, 0, 1}));
  b.add(node("Pad", {"x", "zeros"}, {"p0"})).add(node("Neg", {"p0"}, {"y0"}));
  b.add(node("Pad", {"x", "ones"}, {"p1"})).add(node("Neg", {"p1"}, {"y1"}));
  b.typed("p0", {2, 3, 4}).typed("p1", {2, 3, 6});
  Graph g = b.build({"y0", "y1"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::identity_elimination, {{"x", random({2, 3, 4}, 26)}}, &rewrites);
  EXPECT_EQ(rewrites, 1) << out.str();
  EXPECT_EQ(count(out, "Pad"), 1);
  EXPECT_EQ(find(out, "Pad")->inputs[1], "ones");
}

TEST(IdentityElimination, ReshapeAttributeFormBeforeOpset5) {
  Builder b;
  b.g.opsets[""] = 4;
  b.input("x", {2, 3});
  b.add(node("Reshape", {"x"}, {"same"}, Attributes().set("shape", std::vector<std::int64_t>{0, -1})));
  b.add(node("Reshape", {"same"}, {"other"}, Attributes().set("shape", std::vector<std::int64_t>{3, 0})));
  b.add(node("Neg", {"other"}, {"y"}));
  Graph g = b.build({"y"});
  EXPECT_EQ(passes::identity_elimination(g, {}).rewrites, 1);
  EXPECT_EQ(count(g, "Reshape"), 1);
  EXPECT_EQ(find(g, "Reshape")->inputs[0], "x");
}

TEST(IdentityElimination, KeepsDropoutWhoseMaskIsReadOrInTrainingMode) {
  Builder b;
  b.input("x", {4}).input("training", {}).constant("ratio", scalar(0.0f));
  b.g.types["training"].dtype = DType::kBool;
  b.add(node("Dropout", {"x"}, {"d", "mask"}));
  b.add(node("Not", {"mask"}, {"nm"}));
  b.add(node("Dropout", {"x", "ratio", "training"}, {"d2"}));
  Graph g = b.build({"d", "nm", "d2"});
  EXPECT_EQ(passes::identity_elimination(g, {}).rewrites, 0);
  EXPECT_EQ(count(g, "Dropout"), 2);

  Builder inference;  // training_mode a constant false: a no-op
  Tensor no = Tensor::empty({}, DType::kBool);
  *static_cast<bool*>(no.data_ptr()) = false;
  inference.input("x", {4}).constant("ratio", scalar(0.5f)).constant("no", no);
  inference.add(node("Dropout", {"x", "ratio", "no"}, {"d", ""})).add(node("Neg", {"d"}, {"y"}));
  Graph gi = inference.build({"y"});
  EXPECT_EQ(passes::identity_elimination(gi, {}).rewrites, 1);
  EXPECT_EQ(count(gi, "Dropout"), 0);
}

// ---- dead_node_elimination ----

TEST(DeadNodeElimination, RemovesUnreadNodesAndConstants) {
  Builder b;
  b.input("x", {3}).constant("unused", make({1}, {1})).constant("k", make({3}, {1, 2, 3}));
  b.add(node("Add", {"x", "k"}, {"y"}));
  b.add(node("Exp", {"x"}, {"dead1"}));
  b.add(node("Neg", {"dead1"}, {"dead2"}));
  Graph g = b.build({"y"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::dead_node_elimination, {{"x", random({3}, 8)}}, &rewrites);
  EXPECT_EQ(rewrites, 3);
  EXPECT_EQ(out.nodes.size(), 1u);
  EXPECT_EQ(out.initializers.count("unused"), 0u);
  EXPECT_EQ(out.initializers.count("k"), 1u);
}

TEST(DeadNodeElimination, KeepsValuesReadBySubgraphs) {
  Builder b;
  b.input("x", {3}).input("cond", {});
  b.g.types["cond"].dtype = DType::kBool;
  b.add(node("Exp", {"x"}, {"e"}));  // read only inside the If branches
  auto branch = std::make_shared<Graph>();
  branch->nodes.push_back(node("Identity", {"e"}, {"out"}));
  branch->outputs = {"out"};
  Node n = node("If", {"cond"}, {"y"});
  n.graph_attrs["then_branch"] = branch;
  n.graph_attrs["else_branch"] = branch;
  b.add(n);
  Graph g = b.build({"y"});
  EXPECT_EQ(passes::dead_node_elimination(g, {}).rewrites, 0);
  EXPECT_EQ(count(g, "Exp"), 1);
}

// ---- conv_bn_folding ----

Builder conv_bn_graph(bool constant_scale) {
  Builder b;
  b.input("x", {1, 2, 5, 5}).constant("w", random({3, 2, 3, 3}, 9)).constant("b", random({3}, 10));
  if (constant_scale) {
    b.constant("scale", random({3}, 11, 0.5f, 1.5f));
  } else {
    b.input("scale", {3});
  }
  b.constant("shift", random({3}, 12)).constant("mean", random({3}, 13)).constant("var", random({3}, 14, 0.5f, 2.0f));
  b.add(node("Conv", {"x", "w", "b"}, {"c"}, Attributes().set("pads", std::vector<std::int64_t>{1, 1, 1, 1})));
  b.add(node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"y"}, Attributes().set("epsilon", 1e-3)));
  return b;
}

TEST(ConvBnFolding, FoldsIntoTheConvWeights) {
  Graph g = conv_bn_graph(true).build({"y"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::conv_bn_folding, {{"x", random({1, 2, 5, 5}, 15)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);
  EXPECT_EQ(count(out, "BatchNormalization"), 0);
  ASSERT_EQ(count(out, "Conv"), 1);
  EXPECT_EQ(find(out, "Conv")->outputs[0], "y");
  EXPECT_EQ(out.initializers.count("w"), 0u);  // replaced by the folded weights
  EXPECT_EQ(out.initializers.count("mean"), 0u);
}

TEST(ConvBnFolding, NotWithNonConstantParametersOrASharedConvOutput) {
  Graph g = conv_bn_graph(false).build({"y"});
  EXPECT_EQ(passes::conv_bn_folding(g, {}).rewrites, 0);
  Builder b = conv_bn_graph(true);
  b.add(node("Relu", {"c"}, {"r"}));
  Graph shared = b.build({"y", "r"});
  EXPECT_EQ(passes::conv_bn_folding(shared, {}).rewrites, 0);
}

// Note [Batch norms without a convolution become an affine map]: a BatchNormalization with no Conv before it is, in a
// CUDA plan, x * scale + shift per channel, which elementwise_fusion joins with the ReLU after it; CPU plans keep the
// BatchNormalization. The answers are the graph's.
TEST(ConvBnFolding, OtherBatchNormsBecomeAPerChannelAffineMapInCudaPlans) {
  Builder b;
  b.input("x", {2, 3, 4, 5});
  b.constant("scale", random({3}, 130, 0.5f, 1.5f)).constant("shift", random({3}, 131));
  b.constant("mean", random({3}, 132)).constant("var", random({3}, 133, 0.5f, 2.0f));
  b.add(node("BatchNormalization", {"x", "scale", "shift", "mean", "var"}, {"bn"}, Attributes().set("epsilon", 1e-3)));
  b.add(node("Relu", {"bn"}, {"y"}));
  const Graph g = b.build({"y"});
  runtime::InferOptions cuda;
  cuda.device = Device::cuda(0);
  Graph out = g;
  runtime::optimize(out, cuda, {});
  EXPECT_EQ(count(out, "BatchNormalization"), 0) << out.str();
  ASSERT_EQ(count(out, "FusedElementwise"), 1) << out.str();
  EXPECT_EQ(find(out, "FusedElementwise")->attrs.get_string("program", ""), "mul x0 x1; add t0 x2; relu t1");
  const Feeds feeds = {{"x", random({2, 3, 4, 5}, 134)}};
  expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true), 1e-5, 1e-5);
  Graph cpu = g;
  runtime::optimize(cpu, runtime::InferOptions{}, {});
  EXPECT_EQ(count(cpu, "BatchNormalization"), 1) << cpu.str();
}

// ---- conv_fusion ----

TEST(ConvFusion, FusesBiasResidualAndRelu) {
  Builder b;
  b.input("x", {1, 4, 6, 6}).input("z", {1, 4, 3, 3});
  b.constant("w", random({4, 2, 3, 3}, 16)).constant("b", random({4}, 17)).constant("cb", random({1, 4, 1, 1}, 18));
  b.add(node(
      "Conv", {"x", "w", "b"}, {"c"},
      Attributes().set("strides", std::vector<std::int64_t>{2, 2}).set("group", I(2)).set("auto_pad", "SAME_UPPER")));
  b.add(node("Add", {"cb", "c"}, {"cbias"}));
  b.add(node("Add", {"cbias", "z"}, {"res"}));
  b.add(node("Relu", {"res"}, {"y"}));
  b.typed("c", {1, 4, 3, 3}).typed("cbias", {1, 4, 3, 3}).typed("res", {1, 4, 3, 3}).typed("y", {1, 4, 3, 3});
  Graph g = b.build({"y"});
  int rewrites = 0;
  Graph out =
      run_pass(g, passes::conv_fusion, {{"x", random({1, 4, 6, 6}, 19)}, {"z", random({1, 4, 3, 3}, 20)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);
  ASSERT_EQ(out.nodes.size(), 1u);
  const Node& f = out.nodes[0];
  EXPECT_EQ(f.domain, kXpurtDomain);
  EXPECT_EQ(f.op_type, "FusedConv");
  EXPECT_EQ(f.inputs.size(), 4u);
  EXPECT_EQ(f.inputs[3], "z");
  EXPECT_EQ(f.attrs.get_string("activation", ""), "relu");
  EXPECT_EQ(f.attrs.get_ints("pads", {}), (std::vector<std::int64_t>{0, 0, 1, 1}));  // SAME_UPPER, 6 -> 3
  EXPECT_EQ(f.attrs.get_int("group", 0), 2);
  EXPECT_EQ(out.initializers.count("cb"), 0u);
  const Feeds feeds = {{"x", random({1, 4, 6, 6}, 19)}, {"z", random({1, 4, 3, 3}, 20)}};
  expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true));
}

// Note [3-D convolutions fused]: a 3-D Conv with a bias takes the per-channel Add, the residual and the ReLU (a
// FusedConv over a 5-D weight, SAME pads resolved on three axes); one without a bias stays a Conv, and an activation
// other than ReLU stays a node after the FusedConv. The answers are the graph's.
TEST(ConvFusion, ThreeDimensionalConvolutionsTakeBiasResidualAndRelu) {
  const Shape x_shape = {2, 4, 5, 6, 7}, y_shape = {2, 6, 3, 6, 4};
  const auto attrs = [] {
    return Attributes().set("strides", std::vector<std::int64_t>{2, 1, 2}).set("group", I(2)).set("auto_pad",
                                                                                                  "SAME_UPPER");
  };
  const Feeds feeds = {{"x", random(x_shape, 21)}, {"z", random(y_shape, 22)}};
  {
    Builder b;
    b.input("x", {2, 4, 5, 6, 7}).input("z", {2, 6, 3, 6, 4});
    b.constant("w", random({6, 2, 3, 3, 3}, 23)).constant("b", random({6}, 24));
    b.constant("cb", random({1, 6, 1, 1, 1}, 25));
    b.add(node("Conv", {"x", "w", "b"}, {"c"}, attrs()));
    b.add(node("Add", {"c", "cb"}, {"cbias"}));
    b.add(node("Add", {"z", "cbias"}, {"res"}));
    b.add(node("Relu", {"res"}, {"y"}));
    b.typed("c", {2, 6, 3, 6, 4}).typed("cbias", {2, 6, 3, 6, 4}).typed("res", {2, 6, 3, 6, 4}).typed("y", {2, 6, 3, 6, 4});
    const Graph g = b.build({"y"});
    int rewrites = 0;
    const Graph out = run_pass(g, passes::conv_fusion, feeds, &rewrites);
    EXPECT_EQ(rewrites, 1);
    ASSERT_EQ(out.nodes.size(), 1u) << out.str();
    const Node& f = out.nodes[0];
    EXPECT_EQ(f.op_type, "FusedConv");
    ASSERT_EQ(f.inputs.size(), 4u);
    EXPECT_EQ(f.inputs[3], "z");
    EXPECT_EQ(f.attrs.get_string("activation", ""), "relu");
    // SAME_UPPER: depth 5 -> 3 at stride 2 (pads 1, 1), height 6 -> 6 (1, 1), width 7 -> 4 (1, 1).
    EXPECT_EQ(f.attrs.get_ints("pads", {}), (std::vector<std::int64_t>{1, 1, 1, 1, 1, 1}));
    expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true));
  }
  {  // no bias: nothing fused
    Builder b;
    b.input("x", {2, 4, 5, 6, 7});
    b.constant("w", random({6, 2, 3, 3, 3}, 23));
    b.add(node("Conv", {"x", "w"}, {"c"}, attrs()));
    b.add(node("Relu", {"c"}, {"y"}));
    b.typed("c", {2, 6, 3, 6, 4}).typed("y", {2, 6, 3, 6, 4});
    const Graph g = b.build({"y"});
    int rewrites = 0;
    const Graph out = run_pass(g, passes::conv_fusion, {{"x", random(x_shape, 21)}}, &rewrites);
    EXPECT_EQ(rewrites, 0);
    EXPECT_EQ(count(out, "Conv"), 1) << out.str();
    EXPECT_EQ(count(out, "Relu"), 1) << out.str();
  }
  {  // a sigmoid stays a node
    Builder b;
    b.input("x", {2, 4, 5, 6, 7});
    b.constant("w", random({6, 2, 3, 3, 3}, 23)).constant("b", random({6}, 24));
    b.add(node("Conv", {"x", "w", "b"}, {"c"}, attrs()));
    b.add(node("Sigmoid", {"c"}, {"y"}));
    b.typed("c", {2, 6, 3, 6, 4}).typed("y", {2, 6, 3, 6, 4});
    const Graph g = b.build({"y"});
    const Graph out = run_pass(g, passes::conv_fusion, {{"x", random(x_shape, 21)}});
    ASSERT_EQ(count(out, "FusedConv"), 1) << out.str();
    EXPECT_EQ(find(out, "FusedConv")->attrs.get_string("activation", ""), "none");
    EXPECT_EQ(count(out, "Sigmoid"), 1) << out.str();
    expect_close(run_graph(g, {{"x", random(x_shape, 21)}}),
                 run_graph(out, {{"x", random(x_shape, 21)}}, nullptr, /*library_fused=*/true));
  }
}

// Note [ReLU6 in the CPU convolution's epilogue]: Clip(conv, 0, 6) (MobileNetV2's ReLU6; its bounds as inputs, and
// as attributes before opset 11) becomes the FusedConv's "relu6" in CPU plans, and in CUDA plans for a depthwise
// convolution only; other bounds keep the Clip. Outputs on both sides of 0 and 6, as the graph computes them.
TEST(ConvFusion, ReluSixGoesIntoTheCpuAndDepthwiseEpilogues) {
  for (const std::int64_t opset : {17, 9}) {
    for (const double high : {6.0, 5.0}) {
      for (const bool depthwise : {false, true}) {
        SCOPED_TRACE(detail::str_cat("opset ", opset, ", max ", high, depthwise ? ", depthwise" : ""));
        const std::int64_t o = depthwise ? 3 : 4;
        Builder b;
        b.g.opsets[""] = opset;
        b.input("x", {2, 3, 5, 5}).constant("w", random({o, depthwise ? 1 : 3, 3, 3}, 70, -2.0f, 2.0f));
        b.add(node("Conv", {"x", "w"}, {"c"},
                   Attributes().set("pads", std::vector<std::int64_t>{1, 1, 1, 1}).set("group", depthwise ? 3 : 1)));
        if (opset >= 11) {
          b.constant("lo", scalar(0.0f)).constant("hi", scalar(static_cast<float>(high)));
          b.add(node("Clip", {"c", "lo", "hi"}, {"y"}));
        } else {
          b.add(node("Clip", {"c"}, {"y"}, Attributes().set("min", 0.0).set("max", high)));
        }
        b.typed("c", {2, o, 5, 5}).typed("y", {2, o, 5, 5});
        const Graph g = b.build({"y"});
        const Feeds feeds = {{"x", random({2, 3, 5, 5}, 71, -3.0f, 3.0f)}};
        for (const bool cuda : {false, true}) {
          passes::PassContext ctx;
          if (cuda) ctx.device = Device::cuda(0);
          Graph out = g;
          passes::conv_fusion(out, ctx);
          const bool fused = (!cuda || depthwise) && high == 6.0;
          EXPECT_EQ(count(out, "Clip"), fused ? 0 : 1) << out.str();
          if (fused) {
            EXPECT_EQ(out.nodes[0].attrs.get_string("activation", ""), "relu6");
            expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true));
          }
        }
      }
    }
  }
}

// Note [GELU after a convolution]: SegFormer's Mix-FFN, a depthwise 3x3 whose output becomes tokens
// (flatten(2).transpose(1, 2)) before the GELU. The GELU moves before the views and into the convolution, on CUDA
// for a depthwise convolution only, on the CPU for any.
Graph conv_tokens_gelu_graph(std::int64_t groups) {
  Builder b;
  b.input("x", {2, 4, 5, 5});
  b.constant("w", random({4, 4 / groups, 3, 3}, 231)).constant("tokens", int64s({2, 4, 25}));
  b.add(node("Conv", {"x", "w"}, {"c"},
             Attributes().set("pads", std::vector<std::int64_t>{1, 1, 1, 1}).set("group", groups)));
  b.add(node("Reshape", {"c", "tokens"}, {"flat"}));
  b.add(node("Transpose", {"flat"}, {"t"}, Attributes().set("perm", std::vector<std::int64_t>{0, 2, 1})));
  Node gelu = node("Gelu", {"t"}, {"y"});
  gelu.domain = kXpurtDomain;
  gelu.attrs.set("approximate", std::string("none"));
  b.add(gelu);
  b.typed("c", {2, 4, 5, 5}).typed("flat", {2, 4, 25}).typed("t", {2, 25, 4}).typed("y", {2, 25, 4});
  return b.build({"y"});
}

TEST(ConvFusion, GeluReadThroughTokenViewsJoinsADepthwiseConvolution) {
  const Feeds feeds = {{"x", random({2, 4, 5, 5}, 232, -3.0f, 3.0f)}};
  for (const std::int64_t groups : {4, 1}) {
    for (const bool cuda : {true, false}) {
      passes::PassContext ctx;
      if (cuda) ctx.device = Device::cuda(0);
      const Graph g = conv_tokens_gelu_graph(groups);
      Graph out = g;
      passes::conv_fusion(out, ctx);
      out.validate();
      const bool fused = groups == 4 || !cuda;
      EXPECT_EQ(count(out, "Gelu"), fused ? 0 : 1) << out.str();
      const Node* conv = find(out, "FusedConv");
      ASSERT_NE(conv, nullptr) << out.str();
      EXPECT_EQ(conv->attrs.get_string("activation", ""), fused ? "gelu" : "none") << out.str();
      expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true));
    }
  }
}

TEST(ConvFusion, RespectsPatternBoundaries) {
  // A broadcast "residual" is not one; a Relu whose input has another reader stays; a non-constant weight stays.
  Builder b;
  b.input("x", {1, 2, 4, 4}).input("z", {1, 1, 1, 1}).input("w2", {2, 2, 1, 1});
  b.constant("w", random({2, 2, 1, 1}, 21));
  b.add(node("Conv", {"x", "w"}, {"c"}));
  b.add(node("Add", {"c", "z"}, {"a"}));
  b.add(node("Relu", {"a"}, {"y"}));
  b.add(node("Sigmoid", {"a"}, {"s"}));
  b.add(node("Conv", {"x", "w2"}, {"c2"}));
  b.typed("c", {1, 2, 4, 4}).typed("a", {1, 2, 4, 4}).typed("c2", {1, 2, 4, 4});
  Graph g = b.build({"y", "s", "c2"});
  Graph out =
      run_pass(g, passes::conv_fusion,
               {{"x", random({1, 2, 4, 4}, 22)}, {"z", random({1, 1, 1, 1}, 23)}, {"w2", random({2, 2, 1, 1}, 24)}});
  EXPECT_EQ(count(out, "FusedConv"), 1);
  EXPECT_EQ(count(out, "Conv"), 1);  // the one with a non-constant weight
  EXPECT_EQ(count(out, "Add"), 1);
  EXPECT_EQ(count(out, "Relu"), 1);
  EXPECT_EQ(find(out, "FusedConv")->attrs.get_string("activation", ""), "none");
}

TEST(ConvFusion, SameLowerPadsAndNotForFloat64) {
  Builder b;
  b.input("x", {1, 1, 5, 5}).constant("w", random({2, 1, 2, 2}, 57));
  b.add(node("Conv", {"x", "w"}, {"y"}, Attributes().set("auto_pad", "SAME_LOWER")));
  Graph g = b.typed("y", {1, 2, 5, 5}).build({"y"});
  Graph out = run_pass(g, passes::conv_fusion, {{"x", random({1, 1, 5, 5}, 58)}});
  ASSERT_EQ(count(out, "FusedConv"), 1);
  EXPECT_EQ(out.nodes[0].attrs.get_ints("pads", {}), (std::vector<std::int64_t>{1, 1, 0, 0}));
  Graph f64 = g;
  f64.types["x"].dtype = DType::kFloat64;
  EXPECT_EQ(passes::conv_fusion(f64, {}).rewrites, 0);
}

// ---- gemm_fusion ----

TEST(GemmFusion, MatMulBiasReluAndGemmWithAlphaBeta) {
  Builder b;
  b.input("x", {2, 3, 4}).input("a", {5, 4});
  b.constant("w", random({4, 6}, 25)).constant("bias", random({6}, 26));
  b.constant("gw", random({3, 4}, 27)).constant("gc", random({1, 3}, 28));
  b.add(node("MatMul", {"x", "w"}, {"m"}));
  b.add(node("Add", {"bias", "m"}, {"mb"}));
  b.add(node("Relu", {"mb"}, {"y"}));
  b.add(node("Gemm", {"a", "gw", "gc"}, {"g"}, Attributes().set("transB", I(1)).set("alpha", 2.0).set("beta", 0.5)));
  b.typed("m", {2, 3, 6}).typed("mb", {2, 3, 6});
  Graph g = b.build({"y", "g"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::gemm_fusion, {{"x", random({2, 3, 4}, 29)}, {"a", random({5, 4}, 30)}}, &rewrites);
  EXPECT_EQ(rewrites, 2);
  ASSERT_EQ(count(out, "Linear"), 2);
  EXPECT_EQ(out.nodes.size(), 2u);
  for (const Node& n : out.nodes) {
    if (n.outputs[0] == "y") {
      EXPECT_EQ(n.attrs.get_string("weight_layout", ""), "kn");
      EXPECT_EQ(n.attrs.get_string("activation", ""), "relu");
      EXPECT_EQ(n.inputs.size(), 3u);
    } else {
      EXPECT_EQ(n.attrs.get_string("weight_layout", ""), "nk");
      EXPECT_EQ(n.attrs.get_string("activation", ""), "none");
    }
  }
}

TEST(GemmFusion, NotWithoutConstantWeightsOrWithAFullMatrixC) {
  Builder b;
  b.input("x", {2, 4}).input("w", {4, 3}).constant("gw", random({4, 3}, 31)).constant("c", random({2, 3}, 32));
  b.add(node("MatMul", {"x", "w"}, {"m"}));
  b.add(node("Gemm", {"x", "gw", "c"}, {"g"}));
  b.add(node("Gemm", {"x", "gw"}, {"t"}, Attributes().set("transA", I(1))));
  Graph g = b.build({"m", "g", "t"});
  EXPECT_EQ(passes::gemm_fusion(g, {}).rewrites, 0);
}

// Note [Two residuals into two GEMMs]: a parallel attention + MLP block, y + (x W1 + b1) + x W2 (GPT-NeoX's form:
// the two projections added, then the stream), is two Linears and no Add: W2's takes the stream y, W1's takes W2's
// output; the answer is the graph's. An inner GEMM with an activation (added after it) keeps the Add.
TEST(GemmFusion, TheStreamOfAParallelBlockGoesIntoTheSecondGemm) {
  for (const bool gelu : {false, true}) {
    SCOPED_TRACE(gelu ? "gelu" : "plain");
    Builder b;
    b.input("h", {2, 5, 8}).input("y", {2, 5, 6});
    b.constant("w1", random({8, 6}, 41)).constant("b1", random({6}, 42)).constant("w2", random({8, 6}, 43));
    b.add(node("MatMul", {"h", "w1"}, {"m1"})).add(node("Add", {"m1", "b1"}, {"a1"}));
    b.add(node("MatMul", {"h", "w2"}, {"m2"}));
    std::string second = "m2";
    if (gelu) {
      b.add(node("Relu", {"m2"}, {"r2"}));
      second = "r2";
    }
    b.add(node("Add", {"a1", second}, {"s"})).add(node("Add", {"y", "s"}, {"out"}));
    Graph g = b.build({"out"});
    Graph out = g;
    runtime::optimize(out, runtime::InferOptions{}, {});
    EXPECT_EQ(count(out, "Linear"), 2) << out.str();
    EXPECT_EQ(count(out, "Add"), gelu ? 1 : 0) << out.str();
    const Feeds feeds = {{"h", random({2, 5, 8}, 44)}, {"y", random({2, 5, 6}, 45)}};
    expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true), 1e-5, 1e-5);
  }
}

// ---- quantized_fusion ----

Tensor quantized(const Shape& shape, DType dtype, unsigned seed, int low, int high) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(low, high);
  auto* p = static_cast<std::int8_t*>(t.data_ptr());  // int8, uint8, int4 (unpacked): one byte each
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<std::int8_t>(dist(gen));
  return t;
}

Tensor int8_scalar(std::int64_t v, DType dtype = DType::kInt8) {
  Tensor t = Tensor::empty({}, dtype);
  *static_cast<std::int8_t*>(t.data_ptr()) = static_cast<std::int8_t>(v);
  return t;
}

// Types of every value through the engine's inference (no folding: the weights' DequantizeLinear nodes stay).
Graph with_types(Graph g) {
  runtime::InferOptions options;
  options.fold_constants = false;
  runtime::infer_types(g, options);
  return g;
}

// xrt.quantize's int8 form of Q(x) -> DQ -> MatMul(DQ(w) per column) + bias -> Relu -> Q, a Gemm with transB=1 and
// alpha/beta and a float output, and Q -> DQ -> Conv(DQ(w) per output channel, bias, groups 2, stride 2) -> Q, at odd
// sizes.
Graph qdq_graph(bool gemm_scale_is_input = false) {
  Builder b;
  b.input("x", {3, 5}).input("img", {2, 4, 7, 5});
  if (gemm_scale_is_input) b.input("gw_scale", {4});
  b.constant("sx", scalar(0.02f)).constant("zx", int8_scalar(3)).constant("sy", scalar(0.05f));
  b.constant("zy", int8_scalar(-2)).constant("w", quantized({5, 6}, DType::kInt8, 60, -127, 127));
  b.constant("w_scale", random({6}, 61, 0.001f, 0.01f)).constant("bias", random({6}, 62));
  b.add(node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"})).add(node("DequantizeLinear", {"xq", "sx", "zx"}, {"xf"}));
  b.add(node("DequantizeLinear", {"w", "w_scale"}, {"wf"}, Attributes().set("axis", I(1))));
  b.add(node("MatMul", {"xf", "wf"}, {"m"})).add(node("Add", {"m", "bias"}, {"mb"}));
  b.add(node("Relu", {"mb"}, {"r"})).add(node("QuantizeLinear", {"r", "sy", "zy"}, {"yq"}));
  // Gemm, transB=1 ([N, K] weights, per-row scales), reading the same DQ(x) as the MatMul.
  b.constant("gw", quantized({4, 5}, DType::kInt8, 63, -127, 127)).constant("gc", random({4}, 64));
  if (!gemm_scale_is_input) b.constant("gw_scale", random({4}, 65, 0.001f, 0.01f));
  b.add(node("DequantizeLinear", {"gw", "gw_scale"}, {"gwf"}, Attributes().set("axis", I(0))));
  b.add(node("Gemm", {"xf", "gwf", "gc"}, {"g"}, Attributes().set("transB", I(1)).set("alpha", 0.5).set("beta", 2.0)));
  // Conv: uint8 activations.
  b.constant("si", scalar(0.03f)).constant("zi", int8_scalar(128, DType::kUInt8));
  b.constant("cw", quantized({6, 2, 3, 3}, DType::kInt8, 66, -127, 127)).constant("cb", random({6}, 67));
  b.constant("cw_scale", random({6}, 68, 0.001f, 0.01f)).constant("so", scalar(0.04f));
  b.constant("zo", int8_scalar(0));
  b.add(node("QuantizeLinear", {"img", "si", "zi"}, {"iq"})).add(node("DequantizeLinear", {"iq", "si", "zi"}, {"if"}));
  b.add(node("DequantizeLinear", {"cw", "cw_scale"}, {"cwf"}, Attributes().set("axis", I(0))));
  b.add(node("Conv", {"if", "cwf", "cb"}, {"c"},
             Attributes().set("group", I(2)).set("strides", std::vector<std::int64_t>{2, 2})
                 .set("pads", std::vector<std::int64_t>{1, 0, 1, 2})));
  b.add(node("QuantizeLinear", {"c", "so", "zo"}, {"cq"}));
  return with_types(b.build({"yq", "g", "cq"}));
}

// Requantized outputs within one quantization step, float ones within `rtol` of their range.
void expect_within_a_step(const std::vector<Tensor>& expected, const std::vector<Tensor>& actual, double rtol = 1e-5) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(expected[i].shape(), actual[i].shape()) << "output " << i;
    ASSERT_EQ(expected[i].dtype(), actual[i].dtype()) << "output " << i;
    const Values e = values(ops::cast(expected[i], DType::kFloat32));
    const Values a = values(ops::cast(actual[i], DType::kFloat32));
    const bool quantized_output = expected[i].dtype() != DType::kFloat32;
    double range = 0;
    for (float v : e) range = std::max(range, static_cast<double>(std::fabs(v)));
    int differing = 0;
    for (std::size_t k = 0; k < e.size(); ++k) {
      ASSERT_NEAR(a[k], e[k], quantized_output ? 1.0 : rtol * range + 1e-6) << "output " << i << " element " << k;
      differing += a[k] != e[k] ? 1 : 0;
    }
    if (quantized_output) {
      EXPECT_LE(differing * 20, static_cast<int>(e.size())) << "output " << i;
    }
  }
}

TEST(QuantizedFusion, DequantizeGemmConvChainsBecomeInt8Ops) {
  const Graph g = qdq_graph();
  Graph out = g;
  passes::PassContext ctx;
  ctx.keep_quantized_weights = true;
  const passes::PassResult r = passes::quantized_fusion(out, ctx);
  EXPECT_GE(r.rewrites, 3);
  ASSERT_EQ(count(out, "QLinear"), 2) << out.str();
  ASSERT_EQ(count(out, "QConv"), 1) << out.str();
  // The two Qs of the inputs stay; every DequantizeLinear went (the shared DQ(x) once both readers were fused).
  EXPECT_EQ(count(out, "DequantizeLinear"), 0) << out.str();
  EXPECT_EQ(count(out, "QuantizeLinear"), 2) << out.str();
  for (const Node& n : out.nodes) {
    if (n.op_type == "QLinear" && n.outputs[0] == "yq") {
      EXPECT_EQ(n.attrs.get_string("output_dtype", ""), "int8");
      EXPECT_EQ(n.attrs.get_string("activation", ""), "relu");
      // The MatMul's [K, N] weight, transposed into a new [N, K] constant (the old one is gone).
      EXPECT_EQ(n.attrs.get_string("weight_layout", ""), "nk");
      ASSERT_TRUE(out.is_constant(n.inputs[1]));
      const Tensor& w = out.initializers.at(n.inputs[1]);
      EXPECT_EQ(w.shape(), (std::vector<std::int64_t>{6, 5}));
      const Tensor& original = g.initializers.at("w");
      for (std::int64_t k = 0; k < 5; ++k) {
        for (std::int64_t c = 0; c < 6; ++c) {
          EXPECT_EQ(static_cast<const std::int8_t*>(w.data_ptr())[c * 5 + k],
                    static_cast<const std::int8_t*>(original.data_ptr())[k * 6 + c]);
        }
      }
      EXPECT_FALSE(out.is_constant("w"));
      EXPECT_EQ(n.attrs.get_int("x_zero_point", 0), 3);
      EXPECT_EQ(n.attrs.get_int("y_zero_point", 0), -2);
      EXPECT_EQ(n.inputs.size(), 4u);
    } else if (n.op_type == "QLinear") {
      EXPECT_EQ(n.outputs[0], "g");
      EXPECT_EQ(n.attrs.get_string("output_dtype", ""), "float32");
      EXPECT_EQ(n.attrs.get_string("weight_layout", ""), "nk");
    } else if (n.op_type == "QConv") {
      EXPECT_EQ(n.attrs.get_string("output_dtype", ""), "int8");
      EXPECT_EQ(n.attrs.get_int("groups", 0), 2);
      EXPECT_EQ(n.attrs.get_int("x_zero_point", 0), 128);
    }
  }
  const Feeds feeds = {{"x", random({3, 5}, 69, -2.0f, 2.0f)}, {"img", random({2, 4, 7, 5}, 70, -3.0f, 3.0f)}};
  expect_within_a_step(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true));
  // The whole list with the folding keeping the weights' DQs for the pass, as runtime::optimize runs it.
  Graph piped = g;
  passes::run_passes(piped, ctx);
  EXPECT_EQ(count(piped, "QLinear") + count(piped, "QConv"), 3) << piped.str();
  // Switched off: nothing fused, the weights' DQs folded as before.
  Graph off = g;
  passes::run_passes(off, {}, {"quantized_fusion"});
  EXPECT_EQ(count(off, "QLinear") + count(off, "QConv"), 0);
  EXPECT_EQ(count(off, "DequantizeLinear"), 2) << off.str();  // the activations' only
}

TEST(QuantizedFusion, NearMissesAreLeftAlone) {
  passes::PassContext ctx;
  // A weight scale that is not constant: the Gemm stays, the MatMul and the Conv fuse; the shared DQ(x) stays for it.
  {
    Graph g = qdq_graph(/*gemm_scale_is_input=*/true);
    EXPECT_EQ(passes::quantized_fusion(g, ctx).rewrites, 2);
    EXPECT_EQ(count(g, "Gemm"), 1);
    EXPECT_EQ(count(g, "QLinear"), 1);
    EXPECT_EQ(count(g, "DequantizeLinear"), 2) << g.str();  // x's (read by the Gemm) and the Gemm weight's
  }
  // A per-channel activation scale, and an int4 weight (opset 21): left to the node kernels.
  Builder b;
  b.g.opsets[""] = 21;
  b.input("x", {3, 4});
  b.constant("sx", random({4}, 71, 0.01f, 0.02f)).constant("zx", quantized({4}, DType::kInt8, 72, 0, 0));
  b.constant("w", quantized({4, 2}, DType::kInt8, 73, -127, 127)).constant("ws", scalar(0.01f));
  b.constant("w4", quantized({4, 2}, DType::kInt4, 74, -8, 7)).constant("s", scalar(0.02f));
  b.add(node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"}, Attributes().set("axis", I(1))));
  b.add(node("DequantizeLinear", {"xq", "sx", "zx"}, {"xf"}, Attributes().set("axis", I(1))));
  b.add(node("DequantizeLinear", {"w", "ws"}, {"wf"})).add(node("MatMul", {"xf", "wf"}, {"y"}));
  b.add(node("QuantizeLinear", {"x", "s"}, {"xq2"}, Attributes().set("output_dtype", I(3))));
  b.add(node("DequantizeLinear", {"xq2", "s"}, {"xf2"}));
  b.add(node("DequantizeLinear", {"w4", "s"}, {"w4f"})).add(node("MatMul", {"xf2", "w4f"}, {"y4"}));
  Graph g = with_types(b.build({"y", "y4"}));
  Graph out = g;
  ctx.keep_quantized_weights = true;
  const passes::PassResult r = passes::quantized_fusion(out, ctx);
  EXPECT_EQ(count(out, "QLinear"), 0) << out.str();
  EXPECT_EQ(count(out, "MatMul"), 2);
  // ... and with keep_quantized_weights the pass folded the weights' DQs it left (the int8 and the int4 one).
  EXPECT_EQ(count(out, "DequantizeLinear"), 2) << out.str();
  EXPECT_GE(r.rewrites, 2);
  const Feeds feeds = {{"x", random({3, 4}, 75)}};
  expect_close(run_graph(g, feeds), run_graph(out, feeds));
}

// ONNX Runtime's quantize_dynamic: DynamicQuantizeLinear -> MatMulInteger(x_q, W, x_zp) -> Cast -> Mul. The
// MatMulInteger becomes a QLinear of output int32 whose fifth input is the run-time zero point, its [K, N] weight
// transposed to [N, K]; the int32 sums are exact, so the outputs equal the unfused graph's bit for bit. An int8 x with
// an int8 run-time zero point (a graph input) too.
TEST(QuantizedFusion, RunTimeZeroPointOfMatMulInteger) {
  Builder b;
  b.input("x", {5, 12}).input("a8", {4, 12}).input("z8", {});
  b.g.types["a8"] = type({4, 12}, DType::kInt8);
  b.g.types["z8"] = type({}, DType::kInt8);
  b.constant("w", quantized({12, 7}, DType::kInt8, 80, -127, 127)).constant("w_scale", scalar(0.02f));
  b.add(node("DynamicQuantizeLinear", {"x"}, {"xq", "xs", "xzp"}));
  b.add(node("MatMulInteger", {"xq", "w", "xzp"}, {"acc"}));
  b.add(node("Cast", {"acc"}, {"accf"}, Attributes().set("to", I(1))));
  b.add(node("Mul", {"xs", "w_scale"}, {"s"})).add(node("Mul", {"accf", "s"}, {"y"}));
  b.add(node("MatMulInteger", {"a8", "w", "z8"}, {"acc8"}));
  Graph g = with_types(b.build({"y", "acc8"}));
  Graph out = g;
  passes::PassContext ctx;
  passes::quantized_fusion(out, ctx);
  ASSERT_EQ(count(out, "QLinear"), 2) << out.str();
  EXPECT_EQ(count(out, "MatMulInteger"), 0);
  for (const Node& n : out.nodes) {
    if (n.op_type != "QLinear") continue;
    ASSERT_EQ(n.inputs.size(), 5u) << out.str();
    EXPECT_EQ(n.inputs[4], n.outputs[0] == "acc" ? "xzp" : "z8");
    EXPECT_TRUE(n.inputs[2].empty() && n.inputs[3].empty());
    EXPECT_EQ(n.attrs.get_string("output_dtype", ""), "int32");
    EXPECT_EQ(n.attrs.get_string("weight_layout", ""), "nk");
    EXPECT_EQ(out.initializers.at(n.inputs[1]).shape(), (std::vector<std::int64_t>{7, 12}));
  }
  EXPECT_FALSE(out.is_constant("w"));  // both readers take the one [N, K] copy
  Tensor z8 = int8_scalar(-3);
  const Feeds feeds = {{"x", random({5, 12}, 81, -3.0f, 5.0f)}, {"a8", quantized({4, 12}, DType::kInt8, 82, -128, 127)},
                       {"z8", z8}};
  const std::vector<Tensor> want = run_graph(g, feeds), got = run_graph(out, feeds, nullptr, /*library_fused=*/true);
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].dtype(), got[i].dtype());
    ASSERT_EQ(want[i].nbytes(), got[i].nbytes());
    EXPECT_EQ(std::memcmp(want[i].data_ptr(), got[i].data_ptr(), want[i].nbytes()), 0) << "output " << i;
  }
  // A zero point of two elements (per row) is not one value: the node stays.
  Builder rows;
  rows.input("a", {2, 4}).input("z", {2});
  rows.g.types["a"] = type({2, 4}, DType::kUInt8);
  rows.g.types["z"] = type({2}, DType::kUInt8);
  rows.constant("w", quantized({4, 3}, DType::kInt8, 83, -127, 127));
  rows.add(node("MatMulInteger", {"a", "w", "z"}, {"acc"}));
  Graph per_row = with_types(rows.build({"acc"}));
  passes::quantized_fusion(per_row, ctx);
  EXPECT_EQ(count(per_row, "QLinear"), 0) << per_row.str();
}

// ---- gelu_fusion ----

// x * 0.5 * (1 + erf(x / sqrt(2))) in one of three operand orders.
Graph erf_gelu_graph(int order, float sqrt2 = 1.4142135f) {
  Builder b;
  b.input("x", {2, 8}).constant("sqrt2", scalar(sqrt2)).constant("one", scalar(1.0f)).constant("half", scalar(0.5f));
  if (order == 3) {  // x * (1 / sqrt(2))
    b.constant("inv_sqrt2", scalar(1.0f / sqrt2));
    b.add(node("Mul", {"inv_sqrt2", "x"}, {"d"}));
  } else {
    b.add(node("Div", {"x", "sqrt2"}, {"d"}));
  }
  b.add(node("Erf", {"d"}, {"e"})).add(node("Add", {"e", "one"}, {"t"}));
  if (order == 0 || order == 3) {  // (x * t) * 0.5
    b.add(node("Mul", {"x", "t"}, {"xt"})).add(node("Mul", {"xt", "half"}, {"y"}));
  } else if (order == 1) {  // (x * 0.5) * t
    b.add(node("Mul", {"x", "half"}, {"xh"})).add(node("Mul", {"xh", "t"}, {"y"}));
  } else {  // (0.5 * t) * x
    b.add(node("Mul", {"half", "t"}, {"th"})).add(node("Mul", {"th", "x"}, {"y"}));
  }
  return b.build({"y"});
}

TEST(GeluFusion, ErfFormInEveryOperandOrder) {
  for (int order = 0; order < 4; ++order) {
    int rewrites = 0;
    Graph out = run_pass(erf_gelu_graph(order), passes::gelu_fusion, {{"x", random({2, 8}, 33, -3, 3)}}, &rewrites);
    EXPECT_EQ(rewrites, 1) << order;
    ASSERT_EQ(out.nodes.size(), 1u) << order;
    EXPECT_EQ(out.nodes[0].op_type, "Gelu");
    EXPECT_EQ(out.nodes[0].attrs.get_string("approximate", ""), "none");
  }
  Graph wrong = erf_gelu_graph(0, 1.7320508f);  // sqrt(3): not GELU
  EXPECT_EQ(passes::gelu_fusion(wrong, {}).rewrites, 0);
  // An intermediate value read outside the pattern.
  Graph shared = erf_gelu_graph(1);
  shared.nodes.push_back(node("Neg", {"e"}, {"ne"}));
  shared.outputs.push_back("ne");
  shared.validate();
  EXPECT_EQ(passes::gelu_fusion(shared, {}).rewrites, 0);
}

TEST(GeluFusion, TanhFormAndOnnxGeluThenLinear) {
  Builder b;
  b.input("x", {3, 4}).constant("three", scalar(3.0f)).constant("k", scalar(0.044715f));
  b.constant("s", scalar(0.7978845608f)).constant("one", scalar(1.0f)).constant("half", scalar(0.5f));
  b.add(node("Pow", {"x", "three"}, {"p"})).add(node("Mul", {"k", "p"}, {"kp"})).add(node("Add", {"x", "kp"}, {"u"}));
  b.add(node("Mul", {"u", "s"}, {"su"})).add(node("Tanh", {"su"}, {"th"})).add(node("Add", {"one", "th"}, {"t"}));
  b.add(node("Mul", {"x", "half"}, {"xh"})).add(node("Mul", {"xh", "t"}, {"y"}));
  // The same with x^3 as x * (x * x) on a second input.
  b.input("x2", {3, 4});
  b.add(node("Mul", {"x2", "x2"}, {"sq2"})).add(node("Mul", {"x2", "sq2"}, {"p2"}));
  b.add(node("Mul", {"p2", "k"}, {"kp2"})).add(node("Add", {"kp2", "x2"}, {"u2"}));
  b.add(node("Mul", {"s", "u2"}, {"su2"})).add(node("Tanh", {"su2"}, {"th2"})).add(node("Add", {"th2", "one"}, {"t2"}));
  b.add(node("Mul", {"t2", "x2"}, {"xt2"})).add(node("Mul", {"half", "xt2"}, {"y2"}));
  Graph g = b.build({"y", "y2"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::gelu_fusion, {{"x", random({3, 4}, 34, -3, 3)}, {"x2", random({3, 4}, 56, -3, 3)}},
                       &rewrites);
  EXPECT_EQ(rewrites, 2);
  ASSERT_EQ(out.nodes.size(), 2u);
  for (const Node& n : out.nodes) EXPECT_EQ(n.attrs.get_string("approximate", ""), "tanh");
  // Not in float64 (the registry's gelu takes 16- and 32-bit floats).
  Graph f64 = g;
  f64.types["x"].dtype = DType::kFloat64;
  f64.types["x2"].dtype = DType::kFloat64;
  EXPECT_EQ(passes::gelu_fusion(f64, {}).rewrites, 0);

  Builder o;
  o.input("x", {2, 4}).constant("w", random({4, 5}, 35));
  o.add(node("MatMul", {"x", "w"}, {"m"})).add(node("Gelu", {"m"}, {"y"}));
  Graph onnx_gelu = o.typed("m", {2, 5}).build({"y"});
  onnx_gelu.opsets[""] = 20;
  const Feeds feeds = {{"x", random({2, 4}, 36)}};
  Graph fused = run_pass(onnx_gelu, passes::gelu_fusion, feeds);
  EXPECT_EQ(find(fused, "Gelu")->domain, kXpurtDomain);
  Graph linear = run_pass(fused, passes::gemm_fusion, feeds);
  ASSERT_EQ(linear.nodes.size(), 1u);
  EXPECT_EQ(linear.nodes[0].attrs.get_string("activation", ""), "gelu");
}

// ---- layer_norm_fusion ----

Graph layer_norm_graph(std::int64_t axis, std::int64_t opset, bool pow) {
  Builder b;
  b.g.opsets[""] = opset;
  b.input("x", {2, 3, 8}).constant("two", scalar(2.0f)).constant("eps", scalar(1e-5f));
  b.constant("gamma", random({8}, 37, 0.5f, 1.5f)).constant("beta", random({8}, 38));
  auto reduce = [&](const std::string& in, const std::string& out) {
    if (opset >= 18) {
      b.constant("axes", make_i64({1}, {axis}));
      return node("ReduceMean", {in, "axes"}, {out});
    }
    return node("ReduceMean", {in}, {out}, Attributes().set("axes", std::vector<std::int64_t>{axis}));
  };
  b.add(reduce("x", "mean")).add(node("Sub", {"x", "mean"}, {"d"}));
  b.add(pow ? node("Pow", {"d", "two"}, {"sq"}) : node("Mul", {"d", "d"}, {"sq"}));
  b.add(reduce("sq", "var")).add(node("Add", {"var", "eps"}, {"ve"})).add(node("Sqrt", {"ve"}, {"std"}));
  b.add(node("Div", {"d", "std"}, {"n"}))
      .add(node("Mul", {"gamma", "n"}, {"sc"}))
      .add(node("Add", {"sc", "beta"}, {"y"}));
  return b.build({"y"});
}

TEST(LayerNormFusion, FormulaOverTheLastAxisBothOpsetForms) {
  for (auto [axis, opset, pow] : {std::tuple<std::int64_t, std::int64_t, bool>{-1, 17, true}, {2, 18, false}}) {
    int rewrites = 0;
    Graph out = run_pass(layer_norm_graph(axis, opset, pow), passes::layer_norm_fusion, {{"x", random({2, 3, 8}, 39)}},
                         &rewrites);
    EXPECT_EQ(rewrites, 1);
    ASSERT_EQ(out.nodes.size(), 1u);
    const Node& n = out.nodes[0];
    EXPECT_EQ(n.domain, kXpurtDomain);
    EXPECT_EQ(n.inputs, (std::vector<std::string>{"x", "gamma", "beta"}));
    EXPECT_NEAR(n.attrs.get_float("epsilon", 0), 1e-5, 1e-9);
  }
  Graph wrong_axis = layer_norm_graph(1, 17, true);
  EXPECT_EQ(passes::layer_norm_fusion(wrong_axis, {}).rewrites, 0);
}

TEST(LayerNormFusion, ScaleWithLeadingOnesIsReshapedAndABroadcastingScaleIsNotAScale) {
  Graph g = layer_norm_graph(-1, 17, true);
  g.initializers["gamma"] = random({1, 1, 8}, 59, 0.5f, 1.5f);
  int rewrites = 0;
  Graph out = run_pass(g, passes::layer_norm_fusion, {{"x", random({2, 3, 8}, 39)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);
  ASSERT_EQ(out.nodes.size(), 1u);
  EXPECT_EQ(out.initializers.at(out.nodes[0].inputs[1]).shape(), (Shape{8}));
  EXPECT_EQ(out.initializers.count("gamma"), 0u);
  // A [3, 8] "scale" varies along another axis: the Mul and Add stay outside the fused node.
  Graph per_row = layer_norm_graph(-1, 17, true);
  per_row.initializers["gamma"] = random({3, 8}, 59, 0.5f, 1.5f);
  out = run_pass(per_row, passes::layer_norm_fusion, {{"x", random({2, 3, 8}, 39)}});
  EXPECT_EQ(count(out, "LayerNormalization"), 1);
  EXPECT_EQ(count(out, "Mul"), 1);
  EXPECT_EQ(count(out, "Add"), 1);
  EXPECT_EQ(find(out, "LayerNormalization")->inputs.size(), 1u);
}

TEST(LayerNormFusion, OnnxLayerNormalizationWithUnusedStatistics) {
  Builder b;
  b.input("x", {4, 6}).constant("gamma", random({6}, 40)).constant("beta", random({6}, 41));
  b.add(node("LayerNormalization", {"x", "gamma", "beta"}, {"y", "", ""}, Attributes().set("epsilon", 1e-3)));
  b.add(node("LayerNormalization", {"x", "gamma"}, {"y2", "mean"}));
  Graph g = b.build({"y", "y2", "mean"});
  int rewrites = 0;
  Graph out = run_pass(g, passes::layer_norm_fusion, {{"x", random({4, 6}, 42)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);  // not the one whose mean output is read
  EXPECT_EQ(out.nodes[0].domain, kXpurtDomain);
  EXPECT_EQ(out.nodes[0].attrs.get_int("axis", 0), 1);
}

TEST(ResidualLayerNormFusion, AddReadOnlyByTheLayerNormBecomesItsResidual) {
  auto fused_ln = [](std::vector<std::string> in, const std::string& out) {
    Node n = node("LayerNormalization", std::move(in), {out}, Attributes().set("axis", std::int64_t{-1}));
    n.domain = kXpurtDomain;
    return n;
  };
  Builder b;
  b.input("a", {3, 8}).input("r", {3, 8}).input("c", {1, 8}).constant("gamma", random({8}, 50));
  b.add(node("Add", {"a", "r"}, {"s"})).typed("s", {3, 8});
  b.add(fused_ln({"s", "gamma"}, "y"));
  // Not fused: a broadcasting Add, and an Add whose sum is also read elsewhere.
  b.add(node("Add", {"a", "c"}, {"t"})).typed("t", {3, 8});
  b.add(fused_ln({"t"}, "y2"));
  b.add(node("Add", {"a", "r"}, {"u"}, {}, "add_u")).typed("u", {3, 8});
  b.add(fused_ln({"u"}, "y3"));
  Graph g = b.build({"y", "y2", "y3", "u"});
  int rewrites = 0;
  const Feeds feeds = {{"a", random({3, 8}, 51)}, {"r", random({3, 8}, 52)}, {"c", random({1, 8}, 53)}};
  Graph out = run_pass(g, passes::residual_layer_norm_fusion, feeds, &rewrites);
  EXPECT_EQ(rewrites, 1);
  int adds = 0;
  for (const Node& n : out.nodes) adds += n.op_type == "Add";
  EXPECT_EQ(adds, 2);
  for (const Node& n : out.nodes) {
    if (n.outputs[0] == "y") {
      EXPECT_EQ(n.inputs, (std::vector<std::string>{"a", "gamma", "", "r"}));
    }
  }
}

// Swin V2's res-post-norm residual: x + layer_norm(f(x)), in either operand order, with or without a residual
// already fused; not an Add that broadcasts, one whose norm output is read elsewhere, or y + y.
TEST(PostNormResidualFusion, AddOfANormOnlyItReadsBecomesTheNormsAddend) {
  auto fused_ln = [](std::vector<std::string> in, const std::string& out) {
    Node n = node("LayerNormalization", std::move(in), {out}, Attributes().set("axis", std::int64_t{-1}));
    n.domain = kXpurtDomain;
    return n;
  };
  Builder b;
  b.input("a", {3, 8}).input("r", {3, 8}).input("c", {1, 8}).constant("gamma", random({8}, 54));
  b.constant("beta", random({8}, 55));
  b.add(fused_ln({"a", "gamma", "beta"}, "n1")).typed("n1", {3, 8});
  b.add(node("Add", {"r", "n1"}, {"y1"})).typed("y1", {3, 8});
  b.add(fused_ln({"a", "gamma", "", "r"}, "n2")).typed("n2", {3, 8});  // layer_norm(a + r), then + y1
  b.add(node("Add", {"n2", "y1"}, {"y2"})).typed("y2", {3, 8});
  // Not fused: a broadcasting Add, a norm output read twice, y + y.
  b.add(fused_ln({"r"}, "n3")).typed("n3", {3, 8});
  b.add(node("Add", {"n3", "c"}, {"y3"})).typed("y3", {3, 8});
  b.add(fused_ln({"a"}, "n4")).typed("n4", {3, 8});
  b.add(node("Add", {"n4", "r"}, {"y4"})).typed("y4", {3, 8});
  b.add(fused_ln({"r", "gamma"}, "n5")).typed("n5", {3, 8});
  b.add(node("Add", {"n5", "n5"}, {"y5"})).typed("y5", {3, 8});
  Graph g = b.build({"y1", "y2", "y3", "y4", "n4", "y5"});
  int rewrites = 0;
  const Feeds feeds = {{"a", random({3, 8}, 56)}, {"r", random({3, 8}, 57)}, {"c", random({1, 8}, 58)}};
  Graph out = run_pass(g, passes::post_norm_residual_fusion, feeds, &rewrites);  // outputs checked against g's
  EXPECT_EQ(rewrites, 2);
  EXPECT_EQ(count(out, "Add"), 3);
  for (const Node& n : out.nodes) {
    if (n.outputs[0] == "y1") {
      EXPECT_EQ(n.inputs, (std::vector<std::string>{"a", "gamma", "beta", "", "r"}));
    }
    if (n.outputs[0] == "y2") {
      EXPECT_EQ(n.inputs, (std::vector<std::string>{"a", "gamma", "", "r", "y1"}));
    }
  }
}

// ---- linear_epilogue_fusion (Note [Layer scale in the GEMM]) ----

TEST(LinearEpilogueFusion, LayerScaleGoesIntoTheWeightsAndTheResidualIntoTheGemm) {
  auto linear = [](const std::string& weight, const std::string& out) {
    Node n = node("Linear", {"x", weight, "bias"}, {out}, Attributes().set("weight_layout", std::string("kn")));
    n.domain = kXpurtDomain;
    return n;
  };
  Builder b;
  b.input("x", {2, 3, 6}).input("r", {2, 3, 8});
  b.constant("w", random({6, 8}, 60)).constant("bias", random({8}, 61)).constant("gamma", random({1, 1, 8}, 62, 0.1f, 0.5f));
  b.constant("w2", random({6, 8}, 63)).constant("gamma2", random({3, 8}, 64));
  b.add(linear("w", "h")).typed("h", {2, 3, 8});
  b.add(node("Mul", {"gamma", "h"}, {"s"})).typed("s", {2, 3, 8});
  b.add(node("Add", {"r", "s"}, {"y"})).typed("y", {2, 3, 8});
  // Not folded: a scale that varies along another axis than the features.
  b.add(linear("w2", "h2")).typed("h2", {2, 3, 8});
  b.add(node("Mul", {"h2", "gamma2"}, {"y2"})).typed("y2", {2, 3, 8});
  Graph g = b.build({"y", "y2"});
  int rewrites = 0;
  const Feeds feeds = {{"x", random({2, 3, 6}, 65)}, {"r", random({2, 3, 8}, 66)}};
  Graph out = run_pass(g, passes::linear_epilogue_fusion, feeds, &rewrites);
  EXPECT_EQ(rewrites, 1);
  EXPECT_EQ(count(out, "Mul"), 1);
  EXPECT_EQ(count(out, "Add"), 0);
  for (const Node& n : out.nodes) {
    if (n.outputs[0] == "y") {
      ASSERT_EQ(n.inputs.size(), 4u);
      EXPECT_EQ(n.inputs[3], "r");
    }
  }
  // float16: ConvNeXt's untrained layer scale (1e-6) would push the weights into subnormals: the Mul stays.
  Builder h;
  h.input("x", {4, 6});
  h.constant("w", ops::cast(random({6, 8}, 67), DType::kFloat16));
  h.constant("bias", ops::cast(random({8}, 68), DType::kFloat16));
  h.constant("gamma", ops::cast(random({8}, 69, 1e-6f, 2e-6f), DType::kFloat16));
  h.add(linear("w", "h")).typed("h", {4, 8});
  h.add(node("Mul", {"h", "gamma"}, {"y"})).typed("y", {4, 8});
  Graph tiny_scale = h.build({"y"});
  for (const char* v : {"x", "h", "y"}) tiny_scale.types[v].dtype = DType::kFloat16;
  passes::linear_epilogue_fusion(tiny_scale, {});
  EXPECT_EQ(count(tiny_scale, "Mul"), 1);
}

// MobileBERT's NoNorm after its GEMMs (x * s + t, per-feature constants): s into the weights, t into the bias, the
// residual Add after them into the GEMM; a Linear without a bias takes t as its bias; a constant that varies along
// another axis stays an Add.
TEST(LinearEpilogueFusion, PerFeatureShiftGoesIntoTheBias) {
  auto linear = [](const std::string& weight, const std::vector<std::string>& extra, const std::string& out) {
    std::vector<std::string> inputs = {"x", weight};
    inputs.insert(inputs.end(), extra.begin(), extra.end());
    Node n = node("Linear", inputs, {out}, Attributes().set("weight_layout", std::string("kn")));
    n.domain = kXpurtDomain;
    return n;
  };
  Builder b;
  b.input("x", {2, 3, 6}).input("r", {2, 3, 8});
  b.constant("w", random({6, 8}, 80)).constant("bias", random({8}, 81)).constant("s", random({8}, 82, 0.5f, 1.5f));
  b.constant("t", random({1, 8}, 83)).constant("w2", random({6, 8}, 84)).constant("t2", random({8}, 85));
  b.constant("w3", random({6, 8}, 86)).constant("t3", random({3, 8}, 87));
  b.add(linear("w", {"bias"}, "h")).typed("h", {2, 3, 8});
  b.add(node("Mul", {"h", "s"}, {"hs"})).typed("hs", {2, 3, 8});
  b.add(node("Add", {"t", "hs"}, {"ht"})).typed("ht", {2, 3, 8});
  b.add(node("Add", {"ht", "r"}, {"y"})).typed("y", {2, 3, 8});
  b.add(linear("w2", {}, "h2")).typed("h2", {2, 3, 8});
  b.add(node("Add", {"h2", "t2"}, {"y2"})).typed("y2", {2, 3, 8});
  b.add(linear("w3", {}, "h3")).typed("h3", {2, 3, 8});
  b.add(node("Add", {"h3", "t3"}, {"y3"})).typed("y3", {2, 3, 8});
  Graph g = b.build({"y", "y2", "y3"});
  int rewrites = 0;
  const Feeds feeds = {{"x", random({2, 3, 6}, 88)}, {"r", random({2, 3, 8}, 89)}};
  Graph out = run_pass(g, passes::linear_epilogue_fusion, feeds, &rewrites);
  EXPECT_EQ(rewrites, 2);
  EXPECT_EQ(count(out, "Mul"), 0);
  EXPECT_EQ(count(out, "Add"), 1);  // y3's: t3 varies along the rows
  for (const Node& n : out.nodes) {
    if (n.outputs[0] == "y") {
      ASSERT_EQ(n.inputs.size(), 4u);
      EXPECT_EQ(n.inputs[3], "r");
    }
    if (n.outputs[0] == "y2") {
      EXPECT_EQ(n.inputs.size(), 3u);  // t2 is its bias now
    }
  }
}

// The scaled float16 weights are float_to_half(half_to_float(w) * gamma) for every element, in both weight layouts
// and at sizes that are not multiples of the 8 halves the F16C path converts at once; a scale that would overflow
// float16 leaves the Mul.
// A batch norm over the flattened rows of a Linear (LeViT's LinearNorm: Linear over [B, N, C], Reshape [B * N, C],
// then the norm's per-feature Mul and Add) folds into the Linear through the Reshape, which moves after it (Note
// [Feature maps through a Reshape]); a Reshape that moves the features off the last axis does not.
TEST(LinearEpilogueFusion, PerFeatureAffineFoldsThroughAReshapeThatKeepsTheFeaturesLast) {
  auto linear = [](const std::string& weight, const std::string& out) {
    Node n = node("Linear", {"x", weight, "bias"}, {out}, Attributes().set("weight_layout", std::string("kn")));
    n.domain = kXpurtDomain;
    return n;
  };
  Builder b;
  b.input("x", {2, 5, 6});
  b.constant("w", random({6, 8}, 70)).constant("bias", random({8}, 71)).constant("w2", random({6, 8}, 72));
  b.constant("s", random({8}, 73, 0.5f, 1.5f)).constant("t", random({8}, 74));
  b.constant("rows", make_i64({2}, {10, 8})).constant("moved", make_i64({2}, {2, 40}));
  b.add(linear("w", "h")).typed("h", {2, 5, 8});
  b.add(node("Reshape", {"h", "rows"}, {"hr"})).typed("hr", {10, 8});
  b.add(node("Mul", {"hr", "s"}, {"hs"})).typed("hs", {10, 8});
  b.add(node("Add", {"hs", "t"}, {"y"})).typed("y", {10, 8});
  b.add(linear("w2", "h2")).typed("h2", {2, 5, 8});  // [2, 40]: the features are not the last axis any more
  b.add(node("Reshape", {"h2", "moved"}, {"h2r"})).typed("h2r", {2, 40});
  b.constant("u", random({40}, 75));
  b.add(node("Add", {"h2r", "u"}, {"y2"})).typed("y2", {2, 40});
  Graph g = b.build({"y", "y2"});
  int rewrites = 0;
  const Feeds feeds = {{"x", random({2, 5, 6}, 76)}};
  Graph out = run_pass(g, passes::linear_epilogue_fusion, feeds, &rewrites);
  EXPECT_EQ(rewrites, 1);
  EXPECT_EQ(count(out, "Mul"), 0) << out.str();
  EXPECT_EQ(count(out, "Add"), 1) << out.str();  // y2's
  EXPECT_EQ(count(out, "Reshape"), 2) << out.str();
  for (const Node& n : out.nodes) {
    if (n.outputs[0] == "y") {
      EXPECT_EQ(n.op_type, "Reshape") << n.str();
      EXPECT_EQ(n.inputs[0], "h") << n.str();
    }
  }
}

// A residual Add behind Reshapes joins the Linear (Note [Residuals through views]): behind two Reshapes with no
// per-feature constant (the residual read through a Reshape to the Linear's shape), and behind LeViT's whole form
// (Reshape keeping the features last, Mul, Add, Reshape back, residual Add); the chain becomes one Reshape after the
// Linear. A broadcast operand is no residual: that Add stays.
TEST(LinearEpilogueFusion, ResidualAddsFoldThroughChainsOfReshapes) {
  auto linear = [](const std::string& weight, const std::string& out) {
    Node n = node("Linear", {"x", weight}, {out}, Attributes().set("weight_layout", std::string("kn")));
    n.domain = kXpurtDomain;
    return n;
  };
  Builder b;
  b.input("x", {2, 5, 6}).input("r", {5, 2, 8}).input("r2", {2, 5, 8}).input("r3", {1, 8});
  for (const char* w : {"w", "w2", "w3"}) b.constant(w, random({6, 8}, 80 + w[1]));
  b.constant("s", random({8}, 83, 0.5f, 1.5f)).constant("t", random({8}, 84));
  b.constant("flat", make_i64({2}, {10, 8})).constant("swap", make_i64({3}, {5, 2, 8}))
      .constant("back", make_i64({3}, {2, 5, 8}));
  // y = Reshape(Reshape(x w)) + r: features and rows regrouped twice
  b.add(linear("w", "h")).typed("h", {2, 5, 8});
  b.add(node("Reshape", {"h", "flat"}, {"hf"})).typed("hf", {10, 8});
  b.add(node("Reshape", {"hf", "swap"}, {"hs"})).typed("hs", {5, 2, 8});
  b.add(node("Add", {"hs", "r"}, {"y"})).typed("y", {5, 2, 8});
  // y2 = Reshape(Reshape(x w2) * s + t) + r2: LeViT's LinearNorm and residual
  b.add(linear("w2", "g")).typed("g", {2, 5, 8});
  b.add(node("Reshape", {"g", "flat"}, {"gf"})).typed("gf", {10, 8});
  b.add(node("Mul", {"gf", "s"}, {"gm"})).typed("gm", {10, 8});
  b.add(node("Add", {"gm", "t"}, {"ga"})).typed("ga", {10, 8});
  b.add(node("Reshape", {"ga", "back"}, {"gb"})).typed("gb", {2, 5, 8});
  b.add(node("Add", {"r2", "gb"}, {"y2"})).typed("y2", {2, 5, 8});
  // y3 = Reshape(x w3) + r3, r3 broadcast over the rows: no residual
  b.add(linear("w3", "k")).typed("k", {2, 5, 8});
  b.add(node("Reshape", {"k", "flat"}, {"kf"})).typed("kf", {10, 8});
  b.add(node("Add", {"kf", "r3"}, {"y3"})).typed("y3", {10, 8});
  Graph g = b.build({"y", "y2", "y3"});
  int rewrites = 0;
  const Feeds feeds = {{"x", random({2, 5, 6}, 85)}, {"r", random({5, 2, 8}, 86)}, {"r2", random({2, 5, 8}, 87)},
                       {"r3", random({1, 8}, 88)}};
  Graph out = run_pass(g, passes::linear_epilogue_fusion, feeds, &rewrites);
  EXPECT_EQ(rewrites, 2);
  EXPECT_EQ(count(out, "Mul"), 0) << out.str();
  EXPECT_EQ(count(out, "Add"), 1) << out.str();  // y3's
  std::map<std::string, const Node*> producer;
  for (const Node& n : out.nodes) producer[n.outputs[0]] = &n;
  for (const char* y : {"y", "y2"}) {
    SCOPED_TRACE(y);
    const Node* last = producer.at(y);
    ASSERT_EQ(last->op_type, "Reshape") << out.str();  // one Reshape after the Linear
    const Node* fused = producer.at(last->inputs[0]);
    ASSERT_EQ(fused->op_type, "Linear") << out.str();
    ASSERT_EQ(fused->inputs.size(), 4u) << fused->str();
    const Node* residual_view = producer.at(fused->inputs[3]);  // the residual in the Linear's [2, 5, 8]
    EXPECT_EQ(residual_view->op_type, "Reshape") << out.str();
    EXPECT_EQ(residual_view->inputs[0], y == std::string("y") ? "r" : "r2") << residual_view->str();
  }
}

TEST(LinearEpilogueFusion, ScaledHalfWeightsRoundOnceInBothLayoutsAtOddSizes) {
  for (const bool kn : {false, true}) {
    for (const auto& [k, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{13, 21}, {8, 16}, {5, 3}}) {
      SCOPED_TRACE(detail::str_cat(kn ? "kn " : "nk ", k, "x", n));
      const Tensor w = ops::cast(random(kn ? Shape{k, n} : Shape{n, k}, 70), DType::kFloat16);
      const Tensor gamma = ops::cast(random({n}, 71, 0.25f, 3.0f), DType::kFloat16);
      Builder h;
      h.input("x", {2, k});
      h.constant("w", w).constant("gamma", gamma);
      Node linear = node("Linear", {"x", "w"}, {"h"}, Attributes().set("weight_layout", std::string(kn ? "kn" : "nk")));
      linear.domain = kXpurtDomain;
      h.add(linear).typed("h", {2, n});
      h.add(node("Mul", {"h", "gamma"}, {"y"})).typed("y", {2, n});
      Graph g = h.build({"y"});
      for (const char* v : {"x", "h", "y"}) g.types[v].dtype = DType::kFloat16;
      EXPECT_EQ(passes::linear_epilogue_fusion(g, {}).rewrites, 1);
      ASSERT_EQ(count(g, "Mul"), 0);
      const Tensor& scaled = g.initializers.at(g.nodes.at(0).inputs.at(1));
      ASSERT_EQ(scaled.shape(), w.shape());
      const auto* wb = static_cast<const std::uint16_t*>(w.data_ptr());
      const auto* gb = static_cast<const std::uint16_t*>(gamma.data_ptr());
      const auto* sb = static_cast<const std::uint16_t*>(scaled.data_ptr());
      for (std::int64_t i = 0; i < w.numel(); ++i) {
        const std::int64_t feature = kn ? i % n : i / k;
        const float expected = detail::half_to_float(wb[i]) * detail::half_to_float(gb[feature]);
        ASSERT_EQ(sb[i], detail::float_to_half(expected)) << "element " << i;
      }
    }
  }
  // 60000 * 2 overflows float16: no rewrite.
  Builder h;
  h.input("x", {2, 9});
  Tensor big = ops::cast(random({11, 9}, 72, 59000.0f, 60000.0f), DType::kFloat16);
  h.constant("w", big).constant("gamma", ops::cast(random({11}, 73, 1.9f, 2.0f), DType::kFloat16));
  Node linear = node("Linear", {"x", "w"}, {"h"});
  linear.domain = kXpurtDomain;
  h.add(linear).typed("h", {2, 11});
  h.add(node("Mul", {"h", "gamma"}, {"y"})).typed("y", {2, 11});
  Graph g = h.build({"y"});
  for (const char* v : {"x", "h", "y"}) g.types[v].dtype = DType::kFloat16;
  EXPECT_EQ(passes::linear_epilogue_fusion(g, {}).rewrites, 0);
  EXPECT_EQ(count(g, "Mul"), 1);
}

// ---- norm_affine_folding ----

// A layer norm's output scaled and shifted by constants that vary within a row, through Reshapes (Note [Affine maps
// after a layer norm folded into it]): a scalar Mul and Add on the grouped view, then a per-channel Mul and Add on a
// channels-last view, fold into the norm's scale and bias and the Reshapes become one; a constant that varies across
// the rows (the samples) stays a Mul.
TEST(NormAffineFolding, ScalesAndShiftsThroughReshapesJoinTheNorm) {
  auto layer_norm = [](const std::vector<std::string>& inputs, const std::string& out) {
    Node n = node("LayerNormalization", inputs, {out}, Attributes().set("axis", std::int64_t{-1}));
    n.domain = kXpurtDomain;
    return n;
  };
  Builder b;
  b.input("x", {2, 1, 60}).input("x2", {2, 12});
  b.constant("one", random({1}, 90, 0.5f, 1.5f)).constant("zero", random({1}, 91));
  b.constant("gamma", random({1, 1, 1, 5}, 92, 0.5f, 1.5f)).constant("beta", random({1, 1, 1, 5}, 93));
  b.constant("nhwc", make_i64({4}, {2, 3, 4, 5})).constant("flat", make_i64({2}, {2, 60}));
  b.constant("s2", random({12}, 94, 0.5f, 1.5f)).constant("b2", random({12}, 95));
  b.constant("per_sample", random({2, 1}, 96));
  b.add(layer_norm({"x"}, "n")).typed("n", {2, 1, 60});
  b.add(node("Reshape", {"n", "flat"}, {"nf"})).typed("nf", {2, 60});
  b.add(node("Mul", {"nf", "one"}, {"m1"})).typed("m1", {2, 60});
  b.add(node("Add", {"m1", "zero"}, {"a1"})).typed("a1", {2, 60});
  b.add(node("Reshape", {"a1", "nhwc"}, {"v"})).typed("v", {2, 3, 4, 5});
  b.add(node("Mul", {"v", "gamma"}, {"m2"})).typed("m2", {2, 3, 4, 5});
  b.add(node("Add", {"m2", "beta"}, {"y"})).typed("y", {2, 3, 4, 5});
  // a norm with its own scale and bias, then a Mul that differs per sample: not folded
  b.add(layer_norm({"x2", "s2", "b2"}, "n2")).typed("n2", {2, 12});
  b.add(node("Mul", {"n2", "per_sample"}, {"y2"})).typed("y2", {2, 12});
  Graph g = b.build({"y", "y2"});
  int rewrites = 0;
  const Feeds feeds = {{"x", random({2, 1, 60}, 97)}, {"x2", random({2, 12}, 98)}};
  Graph out = run_pass(g, passes::norm_affine_folding, feeds, &rewrites);
  EXPECT_EQ(rewrites, 1);
  EXPECT_EQ(count(out, "Add"), 0) << out.str();
  EXPECT_EQ(count(out, "Mul"), 1) << out.str();  // y2's
  EXPECT_EQ(count(out, "Reshape"), 1) << out.str();
  for (const Node& n : out.nodes) {
    if (n.outputs[0] == "n") {
      ASSERT_EQ(n.inputs.size(), 3u) << n.str();
      EXPECT_EQ(out.initializers.at(n.inputs[1]).numel(), 60) << n.str();  // the scale over the row of 60
    }
  }
}

// ---- attention_fusion ----

Graph attention_graph(bool bshd, bool with_mask, std::int64_t softmax_axis = -1) {
  const std::int64_t B = 2, H = 3, S = 5, D = 4;
  Builder b;
  b.input("q", {B, H, S, D}).input("v", {B, H, S, D}).constant("sqrt_d", scalar(2.0f));
  if (bshd) {
    b.input("k", {B, S, H, D});
    b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 2, 3, 1})));
  } else {
    b.input("k", {B, H, S, D});
    b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  }
  b.add(node("MatMul", {"q", "kt"}, {"s"}));
  b.add(bshd ? node("Div", {"s", "sqrt_d"}, {"ss"}) : node("Mul", {"sqrt_d", "s"}, {"ss"}));
  std::string scores = "ss";
  if (with_mask) {
    b.input("mask", {B, 1, 1, S});
    b.add(node("Add", {"mask", "ss"}, {"sm"}));
    scores = "sm";
  }
  b.add(node("Softmax", {scores}, {"p"}, Attributes().set("axis", softmax_axis)));
  b.add(node("MatMul", {"p", "v"}, {"o"}));
  return b.build({"o"});
}

Feeds attention_feeds(bool bshd) {
  return {{"q", random({2, 3, 5, 4}, 43)},
          {"k", bshd ? random({2, 5, 3, 4}, 44) : random({2, 3, 5, 4}, 44)},
          {"v", random({2, 3, 5, 4}, 45)},
          {"mask", random({2, 1, 1, 5}, 46, -2, 0)}};
}

TEST(AttentionFusion, BshdKeysWithScaleAndMask) {
  int rewrites = 0;
  Graph out = run_pass(attention_graph(true, true), passes::attention_fusion, attention_feeds(true), &rewrites);
  EXPECT_EQ(rewrites, 2);  // the fusion, then K read as [B, S, H, D] without the Transpose it would need
  ASSERT_EQ(out.nodes.size(), 1u);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inputs.size(), 4u);
  EXPECT_EQ(a->inputs[1], "k");
  EXPECT_EQ(a->attrs.get_ints("bshd", {}), (std::vector<std::int64_t>{0, 1, 0, 0}));
  EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.5, 1e-12);
  EXPECT_EQ(a->attrs.get_int("causal", 1), 0);
}

// Note [Attention reads the heads where the projections wrote them]: q and the context transposes go when only the
// attention reads them; v's Transpose stays when something else reads it too (its copy is needed anyway).
TEST(AttentionFusion, HeadTransposesFoldOnlyWhereTheAttentionAloneReadsThem) {
  const std::int64_t B = 2, H = 3, S = 5, D = 4;
  const auto perm = Attributes().set("perm", std::vector<std::int64_t>{0, 2, 1, 3});
  Builder b;
  b.input("q_bshd", {B, S, H, D}).input("k", {B, H, S, D}).input("v_bshd", {B, S, H, D});
  b.add(node("Transpose", {"q_bshd"}, {"q"}, perm)).add(node("Transpose", {"v_bshd"}, {"v"}, perm));
  b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  b.add(node("MatMul", {"q", "kt"}, {"s"})).add(node("Softmax", {"s"}, {"p"}));
  b.add(node("MatMul", {"p", "v"}, {"o"})).add(node("Transpose", {"o"}, {"context"}, perm));
  b.add(node("Relu", {"v"}, {"v_relu"}));  // a second reader of v
  b.typed("q", {B, H, S, D}).typed("v", {B, H, S, D});
  const Feeds feeds = {{"q_bshd", random({B, S, H, D}, 51)}, {"k", random({B, H, S, D}, 52)},
                       {"v_bshd", random({B, S, H, D}, 53)}};
  Graph out = run_pass(b.build({"context", "v_relu"}), passes::attention_fusion, feeds);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_EQ(a->attrs.get_ints("bshd", {}), (std::vector<std::int64_t>{1, 0, 0, 1})) << out.str();
  EXPECT_EQ(a->inputs[0], "q_bshd");
  EXPECT_EQ(a->inputs[2], "v");  // read through the Transpose the Relu also reads
  EXPECT_EQ(a->outputs[0], "context");
  EXPECT_EQ(count(out, "Transpose"), 1) << out.str();
}

// Note [Attention over more than one batch dim]: MaxViT's attention after Einsum's decomposition: Q, K and V of
// [B, windows, H, N, d], K scaled before its Transpose, a relative position bias [H, N, N] and a term [1, 1, H, N, N].
// The attention runs on the merged [B * windows, H, N, d]; a term that varies along the windows stays unfused.
Graph windowed_attention_graph(const std::vector<std::int64_t>& term) {
  const std::int64_t B = 2, W = 3, H = 2, N = 5, D = 4;
  Builder b;
  b.input("q", {B, W, H, N, D}).input("k", {B, W, H, N, D}).input("v", {B, W, H, N, D});
  b.input("bias", {H, N, N}).input("term", std::vector<Dim>(term.begin(), term.end()));
  b.constant("scale", scalar(0.5f));
  b.add(node("Mul", {"k", "scale"}, {"ks"}));
  b.add(node("Transpose", {"ks"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 2, 4, 3})));
  b.add(node("MatMul", {"q", "kt"}, {"s"})).add(node("Add", {"s", "bias"}, {"sb"}));
  b.add(node("Add", {"sb", "term"}, {"st"})).add(node("Softmax", {"st"}, {"p"}));
  b.add(node("MatMul", {"p", "v"}, {"o"}));
  b.typed("ks", {B, W, H, N, D}).typed("kt", {B, W, H, D, N}).typed("s", {B, W, H, N, N});
  b.typed("sb", {B, W, H, N, N}).typed("st", {B, W, H, N, N}).typed("p", {B, W, H, N, N});
  b.typed("o", {B, W, H, N, D});
  return b.build({"o"});
}

TEST(AttentionFusion, FiveDimensionalWindowsRunOnMergedBatchDims) {
  const std::vector<std::int64_t> qkv = {2, 3, 2, 5, 4};
  Feeds feeds = {{"q", random(qkv, 61)}, {"k", random(qkv, 62)}, {"v", random(qkv, 63)},
                 {"bias", random({2, 5, 5}, 64)}, {"term", random({1, 1, 2, 5, 5}, 65)}};
  Graph out = run_pass(windowed_attention_graph({1, 1, 2, 5, 5}), passes::attention_fusion, feeds);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.5, 1e-12);
  EXPECT_EQ(count(out, "MatMul"), 0) << out.str();
  EXPECT_EQ(count(out, "Softmax"), 0) << out.str();
  for (std::size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(out.types.count(a->inputs[k])) << a->inputs[k];
    EXPECT_EQ(out.types.at(a->inputs[k]).shape.size(), 4u) << a->inputs[k];  // [B * W, H, N, D]
  }
  feeds["term"] = random({1, 3, 1, 5, 5}, 66);  // one term per window: not a term of the merged scores
  Graph per_window = run_pass(windowed_attention_graph({1, 3, 1, 5, 5}), passes::attention_fusion, feeds);
  EXPECT_EQ(find(per_window, "Attention"), nullptr) << per_window.str();
}

// Note [Masked-fill scores]: DeBERTa's attention, 3-D MatMuls over [B * H, S, d] views of the heads, a disentangled
// term [B * H, S, S], the scores viewed as [B, H, S, S] for masked_fill(~mask, fill) and the softmax. Batch 1's row 2
// is masked at every key: the graph gives it the mean of v, and so must the fused attention.
Graph masked_fill_attention_graph(float fill) {
  const std::int64_t B = 2, H = 3, S = 5, D = 4;
  Builder b;
  b.input("q", {B, H, S, D}).input("k", {B, H, S, D}).input("v", {B, H, S, D}).input("c2p", {B * H, S, S});
  b.input("keep", {B, 1, S, S});
  b.constant("merged", int64s({B * H, S, D})).constant("split", int64s({B, H, S, S}));
  b.constant("scores3", int64s({B * H, S, S})).constant("heads", int64s({B, H, S, D}));
  b.constant("scale", scalar(2.0f)).constant("zero", scalar(0.0f)).constant("fill", scalar(fill));
  for (const char* x : {"q", "k", "v"}) b.add(node("Reshape", {x, "merged"}, {std::string(x) + "3"}));
  b.add(node("Transpose", {"k3"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 2, 1})));
  b.add(node("Div", {"kt", "scale"}, {"kts"})).add(node("MatMul", {"q3", "kts"}, {"s"}));
  b.add(node("Add", {"s", "c2p"}, {"st"})).add(node("Reshape", {"st", "split"}, {"s4"}));
  b.add(node("Less", {"keep", "zero"}, {"drop"})).add(node("Where", {"drop", "fill", "s4"}, {"w"}));
  b.add(node("Softmax", {"w"}, {"p"})).add(node("Reshape", {"p", "scores3"}, {"p3"}));
  b.add(node("MatMul", {"p3", "v3"}, {"o3"})).add(node("Reshape", {"o3", "heads"}, {"o"}));
  for (const char* x : {"q3", "k3", "v3", "o3"}) b.typed(x, {B * H, S, D});
  b.typed("kt", {B * H, D, S}).typed("kts", {B * H, D, S}).typed("s", {B * H, S, S}).typed("st", {B * H, S, S});
  b.typed("s4", {B, H, S, S}).typed("w", {B, H, S, S}).typed("p", {B, H, S, S}).typed("p3", {B * H, S, S});
  b.typed("drop", {B, 1, S, S}).typed("o", {B, H, S, D});
  b.g.types["drop"].dtype = DType::kBool;
  return b.build({"o"});
}

TEST(AttentionFusion, MaskedFillOverHeadViewsGivesUniformFullyMaskedRows) {
  const std::vector<std::int64_t> qkv = {2, 3, 5, 4};
  Tensor keep = random({2, 1, 5, 5}, 84);
  auto* kp = static_cast<float*>(keep.data_ptr());
  for (int j = 0; j < 5; ++j) kp[25 + 2 * 5 + j] = -1.0f;  // batch 1, query 2: every key masked
  for (int i = 0; i < 5; ++i) kp[i * 5 + i] = 1.0f;        // batch 0: each query sees itself
  Feeds feeds = {{"q", random(qkv, 81)}, {"k", random(qkv, 82)}, {"v", random(qkv, 83)},
                 {"c2p", random({6, 5, 5}, 85)}, {"keep", keep}};
  Graph out = run_pass(masked_fill_attention_graph(-3.4028234663852886e38f), passes::attention_fusion, feeds);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_EQ(a->attrs.get_string("fully_masked_rows", "nan"), "uniform");
  EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.5, 1e-12);
  EXPECT_EQ(count(out, "MatMul"), 0) << out.str();
  EXPECT_EQ(count(out, "Softmax"), 0) << out.str();
  EXPECT_EQ(a->outputs[0], "o");  // written as the [B, H, S, D] view the graph took of the 3-D output
  for (std::size_t k = 0; k < 3; ++k) EXPECT_EQ(a->inputs[k], std::string(1, "qkv"[k])) << out.str();
  // A fill of -inf: the default rows (NaN where every key is masked, so the feeds here mask none entirely).
  for (int j = 0; j < 5; ++j) kp[25 + 2 * 5 + j] = j == 3 ? 1.0f : -1.0f;
  Graph inf = run_pass(masked_fill_attention_graph(-INFINITY), passes::attention_fusion, feeds);
  ASSERT_NE(find(inf, "Attention"), nullptr) << inf.str();
  EXPECT_EQ(find(inf, "Attention")->attrs.get_string("fully_masked_rows", "nan"), "nan");
  // A fill within float32's exp range of real scores: not the same softmax, not fused.
  Graph near_fill = masked_fill_attention_graph(-100.0f);
  EXPECT_EQ(passes::attention_fusion(near_fill, {}).rewrites, 0);
}

// Note [Per-head scales of the scores]: Swin V2's temperature per head [H, 1, 1] times the scores, then its bias. A
// factor that varies along the keys is not one of Q and stays unfused.
Graph head_scaled_attention_graph(const std::vector<std::int64_t>& factor) {
  const std::int64_t B = 2, H = 3, S = 5, D = 4;
  Builder b;
  b.input("q", {B, H, S, D}).input("k", {B, H, S, D}).input("v", {B, H, S, D}).input("bias", {H, S, S});
  b.input("t", std::vector<Dim>(factor.begin(), factor.end()));
  b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  b.add(node("MatMul", {"q", "kt"}, {"s"})).add(node("Mul", {"s", "t"}, {"st"}));
  b.add(node("Add", {"st", "bias"}, {"sb"})).add(node("Softmax", {"sb"}, {"p"}));
  b.add(node("MatMul", {"p", "v"}, {"o"}));
  b.typed("kt", {B, H, D, S}).typed("s", {B, H, S, S}).typed("st", {B, H, S, S}).typed("sb", {B, H, S, S});
  b.typed("p", {B, H, S, S}).typed("o", {B, H, S, D});
  return b.build({"o"});
}

TEST(AttentionFusion, PerHeadScalesOfTheScoresScaleQ) {
  const std::vector<std::int64_t> qkv = {2, 3, 5, 4};
  Feeds feeds = {{"q", random(qkv, 71)}, {"k", random(qkv, 72)}, {"v", random(qkv, 73)},
                 {"bias", random({3, 5, 5}, 74)}, {"t", random({3, 1, 1}, 75, 1.0f, 8.0f)}};
  Graph out = run_pass(head_scaled_attention_graph({3, 1, 1}), passes::attention_fusion, feeds);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_EQ(count(out, "Softmax"), 0);
  EXPECT_EQ(count(out, "Mul"), 1) << out.str();  // q * t beside the attention
  feeds["t"] = random({1, 1, 1, 5}, 76, 1.0f, 8.0f);  // along the keys: not a factor of q
  Graph keys = run_pass(head_scaled_attention_graph({1, 1, 1, 5}), passes::attention_fusion, feeds);
  EXPECT_EQ(find(keys, "Attention"), nullptr) << keys.str();
}

TEST(AttentionFusion, BhsdKeysWithMulScaleNoMaskAndNotOnAnotherAxis) {
  int rewrites = 0;
  Graph out = run_pass(attention_graph(false, false), passes::attention_fusion, attention_feeds(false), &rewrites);
  EXPECT_EQ(rewrites, 1);
  ASSERT_EQ(out.nodes.size(), 1u);
  EXPECT_EQ(out.nodes[0].inputs, (std::vector<std::string>{"q", "k", "v"}));
  EXPECT_NEAR(out.nodes[0].attrs.get_float("scale", 0), 2.0, 1e-12);
  Graph other_axis = attention_graph(false, true, 2);
  EXPECT_EQ(passes::attention_fusion(other_axis, {}).rewrites, 0);
}

// PyTorch's scaled_dot_product_attention export: Q and K^T each scaled by sqrt(scale), a computed mask first.
TEST(AttentionFusion, PreScaledQueryAndKeysWithAComputedMask) {
  Builder b;
  b.input("q", {2, 3, 5, 4}).input("k", {2, 3, 5, 4}).input("v", {2, 3, 5, 4}).input("keep", {2, 1, 1, 5});
  b.constant("root", scalar(0.7071068f)).constant("big", scalar(-1e4f)).constant("one", scalar(1.0f));
  b.add(node("Mul", {"q", "root"}, {"qs"}));
  b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  b.add(node("Mul", {"root", "kt"}, {"kts"}));
  b.add(node("MatMul", {"qs", "kts"}, {"s"}));
  b.add(node("Sub", {"one", "keep"}, {"drop"})).add(node("Mul", {"drop", "big"}, {"mask"}));
  b.add(node("Add", {"mask", "s"}, {"sm"}));
  b.add(node("Softmax", {"sm"}, {"p"})).add(node("MatMul", {"p", "v"}, {"o"}));
  b.typed("mask", {2, 1, 1, 5});
  Graph g = b.build({"o"});
  Tensor keep = make({2, 1, 1, 5}, {1, 1, 1, 0, 0, 1, 1, 1, 1, 1});
  int rewrites = 0;
  Graph out = run_pass(g, passes::attention_fusion,
                       {{"q", random({2, 3, 5, 4}, 66)},
                        {"k", random({2, 3, 5, 4}, 67)},
                        {"v", random({2, 3, 5, 4}, 68)},
                        {"keep", keep}},
                       &rewrites);
  EXPECT_EQ(rewrites, 1);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inputs, (std::vector<std::string>{"q", "k", "v", "mask"}));
  EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.5, 1e-6);
  EXPECT_EQ(count(out, "Transpose"), 0);
  EXPECT_EQ(out.nodes.size(), 3u);  // Sub, Mul (the mask), Attention
}

// q, k, v [2, 3, 5, 4], mask [2, 1, 5, 5] and the scores "sm" = q k^T * 0.5 + mask of the softmax graphs below.
Builder masked_scores_builder() {
  const std::int64_t B = 2, H = 3, S = 5, D = 4;
  Builder b;
  b.input("q", {B, H, S, D}).input("k", {B, H, S, D}).input("v", {B, H, S, D}).input("mask", {B, 1, S, S});
  b.constant("scale", scalar(0.5f));
  b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  b.add(node("MatMul", {"q", "kt"}, {"s"})).add(node("Mul", {"s", "scale"}, {"ss"}));
  b.add(node("Add", {"ss", "mask"}, {"sm"}));
  return b;
}

// The single Attention (q, k, v, mask; scale 0.5) the pass leaves of a masked_scores_builder graph, output "o".
void expect_one_attention(const Graph& out, int rewrites) {
  EXPECT_EQ(rewrites, 1);
  ASSERT_EQ(out.nodes.size(), 1u) << out.str();
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->inputs, (std::vector<std::string>{"q", "k", "v", "mask"}));
  EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.5, 1e-12);
  EXPECT_EQ(a->outputs[0], "o");
}

// Note [Softmax in float32]: transformers' eager attention, Cast(to=float) -> Softmax -> Cast back, with a Mul scale
// and an additive mask; only the pair of Casts fuses.
Graph float_softmax_graph(bool cast_back) {
  Builder b = masked_scores_builder();
  b.add(node("Cast", {"sm"}, {"sf"}, Attributes().set("to", static_cast<std::int64_t>(1))));
  b.add(node("Softmax", {"sf"}, {"pf"}));
  if (cast_back) b.add(node("Cast", {"pf"}, {"p"}, Attributes().set("to", static_cast<std::int64_t>(1))));
  b.add(node("MatMul", {cast_back ? "p" : "pf", "v"}, {"o"}));
  return b.build({"o"});
}

TEST(AttentionFusion, SoftmaxInFloat32FusesWithItsCasts) {
  const Feeds feeds = {{"q", random({2, 3, 5, 4}, 71)},
                       {"k", random({2, 3, 5, 4}, 72)},
                       {"v", random({2, 3, 5, 4}, 73)},
                       {"mask", random({2, 1, 5, 5}, 74, -2, 0)}};
  int rewrites = 0;
  Graph out = run_pass(float_softmax_graph(true), passes::attention_fusion, feeds, &rewrites);
  expect_one_attention(out, rewrites);
  // An upcast whose float32 probabilities are read as they are: not the pair, not fused.
  Graph upcast_only = float_softmax_graph(false);
  EXPECT_EQ(passes::attention_fusion(upcast_only, {}).rewrites, 0);
}

// Note [Softmax in float32], the TorchScript exporter's form: Softmax -> Cast(to=wider) -> Cast back, the softmax in
// q's type (here float32 through float64; float16 through float32 in the exports). attention_fusion alone takes the
// round trip, without identity_elimination before it (before, the MatMul after the two Casts was not found). A Cast
// to a narrower type and back changes the probabilities: not fused.
Graph torchscript_softmax_graph(std::int64_t wide) {
  Builder b = masked_scores_builder();
  b.typed("sm", {2, 3, 5, 5});
  b.add(node("Softmax", {"sm"}, {"ph"}, Attributes().set("axis", I(-1))));
  b.add(node("Cast", {"ph"}, {"pw"}, Attributes().set("to", wide)));
  b.add(node("Cast", {"pw"}, {"p"}, Attributes().set("to", I(1))));
  b.add(node("MatMul", {"p", "v"}, {"o"}));
  return b.build({"o"});
}

TEST(AttentionFusion, SoftmaxThenARoundTripThroughFloat32FusesWithItsCasts) {
  const Feeds feeds = {{"q", random({2, 3, 5, 4}, 75)},
                       {"k", random({2, 3, 5, 4}, 76)},
                       {"v", random({2, 3, 5, 4}, 77)},
                       {"mask", random({2, 1, 5, 5}, 78, -2, 0)}};
  int rewrites = 0;
  Graph out = run_pass(torchscript_softmax_graph(/*double*/ 11), passes::attention_fusion, feeds, &rewrites);
  expect_one_attention(out, rewrites);
  Graph narrowed = torchscript_softmax_graph(/*float16*/ 10);
  EXPECT_EQ(passes::attention_fusion(narrowed, {}).rewrites, 0);
}

TEST(AttentionFusion, NotWithUnprovableShapesOrAMaskThatGrowsTheScores) {
  Graph heads = attention_graph(true, false);
  heads.types["k"] = type({2, 5, 1, 4});  // one key head broadcast by MatMul: not [B,H,S,D] keys
  EXPECT_EQ(passes::attention_fusion(heads, {}).rewrites, 0);
  Graph unknown = attention_graph(false, false);
  unknown.types["q"] = type({Dim(), 3, 5, 4});
  EXPECT_EQ(passes::attention_fusion(unknown, {}).rewrites, 0);
  Graph wide_mask = attention_graph(false, true);
  wide_mask.types["mask"] = type({2, 3, 7, 5});
  EXPECT_EQ(passes::attention_fusion(wide_mask, {}).rewrites, 0);
  Graph int_mask = attention_graph(false, true);
  int_mask.types["mask"] = type({2, 1, 1, 5}, DType::kInt64);
  EXPECT_EQ(passes::attention_fusion(int_mask, {}).rewrites, 0);
}

// Note [Attention with additive terms]: Q K^T, scaled, plus one or two additive terms of any shape that broadcasts to
// the scores [B, H, Sq, Sk], each a graph input (a computed term) or a constant; `swap` puts each Add's term first.
struct AdditiveTerm {
  Shape shape;
  bool constant = false;
};

Graph biased_attention_graph(std::int64_t S, const std::vector<AdditiveTerm>& terms, bool swap = false) {
  const std::int64_t B = 2, H = 3, D = 8;
  Builder b;
  b.input("q", {B, H, S, D}).input("k", {B, H, S, D}).input("v", {B, H, S, D}).constant("sqrt_d", scalar(2.8f));
  b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  b.add(node("MatMul", {"q", "kt"}, {"s"})).add(node("Div", {"s", "sqrt_d"}, {"scores0"}));
  for (std::size_t t = 0; t < terms.size(); ++t) {
    const std::string term = "term" + std::to_string(t), in = "scores" + std::to_string(t),
                      out = "scores" + std::to_string(t + 1);
    if (terms[t].constant) {
      b.constant(term, random(terms[t].shape, 90 + static_cast<unsigned>(t), -3, 3));
    } else {
      b.input(term, std::vector<Dim>(terms[t].shape.begin(), terms[t].shape.end()));
    }
    b.add(swap ? node("Add", {term, in}, {out}) : node("Add", {in, term}, {out}));
  }
  b.add(node("Softmax", {"scores" + std::to_string(terms.size())}, {"p"}));
  b.add(node("MatMul", {"p", "v"}, {"o"}));
  return b.build({"o"});
}

Feeds biased_attention_feeds(std::int64_t S, const std::vector<AdditiveTerm>& terms) {
  Feeds feeds = {{"q", random({2, 3, S, 8}, 81)}, {"k", random({2, 3, S, 8}, 82)}, {"v", random({2, 3, S, 8}, 83)}};
  for (std::size_t t = 0; t < terms.size(); ++t) {
    if (!terms[t].constant) {
      feeds["term" + std::to_string(t)] = random(terms[t].shape, 84 + static_cast<unsigned>(t), -3, 3);
    }
  }
  return feeds;
}

std::string shape_name(const Shape& shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? "," : "") + std::to_string(shape[k]);
  return out + "]";
}

TEST(AttentionFusion, TakesAnAdditiveBiasOfAnyBroadcastShape) {
  const std::int64_t B = 2, H = 3;
  for (std::int64_t S : {49, 77}) {
    for (const Shape& shape : {Shape{1, H, S, S}, Shape{B, 1, S, S}, Shape{B, H, 1, S}, Shape{1, 1, 1, S}, Shape{S, S},
                               Shape{B, H, S, S}, Shape{H, 1, S}}) {
      for (bool constant : {false, true}) {
        for (bool swap : {false, true}) {
          SCOPED_TRACE("S " + std::to_string(S) + " bias " + shape_name(shape) + (constant ? " constant" : " input") +
                       (swap ? " Add(bias, scores)" : " Add(scores, bias)"));
          const std::vector<AdditiveTerm> terms = {{shape, constant}};
          int rewrites = 0;
          Graph out = run_pass(biased_attention_graph(S, terms, swap), passes::attention_fusion,
                               biased_attention_feeds(S, terms), &rewrites);
          EXPECT_EQ(rewrites, 1);
          ASSERT_EQ(out.nodes.size(), 1u) << out.str();
          const Node& a = out.nodes[0];
          EXPECT_EQ(a.op_type, "Attention");
          EXPECT_EQ(a.inputs, (std::vector<std::string>{"q", "k", "v", "term0"}));
          EXPECT_NEAR(a.attrs.get_float("scale", 0), 1.0 / 2.8, 1e-6);
          EXPECT_EQ(a.attrs.get_int("causal", 1), 0);
        }
      }
    }
  }
}

// A bias plus a mask (Swin's relative position bias and window mask, T5's position bias and padding, a bias and the
// exporter's causal triangle): one input, their sum, computed by an Add the plan folds when both are constants.
TEST(AttentionFusion, TwoAdditiveTermsBecomeOneInput) {
  const std::int64_t B = 2, H = 3;
  struct Pair {
    AdditiveTerm first, second;
    Shape sum;
  };
  for (std::int64_t S : {49, 77}) {
    const std::vector<Pair> pairs = {
        {{{1, H, S, S}, true}, {{B, 1, 1, S}, false}, {B, H, S, S}},  // bias table + padding mask
        {{{B, H, S, S}, false}, {{S, S}, true}, {B, H, S, S}},        // computed position bias + causal triangle
        {{{1, H, S, S}, true}, {{S, S}, true}, {1, H, S, S}},         // two constants: folded by the plan
        {{{1, 1, 1, S}, false}, {{B, H, 1, S}, false}, {B, H, 1, S}},
    };
    for (const Pair& pair : pairs) {
      for (bool swap : {false, true}) {
        SCOPED_TRACE("S " + std::to_string(S) + " terms " + shape_name(pair.first.shape) + " + " +
                     shape_name(pair.second.shape) + (swap ? " swapped" : ""));
        const std::vector<AdditiveTerm> terms = {pair.first, pair.second};
        int rewrites = 0;
        Graph out = run_pass(biased_attention_graph(S, terms, swap), passes::attention_fusion,
                             biased_attention_feeds(S, terms), &rewrites);
        EXPECT_EQ(rewrites, 1);
        ASSERT_EQ(out.nodes.size(), 2u) << out.str();
        const Node& sum = out.nodes[0];
        const Node& a = out.nodes[1];
        EXPECT_EQ(sum.op_type, "Add");
        EXPECT_EQ(sum.domain, "");
        EXPECT_EQ(sum.inputs, (std::vector<std::string>{"term0", "term1"}));
        EXPECT_EQ(a.op_type, "Attention");
        ASSERT_EQ(a.inputs.size(), 4u);
        EXPECT_EQ(a.inputs[3], sum.outputs[0]);
        const ValueType& type = out.types.at(sum.outputs[0]);
        EXPECT_EQ(type.shape, std::vector<Dim>(pair.sum.begin(), pair.sum.end()));
      }
    }
  }
}

// The exporter's causal attention with a bias: a -inf upper triangle (keys after the query) and an ALiBi-like
// per-head bias; rows keep their first key, so no row is all -inf.
TEST(AttentionFusion, CausalTriangleAndBias) {
  const std::int64_t S = 49, H = 3;
  Graph g = biased_attention_graph(S, {{{1, H, S, S}, true}, {{S, S}, true}});
  Tensor triangle = Tensor::zeros({S, S}, DType::kFloat32);
  float* t = static_cast<float*>(triangle.data_ptr());
  for (std::int64_t i = 0; i < S; ++i) {
    for (std::int64_t j = i + 1; j < S; ++j) t[i * S + j] = -std::numeric_limits<float>::infinity();
  }
  Tensor alibi = Tensor::zeros({1, H, S, S}, DType::kFloat32);
  float* a = static_cast<float*>(alibi.data_ptr());
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t i = 0; i < S; ++i) {
      for (std::int64_t j = 0; j < S; ++j) a[(h * S + i) * S + j] = 
            -std::ldexp(1.0f, -static_cast<int>(h + 1)) * static_cast<float>(i - j);
    }
  }
  g.initializers["term0"] = alibi;
  g.initializers["term1"] = triangle;
  int rewrites = 0;
  Graph out = run_pass(g, passes::attention_fusion, biased_attention_feeds(S, {}), &rewrites);
  EXPECT_EQ(rewrites, 1);
  EXPECT_EQ(count(out, "Attention"), 1) << out.str();
  EXPECT_EQ(count(out, "Softmax"), 0) << out.str();
}

// Swin's shifted windows: (q * scale) K^T + the relative position bias [1, H, N, N], viewed as [B, nW, H, N, N] to
// add the window mask [nW, N, N] (unsqueezed to [1, nW, 1, N, N]), viewed back. One input of [B * nW, H, N, N]:
// the bias plus Reshape(Expand(mask)).
Graph shifted_window_graph(bool with_bias, bool constant_mask, const Shape& split) {
  const std::int64_t B = 2, W = 4, H = 3, N = 49, D = 8;
  Builder b;
  b.input("q", {B * W, H, N, D}).input("k", {B * W, H, N, D}).input("v", {B * W, H, N, D});
  b.constant("scale", scalar(0.35f)).constant("split", make_i64({5}, split));
  b.constant("back", make_i64({4}, {-1, H, N, N}));
  if (constant_mask) {
    Tensor mask = Tensor::zeros({1, W, 1, N, N}, DType::kFloat32);
    float* m = static_cast<float*>(mask.data_ptr());
    for (std::int64_t i = 0; i < mask.numel(); ++i) m[i] = (i * 7919) % 3 == 0 ? -100.0f : 0.0f;
    b.constant("window_mask", mask);
  } else {
    b.input("window_mask", {1, W, 1, N, N});
  }
  b.add(node("Mul", {"q", "scale"}, {"qs"}));
  b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  b.add(node("MatMul", {"qs", "kt"}, {"s"}));
  std::string scores = "s";
  if (with_bias) {
    b.constant("rel_bias", random({1, H, N, N}, 95, -3, 3));
    b.add(node("Add", {"s", "rel_bias"}, {"sb"}));
    scores = "sb";
  }
  b.add(node("Reshape", {scores, "split"}, {"s5"})).add(node("Add", {"s5", "window_mask"}, {"s5m"}));
  b.add(node("Reshape", {"s5m", "back"}, {"sm"})).add(node("Softmax", {"sm"}, {"p"}));
  b.add(node("MatMul", {"p", "v"}, {"o"}));
  b.typed("s", {B * W, H, N, N}).typed("sb", {B * W, H, N, N}).typed("sm", {B * W, H, N, N});
  b.typed("s5", std::vector<Dim>(split.begin(), split.end())).typed("s5m", std::vector<Dim>(split.begin(), split.end()));
  return b.build({"o"});
}

TEST(AttentionFusion, SwinShiftedWindowBiasAndMask) {
  const std::int64_t B = 2, W = 4, H = 3, N = 49, D = 8;
  for (bool with_bias : {true, false}) {
    for (bool constant_mask : {true, false}) {
      SCOPED_TRACE(std::string(with_bias ? "bias + " : "") + (constant_mask ? "constant mask" : "mask input"));
      Feeds feeds = {{"q", random({B * W, H, N, D}, 96)}, {"k", random({B * W, H, N, D}, 97)},
                     {"v", random({B * W, H, N, D}, 98)}};
      if (!constant_mask) feeds["window_mask"] = random({1, W, 1, N, N}, 99, -5, 0);
      int rewrites = 0;
      Graph out = run_pass(shifted_window_graph(with_bias, constant_mask, {B, W, H, N, N}), passes::attention_fusion,
                           feeds, &rewrites);
      EXPECT_EQ(rewrites, 1);
      const Node* a = find(out, "Attention");
      ASSERT_NE(a, nullptr) << out.str();
      ASSERT_EQ(a->inputs.size(), 4u);
      EXPECT_EQ(out.types.at(a->inputs[3]).shape, (std::vector<Dim>{B * W, H, N, N}));
      EXPECT_EQ(count(out, "Softmax"), 0) << out.str();
      EXPECT_EQ(count(out, "Expand"), 1) << out.str();
      EXPECT_EQ(count(out, "Add"), with_bias ? 1 : 0) << out.str();
      EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.35, 1e-6);
    }
  }
  // A view that is not a split of the batch (the window count times the heads moved): left alone.
  Graph other = shifted_window_graph(true, true, {B, W, H, N, N});
  other.initializers["split"] = make_i64({5}, {B, H, W, N, N});
  other.types["s5"] = type({B, H, W, N, N});
  other.types["s5m"] = type({B, H, W, N, N});
  other.initializers["window_mask"] = random({1, H, 1, N, N}, 100, -5, 0);
  EXPECT_EQ(passes::attention_fusion(other, {}).rewrites, 0);
}

TEST(AttentionFusion, NotWithThreeTermsASharedPartialSumOrATermThatGrowsTheScores) {
  const std::int64_t S = 49, H = 3;
  const std::vector<AdditiveTerm> three = {{{1, H, S, S}, true}, {{S, S}, true}, {{1, 1, 1, S}, true}};
  Graph three_terms = biased_attention_graph(S, three);
  EXPECT_EQ(passes::attention_fusion(three_terms, {}).rewrites, 0);
  // The partial sum scores + bias is read by something else too: the Adds stay.
  Graph shared = biased_attention_graph(S, {{{1, H, S, S}, true}, {{S, S}, true}});
  shared.nodes.push_back(node("Relu", {"scores1"}, {"r"}));
  shared.outputs.push_back("r");
  shared.validate();
  EXPECT_EQ(passes::attention_fusion(shared, {}).rewrites, 0);
  // A term whose dims are not 1 or the scores' own.
  Graph wide = biased_attention_graph(S, {{{1, H, S, S}, true}, {{2, S}, false}});
  EXPECT_EQ(passes::attention_fusion(wide, {}).rewrites, 0);
}

// Note [The NaN guard of fully masked rows]: PyTorch's TorchScript export of scaled_dot_product_attention with a
// boolean mask, as the suite's BERT, GPT-2 and Llama have it: q [B, S, H, D] and k moved to heads by Transposes and
// each scaled by sqrt(scale), the mask Where(Expand(keep), 0, fill) of 1-element float constants, the softmax, and
// Where(IsNaN(p), 0, p) before the MatMul with v. `keep` [B, 1, S, S] (bool).
Graph torchscript_guarded_attention_graph(float fill) {
  const std::int64_t B = 2, H = 3, S = 5, D = 4;
  const auto perm = [](std::vector<std::int64_t> p) { return Attributes().set("perm", std::move(p)); };
  Builder b;
  b.input("q", {B, S, H, D}).input("k", {B, S, H, D}).input("v", {B, H, S, D}).input("keep", {B, 1, S, S});
  b.g.types["keep"].dtype = DType::kBool;
  b.constant("root", scalar(0.70710678f)).constant("zero", make({1}, {0.0f})).constant("fill", make({1}, {fill}));
  b.constant("mask_shape", make_i64({4}, {B, 1, S, S}));
  b.add(node("Transpose", {"q"}, {"qh"}, perm({0, 2, 1, 3}))).add(node("Mul", {"qh", "root"}, {"qs"}));
  b.add(node("Transpose", {"k"}, {"kt"}, perm({0, 2, 3, 1}))).add(node("Mul", {"kt", "root"}, {"kts"}));
  b.add(node("MatMul", {"qs", "kts"}, {"s"}));
  b.add(node("Expand", {"keep", "mask_shape"}, {"keep_all"}));
  b.add(node("Where", {"keep_all", "zero", "fill"}, {"mask"}));
  b.add(node("Add", {"s", "mask"}, {"sm"})).add(node("Softmax", {"sm"}, {"p"}, Attributes().set("axis", I(-1))));
  b.add(node("IsNaN", {"p"}, {"p_nan"})).add(node("Where", {"p_nan", "zero", "p"}, {"pg"}));
  b.add(node("MatMul", {"pg", "v"}, {"o"}));
  b.typed("qh", {B, H, S, D}).typed("mask", {B, 1, S, S});
  return b.build({"o"});
}

// keep [2, 1, 5, 5]: batch 0 row 2 and batch 1 row 4 masked at every key, the other rows at some keys or none.
Tensor keep_with_fully_masked_rows() {
  const std::vector<std::uint8_t> keep = {
      1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1,   // batch 0, rows 0 to 4
      1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0};  // batch 1
  Tensor t = Tensor::empty({2, 1, 5, 5}, DType::kBool);
  std::memcpy(t.data_ptr(), keep.data(), keep.size());
  return t;
}

TEST(AttentionFusion, TorchScriptNaNGuardOfAMinusInfMaskFusesWithFullyMaskedRowsZero) {
  const Feeds feeds = {{"q", random({2, 5, 3, 4}, 111)},
                       {"k", random({2, 5, 3, 4}, 112)},
                       {"v", random({2, 3, 5, 4}, 113)},
                       {"keep", keep_with_fully_masked_rows()}};
  const Graph g = torchscript_guarded_attention_graph(-std::numeric_limits<float>::infinity());
  // The unfused chain gives the fully masked rows 0 (the guard), the others a softmax over their visible keys.
  const Values unfused = values(run_graph(g, feeds)[0]);
  int rewrites = 0;
  Graph out = run_pass(g, passes::attention_fusion, feeds, &rewrites);  // outputs compared, the zero rows included
  EXPECT_GE(rewrites, 1);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_EQ(a->attrs.get_string("fully_masked_rows", "nan"), "zero");
  EXPECT_EQ(a->inputs[3], "mask");
  EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.5, 1e-6);
  EXPECT_EQ(count(out, "Softmax") + count(out, "IsNaN") + count(out, "MatMul"), 0) << out.str();
  EXPECT_EQ(count(out, "Where"), 1) << out.str();  // the mask's own
  const Values fused = values(run_graph(out, feeds, nullptr, /*library_fused=*/true)[0]);
  ASSERT_EQ(fused.size(), unfused.size());
  for (std::int64_t h = 0; h < 3; ++h) {
    for (const auto& [b, row] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 2}, {1, 4}}) {
      for (std::int64_t d = 0; d < 4; ++d) {
        const std::size_t at = static_cast<std::size_t>(((b * 3 + h) * 5 + row) * 4 + d);
        EXPECT_EQ(unfused[at], 0.0f) << "batch " << b << " head " << h << " row " << row;
        EXPECT_EQ(fused[at], 0.0f) << "batch " << b << " head " << h << " row " << row;
      }
    }
  }
  for (std::size_t i = 0; i < fused.size(); ++i) ASSERT_FALSE(std::isnan(fused[i])) << i;
}

// Note [Scores promoted to float32 by a float32 mask]: the same export of a float16 model. The float32 mask promotes
// the float16 scores (Cast(to=float) after the MatMul), v is cast to float32 for the second MatMul, and the output is
// float32. The chain becomes a float32 Attention of Cast(q), Cast(k) and the graph's Cast(v), with the zero rows of
// the guard; the unfused chain rounds the scaled q, k and their product to float16 first, so the outputs agree to
// float16's rounding, the fully masked rows exactly.
TEST(AttentionFusion, Float16ScoresPromotedByAFloat32MaskFuseAsAFloat32Attention) {
  const std::int64_t B = 2, H = 3, S = 5, D = 4;
  Builder b;
  b.input("q", {B, H, S, D}).input("k", {B, H, S, D}).input("v", {B, H, S, D}).input("keep", {B, 1, S, S});
  for (const char* name : {"q", "k", "v"}) b.g.types[name].dtype = DType::kFloat16;
  b.g.types["keep"].dtype = DType::kBool;
  b.constant("root", ops::cast(scalar(0.70710678f), DType::kFloat16));
  b.constant("zero", make({1}, {0.0f})).constant("fill", make({1}, {-std::numeric_limits<float>::infinity()}));
  b.constant("mask_shape", make_i64({4}, {B, 1, S, S}));
  b.add(node("Mul", {"q", "root"}, {"qs"}));
  b.add(node("Transpose", {"k"}, {"kt"}, Attributes().set("perm", std::vector<std::int64_t>{0, 1, 3, 2})));
  b.add(node("Mul", {"kt", "root"}, {"kts"})).add(node("MatMul", {"qs", "kts"}, {"s16"}));
  b.add(node("Cast", {"s16"}, {"s"}, Attributes().set("to", I(1))));
  b.add(node("Expand", {"keep", "mask_shape"}, {"keep_all"}));
  b.add(node("Where", {"keep_all", "zero", "fill"}, {"mask"}));
  b.add(node("Add", {"s", "mask"}, {"sm"})).add(node("Softmax", {"sm"}, {"p"}, Attributes().set("axis", I(-1))));
  b.add(node("IsNaN", {"p"}, {"p_nan"})).add(node("Where", {"p_nan", "zero", "p"}, {"pg"}));
  b.add(node("Cast", {"v"}, {"v32"}, Attributes().set("to", I(1)))).add(node("MatMul", {"pg", "v32"}, {"o"}));
  b.g.types["s16"] = type({B, H, S, S}, DType::kFloat16);
  b.typed("mask", {B, 1, S, S}).typed("v32", {B, H, S, D});
  const Graph g = b.build({"o"});
  const Feeds feeds = {{"q", ops::cast(random({B, H, S, D}, 117), DType::kFloat16)},
                       {"k", ops::cast(random({B, H, S, D}, 118), DType::kFloat16)},
                       {"v", ops::cast(random({B, H, S, D}, 119), DType::kFloat16)},
                       {"keep", keep_with_fully_masked_rows()}};
  Graph out = g;
  EXPECT_EQ(passes::attention_fusion(out, {}).rewrites, 1);
  out.validate();
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_EQ(a->attrs.get_string("fully_masked_rows", "nan"), "zero");
  EXPECT_NEAR(a->attrs.get_float("scale", 0), 0.5, 1e-3);  // the float16 root, squared
  ASSERT_EQ(a->inputs.size(), 4u);
  EXPECT_EQ(a->inputs[2], "v32");
  EXPECT_EQ(a->inputs[3], "mask");
  for (std::size_t t = 0; t < 2; ++t) {  // q and k through new Casts to float32
    EXPECT_EQ(out.types.at(a->inputs[t]).dtype, DType::kFloat32) << a->inputs[t];
  }
  EXPECT_EQ(count(out, "Cast"), 3) << out.str();
  EXPECT_EQ(count(out, "Softmax") + count(out, "IsNaN") + count(out, "MatMul") + count(out, "Mul"), 0) << out.str();
  const std::vector<Tensor> unfused = run_graph(g, feeds);
  const std::vector<Tensor> fused = run_graph(out, feeds, nullptr, /*library_fused=*/true);
  ASSERT_EQ(fused[0].dtype(), DType::kFloat32);
  const Values want = values(unfused[0]), got = values(fused[0]);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-3 * (1.0 + std::fabs(want[i]))) << "element " << i;
  }
  for (std::int64_t h = 0; h < H; ++h) {  // the rows keep masks at every key: 0 both ways
    EXPECT_EQ(got[static_cast<std::size_t>(((0 * H + h) * S + 2) * D)], 0.0f);
    EXPECT_EQ(got[static_cast<std::size_t>(((1 * H + h) * S + 4) * D)], 0.0f);
    EXPECT_EQ(want[static_cast<std::size_t>(((1 * H + h) * S + 4) * D)], 0.0f);
  }
  // A 16-bit Cast that is not to float32 (here back to float16) is not a promotion: unfused.
  Graph narrowed = g;
  for (Node& n : narrowed.nodes) {
    if (n.outputs[0] == "s") n.attrs.set("to", I(10));
  }
  narrowed.types["s"] = type({B, H, S, S}, DType::kFloat16);
  EXPECT_EQ(passes::attention_fusion(narrowed, {}).rewrites, 0);
}

// A finite fill (transformers' finfo.min; here -100, which float32 adds to the scores without losing the digits the
// comparison needs) cannot empty a row: the guard changes nothing and goes with a plain Attention (the rows masked at
// every key then average v, fused or not).
TEST(AttentionFusion, NaNGuardOfAFiniteMaskFusesAsAPlainAttention) {
  const Feeds feeds = {{"q", random({2, 5, 3, 4}, 114)},
                       {"k", random({2, 5, 3, 4}, 115)},
                       {"v", random({2, 3, 5, 4}, 116)},
                       {"keep", keep_with_fully_masked_rows()}};
  int rewrites = 0;
  Graph out = run_pass(torchscript_guarded_attention_graph(-100.0f), passes::attention_fusion, feeds, &rewrites);
  EXPECT_GE(rewrites, 1);
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_FALSE(a->attrs.has("fully_masked_rows"));
  EXPECT_EQ(count(out, "IsNaN"), 0) << out.str();
}

// ---- the whole pipeline ----

TEST(GraphPasses, PipelineOnAConvNetAndAnMlp) {
  Builder b;
  b.input("x", {1, 2, 6, 6}).input("h", {3, 8});
  b.constant("w", random({4, 2, 3, 3}, 47)).constant("scale", random({4}, 48, 0.5f, 1.5f));
  b.constant("shift", random({4}, 49)).constant("mean", random({4}, 50)).constant("var", random({4}, 51, 0.5f, 2));
  b.constant("w1", random({8, 16}, 52)).constant("b1", random({16}, 53)).constant("sqrt2", scalar(1.4142135f));
  b.constant("one", scalar(1.0f)).constant("half", scalar(0.5f));
  b.add(node("Conv", {"x", "w"}, {"c"}, Attributes().set("pads", std::vector<std::int64_t>{1, 1, 1, 1})));
  b.add(node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"bn"}));
  b.add(node("Relu", {"bn"}, {"r"})).add(node("Identity", {"r"}, {"y"}));
  b.add(node("MatMul", {"h", "w1"}, {"m"})).add(node("Add", {"m", "b1"}, {"mb"}));
  b.add(node("Div", {"mb", "sqrt2"}, {"d"})).add(node("Erf", {"d"}, {"e"})).add(node("Add", {"e", "one"}, {"t"}));
  b.add(node("Mul", {"mb", "t"}, {"xt"})).add(node("Mul", {"xt", "half"}, {"z"}));
  b.typed("c", {1, 4, 6, 6}).typed("bn", {1, 4, 6, 6}).typed("r", {1, 4, 6, 6});
  b.typed("m", {3, 16}).typed("mb", {3, 16});
  for (const char* v : {"d", "e", "t", "xt", "z"}) b.typed(v, {3, 16});
  Graph g = b.build({"y", "z"});
  Graph out = g;
  auto results = passes::run_passes(out, {});
  ASSERT_EQ(out.nodes.size(), 2u) << out.str();
  EXPECT_EQ(count(out, "FusedConv"), 1);
  EXPECT_EQ(count(out, "Linear"), 1);
  EXPECT_EQ(find(out, "Linear")->attrs.get_string("activation", ""), "gelu");
  EXPECT_EQ(find(out, "FusedConv")->attrs.get_string("activation", ""), "relu");
  EXPECT_EQ(find(out, "FusedConv")->outputs[0], "y");
  const Feeds feeds = {{"x", random({1, 2, 6, 6}, 54)}, {"h", random({3, 8}, 55)}};
  expect_close(run_graph(g, feeds), run_graph(out, feeds));
  expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true));
  int total = 0;
  for (const auto& r : results) total += r.rewrites;
  EXPECT_GE(total, 5);
}

// Note [Head dims padded in the weights]: self-attention with heads of 6 (q, k, v projections reshaped to heads, an
// output projection), optimized for a CUDA plan: q, k and v one packed Linear whose weights and bias carry zeros up
// to heads of 8, the Attention reads them at scale 1 / sqrt(6), the output projection's weights have zero rows where
// the padded heads write zeros; the graph computes what the export does (cpu kernels). CPU plans keep heads of 6.
TEST(AttentionHeadPadding, HeadsOfSixArePaddedToEightInTheWeights) {
  const std::int64_t B = 2, S = 5, H = 3, D = 6, E = H * D;
  Builder b;
  b.input("x", {B, S, E});
  b.constant("heads", make_i64({4}, {B, S, H, D})).constant("merged", make_i64({3}, {B, S, E}));
  b.constant("sqrt_d", scalar(std::sqrt(static_cast<float>(D))));
  unsigned seed = 150;
  auto linear = [&](const std::string& in, const std::string& out) {
    b.constant(out + "_w", random({E, E}, seed, -0.5f, 0.5f)).constant(out + "_b", random({E}, seed + 1));
    seed += 2;
    b.add(node("MatMul", {in, out + "_w"}, {out + "_mm"})).add(node("Add", {out + "_mm", out + "_b"}, {out}));
  };
  auto perm = [](std::vector<std::int64_t> p) { return Attributes().set("perm", std::move(p)); };
  linear("x", "q");
  linear("x", "k");
  linear("x", "v");
  b.add(node("Reshape", {"q", "heads"}, {"q4"})).add(node("Transpose", {"q4"}, {"qh"}, perm({0, 2, 1, 3})));
  b.add(node("Reshape", {"k", "heads"}, {"k4"})).add(node("Transpose", {"k4"}, {"kt"}, perm({0, 2, 3, 1})));
  b.add(node("Reshape", {"v", "heads"}, {"v4"})).add(node("Transpose", {"v4"}, {"vh"}, perm({0, 2, 1, 3})));
  b.add(node("MatMul", {"qh", "kt"}, {"scores"})).add(node("Div", {"scores", "sqrt_d"}, {"scaled"}));
  b.add(node("Softmax", {"scaled"}, {"probs"})).add(node("MatMul", {"probs", "vh"}, {"ctx"}));
  b.add(node("Transpose", {"ctx"}, {"ctx_t"}, perm({0, 2, 1, 3}))).add(node("Reshape", {"ctx_t", "merged"}, {"ctx_m"}));
  linear("ctx_m", "o");
  Graph g = b.build({"o"});
  const Feeds feeds = {{"x", random({B, S, E}, 160)}};
  std::map<std::string, ValueType> types;
  const std::vector<Tensor> expected = run_graph(g, feeds, &types);
  for (const auto& [value, vt] : types) g.types[value] = vt;
  passes::PassContext ctx;
  ctx.device = Device::cuda(0);
  Graph out = g;
  std::vector<std::string> notes;
  for (const auto& r : passes::run_passes(out, ctx)) notes.insert(notes.end(), r.notes.begin(), r.notes.end());
  const Node* a = find(out, "Attention");
  ASSERT_NE(a, nullptr) << out.str();
  EXPECT_EQ(out.types.at(a->inputs[0]).sizes(), (std::vector<std::int64_t>{B, S, 3, H, 8})) << out.str();
  EXPECT_NEAR(a->attrs.get_float("scale", 0.0), 1.0 / std::sqrt(6.0), 1e-6);  // the Div by a float32 sqrt(6)
  int padded_linears = 0;
  for (const Node& n : out.nodes) {
    if (n.op_type != "Linear") continue;
    const std::vector<std::int64_t> w = out.initializers.at(n.inputs[1]).shape();
    EXPECT_TRUE(w == (std::vector<std::int64_t>{E, 3 * H * 8}) || w == (std::vector<std::int64_t>{3 * H * 8, E}) ||
                w == (std::vector<std::int64_t>{H * 8, E}) || w == (std::vector<std::int64_t>{E, H * 8}))
        << n.str();
    ++padded_linears;
  }
  EXPECT_EQ(padded_linears, 2) << out.str();
  EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("heads of 6 padded to 8") != std::string::npos;
  }));
  expect_close(expected, run_graph(out, feeds, nullptr, /*library_fused=*/true));
  Graph cpu = g;
  passes::run_passes(cpu, passes::PassContext{});
  EXPECT_EQ(cpu.types.at(find(cpu, "Attention")->inputs[0]).sizes().back(), D) << cpu.str();
}

// A pre-LayerNorm transformer block as exporters write it: the LayerNorm formula, Q/K/V projections reshaped to
// heads, attention with [B,S,H,D] keys, an output projection and residual, ONNX LayerNormalization, and an MLP
// with the erf GELU formula. Types come from a reference run (what shape inference gives).
TEST(GraphPasses, PipelineOnATransformerBlock) {
  const std::int64_t B = 2, S = 3, E = 8, H = 2, D = 4, F = 16;
  Builder b;
  b.input("x", {B, S, E}).input("mask", {B, 1, 1, S});
  b.constant("two", scalar(2.0f)).constant("eps", scalar(1e-5f)).constant("sqrt_d", scalar(2.0f));
  b.constant("heads", make_i64({4}, {0, 0, H, D})).constant("merged", make_i64({3}, {0, 0, E}));
  b.constant("sqrt2", scalar(1.4142135f)).constant("one", scalar(1.0f)).constant("half", scalar(0.5f));
  b.constant("g1", random({E}, 60, 0.5f, 1.5f)).constant("b1", random({E}, 61));
  b.constant("g2", random({E}, 62, 0.5f, 1.5f)).constant("b2", random({E}, 63));
  unsigned seed = 70;
  auto linear = [&](const std::string& in, const std::string& out, std::int64_t k, std::int64_t n) {
    b.constant(out + "_w", random({k, n}, seed, -0.5f, 0.5f)).constant(out + "_b", random({n}, seed + 1));
    seed += 2;
    b.add(node("MatMul", {in, out + "_w"}, {out + "_mm"})).add(node("Add", {out + "_mm", out + "_b"}, {out}));
  };
  auto perm = [](std::vector<std::int64_t> p) { return Attributes().set("perm", std::move(p)); };
  auto axes = Attributes().set("axes", std::vector<std::int64_t>{-1});
  b.add(node("ReduceMean", {"x"}, {"mean"}, axes)).add(node("Sub", {"x", "mean"}, {"d"}));
  b.add(node("Pow", {"d", "two"}, {"sq"})).add(node("ReduceMean", {"sq"}, {"var"}, axes));
  b.add(node("Add", {"var", "eps"}, {"ve"})).add(node("Sqrt", {"ve"}, {"std"})).add(node("Div", {"d", "std"}, {"n"}));
  b.add(node("Mul", {"n", "g1"}, {"ns"})).add(node("Add", {"ns", "b1"}, {"ln1"}));
  linear("ln1", "q", E, E);
  linear("ln1", "k", E, E);
  linear("ln1", "v", E, E);
  b.add(node("Reshape", {"q", "heads"}, {"q4"})).add(node("Transpose", {"q4"}, {"qh"}, perm({0, 2, 1, 3})));
  b.add(node("Reshape", {"k", "heads"}, {"k4"})).add(node("Transpose", {"k4"}, {"kt"}, perm({0, 2, 3, 1})));
  b.add(node("Reshape", {"v", "heads"}, {"v4"})).add(node("Transpose", {"v4"}, {"vh"}, perm({0, 2, 1, 3})));
  b.add(node("MatMul", {"qh", "kt"}, {"scores"})).add(node("Div", {"scores", "sqrt_d"}, {"scaled"}));
  b.add(node("Add", {"scaled", "mask"}, {"masked"})).add(node("Softmax", {"masked"}, {"probs"}));
  b.add(node("MatMul", {"probs", "vh"}, {"ctx"})).add(node("Transpose", {"ctx"}, {"ctx_t"}, perm({0, 2, 1, 3})));
  b.add(node("Reshape", {"ctx_t", "merged"}, {"ctx_m"}));
  linear("ctx_m", "o", E, E);
  b.add(node("Add", {"x", "o"}, {"h1"}));
  b.add(node("LayerNormalization", {"h1", "g2", "b2"}, {"ln2"}));
  linear("ln2", "f1", E, F);
  b.add(node("Div", {"f1", "sqrt2"}, {"gd"})).add(node("Erf", {"gd"}, {"ge"})).add(node("Add", {"ge", "one"}, {"gt"}));
  b.add(node("Mul", {"f1", "gt"}, {"gx"})).add(node("Mul", {"gx", "half"}, {"gelu"}));
  linear("gelu", "f2", F, E);
  b.add(node("Add", {"h1", "f2"}, {"y"}));
  Graph g = b.build({"y"});
  const Feeds feeds = {{"x", random({B, S, E}, 64)}, {"mask", random({B, 1, 1, S}, 65, -3, 0)}};
  std::map<std::string, ValueType> types;
  const std::vector<Tensor> expected = run_graph(g, feeds, &types);
  for (const auto& [value, vt] : types) g.types[value] = vt;

  Graph out = g;
  std::vector<std::string> notes;
  for (const auto& r : passes::run_passes(out, {})) notes.insert(notes.end(), r.notes.begin(), r.notes.end());
  EXPECT_EQ(count(out, "LayerNormalization"), 2) << out.str();
  EXPECT_EQ(count(out, "Attention"), 1) << out.str();
  EXPECT_EQ(count(out, "Linear"), 4) << out.str();  // q, k and v one Linear (Note [One GEMM for q, k and v])
  EXPECT_EQ(count(out, "Gelu"), 0) << out.str();  // folded into the first MLP Linear
  EXPECT_EQ(count(out, "MatMul"), 0) << out.str();
  EXPECT_EQ(count(out, "Softmax"), 0) << out.str();
  // Q, K, V and the context stay [B, S, H, D]: the attention reads them from the one projection and writes the
  // context so (Note [Attention reads the heads where the projections wrote them], Note [One GEMM for q, k and v]).
  EXPECT_EQ(count(out, "Transpose"), 0) << out.str();
  EXPECT_EQ(find(out, "Attention")->attrs.get_ints("bshd", {}), (std::vector<std::int64_t>{0, 0, 0, 1})) << out.str();
  EXPECT_EQ(find(out, "Attention")->attrs.get_ints("qkv_parts", {}), (std::vector<std::int64_t>{0, 1, 2}))
      << out.str();
  for (const Node& n : out.nodes) {
    if (n.op_type == "LayerNormalization") {
      EXPECT_EQ(n.domain, kXpurtDomain);
    }
    if (n.op_type == "Linear" && n.inputs[0] == "ln2") {
      EXPECT_EQ(n.attrs.get_string("activation", ""), "gelu");
    }
  }
  expect_close(expected, run_graph(out, feeds));
  expect_close(expected, run_graph(out, feeds, nullptr, /*library_fused=*/true));
  // A second run finds nothing left to do.
  for (const auto& r : passes::run_passes(out, {})) EXPECT_EQ(r.rewrites, 0) << r.pass;
}

// float16: the folded constants are rounded to the weights' type, the fused nodes take it.
TEST(GraphPasses, Float16ConvBnAndGemm) {
  auto half = [](const Tensor& t) { return ops::cast(t, DType::kFloat16); };
  Builder b;
  b.input("x", {1, 2, 5, 5}).input("h", {3, 4});
  b.g.types["x"].dtype = DType::kFloat16;
  b.g.types["h"].dtype = DType::kFloat16;
  b.constant("w", half(random({3, 2, 3, 3}, 80))).constant("scale", half(random({3}, 81, 0.5f, 1.5f)));
  b.constant("shift", half(random({3}, 82))).constant("mean", half(random({3}, 83)));
  b.constant("var", half(random({3}, 84, 0.5f, 2.0f)));
  b.constant("gw", half(random({5, 4}, 85))).constant("gc", half(random({5}, 86)));
  b.add(node("Conv", {"x", "w"}, {"c"}));
  b.add(node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, {"bn"}));
  b.add(node("Relu", {"bn"}, {"y"}));
  b.add(node("Gemm", {"h", "gw", "gc"}, {"z"}, Attributes().set("transB", I(1)).set("alpha", 0.5)));
  Graph g = b.build({"y", "z"});
  const Feeds feeds = {{"x", half(random({1, 2, 5, 5}, 87))}, {"h", half(random({3, 4}, 88))}};
  Graph out = g;
  passes::run_passes(out, {});
  EXPECT_EQ(count(out, "FusedConv"), 1) << out.str();
  EXPECT_EQ(count(out, "Linear"), 1) << out.str();
  std::vector<Tensor> before = run_graph(g, feeds), after = run_graph(out, feeds);
  for (auto* list : {&before, &after}) {
    for (Tensor& t : *list) t = ops::cast(t, DType::kFloat32);
  }
  expect_close(before, after, 1e-2, 1e-2);
}

// A small float16 ResNet: a stem conv with 3 input channels (not tensor-core friendly: stays NCHW), max pool,
// two residual blocks of 16 channels, global average pool, flatten, linear.
Graph small_resnet_fp16() {
  auto half = [](const Tensor& t) { return ops::cast(t, DType::kFloat16); };
  Builder b;
  b.input("x", {2, 3, 12, 12});
  b.g.types["x"].dtype = DType::kFloat16;
  const auto pads1 = Attributes().set("pads", std::vector<std::int64_t>{1, 1, 1, 1});
  b.constant("w0", half(random({16, 3, 3, 3}, 90, -0.5f, 0.5f))).constant("b0", half(random({16}, 91)));
  b.add(node("Conv", {"x", "w0", "b0"}, {"c0"}, pads1)).add(node("Relu", {"c0"}, {"r0"}));
  b.add(node("MaxPool", {"r0"}, {"p0"},
             Attributes()
                 .set("kernel_shape", std::vector<std::int64_t>{3, 3})
                 .set("strides", std::vector<std::int64_t>{2, 2})
                 .set("pads", std::vector<std::int64_t>{1, 1, 1, 1})));
  std::string h = "p0";
  for (int k = 1; k <= 2; ++k) {
    const std::string s = std::to_string(k);
    b.constant("wa" + s, half(random({16, 16, 3, 3}, 92 + k, -0.2f, 0.2f))).constant("ba" + s, half(random({16}, 95 + k)));
    b.constant("wb" + s, half(random({16, 16, 1, 1}, 97 + k, -0.3f, 0.3f)));
    b.add(node("Conv", {h, "wa" + s, "ba" + s}, {"ca" + s}, pads1)).add(node("Relu", {"ca" + s}, {"ra" + s}));
    b.add(node("Conv", {"ra" + s, "wb" + s}, {"cb" + s})).add(node("Add", {"cb" + s, h}, {"sum" + s}));
    b.add(node("Relu", {"sum" + s}, {"h" + s}));
    h = "h" + s;
  }
  b.add(node("GlobalAveragePool", {h}, {"gap"})).add(node("Flatten", {"gap"}, {"flat"}));
  b.constant("fc", half(random({16, 5}, 100))).add(node("MatMul", {"flat", "fc"}, {"logits"}));
  // Types as shape inference gives them (conv_fusion needs the input shapes).
  const std::vector<std::pair<std::string, std::vector<Dim>>> shapes = {
      {"c0", {2, 16, 12, 12}}, {"r0", {2, 16, 12, 12}}, {"p0", {2, 16, 6, 6}}, {"gap", {2, 16, 1, 1}},
      {"flat", {2, 16}}, {"logits", {2, 5}}};
  for (const auto& [v, shape] : shapes) b.typed(v, shape).g.types[v].dtype = DType::kFloat16;
  for (const char* v : {"ca1", "ra1", "cb1", "sum1", "h1", "ca2", "ra2", "cb2", "sum2", "h2"}) {
    b.typed(v, {2, 16, 6, 6}).g.types[v].dtype = DType::kFloat16;
  }
  return b.build({"logits", "h1"});
}

// Note [Channels last], Note [Stems padded to eight channels]: the whole small ResNet runs channels-last, its
// 3-channel stem on the image padded to 8 channels.
TEST(NhwcLayout, ResNetRunsChannelsLastFromTheImageToTheClassifier) {
  const Graph g = small_resnet_fp16();
  passes::PassContext cuda;
  cuda.device = Device::cuda(0);
  Graph out = g;
  const auto results = passes::run_passes(out, cuda);
  // The stem, the four convs of 16 channels, the max pool and the global pool are channels-last.
  int nhwc_convs = 0;
  for (const Node& n : out.nodes) {
    if (n.op_type == "FusedConv" && n.attrs.get_string("layout", "NCHW") == "NHWC") {
      // weight [O, kh, kw, C]: the stem's 3 channels padded to 8 (the first), 16 for the others
      EXPECT_EQ(out.initializers.at(n.inputs[1]).shape()[3], nhwc_convs++ == 0 ? 8 : 16) << n.name;
    }
  }
  EXPECT_EQ(nhwc_convs, 5) << out.str();
  EXPECT_EQ(count(out, "FusedConv"), 5) << out.str();
  for (const char* pool : {"MaxPool", "GlobalAveragePool"}) {
    const Node* n = find(out, pool);
    ASSERT_NE(n, nullptr) << pool;
    EXPECT_EQ(n->domain, kXpurtDomain) << pool;
    EXPECT_EQ(n->attrs.get_string("layout", ""), "NHWC") << pool;
  }
  // The image's Transpose into NHWC and its channels padded from 3 to 8 (zeros in the stem's weight); one Transpose
  // back for the graph output h1; the global pool's [N, 1, 1, C] goes back to NCHW by a Reshape.
  const Node* stem = find(out, "FusedConv");  // the first
  ASSERT_NE(stem, nullptr);
  const Tensor& w = out.initializers.at(stem->inputs[1]);
  EXPECT_EQ(w.shape(), (std::vector<std::int64_t>{16, 3, 3, 8}));
  const Tensor w32 = to_float32({w})[0].contiguous();
  const auto* weights = static_cast<const float*>(w32.data_ptr());
  for (std::int64_t k = 0; k < w32.numel(); ++k) {
    if (k % 8 >= 3) {
      ASSERT_EQ(weights[k], 0.0f) << "added channel at " << k;
    }
  }
  const Node* pad = find(out, "Pad");
  ASSERT_NE(pad, nullptr) << out.str();
  EXPECT_EQ(stem->inputs[0], pad->outputs[0]);
  const Tensor& pads = out.initializers.at(pad->inputs[1]);
  const auto* pad_values = static_cast<const std::int64_t*>(pads.data_ptr());
  EXPECT_EQ(std::vector<std::int64_t>(pad_values, pad_values + pads.numel()),
            (std::vector<std::int64_t>{0, 0, 0, 0, 0, 0, 0, 5}));
  EXPECT_EQ(count(out, "Transpose"), 2) << out.str();
  EXPECT_EQ(count(out, "Reshape"), 1) << out.str();
  bool ran = false;
  for (const auto& r : results) ran = ran || (r.pass == "nhwc_layout" && r.rewrites == 7);
  EXPECT_TRUE(ran);
  const Feeds feeds = {{"x", ops::cast(random({2, 3, 12, 12}, 101), DType::kFloat16)}};
  const auto expected = to_float32(run_graph(g, feeds));
  expect_close(expected, to_float32(run_graph(out, feeds)), 2e-2, 2e-2);
  expect_close(expected, to_float32(run_graph(out, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// Note [Stems padded to eight channels]: stems of 2 to 7 channels at several kernel sizes and strides compute what the
// NCHW convolution does; one input channel, or outputs that are not a multiple of 8, stay NCHW (a 1x1 of stride 1
// would be a Linear over the channels: Note [Pointwise convolutions as GEMMs]).
TEST(NhwcLayout, StemsOfTwoToSevenChannelsRunOnPaddedInputs) {
  auto half = [](const Tensor& t) { return ops::cast(t, DType::kFloat16); };
  struct Case {
    std::int64_t c, o, k, stride, size;
    bool padded;
  };
  for (const Case& t : {Case{3, 16, 7, 2, 15, true}, Case{2, 8, 3, 1, 9, true}, Case{7, 24, 5, 3, 11, true},
                        Case{4, 32, 1, 2, 6, true}, Case{1, 16, 3, 2, 9, false}, Case{3, 12, 3, 2, 9, false}}) {
    SCOPED_TRACE(detail::str_cat("c ", t.c, " o ", t.o, " k ", t.k, " stride ", t.stride));
    Builder b;
    b.input("x", {2, t.c, t.size, t.size});
    b.g.types["x"].dtype = DType::kFloat16;
    b.constant("w", half(random({t.o, t.c, t.k, t.k}, 140, -0.5f, 0.5f))).constant("b", half(random({t.o}, 141)));
    const std::int64_t pad = t.k / 2, out = (t.size + 2 * pad - t.k) / t.stride + 1;
    b.add(node("Conv", {"x", "w", "b"}, {"c"},
               Attributes()
                   .set("pads", std::vector<std::int64_t>{pad, pad, pad, pad})
                   .set("strides", std::vector<std::int64_t>{t.stride, t.stride})));
    b.add(node("Relu", {"c"}, {"y"}));
    for (const char* v : {"c", "y"}) b.typed(v, {2, t.o, out, out}).g.types[v].dtype = DType::kFloat16;
    const Graph g = b.build({"y"});
    passes::PassContext cuda;
    cuda.device = Device::cuda(0);
    Graph optimized = g;
    passes::run_passes(optimized, cuda);
    EXPECT_EQ(find(optimized, "Pad") != nullptr, t.padded) << optimized.str();
    const Node* conv = find(optimized, "FusedConv");
    ASSERT_NE(conv, nullptr) << optimized.str();
    EXPECT_EQ(conv->attrs.get_string("layout", "NCHW"), t.padded ? "NHWC" : "NCHW");
    const Feeds feeds = {{"x", ops::cast(random({2, t.c, t.size, t.size}, 142), DType::kFloat16)}};
    expect_close(to_float32(run_graph(g, feeds)), to_float32(run_graph(optimized, feeds)), 2e-2, 2e-2);
  }
}

// ---- elementwise_fusion (Note [Fused elementwise programs]) ----

// x [2, 3, 4, 5] -> s = Sigmoid(x); m = Mul(x, s); y = Add(m, b [3, 1, 1]); z = Relu(s) when `s_read_twice`
// (another reader of s outside the chain).
Graph silu_bias_graph(bool s_read_twice) {
  Builder b;
  b.input("x", {2, 3, 4, 5});
  b.constant("b", random({3, 1, 1}, 201));
  b.add(node("Sigmoid", {"x"}, {"s"}, {}, "sig")).typed("s", {2, 3, 4, 5});
  b.add(node("Mul", {"x", "s"}, {"m"}, {}, "mul")).typed("m", {2, 3, 4, 5});
  b.add(node("Add", {"m", "b"}, {"y"}, {}, "add")).typed("y", {2, 3, 4, 5});
  if (s_read_twice) b.add(node("Relu", {"s"}, {"z"}, {}, "relu")).typed("z", {2, 3, 4, 5});
  return b.build(s_read_twice ? std::vector<std::string>{"y", "z"} : std::vector<std::string>{"y"});
}

// Note [Squares summed over leading axes]: ConvNeXt V2's norm of each channel over H and W (channels-last), Mul(x, x)
// then ReduceSum over axes 1 and 2, becomes one ReduceSumSquare; a sum over the trailing axis stays for the fused
// programs' row reductions, and so does a Mul whose square something else reads.
Graph square_sum_graph(const std::vector<std::int64_t>& axes, bool square_read_elsewhere) {
  Builder b;
  b.input("x", {2, 3, 4, 5});
  b.constant("axes", int64s(axes));
  b.add(node("Mul", {"x", "x"}, {"sq"})).add(node("ReduceSum", {"sq", "axes"}, {"s"}));
  std::vector<std::string> outputs = {"s"};
  if (square_read_elsewhere) outputs.push_back("sq");
  b.typed("sq", {2, 3, 4, 5});
  std::vector<Dim> kept = {2, 3, 4, 5};
  for (std::int64_t a : axes) kept[static_cast<std::size_t>(a)] = Dim(1);
  b.typed("s", kept);
  return b.build(outputs);
}

TEST(ElementwiseFusion, SquaresSummedOverLeadingAxesBecomeReduceSumSquare) {
  const Feeds feeds = {{"x", random({2, 3, 4, 5}, 211, -20.0f, 20.0f)}};
  Graph out = run_pass(square_sum_graph({1, 2}, false), passes::elementwise_fusion, feeds);
  ASSERT_EQ(out.nodes.size(), 1u) << out.str();
  EXPECT_EQ(out.nodes[0].op_type, "ReduceSumSquare");
  EXPECT_EQ(out.nodes[0].inputs[0], "x");
  Graph trailing = run_pass(square_sum_graph({3}, false), passes::elementwise_fusion, feeds);
  EXPECT_EQ(count(trailing, "ReduceSumSquare"), 0) << trailing.str();
  Graph shared = run_pass(square_sum_graph({1, 2}, true), passes::elementwise_fusion, feeds);
  EXPECT_EQ(count(shared, "ReduceSumSquare"), 0) << shared.str();
}

TEST(ElementwiseFusion, AChainBecomesOneNodeWithItsProgram) {
  int rewrites = 0;
  Graph out = run_pass(silu_bias_graph(false), passes::elementwise_fusion, {{"x", random({2, 3, 4, 5}, 202)}},
                       &rewrites);
  EXPECT_EQ(rewrites, 1);
  ASSERT_EQ(out.nodes.size(), 1u) << out.str();
  const Node& f = out.nodes[0];
  EXPECT_EQ(f.domain, kXpurtDomain);
  EXPECT_EQ(f.op_type, "FusedElementwise");
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"x", "b"}));
  EXPECT_EQ(f.outputs, (std::vector<std::string>{"y"}));
  EXPECT_EQ(f.attrs.get_string("program", ""), "sigmoid x0; mul x0 t0; add t1 x1");
}

TEST(ElementwiseFusion, AValueReadOutsideEndsTheGroup) {
  int rewrites = 0;
  Graph out = run_pass(silu_bias_graph(true), passes::elementwise_fusion, {{"x", random({2, 3, 4, 5}, 203)}},
                       &rewrites);
  // s is read by the Relu too: it stays a value (Sigmoid and Relu stay nodes), the Mul and Add become one node.
  EXPECT_EQ(count(out, "FusedElementwise"), 1) << out.str();
  EXPECT_EQ(count(out, "Sigmoid"), 1) << out.str();
  EXPECT_EQ(count(out, "Relu"), 1) << out.str();
  bool found = false;
  for (const Node& n : out.nodes) {
    if (n.op_type == "FusedElementwise" && n.outputs[0] == "y") {
      found = true;
      EXPECT_EQ(n.inputs, (std::vector<std::string>{"x", "s", "b"}));
      EXPECT_EQ(n.attrs.get_string("program", ""), "mul x0 x1; add t0 x2");
    }
  }
  EXPECT_TRUE(found) << out.str();
}

TEST(ElementwiseFusion, PoliciesAndDevicesKeepNodesOut) {
  const Graph g = silu_bias_graph(false);
  passes::PassContext keep;
  keep.keep_unfused = [](const std::string& op) { return op == "sigmoid"; };
  Graph kept = g;
  passes::elementwise_fusion(kept, keep);
  EXPECT_EQ(count(kept, "Sigmoid"), 1) << kept.str();
  EXPECT_EQ(count(kept, "FusedElementwise"), 1) << kept.str();  // Mul + Add
  passes::PassContext off;
  off.fuse_elementwise = false;  // no fused_elementwise kernel on the device
  Graph unchanged = g;
  EXPECT_EQ(passes::elementwise_fusion(unchanged, off).rewrites, 0);
  EXPECT_EQ(unchanged.nodes.size(), 3u);
  // A broadcast that grows an input's rank past the group's output, a non-float dtype: not members.
  Builder b;
  b.input("x", {4});
  b.constant("w", random({3, 4}, 204));
  b.add(node("Mul", {"x", "w"}, {"m"}, {}, "grow")).typed("m", {3, 4});
  b.add(node("Sigmoid", {"m"}, {"y"}, {}, "sig")).typed("y", {3, 4});
  Graph grown = b.build({"y"});
  int rewrites = 0;
  run_pass(grown, passes::elementwise_fusion, {{"x", random({4}, 205)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);  // Mul [4] x [3, 4] -> [3, 4] is fine: every member has the output's shape
}

// x [2, 5, 8] -> RMSNorm as exporters write it: x * 1 / sqrt(mean(x^2 over `axis`) + eps) * w.
Graph rms_norm_graph(std::int64_t axis) {
  Builder b;
  b.input("x", {2, 5, 8});
  b.constant("two", scalar(2.0f));
  b.constant("eps", make({1}, {1e-5f}));
  b.constant("w", random({8}, 206));
  std::vector<Dim> reduced = {2, 5, 8};
  reduced[static_cast<std::size_t>(axis)] = 1;
  Attributes mean;
  mean.set("axes", std::vector<std::int64_t>{axis - 3});  // negative, as exporters write it
  b.add(node("Pow", {"x", "two"}, {"sq"}, {}, "pow")).typed("sq", {2, 5, 8});
  b.add(node("ReduceMean", {"sq"}, {"ms"}, mean, "mean")).typed("ms", reduced);
  b.add(node("Add", {"ms", "eps"}, {"v"}, {}, "add")).typed("v", reduced);
  b.add(node("Sqrt", {"v"}, {"s"}, {}, "sqrt")).typed("s", reduced);
  b.add(node("Reciprocal", {"s"}, {"r"}, {}, "rsqrt")).typed("r", reduced);
  b.add(node("Mul", {"x", "r"}, {"n"}, {}, "norm")).typed("n", {2, 5, 8});
  b.add(node("Mul", {"n", "w"}, {"y"}, {}, "scale")).typed("y", {2, 5, 8});
  return b.build({"y"});
}

TEST(ElementwiseFusion, ATrailingAxisReductionJoinsItsGroup) {
  int rewrites = 0;
  Graph out = run_pass(rms_norm_graph(2), passes::elementwise_fusion, {{"x", random({2, 5, 8}, 207)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);
  ASSERT_EQ(out.nodes.size(), 1u) << out.str();
  const Node& f = out.nodes[0];
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"x", "eps", "w"}));
  // x ** 2 is one multiply; the mean reads the row of its element (row_axes = 1: the last axis).
  EXPECT_EQ(f.attrs.get_string("program", ""),
            "mul x0 x0; reduce_mean t0; add t1 x1; sqrt t2; reciprocal t3; mul x0 t4; mul t5 x2");
  EXPECT_EQ(f.attrs.get_int("row_axes", 0), 1);
  EXPECT_EQ(out.initializers.count("two"), 0u);  // read by nobody now
  // Over a middle axis the mean is not a row of the output: it stays a node, the chains around it fuse.
  Graph middle = run_pass(rms_norm_graph(1), passes::elementwise_fusion, {{"x", random({2, 5, 8}, 208)}}, &rewrites);
  EXPECT_EQ(count(middle, "ReduceMean"), 1) << middle.str();
  for (const Node& n : middle.nodes) {
    EXPECT_EQ(n.attrs.get_string("program", "").find("reduce"), std::string::npos) << n.str();
  }
}

// x - x.amax(-1, keepdim=True), then exp: with 2 rows of 65537 the max stays a node (Note [Few long rows stay
// unfused]: a row program would run on two blocks), the chain after it fuses; with 128 rows it joins the group.
TEST(ElementwiseFusion, AFewLongRowsKeepTheirReductionANode) {
  for (const std::int64_t rows : {2, 128}) {
    const std::vector<std::int64_t> shape = {rows, 65537};
    Builder b;
    b.input("x", {rows, 65537});
    Attributes max;
    max.set("axes", std::vector<std::int64_t>{-1});
    b.add(node("ReduceMax", {"x"}, {"m"}, max, "max")).typed("m", {rows, 1});
    b.add(node("Sub", {"x", "m"}, {"d"}, {}, "sub")).typed("d", {rows, 65537});
    b.add(node("Exp", {"d"}, {"y"}, {}, "exp")).typed("y", {rows, 65537});
    int rewrites = 0;
    Graph out = run_pass(b.build({"y"}), passes::elementwise_fusion, {{"x", random(shape, 212)}}, &rewrites);
    EXPECT_EQ(rewrites, 1) << out.str();
    EXPECT_EQ(count(out, "ReduceMax"), rows == 2 ? 1 : 0) << out.str();
    ASSERT_EQ(out.nodes.size(), rows == 2 ? 2u : 1u) << out.str();
    EXPECT_EQ(out.nodes.back().attrs.get_string("program", ""), rows == 2 ? "sub x0 x1; exp t0"
                                                                           : "reduce_max x0; sub x0 t0; exp t1");
  }
}

// q [2, 3, 4, 8] -> q * cos + rotate_half(q) * sin, rotate_half as exporters write it: Concat(Neg(q[..., 4:]), q[..., :4]).
TEST(ElementwiseFusion, TheRotaryEmbeddingIsOneGroup) {
  Builder b;
  b.input("q", {2, 3, 4, 8});
  b.constant("cos", random({4, 8}, 209)).constant("sin", random({4, 8}, 210));
  b.constant("half", make_i64({1}, {4})).constant("end", make_i64({1}, {std::numeric_limits<std::int64_t>::max()}));
  b.constant("zero", make_i64({1}, {0})).constant("last", make_i64({1}, {-1}));
  b.add(node("Slice", {"q", "half", "end", "last"}, {"hi"}, {}, "hi")).typed("hi", {2, 3, 4, 4});
  b.add(node("Neg", {"hi"}, {"neg"}, {}, "neg")).typed("neg", {2, 3, 4, 4});
  b.add(node("Slice", {"q", "zero", "half", "last"}, {"lo"}, {}, "lo")).typed("lo", {2, 3, 4, 4});
  Attributes axis;
  axis.set("axis", std::int64_t{-1});
  b.add(node("Concat", {"neg", "lo"}, {"rot"}, axis, "cat")).typed("rot", {2, 3, 4, 8});
  b.add(node("Mul", {"q", "cos"}, {"a"}, {}, "qcos")).typed("a", {2, 3, 4, 8});
  b.add(node("Mul", {"rot", "sin"}, {"c"}, {}, "rsin")).typed("c", {2, 3, 4, 8});
  b.add(node("Add", {"a", "c"}, {"y"}, {}, "add")).typed("y", {2, 3, 4, 8});
  int rewrites = 0;
  Graph out = run_pass(b.build({"y"}), passes::elementwise_fusion, {{"q", random({2, 3, 4, 8}, 211)}}, &rewrites);
  EXPECT_EQ(rewrites, 1);
  ASSERT_EQ(out.nodes.size(), 1u) << out.str();
  EXPECT_EQ(out.nodes[0].inputs, (std::vector<std::string>{"q", "cos", "sin"}));
  EXPECT_EQ(out.nodes[0].attrs.get_string("program", ""), "rotate_half x0; mul x0 x1; mul t0 x2; add t1 t2");
}

// xpuruntime::graph_passes() (the public list) is all_passes() in order, each with its doc line, and every name is one
// run_passes takes.
TEST(GraphPasses, ThePublicListIsThePlansOrder) {
  const std::vector<GraphPassInfo> listed = graph_passes();
  const std::vector<passes::PassInfo>& all = passes::all_passes();
  ASSERT_EQ(listed.size(), all.size());
  std::set<std::string> names;
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(listed[i].name, all[i].name);
    EXPECT_FALSE(listed[i].doc.empty()) << listed[i].name;
    names.insert(listed[i].name);
  }
  EXPECT_EQ(listed.front().name, "constant_folding");
  Graph g = small_resnet_fp16();
  passes::run_passes(g, {}, names);  // every listed name is a valid one to disable
  EXPECT_THROW(passes::run_passes(g, {}, {"no_such_pass"}), InvalidArgumentError);
}

TEST(NhwcLayout, OnlyForCudaPlansAndHalfFloatsAndCanBeDisabled) {
  const Graph g = small_resnet_fp16();
  Graph cpu = g;
  passes::run_passes(cpu, {});
  for (const Node& n : cpu.nodes) EXPECT_EQ(n.attrs.get_string("layout", "NCHW"), "NCHW") << n.str();
  EXPECT_EQ(count(cpu, "Transpose"), 0);
  passes::PassContext cuda;
  cuda.device = Device::cuda(0);
  Graph disabled = g;
  passes::run_passes(disabled, cuda, {"nhwc_layout"});
  EXPECT_EQ(count(disabled, "Transpose"), 0) << disabled.str();
  // float32 graphs stay NCHW.
  Builder b;
  b.input("x", {1, 8, 5, 5});
  b.constant("w", random({8, 8, 3, 3}, 102));
  b.add(node("Conv", {"x", "w"}, {"y"}));
  b.typed("y", {1, 8, 3, 3});
  Graph f32 = b.build({"y"});
  passes::run_passes(f32, cuda);
  EXPECT_EQ(count(f32, "Transpose"), 0) << f32.str();
}

// A tiny suite export (models/suite/tiny/<name>.dynamo.float16.onnx, one input, unknown dims 2) and the graph the
// passes of a CUDA plan make of it; `shape` gets the input's shape.
struct CudaOptimized {
  Graph original, optimized;
  std::vector<std::int64_t> shape;
};
CudaOptimized tiny_export_for_cuda(const std::string& name) {
  const std::filesystem::path tiny = std::filesystem::path(XPURT_SOURCE_DIR) / "models" / "suite" / "tiny";
  CudaOptimized out;
  out.original = import_onnx_file((tiny / (name + ".dynamo.float16.onnx")).string());
  EXPECT_EQ(out.original.inputs.size(), 1u);
  for (Dim& d : out.original.types[out.original.inputs[0]].shape) {
    if (!d.known()) d = Dim(2);
    out.shape.push_back(d.value);
  }
  runtime::InferOptions cuda;
  cuda.device = Device::cuda(0);
  out.optimized = out.original;
  runtime::optimize(out.optimized, cuda, {});
  return out;
}

// The real-model suite's float16 dynamo exports of the depthwise-block CNNs (models/suite/tiny), optimized for a
// CUDA plan: the channels-last values propagate through the depthwise convolutions, activations, squeeze-excitation
// and the exporters' own permutes (Note [Layouts propagate]), so that only the stem's way in and the classifier's
// way out are Transposes; the rewritten graph computes what the export does.
TEST(NhwcLayout, DepthwiseBlocksOfRealExportsStayChannelsLast) {
  // model -> the Transposes left (the exports had 15, 28 and 18 with only the convolutions channels-last)
  const std::vector<std::pair<std::string, int>> models = {{"efficientnet", 2}, {"mobilenet_v3", 1}, {"convnext", 3}};
  for (const auto& [name, transposes] : models) {
    SCOPED_TRACE(name);
    const CudaOptimized plan = tiny_export_for_cuda(name);
    const Graph& g = plan.original;
    const Graph& out = plan.optimized;
    const std::vector<std::int64_t>& shape = plan.shape;
    int nhwc_depthwise = 0;
    std::set<std::string> activations;  // of the depthwise convolutions (conv_fusion takes SiLU and HardSwish)
    for (const Node& n : out.nodes) {
      if (n.op_type != "FusedConv" || n.attrs.get_int("group", 1) == 1) continue;
      nhwc_depthwise += n.attrs.get_string("layout", "") == "NHWC";
      activations.insert(n.attrs.get_string("activation", "none"));
    }
    EXPECT_GT(nhwc_depthwise, 0) << out.str();
    if (name == "efficientnet") {
      EXPECT_EQ(activations, std::set<std::string>{"silu"});
    } else if (name == "mobilenet_v3") {
      EXPECT_EQ(activations, (std::set<std::string>{"hard_swish", "relu"}));
    }
    EXPECT_LE(count(out, "Transpose"), transposes) << out.str();
    if (name == "convnext") {  // layer scale and the residual ride in the second MLP Linear of each block
      EXPECT_EQ(count(out, "FusedElementwise"), 0) << out.str();
    }
    const Feeds feeds = {{g.inputs[0], ops::cast(random(shape, 103), DType::kFloat16)}};
    expect_close(to_float32(run_graph(g, feeds)), to_float32(run_graph(out, feeds, nullptr, /*library_fused=*/true)),
                 2e-2, 2e-2);
  }
}

// The suite's grouped-convolution CNNs (ResNeXt, RegNet; float16 dynamo exports) in a CUDA plan: their grouped
// convolutions run channels-last like the others (Note [Grouped convolutions run channels-last]), so the network
// stays NHWC from the stem's way in to the classifier's way out; the rewritten graph computes what the export does.
TEST(NhwcLayout, GroupedConvolutionsOfRealExportsRunChannelsLast) {
  for (const std::string name : {"resnext", "regnet"}) {
    SCOPED_TRACE(name);
    const CudaOptimized plan = tiny_export_for_cuda(name);
    const Graph& g = plan.original;
    const Graph& out = plan.optimized;
    const std::vector<std::int64_t>& shape = plan.shape;
    int grouped = 0, grouped_nhwc = 0;
    for (const Node& n : out.nodes) {
      if (n.op_type != "FusedConv" || n.attrs.get_int("group", 1) == 1) continue;
      ++grouped;
      if (n.attrs.get_string("layout", "") != "NHWC") continue;
      ++grouped_nhwc;
      const auto& w = out.initializers.at(n.inputs[1]).shape();  // [O, kh, kw, C / group]
      EXPECT_EQ(w[3] * n.attrs.get_int("group", 1), out.types.at(n.inputs[0]).shape[3].value) << n.str();
    }
    EXPECT_GT(grouped, 0) << out.str();
    EXPECT_EQ(grouped_nhwc, grouped) << out.str();
    EXPECT_LE(count(out, "Transpose"), 2) << out.str();
    const Feeds feeds = {{g.inputs[0], ops::cast(random(shape, 104), DType::kFloat16)}};
    expect_close(to_float32(run_graph(g, feeds)), to_float32(run_graph(out, feeds, nullptr, /*library_fused=*/true)),
                 2e-2, 2e-2);
  }
}

// Note [Feature maps of tokens], Note [View chains that are reshapes]: SegFormer's Mix-FFN depthwise convolutions read
// tokens viewed as a feature map; in a CUDA plan they run channels-last and every token <-> feature map chain around
// a channels-last convolution is a Reshape (the export's plan had 19 Transposes, 2 around each convolution). The
// rewritten graph computes what the export does (the CPU runs it, NHWC convolutions included).
TEST(NhwcLayout, TokensViewedAsFeatureMapsAreChannelsLastForFree) {
  const CudaOptimized plan = tiny_export_for_cuda("segformer");
  int depthwise = 0;
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type != "FusedConv" || n.attrs.get_int("group", 1) == 1) continue;
    ++depthwise;
    EXPECT_EQ(n.attrs.get_string("layout", ""), "NHWC") << n.str();
  }
  EXPECT_EQ(depthwise, 2) << plan.optimized.str();
  EXPECT_LE(count(plan.optimized, "Transpose"), 5) << plan.optimized.str();
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 131), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// Note [Unary ops move before view chains]: Whisper's and wav2vec 2.0's 1-D convolution stems (channels-last 2-D
// convolutions between an Unsqueeze and a Squeeze) with a GELU between them: the GELU runs on the channels-last
// output and the chains around it are Reshapes (the plans had 5 and 6 Transposes). The rewritten graphs compute what
// the exports do.
TEST(NhwcLayout, GeluBetweenOneDimensionalConvolutionsRunsChannelsLast) {
  for (const auto& [name, transposes] : std::vector<std::pair<std::string, int>>{{"whisper_encoder", 1},
                                                                                {"wav2vec2", 2}}) {
    SCOPED_TRACE(name);
    const CudaOptimized plan = tiny_export_for_cuda(name);
    EXPECT_LE(count(plan.optimized, "Transpose"), transposes) << plan.optimized.str();
    const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 132), DType::kFloat16)}};
    expect_close(to_float32(run_graph(plan.original, feeds)),
                 to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
  }
}

// A ShuffleNetV2 block of 12 channels (branches of 6: not multiples of 8) in a CUDA plan: the 1x1 convolutions are
// Linears over the channels (Note [Pointwise convolutions as GEMMs]), the depthwise one runs channels-last, and the
// channel split, the concatenation and the channel shuffle follow the channels-last values (Note [Channel
// concatenations, slices and shuffles follow]): one Transpose into NHWC at the input, the shuffle and the way back
// one copy; the rewritten graph computes what the block does. Then the suite's ShuffleNetV2 export (channels
// that are multiples of 8): channels-last from its first block to its classifier.
TEST(NhwcLayout, ChannelSplitsConcatenationsAndShufflesStayChannelsLast) {
  auto half = [](const Tensor& t) { return ops::cast(t, DType::kFloat16); };
  Builder b;
  b.input("x", {2, 12, 5, 5});
  b.g.types["x"].dtype = DType::kFloat16;
  const auto relu = Attributes();
  b.constant("w0", half(random({12, 12, 1, 1}, 120, -0.4f, 0.4f))).constant("b0", half(random({12}, 121)));
  b.constant("w1", half(random({6, 6, 1, 1}, 122, -0.4f, 0.4f))).constant("b1", half(random({6}, 123)));
  b.constant("wd", half(random({6, 1, 3, 3}, 124, -0.4f, 0.4f))).constant("bd", half(random({6}, 125)));
  b.constant("w2", half(random({6, 6, 1, 1}, 126, -0.4f, 0.4f))).constant("b2", half(random({6}, 127)));
  b.constant("lo", int64s({0})).constant("mid", int64s({6})).constant("hi", int64s({12})).constant("ax", int64s({1}));
  b.constant("split_shape", int64s({2, 2, 6, 5, 5})).constant("joined_shape", int64s({2, 12, 5, 5}));
  b.add(node("Conv", {"x", "w0", "b0"}, {"c0"})).add(node("Relu", {"c0"}, {"h"}));
  b.add(node("Slice", {"h", "lo", "mid", "ax"}, {"x1"})).add(node("Slice", {"h", "mid", "hi", "ax"}, {"x2"}));
  b.add(node("Conv", {"x2", "w1", "b1"}, {"c1"})).add(node("Relu", {"c1"}, {"r1"}));
  b.add(node("Conv", {"r1", "wd", "bd"}, {"d"},
             Attributes().set("group", std::int64_t{6}).set("pads", std::vector<std::int64_t>{1, 1, 1, 1})));
  b.add(node("Conv", {"d", "w2", "b2"}, {"c2"})).add(node("Relu", {"c2"}, {"r2"}));
  b.add(node("Concat", {"x1", "r2"}, {"cat"}, Attributes().set("axis", std::int64_t{1})));
  b.add(node("Reshape", {"cat", "split_shape"}, {"split"}));
  b.add(node("Transpose", {"split"}, {"moved"}, Attributes().set("perm", std::vector<std::int64_t>{0, 2, 1, 3, 4})));
  b.add(node("Reshape", {"moved", "joined_shape"}, {"y"}));
  const Graph g = b.build({"y"});
  runtime::InferOptions cuda;
  cuda.device = Device::cuda(0);
  Graph out = g;
  runtime::optimize(out, cuda, {});
  EXPECT_EQ(count(out, "Linear"), 3) << out.str();
  // x into NHWC; the shuffle's Transpose and the way back are one copy through a view (Note [Chains of copies
  // become one]), the split's first half a piece of the Concat's kernel (Note [Concats of fused values])
  EXPECT_EQ(count(out, "Transpose"), 1) << out.str();
  EXPECT_EQ(count(out, "Concat") + count(out, "Slice"), 1) << out.str();
  for (const Node& n : out.nodes) {
    if (n.op_type == "FusedConv") {
      EXPECT_EQ(n.attrs.get_string("layout", ""), "NHWC") << n.str();
    }
  }
  const Feeds feeds = {{"x", half(random({2, 12, 5, 5}, 128))}};
  expect_close(to_float32(run_graph(g, feeds)), to_float32(run_graph(out, feeds, nullptr, /*library_fused=*/true)),
               2e-2, 2e-2);

  const CudaOptimized plan = tiny_export_for_cuda("shufflenet_v2");
  // the stem's two ways in and one shuffle per block (17 with the splits, concatenations and shuffles NCHW)
  EXPECT_LE(count(plan.optimized, "Transpose"), 8) << plan.optimized.str();
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type == "Concat") {
      EXPECT_EQ(n.attrs.get_int("axis", 0), 3) << n.str();
    }
  }
  const Feeds suite = {{plan.original.inputs[0], half(random(plan.shape, 129))}};
  expect_close(to_float32(run_graph(plan.original, suite)),
               to_float32(run_graph(plan.optimized, suite, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// The suite's DenseNet export in a CUDA plan: its pre-activation norms are fused affine maps + ReLU (Note [Batch
// norms without a convolution become an affine map]) that stay channels-last with the concatenations they read,
// the stem's NCHW pool joins its first block's concatenations through one twin, so that the Transposes left are the
// stem's way in and none inside the blocks (10 before); the rewritten graph computes what the export does.
TEST(NhwcLayout, DenseNetStaysChannelsLastThroughItsNormsAndConcatenations) {
  const CudaOptimized plan = tiny_export_for_cuda("densenet");
  EXPECT_EQ(count(plan.optimized, "BatchNormalization"), 0) << plan.optimized.str();
  EXPECT_LE(count(plan.optimized, "Transpose"), 2) << plan.optimized.str();
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type == "Concat") {
      EXPECT_EQ(n.attrs.get_int("axis", 0), 3) << n.str();
    }
  }
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 135), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// A MetaFormer block as PyTorch exports it (GroupNorm of `groups` groups: Reshape [N, G, -1], InstanceNormalization,
// Reshape back, per-channel scale and bias; pooling minus its input; convolutions on both sides), optimized for a
// CUDA plan. One group normalizes every element of a sample alike, so the norm runs on the channels-last values
// (Note [Per-sample normalizations are layout-free]) and only the input's and the output's Transposes are left; two
// groups are not layout-free (each group is a run of channels in NCHW order) and keep theirs. Both compute what the
// graph does.
Graph metaformer_block_fp16(std::int64_t groups) {
  auto half = [](const Tensor& t) { return ops::cast(t, DType::kFloat16); };
  Builder b;
  b.input("x", {3, 16, 7, 5});
  b.g.types["x"].dtype = DType::kFloat16;
  const auto pads1 = Attributes().set("pads", std::vector<std::int64_t>{1, 1, 1, 1});
  b.constant("w0", half(random({16, 16, 3, 3}, 301, -0.2f, 0.2f))).constant("b0", half(random({16}, 302)));
  b.constant("flat", make_i64({3}, {0, groups, -1})).constant("back", make_i64({4}, {3, 16, 7, 5}));
  b.constant("s", half(random({groups}, 303, 0.5f, 1.5f))).constant("t", half(random({groups}, 304)));
  b.constant("gamma", half(random({16, 1, 1}, 305, 0.5f, 1.5f))).constant("beta", half(random({16, 1, 1}, 306)));
  b.constant("w1", half(random({16, 16, 1, 1}, 307, -0.3f, 0.3f)));
  b.add(node("Conv", {"x", "w0", "b0"}, {"c"}, pads1)).add(node("Reshape", {"c", "flat"}, {"f"}));
  b.add(node("InstanceNormalization", {"f", "s", "t"}, {"in"})).add(node("Reshape", {"in", "back"}, {"gn0"}));
  b.add(node("Mul", {"gn0", "gamma"}, {"gn1"})).add(node("Add", {"gn1", "beta"}, {"gn"}));
  b.add(node("AveragePool", {"gn"}, {"pool"},
             Attributes()
                 .set("kernel_shape", std::vector<std::int64_t>{3, 3})
                 .set("pads", std::vector<std::int64_t>{1, 1, 1, 1})
                 .set("count_include_pad", std::int64_t{0})));
  b.add(node("Sub", {"pool", "gn"}, {"mixed"})).add(node("Add", {"c", "mixed"}, {"r"}));
  b.add(node("Conv", {"r", "w1"}, {"y"}));
  return b.build({"y"});
}

TEST(NhwcLayout, PerSampleNormsRunChannelsLastAndGroupedOnesDoNot) {
  for (const std::int64_t groups : {1, 2}) {
    SCOPED_TRACE(groups);
    const Graph g = metaformer_block_fp16(groups);
    Graph out = g;
    runtime::InferOptions cuda;
    cuda.device = Device::cuda(0);
    runtime::optimize(out, cuda, {});
    if (groups == 1) {
      EXPECT_EQ(count(out, "Transpose"), 2) << out.str();
      EXPECT_EQ(count(out, "AveragePool"), 1) << out.str();
      for (const Node& n : out.nodes) {
        if (n.op_type == "AveragePool") {
          EXPECT_EQ(n.attrs.get_string("layout", ""), "NHWC") << n.str();
        }
      }
    } else {
      EXPECT_GT(count(out, "Transpose"), 2) << out.str();
    }
    const Feeds feeds = {{"x", ops::cast(random({3, 16, 7, 5}, 308), DType::kFloat16)}};
    expect_close(to_float32(run_graph(g, feeds)), to_float32(run_graph(out, feeds, nullptr, /*library_fused=*/true)),
                 2e-2, 2e-2);
  }
}

// The suite's PoolFormer export in a CUDA plan: channels-last from the stem to the head's permute (Note [Per-sample
// normalizations are layout-free]), and the rewritten graph computes what the export does.
TEST(NhwcLayout, PoolFormersNormsAndPoolsStayChannelsLast) {
  const CudaOptimized plan = tiny_export_for_cuda("poolformer");
  EXPECT_LE(count(plan.optimized, "Transpose"), 2) << plan.optimized.str();
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 309), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// The suite's LeViT export in a CUDA plan: every LinearNorm is one Linear (no elementwise kernel reads a Reshape of a
// Linear's output) with its residual, and the rewritten graph computes what the export does.
TEST(LinearEpilogueFusion, LevitsLinearNormsAreOneGemmEach) {
  const CudaOptimized plan = tiny_export_for_cuda("levit");
  std::map<std::string, const Node*> producer;
  for (const Node& n : plan.optimized.nodes) {
    for (const std::string& v : n.outputs) producer[v] = &n;
  }
  const auto made_by = [&](const std::string& value, const char* op_type) {
    const auto it = producer.find(value);
    return it != producer.end() && it->second->op_type == op_type ? it->second : nullptr;
  };
  int norms_left = 0;
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type != "FusedElementwise" || n.inputs.empty()) continue;
    const Node* reshape = made_by(n.inputs[0], "Reshape");
    norms_left += reshape != nullptr && made_by(reshape->inputs[0], "Linear") != nullptr;
  }
  EXPECT_EQ(norms_left, 0) << plan.optimized.str();
  // and the residual Adds behind the LinearNorms' second Reshape are the Linears' residuals (Note [Residuals through
  // views]; the export has 5)
  EXPECT_EQ(count(plan.optimized, "Add"), 0) << plan.optimized.str();
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 310), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// The suite's PoolFormer export in a CUDA plan: each GroupNorm(1) is its layer norm alone (the affine maps after it,
// scalar and per-channel, are in its scale and bias), and the plan computes what the export does.
TEST(NormAffineFolding, PoolFormersGroupNormsAreOneKernelEach) {
  const CudaOptimized plan = tiny_export_for_cuda("poolformer");
  int norms = 0;
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type != "LayerNormalization" || n.inputs.size() != 3 || n.attrs.get_int("axis", -1) != -1) continue;
    const auto scale = plan.optimized.initializers.find(n.inputs[1]);
    norms += scale != plan.optimized.initializers.end() && scale->second.numel() > 64;  // C H W values
  }
  EXPECT_EQ(norms, 4) << plan.optimized.str();  // the two blocks' two norms; the head's norm is over the channels
  EXPECT_LE(count(plan.optimized, "FusedElementwise"), 4) << plan.optimized.str();  // was 12
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 311), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// The suite's PoolFormer export in a CUDA plan: each MLP's pointwise convolutions are GEMMs that take their epilogues
// (Note [Pointwise convolutions for the GEMM's epilogue]): the first the GELU, the second the layer scale (in its
// weights) and the residual; no GELU node and no elementwise kernel after them is left. The plan computes what the
// export does.
TEST(NhwcLayout, PoolFormersMlpConvolutionsAreGemmsWithTheirEpilogues) {
  const CudaOptimized plan = tiny_export_for_cuda("poolformer");
  int gelu_gemms = 0, residual_gemms = 0;
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type != "Linear") continue;
    gelu_gemms += n.attrs.get_string("activation", "none") == "gelu";
    residual_gemms += n.inputs.size() == 4 && !n.inputs[3].empty();
  }
  EXPECT_EQ(count(plan.optimized, "Gelu"), 0) << plan.optimized.str();
  EXPECT_EQ(gelu_gemms, 2) << plan.optimized.str();  // one a block
  EXPECT_EQ(residual_gemms, 2) << plan.optimized.str();
  EXPECT_LE(count(plan.optimized, "FusedElementwise"), 2) << plan.optimized.str();  // the token mixers' (pool - x)
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 312), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// The suite's LeViT export in a CUDA plan: its block attentions, whose per-head q and k (8 wide in the tiny export)
// are narrower than v (16), read q, k and v as parts 0, 1 and 2 of one view with every head 16 wide, padded in the
// projection's weights (Note [Unequal q, k and v parts padded in the weights]); the subsampling attentions, whose q
// has a projection of its own, keep theirs. The rewritten graph computes what the export does; CPU plans are not
// rewritten.
TEST(AttentionPartPadding, LevitsKeysArePaddedToTheValuesWidthInTheWeights) {
  const CudaOptimized plan = tiny_export_for_cuda("levit");
  int padded = 0, attentions = 0;
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type != "Attention") continue;
    ++attentions;
    if (n.attrs.get_ints("qkv_parts", {}) != std::vector<std::int64_t>{0, 1, 2}) continue;
    ++padded;
    EXPECT_EQ(n.inputs[0], n.inputs[1]);
    EXPECT_EQ(n.inputs[0], n.inputs[2]);
    const auto& shape = plan.optimized.types.at(n.inputs[0]).shape;
    ASSERT_EQ(shape.size(), 5u);
    EXPECT_EQ(shape[3].value, 3);
    EXPECT_EQ(shape[4].value, 16);
    EXPECT_NEAR(n.attrs.get_float("scale", 0.0), 1.0 / std::sqrt(8.0), 1e-3);  // the keys' own 8
  }
  EXPECT_EQ(padded, 2) << plan.optimized.str();
  EXPECT_EQ(attentions, 3) << plan.optimized.str();
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 311), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
  Graph cpu = plan.original;
  const auto results = passes::run_passes(cpu, {});
  for (const auto& r : results) {
    if (r.pass == "attention_part_padding") {
      EXPECT_EQ(r.rewrites, 0);
    }
  }
}

// The suite's MobileViT export in a CUDA plan: its patch unfolds and folds are one copy each (Note [Copies through
// reshapes that strides cannot express]: 20 Transposes before, 8 left), the attentions with heads of 12 run on heads
// padded to 16 in the projections' weights (Note [Head dims padded in the weights]), and the rewritten graph computes
// what the export does.
TEST(FusedInputViews, MobileVitsPatchesAndOddHeadsInACudaPlan) {
  const CudaOptimized plan = tiny_export_for_cuda("mobilevit");
  EXPECT_LE(count(plan.optimized, "Transpose"), 8) << plan.optimized.str();
  int padded = 0;
  for (const Node& n : plan.optimized.nodes) {
    if (n.op_type == "Attention") padded += plan.optimized.types.at(n.inputs[0]).sizes().back() % 8 == 0;
  }
  EXPECT_EQ(padded, count(plan.optimized, "Attention")) << plan.optimized.str();
  const Feeds feeds = {{plan.original.inputs[0], ops::cast(random(plan.shape, 161), DType::kFloat16)}};
  expect_close(to_float32(run_graph(plan.original, feeds)),
               to_float32(run_graph(plan.optimized, feeds, nullptr, /*library_fused=*/true)), 2e-2, 2e-2);
}

// The suite's decoders with packed projections (Phi-3: q, k, v of one GEMM and gate, up of another; GPT-NeoX: per-head
// q, k, v and a rotary quarter of each head) and Llama (q, k and gate, up of their own GEMMs, made one each), float16
// dynamo exports at batch 2 and 5 tokens, optimized for a CUDA plan: the rotary and SwiGLU kernels read their cuts of
// the projections through views (Note [Fused nodes read their inputs' views]), Phi-3's attention reads v from its
// projection (qkv_parts -1, -1, 2), GPT-NeoX's other cuts are one copy each, no Slice or Transpose is left in either,
// and the rewritten graph (its fused nodes run by the cpu kernels, views and all) computes what the export does.
TEST(FusedInputViews, DecodersReadTheCutsOfTheirPackedProjectionsInPlace) {
  const std::filesystem::path tiny = std::filesystem::path(XPURT_SOURCE_DIR) / "models" / "suite" / "tiny";
  for (const std::string name : {"phi3", "gpt_neox", "llama"}) {
    SCOPED_TRACE(name);
    const Graph g = import_onnx_file((tiny / (name + ".dynamo.float16.onnx")).string());
    Graph out = g;
    ASSERT_EQ(out.inputs.size(), 2u);  // input_ids, attention_mask [B, S]
    for (const std::string& input : out.inputs) out.types[input].shape = {Dim(2), Dim(5)};
    runtime::InferOptions cuda;
    cuda.device = Device::cuda(0);
    runtime::optimize(out, cuda, {});
    int viewed = 0, merged = 0;
    for (const Node& n : out.nodes) {
      if (n.op_type == "FusedElementwise" && n.attrs.has("input_views")) ++viewed;
      if (n.op_type == "Linear" && n.name.find("_merged") != std::string::npos) ++merged;
    }
    // per layer: q, k (and Phi-3's SwiGLU); Llama: its SwiGLU over gate and up, now one GEMM (Note [Sibling GEMMs
    // of one fused node become one])
    EXPECT_GE(viewed, name == "phi3" ? 6 : name == "llama" ? 2 : 4) << out.str();
    EXPECT_EQ(merged, name == "llama" ? 4 : 0) << out.str();  // per layer: q with k, gate with up
    // GPT-NeoX's rotated quarter of each head and its pass-through part: one pieced kernel each for q and k (Note
    // [Concats of fused values]), and the attention reads v from the head-interleaved projection (Note [Attention
    // reads packed heads in place]): two generated kernels per layer, no copy
    if (name == "gpt_neox") {
      EXPECT_EQ(count(out, "Concat"), 0) << out.str();
      EXPECT_EQ(count(out, "FusedElementwise"), 4) << out.str();
      for (const Node& n : out.nodes) {
        if (n.op_type != "Attention") continue;
        EXPECT_EQ(n.attrs.get_ints("qkv_parts", {}), (std::vector<std::int64_t>{-1, -1, 2})) << n.str();
        EXPECT_EQ(n.attrs.get_string("qkv_packing", ""), "heads_parts") << n.str();
      }
    }
    if (name != "llama") {
      EXPECT_EQ(count(out, "Slice") + count(out, "Transpose"), 0) << out.str();
      // GPT-NeoX's parallel block: the stream rides in the MLP's GEMM (Note [Two residuals into two GEMMs])
      EXPECT_EQ(count(out, "Add"), 0) << out.str();
    }
    if (name == "phi3") {
      for (const Node& n : out.nodes) {
        if (n.op_type == "Attention") {
          EXPECT_EQ(n.attrs.get_ints("qkv_parts", {}), (std::vector<std::int64_t>{-1, -1, 2})) << n.str();
        }
      }
    }
    std::vector<std::int64_t> ids(10), mask(10, 1);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 37 + 11) % 100);
    mask[9] = 0;  // the second sequence's last token padded
    const Feeds feeds = {{g.inputs[0], make_i64({2, 5}, ids)}, {g.inputs[1], make_i64({2, 5}, mask)}};
    expect_close(to_float32(run_graph(g, feeds)), to_float32(run_graph(out, feeds, nullptr, /*library_fused=*/true)),
                 2e-2, 2e-2);
  }
}

// Note [Sibling GEMMs of one fused node become one]: in a CUDA plan, silu(x W1 + b1) * (x W2) (a gated MLP's gate
// and up; here up of one column, broadcast) is one Linear over [W1 | W2] with bias [b1 | 0], the fused node reading
// each part through a view, for MatMul's [K, N] weights and for Gemm's transposed [N, K] ones; not where up is also
// an output of its own. The answers are the graph's.
TEST(FusedInputViews, SiblingGemmsOfOneFusedNodeBecomeOne) {
  for (const bool transposed : {false, true}) {
    for (const bool shared : {false, true}) {
      SCOPED_TRACE(std::string(transposed ? "Gemm transB" : "MatMul") + (shared ? ", up also an output" : ""));
      Builder b;
      b.input("x", {6, 8}).constant("b1", random({5}, 52));
      b.constant("w1", random(transposed ? Shape{5, 8} : Shape{8, 5}, 50));
      b.constant("w2", random(transposed ? Shape{1, 8} : Shape{8, 1}, 51));
      if (transposed) {
        b.add(node("Gemm", {"x", "w1", "b1"}, {"a"}, Attributes().set("transB", I(1))));
        b.add(node("Gemm", {"x", "w2"}, {"u"}, Attributes().set("transB", I(1))));
      } else {
        b.add(node("MatMul", {"x", "w1"}, {"m1"})).add(node("Add", {"m1", "b1"}, {"a"}));
        b.add(node("MatMul", {"x", "w2"}, {"u"}));
      }
      // up has one column, broadcast over the gate's 5: parts of unequal widths
      b.add(node("Sigmoid", {"a"}, {"sg"})).add(node("Mul", {"a", "sg"}, {"silu"}));
      b.add(node("Mul", {"silu", "u"}, {"y"}));
      Graph g = b.build(shared ? std::vector<std::string>{"y", "u"} : std::vector<std::string>{"y"});
      runtime::InferOptions cuda;
      cuda.device = Device::cuda(0);
      Graph out = g;
      runtime::optimize(out, cuda, {});
      int merged = 0;
      for (const Node& n : out.nodes) merged += n.op_type == "Linear" && n.name.find("_merged") != std::string::npos;
      EXPECT_EQ(merged, shared ? 0 : 1) << out.str();
      EXPECT_EQ(count(out, "Linear"), shared ? 2 : 1) << out.str();
      const Feeds feeds = {{"x", random({6, 8}, 53)}};
      expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true), 1e-5, 1e-5);
    }
  }
}

// Note [Sibling GEMMs of one fused node become one], attention: q, k and v Linears of one input, each Reshaped to
// heads [B, S, H, D], q and k rotated by fused kernels, all three read by the Attention (bshd): one Linear of 3 H D
// columns, the rotary kernels reading q and k through views, the Attention reading v as part 2 of the packed
// [B, S, 3, H, D] view (qkv_parts -1, -1, 2); with grouped-query heads (k and v of 1 head) v stays its own GEMM. The
// answers are the graph's.
TEST(FusedInputViews, RotatedQueriesKeysAndValuesShareOneGemm) {
  for (const std::int64_t kv_heads : {2, 1}) {
    SCOPED_TRACE(kv_heads == 2 ? "multi-head" : "grouped-query");
    Builder b;
    b.input("x", {2, 5, 16});
    b.constant("cos", random({5, 1, 8}, 60)).constant("sin", random({5, 1, 8}, 61));
    const std::string rotary = "mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2";
    for (const std::string p : {"q", "k", "v"}) {
      const std::int64_t heads = p == "q" ? 2 : kv_heads;
      b.constant("w" + p, random({16, heads * 8}, p == "q" ? 62 : p == "k" ? 63 : 64));
      b.constant("shape_" + p, int64s({2, 5, heads, 8}));
      Node l = node("Linear", {"x", "w" + p}, {p}, Attributes().set("weight_layout", std::string("kn")));
      l.domain = kXpurtDomain;
      b.add(l).add(node("Reshape", {p, "shape_" + p}, {p + "h"}));
      if (p == "v") continue;
      Node r = node("FusedElementwise", {p + "h", "cos", "sin"}, {p + "r"}, Attributes().set("program", rotary));
      r.domain = kXpurtDomain;
      b.add(r);
    }
    Attributes flags;
    flags.set("bshd", std::vector<std::int64_t>{1, 1, 1, 1}).set("scale", 0.35).set("causal", I(0));
    Node a = node("Attention", {"qr", "kr", "vh"}, {"y"}, flags);
    a.domain = kXpurtDomain;
    b.add(a);
    Graph g = b.build({"y"});
    runtime::InferOptions cuda;
    cuda.device = Device::cuda(0);
    Graph out = g;
    runtime::optimize(out, cuda, {});
    EXPECT_EQ(count(out, "Linear"), kv_heads == 2 ? 1 : 2) << out.str();
    for (const Node& n : out.nodes) {
      if (n.op_type == "Attention" && kv_heads == 2) {
        EXPECT_EQ(n.attrs.get_ints("qkv_parts", {}), (std::vector<std::int64_t>{-1, -1, 2})) << n.str();
      }
    }
    const Feeds feeds = {{"x", random({2, 5, 16}, 65)}};
    expect_close(run_graph(g, feeds, nullptr, /*library_fused=*/true),
                 run_graph(out, feeds, nullptr, /*library_fused=*/true), 1e-5, 1e-5);
  }
}

// Note [Chains of copies become one]: in a CUDA plan, a head Transpose then a Slice of the last axis (two strided
// copies) feeding an op outside any fused group becomes one FusedElementwise copy of the source through the composed
// view (CPU plans too); an int64 chain (the fused kernels take floats) and a chain under a policy rule for slice stay
// as written; the answers are the graph's.
TEST(FusedInputViews, ChainsOfCopiesBecomeOneCopy) {
  Builder b;
  b.input("x", {2, 3, 4, 6}).input("z", {2, 3, 4, 6});
  b.constant("starts", int64s({1})).constant("ends", int64s({5})).constant("axes", int64s({3}));
  Attributes perm;
  perm.set("perm", std::vector<std::int64_t>{0, 2, 1, 3});
  b.add(node("Transpose", {"x"}, {"t"}, perm)).add(node("Slice", {"t", "starts", "ends", "axes"}, {"s"}));
  b.add(node("Relu", {"s"}, {"y"}));
  b.add(node("Transpose", {"z"}, {"tz"}, perm)).add(node("Slice", {"tz", "starts", "ends", "axes"}, {"sz"}));
  Graph g = b.build({"y", "sz"});
  g.types["z"].dtype = DType::kInt64;
  runtime::InferOptions cuda;
  cuda.device = Device::cuda(0);
  Graph out = g;
  runtime::optimize(out, cuda, {});
  int copies = 0;
  for (const Node& n : out.nodes) {
    if (n.op_type != "FusedElementwise") continue;
    ++copies;
    EXPECT_EQ(n.inputs, std::vector<std::string>{"x"}) << n.str();
    // [2, 4, 3, 4] read from x [2, 3, 4, 6]: strides 72, 6, 24, 1 from element 1
    EXPECT_EQ(n.attrs.get_ints("input_views", {}),
              (std::vector<std::int64_t>{0, 4, 1, 2, 4, 3, 4, 72, 6, 24, 1})) << n.str();
  }
  EXPECT_EQ(copies, 1) << out.str();
  EXPECT_EQ(count(out, "Transpose") + count(out, "Slice"), 2) << out.str();  // the int64 chain's
  std::vector<std::int64_t> zs(144);
  for (std::size_t i = 0; i < zs.size(); ++i) zs[i] = static_cast<std::int64_t>(i * 7);
  const Feeds feeds = {{"x", random({2, 3, 4, 6}, 105)}, {"z", make_i64({2, 3, 4, 6}, zs)}};
  const std::vector<Tensor> want = run_graph(g, feeds), got = run_graph(out, feeds, nullptr, /*library_fused=*/true);
  expect_close({want[0]}, {got[0]}, 0.0, 0.0);
  ASSERT_EQ(want[1].shape(), got[1].shape());
  const Tensor wz = want[1].contiguous(), gz = got[1].contiguous();
  EXPECT_EQ(std::memcmp(wz.data_ptr(), gz.data_ptr(), static_cast<std::size_t>(wz.nbytes())), 0);
  runtime::InferOptions ruled = cuda;
  ruled.keep_unfused = [](const std::string& op) { return op == "slice"; };
  Graph kept = g;
  runtime::optimize(kept, ruled, {});
  EXPECT_EQ(count(kept, "FusedElementwise"), 0) << kept.str();
  Graph cpu = g;  // CPU plans too
  runtime::optimize(cpu, runtime::InferOptions{}, {});
  EXPECT_EQ(count(cpu, "FusedElementwise"), 1) << cpu.str();
}

// Note [Copies through reshapes that strides cannot express]: MobileViT's unfold of an NHWC feature map [2, 4, 6, 8]
// into 2x2 patches (a Transpose to NCHW, Reshape, Transpose, Reshape, Transpose, Reshape: three copies, composing to
// no strided view of [8, 6, 8]) and its fold back (three more) are one copy each into a finer shape and a Reshape, in
// CUDA and CPU plans; the answers are the graph's, bit for bit.
TEST(FusedInputViews, PatchUnfoldsAndFoldsAreOneCopyEach) {
  Builder b;
  b.input("x", {2, 4, 6, 8});
  const auto perm = [](std::vector<std::int64_t> p) { return Attributes().set("perm", std::move(p)); };
  b.constant("s1", int64s({32, 2, 3, 2})).constant("s2", int64s({2, 8, 6, 4})).constant("s3", int64s({8, 6, 8}));
  b.add(node("Transpose", {"x"}, {"nchw"}, perm({0, 3, 1, 2}))).add(node("Reshape", {"nchw", "s1"}, {"r1"}));
  b.add(node("Transpose", {"r1"}, {"t1"}, perm({0, 2, 1, 3}))).add(node("Reshape", {"t1", "s2"}, {"r2"}));
  b.add(node("Transpose", {"r2"}, {"t2"}, perm({0, 3, 2, 1}))).add(node("Reshape", {"t2", "s3"}, {"patches"}));
  b.add(node("Sqrt", {"patches"}, {"p2"}));  // what the patches' layer norm would be: an op that reads them whole
  b.constant("f1", int64s({2, 4, 6, 8})).constant("f2", int64s({32, 3, 2, 2})).constant("f3", int64s({2, 8, 4, 6}));
  b.add(node("Reshape", {"p2", "f1"}, {"u1"})).add(node("Transpose", {"u1"}, {"v1"}, perm({0, 3, 2, 1})));
  b.add(node("Reshape", {"v1", "f2"}, {"u2"})).add(node("Transpose", {"u2"}, {"v2"}, perm({0, 2, 1, 3})));
  b.add(node("Reshape", {"v2", "f3"}, {"u3"})).add(node("Transpose", {"u3"}, {"folded"}, perm({0, 2, 3, 1})));
  b.add(node("Softmax", {"folded"}, {"y"}));
  Graph g = b.build({"y", "patches"});
  const Feeds feeds = {{"x", random({2, 4, 6, 8}, 146, 0.1f, 2.0f)}};
  const std::vector<Tensor> want = run_graph(g, feeds);
  runtime::InferOptions cuda;
  cuda.device = Device::cuda(0);
  for (const auto& options : {cuda, runtime::InferOptions{}}) {
    SCOPED_TRACE(options.device.str());
    Graph out = g;
    runtime::optimize(out, options, {});
    EXPECT_EQ(count(out, "Transpose"), 0) << out.str();
    int finer = 0;
    for (const Node& n : out.nodes) {
      if (n.op_type == "FusedElementwise" && n.attrs.get_string("program", "") == "f32 x0") {
        ++finer;
        // [8, 6, 8] read as [2, 2, 2, 2, 3, 8]: b, ph, pw, nh, nw, c of x (NHWC, H = nh * ph, W = nw * pw)
        if (n.inputs[0] == "x") {
          EXPECT_EQ(n.attrs.get_ints("input_views", {}),
                    (std::vector<std::int64_t>{0, 6, 0, 2, 2, 2, 2, 3, 8, 192, 48, 8, 96, 16, 1})) << n.str();
        }
      }
    }
    EXPECT_EQ(finer, 2) << out.str();
    const std::vector<Tensor> got = run_graph(out, feeds, nullptr, /*library_fused=*/true);
    expect_close(want, got, 0.0, 0.0);
  }
  // A Reshape that splits one run of memory across the axes it read ([.., 2, 5] with strides 5, 1 read as [.., 5, 2])
  // stays inside the composed view: the two Transposes around it are one copy.
  Builder run;
  run.input("x", {4, 3, 2, 5}).constant("to", int64s({3, 4, 5, 2}));
  run.add(node("Transpose", {"x"}, {"t"}, perm({1, 0, 2, 3}))).add(node("Reshape", {"t", "to"}, {"r"}));
  run.add(node("Transpose", {"r"}, {"u"}, perm({0, 1, 3, 2}))).add(node("Softmax", {"u"}, {"y"}));
  Graph rg = run.build({"y"});
  Graph rout = rg;
  runtime::optimize(rout, cuda, {});
  EXPECT_EQ(count(rout, "Transpose"), 0) << rout.str();
  EXPECT_EQ(count(rout, "FusedElementwise"), 1) << rout.str();
  const Feeds rfeeds = {{"x", random({4, 3, 2, 5}, 149)}};
  expect_close(run_graph(rg, rfeeds), run_graph(rout, rfeeds, nullptr, /*library_fused=*/true), 0.0, 0.0);
  // A chain whose finer shape would take more than 8 axes (what a view holds) is left as it was.
  Builder deep;
  deep.input("x", {4, 4, 4, 4, 4, 4}).constant("to", int64s({1, 8, 8, 8, 8}));
  deep.add(node("Transpose", {"x"}, {"t"}, perm({5, 4, 3, 2, 1, 0}))).add(node("Reshape", {"t", "to"}, {"r"}));
  deep.add(node("Transpose", {"r"}, {"u"}, perm({0, 2, 1, 4, 3}))).add(node("Softmax", {"u"}, {"y"}));
  Graph dg = deep.build({"y"});
  Graph dout = dg;
  runtime::optimize(dout, cuda, {});
  const Feeds dfeeds = {{"x", random({4, 4, 4, 4, 4, 4}, 148)}};
  expect_close(run_graph(dg, dfeeds), run_graph(dout, dfeeds, nullptr, /*library_fused=*/true), 0.0, 0.0);
}

// Note [Concats of fused values]: Concat(sigmoid(x) * x, a Slice of y cut along a middle axis, z) along the last axis
// becomes one FusedElementwise with three pieces (the group's program, a copy of y through the Slice's view, a copy
// of z) in CUDA plans, computing what the graph does (run by the cpu kernels); a Concat whose inputs gain nothing,
// Concats under a policy rule for concat and those of CPU plans stay.
TEST(ConcatFusion, ConcatsOfFusedValuesBecomeOneNodeOfPieces) {
  Builder b;
  b.input("x", {2, 3, 5, 8}).input("y", {2, 3, 7, 6}).input("z", {2, 3, 5, 3}).input("w", {2, 3, 5, 2});
  b.constant("starts", int64s({1})).constant("ends", int64s({6})).constant("axes", int64s({2}));
  b.add(node("Sigmoid", {"x"}, {"sx"})).add(node("Mul", {"sx", "x"}, {"a"}));
  b.add(node("Slice", {"y", "starts", "ends", "axes"}, {"s"}));
  Attributes last;
  last.set("axis", std::int64_t{-1});
  b.add(node("Concat", {"a", "s", "z"}, {"c"}, last));
  b.add(node("Concat", {"z", "w"}, {"plain"}, last));  // nothing gained: stays a Concat
  Graph g = b.build({"c", "plain"});
  const Feeds feeds = {{"x", random({2, 3, 5, 8}, 106)}, {"y", random({2, 3, 7, 6}, 107)},
                       {"z", random({2, 3, 5, 3}, 108)}, {"w", random({2, 3, 5, 2}, 109)}};
  const std::vector<Tensor> want = run_graph(g, feeds);
  runtime::InferOptions cuda;
  cuda.device = Device::cuda(0);
  {
    Graph out = g;
    runtime::optimize(out, cuda, {});
    EXPECT_EQ(count(out, "Concat"), 1) << out.str();
    EXPECT_EQ(count(out, "Slice") + count(out, "Sigmoid") + count(out, "Mul"), 0) << out.str();
    ASSERT_EQ(count(out, "FusedElementwise"), 1) << out.str();
    for (const Node& n : out.nodes) {
      if (n.op_type != "FusedElementwise") continue;
      EXPECT_EQ(n.inputs, (std::vector<std::string>{"x", "y", "z"})) << n.str();
      EXPECT_EQ(n.attrs.get_ints("pieces", {}), (std::vector<std::int64_t>{3, 8, 6, 3})) << n.str();
      EXPECT_EQ(n.attrs.get_string("program", ""), "sigmoid x0; mul t0 x0 | f32 x1 | f32 x2") << n.str();
      // y [2, 3, 7, 6] read as [2, 3, 5, 6] from row 1
      EXPECT_EQ(n.attrs.get_ints("input_views", {}), (std::vector<std::int64_t>{1, 4, 6, 2, 3, 5, 6, 126, 42, 6, 1}))
          << n.str();
    }
    // the copies bit for bit, the sigmoid within the cpu kernel's vectorised exp (Note [Vectorised exp on the CPU])
    expect_close(want, run_graph(out, feeds, nullptr, /*library_fused=*/true), 1e-6, 1e-6);
  }
  runtime::InferOptions ruled = cuda;
  ruled.keep_unfused = [](const std::string& op) { return op == "concat"; };
  Graph kept = g;
  runtime::optimize(kept, ruled, {});
  EXPECT_EQ(count(kept, "Concat"), 2) << kept.str();
  Graph cpu = g;
  runtime::optimize(cpu, runtime::InferOptions{}, {});
  EXPECT_EQ(count(cpu, "Concat"), 2) << cpu.str();
}

// Note [Concats read by a fused node]: relu(Concat(x, y, z) * scale + shift + r) along the last axis, with a
// per-channel scale and shift and an r that broadcasts along the channels, is one FusedElementwise with three pieces
// in a CUDA plan (each reads its slab of scale and shift through a view), computing what the graph does; a Concat that
// a second node reads stays.
TEST(ConcatFusion, AConcatReadOnlyByAFusedNodeBecomesThatNodesPieces) {
  Builder b;
  b.input("x", {2, 3, 4, 3}).input("y", {2, 3, 4, 5}).input("z", {2, 3, 4, 2}).input("r", {2, 3, 4, 1});
  b.constant("scale", random({10}, 140, 0.5f, 1.5f)).constant("shift", random({1, 1, 1, 10}, 141));
  Attributes last;
  last.set("axis", std::int64_t{-1});
  b.add(node("Concat", {"x", "y", "z"}, {"c"}, last));
  b.add(node("Mul", {"c", "scale"}, {"m"})).add(node("Add", {"m", "shift"}, {"a"}));
  b.add(node("Add", {"a", "r"}, {"ar"})).add(node("Relu", {"ar"}, {"out"}));
  b.add(node("Concat", {"x", "z"}, {"c2"}, last));  // read twice: stays
  b.add(node("Relu", {"c2"}, {"o2"})).add(node("Sigmoid", {"c2"}, {"o3"}));
  Graph g = b.build({"out", "o2", "o3"});
  const Feeds feeds = {{"x", random({2, 3, 4, 3}, 142)}, {"y", random({2, 3, 4, 5}, 143)},
                       {"z", random({2, 3, 4, 2}, 144)}, {"r", random({2, 3, 4, 1}, 145)}};
  runtime::InferOptions cuda;
  cuda.device = Device::cuda(0);
  Graph out = g;
  runtime::optimize(out, cuda, {});
  EXPECT_EQ(count(out, "Concat"), 1) << out.str();
  int pieced = 0;
  for (const Node& n : out.nodes) {
    if (n.op_type != "FusedElementwise" || !n.attrs.has("pieces")) continue;
    ++pieced;
    EXPECT_EQ(n.attrs.get_ints("pieces", {}), (std::vector<std::int64_t>{3, 3, 5, 2})) << n.str();
    EXPECT_TRUE(n.attrs.has("input_views")) << n.str();  // the slabs of scale and shift
  }
  EXPECT_EQ(pieced, 1) << out.str();
  expect_close(run_graph(g, feeds), run_graph(out, feeds, nullptr, /*library_fused=*/true), 1e-6, 1e-6);

  // A reader that rotates halves of the last axis across a Concat along it keeps the Concat: pieces would rotate
  // within their slabs.
  Builder r;
  r.input("x", {2, 3, 4}).input("y", {2, 3, 4});
  r.add(node("Concat", {"x", "y"}, {"c"}, last));
  Node rotate = node("FusedElementwise", {"c"}, {"out"});
  rotate.domain = kXpurtDomain;
  rotate.attrs.set("program", std::string("rotate_half x0"));
  r.add(rotate);
  Graph rg = r.build({"out"});
  Graph rout = rg;
  runtime::optimize(rout, cuda, {});
  EXPECT_EQ(count(rout, "Concat"), 1) << rout.str();
  const Feeds rfeeds = {{"x", random({2, 3, 4}, 146)}, {"y", random({2, 3, 4}, 147)}};
  expect_close(run_graph(rg, rfeeds, nullptr, true), run_graph(rout, rfeeds, nullptr, true), 0.0, 0.0);
}

// The passes of a quantized model's CPU plan and of its CUDA plan (quantized weights kept), and the CUDA context.
struct TwoPlans {
  Graph cpu, cuda;
  passes::PassContext ctx;
};
TwoPlans cpu_and_cuda_plans(const Graph& g) {
  TwoPlans out{g, g, {}};
  out.ctx.keep_quantized_weights = true;
  passes::run_passes(out.cpu, out.ctx);
  out.ctx.device = Device::cuda(0);
  passes::run_passes(out.cuda, out.ctx);
  return out;
}

// A quantized CNN's int8 convolutions in a CUDA plan (Note [Channels-last int8 convolutions]): after quantized_fusion,
// the QConvs whose input channels are a multiple of 16 (one group) run channels-last with OHWI int8 weights and pass
// their int8 values to each other directly; the 3-channel stem and the grouped convolution stay NCHW; the graph
// computes the same bits as the CPU plan's (the cpu kernel's NHWC equals its NCHW).
TEST(NhwcLayout, Int8ConvolutionsRunChannelsLastForTheTensorCores) {
  Builder b;
  b.input("x", {2, 3, 12, 12});
  b.constant("sx", scalar(0.04f)).constant("zx", int8_scalar(128, DType::kUInt8));
  b.constant("s", scalar(0.05f)).constant("z", int8_scalar(-128)).constant("z3", int8_scalar(3));
  const auto pads1 = Attributes().set("pads", std::vector<std::int64_t>{1, 1, 1, 1});
  b.add(node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"})).add(node("DequantizeLinear", {"xq", "sx", "zx"}, {"xf"}));
  // conv(in, out, weight shape, attrs) -> out: DQ(per-channel int8 weight) -> Conv -> [bias] -> Relu -> Q -> DQ.
  const auto conv = [&](const std::string& in, const std::string& out, const Shape& w_shape, Attributes attrs,
                        unsigned seed, bool quantize_out) {
    b.constant(out + "_w", quantized(w_shape, DType::kInt8, seed, -127, 127));
    b.constant(out + "_ws", random({w_shape[0]}, seed + 1, 0.002f, 0.01f));
    b.constant(out + "_b", random({w_shape[0]}, seed + 2));
    b.add(node("DequantizeLinear", {out + "_w", out + "_ws"}, {out + "_wf"}, Attributes().set("axis", I(0))));
    b.add(node("Conv", {in, out + "_wf", out + "_b"}, {out + "_c"}, std::move(attrs)));
    if (!quantize_out) {
      b.add(node("Relu", {out + "_c"}, {out}));
      return;
    }
    b.add(node("Relu", {out + "_c"}, {out + "_r"}));
    b.add(node("QuantizeLinear", {out + "_r", "s", "z"}, {out + "_q"}));
    b.add(node("DequantizeLinear", {out + "_q", "s", "z"}, {out}));
  };
  conv("xf", "c1", {16, 3, 3, 3}, pads1, 300, true);                      // the stem: 3 channels, NCHW
  conv("c1", "c2", {32, 16, 3, 3}, Attributes(pads1).set("strides", std::vector<std::int64_t>{2, 2}), 310, true);
  conv("c2", "c3", {32, 32, 1, 1}, Attributes(), 320, true);             // reads c2's channels-last int8 directly
  conv("c3", "c4", {16, 16, 3, 3}, Attributes(pads1).set("group", I(2)), 330, false);  // grouped: NCHW
  const Graph g = with_types(b.build({"c4"}));
  auto [cpu, cuda, ctx] = cpu_and_cuda_plans(g);
  ASSERT_EQ(count(cpu, "QConv"), 4) << cpu.str();
  ASSERT_EQ(count(cuda, "QConv"), 4) << cuda.str();
  std::vector<std::string> channels_last;
  for (const Node& n : cuda.nodes) {
    if (n.op_type != "QConv" || n.attrs.get_string("layout", "NCHW") != "NHWC") continue;
    channels_last.push_back(n.name);
    const Tensor& w = cuda.initializers.at(n.inputs[1]);
    EXPECT_EQ(w.dtype(), DType::kInt8);
    EXPECT_EQ(w.shape()[3], w.shape()[0] == 32 && w.shape()[1] == 1 ? 32 : 16) << "weight [O, kh, kw, C]";
  }
  EXPECT_EQ(channels_last.size(), 2u) << cuda.str();
  // One Transpose into NHWC (the stem's int8 output) and one back (the grouped convolution's input).
  EXPECT_EQ(count(cuda, "Transpose"), 2) << cuda.str();
  EXPECT_EQ(count(cpu, "Transpose"), 0) << cpu.str();
  const Feeds feeds = {{"x", random({2, 3, 12, 12}, 340, -2.0f, 2.0f)}};
  const std::vector<Tensor> expected = run_graph(cpu, feeds, nullptr, /*library_fused=*/true);
  const std::vector<Tensor> actual = run_graph(cuda, feeds, nullptr, /*library_fused=*/true);
  ASSERT_EQ(actual.size(), 1u);
  ASSERT_EQ(actual[0].shape(), expected[0].shape());
  EXPECT_EQ(std::memcmp(actual[0].data_ptr(), expected[0].data_ptr(), expected[0].nbytes()), 0);
  // Off with the pass: NCHW throughout.
  Graph disabled = g;
  passes::run_passes(disabled, ctx, {"nhwc_layout"});
  EXPECT_EQ(count(disabled, "Transpose"), 0) << disabled.str();
}

// Residual blocks of a quantized CNN as QDQ models write them (Note [Quantized values keep their layout]): the identity
// dequantized, added to the last convolution's float output, Relu, quantized again. In a CUDA plan the per-tensor
// QuantizeLinear / DequantizeLinear and the Add and Relu between them follow the int8 convolutions channels-last, so the
// only Transposes left are the stem's output into NHWC and the network's output back; a per-axis DequantizeLinear
// stays NCHW; the CUDA plan computes the CPU plan's bits.
TEST(NhwcLayout, QuantizedResidualBlocksStayChannelsLast) {
  for (const bool per_axis_identity : {false, true}) {
    Builder b;
    b.input("x", {2, 3, 10, 10});
    b.constant("sx", scalar(0.04f)).constant("zx", int8_scalar(128, DType::kUInt8));
    b.constant("s", scalar(0.05f)).constant("z", int8_scalar(-3));
    b.constant("sr", scalar(0.07f)).constant("zr", int8_scalar(5));
    b.constant("s_axis", random({32}, 401, 0.05f, 0.08f));
    b.add(node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"})).add(node("DequantizeLinear", {"xq", "sx", "zx"}, {"xf"}));
    // DQ(per-channel weight) -> Conv [-> Relu]: `out` is the float output.
    const auto conv = [&](const std::string& in, const std::string& out, const Shape& w_shape, unsigned seed,
                          bool relu) {
      b.constant(out + "_w", quantized(w_shape, DType::kInt8, seed, -127, 127));
      b.constant(out + "_ws", random({w_shape[0]}, seed + 1, 0.002f, 0.01f));
      b.constant(out + "_b", random({w_shape[0]}, seed + 2));
      b.add(node("DequantizeLinear", {out + "_w", out + "_ws"}, {out + "_wf"}, Attributes().set("axis", I(0))));
      const auto pads = Attributes().set("pads", w_shape[2] == 3 ? std::vector<std::int64_t>{1, 1, 1, 1}
                                                                 : std::vector<std::int64_t>{0, 0, 0, 0});
      b.add(node("Conv", {in, out + "_wf", out + "_b"}, {relu ? out + "_c" : out}, pads));
      if (relu) b.add(node("Relu", {out + "_c"}, {out}));
    };
    const auto qdq = [&](const std::string& in, const std::string& out, const std::string& s, const std::string& z) {
      b.add(node("QuantizeLinear", {in, s, z}, {out + "_q"})).add(node("DequantizeLinear", {out + "_q", s, z}, {out}));
    };
    conv("xf", "stem", {16, 3, 3, 3}, 400, true);  // 3 channels: NCHW
    qdq("stem", "a", "s", "z");
    conv("a", "c2", {32, 16, 3, 3}, 410, true);
    qdq("c2", "r0", "sr", "zr");
    // Block 1: conv -> Add(identity) -> Relu -> Q -> DQ.
    conv("r0", "c3", {32, 32, 1, 1}, 420, false);
    b.add(node("Add", {"c3", "r0"}, {"sum1"})).add(node("Relu", {"sum1"}, {"relu1"}));
    qdq("relu1", "r1", "sr", "zr");
    // Block 2: its identity through a QDQ pair per tensor, or per channel (that DequantizeLinear stays NCHW).
    conv("r1", "c4", {32, 32, 1, 1}, 430, true);
    qdq("c4", "c4d", "s", "z");
    conv("c4d", "c5", {32, 32, 1, 1}, 440, false);
    if (per_axis_identity) {
      b.constant("zr_axis", Tensor::zeros({32}, DType::kInt8));
      b.add(node("QuantizeLinear", {"relu1", "s_axis", "zr_axis"}, {"id_q"}, Attributes().set("axis", I(1))));
      b.add(node("DequantizeLinear", {"id_q", "s_axis", "zr_axis"}, {"identity"}, Attributes().set("axis", I(1))));
    } else {
      b.add(node("Identity", {"r1"}, {"identity"}));
    }
    b.add(node("Add", {"c5", "identity"}, {"sum2"})).add(node("Relu", {"sum2"}, {"relu2"}));
    qdq("relu2", "r2", "sr", "zr");
    conv("r2", "out", {16, 32, 1, 1}, 450, true);
    const Graph g = with_types(b.build({"out"}));
    const auto [cpu, cuda, ctx] = cpu_and_cuda_plans(g);
    std::int64_t nhwc_qconvs = 0;
    for (const Node& n : cuda.nodes) nhwc_qconvs += n.op_type == "QConv" && n.attrs.get_string("layout", "") == "NHWC";
    EXPECT_EQ(nhwc_qconvs, 5) << cuda.str();
    // The stem's output in, the output back; a per-axis identity reads Relu's output NCHW, and the Add after it
    // stays NCHW: its convolution's output out of NHWC and the quantized sum back in.
    EXPECT_EQ(count(cuda, "Transpose"), per_axis_identity ? 5 : 2) << cuda.str();
    const Feeds feeds = {{"x", random({2, 3, 10, 10}, 460, -2.0f, 2.0f)}};
    const std::vector<Tensor> expected = run_graph(cpu, feeds, nullptr, /*library_fused=*/true);
    const std::vector<Tensor> actual = run_graph(cuda, feeds, nullptr, /*library_fused=*/true);
    ASSERT_EQ(actual.size(), 1u);
    ASSERT_EQ(actual[0].shape(), expected[0].shape());
    EXPECT_EQ(std::memcmp(actual[0].data_ptr(), expected[0].data_ptr(), expected[0].nbytes()), 0)
        << "per-axis identity " << per_axis_identity;
  }
}

// ---- every ONNX backend test model ----

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Same shape, dtype and values (float32: within the node tests' rtol 1e-3 / atol 1e-7 plus fp32 noise; other
// dtypes: the same bytes).
bool same_tensor(const Tensor& expected, const Tensor& actual, std::string& why) {
  if (expected.shape() != actual.shape() || expected.dtype() != actual.dtype()) {
    why = "shape/dtype " + actual.str() + " vs expected " + expected.str();
    return false;
  }
  if (expected.dtype() != DType::kFloat32) {
    const bool same = expected.nbytes() == 0 ||
                      std::memcmp(expected.contiguous().data_ptr(), actual.contiguous().data_ptr(),
                                  expected.nbytes()) == 0;
    if (!same) why = "different values";
    return same;
  }
  const Values e = values(expected), a = values(actual);
  for (std::size_t k = 0; k < e.size(); ++k) {
    if (std::isnan(e[k]) && std::isnan(a[k])) continue;
    if (!(std::fabs(a[k] - e[k]) <= 1e-5 + 1e-3 * std::fabs(e[k]))) {
      why = "element " + std::to_string(k) + ": " + std::to_string(a[k]) + " vs " + std::to_string(e[k]);
      return false;
    }
  }
  return true;
}

// For every model of the ONNX backend test data that the reference interpreter runs correctly as imported, the
// optimized graph (every pass) must give the expected outputs too. Models the interpreter cannot run (ops the
// library lacks, sequence types, ...) are counted, not failed: they test the library, not the passes.
TEST(GraphPasses, PreserveEveryOnnxBackendTestModel) {
  const std::filesystem::path root = "/usr/share/libonnx-testdata/data";
  if (!std::filesystem::exists(root / "node")) GTEST_SKIP() << "no ONNX test data at " << root;
  int models = 0, reference_ok = 0, rewritten = 0;
  std::map<std::string, int> models_by_pass;
  std::vector<std::string> failures;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    if (!std::filesystem::exists(root / suite)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(root / suite)) {
      const auto data = entry.path() / "test_data_set_0";
      if (!std::filesystem::exists(entry.path() / "model.onnx") || !std::filesystem::exists(data)) continue;
      ++models;
      Graph g;
      Feeds feeds;
      std::vector<Tensor> expected;
      std::vector<Tensor> before;
      std::map<std::string, ValueType> run_types;
      try {
        g = import_onnx_file((entry.path() / "model.onnx").string());
        for (std::size_t i = 0; i < g.inputs.size(); ++i) {
          const auto file = data / ("input_" + std::to_string(i) + ".pb");
          if (std::filesystem::exists(file)) feeds[g.inputs[i]] = tensor_from_onnx(read_bytes(file));
        }
        for (std::size_t i = 0; i < g.outputs.size(); ++i) {
          expected.push_back(tensor_from_onnx(read_bytes(data / ("output_" + std::to_string(i) + ".pb"))));
        }
        before = run_graph(g, feeds, &run_types);
      } catch (const std::exception&) {
        continue;  // not importable or not runnable by the reference library
      }
      // Random ops draw from one stream per process: two runs of the same graph differ, whatever the passes do (a
      // first run that happens to equal the test data's expected values made this test fail by chance).
      const bool random = std::any_of(g.nodes.begin(), g.nodes.end(), [](const Node& n) {
        return n.op_type == "Bernoulli" || n.op_type == "Multinomial" || n.op_type.rfind("Random", 0) == 0;
      });
      if (random) continue;
      std::string why;
      bool ok = before.size() == expected.size();
      for (std::size_t i = 0; ok && i < expected.size(); ++i) ok = same_tensor(expected[i], before[i], why);
      if (!ok) continue;  // the library's answer is off: not the passes' business
      ++reference_ok;
      const std::string name = std::string(suite) + "/" + entry.path().filename().string();
      // Twice: with the types the model declares, and with every value's type known (what the engine's shape
      // inference gives at best), which lets more patterns match.
      Graph typed = g;
      for (const auto& [value, vt] : run_types) typed.types[value] = vt;
      int rewrites = 0;
      for (const Graph* source : {&g, &typed}) {
        const std::string label = name + (source == &g ? " (declared types)" : " (all types)");
        try {
          Graph optimized = *source;
          for (const auto& r : passes::run_passes(optimized, {})) {
            rewrites += r.rewrites;
            if (r.rewrites > 0 && source == &typed) ++models_by_pass[r.pass];
          }
          const std::vector<Tensor> after = run_graph(optimized, feeds);
          ok = after.size() == expected.size() && optimized.outputs == g.outputs;
          for (std::size_t i = 0; ok && i < expected.size(); ++i) ok = same_tensor(expected[i], after[i], why);
          if (!ok) failures.push_back(label + ": " + why + "\n" + optimized.str());
        } catch (const std::exception& e) {
          failures.push_back(label + ": " + e.what());
        }
      }
      rewritten += rewrites > 0 ? 1 : 0;
    }
  }
  std::cout << "[ passes   ] " << models << " models, " << reference_ok << " run correctly by the reference, "
            << rewritten << " of those rewritten by the passes, " << failures.size() << " broken by them\n"
            << "[ passes   ] models rewritten by each pass (all types known):";
  for (const auto& [pass, n] : models_by_pass) std::cout << " " << pass << " " << n;
  std::cout << "\n";
  EXPECT_GT(reference_ok, 0);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// ---- group_query_attention_decomposition ----

// Note [Group query attention decomposed]: com.microsoft GroupQueryAttention (a constant total_sequence_length) ->
// ONNX ops with the node kernel's outputs and presents; only when the context asks for it (a device without a
// group_query_attention kernel), and never for a node of a run-time total_sequence_length.
TEST(GraphPasses, GroupQueryAttentionDecomposition) {
  for (const bool decode : {false, true}) {
    const std::int64_t seq = decode ? 1 : 5, past = decode ? 4 : 0;
    Attributes a;
    a.set("num_heads", I(4)).set("kv_num_heads", I(2)).set("do_rotary", I(1)).set("local_window_size", I(3));
    Node gqa = node("GroupQueryAttention", {"q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin"},
                    {"out", "present_k", "present_v"}, a, "gqa");
    gqa.domain = "com.microsoft";
    Builder b;
    b.g.opsets["com.microsoft"] = 1;
    b.input("q", {I(2), seq, I(32)}).input("k", {I(2), seq, I(16)}).input("v", {I(2), seq, I(16)});
    b.input("pk", {I(2), I(2), past, I(8)}).input("pv", {I(2), I(2), past, I(8)}).input("cos", {I(8), I(2)});
    b.input("sin", {I(8), I(2)}).input("seqlens", {I(2)});
    b.g.types["seqlens"] = type({I(2)}, DType::kInt32);
    b.constant("total", ops::cast(make_i64({}, {5}), DType::kInt32)).typed("total", {});
    b.g.types["total"] = type({}, DType::kInt32);
    const Graph g = b.add(gqa).build({"out", "present_k", "present_v"});
    const Feeds feeds = {{"q", random({2, seq, 32}, 1)}, {"k", random({2, seq, 16}, 2)}, {"v", random({2, seq, 16}, 3)},
                         {"pk", random({2, 2, past, 8}, 4)}, {"pv", random({2, 2, past, 8}, 5)},
                         {"cos", random({8, 2}, 6)}, {"sin", random({8, 2}, 7)},
                         {"seqlens", ops::cast(make_i64({2}, {4, decode ? 2 : 3}), DType::kInt32)}};
    int rewrites = -1;
    run_pass(g, passes::group_query_attention_decomposition, feeds, &rewrites);
    EXPECT_EQ(rewrites, 0);  // the context does not ask for it
    passes::PassContext ctx;
    ctx.decompose_group_query_attention = true;
    const Graph r = run_pass(g, passes::group_query_attention_decomposition, feeds, &rewrites, ctx);
    EXPECT_EQ(rewrites, 1);
    EXPECT_EQ(count(r, "GroupQueryAttention"), 0);
    EXPECT_EQ(count(r, "Softmax"), 1);
    EXPECT_EQ(count(r, "MatMul"), 2);
    Graph runtime_total = g;  // total_sequence_length a graph input: left for the plan's segments
    runtime_total.initializers.erase("total");
    runtime_total.inputs.push_back("total");
    run_pass(runtime_total, passes::group_query_attention_decomposition,
             [&] {
               Feeds f = feeds;
               f["total"] = ops::cast(make_i64({}, {5}), DType::kInt32);
               return f;
             }(),
             &rewrites, ctx);
    EXPECT_EQ(rewrites, 0);
  }
}

}  // namespace
}  // namespace xpuruntime
