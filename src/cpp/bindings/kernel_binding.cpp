// The kernel registry, the dispatcher, decisions, the autotune cache and the functional ops' entry point.
#include <pybind11/stl.h>

#include "bindings.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/ops.h"

namespace xpuruntime::bindings {

namespace {

Attributes to_attributes(const py::handle& obj) {
  Attributes attrs;
  if (obj.is_none()) return attrs;
  XPURT_CHECK_TYPE(py::isinstance<py::dict>(obj), "attrs must be a dict, got ",
                   py::str(py::type::of(obj)).cast<std::string>());
  for (const auto& [key_obj, value] : obj.cast<py::dict>()) {
    const std::string key = py::str(key_obj).cast<std::string>();
    if (py::isinstance<py::bool_>(value)) {
      attrs.set(key, static_cast<std::int64_t>(value.cast<bool>()));
    } else if (py::isinstance<py::int_>(value)) {
      attrs.set(key, value.cast<std::int64_t>());
    } else if (py::isinstance<py::float_>(value)) {
      attrs.set(key, value.cast<double>());
    } else if (py::isinstance<py::str>(value)) {
      attrs.set(key, value.cast<std::string>());
    } else if (py::isinstance<py::sequence>(value)) {
      const auto seq = value.cast<py::sequence>();
      bool all_int = true;
      for (const auto& item : seq) all_int = all_int && (py::isinstance<py::int_>(item) || py::isinstance<py::bool_>(item));
      if (all_int) {
        attrs.set(key, value.cast<std::vector<std::int64_t>>());
      } else {
        attrs.set(key, value.cast<std::vector<double>>());
      }
    } else {
      throw InvalidTypeError(detail::str_cat("attribute '", key, "' must be an int, float, str or a list of ints or "
                                             "floats, got ", py::str(py::type::of(value)).cast<std::string>()));
    }
  }
  return attrs;
}

std::vector<Tensor> to_tensors(const py::handle& inputs) {
  XPURT_CHECK_TYPE(py::isinstance<py::sequence>(inputs) && !py::isinstance<py::str>(inputs),
                   "inputs must be a list of tensors (None for an absent optional input)");
  std::vector<Tensor> tensors;
  for (const auto& item : inputs.cast<py::sequence>()) {
    tensors.push_back(item.is_none() ? Tensor() : to_tensor(item));
  }
  return tensors;
}

py::list candidates_list(const std::vector<CandidateReport>& candidates) {
  py::list out;
  for (const auto& c : candidates) {
    py::dict item;
    item["kernel"] = c.kernel;
    item["backend"] = c.backend;
    item["supported"] = c.supported;
    item["reason"] = c.reason;
    item["time_us"] = c.time_us >= 0 ? py::object(py::float_(c.time_us)) : py::object(py::none());
    out.append(item);
  }
  return out;
}

// The device an op runs on: that of its first given input (the CPU when none is given).
Device device_of(const std::vector<Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined()) return t.device();
  }
  return Device::cpu();
}

std::vector<Tensor> run_call(const std::string& op, const py::handle& inputs, const py::handle& attrs,
                             const KernelPolicy* kernel_policy, const ExecutionPolicy* exec_policy,
                             const py::handle& stream, Decision* decision, const py::handle& outputs = py::none(),
                             const py::handle& workspace = py::none()) {
  std::vector<Tensor> tensors = to_tensors(inputs);
  const Attributes attributes = to_attributes(attrs);
  const Device device = device_of(tensors);
  StreamView view;
  ops::CallOptions options;
  options.kernel_policy = kernel_policy;
  options.exec_policy = exec_policy;
  options.decision = decision;
  if (!stream.is_none()) {
    view = to_stream(stream, device);
    options.stream = &view;
  }
  std::vector<Tensor> out_tensors;
  Tensor workspace_tensor;
  if (!outputs.is_none()) {
    out_tensors = to_tensors(outputs);
    options.outputs = &out_tensors;
  }
  if (!workspace.is_none()) {
    workspace_tensor = to_tensor(workspace);
    options.workspace = &workspace_tensor;
  }
  py::gil_scoped_release release;
  return ops::call(op, tensors, attributes, options);
}

