// ONNX reference ops, sequences and optionals (Note [Sequence and optional values] in xpuruntime/value.h):
// SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceAt, SequenceErase, SequenceLength (opset 11),
// SplitToSequence, ConcatFromSequence (11), SequenceMap (17), Optional, OptionalHasElement, OptionalGetElement
// (15, and opset 18's tensor and sequence inputs). Identity of any value kind is in onnx_elementwise.cpp, If and
// Loop carrying sequences and optionals in onnx_control_flow.cpp.
//
// Sequence ops make new sequences that share their input tensors (values are immutable); SplitToSequence and
// ConcatFromSequence copy bytes. Positions are int32 or int64 tensors of one element; out-of-range positions,
// mismatched element types and empty optionals read as values are InvalidArgumentError / InvalidTypeError naming
// the node.
#include <cstring>

#include "backends/cpu/onnx/onnx_common.h"
#include "core/shape_str.h"
#include "xpuruntime/onnx_dtype.h"
#include "xpuruntime/run_options.h"

namespace xpuruntime::onnx_ref {
namespace {

using Shape = std::vector<std::int64_t>;

// ONNX element-type code -> DType, for SequenceEmpty's `dtype`.
DType dtype_of_code(const OpContext& ctx, std::int64_t code) {
  DType dtype;
  std::string name;
  if (dtype_from_onnx_type(code, &dtype, &name)) return dtype;
  throw InvalidTypeError(detail::str_cat(ctx.where(), ": attribute 'dtype' is ONNX element type ", code, " (", name,
                                         "), which xpuruntime tensors cannot hold"));
}

// A position input (a one-element int32/int64 tensor) in [-size, size - 1] (or [-size, size] when `inclusive_end`,
// SequenceInsert's), made non-negative.
std::int64_t read_position(const OpContext& ctx, std::size_t input, std::int64_t size, bool inclusive_end) {
  const Tensor& t = ctx.input(input);
  XPURT_CHECK_TYPE(t.dtype() == DType::kInt64 || t.dtype() == DType::kInt32, ctx.where(),
                   ": the position must be an int32 or int64 tensor, got ", dtype_name(t.dtype()));
  XPURT_CHECK(t.numel() == 1, ctx.where(), ": the position must be a scalar, got ", t.numel(), " values");
  const std::int64_t position = read_ints(t, ctx.where())[0];
  const std::int64_t high = inclusive_end ? size : size - 1;
  XPURT_CHECK(position >= -size && position <= high, ctx.where(), ": position ", position,
              " is out of range for a sequence of ", size, " tensors (valid: ", -size, " to ", high, ")");
  return position < 0 ? position + size : position;
}

void check_element(const OpContext& ctx, DType sequence_dtype, const Tensor& t, const char* what) {
  XPURT_CHECK_TYPE(t.dtype() == sequence_dtype, ctx.where(), ": ", what, " is a ", dtype_name(t.dtype()),
                   " tensor but the sequence holds ", dtype_name(sequence_dtype), " tensors");
}

void sequence_empty(OpContext& ctx) {
  ctx.set_output(0, Value::sequence({}, dtype_of_code(ctx, ctx.attr_int("dtype", 1))));
}

void sequence_construct(OpContext& ctx) {
  XPURT_CHECK(ctx.num_inputs() >= 1, ctx.where(), ": needs at least one tensor (SequenceEmpty makes empty sequences)");
  std::vector<Tensor> elements;
  const DType dtype = ctx.input(0).dtype();
  for (std::size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    XPURT_CHECK_TYPE(t.dtype() == dtype, ctx.where(), ": input ", i, " is a ", dtype_name(t.dtype()),
                     " tensor, input 0 a ", dtype_name(dtype), " one (a sequence holds tensors of one type)");
    elements.push_back(t);
  }
  ctx.set_output(0, Value::sequence(std::move(elements), dtype));
}

void sequence_insert(OpContext& ctx) {
  const Value& sequence = ctx.value(0);
  std::vector<Tensor> elements = ctx.sequence(0);
  const Tensor& t = ctx.input(1);
  check_element(ctx, sequence.element_dtype(), t, "the inserted tensor");
  const auto size = static_cast<std::int64_t>(elements.size());
  const std::int64_t position = ctx.has_input(2) ? read_position(ctx, 2, size, /*inclusive_end=*/true) : size;
  elements.insert(elements.begin() + position, t);
  ctx.set_output(0, Value::sequence(std::move(elements), sequence.element_dtype()));
}

void sequence_at(OpContext& ctx) {
  const std::vector<Tensor>& elements = ctx.sequence(0);
  const std::int64_t position = read_position(ctx, 1, static_cast<std::int64_t>(elements.size()), false);
  ctx.set_output(0, elements[static_cast<std::size_t>(position)]);
}

void sequence_erase(OpContext& ctx) {
  const Value& sequence = ctx.value(0);
  std::vector<Tensor> elements = ctx.sequence(0);
  const auto size = static_cast<std::int64_t>(elements.size());
  XPURT_CHECK(size > 0, ctx.where(), ": cannot erase from an empty sequence");
  const std::int64_t position = ctx.has_input(1) ? read_position(ctx, 1, size, false) : size - 1;
  elements.erase(elements.begin() + position);
  ctx.set_output(0, Value::sequence(std::move(elements), sequence.element_dtype()));
}

void sequence_length(OpContext& ctx) {
  const auto size = static_cast<std::int64_t>(ctx.sequence(0).size());
  Tensor& out = ctx.allocate_output(0, {}, DType::kInt64);
  *data<std::int64_t>(out) = size;
}

// Rows [begin, begin + length) of dimension `axis` of `x`, with that dimension's size `length` (or removed).
Tensor slice_axis(const Tensor& x, std::int64_t axis, std::int64_t begin, std::int64_t length, bool keep_axis) {
  const Shape& shape = x.shape();
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < x.dim(); ++d) {
    if (d < axis) outer *= shape[static_cast<std::size_t>(d)];
    if (d > axis) inner *= shape[static_cast<std::size_t>(d)];
  }
  Shape out_shape = shape;
  if (keep_axis) {
    out_shape[static_cast<std::size_t>(axis)] = length;
  } else {
    out_shape.erase(out_shape.begin() + axis);
  }
  Tensor out = Tensor::empty(out_shape, x.dtype());
  const std::size_t esize = x.element_size();
  const std::size_t chunk = static_cast<std::size_t>(length * inner) * esize;
  const std::size_t row = static_cast<std::size_t>(shape[static_cast<std::size_t>(axis)] * inner) * esize;
  const auto* src = static_cast<const char*>(x.data_ptr()) + static_cast<std::size_t>(begin * inner) * esize;
  auto* dst = static_cast<char*>(out.data_ptr());
  if (chunk != 0) {
    for (std::int64_t o = 0; o < outer; ++o) {
      std::memcpy(dst + static_cast<std::size_t>(o) * chunk, src + static_cast<std::size_t>(o) * row, chunk);
    }
  }
  return out;
}

void split_to_sequence(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  XPURT_CHECK(x.dim() >= 1, ctx.where(), ": cannot split a scalar");
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where());
  const std::int64_t dim = x.shape()[static_cast<std::size_t>(axis)];
  std::vector<Tensor> parts;
  if (!ctx.has_input(1)) {
    // One slice per index of the axis; keepdims=0 removes the axis.
    const bool keep = ctx.attr_int("keepdims", 1) != 0;
    for (std::int64_t i = 0; i < dim; ++i) parts.push_back(slice_axis(x, axis, i, 1, keep));
  } else {
    const Tensor& split = ctx.input(1);
    const Shape sizes = read_ints(split, ctx.where() + " input 'split'");
    Shape lengths;
    if (split.dim() == 0) {
      XPURT_CHECK(sizes[0] > 0, ctx.where(), ": the split size must be positive, got ", sizes[0]);
      for (std::int64_t begin = 0; begin < dim; begin += sizes[0]) lengths.push_back(std::min(sizes[0], dim - begin));
    } else {
      XPURT_CHECK(split.dim() == 1, ctx.where(), ": 'split' must be a scalar or 1-D, got rank ", split.dim());
      std::int64_t total = 0;
      for (std::int64_t s : sizes) {
        XPURT_CHECK(s >= 0, ctx.where(), ": negative split length ", s);
        total += s;
      }
      XPURT_CHECK(total == dim, ctx.where(), ": the split lengths sum to ", total, " but axis ", axis, " has ", dim);
      lengths = sizes;
    }
    std::int64_t begin = 0;
    for (std::int64_t length : lengths) {
      parts.push_back(slice_axis(x, axis, begin, length, /*keep_axis=*/true));
      begin += length;
    }
  }
  ctx.set_output(0, Value::sequence(std::move(parts), x.dtype()));
}

