// quantize_linear, dequantize_linear and dynamic_quantize_linear on the GPU (Note [Quantize registry ops] in
// core/quantize_ops.h): vectorized grid-stride kernels (16-byte loads of the float side, one byte per element on the
// quantized side), with the arithmetic of the cpu kernels step for step, so that both give the same bits.
//
// Note [Float8 on the GPU]
// cuda_fp8.h converts float to float8e4m3fn and float8e5m2 (`__nv_cvt_float_to_fp8`) with ONNX's rounding (to
// nearest even, once) and saturation: __NV_SATFINITE sends values past the largest finite one and infinities to
// +-max (ONNX's saturate=1; on sm_89+ one cvt.rn.satfinite instruction), __NV_NOSAT sends them to Inf (e5m2) or NaN
// (e4m3fn), as ONNX's saturate=0 does; its decoding (`__nv_cvt_fp8_to_halfraw`) is exact. What it does not do as
// ONNX says is kept out of its way: a NaN (cuda_fp8.h drops its sign; ONNX keeps it in e4m3fn and e5m2) is encoded
// here, and the float8e4m3fnuz and float8e5m2fnuz formats, which CUDA does not have, use this file's own conversion,
// a transcription of detail::float8_from_double (xpuruntime/low_bit.h) into device code; so does a sum with a
// nonzero zero point, which the cpu kernel forms in double and rounds once (rounding it to float first could round
// twice).
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/quant_epilogue.cuh"
#include "backends/cuda_raw/quantize.h"

