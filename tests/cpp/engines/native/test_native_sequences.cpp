// Sequences and optionals (xpuruntime/value.h) in the native engine: the Value type; every sequence and optional
// op of the ONNX reference library (onnx_sequence.cpp) against hand-computed results and the ONNX spec's errors;
// Identity, If and Loop carrying them; ONNX import/export of sequence and optional types; InferenceSession::
// run_values from C++ on hand-built models, with the typed errors for feeds of the wrong kind. The ONNX backend
// node tests (scripts/run_onnx_node_tests.py) cover the same ops end to end from Python.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/onnx_import.h"
#include "xpuruntime/value.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using F = std::vector<float>;
using I = std::vector<std::int64_t>;

Tensor makef(const Shape& shape, const F& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) static_cast<float*>(t.data_ptr())[i] = values[i];
  return t;
}

Tensor makei(const Shape& shape, const I& values) {
  Tensor t = Tensor::empty(shape, DType::kInt64);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  for (std::size_t i = 0; i < values.size(); ++i) static_cast<std::int64_t*>(t.data_ptr())[i] = values[i];
  return t;
}

Tensor scalari(std::int64_t v) { return makei({}, {v}); }

Tensor scalarb(bool v) {
  Tensor t = Tensor::empty({}, DType::kBool);
  *static_cast<bool*>(t.data_ptr()) = v;
  return t;
}

F floats(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  const auto* p = static_cast<const float*>(t.data_ptr());
  return F(p, p + t.numel());
}

I ints(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kInt64);
  const auto* p = static_cast<const std::int64_t*>(t.data_ptr());
  return I(p, p + t.numel());
}

Value seqf(const std::vector<Tensor>& elements) { return Value::sequence(elements, DType::kFloat32); }

Node node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs) {
  Node n;
  n.op_type = op;
  n.name = op + "_node";
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

// Runs one node through the reference library; the node's input names are "i0", "i1", ... unless given.
std::vector<Value> run(const std::string& op, const std::vector<Value>& inputs, std::int64_t opset = 17,
                       const std::function<void(Node&)>& configure = {}, std::size_t num_outputs = 1) {
  std::vector<std::string> in_names, out_names;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    in_names.push_back(inputs[i].defined() ? "i" + std::to_string(i) : "");
  }
  for (std::size_t i = 0; i < num_outputs; ++i) out_names.push_back("o" + std::to_string(i));
  Node n = node(op, in_names, out_names);
  if (configure) configure(n);
  return onnx_ref::run_node_values(n, opset, inputs);
}

ValueType tensor_type(DType dtype, std::vector<Dim> shape = {}, bool has_shape = false) {
  ValueType vt;
  vt.dtype = dtype;
  vt.has_shape = has_shape || !shape.empty();
  vt.shape = std::move(shape);
  return vt;
}

// ---- Value ----

TEST(ValueType, KindsTypesAndErrors) {
  const Tensor a = makef({2}, {1, 2});
  const Value t = a;
  EXPECT_TRUE(t.is_tensor());
  EXPECT_EQ(t.type(), "tensor(float32)");
  EXPECT_FALSE(Value().defined());
  EXPECT_FALSE(Value(Tensor()).defined());

  const Value s = seqf({a, makef({3}, {1, 2, 3})});
  EXPECT_TRUE(s.is_sequence());
  EXPECT_EQ(s.elements().size(), 2u);
  EXPECT_EQ(s.element_dtype(), DType::kFloat32);
  EXPECT_EQ(s.type(), "seq(tensor(float32))");
  EXPECT_EQ(s.str(), "a sequence of 2 float32 tensors");
  EXPECT_EQ(s.elements()[0].data_ptr(), a.data_ptr());  // shared, not copied

  const Value empty = Value::sequence({}, DType::kInt64);
  EXPECT_EQ(empty.type(), "seq(tensor(int64))");
  EXPECT_TRUE(empty.elements().empty());

  const Value o = Value::optional(s);
  EXPECT_TRUE(o.is_optional());
  EXPECT_TRUE(o.has_element());
  EXPECT_EQ(o.type(), "optional(seq(tensor(float32)))");
  EXPECT_EQ(o.element().elements().size(), 2u);
  const Value none = Value::none();
  EXPECT_TRUE(none.defined());
  EXPECT_FALSE(none.has_element());
  EXPECT_EQ(none.str(), "an empty optional (None)");

  XPURT_EXPECT_THROW_WITH(Value::sequence({a, makei({1}, {1})}, DType::kFloat32), InvalidTypeError,
                          "element 1 of dtype int64");
  XPURT_EXPECT_THROW_WITH(Value::sequence({Tensor()}, DType::kFloat32), InvalidArgumentError, "undefined");
  XPURT_EXPECT_THROW_WITH(Value::optional(none), InvalidTypeError, "cannot hold an optional");
  XPURT_EXPECT_THROW_WITH(Value::optional(Value()), InvalidTypeError, "Value::none()");
  XPURT_EXPECT_THROW_WITH(none.element(), InvalidArgumentError, "empty");
  XPURT_EXPECT_THROW_WITH(s.tensor(), InvalidTypeError, "expected a tensor, got a sequence of 2");
  XPURT_EXPECT_THROW_WITH(t.elements(), InvalidTypeError, "expected a sequence");
  XPURT_EXPECT_THROW_WITH(t.has_element(), InvalidTypeError, "expected an optional");
}

