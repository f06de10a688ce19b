// Tensor-parallel sessions (Note [Tensor-parallel sessions] in tensor_parallel_session.cpp). Internal header.
#pragma once

#include <memory>

#include "xpuruntime/engine.h"
#include "xpuruntime/graph.h"

namespace xpuruntime::runtime {

// A session of ExecutionPolicy.tensor_parallel = N > 1 ranks of `graph`, one NativeSession each, on devices
// options.device .. +N-1 (CUDA; UnsupportedOperationError when the machine has fewer) or N CPU ranks.
std::unique_ptr<EngineSession> make_tensor_parallel_session(const Graph& graph, const SessionOptions& options);

}  // namespace xpuruntime::runtime
