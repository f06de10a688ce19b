// ONNX reference ops: Conv and ConvTranspose (1-D, 2-D, 3-D and beyond; groups, dilations, auto_pad), as im2col /
// col2im around the cpu backend's GEMM, plus Col2Im and DeformConv (2-D) on the same machinery. Float dtypes; Conv
// and ConvTranspose compute float16/bfloat16/float32 in float and float64 in double, Col2Im and DeformConv in
// double. See onnx_nn_common.h, Note [Spatial windows].
#include <algorithm>

#include "backends/cpu/onnx/onnx_nn_common.h"

namespace xpuruntime::onnx_ref::nn {
namespace {

// For one spatial layout: for each dim d, the input coordinate of (kernel offset kd, output position od), or -1
// when it falls in the padding. Shared by im2col (Conv) and col2im (ConvTranspose, with in/out swapped).
struct Taps {
  std::vector<std::vector<std::int64_t>> coord;  // [d][kd * out_d + od]
};

Taps make_taps(const Window& w, const std::vector<std::int64_t>& in, const std::vector<std::int64_t>& out) {
  Taps t;
  t.coord.resize(w.rank());
  for (std::size_t d = 0; d < w.rank(); ++d) {
    t.coord[d].resize(static_cast<std::size_t>(w.kernel[d] * out[d]));
    for (std::int64_t k = 0; k < w.kernel[d]; ++k) {
      for (std::int64_t o = 0; o < out[d]; ++o) {
        const std::int64_t i = o * w.strides[d] - w.pads_begin[d] + k * w.dilations[d];
        t.coord[d][static_cast<std::size_t>(k * out[d] + o)] = (i >= 0 && i < in[d]) ? i : -1;
      }
    }
  }
  return t;
}

// Calls fn(col_row, col_index, in_offset) for every (kernel position, output position) of one channel whose
// input position is inside the input (in_offset relative to the channel's first element), in row-major order of
// (kernel multi-index, output multi-index).
template <typename Fn>
void for_each_tap(const Window& w, const Taps& taps, const std::vector<std::int64_t>& in,
                  const std::vector<std::int64_t>& out, Fn&& fn) {
  const std::size_t rank = w.rank();
  std::vector<std::int64_t> in_strides(rank, 1);
  for (std::size_t d = rank; d-- > 1;) in_strides[d - 1] = in_strides[d] * in[d];
  std::int64_t row = 0;
  for_each_multi_index(w.kernel, [&](const std::vector<std::int64_t>& kidx) {
    if (rank == 2) {
      // The common 2-D case without the generic index loop.
      const std::int64_t* c0 = taps.coord[0].data() + kidx[0] * out[0];
      const std::int64_t* c1 = taps.coord[1].data() + kidx[1] * out[1];
      for (std::int64_t o0 = 0; o0 < out[0]; ++o0) {
        if (c0[o0] < 0) continue;
        const std::int64_t base = c0[o0] * in[1];
        for (std::int64_t o1 = 0; o1 < out[1]; ++o1) {
          if (c1[o1] >= 0) fn(row, o0 * out[1] + o1, base + c1[o1]);
        }
      }
    } else {
      std::int64_t col = 0;
      for_each_multi_index(out, [&](const std::vector<std::int64_t>& oidx) {
        std::int64_t off = 0;
        bool inside = true;
        for (std::size_t d = 0; d < rank; ++d) {
          const std::int64_t c = taps.coord[d][static_cast<std::size_t>(kidx[d] * out[d] + oidx[d])];
          if (c < 0) {
            inside = false;
            break;
          }
          off += c * in_strides[d];
        }
        if (inside) fn(row, col, off);
        ++col;
      });
    }
    ++row;
  });
}

std::int64_t product_of(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (std::int64_t x : v) p *= x;
  return p;
}

template <typename C>
void conv_compute(OpContext& ctx, const Window& w, std::int64_t group, const std::vector<std::int64_t>& in_sp,
                  const std::vector<std::int64_t>& out_sp, Tensor& Y) {
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const std::int64_t N = X.shape()[0], Cin = X.shape()[1], M = W.shape()[0];
  const std::int64_t Cg = Cin / group, Mg = M / group;
  const std::int64_t in_size = product_of(in_sp), out_size = product_of(out_sp), ksize = product_of(w.kernel);
  const ScratchVector<C> x = load_values<C>(X);
  const ScratchVector<C> wt = load_values<C>(W);
  ScratchVector<C> bias;
  if (ctx.has_input(2)) {
    bias = load_values<C>(ctx.input(2));
    XPURT_CHECK(static_cast<std::int64_t>(bias.size()) == M, ctx.where(), ": bias B must have ", M,
                " values (one per output channel), got ", bias.size());
  }
  ScratchVector<C> y(static_cast<std::size_t>(N * M * out_size));
  const Taps taps = make_taps(w, in_sp, out_sp);
  // A 1x1 kernel with unit strides and no pads reads the input as it is: no im2col copy.
  bool direct = true;
  for (std::size_t d = 0; d < w.rank(); ++d) {
    direct = direct && w.kernel[d] == 1 && w.strides[d] == 1 && w.pads_begin[d] == 0 && in_sp[d] == out_sp[d];
  }
  ScratchVector<C> col(direct ? 0 : static_cast<std::size_t>(Cg * ksize * out_size));
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t g = 0; g < group; ++g) {
      const C* xg = x.data() + (n * Cin + g * Cg) * in_size;
      const C* b = xg;
      if (!direct) {
        std::fill(col.begin(), col.end(), C(0));
        for (std::int64_t c = 0; c < Cg; ++c) {
          const C* xc = xg + c * in_size;
          C* colc = col.data() + c * ksize * out_size;
          for_each_tap(w, taps, in_sp, out_sp,
                       [&](std::int64_t row, std::int64_t o, std::int64_t off) { colc[row * out_size + o] = xc[off]; });
        }
        b = col.data();
      }
      C* yg = y.data() + (n * M + g * Mg) * out_size;
      nn_gemm<C>(false, Mg, out_size, Cg * ksize, wt.data() + g * Mg * Cg * ksize, Cg * ksize, b, out_size, yg,
                 out_size);
      if (!bias.empty()) {
        for (std::int64_t m = 0; m < Mg; ++m) {
          const C bv = bias[static_cast<std::size_t>(g * Mg + m)];
          for (std::int64_t o = 0; o < out_size; ++o) yg[m * out_size + o] += bv;
        }
      }
    }
  }
  store_values(Y, y.data());
}

