// ONNX reference ops (tensor group, reductions): Reduce*, ArgMax, ArgMin, TopK, CumSum, Einsum. See
// backends/cpu/onnx/onnx_kernels.h. Floating-point values accumulate in double (16-bit floats included),
// integers in int64.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "backends/cpu/onnx/onnx_tensor_internal.h"
#include "core/scalar.h"

namespace xpuruntime::onnx_ref {
namespace {

using Shape = std::vector<std::int64_t>;

std::size_t us(std::int64_t v) { return static_cast<std::size_t>(v); }

// The accumulator of a compute type: int64 for signed integers, uint64 for unsigned ones (bool included; sums
// wrap like the type), double for floating point.
template <typename C>
using Acc = std::conditional_t<std::is_integral_v<C>,
                               std::conditional_t<std::is_unsigned_v<C>, std::uint64_t, std::int64_t>, double>;

// The reduced and kept dimensions of a reduction, with their strides in the (contiguous) input.
struct ReducePlan {
  Shape out_shape;        // with or without the kept 1s, per keepdims
  Shape kept_shape, kept_strides;
  Shape reduced_shape, reduced_strides;
  std::int64_t reduced_count = 1;
};

ReducePlan plan_reduction(const Shape& shape, const std::vector<bool>& reduce, bool keepdims) {
  ReducePlan plan;
  const Shape strides = contiguous_strides(shape);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (reduce[d]) {
      plan.reduced_shape.push_back(shape[d]);
      plan.reduced_strides.push_back(strides[d]);
      plan.reduced_count *= shape[d];
      if (keepdims) plan.out_shape.push_back(1);
    } else {
      plan.kept_shape.push_back(shape[d]);
      plan.kept_strides.push_back(strides[d]);
      plan.out_shape.push_back(shape[d]);
    }
  }
  return plan;
}

// Calls fn(out_linear, visit) for every output element, where visit(g) calls g(offset) for each input offset
// reduced into it.
template <typename Fn>
void for_each_reduction(const ReducePlan& plan, Fn&& fn) {
  const Shape zeros_kept(plan.kept_shape.size(), 0);
  const Shape zeros_reduced(plan.reduced_shape.size(), 0);
  for_each_index2(plan.kept_shape, plan.kept_strides, zeros_kept,
                  [&](std::int64_t base, std::int64_t, std::int64_t linear) {
                    auto visit = [&](auto&& g) {
                      for_each_index2(plan.reduced_shape, plan.reduced_strides, zeros_reduced,
                                      [&](std::int64_t offset, std::int64_t, std::int64_t) { g(base + offset); });
                    };
                    fn(linear, visit);
                  });
}

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

void reduce(OpContext& ctx, ReduceKind kind, std::int64_t axes_input_since) {
  const Tensor& x = ctx.input(0);
  const std::int64_t rank = x.dim();
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0;
  const bool noop = ctx.attr_int("noop_with_empty_axes", 0) != 0;
  const auto axes = ints_attr_or_input(ctx, "axes", axes_input_since, 1);
  std::vector<bool> reduce_dim(us(rank), false);
  if (axes && !axes->empty()) {
    for (std::int64_t a : normalize_axes(*axes, rank, ctx.where())) reduce_dim[us(a)] = true;
  } else if (!noop) {
    std::fill(reduce_dim.begin(), reduce_dim.end(), true);
  }
  const ReducePlan plan = plan_reduction(x.shape(), reduce_dim, keepdims);
  Tensor& out = ctx.allocate_output(0, plan.out_shape, x.dtype());
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    using A = Acc<C>;
    const T* src = data<T>(x);
    T* dst = data<T>(out);
    auto load = [&](std::int64_t offset) { return static_cast<A>(Compute<T>::load(src[offset])); };
    auto store = [&](std::int64_t i, auto value) { dst[i] = Compute<T>::store(static_cast<C>(value)); };
    const bool empty = plan.reduced_count == 0;
    for_each_reduction(plan, [&](std::int64_t i, auto&& visit) {
      switch (kind) {
        case ReduceKind::kSum:
        case ReduceKind::kMean:
        case ReduceKind::kLogSum: {
          A acc = 0;
          visit([&](std::int64_t o) { acc += load(o); });
          if (kind == ReduceKind::kSum) {
            store(i, acc);
          } else if (kind == ReduceKind::kLogSum) {
            store(i, std::log(static_cast<double>(acc)));
          } else if (std::is_integral_v<C> && empty) {
            store(i, 0);
          } else {
            store(i, static_cast<double>(acc) / static_cast<double>(plan.reduced_count));
          }
          break;
        }
        case ReduceKind::kSumSquare:
        case ReduceKind::kL2: {
          A acc = 0;
          visit([&](std::int64_t o) { acc += load(o) * load(o); });
          if (kind == ReduceKind::kSumSquare) {
            store(i, acc);
          } else {
            store(i, std::sqrt(static_cast<double>(acc)));
          }
          break;
        }
        case ReduceKind::kL1: {
          A acc = 0;
          visit([&](std::int64_t o) { acc += load(o) < 0 ? -load(o) : load(o); });
          store(i, acc);
          break;
        }
        case ReduceKind::kProd: {
          A acc = 1;
          visit([&](std::int64_t o) { acc *= load(o); });
          store(i, acc);
          break;
        }
        case ReduceKind::kMax:
        case ReduceKind::kMin: {
          const bool is_max = kind == ReduceKind::kMax;
          A acc;
          if constexpr (std::is_integral_v<C>) {
            acc = static_cast<A>(is_max ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max());
          } else {
            acc = is_max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
          }
          visit([&](std::int64_t o) {
            const A v = load(o);
            if constexpr (!std::is_integral_v<C>) {
              if (std::isnan(v)) {
                acc = v;
                return;
              }
              if (std::isnan(acc)) return;
            }
            acc = is_max ? std::max(acc, v) : std::min(acc, v);
          });
          store(i, acc);
          break;
        }
        case ReduceKind::kLogSumExp: {
          double m = -std::numeric_limits<double>::infinity();
          visit([&](std::int64_t o) { m = std::max(m, static_cast<double>(load(o))); });
          if (!std::isfinite(m)) {
            double sum = 0;
            visit([&](std::int64_t o) { sum += std::exp(static_cast<double>(load(o))); });
            store(i, std::log(sum));
            break;
          }
          double sum = 0;
          visit([&](std::int64_t o) { sum += std::exp(static_cast<double>(load(o)) - m); });
          store(i, std::log(sum) + m);
          break;
        }
      }
    });
  });
}

