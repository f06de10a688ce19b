// The cpu_isa.h kernels compiled for the build's baseline (x86-64 or whatever the target is), and the choice of
// table.
//
// Note [CPU instruction sets]
// The cpu backend is compiled for the baseline of its target (x86-64: SSE2), so that one build runs on every
// machine. Its window loops (depthwise convolution, max pooling) are where that costs most: on a Zen 5 core a
// 3x3 depthwise row loop runs 16 lanes at a time with AVX-512 and 4 with SSE2. cpu_isa_kernels.inc holds those loops
// once; it is compiled three times (cpu_isa_baseline.cpp, cpu_isa_avx2.cpp with -march=x86-64-v3 and
// cpu_isa_avx512.cpp with -march=x86-64-v4, CMakeLists.txt), each into its own namespace, and make_context picks
// a table per plan: the best the CPU supports (__builtin_cpu_supports), or the one XPURT_CPU_ISA names
// (baseline, avx2, avx512; a test or a user pinning the result to one table). Only whole functions are compiled
// per instruction set, and only the chosen table's functions are called, so no AVX instruction runs on a CPU
// without it. The tables compute the same sums in the same order, but the compiler may contract a * b + c into a
// fused multiply-add under -march=x86-64-v3 and above (-ffp-contract=fast is GCC's default), so the avx2 and
// avx512 tables agree with the baseline to float rounding, not bit for bit; max pooling is exact in all three.
// The plan summary names the table ("isa avx512").
//
// Note [Vectorised tanh, erf and GELU]
// std::tanh and std::erf are a call per element: 7.4 and 4.7 ns an element on this project's 2-vCPU machine, and GELU
// 3.4 (2026-12-05; exp_f32's sigmoid 0.36), on every transformer's and ConvNeXt's activation. IsaKernels::math_f32
// computes them branch-free in vectors, from polynomials fitted for this file (least squares in double on Chebyshev
// points, checked in float against the double library functions):
//   tanh   |x| < 0.625: x + x^3 Q(x^2) (relative error 8e-8); above, 1 - 2 / (e^(2|x|) + 1) with the vectorised exp
//          (Note [Vectorised exp on the CPU] in cpu_fused.cpp), |x| clamped to 10 (tanh is 1 in float beyond).
//   erf    |x| < 1: x P(x^2) (absolute error 1.5e-7); above, 1 - erfc(|x|) with erfc(s) = e^(-s^2 + R(t)),
//          t = 1 / (1 + s / 2) - 1/2 (relative error of erfc 1.6e-6, most of it the rounding of s^2 near 4), s
//          clamped to 4 (erf is 1 in float beyond).
//   GELU   x/2 (1 + erf(x / sqrt 2)), where below 0 the 1 + erf is taken as erfc(|x| / sqrt 2) itself rather than a
//          difference that cancels; the tanh form alike with 2 / (e^(2|u|) + 1). Where that factor is below 1.6e-8
//          (x below -4 sqrt 2; the tanh form's below 4e-9) it is taken as 0, as the scalar formula's rounding did (the
//          result's absolute error under 5e-8): large negative x gives -0 and -inf NaN, as before.
// NaN propagates; the infinities give tanh/erf +-1. tests/python/test_fused_elementwise.py compares them with the
// double-precision functions over 2M points (within a few float ulps; the conformance suite's elementwise tolerance is
// 1e-5 relative).
//
// Note [Vectorised ELU, Softplus and Mish]
// Elu, Selu, Celu, Softplus and Mish ran the ONNX reference library's scalar kernel (a std::expm1, std::log1p or
// std::exp and std::tanh call per element) in chunks on the threads (Note [Elementwise reference ops in chunks] in
// cpu_onnx_ops.cpp): Elu of [1, 64, 112, 112] took 7.5 ms on this project's 2-vCPU machine, ONNX Runtime 1.6; Mish 33
// against 13 (2026-12-07). IsaKernels::activation_f32 computes them in float32 vectors without branches, from
// exp_in_range's reduction (x = n ln2 + r, e^r - 1 = r + r^2 P(r); Note [Vectorised exp on the CPU] in cpu_fused.cpp):
//   e^x - 1   (ELU, SELU, CELU below 0) 2^n (e^r - 1) + (2^n - 1), x clamped to -24 (below -17.4 it is -1 in float):
//             the polynomial's e^r - 1 does not cancel and 2^n - 1 is exact, so near 0 it is r + r^2 P(r) itself.
//             CELU's argument is x / alpha, divided as the reference divides.
//   e^x       (Softplus, Mish) hi * lo with hi = e^r 2^(n - n/2) and lo = 2^(n/2), both normal for x >= -160: the
//             product rounds once, into the subnormals below -87 and to +0 below -104 as std::exp does, and Mish's
//             x e^x is (x hi) lo, rounded once too.
//   Softplus  max(x, 0) + log(1 + u), u = e^-|x|: no overflow, no cancellation. log(1 + u) for u within [0, 1] is
//             2 atanh(u / (2 + u)) = q + q z R(z) with q = 2u / (2 + u), z = q^2 / 4 <= 1/9 and R a degree-4 fit
//             (relative error 3e-9); q is u itself for a subnormal u, so far below 0 the result is e^x's subnormal.
//   Mish      x tanh(log(1 + e^x)) = b (1 - d), computed b - b d, with u = e^-|x|: below 0, b = x u and
//             d = (u^2 + u) / (u^2 + 2u + 2); above, b = x and d = u^2 / (u^2 + u + 1/2). d <= 2/5 scales its own
//             rounding down (the textbook n / (n + 2) with n = e^x (e^x + 2) rounds five times and reached 4 ulps).
// Against the formulas in double on every 61st float bit pattern (70M finite floats), each table: ELU and CELU with
// alpha 1 within 0.92 ulp (2 with another alpha, its product's rounding added), SELU 1.7, Softplus and Mish 2.65;
// tests/cpp/backends/cpu/test_cpu_activations.cpp holds them to 4 ulps (an ulp of a subnormal being the smallest
// subnormal). NaN gives NaN; the infinities and signed zeros give what the
// scalar formulas give: ELU and CELU of -inf -alpha, SELU's -gamma alpha, Softplus +inf and +0, Mish +inf and, for
// -inf, -inf * tanh(0) = NaN (the reference library's and ONNX's numpy reference's value), ELU(-0) = -0.
// LeakyRelu, HardSigmoid, HardSwish, Softsign and ThresholdedRelu are the reference's own operations in vectors, so
// its bits (HardSigmoid's alpha x + beta may become one fused multiply-add under avx2 and avx512), except that
// HardSigmoid of NaN is NaN (numpy's clip in ONNX's reference) where the library's min/max gave 1; ThresholdedRelu of
// NaN stays 0 (NaN > alpha is false, in every reference). LeakyRelu's reference kernel did not vectorise (3.6 ms for
// [1, 64, 112, 112] on one thread, 0.28 now); the compiler had vectorised the other four's (about 0.25 ms, the
// memory's time), so they gain only the chunked path's per-launch work.
// One thread, [1, 64, 112, 112], avx512 (baseline SSE2): Elu 8.2 -> 0.26 ms (1.1), Selu 7.0 -> 0.27 (1.2), Celu 7.6 ->
// 0.36 (1.3), Softplus 14.5 -> 0.50 (2.2), Mish 31.9 -> 0.56 (2.6) (2026-12-07). float16, bfloat16 and float64,
// non-contiguous tensors and CELU with alpha <= 0 keep the reference kernel (run_vector_activation in
// cpu_onnx_ops.cpp). The fused elementwise programs have no instruction for these activations (cpu_fused.cpp: the
// fusion pass leaves them nodes of their own), so nothing there evaluates them per element.
#define XPURT_CPU_ISA_NS isa_baseline
#define XPURT_CPU_ISA_NAME "baseline"
#define XPURT_CPU_VEC_BYTES 16
#include <cstdlib>

