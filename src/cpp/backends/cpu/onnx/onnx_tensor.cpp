// ONNX reference ops (tensor group): see backends/cpu/onnx/onnx_kernels.h. This file: constants, shapes and
// data movement (Reshape, Transpose, Concat, Split, Slice, Expand, Tile, Pad, ...); index ops are in
// onnx_tensor_index.cpp, reductions and Einsum in onnx_tensor_reduce.cpp.
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/onnx/onnx_tensor_internal.h"
#include "core/scalar.h"
#include "xpuruntime/onnx_dtype.h"

namespace xpuruntime::onnx_ref {

void copy_strided(const Tensor& in, Tensor& out, std::int64_t base, const std::vector<std::int64_t>& strides) {
  if (out.numel() == 0) return;
  const std::vector<std::int64_t> unused(strides.size(), 0);
  visit_bits(in.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* src = data<U>(in) + base;
    U* dst = data<U>(out);
    for_each_index2(out.shape(), strides, unused,
                    [&](std::int64_t offset, std::int64_t, std::int64_t linear) { dst[linear] = src[offset]; });
  });
}

Tensor reshaped_copy(const Tensor& in, const std::vector<std::int64_t>& shape) {
  XPURT_INTERNAL_ASSERT(numel_of(shape) == in.numel(), "reshaped_copy: element count changes");
  Tensor out = Tensor::empty(shape, in.dtype());
  if (in.nbytes() != 0) std::memcpy(out.data_ptr(), in.data_ptr(), in.nbytes());
  return out;
}

std::optional<std::vector<std::int64_t>> ints_attr_or_input(const OpContext& ctx, const std::string& name,
                                                            std::int64_t input_since, std::size_t input_index) {
  if (ctx.opset() < input_since) {
    if (!ctx.node().attrs.has(name)) return std::nullopt;
    return ctx.attr_ints(name, {});
  }
  if (!ctx.has_input(input_index)) return std::nullopt;
  return read_ints(ctx.input(input_index), detail::str_cat(ctx.where(), " input '", name, "'"));
}

std::vector<std::int64_t> normalize_axes(const std::vector<std::int64_t>& axes, std::int64_t rank,
                                         const std::string& where) {
  std::vector<std::int64_t> out;
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  for (std::int64_t a : axes) {
    XPURT_CHECK(a >= -rank && a < rank, where, ": axis ", a, " is out of range for rank ", rank);
    const std::int64_t n = a < 0 ? a + rank : a;
    XPURT_CHECK(!seen[static_cast<std::size_t>(n)], where, ": axis ", a, " is repeated");
    seen[static_cast<std::size_t>(n)] = true;
    out.push_back(n);
  }
  return out;
}

DType dtype_from_onnx_code(std::int64_t code, const std::string& where) {
  DType dtype;
  if (dtype_from_onnx_type(code, &dtype)) return dtype;
  throw InvalidTypeError(detail::str_cat(where, ": ONNX element type ", code,
                                         " has no xpuruntime dtype (supported: float16, bfloat16, float32, float64, "
                                         "int8, uint8, int16, int32, int64, bool)"));
}

namespace {

using Shape = std::vector<std::int64_t>;

// Stores `value` (a double) into element 0 of a one-element tensor of dtype `dtype`.
Tensor scalar_tensor(const Shape& shape, DType dtype, double value) {
  Tensor t = Tensor::empty(shape, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    *data<T>(t) = Compute<T>::store(static_cast<C>(value));
  });
  return t;
}

