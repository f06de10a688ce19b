// ONNX reference ops (elementwise group): arithmetic, math functions, activations, comparisons, logic, bitwise
// ops, Where, Cast/CastLike, Identity, Dropout (inference), Softmax/LogSoftmax/Hardmax. See
// backends/cpu/onnx/onnx_kernels.h for the contract.
//
// Note [Elementwise loops]
// Every op with several inputs runs through one broadcasting loop (plan_broadcast + for_each_row): the output
// dims are coalesced wherever every operand is contiguous across them (or broadcast across them), size-1 dims
// are dropped, and the innermost coalesced dim becomes a tight loop with the operands' strides (1 or 0). Two
// tensors of one shape therefore run as a single flat loop, [N,C,H,W] + [1,C,1,1] as N*C rows of H*W elements
// with a scalar second operand. Element types are dispatched once per op, never per element; 16-bit floats are
// loaded to float, computed in float and rounded back (Compute<T> in onnx_common.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "backends/cpu/onnx/onnx_common.h"
#include "backends/cpu/onnx/onnx_kernels.h"
#include "backends/cpu/onnx/onnx_misc.h"  // to_doubles, store_doubles: float8 and int4 casts
#include "xpuruntime/onnx_dtype.h"

namespace xpuruntime::onnx_ref {
namespace {

using Shape = std::vector<std::int64_t>;

template <typename T>
using ComputeT = typename Compute<T>::type;

// ---- dtype sets ----

constexpr unsigned dtype_bit(DType d) { return 1u << static_cast<unsigned>(d); }
constexpr unsigned kFloatTypes =
    dtype_bit(DType::kFloat16) | dtype_bit(DType::kBFloat16) | dtype_bit(DType::kFloat32) | dtype_bit(DType::kFloat64);
constexpr unsigned kSignedIntTypes =
    dtype_bit(DType::kInt8) | dtype_bit(DType::kInt16) | dtype_bit(DType::kInt32) | dtype_bit(DType::kInt64);
constexpr unsigned kUnsignedIntTypes =
    dtype_bit(DType::kUInt8) | dtype_bit(DType::kUInt16) | dtype_bit(DType::kUInt32) | dtype_bit(DType::kUInt64);
constexpr unsigned kIntTypes = kSignedIntTypes | kUnsignedIntTypes;
constexpr unsigned kNumericTypes = kFloatTypes | kIntTypes;
constexpr unsigned kBoolTypes = dtype_bit(DType::kBool);
constexpr unsigned kAllTypes = kNumericTypes | kBoolTypes;

std::string dtype_set_names(unsigned set) {
  std::string out;
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8, DType::kUInt8,
                  DType::kInt16, DType::kUInt16, DType::kInt32, DType::kUInt32, DType::kInt64, DType::kUInt64,
                  DType::kBool}) {
    if ((set & dtype_bit(d)) == 0) continue;
    if (!out.empty()) out += ", ";
    out += dtype_name(d);
  }
  return out;
}

// InvalidTypeError naming the node and the argument unless `dtype` is in `set`.
void check_dtype(const OpContext& ctx, const std::string& what, DType dtype, unsigned set) {
  XPURT_CHECK_TYPE((set & dtype_bit(dtype)) != 0, ctx.where(), ": ", what, " has dtype ", dtype_name(dtype),
                   "; expected one of ", dtype_set_names(set));
}

void check_same_dtype(const OpContext& ctx, const Tensor& a, std::size_t ia, const Tensor& b, std::size_t ib) {
  XPURT_CHECK_TYPE(a.dtype() == b.dtype(), ctx.where(), ": input ", ib, " has dtype ", dtype_name(b.dtype()),
                   " but input ", ia, " has dtype ", dtype_name(a.dtype()), " (they must match)");
}

// visit_dtype restricted to a set, so that an op instantiates its loops only for the types it accepts (callers
// check the dtype first; these throw for the others as a last resort).
template <typename Fn>
decltype(auto) visit_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat16{});
    default: break;
  }
  throw InvalidTypeError(detail::str_cat("expected a floating-point dtype, got ", dtype_name(dtype)));
}

template <typename Fn>
decltype(auto) visit_int(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kInt8: return fn(std::int8_t{});
    case DType::kUInt8: return fn(std::uint8_t{});
    case DType::kInt16: return fn(std::int16_t{});
    case DType::kInt32: return fn(std::int32_t{});
    case DType::kInt64: return fn(std::int64_t{});
    case DType::kUInt16: return fn(std::uint16_t{});
    case DType::kUInt32: return fn(std::uint32_t{});
    case DType::kUInt64: return fn(std::uint64_t{});
    default: break;
  }
  throw InvalidTypeError(detail::str_cat("expected an integer dtype, got ", dtype_name(dtype)));
}

template <typename Fn>
decltype(auto) visit_numeric(DType dtype, Fn&& fn) {
  XPURT_CHECK_TYPE(dtype != DType::kBool, "expected a numeric dtype, got bool");
  return visit_dtype(dtype, [&](auto tag) -> decltype(auto) {
    if constexpr (std::is_same_v<decltype(tag), bool>) {
      return fn(std::int8_t{});  // unreachable (checked above); keeps bool loops uninstantiated
    } else {
      return fn(tag);
    }
  });
}

// ---- broadcasting loops (Note [Elementwise loops]) ----

constexpr std::size_t kMaxOperands = 3;
using Offsets = std::array<std::int64_t, kMaxOperands>;

struct BroadcastLoop {
  Shape sizes;                   // coalesced output dims; the last one is the inner loop
  std::vector<Offsets> strides;  // per dim, per operand (in elements; 0 on broadcast dims)
  std::int64_t numel = 0;
};

BroadcastLoop plan_broadcast(const Shape& out, std::initializer_list<const Shape*> operands) {
  XPURT_INTERNAL_ASSERT(operands.size() <= kMaxOperands, "too many broadcast operands");
  BroadcastLoop loop;
  loop.numel = numel_of(out);
  std::vector<Shape> per_operand;
  for (const Shape* shape : operands) per_operand.push_back(broadcast_strides(*shape, out));
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    Offsets s{};
    for (std::size_t k = 0; k < per_operand.size(); ++k) s[k] = per_operand[k][d];
    if (!loop.sizes.empty()) {
      // Merge into the previous dim when every operand steps over both as one.
      const Offsets& prev = loop.strides.back();
      bool mergeable = true;
      for (std::size_t k = 0; k < per_operand.size(); ++k) mergeable = mergeable && prev[k] == s[k] * out[d];
      if (mergeable) {
        loop.sizes.back() *= out[d];
        loop.strides.back() = s;
        continue;
      }
    }
    loop.sizes.push_back(out[d]);
    loop.strides.push_back(s);
  }
  if (loop.sizes.empty()) {  // a scalar (or all-ones) output
    loop.sizes.push_back(1);
    loop.strides.push_back(Offsets{});
  }
  return loop;
}