#include "backends/cpu/cpu_isa_kernels.inc"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::cpu {

#if XPURT_CPU_MULTI_ISA
namespace isa_avx2 {
extern const IsaKernels kKernels;
}
namespace isa_avx512 {
extern const IsaKernels kKernels;
}
#endif

bool isa_supported(const std::string& name) {
  if (name == "baseline") return true;
#if XPURT_CPU_MULTI_ISA
  __builtin_cpu_init();
  // x86-64-v3 and v4 as GCC defines them (-march=x86-64-v3/v4 may use every extension of its level).
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") &&
                  __builtin_cpu_supports("avx") && __builtin_cpu_supports("popcnt");
  if (name == "avx2") return v3;
  if (name == "avx512") {
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
  }
#endif
  return false;
}

const IsaKernels& isa_kernels_named(const std::string& name) {
  XPURT_CHECK(name == "baseline" || name == "avx2" || name == "avx512", "XPURT_CPU_ISA='", name,
              "' is not valid; use 'auto' (the best this CPU supports), 'baseline', 'avx2' or 'avx512'");
  if (!isa_supported(name)) {
    throw UnsupportedOperationError(
        detail::str_cat("XPURT_CPU_ISA=", name,
                        ": this CPU or this build (compiled for its target's baseline only on a non-x86-64 "
                        "machine) cannot run those kernels; use 'auto' or 'baseline'"));
  }
#if XPURT_CPU_MULTI_ISA
  if (name == "avx512") return isa_avx512::kKernels;
  if (name == "avx2") return isa_avx2::kKernels;
#endif
  return isa_baseline::kKernels;
}

const IsaKernels& isa_kernels() {
  const char* env = std::getenv("XPURT_CPU_ISA");
  const std::string choice = env != nullptr ? env : "auto";
  if (choice != "auto" && !choice.empty()) return isa_kernels_named(choice);
  for (const char* name : {"avx512", "avx2"}) {
    if (isa_supported(name)) return isa_kernels_named(name);
  }
  return isa_baseline::kKernels;
}

}  // namespace xpuruntime::cpu
