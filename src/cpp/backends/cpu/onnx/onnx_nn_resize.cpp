// ONNX reference ops: Resize (opsets 10-19: nearest/linear/cubic, every coordinate_transformation_mode,
// antialias, axes, keep_aspect_ratio_policy; any rank), Upsample, GridSample, AffineGrid, RoiAlign, MaxRoiPool
// and NonMaxSuppression.
// Values are computed in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "backends/cpu/onnx/onnx_nn_common.h"
#include "core/scalar.h"

namespace xpuruntime::onnx_ref::nn {
namespace {

// ---- Resize ----

// Note [Separable resize]
// Every Resize mode is a tensor product of 1-D interpolations (ONNX's reference interpolates the last axis first,
// then the others; the weights multiply). So Resize runs one 1-D pass per axis whose mapping is not the
// identity: each output position o along the axis reads input positions index[j] with weights weight[j]
// (j in [begin[o], begin[o + 1])), or is the extrapolation value (tf_crop_and_resize outside the input). A
// position extrapolated along one axis stays so through the other passes, since every pass's weights sum to 1.
struct AxisMap {
  std::vector<std::int64_t> begin;  // out + 1 entries
  std::vector<std::int64_t> index;
  ScratchVector<double> weight;
  ScratchVector<char> extrapolate;  // per output position
  bool identity(std::int64_t in) const {
    const auto out = static_cast<std::int64_t>(extrapolate.size());
    if (out != in) return false;
    for (std::int64_t o = 0; o < out; ++o) {
      if (extrapolate[static_cast<std::size_t>(o)] ||
          begin[static_cast<std::size_t>(o + 1)] - begin[static_cast<std::size_t>(o)] != 1 ||
          index[static_cast<std::size_t>(begin[static_cast<std::size_t>(o)])] != o ||
          weight[static_cast<std::size_t>(begin[static_cast<std::size_t>(o)])] != 1.0) {
        return false;
      }
    }
    return true;
  }
};

struct ResizeParams {
  std::string mode = "nearest";
  std::string coordinate_mode = "half_pixel";
  std::string nearest_mode = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation_value = 0.0;
  bool antialias = false;
  bool legacy_nearest = false;  // Resize-10 / Upsample: floor, but ceil along axes that shrink
};

double cubic_kernel(double x, double a) {
  x = std::fabs(x);
  if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

AxisMap make_axis_map(const ResizeParams& p, const OpContext& ctx, std::int64_t in, std::int64_t out, double scale,
                      double roi_start, double roi_end) {
  AxisMap m;
  m.begin.push_back(0);
  // The output length the coordinate formulas use: scale * in (as ONNX's reference does; equal to `out` when
  // the sizes input gave it).
  const double out_length = scale * static_cast<double>(in);
  const double in_d = static_cast<double>(in);
  for (std::int64_t o = 0; o < out; ++o) {
    const double od = static_cast<double>(o);
    double x = 0;
    bool extrapolate = false;
    const std::string& cm = p.coordinate_mode;
    if (cm == "half_pixel") {
      x = (od + 0.5) / scale - 0.5;
    } else if (cm == "half_pixel_symmetric") {
      const double adjustment = static_cast<double>(out) / out_length;
      const double center = in_d / 2;
      const double offset = center * (1 - adjustment);
      x = offset + (od + 0.5) / scale - 0.5;
    } else if (cm == "pytorch_half_pixel") {
      x = out_length > 1 ? (od + 0.5) / scale - 0.5 : -0.5;
    } else if (cm == "align_corners") {
      x = out_length == 1 ? 0.0 : od * (in_d - 1) / (out_length - 1);
    } else if (cm == "asymmetric") {
      x = od / scale;
    } else if (cm == "tf_half_pixel_for_nn") {
      x = (od + 0.5) / scale;
    } else if (cm == "tf_crop_and_resize") {
      x = out_length == 1 ? (roi_end - roi_start) * (in_d - 1) / 2
                          : od * (roi_end - roi_start) * (in_d - 1) / (out_length - 1);
      x += roi_start * (in_d - 1);
      extrapolate = x < 0 || x > in_d - 1;
    } else {
      throw InvalidArgumentError(
          detail::str_cat(ctx.where(), ": coordinate_transformation_mode '", cm,
                          "' is not one of half_pixel, half_pixel_symmetric, pytorch_half_pixel, "
                          "align_corners, asymmetric, tf_half_pixel_for_nn, tf_crop_and_resize"));
    }
    m.extrapolate.push_back(extrapolate ? 1 : 0);
    auto clamp = [&](std::int64_t i) { return std::clamp<std::int64_t>(i, 0, in - 1); };
    if (!extrapolate) {
      // i0 = ceil(x) - 1 and ratio in (0, 1]: ONNX's reference prefers the neighbours left of x (an integer x is
      // reached with ratio 1 from its left neighbour).
      const double fl = std::floor(x);
      const bool integral = fl == x;
      const std::int64_t i0 = static_cast<std::int64_t>(fl) - (integral ? 1 : 0);
      const double ratio = x - static_cast<double>(i0);
      if (p.mode == "nearest") {
        std::int64_t idx;
        if (p.legacy_nearest) {
          idx = static_cast<std::int64_t>(scale < 1 ? std::ceil(x) : std::floor(x));
        } else if (integral) {
          idx = i0 + 1;
        } else {
          bool up;
          const std::string& nm = p.nearest_mode;
          if (nm == "round_prefer_floor") {
            up = ratio > 0.5;
          } else if (nm == "round_prefer_ceil") {
            up = ratio >= 0.5;
          } else if (nm == "floor") {
            up = false;
          } else if (nm == "ceil") {
            up = true;
          } else {
            throw InvalidArgumentError(detail::str_cat(ctx.where(), ": nearest_mode '", nm,
                                                       "' is not one of round_prefer_floor, round_prefer_ceil, "
                                                       "floor, ceil"));
          }
          idx = up ? i0 + 1 : i0;
        }
        m.index.push_back(clamp(idx));
        m.weight.push_back(1.0);
      } else {
        ScratchVector<double> coeffs;
        std::int64_t start;
        const double s = p.antialias ? std::min(scale, 1.0) : 1.0;
        if (p.mode == "linear") {
          start = static_cast<std::int64_t>(std::floor(-1 / s) + 1);
          const std::int64_t footprint = 2 - 2 * start;
          for (std::int64_t j = 0; j < footprint; ++j) {
            coeffs.push_back(std::clamp(1 - std::fabs((static_cast<double>(start + j) - ratio) * s), 0.0, 1.0));
          }
        } else if (p.mode == "cubic") {
          start = static_cast<std::int64_t>(std::floor(-2 / s) + 1);
          for (std::int64_t j = start; j < 2 - start; ++j) {
            coeffs.push_back(cubic_kernel(s * (static_cast<double>(j) - ratio), p.cubic_a));
          }
        } else {
          throw InvalidArgumentError(
              detail::str_cat(ctx.where(), ": mode '", p.mode, "' is not one of nearest, linear, cubic"));
        }
        if (p.exclude_outside) {
          for (std::size_t j = 0; j < coeffs.size(); ++j) {
            const std::int64_t idx = i0 + start + static_cast<std::int64_t>(j);
            if (idx < 0 || idx >= in) coeffs[j] = 0;
          }
        }
        double sum = 0;
        for (double c : coeffs) sum += c;
        const bool normalize = p.exclude_outside || p.antialias;
        for (std::size_t j = 0; j < coeffs.size(); ++j) {
          const double c = normalize && sum != 0 ? coeffs[j] / sum : coeffs[j];
          if (c == 0) continue;
          m.index.push_back(clamp(i0 + start + static_cast<std::int64_t>(j)));
          m.weight.push_back(c);
        }
      }
    }
    m.begin.push_back(static_cast<std::int64_t>(m.index.size()));
  }
  return m;
}

// One pass along `axis` of a row-major tensor of shape `shape` (updated to the new length).
ScratchVector<double> resample_axis(const ScratchVector<double>& x, std::vector<std::int64_t>& shape, std::size_t axis,
                                  const AxisMap& m, double extrapolation_value) {
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const std::int64_t in = shape[axis];
  const auto out = static_cast<std::int64_t>(m.extrapolate.size());
  ScratchVector<double> y(static_cast<std::size_t>(outer * out * inner));
  for (std::int64_t a = 0; a < outer; ++a) {
    for (std::int64_t o = 0; o < out; ++o) {
      double* yr = y.data() + (a * out + o) * inner;
      if (m.extrapolate[static_cast<std::size_t>(o)]) {
        std::fill(yr, yr + inner, extrapolation_value);
        continue;
      }
      std::fill(yr, yr + inner, 0.0);
      for (std::int64_t j = m.begin[static_cast<std::size_t>(o)]; j < m.begin[static_cast<std::size_t>(o + 1)]; ++j) {
        const double w = m.weight[static_cast<std::size_t>(j)];
        const double* xr = x.data() + (a * in + m.index[static_cast<std::size_t>(j)]) * inner;
        for (std::int64_t i = 0; i < inner; ++i) yr[i] += w * xr[i];
      }
    }
  }
  shape[axis] = out;
  return y;
}

// Note [Resize of the last two axes]
// The common Resize (an image or feature map scaled along H and W, every other axis kept) runs plane by plane
// instead of as whole-tensor passes: per output row, the blend of its input rows (the H taps, a vectorisable pass
// over the input's width) into a double row, then each output column's W taps read from that row, rounded once to
// the output dtype like store_values. The same taps and weights in double as the passes (Note [Separable resize]),
// the axes taken in the other order, so results equal theirs up to double rounding; the passes' whole-tensor double
// buffers and their per-element loop along W took 9x ONNX Runtime's time on FCN's 28 -> 224 bilinear upsampling
// (2026-12-03, this machine: 7.6 against 0.8 ms for [1, 21, 28, 28]).

// The W taps of Note [Resize of the last two axes] with the same count for every output column (the most any column
// has; the others padded with weight 0 at index 0, which adds an exact 0), so that the loop over a column's taps has a
// known length for nearest (1), linear (2) and cubic (4).
struct ColumnTaps {
  std::int64_t columns = 0, taps = 0;
  std::vector<std::int64_t> index;  // [column][tap]
  ScratchVector<double> weight;
};

ColumnTaps column_taps(const AxisMap& m) {
  ColumnTaps c;
  c.columns = static_cast<std::int64_t>(m.extrapolate.size());
  for (std::int64_t o = 0; o < c.columns; ++o) {
    c.taps = std::max(c.taps, m.begin[static_cast<std::size_t>(o + 1)] - m.begin[static_cast<std::size_t>(o)]);
  }
  c.index.assign(static_cast<std::size_t>(c.columns * c.taps), 0);
  c.weight.assign(static_cast<std::size_t>(c.columns * c.taps), 0.0);
  for (std::int64_t o = 0; o < c.columns; ++o) {
    for (std::int64_t j = m.begin[static_cast<std::size_t>(o)]; j < m.begin[static_cast<std::size_t>(o + 1)]; ++j) {
      const auto at = static_cast<std::size_t>(o * c.taps + j - m.begin[static_cast<std::size_t>(o)]);
      c.index[at] = m.index[static_cast<std::size_t>(j)];
      c.weight[at] = m.weight[static_cast<std::size_t>(j)];
    }
  }
  return c;
}

// One output row: each column's taps of `row`, summed in double from 0.0 in tap order, rounded once. kTaps 0: the
// count from `c`.
template <typename T, int kTaps>
void blend_columns(const double* row, const ColumnTaps& c, T* out) {
  using CT = typename Compute<T>::type;
  const std::int64_t taps = kTaps > 0 ? kTaps : c.taps;
  const std::int64_t* index = c.index.data();
  const double* weight = c.weight.data();
  for (std::int64_t o = 0; o < c.columns; ++o, index += taps, weight += taps) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < taps; ++j) sum += weight[j] * row[index[j]];
    out[o] = Compute<T>::store(static_cast<CT>(sum));
  }
}

template <typename T>
void resize_planes(const Tensor& X, Tensor& Y, const AxisMap& mh, const AxisMap& mw) {
  const std::size_t rank = X.shape().size();
  const std::int64_t in_h = X.shape()[rank - 2], in_w = X.shape()[rank - 1];
  const auto out_h = static_cast<std::int64_t>(mh.extrapolate.size());
  const auto out_w = static_cast<std::int64_t>(mw.extrapolate.size());
  const std::int64_t planes = in_h * in_w == 0 ? 0 : X.numel() / (in_h * in_w);
  const T* x = data<T>(X);
  T* y = data<T>(Y);
  ScratchVector<double> row(static_cast<std::size_t>(in_w));
  const ColumnTaps columns = column_taps(mw);
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    const T* xp = x + plane * in_h * in_w;
    T* yp = y + plane * out_h * out_w;
    for (std::int64_t oh = 0; oh < out_h; ++oh) {
      double* r = row.data();
      std::fill(r, r + in_w, 0.0);
      for (std::int64_t j = mh.begin[static_cast<std::size_t>(oh)]; j < mh.begin[static_cast<std::size_t>(oh + 1)];
           ++j) {
        const double w = mh.weight[static_cast<std::size_t>(j)];
        const T* xr = xp + mh.index[static_cast<std::size_t>(j)] * in_w;
        for (std::int64_t i = 0; i < in_w; ++i) r[i] += w * static_cast<double>(Compute<T>::load(xr[i]));
      }
      T* yr = yp + oh * out_w;
      switch (columns.taps) {
        case 1: blend_columns<T, 1>(r, columns, yr); break;
        case 2: blend_columns<T, 2>(r, columns, yr); break;
        case 4: blend_columns<T, 4>(r, columns, yr); break;
        default: blend_columns<T, 0>(r, columns, yr); break;
      }
    }
  }
}

