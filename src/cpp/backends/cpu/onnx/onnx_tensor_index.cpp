// ONNX reference ops (tensor group, index ops): Gather, GatherElements, GatherND, Scatter, ScatterElements,
// ScatterND, OneHot, Compress, NonZero, Unique, ReverseSequence. See backends/cpu/onnx/onnx_kernels.h.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "backends/cpu/onnx/onnx_tensor_internal.h"

namespace xpuruntime::onnx_ref {
namespace {

using Shape = std::vector<std::int64_t>;

std::size_t us(std::int64_t v) { return static_cast<std::size_t>(v); }

// An index into a dimension of size `dim`: negative ones count from the end; InvalidArgumentError when out of
// range.
std::int64_t checked_index(std::int64_t index, std::int64_t dim, const OpContext& ctx, const char* what) {
  const std::int64_t i = index < 0 ? index + dim : index;
  XPURT_CHECK(i >= 0 && i < dim, ctx.where(), ": ", what, " index ", index, " is out of range for a dimension of ",
              dim);
  return i;
}

// Advances a row-major multi-index over `shape`.
void next_index(Shape& idx, const Shape& shape) {
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (++idx[d] < shape[d]) return;
    idx[d] = 0;
  }
}

void gather(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  XPURT_CHECK(x.dim() >= 1, ctx.where(), ": 'data' must have rank >= 1");
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where());
  const Tensor& indices_t = ctx.input(1);
  const ScratchVector<std::int64_t> indices = read_indices(indices_t, ctx.where() + " input 'indices'");
  Shape shape(x.shape().begin(), x.shape().begin() + axis);
  shape.insert(shape.end(), indices_t.shape().begin(), indices_t.shape().end());
  shape.insert(shape.end(), x.shape().begin() + axis + 1, x.shape().end());
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  const std::int64_t n = x.shape()[us(axis)];
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= x.shape()[us(d)];
  std::int64_t inner = 1;
  for (std::size_t d = us(axis) + 1; d < x.shape().size(); ++d) inner *= x.shape()[d];
  const std::size_t row = us(inner) * x.element_size();
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const auto count = static_cast<std::int64_t>(indices.size());
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t i = checked_index(indices[us(k)], n, ctx, "gather");
    for (std::int64_t o = 0; o < outer && row != 0; ++o) {
      std::memcpy(dst + us(o * count + k) * row, src + us(o * n + i) * row, row);
    }
  }
}

void gather_elements(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& indices_t = ctx.input(1);
  XPURT_CHECK(x.dim() == indices_t.dim(), ctx.where(), ": 'data' (rank ", x.dim(), ") and 'indices' (rank ",
              indices_t.dim(), ") must have the same rank");
  XPURT_CHECK(x.dim() >= 1, ctx.where(), ": 'data' must have rank >= 1");
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where());
  const ScratchVector<std::int64_t> indices = read_indices(indices_t, ctx.where() + " input 'indices'");
  const Shape& shape = indices_t.shape();
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  if (out.numel() == 0) return;
  const Shape strides = contiguous_strides(x.shape());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    XPURT_CHECK(static_cast<std::int64_t>(d) == axis || shape[d] <= x.shape()[d], ctx.where(), ": 'indices' dimension ",
                d, " (", shape[d], ") exceeds the data's (", x.shape()[d], ")");
  }
  // Row by row of the last axis: the row's offset into the data without the axis' term computed once, then each
  // element adds its column (the data's last stride is 1) and its checked index along the axis.
  const std::size_t last = shape.size() - 1;
  const std::int64_t width = shape[last], axis_stride = strides[us(axis)];
  const bool along_last = us(axis) == last;
  visit_bits(x.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U* src = data<U>(x);
    U* dst = data<U>(out);
    Shape idx(shape.size(), 0);
    for (std::size_t begin = 0; begin < indices.size(); begin += us(width)) {
      std::int64_t base = 0;
      for (std::size_t d = 0; d < last; ++d) base += static_cast<std::int64_t>(d) == axis ? 0 : idx[d] * strides[d];
      for (std::int64_t j = 0; j < width; ++j) {
        const std::size_t linear = begin + us(j);
        const std::int64_t i = checked_index(indices[linear], x.shape()[us(axis)], ctx, "gather");
        dst[linear] = src[base + (along_last ? 0 : j) + i * axis_stride];
      }
      idx[last] = width - 1;
      next_index(idx, shape);
    }
  });
}