void arg_extreme(OpContext& ctx, bool is_max) {
  const Tensor& x = ctx.input(0);
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", 0), x.dim(), ctx.where());
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0;
  const bool last = ctx.attr_int("select_last_index", 0) != 0;
  XPURT_CHECK(x.shape()[us(axis)] > 0, ctx.where(), ": cannot take the arg", is_max ? "max" : "min",
              " of an empty axis ", axis);
  std::vector<bool> reduce_dim(x.shape().size(), false);
  reduce_dim[us(axis)] = true;
  const ReducePlan plan = plan_reduction(x.shape(), reduce_dim, keepdims);
  Tensor& out = ctx.allocate_output(0, plan.out_shape, DType::kInt64);
  auto* dst = data<std::int64_t>(out);
  const std::int64_t stride = plan.reduced_strides[0];
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = data<T>(x);
    for_each_reduction(plan, [&](std::int64_t i, auto&& visit) {
      std::int64_t best = -1;
      std::int64_t base = -1;
      visit([&](std::int64_t o) {
        if (base < 0) base = o;
        const std::int64_t k = (o - base) / stride;
        if (best < 0) {
          best = k;
          return;
        }
        const auto v = Compute<T>::load(src[o]);
        const auto b = Compute<T>::load(src[base + best * stride]);
        const bool better = is_max ? (v > b || (last && v == b)) : (v < b || (last && v == b));
        if (better) best = k;
      });
      dst[i] = best;
    });
  });
}

void top_k(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::int64_t axis = normalize_axis(ctx.attr_int("axis", -1), x.dim(), ctx.where());
  const std::int64_t k = ctx.opset() < 10 ? ctx.attr_int("k", -1)
                                          : detail::scalar_as_int64(ctx.input(1), ctx.where() + " K");
  const std::int64_t n = x.shape()[us(axis)];
  XPURT_CHECK(k >= 0 && k <= n, ctx.where(), ": k = ", k, " is not in [0, ", n, "] (axis ", axis, ")");
  const bool largest = ctx.attr_int("largest", 1) != 0;
  Shape shape = x.shape();
  shape[us(axis)] = k;
  Tensor& values = ctx.allocate_output(0, shape, x.dtype());
  Tensor indices_t = Tensor::empty(shape, DType::kInt64);
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= shape[us(d)];
  std::int64_t inner = 1;
  for (std::size_t d = us(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  auto* idx_out = data<std::int64_t>(indices_t);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = data<T>(x);
    T* dst = data<T>(values);
    ScratchVector<std::int64_t> order(us(n));
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t p = 0; p < inner; ++p) {
        auto at = [&](std::int64_t j) { return Compute<T>::load(src[(o * n + j) * inner + p]); };
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the lower index first.
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int64_t a, std::int64_t b) {
          const auto va = at(a), vb = at(b);
          if (va != vb) return largest ? va > vb : va < vb;
          return a < b;
        });
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t out = (o * k + j) * inner + p;
          dst[out] = src[(o * n + order[us(j)]) * inner + p];
          idx_out[out] = order[us(j)];
        }
      }
    }
  });
  ctx.set_output(1, indices_t);
}