// Calls fn(base offsets, output offset, row length, inner strides) for every row of the (contiguous) output.
template <typename Fn>
void for_each_row(const BroadcastLoop& loop, Fn&& fn) {
  if (loop.numel == 0) return;
  const std::size_t outer_rank = loop.sizes.size() - 1;
  const std::int64_t n = loop.sizes.back();
  const Offsets& inner = loop.strides.back();
  std::vector<std::int64_t> idx(outer_rank, 0);
  Offsets base{};
  for (std::int64_t row = 0, rows = loop.numel / n; row < rows; ++row) {
    fn(base, row * n, n, inner);
    for (std::size_t d = outer_rank; d-- > 0;) {
      if (++idx[d] < loop.sizes[d]) {
        for (std::size_t k = 0; k < kMaxOperands; ++k) base[k] += loop.strides[d][k];
        break;
      }
      for (std::size_t k = 0; k < kMaxOperands; ++k) base[k] -= loop.strides[d][k] * (loop.sizes[d] - 1);
      idx[d] = 0;
    }
  }
}

// out = fn(a, b) elementwise with broadcasting; fn takes and returns compute-type values. `out` may alias `a`
// when they have the output's shape.
template <typename TA, typename TB, typename TO, typename Fn>
void apply_binary(const Tensor& a, const Tensor& b, Tensor& out, Fn fn) {
  const TA* pa = data<TA>(a);
  const TB* pb = data<TB>(b);
  TO* po = data<TO>(out);
  const BroadcastLoop loop = plan_broadcast(out.shape(), {&a.shape(), &b.shape()});
  for_each_row(loop, [&](const Offsets& base, std::int64_t o, std::int64_t n, const Offsets& s) {
    const TA* x = pa + base[0];
    const TB* y = pb + base[1];
    TO* z = po + o;
    if (s[0] == 1 && s[1] == 1) {
      for (std::int64_t j = 0; j < n; ++j)
        z[j] = Compute<TO>::store(fn(Compute<TA>::load(x[j]), Compute<TB>::load(y[j])));
    } else if (s[0] == 1 && s[1] == 0) {
      const auto yv = Compute<TB>::load(*y);
      for (std::int64_t j = 0; j < n; ++j) z[j] = Compute<TO>::store(fn(Compute<TA>::load(x[j]), yv));
    } else if (s[0] == 0 && s[1] == 1) {
      const auto xv = Compute<TA>::load(*x);
      for (std::int64_t j = 0; j < n; ++j) z[j] = Compute<TO>::store(fn(xv, Compute<TB>::load(y[j])));
    } else {
      for (std::int64_t j = 0; j < n; ++j) {
        z[j] = Compute<TO>::store(fn(Compute<TA>::load(x[j * s[0]]), Compute<TB>::load(y[j * s[1]])));
      }
    }
  });
}

template <typename TI, typename TO, typename Fn>
void apply_unary(const Tensor& in, Tensor& out, Fn fn) {
  const TI* x = data<TI>(in);
  TO* y = data<TO>(out);
  const std::int64_t n = in.numel();
  for (std::int64_t i = 0; i < n; ++i) y[i] = Compute<TO>::store(fn(Compute<TI>::load(x[i])));
}

// Opsets 1-6 of Add/Sub/Mul/Div/Pow (and And/Or/Xor/Equal/Greater/Less before 7) broadcast only when
// broadcast=1, aligning B with A at `axis` (default: the trailing dims): B's shape padded with trailing ones.
Shape legacy_broadcast_shape(const OpContext& ctx, const Tensor& a, const Tensor& b) {
  if (ctx.opset() >= 7) return b.shape();
  if (ctx.attr_int("broadcast", 0) == 0) {
    XPURT_CHECK(a.shape() == b.shape(), ctx.where(), ": inputs have shapes ", a.str(), " and ", b.str(),
                " but broadcast=0 (opset ", ctx.opset(), ") requires equal shapes");
    return b.shape();
  }
  if (!ctx.has_attr("axis")) return b.shape();
  const auto rank_a = static_cast<std::int64_t>(a.shape().size());
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), rank_a, ctx.where());
  const auto rank_b = static_cast<std::int64_t>(b.shape().size());
  XPURT_CHECK(axis + rank_b <= rank_a, ctx.where(), ": input B of rank ", rank_b, " does not fit input A of rank ",
              rank_a, " at axis ", axis);
  Shape padded = b.shape();
  padded.resize(static_cast<std::size_t>(rank_a - axis), 1);
  return padded;
}

// A view of `t` with another shape of the same element count (no copy).
Tensor reshaped(const Tensor& t, const Shape& shape) {
  return Tensor::from_blob(t.data_ptr(), shape, {}, t.dtype(), t.device(), std::make_shared<Tensor>(t), t.nbytes());
}

// ---- integer arithmetic with ONNX's (wrapping, C-truncating) semantics ----

