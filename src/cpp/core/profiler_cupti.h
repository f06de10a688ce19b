// CUPTI activity collection for the Profiler (internal header). Implemented in profiler_cupti.cpp when the build has
// CUPTI headers (XPURT_WITH_CUPTI), else by stubs in profiler.cpp that say why it is unavailable.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xpuruntime/profiler.h"

namespace xpuruntime::profiler_detail {

// One CUPTI activity record, in the profiler's terms. Times are CUPTI timestamps (ns).
struct DeviceRecord {
  std::string category;  // "kernel", "memcpy", "memset", "sync"
  std::string name;
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::int64_t device = 0;
  std::int64_t stream = 0;
  std::uint32_t correlation = 0;
  std::uint64_t graph_node = 0;  // CUPTI's id of the CUDA graph node that ran it (0: not a graph launch)
  std::vector<std::pair<std::string, ProfileArg>> args;
};

struct CuptiResult {
  std::vector<DeviceRecord> records;
  std::unordered_map<std::uint32_t, std::uint64_t> external;   // CUPTI correlation id -> our event id
  std::unordered_map<std::uint32_t, std::uint32_t> thread_of;  // CUPTI correlation id -> OS thread of the API call
  std::uint64_t dropped = 0;                                    // records CUPTI could not store
};

// Enables kernel, memcpy, memset, synchronization, runtime/driver API and external correlation activity.
// False, with the reason in `why`, when CUPTI cannot be used (library missing, another tool owns it, ...).
bool cupti_start(std::string* why);
// Flushes every buffer, disables the activities and returns what was collected since cupti_start.
CuptiResult cupti_stop();
// CUPTI's clock minus the host steady clock, in ns (sampled at cupti_start).
std::int64_t cupti_clock_offset_ns();
void cupti_push(std::uint64_t event_id);
void cupti_pop();

// Note [Graph node attribution] (profiler_graph.cpp): CUPTI callbacks for graph nodes created (during a stream
// capture) and cloned (when a graph is instantiated) while tracking is on; each new node whose creating thread has a
// capture label set, or whose original node has a label, is given that label (note_graph_node).
bool cupti_graph_tracking_start(std::string* why);
void cupti_graph_tracking_stop();

// profiler_graph.cpp: the label set on this thread (0: none), and the graph node -> label table.
std::uint64_t current_capture_label();
void note_graph_node(std::uint64_t graph_node, std::uint64_t label);
std::uint64_t graph_node_label(std::uint64_t graph_node);

// Builds, at stop(), one node event per (label, graph launch) from the labelled device records of CUDA graph
// replays (Note [Graph node attribution]).
class GraphReplayNodes {
 public:
  // The id of the node event that `record` (on the host clock: start_ns, duration_ns) belongs to, creating it from
  // its label's proto on first use with `next_id`; 0 when the record's graph node has no label. `tid`: the thread
  // that launched the graph.
  std::uint64_t parent_of(const DeviceRecord& record, std::int64_t start_ns, std::int64_t duration_ns,
                          std::int64_t tid, std::uint64_t& next_id);
  // Appends the node events built, each spanning its records, with device_us and device_kernels set.
  void emit(std::vector<ProfileEvent>& events);
  std::size_t size() const { return nodes_.size(); }

 private:
  struct Key {
    std::uint64_t label;
    std::uint32_t launch;  // correlation id of the graph launch
    bool operator==(const Key& o) const { return label == o.label && launch == o.launch; }
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const { return std::hash<std::uint64_t>()(k.label * 1000003u + k.launch); }
  };
  std::unordered_map<Key, std::size_t, KeyHash> index_;
  std::vector<ProfileEvent> nodes_;
  std::vector<std::int64_t> ends_;
};

}  // namespace xpuruntime::profiler_detail
