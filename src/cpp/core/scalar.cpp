// Scalars read from tensors (Note [Scalars read from tensors] in scalar.h).
#include "core/scalar.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "core/shape_str.h"
#include "xpuruntime/low_bit.h"

namespace xpuruntime::detail {

namespace {

double load_as_double(const Tensor& host) {
  const void* p = host.data_ptr();
  switch (host.dtype()) {
    case DType::kFloat16: return half_to_float(*static_cast<const std::uint16_t*>(p));
    case DType::kBFloat16: return bfloat16_to_float(*static_cast<const std::uint16_t*>(p));
    case DType::kFloat32: return *static_cast<const float*>(p);
    case DType::kFloat64: return *static_cast<const double*>(p);
    case DType::kInt8: return *static_cast<const std::int8_t*>(p);
    case DType::kUInt8: return *static_cast<const std::uint8_t*>(p);
    case DType::kInt16: return *static_cast<const std::int16_t*>(p);
    case DType::kInt32: return *static_cast<const std::int32_t*>(p);
    case DType::kInt64: return static_cast<double>(*static_cast<const std::int64_t*>(p));
    case DType::kBool: return *static_cast<const std::uint8_t*>(p) != 0 ? 1.0 : 0.0;
    case DType::kUInt16: return *static_cast<const std::uint16_t*>(p);
    case DType::kUInt32: return *static_cast<const std::uint32_t*>(p);
    case DType::kUInt64: return static_cast<double>(*static_cast<const std::uint64_t*>(p));
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ: return float8_to_float(*static_cast<const std::uint8_t*>(p), host.dtype());
    case DType::kInt4: return *static_cast<const std::int8_t*>(p);  // unpacked (Note [Float8 and 4-bit dtypes])
    case DType::kUInt4: return *static_cast<const std::uint8_t*>(p);
  }
  throw InvalidTypeError(str_cat("a scalar of dtype ", dtype_name(host.dtype()), " has no numeric value"));
}

}  // namespace

void check_one_element(const Tensor& t, const std::string& what) {
  XPURT_CHECK(t.defined(), what, ": expected a scalar, got no tensor");
  XPURT_CHECK(t.numel() == 1, what, ": expected a scalar (one element), got a tensor of ", t.numel(),
              " elements (shape ", shape_str(t.shape()), ")");
}

std::int64_t scalar_as_int64(const Tensor& t, const std::string& what) {
  check_one_element(t, what);
  const Tensor host = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
  const void* p = host.data_ptr();
  switch (host.dtype()) {
    case DType::kInt64: return *static_cast<const std::int64_t*>(p);
    case DType::kUInt64: {
      const std::uint64_t v = *static_cast<const std::uint64_t*>(p);
      XPURT_CHECK(v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), what, ": ", v,
                  " does not fit an int64");
      return static_cast<std::int64_t>(v);
    }
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64: {
      const double v = load_as_double(host);
      // [-2^63, 2^63): the doubles that convert to an int64 (2^63 itself, INT64_MAX rounded, does not).
      XPURT_CHECK(std::isfinite(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0, what, ": ", v,
                  " is not a whole number an int64 can hold");
      return static_cast<std::int64_t>(v);
    }
    default: return static_cast<std::int64_t>(load_as_double(host));  // every other integer type fits exactly
  }
}

double scalar_as_double(const Tensor& t, const std::string& what) {
  check_one_element(t, what);
  return load_as_double(t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous());
}

std::optional<double> one_element_value(const Tensor* t) {
  if (t == nullptr || !t->defined() || t->numel() != 1 || t->dtype() == DType::kBool || !t->device().is_cpu()) {
    return std::nullopt;
  }
  return load_as_double(t->contiguous());
}

namespace {
template <typename T, typename Load>
void load_all(const Tensor& t, std::vector<double>& out, Load load) {
  const T* p = static_cast<const T*>(t.data_ptr());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load(p[i]);
}
template <typename T, typename Store>
void store_all(Tensor& t, const std::vector<double>& in, Store store) {
  T* p = static_cast<T*>(t.data_ptr());
  for (std::size_t i = 0; i < in.size(); ++i) p[i] = store(in[i]);
}
}  // namespace

std::vector<std::int64_t> to_int64s(const Tensor& tensor) {
  const Tensor t = tensor.contiguous();
  XPURT_INTERNAL_ASSERT(t.device().is_cpu(), "graph constants live on the CPU");
  std::vector<std::int64_t> out(static_cast<std::size_t>(t.numel()));
  if (t.dtype() == DType::kInt64) {
    if (!out.empty()) std::memcpy(out.data(), t.data_ptr(), out.size() * sizeof(std::int64_t));
    return out;
  }
  if (t.dtype() == DType::kUInt64) {
    const auto* p = static_cast<const std::uint64_t*>(t.data_ptr());
    constexpr auto kMost = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::int64_t>(p[i] < kMost ? p[i] : kMost);
    return out;
  }
  const std::vector<double> values = to_doubles(t);  // every other integer type exactly
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double v = values[i];
    // [-2^63, 2^63): the doubles that convert to an int64.
    out[i] = std::isnan(v)                  ? 0
             : v >= 9223372036854775808.0   ? std::numeric_limits<std::int64_t>::max()
             : v < -9223372036854775808.0   ? std::numeric_limits<std::int64_t>::min()
                                            : static_cast<std::int64_t>(v);
  }
  return out;
}

