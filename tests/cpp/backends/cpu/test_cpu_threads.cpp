// The cpu backend's worker threads (backends/cpu/cpu_threads.cpp, Note [CPU worker threads]) seen through its
// kernels: every kernel gives the same bits on 1 thread (the serial path, one unsplit OpenBLAS call: what it gave
// before the pool) as on 2, 3 or 7 threads, with spinning on or off, on shapes that make loops of one chunk, of a few
// and of many, except large OpenBLAS GEMMs, whose blocks follow the thread count (Note [Parallel GEMM blocks]): those
// give the same bits run after run and agree with one call to rounding; loops started by several threads at once
// all complete; exceptions and stop requests raised on a worker reach the caller; and the plan says how many threads
// it uses and whether they spin.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_threads.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/run_options.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

Tensor random_tensor(const Shape& shape, unsigned seed) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

std::vector<std::uint32_t> bits(const Tensor& t) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.data_ptr(), out.size() * sizeof(std::uint32_t));
  return out;
}

ExecutionPolicy threads_policy(int threads, bool spin = true) {
  ExecutionPolicy policy;
  policy.intra_op_threads = threads;
  policy.allow_spinning = spin;
  return policy;
}


struct Case {
  std::string op;
  std::vector<Tensor> inputs;
  Attributes attrs;
};

// Runs the cpu kernel of `c` under `policy`; `plan_description` receives the plan's describe().
Tensor run(const Case& c, const ExecutionPolicy& policy, std::string* plan_description = nullptr) {
  OpDescriptor desc;
  desc.op = c.op;
  const std::size_t count = KernelRegistry::global().schema(c.op).inputs.size();
  std::vector<Tensor> inputs = c.inputs;
  inputs.resize(count);
  for (const Tensor& input : inputs) desc.inputs.push_back(TensorDesc::of(input));
  desc.attrs = c.attrs;
  desc.device = c.inputs[0].device();
  KernelRegistry::global().infer(desc);
  const Kernel* kernel = KernelRegistry::global().find_kernel(c.op, "cpu");
  if (kernel == nullptr) throw InvalidArgumentError("no cpu kernel for " + c.op);
  auto plan = kernel->build(desc, policy, "");
  if (plan_description != nullptr) *plan_description = plan->describe();
  std::vector<Tensor> outputs;
  for (const auto& out : desc.outputs) outputs.push_back(Tensor::empty(out.shape, out.dtype));
  plan->execute(desc, inputs, outputs);
  return outputs[0];
}

Attributes conv_attrs(std::int64_t pad, std::int64_t stride, const std::string& activation = "none") {
  return Attributes()
      .set("pads", Shape{pad, pad, pad, pad})
      .set("strides", Shape{stride, stride})
      .set("activation", activation);
}

// Ops and shapes: loops of one chunk (small), a few and many; GEMMs whole (small) and in blocks (large); odd sizes.
std::vector<Case> cases() {
  unsigned seed = 100;
  auto t = [&](const Shape& shape) { return random_tensor(shape, seed++); };
  const Attributes pool3 = Attributes().set("kernel_shape", Shape{3, 3}).set("strides", Shape{2, 2}).set(
      "pads", Shape{1, 1, 1, 1});
  return {
      {"conv2d", {t({1, 3, 7, 5}), t({4, 3, 3, 3})}, conv_attrs(1, 1)},
      {"conv2d", {t({2, 16, 33, 31}), t({24, 16, 3, 3}), t({24})}, conv_attrs(1, 2, "relu")},
      {"conv2d", {t({1, 64, 56, 56}), t({64, 64, 3, 3}), t({64})}, conv_attrs(1, 1, "relu")},
      {"conv2d", {t({1, 96, 19, 23}), t({160, 96, 1, 1})}, conv_attrs(0, 1)},
      {"max_pool2d", {t({1, 3, 9, 11})}, pool3},
      {"max_pool2d", {t({2, 64, 57, 55})}, pool3},
      {"avg_pool2d", {t({1, 32, 31, 29})}, pool3},
      {"matmul", {t({5, 7}), t({7, 3})}, {}},
      {"matmul", {t({97, 300}), t({300, 270})}, {}},
      {"matmul", {t({1031, 129}), t({129, 67})}, {}},
      {"matmul", {t({4, 65, 200}), t({4, 200, 129})}, {}},
      {"linear", {t({3, 384}), t({1500, 384}), t({1500})}, Attributes().set("activation", std::string("gelu"))},
      {"linear", {t({200, 513}), t({257, 513})}, {}},
      {"softmax", {t({3, 5})}, Attributes().set("axis", std::int64_t{-1})},
      {"softmax", {t({257, 1001})}, Attributes().set("axis", std::int64_t{-1})},
      {"layer_norm", {t({129, 768}), t({768}), t({768})}, Attributes().set("axis", std::int64_t{-1})},
      {"add", {t({7, 1, 513}), t({65, 1})}, {}},
      {"gelu", {t({3, 100003})}, {}},
      {"reduce_mean", {t({64, 33, 129})}, Attributes().set("axes", Shape{1}).set("keepdims", std::int64_t{0})},
      // Whole heads per thread at 2 and 3 threads (6 heads), heads in turn at 7 (Note [Attention heads over the
      // threads]); 45 keys, causal, a mask: rows of every length
      {"attention", {t({2, 3, 37, 16}), t({2, 3, 45, 16}), t({2, 3, 45, 16}), t({37, 45})},
       Attributes().set("causal", std::int64_t{1})},
      {"attention", {t({1, 2, 9, 8}), t({1, 2, 9, 8}), t({1, 2, 9, 8})}, {}},
  };
}

