// ONNX import and export: a serialized ModelProto <-> Graph (graph.h).
//
//   Graph g = import_onnx(read_file("model.onnx"), {.model_dir = "."});
//   std::string bytes = export_onnx(g);   // e.g. the optimized graph of a session
//
// Import reads every opset the protobuf format carries (ONNX's node semantics per opset are the engine's job),
// external-data initializers (files relative to `model_dir`), value_info shapes (symbolic dims kept as names),
// subgraphs (If/Loop/Scan bodies) and the value types tensor, sequence of tensors and optional (value.h; a graph
// input or output of another kind - map, sparse tensor - is UnsupportedOperationError). Malformed or truncated
// bytes, unknown element types, missing external files, graphs that are not DAGs and nodes that break their
// operator's ONNX schema (arity, attributes and their types, an operator the imported opset lacks: Note [Models
// checked against ONNX's schemas]) raise InvalidArgumentError saying what and where; an IR version or opset newer
// than xpuruntime knows raises UnsupportedOperationError unless allow_newer_opsets.
//
// Ownership: returns values. Thread-safety: free functions, no shared state.
#pragma once

#include <string>

#include "xpuruntime/export.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/model_file.h"
#include "xpuruntime/onnx_dtype.h"  // dtype_from_onnx_type
#include "xpuruntime/tensor.h"

namespace xpuruntime {

struct XPURT_API OnnxImportOptions {
  // Folder of external-data files, which must stay inside it (Note [External data stays inside the model's
  // folder] in frontends/onnx/onnx_check.cpp); "": none, and a model with external data is refused.
  std::string model_dir;
  // Accept an IR version or an ONNX opset newer than xpuruntime's schema table knows, running each operator with
  // the newest semantics it knows (ExecutionPolicy::allow_newer_opsets). Default false: UnsupportedOperationError.
  bool allow_newer_opsets = false;
};

XPURT_API Graph import_onnx(const std::string& model_bytes, const OnnxImportOptions& options = {});
// Reads the file (read_model_file, xpuruntime/model_file.h), then import_onnx with model_dir = the file's folder.
XPURT_API Graph import_onnx_file(const std::string& path);
// Serializes `graph` as an ONNX ModelProto (initializers inline; com.xpuruntime nodes keep their domain).
XPURT_API std::string export_onnx(const Graph& graph);
// A serialized TensorProto -> CPU tensor (the ONNX test data's input_*.pb / output_*.pb).
XPURT_API Tensor tensor_from_onnx(const std::string& tensor_proto_bytes, const std::string& model_dir = "");
XPURT_API std::string tensor_to_onnx(const Tensor& tensor, const std::string& name = "");

}  // namespace xpuruntime
