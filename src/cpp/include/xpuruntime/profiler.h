// Profiler: what ran, where and for how long (docs/profiling.md). While a Profiler is started, the runtime records
//  - "session" events: each InferenceSession::run (engine, device, input shapes);
//  - "node" events: each step of the native engine's plan, host-timed (node, op type, kernel, backend, precision,
//    the dispatcher's reason, shapes, bytes read and written);
//  - on CUDA, CUPTI activity records: "kernel", "memcpy", "memset" and "sync" events, each kernel, copy and set
//    linked to the node whose launch made it (Note [Kernel to node correlation] in core/profiler.cpp);
//  - "alloc" events from the allocators (allocation and free, bytes, the running allocated bytes and peak);
//  - "range" events: user ranges (Profiler::range).
// NVTX ranges (for Nsight Systems) are pushed for sessions, nodes and user ranges while a profiler records, and for
// sessions and nodes also when the environment variable XPURT_NVTX=1 is set (builds with NVTX only).
//
//   Profiler profiler;                         // ProfilerOptions: CUDA activity, shapes
//   profiler.start();
//   session.run(feeds);
//   { auto r = profiler.range("step 1"); session.run(feeds); }
//   profiler.stop();
//   profiler.export_chrome_trace("trace.json");  // Perfetto / chrome://tracing
//   std::cout << profiler.summary_table();
//
// Cost when off: one relaxed atomic load per session run, per plan run and per allocation (profiler::active()).
//
// Ownership: a Profiler owns the events it collected. One profiler records at a time per process (start() while
// another is recording is an InvalidArgumentError). Thread-safety: events are recorded from any thread; start, stop
// and the accessors of one Profiler are meant for one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "xpuruntime/export.h"

namespace xpuruntime {

// An argument of an event: a number, a text, or a list of texts (shapes).
using ProfileArg = std::variant<std::int64_t, double, std::string, std::vector<std::string>>;

struct XPURT_API ProfileEvent {
  std::uint64_t id = 0;        // unique within one profile (1, 2, ...)
  std::uint64_t parent = 0;    // kernel/memcpy/memset: the id of the node event that launched it, else 0
  std::string name;            // node name, kernel name, range name, "allocate", ...
  std::string category;        // "session", "node", "kernel", "memcpy", "memset", "sync", "alloc", "range"
  std::int64_t start_ns = 0;   // since the profiler started (host steady clock; device times mapped onto it)
  std::int64_t duration_ns = 0;
  std::int64_t pid = 0;        // host events: the process id; device events: the CUDA device index
  std::int64_t tid = 0;        // host events: the OS thread id; device events: the CUDA stream id
  bool device = false;         // a device (CUPTI) event
  std::vector<std::pair<std::string, ProfileArg>> args;