// The checks Conv and ConvTranspose make of X [N, C, spatial...] and W (float, same dtype, same rank); returns
// the number of spatial dimensions.
std::size_t check_conv_operands(const OpContext& ctx, const Tensor& X, const Tensor& W) {
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK_TYPE(W.dtype() == X.dtype(), ctx.where(), ": W must have X's dtype ", dtype_name(X.dtype()), ", got ",
                   dtype_name(W.dtype()));
  XPURT_CHECK(X.dim() >= 3, ctx.where(), ": X must be [N, C, spatial...], got ", shape_str(X.shape()));
  XPURT_CHECK(W.dim() == X.dim(), ctx.where(), ": W must have X's rank ", X.dim(), ", got ", shape_str(W.shape()));
  const std::size_t rank = static_cast<std::size_t>(X.dim()) - 2;
  return rank;
}

void conv(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const std::size_t rank = check_conv_operands(ctx, X, W);
  const std::int64_t group = ctx.attr_int("group", 1);
  const std::int64_t Cin = X.shape()[1], M = W.shape()[0];
  XPURT_CHECK(group > 0 && Cin % group == 0 && M % group == 0, ctx.where(), ": group ", group,
              " must divide the input channels (", Cin, ") and the output channels (", M, ")");
  XPURT_CHECK(W.shape()[1] * group == Cin, ctx.where(), ": W ", shape_str(W.shape()), " expects ", W.shape()[1] * group,
              " input channels (W.shape[1] * group), X ", shape_str(X.shape()), " has ", Cin);
  const std::vector<std::int64_t> wk(W.shape().begin() + 2, W.shape().end());
  Window w = read_window(ctx, rank, wk);
  XPURT_CHECK(w.kernel == wk, ctx.where(), ": kernel_shape ", shape_str(w.kernel), " differs from W's spatial dims ",
              shape_str(wk));
  const std::vector<std::int64_t> in_sp(X.shape().begin() + 2, X.shape().end());
  apply_auto_pad(ctx, in_sp, w);
  std::vector<std::int64_t> out_sp(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    const std::int64_t span = window_span(ctx, w, d, in_sp[d]);
    XPURT_CHECK(span >= 0, ctx.where(), ": the kernel (", shape_str(w.kernel), ", dilations ", shape_str(w.dilations),
                ") is larger than the padded input ", shape_str(X.shape()));
    out_sp[d] = span / w.strides[d] + 1;
  }
  std::vector<std::int64_t> out_shape{X.shape()[0], M};
  out_shape.insert(out_shape.end(), out_sp.begin(), out_sp.end());
  Tensor& Y = ctx.allocate_output(0, out_shape, X.dtype());
  if (Y.numel() == 0) return;
  if (X.dtype() == DType::kFloat64) {
    conv_compute<double>(ctx, w, group, in_sp, out_sp, Y);
  } else {
    conv_compute<float>(ctx, w, group, in_sp, out_sp, Y);
  }
}

