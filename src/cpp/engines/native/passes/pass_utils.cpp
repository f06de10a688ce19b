// Helpers shared by the graph passes (see pass_utils.h).
#include "engines/native/passes/pass_utils.h"

#include "frontends/onnx/onnx_schemas.h"
#include "core/scalar.h"
#include "xpuruntime/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

bool has_onnx_arity(const Node& n) {
  if (!(n.domain.empty() || n.domain == "ai.onnx")) return true;
  const auto arity = onnx_schema::arity_of_any_version(n.op_type);
  if (!arity) return true;
  const auto fits = [](std::size_t count, int min, int max) {
    return count >= static_cast<std::size_t>(min) && (max < 0 || count <= static_cast<std::size_t>(max));
  };
  return fits(n.inputs.size(), arity->min_inputs, arity->max_inputs) &&
         fits(n.outputs.size(), arity->min_outputs, arity->max_outputs);
}

}  // namespace xpuruntime::passes

namespace xpuruntime::passes::internal {

void collect_subgraph_reads(const Graph& sub, std::set<std::string>& out) {
  for (const Node& n : sub.nodes) {
    for (const auto& in : n.inputs) {
      if (!in.empty()) out.insert(in);
    }
    for (const auto& [attr, g] : n.graph_attrs) {
      (void)attr;
      if (g) collect_subgraph_reads(*g, out);
    }
  }
  out.insert(sub.outputs.begin(), sub.outputs.end());
}

Uses::Uses(const Graph& g) : readers_(g.consumers()), producers_(g.producers()) {
  outputs_.insert(g.outputs.begin(), g.outputs.end());
  for (const Node& n : g.nodes) {
    for (const auto& [attr, sub] : n.graph_attrs) {
      (void)attr;
      if (sub) collect_subgraph_reads(*sub, subgraph_reads_);
    }
  }
}

const std::vector<std::size_t>& Uses::readers(const std::string& value) const {
  static const std::vector<std::size_t> kNone;
  auto it = readers_.find(value);
  return it == readers_.end() ? kNone : it->second;
}

bool Uses::unused(const std::string& value) const {
  return readers(value).empty() && !is_graph_output(value) && !read_by_subgraph(value);
}

bool Uses::only_reader(const std::string& value, std::size_t reader) const {
  const auto& r = readers(value);
  return r.size() == 1 && r[0] == reader && !is_graph_output(value) && !read_by_subgraph(value);
}

std::optional<std::size_t> Uses::producer(const std::string& value) const {
  auto it = producers_.find(value);
  if (it == producers_.end()) return std::nullopt;
  return it->second;
}

bool is_constant(const Graph& g, const std::string& value) {
  if (value.empty() || g.initializers.count(value) == 0) return false;
  return std::find(g.inputs.begin(), g.inputs.end(), value) == g.inputs.end();
}

const Tensor* constant(const Graph& g, const std::string& value) {
  if (!is_constant(g, value)) return nullptr;
  return &g.initializers.at(value);
}

std::optional<double> scalar_constant(const Graph& g, const std::string& value) {
  return detail::one_element_value(constant(g, value));  // Note [Scalars read from tensors]
}

bool near(double value, double expected, double rel) {
  return std::fabs(value - expected) <= rel * std::fabs(expected);
}

ValueType type_of(const Tensor& t) {
  ValueType vt;
  vt.dtype = t.dtype();
  vt.has_shape = true;
  for (std::int64_t d : t.shape()) vt.shape.emplace_back(d);
  return vt;
}

std::optional<ValueType> value_type(const Graph& g, const std::string& value) {
  if (const Tensor* t = constant(g, value)) return type_of(*t);
  if (const ValueType* vt = g.type(value)) return *vt;
  return std::nullopt;
}

std::optional<SliceRange> single_axis_slice(const Graph& g, const Node& n, std::int64_t rank) {
  if (!is_onnx(n, "Slice") || n.inputs.size() < 3 || g.opset("") < 10) return std::nullopt;
  auto one = [&](std::size_t k) -> std::optional<std::int64_t> {
    if (k >= n.inputs.size() || n.inputs[k].empty()) return std::nullopt;
    const auto scalar = detail::one_element_value(constant(g, n.inputs[k]));
    if (!scalar) return std::nullopt;
    const double v = *scalar;
    return v >= 9.2e18    ? std::numeric_limits<std::int64_t>::max()
           : v <= -9.2e18 ? std::numeric_limits<std::int64_t>::min()
                          : static_cast<std::int64_t>(v);
  };
  auto start = one(1), end = one(2);
  if (!start || !end) return std::nullopt;
  SliceRange range{0, *start, *end};
  if (n.inputs.size() > 3 && !n.inputs[3].empty()) {
    auto axis = one(3);
    if (!axis || *axis < -rank || *axis >= rank) return std::nullopt;
    range.axis = *axis < 0 ? *axis + rank : *axis;
  } else if (rank != 1) {
    return std::nullopt;  // the default axes are 0..rank-1: one axis only for a 1-d input
  }
  if (n.inputs.size() > 4 && !n.inputs[4].empty()) {
    auto step = one(4);
    if (!step || *step != 1) return std::nullopt;
  }
  return range;
}

std::optional<std::vector<std::int64_t>> constant_axes(const Graph& g, const Node& n, std::int64_t input_since) {
  if (g.opset(n.domain) >= input_since) {
    if (!n.has_input(1)) return std::nullopt;
    const Tensor* t = constant(g, n.inputs[1]);
    if (t == nullptr) return std::nullopt;
    return to_int64s(*t);
  }
  if (!n.attrs.has("axes")) return std::nullopt;
  return n.attrs.get_ints("axes", {});
}

std::optional<std::vector<std::int64_t>> static_shape(const Graph& g, const std::string& value) {
  auto vt = value_type(g, value);
  if (!vt || !vt->fully_known()) return std::nullopt;
  std::vector<std::int64_t> sizes = vt->sizes();
  // A shape no tensor can have (a negative size, or more elements than int64 holds: a malformed model's declared
  // type) is not static: passes multiply sizes and strides freely, and must not overflow doing so.
  std::int64_t elements = 1;
  for (std::int64_t d : sizes) {
    if (d < 0 || __builtin_mul_overflow(elements, std::max<std::int64_t>(d, 1), &elements)) return std::nullopt;
  }
  return sizes;
}

std::optional<DType> value_dtype(const Graph& g, const std::string& value) {
  auto vt = value_type(g, value);
  if (!vt) return std::nullopt;
  return vt->dtype;
}

bool is_fusable_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

bool same_dim(const Dim& a, const Dim& b) {
  if (a.known() || b.known()) return a.known() && b.known() && a.value == b.value;
  return !a.symbol.empty() && a.symbol == b.symbol;
}

bool same_shape(const ValueType& a, const ValueType& b) {
  if (!a.has_shape || !b.has_shape || a.shape.size() != b.shape.size()) return false;
  for (std::size_t i = 0; i < a.shape.size(); ++i) {
    if (!same_dim(a.shape[i], b.shape[i])) return false;
  }
  return true;
}

int scalar_operand(const Graph& g, const Node& n, const std::string& op_type, double expected) {
  if (!is_onnx(n, op_type.c_str()) || n.inputs.size() != 2) return -1;
  for (int k = 0; k < 2; ++k) {
    const Tensor* c = constant(g, n.inputs[static_cast<std::size_t>(k)]);
    if (c == nullptr || c->numel() != 1 || c->dim() > 1) continue;
    auto v = scalar_constant(g, n.inputs[static_cast<std::size_t>(k)]);
    if (v && near(*v, expected)) return 1 - k;
  }
  return -1;
}

std::optional<DType> dtype_from_onnx(std::int64_t code) {
  DType dtype;
  if (dtype_from_onnx_type(code, &dtype)) return dtype;
  return std::nullopt;
}

bool widens_exactly(DType from, DType to) {
  switch (from) {
    case DType::kFloat16:
    case DType::kBFloat16: return to == DType::kFloat32 || to == DType::kFloat64;
    case DType::kFloat32: return to == DType::kFloat64;
    case DType::kInt8: return to == DType::kInt16 || to == DType::kInt32 || to == DType::kInt64;
    case DType::kUInt8:
      return to == DType::kInt16 || to == DType::kInt32 || to == DType::kInt64 || to == DType::kUInt16 ||
             to == DType::kUInt32 || to == DType::kUInt64;
    case DType::kInt16: return to == DType::kInt32 || to == DType::kInt64;
    case DType::kUInt16:
      return to == DType::kInt32 || to == DType::kInt64 || to == DType::kUInt32 || to == DType::kUInt64;
    case DType::kInt32: return to == DType::kInt64;
    case DType::kUInt32: return to == DType::kInt64 || to == DType::kUInt64;
    case DType::kBool:  // false and true as 0 and 1, which every numeric type holds
      return to == DType::kInt8 || to == DType::kUInt8 || to == DType::kInt16 || to == DType::kUInt16 ||
             to == DType::kInt32 || to == DType::kUInt32 || to == DType::kInt64 || to == DType::kUInt64 ||
             to == DType::kFloat16 || to == DType::kBFloat16 || to == DType::kFloat32 || to == DType::kFloat64;
    default: return false;
  }
}

std::string add_constant(Graph& g, const std::string& hint, const Tensor& t) {
  const std::string name = g.unique_name(hint);
  g.initializers[name] = t;
  g.types[name] = type_of(t);
  return name;
}

void remove_unused_constants(Graph& g, const std::set<std::string>& candidates) {
  if (candidates.empty()) return;
  const Uses uses(g);
  for (const auto& name : candidates) {
    if (!is_constant(g, name) || !uses.unused(name)) continue;
    g.initializers.erase(name);
    g.types.erase(name);
  }
}

std::string other_input(const Node& n, const std::string& value) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == value && n.inputs[1] != value) return n.inputs[1];
  if (n.inputs[1] == value && n.inputs[0] != value) return n.inputs[0];
  return "";
}

