// The native engine: ONNX -> Graph -> CapturePlan (one per input-shape signature, cached) -> GraphExec (a pool per
// plan, so that several threads can run one session at once). See docs/native_engine.md.
//
// Note [Support check at session creation]
// Shapes are known only when inputs arrive, but a model whose nodes cannot run on the device must fail when the
// session is created (and engine "auto" must know then whether to fall back). So create() builds a probe plan
// with every symbolic or unknown input dimension set to 1: that lowers and dispatches every node. The probe plan
// is kept and serves runs with exactly those shapes. A probe that fails for another reason than an unsupported
// node or a plan over ExecutionPolicy.memory_limit (a model that needs batch > 1, ...) is ignored: the first run
// reports the problem.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "core/build_clock.h"
#include "core/cache_dir.h"
#include "core/distributed_ops.h"
#include "core/policy_serialization.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/capture_plan.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/distributed.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph_exec.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/onnx_import.h"
#include "xpuruntime/value.h"

namespace xpuruntime {
namespace {

DType compute_float_of(const ExecutionPolicy& policy) {
  if (policy.precision == Precision::kFP16) return DType::kFloat16;
  if (policy.precision == Precision::kBF16) return DType::kBFloat16;
  return DType::kFloat32;
}

ValueInfo value_info(const Graph& g, const std::string& name) {
  ValueInfo info;
  info.name = name;
  if (const ValueType* vt = g.type(name)) {
    info.kind = vt->kind;
    info.element_kind = vt->element_kind;
    info.dtype = vt->dtype;
    if (vt->has_shape) {
      for (const Dim& d : vt->shape) info.shape.push_back(d.str());
    }
  }
  return info;
}

std::string shape_key(const std::vector<std::vector<std::int64_t>>& shapes) {
  std::string key;
  for (const auto& s : shapes) {
    key += "[";
    for (std::size_t i = 0; i < s.size(); ++i) key += (i ? "," : "") + std::to_string(s[i]);
    key += "]";
  }
  return key;
}

std::size_t value_bytes(const PlanValue& v) {
  if (v.bytes > 0 || !v.type.fully_known()) return v.bytes;
  std::size_t bytes = dtype_size(v.type.dtype);
  for (std::int64_t d : v.type.sizes()) bytes *= static_cast<std::size_t>(d);
  return bytes;
}

// Note [Libraries warmed while the model is read]
// A vendor library's first use in a process costs more than most plans' kernel selection: cuBLASLt's (its handle,
// kernel modules and heuristic) about 100 ms on an H200, cuDNN's 20-60 ms. With the build cache replaying the
// decisions (Note [Build cache]), that first use was the longest part of a CNN's kernel selection
// (benchmarks/session_create_bench.py). So creating a CUDA session starts a helper thread before the ONNX import
// that builds, for each kernel that has one, the small plan of Kernel::warm_up and throws it away: the libraries
// load while the model is read and the graph passes run. Each backend's kernels warm on a thread of their own, so
// the libraries load side by side (one after the other, cuDNN's and cuBLASLt's took 150-230 ms, longer than a CNN's
// import and passes; side by side the warm creation of ResNet-50 went from 297 to 184 ms and EfficientNet-B0's from
// 221 to 151 ms on an H200, docs/benchmarks.md). The handles a thread created go back to the per-thread pools when
// it ends (Note [Per-thread handle pools]) for the selection threads to take. Creation does not wait for it (a small
// model's plan may be built before the libraries are loaded): the session keeps its future, its destruction waits
// for it, and explain().build lists its time once it is done. Its failures are ignored: a kernel that cannot run is
// reported by the plan that needs it.
double warm_libraries(Device device, const ExecutionPolicy& policy) {
  const auto start = std::chrono::steady_clock::now();
  try {
    DeviceManager::instance().check_device(device);
    const int compute_capability = DeviceManager::instance().get_device_info(device).compute_capability();
    const KernelRegistry& registry = KernelRegistry::global();
    // Per backend, its kernels' problems. The backends warm at once, one thread each: their libraries load apart.
    std::map<std::string, std::vector<std::pair<const Kernel*, OpDescriptor>>> by_backend;
    for (const std::string& op : registry.ops()) {
      for (const Kernel* kernel : registry.kernels(op)) {
        std::optional<OpDescriptor> desc = kernel->warm_up(device);
        if (!desc) continue;
        desc->compute_capability = compute_capability;
        desc->precision = policy.precision;
        by_backend[kernel->info().backend].emplace_back(kernel, std::move(*desc));
      }
    }
    std::vector<std::future<void>> backends;
    for (auto& [backend, problems] : by_backend) {
      backends.push_back(std::async(std::launch::async, [&registry, &policy, &problems = problems] {
        for (auto& [kernel, desc] : problems) {
          try {
            registry.infer(desc);
            if (kernel->supports(desc, policy)) (void)kernel->build(desc, policy, "");
          } catch (const std::exception&) {
            // Ignored (see the Note); the next kernel is warmed all the same.
          }
        }
      }));
    }
    for (std::future<void>& backend : backends) backend.wait();
  } catch (const std::exception&) {
    // No usable device: the session's creation reports it.
  }
  return detail::ms_since(start);
}

// One rank of a tensor-parallel session (Note [Tensor-parallel sessions]): the plans shard the model.
struct TensorParallelRank {
  int size = 1;
  int rank = 0;
  std::int64_t comm = -1;
};

class NativeSession final : public EngineSession {
 public:
  // `import_ms`: how long the ONNX import took (the first of explain().build's phases; Note [Build phases]).
  NativeSession(Graph graph, const SessionOptions& options, TensorParallelRank tp = {}, double import_ms = 0)
      : graph_(std::move(graph)), options_(options) {
    if (import_ms > 0) build_.push_back({"import", import_ms});
    for (const auto& in : graph_.inputs) inputs_.push_back(value_info(graph_, in));
    for (const auto& out : graph_.outputs) outputs_.push_back(value_info(graph_, out));
    for (const auto* infos : {&inputs_, &outputs_}) {
      for (const ValueInfo& info : *infos) has_value_io_ |= info.kind != ValueKind::kTensor;
    }
    open_build_cache();
    Dispatcher::Options dispatcher_options;
    dispatcher_options.build_cache = build_cache_ != nullptr;
    dispatcher_ = std::make_shared<Dispatcher>(options_.kernel_policy, options_.exec_policy, build_cache_, nullptr,
                                               dispatcher_options);
    plan_options_.device = options_.device;
    plan_options_.dispatcher = dispatcher_;
    plan_options_.compute_float = compute_float_of(options_.exec_policy);
    plan_options_.memory_limit = options_.exec_policy.memory_limit;
    plan_options_.cpu_fallback = options_.exec_policy.fallback == "cpu";
    plan_options_.tp_size = tp.size;
    plan_options_.tp_rank = tp.rank;
    plan_options_.tp_comm = tp.comm;
    const std::vector<passes::PassInfo>& known = passes::all_passes();
    for (const std::string& name : options_.disabled_passes) {
      const bool valid = std::any_of(known.begin(), known.end(), [&](const passes::PassInfo& p) { return p.name == name; });
      XPURT_CHECK(valid, "unknown graph pass '", name, "' in disabled_passes; valid names: ", passes::pass_names());
      plan_options_.disabled_passes.insert(name);
    }
    probe();
  }