// ---- ConvTranspose ----

template <typename C>
void conv_transpose_compute(OpContext& ctx, const Window& w, std::int64_t group, const std::vector<std::int64_t>& in_sp,
                            const std::vector<std::int64_t>& out_sp, Tensor& Y) {
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const std::int64_t N = X.shape()[0], Cin = X.shape()[1], Mg = W.shape()[1], M = Mg * group;
  const std::int64_t Cg = Cin / group;
  const std::int64_t in_size = product_of(in_sp), out_size = product_of(out_sp), ksize = product_of(w.kernel);
  const ScratchVector<C> x = load_values<C>(X);
  const ScratchVector<C> wt = load_values<C>(W);
  ScratchVector<C> bias;
  if (ctx.has_input(2)) {
    bias = load_values<C>(ctx.input(2));
    XPURT_CHECK(static_cast<std::int64_t>(bias.size()) == M, ctx.where(), ": bias B must have ", M,
                " values (one per output channel), got ", bias.size());
  }
  // W_g is [Cg, Mg * ksize]; the GEMM wants its transpose [Mg * ksize, Cg].
  ScratchVector<C> wtt(wt.size());
  for (std::int64_t g = 0; g < group; ++g) {
    const C* src = wt.data() + g * Cg * Mg * ksize;
    C* dst = wtt.data() + g * Cg * Mg * ksize;
    for (std::int64_t c = 0; c < Cg; ++c) {
      for (std::int64_t r = 0; r < Mg * ksize; ++r) dst[r * Cg + c] = src[c * Mg * ksize + r];
    }
  }
  ScratchVector<C> y(static_cast<std::size_t>(N * M * out_size), C(0));
  ScratchVector<C> col(static_cast<std::size_t>(Mg * ksize * in_size));
  // The output position o of input position i and kernel offset k is o = i * s - pad_begin + k * r: the taps of
  // a convolution of the output (as "input") producing the input positions (as "output").
  const Taps taps = make_taps(w, out_sp, in_sp);
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t g = 0; g < group; ++g) {
      nn_gemm<C>(false, Mg * ksize, in_size, Cg, wtt.data() + g * Cg * Mg * ksize, Cg,
                 x.data() + (n * Cin + g * Cg) * in_size, in_size, col.data(), in_size);
      for (std::int64_t m = 0; m < Mg; ++m) {
        C* ym = y.data() + (n * M + g * Mg + m) * out_size;
        const C* colm = col.data() + m * ksize * in_size;
        for_each_tap(w, taps, out_sp, in_sp,
                     [&](std::int64_t row, std::int64_t i, std::int64_t off) { ym[off] += colm[row * in_size + i]; });
      }
    }
  }
  if (!bias.empty()) {
    for (std::int64_t n = 0; n < N; ++n) {
      for (std::int64_t m = 0; m < M; ++m) {
        C* ym = y.data() + (n * M + m) * out_size;
        for (std::int64_t o = 0; o < out_size; ++o) ym[o] += bias[static_cast<std::size_t>(m)];
      }
    }
  }
  store_values(Y, y.data());
}