TEST(ValueType, GraphValueTypes) {
  const ValueType element = tensor_type(DType::kFloat32, {Dim(3)});
  const ValueType seq = ValueType::sequence_of(element);
  EXPECT_EQ(seq.type_str(), "seq(tensor(float32))");
  EXPECT_EQ(seq.str(), "seq(float32[3])");
  EXPECT_FALSE(seq.fully_known());  // only tensors have a plan shape
  const ValueType opt = ValueType::optional_of(seq);
  EXPECT_EQ(opt.type_str(), "optional(seq(tensor(float32)))");
  EXPECT_EQ(opt.element().kind, ValueKind::kSequence);
  EXPECT_EQ(ValueType::optional_of(element).str(), "optional(float32[3])");
  EXPECT_TRUE(element.fully_known());
}

// ---- the sequence ops ----

TEST(SequenceOps, EmptyConstructLength) {
  auto empty = run("SequenceEmpty", {}, 11, [](Node& n) { n.attrs.set("dtype", std::int64_t{7}); });
  EXPECT_EQ(empty[0].type(), "seq(tensor(int64))");
  EXPECT_TRUE(empty[0].elements().empty());
  EXPECT_EQ(run("SequenceEmpty", {}, 11)[0].element_dtype(), DType::kFloat32);  // default dtype float

  auto seq = run("SequenceConstruct", {makef({2}, {1, 2}), makef({1}, {3})}, 11);
  ASSERT_TRUE(seq[0].is_sequence());
  EXPECT_EQ(floats(seq[0].elements()[1]), F({3}));
  EXPECT_EQ(ints(run("SequenceLength", {seq[0]}, 11)[0].tensor()), I({2}));
  EXPECT_EQ(run("SequenceLength", {seq[0]}, 11)[0].tensor().dim(), 0);
  EXPECT_EQ(ints(run("SequenceLength", {empty[0]}, 11)[0].tensor()), I({0}));

  XPURT_EXPECT_THROW_WITH(run("SequenceConstruct", {makef({1}, {1}), makei({1}, {1})}, 11), InvalidTypeError,
                          "input 1 is a int64 tensor");
  XPURT_EXPECT_THROW_WITH(run("SequenceLength", {makef({1}, {1})}, 11), InvalidTypeError, "must be a sequence");
  XPURT_EXPECT_THROW_WITH(run("SequenceEmpty", {}, 11, [](Node& n) { n.attrs.set("dtype", std::int64_t{8}); }),
                          InvalidTypeError, "string");
}