Tensor int64_tensor(const Shape& shape, const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty(shape, DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

void constant(OpContext& ctx) {
  const Node& node = ctx.node();
  if (const Tensor* value = ctx.attr_tensor("value")) {
    ctx.set_output(0, *value);
    return;
  }
  if (node.attrs.has("value_float")) {
    ctx.set_output(0, scalar_tensor({}, DType::kFloat32, ctx.attr_float("value_float", 0.0)));
  } else if (node.attrs.has("value_int")) {
    ctx.set_output(0, int64_tensor({}, {ctx.attr_int("value_int", 0)}));
  } else if (node.attrs.has("value_floats")) {
    const std::vector<double> values = ctx.attr_floats("value_floats", {});
    Tensor& out = ctx.allocate_output(0, {static_cast<std::int64_t>(values.size())}, DType::kFloat32);
    for (std::size_t i = 0; i < values.size(); ++i) data<float>(out)[i] = static_cast<float>(values[i]);
  } else if (node.attrs.has("value_ints")) {
    const std::vector<std::int64_t> values = ctx.attr_ints("value_ints", {});
    ctx.set_output(0, int64_tensor({static_cast<std::int64_t>(values.size())}, values));
  } else if (ctx.has_attr("value_string") || ctx.has_attr("value_strings")) {
    throw UnsupportedOperationError(
        detail::str_cat(ctx.where(), ": string tensors (value_string/value_strings) are not supported"));
  } else if (ctx.has_attr("sparse_value")) {
    throw UnsupportedOperationError(detail::str_cat(ctx.where(), ": sparse_value is not supported"));
  } else {
    throw InvalidArgumentError(
        detail::str_cat(ctx.where(), ": expected one of the attributes value, value_float(s), value_int(s)"));
  }
}

void constant_of_shape(OpContext& ctx) {
  const Shape shape = read_ints(ctx.input(0), ctx.where() + " input 'input'");
  for (std::int64_t d : shape) XPURT_CHECK(d >= 0, ctx.where(), ": negative dimension ", d, " in the shape");
  DType dtype = DType::kFloat32;
  const Tensor* value = ctx.attr_tensor("value");
  if (value != nullptr) {
    XPURT_CHECK(value->numel() == 1, ctx.where(), ": attribute 'value' must have one element, got ",
                value->numel());
    dtype = value->dtype();
  }
  Tensor& out = ctx.allocate_output(0, shape, dtype);
  visit_bits(dtype, [&](auto tag) {
    using U = decltype(tag);
    U fill{};
    if (value != nullptr) std::memcpy(&fill, value->contiguous().data_ptr(), sizeof(U));
    std::fill(data<U>(out), data<U>(out) + out.numel(), fill);
  });
}

void shape_op(OpContext& ctx) {
  const Shape& shape = ctx.input(0).shape();
  const auto rank = static_cast<std::int64_t>(shape.size());
  std::int64_t start = ctx.attr_int("start", 0);
  std::int64_t end = ctx.attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<std::int64_t>(start, 0, rank);
  end = std::clamp<std::int64_t>(end, 0, rank);
  const std::vector<std::int64_t> dims(shape.begin() + start, shape.begin() + std::max(start, end));
  ctx.set_output(0, int64_tensor({static_cast<std::int64_t>(dims.size())}, dims));
}

void reshape(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape shape;
  if (ctx.opset() < 5) {
    shape = ctx.attr_ints("shape", {});
  } else {
    shape = read_ints(ctx.input(1), ctx.where() + " input 'shape'");
  }
  const bool allowzero = ctx.attr_int("allowzero", 0) != 0;
  std::int64_t infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allowzero) {
      XPURT_CHECK(i < x.shape().size(), ctx.where(), ": shape[", i, "] = 0 copies a dimension the input (",
                  x.dim(), "-D) does not have");
      shape[i] = x.shape()[i];
    }
    if (shape[i] == -1) {
      XPURT_CHECK(infer < 0, ctx.where(), ": the shape has more than one -1");
      infer = static_cast<std::int64_t>(i);
      continue;
    }
    XPURT_CHECK(shape[i] >= 0, ctx.where(), ": invalid dimension ", shape[i], " in the shape");
    known *= shape[i];
  }
  if (infer >= 0) {
    XPURT_CHECK(known != 0 && x.numel() % known == 0, ctx.where(), ": cannot infer the -1 dimension: ",
                x.numel(), " elements into a multiple of ", known);
    shape[static_cast<std::size_t>(infer)] = x.numel() / known;
  }
  XPURT_CHECK(numel_of(shape) == x.numel(), ctx.where(), ": cannot reshape ", x.numel(),
              " elements into a shape of ", numel_of(shape));
  ctx.set_output(0, reshaped_copy(x, shape));
}

