// ExecutionPolicy: validation and canonical serialization.
#include "xpuruntime/execution_policy.h"

#include <cctype>
#include <cmath>

#include "policy_serialization.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/quantization.h"

namespace xpuruntime {

namespace {

constexpr const char* kSchema = "xpuruntime.execution_policy/1";
const std::vector<std::string> kKeys = {"allow_newer_opsets", "allow_spinning", "cuda_graphs", "deterministic",
                                        "fallback", "fp8_fast_accumulation", "intra_op_threads",
                                        "memory_limit", "precision",    "quantization", "schema",
                                        "static_shape",
                                        "tensor_parallel", "workspace_limit"};

std::string checked_fallback(const nlohmann::json& value) {
  if (!value.is_string() || (value.get<std::string>() != "error" && value.get<std::string>() != "cpu")) {
    throw InvalidArgumentError(
        detail::str_cat("ExecutionPolicy 'fallback' must be \"error\" or \"cpu\", got ", detail::json_for_message(value)));
  }
  return value.get<std::string>();
}

bool read_bool(const nlohmann::json& value, const char* key) {
  if (!value.is_boolean()) {
    throw InvalidArgumentError(detail::str_cat("ExecutionPolicy '", key, "' must be true or false, got ", detail::json_for_message(value)));
  }
  return value.get<bool>();
}

std::uint64_t read_size(const nlohmann::json& value, const char* key) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (v >= 0) return static_cast<std::uint64_t>(v);
  }
  if (value.is_string()) {
    try {
      return parse_byte_size(value.get<std::string>());
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(detail::str_cat("ExecutionPolicy '", key, "': ", e.what()));
    }
  }
  throw InvalidArgumentError(detail::str_cat("ExecutionPolicy '", key,
                                             "' must be a byte count (an integer >= 0 or a string like \"256MiB\"), "
                                             "got ", detail::json_for_message(value)));
}

nlohmann::json to_tree(const ExecutionPolicy& p) {
  nlohmann::json tree = nlohmann::json::object();
  tree["schema"] = kSchema;
  tree["precision"] = precision_name(p.precision);
  tree["deterministic"] = p.deterministic;
  tree["cuda_graphs"] = p.cuda_graphs;
  tree["static_shape"] = p.static_shape;
  tree["workspace_limit"] = p.workspace_limit;
  tree["memory_limit"] = p.memory_limit;
  tree["intra_op_threads"] = p.intra_op_threads;
  tree["fallback"] = p.fallback;
  tree["tensor_parallel"] = p.tensor_parallel;
  if (p.allow_newer_opsets) tree["allow_newer_opsets"] = true;
  if (!p.allow_spinning) tree["allow_spinning"] = false;
  if (p.fp8_fast_accumulation) tree["fp8_fast_accumulation"] = true;
  if (!p.quantization.empty()) {
    const std::string what = "ExecutionPolicy 'quantization'";
    tree["quantization"] = detail::parse_json_text(QuantizationDecisions::canonical_json(p.quantization, what), what);
  }
  return tree;
}

ExecutionPolicy from_tree(const nlohmann::json& tree) {
  detail::check_keys(tree, kKeys, "ExecutionPolicy");
  ExecutionPolicy p;
  if (tree.contains("schema")) {
    const auto& schema = tree["schema"];
    if (!schema.is_string() || schema.get<std::string>() != kSchema) {
      throw InvalidArgumentError(detail::str_cat("ExecutionPolicy schema must be \"", kSchema, "\", got ",
                                                 detail::json_for_message(schema)));
    }
  }
  if (tree.contains("precision")) {
    if (!tree["precision"].is_string()) {
      throw InvalidArgumentError(detail::str_cat("ExecutionPolicy 'precision' must be a string, got ",
                                                 detail::json_for_message(tree["precision"])));
    }
    p.precision = precision_from_name(tree["precision"].get<std::string>());
  }
  if (tree.contains("deterministic")) p.deterministic = read_bool(tree["deterministic"], "deterministic");
  if (tree.contains("cuda_graphs")) p.cuda_graphs = read_bool(tree["cuda_graphs"], "cuda_graphs");
  if (tree.contains("static_shape")) p.static_shape = read_bool(tree["static_shape"], "static_shape");
  if (tree.contains("workspace_limit")) p.workspace_limit = read_size(tree["workspace_limit"], "workspace_limit");
  if (tree.contains("memory_limit")) p.memory_limit = read_size(tree["memory_limit"], "memory_limit");
  if (tree.contains("fallback")) p.fallback = checked_fallback(tree["fallback"]);
  if (tree.contains("allow_newer_opsets")) {
    p.allow_newer_opsets = read_bool(tree["allow_newer_opsets"], "allow_newer_opsets");
  }
  if (tree.contains("allow_spinning")) p.allow_spinning = read_bool(tree["allow_spinning"], "allow_spinning");
  if (tree.contains("fp8_fast_accumulation")) {
    p.fp8_fast_accumulation = read_bool(tree["fp8_fast_accumulation"], "fp8_fast_accumulation");
  }
  if (tree.contains("quantization") && !tree["quantization"].is_null()) {
    p.quantization = QuantizationDecisions::canonical_json(tree["quantization"].dump(), "ExecutionPolicy 'quantization'");
  }
  if (tree.contains("intra_op_threads")) {
    const auto& value = tree["intra_op_threads"];
    if (!value.is_number_integer() || value.get<std::int64_t>() < 0 || value.get<std::int64_t>() > 4096) {
      throw InvalidArgumentError(detail::str_cat("ExecutionPolicy 'intra_op_threads' must be an integer from 0 "
                                                 "(all cores) to 4096, got ", detail::json_for_message(value)));
    }
    p.intra_op_threads = value.get<int>();
  }
  if (tree.contains("tensor_parallel")) {
    const auto& value = tree["tensor_parallel"];
    if (!value.is_number_integer() || value.get<std::int64_t>() < 1 || value.get<std::int64_t>() > 64) {
      throw InvalidArgumentError(detail::str_cat("ExecutionPolicy 'tensor_parallel' must be an integer from 1 to 64, "
                                                 "got ", detail::json_for_message(value)));
    }
    p.tensor_parallel = value.get<int>();
  }
  return p;
}

}  // namespace

