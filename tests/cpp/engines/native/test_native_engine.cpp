// The native engine from C++: a hand-built Graph exported to ONNX bytes and imported back (round trip), run through
// InferenceSession(engine "native") against values computed here; the CapturePlan's memory plan (offsets reused
// across lifetimes, views sharing bytes, peak reported before running); plans per input shape; GraphExec replaying a
// CUDA graph on a GPU (skipped without one).
#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_utils.h"
#include "xpuruntime/capture_plan.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph_exec.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/onnx_import.h"

using namespace xpuruntime;

namespace {


Tensor random_floats(const std::vector<std::int64_t>& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  for (std::int64_t i = 0; i < t.numel(); ++i) static_cast<float*>(t.data_ptr())[i] = dist(rng);
  return t;
}

ValueType float_type(std::vector<Dim> shape) {
  ValueType vt;
  vt.dtype = DType::kFloat32;
  vt.has_shape = true;
  vt.shape = std::move(shape);
  return vt;
}

Node node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out, const std::string& name) {
  Node n;
  n.op_type = op;
  n.name = name;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// y = Softmax(Relu(x @ W + b) reshaped to [batch, 2, 3] then flattened back) : MatMul, Add, Relu, Reshape, Flatten,
// Softmax over a symbolic batch.
Graph small_graph(const Tensor& w, const Tensor& b) {
  Graph g;
  g.name = "small";
  g.opsets[""] = 17;
  g.inputs = {"x"};
  g.outputs = {"y"};
  g.types["x"] = float_type({Dim(std::string("batch")), Dim(4)});
  g.types["y"] = float_type({Dim(std::string("batch")), Dim(6)});
  g.initializers["W"] = w;
  g.initializers["b"] = b;
  Tensor shape = Tensor::empty({3}, DType::kInt64);
  const std::int64_t dims[3] = {-1, 2, 3};
  std::memcpy(shape.data_ptr(), dims, sizeof(dims));
  g.initializers["shape"] = shape;
  g.nodes.push_back(node("MatMul", {"x", "W"}, {"xw"}, "mm"));
  g.nodes.push_back(node("Add", {"xw", "b"}, {"h"}, "add"));
  g.nodes.push_back(node("Relu", {"h"}, {"r"}, "relu"));
  g.nodes.push_back(node("Reshape", {"r", "shape"}, {"r3"}, "reshape"));
  Node flatten = node("Flatten", {"r3"}, {"f"}, "flatten");
  flatten.attrs.set("axis", std::int64_t{1});
  g.nodes.push_back(flatten);
  Node softmax = node("Softmax", {"f"}, {"y"}, "softmax");
  softmax.attrs.set("axis", std::int64_t{-1});
  g.nodes.push_back(softmax);
  g.validate();
  return g;
}

std::vector<float> reference(const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto* xp = static_cast<const float*>(x.data_ptr());
  const auto* wp = static_cast<const float*>(w.data_ptr());
  const auto* bp = static_cast<const float*>(b.data_ptr());
  const std::int64_t n = x.shape()[0];
  std::vector<float> y(static_cast<std::size_t>(n * 6));
  for (std::int64_t i = 0; i < n; ++i) {
    double row[6];
    double max = -1e30;
    for (int j = 0; j < 6; ++j) {
      double acc = bp[j];
      for (int k = 0; k < 4; ++k) acc += double(xp[i * 4 + k]) * wp[k * 6 + j];
      row[j] = std::max(acc, 0.0);
      max = std::max(max, row[j]);
    }
    double sum = 0;
    for (double& v : row) sum += (v = std::exp(v - max));
    for (int j = 0; j < 6; ++j) y[i * 6 + j] = static_cast<float>(row[j] / sum);
  }
  return y;
}

}  // namespace

