// The float32 ONNX activations the cpu backend computes in vectors (Note [Vectorised ELU, Softplus and Mish] in
// src/cpp/backends/cpu/cpu_isa_baseline.cpp): every instruction-set table's activation_f32 against the formulas in
// double, at lengths with partial last vectors, over random arguments and the special ones (signed zeros, the
// infinities, NaN, +-100, subnormals, the ends of each formula's pieces); then the registry's cpu kernels (elu, selu,
// celu, softplus, mish, leaky_relu, hard_sigmoid, hard_swish, softsign, thresholded_relu) under every instruction set
// and several thread counts, with the attributes' defaults and other values, and the launches that keep the ONNX
// reference library's kernel (float64, float16, CELU with a negative alpha), which must give its bits.
//
// Tolerance (kUlps): ELU, SELU, CELU, Softplus and Mish within 4 float ulps of the exact value (the double formula),
// where an ulp of a subnormal value is the smallest subnormal; the piecewise activations give the float formula's bits
// (HardSigmoid within an ulp of its largest term or result: alpha x + beta may be one fused multiply-add).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/cpu_test_runs.h"
#include "core/half.h"
#include "core/node_kernels.h"
#include "test_utils.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using cpu::ActivationParams;
using cpu::VectorActivation;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kTiny = std::numeric_limits<float>::denorm_min();
constexpr double kUlps = 4.0;

// The instruction sets this CPU can run.
std::vector<std::string> isa_names() {
  std::vector<std::string> names{"baseline"};
  for (const char* name : {"avx2", "avx512"}) {
    if (cpu::isa_supported(name)) names.emplace_back(name);
  }
  return names;
}

// ---- the activations: registry op, ONNX attributes, table parameters, exact values ----

struct Activation {
  const char* op;  // the registry op
  Attributes attrs;
  ActivationParams params;  // what the kernel passes activation_f32 for attrs
  bool transcendental;      // compared with the double formula (else with the float formula's bits)
};

ActivationParams params_of(VectorActivation op, float alpha = 1.0f, float beta = 0.0f, float gamma = 1.0f) {
  ActivationParams p;
  p.op = op;
  p.alpha = alpha;
  p.beta = beta;
  p.gamma = gamma;
  return p;
}

constexpr double kSeluAlpha = 1.67326319217681884765625, kSeluGamma = 1.05070102214813232421875;

// Every vectorised activation with its ONNX defaults (no attributes), and those with attributes once more with other
// values.
std::vector<Activation> activations() {
  const auto selu = [](double alpha, double gamma) {
    return params_of(VectorActivation::kSelu, static_cast<float>(gamma * alpha), 0.0f, static_cast<float>(gamma));
  };
  return {
      {"elu", {}, params_of(VectorActivation::kElu), true},
      {"elu", Attributes().set("alpha", 0.3), params_of(VectorActivation::kElu, 0.3f), true},
      {"selu", {}, selu(kSeluAlpha, kSeluGamma), true},
      {"selu", Attributes().set("alpha", 2.5).set("gamma", 0.7), selu(2.5, 0.7), true},
      {"celu", {}, params_of(VectorActivation::kCelu), true},
      {"celu", Attributes().set("alpha", 2.5), params_of(VectorActivation::kCelu, 2.5f), true},
      {"celu", Attributes().set("alpha", 0.1), params_of(VectorActivation::kCelu, 0.1f), true},
      {"softplus", {}, params_of(VectorActivation::kSoftplus), true},
      {"mish", {}, params_of(VectorActivation::kMish), true},
      {"leaky_relu", {}, params_of(VectorActivation::kLeakyRelu, 0.01f), false},
      {"leaky_relu", Attributes().set("alpha", 0.2), params_of(VectorActivation::kLeakyRelu, 0.2f), false},
      {"hard_sigmoid", {}, params_of(VectorActivation::kHardSigmoid, 0.2f, 0.5f), false},
      {"hard_sigmoid", Attributes().set("alpha", 1.0 / 6).set("beta", 0.25),
       params_of(VectorActivation::kHardSigmoid, static_cast<float>(1.0 / 6), 0.25f), false},
      {"hard_swish", {}, params_of(VectorActivation::kHardSwish), false},
      {"softsign", {}, params_of(VectorActivation::kSoftsign), false},
      {"thresholded_relu", {}, params_of(VectorActivation::kThresholdedRelu), false},
      {"thresholded_relu", Attributes().set("alpha", -0.5), params_of(VectorActivation::kThresholdedRelu, -0.5f),
       false},
  };
}

