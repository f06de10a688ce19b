// Stopping the onnxruntime engine's runs: its part of Note [Stopping a run] (xpuruntime/run_options.h).
//
// Note [Stopping ORT runs]
// ONNX Runtime stops a Run when the terminate flag of the RunOptions that call was given is set: it checks between
// nodes, the nodes of Loop and Scan bodies included, and fails with "Exiting due to terminate flag being set to
// true". So a Run made while its thread has a run token (RunStop::current()) gets RunOptions of its own
// (run_options_for_call: one set per thread, reused; setting terminate on the session's shared ones would stop every
// concurrent run), and run_watched hands them, for the call's duration, to one watcher thread per process that
// polls the tokens of the calls in flight every kWatchPeriod and sets ORT's terminate when one fires (a timeout, a
// terminate set from another thread, Ctrl-C in Python). The error ORT then returns becomes the token's
// RunTerminatedError. The watcher sleeps while no call is watched. A replayed CUDA graph is one step that runs to
// its end once launched (the token is checked when the run starts).
#pragma once

#include <chrono>
#include <cstdint>

#include "engines/onnxruntime/ort_memory_budget.h"
#include "engines/onnxruntime/ort_utils.h"
#include "xpuruntime/run_options.h"

namespace xpuruntime::ort {

inline constexpr std::chrono::milliseconds kWatchPeriod{2};

// The RunOptions a Run call uses: `shared` outside a run that can stop; inside one, this thread's own, terminate
// unset, with the CUDA graph annotation "no graph" when `no_graph_annotation` (as the session's shared ones have).
const Ort::RunOptions& run_options_for_call(const Ort::RunOptions& shared, bool no_graph_annotation);

// While alive, the watcher sets terminate on `options` when `stop` fires (Note [Stopping ORT runs]).
class WatchedCall {
 public:
  WatchedCall(const RunStop* stop, const Ort::RunOptions& options);
  ~WatchedCall();
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

  const RunStop* stop;
  OrtRunOptions* options;
  bool fired = false;  // the watcher set terminate (guarded by the watcher's mutex)
};

// Runs `call` (one Run with `options`, from run_options_for_call) stoppable by this thread's run token, under a
// memory budget of `memory_limit` bytes (0: none; Note [memory_limit through ORT]): a failure after the token fired
// is its RunTerminatedError, one the budget caused an OutOfMemoryError.
template <typename Call>
void run_watched(const Ort::RunOptions& options, std::uint64_t memory_limit, Call&& call) {
  const RunBudget budget(memory_limit);
  const RunStop* stop = RunStop::current();
  if (stop == nullptr) {
    try {
      call();
    } catch (const XpuRuntimeError& error) {
      budget.rethrow_if_refused(error);
      throw;
    }
    return;
  }
  stop->check("before ONNX Runtime's run");
  const WatchedCall watched(stop, options);
  try {
    call();
  } catch (const XpuRuntimeError& error) {
    stop->check("in ONNX Runtime's run");
    budget.rethrow_if_refused(error);
    throw;
  }
}

}  // namespace xpuruntime::ort
