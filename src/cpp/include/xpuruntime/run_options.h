// RunOptions: what one run of an InferenceSession is told (ONNX Runtime's RunOptions): stop now (terminate, from
// any thread while the run is in flight) and stop after a while (timeout). RunStop is the stop token a run checks.
//
//   xpuruntime::RunOptions options;
//   options.timeout = std::chrono::milliseconds(200);    // or, from another thread: options.set_terminate();
//   auto outputs = session.run(feeds, {}, options);     // RunTerminatedError when it stopped
//
// Note [Stopping a run]
// A run checks whether it must stop (its RunOptions' terminate set, its timeout past, an interrupt such as Ctrl-C in
// Python) at these points and nowhere else:
//  * before it starts, and before each step of a native plan (a node, a fused group, a reference-library node);
//  * between plan segments (Note [Segmented plans] in capture_plan.h);
//  * before each iteration of a Loop or Scan and each element of a SequenceMap, and before each node of a body
//    (If branches included), at any depth;
//  * in the CPU backend's parallel loops, before each slice of work: while a run can stop, each thread's share of a
//    loop is cut into up to kRunStopSlices slices of at least the loop's grain (cpu_common.h).
// A check is a relaxed atomic load per token (the run's and the ones enclosing it), plus a steady-clock read when a
// timeout is set. A CUDA plan checks on the host between the steps it runs eagerly; a replayed CUDA graph is one step
// (once launched it runs to its end), and kernels already queued on the stream run on. The onnxruntime engine hands
// the token to ONNX Runtime's own terminate flag (Ort::RunOptions::SetTerminate, set by a watcher thread that polls
// the runs in flight every few milliseconds), which ORT checks between nodes, Loop iterations included. A
// tensor-parallel session checks before its run only (a rank stopping alone would leave the others in a collective).
// A stopped run throws RunTerminatedError saying where it stopped and why (timed_out() for the timeout). Unwinding
// frees what the run allocated and releases its memory budget (Note [Run memory budgets]), the executor goes back to
// its pool, and the session runs normally afterwards. The token is current on the run's thread through a
// RunStopScope and travels to the workers of parallel loops as the memory budget does. terminate is not reset by a
// run: options with terminate set stop every run given them until unset_terminate() (as in ONNX Runtime).
//
// Ownership: RunOptions belong to the caller and must outlive the runs given them; a RunStop lives on the stack of
// the run it stops. Thread-safety: set_terminate/unset_terminate/terminate and RunStop::interrupt may be called from
// any thread at any time (interrupt also from a signal handler); the other fields are set before the run.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/export.h"

namespace xpuruntime {

class RunStop;

class XPURT_API RunOptions {
 public:
  RunOptions() = default;
  RunOptions(const RunOptions& other) : timeout(other.timeout), tag(other.tag), terminate_(other.terminate()) {}
  RunOptions& operator=(const RunOptions& other) {
    timeout = other.timeout;
    tag = other.tag;
    terminate_.store(other.terminate(), std::memory_order_relaxed);
    return *this;
  }

  // How long a run may take before it stops with RunTerminatedError (timed_out() true). Default 0: no limit.
  std::chrono::milliseconds timeout{0};
  // Names the run in its errors ("run 'batch-7' stopped ..."); ONNX Runtime's run tag (logid). Default: none.
  std::string tag;

  // Stops the runs given these options: one in flight at its next check (Note [Stopping a run]), a later one before
  // it starts, until unset_terminate(). Default: not set.
  void set_terminate() noexcept { terminate_.store(true, std::memory_order_relaxed); }
  void unset_terminate() noexcept { terminate_.store(false, std::memory_order_relaxed); }
  bool terminate() const noexcept { return terminate_.load(std::memory_order_relaxed); }

 private:
  friend class RunStop;  // reads terminate_ live during the run
  std::atomic<bool> terminate_{false};
};

// The stop token of one run (Note [Stopping a run]). InferenceSession's run methods make one from the run's
// RunOptions, inside the token current on the thread (its `outer`, e.g. the Python binding's Ctrl-C token), and make
// it current for the run's duration.
class XPURT_API RunStop {
 public:
  enum class Reason { kNone, kTerminate, kTimeout, kInterrupt };

  // A token without options: it stops only when interrupt() is called (or `outer` stops).
  explicit RunStop(const RunStop* outer = nullptr) noexcept : outer_(outer) {}
  // A token for a run given `options` (referenced, not copied: terminate is read live); the timeout starts now.
  RunStop(const RunOptions& options, const RunStop* outer);
  RunStop(const RunStop&) = delete;
  RunStop& operator=(const RunStop&) = delete;

  // Why the run must stop now, or kNone. This token first, then the ones enclosing it.
  Reason reason() const noexcept;
  bool stop_requested() const noexcept { return reason() != Reason::kNone; }
  // Asks the run to stop (Reason::kInterrupt). Async-signal-safe: one atomic store.
  void interrupt() noexcept { interrupted_.store(true, std::memory_order_relaxed); }
  bool interrupted() const noexcept { return interrupted_.load(std::memory_order_relaxed); }

  // Throws RunTerminatedError when the run must stop; `where` pieces ("before node '", name, "'") are joined only
  // then.
  template <typename... Where>
  void check(const Where&... where) const {
    const Reason why = reason();
    if (why != Reason::kNone) [[unlikely]] raise(why, detail::str_cat(where...));
  }
  // RunTerminatedError for `why`, naming the run, `where` it stopped and how to go on.
  [[noreturn]] void raise(Reason why, const std::string& where) const;

  // This thread's run token, or null outside a run.
  static const RunStop* current() noexcept;

 private:
  const RunStop* outer_ = nullptr;
  const std::atomic<bool>* terminate_ = nullptr;  // the options' flag, or null
  bool has_deadline_ = false;
  std::chrono::steady_clock::time_point start_{};
  std::chrono::steady_clock::time_point deadline_{};
  std::chrono::milliseconds timeout_{0};
  std::string tag_;
  std::atomic<bool> interrupted_{false};
};

// Makes `stop` this thread's run token until destroyed (scopes nest; null: none). Not copyable or movable.
class XPURT_API RunStopScope {
 public:
  explicit RunStopScope(const RunStop* stop) noexcept;
  ~RunStopScope();
  RunStopScope(const RunStopScope&) = delete;
  RunStopScope& operator=(const RunStopScope&) = delete;

 private:
  const RunStop* previous_;
};

// Checks this thread's run token (nothing outside a run): RunTerminatedError naming `where` when it must stop.
template <typename... Where>
inline void check_run_stop(const Where&... where) {
  if (const RunStop* stop = RunStop::current()) stop->check(where...);
}

}  // namespace xpuruntime
