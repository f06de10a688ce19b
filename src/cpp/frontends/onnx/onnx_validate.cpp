// The importer's check of a model against the ONNX standard.
//
// Note [Models checked against ONNX's schemas]
// Everything after the import (graph passes, shape inference, the lowering, the reference library) pattern-matches
// nodes and reads their inputs and attributes; a node that breaks its operator's schema (a MatMul with one input, a
// Cast whose `to` is a graph) reached code that assumed the schema held, and some paths crashed on it. So the
// importer checks the model as ONNX's checker would, before anything else sees it:
//  * the IR version is one ONNX defines (3 .. the newest the schema table knows);
//  * each domain is imported once, with a version >= 1; an ONNX domain's version is one the table knows, unless
//    ExecutionPolicy.allow_newer_opsets says to run a newer one with the newest known semantics;
//  * every node of an ONNX domain names an operator that exists in the imported opset, has as many inputs and
//    outputs as that version of the operator takes, gives every required (non-optional) input and output a name,
//    and has only attributes the schema declares, each of its declared type, with every required one present;
//  * subgraphs (If/Loop/Scan bodies, any GRAPH attribute) are checked the same way, recursively.
// Nodes of other domains (com.xpuruntime's fused ops in models a session wrote, custom domains) are left to the
// engine, which refuses what it cannot run. The schema table (onnx_schema_table.inc) is generated from the onnx
// package by scripts/gen_onnx_schemas.py. Graph::validate checks the rest: values produced once, inputs defined,
// the graph acyclic (nodes out of topological order are sorted, as ONNX Runtime does).
#include "frontends/onnx/onnx_validate.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include "frontends/onnx/onnx_schemas.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/onnx_dtype.h"

namespace xpuruntime::detail {

namespace {

using onnx_schema::Formal;
using onnx_schema::Schema;

std::string domain_name(const std::string& domain) { return domain.empty() ? "ai.onnx" : domain; }

std::string normal_domain(const std::string& domain) { return domain == "ai.onnx" ? "" : domain; }

// ONNX's short code of an attribute's type ("i", "fs", ...); for attributes without a type (IR < 2), the field
// that is set. Empty when nothing is set.
std::string attribute_type(const onnx::AttributeProto& a) {
  switch (a.type()) {
    case onnx::AttributeProto::FLOAT: return "f";
    case onnx::AttributeProto::INT: return "i";
    case onnx::AttributeProto::STRING: return "s";
    case onnx::AttributeProto::TENSOR: return "t";
    case onnx::AttributeProto::GRAPH: return "g";
    case onnx::AttributeProto::SPARSE_TENSOR: return "st";
    case onnx::AttributeProto::TYPE_PROTO: return "tp";
    case onnx::AttributeProto::FLOATS: return "fs";
    case onnx::AttributeProto::INTS: return "is";
    case onnx::AttributeProto::STRINGS: return "ss";
    case onnx::AttributeProto::TENSORS: return "ts";
    case onnx::AttributeProto::GRAPHS: return "gs";
    case onnx::AttributeProto::SPARSE_TENSORS: return "sts";
    case onnx::AttributeProto::TYPE_PROTOS: return "tps";
    default: break;
  }
  if (a.has_f()) return "f";
  if (a.has_i()) return "i";
  if (a.has_s()) return "s";
  if (a.has_t()) return "t";
  if (a.has_g()) return "g";
  if (a.floats_size() > 0) return "fs";
  if (a.ints_size() > 0) return "is";
  if (a.strings_size() > 0) return "ss";
  if (a.tensors_size() > 0) return "ts";
  if (a.graphs_size() > 0) return "gs";
  return "";
}

// ONNX's name of a tensor element type ("float16", dtype_from_onnx_type's table), empty for codes it does not name.
std::string element_name(int code) {
  std::string name;
  dtype_from_onnx_type(code, nullptr, &name);
  return name == "unknown" ? std::string() : name;
}

// A value's type as ONNX's schemas write it ("tensor(float)", "seq(tensor(int64))"); empty when unknown.
std::string type_string(const onnx::TypeProto& t) {
  const auto wrap = [](const char* kind, const std::string& inner) {
    return inner.empty() ? std::string() : str_cat(kind, "(", inner, ")");
  };
  switch (t.value_case()) {
    case onnx::TypeProto::kTensorType: {
      const std::string element = element_name(t.tensor_type().elem_type());
      return element.empty() ? std::string() : "tensor(" + element + ")";
    }
    case onnx::TypeProto::kSequenceType: return wrap("seq", type_string(t.sequence_type().elem_type()));
    case onnx::TypeProto::kOptionalType: return wrap("optional", type_string(t.optional_type().elem_type()));
    default: return {};
  }
}

const char* type_words(const std::string& code) {
  static const std::map<std::string, const char*> words = {
      {"f", "a float"},        {"i", "an int"},           {"s", "a string"},          {"t", "a tensor"},
      {"g", "a graph"},        {"st", "a sparse tensor"}, {"tp", "a type"},           {"fs", "floats"},
      {"is", "ints"},          {"ss", "strings"},         {"ts", "tensors"},          {"gs", "graphs"},
      {"sts", "sparse tensors"}, {"tps", "types"}};
  const auto it = words.find(code);
  return it == words.end() ? "no value" : it->second;
}

class Validator {
 public:
  Validator(const std::map<std::string, std::int64_t>& opsets) : opsets_(opsets) {}