TEST(SequenceOps, InsertAtEraseWithPositions) {
  const Value seq = seqf({makef({1}, {1}), makef({1}, {2}), makef({1}, {3})});
  auto at = [&](const Value& s, std::int64_t p) { return floats(run("SequenceAt", {s, scalari(p)}, 11)[0].tensor()); };
  EXPECT_EQ(at(seq, 0), F({1}));
  EXPECT_EQ(at(seq, -1), F({3}));
  XPURT_EXPECT_THROW_WITH(at(seq, 3), InvalidArgumentError, "position 3 is out of range for a sequence of 3");
  XPURT_EXPECT_THROW_WITH(at(seq, -4), InvalidArgumentError, "valid: -3 to 2");

  // Insert: default at the back; a position in [-n, n]; one-element positions of shape [1] are taken too.
  const Tensor x = makef({2}, {9, 9});
  Value back = run("SequenceInsert", {seq, x}, 11)[0];
  ASSERT_EQ(back.elements().size(), 4u);
  EXPECT_EQ(back.elements()[3].data_ptr(), x.data_ptr());
  EXPECT_EQ(seq.elements().size(), 3u);  // the input sequence is not modified
  EXPECT_EQ(at(run("SequenceInsert", {seq, x, makei({1}, {0})}, 11)[0], 0), F({9, 9}));
  EXPECT_EQ(at(run("SequenceInsert", {seq, x, scalari(-1)}, 11)[0], 2), F({9, 9}));
  EXPECT_EQ(at(run("SequenceInsert", {seq, x, scalari(3)}, 11)[0], 3), F({9, 9}));
  XPURT_EXPECT_THROW_WITH(run("SequenceInsert", {seq, x, scalari(4)}, 11), InvalidArgumentError, "out of range");
  XPURT_EXPECT_THROW_WITH(run("SequenceInsert", {seq, makei({1}, {1})}, 11), InvalidTypeError,
                          "the inserted tensor is a int64 tensor but the sequence holds float32 tensors");
  XPURT_EXPECT_THROW_WITH(run("SequenceInsert", {seq, x, makef({}, {0})}, 11), InvalidTypeError, "int32 or int64");
  XPURT_EXPECT_THROW_WITH(run("SequenceInsert", {x, x}, 11), InvalidTypeError, "input 0 ('i0') must be a sequence");

  // Erase: default the last; a position in [-n, n - 1].
  Value erased = run("SequenceErase", {seq}, 11)[0];
  ASSERT_EQ(erased.elements().size(), 2u);
  EXPECT_EQ(at(erased, -1), F({2}));
  erased = run("SequenceErase", {seq, scalari(-3)}, 11)[0];
  EXPECT_EQ(at(erased, 0), F({2}));
  XPURT_EXPECT_THROW_WITH(run("SequenceErase", {Value::sequence({}, DType::kFloat32)}, 11), InvalidArgumentError,
                          "empty sequence");
  XPURT_EXPECT_THROW_WITH(run("SequenceErase", {seq, scalari(3)}, 11), InvalidArgumentError, "out of range");
}

TEST(SequenceOps, SplitToSequence) {
  const Tensor x = makef({3, 2}, {1, 2, 3, 4, 5, 6});
  // No split: one slice per index of the axis, kept as a dimension of 1 or removed (keepdims=0).
  auto parts = run("SplitToSequence", {x}, 11)[0].elements();
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].shape(), Shape({1, 2}));
  EXPECT_EQ(floats(parts[1]), F({3, 4}));
  parts = run("SplitToSequence", {x}, 11, [](Node& n) {
            n.attrs.set("axis", std::int64_t{1});
            n.attrs.set("keepdims", std::int64_t{0});
          })[0].elements();
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].shape(), Shape({3}));
  EXPECT_EQ(floats(parts[1]), F({2, 4, 6}));
  // A scalar split: chunks of that size, the last one shorter.
  parts = run("SplitToSequence", {x, scalari(2)}, 11)[0].elements();
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].shape(), Shape({2, 2}));
  EXPECT_EQ(floats(parts[1]), F({5, 6}));
  // A 1-D split: the lengths (keepdims is ignored).
  parts = run("SplitToSequence", {x, makei({3}, {0, 1, 2})}, 11, [](Node& n) {
            n.attrs.set("keepdims", std::int64_t{0});
          })[0].elements();
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), Shape({0, 2}));
  EXPECT_EQ(floats(parts[2]), F({3, 4, 5, 6}));
  XPURT_EXPECT_THROW_WITH(run("SplitToSequence", {x, makei({2}, {1, 1})}, 11), InvalidArgumentError,
                          "sum to 2 but axis 0 has 3");
  XPURT_EXPECT_THROW_WITH(run("SplitToSequence", {x, scalari(0)}, 11), InvalidArgumentError, "must be positive");
  XPURT_EXPECT_THROW_WITH(run("SplitToSequence", {makef({}, {1})}, 11), InvalidArgumentError, "scalar");
}

