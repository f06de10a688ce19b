// Folding passes: constant_folding, shape_folding, conv_bn_folding (see passes.h, docs/native_engine.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

bool is_onnx_domain(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }

bool nondeterministic(const Node& n) {
  static const std::set<std::string> kRandom = {"RandomNormal",      "RandomUniform", "RandomNormalLike",
                                                "RandomUniformLike", "Bernoulli",     "Multinomial"};
  return is_onnx_domain(n.domain) && kRandom.count(n.op_type) != 0;
}

bool foldable(const Graph& g, const Node& n, const PassContext& ctx) {
  if (!(is_onnx_domain(n.domain) || n.domain == "ai.onnx.ml")) return false;
  if (nondeterministic(n) || !n.graph_attrs.empty()) return false;
  if (ctx.keep_quantized_weights && is_quantized_weight_dequantize(g, n)) return false;  // Note [Quantized fusion]
  if (ctx.keep_int4_weights && is_int4_weight_dequantize(g, n)) return false;  // Note [Int4 weight fusion]
  for (const auto& in : n.inputs) {
    if (!in.empty() && !is_constant(g, in)) return false;
  }
  return true;
}

// Elements of the output of the ops that make big tensors from small constants (ConstantOfShape, Expand, Tile,
// Range), read from their constant inputs; nullopt for other ops or inputs it cannot read. Saturates.
std::optional<double> expanding_output_elements(const Graph& g, const Node& n) {
  auto ints = [&](std::size_t i) -> std::optional<std::vector<double>> {
    const Tensor* t = n.has_input(i) ? constant(g, n.inputs[i]) : nullptr;
    if (t == nullptr) return std::nullopt;
    return to_doubles(*t);
  };
  auto product = [](const std::vector<double>& v) {
    double p = 1;
    for (double d : v) p *= std::max(d, 1.0);
    return p;
  };
  if (n.op_type == "ConstantOfShape") {
    auto shape = ints(0);
    return shape ? std::optional<double>(product(*shape)) : std::nullopt;
  }
  if (n.op_type == "Expand" || n.op_type == "Tile") {
    auto input = n.has_input(0) ? constant(g, n.inputs[0]) : nullptr;
    auto arg = ints(1);
    if (input == nullptr || !arg) return std::nullopt;
    // Expand: at most numel(input) * prod(shape); Tile: exactly numel(input) * prod(repeats).
    return static_cast<double>(input->numel()) * product(*arg);
  }
  if (n.op_type == "Range") {
    auto start = ints(0), limit = ints(1), delta = ints(2);
    if (!start || !limit || !delta || start->size() != 1 || limit->size() != 1 || delta->size() != 1 ||
        (*delta)[0] == 0) {
      return std::nullopt;
    }
    return std::max(0.0, std::ceil(((*limit)[0] - (*start)[0]) / (*delta)[0]));
  }
  return std::nullopt;
}

// Output bytes predicted from graph.types (or from the inputs of the expanding ops); nullopt when unknown.
std::optional<std::size_t> predicted_bytes(const Graph& g, const Node& n) {
  if ((n.domain.empty() || n.domain == "ai.onnx") && n.outputs.size() == 1) {
    if (auto elements = expanding_output_elements(g, n)) {
      std::size_t element_size = 4;  // ConstantOfShape's default value: float32
      if (n.op_type == "ConstantOfShape") {
        auto it = n.tensor_attrs.find("value");
        if (it != n.tensor_attrs.end()) element_size = it->second.element_size();
      } else if (const Tensor* first = constant(g, n.inputs[0])) {
        element_size = first->element_size();
      }
      const double bytes = *elements * static_cast<double>(element_size);
      return bytes >= 1e18 ? static_cast<std::size_t>(1e18) : static_cast<std::size_t>(bytes);
    }
  }
  std::size_t total = 0;
  for (const auto& out : n.outputs) {
    if (out.empty()) continue;
    const ValueType* vt = g.type(out);
    if (vt == nullptr || !vt->fully_known()) return std::nullopt;
    std::size_t numel = 1;
    for (std::int64_t d : vt->sizes()) numel *= static_cast<std::size_t>(d);
    total += numel * dtype_size(vt->dtype);
  }
  return total;
}

}  // namespace

