// ONNX reference ops: BatchNormalization (inference and training mode), InstanceNormalization,
// LayerNormalization, GroupNormalization, LRN, MeanVarianceNormalization and LpNormalization. Statistics are
// computed in double whatever the dtype (then stored in the output dtypes).
#include <algorithm>

#include "backends/cpu/onnx/onnx_nn_common.h"

namespace xpuruntime::onnx_ref::nn {
namespace {

// Statistics over the elements of `x` (shape `shape`) that share an index on the dims not in `reduced`: for
// each element its group, and per group the mean and the (population) variance.
struct GroupStats {
  std::vector<std::int64_t> group;  // per element
  ScratchVector<double> mean, var;    // per group, in row-major order of the kept dims
};

GroupStats group_stats(const ScratchVector<double>& x, const std::vector<std::int64_t>& shape,
                       const std::vector<bool>& reduced) {
  const std::size_t rank = shape.size();
  std::vector<std::int64_t> kept_strides(rank, 0);
  std::int64_t groups = 1;
  for (std::size_t d = rank; d-- > 0;) {
    if (!reduced[d]) {
      kept_strides[d] = groups;
      groups *= shape[d];
    }
  }
  GroupStats s;
  s.group.resize(x.size());
  s.mean.assign(static_cast<std::size_t>(groups), 0.0);
  s.var.assign(static_cast<std::size_t>(groups), 0.0);
  std::vector<std::int64_t> count(static_cast<std::size_t>(groups), 0);
  const std::vector<std::int64_t> zero(rank, 0);
  for_each_index2(shape, kept_strides, zero, [&](std::int64_t g, std::int64_t, std::int64_t i) {
    s.group[static_cast<std::size_t>(i)] = g;
    s.mean[static_cast<std::size_t>(g)] += x[static_cast<std::size_t>(i)];
    ++count[static_cast<std::size_t>(g)];
  });
  for (std::size_t g = 0; g < s.mean.size(); ++g) s.mean[g] /= static_cast<double>(std::max<std::int64_t>(count[g], 1));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto g = static_cast<std::size_t>(s.group[i]);
    const double d = x[i] - s.mean[g];
    s.var[g] += d * d;
  }
  for (std::size_t g = 0; g < s.var.size(); ++g) s.var[g] /= static_cast<double>(std::max<std::int64_t>(count[g], 1));
  return s;
}

// Per-channel parameter reader for BatchNormalization: a [C] tensor, or (opset < 9, spatial=0) a [C, spatial...]
// one indexed by channel and spatial position.
struct ChannelParam {
  ScratchVector<double> v;
  bool per_position = false;
  double at(std::int64_t c, std::int64_t s, std::int64_t S) const {
    return v[static_cast<std::size_t>(per_position ? c * S + s : c)];
  }
};

ChannelParam channel_param(const OpContext& ctx, std::size_t i, const char* name, std::int64_t C, std::int64_t S) {
  const Tensor& t = ctx.input(i);
  check_float(ctx, t, name);
  ChannelParam p;
  p.v = load_values<double>(t);
  const auto n = static_cast<std::int64_t>(p.v.size());
  XPURT_CHECK(n == C || (n == C * S && S > 1), ctx.where(), ": ", name, " must have ", C,
              " values (one per channel), got shape ", shape_str(t.shape()));
  p.per_position = n != C;
  return p;
}

void batch_normalization(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK(X.dim() >= 2, ctx.where(), ": X must be [N, C, ...], got ", shape_str(X.shape()));
  const std::int64_t N = X.shape()[0], C = X.shape()[1], S = X.numel() / std::max<std::int64_t>(N * C, 1);
  const double epsilon = ctx.attr_float("epsilon", 1e-5);
  const double momentum = ctx.attr_float("momentum", 0.9);
  const ChannelParam scale = channel_param(ctx, 1, "input 'scale'", C, S);
  const ChannelParam bias = channel_param(ctx, 2, "input 'B'", C, S);
  ChannelParam mean = channel_param(ctx, 3, "input 'mean'", C, S);
  ChannelParam var = channel_param(ctx, 4, "input 'var'", C, S);
  // Training mode: the training_mode attribute from opset 14; before, asking for the extra outputs.
  const bool training =
      ctx.opset() >= 14 ? ctx.attr_int("training_mode", 0) != 0
                        : (ctx.wants_output(1) || ctx.wants_output(2) || ctx.wants_output(3) || ctx.wants_output(4));
  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(x.size());
  ChannelParam use_mean = mean, use_var = var;
  ScratchVector<double> batch_mean, batch_var;
  if (training) {
    std::vector<bool> reduced(X.shape().size(), true);
    reduced[1] = false;
    const GroupStats st = group_stats(x, X.shape(), reduced);
    batch_mean = st.mean;
    batch_var = st.var;
    use_mean = ChannelParam{batch_mean, false};
    use_var = ChannelParam{batch_var, false};
  }
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t c = 0; c < C; ++c) {
      for (std::int64_t s = 0; s < S; ++s) {
        const std::size_t i = static_cast<std::size_t>((n * C + c) * S + s);
        y[i] = scale.at(c, s, S) * (x[i] - use_mean.at(c, s, S)) / std::sqrt(use_var.at(c, s, S) + epsilon) +
               bias.at(c, s, S);
      }
    }
  }
  store_values(ctx.allocate_output(0, X.shape(), X.dtype()), y.data());
  if (!training) return;
  // Running statistics: input * momentum + batch * (1 - momentum) (outputs 1 and 2); before opset 14 also the
  // batch mean and variance (outputs 3 and 4, "saved").
  const Tensor& mean_in = ctx.input(3);
  const Tensor& var_in = ctx.input(4);
  ScratchVector<double> running_mean(static_cast<std::size_t>(C)), running_var(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) {
    running_mean[static_cast<std::size_t>(c)] =
        mean.at(c, 0, S) * momentum + batch_mean[static_cast<std::size_t>(c)] * (1 - momentum);
    running_var[static_cast<std::size_t>(c)] =
        var.at(c, 0, S) * momentum + batch_var[static_cast<std::size_t>(c)] * (1 - momentum);
  }
  if (ctx.wants_output(1)) store_values(ctx.allocate_output(1, {C}, mean_in.dtype()), running_mean.data());
  if (ctx.wants_output(2)) store_values(ctx.allocate_output(2, {C}, var_in.dtype()), running_var.data());
  if (ctx.wants_output(3)) store_values(ctx.allocate_output(3, {C}, mean_in.dtype()), batch_mean.data());
  if (ctx.wants_output(4)) store_values(ctx.allocate_output(4, {C}, var_in.dtype()), batch_var.data());
}

