// Fused elementwise programs: parsing, layouts, the CPU interpreter and the CUDA C generator (Note [Fused elementwise
// programs] in fused_elementwise.h).
#include "core/fused_elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>

#include "core/fnv1a.h"
#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::fused {

namespace {

struct CodeInfo {
  Code code;
  const char* name;
  bool binary;
};

constexpr CodeInfo kCodes[] = {
    {Code::kAdd, "add", true},       {Code::kSub, "sub", true},         {Code::kMul, "mul", true},
    {Code::kDiv, "div", true},       {Code::kPow, "pow", true},         {Code::kMax, "max", true},
    {Code::kMin, "min", true},       {Code::kNeg, "neg", false},        {Code::kAbs, "abs", false},
    {Code::kRelu, "relu", false},    {Code::kSigmoid, "sigmoid", false}, {Code::kTanh, "tanh", false},
    {Code::kExp, "exp", false},      {Code::kLog, "log", false},        {Code::kSqrt, "sqrt", false},
    {Code::kReciprocal, "reciprocal", false}, {Code::kErf, "erf", false}, {Code::kGelu, "gelu", false},
    {Code::kGeluTanh, "gelu_tanh", false}, {Code::kHardSigmoid, "hard_sigmoid", false},
    {Code::kHardSwish, "hard_swish", false},
    {Code::kToF32, "f32", false},    {Code::kToF16, "f16", false},      {Code::kToBF16, "bf16", false},
    {Code::kReduceSum, "reduce_sum", false}, {Code::kReduceMean, "reduce_mean", false},
    {Code::kReduceMax, "reduce_max", false}, {Code::kRotateHalf, "rotate_half", false},
};

const CodeInfo& info(Code code) {
  for (const CodeInfo& c : kCodes) {
    if (c.code == code) return c;
  }
  throw XpuRuntimeError("fused: unknown instruction code");
}

std::string operand_text(const Operand& o) { return (o.input ? "x" : "t") + std::to_string(o.index); }

// The CUDA C expression of an instruction over operand expressions `a` and `b` (the same math as apply()).
std::string cuda_expression(Code code, const std::string& a, const std::string& b) {
  switch (code) {
    case Code::kAdd: return a + " + " + b;
    case Code::kSub: return a + " - " + b;
    case Code::kMul: return a + " * " + b;
    case Code::kDiv: return a + " / " + b;
    case Code::kPow: return "powf(" + a + ", " + b + ")";
    case Code::kMax: return "(isnan(" + a + ") || isnan(" + b + ") ? __int_as_float(0x7fc00000) : fmaxf(" + a + ", " + b + "))";
    case Code::kMin: return "(isnan(" + a + ") || isnan(" + b + ") ? __int_as_float(0x7fc00000) : fminf(" + a + ", " + b + "))";
    case Code::kNeg: return "-" + a;
    case Code::kAbs: return "fabsf(" + a + ")";
    case Code::kRelu: return "(" + a + " < 0.0f ? 0.0f : " + a + ")";
    case Code::kSigmoid: return "1.0f / (1.0f + expf(-" + a + "))";
    case Code::kTanh: return "tanhf(" + a + ")";
    case Code::kExp: return "expf(" + a + ")";
    case Code::kLog: return "logf(" + a + ")";
    case Code::kSqrt: return "sqrtf(" + a + ")";
    case Code::kReciprocal: return "1.0f / " + a;
    case Code::kErf: return "erff(" + a + ")";
    case Code::kGelu: return "0.5f * " + a + " * (1.0f + erff(" + a + " * 0.70710678118654752f))";
    case Code::kGeluTanh:
      return "0.5f * " + a + " * (1.0f + tanhf(0.79788456080286536f * (" + a + " + 0.044715f * " + a + " * " + a +
             " * " + a + ")))";
    case Code::kHardSigmoid:
      return "(isnan(" + a + ") ? " + a + " : fminf(1.0f, fmaxf(0.0f, " + a + " * (1.0f / 6.0f) + 0.5f)))";
    case Code::kHardSwish: return a + " * fminf(1.0f, fmaxf(0.0f, " + a + " * (1.0f / 6.0f) + 0.5f))";
    case Code::kToF32: return a;
    case Code::kToF16: return "ld_float16(st_float16(" + a + "))";
    case Code::kToBF16: return "ld_bfloat16(st_bfloat16(" + a + "))";
    case Code::kReduceSum:
    case Code::kReduceMean:
    case Code::kReduceMax: break;  // written by cuda_source's row loops
    case Code::kRotateHalf: break;  // written by cuda_source's body (a load of its own)
  }
  return "0.0f";
}

// The CUDA C helpers that load and store `dtype` as float ("ld_<dtype>", "st_<dtype>").
std::string dtype_helpers(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "__device__ __forceinline__ float ld_float16(unsigned short v) { float f; "
             "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(v)); return f; }\n"
             "__device__ __forceinline__ unsigned short st_float16(float f) { unsigned short h; "
             "asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n";
    case DType::kBFloat16:
      return "__device__ __forceinline__ float ld_bfloat16(unsigned short v) { return __uint_as_float(((unsigned)v) "
             "<< 16); }\n"
             "__device__ __forceinline__ unsigned short st_bfloat16(float f) { unsigned short h; "
             "asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n";
    default:
      return "__device__ __forceinline__ float ld_float32(float v) { return v; }\n"
             "__device__ __forceinline__ float st_float32(float f) { return f; }\n";
  }
}

// The load and store helpers of the float dtypes in `used` (the kernel's inputs and output), and of those that
// `programs` round to (f16, bf16), in one order: float32, float16, bfloat16.
std::string float_helpers(std::vector<DType> used, const std::vector<const Program*>& programs) {
  for (const Program* program : programs) {
    for (const Instruction& in : program->code) {
      if (in.code == Code::kToF16) used.push_back(DType::kFloat16);
      if (in.code == Code::kToBF16) used.push_back(DType::kBFloat16);
    }
  }
  std::string out;
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    if (std::find(used.begin(), used.end(), d) != used.end()) out += dtype_helpers(d);
  }
  return out;
}

const char* storage_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float";
    case DType::kInt8: return "signed char";
    case DType::kUInt8:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2: return "unsigned char";
    default: return "unsigned short";
  }
}