namespace xpuruntime::cuda_raw {
namespace {

using detail::as_stream;
using detail::FastDivider;
using detail::grid_for;
using detail::is_aligned;
using detail::kThreads;
using detail::Vec;

// The quantized side's encodings: integers (int8 and int4 as signed bytes, uint8 and uint4 as unsigned ones, int32)
// and the float8 formats.
enum class Code : std::uint8_t { kSigned, kUnsigned, kInt32, kE4M3FN, kE4M3FNUZ, kE5M2, kE5M2FNUZ };

constexpr bool is_float8(Code c) { return c >= Code::kE4M3FN; }
constexpr bool in_cuda_fp8(Code c) { return c == Code::kE4M3FN || c == Code::kE5M2; }

Code code_of(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kInt4: return Code::kSigned;
    case DType::kUInt8:
    case DType::kUInt4: return Code::kUnsigned;
    case DType::kInt32: return Code::kInt32;
    case DType::kFloat8E4M3FN: return Code::kE4M3FN;
    case DType::kFloat8E4M3FNUZ: return Code::kE4M3FNUZ;
    case DType::kFloat8E5M2: return Code::kE5M2;
    case DType::kFloat8E5M2FNUZ: return Code::kE5M2FNUZ;
    default:
      throw UnsupportedOperationError(::xpuruntime::detail::str_cat(
          "cuda_raw quantize_linear/dequantize_linear take int8, uint8, int4, uint4, int32 (dequantize) and the float8 "
          "formats on the quantized side, got ", dtype_name(dtype), "; use the cpu kernel"));
  }
}

// ---- float8 (Note [Float8 on the GPU]) ----

// The layout of a float8 format, as detail::Float8Format (xpuruntime/low_bit.h).
template <Code C>
struct Float8 {
  static constexpr bool kE4M3 = C == Code::kE4M3FN || C == Code::kE4M3FNUZ;
  static constexpr bool kFnuz = C == Code::kE4M3FNUZ || C == Code::kE5M2FNUZ;
  static constexpr int kMantissaBits = kE4M3 ? 3 : 2;
  static constexpr int kBias = (kE4M3 ? 7 : 15) + (kFnuz ? 1 : 0);
  static constexpr bool kHasInfinity = C == Code::kE5M2;
  static constexpr double kMaxFinite = C == Code::kE4M3FN ? 448.0 : (C == Code::kE4M3FNUZ ? 240.0 : 57344.0);
  static constexpr std::uint8_t kMaxCode = C == Code::kE5M2 ? 0x7B : (C == Code::kE4M3FN ? 0x7E : 0x7F);
};

// cuda_fp8.h's name of format C (e4m3fn or e5m2).
template <Code C>
constexpr __nv_fp8_interpretation_t interpretation() {
  return C == Code::kE4M3FN ? __NV_E4M3 : __NV_E5M2;
}

// The NaN of format C: 0x80 for the fnuz formats, S.1111111 otherwise (the sign kept, as ONNX does).
template <Code C>
__device__ __forceinline__ std::uint8_t float8_nan(bool negative) {
  if constexpr (Float8<C>::kFnuz) return 0x80;
  return negative ? 0xFF : 0x7F;
}

// `value` (not NaN) in format C: round to nearest even once, then ONNX's rules for what does not fit. The device
// transcription of detail::float8_from_double (frexp, ldexp and rint are exact in double).
template <Code C>
__device__ std::uint8_t float8_from_double(double value, bool saturate) {
  using F = Float8<C>;
  const std::uint8_t sign = signbit(value) ? 0x80 : 0x00;
  const double a = fabs(value);
  const auto overflow = [&]() -> std::uint8_t {
    if (saturate) return static_cast<std::uint8_t>(sign | F::kMaxCode);
    if (F::kHasInfinity) return static_cast<std::uint8_t>(sign | 0x7C);
    return float8_nan<C>(sign != 0);
  };
  if (isinf(a)) return overflow();
  constexpr int kMinExponent = 1 - F::kBias;  // of the smallest normal, 2^kMinExponent
  int e = 0;
  frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int quantum_exponent = (a == 0.0 || e - 1 < kMinExponent ? kMinExponent : e - 1) - F::kMantissaBits;
  const double units = rint(ldexp(a, -quantum_exponent));  // ties to even
  const double rounded = ldexp(units, quantum_exponent);
  if (rounded > F::kMaxFinite) return overflow();
  if (rounded == 0.0) return F::kFnuz ? 0x00 : sign;
  std::uint8_t code;
  if (rounded < ldexp(1.0, kMinExponent)) {  // subnormal: units < 2^mantissa_bits
    code = static_cast<std::uint8_t>(units);
  } else {
    int re = 0;
    frexp(rounded, &re);
    const int exponent = re - 1;
    const double mantissa = ldexp(rounded, F::kMantissaBits - exponent) - ldexp(1.0, F::kMantissaBits);
    code = static_cast<std::uint8_t>(((exponent + F::kBias) << F::kMantissaBits) | static_cast<int>(mantissa));
  }
  return static_cast<std::uint8_t>(sign | code);
}

// `value` (not NaN) in format C: cuda_fp8.h for e4m3fn and e5m2, this file's conversion for the fnuz formats.
template <Code C>
__device__ __forceinline__ std::uint8_t float8_from_float(float value, bool saturate) {
  if constexpr (in_cuda_fp8(C)) {
    return __nv_cvt_float_to_fp8(value, saturate ? __NV_SATFINITE : __NV_NOSAT, interpretation<C>());
  } else {
    return float8_from_double<C>(static_cast<double>(value), saturate);
  }
}

// 2^k as a float, for k in [-126, 127] (exact).
__device__ __forceinline__ float power_of_two(int k) { return __int_as_float((k + 127) << 23); }

// The value of float8 bits of format C (exact; NaN for the NaN codes).
template <Code C>
__device__ __forceinline__ float float8_to_float(std::uint8_t bits) {
  using F = Float8<C>;
  if constexpr (in_cuda_fp8(C)) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, interpretation<C>())));
  } else {
    if (bits == 0x80) return std::numeric_limits<float>::quiet_NaN();
    constexpr unsigned kExponentMask = F::kMantissaBits == 3 ? 0xFu : 0x1Fu;
    const unsigned exponent = (bits >> F::kMantissaBits) & kExponentMask;
    const unsigned mantissa = bits & ((1u << F::kMantissaBits) - 1u);
    const unsigned significand = exponent == 0 ? mantissa : mantissa | (1u << F::kMantissaBits);
    const int scale = (exponent == 0 ? 1 : static_cast<int>(exponent)) - F::kBias - F::kMantissaBits;
    const float value = static_cast<float>(significand) * power_of_two(scale);
    return (bits & 0x80u) != 0 ? -value : value;
  }
}

// ---- the float side ----

// The sign bit of a float32, float16 or bfloat16 as stored (a NaN's included: converting a NaN may drop it).
__device__ __forceinline__ bool stored_negative(float v) { return (__float_as_uint(v) >> 31) != 0; }
__device__ __forceinline__ bool stored_negative(__half v) { return (__half_as_ushort(v) >> 15) != 0; }
__device__ __forceinline__ bool stored_negative(__nv_bfloat16 v) { return (__bfloat16_as_ushort(v) >> 15) != 0; }

