// InferenceSession, ValueInfo, Explanation and RunOptions. The Python class xpuruntime.InferenceSession wraps these.
#include <pybind11/stl.h>

#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#define XPURT_SIGINT_DURING_RUNS 1
#endif

#include <atomic>
#include <cmath>
#include <tuple>
#include <utility>

#include "bindings.h"
#include "xpuruntime/capture_plan.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/run_options.h"

namespace xpuruntime::bindings {

namespace {

// Note [Ctrl-C during a run]
// Python runs its signal handlers on the main thread between bytecodes, so Ctrl-C would wait for a run in C++ to
// return (an endless Loop: forever). A run the main thread makes therefore installs, for its duration, a SIGINT
// handler of its own (two sigaction calls per run) that interrupts the run's token (RunStop::interrupt, one atomic
// store: async-signal-safe) and calls the handler it replaced, Python's, which marks the signal for the interpreter.
// The run stops at its next check (Note [Stopping a run] in run_options.h) and unwinds; with the GIL back,
// PyErr_CheckSignals runs the Python-level handler, and the KeyboardInterrupt it raises is what run() raises (a
// handler that raises nothing leaves the RunTerminatedError). Runs on other threads are not interrupted (Python
// delivers signals to the main thread only), nor runs where SIGINT is ignored or default. Measured on a CPU run of
// an endless Loop (tests/python/test_run_stop.py): KeyboardInterrupt a few milliseconds after the signal
// (docs/reliability.md gives the figure).
unsigned long g_main_thread = 0;  // PyThread_get_thread_ident() of the main thread (bind_session)

#if XPURT_SIGINT_DURING_RUNS
std::atomic<RunStop*> g_interruptible{nullptr};  // the main thread's run in flight, if any
struct sigaction g_python_sigint {};             // the handler ours replaced, called after ours

void on_sigint(int signal_number, siginfo_t* info, void* context) {
  if (RunStop* stop = g_interruptible.load(std::memory_order_relaxed)) stop->interrupt();
  if ((g_python_sigint.sa_flags & SA_SIGINFO) != 0) {
    if (g_python_sigint.sa_sigaction != nullptr) g_python_sigint.sa_sigaction(signal_number, info, context);
  } else if (g_python_sigint.sa_handler != SIG_DFL && g_python_sigint.sa_handler != SIG_IGN) {
    g_python_sigint.sa_handler(signal_number);
  }
}
#endif

// A run that Ctrl-C stops (Note [Ctrl-C during a run]): `stop()` is the token to make current for it (null when this
// run cannot be interrupted).
class InterruptibleRun {
 public:
  InterruptibleRun() {
#if XPURT_SIGINT_DURING_RUNS
    if (PyThread_get_thread_ident() != g_main_thread || g_interruptible.load() != nullptr) return;
    struct sigaction previous {};
    if (sigaction(SIGINT, nullptr, &previous) != 0) return;
    const bool python_handles = (previous.sa_flags & SA_SIGINFO) != 0 ||
                                (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN);
    if (!python_handles || previous.sa_sigaction == on_sigint) return;
    g_python_sigint = previous;
    struct sigaction ours = previous;
    ours.sa_flags |= SA_SIGINFO;
    ours.sa_sigaction = on_sigint;
    g_interruptible.store(&stop_);
    installed_ = sigaction(SIGINT, &ours, nullptr) == 0;
    if (!installed_) {
      g_interruptible.store(nullptr);
      return;
    }
    // A Ctrl-C that came before ours was installed (while the call's arguments were converted) only marked the
    // signal for the interpreter: run Python's handler now, or the run would start without it (an endless Loop:
    // forever). The GIL is still held here.
    if (PyErr_CheckSignals() != 0) {
      sigaction(SIGINT, &g_python_sigint, nullptr);
      g_interruptible.store(nullptr);
      installed_ = false;
      throw py::error_already_set();
    }
#endif
  }
  ~InterruptibleRun() {
#if XPURT_SIGINT_DURING_RUNS
    if (!installed_) return;
    sigaction(SIGINT, &g_python_sigint, nullptr);
    g_interruptible.store(nullptr);
#endif
  }
  InterruptibleRun(const InterruptibleRun&) = delete;
  InterruptibleRun& operator=(const InterruptibleRun&) = delete;

  const RunStop* stop() const { return installed_ ? &stop_ : nullptr; }
  // After a run stopped by Ctrl-C (GIL held): Python's handler runs; its KeyboardInterrupt, if any, is raised.
  void raise_pending_signal() const {
    if (installed_ && stop_.interrupted() && PyErr_CheckSignals() != 0) throw py::error_already_set();
  }

