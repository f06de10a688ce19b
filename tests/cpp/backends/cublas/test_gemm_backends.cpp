// Tests of the cublas and cublasLt backends (matmul, linear, the unfused attention): every GPU result against
// the cpu kernel of the same op on the same (rounded) inputs, the cuBLASLt plan record round trip, concurrency,
// and -- without a GPU -- the reasons supports() gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/half.h"
#include "test_utils.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

// ---- host helpers ----

float load(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return static_cast<const float*>(t.data_ptr())[i];
    case DType::kFloat16:
      return detail::half_to_float(static_cast<const std::uint16_t*>(t.data_ptr())[i]);
    case DType::kBFloat16:
      return detail::bfloat16_to_float(static_cast<const std::uint16_t*>(t.data_ptr())[i]);
    default:
      ADD_FAILURE() << "unexpected dtype " << dtype_name(t.dtype());
      return 0.0f;
  }
}

void store(Tensor& t, std::int64_t i, float value) {
  switch (t.dtype()) {
    case DType::kFloat32:
      static_cast<float*>(t.data_ptr())[i] = value;
      break;
    case DType::kFloat16:
      static_cast<std::uint16_t*>(t.data_ptr())[i] = detail::float_to_half(value);
      break;
    case DType::kBFloat16:
      static_cast<std::uint16_t*>(t.data_ptr())[i] = detail::float_to_bfloat16(value);
      break;
    default:
      ADD_FAILURE() << "unexpected dtype " << dtype_name(t.dtype());
  }
}

// A CPU tensor of uniform values in [lo, hi), exactly representable in `dtype`.
Tensor random_tensor(const Shape& shape, DType dtype, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) store(t, i, dist(rng));
  return t;
}

std::vector<Tensor> to_device(const std::vector<Tensor>& inputs, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(t.defined() ? t.to(device) : Tensor());
  return out;
}

struct KernelRun {
  Tensor output;  // on the CPU
  std::string record;
  std::string describe;
  std::vector<Tensor> outputs;  // every output, on the CPU (output is the first)
};

// Builds `kernel`'s plan for (op, inputs, attrs) and runs it once on the legacy default stream (or `stream`).
// Throws std::runtime_error (after a test failure) when the kernel does not support the descriptor.
KernelRun run_kernel(const std::string& op, const std::string& kernel, const std::vector<Tensor>& inputs,
                     const Attributes& attrs, const ExecutionPolicy& policy, const std::string& record = {},
                     const StreamView* stream = nullptr) {
  OpDescriptor desc = make_op_descriptor(op, inputs, attrs, policy);
  KernelRegistry::global().infer(desc);
  const Kernel* k = KernelRegistry::global().find_kernel(op, kernel);
  if (k == nullptr) throw std::runtime_error("no kernel " + kernel + " for " + op);
  const Support support = k->supports(desc, policy);
  if (!support) {
    ADD_FAILURE() << kernel << " does not support " << desc.signature() << ": " << support.reason();
    throw std::runtime_error(support.reason());
  }
  std::unique_ptr<KernelPlan> plan = k->build(desc, policy, record);
  const StreamView run_stream = stream ? *stream : StreamView(desc.device, nullptr);
  std::vector<Tensor> outputs;
  for (const auto& output : desc.outputs) {
    outputs.push_back(Tensor::empty(output.shape, output.dtype, desc.device, &run_stream));
  }
  std::vector<Tensor> full_inputs = inputs;
  full_inputs.resize(desc.inputs.size());
  plan->execute(desc, full_inputs, outputs, run_stream);
  if (desc.device.is_cuda()) run_stream.synchronize();
  for (Tensor& t : outputs) t = t.to(Device::cpu());
  return {outputs[0], plan->record(), plan->describe(), outputs};
}

// Tolerance |got - want| <= atol + rtol * |want|, with atol growing like sqrt(K) (a sum of K rounded terms).
struct Tolerance {
  double atol;
  double rtol;
};

Tolerance gemm_tolerance(DType dtype, Precision precision, std::int64_t k) {
  const double root = std::sqrt(static_cast<double>(std::max<std::int64_t>(k, 1)));
  switch (dtype) {
    case DType::kFloat16:
      return {2e-3 * root, 5e-3};
    case DType::kBFloat16:
      return {1.2e-2 * root, 2e-2};
    default:
      return precision == Precision::kFP32 ? Tolerance{2e-5 * root, 1e-4} : Tolerance{3e-3 * root, 5e-3};
  }
}

