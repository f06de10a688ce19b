// Activation kernels: relu, sigmoid, tanh, silu, gelu (erf and tanh forms), and the in-place bias +
// activation epilogue that the cublas backend runs after a GEMM.
#include <string>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

template <UnaryOp kOp>
struct ActivationFn {
  __device__ __forceinline__ float operator()(float x) const {
    if constexpr (kOp == UnaryOp::kRelu) {
      return relu(x);
    } else if constexpr (kOp == UnaryOp::kSigmoid) {
      return 1.0f / (1.0f + expf(-x));  // x -> -inf: 1 / inf = 0; x -> +inf: 1
    } else if constexpr (kOp == UnaryOp::kTanh) {
      return tanhf(x);
    } else if constexpr (kOp == UnaryOp::kSilu) {
      return silu(x);
    } else if constexpr (kOp == UnaryOp::kGelu) {
      return gelu_erf(x);
    } else {
      static_assert(kOp == UnaryOp::kGeluTanh, "math ops live in elementwise.cu");
      return gelu_tanh(x);
    }
  }
};

// The epilogue's activations. kNone applies nothing (bias only).
enum class Epilogue : std::uint8_t { kNone, kRelu, kGelu, kGeluTanh, kSilu, kRelu6, kHardSwish };

template <Epilogue kAct>
__device__ __forceinline__ float apply_epilogue(float x) {
  if constexpr (kAct == Epilogue::kRelu) {
    return relu(x);
  } else if constexpr (kAct == Epilogue::kGelu) {
    return gelu_erf(x);
  } else if constexpr (kAct == Epilogue::kGeluTanh) {
    return gelu_tanh(x);
  } else if constexpr (kAct == Epilogue::kSilu) {
    return silu(x);
  } else if constexpr (kAct == Epilogue::kRelu6) {
    return relu6(x);
  } else if constexpr (kAct == Epilogue::kHardSwish) {
    return hard_swish(x);
  } else {
    return x;
  }
}

// y[r, c] = act(y[r, c] + bias[c]) in place over rows * cols elements. Vectorized when y and bias are 16-byte
// aligned and cols is a multiple of the vector width, so that a vector never straddles two rows and its bias
// slice is aligned too.
template <typename T, Epilogue kAct>
__global__ void bias_activation_kernel(T* y, const T* bias, std::int64_t n, std::int64_t cols, bool vectorized) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vectorized) {
    constexpr int kVec = kVec16<T>;
    using V = Vec<T, kVec>;
    const std::int64_t vectors = n / kVec;  // n % kVec == 0 since cols % kVec == 0
    for (std::int64_t i = first; i < vectors; i += stride) {
      V value = reinterpret_cast<const V*>(y)[i];
      if (bias != nullptr) {
        const V b = reinterpret_cast<const V*>(bias)[(i * kVec % cols) / kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          value.v[k] = from_float<T>(apply_epilogue<kAct>(to_float(value.v[k]) + to_float(b.v[k])));
        }
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) value.v[k] = from_float<T>(apply_epilogue<kAct>(to_float(value.v[k])));
      }
      reinterpret_cast<V*>(y)[i] = value;
    }
    return;
  }
  for (std::int64_t i = first; i < n; i += stride) {
    const float b = bias != nullptr ? to_float(bias[i % cols]) : 0.0f;
    y[i] = from_float<T>(apply_epilogue<kAct>(to_float(y[i]) + b));
  }
}

