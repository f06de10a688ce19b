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
#include "core/schema_outputs.h"
#include "core/shape_str.h"

namespace xpuruntime {

namespace {

using Shape = std::vector<std::int64_t>;

using detail::shape_str;

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


// ---- the ONNX ops beyond the core set ----

bool is_float_dtype(DType dtype) { return data_ops::is_float_dtype(dtype); }

void check_float(const OpDescriptor& desc, std::size_t index, const char* name) {
  XPURT_CHECK_TYPE(is_float_dtype(desc.inputs[index].dtype), "op '", desc.op, "': input '", name,
                   "' must be float32, float16, bfloat16 or float64, got ", dtype_name(desc.inputs[index].dtype));
}

std::vector<TensorDesc> infer_float_pointwise(const OpDescriptor& desc) {
  check_float(desc, 0, "x");
  if (desc.op == "is_nan" || desc.op == "is_inf") {
    return {output_of(desc.inputs[0], desc.inputs[0].shape, DType::kBool)};
  }
  return {output_of(desc.inputs[0], desc.inputs[0].shape, desc.inputs[0].dtype)};
}

std::vector<TensorDesc> infer_logical(const OpDescriptor& desc) {
  for (std::size_t k = 0; k < 2; ++k) {
    XPURT_CHECK_TYPE(desc.inputs[k].dtype == DType::kBool, "op '", desc.op, "': input '", k == 0 ? "a" : "b",
                     "' must be bool, got ", dtype_name(desc.inputs[k].dtype));
  }
  check_same(desc, 1, "b", "a");
  return {output_of(desc.inputs[0], broadcast(desc.inputs[0].shape, desc.inputs[1].shape, desc.op, "a", "b"),
                    DType::kBool)};
}

std::vector<TensorDesc> infer_cum_sum(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK_TYPE(is_float_dtype(x.dtype) || data_ops::is_arithmetic_int_dtype(x.dtype), "op 'cum_sum': input 'x' "
                   "must be a float, int32 or int64 tensor, got ", dtype_name(x.dtype));
  XPURT_CHECK(x.dim() >= 1, "op 'cum_sum': input 'x' must have rank >= 1, got a scalar");
  XPURT_CHECK(desc.attrs.has("axis"), "op 'cum_sum': attribute 'axis' is required");
  normalize_axis(desc.attrs.get_int("axis", 0), x.dim(), "cum_sum", "axis");
  return {output_of(x, x.shape, x.dtype)};
}

void check_indices(const OpDescriptor& desc) {
  const TensorDesc& indices = desc.inputs[1];
  XPURT_CHECK_TYPE(indices.dtype == DType::kInt32 || indices.dtype == DType::kInt64, "op '", desc.op,
                   "': input 'indices' must be int32 or int64, got ", dtype_name(indices.dtype));
  XPURT_CHECK(indices.device == desc.inputs[0].device, "op '", desc.op, "': input 'indices' is on ",
              indices.device.str(), " but 'data' is on ", desc.inputs[0].device.str(),
              "; move them to one device first");
}

std::vector<TensorDesc> infer_gather_elements(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "data");
  check_indices(desc);
  const TensorDesc& data = desc.inputs[0];
  const TensorDesc& indices = desc.inputs[1];
  XPURT_CHECK(data.dim() >= 1 && indices.dim() == data.dim(), "op 'gather_elements': 'indices' ",
              shape_str(indices.shape), " must have the rank of 'data' ", shape_str(data.shape), " (>= 1)");
  const std::int64_t axis = normalize_axis(desc.attrs.get_int("axis", 0), data.dim(), "gather_elements", "axis");
  for (int d = 0; d < data.dim(); ++d) {
    XPURT_CHECK(d == axis || indices.shape[d] <= data.shape[d], "op 'gather_elements': 'indices' ",
                shape_str(indices.shape), " exceeds 'data' ", shape_str(data.shape), " in dimension ", d);
  }
  XPURT_CHECK(data.shape[static_cast<std::size_t>(axis)] > 0 || indices.numel() == 0, "op 'gather_elements': cannot "
              "gather from the empty axis ", axis, " of data ", shape_str(data.shape));
  return {output_of(data, indices.shape, data.dtype)};
}

std::vector<TensorDesc> infer_gather_nd(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "data");
  check_indices(desc);
  const TensorDesc& data = desc.inputs[0];
  const TensorDesc& indices = desc.inputs[1];
  const std::int64_t b = desc.attrs.get_int("batch_dims", 0);
  XPURT_CHECK(indices.dim() >= 1 && b >= 0 && b < indices.dim() && b < data.dim(), "op 'gather_nd': batch_dims=", b,
              " must be below the ranks of 'data' ", shape_str(data.shape), " and 'indices' ",
              shape_str(indices.shape));
  for (std::int64_t k = 0; k < b; ++k) {
    XPURT_CHECK(data.shape[static_cast<std::size_t>(k)] == indices.shape[static_cast<std::size_t>(k)],
                "op 'gather_nd': the batch dims of 'data' ", shape_str(data.shape), " and 'indices' ",
                shape_str(indices.shape), " differ");
  }
  const std::int64_t depth = indices.shape.back();
  XPURT_CHECK(depth >= 1 && b + depth <= data.dim(), "op 'gather_nd': index tuples of ", depth,
              " entries do not fit 'data' ", shape_str(data.shape), " after ", b, " batch dims");
  Shape out(indices.shape.begin(), indices.shape.end() - 1);
  out.insert(out.end(), data.shape.begin() + b + depth, data.shape.end());
  return {output_of(data, out, data.dtype)};
}

