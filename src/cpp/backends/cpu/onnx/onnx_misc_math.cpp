// ONNX reference ops: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, Det, TfIdfVectorizer and the
// ai.onnx.preview.training optimizers (Adagrad, Momentum, Adam). See backends/cpu/onnx/onnx_kernels.h.
// Everything computes in double and rounds once to the output dtype.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "backends/cpu/onnx/onnx_misc.h"

namespace xpuruntime::onnx_ref {
namespace {

using namespace misc;  // NOLINT(google-build-using-namespace): this group's helpers (onnx_misc.h)

using Shape = std::vector<std::int64_t>;

void check_float(const OpContext& ctx, const Tensor& t, const char* name) {
  XPURT_CHECK_TYPE(is_float_dtype(t.dtype()), ctx.where(), ": input '", name,
                   "' must be a floating-point tensor, got ", dtype_name(t.dtype()));
}

// ---- losses -----------------------------------------------------------------------------------------------

// The negative log-likelihood loss of `log_prob` ([N, C, d1, ...] as doubles) against `target` ([N, d1, ...]),
// with optional class weights, ignore_index and reduction (ONNX's NegativeLogLikelihoodLoss, which
// SoftmaxCrossEntropyLoss applies to log_softmax(scores)). Allocates output 0 with `dtype`.
void nll_loss(OpContext& ctx, const ScratchVector<double>& log_prob, const Shape& input_shape, const Tensor& target,
              const Tensor* weight, DType dtype) {
  XPURT_CHECK(input_shape.size() >= 2, ctx.where(), ": the input must be [N, C] or [N, C, d1, ...], got rank ",
              input_shape.size());
  const std::int64_t n = input_shape[0], c = input_shape[1];
  Shape expected_target{n};
  expected_target.insert(expected_target.end(), input_shape.begin() + 2, input_shape.end());
  XPURT_CHECK(target.shape() == expected_target, ctx.where(), ": the target must have shape [N, d1, ...] = ",
              shape_str(expected_target), " for the input's shape, got ", shape_str(target.shape()));
  const std::vector<std::int64_t> labels = read_ints(target, detail::str_cat(ctx.where(), " target"));
  ScratchVector<double> weights;
  if (weight != nullptr) {
    check_float(ctx, *weight, "weight");
    XPURT_CHECK(weight->dim() == 1 && weight->numel() == c, ctx.where(), ": 'weight' must be 1-D of size C = ", c,
                ", got ", weight->str());
    weights = to_doubles(*weight);
  }
  const bool has_ignore = ctx.has_attr("ignore_index");
  const std::int64_t ignore_index = ctx.attr_int("ignore_index", 0);
  const std::string reduction = ctx.attr_string("reduction", "mean");
  XPURT_CHECK(reduction == "none" || reduction == "sum" || reduction == "mean", ctx.where(),
              ": reduction must be 'none', 'sum' or 'mean', got '", reduction, "'");
  const std::int64_t d = numel_of(Shape(input_shape.begin() + 2, input_shape.end()));
  ScratchVector<double> loss(labels.size());
  double loss_sum = 0.0, weight_sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < d; ++j) {
      const auto t = static_cast<std::size_t>(i * d + j);
      const std::int64_t label = labels[t];
      if (has_ignore && label == ignore_index) {
        loss[t] = 0.0;
        continue;
      }
      XPURT_CHECK(label >= 0 && label < c, ctx.where(), ": target value ", label, " at index ", t,
                  " is outside [0, C = ", c, ")", has_ignore ? " and is not ignore_index" : "");
      const double w = weights.empty() ? 1.0 : weights[static_cast<std::size_t>(label)];
      loss[t] = -log_prob[static_cast<std::size_t>((i * c + label) * d + j)] * w;
      loss_sum += loss[t];
      weight_sum += w;
    }
  }
  if (reduction == "none") {
    store_doubles(ctx.allocate_output(0, target.shape(), dtype), loss);
    return;
  }
  // mean: the weighted mean over the elements not ignored (0/0 = NaN when every element is ignored).
  const double value = reduction == "sum" ? loss_sum : loss_sum / weight_sum;
  store_doubles(ctx.allocate_output(0, {}, dtype), {value});
}

