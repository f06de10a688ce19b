// ONNX Runtime helpers of the onnxruntime engine: the API entry point, the process-wide Ort::Env, the check
// macro that turns ORT's errors into xpuruntime's typed errors, and dtype mapping.
//
// Include this header (not onnxruntime_cxx_api.h directly): it defines ORT_API_MANUAL_INIT so that loading the
// core never calls into ORT; `ort_api()` initializes the C++ API on first use and reports a library too old for
// these headers instead of crashing.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <string>

#include "xpuruntime/dtype.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::ort {

// The OrtApi of the loaded libonnxruntime for ORT_API_VERSION, initializing Ort's C++ API on the first call.
// Thread-safe. Throws UnsupportedOperationError when the library is older than the headers.
const OrtApi& ort_api();

// The one Ort::Env of the process (logging at WARNING, id "xpuruntime"), created on first use. Thread-safe.
// Ort::Env itself is thread-safe; registering execution-provider libraries on it is serialized by the caller.
Ort::Env& env();

// Throws the typed xpuruntime error for an ORT failure (Note [ORT's messages] in ort_utils.cpp), its message
// "ONNX Runtime <code name>: <ORT's message, cleaned>": ORT_INVALID_ARGUMENT, ORT_INVALID_PROTOBUF, ORT_INVALID_GRAPH,
// ORT_NO_MODEL, ORT_NO_SUCHFILE, ORT_NOT_FOUND, and a model that fails ORT's inference at load -> InvalidArgumentError;
// ORT_NOT_IMPLEMENTED and an operator ORT has no schema or kernel for -> UnsupportedOperationError; an allocation
// failure -> OutOfMemoryError; a CUDA, cuBLAS or cuDNN failure -> CudaError; anything else -> XpuRuntimeError.
[[noreturn]] void throw_ort_error(OrtErrorCode code, const std::string& ort_message);
// ORT's message without source locations, C++ signatures, failed C++ conditions, CUDA file/line/expr fields or
// stack traces, on one line (Note [ORT's messages]).
std::string clean_ort_message(const std::string& message);
const char* ort_error_name(OrtErrorCode code);  // "ORT_INVALID_PROTOBUF"

// ONNX element type <-> DType. `onnx_type_name` names every ONNX type ("string", "float8e4m3fn").
bool dtype_from_onnx(ONNXTensorElementDataType type, DType* out);
ONNXTensorElementDataType onnx_from_dtype(DType dtype);
const char* onnx_type_name(ONNXTensorElementDataType type);

}  // namespace xpuruntime::ort

// Runs `statement` (a call or assignment through ORT's C++ API) and rethrows an Ort::Exception as the typed
// xpuruntime error (throw_ort_error: ORT's words, not the statement or this file's path), e.g.
// XPURT_ORT_CHECK(session = Ort::Session(env, data, size, options));
#define XPURT_ORT_CHECK(statement)                                                                         \
  do {                                                                                                     \
    try {                                                                                                  \
      statement;                                                                                           \
    } catch (const Ort::Exception& ort_exception_) {                                                       \
      ::xpuruntime::ort::throw_ort_error(ort_exception_.GetOrtErrorCode(), ort_exception_.what());         \
    }                                                                                                      \
  } while (0)