  const std::vector<ValueInfo>& inputs() const override { return inputs_; }
  const std::vector<ValueInfo>& outputs() const override { return outputs_; }

  // Note [Libraries warmed while the model is read]: the helper may still run after creation (a small model's plan
  // is built before the libraries are loaded); this session's destruction waits for it.
  void keep_warm_up(std::shared_future<double> warm_up) { warm_up_ = std::move(warm_up); }

  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names) override {
    return run_impl(feeds, output_names, nullptr);
  }

  // Note [I/O binding] (core/engine.cpp): the plan's outputs are copied straight into the bound tensors (on the run's
  // stream, like the copies run() makes into new tensors), so binding costs no extra copy or synchronization.
  void run_into(const std::vector<std::pair<std::string, Tensor>>& feeds, const std::vector<std::string>& output_names,
                std::vector<Tensor>& outputs) override {
    std::vector<Tensor> results = run_impl(feeds, output_names, &outputs);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (!outputs[k].defined()) outputs[k] = std::move(results[k]);
    }
  }

  // Note [Sequence and optional values] (value.h): a model whose inputs and outputs are all tensors runs through
  // run_impl (plans, pools and CUDA graphs as run() does); one with sequence or optional inputs or outputs runs its
  // CPU plan through GraphExec::run_values.
  std::vector<Value> run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                const std::vector<std::string>& output_names) override {
    if (!has_value_io_) {
      std::vector<std::pair<std::string, Tensor>> tensors;
      for (const auto& [name, value] : feeds) {
        const ValueType* vt = is_input(name) ? graph_.type(name) : nullptr;
        XPURT_CHECK_TYPE(!value.defined() || value.is_tensor() || !is_input(name), "input '", name, "' expects ",
                         vt ? vt->type_str() : std::string("a tensor"), ", got ", value.str());
        tensors.emplace_back(name, value.is_tensor() ? value.tensor() : Tensor());
      }
      std::vector<Tensor> outputs = run_impl(tensors, output_names, nullptr);
      return {outputs.begin(), outputs.end()};
    }
    std::vector<Value> ordered(graph_.inputs.size());
    for (const auto& [name, value] : feeds) {
      auto it = std::find(graph_.inputs.begin(), graph_.inputs.end(), name);
      if (it == graph_.inputs.end()) {
        throw InvalidArgumentError(detail::str_cat("unknown input '", name, "'; the model's inputs are: ",
                                                   detail::join_names(graph_.inputs)));
      }
      const auto i = static_cast<std::size_t>(it - graph_.inputs.begin());
      ordered[i] = conform_feed(name, graph_.type(name), value);
    }
    std::vector<std::vector<std::int64_t>> shapes;
    for (std::size_t i = 0; i < ordered.size(); ++i) {
      XPURT_CHECK(ordered[i].defined(), "missing input '", graph_.inputs[i], "' (expected ", inputs_[i].str(), ")");
      shapes.push_back(ordered[i].is_tensor() ? ordered[i].tensor().shape() : std::vector<std::int64_t>{});
    }
    const std::vector<int> wanted = output_indices(output_names);
    const std::string key = shape_key(shapes);
    std::shared_ptr<const CapturePlan> plan = plan_for(shapes, key);
    if (!options_.optimized_model_path.empty()) save_optimized(*plan);
    std::unique_ptr<GraphExec> exec = checkout(plan, key);
    std::vector<Value> outputs;
    try {
      outputs = exec->run_values(ordered);
    } catch (...) {
      checkin(std::move(exec), key);
      throw;
    }
    checkin(std::move(exec), key);
    if (wanted.empty()) return outputs;
    std::vector<Value> selected;
    for (int i : wanted) selected.push_back(outputs[i]);
    return selected;
  }

  // `bound`: run_into's outputs (one per output name; defined entries are written in place), or null.
  std::vector<Tensor> run_impl(const std::vector<std::pair<std::string, Tensor>>& feeds,
                               const std::vector<std::string>& output_names, const std::vector<Tensor>* bound) {
    if (has_value_io_) {
      std::string values;
      for (const auto* infos : {&inputs_, &outputs_}) {
        for (const ValueInfo& info : *infos) {
          if (info.kind == ValueKind::kTensor) continue;
          values += (values.empty() ? "'" : ", '") + info.name + "' (" + info.type() + ")";
        }
      }
      throw InvalidTypeError(detail::str_cat("this model has sequence or optional inputs or outputs (", values,
                                             "): run it with run_values (Python: run() takes lists and None)"));
    }
    // Feeds by name, in the model's input order.
    std::vector<Tensor> ordered(graph_.inputs.size());
    for (const auto& [name, tensor] : feeds) {
      auto it = std::find(graph_.inputs.begin(), graph_.inputs.end(), name);
      if (it == graph_.inputs.end()) {
        throw InvalidArgumentError(detail::str_cat("unknown input '", name, "'; the model's inputs are: ",
                                                   detail::join_names(graph_.inputs)));
      }
      ordered[it - graph_.inputs.begin()] = tensor;
    }
    std::vector<std::vector<std::int64_t>> shapes;
    for (std::size_t i = 0; i < ordered.size(); ++i) {
      XPURT_CHECK(ordered[i].defined(), "missing input '", graph_.inputs[i], "' (expected ", inputs_[i].str(), ")");
      const ValueType* vt = graph_.type(graph_.inputs[i]);
      if (vt) {
        XPURT_CHECK_TYPE(ordered[i].dtype() == vt->dtype, "input '", graph_.inputs[i], "' expects ",
                         dtype_name(vt->dtype), ", got ", dtype_name(ordered[i].dtype()));
      }
      shapes.push_back(ordered[i].shape());
    }
    std::vector<int> wanted;
    for (const auto& name : output_names) {
      auto it = std::find(graph_.outputs.begin(), graph_.outputs.end(), name);
      if (it == graph_.outputs.end()) {
        throw InvalidArgumentError(detail::str_cat("unknown output '", name, "'; the model's outputs are: ",
                                                   detail::join_names(graph_.outputs)));
      }
      wanted.push_back(static_cast<int>(it - graph_.outputs.begin()));
    }
    if (options_.exec_policy.static_shape) {
      std::lock_guard<std::mutex> lock(mutex_);
      const std::string key = shape_key(shapes);
      if (static_key_.empty()) static_key_ = key;
      XPURT_CHECK(key == static_key_, "static_shape=true: this session runs the input shapes of its first run ",
                  static_key_, " only, got ", key);
    }
    const std::string key = shape_key(shapes);
    std::shared_ptr<const CapturePlan> plan = plan_for(shapes, key);
    if (!options_.optimized_model_path.empty()) save_optimized(*plan);
    std::vector<Tensor> into;  // per model output: the bound tensor, if any
    if (bound != nullptr) {
      into.resize(graph_.outputs.size());
      for (std::size_t k = 0; k < wanted.size(); ++k) {
        const Tensor& t = (*bound)[k];
        if (!t.defined()) continue;
        XPURT_CHECK(!into[wanted[k]].defined(), "output '", graph_.outputs[wanted[k]], "' is bound twice");
        XPURT_CHECK(t.device() == options_.device, "output '", graph_.outputs[wanted[k]], "' is bound to a tensor on ",
                    t.device().str(), ", not on the session's device ", options_.device.str());
        into[wanted[k]] = t;
      }
    }
    std::unique_ptr<GraphExec> exec = checkout(plan, key);
    std::vector<Tensor> outputs;
    try {
      outputs = exec->run(ordered, bound != nullptr ? &into : nullptr);
    } catch (...) {
      checkin(std::move(exec), key);
      throw;
    }
    checkin(std::move(exec), key);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last_feeds_on_device_.assign(ordered.size(), false);
      for (std::size_t i = 0; i < ordered.size(); ++i) last_feeds_on_device_[i] = ordered[i].device() == options_.device;
    }
    if (wanted.empty()) return outputs;
    std::vector<Tensor> selected;
    for (int i : wanted) selected.push_back(outputs[i]);
    return selected;
  }

  Explanation explain() const override {
    Explanation e;
    e.engine = "native";
    e.device = options_.device.str();
    std::shared_ptr<const CapturePlan> plan;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      plan = last_plan_;
      e.options.push_back(detail::str_cat("plans built: ", plans_.size(), " (one per input-shape signature)"));
      bool captured = false;
      std::string failed;
      for (const auto& [key, pool] : pools_) {
        for (const auto& exec : pool) {
          captured |= exec->graph_captured();
          if (failed.empty()) failed = exec->capture_failure();
        }
      }
      if (!failed.empty()) {
        e.options.push_back("a CUDA graph capture failed (Note [Failed captures]); that executor runs eagerly: " +
                            failed);
      }
      if (options_.device.is_cuda()) {
        e.options.push_back(detail::str_cat("cuda_graphs=", options_.exec_policy.cuda_graphs ? "true" : "false",
                                            captured ? " (captured and replayed)" : ""));
      }
    }
    e.options.push_back(detail::str_cat("precision=", precision_name(options_.exec_policy.precision)));
    if (build_cache_) {
      e.options.push_back(detail::str_cat("build cache (Note [Build cache]): ", build_cache_path_.string(), ", ",
                                          build_cache_->size(), " kernel decision(s)"));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      e.build = build_;
      if (warm_up_.valid() && warm_up_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        e.build.insert(e.build.begin() + (e.build.empty() ? 0 : 1),
                       {"libraries warmed (helper thread, during the import and passes)", warm_up_.get()});
      }
    }
    if (!plan) {
      e.options.push_back("no plan built yet (the first run builds one)");
      return e;
    }
    std::string why;
    if (options_.device.is_cuda() && !plan->capturable(&why)) e.options.push_back("not capturable: " + why);
    for (const auto& note : plan->pass_notes()) e.options.push_back("pass " + note);
    e.memory = plan->memory().str();
    e.memory_json = plan->memory().to_json();
    std::vector<bool> feeds_on_device;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      feeds_on_device = last_feeds_on_device_;
    }
    e.transfers = transfers_of(*plan, feeds_on_device);
    // Note [Segmented plans]: the segments the last run went through, each with its nodes.
    std::vector<std::shared_ptr<const CapturePlan>> chain = {plan};
    while (chain.back()->boundary()) {
      std::shared_ptr<const CapturePlan> next = chain.back()->boundary()->last();
      if (!next) break;
      chain.push_back(std::move(next));
    }
    for (std::size_t k = 0; k < chain.size() && chain.size() > 1; ++k) {
      const CapturePlan& segment = *chain[k];
      std::string graph;
      if (options_.device.is_cuda()) {
        std::string not_capturable;
        graph = !options_.exec_policy.cuda_graphs     ? "; cuda_graphs off"
                : segment.capturable(&not_capturable) ? "; captured into a CUDA graph from its second run"
                                                      : "; not capturable: " + not_capturable;
      }
      e.segments.push_back(detail::str_cat("segment ", k, ": ", segment.steps().size(), " steps", graph, "; ",
                                           segment.memory().str(),
                                           segment.boundary() ? "; " + segment.boundary()->str() : std::string()));
      if (k == 0) continue;
      std::vector<TransferExplanation> more = transfers_of(segment, std::vector<bool>(segment.inputs().size(), true));
      for (auto& t : more) t.reason = detail::str_cat("segment ", k, ": ", t.reason);
      e.transfers.insert(e.transfers.end(), more.begin(), more.end());
    }
    if (chain.size() == 1 && plan->boundary()) {
      e.segments.push_back(detail::str_cat("segment 0: ", plan->steps().size(), " steps; ",
                                           plan->boundary()->str(), " (not run yet)"));
    }
    for (std::size_t k = 0; k + 1 < chain.size(); ++k) {
      TransferExplanation sync;
      sync.kind = "sync";
      sync.reason = detail::str_cat("segment ", k, " ", chain[k]->boundary()->str());
      e.transfers.push_back(std::move(sync));
    }
    for (std::size_t k = 0; k < chain.size(); ++k) {
      for (const PlanStep& s : chain[k]->steps()) {
        NodeExplanation n = node_explanation(*chain[k], s);
        n.segment = static_cast<int>(k);
        e.nodes.push_back(std::move(n));
      }
    }
    return e;
  }

 private:
  static NodeExplanation node_explanation(const CapturePlan& plan, const PlanStep& s) {
    NodeExplanation n;
    n.node = s.node;
    n.op_type = s.op_type;
    switch (s.kind) {
      case PlanStep::Kind::kKernel:
        if (s.dispatch) {
          const Decision& d = s.dispatch->decision;
          n.kernel = d.kernel;
          n.backend = d.backend;
          n.precision = precision_name(s.desc.precision);
          n.reason = s.op + ": " + d.reason;
          if (!d.plan_summary.empty()) n.reason += " [" + d.plan_summary + "]";
          if (s.op == "fused_elementwise") {  // Note [Fused elementwise programs]: the group's program
            n.reason += "; program: " + s.attrs.get_string("program", "");
          }
          n.op = s.op;
          n.rule = d.rule;
          n.policy_rule = d.policy_rule;
          n.candidates = d.candidates;
        } else {
          n.kernel = "(dispatched at run time)";
          n.backend = "cpu";
          n.reason = s.op + ": input shapes known only at run time";
          n.op = s.op;
        }
        break;
      case PlanStep::Kind::kView:
        n.kernel = "view";
        n.backend = "-";
        n.reason = plan.values()[s.outputs[0]].view_offset == 0 && s.op_type != "Slice" && s.op_type != "Gather"
                       ? "a reshape of its input's bytes: no kernel, no copy"
                       : detail::str_cat("a contiguous block of its input's bytes from byte ",
                                         plan.values()[s.outputs[0]].view_offset, ": no kernel, no copy");
        break;
      case PlanStep::Kind::kReference:
        n.kernel = "onnx_ref";
        n.backend = "cpu";
        n.reason = "ONNX reference implementation: " + s.reason;
        break;
    }
    return n;
  }

  bool is_input(const std::string& name) const {
    return std::find(graph_.inputs.begin(), graph_.inputs.end(), name) != graph_.inputs.end();
  }

  // The indices of `names` among the model's outputs (empty: all).
  std::vector<int> output_indices(const std::vector<std::string>& names) const {
    std::vector<int> wanted;
    for (const auto& name : names) {
      auto it = std::find(graph_.outputs.begin(), graph_.outputs.end(), name);
      if (it == graph_.outputs.end()) {
        throw InvalidArgumentError(detail::str_cat("unknown output '", name, "'; the model's outputs are: ",
                                                   detail::join_names(graph_.outputs)));
      }
      wanted.push_back(static_cast<int>(it - graph_.outputs.begin()));
    }
    return wanted;
  }

  // A feed for input `name` of declared type `vt` as the plan takes it: a tensor of the declared dtype; a sequence
  // of the declared element type; for an optional, an optional (a tensor or sequence is wrapped in one, as ONNX
  // Runtime does). Tensors on other devices are copied to the CPU. InvalidTypeError naming the input otherwise.
  static Value conform_feed(const std::string& name, const ValueType* vt, const Value& value) {
    if (!value.defined() || vt == nullptr) return value;
    auto to_cpu = [](const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); };
    auto mismatch = [&](const Value& got) {
      return InvalidTypeError(detail::str_cat("input '", name, "' expects ", vt->type_str(), ", got ", got.str()));
    };
    // `v` (a tensor or a sequence) as `type` (a tensor or sequence type) wants it.
    auto conform = [&](const Value& v, const ValueType& type) -> Value {
      if (type.kind == ValueKind::kTensor) {
        if (!v.is_tensor() || v.tensor().dtype() != type.dtype) throw mismatch(value);
        return v;  // the tensor path binds and checks it (GraphExec::bind_inputs)
      }
      if (!v.is_sequence() || v.element_dtype() != type.dtype) throw mismatch(value);
      std::vector<Tensor> elements;
      for (const Tensor& t : v.elements()) elements.push_back(to_cpu(t));
      return Value::sequence(std::move(elements), v.element_dtype());
    };
    if (vt->kind != ValueKind::kOptional) {
      if (value.is_optional()) throw mismatch(value);
      return conform(value, *vt);
    }
    const Value& inner = value.is_optional() ? (value.has_element() ? value.element() : value) : value;
    if (inner.is_optional()) return value;  // empty
    Value element = conform(inner, vt->element());
    return Value::optional(element.is_tensor() ? Value(to_cpu(element.tensor())) : element);
  }

  // The copies and syncs GraphExec::run makes for `plan` (graph_exec.cpp: bind_inputs, collect_outputs, run).
  // `feeds_on_device`: per input, whether the last run's feed was on the session's device (empty: no run yet;
  // feeds are then taken to come from the host, as numpy arrays do).
  std::vector<TransferExplanation> transfers_of(const CapturePlan& plan, const std::vector<bool>& feeds_on_device) const {
    std::vector<TransferExplanation> out;
    const bool cuda = options_.device.is_cuda();
    const bool fixed_addresses = cuda && options_.exec_policy.cuda_graphs && plan.capturable();
    const auto& values = plan.values();
    for (std::size_t i = 0; i < plan.inputs().size(); ++i) {
      const PlanValue& v = values[plan.inputs()[i]];
      const bool on_device = i < feeds_on_device.size() ? feeds_on_device[i] : !cuda;
      TransferExplanation t;
      t.kind = "copy";
      t.value = v.name;
      t.bytes = value_bytes(v);
      if (!on_device) {
        t.direction = "host->device";
        t.reason = "input fed from host memory, copied to " + options_.device.str();
      } else if (fixed_addresses) {
        t.direction = "device->device";
        t.reason = "input copied into its arena slot: a CUDA graph replays fixed addresses";
      } else {
        continue;  // bound in place (zero-copy)
      }
      out.push_back(std::move(t));
    }
    for (int id : plan.outputs()) {
      const PlanValue& v = values[id];
      const bool owned_by_run = !v.planned && v.kind == PlanValue::Kind::kIntermediate &&
                                (v.view_of < 0 || !values[v.view_of].planned);
      if (owned_by_run) continue;  // returned as allocated by its step
      TransferExplanation t;
      t.kind = "copy";
      t.value = v.name;
      t.bytes = value_bytes(v);
      t.direction = cuda ? "device->device" : "host->host";
      t.reason = v.kind == PlanValue::Kind::kIntermediate
                     ? "output copied out of the arena (the next run reuses it); it stays on " + options_.device.str()
                     : "output is an input or constant passed through; copied so that the caller owns it";
      out.push_back(std::move(t));
    }
    // Note [Mixed execution] (ExecutionPolicy fallback "cpu"): host steps of a CUDA plan.
    for (const PlanStep& step : plan.steps()) {
      if (!step.on_host) continue;
      TransferExplanation sync;
      sync.kind = "sync";
      sync.reason = "node '" + step.node + "' (" + step.op_type + ") runs on the CPU (fallback \"cpu\"): the stream is "
                    "synchronized before its inputs are copied to the host";
      out.push_back(std::move(sync));
      for (std::size_t k = 0; k < step.inputs.size(); ++k) {
        if (step.inputs[k] < 0 || values[step.inputs[k]].kind == PlanValue::Kind::kConstant) continue;
        TransferExplanation t;
        t.kind = "copy";
        t.value = values[step.inputs[k]].name;
        t.bytes = value_bytes(values[step.inputs[k]]);
        t.direction = "device->host";
        t.reason = "input of node '" + step.node + "', which runs on the CPU (no CUDA kernel: " + step.reason + ")";
        out.push_back(std::move(t));
      }
      for (int id : step.outputs) {
        if (id < 0) continue;
        TransferExplanation t;
        t.kind = "copy";
        t.value = values[id].name;
        t.bytes = value_bytes(values[id]);
        t.direction = "host->device";
        t.reason = "output of node '" + step.node + "', which runs on the CPU, copied back to " + options_.device.str();
        out.push_back(std::move(t));
      }
    }
    if (cuda) {
      TransferExplanation t;
      t.kind = "sync";
      t.reason = "one stream synchronization per run, after the outputs are copied (run() returns ready outputs)";
      out.push_back(std::move(t));
    }
    return out;
  }

  void probe() {
    std::vector<std::vector<std::int64_t>> shapes;
    for (const auto& in : graph_.inputs) {
      const ValueType* vt = graph_.type(in);
      if (vt && !vt->is_tensor()) {
        shapes.emplace_back();  // a sequence or optional: no plan shape (CapturePlan::build)
        continue;
      }
      XPURT_CHECK(vt && vt->has_shape, "input '", in, "' has no declared shape; the native engine needs its rank");
      std::vector<std::int64_t> s;
      for (const Dim& d : vt->shape) s.push_back(d.known() ? d.value : 1);
      shapes.push_back(s);
    }
    try {
      plan_for(shapes, shape_key(shapes));
    } catch (const UnsupportedOperationError&) {
      throw;
    } catch (const OutOfMemoryError&) {
      throw;  // even the smallest shapes exceed the memory limit
    } catch (const XpuRuntimeError&) {
      // Note [Support check at session creation]: not a support problem; the first run reports it.
    }
  }

  std::shared_ptr<const CapturePlan> plan_for(const std::vector<std::vector<std::int64_t>>& shapes,
                                              const std::string& key) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) {
        last_plan_ = it->second;
        return it->second;
      }
    }
    std::lock_guard<std::mutex> build_lock(build_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    const auto start = std::chrono::steady_clock::now();
    std::shared_ptr<const CapturePlan> plan = CapturePlan::build(graph_, shapes, plan_options_);
    const double total = detail::ms_since(start);
    save_build_cache();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const BuildPhase& phase : plan->build_phases()) build_.push_back({"plan " + key + ": " + phase.phase, phase.ms});
    build_.push_back({"plan " + key + ": total", total});
    plans_[key] = plan;
    last_plan_ = plan;
    return plan;
  }

  // Note [Build cache]
  // Most of a CUDA plan's build is the libraries choosing algorithms (cuDNN's heuristic ranking and workspace
  // queries, cuBLASLt's heuristic; Note [Build phases]), and a second process would choose the same again. So a
  // native session on CUDA keeps its Dispatcher's decisions in an AutotuneCache on disk, next to the generated
  // kernels (core/cache_dir.h: <cache>/decisions/<policies' hash>.json; the entries' keys hold the signature, the
  // device and the library versions): the next session with these policies re-creates each kernel's plan from its
  // record (cuDNN: one workspace query instead of the heuristic; cuBLASLt: one algorithm check) as a lock file
  // replays one, except that a first-supported rule still picks its kernel by priority and a record the libraries
  // refuse is rebuilt afresh (Dispatcher::Options::build_cache). The file is read once, written after each plan
  // build that added decisions (a temporary file renamed over it, so that processes sharing it never read half of
  // one), and ignored when it cannot be read or written. XPURT_BUILD_CACHE=0 turns it off.
  void open_build_cache() {
    if (!options_.device.is_cuda()) return;
    if (const char* off = std::getenv("XPURT_BUILD_CACHE"); off != nullptr && std::string(off) == "0") return;
    const std::filesystem::path dir = detail::build_cache_dir();
    if (dir.empty()) return;
    build_cache_path_ = dir / "decisions" /
                        (detail::fnv1a_hex(options_.kernel_policy.to_json() + options_.exec_policy.to_json()) + ".json");
    try {
      build_cache_ = std::make_shared<AutotuneCache>(build_cache_path_.string(), /*autosave=*/false);  // loaded when it exists
    } catch (const XpuRuntimeError&) {
      build_cache_ = std::make_shared<AutotuneCache>();  // unreadable (another version's, half-written): start over
    }
    build_cache_saved_ = build_cache_->size();
  }

  void save_build_cache() {
    if (!build_cache_) return;
    std::lock_guard<std::mutex> lock(build_cache_mutex_);
    if (build_cache_->size() == build_cache_saved_) return;
    std::error_code ec;
    std::filesystem::create_directories(build_cache_path_.parent_path(), ec);
    const std::filesystem::path tmp = build_cache_path_.string() + ".tmp" + std::to_string(::getpid());
    try {
      build_cache_->save(tmp.string());
      std::filesystem::rename(tmp, build_cache_path_, ec);
      if (ec) std::filesystem::remove(tmp, ec);
    } catch (const XpuRuntimeError&) {
      std::filesystem::remove(tmp, ec);  // a read-only cache folder: no cache, nothing lost
    }
    build_cache_saved_ = build_cache_->size();
  }

  // SessionOptions::optimized_model_path: the graph of the first run's plan (specialised to its input shapes).
  void save_optimized(const CapturePlan& plan) {
    std::lock_guard<std::mutex> lock(build_mutex_);
    if (optimized_model_written_) return;
    std::ofstream file(options_.optimized_model_path, std::ios::binary);
    XPURT_CHECK(file.good(), "cannot write the optimized model to '", options_.optimized_model_path, "'");
    file << export_onnx(plan.graph());
    XPURT_CHECK(file.good(), "writing the optimized model to '", options_.optimized_model_path, "' failed");
    optimized_model_written_ = true;
  }

  std::unique_ptr<GraphExec> checkout(const std::shared_ptr<const CapturePlan>& plan, const std::string& key) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& pool = pools_[key];
      if (!pool.empty()) {
        std::unique_ptr<GraphExec> exec = std::move(pool.back());
        pool.pop_back();
        return exec;
      }
    }
    GraphExecOptions exec_options;
    exec_options.use_cuda_graph = options_.exec_policy.cuda_graphs;
    return std::make_unique<GraphExec>(plan, exec_options);
  }

  void checkin(std::unique_ptr<GraphExec> exec, const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    pools_[key].push_back(std::move(exec));
  }

  Graph graph_;
  SessionOptions options_;
  std::vector<ValueInfo> inputs_;
  std::vector<ValueInfo> outputs_;
  bool has_value_io_ = false;  // a sequence or optional input or output (run_values)
  std::shared_ptr<Dispatcher> dispatcher_;
  PlanOptions plan_options_;
  mutable std::mutex mutex_;
  std::mutex build_mutex_;
  std::map<std::string, std::shared_ptr<const CapturePlan>> plans_;
  std::map<std::string, std::vector<std::unique_ptr<GraphExec>>> pools_;
  std::shared_ptr<const CapturePlan> last_plan_;
  std::vector<BuildPhase> build_;  // the import and every plan build's phases, in order (under mutex_)
  std::shared_ptr<AutotuneCache> build_cache_;  // Note [Build cache]; null when off
  std::filesystem::path build_cache_path_;
  std::size_t build_cache_saved_ = 0;  // entries the file holds (under build_cache_mutex_)
  std::mutex build_cache_mutex_;
  std::string static_key_;  // static_shape: the input shapes of the first run
  std::vector<bool> last_feeds_on_device_;  // per input: the last run's feed was on the session's device
  bool optimized_model_written_ = false;  // under build_mutex_
  std::shared_future<double> warm_up_;    // Note [Libraries warmed while the model is read]; waited for last
};