bool Rewriter::any_taken(const std::vector<std::size_t>& nodes) const {
  return std::any_of(nodes.begin(), nodes.end(), [&](std::size_t i) { return taken_[i]; });
}

void Rewriter::replace(const std::vector<std::size_t>& pattern, std::vector<Node> new_nodes, std::string note) {
  XPURT_INTERNAL_ASSERT(!pattern.empty() && !any_taken(pattern), "a node rewritten twice in one scan");
  for (std::size_t i : pattern) taken_[i] = true;
  const std::size_t last = *std::max_element(pattern.begin(), pattern.end());
  auto& slot = inserted_[last];
  for (Node& n : new_nodes) slot.push_back(std::move(n));
  notes_.push_back(std::move(note));
}

int Rewriter::apply(PassResult& result) {
  if (notes_.empty()) return 0;
  std::set<std::string> orphan_candidates;  // constants the removed nodes read
  std::vector<Node> rebuilt;
  rebuilt.reserve(g_.nodes.size());
  for (std::size_t i = 0; i < g_.nodes.size(); ++i) {
    if (taken_[i]) {
      for (const auto& in : g_.nodes[i].inputs) {
        if (is_constant(g_, in)) orphan_candidates.insert(in);
      }
    } else {
      rebuilt.push_back(std::move(g_.nodes[i]));
    }
    auto it = inserted_.find(i);
    if (it != inserted_.end()) {
      for (Node& n : it->second) rebuilt.push_back(std::move(n));
    }
  }
  g_.nodes = std::move(rebuilt);
  g_.validate();
  remove_unused_constants(g_, orphan_candidates);
  const int count = static_cast<int>(notes_.size());
  result.rewrites += count;
  for (auto& note : notes_) result.notes.push_back(std::move(note));
  notes_.clear();
  inserted_.clear();
  taken_.assign(g_.nodes.size(), false);
  return count;
}