void instance_normalization(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK(X.dim() >= 3, ctx.where(), ": X must be [N, C, spatial...], got ", shape_str(X.shape()));
  const std::int64_t N = X.shape()[0], C = X.shape()[1], S = X.numel() / std::max<std::int64_t>(N * C, 1);
  const double epsilon = ctx.attr_float("epsilon", 1e-5);
  const ScratchVector<double> scale = load_values<double>(ctx.input(1)), bias = load_values<double>(ctx.input(2));
  XPURT_CHECK(static_cast<std::int64_t>(scale.size()) == C && static_cast<std::int64_t>(bias.size()) == C, ctx.where(),
              ": scale and B must have ", C, " values (one per channel), got ", shape_str(ctx.input(1).shape()),
              " and ", shape_str(ctx.input(2).shape()));
  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(x.size());
  for (std::int64_t plane = 0; plane < N * C; ++plane) {
    const std::size_t c = static_cast<std::size_t>(plane % C);
    const double* xp = x.data() + plane * S;
    double mean = 0, var = 0;
    for (std::int64_t s = 0; s < S; ++s) mean += xp[s];
    mean /= static_cast<double>(std::max<std::int64_t>(S, 1));
    for (std::int64_t s = 0; s < S; ++s) var += (xp[s] - mean) * (xp[s] - mean);
    var /= static_cast<double>(std::max<std::int64_t>(S, 1));
    const double inv = 1.0 / std::sqrt(var + epsilon);
    for (std::int64_t s = 0; s < S; ++s)
      y[static_cast<std::size_t>(plane * S + s)] = scale[c] * (xp[s] - mean) * inv + bias[c];
  }
  store_values(ctx.allocate_output(0, X.shape(), X.dtype()), y.data());
}