// Note [Tensor-parallel sessions]
// ExecutionPolicy.tensor_parallel = N > 1: one NativeSession per rank, each on its device with plans built by the
// tensor_parallel pass for its rank (Note [Sharding by propagation] in passes/tensor_parallel.cpp), its
// all-reduces on its communicator of one set made by Communicator::init_all (NCCL on CUDA devices, the host
// backend on the CPU). A run feeds every rank the same inputs and runs them at once, rank 0 on the calling thread
// and the others on one worker thread each (NCCL's one-thread-per-GPU model; the host backend's ranks need their
// own threads too); each rank replays its own CUDA graph, NCCL kernels inside. The outputs are rank 0's (every
// graph output is replicated: the pass never leaves one sharded). A rank that fails aborts every communicator, so
// that the others' collectives return instead of waiting forever; the session is then unusable (its
// communicators are gone) and says so. A watchdog aborts them too when a run outlasts the communicators' timeout.
class TensorParallelSession final : public EngineSession {
 public:
  TensorParallelSession(const Graph& graph, const SessionOptions& options) : options_(options) {
    const int n = options.exec_policy.tensor_parallel;
    std::vector<Device> devices;
    if (options.device.is_cuda()) {
      const int count = DeviceManager::instance().get_device_count();
      if (options.device.index + n > count) {
        throw UnsupportedOperationError(detail::str_cat(
            "tensor_parallel=", n, " on ", options.device.str(), " needs CUDA devices ", options.device.index, "..",
            options.device.index + n - 1, "; this machine has ", count));
      }
      for (int r = 0; r < n; ++r) devices.push_back(Device::cuda(options.device.index + r));
    } else {
      devices.assign(static_cast<std::size_t>(n), Device::cpu());
    }
    distributed::CommOptions comm_options;
    if (const char* env = std::getenv("XPURT_COMM_TIMEOUT_S")) {
      comm_options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::atof(env) * 1000.0));
    }
    // Note [NCCL algorithm and protocol kernels]: a policy naming an NCCL tuning gets communicators made with it.
    if (options.device.is_cuda()) {
      for (const std::string& kernel : options.kernel_policy.resolve("all_reduce", "collective").kernels) {
        if (auto tuning = distributed::nccl_tuning_of(kernel)) {
          comm_options.nccl_algo = tuning->algo;
          comm_options.nccl_proto = tuning->proto;
          break;
        }
      }
    }
    comms_ = distributed::Communicator::init_all(devices, comm_options);
    for (int r = 0; r < n; ++r) {
      SessionOptions rank_options = options;
      rank_options.device = devices[static_cast<std::size_t>(r)];
      if (r > 0) rank_options.optimized_model_path.clear();
      ranks_.push_back(std::make_unique<NativeSession>(graph, rank_options,
                                                       TensorParallelRank{n, r, comms_[r]->handle()}));
    }
    for (int r = 1; r < n; ++r) workers_.push_back(std::make_unique<Worker>());
    watchdog_ = std::thread([this] { watch(); });
  }

  ~TensorParallelSession() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    workers_.clear();
    ranks_.clear();
  }

  const std::vector<ValueInfo>& inputs() const override { return ranks_[0]->inputs(); }
  const std::vector<ValueInfo>& outputs() const override { return ranks_[0]->outputs(); }

  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names) override {
    std::vector<Tensor> out;
    run_all([&](NativeSession& rank, bool first) {
      std::vector<Tensor> result = rank.run(feeds, output_names);
      if (first) out = std::move(result);
    });
    return out;
  }

  void run_into(const std::vector<std::pair<std::string, Tensor>>& feeds, const std::vector<std::string>& output_names,
                std::vector<Tensor>& outputs) override {
    run_all([&](NativeSession& rank, bool first) {
      if (first) {
        rank.run_into(feeds, output_names, outputs);
      } else {
        (void)rank.run(feeds, output_names);
      }
    });
  }

  std::vector<Value> run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                const std::vector<std::string>& output_names) override {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, value] : feeds) {
      XPURT_CHECK_TYPE(!value.defined() || value.is_tensor(), "input '", name, "': a tensor-parallel session takes "
                       "tensors, got ", value.str());
      tensors.emplace_back(name, value.is_tensor() ? value.tensor() : Tensor());
    }
    std::vector<Tensor> outputs = run(tensors, output_names);
    return {outputs.begin(), outputs.end()};
  }

  Explanation explain() const override {
    Explanation e = ranks_[0]->explain();
    std::string devices;
    for (const auto& c : comms_) devices += (devices.empty() ? "" : ", ") + c->device().str();
    const std::string backend = comms_[0]->backend() == "nccl"
                                    ? "NCCL " + distributed::nccl_version()
                                    : std::string("the host communicator (in-process CPU ranks)");
    std::vector<std::string> options = {
        detail::str_cat("tensor_parallel=", comms_.size(), " over ", devices, " (", backend,
                        "); one plan per rank, this explanation is rank 0's")};
    for (std::size_t r = 1; r < ranks_.size(); ++r) {
      Explanation other = ranks_[r]->explain();
      options.push_back(detail::str_cat("rank ", r, " on ", comms_[r]->device().str(), ": ", other.nodes.size(),
                                        " steps, ", other.memory));
    }
    e.options.insert(e.options.begin(), options.begin(), options.end());
    return e;
  }

 private:
  // A thread that runs one job at a time for one rank.
  class Worker {
   public:
    Worker() : thread_([this] { loop(); }) {}
    ~Worker() {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    void start(std::function<void()> job) {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = std::move(job);
      done_ = false;
      error_ = nullptr;
      cv_.notify_all();
    }
    std::exception_ptr wait() {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return done_; });
      return error_;
    }

   private:
    void loop() {
      std::unique_lock<std::mutex> lock(mutex_);
      while (true) {
        cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
        if (stop_) return;
        std::function<void()> job = std::move(job_);
        job_ = nullptr;
        lock.unlock();
        std::exception_ptr error;
        try {
          job();
        } catch (...) {
          error = std::current_exception();
        }
        lock.lock();
        error_ = error;
        done_ = true;
        cv_.notify_all();
      }
    }
    std::mutex mutex_;
    std::condition_variable cv_;
    std::function<void()> job_;
    bool done_ = true;
    bool stop_ = false;
    std::exception_ptr error_;
    std::thread thread_;
  };

  void abort_all(const std::string& reason) {
    for (const auto& c : comms_) c->abort(reason);
  }

  template <typename Fn>
  void run_all(Fn fn) {
    std::lock_guard<std::mutex> lock(run_mutex_);  // one run at a time: every rank's collectives in one order
    for (const auto& c : comms_) c->check_usable();
    {
      std::lock_guard<std::mutex> watch(watch_mutex_);
      run_started_ = std::chrono::steady_clock::now();
      running_ = true;
    }
    auto failed = [&](std::size_t r, const std::exception_ptr& error) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      abort_all(detail::str_cat("rank ", r, " failed: ", what));
    };
    for (std::size_t r = 1; r < ranks_.size(); ++r) {
      NativeSession* session = ranks_[r].get();
      workers_[r - 1]->start([this, session, fn, r, failed]() mutable {
        try {
          fn(*session, false);
        } catch (...) {
          failed(r, std::current_exception());
          throw;
        }
      });
    }
    std::exception_ptr first_error;
    try {
      fn(*ranks_[0], true);
    } catch (...) {
      first_error = std::current_exception();
      failed(0, first_error);
    }
    for (auto& w : workers_) {
      std::exception_ptr error = w->wait();
      if (error && !first_error) first_error = error;
    }
    {
      std::lock_guard<std::mutex> watch(watch_mutex_);
      running_ = false;
    }
    if (first_error) std::rethrow_exception(first_error);
  }

  // Aborts the communicators when a run outlasts their timeout (Note [Tensor-parallel sessions]).
  void watch() {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    const auto timeout = comms_[0]->options().timeout;
    while (!stopping_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (running_ && std::chrono::steady_clock::now() - run_started_ > timeout) {
        running_ = false;
        lock.unlock();
        abort_all(detail::str_cat("timeout: a tensor-parallel run took longer than ",
                                  static_cast<double>(timeout.count()) / 1000.0, " s"));
        lock.lock();
      }
    }
  }

  SessionOptions options_;
  std::vector<std::shared_ptr<distributed::Communicator>> comms_;
  std::vector<std::unique_ptr<NativeSession>> ranks_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex run_mutex_;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  bool running_ = false;
  std::chrono::steady_clock::time_point run_started_;
  std::thread watchdog_;
};

