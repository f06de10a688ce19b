// ORT's run-level profiling for the onnxruntime engine (Note [ORT profile on the timeline] in core/profiler_ort.cpp):
// which runs ORT profiles, the RunOptions and files of their Run calls, and what their profiles become -- "node" and
// "session" events of the recording Profiler, and the execution providers explain() reports.
//
// A session profiles a run only when a Profiler records or explain() still waits for its first profile; any other
// run costs two relaxed atomic loads (and a thread-local read per Run call).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engines/onnxruntime/ort_utils.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime::ort {

// Where one session's profiles go: a private folder (mkdtemp) in the temporary directory, made on first use and
// removed with its owner; each file is removed as soon as it is read. Thread-safe.
class ProfileFolder {
 public:
  ProfileFolder() = default;
  ~ProfileFolder();
  ProfileFolder(const ProfileFolder&) = delete;
  ProfileFolder& operator=(const ProfileFolder&) = delete;

  // A new file-name prefix in the folder ("<folder>/run<N>"); ORT appends "_<date>.json". XpuRuntimeError when the
  // folder cannot be made.
  std::string next_prefix();

 private:
  std::mutex mutex_;
  std::filesystem::path path_;
  std::uint64_t next_ = 0;
};

// One session run whose ORT Run calls are profiled. Lives on the stack of the run (one per run, one thread); while
// it does, the session's Run calls on this thread take their RunOptions from call_options(). Neither copyable nor
// movable.
class ProfiledRun {
 public:
  // `owner`: the session; `config`: run-option entries every call needs (the CUDA graph annotation "-1" of sessions
  // with graphs); `recording`: a Profiler records (the run's events go to it); `explain_pending`: when non-null this
  // run takes the session's explain() profile, and the flag is set back to true unless finish() got one.
  ProfiledRun(const void* owner, ProfileFolder& folder, std::vector<std::pair<std::string, std::string>> config,
              bool recording, std::atomic<bool>* explain_pending);
  ~ProfiledRun();  // removes the files of calls that were not read
  ProfiledRun(const ProfiledRun&) = delete;
  ProfiledRun& operator=(const ProfiledRun&) = delete;

  // The profiled run of `owner` in progress on this thread, else null.
  static ProfiledRun* active(const void* owner);

  // While a Profiler records, the run goes eagerly (no CUDA graph replay: ORT reports no nodes for one).
  bool recording() const { return recording_; }
  bool for_explain() const { return explain_pending_ != nullptr; }

  // RunOptions for the next Run call, profiling into a file of its own; the call's start on the profiler's clock is
  // taken now, so call this right before Run. The pointer lives as long as this object. Null when the call cannot be
  // profiled (no temporary folder, ORT refused the options): the run goes on unprofiled and collect() says why.
  const Ort::RunOptions* call_options();

  // After the run: every call's profile, each placed at its own start on the profiler's clock, files removed. A call
  // that was not profiled, and a file ORT did not write or that does not parse, is left out (why goes to
  // `unreadable`).
  profiler::OrtProfile collect(bool shapes, std::vector<std::string>* unreadable);

  // The run is done: its profile for explain() was taken (the flag stays false).
  void explained() { explain_pending_ = nullptr; }

 private:
  struct Call {
    std::string prefix;
    Ort::RunOptions options{nullptr};
    std::int64_t start_ns = 0;
  };

  const void* owner_;
  ProfileFolder& folder_;
  std::vector<std::pair<std::string, std::string>> config_;
  bool recording_;
  std::atomic<bool>* explain_pending_;
  std::deque<Call> calls_;  // a deque: references to earlier calls' options stay valid
  std::vector<std::string> errors_;  // calls that could not be profiled, and why
  ProfiledRun* previous_;   // the thread's active run before this one (another session's), restored by ~ProfiledRun
};

// The nodes explain() reports, from a profile: one per node (first seen), kernel = its execution provider.
std::vector<NodeExplanation> explain_nodes(const profiler::OrtProfile& profile, const std::string& precision);

}  // namespace xpuruntime::ort
