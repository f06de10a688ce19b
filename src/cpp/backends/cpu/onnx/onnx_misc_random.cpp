// ONNX reference ops, random generators: RandomUniform, RandomNormal, RandomUniformLike, RandomNormalLike,
// Bernoulli. See backends/cpu/onnx/onnx_kernels.h.
//
// Note [Random values]
// Each run draws from its own std::mt19937_64: seeded from the `seed` attribute when the node has one (the same
// seed gives the same values on every run and every platform: the uniform and normal draws below are written
// out rather than taken from <random>'s distributions, whose algorithms the standard leaves open), and from
// std::random_device otherwise. ONNX does not define the generator, so values differ from those of ONNX
// Runtime, NumPy or PyTorch for the same seed; only their distribution is comparable.
#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/onnx/onnx_misc.h"

namespace xpuruntime::onnx_ref {
namespace {

using namespace misc;  // NOLINT(google-build-using-namespace): this group's helpers (onnx_misc.h)

constexpr double kPi = 3.14159265358979323846;

class Generator {
 public:
  explicit Generator(const OpContext& ctx) {
    if (ctx.has_attr("seed")) {
      const double seed = ctx.attr_float("seed", 0.0);
      std::uint64_t bits = 0;
      std::memcpy(&bits, &seed, sizeof(bits));
      engine_.seed(bits);
    } else {
      std::random_device device;
      engine_.seed((static_cast<std::uint64_t>(device()) << 32) ^ device());
    }
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller; both values of a pair are used).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * kPi * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * kPi * u2);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// The output dtype: the `dtype` attribute, else `fallback`; random floats only come in floating dtypes.
DType random_dtype(const OpContext& ctx, DType fallback) {
  const DType d = ctx.has_attr("dtype") ? dtype_from_onnx(ctx.attr_int("dtype", 1), ctx.where(), "dtype") : fallback;
  XPURT_CHECK_TYPE(is_float_dtype(d), ctx.where(), ": random values must be floating-point, got dtype ",
                   dtype_name(d));
  return d;
}

void fill(OpContext& ctx, const std::vector<std::int64_t>& shape, DType dtype, bool normal) {
  Generator gen(ctx);
  const double a = ctx.attr_float(normal ? "mean" : "low", 0.0);
  const double b = ctx.attr_float(normal ? "scale" : "high", 1.0);
  ScratchVector<double> v(static_cast<std::size_t>(numel_of(shape)));
  for (double& x : v) x = normal ? a + b * gen.normal() : a + (b - a) * gen.uniform();
  store_doubles(ctx.allocate_output(0, shape, dtype), v);
}

void random_op(OpContext& ctx, bool normal) {
  XPURT_CHECK(ctx.has_attr("shape"), ctx.where(), ": attribute 'shape' is required");
  const std::vector<std::int64_t> shape = ctx.attr_ints("shape", {});
  for (std::int64_t d : shape) XPURT_CHECK(d >= 0, ctx.where(), ": shape has a negative dimension ", d);
  fill(ctx, shape, random_dtype(ctx, DType::kFloat32), normal);
}

void random_like_op(OpContext& ctx, bool normal) {
  const Tensor& input = ctx.input(0);
  const DType fallback = input.dtype();
  if (!ctx.has_attr("dtype")) {
    XPURT_CHECK_TYPE(is_float_dtype(fallback), ctx.where(), ": input is ", dtype_name(fallback),
                     "; give a floating-point 'dtype' attribute for the random values");
  }
  fill(ctx, input.shape(), random_dtype(ctx, fallback), normal);
}

void bernoulli(OpContext& ctx) {
  const Tensor& input = ctx.input(0);
  XPURT_CHECK_TYPE(is_float_dtype(input.dtype()), ctx.where(), ": input must be floating-point probabilities, got ",
                   dtype_name(input.dtype()));
  const DType dtype =
      ctx.has_attr("dtype") ? dtype_from_onnx(ctx.attr_int("dtype", 1), ctx.where(), "dtype") : input.dtype();
  const ScratchVector<double> p = to_doubles(input);
  Generator gen(ctx);
  ScratchVector<double> y(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    XPURT_CHECK(p[i] >= 0.0 && p[i] <= 1.0, ctx.where(), ": probability ", p[i], " at index ", i,
                " is outside [0, 1]");
    y[i] = gen.uniform() < p[i] ? 1.0 : 0.0;
  }
  store_doubles(ctx.allocate_output(0, input.shape(), dtype), y);
}

}  // namespace

void register_misc_random_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "RandomUniform", [](OpContext& ctx) { random_op(ctx, false); });
  kernels.add("", "RandomNormal", [](OpContext& ctx) { random_op(ctx, true); });
  kernels.add("", "RandomUniformLike", [](OpContext& ctx) { random_like_op(ctx, false); });
  kernels.add("", "RandomNormalLike", [](OpContext& ctx) { random_like_op(ctx, true); });
  kernels.add("", "Bernoulli", bernoulli);
}

}  // namespace xpuruntime::onnx_ref