// [(shape, dtype name)] of output descriptors, as ops_plan and PreparedCall report them.
py::list output_list(const std::vector<TensorDesc>& outputs) {
  py::list out;
  for (const auto& o : outputs) out.append(py::make_tuple(o.shape, std::string(dtype_name(o.dtype))));
  return out;
}

// Data pointers passed from Python as ints.
template <typename Pointer>
std::vector<Pointer> to_pointers(const std::vector<std::uintptr_t>& addresses) {
  std::vector<Pointer> out(addresses.size());
  for (std::size_t k = 0; k < addresses.size(); ++k) out[k] = reinterpret_cast<Pointer>(addresses[k]);
  return out;
}

ops::CallOptions policy_options(const KernelPolicy* kernel_policy, const ExecutionPolicy* exec_policy) {
  ops::CallOptions options;
  options.kernel_policy = kernel_policy;
  options.exec_policy = exec_policy;
  return options;
}

// KernelInfo and the registry's listings: kernels, op_schemas, policy_keys, kernel_names, library_versions.
void bind_kernel_registry(py::module_& m) {
  py::class_<KernelInfo>(m, "KernelInfo", "A kernel of the registry: its op, name, backend and device type.")
      .def_readonly("op", &KernelInfo::op)
      .def_readonly("name", &KernelInfo::name)
      .def_readonly("backend", &KernelInfo::backend)
      .def_property_readonly("device_type", [](const KernelInfo& k) {
        return k.device_type == DeviceType::kCUDA ? "cuda" : "cpu";
      })
      .def_readonly("deterministic", &KernelInfo::deterministic)
      .def_readonly("summary", &KernelInfo::summary)
      .def("__repr__", [](const KernelInfo& k) {
        return "<KernelInfo " + k.op + ":" + k.name + " (" + k.backend + ", " +
               (k.device_type == DeviceType::kCUDA ? "cuda" : "cpu") + ")>";
      });

  m.def("kernels", [](const py::object& op) {
        const auto& registry = KernelRegistry::global();
        std::vector<KernelInfo> out;
        const std::vector<std::string> ops = op.is_none() ? registry.ops() : std::vector<std::string>{op.cast<std::string>()};
        for (const auto& name : ops) {
          registry.schema(name);  // unknown op -> InvalidArgumentError listing the valid ones
          for (const Kernel* k : registry.kernels(name)) out.push_back(k->info());
        }
        return out;
      }, py::arg("op") = py::none(), "The registered kernels (of one op), in priority order.");
  m.def("op_schemas", [] {
        const auto& registry = KernelRegistry::global();
        py::list out;
        for (const auto& name : registry.ops()) {
          const OpSchema& s = registry.schema(name);
          py::dict d;
          d["name"] = s.name;
          d["family"] = s.family;
          d["inputs"] = s.inputs;
          d["outputs"] = s.outputs;
          d["doc"] = s.doc;
          out.append(d);
        }
        return out;
      }, "Every op: name, family (its policy key), inputs (optional ones end in '?'), doc.");
  m.def("policy_keys", [] { return KernelRegistry::global().policy_keys(); });
  m.def("kernel_names", [](const std::string& key) { return KernelRegistry::global().kernel_names(key); },
        py::arg("key"));
  m.def("library_versions", [] { return KernelRegistry::global().library_versions(); });
}

void bind_decision(py::module_& m) {
  py::class_<Decision>(m, "Decision", "Which kernel the dispatcher chose for one op signature, and why.")
      .def_readonly("op", &Decision::op)
      .def_readonly("family", &Decision::family)
      .def_readonly("signature", &Decision::signature)
      .def_readonly("kernel", &Decision::kernel)
      .def_readonly("backend", &Decision::backend)
      .def_readonly("rule", &Decision::rule)
      .def_readonly("policy_rule", &Decision::policy_rule)
      .def_readonly("reason", &Decision::reason)
      .def_readonly("plan_record", &Decision::plan_record)
      .def_readonly("plan_summary", &Decision::plan_summary)
      .def_property_readonly("candidates", [](const Decision& d) { return candidates_list(d.candidates); })
      .def("to_json", &Decision::to_json)
      .def("__str__", &Decision::str)
      .def("__repr__", [](const Decision& d) { return "<Decision " + d.str() + ">"; });
}

