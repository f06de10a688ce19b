// Scalars read from tensors: the one accessor (Note [Scalars read from tensors]). Internal header of src/cpp.
//
// Note [Scalars read from tensors]
// ONNX passes many scalars as tensors (Range's start/limit/delta, Clip's bounds, a Loop's trip count, TopK's k, a
// sequence position, ...), and a hostile or mutated model can give any of them zero elements or many. Reading
// "element 0" of an empty tensor read past its allocation (Range folded while a session was built crashed; fed at
// run time it returned garbage). Every place that reads a scalar from a tensor - the reference library, constant
// folding, the passes and the lowering, host reads of device values - goes through these functions, which check
// the element count first and name what they read.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::detail {

// InvalidArgumentError "<what>: expected a scalar (one element), got a tensor of N elements [shape]" unless `t` has
// exactly one element.
void check_one_element(const Tensor& t, const std::string& what);

// The one element of `t` as T, which must be its element type (T: the C++ type of t.dtype(); 16-bit floats are
// read as std::uint16_t bits). The tensor may live on a device: it is copied to the host first.
template <typename T>
T scalar_element(const Tensor& t, const std::string& what) {
  check_one_element(t, what);
  XPURT_INTERNAL_ASSERT(t.element_size() == sizeof(T), what, ": reading a ", dtype_name(t.dtype()), " scalar as a ",
                        sizeof(T), "-byte type");
  const Tensor host = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
  return *static_cast<const T*>(host.data_ptr());
}

// The one element of a numeric tensor as double (any dtype; 16-bit floats converted). Checked like scalar_element.
double scalar_as_double(const Tensor& t, const std::string& what);

// The one element of a numeric tensor as an int64: integers exactly, floating-point values truncated; a value outside
// int64 (a uint64 past 2^63 - 1, an infinity, NaN, 1e30) is an InvalidArgumentError naming `what` (a double cast to
// int64 out of range is undefined behaviour: a Loop's trip count of INT64_MAX read through a double was one).
std::int64_t scalar_as_int64(const Tensor& t, const std::string& what);

// The one element of a numeric tensor as double, or nullopt when `t` is null, a bool, or has other than one element
// (the passes' "is this a scalar constant?", which must not throw).
std::optional<double> one_element_value(const Tensor* t);

// Every element of a numeric CPU tensor as double (16-bit floats converted), in row-major order: the graph passes'
// arithmetic on constants. A tensor elsewhere than on the CPU is an internal error.
std::vector<double> to_doubles(const Tensor& t);
// Every element of a numeric CPU tensor as an int64, in row-major order: integers exactly (a uint64 past 2^63 - 1
// saturated), floating-point values truncated and saturated to int64's range, NaN as 0. The graph passes' shapes and
// axes read from constants: a double cast to int64 out of range is undefined behaviour, and an int64 near 2^63 does
// not survive a round trip through double (a Reshape target of INT64_MAX was one, found by fuzz_model_structure).
std::vector<std::int64_t> to_int64s(const Tensor& t);
// A new CPU tensor of `shape` and `dtype` holding `values` (rounded to `dtype`, integers truncated, as a C++ cast
// does); values.size() must be the shape's element count (internal error otherwise). The graph passes' constants and
// the cuda_raw kernels' scalar attributes as `dtype` bits.
Tensor from_doubles(const std::vector<std::int64_t>& shape, DType dtype, const std::vector<double>& values);

}  // namespace xpuruntime::detail
