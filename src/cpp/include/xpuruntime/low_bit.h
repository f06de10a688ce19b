// Conversions of the storage-only dtypes (dtype.h): the four float8 formats to and from float, and int4/uint4
// values, packed and unpacked. What the ONNX import, the bindings, the cpu backend's node kernels and the tests
// share. Header only, in namespace detail (not a stable API); plain functions of values, no state.
//
// Note [Float8 and 4-bit dtypes]
// * Float8 (ONNX types 17-20) is one byte per element: its bit pattern. Decoding is exact (every float8 value is
//   a float). Encoding (`float8_from_double`) rounds to nearest, ties to even, once, from the double it is given
//   (a float or a double source converts exactly), then applies ONNX's Cast rules for what does not fit:
//
//     source              saturate = true (the default)     saturate = false
//     NaN                 NaN                               NaN
//     +-Inf               +-max finite                      e5m2: +-Inf; e4m3fn, both fnuz: NaN
//     |rounded| > max     +-max finite                      e5m2: +-Inf; e4m3fn, both fnuz: NaN
//
//   max finite: e4m3fn 448, e4m3fnuz 240, e5m2 and e5m2fnuz 57344. NaN is S.1111.111 (e4m3fn, sign kept),
//   S.11111.xx with xx != 0 (e5m2: 0x7F | sign on output), and 0x80 alone for the fnuz types, which have no
//   negative zero (a negative value that rounds to zero gives +0) and no infinity.
// * int4/uint4 (ONNX 22/21) are held unpacked, one value per byte: int4 as an int8 in [-8, 7], uint4 as a uint8
//   in [0, 15]. Kernels then index them as bytes, and data movement moves them like int8. They are packed two per
//   byte, the first value in the low nibble, only where ONNX packs them: initializers' raw_data and int32_data
//   (`unpack_int4`, `pack_int4`; an odd count leaves the last high nibble 0). A CUDA weight-only GEMM that wants
//   packed weights repacks them in a pass of its own. Converting to int4 saturates to the range and rounds to
//   nearest even (ONNX's Cast and QuantizeLinear; NaN gives 0); a byte outside the range is refused where
//   values enter (the import of a packed tensor cannot produce one; Tensor.view("int4") of int8 bytes checks).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "xpuruntime/dtype.h"

namespace xpuruntime::detail {

// The layout of a float8 format.
struct Float8Format {
  int mantissa_bits;      // 3 (e4m3) or 2 (e5m2)
  int exponent_bias;      // 7, 8 (e4m3fnuz), 15, 16 (e5m2fnuz)
  bool fnuz;              // NaN is 0x80 only; no -0, no infinity
  bool has_infinity;      // e5m2 only
  double max_finite;      // 448, 240, 57344, 57344
  std::uint8_t max_code;  // the bit pattern of +max
};

inline Float8Format float8_format(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3FNUZ:
      return {3, 8, true, false, 240.0, 0x7F};
    case DType::kFloat8E5M2:
      return {2, 15, false, true, 57344.0, 0x7B};
    case DType::kFloat8E5M2FNUZ:
      return {2, 16, true, false, 57344.0, 0x7F};
    default:
      return {3, 7, false, false, 448.0, 0x7E};  // kFloat8E4M3FN
  }
}

// The value of float8 bit pattern `bits` of format `dtype` (exact).
inline float float8_to_float(std::uint8_t bits, DType dtype) {
  const Float8Format f = float8_format(dtype);
  const bool negative = (bits & 0x80u) != 0;
  const unsigned exponent_mask = f.mantissa_bits == 3 ? 0xFu : 0x1Fu;
  const unsigned exponent = (bits >> f.mantissa_bits) & exponent_mask;
  const unsigned mantissa = bits & ((1u << f.mantissa_bits) - 1u);
  if (f.fnuz) {
    if (bits == 0x80u) return std::numeric_limits<float>::quiet_NaN();
  } else if (f.has_infinity) {
    if (exponent == exponent_mask) {
      if (mantissa != 0) return std::numeric_limits<float>::quiet_NaN();
      return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    }
  } else if ((bits & 0x7Fu) == 0x7Fu) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  float value;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^(1 - bias - mantissa_bits)
    value = std::ldexp(static_cast<float>(mantissa), 1 - f.exponent_bias - f.mantissa_bits);
  } else {
    value = std::ldexp(static_cast<float>(mantissa + (1u << f.mantissa_bits)),
                       static_cast<int>(exponent) - f.exponent_bias - f.mantissa_bits);
  }
  return negative ? -value : value;
}

