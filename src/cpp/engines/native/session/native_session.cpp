// The native engine's session (see native_session.h).
#include "engines/native/session/native_session.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "engines/native/passes/passes.h"
#include "engines/native/session/explain.h"
#include "engines/native/session/session_io.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::runtime {
namespace {

DType compute_float_of(const ExecutionPolicy& policy) {
  if (policy.precision == Precision::kFP16) return DType::kFloat16;
  if (policy.precision == Precision::kBF16) return DType::kBFloat16;
  return DType::kFloat32;
}

// The policy the session's kernels are chosen under. int8, fp8 and int4-weights are carried by the session's model
// (its QDQ nodes: made by the policy's decisions, or by its producer; onnx_frontend::model_for_policy refuses a float
// model without decisions), so its kernels are chosen as under fp32: the int8 ops and the int4 weight-only GEMM by
// their operands' types, every float op as under fp32. Left int8, every float kernel would refuse the plan's float
// ops ("no int8 kernel") and they would all go to the node kernels on the CPU.
ExecutionPolicy kernel_exec_policy(ExecutionPolicy policy) {
  if (policy.precision == Precision::kInt8 || policy.precision == Precision::kFP8 ||
      policy.precision == Precision::kInt4Weights) {
    policy.precision = Precision::kFP32;
  }
  return policy;
}

GraphExecOptions exec_options(const SessionOptions& options) {
  GraphExecOptions exec_options;
  exec_options.use_cuda_graph = options.exec_policy.cuda_graphs;
  return exec_options;
}

// The outputs of `outputs` that `wanted` names (empty: all of them).
template <typename T>
std::vector<T> select_outputs(std::vector<T> outputs, const std::vector<int>& wanted) {
  if (wanted.empty()) return outputs;
  std::vector<T> selected;
  for (int i : wanted) selected.push_back(outputs[i]);
  return selected;
}

// When `graph`'s constants outgrow the L2 cache of `device` (a GPU), why: then each run reads a weight from memory,
// and weight-streaming kernels are timed so (Note [Weights timed from memory] in core/dispatcher.cpp). Else empty.
std::string weights_outgrow_l2(const Graph& graph, const Device& device) {
  const DeviceManager& devices = DeviceManager::instance();
  if (!device.is_cuda() || device.index < 0 || device.index >= devices.get_device_count()) return {};
  std::size_t bytes = 0;
  for (const auto& [name, value] : graph.initializers) bytes += value.nbytes();
  const std::size_t l2 = devices.get_device_info(device).l2_cache_bytes;
  if (bytes <= l2) return {};
  return detail::str_cat("weight streams timed from memory (Note [Weights timed from memory]): the constants' ",
                         bytes >> 20, " MiB outgrow the L2 cache's ", l2 >> 20, " MiB");
}

}  // namespace

NativeSession::NativeSession(Graph graph, const SessionOptions& options, TensorParallelRank tp, double import_ms)
    : graph_(std::move(graph)), options_(options), pools_(exec_options(options)) {
  for (const auto& in : graph_.inputs) inputs_.push_back(value_info(graph_, in));
  for (const auto& out : graph_.outputs) outputs_.push_back(value_info(graph_, out));
  for (const auto* infos : {&inputs_, &outputs_}) {
    for (const ValueInfo& info : *infos) has_value_io_ |= info.kind != ValueKind::kTensor;
  }
  build_cache_ = BuildCache::open(options_);
  Dispatcher::Options dispatcher_options;
  dispatcher_options.build_cache = build_cache_ != nullptr;
  weight_timing_ = weights_outgrow_l2(graph_, options_.device);
  dispatcher_options.weights_from_memory = !weight_timing_.empty();
  dispatcher_ = std::make_shared<Dispatcher>(options_.kernel_policy, kernel_exec_policy(options_.exec_policy),
                                             build_cache_ ? build_cache_->cache() : nullptr, nullptr,
                                             dispatcher_options);
  plans_ = std::make_unique<PlanCache>(graph_, plan_options(tp), build_cache_.get(), import_ms);
  probe();
}