template <typename T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename T>
T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
}
template <typename T>
T wrap_mul(T a, T b) {
  // Multiply in a type at least as wide as unsigned int so that uint8/int16 operands do not promote to int.
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

template <typename T>
T int_pow(T base, std::int64_t exponent) {
  if (exponent < 0) {
    // 1 / base^|e| truncated: only |base| == 1 gives a nonzero result.
    if (base == 1) return 1;
    if constexpr (std::is_signed_v<T>) {
      if (base == -1) return (exponent % 2 == 0) ? T{1} : T{-1};
    }
    XPURT_CHECK(base != 0, "Pow: zero raised to the negative integer power ", exponent);
    return 0;
  }
  T result = 1;
  while (exponent > 0) {
    if (exponent & 1) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
    exponent >>= 1;
  }
  return result;
}

// ---- conversions (Cast) ----

// double -> float rounding to odd (truncate, then set the last bit when inexact). The 16-bit conversion that
// follows then rounds once, correctly: rounding to nearest float first could land on a 16-bit tie and round
// twice.
inline float to_float_round_to_odd(double v) {
  float f = static_cast<float>(v);
  if (!std::isfinite(f) || static_cast<double>(f) == v) return f;
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) --bits;  // one step toward zero (sign-magnitude)
  bits |= 1u;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// A value of compute type F as the compute type of storage type To: floats to integers truncate toward zero (NaN -> 0,
// values out of the target range saturate, negative values into uint8 wrap like C), anything to bool is `!= 0`.
template <typename To, typename F>
ComputeT<To> convert_value(F v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != F{0};
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    if constexpr (std::is_same_v<F, float> || std::is_same_v<F, bool>) {
      return static_cast<float>(v);
    } else {
      return to_float_round_to_odd(static_cast<double>(v));
    }
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else if constexpr (std::is_floating_point_v<F>) {
    if (std::isnan(v)) return To{0};
    const F t = std::trunc(v);
    if constexpr (std::is_unsigned_v<To>) {
      if (t < F{0} && t >= F{-2147483648.0}) return static_cast<To>(static_cast<std::int64_t>(t));
    }
    if (t <= static_cast<F>(std::numeric_limits<To>::lowest())) return std::numeric_limits<To>::lowest();
    if (t >= static_cast<F>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(t);
  } else {
    return static_cast<To>(v);  // integers and bool: modular (C++20)
  }
}

void cast_into(const Tensor& in, Tensor& out) {
  visit_dtype(in.dtype(), [&](auto from_tag) {
    using From = decltype(from_tag);
    visit_dtype(out.dtype(), [&](auto to_tag) {
      using To = decltype(to_tag);
      if constexpr (std::is_same_v<From, To>) {
        out.copy_from(in);  // nothing for an empty tensor (no memcpy from a null pointer)
      } else {
        apply_unary<From, To>(in, out, [](auto v) { return convert_value<To>(v); });
      }
    });
  });
}

// ONNX TensorProto.DataType (an int since opset 6, its name as a string in opset 1) -> DType.
DType onnx_dtype(const OpContext& ctx, std::int64_t code) {
  DType dtype;
  std::string type_name;
  if (dtype_from_onnx_type(code, &dtype, &type_name)) return dtype;
  const char* name = type_name == "unknown" ? nullptr : type_name.c_str();
  if (name != nullptr) {
    throw UnsupportedOperationError(detail::str_cat(ctx.where(), ": casting to ", name, " (TensorProto type ", code,
                                                    ") is not supported: xpuruntime tensors have no such dtype"));
  }
  throw InvalidArgumentError(
      detail::str_cat(ctx.where(), ": attribute 'to' = ", code, " is not a TensorProto data type"));
}

DType cast_target(const OpContext& ctx) {
  XPURT_CHECK(ctx.has_attr("to"), ctx.where(), ": attribute 'to' is required");
  // A tensor, graph or type attribute named 'to' lives in another map.
  XPURT_CHECK_TYPE(ctx.node().attrs.has("to"), ctx.where(),
                   ": attribute 'to' must be an int (a TensorProto data type), not a tensor, graph or type");
  const AttrValue& value = ctx.node().attrs.values().at("to");
  if (const auto* name = std::get_if<std::string>(&value)) {  // opset 1: "FLOAT", "INT64", ...
    static const std::vector<std::pair<std::string, std::int64_t>> kNames = {
        {"FLOAT", 1},   {"UINT8", 2},      {"INT8", 3},        {"UINT16", 4},   {"INT16", 5},   {"INT32", 6},
        {"INT64", 7},   {"STRING", 8},     {"BOOL", 9},        {"FLOAT16", 10}, {"DOUBLE", 11}, {"UINT32", 12},
        {"UINT64", 13}, {"COMPLEX64", 14}, {"COMPLEX128", 15}, {"BFLOAT16", 16}};
    for (const auto& [n, code] : kNames) {
      if (n == *name) return onnx_dtype(ctx, code);
    }
    throw InvalidArgumentError(
        detail::str_cat(ctx.where(), ": attribute 'to' = '", *name, "' is not a TensorProto data type name"));
  }
  return onnx_dtype(ctx, ctx.attr_int("to", 0));
}

// ---- op groups ----

// y = fn(x) over the floating-point dtypes (fn gets and returns float for the 16-bit types, else T).
template <typename Fn>
void float_unary(OpContext& ctx, Fn fn) {
  const Tensor& x = ctx.input(0);
  check_dtype(ctx, "input 0", x.dtype(), kFloatTypes);
  Tensor& y = ctx.allocate_output(0, x.shape(), x.dtype());
  visit_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    apply_unary<T, T>(x, y, fn);
  });
}

// y = fn(x) over the numeric dtypes in `set` (fn is generic: called with float/double/integers).
template <typename Fn>
void numeric_unary(OpContext& ctx, unsigned set, Fn fn) {
  const Tensor& x = ctx.input(0);
  check_dtype(ctx, "input 0", x.dtype(), set);
  Tensor& y = ctx.allocate_output(0, x.shape(), x.dtype());
  visit_numeric(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    apply_unary<T, T>(x, y, fn);
  });
}

// Output shape of a broadcasting op over inputs [0, n).
Shape broadcast_all(const OpContext& ctx, std::size_t n) {
  Shape out = ctx.input(0).shape();
  for (std::size_t i = 1; i < n; ++i) out = broadcast_shapes(out, ctx.input(i).shape(), ctx.where());
  return out;
}

// z = fn(a, b) with broadcasting, a and b of one dtype in `set`, z of that dtype (or bool when to_bool).
// `visit` picks the instantiated types (visit_numeric, visit_int, visit_float, visit_dtype).
template <bool ToBool, typename Visit, typename Fn>
void binary_op(OpContext& ctx, unsigned set, Visit visit, Fn fn) {
  const Tensor& a = ctx.input(0);
  Tensor b = ctx.input(1);
  check_dtype(ctx, "input 0", a.dtype(), set);
  check_same_dtype(ctx, a, 0, b, 1);
  const Shape b_shape = legacy_broadcast_shape(ctx, a, b);
  if (b_shape != b.shape()) b = reshaped(b, b_shape);
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), ctx.where());
  Tensor& z = ctx.allocate_output(0, out_shape, ToBool ? DType::kBool : a.dtype());
  visit(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    apply_binary<T, T, std::conditional_t<ToBool, bool, T>>(a, b, z, fn);
  });
}

struct VisitNumeric {
  template <typename Fn>
  decltype(auto) operator()(DType d, Fn&& fn) const {
    return visit_numeric(d, fn);
  }
};
struct VisitInt {
  template <typename Fn>
  decltype(auto) operator()(DType d, Fn&& fn) const {
    return visit_int(d, fn);
  }
};
struct VisitAll {
  template <typename Fn>
  decltype(auto) operator()(DType d, Fn&& fn) const {
    return visit_dtype(d, fn);
  }
};
struct VisitBool {
  template <typename Fn>
  decltype(auto) operator()(DType d, Fn&& fn) const {
    XPURT_CHECK_TYPE(d == DType::kBool, "expected bool, got ", dtype_name(d));
    return fn(bool{});
  }
};

// Arithmetic where the result type is the operand type (so integer results stay integers).
template <typename Fn>
void arithmetic_op(OpContext& ctx, Fn fn) {
  const Tensor& a = ctx.input(0);
  check_dtype(ctx, "input 0", a.dtype(), kNumericTypes);
  Tensor b = ctx.input(1);
  check_same_dtype(ctx, a, 0, b, 1);
  const Shape b_shape = legacy_broadcast_shape(ctx, a, b);
  if (b_shape != b.shape()) b = reshaped(b, b_shape);
  Tensor& z = ctx.allocate_output(0, broadcast_shapes(a.shape(), b.shape(), ctx.where()), a.dtype());
  visit_numeric(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeT<T>;
    apply_binary<T, T, T>(a, b, z, [&](C x, C y) -> C { return fn(x, y); });
  });
}

