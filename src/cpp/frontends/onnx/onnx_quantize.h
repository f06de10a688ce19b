// What the engines that read ONNX do with a policy's quantization decisions before they build a model: the public
// writer is apply_quantization (include/xpuruntime/quantization.h); this is the session's use of it. Internal header
// of the ONNX frontend (src/cpp/frontends/onnx): engines include it.
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <string>

#include "xpuruntime/engine.h"

namespace xpuruntime::onnx_frontend {

// The model an engine builds for `options`: `model` itself (returned as is), or, when options.exec_policy carries
// quantization decisions, the QDQ model apply_quantization writes (kept in `storage`, which the result refers to).
// InvalidArgumentError when the decisions' precision is not the policy's, and when the policy's precision is int8,
// fp8 or int4-weights without decisions on a model that has no quantized node (calibration, which makes decisions,
// runs in the Python SDK).
const std::string& model_for_policy(const std::string& model, const SessionOptions& options, std::string& storage);

// The line explain() shows for the policy's decisions ("quantization: 3 nodes quantized (int8), 1 excluded"), or
// "" when the policy has none.
std::string quantization_note(const ExecutionPolicy& policy);

}  // namespace xpuruntime::onnx_frontend