// The weights of `linears` (one layout, one dtype), each times its scale, side by side along N: [K, sum N] for "kn",
// [sum N, K] for "nk". Copied row by row on this thread: the registry's CPU concat splits the rows over OpenMP
// threads, and a region waits for every thread, so one thread whose core is busy (a build beside it, the library
// warm-up of Note [Libraries warmed while the model is read]) stalls it: 208-262 ms against 27-29 ms for BERT-base's
// twelve [768, 3 x 768] float16 weights on a loaded 2-core machine (about the same, 14-31 ms, on an idle one).
Tensor concatenated_weights(const Graph& g, const std::vector<const Node*>& linears, const std::vector<double>& scales,
                            bool kn) {
  std::vector<Tensor> parts;
  std::int64_t total = 0;  // sum N
  for (std::size_t t = 0; t < linears.size(); ++t) {
    const Tensor* w = constant(g, linears[t]->inputs[1]);
    if (scales[t] == 1.0) {
      parts.push_back(w->contiguous());
    } else {
      std::vector<double> values = to_doubles(*w);
      for (double& v : values) v *= scales[t];
      parts.push_back(from_doubles(w->shape(), w->dtype(), values));
    }
    total += parts.back().shape()[kn ? 1 : 0];
  }
  const std::vector<std::int64_t>& first = parts[0].shape();
  const std::vector<std::int64_t> shape = kn ? std::vector<std::int64_t>{first[0], total}
                                             : std::vector<std::int64_t>{total, first[1]};
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  auto* to = static_cast<char*>(out.data_ptr());
  if (!kn) {
    for (const Tensor& part : parts) {
      std::memcpy(to, part.data_ptr(), static_cast<std::size_t>(part.nbytes()));
      to += part.nbytes();
    }
    return out;
  }
  for (std::int64_t row = 0; row < first[0]; ++row) {
    for (const Tensor& part : parts) {
      const auto bytes = static_cast<std::int64_t>(part.shape()[1] * static_cast<std::int64_t>(part.element_size()));
      std::memcpy(to, static_cast<const char*>(part.data_ptr()) + row * bytes, static_cast<std::size_t>(bytes));
      to += bytes;
    }
  }
  return out;
}

