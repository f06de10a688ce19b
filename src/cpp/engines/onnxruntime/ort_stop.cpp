// The watcher of Note [Stopping ORT runs] (ort_stop.h).
#include "engines/onnxruntime/ort_stop.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <onnxruntime_run_options_config_keys.h>
#include <string>
#include <thread>
#include <vector>

namespace xpuruntime::ort {

namespace {

constexpr const char* kNoGraph = "-1";  // gpu_graph_id of a run without a CUDA graph (ort_engine.cpp)

// One thread per process, started on first use and never stopped (leaked with its state, so it outlives every
// session and static destructor).
class Watcher {
 public:
  static Watcher& instance() {
    static Watcher* watcher = new Watcher();
    return *watcher;
  }

  void add(WatchedCall* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started_) {
      std::thread([this] { loop(); }).detach();
      started_ = true;
    }
    calls_.push_back(call);
    if (calls_.size() == 1) wake_.notify_one();
  }

  // After this returns the watcher no longer touches `call`.
  void remove(WatchedCall* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.erase(std::remove(calls_.begin(), calls_.end(), call), calls_.end());
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      if (calls_.empty()) {
        wake_.wait(lock, [&] { return !calls_.empty(); });
      } else {
        wake_.wait_for(lock, kWatchPeriod);
      }
      for (WatchedCall* call : calls_) {
        if (call->fired || !call->stop->stop_requested()) continue;
        call->fired = true;
        if (OrtStatus* status = ort_api().RunOptionsSetTerminate(call->options)) ort_api().ReleaseStatus(status);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<WatchedCall*> calls_;
  bool started_ = false;
};

}  // namespace

const Ort::RunOptions& run_options_for_call(const Ort::RunOptions& shared, bool no_graph_annotation) {
  if (RunStop::current() == nullptr) return shared;
  thread_local Ort::RunOptions plain{nullptr};
  thread_local Ort::RunOptions without_graph{nullptr};
  Ort::RunOptions& own = no_graph_annotation ? without_graph : plain;
  if (own == nullptr) {
    XPURT_ORT_CHECK(own = Ort::RunOptions());
    if (no_graph_annotation) XPURT_ORT_CHECK(own.AddConfigEntry(kOrtRunOptionsConfigCudaGraphAnnotation, kNoGraph));
  }
  XPURT_ORT_CHECK(own.UnsetTerminate());
  return own;
}

WatchedCall::WatchedCall(const RunStop* stop_token, const Ort::RunOptions& run_options)
    : stop(stop_token), options(const_cast<OrtRunOptions*>(static_cast<const OrtRunOptions*>(run_options))) {
  Watcher::instance().add(this);
}

WatchedCall::~WatchedCall() { Watcher::instance().remove(this); }

}  // namespace xpuruntime::ort