void negative_log_likelihood_loss(OpContext& ctx) {
  const Tensor& input = ctx.input(0);
  check_float(ctx, input, "input");
  nll_loss(ctx, to_doubles(input), input.shape(), ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr,
           input.dtype());
}

void softmax_cross_entropy_loss(OpContext& ctx) {
  const Tensor& scores = ctx.input(0);
  check_float(ctx, scores, "scores");
  XPURT_CHECK(scores.dim() >= 2, ctx.where(), ": 'scores' must be [N, C] or [N, C, d1, ...], got ", scores.str());
  const std::int64_t n = scores.shape()[0], c = scores.shape()[1];
  const std::int64_t d = numel_of(Shape(scores.shape().begin() + 2, scores.shape().end()));
  ScratchVector<double> lp = to_doubles(scores);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < d; ++j) {
      double max_v = -std::numeric_limits<double>::infinity();
      for (std::int64_t k = 0; k < c; ++k) max_v = std::max(max_v, lp[static_cast<std::size_t>((i * c + k) * d + j)]);
      double sum = 0.0;
      for (std::int64_t k = 0; k < c; ++k) sum += std::exp(lp[static_cast<std::size_t>((i * c + k) * d + j)] - max_v);
      const double log_sum = max_v + std::log(sum);
      for (std::int64_t k = 0; k < c; ++k) lp[static_cast<std::size_t>((i * c + k) * d + j)] -= log_sum;
    }
  }
  nll_loss(ctx, lp, scores.shape(), ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr, scores.dtype());
  if (ctx.wants_output(1)) store_doubles(ctx.allocate_output(1, scores.shape(), scores.dtype()), lp);
}

// ---- Det --------------------------------------------------------------------------------------------------

void det(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  check_float(ctx, x, "X");
  XPURT_CHECK(x.dim() >= 2 && x.shape()[static_cast<std::size_t>(x.dim() - 1)] ==
                                  x.shape()[static_cast<std::size_t>(x.dim() - 2)],
              ctx.where(), ": input must be [*, M, M], got ", x.str());
  const std::int64_t m = x.shape().back();
  const Shape out_shape(x.shape().begin(), x.shape().end() - 2);
  const std::int64_t count = numel_of(out_shape);
  const ScratchVector<double> xs = to_doubles(x);
  ScratchVector<double> out(static_cast<std::size_t>(count));
  ScratchVector<double> a(static_cast<std::size_t>(m * m));
  for (std::int64_t b = 0; b < count; ++b) {
    std::copy(xs.begin() + b * m * m, xs.begin() + (b + 1) * m * m, a.begin());
    auto at = [&](std::int64_t r, std::int64_t c) -> double& { return a[static_cast<std::size_t>(r * m + c)]; };
    // LU decomposition with partial pivoting: det = sign * prod(diagonal).
    double result = 1.0;
    for (std::int64_t col = 0; col < m && result != 0.0; ++col) {
      std::int64_t pivot = col;
      for (std::int64_t r = col + 1; r < m; ++r) {
        if (std::fabs(at(r, col)) > std::fabs(at(pivot, col))) pivot = r;
      }
      const double p = at(pivot, col);
      if (p == 0.0) {
        result = 0.0;
        break;
      }
      if (pivot != col) {
        for (std::int64_t k = 0; k < m; ++k) std::swap(at(pivot, k), at(col, k));
        result = -result;
      }
      result *= p;
      for (std::int64_t r = col + 1; r < m; ++r) {
        const double f = at(r, col) / p;
        if (f == 0.0) continue;
        for (std::int64_t k = col; k < m; ++k) at(r, k) -= f * at(col, k);
      }
    }
    out[static_cast<std::size_t>(b)] = result;
  }
  store_doubles(ctx.allocate_output(0, out_shape, x.dtype()), out);
}

// ---- TfIdfVectorizer --------------------------------------------------------------------------------------

