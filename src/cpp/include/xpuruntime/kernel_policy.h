// KernelPolicy: which kernel runs each op, written down.
//
// A policy maps policy keys — an op ("linear") or an op family ("matmul", which covers matmul and linear) —
// to a rule:
//   pinned    ["cublasLt"]            must use this kernel; UnsupportedOperationError (with its reason) if it
//                                     cannot run the op;
//   preferred ["cublasLt", "cublas"]  the first of these that supports the op, else the registry's order,
//                                     the fallback and its reason recorded in the decision;
//   auto      (strategy)              FirstSupported: the registry's priority order; BestPerformance: time every
//                                     supporting kernel on the real shapes and keep the fastest (cached).
// An op without a rule of its own uses its family's rule, else `auto` with `auto_strategy`.
//
// Serialization is canonical (keys sorted, every field written): the same policy gives the same bytes in JSON
// and in YAML, and `fingerprint()` identifies it. Loading validates against the KernelRegistry: unknown keys,
// ops, kernels, modes or strategies are rejected by InvalidArgumentError listing the valid choices.
//
// Ownership: a plain value. Thread-safety: like any value type.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "xpuruntime/export.h"

namespace xpuruntime {

class KernelRegistry;

enum class AutoSelectStrategy : unsigned char { kFirstSupported, kBestPerformance };
XPURT_API const char* strategy_name(AutoSelectStrategy strategy);  // "FirstSupported", "BestPerformance"
XPURT_API AutoSelectStrategy strategy_from_name(const std::string& name);

enum class RuleMode : unsigned char { kPinned, kPreferred, kAuto };
XPURT_API const char* rule_mode_name(RuleMode mode);  // "pinned", "preferred", "auto"
XPURT_API RuleMode rule_mode_from_name(const std::string& name);

struct XPURT_API KernelRule {
  RuleMode mode = RuleMode::kAuto;
  std::vector<std::string> kernels;  // pinned: exactly one; preferred: one or more, in order; auto: none
  AutoSelectStrategy strategy = AutoSelectStrategy::kFirstSupported;  // auto only

  static KernelRule pinned(const std::string& kernel);
  static KernelRule preferred(std::vector<std::string> kernels);
  static KernelRule automatic(AutoSelectStrategy strategy);
  // Short forms: "cublasLt" -> preferred; "auto" -> auto with `default_strategy`; "pin:cublasLt" or
  // "cublasLt!" -> pinned; "auto:BestPerformance" -> auto with that strategy.
  static KernelRule parse(const std::string& text, AutoSelectStrategy default_strategy);
  std::string str() const;  // the short form back: "cublasLt", "pin:cublasLt", "[cublasLt, cublas]", "auto"
  bool operator==(const KernelRule& other) const = default;
};

class XPURT_API KernelPolicy {
 public:
  KernelPolicy() = default;

  // Sets the rule for `key` (an op or family), validated against `registry` (default: the global one).
  KernelPolicy& set(const std::string& key, const KernelRule& rule, const KernelRegistry* registry = nullptr);
  KernelPolicy& set(const std::string& key, const std::string& short_form, const KernelRegistry* registry = nullptr);
  KernelPolicy& remove(const std::string& key);
  const KernelRule* get(const std::string& key) const;  // null when absent
  const std::map<std::string, KernelRule>& rules() const { return rules_; }

  AutoSelectStrategy auto_strategy() const { return auto_strategy_; }
  KernelPolicy& set_auto_strategy(AutoSelectStrategy strategy);

  // The rule that applies to `op` of `family`: the op's own, else the family's, else auto(auto_strategy).
  KernelRule resolve(const std::string& op, const std::string& family) const;
  // Checks every key and kernel name against `registry`; InvalidArgumentError listing the valid ones.
  void validate(const KernelRegistry& registry) const;

  std::string to_json() const;  // canonical, 2-space indented, ends with a newline
  std::string to_yaml() const;  // canonical
  // Parse and validate (against the global registry). Accepts the canonical form and short forms
  // ({"matmul": "cublasLt"} under "rules", a list for preferred, {"pinned": "x"}).
  static KernelPolicy from_json(const std::string& text);
  static KernelPolicy from_yaml(const std::string& text);
  void save(const std::string& path) const;  // by extension: .json, .yaml/.yml
  static KernelPolicy load(const std::string& path);
  std::string fingerprint() const;  // 16 hex digits of FNV-1a 64 over `to_json()`
  std::string str() const;          // "KernelPolicy(attention=pin:flash_v2, matmul=cublasLt)"

  bool operator==(const KernelPolicy& other) const = default;

 private:
  std::map<std::string, KernelRule> rules_;
  AutoSelectStrategy auto_strategy_ = AutoSelectStrategy::kFirstSupported;
};

}  // namespace xpuruntime
