// The quantized_constant_folding pass (src/cpp/engines/native/passes/quantized_constants.cpp, Note [Quantized
// constants folded at build time]): on QConv / QLinear nodes with random constant weights, the rewrite (x_scale 1,
// w_scale = alpha, the zero point's correction in an int32 bias) and its constants bit for bit against the prologue's
// formula; the cpu kernel's output the same bits before and after; and (GPU) every GPU kernel of the rewritten node,
// which launches no prologue, the same bits as the cpu kernel on the original node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engines/native/passes/passes.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Ints = std::vector<std::int64_t>;

// One QConv or QLinear node's operands.
struct Case {
  std::string name;
  bool conv = true;
  Shape x, w;                    // conv: NCHW or NHWC x and its weight; linear: x [M, K], w [N, K] (nk) or [K, N]
  bool nhwc = false;             // conv
  std::int64_t groups = 1;       // conv
  Ints pads = {1, 1, 1, 1};      // conv
  Ints strides = {1, 1};         // conv
  bool nk = true;                // linear
  DType x_dtype = DType::kInt8;
  std::int64_t x_zero_point = 0;
  enum Scale { kNoScale, kPerTensor, kPerChannel } scale = kPerChannel;
  enum Bias { kNone, kInt, kFloat } bias = kNone;
  std::string output = "float32";
  bool relu = false;
  // What the pass must fold.
  bool folds_alpha = true;
  bool folds_bias = true;
};

std::int64_t channels_of(const Case& k) { return k.conv || k.nk ? k.w[0] : k.w[1]; }

Tensor random_bytes(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_int_distribution<int> dist(0, 255);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<std::uint8_t>(dist(rng));
  return t;
}

Tensor random_floats(const Shape& shape, std::mt19937& rng, float low, float high) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::uniform_real_distribution<float> dist(low, high);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

Tensor random_ints(const Shape& shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, DType::kInt32);
  // The whole int32 range: the folded sums wrap.
  std::uniform_int_distribution<std::int32_t> dist(std::numeric_limits<std::int32_t>::min(),
                                                   std::numeric_limits<std::int32_t>::max());
  auto* p = static_cast<std::int32_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// A graph of the one node: x a graph input, the weight, w_scale and bias constants.
Graph graph_of(const Case& k, std::mt19937& rng) {
  Graph g;
  g.opsets[""] = 17;
  g.opsets[kXpurtDomain] = 1;
  g.inputs = {"x"};
  ValueType xt;
  xt.dtype = k.x_dtype;
  xt.has_shape = true;
  for (const std::int64_t d : k.x) xt.shape.emplace_back(d);
  g.types["x"] = xt;
  Node n;
  n.name = k.conv ? "conv" : "linear";
  n.domain = kXpurtDomain;
  n.op_type = k.conv ? "QConv" : "QLinear";
  n.inputs = {"x", "w", "", ""};
  n.outputs = {"y"};
  g.initializers["w"] = random_bytes(k.w, DType::kInt8, rng);
  const std::int64_t channels = channels_of(k);
  if (k.scale != Case::kNoScale) {
    g.initializers["w_scale"] = random_floats({k.scale == Case::kPerChannel ? channels : 1}, rng, 0.001f, 0.03f);
    n.inputs[2] = "w_scale";
  }
  if (k.bias == Case::kInt) g.initializers["bias"] = random_ints({channels}, rng);
  if (k.bias == Case::kFloat) g.initializers["bias"] = random_floats({channels}, rng, -3.0f, 3.0f);
  if (k.bias != Case::kNone) n.inputs[3] = "bias";
  while (!n.inputs.empty() && n.inputs.back().empty()) n.inputs.pop_back();
  n.attrs.set("x_zero_point", k.x_zero_point).set("output_dtype", k.output);
  n.attrs.set("activation", std::string(k.relu ? "relu" : "none"));
  if (k.output != "int32") n.attrs.set("x_scale", 0.0173);
  if (k.output == "int8" || k.output == "uint8") {
    n.attrs.set("y_scale", 0.37).set("y_zero_point", static_cast<std::int64_t>(k.output == "int8" ? -7 : 121));
  }
  if (k.conv) {
    n.attrs.set("strides", k.strides).set("pads", k.pads).set("dilations", Ints{1, 1}).set("groups", k.groups);
    n.attrs.set("layout", std::string(k.nhwc ? "NHWC" : "NCHW"));
  } else {
    n.attrs.set("weight_layout", std::string(k.nk ? "nk" : "kn"));
  }
  g.nodes.push_back(std::move(n));
  g.outputs = {"y"};
  g.validate();
  return g;
}