// Min/Max/Sum/Mean: variadic with multidirectional broadcasting, folded pairwise into the output.
template <typename Fn>
void variadic_op(OpContext& ctx, Fn fn, bool mean) {
  const std::size_t n = ctx.num_inputs();
  XPURT_CHECK(n >= 1, ctx.where(), ": needs at least one input");
  const Tensor& first = ctx.input(0);
  check_dtype(ctx, "input 0", first.dtype(), mean ? kFloatTypes : kNumericTypes);
  for (std::size_t i = 1; i < n; ++i) check_same_dtype(ctx, first, 0, ctx.input(i), i);
  Tensor& out = ctx.allocate_output(0, broadcast_all(ctx, n), first.dtype());
  visit_numeric(first.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeT<T>;
    if (first.shape() == out.shape()) {
      out.copy_from(first);  // nothing for an empty tensor (which may have no storage: no memcpy from null)
    } else {  // the first input broadcast to the output's shape
      apply_binary<T, T, T>(first, first, out, [](C x, C) { return x; });
    }
    for (std::size_t i = 1; i < n; ++i) {
      apply_binary<T, T, T>(out, ctx.input(i), out, [&](C x, C y) -> C { return fn(x, y); });
    }
    if (mean) {
      if constexpr (std::is_floating_point_v<C>) {
        const C scale = static_cast<C>(n);
        apply_unary<T, T>(out, out, [scale](C v) { return v / scale; });
      }
    }
  });
}

template <typename C>
C nan_min(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
  }
  return b < a ? b : a;
}
template <typename C>
C nan_max(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
  }
  return a < b ? b : a;
}

// ---- registration helpers per family ----

void register_arithmetic(NodeKernelRegistrar& kernels) {
  kernels.add("", "Add", [](OpContext& ctx) {
    arithmetic_op(ctx, [](auto x, auto y) {
      if constexpr (std::is_integral_v<decltype(x)>)
        return wrap_add(x, y);
      else
        return x + y;
    });
  });
  kernels.add("", "Sub", [](OpContext& ctx) {
    arithmetic_op(ctx, [](auto x, auto y) {
      if constexpr (std::is_integral_v<decltype(x)>)
        return wrap_sub(x, y);
      else
        return x - y;
    });
  });
  kernels.add("", "Mul", [](OpContext& ctx) {
    arithmetic_op(ctx, [](auto x, auto y) {
      if constexpr (std::is_integral_v<decltype(x)>)
        return wrap_mul(x, y);
      else
        return x * y;
    });
  });
  kernels.add("", "Div", [](OpContext& ctx) {
    const std::string where = ctx.where();
    arithmetic_op(ctx, [&where](auto x, auto y) {
      using C = decltype(x);
      if constexpr (std::is_integral_v<C>) {
        XPURT_CHECK(y != 0, where, ": integer division by zero");
        if constexpr (std::is_signed_v<C>) {
          if (y == -1) return wrap_sub(C{0}, x);  // avoids the overflow of lowest() / -1
        }
        return static_cast<C>(x / y);  // truncates toward zero, like C
      } else {
        return x / y;
      }
    });
  });
  kernels.add("", "Mod", [](OpContext& ctx) {
    const std::string where = ctx.where();
    const bool fmod = ctx.attr_int("fmod", 0) != 0;
    arithmetic_op(ctx, [&where, fmod](auto x, auto y) {
      using C = decltype(x);
      if constexpr (std::is_integral_v<C>) {
        XPURT_CHECK(y != 0, where, ": integer modulo by zero");
        C r;
        if constexpr (std::is_signed_v<C>) {
          r = y == -1 ? C{0} : static_cast<C>(x % y);
          if (!fmod && r != 0 && ((r < 0) != (y < 0))) r = static_cast<C>(r + y);
        } else {
          r = static_cast<C>(x % y);
        }
        return r;
      } else {
        C r = std::fmod(x, y);
        if (!fmod && r != 0 && ((r < 0) != (y < 0))) r += y;  // Python's %: the sign of the divisor
        return r;
      }
    });
  });
  kernels.add("", "Pow", [](OpContext& ctx) {
    const Tensor& a = ctx.input(0);
    Tensor b = ctx.input(1);
    check_dtype(ctx, "input 0 (X)", a.dtype(), kNumericTypes);
    check_dtype(ctx, "input 1 (Y)", b.dtype(), kNumericTypes);
    if (ctx.opset() < 12) check_same_dtype(ctx, a, 0, b, 1);
    const Shape b_shape = legacy_broadcast_shape(ctx, a, b);
    if (b_shape != b.shape()) b = reshaped(b, b_shape);
    Tensor& z = ctx.allocate_output(0, broadcast_shapes(a.shape(), b.shape(), ctx.where()), a.dtype());
    visit_numeric(a.dtype(), [&](auto base_tag) {
      using TA = decltype(base_tag);
      using CA = ComputeT<TA>;
      visit_numeric(b.dtype(), [&](auto exp_tag) {
        using TB = decltype(exp_tag);
        using CB = ComputeT<TB>;
        if constexpr (std::is_integral_v<CA> && std::is_integral_v<CB>) {
          apply_binary<TA, TB, TA>(a, b, z, [](CA x, CB y) { return int_pow<CA>(x, static_cast<std::int64_t>(y)); });
        } else if constexpr (std::is_integral_v<CA>) {
          // NumPy: int ** float computes in double, then the result is cast back to the base's type.
          apply_binary<TA, TB, TA>(a, b, z, [](CA x, CB y) {
            return convert_value<CA>(std::pow(static_cast<double>(x), static_cast<double>(y)));
          });
        } else {
          apply_binary<TA, TB, TA>(a, b, z,
                                   [](CA x, CB y) { return static_cast<CA>(std::pow(x, static_cast<CA>(y))); });
        }
      });
    });
  });
  kernels.add("", "Neg", [](OpContext& ctx) {
    numeric_unary(ctx, kFloatTypes | kSignedIntTypes, [](auto v) {
      if constexpr (std::is_integral_v<decltype(v)>)
        return wrap_sub(decltype(v){0}, v);
      else
        return -v;
    });
  });
  kernels.add("", "Abs", [](OpContext& ctx) {
    numeric_unary(ctx, kNumericTypes, [](auto v) {
      using C = decltype(v);
      if constexpr (std::is_unsigned_v<C>)
        return v;
      else if constexpr (std::is_integral_v<C>)
        return v < 0 ? wrap_sub(C{0}, v) : v;
      else
        return std::fabs(v);
    });
  });
  kernels.add("", "Sign", [](OpContext& ctx) {
    numeric_unary(ctx, kNumericTypes, [](auto v) {
      using C = decltype(v);
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(v)) return v;
      }
      if constexpr (std::is_unsigned_v<C>) {
        return static_cast<C>(v > C{0} ? 1 : 0);
      } else {
        return static_cast<C>(v > C{0} ? 1 : (v < C{0} ? -1 : 0));
      }
    });
  });
  kernels.add("", "Min", [](OpContext& ctx) {
    variadic_op(
        ctx, [](auto x, auto y) { return nan_min(x, y); }, false);
  });
  kernels.add("", "Max", [](OpContext& ctx) {
    variadic_op(
        ctx, [](auto x, auto y) { return nan_max(x, y); }, false);
  });
  kernels.add("", "Sum", [](OpContext& ctx) {
    variadic_op(
        ctx,
        [](auto x, auto y) {
          if constexpr (std::is_integral_v<decltype(x)>)
            return wrap_add(x, y);
          else
            return x + y;
        },
        false);
  });
  kernels.add("", "Mean", [](OpContext& ctx) {
    variadic_op(
        ctx, [](auto x, auto y) { return x + y; }, true);
  });
}