 private:
  RunStop stop_;
  bool installed_ = false;
};

// Runs `run` with the GIL released, interruptible by Ctrl-C when on the main thread (Note [Ctrl-C during a run]).
template <typename F>
auto run_interruptible(F&& run) -> decltype(run()) {
  InterruptibleRun interruptible;
  try {
    py::gil_scoped_release release;
    const RunStopScope scope(interruptible.stop());
    return run();
  } catch (const RunTerminatedError&) {
    interruptible.raise_pending_signal();
    throw;
  }
}

// Python's RunOptions timeout, in seconds (None or 0: none), as RunOptions::timeout.
std::chrono::milliseconds timeout_from_seconds(const py::object& seconds) {
  if (seconds.is_none()) return std::chrono::milliseconds(0);
  const double value = seconds.cast<double>();
  XPURT_CHECK(std::isfinite(value) && value >= 0, "RunOptions timeout must be a number of seconds >= 0 (0 or None: "
              "no timeout), got ", value);
  const auto ms = static_cast<std::int64_t>(std::ceil(value * 1000.0));
  return std::chrono::milliseconds(value > 0 && ms == 0 ? 1 : ms);
}

const RunOptions& options_or_default(const py::object& run_options, const RunOptions& fallback) {
  if (run_options.is_none()) return fallback;
  XPURT_CHECK_TYPE(py::isinstance<RunOptions>(run_options), "run_options must be an xpuruntime.RunOptions, got ",
                   py::str(py::type::of(run_options).attr("__name__")).cast<std::string>());
  return *run_options.cast<const RunOptions*>();
}

SessionOptions make_options(const py::handle& device, const std::string& engine, const py::handle& kernel_policy,
                            const py::handle& exec_policy, bool fp16) {
  SessionOptions options;
  options.device = to_device(device.is_none() ? py::str("cpu") : device);
  options.engine = engine;
  if (!kernel_policy.is_none()) options.kernel_policy = kernel_policy.cast<KernelPolicy>();
  if (!exec_policy.is_none()) options.exec_policy = exec_policy.cast<ExecutionPolicy>();
  options.fp16 = fp16;
  return options;
}

// Note [Python run path]
// xpuruntime.InferenceSession.run parses its argument forms in Python and hands the feeds dict to _run_values, which
// does the rest in one call: each feed converted (feed_tensor, to_value), the run with the GIL released, each output
// converted (from_value) into the dict or list run returns. Done in Python, the same conversions cost about 8 us per
// call on this project's CPU machines (an isinstance, a hasattr and a property read per feed and output, the output
// names read again per call), the same order as a whole replayed CUDA graph's launch: a batch-1 model's latency
// against torch.compile's graph replay moved by it (docs/benchmarks.md).

// A feed as a tensor, as xpuruntime.InferenceSession.run and IOBinding take them: an xpuruntime Tensor, a numpy array (made
// C-contiguous), any object with __dlpack__ (torch, cupy), or anything numpy.asarray takes.
Tensor feed_tensor(const py::handle& obj) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (py::isinstance<py::array>(obj)) {
    if ((py::reinterpret_borrow<py::array>(obj).flags() & py::array::c_style) != 0) return to_tensor(obj);
    return to_tensor(py::module_::import("numpy").attr("ascontiguousarray")(obj));
  }
  if (py::hasattr(obj, "__dlpack__")) return to_tensor(obj);
  return to_tensor(py::module_::import("numpy").attr("asarray")(obj));
}

// A Python feed for input `name` as a Value (as ONNX Runtime's Python API takes them): None -> an empty optional, a
// list or tuple -> a sequence of its items (an empty one gets the element type `name` declares), anything else ->
// a tensor (feed_tensor).
Value to_value(const InferenceSession& session, const std::string& name, const py::handle& obj) {
  if (obj.is_none()) return Value::none();
  if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj)) return feed_tensor(obj);
  std::vector<Tensor> elements;
  for (const py::handle& item : obj) elements.push_back(feed_tensor(item));
  DType dtype = DType::kFloat32;
  for (const ValueInfo& info : session.get_inputs()) {
    if (info.name == name) dtype = info.dtype;
  }
  if (!elements.empty()) dtype = elements[0].dtype();
  return Value::sequence(std::move(elements), dtype);
}

