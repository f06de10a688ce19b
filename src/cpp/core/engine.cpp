// EngineRegistry (EngineRegistry::global() is the one place that calls every engine's register_<name>) and
// InferenceSession. Every engine name xpuruntime knows is registered in every build (Note [Declared engines] in
// core/declared_engine.h).
#include "xpuruntime/inference_session.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "declared_engine.h"
#include "policy_serialization.h"
#include "shape_str.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/model_file.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime {

namespace {

std::string pad(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

}  // namespace

std::vector<std::string> known_engines() { return {"auto", "native", "onnxruntime", "tensorrt", "openvino", "qnn"}; }

std::vector<EngineAvailability> engine_availability(Device device) {
  std::string missing_device;
  try {
    DeviceManager::instance().check_device(device);
  } catch (const XpuRuntimeError& e) {
    missing_device = e.what();
  }
  SessionOptions options;
  options.device = device;
  std::vector<EngineAvailability> out;
  for (const std::string& name : known_engines()) {
    if (name == "auto") continue;
    EngineAvailability entry{name, false, missing_device};
    if (missing_device.empty()) {
      const Engine* engine = EngineRegistry::global().find(name);
      const Support support = engine ? engine->available(options) : Support::no("not registered");
      entry.available = support.ok();
      entry.reason = support.ok() ? "" : support.reason();
    }
    out.push_back(std::move(entry));
  }
  return out;
}

std::string ValueInfo::type() const {
  const std::string tensor = "tensor(" + std::string(dtype_name(dtype)) + ")";
  if (kind == ValueKind::kSequence) return "seq(" + tensor + ")";
  if (kind == ValueKind::kOptional) {
    return "optional(" + (element_kind == ValueKind::kSequence ? "seq(" + tensor + ")" : tensor) + ")";
  }
  return tensor;
}

std::string ValueInfo::str() const {
  std::string tensor = std::string(dtype_name(dtype)) + "[";
  for (std::size_t k = 0; k < shape.size(); ++k) tensor += (k ? ", " : "") + shape[k];
  tensor += "]";
  if (kind == ValueKind::kSequence) return name + ": seq(" + tensor + ")";
  if (kind == ValueKind::kOptional) {
    return name + ": optional(" + (element_kind == ValueKind::kSequence ? "seq(" + tensor + ")" : tensor) + ")";
  }
  return name + ": " + tensor;
}

std::string Explanation::to_json() const {
  nlohmann::json tree = {{"engine", engine}, {"engine_reason", engine_reason}, {"device", device},
                         {"policy_notes", policy_notes}, {"options", options},
                         {"memory", memory}};
  nlohmann::json list = nlohmann::json::array();
  for (const auto& n : nodes) {
    nlohmann::json candidates = nlohmann::json::array();
    for (const auto& c : n.candidates) {
      candidates.push_back({{"kernel", c.kernel}, {"backend", c.backend}, {"supported", c.supported},
                            {"reason", c.reason}, {"time_us", c.time_us}});
    }
    list.push_back({{"node", n.node}, {"op_type", n.op_type}, {"kernel", n.kernel}, {"backend", n.backend},
                    {"precision", n.precision}, {"reason", n.reason}, {"op", n.op}, {"rule", n.rule},
                    {"policy_rule", n.policy_rule}, {"candidates", candidates}, {"segment", n.segment}});
  }
  tree["nodes"] = list;
  nlohmann::json copies = nlohmann::json::array();
  for (const auto& t : transfers) {
    copies.push_back({{"kind", t.kind}, {"value", t.value}, {"direction", t.direction}, {"bytes", t.bytes},
                      {"reason", t.reason}});
  }
  tree["transfers"] = copies;
  tree["segments"] = segments;
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& b : build) phases.push_back({{"phase", b.phase}, {"ms", b.ms}});
  tree["build"] = phases;
  tree["memory_plan"] = memory_json.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(memory_json);
  return tree.dump();
}

