// Elementwise ops of the cpu backend: activations (gelu, relu, sigmoid, tanh, silu), unary math (exp, log,
// sqrt, neg, abs, erf, reciprocal), binary ops with NumPy broadcasting (add, sub, mul, div, pow, maximum,
// minimum) and cast between float dtypes. add, sub, mul, div and neg of int32/int64 and casts that involve a
// non-float dtype are computed in cpu_data.cpp (run_integer_arithmetic, run_any_cast).
//
// NaN semantics follow PyTorch: relu, maximum and minimum propagate NaN; IEEE results otherwise (log of a
// negative number is NaN, reciprocal of 0 is inf, ...). cast rounds to nearest even, once (a float64 source
// goes to 16 bits through round-to-odd float, see cpu_common.h).
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"

namespace xpuruntime::cpu {

namespace {

constexpr std::int64_t kElementGrain = 32768;

bool is_float_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat64;
}

enum class UnaryOp : std::uint8_t {
  kGelu,
  kGeluTanh,
  kRelu,
  kSigmoid,
  kTanh,
  kSilu,
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kAbs,
  kErf,
  kReciprocal
};

enum class BinaryOp : std::uint8_t { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum };

template <typename T, typename F>
void unary_loop(const KernelLaunch& launch, const CpuContext& context, F f) {
  InputBuffer<T> x(launch.input(0));
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  T* out = y.data();
  parallel_for(y.size(), context.threads, kElementGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = f(in[i]);
  });
  y.commit();
}

// y = op(x) in float32 through IsaKernels::math_f32 (Note [Vectorised tanh, erf and GELU] in cpu_isa_baseline.cpp).
void math_loop(VectorMath op, const KernelLaunch& launch, const CpuContext& context) {
  InputBuffer<float> x(launch.input(0));
  OutputBuffer<float> y(launch.output(0));
  const IsaKernels& isa = isa_of(context);
  const float* in = x.data();
  float* out = y.data();
  parallel_for(y.size(), context.threads, kElementGrain, [&](std::int64_t begin, std::int64_t end) {
    isa.math_f32(in + begin, out + begin, end - begin, op);
  });
  y.commit();
}

template <typename T>
void run_unary(UnaryOp op, const KernelLaunch& launch, const CpuContext& context) {
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case UnaryOp::kGelu: return math_loop(VectorMath::kGelu, launch, context);
      case UnaryOp::kGeluTanh: return math_loop(VectorMath::kGeluTanh, launch, context);
      case UnaryOp::kTanh: return math_loop(VectorMath::kTanh, launch, context);
      case UnaryOp::kErf: return math_loop(VectorMath::kErf, launch, context);
      default: break;
    }
  }
  switch (op) {
    case UnaryOp::kGelu:
      return unary_loop<T>(launch, context, [](T v) { return gelu_erf(v); });
    case UnaryOp::kGeluTanh:
      return unary_loop<T>(launch, context, [](T v) { return gelu_tanh(v); });
    case UnaryOp::kRelu:
      return unary_loop<T>(launch, context, [](T v) { return apply_activation(Activation::kRelu, v); });
    case UnaryOp::kSigmoid:
      return unary_loop<T>(launch, context, [](T v) { return sigmoid(v); });
    case UnaryOp::kTanh:
      return unary_loop<T>(launch, context, [](T v) { return std::tanh(v); });
    case UnaryOp::kSilu:
      return unary_loop<T>(launch, context, [](T v) { return v * sigmoid(v); });
    case UnaryOp::kExp:
      return unary_loop<T>(launch, context, [](T v) { return std::exp(v); });
    case UnaryOp::kLog:
      return unary_loop<T>(launch, context, [](T v) { return std::log(v); });
    case UnaryOp::kSqrt:
      return unary_loop<T>(launch, context, [](T v) { return std::sqrt(v); });
    case UnaryOp::kNeg:
      return unary_loop<T>(launch, context, [](T v) { return -v; });
    case UnaryOp::kAbs:
      return unary_loop<T>(launch, context, [](T v) { return std::fabs(v); });
    case UnaryOp::kErf:
      return unary_loop<T>(launch, context, [](T v) { return std::erf(v); });
    case UnaryOp::kReciprocal:
      return unary_loop<T>(launch, context, [](T v) { return T(1) / v; });
  }
}

