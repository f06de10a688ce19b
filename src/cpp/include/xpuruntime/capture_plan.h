// CapturePlan: the fixed execution strategy of a Graph for one set of input shapes (runtime_graph_capture.md
// section 2): the graph specialised to those shapes and optimized (constants folded, nodes fused), each node's
// kernel chosen by the Dispatcher under the session's policies, the launch order, and the memory plan (every
// intermediate's lifetime known, one arena with offsets reused across non-overlapping lifetimes).
//
//   auto plan = CapturePlan::build(graph, {{1, 3, 224, 224}}, options);
//   std::cout << plan->memory().str();          // peak bytes, before anything runs
//   GraphExec exec(plan);                        // graph_exec.h
//
// Note [Static and dynamic steps]
// A step is static when its input shapes are known at build time (every step of ordinary CNN/transformer
// exports once shapes are folded): its output descriptors, kernel plan and arena slot are fixed. A step that
// follows a reference-library node whose output shape depends on values (NonZero, a shape computed at run
// time, ...) is dynamic: it is dispatched when it runs (the Dispatcher caches per signature) and its outputs are
// allocated then. Dynamic and reference steps run on the CPU only; a plan on CUDA has neither, and only a plan
// made of kernel and view steps can be captured into a CUDA graph.
//
// Note [Segmented plans]
// A node whose output shape depends on values (NonZero, NonMaxSuppression; a TopK, Reshape, If, ... whose k, shape
// or condition is computed from data) would leave everything after it with shapes known only at run time. So the
// plan ends there, at a segment boundary (SegmentBoundary): the plan holds every node whose shapes are static
// (its "static part"), plus
//   - NonZero and NonMaxSuppression in a bounded form (registry ops non_zero and non_max_suppression): their output
//     is sized for the largest possible result and a device count says how much of it is filled, so they launch
//     without a host synchronization and the whole segment is captured into one CUDA graph;
//   - the small integer, bool or float values (at most 64 elements) that other such nodes read as k, shape, sizes
//     or condition, as outputs.
// GraphExec runs the segment, reads the counts (one copy) and those values to the host, cuts the bounded outputs
// to their counts, and runs the next segment: the remaining nodes, built as a plan of their own (CapturePlan::build
// again, so it is optimized, dispatched, memory-planned and captured like any plan, and may end at a boundary
// itself) for the shapes of the values it receives, with the host values as constants (an If on one is inlined:
// Note [Branches of constant If nodes]). Next-segment plans are cached per signature (shapes and host values), at
// most `SegmentBoundary::max_plans` per boundary (the least recently used goes). explain() lists the segments.
// A frontier node that is neither kind (Loop, Unique, ...) leaves the plan unsegmented: on the CPU such nodes run as
// dynamic steps; on CUDA the model is refused listing them.
//
// Ownership: a plan is immutable once built and shared (std::shared_ptr) by the GraphExecs that run it; it owns
// its constants (on the plan's device). Thread-safety: const methods are safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/export.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {

struct XPURT_API PlanValue {
  enum class Kind { kInput, kConstant, kIntermediate };
  std::string name;
  Kind kind = Kind::kIntermediate;
  ValueType type;             // fully known for static values
  bool is_output = false;     // a graph output
  int view_of = -1;           // the value whose bytes this one shares (a view step's output), else -1
  std::size_t view_offset = 0;  // where in view_of's bytes this one starts (Note [Views at an offset])
  bool planned = false;       // has an arena slot
  std::size_t offset = 0;     // in the arena (planned values)
  std::size_t bytes = 0;
  int first_step = -1;        // the step that produces it (-1: before the first step)
  int last_step = -1;         // the last step that reads it (outputs: the number of steps)
  Tensor constant;            // kConstant: the value on the plan's device
};

struct XPURT_API PlanStep {
  enum class Kind {
    kKernel,     // a registry op run by the kernel the Dispatcher chose
    kView,       // output = input 0 reshaped (no kernel, no copy)
    kReference,  // the ONNX reference library (CPU)
  };
  Kind kind = Kind::kKernel;
  std::string node;       // node name
  std::string op_type;    // ONNX op type (com.xpuruntime ones prefixed: "xpuruntime:FusedConv")
  std::vector<int> inputs;   // value ids (-1 = absent optional)
  std::vector<int> outputs;  // value ids (-1 = unused optional output)
  // kKernel
  std::string op;                            // registry op
  Attributes attrs;
  bool dynamic = false;                      // Note [Static and dynamic steps]
  OpDescriptor desc;                         // static steps
  std::shared_ptr<const Dispatch> dispatch;  // static steps: kernel, plan and the Dispatcher's decision
  // kReference
  std::shared_ptr<const Node> reference_node;
  std::int64_t opset = 0;
  // Values of this graph that the node's subgraphs (If/Loop/Scan bodies) read by name: their ids follow the
  // node's own inputs in `inputs`, so their lifetimes cover the step.
  std::vector<std::string> implicit_inputs;
  std::string reason;  // kReference: why the node is not lowered onto a registry op
  // Dynamic kKernel steps (CPU): the node's own inputs (value ids, -1 = absent) and `reference_node`, run by the
  // reference library when the registry op refuses what the run gives it (a dtype its kernels lack).
  std::vector<int> reference_inputs;
  // kReference steps of a CUDA plan (ExecutionPolicy.fallback == "cpu"): inputs copied to the host, outputs back.
  bool on_host = false;
};