std::string Explanation::str() const {
  std::string out = "engine: " + engine + " (" + engine_reason + ")\ndevice: " + device + "\n";
  for (const auto& option : options) out += "option: " + option + "\n";
  for (const auto& note : policy_notes) out += "policy: " + note + "\n";
  if (!memory.empty()) out += "memory: " + memory + "\n";
  for (const auto& segment : segments) out += segment + "\n";
  // Phases under a millisecond are in build (and to_json), not in the text.
  for (const auto& b : build) {
    if (b.ms < 1.0) continue;
    char ms[32];
    std::snprintf(ms, sizeof(ms), "%.1f", b.ms);
    out += "build: " + b.phase + " " + ms + " ms\n";
  }
  for (const auto& t : transfers) {
    out += t.kind == "sync" ? "sync: " + t.reason + "\n"
                            : detail::str_cat(t.kind, ": ", t.value, " ", t.direction, " ", t.bytes, " B (", t.reason,
                                              ")\n");
  }
  std::size_t w_node = 4, w_op = 7, w_kernel = 6;
  for (const auto& n : nodes) {
    w_node = std::max(w_node, n.node.size());
    w_op = std::max(w_op, n.op_type.size());
    w_kernel = std::max(w_kernel, n.kernel.size());
  }
  out += pad("node", w_node) + "  " + pad("op_type", w_op) + "  " + pad("kernel", w_kernel) + "  reason\n";
  for (const auto& n : nodes) {
    out += pad(n.node, w_node) + "  " + pad(n.op_type, w_op) + "  " + pad(n.kernel, w_kernel) + "  " + n.reason + "\n";
  }
  return out;
}

// ---- EngineRegistry ----

EngineRegistry& EngineRegistry::global() {
  static EngineRegistry registry;
  static std::once_flag once;
  std::call_once(once, [] {
#if XPURT_ENGINE_ONNXRUNTIME
    register_onnxruntime(registry);
#else
    registry.add(std::make_unique<DeclaredEngine>(
        "onnxruntime", "this xpuruntime was built without ONNX Runtime: in its source tree run "
                       "scripts/fetch_onnxruntime.sh (ONNX Runtime 1.29.0), or configure with "
                       "-DONNXRUNTIME_ROOT=<a folder with ONNX Runtime 1.29+>, and rebuild (docs/install.md)"));
#endif
    register_tensorrt(registry);
    // The NPU runtimes of the design (npu.md).
    register_openvino(registry);
    register_qnn(registry);
    register_native(registry);
  });
  return registry;
}

void EngineRegistry::add(std::unique_ptr<Engine> engine) {
  XPURT_CHECK(engine != nullptr, "EngineRegistry::add: null engine");
  XPURT_CHECK(find(engine->name()) == nullptr, "engine '", engine->name(), "' is already registered");
  std::lock_guard<std::mutex> lock(mutex_);
  engines_.push_back(std::move(engine));
}

const Engine* EngineRegistry::find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& engine : engines_) {
    if (engine->name() == name) return engine.get();
  }
  return nullptr;
}

std::vector<std::string> EngineRegistry::names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& engine : engines_) out.push_back(engine->name());
  return out;
}

// ---- InferenceSession ----

InferenceSession::InferenceSession(const std::string& model_path, SessionOptions options) : options_(std::move(options)) {
  const std::string model = read_model_file(model_path);
  if (options_.model_dir.empty()) {
    const auto slash = model_path.find_last_of('/');
    options_.model_dir = slash == std::string::npos ? "." : slash == 0 ? "/" : model_path.substr(0, slash);
  }
  build(model);
}

InferenceSession InferenceSession::from_bytes(const std::string& model, SessionOptions options) {
  InferenceSession session;
  session.options_ = std::move(options);
  session.build(model);
  return session;
}

