// POSIX file helpers for reading model files and their external data without blocking or following what must not be
// followed (Note [External data files are opened, not followed] in frontends/onnx/onnx_check.cpp): a file
// descriptor owner, openat retried on EINTR, pread of an exact span, and a message word for a file that is not a
// regular file. Internal header of src/cpp.
//
// Ownership: UniqueFd owns one descriptor (move-only). Thread-safety: free functions, no shared state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>

namespace xpuruntime::detail {

// A file descriptor, closed on destruction.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset();

 private:
  int fd_;
};

// What a file that is not a regular file is, for messages ("a FIFO", "a directory", ...).
const char* file_kind(mode_t mode);

// openat, retried when a signal interrupts it.
int open_at(int dir, const char* name, int flags);

// Reads `length` bytes at `offset` of `fd` into `out` with pread, going on after short reads and signals. Returns
// how many it read: fewer than `length` only when the file ends first. A failed read is an InvalidArgumentError
// "<what> failed: <reason>".
std::int64_t pread_fully(int fd, char* out, std::int64_t length, std::int64_t offset, const std::string& what);

}  // namespace xpuruntime::detail