void bind_autotune_cache(py::module_& m) {
  py::class_<AutotuneCache, std::shared_ptr<AutotuneCache>>(
      m, "AutotuneCache",
      "Autotuned and replayable kernel decisions, keyed by op signature, device, driver and library versions. "
      "AutotuneCache(path) loads the file when it exists and writes it after each new entry (a lock file).")
      .def(py::init<>())
      .def(py::init<std::string, bool>(), py::arg("path"), py::arg("autosave") = true)
      .def("__len__", &AutotuneCache::size)
      .def("clear", &AutotuneCache::clear)
      .def("save", py::overload_cast<>(&AutotuneCache::save, py::const_))
      .def("save", py::overload_cast<const std::string&>(&AutotuneCache::save, py::const_), py::arg("path"))
      .def_property_readonly("path", &AutotuneCache::path)
      .def("to_json", &AutotuneCache::to_json)
      .def("__repr__", [](const AutotuneCache& c) {
        return "<AutotuneCache " + std::to_string(c.size()) + " entries" + (c.path().empty() ? "" : " at " + c.path()) + ">";
      });
}

void bind_dispatcher(py::module_& m) {
  py::class_<Dispatcher, std::shared_ptr<Dispatcher>>(
      m, "Dispatcher", "Picks and runs kernels under a KernelPolicy and an ExecutionPolicy, recording decisions.")
      .def(py::init([](const KernelPolicy& kp, const ExecutionPolicy& ep, std::shared_ptr<AutotuneCache> cache,
                       int warmup, int iterations) {
             Dispatcher::Options options;
             options.autotune_warmup = warmup;
             options.autotune_iterations = iterations;
             return std::make_shared<Dispatcher>(kp, ep, std::move(cache), nullptr, options);
           }),
           py::arg("kernel_policy"), py::arg("exec_policy"), py::arg("cache") = nullptr,
           py::arg("autotune_warmup") = 2, py::arg("autotune_iterations") = 10)
      .def("run",
           [](Dispatcher& d, const std::string& op, const py::handle& inputs, const py::handle& attrs,
              const py::handle& stream) {
             std::vector<Tensor> tensors = to_tensors(inputs);
             const Attributes attributes = to_attributes(attrs);
             const Device device = device_of(tensors);
             for (auto& t : tensors) {
               if (t.defined()) t = t.contiguous();
             }
             StreamView view = to_stream(stream, device);
             Decision decision;
             std::vector<Tensor> outputs;
             {
               py::gil_scoped_release release;
               outputs = d.run(op, tensors, attributes, device.is_cpu() ? nullptr : &view, &decision);
             }
             return py::make_tuple(outputs, decision);
           },
           py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::none(), py::arg("stream") = py::none(),
           "Runs `op`; returns (outputs, decision).")
      .def("decisions", &Dispatcher::decisions)
      .def_property_readonly("kernel_policy", &Dispatcher::kernel_policy)
      .def_property_readonly("exec_policy", &Dispatcher::exec_policy)
      .def_property_readonly("autotune_cache", &Dispatcher::autotune_cache);
}

