// Value: one value that flows through a model: a tensor, a sequence of tensors, or an optional (holding a tensor,
// a sequence, or nothing). These are the ONNX value kinds xpuruntime runs (TypeProto's tensor_type, sequence_type
// and optional_type; maps and sparse tensors are not). InferenceSession::run_values feeds and returns them, as
// ONNX Runtime's C++ API does with Ort::Value.
//
//   Value x = tensor;                                    // a tensor (implicit)
//   Value s = Value::sequence({a, b}, DType::kFloat32);  // seq(tensor(float32)): two tensors, maybe of other shapes
//   Value o = Value::optional(s);                        // optional(seq(tensor(float32))) holding s
//   Value n = Value::none();                             // an empty optional
//   for (const Tensor& t : s.elements()) ...
//
// Note [Sequence and optional values]
// A sequence holds tensors of one element type (ONNX seq(tensor(T))); its tensors may differ in shape, and an
// empty sequence still has an element type (SequenceEmpty's dtype; what an empty list fed from Python gets from the
// model's declared type). An optional holds a tensor or a sequence, or nothing; optionals of optionals do not
// exist in ONNX and are refused. The native engine runs these values on the CPU, through the ONNX reference
// library (docs/native_engine.md, "Sequences and optionals"); the values are immutable: sequence ops make new
// sequences that share the tensors of their inputs.
//
// Ownership: a Value shares its tensors (Tensor handles share storage), so copying a Value never copies bytes.
// Thread-safety: const methods are safe from any thread; a Value is never modified after it is made.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/dtype.h"
#include "xpuruntime/export.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {

// The kind of a value (or of what an optional holds).
enum class ValueKind : std::uint8_t {
  kTensor,    // a tensor
  kSequence,  // a sequence of tensors of one element type
  kOptional,  // a tensor, a sequence, or nothing
};

// "tensor", "sequence", "optional".
XPURT_API const char* value_kind_name(ValueKind kind);

class XPURT_API Value {
 public:
  Value() = default;  // undefined (an absent input): defined() is false
  // A tensor value (undefined when `tensor` is).
  Value(Tensor tensor);  // NOLINT(google-explicit-constructor): a tensor is a value
  // A sequence of `elements`, each of element type `dtype` (InvalidTypeError naming the element otherwise;
  // InvalidArgumentError for an undefined element).
  static Value sequence(std::vector<Tensor> elements, DType dtype);
  // An optional holding `element`, a tensor or a sequence (InvalidTypeError for an optional or undefined value).
  static Value optional(Value element);
  // An empty optional.
  static Value none();

  bool defined() const { return kind_set_; }
  // The kind; InvalidArgumentError for an undefined value.
  ValueKind kind() const;
  bool is_tensor() const { return kind_set_ && kind_ == ValueKind::kTensor; }
  bool is_sequence() const { return kind_set_ && kind_ == ValueKind::kSequence; }
  bool is_optional() const { return kind_set_ && kind_ == ValueKind::kOptional; }

  // The tensor of a tensor value; InvalidTypeError for other kinds.
  const Tensor& tensor() const;
  // The tensors of a sequence, in order; InvalidTypeError for other kinds.
  const std::vector<Tensor>& elements() const;
  // The element type of a sequence; InvalidTypeError for other kinds.
  DType element_dtype() const;
  // Whether an optional holds a value; InvalidTypeError for other kinds.
  bool has_element() const;
  // What an optional holds (a tensor or sequence value); InvalidTypeError for other kinds, InvalidArgumentError
  // when it is empty.
  const Value& element() const;

  // ONNX-style type: "tensor(float32)", "seq(tensor(int64))", "optional(seq(tensor(float32)))", "optional" for
  // an empty optional, "undefined".
  std::string type() const;
  // For messages: "a float32 tensor of shape [2, 3]", "a sequence of 2 float32 tensors", "an empty optional (None)".
  std::string str() const;

 private:
  bool kind_set_ = false;
  ValueKind kind_ = ValueKind::kTensor;
  Tensor tensor_;                       // kTensor
  std::vector<Tensor> elements_;        // kSequence
  DType element_dtype_ = DType::kFloat32;  // kSequence
  std::shared_ptr<const Value> inner_;  // kOptional: what it holds, null when empty
};

}  // namespace xpuruntime