std::string name_of(const Activation& a) {
  std::string name = a.op;
  for (const auto& [key, value] : a.attrs.values()) name += " " + key;
  return name + " (alpha " + std::to_string(a.params.alpha) + ")";
}

// The transcendental activations in double, from the float parameters (the reference's float kernel rounds ONNX's
// attributes to float first); NaN, the infinities and signed zeros as these expressions give them.
double exact(const ActivationParams& p, double x) {
  const double alpha = p.alpha;
  const auto softplus = [](double v) { return v > 0 ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v)); };
  switch (p.op) {
    case VectorActivation::kElu: return x >= 0 ? x : alpha * std::expm1(x);
    case VectorActivation::kSelu: return x > 0 ? static_cast<double>(p.gamma) * x : alpha * std::expm1(x);
    case VectorActivation::kCelu: return x > 0 ? x : alpha * std::expm1(x / alpha);
    case VectorActivation::kSoftplus: return softplus(x);
    case VectorActivation::kMish: return x * std::tanh(softplus(x));
    default: break;
  }
  ADD_FAILURE() << "no double formula for activation " << static_cast<int>(p.op);
  return 0;
}

// The piecewise activations in float, the reference's operations (HardSigmoid: NaN stays NaN, as numpy's clip).
float piecewise(const ActivationParams& p, float x) {
  switch (p.op) {
    case VectorActivation::kLeakyRelu: return x >= 0 ? x : p.alpha * x;
    case VectorActivation::kHardSigmoid: {
      if (std::isnan(x)) return x;
      const float t = p.alpha * x + p.beta;
      return std::max(0.0f, std::min(1.0f, t));
    }
    case VectorActivation::kHardSwish: return x * std::max(0.0f, std::min(1.0f, x / 6.0f + 0.5f));
    case VectorActivation::kSoftsign: return x / (1.0f + std::fabs(x));
    case VectorActivation::kThresholdedRelu: return x > p.alpha ? x : 0.0f;
    default: break;
  }
  ADD_FAILURE() << "no float formula for activation " << static_cast<int>(p.op);
  return 0;
}

// The distance between a float value's magnitude and the next float up (the smallest subnormal below the normals).
double ulp_of(double value) {
  const auto f = static_cast<float>(std::fabs(value));
  if (std::isinf(f)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(std::nextafter(f, kInf) - f);
}

// The error of `got` in units of the allowed one, or 0 when exact; +inf for a NaN, infinity or zero sign mismatch.
// Records the largest in ulps in *worst_ulps.
double excess(const ActivationParams& p, bool transcendental, float x, float got, double* worst_ulps) {
  constexpr double kFail = std::numeric_limits<double>::infinity();
  if (!transcendental) {
    const float want = piecewise(p, x);
    if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got) ? 0 : kFail;
    if (p.op == VectorActivation::kHardSigmoid) {  // a fused multiply-add or not: within an ulp of the larger term
      const double allowed = ulp_of(std::max({std::fabs(p.alpha * x), std::fabs(p.beta), std::fabs(want)}));
      return std::fabs(static_cast<double>(got) - want) / allowed > 1 ? kFail : 0;
    }
    return std::memcmp(&want, &got, sizeof(float)) == 0 ? 0 : kFail;
  }
  const double want = exact(p, x);
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got) ? 0 : kFail;
  if (std::isinf(static_cast<float>(want)) || std::isinf(got)) return static_cast<float>(want) == got ? 0 : kFail;
  if (want == 0) return got == 0 && std::signbit(got) == std::signbit(want) ? 0 : kFail;
  const double ulps = std::fabs(got - want) / ulp_of(want);
  *worst_ulps = std::max(*worst_ulps, ulps);
  return ulps / kUlps;
}

