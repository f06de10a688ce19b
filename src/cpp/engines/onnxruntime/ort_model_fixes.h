// The checks and rewrites of a model before ONNX Runtime sees it, on one parse of its bytes: the ONNX frontend's
// check (frontends/onnx/onnx_check.h), the models ORT crashes on (Note [Models ORT crashes on]), trailing empty
// inputs (Note [Trailing empty inputs]) and what the session's options depend on (Note [Float8 QDQ through ORT's
// CPU]); the Notes are in ort_model_fixes.cpp. Internal header of the onnxruntime engine.
#pragma once

#include <string>

#include "frontends/onnx/onnx_check.h"

namespace xpuruntime::ort {

// What check_for_ort found in a model.
struct ModelForOrt {
  // The model ORT is handed when it had to be rewritten (without trailing empty inputs); empty: the bytes as given.
  std::string rewritten;
  // A QuantizeLinear or DequantizeLinear with a float8 input or output: ORT's QDQ fusion must be off.
  bool float8_qdq = false;
};

// Parses `model` once and runs on that parse, in order:
//  * onnx_frontend::validate_onnx with `checks` (the schemas and the external data, as the native engine checks
//    them), with its errors;
//  * the models ORT crashes on while loading them (Note [Models ORT crashes on]): InvalidArgumentError naming the
//    node for a SplitToSequence whose 'split' is a constant scalar <= 0, a node with an empty input name before a
//    named one where its operator takes no optional input, a Split whose constant sizes name another number of parts
//    than it has outputs;
//  * trailing empty input names (optional inputs left out, which ONNX defines to mean the same as no input there):
//    when a node in the main graph, a subgraph or a model-local function has them, `rewritten` is the model without
//    them (Note [Trailing empty inputs]);
//  * float8 QuantizeLinear/DequantizeLinear (Note [Float8 QDQ through ORT's CPU]).
// The parsed model is dropped before returning: ORT parses the bytes itself.
ModelForOrt check_for_ort(const std::string& model, const onnx_frontend::CheckOptions& checks);

}  // namespace xpuruntime::ort
