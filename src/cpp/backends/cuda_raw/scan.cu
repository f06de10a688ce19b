// ONNX CumSum: one thread per line along the scanned axis, summing in order (deterministic, no atomics).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// The accumulator of each storage type: fp32 for 16-bit floats (Note [fp32 compute]), unsigned for integers (so
// that overflow wraps instead of being undefined).
template <typename T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<__half> {
  using type = float;
};
template <>
struct Accumulator<__nv_bfloat16> {
  using type = float;
};
template <>
struct Accumulator<std::int32_t> {
  using type = std::uint32_t;
};
template <>
struct Accumulator<std::int64_t> {
  using type = std::uint64_t;
};

template <typename T>
__device__ __forceinline__ typename Accumulator<T>::type load_acc(T v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return to_float(v);
  } else {
    return static_cast<typename Accumulator<T>::type>(v);
  }
}

template <typename T>
__device__ __forceinline__ T store_acc(typename Accumulator<T>::type v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return from_float<T>(v);
  } else {
    return static_cast<T>(v);
  }
}

// Neighbouring threads take neighbouring inner positions, so loads are coalesced when inner > 1.
template <typename T>
__global__ void cum_sum_kernel(const T* x, T* y, std::int64_t lines, std::int64_t axis_size, std::int64_t inner,
                               bool exclusive, bool reverse) {
  using Acc = typename Accumulator<T>::type;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t line = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; line < lines;
       line += stride) {
    const std::int64_t o = line / inner;
    const std::int64_t base = o * axis_size * inner + (line - o * inner);
    Acc sum = Acc(0);
    for (std::int64_t k = 0; k < axis_size; ++k) {
      const std::int64_t at = base + (reverse ? axis_size - 1 - k : k) * inner;
      const Acc v = load_acc(x[at]);
      if (exclusive) {
        y[at] = store_acc<T>(sum);
        sum += v;
      } else {
        sum += v;
        y[at] = store_acc<T>(sum);
      }
    }
  }
}

}  // namespace

void cum_sum(const void* x, void* y, DType dtype, std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
             bool exclusive, bool reverse, void* stream) {
  const std::int64_t lines = outer * inner;
  if (lines == 0 || axis_size == 0) return;
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    cum_sum_kernel<T><<<grid_for(lines, kThreads), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), lines, axis_size, inner, exclusive, reverse);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  };
  switch (dtype) {
    case DType::kFloat32: return launch(float{});
    case DType::kFloat64: return launch(double{});
    case DType::kFloat16: return launch(__half{});
    case DType::kBFloat16: return launch(__nv_bfloat16{});
    case DType::kInt32: return launch(std::int32_t{});
    case DType::kInt64: return launch(std::int64_t{});
    default:
      throw UnsupportedOperationError(::xpuruntime::detail::str_cat(
          "cuda_raw cum_sum handles float32, float16, bfloat16, float64, int32 and int64, got ", dtype_name(dtype)));
  }
}

}  // namespace xpuruntime::cuda_raw
