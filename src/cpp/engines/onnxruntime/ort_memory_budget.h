// ExecutionPolicy.memory_limit in the onnxruntime engine on the CPU: Note [memory_limit through ORT].
//
// Note [memory_limit through ORT]
// The native engine charges what a run allocates to the run's MemoryBudget (Note [Run memory budgets] in
// memory_manager.h); ORT allocates through its own allocators, so a CPU session with memory_limit used to run
// unbounded (issue 39: a Loop's scan output grew to 1.9 GiB under memory_limit = 16 MiB, engine "auto" picking
// onnxruntime on the CPU). Now such a session takes its CPU memory from one allocator registered on the process's
// Ort::Env (session config "session.use_env_allocators" = 1; sessions without a limit keep ORT's arena). It charges
// each allocation made on a thread with an open budget to that budget before making it, and releases it when ORT
// frees the block, so what ORT allocates during a run (intermediates, Loop and Scan outputs, sequences, the run's
// outputs until they die) is bounded. Each Run call opens a budget of the whole limit (ORT has no plan whose peak
// is known beforehand). Past it the allocator throws std::bad_alloc into ORT, which fails the node, and the run
// raises OutOfMemoryError with the budget's message and ORT's, which names the node; the session runs again.
// Not charged: allocations on ORT's intra-op worker threads (they have no budget open), and what session creation
// allocates (initializers).
#pragma once

#include <cstdint>
#include <memory>

#include "engines/onnxruntime/ort_utils.h"
#include "xpuruntime/memory_manager.h"

namespace xpuruntime::ort {

// Makes the CPU session built with `session_options` allocate through the budgeted allocator (registered on env()
// on first use).
void use_budgeted_cpu_allocator(Ort::SessionOptions& session_options);

// One Run call under a budget of `limit` bytes (0: none): open while alive on this thread.
class RunBudget {
 public:
  explicit RunBudget(std::uint64_t limit);
  RunBudget(const RunBudget&) = delete;
  RunBudget& operator=(const RunBudget&) = delete;
  // After the Run failed with `error`: OutOfMemoryError when the budget refused an allocation during it.
  void rethrow_if_refused(const std::exception& error) const;

 private:
  std::shared_ptr<MemoryBudget> budget_;
  std::unique_ptr<MemoryBudgetScope> scope_;
};

}  // namespace xpuruntime::ort
