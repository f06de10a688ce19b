// The cpu backend through the public kernel API: KernelRegistry::global().find_kernel(op, "cpu") ->
// supports / build / run on Tensor::empty CPU tensors. Small exact cases per op family, the fallback GEMM
// against a naive loop at odd sizes, determinism across thread counts, float16/bfloat16/float64 paths, and
// the reasons supports() gives. The cross-backend comparison on random inputs is tests/python/test_conformance.py.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Values = std::vector<float>;
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor make(const Shape& shape, const Values& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(float));  // no null to memcpy
  return t;
}

Values random_values(std::int64_t n, unsigned seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  Values v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

Tensor random_tensor(const Shape& shape, unsigned seed, float low = -1.0f, float high = 1.0f) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return make(shape, random_values(n, seed, low, high));
}


OpDescriptor describe(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                      const ExecutionPolicy& policy = {}) {
  OpDescriptor desc;
  desc.op = op;
  const OpSchema& schema = KernelRegistry::global().schema(op);
  const std::size_t count = schema.is_variadic() ? std::max(schema.inputs.size(), inputs.size()) : schema.inputs.size();
  for (std::size_t i = 0; i < count; ++i)
    desc.inputs.push_back(TensorDesc::of(i < inputs.size() ? inputs[i] : Tensor()));
  desc.attrs = attrs;
  desc.device = inputs[0].device();
  desc.precision = policy.precision;
  desc.deterministic = policy.deterministic;
  KernelRegistry::global().infer(desc);
  return desc;
}

const Kernel& cpu_kernel(const std::string& op) {
  const Kernel* kernel = KernelRegistry::global().find_kernel(op, "cpu");
  if (kernel == nullptr) throw InvalidArgumentError("no cpu kernel for " + op);
  return *kernel;
}

// Runs the cpu kernel of `op`; absent optional inputs are undefined tensors.
std::vector<Tensor> run(const std::string& op, std::vector<Tensor> inputs, const Attributes& attrs = {},
                        const ExecutionPolicy& policy = {}, std::string* plan_description = nullptr) {
  const OpDescriptor desc = describe(op, inputs, attrs, policy);
  inputs.resize(desc.inputs.size());
  const Kernel& kernel = cpu_kernel(op);
  const Support support = kernel.supports(desc, policy);
  if (!support) throw UnsupportedOperationError(support.reason());
  auto plan = kernel.build(desc, policy, "");
  if (plan_description != nullptr) *plan_description = plan->describe();
  std::vector<Tensor> outputs;
  for (const auto& out : desc.outputs) outputs.push_back(Tensor::empty(out.shape, out.dtype));
  plan->execute(desc, inputs, outputs);
  return outputs;
}

Tensor run1(const std::string& op, std::vector<Tensor> inputs, const Attributes& attrs = {},
            const ExecutionPolicy& policy = {}) {
  return run(op, std::move(inputs), attrs, policy)[0];
}

Tensor cast(const Tensor& x, const char* to) { return run1("cast", {x}, Attributes().set("to", std::string(to))); }

Values values(const Tensor& t) {
  const Tensor f = t.dtype() == DType::kFloat32 ? t : cast(t, "float32");
  const float* p = static_cast<const float*>(f.data_ptr());
  return Values(p, p + f.numel());
}

std::vector<std::uint16_t> bits16(const Tensor& t) {
  const auto* p = static_cast<const std::uint16_t*>(t.data_ptr());
  return std::vector<std::uint16_t>(p, p + t.numel());
}

void expect_near_all(const Values& actual, const Values& expected, float tolerance, const std::string& what = "") {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(actual[i])) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(actual[i], expected[i], tolerance * (1.0f + std::fabs(expected[i]))) << what << " at " << i;
  }
}

// Naive reference: c[m, n] = sum_k a[m, k] b[k, n] in double.
Values naive_matmul(const Values& a, const Values& b, std::int64_t m, std::int64_t n, std::int64_t k,
                    bool b_transposed = false) {
  Values c(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        sum += static_cast<double>(a[i * k + p]) * (b_transposed ? b[j * k + p] : b[p * n + j]);
      }
      c[i * n + j] = static_cast<float>(sum);
    }
  }
  return c;
}

// ---- registry ----

TEST(CpuBackend, EveryOpHasADeterministicCpuKernel) {
  for (const auto& op : KernelRegistry::global().ops()) {
    // Collectives need a communicator: on the CPU their kernel is the host communicator's ("host").
    if (KernelRegistry::global().schema(op).family == "collective") {
      EXPECT_NE(KernelRegistry::global().find_kernel(op, "host"), nullptr) << op;
      continue;
    }
    const Kernel* kernel = KernelRegistry::global().find_kernel(op, "cpu");
    ASSERT_NE(kernel, nullptr) << op;
    EXPECT_EQ(kernel->info().backend, "cpu");
    EXPECT_EQ(kernel->info().device_type, DeviceType::kCPU);
    EXPECT_TRUE(kernel->info().deterministic);
    EXPECT_FALSE(kernel->info().summary.empty());
  }
}

// ---- supports() ----

TEST(CpuBackend, SupportsRejectsCudaDescriptorsWithAReason) {
  OpDescriptor desc = describe("relu", {make({2}, {1, 2})}, {});
  desc.device = Device::cuda(0);
  for (auto& t : desc.inputs) t.device = Device::cuda(0);
  for (auto& t : desc.outputs) t.device = Device::cuda(0);
  const Support s = cpu_kernel("relu").supports(desc, ExecutionPolicy{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.reason().find("runs on CPU tensors"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("cuda:0"), std::string::npos) << s.reason();
}

TEST(CpuBackend, SupportsListsTheDtypesItTakes) {
  OpDescriptor desc = describe("relu", {make({2}, {1, 2})}, {});
  desc.inputs[0].dtype = DType::kInt32;  // past the schema: the kernel must still say why not
  const Support s = cpu_kernel("relu").supports(desc, ExecutionPolicy{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.reason().find("float32, float16, bfloat16 and float64"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("int32"), std::string::npos) << s.reason();
}

TEST(CpuBackend, SupportsRejectsStridedInputsAndInt8) {
  Tensor base = random_tensor({3, 4}, 1);
  Tensor transposed =
      Tensor::from_blob(base.data_ptr(), {4, 3}, {1, 4}, DType::kFloat32, Device::cpu(), base.storage());
  const OpDescriptor desc = describe("relu", {transposed}, {});
  Support s = cpu_kernel("relu").supports(desc, ExecutionPolicy{});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.reason().find("contiguous"), std::string::npos) << s.reason();

  ExecutionPolicy int8;
  int8.precision = Precision::kInt8;
  s = cpu_kernel("relu").supports(describe("relu", {base}, {}), int8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.reason().find("int8"), std::string::npos) << s.reason();
  // build() says the same instead of running
  XPURT_EXPECT_THROW_WITH(cpu_kernel("relu").build(describe("relu", {base}, {}), int8, ""), UnsupportedOperationError,
                          "int8");
}

TEST(CpuBackend, BadGemmEnvironmentVariableIsAnActionableError) {
  ScopedEnv env("XPURT_CPU_GEMM", "fast");
  XPURT_EXPECT_THROW_WITH(run1("matmul", {make({1, 1}, {2}), make({1, 1}, {3})}), InvalidArgumentError,
                          "'auto' (the packed GEMM on an AVX2 or AVX-512 CPU, else OpenBLAS when built with it), "
                          "'packed', 'blas' or 'fallback'");
}

// ---- GEMM ----

TEST(CpuBackend, MatmulSmallExact) {
  const Tensor a = make({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = make({3, 2}, {7, 8, 9, 10, 11, 12});
  EXPECT_EQ(values(run1("matmul", {a, b})), (Values{58, 64, 139, 154}));
}

TEST(CpuBackend, MatmulBroadcastsBatchDims) {
  // a [2, 1, 2, 3] @ b [3, 3, 4] -> [2, 3, 2, 4]
  const Tensor a = random_tensor({2, 1, 2, 3}, 2);
  const Tensor b = random_tensor({3, 3, 4}, 3);
  const Tensor y = run1("matmul", {a, b});
  ASSERT_EQ(y.shape(), (Shape{2, 3, 2, 4}));
  const Values va = values(a), vb = values(b), vy = values(y);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      const Values ai(va.begin() + i * 6, va.begin() + (i + 1) * 6);
      const Values bj(vb.begin() + j * 12, vb.begin() + (j + 1) * 12);
      const Values expected = naive_matmul(ai, bj, 2, 4, 3);
      const Values actual(vy.begin() + (i * 3 + j) * 8, vy.begin() + (i * 3 + j + 1) * 8);
      expect_near_all(actual, expected, 1e-6f);
    }
  }
}

TEST(CpuBackend, FallbackGemmMatchesNaiveLoopAtOddSizes) {
  ScopedEnv env("XPURT_CPU_GEMM", "fallback");
  const std::vector<std::array<std::int64_t, 3>> sizes = {{1, 1, 1},     {7, 13, 5},    {33, 65, 17}, {65, 33, 129},
                                                          {5, 300, 257}, {130, 7, 513}, {67, 259, 3}};
  for (const auto& [m, n, k] : sizes) {
    const std::string what = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
    const Tensor a = random_tensor({m, k}, 10);
    const Tensor b = random_tensor({k, n}, 11);
    std::string plan;
    const Tensor y = run("matmul", {a, b}, {}, {}, &plan)[0];
    EXPECT_NE(plan.find("gemm fallback"), std::string::npos) << plan;
    // Each product is exact in double; float accumulation adds at most ~k ulps of sum |a||b| <= k.
    expect_near_all(values(y), naive_matmul(values(a), values(b), m, n, k), 1e-6f * static_cast<float>(k), what);
    // The transposed-B path (linear with the PyTorch [N, K] weight layout).
    const Tensor w = random_tensor({n, k}, 12);
    const Tensor z = run1("linear", {a, w});
    expect_near_all(values(z), naive_matmul(values(a), values(w), m, n, k, true), 1e-6f * static_cast<float>(k),
                    what + " (B transposed)");
  }
}

TEST(CpuBackend, GemmBitsAreStableAcrossRunsAndThreadCounts) {
  const Tensor a = random_tensor({97, 300}, 20);
  const Tensor b = random_tensor({300, 270}, 21);
  for (const char* engine : {"fallback", "packed", "auto"}) {
    ScopedEnv env("XPURT_CPU_GEMM", engine);
    ExecutionPolicy one, two;
    one.intra_op_threads = 1;
    two.intra_op_threads = 2;
    const Values y1 = values(run1("matmul", {a, b}, {}, one));
    const Values y2 = values(run1("matmul", {a, b}, {}, two));
    const Values y3 = values(run1("matmul", {a, b}, {}, two));
    EXPECT_EQ(y2, y3) << engine;
    if (std::string(engine) != "auto") {  // auto may be OpenBLAS, whose blocks follow the thread count
      EXPECT_EQ(y1, y2) << engine;
    }
    expect_near_all(y1, naive_matmul(values(a), values(b), 97, 270, 300), 3e-4f, engine);
  }
}

TEST(CpuBackend, LinearLayoutsBiasAndActivations) {
  const Tensor x = make({2, 2}, {1, -2, 3, 0.5f});
  const Tensor w_nk = make({3, 2}, {1, 0, 0, 1, 1, 1});  // [N=3, K=2]
  const Tensor w_kn = make({2, 3}, {1, 0, 1, 0, 1, 1});  // the same weight as [K, N]
  const Tensor bias = make({3}, {0.5f, 0, -1});
  const Values plain = {1.5f, -2, -2, 3.5f, 0.5f, 2.5f};
  EXPECT_EQ(values(run1("linear", {x, w_nk, bias})), plain);
  EXPECT_EQ(values(run1("linear", {x, w_kn, bias}, Attributes().set("weight_layout", std::string("kn")))), plain);
  EXPECT_EQ(values(run1("linear", {x, w_nk}, Attributes().set("activation", std::string("relu")))),
            (Values{1, 0, 0, 3, 0.5f, 3.5f}));
  Values gelu, gelu_tanh;
  for (float v : plain) {
    gelu.push_back(0.5f * v * (1 + std::erf(v / std::sqrt(2.0f))));
    gelu_tanh.push_back(0.5f * v * (1 + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))));
  }
  expect_near_all(values(run1("linear", {x, w_nk, bias}, Attributes().set("activation", std::string("gelu")))), gelu,
                  1e-6f);
  expect_near_all(values(run1("linear", {x, w_nk, bias}, Attributes().set("activation", std::string("gelu_tanh")))),
                  gelu_tanh, 1e-6f);
}

// ---- convolution ----

// Direct convolution in double (NCHW), pads (top, left, bottom, right).
Values naive_conv(const Values& x, const Shape& xs, const Values& w, const Shape& ws, const Values& bias,
                  const Values& residual, Shape strides, Shape pads, Shape dilations, std::int64_t groups, bool relu,
                  Shape* out_shape) {
  const std::int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], o = ws[0], kh = ws[2], kw = ws[3];
  const std::int64_t oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) / strides[0] + 1;
  const std::int64_t ow = (wd + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) / strides[1] + 1;
  *out_shape = {n, o, oh, ow};
  const std::int64_t cg = c / groups, og = o / groups;
  Values y(static_cast<std::size_t>(n * o * oh * ow));
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t oc = 0; oc < o; ++oc)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          double sum = bias.empty() ? 0.0 : bias[oc];
          const std::int64_t g = oc / og;
          for (std::int64_t ic = 0; ic < cg; ++ic)
            for (std::int64_t u = 0; u < kh; ++u)
              for (std::int64_t v = 0; v < kw; ++v) {
                const std::int64_t ih = i * strides[0] - pads[0] + u * dilations[0];
                const std::int64_t iw = j * strides[1] - pads[1] + v * dilations[1];
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                sum += static_cast<double>(x[((b * c + g * cg + ic) * h + ih) * wd + iw]) *
                       w[((oc * cg + ic) * kh + u) * kw + v];
              }
          const std::size_t idx = static_cast<std::size_t>(((b * o + oc) * oh + i) * ow + j);
          if (!residual.empty()) sum += residual[idx];
          y[idx] = static_cast<float>(relu && sum < 0 ? 0.0 : sum);
        }
  return y;
}