PlanOptions NativeSession::plan_options(TensorParallelRank tp) const {
  PlanOptions plan_options;
  plan_options.device = options_.device;
  plan_options.dispatcher = dispatcher_;
  plan_options.compute_float = compute_float_of(options_.exec_policy);
  plan_options.memory_limit = options_.exec_policy.memory_limit;
  plan_options.cpu_fallback = options_.exec_policy.fallback == "cpu";
  plan_options.fp8_fast_accumulation = options_.exec_policy.fp8_fast_accumulation;
  plan_options.tp_size = tp.size;
  plan_options.tp_rank = tp.rank;
  plan_options.tp_comm = tp.comm;
  plan_options.constants = constants_;  // Note [Constants shared between plans]
  const std::vector<passes::PassInfo>& known = passes::all_passes();
  for (const std::string& name : options_.disabled_passes) {
    const bool valid = std::any_of(known.begin(), known.end(), [&](const passes::PassInfo& p) { return p.name == name; });
    XPURT_CHECK(valid, "unknown graph pass '", name, "' in disabled_passes; valid names: ", passes::pass_names());
    plan_options.disabled_passes.insert(name);
  }
  return plan_options;
}

// Note [Support check at session creation] (native_engine.cpp): the probe plan, with every unknown dimension 1.
void NativeSession::probe() {
  const Shapes shapes = probe_shapes(graph_);
  try {
    plans_->plan_for(shapes, shape_key(shapes));
  } catch (const UnsupportedOperationError&) {
    throw;
  } catch (const OutOfMemoryError&) {
    throw;  // even the smallest shapes exceed the memory limit
  } catch (const XpuRuntimeError&) {
    // Not a support problem; the first run reports it.
  }
}

std::vector<Tensor> NativeSession::run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                       const std::vector<std::string>& output_names) {
  return run_tensors(feeds, output_names, nullptr);
}

// Note [I/O binding] (core/engine.cpp): the plan's outputs are copied straight into the bound tensors (on the run's
// stream, like the copies run() makes into new tensors), so binding costs no extra copy or synchronization.
void NativeSession::run_into(const std::vector<std::pair<std::string, Tensor>>& feeds,
                             const std::vector<std::string>& output_names, std::vector<Tensor>& outputs) {
  std::vector<Tensor> results = run_tensors(feeds, output_names, &outputs);
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined()) outputs[k] = std::move(results[k]);
  }
}

// Note [Sequence and optional values] (value.h): a model whose inputs and outputs are all tensors runs through
// run_tensors (plans, pools and CUDA graphs as run() does); one with sequence or optional inputs or outputs runs its
// CPU plan through GraphExec::run_values.
std::vector<Value> NativeSession::run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                             const std::vector<std::string>& output_names) {
  if (has_value_io_) return run_host_values(feeds, output_names);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, value] : feeds) {
    const ValueType* vt = is_input(name) ? graph_.type(name) : nullptr;
    XPURT_CHECK_TYPE(!value.defined() || value.is_tensor() || !is_input(name), "input '", name, "' expects ",
                     vt ? vt->type_str() : std::string("a tensor"), ", got ", value.str());
    tensors.emplace_back(name, value.is_tensor() ? value.tensor() : Tensor());
  }
  std::vector<Tensor> outputs = run_tensors(tensors, output_names, nullptr);
  return {outputs.begin(), outputs.end()};
}

std::vector<Value> NativeSession::run_host_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                                  const std::vector<std::string>& output_names) {
  const std::pair<std::vector<Value>, Shapes> fed = order_value_feeds(graph_, inputs_, feeds);
  const std::vector<Value>& ordered = fed.first;
  const std::vector<int> wanted = output_indices(graph_, output_names);
  const std::string key = shape_key(fed.second);
  std::shared_ptr<const CapturePlan> plan = plans_->plan_for(fed.second, key);
  if (!options_.optimized_model_path.empty()) plans_->save_optimized(*plan, options_.optimized_model_path);
  std::vector<Value> outputs =
      pools_.run(plan, key, [&](GraphExec& exec) { return exec.run_values(ordered); });
  return select_outputs(std::move(outputs), wanted);
}