void flatten(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::int64_t rank = x.dim();
  std::int64_t axis = ctx.attr_int("axis", 1);
  XPURT_CHECK(axis >= -rank && axis <= rank, ctx.where(), ": axis ", axis, " is out of range for rank ", rank);
  if (axis < 0) axis += rank;
  std::int64_t outer = 1;
  for (std::int64_t i = 0; i < axis; ++i) outer *= x.shape()[static_cast<std::size_t>(i)];
  std::int64_t inner = 1;
  for (std::int64_t i = axis; i < rank; ++i) inner *= x.shape()[static_cast<std::size_t>(i)];
  ctx.set_output(0, reshaped_copy(x, {outer, inner}));
}

void squeeze(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto axes = ints_attr_or_input(ctx, "axes", 13, 1);
  std::vector<bool> drop(x.shape().size(), false);
  if (axes && !axes->empty()) {
    for (std::int64_t a : normalize_axes(*axes, x.dim(), ctx.where())) {
      XPURT_CHECK(x.shape()[static_cast<std::size_t>(a)] == 1, ctx.where(), ": cannot squeeze axis ", a,
                  " of size ", x.shape()[static_cast<std::size_t>(a)]);
      drop[static_cast<std::size_t>(a)] = true;
    }
  } else {
    for (std::size_t i = 0; i < drop.size(); ++i) drop[i] = x.shape()[i] == 1;
  }
  Shape shape;
  for (std::size_t i = 0; i < drop.size(); ++i) {
    if (!drop[i]) shape.push_back(x.shape()[i]);
  }
  ctx.set_output(0, reshaped_copy(x, shape));
}

void unsqueeze(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto axes = ints_attr_or_input(ctx, "axes", 13, 1);
  XPURT_CHECK(axes.has_value(), ctx.where(), ": 'axes' is required");
  const auto out_rank = static_cast<std::int64_t>(x.shape().size() + axes->size());
  std::vector<bool> inserted(static_cast<std::size_t>(out_rank), false);
  for (std::int64_t a : normalize_axes(*axes, out_rank, ctx.where())) inserted[static_cast<std::size_t>(a)] = true;
  Shape shape;
  std::size_t next = 0;
  for (std::size_t i = 0; i < inserted.size(); ++i) shape.push_back(inserted[i] ? 1 : x.shape()[next++]);
  ctx.set_output(0, reshaped_copy(x, shape));
}

void transpose(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::size_t rank = x.shape().size();
  Shape perm;
  if (ctx.node().attrs.has("perm")) {
    perm = ctx.attr_ints("perm", {});
  } else {
    for (std::size_t i = rank; i-- > 0;) perm.push_back(static_cast<std::int64_t>(i));
  }
  XPURT_CHECK(perm.size() == rank, ctx.where(), ": perm has ", perm.size(), " entries for a ", rank,
              "-D input");
  perm = normalize_axes(perm, static_cast<std::int64_t>(rank), ctx.where());
  const Shape in_strides = contiguous_strides(x.shape());
  Shape shape(rank), strides(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    shape[i] = x.shape()[static_cast<std::size_t>(perm[i])];
    strides[i] = in_strides[static_cast<std::size_t>(perm[i])];
  }
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  copy_strided(x, out, 0, strides);
}

void concat(OpContext& ctx) {
  XPURT_CHECK(ctx.num_inputs() >= 1, ctx.where(), ": expected at least one input");
  const Tensor& first = ctx.input(0);
  const std::int64_t rank = first.dim();
  std::int64_t axis = ctx.attr_int("axis", ctx.opset() < 4 ? 1 : std::numeric_limits<std::int64_t>::min());
  XPURT_CHECK(axis != std::numeric_limits<std::int64_t>::min(), ctx.where(), ": attribute 'axis' is required");
  // Found by fuzz_model: a 0-d input has no axis to concatenate along (its shape was indexed out of bounds).
  XPURT_CHECK(rank >= 1, ctx.where(), ": input 0 is 0-d; Concat takes tensors of rank 1 or more");
  axis = normalize_axis(axis, rank, ctx.where());
  std::vector<const Tensor*> inputs;
  for (std::size_t i = 0; i < ctx.num_inputs(); ++i) inputs.push_back(&ctx.input(i));
  Tensor& out = ctx.allocate_output(0, concat_shape(inputs, axis, ctx.where(), "input"), first.dtype());
  concat_into(inputs, axis, out);
}

