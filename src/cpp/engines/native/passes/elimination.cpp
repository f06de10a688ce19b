// Elimination passes: identity_elimination, dead_node_elimination (see passes.h, docs/native_engine.md).
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

// The shape Reshape produces from `input` and the `target` shape, or nullopt when it cannot be resolved.
std::optional<std::vector<std::int64_t>> reshape_result(const std::vector<std::int64_t>& input,
                                                        const std::vector<std::int64_t>& target, bool allowzero) {
  std::vector<std::int64_t> out(target.size());
  std::int64_t known = 1;
  std::optional<std::size_t> inferred;
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] == -1) {
      if (inferred) return std::nullopt;
      inferred = i;
      continue;
    }
    if (target[i] == 0 && !allowzero) {
      if (i >= input.size()) return std::nullopt;
      out[i] = input[i];
    } else if (target[i] < 0) {
      return std::nullopt;
    } else {
      out[i] = target[i];
    }
    if (__builtin_mul_overflow(known, out[i], &known)) return std::nullopt;  // past int64 (fuzzed shapes)
  }
  std::int64_t total = 1;
  for (std::int64_t d : input) {
    if (__builtin_mul_overflow(total, d, &total)) return std::nullopt;
  }
  if (inferred) {
    if (known == 0 || total % known != 0) return std::nullopt;
    out[*inferred] = total / known;
  } else if (known != total) {
    return std::nullopt;
  }
  return out;
}

// An ONNX Cast with a named input and output (is_onnx checks the domain, the op and the arity).
bool is_onnx_cast(const Node& n) { return is_onnx(n, "Cast") && !n.inputs[0].empty() && !n.outputs[0].empty(); }

// Whether node `n` only forwards its first input to its first output (for the values it is given).
bool is_noop(const Graph& g, const Uses& uses, const Node& n) {
  if (!(n.domain.empty() || n.domain == "ai.onnx") || !has_onnx_arity(n) || n.inputs.empty() || n.outputs.empty()) {
    return false;
  }
  if (n.inputs[0].empty() || n.outputs[0].empty()) return false;
  const std::int64_t opset = g.opset(n.domain);
  if (n.op_type == "Identity") return n.outputs.size() == 1;
  if (n.op_type == "Dropout") {
    if (n.outputs.size() > 1 && !n.outputs[1].empty() && !uses.unused(n.outputs[1])) return false;  // mask read
    if (opset < 7) return n.attrs.get_int("is_test", 0) != 0;
    if (opset >= 12 && n.has_input(2)) {  // training_mode (a bool scalar)
      const Tensor* training = constant(g, n.inputs[2]);
      return training != nullptr && training->numel() == 1 && to_doubles(*training)[0] == 0.0;
    }
    return true;
  }
  if (n.op_type == "Cast") {
    auto to = dtype_from_onnx(n.attrs.get_int("to", 0));
    auto from = value_dtype(g, n.inputs[0]);
    return to && from && *to == *from;
  }
  // Pads all zero, any mode: torchvision's Swin pads each window partition up to a multiple of the window, zero
  // where the windows divide the feature map.
  if (n.op_type == "Pad") {
    std::vector<std::int64_t> pads;
    if (opset < 11) {
      pads = n.attrs.get_ints("pads", {});
    } else {
      const Tensor* t = n.inputs.size() > 1 && !n.inputs[1].empty() ? constant(g, n.inputs[1]) : nullptr;
      if (t == nullptr || t->dtype() != DType::kInt64) return false;
      pads = to_int64s(*t);
    }
    return !pads.empty() && std::all_of(pads.begin(), pads.end(), [](std::int64_t p) { return p == 0; });
  }
  if (n.op_type == "Reshape") {
    auto input = static_shape(g, n.inputs[0]);
    if (!input) return false;
    std::vector<std::int64_t> target;
    if (opset < 5) {
      if (!n.attrs.has("shape")) return false;
      target = n.attrs.get_ints("shape", {});
    } else {
      const Tensor* t = n.inputs.size() > 1 ? constant(g, n.inputs[1]) : nullptr;
      if (t == nullptr || !(t->dtype() == DType::kInt64 || t->dtype() == DType::kInt32)) return false;
      target = to_int64s(*t);
    }
    auto out = reshape_result(*input, target, n.attrs.get_int("allowzero", 0) != 0);
    return out && *out == *input;
  }
  // x * 1 and x / 1 by a one-element constant that broadcasts to nothing more than x (BLOOM's baddbmm with beta=1
  // writes Mul(alibi, 1)): exact for every value, NaN and infinities included.
  if ((n.op_type == "Mul" || n.op_type == "Div") && n.inputs.size() == 2 && n.outputs.size() == 1) {
    const Tensor* c = constant(g, n.inputs[1]);
    const auto x = value_type(g, n.inputs[0]);
    if (c == nullptr || c->numel() != 1 || !x || !x->has_shape || c->shape().size() > x->shape.size() ||
        c->dtype() != x->dtype) {
      return false;
    }
    return to_doubles(*c)[0] == 1.0;
  }
  return false;
}