std::string describe(const Node& n) {
  return xpuruntime::detail::str_cat(n.domain.empty() ? "" : n.domain + ":", n.op_type, " '", n.name, "'");
}

Tensor int64_tensor(const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

// The sizes a Split node cuts `dim` into, or empty when they are not known while the plan is built.
std::vector<std::int64_t> split_sizes(const Graph& g, const Node& n, std::int64_t opset, std::int64_t dim) {
  std::vector<std::int64_t> sizes;
  if (opset < 13) {
    sizes = n.attrs.get_ints("split", {});
  } else if (n.has_input(1)) {
    const Tensor* t = constant(g, n.inputs[1]);
    if (t == nullptr || t->dtype() != DType::kInt64) return {};
    const auto* p = static_cast<const std::int64_t*>(t->data_ptr());
    sizes.assign(p, p + t->numel());
  }
  const auto outputs = static_cast<std::int64_t>(n.outputs.size());
  if (sizes.empty()) {
    // Equal parts; from opset 18 `num_outputs` may leave a smaller last part (ceil division).
    const std::int64_t parts = opset >= 18 ? n.attrs.get_int("num_outputs", outputs) : outputs;
    if (parts <= 0 || parts != outputs) return {};
    const std::int64_t each = opset >= 18 ? (dim + parts - 1) / parts : dim / parts;
    if (opset < 18 && dim % parts != 0) return {};
    for (std::int64_t k = 0; k < parts; ++k) sizes.push_back(std::max<std::int64_t>(0, std::min(each, dim - k * each)));
  }
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  if (total != dim || static_cast<std::int64_t>(sizes.size()) != outputs) return {};
  return sizes;
}

std::optional<std::size_t> sole_reader(const Graph& g, const Uses& uses, const Rewriter& rw, const std::string& value,
                                       const char* op_type) {
  const auto& readers = uses.readers(value);
  if (readers.size() != 1 || !uses.only_reader(value, readers[0]) || rw.taken(readers[0])) return std::nullopt;
  if (!is_onnx(g.nodes[readers[0]], op_type)) return std::nullopt;
  return readers[0];
}

ReshapeChain reshape_chain(const Graph& g, const Uses& uses, const Rewriter& rw, const std::string& value) {
  ReshapeChain chain{{}, value};
  if (!static_shape(g, value)) return chain;
  while (auto ri = sole_reader(g, uses, rw, chain.end, "Reshape")) {
    const std::string& next = g.nodes[*ri].outputs[0];
    if (!static_shape(g, next)) break;
    chain.reshapes.push_back(*ri);
    chain.end = next;
  }
  return chain;
}

std::optional<std::string> gelu_activation(const Node& n) {
  if (!(n.domain == kXpurtDomain && n.op_type == "Gelu") && !is_onnx(n, "Gelu")) return std::nullopt;
  const std::string approximate = n.attrs.get_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh") return std::nullopt;
  return approximate == "tanh" ? "gelu_tanh" : "gelu";
}

Node make_node(Graph& g, const std::string& op_type, const std::string& name, std::vector<std::string> inputs,
               std::vector<std::string> outputs, Attributes attrs) {
  Node n;
  n.op_type = op_type;
  n.name = g.unique_name(name);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attrs = std::move(attrs);
  return n;
}

fused::InputView contiguous_view(const std::vector<std::int64_t>& shape) {
  fused::InputView v;
  v.shape = shape;
  v.strides = contiguous_strides(shape);
  return v;
}

bool is_block(const fused::InputView& v) {
  std::int64_t expected = 1;
  for (std::size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d] == 1) continue;
    if (v.strides[d] != expected) return false;
    expected *= v.shape[d];
  }
  return true;
}

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

