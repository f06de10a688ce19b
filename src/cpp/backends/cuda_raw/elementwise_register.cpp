// The cuda_raw elementwise kernels (elementwise.cu, activation.cu, pointwise.cu) and their registration: unary math
// and activations, binary arithmetic with broadcasting, cast, the ONNX pointwise ops and the binary ops beyond the
// core set. Each op has one kernel, "cuda_raw", declared like every cuda_raw kernel (cuda_raw::declaration).
#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/cuda_utils.h"
#include "core/data_ops.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"

namespace xpuruntime::cuda_raw {

namespace {

void add_unary(KernelRegistry& registry, const std::string& op, UnaryOp kind, const std::string& what) {
  add_kernel(registry, op, what + ", 16-byte vectorized grid-stride kernel, fp32 compute", {"x"}, nullptr,
             [kind](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               cuda_raw::unary(kind, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(),
                               launch.stream.handle);
             });
}

void add_binary(KernelRegistry& registry, const std::string& op, BinaryOp kind) {
  const bool takes_int =
      kind == BinaryOp::kAdd || kind == BinaryOp::kSub || kind == BinaryOp::kMul || kind == BinaryOp::kDiv;
  add_kernel(
      registry, op,
      op + "(a, b) with NumPy broadcasting (stride tables, up to 8 merged dims); 16-byte vectors for equal shapes "
               "and along a contiguous or broadcast innermost dim" +
          (takes_int ? "; int32/int64 wrap, division truncates (by zero: 0)" : ""),
      {"a", "b"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        cuda_raw::BroadcastGeometry geometry;
        std::string why_not;
        if (!cuda_raw::broadcast_geometry(desc.inputs[0].shape, desc.inputs[1].shape, desc.outputs[0].shape,
                                          &geometry, &why_not)) {
          return Support::no(why_not);
        }
        return Support::yes();
      },
      [kind](const KernelLaunch& launch) {
        const Tensor& a = launch.input(0);
        const Tensor& b = launch.input(1);
        Tensor& y = launch.output(0);
        cuda_raw::BroadcastGeometry geometry;
        std::string why_not;
        if (!cuda_raw::broadcast_geometry(a.shape(), b.shape(), y.shape(), &geometry, &why_not)) {
          throw UnsupportedOperationError(why_not);
        }
        if (data_ops::is_arithmetic_int_dtype(a.dtype())) {
          cuda_raw::integer_binary(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry,
                                   launch.stream.handle);
        } else {
          cuda_raw::binary(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry, launch.stream.handle);
        }
      },
      takes_int ? DTypes::kFloatAndInt : DTypes::kFloat);
}

}  // namespace

// exp, log, sqrt, neg, abs, erf, reciprocal, the activations, add ... minimum, cast.
void register_elementwise(KernelRegistry& registry) {
  add_unary(registry, "exp", UnaryOp::kExp, "exp(x)");
  add_unary(registry, "log", UnaryOp::kLog, "log(x)");
  add_unary(registry, "sqrt", UnaryOp::kSqrt, "sqrt(x)");
  add_kernel(registry, "neg", "-x, 16-byte vectorized grid-stride kernel, fp32 compute; int32/int64 wrap", {"x"},
             nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               if (data_ops::is_arithmetic_int_dtype(x.dtype())) {
                 cuda_raw::integer_neg(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(),
                                       launch.stream.handle);
               } else {
                 cuda_raw::unary(UnaryOp::kNeg, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(),
                                 launch.stream.handle);
               }
             },
             DTypes::kFloatAndInt);
  add_unary(registry, "abs", UnaryOp::kAbs, "|x|");
  add_unary(registry, "erf", UnaryOp::kErf, "erf(x)");
  add_unary(registry, "reciprocal", UnaryOp::kReciprocal, "1 / x");
  // ---- activations ----
  add_unary(registry, "relu", UnaryOp::kRelu, "max(x, 0) (NaN stays NaN)");
  add_unary(registry, "sigmoid", UnaryOp::kSigmoid, "1 / (1 + exp(-x))");
  add_unary(registry, "tanh", UnaryOp::kTanh, "tanh(x)");
  add_unary(registry, "silu", UnaryOp::kSilu, "x * sigmoid(x)");
  add_kernel(registry, "gelu", "GELU (erf form, or the tanh approximation with approximate='tanh'), 16-byte "
             "vectorized grid-stride kernel, fp32 compute", {"x"}, nullptr, [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const bool tanh_form = launch.desc->attrs.get_string("approximate", "none") == "tanh";
               cuda_raw::unary(tanh_form ? UnaryOp::kGeluTanh : UnaryOp::kGelu, x.data_ptr(),
                               launch.output(0).data_ptr(), x.dtype(), x.numel(), launch.stream.handle);
             });
  // ---- binary ----
  add_binary(registry, "add", BinaryOp::kAdd);
  add_binary(registry, "sub", BinaryOp::kSub);
  add_binary(registry, "mul", BinaryOp::kMul);
  add_binary(registry, "div", BinaryOp::kDiv);
  add_binary(registry, "pow", BinaryOp::kPow);
  add_binary(registry, "maximum", BinaryOp::kMaximum);
  add_binary(registry, "minimum", BinaryOp::kMinimum);
  // ---- cast ----
  add_kernel(
      registry, "cast",
      "conversion between any dtypes: floats round to nearest even (vectorized), float->int truncates toward zero "
      "(saturating, NaN -> 0), ->bool is x != 0",
      {"x"},
      [](const OpDescriptor& desc) {
        if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
        const DType to = desc.outputs[0].dtype;
        if (!is_cuda_raw_dtype(to)) {
          return Support::no(detail::str_cat("cuda_raw cannot cast to ", dtype_name(to), "; use the cpu kernel"));
        }
        return Support::yes();
      },
      [](const KernelLaunch& launch) {
        const Tensor& x = launch.input(0);
        Tensor& y = launch.output(0);
        if (data_ops::is_float_dtype(x.dtype()) && data_ops::is_float_dtype(y.dtype())) {
          cuda_raw::cast(x.data_ptr(), x.dtype(), y.data_ptr(), y.dtype(), x.numel(), launch.stream.handle);
        } else {
          cuda_raw::cast_any(x.data_ptr(), x.dtype(), y.data_ptr(), y.dtype(), x.numel(), launch.stream.handle);
        }
      },
      DTypes::kAll);
}

