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
  const void* bias = nullptr;  // n float32 (float16 when bias_half) elements, or null
  bool bias_half = false;
  bool relu = false;
  float y_scale = 1.0f;  // output float8e4m3fn: real / y_scale, rounded to nearest even, saturated to +-448
  Fp8Output output = Fp8Output::kFloat32;
};

// Launches the epilogue on `stream`; the launch's error (cudaGetLastError), cudaSuccess when it started.
cudaError_t launch_fp8_epilogue(const Fp8EpilogueParams& params, cudaStream_t stream);

// What a plan whose epilogue cuBLASLt applies (Note [cuBLASLt's own float8 epilogue] in cublaslt_qlinear_fp8.cpp)
// writes into its workspace before the GEMM: the bias in float16 (cuBLASLt's float8 GEMMs take a 16-bit bias), the
// output's scale 1 / y_scale for a float8 output, and x_scale once per row of x for per-channel weight scales.
struct Fp8PrepareParams {
  const float* bias = nullptr;  // n float32 values, or null
  void* bias16 = nullptr;       // n float16 values, written when bias is given
  std::int64_t n = 0;
  float* d_scale = nullptr;     // one float32, written when not null
  float d_scale_value = 1.0f;
  float* x_scales = nullptr;    // m float32 values, written when not null
  std::int64_t m = 0;
  float x_scale = 1.0f;
};

// Launches the preparation on `stream` (nothing when there is nothing to write); the launch's error.
cudaError_t launch_fp8_prepare(const Fp8PrepareParams& params, cudaStream_t stream);

}  // namespace xpuruntime::cublaslt