// Note [Round-trip casts]
// Cast(Cast(x, to=T), to=dtype(x)) is x itself when the first Cast widens exactly: every value of x's type is one of
// T's (float16 and bfloat16 in float32 or float64, float32 in float64, an integer type in a wider one that holds its
// whole range), so the second Cast gives x's values back. Exporters write this where a model asks for float32 and
// returns to its dtype with nothing in between: PyTorch's TorchScript exporter writes transformers' eager attention,
// softmax(scores, dtype=float32).to(float16), as Softmax -> Cast(to=float) -> Cast(to=float16) (its softmax symbolic
// casts after the Softmax), and the two Casts stood between the softmax and the MatMul that attention_fusion looks
// for. The second Cast's readers read x; the first Cast goes with dead_node_elimination when nothing else reads it.
// Which casts widen exactly: widens_exactly in pass_utils.h (attention_fusion reads the same pair after a Softmax
// itself, Note [Softmax in float32]).

// The Casts of `g` by output: their input and target type (for Note [Round-trip casts]).
std::unordered_map<std::string, std::pair<std::string, DType>> casts_by_output(const Graph& g) {
  std::unordered_map<std::string, std::pair<std::string, DType>> out;
  for (const Node& n : g.nodes) {
    if (!is_onnx_cast(n)) continue;
    if (auto to = dtype_from_onnx(n.attrs.get_int("to", 0))) out[n.outputs[0]] = {n.inputs[0], *to};
  }
  return out;
}

// The value node `n` gives back unchanged by undoing an exactly widening Cast (Note [Round-trip casts]), if any.
std::optional<std::string> round_trip_source(
    const Graph& g, const Node& n, const std::unordered_map<std::string, std::pair<std::string, DType>>& casts) {
  if (!is_onnx_cast(n)) return std::nullopt;
  const auto first = casts.find(n.inputs[0]);
  if (first == casts.end()) return std::nullopt;
  const std::string& x = first->second.first;
  auto from = value_dtype(g, x);
  auto back = dtype_from_onnx(n.attrs.get_int("to", 0));
  if (!from || !back || *back != *from || !widens_exactly(*from, first->second.second)) return std::nullopt;
  return x;
}

// Note [Expands before broadcasting ops]
// x / expand(n, x.shape) is x / n: an Expand whose every reader is a binary op that broadcasts its operands (the
// arithmetic ops, comparisons, logical ops) and whose reader's output keeps its shape with the Expand's input in its
// place (the reader's other operand already has the expanded shape) writes a tensor the reader would have broadcast
// anyway. F.normalize exports as ReduceL2 -> Clip -> Expand -> Div (Swin V2's cosine attention normalises q and k
// so, twice in each of its 12 blocks); the Expand was a kernel and a pass over the head's size of its own, and stood
// between the reduction and the Div that the elementwise fusion would put in one row program. Its readers read the
// Expand's input instead.

// The shape of numpy broadcasting `a` with `b`, or nullopt when they do not broadcast.
std::optional<std::vector<std::int64_t>> broadcast_of(const std::vector<std::int64_t>& a,
                                                      const std::vector<std::int64_t>& b) {
  std::vector<std::int64_t> out(std::max(a.size(), b.size()), 1);
  for (std::size_t j = 0; j < out.size(); ++j) {
    const std::int64_t x = j < a.size() ? a[a.size() - 1 - j] : 1;
    const std::int64_t y = j < b.size() ? b[b.size() - 1 - j] : 1;
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[out.size() - 1 - j] = x == 1 ? y : x;
  }
  return out;
}

// Whether `n` is an Expand that Note [Expands before broadcasting ops] removes.
bool is_redundant_expand(const Graph& g, const Uses& uses, const Node& n) {
  if (!is_onnx(n, "Expand") || n.inputs.size() != 2 || n.outputs.size() != 1 || g.opset("") < 8) return false;
  const std::string& out = n.outputs[0];
  auto source = static_shape(g, n.inputs[0]);
  auto expanded = static_shape(g, out);
  if (!source || !expanded || uses.readers(out).empty()) return false;
  static const std::set<std::string> kBroadcasting = {
      "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
      "And", "Or", "Xor"};
  for (const std::size_t r : uses.readers(out)) {
    const Node& reader = g.nodes[r];
    if (!(reader.domain.empty() || reader.domain == "ai.onnx") || !kBroadcasting.count(reader.op_type) ||
        reader.inputs.size() != 2 || reader.outputs.size() != 1) {
      return false;
    }
    auto result = static_shape(g, reader.outputs[0]);
    if (!result) return false;
    std::vector<std::vector<std::int64_t>> operands;
    for (const std::string& in : reader.inputs) {
      // Another Expand beside it may go too, and then the two would broadcast to less: keep this one.
      if (in != out) {
        const auto other = uses.producer(in);
        if (other && is_onnx(g.nodes[*other], "Expand")) return false;
      }
      auto shape = in == out ? source : static_shape(g, in);
      if (!shape) return false;
      operands.push_back(*shape);
    }
    if (broadcast_of(operands[0], operands[1]) != result) return false;
  }
  return true;
}