void cum_sum(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::int64_t axis =
      normalize_axis(detail::scalar_as_int64(ctx.input(1), ctx.where() + " input 'axis'"), x.dim(),
                     ctx.where());
  const bool exclusive = ctx.attr_int("exclusive", 0) != 0;
  const bool reverse = ctx.attr_int("reverse", 0) != 0;
  Tensor& out = ctx.allocate_output(0, x.shape(), x.dtype());
  const std::int64_t n = x.shape()[us(axis)];
  std::int64_t outer = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= x.shape()[us(d)];
  std::int64_t inner = 1;
  for (std::size_t d = us(axis) + 1; d < x.shape().size(); ++d) inner *= x.shape()[d];
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    const T* src = data<T>(x);
    T* dst = data<T>(out);
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t p = 0; p < inner; ++p) {
        Acc<C> acc = 0;
        for (std::int64_t s = 0; s < n; ++s) {
          const std::int64_t j = reverse ? n - 1 - s : s;
          const std::int64_t at = (o * n + j) * inner + p;
          const auto v = static_cast<Acc<C>>(Compute<T>::load(src[at]));
          if (!exclusive) acc += v;
          dst[at] = Compute<T>::store(static_cast<C>(acc));
          if (exclusive) acc += v;
        }
      }
    }
  });
}

// Einsum: a loop over every label of the equation (output labels outside, summed labels inside). Labels are
// the equation's letters, plus one label per broadcast dimension of the ellipsis (ids 256 + i).

// The equation without spaces, and its input terms (the text before "->", split at commas).
struct EinsumEquation {
  std::string text;
  std::size_t arrow = std::string::npos;  // where "->" is
  std::vector<std::string> terms;
};