// Random arguments: half within [-4, 4], a quarter within [-120, 40], a quarter of magnitudes from 1e-40 to 1e3 evenly
// in the logarithm with either sign.
std::vector<float> random_arguments(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> narrow(-4.0f, 4.0f), wide(-120.0f, 40.0f), exponent(-40.0f, 3.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (gen() % 4) {
      case 0: x[i] = wide(gen); break;
      case 1: x[i] = (gen() % 2 ? 1.0f : -1.0f) * std::pow(10.0f, exponent(gen)); break;
      default: x[i] = narrow(gen); break;
    }
  }
  return x;
}

// The special arguments: signed zeros, the infinities, NaN, +-100, subnormals, FLT_MIN and FLT_MAX, and the ends of
// the kernels' pieces (expm1's clamp at -24 and its -1 below -17.4, exp_split's subnormal results below -87 and +0
// below -104, Mish's -20 and 20, the thresholds of the piecewise ones).
std::vector<float> special_arguments() {
  const float min_normal = std::numeric_limits<float>::min(), max = std::numeric_limits<float>::max();
  std::vector<float> x{0.0f,   -0.0f,   kInf,    -kInf,   kNaN,   -kNaN,   100.0f,  -100.0f, kTiny,   -kTiny,
                       1e-40f, -1e-40f, 1e-30f,  -1e-30f, min_normal, -min_normal, max, -max, 1e-8f,  -1e-8f,
                       0.3465f, -0.3466f, 0.35f, -0.35f, 1.0f,   -1.0f,   2.5f,    -2.5f,   3.0f,    -3.0f,
                       -17.3f, -17.4f,  -20.0f,  -20.001f, -19.999f, 20.0f, 20.001f, 9.0f,  10.0f,   17.0f,
                       -24.0f, -24.5f,  -30.0f,  -87.0f,  -87.4f,  -88.0f,  -90.0f,  -100.5f, -103.9f, -104.0f,
                       -105.0f, -110.0f, -150.0f, -159.9f, -160.0f, -161.0f, -1e4f,  1e4f,    -1e30f,  1e30f,
                       88.0f,  88.7f,   88.8f,   89.0f,   -0.5f,   0.5f,    -1e-3f,  1e-3f,   -6.0f,   6.0f};
  for (float v = -110.0f; v <= 30.0f; v += 0.37f) x.push_back(v);
  return x;
}

// activation_f32 of `table` over `x`, starting one float past an aligned vector (a and out misaligned).
std::vector<float> run_table(const cpu::IsaKernels& table, const ActivationParams& p, const std::vector<float>& x) {
  std::vector<float> in(x.size() + 1), out(x.size() + 1, -12345.0f);
  std::copy(x.begin(), x.end(), in.begin() + 1);
  table.activation_f32(in.data() + 1, out.data() + 1, static_cast<std::int64_t>(x.size()), p);
  EXPECT_EQ(out[0], -12345.0f) << "activation_f32 wrote before its output";
  return std::vector<float>(out.begin() + 1, out.end());
}

// Checks y = act(x) element by element; returns the worst error seen in ulps (transcendental ones).
double expect_activation(const Activation& a, const std::vector<float>& x, const std::vector<float>& y,
                         const std::string& what) {
  EXPECT_EQ(x.size(), y.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (excess(a.params, a.transcendental, x[i], y[i], &worst) > 1) {
      ADD_FAILURE() << what << ": " << name_of(a) << "(" << x[i] << ") = " << y[i] << ", want "
                    << (a.transcendental ? exact(a.params, x[i]) : static_cast<double>(piecewise(a.params, x[i])))
                    << " (element " << i << " of " << x.size() << ")";
      return worst;
    }
  }
  return worst;
}

const std::size_t kSizes[] = {1, 7, 17, 1000, 65537, 300001};

