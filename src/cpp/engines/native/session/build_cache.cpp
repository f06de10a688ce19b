// The build cache of a native session (see build_cache.h).
//
// Note [Build cache]
// Most of a CUDA plan's build is the libraries choosing algorithms (cuDNN's heuristic ranking and workspace
// queries, cuBLASLt's heuristic; Note [Build phases]), and a second process would choose the same again. So a
// native session on CUDA keeps its Dispatcher's decisions in an AutotuneCache on disk, next to the generated
// kernels (core/cache_dir.h: <cache>/decisions/<policies' hash>.json; the entries' keys hold the signature, the
// device and the library versions): the next session with these policies re-creates each kernel's plan from its
// record (cuDNN: one workspace query instead of the heuristic; cuBLASLt: one algorithm check) as a lock file
// replays one, except that a first-supported rule still picks its kernel by priority and a record the libraries
// refuse is rebuilt afresh (Dispatcher::Options::build_cache). The file is read once, written after each plan
// build that added decisions (a temporary file renamed over it, so that processes sharing it never read half of
// one), and ignored when it cannot be read or written. XPURT_BUILD_CACHE=0 turns it off.
#include "engines/native/session/build_cache.h"

#include <cstdlib>
#include <system_error>

#include <unistd.h>

#include "core/cache_dir.h"
#include "core/policy_serialization.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::runtime {

std::unique_ptr<BuildCache> BuildCache::open(const SessionOptions& options) {
  if (!options.device.is_cuda()) return nullptr;
  if (const char* off = std::getenv("XPURT_BUILD_CACHE"); off != nullptr && std::string(off) == "0") return nullptr;
  const std::filesystem::path dir = detail::build_cache_dir();
  if (dir.empty()) return nullptr;
  std::unique_ptr<BuildCache> cache(new BuildCache());
  cache->path_ = dir / "decisions" /
                 (detail::fnv1a_hex(options.kernel_policy.to_json() + options.exec_policy.to_json()) + ".json");
  try {
    cache->cache_ = std::make_shared<AutotuneCache>(cache->path_.string(), /*autosave=*/false);  // loaded when it exists
  } catch (const XpuRuntimeError&) {
    cache->cache_ = std::make_shared<AutotuneCache>();  // unreadable (another version's, half-written): start over
  }
  cache->saved_ = cache->cache_->size();
  return cache;
}

void BuildCache::save() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cache_->size() == saved_) return;
  std::error_code ec;
  std::filesystem::create_directories(path_.parent_path(), ec);
  const std::filesystem::path tmp = path_.string() + ".tmp" + std::to_string(::getpid());
  try {
    cache_->save(tmp.string());
    std::filesystem::rename(tmp, path_, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  } catch (const XpuRuntimeError&) {
    std::filesystem::remove(tmp, ec);  // a read-only cache folder: no cache, nothing lost
  }
  saved_ = cache_->size();
}

}  // namespace xpuruntime::runtime
