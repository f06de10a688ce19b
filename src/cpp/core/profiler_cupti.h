// CUPTI activity collection for the Profiler (internal header). Implemented in profiler_cupti.cpp when the build has
// CUPTI headers (XPURT_WITH_CUPTI), else by stubs in profiler.cpp that say why it is unavailable.
#pragma once

#include <cstdint>
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

}  // namespace xpuruntime::profiler_detail