void expect_close(const Tensor& got, const Tensor& want, Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = load(got, i);
    const double w = load(want, i);
    if (!(std::abs(g - w) <= tol.atol + tol.rtol * std::abs(w))) {
      if (++bad <= 5) ADD_FAILURE() << what << ": element " << i << " is " << g << ", expected " << w;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements off";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

ExecutionPolicy policy_with(Precision precision, bool deterministic = false) {
  ExecutionPolicy policy;
  policy.precision = precision;
  policy.deterministic = deterministic;
  return policy;
}

struct Mode {
  DType dtype;
  Precision precision;
  const char* name;
};
const Mode kModes[] = {{DType::kFloat32, Precision::kFP32, "fp32"},
                       {DType::kFloat32, Precision::kTF32, "tf32"},
                       {DType::kFloat16, Precision::kFP32, "fp16"},
                       {DType::kBFloat16, Precision::kFP32, "bf16"}};

double activate(const std::string& activation, double v) {
  if (activation == "relu") return std::max(v, 0.0);
  if (activation == "gelu") return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  if (activation == "gelu_tanh") {
    return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  return v;
}

// The result of matmul / linear with K = 0 (an empty reduction): act(bias) in every row, or zeros. Computed
// here because the cpu kernels take no zero-sized inputs.
Tensor empty_reduction_reference(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs) {
  OpDescriptor desc = make_op_descriptor(op, inputs, attrs, ExecutionPolicy());
  KernelRegistry::global().infer(desc);
  Tensor out = Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype, Device::cpu());
  const std::int64_t n = desc.outputs[0].shape.back();
  const bool has_bias = op == "linear" && inputs.size() > 2 && inputs[2].defined();
  const std::string activation = attrs.get_string("activation", "none");
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const double bias = has_bias ? load(inputs[2], i % n) : 0.0;
    store(out, i, static_cast<float>(activate(activation, bias)));
  }
  return out;
}

// Runs `kernel` on the GPU and the cpu kernel on the same inputs; compares.
void check_against_cpu(const std::string& op, const std::string& kernel, const std::vector<Tensor>& host_inputs,
                       const Attributes& attrs, const Mode& mode, Tolerance tol, const std::string& what) {
  const ExecutionPolicy policy = policy_with(mode.precision);
  const bool empty_input = std::any_of(host_inputs.begin(), host_inputs.end(),
                                       [](const Tensor& t) { return t.defined() && t.numel() == 0; });
  const KernelRun want = empty_input ? KernelRun{empty_reduction_reference(op, host_inputs, attrs), {}, {}}
                                     : run_kernel(op, "cpu", host_inputs, attrs, policy_with(Precision::kFP32));
  const KernelRun got = run_kernel(op, kernel, to_device(host_inputs, Device::cuda(0)), attrs, policy);
  expect_close(got.output, want.output, tol, what + " [" + got.describe + "]");
}

// ---- matmul ----

struct MatmulCase {
  Shape a;
  Shape b;
  bool lt_supported;  // false: batch dims that need several launches (cublasLt declines)
};

const MatmulCase kMatmulCases[] = {
    {{1, 1}, {1, 1}, true},
    {{7, 33}, {33, 127}, true},
    {{127, 1000}, {1000, 7}, true},
    {{33, 8}, {8, 1}, true},
    {{1000, 40}, {40, 1000}, true},
    {{2, 3, 7, 33}, {33, 5}, true},         // b unbatched: folded into M
    {{4, 7, 33}, {4, 33, 9}, true},         // full batch
    {{7, 33}, {3, 33, 9}, true},            // a broadcast (stride 0)
    {{1, 7, 33}, {2, 3, 33, 9}, true},      // a broadcast over two dims
    {{2, 1, 7, 33}, {1, 3, 33, 9}, false},  // interleaved broadcast: a loop of strided batches
    {{5, 1, 7, 16}, {3, 16, 8}, false},     // loop over 5, batch of 3 with a at stride 0
    {{3, 0}, {0, 5}, true},                 // K = 0: zeros
    {{0, 4}, {4, 5}, true},                 // empty output
};

class GemmBackendsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
#if !XPURT_WITH_CUDA
    GTEST_SKIP() << "this build has no CUDA backends";
#endif
    XPURT_SKIP_WITHOUT_GPU();
  }
};

TEST_F(GemmBackendsGpu, MatmulMatchesCpu) {
  std::uint32_t seed = 1;
  for (const std::string kernel : {"cublas", "cublasLt"}) {
    for (const Mode& mode : kModes) {
      for (const MatmulCase& c : kMatmulCases) {
        if (kernel == "cublasLt" && !c.lt_supported) continue;
        const std::vector<Tensor> inputs = {random_tensor(c.a, mode.dtype, seed++),
                                            random_tensor(c.b, mode.dtype, seed++)};
        const std::string what = kernel + " " + mode.name + " matmul " + ::testing::PrintToString(c.a) + " x " +
                                 ::testing::PrintToString(c.b);
        SCOPED_TRACE(what);
        check_against_cpu("matmul", kernel, inputs, {}, mode, gemm_tolerance(mode.dtype, mode.precision, c.a.back()),
                          what);
      }
    }
  }
}

// ---- linear ----

struct LinearCase {
  Shape x;
  std::int64_t n;
};

const LinearCase kLinearCases[] = {
    {{1, 1}, 1}, {{7, 33}, 127}, {{2, 3, 127}, 7}, {{1000, 40}, 33}, {{5, 8}, 1000}, {{33}, 9}, {{4, 0}, 6},
};

