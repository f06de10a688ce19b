// ONNX reference ops: MaxPool (with Indices), AveragePool, LpPool, their Global forms and MaxUnpool, for any
// number of spatial dims, and average_pool, AveragePool's arithmetic that com.microsoft QLinearAveragePool runs on its
// dequantized values (onnx_common.h). Values are computed in double (exact for every dtype these ops take). See
// onnx_nn_common.h, Note [Spatial windows].
#include <algorithm>
#include <cstring>
#include <limits>

#include "backends/cpu/onnx/onnx_nn_common.h"

namespace xpuruntime::onnx_ref::nn {
namespace {

enum class PoolKind { kMax, kAverage, kLp };

std::int64_t product_of(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (std::int64_t x : v) p *= x;
  return p;
}

// A pool's windows over a [N, C, spatial...] input (Note [Spatial windows]): its kernel_shape (required), strides,
// dilations, pads, auto_pad and ceil_mode, and the output shape they give.
struct PoolShape {
  Window w;
  std::vector<std::int64_t> in_sp, out_sp, out_shape;  // input and output spatial dims; [N, C, out_sp...]
};

PoolShape pool_shape(const OpContext& ctx, const std::vector<std::int64_t>& x_shape) {
  XPURT_CHECK(x_shape.size() >= 3, ctx.where(), ": X must be [N, C, spatial...], got ", shape_str(x_shape));
  const std::size_t rank = x_shape.size() - 2;
  XPURT_CHECK(ctx.has_attr("kernel_shape"), ctx.where(), ": the kernel_shape attribute is required");
  PoolShape s;
  s.w = read_window(ctx, rank, {});
  s.in_sp.assign(x_shape.begin() + 2, x_shape.end());
  const bool ceil_mode = ctx.attr_int("ceil_mode", 0) != 0;
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  apply_auto_pad(ctx, s.in_sp, s.w);
  const Window& w = s.w;
  s.out_sp.resize(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      s.out_sp[d] = (s.in_sp[d] + w.strides[d] - 1) / w.strides[d];
    } else {
      s.out_sp[d] = window_output_size(ctx, w, d, s.in_sp[d], ceil_mode);
    }
  }
  s.out_shape = {x_shape[0], x_shape[1]};
  s.out_shape.insert(s.out_shape.end(), s.out_sp.begin(), s.out_sp.end());
  return s;
}

// The windows are the same for every (n, c) plane: each output position o's taps inside the input are
// tap_begin[o] .. tap_begin[o + 1] - 1 (offset within the plane, in kernel row-major order, plus the column-major
// index for MaxPool's storage_order 1), and padded_count[o] is how many of its taps fall inside the padded input
// (count_include_pad's divisor).
struct PoolTaps {
  std::int64_t in_size = 0, out_size = 0;  // elements of an input / output plane
  std::vector<std::int64_t> tap_begin{0}, tap_offset, tap_col_index, padded_count;