TEST(NativeEngine, ExportedGraphImportsBackAndRunsLikeTheReference) {
  const Tensor w = random_floats({4, 6}, 1);
  const Tensor b = random_floats({6}, 2);
  const std::string bytes = export_onnx(small_graph(w, b));
  const Graph back = import_onnx(bytes);
  ASSERT_EQ(back.nodes.size(), 6u);
  EXPECT_EQ(back.type("x")->str(), "float32[batch,4]");
  SessionOptions options;
  options.engine = "native";
  InferenceSession session = InferenceSession::from_bytes(bytes, options);
  EXPECT_EQ(session.get_inputs()[0].str(), "x: float32[batch, 4]");
  for (std::int64_t batch : {1, 5, 2}) {
    const Tensor x = random_floats({batch, 4}, static_cast<unsigned>(batch));
    const auto outputs = session.run({{"x", x}});
    ASSERT_EQ(outputs.size(), 1u);
    ASSERT_EQ(outputs[0].shape(), (std::vector<std::int64_t>{batch, 6}));
    const auto expected = reference(x, w, b);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(static_cast<const float*>(outputs[0].data_ptr())[i], expected[i], 1e-5) << i;
    }
  }
  const Explanation e = session.explain();
  ASSERT_FALSE(e.nodes.empty());
  bool reshape_is_a_view = false;
  for (const auto& n : e.nodes) {
    EXPECT_FALSE(n.kernel.empty()) << n.node;
    if (n.op_type == "Reshape") reshape_is_a_view = n.kernel == "view";  // no kernel, no copy
  }
  EXPECT_TRUE(reshape_is_a_view) << e.str();
  // MatMul + Add + Relu became one Linear (gemm_fusion).
  EXPECT_NE(e.str().find("xpuruntime:Linear"), std::string::npos) << e.str();
  EXPECT_NE(e.memory.find("peak"), std::string::npos);
}

TEST(NativeEngine, MemoryPlanReusesOffsetsAcrossLifetimes) {
  // A chain of 8 Relus over [64, 64] float32 (16 KiB each): at most two intermediates are alive at once.
  Graph g;
  g.opsets[""] = 17;
  g.inputs = {"v0"};
  g.types["v0"] = float_type({Dim(64), Dim(64)});
  for (int i = 0; i < 8; ++i) {
    g.nodes.push_back(node("Relu", {"v" + std::to_string(i)}, {"v" + std::to_string(i + 1)}, "r" + std::to_string(i)));
  }
  g.outputs = {"v8"};
  g.validate();
  PlanOptions options;
  options.dispatcher = std::make_shared<Dispatcher>(KernelPolicy{}, ExecutionPolicy{});
  options.disabled_passes = {"elementwise_fusion"};  // which would make the chain one kernel
  auto plan = CapturePlan::build(g, {{64, 64}}, options);
  const MemoryPlan& mem = plan->memory();
  EXPECT_EQ(mem.planned_values, 9u);                 // the input and 8 intermediates
  EXPECT_EQ(mem.unshared_bytes, 9u * 16384u);
  EXPECT_LE(mem.arena_bytes, 3u * 16384u);           // reuse: the chain needs two or three slots, not nine
  EXPECT_GE(mem.arena_bytes, 2u * 16384u);
  // Values alive at the same step never overlap.
  const auto& values = plan->values();
  for (std::size_t a = 0; a < values.size(); ++a) {
    for (std::size_t b = a + 1; b < values.size(); ++b) {
      const PlanValue& x = values[a];
      const PlanValue& y = values[b];
      if (!x.planned || !y.planned || x.view_of >= 0 || y.view_of >= 0) continue;
      const bool alive_together = x.first_step <= y.last_step && y.first_step <= x.last_step;
      const bool overlap = x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      EXPECT_FALSE(alive_together && overlap) << x.name << " and " << y.name;
    }
  }
  GraphExec exec(plan);
  Tensor x = random_floats({64, 64}, 3);
  const auto out = exec.run({x});
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[i], std::max(0.0f, static_cast<const float*>(x.data_ptr())[i]));
  }
}

// Note [Constants shared between plans]: a constant of equal dtype, shape and bytes is the tensor already copied
// (whichever host tensor holds it); another shape, dtype or byte is a new copy. On the CPU "the device" is the host.
TEST(NativeEngine, DeviceConstantCacheSharesEqualConstantsOnly) {
  DeviceConstantCache cache;
  const std::vector<float> values = {1.0f, -2.5f, 3.0f, 0.0f, 7.0f, 1e-3f};
  auto host = [](const std::vector<float>& v, std::vector<std::int64_t> shape) {
    Tensor t = Tensor::empty(shape, DType::kFloat32);
    std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
    return t;
  };
  const Tensor a = cache.get(host(values, {2, 3}), Device::cpu());
  const Tensor b = cache.get(host(values, {2, 3}), Device::cpu());  // another host tensor, the same bytes
  EXPECT_EQ(a.data_ptr(), b.data_ptr());
  EXPECT_EQ(cache.shared(), 1u);
  const Tensor reshaped = cache.get(host(values, {3, 2}), Device::cpu());
  EXPECT_NE(reshaped.data_ptr(), a.data_ptr());
  std::vector<float> one_bit = values;
  one_bit[5] = std::nextafter(one_bit[5], 1.0f);
  const Tensor changed = cache.get(host(one_bit, {2, 3}), Device::cpu());
  EXPECT_NE(changed.data_ptr(), a.data_ptr());
  EXPECT_EQ(static_cast<const float*>(changed.data_ptr())[5], one_bit[5]);
  Tensor as_int = host(values, {2, 3}).view(DType::kInt32);
  EXPECT_NE(cache.get(as_int, Device::cpu()).data_ptr(), a.data_ptr());  // same bytes, another dtype
  EXPECT_EQ(cache.size(), 4u);
  EXPECT_EQ(cache.bytes(), 4u * 6u * sizeof(float));
  EXPECT_EQ(std::memcmp(a.data_ptr(), values.data(), values.size() * sizeof(float)), 0);
}

