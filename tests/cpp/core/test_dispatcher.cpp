// Dispatcher: rules (pinned, preferred, fallback, auto), decisions with reasons, determinism, autotuning and the
// autotune cache (replay without re-timing, plan records re-created), on a private registry of CPU kernels.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "test_utils.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/ops.h"

using namespace xpuruntime;

namespace {

// A CPU "relu" whose speed, determinism and support are set by the test, counting its runs and builds.
struct Counters {
  std::atomic<int> runs{0};
  std::atomic<int> builds{0};
  std::string last_record;
};

// A test plan's run: counts it, waits `delay_us`, then y = relu(x).
void run_relu(const KernelLaunch& launch, Counters* counters, int delay_us) {
  ++counters->runs;
  if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  const float* x = static_cast<const float*>(launch.input(0).data_ptr());
  float* y = static_cast<float*>(launch.output(0).data_ptr());
  for (std::int64_t i = 0; i < launch.input(0).numel(); ++i) y[i] = x[i] > 0 ? x[i] : 0;
}

class TestKernel final : public Kernel {
 public:
  TestKernel(std::string name, int delay_us, bool deterministic, bool supports_fp16, Counters* counters)
      : Kernel(KernelInfo{"relu", std::move(name), "test", DeviceType::kCPU, deterministic, "test kernel"}),
        delay_us_(delay_us),
        supports_fp16_(supports_fp16),
        counters_(counters) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (desc.inputs[0].dtype == DType::kFloat16 && !supports_fp16_) return Support::no("no float16 here");
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor&, const ExecutionPolicy&, const std::string& record) const override {
    ++counters_->builds;
    counters_->last_record = record;
    return std::make_unique<Plan>(this, record.empty() ? "{\"algo\":7}" : record);
  }

 private:
  class Plan final : public KernelPlan {
   public:
    Plan(const TestKernel* kernel, std::string record) : kernel_(kernel), record_(std::move(record)) {}
    void run(const KernelLaunch& launch) const override {
      run_relu(launch, kernel_->counters_, kernel_->delay_us_);
    }
    std::string record() const override { return record_; }
    std::string describe() const override { return "test plan " + record_; }

   private:
    const TestKernel* kernel_;
    std::string record_;
  };

  int delay_us_;
  bool supports_fp16_;
  Counters* counters_;
};

struct Fixture {
  KernelRegistry registry;
  Counters slow, fast, flaky;
  Fixture() {
    register_ops(registry);
    registry.add_kernel(std::make_unique<TestKernel>("slow", 2000, true, true, &slow));
    registry.add_kernel(std::make_unique<TestKernel>("fast", 0, false, true, &fast));
    registry.add_kernel(std::make_unique<TestKernel>("flaky", 1000, true, false, &flaky));
  }
  Dispatcher dispatcher(const KernelPolicy& kp, ExecutionPolicy ep = {}, std::shared_ptr<AutotuneCache> cache = nullptr) {
    Dispatcher::Options options;
    options.autotune_warmup = 1;
    options.autotune_iterations = 3;
    return Dispatcher(kp, ep, std::move(cache), &registry, options);
  }
};

Tensor input(DType dtype = DType::kFloat32) {
  Tensor t = Tensor::empty({2, 3}, dtype, Device::cpu());
  if (dtype == DType::kFloat32) {
    float* p = static_cast<float*>(t.data_ptr());
    for (int i = 0; i < 6; ++i) p[i] = static_cast<float>(i) - 2.5f;
  } else {
    t.zero_();
  }
  return t;
}

KernelPolicy policy_with(const std::string& key, const KernelRule& rule, const KernelRegistry& registry) {
  KernelPolicy policy;
  policy.set(key, rule, &registry);
  return policy;
}

}  // namespace

TEST(Dispatcher, FirstSupportedTakesRegistryOrderAndRecordsCandidates) {
  Fixture f;
  Dispatcher d = f.dispatcher(KernelPolicy());
  Decision decision;
  auto out = d.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "slow");
  EXPECT_EQ(decision.rule, "first-supported");
  ASSERT_EQ(decision.candidates.size(), 3u);
  EXPECT_EQ(decision.candidates[1].reason, "not chosen (first-supported)");
  EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[5], 2.5f);
  EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[0], 0.0f);
  EXPECT_NE(decision.to_json().find("\"signature\":\"relu(float32[2,3]){} cpu fp32\""), std::string::npos);
}

TEST(Dispatcher, PinnedKernelThatCannotRunRaisesWithTheReason) {
  Fixture f;
  Dispatcher d = f.dispatcher(policy_with("relu", KernelRule::pinned("flaky"), f.registry));
  XPURT_EXPECT_THROW_WITH(d.run("relu", {input(DType::kFloat16)}, {}), UnsupportedOperationError,
                          "pinned kernel 'flaky' cannot run relu(float16[2,3]){} cpu fp32: no float16 here. "
                          "Kernels that could: slow, fast");
  Decision decision;
  d.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "flaky");
  EXPECT_EQ(decision.rule, "pinned");
}

TEST(Dispatcher, PreferredFallsBackAndSaysWhy) {
  Fixture f;
  Dispatcher d = f.dispatcher(policy_with("activation", KernelRule::preferred({"flaky", "fast"}), f.registry));
  Decision decision;
  d.run("relu", {input(DType::kFloat16)}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "fast");
  EXPECT_EQ(decision.rule, "preferred");
  EXPECT_NE(decision.reason.find("flaky: no float16 here"), std::string::npos) << decision.reason;

  Dispatcher only_flaky = f.dispatcher(policy_with("relu", KernelRule::preferred({"flaky"}), f.registry));
  only_flaky.run("relu", {input(DType::kFloat16)}, {}, nullptr, &decision);
  EXPECT_EQ(decision.rule, "fallback");
  EXPECT_EQ(decision.kernel, "slow");
  EXPECT_NE(decision.reason.find("no preferred kernel could run it (flaky: no float16 here)"), std::string::npos);
}