// Whether `maps` (one per axis of `in`) change only the last two axes and extrapolate nowhere (Note [Resize of the
// last two axes]).
bool resizes_last_two_axes(const std::vector<AxisMap>& maps, const std::vector<std::int64_t>& in) {
  const std::size_t rank = in.size();
  if (rank < 2) return false;
  for (std::size_t d = 0; d < rank; ++d) {
    if (d + 2 < rank && !maps[d].identity(in[d])) return false;
    for (const char e : maps[d].extrapolate) {
      if (e) return false;
    }
  }
  return true;
}

// Output sizes at or past this are refused before their double becomes an int64 (past int64's range the conversion
// is undefined; no tensor is that large anyway).
constexpr double kLargestSize = 9.2e18;

void run_resize(OpContext& ctx, const ResizeParams& p, ScratchVector<double> scales, std::vector<std::int64_t> sizes,
                ScratchVector<double> roi) {
  const Tensor& X = ctx.input(0);
  XPURT_CHECK_TYPE(X.dtype() != DType::kBool, ctx.where(), ": input 'X' must be numeric, got bool");
  const std::size_t rank = X.shape().size();
  const std::vector<std::int64_t>& in = X.shape();
  std::vector<std::int64_t> out(rank);
  if (!sizes.empty()) {
    XPURT_CHECK(sizes.size() == rank, ctx.where(), ": sizes ", shape_str(sizes), " must have one value per dim of X ",
                shape_str(in));
    scales.resize(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      XPURT_CHECK(sizes[d] >= 0, ctx.where(), ": sizes must be >= 0, got ", shape_str(sizes));
      out[d] = sizes[d];
      if (scales[d] == 0) scales[d] = in[d] == 0 ? 1.0 : static_cast<double>(sizes[d]) / static_cast<double>(in[d]);
    }
  } else {
    XPURT_CHECK(scales.size() == rank, ctx.where(), ": scales has ", scales.size(), " values, X ", shape_str(in),
                " has rank ", rank, " (one of scales and sizes must be given)");
    for (std::size_t d = 0; d < rank; ++d) {
      XPURT_CHECK(scales[d] > 0, ctx.where(), ": scales must be > 0, got ", scales[d], " for dim ", d);
      // Found by fuzz_model_structure_native: a huge scale (kLargestSize).
      const double size = std::floor(static_cast<double>(in[d]) * scales[d]);
      XPURT_CHECK(size < kLargestSize, ctx.where(), ": scale ", scales[d], " makes dim ", d, " of X ", shape_str(in),
                  " larger than any tensor can be");
      out[d] = static_cast<std::int64_t>(size);
    }
  }
  if (roi.empty()) {
    roi.assign(2 * rank, 0.0);
    for (std::size_t d = 0; d < rank; ++d) roi[rank + d] = 1.0;
  }
  XPURT_CHECK(roi.size() == 2 * rank, ctx.where(), ": roi must have ", 2 * rank, " values (starts then ends), got ",
              roi.size());
  Tensor& Y = ctx.allocate_output(0, out, X.dtype());
  if (Y.numel() == 0) return;
  XPURT_CHECK(X.numel() > 0, ctx.where(), ": cannot resize the empty tensor ", shape_str(in), " to ", shape_str(out));
  std::vector<AxisMap> maps;
  for (std::size_t d = 0; d < rank; ++d) {
    maps.push_back(make_axis_map(p, ctx, in[d], out[d], scales[d], roi[d], roi[rank + d]));
  }
  if (is_float_dtype(X.dtype()) && resizes_last_two_axes(maps, in)) {
    visit_dtype(X.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        resize_planes<T>(X, Y, maps[rank - 2], maps[rank - 1]);
      }
    });
    return;
  }
  ScratchVector<double> x = load_values<double>(X);
  std::vector<std::int64_t> shape = in;
  // Last axis first, like the reference (the result is the same up to rounding).
  for (std::size_t d = rank; d-- > 0;) {
    if (maps[d].identity(in[d])) continue;
    x = resample_axis(x, shape, d, maps[d], p.extrapolation_value);
  }
  if (!is_float_dtype(X.dtype())) {
    // Integer outputs: truncated toward zero, as ONNX's reference casts (nearest mode is exact anyway).
    for (double& v : x) v = std::trunc(v);
  }
  store_values(Y, x.data());
}