TEST(CpuActivations, EveryTableMatchesTheFormulasOnRandomArguments) {
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& table = cpu::isa_kernels_named(isa);
    unsigned seed = 1;
    for (const Activation& a : activations()) {
      double worst = 0;
      for (const std::size_t n : kSizes) {
        const std::vector<float> x = random_arguments(n, seed++);
        worst = std::max(worst, expect_activation(a, x, run_table(table, a.params, x),
                                                  isa + ", n = " + std::to_string(n)));
      }
      if (a.transcendental) std::cout << isa << " " << name_of(a) << ": worst " << worst << " ulps\n";
    }
  }
}

TEST(CpuActivations, EveryTableHandlesTheSpecialArguments) {
  const std::vector<float> x = special_arguments();
  for (const std::string& isa : isa_names()) {
    const cpu::IsaKernels& table = cpu::isa_kernels_named(isa);
    for (const Activation& a : activations()) {
      expect_activation(a, x, run_table(table, a.params, x), isa);
      // Each special argument alone (the tail path: one element in a vector of padding) and in place.
      for (const float v : x) {
        float y = v;
        table.activation_f32(&y, &y, 1, a.params);
        expect_activation(a, {v}, {y}, isa + ", one element in place");
      }
    }
  }
}

// Fixed values the formulas' limits give, spelt out (the comparisons above take them from the same formulas).
TEST(CpuActivations, LimitsAreTheScalarFormulas) {
  const cpu::IsaKernels& table = cpu::isa_kernels_named(isa_names().back());
  const auto one = [&](const ActivationParams& p, float v) {
    float y = 0;
    table.activation_f32(&v, &y, 1, p);
    return y;
  };
  const ActivationParams elu = params_of(VectorActivation::kElu, 0.5f);
  EXPECT_EQ(one(elu, -kInf), -0.5f);
  EXPECT_EQ(one(elu, -30.0f), -0.5f);
  EXPECT_TRUE(std::signbit(one(elu, -0.0f)));
  EXPECT_EQ(one(elu, kInf), kInf);
  EXPECT_EQ(one(elu, -kTiny), -0.5f * kTiny);
  const ActivationParams softplus = params_of(VectorActivation::kSoftplus);
  EXPECT_EQ(one(softplus, kInf), kInf);
  EXPECT_EQ(one(softplus, 100.0f), 100.0f);
  EXPECT_EQ(one(softplus, -kInf), 0.0f);
  EXPECT_EQ(one(softplus, -0.0f), static_cast<float>(std::log(2.0)));
  EXPECT_EQ(one(softplus, -100.0f), std::exp(-100.0f));  // a subnormal, rounded once
  const ActivationParams mish = params_of(VectorActivation::kMish);
  EXPECT_EQ(one(mish, kInf), kInf);
  EXPECT_EQ(one(mish, 50.0f), 50.0f);
  EXPECT_TRUE(std::isnan(one(mish, -kInf)));  // -inf * tanh(0), as the formula (and ONNX's reference) gives
  EXPECT_TRUE(std::isnan(one(mish, kNaN)));
  EXPECT_EQ(one(mish, -200.0f), 0.0f);
  EXPECT_TRUE(std::signbit(one(mish, -200.0f)));
  EXPECT_TRUE(std::isnan(one(params_of(VectorActivation::kHardSigmoid, 0.2f, 0.5f), kNaN)));
  EXPECT_EQ(one(params_of(VectorActivation::kThresholdedRelu), kNaN), 0.0f);  // NaN > alpha is false
}

// ---- through the registry ----

// The registry's cpu kernel of `op` on x under `threads` intra-op threads.
Tensor run_cpu(const std::string& op, const Tensor& x, const Attributes& attrs, int threads) {
  return cpu_test::run_cpu(op, {x}, attrs, threads)[0];
}

// The ONNX reference library's `op_type` (opset 21) on x.
Tensor run_reference(const std::string& op_type, const Tensor& x, const Attributes& attrs) {
  return cpu_test::run_reference(op_type, {x}, attrs, 1)[0];
}

