// Transformer fusions: gelu_fusion -> com.xpuruntime:Gelu, layer_norm_fusion -> com.xpuruntime:LayerNormalization,
// attention_fusion -> com.xpuruntime:Attention (see passes.h, docs/native_engine.md).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/attention_layout.h"
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

// A pattern being matched: its nodes (indices) and a note.
struct Match {
  std::vector<std::size_t> nodes;
  std::vector<std::string> parts;
  void add(const Graph& g, std::size_t i) {
    nodes.push_back(i);
    parts.push_back(describe(g.nodes[i]));
  }
  std::string note(const std::string& fused) const {
    std::string s = "fused ";
    for (std::size_t k = 0; k < parts.size(); ++k) s += (k ? " + " : "") + parts[k];
    return s + " -> " + fused;
  }
};

class Matcher {
 public:
  Matcher(const Graph& g, const Uses& uses, const Rewriter& rw) : g_(g), uses_(uses), rw_(rw) {}

  // The only reader of `value` if it is an ONNX `op_type` node not taken yet.
  std::optional<std::size_t> sole_reader(const std::string& value, const char* op_type) const {
    return internal::sole_reader(g_, uses_, rw_, value, op_type);
  }
  // The producer of `value` when it is an ONNX `op_type` node whose output only `reader` reads.
  std::optional<std::size_t> sole_producer(const std::string& value, std::size_t reader, const char* op_type) const {
    auto p = uses_.producer(value);
    if (!p || rw_.taken(*p) || !is_onnx(g_.nodes[*p], op_type) || !uses_.only_reader(value, reader)) {
      return std::nullopt;
    }
    return p;
  }
  const Node& node(std::size_t i) const { return g_.nodes[i]; }

 private:
  const Graph& g_;
  const Uses& uses_;
  const Rewriter& rw_;
};

// ---- GELU ----

// The end of a GELU formula after t = 1 + erf(..) (or 1 + tanh(..)) is computed: t * x * 0.5 in the operand
// orders exporters produce: (x * t) * 0.5, (x * 0.5) * t, (t * 0.5) * x (and their commuted forms). Returns the
// pattern's output value.
std::optional<std::string> match_gelu_tail(const Graph& g, const Matcher& m, const std::string& t, const std::string& x,
                                           Match& match) {
  auto m1 = m.sole_reader(t, "Mul");
  if (!m1) return std::nullopt;
  const Node& mul1 = m.node(*m1);
  const std::string other = other_input(mul1, t);
  if (other.empty()) return std::nullopt;
  if (other == x || scalar_operand(g, mul1, "Mul", 0.5) >= 0) {
    // (x * t) * 0.5 or (t * 0.5) * x
    const bool with_x = other == x;
    auto m2 = with_x ? std::nullopt : m.sole_reader(mul1.outputs[0], "Mul");
    if (with_x) {
      auto r = m.sole_reader(mul1.outputs[0], "Mul");
      if (!r || scalar_operand(g, m.node(*r), "Mul", 0.5) < 0) return std::nullopt;
      m2 = r;
    } else if (!m2 || other_input(m.node(*m2), mul1.outputs[0]) != x) {
      return std::nullopt;
    }
    match.add(g, *m1);
    match.add(g, *m2);
    return m.node(*m2).outputs[0];
  }
  // (x * 0.5) * t
  auto h = m.sole_producer(other, *m1, "Mul");
  if (!h) return std::nullopt;
  const Node& half = m.node(*h);
  const int xi = scalar_operand(g, half, "Mul", 0.5);
  if (xi < 0 || half.inputs[static_cast<std::size_t>(xi)] != x) return std::nullopt;
  match.add(g, *h);
  match.add(g, *m1);
  return mul1.outputs[0];
}

// x / sqrt(2) (Div) or x * (1 / sqrt(2)) (Mul) feeding Erf `ei`: returns x.
std::optional<std::string> match_erf_input(const Graph& g, const Matcher& m, std::size_t ei, Match& match) {
  const std::string in = m.node(ei).inputs[0];
  if (auto d = m.sole_producer(in, ei, "Div")) {
    const Node& div = m.node(*d);
    const auto c = div.inputs.size() == 2 ? scalar_constant(g, div.inputs[1]) : std::nullopt;
    if (c && near(*c, std::sqrt(2.0)) && !is_constant(g, div.inputs[0])) {
      match.add(g, *d);
      return div.inputs[0];
    }
  }
  if (auto mi = m.sole_producer(in, ei, "Mul")) {
    const int xi = scalar_operand(g, m.node(*mi), "Mul", 1.0 / std::sqrt(2.0));
    if (xi >= 0) {
      match.add(g, *mi);
      return m.node(*mi).inputs[static_cast<std::size_t>(xi)];
    }
  }
  return std::nullopt;
}

// x^3 as Pow(x, 3), x * (x * x) or (x * x) * x producing `value` (read only by `reader`).
bool match_cube(const Graph& g, const Matcher& m, const std::string& value, std::size_t reader, const std::string& x,
                Match& match) {
  if (auto p = m.sole_producer(value, reader, "Pow")) {
    const Node& pow = m.node(*p);
    auto e = pow.inputs.size() == 2 ? scalar_constant(g, pow.inputs[1]) : std::nullopt;
    if (pow.inputs[0] == x && e && *e == 3.0) {
      match.add(g, *p);
      return true;
    }
    return false;
  }
  auto outer = m.sole_producer(value, reader, "Mul");
  if (!outer) return false;
  const Node& mul = m.node(*outer);
  const std::string square = other_input(mul, x);
  auto inner = square.empty() ? std::nullopt : m.sole_producer(square, *outer, "Mul");
  if (!inner || m.node(*inner).inputs != std::vector<std::string>{x, x}) return false;
  match.add(g, *inner);
  match.add(g, *outer);
  return true;
}

// sqrt(2/pi) * (x + 0.044715 * x^3) feeding Tanh `ti`: returns x.
std::optional<std::string> match_tanh_input(const Graph& g, const Matcher& m, std::size_t ti, Match& match) {
  const std::string in = m.node(ti).inputs[0];
  auto s = m.sole_producer(in, ti, "Mul");
  if (!s) return std::nullopt;
  const int ui = scalar_operand(g, m.node(*s), "Mul", std::sqrt(2.0 / M_PI));
  if (ui < 0) return std::nullopt;
  const std::string u = m.node(*s).inputs[static_cast<std::size_t>(ui)];
  auto a = m.sole_producer(u, *s, "Add");
  if (!a) return std::nullopt;
  const Node& add = m.node(*a);
  if (add.inputs.size() != 2) return std::nullopt;
  for (std::size_t k = 0; k < 2; ++k) {
    const std::string x = add.inputs[k];
    const std::string v = add.inputs[1 - k];
    auto c = m.sole_producer(v, *a, "Mul");
    if (!c) continue;
    const int pi = scalar_operand(g, m.node(*c), "Mul", 0.044715);
    if (pi < 0) continue;
    Match cube;
    if (!match_cube(g, m, m.node(*c).inputs[static_cast<std::size_t>(pi)], *c, x, cube)) continue;
    match.nodes.insert(match.nodes.end(), cube.nodes.begin(), cube.nodes.end());
    match.parts.insert(match.parts.end(), cube.parts.begin(), cube.parts.end());
    match.add(g, *c);
    match.add(g, *a);
    match.add(g, *s);
    return x;
  }
  return std::nullopt;
}