TEST(CpuBackend, Conv2dSmallExact) {
  // 1x1x3x3 input, 2x2 kernel of ones, no padding: sums of 2x2 windows.
  const Tensor x = make({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  const Tensor w = make({1, 1, 2, 2}, {1, 1, 1, 1});
  EXPECT_EQ(values(run1("conv2d", {x, w})), (Values{12, 16, 24, 28}));
  // Asymmetric padding (top 1, left 0, bottom 0, right 1), bias -10, ReLU.
  const Tensor bias = make({1}, {-10});
  const Tensor y =
      run1("conv2d", {x, w, bias}, Attributes().set("pads", Shape{1, 0, 0, 1}).set("activation", std::string("relu")));
  ASSERT_EQ(y.shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(values(y), (Values{0, 0, 0, 2, 6, 0, 14, 18, 5}));
}

// A conv2d case: shapes, attributes, and which optional inputs and ReLU it has.
struct ConvCase {
  Shape x, w, strides, pads, dilations;
  std::int64_t groups;
  bool bias, residual, relu;
};

Attributes conv_attrs(const ConvCase& c) {
  return Attributes()
      .set("strides", c.strides)
      .set("pads", c.pads)
      .set("dilations", c.dilations)
      .set("groups", c.groups)
      .set("activation", std::string(c.relu ? "relu" : "none"));
}

// A case's random operands (seeds from `seed` on) and naive_conv's result for them.
struct ConvRun {
  Tensor x, w, bias, residual;
  Shape out_shape;
  Values expected;
};

ConvRun conv_run(const ConvCase& c, unsigned& seed) {
  ConvRun r;
  r.x = random_tensor(c.x, seed++);
  r.w = random_tensor(c.w, seed++);
  r.bias = c.bias ? random_tensor({c.w[0]}, seed++) : Tensor();
  naive_conv(values(r.x), c.x, values(r.w), c.w, {}, {}, c.strides, c.pads, c.dilations, c.groups, false, &r.out_shape);
  r.residual = c.residual ? random_tensor(r.out_shape, seed++) : Tensor();
  r.expected = naive_conv(values(r.x), c.x, values(r.w), c.w, c.bias ? values(r.bias) : Values{},
                          c.residual ? values(r.residual) : Values{}, c.strides, c.pads, c.dilations, c.groups, c.relu,
                          &r.out_shape);
  return r;
}

// Every case against naive_conv, under each XPURT_CPU_ISA of `isas` and XPURT_CPU_GEMM of `gemms`; with float64,
// also on float64 inputs.
void expect_convs_match_naive(const std::vector<ConvCase>& cases, unsigned seed, const std::vector<std::string>& isas,
                              const std::vector<const char*>& gemms, float tolerance, bool float64) {
  for (const auto& c : cases) {
    const ConvRun r = conv_run(c, seed);
    const Tensor &x = r.x, &w = r.w, &bias = r.bias, &residual = r.residual;
    const Shape& out_shape = r.out_shape;
    const Values& expected = r.expected;
    const Attributes attrs = conv_attrs(c);
    for (const std::string& isa : isas) {
      ScopedEnv isa_env("XPURT_CPU_ISA", isa.c_str());
      for (const char* gemm : gemms) {
        ScopedEnv gemm_env("XPURT_CPU_GEMM", gemm);
        const std::string what = isa + " " + gemm + " x " + std::to_string(c.x[1]) + "x" + std::to_string(c.x[2]) +
                                 "x" + std::to_string(c.x[3]) + " w " + std::to_string(c.w[2]) + "x" +
                                 std::to_string(c.w[3]);
        const Tensor y = run1("conv2d", {x, w, bias, residual}, attrs);
        ASSERT_EQ(y.shape(), out_shape) << what;
        expect_near_all(values(y), expected, tolerance, what);
        if (!float64) continue;
        const Tensor y64 = run1("conv2d",
                                {cast(x, "float64"), cast(w, "float64"), c.bias ? cast(bias, "float64") : bias,
                                 c.residual ? cast(residual, "float64") : residual},
                                attrs);
        ASSERT_EQ(y64.dtype(), DType::kFloat64) << what;
        expect_near_all(values(y64), expected, 1e-6f, what + " float64");
      }
    }
  }
}

TEST(CpuBackend, Conv2dGroupsStridesDilationsResidualMatchDirectLoop) {
  const std::vector<ConvCase> cases = {
      {{2, 4, 7, 9}, {6, 2, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 2, true, true, true},
      {{1, 3, 11, 10}, {5, 3, 3, 2}, {2, 3}, {0, 2, 1, 0}, {2, 1}, 1, true, false, false},
      {{1, 6, 5, 5}, {6, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 6, false, true, false},   // depthwise
      {{3, 8, 4, 6}, {5, 8, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true, false, true},    // 1x1 direct path
      {{1, 2, 6, 6}, {4, 2, 1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, false, false, false},  // 1x1 strided
  };
  expect_convs_match_naive(cases, 30, {"auto"}, {"auto", "fallback"}, 1e-5f, false);
}

// The instruction sets this CPU can run (cpu_isa.h): every table's window loops are compared with the references.
std::vector<std::string> isa_names() {
  std::vector<std::string> names{"baseline"};
  for (const char* name : {"avx2", "avx512"}) {
    if (cpu::isa_supported(name)) names.emplace_back(name);
  }
  return names;
}

// matmul and linear (B transposed) of every size, under every instruction set with XPURT_CPU_GEMM=packed, against a
// double loop; the plan's summary names `route` (with "%s" for the instruction set's name) and the bits are the same
// with one thread as with the default two.
void expect_products_match_naive(const std::vector<std::array<std::int64_t, 3>>& sizes, unsigned seed,
                                 const std::string& route) {
  ScopedEnv gemm_env("XPURT_CPU_GEMM", "packed");
  ExecutionPolicy one_thread;
  one_thread.intra_op_threads = 1;
  for (const std::string& isa : isa_names()) {
    ScopedEnv env("XPURT_CPU_ISA", isa.c_str());
    std::string expected_route = route;
    if (const auto at = expected_route.find("%s"); at != std::string::npos) expected_route.replace(at, 2, isa);
    for (const auto& [m, n, k] : sizes) {
      const std::string what = isa + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
      const Tensor a = random_tensor({m, k}, seed++);
      const Tensor b = random_tensor({k, n}, seed++);
      const Tensor w = random_tensor({n, k}, seed++);
      std::string plan;
      const Tensor y = run("matmul", {a, b}, {}, {}, &plan)[0];
      EXPECT_NE(plan.find(expected_route), std::string::npos) << plan;
      expect_near_all(values(y), naive_matmul(values(a), values(b), m, n, k), 1e-6f * static_cast<float>(k), what);
      const Tensor linear = run1("linear", {a, w});
      expect_near_all(values(linear), naive_matmul(values(a), values(w), m, n, k, true),
                      1e-6f * static_cast<float>(k), what + " (B transposed)");
      EXPECT_EQ(values(run("matmul", {a, b}, {}, one_thread)[0]), values(y)) << what << ": one thread";
      EXPECT_EQ(values(run("linear", {a, w}, {}, one_thread)[0]), values(linear)) << what << ": one thread, linear";
    }
  }
}

// The packed GEMM (Note [Packed GEMM]) of every instruction set against a double loop: sizes around its micro-tile,
// tile and depth slice (6 x 8/16/64, 96 rows x 512 columns, 128/256 deep), one column, B transposed (linear), and
// tiles of one B micro-panel, whose A is read in place (97 x 64 over three depth slices).
TEST(CpuBackend, PackedGemmMatchesNaiveOnEveryIsa) {
  expect_products_match_naive({{8, 8, 1}, {9, 13, 5}, {6, 64, 128}, {97, 515, 300}, {13, 8, 600}, {8, 17, 257},
                               {193, 70, 33}, {97, 64, 300}},
                              40, "gemm packed, isa %s");
}

// Note [Skinny GEMM]: both kernels of every instruction set against a double loop, at few-counts 1 to 7, depths and
// widths around every vector width (1, 15-17, 31-33, 63-65, 257), leading dimensions wider than the rows.
TEST(CpuBackend, SkinnyGemmKernelsMatchNaiveOnEveryIsa) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto random_values = [&](std::size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = uniform(rng);
    return v;
  };
  for (const std::string& isa_name : isa_names()) {
    const cpu::IsaKernels& isa = cpu::isa_kernels_named(isa_name);
    for (int few = 1; few <= 7; ++few) {
      for (const std::int64_t depth : {1, 15, 16, 17, 33, 64, 65, 257}) {
        const std::int64_t count = 13, ld_many = depth + 3, ld_few = depth + 5;
        const std::vector<float> many = random_values(static_cast<std::size_t>(count * ld_many));
        const std::vector<float> rows = random_values(static_cast<std::size_t>(few * ld_few));
        // out as [few, count] (out_x 1, out_y count): the transposed placement the few-rows case uses.
        std::vector<float> out(static_cast<std::size_t>(few * count), NAN);
        isa.gemm_dots_f32(many.data(), ld_many, count, rows.data(), ld_few, few, depth, out.data(), 1, count);
        for (std::int64_t x = 0; x < count; ++x) {
          for (int y = 0; y < few; ++y) {
            double want = 0;
            for (std::int64_t p = 0; p < depth; ++p) {
              want += static_cast<double>(many[static_cast<std::size_t>(x * ld_many + p)]) *
                      rows[static_cast<std::size_t>(y * ld_few + p)];
            }
            EXPECT_NEAR(out[static_cast<std::size_t>(y * count + x)], want, 1e-5 * static_cast<double>(depth))
                << isa_name << " dots: few " << few << ", depth " << depth << ", x " << x << ", y " << y;
          }
        }
      }
      for (const std::int64_t cols : {1, 15, 16, 17, 31, 33, 63, 64, 65, 130, 257}) {
        const std::int64_t depth = 37, lda = depth + 2, ldb = cols + 7, ldc = cols + 3;
        const std::vector<float> a = random_values(static_cast<std::size_t>(few * lda));
        const std::vector<float> b = random_values(static_cast<std::size_t>(depth * ldb));
        std::vector<float> c(static_cast<std::size_t>(few * ldc), NAN);
        isa.gemm_few_rows_f32(a.data(), lda, few, b.data(), ldb, cols, depth, c.data(), ldc);
        for (int i = 0; i < few; ++i) {
          for (std::int64_t j = 0; j < cols; ++j) {
            double want = 0;
            for (std::int64_t p = 0; p < depth; ++p) {
              want += static_cast<double>(a[static_cast<std::size_t>(i * lda + p)]) *
                      b[static_cast<std::size_t>(p * ldb + j)];
            }
            EXPECT_NEAR(c[static_cast<std::size_t>(i * ldc + j)], want, 1e-5 * depth)
                << isa_name << " few rows: rows " << few << ", cols " << cols << ", i " << i << ", j " << j;
          }
        }
      }
    }
  }
}

// Note [Skinny GEMM] through matmul and linear: products of under 8 rows or columns run on the skinny kernels with
// XPURT_CPU_GEMM=packed (the plan says so), some large enough to be split over the threads.
TEST(CpuBackend, SkinnyProductsThroughMatMulAndLinear) {
  expect_products_match_naive({{1, 1, 1}, {7, 13, 5}, {13, 1, 600}, {1, 1000, 300}, {5, 77, 129}, {300, 3, 200},
                               {2, 2, 2}, {7, 7, 70}, {1, 4096, 512}},
                              90, "skinny kernels under 8 rows or columns");
}

// Note [OpenBLAS older than the CPU]: OpenBLAS cores without AVX2 are known by name, and where this process's OpenBLAS
// runs one on a CPU with AVX2, the packed GEMM takes the products under 64K multiply-adds too and the plan says so.
TEST(CpuBackend, OpenBlasOlderThanTheCpuLeavesSmallProductsToThePackedGemm) {
  for (const char* old : {"prescott", "core2", "nehalem", "sandybridge", "unknown"}) {
    EXPECT_TRUE(cpu::blas_core_lacks_avx2(old)) << old;
  }
  for (const char* current : {"haswell", "skylakex", "cooperlake", "zen", "sapphirerapids"}) {
    EXPECT_FALSE(cpu::blas_core_lacks_avx2(current)) << current;
  }
  if (cpu::blas_core_name() == "none") GTEST_SKIP() << "built without OpenBLAS";
  ScopedEnv gemm_env("XPURT_CPU_GEMM", "packed");
  const std::int64_t m = 24, n = 24, k = 64;  // 36864 multiply-adds
  for (const std::string& isa : isa_names()) {
    ScopedEnv env("XPURT_CPU_ISA", isa.c_str());
    const Tensor a = random_tensor({m, k}, 71);
    const Tensor b = random_tensor({k, n}, 72);
    std::string plan;
    const Tensor y = run("matmul", {a, b}, {}, {}, &plan)[0];
    const bool old = cpu::blas_core_lacks_avx2(cpu::blas_core_name()) && isa != "baseline";
    EXPECT_EQ(plan.find("small products packed too: openblas's " + cpu::blas_core_name()) != std::string::npos, old)
        << plan;
    EXPECT_EQ(plan.find("64K multiply-adds") != std::string::npos, !old) << plan;
    expect_near_all(values(y), naive_matmul(values(a), values(b), m, n, k), 1e-6f * static_cast<float>(k), isa);
  }
}

// Depthwise (one input channel per group, Note [Depthwise convolution on the CPU]) and im2col tiles (Note [CPU
// convolution tiles]) at odd shapes: strides 1-3, dilations, asymmetric pads, channel multipliers, tap counts the
// window loop unrolls (9, 25, 49) and others, output planes larger than one tile, float64.
TEST(CpuBackend, Conv2dWindowLoopsAndTilesMatchNaiveOnEveryIsa) {
  const std::vector<ConvCase> cases = {
      {{2, 5, 13, 17}, {5, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 5, true, true, true},
      {{1, 6, 15, 14}, {6, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 6, true, false, true},
      {{1, 3, 19, 23}, {6, 1, 5, 5}, {2, 3}, {2, 1, 0, 3}, {2, 1}, 3, true, true, false},  // multiplier 2
      {{1, 4, 11, 9}, {4, 1, 7, 7}, {1, 1}, {3, 3, 3, 3}, {1, 1}, 4, false, true, true},
      {{1, 4, 12, 10}, {4, 1, 2, 4}, {3, 1}, {0, 2, 1, 0}, {1, 2}, 4, true, false, false},    // 8 taps
      {{2, 1, 9, 8}, {3, 1, 3, 3}, {1, 2}, {1, 0, 1, 0}, {1, 1}, 1, true, false, true},       // one input channel
      {{1, 2, 5, 5}, {2, 1, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 2, true, false, false},      // 1x1 depthwise
      // Output planes of at most 16 values, computed directly (Note [Depthwise convolution of small planes]).
      {{2, 4, 3, 4}, {8, 1, 3, 3}, {2, 1}, {1, 0, 2, 1}, {2, 1}, 4, true, true, true},        // 1x3, multiplier 2
      {{1, 6, 4, 4}, {6, 1, 5, 5}, {1, 1}, {2, 2, 2, 2}, {1, 1}, 6, true, true, false},       // 4x4, mostly padding
      {{1, 5, 2, 2}, {5, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 5, false, false, true},      // 1x1
      {{1, 3, 5, 5}, {3, 1, 5, 5}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 3, true, false, true},       // window = input
      {{1, 16, 37, 41}, {12, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, true, true},   // many tiles
      {{2, 8, 30, 29}, {8, 2, 3, 3}, {2, 2}, {1, 0, 2, 1}, {1, 1}, 4, true, false, true},     // grouped, strided
      {{1, 24, 33, 35}, {16, 24, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true, true, false},  // 1x1 in tiles
      {{3, 20, 1, 1}, {9, 20, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true, true, true},      // 1x1 images: one GEMM
      {{3, 40, 1, 1}, {40, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 40, true, false, true},    // depthwise, 1x1 images
      // Note [Depthwise convolution of small planes across channels]: blocks of 16, 16 and 5 channels, two images,
      // a dilated strided axis with asymmetric pads (4x2 outputs).
      {{2, 37, 4, 5}, {37, 1, 3, 3}, {1, 2}, {1, 2, 1, 0}, {1, 2}, 37, true, true, true},
  };
  // Windows over the packed GEMM, or im2col tiles over the blocked fallback.
  expect_convs_match_naive(cases, 700, isa_names(), {"auto", "packed", "fallback"}, 2e-5f, true);
}

// Note [Weights packed once per plan]: a plan whose weights the engine marks constant keeps their packing and gives
// the bits of a per-call packing on every call, at every thread count; another weights tensor through the same plan
// (a plan shared by two nodes) is packed for itself, never answered from the first one's packing.
TEST(CpuBackend, ConvolutionsKeepConstantWeightsPackedWithTheSameBits) {
  const std::vector<ConvCase> cases = {
      {{2, 16, 13, 11}, {24, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, false, true},  // windows
      {{1, 12, 15, 14}, {20, 6, 3, 3}, {2, 2}, {1, 0, 1, 2}, {1, 1}, 2, true, true, false},   // grouped, strided
      {{2, 24, 9, 10}, {16, 24, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true, false, true},   // 1x1: x as B
      {{1, 24, 33, 35}, {16, 24, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, false, true, false}, // 1x1 in tiles
      {{1, 16, 9, 9}, {12, 16, 1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, true, false, false},   // strided 1x1: im2col
      {{3, 16, 2, 2}, {24, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, false, true},    // 4 pixels: tiles
      {{1, 64, 14, 14}, {256, 64, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, false, true}, // few tasks, rows split
      {{1, 32, 7, 7}, {100, 32, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, false, false, true},  // one task
  };
  ScopedEnv gemm_env("XPURT_CPU_GEMM", "packed");
  unsigned seed = 900;
  for (const auto& c : cases) {
    const Tensor x = random_tensor(c.x, seed++);
    const Tensor w = random_tensor(c.w, seed++);
    const Tensor w2 = random_tensor(c.w, seed++);  // another node's weights, same shape
    const Tensor bias = c.bias ? random_tensor({c.w[0]}, seed++) : Tensor();
    Shape out_shape;
    naive_conv(values(x), c.x, values(w), c.w, {}, {}, c.strides, c.pads, c.dilations, c.groups, false, &out_shape);
    const Tensor residual = c.residual ? random_tensor(out_shape, seed++) : Tensor();
    const Attributes attrs = conv_attrs(c);
    Values one_thread;
    for (const int threads : {1, 2, 3}) {
      ExecutionPolicy policy;
      policy.intra_op_threads = threads;
      const std::string what = "x " + TensorDesc::of(x).str() + " w " + TensorDesc::of(w).str() + ", " +
                               std::to_string(threads) + " threads";
      const Tensor per_call = run1("conv2d", {x, w, bias, residual}, attrs, policy);
      // Note [Few convolution tasks]: the tiles, and so the bits, do not depend on the threads.
      if (threads == 1) one_thread = values(per_call);
      EXPECT_EQ(values(per_call), one_thread) << what;
      const Tensor per_call2 = run1("conv2d", {x, w2, bias, residual}, attrs, policy);
      OpDescriptor desc = describe("conv2d", {x, w, bias, residual}, attrs, policy);
      desc.inputs[1].constant = true;
      const auto plan = cpu_kernel("conv2d").build(desc, policy, "");
      const auto launch = [&](const Tensor& weights) {
        std::vector<Tensor> inputs = {x, weights, bias, residual};
        inputs.resize(desc.inputs.size());
        std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype)};
        plan->execute(desc, inputs, outputs);
        return outputs[0];
      };
      for (int call = 0; call < 3; ++call) {
        EXPECT_EQ(values(launch(w)), values(per_call)) << what << ", call " << call;
      }
      EXPECT_EQ(values(launch(w2)), values(per_call2)) << what << ": the second weights, through the same plan";
      EXPECT_EQ(values(launch(w)), values(per_call)) << what << ": the first weights again";
    }
  }
}

// Note [Convolution with the pixels as rows] and Note [Windows read in place]: tasks whose output channels fill the
// micro-tiles' lanes better than their pixels compute C^T, and wide planes are read in place, with the bits of the
// packed windows (XPURT_CPU_CONV_WINDOWS=packed), per call and through a plan that keeps the weights packed, at 1 and
// 2 threads, on every instruction set; and against the naive convolution. Pixels as rows: 49 pixels (ResNet-50's last
// stage), 8 pixels left after three tasks of 64 (only the last one swaps), two groups, strides with dilation, several
// depth slices, bias, residual and ReLU; in place: the cases below those.
TEST(CpuBackend, ConvolutionWindowsInPlaceOrPixelsAsRowsKeepTheBitsOfPackedWindows) {
  const std::vector<ConvCase> cases = {
      {{1, 32, 7, 7}, {64, 32, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, true, true},
      {{1, 16, 25, 8}, {96, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, false, true},
      {{2, 16, 14, 14}, {96, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, false, true},  // in place
      {{1, 16, 5, 5}, {128, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 2, false, true, false},
      {{1, 8, 11, 11}, {80, 8, 3, 3}, {2, 2}, {2, 2, 2, 2}, {2, 2}, 1, true, true, false},
      {{1, 64, 7, 7}, {128, 64, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, false, true},
      // Note [Windows read in place]: rows of 40 outputs in planes of 42 (several tasks, a task of only columns past
      // out_w is possible); strided; two groups and two images; one output row; a 5x5 with dilation.
      {{1, 16, 40, 40}, {24, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, true, true},
      {{1, 8, 61, 59}, {20, 8, 3, 3}, {2, 2}, {1, 0, 1, 2}, {1, 1}, 1, true, false, true},
      {{2, 12, 33, 30}, {16, 6, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 2, false, true, false},
      {{1, 16, 3, 70}, {32, 16, 3, 3}, {1, 1}, {0, 1, 0, 1}, {1, 1}, 1, true, false, true},
      {{1, 8, 45, 45}, {16, 8, 5, 5}, {1, 1}, {4, 4, 4, 4}, {2, 2}, 1, true, true, false},
  };
  ScopedEnv gemm_env("XPURT_CPU_GEMM", "packed");
  for (const std::string& isa : isa_names()) {
    if (isa == "baseline") continue;  // the packed GEMM's instruction sets
    ScopedEnv isa_env("XPURT_CPU_ISA", isa.c_str());
    const cpu::CpuContext context = cpu::make_context(ExecutionPolicy());
    EXPECT_TRUE(cpu::conv_pixel_rows_pay(context, 49, 64)) << isa;
    EXPECT_FALSE(cpu::conv_pixel_rows_pay(context, 64, 96)) << isa;
    EXPECT_TRUE(cpu::conv_pixel_rows_pay(context, 8, 96)) << isa;  // the 200-pixel case's last task
    unsigned seed = 1200;
    for (const auto& c : cases) {
      const ConvRun r = conv_run(c, seed);
      const Tensor &x = r.x, &w = r.w, &bias = r.bias, &residual = r.residual;
      const Attributes attrs = conv_attrs(c);
      for (const int threads : {1, 2}) {
        ExecutionPolicy policy;
        policy.intra_op_threads = threads;
        const std::string what = isa + " x " + TensorDesc::of(x).str() + " w " + TensorDesc::of(w).str() + ", " +
                                 std::to_string(threads) + " threads";
        Values channels;
        {
          ScopedEnv windows_env("XPURT_CPU_CONV_WINDOWS", "packed");
          channels = values(run1("conv2d", {x, w, bias, residual}, attrs, policy));
        }
        const Tensor per_call = run1("conv2d", {x, w, bias, residual}, attrs, policy);
        EXPECT_EQ(values(per_call), channels) << what;
        expect_near_all(values(per_call), r.expected, 2e-5f, what);
        OpDescriptor desc = describe("conv2d", {x, w, bias, residual}, attrs, policy);
        desc.inputs[1].constant = true;
        const auto plan = cpu_kernel("conv2d").build(desc, policy, "");
        for (int call = 0; call < 2; ++call) {
          std::vector<Tensor> inputs = {x, w, bias, residual};
          inputs.resize(desc.inputs.size());
          std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype)};
          plan->execute(desc, inputs, outputs);
          EXPECT_EQ(values(outputs[0]), channels) << what << ", constant weights, call " << call;
        }
      }
    }
  }
  ScopedEnv bad("XPURT_CPU_CONV_WINDOWS", "pixels");
  EXPECT_THROW(cpu::make_context(ExecutionPolicy()), InvalidArgumentError);
}

// The same for the B of linear layers (both weight layouts) and MatMul: products the packed GEMM takes (16 and more
// rows), odd sizes, several depth slices.
TEST(CpuBackend, LinearAndMatmulKeepConstantWeightsPackedWithTheSameBits) {
  ScopedEnv gemm_env("XPURT_CPU_GEMM", "packed");
  unsigned seed = 950;
  struct Case {
    std::string op;
    Shape x, w;
    Attributes attrs;
  };
  const std::vector<Case> cases = {
      {"linear", {16, 300}, {77, 300}, Attributes().set("weight_layout", std::string("nk"))},
      {"linear", {3, 9, 130}, {130, 65}, Attributes().set("weight_layout", std::string("kn"))},
      {"linear", {100, 64}, {200, 64}, Attributes().set("activation", std::string("relu"))},
      {"matmul", {2, 12, 257}, {257, 33}, Attributes()},
  };
  for (const auto& c : cases) {
    const Tensor x = random_tensor(c.x, seed++);
    const Tensor w = random_tensor(c.w, seed++);
    const Tensor w2 = random_tensor(c.w, seed++);
    const std::string what = c.op + " x " + TensorDesc::of(x).str() + " w " + TensorDesc::of(w).str();
    const Tensor per_call = run1(c.op, {x, w}, c.attrs);
    const Tensor per_call2 = run1(c.op, {x, w2}, c.attrs);
    OpDescriptor desc = describe(c.op, {x, w}, c.attrs, {});
    desc.inputs[1].constant = true;
    const auto plan = cpu_kernel(c.op).build(desc, {}, "");
    const auto launch = [&](const Tensor& weights) {
      std::vector<Tensor> inputs = {x, weights};
      inputs.resize(desc.inputs.size());
      std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype)};
      plan->execute(desc, inputs, outputs);
      return outputs[0];
    };
    EXPECT_EQ(values(launch(w)), values(per_call)) << what;
    EXPECT_EQ(values(launch(w)), values(per_call)) << what << ", kept";
    EXPECT_EQ(values(launch(w2)), values(per_call2)) << what << ": the second weights";
  }
}

// The store behind it: one packing per storage, address, tag and layout; a storage that died is not answered from,
// even when a new one sits at the same address.
TEST(CpuBackend, PackedConstantsKeepOnePackingPerLiveStorage) {
  cpu::PackedConstants store;
  int packs = 0;
  const auto pack = [&packs] {
    ++packs;
    ScratchVector<float> out(4, static_cast<float>(packs));
    return out;
  };
  std::vector<float> buffer(16, 1.0f);
  const auto view = [&buffer] {  // a new storage over the same bytes each time
    return Tensor::from_blob(buffer.data(), {16}, {1}, DType::kFloat32, Device::cpu(), nullptr);
  };
  const int layout = 0, other_layout = 0;
  {
    const Tensor a = view();
    EXPECT_EQ(store.get(a, 0, &layout, pack)[0], 1.0f);
    EXPECT_EQ(store.get(a, 0, &layout, pack)[0], 1.0f);  // kept
    EXPECT_EQ(packs, 1);
    EXPECT_EQ(store.get(a, 1, &layout, pack)[0], 2.0f);        // another tag
    EXPECT_EQ(store.get(a, 0, &other_layout, pack)[0], 3.0f);  // another instruction set's panels
    const Tensor b = view();                                    // alive beside a, same address: another storage
    EXPECT_EQ(store.get(b, 0, &layout, pack)[0], 4.0f);
    const Tensor a_copy = a;  // the same storage
    EXPECT_EQ(store.get(a_copy, 0, &layout, pack)[0], 1.0f);
    EXPECT_EQ(packs, 4);
    EXPECT_EQ(store.size(), 4u);
  }
  EXPECT_EQ(store.size(), 0u);  // a and b are gone: their packings with them
  const Tensor c = view();
  EXPECT_EQ(store.get(c, 0, &layout, pack)[0], 5.0f);
  EXPECT_EQ(packs, 5);
}

// Plans of one convolution at two input shapes (two signatures, two plans, as a session has per shape) share the
// packing of their constant weights: the process's store gains one entry, not two, and loses it with the weights.
TEST(CpuBackend, PlansOfSeveralShapesShareOnePackingOfTheirWeights) {
  ScopedEnv gemm_env("XPURT_CPU_GEMM", "packed");
  const Attributes attrs = Attributes().set("pads", Shape{1, 1, 1, 1});
  const std::size_t before = cpu::shared_packed_constants().size();
  {
    const Tensor w = random_tensor({16, 8, 3, 3}, 990);
    for (const Shape& x_shape : {Shape{1, 8, 12, 12}, Shape{2, 8, 9, 10}}) {
      const Tensor x = random_tensor(x_shape, 991);
      OpDescriptor desc = describe("conv2d", {x, w}, attrs, {});
      desc.inputs[1].constant = true;
      const auto plan = cpu_kernel("conv2d").build(desc, {}, "");
      std::vector<Tensor> inputs = {x, w};
      inputs.resize(desc.inputs.size());
      std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype)};
      plan->execute(desc, inputs, outputs);
      EXPECT_EQ(values(outputs[0]), values(run1("conv2d", {x, w}, attrs))) << TensorDesc::of(x).str();
    }
    EXPECT_EQ(cpu::shared_packed_constants().size(), before + 1);
  }
  EXPECT_EQ(cpu::shared_packed_constants().size(), before);
}

// Activations other than ReLU after the depthwise window loop (a pass over the plane): short planes scalar, planes of
// 64 values or more through the vectorised sigmoid (Note [Vectorised SiLU in convolution epilogues]), with inputs
// large enough that some arguments of the exponential leave its range and a NaN that must reach its outputs.
TEST(CpuBackend, DepthwiseConvSiluEpilogue) {
  for (const Shape& xs : {Shape{1, 3, 7, 6}, Shape{2, 3, 19, 23}}) {
    SCOPED_TRACE(xs[2]);
    const Shape ws{3, 1, 3, 3};
    Tensor x = random_tensor(xs, 91, -60.0f, 60.0f);
    const Tensor w = random_tensor(ws, 92), bias = random_tensor({3}, 93);
    if (xs[2] > 7) static_cast<float*>(x.data_ptr())[100] = std::numeric_limits<float>::quiet_NaN();
    Shape out_shape;
    const Values linear =
        naive_conv(values(x), xs, values(w), ws, values(bias), {}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 3, false, &out_shape);
    const Attributes attrs = Attributes()
                                 .set("pads", Shape{1, 1, 1, 1})
                                 .set("groups", std::int64_t{3})
                                 .set("activation", std::string("silu"));
    const Values got = values(run1("conv2d", {x, w, bias}, attrs));
    ASSERT_EQ(got.size(), linear.size());
    int beyond = 0;  // pre-activations whose -v leaves exp_f32's range
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double v = linear[i];
      beyond += -v < cpu::kExpLow || -v > cpu::kExpHigh;
      const double expected = v / (1.0 + std::exp(-v));
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(got[i])) << "at " << i;
        continue;
      }
      ASSERT_NEAR(got[i], expected, 2e-5 * std::max(1.0, std::fabs(expected))) << "at " << i << ", v = " << v;
    }
    if (xs[2] > 7) {
      EXPECT_GT(beyond, 0);
    }
  }
}

// A stride past every input (INT64_MAX: one output per axis) with pads wider than one: the first window column inside
// the input is found without overflowing (the structural fuzzer's finding, under UBSan), on the im2col tiles (two
// channels per group) and the direct depthwise kernel (one).
TEST(CpuBackend, Conv2dStridesPastTheInputDoNotOverflow) {
  constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max();
  const std::vector<ConvCase> cases = {
      {{1, 2, 3, 3}, {2, 2, 3, 3}, {kHuge, kHuge}, {3, 3, 3, 3}, {1, 1}, 1, true, false, true},
      {{1, 2, 3, 3}, {2, 1, 3, 3}, {kHuge, kHuge}, {3, 3, 3, 3}, {1, 1}, 2, true, false, false},
  };
  expect_convs_match_naive(cases, 710, {"baseline"}, {"auto"}, 2e-5f, false);
}

TEST(CpuBackend, UnknownOrUnsupportedIsaIsATypedError) {
  const Tensor x = random_tensor({1, 1, 4, 4}, 5);
  const Attributes attrs = Attributes().set("kernel_shape", Shape{2, 2});
  {
    ScopedEnv env("XPURT_CPU_ISA", "avx1024");
    EXPECT_THROW(run1("max_pool2d", {x}, attrs), InvalidArgumentError);
  }
  for (const char* name : {"avx2", "avx512"}) {
    if (cpu::isa_supported(name)) continue;
    ScopedEnv env("XPURT_CPU_ISA", name);
    EXPECT_THROW(run1("max_pool2d", {x}, attrs), UnsupportedOperationError);
  }
  EXPECT_EQ(std::string(cpu::isa_kernels_named("baseline").name), "baseline");
}

// IsaKernels::epilogue_f32 of every instruction set (Note [Convolution epilogues in vectors] in cpu_conv.cpp): the
// bits of apply_activation(act, row + bias (+ residual)) for every activation it takes, with and without a residual,
// at lengths around the vector widths, on values that include NaN, the infinities, -0 and both clamps' edges.
TEST(CpuBackend, EpilogueKernelsGiveTheScalarBitsOnEveryIsa) {
  const std::vector<std::pair<cpu::RowActivation, cpu::Activation>> acts = {
      {cpu::RowActivation::kNone, cpu::Activation::kNone},
      {cpu::RowActivation::kRelu, cpu::Activation::kRelu},
      {cpu::RowActivation::kRelu6, cpu::Activation::kRelu6},
      {cpu::RowActivation::kHardSwish, cpu::Activation::kHardSwish}};
  std::mt19937 gen(17);
  std::normal_distribution<float> normal(0.0f, 5.0f);
  std::vector<float> values = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 6.0f, -6.0f, -3.0f, 3.0f, 5.9999995f};
  while (values.size() < 80) values.push_back(normal(gen));
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& kernels = cpu::isa_kernels_named(isa);
    for (const auto& [row_act, act] : acts) {
      for (const std::int64_t n : {1, 7, 8, 15, 16, 17, 31, 33, 80}) {
        for (const bool with_residual : {false, true}) {
          for (const float bias : {0.0f, -0.75f}) {
            std::vector<float> row(values.begin(), values.begin() + n), want(static_cast<std::size_t>(n));
            std::vector<float> residual(values.rbegin(), values.rbegin() + n);
            for (std::int64_t p = 0; p < n; ++p) {
              const auto i = static_cast<std::size_t>(p);
              want[i] = cpu::apply_activation(act, with_residual ? row[i] + bias + residual[i] : row[i] + bias);
            }
            kernels.epilogue_f32(row.data(), n, bias, with_residual ? residual.data() : nullptr, row_act);
            for (std::size_t i = 0; i < row.size(); ++i) {
              std::uint32_t got_bits = 0, want_bits = 0;
              std::memcpy(&got_bits, &row[i], 4);
              std::memcpy(&want_bits, &want[i], 4);
              const bool both_nan = std::isnan(row[i]) && std::isnan(want[i]);
              ASSERT_TRUE(both_nan || got_bits == want_bits)
                  << isa << ", activation " << static_cast<int>(row_act) << ", n " << n << ", residual "
                  << with_residual << ", bias " << bias << ", element " << i << ": " << row[i] << " vs " << want[i];
            }
          }
        }
      }
    }
  }
}

// IsaKernels::layer_norm_row_f32 of every instruction set (Note [Layer norm rows in independent chains] in
// cpu_norm.cpp) against the row computed in long double: at lengths around the sixteen chains and a long row, with
// each combination of gamma, beta and the addend and the per-row affine (Note [Per-row affine of a layer norm]), in
// place and not, on rows far from zero (the mean matters). The
// baseline table gives the scalar double arithmetic's bits; the others may contract into fused multiply-adds (Note
// [CPU instruction sets]), so all are held to a few float roundings; the returned mean and inv_std too.
TEST(CpuBackend, LayerNormRowsMatchLongDoubleOnEveryIsa) {
  std::mt19937 gen(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& kernels = cpu::isa_kernels_named(isa);
    for (const std::int64_t n : {1, 2, 15, 16, 17, 33, 1000, 16384}) {
      std::vector<float> x(static_cast<std::size_t>(n)), gamma(x.size()), beta(x.size()), addend(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = 100.0f + 3.0f * normal(gen);
        gamma[i] = normal(gen);
        beta[i] = normal(gen);
        addend[i] = normal(gen);
      }
      long double mean = 0;
      for (float v : x) mean += v;
      mean /= static_cast<long double>(n);
      long double squares = 0;
      for (float v : x) squares += (v - mean) * (v - mean);
      const double epsilon = 1e-5;
      const long double inv_std = 1.0L / std::sqrt(squares / static_cast<long double>(n) + epsilon);
      // which: bits 4, 2, 1 gamma, beta, the addend; 8 and 9 the per-row affine, without and with the addend; 10 and 11
      // the same in runs of n / 2 elements (n even) with their own scale and bias.
      const double row_affine[4] = {1.7, -0.3, -0.6, 2.5};
      for (int which = 0; which < 12; ++which) {
        if (which >= 10 && n % 2 != 0) continue;
        for (const bool in_place : {false, true}) {
          SCOPED_TRACE(isa + ", n " + std::to_string(n) + ", operands " + std::to_string(which) +
                       (in_place ? ", in place" : ""));
          const bool affine = which >= 8;
          const std::int64_t run = which >= 10 ? n / 2 : 0;
          const float* g = !affine && (which & 4) ? gamma.data() : nullptr;
          const float* b = !affine && (which & 2) ? beta.data() : nullptr;
          const float* a = (which & 1) ? addend.data() : nullptr;
          std::vector<float> y = in_place ? x : std::vector<float>(x.size(), NAN);
          double stats[2] = {0.0, 0.0};
          kernels.layer_norm_row_f32(in_place ? y.data() : x.data(), n, epsilon, g, b, a,
                                     affine ? row_affine : nullptr, run, y.data(), stats);
          EXPECT_NEAR(stats[0], static_cast<double>(mean), 1e-10);
          EXPECT_NEAR(stats[1], static_cast<double>(inv_std), 1e-9 * static_cast<double>(inv_std) + 1e-12);
          for (std::size_t i = 0; i < y.size(); ++i) {
            long double want = (x[i] - mean) * inv_std;
            if (affine) {
              const std::size_t k = run > 0 && static_cast<std::int64_t>(i) >= run ? 1 : 0;
              want = want * row_affine[2 * k] + row_affine[2 * k + 1];
            }
            if (g != nullptr) want *= g[i];
            if (b != nullptr) want += b[i];
            if (a != nullptr) want += a[i];
            const auto w = static_cast<float>(want);
            ASSERT_NEAR(y[i], w, 4.0f * std::numeric_limits<float>::epsilon() * std::max(1.0f, std::fabs(w)))
                << "element " << i;
          }
        }
      }
    }
  }
}

// IsaKernels::exp_f32 of every instruction set (Note [Vectorised exp on the CPU] in cpu_fused.cpp) against
// double-precision exp over its range [kExpLow, kExpHigh], at lengths with and without a partial last vector: e^x
// within 2 ulp and the sigmoid within 4.
TEST(CpuBackend, ExpKernelsAreWithinTwoUlpOnEveryIsa) {
  std::vector<float> x;
  for (float v = cpu::kExpLow; v <= cpu::kExpHigh; v += 0.00731f) x.push_back(v);
  x.push_back(0.0f);
  x.push_back(-0.0f);
  const auto ulp = [](double exact) {
    const auto f = static_cast<float>(std::fabs(exact));
    return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
  };
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& kernels = cpu::isa_kernels_named(isa);
    for (const std::size_t n : {x.size(), std::size_t{7}, std::size_t{1}}) {
      for (const bool sigmoid : {false, true}) {
        std::vector<float> y(n, -1.0f);
        const float* a = x.data() + (x.size() - n);
        bool outside = false;  // sigmoid's argument of the exponential is -x: x above -kExpLow is outside
        for (std::size_t i = 0; i < n; ++i) outside = outside || (sigmoid && -a[i] < cpu::kExpLow);
        EXPECT_EQ(kernels.exp_f32(a, y.data(), static_cast<std::int64_t>(n), sigmoid), outside)
            << isa << ", n = " << n << (sigmoid ? " (sigmoid)" : "");
        for (std::size_t i = 0; i < n; ++i) {
          const double v = a[i];
          const double exact = sigmoid ? 1.0 / (1.0 + std::exp(-v)) : std::exp(v);
          ASSERT_LE(std::fabs(y[i] - exact), (sigmoid ? 4 : 2) * ulp(exact))
              << isa << (sigmoid ? " sigmoid(" : " exp(") << v << ") = " << y[i] << ", n = " << n;
        }
      }
    }
  }
}

// exp_f32 reports an argument outside its range (or NaN) wherever it sits: in a whole vector or the partial last one.
TEST(CpuBackend, ExpKernelsReportArgumentsOutsideTheirRange) {
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& kernels = cpu::isa_kernels_named(isa);
    for (const float bad : {cpu::kExpHigh + 1.0f, cpu::kExpLow - 1.0f, std::numeric_limits<float>::quiet_NaN()}) {
      for (const std::size_t n : {std::size_t{1}, std::size_t{19}, std::size_t{64}}) {
        for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
          for (const bool sigmoid : {false, true}) {
            std::vector<float> a(n, 0.5f), y(n);
            a[at] = sigmoid ? -bad : bad;
            EXPECT_TRUE(kernels.exp_f32(a.data(), y.data(), static_cast<std::int64_t>(n), sigmoid))
                << isa << " " << bad << " at " << at << " of " << n << (sigmoid ? " (sigmoid)" : "");
          }
        }
      }
    }
  }
}

// Below kExpZero e^x is +0 in float (std::exp's value) and exp_f32 computes it itself: a masked attention score minus
// its row's maximum (-1e4, -1e9, the lowest float, -inf) no longer sends the whole row to std::exp; sigmoid of a large
// argument is exactly 1. Between -104 and -87 (subnormal results) it is still left to the caller.
TEST(CpuBackend, ExpKernelsGiveZeroBelowTheUnderflowBound) {
  const float lowest = std::numeric_limits<float>::lowest(), inf = std::numeric_limits<float>::infinity();
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& kernels = cpu::isa_kernels_named(isa);
    for (const std::size_t n : {std::size_t{1}, std::size_t{19}, std::size_t{64}}) {
      std::vector<float> a(n), y(n, -1.0f);
      const float masked[] = {-104.5f, -1e4f, -1e9f, lowest, -inf};
      for (std::size_t i = 0; i < n; ++i) a[i] = i % 3 == 0 ? masked[i % 5] : -0.25f * static_cast<float>(i % 7);
      EXPECT_FALSE(kernels.exp_f32(a.data(), y.data(), static_cast<std::int64_t>(n), false)) << isa << ", n = " << n;
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(y[i], std::exp(a[i])) << isa << ": exp(" << a[i] << ")";
        if (i % 3 == 0) {
          EXPECT_EQ(y[i], 0.0f);
        }
      }
      for (float& v : a) v = -v;  // sigmoid of the large positive arguments: exactly 1
      EXPECT_FALSE(kernels.exp_f32(a.data(), y.data(), static_cast<std::int64_t>(n), true)) << isa << ", n = " << n;
      for (std::size_t i = 0; i < n; i += 3) EXPECT_EQ(y[i], 1.0f) << isa << ": sigmoid(" << a[i] << ")";
      for (float& v : a) v = -v;  // back to the masked scores, with one subnormal e^-95: still the caller's
      a[n / 2] = -95.0f;
      EXPECT_TRUE(kernels.exp_f32(a.data(), y.data(), static_cast<std::int64_t>(n), false)) << isa;
    }
  }
  EXPECT_TRUE(cpu::exp_outside(-95.0f) && cpu::exp_outside(89.0f) && cpu::exp_outside(std::nanf("")));
  EXPECT_FALSE(cpu::exp_outside(-104.5f) || cpu::exp_outside(-inf) || cpu::exp_outside(-3.0f));
}

// Note [Softmax rows in vectors] (cpu_norm.cpp): every table's softmax_row_f32 against the double softmax at lengths
// with and without a partial last vector, with masked scores (-1e9, the lowest float, -inf), scores whose e^(x - max)
// is subnormal (std::exp's), and the rows the caller turns into NaN (NaN, +inf, only -inf).
TEST(CpuBackend, SoftmaxRowsMatchTheDoubleSoftmaxOnEveryIsa) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& kernels = cpu::isa_kernels_named(isa);
    for (const std::int64_t n : {1, 5, 16, 37, 128, 1000}) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<float> x(static_cast<std::size_t>(n)), y(x.size(), -1.0f);
        for (std::size_t i = 0; i < x.size(); ++i) {
          x[i] = normal(rng);
          if (pattern == 1 && i % 2 == 1) {
            x[i] = i % 3 == 0 ? -1e9f : (i % 3 == 1 ? std::numeric_limits<float>::lowest() : -inf);
          }
          if (pattern == 2 && i % 3 == 2) x[i] = -95.0f;  // e^(x - max) subnormal
        }
        ASSERT_TRUE(kernels.softmax_row_f32(x.data(), y.data(), n)) << isa << ", n = " << n;
        double top = -inf, total = 0;
        for (float v : x) top = std::max(top, static_cast<double>(v));
        for (float v : x) total += std::exp(static_cast<double>(v) - top);
        for (std::size_t i = 0; i < x.size(); ++i) {
          // exp within 2 ulp, the scale 1, and x - max rounded to float: |x - max| x 2^-24 relative after exp.
          const double d = static_cast<double>(x[i]) - top, want = std::exp(d) / total;
          if (want == 0) {
            ASSERT_EQ(y[i], 0.0f) << isa << ", n = " << n << ", i = " << i;
            continue;
          }
          ASSERT_NEAR(y[i], want, want * (4.8e-7 + std::fabs(d) * 6e-8) + 1e-44)
              << isa << ", n = " << n << ", pattern " << pattern << ", i = " << i;
        }
      }
      std::vector<float> bad(static_cast<std::size_t>(n), 1.0f), y(bad.size(), 7.0f);
      for (const float v : {std::numeric_limits<float>::quiet_NaN(), inf}) {
        bad[static_cast<std::size_t>(n / 2)] = v;
        EXPECT_FALSE(kernels.softmax_row_f32(bad.data(), y.data(), n)) << isa << ", " << v;
      }
      std::fill(bad.begin(), bad.end(), -inf);
      EXPECT_FALSE(kernels.softmax_row_f32(bad.data(), y.data(), n)) << isa << ", a row of -inf";
      EXPECT_EQ(y[0], 7.0f);  // untouched
    }
  }
}

// Note [Softmax along any axis] (cpu_norm.cpp): softmax and log_softmax of float32 along the first, a middle and the
// last axis (inner 1 and more, widths that leave partial blocks and blocks of one lane) against the double formulas,
// with masked (-1e9, -inf) and subnormal-result scores; lines holding NaN or +inf, or only -inf, give NaN and leave
// the other lines alone; the bits do not depend on the thread count.
TEST(CpuBackend, SoftmaxAndLogSoftmaxAlongAnyAxisMatchTheDoubleFormulas) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<std::int64_t> shape;
    std::int64_t axis;
  };
  const Case cases[] = {{{257, 3}, 0}, {{5, 33, 301}, 1}, {{3, 7, 1000}, -1}, {{2, 300, 1}, 1}, {{1, 1}, 0},
                        {{4, 5, 2}, 0},  {{9, 2049}, 1},   {{600, 2}, 0}};
  for (const Case& c : cases) {
    Tensor x = Tensor::empty(c.shape, DType::kFloat32);
    auto* p = static_cast<float*>(x.data_ptr());
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      p[i] = normal(rng);
      if (i % 11 == 3) p[i] = i % 2 == 0 ? -1e9f : -inf;
      if (i % 13 == 5) p[i] = -100.0f;  // e^(x - max) subnormal
    }
    const std::size_t rank = c.shape.size();
    const auto axis = static_cast<std::size_t>(c.axis < 0 ? c.axis + static_cast<std::int64_t>(rank) : c.axis);
    std::int64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= c.shape[d];
    for (std::size_t d = axis + 1; d < rank; ++d) inner *= c.shape[d];
    const std::int64_t length = c.shape[axis];
    if (outer * inner > 1) {  // line 0: a NaN; line 1 (if any): +inf; the last line: only -inf
      p[0] = nan;
      if (outer * inner > 2) p[1 == inner ? length : 1] = inf;
      const std::int64_t last = outer * inner - 1, base = last / inner * length * inner + last % inner;
      for (std::int64_t i = 0; i < length; ++i) p[base + i * inner] = -inf;
    }
    for (const char* op : {"softmax", "log_softmax"}) {
      const bool log = std::string(op) == "log_softmax";
      ExecutionPolicy one, two;
      one.intra_op_threads = 1;
      two.intra_op_threads = 2;
      const Tensor y1 = run1(op, {x}, Attributes().set("axis", c.axis), one);
      const Tensor y2 = run1(op, {x}, Attributes().set("axis", c.axis), two);
      ASSERT_EQ(std::memcmp(y1.data_ptr(), y2.data_ptr(), static_cast<std::size_t>(y1.nbytes())), 0) << op;
      const auto* y = static_cast<const float*>(y1.data_ptr());
      for (std::int64_t line = 0; line < outer * inner; ++line) {
        const std::int64_t base = line / inner * length * inner + line % inner;
        double top = -inf, total = 0;
        bool bad = false;
        for (std::int64_t i = 0; i < length; ++i) {
          const float v = p[base + i * inner];
          bad = bad || std::isnan(v) || v == inf;
          top = std::max(top, static_cast<double>(v));
        }
        bad = bad || top == -inf;
        for (std::int64_t i = 0; i < length && !bad; ++i) total += std::exp(p[base + i * inner] - top);
        for (std::int64_t i = 0; i < length; ++i) {
          const float got = y[base + i * inner];
          if (bad) {
            ASSERT_TRUE(std::isnan(got)) << op << " line " << line;
            continue;
          }
          const double d = static_cast<double>(p[base + i * inner]) - top;
          const double want = log ? d - std::log(total) : std::exp(d) / total;
          if ((!log && want == 0) || (log && std::isinf(want))) {  // a masked score: 0, or -inf for log_softmax
            ASSERT_EQ(got, static_cast<float>(want)) << op;
            continue;
          }
          const double tolerance = log ? std::fabs(want) * 1e-6 + 1e-6 : want * (4.8e-7 + std::fabs(d) * 6e-8) + 1e-44;
          ASSERT_NEAR(got, want, tolerance) << op << " shape " << c.shape.size() << "-d, axis " << c.axis
                                            << ", line " << line << ", i " << i;
        }
      }
    }
  }
}

// Note [Vectorised tanh, erf and GELU] (cpu_isa_baseline.cpp): every table's math_f32 against the double functions,
// 400k points over [-12, 12] plus the ends of each polynomial's range, at lengths with partial last vectors: within
// 3 float ulps (tanh, erf) of the exact value, the GELUs within 1e-5 relative plus 1e-7 (their negative tails are
// erfc-accurate: a few tens of ulps where the value is tiny); NaN propagates, infinities give +-1 (tanh, erf), +inf and
// NaN (GELU of +inf and -inf, as the scalar formulas give), large negative GELU arguments -0.
TEST(CpuBackend, VectorMathMatchesTheDoubleFunctionsOnEveryIsa) {
  std::vector<float> x;
  for (int i = 0; i <= 400000; ++i) x.push_back(-12.0f + 24.0f * static_cast<float>(i) / 400000.0f);
  for (const float v : {0.0f, -0.0f, 1e-30f, 0.62499f, 0.625f, 0.6251f, 0.99999f, 1.0f, 1.00001f, 3.999f, 4.0f, 4.001f,
                        9.99f, 10.0f, 10.01f, 50.0f, -50.0f, 1e30f, -1e30f}) {
    x.push_back(v);
  }
  const double kSqrt2OverPi = 0.79788456080286535588;
  auto exact = [&](cpu::VectorMath op, double v) {
    const double u = kSqrt2OverPi * (v + 0.044715 * v * v * v);
    switch (op) {
      case cpu::VectorMath::kTanh: return std::tanh(v);
      case cpu::VectorMath::kErf: return std::erf(v);
      case cpu::VectorMath::kGelu:
        return 0.5 * v * (v < 0 ? std::erfc(-v / std::sqrt(2.0)) : 1.0 + std::erf(v / std::sqrt(2.0)));
      case cpu::VectorMath::kGeluTanh:
        return 0.5 * v * (u < 0 ? 2.0 / (std::exp(-2.0 * u) + 1.0) : 1.0 + std::tanh(u));
    }
    return 0.0;
  };
  const auto ulp = [](double value) {
    const auto f = static_cast<float>(std::fabs(value));
    return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& kernels = cpu::isa_kernels_named(isa);
    for (const auto op : {cpu::VectorMath::kTanh, cpu::VectorMath::kErf, cpu::VectorMath::kGelu,
                          cpu::VectorMath::kGeluTanh}) {
      const bool gelu = op == cpu::VectorMath::kGelu || op == cpu::VectorMath::kGeluTanh;
      for (const std::size_t n : {x.size(), std::size_t{7}, std::size_t{1}}) {
        std::vector<float> y(n);
        const float* a = x.data() + (x.size() - n);
        kernels.math_f32(a, y.data(), static_cast<std::int64_t>(n), op);
        for (std::size_t i = 0; i < n; ++i) {
          const double want = exact(op, a[i]);
          const double tolerance = gelu ? 1e-5 * std::fabs(want) + 1e-7 : 3 * ulp(want);
          ASSERT_LE(std::fabs(y[i] - want), tolerance) << isa << " op " << static_cast<int>(op) << "(" << a[i]
                                                       << ") = " << y[i] << ", exact " << want << ", n = " << n;
        }
      }
      const std::vector<float> special{nan, inf, -inf, -200.0f};
      std::vector<float> y(special.size());
      kernels.math_f32(special.data(), y.data(), static_cast<std::int64_t>(special.size()), op);
      EXPECT_TRUE(std::isnan(y[0])) << isa;
      EXPECT_EQ(y[1], gelu ? inf : 1.0f) << isa;
      if (gelu) {
        EXPECT_TRUE(std::isnan(y[2])) << isa;  // -inf * 0, as 0.5 x (1 + erf(x / sqrt 2)) in float gives
        EXPECT_EQ(y[3], 0.0f) << isa;
        EXPECT_TRUE(std::signbit(y[3])) << isa;
      } else {
        EXPECT_EQ(y[2], -1.0f) << isa;
        EXPECT_EQ(y[3], -1.0f) << isa;
      }
    }
  }
}

// ---- pooling ----

TEST(CpuBackend, MaxPoolCeilModeAndDilations) {
  Values v(16);
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  const Tensor x = make({1, 1, 4, 4}, v);
  EXPECT_EQ(values(run1("max_pool2d", {x}, Attributes().set("kernel_shape", Shape{2, 2}))), (Values{5, 7, 13, 15}));
  // 3x3 window, stride 2 over 4x4: floor gives 1x1, ceil gives 2x2 (the last windows hang over the edge).
  const Attributes ceil = Attributes().set("kernel_shape", Shape{3, 3}).set("strides", Shape{2, 2}).set("ceil_mode", 1);
  EXPECT_EQ(values(run1("max_pool2d", {x}, ceil)), (Values{10, 11, 14, 15}));
  // Dilation 2: window rows/cols {0, 2}; padding never wins over negative values.
  const Tensor neg = make({1, 1, 3, 3}, {-1, -2, -3, -4, -5, -6, -7, -8, -9});
  EXPECT_EQ(
      values(run1(
          "max_pool2d", {neg},
          Attributes().set("kernel_shape", Shape{2, 2}).set("dilations", Shape{2, 2}).set("strides", Shape{1, 1}))),
      (Values{-1}));
  EXPECT_EQ(
      values(run1("max_pool2d", {neg}, Attributes().set("kernel_shape", Shape{2, 2}).set("pads", Shape{1, 1, 1, 1}))),
      (Values{-1, -2, -4, -5}));
}

// Max over the window positions inside the input, NaN propagating; -inf for a window with none (double).
Values naive_max_pool(const Values& x, const Shape& xs, Shape kernel, Shape strides, Shape pads, Shape dilations,
                      const Shape& ys) {
  Values y;
  for (std::int64_t plane = 0; plane < xs[0] * xs[1]; ++plane) {
    for (std::int64_t i = 0; i < ys[2]; ++i) {
      for (std::int64_t j = 0; j < ys[3]; ++j) {
        double best = -std::numeric_limits<double>::infinity();
        for (std::int64_t u = 0; u < kernel[0]; ++u) {
          for (std::int64_t v = 0; v < kernel[1]; ++v) {
            const std::int64_t ih = i * strides[0] - pads[0] + u * dilations[0];
            const std::int64_t iw = j * strides[1] - pads[1] + v * dilations[1];
            if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
            const double value = x[static_cast<std::size_t>((plane * xs[2] + ih) * xs[3] + iw)];
            if (std::isnan(value) || std::isnan(best)) {
              best = std::numeric_limits<double>::quiet_NaN();
            } else {
              best = std::max(best, value);
            }
          }
        }
        y.push_back(static_cast<float>(best));
      }
    }
  }
  return y;
}

// Max pooling by rows (cpu_isa.h, Note [Max pooling by rows]) on every instruction set: strides 1-3, dilations,
// asymmetric pads, ceil_mode, NaN inputs, float64, planes of every size.
TEST(CpuBackend, MaxPoolWindowLoopMatchesNaiveOnEveryIsa) {
  struct Case {
    Shape x, kernel, strides, pads, dilations;
    bool ceil;
  };
  const std::vector<Case> cases = {
      {{2, 3, 16, 16}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false},
      {{1, 2, 13, 17}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, false},
      {{1, 2, 11, 14}, {2, 3}, {3, 2}, {0, 1, 1, 0}, {2, 1}, true},
      {{1, 1, 9, 9}, {5, 5}, {2, 3}, {2, 2, 2, 2}, {1, 1}, true},
      {{3, 1, 7, 5}, {1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false},
      // the common windows' rows (max_pool_fixed_row), with edge rows left to the general loops
      {{1, 3, 10, 11}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, true},
      {{2, 2, 7, 9}, {2, 2}, {1, 1}, {1, 0, 0, 1}, {1, 1}, false},
      {{1, 2, 15, 15}, {3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, true},
      {{1, 1, 33, 40}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false},
      {{2, 21, 9, 9}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false},
      {{3, 7, 6, 11}, {2, 3}, {1, 2}, {0, 1, 1, 0}, {2, 1}, true},
      // rows of 8 to 32 columns in vectors, the last one overlapping (max_pool_fixed_columns), and 7 and 33 around them
      {{3, 4, 15, 15}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false},
      {{1, 3, 9, 8}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, false},
      {{1, 3, 9, 7}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, true},
      {{1, 2, 12, 32}, {2, 2}, {1, 1}, {0, 0, 0, 0}, {1, 1}, false},
      {{1, 2, 12, 33}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false},
      {{1, 2, 10, 19}, {3, 3}, {1, 1}, {0, 0, 0, 0}, {1, 1}, false},
  };
  unsigned seed = 900;
  for (const auto& c : cases) {
    Values v = random_values(c.x[0] * c.x[1] * c.x[2] * c.x[3], seed++);
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[v.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    const Tensor x = make(c.x, v);
    const Attributes attrs = Attributes()
                                 .set("kernel_shape", c.kernel)
                                 .set("strides", c.strides)
                                 .set("pads", c.pads)
                                 .set("dilations", c.dilations)
                                 .set("ceil_mode", std::int64_t{c.ceil ? 1 : 0});
    for (const std::string& isa : isa_names()) {
      ScopedEnv env("XPURT_CPU_ISA", isa.c_str());
      const Tensor y = run1("max_pool2d", {x}, attrs);
      const Values expected = naive_max_pool(v, c.x, c.kernel, c.strides, c.pads, c.dilations, y.shape());
      expect_near_all(values(y), expected, 0.0f, isa);
      expect_near_all(values(run1("max_pool2d", {cast(x, "float64")}, attrs)), expected, 0.0f, isa + " float64");
    }
  }
}

TEST(CpuBackend, AvgPoolDivisorRules) {
  const Tensor x = make({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  const Attributes padded =
      Attributes().set("kernel_shape", Shape{2, 2}).set("strides", Shape{2, 2}).set("pads", Shape{1, 1, 1, 1});
  // Windows: {1}, {2,3}, {4,7}, {5,6,8,9}.
  EXPECT_EQ(values(run1("avg_pool2d", {x}, padded)), (Values{1, 2.5f, 5.5f, 7}));
  Attributes include = padded;
  include.set("count_include_pad", 1);
  EXPECT_EQ(values(run1("avg_pool2d", {x}, include)), (Values{0.25f, 1.25f, 2.75f, 7}));
  // ceil_mode without padding: the overhanging window counts only what lies in the input, even with
  // count_include_pad (PyTorch's rule).
  const Attributes ceil = Attributes().set("kernel_shape", Shape{2, 2}).set("ceil_mode", 1).set("count_include_pad", 1);
  EXPECT_EQ(values(run1("avg_pool2d", {x}, ceil)), (Values{3, 4.5f, 7.5f, 9}));
  EXPECT_EQ(values(run1("global_avg_pool", {x})), (Values{5}));
}

// Note [Pooling windows]' average: the window clipped to the padded input (its length the divisor with
// count_include_pad), then to the input (its length the divisor otherwise); sums in double.
Values naive_avg_pool(const Values& x, const Shape& xs, const Shape& kernel, const Shape& strides, const Shape& pads,
                      bool count_include_pad, const Shape& ys) {
  Values y;
  for (std::int64_t plane = 0; plane < xs[0] * xs[1]; ++plane) {
    for (std::int64_t i = 0; i < ys[2]; ++i) {
      const std::int64_t h0 = i * strides[0] - pads[0], h1 = std::min(h0 + kernel[0], xs[2] + pads[2]);
      for (std::int64_t j = 0; j < ys[3]; ++j) {
        const std::int64_t w0 = j * strides[1] - pads[1], w1 = std::min(w0 + kernel[1], xs[3] + pads[3]);
        double sum = 0.0;
        std::int64_t inside = 0;
        for (std::int64_t ih = std::max<std::int64_t>(h0, 0); ih < std::min(h1, xs[2]); ++ih) {
          for (std::int64_t iw = std::max<std::int64_t>(w0, 0); iw < std::min(w1, xs[3]); ++iw) {
            sum += x[static_cast<std::size_t>((plane * xs[2] + ih) * xs[3] + iw)];
            ++inside;
          }
        }
        const std::int64_t count = count_include_pad ? (h1 - h0) * (w1 - w0) : inside;
        y.push_back(static_cast<float>(sum / static_cast<double>(count)));
      }
    }
  }
  return y;
}

// Average pooling by rows (cpu_isa.h, Note [Average pooling by rows]) and of small planes across channels on every
// instruction set: strides 1-3, edge windows on both sides, asymmetric pads, ceil_mode, both divisor rules, float64.
TEST(CpuBackend, AvgPoolByRowsMatchesNaiveOnEveryIsa) {
  struct Case {
    Shape x, kernel, strides, pads;
    bool ceil;
  };
  const std::vector<Case> cases = {
      {{2, 3, 16, 16}, {3, 3}, {2, 2}, {1, 1, 1, 1}, false}, {{1, 2, 13, 17}, {3, 3}, {1, 1}, {1, 1, 1, 1}, false},
      {{1, 2, 11, 14}, {2, 3}, {3, 2}, {0, 1, 1, 0}, true},  {{1, 1, 9, 9}, {5, 5}, {2, 3}, {2, 2, 2, 2}, true},
      {{3, 1, 7, 5}, {1, 1}, {2, 2}, {0, 0, 0, 0}, false},   {{1, 2, 6, 40}, {2, 7}, {2, 2}, {0, 3, 1, 3}, true},
      // small planes averaged 16 at a time (Note [Average pooling of small planes across channels]), the last block
      // partly filled
      {{2, 21, 9, 9}, {3, 3}, {2, 2}, {1, 1, 1, 1}, false},  {{3, 7, 8, 7}, {2, 3}, {1, 2}, {0, 1, 1, 0}, true},
  };
  unsigned seed = 950;
  for (const auto& c : cases) {
    const Values v = random_values(c.x[0] * c.x[1] * c.x[2] * c.x[3], seed++);
    const Tensor x = make(c.x, v);
    for (const bool include : {false, true}) {
      const Attributes attrs = Attributes()
                                   .set("kernel_shape", c.kernel)
                                   .set("strides", c.strides)
                                   .set("pads", c.pads)
                                   .set("ceil_mode", std::int64_t{c.ceil ? 1 : 0})
                                   .set("count_include_pad", std::int64_t{include ? 1 : 0});
      for (const std::string& isa : isa_names()) {
        ScopedEnv env("XPURT_CPU_ISA", isa.c_str());
        const Tensor y = run1("avg_pool2d", {x}, attrs);
        const Values expected = naive_avg_pool(v, c.x, c.kernel, c.strides, c.pads, include, y.shape());
        expect_near_all(values(y), expected, 1e-6f, isa);
        expect_near_all(values(run1("avg_pool2d", {cast(x, "float64")}, attrs)), expected, 1e-6f, isa + " float64");
      }
    }
  }
}

// ---- normalization ----

TEST(CpuBackend, BatchNormSoftmaxLayerNorm) {
  const Tensor x = make({1, 2, 2}, {1, 2, 3, 4});
  const Tensor y = run1("batch_norm", {x, make({2}, {2, 1}), make({2}, {0, 1}), make({2}, {1, 3}), make({2}, {4, 1})},
                        Attributes().set("epsilon", 0.0));
  EXPECT_EQ(values(y), (Values{0, 1, 1, 2}));

  const Tensor s = make({2, 2}, {0, std::log(3.0f), 1000, 1000});
  expect_near_all(values(run1("softmax", {s})), (Values{0.25f, 0.75f, 0.5f, 0.5f}), 1e-6f);
  // axis 0 of [[0, 0], [ln 3, ln 3]]
  const Tensor s0 = make({2, 2}, {0, 0, std::log(3.0f), std::log(3.0f)});
  expect_near_all(values(run1("softmax", {s0}, Attributes().set("axis", 0))), (Values{0.25f, 0.25f, 0.75f, 0.75f}),
                  1e-6f);
  // An all -inf row is NaN (torch.softmax), the others unaffected.
  const Values masked = values(run1("softmax", {make({2, 2}, {-kInf, -kInf, 0, 0})}));
  EXPECT_TRUE(std::isnan(masked[0]) && std::isnan(masked[1]));
  EXPECT_EQ(masked[2], 0.5f);

  // layer_norm over the last two dims of [1, 2, 2]: mean 2.5, var 1.25.
  const float inv = 1.0f / std::sqrt(1.25f + 1e-5f);
  expect_near_all(values(run1("layer_norm", {x}, Attributes().set("axis", 1))),
                  (Values{-1.5f * inv, -0.5f * inv, 0.5f * inv, 1.5f * inv}), 1e-6f);
  const Tensor scale = make({2}, {2, 3});
  const Tensor bias = make({2}, {1, -1});
  // over the last dim: rows [1,2] and [3,4] both normalize to [-1, 1] (up to epsilon)
  const float r = 0.5f / std::sqrt(0.25f + 1e-5f);
  expect_near_all(values(run1("layer_norm", {x, scale, bias})), (Values{1 - 2 * r, -1 + 3 * r, 1 - 2 * r, -1 + 3 * r}),
                  1e-6f);
  expect_near_all(values(run1("layer_norm", {x, Tensor(), bias})), (Values{1 - r, -1 + r, 1 - r, -1 + r}), 1e-6f);
  // Note [Per-row affine of a layer norm]: row 0 ([1, 2]) takes scale 2 and bias 1, row 1 ([3, 4]) 3 and -1; in
  // double too. A scale whose length does not divide the rows is refused, as is one of another length than the bias.
  const Attributes per_row = Attributes().set("row_affine", std::int64_t{1});
  expect_near_all(values(run1("layer_norm", {x, scale, bias}, per_row)),
                  (Values{-2 * r + 1, 2 * r + 1, -3 * r - 1, 3 * r - 1}), 1e-6f);
  expect_near_all(values(run1("layer_norm", {cast(x, "float64"), cast(scale, "float64"), cast(bias, "float64")},
                              per_row)),
                  (Values{-2 * r + 1, 2 * r + 1, -3 * r - 1, 3 * r - 1}), 1e-6f);
  XPURT_EXPECT_THROW_WITH(run1("layer_norm", {x, make({3}, {1, 1, 1})}, per_row), InvalidArgumentError,
                          "row_affine=1");
  XPURT_EXPECT_THROW_WITH(run1("layer_norm", {x, make({1}, {1}), bias}, per_row), InvalidArgumentError,
                          "row_affine=1");
  // Runs of one element (affine_run=1): the four values of [2, 2] take scale [2, 3, 5, 7] and bias [1, -1, 0, 2] in
  // turn; at 1 and 2 threads, float and double (the generic rows). A run that does not divide the row is refused.
  const Attributes runs = Attributes().set("row_affine", std::int64_t{1}).set("affine_run", std::int64_t{1});
  const Tensor scale4 = make({4}, {2, 3, 5, 7}), bias4 = make({4}, {1, -1, 0, 2});
  const Values by_run = {-2 * r + 1, 3 * r - 1, -5 * r, 7 * r + 2};
  for (const int threads : {1, 2}) {
    ExecutionPolicy policy;
    policy.intra_op_threads = threads;
    expect_near_all(values(run1("layer_norm", {x, scale4, bias4}, runs, policy)), by_run, 1e-6f);
    expect_near_all(values(run1("layer_norm", {cast(x, "float64"), cast(scale4, "float64"), cast(bias4, "float64")},
                                runs, policy)),
                    by_run, 1e-6f);
  }
  XPURT_EXPECT_THROW_WITH(
      run1("layer_norm", {make({1, 3}, {1, 2, 3}), scale, bias},
           Attributes().set("row_affine", std::int64_t{1}).set("affine_run", std::int64_t{2})),
      InvalidArgumentError, "affine_run=2");
}

// ---- elementwise ----

TEST(CpuBackend, UnaryOpsAndActivations) {
  const Values in = {-2.5f, -1, -0.25f, 0, 0.5f, 1, 3};
  const Values positive = {0.25f, 1, 2, 9};
  const Tensor x = make({7}, in);
  const Tensor p = make({4}, positive);
  auto map = [](const Values& v, float (*f)(float)) {
    Values out;
    for (float e : v) out.push_back(f(e));
    return out;
  };
  expect_near_all(values(run1("relu", {x})), map(in, [](float v) { return v > 0 ? v : 0.0f; }), 0);
  expect_near_all(values(run1("sigmoid", {x})), map(in, [](float v) { return 1 / (1 + std::exp(-v)); }), 1e-6f);
  expect_near_all(values(run1("tanh", {x})), map(in, [](float v) { return std::tanh(v); }), 1e-6f);
  expect_near_all(values(run1("silu", {x})), map(in, [](float v) { return v / (1 + std::exp(-v)); }), 1e-6f);
  expect_near_all(values(run1("gelu", {x})),
                  map(in, [](float v) { return 0.5f * v * (1 + std::erf(v / std::sqrt(2.0f))); }), 1e-6f);
  expect_near_all(
      values(run1("gelu", {x}, Attributes().set("approximate", std::string("tanh")))),
      map(in, [](float v) { return 0.5f * v * (1 + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))); }), 1e-6f);
  expect_near_all(values(run1("exp", {x})), map(in, [](float v) { return std::exp(v); }), 1e-6f);
  expect_near_all(values(run1("neg", {x})), map(in, [](float v) { return -v; }), 0);
  expect_near_all(values(run1("abs", {x})), map(in, [](float v) { return std::fabs(v); }), 0);
  expect_near_all(values(run1("erf", {x})), map(in, [](float v) { return std::erf(v); }), 1e-6f);
  expect_near_all(values(run1("log", {p})), map(positive, [](float v) { return std::log(v); }), 1e-6f);
  expect_near_all(values(run1("sqrt", {p})), (Values{0.5f, 1, std::sqrt(2.0f), 3}), 0);
  expect_near_all(values(run1("reciprocal", {p})), (Values{4, 1, 0.5f, 1.0f / 9}), 0);
  // Large negative inputs: no overflow into NaN.
  EXPECT_EQ(values(run1("sigmoid", {make({1}, {-1000})}))[0], 0.0f);
  EXPECT_TRUE(std::isnan(values(run1("relu", {make({1}, {std::nanf("")})}))[0]));
}

TEST(CpuBackend, BinaryOpsBroadcastLikeNumPy) {
  // [2, 1, 3] op [4, 1] -> [2, 4, 3]
  const Values va = {1, 2, 3, 4, 5, 6}, vb = {10, 20, 30, 40};
  const Tensor a = make({2, 1, 3}, va);
  const Tensor b = make({4, 1}, vb);
  const Tensor y = run1("sub", {a, b});
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3}));
  Values expected;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k) expected.push_back(va[i * 3 + k] - vb[j]);
  EXPECT_EQ(values(y), expected);
  // scalar-like operand, both directions
  EXPECT_EQ(values(run1("mul", {make({}, {2}), a})), (Values{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(values(run1("div", {a, make({1}, {2})})), (Values{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  EXPECT_EQ(values(run1("add", {make({3}, {1, 2, 3}), make({3}, {1, 1, 1})})), (Values{2, 3, 4}));
  EXPECT_EQ(values(run1("pow", {make({3}, {2, 3, 4}), make({3}, {3, 2, 0.5f})})), (Values{8, 9, 2}));
  const float nan = std::nanf("");
  const Values mx = values(run1("maximum", {make({3}, {1, nan, 5}), make({3}, {2, 0, 4})}));
  EXPECT_EQ(mx[0], 2);
  EXPECT_TRUE(std::isnan(mx[1]));
  EXPECT_EQ(mx[2], 5);
  EXPECT_EQ(values(run1("minimum", {make({2, 1}, {1, 5}), make({2}, {2, 3})})), (Values{1, 1, 2, 3}));
}

TEST(CpuBackend, CastRoundsToNearestEvenOnce) {
  const float one = 1.0f;
  const Tensor x = make({6}, {one, 65504.0f, 65520.0f, one + std::ldexp(1.0f, -11), one + 3 * std::ldexp(1.0f, -11),
                              std::ldexp(1.0f, -25) * 1.5f});
  EXPECT_EQ(bits16(cast(x, "float16")), (std::vector<std::uint16_t>{0x3C00, 0x7BFF, 0x7C00, 0x3C00, 0x3C02, 0x0001}));
  const Tensor xb = make({3}, {one + std::ldexp(1.0f, -8), one + 3 * std::ldexp(1.0f, -8), -2.0f});
  EXPECT_EQ(bits16(cast(xb, "bfloat16")), (std::vector<std::uint16_t>{0x3F80, 0x3F82, 0xC000}));
  // float64 -> float16 in one rounding: 1 + 2^-11 + 2^-40 is just above the halfway point, so it rounds up
  // (double -> float -> half would round to the even 1.0).
  Tensor d = Tensor::empty({2}, DType::kFloat64);
  static_cast<double*>(d.data_ptr())[0] = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  static_cast<double*>(d.data_ptr())[1] = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(bits16(cast(d, "float16"))[0], 0x3C01);
  EXPECT_EQ(bits16(cast(d, "bfloat16"))[1], 0x3F81);
  // Round trips through 16 bits are exact for representable values.
  const Tensor r = make({3}, {0.5f, -3.0f, 1024.0f});
  EXPECT_EQ(values(cast(cast(r, "float16"), "bfloat16")), (Values{0.5f, -3.0f, 1024.0f}));
  EXPECT_EQ(static_cast<const double*>(cast(r, "float64").data_ptr())[1], -3.0);
}

// ---- reductions ----

TEST(CpuBackend, ReductionsOverAnyAxes) {
  Values v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<float>(i);
  const Tensor x = make({2, 3, 4}, v);
  Tensor y = run1("reduce_sum", {x}, Attributes().set("axes", Shape{1}));
  EXPECT_EQ(y.shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(values(y), (Values{12, 15, 18, 21, 48, 51, 54, 57}));
  y = run1("reduce_mean", {x}, Attributes().set("axes", Shape{0, -1}).set("keepdims", 0));
  EXPECT_EQ(y.shape(), (Shape{3}));
  EXPECT_EQ(values(y), (Values{7.5f, 11.5f, 15.5f}));
  y = run1("reduce_max", {x}, Attributes().set("axes", Shape{2, 0}));
  EXPECT_EQ(y.shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(values(y), (Values{15, 19, 23}));
  y = run1("reduce_min", {x}, Attributes().set("keepdims", 0));
  EXPECT_EQ(y.shape(), Shape{});
  EXPECT_EQ(values(y), (Values{0}));
  EXPECT_EQ(values(run1("reduce_sum", {x})), (Values{276}));
  EXPECT_TRUE(std::isnan(values(run1("reduce_max", {make({2}, {1, std::nanf("")})}))[0]));
}

// Note [Reductions that keep the innermost axis] and the contiguous runs of the general walk (cpu_reduce.cpp): sums,
// means, maxima and minima over axis sets that keep the innermost axis (blocks of outputs wider and narrower than
// kColumnBlock, kept axes between reduced ones) or reduce it among kept ones, against a double loop over the same
// coordinates; NaN wins max and min in its lane only; the bits do not depend on the thread count.
TEST(CpuBackend, ReductionsKeepingOrSkippingTheInnermostAxisMatchALoop) {
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  struct Case {
    Shape shape, axes;
  };
  const Case cases[] = {{{301, 517}, {0}}, {{6, 97, 40}, {1}}, {{5, 31, 7, 3}, {0, 2}}, {{4, 1, 9, 260}, {0, 2}},
                        {{3, 4, 5, 6}, {1, 2}}, {{11, 13, 17}, {0, 2}}, {{2, 700, 2}, {0, 1}}};
  for (const Case& c : cases) {
    Values v(static_cast<std::size_t>(cpu::product(c.shape, 0, c.shape.size())));
    for (float& e : v) e = normal(rng);
    v[v.size() / 3] = std::nanf("");
    const Tensor x = make(c.shape, v);
    std::vector<bool> reduced(c.shape.size(), false);
    for (std::int64_t a : c.axes) reduced[static_cast<std::size_t>(a)] = true;
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"}) {
      ExecutionPolicy one, two;
      one.intra_op_threads = 1;
      two.intra_op_threads = 2;
      const Attributes attrs = Attributes().set("axes", c.axes).set("keepdims", 0);
      const Values y1 = values(run1(op, {x}, attrs, one)), y2 = values(run1(op, {x}, attrs, two));
      ASSERT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << op;
      // The reference: each element of x added into its output (outputs in row-major order of the kept axes).
      std::vector<double> sum(y1.size(), 0.0), best(y1.size(), std::string(op) == "reduce_max" ? -INFINITY : INFINITY);
      std::vector<bool> nan(y1.size(), false);
      std::vector<std::int64_t> count(y1.size(), 0);
      for (std::size_t i = 0; i < v.size(); ++i) {
        std::int64_t rest = static_cast<std::int64_t>(i), o = 0, scale = 1;
        for (std::size_t d = c.shape.size(); d-- > 0;) {
          const std::int64_t coord = rest % c.shape[d];
          rest /= c.shape[d];
          if (!reduced[d]) {
            o += coord * scale;
            scale *= c.shape[d];
          }
        }
        const auto k = static_cast<std::size_t>(o);
        sum[k] += v[i];
        ++count[k];
        nan[k] = nan[k] || std::isnan(v[i]);
        best[k] = std::string(op) == "reduce_max" ? std::max<double>(best[k], v[i]) : std::min<double>(best[k], v[i]);
      }
      for (std::size_t k = 0; k < y1.size(); ++k) {
        const std::string name(op);
        if (name == "reduce_max" || name == "reduce_min") {
          if (nan[k]) {
            ASSERT_TRUE(std::isnan(y1[k])) << op << " output " << k;
          } else {
            ASSERT_EQ(y1[k], static_cast<float>(best[k])) << op << " output " << k;
          }
          continue;
        }
        const double want = name == "reduce_mean" ? sum[k] / static_cast<double>(count[k]) : sum[k];
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(y1[k])) << op;
          continue;
        }
        ASSERT_NEAR(y1[k], want, 1e-6 * std::max(1.0, std::fabs(want))) << op << " output " << k;
      }
    }
  }
}

// Note [Reductions of short rows]: rows of 1 to 19 elements (the short path below 16 for sums, 8 for max/min, and
// partial_of's above) give wide_sums<16>'s bits for the sums (the sums of squares from 16 on, IsaKernels::sum_f32's,
// to float rounding: fused multiply-adds above the baseline) and the first of equal values for max/min, NaN rows NaN,
// rows of -0.0 a +0.0 sum, at 1 and 2 threads.
TEST(CpuBackend, ReductionsOfShortRowsGiveTheChainsBits) {
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (std::int64_t count = 1; count < 20; ++count) {
    const std::int64_t rows = 1001;
    Values v(static_cast<std::size_t>(rows * count));
    for (float& e : v) e = normal(rng);
    v[static_cast<std::size_t>(7 * count)] = std::nanf("");
    for (std::int64_t i = 0; i < count; ++i) v[static_cast<std::size_t>(11 * count + i)] = -0.0f;
    const Tensor x = make({rows, count}, v);
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_sum_square", "reduce_max", "reduce_min"}) {
      const std::string name(op);
      ExecutionPolicy one, two;
      one.intra_op_threads = 1;
      two.intra_op_threads = 2;
      const Attributes attrs = Attributes().set("axes", Shape{1}).set("keepdims", 0);
      const Values y1 = values(run1(op, {x}, attrs, one)), y2 = values(run1(op, {x}, attrs, two));
      ASSERT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << op << " count " << count;
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = v.data() + r * count;
        float want = 0.0f;
        if (name == "reduce_max" || name == "reduce_min") {
          bool nan = false;
          float best = name == "reduce_max" ? -INFINITY : INFINITY;
          for (std::int64_t i = 0; i < count; ++i) {
            nan = nan || std::isnan(row[i]);
            if (name == "reduce_max" ? row[i] > best : row[i] < best) best = row[i];
          }
          want = nan ? std::nanf("") : best;
          if (count >= 8 && !nan) {  // partial_of's lanes: the value, its sign of zero either way
            ASSERT_EQ(y1[static_cast<std::size_t>(r)], want) << op << " count " << count << " row " << r;
            continue;
          }
        } else {
          const bool square = name == "reduce_sum_square";
          double sum = cpu::wide_sums<16>(row, count, [square](double e) { return square ? e * e : e; });
          if (name == "reduce_mean") sum /= static_cast<double>(count);
          want = static_cast<float>(sum);
        }
        const float got = y1[static_cast<std::size_t>(r)];
        if (name == "reduce_sum_square" && count >= 16 && !std::isnan(want)) {  // IsaKernels::sum_f32: fused squares
          ASSERT_NEAR(got, want, 1e-6f * std::max(1.0f, std::fabs(want))) << "count " << count << " row " << r;
          continue;
        }
        ASSERT_TRUE((std::isnan(got) && std::isnan(want)) || std::memcmp(&got, &want, sizeof(float)) == 0)
            << op << " count " << count << " row " << r << ": " << got << " vs " << want;
      }
    }
  }
}

// Note [Transposes in tiles]: transposes whose output rows step through the source, with the axis before them the
// source's contiguous one, copied tile by tile: every element in place against a loop over the output, for element
// sizes 1, 2, 4 and 8, planes past and short of the tile, with planes before them, at 1 and 2 threads.
TEST(CpuBackend, TransposesInTilesMatchALoop) {
  struct Case {
    Shape shape, perm;
  };
  const Case cases[] = {{{3, 37, 45}, {0, 2, 1}}, {{2, 3, 33, 9}, {0, 1, 3, 2}}, {{70, 41}, {1, 0}},
                        {{5, 8, 8}, {0, 2, 1}},   {{4, 7, 50}, {0, 2, 1}},      {{2, 65, 3, 67}, {0, 3, 2, 1}}};
  for (const Case& c : cases) {
    const std::int64_t n = cpu::product(c.shape, 0, c.shape.size());
    Values v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i % 251 - 125);
    const Tensor x = make(c.shape, v);
    Shape out_shape, in_strides(c.shape.size(), 1);
    for (std::size_t d = c.shape.size() - 1; d-- > 0;) in_strides[d] = in_strides[d + 1] * c.shape[d + 1];
    for (std::int64_t p : c.perm) out_shape.push_back(c.shape[static_cast<std::size_t>(p)]);
    Values want(v.size());
    for (std::int64_t o = 0; o < n; ++o) {
      std::int64_t rest = o, from = 0;
      for (std::size_t d = out_shape.size(); d-- > 0;) {
        from += (rest % out_shape[d]) * in_strides[static_cast<std::size_t>(c.perm[d])];
        rest /= out_shape[d];
      }
      want[static_cast<std::size_t>(o)] = v[static_cast<std::size_t>(from)];
    }
    for (const char* dtype : {"float32", "float16", "int8", "int64"}) {
      for (const int threads : {1, 2}) {
        ExecutionPolicy policy;
        policy.intra_op_threads = threads;
        const Tensor y = run1("transpose", {cast(x, dtype)}, Attributes().set("perm", c.perm), policy);
        ASSERT_EQ(y.shape(), out_shape);
        ASSERT_EQ(values(cast(y, "float32")), want) << c.shape.size() << "-D case, " << dtype << " threads " << threads;
      }
    }
  }
}

// wide_sums (cpu_common.h): partial j sums the elements i % kWide == j of the whole groups, the tail goes into partial
// 0, and the partials are added pairwise; the bits of that order exactly, at lengths around the group's. And the
// long rows' sums that use it (Note [Few long rows split]: chunks of 65,536) against a double loop, at 1 and 2 threads.
TEST(CpuBackend, WideSumsAddInTheirDocumentedOrderAndLongRowsSumAsALoop) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t n : {0, 1, 15, 16, 17, 33, 1000, 65537}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = normal(rng) * 100.0f;
    for (const bool square : {false, true}) {
      const auto f = [square](double v) { return square ? v * v : v; };
      double acc[16] = {};
      const std::int64_t whole = n / 16 * 16;
      for (std::int64_t i = 0; i < whole; ++i) acc[i % 16] += f(x[static_cast<std::size_t>(i)]);
      for (std::int64_t i = whole; i < n; ++i) acc[0] += f(x[static_cast<std::size_t>(i)]);
      for (int width = 8; width >= 1; width /= 2) {
        for (int j = 0; j < width; ++j) acc[j] = acc[2 * j] + acc[2 * j + 1];
      }
      const double got = cpu::wide_sums<16>(x.data(), n, f);
      EXPECT_EQ(std::memcmp(&got, &acc[0], sizeof(double)), 0) << n << " " << square << ": " << got << " " << acc[0];
    }
  }
  const Shape shape{3, 200003};
  Values v(static_cast<std::size_t>(3 * 200003));
  for (float& e : v) e = normal(rng);
  const Tensor x = make(shape, v);
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_sum_square"}) {
    ExecutionPolicy one, two;
    one.intra_op_threads = 1;
    two.intra_op_threads = 2;
    const Attributes attrs = Attributes().set("axes", Shape{1}).set("keepdims", 0);
    const Values y1 = values(run1(op, {x}, attrs, one)), y2 = values(run1(op, {x}, attrs, two));
    ASSERT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << op;
    for (std::size_t r = 0; r < 3; ++r) {
      double want = 0.0;
      for (std::size_t i = 0; i < 200003; ++i) {
        const double e = v[r * 200003 + i];
        want += std::string(op) == "reduce_sum_square" ? e * e : e;
      }
      if (std::string(op) == "reduce_mean") want /= 200003.0;
      EXPECT_NEAR(y1[r], want, 1e-6 * std::max(1.0, std::fabs(want))) << op << " row " << r;
    }
  }
}

// ---- attention ----

// softmax(q k^T * scale + mask) v for one [B, H, S, D] problem, in double.
Values naive_attention(const Values& q, const Values& k, const Values& v, const Values& mask, Shape qs, Shape ks,
                       std::int64_t dv, bool causal, double scale) {
  const std::int64_t b = qs[0], h = qs[1], sq = qs[2], d = qs[3], hkv = ks[1], sk = ks[2];
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  Values out(static_cast<std::size_t>(b * h * sq * dv));
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t hi = 0; hi < h; ++hi) {
      const std::int64_t kv = bi * hkv + hi / (h / hkv);
      for (std::int64_t i = 0; i < sq; ++i) {
        std::vector<double> s(static_cast<std::size_t>(sk), -INFINITY);
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < sk; ++j) {
          if (causal && j > i) continue;
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += static_cast<double>(q[((bi * h + hi) * sq + i) * d + e]) * k[(kv * sk + j) * d + e];
          s[j] = dot * scale + (mask.empty() ? 0.0 : mask[(i * sk) + j]);  // mask given as [Sq, Sk]
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (std::int64_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (std::int64_t j = 0; j < sk; ++j) acc += s[j] / sum * v[(kv * sk + j) * dv + c];
          out[((bi * h + hi) * sq + i) * dv + c] = static_cast<float>(acc);
        }
      }
    }
  return out;
}