void rename_everywhere(Graph& g, const std::string& from, const std::string& to) {
  for (Node& n : g.nodes) {
    std::replace(n.inputs.begin(), n.inputs.end(), from, to);
    std::replace(n.outputs.begin(), n.outputs.end(), from, to);
  }
}

}  // namespace

PassResult identity_elimination(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"identity_elimination", 0, {}};
  // Phase 1: a no-op whose output is not a graph output: its readers read its input instead.
  {
    const Uses uses(g);
    const auto casts = casts_by_output(g);
    std::set<std::string> redundant_expands;  // decided on the whole graph: the loop below moves nodes out of it
    for (const Node& n : g.nodes) {
      if (is_redundant_expand(g, uses, n)) redundant_expands.insert(n.outputs[0]);
    }
    std::unordered_map<std::string, std::string> alias;  // removed output -> the value it forwarded
    std::vector<Node> kept;
    kept.reserve(g.nodes.size());
    for (Node& n : g.nodes) {
      for (auto& in : n.inputs) {
        auto it = alias.find(in);
        if (it != alias.end()) in = it->second;
      }
      const bool private_output =
          !n.outputs.empty() && !uses.is_graph_output(n.outputs[0]) && !uses.read_by_subgraph(n.outputs[0]);
      std::optional<std::string> source;
      if (private_output && (is_noop(g, uses, n) || redundant_expands.count(n.outputs[0]) != 0)) {
        source = n.inputs[0];
      } else if (private_output) {
        source = round_trip_source(g, n, casts);  // Note [Round-trip casts]
        if (source) {
          auto it = alias.find(*source);
          if (it != alias.end()) source = it->second;
        }
      }
      if (!source) {
        kept.push_back(std::move(n));
        continue;
      }
      alias[n.outputs[0]] = *source;
      result.notes.push_back(detail::str_cat("removed ", describe(n), ": ", n.outputs[0], " -> ", *source));
      ++result.rewrites;
    }
    g.nodes = std::move(kept);
  }
  // Phase 2: a no-op producing a graph output from a value another node produces: that node produces the graph
  // output directly (the graph keeps its output names). Not when the input is a graph input or a constant.
  for (bool changed = true; changed;) {
    changed = false;
    const Uses uses(g);
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (!is_noop(g, uses, n) || !uses.is_graph_output(n.outputs[0])) continue;
      const std::string in = n.inputs[0];
      const std::string out = n.outputs[0];
      if (!uses.producer(in) || uses.is_graph_output(in) || uses.read_by_subgraph(in) || uses.read_by_subgraph(out)) {
        continue;
      }
      result.notes.push_back(detail::str_cat("removed ", describe(n), ": ", in, " renamed ", out));
      ++result.rewrites;
      g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
      rename_everywhere(g, in, out);
      changed = true;
      break;
    }
  }
  g.validate();
  return result;
}