// Element i of a scale of `dtype`: its value and its stored sign.
struct Real {
  float value;
  bool negative;
};
__device__ __forceinline__ Real load_real(const void* p, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::kFloat16: {
      const __half v = static_cast<const __half*>(p)[i];
      return {__half2float(v), stored_negative(v)};
    }
    case DType::kBFloat16: {
      const __nv_bfloat16 v = static_cast<const __nv_bfloat16*>(p)[i];
      return {__bfloat162float(v), stored_negative(v)};
    }
    default: {
      const float v = static_cast<const float*>(p)[i];
      return {v, stored_negative(v)};
    }
  }
}

// ---- parameters ----

// What every element of a launch reads besides x: the scale and zero point, their layout, the integer range.
struct Params {
  const void* scale = nullptr;
  DType scale_dtype = DType::kFloat32;
  const void* zero_point = nullptr;  // null: zeros
  bool saturate = true;
  float lo = 0.0f, hi = 255.0f;  // the integer range (quantize_linear)
  bool per_axis = false;
  bool fast = false;  // every element index fits int32: the divisions below are FastDivider's
  FastDivider inner_divider, axis_divider;
  std::int64_t inner = 1, axis_dim = 1;

  // The scale of element i: (i / inner) % axis_dim per axis (ParamLayout), else 0.
  __device__ __forceinline__ std::int64_t index(std::int64_t i) const {
    if (!per_axis) return 0;
    if (fast) {
      const std::int32_t q = inner_divider.div(static_cast<std::int32_t>(i));
      return q - axis_divider.div(q) * axis_divider.value();
    }
    return (i / inner) % axis_dim;
  }
};

Params params_of(const QuantizeArgs& args, DType quantized) {
  Params p;
  p.scale = args.scale;
  p.scale_dtype = args.scale_dtype;
  p.zero_point = args.zero_point;
  p.saturate = args.saturate;
  if (!is_float8_dtype(quantized) && quantized != DType::kInt32) {
    int lo = 0, hi = 0;
    quantize_ops::integer_range(quantized, &lo, &hi);
    p.lo = static_cast<float>(lo);
    p.hi = static_cast<float>(hi);
  }
  p.per_axis = args.layout.per_axis;
  p.inner = std::max<std::int64_t>(args.layout.inner, 1);
  p.axis_dim = std::max<std::int64_t>(args.layout.axis_dim, 1);
  p.fast = args.n <= std::numeric_limits<std::int32_t>::max() - detail::kMaxBlocks * kThreads;
  if (p.fast && p.per_axis) {
    p.inner_divider = FastDivider(p.inner);
    p.axis_divider = FastDivider(p.axis_dim);
  }
  return p;
}

// ---- quantize_linear ----

// Element i of quantize_linear's output from x (its value and stored sign).
template <Code C>
__device__ __forceinline__ std::uint8_t quantize_one(float x, bool x_negative, const Params& p, std::int64_t i) {
  const std::int64_t k = p.index(i);
  const Real s = load_real(p.scale, p.scale_dtype, k);
  // A NaN operand is the quotient, with its sign, as the cpu kernel's division gives it (Note [Quantize registry
  // ops]); so is a NaN scale.
  float scaled = x;
  bool nan_negative = x_negative;
  if (!isnan(x)) {
    scaled = isnan(s.value) ? s.value : __fdiv_rn(x, s.value);
    nan_negative = isnan(s.value) && s.negative;
  }
  if constexpr (!is_float8(C)) {
    float zero_point = 0.0f;
    if (p.zero_point != nullptr) {
      zero_point = C == Code::kSigned ? static_cast<float>(static_cast<const std::int8_t*>(p.zero_point)[k])
                                      : static_cast<float>(static_cast<const std::uint8_t*>(p.zero_point)[k]);
    }
    // Past the range the float sum rounds, but it saturates all the same.
    const float q = isnan(scaled) ? zero_point : __fadd_rn(rintf(scaled), zero_point);
    return static_cast<std::uint8_t>(static_cast<int>(fminf(p.hi, fmaxf(p.lo, q))));
  } else {
    if (isnan(scaled)) return float8_nan<C>(nan_negative);
    if (p.zero_point == nullptr) {
      // scaled + 0: a -0 quotient gives +0, as the cpu kernel's sum with its zero point.
      return float8_from_float<C>(__fadd_rn(scaled, 0.0f), p.saturate);
    }
    const float zero_point = float8_to_float<C>(static_cast<const std::uint8_t*>(p.zero_point)[k]);
    if (isnan(zero_point)) return float8_nan<C>(false);  // the cpu kernel decodes a NaN zero point as +NaN
    return float8_from_double<C>(static_cast<double>(scaled) + static_cast<double>(zero_point), p.saturate);
  }
}