TEST(NativeEngine, PlanRejectsShapesThatContradictTheModel) {
  const Graph g = small_graph(random_floats({4, 6}, 1), random_floats({6}, 2));
  PlanOptions options;
  options.dispatcher = std::make_shared<Dispatcher>(KernelPolicy{}, ExecutionPolicy{});
  XPURT_EXPECT_THROW_WITH(CapturePlan::build(g, {{2, 5}}, options), InvalidArgumentError, "dimension 1 must be 4");
  XPURT_EXPECT_THROW_WITH(CapturePlan::build(g, {{2, 4, 1}}, options), InvalidArgumentError, "expects rank 2");
  XPURT_EXPECT_THROW_WITH(CapturePlan::build(g, {}, options), InvalidArgumentError, "has 1 inputs");
}

TEST(NativeEngine, GraphExecReplaysACudaGraph) {
  XPURT_SKIP_WITHOUT_GPU();
  const Tensor w = random_floats({4, 6}, 1);
  const Tensor b = random_floats({6}, 2);
  PlanOptions options;
  options.device = Device::cuda(0);
  options.dispatcher = std::make_shared<Dispatcher>(KernelPolicy{}, ExecutionPolicy{});
  auto plan = CapturePlan::build(small_graph(w, b), {{3, 4}}, options);
  std::string why;
  ASSERT_TRUE(plan->capturable(&why)) << why;
  GraphExec exec(plan);
  for (int run = 0; run < 4; ++run) {
    const Tensor x = random_floats({3, 4}, 10 + run);
    const auto out = exec.run({x});
    const Tensor host = out[0].to(Device::cpu());
    const auto expected = reference(x, w, b);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(static_cast<const float*>(host.data_ptr())[i], expected[i], 1e-5) << "run " << run << " " << i;
    }
  }
  EXPECT_TRUE(exec.graph_captured());
  EXPECT_EQ(exec.replays(), 3);
}

TEST(NativeEngine, PassesTurnOffByNameAndTheOptimizedGraphIsSaved) {
  const std::string bytes = export_onnx(small_graph(random_floats({4, 6}, 1), random_floats({6}, 2)));
  SessionOptions options;
  options.engine = "native";
  options.disabled_passes = {"gemm_fusion"};
  options.optimized_model_path = ::testing::TempDir() + "xpurt_small_optimized.onnx";
  InferenceSession session = InferenceSession::from_bytes(bytes, options);
  session.run({{"x", random_floats({3, 4}, 7)}});
  EXPECT_EQ(session.explain().str().find("xpuruntime:Linear"), std::string::npos);  // not fused
  const Graph saved = import_onnx_file(options.optimized_model_path);
  EXPECT_EQ(saved.type("x")->str(), "float32[3,4]");  // specialised to the first run's shapes
  EXPECT_FALSE(saved.nodes.empty());
  options.disabled_passes = {"gemm_fusoin"};
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(bytes, options), InvalidArgumentError,
                          "unknown graph pass 'gemm_fusoin' in disabled_passes; valid names: constant_folding");
}