Node make_node(const std::string& name, const std::string& op_type, std::vector<std::string> inputs,
               std::vector<std::string> outputs) {
  Node n;
  n.name = name;
  n.domain = kXpurtDomain;
  n.op_type = op_type;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

bool fusable_input(const Graph& g, const std::string& x) {
  auto dtype = value_dtype(g, x);
  return dtype && is_fusable_float(*dtype);
}

// The pattern's output keeps the input's type (no broadcast against a constant grew it), when both are known.
bool keeps_shape(const Graph& g, const std::string& x, const std::string& out) {
  auto tx = value_type(g, x);
  auto to = value_type(g, out);
  if (!tx || !to || !tx->has_shape || !to->has_shape) return true;
  return tx->shape.size() == to->shape.size();
}

// ---- LayerNorm ----

// The axes of a ReduceMean (attribute before opset 18, input from 18); nullopt when absent (all axes, or none with
// noop_with_empty_axes) or not constant.
std::optional<std::vector<std::int64_t>> reduce_axes(const Graph& g, const Node& n) { return constant_axes(g, n, 18); }

// ReduceMean over the last axis only, keepdims=1.
bool reduces_last_axis(const Graph& g, const Node& n, std::int64_t rank) {
  if (n.attrs.get_int("keepdims", 1) != 1) return false;
  auto axes = reduce_axes(g, n);
  if (!axes || axes->size() != 1) return false;
  return (*axes)[0] == -1 || (rank > 0 && (*axes)[0] == rank - 1);
}

// A scale or bias of a LayerNorm over the last axis of size `d`: a value of shape [d] (a constant may also have
// leading 1s: reshaped to [d]). Returns the name to use, or nullopt.
std::optional<std::string> norm_parameter(Graph& g, const std::string& value, std::int64_t d, DType dtype,
                                          const std::string& hint) {
  auto shape = static_shape(g, value);
  auto vdtype = value_dtype(g, value);
  if (!shape || !vdtype || *vdtype != dtype || shape->empty() || shape->back() != d) return std::nullopt;
  for (std::size_t i = 0; i + 1 < shape->size(); ++i) {
    if ((*shape)[i] != 1) return std::nullopt;
  }
  if (shape->size() == 1) return value;
  const Tensor* c = constant(g, value);
  if (c == nullptr) return std::nullopt;
  return add_constant(g, hint, from_doubles({d}, dtype, to_doubles(*c)));
}

// ---- Attention ----

// A Div or Mul by a positive finite one-element constant (a divisor only as Div's second input): the index of
// the other input and the factor it multiplies by (1/c for Div).
std::optional<std::pair<std::size_t, double>> scale_operand(const Graph& g, const Node& n) {
  if (n.inputs.size() != 2) return std::nullopt;
  const bool div = n.op_type == "Div";
  for (std::size_t k = div ? 1 : 0; k < 2; ++k) {
    const Tensor* c = constant(g, n.inputs[k]);
    if (c == nullptr || c->numel() != 1 || c->dim() > 1 || is_constant(g, n.inputs[1 - k])) continue;
    auto v = scalar_constant(g, n.inputs[k]);
    if (v && std::isfinite(*v) && *v > 0) return std::make_pair(1 - k, div ? 1.0 / *v : *v);
  }
  return std::nullopt;
}

// Note [Per-head scales of the scores]
// Swin V2's cosine attention multiplies the scores by a learnt temperature per head, exp(clamp(logit_scale)) of
// shape [H, 1, 1], before adding its position bias: softmax((q_n k_n^T) * s + b). A factor that is constant along
// both score axes is a factor of Q: (q k^T) * s = (q * s) k^T, s broadcast over [B, H, Sq, D] as it was over the
// scores. attention_fusion takes a Mul of the scores by such a tensor (rank <= 4, its last two dims 1, every other
// dim 1 or the scores' own, of the scores' type) and gives the Attention q * s through a Mul beside it: an
// elementwise pass over Q's B * H * Sq * D elements, which elementwise fusion joins to Q's producer where it can,
// against the scores' B * H * Sq * Sk. The product rounds q * s to Q's type where the unfused chain rounded q k^T and
// its product with s: a rounding of Q's size either way. Not with merged batch dims or promoted scores, and not a
// factor computed from the scores themselves.

// Whether `value` is computed from node `node`'s outputs (or may be: past 64 producers it says so): a per-head
// scale computed from the scores cannot move onto Q (Note [Per-head scales of the scores]).
bool depends_on(const Graph& g, const Uses& uses, const std::string& value, std::size_t node) {
  std::vector<std::string> todo = {value};
  std::set<std::string> seen;
  while (!todo.empty()) {
    const std::string v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (seen.size() > 64) return true;
    const auto p = uses.producer(v);
    if (!p) continue;
    if (*p == node) return true;
    for (const std::string& in : g.nodes[*p].inputs) {
      if (!in.empty()) todo.push_back(in);
    }
  }
  return false;
}

// A Mul of the scores by a per-head scale (Note [Per-head scales of the scores]): the scale's input index.
std::optional<std::size_t> head_scale_operand(const Graph& g, const Node& n) {
  if (!is_onnx(n, "Mul") || n.inputs.size() != 2 || n.inputs[0] == n.inputs[1]) return std::nullopt;
  const auto out = value_type(g, n.outputs[0]);
  if (!out || !out->has_shape || out->shape.size() != 4) return std::nullopt;
  for (std::size_t k = 0; k < 2; ++k) {
    const auto t = value_type(g, n.inputs[k]);
    const auto other = value_type(g, n.inputs[1 - k]);
    if (!t || !other || !t->has_shape || t->shape.size() < 2 || t->shape.size() > 4 || t->dtype != other->dtype ||
        !other->has_shape || other->shape.size() != 4) {
      continue;
    }
    bool fits = true;
    const std::size_t offset = 4 - t->shape.size();
    for (std::size_t d = 0; d < t->shape.size(); ++d) {
      const Dim& td = t->shape[d];
      const bool one = td.known() && td.value == 1;
      fits = fits && (one || (offset + d < 2 && same_dim(td, other->shape[offset + d])));
    }
    if (fits) return k;
  }
  return std::nullopt;
}

bool same_dims(const std::vector<Dim>& a, const std::vector<std::size_t>& ai, const std::vector<Dim>& b,
               const std::vector<std::size_t>& bi) {
  for (std::size_t k = 0; k < ai.size(); ++k) {
    if (!same_dim(a[ai[k]], b[bi[k]])) return false;
  }
  return true;
}

// Note [The NaN guard of fully masked rows]
// PyTorch's exporters (TorchScript and dynamo alike) write scaled_dot_product_attention's softmax as
//   p = Softmax(scores + mask); Where(IsNaN(p), 0, p) -> MatMul(., v)
// with the 0 a float constant of p's type (a 1-element Constant in the TorchScript exports, a scalar initializer in
// the dynamo ones): the guard zeroes the rows whose softmax is NaN. With finite q and k (so finite scores) and a mask
// of finite values and -inf, a row is NaN only where the mask is -inf at every key, and a softmax row is NaN entirely
// or not at all; so the guarded chain is the Attention op with fully_masked_rows="zero" (Note [Fully masked attention
// rows] in cpu_attention.cpp), exactly, whenever v is finite too (the guard's 0 times v). attention_fusion therefore takes the guard in two ways:
//  * a mask that cannot hold -inf (finite_mask: a finite constant, Where of finite constants, and views of those):
//    no row is fully masked, the guard changes nothing, and the Attention is the plain one;
//  * any other mask (the TorchScript exports' Where(bool, 0, -inf) padding and causal masks, a mask that is a graph
//    input or computed at run time): the Attention with fully_masked_rows="zero". Until 2026-12 these stayed
//    unfused (the guard was only dropped where it was provably a no-op): BERT, CLIP's text encoder, DistilBERT,
//    GPT-2, Llama and RoBERTa as the TorchScript exporter writes them.
// Where the two differ: a NaN or +inf score (NaN or infinite q, k or mask, or float16 scores that overflow in the
// unfused MatMul) makes the unfused row NaN and the guard then 0, while the fused row is NaN (a NaN input) or finite
// (the kernels accumulate the scores in float32: no overflow). Neither is an input a model is meant to see.
//
// Where(IsNaN(p), 0, p) reading the softmax output `p` (its only readers): the IsNaN and Where nodes (Note [The NaN
// guard of fully masked rows]).
std::optional<std::pair<std::size_t, std::size_t>> nan_guard(const Graph& g, const Uses& uses, const Matcher& m,
                                                             const std::string& p) {
  const auto& readers = uses.readers(p);
  if (readers.size() != 2) return std::nullopt;
  for (std::size_t k = 0; k < 2; ++k) {
    const Node& isnan = g.nodes[readers[k]];
    const Node& where = g.nodes[readers[1 - k]];
    if (!is_onnx(isnan, "IsNaN") || !is_onnx(where, "Where") || where.inputs.size() != 3) continue;
    if (where.inputs[0] != isnan.outputs[0] || where.inputs[2] != p || where.inputs[1] == p) continue;
    auto zero = scalar_constant(g, where.inputs[1]);
    if (!zero || *zero != 0.0 || !m.sole_reader(isnan.outputs[0], "Where")) continue;
    return std::make_pair(readers[k], readers[1 - k]);
  }
  return std::nullopt;
}

// Whether an additive mask can hold no infinity: a finite constant, Where(c, a, b) of finite constants, or such a
// value reshaped, expanded or unsqueezed (up to `depth` nodes back).
bool finite_mask(const Graph& g, const Uses& uses, const std::string& mask, int depth) {
  if (const Tensor* c = constant(g, mask)) {
    for (double v : to_doubles(*c)) {
      if (!std::isfinite(v)) return false;
    }
    return true;
  }
  auto p = uses.producer(mask);
  if (!p || depth == 0) return false;
  const Node& n = g.nodes[*p];
  if (is_onnx(n, "Where") && n.inputs.size() == 3) {
    return finite_mask(g, uses, n.inputs[1], 0) && finite_mask(g, uses, n.inputs[2], 0);
  }
  for (const char* op : {"Expand", "Reshape", "Unsqueeze", "Identity"}) {
    if (is_onnx(n, op) && !n.inputs.empty()) return finite_mask(g, uses, n.inputs[0], depth - 1);
  }
  return false;
}

// K^T computed as Reshape(Transpose(Reshape(K, [B*H, S, D]), perm=[0, 2, 1]), [B, H, D, S]) from a 4-D K
// [B, H, S, D]: returns K and the chain's nodes (the outer Reshape first); nullopt for anything else. Row-major
// reshapes make the values those of K's last two axes swapped whenever the shapes are these.
std::optional<std::pair<std::string, std::vector<std::size_t>>> merged_heads_transpose(const Graph& g,
                                                                                       const Uses& uses,
                                                                                       const std::string& kt) {
  auto outer = uses.producer(kt);
  if (!outer || !is_onnx(g.nodes[*outer], "Reshape")) return std::nullopt;
  auto t = uses.producer(g.nodes[*outer].inputs[0]);
  if (!t || !is_onnx(g.nodes[*t], "Transpose") ||
      g.nodes[*t].attrs.get_ints("perm", {}) != std::vector<std::int64_t>{0, 2, 1}) {
    return std::nullopt;
  }
  auto inner = uses.producer(g.nodes[*t].inputs[0]);
  if (!inner || !is_onnx(g.nodes[*inner], "Reshape")) return std::nullopt;
  const std::string& k = g.nodes[*inner].inputs[0];
  auto tk = value_type(g, k), tm = value_type(g, g.nodes[*inner].outputs[0]), tkt = value_type(g, kt);
  if (!tk || !tm || !tkt || !tk->has_shape || !tm->has_shape || !tkt->has_shape) return std::nullopt;
  if (tk->shape.size() != 4 || tm->shape.size() != 3 || tkt->shape.size() != 4) return std::nullopt;
  const auto& K = tk->shape;
  const auto& M = tm->shape;
  const auto& KT = tkt->shape;
  // [B,H,S,D] -> [B*H,S,D]: the last two kept (then the first is B*H); -> [B,H,D,S].
  if (!same_dim(M[1], K[2]) || !same_dim(M[2], K[3])) return std::nullopt;
  if (!same_dim(KT[0], K[0]) || !same_dim(KT[1], K[1]) || !same_dim(KT[2], K[3]) || !same_dim(KT[3], K[2])) {
    return std::nullopt;
  }
  return std::make_pair(k, std::vector<std::size_t>{*outer, *t, *inner});
}

}  // namespace

PassResult gelu_fusion(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"gelu_fusion", 0, {}};
  Rewriter rw(g);
  const Uses uses(g);
  const Matcher m(g, uses, rw);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (rw.taken(i)) continue;
    if (is_onnx(n, "Gelu") && n.inputs.size() == 1 && n.outputs.size() == 1 && fusable_input(g, n.inputs[0])) {
      const std::string approximate = n.attrs.get_string("approximate", "none");
      if (approximate != "none" && approximate != "tanh") continue;
      Node fused = make_node(n.name, "Gelu", n.inputs, n.outputs);
      fused.attrs.set("approximate", approximate);
      rw.replace({i}, {std::move(fused)}, "replaced " + describe(n) + " -> Gelu '" + n.name + "'");
      continue;
    }
    const bool erf = is_onnx(n, "Erf");
    if ((!erf && !is_onnx(n, "Tanh")) || n.inputs.size() != 1) continue;
    Match match;
    auto x = erf ? match_erf_input(g, m, i, match) : match_tanh_input(g, m, i, match);
    if (!x || !fusable_input(g, *x)) continue;
    match.add(g, i);
    auto one = m.sole_reader(n.outputs[0], "Add");
    if (!one || scalar_operand(g, m.node(*one), "Add", 1.0) < 0) continue;
    match.add(g, *one);
    auto out = match_gelu_tail(g, m, m.node(*one).outputs[0], *x, match);
    if (!out || !keeps_shape(g, *x, *out) || rw.any_taken(match.nodes)) continue;
    const std::string name = g.nodes[match.nodes.front()].name;
    Node fused = make_node(name, "Gelu", {*x}, {*out});
    fused.attrs.set("approximate", erf ? "none" : "tanh");
    rw.replace(match.nodes, {std::move(fused)}, match.note("Gelu '" + name + "'"));
  }
  rw.apply(result);
  return result;
}

PassResult layer_norm_fusion(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"layer_norm_fusion", 0, {}};
  Rewriter rw(g);
  const Uses uses(g);
  const Matcher m(g, uses, rw);
  std::set<std::string> reshaped;  // parameters made for patterns (dropped again when the pattern did not match)
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (rw.taken(i)) continue;
    const Node& first = g.nodes[i];
    if (is_onnx(first, "LayerNormalization") && first.inputs.size() >= 2 && !first.outputs.empty()) {
      bool extra_used = false;
      for (std::size_t k = 1; k < first.outputs.size(); ++k) {
        extra_used = extra_used || (!first.outputs[k].empty() && !uses.unused(first.outputs[k]));
      }
      auto x_type = value_type(g, first.inputs[0]);
      if (extra_used || !x_type || !x_type->has_shape || !is_fusable_float(x_type->dtype)) continue;
      const auto rank = static_cast<std::int64_t>(x_type->shape.size());
      std::int64_t axis = first.attrs.get_int("axis", -1);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis >= rank) continue;
      // The registry op takes scale/bias of exactly x.shape[axis:].
      bool params_ok = true;
      for (std::size_t k = 1; k < first.inputs.size() && k < 3; ++k) {
        if (!first.has_input(k)) continue;
        auto p = value_type(g, first.inputs[k]);
        std::vector<Dim> tail(x_type->shape.begin() + axis, x_type->shape.end());
        ValueType want = *x_type;
        want.shape = tail;
        params_ok = params_ok && p && p->dtype == x_type->dtype && same_shape(*p, want);
      }
      if (!params_ok) continue;
      std::vector<std::string> inputs(first.inputs.begin(),
                                      first.inputs.begin() + std::min<std::size_t>(3, first.inputs.size()));
      Node fused = make_node(first.name, "LayerNormalization", inputs, {first.outputs[0]});
      fused.attrs.set("axis", axis);
      fused.attrs.set("epsilon", first.attrs.get_float("epsilon", 1e-5));
      rw.replace({i}, {std::move(fused)},
                 "replaced " + describe(first) + " -> LayerNormalization '" + first.name + "'");
      continue;
    }
    // ReduceMean(x) -> Sub(x, mean) -> Pow(d, 2) | Mul(d, d) -> ReduceMean -> Add(eps) -> Sqrt -> Div(d, .)
    if (!is_onnx(first, "ReduceMean") || first.inputs.empty() || first.outputs.size() != 1) continue;
    const std::string x = first.inputs[0];
    auto x_type = value_type(g, x);
    if (!x_type || !x_type->has_shape || x_type->shape.empty() || !is_fusable_float(x_type->dtype)) continue;
    const auto rank = static_cast<std::int64_t>(x_type->shape.size());
    const Dim last = x_type->shape.back();
    if (!reduces_last_axis(g, first, rank) || !last.known()) continue;
    Match match;
    match.add(g, i);
    auto si = m.sole_reader(first.outputs[0], "Sub");
    if (!si || m.node(*si).inputs != std::vector<std::string>{x, first.outputs[0]}) continue;
    match.add(g, *si);
    const std::string d = m.node(*si).outputs[0];
    const auto& d_readers = uses.readers(d);
    if (d_readers.size() != 2 || uses.is_graph_output(d) || uses.read_by_subgraph(d)) continue;
    std::optional<std::size_t> square, divide;
    for (std::size_t r : d_readers) {
      const Node& rn = g.nodes[r];
      if (rw.taken(r)) continue;
      if (is_onnx(rn, "Div") && rn.inputs.size() == 2 && rn.inputs[0] == d && rn.inputs[1] != d) divide = r;
      if (is_onnx(rn, "Mul") && rn.inputs == std::vector<std::string>{d, d}) square = r;
      if (is_onnx(rn, "Pow") && rn.inputs.size() == 2 && rn.inputs[0] == d) {
        auto e = scalar_constant(g, rn.inputs[1]);
        if (e && *e == 2.0) square = r;
      }
    }
    if (!square || !divide) continue;
    match.add(g, *square);
    auto r2 = m.sole_reader(m.node(*square).outputs[0], "ReduceMean");
    if (!r2 || !reduces_last_axis(g, m.node(*r2), rank)) continue;
    match.add(g, *r2);
    auto ai = m.sole_reader(m.node(*r2).outputs[0], "Add");
    if (!ai) continue;
    const std::string eps_name = other_input(m.node(*ai), m.node(*r2).outputs[0]);
    const Tensor* eps_tensor = constant(g, eps_name);
    auto eps = scalar_constant(g, eps_name);
    if (!eps || eps_tensor->dim() > 1 || *eps < 0) continue;
    match.add(g, *ai);
    auto sq = m.sole_reader(m.node(*ai).outputs[0], "Sqrt");
    if (!sq || m.node(*divide).inputs[1] != m.node(*sq).outputs[0] ||
        !uses.only_reader(m.node(*sq).outputs[0], *divide)) {
      continue;
    }
    match.add(g, *sq);
    match.add(g, *divide);
    std::string out = m.node(*divide).outputs[0];
    std::string scale, bias;
    if (auto mi = m.sole_reader(out, "Mul")) {
      auto name = norm_parameter(g, other_input(m.node(*mi), out), last.value, x_type->dtype, first.name + "_scale");
      if (name) {
        if (*name != other_input(m.node(*mi), out)) reshaped.insert(*name);
        scale = *name;
        match.add(g, *mi);
        out = m.node(*mi).outputs[0];
      }
    }
    if (auto bi = m.sole_reader(out, "Add")) {
      auto name = norm_parameter(g, other_input(m.node(*bi), out), last.value, x_type->dtype, first.name + "_bias");
      if (name) {
        if (*name != other_input(m.node(*bi), out)) reshaped.insert(*name);
        bias = *name;
        match.add(g, *bi);
        out = m.node(*bi).outputs[0];
      }
    }
    if (rw.any_taken(match.nodes)) continue;
    std::vector<std::string> inputs = {x, scale, bias};
    while (inputs.back().empty()) inputs.pop_back();
    Node fused = make_node(first.name, "LayerNormalization", inputs, {out});
    fused.attrs.set("axis", static_cast<std::int64_t>(-1));
    fused.attrs.set("epsilon", *eps);
    rw.replace(match.nodes, {std::move(fused)}, match.note("LayerNormalization '" + first.name + "'"));
  }
  rw.apply(result);
  remove_unused_constants(g, reshaped);
  return result;
}