// y[i] = level(x[i], i) for every element: kPack elements per thread and step (16-byte loads of x) when `vectorized`,
// then the tail.
template <typename T, typename Level>
__device__ __forceinline__ void quantize_elements(const T* x, std::uint8_t* y, std::int64_t n, bool vectorized,
                                                  const Level& level) {
  constexpr int kPack = detail::kVec16<T>;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vectorized) {
    const std::int64_t packs = n / kPack;
    for (std::int64_t v = first; v < packs; v += stride) {
      const Vec<T, kPack> in = reinterpret_cast<const Vec<T, kPack>*>(x)[v];
      Vec<std::uint8_t, kPack> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = level(in.v[k], v * kPack + k);
      reinterpret_cast<Vec<std::uint8_t, kPack>*>(y)[v] = out;
    }
    tail = packs * kPack;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) y[i] = level(x[i], i);
}

// y[i] = quantize(x[i]).
template <typename T, Code C>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const T* x, std::uint8_t* y, std::int64_t n, bool vectorized, Params p) {
  quantize_elements(x, y, n, vectorized, [&](T v, std::int64_t i) {
    return quantize_one<C>(detail::to_float(v), stored_negative(v), p, i);
  });
}

// Note [Per-tensor quantization without a division]
// quantize_one divides every element by its scale with __fdiv_rn, whose slow path also runs for a zero dividend, and
// reads the scale and the zero point per element: quantizing a float16 [2048, 768] activation took 5.3 us on an H200
// (2026-12-02, BERT-base batch 16: 96 launches a run, 0.5 ms of 3.3 ms), about five times its memory floor. With one
// scale and one zero point for the whole tensor (the activations' QuantizeLinear in every QDQ model) the integer
// levels come from one Requantizer per thread (Note [Requantization without a division] in quant_epilogue.cuh), whose
// levels are quantize_one's: NaN gives the zero point, the rest saturate to [lo, hi]. A scale that is not a positive
// normal float (zero, negative, NaN, subnormal) or whose reciprocal is not keeps quantize_one.
template <typename T, Code C>
__global__ void __launch_bounds__(kThreads)
    quantize_per_tensor_kernel(const T* x, std::uint8_t* y, std::int64_t n, bool vectorized, Params p) {
  const float zero_point =
      p.zero_point == nullptr ? 0.0f
      : C == Code::kSigned    ? static_cast<float>(static_cast<const std::int8_t*>(p.zero_point)[0])
                              : static_cast<float>(static_cast<const std::uint8_t*>(p.zero_point)[0]);
  const detail::Requantizer r =
      detail::requantizer_range(load_real(p.scale, p.scale_dtype, 0).value, zero_point, p.lo, p.hi);
  quantize_elements(x, y, n, vectorized, [&](T v, std::int64_t i) -> std::uint8_t {
    if (!r.fast) return quantize_one<C>(detail::to_float(v), stored_negative(v), p, i);
    return static_cast<std::uint8_t>(detail::requantized_int(r, detail::to_float(v)));
  });
}

