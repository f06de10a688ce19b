// The tensor_parallel pass: rank `ctx.tp_rank`'s shard of a graph split over `ctx.tp_size` ranks
// (ExecutionPolicy.tensor_parallel; docs/distributed.md).
//
// Note [Sharding by propagation]
// Megatron-style tensor parallelism, found rather than declared. A GEMM with a constant weight whose input is
// replicated (the same on every rank) may be column-parallel: each rank keeps a slice of the weight's output
// features, so its output is sharded along its last axis. That sharding is followed forward through the nodes
// that can compute on shards without talking to the other ranks: pointwise ops (constants along the sharded axis
// are sliced: biases), Reshape (the heads of attention: [B, S, H*D] -> [B, S, H, D] shards H), Transpose,
// (Un)Squeeze, Expand (grouped-query attention's repeated K/V heads), Split/Slice/Gather/Concat along other axes,
// batched MatMul over the sharded (head) axis, Softmax and reductions over other axes. A GEMM with a constant
// weight that reads a value sharded along its contracting axis becomes row-parallel: each rank keeps the matching
// rows of the weight and produces a partial sum, and an all_reduce (com.xpuruntime:AllReduce, lowered onto the
// registry op) after it makes the result replicated again; its bias is added after the all-reduce.
// A sharded value that reaches anything else (a LayerNorm over the sharded axis, a graph output, an op without a
// rule) makes every GEMM it came from replicated again, and the analysis repeats until nothing fails. The
// transformer blocks of BERT, GPT-2 and Llama-style decoders shard this way: Q/K/V, up and gate projections
// column-parallel, attention heads split, output and down projections row-parallel, one all-reduce per attention
// and one per MLP. Everything else (embeddings, norms, the LM head) runs replicated on every rank.
//
// Note [Sharded parts]
// A GEMM that computes several tensors at once (GPT-2's c_attn: q, k and v in one [768, 2304] weight, split
// afterwards; ViT's qkv reshaped to [B, N, 3, H, D]) must not be cut into contiguous halves: rank 0 would get all
// of q and half of k. Its output is sharded in parts: each part (the Split's sizes, or the 3 of the reshape) is
// sliced separately, and the rank's local tensor is the concatenation of its slice of each part. A Split along the
// sharded axis whose sizes are the parts (and a Reshape whose leading factor is the number of parts) turns parts
// into ordinary shards.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;

namespace {

// How a value is split over the ranks: along `axis` (-1: replicated), in `parts` (global sizes along the axis;
// empty: one part, the whole axis). `sources`: the column-parallel GEMMs (node indices) it derives from.
//
// Note [Shards inside merged axes]
// PyTorch's exporter writes attention with the batch and head axes merged ([B, H, S, D] -> [B*H, S, D] around
// the score MatMuls). The heads stay sharded, but inside the merged axis: each of its B blocks holds H/tp heads
// locally. `outer` is that number of blocks (1: the shard is a contiguous chunk of the axis). A Reshape is
// followed exactly when the output axis that holds the sharded factor can be found from the element layout
// [Q][M][T] (Q: elements before the sharded factor, M: the sharded factor, T: after it).
struct Shard {
  int axis = -1;
  std::vector<std::int64_t> parts;
  std::int64_t outer = 1;  // Note [Shards inside merged axes]
  std::set<std::size_t> sources;
  bool sharded() const { return axis >= 0; }
};

// A constant input to slice: input `input` of the node, along `axis`, in `parts` of global size `size`.
struct ConstSlice {
  std::size_t input = 0;
  int axis = 0;
  std::vector<std::int64_t> parts;
};

// What the rewrite does to one node.
struct Action {
  enum class Kind { kNone, kColumn, kRow, kLocal } kind = Kind::kNone;
  std::vector<ConstSlice> slices;                      // constants sliced (column: the weight and bias)
  std::vector<ConstSlice> runtime_slices;              // replicated values sliced by a Slice node before it
  std::optional<std::vector<std::int64_t>> new_shape;  // Reshape / Expand: the local target shape (input 1)
  std::optional<std::vector<std::int64_t>> new_split;  // Split: the local sizes
  std::string note;
};

int norm_axis(std::int64_t axis, std::size_t rank) {
  return static_cast<int>(axis < 0 ? axis + static_cast<std::int64_t>(rank) : axis);
}

// The axes of a node: attribute `axes`, else constant input `input` (opset 13/18 forms). nullopt when absent or
// not constant; `present` tells whether any was given.
std::optional<std::vector<std::int64_t>> node_axes(const Graph& g, const Node& n, std::size_t input, bool* present) {
  *present = false;
  if (n.attrs.has("axes")) {
    *present = true;
    return n.attrs.get_ints("axes", {});
  }
  if (n.has_input(input)) {
    *present = true;
    const Tensor* c = constant(g, n.inputs[input]);
    if (c == nullptr) return std::nullopt;
    return to_int64s(*c);
  }
  return std::vector<std::int64_t>{};
}

std::int64_t product(const std::vector<std::int64_t>& v, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < end && i < v.size(); ++i) p *= v[i];
  return p;
}