// A kernel registered last that claims the front for inputs of at least 12 elements (Note [Shape-dependent
// priority]); float16 it cannot run.
class LargeInputsKernel final : public Kernel {
 public:
  explicit LargeInputsKernel(Counters* counters)
      : Kernel(KernelInfo{"relu", "large", "test", DeviceType::kCPU, true, "test kernel"}), counters_(counters) {}
  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (desc.inputs[0].dtype == DType::kFloat16) return Support::no("no float16 here");
    return Support::yes();
  }
  std::string ranks_first(const OpDescriptor& desc) const override {
    return desc.inputs[0].numel() >= 12 ? "large ranks first from 12 elements" : "";
  }
  std::unique_ptr<KernelPlan> build(const OpDescriptor&, const ExecutionPolicy&, const std::string&) const override {
    return std::make_unique<Plan>(counters_);
  }

 private:
  class Plan final : public KernelPlan {
   public:
    explicit Plan(Counters* counters) : counters_(counters) {}
    void run(const KernelLaunch& launch) const override { run_relu(launch, counters_, 0); }

   private:
    Counters* counters_;
  };
  Counters* counters_;
};

TEST(Dispatcher, AKernelMayRankFirstForSomeShapesAndSaysWhy) {
  Fixture f;
  Counters large;
  f.registry.add_kernel(std::make_unique<LargeInputsKernel>(&large));
  Dispatcher d = f.dispatcher(KernelPolicy());
  Decision decision;
  d.run("relu", {input()}, {}, nullptr, &decision);  // 6 elements: registry order
  EXPECT_EQ(decision.kernel, "slow");
  EXPECT_EQ(decision.reason, "first supported kernel in priority order");

  Tensor big = Tensor::empty({4, 3}, DType::kFloat32, Device::cpu());
  for (int i = 0; i < 12; ++i) static_cast<float*>(big.data_ptr())[i] = static_cast<float>(i) - 6.f;
  auto out = d.run("relu", {big}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "large");
  EXPECT_EQ(decision.rule, "first-supported");
  EXPECT_EQ(decision.reason, "first supported kernel in priority order (large ranks first from 12 elements)");
  EXPECT_EQ(large.runs.load(), 1);
  EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[11], 5.0f);
  EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[0], 0.0f);

  // A claim never overrides the policy's own choice, and an unsupported kernel's claim does not count.
  Dispatcher pinned = f.dispatcher(policy_with("relu", KernelRule::pinned("slow"), f.registry));
  pinned.run("relu", {big}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "slow");
  Dispatcher preferred = f.dispatcher(policy_with("relu", KernelRule::preferred({"fast"}), f.registry));
  preferred.run("relu", {big}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "fast");
  Tensor big_half = Tensor::empty({4, 3}, DType::kFloat16, Device::cpu());
  big_half.zero_();
  d.run("relu", {big_half}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "slow");
  EXPECT_EQ(decision.reason, "first supported kernel in priority order");
}

// Note [Timed first choices]: a first choice that asks to be timed (here from 12 elements on) is timed against the
// other supported kernels and the faster kept, saying why; a build cache replays that choice in the next process
// without timing again; a pinned rule and smaller inputs keep the first choice untimed.
TEST(Dispatcher, AFirstChoiceThatAsksToBeTimedIsTimedAgainstTheOthers) {
  const std::string path = ::testing::TempDir() + "xpurt_timed_first_choice.json";
  std::remove(path.c_str());
  Counters slow, fast;
  const auto make_registry = [&](KernelRegistry& registry) {
    register_ops(registry);
    registry.add_kernel(std::make_unique<FunctionKernel>(
        KernelInfo{"relu", "timed_slow", "test", DeviceType::kCPU, true, "test kernel"},
        [](const OpDescriptor&, const ExecutionPolicy&) { return Support::yes(); },
        [&](const KernelLaunch& launch) { run_relu(launch, &slow, 2000); },
        [](const OpDescriptor& desc) { return desc.inputs[0].numel() >= 12 ? std::string("shapes differ") : ""; }));
    registry.add_kernel(std::make_unique<TestKernel>("fast", 0, true, true, &fast));
  };
  Dispatcher::Options options;
  options.autotune_warmup = 1;
  options.autotune_iterations = 3;
  options.build_cache = true;
  Tensor big = Tensor::empty({4, 3}, DType::kFloat32, Device::cpu());
  for (int i = 0; i < 12; ++i) static_cast<float*>(big.data_ptr())[i] = static_cast<float>(i) - 6.f;
  {
    KernelRegistry registry;
    make_registry(registry);
    auto cache = std::make_shared<AutotuneCache>(path);
    Dispatcher d(KernelPolicy{}, {}, cache, &registry, options);
    Decision decision;
    d.run("relu", {input()}, {}, nullptr, &decision);
    EXPECT_EQ(decision.kernel, "timed_slow");
    EXPECT_EQ(decision.rule, "first-supported");
    auto out = d.run("relu", {big}, {}, nullptr, &decision);
    EXPECT_EQ(decision.kernel, "fast");
    EXPECT_EQ(decision.rule, "autotuned");
    EXPECT_NE(decision.reason.find("autotuned: fastest of 2"), std::string::npos) << decision.reason;
    EXPECT_NE(decision.reason.find("timed because shapes differ"), std::string::npos) << decision.reason;
    EXPECT_EQ(slow.runs.load(), 1 + 4);  // the small run, then 1 warm-up + 3 timed
    EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[11], 5.0f);
    Dispatcher pinned(policy_with("relu", KernelRule::pinned("timed_slow"), registry), {}, nullptr, &registry,
                      options);
    pinned.run("relu", {big}, {}, nullptr, &decision);
    EXPECT_EQ(decision.kernel, "timed_slow");
    EXPECT_EQ(decision.rule, "pinned");
    EXPECT_EQ(slow.runs.load(), 6);
  }
  KernelRegistry registry;  // the next process
  make_registry(registry);
  Dispatcher d(KernelPolicy{}, {}, std::make_shared<AutotuneCache>(path), &registry, options);
  Decision decision;
  d.run("relu", {big}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "fast");
  EXPECT_EQ(decision.rule, "autotune-cache");
  EXPECT_EQ(slow.runs.load(), 6);  // not timed again
  std::remove(path.c_str());
}

// A kernel whose supports() says yes but whose build finds no algorithm (Note [Build failures]).
class NoAlgorithmKernel final : public Kernel {
 public:
  NoAlgorithmKernel() : Kernel(KernelInfo{"relu", "no_algo", "test", DeviceType::kCPU, true, "test kernel"}) {}
  Support accepts(const OpDescriptor&, const ExecutionPolicy&) const override { return Support::yes(); }
  std::unique_ptr<KernelPlan> build(const OpDescriptor&, const ExecutionPolicy&, const std::string&) const override {
    throw UnsupportedOperationError("the library has no algorithm for this shape");
  }
};