  const ProfileArg* arg(const std::string& key) const;  // null when absent
};

// One row of Profiler::summary(): every node event of one node, aggregated.
struct XPURT_API NodeSummary {
  std::string node;
  std::string op_type;
  std::string kernel;     // the kernel the dispatcher chose ("view", "onnx_ref", ...)
  std::string backend;
  std::string precision;
  std::vector<std::string> device_kernels;  // the CUDA kernels it launched (CUPTI names), in first-seen order
  std::int64_t calls = 0;
  // Device time of its kernels, copies and sets when CUPTI saw any, else host time.
  std::int64_t total_ns = 0;
  double share = 0;       // of the summed total_ns of all nodes
  std::int64_t bytes = 0; // bytes its inputs and outputs hold, summed over calls
  double mean_ns() const { return calls ? static_cast<double>(total_ns) / static_cast<double>(calls) : 0.0; }
};

// Allocator activity while profiling.
struct XPURT_API MemoryEventsSummary {
  struct PerDevice {
    std::int64_t allocations = 0;
    std::int64_t frees = 0;
    std::int64_t allocated_bytes = 0;  // summed over allocations
    std::int64_t freed_bytes = 0;
    std::int64_t peak_bytes = 0;       // the most bytes allocated at once (the allocator's count) while profiling
  };
  std::map<std::string, PerDevice> devices;  // "cpu", "cuda:0", "pinned host", ...
  PerDevice total;                            // peak_bytes: the largest per-device peak
};

struct XPURT_API ProfilerOptions {
  enum class CudaActivity {
    kAuto,  // CUPTI activity when a CUDA device and CUPTI are present (default)
    kOn,    // CUPTI activity, UnsupportedOperationError from start() when it cannot be had
    kOff,   // host events only
  };
  CudaActivity cuda = CudaActivity::kAuto;
  bool record_shapes = true;  // node and session events carry input/output shapes (default true)
};

class XPURT_API Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {});
  ~Profiler();  // stops it when it is recording
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Starts recording (clearing what a previous start collected). InvalidArgumentError when this or another
  // profiler is already recording; UnsupportedOperationError when CudaActivity::kOn cannot be honoured.
  void start();
  // Stops recording and collects the CUPTI records. Stopping a profiler that is not recording does nothing.
  void stop();
  bool recording() const { return recording_; }
  // Whether CUPTI activity is (or was, once stopped) collected, and why not when it is not.
  bool cuda_activity() const { return cuda_activity_; }
  const std::string& cuda_activity_reason() const { return cuda_reason_; }

  // A user range: recorded as a "range" event (and an NVTX range) from now until the returned object is destroyed
  // or end() is called. Nests. Outside recording it is only an NVTX range.
  class XPURT_API Range {
   public:
    Range() = default;
    explicit Range(std::string name);
    ~Range() { end(); }
    Range(Range&& other) noexcept;
    Range& operator=(Range&& other) noexcept;
    Range(const Range&) = delete;
    Range& operator=(const Range&) = delete;
    void end();

   private:
    std::string name_;
    std::int64_t start_ns_ = 0;
    std::int64_t depth_ = 0;
    bool open_ = false;
  };
  static Range range(const std::string& name) { return Range(name); }

  // The events collected, sorted by start time. While recording: what was recorded so far (no CUPTI records yet).
  std::vector<ProfileEvent> events() const;
  // One row per node, by total time (descending).
  std::vector<NodeSummary> summary() const;
  std::string summary_table(std::size_t max_rows = 0) const;  // text table; 0 = every row
  MemoryEventsSummary memory() const;
  // Facts about the profile: "cuda_activity", "cuda_graphs" (how CUDA graph replays were profiled), "dropped", ...
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The Chrome trace format (Perfetto, chrome://tracing): {"traceEvents": [...], "displayTimeUnit": "ms",
  // "metadata": {...}}. Complete ("X") events, process/thread names ("M"), flows ("s"/"f") from each node to the
  // device work it launched, allocation instants ("i") and an allocated-bytes counter ("C").
  std::string chrome_trace() const;
  // Writes chrome_trace() to `path` (InvalidArgumentError when it cannot be written).
  void export_chrome_trace(const std::string& path) const;

 private:
  ProfilerOptions options_;
  bool recording_ = false;
  bool cuda_activity_ = false;
  std::string cuda_reason_;
  std::vector<ProfileEvent> events_;  // after stop()
  std::map<std::string, std::string> metadata_;
};

namespace profiler {

// Note [Profiler off cost]: the hot paths read this one word, relaxed, and do nothing else when it is 0.
enum : std::uint32_t {
  kRecording = 1u,  // a Profiler is recording
  kNvtx = 2u,       // NVTX ranges for sessions and nodes (a Profiler is recording, or XPURT_NVTX=1)
};
XPURT_API extern std::atomic<std::uint32_t> g_state;
inline std::uint32_t state() { return g_state.load(std::memory_order_relaxed); }
inline bool active() { return state() != 0; }
inline bool recording() { return (state() & kRecording) != 0; }

// For the runtime's instrumentation points (and extensions). Host clock: nanoseconds since the profiler started.
XPURT_API std::int64_t now_ns();
XPURT_API bool record_shapes();
XPURT_API std::uint64_t next_event_id();
// Appends a host event (pid and tid are filled in when 0). Does nothing unless recording.
XPURT_API void record(ProfileEvent event);
// An allocator event: `what` is "allocate" or "free"; `allocated_bytes` the allocator's count after it.
XPURT_API void record_allocation(const std::string& device, const char* what, std::int64_t bytes,
                                 std::int64_t allocated_bytes, const void* ptr);
// NVTX ranges (no-ops in builds without NVTX).
XPURT_API void nvtx_push(const char* name);
XPURT_API void nvtx_pop();
// CUDA work launched between push_correlation(id) and pop_correlation() on this thread is attributed to the event
// `id` (CUPTI external correlation; no-ops without CUPTI activity).
XPURT_API void push_correlation(std::uint64_t event_id);
XPURT_API void pop_correlation();

}  // namespace profiler
}  // namespace xpuruntime