bool constant_linear(const Graph& g, const Node& l) {
  if (l.domain != kXpurtDomain || l.op_type != "Linear" || l.inputs.size() < 2 || l.outputs.size() != 1) return false;
  const Tensor* w = constant(g, l.inputs[1]);
  return w != nullptr && w->dim() == 2 &&
         !(l.inputs.size() > 2 && !l.inputs[2].empty() && constant(g, l.inputs[2]) == nullptr);
}

Node reshape_node(Graph& g, const std::string& name, const std::string& from, const std::vector<std::int64_t>& shape,
                  const std::string& to) {
  return make_node(g, "Reshape", name, {from, add_constant(g, name + "_shape", int64_tensor(shape))}, {to});
}

void insert_before(Graph& g, std::map<std::size_t, std::vector<Node>> before, const std::set<std::size_t>& dropped) {
  std::vector<Node> nodes;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    if (dropped.count(i)) continue;
    if (auto it = before.find(i); it != before.end()) {
      for (Node& n : it->second) nodes.push_back(std::move(n));
    }
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
}

std::optional<std::vector<double>> per_channel_values(const Tensor& c, std::int64_t count, std::size_t axis_from_end,
                                                      std::int64_t out_rank) {
  const auto& shape = c.shape();
  if (out_rank >= 0 ? c.dim() > out_rank : c.dim() > static_cast<int>(axis_from_end) + 1) return std::nullopt;
  std::vector<double> values = to_doubles(c);
  if (values.size() == 1) return std::vector<double>(static_cast<std::size_t>(count), values[0]);
  if (static_cast<std::int64_t>(values.size()) != count) return std::nullopt;
  // Every dim is 1 except the channel axis.
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::size_t from_end = shape.size() - 1 - i;
    if (from_end != axis_from_end && shape[i] != 1) return std::nullopt;
  }
  if (shape.size() <= axis_from_end) return std::nullopt;
  return values;
}

}  // namespace xpuruntime::passes::internal