class NativeEngine final : public Engine {
 public:
  NativeEngine() : Engine("native") {}

  Support available(const SessionOptions& options) const override {
    if (options.device.is_cpu()) return Support::yes();
    if (options.device.is_cuda()) {
#if XPURT_WITH_CUDA
      return Support::yes();
#else
      return Support::no("this xpuruntime was built without CUDA");
#endif
    }
    return Support::no("the native engine runs on cpu and cuda devices");
  }

  std::unique_ptr<EngineSession> create(const std::string& model, const SessionOptions& options) const override {
    OnnxImportOptions import_options;
    import_options.model_dir = options.model_dir;
    import_options.allow_newer_opsets = options.exec_policy.allow_newer_opsets;
    // Note [Libraries warmed while the model is read]: the session keeps the helper's future (its destruction waits
    // for the helper); on the other paths this future's destructor does.
    std::future<double> warming;
    if (options.device.is_cuda()) {
      warming = std::async(std::launch::async, warm_libraries, options.device, options.exec_policy);
    }
    const auto start = std::chrono::steady_clock::now();
    Graph graph = import_onnx(model, import_options);
    const double import_ms = detail::ms_since(start);
    if (options.exec_policy.tensor_parallel > 1) return std::make_unique<TensorParallelSession>(graph, options);
    auto session = std::make_unique<NativeSession>(std::move(graph), options, TensorParallelRank{}, import_ms);
    if (warming.valid()) session->keep_warm_up(warming.share());
    return session;
  }
};

}  // namespace

void register_native(EngineRegistry& registry) { registry.add(std::make_unique<NativeEngine>()); }

}  // namespace xpuruntime
