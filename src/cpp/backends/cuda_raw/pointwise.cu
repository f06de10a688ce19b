// The ONNX pointwise ops beyond the core set: clip, hard_sigmoid, hard_swish, leaky_relu, elu, softplus, sin,
// cos, floor, ceil, round, sign, the other trigonometric and hyperbolic functions, softsign, selu, celu,
// thresholded_relu, mish (float in, float out, fp32 compute: Note [fp32 compute]), and is_nan / is_inf
// (float in, float64 included, bool out); prelu and mod with broadcasting.
#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

template <PointwiseOp kOp>
struct PointwiseFn {
  float alpha = 0.0f;
  float beta = 0.0f;
  __device__ __forceinline__ float operator()(float x) const {
    if constexpr (kOp == PointwiseOp::kClip) {
      float v = x < alpha ? alpha : x;  // comparisons keep NaN (fminf/fmaxf would drop it)
      return v > beta ? beta : v;
    } else if constexpr (kOp == PointwiseOp::kHardSigmoid) {
      return fminf(1.0f, fmaxf(0.0f, alpha * x + beta)) + (isnan(x) ? x : 0.0f);
    } else if constexpr (kOp == PointwiseOp::kHardSwish) {
      return x * fminf(1.0f, fmaxf(0.0f, x * (1.0f / 6.0f) + 0.5f));  // NaN * anything = NaN
    } else if constexpr (kOp == PointwiseOp::kLeakyRelu) {
      return x >= 0.0f ? x : alpha * x;
    } else if constexpr (kOp == PointwiseOp::kElu) {
      return x >= 0.0f ? x : alpha * expm1f(x);
    } else if constexpr (kOp == PointwiseOp::kSoftplus) {
      return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))) + (isnan(x) ? x : 0.0f);
    } else if constexpr (kOp == PointwiseOp::kSin) {
      return sinf(x);
    } else if constexpr (kOp == PointwiseOp::kCos) {
      return cosf(x);
    } else if constexpr (kOp == PointwiseOp::kFloor) {
      return floorf(x);
    } else if constexpr (kOp == PointwiseOp::kCeil) {
      return ceilf(x);
    } else if constexpr (kOp == PointwiseOp::kRound) {
      return rintf(x);  // the current rounding mode: to nearest, ties to even
    } else if constexpr (kOp == PointwiseOp::kSign) {
      return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);  // 0, -0 and NaN stay
    } else if constexpr (kOp == PointwiseOp::kTan) {
      return tanf(x);
    } else if constexpr (kOp == PointwiseOp::kAsin) {
      return asinf(x);
    } else if constexpr (kOp == PointwiseOp::kAcos) {
      return acosf(x);
    } else if constexpr (kOp == PointwiseOp::kAtan) {
      return atanf(x);
    } else if constexpr (kOp == PointwiseOp::kSinh) {
      return sinhf(x);
    } else if constexpr (kOp == PointwiseOp::kCosh) {
      return coshf(x);
    } else if constexpr (kOp == PointwiseOp::kAsinh) {
      return asinhf(x);
    } else if constexpr (kOp == PointwiseOp::kAcosh) {
      return acoshf(x);
    } else if constexpr (kOp == PointwiseOp::kAtanh) {
      return atanhf(x);
    } else if constexpr (kOp == PointwiseOp::kSoftsign) {
      return x / (1.0f + fabsf(x));
    } else if constexpr (kOp == PointwiseOp::kSelu) {
      return beta * (x > 0.0f ? x : alpha * expm1f(x));
    } else if constexpr (kOp == PointwiseOp::kCelu) {
      return fmaxf(0.0f, x) + fminf(0.0f, alpha * expm1f(x / alpha)) + (isnan(x) ? x : 0.0f);
    } else if constexpr (kOp == PointwiseOp::kThresholdedRelu) {
      return x > alpha ? x : 0.0f;
    } else {
      static_assert(kOp == PointwiseOp::kMish, "every PointwiseOp has a case");
      return x * tanhf(fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))));
    }
  }
};

__device__ __forceinline__ double widen(double v) { return v; }
template <typename T>
__device__ __forceinline__ float widen(T v) {
  return to_float(v);
}

template <typename T>
__global__ void is_nan_or_inf_kernel(const T* x, std::uint8_t* y, std::int64_t n, bool nan, bool positive,
                                     bool negative) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const auto v = widen(x[i]);
    const bool r = nan ? isnan(v) : ((positive && isinf(v) && v > 0) || (negative && isinf(v) && v < 0));
    y[i] = r ? 1 : 0;
  }
}

}  // namespace

