// Note [Affine maps after a layer norm folded into it]
// A LayerNormalization over the last axis computes norm(x) * scale + bias with one scale and bias value per element
// of that axis. A Mul or an Add of a constant that varies only inside each normalized row (not across the rows, the
// samples) after it is the same kind of map, so it folds into the norm's scale and bias: (n s + b) c = n (s c) + b c
// and (n s + b) + c = n s + (b + c), computed once in double and rounded once to the norm's dtype. Reshapes between
// them do not stop the fold: a Reshape keeps the elements' order, so a constant broadcast over the reshaped value is
// read, element by element, as a vector over the normalized row, as long as the reshaped value's leading axes hold the
// rows (their product is the number of rows) and the constant is 1 along them. The Reshapes become one after the norm.
// PoolFormer's GroupNorm(1) (Note [Normalizations onto layer_norm]: a layer norm over [N, 1, C H W] without scale and
// bias, then the per-channel scale and bias on the [N, C, H, W] view, channels-last in a CUDA plan: Note [Per-sample
// normalizations are layout-free]) was the norm and two elementwise kernels, each a pass over the activations; now it
// is the norm alone, whose scale and bias are the per-channel values repeated over the H x W positions (C H W values
// each). Norms with a per-row affine of their own (the CPU's row_affine) keep theirs.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engines/native/passes/pass_utils.h"
#include "engines/native/passes/passes.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

// Constant `c` broadcast over a value of static shape `shape` whose first `lead` axes hold the norm's rows, as the
// vector of its values over one row (the remaining axes, row-major); nullopt when it varies along the leading axes
// or does not broadcast to `shape` without growing it.
std::optional<std::vector<double>> row_vector(const Tensor& c, const std::vector<std::int64_t>& shape,
                                              std::size_t lead) {
  const std::vector<std::int64_t>& cs = c.shape();
  if (cs.size() > shape.size()) return std::nullopt;
  const std::size_t pad = shape.size() - cs.size();
  std::vector<std::int64_t> dims(shape.size(), 1);  // c's shape aligned right
  for (std::size_t k = 0; k < cs.size(); ++k) dims[pad + k] = cs[k];
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (dims[k] != 1 && dims[k] != shape[k]) return std::nullopt;
    if (k < lead && dims[k] != 1 && shape[k] != 1) return std::nullopt;  // varies across the rows
  }
  std::vector<std::int64_t> strides(shape.size(), 0);  // c's strides over `shape`, 0 where it broadcasts
  std::int64_t stride = 1;
  for (std::size_t k = shape.size(); k-- > 0;) {
    strides[k] = dims[k] == 1 ? 0 : stride;
    stride *= dims[k];
  }
  const std::vector<double> values = to_doubles(c);
  std::int64_t row = 1;
  for (std::size_t k = lead; k < shape.size(); ++k) row *= shape[k];
  std::vector<double> out(static_cast<std::size_t>(row));
  for (std::int64_t i = 0; i < row; ++i) {
    std::int64_t rest = i, at = 0;
    for (std::size_t k = shape.size(); k-- > lead;) {
      at += rest % shape[k] * strides[k];
      rest /= shape[k];
    }
    out[static_cast<std::size_t>(i)] = values[static_cast<std::size_t>(at)];
  }
  return out;
}

// The number of leading axes of `shape` whose product is `rows`; nullopt when no prefix multiplies to it.
std::optional<std::size_t> row_axes(const std::vector<std::int64_t>& shape, std::int64_t rows) {
  std::int64_t p = 1;
  for (std::size_t k = 0; k <= shape.size(); ++k) {
    if (p == rows) return k;
    if (k == shape.size() || p > rows) break;
    p *= shape[k];
  }
  return std::nullopt;
}

// The norm's scale or bias as `length` doubles: `fill` when absent, a one-value constant repeated; nullopt when it is
// not a constant of 1 or `length` values.
std::optional<std::vector<double>> affine_values(const Graph& g, const Node& norm, std::size_t input,
                                                 std::int64_t length, double fill) {
  if (!norm.has_input(input)) return std::vector<double>(static_cast<std::size_t>(length), fill);
  const Tensor* t = constant(g, norm.inputs[input]);
  if (t == nullptr || (t->numel() != length && t->numel() != 1)) return std::nullopt;
  std::vector<double> v = to_doubles(*t);
  if (v.size() == 1) v.assign(static_cast<std::size_t>(length), v[0]);
  return v;
}

}  // namespace