std::string name(const Case& c) {
  std::string text = c.op + " [";
  for (const Tensor& input : c.inputs) {
    text += " (";
    for (std::int64_t d : input.shape()) text += std::to_string(d) + ",";
    text += ")";
  }
  return text + " ]";
}

// The ops whose bits may follow the thread count: those that run an OpenBLAS GEMM of more than 4M multiply-adds
// (Note [Parallel GEMM blocks]: its blocks follow the thread count; every other loop does not).
bool blas_blocks(const Case& c) {
  const auto& x = c.inputs[0].shape();
  const auto& w = c.inputs[1].shape();
  if (c.op == "conv2d") return w[0] * (x[2] * x[3]) * (w[1] * w[2] * w[3]) >= (std::int64_t{1} << 22);
  if (c.op == "matmul") return x[x.size() - 2] * w.back() * x.back() >= (std::int64_t{1} << 22);
  if (c.op == "linear") return x[0] * w[0] * x[1] >= (std::int64_t{1} << 22);
  return false;
}

TEST(CpuThreads, SameBitsOnEveryThreadCountAndSpinSetting) {
  for (const char* gemm : {"auto", "fallback"}) {
    ScopedEnv env("XPURT_CPU_GEMM", gemm);
    for (const Case& c : cases()) {
      const std::vector<std::uint32_t> serial = bits(run(c, threads_policy(1)));
      const bool by_threads = std::string(gemm) == "auto" && blas_blocks(c);
      for (int threads : {2, 3, 7}) {
        const std::vector<std::uint32_t> first = bits(run(c, threads_policy(threads, true)));
        EXPECT_EQ(bits(run(c, threads_policy(threads, false))), first)
            << name(c) << " gemm=" << gemm << " threads=" << threads << ": spinning changed the bits";
        EXPECT_EQ(bits(run(c, threads_policy(threads, true))), first)
            << name(c) << " gemm=" << gemm << " threads=" << threads << ": not the same bits run after run";
        if (!by_threads) {
          EXPECT_EQ(first, serial) << name(c) << " gemm=" << gemm << " threads=" << threads;
        }
      }
      if (!by_threads) {
        EXPECT_EQ(bits(run(c, threads_policy(0))), serial) << name(c) << " gemm=" << gemm << " default threads";
      }
    }
  }
}

// An OpenBLAS GEMM in blocks computes what one call computes, to float32 rounding.
TEST(CpuThreads, BlockedGemmsMatchOneCall) {
  ScopedEnv env("XPURT_CPU_GEMM", "auto");
  for (const Case& c : cases()) {
    if (!blas_blocks(c)) continue;
    const Tensor one = run(c, threads_policy(1));
    const Tensor blocked = run(c, threads_policy(7));
    const auto* a = static_cast<const float*>(one.data_ptr());
    const auto* b = static_cast<const float*>(blocked.data_ptr());
    for (std::int64_t i = 0; i < one.numel(); ++i) {
      ASSERT_NEAR(a[i], b[i], 1e-4f * (1.0f + std::fabs(a[i]))) << name(c) << " at " << i;
    }
  }
}