  // AveragePool's value at output position o of the plane `xp`.
  double average(const double* xp, std::int64_t o, bool count_include_pad) const {
    const std::int64_t t0 = tap_begin[static_cast<std::size_t>(o)], t1 = tap_begin[static_cast<std::size_t>(o + 1)];
    double acc = 0.0;
    for (std::int64_t t = t0; t < t1; ++t) acc += xp[tap_offset[static_cast<std::size_t>(t)]];
    const std::int64_t divisor = count_include_pad ? padded_count[static_cast<std::size_t>(o)] : t1 - t0;
    return divisor > 0 ? acc / static_cast<double>(divisor) : 0.0;
  }
};

PoolTaps pool_taps(const PoolShape& s) {
  const Window& w = s.w;
  const std::size_t rank = w.rank();
  PoolTaps taps;
  taps.in_size = product_of(s.in_sp);
  taps.out_size = product_of(s.out_sp);
  // Row-major and column-major strides of the spatial input dims (for Indices).
  std::vector<std::int64_t> row_strides(rank, 1), col_strides(rank, 1);
  for (std::size_t d = rank; d-- > 1;) row_strides[d - 1] = row_strides[d] * s.in_sp[d];
  for (std::size_t d = 1; d < rank; ++d) col_strides[d] = col_strides[d - 1] * s.in_sp[d - 1];
  for_each_multi_index(s.out_sp, [&](const std::vector<std::int64_t>& oidx) {
    std::int64_t padded = 0;
    for_each_multi_index(w.kernel, [&](const std::vector<std::int64_t>& kidx) {
      bool inside = true, inside_padded = true;
      std::int64_t off = 0, col = 0;
      for (std::size_t d = 0; d < rank; ++d) {
        const std::int64_t c = oidx[d] * w.strides[d] - w.pads_begin[d] + kidx[d] * w.dilations[d];
        if (c < 0 || c >= s.in_sp[d]) inside = false;
        if (c < -w.pads_begin[d] || c >= s.in_sp[d] + w.pads_end[d]) inside_padded = false;
        off += c * row_strides[d];
        col += c * col_strides[d];
      }
      if (inside_padded) ++padded;
      if (inside) {
        taps.tap_offset.push_back(off);
        taps.tap_col_index.push_back(col);
      }
    });
    taps.padded_count.push_back(padded);
    taps.tap_begin.push_back(static_cast<std::int64_t>(taps.tap_offset.size()));
  });
  return taps;
}

void pool(OpContext& ctx, PoolKind kind) {
  const Tensor& X = ctx.input(0);
  if (kind == PoolKind::kMax) {
    XPURT_CHECK_TYPE(is_float_dtype(X.dtype()) || X.dtype() == DType::kInt8 || X.dtype() == DType::kUInt8, ctx.where(),
                     ": input 'X' must be a float type, int8 or uint8, got ", dtype_name(X.dtype()));
  } else {
    check_float(ctx, X, "input 'X'");
  }
  const PoolShape shape = pool_shape(ctx, X.shape());
  const std::int64_t N = X.shape()[0], Cn = X.shape()[1];
  Tensor& Y = ctx.allocate_output(0, shape.out_shape, X.dtype());
  const bool want_indices = kind == PoolKind::kMax && ctx.num_outputs() > 1 && ctx.wants_output(1);
  const std::int64_t storage_order = ctx.attr_int("storage_order", 0);
  XPURT_CHECK(storage_order == 0 || storage_order == 1, ctx.where(), ": storage_order must be 0 or 1, got ",
              storage_order);
  Tensor* I = want_indices ? &ctx.allocate_output(1, shape.out_shape, DType::kInt64) : nullptr;
  const bool count_include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  const double p = kind == PoolKind::kLp ? ctx.attr_float("p", 2.0) : 2.0;
  if (Y.numel() == 0) return;

  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(static_cast<std::size_t>(Y.numel()));
  std::int64_t* ind = I ? data<std::int64_t>(*I) : nullptr;
  const PoolTaps taps = pool_taps(shape);
  const std::int64_t in_size = taps.in_size, out_size = taps.out_size;
  for (std::int64_t plane = 0; plane < N * Cn; ++plane) {
    const double* xp = x.data() + plane * in_size;
    for (std::int64_t o = 0; o < out_size; ++o) {
      const std::int64_t t0 = taps.tap_begin[static_cast<std::size_t>(o)];
      const std::int64_t t1 = taps.tap_begin[static_cast<std::size_t>(o + 1)];
      double result = 0.0;
      std::int64_t best = -1;
      if (kind == PoolKind::kMax) {
        double acc = -std::numeric_limits<double>::infinity();
        for (std::int64_t t = t0; t < t1; ++t) {
          const double v = xp[taps.tap_offset[static_cast<std::size_t>(t)]];
          if (v > acc || best < 0) {
            acc = v;
            best = t;
          }
        }
        result = best < 0 ? 0.0 : acc;  // no tap inside: a window entirely in the padding (pads >= kernel)
      } else if (kind == PoolKind::kAverage) {
        result = taps.average(xp, o, count_include_pad);
      } else {
        double acc = 0.0;
        for (std::int64_t t = t0; t < t1; ++t) {
          acc += std::pow(std::fabs(xp[taps.tap_offset[static_cast<std::size_t>(t)]]), p);
        }
        result = std::pow(acc, 1.0 / p);
      }
      y[static_cast<std::size_t>(plane * out_size + o)] = result;
      if (ind != nullptr) {
        const auto bt = static_cast<std::size_t>(best);
        ind[plane * out_size + o] =
            best < 0 ? -1 : plane * in_size + (storage_order == 0 ? taps.tap_offset[bt] : taps.tap_col_index[bt]);
      }
    }
  }
  store_values(Y, y.data());
}

void global_pool(OpContext& ctx, PoolKind kind) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK(X.dim() >= 2, ctx.where(), ": X must be [N, C, spatial...], got ", shape_str(X.shape()));
  const std::int64_t N = X.shape()[0], Cn = X.shape()[1];
  std::vector<std::int64_t> out_shape(X.shape().size(), 1);
  out_shape[0] = N;
  out_shape[1] = Cn;
  const std::int64_t in_size = product_of(std::vector<std::int64_t>(X.shape().begin() + 2, X.shape().end()));
  const double p = kind == PoolKind::kLp ? ctx.attr_float("p", 2.0) : 2.0;
  Tensor& Y = ctx.allocate_output(0, out_shape, X.dtype());
  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(static_cast<std::size_t>(N * Cn));
  for (std::int64_t plane = 0; plane < N * Cn; ++plane) {
    const double* xp = x.data() + plane * in_size;
    double acc = kind == PoolKind::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
    for (std::int64_t i = 0; i < in_size; ++i) {
      switch (kind) {
        case PoolKind::kMax:
          acc = std::max(acc, xp[i]);
          break;
        case PoolKind::kAverage:
          acc += xp[i];
          break;
        case PoolKind::kLp:
          acc += std::pow(std::fabs(xp[i]), p);
          break;
      }
    }
    if (kind == PoolKind::kAverage) acc = in_size > 0 ? acc / static_cast<double>(in_size) : 0.0;
    if (kind == PoolKind::kLp) acc = std::pow(acc, 1.0 / p);
    y[static_cast<std::size_t>(plane)] = acc;
  }
  store_values(Y, y.data());
}