TEST(Dispatcher, AKernelWhoseBuildFailsIsSkippedUnlessPinned) {
  KernelRegistry registry;
  register_ops(registry);
  Counters fast;
  registry.add_kernel(std::make_unique<NoAlgorithmKernel>());
  registry.add_kernel(std::make_unique<TestKernel>("fast", 0, true, true, &fast));
  const auto make = [&](const KernelPolicy& policy) { return Dispatcher(policy, {}, nullptr, &registry); };

  Decision decision;
  Dispatcher first_supported = make(KernelPolicy{});
  first_supported.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "fast");
  EXPECT_EQ(decision.rule, "first-supported");
  const auto no_algo = std::find_if(decision.candidates.begin(), decision.candidates.end(),
                                    [](const CandidateReport& r) { return r.kernel == "no_algo"; });
  ASSERT_NE(no_algo, decision.candidates.end());
  EXPECT_FALSE(no_algo->supported);
  EXPECT_EQ(no_algo->reason, "plan build failed: the library has no algorithm for this shape");

  KernelPolicy preferred;
  preferred.set("relu", KernelRule::preferred({"no_algo", "fast"}), &registry);
  Dispatcher prefers = make(preferred);
  prefers.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "fast");
  EXPECT_NE(decision.reason.find("no_algo: plan build failed: the library has no algorithm"), std::string::npos)
      << decision.reason;
  for (const CandidateReport& r : decision.candidates) {
    if (r.kernel == "fast") {
      EXPECT_TRUE(r.supported && r.reason.empty()) << r.reason;
    }
  }

  KernelPolicy pinned;
  pinned.set("relu", KernelRule::pinned("no_algo"), &registry);
  Dispatcher pins = make(pinned);
  XPURT_EXPECT_THROW_WITH(pins.run("relu", {input()}, {}), UnsupportedOperationError,
                          "the library has no algorithm for this shape");
}

TEST(Dispatcher, DeterministicModeSkipsNondeterministicKernels) {
  Fixture f;
  ExecutionPolicy ep;
  ep.deterministic = true;
  Dispatcher d = f.dispatcher(policy_with("relu", KernelRule::preferred({"fast"}), f.registry), ep);
  Decision decision;
  d.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "slow");
  EXPECT_EQ(decision.candidates[1].reason, "not deterministic, and ExecutionPolicy.deterministic is on");
  Dispatcher pinned = f.dispatcher(policy_with("relu", KernelRule::pinned("fast"), f.registry), ep);
  XPURT_EXPECT_THROW_WITH(pinned.run("relu", {input()}, {}), UnsupportedOperationError, "not deterministic");
}

TEST(Dispatcher, BestPerformanceTimesOnceThenReplaysFromTheCacheFile) {
  const std::string path = ::testing::TempDir() + "xpurt_autotune_test.json";
  std::remove(path.c_str());
  Fixture f;
  const KernelPolicy policy = policy_with("relu", KernelRule::automatic(AutoSelectStrategy::kBestPerformance), f.registry);
  {
    auto cache = std::make_shared<AutotuneCache>(path);
    Dispatcher d = f.dispatcher(policy, {}, cache);
    Decision decision;
    d.run("relu", {input()}, {}, nullptr, &decision);
    EXPECT_EQ(decision.kernel, "fast");
    EXPECT_EQ(decision.rule, "autotuned");
    EXPECT_GT(decision.candidates[0].time_us, decision.candidates[1].time_us);
    EXPECT_NE(decision.candidates[0].reason.find("slower"), std::string::npos);
    EXPECT_EQ(f.slow.runs.load(), 4);  // 1 warm-up + 3 timed; the float16-less kernel runs too
    EXPECT_EQ(cache->size(), 1u);
    // The same signature again: cached in the dispatcher, no timing.
    d.run("relu", {input()}, {}, nullptr, &decision);
    EXPECT_EQ(f.slow.runs.load(), 4);
  }
  // A new process (new dispatcher, cache loaded from the file): replayed without timing, plan re-created from the
  // recorded plan record.
  Fixture g;
  auto cache = std::make_shared<AutotuneCache>(path);
  EXPECT_EQ(cache->size(), 1u);
  Dispatcher d = g.dispatcher(policy, {}, cache);
  Decision decision;
  d.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "fast");
  EXPECT_EQ(decision.rule, "autotune-cache");
  EXPECT_EQ(g.slow.runs.load(), 0);
  EXPECT_EQ(g.fast.runs.load(), 1);  // the real run only
  EXPECT_EQ(g.fast.last_record, "{\"algo\":7}");
  EXPECT_GT(decision.candidates[0].time_us, 0);  // the recorded timings are shown again
  std::remove(path.c_str());
}

TEST(Dispatcher, MalformedCacheFileIsRejectedClearly) {
  const std::string path = ::testing::TempDir() + "xpurt_bad_cache.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("{\"entries\": 3}", f);
    std::fclose(f);
  }
  XPURT_EXPECT_THROW_WITH(AutotuneCache cache(path), InvalidArgumentError, "is malformed");
  std::remove(path.c_str());
}

TEST(Dispatcher, InvalidInputsAreTypedErrors) {
  Fixture f;
  Dispatcher d = f.dispatcher(KernelPolicy());
  XPURT_EXPECT_THROW_WITH(d.run("rellu", {input()}, {}), InvalidArgumentError, "unknown op 'rellu'; valid ops: ");
  XPURT_EXPECT_THROW_WITH(d.run("matmul", {input(), input()}, {}), InvalidArgumentError, "do not chain");
  XPURT_EXPECT_THROW_WITH(d.run("matmul", {input()}, {}), InvalidArgumentError, "takes 2 inputs (a, b), got 1");
  XPURT_EXPECT_THROW_WITH(d.run("softmax", {input()}, Attributes().set("axis", std::int64_t{5})),
                          InvalidArgumentError, "axis=5 is out of range for a tensor of rank 2");
  XPURT_EXPECT_THROW_WITH(d.run("softmax", {input()}, Attributes().set("axis", std::string("last"))),
                          InvalidTypeError, "attribute 'axis' must be an int");
}