void gather_nd(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& indices_t = ctx.input(1);
  const std::int64_t b = ctx.attr_int("batch_dims", 0);
  const std::int64_t r = x.dim(), q = indices_t.dim();
  XPURT_CHECK(q >= 1 && r >= 1, ctx.where(), ": 'data' and 'indices' must have rank >= 1");
  XPURT_CHECK(b >= 0 && b < std::min(q, r), ctx.where(), ": batch_dims ", b, " must be < min(rank(data), ",
              "rank(indices)) = ", std::min(q, r));
  const std::int64_t k = indices_t.shape().back();
  XPURT_CHECK(k >= 1 && k <= r - b, ctx.where(), ": indices.shape[-1] = ", k, " must be in [1, ", r - b, "]");
  std::int64_t batches = 1;
  for (std::int64_t d = 0; d < b; ++d) {
    XPURT_CHECK(x.shape()[us(d)] == indices_t.shape()[us(d)], ctx.where(), ": batch dimension ", d, " differs (",
                x.shape()[us(d)], " in data, ", indices_t.shape()[us(d)], " in indices)");
    batches *= x.shape()[us(d)];
  }
  Shape shape(indices_t.shape().begin(), indices_t.shape().end() - 1);
  shape.insert(shape.end(), x.shape().begin() + b + k, x.shape().end());
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  const ScratchVector<std::int64_t> indices = read_indices(indices_t, ctx.where() + " input 'indices'");
  const Shape strides = contiguous_strides(x.shape());
  std::int64_t slice = 1;
  for (std::int64_t d = b + k; d < r; ++d) slice *= x.shape()[us(d)];
  const std::int64_t batch_stride = b == 0 ? 0 : strides[us(b - 1)];
  const std::int64_t tuples = static_cast<std::int64_t>(indices.size()) / k;
  const std::int64_t per_batch = batches == 0 ? 0 : tuples / batches;
  const std::size_t row = us(slice) * x.element_size();
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (std::int64_t t = 0; t < tuples; ++t) {
    std::int64_t offset = (t / std::max<std::int64_t>(per_batch, 1)) * batch_stride;
    for (std::int64_t j = 0; j < k; ++j) {
      const auto d = us(b + j);
      offset += checked_index(indices[us(t * k + j)], x.shape()[d], ctx, "gather_nd") * strides[d];
    }
    if (row != 0) std::memcpy(dst + us(t) * row, src + us(offset) * x.element_size(), row);
  }
}

// Combines an existing value with an update under a scatter `reduction` (none, add, mul, max, min).
template <typename T>
T scatter_combine(T current, T update, const std::string& reduction) {
  using C = typename Compute<T>::type;
  if (reduction == "none") return update;
  const C a = Compute<T>::load(current), b = Compute<T>::load(update);
  C r;
  if (reduction == "add") {
    r = static_cast<C>(a + b);
  } else if (reduction == "mul") {
    r = static_cast<C>(a * b);
  } else if (reduction == "max") {
    r = std::max(a, b);
  } else {
    r = std::min(a, b);
  }
  return Compute<T>::store(r);
}

std::string scatter_reduction(const OpContext& ctx) {
  const std::string reduction = ctx.attr_string("reduction", "none");
  const bool ok = reduction == "none" || (ctx.opset() >= 16 && (reduction == "add" || reduction == "mul")) ||
                  (ctx.opset() >= 18 && (reduction == "max" || reduction == "min"));
  XPURT_CHECK(ok, ctx.where(), ": unknown reduction '", reduction, "' at opset ", ctx.opset());
  return reduction;
}

void scatter_elements(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& indices_t = ctx.input(1);
  const Tensor& updates = ctx.input(2);
  XPURT_CHECK(x.dim() == indices_t.dim() && indices_t.shape() == updates.shape(), ctx.where(),
              ": 'indices' and 'updates' must have the same shape and the rank of 'data'");
  XPURT_CHECK_TYPE(updates.dtype() == x.dtype(), ctx.where(), ": 'updates' is ", dtype_name(updates.dtype()),
                   ", 'data' is ", dtype_name(x.dtype()));
  const std::string reduction = scatter_reduction(ctx);
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where());
  const ScratchVector<std::int64_t> indices = read_indices(indices_t, ctx.where() + " input 'indices'");
  Tensor& out = ctx.allocate_output(0, x.shape(), x.dtype());
  if (x.nbytes() != 0) std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
  if (indices.empty()) return;
  const Shape strides = contiguous_strides(x.shape());
  const Shape& shape = indices_t.shape();
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* upd = data<T>(updates);
    T* dst = data<T>(out);
    Shape idx(shape.size(), 0);
    for (std::size_t linear = 0; linear < indices.size(); ++linear) {
      std::int64_t offset = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) {
        const std::int64_t i = static_cast<std::int64_t>(d) == axis
                                   ? checked_index(indices[linear], x.shape()[d], ctx, "scatter")
                                   : idx[d];
        XPURT_CHECK(i < x.shape()[d], ctx.where(), ": 'indices' dimension ", d, " (", shape[d],
                    ") exceeds the data's (", x.shape()[d], ")");
        offset += i * strides[d];
      }
      dst[offset] = scatter_combine(dst[offset], upd[linear], reduction);
      next_index(idx, shape);
    }
  });
}

