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

// One RNN/GRU/LSTM node's inputs and attributes, read and checked (read_recurrent): values in double, the states
// internal [D, B, H] whatever the layout.
struct Recurrent {
  Cell cell = Cell::kRnn;
  std::int64_t G = 1;       // gates: 1 (RNN), 3 (GRU), 4 (LSTM)
  std::int64_t layout = 0;  // 0: X [T, B, I]; 1: X [B, T, I]
  std::int64_t T = 0, Bn = 0, I = 0, D = 1, H = 0;
  std::string direction;
  ScratchVector<double> x, w, r, bias, h_state, c_state, peep;
  std::vector<std::int64_t> lens;  // each batch row's sequence length
  std::vector<Activation> acts;    // per_direction of them for each direction
  std::size_t per_direction = 1;
  bool has_clip = false;
  double clip = 0.0;
  bool linear_before_reset = false;  // GRU
  bool input_forget = false;         // LSTM

  double clipped(double v) const { return has_clip ? std::clamp(v, -clip, clip) : v; }
};

// State input `i` ([D, B, H] for layout 0, [B, D, H] for layout 1) as internal [D, B, H]; zeros when absent.
ScratchVector<double> read_state(const OpContext& ctx, const Recurrent& p, std::size_t i, const char* name) {
  const std::int64_t D = p.D, Bn = p.Bn, H = p.H;
  ScratchVector<double> s(static_cast<std::size_t>(D * Bn * H), 0.0);
  if (!ctx.has_input(i)) return s;
  const Tensor& t = ctx.input(i);
  const std::vector<std::int64_t> expect =
      p.layout == 0 ? std::vector<std::int64_t>{D, Bn, H} : std::vector<std::int64_t>{Bn, D, H};
  XPURT_CHECK(t.shape() == expect, ctx.where(), ": ", name, " must be ", shape_str(expect), ", got ",
              shape_str(t.shape()));
  const ScratchVector<double> v = load_values<double>(t);
  for (std::int64_t d = 0; d < D; ++d) {
    for (std::int64_t b = 0; b < Bn; ++b) {
      const std::int64_t src = p.layout == 0 ? (d * Bn + b) * H : (b * D + d) * H;
      std::copy_n(v.begin() + src, H, s.begin() + (d * Bn + b) * H);
    }
  }
  return s;
}