struct XPURT_API MemoryPlan {
  std::size_t arena_bytes = 0;       // the arena (planned inputs, intermediates and outputs), offsets reused
  std::size_t unshared_bytes = 0;    // what the planned values would take without reuse
  std::size_t workspace_bytes = 0;   // kernel workspace, one region shared by the (sequential) steps
  std::size_t constant_bytes = 0;    // weights and other constants on the device
  std::size_t planned_values = 0;
  std::size_t dynamic_values = 0;    // values allocated at run time (dynamic and reference steps)
  std::size_t peak_bytes() const { return arena_bytes + workspace_bytes + constant_bytes; }
  std::string str() const;    // "peak 102.4 MiB = arena 12.3 MiB (reuse saves 80%) + workspace ... + constants ..."
  std::string to_json() const;
};

// The device copies of a session's constants, shared by its plans (Note [Constants shared between plans] in
// engines/native/plan/capture_plan.cpp): a plan's constant whose dtype, shape and bytes equal one already on the
// device is that tensor, not a new copy. Thread-safety: get() from any thread.
class XPURT_API DeviceConstantCache {
 public:
  // The device tensor for host constant `host` on `device`: the cached one of equal content, else a new copy (kept).
  Tensor get(const Tensor& host, Device device);
  std::size_t bytes() const;   // what the cached tensors hold on their devices
  std::size_t shared() const;  // get() calls answered by a tensor already there
  std::size_t size() const;    // tensors cached

 private:
  struct Entry {
    DType dtype;
    std::vector<std::int64_t> shape;
    Device device;
    Tensor tensor;
  };
  mutable std::mutex mutex_;
  std::multimap<std::uint64_t, Entry> entries_;  // by a fingerprint of the bytes; equal ones compared in full
  std::size_t bytes_ = 0;
  std::size_t shared_ = 0;
};

struct XPURT_API PlanOptions {
  Device device;                          // default: cpu
  std::shared_ptr<Dispatcher> dispatcher; // required: chooses kernels under the session's policies
  std::set<std::string> disabled_passes;  // graph passes turned off by name
  bool fold_constants = true;             // constant folding and shape folding (also needed for CUDA)
  DType compute_float = DType::kFloat32;  // float32 models run in float16/bfloat16 when set to those
  // A cap on the plan's peak bytes (ExecutionPolicy.memory_limit); 0: none. A plan that would need more raises
  // OutOfMemoryError when it is built, before anything is allocated.
  std::uint64_t memory_limit = 0;
  // ExecutionPolicy.fallback == "cpu": on a CUDA device a node without a CUDA kernel runs in the reference library
  // on the CPU, its inputs copied to the host and its outputs back (Note [Mixed execution]); false: such nodes make
  // build() raise UnsupportedOperationError listing every one.
  bool cpu_fallback = false;
  // ExecutionPolicy.fp8_fast_accumulation: the plan's float8 GEMMs (quantized_fusion's) take fast accumulation.
  bool fp8_fast_accumulation = false;
  // Tensor parallelism: the plan runs rank `tp_rank`'s shard of `tp_size` (the tensor_parallel pass), its
  // all-reduces on the communicator of handle `tp_comm` (distributed.h). 1: the whole model.
  int tp_size = 1;
  int tp_rank = 0;
  std::int64_t tp_comm = -1;
  // The session's device constants, shared by its plans (null: each plan copies its own constants to the device).
  std::shared_ptr<DeviceConstantCache> constants;
};

class CapturePlan;

// A Concat step that appends to a cache the caller holds (Note [Cache appended in place] in
// engines/native/plan/capture_plan.cpp): plan input `input` (a past) is its first input and read by no other step,
// plan output `output` (the present) its output.
struct XPURT_API CacheAppend {
  std::size_t step = 0;    // the Concat's index in steps()
  std::size_t input = 0;   // index in inputs()
  std::size_t output = 0;  // index in outputs()
  std::int64_t axis = 0;   // the Concat's axis, non-negative
};

// Where a segmented plan ends and how the next segment is made (Note [Segmented plans]).
struct XPURT_API SegmentBoundary {
  struct Carried {
    enum class Kind {
      kTensor,   // passed on as it is
      kColumns,  // a bounded non_zero output [rank, bound]: its first `count` columns
      kRows,     // a bounded non_max_suppression output [bound, 3]: its first `count` rows
      kHost,     // a small value read to the host: a constant of the next segment
    };
    std::string name;  // the value's name in the next segment (an input, or for kHost a constant)
    Kind kind = Kind::kTensor;
    int source = -1;   // this plan's output index, or -1 - k for this plan's input k
    int count = -1;    // kColumns, kRows: the count's position in the counts output
  };
  Graph rest;                      // the nodes after the boundary; inputs: the carried values but kHost, in order
  std::vector<Carried> carried;
  int counts_output = -1;          // this plan's output holding the bounded nodes' counts (int64), or -1
  std::vector<int> outputs;        // per graph output: >= 0 this plan's output, else -1 - k: the next segment's k
  std::vector<std::string> nodes;  // the data-dependent nodes where this segment ends ("NonZero '/model/NonZero'")
  PlanOptions options;             // what builds the next segments
  std::size_t max_plans = 16;