std::vector<TensorDesc> infer_pad(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  const Shape pads = desc.attrs.get_ints("pads", {});
  XPURT_CHECK(static_cast<std::int64_t>(pads.size()) == 2 * x.dim(), "op 'pad': 'pads' ", shape_str(pads),
              " must have 2 x rank = ", 2 * x.dim(), " entries (all begins, then all ends) for x ", shape_str(x.shape));
  const std::string mode = desc.attrs.get_string("mode", "constant");
  XPURT_CHECK(mode == "constant" || mode == "reflect" || mode == "edge" || mode == "wrap", "op 'pad': mode must be "
              "constant, reflect, edge or wrap, got '", mode, "'");
  Shape out = x.shape;
  for (int d = 0; d < x.dim(); ++d) {
    XPURT_CHECK(!__builtin_add_overflow(x.shape[d], pads[d], &out[d]) &&
                    !__builtin_add_overflow(out[d], pads[d + x.dim()], &out[d]),
                "op 'pad': pads ", shape_str(pads), " overflow int64 in dimension ", d);
    XPURT_CHECK(out[d] >= 0, "op 'pad': pads ", shape_str(pads), " crop dimension ", d, " of x ", shape_str(x.shape),
                " below zero");
    const bool padded = pads[d] > 0 || pads[d + x.dim()] > 0;
    XPURT_CHECK(!padded || mode == "constant" || x.shape[d] > 0, "op 'pad': ", mode, " mode cannot pad the empty "
                "dimension ", d, " of x ", shape_str(x.shape));
    XPURT_CHECK(!padded || mode != "reflect" || x.shape[d] > 1, "op 'pad': reflect mode needs at least 2 elements "
                "along padded dimension ", d, " of x ", shape_str(x.shape));
  }
  return {output_of(x, out, x.dtype)};
}