TEST(SequenceOps, ConcatFromSequence) {
  const Value seq = seqf({makef({1, 2}, {1, 2}), makef({2, 2}, {3, 4, 5, 6})});
  auto axis = [](std::int64_t a, std::int64_t new_axis) {
    return [a, new_axis](Node& n) {
      n.attrs.set("axis", a);
      n.attrs.set("new_axis", new_axis);
    };
  };
  Tensor y = run("ConcatFromSequence", {seq}, 11, axis(0, 0))[0].tensor();
  EXPECT_EQ(y.shape(), Shape({3, 2}));
  EXPECT_EQ(floats(y), F({1, 2, 3, 4, 5, 6}));
  const Value pair = seqf({makef({2}, {1, 2}), makef({2}, {3, 4})});
  y = run("ConcatFromSequence", {pair}, 11, axis(-1, 1))[0].tensor();  // stack on a new last axis
  EXPECT_EQ(y.shape(), Shape({2, 2}));
  EXPECT_EQ(floats(y), F({1, 3, 2, 4}));
  y = run("ConcatFromSequence", {pair}, 11, axis(0, 1))[0].tensor();
  EXPECT_EQ(floats(y), F({1, 2, 3, 4}));
  // SplitToSequence then ConcatFromSequence gives the tensor back.
  const Tensor x = makef({2, 3}, {1, 2, 3, 4, 5, 6});
  const Value split =
      run("SplitToSequence", {x, scalari(2)}, 11, [](Node& n) { n.attrs.set("axis", std::int64_t{1}); })[0];
  EXPECT_EQ(floats(run("ConcatFromSequence", {split}, 11, axis(1, 0))[0].tensor()), floats(x));

  XPURT_EXPECT_THROW_WITH(run("ConcatFromSequence", {seq}, 11, axis(1, 0)), InvalidArgumentError,
                          "must match outside the axis");
  XPURT_EXPECT_THROW_WITH(run("ConcatFromSequence", {seq}, 11, axis(0, 1)), InvalidArgumentError, "one shape");
  XPURT_EXPECT_THROW_WITH(run("ConcatFromSequence", {Value::sequence({}, DType::kFloat32)}, 11, axis(0, 0)),
                          InvalidArgumentError, "empty sequence");
  XPURT_EXPECT_THROW_WITH(run("ConcatFromSequence", {seq}, 11), InvalidArgumentError, "'axis' is required");
}

// SequenceMap's body: out = Add(a, b) (and Shape(a) as a second output when `shapes`).
std::shared_ptr<Graph> add_body(bool shapes) {
  auto body = std::make_shared<Graph>();
  body->name = "add_body";
  body->opsets[""] = 17;
  body->inputs = {"a", "b"};
  body->outputs = {"sum"};
  body->nodes.push_back(node("Add", {"a", "b"}, {"sum"}));
  if (shapes) {
    body->outputs.push_back("shape");
    body->nodes.push_back(node("Shape", {"a"}, {"shape"}));
  }
  return body;
}

TEST(SequenceOps, SequenceMap) {
  const Value xs = seqf({makef({2}, {1, 2}), makef({3}, {3, 4, 5})});
  // One sequence and one tensor (broadcast to every element).
  auto out = run("SequenceMap", {xs, makef({1}, {10})}, 17, [](Node& n) { n.graph_attrs["body"] = add_body(true); }, 2);
  ASSERT_EQ(out[0].elements().size(), 2u);
  EXPECT_EQ(floats(out[0].elements()[1]), F({13, 14, 15}));
  EXPECT_EQ(out[1].type(), "seq(tensor(int64))");
  EXPECT_EQ(ints(out[1].elements()[0]), I({2}));
  // Two sequences, element by element.
  const Value ys = seqf({makef({2}, {10, 20}), makef({1}, {1})});
  out = run("SequenceMap", {xs, ys}, 17, [](Node& n) { n.graph_attrs["body"] = add_body(false); });
  EXPECT_EQ(floats(out[0].elements()[0]), F({11, 22}));
  EXPECT_EQ(floats(out[0].elements()[1]), F({4, 5, 6}));
  // An empty sequence maps to an empty one.
  out = run("SequenceMap", {Value::sequence({}, DType::kFloat32), makef({1}, {1})}, 17,
            [](Node& n) { n.graph_attrs["body"] = add_body(false); });
  EXPECT_TRUE(out[0].elements().empty());

  XPURT_EXPECT_THROW_WITH(run("SequenceMap", {xs, seqf({makef({1}, {1})})}, 17,
                              [](Node& n) { n.graph_attrs["body"] = add_body(false); }),
                          InvalidArgumentError, "must have one length");
  XPURT_EXPECT_THROW_WITH(run("SequenceMap", {makef({1}, {1}), makef({1}, {1})}, 17,
                              [](Node& n) { n.graph_attrs["body"] = add_body(false); }),
                          InvalidTypeError, "must be a sequence");
  XPURT_EXPECT_THROW_WITH(run("SequenceMap", {xs}, 17, [](Node& n) { n.graph_attrs["body"] = add_body(false); }),
                          InvalidArgumentError, "the body takes 2 inputs, the node has 1");
}

