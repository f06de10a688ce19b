// ONNX reference ops: RNN, GRU and LSTM (forward, reverse, bidirectional; sequence_lens; initial states;
// peepholes; linear_before_reset; clip; input_forget; custom activations with alpha/beta; layout 0 and 1).
// Computed in double.
#include <algorithm>
#include <cctype>

#include "backends/cpu/onnx/onnx_nn_common.h"

namespace xpuruntime::onnx_ref::nn {
namespace {

enum class Cell { kRnn, kGru, kLstm };

struct Activation {
  std::string name;  // lower case
  double alpha = 0, beta = 0;
  double operator()(double x) const {
    if (name == "sigmoid") return 1 / (1 + std::exp(-x));
    if (name == "tanh") return std::tanh(x);
    if (name == "relu") return std::max(x, 0.0);
    if (name == "affine") return alpha * x + beta;
    if (name == "leakyrelu") return x >= 0 ? x : alpha * x;
    if (name == "thresholdedrelu") return x > alpha ? x : 0.0;
    if (name == "scaledtanh") return alpha * std::tanh(beta * x);
    if (name == "hardsigmoid") return std::clamp(alpha * x + beta, 0.0, 1.0);
    if (name == "elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
    if (name == "softsign") return x / (1 + std::fabs(x));
    if (name == "softplus") return std::log1p(std::exp(-std::fabs(x))) + std::max(x, 0.0);
    return x;  // names are validated when parsed
  }
};

// The activations of all directions (num_directions * per_direction of them), with alpha/beta taken in order from
// activation_alpha / activation_beta by the functions that use them, and ONNX Runtime's defaults otherwise.
std::vector<Activation> read_activations(const OpContext& ctx, const std::vector<std::string>& defaults,
                                         std::int64_t num_directions) {
  std::vector<std::string> names;
  auto it = ctx.node().string_list_attrs.find("activations");
  if (it != ctx.node().string_list_attrs.end() && !it->second.empty()) {
    names = it->second;
  } else {
    for (std::int64_t d = 0; d < num_directions; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  }
  XPURT_CHECK(names.size() == defaults.size() * static_cast<std::size_t>(num_directions), ctx.where(),
              ": activations must list ", defaults.size() * static_cast<std::size_t>(num_directions), " functions (",
              defaults.size(), " per direction), got ", names.size());
  const std::vector<double> alphas = ctx.attr_floats("activation_alpha", {});
  const std::vector<double> betas = ctx.attr_floats("activation_beta", {});
  std::size_t ai = 0, bi = 0;
  std::vector<Activation> out;
  for (const std::string& raw : names) {
    Activation a;
    for (char ch : raw) a.name += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    double def_alpha = 0, def_beta = 0;
    bool uses_alpha = true, uses_beta = false;
    if (a.name == "affine") {
      def_alpha = 1.0;
      uses_beta = true;
    } else if (a.name == "leakyrelu") {
      def_alpha = 0.01;
    } else if (a.name == "thresholdedrelu" || a.name == "elu") {
      def_alpha = 1.0;
    } else if (a.name == "scaledtanh") {
      def_alpha = 1.0;
      def_beta = 1.0;
      uses_beta = true;
    } else if (a.name == "hardsigmoid") {
      def_alpha = 0.2;
      def_beta = 0.5;
      uses_beta = true;
    } else if (a.name == "sigmoid" || a.name == "tanh" || a.name == "relu" || a.name == "softsign" ||
               a.name == "softplus") {
      uses_alpha = false;
    } else {
      throw UnsupportedOperationError(detail::str_cat(ctx.where(), ": activation '", raw, "' is not supported"));
    }
    a.alpha = uses_alpha && ai < alphas.size() ? alphas[ai++] : def_alpha;
    a.beta = uses_beta && bi < betas.size() ? betas[bi++] : def_beta;
    out.push_back(a);
  }
  return out;
}

void run_recurrent(OpContext& ctx, Cell cell) {
  const std::int64_t G = cell == Cell::kRnn ? 1 : cell == Cell::kGru ? 3 : 4;
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  const Tensor& W = ctx.input(1);
  const Tensor& R = ctx.input(2);
  XPURT_CHECK(X.dim() == 3, ctx.where(), ": X must be 3-D, got ", shape_str(X.shape()));
  const std::int64_t layout = ctx.attr_int("layout", 0);
  XPURT_CHECK(layout == 0 || layout == 1, ctx.where(), ": layout must be 0 or 1, got ", layout);
  const std::int64_t T = layout == 0 ? X.shape()[0] : X.shape()[1];
  const std::int64_t Bn = layout == 0 ? X.shape()[1] : X.shape()[0];
  const std::int64_t I = X.shape()[2];
  const std::string direction = ctx.attr_string("direction", "forward");
  XPURT_CHECK(direction == "forward" || direction == "reverse" || direction == "bidirectional", ctx.where(),
              ": direction '", direction, "' is not one of forward, reverse, bidirectional");
  const std::int64_t D = direction == "bidirectional" ? 2 : 1;
  XPURT_CHECK(R.dim() == 3, ctx.where(), ": R must be [num_directions, ", G, "*hidden_size, hidden_size], got ",
              shape_str(R.shape()));
  const std::int64_t H = ctx.attr_int("hidden_size", R.shape()[2]);
  XPURT_CHECK(W.shape() == (std::vector<std::int64_t>{D, G * H, I}), ctx.where(), ": W must be [", D, ",", G * H, ",",
              I, "], got ", shape_str(W.shape()));
  XPURT_CHECK(R.shape() == (std::vector<std::int64_t>{D, G * H, H}), ctx.where(), ": R must be [", D, ",", G * H, ",",
              H, "], got ", shape_str(R.shape()));
  const ScratchVector<double> x = load_values<double>(X), w = load_values<double>(W), r = load_values<double>(R);
  ScratchVector<double> bias(static_cast<std::size_t>(D * 2 * G * H), 0.0);
  if (ctx.has_input(3)) {
    XPURT_CHECK(ctx.input(3).shape() == (std::vector<std::int64_t>{D, 2 * G * H}), ctx.where(), ": B must be [", D, ",",
                2 * G * H, "], got ", shape_str(ctx.input(3).shape()));
    bias = load_values<double>(ctx.input(3));
  }
  std::vector<std::int64_t> lens(static_cast<std::size_t>(Bn), T);
  if (ctx.has_input(4)) {
    lens = read_ints(ctx.input(4), ctx.where() + " input 'sequence_lens'");
    XPURT_CHECK(static_cast<std::int64_t>(lens.size()) == Bn, ctx.where(), ": sequence_lens must have ", Bn,
                " values, got ", lens.size());
    for (std::int64_t l : lens) {
      XPURT_CHECK(l >= 0 && l <= T, ctx.where(), ": sequence_lens values must be in [0, ", T, "], got ", l);
    }
  }
  // State tensors [D, B, H] (layout 0) or [B, D, H] (layout 1) -> internal [D, B, H].
  auto read_state = [&](std::size_t i, const char* name) {
    ScratchVector<double> s(static_cast<std::size_t>(D * Bn * H), 0.0);
    if (!ctx.has_input(i)) return s;
    const Tensor& t = ctx.input(i);
    const std::vector<std::int64_t> expect =
        layout == 0 ? std::vector<std::int64_t>{D, Bn, H} : std::vector<std::int64_t>{Bn, D, H};
    XPURT_CHECK(t.shape() == expect, ctx.where(), ": ", name, " must be ", shape_str(expect), ", got ",
                shape_str(t.shape()));
    const ScratchVector<double> v = load_values<double>(t);
    for (std::int64_t d = 0; d < D; ++d) {
      for (std::int64_t b = 0; b < Bn; ++b) {
        const std::int64_t src = layout == 0 ? (d * Bn + b) * H : (b * D + d) * H;
        std::copy_n(v.begin() + src, H, s.begin() + (d * Bn + b) * H);
      }
    }
    return s;
  };
  ScratchVector<double> h_state = read_state(5, "initial_h");
  ScratchVector<double> c_state = cell == Cell::kLstm ? read_state(6, "initial_c") : ScratchVector<double>{};
  ScratchVector<double> peep(static_cast<std::size_t>(D * 3 * H), 0.0);
  if (cell == Cell::kLstm && ctx.has_input(7)) {
    XPURT_CHECK(ctx.input(7).shape() == (std::vector<std::int64_t>{D, 3 * H}), ctx.where(), ": P must be [", D, ",",
                3 * H, "], got ", shape_str(ctx.input(7).shape()));
    peep = load_values<double>(ctx.input(7));
  }
  const std::vector<std::string> defaults = cell == Cell::kRnn   ? std::vector<std::string>{"Tanh"}
                                            : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                                 : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  const std::vector<Activation> acts = read_activations(ctx, defaults, D);
  const bool has_clip = ctx.has_attr("clip");
  const double clip = ctx.attr_float("clip", 0.0);
  const bool linear_before_reset = cell == Cell::kGru && ctx.attr_int("linear_before_reset", 0) != 0;
  const bool input_forget = cell == Cell::kLstm && ctx.attr_int("input_forget", 0) != 0;
  auto clipped = [&](double v) { return has_clip ? std::clamp(v, -clip, clip) : v; };

  // Y internal [T, D, B, H]. The input projections of all steps are one GEMM per direction; each step then
  // multiplies every batch row's hidden state by R at once (rows past their sequence length are computed but
  // not used).
  ScratchVector<double> y(static_cast<std::size_t>(T * D * Bn * H), 0.0);
  const std::int64_t GH = G * H;
  ScratchVector<double> xw(static_cast<std::size_t>(T * Bn * GH)), hr(static_cast<std::size_t>(Bn * GH));
  ScratchVector<double> rh(static_cast<std::size_t>(Bn * H)), rhr(static_cast<std::size_t>(Bn * H));
  ScratchVector<double> z(static_cast<std::size_t>(H)), rg(static_cast<std::size_t>(Bn * H));
  ScratchVector<double> hn(static_cast<std::size_t>(H));
  auto at = [](ScratchVector<double>& v, std::int64_t i) -> double& { return v[static_cast<std::size_t>(i)]; };
  for (std::int64_t d = 0; d < D; ++d) {
    const bool reverse = direction == "reverse" || d == 1;
    const double* wd = w.data() + d * GH * I;
    const double* rd = r.data() + d * GH * H;
    const double* wb = bias.data() + d * 2 * GH;
    const double* rb = wb + GH;
    const double* pd = peep.data() + d * 3 * H;
    const Activation* f = acts.data() + d * static_cast<std::int64_t>(defaults.size());
    // xw rows follow X's rows: (t, b) for layout 0, (b, t) for layout 1.
    nn_gemm<double>(true, T * Bn, GH, I, x.data(), I, wd, I, xw.data(), GH);
    for (std::int64_t row = 0; row < T * Bn; ++row) {
      for (std::int64_t g = 0; g < GH; ++g) at(xw, row * GH + g) += wb[g];
    }
    double* hd = h_state.data() + d * Bn * H;
    double* cd = cell == Cell::kLstm ? c_state.data() + d * Bn * H : nullptr;
    for (std::int64_t step = 0; step < T; ++step) {
      // hr = h R^T + Rb for every batch row.
      nn_gemm<double>(true, Bn, GH, H, hd, H, rd, H, hr.data(), GH);
      for (std::int64_t b = 0; b < Bn; ++b) {
        for (std::int64_t g = 0; g < GH; ++g) at(hr, b * GH + g) += rb[g];
      }
      if (cell == Cell::kGru && !linear_before_reset) {
        // The candidate gate needs (r * h) R_h^T: r first, then one more GEMM.
        for (std::int64_t b = 0; b < Bn; ++b) {
          const std::int64_t len = lens[static_cast<std::size_t>(b)];
          const std::int64_t t = step < len ? (reverse ? len - 1 - step : step) : 0;
          const double* xg = xw.data() + (layout == 0 ? t * Bn + b : b * T + t) * GH;
          for (std::int64_t j = 0; j < H; ++j) {
            at(rg, b * H + j) = f[0](clipped(xg[H + j] + at(hr, b * GH + H + j)));
            at(rh, b * H + j) = at(rg, b * H + j) * hd[b * H + j];
          }
        }
        nn_gemm<double>(true, Bn, H, H, rh.data(), H, rd + 2 * H * H, H, rhr.data(), H);
      }
      for (std::int64_t b = 0; b < Bn; ++b) {
        const std::int64_t len = lens[static_cast<std::size_t>(b)];
        if (step >= len) continue;
        const std::int64_t t = reverse ? len - 1 - step : step;
        const double* xg = xw.data() + (layout == 0 ? t * Bn + b : b * T + t) * GH;
        const double* hg = hr.data() + b * GH;
        double* h = hd + b * H;
        if (cell == Cell::kRnn) {
          for (std::int64_t j = 0; j < H; ++j) h[j] = f[0](clipped(xg[j] + hg[j]));
        } else if (cell == Cell::kGru) {
          // Gates z, r, h.
          for (std::int64_t j = 0; j < H; ++j) {
            at(z, j) = f[0](clipped(xg[j] + hg[j]));
            const double r_j = linear_before_reset ? f[0](clipped(xg[H + j] + hg[H + j])) : at(rg, b * H + j);
            const double pre = linear_before_reset ? xg[2 * H + j] + r_j * hg[2 * H + j]
                                                   : xg[2 * H + j] + at(rhr, b * H + j) + rb[2 * H + j];
            at(hn, j) = f[1](clipped(pre));
          }
          for (std::int64_t j = 0; j < H; ++j) h[j] = (1 - at(z, j)) * at(hn, j) + at(z, j) * h[j];
        } else {
          // Gates i, o, f, c; peepholes P = [Pi, Po, Pf].
          double* c = cd + b * H;
          for (std::int64_t j = 0; j < H; ++j) {
            const double ig = f[0](clipped(xg[j] + hg[j] + pd[j] * c[j]));
            const double fg =
                input_forget ? 1 - ig : f[0](clipped(xg[2 * H + j] + hg[2 * H + j] + pd[2 * H + j] * c[j]));
            const double cg = f[1](clipped(xg[3 * H + j] + hg[3 * H + j]));
            const double cn = fg * c[j] + ig * cg;
            const double og = f[0](clipped(xg[H + j] + hg[H + j] + pd[H + j] * cn));
            c[j] = cn;
            h[j] = og * f[2](cn);  // h is not read again this step (hr holds R h)
          }
        }
        std::copy_n(h, H, y.begin() + ((t * D + d) * Bn + b) * H);
      }
    }
  }
  const DType dt = X.dtype();
  if (ctx.wants_output(0)) {
    Tensor& Y = ctx.allocate_output(
        0, layout == 0 ? std::vector<std::int64_t>{T, D, Bn, H} : std::vector<std::int64_t>{Bn, T, D, H}, dt);
    if (layout == 0) {
      store_values(Y, y.data());
    } else {
      ScratchVector<double> yl(y.size());
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t d = 0; d < D; ++d) {
          for (std::int64_t b = 0; b < Bn; ++b) {
            std::copy_n(y.begin() + ((t * D + d) * Bn + b) * H, H, yl.begin() + ((b * T + t) * D + d) * H);
          }
        }
      }
      store_values(Y, yl.data());
    }
  }
  auto write_state = [&](std::size_t i, const ScratchVector<double>& s) {
    if (!ctx.wants_output(i)) return;
    Tensor& out = ctx.allocate_output(
        i, layout == 0 ? std::vector<std::int64_t>{D, Bn, H} : std::vector<std::int64_t>{Bn, D, H}, dt);
    if (layout == 0) {
      store_values(out, s.data());
      return;
    }
    ScratchVector<double> sl(s.size());
    for (std::int64_t d = 0; d < D; ++d) {
      for (std::int64_t b = 0; b < Bn; ++b) std::copy_n(s.begin() + (d * Bn + b) * H, H, sl.begin() + (b * D + d) * H);
    }
    store_values(out, sl.data());
  };
  write_state(1, h_state);
  if (cell == Cell::kLstm) write_state(2, c_state);
}

}  // namespace

void register_nn_rnn_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "RNN", [](OpContext& ctx) { run_recurrent(ctx, Cell::kRnn); });
  kernels.add("", "GRU", [](OpContext& ctx) { run_recurrent(ctx, Cell::kGru); });
  kernels.add("", "LSTM", [](OpContext& ctx) { run_recurrent(ctx, Cell::kLstm); });
}

}  // namespace xpuruntime::onnx_ref::nn
