// Segment boundaries of plans (Note [Segmented plans] in capture_plan.h).
#pragma once

#include <memory>

#include "xpuruntime/capture_plan.h"
#include "xpuruntime/graph.h"

namespace xpuruntime::runtime {

// `g`: an optimized graph specialised to its input shapes. When some nodes' shapes are known only at run time and
// every node where they start can end a segment (NonZero, NonMaxSuppression with constant parameters, or a node
// reading small values computed from data), `g` becomes the first segment's graph (the static nodes, those nodes
// in their bounded form, the counts and host values as extra outputs) and the boundary describing the rest is
// returned. Null otherwise, `g` unchanged.
std::shared_ptr<SegmentBoundary> split_segments(Graph& g, const PlanOptions& options);

}  // namespace xpuruntime::runtime