namespace {

// Note [Grouped-query attention reads its kv heads]
// Grouped-query attention as transformers writes it (repeat_kv) gives each of the Hkv key and value heads to r query
// heads by copying: Unsqueeze(kv [B, Hkv, S, D], 2) -> Expand to [B, Hkv, r, S, D] -> Reshape to [B, Hkv * r, S, D],
// so that head h reads kv head h / r. The Attention op does that itself from kv [B, Hkv, S, D] (head h reads kv head
// h / (H / Hkv)): an Attention whose k or v comes out of that chain, read by nothing else, reads the chain's input
// instead, and the two copies per layer go. The shapes are what is checked (the plan's shapes are static): a size-1
// axis inserted anywhere among the 1s, broadcast along axis 2 only, axes 1 and 2 merged.
std::optional<std::string> repeated_kv_source(const Graph& g, const Uses& uses, std::size_t attention,
                                              const std::string& value, std::vector<std::size_t>* chain) {
  auto reshape = uses.producer(value);
  if (!reshape || !is_onnx(g.nodes[*reshape], "Reshape") || !uses.only_reader(value, attention)) return std::nullopt;
  const std::string& expanded = g.nodes[*reshape].inputs[0];
  auto expand = uses.producer(expanded);
  if (!expand || !is_onnx(g.nodes[*expand], "Expand") || !uses.only_reader(expanded, *reshape)) return std::nullopt;
  const std::string& unsqueezed = g.nodes[*expand].inputs[0];
  auto unsqueeze = uses.producer(unsqueezed);
  if (!unsqueeze || !is_onnx(g.nodes[*unsqueeze], "Unsqueeze") || !uses.only_reader(unsqueezed, *expand)) {
    return std::nullopt;
  }
  const std::string& source = g.nodes[*unsqueeze].inputs[0];
  auto kv = static_shape(g, source), u = static_shape(g, unsqueezed), e = static_shape(g, expanded),
       r = static_shape(g, value);
  if (!kv || !u || !e || !r || kv->size() != 4 || u->size() != 5 || e->size() != 5 || r->size() != 4) {
    return std::nullopt;
  }
  const std::vector<std::int64_t> want_u = {(*kv)[0], (*kv)[1], 1, (*kv)[2], (*kv)[3]};
  const std::vector<std::int64_t> want_e = {(*kv)[0], (*kv)[1], (*e)[2], (*kv)[2], (*kv)[3]};
  const std::vector<std::int64_t> want_r = {(*kv)[0], (*kv)[1] * (*e)[2], (*kv)[2], (*kv)[3]};
  if (*u != want_u || *e != want_e || *r != want_r) return std::nullopt;
  chain->insert(chain->end(), {*unsqueeze, *expand, *reshape});
  return source;
}

void fold_repeated_kv_heads(Graph& g, PassResult& result) {  // Note [Grouped-query attention reads its kv heads]
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& a = g.nodes[i];
    if (a.domain != kXpurtDomain || a.op_type != "Attention" || a.inputs.size() < 3) continue;
    std::vector<std::size_t> nodes;
    auto k = repeated_kv_source(g, uses, i, a.inputs[1], &nodes);
    auto v = k ? repeated_kv_source(g, uses, i, a.inputs[2], &nodes) : std::nullopt;
    if (!k || !v || a.inputs[1] == a.inputs[2] || rw.any_taken(nodes)) continue;
    Node folded = a;
    folded.inputs[1] = *k;
    folded.inputs[2] = *v;
    nodes.push_back(i);
    rw.replace(nodes, {std::move(folded)},
               "grouped-query attention: Attention '" + a.name + "' reads kv heads " + *k + " and " + *v +
                   " (the repeat_kv Unsqueeze/Expand/Reshape copies removed)");
  }
  rw.apply(result);
}

// Note [Attention reads the heads where the projections wrote them]
// Exporters move heads in and out of attention with transposes: q, k and v are projections [B, S, H * D] reshaped
// to [B, S, H, D] and transposed to [B, H, S, D] (k also through the K^T forms attention_fusion reads, which leave
// the same Transpose), and the output [B, H, S, Dv] is transposed back to [B, S, H, Dv] before its reshape to
// [B, S, H * Dv]: four strided copies of whole activations per layer. The attention kernels read and write either
// layout (Note [Attention layouts] in core/attention_layout.h), so an Attention whose q, k or v is a
// Transpose(perm 0, 2, 1, 3) that nothing else reads reads the transpose's input and sets that tensor's `bshd`
// flag, and an Attention whose only reader is such a Transpose (and that has no log-sum-exp output) writes the
// transpose's output with the output's flag set. The transposes go; the values the rest of the graph sees are
// the same. A transpose that something else also reads stays (the copy is needed anyway).
bool is_head_transpose(const Node& n) {
  return is_onnx(n, "Transpose") && n.inputs.size() == 1 &&
         n.attrs.get_ints("perm", {}) == std::vector<std::int64_t>{0, 2, 1, 3};
}

void fold_head_transposes(Graph& g, PassResult& result) {  // Note [Attention reads the heads where ...]
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& a = g.nodes[i];
    if (a.domain != kXpurtDomain || a.op_type != "Attention" || a.inputs.size() < 3) continue;
    std::vector<std::int64_t> flags = a.attrs.get_ints("bshd", {0, 0, 0, 0});
    if (flags.size() != 4) continue;
    Node folded = a;
    std::vector<std::size_t> nodes;
    std::vector<std::string> moved;
    for (std::size_t t = 0; t < 3; ++t) {
      const std::string& value = a.inputs[t];
      auto p = uses.producer(value);
      if (flags[t] != 0 || !p || !is_head_transpose(g.nodes[*p]) || !uses.only_reader(value, i)) continue;
      folded.inputs[t] = g.nodes[*p].inputs[0];
      flags[t] = 1;
      if (std::find(nodes.begin(), nodes.end(), *p) == nodes.end()) nodes.push_back(*p);  // k and v may share it
      moved.push_back(AttentionLayout::name(t));
    }
    const std::string& out = a.outputs[0];
    const std::vector<std::size_t>& readers = uses.readers(out);
    if (flags[3] == 0 && a.outputs.size() == 1 && readers.size() == 1 && is_head_transpose(g.nodes[readers[0]]) &&
        uses.only_reader(out, readers[0])) {
      folded.outputs[0] = g.nodes[readers[0]].outputs[0];
      flags[3] = 1;
      nodes.push_back(readers[0]);
      moved.push_back("output");
    }
    if (nodes.empty() || rw.any_taken(nodes) || rw.taken(i)) continue;
    folded.attrs.set("bshd", flags);
    nodes.push_back(i);
    std::string names;
    for (const std::string& name : moved) names += (names.empty() ? "" : ", ") + name;
    rw.replace(nodes, {std::move(folded)},
               "Attention '" + a.name + "' reads and writes heads as [B, S, H, D] (" + names +
                   "): the head transposes removed");
  }
  rw.apply(result);
}

// Note [Attention reads q, k and v from their packed projection]
// GPT-2 (c_attn) and timm's ViT (qkv) compute q, k and v with one Linear [B, S, P * H * D] (P = 3) and cut it:
//  * GPT-2: three Slices of the last axis (op_decomposition's form of the exporter's Split), each Reshaped to
//    [B, S, H, D] (which the attention then reads as bshd, Note [Attention reads the heads where the projections
//    wrote them]); each Slice is a strided copy;
//  * timm: a Reshape to [B, S, P, H, D], a Transpose(2, 0, 3, 1, 4) to [P, B, H, S, D] (a copy of the whole
//    projection), and an outer-axis Slice + Squeeze per part (views).
// An Attention whose q, k and v are parts of one projection this way, the cuts read by nothing else, reads the
// projection itself as [B, S, P, H, D] with `qkv_parts` (Note [Attention layouts]): the copies go (GPT-2's Reshape to
// five dims is a view). The Transpose goes too when the three cuts were all it fed. Where only some of q, k and v are
// such cuts (Phi-3 and GPT-NeoX-style decoders rotate q and k between the cut and the attention), those are read
// packed and the others as before (qkv_parts -1): v's cut, a strided copy per layer, goes; the rotary kernels read
// their cuts in place (Note [Fused nodes read their inputs' views] in fused_input_views.cpp).
struct PackedPart {
  std::string packed;              // the [B, S, P, H, D] value (empty: `projection` must be reshaped to it)
  std::string projection;          // GPT-2's [B, S, P * H * D]
  std::vector<std::int64_t> shape;  // [B, S, P, H, D]
  std::int64_t part = 0;
  std::vector<std::size_t> nodes;  // the cut's nodes
  std::optional<std::size_t> transpose;  // timm's Transpose
};

// The one axis a Squeeze removes (its attribute before opset 13, its input from 13), or nullopt.
std::optional<std::int64_t> squeezed_axis(const Graph& g, const Node& n) {
  if (!is_onnx(n, "Squeeze") || n.inputs.empty()) return std::nullopt;
  auto axes = constant_axes(g, n, 13);
  if (!axes || axes->size() != 1) return std::nullopt;
  return (*axes)[0];
}

std::optional<PackedPart> packed_part(const Graph& g, const Uses& uses, std::size_t attention, std::size_t t,
                                      bool bshd) {
  const std::string& value = g.nodes[attention].inputs[t];
  if (!uses.only_reader(value, attention)) return std::nullopt;
  auto cut = uses.producer(value);
  if (!cut) return std::nullopt;
  const Node& first = g.nodes[*cut];
  PackedPart out;
  if (bshd && is_onnx(first, "Reshape")) {  // GPT-2: Reshape(Slice(X, last axis)) to [B, S, H, D]
    auto heads = static_shape(g, value);
    auto slice = uses.producer(first.inputs[0]);
    if (!heads || heads->size() != 4 || !slice || !uses.only_reader(first.inputs[0], *cut)) return std::nullopt;
    const Node& sl = g.nodes[*slice];
    auto x = static_shape(g, sl.inputs.empty() ? std::string() : sl.inputs[0]);
    if (!x || x->size() != 3) return std::nullopt;
    auto range = single_axis_slice(g, sl, 3);
    const std::int64_t width = (*heads)[2] * (*heads)[3];
    if (!range || range->axis != 2 || width <= 0 || (*x)[2] % width != 0 || (*x)[0] != (*heads)[0] ||
        (*x)[1] != (*heads)[1] || range->start < 0 || range->start % width != 0) {
      return std::nullopt;
    }
    // the last cut's end as exporters write it: past the axis (INT64_MAX) or counted from its end
    const std::int64_t end = range->end < 0 ? range->end + (*x)[2] : std::min(range->end, (*x)[2]);
    if (end != range->start + width) return std::nullopt;
    out.projection = sl.inputs[0];
    out.shape = {(*x)[0], (*x)[1], (*x)[2] / width, (*heads)[2], (*heads)[3]};
    out.part = range->start / width;
    out.nodes = {*cut, *slice};
    return out;
  }
  if (!bshd && squeezed_axis(g, first) == 0) {  // timm: Squeeze(Slice(Transpose(R, 2 0 3 1 4), axis 0, [p, p+1]), 0)
    auto slice = uses.producer(first.inputs[0]);
    if (!slice || !uses.only_reader(first.inputs[0], *cut)) return std::nullopt;
    const Node& sl = g.nodes[*slice];
    auto range = single_axis_slice(g, sl, 5);
    auto transpose = uses.producer(sl.inputs[0]);
    if (!range || range->axis != 0 || range->start < 0 || range->end != range->start + 1 || !transpose) {
      return std::nullopt;
    }
    const Node& tp = g.nodes[*transpose];
    if (!is_onnx(tp, "Transpose") || tp.attrs.get_ints("perm", {}) != std::vector<std::int64_t>{2, 0, 3, 1, 4}) {
      return std::nullopt;
    }
    auto packed = static_shape(g, tp.inputs[0]);
    if (!packed || packed->size() != 5 || range->start >= (*packed)[2]) return std::nullopt;
    out.packed = tp.inputs[0];
    out.shape = *packed;
    out.part = range->start;
    out.nodes = {*cut, *slice};
    out.transpose = transpose;
    return out;
  }
  return std::nullopt;
}

