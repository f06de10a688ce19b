#include "cuda_utils.h"

#include "xpuruntime/device_manager.h"

#include <cstdio>

namespace xpuruntime::detail {

std::string format_library_error(const char* library, const char* error_name, int code, const char* call,
                                 int device, const char* file, int line, const std::string& hint) {
  std::string where = device >= 0 ? str_cat(" on cuda:", device) : std::string();
  std::string message = str_cat(library, " error ", error_name, " (", code, ")", where, " in `", call, "` at ",
                                file, ":", line);
  if (!hint.empty()) message += ". " + hint;
  return message;
}

#if XPURT_WITH_CUDA
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  std::string hint = cudaGetErrorString(status);
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    hint += "; check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES";
  }
  std::string message =
      format_library_error("CUDA runtime", cudaGetErrorName(status), static_cast<int>(status), call, device, file,
                           line, hint);
  if (status == cudaErrorMemoryAllocation) throw OutOfMemoryError(message);
  if (is_sticky(status) && device >= 0) {
    // Note [Sticky CUDA errors] (device_manager.h): the context is lost; say so now and on every later use.
    DeviceManager::instance().mark_faulted(device, message);
    message += detail::str_cat("; this error is sticky: cuda:", device, " cannot be used again by this process");
  }
  throw CudaError(message, static_cast<int>(status));
}

bool is_sticky(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  int current = -1;
  XPURT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    XPURT_CUDA_CHECK(cudaSetDevice(device));
    previous_ = current;
  }
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "xpuruntime: could not restore CUDA device %d\n", previous_);
  }
}
#endif

}  // namespace xpuruntime::detail
