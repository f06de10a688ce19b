// The importer's check of a model against the ONNX standard, before anything is built from it (Note [Models
// checked against ONNX's schemas] in onnx_validate.cpp). Internal header of the ONNX frontend (src/cpp/frontends/onnx),
// which both engines share (the native import and the onnxruntime engine: onnx_check.h).
#pragma once

#if XPURT_ONNX_PROTO_GENERATED
#include "onnx/onnx-ml.pb.h"
#else
#include <onnx/onnx_pb.h>
#endif

namespace xpuruntime::detail {

struct ModelValidation {
  // Accept an IR version or an opset of ai.onnx / ai.onnx.ml / ai.onnx.preview.training newer than the schema table
  // knows (the newest known version of each operator is assumed). Default false: such a model is refused.
  bool allow_newer_opsets = false;
};

// Throws InvalidArgumentError (a malformed model: wrong arity, an unknown attribute, a missing required attribute, an
// operator its opset does not have, a domain imported twice), InvalidTypeError (an attribute of the wrong type) or
// UnsupportedOperationError (an IR version or opset newer than xpuruntime knows), naming the node, the operator and
// its version.
void validate_onnx_model(const onnx::ModelProto& model, const ModelValidation& options);

}  // namespace xpuruntime::detail
