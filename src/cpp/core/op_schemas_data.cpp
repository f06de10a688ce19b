// The op schemas of the data-movement ops (transpose, concat, slice, gather, expand), where, the comparisons
// (equal, less, greater), logical_not, cast between every dtype, and the arithmetic ops that also take int32/int64
// (add, sub, mul, div, neg). docs/ops.md states their semantics; shape inference validates the inputs and names
// the argument, the expected and the actual value.
#include <algorithm>
#include <string>
#include <vector>

#include "core/data_ops.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"
#include "core/shape_str.h"

namespace xpuruntime {

namespace {

using Shape = std::vector<std::int64_t>;

using detail::shape_str;

TensorDesc output_of(const TensorDesc& like, Shape shape, DType dtype) {
  TensorDesc out;
  out.present = true;
  out.dtype = dtype;
  out.shape = std::move(shape);
  out.device = like.device;
  return out;
}

std::int64_t normalize_axis(std::int64_t axis, std::int64_t rank, const std::string& op, const char* attr) {
  XPURT_CHECK(axis >= -rank && axis < rank, "op '", op, "': ", attr, "=", axis,
              " is out of range for a tensor of rank ", rank, " (valid: ", -rank, " to ", rank - 1, ")");
  return axis < 0 ? axis + rank : axis;
}

Shape broadcast(const Shape& a, const Shape& b, const std::string& op, const char* what_a, const char* what_b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t da = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const std::int64_t db = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    XPURT_CHECK(da == db || da == 1 || db == 1, "op '", op, "': ", what_a, " ", shape_str(a), " and ", what_b, " ",
                shape_str(b), " cannot be broadcast together (dim ", k, ": ", da, " vs ", db, ")");
    out[k] = da == 1 ? db : da;
  }
  return out;
}

// Input `index` is on the device of input 0 and of dtype `dtype`.
void check_same(const OpDescriptor& desc, std::size_t index, const char* name, const char* first_name) {
  const TensorDesc& first = desc.inputs[0];
  const TensorDesc& input = desc.inputs[index];
  XPURT_CHECK_TYPE(input.dtype == first.dtype, "op '", desc.op, "': input '", name, "' must have the dtype of '",
                   first_name, "' (", dtype_name(first.dtype), "), got ", dtype_name(input.dtype));
  XPURT_CHECK(input.device == first.device, "op '", desc.op, "': input '", name, "' is on ", input.device.str(),
              " but '", first_name, "' is on ", first.device.str(), "; move them to one device first");
}

void check_any_dtype(const OpDescriptor& desc, std::size_t index, const char* name) {
  XPURT_CHECK_TYPE(data_ops::is_any_supported_dtype(desc.inputs[index].dtype), "op '", desc.op, "': input '", name,
                   "' has unsupported dtype ", dtype_name(desc.inputs[index].dtype));
}

// ---- data movement ----

std::vector<TensorDesc> infer_transpose(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  const auto rank = static_cast<std::int64_t>(x.dim());
  Shape perm = desc.attrs.get_ints("perm", {});
  if (!desc.attrs.has("perm")) {
    for (std::int64_t k = rank - 1; k >= 0; --k) perm.push_back(k);
  }
  XPURT_CHECK(static_cast<std::int64_t>(perm.size()) == rank, "op 'transpose': perm ", shape_str(perm), " must have ",
              rank, " entries (the rank of x ", shape_str(x.shape), ")");
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  Shape out;
  for (const std::int64_t p : perm) {
    const std::int64_t axis = normalize_axis(p, rank, "transpose", "perm entry");
    XPURT_CHECK(!seen[static_cast<std::size_t>(axis)], "op 'transpose': perm ", shape_str(perm),
                " is not a permutation (axis ", axis, " appears twice)");
    seen[static_cast<std::size_t>(axis)] = true;
    out.push_back(x.shape[static_cast<std::size_t>(axis)]);
  }
  return {output_of(x, out, x.dtype)};
}

std::vector<TensorDesc> infer_concat(const OpDescriptor& desc) {
  const TensorDesc& first = desc.inputs[0];
  check_any_dtype(desc, 0, "x");
  const auto rank = static_cast<std::int64_t>(first.dim());
  XPURT_CHECK(rank >= 1, "op 'concat': inputs must have rank >= 1, input 0 is a scalar");
  XPURT_CHECK(desc.attrs.has("axis"), "op 'concat': attribute 'axis' is required");
  const std::int64_t axis = normalize_axis(desc.attrs.get_int("axis", 0), rank, "concat", "axis");
  Shape out = first.shape;
  out[static_cast<std::size_t>(axis)] = 0;
  for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
    const TensorDesc& input = desc.inputs[k];
    const std::string name = detail::str_cat("x", k);
    check_same(desc, k, name.c_str(), "x0");
    bool compatible = input.dim() == rank;
    for (std::int64_t d = 0; compatible && d < rank; ++d) {
      compatible = d == axis || input.shape[static_cast<std::size_t>(d)] == first.shape[static_cast<std::size_t>(d)];
    }
    XPURT_CHECK(compatible, "op 'concat': input ", k, " ", shape_str(input.shape), " must match input 0 ",
                shape_str(first.shape), " in every dimension but axis ", axis);
    out[static_cast<std::size_t>(axis)] += input.shape[static_cast<std::size_t>(axis)];
  }
  return {output_of(first, out, first.dtype)};
}

