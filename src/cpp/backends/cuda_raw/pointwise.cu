// The ONNX pointwise ops beyond the core set: clip, hard_sigmoid, hard_swish, leaky_relu, elu, softplus, sin,
// cos, floor, ceil, round, sign (float in, float out, fp32 compute: Note [fp32 compute]), and is_nan / is_inf
// (float in, float64 included, bool out).
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
    } else {
      static_assert(kOp == PointwiseOp::kSign, "every PointwiseOp has a case");
      return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);  // 0, -0 and NaN stay
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

}  // namespace xpuruntime::cuda_raw
