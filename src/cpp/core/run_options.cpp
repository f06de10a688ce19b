// RunStop and RunStopScope (run_options.h; Note [Stopping a run]).
#include "xpuruntime/run_options.h"

#include <cstdint>

namespace xpuruntime {

namespace {
thread_local const RunStop* current_stop = nullptr;
}  // namespace

RunStop::RunStop(const RunOptions& options, const RunStop* outer)
    : outer_(outer), terminate_(&options.terminate_), timeout_(options.timeout), tag_(options.tag) {
  if (timeout_.count() > 0) {
    has_deadline_ = true;
    start_ = std::chrono::steady_clock::now();
    deadline_ = start_ + timeout_;
  }
}

RunStop::Reason RunStop::reason() const noexcept {
  for (const RunStop* s = this; s != nullptr; s = s->outer_) {
    if (s->interrupted_.load(std::memory_order_relaxed)) return Reason::kInterrupt;
    if (s->terminate_ != nullptr && s->terminate_->load(std::memory_order_relaxed)) return Reason::kTerminate;
    if (s->has_deadline_ && std::chrono::steady_clock::now() >= s->deadline_) return Reason::kTimeout;
  }
  return Reason::kNone;
}

void RunStop::raise(Reason why, const std::string& where) const {
  // The token that stopped the run says why (an enclosing one may have been told, e.g. Ctrl-C around a nested run).
  const RunStop* by = this;
  for (const RunStop* s = this; s != nullptr; s = s->outer_) {
    const bool this_one = s->interrupted_.load(std::memory_order_relaxed) ||
                          (s->terminate_ != nullptr && s->terminate_->load(std::memory_order_relaxed)) ||
                          (s->has_deadline_ && std::chrono::steady_clock::now() >= s->deadline_);
    if (this_one) {
      by = s;
      break;
    }
  }
  const std::string run = by->tag_.empty() ? std::string("run") : detail::str_cat("run '", by->tag_, "'");
  std::string cause;
  switch (why) {
    case Reason::kTerminate: cause = "RunOptions terminate was set"; break;
    case Reason::kTimeout: {
      const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                            by->start_);
      cause = detail::str_cat("its RunOptions timeout of ", static_cast<std::int64_t>(by->timeout_.count()),
                              " ms passed (it ran ", static_cast<std::int64_t>(ran.count()), " ms)");
      break;
    }
    case Reason::kInterrupt: cause = "it was interrupted (Ctrl-C / SIGINT)"; break;
    case Reason::kNone: cause = "no reason"; break;
  }
  throw RunTerminatedError(detail::str_cat(run, " stopped ", where.empty() ? std::string("") : where + " ", "because ",
                                           cause, ". What it allocated is freed; the session can run again",
                                           why == Reason::kTerminate ? " (unset terminate first)" : "", "."),
                           why == Reason::kTimeout);
}

const RunStop* RunStop::current() noexcept { return current_stop; }

RunStopScope::RunStopScope(const RunStop* stop) noexcept : previous_(current_stop) { current_stop = stop; }

RunStopScope::~RunStopScope() { current_stop = previous_; }

}  // namespace xpuruntime