TEST(Ops, FunctionalOpsDispatchThroughTheGlobalRegistry) {
  Tensor a = input();
  Decision decision;
  ops::CallOptions options;
  options.decision = &decision;
  Tensor y = ops::relu(a, options);
  EXPECT_EQ(decision.kernel, "cpu");
  EXPECT_EQ(static_cast<const float*>(y.data_ptr())[5], 2.5f);
  KernelPolicy policy;
  policy.set("relu", "pin:cuda_raw");
  options.kernel_policy = &policy;
  XPURT_EXPECT_THROW_WITH(ops::relu(a, options), UnsupportedOperationError, "pinned kernel 'cuda_raw' cannot run");
}

TEST(Dispatcher, ExternalKernelsValidateButAreSkippedWithTheirReason) {
  Fixture f;
  f.registry.add_external_kernel({"relu", "torch_relu", "pytorch", "PyTorch's relu"});
  EXPECT_NE(f.registry.kernel_names("relu").end(),
            std::find(f.registry.kernel_names("relu").begin(), f.registry.kernel_names("relu").end(), "torch_relu"));
  EXPECT_EQ(f.registry.kernels("relu").size(), 3u);  // names, not kernels: the priority list is unchanged
  Dispatcher preferred = f.dispatcher(policy_with("relu", KernelRule::preferred({"torch_relu", "fast"}), f.registry));
  Decision decision;
  preferred.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "fast");
  EXPECT_EQ(decision.rule, "preferred");
  EXPECT_NE(decision.reason.find("torch_relu: PyTorch's relu: it runs where PyTorch runs the model"),
            std::string::npos);
  ASSERT_EQ(decision.candidates.size(), 4u);
  EXPECT_EQ(decision.candidates[3].kernel, "torch_relu");
  EXPECT_EQ(decision.candidates[3].backend, "pytorch");
  EXPECT_FALSE(decision.candidates[3].supported);
  Dispatcher pinned = f.dispatcher(policy_with("relu", KernelRule::pinned("torch_relu"), f.registry));
  XPURT_EXPECT_THROW_WITH(pinned.run("relu", {input()}, {}), UnsupportedOperationError,
                          "the KernelPolicy pins 'torch_relu' for 'relu': PyTorch's relu");
}

TEST(Dispatcher, RunIntoWritesCallerOutputsAndChecksThem) {
  Fixture f;
  Dispatcher d = f.dispatcher(policy_with("relu", KernelRule::pinned("slow"), f.registry));
  std::vector<Tensor> outputs = {Tensor::zeros({2, 3}, DType::kFloat32, Device::cpu())};
  const void* where = outputs[0].data_ptr();
  Tensor workspace = Tensor::zeros({16}, DType::kUInt8, Device::cpu());
  d.run_into("relu", {input()}, {}, outputs, nullptr, nullptr, &workspace);
  EXPECT_EQ(outputs[0].data_ptr(), where);
  EXPECT_EQ(static_cast<const float*>(outputs[0].data_ptr())[5], 2.5f);
  std::vector<Tensor> wrong = {Tensor::zeros({3, 2}, DType::kFloat32, Device::cpu())};
  XPURT_EXPECT_THROW_WITH(d.run_into("relu", {input()}, {}, wrong), InvalidArgumentError,
                          "expected output 0 as a contiguous float32[2, 3] tensor on cpu, but got float32[3, 2]");
  std::vector<Tensor> none;
  XPURT_EXPECT_THROW_WITH(d.run_into("relu", {input()}, {}, none), InvalidArgumentError, "expected 1 output tensor(s)");
}