TEST(CpuBackend, AttentionCausalGqaMaskAndScale) {
  struct Case {
    Shape q, k;
    std::int64_t dv;
    bool causal, mask;
    double scale;
  };
  const std::vector<Case> cases = {
      {{1, 2, 5, 8}, {1, 2, 5, 8}, 8, false, false, 0.0},
      {{2, 4, 7, 16}, {2, 2, 9, 16}, 12, true, false, 0.0},  // GQA, Sq < Sk, Dv != D
      {{1, 3, 9, 4}, {1, 1, 6, 4}, 4, true, true, 0.3},      // MQA, Sq > Sk, mask [Sq, Sk]
      {{1, 1, 1, 32}, {1, 1, 1, 32}, 32, true, false, 0.0},  // S = 1
      // Rows of 8 keys or more in padded vectors (Note [Attention rows in vectors]): 17 (one vector and a part), 16
      // (whole), 33 causal with a mask (rows of 1 .. 33 visible keys)
      {{1, 2, 11, 8}, {1, 2, 17, 8}, 8, false, true, 0.0},
      {{2, 2, 16, 8}, {2, 2, 16, 8}, 5, false, false, 0.0},
      {{1, 2, 33, 8}, {1, 1, 33, 8}, 8, true, true, 0.5},
  };
  unsigned seed = 50;
  for (const auto& c : cases) {
    const Tensor q = random_tensor(c.q, seed++);
    const Tensor k = random_tensor(c.k, seed++);
    const Tensor v = random_tensor({c.k[0], c.k[1], c.k[2], c.dv}, seed++);
    const Tensor mask = c.mask ? random_tensor({c.q[2], c.k[2]}, seed++, -2, 2) : Tensor();
    const Tensor y =
        run1("attention", {q, k, v, mask}, Attributes().set("causal", c.causal ? 1 : 0).set("scale", c.scale));
    ASSERT_EQ(y.shape(), (Shape{c.q[0], c.q[1], c.q[2], c.dv}));
    expect_near_all(values(y),
                    naive_attention(values(q), values(k), values(v), c.mask ? values(mask) : Values{}, c.q, c.k, c.dv,
                                    c.causal, c.scale),
                    1e-5f);
  }
}

