// The cpu backend's ONNX reference implementations as node kernels: OpContext, the registrar and the registration
// of every source file of backends/cpu/onnx/ (see onnx_kernels.h).
#include "backends/cpu/onnx/onnx_kernels.h"

#include <utility>

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
  if (i < destinations_.size() && usable_destination(destinations_[i], shape, dtype)) {
    outputs_[i] = destinations_[i];
  } else {
    outputs_[i] = Tensor::empty(shape, dtype, Device::cpu());
  }
  return outputs_[i];
}

bool OpContext::usable_destination(const Tensor& into, const std::vector<std::int64_t>& shape, DType dtype) const {
  if (!into.defined() || into.dtype() != dtype || into.shape() != shape || !into.is_contiguous() ||
      into.device().type != DeviceType::kCPU || into.nbytes() == 0) {
    return false;
  }
  const auto* begin = static_cast<const char*>(into.data_ptr());
  const char* end = begin + into.nbytes();
  const auto overlaps = [&](const Tensor& t) {
    if (!t.defined() || t.nbytes() == 0) return false;
    const auto* b = static_cast<const char*>(t.data_ptr());
    return b < end && begin < b + t.nbytes();
  };
  for (const Value& v : inputs_) {
    if (!v.defined()) continue;
    if (!v.is_tensor()) return false;  // sequences and optionals: new outputs (no destination is asked for them)
    if (overlaps(v.tensor())) return false;
  }
  return true;
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

void NodeKernelRegistrar::add(const std::string& domain, const std::string& op_type, OpFn fn) {
  NodeKernelInfo info;
  info.domain = domain;
  info.op_type = op_type;
  const auto run = [fn = std::move(fn)](const Node& node, std::int64_t opset, const std::vector<Value>& inputs,
                                        const ValueLookup& outer, const std::vector<Tensor>& into) {
    std::vector<Value> prepared;
    prepared.reserve(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) prepared.push_back(prepare_value(inputs[i], node, i));
    OpContext ctx(node, opset, std::move(prepared));
    if (outer) ctx.set_outer(outer);
    ctx.set_destinations(into);
    fn(ctx);
    return ctx.take_outputs();
  };
  info.run = [run](const Node& node, std::int64_t opset, const std::vector<Value>& inputs, const ValueLookup& outer) {
    return run(node, opset, inputs, outer, {});
  };
  info.run_into = [run](const Node& node, std::int64_t opset, const std::vector<Value>& inputs,
                        const std::vector<Tensor>& into) { return run(node, opset, inputs, ValueLookup(), into); };
  registry_.add_node_kernel(std::move(info));
}

void register_onnx_node_kernels(KernelRegistry& registry) {
  NodeKernelRegistrar kernels(registry);
  register_elementwise_ops(kernels);
  register_tensor_ops(kernels);
  register_nn_ops(kernels);
  register_misc_ops(kernels);
  register_control_flow_ops(kernels);
  register_sequence_ops(kernels);
  register_fused_ops(kernels);  // com.xpuruntime nodes, for CPU runs the registry ops cannot take
  register_contrib_attention_ops(kernels);
}

}  // namespace xpuruntime::onnx_ref