// Note [Reductions of predicates]
// PyTorch exports `isinf(x).any()` and `(x > 0).all()` as IsInf/Greater -> Cast(bool -> int64) -> ReduceMax/ReduceMin
// [-> Cast(to bool)], and `isinf(h.float())` as Cast(float16 -> float32) -> IsInf: three passes over the tensor and a
// cast of the one result, each a kernel launch (T5's fp16 guard, `clamp_value = where(isinf(h).any(), ...)`, runs
// twelve times a forward: 96 of its 152 kernels at batch 1). predicate_reduction rewrites
//   IsInf/IsNaN(Cast(x -> a float type that holds x's values)) -> IsInf/IsNaN(x)      (a widening cast keeps inf/NaN)
//   ReduceMax/ReduceMin(Cast(b: bool -> T)) -> Cast(ReduceMax/ReduceMin(b) -> T)      (max of 0/1 is any, min is all)
// so the reduction reads the bytes of the predicate, and the cast after it, with a Cast back to bool behind it, is a
// round trip identity_elimination removes (Note [Round-trip casts]: bool widens exactly into every numeric type).
// The values are the same: the reduction of bools (the registry's reduce_max/reduce_min of bool, ONNX's ReduceMax-20)
// gives the 0 or 1 the reduction of the cast gave, and an empty axis is refused as before.
PassResult predicate_reduction(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"predicate_reduction", 0, {}};
  std::unordered_map<std::string, std::pair<std::string, std::int64_t>> casts;  // by output: input, ONNX `to`
  for (const Node& n : g.nodes) {
    if (is_onnx_cast(n)) casts[n.outputs[0]] = {n.inputs[0], n.attrs.get_int("to", 0)};
  }
  // The Cast producing `value`, if one does: its input, target type and ONNX `to` code.
  struct CastOf {
    std::string input;
    DType to;
    std::int64_t code;
  };
  const auto cast_of = [&](const std::string& value) -> std::optional<CastOf> {
    const auto it = casts.find(value);
    if (it == casts.end()) return std::nullopt;
    const auto to = dtype_from_onnx(it->second.second);
    if (!to) return std::nullopt;
    return CastOf{it->second.first, *to, it->second.second};
  };
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  std::vector<Node> casts_after;
  for (Node& n : g.nodes) {
    casts_after.clear();
    if ((is_onnx(n, "IsInf") || is_onnx(n, "IsNaN")) && !n.inputs.empty()) {
      const auto cast = cast_of(n.inputs[0]);
      const auto from = cast ? value_dtype(g, cast->input) : std::nullopt;
      if (from && is_fusable_float(*from) && widens_exactly(*from, cast->to)) {
        result.notes.push_back(detail::str_cat(describe(n), " reads ", cast->input, " instead of its widening"));
        n.inputs[0] = cast->input;
        ++result.rewrites;
      }
    } else if ((is_onnx(n, "ReduceMax") || is_onnx(n, "ReduceMin")) && !n.inputs.empty() && n.outputs.size() == 1) {
      const auto cast = cast_of(n.inputs[0]);
      const auto out_type = value_type(g, n.outputs[0]);
      if (cast && value_dtype(g, cast->input) == DType::kBool && widens_exactly(DType::kBool, cast->to) && out_type) {
        const std::string y = n.outputs[0];
        ValueType bool_type = *out_type;
        bool_type.dtype = DType::kBool;
        const std::string reduced = g.unique_name(y + "_bool");
        g.types[reduced] = bool_type;
        Node back = make_node(g, "Cast", y + "_cast", {reduced}, {y}, Attributes().set("to", cast->code));
        result.notes.push_back(detail::str_cat(describe(n), " reduces the bools of ", cast->input, ", then casts"));
        n.inputs[0] = cast->input;
        n.outputs[0] = reduced;
        casts_after.push_back(std::move(back));
        ++result.rewrites;
      }
    }
    nodes.push_back(std::move(n));
    for (Node& c : casts_after) nodes.push_back(std::move(c));
  }
  g.nodes = std::move(nodes);
  g.validate();
  return result;
}

PassResult dead_node_elimination(Graph& g, const PassContext& /*ctx*/) {
  PassResult result{"dead_node_elimination", 0, {}};
  // Backwards over a topological order: a node is live when a live node, a subgraph of one, or the graph
  // outputs read one of its outputs.
  std::set<std::string> needed(g.outputs.begin(), g.outputs.end());
  std::vector<bool> live(g.nodes.size(), false);
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    live[i] = std::any_of(n.outputs.begin(), n.outputs.end(),
                          [&](const std::string& out) { return !out.empty() && needed.count(out); });
    if (!live[i]) continue;
    for (const auto& in : n.inputs) {
      if (!in.empty()) needed.insert(in);
    }
    for (const auto& [attr, sub] : n.graph_attrs) {
      (void)attr;
      if (sub) collect_subgraph_reads(*sub, needed);
    }
  }
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (live[i]) {
      kept.push_back(std::move(g.nodes[i]));
      continue;
    }
    result.notes.push_back(detail::str_cat("removed ", describe(g.nodes[i]), ": no reader"));
    ++result.rewrites;
    for (const auto& out : g.nodes[i].outputs) g.types.erase(out);
  }
  g.nodes = std::move(kept);
  for (auto it = g.initializers.begin(); it != g.initializers.end();) {
    const bool is_input = std::find(g.inputs.begin(), g.inputs.end(), it->first) != g.inputs.end();
    if (is_input || needed.count(it->first)) {
      ++it;
      continue;
    }
    result.notes.push_back(detail::str_cat("removed constant ", it->first, ": no reader"));
    ++result.rewrites;
    g.types.erase(it->first);
    it = g.initializers.erase(it);
  }
  g.validate();
  return result;
}

}  // namespace xpuruntime::passes