std::vector<Tensor> NativeSession::run_tensors(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                               const std::vector<std::string>& output_names,
                                               const std::vector<Tensor>* bound) {
  if (has_value_io_) refuse_tensor_run();
  const std::vector<Tensor> ordered = order_feeds(graph_, feeds);
  const Shapes shapes = feed_shapes(graph_, inputs_, ordered);
  const std::vector<int> wanted = output_indices(graph_, output_names);
  const std::string key = shape_key(shapes);
  if (options_.exec_policy.static_shape) check_static_shape(key);
  std::shared_ptr<const CapturePlan> plan = plans_->plan_for(shapes, key);
  if (!options_.optimized_model_path.empty()) plans_->save_optimized(*plan, options_.optimized_model_path);
  std::vector<Tensor> into = bound != nullptr ? bound_outputs(*bound, wanted) : std::vector<Tensor>{};
  std::vector<Tensor> outputs = pools_.run(plan, key, [&](GraphExec& exec) {
    return exec.run(ordered, bound != nullptr ? &into : nullptr);
  });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last_feeds_on_device_.assign(ordered.size(), false);
    for (std::size_t i = 0; i < ordered.size(); ++i) last_feeds_on_device_[i] = ordered[i].device() == options_.device;
  }
  return select_outputs(std::move(outputs), wanted);
}

void NativeSession::refuse_tensor_run() const {
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

void NativeSession::check_static_shape(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_key_.empty()) static_key_ = key;
  XPURT_CHECK(key == static_key_, "static_shape=true: this session runs the input shapes of its first run ",
              static_key_, " only, got ", key);
}

std::vector<Tensor> NativeSession::bound_outputs(const std::vector<Tensor>& bound, const std::vector<int>& wanted) const {
  std::vector<Tensor> into(graph_.outputs.size());  // per model output: the bound tensor, if any
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    const Tensor& t = bound[k];
    if (!t.defined()) continue;
    XPURT_CHECK(!into[wanted[k]].defined(), "output '", graph_.outputs[wanted[k]], "' is bound twice");
    XPURT_CHECK(t.device() == options_.device, "output '", graph_.outputs[wanted[k]], "' is bound to a tensor on ",
                t.device().str(), ", not on the session's device ", options_.device.str());
    into[wanted[k]] = t;
  }
  return into;
}

bool NativeSession::is_input(const std::string& name) const {
  return std::find(graph_.inputs.begin(), graph_.inputs.end(), name) != graph_.inputs.end();
}

Explanation NativeSession::explain() const {
  SessionState state;
  state.last_plan = plans_->last();
  state.plans = plans_->size();
  state.constants = constants_->size();
  state.constant_bytes = constants_->bytes();
  state.constants_shared = constants_->shared();
  state.captured = pools_.captured(&state.capture_failure);
  state.executors_released = pools_.released();
  std::tie(state.appends_in_place, state.runs_appending) = pools_.appends_in_place();
  if (build_cache_) {
    state.build_cache = detail::str_cat(build_cache_->path().string(), ", ", build_cache_->size(), " kernel decision(s)");
  }
  state.weight_timing = weight_timing_;
  state.build = plans_->build_phases();
  if (warm_up_.valid() && warm_up_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    state.build.insert(state.build.begin() + (state.build.empty() ? 0 : 1),
                       {"libraries warmed (helper thread, during the import and passes)", warm_up_.get()});
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state.feeds_on_device = last_feeds_on_device_;
  }
  return explain_session(options_, state);
}

}  // namespace xpuruntime::runtime