TEST(CpuThreads, LoopsStartedByManyThreadsAtOnceAllComplete) {
  const std::vector<Case> all = cases();
  std::vector<std::vector<std::vector<std::uint32_t>>> expected(5);  // [threads][case], alone on the pool
  for (int threads = 2; threads <= 4; ++threads) {
    for (const Case& c : all) expected[threads].push_back(bits(run(c, threads_policy(threads))));
  }
  constexpr int kCallers = 6;
  std::vector<int> mismatches(kCallers, 0);
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (std::size_t i = 0; i < all.size(); ++i) {
          if (bits(run(all[i], threads_policy(2 + t % 3, t % 2 == 0))) != expected[2 + t % 3][i]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  for (int t = 0; t < kCallers; ++t) EXPECT_EQ(mismatches[t], 0) << "caller " << t;
}

TEST(CpuThreads, ErrorsOnWorkersReachTheCaller) {
  // softmax's chunks make scratch rows (ScratchVector) under the caller's budget, on whichever thread runs them.
  const Case softmax{"softmax", {random_tensor({512, 4001}, 7)}, Attributes().set("axis", std::int64_t{-1})};
  {
    const MemoryBudgetScope scope(std::make_shared<MemoryBudget>(1024, "a 1 KiB test budget"));
    XPURT_EXPECT_THROW_WITH(run(softmax, threads_policy(4)), OutOfMemoryError, "1 KiB test budget");
  }
  {
    RunStop stop;
    stop.interrupt();
    const RunStopScope scope(&stop);
    EXPECT_THROW(run(softmax, threads_policy(4)), RunTerminatedError);
  }
  // The pool is fine afterwards.
  EXPECT_EQ(bits(run(softmax, threads_policy(4))), bits(run(softmax, threads_policy(1))));
}

TEST(CpuThreads, PlanSaysItsThreadsAndSpinning) {
  const Case c{"max_pool2d", {random_tensor({1, 8, 16, 16}, 3)}, Attributes().set("kernel_shape", Shape{2, 2})};
  std::string described;
  run(c, threads_policy(3, false), &described);
  EXPECT_NE(described.find("3 threads, no spinning"), std::string::npos) << described;
  run(c, threads_policy(3, true), &described);
  EXPECT_NE(described.find("3 threads"), std::string::npos) << described;
  EXPECT_EQ(described.find("spinning"), std::string::npos) << described;
  run(c, threads_policy(1, false), &described);
  EXPECT_NE(described.find("1 thread"), std::string::npos) << described;
}

TEST(CpuThreads, AllowSpinningIsAPolicyField) {
  ExecutionPolicy policy;
  EXPECT_TRUE(policy.allow_spinning);
  EXPECT_EQ(policy.to_json().find("allow_spinning"), std::string::npos);  // old policies keep their bytes
  policy.allow_spinning = false;
  EXPECT_NE(policy.to_json().find("\"allow_spinning\": false"), std::string::npos) << policy.to_json();
  EXPECT_EQ(ExecutionPolicy::from_json(policy.to_json()), policy);
  EXPECT_EQ(ExecutionPolicy::from_yaml(policy.to_yaml()), policy);
  EXPECT_NE(policy.fingerprint(), ExecutionPolicy().fingerprint());
  EXPECT_NE(policy.str().find("allow_spinning=false"), std::string::npos);
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(R"({"allow_spinning": 1})"), InvalidArgumentError,
                          "'allow_spinning' must be true or false, got 1");
  XPURT_EXPECT_THROW_WITH(ExecutionPolicy::from_json(R"({"allow_spining": false})"), InvalidArgumentError,
                          "allow_spinning");  // the unknown key's message lists the valid ones
}

TEST(CpuThreads, AThirdOfTheRunnableTimeWaitingIsBusy) {  // Note [Loops on a busy machine]
  EXPECT_FALSE(cpu::waits_for_cores(0, 1'000'000));
  EXPECT_FALSE(cpu::waits_for_cores(333'000, 1'000'000));
  EXPECT_TRUE(cpu::waits_for_cores(334'000, 1'000'000));
  EXPECT_TRUE(cpu::waits_for_cores(900'000, 1'000'000));
  EXPECT_FALSE(cpu::waits_for_cores(0, 0));  // nothing runnable: nothing measured
}

// Busy work on this thread for `ms` (runnable time for its window), asking every millisecond whether its loops run
// alone; true as soon as they do (`want`), false if they never did.
bool becomes(bool want, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < end) {
    const auto tick = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    while (std::chrono::steady_clock::now() < tick) sink = sink + 1.0;
    if (cpu::caller_runs_loops_alone() == want) return true;
  }
  return false;
}

TEST(CpuThreads, ACallerThatWaitsForCoresRunsItsLoopsAlone) {
  if (std::FILE* f = std::fopen("/proc/thread-self/schedstat", "r")) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << "no /proc/thread-self/schedstat: loops are always shared";
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;  // four busy threads per usable core: most of this thread's time is waiting
  for (unsigned i = 0; i < 4 * std::max(1u, std::thread::hardware_concurrency()); ++i) {
    spinners.emplace_back([&] {
      volatile double sink = 0;
      while (!stop.load(std::memory_order_relaxed)) sink = sink + 1.0;
    });
  }
  const bool alone = becomes(true, 3000);
  stop = true;
  for (std::thread& t : spinners) t.join();
  EXPECT_TRUE(alone) << "with " << spinners.size() << " busy threads the loops should run on their caller alone";
  // (Back to shared loops once a window waits less: AThirdOfTheRunnableTimeWaitingIsBusy. Not asserted here: under
  // a parallel ctest the other tests' threads may keep this one waiting.)
}

}  // namespace
}  // namespace xpuruntime
