// ONNX's operator schemas, as the importer validates models against them (Note [Models checked against ONNX's
// schemas] in onnx_validate.cpp): per domain, operator and version, the arity of inputs and outputs, the formal
// parameters (required, optional, variadic) and the attributes with their types. The table is generated from the
// `onnx` Python package (scripts/gen_onnx_schemas.py -> onnx_schema_table.inc). Internal header of the ONNX frontend
// (src/cpp/frontends/onnx): the validator, both engines and the native graph passes read it.
//
// Ownership: the table is static and immutable. Thread-safety: every function may be called concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xpuruntime::onnx_schema {

// One formal input or output: its name, whether it is required, optional or variadic, and (for schemas with type
// information, Schema::typed) its type: a type variable of the schema's constraints ("T") or a type
// ("tensor(int64)"); a variadic one is `heterogeneous` when its values need not share one type (Loop's states).
struct Formal {
  enum class Kind { kRequired, kOptional, kVariadic };
  std::string_view name;
  Kind kind = Kind::kRequired;
  std::string_view type;
  bool heterogeneous = false;
};

// A type variable and the types it allows ("T" -> {"tensor(float)", "tensor(float16)", ...}).
struct TypeConstraint {
  std::string_view name;
  std::vector<std::string_view> allowed;
};

// One attribute a schema declares. `type` is ONNX's short code: "f", "i", "s", "t", "g", "tp", "st", and the list
// forms "fs", "is", "ss", "ts", "gs", "tps", "sts".
struct AttributeDecl {
  std::string_view name;
  std::string_view type;
  bool required = false;
};

// One version of one operator.
struct Schema {
  std::string_view domain;  // "" for ai.onnx
  std::string_view op_type;
  int since_version = 1;
  int min_inputs = 0, max_inputs = 0;    // max -1: variadic
  int min_outputs = 0, max_outputs = 0;  // max -1: variadic
  bool deprecated = false;
  std::vector<Formal> inputs, outputs;
  std::vector<AttributeDecl> attributes;
  // Whether the formals carry types and `constraints` is filled: the schema versions of the type table
  // (onnx_schema_types.inc, from an older onnx than the arity table: versions up to its newest opset).
  bool typed = false;
  std::vector<TypeConstraint> constraints;

  const AttributeDecl* attribute(std::string_view name) const;
  const TypeConstraint* constraint(std::string_view name) const;
};

// The schema of `op_type` in `domain` ("" or "ai.onnx" for the default domain) that a model importing `opset` of
// that domain uses: the newest version whose since_version <= opset. Null when the operator does not exist in that
// opset (or the domain is not one of ONNX's own).
const Schema* find(std::string_view domain, std::string_view op_type, std::int64_t opset);

// Whether `domain` is one whose operators this table lists (ai.onnx, ai.onnx.ml, ai.onnx.preview.training).
bool is_onnx_domain(std::string_view domain);
// The newest opset of an ONNX domain the table knows; 0 for other domains.
std::int64_t newest_opset(std::string_view domain);
// The newest IR version the table's source (the onnx package) knows.
std::int64_t newest_ir_version();
// "onnx 1.23.1": where the table came from; types_source(): where the type table came from.
const char* source();
const char* types_source();

// The arity every version of `op_type` (default domain) shares: the fewest inputs any version requires and the most
// any version takes (-1: variadic). Nullopt for an operator the table does not list. For graph passes, which match
// patterns without an opset at hand (Note [Patterns check arity] in passes/pass_utils.h).
struct Arity {
  int min_inputs = 0, max_inputs = 0, min_outputs = 0, max_outputs = 0;
};
std::optional<Arity> arity_of_any_version(std::string_view op_type);

}  // namespace xpuruntime::onnx_schema