void pointwise(PointwiseOp op, const void* x, void* y, DType dtype, std::int64_t n, float alpha, float beta,
               void* stream) {
  dispatch_float(dtype, "pointwise", [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
#define XPURT_POINTWISE_CASE(kind) \
  case PointwiseOp::kind: return launch_unary<T>(x, y, n, PointwiseFn<PointwiseOp::kind>{alpha, beta}, stream);
      XPURT_POINTWISE_CASE(kClip)
      XPURT_POINTWISE_CASE(kHardSigmoid)
      XPURT_POINTWISE_CASE(kHardSwish)
      XPURT_POINTWISE_CASE(kLeakyRelu)
      XPURT_POINTWISE_CASE(kElu)
      XPURT_POINTWISE_CASE(kSoftplus)
      XPURT_POINTWISE_CASE(kSin)
      XPURT_POINTWISE_CASE(kCos)
      XPURT_POINTWISE_CASE(kFloor)
      XPURT_POINTWISE_CASE(kCeil)
      XPURT_POINTWISE_CASE(kRound)
      XPURT_POINTWISE_CASE(kSign)
      XPURT_POINTWISE_CASE(kTan)
      XPURT_POINTWISE_CASE(kAsin)
      XPURT_POINTWISE_CASE(kAcos)
      XPURT_POINTWISE_CASE(kAtan)
      XPURT_POINTWISE_CASE(kSinh)
      XPURT_POINTWISE_CASE(kCosh)
      XPURT_POINTWISE_CASE(kAsinh)
      XPURT_POINTWISE_CASE(kAcosh)
      XPURT_POINTWISE_CASE(kAtanh)
      XPURT_POINTWISE_CASE(kSoftsign)
      XPURT_POINTWISE_CASE(kSelu)
      XPURT_POINTWISE_CASE(kCelu)
      XPURT_POINTWISE_CASE(kThresholdedRelu)
      XPURT_POINTWISE_CASE(kMish)
#undef XPURT_POINTWISE_CASE
    }
  });
}

void is_nan_or_inf(const void* x, void* y, DType dtype, std::int64_t n, bool nan, bool detect_positive,
                   bool detect_negative, void* stream) {
  if (n <= 0) return;
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    is_nan_or_inf_kernel<T><<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<std::uint8_t*>(y), n, nan, detect_positive, detect_negative);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  };
  if (dtype == DType::kFloat64) return launch(double{});
  dispatch_float(dtype, "is_nan / is_inf", launch);
}

namespace {

template <typename T>
__device__ __forceinline__ T integer_mod(BinaryExtOp op, T a, T b) {
  if (b == 0) return 0;  // the GPU cannot raise; docs/ops.md
  if (b == -1) return 0;  // also avoids MIN % -1 overflow
  const T r = a % b;  // C: the sign of a (fmod)
  if (op == BinaryExtOp::kMod && r != 0 && ((r < 0) != (b < 0))) return r + b;
  return r;
}

template <typename T, typename Index>
__global__ void binary_ext_kernel(BinaryExtOp op, const T* a, const T* b, T* y, Index n,
                                  OffsetCalculator<2, Index> calc) {
  const Index stride = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) + static_cast<Index>(threadIdx.x);
       i < n; i += stride) {
    Index offsets[2];
    calc.offsets(i, offsets);
    if constexpr (std::is_integral_v<T>) {
      y[i] = integer_mod(op, a[offsets[0]], b[offsets[1]]);
    } else {
      const float va = to_float(a[offsets[0]]), vb = to_float(b[offsets[1]]);
      float r;
      if (op == BinaryExtOp::kPrelu) {
        r = va < 0.0f ? vb * va : va;
      } else {
        r = fmodf(va, vb);
        if (op == BinaryExtOp::kMod && r != 0.0f && ((r < 0.0f) != (vb < 0.0f))) r += vb;
      }
      y[i] = from_float<T>(r);
    }
  }
}

}  // namespace

void binary_ext(BinaryExtOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
                void* stream) {
  if (geometry.numel() <= 0) return;
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    with_index_type(geometry, [&](auto n, const auto& calc) {
      using Index = decltype(n);
      binary_ext_kernel<T, Index><<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n, calc);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
    });
  };
  if (dtype == DType::kInt32) return launch(std::int32_t{});
  if (dtype == DType::kInt64) return launch(std::int64_t{});
  XPURT_CHECK(op != BinaryExtOp::kMod, "cuda_raw mod (fmod=0) takes int32/int64; floats need fmod=1 (ONNX)");
  dispatch_float(dtype, "binary_ext", launch);
}

}  // namespace xpuruntime::cuda_raw
