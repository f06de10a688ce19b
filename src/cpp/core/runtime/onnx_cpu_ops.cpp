// The ONNX reference op library: context helpers, the registry and run_node (see onnx_cpu_ops.h).
#include "core/runtime/onnx_cpu_ops.h"

#include "core/runtime/passes.h"

#include <algorithm>

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

std::vector<Tensor> run_node(const Node& node, std::int64_t opset, const std::vector<Tensor>& inputs) {
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
  (*fn)(ctx);
  return std::move(ctx.outputs());
}

}  // namespace xpuruntime::onnx_ref