ScratchVector<double> read_floats(const Tensor& t) { return load_values<double>(t); }

void resize(OpContext& ctx) {
  ResizeParams p;
  p.mode = ctx.attr_string("mode", "nearest");
  ScratchVector<double> scales, roi;
  std::vector<std::int64_t> sizes;
  const std::size_t rank = static_cast<std::size_t>(ctx.input(0).dim());
  if (ctx.opset() < 11) {
    // Resize-10: asymmetric coordinates; nearest rounds down, or up along an axis that shrinks (what ONNX's
    // Resize-10 tests expect, e.g. [1 2 3 4] * 0.6 -> [1 3], and ONNX Runtime does).
    p.coordinate_mode = "asymmetric";
    p.legacy_nearest = true;
    scales = read_floats(ctx.input(1));
  } else {
    p.coordinate_mode = ctx.attr_string("coordinate_transformation_mode", "half_pixel");
    p.nearest_mode = ctx.attr_string("nearest_mode", "round_prefer_floor");
    p.cubic_a = ctx.attr_float("cubic_coeff_a", -0.75);
    p.exclude_outside = ctx.attr_int("exclude_outside", 0) != 0;
    p.extrapolation_value = ctx.attr_float("extrapolation_value", 0.0);
    p.antialias = ctx.opset() >= 18 && ctx.attr_int("antialias", 0) != 0;
    // roi only matters to tf_crop_and_resize (other modes ignore whatever the model passes).
    if (p.coordinate_mode == "tf_crop_and_resize" && ctx.has_input(1) && ctx.input(1).numel() > 0) {
      roi = read_floats(ctx.input(1));
    }
    if (ctx.has_input(2) && ctx.input(2).numel() > 0) scales = read_floats(ctx.input(2));
    if (ctx.has_input(3) && ctx.input(3).numel() > 0) sizes = read_ints(ctx.input(3), ctx.where() + " input 'sizes'");
    XPURT_CHECK(scales.empty() != sizes.empty(), ctx.where(), ": exactly one of 'scales' and 'sizes' must be given (",
                scales.empty() ? "neither" : "both", " given)");
  }
  // Opset 18: `axes` says which dims scales/sizes/roi cover (the others keep scale 1, roi [0, 1]).
  std::vector<std::int64_t> axes = ctx.attr_ints("axes", {});
  if (!axes.empty()) {
    for (std::int64_t& a : axes) a = normalize_axis(a, static_cast<std::int64_t>(rank), ctx.where());
    const std::size_t k = axes.size();
    XPURT_CHECK(scales.empty() || scales.size() == k, ctx.where(), ": scales must have one value per axis (", k, ")");
    XPURT_CHECK(sizes.empty() || sizes.size() == k, ctx.where(), ": sizes must have one value per axis (", k, ")");
    XPURT_CHECK(roi.empty() || roi.size() == 2 * k, ctx.where(), ": roi must have ", 2 * k, " values");
    ScratchVector<double> full_scales(rank, 1.0), full_roi(2 * rank, 0.0);
    std::vector<std::int64_t> full_sizes = ctx.input(0).shape();
    for (std::size_t d = 0; d < rank; ++d) full_roi[rank + d] = 1.0;
    for (std::size_t j = 0; j < k; ++j) {
      const auto a = static_cast<std::size_t>(axes[j]);
      if (!scales.empty()) full_scales[a] = scales[j];
      if (!sizes.empty()) full_sizes[a] = sizes[j];
      if (!roi.empty()) {
        full_roi[a] = roi[j];
        full_roi[rank + a] = roi[k + j];
      }
    }
    if (!scales.empty()) scales = full_scales;
    if (!sizes.empty()) sizes = full_sizes;
    if (!roi.empty()) roi = full_roi;
  } else {
    for (std::size_t d = 0; d < rank; ++d) axes.push_back(static_cast<std::int64_t>(d));
  }
  ScratchVector<double> size_scales;
  if (!sizes.empty()) {
    const std::vector<std::int64_t>& in = ctx.input(0).shape();
    const std::string policy = ctx.attr_string("keep_aspect_ratio_policy", "stretch");
    size_scales.assign(rank, 0.0);
    if (policy != "stretch") {
      XPURT_CHECK(policy == "not_larger" || policy == "not_smaller", ctx.where(), ": keep_aspect_ratio_policy '",
                  policy, "' is not one of stretch, not_larger, not_smaller");
      double scale = policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
      for (std::int64_t a : axes) {
        const auto d = static_cast<std::size_t>(a);
        const double s = static_cast<double>(sizes[d]) / static_cast<double>(in[d]);
        scale = policy == "not_larger" ? std::min(scale, s) : std::max(scale, s);
      }
      for (std::int64_t a : axes) {
        const auto d = static_cast<std::size_t>(a);
        const double size = std::floor(scale * static_cast<double>(in[d]) + 0.5);  // round half up
        XPURT_CHECK(size < kLargestSize, ctx.where(), ": sizes ", shape_str(sizes), " make dim ", d, " of X ",
                    shape_str(in), " larger than any tensor can be");
        sizes[d] = static_cast<std::int64_t>(size);
        size_scales[d] = scale;
      }
    }
  }
  run_resize(ctx, p, sizes.empty() ? scales : size_scales, sizes, roi);
}

