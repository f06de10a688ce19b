// The folder of xpuruntime's on-disk build cache (generated kernels, kernel decisions). Internal header.
//
// XPURT_CODEGEN_CACHE names it; else $XDG_CACHE_HOME/xpuruntime/codegen, else ~/.cache/xpuruntime/codegen; empty
// (no disk cache) when none of them is set. Generated kernels live at its top (Note [Generated kernels]), kernel
// decisions in its decisions/ folder (Note [Build cache]).
#pragma once

#include <cstdlib>
#include <filesystem>

namespace xpuruntime::detail {

inline std::filesystem::path build_cache_dir() {
  if (const char* dir = std::getenv("XPURT_CODEGEN_CACHE"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::filesystem::path(xdg) / "xpuruntime" / "codegen";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::filesystem::path(home) / ".cache" / "xpuruntime" / "codegen";
  }
  return {};
}

}  // namespace xpuruntime::detail