void split(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where());
  const std::int64_t dim = x.shape()[static_cast<std::size_t>(axis)];
  const auto n = static_cast<std::int64_t>(ctx.num_outputs());
  std::optional<Shape> sizes;
  if (ctx.opset() < 2 && ctx.has_input(1)) {
    sizes = read_ints(ctx.input(1), ctx.where() + " input 'split'");
  } else {
    sizes = ints_attr_or_input(ctx, "split", 13, 1);
  }
  if (sizes && sizes->empty()) sizes.reset();
  if (sizes) {
    XPURT_CHECK(static_cast<std::int64_t>(sizes->size()) == n, ctx.where(), ": 'split' has ", sizes->size(),
                " entries for ", n, " outputs");
    std::int64_t total = 0;
    for (std::int64_t s : *sizes) {
      XPURT_CHECK(s >= 0, ctx.where(), ": negative split size ", s);
      total += s;
    }
    XPURT_CHECK(total == dim, ctx.where(), ": split sizes sum to ", total, ", the axis has ", dim);
  } else if (ctx.opset() >= 18 && ctx.node().attrs.has("num_outputs")) {
    const std::int64_t num = ctx.attr_int("num_outputs", n);
    XPURT_CHECK(num == n, ctx.where(), ": num_outputs is ", num, " but the node has ", n, " outputs");
    const std::int64_t chunk = (dim + n - 1) / n;
    sizes = Shape{};
    for (std::int64_t i = 0; i < n; ++i) sizes->push_back(std::max<std::int64_t>(0, std::min(chunk, dim - i * chunk)));
  } else {
    XPURT_CHECK(dim % n == 0, ctx.where(), ": the axis (", dim, ") does not split into ", n, " equal parts");
    sizes = Shape(static_cast<std::size_t>(n), dim / n);
  }
  const Shape strides = contiguous_strides(x.shape());
  std::int64_t start = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    Shape shape = x.shape();
    shape[static_cast<std::size_t>(axis)] = (*sizes)[static_cast<std::size_t>(i)];
    Tensor& out = ctx.allocate_output(static_cast<std::size_t>(i), shape, x.dtype());
    copy_strided(x, out, start * strides[static_cast<std::size_t>(axis)], strides);
    start += (*sizes)[static_cast<std::size_t>(i)];
  }
}

void slice(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::int64_t rank = x.dim();
  Shape starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.attr_ints("starts", {});
    ends = ctx.attr_ints("ends", {});
    axes = ctx.attr_ints("axes", {});
  } else {
    starts = read_ints(ctx.input(1), ctx.where() + " input 'starts'");
    ends = read_ints(ctx.input(2), ctx.where() + " input 'ends'");
    if (ctx.has_input(3)) axes = read_ints(ctx.input(3), ctx.where() + " input 'axes'");
    if (ctx.has_input(4)) steps = read_ints(ctx.input(4), ctx.where() + " input 'steps'");
  }
  XPURT_CHECK(starts.size() == ends.size(), ctx.where(), ": starts has ", starts.size(), " entries, ends ",
              ends.size());
  if (axes.empty()) {
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<std::int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  XPURT_CHECK(axes.size() == starts.size() && steps.size() == starts.size(), ctx.where(),
              ": starts, ends, axes and steps must have the same length (", starts.size(), ", ", ends.size(), ", ",
              axes.size(), ", ", steps.size(), ")");
  axes = normalize_axes(axes, rank, ctx.where());
  const Shape in_strides = contiguous_strides(x.shape());
  Shape shape = x.shape();
  Shape strides = in_strides;
  std::int64_t base = 0;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const auto a = static_cast<std::size_t>(axes[i]);
    const std::int64_t dim = x.shape()[a];
    const std::int64_t step = steps[i];
    XPURT_CHECK(step != 0, ctx.where(), ": step 0 on axis ", axes[i]);
    std::int64_t start = starts[i];
    std::int64_t end = ends[i];
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    std::int64_t count = 0;
    if (dim == 0) {
      count = 0;
    } else if (step > 0) {
      start = std::clamp<std::int64_t>(start, 0, dim);
      end = std::clamp<std::int64_t>(end, 0, dim);
      count = end > start ? (end - start + step - 1) / step : 0;
    } else {
      start = std::clamp<std::int64_t>(start, 0, dim - 1);
      end = std::clamp<std::int64_t>(end, -1, dim - 1);
      count = start > end ? (start - end + (-step) - 1) / (-step) : 0;
    }
    shape[a] = count;
    if (count > 0) base += start * in_strides[a];
    strides[a] = in_strides[a] * step;
  }
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  copy_strided(x, out, base, strides);
}