void upsample(OpContext& ctx) {
  ResizeParams p;
  p.mode = ctx.attr_string("mode", "nearest");
  if (p.mode == "bilinear") p.mode = "linear";  // Upsample-1's name
  XPURT_CHECK(p.mode == "nearest" || p.mode == "linear", ctx.where(), ": mode '", p.mode,
              "' is not one of nearest, linear");
  p.coordinate_mode = "asymmetric";
  p.legacy_nearest = true;
  ScratchVector<double> scales;
  if (ctx.opset() >= 9) {
    scales = read_floats(ctx.input(1));
  } else if (ctx.has_attr("scales")) {
    const std::vector<double> attr = ctx.attr_floats("scales", {});
    scales.assign(attr.begin(), attr.end());
  } else {
    // Upsample-1: height_scale / width_scale of an NCHW input.
    scales = {1.0, 1.0, ctx.attr_float("height_scale", 1.0), ctx.attr_float("width_scale", 1.0)};
  }
  run_resize(ctx, p, scales, {}, {});
}

// ---- GridSample ----

double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double dx = lo - x;
    const auto n = static_cast<std::int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const auto n = static_cast<std::int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

void grid_sample(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& G = ctx.input(1);
  check_float(ctx, X, "input 'X'");
  check_float(ctx, G, "input 'grid'");
  XPURT_CHECK(X.dim() >= 3, ctx.where(), ": X must be [N, C, spatial...], got ", shape_str(X.shape()));
  const std::size_t rank = static_cast<std::size_t>(X.dim()) - 2;
  XPURT_CHECK(G.dim() == X.dim() && G.shape()[0] == X.shape()[0] && G.shape().back() == static_cast<std::int64_t>(rank),
              ctx.where(), ": grid must be [N, out spatial..., ", rank, "] for X ", shape_str(X.shape()), ", got ",
              shape_str(G.shape()));
  std::string mode = ctx.attr_string("mode", ctx.opset() >= 20 ? "linear" : "bilinear");
  if (mode == "bilinear") mode = "linear";
  if (mode == "bicubic") mode = "cubic";
  XPURT_CHECK(mode == "linear" || mode == "nearest" || mode == "cubic", ctx.where(), ": mode '", mode,
              "' is not one of linear (bilinear), nearest, cubic (bicubic)");
  if (mode == "cubic") {
    XPURT_CHECK(rank == 2, ctx.where(), ": cubic mode takes a 4-D input, got ", shape_str(X.shape()));
  }
  const std::string padding = ctx.attr_string("padding_mode", "zeros");
  XPURT_CHECK(padding == "zeros" || padding == "border" || padding == "reflection", ctx.where(), ": padding_mode '",
              padding, "' is not one of zeros, border, reflection");
  const bool align = ctx.attr_int("align_corners", 0) != 0;
  const std::int64_t N = X.shape()[0], C = X.shape()[1];
  const std::vector<std::int64_t> in_sp(X.shape().begin() + 2, X.shape().end());
  const std::vector<std::int64_t> out_sp(G.shape().begin() + 1, G.shape().end() - 1);
  std::vector<std::int64_t> out_shape{N, C};
  out_shape.insert(out_shape.end(), out_sp.begin(), out_sp.end());
  Tensor& Y = ctx.allocate_output(0, out_shape, X.dtype());
  if (Y.numel() == 0) return;
  const ScratchVector<double> x = load_values<double>(X), grid = load_values<double>(G);
  std::int64_t in_size = 1, out_size = 1;
  for (std::int64_t v : in_sp) in_size *= v;
  for (std::int64_t v : out_sp) out_size *= v;
  std::vector<std::int64_t> in_strides(rank, 1);
  for (std::size_t d = rank; d-- > 1;) in_strides[d - 1] = in_strides[d] * in_sp[d];
  ScratchVector<double> y(static_cast<std::size_t>(Y.numel()));
  // Grid coordinates are ordered (x, y, z...): the last spatial dim first.
  ScratchVector<double> coord(rank);
  ScratchVector<double> lo(rank), hi(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    const double len = static_cast<double>(in_sp[d]);
    lo[d] = align ? 0.0 : -0.5;
    hi[d] = align ? len - 1 : len - 0.5;
  }
  // The value at integer position `pos` of plane `xp` under the padding mode.
  auto pixel = [&](const double* xp, const std::vector<std::int64_t>& pos) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::int64_t i = pos[d];
      if (i < 0 || i >= in_sp[d]) {
        if (padding == "zeros") return 0.0;
        if (padding == "border") {
          i = std::clamp<std::int64_t>(i, 0, in_sp[d] - 1);
        } else {
          i = static_cast<std::int64_t>(reflect(static_cast<double>(i), lo[d], hi[d]));
          i = std::clamp<std::int64_t>(i, 0, in_sp[d] - 1);
        }
      }
      off += i * in_strides[d];
    }
    return xp[off];
  };
  std::vector<std::int64_t> pos(rank);
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t o = 0; o < out_size; ++o) {
      const double* g = grid.data() + (n * out_size + o) * static_cast<std::int64_t>(rank);
      for (std::size_t d = 0; d < rank; ++d) {
        const double gv = g[rank - 1 - d];
        const double len = static_cast<double>(in_sp[d]);
        double c = align ? (gv + 1) / 2 * (len - 1) : ((gv + 1) * len - 1) / 2;
        // Border padding clamps the sampling point for linear and nearest; cubic instead clamps each of its
        // taps (in pixel()), as PyTorch and ONNX Runtime do.
        if (padding == "border" && mode != "cubic") {
          c = std::clamp(c, 0.0, len - 1);
        } else if (padding == "reflection") {
          c = reflect(c, lo[d], hi[d]);
        }
        coord[d] = c;
      }
      for (std::int64_t c = 0; c < C; ++c) {
        const double* xp = x.data() + (n * C + c) * in_size;
        double v = 0;
        if (mode == "nearest") {
          for (std::size_t d = 0; d < rank; ++d) pos[d] = static_cast<std::int64_t>(std::nearbyint(coord[d]));
          v = pixel(xp, pos);
        } else if (mode == "linear") {
          // 2^rank corners.
          for (std::int64_t corner = 0; corner < (std::int64_t{1} << rank); ++corner) {
            double w = 1;
            for (std::size_t d = 0; d < rank; ++d) {
              const double f = std::floor(coord[d]);
              const bool upper = ((corner >> d) & 1) != 0;
              pos[d] = static_cast<std::int64_t>(f) + (upper ? 1 : 0);
              w *= upper ? coord[d] - f : 1 - (coord[d] - f);
            }
            if (w != 0) v += w * pixel(xp, pos);
          }
        } else {
          const double f0 = std::floor(coord[0]), f1 = std::floor(coord[1]);
          const double t0 = coord[0] - f0, t1 = coord[1] - f1;
          for (int a = -1; a <= 2; ++a) {
            const double wa = cubic_kernel(static_cast<double>(a) - t0, -0.75);
            for (int b = -1; b <= 2; ++b) {
              const double wb = cubic_kernel(static_cast<double>(b) - t1, -0.75);
              pos[0] = static_cast<std::int64_t>(f0) + a;
              pos[1] = static_cast<std::int64_t>(f1) + b;
              v += wa * wb * pixel(xp, pos);
            }
          }
        }
        y[static_cast<std::size_t>((n * C + c) * out_size + o)] = v;
      }
    }
  }
  store_values(Y, y.data());
}

