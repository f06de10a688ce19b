#include "engines/onnxruntime/ort_utils.h"

#include <cctype>
#include <cstdio>
#include <mutex>
#include <string>

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

namespace {

// Note [ORT's log]: ONNX Runtime logs a failing node at ERROR level before it returns the status that becomes the
// run's typed error, with the same C++ that Note [ORT's messages] removes from it. ORT's log goes through here: that
// duplicate is dropped (the exception carries it), every other message is printed cleaned, one line each.
void log_to_stderr(void*, OrtLoggingLevel severity, const char*, const char*, const char*, const char* message) {
  const std::string text = message ? message : "";
  const bool run_failure = text.find("Non-zero status code returned while running") != std::string::npos;
  if (severity >= ORT_LOGGING_LEVEL_ERROR && run_failure) return;
  const char* level = severity >= ORT_LOGGING_LEVEL_FATAL   ? "fatal"
                      : severity >= ORT_LOGGING_LEVEL_ERROR ? "error"
                      : severity >= ORT_LOGGING_LEVEL_WARNING ? "warning"
                                                              : "info";
  std::fprintf(stderr, "onnxruntime %s: %s\n", level, clean_ort_message(text).c_str());
}

}  // namespace

Ort::Env& env() {
  ort_api();
  // Note [One Ort::Env]: ORT allows one OrtEnv per process (a second one shares the first's logging and thread
  // pools), and execution-provider libraries are registered on it; keep it for the life of the process. It is
  // intentionally leaked: destroying it at exit could run after libonnxruntime's own static destructors.
  static Ort::Env* instance = [] {
    Ort::Env* created = nullptr;
    XPURT_ORT_CHECK(created = new Ort::Env(ORT_LOGGING_LEVEL_WARNING, "xpuruntime", log_to_stderr, nullptr));
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

// Note [ORT's messages]
// ONNX Runtime's messages are written for its own developers: an ORT_ENFORCE failure reads
// "/onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h:84 onnxruntime::ReshapeHelper::
// ReshapeHelper(const onnxruntime::TensorShape&, ...) size != 0 && (input_shape_size % size) == 0 was false. The
// input tensor cannot be reshaped ...", a CUDA failure ends "; file=/onnxruntime_src/...; line=123;
// expr=cudaMalloc(...);", and a build with stack traces appends "Stacktrace:". clean_ort_message keeps what a user
// can act on: the source location (ORT's build machine's path and line), the C++ function signature after it, the
// failed C++ condition before "was false.", the file/line/expr fields and the stack trace are dropped; ORT's own
// words stay. The typed error is chosen from ORT's status code and, for ORT_FAIL (which ORT uses for most
// failures), from what its message says: an operator ORT has no schema or kernel for is an unsupported operation,
// a model that fails ORT's type or shape inference while loading is a bad model (InvalidArgumentError, as the model
// check's refusals are). Neither xpuruntime's call expression nor its source path goes into the message.

namespace {

bool source_suffix(const std::string& text, std::size_t colon) {
  for (const char* ext : {".cc", ".h", ".cpp", ".cu", ".cuh", ".hpp", ".inc"}) {
    const std::size_t n = std::char_traits<char>::length(ext);
    if (colon >= n && text.compare(colon - n, n, ext) == 0) return true;
  }
  return false;
}

// The end of a balanced (...) or [...] group that starts at `open`, or npos.
std::size_t group_end(const std::string& text, std::size_t open) {
  const char first = text[open];
  const char last = first == '(' ? ')' : ']';
  int depth = 0;
  for (std::size_t k = open; k < text.size(); ++k) {
    if (text[k] == first) ++depth;
    if (text[k] == last && --depth == 0) return k + 1;
  }
  return std::string::npos;
}

// At `pos` a "path/file.cc:123 " location: its length through the signature after it ("ns::f(args) const [with T =
// float] "), or 0 when there is no location at `pos`.
std::size_t location_length(const std::string& text, std::size_t pos) {
  std::size_t colon = pos;
  while (colon < text.size() && text[colon] != ':' && text[colon] != ' ' && text[colon] != '\n') ++colon;
  if (colon == text.size() || text[colon] != ':' || !source_suffix(text, colon)) return 0;
  std::size_t k = colon + 1;
  while (k < text.size() && std::isdigit(static_cast<unsigned char>(text[k]))) ++k;
  if (k == colon + 1) return 0;
  if (k < text.size() && text[k] == ' ') ++k;
  // The signature, when one follows: a name up to its parameter list, which has no space before '(' except in the
  // return type ("onnxruntime::common::Status onnxruntime::Foo(...)").
  const std::size_t paren = text.find('(', k);
  const std::size_t stop = text.find_first_of(".\n", k);
  if (paren == std::string::npos || (stop != std::string::npos && stop < paren && text[stop] == '\n')) return k - pos;
  const std::string head = text.substr(k, paren - k);
  if (head.find("::") == std::string::npos && head.find(' ') != std::string::npos) return k - pos;  // prose
  std::size_t end = group_end(text, paren);
  if (end == std::string::npos) return k - pos;
  for (const char* suffix : {" const", " volatile", " &&", " &", " noexcept"}) {
    const std::size_t n = std::char_traits<char>::length(suffix);
    if (text.compare(end, n, suffix) == 0) end += n;
  }
  if (text.compare(end, 2, " [") == 0) {
    const std::size_t bracket = group_end(text, end + 1);
    if (bracket != std::string::npos) end = bracket;
  }
  while (end < text.size() && text[end] == ' ') ++end;
  return end - pos;
}

std::string trim(std::string text) {
  const std::size_t first = text.find_first_not_of(" \n\t;");
  if (first == std::string::npos) return "";
  const std::size_t last = text.find_last_not_of(" \n\t;");
  return text.substr(first, last - first + 1);
}

bool contains(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

}  // namespace

std::string clean_ort_message(const std::string& message) {
  std::string text = message.substr(0, message.find("Stacktrace:"));
  // CUDA failures: "...; file=/path; line=12; expr=cudaMalloc(&p, n);" (the fields to the end).
  const std::size_t fields = text.find("; file=");
  if (fields != std::string::npos) text = text.substr(0, fields);
  std::string out;
  std::size_t k = 0;
  while (k < text.size()) {
    const bool word_start = k == 0 || text[k - 1] == ' ' || text[k - 1] == '\n' || text[k - 1] == ':';
    const std::size_t length = word_start && text[k] != ' ' ? location_length(text, k) : 0;
    if (length == 0) {
      out += text[k++];
      continue;
    }
    k += length;
    // An ORT_ENFORCE: the C++ condition, then " was false. ", then the message (which may be empty).
    const std::size_t was_false = text.find(" was false.", k);
    const std::size_t line_end = text.find('\n', k);
    if (was_false != std::string::npos && (line_end == std::string::npos || was_false < line_end)) {
      k = was_false + 11;
      while (k < text.size() && text[k] == ' ') ++k;
    }
  }
  std::string cleaned = trim(out);
  for (std::size_t at; (at = cleaned.find('\n')) != std::string::npos;) cleaned[at] = ' ';
  return cleaned.empty() ? "(ONNX Runtime gave no message)" : cleaned;
}

void throw_ort_error(OrtErrorCode code, const std::string& ort_message) {
  const std::string said = clean_ort_message(ort_message);
  const std::string message = detail::str_cat("ONNX Runtime ", ort_error_name(code), ": ", said);
  switch (code) {
    case ORT_INVALID_ARGUMENT:
    case ORT_INVALID_PROTOBUF:
    case ORT_INVALID_GRAPH:
    case ORT_NO_MODEL:
    case ORT_NO_SUCHFILE:
    case ORT_NOT_FOUND:
      throw InvalidArgumentError(message);
    case ORT_NOT_IMPLEMENTED:
      throw UnsupportedOperationError(message);
    default:
      break;
  }
  if (contains(said, "is not a registered function/op") || contains(said, "Could not find an implementation for") ||
      contains(said, "is not supported")) {
    throw UnsupportedOperationError(message);
  }
  if (contains(said, "Failed to allocate memory") || contains(said, "out of memory")) throw OutOfMemoryError(message);
  if (contains(said, "CUDA failure") || contains(said, "CUDA error") || contains(said, "CUBLAS failure") ||
      contains(said, "CUDNN failure")) {
    throw CudaError(message);
  }
  if (code == ORT_FAIL && !contains(said, "while running") &&
      (contains(said, "[ShapeInferenceError]") || contains(said, "[TypeInferenceError]") ||
       contains(said, "This is an invalid model"))) {
    throw InvalidArgumentError(message);
  }
  throw XpuRuntimeError(message);
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