Tensor float_tensor(const std::vector<float>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kFloat32);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> float_values(const Tensor& t) {
  const auto* p = static_cast<const float*>(t.data_ptr());
  return std::vector<float>(p, p + t.numel());
}

const char* onnx_type_of(const std::string& op) {
  static const std::pair<const char*, const char*> kTypes[] = {
      {"elu", "Elu"},         {"selu", "Selu"},           {"celu", "Celu"},           {"softplus", "Softplus"},
      {"mish", "Mish"},       {"leaky_relu", "LeakyRelu"}, {"hard_sigmoid", "HardSigmoid"},
      {"hard_swish", "HardSwish"}, {"softsign", "Softsign"}, {"thresholded_relu", "ThresholdedRelu"}};
  for (const auto& [name, type] : kTypes) {
    if (op == name) return type;
  }
  return "";
}

// Every op's float32 kernel under every instruction set (XPURT_CPU_ISA) and 1 to 3 threads, at sizes up to past the
// chunked reference's threshold, the random arguments and the special ones.
TEST(CpuActivations, RegistryKernelsMatchTheFormulasOnEveryIsaAndThreadCount) {
  std::vector<float> specials = special_arguments();
  for (const std::string& isa : isa_names()) {
    ScopedEnv env("XPURT_CPU_ISA", isa.c_str());
    unsigned seed = 100;
    for (const Activation& a : activations()) {
      for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{65537}, std::size_t{300001}}) {
        std::vector<float> x = random_arguments(n, seed++);
        if (n > specials.size()) std::copy(specials.begin(), specials.end(), x.begin() + static_cast<long>(n / 3));
        const Tensor input = float_tensor(x);
        for (const int threads : {1, 2, 3}) {
          const std::vector<float> y = float_values(run_cpu(a.op, input, a.attrs, threads));
          expect_activation(a, x, y, isa + ", " + std::to_string(threads) + " threads, n = " + std::to_string(n));
        }
      }
    }
  }
}

// The vector path is the one taken for float32: HardSigmoid of NaN is NaN there (the reference's float kernel, whose
// min/max drop NaN, gives 1), and the plan says so.
TEST(CpuActivations, Float32TakesTheVectorPath) {
  const Tensor x = float_tensor({kNaN, 0.0f, 1.0f});
  const std::vector<float> y = float_values(run_cpu("hard_sigmoid", x, {}, 1));
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.5f);
  const Kernel* kernel = KernelRegistry::global().find_kernel("mish", "cpu");
  ASSERT_NE(kernel, nullptr);
  EXPECT_NE(kernel->info().summary.find("in vectors"), std::string::npos) << kernel->info().summary;
}

// The launches the vector path declines run the reference library's kernel: its bits for float64, float16 and
// bfloat16 inputs, and for CELU with a negative alpha (float32).
TEST(CpuActivations, OtherDtypesAndNegativeCeluAlphaKeepTheReference) {
  const std::vector<float> x = random_arguments(70001, 7);
  for (const DType dtype : {DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const Tensor input = run_cpu("cast", float_tensor(x), Attributes().set("to", std::string(dtype_name(dtype))), 1);
    ASSERT_EQ(input.dtype(), dtype);
    for (const Activation& a : activations()) {
      const Tensor got = run_cpu(a.op, input, a.attrs, 2);
      const Tensor want = run_reference(onnx_type_of(a.op), input, a.attrs);
      ASSERT_EQ(got.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got.data_ptr(), want.data_ptr(), static_cast<std::size_t>(got.nbytes())), 0)
          << name_of(a) << " in " << dtype_name(dtype);
    }
  }
  const Attributes negative = Attributes().set("alpha", -2.0);
  const Tensor input = float_tensor(x);
  const Tensor got = run_cpu("celu", input, negative, 2);
  const Tensor want = run_reference("Celu", input, negative);
  EXPECT_EQ(std::memcmp(got.data_ptr(), want.data_ptr(), static_cast<std::size_t>(got.nbytes())), 0);
}

}  // namespace
}  // namespace xpuruntime