// Note [Per-tensor float8 quantization without a division]
// The float8 QuantizeLinear of an activation (one scale, no zero point: what xrt.quantize(precision="fp8") writes
// before every float8 GEMM) took quantize_one's path too: BERT-base at batch 16 spent 386 us in its 48 launches, 8 us
// for a [2048, 768] float16 tensor (H200, 2026-12-03), against about 1.2 us of memory traffic. The quotient x / s
// is formed without a division: q = x * r with r the correctly rounded 1 / s, then one correction with the exact
// remainder of two fused multiply-adds, q' = q + (x - q s) r (Markstein). In float32's normal range q' is the
// correctly rounded quotient, __fdiv_rn's: on the CPU the two agreed on every float16 value over 3,000 scales and
// on 2e8 random float32 pairs (quotients 2^-100 to 2^100). Where the product q is not a normal float (a quotient
// near or past float32's range, where the rounding could differ, and infinities and NaN), and for a scale that is not
// a positive normal float with a normal reciprocal, the element keeps quantize_one. A zero x gives q' = q = +-0,
// which the + 0 below makes +0, as quantize_one's. A zero point (a float8 tensor: the producers write one, 0) is read
// once per thread: +-0 adds nothing but that sign (x / s + 0 in double is the float quotient + 0); any other value
// keeps quantize_one for every element.
template <typename T, Code C>
__global__ void __launch_bounds__(kThreads)
    quantize_per_tensor_float8_kernel(const T* x, std::uint8_t* y, std::int64_t n, bool vectorized, Params p) {
  const float s = load_real(p.scale, p.scale_dtype, 0).value;
  const float r = __frcp_rn(s);
  const bool zero_point_zero =
      p.zero_point == nullptr || float8_to_float<C>(static_cast<const std::uint8_t*>(p.zero_point)[0]) == 0.0f;
  const bool fast = zero_point_zero && s > 0.0f && isfinite(s) && s >= FLT_MIN && r >= FLT_MIN && isfinite(r);
  quantize_elements(x, y, n, vectorized, [&](T v, std::int64_t i) -> std::uint8_t {
    const float f = detail::to_float(v);
    const float q = __fmul_rn(f, r);
    if (!fast || !(f == 0.0f || (fabsf(q) >= FLT_MIN && fabsf(q) <= FLT_MAX))) {
      return quantize_one<C>(f, stored_negative(v), p, i);
    }
    const float remainder = __fmaf_rn(-q, s, f);
    const float quotient = remainder == 0.0f ? q : __fmaf_rn(remainder, r, q);
    return float8_from_float<C>(__fadd_rn(quotient, 0.0f), p.saturate);
  });
}

template <typename T, Code C>
void launch_quantize(const QuantizeArgs& args, const Params& p, void* stream) {
  constexpr int kPack = detail::kVec16<T>;
  const bool vectorized = is_aligned(args.x, 16) && is_aligned(args.y, kPack);
  const std::int64_t work = vectorized ? std::max<std::int64_t>(args.n / kPack, args.n % kPack) : args.n;
  if constexpr (C == Code::kSigned || C == Code::kUnsigned) {
    if (!p.per_axis) {  // Note [Per-tensor quantization without a division]
      quantize_per_tensor_kernel<T, C><<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(
          static_cast<const T*>(args.x), static_cast<std::uint8_t*>(args.y), args.n, vectorized, p);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
      return;
    }
  }
  if constexpr (is_float8(C)) {
    if (!p.per_axis) {  // Note [Per-tensor float8 quantization without a division]
      quantize_per_tensor_float8_kernel<T, C><<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(
          static_cast<const T*>(args.x), static_cast<std::uint8_t*>(args.y), args.n, vectorized, p);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
      return;
    }
  }
  quantize_kernel<T, C><<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(
      static_cast<const T*>(args.x), static_cast<std::uint8_t*>(args.y), args.n, vectorized, p);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- dequantize_linear ----

// The storage type of each encoding.
template <Code C>
using Stored = std::conditional_t<C == Code::kSigned, std::int8_t,
                                  std::conditional_t<C == Code::kInt32, std::int32_t, std::uint8_t>>;

// float32(x - zero_point) * scale: the difference exact (integers in int32/int64, float8 in double), rounded once.
template <Code C>
__device__ __forceinline__ float dequantize_one(Stored<C> x, const Params& p, std::int64_t i) {
  const std::int64_t k = p.index(i);
  const float s = load_real(p.scale, p.scale_dtype, k).value;
  float centered;
  if constexpr (is_float8(C)) {
    centered = float8_to_float<C>(x);
    if (p.zero_point != nullptr) {
      const float zero_point = float8_to_float<C>(static_cast<const std::uint8_t*>(p.zero_point)[k]);
      centered = __double2float_rn(static_cast<double>(centered) - static_cast<double>(zero_point));
    }
  } else if constexpr (C == Code::kInt32) {
    const std::int64_t zero_point = p.zero_point ? static_cast<const std::int32_t*>(p.zero_point)[k] : 0;
    centered = __ll2float_rn(static_cast<long long>(x) - zero_point);
  } else {
    const int zero_point = p.zero_point ? static_cast<const Stored<C>*>(p.zero_point)[k] : 0;
    centered = static_cast<float>(static_cast<int>(x) - zero_point);  // exact: |x - zero_point| < 2^9
  }
  return __fmul_rn(centered, s);
}

template <typename T, Code C, int kPack>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const Stored<C>* x, T* y, std::int64_t n, bool vectorized, Params p) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vectorized) {
    const std::int64_t packs = n / kPack;
    for (std::int64_t v = first; v < packs; v += stride) {
      const Vec<Stored<C>, kPack> in = reinterpret_cast<const Vec<Stored<C>, kPack>*>(x)[v];
      Vec<T, kPack> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        out.v[k] = detail::from_float<T>(dequantize_one<C>(in.v[k], p, v * kPack + k));
      }
      reinterpret_cast<Vec<T, kPack>*>(y)[v] = out;
    }
    tail = packs * kPack;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) y[i] = detail::from_float<T>(dequantize_one<C>(x[i], p, i));
}