// The ONNX pointwise ops with parameters (clip ... mish), is_nan, is_inf and logical_and/or/xor.
void register_pointwise(KernelRegistry& registry) {
  struct Pointwise {
    const char* op;
    PointwiseOp kind;
    const char* alpha;  // the attribute read as alpha (null: none)
    double alpha_default;
    const char* beta;
    double beta_default;
    const char* what;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Pointwise pointwise[] = {
      {"clip", PointwiseOp::kClip, "min", -inf, "max", inf, "min(max(x, min), max), NaN kept"},
      {"hard_sigmoid", PointwiseOp::kHardSigmoid, "alpha", 0.2, "beta", 0.5, "max(0, min(1, alpha * x + beta))"},
      {"hard_swish", PointwiseOp::kHardSwish, nullptr, 0, nullptr, 0, "x * max(0, min(1, x / 6 + 1 / 2))"},
      {"leaky_relu", PointwiseOp::kLeakyRelu, "alpha", 0.01, nullptr, 0, "x >= 0 ? x : alpha * x"},
      {"elu", PointwiseOp::kElu, "alpha", 1.0, nullptr, 0, "x >= 0 ? x : alpha * (exp(x) - 1)"},
      {"softplus", PointwiseOp::kSoftplus, nullptr, 0, nullptr, 0, "log(1 + exp(x)), overflow-free"},
      {"sin", PointwiseOp::kSin, nullptr, 0, nullptr, 0, "sin(x)"},
      {"cos", PointwiseOp::kCos, nullptr, 0, nullptr, 0, "cos(x)"},
      {"floor", PointwiseOp::kFloor, nullptr, 0, nullptr, 0, "floor(x)"},
      {"ceil", PointwiseOp::kCeil, nullptr, 0, nullptr, 0, "ceil(x)"},
      {"round", PointwiseOp::kRound, nullptr, 0, nullptr, 0, "x rounded half to even"},
      {"sign", PointwiseOp::kSign, nullptr, 0, nullptr, 0, "-1, 0 or 1 (NaN kept)"},
      {"tan", PointwiseOp::kTan, nullptr, 0, nullptr, 0, "tan(x)"},
      {"asin", PointwiseOp::kAsin, nullptr, 0, nullptr, 0, "asin(x)"},
      {"acos", PointwiseOp::kAcos, nullptr, 0, nullptr, 0, "acos(x)"},
      {"atan", PointwiseOp::kAtan, nullptr, 0, nullptr, 0, "atan(x)"},
      {"sinh", PointwiseOp::kSinh, nullptr, 0, nullptr, 0, "sinh(x)"},
      {"cosh", PointwiseOp::kCosh, nullptr, 0, nullptr, 0, "cosh(x)"},
      {"asinh", PointwiseOp::kAsinh, nullptr, 0, nullptr, 0, "asinh(x)"},
      {"acosh", PointwiseOp::kAcosh, nullptr, 0, nullptr, 0, "acosh(x)"},
      {"atanh", PointwiseOp::kAtanh, nullptr, 0, nullptr, 0, "atanh(x)"},
      {"softsign", PointwiseOp::kSoftsign, nullptr, 0, nullptr, 0, "x / (1 + |x|)"},
      {"selu", PointwiseOp::kSelu, "alpha", 1.67326319217681884765625, "gamma", 1.05070102214813232421875,
       "gamma * (x > 0 ? x : alpha * (exp(x) - 1))"},
      {"celu", PointwiseOp::kCelu, "alpha", 1.0, nullptr, 0, "max(0, x) + min(0, alpha * (exp(x / alpha) - 1))"},
      {"thresholded_relu", PointwiseOp::kThresholdedRelu, "alpha", 1.0, nullptr, 0, "x > alpha ? x : 0"},
      {"mish", PointwiseOp::kMish, nullptr, 0, nullptr, 0, "x * tanh(softplus(x))"},
  };
  for (const Pointwise& p : pointwise) {
    add_kernel(registry, p.op, std::string(p.what) + ", 16-byte vectorized grid-stride kernel, fp32 compute", {"x"},
               nullptr, [p](const KernelLaunch& launch) {
                 const Tensor& x = launch.input(0);
                 const Attributes& attrs = launch.desc->attrs;
                 const auto alpha = static_cast<float>(p.alpha ? attrs.get_float(p.alpha, p.alpha_default) : 0.0);
                 const auto beta = static_cast<float>(p.beta ? attrs.get_float(p.beta, p.beta_default) : 0.0);
                 cuda_raw::pointwise(p.kind, x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(), alpha,
                                     beta, launch.stream.handle);
               });
  }
  // float64 too (T5's fp16 export checks float64 values for infinities); the schema admits only floats.
  add_kernel(registry, "is_nan", "isnan(x) -> bool, grid-stride kernel", {"x"}, nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               cuda_raw::is_nan_or_inf(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(), true, false,
                                       false, launch.stream.handle);
             },
             DTypes::kAll);
  add_kernel(registry, "is_inf", "x == +inf (detect_positive) or -inf (detect_negative) -> bool", {"x"}, nullptr,
             [](const KernelLaunch& launch) {
               const Tensor& x = launch.input(0);
               const Attributes& attrs = launch.desc->attrs;
               cuda_raw::is_nan_or_inf(x.data_ptr(), launch.output(0).data_ptr(), x.dtype(), x.numel(), false,
                                       attrs.get_int("detect_positive", 1) != 0,
                                       attrs.get_int("detect_negative", 1) != 0, launch.stream.handle);
             },
             DTypes::kAll);
  const std::pair<const char*, cuda_raw::CompareOp> logical[] = {{"logical_and", cuda_raw::CompareOp::kAnd},
                                                                 {"logical_or", cuda_raw::CompareOp::kOr},
                                                                 {"logical_xor", cuda_raw::CompareOp::kXor}};
  for (const auto& [op, kind] : logical) {
    add_kernel(
        registry, op, std::string(op) + "(a, b) of bools with NumPy broadcasting", {"a", "b"}, two_operand_geometry,
        [kind = kind](const KernelLaunch& launch) {
          const Tensor& a = launch.input(0);
          const Tensor& b = launch.input(1);
          Tensor& y = launch.output(0);
          cuda_raw::compare(kind, a.data_ptr(), b.data_ptr(), y.data_ptr(), DType::kBool, geometry_of(a, b, y),
                            launch.stream.handle);
        },
        DTypes::kAll);
  }
}

