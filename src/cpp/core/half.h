// Host-side conversions between float and the 16-bit float formats (IEEE half, bfloat16), bit-exact with
// CUDA's round-to-nearest-even conversions. Internal header (no CUDA dependency).
#pragma once

#include <cstdint>
#include <cstring>

namespace xpuruntime::detail {

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline std::uint16_t float_to_half(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) {  // inf or nan
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs_bits > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs_bits >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs_bits < 0x38800000u) {  // subnormal or zero in half
    if (abs_bits < 0x33000000u) return sign;  // below half of the smallest subnormal
    const std::uint32_t exponent = abs_bits >> 23;
    const std::uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14 + (112 - exponent) ... aligns to 2^-24 units
    std::uint32_t result = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }
  std::uint32_t result = ((abs_bits - 0x38000000u) >> 13);
  const std::uint32_t remainder = abs_bits & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;
  return static_cast<std::uint16_t>(sign | result);
}

inline float bfloat16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline std::uint16_t float_to_bfloat16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet nan
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

}  // namespace xpuruntime::detail