std::vector<double> to_doubles(const Tensor& tensor) {
  const Tensor t = tensor.contiguous();
  XPURT_INTERNAL_ASSERT(t.device().is_cpu(), "graph constants live on the CPU");
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  if (out.empty()) return out;
  switch (t.dtype()) {
    case DType::kFloat32:
      load_all<float>(t, out, [](float v) { return static_cast<double>(v); });
      break;
    case DType::kFloat64:
      load_all<double>(t, out, [](double v) { return v; });
      break;
    case DType::kFloat16:
      load_all<std::uint16_t>(
          t, out, [](std::uint16_t v) { return static_cast<double>(half_to_float(v)); });
      break;
    case DType::kBFloat16:
      load_all<std::uint16_t>(
          t, out, [](std::uint16_t v) { return static_cast<double>(bfloat16_to_float(v)); });
      break;
    case DType::kInt8:
      load_all<std::int8_t>(t, out, [](std::int8_t v) { return static_cast<double>(v); });
      break;
    case DType::kUInt8:
      load_all<std::uint8_t>(t, out, [](std::uint8_t v) { return static_cast<double>(v); });
      break;
    case DType::kInt16:
      load_all<std::int16_t>(t, out, [](std::int16_t v) { return static_cast<double>(v); });
      break;
    case DType::kInt32:
      load_all<std::int32_t>(t, out, [](std::int32_t v) { return static_cast<double>(v); });
      break;
    case DType::kInt64:
      load_all<std::int64_t>(t, out, [](std::int64_t v) { return static_cast<double>(v); });
      break;
    case DType::kBool:
      load_all<bool>(t, out, [](bool v) { return v ? 1.0 : 0.0; });
      break;
    case DType::kUInt16:
      load_all<std::uint16_t>(t, out, [](std::uint16_t v) { return static_cast<double>(v); });
      break;
    case DType::kUInt32:
      load_all<std::uint32_t>(t, out, [](std::uint32_t v) { return static_cast<double>(v); });
      break;
    case DType::kUInt64:
      load_all<std::uint64_t>(t, out, [](std::uint64_t v) { return static_cast<double>(v); });
      break;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ: {
      const DType dtype = t.dtype();
      load_all<std::uint8_t>(t, out,
                             [dtype](std::uint8_t v) { return static_cast<double>(float8_to_float(v, dtype)); });
      break;
    }
    case DType::kInt4:
      load_all<std::int8_t>(t, out, [](std::int8_t v) { return static_cast<double>(v); });
      break;
    case DType::kUInt4:
      load_all<std::uint8_t>(t, out, [](std::uint8_t v) { return static_cast<double>(v); });
      break;
  }
  return out;
}

Tensor from_doubles(const std::vector<std::int64_t>& shape, DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  XPURT_INTERNAL_ASSERT(static_cast<std::size_t>(t.numel()) == values.size(), "from_doubles: ", values.size(),
                        " values for a tensor of ", t.numel(), " elements");
  if (values.empty()) return t;
  switch (dtype) {
    case DType::kFloat32:
      store_all<float>(t, values, [](double v) { return static_cast<float>(v); });
      break;
    case DType::kFloat64:
      store_all<double>(t, values, [](double v) { return v; });
      break;
    case DType::kFloat16:
      store_all<std::uint16_t>(t, values,
                               [](double v) { return float_to_half(static_cast<float>(v)); });
      break;
    case DType::kBFloat16:
      store_all<std::uint16_t>(t, values,
                               [](double v) { return float_to_bfloat16(static_cast<float>(v)); });
      break;
    case DType::kInt8:
      store_all<std::int8_t>(t, values, [](double v) { return static_cast<std::int8_t>(v); });
      break;
    case DType::kUInt8:
      store_all<std::uint8_t>(t, values, [](double v) { return static_cast<std::uint8_t>(v); });
      break;
    case DType::kInt16:
      store_all<std::int16_t>(t, values, [](double v) { return static_cast<std::int16_t>(v); });
      break;
    case DType::kInt32:
      store_all<std::int32_t>(t, values, [](double v) { return static_cast<std::int32_t>(v); });
      break;
    case DType::kInt64:
      store_all<std::int64_t>(t, values, [](double v) { return static_cast<std::int64_t>(v); });
      break;
    case DType::kBool:
      store_all<bool>(t, values, [](double v) { return v != 0.0; });
      break;
    case DType::kUInt16:
      store_all<std::uint16_t>(t, values, [](double v) { return static_cast<std::uint16_t>(v); });
      break;
    case DType::kUInt32:
      store_all<std::uint32_t>(t, values, [](double v) { return static_cast<std::uint32_t>(v); });
      break;
    case DType::kUInt64:
      store_all<std::uint64_t>(t, values, [](double v) { return static_cast<std::uint64_t>(v); });
      break;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
      store_all<std::uint8_t>(t, values, [dtype](double v) { return float8_from_double(v, dtype); });
      break;
    case DType::kInt4:
    case DType::kUInt4:  // saturated and rounded to nearest even (Note [Float8 and 4-bit dtypes])
      store_all<std::uint8_t>(t, values,
                              [dtype](double v) { return static_cast<std::uint8_t>(int4_from_double(v, dtype)); });
      break;
  }
  return t;
}

}  // namespace xpuruntime::detail
