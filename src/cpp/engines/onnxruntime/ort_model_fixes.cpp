// Note [Trailing empty inputs]
// ONNX writes an optional input that is left out as an empty name, and an empty name at the end of a node's inputs
// means the same as no input there at all. ONNX Runtime 1.29 does not treat them alike everywhere: a
// LayerNormalization(X, scale, "") -- the bias left out, a valid model -- crashes session creation with a
// segmentation fault in the SkipLayerNormFusion optimizer (graph optimization level 2 and up), which reads the
// third input's type although it has none; LayerNormalization(X, scale) loads. The structural fuzzer found it
// (docs/reliability.md, Fuzzing). The onnxruntime engine therefore hands ORT every node without its trailing empty
// inputs; the model means the same, and ORT's optimizers still run. Finding such a node walks the protobuf's
// wire format through the graph's structure only (initializers and tensor attributes are skipped, not read), so
// models without one cost a pass over their node list and are handed over unchanged.
//
// Note [Models ORT crashes on]
// Some malformed models crash ONNX Runtime 1.29 while it loads them, before any of its own checks can answer: a
// SplitToSequence whose 'split' is a constant scalar 0 divides by it in ONNX's shape inference (SIGFPE, at every
// graph optimization level; the native engine refuses it when the node runs); an empty name before a named input
// where the operator takes no optional input (Min(x, "", y), Sum, Mean: variadic inputs have no optional slots)
// crashes its Run (SIGSEGV; the native engine's reference library refuses it); a Split whose constant sizes name
// another number of parts than it has outputs aborts its Run (an assertion). check_loadable_by_ort refuses such a
// model with a typed error first; finding an empty name walks the wire format as above, and the model is parsed
// only when it has one before a named input, or a Split or SplitToSequence. Found by the structural fuzzer; each has
// a regression model in tests/fuzz/corpus/model.
#include "engines/onnxruntime/ort_model_fixes.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>

#if XPURT_ONNX_PROTO_GENERATED
#include "onnx/onnx-ml.pb.h"
#else
#include <onnx/onnx_pb.h>
#endif

#include "engines/native/import/onnx_schemas.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::ort {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

enum class Message { kModel, kGraph, kFunction, kNode, kAttribute };

// The message a length-delimited field of `parent` holds, when it can hold nodes (onnx.proto's field numbers).
bool child_of(Message parent, int field, Message* child) {
  switch (parent) {
    case Message::kModel:  // ModelProto.graph = 7, ModelProto.functions = 25
      if (field == 7) *child = Message::kGraph;
      else if (field == 25) *child = Message::kFunction;
      else return false;
      return true;
    case Message::kGraph:  // GraphProto.node = 1
    case Message::kFunction:  // FunctionProto.node = 7
      if (field != (parent == Message::kGraph ? 1 : 7)) return false;
      *child = Message::kNode;
      return true;
    case Message::kNode:  // NodeProto.attribute = 5
      if (field != 5) return false;
      *child = Message::kAttribute;
      return true;
    case Message::kAttribute:  // AttributeProto.g = 6, AttributeProto.graphs = 11
      if (field != 6 && field != 11) return false;
      *child = Message::kGraph;
      return true;
  }
  return false;
}

enum : unsigned { kTrailingEmpty = 1, kInteriorEmpty = 2 };

// Which empty input names the nodes in the message `in` is positioned on (of kind `kind`) have: kTrailingEmpty when a
// node ends its inputs with one, kInteriorEmpty when one comes before a named input. A malformed message answers
// what was seen before the damage: ORT's own parse reports it.
unsigned empty_inputs(CodedInputStream* in, Message kind, int depth) {
  unsigned found = 0;
  bool last_empty = false;
  bool seen_empty = false;
  for (;;) {
    const std::uint32_t tag = in->ReadTag();
    if (tag == 0) break;
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const bool delimited = WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    Message child;
    if (delimited && kind == Message::kNode && field == 1) {  // NodeProto.input = 1
      std::uint32_t length = 0;
      if (!in->ReadVarint32(&length) || !in->Skip(static_cast<int>(length))) return found;
      if (length != 0 && seen_empty) found |= kInteriorEmpty;
      seen_empty = seen_empty || length == 0;
      last_empty = length == 0;
    } else if (delimited && depth < 64 && child_of(kind, field, &child)) {
      std::uint32_t length = 0;
      if (!in->ReadVarint32(&length)) return found;
      const CodedInputStream::Limit limit = in->PushLimit(static_cast<int>(length));
      found |= empty_inputs(in, child, depth + 1);
      if (!in->ConsumedEntireMessage()) return found;
      in->PopLimit(limit);
    } else if (!WireFormatLite::SkipField(in, tag)) {
      return found;
    }
  }
  if (kind == Message::kNode && last_empty) found |= kTrailingEmpty;
  return found;
}