// ---- RoiAlign ----

void roi_align(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& R = ctx.input(1);
  const Tensor& B = ctx.input(2);
  check_float(ctx, X, "input 'X'");
  check_float(ctx, R, "input 'rois'");
  XPURT_CHECK(X.dim() == 4, ctx.where(), ": X must be [N, C, H, W], got ", shape_str(X.shape()));
  XPURT_CHECK(R.dim() == 2 && R.shape()[1] == 4, ctx.where(), ": rois must be [num_rois, 4], got ",
              shape_str(R.shape()));
  const std::vector<std::int64_t> batch = read_ints(B, ctx.where() + " input 'batch_indices'");
  const std::int64_t num_rois = R.shape()[0];
  XPURT_CHECK(static_cast<std::int64_t>(batch.size()) == num_rois, ctx.where(), ": batch_indices must have ", num_rois,
              " values (one per roi), got ", batch.size());
  const std::string mode = ctx.attr_string("mode", "avg");
  XPURT_CHECK(mode == "avg" || mode == "max", ctx.where(), ": mode '", mode, "' is not one of avg, max");
  const std::int64_t oh = ctx.attr_int("output_height", 1), ow = ctx.attr_int("output_width", 1);
  XPURT_CHECK(oh > 0 && ow > 0, ctx.where(), ": output_height and output_width must be > 0");
  const std::int64_t sampling_ratio = ctx.attr_int("sampling_ratio", 0);
  const double spatial_scale = ctx.attr_float("spatial_scale", 1.0);
  const bool half_pixel = ctx.attr_string("coordinate_transformation_mode",
                                          ctx.opset() >= 16 ? "half_pixel" : "output_half_pixel") == "half_pixel";
  const std::int64_t N = X.shape()[0], C = X.shape()[1], H = X.shape()[2], W = X.shape()[3];
  Tensor& Y = ctx.allocate_output(0, {num_rois, C, oh, ow}, X.dtype());
  const ScratchVector<double> x = load_values<double>(X), rois = load_values<double>(R);
  ScratchVector<double> y(static_cast<std::size_t>(Y.numel()));
  const double offset = half_pixel ? 0.5 : 0.0;
  for (std::int64_t r = 0; r < num_rois; ++r) {
    const std::int64_t b = batch[static_cast<std::size_t>(r)];
    XPURT_CHECK(b >= 0 && b < N, ctx.where(), ": batch index ", b, " of roi ", r, " is outside [0, ", N, ")");
    const double* roi = rois.data() + r * 4;
    const double start_w = roi[0] * spatial_scale - offset, start_h = roi[1] * spatial_scale - offset;
    double roi_w = roi[2] * spatial_scale - offset - start_w, roi_h = roi[3] * spatial_scale - offset - start_h;
    if (!half_pixel) {
      roi_w = std::max(roi_w, 1.0);
      roi_h = std::max(roi_h, 1.0);
    }
    const double bin_h = roi_h / static_cast<double>(oh), bin_w = roi_w / static_cast<double>(ow);
    // The adaptive grid, checked as doubles before its conversion (NaN or past int64's range would be undefined) and
    // bounded (a ROI of 1e30 pixels would sample forever).
    const double grid_hd = sampling_ratio > 0 ? static_cast<double>(sampling_ratio) : std::ceil(bin_h);
    const double grid_wd = sampling_ratio > 0 ? static_cast<double>(sampling_ratio) : std::ceil(bin_w);
    constexpr double kMaxGrid = 16777216.0;  // 2^24 sampling points a bin
    XPURT_CHECK(std::fabs(grid_hd) <= kMaxGrid && std::fabs(grid_wd) <= kMaxGrid && grid_hd * grid_wd <= kMaxGrid,
                ctx.where(), ": roi ", r, " [",
                roi[0], ", ", roi[1], ", ", roi[2], ", ", roi[3], "] at spatial_scale ", spatial_scale,
                " needs a sampling grid of ", grid_hd, " x ", grid_wd, " points a bin (at most 2^24)");
    const auto grid_h = static_cast<std::int64_t>(grid_hd), grid_w = static_cast<std::int64_t>(grid_wd);
    const double count = static_cast<double>(std::max<std::int64_t>(grid_h * grid_w, 1));
    for (std::int64_t c = 0; c < C; ++c) {
      const double* xp = x.data() + (b * C + c) * H * W;
      for (std::int64_t ph = 0; ph < oh; ++ph) {
        for (std::int64_t pw = 0; pw < ow; ++pw) {
          double acc = 0;
          bool first = true;
          for (std::int64_t iy = 0; iy < grid_h; ++iy) {
            double yy = start_h + static_cast<double>(ph) * bin_h +
                        (static_cast<double>(iy) + 0.5) * bin_h / static_cast<double>(grid_h);
            for (std::int64_t ix = 0; ix < grid_w; ++ix) {
              double xx = start_w + static_cast<double>(pw) * bin_w +
                          (static_cast<double>(ix) + 0.5) * bin_w / static_cast<double>(grid_w);
              // Bilinear sample with ONNX Runtime's border rules (what the spec's tests follow).
              double v1 = 0, v2 = 0, v3 = 0, v4 = 0, w1 = 0, w2 = 0, w3 = 0, w4 = 0;
              if (!(yy < -1.0 || yy > static_cast<double>(H) || xx < -1.0 || xx > static_cast<double>(W))) {
                double sy = std::max(yy, 0.0), sx = std::max(xx, 0.0);
                auto y_low = static_cast<std::int64_t>(sy), x_low = static_cast<std::int64_t>(sx);
                std::int64_t y_high, x_high;
                if (y_low >= H - 1) {
                  y_high = y_low = H - 1;
                  sy = static_cast<double>(y_low);
                } else {
                  y_high = y_low + 1;
                }
                if (x_low >= W - 1) {
                  x_high = x_low = W - 1;
                  sx = static_cast<double>(x_low);
                } else {
                  x_high = x_low + 1;
                }
                const double ly = sy - static_cast<double>(y_low), lx = sx - static_cast<double>(x_low);
                const double hy = 1 - ly, hx = 1 - lx;
                w1 = hy * hx;
                w2 = hy * lx;
                w3 = ly * hx;
                w4 = ly * lx;
                v1 = xp[y_low * W + x_low];
                v2 = xp[y_low * W + x_high];
                v3 = xp[y_high * W + x_low];
                v4 = xp[y_high * W + x_high];
              }
              if (mode == "avg") {
                acc += w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4;
              } else {
                const double v = std::max(std::max(std::max(w1 * v1, w2 * v2), w3 * v3), w4 * v4);
                acc = first ? v : std::max(acc, v);
                first = false;
              }
            }
          }
          if (mode == "avg") acc /= count;
          y[static_cast<std::size_t>(((r * C + c) * oh + ph) * ow + pw)] = acc;
        }
      }
    }
  }
  store_values(Y, y.data());
}

