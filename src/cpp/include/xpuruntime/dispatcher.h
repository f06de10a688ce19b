// Dispatcher: picks the kernel for each op under a KernelPolicy and an ExecutionPolicy, builds its plan, and
// records the decision — every candidate, why each rejected one was rejected, timings when autotuned, the
// winner and its plan record. Decisions are what `explain` shows.
//
// Autotuning (rule `auto` with BestPerformance) times every supporting kernel on scratch tensors of the real
// shapes and keeps the fastest. Its results go to an AutotuneCache keyed by the op signature, the device
// (name, compute capability), the driver and library versions and the policy bits that matter, saved as a
// JSON file: a lock file of decisions. A cached entry is replayed without re-timing, with the same kernel and
// the same plan record (e.g. the same cuBLASLt algorithm).
//
// Ownership: a Dispatcher owns its plans and decisions; the AutotuneCache is shared (shared_ptr).
// Thread-safety: `select` and `run` may be called from several threads; AutotuneCache is internally locked.
#pragma once

#include <cstddef>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xpuruntime/execution_policy.h"
#include "xpuruntime/export.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

struct XPURT_API CandidateReport {
  std::string kernel;
  std::string backend;
  bool supported = false;
  std::string reason;    // why not, when not supported or not chosen
  double time_us = -1;   // measured time when autotuned, else -1
};

struct XPURT_API Decision {
  std::string op;
  std::string family;
  std::string signature;
  std::string kernel;    // the winner
  std::string backend;
  // How the winner was chosen: "pinned", "preferred", "fallback" (no preferred kernel could run),
  // "first-supported", "autotuned", "autotune-cache".
  std::string rule;
  std::string policy_rule;  // the rule that applied, in short form ("cublasLt", "pin:flash_v2", "auto")
  std::string reason;       // one sentence
  std::vector<CandidateReport> candidates;
  std::string plan_record;    // the plan's record (JSON text) or empty
  std::string plan_summary;   // the plan's one-line description
  std::string to_json() const;  // one JSON object
  std::string str() const;      // one line for humans
};

class XPURT_API AutotuneCache {
 public:
  struct Entry {
    std::string kernel;
    std::string plan_record;
    std::map<std::string, double> times_us;  // every timed candidate
  };
  AutotuneCache() = default;
  // A cache backed by `path`: loaded now when the file exists (InvalidArgumentError when it is malformed),
  // written back by `save()` and after each new entry when `autosave`.
  explicit AutotuneCache(std::string path, bool autosave = true);

  // Key for `desc` on its device: signature + device name + driver/runtime/cuBLAS/cuDNN versions.
  static std::string key(const OpDescriptor& desc);
  bool lookup(const std::string& key, Entry* entry) const;
  void store(const std::string& key, Entry entry);
  std::size_t size() const;
  void clear();
  void save() const;           // to `path()`; UnsupportedOperationError without a path
  void save(const std::string& path) const;
  const std::string& path() const { return path_; }
  std::string to_json() const;  // canonical

 private:
  mutable std::mutex mutex_;
  std::string path_;
  bool autosave_ = false;
  std::map<std::string, Entry> entries_;
};

// A selected kernel with its plan, ready to run.
struct XPURT_API Dispatch {
  const Kernel* kernel = nullptr;
  std::shared_ptr<const KernelPlan> plan;
  Decision decision;
};

class XPURT_API Dispatcher {
 public:
  struct Options {
    int autotune_warmup = 2;       // untimed runs per candidate
    int autotune_iterations = 10;  // timed runs per candidate (the median is kept)
    // The autotune cache serves as a build cache (Note [Build cache] in engines/native/native_engine.cpp): an
    // entry re-creates the plan of the kernel the rule picks, but a first-supported rule still picks by priority
    // (the decision reads as without the cache), and a record that cannot be re-created is built afresh instead
    // of being an error.
    bool build_cache = false;
    // The model's constants outgrow the device's L2 cache, so a weight is read from memory each run: a descriptor a
    // candidate streams the weight of (Kernel::streams_weight) is timed with the L2 cache cleared before each run
    // (Note [Weights timed from memory] in dispatcher.cpp). The native engine sets it per session.
    bool weights_from_memory = false;
  };
  Dispatcher(KernelPolicy kernel_policy, ExecutionPolicy exec_policy,
             std::shared_ptr<AutotuneCache> cache = nullptr, const KernelRegistry* registry = nullptr);
  Dispatcher(KernelPolicy kernel_policy, ExecutionPolicy exec_policy, std::shared_ptr<AutotuneCache> cache,
             const KernelRegistry* registry, Options options);