// y = f(a, b) with NumPy broadcasting. Dims of size 1 are dropped and adjacent dims that are contiguous in
// both operands merged, so the inner loop runs over the longest stretch with fixed strides (1 or 0).
template <typename T, typename F>
void binary_loop(const KernelLaunch& launch, const CpuContext& context, F f) {
  const Tensor& a_tensor = launch.input(0);
  const Tensor& b_tensor = launch.input(1);
  Tensor& y_tensor = launch.output(0);
  const auto& out_shape = y_tensor.shape();
  if (y_tensor.numel() == 0) return;
  const auto a_full = broadcast_strides(a_tensor.shape(), out_shape);
  const auto b_full = broadcast_strides(b_tensor.shape(), out_shape);
  std::vector<std::int64_t> sizes, a_strides, b_strides;
  for (std::size_t d = 0; d < out_shape.size(); ++d) {
    if (out_shape[d] == 1) continue;
    if (!sizes.empty() && a_strides.back() == a_full[d] * out_shape[d] &&
        b_strides.back() == b_full[d] * out_shape[d]) {
      sizes.back() *= out_shape[d];
      a_strides.back() = a_full[d];
      b_strides.back() = b_full[d];
      continue;
    }
    sizes.push_back(out_shape[d]);
    a_strides.push_back(a_full[d]);
    b_strides.push_back(b_full[d]);
  }
  if (sizes.empty()) {  // a single element
    sizes = {1};
    a_strides = {0};
    b_strides = {0};
  }
  const std::size_t rank = sizes.size();
  const std::int64_t inner = sizes.back();
  const std::int64_t inner_a = a_strides.back(), inner_b = b_strides.back();
  const std::int64_t outer = y_tensor.numel() / inner;

  InputBuffer<T> a(a_tensor);
  InputBuffer<T> b(b_tensor);
  OutputBuffer<T> y(y_tensor);
  const T* pa = a.data();
  const T* pb = b.data();
  T* out = y.data();
  parallel_for(outer, context.threads, std::max<std::int64_t>(1, kElementGrain / inner),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t row = begin; row < end; ++row) {
                   std::int64_t offset_a = 0, offset_b = 0, rest = row;
                   for (std::size_t d = rank - 1; d-- > 0;) {
                     const std::int64_t i = rest % sizes[d];
                     rest /= sizes[d];
                     offset_a += i * a_strides[d];
                     offset_b += i * b_strides[d];
                   }
                   const T* ra = pa + offset_a;
                   const T* rb = pb + offset_b;
                   T* ry = out + row * inner;
                   // Unit and zero strides get their own (vectorizable) loops.
                   if (inner_a == 1 && inner_b == 1) {
                     for (std::int64_t i = 0; i < inner; ++i) ry[i] = f(ra[i], rb[i]);
                   } else if (inner_a == 1 && inner_b == 0) {
                     const T vb = *rb;
                     for (std::int64_t i = 0; i < inner; ++i) ry[i] = f(ra[i], vb);
                   } else if (inner_a == 0 && inner_b == 1) {
                     const T va = *ra;
                     for (std::int64_t i = 0; i < inner; ++i) ry[i] = f(va, rb[i]);
                   } else {
                     for (std::int64_t i = 0; i < inner; ++i) ry[i] = f(ra[i * inner_a], rb[i * inner_b]);
                   }
                 }
               });
  y.commit();
}

template <typename T>
void run_binary(BinaryOp op, const KernelLaunch& launch, const CpuContext& context) {
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  switch (op) {
    case BinaryOp::kAdd:
      return binary_loop<T>(launch, context, [](T a, T b) { return a + b; });
    case BinaryOp::kSub:
      return binary_loop<T>(launch, context, [](T a, T b) { return a - b; });
    case BinaryOp::kMul:
      return binary_loop<T>(launch, context, [](T a, T b) { return a * b; });
    case BinaryOp::kDiv:
      return binary_loop<T>(launch, context, [](T a, T b) { return a / b; });
    case BinaryOp::kPow:
      return binary_loop<T>(launch, context, [](T a, T b) { return std::pow(a, b); });
    case BinaryOp::kMaximum:
      return binary_loop<T>(launch, context, [nan](T a, T b) { return a != a || b != b ? nan : (a > b ? a : b); });
    case BinaryOp::kMinimum:
      return binary_loop<T>(launch, context, [nan](T a, T b) { return a != a || b != b ? nan : (a < b ? a : b); });
  }
}

