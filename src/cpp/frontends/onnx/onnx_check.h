// The ONNX frontend's check of a model, which every engine that reads ONNX makes before anything else reads the
// model (the native engine's import, the onnxruntime engine): the bytes parsed once into a ModelProto and checked
// against the ONNX standard (Note [Models checked against ONNX's schemas] in onnx_validate.cpp), the external data
// checked against the model's folder (Note [External data stays inside the model's folder] in onnx_check.cpp), and
// the external-data reader the native import fills tensors with. Internal header of the ONNX frontend
// (src/cpp/frontends/onnx): a frontend includes only core and itself; engines include it.
//
// Ownership: ExternalSpan owns its open file; the other functions fill what the caller owns. Thread-safety: free
// functions, no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/file_io.h"

#if XPURT_ONNX_PROTO_GENERATED
#include "onnx/onnx-ml.pb.h"
#else
#include <onnx/onnx_pb.h>
#endif

namespace xpuruntime::onnx_frontend {

// Parses `model_bytes` into `model` and makes the checks every engine makes before anything else reads it: not empty,
// under protobuf's 2 GB, a ModelProto with a graph, IR version 3 or newer, an opset_import, and every node against
// ONNX's schemas (detail::validate_onnx_model; `allow_newer_opsets` as ModelValidation's). External data is not
// looked at (check_external_data). InvalidArgumentError (InvalidTypeError for an attribute's type,
// UnsupportedOperationError for an IR version or opset newer than the schema table knows) saying what and where.
void parse_checked(const std::string& model_bytes, bool allow_newer_opsets, onnx::ModelProto* model);

// The external-data checks (Note [External data stays inside the model's folder]) on every tensor of `model` that
// has external data (initializers, sparse ones, attribute tensors, subgraphs, model-local functions), without reading
// the data: each file must open as a regular file inside `model_dir` and hold its span. Returns how many tensors have
// external data. InvalidArgumentError naming the tensor and the file.
std::size_t check_external_data(const onnx::ModelProto& model, const std::string& model_dir);

struct CheckOptions {
  // Folder of the external-data files, which must stay inside it; "": none, and a model with external data is
  // refused.
  std::string model_dir;
  bool allow_newer_opsets = false;  // as parse_checked's
};

// parse_checked, then check_external_data against options.model_dir on the same parse: for engines whose library
// reads the model and its files itself (onnxruntime), which go on to check `model` for their own needs. The same
// errors as the two.
void validate_onnx(const std::string& model_bytes, const CheckOptions& options, onnx::ModelProto* model);

// An external-data span, checked and open: `length` bytes at `offset` of the regular file `file`.
struct ExternalSpan {
  detail::UniqueFd file;
  std::string path;  // for messages
  std::int64_t offset = 0;
  std::int64_t length = 0;
};

// Resolves, opens and checks a tensor's external data (Note [External data stays inside the model's folder], Note
// [External data files are opened, not followed]). `nbytes`: the tensor's byte size, which the length must match;
// unset to check only that the span is in the file (for element types xpuruntime tensors do not hold, which the
// engine's library reads). `where` names the tensor in messages. InvalidArgumentError saying what is wrong.
ExternalSpan open_external(const onnx::TensorProto& proto, const std::string& model_dir,
                           std::optional<std::size_t> nbytes, const std::string& where);

// Reads exactly span.length bytes into `dst` (Note [External data files are opened, not followed]);
// InvalidArgumentError when the file ends early.
void read_external(const ExternalSpan& span, void* dst, const std::string& where);

}  // namespace xpuruntime::onnx_frontend
