// Launchers of the cuda_raw backend that other parts of xpuruntime call directly, through the device kernels table
// (core/device_kernels.h, filled by cuda_raw_device_kernels.cpp): the cublas and cublasLt backends (linear's bias +
// activation epilogue, the softmax of the unfused attention) and the core (strided copies between CUDA tensors of
// different layouts, Tensor::copy_from).
//
// Contract, for every function here:
//  - Pointers are device pointers of the CUDA device that is current on the calling thread (the caller makes it
//    current, e.g. with detail::CudaDeviceGuard). `stream` is a cudaStream_t passed as void* (nullptr: the
//    legacy default stream). No CUDA type appears in this header, so host-compiled .cpp files can include it.
//  - The work is enqueued on `stream` and the call returns without synchronizing. Zero-sized work enqueues
//    nothing.
//  - Float dtypes are float32, float16 and bfloat16; 16-bit values are computed in fp32 and rounded once.
//  - Errors: UnsupportedOperationError for a dtype the launcher does not handle, InvalidArgumentError for
//    inconsistent arguments (both raised before anything is enqueued), CudaError when a launch fails.
//  - The caller owns all memory; nothing is retained after the call. Safe to call from several threads.
//
// The functions are exported from libxpuruntime_core (XPURT_API) only so that the backend's own tests
// (tests/cpp/backends/cuda_raw/test_cuda_raw_backend.cpp) can call them; this header is internal and not installed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/attention_layout.h"
#include "core/device_kernels.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/export.h"

namespace xpuruntime::cuda_raw {

// y[rows, cols] = act(y + bias[cols]) in place; `bias` may be null (no bias). `activation`: "none", "relu",
// "gelu" (erf form), "gelu_tanh", "silu", "relu6" or "hard_swish" (InvalidArgumentError otherwise). `y` and `bias`
// are contiguous.
XPURT_API void bias_activation(void* y, const void* bias, DType dtype, std::int64_t rows, std::int64_t cols,
                               const std::string& activation, void* stream);

// Softmax over the last axis of a contiguous [rows, cols] tensor. `x == y` (in place) is allowed; otherwise the
// two must not overlap. A row whose entries are all -inf yields NaN (as PyTorch does).
// out[r] = argmax of row r of a contiguous [rows, cols] (the device kernels table's argmax_rows: NaN first, ties to
// the lowest index). With `workspace` of `workspace_bytes` (0: none), rows too few to fill the GPU split their columns.
XPURT_API void argmax_rows(const void* x, DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t* out,
                           void* workspace, std::size_t workspace_bytes, void* stream);

// out[r] = a token sampled from row r of the contiguous [rows, vocab] logits `logits` (float32, float16 or bfloat16)
// by params[r] (row_sampling::RowParams, device memory) and, where its penalty is not 1, the token ids
// seen[seen_offsets[r], seen_offsets[r + 1]) (seen_offsets may be null: no penalties): Note [Sampling rows where the
// logits are] in core/row_sampling.h. `workspace`: rows x vocab floats. The device kernels table's sample_rows.
XPURT_API void sample_rows(const void* logits, DType dtype, std::int64_t rows, std::int64_t vocab, const void* params,
                           const std::int64_t* seen_offsets, const std::int64_t* seen, float* workspace,
                           std::int64_t* out, void* stream);

// y[i] += x[i] for n elements (linear's residual when the GEMM cannot add it: the cublas kernel).
XPURT_API void add_into(void* y, const void* x, DType dtype, std::int64_t n, void* stream);

XPURT_API void softmax_lastdim(const void* x, void* y, DType dtype, std::int64_t rows, std::int64_t cols,
                               void* stream);

// The softmax of an unfused attention, in place on the scores [batch_heads, sq, sk] (contiguous), where
// batch_heads = B * heads. For query row i of head h of batch b the softmax is taken over
//   scores[b, h, i, j] * scale + mask[b, h, i, j]        for keys j,
// where `causal` (top-left aligned) masks the keys j > i with -inf, and `mask` (nullable, additive, of `dtype`)
// is read at b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2] + j * mask_strides[3] (strides in
// elements, 0 along broadcast dimensions). A fully masked row (every term -inf) yields NaN, like PyTorch's
// softmax, 0 with `rows` kZero, or 1 / count over its visible keys with kUniform (every -inf term then counts as
// kUniformMaskedScore; Note [Fully masked attention rows] in cpu_attention.cpp); a row with a NaN term is NaN.
// InvalidArgumentError when `heads` does not divide `batch_heads` or mask_strides has not 4 entries.
XPURT_API void attention_softmax(void* scores, DType dtype, std::int64_t batch_heads, std::int64_t heads,
                                 std::int64_t sq, std::int64_t sk, float scale, bool causal,
                                 FullyMaskedRows rows, const void* mask,
                                 const std::vector<std::int64_t>& mask_strides, void* stream);

// dst[i...] = src[i...] for every index of `shape`; strides in elements (any sign, 0 allowed for src). Any
// dtype (only its size matters). `src` and `dst` must not overlap, and `dst`'s strides must not map two indices
// to one element. Views of any rank: up to 8 dimensions (after merging dimensions that are contiguous in both)
// take one kernel, more take one kernel per slice of the leading dimensions.
XPURT_API void strided_copy(const void* src, void* dst, DType dtype, const std::vector<std::int64_t>& shape,
                            const std::vector<std::int64_t>& src_strides,
                            const std::vector<std::int64_t>& dst_strides, void* stream);

// strided_copy for several pairs of views of one shape and pair of layouts: dsts[p][i...] = srcs[p][i...], up to 128
// pairs a launch (Note [Copies in one launch] in core/tensor.cpp). No destination may overlap any source or other
// destination.
XPURT_API void strided_copy_pairs(const std::vector<const void*>& srcs, const std::vector<void*>& dsts, DType dtype,
                                  const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& src_strides,
                                  const std::vector<std::int64_t>& dst_strides, void* stream);

// The per-run operands of an int8 GEMM's epilogue (QuantPrologueParams, core/device_kernels.h) in one launch
// (quant_gemm.cu): alpha, the int32 bias with the zero points folded in (the weight's column sums read only when there
// is one to fold), and a uint8 x as int8 (x ^ 0x80). InvalidArgumentError for inconsistent params.
XPURT_API void quantized_prologue(const QuantPrologueParams& params, std::int64_t channels, void* stream);

// The epilogue of the int8 ops qlinear and qconv2d (quant_gemm.cu): out[i] from the int32 accumulator acc[i] by
// `params` (QuantEpilogueParams, core/device_kernels.h; rounded as the cpu kernel, quant_epilogue.cuh) for `count`
// elements whose output channel is (i / inner) % channels. acc and out may alias only when out is int32 or float32.
// UnsupportedOperationError for another output dtype, InvalidArgumentError for params that break the contract
// (alpha missing for a non-int32 output, x_zero_point without w_col_sums, y_scale <= 0, channels or inner < 1).
XPURT_API void quantized_epilogue(const std::int32_t* acc, void* out, std::int64_t count, std::int64_t channels,
                                  std::int64_t inner, const QuantEpilogueParams& params, void* stream);

}  // namespace xpuruntime::cuda_raw