// The node's registry-op inputs, x given.
std::vector<Tensor> inputs_of(const Graph& g, const Tensor& x) {
  const Node& n = g.nodes.at(0);
  std::vector<Tensor> in = {x};
  for (std::size_t i = 1; i < 4; ++i) in.push_back(n.has_input(i) ? g.initializers.at(n.inputs[i]) : Tensor());
  return in;
}

std::string op_of(const Graph& g) { return g.nodes.at(0).op_type == "QConv" ? "qconv2d" : "qlinear"; }

// Runs the node's registry op with kernel `name` on the inputs' device.
Tensor run(const std::string& op, const std::string& name, const std::vector<Tensor>& inputs,
           const Attributes& attrs) {
  OpDescriptor desc;
  desc.op = op;
  for (const Tensor& t : inputs) desc.inputs.push_back(t.defined() ? TensorDesc::of(t) : TensorDesc());
  desc.attrs = attrs;
  desc.device = inputs.at(0).device();
  desc.compute_capability =
      desc.device.is_cuda() ? DeviceManager::instance().get_device_info(desc.device).compute_capability() : 0;
  KernelRegistry::global().infer(desc);
  const ExecutionPolicy policy;
  const Kernel* kernel = KernelRegistry::global().find_kernel(op, name);
  if (kernel == nullptr) throw std::runtime_error("no " + op + " kernel '" + name + "'");
  const Support support = kernel->supports(desc, policy);
  if (!support) throw std::runtime_error(name + " does not take " + desc.signature() + ": " + support.reason());
  const auto plan = kernel->build(desc, policy, "");
  std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype, desc.device)};
  const StreamView stream =
      desc.device.is_cuda() ? StreamManager::instance().current_stream(desc.device) : StreamView();
  plan->execute(desc, inputs, outputs, stream);
  stream.synchronize();
  return outputs[0].to(Device::cpu());
}

void expect_same_bytes(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  const std::size_t bytes = static_cast<std::size_t>(expected.numel()) * dtype_size(expected.dtype());
  EXPECT_EQ(std::memcmp(actual.data_ptr(), expected.data_ptr(), bytes), 0) << what << ": the bytes differ";
}

// alpha as the prologue (cuda_raw::quantized_prologue) and the cpu kernel make it.
std::vector<float> expected_alpha(const Graph& g) {
  const Node& n = g.nodes.at(0);
  const auto x_scale = static_cast<float>(n.attrs.get_float("x_scale", 1.0));
  if (!n.has_input(2)) return {x_scale};
  const Tensor& s = g.initializers.at(n.inputs[2]);
  std::vector<float> out;
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    out.push_back(static_cast<float>(static_cast<double>(x_scale) *
                                     static_cast<double>(static_cast<const float*>(s.data_ptr())[i])));
  }
  return out;
}

// bias[o] + correction * sum_k w[o, k] modulo 2^32, from exact 64-bit sums.
std::vector<std::int32_t> expected_bias(const Case& k, const Graph& g, std::int64_t correction) {
  const Node& n = g.nodes.at(0);
  const Tensor& w = g.initializers.at("w");
  const auto* data = static_cast<const std::int8_t*>(w.data_ptr());
  const std::int64_t channels = channels_of(k);
  const std::int64_t per = w.numel() / channels;
  const bool rows = k.conv || k.nk;
  std::vector<std::int32_t> out;
  for (std::int64_t o = 0; o < channels; ++o) {
    std::int64_t sum = 0;
    for (std::int64_t j = 0; j < per; ++j) sum += rows ? data[o * per + j] : data[j * channels + o];
    const std::int64_t bias =
        n.has_input(3) ? static_cast<const std::int32_t*>(g.initializers.at(n.inputs[3]).data_ptr())[o] : 0;
    out.push_back(static_cast<std::int32_t>(static_cast<std::uint32_t>(
        static_cast<std::uint64_t>(bias + correction * sum) & 0xffffffffu)));
  }
  return out;
}