void register_math(NodeKernelRegistrar& kernels) {
  kernels.add("", "Sqrt", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::sqrt(v); }); });
  kernels.add("", "Exp", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::exp(v); }); });
  kernels.add("", "Log", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::log(v); }); });
  kernels.add("", "Reciprocal", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return decltype(v){1} / v; }); });
  kernels.add("", "Ceil", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::ceil(v); }); });
  kernels.add("", "Floor", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::floor(v); }); });
  // Round half to even (the default floating-point rounding mode), as ONNX and NumPy do.
  kernels.add("", "Round", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::nearbyint(v); }); });
  kernels.add("", "Sin", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::sin(v); }); });
  kernels.add("", "Cos", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::cos(v); }); });
  kernels.add("", "Tan", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::tan(v); }); });
  kernels.add("", "Asin", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::asin(v); }); });
  kernels.add("", "Acos", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::acos(v); }); });
  kernels.add("", "Atan", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::atan(v); }); });
  kernels.add("", "Sinh", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::sinh(v); }); });
  kernels.add("", "Cosh", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::cosh(v); }); });
  kernels.add("", "Asinh", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::asinh(v); }); });
  kernels.add("", "Acosh", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::acosh(v); }); });
  kernels.add("", "Atanh", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::atanh(v); }); });
  kernels.add("", "Tanh", [](OpContext& ctx) { float_unary(ctx, [](auto v) { return std::tanh(v); }); });
  // Erf-9 also takes integer tensors: erf computed in double, truncated back.
  kernels.add("", "Erf", [](OpContext& ctx) {
    numeric_unary(ctx, kNumericTypes, [](auto v) {
      using C = decltype(v);
      if constexpr (std::is_floating_point_v<C>)
        return std::erf(v);
      else
        return convert_value<C>(std::erf(static_cast<double>(v)));
    });
  });
  kernels.add("", "IsNaN", [](OpContext& ctx) {
    const Tensor& x = ctx.input(0);
    check_dtype(ctx, "input 0", x.dtype(), kFloatTypes);
    Tensor& y = ctx.allocate_output(0, x.shape(), DType::kBool);
    visit_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      apply_unary<T, bool>(x, y, [](auto v) { return std::isnan(v); });
    });
  });
  kernels.add("", "IsInf", [](OpContext& ctx) {
    const Tensor& x = ctx.input(0);
    check_dtype(ctx, "input 0", x.dtype(), kFloatTypes);
    const bool negative = ctx.attr_int("detect_negative", 1) != 0;
    const bool positive = ctx.attr_int("detect_positive", 1) != 0;
    Tensor& y = ctx.allocate_output(0, x.shape(), DType::kBool);
    visit_float(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      apply_unary<T, bool>(
          x, y, [negative, positive](auto v) { return std::isinf(v) && ((v > 0 && positive) || (v < 0 && negative)); });
    });
  });
}

// Activations: alpha/beta/gamma attributes are read in double and applied in the compute type.

// Relu and its exponential-linear relatives: LeakyRelu, Elu, Selu, Celu.
void register_relu_activations(NodeKernelRegistrar& kernels) {
  kernels.add("", "Relu", [](OpContext& ctx) {
    numeric_unary(ctx, kFloatTypes | kSignedIntTypes, [](auto v) { return v > decltype(v){0} ? v : decltype(v){0}; });
  });
  kernels.add("", "LeakyRelu", [](OpContext& ctx) {
    const double alpha = ctx.attr_float("alpha", 0.01);
    float_unary(ctx, [alpha](auto v) {
      using C = decltype(v);
      return v >= C{0} ? v : static_cast<C>(alpha) * v;
    });
  });
  kernels.add("", "Elu", [](OpContext& ctx) {
    const double alpha = ctx.attr_float("alpha", 1.0);
    float_unary(ctx, [alpha](auto v) {
      using C = decltype(v);
      return v >= C{0} ? v : static_cast<C>(alpha) * std::expm1(v);
    });
  });
  kernels.add("", "Selu", [](OpContext& ctx) {
    const double alpha = ctx.attr_float("alpha", 1.67326319217681884765625);
    const double gamma = ctx.attr_float("gamma", 1.05070102214813232421875);
    float_unary(ctx, [alpha, gamma](auto v) {
      using C = decltype(v);
      return v > C{0} ? static_cast<C>(gamma) * v : static_cast<C>(gamma * alpha) * std::expm1(v);
    });
  });
  kernels.add("", "Celu", [](OpContext& ctx) {
    const double alpha = ctx.attr_float("alpha", 1.0);
    XPURT_CHECK(alpha != 0.0, ctx.where(), ": attribute alpha must be nonzero");
    float_unary(ctx, [alpha](auto v) {
      using C = decltype(v);
      const C a = static_cast<C>(alpha);
      return v > C{0} ? v : a * std::expm1(v / a);
    });
  });
}