void tfidf_vectorizer(OpContext& ctx) {
  if (ctx.node().string_list_attrs.count("pool_strings") != 0) {
    throw UnsupportedOperationError(detail::str_cat(
        ctx.where(), ": string n-gram pools (pool_strings) are not supported: xpuruntime tensors hold no strings"));
  }
  const Tensor& x = ctx.input(0);
  XPURT_CHECK_TYPE(x.dtype() == DType::kInt32 || x.dtype() == DType::kInt64, ctx.where(),
                   ": input 'X' must be int32 or int64 (string inputs are not supported), got ", dtype_name(x.dtype()));
  XPURT_CHECK(x.dim() == 1 || x.dim() == 2, ctx.where(), ": input 'X' must be [C] or [N, C], got ", x.str());
  const std::int64_t min_gram = ctx.attr_int("min_gram_length", 0);
  const std::int64_t max_gram = ctx.attr_int("max_gram_length", 0);
  const std::int64_t max_skip = ctx.attr_int("max_skip_count", 0);
  const std::string mode = ctx.attr_string("mode", "");
  XPURT_CHECK(min_gram >= 1 && min_gram <= max_gram, ctx.where(), ": expected 1 <= min_gram_length <= "
              "max_gram_length, got ", min_gram, " and ", max_gram);
  XPURT_CHECK(max_skip >= 0, ctx.where(), ": max_skip_count must be >= 0, got ", max_skip);
  XPURT_CHECK(mode == "TF" || mode == "IDF" || mode == "TFIDF", ctx.where(), ": mode must be TF, IDF or TFIDF, got '",
              mode, "'");
  const std::vector<std::int64_t> pool = ctx.attr_ints("pool_int64s", {});
  const std::vector<std::int64_t> counts = ctx.attr_ints("ngram_counts", {});
  const std::vector<std::int64_t> indexes = ctx.attr_ints("ngram_indexes", {});
  const std::vector<double> weights = ctx.attr_floats("weights", {});
  XPURT_CHECK(!pool.empty(), ctx.where(), ": attribute 'pool_int64s' is required");
  XPURT_CHECK(!counts.empty() && counts[0] == 0, ctx.where(), ": 'ngram_counts' must start with 0");
  // The pool holds the 1-grams, then the 2-grams, ...: counts[i] is where the (i+1)-grams start.
  std::map<std::vector<std::int64_t>, std::int64_t> ngram_slot;  // n-gram -> position in ngram_indexes
  std::int64_t slot = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const std::int64_t start = counts[i];
    const std::int64_t end = i + 1 < counts.size() ? counts[i + 1] : static_cast<std::int64_t>(pool.size());
    const auto gram = static_cast<std::int64_t>(i + 1);
    XPURT_CHECK(start <= end && end <= static_cast<std::int64_t>(pool.size()) && (end - start) % gram == 0,
                ctx.where(), ": ngram_counts ", i, " (", start, "..", end, ") does not hold whole ", gram, "-grams");
    for (std::int64_t p = start; p < end; p += gram, ++slot) {
      ngram_slot[std::vector<std::int64_t>(pool.begin() + p, pool.begin() + p + gram)] = slot;
    }
  }
  XPURT_CHECK(static_cast<std::int64_t>(indexes.size()) == slot, ctx.where(), ": ngram_indexes has ",
              indexes.size(), " entries for ", slot, " n-grams in the pool");
  XPURT_CHECK(weights.empty() || weights.size() == indexes.size(), ctx.where(), ": weights has ", weights.size(),
              " entries for ", indexes.size(), " n-grams");
  std::int64_t width = 0;
  for (std::int64_t v : indexes) {
    XPURT_CHECK(v >= 0, ctx.where(), ": ngram_indexes holds a negative value ", v);
    width = std::max(width, v + 1);
  }
  const std::int64_t rows = x.dim() == 2 ? x.shape()[0] : 1;
  const std::int64_t cols = x.shape().back();
  const std::vector<std::int64_t> tokens = read_ints(x, ctx.where());
  ScratchVector<double> out(static_cast<std::size_t>(rows * width), 0.0);
  std::vector<std::int64_t> gram;
  for (std::int64_t r = 0; r < rows; ++r) {
    ScratchVector<double> counts_row(indexes.size(), 0.0);
    const std::int64_t* row = tokens.data() + r * cols;
    for (std::int64_t start = 0; start < cols; ++start) {
      // Unigrams once; longer n-grams for every skip distance 1 .. max_skip_count + 1.
      for (std::int64_t distance = 1; distance <= max_skip + 1; ++distance) {
        gram.clear();
        for (std::int64_t len = 1; len <= max_gram; ++len) {
          const std::int64_t pos = start + (len - 1) * distance;
          if (pos >= cols) break;
          gram.push_back(row[pos]);
          if (len < min_gram || (len == 1 && distance > 1)) continue;
          auto it = ngram_slot.find(gram);
          if (it != ngram_slot.end()) counts_row[static_cast<std::size_t>(it->second)] += 1.0;
        }
      }
    }
    for (std::size_t s = 0; s < indexes.size(); ++s) {
      const double w = weights.empty() ? 1.0 : weights[s];
      double v = counts_row[s];
      if (mode == "IDF") v = v > 0 ? w : 0.0;
      if (mode == "TFIDF") v *= w;
      out[static_cast<std::size_t>(r * width + indexes[s])] += v;
    }
  }
  const Shape out_shape = x.dim() == 2 ? Shape{rows, width} : Shape{width};
  store_doubles(ctx.allocate_output(0, out_shape, DType::kFloat32), out);
}