  void graph(const onnx::GraphProto& g) {
    const onnx::GraphProto* outer = graph_;
    const std::map<std::string, std::string> outer_types = types_;  // a subgraph sees the enclosing graphs' values
    graph_ = &g;
    const auto declare = [&](const std::string& name, std::string type) {
      if (!name.empty() && !type.empty()) types_[name] = std::move(type);
    };
    for (const auto& init : g.initializer()) {
      const std::string element = element_name(init.data_type());
      declare(init.name(), element.empty() ? std::string() : "tensor(" + element + ")");
    }
    for (const auto* list : {&g.input(), &g.value_info(), &g.output()}) {
      for (const onnx::ValueInfoProto& v : *list) {
        if (v.has_type()) declare(v.name(), type_string(v.type()));
      }
    }
    for (const onnx::NodeProto& n : g.node()) node(n, g.name());
    graph_ = outer;
    types_ = outer_types;
  }

 private:
  // "node 'name'", or for a node without a name, its position: "node 3 of graph 'g'".
  std::string name_of(const onnx::NodeProto& n) const {
    if (!n.name().empty()) return str_cat("node '", n.name(), "'");
    const auto& nodes = graph_->node();
    const auto index = std::distance(nodes.begin(), std::find_if(nodes.begin(), nodes.end(),
                                                                 [&](const onnx::NodeProto& m) { return &m == &n; }));
    return str_cat("node ", index, " of graph '", graph_->name(), "'");
  }

  std::string describe(const onnx::NodeProto& n, const Schema* s) const {
    std::string text = str_cat(name_of(n), " (", n.op_type());
    if (s != nullptr) text += str_cat(", ", domain_name(std::string(s->domain)), " opset ", s->since_version);
    return text + ")";
  }

  // Inputs or outputs: their count against the schema's range, and a name for every required one.
  void arity(const onnx::NodeProto& n, const Schema& s, const google::protobuf::RepeatedPtrField<std::string>& names,
             int min, int max, const std::vector<Formal>& formals, const char* what) const {
    const int count = names.size();
    const std::string range = max < 0 ? str_cat(min, " or more") : min == max ? str_cat(min) : str_cat(min, " to ", max);
    XPURT_CHECK(count >= min && (max < 0 || count <= max), "invalid model: ", describe(n, &s), " has ", count, " ",
                what, count == 1 ? "" : "s", "; ", n.op_type(), " takes ", range);
    for (int k = 0; k < count && !formals.empty(); ++k) {
      const Formal& f = formals[std::min<std::size_t>(static_cast<std::size_t>(k), formals.size() - 1)];
      XPURT_CHECK(f.kind != Formal::Kind::kRequired || !names.Get(k).empty(), "invalid model: ", describe(n, &s),
                  ": ", what, " ", k, " ('", f.name, "') is required but has no name");
    }
  }

