// The epilogue of the cublasLt qlinear_fp8 kernel (cublaslt_qlinear_fp8.cpp): from cuBLASLt's float32 accumulator to
// the op's output, as Note [Float8 quantized linear] in core/op_schemas.cpp states it. Internal to the backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace xpuruntime::cublaslt {

enum class Fp8Output : std::uint8_t { kFloat32, kFloat16, kFloat8E4M3FN };

// One launch's operands (device pointers; the scales and the bias are the op's inputs, so read on the device).
struct Fp8EpilogueParams {
  const float* accumulator = nullptr;  // [m, n] row-major, 16-byte aligned, n a multiple of 4
  void* out = nullptr;                 // [m, n] of `output`
  std::int64_t m = 0, n = 0;
  float x_scale = 1.0f;
  const float* w_scale = nullptr;  // one element, or n when w_scale_per_channel
  bool w_scale_per_channel = false;
  const float* bias = nullptr;  // n elements, or null
  bool relu = false;
  float y_scale = 1.0f;  // output float8e4m3fn: real / y_scale, rounded to nearest even, saturated to +-448
  Fp8Output output = Fp8Output::kFloat32;
};

// Launches the epilogue on `stream`; the launch's error (cudaGetLastError), cudaSuccess when it started.
cudaError_t launch_fp8_epilogue(const Fp8EpilogueParams& params, cudaStream_t stream);

}  // namespace xpuruntime::cublaslt