TEST_F(GemmBackendsGpu, LinearMatchesCpu) {
  std::uint32_t seed = 1000;
  for (const std::string kernel : {"cublas", "cublasLt"}) {
    for (const Mode& mode : kModes) {
      for (const LinearCase& c : kLinearCases) {
        for (const std::string layout : {"nk", "kn"}) {
          for (const std::string activation : {"none", "relu", "gelu", "gelu_tanh"}) {
            for (const bool with_bias : {false, true}) {
              const std::int64_t k = c.x.back();
              const Shape w_shape = layout == "nk" ? Shape{c.n, k} : Shape{k, c.n};
              std::vector<Tensor> inputs = {random_tensor(c.x, mode.dtype, seed++),
                                            random_tensor(w_shape, mode.dtype, seed++),
                                            with_bias ? random_tensor({c.n}, mode.dtype, seed++) : Tensor()};
              Attributes attrs;
              attrs.set("weight_layout", layout).set("activation", activation);
              const std::string what = kernel + " " + mode.name + " linear x" + ::testing::PrintToString(c.x) +
                                       " n=" + std::to_string(c.n) + " " + layout + " " + activation +
                                       (with_bias ? " +bias" : "");
              SCOPED_TRACE(what);
              check_against_cpu("linear", kernel, inputs, attrs, mode, gemm_tolerance(mode.dtype, mode.precision, k),
                                what);
            }
          }
        }
      }
    }
  }
}

// ---- the cuBLASLt record ----

std::vector<Tensor> linear_inputs(DType dtype, std::int64_t m, std::int64_t k, std::int64_t n, std::uint32_t seed) {
  return to_device(
      {random_tensor({m, k}, dtype, seed), random_tensor({n, k}, dtype, seed + 1), random_tensor({n}, dtype, seed + 2)},
      Device::cuda(0));
}

TEST_F(GemmBackendsGpu, CublasLtRecordRoundTrip) {
  const ExecutionPolicy policy;
  for (const std::string activation : {"none", "relu", "gelu", "gelu_tanh"}) {
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
      SCOPED_TRACE(activation + " " + std::string(dtype_name(dtype)));
      const auto inputs = linear_inputs(dtype, 256, 384, 512, 7);
      Attributes attrs;
      attrs.set("activation", activation);
      const KernelRun first = run_kernel("linear", "cublasLt", inputs, attrs, policy);
      ASSERT_FALSE(first.record.empty());
      EXPECT_NE(first.record.find("\"format\":\"xpuruntime.cublasLt.v1\""), std::string::npos) << first.record;
      EXPECT_NE(first.record.find("\"algo\":[\"0x"), std::string::npos) << first.record;
      EXPECT_EQ(first.describe.rfind("cublasLt algo ", 0), 0u) << first.describe;
      if (activation == "gelu") {
        // Exact GELU is never the tanh epilogue: bias fused, erf GELU afterwards.
        EXPECT_NE(first.record.find("\"post_activation\":\"gelu\""), std::string::npos) << first.record;
        EXPECT_EQ(first.record.find("GELU_BIAS"), std::string::npos) << first.record;
        EXPECT_NE(first.describe.find("erf"), std::string::npos) << first.describe;
      }
      if (activation == "gelu_tanh" && dtype != DType::kFloat32) {
        EXPECT_NE(first.record.find("\"epilogue\":\"GELU_BIAS\""), std::string::npos) << first.record;
      }
      const KernelRun second = run_kernel("linear", "cublasLt", inputs, attrs, policy, first.record);
      EXPECT_EQ(second.record, first.record);
      EXPECT_EQ(second.describe, first.describe);
      EXPECT_TRUE(same_bits(second.output, first.output)) << "re-created plan gave different bits";
    }
  }
}

TEST_F(GemmBackendsGpu, CublasLtRejectsRecordsThatDoNotFit) {
  const auto inputs = linear_inputs(DType::kFloat16, 64, 128, 96, 11);
  Attributes attrs;
  attrs.set("activation", "gelu_tanh");
  const ExecutionPolicy policy;
  const KernelRun first = run_kernel("linear", "cublasLt", inputs, attrs, policy);

  OpDescriptor desc = make_op_descriptor("linear", inputs, attrs, policy);
  KernelRegistry::global().infer(desc);
  const Kernel* kernel = KernelRegistry::global().find_kernel("linear", "cublasLt");
  XPURT_EXPECT_THROW_WITH(kernel->build(desc, policy, "not json"), UnsupportedOperationError, "not JSON");
  XPURT_EXPECT_THROW_WITH(kernel->build(desc, policy, "{\"format\":\"other\"}"), UnsupportedOperationError,
                          "xpuruntime.cublasLt.v1");
  // The same algorithm for another epilogue: relu is not what this op computes.
  std::string relu = first.record;
  const std::size_t at = relu.find("\"epilogue\":\"");
  ASSERT_NE(at, std::string::npos);
  const std::size_t end = relu.find('"', at + 12);
  relu.replace(at + 12, end - (at + 12), "RELU_BIAS");
  XPURT_EXPECT_THROW_WITH(kernel->build(desc, policy, relu), UnsupportedOperationError, "epilogue RELU_BIAS");
  // A corrupted algorithm: every word zero.
  std::string zeroed = first.record;
  const std::size_t words = zeroed.find("\"algo\":[");
  const std::size_t words_end = zeroed.find(']', words);
  std::string zeros = "\"algo\":[";
  for (int j = 0; j < 8; ++j) zeros += std::string(j ? "," : "") + "\"0x0000000000000000\"";
  zeroed.replace(words, words_end - words, zeros);
  XPURT_EXPECT_THROW_WITH(kernel->build(desc, policy, zeroed), UnsupportedOperationError, "cublasLtMatmulAlgoCheck");

  // A record made under exact fp32 does not fit a tf32 descriptor, and the other way round.
  const auto fp32_inputs = linear_inputs(DType::kFloat32, 64, 128, 96, 12);
  const KernelRun exact = run_kernel("linear", "cublasLt", fp32_inputs, {}, policy_with(Precision::kFP32));
  const ExecutionPolicy tf32 = policy_with(Precision::kTF32);
  OpDescriptor tf32_desc = make_op_descriptor("linear", fp32_inputs, {}, tf32);
  KernelRegistry::global().infer(tf32_desc);
  XPURT_EXPECT_THROW_WITH(kernel->build(tf32_desc, tf32, exact.record), UnsupportedOperationError, "compute type");
}