EinsumEquation read_einsum_equation(const OpContext& ctx) {
  EinsumEquation eq;
  for (char ch : ctx.attr_string("equation", "")) {
    if (ch != ' ') eq.text += ch;
  }
  XPURT_CHECK(!eq.text.empty(), ctx.where(), ": attribute 'equation' is required");
  eq.arrow = eq.text.find("->");
  const std::string lhs = eq.text.substr(0, eq.arrow);
  for (std::size_t start = 0;;) {
    const std::size_t comma = lhs.find(',', start);
    eq.terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return eq;
}

// A term's labels given the rank of its tensor (-1: the output, whose ellipsis width is known): the ellipsis
// stands for the last `width` of the `ellipsis_width` broadcast labels.
std::vector<int> einsum_term_labels(const OpContext& ctx, const EinsumEquation& eq, const std::string& term,
                                    std::int64_t rank, std::int64_t ellipsis_width) {
  std::vector<int> letters_before, letters_after;
  bool seen = false;
  for (std::size_t i = 0; i < term.size(); ++i) {
    if (term.compare(i, 3, "...") == 0) {
      XPURT_CHECK(!seen, ctx.where(), ": more than one ellipsis in term '", term, "'");
      seen = true;
      i += 2;
      continue;
    }
    const char ch = term[i];
    XPURT_CHECK(std::isalpha(static_cast<unsigned char>(ch)), ctx.where(), ": invalid character '", ch,
                "' in equation '", eq.text, "'");
    (seen ? letters_after : letters_before).push_back(static_cast<unsigned char>(ch));
  }
  const auto letters = static_cast<std::int64_t>(letters_before.size() + letters_after.size());
  const std::int64_t width = rank < 0 ? ellipsis_width : rank - letters;
  XPURT_CHECK(rank < 0 || width == 0 || (seen && width > 0), ctx.where(), ": term '", term, "' has ", letters,
              " labels for a tensor of rank ", rank);
  std::vector<int> labels = letters_before;
  if (seen) {
    for (std::int64_t i = 0; i < width; ++i) labels.push_back(static_cast<int>(256 + (ellipsis_width - width) + i));
  }
  labels.insert(labels.end(), letters_after.begin(), letters_after.end());
  return labels;
}

// What the contraction loops over (plan_einsum): the output labels and the summed ones, their sizes, and each
// input's strides along them (summed over repeated labels: diagonals; 0 where broadcast).
struct EinsumPlan {
  Shape out_shape, sum_shape;
  std::vector<Shape> out_strides, sum_strides;  // [input][label]
};

// Each input's strides along `labels`, given the inputs' labels.
std::vector<Shape> einsum_strides(const OpContext& ctx, const std::vector<std::vector<int>>& input_labels,
                                  const std::vector<int>& labels) {
  const std::size_t num = input_labels.size();
  std::vector<Shape> strides(num, Shape(labels.size(), 0));
  for (std::size_t t = 0; t < num; ++t) {
    const Shape in_strides = contiguous_strides(ctx.input(t).shape());
    for (std::size_t d = 0; d < input_labels[t].size(); ++d) {
      const auto pos = std::find(labels.begin(), labels.end(), input_labels[t][d]) - labels.begin();
      if (pos == static_cast<std::ptrdiff_t>(labels.size())) continue;
      if (ctx.input(t).shape()[d] != 1) strides[t][us(pos)] += in_strides[d];
    }
  }
  return strides;
}

// The output's labels: the equation's right-hand side, or without one the broadcast labels then the letters that
// appear once, in alphabetical order.
std::vector<int> einsum_output_labels(const OpContext& ctx, const EinsumEquation& eq, std::int64_t ellipsis_width,
                                      const std::map<int, std::int64_t>& size,
                                      const std::map<int, int>& occurrences) {
  std::vector<int> out_labels;
  if (eq.arrow != std::string::npos) {
    out_labels = einsum_term_labels(ctx, eq, eq.text.substr(eq.arrow + 2), -1, ellipsis_width);
    for (int label : out_labels) {
      XPURT_CHECK(size.count(label) != 0, ctx.where(), ": output label '", static_cast<char>(label),
                  "' does not appear in the inputs");
      XPURT_CHECK(std::count(out_labels.begin(), out_labels.end(), label) == 1, ctx.where(), ": output label '",
                  static_cast<char>(label), "' is repeated");
    }
  } else {
    for (std::int64_t i = 0; i < ellipsis_width; ++i) out_labels.push_back(static_cast<int>(256 + i));
    for (const auto& [label, count] : occurrences) {
      if (label < 256 && count == 1) out_labels.push_back(label);  // std::map: alphabetical (ASCII) order
    }
  }
  return out_labels;
}

EinsumPlan plan_einsum(const OpContext& ctx, const EinsumEquation& eq) {
  const std::size_t num = ctx.num_inputs();
  XPURT_CHECK(eq.terms.size() == num, ctx.where(), ": equation '", eq.text, "' has ", eq.terms.size(),
              " input terms, the node has ", num, " inputs");
  const DType dtype = ctx.input(0).dtype();
  std::int64_t ellipsis_width = 0;
  for (std::size_t t = 0; t < num; ++t) {
    XPURT_CHECK_TYPE(ctx.input(t).dtype() == dtype, ctx.where(), ": input ", t, " is ",
                     dtype_name(ctx.input(t).dtype()), ", input 0 is ", dtype_name(dtype));
    std::int64_t letters = 0;
    for (char ch : eq.terms[t]) letters += std::isalpha(static_cast<unsigned char>(ch)) ? 1 : 0;
    if (eq.terms[t].find("...") != std::string::npos) {
      ellipsis_width = std::max(ellipsis_width, ctx.input(t).dim() - letters);
    }
  }
  std::vector<std::vector<int>> input_labels;
  std::map<int, std::int64_t> size;   // label -> size
  std::map<int, int> occurrences;      // label -> how many times it appears in the inputs
  for (std::size_t t = 0; t < num; ++t) {
    const Tensor& in = ctx.input(t);
    input_labels.push_back(einsum_term_labels(ctx, eq, eq.terms[t], in.dim(), ellipsis_width));
    for (std::size_t d = 0; d < input_labels[t].size(); ++d) {
      const int label = input_labels[t][d];
      ++occurrences[label];
      const std::int64_t s = in.shape()[d];
      auto it = size.find(label);
      if (it == size.end() || it->second == 1) {
        size[label] = s;
      } else {
        XPURT_CHECK(s == it->second || s == 1, ctx.where(), ": label '",
                    label < 256 ? std::string(1, static_cast<char>(label)) : std::string("..."), "' has sizes ",
                    it->second, " and ", s);
      }
    }
  }
  const std::vector<int> out_labels = einsum_output_labels(ctx, eq, ellipsis_width, size, occurrences);
  std::vector<int> sum_labels;
  for (const auto& [label, s] : size) {
    if (std::find(out_labels.begin(), out_labels.end(), label) == out_labels.end()) sum_labels.push_back(label);
  }
  EinsumPlan plan;
  for (int label : out_labels) plan.out_shape.push_back(size[label]);
  for (int label : sum_labels) plan.sum_shape.push_back(size[label]);
  plan.out_strides = einsum_strides(ctx, input_labels, out_labels);
  plan.sum_strides = einsum_strides(ctx, input_labels, sum_labels);
  return plan;
}

// Every output element: the sum over the summed labels of the inputs' product, accumulated in Acc<C>.
template <typename T>
void contract_einsum(const OpContext& ctx, const EinsumPlan& plan, Tensor& out) {
  using C = typename Compute<T>::type;
  const std::size_t num = ctx.num_inputs();
  const std::int64_t sum_count = numel_of(plan.sum_shape);
  std::vector<const T*> srcs;
  for (std::size_t t = 0; t < num; ++t) srcs.push_back(data<T>(ctx.input(t)));
  T* dst = data<T>(out);
  const std::int64_t total = out.numel();
  // Odometers over the output and the summed labels that move each input's offset by its strides.
  Shape out_idx(plan.out_shape.size(), 0), sum_idx(plan.sum_shape.size(), 0);
  std::vector<std::int64_t> base(num, 0), offset(num, 0);
  auto advance = [&](Shape& idx, const Shape& shape, const std::vector<Shape>& strides,
                     std::vector<std::int64_t>& offsets) {
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) {
        for (std::size_t t = 0; t < num; ++t) offsets[t] += strides[t][d];
        return;
      }
      for (std::size_t t = 0; t < num; ++t) offsets[t] -= strides[t][d] * (shape[d] - 1);
      idx[d] = 0;
    }
  };
  for (std::int64_t linear = 0; linear < total; ++linear) {
    Acc<C> acc = 0;
    offset = base;
    for (std::int64_t s = 0; s < sum_count; ++s) {
      Acc<C> product = 1;
      for (std::size_t t = 0; t < num; ++t) product *= static_cast<Acc<C>>(Compute<T>::load(srcs[t][offset[t]]));
      acc += product;
      advance(sum_idx, plan.sum_shape, plan.sum_strides, offset);
    }
    dst[linear] = Compute<T>::store(static_cast<C>(acc));
    advance(out_idx, plan.out_shape, plan.out_strides, base);
  }
}