// `value` as float8 of format `dtype`: round to nearest even, then ONNX's saturation rules (Note [Float8 and
// 4-bit dtypes]).
inline std::uint8_t float8_from_double(double value, DType dtype, bool saturate = true) {
  const Float8Format f = float8_format(dtype);
  const std::uint8_t nan_code = f.fnuz ? 0x80 : 0x7F;
  if (std::isnan(value))
    return f.fnuz ? nan_code : static_cast<std::uint8_t>(nan_code | (std::signbit(value) ? 0x80 : 0));
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double a = std::fabs(value);
  const auto overflow = [&]() -> std::uint8_t {
    if (saturate) return static_cast<std::uint8_t>(sign | f.max_code);
    if (f.has_infinity) return static_cast<std::uint8_t>(sign | 0x7C);
    return f.fnuz ? nan_code : static_cast<std::uint8_t>(sign | nan_code);
  };
  if (std::isinf(a)) return overflow();
  const int min_exponent = 1 - f.exponent_bias;  // of the smallest normal, 2^min_exponent
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
  const int quantum_exponent = (a == 0.0 || e - 1 < min_exponent ? min_exponent : e - 1) - f.mantissa_bits;
  // a / 2^q and its rounding are exact in double (a has at most 53 significant bits; q is a power of two).
  const double units = std::nearbyint(std::ldexp(a, -quantum_exponent));  // FE_TONEAREST: ties to even
  const double rounded = std::ldexp(units, quantum_exponent);
  if (rounded > f.max_finite) return overflow();
  if (rounded == 0.0) return f.fnuz ? 0x00 : sign;
  std::uint8_t code;
  if (rounded < std::ldexp(1.0, min_exponent)) {  // subnormal: units < 2^mantissa_bits
    code = static_cast<std::uint8_t>(units);
  } else {
    int re = 0;
    std::frexp(rounded, &re);
    const int exponent = re - 1;
    const double mantissa = std::ldexp(rounded, f.mantissa_bits - exponent) - std::ldexp(1.0, f.mantissa_bits);
    code = static_cast<std::uint8_t>(((exponent + f.exponent_bias) << f.mantissa_bits) | static_cast<int>(mantissa));
  }
  return static_cast<std::uint8_t>(sign | code);
}

// ---- int4 / uint4 ----

inline int int4_min(DType dtype) { return dtype == DType::kInt4 ? -8 : 0; }
inline int int4_max(DType dtype) { return dtype == DType::kInt4 ? 7 : 15; }

// `value` as an int4/uint4 value (its unpacked byte): saturated to the range, rounded to nearest even; NaN -> 0.
inline int int4_from_double(double value, DType dtype) {
  if (std::isnan(value)) return 0;
  const double lo = int4_min(dtype), hi = int4_max(dtype);
  return static_cast<int>(std::nearbyint(value < lo ? lo : (value > hi ? hi : value)));
}

// The packed bytes of `count` 4-bit values: (count + 1) / 2.
inline std::size_t int4_packed_bytes(std::size_t count) { return (count + 1) / 2; }

// Unpacks `count` values from `packed` (two per byte, the first in the low nibble) into one byte each, int4
// sign-extended.
inline void unpack_int4(const std::uint8_t* packed, std::size_t count, DType dtype, std::uint8_t* out) {
  const bool is_signed = dtype == DType::kInt4;
  for (std::size_t i = 0; i < count; ++i) {
    unsigned nibble = (packed[i / 2] >> (i % 2 == 0 ? 0 : 4)) & 0xFu;
    if (is_signed && nibble >= 8) nibble |= 0xF0u;  // sign-extend into the byte
    out[i] = static_cast<std::uint8_t>(nibble);
  }
}

// Packs `count` unpacked values (one byte each) two per byte, the first in the low nibble; an odd count leaves
// the last high nibble 0.
inline void pack_int4(const std::uint8_t* values, std::size_t count, std::uint8_t* packed) {
  for (std::size_t i = 0; i < int4_packed_bytes(count); ++i) packed[i] = 0;
  for (std::size_t i = 0; i < count; ++i) {
    packed[i / 2] = static_cast<std::uint8_t>(packed[i / 2] | ((values[i] & 0xFu) << (i % 2 == 0 ? 0 : 4)));
  }
}

// Whether every one of `count` unpacked bytes lies in the range of `dtype` (int4 read as int8); `bad` receives
// the first index that does not.
inline bool int4_in_range(const std::uint8_t* values, std::size_t count, DType dtype, std::size_t* bad = nullptr) {
  for (std::size_t i = 0; i < count; ++i) {
    const int v = dtype == DType::kInt4 ? static_cast<int>(static_cast<std::int8_t>(values[i])) : values[i];
    if (v < int4_min(dtype) || v > int4_max(dtype)) {
      if (bad != nullptr) *bad = i;
      return false;
    }
  }
  return true;
}

}  // namespace xpuruntime::detail