void concat_from_sequence(OpContext& ctx) {
  const Value& sequence = ctx.value(0);
  const std::vector<Tensor>& elements = ctx.sequence(0);
  XPURT_CHECK(ctx.has_attr("axis"), ctx.where(), ": attribute 'axis' is required");
  XPURT_CHECK(!elements.empty(), ctx.where(), ": cannot concatenate an empty sequence (the output shape is unknown)");
  const bool new_axis = ctx.attr_int("new_axis", 0) != 0;
  const Shape& first = elements[0].shape();
  const auto rank = static_cast<std::int64_t>(first.size());
  const std::int64_t out_rank = new_axis ? rank + 1 : rank;
  XPURT_CHECK(out_rank >= 1, ctx.where(), ": cannot concatenate scalars without new_axis=1");
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), out_rank, ctx.where());
  // Each element seen with the output's rank (new_axis: a dimension of 1 inserted at `axis`).
  auto as_out_rank = [&](const Shape& s) {
    Shape r = s;
    if (new_axis) r.insert(r.begin() + axis, 1);
    return r;
  };
  Shape out_shape = as_out_rank(first);
  out_shape[static_cast<std::size_t>(axis)] = 0;
  for (std::size_t i = 0; i < elements.size(); ++i) {
    const Tensor& t = elements[i];
    check_element(ctx, sequence.element_dtype(), t, "an element");
    XPURT_CHECK(t.dim() == rank, ctx.where(), ": element ", i, " has rank ", t.dim(), ", element 0 has rank ", rank);
    const Shape s = as_out_rank(t.shape());
    for (std::int64_t d = 0; d < out_rank; ++d) {
      const auto du = static_cast<std::size_t>(d);
      XPURT_CHECK(d == axis || s[du] == as_out_rank(first)[du], ctx.where(), ": element ", i, " has shape ",
                  detail::shape_str(t.shape()), " and element 0 ", detail::shape_str(first),
                  new_axis ? ": stacked tensors must have one shape" : ": they must match outside the axis");
    }
    out_shape[static_cast<std::size_t>(axis)] += s[static_cast<std::size_t>(axis)];
  }
  Tensor& out = ctx.allocate_output(0, out_shape, sequence.element_dtype());
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < out_rank; ++d) {
    if (d < axis) outer *= out_shape[static_cast<std::size_t>(d)];
    if (d > axis) inner *= out_shape[static_cast<std::size_t>(d)];
  }
  const std::size_t esize = dtype_size(sequence.element_dtype());
  const std::size_t out_row = static_cast<std::size_t>(out_shape[static_cast<std::size_t>(axis)] * inner) * esize;
  auto* dst = static_cast<char*>(out.data_ptr());
  std::size_t offset = 0;
  for (const Tensor& t : elements) {
    const std::size_t chunk = static_cast<std::size_t>(as_out_rank(t.shape())[static_cast<std::size_t>(axis)] * inner) *
                              esize;
    const auto* src = static_cast<const char*>(t.data_ptr());
    if (chunk != 0) {
      for (std::int64_t o = 0; o < outer; ++o) {
        std::memcpy(dst + static_cast<std::size_t>(o) * out_row + offset, src + static_cast<std::size_t>(o) * chunk,
                    chunk);
      }
    }
    offset += chunk;
  }
}

