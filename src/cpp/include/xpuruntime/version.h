// Version and build information of the xpuruntime core library.
#pragma once

#include <string>

#include "xpuruntime/export.h"

namespace xpuruntime {

XPURT_API std::string get_version();  // "MAJOR.MINOR.PATCH"

struct BuildInfo {
  std::string version;             // same as get_version()
  bool with_cuda = false;          // compiled against the CUDA runtime
  bool with_nvtx = false;          // NVTX ranges compiled in
  int cuda_runtime_version = 0;    // CUDART_VERSION compiled against (e.g. 13000), 0 without CUDA
  std::string compiler;            // compiler id and version
  std::string build_type;          // CMAKE_BUILD_TYPE
};

XPURT_API BuildInfo get_build_info();

}  // namespace xpuruntime
