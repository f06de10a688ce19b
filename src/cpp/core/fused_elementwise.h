// Fused elementwise programs: what the elementwise_fusion pass makes of a chain of pointwise ops, what the op
// `fused_elementwise` runs, and the CUDA C that the codegen backend generates and compiles for it.
//
// Note [Fused elementwise programs]
// A group of elementwise ops whose intermediate values nobody else reads (Add, Mul, Sigmoid, Erf, ... of one float
// dtype, every one the shape of the group's output, inputs broadcasting to it) becomes one node with a program:
// instructions separated by ';', each an op and one or two operands, `x<k>` for input k of the node and `t<k>` for
// the result of instruction k; the last instruction is the output:
//
//     "neg x0; exp t0; add t1 x1; div x0 t2"      y = x0 / (exp(-x0) + x1)
//
// Every instruction computes in float32 (the inputs are widened once, the output rounded once), like the cuda_raw
// kernels (Note [fp32 compute]); so a fused group may differ from the unfused ops in float16/bfloat16 by the
// roundings of its intermediates, which it no longer makes. The cpu kernel interprets the program; the codegen
// backend writes it as CUDA C (cuda_source), with the shapes, broadcast strides and dtype of the launch baked in,
// and compiles it with NVRTC while the plan is built (backends/codegen).
//
// Casts and reductions. `f32`, `f16` and `bf16` are casts between the float dtypes: in float32 math a cast to
// float32 is nothing and a cast to float16/bfloat16 rounds to it (what the unfused Cast does). The inputs may have
// different float dtypes; the node's `output_dtype` attribute names the output's (default: input 0's). A program may
// reduce: `reduce_sum`, `reduce_mean` and `reduce_max` take their operand over a row, the last `row_axes` axes of the
// output (the node's attribute), and give one value per row that later instructions read at every element of the
// row (a keepdims reduction, broadcast back):
//
//     "f32 x0; mul t0 t0; reduce_mean t1; add t2 x1; sqrt t3; div t0 t4; f16 t5; mul t6 x2"     RMSNorm
//
// Every instruction is defined at every element of the output (an operand smaller than the output is read
// broadcast, which is what the ops did before fusion, as elementwise ops commute with broadcasting); a reduction
// sums its operand over the row of the element. The kernels run one row per warp or block: one pass over the row per
// reduction, then one that writes the row (Note [Row programs] in fused_elementwise.cpp).
//
// `rotate_half x<k>` is the rotary embedding's rotate_half, cat(-x[..., D/2:], x[..., :D/2]) over the output's last
// axis of even size D: at last coordinate c it reads input k at c + D/2, negated, below D/2 and at c - D/2 above. Its
// operand is an input (the pass makes it of the Slice/Neg/Concat the exporters write).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/quantize_ops.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/export.h"
#include "xpuruntime/low_bit.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::fused {

enum class Code : std::uint8_t {
  // binary
  kAdd, kSub, kMul, kDiv, kPow, kMax, kMin,
  // unary
  kNeg, kAbs, kRelu, kSigmoid, kTanh, kExp, kLog, kSqrt, kReciprocal, kErf, kGelu, kGeluTanh,
  kHardSigmoid,  // PyTorch's: min(1, max(0, a / 6 + 1 / 2)) (ONNX HardSigmoid with alpha 1/6, beta 1/2)
  kHardSwish,    // a * hard_sigmoid(a) (ONNX HardSwish)
  // casts (unary)
  kToF32, kToF16, kToBF16,
  // reductions over the row (unary)
  kReduceSum, kReduceMean, kReduceMax,
  // rotate_half of an input over the output's last axis (unary, an input operand only)
  kRotateHalf,
};

struct Operand {
  bool input = true;  // x<index> (an input of the node) or t<index> (an earlier instruction)
  int index = 0;
};

struct Instruction {
  Code code = Code::kAdd;
  Operand a;
  Operand b;  // binary ops only
};