template <typename T, Epilogue kAct>
void launch_bias_activation(void* y, const void* bias, std::int64_t rows, std::int64_t cols, void* stream) {
  const std::int64_t n = rows * cols;
  constexpr int kVec = kVec16<T>;
  const bool vectorized = is_aligned(y, 16) && (bias == nullptr || is_aligned(bias, 16)) && cols % kVec == 0;
  bias_activation_kernel<T, kAct><<<grid_for(vectorized ? n / kVec : n, kThreads), kThreads, 0, as_stream(stream)>>>(
      static_cast<T*>(y), static_cast<const T*>(bias), n, cols, vectorized);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace

void activation(UnaryOp op, const void* x, void* y, DType dtype, std::int64_t n, void* stream) {
  dispatch_float(dtype, "activation", [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case UnaryOp::kRelu: return launch_unary<T>(x, y, n, ActivationFn<UnaryOp::kRelu>{}, stream);
      case UnaryOp::kSigmoid: return launch_unary<T>(x, y, n, ActivationFn<UnaryOp::kSigmoid>{}, stream);
      case UnaryOp::kTanh: return launch_unary<T>(x, y, n, ActivationFn<UnaryOp::kTanh>{}, stream);
      case UnaryOp::kSilu: return launch_unary<T>(x, y, n, ActivationFn<UnaryOp::kSilu>{}, stream);
      case UnaryOp::kGelu: return launch_unary<T>(x, y, n, ActivationFn<UnaryOp::kGelu>{}, stream);
      case UnaryOp::kGeluTanh: return launch_unary<T>(x, y, n, ActivationFn<UnaryOp::kGeluTanh>{}, stream);
      default: XPURT_INTERNAL_ASSERT(false, "unary op ", static_cast<int>(op), " is not an activation");
    }
  });
}

void add_into(void* y, const void* x, DType dtype, std::int64_t n, void* stream) {
  if (n == 0) return;
  BroadcastGeometry flat;
  flat.shape = {n};
  flat.a_strides = {1};
  flat.b_strides = {1};
  binary(BinaryOp::kAdd, y, x, y, dtype, flat, stream);
}

void bias_activation(void* y, const void* bias, DType dtype, std::int64_t rows, std::int64_t cols,
                     const std::string& activation, void* stream) {
  Epilogue act = Epilogue::kNone;
  if (activation == "relu") {
    act = Epilogue::kRelu;
  } else if (activation == "gelu") {
    act = Epilogue::kGelu;
  } else if (activation == "gelu_tanh") {
    act = Epilogue::kGeluTanh;
  } else if (activation == "silu") {
    act = Epilogue::kSilu;
  } else if (activation == "relu6") {
    act = Epilogue::kRelu6;
  } else if (activation == "hard_swish") {
    act = Epilogue::kHardSwish;
  } else {
    XPURT_CHECK(activation == "none", "cuda_raw::bias_activation: unknown activation '", activation,
                "'; valid: none, relu, gelu, gelu_tanh, silu, relu6, hard_swish");
  }
  XPURT_CHECK(rows >= 0 && cols >= 0, "cuda_raw::bias_activation: rows and cols must be >= 0, got ", rows, " and ",
              cols);
  if (rows == 0 || cols == 0 || (bias == nullptr && act == Epilogue::kNone)) return;
  dispatch_float(dtype, "bias_activation", [&](auto tag) {
    using T = decltype(tag);
    switch (act) {
      case Epilogue::kNone: return launch_bias_activation<T, Epilogue::kNone>(y, bias, rows, cols, stream);
      case Epilogue::kRelu: return launch_bias_activation<T, Epilogue::kRelu>(y, bias, rows, cols, stream);
      case Epilogue::kGelu: return launch_bias_activation<T, Epilogue::kGelu>(y, bias, rows, cols, stream);
      case Epilogue::kGeluTanh: return launch_bias_activation<T, Epilogue::kGeluTanh>(y, bias, rows, cols, stream);
      case Epilogue::kSilu: return launch_bias_activation<T, Epilogue::kSilu>(y, bias, rows, cols, stream);
      case Epilogue::kRelu6: return launch_bias_activation<T, Epilogue::kRelu6>(y, bias, rows, cols, stream);
      case Epilogue::kHardSwish:
        return launch_bias_activation<T, Epilogue::kHardSwish>(y, bias, rows, cols, stream);
    }
  });
}

}  // namespace xpuruntime::cuda_raw