TEST(CpuBackend, AttentionRowMaskedEverywhereIsNaN) {
  const Tensor q = random_tensor({1, 1, 2, 4}, 60);
  const Tensor k = random_tensor({1, 1, 3, 4}, 61);
  const Tensor v = random_tensor({1, 1, 3, 4}, 62);
  const Tensor mask = make({2, 3}, {0, 0, 0, -kInf, -kInf, -kInf});
  const Values y = values(run1("attention", {q, k, v, mask}));
  for (int c = 0; c < 4; ++c) {
    EXPECT_FALSE(std::isnan(y[c]));
    EXPECT_TRUE(std::isnan(y[4 + c]));
  }
}

// Note [Fully masked attention rows]: with fully_masked_rows="zero" a row whose every visible score is -inf (the mask
// alone, or the mask and the causal rule together) is 0 instead of NaN; every other row has the bits of the plain run,
// and the log-sum-exp of such a row is still -inf. Float32, both 16-bit types and float64; GQA, causal, Sq != Sk, one
// key, masks of rank 2 and 4.
TEST(CpuBackend, AttentionFullyMaskedRowsZero) {
  struct Case {
    Shape q, k;
    bool causal;
    Shape mask;  // [B or 1, 1, Sq, Sk] or [Sq, Sk]
  };
  const std::vector<Case> cases = {
      {{1, 2, 6, 8}, {1, 2, 9, 8}, false, {1, 1, 6, 9}},
      {{2, 4, 7, 16}, {2, 2, 11, 16}, true, {2, 1, 7, 11}},  // GQA; row 0 sees key 0 only, which its mask hides
      {{1, 3, 5, 4}, {1, 1, 6, 4}, false, {5, 6}},          // MQA, a 2-d mask
      {{2, 2, 3, 8}, {2, 2, 1, 8}, false, {2, 1, 3, 1}},    // one key
      {{1, 2, 40, 8}, {1, 2, 45, 8}, true, {1, 1, 40, 45}},  // 32 keys or more: Note [Attention rows in vectors]
  };
  unsigned seed = 120;
  for (const char* dtype : {"float32", "float16", "bfloat16", "float64"}) {
    for (const auto& c : cases) {
      const std::string what = std::string(dtype) + " Sq" + std::to_string(c.q[2]) + " Sk" + std::to_string(c.k[2]) +
                               (c.causal ? " causal" : "");
      const Tensor q = cast(random_tensor(c.q, seed++, -2, 2), dtype);
      const Tensor k = cast(random_tensor(c.k, seed++, -2, 2), dtype);
      const Tensor v = cast(random_tensor({c.k[0], c.k[1], c.k[2], c.q[3]}, seed++), dtype);
      const std::int64_t sq = c.q[2], sk = c.k[2];
      std::int64_t mask_numel = 1;
      for (std::int64_t d : c.mask) mask_numel *= d;
      Values m = random_values(mask_numel, seed++, -3, 3);
      for (std::size_t i = 1; i < m.size(); i += 4) m[i] = -kInf;  // some keys of some rows
      for (std::int64_t outer = 0; outer < mask_numel / (sq * sk); ++outer) {
        for (std::int64_t j = 0; j < sk; ++j) m[(outer * sq + sq - 2) * sk + j] = -kInf;  // row Sq - 2: every key
        m[outer * sq * sk] = -kInf;  // row 0's key 0: the whole row where causal
      }
      const Tensor mask = cast(make(c.mask, m), dtype);
      const Attributes plain = Attributes().set("causal", c.causal ? 1 : 0);
      const Attributes zero = Attributes(plain).set("fully_masked_rows", std::string("zero"));
      const Tensor nan_rows = run1("attention", {q, k, v, mask}, plain);
      const std::vector<Tensor> zero_rows = run("attention", {q, k, v, mask}, Attributes(zero).set("return_lse", 1));
      ASSERT_EQ(zero_rows[0].nbytes(), nan_rows.nbytes()) << what;
      const Values with_nan = values(nan_rows), with_zero = values(zero_rows[0]), lse = values(zero_rows[1]);
      const std::int64_t dv = c.q[3], rows = static_cast<std::int64_t>(with_nan.size()) / dv;
      const std::size_t element = dtype_size(nan_rows.dtype());
      int masked = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        const bool empty = std::isnan(with_nan[static_cast<std::size_t>(r * dv)]);  // finite inputs: only so
        masked += empty ? 1 : 0;
        EXPECT_EQ(lse[static_cast<std::size_t>(r)] == -kInf, empty) << what << " row " << r;
        for (std::int64_t d = 0; d < dv; ++d) {
          const auto at = static_cast<std::size_t>(r * dv + d);
          if (empty) {
            EXPECT_EQ(with_zero[at], 0.0f) << what << " row " << r;
          } else {
            EXPECT_EQ(std::memcmp(static_cast<const char*>(zero_rows[0].data_ptr()) + at * element,
                                  static_cast<const char*>(nan_rows.data_ptr()) + at * element, element),
                      0)
                << what << " row " << r << ": not the plain run's bits";
          }
        }
      }
      EXPECT_GE(masked, c.q[0] * c.q[1]) << what << ": every (batch, head) has a fully masked row";
    }
  }
}