// The store helper of a quantized output ("st_int8", "st_float8e4m3fn", ...; Note [Quantized output of a fused
// program]): the scale as its float32 bits, the quotient IEEE's. Where the scale and its reciprocal r are normal floats
// the quotient takes no division: q = f * r and one Markstein correction with the exact remainder, q + (f - q s) r,
// correctly rounded wherever q is a normal float or zero (the division's slow path otherwise), as the cuda_raw
// per-tensor QuantizeLinear forms it (Note [Per-tensor float8 quantization without a division] in
// backends/cuda_raw/quantize.cu); other scales divide. Integers: rintf rounds half to even as nearbyint does.
// Float8: below the smallest normal (2^-6 in e4m3fn, 2^-14 in e5m2) the code is the quotient in units of the smallest
// subnormal, rounded by rintf (the count 8 or 4 is the smallest normal's code);
// above, the float32 bits rounded to the format's mantissa width, ties to even, by adding half a unit less one plus
// the kept lowest bit (a carry moves the exponent, which is right). Clamping to +-max first is the saturation: a value
// between max and the next code up rounds to max or overflows, and saturates to max either way. On sm_89 and newer
// one cvt.rn.satfinite instruction does the same rounding and saturation (cuda_fp8.h's conversion there). The zero
// point 0 is added (as quantize_linear adds it: -0 becomes +0); a NaN's sign is f's (the scale is positive), whatever
// the division's NaN is. Where the stored value is a float16 value (the program ends in f16, as a float16 plan's group
// before its QuantizeLinear) and r is within 2^-100..2^100, q is always a normal float, zero, an infinity or NaN: the
// correction then takes no branch (an infinite f is its own quotient; a NaN stays NaN; a zero quotient may come out
// +0 where the division gives -0, which the + 0 below makes +0 in either case, and which rounds to the same level).
std::string quantized_store(DType dtype, const OutputQuantization& q, bool half_valued) {
  const char* type = storage_type(dtype);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &q.scale, sizeof(bits));
  const float reciprocal = 1.0f / q.scale;  // correctly rounded (IEEE division)
  std::uint32_t rbits = 0;
  std::memcpy(&rbits, &reciprocal, sizeof(rbits));
  const bool markstein = std::isnormal(q.scale) && std::isnormal(reciprocal);
  const std::string scale = detail::str_cat("__int_as_float(", bits, ")");
  const bool branch_free = markstein && half_valued && reciprocal >= 0x1p-100f && reciprocal <= 0x1p100f;
  const std::string quotient =
      branch_free ? detail::str_cat("const float rs = __int_as_float(", rbits, "); const float p = __fmul_rn(f, rs); ",
                                    "float s = __fmaf_rn(__fmaf_rn(-p, ", scale, ", f), rs, p); if (isinf(f)) s = f; ")
      : markstein ? detail::str_cat("float s; { const float r = __int_as_float(", rbits, "); ",
                                  "const float p = __fmul_rn(f, r); ",
                                  "if (f == 0.0f || (fabsf(p) >= 1.17549435e-38f && fabsf(p) <= 3.40282347e+38f)) { ",
                                  "const float e = __fmaf_rn(-p, ", scale, ", f); ",
                                  "s = e == 0.0f ? p : __fmaf_rn(e, r, p); } else { s = f / ", scale, "; } } ")
                : detail::str_cat("const float s = f / ", scale, "; ");
  const std::string head =
      detail::str_cat("__device__ __forceinline__ ", type, " st_", dtype_name(dtype), "(float f) { ", quotient);
  if (is_float8_dtype(dtype)) {
    const bool e4m3 = dtype == DType::kFloat8E4M3FN;
    const int mantissa = e4m3 ? 3 : 2;
    const int drop = 23 - mantissa;  // float32 mantissa bits dropped
    const int bias = e4m3 ? 7 : 15;
    return detail::str_cat(
        head, "if (s != s) return (", type, ")(((__float_as_uint(f) >> 24) & 0x80u) | 0x7Fu); const float z = s + ",
        "0.0f;\n#if __CUDA_ARCH__ >= 890\n  unsigned short h; asm(\"cvt.rn.satfinite.", e4m3 ? "e4m3x2" : "e5m2x2",
        ".f32 %0, %1, %2;\" : \"=h\"(h) : \"f\"(0.0f), \"f\"(z)); return (", type, ")(h & 0xFFu);\n#else\n  ",
        "const unsigned sign = (__float_as_uint(z) >> 24) & 0x80u; const float a = fminf(fabsf(z), ",
        e4m3 ? "448.0f" : "57344.0f", "); unsigned code; ",
        "if (a < ", e4m3 ? "0.015625f" : "6.103515625e-05f", ") { code = (unsigned)rintf(a * ",
        e4m3 ? "512.0f" : "65536.0f", "); } else { unsigned u = __float_as_uint(a); u += ", (1u << (drop - 1)) - 1u,
        "u + ((u >> ", drop, ") & 1u); code = (((u >> 23) - ", 127 - bias, "u) << ", mantissa, ") | ((u >> ", drop,
        ") & ", (1u << mantissa) - 1u, "u); } return (", type, ")(sign | code);\n#endif\n}\n");
  }
  int lo = 0, hi = 0;
  quantize_ops::integer_range(dtype, &lo, &hi);
  return detail::str_cat(head, "float r = s != s ? ", q.zero_point, ".0f : rintf(s) + ", q.zero_point,
                         ".0f; r = fminf(fmaxf(r, ", lo, ".0f), ", hi, ".0f); return (", type, ")r; }\n");
}

}  // namespace

Attributes registry_attributes(const Attributes& node) {
  Attributes a;
  a.set("program", node.get_string("program", ""));
  if (node.has("row_axes")) a.set("row_axes", node.get_int("row_axes", 0));
  if (node.has("output_dtype")) a.set("output_dtype", node.get_string("output_dtype", ""));
  // An int8/uint8 output's QuantizeLinear (Note [Quantized output of a fused program]).
  if (node.has("y_scale")) a.set("y_scale", node.get_float("y_scale", 0.0));
  if (node.has("y_zero_point")) a.set("y_zero_point", node.get_int("y_zero_point", 0));
  if (node.has("input_views")) a.set("input_views", node.get_ints("input_views", {}));  // Note [Inputs read ...]
  if (node.has("pieces")) a.set("pieces", node.get_ints("pieces", {}));  // Note [Pieces of a concatenation]
  return a;
}

InputViews input_views(const Attributes& attrs, const std::vector<std::vector<std::int64_t>>& stored) {
  InputViews views;
  if (!attrs.has("input_views")) return views;
  views.resize(stored.size());
  const std::vector<std::int64_t> v = attrs.get_ints("input_views", {});
  auto fail = [](const std::string& why) {
    throw InvalidArgumentError("fused_elementwise: input_views (Note [Inputs read through a view]): " + why);
  };
  constexpr auto kMaxRank = static_cast<std::int64_t>(kMaxViewRank);
  std::size_t at = 0;
  while (at < v.size()) {
    if (v.size() - at < 3) fail(detail::str_cat("a view at position ", at, " is cut short"));
    const std::int64_t k = v[at], rank = v[at + 1], offset = v[at + 2];
    if (k < 0 || static_cast<std::size_t>(k) >= stored.size()) {
      fail(detail::str_cat("input ", k, " of a node of ", stored.size(), " inputs"));
    }
    if (views[static_cast<std::size_t>(k)]) fail(detail::str_cat("input ", k, " has two views"));
    if (rank < 0 || rank > kMaxRank) fail(detail::str_cat("input ", k, ": rank ", rank, " (0 to 8)"));
    if (offset < 0) fail(detail::str_cat("input ", k, ": offset ", offset, " < 0"));
    at += 3;
    const auto r = static_cast<std::size_t>(rank);
    if (v.size() - at < 2 * r) fail(detail::str_cat("input ", k, ": fewer than ", 2 * r, " dims and strides"));
    InputView view;
    view.offset = offset;
    view.shape.assign(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + r));
    view.strides.assign(v.begin() + static_cast<std::ptrdiff_t>(at + r),
                        v.begin() + static_cast<std::ptrdiff_t>(at + 2 * r));
    at += 2 * r;
    // The last element the view reaches, and the stored tensor's size: the view must stay inside it.
    std::int64_t reach = offset, size = 1, count = 1;
    bool overflow = false;
    for (std::size_t d = 0; d < r; ++d) {
      if (view.shape[d] < 0 || view.strides[d] < 0) {
        fail(detail::str_cat("input ", k, ": dim ", view.shape[d], ", stride ", view.strides[d], " (both >= 0)"));
      }
      std::int64_t step = 0;
      overflow = overflow || __builtin_mul_overflow(view.shape[d] == 0 ? 0 : view.shape[d] - 1, view.strides[d], &step);
      overflow = overflow || __builtin_add_overflow(reach, step, &reach);
      overflow = overflow || __builtin_mul_overflow(count, view.shape[d], &count);
    }
    for (std::int64_t d : stored[static_cast<std::size_t>(k)]) {
      overflow = overflow || __builtin_mul_overflow(size, d, &size);
    }
    if (overflow) fail(detail::str_cat("input ", k, ": the view's extent overflows int64"));
    if (count > 0 && reach >= size) {
      fail(detail::str_cat("input ", k, ": the view ", detail::shape_str(view.shape, ","), " (strides ",
                           detail::shape_str(view.strides, ","), ", offset ", offset, ") reaches element ", reach,
                           " of a tensor of ", size));
    }
    views[static_cast<std::size_t>(k)] = std::move(view);
  }
  return views;
}