TEST(NativeEngine, ExplainListsCandidatesTransfersAndTheMemoryPlan) {
  const Tensor w = random_floats({4, 6}, 1);
  const Tensor b = random_floats({6}, 2);
  SessionOptions options;
  options.engine = "native";
  InferenceSession session = InferenceSession::from_bytes(export_onnx(small_graph(w, b)), options);
  session.run({{"x", random_floats({3, 4}, 3)}});
  const Explanation e = session.explain();
  bool saw_linear = false;
  for (const auto& n : e.nodes) {
    if (n.kernel == "view") {
      EXPECT_TRUE(n.op.empty() && n.rule.empty() && n.candidates.empty()) << n.node;
      continue;
    }
    EXPECT_FALSE(n.op.empty()) << n.node;
    EXPECT_EQ(n.rule, "first-supported") << n.node;
    EXPECT_EQ(n.policy_rule, "auto") << n.node;
    bool winner_listed = false;
    for (const auto& c : n.candidates) {
      if (c.kernel == n.kernel) winner_listed = c.supported;
      else EXPECT_FALSE(c.reason.empty()) << n.node << ": " << c.kernel;  // every rejected candidate says why
    }
    EXPECT_TRUE(winner_listed) << n.node;
    if (n.op == "linear") {
      saw_linear = true;
      EXPECT_GE(n.candidates.size(), 2u);  // the GPU GEMM kernels are declared and rejected on the CPU
    }
  }
  EXPECT_TRUE(saw_linear) << e.str();
  // On the CPU nothing crosses a bus and nothing syncs, and the output is written where the caller gets it, not
  // copied out of the arena (Note [Outputs written where the caller gets them]).
  EXPECT_TRUE(e.transfers.empty()) << e.str();
  EXPECT_NE(e.memory_json.find("\"peak_bytes\""), std::string::npos);
  // Note [Build phases]: the import, then the probe plan's (batch 1) and the first run's (batch 3) phases.
  ASSERT_FALSE(e.build.empty());
  EXPECT_EQ(e.build.front().phase, "import");
  int totals = 0;
  for (const BuildPhase& phase : e.build) {
    EXPECT_GE(phase.ms, 0.0) << phase.phase;
    totals += phase.phase.size() > 7 && phase.phase.compare(phase.phase.size() - 7, 7, ": total") == 0;
  }
  EXPECT_EQ(totals, 2) << e.to_json();
  const std::string json = e.to_json();
  for (const char* key : {"\"candidates\"", "\"transfers\"", "\"memory_plan\"", "\"rule\"", "\"policy_rule\"",
                          "\"build\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
}

// Note [Libraries warmed while the model is read]: each Kernel::warm_up problem is a valid problem of the kernel's own
// op (its shapes infer everywhere); on a GPU the kernel takes and builds it, and a CUDA session's explain().build
// lists the helper's time once it is done.
TEST(NativeEngine, LibraryWarmUpProblemsAreValidAndTheirTimeIsExplained) {
  const KernelRegistry& registry = KernelRegistry::global();
  int warmed = 0;
  for (const std::string& op : registry.ops()) {
    for (const Kernel* kernel : registry.kernels(op)) {
      std::optional<OpDescriptor> desc = kernel->warm_up(Device::cuda(0));
      if (!desc) continue;
      SCOPED_TRACE(kernel->info().backend + " " + kernel->name() + " " + op);
      ++warmed;
      EXPECT_EQ(desc->op, op);
      EXPECT_TRUE(desc->device.is_cuda());
      registry.infer(*desc);
      ASSERT_FALSE(desc->outputs.empty());
      if (!(DeviceManager::instance().get_device_count() > 0)) continue;
      const ExecutionPolicy policy;
      const Support support = kernel->supports(*desc, policy);
      ASSERT_TRUE(support) << support.reason();
      EXPECT_NE(kernel->build(*desc, policy, ""), nullptr);
    }
  }
  if (DeviceManager::instance().get_device_count() == 0) return;
  EXPECT_GE(warmed, 2);  // cuBLASLt and cuDNN: every GPU build has them
  SessionOptions options;
  options.engine = "native";
  options.device = Device::cuda(0);
  InferenceSession session =
      InferenceSession::from_bytes(export_onnx(small_graph(random_floats({4, 6}, 1), random_floats({6}, 2))), options);
  session.run({{"x", random_floats({3, 4}, 3).to(Device::cuda(0))}});
  bool listed = false;
  for (int attempt = 0; attempt < 200 && !listed; ++attempt) {  // the helper may still run right after creation
    for (const BuildPhase& phase : session.explain().build) listed |= phase.phase.rfind("libraries warmed", 0) == 0;
    if (!listed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(listed) << session.explain().to_json();
}

// Note [Segmented plans]: x -> NonZero(x > 0) -> Transpose -> GatherND(x, .) -> TopK(k = min(count, 3)): the plan
// ends at the NonZero, the next segment is planned for the count each run gives, and explain() lists the segments.
TEST(NativeEngine, SegmentedPlanRunsNonZeroThenTopKOnTheCount) {
  Graph g;
  g.name = "segmented";
  g.opsets[""] = 13;
  g.inputs = {"x"};
  g.outputs = {"top", "nz"};
  g.types["x"] = float_type({Dim(std::string("n"))});
  auto int64_constant = [&](const std::string& name, std::vector<std::int64_t> values) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kInt64);
    std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
    g.initializers[name] = t;
  };
  Tensor zero = Tensor::zeros({1}, DType::kFloat32);
  g.initializers["zero"] = zero;
  int64_constant("three", {3});
  g.nodes.push_back(node("Greater", {"x", "zero"}, {"mask"}, "greater"));
  g.nodes.push_back(node("NonZero", {"mask"}, {"nz"}, "nonzero"));
  Node transpose = node("Transpose", {"nz"}, {"idx"}, "transpose");
  transpose.attrs.set("perm", std::vector<std::int64_t>{1, 0});
  g.nodes.push_back(transpose);
  g.nodes.push_back(node("GatherND", {"x", "idx"}, {"kept"}, "gather"));
  g.nodes.push_back(node("Shape", {"kept"}, {"count"}, "shape"));
  Node both = node("Concat", {"count", "three"}, {"both"}, "concat");
  both.attrs.set("axis", std::int64_t{0});
  g.nodes.push_back(both);
  Node k = node("ReduceMin", {"both"}, {"k"}, "reduce_min");
  k.attrs.set("keepdims", std::int64_t{1});
  g.nodes.push_back(k);
  g.nodes.push_back(node("TopK", {"kept", "k"}, {"top", "top_i"}, "topk"));
  g.validate();
  SessionOptions options;
  options.engine = "native";
  InferenceSession session = InferenceSession::from_bytes(export_onnx(g), options);
  for (const std::vector<float>& values : {std::vector<float>{-1, 4, 2, -3, 7, 1, 5}, std::vector<float>{-1, 2, -2},
                                           std::vector<float>{-1, -2}}) {
    Tensor x = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kFloat32);
    std::memcpy(x.data_ptr(), values.data(), values.size() * sizeof(float));
    const std::vector<Tensor> out = session.run({{"x", x}});
    std::vector<float> positive;
    std::vector<std::int64_t> where;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i] > 0) positive.push_back(values[i]), where.push_back(static_cast<std::int64_t>(i));
    }
    std::sort(positive.begin(), positive.end(), std::greater<float>());
    positive.resize(std::min<std::size_t>(positive.size(), 3));
    ASSERT_EQ(out[0].shape(), (std::vector<std::int64_t>{static_cast<std::int64_t>(positive.size())}));
    for (std::size_t i = 0; i < positive.size(); ++i) {
      EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[i], positive[i]);
    }
    ASSERT_EQ(out[1].shape(), (std::vector<std::int64_t>{1, static_cast<std::int64_t>(where.size())}));
    for (std::size_t i = 0; i < where.size(); ++i) {
      EXPECT_EQ(static_cast<const std::int64_t*>(out[1].data_ptr())[i], where[i]);
    }
  }
  const Explanation e = session.explain();
  ASSERT_EQ(e.segments.size(), 2u) << e.str();
  EXPECT_NE(e.segments[0].find("NonZero 'nonzero'"), std::string::npos) << e.segments[0];
  // Each input length has its plan; the last one's boundary planned the next segment for its one count.
  EXPECT_NE(e.segments[0].find("1 plan(s) cached"), std::string::npos) << e.segments[0];
  bool second_segment = false;
  for (const auto& n : e.nodes) {
    EXPECT_NE(n.kernel, "onnx_ref") << n.node;
    second_segment |= n.segment == 1 && n.op == "top_k";
  }
  EXPECT_TRUE(second_segment) << e.str();
}