template <typename T, Code C>
void launch_dequantize(const QuantizeArgs& args, const Params& p, void* stream) {
  // 16-byte loads or stores, whichever side is wider.
  constexpr int kPack = std::min(detail::kVec16<T>, detail::kVec16<Stored<C>>);
  const bool vectorized = is_aligned(args.x, kPack * sizeof(Stored<C>)) && is_aligned(args.y, kPack * sizeof(T));
  const std::int64_t work = vectorized ? std::max<std::int64_t>(args.n / kPack, args.n % kPack) : args.n;
  dequantize_kernel<T, C, kPack><<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(
      static_cast<const Stored<C>*>(args.x), static_cast<T*>(args.y), args.n, vectorized, p);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// Calls body(std::integral_constant<Code, C>{}) for the encoding `code`.
template <typename Body>
void dispatch_code(Code code, Body&& body) {
  switch (code) {
    case Code::kSigned: body(std::integral_constant<Code, Code::kSigned>{}); return;
    case Code::kUnsigned: body(std::integral_constant<Code, Code::kUnsigned>{}); return;
    case Code::kInt32: body(std::integral_constant<Code, Code::kInt32>{}); return;
    case Code::kE4M3FN: body(std::integral_constant<Code, Code::kE4M3FN>{}); return;
    case Code::kE4M3FNUZ: body(std::integral_constant<Code, Code::kE4M3FNUZ>{}); return;
    case Code::kE5M2: body(std::integral_constant<Code, Code::kE5M2>{}); return;
    case Code::kE5M2FNUZ: body(std::integral_constant<Code, Code::kE5M2FNUZ>{}); return;
  }
}

// ---- dynamic_quantize_linear ----

// Per-block ranges: at most this many blocks, each thread taking at least kDynamicPerThread elements.
constexpr std::int64_t kDynamicBlocks = 1024;
constexpr std::int64_t kDynamicPerThread = 16;

std::int64_t dynamic_blocks(std::int64_t n) {
  return std::clamp<std::int64_t>((n + kThreads * kDynamicPerThread - 1) / (kThreads * kDynamicPerThread), 1,
                                  kDynamicBlocks);
}

struct MinOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return detail::min_nan(a, b); }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return detail::max_nan(a, b); }
};

// partials[b] = min(0, x in block b's share), partials[blocks + b] = max(0, ...); NaN wins (then y_scale is NaN).
__global__ void __launch_bounds__(kThreads)
    range_kernel(const float* x, std::int64_t n, bool vectorized, float* partials) {
  __shared__ float smem[kThreads / 32];
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float lo = 0.0f, hi = 0.0f;
  std::int64_t tail = 0;
  if (vectorized) {
    const std::int64_t packs = n / 4;
    for (std::int64_t v = first; v < packs; v += stride) {
      const float4 in = reinterpret_cast<const float4*>(x)[v];
      lo = detail::min_nan(detail::min_nan(lo, in.x), detail::min_nan(in.y, detail::min_nan(in.z, in.w)));
      hi = detail::max_nan(detail::max_nan(hi, in.x), detail::max_nan(in.y, detail::max_nan(in.z, in.w)));
    }
    tail = packs * 4;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) {
    lo = detail::min_nan(lo, x[i]);
    hi = detail::max_nan(hi, x[i]);
  }
  lo = detail::group_reduce<kThreads>(lo, MinOp{}, smem);
  hi = detail::group_reduce<kThreads>(hi, MaxOp{}, smem);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = lo;
    partials[gridDim.x + blockIdx.x] = hi;
  }
}