void conv_transpose(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const std::size_t rank = check_conv_operands(ctx, X, W);
  const std::int64_t group = ctx.attr_int("group", 1);
  const std::int64_t Cin = X.shape()[1];
  XPURT_CHECK(group > 0 && Cin % group == 0, ctx.where(), ": group ", group, " must divide the input channels (", Cin,
              ")");
  XPURT_CHECK(W.shape()[0] == Cin, ctx.where(), ": W ", shape_str(W.shape()), " must have ", Cin,
              " rows (the input channels of X ", shape_str(X.shape()), ")");
  const std::vector<std::int64_t> wk(W.shape().begin() + 2, W.shape().end());
  Window w = read_window(ctx, rank, wk);
  XPURT_CHECK(w.kernel == wk, ctx.where(), ": kernel_shape ", shape_str(w.kernel), " differs from W's spatial dims ",
              shape_str(wk));
  const std::vector<std::int64_t> in_sp(X.shape().begin() + 2, X.shape().end());
  const std::vector<std::int64_t> output_padding = ctx.attr_ints("output_padding", std::vector<std::int64_t>(rank, 0));
  XPURT_CHECK(output_padding.size() == rank, ctx.where(), ": output_padding ", shape_str(output_padding), " must have ",
              rank, " values");
  std::vector<std::int64_t> output_shape = ctx.attr_ints("output_shape", {});
  if (output_shape.size() == rank + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
  XPURT_CHECK(output_shape.empty() || output_shape.size() == rank, ctx.where(), ": output_shape ",
              shape_str(output_shape), " must have ", rank, " values");
  for (std::size_t d = 0; d < rank; ++d) {
    XPURT_CHECK(output_padding[d] >= 0 && (output_shape.empty() || output_shape[d] >= 0), ctx.where(),
                ": output_padding ", shape_str(output_padding), " and output_shape ", shape_str(output_shape),
                " must be >= 0");
  }
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  XPURT_CHECK(auto_pad == "NOTSET" || auto_pad == "VALID" || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER",
              ctx.where(), ": auto_pad '", auto_pad, "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  std::vector<std::int64_t> out_sp(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    const std::int64_t natural = geometry_add(
        ctx, geometry_add(ctx, geometry_mul(ctx, w.strides[d], in_sp[d] - 1), output_padding[d]),
        geometry_add(ctx, geometry_mul(ctx, w.kernel[d] - 1, w.dilations[d]), 1));
    if (!output_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const std::int64_t target = !output_shape.empty() ? output_shape[d] : geometry_mul(ctx, in_sp[d], w.strides[d]);
      const std::int64_t total = geometry_add(ctx, natural, -target);  // target >= 0
      // Floor division (the spec's pseudocode is Python): a negative total (output_shape larger than the
      // natural size) extends the output at the end.
      const std::int64_t half = total / 2 - (total < 0 && total % 2 != 0 ? 1 : 0);
      w.pads_begin[d] = auto_pad == "SAME_UPPER" ? half : total - half;
      w.pads_end[d] = total - w.pads_begin[d];
      out_sp[d] = target;
    } else {
      if (auto_pad == "VALID") w.pads_begin[d] = w.pads_end[d] = 0;
      out_sp[d] = natural - w.pads_begin[d] - w.pads_end[d];
    }
  }
  std::vector<std::int64_t> out_shape{X.shape()[0], W.shape()[1] * group};
  out_shape.insert(out_shape.end(), out_sp.begin(), out_sp.end());
  Tensor& Y = ctx.allocate_output(0, out_shape, X.dtype());
  if (Y.numel() == 0) return;
  if (X.dtype() == DType::kFloat64) {
    conv_transpose_compute<double>(ctx, w, group, in_sp, out_sp, Y);
  } else {
    conv_transpose_compute<float>(ctx, w, group, in_sp, out_sp, Y);
  }
}

// ---- Col2Im (opset 18) ----

