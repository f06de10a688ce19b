// ONNX import/export (see onnx_import.h). Work in progress by the lead: being written now.
#include "xpuruntime/onnx_import.h"

#include "xpuruntime/exceptions.h"

namespace xpuruntime {

Graph import_onnx(const std::string&, const OnnxImportOptions&) { throw UnsupportedOperationError("import_onnx: not yet"); }
Graph import_onnx_file(const std::string&) { throw UnsupportedOperationError("import_onnx: not yet"); }
std::string export_onnx(const Graph&) { throw UnsupportedOperationError("export_onnx: not yet"); }
Tensor tensor_from_onnx(const std::string&, const std::string&) { throw UnsupportedOperationError("not yet"); }
std::string tensor_to_onnx(const Tensor&, const std::string&) { throw UnsupportedOperationError("not yet"); }

}  // namespace xpuruntime
