// Graph IR: validation, topological sort and helpers (see graph.h).
#include "xpuruntime/graph.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <sstream>

#include "xpuruntime/exceptions.h"

namespace xpuruntime {

std::string Dim::str() const {
  if (known()) return std::to_string(value);
  return symbol.empty() ? "?" : symbol;
}

bool ValueType::fully_known() const {
  if (!has_shape || kind != ValueKind::kTensor) return false;
  for (const Dim& d : shape) {
    if (!d.known()) return false;
  }
  return true;
}

std::vector<std::int64_t> ValueType::sizes() const {
  XPURT_INTERNAL_ASSERT(fully_known(), "ValueType::sizes on a shape that is not fully known: ", str());
  std::vector<std::int64_t> out;
  out.reserve(shape.size());
  for (const Dim& d : shape) out.push_back(d.value);
  return out;
}

std::string ValueType::str() const {
  if (kind == ValueKind::kSequence) return "seq(" + element().str() + ")";
  if (kind == ValueKind::kOptional) return "optional(" + element().str() + ")";
  std::string s(dtype_name(dtype));
  if (!has_shape) return s + "[...]";
  s += "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + shape[i].str();
  return s + "]";
}

std::string ValueType::type_str() const {
  if (kind == ValueKind::kSequence) return "seq(" + element().type_str() + ")";
  if (kind == ValueKind::kOptional) return "optional(" + element().type_str() + ")";
  return "tensor(" + std::string(dtype_name(dtype)) + ")";
}

ValueType ValueType::sequence_of(const ValueType& element) {
  XPURT_INTERNAL_ASSERT(element.kind == ValueKind::kTensor, "a sequence of ", element.type_str());
  ValueType vt = element;
  vt.kind = ValueKind::kSequence;
  return vt;
}

ValueType ValueType::optional_of(const ValueType& element) {
  XPURT_INTERNAL_ASSERT(element.kind != ValueKind::kOptional, "an optional of ", element.type_str());
  ValueType vt = element;
  vt.element_kind = element.kind;
  vt.kind = ValueKind::kOptional;
  return vt;
}

ValueType ValueType::element() const {
  ValueType vt = *this;
  vt.kind = kind == ValueKind::kOptional ? element_kind : ValueKind::kTensor;
  vt.element_kind = ValueKind::kTensor;
  return vt;
}

std::string Node::str() const {
  std::ostringstream os;
  os << (domain.empty() ? "" : domain + ":") << op_type << " '" << name << "' (";
  for (std::size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << inputs[i];
  os << ") -> (";
  for (std::size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : "") << outputs[i];
  os << ")";
  if (!attrs.values().empty()) os << " " << attrs.str();
  return os.str();
}

std::int64_t Graph::opset(const std::string& domain) const {
  auto it = opsets.find(domain == "ai.onnx" ? "" : domain);
  return it == opsets.end() ? 0 : it->second;
}

const ValueType* Graph::type(const std::string& value) const {
  auto it = types.find(value);
  return it == types.end() ? nullptr : &it->second;
}

void Graph::validate() {
  // Names: unique, missing ones generated.
  std::set<std::string> node_names;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    Node& n = nodes[i];
    if (n.name.empty() || node_names.count(n.name)) {
      std::string base = n.name.empty() ? n.op_type + "_" + std::to_string(i) : n.name;
      std::string candidate = base;
      for (int k = 1; node_names.count(candidate); ++k) candidate = base + "_" + std::to_string(k);
      n.name = candidate;
    }
    node_names.insert(n.name);
  }
  // Every value produced once.
  std::unordered_map<std::string, std::string> produced;  // value -> producer description
  auto produce = [&](const std::string& value, const std::string& by) {
    if (value.empty()) return;
    auto [it, inserted] = produced.emplace(value, by);
    XPURT_CHECK(inserted, "invalid model: value '", value, "' is produced twice (by ", it->second, " and by ", by,
                ")");
  };
  for (const auto& in : inputs) produce(in, "graph input");
  for (const auto& [name, t] : initializers) {
    if (produced.count(name) == 0) produce(name, "initializer");
  }
  for (const Node& n : nodes) {
    for (const auto& out : n.outputs) produce(out, "node '" + n.name + "'");
  }
  // Outer-scope values of subgraphs are resolved by the engine; here, only top-level references are checked.
  for (const Node& n : nodes) {
    for (const auto& in : n.inputs) {
      XPURT_CHECK(in.empty() || produced.count(in), "invalid model: input '", in, "' of node '", n.name, "' (",
                  n.op_type, ") is not produced by any node, initializer or graph input");
    }
  }
  for (const auto& out : outputs) {
    XPURT_CHECK(produced.count(out), "invalid model: graph output '", out, "' is not produced");
  }
  // Stable topological sort (Kahn, lowest original index first).
  std::unordered_map<std::string, std::size_t> producer_of;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& out : nodes[i].outputs) {
      if (!out.empty()) producer_of[out] = i;
    }
  }
  std::vector<std::size_t> pending(nodes.size(), 0);
  std::vector<std::vector<std::size_t>> users(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    std::set<std::size_t> deps;
    for (const auto& in : nodes[i].inputs) {
      auto it = producer_of.find(in);
      if (!in.empty() && it != producer_of.end()) deps.insert(it->second);
    }
    // Subgraph nodes may read values of this graph implicitly.
    for (const auto& [attr, sub] : nodes[i].graph_attrs) {
      (void)attr;
      std::function<void(const Graph&)> scan = [&](const Graph& g) {
        for (const Node& sn : g.nodes) {
          for (const auto& in : sn.inputs) {
            auto it = producer_of.find(in);
            if (!in.empty() && it != producer_of.end() && it->second != i) deps.insert(it->second);
          }
          for (const auto& [a2, s2] : sn.graph_attrs) scan(*s2);
        }
      };
      if (sub) scan(*sub);
    }
    for (std::size_t d : deps) {
      XPURT_CHECK(d != i, "invalid model: node '", nodes[i].name, "' reads its own output");
      users[d].push_back(i);
      ++pending[i];
    }
  }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<Node> sorted;
  sorted.reserve(nodes.size());
  while (!ready.empty()) {
    std::size_t i = ready.top();
    ready.pop();
    sorted.push_back(nodes[i]);
    for (std::size_t u : users[i]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }
  if (sorted.size() != nodes.size()) {
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      XPURT_CHECK(pending[i] == 0, "invalid model: the graph has a cycle through node '", nodes[i].name, "' (",
                  nodes[i].op_type, ")");
    }
  }
  nodes = std::move(sorted);
}