// ---- NonMaxSuppression ----

void non_max_suppression(OpContext& ctx) {
  const Tensor& boxes_t = ctx.input(0);
  const Tensor& scores_t = ctx.input(1);
  check_float(ctx, boxes_t, "input 'boxes'");
  check_float(ctx, scores_t, "input 'scores'");
  XPURT_CHECK(boxes_t.dim() == 3 && boxes_t.shape()[2] == 4, ctx.where(),
              ": boxes must be [num_batches, spatial_dimension, 4], got ", shape_str(boxes_t.shape()));
  XPURT_CHECK(
      scores_t.dim() == 3 && scores_t.shape()[0] == boxes_t.shape()[0] && scores_t.shape()[2] == boxes_t.shape()[1],
      ctx.where(), ": scores must be [num_batches, num_classes, spatial_dimension] matching boxes ",
      shape_str(boxes_t.shape()), ", got ", shape_str(scores_t.shape()));
  std::int64_t max_per_class = 0;
  if (ctx.has_input(2) && ctx.input(2).numel() > 0) {
    const std::string what = ctx.where() + " input 'max_output_boxes_per_class'";
    detail::check_one_element(ctx.input(2), what);
    max_per_class = read_ints(ctx.input(2), what)[0];
  }
  const double iou_threshold =
      ctx.has_input(3) && ctx.input(3).numel() > 0 ? read_scalar(ctx.input(3), ctx.where()) : 0.0;
  const bool has_score_threshold = ctx.has_input(4) && ctx.input(4).numel() > 0;
  const double score_threshold = has_score_threshold ? read_scalar(ctx.input(4), ctx.where()) : 0.0;
  const std::int64_t center = ctx.attr_int("center_point_box", 0);
  XPURT_CHECK(center == 0 || center == 1, ctx.where(), ": center_point_box must be 0 or 1, got ", center);
  const std::int64_t B = boxes_t.shape()[0], S = boxes_t.shape()[1], C = scores_t.shape()[1];
  const ScratchVector<double> boxes = load_values<double>(boxes_t), scores = load_values<double>(scores_t);
  // Corners (y1, x1, y2, x2) with y1 <= y2, x1 <= x2, per box.
  ScratchVector<double> corners(boxes.size());
  for (std::int64_t i = 0; i < B * S; ++i) {
    const double* b = boxes.data() + i * 4;
    double* c = corners.data() + i * 4;
    if (center == 0) {
      c[0] = std::min(b[0], b[2]);
      c[1] = std::min(b[1], b[3]);
      c[2] = std::max(b[0], b[2]);
      c[3] = std::max(b[1], b[3]);
    } else {
      // [x_center, y_center, width, height]
      c[0] = b[1] - b[3] / 2;
      c[1] = b[0] - b[2] / 2;
      c[2] = b[1] + b[3] / 2;
      c[3] = b[0] + b[2] / 2;
    }
  }
  auto iou = [&](const double* a, const double* b) {
    const double area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
    if (area_a <= 0 || area_b <= 0) return 0.0;
    const double ih = std::min(a[2], b[2]) - std::max(a[0], b[0]);
    const double iw = std::min(a[3], b[3]) - std::max(a[1], b[1]);
    if (ih <= 0 || iw <= 0) return 0.0;
    const double inter = ih * iw;
    return inter / (area_a + area_b - inter);
  };
  std::vector<std::int64_t> selected;  // triples
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t c = 0; c < C; ++c) {
      if (max_per_class <= 0) continue;
      const double* sc = scores.data() + (b * C + c) * S;
      std::vector<std::int64_t> order;
      for (std::int64_t i = 0; i < S; ++i) {
        if (!has_score_threshold || sc[i] > score_threshold) order.push_back(i);
      }
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t i, std::int64_t j) { return sc[i] > sc[j]; });
      std::vector<std::int64_t> kept;
      for (std::int64_t i : order) {
        if (static_cast<std::int64_t>(kept.size()) >= max_per_class) break;
        bool keep = true;
        for (std::int64_t k : kept) {
          if (iou(corners.data() + (b * S + i) * 4, corners.data() + (b * S + k) * 4) > iou_threshold) {
            keep = false;
            break;
          }
        }
        if (keep) {
          kept.push_back(i);
          selected.insert(selected.end(), {b, c, i});
        }
      }
    }
  }
  Tensor& Y = ctx.allocate_output(0, {static_cast<std::int64_t>(selected.size() / 3), 3}, DType::kInt64);
  std::copy(selected.begin(), selected.end(), data<std::int64_t>(Y));
}

