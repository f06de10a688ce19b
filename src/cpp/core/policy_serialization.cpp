// Policy file helpers (see policy_serialization.h).
#include "policy_serialization.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#if XPURT_WITH_YAML
#include <yaml-cpp/yaml.h>
#endif

#include "core/fnv1a.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::detail {

std::string fnv1a_hex(std::string_view text) {
  std::uint64_t hash = fnv1a(kFnv1aOffset, text.data(), text.size());
  static const char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int k = 15; k >= 0; --k) {
    out[k] = digits[hash & 0xf];
    hash >>= 4;
  }
  return out;
}

nlohmann::json parse_json_text(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for numbers past a double ('12e311', found by fuzz_policy and fuzz_autotune)
    throw InvalidArgumentError(str_cat(what, " is not valid JSON: ", e.what()));
  }
}

#if XPURT_WITH_YAML
namespace {

nlohmann::json yaml_to_json(const YAML::Node& node, const std::string& what) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item, what));
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& item : node) out[item.first.as<std::string>()] = yaml_to_json(item.second, what);
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string text = node.Scalar();
      if (node.Tag() == "!") return text;  // quoted in the file: a string
      if (text == "true" || text == "True") return true;
      if (text == "false" || text == "False") return false;
      if (text == "null" || text == "~") return nullptr;
      // Integers and floats exactly as JSON would read them.
      try {
        std::size_t used = 0;
        const long long integer = std::stoll(text, &used);
        if (used == text.size()) return integer;
        const double real = std::stod(text, &used);
        if (used == text.size()) return real;
      } catch (const std::exception&) {
      }
      return text;
    }
  }
  return nullptr;
}

void emit(YAML::Emitter& out, const nlohmann::json& tree) {
  if (tree.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, value] : tree.items()) {
      out << YAML::Key << key << YAML::Value;
      emit(out, value);
    }
    out << YAML::EndMap;
  } else if (tree.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& value : tree) emit(out, value);
    out << YAML::EndSeq;
  } else if (tree.is_string()) {
    const std::string text = tree.get<std::string>();
    // Strings that would read back as another type are quoted.
    const nlohmann::json reread = [&] {
      try {
        return yaml_to_json(YAML::Load(text), "");
      } catch (const std::exception&) {
        return nlohmann::json(text);
      }
    }();
    if (reread.is_string() && reread.get<std::string>() == text) {
      out << text;
    } else {
      out << YAML::DoubleQuoted << text;
    }
  } else if (tree.is_boolean()) {
    out << (tree.get<bool>() ? "true" : "false");
  } else if (tree.is_null()) {
    out << YAML::Null;
  } else {
    out << tree.dump();
  }
}

}  // namespace
#endif

std::string json_for_message(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json parse_yaml_text(const std::string& text, const std::string& what) {
#if XPURT_WITH_YAML
  // yaml-cpp takes any bytes; JSON (the trees every policy goes through) takes UTF-8 only. Found by fuzz_policy: a
  // key with a 0xFF byte made the error message's dump() throw nlohmann's type_error, an untyped exception.
  try {
    (void)nlohmann::json(text).dump();  // dump() refuses bytes that are not UTF-8
  } catch (const nlohmann::json::type_error&) {
    throw InvalidArgumentError(str_cat(what, " is not valid UTF-8 text"));
  }
  try {
    return yaml_to_json(YAML::Load(text), what);
  } catch (const YAML::Exception& e) {
    throw InvalidArgumentError(str_cat(what, " is not valid YAML: ", e.what()));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(str_cat(what, " is not a valid policy: ", e.what()));
  }
#else
  (void)text;
  throw UnsupportedOperationError(str_cat(what, ": this xpuruntime was built without yaml-cpp; install it "
                                          "(Debian: libyaml-cpp-dev) and rebuild, or use JSON"));
#endif
}

std::string to_yaml_text(const nlohmann::json& tree) {
#if XPURT_WITH_YAML
  YAML::Emitter out;
  out.SetIndent(2);
  emit(out, tree);
  return std::string(out.c_str()) + "\n";
#else
  (void)tree;
  throw UnsupportedOperationError("YAML output: this xpuruntime was built without yaml-cpp; install it "
                                  "(Debian: libyaml-cpp-dev) and rebuild, or use JSON");
#endif
}

std::string to_json_text(const nlohmann::json& tree) { return tree.dump(2) + "\n"; }

FileFormat format_of_path(const std::string& path, const std::string& what) {
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".json")) return FileFormat::kJson;
  if (ends_with(".yaml") || ends_with(".yml")) return FileFormat::kYaml;
  throw InvalidArgumentError(str_cat(what, " file '", path, "' must end in .json, .yaml or .yml"));
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw InvalidArgumentError(str_cat("cannot open ", what, " file '", path, "'"));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  return text;
}

void write_text_file(const std::string& path, const std::string& text, const std::string& what) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    if (!file) throw InvalidArgumentError(str_cat("cannot write ", what, " file '", path, "'"));
    file.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!file) throw InvalidArgumentError(str_cat("failed writing ", what, " file '", path, "'"));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw InvalidArgumentError(str_cat("cannot replace ", what, " file '", path, "'"));
  }
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k) out += (k ? ", " : "") + names[k];
  return out;
}

void check_keys(const nlohmann::json& object, const std::vector<std::string>& valid, const std::string& what) {
  if (!object.is_object()) {
    throw InvalidArgumentError(str_cat(what, " must be an object, got ", json_for_message(object)));
  }
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (const auto& name : valid) known = known || name == key;
    if (!known) {
      throw InvalidArgumentError(str_cat("unknown key '", key, "' in ", what, "; valid keys: ", join_names(valid)));
    }
  }
}

}  // namespace xpuruntime::detail