// SequenceMap: the body runs once per position of the sequence inputs (all of one length); a sequence input gives
// its element at that position, a tensor input itself. Body output j at every position makes output sequence j.
void sequence_map(OpContext& ctx) {
  auto it = ctx.node().graph_attrs.find("body");
  XPURT_CHECK(it != ctx.node().graph_attrs.end() && it->second != nullptr, ctx.where(),
              ": the 'body' subgraph attribute is required");
  const Graph& body = *it->second;
  const std::size_t m = ctx.num_inputs();
  XPURT_CHECK(body.inputs.size() == m, ctx.where(), ": the body takes ", body.inputs.size(), " inputs, the node has ",
              m);
  XPURT_CHECK(body.outputs.size() == ctx.num_outputs(), ctx.where(), ": the body has ", body.outputs.size(),
              " outputs, the node ", ctx.num_outputs());
  ctx.sequence(0);  // input 0 must be a sequence
  std::int64_t length = -1;
  for (std::size_t i = 0; i < m; ++i) {
    const Value& v = ctx.value(i);
    XPURT_CHECK_TYPE(v.is_sequence() || v.is_tensor(), ctx.where(), ": input ", i,
                     " must be a sequence or a tensor, got ", v.str());
    if (!v.is_sequence()) continue;
    const auto n = static_cast<std::int64_t>(v.elements().size());
    XPURT_CHECK(length < 0 || n == length, ctx.where(), ": input ", i, " is a sequence of ", n,
                " tensors, input 0 of ", length, " (the sequence inputs must have one length)");
    length = n;
  }
  std::vector<std::vector<Tensor>> results(body.outputs.size());
  for (std::int64_t p = 0; p < length; ++p) {
    check_run_stop("in ", ctx.where(), " at element ", p);  // Note [Stopping a run] (run_options.h)
    std::vector<Value> in;
    for (std::size_t i = 0; i < m; ++i) {
      const Value& v = ctx.value(i);
      in.push_back(v.is_sequence() ? Value(v.elements()[static_cast<std::size_t>(p)]) : v);
    }
    std::vector<Value> outs = run_graph(body, in, ctx.outer());
    for (std::size_t j = 0; j < outs.size(); ++j) {
      XPURT_CHECK_TYPE(outs[j].is_tensor(), ctx.where(), ": body output ", j, " ('", body.outputs[j],
                       "') must be a tensor, got ", outs[j].str());
      results[j].push_back(outs[j].tensor());
    }
  }
  for (std::size_t j = 0; j < results.size(); ++j) {
    const ValueType* declared = body.type(body.outputs[j]);
    const DType dtype = !results[j].empty() ? results[j][0].dtype() : declared ? declared->dtype : DType::kFloat32;
    for (std::size_t p = 0; p < results[j].size(); ++p) {
      XPURT_CHECK_TYPE(results[j][p].dtype() == dtype, ctx.where(), ": body output ", j, " is ",
                       dtype_name(results[j][p].dtype()), " at position ", p, " but ", dtype_name(dtype),
                       " at position 0 (a sequence holds tensors of one type)");
    }
    ctx.set_output(j, Value::sequence(std::move(results[j]), dtype));
  }
}