// ---- MaxRoiPool (opset 1) ----

// Caffe's ROI pooling: each roi (batch, x1, y1, x2, y2) scaled and rounded to pixels, split into
// pooled_shape bins, the max of each bin (0 for an empty bin).
void max_roi_pool(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& R = ctx.input(1);
  check_float(ctx, X, "input 'X'");
  check_float(ctx, R, "input 'rois'");
  XPURT_CHECK(X.dim() == 4, ctx.where(), ": X must be [N, C, H, W], got ", shape_str(X.shape()));
  XPURT_CHECK(R.dim() == 2 && R.shape()[1] == 5, ctx.where(), ": rois must be [num_rois, 5], got ",
              shape_str(R.shape()));
  XPURT_CHECK(ctx.has_attr("pooled_shape"), ctx.where(), ": the pooled_shape attribute is required");
  const std::vector<std::int64_t> pooled = ctx.attr_ints("pooled_shape", {});
  XPURT_CHECK(pooled.size() == 2 && pooled[0] > 0 && pooled[1] > 0, ctx.where(),
              ": pooled_shape must be two positive values, got ", shape_str(pooled));
  const double scale = ctx.attr_float("spatial_scale", 1.0);
  const std::int64_t N = X.shape()[0], C = X.shape()[1], H = X.shape()[2], W = X.shape()[3];
  const std::int64_t num_rois = R.shape()[0], ph_n = pooled[0], pw_n = pooled[1];
  const ScratchVector<double> x = load_values<double>(X), rois = load_values<double>(R);
  ScratchVector<double> y(static_cast<std::size_t>(num_rois * C * ph_n * pw_n));
  for (std::int64_t r = 0; r < num_rois; ++r) {
    const double* roi = rois.data() + r * 5;
    // Checked as doubles first: converting one past int64's range (or NaN) to int64 is undefined.
    XPURT_CHECK(roi[0] > -1.0 && roi[0] < static_cast<double>(N), ctx.where(), ": batch index ", roi[0], " of roi ",
                r, " is outside [0, ", N, ")");  // truncated toward zero, as before
    const auto b = static_cast<std::int64_t>(roi[0]);
    for (int k = 1; k < 5; ++k) {
      XPURT_CHECK(std::fabs(roi[k] * scale) < 2147483648.0, ctx.where(), ": coordinate ", roi[k], " of roi ", r,
                  " times spatial_scale ", scale, " is not a pixel position (|value| < 2^31)");
    }
    const auto x1 = static_cast<std::int64_t>(std::round(roi[1] * scale));
    const auto y1 = static_cast<std::int64_t>(std::round(roi[2] * scale));
    const auto x2 = static_cast<std::int64_t>(std::round(roi[3] * scale));
    const auto y2 = static_cast<std::int64_t>(std::round(roi[4] * scale));
    const double bin_h = static_cast<double>(std::max<std::int64_t>(y2 - y1 + 1, 1)) / static_cast<double>(ph_n);
    const double bin_w = static_cast<double>(std::max<std::int64_t>(x2 - x1 + 1, 1)) / static_cast<double>(pw_n);
    for (std::int64_t c = 0; c < C; ++c) {
      const double* plane = x.data() + (b * C + c) * H * W;
      for (std::int64_t ph = 0; ph < ph_n; ++ph) {
        const std::int64_t hs =
            std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(static_cast<double>(ph) * bin_h)) + y1, 0, H);
        const std::int64_t he = std::clamp<std::int64_t>(
            static_cast<std::int64_t>(std::ceil(static_cast<double>(ph + 1) * bin_h)) + y1, 0, H);
        for (std::int64_t pw = 0; pw < pw_n; ++pw) {
          const std::int64_t ws = std::clamp<std::int64_t>(
              static_cast<std::int64_t>(std::floor(static_cast<double>(pw) * bin_w)) + x1, 0, W);
          const std::int64_t we = std::clamp<std::int64_t>(
              static_cast<std::int64_t>(std::ceil(static_cast<double>(pw + 1) * bin_w)) + x1, 0, W);
          double best = 0.0;
          if (he > hs && we > ws) {
            best = -std::numeric_limits<double>::infinity();
            for (std::int64_t hh = hs; hh < he; ++hh) {
              for (std::int64_t ww = ws; ww < we; ++ww) best = std::max(best, plane[hh * W + ww]);
            }
          }
          y[static_cast<std::size_t>(((r * C + c) * ph_n + ph) * pw_n + pw)] = best;
        }
      }
    }
  }
  store_values(ctx.allocate_output(0, {num_rois, C, ph_n, pw_n}, X.dtype()), y.data());
}