// The element ranges along an axis of global size sum(parts) that rank `rank` of `tp` keeps (Note [Sharded parts]).
std::vector<std::pair<std::int64_t, std::int64_t>> local_ranges(const std::vector<std::int64_t>& parts, int tp,
                                                                int rank) {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::int64_t offset = 0;
  for (std::int64_t p : parts) {
    const std::int64_t chunk = p / tp;
    ranges.emplace_back(offset + chunk * rank, offset + chunk * (rank + 1));
    offset += p;
  }
  return ranges;
}

// `t` (CPU, contiguous) restricted to `ranges` along `axis`.
Tensor slice_along(const Tensor& t, int axis, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  std::vector<std::int64_t> shape = t.shape();
  std::int64_t kept = 0;
  for (const auto& [b, e] : ranges) kept += e - b;
  const std::int64_t outer = product(shape, 0, static_cast<std::size_t>(axis));
  const std::size_t inner =
      static_cast<std::size_t>(product(shape, static_cast<std::size_t>(axis) + 1, shape.size())) * t.element_size();
  const std::int64_t full = shape[axis];
  shape[axis] = kept;
  Tensor out = Tensor::empty(shape, t.dtype());
  const Tensor src = t.contiguous();
  const auto* from = static_cast<const char*>(src.data_ptr());
  auto* to = static_cast<char*>(out.data_ptr());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (const auto& [b, e] : ranges) {
      const std::size_t bytes = static_cast<std::size_t>(e - b) * inner;
      std::memcpy(to, from + (static_cast<std::size_t>(o * full + b)) * inner, bytes);
      to += bytes;
    }
  }
  return out;
}