struct XPURT_API Program {
  std::vector<Instruction> code;
  std::size_t num_inputs = 0;
  std::string text() const;  // the canonical program text (parse(text()) gives the same program)
  bool reduces() const;       // whether an instruction is a reduction
  bool rotates() const;       // whether an instruction is a rotate_half
};

XPURT_API const char* code_name(Code code);  // "add", "sigmoid", ...
XPURT_API bool is_binary(Code code);
XPURT_API bool is_reduction(Code code);
// Whether rotate_half negates at last coordinate c of `last` (below half, where it reads c + last / 2).
inline bool rotate_half_negates(std::int64_t c, std::int64_t last) { return c < last / 2; }
// The instruction's op by name; false when there is none.
XPURT_API bool code_from_name(const std::string& name, Code* code);
// Calls f(Operand&) on every input operand (x<k>) of `program`'s instructions: renumbering a program's inputs.
template <typename F>
void for_each_input(Program& program, F f) {
  for (Instruction& in : program.code) {
    if (in.a.input) f(in.a);
    if (is_binary(in.code) && in.b.input) f(in.b);
  }
}
// Parses and validates a program over `num_inputs` inputs (InvalidArgumentError naming what is wrong: an unknown op,
// an operand out of range or not yet computed, an input never read, an empty program).
XPURT_API Program parse(const std::string& text, std::size_t num_inputs);

// Note [Inputs read through a view]
// A node's input may be read through a strided view of the tensor it names (the node's `input_views` attribute):
// the program reads a tensor of the view's `shape` whose element (c0, c1, ...) is the stored tensor's element
// offset + c0 * strides[0] + c1 * strides[1] + ... (elements, all >= 0). The fused_input_views pass sets it where a
// fused node's input was a chain of Slices, Transposes and Reshapes of a tensor: what those ops would copy (a q, k or
// gate cut of a packed projection, a head transpose) the generated kernel reads in place. The attribute is a list of
// ints, for each viewed input k: k, the view's rank r, its offset, its r dims, its r strides. Every element the view
// reaches lies inside the stored tensor (input_views() checks it: a view past the end is an InvalidArgumentError).
struct XPURT_API InputView {
  std::int64_t offset = 0;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  bool operator==(const InputView& o) const { return offset == o.offset && shape == o.shape && strides == o.strides; }
};
using InputViews = std::vector<std::optional<InputView>>;  // per input; nullopt: read as stored (row-major)
constexpr std::size_t kMaxViewRank = 8;  // the largest rank a view may have
// The views `attrs` declare for inputs of `stored` shapes (empty when there is no input_views attribute);
// InvalidArgumentError for a malformed attribute or a view that reaches past its tensor.
XPURT_API InputViews input_views(const Attributes& attrs, const std::vector<std::vector<std::int64_t>>& stored);
// Writes `views` as the input_views attribute (nothing when no input has a view).
XPURT_API void set_input_views(Attributes* attrs, const InputViews& views);
// The shapes the program reads: each input's view's shape, or its stored shape.
XPURT_API std::vector<std::vector<std::int64_t>> read_shapes(const InputViews& views,
                                                             const std::vector<std::vector<std::int64_t>>& stored);

// How one input is read for an output of `dims` (the output's shape with adjacent axes merged where every input
// allows it): its stride per output axis, in elements (0 where it broadcasts).
struct XPURT_API Layout {
  std::vector<std::int64_t> dims;                  // merged output shape (at least one axis)
  std::vector<std::vector<std::int64_t>> strides;  // per input, per axis of `dims`
  std::int64_t numel = 0;
  std::int64_t row = 1;  // elements per row: the product of the output's last row_axes axes (numel when 0 axes)
  std::int64_t last = 1;  // the output's last axis (rotate_half's D; 1 for a 0-d output)
  std::int64_t rows() const { return row == 0 ? 0 : numel / row; }
  bool full(std::size_t input) const;    // reads element i for output element i (same shape as the output)
  bool scalar(std::size_t input) const;  // reads one element for every output element
};
// The layout of inputs of `input_shapes` broadcast to `output_shape` (numpy broadcasting; the shapes are valid), rows
// of the output's last `row_axes` axes (InvalidArgumentError past its rank). An input with a view in `views` is read
// through it (its shape in `input_shapes` is the view's, read_shapes(); its strides the view's, its offset the
// caller's to add to the input's pointer).
XPURT_API Layout layout(const std::vector<std::vector<std::int64_t>>& input_shapes,
                        const std::vector<std::int64_t>& output_shape, std::int64_t row_axes = 0,
                        const InputViews& views = {});
