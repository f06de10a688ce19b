// ONNX's operator schemas: the generated table (onnx_schema_table.inc) and lookups over it.
#include "frontends/onnx/onnx_schemas.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "frontends/onnx/onnx_schema_table.inc"
#include "frontends/onnx/onnx_schema_types.inc"

namespace xpuruntime::onnx_schema {

namespace {

struct Row {
  const char* domain;
  const char* op_type;
  int since_version;
  int min_inputs, max_inputs, min_outputs, max_outputs;
  const char* attributes;  // "name=type,!required=type"
  int deprecated;
  const char* inputs;   // "X,?B,*rest"
  const char* outputs;
};

constexpr Row kRows[] = {XPURT_ONNX_SCHEMA_ROWS};

struct TypeRow {
  const char* domain;
  const char* op_type;
  int since_version;
  const char* inputs;       // "X:T,?B:T,&rest:V"
  const char* outputs;
  const char* constraints;  // "T=tensor(float)|tensor(double);I=tensor(int64)"
};

constexpr TypeRow kTypeRows[] = {XPURT_ONNX_TYPE_ROWS};

std::vector<std::string_view> split(std::string_view text, char separator = ',') {
  std::vector<std::string_view> parts;
  while (!text.empty()) {
    const std::size_t at = text.find(separator);
    parts.push_back(text.substr(0, at));
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return parts;
}

// "?name:type" and its kin (onnx_schema_table.inc's form has no ":type").
std::vector<Formal> formals(std::string_view text) {
  std::vector<Formal> out;
  for (std::string_view part : split(text)) {
    Formal f;
    if (!part.empty() && (part.front() == '?' || part.front() == '*' || part.front() == '&')) {
      f.kind = part.front() == '?' ? Formal::Kind::kOptional : Formal::Kind::kVariadic;
      f.heterogeneous = part.front() == '&';
      part.remove_prefix(1);
    }
    const std::size_t colon = part.find(':');
    f.name = part.substr(0, colon);
    if (colon != std::string_view::npos) f.type = part.substr(colon + 1);
    out.push_back(f);
  }
  return out;
}

// Fills the formals' types and the constraints from the type table's row for the same version, when there is one
// with the same formals.
void add_types(Schema& s, const TypeRow& row) {
  const std::vector<Formal> inputs = formals(row.inputs), outputs = formals(row.outputs);
  if (inputs.size() != s.inputs.size() || outputs.size() != s.outputs.size()) return;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].name != s.inputs[k].name) return;
  }
  s.inputs = inputs;
  s.outputs = outputs;
  for (std::string_view part : split(row.constraints, ';')) {
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) continue;
    TypeConstraint c;
    c.name = part.substr(0, eq);
    c.allowed = split(part.substr(eq + 1), '|');
    s.constraints.push_back(std::move(c));
  }
  s.typed = true;
}

Schema schema_of(const Row& row) {
  Schema s;
  s.domain = row.domain;
  s.op_type = row.op_type;
  s.since_version = row.since_version;
  s.min_inputs = row.min_inputs;
  s.max_inputs = row.max_inputs;
  s.min_outputs = row.min_outputs;
  s.max_outputs = row.max_outputs;
  s.deprecated = row.deprecated != 0;
  s.inputs = formals(row.inputs);
  s.outputs = formals(row.outputs);
  for (std::string_view part : split(row.attributes)) {
    AttributeDecl a;
    if (!part.empty() && part.front() == '!') {
      a.required = true;
      part.remove_prefix(1);
    }
    const std::size_t eq = part.find('=');
    a.name = part.substr(0, eq);
    a.type = eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    s.attributes.push_back(a);
  }
  return s;
}

std::string key(std::string_view domain, std::string_view op_type) {
  std::string k(domain == "ai.onnx" ? std::string_view() : domain);
  k += '\n';
  k += op_type;
  return k;
}

// Every version of every operator, oldest first, by domain and operator.
const std::unordered_map<std::string, std::vector<Schema>>& table() {
  static const auto* const index = [] {
    std::map<std::pair<std::string, int>, const TypeRow*> types;
    for (const TypeRow& row : kTypeRows) types[{key(row.domain, row.op_type), row.since_version}] = &row;
    auto* m = new std::unordered_map<std::string, std::vector<Schema>>();
    for (const Row& row : kRows) {
      Schema s = schema_of(row);
      const auto typed = types.find({key(row.domain, row.op_type), row.since_version});
      if (typed != types.end()) add_types(s, *typed->second);
      (*m)[key(row.domain, row.op_type)].push_back(std::move(s));
    }
    for (auto& [k, versions] : *m) {
      std::sort(versions.begin(), versions.end(),
                [](const Schema& a, const Schema& b) { return a.since_version < b.since_version; });
    }
    return m;
  }();
  return *index;
}

}  // namespace

const TypeConstraint* Schema::constraint(std::string_view name) const {
  for (const TypeConstraint& c : constraints) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const AttributeDecl* Schema::attribute(std::string_view name) const {
  for (const AttributeDecl& a : attributes) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

const Schema* find(std::string_view domain, std::string_view op_type, std::int64_t opset) {
  const auto& t = table();
  const auto it = t.find(key(domain, op_type));
  if (it == t.end()) return nullptr;
  const Schema* found = nullptr;
  for (const Schema& s : it->second) {
    if (s.since_version <= opset) found = &s;
  }
  return found;
}

bool is_onnx_domain(std::string_view domain) {
  return domain.empty() || domain == "ai.onnx" || domain == "ai.onnx.ml" || domain == "ai.onnx.preview.training";
}

std::int64_t newest_opset(std::string_view domain) {
  if (domain.empty() || domain == "ai.onnx") return XPURT_ONNX_MAX_OPSET;
  if (domain == "ai.onnx.ml") return XPURT_ONNX_ML_MAX_OPSET;
  if (domain == "ai.onnx.preview.training") return XPURT_ONNX_TRAINING_MAX_OPSET;
  return 0;
}

std::int64_t newest_ir_version() { return XPURT_ONNX_MAX_IR_VERSION; }

const char* source() { return XPURT_ONNX_SCHEMA_SOURCE; }

const char* types_source() { return XPURT_ONNX_TYPES_SOURCE; }

std::optional<Arity> arity_of_any_version(std::string_view op_type) {
  static const auto* const arities = [] {
    auto* m = new std::map<std::string, Arity, std::less<>>();
    for (const auto& [k, versions] : table()) {
      if (k.empty() || k.front() != '\n') continue;  // the default domain only
      Arity a{versions.front().min_inputs, versions.front().max_inputs, versions.front().min_outputs,
              versions.front().max_outputs};
      for (const Schema& s : versions) {
        a.min_inputs = std::min(a.min_inputs, s.min_inputs);
        a.max_inputs = (a.max_inputs < 0 || s.max_inputs < 0) ? -1 : std::max(a.max_inputs, s.max_inputs);
        a.min_outputs = std::min(a.min_outputs, s.min_outputs);
        a.max_outputs = (a.max_outputs < 0 || s.max_outputs < 0) ? -1 : std::max(a.max_outputs, s.max_outputs);
      }
      (*m)[k.substr(1)] = a;
    }
    return m;
  }();
  const auto it = arities->find(op_type);
  if (it == arities->end()) return std::nullopt;
  return it->second;
}

}  // namespace xpuruntime::onnx_schema