unsigned empty_inputs(const std::string& model) {
  if (model.size() >= static_cast<std::size_t>(std::numeric_limits<int>::max())) return 0;
  CodedInputStream in(reinterpret_cast<const std::uint8_t*>(model.data()), static_cast<int>(model.size()));
  return empty_inputs(&in, Message::kModel, 0);
}

void trim_graph(onnx::GraphProto* graph);

void trim_nodes(google::protobuf::RepeatedPtrField<onnx::NodeProto>* nodes) {
  for (onnx::NodeProto& node : *nodes) {
    while (node.input_size() > 0 && node.input(node.input_size() - 1).empty()) node.mutable_input()->RemoveLast();
    for (onnx::AttributeProto& attr : *node.mutable_attribute()) {
      if (attr.has_g()) trim_graph(attr.mutable_g());
      for (onnx::GraphProto& g : *attr.mutable_graphs()) trim_graph(&g);
    }
  }
}

void trim_graph(onnx::GraphProto* graph) { trim_nodes(graph->mutable_node()); }

// "node 'name' (Op)", or "a Op node" for a node without a name.
std::string describe(const onnx::NodeProto& node) {
  return node.name().empty() ? "a " + node.op_type() + " node" : "node '" + node.name() + "' (" + node.op_type() + ")";
}

// The value of a 0-d int32/int64 tensor, if it is one.
std::optional<std::int64_t> int_scalar(const onnx::TensorProto& t) {
  if (t.dims_size() != 0) return std::nullopt;
  if (t.data_type() == onnx::TensorProto::INT64) {
    if (t.int64_data_size() == 1) return t.int64_data(0);
    if (t.raw_data().size() == 8) {
      std::int64_t v;
      std::memcpy(&v, t.raw_data().data(), 8);  // little-endian, as ONNX stores raw data
      return v;
    }
  } else if (t.data_type() == onnx::TensorProto::INT32) {
    if (t.int32_data_size() == 1) return t.int32_data(0);
    if (t.raw_data().size() == 4) {
      std::int32_t v;
      std::memcpy(&v, t.raw_data().data(), 4);
      return v;
    }
  }
  return std::nullopt;
}

// An empty name before a named input where the operator's schema has no optional input (Min(x, "", y)).
void check_interior_empty_inputs(const onnx::NodeProto& node, const std::map<std::string, std::int64_t>& opsets) {
  const std::string domain = node.domain() == "ai.onnx" ? "" : node.domain();
  const auto opset = opsets.find(domain);
  if (opset == opsets.end()) return;
  const onnx_schema::Schema* schema = onnx_schema::find(domain, node.op_type(), opset->second);
  if (schema == nullptr || schema->inputs.empty()) return;
  int last_named = -1;
  for (int k = 0; k < node.input_size(); ++k) {
    if (!node.input(k).empty()) last_named = k;
  }
  for (int k = 0; k < last_named; ++k) {
    if (!node.input(k).empty()) continue;
    const auto& formal = static_cast<std::size_t>(k) < schema->inputs.size() ? schema->inputs[static_cast<std::size_t>(k)]
                                                                          : schema->inputs.back();
    if (formal.kind == onnx_schema::Formal::Kind::kOptional) continue;
    throw InvalidArgumentError(
        "onnxruntime: " + describe(node) + ": input " + std::to_string(k) +
        " has no name, but " + node.op_type() + "'s input '" + std::string(formal.name) + "' is " +
        (formal.kind == onnx_schema::Formal::Kind::kVariadic ? "variadic" : "required") +
        ", not optional; name a value there (ONNX Runtime 1.29 would crash running this model: Note [Models ORT "
        "crashes on])");
  }
}