// ---- AffineGrid (opset 20) ----

// The sampling grid of GridSample for affine matrices theta [N, 2, 3] (2-D) or [N, 3, 4] (3-D): each output
// point's normalized base coordinates (x, y[, z], 1) times theta^T.
void affine_grid(OpContext& ctx) {
  const Tensor& theta_t = ctx.input(0);
  check_float(ctx, theta_t, "input 'theta'");
  const std::vector<std::int64_t> size = read_ints(ctx.input(1), ctx.where() + " input 'size'");
  XPURT_CHECK(size.size() == 4 || size.size() == 5, ctx.where(), ": size must be [N, C, H, W] or [N, C, D, H, W], got ",
              shape_str(size));
  const std::size_t rank = size.size() - 2;  // 2 or 3 spatial dims
  const std::int64_t N = size[0];
  const std::vector<std::int64_t> theta_shape{N, static_cast<std::int64_t>(rank), static_cast<std::int64_t>(rank + 1)};
  XPURT_CHECK(theta_t.shape() == theta_shape, ctx.where(), ": theta must be ", shape_str(theta_shape), " for size ",
              shape_str(size), ", got ", shape_str(theta_t.shape()));
  const bool align = ctx.attr_int("align_corners", 0) != 0;
  const ScratchVector<double> theta = load_values<double>(theta_t);
  // Spatial dims in (D,) H, W order; the output's last axis holds (x, y[, z]) = (W, H[, D]) coordinates.
  const std::vector<std::int64_t> sp(size.begin() + 2, size.end());
  auto base = [&](std::int64_t i, std::int64_t len) {
    if (len <= 1) return 0.0;
    const double di = static_cast<double>(i), dl = static_cast<double>(len);
    return align ? -1.0 + 2.0 * di / (dl - 1) : (2.0 * di + 1) / dl - 1.0;
  };
  std::vector<std::int64_t> out_shape{N};
  out_shape.insert(out_shape.end(), sp.begin(), sp.end());
  out_shape.push_back(static_cast<std::int64_t>(rank));
  ScratchVector<double> y(static_cast<std::size_t>(numel_of(out_shape)));
  std::int64_t o = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const double* th = theta.data() + n * static_cast<std::int64_t>(rank * (rank + 1));
    for_each_multi_index(sp, [&](const std::vector<std::int64_t>& idx) {
      ScratchVector<double> p(rank + 1, 1.0);
      for (std::size_t k = 0; k < rank; ++k) p[k] = base(idx[rank - 1 - k], sp[rank - 1 - k]);
      for (std::size_t r = 0; r < rank; ++r) {
        double v = 0;
        for (std::size_t k = 0; k <= rank; ++k) v += th[r * (rank + 1) + k] * p[k];
        y[static_cast<std::size_t>(o++)] = v;
      }
    });
  }
  store_values(ctx.allocate_output(0, out_shape, theta_t.dtype()), y.data());
}

}  // namespace

void register_nn_resize_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "Resize", resize);
  kernels.add("", "Upsample", upsample);
  kernels.add("", "GridSample", grid_sample);
  kernels.add("", "AffineGrid", affine_grid);
  kernels.add("", "RoiAlign", roi_align);
  kernels.add("", "MaxRoiPool", max_roi_pool);
  kernels.add("", "NonMaxSuppression", non_max_suppression);
}

}  // namespace xpuruntime::onnx_ref::nn
