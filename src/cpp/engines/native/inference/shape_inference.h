// Shape inference, constant folding and the optimization pipeline of the native engine. Internal header.
//
// infer_types walks the graph in topological order and, for each node: folds it when every input is a constant
// (evaluated with the ONNX reference library; random ops are never folded), folds Shape/Size of values whose
// shape is known, and otherwise infers its outputs' types through its lowering (the registry op's shape
// inference, or the view's shape). Nodes run by the reference library keep the types the model declared
// (value_info), if any.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "xpuruntime/engine.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::runtime {

struct InferOptions {
  bool fold_constants = true;
  const KernelRegistry* registry = nullptr;  // default: KernelRegistry::global()
  std::size_t max_folded_bytes = 64u << 20;  // a folded output larger than this stays a node
  Device device;                             // the plan's device (device-specific graph passes)
  int tp_size = 1;                           // tensor parallelism (PassContext::tp_*)
  int tp_rank = 0;
  std::int64_t tp_comm = -1;
  bool fuse_elementwise = true;                                    // PassContext::fuse_elementwise
  std::function<bool(const std::string&)> keep_unfused;            // PassContext::keep_unfused
  bool fuse_quantized = true;                                      // PassContext::fuse_quantized
  // Folding keeps each DequantizeLinear of an int8/uint8 constant (PassContext::keep_quantized_weights); optimize()
  // sets it when quantized_fusion will run.
  bool keep_quantized_weights = false;
  bool fp8_fast_accumulation = false;  // PassContext::fp8_fast_accumulation
  bool fuse_int4_weights = true;  // PassContext::fuse_int4_weights
  // Folding keeps each DequantizeLinear of an int4/uint4 constant (PassContext::keep_int4_weights); optimize() sets it
  // when int4_weight_fusion will run.
  bool keep_int4_weights = false;
  bool decompose_group_query_attention = false;  // PassContext::decompose_group_query_attention
};

// Returns the number of nodes folded.
XPURT_API int infer_types(Graph& g, const InferOptions& options);
// Removes nodes whose outputs nobody reads; returns how many.
int eliminate_dead_nodes(Graph& g);
// Exported for the C++ pass tests on real exports. The whole pipeline: infer/fold, the graph passes (passes not in
// `disabled`), dead-node elimination. Returns one note per pass that changed something ("constant_folding: 12 nodes
// folded", ...). `phases`, when given, gets each step's wall time (Note [Build phases] in capture_plan.cpp).
XPURT_API std::vector<std::string> optimize(Graph& g, const InferOptions& options,
                                             const std::set<std::string>& disabled,
                                             std::vector<BuildPhase>* phases = nullptr);

}  // namespace xpuruntime::runtime