// The adjoint of im2col: input [N, C * prod(block), L] with L the number of block positions, summed back into an
// image [N, C, image_shape...].
void col2im(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'input'");
  const std::vector<std::int64_t> image = read_ints(ctx.input(1), ctx.where() + " input 'image_shape'");
  const std::vector<std::int64_t> block = read_ints(ctx.input(2), ctx.where() + " input 'block_shape'");
  const std::size_t rank = image.size();
  XPURT_CHECK(rank > 0 && block.size() == rank, ctx.where(), ": image_shape ", shape_str(image), " and block_shape ",
              shape_str(block), " must have the same non-zero length");
  XPURT_CHECK(X.dim() == 3, ctx.where(), ": input must be [N, C * prod(block_shape), L], got ", shape_str(X.shape()));
  for (std::int64_t b : block) XPURT_CHECK(b > 0, ctx.where(), ": block_shape must be > 0, got ", shape_str(block));
  Window w = read_window(ctx, rank, block);
  XPURT_CHECK(w.kernel == block, ctx.where(), ": kernel_shape is not an attribute of Col2Im");
  const std::int64_t ksize = product_of(block);
  XPURT_CHECK(X.shape()[1] % ksize == 0, ctx.where(), ": dimension 1 of the input (", X.shape()[1],
              ") must be a multiple of prod(block_shape) = ", ksize);
  std::vector<std::int64_t> blocks(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    const std::int64_t span = window_span(ctx, w, d, image[d]);  // w.kernel == block
    XPURT_CHECK(span >= 0, ctx.where(), ": the block ", shape_str(block), " does not fit the padded image ",
                shape_str(image));
    blocks[d] = span / w.strides[d] + 1;
  }
  const std::int64_t L = product_of(blocks);
  XPURT_CHECK(X.shape()[2] == L, ctx.where(), ": input has ", X.shape()[2], " block positions, image_shape ",
              shape_str(image), " with these pads/strides/dilations gives ", L);
  const std::int64_t N = X.shape()[0], C = X.shape()[1] / ksize, image_size = product_of(image);
  std::vector<std::int64_t> out_shape{N, C};
  out_shape.insert(out_shape.end(), image.begin(), image.end());
  Tensor& Y = ctx.allocate_output(0, out_shape, X.dtype());
  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(static_cast<std::size_t>(N * C * image_size), 0.0);
  const Taps taps = make_taps(w, image, blocks);
  for (std::int64_t nc = 0; nc < N * C; ++nc) {
    const double* col = x.data() + nc * ksize * L;
    double* img = y.data() + nc * image_size;
    for_each_tap(w, taps, image, blocks,
                 [&](std::int64_t row, std::int64_t o, std::int64_t off) { img[off] += col[row * L + o]; });
  }
  store_values(Y, y.data());
}

// ---- DeformConv (opset 19) ----

// Bilinear sample of a [H, W] plane at (y, x); corners outside the plane read 0 and a point farther than one
// pixel outside reads 0 (torchvision's deform_conv2d, which ONNX's definition follows).
double deform_sample(const double* plane, std::int64_t H, std::int64_t W, double y, double x) {
  if (y <= -1 || y >= static_cast<double>(H) || x <= -1 || x >= static_cast<double>(W)) return 0.0;
  const double fy = std::floor(y), fx = std::floor(x);
  const auto y0 = static_cast<std::int64_t>(fy), x0 = static_cast<std::int64_t>(fx);
  const double ly = y - fy, lx = x - fx;
  auto at = [&](std::int64_t yy, std::int64_t xx) {
    return (yy >= 0 && yy < H && xx >= 0 && xx < W) ? plane[yy * W + xx] : 0.0;
  };
  return (1 - ly) * (1 - lx) * at(y0, x0) + (1 - ly) * lx * at(y0, x0 + 1) + ly * (1 - lx) * at(y0 + 1, x0) +
         ly * lx * at(y0 + 1, x0 + 1);
}

