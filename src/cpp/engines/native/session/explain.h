// What a native session says of itself: explain()'s options, build phases, memory, transfers, segments and nodes.
// Internal header.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/capture_plan.h"
#include "xpuruntime/engine.h"

namespace xpuruntime::runtime {

// A session's state as explain() reports it, read under the session's locks.
struct SessionState {
  std::shared_ptr<const CapturePlan> last_plan;  // the plan of the last run (or the probe's); null before any
  std::size_t plans = 0;                         // plans built
  std::size_t constants = 0;                     // device constants cached for the plans (Note [Constants shared...])
  std::size_t constant_bytes = 0;                //   what they hold
  std::size_t constants_shared = 0;              //   times a plan took one already there
  std::size_t executors_released = 0;            // idle executors dropped when a run was out of memory
  bool captured = false;                         // an executor replays a CUDA graph
  std::int64_t appends_in_place = 0;             // Concat steps run as cache appends (Note [Cache appended in place])
  std::int64_t runs_appending = 0;               //   runs that made one
  std::string capture_failure;                   // the first failed capture's message (Note [Failed captures])
  std::string build_cache;                       // "<path>, N kernel decision(s)" (Note [Build cache]); empty: off
  std::string weight_timing;                     // Note [Weights timed from memory]: why, when the session does it
  std::vector<BuildPhase> build;                 // the import and every plan build's phases, warm-up included
  std::vector<bool> feeds_on_device;             // per input: the last run's feed was on the session's device
};

// The explanation of a native session of `options` in `state`: the last plan's nodes and kernels, memory plan,
// transfers, and (Note [Segmented plans]) the segments the last run went through.
Explanation explain_session(const SessionOptions& options, const SessionState& state);

// The copies and syncs GraphExec::run makes for `plan` on `device` (graph_exec.cpp: bind_inputs, collect_outputs,
// run). `feeds_on_device`: per input, whether the last run's feed was on the session's device (empty: no run
// yet; feeds are then taken to come from the host, as numpy arrays do).
// `appended`: runs appended caches in place (Note [Cache appended in place]): the plan's cache appends are then listed
// as such instead of as copies of their past and present.
std::vector<TransferExplanation> transfers_of(const CapturePlan& plan, const std::vector<bool>& feeds_on_device,
                                              Device device, bool cuda_graphs, bool appended = false);

// One step of `plan` as explain() lists it: its kernel, backend and why.
NodeExplanation node_explanation(const CapturePlan& plan, const PlanStep& s);

}  // namespace xpuruntime::runtime
