// linear's cuda_raw "gemv" kernel (Note [Linear as a weight stream] in backends/cuda_raw/gemv.cu): what it takes and
// where it ranks (CPU-runnable: no device touched), and on a GPU its output against a float64 reference on random
// inputs: both weight layouts, 1 to 8 rows, odd K and N, K split across blocks or not, bias, residual and every
// activation, float16 and bfloat16; and that the dispatcher times it against cuBLASLt.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernel_run.h"
#include "test_utils.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/version.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

const Kernel* gemv() { return KernelRegistry::global().find_kernel("linear", "gemv"); }

#define SKIP_WITHOUT_GEMV()                                                              \
  do {                                                                                   \
    if (gemv() == nullptr || !get_build_info().with_cuda) {                              \
      GTEST_SKIP() << "this build has no gemv kernel (built without CUDA)";              \
    }                                                                                    \
  } while (0)

OpDescriptor linear_desc(std::int64_t m, std::int64_t k, std::int64_t n, const std::string& layout,
                         DType dtype = DType::kFloat16, std::uint32_t alignment = 256) {
  OpDescriptor desc;
  desc.op = "linear";
  const Device gpu = Device::cuda(0);
  desc.inputs = {TensorDesc::contiguous({m, k}, dtype, gpu, alignment),
                 TensorDesc::contiguous(layout == "kn" ? Shape{k, n} : Shape{n, k}, dtype, gpu, alignment),
                 TensorDesc(), TensorDesc()};
  desc.attrs.set("weight_layout", layout);
  desc.device = gpu;
  desc.compute_capability = 90;
  KernelRegistry::global().infer(desc);
  return desc;
}

TEST(Gemv, TakesFewRowsOfHalfTypesAndRanksFirstThere) {
  SKIP_WITHOUT_GEMV();
  const ExecutionPolicy policy;
  for (const std::string layout : {"nk", "kn"}) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (std::int64_t m : {1, 3, 8}) {
        const OpDescriptor desc = linear_desc(m, 2048, 5632, layout, dtype);
        const Support s = gemv()->supports(desc, policy);
        EXPECT_TRUE(s.ok()) << desc.signature() << ": " << s.reason();
        EXPECT_FALSE(gemv()->ranks_first(desc).empty());
        EXPECT_FALSE(gemv()->timed_against_others(desc).empty());  // against cuBLASLt, at the node's shapes
      }
    }
  }
  const auto refuses = [&](const OpDescriptor& desc, const std::string& fragment) {
    const Support s = gemv()->supports(desc, policy);
    EXPECT_FALSE(s.ok()) << desc.signature();
    EXPECT_NE(s.reason().find(fragment), std::string::npos) << s.reason();
  };
  refuses(linear_desc(9, 64, 64, "nk"), "1 to 8 rows of x, got 9");
  refuses(linear_desc(1, 64, 64, "nk", DType::kFloat32), "float16 and bfloat16");
  refuses(linear_desc(1, 60, 64, "nk"), "K must be a multiple of 8, got 60");
  refuses(linear_desc(1, 64, 60, "kn"), "N must be a multiple of 8, got 60");
  refuses(linear_desc(1, 64, 64, "kn", DType::kFloat16, 8), "16-byte aligned");
  OpDescriptor swish = linear_desc(1, 64, 64, "nk");
  swish.attrs.set("activation", std::string("silu"));
  EXPECT_FALSE(gemv()->supports(swish, policy).ok());
}

// x W^T + bias + residual, then the activation, in double from the (rounded) host inputs.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                              const std::vector<float>& r, std::int64_t m, std::int64_t k, std::int64_t n, bool kn,
                              const std::string& act) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = b.empty() ? 0.0 : b[static_cast<std::size_t>(j)];
      if (!r.empty()) sum += r[static_cast<std::size_t>(i * n + j)];
      for (std::int64_t p = 0; p < k; ++p) {
        sum += static_cast<double>(x[static_cast<std::size_t>(i * k + p)]) *
               w[static_cast<std::size_t>(kn ? p * n + j : j * k + p)];
      }
      if (act == "relu") sum = std::max(sum, 0.0);
      if (act == "gelu") sum = 0.5 * sum * (1.0 + std::erf(sum / std::sqrt(2.0)));
      if (act == "gelu_tanh") {
        sum = 0.5 * sum * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (sum + 0.044715 * sum * sum * sum)));
      }
      out[static_cast<std::size_t>(i * n + j)] = sum;
    }
  }
  return out;
}

using kernel_run::floats_of;

Tensor random_half(const Shape& shape, DType dtype, std::mt19937& gen) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return ops::cast(t, dtype);
}