// X, W, R and the optional B, sequence_lens, initial_h, initial_c, P, with the attributes, checked in this order.
Recurrent read_recurrent(OpContext& ctx, Cell cell) {
  Recurrent p;
  p.cell = cell;
  const std::int64_t G = p.G = cell == Cell::kRnn ? 1 : cell == Cell::kGru ? 3 : 4;
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  const Tensor& W = ctx.input(1);
  const Tensor& R = ctx.input(2);
  XPURT_CHECK(X.dim() == 3, ctx.where(), ": X must be 3-D, got ", shape_str(X.shape()));
  const std::int64_t layout = p.layout = ctx.attr_int("layout", 0);
  XPURT_CHECK(layout == 0 || layout == 1, ctx.where(), ": layout must be 0 or 1, got ", layout);
  const std::int64_t T = p.T = layout == 0 ? X.shape()[0] : X.shape()[1];
  const std::int64_t Bn = p.Bn = layout == 0 ? X.shape()[1] : X.shape()[0];
  const std::int64_t I = p.I = X.shape()[2];
  p.direction = ctx.attr_string("direction", "forward");
  XPURT_CHECK(p.direction == "forward" || p.direction == "reverse" || p.direction == "bidirectional", ctx.where(),
              ": direction '", p.direction, "' is not one of forward, reverse, bidirectional");
  const std::int64_t D = p.D = p.direction == "bidirectional" ? 2 : 1;
  XPURT_CHECK(R.dim() == 3, ctx.where(), ": R must be [num_directions, ", G, "*hidden_size, hidden_size], got ",
              shape_str(R.shape()));
  const std::int64_t H = p.H = ctx.attr_int("hidden_size", R.shape()[2]);
  XPURT_CHECK(W.shape() == (std::vector<std::int64_t>{D, G * H, I}), ctx.where(), ": W must be [", D, ",", G * H, ",",
              I, "], got ", shape_str(W.shape()));
  XPURT_CHECK(R.shape() == (std::vector<std::int64_t>{D, G * H, H}), ctx.where(), ": R must be [", D, ",", G * H, ",",
              H, "], got ", shape_str(R.shape()));
  p.x = load_values<double>(X);
  p.w = load_values<double>(W);
  p.r = load_values<double>(R);
  p.bias = ScratchVector<double>(static_cast<std::size_t>(D * 2 * G * H), 0.0);
  if (ctx.has_input(3)) {
    XPURT_CHECK(ctx.input(3).shape() == (std::vector<std::int64_t>{D, 2 * G * H}), ctx.where(), ": B must be [", D, ",",
                2 * G * H, "], got ", shape_str(ctx.input(3).shape()));
    p.bias = load_values<double>(ctx.input(3));
  }
  p.lens.assign(static_cast<std::size_t>(Bn), T);
  if (ctx.has_input(4)) {
    p.lens = read_ints(ctx.input(4), ctx.where() + " input 'sequence_lens'");
    XPURT_CHECK(static_cast<std::int64_t>(p.lens.size()) == Bn, ctx.where(), ": sequence_lens must have ", Bn,
                " values, got ", p.lens.size());
    for (std::int64_t l : p.lens) {
      XPURT_CHECK(l >= 0 && l <= T, ctx.where(), ": sequence_lens values must be in [0, ", T, "], got ", l);
    }
  }
  p.h_state = read_state(ctx, p, 5, "initial_h");
  if (cell == Cell::kLstm) p.c_state = read_state(ctx, p, 6, "initial_c");
  p.peep = ScratchVector<double>(static_cast<std::size_t>(D * 3 * H), 0.0);
  if (cell == Cell::kLstm && ctx.has_input(7)) {
    XPURT_CHECK(ctx.input(7).shape() == (std::vector<std::int64_t>{D, 3 * H}), ctx.where(), ": P must be [", D, ",",
                3 * H, "], got ", shape_str(ctx.input(7).shape()));
    p.peep = load_values<double>(ctx.input(7));
  }
  const std::vector<std::string> defaults = cell == Cell::kRnn   ? std::vector<std::string>{"Tanh"}
                                            : cell == Cell::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                                 : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  p.acts = read_activations(ctx, defaults, D);
  p.per_direction = defaults.size();
  p.has_clip = ctx.has_attr("clip");
  p.clip = ctx.attr_float("clip", 0.0);
  p.linear_before_reset = cell == Cell::kGru && ctx.attr_int("linear_before_reset", 0) != 0;
  p.input_forget = cell == Cell::kLstm && ctx.attr_int("input_forget", 0) != 0;
  return p;
}

// One direction's weights: W, R, Wb, Rb and P of direction d, and its activations f.
struct DirectionWeights {
  const double* w;
  const double* r;
  const double* wb;
  const double* rb;
  const double* peep;
  const Activation* f;
};

// The cell steps of one batch row at one time step. `xg`: the row's x W^T + Wb, `hg`: its h R^T + Rb (G*H values
// each); `h` (and `c`) are updated in place.
void rnn_step(const Recurrent& p, const DirectionWeights& dw, const double* xg, const double* hg, double* h) {
  for (std::int64_t j = 0; j < p.H; ++j) h[j] = dw.f[0](p.clipped(xg[j] + hg[j]));
}

// Gates z, r, h. `rg`: the reset gate and `rhr`: (r * h) R_h^T of this row (gru_reset_products), when not
// linear_before_reset; `z` and `hn`: H values of scratch.
void gru_step(const Recurrent& p, const DirectionWeights& dw, const double* xg, const double* hg, const double* rg,
              const double* rhr, double* z, double* hn, double* h) {
  const std::int64_t H = p.H;
  const Activation* f = dw.f;
  for (std::int64_t j = 0; j < H; ++j) {
    z[j] = f[0](p.clipped(xg[j] + hg[j]));
    const double r_j = p.linear_before_reset ? f[0](p.clipped(xg[H + j] + hg[H + j])) : rg[j];
    const double pre = p.linear_before_reset ? xg[2 * H + j] + r_j * hg[2 * H + j]
                                             : xg[2 * H + j] + rhr[j] + dw.rb[2 * H + j];
    hn[j] = f[1](p.clipped(pre));
  }
  for (std::int64_t j = 0; j < H; ++j) h[j] = (1 - z[j]) * hn[j] + z[j] * h[j];
}

