// residual_layer_norm_fusion: Add(a, b) read only by a com.xpuruntime:LayerNormalization -> that LayerNormalization
// with b as its residual input (layer_norm(a + b)): the post-LN transformer's residual add costs no kernel of its own.
// post_norm_residual_fusion: Add(r, y) of a com.xpuruntime:LayerNormalization's y that only the Add reads -> that
// LayerNormalization with r as its addend input (r + layer_norm(x)): the res-post-norm block's residual add (Swin V2,
// sandwich norms) neither.
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"

namespace xpuruntime::passes {

namespace {

// Whether `value` has exactly `like`'s shape and dtype, `like` fully known and of a float type the fused
// LayerNormalization takes (no broadcasting).
bool same_fusable_type(const Graph& g, const std::string& value, const std::string& like) {
  using namespace internal;
  const auto t = value_type(g, like);
  const auto v = value_type(g, value);
  if (!t || !v || !t->fully_known() || !is_fusable_float(t->dtype)) return false;
  return same_shape(*v, *t) && v->dtype == t->dtype;
}

}  // namespace

PassResult residual_layer_norm_fusion(Graph& g, const PassContext&) {
  using namespace internal;
  PassResult result{"residual_layer_norm_fusion", 0, {}};
  const Uses uses(g);
  Rewriter rewriter(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& ln = g.nodes[i];
    if (ln.domain != kXpurtDomain || ln.op_type != "LayerNormalization" || ln.inputs.empty()) continue;
    if (ln.inputs.size() > 3 && !ln.inputs[3].empty()) continue;  // already has a residual
    const std::string& x = ln.inputs[0];
    const auto p = uses.producer(x);
    if (!p || rewriter.taken(*p) || rewriter.taken(i) || !uses.only_reader(x, i)) continue;
    const Node& add = g.nodes[*p];
    if (!is_onnx(add, "Add") || add.inputs.size() != 2) continue;
    if (!same_fusable_type(g, add.inputs[0], x) || !same_fusable_type(g, add.inputs[1], x)) continue;
    Node fused = ln;
    fused.inputs.resize(4);
    fused.inputs[0] = add.inputs[0];
    fused.inputs[3] = add.inputs[1];
    rewriter.replace({*p, i}, {fused},
                     "fused Add '" + add.name + "' + LayerNormalization '" + ln.name + "' -> LayerNormalization '" +
                         ln.name + "' (residual input)");
  }
  rewriter.apply(result);
  return result;
}

PassResult post_norm_residual_fusion(Graph& g, const PassContext&) {
  using namespace internal;
  PassResult result{"post_norm_residual_fusion", 0, {}};
  const Uses uses(g);
  Rewriter rewriter(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& add = g.nodes[i];
    if (!is_onnx(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1 || rewriter.taken(i)) continue;
    for (std::size_t side = 0; side < 2; ++side) {
      const std::string& y = add.inputs[side];
      const std::string& r = add.inputs[1 - side];
      const auto p = uses.producer(y);
      if (y == r || !p || rewriter.taken(*p) || !uses.only_reader(y, i)) continue;
      const Node& ln = g.nodes[*p];
      if (ln.domain != kXpurtDomain || ln.op_type != "LayerNormalization" || ln.outputs.size() != 1) continue;
      if (ln.inputs.size() > 4 && !ln.inputs[4].empty()) continue;  // already has an addend
      if (!same_fusable_type(g, r, y)) continue;
      Node fused = ln;
      fused.inputs.resize(5);
      fused.inputs[4] = r;
      fused.outputs = add.outputs;
      rewriter.replace({*p, i}, {fused},
                       "fused LayerNormalization '" + ln.name + "' + Add '" + add.name + "' -> LayerNormalization '" +
                           ln.name + "' (addend input)");
      break;
    }
  }
  rewriter.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
