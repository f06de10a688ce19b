// Internal helpers shared by the policy files (KernelPolicy, ExecutionPolicy, AutotuneCache): parsing JSON and
// YAML into one JSON tree (so one validation path serves both), canonical YAML emission, file I/O, and the
// fingerprint hash.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace xpuruntime::detail {

// 16 lowercase hex digits of the 64-bit FNV-1a hash of `text`.
std::string fnv1a_hex(std::string_view text);

// Parse errors become InvalidArgumentError naming `what` ("KernelPolicy JSON") and the position.
nlohmann::json parse_json_text(const std::string& text, const std::string& what);
// YAML scalars become JSON booleans (true/false), integers, floats or strings. UnsupportedOperationError when
// this build has no yaml-cpp.
nlohmann::json parse_yaml_text(const std::string& text, const std::string& what);
// Canonical YAML of a JSON tree: block mappings with keys in JSON (sorted) order, flow sequences, a final newline.
std::string to_yaml_text(const nlohmann::json& tree);
// Canonical JSON: keys sorted, 2-space indentation, a final newline.
std::string to_json_text(const nlohmann::json& tree);

enum class FileFormat { kJson, kYaml };
// From the extension (.json, .yaml, .yml); InvalidArgumentError otherwise.
FileFormat format_of_path(const std::string& path, const std::string& what);
std::string read_text_file(const std::string& path, const std::string& what);
// Writes through a temporary file and a rename, so a crash never leaves half a file.
void write_text_file(const std::string& path, const std::string& text, const std::string& what);

// A JSON value for an error message: never throws (bytes that are not UTF-8 are replaced), unlike dump().
std::string json_for_message(const nlohmann::json& value);

// Object-reading helpers: every key of `object` must be in `valid` (InvalidArgumentError listing them).
void check_keys(const nlohmann::json& object, const std::vector<std::string>& valid, const std::string& what);
std::string join_names(const std::vector<std::string>& names);

}  // namespace xpuruntime::detail