void einsum(OpContext& ctx) {
  const EinsumEquation eq = read_einsum_equation(ctx);
  const EinsumPlan plan = plan_einsum(ctx, eq);
  const DType dtype = ctx.input(0).dtype();
  Tensor& out = ctx.allocate_output(0, plan.out_shape, dtype);
  visit_dtype(dtype, [&](auto tag) { contract_einsum<decltype(tag)>(ctx, plan, out); });
}

}  // namespace

void register_tensor_reduce_ops(NodeKernelRegistrar& kernels) {
  struct Entry {
    const char* name;
    ReduceKind kind;
  };
  const Entry entries[] = {{"ReduceSum", ReduceKind::kSum},          {"ReduceMean", ReduceKind::kMean},
                           {"ReduceMax", ReduceKind::kMax},          {"ReduceMin", ReduceKind::kMin},
                           {"ReduceProd", ReduceKind::kProd},        {"ReduceL1", ReduceKind::kL1},
                           {"ReduceL2", ReduceKind::kL2},            {"ReduceLogSum", ReduceKind::kLogSum},
                           {"ReduceLogSumExp", ReduceKind::kLogSumExp}, {"ReduceSumSquare", ReduceKind::kSumSquare}};
  for (const Entry& e : entries) {
    // ReduceSum's axes became an input at opset 13, the others' at 18.
    const std::int64_t since = e.kind == ReduceKind::kSum ? 13 : 18;
    const ReduceKind kind = e.kind;
    kernels.add("", e.name, [kind, since](OpContext& ctx) { reduce(ctx, kind, since); });
  }
  kernels.add("", "ArgMax", [](OpContext& ctx) { arg_extreme(ctx, true); });
  kernels.add("", "ArgMin", [](OpContext& ctx) { arg_extreme(ctx, false); });
  kernels.add("", "TopK", top_k);
  kernels.add("", "CumSum", cum_sum);
  kernels.add("", "Einsum", einsum);
}

}  // namespace xpuruntime::onnx_ref