// Sigmoid, HardSigmoid, HardSwish, Softplus, Softsign, ThresholdedRelu, Shrink, Mish, Gelu.
void register_curve_activations(NodeKernelRegistrar& kernels) {
  kernels.add("", "Sigmoid", [](OpContext& ctx) {
    float_unary(ctx, [](auto v) {
      using C = decltype(v);
      // Two forms so that exp never overflows.
      if (v >= C{0}) return C{1} / (C{1} + std::exp(-v));
      const C e = std::exp(v);
      return e / (C{1} + e);
    });
  });
  kernels.add("", "HardSigmoid", [](OpContext& ctx) {
    const double alpha = ctx.attr_float("alpha", 0.2);
    const double beta = ctx.attr_float("beta", 0.5);
    float_unary(ctx, [alpha, beta](auto v) {
      using C = decltype(v);
      return std::max(C{0}, std::min(C{1}, static_cast<C>(alpha) * v + static_cast<C>(beta)));
    });
  });
  kernels.add("", "HardSwish", [](OpContext& ctx) {
    float_unary(ctx, [](auto v) {
      using C = decltype(v);
      return v * std::max(C{0}, std::min(C{1}, v / C{6} + C{0.5}));
    });
  });
  kernels.add("", "Softplus", [](OpContext& ctx) {
    float_unary(ctx, [](auto v) {
      using C = decltype(v);
      return v > C{0} ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));  // log(1 + e^v), overflow-free
    });
  });
  kernels.add("", "Softsign",
          [](OpContext& ctx) { float_unary(ctx, [](auto v) { return v / (decltype(v){1} + std::fabs(v)); }); });
  kernels.add("", "ThresholdedRelu", [](OpContext& ctx) {
    const double alpha = ctx.attr_float("alpha", 1.0);
    float_unary(ctx, [alpha](auto v) {
      using C = decltype(v);
      return v > static_cast<C>(alpha) ? v : C{0};
    });
  });
  kernels.add("", "Shrink", [](OpContext& ctx) {
    const double bias = ctx.attr_float("bias", 0.0);
    const double lambd = ctx.attr_float("lambd", 0.5);
    numeric_unary(ctx, kNumericTypes, [bias, lambd](auto v) {
      using C = decltype(v);
      const double x = static_cast<double>(v);
      const double y = x < -lambd ? x + bias : (x > lambd ? x - bias : 0.0);
      if constexpr (std::is_floating_point_v<C>)
        return static_cast<C>(y);
      else
        return convert_value<C>(y);
    });
  });
  kernels.add("", "Mish", [](OpContext& ctx) {
    float_unary(ctx, [](auto v) {
      using C = decltype(v);
      const C softplus = v > C{0} ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
      return v * std::tanh(softplus);
    });
  });
  kernels.add("", "Gelu", [](OpContext& ctx) {
    const std::string approximate = ctx.attr_string("approximate", "none");
    if (approximate == "tanh") {
      float_unary(ctx, [](auto v) {
        using C = decltype(v);
        const C k = static_cast<C>(0.79788456080286535587989211986876);  // sqrt(2 / pi)
        return C{0.5} * v * (C{1} + std::tanh(k * (v + static_cast<C>(0.044715) * v * v * v)));
      });
    } else {
      XPURT_CHECK(approximate == "none", ctx.where(), ": attribute approximate must be 'none' or 'tanh', got '",
                  approximate, "'");
      float_unary(ctx, [](auto v) {
        using C = decltype(v);
        return C{0.5} * v * (C{1} + std::erf(v * static_cast<C>(0.70710678118654752440084436210485)));
      });
    }
  });
}

// PRelu and Clip: the activations that take their parameters (slope; min and max) as inputs.
void register_input_parameter_activations(NodeKernelRegistrar& kernels) {
  kernels.add("", "PRelu", [](OpContext& ctx) {
    const Tensor& x = ctx.input(0);
    Tensor slope = ctx.input(1);
    check_dtype(ctx, "input 0 (X)", x.dtype(), kNumericTypes);
    check_same_dtype(ctx, x, 0, slope, 1);
    // Before opset 7 a 1-D slope of C values applies per channel (dim 1).
    if (ctx.opset() < 7 && slope.dim() == 1 && x.dim() >= 2 && slope.shape()[0] == x.shape()[1] &&
        slope.shape()[0] != x.shape().back()) {
      Shape s(static_cast<std::size_t>(x.dim() - 1), 1);
      s[0] = slope.shape()[0];
      slope = reshaped(slope, s);
    }
    const Shape out = broadcast_shapes(x.shape(), slope.shape(), ctx.where());
    XPURT_CHECK(out == x.shape(), ctx.where(), ": slope of shape ", slope.str(), " must broadcast to the shape of X ",
                x.str(), " (unidirectional broadcasting)");
    Tensor& y = ctx.allocate_output(0, out, x.dtype());
    visit_numeric(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      using C = ComputeT<T>;
      apply_binary<T, T, T>(x, slope, y, [](C v, C s) -> C {
        if constexpr (std::is_integral_v<C>)
          return v < 0 ? wrap_mul(v, s) : v;
        else
          return v < C{0} ? v * s : v;
      });
    });
  });
  kernels.add("", "Clip", [](OpContext& ctx) {
    const Tensor& x = ctx.input(0);
    check_dtype(ctx, "input 0", x.dtype(), ctx.opset() < 12 ? kFloatTypes : kNumericTypes);
    Tensor& y = ctx.allocate_output(0, x.shape(), x.dtype());
    visit_numeric(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      using C = ComputeT<T>;
      C lo = std::numeric_limits<C>::lowest();
      C hi = std::numeric_limits<C>::max();
      if constexpr (std::is_floating_point_v<C>) {
        lo = -std::numeric_limits<C>::infinity();
        hi = std::numeric_limits<C>::infinity();
      }
      if (ctx.opset() < 11) {  // attributes, defaulting to the type's lowest and largest finite values
        lo = std::numeric_limits<C>::lowest();
        hi = std::numeric_limits<C>::max();
        if (ctx.has_attr("min")) lo = static_cast<C>(ctx.attr_float("min", 0.0));
        if (ctx.has_attr("max")) hi = static_cast<C>(ctx.attr_float("max", 0.0));
      } else {
        for (std::size_t i = 1; i <= 2; ++i) {
          if (!ctx.has_input(i)) continue;
          const Tensor& bound = ctx.input(i);
          check_same_dtype(ctx, x, 0, bound, i);
          XPURT_CHECK(bound.numel() == 1, ctx.where(), ": input ", i, i == 1 ? " (min)" : " (max)",
                      " must be a scalar, got shape ", bound.str());
          (i == 1 ? lo : hi) = Compute<T>::load(*data<T>(bound));
        }
      }
      // min(max(x, lo), hi): when lo > hi every value becomes hi (ONNX); NaN stays NaN.
      apply_unary<T, T>(x, y, [lo, hi](C v) {
        if (v < lo) v = lo;
        if (v > hi) v = hi;
        return v;
      });
    });
  });
}

// In the order of before the split: the registry keeps its kernels in the order they were added.
void register_activations(NodeKernelRegistrar& kernels) {
  register_relu_activations(kernels);
  register_curve_activations(kernels);
  register_input_parameter_activations(kernels);
}