// What the pass must have made of `before` (Case::folds_alpha, Case::folds_bias).
void check_rewrite(const Case& k, const Graph& before, const Graph& after) {
  const Node& was = before.nodes.at(0);
  const Node& now = after.nodes.at(0);
  if (k.folds_alpha) {
    EXPECT_EQ(now.attrs.get_float("x_scale", 0.0), 1.0) << k.name;
    const Tensor& alpha = after.initializers.at(now.inputs.at(2));
    const std::vector<float> expected = expected_alpha(before);
    ASSERT_EQ(alpha.dtype(), DType::kFloat32) << k.name;
    ASSERT_EQ(alpha.numel(), static_cast<std::int64_t>(expected.size())) << k.name;
    EXPECT_EQ(std::memcmp(alpha.data_ptr(), expected.data(), expected.size() * sizeof(float)), 0) << k.name;
    EXPECT_EQ(after.initializers.count("w_scale"), 0u) << k.name << ": the replaced w_scale stays";
  } else {
    EXPECT_EQ(now.attrs.get_float("x_scale", 1.0), was.attrs.get_float("x_scale", 1.0)) << k.name;
  }
  if (k.folds_bias) {
    const Tensor& bias = after.initializers.at(now.inputs.at(3));
    const std::vector<std::int32_t> expected = expected_bias(k, before, -k.x_zero_point);
    ASSERT_EQ(bias.dtype(), DType::kInt32) << k.name;
    ASSERT_EQ(bias.numel(), static_cast<std::int64_t>(expected.size())) << k.name;
    EXPECT_EQ(std::memcmp(bias.data_ptr(), expected.data(), expected.size() * sizeof(std::int32_t)), 0) << k.name;
    if (k.conv) {
      EXPECT_EQ(now.attrs.get_int("zero_point_folded", 0), 1) << k.name;
      EXPECT_EQ(now.attrs.get_int("x_zero_point", 0), k.x_zero_point) << k.name << ": the padding's value";
    } else {
      EXPECT_EQ(now.attrs.get_int("x_zero_point", -1), 0) << k.name;
    }
  } else {
    EXPECT_EQ(now.attrs.get_int("zero_point_folded", 0), 0) << k.name;
    EXPECT_EQ(now.attrs.get_int("x_zero_point", -1), k.x_zero_point) << k.name;
    EXPECT_EQ(now.has_input(3), was.has_input(3)) << k.name;
  }
}

// The pass on `k`, checked; returns the original and the rewritten graph.
std::pair<Graph, Graph> fold(const Case& k, std::mt19937& rng) {
  Graph before = graph_of(k, rng);
  Graph after = before;
  const passes::PassResult r = passes::quantized_constant_folding(after, passes::PassContext());
  EXPECT_EQ(r.rewrites, k.folds_alpha || k.folds_bias ? 1 : 0) << k.name;
  check_rewrite(k, before, after);
  return {std::move(before), std::move(after)};
}

std::vector<Case> conv_cases() {
  std::vector<Case> cases;
  Case k{"int8 zp -3, int32 bias, per channel, int8 out", true, {2, 16, 9, 8}, {24, 16, 3, 3}};
  k.x_zero_point = -3;
  k.bias = Case::kInt;
  k.output = "int8";
  k.relu = true;
  cases.push_back(k);
  k = Case{"uint8 zp 131, no bias, per tensor, stride 2, uneven pads", true, {1, 5, 11, 10}, {7, 5, 3, 3}};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 131;
  k.scale = Case::kPerTensor;
  k.pads = {2, 0, 1, 1};
  k.strides = {2, 2};
  cases.push_back(k);
  k = Case{"int8 zp 0, float bias: alpha only", true, {1, 8, 6, 6}, {12, 8, 3, 3}};
  k.bias = Case::kFloat;
  k.output = "float16";
  k.folds_bias = false;
  cases.push_back(k);
  k = Case{"uint8 zp 7, float bias: alpha only, the correction stays", true, {1, 8, 6, 7}, {9, 8, 3, 3}};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 7;
  k.bias = Case::kFloat;
  k.output = "uint8";
  k.folds_bias = false;
  cases.push_back(k);
  k = Case{"int32 out, zp 5, int32 bias: bias only", true, {1, 6, 5, 5}, {10, 6, 3, 3}};
  k.x_zero_point = 5;
  k.scale = Case::kNoScale;
  k.bias = Case::kInt;
  k.output = "int32";
  k.folds_alpha = false;
  cases.push_back(k);
  k = Case{"NHWC 32 -> 40, int8 zp -5, int32 bias (tensor cores)", true, {2, 7, 6, 32}, {40, 3, 3, 32}};
  k.nhwc = true;
  k.x_zero_point = -5;
  k.bias = Case::kInt;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"NHWC 16 -> 24, uint8 zp 200, no bias, 1x1", true, {1, 5, 5, 16}, {24, 1, 1, 16}};
  k.nhwc = true;
  k.pads = {0, 0, 0, 0};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 200;
  k.output = "float32";
  cases.push_back(k);
  k = Case{"groups 2, int8 zp 9, no w_scale", true, {1, 12, 7, 7}, {20, 6, 3, 3}};
  k.groups = 2;
  k.x_zero_point = 9;
  k.scale = Case::kNoScale;
  cases.push_back(k);
  return cases;
}