void expand(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Shape target = read_ints(ctx.input(1), ctx.where() + " input 'shape'");
  const Shape shape = broadcast_shapes(x.shape(), target, ctx.where());
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  copy_strided(x, out, 0, broadcast_strides(x.shape(), shape));
}

void tile(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape repeats;
  if (ctx.opset() < 6) {
    // Tile-1: inputs (input, tiles, axis): `tiles` copies along `axis`.
    const auto tiles = detail::scalar_as_int64(ctx.input(1), ctx.where() + " input 'tiles'");
    const std::int64_t axis = normalize_axis(
        detail::scalar_as_int64(ctx.input(2), ctx.where() + " input 'axis'"), x.dim(), ctx.where());
    repeats.assign(x.shape().size(), 1);
    repeats[static_cast<std::size_t>(axis)] = tiles;
  } else {
    repeats = read_ints(ctx.input(1), ctx.where() + " input 'repeats'");
  }
  XPURT_CHECK(static_cast<std::int64_t>(repeats.size()) == x.dim(), ctx.where(), ": repeats has ", repeats.size(),
              " entries for a ", x.dim(), "-D input");
  Shape shape = x.shape();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    XPURT_CHECK(repeats[i] >= 0, ctx.where(), ": negative repeat ", repeats[i]);
    XPURT_CHECK(!__builtin_mul_overflow(shape[i], repeats[i], &shape[i]), ctx.where(), ": dimension ", i, " (",
                x.shape()[i], ") repeated ", repeats[i], " times overflows int64");
  }
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  if (out.numel() == 0) return;
  const Shape in_strides = contiguous_strides(x.shape());
  visit_bits(x.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* src = data<U>(x);
    U* dst = data<U>(out);
    Shape idx(shape.size(), 0);
    for (std::int64_t linear = 0; linear < out.numel(); ++linear) {
      std::int64_t offset = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) offset += (idx[d] % x.shape()[d]) * in_strides[d];
      dst[linear] = src[offset];
      for (std::size_t d = shape.size(); d-- > 0;) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  });
}

// Maps a padded coordinate `i` (may be outside [0, n)) onto the input for the non-constant pad modes.
std::int64_t pad_source(std::int64_t i, std::int64_t n, const std::string& mode) {
  if (i >= 0 && i < n) return i;
  if (mode == "edge") return i < 0 ? 0 : n - 1;
  if (mode == "wrap") return ((i % n) + n) % n;
  // reflect: mirror without repeating the edge, periodic with period 2(n-1) as numpy does for wide pads.
  if (n == 1) return 0;
  const std::int64_t period = 2 * (n - 1);
  std::int64_t m = ((i % period) + period) % period;
  return m < n ? m : period - m;
}