// prelu and mod (fmod) with broadcasting.
void register_binary_ext(KernelRegistry& registry) {
  const std::pair<const char*, cuda_raw::BinaryExtOp> binaries[] = {{"prelu", cuda_raw::BinaryExtOp::kPrelu},
                                                                    {"mod", cuda_raw::BinaryExtOp::kMod}};
  for (const auto& [op, kind] : binaries) {
    add_kernel(
        registry, op,
        std::string(op) + "(a, b) with NumPy broadcasting (stride tables), fp32 compute; integer mod by zero: 0",
        {"a", "b"}, two_operand_geometry,
        [kind = kind](const KernelLaunch& launch) {
          const Tensor& a = launch.input(0);
          const Tensor& b = launch.input(1);
          Tensor& y = launch.output(0);
          cuda_raw::BinaryExtOp chosen = kind;
          if (chosen == cuda_raw::BinaryExtOp::kMod && launch.desc->attrs.get_int("fmod", 0) != 0) {
            chosen = cuda_raw::BinaryExtOp::kFmod;
          }
          cuda_raw::binary_ext(chosen, a.data_ptr(), b.data_ptr(), y.data_ptr(), a.dtype(), geometry_of(a, b, y),
                               launch.stream.handle);
        },
        kind == cuda_raw::BinaryExtOp::kMod ? DTypes::kFloatAndInt : DTypes::kFloat);
  }
}

}  // namespace xpuruntime::cuda_raw