// The layout flags of an Attention the packed-projection rewrites may take: a com.xpuruntime Attention with q, k, v
// and no qkv_parts yet; nullopt for anything else.
std::optional<std::vector<std::int64_t>> unpacked_attention_flags(const Node& a) {
  if (a.domain != kXpurtDomain || a.op_type != "Attention" || a.inputs.size() < 3 || a.attrs.has("qkv_parts")) {
    return std::nullopt;
  }
  std::vector<std::int64_t> flags = a.attrs.get_ints("bshd", {0, 0, 0, 0});
  if (flags.size() != 4) return std::nullopt;
  return flags;
}

// Appends a Reshape (a view) of `source` to a new value of static `shape` [B, S, P, H, D] to `nodes`; its name.
std::string packed_view(Graph& g, const std::string& source, const std::vector<std::int64_t>& shape,
                        const std::string& node_name, std::vector<Node>* nodes) {
  const std::string packed = g.unique_name(source + "_packed");
  ValueType type = *value_type(g, source);
  type.shape.clear();
  for (std::int64_t d : shape) type.shape.push_back(Dim(d));
  g.types[packed] = type;
  Node reshape =
      make_node(node_name, "Reshape", {source, add_constant(g, packed + "_shape", int64_tensor(shape))}, {packed});
  reshape.domain = "";
  nodes->push_back(std::move(reshape));
  return packed;
}

// Attention `a` reading q, k and v as parts `parts` of `packed` (Note [Attention layouts]): their bshd flags 0; an
// input of part -1 stays as it was.
Node packed_attention(const Node& a, const std::string& packed, std::vector<std::int64_t> flags,
                      const std::vector<std::int64_t>& parts) {
  Node folded = a;
  for (std::size_t t = 0; t < 3; ++t) {
    if (parts[t] < 0) continue;
    folded.inputs[t] = packed;
    flags[t] = 0;
  }
  folded.attrs.set("bshd", flags);
  folded.attrs.set("qkv_parts", parts);
  return folded;
}

void fold_packed_qkv(Graph& g, PassResult& result) {  // Note [Attention reads q, k and v from their packed ...]
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& a = g.nodes[i];
    const auto flags = unpacked_attention_flags(a);
    if (!flags) continue;
    // The inputs that are cuts of one packed projection: all three, or some (Phi-3's v, whose q and k go through
    // the rotary embedding first).
    std::array<std::optional<PackedPart>, 3> cut;
    const PackedPart* first = nullptr;
    for (std::size_t t = 0; t < 3; ++t) {
      cut[t] = packed_part(g, uses, i, t, (*flags)[t] == 1);
      if (!cut[t]) continue;
      if (first == nullptr) first = &*cut[t];
      if (cut[t]->packed != first->packed || cut[t]->projection != first->projection || cut[t]->shape != first->shape) {
        cut[t].reset();
      }
    }
    if (first == nullptr) continue;
    const PackedPart q = *first;
    std::vector<PackedPart> parts;
    for (const auto& c : cut) {
      if (c) parts.push_back(*c);
    }
    std::vector<std::size_t> nodes = {i};
    for (const PackedPart& p : parts) nodes.insert(nodes.end(), p.nodes.begin(), p.nodes.end());
    if (q.transpose) {  // timm's Transpose goes when the three cuts are all it feeds
      const std::string& permuted = g.nodes[*q.transpose].outputs[0];
      bool all = !uses.is_graph_output(permuted) && !uses.read_by_subgraph(permuted);
      for (std::size_t reader : uses.readers(permuted)) {
        all = all && std::find(nodes.begin(), nodes.end(), reader) != nodes.end();
      }
      if (all) nodes.push_back(*q.transpose);
    }
    std::sort(nodes.begin(), nodes.end());
    if (std::adjacent_find(nodes.begin(), nodes.end()) != nodes.end() || rw.any_taken(nodes)) continue;
    std::vector<Node> new_nodes;
    // GPT-2: the projection viewed as [B, S, P, H, D]; timm's is that already.
    const std::string packed =
        q.packed.empty() ? packed_view(g, q.projection, q.shape, a.name + "_packed_qkv", &new_nodes) : q.packed;
    std::vector<std::int64_t> part_of(3, -1);
    for (std::size_t t = 0; t < 3; ++t) {
      if (cut[t]) part_of[t] = cut[t]->part;
    }
    new_nodes.push_back(packed_attention(a, packed, *flags, part_of));
    rw.replace(nodes, std::move(new_nodes),
               "Attention '" + a.name + "' reads q, k, v from their packed projection " + packed + " (parts " +
                   std::to_string(part_of[0]) + ", " + std::to_string(part_of[1]) + ", " +
                   std::to_string(part_of[2]) + "; -1: read as before): the cuts removed");
  }
  rw.apply(result);
}

// Note [One GEMM for q, k and v]
// BERT, Whisper, CLIP and most transformers project q, k and v with three Linears of one input. At small batches
// each GEMM is too small to fill the GPU, so three cost about what one three times wider does. qkv_fusion makes them
// one Linear with the weights (and biases) concatenated, [B, S, 3 * H * D], viewed as [B, S, 3, H, D] (a Reshape,
// no copy), which the Attention reads as its packed projection (Note [Attention layouts]: qkv_parts 0, 1, 2). It
// takes an Attention whose q, k and v are each Reshape(Linear(x)) to [B, S, H, D], read as bshd, read by nothing
// else, with one x, one weight layout and dtype, no activation, and the same H and D (so not grouped-query
// attention, whose k and v have fewer heads).
struct HeadProjection {
  std::size_t reshape = 0, linear = 0;
  std::optional<std::size_t> mul;   // Whisper's q_proj(x) * scaling: folded into the part's weights and bias
  double scale = 1.0;
  std::vector<std::int64_t> heads;  // the Reshape's [B, S, H, D]
};

std::optional<HeadProjection> head_projection(const Graph& g, const Uses& uses, std::size_t attention,
                                              const std::string& value) {
  auto reshape = uses.producer(value);
  if (!reshape || !is_onnx(g.nodes[*reshape], "Reshape") || !uses.only_reader(value, attention)) return std::nullopt;
  std::string projected = g.nodes[*reshape].inputs[0];
  auto linear = uses.producer(projected);
  if (!linear || !uses.only_reader(projected, *reshape)) return std::nullopt;
  std::optional<std::size_t> mul;
  double scale = 1.0;
  if (is_onnx(g.nodes[*linear], "Mul")) {  // a scale by a one-element constant (Whisper's queries)
    auto factor = scale_operand(g, g.nodes[*linear]);
    if (!factor) return std::nullopt;
    mul = linear;
    scale = factor->second;
    const std::string& scaled = g.nodes[*mul].inputs[factor->first];
    linear = uses.producer(scaled);
    if (!linear || !uses.only_reader(scaled, *mul)) return std::nullopt;
    projected = scaled;
  }
  const Node& l = g.nodes[*linear];
  if (l.domain != kXpurtDomain || l.op_type != "Linear" || l.attrs.get_string("activation", "none") != "none" ||
      l.inputs.size() < 2 || constant(g, l.inputs[1]) == nullptr ||
      (l.inputs.size() > 2 && !l.inputs[2].empty() && constant(g, l.inputs[2]) == nullptr)) {
    return std::nullopt;
  }
  auto heads = static_shape(g, value), flat = static_shape(g, projected);
  if (!heads || !flat || heads->size() != 4 || flat->size() != 3 || (*flat)[0] != (*heads)[0] ||
      (*flat)[1] != (*heads)[1] || (*flat)[2] != (*heads)[2] * (*heads)[3]) {
    return std::nullopt;
  }
  return HeadProjection{*reshape, *linear, mul, scale, *heads};
}


}  // namespace

PassResult qkv_fusion(Graph& g, const PassContext& /*ctx*/) {  // Note [One GEMM for q, k and v]
  PassResult result{"qkv_fusion", 0, {}};
  Rewriter rw(g);
  const Uses uses(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& a = g.nodes[i];
    const auto flags = unpacked_attention_flags(a);
    if (!flags || (*flags)[0] != 1 || (*flags)[1] != 1 || (*flags)[2] != 1) continue;
    if (a.inputs[0] == a.inputs[1] || a.inputs[1] == a.inputs[2] || a.inputs[0] == a.inputs[2]) continue;
    std::vector<HeadProjection> projections;
    for (std::size_t t = 0; t < 3; ++t) {
      auto p = head_projection(g, uses, i, a.inputs[t]);
      if (!p) break;
      projections.push_back(*p);
    }
    if (projections.size() != 3) continue;
    std::vector<const Node*> linears;
    for (const HeadProjection& p : projections) linears.push_back(&g.nodes[p.linear]);
    const Node& first = *linears[0];
    const std::string layout = first.attrs.get_string("weight_layout", "nk");
    const Tensor* w0 = constant(g, first.inputs[1]);
    bool same = layout == "kn" || layout == "nk";
    for (std::size_t t = 0; t < 3 && same; ++t) {
      const Node& l = *linears[t];
      const Tensor* w = constant(g, l.inputs[1]);
      same = l.inputs[0] == first.inputs[0] && l.attrs.get_string("weight_layout", "nk") == layout &&
             w->dtype() == w0->dtype() && w->dim() == 2 && w->shape() == w0->shape() &&
             projections[t].heads == projections[0].heads;
    }
    if (!same) continue;
    std::vector<std::size_t> nodes = {i};
    std::vector<double> scales;
    for (const HeadProjection& p : projections) {
      nodes.insert(nodes.end(), {p.reshape, p.linear});
      if (p.mul) nodes.push_back(*p.mul);
      scales.push_back(p.scale);
    }
    if (rw.any_taken(nodes)) continue;
    const std::vector<std::int64_t>& heads = projections[0].heads;  // [B, S, H, D]
    const std::int64_t width = heads[2] * heads[3];
    const bool kn = layout == "kn";
    Node linear = first;
    linear.name = first.name + "_qkv";
    linear.inputs = {first.inputs[0],
                     add_constant(g, first.inputs[1] + "_qkv", concatenated_weights(g, linears, scales, kn))};
    const bool biased = std::any_of(linears.begin(), linears.end(), [](const Node* l) {
      return l->inputs.size() > 2 && !l->inputs[2].empty();
    });
    if (biased) {
      std::vector<double> bias;
      for (std::size_t t = 0; t < 3; ++t) {
        const Node* l = linears[t];
        const bool has = l->inputs.size() > 2 && !l->inputs[2].empty();
        const std::vector<double> part = has ? to_doubles(*constant(g, l->inputs[2])) : std::vector<double>();
        for (std::int64_t n = 0; n < width; ++n) {
          bias.push_back(!has ? 0.0 : scales[t] * (part.size() == 1 ? part[0] : part[static_cast<std::size_t>(n)]));
        }
      }
      linear.inputs.push_back(add_constant(g, first.name + "_qkv_bias", from_doubles({3 * width}, w0->dtype(), bias)));
    }
    const std::string projected = g.unique_name(first.outputs[0] + "_qkv");
    ValueType flat = *value_type(g, first.outputs[0]);
    flat.shape = {Dim(heads[0]), Dim(heads[1]), Dim(3 * width)};
    g.types[projected] = flat;
    linear.outputs = {projected};
    std::vector<Node> replacement;
    replacement.push_back(std::move(linear));
    const std::vector<std::int64_t> five = {heads[0], heads[1], 3, heads[2], heads[3]};
    const std::string packed = packed_view(g, projected, five, first.name + "_qkv_packed", &replacement);
    replacement.push_back(packed_attention(a, packed, *flags, {0, 1, 2}));
    rw.replace(nodes, std::move(replacement),
               "Linear '" + linears[0]->name + "' + '" + linears[1]->name + "' + '" + linears[2]->name +
                   "' -> one Linear '" + first.name + "_qkv' whose output Attention '" + a.name +
                   "' reads as its packed projection");
  }
  rw.apply(result);
  return result;
}