std::optional<std::size_t> predicted_fold_bytes(const Graph& g, const Node& n) { return predicted_bytes(g, n); }

// One sweep in topological order: a folded node's outputs are constants for the nodes after it, so a chain of
// constant nodes folds in one sweep.
int internal::fold_constants(Graph& g, const PassContext& ctx, PassResult& result) {
  int folded = 0;
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (Node& n : g.nodes) {
    if (!foldable(g, n, ctx)) {
      kept.push_back(std::move(n));
      continue;
    }
    auto predicted = predicted_bytes(g, n);
    if (predicted && *predicted > ctx.max_folded_bytes) {
      result.notes.push_back(detail::str_cat("kept ", describe(n), ": its outputs (", *predicted,
                                             " bytes) exceed max_folded_bytes (", ctx.max_folded_bytes, ")"));
      kept.push_back(std::move(n));
      continue;
    }
    std::vector<Tensor> inputs;
    for (const auto& in : n.inputs) inputs.push_back(in.empty() ? Tensor() : g.initializers.at(in));
    std::vector<Tensor> outputs;
    try {
      outputs = onnx_ref::run_node(n, g.opset(n.domain), inputs);
    } catch (const std::exception& e) {
      // Not folded: the node runs (and reports its error, if any) when the model runs.
      result.notes.push_back(detail::str_cat("kept ", describe(n), ": ", e.what()));
      kept.push_back(std::move(n));
      continue;
    }
    std::size_t bytes = 0;
    bool complete = outputs.size() == n.outputs.size();
    for (std::size_t k = 0; complete && k < n.outputs.size(); ++k) {
      if (n.outputs[k].empty()) continue;
      complete = outputs[k].defined();
      if (complete) bytes += outputs[k].nbytes();
    }
    if (!complete || bytes > ctx.max_folded_bytes) {
      result.notes.push_back(detail::str_cat("kept ", describe(n), complete ? ": its outputs are too big (" : "",
                                             complete ? std::to_string(bytes) + " bytes)" : ": an output is missing"));
      kept.push_back(std::move(n));
      continue;
    }
    for (std::size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k].empty()) continue;
      g.initializers[n.outputs[k]] = outputs[k].contiguous();
      g.types[n.outputs[k]] = type_of(outputs[k]);
    }
    result.notes.push_back(detail::str_cat("folded ", describe(n)));
    ++folded;
  }
  g.nodes = std::move(kept);
  return folded;
}

