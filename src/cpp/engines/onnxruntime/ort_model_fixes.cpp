// Note [Trailing empty inputs]
// ONNX writes an optional input that is left out as an empty name, and an empty name at the end of a node's inputs
// means the same as no input there at all. ONNX Runtime 1.29 does not treat them alike everywhere: a
// LayerNormalization(X, scale, "") -- the bias left out, a valid model -- crashes session creation with a
// segmentation fault in the SkipLayerNormFusion optimizer (graph optimization level 2 and up), which reads the
// third input's type although it has none; LayerNormalization(X, scale) loads. The structural fuzzer found it
// (docs/reliability.md, Fuzzing). The onnxruntime engine therefore hands ORT every node without its trailing empty
// inputs; the model means the same, and ORT's optimizers still run. They are found on the parse the ONNX frontend's
// check made (check_for_ort), so a model without one is handed over unchanged and one with one is serialized once.
//
// Note [Models ORT crashes on]
// Some malformed models crash ONNX Runtime 1.29 while it loads them, before any of its own checks can answer: a
// SplitToSequence whose 'split' is a constant scalar 0 divides by it in ONNX's shape inference (SIGFPE, at every
// graph optimization level; the native engine refuses it when the node runs); an empty name before a named input
// where the operator takes no optional input (Min(x, "", y), Sum, Mean: variadic inputs have no optional slots)
// crashes its Run (SIGSEGV; the native engine's reference library refuses it); a Split whose constant sizes name
// another number of parts than it has outputs aborts its Run (an assertion); and a Reshape, Expand or
// ConstantOfShape whose shape operand is declared with more than kMaxShapeOperand elements (a graph input of
// [2147483648] int64) makes its shape inference build a shape of that rank while it loads the model, gigabytes
// before std::bad_alloc (13 s and 7 GiB under an 8 GiB address-space limit); a Scan whose num_scan_inputs is past its
// inputs (2^40) makes it allocate a vector of that many entries (8 TiB). check_for_ort refuses such a model with
// a typed error first, walking the main graph and its subgraphs on the one parse of the model. Found by the
// structural fuzzer; each has a regression model in tests/fuzz/corpus/model.
//
// Note [Float8 QDQ through ORT's CPU]
// ONNX Runtime 1.29's CPU graph optimizer misreads float8 QuantizeLinear/DequantizeLinear (xrt.quantize(precision=
// "fp8") writes float8e4m3fn weights and activations at opset 19): its QDQ fusion turns DequantizeLinear -> Gemm into
// QGemm and DequantizeLinear -> MatMul into MatMulIntegerToFloat, which take no float8 (session creation failed with
// ORT_INVALID_GRAPH); its rule ReluQuantRewrite removes a Relu before a QuantizeLinear whose zero point is not int8 or
// uint8, float8 included (a wrong answer: the negative values pass); its rule ClipQuantRewrite throws on a float8 zero
// point. So when a QuantizeLinear or DequantizeLinear of the model has a float8 input or output (element types
// 17-20: a float8 initializer, graph input or output, value_info or Constant, or a QuantizeLinear whose output_dtype
// is float8), the session sets "session.disable_quant_qdq" = "1" and names the two rules in
// "optimization.disable_specified_optimizers": ORT runs QuantizeLinear and DequantizeLinear as the nodes they are (it
// has float8 kernels for both) and the float operators between them, which computes what the model says; its other
// optimizations still run. The explanation lists both entries with a policy note. Models without float8 QDQ keep ORT's
// QDQ fusion (int8 models run its quantized kernels).
#include "engines/onnxruntime/ort_model_fixes.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#if XPURT_ONNX_PROTO_GENERATED
#include "onnx/onnx-ml.pb.h"
#else
#include <onnx/onnx_pb.h>
#endif

