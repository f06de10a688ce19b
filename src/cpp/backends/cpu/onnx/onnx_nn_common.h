// What the nn-group ONNX reference ops share (onnx_nn*.cpp): loading a tensor into a compute buffer and back,
// float-dtype checks, the cpu backend's GEMM, and the spatial-window arithmetic of Conv, ConvTranspose and the
// pools (kernel, strides, dilations, pads, auto_pad). Internal header of src/cpp/backends/cpu/onnx/.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/onnx/onnx_common.h"

namespace xpuruntime::onnx_ref::nn {

// The nn group's helpers live in onnx_ref::nn (the other groups have helpers of the same names).

// Registration of the nn group's files (called by register_nn_ops in onnx_nn.cpp).
// onnx_nn.cpp: MatMul, Gemm
void register_nn_matmul_ops(NodeKernelRegistrar& kernels);
// onnx_nn_conv.cpp: Conv, ConvTranspose, Col2Im, DeformConv
void register_nn_conv_ops(NodeKernelRegistrar& kernels);
// onnx_nn_pool.cpp: MaxPool, AveragePool, LpPool, globals, MaxUnpool
void register_nn_pool_ops(NodeKernelRegistrar& kernels);
// onnx_nn_norm.cpp: BatchNorm, InstanceNorm, LayerNorm, LRN, ...
void register_nn_norm_ops(NodeKernelRegistrar& kernels);
// onnx_nn_resize.cpp: Resize, Upsample, GridSample, AffineGrid, RoiAlign, MaxRoiPool, NonMaxSuppression
void register_nn_resize_ops(NodeKernelRegistrar& kernels);
// onnx_nn_rnn.cpp: RNN, GRU, LSTM
void register_nn_rnn_ops(NodeKernelRegistrar& kernels);

// The values of a tensor of any numeric dtype, converted to C.
template <typename C>
ScratchVector<C> load_values(const Tensor& t) {
  ScratchVector<C> out(static_cast<std::size_t>(t.numel()));
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = data<T>(t);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<C>(Compute<T>::load(p[i]));
  });
  return out;
}

// Writes `values` (t.numel() of them) into t, converting to t's dtype.
template <typename C>
void store_values(Tensor& t, const C* values) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using CT = typename Compute<T>::type;
    T* p = data<T>(t);
    const std::int64_t n = t.numel();
    for (std::int64_t i = 0; i < n; ++i) p[i] = Compute<T>::store(static_cast<CT>(values[i]));
  });
}

// InvalidTypeError unless `t` has a floating dtype; `what` names the input ("input 'X'").
inline void check_float(const OpContext& ctx, const Tensor& t, const char* what) {
  XPURT_CHECK_TYPE(is_float_dtype(t.dtype()), ctx.where(), ": ", what,
                   " must be float16, bfloat16, float32 or float64, got ", dtype_name(t.dtype()));
}

// "[1,3,224,224]"
std::string shape_str(const std::vector<std::int64_t>& shape);

// C[m, n] = A[m, k] * op(B) (row-major; op(B) = B [k, n] or, with trans_b, B^T for B stored [n, k]) through
// the cpu backend's GEMM (OpenBLAS when built with it). Defined for float and double.
template <typename C>
void nn_gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const C* a, std::int64_t lda, const C* b,
             std::int64_t ldb, C* c, std::int64_t ldc);

// Note [Spatial windows]
// Conv, ConvTranspose and the pools slide a window over the spatial dims (all dims after N and C). Each spatial
// dim d has a kernel size k, stride s, dilation r and pads (begin, end); the window's extent is (k - 1) * r + 1.
// auto_pad (a string attribute) replaces explicit pads: VALID = no pads; SAME_UPPER / SAME_LOWER pad so that
// out = ceil(in / s), the odd pad going at the end (UPPER) or at the beginning (LOWER).
struct Window {
  std::vector<std::int64_t> kernel, strides, dilations, pads_begin, pads_end;
  std::size_t rank() const { return kernel.size(); }
};

// Reads kernel_shape (or `default_kernel` when absent; InvalidArgumentError when both are empty), strides,
// dilations and explicit pads for `spatial_rank` spatial dims, validating their lengths and values.
Window read_window(const OpContext& ctx, std::size_t spatial_rank, const std::vector<std::int64_t>& default_kernel);

// a + b and a * b over a node's window geometry, naming the node on overflow (core/window_geometry.h).
std::int64_t geometry_add(const OpContext& ctx, std::int64_t a, std::int64_t b);
std::int64_t geometry_mul(const OpContext& ctx, std::int64_t a, std::int64_t b);

// in + pads_begin[d] + pads_end[d] - ((kernel[d] - 1) * dilations[d] + 1): how far the window of dim d slides over
// the padded input of size `in` (negative when it does not fit), checked as geometry_add is.
std::int64_t window_span(const OpContext& ctx, const Window& w, std::size_t d, std::int64_t in);

// Output size of a convolution / pool along dim d with explicit pads (floor, or ceil with `ceil_mode`, in which
// case a last window that would start in the end padding is dropped, as PyTorch and ONNX Runtime do).
std::int64_t window_output_size(const OpContext& ctx, const Window& w, std::size_t d, std::int64_t in, bool ceil_mode);

// Applies the node's auto_pad to `w` for the spatial input sizes `in` (overwriting pads for SAME_*/VALID).
void apply_auto_pad(const OpContext& ctx, const std::vector<std::int64_t>& in, Window& w);

// Iterates over every multi-index of `shape` (row-major), calling fn(idx) with the current index vector.
template <typename Fn>
void for_each_multi_index(const std::vector<std::int64_t>& shape, Fn&& fn) {
  for (std::int64_t d : shape) {
    if (d == 0) return;
  }
  std::vector<std::int64_t> idx(shape.size(), 0);
  while (true) {
    fn(idx);
    std::size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (shape.empty()) return;
  }
}

}  // namespace xpuruntime::onnx_ref::nn
