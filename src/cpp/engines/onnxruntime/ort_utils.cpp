#include "engines/onnxruntime/ort_utils.h"

#include <mutex>

#include "core/cuda_utils.h"

namespace xpuruntime::ort {

const OrtApi& ort_api() {
  static const OrtApi* api = [] {
    const OrtApiBase* base = OrtGetApiBase();
    const OrtApi* found = base->GetApi(ORT_API_VERSION);
    if (found != nullptr) Ort::InitApi(found);
    return found;
  }();
  if (api == nullptr) {
    throw UnsupportedOperationError(detail::str_cat(
        "the loaded libonnxruntime (version ", OrtGetApiBase()->GetVersionString(), ") does not provide API version ",
        ORT_API_VERSION, " that xpuruntime was built with; use ONNX Runtime 1.29 or newer (scripts/fetch_onnxruntime.sh)"));
  }
  return *api;
}

Ort::Env& env() {
  ort_api();
  // Note [One Ort::Env]: ORT allows one OrtEnv per process (a second one shares the first's logging and thread
  // pools), and execution-provider libraries are registered on it; keep it for the life of the process. It is
  // intentionally leaked: destroying it at exit could run after libonnxruntime's own static destructors.
  static Ort::Env* instance = [] {
    Ort::Env* created = nullptr;
    XPURT_ORT_CHECK(created = new Ort::Env(ORT_LOGGING_LEVEL_WARNING, "xpuruntime"));
    return created;
  }();
  return *instance;
}

const char* ort_error_name(OrtErrorCode code) {
  switch (code) {
    case ORT_OK: return "ORT_OK";
    case ORT_FAIL: return "ORT_FAIL";
    case ORT_INVALID_ARGUMENT: return "ORT_INVALID_ARGUMENT";
    case ORT_NO_SUCHFILE: return "ORT_NO_SUCHFILE";
    case ORT_NO_MODEL: return "ORT_NO_MODEL";
    case ORT_ENGINE_ERROR: return "ORT_ENGINE_ERROR";
    case ORT_RUNTIME_EXCEPTION: return "ORT_RUNTIME_EXCEPTION";
    case ORT_INVALID_PROTOBUF: return "ORT_INVALID_PROTOBUF";
    case ORT_MODEL_LOADED: return "ORT_MODEL_LOADED";
    case ORT_NOT_IMPLEMENTED: return "ORT_NOT_IMPLEMENTED";
    case ORT_INVALID_GRAPH: return "ORT_INVALID_GRAPH";
    case ORT_EP_FAIL: return "ORT_EP_FAIL";
    case ORT_MODEL_LOAD_CANCELED: return "ORT_MODEL_LOAD_CANCELED";
    case ORT_MODEL_REQUIRES_COMPILATION: return "ORT_MODEL_REQUIRES_COMPILATION";
    case ORT_NOT_FOUND: return "ORT_NOT_FOUND";
    default: return "ORT_UNKNOWN_ERROR";
  }
}

void throw_ort_error(OrtErrorCode code, const std::string& ort_message, const char* call, const char* file,
                     int line) {
  std::string message =
      detail::format_library_error("ONNX Runtime", ort_error_name(code), static_cast<int>(code), call, -1, file,
                                   line, ort_message);
  switch (code) {
    case ORT_INVALID_ARGUMENT:
    case ORT_INVALID_PROTOBUF:
    case ORT_INVALID_GRAPH:
    case ORT_NO_MODEL:
    case ORT_NO_SUCHFILE:
      throw InvalidArgumentError(message);
    case ORT_NOT_IMPLEMENTED:
      throw UnsupportedOperationError(message);
    default:
      throw XpuRuntimeError(message);
  }
}

bool dtype_from_onnx(ONNXTensorElementDataType type, DType* out) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: *out = DType::kFloat32; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: *out = DType::kFloat16; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: *out = DType::kBFloat16; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: *out = DType::kFloat64; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: *out = DType::kInt8; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: *out = DType::kUInt8; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: *out = DType::kInt16; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: *out = DType::kInt32; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: *out = DType::kInt64; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: *out = DType::kBool; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: *out = DType::kUInt16; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: *out = DType::kUInt32; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: *out = DType::kUInt64; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN: *out = DType::kFloat8E4M3FN; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FNUZ: *out = DType::kFloat8E4M3FNUZ; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2: *out = DType::kFloat8E5M2; return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2FNUZ: *out = DType::kFloat8E5M2FNUZ; return true;
    default: return false;  // int4/uint4 too: ORT holds them packed, xpuruntime unpacked
  }
}

ONNXTensorElementDataType onnx_from_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case DType::kFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case DType::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    case DType::kFloat64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
    case DType::kInt8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case DType::kUInt8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case DType::kInt16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16;
    case DType::kInt32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case DType::kInt64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case DType::kBool: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
    case DType::kUInt16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
    case DType::kUInt32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32;
    case DType::kUInt64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64;
    case DType::kFloat8E4M3FN: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
    case DType::kFloat8E4M3FNUZ: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FNUZ;
    case DType::kFloat8E5M2: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2;
    case DType::kFloat8E5M2FNUZ: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2FNUZ;
    // ORT holds int4/uint4 packed two per byte, xpuruntime one per byte (Note [Float8 and 4-bit dtypes],
    // xpuruntime/low_bit.h): not fed as they are.
    case DType::kInt4:
    case DType::kUInt4: break;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

const char* onnx_type_name(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return "uint16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return "string";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "double";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return "uint32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return "uint64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64: return "complex64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128: return "complex128";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN: return "float8e4m3fn";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FNUZ: return "float8e4m3fnuz";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2: return "float8e5m2";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E5M2FNUZ: return "float8e5m2fnuz";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT4: return "uint4";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT4: return "int4";
    default: return "an unknown ONNX element type";
  }
}

}  // namespace xpuruntime::ort
