// KernelPolicy: rules, validation against the registry, canonical serialization.
#include "xpuruntime/kernel_policy.h"

#include <algorithm>

#include "policy_serialization.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

constexpr const char* kSchema = "xpuruntime.kernel_policy/1";

nlohmann::json rule_to_tree(const KernelRule& rule) {
  nlohmann::json tree = nlohmann::json::object();
  tree["mode"] = rule_mode_name(rule.mode);
  if (rule.mode == RuleMode::kAuto) {
    tree["strategy"] = strategy_name(rule.strategy);
  } else {
    tree["kernels"] = rule.kernels;
  }
  return tree;
}

std::vector<std::string> string_list(const nlohmann::json& value, const std::string& what) {
  std::vector<std::string> out;
  if (value.is_string()) return {value.get<std::string>()};
  if (!value.is_array()) {
    throw InvalidArgumentError(detail::str_cat(what, " must be a kernel name or a list of kernel names, got ",
                                               detail::json_for_message(value)));
  }
  for (const auto& item : value) {
    if (!item.is_string()) {
      throw InvalidArgumentError(detail::str_cat(what, " must list kernel names (strings), got ", detail::json_for_message(item)));
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

KernelRule rule_from_tree(const nlohmann::json& value, const std::string& key, AutoSelectStrategy default_strategy) {
  const std::string what = "KernelPolicy rule '" + key + "'";
  if (value.is_string()) return KernelRule::parse(value.get<std::string>(), default_strategy);
  if (value.is_array()) return KernelRule::preferred(string_list(value, what));
  if (!value.is_object()) {
    throw InvalidArgumentError(detail::str_cat(what, " must be a kernel name, a list of kernel names or an object "
                                               "{\"mode\": ..., \"kernels\": [...]}, got ", detail::json_for_message(value)));
  }
  // Short objects: {"pinned": "x"}, {"preferred": ["x", "y"]}, {"auto": "BestPerformance"}.
  if (value.size() == 1 && value.contains("pinned")) {
    const auto kernels = string_list(value["pinned"], what);
    if (kernels.size() != 1) throw InvalidArgumentError(detail::str_cat(what, ": pinned takes exactly one kernel"));
    return KernelRule::pinned(kernels[0]);
  }
  if (value.size() == 1 && value.contains("preferred")) return KernelRule::preferred(string_list(value["preferred"], what));
  if (value.size() == 1 && value.contains("auto")) {
    if (!value["auto"].is_string()) throw InvalidArgumentError(detail::str_cat(what, ": auto takes a strategy name"));
    return KernelRule::automatic(strategy_from_name(value["auto"].get<std::string>()));
  }
  detail::check_keys(value, {"kernels", "mode", "strategy"}, what);
  if (!value.contains("mode") || !value["mode"].is_string()) {
    throw InvalidArgumentError(detail::str_cat(what, " needs \"mode\": one of pinned, preferred, auto"));
  }
  KernelRule rule;
  rule.mode = rule_mode_from_name(value["mode"].get<std::string>());
  if (rule.mode == RuleMode::kAuto) {
    if (value.contains("kernels") && !value["kernels"].empty()) {
      throw InvalidArgumentError(detail::str_cat(what, ": mode auto takes no kernels (it chooses among all)"));
    }
    rule.strategy = default_strategy;
    if (value.contains("strategy")) {
      if (!value["strategy"].is_string()) throw InvalidArgumentError(detail::str_cat(what, ": strategy must be a string"));
      rule.strategy = strategy_from_name(value["strategy"].get<std::string>());
    }
    return rule;
  }
  if (value.contains("strategy")) {
    throw InvalidArgumentError(detail::str_cat(what, ": 'strategy' only applies to mode auto"));
  }
  if (!value.contains("kernels")) throw InvalidArgumentError(detail::str_cat(what, " needs \"kernels\""));
  rule.kernels = string_list(value["kernels"], what);
  if (rule.mode == RuleMode::kPinned && rule.kernels.size() != 1) {
    throw InvalidArgumentError(detail::str_cat(what, ": pinned takes exactly one kernel, got ", rule.kernels.size()));
  }
  if (rule.kernels.empty()) throw InvalidArgumentError(detail::str_cat(what, ": preferred needs at least one kernel"));
  return rule;
}

void validate_rule(const std::string& key, const KernelRule& rule, const KernelRegistry& registry) {
  if (!registry.is_policy_key(key)) {
    throw InvalidArgumentError(detail::str_cat("unknown op '", key, "' in KernelPolicy; valid ops and op families: ",
                                               detail::join_names(registry.policy_keys())));
  }
  const auto valid = registry.kernel_names(key);
  for (const auto& kernel : rule.kernels) {
    if (std::find(valid.begin(), valid.end(), kernel) == valid.end()) {
      throw InvalidArgumentError(detail::str_cat("unknown kernel '", kernel, "' for '", key,
                                                 "' in KernelPolicy; valid kernels: ", detail::join_names(valid),
                                                 " (or \"auto\")"));
    }
  }
  if (rule.mode == RuleMode::kPinned && rule.kernels.size() != 1) {
    throw InvalidArgumentError(detail::str_cat("KernelPolicy rule '", key, "': pinned takes exactly one kernel"));
  }
  if (rule.mode == RuleMode::kPreferred && rule.kernels.empty()) {
    throw InvalidArgumentError(detail::str_cat("KernelPolicy rule '", key, "': preferred needs at least one kernel"));
  }
}

KernelPolicy from_tree(const nlohmann::json& tree) {
  if (!tree.is_object()) {
    throw InvalidArgumentError(detail::str_cat("a KernelPolicy must be an object, got ", detail::json_for_message(tree)));
  }
  const KernelRegistry& registry = KernelRegistry::global();
  KernelPolicy policy;
  if (tree.contains("auto_strategy")) {
    if (!tree["auto_strategy"].is_string()) {
      throw InvalidArgumentError(detail::str_cat("KernelPolicy 'auto_strategy' must be a string, got ",
                                                 detail::json_for_message(tree["auto_strategy"])));
    }
    policy.set_auto_strategy(strategy_from_name(tree["auto_strategy"].get<std::string>()));
  }
  for (const auto& [key, value] : tree.items()) {
    if (key == "auto_strategy") continue;
    if (key == "schema") {
      if (!value.is_string() || value.get<std::string>() != kSchema) {
        throw InvalidArgumentError(detail::str_cat("KernelPolicy schema must be \"", kSchema, "\", got ", detail::json_for_message(value)));
      }
      continue;
    }
    if (key == "rules") {
      if (!value.is_object()) {
        throw InvalidArgumentError(detail::str_cat("KernelPolicy 'rules' must be an object, got ", detail::json_for_message(value)));
      }
      for (const auto& [op, rule] : value.items()) {
        policy.set(op, rule_from_tree(rule, op, policy.auto_strategy()), &registry);
      }
      continue;
    }
    if (registry.is_policy_key(key)) {  // short form: rules at the top level
      policy.set(key, rule_from_tree(value, key, policy.auto_strategy()), &registry);
      continue;
    }
    throw InvalidArgumentError(detail::str_cat("unknown key '", key,
                                               "' in KernelPolicy; valid keys: auto_strategy, rules, schema, or an "
                                               "op / op family: ", detail::join_names(registry.policy_keys())));
  }
  return policy;
}

}  // namespace

const char* strategy_name(AutoSelectStrategy strategy) {
  return strategy == AutoSelectStrategy::kBestPerformance ? "BestPerformance" : "FirstSupported";
}

AutoSelectStrategy strategy_from_name(const std::string& name) {
  if (name == "FirstSupported") return AutoSelectStrategy::kFirstSupported;
  if (name == "BestPerformance") return AutoSelectStrategy::kBestPerformance;
  throw InvalidArgumentError(
      detail::str_cat("unknown auto strategy '", name, "'; valid strategies: FirstSupported, BestPerformance"));
}

const char* rule_mode_name(RuleMode mode) {
  switch (mode) {
    case RuleMode::kPinned: return "pinned";
    case RuleMode::kPreferred: return "preferred";
    case RuleMode::kAuto: return "auto";
  }
  return "auto";
}

RuleMode rule_mode_from_name(const std::string& name) {
  if (name == "pinned") return RuleMode::kPinned;
  if (name == "preferred") return RuleMode::kPreferred;
  if (name == "auto") return RuleMode::kAuto;
  throw InvalidArgumentError(detail::str_cat("unknown rule mode '", name, "'; valid modes: pinned, preferred, auto"));
}

KernelRule KernelRule::pinned(const std::string& kernel) { return KernelRule{RuleMode::kPinned, {kernel}, {}}; }

KernelRule KernelRule::preferred(std::vector<std::string> kernels) {
  XPURT_CHECK(!kernels.empty(), "a preferred rule needs at least one kernel");
  return KernelRule{RuleMode::kPreferred, std::move(kernels), {}};
}

KernelRule KernelRule::automatic(AutoSelectStrategy strategy) { return KernelRule{RuleMode::kAuto, {}, strategy}; }

KernelRule KernelRule::parse(const std::string& text, AutoSelectStrategy default_strategy) {
  XPURT_CHECK(!text.empty(), "an empty kernel name is not a rule; use a kernel name, \"pin:<kernel>\" or \"auto\"");
  if (text == "auto") return automatic(default_strategy);
  if (text.rfind("auto:", 0) == 0) return automatic(strategy_from_name(text.substr(5)));
  if (text.rfind("pin:", 0) == 0) return pinned(text.substr(4));
  if (text.back() == '!') return pinned(text.substr(0, text.size() - 1));
  return preferred({text});
}

std::string KernelRule::str() const {
  switch (mode) {
    case RuleMode::kPinned: return "pin:" + kernels.at(0);
    case RuleMode::kPreferred:
      return kernels.size() == 1 ? kernels[0] : "[" + detail::join_names(kernels) + "]";
    case RuleMode::kAuto:
      return strategy == AutoSelectStrategy::kFirstSupported ? "auto" : std::string("auto:") + strategy_name(strategy);
  }
  return "auto";
}

KernelPolicy& KernelPolicy::set(const std::string& key, const KernelRule& rule, const KernelRegistry* registry) {
  validate_rule(key, rule, registry ? *registry : KernelRegistry::global());
  rules_[key] = rule;
  return *this;
}

KernelPolicy& KernelPolicy::set(const std::string& key, const std::string& short_form, const KernelRegistry* registry) {
  return set(key, KernelRule::parse(short_form, auto_strategy_), registry);
}

KernelPolicy& KernelPolicy::remove(const std::string& key) {
  rules_.erase(key);
  return *this;
}

const KernelRule* KernelPolicy::get(const std::string& key) const {
  const auto it = rules_.find(key);
  return it == rules_.end() ? nullptr : &it->second;
}

KernelPolicy& KernelPolicy::set_auto_strategy(AutoSelectStrategy strategy) {
  auto_strategy_ = strategy;
  return *this;
}

KernelRule KernelPolicy::resolve(const std::string& op, const std::string& family) const {
  if (const KernelRule* rule = get(op)) return *rule;
  if (const KernelRule* rule = get(family)) return *rule;
  return KernelRule::automatic(auto_strategy_);
}

void KernelPolicy::validate(const KernelRegistry& registry) const {
  for (const auto& [key, rule] : rules_) validate_rule(key, rule, registry);
}

std::string KernelPolicy::to_json() const {
  nlohmann::json tree = nlohmann::json::object();
  tree["schema"] = kSchema;
  tree["auto_strategy"] = strategy_name(auto_strategy_);
  tree["rules"] = nlohmann::json::object();
  for (const auto& [key, rule] : rules_) tree["rules"][key] = rule_to_tree(rule);
  return detail::to_json_text(tree);
}

std::string KernelPolicy::to_yaml() const {
  return detail::to_yaml_text(detail::parse_json_text(to_json(), "KernelPolicy"));
}

KernelPolicy KernelPolicy::from_json(const std::string& text) {
  return from_tree(detail::parse_json_text(text, "KernelPolicy JSON"));
}

KernelPolicy KernelPolicy::from_yaml(const std::string& text) {
  return from_tree(detail::parse_yaml_text(text, "KernelPolicy YAML"));
}

void KernelPolicy::save(const std::string& path) const {
  const auto format = detail::format_of_path(path, "KernelPolicy");
  detail::write_text_file(path, format == detail::FileFormat::kJson ? to_json() : to_yaml(), "KernelPolicy");
}

KernelPolicy KernelPolicy::load(const std::string& path) {
  const auto format = detail::format_of_path(path, "KernelPolicy");
  const std::string text = detail::read_text_file(path, "KernelPolicy");
  try {
    return format == detail::FileFormat::kJson ? from_json(text) : from_yaml(text);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(detail::str_cat(path, ": ", e.what()));
  }
}

std::string KernelPolicy::fingerprint() const { return detail::fnv1a_hex(to_json()); }

std::string KernelPolicy::str() const {
  std::string out = "KernelPolicy(";
  bool first = true;
  for (const auto& [key, rule] : rules_) {
    out += (first ? "" : ", ") + key + "=" + rule.str();
    first = false;
  }
  if (auto_strategy_ != AutoSelectStrategy::kFirstSupported) {
    out += std::string(first ? "" : ", ") + "auto_strategy=" + strategy_name(auto_strategy_);
  }
  return out + ")";
}

}  // namespace xpuruntime