void set_input_views(Attributes* attrs, const InputViews& views) {
  std::vector<std::int64_t> v;
  for (std::size_t k = 0; k < views.size(); ++k) {
    if (!views[k]) continue;
    v.push_back(static_cast<std::int64_t>(k));
    v.push_back(static_cast<std::int64_t>(views[k]->shape.size()));
    v.push_back(views[k]->offset);
    v.insert(v.end(), views[k]->shape.begin(), views[k]->shape.end());
    v.insert(v.end(), views[k]->strides.begin(), views[k]->strides.end());
  }
  if (!v.empty()) attrs->set("input_views", v);
}

std::vector<std::vector<std::int64_t>> read_shapes(const InputViews& views,
                                                   const std::vector<std::vector<std::int64_t>>& stored) {
  std::vector<std::vector<std::int64_t>> shapes = stored;
  for (std::size_t k = 0; k < views.size() && k < shapes.size(); ++k) {
    if (views[k]) shapes[k] = views[k]->shape;
  }
  return shapes;
}

OutputQuantization output_quantization(const Attributes& attrs, DType dtype) {
  OutputQuantization q;
  q.scale = static_cast<float>(attrs.get_float("y_scale", 0.0));
  if (!(q.scale > 0.0f) || !std::isfinite(q.scale)) {
    throw InvalidArgumentError(detail::str_cat("fused_elementwise: an ", dtype_name(dtype),
                                               " output needs y_scale finite and positive in float32, got ",
                                               attrs.get_float("y_scale", 0.0)));
  }
  const std::int64_t zero_point = attrs.get_int("y_zero_point", 0);
  int lo = 0, hi = 0;  // a float8 output's zero point is 0
  if (!is_float8_dtype(dtype)) quantize_ops::integer_range(dtype, &lo, &hi);
  if (zero_point < lo || zero_point > hi) {
    throw InvalidArgumentError(detail::str_cat("fused_elementwise: y_zero_point ", zero_point, " is outside the ",
                                               dtype_name(dtype), " output's range (float8: 0 only)"));
  }
  q.zero_point = static_cast<std::int32_t>(zero_point);
  return q;
}

const char* code_name(Code code) { return info(code).name; }
bool is_binary(Code code) { return info(code).binary; }
bool is_reduction(Code code) {
  return code == Code::kReduceSum || code == Code::kReduceMean || code == Code::kReduceMax;
}

bool Program::rotates() const {
  return std::any_of(code.begin(), code.end(), [](const Instruction& in) { return in.code == Code::kRotateHalf; });
}

void check_rotate_half(const Program& program, const Layout& layout) {
  if (program.rotates() && (layout.last < 2 || layout.last % 2 != 0)) {
    throw InvalidArgumentError(detail::str_cat("fused_elementwise: rotate_half needs an output whose last axis has an "
                                               "even size of 2 or more, got ", layout.last));
  }
}

bool Program::reduces() const {
  return std::any_of(code.begin(), code.end(), [](const Instruction& in) { return is_reduction(in.code); });
}

bool code_from_name(const std::string& name, Code* code) {
  for (const CodeInfo& c : kCodes) {
    if (name == c.name) {
      *code = c.code;
      return true;
    }
  }
  return false;
}

std::string Program::text() const {
  std::string out;
  for (std::size_t k = 0; k < code.size(); ++k) {
    const Instruction& in = code[k];
    out += (k ? "; " : "") + std::string(code_name(in.code)) + " " + operand_text(in.a);
    if (is_binary(in.code)) out += " " + operand_text(in.b);
  }
  return out;
}

namespace {

// parse(), where `every_input` says whether every input must be read (a piece reads some of the node's).
Program parse_program(const std::string& text, std::size_t num_inputs, bool every_input) {
  Program p;
  p.num_inputs = num_inputs;
  std::vector<bool> read(num_inputs, false);
  std::stringstream all(text);
  std::string item;
  auto fail = [&](const std::string& why) {
    throw InvalidArgumentError(detail::str_cat("fused_elementwise program '", text, "': ", why));
  };
  while (std::getline(all, item, ';')) {
    std::stringstream words(item);
    std::string op;
    std::vector<std::string> operands;
    words >> op;
    for (std::string w; words >> w;) operands.push_back(w);
    if (op.empty()) fail("an empty instruction");
    Instruction in;
    if (!code_from_name(op, &in.code)) {
      std::string known;
      for (const CodeInfo& c : kCodes) known += (known.empty() ? "" : ", ") + std::string(c.name);
      fail(detail::str_cat("unknown op '", op, "' (known: ", known, ")"));
    }
    const std::size_t arity = is_binary(in.code) ? 2 : 1;
    if (operands.size() != arity) fail(detail::str_cat("'", op, "' takes ", arity, " operand(s), got ", operands.size()));
    for (std::size_t k = 0; k < arity; ++k) {
      const std::string& w = operands[k];
      Operand o;
      if (w.size() < 2 || (w[0] != 'x' && w[0] != 't') ||
          w.find_first_not_of("0123456789", 1) != std::string::npos || w.size() > 10) {
        fail(detail::str_cat("operand '", w, "' is neither x<input> nor t<instruction>"));
      }
      o.input = w[0] == 'x';
      o.index = std::stoi(w.substr(1));
      if (o.input && static_cast<std::size_t>(o.index) >= num_inputs) {
        fail(detail::str_cat("operand '", w, "': the node has ", num_inputs, " inputs"));
      }
      if (!o.input && static_cast<std::size_t>(o.index) >= p.code.size()) {
        fail(detail::str_cat("operand '", w, "' reads an instruction that is not computed yet"));
      }
      if (o.input) read[static_cast<std::size_t>(o.index)] = true;
      if (in.code == Code::kRotateHalf && !o.input) fail("rotate_half reads an input (x<k>), not an instruction");
      (k == 0 ? in.a : in.b) = o;
    }
    p.code.push_back(in);
  }
  if (p.code.empty()) fail("no instruction");
  for (std::size_t k = 0; k < num_inputs && every_input; ++k) {
    if (!read[k]) fail(detail::str_cat("input x", k, " is never read"));
  }
  return p;
}

}  // namespace

Program parse(const std::string& text, std::size_t num_inputs) { return parse_program(text, num_inputs, true); }

std::string Pieces::text() const {
  std::string out;
  for (const Piece& piece : pieces) {
    Program global = piece.program;  // back to the node's input numbers
    for_each_input(global, [&](Operand& o) {
      o.index = static_cast<int>(piece.inputs.at(static_cast<std::size_t>(o.index)));
    });
    out += (out.empty() ? "" : " | ") + global.text();
  }
  return out;
}

