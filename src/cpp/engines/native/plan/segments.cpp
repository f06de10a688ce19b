// Segment boundaries of plans: where a plan ends at data-dependent nodes, and the cache of the plans that follow
// (Note [Segmented plans] in capture_plan.h).
#include "engines/native/plan/segments.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "engines/native/passes/pass_utils.h"
#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

namespace runtime {

namespace {

using passes::internal::scalar_constant;
using passes::internal::type_of;

bool is_onnx(const Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

bool known(const Graph& g, const std::string& name) {
  const ValueType* vt = g.type(name);
  return vt != nullptr && vt->is_tensor() && vt->fully_known();
}

// Every value `n` reads: its inputs and the outer values its subgraphs read.
std::vector<std::string> reads_of(const Node& n) {
  std::vector<std::string> reads;
  for (const auto& in : n.inputs) {
    if (!in.empty()) reads.push_back(in);
  }
  for (const auto& [attr, sub] : n.graph_attrs) {
    if (!sub) continue;
    for (const std::string& name : onnx_ref::outer_names(*sub)) reads.push_back(name);
  }
  return reads;
}

// What a frontier node is: how the segment can end at it.
enum class Frontier { kColumns, kRows, kHost, kNone };

// The numeric parameters of a NonMaxSuppression (inputs 2..4), when they are constants or absent.
bool nms_attributes(const Graph& g, const Node& n, Attributes* attrs) {
  attrs->set("center_point_box", n.attrs.get_int("center_point_box", 0));
  std::int64_t max_per_class = 0;
  double iou = 0.0;
  for (std::size_t k = 2; k < 5; ++k) {
    if (!n.has_input(k)) continue;
    const Tensor* t = passes::internal::constant(g, n.inputs[k]);
    if (t == nullptr) return false;
    if (t->numel() == 0) continue;  // an empty tensor: the default
    const std::optional<double> v = scalar_constant(g, n.inputs[k]);
    if (!v) return false;
    if (k == 2) {
      max_per_class = static_cast<std::int64_t>(std::clamp(*v, -1.0, 9.0e18));
    } else if (k == 3) {
      iou = *v;
    } else {
      attrs->set("score_threshold", *v);
    }
  }
  attrs->set("max_output_boxes_per_class", max_per_class);
  attrs->set("iou_threshold", iou);
  return true;
}

ValueType int64_type(const std::vector<std::int64_t>& sizes) {
  ValueType vt;
  vt.dtype = DType::kInt64;
  vt.has_shape = true;
  for (std::int64_t d : sizes) vt.shape.emplace_back(d);
  return vt;
}

// The inputs of `n` that may say its output's shape (k, a shape, sizes, pads, axes, a condition): those a segment
// boundary reads to the host. Data inputs never are: a next segment keyed on data would be planned for every run.
bool shape_input(const Node& n, std::size_t index, DType dtype) {
  static const std::map<std::string, std::set<std::size_t>> inputs = {
      {"TopK", {1}},           {"Reshape", {1}},         {"Expand", {1}},
      {"Tile", {1}},           {"ConstantOfShape", {0}}, {"Range", {0, 1, 2}},
      {"Slice", {1, 2, 3, 4}}, {"Pad", {1, 3}},          {"Resize", {1, 2, 3}},
      {"Upsample", {1}},       {"OneHot", {1}},          {"Squeeze", {1}},
      {"Unsqueeze", {1}},      {"Split", {1}},           {"If", {0}},
      {"ReduceSum", {1}},      {"ReduceMean", {1}},      {"ReduceMax", {1}},
      {"ReduceMin", {1}},      {"ReduceProd", {1}},      {"NonMaxSuppression", {2, 3, 4}},
      {"Trilu", {1}},          {"CenterCropPad", {1}},   {"EyeLike", {}},
  };
  const bool is_float = dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kFloat64;
  // ONNX Runtime's GroupQueryAttention: total_sequence_length sets the present key/value's length (Note [Group
  // query attention] in core/op_schemas_gqa.cpp).
  if (n.domain == "com.microsoft" && n.op_type == "GroupQueryAttention") return index == 6 && !is_float;
  if (!is_onnx(n)) return false;
  auto it = inputs.find(n.op_type);
  if (it == inputs.end() || !it->second.count(index)) return false;
  // Floats only where they are scales or thresholds (Resize, Upsample, NonMaxSuppression) or a float Range.
  return !is_float || n.op_type == "Resize" || n.op_type == "Upsample" || n.op_type == "NonMaxSuppression" ||
         n.op_type == "Range";
}

bool host_readable(const Graph& g, const std::string& name) {
  const ValueType* vt = g.type(name);
  if (vt == nullptr || !vt->is_tensor() || !vt->fully_known()) return false;
  // Only small values are read on the host: past 64 elements the count stops growing, so declared dims of any size
  // ([7, 2^63 - 1] overflowed int64 here: UBSan, the structural fuzzer) cannot overflow it.
  std::int64_t numel = 1;
  bool empty = false;
  for (std::int64_t dim : vt->sizes()) {
    empty = empty || dim == 0;
    numel = dim < 0 || dim > 64 || numel > 64 ? 65 : numel * dim;
  }
  if (empty) numel = 0;
  const DType d = vt->dtype;
  const bool numeric = d == DType::kInt64 || d == DType::kInt32 || d == DType::kBool || d == DType::kFloat32 ||
                       d == DType::kFloat16 || d == DType::kFloat64;
  return numeric && numel <= 64;
}

// A NonZero's or NonMaxSuppression's bounded form in the first segment.
struct Bounded {
  std::string value;  // the bounded output
  int count = 0;      // its count's position among the counts
  SegmentBoundary::Carried::Kind kind;
};

// The per-node tables the phases of split_segments share, filled phase by phase.
struct SegmentSplit {
  // find_static_part: the values known before the run (inputs, initializers, static nodes' outputs), and per node
  // whether it is static.
  std::set<std::string> static_values;
  std::vector<bool> is_static;
  // find_frontier: per node how it ends the segment (kNone: not a frontier node), a kRows node's attributes, and
  // the values read to the host.
  std::vector<Frontier> kind;
  std::vector<Attributes> nms_attrs;
  std::set<std::string> host_values;
  // split_nodes: the two segments' nodes, the values the rest makes, the bounded forms by the original output's
  // name, and their counts' names.
  std::vector<Node> first_nodes, rest_nodes;
  std::set<std::string> rest_produced;
  std::map<std::string, Bounded> bounded;
  std::vector<std::string> counts;
};

// The static part: the nodes whose reads are all static and whose outputs' types are known. False when the graph
// cannot be segmented (an input of unknown shape) or need not be (every node is static).
bool find_static_part(const Graph& g, SegmentSplit& s) {
  s.static_values.insert(g.inputs.begin(), g.inputs.end());
  for (const auto& [name, t] : g.initializers) s.static_values.insert(name);
  for (const auto& in : g.inputs) {
    if (!known(g, in)) return false;
  }
  const std::size_t count = g.nodes.size();
  s.is_static.assign(count, false);
  bool all_static = true;
  for (std::size_t i = 0; i < count; ++i) {
    const Node& n = g.nodes[i];
    bool ok = true;
    for (const auto& r : reads_of(n)) ok = ok && s.static_values.count(r) != 0;
    for (const auto& out : n.outputs) ok = ok && (out.empty() || known(g, out));
    // An If on a condition computed from data ends a segment even when both branches give the same shapes: the
    // next segment inlines the branch taken (Note [Branches of constant If nodes]), so it runs on registry kernels.
    if (is_onnx(n) && n.op_type == "If" && n.has_input(0) && !g.is_constant(n.inputs[0])) ok = false;
    s.is_static[i] = ok;
    if (ok) {
      for (const auto& out : n.outputs) {
        if (!out.empty()) s.static_values.insert(out);
      }
    }
    all_static = all_static && ok;
  }
  return !all_static;
}

// The frontier: nodes not static whose reads all are. False when one of them cannot end a segment, or none is.
bool find_frontier(const Graph& g, SegmentSplit& s) {
  const std::size_t count = g.nodes.size();
  s.kind.assign(count, Frontier::kNone);
  s.nms_attrs.assign(count, Attributes());
  for (std::size_t i = 0; i < count; ++i) {
    if (s.is_static[i]) continue;
    const Node& n = g.nodes[i];
    bool frontier = true;
    for (const auto& r : reads_of(n)) frontier = frontier && s.static_values.count(r) != 0;
    if (!frontier) continue;
    if (is_onnx(n) && n.op_type == "NonZero" && n.has_input(0) && n.outputs.size() == 1) {
      const ValueType* vt = g.type(n.inputs[0]);
      if (vt->sizes().size() >= 1) {
        s.kind[i] = Frontier::kColumns;
        continue;
      }
    }
    if (is_onnx(n) && n.op_type == "NonMaxSuppression" && n.outputs.size() == 1 && n.has_input(1) &&
        nms_attributes(g, n, &s.nms_attrs[i])) {
      s.kind[i] = Frontier::kRows;
      continue;
    }
    const bool subgraphs_ok = n.graph_attrs.empty() || (is_onnx(n) && n.op_type == "If");
    std::vector<std::string> hosts;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const std::string& in = n.inputs[k];
      if (in.empty() || g.is_constant(in) || !host_readable(g, in)) continue;
      if (shape_input(n, k, g.type(in)->dtype)) hosts.push_back(in);
    }
    if (!subgraphs_ok || hosts.empty()) return false;  // this node cannot end a segment
    s.kind[i] = Frontier::kHost;
    s.host_values.insert(hosts.begin(), hosts.end());
  }
  // No node can start the next segment (one reads a name nothing defines: a malformed model, found by fuzz_model):
  // the plan is not segmented, and the build reports those nodes.
  return std::any_of(s.kind.begin(), s.kind.end(), [](Frontier f) { return f != Frontier::kNone; });
}

// The first segment's nodes (the static ones and the bounded forms of the kColumns and kRows frontier nodes) and
// the rest's; names the frontier nodes in boundary.nodes.
void split_nodes(Graph& g, SegmentSplit& s, SegmentBoundary& boundary) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];  // copied, not moved: unique_name reads the graph's nodes
    if (s.is_static[i]) {
      s.first_nodes.push_back(n);
      continue;
    }
    if (s.kind[i] == Frontier::kColumns || s.kind[i] == Frontier::kRows) {
      const std::string out = n.outputs[0];
      Node b;
      b.name = n.name;
      b.domain = kXpurtDomain;
      b.op_type = n.op_type;
      const std::string bounded_name = g.unique_name(out + "/bounded");
      g.types[bounded_name] = ValueType();  // reserves the name; the plan's dispatch gives the type
      const std::string count_name = g.unique_name(out + "/count");
      g.types[count_name] = int64_type({1});
      if (s.kind[i] == Frontier::kColumns) {
        b.inputs = {n.inputs[0]};
      } else {
        b.inputs = {n.inputs[0], n.inputs[1]};
        b.attrs = s.nms_attrs[i];
      }
      b.outputs = {bounded_name, count_name};
      g.types.erase(bounded_name);
      s.bounded[out] = {bounded_name, static_cast<int>(s.counts.size()),
                        s.kind[i] == Frontier::kColumns ? SegmentBoundary::Carried::Kind::kColumns
                                                        : SegmentBoundary::Carried::Kind::kRows};
      s.counts.push_back(count_name);
      boundary.nodes.push_back(detail::str_cat(n.op_type, " '", n.name, "'"));
      s.first_nodes.push_back(b);
      continue;
    }
    if (s.kind[i] == Frontier::kHost) boundary.nodes.push_back(detail::str_cat(n.op_type, " '", n.name, "'"));
    for (const auto& out : n.outputs) {
      if (!out.empty()) s.rest_produced.insert(out);
    }
    s.rest_nodes.push_back(n);
  }
}