void check_case(std::int64_t m, std::int64_t k, std::int64_t n, const std::string& layout, DType dtype, bool bias,
                bool residual, const std::string& act, std::mt19937& gen) {
  SCOPED_TRACE(layout + " " + std::string(dtype_name(dtype)) + " M" + std::to_string(m) + " K" + std::to_string(k) + " N" +
               std::to_string(n) + (bias ? " bias" : "") + (residual ? " residual" : "") + " " + act);
  const bool kn = layout == "kn";
  const Tensor x = random_half({m, k}, dtype, gen);
  const Tensor w = random_half(kn ? Shape{k, n} : Shape{n, k}, dtype, gen);
  const Tensor b = bias ? random_half({n}, dtype, gen) : Tensor();
  const Tensor r = residual ? random_half({m, n}, dtype, gen) : Tensor();
  Attributes attrs;
  attrs.set("weight_layout", layout);
  attrs.set("activation", act);
  const kernel_run::KernelRun run =
      kernel_run::run_registry_kernel("linear", "gemv", {x, w, b, r}, attrs, Device::cuda(0));
  const std::vector<float> got = floats_of(run.output);
  const std::vector<double> want = reference(floats_of(x), floats_of(w), bias ? floats_of(b) : std::vector<float>{},
                                             residual ? floats_of(r) : std::vector<float>{}, m, k, n, kn, act);
  // float32 sums of |x w| <= k terms, one rounding of the output to the 16-bit type.
  const double rounding = dtype == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tolerance = rounding * (1.0 + std::fabs(want[i])) + 1e-5 * static_cast<double>(k);
    if (!(std::fabs(got[i] - want[i]) <= tolerance) && bad++ < 5) {
      ADD_FAILURE() << "element " << i << ": gemv " << got[i] << ", reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << got.size() << " (" << run.describe << ")";
}

TEST(GemvGpu, MatchesAFloat64ReferenceAtOddShapes) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_GEMV();
  std::mt19937 gen(3);
  for (const std::string layout : {"nk", "kn"}) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (std::int64_t m : {1, 2, 3, 5, 8}) {
        check_case(m, 8, 8, layout, dtype, false, false, "none", gen);
        check_case(m, 72, 24, layout, dtype, true, false, "none", gen);
        check_case(m, 520, 264, layout, dtype, false, true, "relu", gen);  // a last partial column block
        check_case(m, 2048, 512, layout, dtype, true, true, "gelu", gen);  // K split across blocks (kn)
        check_case(m, 4104, 136, layout, dtype, true, false, "gelu_tanh", gen);
      }
      check_case(1, 8192, 2048, layout, dtype, false, false, "none", gen);  // a decode step's down projection
    }
  }
}

// Through the dispatcher: a decode-sized linear is timed between gemv and cuBLASLt, the faster kept and named; the
// output is right whichever ran.
TEST(GemvGpu, TheDispatcherTimesItAgainstCublasLt) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_GEMV();
  std::mt19937 gen(5);
  const Tensor x = random_half({1, 2048}, DType::kFloat16, gen).to(Device::cuda(0));
  const Tensor w = random_half({2048, 2048}, DType::kFloat16, gen).to(Device::cuda(0));
  Dispatcher dispatcher(KernelPolicy{}, ExecutionPolicy{});
  Decision decision;
  Attributes attrs;
  attrs.set("weight_layout", std::string("kn"));
  const std::vector<Tensor> out = dispatcher.run("linear", {x, w, Tensor(), Tensor()}, attrs, nullptr, &decision);
  EXPECT_TRUE(decision.kernel == "gemv" || decision.kernel == "cublasLt") << decision.kernel;
  EXPECT_NE(decision.reason.find("timed"), std::string::npos) << decision.reason;
  const std::vector<float> got = floats_of(out[0]);
  const std::vector<double> want = reference(floats_of(x), floats_of(w), {}, {}, 1, 2048, 2048, true, "none");
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-2 * (1 + std::fabs(want[i]))) << i;
  EXPECT_EQ(decision.reason.find("from memory"), std::string::npos) << decision.reason;

  // Note [Weights timed from memory]: a session whose constants outgrow the L2 times the weight streams cold; the
  // reason says so, and the output is as right.
  Dispatcher::Options options;
  options.weights_from_memory = true;
  Dispatcher cold(KernelPolicy{}, ExecutionPolicy{}, nullptr, nullptr, options);
  Decision cold_decision;
  const std::vector<Tensor> again = cold.run("linear", {x, w, Tensor(), Tensor()}, attrs, nullptr, &cold_decision);
  EXPECT_NE(cold_decision.reason.find("timed with the weight read from memory"), std::string::npos)
      << cold_decision.reason;
  for (const CandidateReport& c : cold_decision.candidates) {
    if (c.supported) {
      EXPECT_GT(c.time_us, 0) << c.kernel;
    }
  }
  if (decision.kernel == cold_decision.kernel) {
    EXPECT_EQ(floats_of(again[0]), floats_of(out[0]));
  }
  const std::vector<float> cold_got = floats_of(again[0]);
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(cold_got[i], want[i], 2e-2 * (1 + std::fabs(want[i]))) << i;
  }
}

// Only GEMV-shaped descriptors ask for it: gemv streams the weights it accepts, other kernels do not say so.
TEST(Gemv, StreamsTheWeightsItTakes) {
  SKIP_WITHOUT_GEMV();
  const OpDescriptor desc = linear_desc(1, 2048, 2048, "kn");
  EXPECT_TRUE(gemv()->streams_weight(desc));
  for (const Kernel* k : KernelRegistry::global().kernels("linear")) {
    if (k->name() != "gemv") {
      EXPECT_FALSE(k->streams_weight(desc)) << k->name();
    }
  }
}

}  // namespace
}  // namespace xpuruntime