// The functional ops' entry points that run or plan one call: ops_call, ops_plan.
void bind_ops_call(py::module_& m) {
  m.def("ops_call",
        [](const std::string& op, const py::handle& inputs, const py::handle& attrs, const KernelPolicy* kernel_policy,
           const ExecutionPolicy* exec_policy, const py::handle& stream, bool with_decision, const py::handle& outputs,
           const py::handle& workspace) -> py::object {
          Decision decision;
          std::vector<Tensor> results = run_call(op, inputs, attrs, kernel_policy, exec_policy, stream,
                                                 with_decision ? &decision : nullptr, outputs, workspace);
          if (with_decision) return py::make_tuple(results, decision);
          return py::cast(results);
        },
        py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::none(), py::arg("kernel_policy") = nullptr,
        py::arg("exec_policy") = nullptr, py::arg("stream") = py::none(), py::arg("with_decision") = false,
        py::arg("outputs") = py::none(), py::arg("workspace") = py::none(),
        "Runs `op`; `outputs` (caller-allocated, contiguous, of the inferred shapes) and `workspace` (at least "
        "ops_plan's workspace_bytes) make the call allocate nothing.");
  m.def("ops_plan",
        [](const std::string& op, const py::handle& inputs, const py::handle& attrs, const KernelPolicy* kernel_policy,
           const ExecutionPolicy* exec_policy) {
          const std::vector<Tensor> tensors = to_tensors(inputs);
          const Attributes attributes = to_attributes(attrs);
          const ops::CallOptions options = policy_options(kernel_policy, exec_policy);
          ops::CallPlan plan;
          {
            py::gil_scoped_release release;
            plan = ops::plan(op, tensors, attributes, options);
          }
          return py::make_tuple(plan.decision, output_list(plan.outputs), plan.workspace_bytes);
        },
        py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::none(), py::arg("kernel_policy") = nullptr,
        py::arg("exec_policy") = nullptr,
        "What ops_call would run, without running it: (decision, [(shape, dtype)] of the outputs, workspace_bytes).");
}

void bind_prepared_call(py::module_& m) {
  py::class_<ops::PreparedCall, std::shared_ptr<ops::PreparedCall>>(
      m, "PreparedCall",
      "A call planned once (like ops_call: the same decision and plan) and launched many times on raw memory of the "
      "same descriptors: PreparedCall(op, inputs, attrs, kernel_policy, exec_policy); launch(inputs, outputs, "
      "workspace, stream) with data pointers as ints. What xpuruntime.pytorch runs routed calls through.")
      .def(py::init([](const std::string& op, const py::handle& inputs, const py::handle& attrs,
                       const KernelPolicy* kernel_policy, const ExecutionPolicy* exec_policy) {
             const std::vector<Tensor> tensors = to_tensors(inputs);
             const Attributes attributes = to_attributes(attrs);
             const ops::CallOptions options = policy_options(kernel_policy, exec_policy);
             py::gil_scoped_release release;
             return std::make_shared<ops::PreparedCall>(op, tensors, attributes, options);
           }),
           py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::none(), py::arg("kernel_policy") = nullptr,
           py::arg("exec_policy") = nullptr)
      .def_property_readonly("decision", &ops::PreparedCall::decision)
      .def_property_readonly("outputs", [](const ops::PreparedCall& c) { return output_list(c.outputs()); },
                             "[(shape, dtype)] of the outputs `launch` writes.")
      .def_property_readonly("workspace_bytes", &ops::PreparedCall::workspace_bytes)
      .def_property_readonly("signature", [](const ops::PreparedCall& c) { return c.descriptor().signature(); })
      .def(
          "accepts",
          [](const ops::PreparedCall& c, const std::vector<std::uintptr_t>& inputs) {
            const std::vector<const void*> pointers = to_pointers<const void*>(inputs);
            return c.accepts(pointers.data(), pointers.size());
          },
          py::arg("inputs"), "Whether memory at these addresses (0: an absent input) can run the plan.")
      .def(
          "launch",
          [](const ops::PreparedCall& c, const std::vector<std::uintptr_t>& inputs,
             const std::vector<std::uintptr_t>& outputs, std::uintptr_t workspace, std::size_t workspace_bytes,
             std::uintptr_t stream) {
            const std::vector<const void*> in = to_pointers<const void*>(inputs);
            const std::vector<void*> out = to_pointers<void*>(outputs);
            const Device device = c.descriptor().device;
            const StreamView view =
                device.is_cpu() ? StreamView() : StreamView(device, reinterpret_cast<void*>(stream));
            py::gil_scoped_release release;
            c.launch(in.data(), in.size(), out.data(), out.size(), reinterpret_cast<void*>(workspace), workspace_bytes,
                     view);
          },
          py::arg("inputs"), py::arg("outputs"), py::arg("workspace") = 0, py::arg("workspace_bytes") = 0,
          py::arg("stream") = 0,
          "Runs the plan on data pointers (ints; 0 for an absent optional input): contiguous inputs of the prepared "
          "descriptors, outputs of `outputs`, a workspace of at least `workspace_bytes`, on the raw CUDA stream "
          "`stream` (0: the legacy default stream; ignored on the CPU). Asynchronous like any stream work.")
      .def_property_readonly(
          "native_entry",
          [](const std::shared_ptr<ops::PreparedCall>& c) {
            return py::make_tuple(reinterpret_cast<std::uintptr_t>(&ops::xpurt_prepared_call_launch),
                                  reinterpret_cast<std::uintptr_t>(c.get()));
          },
          "(address of the C function xpurt_prepared_call_launch, address of this plan): how code built apart from "
          "xpuruntime launches the plan (xpuruntime.pytorch's native path). Valid while this object lives.")
      .def("__repr__", [](const ops::PreparedCall& c) {
        return "<PreparedCall " + c.descriptor().signature() + " -> " + c.decision().kernel + ">";
      });
}