void InferenceSession::build(const std::string& model) {
  XPURT_CHECK(!model.empty(), "the model is empty (0 bytes)");
  const auto known = known_engines();
  XPURT_CHECK(std::find(known.begin(), known.end(), options_.engine) != known.end(), "unknown engine '",
              options_.engine, "'; valid engines: ", detail::join_names(known));
  // Note [A device that does not exist]: a session on a device this machine lacks ("cuda:0" without a GPU,
  // "cuda:1" with one) is refused here, with CudaError naming the devices that exist, rather than created and
  // explained as running there, to fail at its first run.
  DeviceManager::instance().check_device(options_.device);
  if (options_.fp16) options_.exec_policy.precision = Precision::kFP16;
  options_.kernel_policy.validate(KernelRegistry::global());
  const EngineRegistry& registry = EngineRegistry::global();

  std::string name = options_.engine;
  if (name == "auto") {
    // The native engine is preferred on CUDA when it can run every node (its create() checks, Note [Support
    // check at session creation] in engines/native/native_engine.cpp); ONNX Runtime serves everything else.
    const Engine* native = registry.find("native");
    const Support native_support = native ? native->available(options_) : Support::no("not registered");
    if (native_support.ok() && options_.device.is_cuda()) {
      // Native when it can run every node (its create() checks); ONNX Runtime otherwise, saying why.
      try {
        session_ = native->create(model, options_);
        engine_ = "native";
        engine_reason_ = "auto: the native engine runs every node on " + options_.device.str();
        return;
      } catch (const UnsupportedOperationError& e) {
        name = "onnxruntime";
        engine_reason_ = std::string("auto: fell back to onnxruntime because ") + e.what();
      }
    } else {
      name = "onnxruntime";
      engine_reason_ = options_.device.is_cuda()
                           ? "auto: the native engine is unavailable (" + native_support.reason() + ")"
                           : "auto: onnxruntime is the engine for CPU devices";
      const Engine* ort = registry.find("onnxruntime");
      const Support ort_support = ort ? ort->available(options_) : Support::no("not registered");
      if (!ort_support.ok() && native_support.ok()) {
        // A build without ONNX Runtime still runs models on the CPU.
        name = "native";
        engine_reason_ = "auto: onnxruntime is unavailable (" + ort_support.reason() + "); the native engine runs on " +
                         options_.device.str();
      }
    }
    if (options_.exec_policy.tensor_parallel > 1 && name != "native") {
      // Only the native engine shards a model (docs/distributed.md).
      XPURT_CHECK(native_support.ok(), "tensor_parallel=", options_.exec_policy.tensor_parallel,
                  " needs the native engine, which cannot run here: ", native_support.reason());
      session_ = native->create(model, options_);
      engine_ = "native";
      engine_reason_ = "auto: tensor_parallel needs the native engine";
      return;
    }
  } else {
    engine_reason_ = "requested by the session options";
  }
  const Engine* engine = registry.find(name);
  XPURT_INTERNAL_ASSERT(engine != nullptr, "engine '", name, "' is not registered");
  XPURT_CHECK(name == "native" || options_.disabled_passes.empty(),
              "disabled_passes is an option of the native engine; engine '", name, "' does not take it");
  XPURT_CHECK(name == "native" || name == "onnxruntime" || options_.optimized_model_path.empty(),
              "optimized_model_path is an option of the native and onnxruntime engines; engine '", name,
              "' does not take it");
  XPURT_CHECK(name == "native" || options_.exec_policy.tensor_parallel == 1, "ExecutionPolicy tensor_parallel=",
              options_.exec_policy.tensor_parallel, " is an option of the native engine; engine '", name,
              "' does not shard models (docs/distributed.md)");
  const Support support = engine->available(options_);
  if (!support.ok()) {
    throw UnsupportedOperationError(detail::str_cat("engine '", name, "' cannot run on ", options_.device.str(), ": ",
                                                    support.reason()));
  }
  session_ = engine->create(model, options_);
  engine_ = name;
}

const std::vector<ValueInfo>& InferenceSession::get_inputs() const { return session_->inputs(); }
const std::vector<ValueInfo>& InferenceSession::get_outputs() const { return session_->outputs(); }

std::vector<Tensor> InferenceSession::run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                          const std::vector<std::string>& output_names,
                                          const RunOptions& run_options) const {
  const RunStop stop(run_options, RunStop::current());  // Note [Stopping a run] (run_options.h)
  const RunStopScope stop_scope(&stop);
  stop.check("before it started");
  // Note [Profiler off cost] (profiler.h): one relaxed load when no profiler records.
  if (!profiler::active()) return session_->run(feeds, output_names);
  std::vector<Tensor> outputs;
  run_profiled(feeds, [&] { outputs = session_->run(feeds, output_names); });
  return outputs;
}

