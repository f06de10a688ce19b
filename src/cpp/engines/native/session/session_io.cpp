// A native session's inputs and outputs by name (see session_io.h).
#include "engines/native/session/session_io.h"

#include <algorithm>

#include "core/policy_serialization.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::runtime {

std::string shape_key(const Shapes& shapes) {
  std::string key;
  for (const auto& s : shapes) {
    key += "[";
    for (std::size_t i = 0; i < s.size(); ++i) key += (i ? "," : "") + std::to_string(s[i]);
    key += "]";
  }
  return key;
}

ValueInfo value_info(const Graph& g, const std::string& name) {
  ValueInfo info;
  info.name = name;
  if (const ValueType* vt = g.type(name)) {
    info.kind = vt->kind;
    info.element_kind = vt->element_kind;
    info.dtype = vt->dtype;
    if (vt->has_shape) {
      for (const Dim& d : vt->shape) info.shape.push_back(d.str());
    }
  }
  return info;
}

namespace {

// The position of input `name` among the model's inputs; InvalidArgumentError naming them when it is none.
std::size_t input_index(const Graph& g, const std::string& name) {
  auto it = std::find(g.inputs.begin(), g.inputs.end(), name);
  if (it == g.inputs.end()) {
    throw InvalidArgumentError(
        detail::str_cat("unknown input '", name, "'; the model's inputs are: ", detail::join_names(g.inputs)));
  }
  return static_cast<std::size_t>(it - g.inputs.begin());
}

}  // namespace

std::vector<Tensor> order_feeds(const Graph& g, const std::vector<std::pair<std::string, Tensor>>& feeds) {
  std::vector<Tensor> ordered(g.inputs.size());
  for (const auto& [name, tensor] : feeds) ordered[input_index(g, name)] = tensor;
  return ordered;
}

Shapes feed_shapes(const Graph& g, const std::vector<ValueInfo>& inputs, const std::vector<Tensor>& ordered) {
  Shapes shapes;
  for (std::size_t i = 0; i < ordered.size(); ++i) {
    XPURT_CHECK(ordered[i].defined(), "missing input '", g.inputs[i], "' (expected ", inputs[i].str(), ")");
    const ValueType* vt = g.type(g.inputs[i]);
    if (vt) {
      XPURT_CHECK_TYPE(ordered[i].dtype() == vt->dtype, "input '", g.inputs[i], "' expects ", dtype_name(vt->dtype),
                       ", got ", dtype_name(ordered[i].dtype()));
    }
    shapes.push_back(ordered[i].shape());
  }
  return shapes;
}

std::pair<std::vector<Value>, Shapes> order_value_feeds(const Graph& g, const std::vector<ValueInfo>& inputs,
                                                        const std::vector<std::pair<std::string, Value>>& feeds) {
  std::vector<Value> ordered(g.inputs.size());
  for (const auto& [name, value] : feeds) {
    const std::size_t i = input_index(g, name);
    ordered[i] = conform_feed(name, g.type(name), value);
  }
  Shapes shapes;
  for (std::size_t i = 0; i < ordered.size(); ++i) {
    XPURT_CHECK(ordered[i].defined(), "missing input '", g.inputs[i], "' (expected ", inputs[i].str(), ")");
    shapes.push_back(ordered[i].is_tensor() ? ordered[i].tensor().shape() : std::vector<std::int64_t>{});
  }
  return {std::move(ordered), std::move(shapes)};
}

Value conform_feed(const std::string& name, const ValueType* vt, const Value& value) {
  if (!value.defined() || vt == nullptr) return value;
  auto to_cpu = [](const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); };
  auto mismatch = [&](const Value& got) {
    return InvalidTypeError(detail::str_cat("input '", name, "' expects ", vt->type_str(), ", got ", got.str()));
  };
  // `v` (a tensor or a sequence) as `type` (a tensor or sequence type) wants it.
  auto conform = [&](const Value& v, const ValueType& type) -> Value {
    if (type.kind == ValueKind::kTensor) {
      if (!v.is_tensor() || v.tensor().dtype() != type.dtype) throw mismatch(value);
      return v;  // the tensor path binds and checks it (GraphExec::bind_inputs)
    }
    if (!v.is_sequence() || v.element_dtype() != type.dtype) throw mismatch(value);
    std::vector<Tensor> elements;
    for (const Tensor& t : v.elements()) elements.push_back(to_cpu(t));
    return Value::sequence(std::move(elements), v.element_dtype());
  };
  if (vt->kind != ValueKind::kOptional) {
    if (value.is_optional()) throw mismatch(value);
    return conform(value, *vt);
  }
  const Value& inner = value.is_optional() ? (value.has_element() ? value.element() : value) : value;
  if (inner.is_optional()) return value;  // empty
  Value element = conform(inner, vt->element());
  return Value::optional(element.is_tensor() ? Value(to_cpu(element.tensor())) : element);
}

std::vector<int> output_indices(const Graph& g, const std::vector<std::string>& names) {
  std::vector<int> wanted;
  for (const auto& name : names) {
    auto it = std::find(g.outputs.begin(), g.outputs.end(), name);
    if (it == g.outputs.end()) {
      throw InvalidArgumentError(
          detail::str_cat("unknown output '", name, "'; the model's outputs are: ", detail::join_names(g.outputs)));
    }
    wanted.push_back(static_cast<int>(it - g.outputs.begin()));
  }
  return wanted;
}

Shapes probe_shapes(const Graph& g) {
  Shapes shapes;
  for (const auto& in : g.inputs) {
    const ValueType* vt = g.type(in);
    if (vt && !vt->is_tensor()) {
      shapes.emplace_back();  // a sequence or optional: no plan shape (CapturePlan::build)
      continue;
    }
    XPURT_CHECK(vt && vt->has_shape, "input '", in, "' has no declared shape; the native engine needs its rank");
    std::vector<std::int64_t> s;
    for (const Dim& d : vt->shape) s.push_back(d.known() ? d.value : 1);
    shapes.push_back(s);
  }
  return shapes;
}

}  // namespace xpuruntime::runtime