void pad(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::int64_t rank = x.dim();
  const std::string mode = ctx.attr_string("mode", "constant");
  XPURT_CHECK(mode == "constant" || mode == "reflect" || mode == "edge" || (mode == "wrap" && ctx.opset() >= 19),
              ctx.where(), ": unknown mode '", mode, "'");
  Shape pads;
  double value = 0.0;
  Shape axes;
  if (ctx.opset() < 11) {
    pads = ctx.attr_ints(ctx.opset() < 2 ? "paddings" : "pads", {});
    value = ctx.attr_float("value", 0.0);
  } else {
    pads = read_ints(ctx.input(1), ctx.where() + " input 'pads'");
    if (ctx.has_input(2) && ctx.input(2).numel() != 0) {
      value = read_scalar(ctx.input(2), ctx.where() + " input 'constant_value'");
    }
    if (ctx.opset() >= 18 && ctx.has_input(3)) {
      axes = normalize_axes(read_ints(ctx.input(3), ctx.where() + " input 'axes'"), rank, ctx.where());
    }
  }
  if (axes.empty()) {
    for (std::int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  const auto naxes = axes.size();
  XPURT_CHECK(pads.size() == 2 * naxes, ctx.where(), ": pads has ", pads.size(), " entries, expected ", 2 * naxes);
  Shape begin(static_cast<std::size_t>(rank), 0), end(static_cast<std::size_t>(rank), 0);
  for (std::size_t i = 0; i < naxes; ++i) {
    begin[static_cast<std::size_t>(axes[i])] = pads[i];
    end[static_cast<std::size_t>(axes[i])] = pads[i + naxes];
  }
  Shape shape = x.shape();
  for (std::size_t d = 0; d < shape.size(); ++d) {
    shape[d] += begin[d] + end[d];
    XPURT_CHECK(shape[d] >= 0, ctx.where(), ": pads make dimension ", d, " negative (", shape[d], ")");
    XPURT_CHECK(mode == "constant" || shape[d] == x.shape()[d] || x.shape()[d] > 0, ctx.where(), ": mode '", mode,
                "' cannot pad the empty dimension ", d);
  }
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  if (out.numel() == 0) return;
  const Shape in_strides = contiguous_strides(x.shape());
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    const T fill = Compute<T>::store(static_cast<C>(value));
    const T* src = data<T>(x);
    T* dst = data<T>(out);
    Shape idx(shape.size(), 0);
    for (std::int64_t linear = 0; linear < out.numel(); ++linear) {
      std::int64_t offset = 0;
      bool inside = true;
      for (std::size_t d = 0; d < shape.size(); ++d) {
        std::int64_t i = idx[d] - begin[d];
        if (i < 0 || i >= x.shape()[d]) {
          if (mode == "constant") {
            inside = false;
            break;
          }
          i = pad_source(i, x.shape()[d], mode);
        }
        offset += i * in_strides[d];
      }
      dst[linear] = inside ? src[offset] : fill;
      for (std::size_t d = shape.size(); d-- > 0;) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  });
}

void range(OpContext& ctx) {
  const Tensor& start_t = ctx.input(0);
  const DType dtype = start_t.dtype();
  XPURT_CHECK_TYPE(dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kInt16 ||
                       dtype == DType::kInt32 || dtype == DType::kInt64,
                   ctx.where(), ": expected float32, float64, int16, int32 or int64, got ", dtype_name(dtype));
  for (std::size_t i = 1; i < 3; ++i) {
    XPURT_CHECK_TYPE(ctx.input(i).dtype() == dtype, ctx.where(), ": input ", i, " is ",
                     dtype_name(ctx.input(i).dtype()), ", input 0 is ", dtype_name(dtype));
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int16_t> ||
                  std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>) {
      // Note [Scalars read from tensors]: an empty `limit` (Squeeze(Shape(x)[2:1])) read past its allocation.
      const T start = detail::scalar_element<T>(ctx.input(0), ctx.where() + " input 'start'");
      const T limit = detail::scalar_element<T>(ctx.input(1), ctx.where() + " input 'limit'");
      const T delta = detail::scalar_element<T>(ctx.input(2), ctx.where() + " input 'delta'");
      XPURT_CHECK(delta != T(0), ctx.where(), ": delta is 0");
      std::int64_t count = 0;
      if constexpr (std::is_integral_v<T>) {
        // Exact for every int64 (doubles round values past 2^53: Range(2^60 + 1, 2^60 + 3) had no elements).
        // The distance in unsigned arithmetic, which cannot overflow once its sign is known.
        const bool up = delta > T(0);
        if (up ? limit > start : limit < start) {
          const auto wide = [](T v) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(v)); };
          const std::uint64_t span = up ? wide(limit) - wide(start) : wide(start) - wide(limit);
          const std::uint64_t step = up ? wide(delta) : std::uint64_t{0} - wide(delta);
          const std::uint64_t n = span / step + (span % step != 0 ? 1 : 0);
          XPURT_CHECK(n <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), ctx.where(), ": ",
                      n, " elements are more than a tensor can hold");
          count = static_cast<std::int64_t>(n);
        }
      } else {
        const double n =
            std::ceil((static_cast<double>(limit) - static_cast<double>(start)) / static_cast<double>(delta));
        XPURT_CHECK(!std::isnan(n), ctx.where(), ": start, limit and delta give no element count (NaN)");
        XPURT_CHECK(n < 9.2e18, ctx.where(), ": ", n, " elements are more than a tensor can hold");
        count = static_cast<std::int64_t>(std::max(n, 0.0));
      }
      Tensor& out = ctx.allocate_output(0, {count}, dtype);
      T* dst = data<T>(out);
      for (std::int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(start + static_cast<T>(i) * delta);
    }
  });
}

