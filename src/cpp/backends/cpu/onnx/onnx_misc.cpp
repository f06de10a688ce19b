// ONNX reference ops (misc group): see backends/cpu/onnx/onnx_kernels.h. This file registers the group's
// files (onnx_misc.h) and holds their shared helpers.
#include "backends/cpu/onnx/onnx_misc.h"
#include "core/shape_str.h"
#include "xpuruntime/low_bit.h"
#include "xpuruntime/onnx_dtype.h"

#include <cmath>

namespace xpuruntime::onnx_ref {
namespace misc {

DType dtype_from_onnx(std::int64_t onnx_type, const std::string& where, const std::string& attribute) {
  DType dtype;
  if (dtype_from_onnx_type(onnx_type, &dtype)) return dtype;
  throw InvalidTypeError(detail::str_cat(where, ": attribute '", attribute, "' is ONNX element type ", onnx_type,
                                         ", which xpuruntime tensors cannot hold (supported: float16, bfloat16, "
                                         "float32, float64, int8, uint8, int16, int32, int64, bool)"));
}

double byte_value(std::uint8_t byte, DType dtype) {
  if (is_float8_dtype(dtype)) return static_cast<double>(detail::float8_to_float(byte, dtype));
  return dtype == DType::kInt4 ? static_cast<std::int8_t>(byte) : byte;
}

ScratchVector<double> to_doubles(const Tensor& t) {
  ScratchVector<double> out(static_cast<std::size_t>(t.numel()));
  if (is_low_bit_dtype(t.dtype())) {  // one byte each (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h)
    const auto* p = data<std::uint8_t>(t);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = byte_value(p[i], t.dtype());
    return out;
  }
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = data<T>(t);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(Compute<T>::load(p[i]));
  });
  return out;
}

void store_doubles(Tensor& t, const ScratchVector<double>& values, bool saturate) {
  XPURT_INTERNAL_ASSERT(static_cast<std::int64_t>(values.size()) == t.numel(), "store_doubles: ", values.size(),
                        " values for ", t.numel(), " elements");
  if (is_low_bit_dtype(t.dtype())) {  // Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h
    auto* p = data<std::uint8_t>(t);
    for (std::size_t i = 0; i < values.size(); ++i) {
      p[i] = is_float8_dtype(t.dtype()) ? detail::float8_from_double(values[i], t.dtype(), saturate)
                                        : static_cast<std::uint8_t>(detail::int4_from_double(values[i], t.dtype()));
    }
    return;
  }
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    T* p = data<T>(t);
    for (std::size_t i = 0; i < values.size(); ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        p[i] = values[i] != 0.0;
      } else {
        p[i] = Compute<T>::store(static_cast<C>(values[i]));
      }
    }
  });
}

std::string shape_str(const std::vector<std::int64_t>& shape) { return detail::shape_str(shape, ","); }

double round_half_even(double v) { return std::nearbyint(v); }  // the default FE_TONEAREST mode: ties to even

}  // namespace misc

void register_misc_ops(NodeKernelRegistrar& kernels) {
  register_misc_quantization_ops(kernels);
  register_misc_signal_ops(kernels);
  register_misc_math_ops(kernels);
  register_misc_random_ops(kernels);
}

}  // namespace xpuruntime::onnx_ref