// A Split whose sizes (its 'split' input or attribute, or num_outputs) name another number of parts than it has
// outputs: ORT 1.29 indexes its sizes by output and aborts the process (an assertion in std::vector; found by the
// structural campaign of 2026-11-28, a GPT-2 export with an output added to a Split,
// tests/fuzz/corpus/model/regression-ort-split-with-more-outputs-than-sizes.onnx).
void check_split_outputs(const onnx::NodeProto& node, const std::map<std::string, std::int64_t>& opsets,
                         const std::map<std::string, std::int64_t>& lengths) {
  if (node.op_type() != "Split" || !(node.domain().empty() || node.domain() == "ai.onnx")) return;
  const auto opset = opsets.find("");
  const std::int64_t version = opset == opsets.end() ? 0 : opset->second;
  std::int64_t parts = -1;
  std::string from;
  if (version >= 13 && node.input_size() >= 2 && !node.input(1).empty()) {
    const auto it = lengths.find(node.input(1));
    if (it != lengths.end()) {
      parts = it->second;
      from = "its 'split' input '" + node.input(1) + "' has " + std::to_string(parts) + " sizes";
    }
  }
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() == "split" && version < 13 && a.ints_size() > 0) {
      parts = a.ints_size();
      from = "its 'split' attribute has " + std::to_string(parts) + " sizes";
    }
    if (a.name() == "num_outputs" && a.type() == onnx::AttributeProto::INT) {
      parts = a.i();
      from = "its num_outputs is " + std::to_string(parts);
    }
  }
  if (parts >= 0 && parts != node.output_size()) {
    throw InvalidArgumentError("onnxruntime: " + describe(node) + " has " + std::to_string(node.output_size()) +
                               " outputs but " + from + " (ONNX Runtime 1.29 would abort the process running it: "
                               "Note [Models ORT crashes on])");
  }
}

void check_graph_for_ort(const onnx::GraphProto& graph, const std::map<std::string, std::int64_t>& opsets,
                         int depth) {
  std::map<std::string, std::int64_t> scalars;  // constant int scalars by name: initializers and Constant nodes
  std::map<std::string, std::int64_t> lengths;  // the element counts of constant 1-D tensors, likewise
  const auto note_constant = [&](const std::string& name, const onnx::TensorProto& t) {
    if (auto v = int_scalar(t)) scalars[name] = *v;
    if (t.dims_size() == 1) lengths[name] = t.dims(0);
  };
  for (const onnx::TensorProto& t : graph.initializer()) note_constant(t.name(), t);
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.op_type() != "Constant" || node.output_size() != 1) continue;
    for (const onnx::AttributeProto& a : node.attribute()) {
      if (a.name() == "value" && a.has_t()) note_constant(node.output(0), a.t());
    }
  }
  for (const onnx::NodeProto& node : graph.node()) {
    check_interior_empty_inputs(node, opsets);
    check_split_outputs(node, opsets, lengths);
    if (node.op_type() == "SplitToSequence" && (node.domain().empty() || node.domain() == "ai.onnx") &&
        node.input_size() >= 2) {
      auto it = scalars.find(node.input(1));
      if (it != scalars.end() && it->second <= 0) {
        throw InvalidArgumentError(
            "onnxruntime: " + describe(node) + " splits into parts of " +
            std::to_string(it->second) + " elements ('" + node.input(1) + "'); a scalar 'split' must be positive "
            "(ONNX Runtime 1.29 would crash loading this model: Note [Models ORT crashes on])");
      }
    }
    if (depth >= 64) continue;
    for (const onnx::AttributeProto& a : node.attribute()) {
      if (a.has_g()) check_graph_for_ort(a.g(), opsets, depth + 1);
      for (const onnx::GraphProto& g : a.graphs()) check_graph_for_ort(g, opsets, depth + 1);
    }
  }
}

}  // namespace

void check_loadable_by_ort(const std::string& model) {
  if (model.find("Split") == std::string::npos && !(empty_inputs(model) & kInteriorEmpty)) return;
  onnx::ModelProto proto;
  if (model.size() >= static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !proto.ParseFromArray(model.data(), static_cast<int>(model.size()))) {
    return;  // ORT reports it
  }
  std::map<std::string, std::int64_t> opsets;
  for (const onnx::OperatorSetIdProto& o : proto.opset_import()) {
    opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  }
  check_graph_for_ort(proto.graph(), opsets, 0);
}

bool without_trailing_empty_inputs(const std::string& model, std::string* trimmed) {
  if (!(empty_inputs(model) & kTrailingEmpty)) return false;
  onnx::ModelProto proto;
  if (!proto.ParseFromString(model)) return false;
  trim_graph(proto.mutable_graph());
  for (onnx::FunctionProto& f : *proto.mutable_functions()) trim_nodes(f.mutable_node());
  return proto.SerializeToString(trimmed);
}

}  // namespace xpuruntime::ort