std::vector<TensorDesc> infer_slice(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  const auto rank = static_cast<std::int64_t>(x.dim());
  XPURT_CHECK(desc.attrs.has("starts") && desc.attrs.has("ends"), "op 'slice': attributes 'starts' and 'ends' are "
              "required");
  const Shape starts = desc.attrs.get_ints("starts", {});
  const Shape ends = desc.attrs.get_ints("ends", {});
  XPURT_CHECK(starts.size() == ends.size(), "op 'slice': starts ", shape_str(starts), " and ends ", shape_str(ends),
              " must have the same length");
  XPURT_CHECK(static_cast<std::int64_t>(starts.size()) <= rank, "op 'slice': ", starts.size(),
              " starts for a tensor of rank ", rank);
  Shape axes = desc.attrs.get_ints("axes", {});
  if (!desc.attrs.has("axes")) {
    for (std::size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<std::int64_t>(k));
  }
  const Shape steps = desc.attrs.get_ints("steps", Shape(starts.size(), 1));
  XPURT_CHECK(axes.size() == starts.size() && steps.size() == starts.size(), "op 'slice': axes ", shape_str(axes),
              " and steps ", shape_str(steps), " must have one entry per start (", starts.size(), ")");
  Shape out = x.shape;
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const std::int64_t axis = normalize_axis(axes[k], rank, "slice", "axes entry");
    XPURT_CHECK(!seen[static_cast<std::size_t>(axis)], "op 'slice': axis ", axis, " appears twice in axes ",
                shape_str(axes));
    seen[static_cast<std::size_t>(axis)] = true;
    XPURT_CHECK(steps[k] != 0, "op 'slice': steps must not be 0, got ", shape_str(steps));
    out[static_cast<std::size_t>(axis)] =
        data_ops::resolve_slice(x.shape[static_cast<std::size_t>(axis)], starts[k], ends[k], steps[k]).size;
  }
  return {output_of(x, out, x.dtype)};
}

std::vector<TensorDesc> infer_gather(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "data");
  const TensorDesc& data = desc.inputs[0];
  const TensorDesc& indices = desc.inputs[1];
  XPURT_CHECK_TYPE(indices.dtype == DType::kInt32 || indices.dtype == DType::kInt64,
                   "op 'gather': input 'indices' must be int32 or int64, got ", dtype_name(indices.dtype));
  XPURT_CHECK(indices.device == data.device, "op 'gather': input 'indices' is on ", indices.device.str(),
              " but 'data' is on ", data.device.str(), "; move them to one device first");
  const auto rank = static_cast<std::int64_t>(data.dim());
  XPURT_CHECK(rank >= 1, "op 'gather': input 'data' must have rank >= 1, got a scalar");
  const auto axis = static_cast<std::size_t>(normalize_axis(desc.attrs.get_int("axis", 0), rank, "gather", "axis"));
  XPURT_CHECK(data.shape[axis] > 0 || indices.numel() == 0, "op 'gather': cannot gather from the empty axis ", axis,
              " of data ", shape_str(data.shape));
  Shape out(data.shape.begin(), data.shape.begin() + static_cast<std::ptrdiff_t>(axis));
  out.insert(out.end(), indices.shape.begin(), indices.shape.end());
  out.insert(out.end(), data.shape.begin() + static_cast<std::ptrdiff_t>(axis) + 1, data.shape.end());
  return {output_of(data, out, data.dtype)};
}

std::vector<TensorDesc> infer_expand(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK(desc.attrs.has("shape"), "op 'expand': attribute 'shape' is required");
  const Shape shape = desc.attrs.get_ints("shape", {});
  for (const std::int64_t d : shape) {
    XPURT_CHECK(d >= 0, "op 'expand': shape ", shape_str(shape), " has a negative dimension");
  }
  return {output_of(x, broadcast(x.shape, shape, "expand", "x", "shape"), x.dtype)};
}

// ---- elementwise over every dtype ----

std::vector<TensorDesc> infer_where(const OpDescriptor& desc) {
  const TensorDesc& cond = desc.inputs[0];
  XPURT_CHECK_TYPE(cond.dtype == DType::kBool, "op 'where': input 'cond' must be bool, got ", dtype_name(cond.dtype));
  check_any_dtype(desc, 1, "a");
  const TensorDesc& a = desc.inputs[1];
  const TensorDesc& b = desc.inputs[2];
  XPURT_CHECK_TYPE(b.dtype == a.dtype, "op 'where': inputs 'a' and 'b' must have one dtype, got ", dtype_name(a.dtype),
                   " and ", dtype_name(b.dtype));
  XPURT_CHECK(a.device == cond.device && b.device == cond.device, "op 'where': 'cond', 'a' and 'b' must be on one "
              "device, got ", cond.device.str(), ", ", a.device.str(), " and ", b.device.str());
  const Shape ab = broadcast(a.shape, b.shape, "where", "a", "b");
  return {output_of(a, broadcast(cond.shape, ab, "where", "cond", "broadcast(a, b)"), a.dtype)};
}