namespace {

// The output of Shape/Size on a value whose (relevant) dims are known; nullopt otherwise.
std::optional<Tensor> fold_shape_node(const Graph& g, const Node& n) {
  if (!is_onnx_domain(n.domain) || (n.op_type != "Shape" && n.op_type != "Size") || n.inputs.empty()) {
    return std::nullopt;
  }
  auto vt = value_type(g, n.inputs[0]);
  if (!vt || !vt->has_shape) return std::nullopt;
  const auto rank = static_cast<std::int64_t>(vt->shape.size());
  if (n.op_type == "Size") {
    if (!vt->fully_known()) return std::nullopt;
    std::int64_t numel = 1;
    for (std::int64_t d : vt->sizes()) numel *= d;
    return from_doubles({}, DType::kInt64, {static_cast<double>(numel)});
  }
  std::int64_t start = n.attrs.get_int("start", 0);  // start/end: opset 15 and later
  std::int64_t end = n.attrs.get_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<std::int64_t>(start, 0, rank);
  end = std::clamp<std::int64_t>(end, 0, rank);
  std::vector<double> dims;
  for (std::int64_t i = start; i < end; ++i) {
    const Dim& d = vt->shape[static_cast<std::size_t>(i)];
    if (!d.known()) return std::nullopt;
    dims.push_back(static_cast<double>(d.value));
  }
  return from_doubles({static_cast<std::int64_t>(dims.size())}, DType::kInt64, dims);
}

int fold_shapes(Graph& g, PassResult& result) {
  int folded = 0;
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (Node& n : g.nodes) {
    auto value = n.outputs.empty() || n.outputs[0].empty() ? std::nullopt : fold_shape_node(g, n);
    if (!value) {
      kept.push_back(std::move(n));
      continue;
    }
    g.initializers[n.outputs[0]] = *value;
    g.types[n.outputs[0]] = type_of(*value);
    result.notes.push_back(detail::str_cat("folded ", describe(n), " of ", n.inputs[0], " -> ", type_of(*value).str()));
    ++folded;
  }
  g.nodes = std::move(kept);
  return folded;
}

// Note [Branches of constant If nodes]
// An If whose condition is a constant (folded from shapes, or made one where a segmented plan read it: Note
// [Segmented plans] in capture_plan.h) is replaced by the nodes of the branch it takes, so that they are lowered
// and dispatched like the rest of the graph instead of running in the reference library. The branch's own values
// are renamed to names the graph does not use; each branch output reaches the If's output through an Identity
// (removed by identity_elimination). A branch whose nested subgraphs read the branch's own values is left alone.
int inline_constant_ifs(Graph& g, PassResult& result) {
  int inlined = 0;
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (Node& n : g.nodes) {
    const Tensor* cond = is_onnx_domain(n.domain) && n.op_type == "If" && n.has_input(0) && g.is_constant(n.inputs[0])
                             ? &g.initializers.at(n.inputs[0])
                             : nullptr;
    if (cond == nullptr || cond->numel() != 1 || cond->dtype() != DType::kBool) {
      nodes.push_back(std::move(n));
      continue;
    }
    // A bool tensor's byte may hold any value a file wrote: nonzero is true.
    const bool taken = *static_cast<const std::uint8_t*>(cond->contiguous().data_ptr()) != 0;
    auto it = n.graph_attrs.find(taken ? "then_branch" : "else_branch");
    if (it == n.graph_attrs.end() || !it->second || it->second->outputs.size() != n.outputs.size()) {
      nodes.push_back(std::move(n));
      continue;
    }
    const Graph& branch = *it->second;
    std::map<std::string, std::string> renamed;
    std::set<std::string> taken_names;
    auto fresh = [&](const std::string& name) {
      std::string candidate = g.unique_name(n.name + "/" + name);
      for (int k = 1; taken_names.count(candidate); ++k) {
        candidate = g.unique_name(n.name + "/" + name + "_" + std::to_string(k));
      }
      taken_names.insert(candidate);
      renamed[name] = candidate;
    };
    for (const auto& [name, t] : branch.initializers) fresh(name);
    for (const Node& b : branch.nodes) {
      for (const auto& out : b.outputs) {
        if (!out.empty()) fresh(out);
      }
    }
    bool nested_reads_own = false;
    for (const Node& b : branch.nodes) {
      for (const auto& [attr, sub] : b.graph_attrs) {
        if (!sub) continue;
        for (const std::string& name : onnx_ref::outer_names(*sub)) nested_reads_own |= renamed.count(name) != 0;
      }
    }
    if (nested_reads_own) {
      nodes.push_back(std::move(n));
      continue;
    }
    auto rename = [&](const std::string& name) {
      auto r = renamed.find(name);
      return r == renamed.end() ? name : r->second;
    };
    for (const auto& [name, t] : branch.initializers) {
      g.initializers[rename(name)] = t;
      g.types[rename(name)] = type_of(t);
    }
    for (const auto& [name, vt] : branch.types) {
      if (renamed.count(name)) g.types[rename(name)] = vt;
    }
    for (const Node& b : branch.nodes) {
      Node copy = b;
      copy.name = n.name + "/" + (b.name.empty() ? b.op_type : b.name);
      for (auto& in : copy.inputs) in = in.empty() ? in : rename(in);
      for (auto& out : copy.outputs) out = out.empty() ? out : rename(out);
      nodes.push_back(std::move(copy));
    }
    for (std::size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k].empty()) continue;
      Node identity;
      identity.name = n.name + "/output_" + std::to_string(k);
      identity.op_type = "Identity";
      identity.inputs = {rename(branch.outputs[k])};
      identity.outputs = {n.outputs[k]};
      nodes.push_back(std::move(identity));
    }
    result.notes.push_back(detail::str_cat("inlined the ", taken ? "then" : "else", " branch of If '", n.name,
                                           "' (constant condition): ", branch.nodes.size(), " node(s)"));
    ++inlined;
  }
  g.nodes = std::move(nodes);
  return inlined;
}

}  // namespace

