// KernelPolicy, ExecutionPolicy and their enums. The Python classes in xpuruntime.policies subclass these.
#include <pybind11/stl.h>

#include "bindings.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/quantization.h"

namespace xpuruntime::bindings {

namespace {

py::dict rule_dict(const KernelRule& rule) {
  py::dict d;
  d["mode"] = rule_mode_name(rule.mode);
  if (rule.mode == RuleMode::kAuto) {
    d["strategy"] = strategy_name(rule.strategy);
  } else {
    d["kernels"] = rule.kernels;
  }
  return d;
}

// The QDQ writer (include/xpuruntime/quantization.h), which xpuruntime.quantization calls.
void bind_quantization(py::module_& m) {
  m.def("apply_quantization",
        [](const py::bytes& model, const std::string& decisions_json, const std::vector<std::string>& skip_nodes,
           const std::string& model_dir) {
          const QuantizationDecisions decisions = QuantizationDecisions::from_json(decisions_json, "decisions");
          ApplyQuantizationOptions options;
          options.skip_nodes = skip_nodes;
          options.model_dir = model_dir;
          std::string bytes = model;
          std::string out;
          {
            py::gil_scoped_release release;
            out = apply_quantization(bytes, decisions, options);
          }
          return py::bytes(out);
        },
        py::arg("model"), py::arg("decisions_json"), py::arg("skip_nodes") = std::vector<std::string>{},
        py::arg("model_dir") = "",
        "The QDQ model (bytes) of a serialized float ONNX model under quantization decisions (JSON text).");
  m.def("upgrade_opset",
        [](const py::bytes& model, int needed, const std::string& why) {
          int version = 0;
          const std::string out = upgrade_opset(std::string(model), needed, why, &version);
          return py::make_tuple(py::bytes(out), version);
        },
        py::arg("model"), py::arg("needed"), py::arg("why"),
        "(model bytes with the default-domain opset raised to at least `needed`, the opset afterwards).");
}

}  // namespace

void bind_policies(py::module_& m) {
  py::class_<KernelPolicy>(m, "KernelPolicy", "Which kernel runs each op (see xpuruntime.KernelPolicy).")
      .def(py::init<>())
      .def("set", [](KernelPolicy& p, const std::string& key, const std::string& rule) -> KernelPolicy& {
             return p.set(key, rule);
           },
           py::arg("key"), py::arg("rule"), py::return_value_policy::reference_internal,
           "Sets a rule from its short form: 'cublasLt', 'pin:cublasLt', 'auto', 'auto:BestPerformance'.")
      .def("set_rule",
           [](KernelPolicy& p, const std::string& key, const std::string& mode, const std::vector<std::string>& kernels,
              const std::string& strategy) -> KernelPolicy& {
             KernelRule rule;
             rule.mode = rule_mode_from_name(mode);
             rule.kernels = kernels;
             rule.strategy = strategy.empty() ? p.auto_strategy() : strategy_from_name(strategy);
             return p.set(key, rule);
           },
           py::arg("key"), py::arg("mode"), py::arg("kernels") = std::vector<std::string>{},
           py::arg("strategy") = "", py::return_value_policy::reference_internal)
      .def("remove", &KernelPolicy::remove, py::arg("key"), py::return_value_policy::reference_internal)
      .def("get", [](const KernelPolicy& p, const std::string& key) -> py::object {
             const KernelRule* rule = p.get(key);
             return rule ? py::object(py::str(rule->str())) : py::object(py::none());
           }, py::arg("key"), "The rule of `key` in short form, or None.")
      .def("get_rule", [](const KernelPolicy& p, const std::string& key) -> py::object {
             const KernelRule* rule = p.get(key);
             return rule ? py::object(rule_dict(*rule)) : py::object(py::none());
           }, py::arg("key"))
      .def("resolve", [](const KernelPolicy& p, const std::string& op, const std::string& family) {
             return rule_dict(p.resolve(op, family));
           }, py::arg("op"), py::arg("family"))
      .def("short_forms", [](const KernelPolicy& p) {
             py::dict d;
             for (const auto& [key, rule] : p.rules()) d[py::str(key)] = rule.str();
             return d;
           })
      .def("rule_dicts", [](const KernelPolicy& p) {
             py::dict d;
             for (const auto& [key, rule] : p.rules()) d[py::str(key)] = rule_dict(rule);
             return d;
           })
      .def_property("auto_strategy", [](const KernelPolicy& p) { return std::string(strategy_name(p.auto_strategy())); },
                    [](KernelPolicy& p, const std::string& name) { p.set_auto_strategy(strategy_from_name(name)); })
      .def("assign", [](KernelPolicy& p, const KernelPolicy& other) { p = other; }, py::arg("other"))
      .def("to_json", &KernelPolicy::to_json)
      .def("to_yaml", &KernelPolicy::to_yaml)
      .def_static("_from_json", &KernelPolicy::from_json, py::arg("text"))
      .def_static("_from_yaml", &KernelPolicy::from_yaml, py::arg("text"))
      .def_static("_load", &KernelPolicy::load, py::arg("path"))
      .def("save", &KernelPolicy::save, py::arg("path"))
      .def_property_readonly("fingerprint", &KernelPolicy::fingerprint)
      .def("__eq__", [](const KernelPolicy& a, const KernelPolicy& b) { return a == b; })
      .def("__repr__", &KernelPolicy::str);

  py::class_<ExecutionPolicy>(m, "ExecutionPolicy", "How a run executes (see xpuruntime.ExecutionPolicy).")
      .def(py::init<>())
      .def_property("precision", [](const ExecutionPolicy& p) { return std::string(precision_name(p.precision)); },
                    [](ExecutionPolicy& p, const std::string& name) { p.precision = precision_from_name(name); })
      .def_readwrite("deterministic", &ExecutionPolicy::deterministic)
      .def_readwrite("cuda_graphs", &ExecutionPolicy::cuda_graphs)
      .def_readwrite("static_shape", &ExecutionPolicy::static_shape)
      .def_property("workspace_limit", [](const ExecutionPolicy& p) { return p.workspace_limit; },
                    [](ExecutionPolicy& p, const py::object& v) {
                      p.workspace_limit = py::isinstance<py::str>(v) ? parse_byte_size(v.cast<std::string>())
                                                                     : v.cast<std::uint64_t>();
                    })
      .def_property("memory_limit", [](const ExecutionPolicy& p) { return p.memory_limit; },
                    [](ExecutionPolicy& p, const py::object& v) {
                      p.memory_limit = py::isinstance<py::str>(v) ? parse_byte_size(v.cast<std::string>())
                                                                  : v.cast<std::uint64_t>();
                    })
      .def_property("intra_op_threads", [](const ExecutionPolicy& p) { return p.intra_op_threads; },
                    [](ExecutionPolicy& p, int v) {
                      XPURT_CHECK(v >= 0 && v <= 4096, "intra_op_threads must be from 0 (all cores) to 4096, got ", v);
                      p.intra_op_threads = v;
                    })
      .def_property("fallback", [](const ExecutionPolicy& p) { return p.fallback; },
                    [](ExecutionPolicy& p, const std::string& v) {
                      if (v != "error" && v != "cpu") {
                        throw InvalidArgumentError("ExecutionPolicy 'fallback' must be \"error\" or \"cpu\", got '" + v +
                                                   "'");
                      }
                      p.fallback = v;
                    })
      .def_property("tensor_parallel", [](const ExecutionPolicy& p) { return p.tensor_parallel; },
                    [](ExecutionPolicy& p, int v) {
                      XPURT_CHECK(v >= 1 && v <= 64, "ExecutionPolicy 'tensor_parallel' must be from 1 to 64, got ", v);
                      p.tensor_parallel = v;
                    })
      .def_readwrite("allow_newer_opsets", &ExecutionPolicy::allow_newer_opsets)
      .def_readwrite("allow_spinning", &ExecutionPolicy::allow_spinning)
      .def_readwrite("fp8_fast_accumulation", &ExecutionPolicy::fp8_fast_accumulation)
      // The decisions as canonical JSON ("" for none); xpuruntime.ExecutionPolicy's `quantization` maps onto it.
      .def_property("_quantization_json", [](const ExecutionPolicy& p) { return p.quantization; },
                    [](ExecutionPolicy& p, const std::string& text) {
                      p.quantization = text.empty() ? std::string()
                                                    : QuantizationDecisions::canonical_json(
                                                          text, "ExecutionPolicy 'quantization'");
                    })
      .def("assign", [](ExecutionPolicy& p, const ExecutionPolicy& other) { p = other; }, py::arg("other"))
      .def("to_json", &ExecutionPolicy::to_json)
      .def("to_yaml", &ExecutionPolicy::to_yaml)
      .def_static("_from_json", &ExecutionPolicy::from_json, py::arg("text"))
      .def_static("_from_yaml", &ExecutionPolicy::from_yaml, py::arg("text"))
      .def_static("_load", &ExecutionPolicy::load, py::arg("path"))
      .def("save", &ExecutionPolicy::save, py::arg("path"))
      .def_property_readonly("fingerprint", &ExecutionPolicy::fingerprint)
      .def("__eq__", [](const ExecutionPolicy& a, const ExecutionPolicy& b) { return a == b; })
      .def("__repr__", &ExecutionPolicy::str);

  m.def("parse_byte_size", &parse_byte_size, py::arg("text"), "'256MiB' -> 268435456");
  bind_quantization(m);
}

}  // namespace xpuruntime::bindings