// InvalidArgumentError when `program` has a rotate_half and the output's last axis is not of even size >= 2.
XPURT_API void check_rotate_half(const Program& program, const Layout& layout);

// Note [Pieces of a concatenation]
// A fused node may compute a Concat of programs: its `pieces` attribute [axis, n_0, ..., n_{P-1}] (P >= 2, every
// n_p >= 1, 0 <= axis < the output's rank) cuts the output along `axis` into slabs of n_p, and its `program` holds one
// program per piece separated by " | ", each over the node's inputs it reads (x<k> is the node's input k, as in one
// program; a piece need not read every input, but every input is read by some piece). Piece p is computed as a node
// of its own would compute it for an output of the node's shape with n_p along the axis, and stored into the slab
// that starts at n_0 + ... + n_{p-1}: the node is Concat(piece_0, ..., piece_{P-1}, axis) with every piece written
// once, in place. The concat_fusion pass makes one of a Concat whose inputs are fused nodes that only it reads
// (GPT-NeoX's rotated quarter of a head and its pass-through part: two kernels and the Concat's copy were three
// passes over the head). Pieces do not reduce (row_axes 0) and their output is float32, float16 or bfloat16.
struct XPURT_API Piece {
  Program program;                  // over the piece's own inputs: its x<j> is the node's input inputs[j]
  std::vector<std::size_t> inputs;  // the node's inputs the piece reads, ascending
  std::int64_t size = 0;            // its extent along the axis
};
struct XPURT_API Pieces {
  std::int64_t axis = 0;
  std::vector<Piece> pieces;  // empty: the node runs one program
  bool empty() const { return pieces.empty(); }
  std::string text() const;  // the program attribute (the pieces' texts over the node's inputs, joined by " | ")
  std::int64_t inner(const std::vector<std::int64_t>& output_shape) const;  // elements per step along the axis
};
// The pieces `attrs` declare for a node of `num_inputs` inputs (empty without a pieces attribute); InvalidArgumentError
// for a malformed attribute, a program per piece missing, a piece's bad program, an input no piece reads, row_axes or
// a quantized output_dtype beside pieces.
XPURT_API Pieces pieces(const Attributes& attrs, std::size_t num_inputs);
// The output shape of pieced inputs of `read_shapes` (each piece's inputs broadcast together, the pieces equal but
// along the axis, which they sum); InvalidArgumentError where they do not fit.
XPURT_API std::vector<std::int64_t> pieces_output_shape(const Pieces& pieces,
                                                        const std::vector<std::vector<std::int64_t>>& read_shapes);
// Each piece's layout: its inputs (read_shapes and views of the node's inputs) broadcast to its slab of `output_shape`.
XPURT_API std::vector<Layout> piece_layouts(const Pieces& pieces,
                                            const std::vector<std::vector<std::int64_t>>& read_shapes,
                                            const InputViews& views, const std::vector<std::int64_t>& output_shape);
// The dtypes of a piece's inputs among the node's.
XPURT_API std::vector<DType> piece_dtypes(const Piece& piece, const std::vector<DType>& input_dtypes);
// Elements per thread step of a pieced kernel: a width every piece takes whose vectors stay inside one slab.
XPURT_API int pieces_vector_width(const Pieces& pieces, const std::vector<Layout>& layouts,
                                  const std::vector<DType>& input_dtypes, DType output_dtype,
                                  const std::vector<std::int64_t>& output_shape);

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kSqrtTwoOverPi = 0.79788456080286536f;