PassResult constant_folding(Graph& g, const PassContext& ctx) {
  PassResult result{"constant_folding", 0, {}};
  result.rewrites = fold_constants(g, ctx, result);
  g.validate();
  return result;
}

PassResult shape_folding(Graph& g, const PassContext& ctx) {
  PassResult result{"shape_folding", 0, {}};
  // Each round can make more shapes known (a Reshape whose shape input became a constant), hence the loop. It
  // ends: every round that continues removes at least one node.
  for (;;) {
    const int shapes = fold_shapes(g, result) + inline_constant_ifs(g, result);
    if (shapes == 0) break;
    result.rewrites += shapes;
    result.rewrites += fold_constants(g, ctx, result);
    g.validate();
    if (ctx.infer_types) ctx.infer_types(g);
  }
  // Each round retries the nodes constant folding kept: one note per node is enough.
  std::vector<std::string> notes;
  std::set<std::string> seen;
  for (auto& note : result.notes) {
    if (seen.insert(note).second) notes.push_back(std::move(note));
  }
  result.notes = std::move(notes);
  g.validate();
  return result;
}

namespace {

// Whether `bn` is a BatchNormalization in inference mode whose outputs past the first nobody reads.
bool inference_batch_norm(const Graph& g, const Uses& uses, const Node& bn) {
  if (!is_onnx(bn, "BatchNormalization") || bn.inputs.size() < 5) return false;
  const std::int64_t opset = g.opset(bn.domain);
  if (bn.attrs.get_int("training_mode", 0) != 0) return false;         // opset 14+: batch statistics
  if (opset < 7 && bn.attrs.get_int("is_test", 0) == 0) return false;  // opset 1-6: training unless is_test
  if (bn.attrs.get_int("spatial", 1) != 1) return false;               // opset < 9: per-activation parameters
  for (std::size_t k = 1; k < bn.outputs.size(); ++k) {
    if (!bn.outputs[k].empty() && !uses.unused(bn.outputs[k])) return false;
  }
  return true;
}

// The per-channel scale gamma / sqrt(var + epsilon) and shift beta - mean * scale of `bn`'s constant parameters of
// `channels` each; false when they are not constants of that size.
bool batch_norm_affine(const Graph& g, const Node& bn, std::int64_t channels, std::vector<double>* scale,
                       std::vector<double>* shift) {
  std::vector<std::vector<double>> params;  // gamma, beta, mean, var
  for (std::size_t k = 1; k < 5; ++k) {
    const Tensor* p = constant(g, bn.inputs[k]);
    if (p == nullptr || p->numel() != channels || p->dim() != 1) return false;
    params.push_back(to_doubles(*p));
  }
  const double epsilon = bn.attrs.get_float("epsilon", 1e-5);
  scale->resize(static_cast<std::size_t>(channels));
  shift->resize(static_cast<std::size_t>(channels));
  for (std::size_t c = 0; c < scale->size(); ++c) {
    (*scale)[c] = params[0][c] / std::sqrt(params[3][c] + epsilon);
    (*shift)[c] = params[1][c] - params[2][c] * (*scale)[c];
  }
  return true;
}

// Note [Batch norms without a convolution become an affine map]
// A BatchNormalization that no Conv before it takes (pre-activation networks: DenseNet's BatchNorm + ReLU of each
// layer's concatenation, ResNet-v2, the norms after a pool or an Add) is, in inference, x * scale + shift per channel:
// a Mul and an Add by constants of shape [C, 1, ...], which elementwise_fusion joins with the ReLU after it (one pass
// instead of two) and nhwc_layout carries channels-last (the BatchNormalization kernel is NCHW only: DenseNet crossed
// layouts around every one). The constants are in x's dtype (rounded once, as the folded convolutions' are). CUDA
// plans only: the cpu BatchNormalization kernel and its ReLU beat the cpu kernel's interpreted program (the tiny
// DenseNet export: 150 against 167 us a run).
int batch_norms_to_affine(Graph& g, PassResult& result) {
  const Uses uses(g);
  std::vector<Node> nodes;
  int rewritten = 0;
  for (Node& bn : g.nodes) {
    if (!inference_batch_norm(g, uses, bn)) {  // (five inputs at least)
      nodes.push_back(std::move(bn));
      continue;
    }
    const auto shape = static_shape(g, bn.inputs[0]);
    const DType dtype = value_dtype(g, bn.inputs[0]).value_or(DType::kInt64);
    std::vector<double> scale, shift;
    if (!shape || shape->size() < 2 || !is_fusable_float(dtype) ||
        !batch_norm_affine(g, bn, (*shape)[1], &scale, &shift)) {
      nodes.push_back(std::move(bn));
      continue;
    }
    std::vector<std::int64_t> per_channel(shape->size() - 1, 1);  // [C, 1, ...]: broadcasts over N and the rest
    per_channel[0] = (*shape)[1];
    const std::string scaled = g.unique_name(bn.outputs[0] + "_scaled");
    nodes.push_back(make_node(g, "Mul", bn.name + "_scale",
                              {bn.inputs[0], add_constant(g, bn.name + "_scale", from_doubles(per_channel, dtype,
                                                                                               scale))},
                              {scaled}));
    nodes.push_back(make_node(g, "Add", bn.name + "_shift",
                              {scaled, add_constant(g, bn.name + "_shift", from_doubles(per_channel, dtype, shift))},
                              {bn.outputs[0]}));
    result.notes.push_back(describe(bn) + " -> Mul + Add by per-channel constants");
    ++rewritten;
  }
  g.nodes = std::move(nodes);
  return rewritten;
}

}  // namespace