TEST_F(GemmBackendsGpu, CublasLtDeterministicPolicyAvoidsSplitK) {
  // Small M and N with a long K: where cuBLASLt likes to split K.
  const std::vector<Tensor> inputs =
      to_device({random_tensor({16, 32768}, DType::kFloat16, 21), random_tensor({32768, 16}, DType::kFloat16, 22)},
                Device::cuda(0));
  const ExecutionPolicy policy = policy_with(Precision::kFP32, /*deterministic=*/true);
  const KernelRun first = run_kernel("matmul", "cublasLt", inputs, {}, policy);
  EXPECT_NE(first.record.find("\"splitk\":1,"), std::string::npos) << first.record;
  EXPECT_NE(first.record.find("\"deterministic\":true"), std::string::npos) << first.record;
  EXPECT_NE(first.record.find("\"reduction_schemes\":\"none\""), std::string::npos) << first.record;
  for (int j = 0; j < 3; ++j) {
    EXPECT_TRUE(same_bits(run_kernel("matmul", "cublasLt", inputs, {}, policy).output, first.output));
    EXPECT_TRUE(same_bits(run_kernel("matmul", "cublasLt", inputs, {}, policy, first.record).output, first.output));
  }
  // The cublas kernel is deterministic too (its workspace is the launch's, not shared between streams).
  const KernelRun cublas_first = run_kernel("matmul", "cublas", inputs, {}, policy);
  EXPECT_TRUE(same_bits(run_kernel("matmul", "cublas", inputs, {}, policy).output, cublas_first.output));
}

TEST_F(GemmBackendsGpu, CublasLtHonoursTheWorkspaceLimit) {
  const std::vector<Tensor> inputs =
      to_device({random_tensor({16, 8192}, DType::kFloat16, 31), random_tensor({8192, 16}, DType::kFloat16, 32)},
                Device::cuda(0));
  ExecutionPolicy policy;
  policy.workspace_limit = 4096;
  OpDescriptor desc = make_op_descriptor("matmul", inputs, {}, policy);
  KernelRegistry::global().infer(desc);
  const auto plan = KernelRegistry::global().find_kernel("matmul", "cublasLt")->build(desc, policy, {});
  EXPECT_LE(plan->workspace_bytes(), 4096u + 256u) << plan->describe();
}

TEST_F(GemmBackendsGpu, PlansRunConcurrentlyOnSeveralStreams) {
  const ExecutionPolicy policy;
  const auto inputs = linear_inputs(DType::kFloat16, 128, 256, 192, 41);
  Attributes attrs;
  attrs.set("activation", "relu");
  for (const std::string kernel : {"cublas", "cublasLt"}) {
    SCOPED_TRACE(kernel);
    const KernelRun reference = run_kernel("linear", kernel, inputs, attrs, policy);
    std::vector<int> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        Stream stream = Stream::create(Device::cuda(0));
        const StreamView view = stream.view();
        for (int j = 0; j < 10; ++j) {
          const KernelRun run = run_kernel("linear", kernel, inputs, attrs, policy, reference.record, &view);
          if (!same_bits(run.output, reference.output)) ++mismatches[static_cast<std::size_t>(t)];
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[static_cast<std::size_t>(t)], 0) << "thread " << t;
  }
}

// ---- unfused attention ----

struct AttentionCase {
  std::int64_t batch, heads, kv_heads, sq, sk, d, dv;
  Shape mask;  // empty: no mask
  bool causal;
  double scale;  // 0: 1/sqrt(D)
};

const AttentionCase kAttentionCases[] = {
    {1, 1, 1, 1, 1, 1, 1, {}, false, 0.0},
    {2, 4, 2, 7, 33, 24, 40, {7, 33}, false, 0.0},
    {2, 4, 4, 33, 17, 64, 64, {}, true, 0.0},
    {1, 8, 2, 127, 127, 128, 128, {1, 8, 1, 127}, true, 0.0},
    {2, 2, 1, 5, 9, 16, 8, {2, 1, 5, 9}, false, 0.3},
    {1, 3, 1, 17, 1000, 80, 7, {}, false, 0.0},
};

