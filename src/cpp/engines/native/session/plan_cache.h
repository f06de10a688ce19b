// A native session's plans (one per input-shape signature) and the pools of executors that run them. Internal
// header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engines/native/session/build_cache.h"
#include "engines/native/session/session_io.h"
#include "xpuruntime/capture_plan.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/graph_exec.h"

namespace xpuruntime::runtime {

// The plans of one session, keyed by signature (shape_key), each built on its first request, and the log of where
// the builds went (Note [Build phases]). Thread-safety: every method may be called from any thread; one plan is
// built at a time, and a request for a cached plan does not wait for a build.
class PlanCache {
 public:
  // `graph` must outlive the cache. `build_cache` (may be null) is saved after each build. `import_ms` > 0: the
  // ONNX import's time, the log's first phase.
  PlanCache(const Graph& graph, PlanOptions options, BuildCache* build_cache, double import_ms);

  // The plan for `shapes`, whose signature is `key`: the cached one, else CapturePlan::build's (its exceptions
  // propagate; nothing is cached then).
  std::shared_ptr<const CapturePlan> plan_for(const Shapes& shapes, const std::string& key);
  std::shared_ptr<const CapturePlan> last() const;  // the plan plan_for returned last from the cache or a build
  std::size_t size() const;                         // plans built
  // The import, then every plan build's phases ("plan [1,3]: lowering") and total, in order.
  std::vector<BuildPhase> build_phases() const;
  // SessionOptions::optimized_model_path: writes `plan`'s graph (specialised to its input shapes) to `path` the
  // first time it is called; InvalidArgumentError when the file cannot be written.
  void save_optimized(const CapturePlan& plan, const std::string& path);

 private:
  const Graph& graph_;
  const PlanOptions options_;
  BuildCache* build_cache_;
  mutable std::mutex mutex_;
  std::mutex build_mutex_;  // one build at a time; also guards optimized_model_written_
  std::map<std::string, std::shared_ptr<const CapturePlan>> plans_;
  std::shared_ptr<const CapturePlan> last_;
  std::vector<BuildPhase> phases_;
  bool optimized_model_written_ = false;
};

// Executors (GraphExec) per signature, so that several threads can run one session at once: a run takes one from
// its signature's pool (or makes one) and gives it back after. Thread-safety: every method, from any thread.
class ExecutorPools {
 public:
  explicit ExecutorPools(GraphExecOptions options) : options_(options) {}

  // `fn(exec)` with an executor of `plan` (signature `key`), given back to the pool after, also when `fn` throws.
  // When the run is out of memory while other executors sit idle, they are dropped and the run is made once more
  // (Note [Idle executors give their memory back] in plan_cache.cpp).
  template <typename Fn>
  auto run(const std::shared_ptr<const CapturePlan>& plan, const std::string& key, Fn&& fn) {
    try {
      return run_once(plan, key, fn);
    } catch (const OutOfMemoryError&) {
      if (release_idle(plan->device(), key) == 0) throw;
      return run_once(plan, key, fn);
    }
  }

  // Drops the idle executors of every signature but `keep` (their arenas and CUDA graphs: the run of `keep` needs
  // its own again) and empties `device`'s allocator cache; returns how many executors went.
  std::size_t release_idle(Device device, const std::string& keep);
  std::size_t released() const;  // executors dropped so far

  // Whether an executor replays a CUDA graph; `failure` gets the first failed capture's message (or stays).
  bool captured(std::string* failure) const;
  // Over every executor: Concat steps run as appends in place, and runs that made one (Note [Cache appended in
  // place] in engines/native/plan/capture_plan.cpp).
  std::pair<std::int64_t, std::int64_t> appends_in_place() const;

 private:
  template <typename Fn>
  auto run_once(const std::shared_ptr<const CapturePlan>& plan, const std::string& key, Fn& fn) {
    std::unique_ptr<GraphExec> exec = checkout(plan, key);
    decltype(fn(*exec)) result;
    try {
      result = fn(*exec);
    } catch (...) {
      checkin(std::move(exec), key);
      throw;
    }
    checkin(std::move(exec), key);
    return result;
  }
  std::unique_ptr<GraphExec> checkout(const std::shared_ptr<const CapturePlan>& plan, const std::string& key);
  void checkin(std::unique_ptr<GraphExec> exec, const std::string& key);

  const GraphExecOptions options_;
  mutable std::mutex mutex_;
  std::map<std::string, std::vector<std::unique_ptr<GraphExec>>> pools_;
  std::size_t released_ = 0;
};

}  // namespace xpuruntime::runtime