// Gates i, o, f, c; peepholes P = [Pi, Po, Pf].
void lstm_step(const Recurrent& p, const DirectionWeights& dw, const double* xg, const double* hg, double* c,
               double* h) {
  const std::int64_t H = p.H;
  const Activation* f = dw.f;
  const double* pd = dw.peep;
  for (std::int64_t j = 0; j < H; ++j) {
    const double ig = f[0](p.clipped(xg[j] + hg[j] + pd[j] * c[j]));
    const double fg =
        p.input_forget ? 1 - ig : f[0](p.clipped(xg[2 * H + j] + hg[2 * H + j] + pd[2 * H + j] * c[j]));
    const double cg = f[1](p.clipped(xg[3 * H + j] + hg[3 * H + j]));
    const double cn = fg * c[j] + ig * cg;
    const double og = f[0](p.clipped(xg[H + j] + hg[H + j] + pd[H + j] * cn));
    c[j] = cn;
    h[j] = og * f[2](cn);  // h is not read again this step (hr holds R h)
  }
}

// The time index batch row b reads at `step` (reversed within its own length for a reverse direction).
std::int64_t time_of(const Recurrent& p, std::int64_t b, std::int64_t step, bool reverse) {
  const std::int64_t len = p.lens[static_cast<std::size_t>(b)];
  return reverse ? len - 1 - step : step;
}

// GRU without linear_before_reset: the candidate gate needs (r * h) R_h^T, so the reset gate r of every batch row
// first (into rg), then one more GEMM (into rhr). Rows past their length read time 0 (computed, not used).
void gru_reset_products(const Recurrent& p, const DirectionWeights& dw, const ScratchVector<double>& xw,
                        const ScratchVector<double>& hr, const double* hd, std::int64_t step, bool reverse,
                        ScratchVector<double>& rg, ScratchVector<double>& rh, ScratchVector<double>& rhr) {
  const std::int64_t H = p.H, GH = p.G * p.H, Bn = p.Bn, T = p.T;
  for (std::int64_t b = 0; b < Bn; ++b) {
    const std::int64_t len = p.lens[static_cast<std::size_t>(b)];
    const std::int64_t t = step < len ? time_of(p, b, step, reverse) : 0;
    const double* xg = xw.data() + (p.layout == 0 ? t * Bn + b : b * T + t) * GH;
    for (std::int64_t j = 0; j < H; ++j) {
      const auto k = static_cast<std::size_t>(b * H + j);
      rg[k] = dw.f[0](p.clipped(xg[H + j] + hr[static_cast<std::size_t>(b * GH + H + j)]));
      rh[k] = rg[k] * hd[b * H + j];
    }
  }
  nn_gemm<double>(true, Bn, H, H, rh.data(), H, dw.r + 2 * H * H, H, rhr.data(), H);
}