namespace {

// present = Concat(past, Relu(x)) along axis 2 (a graph output), y = present * 2: a cache append and a reader of it.
Graph cache_append_graph() {
  Graph g;
  g.name = "cache_append";
  g.opsets[""] = 17;
  g.inputs = {"past", "x"};
  g.outputs = {"present", "y"};
  g.types["past"] = float_type({Dim(2), Dim(3), Dim(std::string("past")), Dim(4)});
  g.types["x"] = float_type({Dim(2), Dim(3), Dim(1), Dim(4)});
  Tensor two = Tensor::empty({}, DType::kFloat32);
  *static_cast<float*>(two.data_ptr()) = 2.0f;
  g.initializers["two"] = two;
  g.nodes.push_back(node("Relu", {"x"}, {"k"}, "relu"));
  Node concat = node("Concat", {"past", "k"}, {"present"}, "concat");
  concat.attrs.set("axis", std::int64_t{2});
  g.nodes.push_back(concat);
  g.nodes.push_back(node("Mul", {"present", "two"}, {"y"}, "mul"));
  g.validate();
  return g;
}

// Runs one step with the present bound over `buffer` ([2, 3, past + 1, 4] on `device`) and its first `past` positions
// fed as the past; checks present and y against the host copy taken before the run.
void check_append_step(InferenceSession& session, const Tensor& buffer, std::int64_t past, unsigned seed) {
  const Tensor before = buffer.to(Device::cpu()).contiguous();
  const Tensor x = random_floats({2, 3, 1, 4}, seed);
  IoBinding binding = session.io_binding();
  binding.bind_input("past", Tensor::from_blob(buffer.data_ptr(), {2, 3, past, 4}, buffer.strides(), buffer.dtype(),
                                               buffer.device(), buffer.storage()));
  binding.bind_input("x", x.to(buffer.device()));
  binding.bind_output("present", buffer);
  binding.bind_output("y", Device::cpu());
  session.run_with_binding(binding);
  const Tensor present = buffer.to(Device::cpu()).contiguous();
  const Tensor y = binding.outputs()[1].to(Device::cpu()).contiguous();
  const auto* b = static_cast<const float*>(before.data_ptr());
  const auto* p = static_cast<const float*>(present.data_ptr());
  const auto* xs = static_cast<const float*>(x.data_ptr());
  for (std::int64_t row = 0; row < 6; ++row) {
    for (std::int64_t pos = 0; pos <= past; ++pos) {
      for (std::int64_t d = 0; d < 4; ++d) {
        const std::int64_t at = (row * (past + 1) + pos) * 4 + d;
        const float want = pos < past ? b[at] : std::max(0.0f, xs[row * 4 + d]);
        EXPECT_EQ(p[at], want) << "row " << row << " position " << pos;
        EXPECT_EQ(static_cast<const float*>(y.data_ptr())[at], 2.0f * want);
      }
    }
  }
}

}  // namespace