DType stash_dtype(const OpContext& ctx) {
  const std::int64_t stash = ctx.attr_int("stash_type", 1);
  switch (stash) {
    case 1:
      return DType::kFloat32;
    case 10:
      return DType::kFloat16;
    case 11:
      return DType::kFloat64;
    case 16:
      return DType::kBFloat16;
    default:
      break;
  }
  throw InvalidArgumentError(detail::str_cat(ctx.where(), ": stash_type ", stash,
                                             " is not a float type (1 float, 10 float16, 11 double, 16 bfloat16)"));
}

// A parameter (Scale, B) unidirectionally broadcast to X's shape: its value for each element of X.
ScratchVector<double> broadcast_param(const OpContext& ctx, std::size_t i, const char* name,
                                    const std::vector<std::int64_t>& x_shape) {
  const Tensor& t = ctx.input(i);
  check_float(ctx, t, name);
  XPURT_CHECK(broadcast_shapes(t.shape(), x_shape, ctx.where()) == x_shape, ctx.where(), ": ", name, " ",
              shape_str(t.shape()), " cannot be broadcast to X ", shape_str(x_shape));
  const ScratchVector<double> v = load_values<double>(t);
  ScratchVector<double> out(static_cast<std::size_t>(numel_of(x_shape)));
  const auto st = broadcast_strides(t.shape(), x_shape);
  for_each_index2(x_shape, st, st, [&](std::int64_t o, std::int64_t, std::int64_t lin) {
    out[static_cast<std::size_t>(lin)] = v[static_cast<std::size_t>(o)];
  });
  return out;
}

void layer_normalization(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  const std::int64_t rank = X.dim();
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", -1), rank, ctx.where());
  const double epsilon = ctx.attr_float("epsilon", 1e-5);
  const DType stash = stash_dtype(ctx);
  const ScratchVector<double> x = load_values<double>(X);
  const ScratchVector<double> scale = broadcast_param(ctx, 1, "input 'Scale'", X.shape());
  const ScratchVector<double> bias =
      ctx.has_input(2) ? broadcast_param(ctx, 2, "input 'B'", X.shape()) : ScratchVector<double>(x.size(), 0.0);
  std::int64_t rows = 1, cols = 1;
  for (std::int64_t d = 0; d < rank; ++d) (d < axis ? rows : cols) *= X.shape()[static_cast<std::size_t>(d)];
  ScratchVector<double> y(x.size()), mean(static_cast<std::size_t>(rows)), inv_std(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * cols;
    double m = 0, v = 0;
    for (std::int64_t c = 0; c < cols; ++c) m += xr[c];
    m /= static_cast<double>(std::max<std::int64_t>(cols, 1));
    for (std::int64_t c = 0; c < cols; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= static_cast<double>(std::max<std::int64_t>(cols, 1));
    const double inv = 1.0 / std::sqrt(v + epsilon);
    mean[static_cast<std::size_t>(r)] = m;
    inv_std[static_cast<std::size_t>(r)] = inv;
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * cols + c);
      y[i] = (x[i] - m) * inv * scale[i] + bias[i];
    }
  }
  store_values(ctx.allocate_output(0, X.shape(), X.dtype()), y.data());
  std::vector<std::int64_t> stat_shape = X.shape();
  for (std::int64_t d = axis; d < rank; ++d) stat_shape[static_cast<std::size_t>(d)] = 1;
  if (ctx.wants_output(1)) store_values(ctx.allocate_output(1, stat_shape, stash), mean.data());
  if (ctx.wants_output(2)) store_values(ctx.allocate_output(2, stat_shape, stash), inv_std.data());
}

