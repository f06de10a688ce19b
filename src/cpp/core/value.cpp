// Value: tensors, sequences and optionals (see value.h).
#include "xpuruntime/value.h"

#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

const char* value_kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kTensor: return "tensor";
    case ValueKind::kSequence: return "sequence";
    case ValueKind::kOptional: return "optional";
  }
  return "?";
}

Value::Value(Tensor tensor) : kind_set_(tensor.defined()), kind_(ValueKind::kTensor), tensor_(std::move(tensor)) {}

Value Value::sequence(std::vector<Tensor> elements, DType dtype) {
  for (std::size_t i = 0; i < elements.size(); ++i) {
    XPURT_CHECK(elements[i].defined(), "sequence element ", i, " is an undefined tensor");
    XPURT_CHECK_TYPE(elements[i].dtype() == dtype, "a sequence of ", dtype_name(dtype), " tensors cannot hold element ",
                     i, " of dtype ", dtype_name(elements[i].dtype()), " (every element has the sequence's type)");
  }
  Value v;
  v.kind_set_ = true;
  v.kind_ = ValueKind::kSequence;
  v.elements_ = std::move(elements);
  v.element_dtype_ = dtype;
  return v;
}

Value Value::optional(Value element) {
  XPURT_CHECK_TYPE(element.defined(), "Value::optional needs a tensor or a sequence; use Value::none() for an empty "
                   "optional");
  XPURT_CHECK_TYPE(!element.is_optional(), "an optional cannot hold an optional (", element.str(), ")");
  Value v;
  v.kind_set_ = true;
  v.kind_ = ValueKind::kOptional;
  v.inner_ = std::make_shared<const Value>(std::move(element));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_set_ = true;
  v.kind_ = ValueKind::kOptional;
  return v;
}

ValueKind Value::kind() const {
  XPURT_CHECK(kind_set_, "the value is undefined");
  return kind_;
}

const Tensor& Value::tensor() const {
  XPURT_CHECK_TYPE(is_tensor(), "expected a tensor, got ", str());
  return tensor_;
}

const std::vector<Tensor>& Value::elements() const {
  XPURT_CHECK_TYPE(is_sequence(), "expected a sequence, got ", str());
  return elements_;
}

DType Value::element_dtype() const {
  XPURT_CHECK_TYPE(is_sequence(), "expected a sequence, got ", str());
  return element_dtype_;
}

bool Value::has_element() const {
  XPURT_CHECK_TYPE(is_optional(), "expected an optional, got ", str());
  return inner_ != nullptr;
}

const Value& Value::element() const {
  XPURT_CHECK_TYPE(is_optional(), "expected an optional, got ", str());
  XPURT_CHECK(inner_ != nullptr, "the optional is empty (None): it holds no element");
  return *inner_;
}

std::string Value::type() const {
  if (!kind_set_) return "undefined";
  switch (kind_) {
    case ValueKind::kTensor: return detail::str_cat("tensor(", dtype_name(tensor_.dtype()), ")");
    case ValueKind::kSequence: return detail::str_cat("seq(tensor(", dtype_name(element_dtype_), "))");
    case ValueKind::kOptional: return inner_ ? "optional(" + inner_->type() + ")" : "optional";
  }
  return "?";
}

std::string Value::str() const {
  if (!kind_set_) return "an undefined value";
  switch (kind_) {
    case ValueKind::kTensor:
      return detail::str_cat("a ", dtype_name(tensor_.dtype()), " tensor of shape ",
                             detail::shape_str(tensor_.shape()));
    case ValueKind::kSequence:
      return detail::str_cat("a sequence of ", elements_.size(), " ", dtype_name(element_dtype_), " tensor",
                             elements_.size() == 1 ? "" : "s");
    case ValueKind::kOptional:
      return inner_ ? "an optional holding " + inner_->str() : std::string("an empty optional (None)");
  }
  return "?";
}

}  // namespace xpuruntime
