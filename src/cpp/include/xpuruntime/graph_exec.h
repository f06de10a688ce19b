// GraphExec: runs a CapturePlan (runtime_graph_capture.md section 3). It owns the plan's arena on the device
// and, on CUDA, a stream and (when the plan is capturable and CUDA graphs are on) the instantiated CUDA graph:
// the first run executes the steps eagerly (warm-up: lazy library initialisation happens outside capture), the
// second captures them, every later run copies the inputs into their fixed arena slots and replays.
//
//   GraphExec exec(plan, {.use_cuda_graph = true});
//   std::vector<Tensor> outputs = exec.run({x});   // inputs in the plan's input order
//
// Outputs are new tensors owned by the caller (copied out of the arena: the next run overwrites it).
// While a Profiler records (profiler.h), each step is a host-timed "node" event and CUDA graphs are not replayed:
// the steps run eagerly so that CUPTI can tie each kernel to its node (Note [Kernel to node correlation] in
// core/profiler.cpp).
// Ownership: a GraphExec shares its plan. Thread-safety: one run at a time per GraphExec (the arena is reused);
// sessions keep a pool of them to serve concurrent runs.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/capture_plan.h"
#include "xpuruntime/export.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime {

struct XPURT_API GraphExecOptions {
  bool use_cuda_graph = true;  // capture and replay when the plan is capturable (ignored on the CPU)
};

class XPURT_API GraphExec {
 public:
  explicit GraphExec(std::shared_ptr<const CapturePlan> plan, GraphExecOptions options = {});
  ~GraphExec();
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;

  // Runs the plan. `inputs`: one tensor per plan input, with the plan's shapes and dtypes, on any device (copied
  // when not on the plan's device). Returns when the outputs are ready. `into` (optional, one entry per plan output):
  // defined entries are tensors of the output's shape and dtype on the plan's device that receive the output
  // (I/O binding) and are returned as it.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into = nullptr);
  // run() for plans with sequence or optional inputs or outputs (Note [Sequence and optional values] in value.h;
  // CPU plans): one value per plan input, a tensor as run() takes it or a sequence or optional of CPU tensors as
  // the input is declared (InvalidTypeError naming the input otherwise). Returns one value per plan output;
  // tensors in sequences and optionals that are an input's or a constant's are copied, so the caller owns them.
  std::vector<Value> run_values(const std::vector<Value>& inputs);

  const CapturePlan& plan() const { return *plan_; }
  // Note [Segmented plans]: the GraphExecs of the next segments this one has run (most recent first; bounded by
  // the boundary's max_plans).
  const std::list<std::unique_ptr<GraphExec>>& next_segments() const { return next_; }
  bool graph_captured() const;       // a CUDA graph is instantiated and replayed
  // Why capturing this plan failed (Note [Failed captures]); empty when it did not. The run that failed raised the
  // error; this executor then runs the plan eagerly.
  const std::string& capture_failure() const { return capture_failure_; }
  // Tests only (Note [Failed captures]): the next time step `node` runs, "capture" synchronizes its stream while a
  // CUDA graph is being captured (what a kernel that synchronizes does: the capture fails), "oom" raises
  // OutOfMemoryError there. One shot, any GraphExec of the process; an empty node clears it.
  static void inject_step_fault_for_testing(const std::string& node, const std::string& kind);
  std::int64_t runs() const { return runs_; }
  std::int64_t replays() const { return replays_; }
  // Concat steps run as appends into a bound present so far (Note [Cache appended in place] in capture_plan.cpp),
  // and the runs that made one.
  std::int64_t appends_in_place() const { return appends_in_place_; }
  std::int64_t runs_appending() const { return runs_appending_; }

 private:
  std::vector<Tensor> run_bound(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into);
  std::vector<Tensor> run_segmented(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into);
  GraphExec& next_exec(const std::shared_ptr<const CapturePlan>& plan);
  void bind_inputs(const std::vector<Tensor>& inputs, std::vector<Tensor>& values);
  // Note [Appends of a run] (graph_exec.cpp): which of appends_ this run performs in place; their presents bound.
  bool prepare_appends(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into);
  void bind_appends(const std::vector<Tensor>* into, std::vector<Tensor>& values) const;
  void run_append(const CacheAppend& append, std::vector<Tensor>& values, const StreamView& stream) const;
  std::vector<Tensor> run_steps(const std::vector<Tensor>& inputs, std::uint32_t profiling,
                                const std::vector<Tensor>* into);
  std::vector<Tensor> run_profiled(const std::vector<Tensor>& inputs, std::uint32_t profiling,
                                   const std::vector<Tensor>* into);
  // `profiling`: profiler::state() read once by run(); 0 when off.
  // `labelled`: capturing under graph-node labels (Note [Graph node attribution] in core/profiler_graph.cpp).
  void execute_steps(std::vector<Tensor>& values, const StreamView& stream, std::uint32_t profiling,
                     bool labelled = false);
  void register_graph_labels();
  std::vector<Tensor> collect_outputs(const std::vector<Tensor>& values, const StreamView& stream,
                                      const std::vector<Tensor>* into);

  std::shared_ptr<const CapturePlan> plan_;
  GraphExecOptions options_;
  Tensor arena_;
  Tensor workspace_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<CudaGraph> graph_;
  bool capturing_ = false;  // execute_steps is recording a CUDA graph (no synchronization allowed)
  std::vector<Tensor> slots_;  // planned values as views into the arena (undefined for others)
  std::vector<bool> direct_outputs_;  // Note [Outputs written where the caller gets them]: per plan value
  std::vector<Tensor> replay_values_;  // a replay's tensor table: only input and output entries set, during a run
  // Note [Tensor tables kept from run to run]: an eager run's tensor table, and each kernel step's inputs and outputs;
  // their references are dropped when a run ends, their shape and stride vectors kept.
  std::vector<Tensor> eager_values_;
  std::vector<std::vector<Tensor>> step_inputs_, step_outputs_;
  struct TablesReleased;  // resets the above when a run ends (graph_exec.cpp)
  std::int64_t runs_ = 0;
  std::int64_t replays_ = 0;
  std::vector<std::uint64_t> graph_labels_;  // one per step, registered on first need
  // Per plan value: the sequences and optionals of the current run (inputs bound by run_values, outputs of
  // reference steps); a tensor value lives in the run's tensor table instead. Cleared when a run ends.
  std::vector<Value> boxed_;
  bool has_boxed_ = false;  // the plan has reference steps or sequence/optional inputs
  bool graph_labelled_ = false;              // graph_ was captured while a profiler tracked graph nodes
  std::list<std::unique_ptr<GraphExec>> next_;  // Note [Segmented plans]
  // Note [Cache appended in place]: the plan's candidate appends, per step the index of its append (-1: none), which
  // ones this run performs, and the presents' addresses the captured graph writes (null: run as a Concat).
  std::vector<CacheAppend> appends_;
  std::vector<int> append_of_step_;
  std::vector<char> appending_;
  std::vector<char> past_in_place_;          // per plan input: the past of an append this run makes in place
  std::vector<const void*> run_appends_;     // this run's presents (null: a Concat run as such), kept from run to run
  std::vector<const void*> graph_appends_;
  std::int64_t appends_in_place_ = 0;
  std::int64_t runs_appending_ = 0;
  std::string capture_failure_;                 // Note [Failed captures]
};

}  // namespace xpuruntime