TEST(OptionalOps, OptionalHasElementGetElement) {
  const Tensor x = makef({2}, {1, 2});
  // Optional: wraps its input; without one, an empty optional of the `type` attribute.
  Value o = run("Optional", {x}, 15)[0];
  EXPECT_EQ(o.type(), "optional(tensor(float32))");
  Value none = run("Optional", {}, 15, [](Node& n) {
                 n.type_attrs["type"] = ValueType::sequence_of(tensor_type(DType::kFloat32));
               })[0];
  EXPECT_TRUE(none.is_optional());
  EXPECT_FALSE(none.has_element());
  XPURT_EXPECT_THROW_WITH(run("Optional", {}, 15), InvalidArgumentError, "'type' attribute is required");
  XPURT_EXPECT_THROW_WITH(run("Optional", {x}, 15, [](Node& n) { n.type_attrs["type"] = tensor_type(DType::kInt64); }),
                          InvalidTypeError, "attribute 'type' says tensor(int64)");
  XPURT_EXPECT_THROW_WITH(run("Optional", {o}, 15), InvalidTypeError, "must be a tensor or a sequence");

  auto has = [](const Value& v, std::int64_t opset) {
    return *static_cast<const bool*>(run("OptionalHasElement", {v}, opset)[0].tensor().data_ptr());
  };
  EXPECT_TRUE(has(o, 15));
  EXPECT_FALSE(has(none, 15));
  EXPECT_TRUE(has(x, 18));  // opset 18 takes tensors and sequences: they have an element
  EXPECT_FALSE(*static_cast<const bool*>(run("OptionalHasElement", {Value()}, 18)[0].tensor().data_ptr()));
  XPURT_EXPECT_THROW_WITH(has(x, 15), InvalidTypeError, "must be an optional (opset 15");

  EXPECT_EQ(run("OptionalGetElement", {o}, 15)[0].tensor().data_ptr(), x.data_ptr());
  const Value seq = seqf({x});
  EXPECT_TRUE(run("OptionalGetElement", {Value::optional(seq)}, 15)[0].is_sequence());
  EXPECT_TRUE(run("OptionalGetElement", {seq}, 18)[0].is_sequence());
  XPURT_EXPECT_THROW_WITH(run("OptionalGetElement", {none}, 15), InvalidArgumentError, "is empty (None)");
  XPURT_EXPECT_THROW_WITH(run("OptionalGetElement", {x}, 15), InvalidTypeError, "must be an optional");
}

TEST(SequenceOps, IdentityIfAndLoopCarrySequences) {
  const Value seq = seqf({makef({1}, {1})});
  EXPECT_EQ(run("Identity", {seq}, 16)[0].elements()[0].data_ptr(), seq.elements()[0].data_ptr());
  EXPECT_FALSE(run("Identity", {Value::none()}, 16)[0].has_element());

  // If: the branches make sequences of different lengths.
  auto branch = [](int n) {
    auto g = std::make_shared<Graph>();
    g->opsets[""] = 16;
    g->name = "branch" + std::to_string(n);
    g->initializers["c"] = makef({1}, {static_cast<float>(n)});
    std::vector<std::string> ins(static_cast<std::size_t>(n), "c");
    g->nodes.push_back(node("SequenceConstruct", ins, {"s"}));
    g->outputs = {"s"};
    return g;
  };
  auto if_node = [&](Node& n) {
    n.graph_attrs["then_branch"] = branch(2);
    n.graph_attrs["else_branch"] = branch(1);
  };
  EXPECT_EQ(run("If", {scalarb(true)}, 16, if_node)[0].elements().size(), 2u);
  EXPECT_EQ(run("If", {scalarb(false)}, 16, if_node)[0].elements().size(), 1u);

  // Loop: a sequence carried through 3 iterations, each appending the iteration number.
  auto body = std::make_shared<Graph>();
  body->opsets[""] = 16;
  body->name = "loop_body";
  body->inputs = {"i", "cond", "seq_in"};
  body->outputs = {"cond_out", "seq_out"};
  body->nodes.push_back(node("Identity", {"cond"}, {"cond_out"}));
  body->nodes.push_back(node("SequenceInsert", {"seq_in", "i"}, {"seq_out"}));
  auto out = run("Loop", {scalari(3), scalarb(true), Value::sequence({}, DType::kInt64)}, 16,
                 [&](Node& n) { n.graph_attrs["body"] = body; });
  ASSERT_EQ(out[0].elements().size(), 3u);
  EXPECT_EQ(ints(out[0].elements()[2]), I({2}));
  // A sequence as a scan output is refused: scan outputs are stacked tensors.
  auto bad = std::make_shared<Graph>(*body);
  bad->outputs = {"cond_out", "seq_out", "seq_out"};
  XPURT_EXPECT_THROW_WITH(run("Loop", {scalari(1), scalarb(true), Value::sequence({}, DType::kInt64)}, 16,
                              [&](Node& n) { n.graph_attrs["body"] = bad; }, 2),
                          InvalidTypeError, "must be a tensor");
}