std::unordered_map<std::string, std::vector<std::size_t>> Graph::consumers() const {
  std::unordered_map<std::string, std::vector<std::size_t>> out;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& in : nodes[i].inputs) {
      if (in.empty()) continue;
      auto& list = out[in];
      if (list.empty() || list.back() != i) list.push_back(i);
    }
  }
  return out;
}

std::unordered_map<std::string, std::size_t> Graph::producers() const {
  std::unordered_map<std::string, std::size_t> out;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& o : nodes[i].outputs) {
      if (!o.empty()) out[o] = i;
    }
  }
  return out;
}

std::string Graph::unique_name(const std::string& hint) const {
  // A scan per candidate, not a set of every name: the passes ask for names one rewrite at a time, and building
  // that set each time made name-hungry passes quadratic (nhwc_layout took 100-150 ms on ResNet-50, Note [Build
  // phases]). Usually the hint itself is free and one scan answers.
  const auto used = [this](const std::string& name) {
    if (initializers.count(name) != 0 || types.count(name) != 0) return true;
    if (std::find(inputs.begin(), inputs.end(), name) != inputs.end()) return true;
    for (const Node& n : nodes) {
      if (std::find(n.outputs.begin(), n.outputs.end(), name) != n.outputs.end()) return true;
      if (std::find(n.inputs.begin(), n.inputs.end(), name) != n.inputs.end()) return true;
    }
    return false;
  };
  std::string candidate = hint;
  for (int k = 1; used(candidate); ++k) candidate = hint + "_" + std::to_string(k);
  return candidate;
}

std::string Graph::str() const {
  std::ostringstream os;
  os << "graph '" << name << "' inputs(";
  for (std::size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << inputs[i];
  os << ") outputs(";
  for (std::size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : "") << outputs[i];
  os << ") " << initializers.size() << " initializers\n";
  for (const Node& n : nodes) os << "  " << n.str() << "\n";
  return os.str();
}

}  // namespace xpuruntime