TEST(Ops, CallPlanAndCandidatesWithoutRunning) {
  const Tensor a = Tensor::zeros({4, 8}, DType::kFloat32, Device::cpu());
  const Tensor b = Tensor::zeros({8, 5}, DType::kFloat32, Device::cpu());
  const ops::CallPlan plan = ops::plan("matmul", {a, b});
  ASSERT_EQ(plan.outputs.size(), 1u);
  EXPECT_EQ(plan.outputs[0].shape, (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(plan.decision.kernel, "cpu");
  const auto candidates = ops::candidates("matmul", {a, b});
  // cpu is the last real kernel; a build without CUDA lists the GPU kernels it declares after it.
  const auto cpu = std::find_if(candidates.begin(), candidates.end(), [](const auto& c) { return c.kernel == "cpu"; });
  ASSERT_NE(cpu, candidates.end());
  EXPECT_TRUE(cpu->supported);
  std::vector<Tensor> outputs = {Tensor::zeros({4, 5}, DType::kFloat32, Device::cpu())};
  ops::CallOptions options;
  options.outputs = &outputs;
  const auto results = ops::call("matmul", {a, b}, {}, options);
  EXPECT_EQ(results[0].data_ptr(), outputs[0].data_ptr());
}

TEST(Ops, PreparedCallLaunchesOnRawMemoryAndChecksIt) {
  // Plan once on one pair of tensors, launch on other memory of the same shapes.
  const Tensor a0 = Tensor::zeros({3, 5}, DType::kFloat32, Device::cpu());
  const Tensor b0 = Tensor::zeros({5, 2}, DType::kFloat32, Device::cpu());
  const ops::PreparedCall prepared("matmul", {a0, b0});
  EXPECT_EQ(prepared.decision().kernel, "cpu");
  ASSERT_EQ(prepared.outputs().size(), 1u);
  EXPECT_EQ(prepared.outputs()[0].shape, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(prepared.workspace_bytes(), 0u);

  alignas(64) float a[16] = {};
  alignas(64) float b[10] = {};
  for (int k = 0; k < 15; ++k) a[k] = static_cast<float>(k % 7) - 2.5f;
  for (int k = 0; k < 10; ++k) b[k] = static_cast<float>(k % 3) + 0.5f;
  alignas(64) float out[6] = {};
  const void* inputs[] = {a, b};
  void* outputs[] = {out};
  ASSERT_TRUE(prepared.accepts(inputs, 2));
  prepared.launch(inputs, 2, outputs, 1, nullptr, 0, StreamView());
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) {
      float want = 0;
      for (int k = 0; k < 5; ++k) want += a[i * 5 + k] * b[k * 2 + j];
      EXPECT_FLOAT_EQ(out[i * 2 + j], want) << i << "," << j;
    }
  }

  // Less aligned than prepared (4 bytes): refused before anything runs.
  const void* misaligned[] = {a + 1, b};
  EXPECT_FALSE(prepared.accepts(misaligned, 2));
  XPURT_EXPECT_THROW_WITH(prepared.launch(misaligned, 2, outputs, 1, nullptr, 0, StreamView()), InvalidArgumentError,
                          "less aligned than when prepared");
  const void* absent[] = {a, nullptr};
  EXPECT_FALSE(prepared.accepts(absent, 2));
  XPURT_EXPECT_THROW_WITH(prepared.launch(inputs, 1, outputs, 1, nullptr, 0, StreamView()), InvalidArgumentError,
                          "takes 2 input(s) and 1 output(s), but got 1 and 1");
  void* null_outputs[] = {nullptr};
  XPURT_EXPECT_THROW_WITH(prepared.launch(inputs, 2, null_outputs, 1, nullptr, 0, StreamView()), InvalidArgumentError,
                          "output 0 is null");
  // Bad inputs fail when preparing, with the op's own error.
  XPURT_EXPECT_THROW_WITH(ops::PreparedCall("matmul", {a0, a0}), InvalidArgumentError, "matmul");
}

TEST(Ops, PreparedCallCEntryLaunchesAndReportsErrorsAsCodes) {
  // xpurt_prepared_call_launch: what code built apart from xpuruntime (xpuruntime.pytorch's native path) calls.
  const Tensor a0 = Tensor::zeros({2, 3}, DType::kFloat32, Device::cpu());
  const Tensor b0 = Tensor::zeros({3, 4}, DType::kFloat32, Device::cpu());
  const ops::PreparedCall prepared("matmul", {a0, b0});
  alignas(64) float a[6] = {1, 2, 3, 4, 5, 6};
  alignas(64) float b[12] = {1, 0, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1};
  alignas(64) float out[8] = {};
  const void* inputs[] = {a, b};
  void* outputs[] = {out};
  char message[256] = "untouched";
  EXPECT_EQ(ops::xpurt_prepared_call_launch(&prepared, inputs, 2, outputs, 1, nullptr, 0, nullptr, message,
                                            sizeof(message)),
            0);
  EXPECT_STREQ(message, "untouched");
  const float want[8] = {1, 2, 3, 6, 4, 5, 6, 15};
  for (int k = 0; k < 8; ++k) EXPECT_FLOAT_EQ(out[k], want[k]) << k;
  // A wrong count is InvalidArgument (code + 1), with the message, and never throws.
  const int rc = ops::xpurt_prepared_call_launch(&prepared, inputs, 1, outputs, 1, nullptr, 0, nullptr, message,
                                                 sizeof(message));
  EXPECT_EQ(rc, static_cast<int>(ErrorCode::kInvalidArgument) + 1);
  EXPECT_NE(std::string(message).find("takes 2 input(s)"), std::string::npos) << message;
  char tiny[8];
  EXPECT_NE(ops::xpurt_prepared_call_launch(&prepared, inputs, 1, outputs, 1, nullptr, 0, nullptr, tiny, sizeof(tiny)),
            0);
  EXPECT_EQ(std::string(tiny).size(), 7u);  // truncated, NUL-terminated
}

namespace {

// A CPU "relu" with tactics (Note [Tactics]): its default plan is slow, one tactic faster, one fastest, and one
// tactic's record its build refuses.
class TacticKernel final : public Kernel {
 public:
  explicit TacticKernel(Counters* counters)
      : Kernel(KernelInfo{"relu", "tuned", "test", DeviceType::kCPU, true, "test kernel with tactics"}),
        counters_(counters) {}
  Support accepts(const OpDescriptor&, const ExecutionPolicy&) const override { return Support::yes(); }
  std::unique_ptr<KernelPlan> build(const OpDescriptor&, const ExecutionPolicy&,
                                    const std::string& record) const override {
    ++counters_->builds;
    counters_->last_record = record;
    if (record == "{\"tactic\":\"gone\"}") throw UnsupportedOperationError("this tactic is not available here");
    const std::string chosen = record.empty() ? "{\"tactic\":0}" : record;
    const int delay_us = chosen == "{\"tactic\":0}" ? 3000 : chosen == "{\"tactic\":1}" ? 1500 : 0;
    return std::make_unique<Plan>(counters_, chosen, delay_us);
  }
  std::vector<std::string> tactics(const OpDescriptor&, const ExecutionPolicy&) const override {
    return {"{\"tactic\":0}", "{\"tactic\":1}", "{\"tactic\":\"gone\"}", "{\"tactic\":2}"};
  }

 private:
  class Plan final : public KernelPlan {
   public:
    Plan(Counters* counters, std::string record, int delay_us)
        : counters_(counters), record_(std::move(record)), delay_us_(delay_us) {}
    void run(const KernelLaunch& launch) const override { run_relu(launch, counters_, delay_us_); }
    std::string record() const override { return record_; }
    std::string describe() const override { return "tactic plan " + record_; }

   private:
    Counters* counters_;
    std::string record_;
    int delay_us_;
  };
  Counters* counters_;
};

}  // namespace

TEST(Dispatcher, BestPerformanceTimesEachKernelsTacticsAndReplaysTheWinner) {
  const std::string path = ::testing::TempDir() + "xpurt_tactics_test.json";
  std::remove(path.c_str());
  Counters counters;
  KernelRegistry registry;
  register_ops(registry);
  registry.add_kernel(std::make_unique<TacticKernel>(&counters));
  Dispatcher::Options options;
  options.autotune_warmup = 1;
  options.autotune_iterations = 3;
  const KernelPolicy tuned =
      policy_with("relu", KernelRule::automatic(AutoSelectStrategy::kBestPerformance), registry);
  {
    Dispatcher d(tuned, {}, std::make_shared<AutotuneCache>(path), &registry, options);
    Decision decision;
    const std::vector<Tensor> out = d.run("relu", {input()}, {}, nullptr, &decision);
    EXPECT_EQ(decision.kernel, "tuned");
    EXPECT_EQ(decision.rule, "autotuned");
    EXPECT_EQ(decision.plan_record, "{\"tactic\":2}");
    EXPECT_NE(decision.reason.find("tuned: the fastest of 3 tactics"), std::string::npos) << decision.reason;
    EXPECT_LT(decision.candidates[0].time_us, 1000.0);  // the fastest tactic's time
    EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[5], 2.5f);
  }
  // Replayed from the cache: the winning tactic's plan is re-created from its record, nothing is timed.
  counters.runs = 0;
  Dispatcher replay(tuned, {}, std::make_shared<AutotuneCache>(path), &registry, options);
  Decision decision;
  replay.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.rule, "autotune-cache");
  EXPECT_EQ(decision.plan_record, "{\"tactic\":2}");
  EXPECT_EQ(counters.last_record, "{\"tactic\":2}");
  EXPECT_EQ(counters.runs.load(), 1);
  // A pinned rule times nothing and gets the default plan.
  counters.runs = 0;
  Dispatcher pinned(policy_with("relu", KernelRule::pinned("tuned"), registry), {}, nullptr, &registry, options);
  pinned.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.plan_record, "{\"tactic\":0}");
  EXPECT_EQ(counters.runs.load(), 1);
  std::remove(path.c_str());
}