std::vector<Value> InferenceSession::run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                                const std::vector<std::string>& output_names,
                                                const RunOptions& run_options) const {
  const RunStop stop(run_options, RunStop::current());  // Note [Stopping a run] (run_options.h)
  const RunStopScope stop_scope(&stop);
  stop.check("before it started");
  if (!profiler::active()) return session_->run_values(feeds, output_names);
  std::vector<std::pair<std::string, Tensor>> tensors;  // what the profiler records of the feeds
  for (const auto& [name, value] : feeds) {
    if (value.is_tensor()) tensors.emplace_back(name, value.tensor());
  }
  std::vector<Value> outputs;
  run_profiled(tensors, [&] { outputs = session_->run_values(feeds, output_names); });
  return outputs;
}

template <typename Run>
void InferenceSession::run_profiled(const std::vector<std::pair<std::string, Tensor>>& feeds, const Run& run) const {
  const bool recording = profiler::recording();
  profiler::nvtx_push("xpuruntime session run");
  const std::int64_t start = recording ? profiler::now_ns() : 0;
  try {
    run();
  } catch (...) {
    profiler::nvtx_pop();
    throw;
  }
  profiler::nvtx_pop();
  if (recording) {
    ProfileEvent e;
    e.name = "session run (" + engine_ + ")";
    e.category = "session";
    e.start_ns = start;
    e.duration_ns = profiler::now_ns() - start;
    e.args = {{"engine", engine_}, {"device", options_.device.str()}};
    if (profiler::record_shapes()) {
      std::vector<std::string> shapes;
      for (const auto& [name, t] : feeds) {
        shapes.push_back(name + ": " + std::string(dtype_name(t.dtype())) + detail::shape_str(t.shape(), ","));
      }
      e.args.emplace_back("input_shapes", std::move(shapes));
    }
    profiler::record(std::move(e));
  }
}

// ---- I/O binding ----

// Note [I/O binding]
// IoBinding mirrors ONNX Runtime's: the caller binds inputs and outputs once and runs many times. Names and dtypes
// are checked when bound (against the session's inputs and outputs), shapes by the run. An output bound to a tensor
// is handed to EngineSession::run_into as a defined entry, which the engine writes in place (the default
// implementation runs and copies into it); an output bound to a device is undefined there and the engine allocates
// it, then it is copied to that device if it is not the session's. The point of binding for speed: with CUDA graphs
// the onnxruntime engine replays its graph directly over bound tensors whose addresses stay the same from run to run
// (Note [CUDA graphs through ORT] in engines/onnxruntime/ort_engine.cpp), so nothing is staged.

namespace {

const ValueInfo& find_value(const std::vector<ValueInfo>& values, const std::string& name, const char* what) {
  auto it = std::find_if(values.begin(), values.end(), [&](const ValueInfo& v) { return v.name == name; });
  if (it == values.end()) {
    std::vector<std::string> names;
    for (const ValueInfo& v : values) names.push_back(v.name);
    throw InvalidArgumentError(
        detail::str_cat("unknown ", what, " '", name, "'; the model's ", what, "s are ", detail::join_names(names)));
  }
  return *it;
}

void check_bound(const ValueInfo& info, const Tensor& value, const char* what) {
  XPURT_CHECK(value.defined(), what, " '", info.name, "' is bound to an undefined tensor");
  XPURT_CHECK_TYPE(value.dtype() == info.dtype, what, " '", info.name, "' is ", dtype_name(info.dtype),
                   ", the bound tensor is ", dtype_name(value.dtype()));
}

template <typename T, typename Name>
void put(std::vector<T>& entries, const std::string& name, T entry, const Name& name_of) {
  auto it = std::find_if(entries.begin(), entries.end(), [&](const T& e) { return name_of(e) == name; });
  if (it == entries.end()) {
    entries.push_back(std::move(entry));
  } else {
    *it = std::move(entry);
  }
}

}  // namespace

void IoBinding::bind_input(const std::string& name, Tensor value) {
  check_bound(find_value(model_inputs_, name, "input"), value, "input");
  put(inputs_, name, std::make_pair(name, std::move(value)), [](const auto& e) { return e.first; });
}