// q [1, 1, 3, 4] with a NaN in row 1, k and v [1, 1, 5, 4], random from seeds `seed`, + 1 and + 2.
std::tuple<Tensor, Tensor, Tensor> nan_row_qkv(unsigned seed) {
  Values qv = random_values(3 * 4, seed);
  qv[4] = std::nanf("");  // row 1 of q
  return {make({1, 1, 3, 4}, qv), random_tensor({1, 1, 5, 4}, seed + 1), random_tensor({1, 1, 5, 4}, seed + 2)};
}

// fully_masked_rows="zero" changes only rows with no visible key: a NaN score (here from q) still makes its row NaN.
// Values other than "nan" and "zero" are refused.
TEST(CpuBackend, AttentionFullyMaskedRowsZeroKeepsNaNRowsAndChecksItsValue) {
  const auto [q, k, v] = nan_row_qkv(130);
  const Tensor mask = make({3, 5}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -kInf, -kInf, -kInf, -kInf, -kInf});
  const Attributes zero = Attributes().set("fully_masked_rows", std::string("zero"));
  const Values y = values(run1("attention", {q, k, v, mask}, zero));
  for (int c = 0; c < 4; ++c) {
    EXPECT_FALSE(std::isnan(y[c]));
    EXPECT_TRUE(std::isnan(y[4 + c]));
    EXPECT_EQ(y[8 + c], 0.0f);
  }
  EXPECT_TRUE(std::isnan(values(run1("attention", {q, k, v, mask}))[8]));  // the default: "nan"
  XPURT_EXPECT_THROW_WITH(run1("attention", {q, k, v}, Attributes().set("fully_masked_rows", std::string("Zero"))),
                          InvalidArgumentError, "fully_masked_rows must be \"nan\" (the default), \"zero\" or "
                          "\"uniform\", got \"Zero\"");
}

