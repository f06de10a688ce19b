// The device kernels that code outside the KernelRegistry calls directly: a table of function pointers that a kernel
// backend fills and core and the other backends read (Note [Device kernels table]). Internal header of src/cpp.
//
// Note [Device kernels table]
// A few CUDA kernels are called by code that is no kernel of the registry: Tensor::copy_from rearranges the
// elements of two layouts on a device (strided_copy), DeviceManager::inject_fault_for_testing makes a device fault
// (inject_fault), and the cublas and cublasLt backends add linear's bias, activation and residual after a GEMM and
// take the softmax of the unfused attention. Core includes no backend and a backend no other backend
// (docs/architecture.md, "Layering rules"), so these calls go through this table: the cuda_raw backend fills it
// (register_cuda_raw_device_kernels, backends/cuda_raw/cuda_raw_device_kernels.cpp) when device_kernels() is first
// called. device_kernels() is defined in core/backend_registration.cpp, the one place that names the backends of
// this build, and is filled on its own first use (not by KernelRegistry::global()), so a tensor copy made before
// any kernel lookup finds it filled. An entry left null means no backend of this build has the kernel (a CPU build):
// callers raise UnsupportedOperationError saying what is missing (`required_device_kernel`).
//
// Every entry keeps the contract of the cuda_raw launcher it points to (backends/cuda_raw/cuda_raw_ops.h): device
// pointers of the CUDA device current on the calling thread, `stream` a cudaStream_t passed as void* (nullptr: the
// legacy default stream), the work enqueued without synchronizing, typed errors raised before anything is enqueued.
//
// Ownership: the table is static, filled once (thread-safe) and never changed afterwards; the entries are plain
// functions. Thread-safety: read it from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/attention_layout.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

// What follows the int32 accumulation of the int8 ops qlinear and qconv2d (Note [Quantized registry ops] in
// core/op_schemas.cpp), for a GPU kernel's epilogue: every pointer is device memory of the launch's device, made
// once when the plan is built (the weights, their scales and the bias are constants). For output channel c of an
// accumulator acc:
//   acc += int_bias[c]                                  when int_bias (int32 bias, and the folded x_zero_point
//                                                        correction -x_zero_point * sum_k w[k, c])
//   acc -= *x_zero_point * w_col_sums[c]                 when x_zero_point (a zero point known only at run time,
//                                                        MatMulInteger after DynamicQuantizeLinear), int32 wrapping
//   real = float32(acc) * alpha[alpha_per_channel ? c : 0] (+ float_bias[c] when float_bias)
//   real = max(real, 0) when relu (NaN stays NaN)
//   out  = acc (int32) | real (float32, float16 rounded to nearest) |
//          saturate(round_half_even(real / y_scale) + y_zero_point) (int8, uint8; NaN -> y_zero_point)
struct QuantEpilogueParams {
  const float* alpha = nullptr;  // x_scale * w_scale[c], as float32 of the double product (as the cpu kernel)
  bool alpha_per_channel = false;
  const std::int32_t* int_bias = nullptr;
  const float* float_bias = nullptr;
  const std::int32_t* w_col_sums = nullptr;
  const std::uint8_t* x_zero_point = nullptr;  // one uint8 (DynamicQuantizeLinear's zero point), or null
  bool relu = false;
  float y_scale = 1.0f;
  float y_zero_point = 0.0f;
  DType out_dtype = DType::kInt32;  // int32, float32, float16, int8 or uint8
};

// The per-run operands of an int8 GEMM's epilogue, made on the device from the op's inputs (the qlinear kernels of the
// cublasLt and cuda_raw backends): a plan sees no data when it is built, so they are made at each run, in one launch.
// For output channel c of `channels`, with colsum[c] = sum_k weight[k, c] (int32, wrapping):
//   alpha[c]     = float32(double(x_scale) * double(w_scale[c]))   (x_scale without w_scale; only alpha[0] when
//                                                                    !alpha_per_channel; nothing when alpha is null)
//   int_bias[c]  = bias[c] (0 without bias) + zero_point_correction * colsum[c] - (*x_zero_point) * colsum[c]
//                  in int32 that wraps (x_zero_point: one int8 or uint8 on the device, nullable); nothing when
//                  int_bias is null
//   x_signed[i]  = x[i] ^ 0x80 (a uint8 x - 128, as int8) for x_count bytes, when x_signed is not null
// The column sums are read from the weight only when zero_point_correction != 0 or x_zero_point is given.
struct QuantPrologueParams {
  float x_scale = 1.0f;
  const float* w_scale = nullptr;  // [channels] when alpha_per_channel, else one element; null: 1
  bool alpha_per_channel = false;
  const std::int32_t* bias = nullptr;  // int32 [channels], nullable
  const std::int8_t* weight = nullptr;
  bool weight_nk = true;  // [channels, k] (else [k, channels]), contiguous
  std::int64_t k = 0;
  std::int32_t zero_point_correction = 0;
  const void* x_zero_point = nullptr;
  bool x_zero_point_signed = false;  // *x_zero_point is int8 (else uint8)
  float* alpha = nullptr;            // out: [channels] or [1]
  std::int32_t* int_bias = nullptr;  // out: [channels]
  const std::uint8_t* x = nullptr;
  std::int8_t* x_signed = nullptr;  // out: [x_count]
  std::int64_t x_count = 0;
};