// A "relu" descriptor of a [rows, 3] float32 input on the CPU.
OpDescriptor relu_of_rows(std::int64_t rows) {
  OpDescriptor desc;
  desc.op = "relu";
  desc.device = Device::cpu();
  desc.inputs.push_back(TensorDesc::contiguous({rows, 3}, DType::kFloat32, Device::cpu()));
  return desc;
}

// `kernel`, added to `registry` (which keeps it).
template <typename K>
const K* add_kernel(KernelRegistry& registry, std::unique_ptr<K> kernel) {
  const K* added = kernel.get();
  registry.add_kernel(std::move(kernel));
  return added;
}

// A kernel whose plan build takes 30 ms and records how many builds ran at once; it refuses to build for inputs
// with 5 rows (a library finding no algorithm, Note [Build failures]).
class SlowBuildKernel final : public Kernel {
 public:
  SlowBuildKernel() : Kernel(KernelInfo{"relu", "slow_build", "test", DeviceType::kCPU, true, "test kernel"}) {}
  Support accepts(const OpDescriptor&, const ExecutionPolicy&) const override { return Support::yes(); }
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string&) const override {
    const int now = ++building;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    --building;
    ++builds;
    if (desc.inputs[0].shape[0] == 5) throw UnsupportedOperationError("no algorithm for 5 rows");
    return std::make_unique<Plan>();
  }
  mutable std::atomic<int> building{0}, most{0}, builds{0};

 private:
  class Plan final : public KernelPlan {
   public:
    void run(const KernelLaunch&) const override {}
    std::string describe() const override { return "slow build plan"; }
  };
};