  // Fills the policy bits of `desc`, validates it, infers the outputs, and returns the (cached) dispatch for
  // its signature. Throws UnsupportedOperationError (pinned kernel cannot run it, or no kernel can) with
  // every candidate's reason. Thread-safe: threads deciding different signatures build their plans at once (Note
  // [Parallel kernel selection] in engines/native/plan/capture_plan.cpp); a thread asking for a signature another is
  // deciding waits for that decision.
  std::shared_ptr<const Dispatch> select(OpDescriptor& desc);
  // The first half of select: the policy bits, validation and the outputs' inference, without deciding.
  void prepare(OpDescriptor& desc) const;

  // select + allocate outputs (on `stream`) and workspace + run. `decision` (optional) receives a copy.
  std::vector<Tensor> run(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                          const StreamView* stream = nullptr, Decision* decision = nullptr);

  // select + run into caller-allocated `outputs` (contiguous, of the inferred shapes and dtypes, on the op's
  // device; InvalidArgumentError naming the output otherwise), with the caller's `workspace` when given (at least
  // the plan's workspace_bytes on the op's device) instead of the MemoryManager's. Nothing is allocated here then:
  // a framework (xpuruntime.pytorch) allocates with its own allocator, also inside its CUDA graph captures.
  void run_into(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                std::vector<Tensor>& outputs, const StreamView* stream = nullptr, Decision* decision = nullptr,
                const Tensor* workspace = nullptr);

  // Every kernel's answer to "can you run `desc`?" under this dispatcher's ExecutionPolicy, in priority order.
  // Validates and infers `desc` like `select`; decides and builds nothing.
  std::vector<CandidateReport> candidates(OpDescriptor& desc) const;

  // Every distinct decision made so far, in the order they were first made.
  std::vector<Decision> decisions() const;
  const KernelPolicy& kernel_policy() const { return kernel_policy_; }
  const ExecutionPolicy& exec_policy() const { return exec_policy_; }
  const std::shared_ptr<AutotuneCache>& autotune_cache() const { return cache_; }
  const KernelRegistry& registry() const { return *registry_; }

 private:
  struct Selection;  // one decision while its phases run (dispatcher.cpp)
  std::shared_ptr<Dispatch> decide(const OpDescriptor& desc);
  void list_candidates(Selection& s, const OpSchema& schema) const;
  const Kernel* pick_pinned(Selection& s) const;
  const Kernel* pick_preferred(Selection& s) const;
  const Kernel* pick_auto(Selection& s);
  const Kernel* autotune(Selection& s, const std::string& why = {});
  bool build_plan(Selection& s, const Kernel& winner);
  void record_decision(Selection& s, const Kernel& winner) const;
  std::vector<CandidateReport> evaluate(const OpDescriptor& desc) const;
  // The median time of `plan` on random inputs of `desc`'s shapes; `flush` (a device buffer of twice the L2's size,
  // or null): written before each timed run, so that it starts with the L2 cleared.
  double time_candidate(const KernelPlan& plan, const OpDescriptor& desc, const Tensor* flush = nullptr);

  KernelPolicy kernel_policy_;
  ExecutionPolicy exec_policy_;
  std::shared_ptr<AutotuneCache> cache_;
  const KernelRegistry* registry_;
  Options options_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const Dispatch>> dispatches_;
  // Signatures being decided, by the thread that decides them (select's other callers wait on the future).
  std::map<std::string, std::shared_future<std::shared_ptr<const Dispatch>>> in_flight_;
  std::vector<std::string> order_;  // signatures in the order they were first asked for
};

// Held while anything times kernels on a GPU (autotuning, cuDNN's algorithm search), so that plans built at once
// on several threads (Note [Parallel kernel selection]) never time against each other.
XPURT_API std::mutex& gpu_timing_mutex();

// The median time in microseconds of `iterations` runs of `plan` (after `warmup` untimed ones) on random inputs of
// `desc`'s shapes: on a GPU, on gpu_timing_stream() with gpu_timing_mutex() held (so call it without), each run behind
// a StreamGate (Note [Timing without host gaps]); `flush` (a device buffer of twice the L2's size, or null) is written
// before each timed run so that it starts with the L2 cleared. What the dispatcher times candidates with, and kernels
// their own tactics (cudnn_search's algorithms).
XPURT_API double time_plan(const KernelPlan& plan, const OpDescriptor& desc, int warmup = 2, int iterations = 10,
                           const Tensor* flush = nullptr);

// The stream that GPU timings run on (Note [Timings on a stream of their own]): one per device, non-blocking, never
// destroyed. Call with gpu_timing_mutex() held.
XPURT_API StreamView gpu_timing_stream(Device device);

// Fills `desc.device`, compute capability, precision and determinism from the inputs and `policy`.
XPURT_API OpDescriptor make_op_descriptor(const std::string& op, const std::vector<Tensor>& inputs,
                                          const Attributes& attrs, const ExecutionPolicy& policy);

}  // namespace xpuruntime