namespace {

// Note [Attention with additive terms]
// Models add more than a padding mask to the scores before the softmax: Swin a relative position bias [1, H, N, N]
// (a Gather of a learnt table, folded to a constant) and in shifted windows a window mask as well, T5 a position bias
// [B or 1, H, S, S] computed once and shared by every layer, ALiBi a per-head slope times the distance, exporters of
// causal attention a -inf upper triangle. All of these are one additive term of the op (`mask`, any shape that
// broadcasts to the scores [B, H, Sq, Sk]), which the fused kernels read with stride 0 along broadcast dims
// (flash_v2: Note [flash_v2 tiling] in flash_attention_kernel.cuh). attention_fusion takes up to two Adds between the
// (scaled) Q K^T and the Softmax, in either order of operands: MatMul -> [Div|Mul scale] -> Add(t1) [-> Add(t2)]
// -> Softmax. Two terms become one input computed by an Add(t1, t2) node beside the attention, of the broadcast shape
// of the two (at most the scores' size, usually far less: [1, H, S, S] + [B, 1, 1, S] is [B, H, S, S] but
// [1, H, S, S] + [S, S] stays [1, H, S, S]); when both are constants the plan's constant folding computes it once
// (shape inference folds a node whose inputs are all constant), so a bias table plus a fixed mask costs nothing per
// run. A computed sum is one elementwise pass over at most B * H * Sq * Sk elements, against the unfused chain's
// scores written, re-read and re-written by each Add and the softmax. Floating-point sums associate differently
// ((s + t1) + t2 against s + (t1 + t2)), a rounding of the terms' size; -inf stays -inf and NaN stays NaN.
// Swin's shifted windows add their window mask through views: the scores [B * nW, H, N, N] reshaped to
// [B, nW, H, N, N], plus the mask [1, nW, 1, N, N] (window w of every image), reshaped back, then the softmax. With
// static shapes (the plan's, after specialise_inputs) that view only splits the batch, so the mask is the 4-d term
// Reshape(Expand(mask), [B * nW, H, N, N]), which joins the bias as above; Swin's table and mask are constants, so
// the plan folds the whole sum into one constant of B * nW * H * N * N elements (7.4 MB in fp16 for Swin-T's first
// stage at batch 8) and the attention runs with no extra kernel. Three or more Adds, or an Add whose partial sum
// something else reads, stay unfused.

// Note [Scores promoted to float32 by a float32 mask]
// PyTorch's TorchScript exporter writes scaled_dot_product_attention with a boolean mask as Where(mask, 0, -inf) in
// float32, whatever q's type; in a float16 model ONNX's type promotion then runs the rest of the attention in float32:
//   s = Cast(to=float)(MatMul(q * c, k^T * c))    q, k float16; the MatMul and its scales in float16
//   p = Softmax(s + mask)                          mask float32, then the NaN guard (Note [The NaN guard of fully
//   o = MatMul(p, Cast(to=float)(v))                 masked rows]); o float32, and so is what reads it
// (the suite's float16 TorchScript exports: the first attention of BERT, CLIP's text encoder, DistilBERT, GPT-2,
// RoBERTa and DeiT, every attention of Llama, whose residual stream stays float16). attention_fusion takes the Cast
// of the scores as part of the chain and fuses a float32 Attention of Cast(q), Cast(k) (new Casts to float32, exact)
// and v as the graph casts it: the mask, v and the output keep the graph's float32. The unfused chain rounds q * c,
// k^T * c and their product to float16 first, which the fused one does not: it is the closer of the two to exact
// arithmetic (as in Note [Softmax in float32]), within float16's rounding of the other. A 16-bit Attention (flash_v2
// on a GPU) would instead round the probabilities and the output to float16, below what the graph computes, so the
// attention stays float32 (on a GPU the unfused kernel: cuBLAS GEMMs around one softmax).

// A Cast to float32 of a float16 or bfloat16 value (Note [Scores promoted to float32 by a float32 mask]).
bool promotes_to_float32(const Graph& g, const Node& n) {
  if (!is_onnx(n, "Cast") || n.inputs.size() != 1) return false;
  if (dtype_from_onnx(n.attrs.get_int("to", 0)) != DType::kFloat32) return false;
  const auto from = value_dtype(g, n.inputs[0]);
  return from && (*from == DType::kFloat16 || *from == DType::kBFloat16);
}

// Whether `value` is Q K^T computed by a MatMul, possibly scaled once by a Div or Mul by a constant, possibly promoted
// to float32 after (Note [Scores promoted to float32 by a float32 mask]).
bool from_scaled_matmul(const Graph& g, const Uses& uses, const std::string& value) {
  auto p = uses.producer(value);
  if (p && promotes_to_float32(g, g.nodes[*p])) p = uses.producer(g.nodes[*p].inputs[0]);
  if (p && (is_onnx(g.nodes[*p], "Div") || is_onnx(g.nodes[*p], "Mul"))) {
    auto factor = scale_operand(g, g.nodes[*p]);
    const auto head = factor ? std::nullopt : head_scale_operand(g, g.nodes[*p]);  // and perhaps a constant next
    p = factor ? uses.producer(g.nodes[*p].inputs[factor->first])
               : (head ? uses.producer(g.nodes[*p].inputs[1 - *head]) : std::nullopt);
    if (head && p && is_onnx(g.nodes[*p], "Mul")) {
      factor = scale_operand(g, g.nodes[*p]);
      p = factor ? uses.producer(g.nodes[*p].inputs[factor->first]) : p;
    }
  }
  return p && is_onnx(g.nodes[*p], "MatMul");
}

// Swin's shifted-window mask (Note [Attention with additive terms]): the scores [B * nW, H, Sq, Sk] reshaped to
// [B, nW, H, Sq, Sk], plus a mask that broadcasts to that ([1, nW, 1, Sq, Sk]: window w of every image), reshaped back.
struct WindowTerm {
  std::string mask;
  std::vector<std::int64_t> mask_shape;  // rank <= 5, broadcasts to `split`
  std::vector<std::int64_t> split;   // [B, nW, H, Sq, Sk]
  std::vector<std::int64_t> scores;  // [B * nW, H, Sq, Sk]
};

// The additive terms between the (scaled) scores and the softmax (Note [Attention with additive terms]).
struct AdditiveTerms {
  std::string scores;                // the (scaled) Q K^T the first Add reads
  std::size_t reader = 0;            // the node that reads `scores` (the first Add, or the softmax without terms)
  std::vector<std::string> terms;    // 0, 1 or 2 additive terms, the one added first first
  std::optional<WindowTerm> window;  // added after `terms`
  std::vector<std::size_t> adds;     // their Add nodes (and the window's Reshapes)
};

// The window form, read backwards from `out.scores` (the softmax's input): Reshape(Add(Reshape(x, [B, nW, H, Sq, Sk]),
// mask)) back to x's static shape [B * nW, H, Sq, Sk], each value read only by the next node; moves `out` to x.
void match_window_term(const Graph& g, const Matcher& m, AdditiveTerms& out) {
  auto back = m.sole_producer(out.scores, out.reader, "Reshape");
  if (!back) return;
  auto ai = m.sole_producer(m.node(*back).inputs[0], *back, "Add");
  if (!ai || m.node(*ai).inputs.size() != 2) return;
  const Node& add = m.node(*ai);
  for (std::size_t k = 0; k < 2; ++k) {
    auto split = m.sole_producer(add.inputs[k], *ai, "Reshape");
    if (!split) continue;
    const std::string& x = m.node(*split).inputs[0];
    auto scores = static_shape(g, x), split_shape = static_shape(g, add.inputs[k]);
    auto result = static_shape(g, m.node(*back).outputs[0]);
    auto mask = value_type(g, add.inputs[1 - k]);
    auto dtype = value_dtype(g, x);
    if (!scores || !split_shape || !result || !mask || !dtype || scores->size() != 4 || split_shape->size() != 5 ||
        *result != *scores || !mask->has_shape || mask->shape.size() > 5 || mask->dtype != *dtype) {
      continue;
    }
    const auto& s5 = *split_shape;
    if (s5[0] * s5[1] != (*scores)[0] || !std::equal(s5.begin() + 2, s5.end(), scores->begin() + 1)) continue;
    bool broadcasts = true;
    for (std::size_t d = 0; d < mask->shape.size(); ++d) {
      const Dim& md = mask->shape[d];
      broadcasts = broadcasts && md.known() && (md.value == 1 || md.value == s5[5 - mask->shape.size() + d]);
    }
    if (!broadcasts) continue;
    std::vector<std::int64_t> mask_shape;
    for (const Dim& md : mask->shape) mask_shape.push_back(md.value);
    out.window = WindowTerm{add.inputs[1 - k], mask_shape, s5, *scores};
    out.adds.insert(out.adds.end(), {*back, *ai, *split});
    out.scores = x;
    out.reader = *split;
    return;
  }
}

// Walks back from `value` (the softmax's input, read by node `reader`) through at most two Adds to the scores; nullopt
// when an Add is there but the chain is not of that form (the softmax is then not attention's, or not one this pass
// can prove).
std::optional<AdditiveTerms> additive_terms(const Graph& g, const Uses& uses, const Matcher& m,
                                            const std::string& value, std::size_t reader) {
  AdditiveTerms out;
  out.scores = value;
  out.reader = reader;
  match_window_term(g, m, out);
  const int max_adds = out.window ? 1 : 2;
  for (int depth = 0; depth < max_adds; ++depth) {
    auto ai = m.sole_producer(out.scores, out.reader, "Add");
    if (!ai) return depth == 0 ? std::optional<AdditiveTerms>(out) : std::nullopt;
    const Node& add = m.node(*ai);
    if (add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) return std::nullopt;
    std::optional<std::size_t> side;
    for (std::size_t k = 0; k < 2 && !side; ++k) {
      if (from_scaled_matmul(g, uses, add.inputs[k])) side = k;
    }
    // Not yet at the scores: the side that is itself an Add read only here leads on (the first term's Add).
    for (std::size_t k = 0; k < 2 && !side && depth + 1 < max_adds; ++k) {
      auto inner = m.sole_producer(add.inputs[k], *ai, "Add");
      if (inner && m.node(*inner).inputs.size() == 2 &&
          (from_scaled_matmul(g, uses, m.node(*inner).inputs[0]) ||
           from_scaled_matmul(g, uses, m.node(*inner).inputs[1]))) {
        side = k;
      }
    }
    if (!side) return std::nullopt;
    out.terms.insert(out.terms.begin(), add.inputs[1 - *side]);
    out.adds.push_back(*ai);
    out.scores = add.inputs[*side];
    out.reader = *ai;
    if (from_scaled_matmul(g, uses, out.scores)) return out;
  }
  return std::nullopt;
}

// Whether additive term `term` (rank <= 4, q's dtype) broadcasts to the scores [B, H, Sq, Sk]; its shape, if so.
// `merged`: the scores' leading dims are merged (Note [Attention over more than one batch dim]), and a longer term
// is read as its last three dims when the others are 1.
std::optional<std::vector<Dim>> term_shape(const Graph& g, const std::string& term, DType dtype,
                                           const std::vector<Dim>& scores, bool merged) {
  auto t = value_type(g, term);
  if (t && t->has_shape && merged && t->shape.size() > 3) {
    for (std::size_t d = 0; d < t->shape.size(); ++d) {  // static: merged_term views it by a Reshape
      if (!t->shape[d].known() || (d + 3 < t->shape.size() && t->shape[d].value != 1)) return std::nullopt;
    }
    t->shape.erase(t->shape.begin(), t->shape.end() - 3);
  }
  if (!t || !t->has_shape || t->shape.size() > 4 || t->dtype != dtype) return std::nullopt;
  const std::size_t offset = 4 - t->shape.size();
  for (std::size_t d = 0; d < t->shape.size(); ++d) {
    const Dim& td = t->shape[d];
    if (!(td.known() && td.value == 1) && !same_dim(td, scores[offset + d])) return std::nullopt;
  }
  return t->shape;
}

// The window mask as a term of the scores' own shape: Reshape(Expand(mask, [B, nW, H, Sq, Sk]), [B * nW, H, Sq, Sk]),
// appended to `new_nodes`. Constant masks of a static batch fold to a constant in the plan.
std::string window_term_input(Graph& g, const WindowTerm& window, DType dtype, const std::string& hint,
                              std::vector<Node>& new_nodes) {
  const std::string expanded = g.unique_name(hint + "_window_mask");
  const std::string term = g.unique_name(hint + "_window_term");
  ValueType type;
  type.dtype = dtype;
  type.has_shape = true;
  type.shape.assign(window.split.begin(), window.split.end());
  g.types[expanded] = type;
  type.shape.assign(window.scores.begin(), window.scores.end());
  g.types[term] = type;
  // Expand by 1 along the mask's own dims: the same result, and a shape whose product times the mask's size is the
  // output's exact size, which constant folding's size estimate reads (an Expand by the full shape looks bigger).
  std::vector<std::int64_t> by = window.split;
  for (std::size_t d = 0; d < window.mask_shape.size(); ++d) {
    if (window.mask_shape[d] != 1) by[by.size() - window.mask_shape.size() + d] = 1;
  }
  Node expand = make_node(expanded, "Expand", {window.mask, add_constant(g, expanded + "_shape", int64_tensor(by))},
                          {expanded});
  expand.domain = "";
  new_nodes.push_back(std::move(expand));
  Node reshape = reshape_node(g, term, expanded, window.scores, term);
  reshape.domain = "";
  new_nodes.push_back(std::move(reshape));
  return term;
}

// A Cast to float32 of `value` (of type `type`), appended to `new_nodes`: its output (Note [Scores promoted to float32
// by a float32 mask]).
std::string float32_copy(Graph& g, const std::string& value, ValueType type, const std::string& hint,
                         std::vector<Node>& new_nodes) {
  const std::string out = g.unique_name(hint);
  type.dtype = DType::kFloat32;
  g.types[out] = type;
  Node cast = make_node(out, "Cast", {value}, {out});
  cast.domain = "";
  cast.attrs.set("to", static_cast<std::int64_t>(1));  // TensorProto.FLOAT
  new_nodes.push_back(std::move(cast));
  return out;
}

// A new value named after `hint`, typed `dtype` of `shape`.
std::string typed_value(Graph& g, const std::string& hint, DType dtype, const std::vector<Dim>& shape) {
  const std::string name = g.unique_name(hint);
  ValueType type;
  type.dtype = dtype;
  type.has_shape = true;
  type.shape = shape;
  g.types[name] = type;
  return name;
}

// One additive input from the terms: the term itself, or a new Add(t1, t2) (appended to `new_nodes`, its output
// typed with the broadcast shape of the two) (Note [Attention with additive terms]).
std::string one_additive_input(Graph& g, const std::vector<std::string>& terms,
                               const std::vector<std::vector<Dim>>& shapes, DType dtype, const std::string& hint,
                               std::vector<Node>& new_nodes) {
  std::string bias = terms[0];
  std::vector<Dim> sum = shapes[0];
  for (std::size_t t = 1; t < terms.size(); ++t) {  // a masked-fill term may make three (Note [Masked-fill scores])
    const std::size_t rank = std::max(sum.size(), shapes[t].size());
    sum.insert(sum.begin(), rank - sum.size(), Dim(1));
    for (std::size_t d = 0; d < shapes[t].size(); ++d) {
      Dim& out = sum[rank - shapes[t].size() + d];
      const Dim& in = shapes[t][d];
      if (!(in.known() && in.value == 1)) out = in;  // both broadcast to the scores: equal
    }
    const std::string next = typed_value(g, hint + "_bias", dtype, sum);
    Node add = make_node(next, "Add", {bias, terms[t]}, {next});
    add.domain = "";
    new_nodes.push_back(std::move(add));
    bias = next;
  }
  return bias;
}

// Note [Masked-fill scores]
// Hugging Face's DeBERTa (and other eager attentions) mask the scores with masked_fill instead of adding a mask:
//   p = Softmax(Where(c, fill, s))   or Where(c, s, fill); c boolean, fill a one-element constant.
// attention_fusion takes the Where as one more additive term, Where(c, -inf, 0) (Where(c, 0, -inf)) of c's shape in
// the scores' dtype, for fills of -inf or of float16's lowest (-65504) and below (HF writes finfo(dtype).min). A masked
// score is then -inf instead of fill: beside a visible key the graph weighs it exp(fill - max), which is 0 in float32
// once max - fill passes its exp range (about 104), and so is exp(-inf). A row masked at every key is fill everywhere
// in the graph, so uniform: the Attention's fully_masked_rows="uniform" (Note [Fully masked attention rows]) gives
// the same; with a fill of -inf both give NaN. Where they differ: a masked NaN score (NaN q or k) is fill in the graph
// and NaN here. The NaN guard (Note [The NaN guard of fully masked rows]) and the float32 promotion of the scores are
// not taken together with a masked fill.
// DeBERTa also computes the scores with 3-D MatMuls over [B * H, S, d] views of [B, H, S, d] heads and takes the mask
// and the softmax on a [B, H, Sq, Sk] view: Reshape(scores) -> Where -> Softmax -> Reshape back -> MatMul(p, v). When
// q, k and v are such views (Reshapes of static [B, H, S, d] values merging the first two dims), the attention reads
// the 4-D values, a 3-D term [B * H, Sq, Sk] is viewed as [B, H, Sq, Sk] and the output [B, H, Sq, dv] is viewed back
// as the 3-D MatMul's. The disentangled position terms (c2p + p2c, [B * H, S, S]) and the mask become the bias. The
// layers mask with the same condition, and one Where term serves them all (MaskTerms). BLOOM's scores take the same
// views with an Add instead of the Where: alibi.baddbmm(q, k^T) adds the ALiBi term [B * H, 1, Sk] to the 3-D scores,
// and the causal mask [B, 1, Sq, Sk] is added to their 4-D view (term_after_heads_view): both become the bias.

// The masked fill between the scores `value` (read by node `reader`) and the softmax.
struct MaskedFill {
  std::size_t where = 0;
  std::string cond;
  bool fill_when_true = true;  // Where(c, fill, s): masked where c holds
  double fill = 0.0;
  std::string scores;
};

std::optional<MaskedFill> masked_fill(const Graph& g, const Matcher& m, const std::string& value, std::size_t reader) {
  auto wi = m.sole_producer(value, reader, "Where");
  if (!wi || m.node(*wi).inputs.size() != 3 || value_dtype(g, m.node(*wi).inputs[0]) != DType::kBool) {
    return std::nullopt;
  }
  const Node& w = m.node(*wi);
  const auto out = value_type(g, value);
  for (std::size_t k = 1; k <= 2; ++k) {
    const auto fill = scalar_constant(g, w.inputs[k]);
    const auto scores = value_type(g, w.inputs[3 - k]);
    if (!fill || !(*fill <= -65504.0) || !out || !scores || !same_shape(*out, *scores)) continue;
    return MaskedFill{*wi, w.inputs[0], k == 1, *fill, w.inputs[3 - k]};
  }
  return std::nullopt;
}

// Whether `three` ([B * H, S, d]) is `four` ([B, H, S, d]) with its first two dims merged.
bool merges_batch_and_heads(const std::vector<std::int64_t>& four, const std::vector<std::int64_t>& three) {
  return four.size() == 4 && three.size() == 3 && four[0] * four[1] == three[0] && four[2] == three[1] &&
         four[3] == three[2];
}

// The [B * H, Sq, Sk] scores viewed as [B, H, Sq, Sk] by the Reshape that produces `value` (read by `reader`).
struct HeadsView {
  std::size_t reshape = 0;
  std::int64_t batch = 0, heads = 0;
  std::vector<std::int64_t> merged;  // [B * H, Sq, Sk]
};

std::optional<HeadsView> heads_view(const Graph& g, const Matcher& m, const std::string& value, std::size_t reader) {
  auto ri = m.sole_producer(value, reader, "Reshape");
  if (!ri) return std::nullopt;
  const auto in = static_shape(g, m.node(*ri).inputs[0]);
  const auto out = static_shape(g, value);
  if (!in || !out || !merges_batch_and_heads(*out, *in)) return std::nullopt;
  return HeadsView{*ri, (*out)[0], (*out)[1], *in};
}

// A term added to the [B, H, Sq, Sk] view of 3-D scores, before the softmax: BLOOM's causal mask, added after its
// ALiBi scores (alibi.baddbmm(q, k^T): 3-D, the ALiBi term [B * H, 1, Sk] added there) are viewed as 4-D. The Add
// writing `value` (read by `reader`) whose other operand is that view: the Add, its term, and the view.
struct ViewTerm {
  std::size_t add = 0;
  std::string term;
  HeadsView view;
};

std::optional<ViewTerm> term_after_heads_view(const Graph& g, const Matcher& m, const std::string& value,
                                              std::size_t reader) {
  auto ai = m.sole_producer(value, reader, "Add");
  if (!ai || m.node(*ai).inputs.size() != 2 || m.node(*ai).inputs[0] == m.node(*ai).inputs[1]) return std::nullopt;
  for (std::size_t k = 0; k < 2; ++k) {
    const std::string& side = m.node(*ai).inputs[k];
    if (auto view = heads_view(g, m, side, *ai)) return ViewTerm{*ai, m.node(*ai).inputs[1 - k], *view};
  }
  return std::nullopt;
}

// The [B, H, S, d] value the 3-D `x` ([B * H, S, d]) is a Reshape of, for the view's B and H.
std::optional<std::string> heads_source(const Graph& g, const Uses& uses, const std::string& x, const HeadsView& view) {
  auto p = uses.producer(x);
  if (!p || !is_onnx(g.nodes[*p], "Reshape")) return std::nullopt;
  const std::string& source = g.nodes[*p].inputs[0];
  const auto s4 = static_shape(g, source);
  const auto s3 = static_shape(g, x);
  if (!s4 || !s3 || !merges_batch_and_heads(*s4, *s3) || (*s4)[0] != view.batch || (*s4)[1] != view.heads) {
    return std::nullopt;
  }
  return source;
}

// A term of the 3-D scores [B * H, Sq, Sk] as a term of the 4-D ones: its shape, and whether it needs a Reshape (a
// leading B * H other than 1 and H); nullopt when it does not broadcast to them.
std::optional<std::pair<std::vector<Dim>, bool>> heads_term_shape(const Graph& g, const std::string& term, DType dtype,
                                                                  const HeadsView& view) {
  auto t = value_type(g, term);
  if (!t || !t->has_shape || t->shape.size() > 3 || t->dtype != dtype) return std::nullopt;
  const std::size_t offset = 3 - t->shape.size();
  for (std::size_t d = 0; d < t->shape.size(); ++d) {
    const Dim& td = t->shape[d];
    if (!td.known() || (td.value != 1 && td.value != view.merged[offset + d])) return std::nullopt;
  }
  const bool split = t->shape.size() == 3 && t->shape[0].value != 1 && t->shape[0].value != view.heads;
  if (!split) return std::make_pair(t->shape, false);
  return std::make_pair(std::vector<Dim>{Dim(view.batch), Dim(view.heads), t->shape[1], t->shape[2]}, true);
}

// The masked fills' additive terms made so far, by condition, polarity and dtype: every layer of a model masks with
// the same condition, and one term serves them all.
using MaskTerms = std::map<std::tuple<std::string, bool, DType>, std::string>;

// The masked fill's additive term, Where(c, -inf, 0) or Where(c, 0, -inf): one of `made`, or a new one appended to
// `new_nodes` (and to `made`).
std::string masked_fill_term(Graph& g, const MaskedFill& fill, DType dtype, const std::string& hint,
                             std::vector<Node>& new_nodes, MaskTerms& made) {
  const auto key = std::make_tuple(fill.cond, fill.fill_when_true, dtype);
  if (auto it = made.find(key); it != made.end()) return it->second;
  const std::string masked = add_constant(g, hint + "_masked", from_doubles({}, dtype, {-INFINITY}));
  const std::string visible = add_constant(g, hint + "_visible", from_doubles({}, dtype, {0.0}));
  const std::string term = typed_value(g, hint + "_mask", dtype, value_type(g, fill.cond)->shape);
  Node where = make_node(term, "Where", {fill.cond, fill.fill_when_true ? masked : visible,
                                         fill.fill_when_true ? visible : masked}, {term});
  where.domain = "";
  new_nodes.push_back(std::move(where));
  made[key] = term;
  return term;
}

// The masked fill's term shape when c (rank <= 4, static) broadcasts to the scores.
std::optional<std::vector<Dim>> masked_fill_shape(const Graph& g, const MaskedFill& fill,
                                                  const std::vector<Dim>& scores) {
  const auto c = value_type(g, fill.cond);
  if (!c || !c->has_shape || c->shape.size() > 4) return std::nullopt;
  for (std::size_t d = 0; d < c->shape.size(); ++d) {
    const Dim& cd = c->shape[d];
    if (!cd.known() || (cd.value != 1 && !same_dim(cd, scores[4 - c->shape.size() + d]))) return std::nullopt;
  }
  return c->shape;
}

// A [B * H, Sq, Sk] term viewed as `shape` ([B, H, Sq, Sk]), appended to `new_nodes`.
std::string heads_term(Graph& g, const std::string& term, const std::vector<Dim>& shape, DType dtype,
                       std::vector<Node>& new_nodes) {
  const std::string viewed = typed_value(g, term + "_heads", dtype, shape);
  std::vector<std::int64_t> dims;
  for (const Dim& d : shape) dims.push_back(d.value);
  new_nodes.push_back(reshape_node(g, viewed + "_view", term, dims, viewed));
  return viewed;
}

// Note [Attention over more than one batch dim]
// Q, K and V of rank R > 4, [B, windows, H, N, d] (MaxViT's block and grid attention: an Einsum over
// '...hid,...hjd->...hij', now a 5-D MatMul, Note [Einsum onto MatMul]), are the attention of [B * windows, H, N, d]:
// the fused node reads them through Reshapes that merge the leading R - 3 dims (static and equal in the three) and
// its output is viewed back to rank R. The scores [.., H, Sq, Sk] keep their last three dims, so a term of rank 3 or
// less (MaxViT's relative position bias [H, N, N]) broadcasts to the merged scores as it did to the R-D ones; a
// longer term only when its dims before the last three are 1 (a Reshape drops them). Swin's window form and K
// [B,S,H,D] stay 4-D only. All of these views are of contiguous values: no copy.
struct MergedBatch {
  std::size_t rank = 4;
  std::vector<std::int64_t> lead;  // the leading R - 3 dims (rank > 4 only)
};

// The leading dims of `t` (rank R > 4) before its last three, when static; nullopt otherwise.
std::optional<std::vector<std::int64_t>> leading_dims(const ValueType& t) {
  std::vector<std::int64_t> lead;
  for (std::size_t d = 0; d + 3 < t.shape.size(); ++d) {
    if (!t.shape[d].known()) return std::nullopt;
    lead.push_back(t.shape[d].value);
  }
  return lead;
}

// `t` viewed with its leading dims merged into one (Note [Attention over more than one batch dim]).
ValueType merged_type(ValueType t, const MergedBatch& merged) {
  if (merged.rank == 4) return t;
  std::int64_t n = 1;
  for (const std::int64_t d : merged.lead) n *= d;
  std::vector<Dim> shape = {Dim(n)};
  shape.insert(shape.end(), t.shape.end() - 3, t.shape.end());
  t.shape = shape;
  return t;
}

// `value` through a Reshape to `type`'s static shape, appended to `new_nodes`; `value` itself when nothing merges.
std::string reshaped_input(Graph& g, const std::string& value, const ValueType& type, const std::string& hint,
                           std::vector<Node>& new_nodes) {
  const auto existing = value_type(g, value);
  if (existing && existing->shape.size() == type.shape.size()) return value;
  std::vector<std::int64_t> shape;
  for (const Dim& d : type.shape) shape.push_back(d.value);
  const std::string out = g.unique_name(hint);
  g.types[out] = type;
  Node reshape = reshape_node(g, out, value, shape, out);
  reshape.domain = "";
  new_nodes.push_back(std::move(reshape));
  return out;
}

// A term of the rank-R scores as a term of the merged ones: itself when of rank 3 or less, else viewed as its last
// three dims (term_shape(merged) checked that the others are 1 and every dim static).
std::string merged_term(Graph& g, const std::string& term, std::vector<Node>& new_nodes) {
  ValueType three = *value_type(g, term);
  if (three.shape.size() <= 3) return term;
  three.shape.erase(three.shape.begin(), three.shape.end() - 3);
  return reshaped_input(g, term, three, term + "_merged", new_nodes);
}

}  // namespace