void IoBinding::bind_output(const std::string& name, Tensor value) {
  const ValueInfo& info = find_value(model_outputs_, name, "output");
  check_bound(info, value, "output");
  XPURT_CHECK(value.device() == device_, "output '", info.name, "' is bound to a tensor on ", value.device().str(),
              "; a tensor bound in place must be on the session's device ", device_.str(),
              " (bind the output to a device instead to get it there)");
  XPURT_CHECK(value.is_contiguous(), "output '", info.name, "' is bound to a non-contiguous tensor");
  put(outputs_, name, Output{name, std::move(value), device_}, [](const Output& o) { return o.name; });
}

void IoBinding::bind_output(const std::string& name, Device device) {
  find_value(model_outputs_, name, "output");
  put(outputs_, name, Output{name, Tensor(), device}, [](const Output& o) { return o.name; });
}

std::vector<std::string> IoBinding::output_names() const {
  std::vector<std::string> names;
  names.reserve(outputs_.size());
  for (const Output& o : outputs_) names.push_back(o.name);
  return names;
}

IoBinding InferenceSession::io_binding() const {
  return IoBinding(session_->inputs(), session_->outputs(), options_.device);
}

void InferenceSession::run_with_binding(IoBinding& binding, const RunOptions& run_options) const {
  XPURT_CHECK(!binding.outputs_.empty(), "run_with_binding: no output is bound; bind at least one (to a tensor or "
              "to a device)");
  const RunStop stop(run_options, RunStop::current());  // Note [Stopping a run] (run_options.h)
  const RunStopScope stop_scope(&stop);
  stop.check("before it started");
  std::vector<std::string> names = binding.output_names();
  std::vector<Tensor> outputs;
  outputs.reserve(binding.outputs_.size());
  for (const IoBinding::Output& o : binding.outputs_) outputs.push_back(o.tensor);
  auto run = [&] { session_->run_into(binding.inputs_, names, outputs); };
  if (!profiler::active()) {
    run();
  } else {
    run_profiled(binding.inputs_, run);
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const IoBinding::Output& o = binding.outputs_[k];
    if (!o.tensor.defined() && outputs[k].device() != o.device) outputs[k] = outputs[k].to(o.device);
  }
  binding.results_ = std::move(outputs);
}

void EngineSession::run_into(const std::vector<std::pair<std::string, Tensor>>& feeds,
                             const std::vector<std::string>& output_names, std::vector<Tensor>& outputs) {
  XPURT_INTERNAL_ASSERT(outputs.size() == output_names.size(), "run_into: ", outputs.size(), " outputs for ",
                        output_names.size(), " names");
  std::vector<Tensor> results = run(feeds, output_names);
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined()) {
      outputs[k] = std::move(results[k]);
      continue;
    }
    XPURT_CHECK(outputs[k].shape() == results[k].shape(), "output '", output_names[k], "' is bound to a tensor of "
                "shape ", detail::shape_str(outputs[k].shape(), ","), " but the run produced ",
                detail::shape_str(results[k].shape(), ","));
    outputs[k].copy_from(results[k]);
  }
}

std::vector<Value> EngineSession::run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                             const std::vector<std::string>& output_names) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(feeds.size());
  for (const auto& [name, value] : feeds) {
    if (value.defined() && !value.is_tensor()) {
      for (const ValueInfo& info : inputs()) {
        XPURT_CHECK_TYPE(info.name != name || info.kind != ValueKind::kTensor, "input '", name, "' expects ",
                         info.type(), ", got ", value.str());
      }
      throw UnsupportedOperationError(detail::str_cat("input '", name, "' is ", value.str(), "; this engine takes "
                                                      "tensor values only (the native engine runs sequences and "
                                                      "optionals on the CPU)"));
    }
    tensors.emplace_back(name, value.is_tensor() ? value.tensor() : Tensor());
  }
  std::vector<Tensor> outputs = run(tensors, output_names);
  return {outputs.begin(), outputs.end()};
}

Explanation InferenceSession::explain() const {
  Explanation explanation = session_->explain();
  explanation.engine = engine_;
  explanation.engine_reason = engine_reason_;
  explanation.device = options_.device.str();
  return explanation;
}

}  // namespace xpuruntime