Pieces pieces(const Attributes& attrs, std::size_t num_inputs) {
  Pieces out;
  if (!attrs.has("pieces")) return out;
  auto fail = [](const std::string& why) {
    throw InvalidArgumentError("fused_elementwise: pieces (Note [Pieces of a concatenation]): " + why);
  };
  const std::vector<std::int64_t> v = attrs.get_ints("pieces", {});
  if (v.size() < 3) fail(detail::str_cat("[axis, n_0, n_1, ...] of at least two pieces, got ", v.size(), " ints"));
  if (v[0] < 0 || v[0] >= 8) fail(detail::str_cat("axis ", v[0], " (0 to 7)"));
  if (attrs.get_int("row_axes", 0) != 0) fail("a pieced node does not reduce (row_axes must be 0)");
  if (attrs.has("output_dtype") && quantized_output(dtype_from_name(attrs.get_string("output_dtype", "")))) {
    fail("a pieced node's output is float32, float16 or bfloat16");
  }
  out.axis = v[0];
  const std::string text = attrs.get_string("program", "");
  std::vector<std::string> texts;
  for (std::size_t at = 0;;) {
    const std::size_t bar = text.find('|', at);
    texts.push_back(text.substr(at, bar == std::string::npos ? std::string::npos : bar - at));
    if (bar == std::string::npos) break;
    at = bar + 1;
  }
  if (texts.size() != v.size() - 1) {
    fail(detail::str_cat(v.size() - 1, " pieces but ", texts.size(), " programs separated by '|' in '", text, "'"));
  }
  std::vector<bool> read(num_inputs, false);
  for (std::size_t p = 0; p < texts.size(); ++p) {
    if (v[p + 1] < 1) fail(detail::str_cat("piece ", p, " has size ", v[p + 1], " (at least 1)"));
    Piece piece;
    piece.size = v[p + 1];
    piece.program = parse_program(texts[p], num_inputs, false);
    std::vector<int> local(num_inputs, -1);  // the node's input -> the piece's
    for_each_input(piece.program, [&](Operand& o) { local[static_cast<std::size_t>(o.index)] = 0; });
    for (std::size_t k = 0; k < num_inputs; ++k) {
      if (local[k] < 0) continue;
      local[k] = static_cast<int>(piece.inputs.size());
      piece.inputs.push_back(k);
      read[k] = true;
    }
    for_each_input(piece.program, [&](Operand& o) { o.index = local[static_cast<std::size_t>(o.index)]; });
    piece.program.num_inputs = piece.inputs.size();
    out.pieces.push_back(std::move(piece));
  }
  for (std::size_t k = 0; k < num_inputs; ++k) {
    if (!read[k]) fail(detail::str_cat("input x", k, " is read by no piece"));
  }
  return out;
}

std::vector<std::int64_t> pieces_output_shape(const Pieces& pieces,
                                              const std::vector<std::vector<std::int64_t>>& read_shapes) {
  std::size_t rank = static_cast<std::size_t>(pieces.axis) + 1;
  for (const auto& s : read_shapes) rank = std::max(rank, s.size());
  auto fail = [](const std::string& why) {
    throw InvalidArgumentError("fused_elementwise: pieces (Note [Pieces of a concatenation]): " + why);
  };
  std::vector<std::int64_t> out(rank, 1);
  const auto axis = static_cast<std::size_t>(pieces.axis);
  // Every input broadcasts into the output (numpy's rule, right-aligned); along the axis, into its piece's extent.
  for (std::size_t p = 0; p < pieces.pieces.size(); ++p) {
    for (std::size_t k : pieces.pieces[p].inputs) {
      const auto& s = read_shapes.at(k);
      for (std::size_t j = 0; j < s.size(); ++j) {
        const std::size_t d = rank - s.size() + j;
        const std::int64_t want = d == axis ? pieces.pieces[p].size : out[d];
        if (s[j] == 1 || s[j] == want) continue;
        if (d != axis && out[d] == 1) {
          out[d] = s[j];
          continue;
        }
        fail(detail::str_cat("input x", k, " of shape ", detail::shape_str(s, ","), " of piece ", p, " does not ",
                             "broadcast to ", d == axis ? "the piece's extent " : "the other pieces' size ", want,
                             " along axis ", d));
      }
    }
  }
  out[axis] = 0;
  for (const Piece& piece : pieces.pieces) {
    if (__builtin_add_overflow(out[axis], piece.size, &out[axis])) fail("the pieces' total size overflows int64");
  }
  return out;
}

std::vector<Layout> piece_layouts(const Pieces& pieces, const std::vector<std::vector<std::int64_t>>& read_shapes,
                                  const InputViews& views, const std::vector<std::int64_t>& output_shape) {
  std::vector<Layout> layouts;
  for (const Piece& piece : pieces.pieces) {
    std::vector<std::int64_t> shape = output_shape;
    shape.at(static_cast<std::size_t>(pieces.axis)) = piece.size;
    std::vector<std::vector<std::int64_t>> shapes;
    InputViews piece_views(piece.inputs.size());
    for (std::size_t j = 0; j < piece.inputs.size(); ++j) {
      shapes.push_back(read_shapes.at(piece.inputs[j]));
      if (piece.inputs[j] < views.size()) piece_views[j] = views[piece.inputs[j]];
    }
    layouts.push_back(layout(shapes, shape, 0, piece_views));
    check_rotate_half(piece.program, layouts.back());
  }
  return layouts;
}

std::vector<DType> piece_dtypes(const Piece& piece, const std::vector<DType>& input_dtypes) {
  std::vector<DType> out;
  for (std::size_t k : piece.inputs) out.push_back(input_dtypes.at(k));
  return out;
}

std::int64_t Pieces::inner(const std::vector<std::int64_t>& output_shape) const {
  std::int64_t n = 1;
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < output_shape.size(); ++d) n *= output_shape[d];
  return n;
}

int pieces_vector_width(const Pieces& pieces, const std::vector<Layout>& layouts,
                        const std::vector<DType>& input_dtypes, DType output_dtype,
                        const std::vector<std::int64_t>& output_shape) {
  const std::int64_t inner = pieces.inner(output_shape);
  int vec = 8;
  for (std::size_t p = 0; p < pieces.pieces.size(); ++p) {
    const Piece& piece = pieces.pieces[p];
    vec = std::min(vec, vector_width(piece.program, layouts[p], piece_dtypes(piece, input_dtypes), output_dtype));
    while (vec > 1 && (piece.size * inner) % vec != 0) vec /= 2;  // a vector stays inside its piece's slab
  }
  return vec;
}

bool Layout::full(std::size_t input) const {
  std::int64_t expected = 1;
  for (std::size_t d = dims.size(); d-- > 0;) {
    if (dims[d] != 1 && strides[input][d] != expected) return false;
    expected *= dims[d];
  }
  return true;
}

bool Layout::scalar(std::size_t input) const {
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] != 1 && strides[input][d] != 0) return false;
  }
  return true;
}