std::vector<TensorDesc> infer_compare(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "a");
  check_same(desc, 1, "b", "a");
  XPURT_CHECK_TYPE(desc.op == "equal" || desc.inputs[0].dtype != DType::kBool, "op '", desc.op,
                   "' compares numbers; bool inputs are only for 'equal'");
  return {output_of(desc.inputs[0], broadcast(desc.inputs[0].shape, desc.inputs[1].shape, desc.op, "a", "b"),
                    DType::kBool)};
}

std::vector<TensorDesc> infer_logical_not(const OpDescriptor& desc) {
  XPURT_CHECK_TYPE(desc.inputs[0].dtype == DType::kBool, "op 'logical_not': input 'x' must be bool, got ",
                   dtype_name(desc.inputs[0].dtype));
  return {output_of(desc.inputs[0], desc.inputs[0].shape, DType::kBool)};
}

std::vector<TensorDesc> infer_cast(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "x");
  XPURT_CHECK(desc.attrs.has("to"), "op 'cast': attribute 'to' (the dtype name) is required");
  const DType to = dtype_from_name(desc.attrs.get_string("to", ""));
  return {output_of(desc.inputs[0], desc.inputs[0].shape, to)};
}

bool is_arithmetic_dtype(DType dtype) {
  return data_ops::is_float_dtype(dtype) || data_ops::is_arithmetic_int_dtype(dtype);
}

std::vector<TensorDesc> infer_arithmetic_binary(const OpDescriptor& desc) {
  const TensorDesc& a = desc.inputs[0];
  XPURT_CHECK_TYPE(is_arithmetic_dtype(a.dtype), "op '", desc.op, "': input 'a' must be float32, float16, bfloat16, "
                   "float64, int32 or int64, got ", dtype_name(a.dtype));
  check_same(desc, 1, "b", "a");
  return {output_of(a, broadcast(a.shape, desc.inputs[1].shape, desc.op, "a", "b"), a.dtype)};
}

std::vector<TensorDesc> infer_neg(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK_TYPE(is_arithmetic_dtype(x.dtype), "op 'neg': input 'x' must be float32, float16, bfloat16, float64, "
                   "int32 or int64, got ", dtype_name(x.dtype));
  return {output_of(x, x.shape, x.dtype)};
}

}  // namespace

// Called from register_ops (op_schemas.cpp).
void register_data_ops(KernelRegistry& registry) {
  auto add = [&](std::string name, std::string family, std::vector<std::string> inputs, std::string doc,
                 std::function<std::vector<TensorDesc>(const OpDescriptor&)> infer) {
    OpSchema schema;
    schema.name = std::move(name);
    schema.family = std::move(family);
    schema.inputs = std::move(inputs);
    schema.doc = std::move(doc);
    schema.infer = std::move(infer);
    registry.add_schema(std::move(schema));
  };
  add("transpose", "data_movement", {"x"}, "y = x permuted by perm (default: reversed dims), any dtype",
      infer_transpose);
  add("concat", "data_movement", {"x..."}, "concatenation of 1..N inputs along axis (required), any dtype",
      infer_concat);
  add("slice", "data_movement", {"x"},
      "ONNX Slice: starts, ends (required), axes (default 0..len-1), steps (default 1); clamped, negative ok",
      infer_slice);
  add("gather", "data_movement", {"data", "indices"},
      "ONNX Gather along axis (0): int32/int64 indices, negative ones count from the end", infer_gather);
  add("expand", "data_movement", {"x"}, "ONNX Expand: broadcast x with the int list 'shape' (bidirectional)",
      infer_expand);
  add("where", "elementwise", {"cond", "a", "b"}, "cond ? a : b with NumPy broadcasting; cond bool", infer_where);
  for (const char* op : {"equal", "less", "greater"}) {
    add(op, "elementwise", {"a", "b"}, std::string(op) + "(a, b) -> bool, NumPy broadcasting", infer_compare);
  }
  add("logical_not", "elementwise", {"x"}, "!x for bool x", infer_logical_not);
  add("cast", "elementwise", {"x"},
      "convert to the dtype 'to' (float->int truncates toward zero and saturates, NaN -> 0; ->bool is x != 0)",
      infer_cast);
  add("neg", "elementwise", {"x"}, "neg(x); float or int32/int64 (wrapping)", infer_neg);
  for (const char* op : {"add", "sub", "mul", "div"}) {
    add(op, "elementwise", {"a", "b"},
        std::string(op) + "(a, b) with NumPy broadcasting; float or int32/int64 (wrapping, division truncates)",
        infer_arithmetic_binary);
  }
}

}  // namespace xpuruntime