// Direction d over all time steps: updates its states in p.h_state (p.c_state) and writes its hidden states into
// y (internal [T, D, B, H]). The input projections of all steps are one GEMM; each step then multiplies every batch
// row's hidden state by R at once (rows past their sequence length are computed but not used).
void run_direction(Recurrent& p, std::int64_t d, ScratchVector<double>& y) {
  const std::int64_t T = p.T, Bn = p.Bn, I = p.I, H = p.H, D = p.D, GH = p.G * p.H;
  const bool reverse = p.direction == "reverse" || d == 1;
  DirectionWeights dw{};
  dw.w = p.w.data() + d * GH * I;
  dw.r = p.r.data() + d * GH * H;
  dw.wb = p.bias.data() + d * 2 * GH;
  dw.rb = dw.wb + GH;
  dw.peep = p.peep.data() + d * 3 * H;
  dw.f = p.acts.data() + d * static_cast<std::int64_t>(p.per_direction);
  ScratchVector<double> xw(static_cast<std::size_t>(T * Bn * GH)), hr(static_cast<std::size_t>(Bn * GH));
  ScratchVector<double> rh(static_cast<std::size_t>(Bn * H)), rhr(static_cast<std::size_t>(Bn * H));
  ScratchVector<double> z(static_cast<std::size_t>(H)), rg(static_cast<std::size_t>(Bn * H));
  ScratchVector<double> hn(static_cast<std::size_t>(H));
  auto at = [](ScratchVector<double>& v, std::int64_t i) -> double& { return v[static_cast<std::size_t>(i)]; };
  // xw rows follow X's rows: (t, b) for layout 0, (b, t) for layout 1.
  nn_gemm<double>(true, T * Bn, GH, I, p.x.data(), I, dw.w, I, xw.data(), GH);
  for (std::int64_t row = 0; row < T * Bn; ++row) {
    for (std::int64_t g = 0; g < GH; ++g) at(xw, row * GH + g) += dw.wb[g];
  }
  double* hd = p.h_state.data() + d * Bn * H;
  double* cd = p.cell == Cell::kLstm ? p.c_state.data() + d * Bn * H : nullptr;
  for (std::int64_t step = 0; step < T; ++step) {
    // hr = h R^T + Rb for every batch row.
    nn_gemm<double>(true, Bn, GH, H, hd, H, dw.r, H, hr.data(), GH);
    for (std::int64_t b = 0; b < Bn; ++b) {
      for (std::int64_t g = 0; g < GH; ++g) at(hr, b * GH + g) += dw.rb[g];
    }
    if (p.cell == Cell::kGru && !p.linear_before_reset) {
      gru_reset_products(p, dw, xw, hr, hd, step, reverse, rg, rh, rhr);
    }
    for (std::int64_t b = 0; b < Bn; ++b) {
      if (step >= p.lens[static_cast<std::size_t>(b)]) continue;
      const std::int64_t t = time_of(p, b, step, reverse);
      const double* xg = xw.data() + (p.layout == 0 ? t * Bn + b : b * T + t) * GH;
      const double* hg = hr.data() + b * GH;
      double* h = hd + b * H;
      if (p.cell == Cell::kRnn) {
        rnn_step(p, dw, xg, hg, h);
      } else if (p.cell == Cell::kGru) {
        gru_step(p, dw, xg, hg, rg.data() + b * H, rhr.data() + b * H, z.data(), hn.data(), h);
      } else {
        lstm_step(p, dw, xg, hg, cd + b * H, h);
      }
      std::copy_n(h, H, y.begin() + ((t * D + d) * Bn + b) * H);
    }
  }
}

// Y from y (internal [T, D, B, H]) and Y_h (Y_c) from the final states, each in the node's layout, those asked for.
void write_recurrent_outputs(OpContext& ctx, const Recurrent& p, const ScratchVector<double>& y) {
  const std::int64_t T = p.T, Bn = p.Bn, D = p.D, H = p.H, layout = p.layout;
  const DType dt = ctx.input(0).dtype();
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
  write_state(1, p.h_state);
  if (p.cell == Cell::kLstm) write_state(2, p.c_state);
}

void run_recurrent(OpContext& ctx, Cell cell) {
  Recurrent p = read_recurrent(ctx, cell);
  ScratchVector<double> y(static_cast<std::size_t>(p.T * p.D * p.Bn * p.H), 0.0);
  for (std::int64_t d = 0; d < p.D; ++d) run_direction(p, d, y);
  write_recurrent_outputs(ctx, p, y);
}

}  // namespace

void register_nn_rnn_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "RNN", [](OpContext& ctx) { run_recurrent(ctx, Cell::kRnn); });
  kernels.add("", "GRU", [](OpContext& ctx) { run_recurrent(ctx, Cell::kGru); });
  kernels.add("", "LSTM", [](OpContext& ctx) { run_recurrent(ctx, Cell::kLstm); });
}

}  // namespace xpuruntime::onnx_ref::nn