void max_unpool(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& I = ctx.input(1);
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK_TYPE(I.dtype() == DType::kInt64, ctx.where(), ": input 'I' must be int64, got ", dtype_name(I.dtype()));
  XPURT_CHECK(X.dim() >= 3, ctx.where(), ": X must be [N, C, spatial...], got ", shape_str(X.shape()));
  XPURT_CHECK(I.shape() == X.shape(), ctx.where(), ": I ", shape_str(I.shape()), " must have X's shape ",
              shape_str(X.shape()));
  const std::size_t rank = static_cast<std::size_t>(X.dim()) - 2;
  XPURT_CHECK(ctx.has_attr("kernel_shape"), ctx.where(), ": the kernel_shape attribute is required");
  const Window w = read_window(ctx, rank, {});
  std::vector<std::int64_t> out_shape{X.shape()[0], X.shape()[1]};
  for (std::size_t d = 0; d < rank; ++d) {
    out_shape.push_back((X.shape()[d + 2] - 1) * w.strides[d] + w.kernel[d] - w.pads_begin[d] - w.pads_end[d]);
  }
  if (ctx.has_input(2)) {
    const std::vector<std::int64_t> given = read_ints(ctx.input(2), ctx.where() + " input 'output_shape'");
    XPURT_CHECK(given.size() == out_shape.size(), ctx.where(), ": output_shape ", shape_str(given), " must have ",
                out_shape.size(), " values");
    XPURT_CHECK(given[0] == out_shape[0] && given[1] == out_shape[1], ctx.where(), ": output_shape ", shape_str(given),
                " must keep X's N and C ", shape_str(X.shape()));
    out_shape = given;
  }
  // Indices address the unpooled tensor of the natural shape; a larger output_shape keeps each value at the
  // same coordinates (ONNX's test and ONNX Runtime pad at the end).
  std::vector<std::int64_t> natural{X.shape()[0], X.shape()[1]};
  for (std::size_t d = 0; d < rank; ++d) {
    natural.push_back((X.shape()[d + 2] - 1) * w.strides[d] + w.kernel[d] - w.pads_begin[d] - w.pads_end[d]);
  }
  Tensor& Y = ctx.allocate_output(0, out_shape, X.dtype());
  const std::int64_t total = numel_of(natural);
  const bool remap = natural != out_shape;
  std::memset(Y.data_ptr(), 0, Y.nbytes());
  const std::int64_t* idx = data<std::int64_t>(I);
  const std::size_t elem = Y.element_size();
  const auto* src = static_cast<const unsigned char*>(X.data_ptr());
  auto* dst = static_cast<unsigned char*>(Y.data_ptr());
  for (std::int64_t i = 0; i < X.numel(); ++i) {
    XPURT_CHECK(idx[i] >= 0 && idx[i] < total, ctx.where(), ": index ", idx[i], " in I is outside the unpooled ",
                "tensor of ", total, " elements ", shape_str(natural));
    std::int64_t target = idx[i];
    if (remap) {
      std::int64_t rem = idx[i], stride = 1;
      target = 0;
      for (std::size_t d = natural.size(); d-- > 0;) {
        const std::int64_t c = rem % natural[d];
        rem /= natural[d];
        XPURT_CHECK(c < out_shape[d], ctx.where(), ": index ", idx[i], " falls outside output_shape ",
                    shape_str(out_shape));
        target += c * stride;
        stride *= out_shape[d];
      }
    }
    std::memcpy(dst + static_cast<std::size_t>(target) * elem, src + static_cast<std::size_t>(i) * elem, elem);
  }
}

}  // namespace