  void attributes(const onnx::NodeProto& n, const Schema& s) {
    std::set<std::string> seen;
    for (const onnx::AttributeProto& a : n.attribute()) {
      XPURT_CHECK(seen.insert(a.name()).second, "invalid model: ", describe(n, &s), " has two attributes named '",
                  a.name(), "'");
      const onnx_schema::AttributeDecl* decl = s.attribute(a.name());
      if (decl == nullptr) {
        std::string known;
        for (const auto& d : s.attributes) known += str_cat(known.empty() ? "" : ", ", d.name);
        throw InvalidArgumentError(str_cat("invalid model: ", describe(n, &s), " has an attribute '", a.name(),
                                           "', which ", n.op_type(), " does not take (its attributes: ",
                                           known.empty() ? "none" : known, ")"));
      }
      const std::string type = attribute_type(a);
      XPURT_CHECK_TYPE(type == decl->type, "invalid model: attribute '", a.name(), "' of ", describe(n, &s),
                       " must be ", type_words(std::string(decl->type)), ", got ", type_words(type));
      if (type == "g") graph(a.g());
      if (type == "gs") {
        for (const auto& sub : a.graphs()) graph(sub);
      }
    }
    for (const auto& d : s.attributes) {
      XPURT_CHECK(!d.required || seen.count(std::string(d.name)), "invalid model: ", describe(n, &s),
                  " is missing its required attribute '", d.name, "' (", type_words(std::string(d.type)), ")");
    }
  }

  void node(const onnx::NodeProto& n, const std::string& graph_name) {
    const std::string domain = normal_domain(n.domain());
    if (!onnx_schema::is_onnx_domain(domain)) {
      // Another domain's node: its subgraphs still hold ONNX nodes.
      for (const onnx::AttributeProto& a : n.attribute()) {
        if (a.has_g()) graph(a.g());
        for (const auto& sub : a.graphs()) graph(sub);
      }
      return;
    }
    const auto opset = opsets_.find(domain);
    XPURT_CHECK(opset != opsets_.end(), "invalid model: ", name_of(n), " (", n.op_type(), ") of graph '",
                graph_name, "' is in the domain ", domain_name(domain), ", which the model does not import "
                "(opset_import has no entry for it)");
    const Schema* s = onnx_schema::find(domain, n.op_type(), opset->second);
    if (s == nullptr) {
      const Schema* later = onnx_schema::find(domain, n.op_type(), onnx_schema::newest_opset(domain));
      throw InvalidArgumentError(
          later != nullptr
              ? str_cat("invalid model: ", name_of(n), " (", n.op_type(), ") needs ", domain_name(domain),
                        " opset ", later->since_version, " or newer; the model imports opset ", opset->second)
              : str_cat("invalid model: ", name_of(n), ": ", domain_name(domain), " has no operator '",
                        n.op_type(), "' (", onnx_schema::source(), ")"));
    }
    arity(n, *s, n.input(), s->min_inputs, s->max_inputs, s->inputs, "input");
    arity(n, *s, n.output(), s->min_outputs, s->max_outputs, s->outputs, "output");
    attributes(n, *s);
    if (s->typed) input_types(n, *s);
  }

