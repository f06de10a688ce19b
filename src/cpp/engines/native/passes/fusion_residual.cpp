// residual_layer_norm_fusion: Add(a, b) read only by a com.xpuruntime:LayerNormalization -> that LayerNormalization
// with b as its residual input (layer_norm(a + b)): the post-LN transformer's residual add costs no kernel of its own.
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"

namespace xpuruntime::passes {

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
    // Both operands of x's exact shape and type (no broadcasting), float types the fused op takes.
    const auto tx = value_type(g, x);
    const auto ta = value_type(g, add.inputs[0]);
    const auto tb = value_type(g, add.inputs[1]);
    if (!tx || !ta || !tb || !tx->fully_known() || !is_fusable_float(tx->dtype)) continue;
    if (!same_shape(*ta, *tx) || !same_shape(*tb, *tx) || ta->dtype != tx->dtype || tb->dtype != tx->dtype) continue;
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

}  // namespace xpuruntime::passes