PassResult norm_affine_folding(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"norm_affine_folding", 0, {}};
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t ni = 0; ni < g.nodes.size(); ++ni) {
    const Node& norm = g.nodes[ni];
    if (norm.op_type != "LayerNormalization" || (norm.domain != kXpurtDomain && !is_onnx(norm, "LayerNormalization")) ||
        rw.taken(ni) || norm.outputs.size() != 1 || norm.attrs.get_int("row_affine", 0) != 0) {
      continue;
    }
    const auto x_shape = static_shape(g, norm.inputs[0]);
    const auto dtype = value_dtype(g, norm.outputs[0]);
    if (!x_shape || x_shape->empty() || !dtype || !is_fusable_float(*dtype)) continue;
    const auto rank = static_cast<std::int64_t>(x_shape->size());
    const std::int64_t axis = norm.attrs.get_int("axis", -1);
    if (axis != -1 && axis != rank - 1) continue;  // the last axis alone: scale and bias are vectors over it
    const std::int64_t length = x_shape->back();
    const std::int64_t rows = length > 0 ? numel_of(*x_shape) / length : 0;
    auto scale = affine_values(g, norm, 1, length, 1.0);
    auto bias = affine_values(g, norm, 2, length, 0.0);
    if (!scale || !bias || rows == 0) continue;
    std::vector<std::size_t> pattern = {ni};
    std::vector<std::size_t> reshapes;
    std::string note = "folded into " + describe(norm) + ":";
    std::string out = norm.outputs[0];
    for (;;) {
      const ReshapeChain chain = reshape_chain(g, uses, rw, out);  // through the Reshapes that read it
      const std::string& at = chain.end;
      auto mi = sole_reader(g, uses, rw, at, "Mul");
      auto ai = mi ? std::nullopt : sole_reader(g, uses, rw, at, "Add");
      if (!mi && !ai) break;
      const Node& op = g.nodes[mi ? *mi : *ai];
      const Tensor* c = constant(g, other_input(op, at));
      const auto shape = static_shape(g, at);
      const auto op_shape = static_shape(g, op.outputs[0]);
      const auto lead = shape ? row_axes(*shape, rows) : std::nullopt;
      const auto op_dtype = value_dtype(g, op.outputs[0]);
      if (c == nullptr || !shape || !op_shape || *op_shape != *shape || !lead || !op_dtype || *op_dtype != *dtype) {
        break;
      }
      const auto v = row_vector(*c, *shape, *lead);
      if (!v) break;
      for (std::size_t i = 0; i < v->size(); ++i) {
        if (mi) (*scale)[i] *= (*v)[i];
        if (mi) (*bias)[i] *= (*v)[i];
        if (ai) (*bias)[i] += (*v)[i];
      }
      reshapes.insert(reshapes.end(), chain.reshapes.begin(), chain.reshapes.end());
      pattern.insert(pattern.end(), chain.reshapes.begin(), chain.reshapes.end());
      pattern.push_back(mi ? *mi : *ai);
      note += " " + describe(op);
      out = op.outputs[0];
    }
    const auto out_shape = static_shape(g, out);
    if (pattern.size() == 1 + reshapes.size() || !out_shape) continue;  // no Mul or Add folded
    Node folded = norm;
    folded.inputs = {norm.inputs[0],
                     add_constant(g, norm.name + "_folded_scale", from_doubles({length}, *dtype, *scale)),
                     add_constant(g, norm.name + "_folded_bias", from_doubles({length}, *dtype, *bias))};
    std::vector<Node> replacement;
    if (*out_shape == *x_shape) {
      folded.outputs = {out};
      replacement.push_back(std::move(folded));
    } else {  // one Reshape of the norm's output in place of the chain
      replacement.push_back(std::move(folded));
      replacement.push_back(reshape_node(g, norm.name + "_folded_view", norm.outputs[0], *out_shape, out));
      note += detail::str_cat(" (", reshapes.size(), " Reshape(s) as one after it)");
    }
    rw.replace(pattern, std::move(replacement), note);
  }
  rw.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