Layout layout(const std::vector<std::vector<std::int64_t>>& input_shapes, const std::vector<std::int64_t>& output_shape,
              std::int64_t row_axes, const InputViews& views) {
  Layout out;
  if (row_axes < 0 || static_cast<std::size_t>(row_axes) > output_shape.size()) {
    throw InvalidArgumentError(detail::str_cat("fused_elementwise: row_axes = ", row_axes, " for an output of rank ",
                                               output_shape.size()));
  }
  out.numel = 1;
  bool empty = false;
  for (std::int64_t d : output_shape) {
    empty = empty || d == 0;
    if (!empty && __builtin_mul_overflow(out.numel, d, &out.numel)) {
      throw InvalidArgumentError("fused_elementwise: the output's element count overflows int64");
    }
  }
  out.last = output_shape.empty() ? 1 : output_shape.back();
  out.row = out.numel;
  if (row_axes > 0) {
    out.row = 1;
    for (std::size_t d = output_shape.size() - static_cast<std::size_t>(row_axes); d < output_shape.size(); ++d) {
      out.row *= output_shape[d];  // no overflow: a factor of numel (or 0)
    }
  }
  if (empty) {  // nothing to compute: no strides either (a zero-sized dim may sit beside huge ones)
    out.numel = 0;
    out.dims = {0};
    out.strides.assign(input_shapes.size(), std::vector<std::int64_t>{0});
    return out;
  }
  const std::size_t rank = output_shape.size();
  std::vector<std::int64_t> dims = output_shape;
  std::vector<std::vector<std::int64_t>> strides(input_shapes.size(), std::vector<std::int64_t>(rank, 0));
  for (std::size_t k = 0; k < input_shapes.size(); ++k) {
    const auto& shape = input_shapes[k];
    XPURT_INTERNAL_ASSERT(shape.size() <= rank, "fused layout: an input of higher rank than the output");
    const InputView* view = k < views.size() && views[k] ? &*views[k] : nullptr;
    XPURT_INTERNAL_ASSERT(view == nullptr || view->shape == shape, "fused layout: a view's shape is the input's");
    std::int64_t stride = 1;
    for (std::size_t j = shape.size(); j-- > 0;) {
      const std::size_t d = rank - shape.size() + j;
      strides[k][d] = shape[j] == 1 ? 0 : view != nullptr ? view->strides[j] : stride;
      if (__builtin_mul_overflow(stride, shape[j], &stride)) {
        throw InvalidArgumentError("fused_elementwise: an input's element count overflows int64");
      }
    }
  }
  // Merge axis d into d + 1 where every input reads them as one axis; size-1 axes go.
  std::vector<std::int64_t> merged_dims;
  std::vector<std::vector<std::int64_t>> merged(input_shapes.size());
  for (std::size_t d = 0; d < rank; ++d) {
    if (dims[d] == 1) continue;
    bool joins = !merged_dims.empty();
    for (std::size_t k = 0; k < input_shapes.size() && joins; ++k) {
      joins = merged[k].back() == strides[k][d] * dims[d];
    }
    if (joins) {
      merged_dims.back() *= dims[d];
      for (std::size_t k = 0; k < input_shapes.size(); ++k) merged[k].back() = strides[k][d];
    } else {
      merged_dims.push_back(dims[d]);
      for (std::size_t k = 0; k < input_shapes.size(); ++k) merged[k].push_back(strides[k][d]);
    }
  }
  if (merged_dims.empty()) {
    merged_dims.push_back(1);
    for (auto& s : merged) s.push_back(0);
  }
  out.dims = std::move(merged_dims);
  out.strides = std::move(merged);
  return out;
}

// Note [Vectorised programs]
// A generated kernel moves `vec` consecutive output elements per thread step (8 for 16-bit data, 4 where float32 is
// read or written: 16-byte loads and stores) when every vector stays inside the innermost merged axis, inside a row
// and on one side of rotate_half's D / 2, and every input is read along that axis contiguously (stride 1: one vector
// load) or broadcast (stride 0: one scalar load per vector). The kernel checks at run time that the pointers it reads
// as vectors are aligned (views of an outer slice may not be) and otherwise runs the same program element by element.
// Scalar 2-byte accesses had left the generated kernels at half of the bandwidth of PyTorch's (Llama's SwiGLU at
// batch 16 on an H100: 15 us against 8 us).
int vector_width(const Program& program, const Layout& layout, const std::vector<DType>& input_dtypes,
                 DType output_dtype) {
  // A quantized output's vector is vec bytes (Note [Quantized output of a fused program]).
  if (layout.numel == 0) return 1;
  bool four_bytes = output_dtype == DType::kFloat32;
  for (std::size_t k = 0; k < input_dtypes.size(); ++k) {
    four_bytes = four_bytes || (!layout.scalar(k) && input_dtypes[k] == DType::kFloat32);
  }
  for (int vec = four_bytes ? 4 : 8; vec > 1; vec /= 2) {
    bool fits = layout.dims.back() % vec == 0 && (!program.reduces() || layout.row % vec == 0);
    for (std::size_t k = 0; k < input_dtypes.size() && fits; ++k) {
      const std::int64_t step = layout.strides[k].back();
      fits = layout.scalar(k) || step == 0 || step == 1;
      // a vector read at every output vector stays aligned: the input's other strides are whole vectors (a view's
      // rows may not be, Note [Inputs read through a view]); broadcast inputs' are products of dims
      for (std::size_t d = 0; d + 1 < layout.dims.size() && fits && step == 1; ++d) {
        fits = layout.strides[k][d] % vec == 0;
      }
    }
    for (const Instruction& in : program.code) {
      if (in.code != Code::kRotateHalf) continue;
      fits = fits && (layout.last / 2) % vec == 0 && layout.strides[static_cast<std::size_t>(in.a.index)].back() == 1;
    }
    if (fits) return vec;
  }
  return 1;
}