void register_logic(NodeKernelRegistrar& kernels) {
  const auto comparison = [](const char* name, auto cmp) {
    return [name, cmp](OpContext& ctx) {
      // Equal also takes bool; the others only numbers.
      const unsigned set = std::string(name) == "Equal" ? kAllTypes : kNumericTypes;
      binary_op<true>(ctx, set, VisitAll{}, [&](auto x, auto y) -> bool { return cmp(x, y); });
    };
  };
  kernels.add("", "Equal", comparison("Equal", [](auto x, auto y) { return x == y; }));
  kernels.add("", "Greater", comparison("Greater", [](auto x, auto y) { return x > y; }));
  kernels.add("", "GreaterOrEqual", comparison("GreaterOrEqual", [](auto x, auto y) { return x >= y; }));
  kernels.add("", "Less", comparison("Less", [](auto x, auto y) { return x < y; }));
  kernels.add("", "LessOrEqual", comparison("LessOrEqual", [](auto x, auto y) { return x <= y; }));
  kernels.add("", "And",
          [](OpContext& ctx) { binary_op<true>(ctx, kBoolTypes, VisitBool{}, [](bool x, bool y) { return x && y; }); });
  kernels.add("", "Or",
          [](OpContext& ctx) { binary_op<true>(ctx, kBoolTypes, VisitBool{}, [](bool x, bool y) { return x || y; }); });
  kernels.add("", "Xor",
          [](OpContext& ctx) { binary_op<true>(ctx, kBoolTypes, VisitBool{}, [](bool x, bool y) { return x != y; }); });
  kernels.add("", "Not", [](OpContext& ctx) {
    const Tensor& x = ctx.input(0);
    check_dtype(ctx, "input 0", x.dtype(), kBoolTypes);
    Tensor& y = ctx.allocate_output(0, x.shape(), DType::kBool);
    apply_unary<bool, bool>(x, y, [](bool v) { return !v; });
  });
  kernels.add("", "BitwiseAnd", [](OpContext& ctx) {
    binary_op<false>(ctx, kIntTypes, VisitInt{}, [](auto x, auto y) { return static_cast<decltype(x)>(x & y); });
  });
  kernels.add("", "BitwiseOr", [](OpContext& ctx) {
    binary_op<false>(ctx, kIntTypes, VisitInt{}, [](auto x, auto y) { return static_cast<decltype(x)>(x | y); });
  });
  kernels.add("", "BitwiseXor", [](OpContext& ctx) {
    binary_op<false>(ctx, kIntTypes, VisitInt{}, [](auto x, auto y) { return static_cast<decltype(x)>(x ^ y); });
  });
  kernels.add("", "BitwiseNot", [](OpContext& ctx) {
    const Tensor& x = ctx.input(0);
    check_dtype(ctx, "input 0", x.dtype(), kIntTypes);
    Tensor& y = ctx.allocate_output(0, x.shape(), x.dtype());
    visit_int(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      apply_unary<T, T>(x, y, [](T v) { return static_cast<T>(~v); });
    });
  });
  kernels.add("", "BitShift", [](OpContext& ctx) {
    const std::string direction = ctx.attr_string("direction", "");
    XPURT_CHECK(direction == "LEFT" || direction == "RIGHT", ctx.where(),
                ": attribute direction must be 'LEFT' or 'RIGHT', got '", direction, "'");
    const bool left = direction == "LEFT";
    // ONNX defines BitShift on the unsigned integers.
    binary_op<false>(ctx, kUnsignedIntTypes, VisitInt{}, [left](auto x, auto y) {
      using C = decltype(x);
      using U = std::make_unsigned_t<C>;
      const auto ux = static_cast<U>(x);
      const auto shift = static_cast<U>(y);
      if (shift >= sizeof(C) * 8) return C{0};
      return static_cast<C>(left ? static_cast<U>(ux << shift) : static_cast<U>(ux >> shift));
    });
  });
  kernels.add("", "Where", [](OpContext& ctx) {
    const Tensor& cond = ctx.input(0);
    const Tensor& a = ctx.input(1);
    const Tensor& b = ctx.input(2);
    check_dtype(ctx, "input 0 (condition)", cond.dtype(), kBoolTypes);
    check_same_dtype(ctx, a, 1, b, 2);
    const Shape out_shape =
        broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), ctx.where()), b.shape(), ctx.where());
    Tensor& out = ctx.allocate_output(0, out_shape, a.dtype());
    const BroadcastLoop loop = plan_broadcast(out_shape, {&cond.shape(), &a.shape(), &b.shape()});
    const bool* pc = data<bool>(cond);
    // Selecting copies bits: dispatch on the element size only.
    const auto select = [&](auto tag) {
      using T = decltype(tag);
      const T* pa = static_cast<const T*>(a.data_ptr());
      const T* pb = static_cast<const T*>(b.data_ptr());
      T* po = static_cast<T*>(out.data_ptr());
      for_each_row(loop, [&](const Offsets& base, std::int64_t o, std::int64_t n, const Offsets& s) {
        for (std::int64_t j = 0; j < n; ++j) {
          po[o + j] = pc[base[0] + j * s[0]] ? pa[base[1] + j * s[1]] : pb[base[2] + j * s[2]];
        }
      });
    };
    switch (a.element_size()) {
      case 1: select(std::uint8_t{}); break;
      case 2: select(std::uint16_t{}); break;
      case 4: select(std::uint32_t{}); break;
      case 8: select(std::uint64_t{}); break;
      default: XPURT_INTERNAL_ASSERT(false, "unexpected element size ", a.element_size());
    }
  });
}

// Cast and CastLike: float8 and int4/uint4 on either side go through double (exact for every source but int64
// beyond 2^53), rounding once to the target with `saturate` (opset 19+; Note [Float8 and 4-bit dtypes],
// xpuruntime/low_bit.h); the other dtypes as cast_into.
void cast_node(OpContext& ctx, DType to) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.allocate_output(0, x.shape(), to);
  if (!is_low_bit_dtype(x.dtype()) && !is_low_bit_dtype(to)) return cast_into(x, y);
  if (x.dtype() == to) {
    y.copy_from(x);
    return;
  }
  const bool saturate = ctx.opset() < 19 || ctx.attr_int("saturate", 1) != 0;
  misc::store_doubles(y, misc::to_doubles(x), saturate);
}

void register_casts(NodeKernelRegistrar& kernels) {
  kernels.add("", "Cast", [](OpContext& ctx) { cast_node(ctx, cast_target(ctx)); });
  kernels.add("", "CastLike", [](OpContext& ctx) { cast_node(ctx, ctx.input(1).dtype()); });
  // Any value kind: tensors, sequences and optionals (opset 16).
  kernels.add("", "Identity", [](OpContext& ctx) { ctx.set_output(0, ctx.value(0)); });
  kernels.add("", "Dropout", [](OpContext& ctx) {
    const Tensor& x = ctx.input(0);
    check_dtype(ctx, "input 0", x.dtype(), kFloatTypes);
    double ratio = 0.5;
    bool training = false;
    if (ctx.opset() < 7) {
      ratio = ctx.attr_float("ratio", 0.5);
      training = ctx.attr_int("is_test", 0) == 0;
    } else if (ctx.opset() < 12) {
      ratio = ctx.attr_float("ratio", 0.5);
    } else {
      if (ctx.has_input(1)) ratio = read_scalar(ctx.input(1), ctx.where() + " input 1 (ratio)");
      if (ctx.has_input(2)) training = read_scalar(ctx.input(2), ctx.where() + " input 2 (training_mode)") != 0.0;
    }
    XPURT_CHECK(ratio >= 0.0 && ratio < 1.0, ctx.where(), ": ratio must be in [0, 1), got ", ratio);
    if (training && ratio > 0.0) {
      throw UnsupportedOperationError(
          detail::str_cat(ctx.where(), ": training-mode dropout with ratio ", ratio,
                          " draws random numbers; only inference (or ratio 0) is supported"));
    }
    ctx.set_output(0, x);
    if (ctx.wants_output(1)) {
      // The mask keeps every element: bool from opset 10, the input's type before.
      const DType mask_dtype = ctx.opset() >= 10 ? DType::kBool : x.dtype();
      Tensor& mask = ctx.allocate_output(1, x.shape(), mask_dtype);
      visit_dtype(mask_dtype, [&](auto tag) {
        using T = decltype(tag);
        T* p = data<T>(mask);
        const T one = Compute<T>::store(convert_value<T>(1.0f));
        for (std::int64_t i = 0, n = mask.numel(); i < n; ++i) p[i] = one;
      });
    }
  });
}