void group_normalization(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK(X.dim() >= 2, ctx.where(), ": X must be [N, C, ...], got ", shape_str(X.shape()));
  XPURT_CHECK(ctx.has_attr("num_groups"), ctx.where(), ": the num_groups attribute is required");
  const std::int64_t G = ctx.attr_int("num_groups", 1);
  const std::int64_t N = X.shape()[0], C = X.shape()[1], S = X.numel() / std::max<std::int64_t>(N * C, 1);
  XPURT_CHECK(G > 0 && C % G == 0, ctx.where(), ": num_groups ", G, " must divide the channels ", C);
  const double epsilon = ctx.attr_float("epsilon", 1e-5);
  const ScratchVector<double> scale = load_values<double>(ctx.input(1)), bias = load_values<double>(ctx.input(2));
  // Opset 18 takes one scale/bias per group, opset 21 one per channel.
  const auto per = static_cast<std::int64_t>(scale.size());
  XPURT_CHECK((per == C || per == G) && bias.size() == scale.size(), ctx.where(), ": scale and bias must have ",
              ctx.opset() >= 21 ? C : G, " values (", ctx.opset() >= 21 ? "one per channel" : "one per group",
              "), got ", shape_str(ctx.input(1).shape()), " and ", shape_str(ctx.input(2).shape()));
  const bool per_channel = ctx.opset() >= 21 ? per == C : per != G;
  const std::int64_t group_size = (C / G) * S;
  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(x.size());
  for (std::int64_t ng = 0; ng < N * G; ++ng) {
    const double* xg = x.data() + ng * group_size;
    double m = 0, v = 0;
    for (std::int64_t i = 0; i < group_size; ++i) m += xg[i];
    m /= static_cast<double>(std::max<std::int64_t>(group_size, 1));
    for (std::int64_t i = 0; i < group_size; ++i) v += (xg[i] - m) * (xg[i] - m);
    v /= static_cast<double>(std::max<std::int64_t>(group_size, 1));
    const double inv = 1.0 / std::sqrt(v + epsilon);
    const std::int64_t g = ng % G;
    for (std::int64_t i = 0; i < group_size; ++i) {
      const std::int64_t c = g * (C / G) + i / S;
      const auto pi = static_cast<std::size_t>(per_channel ? c : g);
      y[static_cast<std::size_t>(ng * group_size + i)] = (xg[i] - m) * inv * scale[pi] + bias[pi];
    }
  }
  store_values(ctx.allocate_output(0, X.shape(), X.dtype()), y.data());
}

void lrn(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  XPURT_CHECK(X.dim() >= 2, ctx.where(), ": X must be [N, C, ...], got ", shape_str(X.shape()));
  XPURT_CHECK(ctx.has_attr("size"), ctx.where(), ": the size attribute is required");
  const std::int64_t size = ctx.attr_int("size", 1);
  XPURT_CHECK(size > 0, ctx.where(), ": size must be > 0, got ", size);
  const double alpha = ctx.attr_float("alpha", 1e-4), beta = ctx.attr_float("beta", 0.75);
  const double bias = ctx.attr_float("bias", 1.0);
  const std::int64_t N = X.shape()[0], C = X.shape()[1], S = X.numel() / std::max<std::int64_t>(N * C, 1);
  const std::int64_t before = (size - 1) / 2, after = size - 1 - before;
  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(x.size());
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::int64_t lo = std::max<std::int64_t>(0, c - before), hi = std::min(C - 1, c + after);
      for (std::int64_t s = 0; s < S; ++s) {
        double sq = 0;
        for (std::int64_t j = lo; j <= hi; ++j) {
          const double v = x[static_cast<std::size_t>((n * C + j) * S + s)];
          sq += v * v;
        }
        const std::size_t i = static_cast<std::size_t>((n * C + c) * S + s);
        y[i] = x[i] / std::pow(bias + alpha / static_cast<double>(size) * sq, beta);
      }
    }
  }
  store_values(ctx.allocate_output(0, X.shape(), X.dtype()), y.data());
}