std::string dims_str(const std::vector<std::int64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

class Analysis {
 public:
  Analysis(const Graph& g, int tp, const std::set<std::size_t>& excluded)
      : g_(g), uses_(g), tp_(tp), excluded_(excluded) {}

  void run() {
    for (std::size_t i = 0; i < g_.nodes.size(); ++i) visit(i);
    for (const std::string& out : g_.outputs) {
      auto it = shards_.find(out);
      if (it != shards_.end() && it->second.sharded())
        fail(it->second.sources, "graph output '" + out + "' would be sharded");
    }
  }

  const std::map<std::size_t, std::string>& failed() const { return failed_; }
  const std::map<std::size_t, Action>& actions() const { return actions_; }
  const Shard* shard(const std::string& v) const {
    auto it = shards_.find(v);
    return it == shards_.end() || !it->second.sharded() ? nullptr : &it->second;
  }

 private:
  void fail(const std::set<std::size_t>& sources, const std::string& why) {
    for (std::size_t s : sources) failed_.emplace(s, why);
  }

  std::optional<std::vector<std::int64_t>> shape(const std::string& v) const { return static_shape(g_, v); }

  // Candidates for column parallelism: MatMul(x, W[K, N]) and Gemm(x, W) with constant 2-D weights.
  std::optional<int> column_axis_of_weight(const Node& n) const {
    if (n.inputs.size() < 2 || n.outputs.size() != 1) return std::nullopt;
    const Tensor* w = constant(g_, n.inputs[1]);
    if (w == nullptr || w->dim() != 2) return std::nullopt;
    if (is_onnx(n, "MatMul")) return 1;
    if (is_onnx(n, "Gemm") && n.attrs.get_int("transA", 0) == 0) return n.attrs.get_int("transB", 0) ? 0 : 1;
    return std::nullopt;
  }

  // Note [Sharded parts]: the parts a column GEMM's output is cut in, found downstream (a Split along its last
  // axis, possibly after a bias Add and a Reshape keeping that axis).
  std::vector<std::int64_t> parts_of(std::size_t index, std::int64_t n_features) const {
    std::string value = g_.nodes[index].outputs[0];
    for (int hop = 0; hop < 4; ++hop) {
      const auto& readers = uses_.readers(value);
      if (readers.size() != 1 || uses_.is_graph_output(value)) break;
      const Node& r = g_.nodes[readers[0]];
      auto in = shape(value);
      if (!in || in->empty() || in->back() != n_features) break;
      if (is_onnx(r, "Split") && r.inputs[0] == value) {
        const int axis = norm_axis(r.attrs.get_int("axis", 0), in->size());
        if (axis != static_cast<int>(in->size()) - 1) break;
        const std::vector<std::int64_t> sizes = split_sizes(g_, r, g_.opset(r.domain), n_features);
        if (sizes.size() > 1 && std::all_of(sizes.begin(), sizes.end(), [&](std::int64_t s) { return s % tp_ == 0; })) {
          return sizes;
        }
        break;
      }
      if (is_onnx(r, "Reshape")) {
        auto out = shape(r.outputs[0]);
        if (!out) break;
        // [.., N] -> [.., p, h, d] with p in {2, 3} not divisible by tp while h is: p packed tensors.
        const std::int64_t outer = product(*in, 0, in->size() - 1);
        for (std::size_t b = 0; b + 1 < out->size(); ++b) {
          if (product(*out, 0, b) != outer) continue;
          const std::int64_t p = (*out)[b];
          if ((p == 2 || p == 3) && p % tp_ != 0 && (*out)[b + 1] % tp_ == 0 && n_features % p == 0) {
            return std::vector<std::int64_t>(static_cast<std::size_t>(p), n_features / p);
          }
          break;
        }
        if (out->back() != n_features) break;
        value = r.outputs[0];
        continue;
      }
      if (is_onnx(r, "Add") && r.inputs.size() == 2) {
        value = r.outputs[0];
        continue;
      }
      break;
    }
    return {};
  }

  void set(const std::string& v, Shard s) { shards_[v] = std::move(s); }

  void visit(std::size_t index) {
    const Node& n = g_.nodes[index];
    std::vector<const Shard*> in(n.inputs.size(), nullptr);
    std::set<std::size_t> sources;
    bool any = false;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      if (n.inputs[k].empty()) continue;
      in[k] = shard(n.inputs[k]);
      if (in[k]) {
        any = true;
        sources.insert(in[k]->sources.begin(), in[k]->sources.end());
      }
    }
    for (const std::string& out : n.outputs) {
      if (!out.empty() && uses_.read_by_subgraph(out) && any) fail(sources, "a subgraph reads '" + out + "'");
    }
    const std::optional<int> weight_axis = column_axis_of_weight(n);
    if (!any) {
      if (!weight_axis || excluded_.count(index)) return;
      const Tensor* w = constant(g_, n.inputs[1]);
      const std::int64_t n_features = w->shape()[*weight_axis];
      if (n_features % tp_ != 0) return;
      auto out_shape = shape(n.outputs[0]);
      if (!out_shape || out_shape->empty()) return;
      Shard s;
      s.axis = static_cast<int>(out_shape->size()) - 1;
      s.parts = parts_of(index, n_features);
      s.sources = {index};
      Action a;
      a.kind = Action::Kind::kColumn;
      const std::vector<std::int64_t> parts = s.parts.empty() ? std::vector<std::int64_t>{n_features} : s.parts;
      a.slices.push_back({1, *weight_axis, parts});
      if (is_onnx(n, "Gemm") && n.has_input(2)) {
        auto c = shape(n.inputs[2]);
        if (!c || !constant(g_, n.inputs[2])) return;
        if (!c->empty() && c->back() == n_features)
          a.slices.push_back({2, static_cast<int>(c->size()) - 1, parts});
        else if (!c->empty() && c->back() != 1)
          return;
      }
      a.note =
          detail::str_cat("column-parallel ", describe(n), ": weight ", dims_str(w->shape()), " sliced along axis ",
                          *weight_axis, s.parts.empty() ? "" : " in parts " + dims_str(s.parts));
      actions_[index] = a;
      set(n.outputs[0], std::move(s));
      return;
    }
    std::string why;
    if (!propagate(index, in, sources, &why)) {
      fail(sources, describe(n) + ": " + why);
    }
  }

  // The sharded input's axis as an axis of an output of rank `out_rank` (NumPy broadcasting aligns right).
  static int aligned(int axis, std::size_t in_rank, std::size_t out_rank) {
    return axis + static_cast<int>(out_rank) - static_cast<int>(in_rank);
  }

  bool elementwise(std::size_t index, const std::vector<const Shard*>& in, const std::set<std::size_t>& sources,
                   std::string* why, std::size_t first_input = 0, std::size_t last_input = SIZE_MAX) {
    const Node& n = g_.nodes[index];
    auto out = shape(n.outputs[0]);
    if (!out) return *why = "output shape unknown", false;
    int oa = -1;
    std::vector<std::int64_t> parts;
    std::int64_t outer = 1;
    for (std::size_t k = first_input; k < n.inputs.size() && k <= last_input; ++k) {
      if (!in[k]) continue;
      auto s = shape(n.inputs[k]);
      if (!s) return *why = "input shape unknown", false;
      const int a = aligned(in[k]->axis, s->size(), out->size());
      if ((*s)[in[k]->axis] != (*out)[a]) return *why = "a sharded input is broadcast along its sharded axis", false;
      if (oa >= 0 && (a != oa || parts != in[k]->parts || outer != in[k]->outer)) {
        return *why = "inputs sharded differently", false;
      }
      oa = a;
      parts = in[k]->parts;
      outer = in[k]->outer;
    }
    Action act;
    act.kind = Action::Kind::kLocal;
    for (std::size_t k = first_input; k < n.inputs.size() && k <= last_input; ++k) {
      if (in[k] || n.inputs[k].empty()) continue;
      auto s = shape(n.inputs[k]);
      if (!s) return *why = "input shape unknown", false;
      const int ia = oa - (static_cast<int>(out->size()) - static_cast<int>(s->size()));
      if (ia < 0 || (*s)[ia] == 1) continue;
      if (outer != 1 || (!constant(g_, n.inputs[k]) && !parts.empty())) {
        return *why = "a replicated input '" + n.inputs[k] + "' spans the sharded axis", false;
      }
      // A replicated activation (T5's position bias over all heads) is sliced at run time, a constant once.
      auto& list = constant(g_, n.inputs[k]) ? act.slices : act.runtime_slices;
      list.push_back({k, ia, parts.empty() ? std::vector<std::int64_t>{(*s)[ia]} : parts});
    }
    if (!act.slices.empty() || !act.runtime_slices.empty()) actions_[index] = act;
    for (const std::string& o : n.outputs) {
      if (o.empty()) continue;
      Shard s;
      s.axis = oa;
      s.parts = parts;
      s.outer = outer;
      s.sources = sources;
      set(o, s);
    }
    return true;
  }

  // Every output of `n` sharded along `axis` like `like` (its parts and outer blocks).
  bool pass_through(const Node& n, int axis, const Shard& like, const std::set<std::size_t>& sources) {
    for (const std::string& o : n.outputs) {
      if (o.empty()) continue;
      Shard s;
      s.axis = axis;
      s.parts = like.parts;
      s.outer = like.outer;
      s.sources = sources;
      set(o, s);
    }
    return true;
  }

  // Long function: the table of sharding rules, one case per op family (Note [Sharding by propagation]); the
  // cases share the node's input shards and the result they set.
  bool propagate(std::size_t index, const std::vector<const Shard*>& in, const std::set<std::size_t>& sources,
                 std::string* why) {
    const Node& n = g_.nodes[index];
    static const std::set<std::string> unary = {
        "Relu", "Gelu",     "Sigmoid",    "Tanh", "Erf",      "Exp",         "Log",       "Sqrt",
        "Neg",  "Abs",      "Reciprocal", "Cast", "Softplus", "HardSigmoid", "HardSwish", "LeakyRelu",
        "Elu",  "Identity", "Sin",        "Cos",  "Not",      "IsNaN",       "IsInf",     "Floor",
        "Ceil", "Round",    "Sign",       "Mish", "Selu",     "Celu",        "Softsign",  "Dropout"};
    static const std::set<std::string> nary = {
        "Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
        "And", "Or",  "Xor", "Max", "Min", "Sum",   "Mean",  "Mod",  "PRelu",   "BitShift"};
    const bool onnx = n.domain.empty() || n.domain == "ai.onnx";
    if (!onnx) return *why = "no sharding rule for domain '" + n.domain + "'", false;
    const std::string& op = n.op_type;
    const Shard& s0 = in[0] ? *in[0] : Shard{};
    auto in0 = n.inputs.empty() ? std::nullopt : shape(n.inputs[0]);
    auto out0 = n.outputs.empty() ? std::nullopt : shape(n.outputs[0]);
    if (!in0 || !out0) return *why = "shapes unknown", false;

    if (unary.count(op)) {
      if (!in[0]) return *why = "a sharded operand of a unary op other than its input", false;
      if (op == "Dropout" && n.outputs.size() > 1 && !n.outputs[1].empty() && !uses_.unused(n.outputs[1])) {
        return *why = "Dropout's mask output", false;
      }
      return pass_through(n, s0.axis, s0, sources);
    }
    if (op == "Clip") {
      if (!in[0] || (in.size() > 1 && in[1]) || (in.size() > 2 && in[2])) return *why = "sharded clip bounds", false;
      return pass_through(n, s0.axis, s0, sources);
    }
    if (op == "CastLike") return in[0] && elementwise(index, in, sources, why, 0, 0);
    if (nary.count(op)) return elementwise(index, in, sources, why);

    const std::size_t r_in = in0->size();
    const std::size_t r_out = out0->size();
    if (op == "Transpose") {
      std::vector<std::int64_t> perm = n.attrs.get_ints("perm", {});
      if (perm.empty()) {
        for (std::size_t i = 0; i < r_in; ++i) perm.push_back(static_cast<std::int64_t>(r_in - 1 - i));
      }
      for (std::size_t j = 0; j < perm.size(); ++j) {
        if (perm[j] == s0.axis) return pass_through(n, static_cast<int>(j), s0, sources);
      }
      return *why = "bad perm", false;
    }
    if (op == "Reshape") {
      if (in.size() > 1 && in[1]) return *why = "sharded shape input", false;
      return reshape(index, s0, *in0, *out0, sources, why);
    }
    if (op == "Unsqueeze" || op == "Squeeze") {
      bool present = false;
      auto axes = node_axes(g_, n, 1, &present);
      if (!axes) return *why = "axes not constant", false;
      const std::size_t rank = op == "Unsqueeze" ? r_out : r_in;
      std::vector<bool> listed(rank, false);
      for (std::int64_t a : *axes) listed[static_cast<std::size_t>(norm_axis(a, rank))] = true;
      if (op == "Squeeze" && !present) {
        for (std::size_t i = 0; i < r_in; ++i) listed[i] = (*in0)[i] == 1;
      }
      if (op == "Squeeze" && listed[static_cast<std::size_t>(s0.axis)])
        return *why = "squeezes the sharded axis", false;
      int mapped = 0;
      if (op == "Unsqueeze") {
        int seen = -1;
        for (std::size_t i = 0; i < r_out; ++i) {
          if (listed[i]) continue;
          if (++seen == s0.axis) mapped = static_cast<int>(i);
        }
      } else {
        for (int i = 0; i < s0.axis; ++i) mapped += listed[static_cast<std::size_t>(i)] ? 0 : 1;
      }
      return pass_through(n, mapped, s0, sources);
    }
    if (op == "Expand") {
      if (in.size() > 1 && in[1]) return *why = "sharded shape input", false;
      const Tensor* c = n.has_input(1) ? constant(g_, n.inputs[1]) : nullptr;
      if (!c) return *why = "shape not constant", false;
      if (!s0.parts.empty() || s0.outer != 1) return *why = "parts or merged blocks through Expand", false;
      std::vector<std::int64_t> target = to_int64s(*c);
      const int oa = aligned(s0.axis, r_in, r_out);
      const int pos = oa - (static_cast<int>(r_out) - static_cast<int>(target.size()));
      if (pos >= 0) {
        if (target[pos] != 1 && target[pos] != (*out0)[oa]) return *why = "unexpected expand size", false;
        if (target[pos] != 1) target[pos] /= tp_;
      }
      Action a;
      a.kind = Action::Kind::kLocal;
      a.new_shape = target;
      actions_[index] = a;
      return pass_through(n, oa, Shard{}, sources);
    }
    if (op == "MatMul") return matmul(index, in, *in0, *out0, sources, why);
    if (op == "Gemm") {
      if (in.size() > 1 && in[1]) return *why = "sharded Gemm weight", false;
      if (n.attrs.get_int("transA", 0) != 0 || !column_axis_of_weight(n)) return *why = "Gemm form", false;
      if (s0.axis == 1) {
        if (s0.outer != 1) return *why = "contracts over a sharded axis in merged blocks", false;
        return row(index, s0, n.attrs.get_int("transB", 0) ? 1 : 0);
      }
      if (n.has_input(2)) {
        auto c = shape(n.inputs[2]);
        if (!c || (c->size() == 2 && (*c)[0] != 1)) return *why = "Gemm bias spans the sharded rows", false;
      }
      return pass_through(n, 0, s0, sources);
    }
    if (op == "Softmax" || op == "LogSoftmax") {
      const std::int64_t opset = g_.opset(n.domain);
      const int axis = norm_axis(n.attrs.get_int("axis", opset >= 13 ? -1 : 1), r_in);
      const bool ok = opset >= 13 ? axis != s0.axis : s0.axis < axis;
      if (!ok) return *why = "normalizes over the sharded axis", false;
      return pass_through(n, s0.axis, s0, sources);
    }
    if (op == "LayerNormalization") {
      const int axis = norm_axis(n.attrs.get_int("axis", -1), r_in);
      if (s0.axis >= axis) return *why = "normalizes over the sharded axis", false;
      for (std::size_t k = 1; k < n.inputs.size(); ++k) {
        if (in[k]) return *why = "sharded scale or bias", false;
      }
      for (std::size_t o = 1; o < n.outputs.size(); ++o) {
        if (!n.outputs[o].empty() && !uses_.unused(n.outputs[o])) return *why = "mean/inv_std outputs used", false;
      }
      return pass_through(n, s0.axis, s0, sources);
    }
    if (op.rfind("Reduce", 0) == 0) {
      bool present = false;
      auto axes = node_axes(g_, n, 1, &present);
      if (!axes) return *why = "axes not constant", false;
      if (axes->empty()) return *why = "reduces over every axis", false;
      const bool keep = n.attrs.get_int("keepdims", 1) != 0;
      int mapped = s0.axis;
      for (std::int64_t a : *axes) {
        const int na = norm_axis(a, r_in);
        if (na == s0.axis) return *why = "reduces over the sharded axis", false;
        if (!keep && na < s0.axis) --mapped;
      }
      return pass_through(n, mapped, s0, sources);
    }
    if (op == "Split") {
      const int axis = norm_axis(n.attrs.get_int("axis", 0), r_in);
      if (axis != s0.axis) return pass_through(n, s0.axis, s0, sources);
      std::vector<std::int64_t> sizes;
      for (const std::string& o : n.outputs) {
        auto s = shape(o);
        if (!s) return *why = "output shape unknown", false;
        sizes.push_back((*s)[axis]);
      }
      if (s0.parts != sizes || s0.outer != 1) return *why = "splits the sharded axis", false;
      std::vector<std::int64_t> local;
      for (std::int64_t v : sizes) local.push_back(v / tp_);
      Action a;
      a.kind = Action::Kind::kLocal;
      a.new_split = local;
      actions_[index] = a;
      return pass_through(n, axis, Shard{}, sources);
    }
    if (op == "Slice") {
      bool present = false;
      auto axes = node_axes(g_, n, 3, &present);
      const Tensor* starts = n.has_input(1) ? constant(g_, n.inputs[1]) : nullptr;
      if (!axes || !starts) return *why = "slice bounds not constant", false;
      if (axes->empty()) {
        for (std::int64_t i = 0; i < starts->numel(); ++i) axes->push_back(static_cast<std::int64_t>(i));
      }
      for (std::int64_t a : *axes) {
        if (norm_axis(a, r_in) == s0.axis && (*in0)[s0.axis] != (*out0)[s0.axis]) {
          return *why = "slices the sharded axis", false;
        }
      }
      return pass_through(n, s0.axis, s0, sources);
    }
    if (op == "Gather") {
      if (in.size() > 1 && in[1]) return *why = "sharded indices", false;
      const int axis = norm_axis(n.attrs.get_int("axis", 0), r_in);
      if (axis == s0.axis) return *why = "gathers along the sharded axis", false;
      auto idx = shape(n.inputs[1]);
      if (!idx) return *why = "indices shape unknown", false;
      const int mapped = s0.axis < axis ? s0.axis : s0.axis + static_cast<int>(idx->size()) - 1;
      return pass_through(n, mapped, s0, sources);
    }
    if (op == "Concat") {
      const int axis = norm_axis(n.attrs.get_int("axis", 0), r_out);
      int oa = -1;
      Shard plain;
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        if (!in[k]) continue;
        if ((oa >= 0 && (in[k]->axis != oa || in[k]->outer != plain.outer)) || !in[k]->parts.empty()) {
          return *why = "inputs sharded differently", false;
        }
        oa = in[k]->axis;
        plain.outer = in[k]->outer;
      }
      if (oa == axis) return *why = "concatenates along the sharded axis", false;
      Action act;
      act.kind = Action::Kind::kLocal;
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        if (in[k]) continue;
        if (!constant(g_, n.inputs[k]) || plain.outer != 1) {
          return *why = "a replicated input spans the sharded axis", false;
        }
        act.slices.push_back({k, oa, {(*out0)[oa]}});
      }
      if (!act.slices.empty()) actions_[index] = act;
      return pass_through(n, oa, plain, sources);
    }
    return *why = "no sharding rule for " + op, false;
  }

  bool reshape(std::size_t index, const Shard& s0, const std::vector<std::int64_t>& in,
               const std::vector<std::int64_t>& out, const std::set<std::size_t>& sources, std::string* why) {
    if (!s0.parts.empty() && s0.outer != 1) return *why = "parts in merged blocks", false;
    const std::int64_t outer = product(in, 0, static_cast<std::size_t>(s0.axis));
    std::vector<std::int64_t> local = out;
    int mapped = -1;
    for (std::size_t b = 0; b < out.size() && !s0.parts.empty(); ++b) {
      if (product(out, 0, b) != outer || out[b] == 1) continue;
      {
        const auto p = static_cast<std::int64_t>(s0.parts.size());
        const bool equal =
            std::all_of(s0.parts.begin(), s0.parts.end(), [&](std::int64_t v) { return v == s0.parts[0]; });
        if (out[b] == in[s0.axis] && product(out, b + 1, out.size()) == product(in, s0.axis + 1, in.size())) {
          mapped = static_cast<int>(b);  // the axis itself, unchanged: the parts go with it
          local[b] /= tp_;
        } else if (equal && out[b] == p && b + 1 < out.size() && out[b + 1] % tp_ == 0) {
          mapped = static_cast<int>(b) + 1;  // [.., p*h*d] -> [.., p, h, d]: the parts become an axis
          local[b + 1] /= tp_;
          Action a;
          a.kind = Action::Kind::kLocal;
          a.new_shape = local;
          actions_[index] = a;
          for (std::int64_t v : local) {
            if (v <= 0) return *why = "a zero-sized dim", false;
          }
          Shard s;
          s.axis = mapped;
          s.sources = sources;
          set(g_.nodes[index].outputs[0], s);
          return true;
        }
        break;
      }
      break;
    }
    std::int64_t new_outer = 1;
    if (s0.parts.empty()) {
      // Note [Shards inside merged axes]: the element layout [Q][M][T] of the input, found again in the output.
      const std::int64_t q = product(in, 0, static_cast<std::size_t>(s0.axis)) * s0.outer;
      const std::int64_t m = in[s0.axis] / s0.outer;
      const std::int64_t t = product(in, static_cast<std::size_t>(s0.axis) + 1, in.size());
      for (std::size_t b = 0; b < out.size(); ++b) {
        const std::int64_t q1 = product(out, 0, b);
        if (q1 > q || out[b] <= 1 || q % q1 != 0 || q1 * out[b] <= q) continue;
        const std::int64_t blocks = q / q1;
        if (out[b] % blocks != 0) break;
        const std::int64_t rest = out[b] / blocks;
        if (rest % tp_ != 0 || rest * product(out, b + 1, out.size()) != m * t) break;
        mapped = static_cast<int>(b);
        new_outer = blocks;
        local[b] = blocks * (rest / tp_);
        break;
      }
    }
    if (mapped < 0) return *why = "the sharded axis has no counterpart in the new shape", false;
    for (std::int64_t v : local) {
      if (v <= 0) return *why = "a zero-sized dim", false;
    }
    Action a;
    a.kind = Action::Kind::kLocal;
    a.new_shape = local;
    actions_[index] = a;
    Shard s;
    s.axis = mapped;
    s.parts = s0.parts;
    s.outer = new_outer;
    s.sources = sources;
    set(g_.nodes[index].outputs[0], s);
    return true;
  }

  bool matmul(std::size_t index, const std::vector<const Shard*>& in, const std::vector<std::int64_t>& a_shape,
              const std::vector<std::int64_t>& out, const std::set<std::size_t>& sources, std::string* why) {
    const Node& n = g_.nodes[index];
    auto b_shape = shape(n.inputs[1]);
    if (!b_shape) return *why = "shape unknown", false;
    const std::size_t ra = a_shape.size();
    const std::size_t rb = b_shape->size();
    const std::size_t r = out.size();
    if (ra < 2 || rb < 2) return *why = "vector operand", false;
    const bool weight = column_axis_of_weight(n).has_value();
    if (weight) {
      if (!in[0]) return *why = "sharded weight", false;
      if (in[0]->axis == static_cast<int>(ra) - 1) {
        if (in[0]->outer != 1) return *why = "contracts over a sharded axis in merged blocks", false;
        return row(index, *in[0], 0);
      }
      return pass_through(n, aligned(in[0]->axis, ra, r), *in[0], sources);
    }
    if ((in[0] && !in[0]->parts.empty()) || (in[1] && !in[1]->parts.empty())) return *why = "parts into MatMul", false;
    Shard plain;
    plain.outer = in[0] ? in[0]->outer : in[1]->outer;
    if (in[0] && in[1] && in[0]->outer != in[1]->outer) return *why = "operands sharded in different blocks", false;
    int oa = -1;
    auto batch_axis = [&](int axis, std::size_t rank) { return axis < static_cast<int>(rank) - 2; };
    if (in[0]) {
      const int a = in[0]->axis;
      if (a == static_cast<int>(ra) - 1) return *why = "contracts over the sharded axis", false;
      oa = a == static_cast<int>(ra) - 2 ? static_cast<int>(r) - 2 : aligned(a, ra, r);
      if (!batch_axis(a, ra) && in[1]) return *why = "both operands sharded on non-batch axes", false;
    }
    if (in[1]) {
      const int b = in[1]->axis;
      if (b == static_cast<int>(rb) - 2) return *why = "contracts over the sharded axis", false;
      const int ob = b == static_cast<int>(rb) - 1 ? static_cast<int>(r) - 1 : aligned(b, rb, r);
      if (oa >= 0 && ob != oa) return *why = "operands sharded on different axes", false;
      oa = ob;
    }
    // A replicated operand spanning the sharded batch axis is sliced at run time.
    if (oa < static_cast<int>(r) - 2) {
      Action act;
      act.kind = Action::Kind::kLocal;
      for (int k = 0; k < 2; ++k) {
        if (in[k]) continue;
        const auto& s = k == 0 ? a_shape : *b_shape;
        const int ia = oa - (static_cast<int>(r) - static_cast<int>(s.size()));
        if (ia < 0 || s[ia] == 1) continue;
        if (plain.outer != 1) return *why = "a replicated operand spans the sharded axis", false;
        act.runtime_slices.push_back({static_cast<std::size_t>(k), ia, {s[ia]}});
      }
      if (!act.runtime_slices.empty()) actions_[index] = act;
    }
    return pass_through(n, oa, plain, sources);
  }

  // A GEMM with constant weight reading a value sharded along its contracting axis: the weight's rows
  // (`weight_axis`) sliced, an all-reduce after it.
  bool row(std::size_t index, const Shard& s0, int weight_axis) {
    const Node& n = g_.nodes[index];
    const Tensor* w = constant(g_, n.inputs[1]);
    const std::int64_t k = w->shape()[weight_axis];
    Action a;
    a.kind = Action::Kind::kRow;
    a.slices.push_back({1, weight_axis, s0.parts.empty() ? std::vector<std::int64_t>{k} : s0.parts});
    a.note = detail::str_cat("row-parallel ", describe(n), ": weight ", dims_str(w->shape()), " sliced along axis ",
                             weight_axis, ", then all_reduce(sum)");
    actions_[index] = a;
    return true;  // the output is replicated (after the all-reduce)
  }

  const Graph& g_;
  Uses uses_;
  int tp_;
  const std::set<std::size_t>& excluded_;
  std::map<std::string, Shard> shards_;
  std::map<std::size_t, Action> actions_;
  std::map<std::size_t, std::string> failed_;  // source GEMM -> why its sharding failed
};

}  // namespace