// ---- ai.onnx.preview.training optimizers --------------------------------------------------------------------

// The shared inputs of the optimizers: R (learning rate, scalar float) and T (iteration count, scalar int64),
// then `groups` tensors per optimized variable in blocks (all X, then all G, ...).
struct OptimizerInputs {
  double r = 0.0;
  std::int64_t t = 0;
  std::size_t variables = 0;
};

OptimizerInputs optimizer_inputs(const OpContext& ctx, std::size_t per_variable) {
  OptimizerInputs in;
  const Tensor& r = ctx.input(0);
  check_float(ctx, r, "R");
  in.r = read_scalar(r, ctx.where());
  const std::vector<std::int64_t> t = read_ints(ctx.input(1), detail::str_cat(ctx.where(), " input 'T'"));
  XPURT_CHECK(t.size() == 1, ctx.where(), ": input 'T' must be a scalar");
  in.t = t[0];
  XPURT_CHECK(ctx.num_inputs() > 2 && (ctx.num_inputs() - 2) % per_variable == 0, ctx.where(), ": expected 2 + ",
              per_variable, " * k inputs, got ", ctx.num_inputs());
  in.variables = (ctx.num_inputs() - 2) / per_variable;
  XPURT_CHECK(ctx.num_outputs() == (per_variable - 1) * in.variables, ctx.where(), ": expected ",
              (per_variable - 1) * in.variables, " outputs for ", in.variables, " variables, got ",
              ctx.num_outputs());
  for (std::size_t k = 0; k < per_variable; ++k) {
    for (std::size_t v = 0; v < in.variables; ++v) {
      const Tensor& tensor = ctx.input(2 + k * in.variables + v);
      const Tensor& first = ctx.input(2 + v);
      check_float(ctx, tensor, "X/G/V/H");
      XPURT_CHECK(tensor.shape() == first.shape(), ctx.where(), ": input ", 2 + k * in.variables + v, " is ",
                  tensor.str(), " but the variable it updates is ", first.str());
    }
  }
  return in;
}

void adagrad(OpContext& ctx) {
  const OptimizerInputs in = optimizer_inputs(ctx, 3);
  // Defaults as ONNX's schema states them (float32 attributes).
  const double decay = ctx.attr_float("decay_factor", 0.0), epsilon = ctx.attr_float("epsilon", 1e-6f);
  const double norm = ctx.attr_float("norm_coefficient", 0.0);
  const double rate = in.r / (1.0 + static_cast<double>(in.t) * decay);
  for (std::size_t v = 0; v < in.variables; ++v) {
    const Tensor& xt = ctx.input(2 + v);
    const auto x = to_doubles(xt), g = to_doubles(ctx.input(2 + in.variables + v));
    auto h = to_doubles(ctx.input(2 + 2 * in.variables + v));
    ScratchVector<double> x_new(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double gr = norm * x[i] + g[i];
      h[i] += gr * gr;
      x_new[i] = x[i] - rate * gr / (std::sqrt(h[i]) + epsilon);
    }
    store_doubles(ctx.allocate_output(v, xt.shape(), xt.dtype()), x_new);
    store_doubles(ctx.allocate_output(in.variables + v, xt.shape(), ctx.input(2 + 2 * in.variables + v).dtype()), h);
  }
}