// The first segment's outputs, each once, in the order they were first asked for.
struct FirstOutputs {
  std::vector<std::string> names;
  std::map<std::string, int> index;

  int add(const std::string& name) {
    auto it = index.find(name);
    if (it != index.end()) return it->second;
    names.push_back(name);
    return index[name] = static_cast<int>(names.size() - 1);
  }
};

// What crosses the boundary: the graph's outputs the first segment makes (first, in order), then every value the
// rest reads that it does not make (boundary.carried, the rest's inputs and initializers), then the bounded outputs
// that are graph outputs.
void carry_across(const Graph& g, const SegmentSplit& s, FirstOutputs& first, SegmentBoundary& boundary) {
  Graph& rest = boundary.rest;
  auto source_of = [&](const std::string& name) {
    auto in = std::find(g.inputs.begin(), g.inputs.end(), name);
    if (in != g.inputs.end()) return -1 - static_cast<int>(in - g.inputs.begin());
    return first.add(name);
  };
  for (const auto& out : g.outputs) {
    if (!s.rest_produced.count(out) && !s.bounded.count(out)) first.add(out);
  }
  std::set<std::string> carried_names;
  auto carry = [&](const std::string& name) {
    if (s.rest_produced.count(name) || carried_names.count(name)) return;
    // A name nothing defines (a malformed model, found by fuzz_model): the next segment's build reports it.
    if (!g.is_constant(name) && !s.static_values.count(name) && !s.bounded.count(name)) return;
    if (g.is_constant(name)) {
      rest.initializers[name] = g.initializers.at(name);
      rest.types[name] = type_of(g.initializers.at(name));
      return;
    }
    carried_names.insert(name);
    SegmentBoundary::Carried c;
    c.name = name;
    auto b = s.bounded.find(name);
    if (b != s.bounded.end()) {
      c.kind = b->second.kind;
      c.source = first.add(b->second.value);
      c.count = b->second.count;
    } else {
      c.kind = s.host_values.count(name) ? SegmentBoundary::Carried::Kind::kHost
                                         : SegmentBoundary::Carried::Kind::kTensor;
      c.source = source_of(name);
    }
    if (c.kind == SegmentBoundary::Carried::Kind::kHost) {
      rest.types[name] = *g.type(name);
    } else {
      rest.inputs.push_back(name);
      ValueType vt;
      vt.dtype = c.kind == SegmentBoundary::Carried::Kind::kTensor ? g.type(name)->dtype : DType::kInt64;
      rest.types[name] = vt;  // no shape: the run gives it (CapturePlan::build specialises it)
    }
    boundary.carried.push_back(std::move(c));
  };
  for (const Node& n : s.rest_nodes) {
    for (const auto& r : reads_of(n)) carry(r);
  }
  for (const auto& out : g.outputs) {
    if (s.bounded.count(out)) carry(out);  // a NonZero straight to the output: passed through the next segment
  }
}