// Long function: one pattern, matched backwards and forwards from each Softmax through the variants exporters
// write (scales on Q and K^T, PyTorch's K^T reshapes, the NaN guard); the matched names feed the one rewrite.
// K in K^T = `kt` as attention_fusion reads it: a Transpose(0,1,3,2) of K [B,H,S,D] or (0,2,3,1) of K [B,S,H,D], or
// PyTorch's decomposition of scaled_dot_product_attention: the batch and head axes merged by a Reshape, a 3-D
// Transpose of the last two, and a Reshape back ([B,H,S,D] -> [B*H,S,D] -> [B*H,D,S] -> [B,H,D,S]), the same values.
struct TransposedKeys {
  std::string k;
  std::vector<std::size_t> merged;  // the decomposition's nodes, outermost first (empty for a Transpose)
  bool from_bshd = false;           // K is [B,S,H,D]
  std::optional<std::size_t> transpose;
};

std::optional<TransposedKeys> transposed_keys(const Graph& g, const Uses& uses, const std::string& kt) {
  TransposedKeys out;
  if (auto chain = merged_heads_transpose(g, uses, kt)) {
    out.k = chain->first;
    out.merged = chain->second;
    return out;
  }
  out.transpose = uses.producer(kt);
  if (!out.transpose || !is_onnx(g.nodes[*out.transpose], "Transpose")) return std::nullopt;
  const auto perm = g.nodes[*out.transpose].attrs.get_ints("perm", {});
  out.from_bshd = perm == std::vector<std::int64_t>{0, 2, 3, 1};
  std::vector<std::int64_t> last_two(perm.size());  // the leading axes in place, the last two swapped
  for (std::size_t d = 0; d < perm.size(); ++d) last_two[d] = static_cast<std::int64_t>(d);
  if (perm.size() >= 3) std::swap(last_two[perm.size() - 1], last_two[perm.size() - 2]);  // rank 3: Note [Masked-fill
  if (!out.from_bshd && (perm.size() < 3 || perm != last_two)) return std::nullopt;           // scores]
  out.k = g.nodes[*out.transpose].inputs[0];
  return out;
}

