// OpDescriptor, TensorDesc and Attributes.
#include "xpuruntime/op_descriptor.h"

#include <charconv>
#include <cstdint>
#include <string>

#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {

namespace {

std::string format_double(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

const char* attr_type_name(const AttrValue& value) {
  switch (value.index()) {
    case 0: return "int";
    case 1: return "float";
    case 2: return "string";
    case 3: return "list of ints";
    default: return "list of floats";
  }
}

std::string attr_str(const AttrValue& value) {
  std::string out;
  if (const auto* i = std::get_if<std::int64_t>(&value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) return format_double(*d);
  if (const auto* s = std::get_if<std::string>(&value)) return "\"" + *s + "\"";
  out = "[";
  if (const auto* ints = std::get_if<std::vector<std::int64_t>>(&value)) {
    for (std::size_t k = 0; k < ints->size(); ++k) out += (k ? "," : "") + std::to_string((*ints)[k]);
  } else {
    const auto& floats = std::get<std::vector<double>>(value);
    for (std::size_t k = 0; k < floats.size(); ++k) out += (k ? "," : "") + format_double(floats[k]);
  }
  return out + "]";
}

template <typename T>
const T* typed_attr(const std::map<std::string, AttrValue>& values, const std::string& name, const char* expected) {
  const auto it = values.find(name);
  if (it == values.end()) return nullptr;
  const T* value = std::get_if<T>(&it->second);
  if (value == nullptr) {
    throw InvalidTypeError(detail::str_cat("attribute '", name, "' must be ", expected, ", got ",
                                           attr_type_name(it->second), " ", attr_str(it->second)));
  }
  return value;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? "," : "") + std::to_string(shape[k]);
  return out + "]";
}

}  // namespace

TensorDesc TensorDesc::of(const Tensor& tensor) {
  TensorDesc desc;
  if (!tensor.defined()) return desc;
  desc.present = true;
  desc.dtype = tensor.dtype();
  desc.shape = tensor.shape();
  desc.strides = tensor.strides();
  desc.device = tensor.device();
  desc.alignment = alignment_of(tensor.data_ptr());
  return desc;
}

std::uint32_t TensorDesc::alignment_of(const void* data) {
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

TensorDesc TensorDesc::contiguous(const std::vector<std::int64_t>& shape, DType dtype, Device device,
                                 std::uint32_t alignment) {
  TensorDesc desc;
  desc.present = true;
  desc.dtype = dtype;
  desc.shape = shape;
  desc.strides = contiguous_strides(shape);
  desc.device = device;
  desc.alignment = alignment;
  return desc;
}

std::int64_t TensorDesc::numel() const {
  // A declared shape may be anything a model says ([7, 2^63 - 1], found by the structural fuzzer): the product is
  // checked, and a shape with a 0 has no elements whatever its other dims.
  for (const auto d : shape) {
    if (d == 0) return 0;
  }
  std::int64_t n = 1;
  for (const auto d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      throw InvalidArgumentError("a tensor of shape " + detail::shape_str(shape) + " has more than 2^63 - 1 elements");
    }
  }
  return n;
}

bool TensorDesc::is_contiguous() const {
  if (strides.empty() || numel() == 0) return true;  // no elements: any strides describe the same (empty) layout
  std::int64_t expected = 1;
  for (int k = dim() - 1; k >= 0; --k) {
    if (shape[k] != 1 && strides[k] != expected) return false;
    expected *= shape[k];
  }
  return true;
}

std::string TensorDesc::str() const {
  if (!present) return "none";
  std::string out = std::string(dtype_name(dtype)) + shape_str(shape);
  if (!is_contiguous()) out += ":strides" + shape_str(strides);
  return out;
}

Attributes& Attributes::set(const std::string& name, AttrValue value) {
  values_[name] = std::move(value);
  return *this;
}

std::int64_t Attributes::get_int(const std::string& name, std::int64_t default_value) const {
  const auto* value = typed_attr<std::int64_t>(values_, name, "an int");
  return value ? *value : default_value;
}

double Attributes::get_float(const std::string& name, double default_value) const {
  const auto it = values_.find(name);
  if (it != values_.end()) {
    if (const auto* i = std::get_if<std::int64_t>(&it->second)) return static_cast<double>(*i);
  }
  const auto* value = typed_attr<double>(values_, name, "a float");
  return value ? *value : default_value;
}

std::string Attributes::get_string(const std::string& name, const std::string& default_value) const {
  const auto* value = typed_attr<std::string>(values_, name, "a string");
  return value ? *value : default_value;
}

std::vector<std::int64_t> Attributes::get_ints(const std::string& name,
                                               const std::vector<std::int64_t>& default_value) const {
  const auto* value = typed_attr<std::vector<std::int64_t>>(values_, name, "a list of ints");
  return value ? *value : default_value;
}

std::vector<double> Attributes::get_floats(const std::string& name, const std::vector<double>& default_value) const {
  const auto it = values_.find(name);
  if (it != values_.end()) {
    if (const auto* ints = std::get_if<std::vector<std::int64_t>>(&it->second)) {
      return std::vector<double>(ints->begin(), ints->end());
    }
  }
  const auto* value = typed_attr<std::vector<double>>(values_, name, "a list of floats");
  return value ? *value : default_value;
}

std::string Attributes::str() const {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : values_) {
    out += (first ? "" : ",") + name + "=" + attr_str(value);
    first = false;
  }
  return out + "}";
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFP32: return "fp32";
    case Precision::kTF32: return "tf32";
    case Precision::kFP16: return "fp16";
    case Precision::kBF16: return "bf16";
    case Precision::kInt8: return "int8";
    case Precision::kFP8: return "fp8";
    case Precision::kInt4Weights: return "int4-weights";
  }
  return "fp32";
}

std::string OpDescriptor::signature() const {
  // Runs on every dispatch (it keys the plan cache): one buffer, integers appended in place.
  std::string out;
  out.reserve(96);
  const auto append_int = [&out](std::int64_t value) {
    char buffer[24];
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
    out.append(buffer, result.ptr);
  };
  const auto append_list = [&](const std::vector<std::int64_t>& values) {
    out += '[';
    for (std::size_t k = 0; k < values.size(); ++k) {
      if (k) out += ',';
      append_int(values[k]);
    }
    out += ']';
  };
  out += op;
  out += '(';
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const TensorDesc& input = inputs[k];
    if (k) out += ',';
    if (!input.present) {
      out += "none";
      continue;
    }
    out += dtype_name(input.dtype);
    append_list(input.shape);
    if (!input.is_contiguous()) {
      out += ":strides";
      append_list(input.strides);
    }
    if (input.alignment < 16) {
      out += "@a";
      append_int(input.alignment);
    }
  }
  out += ')';
  out += attrs.values().empty() ? std::string("{}") : attrs.str();
  out += ' ';
  out += device.str();
  if (compute_capability > 0) {
    out += " sm";
    append_int(compute_capability);
  }
  out += ' ';
  out += precision_name(precision);
  if (deterministic) out += " deterministic";
  return out;
}

}  // namespace xpuruntime
