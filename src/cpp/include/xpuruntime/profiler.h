// Profiler: what ran, where and for how long (docs/profiling.md). While a Profiler is started, the runtime records
//  - "session" events: each InferenceSession::run (engine, device, input shapes);
//  - "node" events: each step of the native engine's plan, host-timed (node, op type, kernel, backend, precision,
//    the dispatcher's reason, shapes, bytes read and written), and each node ONNX Runtime runs for a session with
//    engine="onnxruntime" (from ORT's own profile of that run: op, execution provider, ORT's timing; Note [ORT
//    profile on the timeline] in core/profiler_ort.cpp);
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
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "xpuruntime/export.h"
#include "xpuruntime/roofline.h"

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

  // The roofline audit (docs/profiling.md, "Roofline audit"; xpuruntime/roofline.h), summed over calls.
  std::string op;          // the registry op ("conv2d"), empty for views and nodes of other engines
  std::string reason;      // why the dispatcher chose the kernel (first call's)
  std::string device;      // whose ceilings hold: "cpu", "cuda:0"
  double flops = 0;        // arithmetic operations it must do (Note [Roofline work] in core/roofline.cpp)
  double floor_bytes = 0;  // bytes it must move
  std::string ceiling;     // the peak its flops run against ("fp16", ..., "vector"); empty: no floor (views)
  std::int64_t floor_ns = 0;  // max(floor_bytes / bandwidth, flops / peak); 0 when unknown
  std::string bound;       // "memory" or "compute": which side sets the floor
  double efficiency = 0;   // floor_ns / total_ns (1 = at the floor; above 1: faster than the copy ceiling, e.g.
                           // data that stayed in cache); 0 when there is no floor
  // A node that costs more than 2% of the run at under 50% of its floor (issue 42's bar for a bug).
  bool flagged() const { return share > 0.02 && !ceiling.empty() && floor_ns > 0 && efficiency < 0.5; }
  // The share of the run it loses to its floor: share * (1 - efficiency), 0 when at or past the floor.
  double lost_share() const { return floor_ns > 0 && efficiency < 1.0 ? share * (1.0 - efficiency) : 0.0; }
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

// ---- ONNX Runtime's profile ----
// ORT writes its profile as Chrome-trace JSON (an array, or an object with "traceEvents"): a "Node" event per node
// run, named "<node>_kernel_time" (args op_name, provider, input_type_shape, output_type_shape, activation_size,
// parameter_size, output_size, thread_scheduling_stats), "Session" events ("model_run" per run, model loading and
// session initialization) and, in some builds, other categories; "ts" and "dur" are microseconds since ORT's
// profiling started. Note [ORT profile on the timeline] in core/profiler_ort.cpp.

// Where Profiler::merge_ort_profile puts ORT's events on the profile's timeline (microseconds since start()).
// Default-constructed: paired with the profile's onnxruntime session runs (below).
struct XPURT_API OrtProfileMergeOptions {
  // ORT's ts + offset_us is the time on the profile's timeline. Unset by default; when set it decides.
  std::optional<double> offset_us;
  // When ORT's profiling started, in ns since the Unix epoch (Ort::Session::GetProfilingStartTimeNs(); Python
  // onnxruntime: InferenceSession.get_profiling_start_time_ns()), compared with the profile's "start_time_unix_ns"
  // metadata (the system clock at start()). Unset by default; used when offset_us is not set.
  std::optional<std::int64_t> start_time_ns;
};
// With neither option, ORT's "model_run" events are paired in order with the profile's "session run
// (onnxruntime)" events: each run's events are placed by their own pair when both counts match, else all by the
// first pair. A profile without such session events, or an ORT profile without model_run, cannot be placed so.