namespace {

std::int64_t pow2_ceil(std::int64_t v) {
  std::int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

LaunchShape launch_shape(const Program& program, const Layout& layout, const std::vector<DType>& input_dtypes,
                         DType output_dtype) {
  LaunchShape shape;
  shape.vec = vector_width(program, layout, input_dtypes, output_dtype);
  if (!program.reduces()) return shape;
  const std::int64_t steps = layout.row / shape.vec;  // vector steps per row
  if (steps <= 256) {
    // A group of at most a warp per row, about two steps per lane (Note [Row programs]); rows per block shrink while
    // there are few rows, so that they spread over the SMs (Llama's RMSNorm at batch 1: 128 rows).
    shape.row_threads = static_cast<int>(std::clamp<std::int64_t>(pow2_ceil((steps + 1) / 2), 4, 32));
    std::int64_t rows_per_block = 1;
    while (rows_per_block * shape.row_threads < 256 && rows_per_block * 256 * 2 <= layout.rows()) rows_per_block *= 2;
    rows_per_block = std::max<std::int64_t>(rows_per_block, 32 / shape.row_threads);  // whole warps
    shape.rows_per_block = rows_per_block;
    shape.threads = static_cast<int>(rows_per_block * shape.row_threads);
  } else {  // a block per row
    shape.threads = steps > 4096 ? 512 : 256;
    shape.row_threads = shape.threads;
  }
  return shape;
}

// Note [Row programs]
// A program without a reduction is a grid-stride loop over the output's elements (vectors of them, Note [Vectorised
// programs]). One with reductions loops over rows, a group of lanes (4 to 32: a sub-warp or a warp) or a block per
// row: for each reduction in program order, one pass over the row computes the instructions before it (earlier
// reductions are the row's values by then) and accumulates its operand in float32, then the group (shuffles) or the
// block (shuffles and shared memory) combines the partial values; a last pass computes every instruction and writes
// the row. Inputs are read once per pass: a row stays in L1/L2 between passes. Every lane of a block runs the same
// number of row iterations (a lane past the last row reads nothing), so that the shuffles see whole warps.

namespace {

// Writes the CUDA C of one program at one launch, part by part in the order the parts appear in the source:
// header, helpers, signature, prologue, then elementwise_loops (no reduction) or row_loops_head, one
// reduction_pass per reduction and row_store_pass (Note [Row programs]). The body writers (decode, instructions,
// scalar_body, vector_body, row_loops) are shared by the loops.
class SourceWriter {
 public:
  // `vec`: the elements per vector step (0: launch_shape's; a pieced kernel's pieces take the width they share).
  SourceWriter(const Program& program, const Layout& layout, const std::vector<DType>& input_dtypes,
               DType output_dtype, const OutputQuantization& quantization, int vec = 0)
      : quantization_(quantization),
        program_(program),
        layout_(layout),
        input_dtypes_(input_dtypes),
        output_dtype_(output_dtype),
        launch_(launch_shape(program, layout, input_dtypes, output_dtype)),
        vec_(vec > 0 ? vec : launch_.vec),
        idx_(layout.numel > (std::int64_t{1} << 30) ? "long long" : "int"),
        rank_(layout.dims.size()),
        last_("t" + std::to_string(program.code.size() - 1)),
        store_(detail::str_cat("st_", dtype_name(output_dtype))) {
    for (std::size_t k = 0; k < program.num_inputs; ++k) strided_ = strided_ || (!layout.scalar(k) && !layout.full(k));
  }

  std::string str() const { return s_.str(); }
  bool reduces() const { return launch_.row_threads != 0; }

  // The comment lines: the program, the dtypes, the layout and the launch.
  void header() {
    s_ << "// Generated by xpuruntime (Note [Fused elementwise programs]): " << program_.text() << "\n"
       << "// output " << dtype_name(output_dtype_) << ", inputs";
    for (DType d : input_dtypes_) s_ << " " << dtype_name(d);
    s_ << ", output elements " << layout_.numel << ", axes " << detail::shape_str(layout_.dims, ",");
    if (launch_.row_threads) s_ << ", rows of " << layout_.row << ", " << launch_.row_threads << " threads per row";
    if (vec_ > 1) s_ << ", vectors of " << vec_;
    s_ << "\n";
  }

  // The load and store helpers of every dtype read, written or rounded to, and the vector type.
  void helpers() {
    std::vector<DType> used = input_dtypes_;
    used.push_back(output_dtype_);
    s_ << float_helpers(used, {&program_});
    if (quantized_output(output_dtype_)) {
      const bool half_valued = !program_.code.empty() && program_.code.back().code == Code::kToF16;
      s_ << quantized_store(output_dtype_, quantization_, half_valued);
    }
    if (vec_ > 1) s_ << "template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };\n";
  }

  // The kernel's head: inputs x<k>, output y.
  void signature(const std::string& name) {
    s_ << "extern \"C\" __global__ void __launch_bounds__(" << launch_.threads << ") " << name << "(";
    for (std::size_t k = 0; k < program_.num_inputs; ++k) {
      s_ << "const " << storage_type(input_dtypes_[k]) << "* __restrict__ x" << k << ", ";
    }
    s_ << storage_type(output_dtype_) << "* __restrict__ y) {\n";
  }

  // Before the loops: the loads of the scalar inputs (a<k>) and, with vectors, the run-time alignment check of the
  // pointers read or written as vectors.
  void prologue() {
    for (std::size_t k = 0; k < program_.num_inputs; ++k) {
      if (layout_.scalar(k)) {
        s_ << "  const float a" << k << " = ld_" << dtype_name(input_dtypes_[k]) << "(x" << k << "[0]);\n";
      }
    }
    if (vec_ > 1) {
      s_ << "  const bool vectors = ";
      for (std::size_t k = 0; k < program_.num_inputs; ++k) {
        if (vector_input(k)) {
          s_ << "(unsigned long long)x" << k << " % " << vec_ * static_cast<int>(dtype_size(input_dtypes_[k]))
             << " == 0 && ";
        }
      }
      s_ << "(unsigned long long)y % " << vec_ * static_cast<int>(dtype_size(output_dtype_)) << " == 0;\n";
    }
  }

  // A program without reductions: grid-stride loops over vectors (when aligned) or elements, to the kernel's end.
  void elementwise_loops() {
    if (vec_ > 1) {
      s_ << "  if (vectors) {\n"
         << "    for (" << idx_ << " v = (" << idx_ << ")blockIdx.x * blockDim.x + threadIdx.x; v < (" << idx_ << ")"
         << layout_.numel / vec_ << "; v += (" << idx_ << ")blockDim.x * gridDim.x) {\n"
         << "      const " << idx_ << " i = v * " << vec_ << ";\n";
      vector_body(program_.code.size(), "      ", detail::str_cat("      ", vec_type(output_dtype_), " o;\n"),
                  detail::str_cat("o.v[e] = ", store_, "(", last_, ");"));
      s_ << "      *reinterpret_cast<" << vec_type(output_dtype_) << "*>(y + i) = o;\n    }\n    return;\n  }\n";
    }
    s_ << "  for (" << idx_ << " i = (" << idx_ << ")blockIdx.x * blockDim.x + threadIdx.x; i < (" << idx_ << ")"
       << layout_.numel << "; i += (" << idx_ << ")blockDim.x * gridDim.x) {\n";
    scalar_body(program_.code.size(), "    ");
    s_ << "    y[i] = " << store_ << "(" << last_ << ");\n  }\n}\n";
  }

  // A program with reductions: the loop over the thread's rows (its lane, its row, the row's end), left open.
  void row_loops_head() {
    const std::int64_t rows = layout_.rows();
    const int rt = launch_.row_threads;
    s_ << "  const float kNaN = __int_as_float(0x7fc00000);\n";
    if (block_rows()) s_ << "  __shared__ float partial[32];\n";
    s_ << "  const int lane = threadIdx.x % " << rt << ";\n"
       << "  for (" << idx_ << " base = (" << idx_ << ")blockIdx.x * " << launch_.rows_per_block << "; base < ("
       << idx_ << ")" << rows << "; base += (" << idx_ << ")gridDim.x * " << launch_.rows_per_block << ") {\n"
       << "    const " << idx_ << " row = base + threadIdx.x / " << rt << ";\n"
       << "    const " << idx_ << " end = row < (" << idx_ << ")" << rows << " ? " << layout_.row
       << " : 0;  // a lane past the last row only takes part in the shuffles\n";
  }

  // The pass of reduction `j` over the row: the instructions before it and its accumulation, then the combination
  // over the row's lanes (shuffles; shared memory for a block per row), as r<j>.
  void reduction_pass(std::size_t j) {
    const Instruction& in = program_.code[j];
    const int rt = launch_.row_threads;
    const bool max = in.code == Code::kReduceMax;
    auto combine = [&](const std::string& a, const std::string& b) {
      return max ? detail::str_cat("(isnan(", a, ") || isnan(", b, ") ? kNaN : fmaxf(", a, ", ", b, "))")
                 : detail::str_cat(a, " + ", b);
    };
    const std::string acc = "acc" + std::to_string(j);
    const std::string operand = text(in.a);
    const std::string step = detail::str_cat(acc, " = ", combine(acc, operand), ";");
    s_ << "    float " << acc << " = " << (max ? "-__int_as_float(0x7f800000)" : "0.0f") << ";\n";
    row_loops([&](bool vector) {
      if (vector) {
        vector_body(j, "        ", "", step);
      } else {
        scalar_body(j, "        ");
        s_ << "        " << step << "\n";
      }
    });
    s_ << "    for (int o = " << std::min(rt, 32) / 2 << "; o > 0; o >>= 1) {\n"
       << "      const float other = __shfl_xor_sync(0xffffffffu, " << acc << ", o);\n"
       << "      " << acc << " = " << combine(acc, "other") << ";\n    }\n";
    if (block_rows()) {
      s_ << "    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = " << acc << ";\n"
         << "    __syncthreads();\n"
         << "    " << acc << " = partial[0];\n"
         << "    for (int w = 1; w < " << launch_.threads / 32 << "; ++w) " << acc << " = "
         << combine(acc, "partial[w]") << ";\n"
         << "    __syncthreads();\n";
    }
    s_ << "    const float r" << j << " = " << acc;
    if (in.code == Code::kReduceMean) s_ << " / " << layout_.row << ".0f";
    s_ << ";\n";
  }

  // The last pass over the row: every instruction, the row stored; closes the row loop and the kernel.
  void row_store_pass() {
    row_loops([&](bool vector) {
      if (vector) {
        vector_body(program_.code.size(), "        ", detail::str_cat("        ", vec_type(output_dtype_), " o;\n"),
                    detail::str_cat("o.v[e] = ", store_, "(", last_, ");"));
        s_ << "        *reinterpret_cast<" << vec_type(output_dtype_) << "*>(y + i) = o;\n";
      } else {
        scalar_body(program_.code.size(), "        ");
        s_ << "        y[i] = " << store_ << "(" << last_ << ");\n";
      }
    });
    s_ << "  }\n}\n";
  }

  // One element (`vector` false) or vector of a piece at its own index i, its inputs x<k> declared before (Note
  // [Pieces of a concatenation]): the loads of its scalar inputs, its program, the store at y[<at>].
  void piece_element(const std::string& pad, bool vector, const std::string& at) {
    for (std::size_t k = 0; k < program_.num_inputs; ++k) {
      if (layout_.scalar(k)) {
        s_ << pad << "const float a" << k << " = ld_" << dtype_name(input_dtypes_[k]) << "(x" << k << "[0]);\n";
      }
    }
    if (!vector) {
      scalar_body(program_.code.size(), pad);
      s_ << pad << "y[" << at << "] = " << store_ << "(" << last_ << ");\n";
      return;
    }
    vector_body(program_.code.size(), pad, detail::str_cat(pad, vec_type(output_dtype_), " o;\n"),
                detail::str_cat("o.v[e] = ", store_, "(", last_, ");"));
    s_ << pad << "*reinterpret_cast<" << vec_type(output_dtype_) << "*>(y + " << at << ") = o;\n";
  }

  // Whether input k is read as vectors (stride 1 along the innermost axis) in the vector loops.
  bool vector_input(std::size_t k) const { return vec_ > 1 && !layout_.scalar(k) && layout_.strides[k].back() == 1; }

 private:
  bool block_rows() const { return launch_.row_threads > 32; }

  std::string vec_type(DType d) const { return detail::str_cat("Vec<", storage_type(d), ", ", vec_, ">"); }

  static std::string text(const Operand& o) { return (o.input ? "a" : "t") + std::to_string(o.index); }

  // Input k's offset at linear index i (the coordinates c<d> are decoded where an input is strided).
  std::string offset(std::size_t k) const {
    if (layout_.scalar(k)) return std::string("0");
    if (layout_.full(k)) return std::string("i");
    std::string e = "0";
    for (std::size_t d = 0; d < rank_; ++d) {
      if (layout_.strides[k][d] != 0) e += detail::str_cat(" + c", d, " * (", idx_, ")", layout_.strides[k][d]);
    }
    return e;
  }

  // The coordinates c<d> of linear index i, where some input is strided.
  void decode(const std::string& pad) {
    if (!strided_) return;
    s_ << pad << idx_ << " r = i;\n";
    for (std::size_t d = rank_; d-- > 0;) {
      s_ << pad << "const " << idx_ << " c" << d << " = r % " << layout_.dims[d] << "; r /= " << layout_.dims[d]
         << ";\n";
    }
  }

  // The instructions [0, upto) at one element; reductions before `upto` read r<j>. In the scalar loops
  // (`in_vector` false) rotate_half loads its element; in the vector loops it reads lane e of the vector h<j>
  // loaded before.
  void instructions(std::size_t upto, const std::string& pad, bool in_vector) {
    for (std::size_t j = 0; j < upto; ++j) {
      const Instruction& in = program_.code[j];
      if (in.code == Code::kRotateHalf) {
        const auto k = static_cast<std::size_t>(in.a.index);
        if (in_vector) {
          s_ << pad << "const float t" << j << " = (n" << j << " ? -1.0f : 1.0f) * ld_"
             << dtype_name(input_dtypes_[k]) << "(h" << j << ".v[e]);\n";
          continue;
        }
        const std::int64_t half = layout_.last / 2, step = layout_.strides[k].back();
        s_ << pad << "const bool n" << j << " = i % " << layout_.last << " < " << half << ";\n"
           << pad << "const float t" << j << " = (n" << j << " ? -1.0f : 1.0f) * ld_" << dtype_name(input_dtypes_[k])
           << "(x" << k << "[" << offset(k) << " + (n" << j << " ? " << half * step << " : " << -half * step
           << ")]);\n";
        continue;
      }
      s_ << pad << "const float t" << j << " = ";
      if (is_reduction(in.code)) {
        s_ << "r" << j << ";\n";
      } else {
        s_ << cuda_expression(in.code, text(in.a), is_binary(in.code) ? text(in.b) : std::string()) << ";\n";
      }
    }
  }

  // The scalar body at linear index i: decode, loads, instructions [0, upto).
  void scalar_body(std::size_t upto, const std::string& pad) {
    decode(pad);
    for (std::size_t k = 0; k < program_.num_inputs; ++k) {
      if (layout_.scalar(k)) continue;
      s_ << pad << "const float a" << k << " = ld_" << dtype_name(input_dtypes_[k]) << "(x" << k << "[" << offset(k)
         << "]);\n";
    }
    instructions(upto, pad, false);
  }

  // The vector body at linear index i (a multiple of vec): decode, the loads of the vector, `before`, then an
  // unrolled loop over its elements e that runs `per_element` after the instructions [0, upto).
  void vector_body(std::size_t upto, const std::string& pad, const std::string& before,
                   const std::string& per_element) {
    decode(pad);
    for (std::size_t k = 0; k < program_.num_inputs; ++k) {
      if (layout_.scalar(k)) continue;
      if (vector_input(k)) {
        s_ << pad << "const " << vec_type(input_dtypes_[k]) << " l" << k << " = *reinterpret_cast<const "
           << vec_type(input_dtypes_[k]) << "*>(x" << k << " + " << offset(k) << ");\n";
      } else {  // broadcast along the vector
        s_ << pad << "const float a" << k << " = ld_" << dtype_name(input_dtypes_[k]) << "(x" << k << "["
           << offset(k) << "]);\n";
      }
    }
    for (std::size_t j = 0; j < upto; ++j) {
      const Instruction& in = program_.code[j];
      if (in.code != Code::kRotateHalf) continue;
      const auto k = static_cast<std::size_t>(in.a.index);
      const std::int64_t half = layout_.last / 2;
      s_ << pad << "const bool n" << j << " = i % " << layout_.last << " < " << half << ";\n"
         << pad << "const " << vec_type(input_dtypes_[k]) << " h" << j << " = *reinterpret_cast<const "
         << vec_type(input_dtypes_[k]) << "*>(x" << k << " + " << offset(k) << " + (n" << j << " ? " << half
         << " : " << -half << "));\n";
    }
    s_ << before << pad << "#pragma unroll\n" << pad << "for (int e = 0; e < " << vec_ << "; ++e) {\n";
    const std::string inner = pad + "  ";
    for (std::size_t k = 0; k < program_.num_inputs; ++k) {
      if (vector_input(k)) {
        s_ << inner << "const float a" << k << " = ld_" << dtype_name(input_dtypes_[k]) << "(l" << k << ".v[e]);\n";
      }
    }
    instructions(upto, inner, true);
    s_ << inner << per_element << "\n" << pad << "}\n";
  }

  // A loop over the lane's part of the row, vector (when aligned) or scalar; `body` writes the loop's body.
  void row_loops(const std::function<void(bool)>& body) {
    const int rt = launch_.row_threads;
    if (vec_ > 1) {
      s_ << "    if (vectors) {\n"
         << "      for (" << idx_ << " c = lane * " << vec_ << "; c < end; c += " << rt * vec_ << ") {\n"
         << "        const " << idx_ << " i = row * (" << idx_ << ")" << layout_.row << " + c;\n";
      body(true);
      s_ << "      }\n    } else {\n";
    }
    s_ << "      for (" << idx_ << " c = lane; c < end; c += " << rt << ") {\n"
       << "        const " << idx_ << " i = row * (" << idx_ << ")" << layout_.row << " + c;\n";
    body(false);
    s_ << "      }\n";
    if (vec_ > 1) s_ << "    }\n";
  }

  const OutputQuantization quantization_;
  const Program& program_;
  const Layout& layout_;
  const std::vector<DType>& input_dtypes_;
  const DType output_dtype_;
  const LaunchShape launch_;
  const int vec_;
  const char* const idx_;  // the index type: int, or long long past 2^30 elements
  const std::size_t rank_;
  const std::string last_;   // the last instruction's value: what is stored
  const std::string store_;  // the output's store helper
  bool strided_ = false;     // whether some input is read neither whole nor as a scalar (decode needed)
  std::ostringstream s_;
};

}  // namespace

std::string cuda_source(const Program& program, const Layout& layout, const std::vector<DType>& input_dtypes,
                        DType output_dtype, const std::string& name, const OutputQuantization& quantization) {
  XPURT_INTERNAL_ASSERT(input_dtypes.size() == program.num_inputs, "fused cuda_source: one dtype per input");
  check_rotate_half(program, layout);
  SourceWriter writer(program, layout, input_dtypes, output_dtype, quantization);
  writer.header();
  writer.helpers();
  writer.signature(name);
  writer.prologue();
  if (!writer.reduces()) {
    writer.elementwise_loops();
    return writer.str();
  }
  writer.row_loops_head();
  for (std::size_t j = 0; j < program.code.size(); ++j) {
    if (is_reduction(program.code[j].code)) writer.reduction_pass(j);
  }
  writer.row_store_pass();
  return writer.str();
}

std::string cuda_source(const Pieces& pieces, const std::vector<Layout>& layouts,
                        const std::vector<DType>& input_dtypes, DType output_dtype,
                        const std::vector<std::int64_t>& output_shape, const std::string& name) {
  XPURT_INTERNAL_ASSERT(!pieces.empty() && layouts.size() == pieces.pieces.size(), "fused cuda_source: one layout per "
                        "piece");
  XPURT_INTERNAL_ASSERT(!quantized_output(output_dtype), "fused cuda_source: pieces store float outputs");
  const auto axis = static_cast<std::size_t>(pieces.axis);
  const int vec = pieces_vector_width(pieces, layouts, input_dtypes, output_dtype, output_shape);
  const std::int64_t inner = pieces.inner(output_shape);
  std::int64_t numel = 1;
  for (std::int64_t d : output_shape) numel *= d;
  const std::string idx = numel > (std::int64_t{1} << 30) ? "long long" : "int";
  std::ostringstream s;
  s << "// Generated by xpuruntime (Note [Pieces of a concatenation]): " << pieces.text() << "\n// output "
    << dtype_name(output_dtype) << " " << detail::shape_str(output_shape, ",") << ", pieces along axis " << axis;
  for (const Piece& piece : pieces.pieces) s << " " << piece.size;
  if (vec > 1) s << ", vectors of " << vec;
  s << "\n";
  std::vector<DType> used = input_dtypes;
  used.push_back(output_dtype);
  std::vector<const Program*> programs;
  for (const Piece& piece : pieces.pieces) programs.push_back(&piece.program);
  s << float_helpers(used, programs);
  if (vec > 1) s << "template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };\n";
  s << "extern \"C\" __global__ void __launch_bounds__(256) " << name << "(";
  for (std::size_t k = 0; k < input_dtypes.size(); ++k) {
    s << "const " << storage_type(input_dtypes[k]) << "* __restrict__ p" << k << ", ";
  }
  s << storage_type(output_dtype) << "* __restrict__ y) {\n";
  if (numel == 0) return s.str() + "}\n";  // nothing to write (and no slab to divide by)
  // The step at position q of the pieces laid one after the other (piece-major: piece 0's elements in its own order,
  // then piece 1's, ...), so that the lanes of a warp run one piece's program together and read its inputs
  // contiguously: i is q's index in its piece, g the output element it writes. Positions in the output's order put a
  // warp across up to 8 pieces of DenseNet's 32-channel slabs, each a serialized branch waiting on its own loads
  // (5 us against 3.2 for the Concat's copy and the norm's kernel, H200).
  auto steps = [&](bool vector, const std::string& pad) {
    const std::int64_t slab = output_shape[axis] * inner;
    const std::int64_t rows = numel / slab;
    std::int64_t start = 0, end = 0;
    for (std::size_t p = 0; p < pieces.pieces.size(); ++p) {
      const Piece& piece = pieces.pieces[p];
      const std::int64_t cut = piece.size * inner, begin = end;
      end += rows * cut;
      s << pad << (p ? "} else " : "");
      if (p + 1 < pieces.pieces.size()) s << "if (q < (" << idx << ")" << end << ") ";
      s << "{\n" << pad << "  const " << idx << " i = q - (" << idx << ")" << begin << ", outer = i / (" << idx << ")"
        << cut << ", g = outer * (" << idx << ")" << slab << " + (" << idx << ")" << start * inner << " + i - outer * ("
        << idx << ")" << cut << ";\n";
      const std::vector<DType> dtypes = piece_dtypes(piece, input_dtypes);
      for (std::size_t j = 0; j < piece.inputs.size(); ++j) {
        s << pad << "  const " << storage_type(dtypes[j]) << "* __restrict__ x" << j << " = p" << piece.inputs[j]
          << ";\n";
      }
      SourceWriter writer(piece.program, layouts[p], dtypes, output_dtype, {}, vec);
      writer.piece_element(pad + "  ", vector, "g");
      s << writer.str();
      start += piece.size;
    }
    s << pad << "}\n";
  };
  if (vec > 1) {
    s << "  const bool vectors = ";
    for (std::size_t p = 0; p < pieces.pieces.size(); ++p) {
      const Piece& piece = pieces.pieces[p];
      SourceWriter writer(piece.program, layouts[p], piece_dtypes(piece, input_dtypes), output_dtype, {}, vec);
      for (std::size_t j = 0; j < piece.inputs.size(); ++j) {
        if (writer.vector_input(j)) {
          s << "(unsigned long long)p" << piece.inputs[j] << " % "
            << vec * static_cast<int>(dtype_size(input_dtypes[piece.inputs[j]])) << " == 0 && ";
        }
      }
    }
    s << "(unsigned long long)y % " << vec * static_cast<int>(dtype_size(output_dtype)) << " == 0;\n"
      << "  if (vectors) {\n    for (" << idx << " v = (" << idx << ")blockIdx.x * blockDim.x + threadIdx.x; v < ("
      << idx << ")" << numel / vec << "; v += (" << idx << ")blockDim.x * gridDim.x) {\n      const " << idx
      << " q = v * " << vec << ";\n";
    steps(true, "      ");
    s << "    }\n    return;\n  }\n";
  }
  s << "  for (" << idx << " q = (" << idx << ")blockIdx.x * blockDim.x + threadIdx.x; q < (" << idx << ")" << numel
    << "; q += (" << idx << ")blockDim.x * gridDim.x) {\n";
  steps(false, "    ");
  s << "  }\n}\n";
  return s.str();
}

std::string hash_hex(const std::string& text) {
  // FNV-1a's step from an offset basis of its own (not FNV's 14695981039346656037): the kernels' names, their disk
  // cache keys and the source hashes that lock files record were made with it, so it stays.
  std::uint64_t h = detail::fnv1a(1469598103934665603ULL, text.data(), text.size());
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace xpuruntime::fused