// The counts, concatenated into one int64 vector at the end of the first segment: one copy reads them all.
void concat_counts(Graph& g, SegmentSplit& s, FirstOutputs& first, SegmentBoundary& boundary) {
  if (s.counts.empty()) return;
  Node concat;
  concat.name = g.unique_name("segment/counts");
  concat.op_type = "Concat";
  concat.attrs.set("axis", std::int64_t{0});
  concat.outputs = {concat.name};
  for (const auto& c : s.counts) concat.inputs.push_back(c);
  g.types[concat.name] = int64_type({static_cast<std::int64_t>(s.counts.size())});
  s.first_nodes.push_back(concat);
  boundary.counts_output = first.add(concat.name);
}

// Where each of the graph's outputs comes from (boundary.outputs): the first segment's, or the next segment's
// (a bounded output passes through it as an input of the same name).
void route_graph_outputs(const Graph& g, const SegmentSplit& s, const FirstOutputs& first,
                         SegmentBoundary& boundary) {
  Graph& rest = boundary.rest;
  for (const auto& out : g.outputs) {
    if (!s.rest_produced.count(out) && !s.bounded.count(out)) {
      boundary.outputs.push_back(first.index.at(out));
      continue;
    }
    auto it = std::find(rest.outputs.begin(), rest.outputs.end(), out);
    if (it == rest.outputs.end()) {
      rest.outputs.push_back(out);
      it = rest.outputs.end() - 1;
    }
    boundary.outputs.push_back(-1 - static_cast<int>(it - rest.outputs.begin()));
    if (const ValueType* vt = g.type(out); vt != nullptr && s.rest_produced.count(out)) rest.types[out] = *vt;
  }
}

}  // namespace