void momentum(OpContext& ctx) {
  const OptimizerInputs in = optimizer_inputs(ctx, 3);
  for (const char* name : {"alpha", "beta", "mode", "norm_coefficient"}) {
    XPURT_CHECK(ctx.has_attr(name), ctx.where(), ": attribute '", name, "' is required");
  }
  const double alpha = ctx.attr_float("alpha", 0.0), beta = ctx.attr_float("beta", 0.0);
  const double norm = ctx.attr_float("norm_coefficient", 0.0);
  const std::string mode = ctx.attr_string("mode", "standard");
  XPURT_CHECK(mode == "standard" || mode == "nesterov", ctx.where(), ": mode must be 'standard' or 'nesterov', got '",
              mode, "'");
  const double beta_adjusted = in.t > 0 ? beta : 1.0;  // the gradient's coefficient is 1 at the first iteration
  for (std::size_t v = 0; v < in.variables; ++v) {
    const Tensor& xt = ctx.input(2 + v);
    const auto x = to_doubles(xt), g = to_doubles(ctx.input(2 + in.variables + v));
    auto m = to_doubles(ctx.input(2 + 2 * in.variables + v));
    ScratchVector<double> x_new(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double gr = norm * x[i] + g[i];
      m[i] = alpha * m[i] + beta_adjusted * gr;
      x_new[i] = mode == "standard" ? x[i] - in.r * m[i] : x[i] - in.r * (gr + alpha * m[i]);
    }
    store_doubles(ctx.allocate_output(v, xt.shape(), xt.dtype()), x_new);
    store_doubles(ctx.allocate_output(in.variables + v, xt.shape(), ctx.input(2 + 2 * in.variables + v).dtype()), m);
  }
}

void adam(OpContext& ctx) {
  const OptimizerInputs in = optimizer_inputs(ctx, 4);
  // Defaults as ONNX's schema states them (float32 attributes).
  const double alpha = ctx.attr_float("alpha", 0.9f), beta = ctx.attr_float("beta", 0.999f);
  const double epsilon = ctx.attr_float("epsilon", 1e-6f), norm = ctx.attr_float("norm_coefficient", 0.0);
  const double norm_post = ctx.attr_float("norm_coefficient_post", 0.0);
  const double t = static_cast<double>(in.t);
  // Bias correction of both momentums from the second iteration on.
  const double rate = in.t > 0 ? in.r * std::sqrt(1.0 - std::pow(beta, t)) / (1.0 - std::pow(alpha, t)) : in.r;
  const std::size_t k = in.variables;
  for (std::size_t v = 0; v < k; ++v) {
    const Tensor& xt = ctx.input(2 + v);
    const auto x = to_doubles(xt), g = to_doubles(ctx.input(2 + k + v));
    auto m1 = to_doubles(ctx.input(2 + 2 * k + v));
    auto m2 = to_doubles(ctx.input(2 + 3 * k + v));
    ScratchVector<double> x_new(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double gr = norm * x[i] + g[i];
      m1[i] = alpha * m1[i] + (1.0 - alpha) * gr;
      m2[i] = beta * m2[i] + (1.0 - beta) * gr * gr;
      x_new[i] = (1.0 - norm_post) * (x[i] - rate * m1[i] / (std::sqrt(m2[i]) + epsilon));
    }
    store_doubles(ctx.allocate_output(v, xt.shape(), xt.dtype()), x_new);
    store_doubles(ctx.allocate_output(k + v, xt.shape(), ctx.input(2 + 2 * k + v).dtype()), m1);
    store_doubles(ctx.allocate_output(2 * k + v, xt.shape(), ctx.input(2 + 3 * k + v).dtype()), m2);
  }
}

}  // namespace

void register_misc_math_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "NegativeLogLikelihoodLoss", negative_log_likelihood_loss);
  kernels.add("", "SoftmaxCrossEntropyLoss", softmax_cross_entropy_loss);
  kernels.add("", "Det", det);
  kernels.add("", "TfIdfVectorizer", tfidf_vectorizer);
  constexpr const char* kTraining = "ai.onnx.preview.training";
  kernels.add(kTraining, "Adagrad", adagrad);
  kernels.add(kTraining, "Momentum", momentum);
  kernels.add(kTraining, "Adam", adam);
}

}  // namespace xpuruntime::onnx_ref