void scatter_nd(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& indices_t = ctx.input(1);
  const Tensor& updates = ctx.input(2);
  XPURT_CHECK_TYPE(updates.dtype() == x.dtype(), ctx.where(), ": 'updates' is ", dtype_name(updates.dtype()),
                   ", 'data' is ", dtype_name(x.dtype()));
  const std::string reduction = scatter_reduction(ctx);
  XPURT_CHECK(indices_t.dim() >= 1, ctx.where(), ": 'indices' must have rank >= 1");
  const std::int64_t k = indices_t.shape().back();
  XPURT_CHECK(k >= 0 && k <= x.dim(), ctx.where(), ": indices.shape[-1] = ", k, " exceeds the rank of 'data' (",
              x.dim(), ")");
  Shape expected(indices_t.shape().begin(), indices_t.shape().end() - 1);
  expected.insert(expected.end(), x.shape().begin() + k, x.shape().end());
  XPURT_CHECK(updates.shape() == expected, ctx.where(), ": 'updates' has shape ", updates.str(),
              ", expected indices.shape[:-1] + data.shape[k:] (", expected.size(), "-D)");
  const ScratchVector<std::int64_t> indices = read_indices(indices_t, ctx.where() + " input 'indices'");
  Tensor& out = ctx.allocate_output(0, x.shape(), x.dtype());
  if (x.nbytes() != 0) std::memcpy(out.data_ptr(), x.data_ptr(), x.nbytes());
  const Shape strides = contiguous_strides(x.shape());
  std::int64_t slice = 1;
  for (std::int64_t d = k; d < x.dim(); ++d) slice *= x.shape()[us(d)];
  const std::int64_t tuples = numel_of(Shape(indices_t.shape().begin(), indices_t.shape().end() - 1));
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* upd = data<T>(updates);
    T* dst = data<T>(out);
    for (std::int64_t t = 0; t < tuples; ++t) {
      std::int64_t offset = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        offset += checked_index(indices[us(t * k + j)], x.shape()[us(j)], ctx, "scatter_nd") * strides[us(j)];
      }
      for (std::int64_t e = 0; e < slice; ++e) {
        dst[offset + e] = scatter_combine(dst[offset + e], upd[t * slice + e], reduction);
      }
    }
  });
}

// The values of a numeric tensor as doubles (OneHot's indices and depth may be of any numeric type).
ScratchVector<double> read_doubles(const Tensor& t) {
  ScratchVector<double> out(us(t.numel()));
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = data<T>(t);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(Compute<T>::load(p[i]));
  });
  return out;
}

void one_hot(OpContext& ctx) {
  const Tensor& indices_t = ctx.input(0);
  const double depth_value = read_scalar(ctx.input(1), ctx.where() + " input 'depth'");
  const auto depth = static_cast<std::int64_t>(depth_value);
  XPURT_CHECK(depth > 0, ctx.where(), ": depth must be positive, got ", depth_value);
  const Tensor& values = ctx.input(2);
  XPURT_CHECK(values.numel() == 2, ctx.where(), ": 'values' must have 2 elements [off, on], got ", values.numel());
  const std::int64_t rank = indices_t.dim() + 1;
  std::int64_t axis = ctx.attr_int("axis", -1);
  XPURT_CHECK(axis >= -rank && axis < rank, ctx.where(), ": axis ", axis, " is out of range for rank ", rank);
  if (axis < 0) axis += rank;
  Shape shape = indices_t.shape();
  shape.insert(shape.begin() + axis, depth);
  Tensor& out = ctx.allocate_output(0, shape, values.dtype());
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= shape[us(d)];
  const std::int64_t inner = outer == 0 ? 0 : indices_t.numel() / outer;
  const ScratchVector<double> indices = read_doubles(indices_t);
  visit_bits(values.dtype(), [&](auto tag) {
    using U = decltype(tag);
    const U off = data<U>(values)[0], on = data<U>(values)[1];
    U* dst = data<U>(out);
    std::fill(dst, dst + out.numel(), off);
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t p = 0; p < inner; ++p) {
        auto i = static_cast<std::int64_t>(indices[us(o * inner + p)]);
        if (i < 0) i += depth;
        if (i >= 0 && i < depth) dst[(o * depth + i) * inner + p] = on;
      }
    }
  });
}

