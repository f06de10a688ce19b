// Note [Build cache]: a native session's kernel decisions on disk, replayed by its Dispatcher. Internal header.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "xpuruntime/dispatcher.h"
#include "xpuruntime/engine.h"

namespace xpuruntime::runtime {

// The build cache of one session: the AutotuneCache its Dispatcher records decisions in, and the file it is read
// from and written to. Thread-safety: save() may be called from any thread.
class BuildCache {
 public:
  // The cache of a session of `options`, read from its file when there is one; null when the cache is off (a CPU
  // session, XPURT_BUILD_CACHE=0, no cache folder).
  static std::unique_ptr<BuildCache> open(const SessionOptions& options);

  // The cache the Dispatcher takes (Dispatcher::Options::build_cache).
  const std::shared_ptr<AutotuneCache>& cache() const { return cache_; }
  const std::filesystem::path& path() const { return path_; }
  std::size_t size() const { return cache_->size(); }  // kernel decisions held
  // Writes the file when decisions were added since it was read or last written (a temporary file renamed over
  // it); a folder that cannot be written leaves it unwritten, silently.
  void save();

 private:
  BuildCache() = default;
  std::shared_ptr<AutotuneCache> cache_;
  std::filesystem::path path_;
  std::mutex mutex_;
  std::size_t saved_ = 0;  // entries the file holds (under mutex_)
};

}  // namespace xpuruntime::runtime
