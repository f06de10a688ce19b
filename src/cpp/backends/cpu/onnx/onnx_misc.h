// What the misc-group ONNX reference ops share (quantization, signal, losses, random, training): the
// registration function of each onnx_misc_*.cpp file, ONNX's element-type numbers and whole-tensor conversions
// to and from double. Internal header of src/cpp/backends/cpu/onnx/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/onnx/onnx_common.h"

namespace xpuruntime::onnx_ref {

// One per source file, all called by register_misc_ops (onnx_misc.cpp).
// onnx_misc_quant.cpp: (De)QuantizeLinear, *Integer, QLinear*
void register_misc_quantization_ops(NodeKernelRegistrar& kernels);
// onnx_misc_signal.cpp: DFT, STFT, windows, MelWeightMatrix
void register_misc_signal_ops(NodeKernelRegistrar& kernels);
// onnx_misc_math.cpp: losses, Det, TfIdfVectorizer, training
void register_misc_math_ops(NodeKernelRegistrar& kernels);
// onnx_misc_random.cpp: Random*, Bernoulli
void register_misc_random_ops(NodeKernelRegistrar& kernels);

// The helpers live in their own namespace: other groups' files define helpers of the same names in onnx_ref.
namespace misc {

// The DType of an ONNX TensorProto.DataType number (an op's `dtype`/`output_datatype` attribute).
// InvalidTypeError naming `where` and the attribute for types our Tensor cannot hold (strings, uint16, ...).
DType dtype_from_onnx(std::int64_t onnx_type, const std::string& where, const std::string& attribute);

// Every element of `t` (any dtype, float8 and int4/uint4 included) as double, in row-major order.
ScratchVector<double> to_doubles(const Tensor& t);
// One element of a one-byte low-bit dtype (float8, int4/uint4 held unpacked: Note [Float8 and 4-bit dtypes]) or of
// uint8, as double.
double byte_value(std::uint8_t byte, DType dtype);
// Writes `values` (one per element, row-major) into `t`, converting to its dtype (integers: truncation toward
// zero, as a C++ cast; bool: nonzero). Callers round and saturate first where ONNX says so. float8 rounds to
// nearest even with ONNX's Cast rules for `saturate`; int4/uint4 saturate and round to nearest even (Note [Float8
// and 4-bit dtypes], xpuruntime/low_bit.h).
void store_doubles(Tensor& t, const ScratchVector<double>& values, bool saturate = true);

// "[2,3,4]": a shape for error messages.
std::string shape_str(const std::vector<std::int64_t>& shape);

// Round half to even (ONNX's rounding for quantization), in double.
double round_half_even(double v);

}  // namespace misc

}  // namespace xpuruntime::onnx_ref
