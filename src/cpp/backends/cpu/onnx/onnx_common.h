// What the ONNX reference ops share: dtype dispatch, 16-bit float conversion, broadcasting, axis handling and
// reading shape-like inputs. Internal header of src/cpp/backends/cpu/onnx/.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "backends/cpu/onnx/onnx_kernels.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"  // ScratchVector (Note [Scratch memory under the budget])
#include "xpuruntime/tensor.h"

namespace xpuruntime::onnx_ref {

// Storage types of the 16-bit floats (bit patterns); compute in float.
struct Half {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};

// Value conversions between a storage type and its compute type (float for the 16-bit floats).
template <typename T>
struct Compute {
  using type = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};
template <>
struct Compute<Half> {
  using type = float;
  static float load(Half v) { return detail::half_to_float(v.bits); }
  static Half store(float v) { return Half{detail::float_to_half(v)}; }
};
template <>
struct Compute<BFloat16> {
  using type = float;
  static float load(BFloat16 v) { return detail::bfloat16_to_float(v.bits); }
  static BFloat16 store(float v) { return BFloat16{detail::float_to_bfloat16(v)}; }
};

// Calls fn(T{}) with T the storage type of `dtype` (bool is `bool`, float16 `Half`, bfloat16 `BFloat16`);
// InvalidTypeError for float8, int4 and uint4, which the few ops taking them read themselves.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat16{});
    case DType::kInt8: return fn(std::int8_t{});
    case DType::kUInt8: return fn(std::uint8_t{});
    case DType::kInt16: return fn(std::int16_t{});
    case DType::kInt32: return fn(std::int32_t{});
    case DType::kInt64: return fn(std::int64_t{});
    case DType::kBool: return fn(bool{});
    case DType::kUInt16: return fn(std::uint16_t{});
    case DType::kUInt32: return fn(std::uint32_t{});
    case DType::kUInt64: return fn(std::uint64_t{});
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kInt4:
    case DType::kUInt4:
      // Storage-only (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h): the ops that take them read them
      // themselves.
      throw InvalidTypeError(detail::str_cat(
          dtype_name(dtype), " is a storage type: only QuantizeLinear, DequantizeLinear, Cast, CastLike, "
          "MatMulNBits and the data-movement ops take it (dequantize or cast it to a float type first)"));
  }
  throw InvalidTypeError(detail::str_cat("unsupported dtype ", dtype_name(dtype)));
}

inline bool is_float_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16;
}

template <typename T>
T* data(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// NumPy broadcasting of two shapes; InvalidArgumentError (naming `where`) when incompatible.
std::vector<std::int64_t> broadcast_shapes(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                                           const std::string& where);
// Strides (in elements) that read a tensor of `shape` as if broadcast to `out` (0 on broadcast dims).
std::vector<std::int64_t> broadcast_strides(const std::vector<std::int64_t>& shape,
                                            const std::vector<std::int64_t>& out);
// `axis` in [-rank, rank) -> [0, rank); InvalidArgumentError naming `where` otherwise.
std::int64_t normalize_axis(std::int64_t axis, std::int64_t rank, const std::string& where);

// The rows a softmax-like op works on: `outer` blocks of `n` elements spaced `inner` apart, `inner` such rows per
// block. Softmax before opset 13 (`legacy`) flattens the input to 2-D at `axis` (inner = 1); later ones work along
// `axis` alone. `axis` in [0, rank], rank only when legacy. Softmax/LogSoftmax/Hardmax (onnx_elementwise.cpp) and
// com.microsoft QLinearSoftmax (onnx_misc_quant.cpp).
struct SoftmaxLayout {
  std::int64_t outer = 1, n = 1, inner = 1;
};
SoftmaxLayout softmax_layout(const std::vector<std::int64_t>& shape, std::int64_t axis, bool legacy);

// Concat's output shape for `inputs` along `axis` (in [0, rank)): TypeError / InvalidArgumentError naming `where`
// and `noun` i ("input", "operand") for a dtype, rank or dimension that does not match inputs[0]'s. Then the copy
// of each input's rows into `out` (allocated with that shape). Concat (onnx_tensor.cpp) and com.microsoft
// QLinearConcat (onnx_misc_quant.cpp).
std::vector<std::int64_t> concat_shape(const std::vector<const Tensor*>& inputs, std::int64_t axis,
                                       const std::string& where, const char* noun);
void concat_into(const std::vector<const Tensor*>& inputs, std::int64_t axis, Tensor& out);
// AveragePool over `x`, the values of a [N, C, spatial...] tensor of shape `x_shape`, with the node's kernel_shape
// (required), strides, dilations, pads, auto_pad, ceil_mode and count_include_pad (Note [Spatial windows] in
// onnx_nn_common.h): returns the output's shape and leaves its values in `y`, each window's sum and mean taken in
// double. InvalidArgumentError naming the node for a rank under 3, no kernel_shape or attributes of the wrong length.
// AveragePool (onnx_nn_pool.cpp) and com.microsoft QLinearAveragePool (onnx_misc_quant.cpp).
std::vector<std::int64_t> average_pool(const OpContext& ctx, const std::vector<std::int64_t>& x_shape,
                                       const ScratchVector<double>& x, ScratchVector<double>& y);
// The values of an int32/int64 tensor (a shape, axes, pads...) as int64; InvalidTypeError for other dtypes.
std::vector<std::int64_t> read_ints(const Tensor& t, const std::string& where);
// read_ints for data-sized values (Gather/Scatter indices), held as scratch (Note [Scratch memory under the budget]).
ScratchVector<std::int64_t> read_indices(const Tensor& t, const std::string& where);
// A scalar (or one-element) tensor of any numeric dtype as double.
double read_scalar(const Tensor& t, const std::string& where);
std::int64_t numel_of(const std::vector<std::int64_t>& shape);

// Iterates over every index of `shape` in row-major order, calling fn(offset_a, offset_b, linear_index) with the
// offsets given by two stride vectors (e.g. broadcast strides of two inputs).
template <typename Fn>
void for_each_index2(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& sa,
                     const std::vector<std::int64_t>& sb, Fn&& fn) {
  const std::size_t rank = shape.size();
  const std::int64_t total = numel_of(shape);
  if (total == 0) return;
  std::vector<std::int64_t> idx(rank, 0);
  std::int64_t oa = 0, ob = 0;
  for (std::int64_t linear = 0; linear < total; ++linear) {
    fn(oa, ob, linear);
    for (std::size_t d = rank; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (shape[d] - 1);
      ob -= sb[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace xpuruntime::onnx_ref
