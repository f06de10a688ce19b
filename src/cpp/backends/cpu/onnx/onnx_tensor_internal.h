// What the tensor-group ONNX reference ops share (onnx_tensor.cpp, onnx_tensor_index.cpp,
// onnx_tensor_reduce.cpp): bit-copy dispatch for data movement, strided copies, axes given as an attribute or an
// input, ONNX element-type codes. Internal header of src/cpp/backends/cpu/onnx/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/onnx/onnx_common.h"

namespace xpuruntime::onnx_ref {

// Calls fn(U{}) with U the unsigned integer of the dtype's element size: data movement copies bits, whatever the
// element type.
template <typename Fn>
decltype(auto) visit_bits(DType dtype, Fn&& fn) {
  switch (dtype_size(dtype)) {
    case 1: return fn(std::uint8_t{});
    case 2: return fn(std::uint16_t{});
    case 4: return fn(std::uint32_t{});
    case 8: return fn(std::uint64_t{});
    default: break;
  }
  throw InvalidTypeError(detail::str_cat("unsupported element size of dtype ", dtype_name(dtype)));
}

// out[i] = in[base + sum_d idx_d * strides[d]] for every index of out (contiguous, same dtype as in).
void copy_strided(const Tensor& in, Tensor& out, std::int64_t base, const std::vector<std::int64_t>& strides);

// A contiguous copy of `in` with another shape of the same element count.
Tensor reshaped_copy(const Tensor& in, const std::vector<std::int64_t>& shape);

// The int list given either by the attribute `name` (opset < `input_since`) or by input `input_index`
// (opset >= `input_since`); nullopt when absent.
std::optional<std::vector<std::int64_t>> ints_attr_or_input(const OpContext& ctx, const std::string& name,
                                                            std::int64_t input_since, std::size_t input_index);

// Normalizes every axis to [0, rank); InvalidArgumentError on out-of-range or repeated axes.
std::vector<std::int64_t> normalize_axes(const std::vector<std::int64_t>& axes, std::int64_t rank,
                                         const std::string& where);

// The DType of an ONNX TensorProto element-type code (1 = float, 7 = int64, ...); InvalidTypeError for codes our
// Tensor has no dtype for (strings, uint16/32/64, complex, float8).
DType dtype_from_onnx_code(std::int64_t code, const std::string& where);

// Registration of the other tensor-group files (called by register_tensor_ops).
// onnx_tensor_index.cpp: Gather*, Scatter*, NonZero, Unique, ...
void register_tensor_index_ops(NodeKernelRegistrar& kernels);
// onnx_tensor_reduce.cpp: Reduce*, ArgMax, TopK, CumSum, Einsum
void register_tensor_reduce_ops(NodeKernelRegistrar& kernels);

}  // namespace xpuruntime::onnx_ref