// A Value as xpuruntime.InferenceSession.run returns it (as ONNX Runtime's Python API does): a tensor on the CPU as
// a numpy array (float8 as float32 values, int4/uint4 as int8/uint8: Note [Float8 and int4 in numpy] in
// tensor_binding.cpp); a device tensor, or a bfloat16 one (numpy has none), as an xpuruntime Tensor; a sequence as a list;
// an empty optional as None, one holding a value as that value.
py::object from_value(const Value& value) {
  if (!value.defined()) return py::none();
  if (value.is_tensor()) {
    const Tensor& t = value.tensor();
    if (t.device().is_cpu() && t.dtype() != DType::kBFloat16) return to_numpy(t);
    return py::cast(t);
  }
  if (value.is_sequence()) {
    py::list out;
    for (const Tensor& t : value.elements()) out.append(from_value(Value(t)));
    return out;
  }
  return value.has_element() ? from_value(value.element()) : py::none();
}

void bind_value_info(py::module_& m) {
  py::class_<ValueInfo>(m, "ValueInfo", "A model input or output: name, dtype, shape (symbolic dims as names).")
      .def_readonly("name", &ValueInfo::name)
      .def_property_readonly("dtype", [](const ValueInfo& v) { return std::string(dtype_name(v.dtype)); })
      .def_property_readonly("type", &ValueInfo::type,
                             "ONNX-style type: 'tensor(float32)', 'seq(tensor(float32))', 'optional(tensor(int64))'.")
      .def_property_readonly("kind", [](const ValueInfo& v) { return value_kind_name(v.kind); },
                             "'tensor', 'sequence' or 'optional'.")
      .def_property_readonly("shape", [](const ValueInfo& v) {
        py::list shape;
        for (const auto& d : v.shape) {
          const bool numeric = !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
          shape.append(numeric ? py::object(py::int_(std::stoll(d))) : py::object(py::str(d)));
        }
        return shape;
      })
      .def("__repr__", [](const ValueInfo& v) { return "<ValueInfo " + v.str() + ">"; });
}

void bind_explanation(py::module_& m) {
  py::class_<Explanation>(m, "Explanation", "What an InferenceSession ran: engine, nodes, kernels, policy notes.")
      .def_readonly("engine", &Explanation::engine)
      .def_readwrite("engine_reason", &Explanation::engine_reason)
      .def_readonly("device", &Explanation::device)
      .def_readwrite("policy_notes", &Explanation::policy_notes)
      .def_readwrite("options", &Explanation::options)
      .def_readonly("memory", &Explanation::memory)
      .def_readonly("segments", &Explanation::segments,
                    "The plan segments of the last run, one line each (segmented plans: docs/native_engine.md)")
      .def_property_readonly("build", [](const Explanation& e) {
        py::list out;
        for (const auto& b : e.build) {
          py::dict d;
          d["phase"] = b.phase;
          d["ms"] = b.ms;
          out.append(d);
        }
        return out;
      }, "Where session creation and each plan build went: dicts with phase and ms, in order (the native engine: "
         "the ONNX import, then per plan its passes, kernel selection per backend, constants to the device, ...; "
         "empty for other engines).")
      .def_property_readonly("memory_plan", [](const Explanation& e) -> py::object {
        if (e.memory_json.empty()) return py::none();
        return py::module_::import("json").attr("loads")(e.memory_json);
      }, "The memory plan as a dict (peak_bytes, arena_bytes, ...), or None when the engine has none.")
      .def_property_readonly("transfers", [](const Explanation& e) {
        py::list out;
        for (const auto& t : e.transfers) {
          py::dict d;
          d["kind"] = t.kind;
          d["value"] = t.value;
          d["direction"] = t.direction;
          d["bytes"] = t.bytes;
          d["reason"] = t.reason;
          out.append(d);
        }
        return out;
      }, "Copies and syncs per run: dicts with kind (copy/sync), value, direction, bytes, reason.")
      .def_property_readonly("nodes", [](const Explanation& e) {
        py::list nodes;
        for (const auto& n : e.nodes) {
          py::dict d;
          d["node"] = n.node;
          d["op_type"] = n.op_type;
          d["kernel"] = n.kernel;
          d["backend"] = n.backend;
          d["precision"] = n.precision;
          d["reason"] = n.reason;
          d["op"] = n.op;
          d["rule"] = n.rule;
          d["policy_rule"] = n.policy_rule;
          py::list candidates;
          for (const auto& c : n.candidates) {
            py::dict cd;
            cd["kernel"] = c.kernel;
            cd["backend"] = c.backend;
            cd["supported"] = c.supported;
            cd["reason"] = c.reason;
            cd["time_us"] = c.time_us >= 0 ? py::object(py::float_(c.time_us)) : py::object(py::none());
            candidates.append(cd);
          }
          d["candidates"] = candidates;
          d["segment"] = n.segment;
          nodes.append(d);
        }
        return nodes;
      })
      .def("to_json", &Explanation::to_json)
      .def("__str__", &Explanation::str)
      .def("__repr__", [](const Explanation& e) {
        return "<Explanation engine=" + e.engine + " nodes=" + std::to_string(e.nodes.size()) + ">";
      });
}