// fully_masked_rows="uniform" (a masked fill's finite value): the row with every key masked is the mean of v; the row
// with visible keys is as with "nan", and so is the NaN row.
TEST(CpuBackend, AttentionFullyMaskedRowsUniformGivesTheMeanOfV) {
  const auto [q, k, v] = nan_row_qkv(140);
  const Tensor mask = make({3, 5}, {0, -kInf, 0, 0, 0, 0, 0, 0, 0, 0, -kInf, -kInf, -kInf, -kInf, -kInf});
  const Values y = values(run1("attention", {q, k, v, mask}, Attributes().set("fully_masked_rows",
                                                                              std::string("uniform"))));
  const Values plain = values(run1("attention", {q, k, v, mask}));
  const Values vv = values(v);
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(y[c], plain[c]);
    EXPECT_TRUE(std::isnan(y[4 + c]));
    double mean = 0.0;
    for (int j = 0; j < 5; ++j) mean += vv[j * 4 + c] / 5.0;
    EXPECT_NEAR(y[8 + c], mean, 1e-6);
  }
}

// log(sum_j exp(score_ij)) per row of attention(q, k, v, mask) in double, score = q k^T * scale + mask, keys
// after the query skipped when causal; `mask` empty or [B, 1, Sq, Sk]. lse [B, H, Sq].
std::vector<double> naive_attention_lse(const Values& q, const Values& k, const Values& mask, Shape qs, Shape ks,
                                        bool causal, double scale) {
  const std::int64_t b = qs[0], h = qs[1], sq = qs[2], d = qs[3], hkv = ks[1], sk = ks[2];
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> lse(static_cast<std::size_t>(b * h * sq));
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t hi = 0; hi < h; ++hi) {
      const std::int64_t kv = bi * hkv + hi / (h / hkv);
      for (std::int64_t i = 0; i < sq; ++i) {
        std::vector<double> s;
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < sk && (!causal || j <= i); ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += static_cast<double>(q[((bi * h + hi) * sq + i) * d + e]) * k[(kv * sk + j) * d + e];
          s.push_back(dot * scale + (mask.empty() ? 0.0 : mask[(bi * sq + i) * sk + j]));
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (double e : s) sum += std::exp(e - mx);
        lse[(bi * h + hi) * sq + i] = std::isinf(mx) ? mx : mx + std::log(sum);
      }
    }
  return lse;
}