void mean_variance_normalization(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'X'");
  const auto rank = static_cast<std::int64_t>(X.dim());
  std::vector<std::int64_t> axes;
  bool normalize_variance = true;
  if (ctx.opset() < 9) {
    // MeanVarianceNormalization-1: across_channels / normalize_variance attributes, NCHW input.
    axes = ctx.attr_int("across_channels", 0) != 0 ? std::vector<std::int64_t>{0, 1, 2, 3}
                                                   : std::vector<std::int64_t>{0, 2, 3};
    normalize_variance = ctx.attr_int("normalize_variance", 1) != 0;
  } else {
    axes = ctx.attr_ints("axes", {0, 2, 3});
  }
  std::vector<bool> reduced(static_cast<std::size_t>(rank), false);
  for (std::int64_t a : axes) reduced[static_cast<std::size_t>(normalize_axis(a, rank, ctx.where()))] = true;
  const ScratchVector<double> x = load_values<double>(X);
  const GroupStats st = group_stats(x, X.shape(), reduced);
  ScratchVector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto g = static_cast<std::size_t>(st.group[i]);
    y[i] = x[i] - st.mean[g];
    if (normalize_variance) y[i] /= std::sqrt(st.var[g]) + 1e-9;
  }
  store_values(ctx.allocate_output(0, X.shape(), X.dtype()), y.data());
}

void lp_normalization(OpContext& ctx) {
  const Tensor& X = ctx.input(0);
  check_float(ctx, X, "input 'input'");
  const auto rank = static_cast<std::int64_t>(X.dim());
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", -1), rank, ctx.where());
  const std::int64_t p = ctx.attr_int("p", 2);
  XPURT_CHECK(p == 1 || p == 2, ctx.where(), ": p must be 1 or 2, got ", p);
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= X.shape()[static_cast<std::size_t>(d)];
  for (std::int64_t d = axis + 1; d < rank; ++d) inner *= X.shape()[static_cast<std::size_t>(d)];
  const std::int64_t len = rank == 0 ? 1 : X.shape()[static_cast<std::size_t>(axis)];
  const ScratchVector<double> x = load_values<double>(X);
  ScratchVector<double> y(x.size());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      double norm = 0;
      for (std::int64_t j = 0; j < len; ++j) {
        const double v = x[static_cast<std::size_t>((o * len + j) * inner + i)];
        norm += p == 1 ? std::fabs(v) : v * v;
      }
      if (p == 2) norm = std::sqrt(norm);
      for (std::int64_t j = 0; j < len; ++j) {
        const auto k = static_cast<std::size_t>((o * len + j) * inner + i);
        y[k] = norm == 0.0 ? 0.0 : x[k] / norm;
      }
    }
  }
  store_values(ctx.allocate_output(0, X.shape(), X.dtype()), y.data());
}

}  // namespace

void register_nn_norm_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "BatchNormalization", batch_normalization);
  kernels.add("", "InstanceNormalization", instance_normalization);
  kernels.add("", "LayerNormalization", layer_normalization);
  kernels.add("", "GroupNormalization", group_normalization);
  kernels.add("", "LRN", lrn);
  kernels.add("", "MeanVarianceNormalization", mean_variance_normalization);
  kernels.add("", "LpNormalization", lp_normalization);
}

}  // namespace xpuruntime::onnx_ref::nn