std::vector<Case> linear_cases() {
  std::vector<Case> cases;
  Case k{"uint8 zp 3, int32 bias, per channel, int8 out", false, {5, 64}, {48, 64}};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 3;
  k.bias = Case::kInt;
  k.output = "int8";
  k.relu = true;
  cases.push_back(k);
  k = Case{"int8 zp -7, no bias, per tensor, [K, N] weight", false, {3, 37}, {37, 11}};
  k.nk = false;
  k.x_zero_point = -7;
  k.scale = Case::kPerTensor;
  cases.push_back(k);
  k = Case{"uint8 zp 128, float bias: alpha only", false, {4, 32}, {16, 32}};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 128;
  k.bias = Case::kFloat;
  k.folds_bias = false;
  cases.push_back(k);
  k = Case{"uint8 zp 5, float bias: alpha only, the correction stays", false, {4, 32}, {16, 32}};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 5;
  k.bias = Case::kFloat;
  k.output = "float16";
  k.folds_bias = false;
  cases.push_back(k);
  k = Case{"int32 out, uint8 zp 10, no bias: bias only", false, {6, 24}, {8, 24}};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 10;
  k.scale = Case::kNoScale;
  k.output = "int32";
  k.folds_alpha = false;
  cases.push_back(k);
  k = Case{"int8 zp 0, no bias, per channel: alpha only", false, {7, 40}, {33, 40}};
  k.folds_bias = false;
  cases.push_back(k);
  k = Case{"uint8 zp 77, int32 bias, K 64 (int8_mma, cublasLt and dp4a)", false, {9, 64}, {32, 64}};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 77;
  k.bias = Case::kInt;
  k.output = "uint8";
  cases.push_back(k);
  return cases;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases = conv_cases();
  for (const Case& k : linear_cases()) cases.push_back(k);
  return cases;
}

TEST(QuantizedConstantFolding, FoldsAlphaAndTheZeroPointsCorrectionBitForBit) {
  std::mt19937 rng(41);
  for (const Case& k : all_cases()) {
    SCOPED_TRACE(k.name);
    fold(k, rng);
  }
}

TEST(QuantizedConstantFolding, TheCpuKernelGivesTheSameBitsBeforeAndAfter) {
  std::mt19937 rng(42);
  for (const Case& k : all_cases()) {
    SCOPED_TRACE(k.name);
    const auto [before, after] = fold(k, rng);
    const Tensor x = random_bytes(k.x, k.x_dtype, rng);
    const std::string op = op_of(before);
    expect_same_bytes(run(op, "cpu", inputs_of(after, x), after.nodes[0].attrs),
                      run(op, "cpu", inputs_of(before, x), before.nodes[0].attrs), k.name);
  }
}