TEST(SequenceOps, TensorRunNodeRefusesSequenceOutputs) {
  Node n = node("SequenceConstruct", {"a"}, {"s"});
  XPURT_EXPECT_THROW_WITH(onnx_ref::run_node(n, 11, {makef({1}, {1})}), InvalidTypeError, "run_node_values");
}

// ---- models through InferenceSession ----

// A model with a sequence input `xs` (float32), an optional input `maybe` (optional(tensor(int64))) and the outputs
//   n = SequenceLength(xs), total = ConcatFromSequence(SequenceInsert(xs, extra), axis 0), ys = xs with
//   `extra` inserted at the front, has = OptionalHasElement(maybe), same = Identity(maybe), first = SequenceAt(ys, 0).
std::string sequence_model() {
  Graph g;
  g.name = "sequences";
  g.opsets[""] = 17;
  g.inputs = {"xs", "extra", "maybe"};
  g.outputs = {"n", "total", "ys", "has", "same", "first"};
  g.types["xs"] = ValueType::sequence_of(tensor_type(DType::kFloat32, {Dim(std::string("len"))}));
  g.types["extra"] = tensor_type(DType::kFloat32, {Dim(2)});
  g.types["maybe"] = ValueType::optional_of(tensor_type(DType::kInt64, {Dim(3)}));
  g.types["n"] = tensor_type(DType::kInt64, {}, /*has_shape=*/true);
  g.types["total"] = tensor_type(DType::kFloat32, {Dim()});
  g.types["ys"] = g.types["xs"];
  g.types["has"] = tensor_type(DType::kBool, {}, true);
  g.types["same"] = g.types["maybe"];
  g.types["first"] = tensor_type(DType::kFloat32, {Dim(2)});
  g.initializers["zero"] = makei({}, {0});
  g.nodes.push_back(node("SequenceLength", {"xs"}, {"n"}));
  g.nodes.push_back(node("SequenceInsert", {"xs", "extra", "zero"}, {"ys"}));
  Node concat = node("ConcatFromSequence", {"ys"}, {"total"});
  concat.attrs.set("axis", std::int64_t{0});
  g.nodes.push_back(concat);
  g.nodes.push_back(node("OptionalHasElement", {"maybe"}, {"has"}));
  g.nodes.push_back(node("Identity", {"maybe"}, {"same"}));
  g.nodes.push_back(node("SequenceAt", {"ys", "zero"}, {"first"}));
  g.validate();
  return export_onnx(g);
}

InferenceSession native_session(const std::string& bytes, Device device = Device::cpu()) {
  SessionOptions options;
  options.engine = "native";
  options.device = device;
  return InferenceSession::from_bytes(bytes, options);
}

TEST(NativeSequences, ImportExportKeepsSequenceAndOptionalTypes) {
  const Graph g = import_onnx(sequence_model());
  EXPECT_EQ(g.type("xs")->type_str(), "seq(tensor(float32))");
  EXPECT_EQ(g.type("xs")->str(), "seq(float32[len])");
  EXPECT_EQ(g.type("maybe")->type_str(), "optional(tensor(int64))");
  EXPECT_EQ(g.type("maybe")->str(), "optional(int64[3])");
  // A TYPE_PROTO attribute (Optional's `type`) survives the round trip.
  Graph h = g;
  Node opt = node("Optional", {}, {"empty"});
  opt.type_attrs["type"] = ValueType::sequence_of(tensor_type(DType::kFloat16, {Dim(4)}));
  h.nodes.push_back(opt);
  h.outputs.push_back("empty");
  h.types["empty"] = ValueType::optional_of(opt.type_attrs["type"]);
  const Graph back = import_onnx(export_onnx(h));
  const Node& read = back.nodes.back();
  ASSERT_EQ(read.op_type, "Optional");
  ASSERT_EQ(read.type_attrs.count("type"), 1u);
  EXPECT_EQ(read.type_attrs.at("type").str(), "seq(float16[4])");
  EXPECT_EQ(back.type("empty")->type_str(), "optional(seq(tensor(float16)))");
}