// The phases: find_static_part, find_frontier, split_nodes, carry_across, concat_counts, route_graph_outputs.
std::shared_ptr<SegmentBoundary> split_segments(Graph& g, const PlanOptions& options) {
  if (options.tp_size > 1) return nullptr;
  for (const auto& [name, vt] : g.types) {
    if (!vt.is_tensor()) return nullptr;  // sequences and optionals run in the reference library
  }
  SegmentSplit s;
  if (!find_static_part(g, s) || !find_frontier(g, s)) return nullptr;

  auto boundary = std::make_shared<SegmentBoundary>();
  boundary->options = options;
  boundary->options.compute_float = DType::kFloat32;  // the graph is in its compute precision already
  Graph& rest = boundary->rest;
  rest.name = g.name + "/segment";
  rest.opsets = g.opsets;
  rest.ir_version = g.ir_version;
  rest.producer = g.producer;

  split_nodes(g, s, *boundary);
  FirstOutputs first;
  carry_across(g, s, first, *boundary);
  concat_counts(g, s, first, *boundary);
  route_graph_outputs(g, s, first, *boundary);
  rest.nodes = std::move(s.rest_nodes);
  g.nodes = std::move(s.first_nodes);
  g.outputs = first.names;
  g.validate();  // `rest` is checked when a next segment is built (its host values are constants by then)
  return boundary;
}

}  // namespace runtime