void deform_conv(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  const Tensor& Wt = ctx.input(1);
  const Tensor& offset_t = ctx.input(2);
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK(X.dim() == 4 && Wt.dim() == 4, ctx.where(), ": X and W must be 4-D (2-D deformable convolution), got ",
              shape_str(X.shape()), " and ", shape_str(Wt.shape()));
  const std::int64_t N = X.shape()[0], C = X.shape()[1], H = X.shape()[2], Wd = X.shape()[3], M = Wt.shape()[0];
  const std::int64_t group = ctx.attr_int("group", 1), offset_group = ctx.attr_int("offset_group", 1);
  XPURT_CHECK(group > 0 && C % group == 0 && M % group == 0 && Wt.shape()[1] * group == C, ctx.where(), ": group ",
              group, " does not fit X ", shape_str(X.shape()), " and W ", shape_str(Wt.shape()));
  XPURT_CHECK(offset_group > 0 && C % offset_group == 0, ctx.where(), ": offset_group ", offset_group,
              " must divide the channels ", C);
  const std::vector<std::int64_t> wk(Wt.shape().begin() + 2, Wt.shape().end());
  const Window w = read_window(ctx, 2, wk);
  XPURT_CHECK(w.kernel == wk, ctx.where(), ": kernel_shape ", shape_str(w.kernel), " differs from W's spatial dims ",
              shape_str(wk));
  const std::int64_t kh = wk[0], kw = wk[1], K = kh * kw;
  const std::int64_t span_h = window_span(ctx, w, 0, H), span_w = window_span(ctx, w, 1, Wd);
  const std::int64_t oh = span_h / w.strides[0] + 1, ow = span_w / w.strides[1] + 1;
  XPURT_CHECK(span_h >= 0 && span_w >= 0, ctx.where(), ": the kernel is larger than the padded input ",
              shape_str(X.shape()));
  const std::vector<std::int64_t> offset_shape{N, offset_group * 2 * K, oh, ow};
  XPURT_CHECK(offset_t.shape() == offset_shape, ctx.where(), ": offset must be ", shape_str(offset_shape), ", got ",
              shape_str(offset_t.shape()));
  const bool has_mask = ctx.has_input(4);
  if (has_mask) {
    const std::vector<std::int64_t> mask_shape{N, offset_group * K, oh, ow};
    XPURT_CHECK(ctx.input(4).shape() == mask_shape, ctx.where(), ": mask must be ", shape_str(mask_shape), ", got ",
                shape_str(ctx.input(4).shape()));
  }
  const ScratchVector<double> x = load_values<double>(X), wt = load_values<double>(Wt);
  const ScratchVector<double> off = load_values<double>(offset_t);
  const ScratchVector<double> mask = has_mask ? load_values<double>(ctx.input(4)) : ScratchVector<double>{};
  ScratchVector<double> bias(static_cast<std::size_t>(M), 0.0);
  if (ctx.has_input(3)) {
    bias = load_values<double>(ctx.input(3));
    XPURT_CHECK(static_cast<std::int64_t>(bias.size()) == M, ctx.where(), ": B must have ", M, " values");
  }
  const std::int64_t Cg = C / group, Mg = M / group, out_size = oh * ow, cpo = C / offset_group;
  ScratchVector<double> col(static_cast<std::size_t>(C * K * out_size));
  ScratchVector<double> y(static_cast<std::size_t>(N * M * out_size));
  for (std::int64_t n = 0; n < N; ++n) {
    // col[(c, i, j), (p, q)] = mask * X[c] sampled at the offset kernel position.
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t og = c / cpo;
      const double* plane = x.data() + (n * C + c) * H * Wd;
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int64_t i = k / kw, j = k % kw;
        const double* dy = off.data() + ((n * offset_group + og) * 2 * K + 2 * k) * out_size;
        const double* dx = dy + out_size;
        const double* mk = has_mask ? mask.data() + ((n * offset_group + og) * K + k) * out_size : nullptr;
        double* colr = col.data() + (c * K + k) * out_size;
        for (std::int64_t p = 0; p < oh; ++p) {
          for (std::int64_t q = 0; q < ow; ++q) {
            const std::int64_t o = p * ow + q;
            const double yy = static_cast<double>(p * w.strides[0] - w.pads_begin[0] + i * w.dilations[0]) + dy[o];
            const double xx = static_cast<double>(q * w.strides[1] - w.pads_begin[1] + j * w.dilations[1]) + dx[o];
            colr[o] = deform_sample(plane, H, Wd, yy, xx) * (mk ? mk[o] : 1.0);
          }
        }
      }
    }
    for (std::int64_t g = 0; g < group; ++g) {
      double* yg = y.data() + (n * M + g * Mg) * out_size;
      nn_gemm<double>(false, Mg, out_size, Cg * K, wt.data() + g * Mg * Cg * K, Cg * K,
                      col.data() + g * Cg * K * out_size, out_size, yg, out_size);
      for (std::int64_t m = 0; m < Mg; ++m) {
        for (std::int64_t o = 0; o < out_size; ++o) yg[m * out_size + o] += bias[static_cast<std::size_t>(g * Mg + m)];
      }
    }
  }
  store_values(ctx.allocate_output(0, {N, M, oh, ow}, X.dtype()), y.data());
}

}  // namespace

void register_nn_conv_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "Conv", conv);
  kernels.add("", "ConvTranspose", conv_transpose);
  kernels.add("", "Col2Im", col2im);
  kernels.add("", "DeformConv", deform_conv);
}

}  // namespace xpuruntime::onnx_ref::nn