void trilu(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  XPURT_CHECK(x.dim() >= 2, ctx.where(), ": expected a tensor of rank >= 2, got rank ", x.dim());
  const std::int64_t k = ctx.has_input(1) ? detail::scalar_as_int64(ctx.input(1), ctx.where() + " input 'k'") : 0;
  const bool upper = ctx.attr_int("upper", 1) != 0;
  const std::int64_t rows = x.shape()[x.shape().size() - 2];
  const std::int64_t cols = x.shape().back();
  Tensor& out = ctx.allocate_output(0, x.shape(), x.dtype());
  if (out.numel() == 0) return;
  visit_bits(x.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* src = data<U>(x);
    U* dst = data<U>(out);
    const std::int64_t batches = x.numel() / (rows * cols);
    for (std::int64_t b = 0; b < batches; ++b) {
      for (std::int64_t i = 0; i < rows; ++i) {
        for (std::int64_t j = 0; j < cols; ++j) {
          const std::int64_t o = (b * rows + i) * cols + j;
          const bool keep = upper ? j - i >= k : j - i <= k;
          dst[o] = keep ? src[o] : U{0};
        }
      }
    }
  });
}

void eye_like(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  XPURT_CHECK(x.dim() == 2, ctx.where(), ": expected a 2-D input, got rank ", x.dim());
  const DType dtype =
      ctx.node().attrs.has("dtype") ? dtype_from_onnx_code(ctx.attr_int("dtype", 1), ctx.where()) : x.dtype();
  const std::int64_t k = ctx.attr_int("k", 0);
  Tensor& out = ctx.allocate_output(0, x.shape(), dtype);
  out.zero_();
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    T* dst = data<T>(out);
    for (std::int64_t i = 0; i < x.shape()[0]; ++i) {
      const std::int64_t j = i + k;
      if (j >= 0 && j < x.shape()[1]) dst[i * x.shape()[1] + j] = Compute<T>::store(static_cast<C>(1));
    }
  });
}

void depth_to_space(OpContext& ctx, bool to_space) {
  const Tensor& x = ctx.input(0);
  XPURT_CHECK(x.dim() == 4, ctx.where(), ": expected a 4-D input [N,C,H,W], got rank ", x.dim());
  const std::int64_t b = ctx.attr_int("blocksize", 0);
  XPURT_CHECK(b > 0, ctx.where(), ": blocksize must be positive, got ", b);
  const std::int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const Shape in_strides = contiguous_strides(x.shape());
  Shape shape;
  // The output as a 6-D view [N, C', H, b, W, b] (DepthToSpace) or [N, b, b, C, H', W'] (SpaceToDepth), with
  // the input strides of each of those dims: one strided copy.
  Shape view, strides;
  if (to_space) {
    XPURT_CHECK(c % (b * b) == 0, ctx.where(), ": channels (", c, ") not divisible by blocksize^2 (", b * b, ")");
    const std::int64_t co = c / (b * b);
    shape = {n, co, h * b, w * b};
    view = {n, co, h, b, w, b};
    const bool crd = ctx.attr_string("mode", "DCR") == "CRD";
    XPURT_CHECK(crd || ctx.attr_string("mode", "DCR") == "DCR", ctx.where(), ": unknown mode '",
                ctx.attr_string("mode", "DCR"), "'");
    // DCR: channel (i*b + j)*C' + c; CRD: channel c*b*b + i*b + j.
    const std::int64_t cs = in_strides[1];
    strides = {in_strides[0], crd ? b * b * cs : cs, in_strides[2], crd ? b * cs : b * co * cs, in_strides[3],
               crd ? cs : co * cs};
  } else {
    XPURT_CHECK(h % b == 0 && w % b == 0, ctx.where(), ": height and width (", h, ", ", w,
                ") not divisible by blocksize ", b);
    shape = {n, c * b * b, h / b, w / b};
    view = {n, b, b, c, h / b, w / b};
    strides = {in_strides[0], in_strides[2], in_strides[3], in_strides[1], b * in_strides[2], b * in_strides[3]};
  }
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  if (out.numel() == 0) return;
  Tensor out_view = Tensor::from_blob(out.data_ptr(), view, {}, x.dtype(), Device::cpu(), out.storage(),
                                      out.nbytes());
  copy_strided(x, out_view, 0, strides);
}

}  // namespace