template <typename T>
void run_cast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x_tensor = launch.input(0);
  Tensor& y_tensor = launch.output(0);
  const std::int64_t n = x_tensor.numel();
  const std::size_t in_size = x_tensor.element_size();
  const std::size_t out_size = y_tensor.element_size();
  const char* in = static_cast<const char*>(x_tensor.data_ptr());
  char* out = static_cast<char*>(y_tensor.data_ptr());
  // Chunks through a small T buffer: no full-size intermediate.
  parallel_for(n, context.threads, kElementGrain, [&](std::int64_t begin, std::int64_t end) {
    constexpr std::int64_t kChunk = 1024;
    T buffer[kChunk];
    for (std::int64_t i = begin; i < end; i += kChunk) {
      const std::int64_t count = std::min(kChunk, end - i);
      load_elements(in + static_cast<std::size_t>(i) * in_size, x_tensor.dtype(), buffer, count);
      store_elements(buffer, out + static_cast<std::size_t>(i) * out_size, y_tensor.dtype(), count);
    }
  });
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& registry) {
  auto add_unary = [&](const std::string& op, UnaryOp kind, const std::string& summary) {
    add_cpu_kernel(registry, op, "reference " + summary + ", computed in fp32 (fp64 for float64)",
                   [kind](const KernelLaunch& launch, const CpuContext& context) {
                     dispatch_compute_type(launch.desc->inputs[0].dtype,
                                           [&](auto zero) { run_unary<decltype(zero)>(kind, launch, context); });
                   });
  };
  add_cpu_kernel(registry, "gelu", "reference GELU (erf, or tanh approximation), computed in fp32 (fp64 for float64)",
                 [](const KernelLaunch& launch, const CpuContext& context) {
                   const UnaryOp kind = launch.desc->attrs.get_string("approximate", "none") == "tanh"
                                            ? UnaryOp::kGeluTanh
                                            : UnaryOp::kGelu;
                   dispatch_compute_type(launch.desc->inputs[0].dtype,
                                         [&](auto zero) { run_unary<decltype(zero)>(kind, launch, context); });
                 });
  add_unary("relu", UnaryOp::kRelu, "max(x, 0) (NaN propagates)");
  add_unary("sigmoid", UnaryOp::kSigmoid, "1 / (1 + exp(-x))");
  add_unary("tanh", UnaryOp::kTanh, "tanh(x)");
  add_unary("silu", UnaryOp::kSilu, "x * sigmoid(x)");
  add_unary("exp", UnaryOp::kExp, "exp(x)");
  add_unary("log", UnaryOp::kLog, "natural log(x)");
  add_unary("sqrt", UnaryOp::kSqrt, "sqrt(x)");
  add_cpu_kernel(
      registry, "neg", "reference -x, computed in fp32 (fp64 for float64); int32/int64 wrap",
      [](const KernelLaunch& launch, const CpuContext& context) {
        const DType dtype = launch.desc->inputs[0].dtype;
        if (dtype == DType::kInt32 || dtype == DType::kInt64) return run_integer_arithmetic("neg", launch, context);
        dispatch_compute_type(dtype, [&](auto zero) { run_unary<decltype(zero)>(UnaryOp::kNeg, launch, context); });
      },
      DTypeSet::kFloatAndInt);
  add_unary("abs", UnaryOp::kAbs, "|x|");
  add_unary("erf", UnaryOp::kErf, "erf(x)");
  add_unary("reciprocal", UnaryOp::kReciprocal, "1 / x");

  const std::pair<const char*, BinaryOp> binaries[] = {
      {"add", BinaryOp::kAdd}, {"sub", BinaryOp::kSub},         {"mul", BinaryOp::kMul},        {"div", BinaryOp::kDiv},
      {"pow", BinaryOp::kPow}, {"maximum", BinaryOp::kMaximum}, {"minimum", BinaryOp::kMinimum}};
  for (const auto& [op, kind] : binaries) {
    const bool takes_int = kind == BinaryOp::kAdd || kind == BinaryOp::kSub || kind == BinaryOp::kMul ||
                           kind == BinaryOp::kDiv;
    add_cpu_kernel(
        registry, op,
        std::string("reference ") + op + "(a, b) with NumPy broadcasting, computed in fp32 (fp64 for float64)" +
            (takes_int ? "; int32/int64 wrap, division truncates" : ""),
        [kind = kind, name = std::string(op)](const KernelLaunch& launch, const CpuContext& context) {
          const DType dtype = launch.desc->inputs[0].dtype;
          if (dtype == DType::kInt32 || dtype == DType::kInt64) return run_integer_arithmetic(name, launch, context);
          dispatch_compute_type(dtype, [&](auto zero) { run_binary<decltype(zero)>(kind, launch, context); });
        },
        takes_int ? DTypeSet::kFloatAndInt : DTypeSet::kFloat);
  }

  add_cpu_kernel(
      registry, "cast",
      "reference conversion between any dtypes: floats round to nearest even once, float->int truncates toward "
      "zero (saturating, NaN -> 0), ->bool is x != 0",
      [](const KernelLaunch& launch, const CpuContext& context) {
        if (!is_float_dtype(launch.desc->inputs[0].dtype) || !is_float_dtype(launch.desc->outputs[0].dtype)) {
          return run_any_cast(launch, context);
        }
        const bool wide = launch.desc->inputs[0].dtype == DType::kFloat64 ||
                          launch.desc->outputs[0].dtype == DType::kFloat64;
        if (wide) {
          run_cast<double>(launch, context);
        } else {
          run_cast<float>(launch, context);
        }
      },
      DTypeSet::kAll);
}

}  // namespace xpuruntime::cpu