// return_lse=1: a second output lse [B, H, Sq] float32 (whatever q's dtype) against a double reference on the
// rounded inputs; odd shapes, GQA, causal or not, a mask with -inf entries and one fully masked row (lse -inf).
// Output 0 is bit-identical to the run without return_lse.
TEST(CpuBackend, AttentionLogSumExpMatchesDoubleReference) {
  struct Case {
    Shape q, k;
    bool causal, mask;
    double scale;
  };
  const std::vector<Case> cases = {
      {{2, 3, 37, 24}, {2, 3, 53, 24}, false, false, 0.0},
      {{2, 3, 37, 24}, {2, 3, 53, 24}, true, false, 0.0},
      {{2, 3, 37, 24}, {2, 3, 53, 24}, false, true, 0.0},
      {{2, 3, 37, 24}, {2, 3, 53, 24}, true, true, 0.7},
      {{1, 4, 19, 16}, {1, 2, 11, 16}, true, false, 0.0},   // GQA, Sq > Sk
      {{2, 4, 9, 8}, {2, 2, 30, 8}, false, true, 0.0},      // GQA, Sq < Sk, mask
      {{1, 1, 1, 4}, {1, 1, 1, 4}, false, false, 0.0},      // one key
  };
  unsigned seed = 90;
  for (const char* dtype : {"float32", "float16", "bfloat16", "float64"}) {
    for (const auto& c : cases) {
      const std::string what = std::string(dtype) + " H" + std::to_string(c.q[1]) + " Hkv" + std::to_string(c.k[1]) +
                               " Sq" + std::to_string(c.q[2]) + " Sk" + std::to_string(c.k[2]) +
                               (c.causal ? " causal" : "") + (c.mask ? " mask" : "");
      const Tensor q = cast(random_tensor(c.q, seed++, -2, 2), dtype);
      const Tensor k = cast(random_tensor(c.k, seed++, -2, 2), dtype);
      const Tensor v = cast(random_tensor(c.k, seed++), dtype);
      Tensor mask;
      if (c.mask) {
        const Shape mask_shape = {c.q[0], 1, c.q[2], c.k[2]};
        Values m = random_values(c.q[0] * c.q[2] * c.k[2], seed++, -3, 3);
        for (std::size_t i = 0; i < m.size(); i += 5) m[i] = -kInf;               // scattered -inf
        for (std::int64_t j = 0; j < c.k[2]; ++j) m[2 * c.k[2] + j] = -kInf;      // batch 0, row 2: all -inf
        mask = cast(make(mask_shape, m), dtype);
      }
      const Attributes attrs = Attributes().set("causal", c.causal ? 1 : 0).set("scale", c.scale);
      const std::vector<Tensor> with_lse = run("attention", {q, k, v, mask}, Attributes(attrs).set("return_lse", 1));
      ASSERT_EQ(with_lse.size(), 2u) << what;
      const Tensor& lse = with_lse[1];
      ASSERT_EQ(lse.dtype(), DType::kFloat32) << what;
      ASSERT_EQ(lse.shape(), (Shape{c.q[0], c.q[1], c.q[2]})) << what;
      const std::vector<double> want = naive_attention_lse(values(q), values(k), c.mask ? values(mask) : Values{},
                                                           c.q, c.k, c.causal, c.scale);
      const Values got = values(lse);
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (std::isinf(want[i])) {
          EXPECT_EQ(got[i], want[i]) << what << " at " << i;
        } else {
          ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << what << " at " << i;
        }
      }
      if (c.mask) {
        for (std::int64_t h = 0; h < c.q[1]; ++h) EXPECT_EQ(got[h * c.q[2] + 2], -kInf) << what << " head " << h;
      }
      // Output 0 does not change with return_lse (NaN rows compare by bits).
      const Tensor y = run1("attention", {q, k, v, mask}, attrs);
      ASSERT_EQ(y.nbytes(), with_lse[0].nbytes());
      EXPECT_EQ(std::memcmp(y.data_ptr(), with_lse[0].data_ptr(), y.nbytes()), 0) << what;
    }
  }
}

