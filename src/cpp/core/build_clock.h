// Timing of build phases (Note [Build phases] in engines/native/plan/capture_plan.cpp). Internal header.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/engine.h"

namespace xpuruntime::detail {

// Wall milliseconds since `start` on the steady clock.
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Phases one after another: mark(name) appends the time since the previous mark (or the clock's start, or the last
// restart()) to `out`; with a null `out` it only keeps time.
class PhaseClock {
 public:
  explicit PhaseClock(std::vector<BuildPhase>* out) : out_(out) {}
  void mark(std::string phase) {
    if (out_ != nullptr) out_->push_back({std::move(phase), ms_since(start_)});
    restart();
  }
  void restart() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::vector<BuildPhase>* out_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace xpuruntime::detail