// ---- SegmentBoundary ----

std::shared_ptr<const CapturePlan> SegmentBoundary::next(
    const std::vector<Tensor>& tensors, const std::vector<std::pair<std::string, Tensor>>& host) const {
  std::ostringstream key;
  std::vector<std::vector<std::int64_t>> shapes;
  for (const Tensor& t : tensors) {
    shapes.push_back(t.shape());
    key << detail::shape_str(t.shape(), ",") << ";";
  }
  for (const auto& [name, t] : host) {
    key << name << "=" << dtype_name(t.dtype()) << detail::shape_str(t.shape(), ",") << ":";
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (std::size_t k = 0; k < t.nbytes(); ++k) key << static_cast<int>(bytes[k]) << ".";
  }
  const std::string signature = key.str();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->first != signature) continue;
    cache_.splice(cache_.begin(), cache_, it);
    last_ = cache_.front().second;
    return last_;
  }
  Graph graph = rest;
  for (const auto& [name, t] : host) {
    graph.initializers[name] = t.contiguous();
    graph.types[name] = passes::internal::type_of(t);
  }
  std::shared_ptr<const CapturePlan> plan = CapturePlan::build(graph, shapes, options);
  cache_.emplace_front(signature, plan);
  while (cache_.size() > std::max<std::size_t>(max_plans, 1)) cache_.pop_back();
  last_ = plan;
  return plan;
}

std::shared_ptr<const CapturePlan> SegmentBoundary::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

std::size_t SegmentBoundary::plans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

std::string SegmentBoundary::str() const {
  std::string list;
  for (std::size_t k = 0; k < nodes.size() && k < 4; ++k) list += (k ? ", " : "") + nodes[k];
  if (nodes.size() > 4) list += detail::str_cat(" and ", nodes.size() - 4, " more");
  std::size_t bounded = 0, host = 0;
  for (const Carried& c : carried) {
    bounded += c.kind == Carried::Kind::kColumns || c.kind == Carried::Kind::kRows;
    host += c.kind == Carried::Kind::kHost;
  }
  return detail::str_cat(
      "ends at ", nodes.size(), " data-dependent node(s) (", list, "): one host synchronization",
      bounded ? detail::str_cat(" reads ", bounded, " count(s)") : std::string(),
      host ? detail::str_cat(bounded ? " and " : " reads ", host, " value(s) computed from data") : std::string(),
      "; the next segment is planned for the shapes that follow (", plans(), " plan(s) cached)");
}

}  // namespace xpuruntime