  // The next segment's plan for values of these shapes (`tensors`: the carried tensors, in `rest`'s input order)
  // and these host values (kHost, by name): cached per signature, built on the first request.
  std::shared_ptr<const CapturePlan> next(const std::vector<Tensor>& tensors,
                                          const std::vector<std::pair<std::string, Tensor>>& host) const;
  std::shared_ptr<const CapturePlan> last() const;  // the plan next() returned last (null before any)
  std::size_t plans() const;                        // next-segment plans cached
  std::string str() const;  // "ends at 6 data-dependent nodes (NonZero '/model/NonZero', ...): ..."

 private:
  mutable std::mutex mutex_;
  mutable std::list<std::pair<std::string, std::shared_ptr<const CapturePlan>>> cache_;  // most recent first
  mutable std::shared_ptr<const CapturePlan> last_;
};

class XPURT_API CapturePlan {
 public:
  // Specialises `graph` to `input_shapes` (one per graph input, in order; empty for a sequence or optional input,
  // whose tensors' shapes only its run knows), optimizes it, lowers every node and plans memory.
  // InvalidArgumentError when a shape does not fit the model's declared input; on CUDA,
  // UnsupportedOperationError listing every node that cannot run there (and for sequence or optional inputs and
  // outputs, which run on the CPU only).
  static std::shared_ptr<const CapturePlan> build(const Graph& graph,
                                                  const std::vector<std::vector<std::int64_t>>& input_shapes,
                                                  const PlanOptions& options);

  const Graph& graph() const { return graph_; }  // the optimized, specialised graph
  const std::vector<PlanStep>& steps() const { return steps_; }
  const std::vector<PlanValue>& values() const { return values_; }
  const std::vector<int>& inputs() const { return inputs_; }    // value ids of the graph inputs
  const std::vector<int>& outputs() const { return outputs_; }  // value ids of the graph outputs
  const MemoryPlan& memory() const { return memory_; }
  Device device() const { return device_; }
  DType compute_float() const { return compute_float_; }
  // PlanOptions::memory_limit (0: none): what a run may allocate beyond memory().peak_bytes() is the rest of it
  // (Note [Run memory budgets] in memory_manager.h).
  std::uint64_t memory_limit() const { return memory_limit_; }
  // Whether every step is a static kernel or view step on a CUDA device (a CUDA graph can replay the plan);
  // else why not.
  bool capturable(std::string* why = nullptr) const;
  // Per value: a graph output that a run writes into a tensor of its own, handed to the caller without a copy, instead
  // of its arena slot (Note [Outputs written where the caller gets them] in capture_plan.cpp).
  std::vector<bool> direct_outputs() const;
  // The Concat steps a run may perform as an append into the bound present (Note [Cache appended in place] in
  // capture_plan.cpp).
  std::vector<CacheAppend> cache_appends() const;
  const std::vector<std::string>& pass_notes() const { return pass_notes_; }
  // Where the build went, phase by phase (Note [Build phases] in engines/native/plan/capture_plan.cpp).
  const std::vector<BuildPhase>& build_phases() const { return build_phases_; }
  // The dispatcher that chose the kernels (dynamic steps dispatch through it when they run).
  const std::shared_ptr<Dispatcher>& dispatcher() const { return dispatcher_; }
  std::string str() const;  // the steps, one per line, with kernels and slots
  // Where this plan ends when it is the first segment of a segmented plan (Note [Segmented plans]), else null:
  // outputs() are then this segment's (the boundary maps them to the graph's).
  const std::shared_ptr<const SegmentBoundary>& boundary() const { return boundary_; }

 private:
  CapturePlan() = default;
  Graph graph_;
  std::vector<PlanStep> steps_;
  std::vector<PlanValue> values_;
  std::vector<int> inputs_;
  std::vector<int> outputs_;
  MemoryPlan memory_;
  Device device_;
  DType compute_float_ = DType::kFloat32;
  std::uint64_t memory_limit_ = 0;
  std::vector<std::string> pass_notes_;
  std::vector<BuildPhase> build_phases_;
  std::shared_ptr<Dispatcher> dispatcher_;
  std::shared_ptr<const SegmentBoundary> boundary_;
};

// The native engine's graph passes, in the order a plan runs them: each name (what PlanOptions::disabled_passes and
// SessionOptions::disabled_passes take) with one line on what it rewrites.
struct GraphPassInfo {
  std::string name;
  std::string doc;
};
XPURT_API std::vector<GraphPassInfo> graph_passes();

}  // namespace xpuruntime