PassResult tensor_parallel(Graph& g, const PassContext& ctx) {
  PassResult result{"tensor_parallel", 0, {}};
  if (ctx.tp_size <= 1) return result;
  const int tp = ctx.tp_size;
  const int rank = ctx.tp_rank;
  XPURT_CHECK(rank >= 0 && rank < tp, "tensor_parallel: rank ", rank, " is not in [0, ", tp, ")");
  // Note [Sharding by propagation]: drop failing column GEMMs until the analysis holds.
  std::set<std::size_t> excluded;
  std::map<std::size_t, std::string> reasons;
  std::unique_ptr<Analysis> analysis;
  for (int round = 0; round < 1000; ++round) {
    analysis = std::make_unique<Analysis>(g, tp, excluded);
    analysis->run();
    if (analysis->failed().empty()) break;
    for (const auto& [index, why] : analysis->failed()) {
      excluded.insert(index);
      reasons.emplace(index, why);
    }
  }
  XPURT_INTERNAL_ASSERT(analysis->failed().empty(), "tensor_parallel: the sharding analysis did not converge");

  std::vector<std::string> replicated_notes;
  for (const auto& [index, why] : reasons)
    replicated_notes.push_back("replicated " + describe(g.nodes[index]) + ": " + why);
  int columns = 0;
  int rows = 0;
  std::set<std::string> replaced;
  std::vector<Node> nodes;
  std::vector<std::string> detail_notes;
  std::set<std::string> retyped;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    Node n = g.nodes[i];
    for (const std::string& o : n.outputs) {
      if (!o.empty() && analysis->shard(o)) retyped.insert(o);
    }
    auto it = analysis->actions().find(i);
    if (it == analysis->actions().end()) {
      nodes.push_back(std::move(n));
      continue;
    }
    const Action& a = it->second;
    for (const ConstSlice& s : a.slices) {
      const Tensor* c = constant(g, n.inputs[s.input]);
      XPURT_INTERNAL_ASSERT(c != nullptr, "tensor_parallel: a sliced input is not constant");
      replaced.insert(n.inputs[s.input]);
      const Tensor local = slice_along(*c, s.axis, local_ranges(s.parts, tp, rank));
      n.inputs[s.input] = add_constant(g, detail::str_cat(n.inputs[s.input], "_tp", rank), local);
    }
    for (const ConstSlice& s : a.runtime_slices) {
      const auto [begin, end] = local_ranges(s.parts, tp, rank).front();
      auto ints = [&](const char* hint, std::int64_t v) {
        return add_constant(g, detail::str_cat(n.name, "_", hint, "_tp", rank), int64_tensor({v}));
      };
      Node slice;
      slice.name = g.unique_name(detail::str_cat(n.name, "_shard_input", s.input));
      slice.op_type = "Slice";
      slice.inputs = {n.inputs[s.input], ints("starts", begin), ints("ends", end), ints("axes", s.axis)};
      slice.outputs = {g.unique_name(detail::str_cat(n.name, "_input", s.input, "_tp", rank))};
      n.inputs[s.input] = slice.outputs[0];
      nodes.push_back(std::move(slice));
    }
    if (a.new_shape) {
      replaced.insert(n.inputs[1]);
      n.inputs[1] = add_constant(g, detail::str_cat(n.name, "_shape_tp", rank), int64_tensor(*a.new_shape));
      if (n.op_type == "Reshape") n.attrs.set("allowzero", std::int64_t{0});
    }
    if (a.new_split) {
      if (n.has_input(1)) {
        replaced.insert(n.inputs[1]);
        n.inputs[1] = add_constant(g, detail::str_cat(n.name, "_split_tp", rank), int64_tensor(*a.new_split));
      } else if (n.attrs.has("split")) {
        n.attrs.set("split", *a.new_split);
      }
    }
    if (a.kind == Action::Kind::kColumn) {
      ++columns;
      detail_notes.push_back(a.note);
    }
    if (a.kind != Action::Kind::kRow) {
      nodes.push_back(std::move(n));
      continue;
    }
    // Row-parallel: GEMM -> partial sum -> AllReduce [-> + bias].
    ++rows;
    detail_notes.push_back(a.note);
    const std::string out = n.outputs[0];
    const std::string partial = g.unique_name(out + "_partial");
    std::string bias;
    double beta = 1.0;
    if (is_onnx(n, "Gemm") && n.has_input(2)) {
      bias = n.inputs[2];
      beta = n.attrs.get_float("beta", 1.0);
      n.inputs.resize(2);
    }
    n.outputs[0] = partial;
    const std::string node_name = n.name;
    nodes.push_back(std::move(n));
    Node reduce;
    reduce.name = g.unique_name(node_name + "_all_reduce");
    reduce.op_type = "AllReduce";
    reduce.domain = kXpurtDomain;
    reduce.inputs = {partial};
    reduce.attrs.set("comm", ctx.tp_comm).set("op", std::string("sum"));
    if (bias.empty()) {
      reduce.outputs = {out};
      nodes.push_back(std::move(reduce));
      continue;
    }
    const std::string reduced = g.unique_name(out + "_reduced");
    reduce.outputs = {reduced};
    nodes.push_back(std::move(reduce));
    std::string bias_input = bias;
    if (beta != 1.0) {
      const Tensor* c = constant(g, bias);
      XPURT_INTERNAL_ASSERT(c != nullptr, "tensor_parallel: a Gemm bias scaled by beta is not constant");
      std::vector<double> values = to_doubles(*c);
      for (double& v : values) v *= beta;
      bias_input = add_constant(g, bias + "_beta", from_doubles(c->shape(), c->dtype(), values));
    }
    Node add;
    add.name = g.unique_name(node_name + "_bias");
    add.op_type = "Add";
    add.inputs = {reduced, bias_input};
    add.outputs = {out};
    nodes.push_back(std::move(add));
  }
  if (columns + rows == 0) {
    result.notes.push_back(detail::str_cat("tensor_parallel=", tp, ": nothing sharded (every GEMM replicated)"));
    for (std::string& note : replicated_notes) result.notes.push_back(std::move(note));
    return result;
  }
  // Shapes of sharded values change: they are inferred again (PassContext::infer_types).
  for (const std::string& v : retyped) g.types.erase(v);
  g.nodes = std::move(nodes);
  remove_unused_constants(g, replaced);
  g.validate();
  result.rewrites = columns + rows;
  result.notes.push_back(detail::str_cat("tensor_parallel=", tp, ", rank ", rank, ": ", columns,
                                         " column-parallel and ", rows, " row-parallel GEMM(s), ", rows,
                                         " all_reduce(s); ", reasons.size(), " GEMM(s) replicated"));
  for (std::string& note : detail_notes) result.notes.push_back(std::move(note));
  for (std::string& note : replicated_notes) result.notes.push_back(std::move(note));
  return result;
}

}  // namespace xpuruntime::passes
