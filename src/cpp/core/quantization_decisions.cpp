// QuantizationDecisions: reading and validating the decisions document (include/xpuruntime/quantization.h).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "policy_serialization.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/quantization.h"

namespace xpuruntime {

namespace {

// The keys the Python planner writes (xpuruntime/quantization/quantizer.py, plan()); every other key is refused,
// as in every policy document.
const std::vector<std::string> kTopKeys = {
    "activation_type", "activations", "biases", "block_size", "excluded", "format", "method", "model_sha256",
    "nodes", "num_bins", "op_types", "opset", "per_channel", "percentile", "precision", "quantize_bias", "weights"};
const std::vector<std::string> kRequiredKeys = {"activations", "biases", "excluded", "nodes", "weights"};
const std::vector<std::string> kActivationKeys = {"amax", "dtype", "max", "min", "scale", "threshold", "zero_point"};
const std::vector<std::string> kConstantKeys = {"axis", "block_size", "dtype", "scale", "scale_shape"};

[[noreturn]] void fail(const std::string& what, const std::string& message) {
  throw InvalidArgumentError(detail::str_cat(what, ": ", message));
}

float read_scale(const nlohmann::json& value, const std::string& where) {
  if (!value.is_number()) fail(where, "a scale must be a number, got " + detail::json_for_message(value));
  const float scale = static_cast<float>(value.get<double>());  // as numpy's float32(...) of the JSON number
  if (!std::isfinite(scale) || !(scale > 0.0f)) {
    fail(where, "a scale must be a positive finite float32, got " + detail::json_for_message(value));
  }
  return scale;
}

std::int64_t read_int(const nlohmann::json& value, const std::string& where) {
  if (!value.is_number_integer()) fail(where, "must be an integer, got " + detail::json_for_message(value));
  return value.get<std::int64_t>();
}

void check_one_of(const nlohmann::json& value, const std::vector<std::string>& valid, const std::string& where) {
  if (value.is_string()) {
    for (const auto& name : valid) {
      if (value.get<std::string>() == name) return;
    }
  }
  fail(where, detail::str_cat("must be one of ", detail::join_names(valid), ", got ", detail::json_for_message(value)));
}

QuantizedActivation read_activation(const nlohmann::json& entry, const std::string& where) {
  detail::check_keys(entry, kActivationKeys, where);
  for (const char* key : {"dtype", "scale", "zero_point"}) {
    if (!entry.contains(key)) fail(where, detail::str_cat("'", key, "' is missing"));
  }
  QuantizedActivation a;
  check_one_of(entry["dtype"], {"int8", "uint8", "float8e4m3fn"}, where + " dtype");
  a.dtype = entry["dtype"].get<std::string>();
  a.scale = read_scale(entry["scale"], where);
  a.zero_point = read_int(entry["zero_point"], where + " zero_point");
  const std::int64_t lo = a.dtype == "uint8" ? 0 : a.dtype == "int8" ? -128 : 0;
  const std::int64_t hi = a.dtype == "uint8" ? 255 : a.dtype == "int8" ? 127 : 0;
  if (a.zero_point < lo || a.zero_point > hi) {
    fail(where, detail::str_cat("zero_point ", a.zero_point, " is outside ", a.dtype, "'s [", lo, ", ", hi, "]"));
  }
  for (const char* key : {"min", "max", "amax", "threshold"}) {
    if (entry.contains(key) && !entry[key].is_number() && !entry[key].is_null()) {
      fail(where, detail::str_cat("'", key, "' must be a number, got ", detail::json_for_message(entry[key])));
    }
  }
  return a;
}

QuantizedConstant read_constant(const nlohmann::json& entry, const std::string& where, bool bias) {
  detail::check_keys(entry, kConstantKeys, where);
  for (const char* key : {"dtype", "scale"}) {
    if (!entry.contains(key)) fail(where, detail::str_cat("'", key, "' is missing"));
  }
  QuantizedConstant c;
  check_one_of(entry["dtype"], bias ? std::vector<std::string>{"int32"}
                                    : std::vector<std::string>{"int8", "float8e4m3fn", "int4"}, where + " dtype");
  c.dtype = entry["dtype"].get<std::string>();
  if (entry.contains("axis") && !entry["axis"].is_null()) {
    c.has_axis = true;
    c.axis = read_int(entry["axis"], where + " axis");
    if (c.axis < 0) fail(where, detail::str_cat("axis must be >= 0, got ", c.axis));
  }
  if (entry.contains("block_size") && !entry["block_size"].is_null()) {
    c.block_size = read_int(entry["block_size"], where + " block_size");
    if (c.block_size < 0) fail(where, detail::str_cat("block_size must be >= 0, got ", c.block_size));
  }
  if (c.dtype == "int4" && (c.block_size <= 0 || !c.has_axis)) fail(where, "int4 weights need an axis and a block_size");
  const nlohmann::json& scale = entry["scale"];
  if (scale.is_array()) {
    for (const auto& value : scale) c.scale.push_back(read_scale(value, where));
    c.scale_shape = {static_cast<std::int64_t>(c.scale.size())};
  } else {
    c.scale.push_back(read_scale(scale, where));
  }
  if (entry.contains("scale_shape")) {
    const nlohmann::json& shape = entry["scale_shape"];
    if (!shape.is_array()) fail(where, "scale_shape must be a list of dims, got " + detail::json_for_message(shape));
    c.scale_shape.clear();
    std::int64_t count = 1;
    for (const auto& dim : shape) {
      const std::int64_t d = read_int(dim, where + " scale_shape");
      if (d < 0) fail(where, "scale_shape dims must be >= 0");
      c.scale_shape.push_back(d);
      count *= d;
    }
    if (count != static_cast<std::int64_t>(c.scale.size())) {
      fail(where, detail::str_cat("scale_shape holds ", count, " scales, 'scale' has ", c.scale.size()));
    }
  }
  if (c.has_axis && c.block_size == 0 && !scale.is_array()) fail(where, "a scale per axis index needs a list of scales");
  return c;
}

void check_top_level(const nlohmann::json& tree, const std::string& what) {
  detail::check_keys(tree, kTopKeys, what);
  if (!tree.contains("format") || !tree["format"].is_string() ||
      tree["format"].get<std::string>() != QuantizationDecisions::kFormat) {
    fail(what, detail::str_cat("format must be \"", QuantizationDecisions::kFormat, "\", got ",
                               tree.contains("format") ? detail::json_for_message(tree["format"]) : "nothing"));
  }
  if (!tree.contains("precision")) fail(what, "'precision' is missing");
  check_one_of(tree["precision"], {"int8", "fp8", "int4-weights"}, what + ": precision");
  for (const auto& key : kRequiredKeys) {
    if (!tree.contains(key)) fail(what, detail::str_cat("'", key, "' is missing"));
  }
  for (const char* key : {"method", "activation_type", "model_sha256"}) {
    if (tree.contains(key) && !tree[key].is_null() && !tree[key].is_string()) {
      fail(what, detail::str_cat("'", key, "' must be a string, got ", detail::json_for_message(tree[key])));
    }
  }
  for (const char* key : {"num_bins", "block_size", "opset"}) {
    if (tree.contains(key) && !tree[key].is_null() && !tree[key].is_number_integer()) {
      fail(what, detail::str_cat("'", key, "' must be an integer, got ", detail::json_for_message(tree[key])));
    }
  }
  for (const char* key : {"per_channel", "quantize_bias"}) {
    if (tree.contains(key) && !tree[key].is_null() && !tree[key].is_boolean()) {
      fail(what, detail::str_cat("'", key, "' must be true or false, got ", detail::json_for_message(tree[key])));
    }
  }
  if (tree.contains("percentile") && !tree["percentile"].is_null() && !tree["percentile"].is_number()) {
    fail(what, "'percentile' must be a number, got " + detail::json_for_message(tree["percentile"]));
  }
  if (tree.contains("op_types")) {
    const auto& ops = tree["op_types"];
    bool ok = ops.is_array();
    for (const auto& op : ops) ok = ok && op.is_string();
    if (!ok) fail(what, "'op_types' must be a list of op types, got " + detail::json_for_message(ops));
  }
}

QuantizationDecisions from_tree(const nlohmann::json& tree, const std::string& what) {
  check_top_level(tree, what);
  QuantizationDecisions d;
  d.precision = tree["precision"].get<std::string>();
  if (tree.contains("model_sha256") && tree["model_sha256"].is_string()) {
    d.model_sha256 = tree["model_sha256"].get<std::string>();
  }
  const auto& nodes = tree["nodes"];
  if (!nodes.is_array()) fail(what, "'nodes' must be a list of node keys, got " + detail::json_for_message(nodes));
  for (const auto& node : nodes) {
    if (!node.is_string()) fail(what, "'nodes' must be a list of node keys, got " + detail::json_for_message(node));
    d.nodes.push_back(node.get<std::string>());
  }
  const auto& excluded = tree["excluded"];
  if (!excluded.is_object()) fail(what, "'excluded' must map node keys to reasons");
  for (const auto& [key, reason] : excluded.items()) {
    if (!reason.is_string()) fail(what, detail::str_cat("excluded '", key, "': the reason must be a string"));
    d.excluded.emplace_back(key, reason.get<std::string>());
  }
  for (const char* key : {"activations", "weights", "biases"}) {
    if (!tree[key].is_object()) fail(what, detail::str_cat("'", key, "' must map value names to entries"));
  }
  for (const auto& [name, entry] : tree["activations"].items()) {
    d.activations[name] = read_activation(entry, detail::str_cat(what, ": activation '", name, "'"));
  }
  for (const auto& [name, entry] : tree["weights"].items()) {
    d.weights[name] = read_constant(entry, detail::str_cat(what, ": weight '", name, "'"), false);
  }
  for (const auto& [name, entry] : tree["biases"].items()) {
    d.biases[name] = read_constant(entry, detail::str_cat(what, ": bias '", name, "'"), true);
  }
  return d;
}

}  // namespace

QuantizationDecisions QuantizationDecisions::from_json(const std::string& text, const std::string& what) {
  return from_tree(detail::parse_json_text(text, what), what);
}

std::string QuantizationDecisions::canonical_json(const std::string& text, const std::string& what) {
  const nlohmann::json tree = detail::parse_json_text(text, what);
  (void)from_tree(tree, what);
  return tree.dump();
}

std::string QuantizationDecisions::summary() const {
  return detail::str_cat("quantization: ", nodes.size(), " node", nodes.size() == 1 ? "" : "s", " quantized (",
                         precision, "), ", excluded.size(), " excluded");
}

int quantization_opset(const std::string& precision) {
  if (precision == "int8") return 13;
  if (precision == "fp8") return 19;
  if (precision == "int4-weights") return 21;
  throw InvalidArgumentError(detail::str_cat("quantization: precision must be int8, fp8 or int4-weights, got '",
                                             precision, "'"));
}

}  // namespace xpuruntime