void compress(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& condition = ctx.input(1);
  XPURT_CHECK(condition.dim() == 1, ctx.where(), ": 'condition' must be 1-D, got rank ", condition.dim());
  const ScratchVector<double> cond = read_doubles(condition);
  const bool has_axis = ctx.node().attrs.has("axis");
  const std::int64_t axis = has_axis ? normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where()) : 0;
  const Shape in_shape = has_axis ? x.shape() : Shape{x.numel()};
  const std::int64_t n = in_shape[us(axis)];
  std::vector<std::int64_t> selected;
  for (std::size_t i = 0; i < cond.size(); ++i) {
    if (cond[i] == 0.0) continue;
    XPURT_CHECK(static_cast<std::int64_t>(i) < n, ctx.where(), ": 'condition' selects index ", i,
                " beyond the axis (", n, ")");
    selected.push_back(static_cast<std::int64_t>(i));
  }
  Shape shape = in_shape;
  shape[us(axis)] = static_cast<std::int64_t>(selected.size());
  Tensor& out = ctx.allocate_output(0, shape, x.dtype());
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= in_shape[us(d)];
  std::int64_t inner = 1;
  for (std::size_t d = us(axis) + 1; d < in_shape.size(); ++d) inner *= in_shape[d];
  const std::size_t row = us(inner) * x.element_size();
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const auto count = static_cast<std::int64_t>(selected.size());
  for (std::int64_t o = 0; o < outer && row != 0; ++o) {
    for (std::int64_t k = 0; k < count; ++k) {
      std::memcpy(dst + us(o * count + k) * row, src + us(o * n + selected[us(k)]) * row, row);
    }
  }
}

void non_zero(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const ScratchVector<double> values = read_doubles(x);
  const Shape shape = x.dim() == 0 ? Shape{1} : x.shape();
  std::vector<std::int64_t> hits;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (values[i] != 0.0) hits.push_back(static_cast<std::int64_t>(i));
  }
  const auto nnz = static_cast<std::int64_t>(hits.size());
  const auto rank = static_cast<std::int64_t>(shape.size());
  Tensor& out = ctx.allocate_output(0, {rank, nnz}, DType::kInt64);
  auto* dst = data<std::int64_t>(out);
  const Shape strides = contiguous_strides(shape);
  for (std::int64_t j = 0; j < nnz; ++j) {
    std::int64_t rest = hits[us(j)];
    for (std::int64_t d = 0; d < rank; ++d) {
      dst[d * nnz + j] = rest / strides[us(d)];
      rest %= strides[us(d)];
    }
  }
}

