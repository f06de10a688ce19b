// The typed error hierarchy of xpuruntime and the check macros that raise it.
//
// Contract: the public C++ API reports every failure by throwing one of these types; library code never
// aborts or exits on bad input. The Python bindings translate each type into the Python exception of the
// same name (InvalidArgumentError also derives from ValueError, InvalidTypeError from TypeError).
//
//   XpuRuntimeError                  base of everything xpuruntime throws
//   +-- CudaError                    a CUDA runtime/driver call failed, or CUDA is unavailable
//   +-- OutOfMemoryError             an allocation could not be satisfied (message: asked/allocated/reserved/free)
//   +-- UnsupportedOperationError    this build or device cannot do what was asked (message: what to install)
//   +-- InvalidArgumentError         a caller passed a bad value (Python: ValueError)
//   +-- InvalidTypeError             a caller passed a value of the wrong dtype/kind (Python: TypeError)
//   +-- DistributedError             a collective or communicator failed: a rank timed out, died or aborted
//                                    (Python: also TimeoutError when the message starts with "timeout")
//   +-- RunTerminatedError           a run stopped before its end: RunOptions terminate, its timeout, an interrupt
//                                    (run_options.h; Python: RunTimeoutError, also a TimeoutError, for the timeout)
//
// Use XPURT_CHECK for caller errors ("Expected ..., but got ...") and XPURT_INTERNAL_ASSERT for our own bugs.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "xpuruntime/export.h"

namespace xpuruntime {

enum class ErrorCode {
  kInternal,
  kCuda,
  kOutOfMemory,
  kUnsupported,
  kInvalidArgument,
  kInvalidType,
  kDistributed,
  kTerminated,
};

namespace detail {
// Note [Printable messages]: an error's message as every error keeps it: bytes that are not UTF-8 (an op type or a
// value name from a hostile model) written as \xNN, so that Python can make a str of it; never empty ("(no
// message)" instead).
XPURT_API std::string printable_message(const std::string& message);
}  // namespace detail

class XPURT_API XpuRuntimeError : public std::runtime_error {
 public:
  explicit XpuRuntimeError(const std::string& message, ErrorCode code = ErrorCode::kInternal)
      : std::runtime_error(detail::printable_message(message)), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

class XPURT_API CudaError : public XpuRuntimeError {
 public:
  // `cuda_status` is the numeric cudaError_t, or 0 when the failure is not a CUDA call (e.g. no device).
  explicit CudaError(const std::string& message, int cuda_status = 0)
      : XpuRuntimeError(message, ErrorCode::kCuda), cuda_status_(cuda_status) {}
  int cuda_status() const noexcept { return cuda_status_; }

 private:
  int cuda_status_;
};

class XPURT_API OutOfMemoryError : public XpuRuntimeError {
 public:
  explicit OutOfMemoryError(const std::string& message) : XpuRuntimeError(message, ErrorCode::kOutOfMemory) {}
};

class XPURT_API UnsupportedOperationError : public XpuRuntimeError {
 public:
  explicit UnsupportedOperationError(const std::string& message)
      : XpuRuntimeError(message, ErrorCode::kUnsupported) {}
};

class XPURT_API InvalidArgumentError : public XpuRuntimeError {
 public:
  explicit InvalidArgumentError(const std::string& message)
      : XpuRuntimeError(message, ErrorCode::kInvalidArgument) {}
};

class XPURT_API InvalidTypeError : public XpuRuntimeError {
 public:
  explicit InvalidTypeError(const std::string& message) : XpuRuntimeError(message, ErrorCode::kInvalidType) {}
};

class XPURT_API DistributedError : public XpuRuntimeError {
 public:
  explicit DistributedError(const std::string& message, bool timed_out = false)
      : XpuRuntimeError(message, ErrorCode::kDistributed), timed_out_(timed_out) {}
  bool timed_out() const noexcept { return timed_out_; }

 private:
  bool timed_out_;
};

class XPURT_API RunTerminatedError : public XpuRuntimeError {
 public:
  // `timed_out`: the run's RunOptions timeout stopped it (rather than terminate or an interrupt).
  explicit RunTerminatedError(const std::string& message, bool timed_out = false)
      : XpuRuntimeError(message, ErrorCode::kTerminated), timed_out_(timed_out) {}
  bool timed_out() const noexcept { return timed_out_; }

 private:
  bool timed_out_;
};

namespace detail {
// Concatenates strings, characters and numbers into a message. Numbers go through std::to_string rather
// than a C++ stream, so building a message never touches std::locale (which is fragile when libstdc++ is
// linked statically into a shared library that Python loads).
template <typename T>
void append_piece(std::string& out, const T& value) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, char>) {
    out.push_back(value);
  } else if constexpr (std::is_same_v<D, bool>) {
    out += value ? "true" : "false";
  } else if constexpr (std::is_arithmetic_v<D>) {
    out += std::to_string(value);
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(value);
  } else {
    std::ostringstream stream;
    stream << value;
    out += stream.str();
  }
}

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::string out;
  (append_piece(out, args), ...);
  return out;
}
}  // namespace detail

}  // namespace xpuruntime

// Raise InvalidArgumentError with the streamed message when `cond` is false.
#define XPURT_CHECK(cond, ...)                                                      \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      throw ::xpuruntime::InvalidArgumentError(::xpuruntime::detail::str_cat(__VA_ARGS__)); \
    }                                                                               \
  } while (0)

// Raise InvalidTypeError with the streamed message when `cond` is false.
#define XPURT_CHECK_TYPE(cond, ...)                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      throw ::xpuruntime::InvalidTypeError(::xpuruntime::detail::str_cat(__VA_ARGS__)); \
    }                                                                               \
  } while (0)

// An invariant of xpuruntime itself; failing it is our bug, reported with file:line.
#define XPURT_INTERNAL_ASSERT(cond, ...)                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      throw ::xpuruntime::XpuRuntimeError(::xpuruntime::detail::str_cat(            \
          "internal error (please report): ", #cond, " failed at ", __FILE__, ":",  \
          __LINE__, ". " __VA_OPT__(, ) __VA_ARGS__));                              \
    }                                                                               \
  } while (0)
