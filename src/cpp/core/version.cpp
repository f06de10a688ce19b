#include "xpuruntime/version.h"

#include "xpuruntime/exceptions.h"

#if XPURT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace xpuruntime {

std::string get_version() { return XPURT_VERSION_STRING; }

BuildInfo get_build_info() {
  BuildInfo info;
  info.version = get_version();
#if XPURT_WITH_CUDA
  info.with_cuda = true;
  info.cuda_runtime_version = CUDART_VERSION;
#endif
#if XPURT_WITH_NVTX
  info.with_nvtx = true;
#endif
#if defined(__clang__)
  info.compiler = detail::str_cat("clang ", __clang_major__, ".", __clang_minor__, ".", __clang_patchlevel__);
#elif defined(__GNUC__)
  info.compiler = detail::str_cat("gcc ", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__);
#else
  info.compiler = "unknown";
#endif
  info.build_type = XPURT_BUILD_TYPE;
  return info;
}

}  // namespace xpuruntime