void unique(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const bool sorted = ctx.attr_int("sorted", 1) != 0;
  const bool has_axis = ctx.node().attrs.has("axis");
  const std::int64_t axis = has_axis ? normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where()) : 0;
  const Shape in_shape = has_axis ? x.shape() : Shape{x.numel()};
  const std::int64_t n = in_shape[us(axis)];
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= in_shape[us(d)];
  std::int64_t inner = 1;
  for (std::size_t d = us(axis) + 1; d < in_shape.size(); ++d) inner *= in_shape[d];
  // Item i is the slice x[..., i, ...] along the axis, compared element by element in (outer, inner) order.
  ScratchVector<std::int64_t> order(us(n));
  std::iota(order.begin(), order.end(), 0);
  ScratchVector<std::int64_t> group_of(us(n));
  ScratchVector<std::int64_t> firsts, counts;
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = data<T>(x);
    auto compare = [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t o = 0; o < outer; ++o) {
        for (std::int64_t p = 0; p < inner; ++p) {
          const auto va = Compute<T>::load(src[(o * n + a) * inner + p]);
          const auto vb = Compute<T>::load(src[(o * n + b) * inner + p]);
          if (va < vb) return -1;
          if (vb < va) return 1;
        }
      }
      return 0;
    };
    // Ties broken by position: a stable order without std::stable_sort's buffer, which is not scratch memory
    // (Note [Scratch memory under the budget]).
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      const int c = compare(a, b);
      return c != 0 ? c < 0 : a < b;
    });
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || compare(order[i - 1], order[i]) != 0) {
        firsts.push_back(order[i]);  // stable sort: the first of a group is its first occurrence
        counts.push_back(0);
      }
      group_of[us(order[i])] = static_cast<std::int64_t>(firsts.size()) - 1;
      ++counts.back();
    }
  });
  const auto groups = static_cast<std::int64_t>(firsts.size());
  // rank[g]: the output position of group g (sorted order, or order of first occurrence).
  ScratchVector<std::int64_t> position(us(groups));
  std::iota(position.begin(), position.end(), 0);
  if (!sorted) {
    ScratchVector<std::int64_t> by_first(us(groups));
    std::iota(by_first.begin(), by_first.end(), 0);
    std::sort(by_first.begin(), by_first.end(),
              [&](std::int64_t a, std::int64_t b) { return firsts[us(a)] < firsts[us(b)]; });
    for (std::int64_t i = 0; i < groups; ++i) position[us(by_first[us(i)])] = i;
  }
  Shape shape = in_shape;
  shape[us(axis)] = groups;
  Tensor& y = ctx.allocate_output(0, shape, x.dtype());
  ScratchVector<std::int64_t> first_out(us(groups)), count_out(us(groups)), inverse(us(n));
  for (std::int64_t g = 0; g < groups; ++g) {
    first_out[us(position[us(g)])] = firsts[us(g)];
    count_out[us(position[us(g)])] = counts[us(g)];
  }
  for (std::int64_t i = 0; i < n; ++i) inverse[us(i)] = position[us(group_of[us(i)])];
  const std::size_t row = us(inner) * x.element_size();
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(y.data_ptr());
  for (std::int64_t o = 0; o < outer && row != 0; ++o) {
    for (std::int64_t g = 0; g < groups; ++g) {
      std::memcpy(dst + us(o * groups + g) * row, src + us(o * n + first_out[us(g)]) * row, row);
    }
  }
  auto put = [&](std::size_t i, const ScratchVector<std::int64_t>& v) {
    if (!ctx.wants_output(i)) return;
    Tensor& t = ctx.allocate_output(i, {static_cast<std::int64_t>(v.size())}, DType::kInt64);
    if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(std::int64_t));
  };
  put(1, first_out);
  put(2, inverse);
  put(3, count_out);
}

void reverse_sequence(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  XPURT_CHECK(x.dim() >= 2, ctx.where(), ": expected rank >= 2, got ", x.dim());
  const std::int64_t batch_axis = ctx.attr_int("batch_axis", 1);
  const std::int64_t time_axis = ctx.attr_int("time_axis", 0);
  XPURT_CHECK((batch_axis == 0 && time_axis == 1) || (batch_axis == 1 && time_axis == 0), ctx.where(),
              ": batch_axis and time_axis must be 0 and 1 in some order, got ", batch_axis, " and ", time_axis);
  const Shape lens = read_ints(ctx.input(1), ctx.where() + " input 'sequence_lens'");
  const std::int64_t batch = x.shape()[us(batch_axis)], time = x.shape()[us(time_axis)];
  XPURT_CHECK(static_cast<std::int64_t>(lens.size()) == batch, ctx.where(), ": sequence_lens has ", lens.size(),
              " entries for a batch of ", batch);
  Tensor& out = ctx.allocate_output(0, x.shape(), x.dtype());
  const Shape strides = contiguous_strides(x.shape());
  const std::size_t row = us(strides[1]) * x.element_size();  // elements after the first two dims
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (std::int64_t bi = 0; bi < batch; ++bi) {
    const std::int64_t len = lens[us(bi)];
    XPURT_CHECK(len >= 0 && len <= time, ctx.where(), ": sequence_lens[", bi, "] = ", len, " is not in [0, ", time,
                "]");
    for (std::int64_t t = 0; t < time && row != 0; ++t) {
      const std::int64_t from = t < len ? len - 1 - t : t;
      auto offset = [&](std::int64_t ti) {
        return us(batch_axis == 0 ? bi * time + ti : ti * batch + bi) * row;
      };
      std::memcpy(dst + offset(t), src + offset(from), row);
    }
  }
}

}  // namespace

void register_tensor_index_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "Gather", gather);
  kernels.add("", "GatherElements", gather_elements);
  kernels.add("", "GatherND", gather_nd);
  kernels.add("", "Scatter", scatter_elements);
  kernels.add("", "ScatterElements", scatter_elements);
  kernels.add("", "ScatterND", scatter_nd);
  kernels.add("", "OneHot", one_hot);
  kernels.add("", "Compress", compress);
  kernels.add("", "NonZero", non_zero);
  kernels.add("", "Unique", unique);
  kernels.add("", "ReverseSequence", reverse_sequence);
}

}  // namespace xpuruntime::onnx_ref