// Note [Cache appended in place]: from C++, a present bound over its past (a strided view of the buffer's first
// positions) is written only at the new position, its reader reads the buffer, and explain() says so; a present bound
// elsewhere runs the Concat.
TEST(NativeEngine, APresentBoundOverItsPastIsAppendedInPlace) {
  SessionOptions options;
  options.engine = "native";
  InferenceSession session = InferenceSession::from_bytes(export_onnx(cache_append_graph()), options);
  const Tensor buffer = random_floats({2, 3, 6, 4}, 1);
  check_append_step(session, buffer, 5, 2);
  check_append_step(session, buffer, 5, 3);
  EXPECT_NE(session.explain().str().find("cache appended in place: 2 Concat step(s) over 2 run(s)"), std::string::npos)
      << session.explain().str();
  const Tensor elsewhere = random_floats({2, 3, 6, 4}, 4);
  IoBinding binding = session.io_binding();
  binding.bind_input("past", random_floats({2, 3, 5, 4}, 5));
  binding.bind_input("x", random_floats({2, 3, 1, 4}, 6));
  binding.bind_output("present", elsewhere);
  binding.bind_output("y", Device::cpu());
  session.run_with_binding(binding);
  EXPECT_NE(session.explain().str().find("2 Concat step(s) over 2 run(s)"), std::string::npos);  // not counted
}

TEST(NativeEngine, CacheAppendsInPlaceReplayACudaGraphAndCaptureAgainForOtherBuffers) {
  XPURT_SKIP_WITHOUT_GPU();
  SessionOptions options;
  options.engine = "native";
  options.device = Device::cuda(0);
  InferenceSession session = InferenceSession::from_bytes(export_onnx(cache_append_graph()), options);
  const Tensor first = random_floats({2, 3, 9, 4}, 1).to(Device::cuda(0));
  for (unsigned run = 0; run < 4; ++run) check_append_step(session, first, 8, 10 + run);  // eager, capture, replays
  EXPECT_NE(session.explain().str().find("captured and replayed"), std::string::npos);
  const Tensor second = random_floats({2, 3, 9, 4}, 2).to(Device::cuda(0));
  check_append_step(session, second, 8, 20);  // another buffer: captured again
  check_append_step(session, first, 8, 21);
  EXPECT_NE(session.explain().str().find("cache appended in place: 6 Concat step(s)"), std::string::npos)
      << session.explain().str();
}
