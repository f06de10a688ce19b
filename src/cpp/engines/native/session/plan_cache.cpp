// A native session's plans and executor pools (see plan_cache.h).
#include "engines/native/session/plan_cache.h"

#include <chrono>
#include <fstream>
#include <memory>
#include <vector>

#include "core/build_clock.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/onnx_import.h"

namespace xpuruntime::runtime {

PlanCache::PlanCache(const Graph& graph, PlanOptions options, BuildCache* build_cache, double import_ms)
    : graph_(graph), options_(std::move(options)), build_cache_(build_cache) {
  if (import_ms > 0) phases_.push_back({"import", import_ms});
}

std::shared_ptr<const CapturePlan> PlanCache::plan_for(const Shapes& shapes, const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      last_ = it->second;
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
  std::shared_ptr<const CapturePlan> plan = CapturePlan::build(graph_, shapes, options_);
  const double total = detail::ms_since(start);
  if (build_cache_ != nullptr) build_cache_->save();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const BuildPhase& phase : plan->build_phases()) phases_.push_back({"plan " + key + ": " + phase.phase, phase.ms});
  phases_.push_back({"plan " + key + ": total", total});
  plans_[key] = plan;
  last_ = plan;
  return plan;
}

std::shared_ptr<const CapturePlan> PlanCache::last() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

std::size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.size();
}

std::vector<BuildPhase> PlanCache::build_phases() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return phases_;
}

void PlanCache::save_optimized(const CapturePlan& plan, const std::string& path) {
  std::lock_guard<std::mutex> lock(build_mutex_);
  if (optimized_model_written_) return;
  std::ofstream file(path, std::ios::binary);
  XPURT_CHECK(file.good(), "cannot write the optimized model to '", path, "'");
  file << export_onnx(plan.graph());
  XPURT_CHECK(file.good(), "writing the optimized model to '", path, "' failed");
  optimized_model_written_ = true;
}

bool ExecutorPools::captured(std::string* failure) const {
  std::lock_guard<std::mutex> lock(mutex_);
  bool captured = false;
  for (const auto& [key, pool] : pools_) {
    for (const auto& exec : pool) {
      captured |= exec->graph_captured();
      if (failure->empty()) *failure = exec->capture_failure();
    }
  }
  return captured;
}

std::pair<std::int64_t, std::int64_t> ExecutorPools::appends_in_place() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::pair<std::int64_t, std::int64_t> total{0, 0};
  for (const auto& [key, pool] : pools_) {
    for (const auto& exec : pool) {
      total.first += exec->appends_in_place();
      total.second += exec->runs_appending();
    }
  }
  return total;
}

std::unique_ptr<GraphExec> ExecutorPools::checkout(const std::shared_ptr<const CapturePlan>& plan,
                                                   const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& pool = pools_[key];
    if (!pool.empty()) {
      std::unique_ptr<GraphExec> exec = std::move(pool.back());
      pool.pop_back();
      return exec;
    }
  }
  return std::make_unique<GraphExec>(plan, options_);
}

// Note [Idle executors give their memory back]
// An executor holds its plan's arena (and on CUDA its captured graph) between runs, so a session that met many input
// shapes holds an arena per shape it ever ran, whether or not that shape comes again: a long-running generation
// server meets prompt lengths and batch sizes without end. When a run is out of memory (OutOfMemoryError: the device,
// or a memory limit) while executors of other shapes sit idle, the pools drop them, the device's allocator returns its
// cached blocks, and the run is made once more (the run's own shape keeps its executors: a new one would need the
// same memory again, so an out-of-memory error with nothing else idle stands); the shapes that come again make new executors (and capture again) on
// their next run. A run fails only when nothing idle was left to give back. A run's inputs are not written, so running
// it again is safe. explain() counts the executors given back.
std::size_t ExecutorPools::release_idle(Device device, const std::string& keep) {
  std::vector<std::unique_ptr<GraphExec>> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, pool] : pools_) {
      if (key == keep) continue;
      for (auto& exec : pool) idle.push_back(std::move(exec));
      pool.clear();
    }
    released_ += idle.size();
  }
  const std::size_t count = idle.size();
  idle.clear();  // their arenas go back to the allocator here
  if (count > 0 && device.is_cuda()) MemoryManager::instance().empty_cache(device);
  return count;
}

std::size_t ExecutorPools::released() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return released_;
}

void ExecutorPools::checkin(std::unique_ptr<GraphExec> exec, const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  pools_[key].push_back(std::move(exec));
}

}  // namespace xpuruntime::runtime
