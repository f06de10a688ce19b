// Rewrites and checks of a model before ONNX Runtime sees it, for models that crash ONNX Runtime (Note [Trailing
// empty inputs], Note [Models ORT crashes on] in ort_model_fixes.cpp). Internal header of the onnxruntime engine.
#pragma once

#include <string>

namespace xpuruntime::ort {

// When a node of `model` (in the main graph, a subgraph or a model-local function) ends its inputs with empty names
// (optional inputs left out), writes to `trimmed` the model without those trailing empty inputs and returns true;
// ONNX defines both forms to mean the same. Returns false, leaving `trimmed` alone, when there are none or `model`
// does not parse (ONNX Runtime then reports the bad model itself). Cost: a walk over the graph's structure that
// skips tensor data; the model is parsed and serialized only when it has such a node.
bool without_trailing_empty_inputs(const std::string& model, std::string* trimmed);

// Throws InvalidArgumentError naming the node when `model` has a node ONNX Runtime crashes on while loading it
// (Note [Models ORT crashes on] in ort_model_fixes.cpp): a SplitToSequence whose 'split' is a constant scalar <= 0,
// a node with an empty input name before a named one where its operator takes no optional input. Cost: a walk over
// the graph's structure; the model is parsed only when it has a SplitToSequence or such an empty name.
void check_loadable_by_ort(const std::string& model);

}  // namespace xpuruntime::ort