TEST(NativeSequences, RunValuesFeedsAndReturnsSequencesAndOptionals) {
  InferenceSession session = native_session(sequence_model());
  const auto& inputs = session.get_inputs();
  ASSERT_EQ(inputs.size(), 3u);
  EXPECT_EQ(inputs[0].type(), "seq(tensor(float32))");
  EXPECT_EQ(inputs[0].str(), "xs: seq(float32[len])");
  EXPECT_EQ(inputs[1].type(), "tensor(float32)");
  EXPECT_EQ(inputs[2].type(), "optional(tensor(int64))");
  EXPECT_EQ(inputs[2].kind, ValueKind::kOptional);
  EXPECT_EQ(session.get_outputs()[2].type(), "seq(tensor(float32))");

  const Tensor a = makef({2}, {1, 2});
  const Tensor b = makef({1}, {3});
  const Tensor maybe = makei({3}, {7, 8, 9});
  // An optional input takes its element itself (wrapped as ONNX Runtime does) or an optional.
  const Tensor extra = makef({2}, {-1, -2});
  for (const Value& fed : {Value(maybe), Value::optional(maybe)}) {
    auto out = session.run_values({{"xs", seqf({a, b})}, {"extra", extra}, {"maybe", fed}});
    ASSERT_EQ(out.size(), 6u);
    EXPECT_EQ(ints(out[0].tensor()), I({2}));
    EXPECT_EQ(floats(out[1].tensor()), F({-1, -2, 1, 2, 3}));
    ASSERT_EQ(out[2].elements().size(), 3u);
    EXPECT_EQ(floats(out[2].elements()[0]), F({-1, -2}));
    // The caller owns what it gets: tensors of its own feeds come back as copies.
    EXPECT_EQ(floats(out[2].elements()[1]), F({1, 2}));
    EXPECT_NE(out[2].elements()[1].data_ptr(), a.data_ptr());
    EXPECT_TRUE(*static_cast<const bool*>(out[3].tensor().data_ptr()));
    ASSERT_TRUE(out[4].is_optional() && out[4].has_element());
    EXPECT_EQ(ints(out[4].element().tensor()), I({7, 8, 9}));
    EXPECT_NE(out[4].element().tensor().data_ptr(), maybe.data_ptr());
    EXPECT_EQ(floats(out[5].tensor()), F({-1, -2}));  // a fed tensor, through a sequence: copied as well
    EXPECT_NE(out[5].tensor().data_ptr(), extra.data_ptr());
  }
  // An empty sequence and an empty optional; outputs by name.
  auto out = session.run_values(
      {{"xs", Value::sequence({}, DType::kFloat32)}, {"extra", makef({2}, {5, 6})}, {"maybe", Value::none()}},
      {"same", "has", "n", "total"});
  EXPECT_FALSE(out[0].has_element());
  EXPECT_FALSE(*static_cast<const bool*>(out[1].tensor().data_ptr()));
  EXPECT_EQ(ints(out[2].tensor()), I({0}));
  EXPECT_EQ(floats(out[3].tensor()), F({5, 6}));
}