  // The inputs whose types the model states (graph inputs, initializers, value_info, enclosing graphs' values) against
  // the schema's type constraints: each in its variable's allowed types, the inputs of one variable of one type.
  void input_types(const onnx::NodeProto& n, const Schema& s) const {
    std::map<std::string_view, std::pair<std::string, int>> bound;  // type variable -> (its type, the input giving it)
    for (int k = 0; k < n.input_size() && !s.inputs.empty(); ++k) {
      const auto known = types_.find(n.input(k));
      if (n.input(k).empty() || known == types_.end()) continue;
      const std::string& actual = known->second;
      const Formal& f = s.inputs[std::min<std::size_t>(static_cast<std::size_t>(k), s.inputs.size() - 1)];
      const onnx_schema::TypeConstraint* c = s.constraint(f.type);
      if (c == nullptr) {
        XPURT_CHECK_TYPE(f.type.empty() || f.type == actual, "invalid model: input ", k, " ('", f.name, "') of ",
                         describe(n, &s), " is '", n.input(k), "' of type ", actual, "; it must be ", f.type);
        continue;
      }
      if (std::find(c->allowed.begin(), c->allowed.end(), actual) == c->allowed.end()) {
        std::string allowed;
        for (std::string_view a : c->allowed) allowed += str_cat(allowed.empty() ? "" : ", ", a);
        throw InvalidTypeError(str_cat("invalid model: input ", k, " ('", f.name, "') of ", describe(n, &s), " is '",
                                       n.input(k), "' of type ", actual, "; ", n.op_type(), "'s ", c->name,
                                       " takes ", allowed));
      }
      if (f.heterogeneous) continue;
      const auto [first, inserted] = bound.emplace(c->name, std::make_pair(actual, k));
      XPURT_CHECK_TYPE(inserted || first->second.first == actual, "invalid model: input ", k, " ('", f.name, "') of ",
                       describe(n, &s), " is ", actual, " but input ", first->second.second, " is ",
                       first->second.first, "; both are ", n.op_type(), "'s ", c->name, ", one type");
    }
  }

  const std::map<std::string, std::int64_t>& opsets_;
  const onnx::GraphProto* graph_ = nullptr;  // the graph whose nodes are being checked
  std::map<std::string, std::string> types_;  // value -> its stated type ("tensor(float)"), this graph's and outer
};

// The first node (depth first, subgraphs included) of `domain`, for naming one in an error; null when none.
const onnx::NodeProto* first_node_of(const onnx::GraphProto& g, const std::string& domain) {
  for (const onnx::NodeProto& n : g.node()) {
    if (normal_domain(n.domain()) == domain) return &n;
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (a.has_g()) {
        if (const auto* found = first_node_of(a.g(), domain)) return found;
      }
    }
  }
  return nullptr;
}

}  // namespace

void validate_onnx_model(const onnx::ModelProto& model, const ModelValidation& options) {
  const std::int64_t newest_ir = onnx_schema::newest_ir_version();
  if (model.ir_version() > newest_ir && !options.allow_newer_opsets) {
    throw UnsupportedOperationError(str_cat(
        "the model's IR version ", model.ir_version(), " is newer than the newest xpuruntime knows (", newest_ir,
        ", ", onnx_schema::source(), "); set ExecutionPolicy(allow_newer_opsets=True) to read it anyway"));
  }
  std::map<std::string, std::int64_t> opsets;
  for (const auto& op : model.opset_import()) {
    const std::string domain = normal_domain(op.domain());
    XPURT_CHECK(opsets.emplace(domain, op.version()).second, "invalid model: opset_import lists the domain ",
                domain_name(domain), " twice");
    XPURT_CHECK(op.version() >= 1, "invalid model: opset_import gives the domain ", domain_name(domain),
                " the version ", op.version(), " (versions start at 1)");
    const std::int64_t newest = onnx_schema::newest_opset(domain);
    if (newest > 0 && op.version() > newest && !options.allow_newer_opsets) {
      const onnx::NodeProto* n = first_node_of(model.graph(), domain);
      throw UnsupportedOperationError(str_cat(
          "the model imports ", domain_name(domain), " opset ", op.version(), ", newer than the newest xpuruntime "
          "knows (", newest, ", ", onnx_schema::source(), ")",
          n != nullptr ? str_cat("; ", n->name().empty() ? str_cat("its ", n->op_type(), " node")
                                                         : str_cat("node '", n->name(), "' (", n->op_type(), ")"),
                                 " would run with the semantics of opset ", newest)
                       : std::string(),
          "; set ExecutionPolicy(allow_newer_opsets=True) to accept that"));
    }
  }
  Validator(opsets).graph(model.graph());
}

}  // namespace xpuruntime::detail