// ---- Softmax family ----

// Softmax's layout (softmax_layout in onnx_common.h) from the node's axis: opsets < 13 default to 1 and take
// axis = rank too.
SoftmaxLayout softmax_layout(const OpContext& ctx, const Tensor& x) {
  const auto rank = static_cast<std::int64_t>(x.dim());
  const bool legacy = ctx.opset() < 13;
  const std::int64_t axis = ctx.attr_int("axis", legacy ? 1 : -1);
  if (rank == 0) return SoftmaxLayout{};
  std::int64_t a;
  if (legacy) {
    XPURT_CHECK(axis >= -rank && axis <= rank, ctx.where(), ": axis ", axis, " is out of range for rank ", rank);
    a = axis < 0 ? axis + rank : axis;
  } else {
    a = normalize_axis(axis, rank, ctx.where());
  }
  return onnx_ref::softmax_layout(x.shape(), a, legacy);
}

enum class SoftmaxKind { kSoftmax, kLogSoftmax, kHardmax };

// One block (n x inner values) at a time, vectorized over `inner`: the max, then exp(x - max) once per element
// (in the compute type) with the sums in double. With inner == 1 the same loops run one row at a time.
template <typename T>
void softmax_blocks(const Tensor& x, Tensor& y, const SoftmaxLayout& l, SoftmaxKind kind) {
  using C = ComputeT<T>;
  if (l.n == 0) return;
  const T* px = data<T>(x);
  T* py = data<T>(y);
  const auto inner = static_cast<std::size_t>(l.inner);
  const auto n = static_cast<std::size_t>(l.n);
  ScratchVector<C> block(n * inner);
  ScratchVector<C> max_value(inner);
  std::vector<std::size_t> argmax(inner);
  ScratchVector<double> sum(inner);
  for (std::int64_t o = 0; o < l.outer; ++o) {
    const T* src = px + static_cast<std::size_t>(o) * n * inner;
    T* dst = py + static_cast<std::size_t>(o) * n * inner;
    for (std::size_t j = 0; j < n * inner; ++j) block[j] = Compute<T>::load(src[j]);
    for (std::size_t i = 0; i < inner; ++i) {
      max_value[i] = block[i];
      argmax[i] = 0;
    }
    for (std::size_t k = 1; k < n; ++k) {
      const C* row = block.data() + k * inner;
      for (std::size_t i = 0; i < inner; ++i) {
        if (row[i] > max_value[i]) {  // strict: the first maximum wins (Hardmax)
          max_value[i] = row[i];
          argmax[i] = k;
        }
      }
    }
    if (kind == SoftmaxKind::kHardmax) {
      for (std::size_t k = 0; k < n; ++k) {
        for (std::size_t i = 0; i < inner; ++i)
          dst[k * inner + i] = Compute<T>::store(static_cast<C>(argmax[i] == k ? 1 : 0));
      }
      continue;
    }
    std::fill(sum.begin(), sum.end(), 0.0);
    for (std::size_t k = 0; k < n; ++k) {
      C* row = block.data() + k * inner;
      for (std::size_t i = 0; i < inner; ++i) {
        const C shifted = row[i] - max_value[i];
        const C e = std::exp(shifted);
        sum[i] += static_cast<double>(e);
        row[i] = kind == SoftmaxKind::kSoftmax ? e : shifted;
      }
    }
    for (std::size_t i = 0; i < inner; ++i) sum[i] = kind == SoftmaxKind::kSoftmax ? 1.0 / sum[i] : std::log(sum[i]);
    for (std::size_t k = 0; k < n; ++k) {
      const C* row = block.data() + k * inner;
      for (std::size_t i = 0; i < inner; ++i) {
        const C v = kind == SoftmaxKind::kSoftmax ? row[i] * static_cast<C>(sum[i]) : row[i] - static_cast<C>(sum[i]);
        dst[k * inner + i] = Compute<T>::store(v);
      }
    }
  }
}

void register_softmax(NodeKernelRegistrar& kernels) {
  const auto make = [](SoftmaxKind kind) {
    return [kind](OpContext& ctx) {
      const Tensor& x = ctx.input(0);
      check_dtype(ctx, "input 0", x.dtype(), kFloatTypes);
      const SoftmaxLayout layout = softmax_layout(ctx, x);
      Tensor& y = ctx.allocate_output(0, x.shape(), x.dtype());
      visit_float(x.dtype(), [&](auto tag) { softmax_blocks<decltype(tag)>(x, y, layout, kind); });
    };
  };
  kernels.add("", "Softmax", make(SoftmaxKind::kSoftmax));
  kernels.add("", "LogSoftmax", make(SoftmaxKind::kLogSoftmax));
  kernels.add("", "Hardmax", make(SoftmaxKind::kHardmax));
}

}  // namespace

SoftmaxLayout softmax_layout(const Shape& shape, std::int64_t axis, bool legacy) {
  SoftmaxLayout layout;
  const auto rank = static_cast<std::int64_t>(shape.size());
  for (std::int64_t d = 0; d < axis; ++d) layout.outer *= shape[static_cast<std::size_t>(d)];
  if (legacy) {
    for (std::int64_t d = axis; d < rank; ++d) layout.n *= shape[static_cast<std::size_t>(d)];
  } else {
    layout.n = shape[static_cast<std::size_t>(axis)];
    for (std::int64_t d = axis + 1; d < rank; ++d) layout.inner *= shape[static_cast<std::size_t>(d)];
  }
  return layout;
}

void register_elementwise_ops(NodeKernelRegistrar& kernels) {
  register_arithmetic(kernels);
  register_math(kernels);
  register_activations(kernels);
  register_logic(kernels);
  register_casts(kernels);
  register_softmax(kernels);
}

}  // namespace xpuruntime::onnx_ref