TEST(NativeSequences, FeedsOfTheWrongKindAreTypedErrorsNamingTheInput) {
  InferenceSession session = native_session(sequence_model());
  const Tensor a = makef({2}, {1, 2});
  const Value good_xs = seqf({a});
  const Value extra = makef({2}, {0, 0});
  auto feeds = [&](Value xs, Value ex, Value maybe) {
    return std::vector<std::pair<std::string, Value>>{{"xs", xs}, {"extra", ex}, {"maybe", maybe}};
  };
  XPURT_EXPECT_THROW_WITH(session.run_values(feeds(a, extra, Value::none())), InvalidTypeError,
                          "input 'xs' expects seq(tensor(float32)), got a float32 tensor of shape [2]");
  XPURT_EXPECT_THROW_WITH(session.run_values(feeds(good_xs, good_xs, Value::none())), InvalidTypeError,
                          "input 'extra' expects tensor(float32), got a sequence of 1 float32 tensor");
  XPURT_EXPECT_THROW_WITH(session.run_values(feeds(Value::sequence({makei({1}, {1})}, DType::kInt64), extra,
                                                   Value::none())),
                          InvalidTypeError, "input 'xs' expects seq(tensor(float32)), got a sequence of 1 int64");
  XPURT_EXPECT_THROW_WITH(session.run_values(feeds(good_xs, extra, good_xs)), InvalidTypeError,
                          "input 'maybe' expects optional(tensor(int64)), got a sequence");
  XPURT_EXPECT_THROW_WITH(session.run_values(feeds(good_xs, extra, a)), InvalidTypeError,
                          "input 'maybe' expects optional(tensor(int64)), got a float32 tensor");
  XPURT_EXPECT_THROW_WITH(session.run_values(feeds(good_xs, Value::none(), Value::none())), InvalidTypeError,
                          "input 'extra' expects tensor(float32), got an empty optional");
  XPURT_EXPECT_THROW_WITH(session.run_values({{"xs", good_xs}, {"maybe", Value::none()}}), InvalidArgumentError,
                          "missing input 'extra'");
  XPURT_EXPECT_THROW_WITH(session.run_values({{"nope", good_xs}}), InvalidArgumentError, "unknown input 'nope'");
  // run() takes tensors only: this model's sequences and optionals need run_values.
  XPURT_EXPECT_THROW_WITH(session.run({{"extra", a}}), InvalidTypeError, "run it with run_values");
}

// x[4] -> SplitToSequence (chunks of 2) -> SequenceMap(Mul by 2) -> ConcatFromSequence -> y[4]: tensors outside,
// a sequence inside. run() and run_values both serve it.
std::string split_map_concat_model() {
  Graph g;
  g.name = "split_map_concat";
  g.opsets[""] = 17;
  g.inputs = {"x"};
  g.outputs = {"y"};
  g.types["x"] = tensor_type(DType::kFloat32, {Dim(4)});
  g.types["y"] = tensor_type(DType::kFloat32, {Dim(4)});
  g.initializers["two"] = makei({}, {2});
  g.nodes.push_back(node("SplitToSequence", {"x", "two"}, {"parts"}));
  auto body = std::make_shared<Graph>();
  body->name = "double";
  body->opsets[""] = 17;
  body->inputs = {"p"};
  body->outputs = {"q"};
  body->initializers["k"] = makef({}, {2});
  body->nodes.push_back(node("Mul", {"p", "k"}, {"q"}));
  Node map = node("SequenceMap", {"parts"}, {"doubled"});
  map.graph_attrs["body"] = body;
  g.nodes.push_back(map);
  Node concat = node("ConcatFromSequence", {"doubled"}, {"y"});
  concat.attrs.set("axis", std::int64_t{0});
  g.nodes.push_back(concat);
  g.validate();
  return export_onnx(g);
}

TEST(NativeSequences, SequencesInsideATensorModel) {
  InferenceSession session = native_session(split_map_concat_model());
  EXPECT_EQ(floats(session.run({{"x", makef({4}, {1, 2, 3, 4})}})[0]), F({2, 4, 6, 8}));
  EXPECT_EQ(floats(session.run_values({{"x", makef({4}, {0, 1, 0, 1})}})[0].tensor()), F({0, 2, 0, 2}));
  XPURT_EXPECT_THROW_WITH(session.run_values({{"x", seqf({makef({4}, {1, 2, 3, 4})})}}), InvalidTypeError,
                          "input 'x' expects tensor(float32), got a sequence");
  // explain() says the sequence nodes run in the reference library.
  bool reference = false;
  for (const NodeExplanation& n : session.explain().nodes) {
    reference |= n.op_type == "SequenceMap" && n.kernel == "onnx_ref";
  }
  EXPECT_TRUE(reference);
}

TEST(NativeSequences, CudaSessionsRefuseSequenceValuesAtCreation) {
  SessionOptions options;
  options.engine = "native";
  options.device = Device::cuda(0);
  if (DeviceManager::instance().get_device_count() == 0) {
    // No device to create the session on: refused before the model is looked at (Note [A device that does not
    // exist] in core/engine.cpp).
    XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(sequence_model(), options), CudaError,
                            "no CUDA device is available");
    return;
  }
  XPURT_EXPECT_THROW_WITH(InferenceSession::from_bytes(sequence_model(), options), UnsupportedOperationError,
                          "'xs' (seq(tensor(float32)))");
}

}  // namespace
}  // namespace xpuruntime