struct DeviceKernels {
  // dst[i...] = src[i...] for every index of `shape`, strides in elements (cuda_raw::strided_copy).
  void (*strided_copy)(const void* src, void* dst, DType dtype, const std::vector<std::int64_t>& shape,
                       const std::vector<std::int64_t>& src_strides, const std::vector<std::int64_t>& dst_strides,
                       void* stream) = nullptr;
  // dsts[p][i...] = srcs[p][i...] for every pair p, one shape and pair of layouts for all, in one launch per 128
  // pairs (cuda_raw::strided_copy_pairs; no destination overlapping a source or another destination).
  void (*strided_copy_pairs)(const std::vector<const void*>& srcs, const std::vector<void*>& dsts, DType dtype,
                             const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& src_strides,
                             const std::vector<std::int64_t>& dst_strides, void* stream) = nullptr;
  // A kernel that stores to an unmapped address: a sticky cudaErrorIllegalAddress, for tests only
  // (cuda_raw::inject_fault).
  void (*inject_fault)(void* stream) = nullptr;
  // y[rows, cols] = act(y + bias[cols]) in place (cuda_raw::bias_activation).
  void (*bias_activation)(void* y, const void* bias, DType dtype, std::int64_t rows, std::int64_t cols,
                          const std::string& activation, void* stream) = nullptr;
  // y[i] += x[i] for n elements (cuda_raw::add_into).
  void (*add_into)(void* y, const void* x, DType dtype, std::int64_t n, void* stream) = nullptr;
  // The softmax of an unfused attention, in place on the scores (cuda_raw::attention_softmax).
  void (*attention_softmax)(void* scores, DType dtype, std::int64_t batch_heads, std::int64_t heads, std::int64_t sq,
                            std::int64_t sk, float scale, bool causal, FullyMaskedRows rows, const void* mask,
                            const std::vector<std::int64_t>& mask_strides, void* stream) = nullptr;
  // out[i] from the int32 accumulator acc[i] by `params` (QuantEpilogueParams), for `count` elements whose output
  // channel is (i / inner) % channels: a GEMM's [rows, channels] has inner = 1, an NCHW convolution's output inner =
  // H * W (cuda_raw::quantized_epilogue). acc and out may not alias unless out is int32 or float32.
  void (*quantized_epilogue)(const std::int32_t* acc, void* out, std::int64_t count, std::int64_t channels,
                             std::int64_t inner, const QuantEpilogueParams& params, void* stream) = nullptr;
  // The per-run operands of an int8 GEMM of `channels` output channels (QuantPrologueParams,
  // cuda_raw::quantized_prologue).
  void (*quantized_prologue)(const QuantPrologueParams& params, std::int64_t channels, void* stream) = nullptr;
  // out[r] = the index of the largest of the `cols` values of row r of a contiguous [rows, cols] (float32, float16 or
  // bfloat16): NaN first, ties to the lowest index, as torch.argmax (cuda_raw::argmax_rows; Note [Split arg
  // reductions]). `workspace` (`workspace_bytes`, 0 for none) lets a few long rows split across the GPU. The
  // generation loop's greedy tokens on the device (Note [Logits read back] in generation/step_io.cpp).
  void (*argmax_rows)(const void* x, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t* out,
                      void* workspace, std::size_t workspace_bytes, void* stream) = nullptr;
  // out[r] = a token sampled from row r of [rows, vocab] logits by the device memory row_sampling::RowParams
  // params[r] and the CSR `seen` lists (cuda_raw::sample_rows; Note [Sampling rows where the logits are] in
  // core/row_sampling.h). `workspace`: rows x vocab floats.
  void (*sample_rows)(const void* logits, DType dtype, std::int64_t rows, std::int64_t vocab, const void* params,
                      const std::int64_t* seen_offsets, const std::int64_t* seen, float* workspace, std::int64_t* out,
                      void* stream) = nullptr;
};

// The table of this build, filled on the first call (core/backend_registration.cpp).
const DeviceKernels& device_kernels();

// `kernel` when it is not null; else UnsupportedOperationError "<user> needs the <name> device kernel of the
// cuda_raw backend, which this build lacks (it needs CUDA)".
template <typename Fn>
Fn required_device_kernel(Fn kernel, const char* name, const char* user) {
  if (kernel == nullptr) {
    throw UnsupportedOperationError(detail::str_cat(user, " needs the ", name, " device kernel of the cuda_raw backend, "
                                                    "which this build lacks (it needs CUDA)"));
  }
  return kernel;
}

// Fills `table` with the cuda_raw backend's launchers (backends/cuda_raw/cuda_raw_device_kernels.cpp); called only by
// device_kernels(), in builds with that backend.
void register_cuda_raw_device_kernels(DeviceKernels& table);

}  // namespace xpuruntime