TEST(CpuBackend, AttentionLogSumExpOfNaNScoresAndBadAttribute) {
  const auto [q, k, v] = nan_row_qkv(95);
  const Values lse = values(run("attention", {q, k, v}, Attributes().set("return_lse", 1))[1]);
  EXPECT_FALSE(std::isnan(lse[0]));
  EXPECT_TRUE(std::isnan(lse[1]));
  EXPECT_FALSE(std::isnan(lse[2]));
  for (std::int64_t bad : {-1, 2}) {
    XPURT_EXPECT_THROW_WITH(run("attention", {q, k, v}, Attributes().set("return_lse", bad)), InvalidArgumentError,
                            "return_lse must be 0 or 1, got " + std::to_string(bad));
  }
  // Without return_lse the op has one output.
  EXPECT_EQ(run("attention", {q, k, v}).size(), 1u);
}

// ---- threads ----

// run_concat (cpu_data.cpp): many rows (every input's piece of a row by one thread), few rows of large pieces (cut in
// chunks of 256 KiB, the last one partial), empty inputs among them, and 8-byte elements: the output is the inputs
// laid side by side along the axis, whatever the thread count.
TEST(CpuBackend, ConcatOfManyRowsAndOfFewLargeRows) {
  struct Case {
    std::vector<Shape> shapes;
    std::int64_t axis;
  };
  const Case cases[] = {{{{31, 37, 1}, {31, 37, 3}, {31, 37, 0}, {31, 37, 19}}, 2},
                        {{{70001, 3}, {3, 3}, {1, 3}}, 0},
                        {{{2, 100003}, {2, 1}, {2, 65536}}, 1},
                        {{{1, 5}, {1, 7}}, -1}};
  int seed = 0;
  for (const Case& c : cases) {
    std::vector<Tensor> inputs;
    for (const Shape& shape : c.shapes) {
      Values v(static_cast<std::size_t>(cpu::product(shape, 0, shape.size())));
      for (float& e : v) e = static_cast<float>(seed++ % 100003);
      inputs.push_back(make(shape, v));
    }
    const std::size_t rank = c.shapes[0].size();
    const auto axis = static_cast<std::size_t>(c.axis < 0 ? c.axis + static_cast<std::int64_t>(rank) : c.axis);
    ExecutionPolicy one, two;
    one.intra_op_threads = 1;
    two.intra_op_threads = 2;
    for (const ExecutionPolicy& policy : {one, two}) {
      const Values y = values(run1("concat", inputs, Attributes().set("axis", c.axis), policy));
      const std::int64_t outer = cpu::product(c.shapes[0], 0, axis);
      std::size_t at = 0;
      for (std::int64_t r = 0; r < outer; ++r) {
        for (const Tensor& x : inputs) {
          const std::int64_t row = cpu::product(x.shape(), axis, rank);
          const Values xv = values(x);
          for (std::int64_t i = 0; i < row; ++i) {
            ASSERT_EQ(y[at++], xv[static_cast<std::size_t>(r * row + i)]) << "case axis " << c.axis << ", row " << r;
          }
        }
      }
      ASSERT_EQ(at, y.size());
    }
  }
}

TEST(CpuBackend, LoopsGiveTheSameBitsWithOneOrTwoThreads) {
  // Large enough for every op's loop to split across two threads.
  const Tensor x = random_tensor({300, 1000}, 80);
  const Tensor row = random_tensor({1000}, 81);
  const Tensor image = random_tensor({2, 8, 40, 40}, 82);
  const Tensor weight = random_tensor({8, 8, 3, 3}, 83);
  struct Run {
    const char* op;
    std::vector<Tensor> inputs;
    Attributes attrs;
  };
  const std::vector<Run> runs = {
      {"add", {x, row}, {}},
      {"gelu", {x}, {}},
      {"softmax", {x}, {}},
      {"layer_norm", {x, row, row}, {}},
      {"reduce_sum", {x}, Attributes().set("axes", Shape{0})},
      {"reduce_max", {x}, Attributes().set("axes", Shape{1})},
      {"cast", {x}, Attributes().set("to", std::string("bfloat16"))},
      {"conv2d", {image, weight}, Attributes().set("pads", Shape{1, 1, 1, 1})},
      {"avg_pool2d", {image}, Attributes().set("kernel_shape", Shape{3, 3}).set("strides", Shape{1, 1})},
  };
  ExecutionPolicy one, two;
  one.intra_op_threads = 1;
  two.intra_op_threads = 2;
  for (const char* engine : {"auto", "fallback"}) {
    ScopedEnv env("XPURT_CPU_GEMM", engine);
    for (const auto& r : runs) {
      std::string plan;
      const Values serial = values(run(r.op, r.inputs, r.attrs, one)[0]);
      const Values parallel = values(run(r.op, r.inputs, r.attrs, two, &plan)[0]);
      EXPECT_NE(plan.find("2 threads"), std::string::npos) << plan;
      EXPECT_EQ(serial, parallel) << r.op << " with gemm " << engine;
    }
  }
}

// ---- 16-bit and 64-bit paths ----

TEST(CpuBackend, HalfBfloatAndDoubleInputs) {
  const Tensor a = random_tensor({9, 17}, 70);
  const Tensor b = random_tensor({17, 5}, 71);
  for (const char* dtype : {"float16", "bfloat16", "float64"}) {
    const Tensor a16 = cast(a, dtype), b16 = cast(b, dtype);
    const Tensor y = run1("matmul", {a16, b16});
    EXPECT_EQ(dtype_name(y.dtype()), dtype);
    // Exact products of the rounded inputs, accumulated in fp32: only the output rounding differs.
    const float tolerance = std::string(dtype) == "float64" ? 1e-6f : std::string(dtype) == "float16" ? 1e-3f : 8e-3f;
    expect_near_all(values(y), naive_matmul(values(a16), values(b16), 9, 5, 17), tolerance, dtype);
  }
  // An fp16 softmax sums to ~1 and an fp16 conv matches fp32 to fp16 precision.
  const Values s = values(run1("softmax", {cast(random_tensor({3, 50}, 72, -4, 4), "float16")}));
  for (int r = 0; r < 3; ++r) {
    double sum = 0;
    for (int i = 0; i < 50; ++i) sum += s[r * 50 + i];
    EXPECT_NEAR(sum, 1.0, 5e-3);
  }
  const Tensor x = random_tensor({1, 3, 6, 6}, 73);
  const Tensor w = random_tensor({4, 3, 3, 3}, 74);
  expect_near_all(values(run1("conv2d", {cast(x, "bfloat16"), cast(w, "bfloat16")})),
                  values(run1("conv2d", {cast(cast(x, "bfloat16"), "float32"), cast(cast(w, "bfloat16"), "float32")})),
                  1e-2f);
}

}  // namespace
}  // namespace xpuruntime
