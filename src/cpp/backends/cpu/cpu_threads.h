// The worker threads of the cpu backend: one pool per process that the parallel loops of every cpu kernel share,
// sized to the CPUs the process may use (Note [CPU worker threads] in cpu_threads.cpp). Internal header of
// src/cpp/backends/cpu/; kernels reach it through parallel_for (cpu_common.h).
//
// Ownership: the pool is process-wide and never destroyed (its workers are parked, not joined, at exit); a fork's
// child starts a fresh one on its first loop. Thread-safety: every function may be called from any thread, and
// loops started by several threads at once all complete (each caller runs what no worker took).
#pragma once

#include <cstdint>

#include "xpuruntime/export.h"

namespace xpuruntime::cpu {

// The CPUs this process may run on: the size of its sched_getaffinity mask, lowered to the CPU quota of its cgroup
// (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us; rounded up) when one is set. At least 1. Read once per
// process (a later sched_setaffinity is not seen).
int usable_cpus();

// Whether a thread that waited `waited_ns` for a core out of `runnable_ns` of runnable time (its schedstat run delay
// and run time over a window) runs its loops alone: more than a third of it waiting (Note [Loops on a busy machine]
// in cpu_threads.cpp).
XPURT_API bool waits_for_cores(std::int64_t waited_ns, std::int64_t runnable_ns);

// Whether the loops this thread starts now run on it alone because it waits for cores (the decision run_chunks
// takes, its window refreshed as run_chunks refreshes it). False where the kernel gives no schedstat.
XPURT_API bool caller_runs_loops_alone();

// The threads of a plan whose policy leaves intra_op_threads at 0: usable_cpus(), lowered to OMP_NUM_THREADS when
// that is set to a positive integer (what the OpenMP loops of earlier builds honoured). Read once per process.
int default_threads();

// One chunk of a loop: call(context, chunk). A pointer pair, so that starting a loop allocates no closure.
struct ChunkBody {
  void (*call)(void* context, std::int64_t chunk) = nullptr;
  void* context = nullptr;
};

// Runs body for every chunk of [0, chunks), each exactly once, on the calling thread and on up to `threads - 1`
// workers of the pool; returns when every chunk has run. Workers take chunks one at a time from a shared counter and
// the caller takes them too, so a worker the OS has not scheduled yet takes none and delays nothing. The first
// exception a chunk throws is rethrown here once every chunk has finished (the others still run). Workers run under
// the caller's memory budget (MemoryBudgetScope) and run stop token (RunStopScope). `spin`: whether the workers, once
// the loop is done, and the caller, while it waits for chunks a worker is running, spin briefly before they park
// (ExecutionPolicy::allow_spinning). Requires chunks >= 1 and threads >= 1.
void run_chunks(std::int64_t chunks, int threads, bool spin, ChunkBody body);

// True on a pool worker, and on a caller while it runs chunks of its loop: a loop started there runs on the calling
// thread alone (no nested parallelism, like OpenMP's default).
bool in_parallel_loop();

// The spin policy of the loops this thread starts (run_chunks' `spin`, as parallel_for passes it) until destroyed:
// the CpuPlan that runs a kernel sets its policy's allow_spinning. Outside any scope: true (the policy's default).
// Scopes nest. Not copyable or movable.
class SpinScope {
 public:
  explicit SpinScope(bool spin) noexcept;
  ~SpinScope();
  SpinScope(const SpinScope&) = delete;
  SpinScope& operator=(const SpinScope&) = delete;
  static bool current() noexcept;

 private:
  bool previous_;
};

}  // namespace xpuruntime::cpu