PassResult conv_bn_folding(Graph& g, const PassContext& ctx) {
  PassResult result{"conv_bn_folding", 0, {}};
  Rewriter rewriter(g);
  const Uses uses(g);
  for (std::size_t bi = 0; bi < g.nodes.size(); ++bi) {
    const Node& bn = g.nodes[bi];
    if (!inference_batch_norm(g, uses, bn)) continue;
    auto ci = uses.producer(bn.inputs[0]);
    if (!ci || rewriter.taken(*ci) || rewriter.taken(bi)) continue;
    const Node& conv = g.nodes[*ci];
    if (!is_onnx(conv, "Conv") || !uses.only_reader(bn.inputs[0], bi)) continue;
    const Tensor* w = constant(g, conv.inputs.size() > 1 ? conv.inputs[1] : "");
    const Tensor* b = conv.has_input(2) ? constant(g, conv.inputs[2]) : nullptr;
    if (w == nullptr || w->dim() < 3 || (conv.has_input(2) && b == nullptr)) continue;
    const DType dtype = w->dtype();
    if (!(is_fusable_float(dtype) || dtype == DType::kFloat64)) continue;
    const std::int64_t out_channels = w->shape()[0];
    std::vector<double> scale, shift;
    if (!batch_norm_affine(g, bn, out_channels, &scale, &shift)) continue;
    if (b != nullptr && b->numel() != out_channels) continue;
    std::vector<double> weights = to_doubles(*w);
    std::vector<double> bias = b ? to_doubles(*b) : std::vector<double>(static_cast<std::size_t>(out_channels), 0.0);
    const std::size_t per_channel = weights.size() / static_cast<std::size_t>(out_channels);
    for (std::size_t o = 0; o < static_cast<std::size_t>(out_channels); ++o) {
      for (std::size_t i = 0; i < per_channel; ++i) weights[o * per_channel + i] *= scale[o];
      bias[o] = bias[o] * scale[o] + shift[o];
    }
    Node folded = conv;
    folded.inputs.resize(3);
    folded.inputs[1] = add_constant(g, conv.inputs[1] + "_bn", from_doubles(w->shape(), dtype, weights));
    folded.inputs[2] = add_constant(g, conv.name + "_bn_bias", from_doubles({out_channels}, dtype, bias));
    folded.outputs = {bn.outputs[0]};
    rewriter.replace({*ci, bi}, {std::move(folded)},
                     detail::str_cat("folded ", describe(bn), " into ", describe(conv)));
  }
  rewriter.apply(result);
  if (ctx.device.is_cuda()) result.rewrites += batch_norms_to_affine(g, result);  // Note [Batch norms without a ...]
  return result;
}

}  // namespace xpuruntime::passes
