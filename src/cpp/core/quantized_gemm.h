// What the GPU kernels of the int8 op qlinear share (the cublasLt IMMA GEMM and cuda_raw's dp4a kernel, which include
// core and not each other): the problem read from the descriptor, the workspace their per-run operands take, and the
// QuantPrologueParams / QuantEpilogueParams (core/device_kernels.h) of one launch. Internal header of src/cpp.
//
// Note [Signed operands of the int8 GEMMs]
// Tensor cores (IMMA) and __dp4a multiply int8 by int8 only (mixed signs need a second instruction form that
// cuBLASLt does not take), so a uint8 x is taken as x - 128 (x ^ 0x80, an int8) and the difference moved into the
// bias: with zp the zero point (the attribute x_zero_point, or the run-time input x_zero_point) and colsum[n] =
// sum_k w[k, n],
//   sum_k (x[m, k] - zp) * w[k, n] = sum_k x'[m, k] * w[k, n] + (s - zp) * colsum[n],   s = 128 for uint8 x, else 0
// where x' = x - s is int8. So int_bias'[n] = bias[n] + (s - zp_attribute) * colsum[n] - zp_input * colsum[n],
// made on the device at each run (QuantPrologueParams: a plan sees no data when it is built, and the weights,
// scales and bias are inputs; the quantized_constant_folding pass makes bias - zp_attribute * colsum a constant with
// x_zero_point 0, leaving s * colsum: Note [Quantized constants folded at build time] in
// engines/native/passes/quantized_constants.cpp), in int32 that wraps: the exact sum mod 2^32, which is what the cpu kernel's wrapping
// accumulation computes. An IMMA accumulation itself never wraps: |x' * w| <= 2^14, so K <= 131071 keeps every sum
// within int32 (the cublasLt kernel refuses larger K; __dp4a wraps as the cpu kernel does). The column sums are read
// from the weight only when s - zp_attribute != 0 or the zero point is a run-time input: a symmetric int8 x (zero
// point 0) needs no pass over the weight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device_kernels.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::quantized {

// qlinear's GEMM y[M, N] = epilogue(x[M, K] @ w) as its descriptor states it (the schema has validated it).
struct QLinearProblem {
  std::int64_t m = 0, n = 0, k = 0;
  bool weight_nk = false;        // weight [N, K] (else [K, N])
  bool x_unsigned = false;       // x is uint8: taken as x - 128 (Note [Signed operands of the int8 GEMMs])
  bool dynamic_zero_point = false;  // input 4 x_zero_point
  bool zero_point_signed = false;   // ... of dtype int8
  std::int32_t zero_point_correction = 0;  // (128 when x_unsigned) - the attribute x_zero_point
  bool has_w_scale = false;
  bool w_scale_per_channel = false;  // w_scale has N elements (N > 1)
  bool int_bias_input = false;       // bias is int32
  bool float_bias_input = false;     // bias is float32
  bool relu = false;
  float x_scale = 1.0f, y_scale = 1.0f, y_zero_point = 0.0f;
  DType out_dtype = DType::kFloat32;

  static QLinearProblem of(const OpDescriptor& desc);

  // Whether the epilogue needs alpha (every output but int32), whether w_scale is alpha itself (x_scale 1:
  // float32(double(1) * s) == s, what the quantized_constant_folding pass makes; Note [Quantized constants folded at
  // build time]), whether alpha is made by the prologue, whether an int_bias is made (a correction to fold), and so
  // whether any prologue launch comes before the GEMM (`flip`: x moved to int8 by the prologue, for the cublasLt
  // kernel).
  bool needs_alpha() const { return out_dtype != DType::kInt32; }
  bool alpha_is_w_scale() const { return needs_alpha() && has_w_scale && x_scale == 1.0f; }
  bool makes_alpha() const { return needs_alpha() && !alpha_is_w_scale(); }
  bool folds_correction() const { return zero_point_correction != 0 || dynamic_zero_point; }
  bool needs_prologue(bool flip) const { return makes_alpha() || folds_correction() || (flip && x_unsigned); }
  // Bytes of the prologue's outputs in the workspace: alpha and int_bias, each 256-byte aligned.
  std::size_t prologue_bytes() const;

  // The prologue of one launch: alpha and int_bias into `scratch` (prologue_bytes() bytes on the device), and with
  // `x_signed` (M * K bytes, or null) x - 128 there when x is uint8.
  QuantPrologueParams prologue(const KernelLaunch& launch, void* scratch, std::int8_t* x_signed) const;
  // The epilogue of one launch, reading what prologue() made in `scratch`.
  QuantEpilogueParams epilogue(const KernelLaunch& launch, void* scratch) const;

  // "x uint8 -> int8 (+ 128 * column sums in the bias), relu, -> int8 (y_scale 0.05, y_zero_point -3)" for explain.
  std::string describe_epilogue() const;
};

}  // namespace xpuruntime::quantized