void bind_io_binding(py::module_& m) {
  py::class_<IoBinding>(m, "IoBinding", "Inputs and outputs bound once for InferenceSession.run_with_binding.")
      .def("bind_input", [](IoBinding& b, const std::string& name, const py::object& value) {
        b.bind_input(name, feed_tensor(value));
      }, py::arg("name"), py::arg("value"))
      .def("bind_output_tensor", [](IoBinding& b, const std::string& name, const py::object& value) {
        b.bind_output(name, feed_tensor(value));
      }, py::arg("name"), py::arg("value"), "Binds the output to this tensor: each run writes it in place.")
      .def("bind_output_device", [](IoBinding& b, const std::string& name, const py::object& device) {
        b.bind_output(name, to_device(device));
      }, py::arg("name"), py::arg("device"), "Binds the output to a device: each run returns a new tensor there.")
      .def("clear_inputs", &IoBinding::clear_inputs)
      .def("clear_outputs", &IoBinding::clear_outputs)
      .def("output_names", &IoBinding::output_names)
      .def("outputs", &IoBinding::outputs);
}

void bind_run_options(py::module_& m) {
  py::class_<RunOptions>(m, "RunOptions", R"doc(Options of one run (ONNX Runtime's RunOptions).

Parameters
----------
timeout : float, optional
    Seconds the run may take; past them it stops with :class:`~xpuruntime.RunTimeoutError`. None or 0 (default): no
    limit.
tag : str
    Names the run in its errors (ONNX Runtime's ``logid``). Default: none.

``terminate = True`` (from any thread, while the run is in flight) stops it with
:class:`~xpuruntime.RunTerminatedError` at its next check (between nodes, Loop iterations, plan segments and in the
CPU kernels' loops; docs/reliability.md); every later run given these options stops before it starts until
``terminate = False``. The session runs normally after a stopped run.)doc")
      .def(py::init([](const py::object& timeout, const std::string& tag, bool terminate) {
             auto options = std::make_unique<RunOptions>();
             options->timeout = timeout_from_seconds(timeout);
             options->tag = tag;
             if (terminate) options->set_terminate();
             return options;
           }),
           py::arg("timeout") = py::none(), py::arg("tag") = "", py::arg("terminate") = false)
      .def_property("terminate", &RunOptions::terminate,
                    [](RunOptions& o, bool value) { value ? o.set_terminate() : o.unset_terminate(); },
                    "Set to stop the runs given these options (safe from any thread); default False.")
      .def_property("timeout",
                    [](const RunOptions& o) -> py::object {
                      if (o.timeout.count() == 0) return py::none();
                      return py::float_(static_cast<double>(o.timeout.count()) / 1000.0);
                    },
                    [](RunOptions& o, const py::object& seconds) { o.timeout = timeout_from_seconds(seconds); },
                    "Seconds a run may take (millisecond resolution); None (default): no limit.")
      .def_readwrite("tag", &RunOptions::tag, "Names the run in its errors; default ''.")
      .def("__repr__", [](const RunOptions& o) {
        std::string out = "<RunOptions";
        if (o.timeout.count() != 0) out += " timeout=" + std::to_string(o.timeout.count()) + "ms";
        if (!o.tag.empty()) out += " tag='" + o.tag + "'";
        if (o.terminate()) out += " terminate";
        return out + ">";
      });
}

// InferenceSession and known_engines.
void bind_inference_session(py::module_& m) {
  py::class_<InferenceSession>(m, "InferenceSession")
      .def(py::init([](const py::object& model, const py::object& device, const std::string& engine,
                       const py::object& kernel_policy, const py::object& exec_policy, bool fp16,
                       const std::vector<std::string>& disabled_passes, const std::string& optimized_model_path,
                       const std::string& model_dir,
                       const std::vector<std::pair<std::string, std::string>>& session_config) {
             SessionOptions options = make_options(device, engine, kernel_policy, exec_policy, fp16);
             options.disabled_passes = disabled_passes;
             options.optimized_model_path = optimized_model_path;
             options.model_dir = model_dir;
             options.session_config = session_config;
             if (py::isinstance<py::bytes>(model)) {
               const std::string bytes = model.cast<std::string>();
               py::gil_scoped_release release;
               return std::make_unique<InferenceSession>(InferenceSession::from_bytes(bytes, options));
             }
             const std::string path = py::str(model).cast<std::string>();
             py::gil_scoped_release release;
             return std::make_unique<InferenceSession>(path, options);
           }),
           py::arg("model"), py::arg("device") = py::none(), py::arg("engine") = "auto",
           py::arg("kernel_policy") = py::none(), py::arg("exec_policy") = py::none(), py::arg("fp16") = false,
           py::arg("disabled_passes") = std::vector<std::string>{}, py::arg("optimized_model_path") = "",
           py::arg("model_dir") = "",
           py::arg("session_config") = std::vector<std::pair<std::string, std::string>>{})
      .def("get_inputs", &InferenceSession::get_inputs)
      .def("get_outputs", &InferenceSession::get_outputs)
      .def("_run",
           [](const InferenceSession& s, const std::vector<std::pair<std::string, py::object>>& feeds,
              const std::vector<std::string>& output_names, const py::object& run_options) {
             std::vector<std::pair<std::string, Tensor>> tensors;
             for (const auto& [name, value] : feeds) tensors.emplace_back(name, to_tensor(value));
             const RunOptions none;
             const RunOptions& options = options_or_default(run_options, none);
             return run_interruptible([&] { return s.run(tensors, output_names, options); });
           },
           py::arg("feeds"), py::arg("output_names"), py::arg("run_options") = py::none())
      .def("_run_values",
           [](const InferenceSession& s, const py::dict& feeds, const py::object& output_names,
              const py::object& run_options) -> py::object {
             // Note [Python run path]: the whole of xpuruntime.InferenceSession.run past its argument forms.
             std::vector<std::pair<std::string, Value>> values;
             values.reserve(feeds.size());
             for (const auto& [key, value] : feeds) {
               std::string name = py::str(key).cast<std::string>();
               Value v = to_value(s, name, value);
               values.emplace_back(std::move(name), std::move(v));
             }
             const bool as_dict = output_names.is_none();
             const std::vector<std::string> names =
                 as_dict ? std::vector<std::string>{} : output_names.cast<std::vector<std::string>>();
             const RunOptions none;
             const RunOptions& options = options_or_default(run_options, none);
             std::vector<Value> outputs = run_interruptible([&] { return s.run_values(values, names, options); });
             if (as_dict) {
               py::dict out;
               const std::vector<ValueInfo>& infos = s.get_outputs();
               for (std::size_t k = 0; k < outputs.size() && k < infos.size(); ++k) {
                 out[py::str(infos[k].name)] = from_value(outputs[k]);
               }
               return out;
             }
             py::list out;
             for (const Value& v : outputs) out.append(from_value(v));
             return out;
           },
           py::arg("feeds"), py::arg("output_names"), py::arg("run_options") = py::none(),
           "Runs with feeds {name: tensor, list (a sequence) or None (an empty optional)}; output_names None returns "
           "{name: output} of every output, a list returns those outputs as a list (numpy arrays on the CPU, Tensors "
           "on a device or bfloat16, lists for sequences, None for empty optionals).")
      .def("io_binding", &InferenceSession::io_binding)
      .def("_run_with_binding",
           [](const InferenceSession& s, IoBinding& binding, const py::object& run_options) {
             const RunOptions none;
             const RunOptions& options = options_or_default(run_options, none);
             run_interruptible([&] { s.run_with_binding(binding, options); });
           },
           py::arg("binding"), py::arg("run_options") = py::none())
      .def("explain", &InferenceSession::explain, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("engine", &InferenceSession::engine);

  m.def("known_engines", &known_engines);
  m.def("graph_passes", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const GraphPassInfo& p : graph_passes()) out.emplace_back(p.name, p.doc);
    return out;
  });
  m.def(
      "engine_availability",
      [](const Device& device) {
        std::vector<std::tuple<std::string, bool, std::string>> out;
        for (const EngineAvailability& e : engine_availability(device)) out.emplace_back(e.name, e.available, e.reason);
        return out;
      },
      py::arg("device") = Device::cpu());
}

}  // namespace

// In the order of the classes' definitions (a signature names the classes bound before it).
void bind_session(py::module_& m) {
  bind_value_info(m);
  bind_explanation(m);
  bind_io_binding(m);
  g_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  bind_run_options(m);
  bind_inference_session(m);
}

}  // namespace xpuruntime::bindings