std::vector<TensorDesc> infer_resize(const OpDescriptor& desc) {
  check_float(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  const Shape sizes = desc.attrs.get_ints("sizes", {});
  const std::vector<double> scales = desc.attrs.get_floats("scales", {});
  XPURT_CHECK(static_cast<int>(sizes.size()) == x.dim() && static_cast<int>(scales.size()) == x.dim(),
              "op 'resize': 'sizes' ", shape_str(sizes), " and 'scales' (", scales.size(),
              " entries) must have one entry per dimension of x ", shape_str(x.shape));
  for (int d = 0; d < x.dim(); ++d) {
    XPURT_CHECK(sizes[d] >= 0 && scales[d] > 0, "op 'resize': dimension ", d, " has size ", sizes[d], " and scale ",
                scales[d], "; sizes must be >= 0 and scales > 0");
  }
  const std::string mode = desc.attrs.get_string("mode", "nearest");
  XPURT_CHECK(mode == "nearest" || mode == "linear" || mode == "cubic", "op 'resize': mode must be nearest, linear "
              "or cubic, got '", mode, "'");
  return {output_of(x, sizes, x.dtype)};
}

std::vector<TensorDesc> infer_log_softmax(const OpDescriptor& desc) {
  check_float(desc, 0, "x");
  normalize_axis(desc.attrs.get_int("axis", -1), desc.inputs[0].dim(), "log_softmax", "axis");
  return {output_of(desc.inputs[0], desc.inputs[0].shape, desc.inputs[0].dtype)};
}

std::vector<TensorDesc> infer_prelu(const OpDescriptor& desc) {
  check_float(desc, 0, "x");
  check_same(desc, 1, "slope", "x");
  const Shape& x = desc.inputs[0].shape;
  XPURT_CHECK(broadcast(x, desc.inputs[1].shape, "prelu", "x", "slope") == x, "op 'prelu': slope ",
              shape_str(desc.inputs[1].shape), " must broadcast to x ", shape_str(x));
  return {output_of(desc.inputs[0], x, desc.inputs[0].dtype)};
}

std::vector<TensorDesc> infer_mod(const OpDescriptor& desc) {
  const TensorDesc& a = desc.inputs[0];
  const bool fmod = desc.attrs.get_int("fmod", 0) != 0;
  XPURT_CHECK_TYPE(data_ops::is_arithmetic_int_dtype(a.dtype) || (fmod && is_float_dtype(a.dtype)), "op 'mod': "
                   "input 'a' must be int32 or int64, or a float with fmod=1 (ONNX), got ", dtype_name(a.dtype),
                   " with fmod=", fmod ? 1 : 0);
  check_same(desc, 1, "b", "a");
  return {output_of(a, broadcast(a.shape, desc.inputs[1].shape, "mod", "a", "b"), a.dtype)};
}

std::vector<TensorDesc> infer_one_hot(const OpDescriptor& desc) {
  const TensorDesc& indices = desc.inputs[0];
  XPURT_CHECK_TYPE(indices.dtype == DType::kInt32 || indices.dtype == DType::kInt64, "op 'one_hot': input "
                   "'indices' must be int32 or int64, got ", dtype_name(indices.dtype));
  const std::int64_t depth = desc.attrs.get_int("depth", -1);
  XPURT_CHECK(depth >= 1, "op 'one_hot': attribute 'depth' must be >= 1, got ", depth);
  const DType dtype = dtype_from_name(desc.attrs.get_string("dtype", "float32"));
  const std::int64_t rank = indices.dim() + 1;
  const std::int64_t axis = normalize_axis(desc.attrs.get_int("axis", -1), rank, "one_hot", "axis");
  Shape out = indices.shape;
  out.insert(out.begin() + axis, depth);
  return {output_of(indices, out, dtype)};
}

std::vector<TensorDesc> infer_trilu(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "x");
  XPURT_CHECK(desc.inputs[0].dim() >= 2, "op 'trilu': x must have rank >= 2, got ", shape_str(desc.inputs[0].shape));
  return {output_of(desc.inputs[0], desc.inputs[0].shape, desc.inputs[0].dtype)};
}

std::vector<TensorDesc> infer_tile(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  const Shape repeats = desc.attrs.get_ints("repeats", {});
  XPURT_CHECK(static_cast<int>(repeats.size()) == x.dim(), "op 'tile': 'repeats' ", shape_str(repeats),
              " must have one entry per dimension of x ", shape_str(x.shape));
  Shape out = x.shape;
  for (int d = 0; d < x.dim(); ++d) {
    XPURT_CHECK(repeats[d] >= 0, "op 'tile': repeats ", shape_str(repeats), " has a negative entry");
    XPURT_CHECK(!__builtin_mul_overflow(x.shape[d], repeats[d], &out[d]), "op 'tile': x ", shape_str(x.shape),
                " repeated ", shape_str(repeats), " overflows int64 in dimension ", d);
  }
  return {output_of(x, out, x.dtype)};
}

std::vector<TensorDesc> infer_scatter_nd(const OpDescriptor& desc) {
  check_any_dtype(desc, 0, "data");
  check_indices(desc);
  check_same(desc, 2, "updates", "data");
  const TensorDesc& data = desc.inputs[0];
  const TensorDesc& indices = desc.inputs[1];
  const std::string reduction = desc.attrs.get_string("reduction", "none");
  XPURT_CHECK(reduction == "none" || reduction == "add" || reduction == "mul" || reduction == "max" ||
                  reduction == "min",
              "op 'scatter_nd': reduction must be none, add, mul, max or min, got '", reduction, "'");
  XPURT_CHECK_TYPE(reduction == "none" || desc.inputs[0].dtype != DType::kBool, "op 'scatter_nd': reduction '",
                   reduction, "' does not take bool data");
  XPURT_CHECK(indices.dim() >= 1 && indices.shape.back() >= 1 && indices.shape.back() <= data.dim(), "op "
              "'scatter_nd': index tuples of ", indices.shape.empty() ? 0 : indices.shape.back(),
              " entries do not fit data ", shape_str(data.shape));
  Shape expected(indices.shape.begin(), indices.shape.end() - 1);
  expected.insert(expected.end(), data.shape.begin() + indices.shape.back(), data.shape.end());
  XPURT_CHECK(desc.inputs[2].shape == expected, "op 'scatter_nd': updates ", shape_str(desc.inputs[2].shape),
              " must have shape ", shape_str(expected), " (indices.shape[:-1] + data.shape[depth:])");
  return {output_of(data, data.shape, data.dtype)};
}

