// Helpers shared by the C++ tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "xpuruntime/device_manager.h"

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
