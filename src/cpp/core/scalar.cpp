// Scalars read from tensors (Note [Scalars read from tensors] in scalar.h).
#include "core/scalar.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/half.h"
#include "core/shape_str.h"

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

}  // namespace xpuruntime::detail