std::vector<TensorDesc> infer_arg_reduce(const OpDescriptor& desc) {
  check_float(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK(x.dim() >= 1, "op '", desc.op, "': x must have rank >= 1");
  const std::int64_t axis = normalize_axis(desc.attrs.get_int("axis", 0), x.dim(), desc.op, "axis");
  XPURT_CHECK(x.shape[static_cast<std::size_t>(axis)] > 0, "op '", desc.op, "': cannot reduce the empty axis ", axis);
  Shape out = x.shape;
  if (desc.attrs.get_int("keepdims", 1) != 0) {
    out[static_cast<std::size_t>(axis)] = 1;
  } else {
    out.erase(out.begin() + axis);
  }
  return {output_of(x, out, DType::kInt64)};
}

std::vector<TensorDesc> infer_top_k(const OpDescriptor& desc) {
  check_float(desc, 0, "x");
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK(x.dim() >= 1, "op 'top_k': x must have rank >= 1");
  const std::int64_t axis = normalize_axis(desc.attrs.get_int("axis", -1), x.dim(), "top_k", "axis");
  const std::int64_t k = desc.attrs.get_int("k", -1);
  XPURT_CHECK(k >= 0 && k <= x.shape[static_cast<std::size_t>(axis)], "op 'top_k': k=", k, " must be in [0, ",
              x.shape[static_cast<std::size_t>(axis)], "] (the size of axis ", axis, ")");
  Shape out = x.shape;
  out[static_cast<std::size_t>(axis)] = k;
  return {output_of(x, out, x.dtype), output_of(x, out, DType::kInt64)};
}

// Note [Segmented plans] (capture_plan.h): the bounded forms of NonZero and NonMaxSuppression.
std::vector<TensorDesc> infer_non_zero(const OpDescriptor& desc) {
  const TensorDesc& x = desc.inputs[0];
  XPURT_CHECK(x.dim() >= 1, "op 'non_zero': x must have rank >= 1, got a scalar");
  return {output_of(x, {static_cast<std::int64_t>(x.dim()), x.numel()}, DType::kInt64),
          output_of(x, {1}, DType::kInt64)};
}

std::vector<TensorDesc> infer_non_max_suppression(const OpDescriptor& desc) {
  check_float(desc, 0, "boxes");
  check_float(desc, 1, "scores");
  const TensorDesc& boxes = desc.inputs[0];
  const TensorDesc& scores = desc.inputs[1];
  XPURT_CHECK(boxes.dim() == 3 && boxes.shape[2] == 4, "op 'non_max_suppression': boxes must be [batches, boxes, 4], "
              "got ", shape_str(boxes.shape));
  XPURT_CHECK(scores.dim() == 3 && scores.shape[0] == boxes.shape[0] && scores.shape[2] == boxes.shape[1],
              "op 'non_max_suppression': scores must be [batches, classes, boxes] matching boxes ",
              shape_str(boxes.shape), ", got ", shape_str(scores.shape));
  XPURT_CHECK_TYPE(boxes.dtype == scores.dtype, "op 'non_max_suppression': boxes and scores must have one dtype, got ",
                   dtype_name(boxes.dtype), " and ", dtype_name(scores.dtype));
  const std::int64_t center = desc.attrs.get_int("center_point_box", 0);
  XPURT_CHECK(center == 0 || center == 1, "op 'non_max_suppression': center_point_box must be 0 or 1, got ", center);
  const std::int64_t per_class =
      std::min(std::max<std::int64_t>(desc.attrs.get_int("max_output_boxes_per_class", 0), 0), boxes.shape[1]);
  return {output_of(boxes, {boxes.shape[0] * scores.shape[1] * per_class, 3}, DType::kInt64),
          output_of(boxes, {1}, DType::kInt64)};
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
  for (const char* op : {"clip", "hard_sigmoid", "hard_swish", "leaky_relu", "elu", "softplus", "sin", "cos", "floor",
                         "ceil", "round", "sign", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                         "atanh", "softsign", "selu", "celu", "thresholded_relu", "mish"}) {
    add(op, "activation", {"x"}, std::string(op) + "(x) as ONNX defines it (docs/ops.md); float dtypes",
        infer_float_pointwise);
  }
  add("is_nan", "elementwise", {"x"}, "isnan(x) -> bool; float dtypes", infer_float_pointwise);
  add("is_inf", "elementwise", {"x"}, "x == +inf (detect_positive=1) or -inf (detect_negative=1) -> bool",
      infer_float_pointwise);
  for (const char* op : {"logical_and", "logical_or", "logical_xor"}) {
    add(op, "elementwise", {"a", "b"}, std::string(op) + "(a, b) of bools, NumPy broadcasting", infer_logical);
  }
  add("cum_sum", "reduce", {"x"}, "ONNX CumSum along axis (required); exclusive=0, reverse=0", infer_cum_sum);
  add("gather_elements", "data_movement", {"data", "indices"},
      "ONNX GatherElements along axis (0): y[i] = data[i with i[axis] = indices[i]]", infer_gather_elements);
  add("gather_nd", "data_movement", {"data", "indices"},
      "ONNX GatherND: index tuples in the last dim of 'indices'; batch_dims=0", infer_gather_nd);
  add("pad", "data_movement", {"x"},
      "ONNX Pad: pads (all begins, then all ends; negative crops), mode=constant|reflect|edge|wrap, value=0",
      infer_pad);
  add("resize", "data_movement", {"x"},
      "ONNX Resize to 'sizes' (every dim) with per-dim 'scales' for the coordinate transform; mode=nearest|linear|"
      "cubic, coordinate_transformation_mode (every ONNX mode), nearest_mode, cubic_coeff_a, exclude_outside, "
      "antialias",
      infer_resize);
  add("log_softmax", "softmax", {"x"}, "log(softmax(x)) along axis (-1)", infer_log_softmax);
  add("prelu", "activation", {"x", "slope"}, "x < 0 ? slope * x : x; slope broadcasts to x", infer_prelu);
  add("mod", "elementwise", {"a", "b"},
      "ONNX Mod: fmod=0 (int32/int64: the sign of b) or fmod=1 (C fmod: the sign of a; floats need it)", infer_mod);
  add("one_hot", "data_movement", {"indices"},
      "ONNX OneHot: depth (required), axis (-1), on (1), off (0), dtype (float32)", infer_one_hot);
  add("trilu", "data_movement", {"x"}, "ONNX Trilu over the last two dims: upper (1), k (0)", infer_trilu);
  add("tile", "data_movement", {"x"}, "ONNX Tile: repeats (required, one per dim)", infer_tile);
  add("scatter_nd", "data_movement", {"data", "indices", "updates"},
      "ONNX ScatterND: data with updates written at the index tuples in order; reduction none (duplicates: the last "
      "wins), add, mul, max or min (combined step by step in the element type)",
      infer_scatter_nd);
  for (const char* op : {"arg_max", "arg_min"}) {
    add(op, "reduce", {"x"}, std::string(op) + " along axis (0) -> int64; keepdims (1), select_last_index (0)",
        infer_arg_reduce);
  }
  {
    OpSchema non_zero;
    non_zero.name = "non_zero";
    non_zero.family = "data_dependent";
    non_zero.inputs = {"x"};
    non_zero.outputs = {"indices", "count"};
    non_zero.doc = "ONNX NonZero, bounded (Note [Segmented plans]): int64 indices [rank, numel] whose first count "
                   "columns are the result, and count int64 [1]";
    non_zero.infer = infer_non_zero;
    registry.add_schema(std::move(non_zero));
    OpSchema nms;
    nms.name = "non_max_suppression";
    nms.family = "data_dependent";
    nms.inputs = {"boxes", "scores"};
    nms.outputs = {"selected", "count"};
    nms.doc = "ONNX NonMaxSuppression, bounded: center_point_box (0), max_output_boxes_per_class (0), iou_threshold "
              "(0), score_threshold (absent: none) -> int64 [batches * classes * min(max, boxes), 3] whose first "
              "count rows are the (batch, class, box) triples, and count int64 [1]";
    nms.infer = infer_non_max_suppression;
    registry.add_schema(std::move(nms));
  }
  {
    OpSchema top_k;
    top_k.name = "top_k";
    top_k.family = "reduce";
    top_k.inputs = {"x"};
    top_k.outputs = {"values", "indices"};
    top_k.doc = "ONNX TopK: k (required), axis (-1), largest (1), sorted (1) -> values, int64 indices";
    top_k.infer = infer_top_k;
    registry.add_schema(std::move(top_k));
  }
}

}  // namespace xpuruntime