TEST(QuantizedConstantFolding, LeavesWhatIsNotConstantOrAlreadyFolded) {
  std::mt19937 rng(43);
  Case k{"int8 zp -3, int32 bias", true, {1, 8, 5, 5}, {8, 8, 3, 3}};
  k.x_zero_point = -3;
  k.bias = Case::kInt;
  Graph g = graph_of(k, rng);
  // Once folded, a second run finds nothing.
  EXPECT_EQ(passes::quantized_constant_folding(g, passes::PassContext()).rewrites, 1);
  EXPECT_EQ(passes::quantized_constant_folding(g, passes::PassContext()).rewrites, 0) << g.str();
  // A bias known only at run time: only alpha.
  Graph runtime_bias = graph_of(k, rng);
  runtime_bias.initializers.erase("bias");
  runtime_bias.inputs.push_back("bias");
  ValueType bt;
  bt.dtype = DType::kInt32;
  bt.has_shape = true;
  bt.shape = {Dim(8)};
  runtime_bias.types["bias"] = bt;
  runtime_bias.validate();
  const passes::PassResult r = passes::quantized_constant_folding(runtime_bias, passes::PassContext());
  EXPECT_EQ(r.rewrites, 1);
  EXPECT_EQ(runtime_bias.nodes[0].inputs[3], "bias");
  EXPECT_EQ(runtime_bias.nodes[0].attrs.get_int("zero_point_folded", 0), 0);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("alpha"), std::string::npos) << r.notes[0];
}

TEST(QuantizedConstantFolding, IsInThePassListAfterTheLayoutPass) {
  std::vector<std::string> names;
  for (const auto& p : passes::all_passes()) names.push_back(p.name);
  const auto at = [&](const std::string& name) { return std::find(names.begin(), names.end(), name) - names.begin(); };
  ASSERT_LT(at("quantized_constant_folding"), static_cast<std::ptrdiff_t>(names.size()));
  EXPECT_GT(at("quantized_constant_folding"), at("quantized_fusion"));
  EXPECT_GT(at("quantized_constant_folding"), at("nhwc_layout"));
}

TEST(QuantizedConstantFolding, TheSchemaWantsAnInt32BiasWithZeroPointFolded) {
  std::mt19937 rng(44);
  Case k{"float bias", true, {1, 8, 5, 5}, {8, 8, 3, 3}};
  k.bias = Case::kFloat;
  const Graph g = graph_of(k, rng);
  Attributes attrs = g.nodes[0].attrs;
  attrs.set("zero_point_folded", std::int64_t{1});
  XPURT_EXPECT_THROW_WITH(run("qconv2d", "cpu", inputs_of(g, random_bytes(k.x, k.x_dtype, rng)), attrs),
                          InvalidArgumentError, "zero_point_folded=1 needs the int32 bias");
}

// ---- GPU: the rewritten node (no prologue) on every GPU kernel against the cpu kernel on the original node ----

TEST(QuantizedConstantFoldingGpu, EveryGpuKernelOfTheFoldedNodeMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(45);
  for (const Case& k : all_cases()) {
    SCOPED_TRACE(k.name);
    const auto [before, after] = fold(k, rng);
    const Tensor x = random_bytes(k.x, k.x_dtype, rng);
    const std::string op = op_of(before);
    const Tensor expected = run(op, "cpu", inputs_of(before, x), before.nodes[0].attrs);
    std::vector<Tensor> device_inputs;
    for (const Tensor& t : inputs_of(after, x)) device_inputs.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
    const std::vector<std::string> kernels =
        k.conv ? std::vector<std::string>{"int8_mma", "cuda_raw"}
               : std::vector<std::string>{"int8_mma", "cublasLt", "dp4a"};
    int ran = 0;
    for (const std::string& name : kernels) {
      const Kernel* kernel = KernelRegistry::global().find_kernel(op, name);
      ASSERT_NE(kernel, nullptr) << name;
      OpDescriptor desc;
      desc.op = op;
      for (const Tensor& t : device_inputs) desc.inputs.push_back(t.defined() ? TensorDesc::of(t) : TensorDesc());
      desc.attrs = after.nodes[0].attrs;
      desc.device = Device::cuda(0);
      desc.compute_capability = DeviceManager::instance().get_device_info(desc.device).compute_capability();
      KernelRegistry::global().infer(desc);
      if (!kernel->supports(desc, ExecutionPolicy())) continue;  // int8_mma: NHWC only; cublasLt: [N, K] weights
      expect_same_bytes(run(op, name, device_inputs, after.nodes[0].attrs), expected, k.name + " on " + name);
      ++ran;
    }
    EXPECT_GE(ran, 1) << "no GPU kernel took " << k.name;
  }
}

}  // namespace
}  // namespace xpuruntime