Shape concat_shape(const std::vector<const Tensor*>& inputs, std::int64_t axis, const std::string& where,
                   const char* noun) {
  const Tensor& first = *inputs.front();
  const std::int64_t rank = first.dim();
  Shape shape = first.shape();
  shape[static_cast<std::size_t>(axis)] = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = *inputs[i];
    XPURT_CHECK_TYPE(t.dtype() == first.dtype(), where, ": ", noun, " ", i, " is ", dtype_name(t.dtype()), ", ",
                     noun, " 0 is ", dtype_name(first.dtype()));
    XPURT_CHECK(t.dim() == rank, where, ": ", noun, " ", i, " has rank ", t.dim(), ", ", noun, " 0 has rank ", rank);
    for (std::int64_t d = 0; d < rank; ++d) {
      const auto du = static_cast<std::size_t>(d);
      XPURT_CHECK(d == axis || t.shape()[du] == first.shape()[du], where, ": ", noun, " ", i, " has dimension ", d,
                  " = ", t.shape()[du], ", ", noun, " 0 has ", first.shape()[du]);
    }
    shape[static_cast<std::size_t>(axis)] += t.shape()[static_cast<std::size_t>(axis)];
  }
  return shape;
}

void concat_into(const std::vector<const Tensor*>& inputs, std::int64_t axis, Tensor& out) {
  const Shape& shape = out.shape();
  const auto rank = static_cast<std::int64_t>(shape.size());
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<std::size_t>(d)];
  std::int64_t inner = 1;
  for (std::int64_t d = axis + 1; d < rank; ++d) inner *= shape[static_cast<std::size_t>(d)];
  const std::size_t esize = out.element_size();
  auto* dst = static_cast<char*>(out.data_ptr());
  const auto out_row = static_cast<std::size_t>(shape[static_cast<std::size_t>(axis)] * inner) * esize;
  std::size_t offset = 0;
  for (const Tensor* t : inputs) {
    const auto row = static_cast<std::size_t>(t->shape()[static_cast<std::size_t>(axis)] * inner) * esize;
    const auto* src = static_cast<const char*>(t->data_ptr());
    for (std::int64_t o = 0; o < outer && row != 0; ++o) {
      std::memcpy(dst + static_cast<std::size_t>(o) * out_row + offset, src + static_cast<std::size_t>(o) * row, row);
    }
    offset += row;
  }
}

void register_tensor_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "Constant", constant);
  kernels.add("", "ConstantOfShape", constant_of_shape);
  kernels.add("", "Shape", shape_op);
  kernels.add("", "Size", [](OpContext& ctx) { ctx.set_output(0, int64_tensor({}, {ctx.input(0).numel()})); });
  kernels.add("", "Reshape", reshape);
  kernels.add("", "Flatten", flatten);
  kernels.add("", "Squeeze", squeeze);
  kernels.add("", "Unsqueeze", unsqueeze);
  kernels.add("", "Transpose", transpose);
  kernels.add("", "Concat", concat);
  kernels.add("", "Split", split);
  kernels.add("", "Slice", slice);
  kernels.add("", "Expand", expand);
  kernels.add("", "Tile", tile);
  kernels.add("", "Pad", pad);
  kernels.add("", "Range", range);
  kernels.add("", "Trilu", trilu);
  kernels.add("", "EyeLike", eye_like);
  kernels.add("", "DepthToSpace", [](OpContext& ctx) { depth_to_space(ctx, true); });
  kernels.add("", "SpaceToDepth", [](OpContext& ctx) { depth_to_space(ctx, false); });
  register_tensor_index_ops(kernels);
  register_tensor_reduce_ops(kernels);
}

}  // namespace xpuruntime::onnx_ref
