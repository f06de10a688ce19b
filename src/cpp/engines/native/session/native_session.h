// The native engine's session (EngineSession): feeds in, outputs out, through the plan of the feeds' shapes. Its
// roles are in the files beside this one: session_io (feeds, outputs and signatures), plan_cache (the plans per
// signature and the executor pools), build_cache (Note [Build cache]), explain (explain()), warm_up (Note
// [Libraries warmed while the model is read]). Internal header.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engines/native/session/build_cache.h"
#include "engines/native/session/plan_cache.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/graph.h"

namespace xpuruntime::runtime {

// One rank of a tensor-parallel session (Note [Tensor-parallel sessions]): the plans shard the model.
struct TensorParallelRank {
  int size = 1;
  int rank = 0;
  std::int64_t comm = -1;
};

// Thread-safety: run, run_into, run_values and explain may be called from several threads at once.
class NativeSession final : public EngineSession {
 public:
  // `import_ms`: how long the ONNX import took (the first of explain().build's phases; Note [Build phases]).
  // Builds the probe plan (Note [Support check at session creation] in native_engine.cpp): UnsupportedOperationError
  // or OutOfMemoryError when the model cannot run on the device.
  NativeSession(Graph graph, const SessionOptions& options, TensorParallelRank tp = {}, double import_ms = 0);

  const std::vector<ValueInfo>& inputs() const override { return inputs_; }
  const std::vector<ValueInfo>& outputs() const override { return outputs_; }

  // Note [Libraries warmed while the model is read]: the helper may still run after creation (a small model's plan
  // is built before the libraries are loaded); this session's destruction waits for it.
  void keep_warm_up(std::shared_future<double> warm_up) { warm_up_ = std::move(warm_up); }

  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names) override;
  void run_into(const std::vector<std::pair<std::string, Tensor>>& feeds, const std::vector<std::string>& output_names,
                std::vector<Tensor>& outputs) override;
  std::vector<Value> run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                const std::vector<std::string>& output_names) override;
  Explanation explain() const override;

 private:
  PlanOptions plan_options(TensorParallelRank tp) const;
  void probe();
  // `bound`: run_into's outputs (one per output name; defined entries are written in place), or null.
  std::vector<Tensor> run_tensors(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                  const std::vector<std::string>& output_names, const std::vector<Tensor>* bound);
  // run_values of a model with sequence or optional inputs or outputs: its CPU plan through GraphExec::run_values.
  std::vector<Value> run_host_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                     const std::vector<std::string>& output_names);
  // InvalidTypeError naming the sequence and optional inputs and outputs (run() takes tensors only).
  [[noreturn]] void refuse_tensor_run() const;
  // static_shape: InvalidArgumentError unless `key` is the first run's signature.
  void check_static_shape(const std::string& key);
  // run_into's bound tensors per model output (undefined where none is bound); checks each binding.
  std::vector<Tensor> bound_outputs(const std::vector<Tensor>& bound, const std::vector<int>& wanted) const;
  bool is_input(const std::string& name) const;

  Graph graph_;
  SessionOptions options_;
  std::vector<ValueInfo> inputs_;
  std::vector<ValueInfo> outputs_;
  bool has_value_io_ = false;  // a sequence or optional input or output (run_values)
  std::unique_ptr<BuildCache> build_cache_;  // Note [Build cache]; null when off
  std::string weight_timing_;  // why weight streams are timed from memory (Note [Weights timed from memory]); or empty
  std::shared_ptr<Dispatcher> dispatcher_;
  // The plans' device constants (Note [Constants shared between plans] in engines/native/plan/capture_plan.cpp).
  std::shared_ptr<DeviceConstantCache> constants_ = std::make_shared<DeviceConstantCache>();
  std::unique_ptr<PlanCache> plans_;
  ExecutorPools pools_;
  mutable std::mutex mutex_;
  std::string static_key_;                  // static_shape: the input shapes of the first run (under mutex_)
  std::vector<bool> last_feeds_on_device_;  // per input: the last run's feed was on the session's device (mutex_)
  std::shared_future<double> warm_up_;      // Note [Libraries warmed while the model is read]; waited for last
};

}  // namespace xpuruntime::runtime