// What Profiler::merge_ort_profile added.
struct XPURT_API OrtProfileMergeResult {
  std::int64_t node_events = 0;     // ORT node runs, added as "node" events
  std::int64_t session_events = 0;  // model_run ("onnxruntime run"), model loading, session initialization
  std::int64_t skipped = 0;         // ORT events of other kinds, left out (see docs/profiling.md)
  std::string alignment;            // how they were placed, in words
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
  // One row per node, by total time (descending), with its roofline (floor and efficiency) on the ceilings of its
  // device (roofline::ceilings: measured on first use, then the environment's and set_ceilings' overrides).
  std::vector<NodeSummary> summary() const;
  // The same over the node events that start inside a range named `within` (Profiler::range; e.g. the generation
  // loop's "generation prefill" and "generation decode"): shares are of those nodes' time. Every node when empty.
  std::vector<NodeSummary> summary(const std::string& within) const;
  std::string summary_table(std::size_t max_rows = 0, const std::string& within = "") const;  // 0 = every row
  // The roofline audit: summary() rows with a floor, by lost_share() (descending: the run time furthest from the
  // floor first); `top` 0 = every row.
  std::vector<NodeSummary> audit(std::size_t top = 0) const;
  // Overrides the ceilings of `device_type` ("cpu" or "cuda", or one device "cuda:1") for this profiler's
  // summaries: KEY -> value as roofline::parse_overrides reads them ("bandwidth" in bytes/s, peaks in FLOP/s).
  // InvalidArgumentError for an unknown key or a value that is not positive.
  void set_ceilings(const std::string& device_type, const std::map<std::string, double>& figures);
  // The ceilings summary() uses for `device` ("cpu", "cuda:0"), every peak included (measured on first use).
  roofline::DeviceCeilings ceilings(const std::string& device) const;
  MemoryEventsSummary memory() const;
  // Facts about the profile: "cuda_activity", "cuda_graphs" (how CUDA graph replays were profiled), "dropped", ...
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The Chrome trace format (Perfetto, chrome://tracing): {"traceEvents": [...], "displayTimeUnit": "ms",
  // "metadata": {...}}. Complete ("X") events, process/thread names ("M"), flows ("s"/"f") from each node to the
  // device work it launched, allocation instants ("i") and an allocated-bytes counter ("C").
  std::string chrome_trace() const;
  // Writes chrome_trace() to `path` (InvalidArgumentError when it cannot be written).
  void export_chrome_trace(const std::string& path) const;

  // Adds the profile ONNX Runtime wrote to `ort_profile_path` (SessionOptions::EnableProfiling or
  // RunOptions::EnableProfiling, e.g. from onnxruntime used directly) to this profile: its node events become "node"
  // events (backend: the execution provider) in events(), summary() and the Chrome trace, placed as `options` says.
  // Sessions with engine="onnxruntime" need none of this: their runs are mapped while recording (docs/profiling.md).
  // InvalidArgumentError while recording, when the file cannot be read or is not an ORT profile, and when nothing
  // tells where its events belong on this profile's timeline.
  OrtProfileMergeResult merge_ort_profile(const std::string& ort_profile_path,
                                          const OrtProfileMergeOptions& options = {});
  // The same merge for a Chrome trace a Profiler exported (`chrome_trace_json`: chrome_trace()'s text, or the file
  // export_chrome_trace() wrote): returns the merged trace; `result`, when given, receives what was added.
  // InvalidArgumentError when `chrome_trace_json` is not such a trace, and as merge_ort_profile.
  static std::string merge_ort_profile_into_chrome_trace(const std::string& chrome_trace_json,
                                                         const std::string& ort_profile_path,
                                                         const OrtProfileMergeOptions& options = {},
                                                         OrtProfileMergeResult* result = nullptr);

 private:
  roofline::DeviceCeilings ceilings_with(const std::string& device, const std::vector<std::string>& keys) const;

  ProfilerOptions options_;
  bool recording_ = false;
  bool cuda_activity_ = false;
  std::string cuda_reason_;
  std::vector<ProfileEvent> events_;  // after stop()
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::map<std::string, double>> ceiling_overrides_;  // by device type or device
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

// CUDA graph nodes (Note [Graph node attribution] in core/profiler_graph.cpp). A label stands for a plan step; its
// `proto` (name and args of a "node" event) becomes one node event per replay of a graph captured under it, spanning
// the device time of the kernels, copies and sets of the graph nodes created while the label was set.
// graph_tracking(): a recording profiler sees which graph node ran each kernel (CUPTI), so a CUDA graph captured
// with labels replays under the profiler instead of running eagerly.
XPURT_API bool graph_tracking();
// A CUDA kernel's name as CUPTI reports it (the mangled C++ symbol, e.g. "_Z10add_kernelPfPKfi"), demangled
// ("add_kernel(float*, float const*, int)"); a name that is not a mangled C++ symbol comes back unchanged.
XPURT_API std::string demangle_kernel_name(const char* name);
XPURT_API std::uint64_t register_graph_label(ProfileEvent proto);
XPURT_API void forget_graph_labels(const std::vector<std::uint64_t>& labels);
// Graph nodes created on this thread while a scope lives (a stream capture) get its label.
class XPURT_API GraphLabelScope {
 public:
  explicit GraphLabelScope(std::uint64_t label);
  ~GraphLabelScope();
  GraphLabelScope(const GraphLabelScope&) = delete;
  GraphLabelScope& operator=(const GraphLabelScope&) = delete;

 private:
  std::uint64_t previous_;
};

// ONNX Runtime's profile, read (Note [ORT profile on the timeline] in core/profiler_ort.cpp): node events (backend and
// kernel: the execution provider; shapes when `shapes`) and session events, with start_ns on ORT's clock (its ts in
// ns), ids 0 and ORT's pid/tid; `runs` are its model_run spans. InvalidArgumentError when `json_text` is not one.
struct XPURT_API OrtProfile {
  std::vector<ProfileEvent> events;                           // by start
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;    // model_run: start and duration (ns, ORT's clock)
  std::int64_t skipped = 0;                                   // events of other kinds
  std::vector<std::string> skipped_categories;                // their categories, first-seen order
};
XPURT_API OrtProfile parse_ort_profile(const std::string& json_text, bool shapes);
// Moves `profile`'s events onto the profiler's clock: run k (runs[k]) starts at run_starts_ns[k] when the counts
// match, else every event moves by run_starts_ns[0] - runs[0].start; events outside every run (loading,
// initialization) move with the first run. Needs at least one run and one start.
XPURT_API void align_ort_profile(OrtProfile& profile, const std::vector<std::int64_t>& run_starts_ns);

}  // namespace profiler
}  // namespace xpuruntime