// The nodes of K^T's chain (the Transpose, or the decomposition's nodes) that go with the attention: those whose values
// nothing else reads (`kt` read only by `kt_reader`, the next node of the chain); none when something else reads one.
std::vector<std::size_t> private_key_chain(const Graph& g, const Uses& uses, const Rewriter& rw,
                                           const TransposedKeys& keys, const std::string& kt, std::size_t kt_reader) {
  if (keys.transpose) {
    if (uses.only_reader(kt, kt_reader) && !rw.taken(*keys.transpose)) return {*keys.transpose};
    return {};
  }
  const std::vector<std::size_t>& merged = keys.merged;
  bool chain_private = uses.only_reader(kt, kt_reader);
  for (std::size_t c = 0; c + 1 < merged.size() && chain_private; ++c) {
    chain_private = uses.only_reader(g.nodes[merged[c + 1]].outputs[0], merged[c]);
  }
  for (std::size_t c : merged) chain_private = chain_private && !rw.taken(c);
  return chain_private ? merged : std::vector<std::size_t>{};
}

// The probabilities MatMul(., V) reads: the softmax's (after its casts) `p`, or the output of the NaN guard reading it,
// whose IsNaN and Where join `nodes`; with `zero_masked_rows` when a mask that may hold -inf makes the guard the
// Attention's fully_masked_rows="zero" (Note [The NaN guard of fully masked rows]).
struct GuardedProbabilities {
  std::string value;
  bool zero_masked_rows = false;
};

GuardedProbabilities guarded_probabilities(const Graph& g, const Uses& uses, const Matcher& m, const std::string& p,
                                           const AdditiveTerms& additive, std::vector<std::size_t>& nodes) {
  auto guard = nan_guard(g, uses, m, p);
  if (!guard) return {p, false};
  bool finite = true;
  for (const std::string& term : additive.terms) finite = finite && finite_mask(g, uses, term, 4);
  if (additive.window) finite = finite && finite_mask(g, uses, additive.window->mask, 4);
  nodes.push_back(guard->first);
  nodes.push_back(guard->second);
  return {g.nodes[guard->second].outputs[0], !finite};
}

// "fused <the nodes, in graph order> -> Attention '<name>'".
std::string fusion_note(const Graph& g, std::vector<std::size_t> nodes, const std::string& name) {
  std::sort(nodes.begin(), nodes.end());
  std::string note = "fused ";
  for (std::size_t idx = 0; idx < nodes.size(); ++idx) note += (idx ? " + " : "") + describe(g.nodes[nodes[idx]]);
  return note + " -> Attention '" + name + "'";
}

// Note [Softmax in float32]
// transformers' eager attention (Llama, Mistral, Qwen2, Gemma and most decoders it writes) takes the softmax in float32
// whatever the model's dtype: softmax(scores, dtype=float32).to(q.dtype). The exporters write it two ways:
//  * the dynamo exporter: Cast(to=float) -> Softmax -> Cast(to=q's dtype). The fused kernels hold the scores, the
//    running maximum and the sums in float32 already, so both Casts go into the attention with the chain; the
//    difference is that the unfused chain first rounds the scores to q's dtype (the MatMul's output), which the kernels
//    do not: the fused result is the closer one to exact arithmetic. Only the pair fuses: a float32 softmax whose
//    float32 output something reads stays as it is.
//  * PyTorch's TorchScript exporter (its softmax symbolic casts after the Softmax): Softmax -> Cast(to=float) ->
//    Cast(to=q's dtype), the softmax in q's dtype. The two Casts are a round trip through a type that holds every
//    value of q's (Note [Round-trip casts] in elimination.cpp): the probabilities are the Softmax's own, so the pair
//    goes with the chain too. identity_elimination removes such a pair before this pass runs; the matcher takes it as
//    well, so that the attention does not hang on which passes ran first (disabled_passes). Until the round trip was
//    understood (2026-12-02), this form was why the TorchScript exports of transformers' eager decoders (the 1B
//    Llama of docs/benchmarks.md) ran their attention as Transpose, MatMul, Softmax, Expand and Concat kernels.
struct SoftmaxCasts {
  std::optional<std::size_t> up;   // Cast(to=float) -> Softmax
  std::vector<std::size_t> after;  // the Casts after the Softmax, in order: the one back, or the round trip's two
  std::optional<DType> back;       // the type the last Cast gives, which must be q's (checked with q's type)
};

// Softmax(x) -> Cast(to=W) -> Cast(to=dtype(x)) with W holding every value of x's type, each value read only by the
// next node (the TorchScript form of Note [Softmax in float32]): both Casts; none when the softmax's output is not
// cast so.
SoftmaxCasts round_trip_after(const Graph& g, const Matcher& m, std::size_t softmax) {
  const Node& s = g.nodes[softmax];
  const auto dtype = value_dtype(g, s.inputs[0]);
  const auto wide = m.sole_reader(s.outputs[0], "Cast");
  const auto back = wide ? m.sole_reader(m.node(*wide).outputs[0], "Cast") : std::nullopt;
  if (!dtype || !back) return {};
  const auto to_wide = dtype_from_onnx(m.node(*wide).attrs.get_int("to", 0));
  const auto to_back = dtype_from_onnx(m.node(*back).attrs.get_int("to", 0));
  if (!to_wide || !to_back || *to_back != *dtype || !widens_exactly(*dtype, *to_wide)) return {};
  return SoftmaxCasts{std::nullopt, {*wide, *back}, to_back};
}

std::optional<SoftmaxCasts> softmax_casts(const Graph& g, const Matcher& m, std::size_t softmax) {
  const Node& s = g.nodes[softmax];
  auto up = m.sole_producer(s.inputs[0], softmax, "Cast");
  if (!up) return round_trip_after(g, m, softmax);
  if (dtype_from_onnx(m.node(*up).attrs.get_int("to", 0)) != DType::kFloat32) return std::nullopt;
  auto down = m.sole_reader(s.outputs[0], "Cast");
  if (!down) return std::nullopt;
  auto back = dtype_from_onnx(m.node(*down).attrs.get_int("to", 0));
  if (!back) return std::nullopt;
  return SoftmaxCasts{up, {*down}, back};
}