#include "engines/onnxruntime/ort_utils.h"
#include "frontends/onnx/onnx_schemas.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::ort {
namespace {

bool trim_graph(onnx::GraphProto* graph);

// Drops the trailing empty inputs of `nodes` and of their subgraphs (Note [Trailing empty inputs]); whether there
// were any.
bool trim_nodes(google::protobuf::RepeatedPtrField<onnx::NodeProto>* nodes) {
  bool trimmed = false;
  for (onnx::NodeProto& node : *nodes) {
    while (node.input_size() > 0 && node.input(node.input_size() - 1).empty()) {
      node.mutable_input()->RemoveLast();
      trimmed = true;
    }
    for (onnx::AttributeProto& attr : *node.mutable_attribute()) {
      if (attr.has_g()) trimmed |= trim_graph(attr.mutable_g());
      for (onnx::GraphProto& g : *attr.mutable_graphs()) trimmed |= trim_graph(&g);
    }
  }
  return trimmed;
}

bool trim_graph(onnx::GraphProto* graph) { return trim_nodes(graph->mutable_node()); }

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

// The longest shape operand (a tensor's rank) check_shape_operands lets through: far past any real tensor's rank,
// and a shape of this rank is half a megabyte.
constexpr std::int64_t kMaxShapeOperand = std::int64_t{1} << 16;

// A Reshape, Expand or ConstantOfShape whose shape operand has a known length (a constant's, or a declared static
// dim) over kMaxShapeOperand (Note [Models ORT crashes on]).
void check_shape_operands(const onnx::NodeProto& node, const std::map<std::string, std::int64_t>& lengths) {
  if (!(node.domain().empty() || node.domain() == "ai.onnx")) return;
  int operand = -1;
  if (node.op_type() == "Reshape" || node.op_type() == "Expand") operand = 1;
  if (node.op_type() == "ConstantOfShape") operand = 0;
  if (operand < 0 || node.input_size() <= operand) return;
  const auto it = lengths.find(node.input(operand));
  if (it == lengths.end() || it->second <= kMaxShapeOperand) return;
  throw InvalidArgumentError("onnxruntime: " + describe(node) + ": its shape operand '" + node.input(operand) +
                             "' has " + std::to_string(it->second) + " elements, a tensor of rank " +
                             std::to_string(it->second) + " (at most " + std::to_string(kMaxShapeOperand) +
                             " here: ONNX Runtime 1.29 would build a shape of that rank loading this model, "
                             "gigabytes of memory; Note [Models ORT crashes on])");
}

// A Scan whose num_scan_inputs is not between 1 and its number of inputs (Note [Models ORT crashes on]).
void check_scan_inputs(const onnx::NodeProto& node) {
  if (node.op_type() != "Scan" || !(node.domain().empty() || node.domain() == "ai.onnx")) return;
  for (const onnx::AttributeProto& a : node.attribute()) {
    if (a.name() != "num_scan_inputs" || (a.i() >= 1 && a.i() <= node.input_size())) continue;
    throw InvalidArgumentError("onnxruntime: " + describe(node) + ": num_scan_inputs is " + std::to_string(a.i()) +
                               ", but the node has " + std::to_string(node.input_size()) +
                               " inputs (ONNX Runtime 1.29 would allocate a vector of that many entries loading "
                               "this model: Note [Models ORT crashes on])");
  }
}

// The static length of `value` where `graph` declares it 1-D (a graph input or a value_info).
void note_declared_lengths(const onnx::GraphProto& graph, std::map<std::string, std::int64_t>& lengths) {
  const auto note = [&](const onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
    const onnx::TensorShapeProto& shape = v.type().tensor_type().shape();
    if (shape.dim_size() == 1 && shape.dim(0).has_dim_value()) lengths[v.name()] = shape.dim(0).dim_value();
  };
  for (const onnx::ValueInfoProto& v : graph.input()) note(v);
  for (const onnx::ValueInfoProto& v : graph.value_info()) note(v);
}

void check_graph_for_ort(const onnx::GraphProto& graph, const std::map<std::string, std::int64_t>& opsets,
                         int depth) {
  std::map<std::string, std::int64_t> scalars;  // constant int scalars by name: initializers and Constant nodes
  // The element counts of constant 1-D tensors, likewise, and of the 1-D values the graph declares with a static
  // length (note_declared_lengths).
  std::map<std::string, std::int64_t> lengths;
  const auto note_constant = [&](const std::string& name, const onnx::TensorProto& t) {
    if (auto v = int_scalar(t)) scalars[name] = *v;
    if (t.dims_size() == 1) lengths[name] = t.dims(0);
  };
  note_declared_lengths(graph, lengths);
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
    check_shape_operands(node, lengths);
    check_scan_inputs(node);
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

bool is_float8(int element_type) {
  return element_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN ||
         element_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FNUZ ||
         element_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2 ||
         element_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2FNUZ;
}

// Adds to `names` the float8 tensors `graph` declares: initializers, inputs, outputs, value_info.
void note_float8_values(const onnx::GraphProto& graph, std::set<std::string>* names) {
  for (const onnx::TensorProto& t : graph.initializer()) {
    if (is_float8(t.data_type())) names->insert(t.name());
  }
  for (const auto* infos : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const onnx::ValueInfoProto& v : *infos) {
      if (v.type().has_tensor_type() && is_float8(v.type().tensor_type().elem_type())) names->insert(v.name());
    }
  }
}

// Whether a QuantizeLinear or DequantizeLinear of `nodes` or of their subgraphs has a float8 input or output (Note
// [Float8 QDQ through ORT's CPU]). `names`: the float8 values in scope (a subgraph sees its enclosing graphs').
bool has_float8_qdq(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes, std::set<std::string> names,
                    int depth) {
  for (const onnx::NodeProto& node : nodes) {
    if (node.op_type() != "Constant" || node.output_size() != 1) continue;
    for (const onnx::AttributeProto& a : node.attribute()) {
      if (a.name() == "value" && a.has_t() && is_float8(a.t().data_type())) names.insert(node.output(0));
    }
  }
  for (const onnx::NodeProto& node : nodes) {
    const bool qdq = (node.op_type() == "QuantizeLinear" || node.op_type() == "DequantizeLinear") &&
                     (node.domain().empty() || node.domain() == "ai.onnx");
    if (qdq) {
      for (const auto* values : {&node.input(), &node.output()}) {
        for (const std::string& name : *values) {
          if (names.count(name)) return true;
        }
      }
      for (const onnx::AttributeProto& a : node.attribute()) {
        if (a.name() == "output_dtype" && is_float8(static_cast<int>(a.i()))) return true;
      }
    }
    if (depth >= 64) continue;
    for (const onnx::AttributeProto& a : node.attribute()) {
      std::vector<const onnx::GraphProto*> subgraphs;
      if (a.has_g()) subgraphs.push_back(&a.g());
      for (const onnx::GraphProto& g : a.graphs()) subgraphs.push_back(&g);
      for (const onnx::GraphProto* g : subgraphs) {
        std::set<std::string> inner = names;
        note_float8_values(*g, &inner);
        if (has_float8_qdq(g->node(), std::move(inner), depth + 1)) return true;
      }
    }
  }
  return false;
}

bool has_float8_qdq(const onnx::ModelProto& model) {
  std::set<std::string> names;
  note_float8_values(model.graph(), &names);
  if (has_float8_qdq(model.graph().node(), names, 0)) return true;
  for (const onnx::FunctionProto& f : model.functions()) {
    if (has_float8_qdq(f.node(), {}, 0)) return true;
  }
  return false;
}

}  // namespace

ModelForOrt check_for_ort(const std::string& model, const onnx_frontend::CheckOptions& checks) {
  onnx::ModelProto proto;
  onnx_frontend::validate_onnx(model, checks, &proto);  // Note [Models checked against ONNX's schemas]
  std::map<std::string, std::int64_t> opsets;
  for (const onnx::OperatorSetIdProto& o : proto.opset_import()) {
    opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  }
  check_graph_for_ort(proto.graph(), opsets, 0);  // Note [Models ORT crashes on]
  ModelForOrt result;
  result.float8_qdq = has_float8_qdq(proto);  // Note [Float8 QDQ through ORT's CPU]
  bool trimmed = trim_graph(proto.mutable_graph());  // Note [Trailing empty inputs]
  for (onnx::FunctionProto& f : *proto.mutable_functions()) trimmed |= trim_nodes(f.mutable_node());
  if (trimmed && !proto.SerializeToString(&result.rewritten)) result.rewritten.clear();
  return result;
}

}  // namespace xpuruntime::ort