void register_nn_pool_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "MaxPool", [](OpContext& ctx) { pool(ctx, PoolKind::kMax); });
  kernels.add("", "AveragePool", [](OpContext& ctx) { pool(ctx, PoolKind::kAverage); });
  kernels.add("", "LpPool", [](OpContext& ctx) { pool(ctx, PoolKind::kLp); });
  kernels.add("", "GlobalMaxPool", [](OpContext& ctx) { global_pool(ctx, PoolKind::kMax); });
  kernels.add("", "GlobalAveragePool", [](OpContext& ctx) { global_pool(ctx, PoolKind::kAverage); });
  kernels.add("", "GlobalLpPool", [](OpContext& ctx) { global_pool(ctx, PoolKind::kLp); });
  kernels.add("", "MaxUnpool", max_unpool);
}

}  // namespace xpuruntime::onnx_ref::nn

namespace xpuruntime::onnx_ref {

std::vector<std::int64_t> average_pool(const OpContext& ctx, const std::vector<std::int64_t>& x_shape,
                                       const ScratchVector<double>& x, ScratchVector<double>& y) {
  const nn::PoolShape shape = nn::pool_shape(ctx, x_shape);
  y.assign(static_cast<std::size_t>(numel_of(shape.out_shape)), 0.0);
  if (y.empty()) return shape.out_shape;
  XPURT_INTERNAL_ASSERT(x.size() == static_cast<std::size_t>(numel_of(x_shape)), "average_pool: ", x.size(),
                        " values for ", nn::shape_str(x_shape));
  const nn::PoolTaps taps = nn::pool_taps(shape);
  const bool count_include_pad = ctx.attr_int("count_include_pad", 0) != 0;
  const std::int64_t planes = x_shape[0] * x_shape[1];
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    for (std::int64_t o = 0; o < taps.out_size; ++o) {
      y[static_cast<std::size_t>(plane * taps.out_size + o)] =
          taps.average(x.data() + plane * taps.in_size, o, count_include_pad);
    }
  }
  return shape.out_shape;
}

}  // namespace xpuruntime::onnx_ref