// Every block combines the `blocks` ranges (the same bits in each), block 0 writes y_scale and y_zero_point, and
// every block quantizes its share of x.
__global__ void __launch_bounds__(kThreads)
    dynamic_quantize_kernel(const float* x, std::int64_t n, bool vectorized, const float* partials, int blocks,
                            std::uint8_t* y, float* y_scale, std::uint8_t* y_zero_point) {
  __shared__ float smem[kThreads / 32];
  float lo = 0.0f, hi = 0.0f;
  for (int b = static_cast<int>(threadIdx.x); b < blocks; b += kThreads) {
    lo = detail::min_nan(lo, partials[b]);
    hi = detail::max_nan(hi, partials[blocks + b]);
  }
  lo = detail::group_reduce<kThreads>(lo, MinOp{}, smem);
  hi = detail::group_reduce<kThreads>(hi, MaxOp{}, smem);
  // + 0: a range of zeros of both signs gives +0, as the cpu kernel (whose min and max keep the first of equal values).
  const float scale = __fadd_rn(__fdiv_rn(__fsub_rn(hi, lo), 255.0f), 0.0f);
  const bool positive = scale > 0.0f;  // false for a NaN scale
  // fmaxf returns 0 for a NaN quotient (an infinite range): the zero point is then 0.
  const float zero_point = positive ? fminf(255.0f, fmaxf(0.0f, rintf(__fdiv_rn(-lo, scale)))) : 0.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *y_scale = scale;
    *y_zero_point = static_cast<std::uint8_t>(zero_point);
  }
  const auto quantize = [&](float v) -> std::uint8_t {
    if (!positive) return 0;
    const float scaled = __fdiv_rn(v, scale);
    const float q = isnan(scaled) ? zero_point : __fadd_rn(rintf(scaled), zero_point);
    return static_cast<std::uint8_t>(fminf(255.0f, fmaxf(0.0f, q)));
  };
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vectorized) {
    const std::int64_t packs = n / 4;
    for (std::int64_t v = first; v < packs; v += stride) {
      const float4 in = reinterpret_cast<const float4*>(x)[v];
      reinterpret_cast<uchar4*>(y)[v] = make_uchar4(quantize(in.x), quantize(in.y), quantize(in.z), quantize(in.w));
    }
    tail = packs * 4;
  }
  for (std::int64_t i = tail + first; i < n; i += stride) y[i] = quantize(x[i]);
}

}  // namespace

void quantize_linear(const QuantizeArgs& args, void* stream) {
  const Code code = code_of(args.y_dtype);
  XPURT_CHECK_TYPE(code != Code::kInt32, "cuda_raw quantize_linear: int32 is not a quantize_linear output");
  if (args.n <= 0) return;
  const Params p = params_of(args, args.y_dtype);
  detail::dispatch_float(args.x_dtype, "quantize_linear", [&](auto tag) {
    using T = decltype(tag);
    dispatch_code(code, [&](auto c) {
      constexpr Code kCode = decltype(c)::value;
      if constexpr (kCode != Code::kInt32) launch_quantize<T, kCode>(args, p, stream);
    });
  });
}

void dequantize_linear(const QuantizeArgs& args, void* stream) {
  const Code code = code_of(args.x_dtype);
  if (args.n <= 0) return;
  const Params p = params_of(args, args.x_dtype);
  detail::dispatch_float(args.y_dtype, "dequantize_linear", [&](auto tag) {
    using T = decltype(tag);
    dispatch_code(code, [&](auto c) { launch_dequantize<T, decltype(c)::value>(args, p, stream); });
  });
}

std::size_t dynamic_quantize_workspace_bytes(std::int64_t n) {
  return static_cast<std::size_t>(2 * dynamic_blocks(n)) * sizeof(float);
}

void dynamic_quantize_linear(const float* x, std::int64_t n, std::uint8_t* y, float* y_scale,
                             std::uint8_t* y_zero_point, void* workspace, void* stream) {
  const auto blocks = static_cast<int>(dynamic_blocks(n));
  const bool vectorized = is_aligned(x, 16) && is_aligned(y, 4);
  auto* partials = static_cast<float*>(workspace);
  range_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(stream)>>>(x, n, vectorized, partials);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  const std::int64_t work = vectorized ? std::max<std::int64_t>(n / 4, n % 4) : n;
  dynamic_quantize_kernel<<<grid_for(work, kThreads), kThreads, 0, as_stream(stream)>>>(
      x, n, vectorized, partials, blocks, y, y_scale, y_zero_point);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace xpuruntime::cuda_raw