TEST_F(GemmBackendsGpu, UnfusedAttentionMatchesCpu) {
  std::uint32_t seed = 5000;
  for (const Mode& mode : kModes) {
    if (mode.precision == Precision::kTF32) continue;
    for (const AttentionCase& c : kAttentionCases) {
      std::vector<Tensor> inputs = {random_tensor({c.batch, c.heads, c.sq, c.d}, mode.dtype, seed++),
                                    random_tensor({c.batch, c.kv_heads, c.sk, c.d}, mode.dtype, seed++),
                                    random_tensor({c.batch, c.kv_heads, c.sk, c.dv}, mode.dtype, seed++),
                                    c.mask.empty() ? Tensor() : random_tensor(c.mask, mode.dtype, seed++, -2.0f, 0.0f)};
      Attributes attrs;
      attrs.set("causal", std::int64_t{c.causal ? 1 : 0}).set("scale", c.scale);
      const std::string what =
          std::string("unfused ") + mode.name + " attention B=" + std::to_string(c.batch) +
          " H=" + std::to_string(c.heads) + " Hkv=" + std::to_string(c.kv_heads) + " Sq=" + std::to_string(c.sq) +
          " Sk=" + std::to_string(c.sk) + " D=" + std::to_string(c.d) + " Dv=" + std::to_string(c.dv) +
          (c.mask.empty() ? "" : " mask" + ::testing::PrintToString(c.mask)) + (c.causal ? " causal" : "");
      SCOPED_TRACE(what);
      const Tolerance tol = mode.dtype == DType::kFloat32   ? Tolerance{1e-4, 1e-4}
                            : mode.dtype == DType::kFloat16 ? Tolerance{4e-3, 8e-3}
                                                            : Tolerance{2.5e-2, 3e-2};
      check_against_cpu("attention", "unfused", inputs, attrs, mode, tol, what);
    }
  }
}

// Every cuBLASLt tactic (the heuristic's other algorithms, Note [Tactics] in dispatcher.cpp) is a plan that
// build() re-creates from its record and that computes the op; the first is the default plan's algorithm.
TEST_F(GemmBackendsGpu, CublasLtTacticsAreValidPlans) {
  const Mode mode = kModes[3];  // bf16
  std::uint32_t seed = 9000;
  for (const std::string op : {"matmul", "linear", "linear_grad_weight"}) {
    std::vector<Tensor> inputs;
    Attributes attrs;
    if (op == "matmul") {
      inputs = {random_tensor({96, 200}, mode.dtype, seed++), random_tensor({200, 72}, mode.dtype, seed++)};
    } else if (op == "linear") {
      inputs = {random_tensor({96, 200}, mode.dtype, seed++), random_tensor({72, 200}, mode.dtype, seed++),
                random_tensor({72}, mode.dtype, seed++)};
    } else {
      inputs = {random_tensor({96, 72}, mode.dtype, seed++), random_tensor({96, 200}, mode.dtype, seed++)};
    }
    SCOPED_TRACE(op);
    const ExecutionPolicy policy = policy_with(mode.precision);
    const std::vector<Tensor> device_inputs = to_device(inputs, Device::cuda(0));
    OpDescriptor desc = make_op_descriptor(op, device_inputs, attrs, policy);
    KernelRegistry::global().infer(desc);
    const Kernel* lt = KernelRegistry::global().find_kernel(op, "cublasLt");
    ASSERT_NE(lt, nullptr);
    const std::vector<std::string> tactics = lt->tactics(desc, policy);
    ASSERT_FALSE(tactics.empty());
    EXPECT_EQ(tactics.front(), lt->build(desc, policy, {})->record());
    const KernelRun want = run_kernel(op, "cpu", inputs, attrs, policy_with(Precision::kFP32));
    for (const std::string& record : tactics) {
      const KernelRun got = run_kernel(op, "cublasLt", device_inputs, attrs, policy, record);
      EXPECT_EQ(got.record, record);
      const std::int64_t k = op == "linear_grad_weight" ? 96 : 200;
      expect_close(got.output, want.output, gemm_tolerance(mode.dtype, mode.precision, k), op + " " + got.describe);
    }
  }
}

// ---- linear_grad_weight ----

struct GradWeightCase {
  Shape x;  // [..., K]; grad is [..., N]
  std::int64_t n;
};

const GradWeightCase kGradWeightCases[] = {
    {{1, 1}, 1}, {{7, 33}, 127}, {{2, 3, 127}, 7}, {{1000, 40}, 33}, {{5, 8}, 1000}, {{33}, 9}, {{0, 8}, 5},
};

// grad_weight[N, K] = grad^T @ x and grad_bias[N] = grad summed over its rows, in double on the host.
std::vector<std::vector<double>> grad_weight_reference(const Tensor& grad, const Tensor& x) {
  const std::int64_t n = grad.shape().back();
  const std::int64_t k = x.shape().back();
  const std::int64_t m = n > 0 ? grad.numel() / n : 0;
  std::vector<double> weight(static_cast<std::size_t>(n * k), 0.0);
  std::vector<double> bias(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      const double g = load(grad, i * n + j);
      bias[static_cast<std::size_t>(j)] += g;
      for (std::int64_t p = 0; p < k; ++p) weight[static_cast<std::size_t>(j * k + p)] += g * load(x, i * k + p);
    }
  }
  return {weight, bias};
}

