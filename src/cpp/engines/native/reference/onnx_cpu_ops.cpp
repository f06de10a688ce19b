// The ONNX reference op library: context helpers, the registry and run_node (see onnx_cpu_ops.h).
#include "engines/native/reference/onnx_cpu_ops.h"

#include "engines/native/passes/passes.h"
#include "xpuruntime/run_options.h"

#include <algorithm>
#include <set>
#include <unordered_map>

namespace xpuruntime::onnx_ref {

const Tensor& OpContext::input(std::size_t i) const {
  const Value& v = value(i);
  XPURT_CHECK_TYPE(v.is_tensor(), where(), ": input ", i, " ('", input_name(i), "') must be a tensor, got ", v.str());
  return v.tensor();
}

const Value& OpContext::value(std::size_t i) const {
  XPURT_CHECK(has_input(i), where(), ": input ", i, " is required but was not given");
  return inputs_[i];
}

const std::vector<Tensor>& OpContext::sequence(std::size_t i) const {
  const Value& v = value(i);
  XPURT_CHECK_TYPE(v.is_sequence(), where(), ": input ", i, " ('", input_name(i), "') must be a sequence, got ",
                   v.str());
  return v.elements();
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
  value_outputs_[i] = Value();
}

void OpContext::set_output(std::size_t i, Value value) {
  XPURT_INTERNAL_ASSERT(i < outputs_.size(), where(), ": output ", i, " out of range");
  if (value.is_tensor()) {
    set_output(i, value.tensor());
    return;
  }
  outputs_[i] = Tensor();
  value_outputs_[i] = std::move(value);
}

std::vector<Value> OpContext::take_outputs() {
  std::vector<Value> out(outputs_.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = value_outputs_[i].defined() ? std::move(value_outputs_[i]) : Value(std::move(outputs_[i]));
  }
  return out;
}

bool OpContext::has_attr(const std::string& name) const {
  return node_.attrs.has(name) || node_.tensor_attrs.count(name) != 0 ||
         node_.string_list_attrs.count(name) != 0 || node_.graph_attrs.count(name) != 0 ||
         node_.type_attrs.count(name) != 0;
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
    register_sequence_ops(*lib);
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

namespace {

// A CPU tensor, contiguous (a copy when it is not).
Tensor prepare_tensor(const Tensor& t, const Node& node, std::size_t input) {
  XPURT_INTERNAL_ASSERT(t.device().is_cpu(), "run_node takes CPU values (input ", input, " of ", node.name, ")");
  return t.contiguous();
}

// `v` with every tensor in it contiguous on the CPU (shared when it already is).
Value prepare_value(const Value& v, const Node& node, std::size_t input) {
  if (!v.defined()) return v;
  switch (v.kind()) {
    case ValueKind::kTensor: return prepare_tensor(v.tensor(), node, input);
    case ValueKind::kSequence: {
      const auto& elements = v.elements();
      bool ready = true;
      for (const Tensor& t : elements) {
        XPURT_INTERNAL_ASSERT(t.device().is_cpu(), "run_node takes CPU values (input ", input, " of ", node.name, ")");
        ready = ready && t.is_contiguous();
      }
      if (ready) return v;
      std::vector<Tensor> prepared;
      prepared.reserve(elements.size());
      for (const Tensor& t : elements) prepared.push_back(prepare_tensor(t, node, input));
      return Value::sequence(std::move(prepared), v.element_dtype());
    }
    case ValueKind::kOptional:
      return v.has_element() ? Value::optional(prepare_value(v.element(), node, input)) : v;
  }
  return v;
}

}  // namespace

Value conform_value(const Value& value, const ValueType* declared) {
  if (declared == nullptr || declared->kind != ValueKind::kOptional || !value.defined() || value.is_optional()) {
    return value;
  }
  return Value::optional(value);
}

std::vector<Value> run_node_values(const Node& node, std::int64_t opset, const std::vector<Value>& inputs,
                                   const ValueLookup& outer) {
  const OpFn* fn = Library::global().find(node.domain, node.op_type);
  if (fn == nullptr) {
    throw UnsupportedOperationError(detail::str_cat(
        "no CPU implementation of the ONNX op ", node.domain.empty() ? "" : node.domain + ":", node.op_type,
        " (node '", node.name, "')"));
  }
  std::vector<Value> prepared;
  prepared.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) prepared.push_back(prepare_value(inputs[i], node, i));
  OpContext ctx(node, opset, std::move(prepared));
  if (outer) ctx.set_outer(outer);
  (*fn)(ctx);
  return ctx.take_outputs();
}

std::vector<Tensor> run_node(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs,
                             const ValueLookup& outer) {
  const std::vector<Value> values(inputs.begin(), inputs.end());
  std::vector<Value> outputs = run_node_values(node, opset, values, outer);
  std::vector<Tensor> tensors;
  tensors.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    XPURT_CHECK_TYPE(!outputs[i].defined() || outputs[i].is_tensor(), node.op_type, " '", node.name, "': output ", i,
                     " is ", outputs[i].str(), ", not a tensor (run the node with run_node_values)");
    tensors.push_back(outputs[i].defined() ? outputs[i].tensor() : Tensor());
  }
  return tensors;
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
