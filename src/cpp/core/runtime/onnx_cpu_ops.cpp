// The ONNX reference op library: context helpers, the registry and run_node (see onnx_cpu_ops.h).
#include "core/runtime/onnx_cpu_ops.h"

#include "core/runtime/passes.h"

#include <algorithm>
#include <set>
#include <unordered_map>

namespace xpuruntime::onnx_ref {

const Tensor& OpContext::input(std::size_t i) const {
  XPURT_CHECK(has_input(i), where(), ": input ", i, " is required but was not given");
  return inputs_[i];
}

Tensor& OpContext::allocate_output(std::size_t i, const std::vector<std::int64_t>& shape, DType dtype) {
  XPURT_INTERNAL_ASSERT(i < outputs_.size(), where(), ": output ", i, " out of range");
  for (std::int64_t d : shape) {
    XPURT_CHECK(d >= 0, where(), ": output ", i, " would have a negative dimension (", d, ")");
  }
  outputs_[i] = Tensor::empty(shape, dtype, Device::cpu());
  return outputs_[i];
}

void OpContext::set_output(std::size_t i, Tensor tensor) {
  XPURT_INTERNAL_ASSERT(i < outputs_.size(), where(), ": output ", i, " out of range");
  outputs_[i] = std::move(tensor);
}

bool OpContext::has_attr(const std::string& name) const {
  return node_.attrs.has(name) || node_.tensor_attrs.count(name) != 0 ||
         node_.string_list_attrs.count(name) != 0 || node_.graph_attrs.count(name) != 0;
}

const Tensor* OpContext::attr_tensor(const std::string& name) const {
  auto it = node_.tensor_attrs.find(name);
  return it == node_.tensor_attrs.end() ? nullptr : &it->second;
}

std::string OpContext::where() const {
  return detail::str_cat(node_.op_type, " '", node_.name, "'");
}

Library& Library::global() {
  static Library* library = [] {
    auto* lib = new Library();
    register_elementwise_ops(*lib);
    register_tensor_ops(*lib);
    register_nn_ops(*lib);
    register_misc_ops(*lib);
    register_control_flow_ops(*lib);
    passes::register_fused_ops(*lib);  // com.xpuruntime nodes, for CPU runs the registry cannot take
    return lib;
  }();
  return *library;
}

void Library::add(const std::string& domain, const std::string& op_type, OpFn fn) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  XPURT_INTERNAL_ASSERT(ops_.count({d, op_type}) == 0, "ONNX op registered twice: ", op_type);
  ops_[{d, op_type}] = std::move(fn);
}

const OpFn* Library::find(const std::string& domain, const std::string& op_type) const {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  auto it = ops_.find({d, op_type});
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<std::string> Library::ops() const {
  std::vector<std::string> names;
  for (const auto& [key, fn] : ops_) names.push_back(key.first.empty() ? key.second : key.first + ":" + key.second);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<Tensor> run_node(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs,
                             const ValueLookup& outer) {
  const OpFn* fn = Library::global().find(node.domain, node.op_type);
  if (fn == nullptr) {
    throw UnsupportedOperationError(detail::str_cat(
        "no CPU implementation of the ONNX op ", node.domain.empty() ? "" : node.domain + ":", node.op_type,
        " (node '", node.name, "')"));
  }
  std::vector<Tensor> prepared;
  prepared.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) {
      prepared.emplace_back();
      continue;
    }
    XPURT_INTERNAL_ASSERT(t.device().is_cpu(), "run_node takes CPU tensors (input ", i, " of ", node.name, ")");
    prepared.push_back(t.contiguous());
  }
  OpContext ctx(node, opset, std::move(prepared));
  if (outer) ctx.set_outer(outer);
  (*fn)(ctx);
  return std::move(ctx.outputs());
}

std::vector<Tensor> run_graph(const Graph& body, const std::vector<Tensor>& inputs, const ValueLookup& outer) {
  XPURT_CHECK(inputs.size() == body.inputs.size(), "subgraph '", body.name, "' takes ", body.inputs.size(),
              " inputs, got ", inputs.size());
  std::unordered_map<std::string, Tensor> scope;
  for (std::size_t i = 0; i < inputs.size(); ++i) scope[body.inputs[i]] = inputs[i];
  for (const auto& [name, t] : body.initializers) {
    if (scope.count(name) == 0) scope[name] = t;
  }
  ValueLookup lookup = [&](const std::string& name) -> Tensor {
    auto it = scope.find(name);
    if (it != scope.end()) return it->second;
    return outer ? outer(name) : Tensor();
  };
  for (const Node& node : body.nodes) {
    std::vector<Tensor> node_inputs;
    node_inputs.reserve(node.inputs.size());
    for (const auto& in : node.inputs) {
      if (in.empty()) {
        node_inputs.emplace_back();
        continue;
      }
      Tensor t = lookup(in);
      XPURT_CHECK(t.defined(), "subgraph '", body.name, "': node '", node.name, "' reads '", in,
                  "', which is defined neither in the subgraph nor in an enclosing graph");
      node_inputs.push_back(std::move(t));
    }
    std::vector<Tensor> outs = run_node(node, body.opset(node.domain), node_inputs, lookup);
    for (std::size_t i = 0; i < node.outputs.size() && i < outs.size(); ++i) {
      if (!node.outputs[i].empty()) scope[node.outputs[i]] = outs[i];
    }
  }
  std::vector<Tensor> results;
  for (const auto& out : body.outputs) {
    Tensor t = lookup(out);
    XPURT_CHECK(t.defined(), "subgraph '", body.name, "': output '", out, "' was not computed");
    results.push_back(std::move(t));
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