void expect_near_reference(const Tensor& got, const std::vector<double>& want, Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<std::int64_t>(want.size())) << what;
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double w = want[static_cast<std::size_t>(i)];
    if (!(std::abs(load(got, i) - w) <= tol.atol + tol.rtol * std::abs(w)) && ++bad <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << load(got, i) << ", expected " << w;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Both kernels of linear_grad_weight against the double reference: the weight gradient and, with bias=1, the bias
// gradient of the same call (cublasLt: its BGRADB epilogue).
void check_grad_weight(const std::string& kernel, Device device) {
  std::uint32_t seed = 5000;
  for (const Mode& mode : kModes) {
    if (device.is_cpu() && mode.precision != Precision::kFP32) continue;
    for (const GradWeightCase& c : kGradWeightCases) {
      for (const bool bias : {false, true}) {
        Shape grad_shape = c.x;
        grad_shape.back() = c.n;
        const Tensor grad = random_tensor(grad_shape, mode.dtype, seed++);
        const Tensor x = random_tensor(c.x, mode.dtype, seed++);
        const auto want = grad_weight_reference(grad, x);
        const std::int64_t m = c.n > 0 ? grad.numel() / c.n : 0;
        const std::string what = kernel + " " + mode.name + " linear_grad_weight x" + ::testing::PrintToString(c.x) +
                                 " n=" + std::to_string(c.n) + (bias ? " +bias" : "");
        SCOPED_TRACE(what);
        Attributes attrs;
        attrs.set("bias", static_cast<std::int64_t>(bias ? 1 : 0));
        const KernelRun run = run_kernel("linear_grad_weight", kernel, to_device({grad, x}, device), attrs,
                                         policy_with(mode.precision));
        const std::vector<Tensor>& got = run.outputs;
        const std::string& describe = run.describe;
        ASSERT_EQ(got.size(), bias ? 2u : 1u);
        EXPECT_EQ(got[0].shape(), (Shape{c.n, c.x.back()}));
        const Tolerance tol = gemm_tolerance(mode.dtype, mode.precision, m);
        expect_near_reference(got[0], want[0], tol, what + " weight [" + describe + "]");
        if (bias) {
          EXPECT_EQ(got[1].shape(), (Shape{c.n}));
          expect_near_reference(got[1], want[1], tol, what + " bias [" + describe + "]");
          if (kernel == "cublasLt" && m > 0) {
            EXPECT_NE(describe.find("BGRADB"), std::string::npos) << describe;
          }
        }
      }
    }
  }
}

TEST_F(GemmBackendsGpu, LinearGradWeightMatchesReference) { check_grad_weight("cublasLt", Device::cuda(0)); }

TEST(GemmBackendsCpu, LinearGradWeightMatchesReference) { check_grad_weight("cpu", Device::cpu()); }

TEST(GemmBackendsCpu, LinearGradWeightRejectsBadCalls) {
  const Tensor grad = random_tensor({4, 5}, DType::kFloat32, 1);
  const auto infer = [](const std::vector<Tensor>& inputs, const Attributes& attrs) {
    OpDescriptor desc = make_op_descriptor("linear_grad_weight", inputs, attrs, ExecutionPolicy());
    KernelRegistry::global().infer(desc);
    return desc;
  };
  EXPECT_THROW(infer({grad, random_tensor({3, 6}, DType::kFloat32, 2)}, {}), InvalidArgumentError);
  EXPECT_THROW(infer({grad, random_tensor({2, 2, 6}, DType::kFloat32, 2)}, {}), InvalidArgumentError);
  EXPECT_THROW(infer({grad, random_tensor({4, 6}, DType::kFloat16, 2)}, {}), InvalidTypeError);
  Attributes bad_bias;
  bad_bias.set("bias", static_cast<std::int64_t>(2));
  EXPECT_THROW(infer({grad, random_tensor({4, 6}, DType::kFloat32, 2)}, bad_bias), InvalidArgumentError);
  Attributes kn;
  kn.set("weight_layout", "kn");
  EXPECT_THROW(infer({grad, random_tensor({4, 6}, DType::kFloat32, 2)}, kn), InvalidArgumentError);
  Attributes with_bias;
  with_bias.set("bias", static_cast<std::int64_t>(1));
  const OpDescriptor ok = infer({grad, random_tensor({4, 6}, DType::kFloat32, 2)}, with_bias);
  ASSERT_EQ(ok.outputs.size(), 2u);
  EXPECT_EQ(ok.outputs[0].shape, (Shape{5, 6}));
  EXPECT_EQ(ok.outputs[1].shape, (Shape{5}));
}

// ---- supports() reasons: no GPU needed ----

#if XPURT_WITH_CUDA

TensorDesc tensor_desc(const Shape& shape, DType dtype, Device device = Device::cuda(0),
                       std::uint32_t alignment = 256) {
  return TensorDesc::contiguous(shape, dtype, device, alignment);
}

OpDescriptor descriptor(const std::string& op, std::vector<TensorDesc> inputs, const Attributes& attrs = {},
                        int compute_capability = 90) {
  OpDescriptor desc;
  desc.op = op;
  desc.attrs = attrs;
  desc.device = inputs[0].device;
  desc.compute_capability = desc.device.is_cuda() ? compute_capability : 0;
  const std::size_t arity = KernelRegistry::global().schema(op).inputs.size();
  inputs.resize(arity);
  desc.inputs = std::move(inputs);
  KernelRegistry::global().infer(desc);
  return desc;
}

std::string reason(const std::string& op, const std::string& kernel, const OpDescriptor& desc,
                   const ExecutionPolicy& policy = {}) {
  const Kernel* k = KernelRegistry::global().find_kernel(op, kernel);
  if (k == nullptr) return "no such kernel";
  const Support support = k->supports(desc, policy);
  return support ? std::string("yes") : support.reason();
}

TEST(GemmBackendsSupports, KernelsAreRegisteredInPriorityOrder) {
  auto& registry = KernelRegistry::global();
  for (const std::string op : {"matmul", "linear"}) {
    const Kernel* lt = registry.find_kernel(op, "cublasLt");
    const Kernel* blas = registry.find_kernel(op, "cublas");
    ASSERT_NE(lt, nullptr);
    ASSERT_NE(blas, nullptr);
    EXPECT_EQ(lt->info().backend, "cublasLt");
    EXPECT_EQ(blas->info().backend, "cublas");
    EXPECT_EQ(lt->info().device_type, DeviceType::kCUDA);
    EXPECT_TRUE(lt->info().deterministic);
    EXPECT_TRUE(blas->info().deterministic);
    std::vector<std::string> names;
    for (const Kernel* k : registry.kernels(op)) names.push_back(k->name());
    const auto position = [&](const std::string& name) {
      return std::find(names.begin(), names.end(), name) - names.begin();
    };
    EXPECT_LT(position("cublasLt"), position("cublas"));
    EXPECT_LT(position("cublas"), position("cpu"));
  }
  const Kernel* unfused = registry.find_kernel("attention", "unfused");
  ASSERT_NE(unfused, nullptr);
  EXPECT_EQ(unfused->info().backend, "cublas");
}

TEST(GemmBackendsSupports, CublasLtTakesLinearGradWeight) {
  Attributes with_bias;
  with_bias.set("bias", static_cast<std::int64_t>(1));
  const auto ok = descriptor("linear_grad_weight",
                             {tensor_desc({3, 7, 9}, DType::kBFloat16), tensor_desc({3, 7, 33}, DType::kBFloat16)},
                             with_bias);
  EXPECT_EQ(reason("linear_grad_weight", "cublasLt", ok), "yes");
  EXPECT_EQ(reason("linear_grad_weight", "cublas", ok), "no such kernel");
  const auto no_features = descriptor(
      "linear_grad_weight", {tensor_desc({7, 9}, DType::kFloat16), tensor_desc({7, 0}, DType::kFloat16)}, with_bias);
  EXPECT_NE(reason("linear_grad_weight", "cublasLt", no_features).find("K = 0"), std::string::npos);
  const auto misaligned = descriptor("linear_grad_weight", {tensor_desc({7, 9}, DType::kFloat16, Device::cuda(0), 2),
                                                             tensor_desc({7, 8}, DType::kFloat16)});
  EXPECT_NE(reason("linear_grad_weight", "cublasLt", misaligned).find("'grad' is only 2-byte aligned"),
            std::string::npos);
}

TEST(GemmBackendsSupports, GpuDescriptorsAreSupported) {
  const auto matmul =
      descriptor("matmul", {tensor_desc({7, 33}, DType::kFloat16), tensor_desc({33, 5}, DType::kFloat16)});
  EXPECT_EQ(reason("matmul", "cublas", matmul), "yes");
  EXPECT_EQ(reason("matmul", "cublasLt", matmul), "yes");
  Attributes attrs;
  attrs.set("activation", "gelu").set("weight_layout", "kn");
  const auto linear = descriptor("linear",
                                 {tensor_desc({3, 7, 33}, DType::kBFloat16), tensor_desc({33, 9}, DType::kBFloat16),
                                  tensor_desc({9}, DType::kBFloat16)},
                                 attrs);
  EXPECT_EQ(reason("linear", "cublas", linear), "yes");
  EXPECT_EQ(reason("linear", "cublasLt", linear), "yes");
  // Any head dim, GQA, a broadcast mask.
  const auto attention = descriptor(
      "attention", {tensor_desc({2, 8, 17, 80}, DType::kFloat16), tensor_desc({2, 2, 33, 80}, DType::kFloat16),
                    tensor_desc({2, 2, 33, 24}, DType::kFloat16), tensor_desc({17, 33}, DType::kFloat16)});
  EXPECT_EQ(reason("attention", "unfused", attention), "yes");
}

TEST(GemmBackendsSupports, ReasonsNameTheProblem) {
  const auto on_cpu = descriptor("matmul", {tensor_desc({4, 4}, DType::kFloat32, Device::cpu()),
                                            tensor_desc({4, 4}, DType::kFloat32, Device::cpu())});
  for (const std::string kernel : {"cublas", "cublasLt"}) {
    EXPECT_NE(reason("matmul", kernel, on_cpu).find("runs on CUDA devices; the input is on cpu"), std::string::npos)
        << reason("matmul", kernel, on_cpu);
  }

  const auto doubles =
      descriptor("matmul", {tensor_desc({4, 4}, DType::kFloat64), tensor_desc({4, 4}, DType::kFloat64)});
  EXPECT_NE(reason("matmul", "cublas", doubles).find("float32, float16 and bfloat16, got float64"), std::string::npos)
      << reason("matmul", "cublas", doubles);

  const auto fp32 = descriptor("matmul", {tensor_desc({4, 4}, DType::kFloat32), tensor_desc({4, 4}, DType::kFloat32)});
  ExecutionPolicy int8;
  int8.precision = Precision::kInt8;
  EXPECT_NE(reason("matmul", "cublasLt", fp32, int8).find("int8"), std::string::npos);

  const auto old_gpu =
      descriptor("matmul", {tensor_desc({4, 4}, DType::kBFloat16), tensor_desc({4, 4}, DType::kBFloat16)}, {}, 75);
  EXPECT_NE(reason("matmul", "cublas", old_gpu).find("compute capability 8.0"), std::string::npos)
      << reason("matmul", "cublas", old_gpu);
  const auto old_gpu_fp16 =
      descriptor("matmul", {tensor_desc({4, 4}, DType::kFloat16), tensor_desc({4, 4}, DType::kFloat16)}, {}, 75);
  EXPECT_EQ(reason("matmul", "cublas", old_gpu_fp16), "yes");

  TensorDesc strided = tensor_desc({4, 4}, DType::kFloat32);
  strided.strides = {1, 4};
  const auto transposed = descriptor("matmul", {strided, tensor_desc({4, 4}, DType::kFloat32)});
  EXPECT_NE(reason("matmul", "cublas", transposed).find("contiguous"), std::string::npos)
      << reason("matmul", "cublas", transposed);
}

TEST(GemmBackendsSupports, CublasLtNeedsSixteenByteAlignment) {
  const auto misaligned = descriptor(
      "matmul", {tensor_desc({8, 8}, DType::kFloat16, Device::cuda(0), 2), tensor_desc({8, 8}, DType::kFloat16)});
  const std::string why = reason("matmul", "cublasLt", misaligned);
  EXPECT_NE(why.find("16-byte aligned"), std::string::npos) << why;
  EXPECT_NE(why.find("'a' is only 2-byte aligned"), std::string::npos) << why;
  EXPECT_NE(why.find("cublas kernel"), std::string::npos) << why;
  EXPECT_EQ(reason("matmul", "cublas", misaligned), "yes");

  Attributes attrs;
  attrs.set("activation", "relu");
  const auto bias = descriptor("linear",
                               {tensor_desc({8, 8}, DType::kFloat32), tensor_desc({8, 8}, DType::kFloat32),
                                tensor_desc({8}, DType::kFloat32, Device::cuda(0), 4)},
                               attrs);
  EXPECT_NE(reason("linear", "cublasLt", bias).find("'bias' is only 4-byte aligned"), std::string::npos)
      << reason("linear", "cublasLt", bias);
}

TEST(GemmBackendsSupports, CublasLtDeclinesInterleavedBroadcasts) {
  const auto interleaved =
      descriptor("matmul", {tensor_desc({2, 1, 7, 33}, DType::kFloat16), tensor_desc({1, 3, 33, 9}, DType::kFloat16)});
  const std::string why = reason("matmul", "cublasLt", interleaved);
  EXPECT_NE(why.find("one strided batch"), std::string::npos) << why;
  EXPECT_EQ(reason("matmul", "cublas", interleaved), "yes");
  // One operand broadcast in every batch dim: a single strided batch (stride 0).
  const auto broadcast =
      descriptor("matmul", {tensor_desc({1, 7, 33}, DType::kFloat16), tensor_desc({2, 3, 33, 9}, DType::kFloat16)});
  EXPECT_EQ(reason("matmul", "cublasLt", broadcast), "yes");
}

TEST(GemmBackendsSupports, UnfusedAttentionReasons) {
  const auto big = descriptor(
      "attention", {tensor_desc({1, 8, 1024, 64}, DType::kFloat16), tensor_desc({1, 8, 1024, 64}, DType::kFloat16),
                    tensor_desc({1, 8, 1024, 64}, DType::kFloat16)});
  ExecutionPolicy limited;
  limited.workspace_limit = 1 << 20;
  const std::string why = reason("attention", "unfused", big, limited);
  EXPECT_NE(why.find("workspace_limit"), std::string::npos) << why;
  EXPECT_NE(why.find("16777216 bytes"), std::string::npos) << why;  // 8 * 1024 * 1024 fp16 scores
  EXPECT_EQ(reason("attention", "unfused", big), "yes");

  const auto no_keys =
      descriptor("attention", {tensor_desc({1, 2, 4, 8}, DType::kFloat32), tensor_desc({1, 2, 0, 8}, DType::kFloat32),
                               tensor_desc({1, 2, 0, 8}, DType::kFloat32)});
  EXPECT_NE(reason("attention", "unfused", no_keys).find("zero keys"), std::string::npos)
      << reason("attention", "unfused", no_keys);

  const auto on_cpu = descriptor("attention", {tensor_desc({1, 2, 4, 8}, DType::kFloat32, Device::cpu()),
                                               tensor_desc({1, 2, 4, 8}, DType::kFloat32, Device::cpu()),
                                               tensor_desc({1, 2, 4, 8}, DType::kFloat32, Device::cpu())});
  EXPECT_NE(reason("attention", "unfused", on_cpu).find("runs on CUDA devices"), std::string::npos);
}

TEST(GemmBackendsSupports, PlansWithoutChoicesRejectRecords) {
  const auto matmul =
      descriptor("matmul", {tensor_desc({4, 4}, DType::kFloat32), tensor_desc({4, 4}, DType::kFloat32)});
  const Kernel* blas = KernelRegistry::global().find_kernel("matmul", "cublas");
  XPURT_EXPECT_THROW_WITH(blas->build(matmul, {}, "{\"format\":\"xpuruntime.cublasLt.v1\"}"), UnsupportedOperationError,
                          "no plan record");
  // Without a record the cublas plan is made without touching the GPU, and says what it will run.
  const auto plan = blas->build(matmul, {}, {});
  EXPECT_NE(plan->describe().find("cublas GemmEx"), std::string::npos) << plan->describe();
  EXPECT_EQ(plan->record(), "");
}

#endif  // XPURT_WITH_CUDA

}  // namespace
}  // namespace xpuruntime