// One instruction in float32 (the cpu kernel's math; cuda_source writes the same).
inline float apply(Code code, float a, float b) {
  switch (code) {
    case Code::kAdd: return a + b;
    case Code::kSub: return a - b;
    case Code::kMul: return a * b;
    case Code::kDiv: return a / b;
    case Code::kPow: return std::pow(a, b);
    case Code::kMax: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case Code::kMin: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case Code::kNeg: return -a;
    case Code::kAbs: return std::fabs(a);
    case Code::kRelu: return a < 0.0f ? 0.0f : a;
    case Code::kSigmoid: return 1.0f / (1.0f + std::exp(-a));
    case Code::kTanh: return std::tanh(a);
    case Code::kExp: return std::exp(a);
    case Code::kLog: return std::log(a);
    case Code::kSqrt: return std::sqrt(a);
    case Code::kReciprocal: return 1.0f / a;
    case Code::kErf: return std::erf(a);
    case Code::kGelu: return 0.5f * a * (1.0f + std::erf(a * kSqrtHalf));
    case Code::kGeluTanh: return 0.5f * a * (1.0f + std::tanh(kSqrtTwoOverPi * (a + 0.044715f * a * a * a)));
    // NaN in, NaN out (fmin/fmax would drop it).
    case Code::kHardSigmoid: return std::isnan(a) ? a : std::fmin(1.0f, std::fmax(0.0f, a * (1.0f / 6.0f) + 0.5f));
    case Code::kHardSwish: return a * std::fmin(1.0f, std::fmax(0.0f, a * (1.0f / 6.0f) + 0.5f));
    case Code::kToF32: return a;
    case Code::kToF16: return detail::half_to_float(detail::float_to_half(a));
    case Code::kToBF16: return detail::bfloat16_to_float(detail::float_to_bfloat16(a));
    case Code::kReduceSum:
    case Code::kReduceMean:
    case Code::kReduceMax: break;  // over a row: reduce_init/reduce_step/reduce_finish
    case Code::kRotateHalf: break;  // reads its input elsewhere: the kernels do it
  }
  return 0.0f;
}

// Note [Quantized output of a fused program]
// A fused node whose output_dtype is int8, uint8, float8e4m3fn or float8e5m2 ends in ONNX's QuantizeLinear per
// tensor: the elementwise_fusion pass absorbs the QuantizeLinear that alone reads a group's float output (the residual
// Add -> Relu -> Q of a quantized CNN, the GELU -> Q of a quantized transformer's MLP), which otherwise reads the
// group's output back from memory in a pass of its own. The program's last value v is stored as
//   int8, uint8     saturate(round_half_even(v / y_scale) + y_zero_point), a NaN quotient stored as the zero point;
//   float8          v / y_scale + 0 (y_zero_point, 0: the pass fuses no other; -0 becomes +0) rounded once to the
//                   format, to nearest even, saturating to +-max (QuantizeLinear-19's saturate=1: infinities too), a
//                   NaN keeping its sign;
// the division in float32, as the registry's quantize_linear computes it. y_scale (finite, > 0) and y_zero_point (in
// the output's range) are the node's attributes. Where the group's value was float16 or bfloat16 the program ends in
// that cast, so the quantized levels equal the unfused plan's.
struct OutputQuantization {
  float scale = 1.0f;
  std::int32_t zero_point = 0;
};
inline bool quantized_output(DType dtype) {
  return dtype == DType::kInt8 || dtype == DType::kUInt8 || dtype == DType::kFloat8E4M3FN ||
         dtype == DType::kFloat8E5M2;
}
// The node's y_scale and y_zero_point for an output of `dtype` (quantized_output); InvalidArgumentError for a scale
// that is not finite and positive in float32, or a zero point outside the output's range (not 0 for float8).
XPURT_API OutputQuantization output_quantization(const Attributes& attrs, DType dtype);
// The registry op fused_elementwise's attributes from a com.xpuruntime:FusedElementwise node's (program, row_axes,
// output_dtype, y_scale, y_zero_point): what the native engine's lowering and the node kernel pass on.
XPURT_API Attributes registry_attributes(const Attributes& node);
// The byte a quantized output stores for `v` (the cpu kernel's; cuda_source writes the same): the int8/uint8 level
// (int8 as two's complement) or the float8 code.
inline std::uint8_t quantized_byte(float v, const OutputQuantization& q, DType dtype) {
  if (is_float8_dtype(dtype)) {  // + the zero point 0, as quantize_linear adds it (-0 becomes +0)
    return detail::float8_from_double(static_cast<double>(v / q.scale) + q.zero_point, dtype, true);
  }
  int lo = 0, hi = 0;
  quantize_ops::integer_range(dtype, &lo, &hi);
  // through int: the level may be negative (int8, stored as two's complement)
  return static_cast<std::uint8_t>(static_cast<int>(quantize_ops::integer_level(v / q.scale, q.zero_point, lo, hi)));
}

