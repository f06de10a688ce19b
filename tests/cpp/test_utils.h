// Helpers shared by the C++ tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_policy.h"

// Skips a GPU-only test on machines without a CUDA device, saying why.
#define XPURT_SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                             \
    if (::xpuruntime::DeviceManager::instance().get_device_count() == 0) {                         \
      GTEST_SKIP() << "needs a CUDA device: "                                                      \
                   << ::xpuruntime::DeviceManager::instance().cuda_unavailable_reason();           \
    }                                                                                              \
  } while (0)

// Expects `statement` to throw `type` with `fragment` in its message.
#define XPURT_EXPECT_THROW_WITH(statement, type, fragment)                                          \
  do {                                                                                             \
    try {                                                                                          \
      statement;                                                                                   \
      ADD_FAILURE() << "expected " #type " from " #statement;                                      \
    } catch (const type& e) {                                                                      \
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();              \
    }                                                                                              \
  } while (0)

// Skips the test when this build has no YAML support (yaml-cpp missing at configure time).
#define XPURT_SKIP_WITHOUT_YAML()                                                         \
  do {                                                                                    \
    try {                                                                                 \
      (void)::xpuruntime::KernelPolicy().to_yaml();                                       \
    } catch (const ::xpuruntime::UnsupportedOperationError&) {                            \
      GTEST_SKIP() << "this build has no yaml-cpp (YAML policy files)";                   \
    }                                                                                     \
  } while (0)

namespace xpuruntime {

// Sets an environment variable for the life of the object (restores the previous value, or unsets it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_old_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_old_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_old_ = false;
  std::string old_;
};

}  // namespace xpuruntime