void optional(OpContext& ctx) {
  const auto type = ctx.node().type_attrs.find("type");
  const ValueType* declared = type == ctx.node().type_attrs.end() ? nullptr : &type->second;
  if (!ctx.has_input(0)) {
    XPURT_CHECK(declared != nullptr, ctx.where(), ": without an input the 'type' attribute is required");
    ctx.set_output(0, Value::none());
    return;
  }
  const Value& v = ctx.value(0);
  XPURT_CHECK_TYPE(v.is_tensor() || v.is_sequence(), ctx.where(), ": the input must be a tensor or a sequence, got ",
                   v.str());
  if (declared != nullptr) {
    const ValueKind kind = v.kind();
    const DType dtype = v.is_tensor() ? v.tensor().dtype() : v.element_dtype();
    XPURT_CHECK_TYPE(declared->kind == kind && declared->dtype == dtype, ctx.where(), ": the input is ", v.type(),
                     " but attribute 'type' says ", declared->type_str());
  }
  ctx.set_output(0, Value::optional(v));
}

// Opset 15 takes an optional; opset 18 also a tensor or a sequence (which has an element) and no input at all.
const Value* optional_input(const OpContext& ctx) {
  if (ctx.opset() >= 18 && !ctx.has_input(0)) return nullptr;
  const Value& v = ctx.value(0);
  XPURT_CHECK_TYPE(v.is_optional() || ctx.opset() >= 18, ctx.where(), ": the input must be an optional (opset ",
                   ctx.opset(), "; tensors and sequences are taken from opset 18), got ", v.str());
  return &v;
}

void optional_has_element(OpContext& ctx) {
  const Value* v = optional_input(ctx);
  Tensor& out = ctx.allocate_output(0, {}, DType::kBool);
  *data<bool>(out) = v != nullptr && (!v->is_optional() || v->has_element());
}

void optional_get_element(OpContext& ctx) {
  const Value* v = optional_input(ctx);
  XPURT_CHECK(v != nullptr, ctx.where(), ": the input is required");
  if (!v->is_optional()) {
    ctx.set_output(0, *v);
    return;
  }
  XPURT_CHECK(v->has_element(), ctx.where(), ": the optional input '", ctx.input_name(0),
              "' is empty (None); OptionalGetElement needs a value (check it with OptionalHasElement)");
  ctx.set_output(0, v->element());
}

}  // namespace

void register_sequence_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "SequenceEmpty", sequence_empty);
  kernels.add("", "SequenceConstruct", sequence_construct);
  kernels.add("", "SequenceInsert", sequence_insert);
  kernels.add("", "SequenceAt", sequence_at);
  kernels.add("", "SequenceErase", sequence_erase);
  kernels.add("", "SequenceLength", sequence_length);
  kernels.add("", "SplitToSequence", split_to_sequence);
  kernels.add("", "ConcatFromSequence", concat_from_sequence);
  kernels.add("", "SequenceMap", sequence_map);
  kernels.add("", "Optional", optional);
  kernels.add("", "OptionalHasElement", optional_has_element);
  kernels.add("", "OptionalGetElement", optional_get_element);
}

}  // namespace xpuruntime::onnx_ref
