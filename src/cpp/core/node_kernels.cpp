// Running ONNX nodes through the KernelRegistry's node kernels (see node_kernels.h).
#include "core/node_kernels.h"

#include "xpuruntime/exceptions.h"
#include "xpuruntime/run_options.h"

#include <set>
#include <unordered_map>

namespace xpuruntime::onnx_ref {

Value conform_value(const Value& value, const ValueType* declared) {
  if (declared == nullptr || declared->kind != ValueKind::kOptional || !value.defined() || value.is_optional()) {
    return value;
  }
  return Value::optional(value);
}

namespace {

const NodeKernelInfo& node_kernel_of(const Node& node) {
  const NodeKernelInfo* kernel = KernelRegistry::global().find_node_kernel(node.domain, node.op_type);
  if (kernel == nullptr) {
    throw UnsupportedOperationError(detail::str_cat(
        "no CPU implementation of the ONNX op ", node.domain.empty() ? "" : node.domain + ":", node.op_type,
        " (node '", node.name, "')"));
  }
  return *kernel;
}

std::vector<Tensor> tensors_of(const Node& node, const std::vector<Value>& outputs) {
  std::vector<Tensor> tensors;
  tensors.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    XPURT_CHECK_TYPE(!outputs[i].defined() || outputs[i].is_tensor(), node.op_type, " '", node.name, "': output ", i,
                     " is ", outputs[i].str(), ", not a tensor (run the node with run_node_values)");
    tensors.push_back(outputs[i].defined() ? outputs[i].tensor() : Tensor());
  }
  return tensors;
}

}  // namespace

std::vector<Value> run_node_values(const Node& node, std::int64_t opset, const std::vector<Value>& inputs,
                                   const ValueLookup& outer) {
  return node_kernel_of(node).run(node, opset, inputs, outer);
}

bool has_node_kernel(const std::string& domain, const std::string& op_type) {
  return KernelRegistry::global().find_node_kernel(domain, op_type) != nullptr;
}

std::vector<Tensor> run_node(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs,
                             const ValueLookup& outer) {
  const std::vector<Value> values(inputs.begin(), inputs.end());
  return tensors_of(node, run_node_values(node, opset, values, outer));
}

std::vector<Tensor> run_node_into(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& into) {
  const NodeKernelInfo& kernel = node_kernel_of(node);
  const std::vector<Value> values(inputs.begin(), inputs.end());
  return tensors_of(node, kernel.run_into ? kernel.run_into(node, opset, values, into)
                                          : kernel.run(node, opset, values, ValueLookup()));
}

std::vector<Value> run_graph(const Graph& body, const std::vector<Value>& inputs, const ValueLookup& outer) {
  XPURT_CHECK(inputs.size() == body.inputs.size(), "subgraph '", body.name, "' takes ", body.inputs.size(),
              " inputs, got ", inputs.size());
  std::unordered_map<std::string, Value> scope;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    scope[body.inputs[i]] = conform_value(inputs[i], body.type(body.inputs[i]));
  }
  for (const auto& [name, t] : body.initializers) {
    if (scope.count(name) == 0) scope[name] = t;
  }
  ValueLookup lookup = [&](const std::string& name) -> Value {
    auto it = scope.find(name);
    if (it != scope.end()) return it->second;
    return outer ? outer(name) : Value();
  };
  for (std::size_t index = 0; index < body.nodes.size(); ++index) {
    const Node& node = body.nodes[index];
    check_run_stop("in subgraph '", body.name, "' before its node ", index + 1, " of ", body.nodes.size(), " ('",
                   node.name, "', ", node.op_type, ")");  // Note [Stopping a run] (run_options.h)
    std::vector<Value> node_inputs;
    node_inputs.reserve(node.inputs.size());
    for (const auto& in : node.inputs) {
      if (in.empty()) {
        node_inputs.emplace_back();
        continue;
      }
      Value v = lookup(in);
      XPURT_CHECK(v.defined(), "subgraph '", body.name, "': node '", node.name, "' reads '", in,
                  "', which is defined neither in the subgraph nor in an enclosing graph");
      node_inputs.push_back(std::move(v));
    }
    std::vector<Value> outs = run_node_values(node, body.opset(node.domain), node_inputs, lookup);
    for (std::size_t i = 0; i < node.outputs.size() && i < outs.size(); ++i) {
      if (!node.outputs[i].empty()) scope[node.outputs[i]] = outs[i];
    }
  }
  std::vector<Value> results;
  for (const auto& out : body.outputs) {
    Value v = lookup(out);
    XPURT_CHECK(v.defined(), "subgraph '", body.name, "': output '", out, "' was not computed");
    results.push_back(conform_value(v, body.type(out)));
  }
  return results;
}

namespace {

void collect_outer_names(const Graph& g, std::set<std::string> defined, std::set<std::string>& free) {
  defined.insert(g.inputs.begin(), g.inputs.end());
  for (const auto& [name, t] : g.initializers) defined.insert(name);
  for (const Node& n : g.nodes) {
    for (const auto& in : n.inputs) {
      if (!in.empty() && defined.count(in) == 0) free.insert(in);
    }
    for (const auto& [attr, sub] : n.graph_attrs) {
      if (sub) collect_outer_names(*sub, defined, free);
    }
    defined.insert(n.outputs.begin(), n.outputs.end());
  }
  for (const auto& out : g.outputs) {
    if (defined.count(out) == 0) free.insert(out);
  }
}

}  // namespace

std::vector<std::string> outer_names(const Graph& body) {
  std::set<std::string> free;
  collect_outer_names(body, {}, free);
  return {free.begin(), free.end()};
}

}  // namespace xpuruntime::onnx_ref
