// Internal CUDA helpers: the CUDA check macro, its error formatter, and a device guard.
// Only compiled with XPURT_WITH_CUDA; never included by public headers.
#pragma once

#include <string>

#include "xpuruntime/exceptions.h"

namespace xpuruntime::detail {

// The one formatter for failed vendor-library calls: library, error name and code, the call as text, the
// device, file:line, and (optional) a hint.
std::string format_library_error(const char* library, const char* error_name, int code, const char* call,
                                 int device, const char* file, int line, const std::string& hint = {});

}  // namespace xpuruntime::detail

#if XPURT_WITH_CUDA
#include <cuda_runtime_api.h>

namespace xpuruntime::detail {

// Throws CudaError for `status` (OutOfMemoryError for cudaErrorMemoryAllocation), clearing a non-sticky error; a
// sticky one marks the current device faulted (Note [Sticky CUDA errors] in device_manager.h).
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
// Whether `status` leaves the CUDA context unusable (illegal address, device-side assert, ...).
bool is_sticky(cudaError_t status);

// Makes `device` current for the CUDA runtime for the guard's scope (only when it differs).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard(CudaDeviceGuard&&) = delete;
  CudaDeviceGuard& operator=(CudaDeviceGuard&&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace xpuruntime::detail

#define XPURT_CUDA_CHECK(expr)                                                      \
  do {                                                                              \
    const cudaError_t xpurt_status_ = (expr);                                       \
    if (xpurt_status_ != cudaSuccess) {                                             \
      ::xpuruntime::detail::throw_cuda_error(xpurt_status_, #expr, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)

#endif  // XPURT_WITH_CUDA

// Thrown wherever a CUDA feature is used in a build without CUDA.
#define XPURT_THROW_NO_CUDA_BUILD(what)                                                        \
  throw ::xpuruntime::CudaError(::xpuruntime::detail::str_cat(                                 \
      what, " needs CUDA, but this xpuruntime was built without it; rebuild with the CUDA "    \
            "toolkit installed (cmake -DXPURT_WITH_CUDA=ON)"))