// What the functional ops could run (ops_candidates, external_kernels) and their process-wide defaults (policies,
// dispatcher, autotune cache).
void bind_ops_defaults(py::module_& m) {
  m.def("ops_candidates",
        [](const std::string& op, const py::handle& inputs, const py::handle& attrs, const KernelPolicy* kernel_policy,
           const ExecutionPolicy* exec_policy) {
          const std::vector<Tensor> tensors = to_tensors(inputs);
          const Attributes attributes = to_attributes(attrs);
          const ops::CallOptions options = policy_options(kernel_policy, exec_policy);
          std::vector<CandidateReport> candidates;
          {
            py::gil_scoped_release release;
            candidates = ops::candidates(op, tensors, attributes, options);
          }
          return candidates_list(candidates);
        },
        py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::none(), py::arg("kernel_policy") = nullptr,
        py::arg("exec_policy") = nullptr,
        "Every kernel's answer to 'can you run this call?', in priority order: "
        "[{kernel, backend, supported, reason}].");
  m.def("external_kernels", [](const py::object& op) {
        py::list out;
        const std::string name = op.is_none() ? std::string() : op.cast<std::string>();
        for (const auto& e : KernelRegistry::global().external_kernels(name)) {
          py::dict item;
          item["op"] = e.op;
          item["name"] = e.name;
          item["runner"] = e.runner;
          item["summary"] = e.summary;
          out.append(item);
        }
        return out;
      }, py::arg("op") = py::none(),
      "Kernel names a KernelPolicy accepts that run outside xpuruntime (PyTorch's own backends): "
      "[{op, name, runner, summary}].");
  m.def("ops_dispatcher", &ops::dispatcher_for, py::arg("kernel_policy"), py::arg("exec_policy"));
  m.def("ops_set_default_policies", &ops::set_default_policies, py::arg("kernel_policy"), py::arg("exec_policy"));
  m.def("ops_default_kernel_policy", &ops::default_kernel_policy);
  m.def("ops_default_exec_policy", &ops::default_exec_policy);
  m.def("ops_set_autotune_cache", &ops::set_autotune_cache, py::arg("cache"));
  m.def("ops_autotune_cache", &ops::autotune_cache);
}

}  // namespace

// In the order of the classes' definitions (a signature names the classes bound before it).
void bind_kernels(py::module_& m) {
  bind_kernel_registry(m);
  bind_decision(m);
  bind_autotune_cache(m);
  bind_dispatcher(m);
  bind_ops_call(m);
  bind_prepared_call(m);
  bind_ops_defaults(m);
}

}  // namespace xpuruntime::bindings