// A reduction's accumulator: its start, one step, and the row's value from the accumulator over `row` elements.
inline float reduce_init(Code code) { return code == Code::kReduceMax ? -INFINITY : 0.0f; }
inline float reduce_step(Code code, float acc, float v) {
  if (code != Code::kReduceMax) return acc + v;
  return std::isnan(acc) || std::isnan(v) ? NAN : std::max(acc, v);
}
inline float reduce_finish(Code code, float acc, std::int64_t row) {
  return code == Code::kReduceMean ? acc / static_cast<float>(row) : acc;
}


// How a generated kernel is launched: threads per block; elements per thread step (`vec`, Note [Vectorised programs]
// in fused_elementwise.cpp); for a program that reduces, threads per row (4 to 32: a group of lanes per row,
// blockDim.x / row_threads rows per block; else the block) and rows per block.
struct XPURT_API LaunchShape {
  int threads = 256;
  int vec = 1;
  int row_threads = 0;  // 0: no reduction (a grid-stride loop over elements)
  std::int64_t rows_per_block = 1;
};
// The elements per thread step of `program`'s kernel for `layout` and these dtypes (1: element by element).
XPURT_API int vector_width(const Program& program, const Layout& layout, const std::vector<DType>& input_dtypes,
                           DType output_dtype);
XPURT_API LaunchShape launch_shape(const Program& program, const Layout& layout,
                                   const std::vector<DType>& input_dtypes, DType output_dtype);

// The CUDA C of a kernel `extern "C" __global__ void <name>(const T0* x0, ..., Y* y)` computing `program` for
// `layout`, inputs of `input_dtypes` and an output of `output_dtype`, launched as `launch_shape` says (a grid-stride
// loop over elements, or over rows); no header needed (NVRTC).
// An int8/uint8 output is quantized by `quantization` (Note [Quantized output of a fused program]).
XPURT_API std::string cuda_source(const Program& program, const Layout& layout, const std::vector<DType>& input_dtypes,
                                  DType output_dtype, const std::string& name,
                                  const OutputQuantization& quantization = {});
// The CUDA C of a pieced node's kernel (Note [Pieces of a concatenation]): a grid-stride loop over the pieces' elements
// one piece after the other, each step computing its piece's program at the piece's own index and storing it into
// the piece's slab; same signature as cuda_source.
XPURT_API std::string cuda_source(const Pieces& pieces, const std::vector<Layout>& layouts,
                                  const std::vector<DType>& input_dtypes, DType output_dtype,
                                  const std::vector<std::int64_t>& output_shape, const std::string& name);
// Compiles a generated kernel's source with NVRTC for sm_<arch> into a cubin: the codegen backend's compiler
// (backends/codegen; no GPU needed). UnsupportedOperationError with NVRTC's log when the source does not compile, or
// saying what to install when NVRTC cannot be loaded or the library was built without the codegen backend.
XPURT_API std::string compile_cubin(const std::string& source, const std::string& name, int arch);
// FNV-1a 64 of `text`, as 16 hex digits: the generated kernels' names and cache keys.
XPURT_API std::string hash_hex(const std::string& text);

}  // namespace xpuruntime::fused