// Long function: one pattern matched backwards and forwards from each Softmax through the forms exporters write
// (Notes above: scales, casts, terms, NaN guards, K^T chains, merged batch dims), every check before the one rewrite.
PassResult attention_fusion(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"attention_fusion", 0, {}};
  MaskTerms mask_terms;  // Note [Masked-fill scores]
  Rewriter rw(g);
  const Uses uses(g);
  const Matcher m(g, uses, rw);
  for (std::size_t si = 0; si < g.nodes.size(); ++si) {
    const Node& softmax = g.nodes[si];
    if (rw.taken(si) || !is_onnx(softmax, "Softmax") || softmax.inputs.size() != 1) continue;
    const std::int64_t opset = g.opset(softmax.domain);
    const std::int64_t axis = softmax.attrs.get_int("axis", opset >= 13 ? -1 : 1);
    // The last axis: -1, or rank - 1 (opset < 13 flattens at axis, the same there); Q K^T may be of rank > 4 (Note
    // [Attention over more than one batch dim]).
    const auto scores_type = value_type(g, softmax.inputs[0]);
    const bool last_axis = axis == -1 || (scores_type && scores_type->has_shape &&
                                          axis == static_cast<std::int64_t>(scores_type->shape.size()) - 1);
    if (!last_axis) continue;
    // Backwards from the softmax (or its upcast: Note [Softmax in float32]): [Add t2] <- [Add t1] <- [Div|Mul scale]
    // <- MatMul(Q, K^T) (Note [Attention with additive terms]).
    const auto casts = softmax_casts(g, m, si);
    if (!casts) continue;
    // A masked fill, then a view of [B * H, Sq, Sk] scores as [B, H, Sq, Sk], may come first (Note [Masked-fill
    // scores]).
    std::size_t start_reader = casts->up ? *casts->up : si;
    std::string start = m.node(start_reader).inputs[0];
    const auto fill = masked_fill(g, m, start, start_reader);
    if (fill) std::tie(start, start_reader) = std::make_pair(fill->scores, fill->where);
    const auto view_term = fill ? std::nullopt : term_after_heads_view(g, m, start, start_reader);
    const auto view = view_term ? std::optional<HeadsView>(view_term->view) : heads_view(g, m, start, start_reader);
    if (view) std::tie(start, start_reader) = std::make_pair(m.node(view->reshape).inputs[0], view->reshape);
    auto additive = additive_terms(g, uses, m, start, start_reader);
    if (!additive || ((fill || view) && additive->window)) continue;
    std::vector<std::size_t> nodes = {si};
    if (fill) nodes.push_back(fill->where);
    if (view_term) nodes.push_back(view_term->add);
    if (view) nodes.push_back(view->reshape);
    if (casts->up) nodes.push_back(*casts->up);
    nodes.insert(nodes.end(), casts->after.begin(), casts->after.end());
    nodes.insert(nodes.end(), additive->adds.begin(), additive->adds.end());
    std::string scores = additive->scores;
    std::size_t reader = additive->reader;
    // 16-bit scores cast to float32 before a float32 mask (Note [Scores promoted to float32 by a float32 mask]).
    const auto promoted = m.sole_producer(scores, reader, "Cast");
    if (promoted && (casts->up || fill || view || !promotes_to_float32(g, m.node(*promoted)))) continue;
    if (promoted) {
      nodes.push_back(*promoted);
      reader = *promoted;
      scores = m.node(*promoted).inputs[0];
    }
    double scale = 1.0;
    // Strips a Div or Mul by a scale from `value` (read only by node `value_reader`): multiplies `scale` by it.
    auto strip_scale = [&](std::string& value, std::size_t value_reader) {
      for (const char* op : {"Div", "Mul"}) {
        auto p = m.sole_producer(value, value_reader, op);
        if (!p) continue;
        auto factor = scale_operand(g, m.node(*p));
        if (!factor) return std::optional<std::size_t>();
        scale *= factor->second;
        value = m.node(*p).inputs[factor->first];
        nodes.push_back(*p);
        return p;
      }
      return std::optional<std::size_t>();
    };
    if (auto p = strip_scale(scores, reader)) reader = *p;
    std::optional<std::string> head_scale;  // Note [Per-head scales of the scores]
    if (auto p = m.sole_producer(scores, reader, "Mul"); p && !promoted) {
      if (auto k = head_scale_operand(g, m.node(*p))) {
        head_scale = m.node(*p).inputs[*k];
        scores = m.node(*p).inputs[1 - *k];
        nodes.push_back(*p);
        reader = *p;
        if (auto q = strip_scale(scores, reader)) reader = *q;
      }
    }
    auto qk = m.sole_producer(scores, reader, "MatMul");
    if (!qk || (head_scale && depends_on(g, uses, *head_scale, *qk))) continue;
    nodes.push_back(*qk);
    const Node& qk_node = m.node(*qk);
    // PyTorch's scaled_dot_product_attention export scales Q and K^T by sqrt(scale) each before the MatMul.
    std::string q = qk_node.inputs[0];
    std::string kt = qk_node.inputs[1];
    if (q == kt) continue;
    strip_scale(q, *qk);
    const auto kt_scale = strip_scale(kt, *qk);
    const std::size_t kt_reader = kt_scale ? *kt_scale : *qk;
    auto keys = transposed_keys(g, uses, kt);
    if (!keys) continue;
    std::string k = keys->k;
    // K scaled before its Transpose (MaxViT's k * scale): the scale joins the attention's with the Transpose.
    if (keys->transpose && uses.only_reader(kt, kt_reader) && !rw.taken(*keys->transpose)) {
      strip_scale(k, *keys->transpose);
    }
    const bool from_bshd = keys->from_bshd;
    // Forwards: MatMul(probabilities, V), where the probabilities may pass through Where(IsNaN(p), 0, p), PyTorch's
    // guard for rows masked entirely by -inf: dropped where the mask cannot hold -inf, else the attention gives such
    // rows 0 itself (Note [The NaN guard of fully masked rows]).
    const GuardedProbabilities guarded = guarded_probabilities(
        g, uses, m, casts->after.empty() ? softmax.outputs[0] : m.node(casts->after.back()).outputs[0], *additive,
        nodes);
    std::string probabilities = guarded.value;
    const bool zero_masked_rows = guarded.zero_masked_rows;
    if (fill && zero_masked_rows) continue;
    if (view) {  // the probabilities viewed back as [B * H, Sq, Sk]
      auto back = m.sole_reader(probabilities, "Reshape");
      if (!back || static_shape(g, m.node(*back).outputs[0]) != view->merged) continue;
      nodes.push_back(*back);
      probabilities = m.node(*back).outputs[0];
    }
    auto pv = m.sole_reader(probabilities, "MatMul");
    if (!pv || m.node(*pv).inputs[0] != probabilities || m.node(*pv).inputs.size() != 2) continue;
    nodes.push_back(*pv);
    std::string v = m.node(*pv).inputs[1];
    std::optional<std::size_t> out_view;
    if (view) {  // q, k and v read as the [B, H, S, d] values their 3-D views are of
      const auto q4 = heads_source(g, uses, q, *view), k4 = heads_source(g, uses, k, *view);
      const auto v4 = heads_source(g, uses, v, *view);
      if (from_bshd || !q4 || !k4 || !v4) continue;
      std::tie(q, k, v) = std::make_tuple(*q4, *k4, *v4);
      // The 3-D output viewed as [B, H, Sq, dv] again (DeBERTa's next view): the attention writes that value.
      out_view = m.sole_reader(m.node(*pv).outputs[0], "Reshape");
      const auto viewed = out_view ? static_shape(g, m.node(*out_view).outputs[0]) : std::nullopt;
      const auto v_shape = static_shape(g, v);
      if (!viewed || !v_shape || *viewed != std::vector<std::int64_t>{view->batch, view->heads, view->merged[1],
                                                                      (*v_shape)[3]}) {
        out_view.reset();
      }
      if (out_view) nodes.push_back(*out_view);
    }
    // Types: Q [B,H,Sq,D], K [B,S,H,D] or [B,H,S,D], V [B,H,S,Dv], all of one fusable float type, the attention's;
    // or Q and K of the 16-bit type whose scores were promoted, the rest float32 (Note [Scores promoted to float32
    // by a float32 mask]).
    auto tq = value_type(g, q), tk = value_type(g, k), tv = value_type(g, v);
    if (!tq || !tk || !tv || !tq->has_shape || !tk->has_shape || !tv->has_shape) continue;
    MergedBatch merged{tq->shape.size(), {}};  // Note [Attention over more than one batch dim]
    if (merged.rank < 4 || tk->shape.size() != merged.rank || tv->shape.size() != merged.rank) continue;
    if (merged.rank > 4) {
      const auto lq = leading_dims(*tq), lk = leading_dims(*tk), lv = leading_dims(*tv);
      if (from_bshd || additive->window || head_scale || !lq || lq != lk || lq != lv) continue;
      if (!static_shape(g, m.node(*pv).outputs[0])) continue;
      merged.lead = *lq;
      tq = merged_type(*tq, merged);
      tk = merged_type(*tk, merged);
      tv = merged_type(*tv, merged);
    }
    const DType dtype = promoted ? DType::kFloat32 : tq->dtype;
    if (!is_fusable_float(tq->dtype) || tk->dtype != tq->dtype || tv->dtype != dtype) continue;
    if (promoted && value_dtype(g, m.node(*promoted).inputs[0]) != tq->dtype) continue;
    if (casts->back && *casts->back != dtype) continue;  // Note [Softmax in float32]: cast back to q's dtype
    std::vector<Dim> k_bhsd = tk->shape;
    if (from_bshd) k_bhsd = {tk->shape[0], tk->shape[2], tk->shape[1], tk->shape[3]};
    if (!same_dims(tq->shape, {0, 1, 3}, k_bhsd, {0, 1, 3}) || !same_dims(tv->shape, {0, 1, 2}, k_bhsd, {0, 1, 2})) {
      continue;
    }
    const std::vector<Dim> scores_shape = {tq->shape[0], tq->shape[1], tq->shape[2], k_bhsd[2]};
    std::vector<std::vector<Dim>> term_shapes;
    std::vector<bool> split_terms;  // viewed as [B, H, Sq, Sk] (Note [Masked-fill scores])
    for (const std::string& term : additive->terms) {
      if (view) {
        if (auto shape = heads_term_shape(g, term, dtype, *view)) {
          term_shapes.push_back(shape->first);
          split_terms.push_back(shape->second);
        }
      } else if (auto shape = term_shape(g, term, dtype, scores_shape, merged.rank > 4)) {
        term_shapes.push_back(*shape);
        split_terms.push_back(false);
      }
    }
    if (term_shapes.size() != additive->terms.size()) continue;
    const auto view_term_shape =
        view_term ? term_shape(g, view_term->term, dtype, scores_shape, false) : std::nullopt;
    if (view_term && !view_term_shape) continue;
    const auto fill_shape = fill ? masked_fill_shape(g, *fill, scores_shape) : std::nullopt;
    if (fill && !fill_shape) continue;
    if (additive->window) {  // the window form's static [B * nW, H, Sq, Sk] is the scores' shape
      bool same = true;
      for (std::size_t d = 0; d < 4; ++d) same = same && same_dim(scores_shape[d], Dim(additive->window->scores[d]));
      if (!same) continue;
    }
    if (rw.any_taken(nodes)) continue;
    const std::vector<std::size_t> key_chain = private_key_chain(g, uses, rw, *keys, kt, kt_reader);
    nodes.insert(nodes.end(), key_chain.begin(), key_chain.end());
    std::vector<Node> new_nodes;
    std::string k_input = k;
    if (from_bshd) {
      k_input = g.unique_name(k + "_bhsd");
      ValueType kt_type = *tk;
      kt_type.shape = k_bhsd;
      g.types[k_input] = kt_type;
      Node t = make_node(qk_node.name + "_k_bhsd", "Transpose", {k}, {k_input});
      t.domain = "";
      t.attrs.set("perm", std::vector<std::int64_t>{0, 2, 1, 3});
      new_nodes.push_back(std::move(t));
    }
    std::vector<std::string> inputs = {reshaped_input(g, q, *tq, q + "_merged", new_nodes),
                                       reshaped_input(g, k_input, *tk, k_input + "_merged", new_nodes),
                                       reshaped_input(g, v, *tv, v + "_merged", new_nodes)};
    if (head_scale) {  // Note [Per-head scales of the scores]
      const std::string scaled = g.unique_name(q + "_head_scaled");
      g.types[scaled] = *tq;
      Node mul = make_node(scaled, "Mul", {inputs[0], *head_scale}, {scaled});
      mul.domain = "";
      new_nodes.push_back(std::move(mul));
      inputs[0] = scaled;
    }
    if (promoted) {  // Note [Scores promoted to float32 by a float32 mask]
      inputs[0] = float32_copy(g, inputs[0], *tq, qk_node.name + "_q_float", new_nodes);
      ValueType k_type = *tk;
      k_type.shape = k_bhsd;
      inputs[1] = float32_copy(g, inputs[1], k_type, qk_node.name + "_k_float", new_nodes);
    }
    std::vector<std::string> terms = additive->terms;
    for (std::size_t t = 0; t < terms.size(); ++t) {
      if (merged.rank > 4) terms[t] = merged_term(g, terms[t], new_nodes);  // checked by term_shape
      if (split_terms[t]) terms[t] = heads_term(g, terms[t], term_shapes[t], dtype, new_nodes);
    }
    if (view_term) {
      terms.push_back(view_term->term);
      term_shapes.push_back(*view_term_shape);
    }
    if (fill) {
      terms.push_back(masked_fill_term(g, *fill, dtype, qk_node.name, new_nodes, mask_terms));
      term_shapes.push_back(*fill_shape);
    }
    if (additive->window) {
      terms.push_back(window_term_input(g, *additive->window, dtype, qk_node.name, new_nodes));
      term_shapes.emplace_back(additive->window->scores.begin(), additive->window->scores.end());
    }
    if (!terms.empty()) inputs.push_back(one_additive_input(g, terms, term_shapes, dtype, qk_node.name, new_nodes));
    const std::string& out = m.node(out_view ? *out_view : *pv).outputs[0];
    std::string fused_out = out;
    if (merged.rank > 4) {  // the output viewed back to rank R
      fused_out = g.unique_name(out + "_merged");
      g.types[fused_out] = merged_type(*value_type(g, out), merged);
    } else if (view && !out_view) {  // the output [B, H, Sq, dv] viewed back as the 3-D MatMul's
      const ValueType flat = *value_type(g, out);
      fused_out = typed_value(g, out + "_heads", flat.dtype,
                              {Dim(view->batch), Dim(view->heads), flat.shape[1], flat.shape[2]});
    }
    Node fused = make_node(qk_node.name, "Attention", inputs, {fused_out});
    fused.attrs.set("scale", scale);
    fused.attrs.set("causal", static_cast<std::int64_t>(0));
    if (zero_masked_rows) fused.attrs.set("fully_masked_rows", std::string("zero"));
    const bool uniform_rows = fill && std::isfinite(fill->fill);  // Note [Masked-fill scores]
    if (uniform_rows) fused.attrs.set("fully_masked_rows", std::string("uniform"));
    new_nodes.push_back(std::move(fused));
    if (fused_out != out) {
      Node back = reshape_node(g, fused_out + "_back", fused_out, *static_shape(g, out), out);
      back.domain = "";
      new_nodes.push_back(std::move(back));
    }
    std::string note = fusion_note(g, nodes, qk_node.name);
    if (zero_masked_rows) note += " (fully_masked_rows=zero: the NaN guard of a mask that may hold -inf)";
    if (uniform_rows) note += " (fully_masked_rows=uniform: the masked fill's finite value)";
    rw.replace(nodes, std::move(new_nodes), std::move(note));
  }
  rw.apply(result);
  fold_repeated_kv_heads(g, result);
  fold_head_transposes(g, result);
  fold_packed_qkv(g, result);
  return result;
}

}  // namespace xpuruntime::passes
