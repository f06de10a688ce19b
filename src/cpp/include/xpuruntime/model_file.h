// Reading a model file: what InferenceSession(path) and import_onnx_file read a model with.
//
// Thread-safety: a free function, no shared state.
#pragma once

#include <string>

#include "xpuruntime/export.h"

namespace xpuruntime {

// The bytes of the file at `path`, in one sized read. InvalidArgumentError "cannot open the model file ..." when it
// cannot be opened or read, and when it is not a regular file (a FIFO or a device is refused, not waited on).
XPURT_API std::string read_model_file(const std::string& path);

}  // namespace xpuruntime