// Note [Parallel kernel selection]: threads deciding different signatures build at once; a thread asking for a
// signature another thread is deciding waits and gets the same dispatch (one build per signature); a failed
// decision reaches every waiting thread and is not cached; decisions() lists them in the order first asked for.
TEST(Dispatcher, ThreadsDecideDistinctSignaturesAtOnceAndShareTheirDecisions) {
  KernelRegistry registry;
  register_ops(registry);
  const SlowBuildKernel* kernel = add_kernel(registry, std::make_unique<SlowBuildKernel>());
  Dispatcher d(KernelPolicy(), ExecutionPolicy(), nullptr, &registry, Dispatcher::Options{});
  const std::vector<std::int64_t> rows = {1, 2, 3, 4, 5};
  std::vector<std::shared_ptr<const Dispatch>> got(rows.size() * 2);
  std::vector<std::string> errors(rows.size() * 2);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      OpDescriptor desc = relu_of_rows(rows[t % rows.size()]);
      try {
        got[t] = d.select(desc);
      } catch (const UnsupportedOperationError& e) {
        errors[t] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GE(kernel->most.load(), 2);  // builds overlapped
  EXPECT_LE(kernel->builds.load(), 6);  // 4 good signatures once each; the failing one once or twice
  for (std::size_t t = 0; t < got.size(); ++t) {
    if (rows[t % rows.size()] == 5) {
      EXPECT_EQ(got[t], nullptr);
      EXPECT_NE(errors[t].find("no algorithm for 5 rows"), std::string::npos) << errors[t];
      continue;
    }
    ASSERT_NE(got[t], nullptr) << errors[t];
    EXPECT_EQ(got[t], got[t % rows.size() == t ? t + rows.size() : t - rows.size()]);  // one dispatch per signature
  }
  std::set<std::string> listed;
  for (const Decision& decision : d.decisions()) listed.insert(decision.signature);
  EXPECT_EQ(listed.size(), 4u);
  // The failure was not cached: asking again builds again.
  const int before = kernel->builds.load();
  OpDescriptor desc = relu_of_rows(5);
  XPURT_EXPECT_THROW_WITH(d.select(desc), UnsupportedOperationError, "no algorithm for 5 rows");
  EXPECT_EQ(kernel->builds.load(), before + 1);
}

// A kernel whose plans keep the record they were built from and that refuses records saying "stale" (a library
// that no longer has the recorded algorithm).
class RecordKernel final : public Kernel {
 public:
  RecordKernel() : Kernel(KernelInfo{"relu", "recorded", "test", DeviceType::kCPU, true, "test kernel"}) {}
  Support accepts(const OpDescriptor&, const ExecutionPolicy&) const override { return Support::yes(); }
  std::unique_ptr<KernelPlan> build(const OpDescriptor&, const ExecutionPolicy&,
                                    const std::string& record) const override {
    records.push_back(record);
    if (record.find("stale") != std::string::npos) throw UnsupportedOperationError("no such algorithm here");
    return std::make_unique<Plan>(record.empty() ? std::string("{\"algo\":\"fresh\"}") : record);
  }
  mutable std::vector<std::string> records;

 private:
  class Plan final : public KernelPlan {
   public:
    explicit Plan(std::string record) : record_(std::move(record)) {}
    void run(const KernelLaunch&) const override {}
    std::string record() const override { return record_; }
    std::string describe() const override { return "recorded plan " + record_; }

   private:
    std::string record_;
  };
};

// Note [Build cache]: with Options::build_cache the autotune cache re-creates the plan of the kernel the rule picks
// from its record, a first-supported rule still picks by priority (and says so), a record the kernel refuses is
// built afresh, and new decisions are stored.
TEST(Dispatcher, ABuildCacheReplaysPlansButNotChoicesAndSurvivesStaleRecords) {
  KernelRegistry registry;
  register_ops(registry);
  const RecordKernel* kernel = add_kernel(registry, std::make_unique<RecordKernel>());
  Counters other;
  registry.add_kernel(std::make_unique<TestKernel>("other", 0, true, true, &other));
  const auto descriptor = [](std::int64_t rows) {
    OpDescriptor desc = relu_of_rows(rows);
    desc.precision = Precision::kFP32;
    return desc;
  };
  auto cache = std::make_shared<AutotuneCache>();
  cache->store(AutotuneCache::key(descriptor(1)), {"recorded", "{\"algo\":\"cached\"}", {}});
  cache->store(AutotuneCache::key(descriptor(2)), {"recorded", "{\"algo\":\"stale\"}", {}});
  cache->store(AutotuneCache::key(descriptor(3)), {"other", "{\"algo\":7}", {}});
  Dispatcher::Options options;
  options.build_cache = true;
  Dispatcher d(KernelPolicy(), ExecutionPolicy(), cache, &registry, options);

  OpDescriptor one = descriptor(1);
  auto replayed = d.select(one);
  EXPECT_EQ(replayed->decision.kernel, "recorded");
  EXPECT_EQ(replayed->decision.rule, "first-supported");
  EXPECT_EQ(replayed->decision.plan_record, "{\"algo\":\"cached\"}");

  OpDescriptor two = descriptor(2);
  auto rebuilt = d.select(two);  // the stale record is refused, then built afresh: no error
  EXPECT_EQ(rebuilt->decision.plan_record, "{\"algo\":\"fresh\"}");
  ASSERT_GE(kernel->records.size(), 3u);
  EXPECT_EQ(kernel->records[kernel->records.size() - 2], "{\"algo\":\"stale\"}");
  EXPECT_EQ(kernel->records.back(), "");

  OpDescriptor three = descriptor(3);  // the cache names another kernel: priority still picks "recorded"
  auto by_priority = d.select(three);
  EXPECT_EQ(by_priority->decision.kernel, "recorded");
  EXPECT_EQ(by_priority->decision.rule, "first-supported");
  EXPECT_EQ(other.builds.load(), 0);

  OpDescriptor four = descriptor(4);  // a new decision goes into the cache
  d.select(four);
  AutotuneCache::Entry stored;
  ASSERT_TRUE(cache->lookup(AutotuneCache::key(descriptor(4)), &stored));
  EXPECT_EQ(stored.kernel, "recorded");
  EXPECT_EQ(stored.plan_record, "{\"algo\":\"fresh\"}");

  // Without build_cache the same stale record is an error naming the cache (a lock file must replay exactly).
  Dispatcher strict(KernelPolicy(), ExecutionPolicy(), cache, &registry, Dispatcher::Options{});
  OpDescriptor again = descriptor(2);
  cache->store(AutotuneCache::key(descriptor(2)), {"recorded", "{\"algo\":\"stale\"}", {}});
  XPURT_EXPECT_THROW_WITH(strict.select(again), UnsupportedOperationError, "cannot be re-created");
}

// ---- kernel declarations (Note [Kernel declarations] in kernel_registry.cpp) ----

namespace {

// A CPU relu that declares `decl`, counting how often its accepts() is asked (only when the declaration holds).
class DeclaredKernel final : public Kernel {
 public:
  DeclaredKernel(KernelDecl decl, std::atomic<int>* asked)
      : Kernel(KernelInfo{"relu", "declared", "test", DeviceType::kCPU, true, "declared test kernel", std::move(decl)}),
        asked_(asked) {}
  Support accepts(const OpDescriptor&, const ExecutionPolicy&) const override {
    ++*asked_;
    return Support::yes();
  }
  std::unique_ptr<KernelPlan> build(const OpDescriptor&, const ExecutionPolicy&, const std::string&) const override {
    return std::make_unique<ReluPlan>();
  }

 private:
  class ReluPlan final : public KernelPlan {
   public:
    void run(const KernelLaunch& launch) const override {
      Counters counters;
      run_relu(launch, &counters, 0);
    }
  };
  std::atomic<int>* asked_;
};

// A registry with the declared relu first and an undeclared one ("plain") after it.
struct DeclFixture {
  KernelRegistry registry;
  std::atomic<int> asked{0};
  Counters plain;
  explicit DeclFixture(KernelDecl decl) {
    register_ops(registry);
    decl.subject = "declared relu";
    decl.input_names = {"x"};
    registry.add_kernel(std::make_unique<DeclaredKernel>(std::move(decl), &asked));
    registry.add_kernel(std::make_unique<TestKernel>("plain", 0, true, true, &plain));
  }
  // The declared kernel's candidate report for relu of `x` (compute capability `cc`: a CPU descriptor has none).
  CandidateReport report(const TensorDesc& x, int cc = 0) {
    Dispatcher d(KernelPolicy(), ExecutionPolicy(), nullptr, &registry);
    OpDescriptor desc;
    desc.op = "relu";
    desc.device = Device::cpu();
    desc.inputs = {x};
    desc.compute_capability = cc;
    for (const CandidateReport& r : d.candidates(desc)) {
      if (r.kernel == "declared") return r;
    }
    ADD_FAILURE() << "no candidate 'declared'";
    return {};
  }
};

TensorDesc cpu_tensor(const std::vector<std::int64_t>& shape, DType dtype = DType::kFloat32) {
  return TensorDesc::contiguous(shape, dtype, Device::cpu());
}

}  // namespace

TEST(KernelDeclaration, ADtypeOutsideTheDeclaredSetIsTheReasonAndAcceptsIsNotAsked) {
  KernelDecl decl;
  decl.dtypes = {{DType::kFloat32}, ""};
  DeclFixture f(decl);
  const CandidateReport r = f.report(cpu_tensor({2, 3}, DType::kFloat16));
  EXPECT_FALSE(r.supported);
  EXPECT_EQ(r.reason, "declared relu takes float32, got float16 for input 'x'");
  EXPECT_EQ(f.asked.load(), 0);
  // The dispatcher falls through to the next kernel, as for any refusal.
  Dispatcher d(KernelPolicy(), ExecutionPolicy(), nullptr, &f.registry);
  Decision decision;
  d.run("relu", {input(DType::kFloat16)}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "plain");
  // A set's text is what reasons name it by.
  decl.dtypes = {{DType::kFloat32, DType::kBFloat16}, "float32 and bfloat16 (the kernel's own words)"};
  DeclFixture worded(decl);
  EXPECT_EQ(worded.report(cpu_tensor({2}, DType::kFloat16)).reason,
            "declared relu takes float32 and bfloat16 (the kernel's own words), got float16 for input 'x'");
}

TEST(KernelDeclaration, RankLayoutAndAlignmentAreNamed) {
  KernelDecl ranks;
  ranks.input_ranks = {{3, 4}};
  EXPECT_EQ(DeclFixture(ranks).report(cpu_tensor({2, 3})).reason,
            "declared relu takes input 'x' of rank 3 to 4, got float32[2,3]");
  ranks.input_ranks = {{0, 1}};
  EXPECT_EQ(DeclFixture(ranks).report(cpu_tensor({2, 3})).reason,
            "declared relu takes input 'x' of rank up to 1, got float32[2,3]");

  KernelDecl contiguous;
  contiguous.layout = Layout::kContiguous;
  TensorDesc transposed = cpu_tensor({3, 2});
  transposed.strides = {1, 3};
  EXPECT_NE(DeclFixture(contiguous).report(transposed).reason.find("declared relu needs contiguous input 'x'"),
            std::string::npos);
  KernelDecl channels_last;
  channels_last.layout = Layout::kChannelsLast;
  TensorDesc nhwc = cpu_tensor({2, 3, 4, 5});
  EXPECT_NE(DeclFixture(channels_last).report(nhwc).reason.find("needs channels-last input 'x'"), std::string::npos);
  nhwc.strides = {60, 1, 15, 3};
  EXPECT_TRUE(DeclFixture(channels_last).report(nhwc).supported);

  KernelDecl aligned;
  aligned.alignment = 64;
  TensorDesc offset = cpu_tensor({2, 3});
  offset.alignment = 16;
  EXPECT_EQ(DeclFixture(aligned).report(offset).reason,
            "declared relu needs 64-byte aligned data; input 'x' is 16-byte aligned (a view at an offset?): copy it "
            "to a fresh tensor");
  KernelDecl element;
  element.element_aligned = true;
  offset.alignment = 2;
  EXPECT_NE(DeclFixture(element).report(offset).reason.find("needs 4-byte aligned data; input 'x' is 2-byte aligned"),
            std::string::npos);
  KernelDecl rows;
  rows.inner_alignment = 16;
  EXPECT_EQ(DeclFixture(rows).report(cpu_tensor({2, 3})).reason,
            "declared relu needs the innermost dim of input 'x' in multiples of 16 bytes, got 12 bytes (float32[2,3])");
  EXPECT_TRUE(DeclFixture(rows).report(cpu_tensor({2, 4})).supported);
}

TEST(KernelDeclaration, AComputeCapabilityBelowTheDeclaredOneIsNamedWhenKnown) {
  KernelDecl decl;
  decl.min_compute_capability = 80;
  EXPECT_EQ(DeclFixture(decl).report(cpu_tensor({2}), 75).reason,
            "declared relu needs compute capability 8.0 or newer, this device has 7.5");
  EXPECT_TRUE(DeclFixture(decl).report(cpu_tensor({2}), 0).supported);  // unknown: not refused
  EXPECT_TRUE(DeclFixture(decl).report(cpu_tensor({2}), 90).supported);
  decl.built_for_architectures = true;
  EXPECT_EQ(DeclFixture(decl).report(cpu_tensor({2}), 75).reason,
            "declared relu was built for sm_80 and newer, this device is sm_75; rebuild with "
            "-DCMAKE_CUDA_ARCHITECTURES=75");
}

TEST(KernelDeclaration, ADeclarationThatHoldsReachesAccepts) {
  KernelDecl decl;
  decl.dtypes = {{DType::kFloat32, DType::kFloat16}, ""};
  decl.input_ranks = {{1, 4}};
  decl.layout = Layout::kContiguous;
  decl.alignment = 16;
  decl.min_compute_capability = 80;
  decl.no_int8 = true;
  DeclFixture f(decl);
  const CandidateReport r = f.report(cpu_tensor({2, 3}), 90);
  EXPECT_TRUE(r.supported) << r.reason;
  EXPECT_EQ(f.asked.load(), 1);
  Dispatcher d(KernelPolicy(), ExecutionPolicy(), nullptr, &f.registry);
  Decision decision;
  const auto out = d.run("relu", {input()}, {}, nullptr, &decision);
  EXPECT_EQ(decision.kernel, "declared");
  EXPECT_EQ(static_cast<const float*>(out[0].data_ptr())[5], 2.5f);
}

TEST(KernelDeclaration, DeviceInt8AndDtypeRulesAcrossInputs) {
  KernelDecl decl;
  decl.subject = "k";
  decl.input_names = {"a", "b"};
  decl.on_device = true;
  decl.no_int8 = true;
  OpDescriptor desc;
  desc.op = "add";
  desc.device = Device::cpu();
  desc.inputs = {cpu_tensor({2}), cpu_tensor({2}, DType::kInt32)};
  const ExecutionPolicy policy;
  EXPECT_EQ(check_declaration(decl, DeviceType::kCUDA, desc, policy).reason(),
            "k runs on CUDA devices; the input is on cpu");
  ExecutionPolicy int8;
  int8.precision = Precision::kInt8;
  EXPECT_EQ(check_declaration(decl, DeviceType::kCPU, desc, int8).reason(),
            "k has no int8 kernel; use precision fp32, tf32, fp16 or bf16");
  desc.device = Device::cuda(0);
  desc.inputs[0].device = Device::cuda(0);
  EXPECT_EQ(check_declaration(decl, DeviceType::kCUDA, desc, policy).reason(),
            "k runs on CUDA devices; input 'b' is on cpu");
  desc.inputs[1].device = Device::cuda(0);
  EXPECT_TRUE(check_declaration(decl, DeviceType::kCUDA, desc, policy));
  decl.one_dtype = true;
  EXPECT_EQ(check_declaration(decl, DeviceType::kCUDA, desc, policy).reason(),
            "k takes inputs of one dtype; input 'b' is int32, input 'a' is float32");
  decl.one_dtype = false;
  decl.input_dtypes = {{}, {{DType::kInt64}, ""}};
  EXPECT_EQ(check_declaration(decl, DeviceType::kCUDA, desc, policy).reason(),
            "k takes int64 for input 'b', got int32");
  // An absent input is not checked.
  desc.inputs[1] = TensorDesc();
  EXPECT_TRUE(check_declaration(decl, DeviceType::kCUDA, desc, policy));
}