Precision precision_from_name(const std::string& name) {
  for (const Precision p : {Precision::kFP32, Precision::kTF32, Precision::kFP16, Precision::kBF16, Precision::kInt8,
                            Precision::kFP8, Precision::kInt4Weights}) {
    if (name == precision_name(p)) return p;
  }
  throw InvalidArgumentError(detail::str_cat("unknown precision '", name,
                                             "'; valid precisions: fp32, tf32, fp16, bf16, int8, fp8, int4-weights"));
}

std::uint64_t parse_byte_size(const std::string& text) {
  std::size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  const std::string number = text.substr(0, pos);
  std::string unit = text.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double value = 0;
  bool ok = !number.empty();
  if (ok) {
    try {
      std::size_t used = 0;
      value = std::stod(number, &used);
      ok = used == number.size();
    } catch (const std::exception&) {
      ok = false;
    }
  }
  static const std::pair<const char*, double> units[] = {
      {"", 1.0},           {"B", 1.0},           {"KB", 1e3},          {"MB", 1e6},          {"GB", 1e9},
      {"TB", 1e12},        {"KiB", 1024.0},      {"MiB", 1048576.0},   {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}};
  double scale = -1;
  for (const auto& [name, factor] : units) {
    if (unit == name) scale = factor;
  }
  if (!ok || scale < 0 || !std::isfinite(value * scale) || value * scale > 1.8e19) {
    throw InvalidArgumentError(detail::str_cat("invalid byte size '", text,
                                               "'; use an integer or a number with a unit: B, KB, MB, GB, TB, KiB, "
                                               "MiB, GiB, TiB (e.g. \"256MiB\")"));
  }
  return static_cast<std::uint64_t>(std::llround(value * scale));
}

std::string ExecutionPolicy::to_json() const { return detail::to_json_text(to_tree(*this)); }
std::string ExecutionPolicy::to_yaml() const { return detail::to_yaml_text(to_tree(*this)); }

ExecutionPolicy ExecutionPolicy::from_json(const std::string& text) {
  return from_tree(detail::parse_json_text(text, "ExecutionPolicy JSON"));
}

ExecutionPolicy ExecutionPolicy::from_yaml(const std::string& text) {
  return from_tree(detail::parse_yaml_text(text, "ExecutionPolicy YAML"));
}

void ExecutionPolicy::save(const std::string& path) const {
  const auto format = detail::format_of_path(path, "ExecutionPolicy");
  detail::write_text_file(path, format == detail::FileFormat::kJson ? to_json() : to_yaml(), "ExecutionPolicy");
}

ExecutionPolicy ExecutionPolicy::load(const std::string& path) {
  const auto format = detail::format_of_path(path, "ExecutionPolicy");
  const std::string text = detail::read_text_file(path, "ExecutionPolicy");
  try {
    return format == detail::FileFormat::kJson ? from_json(text) : from_yaml(text);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(detail::str_cat(path, ": ", e.what()));
  }
}

std::string ExecutionPolicy::fingerprint() const { return detail::fnv1a_hex(to_json()); }

std::string ExecutionPolicy::str() const {
  return detail::str_cat("ExecutionPolicy(precision=", precision_name(precision),
                         ", deterministic=", deterministic ? "true" : "false",
                         ", cuda_graphs=", cuda_graphs ? "true" : "false",
                         ", static_shape=", static_shape ? "true" : "false", ", workspace_limit=", workspace_limit,
                         ", memory_limit=", memory_limit, ", intra_op_threads=", intra_op_threads,
                         ", fallback=", fallback, ", tensor_parallel=", tensor_parallel,
                         allow_newer_opsets ? ", allow_newer_opsets=true" : "",
                         allow_spinning ? "" : ", allow_spinning=false",
                         fp8_fast_accumulation ? ", fp8_fast_accumulation=true" : "",
                         quantization.empty() ? "" : ", quantization=<decisions>", ")");
}

}  // namespace xpuruntime
