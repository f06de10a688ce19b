#include <gtest/gtest.h>

#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {
namespace {

TEST(Device, ParsesTheUsualSpellings) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("CPU:0"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("gpu:1"), Device::cuda(1));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
}

TEST(Device, RejectsMalformedNames) {
  XPURT_EXPECT_THROW_WITH(Device::parse("tpu"), InvalidArgumentError, "\"tpu\"");
  XPURT_EXPECT_THROW_WITH(Device::parse("cuda:"), InvalidArgumentError, "non-negative index");
  XPURT_EXPECT_THROW_WITH(Device::parse("cuda:-1"), InvalidArgumentError, "non-negative index");
  XPURT_EXPECT_THROW_WITH(Device::parse("cuda:1x"), InvalidArgumentError, "cuda:1x");
  XPURT_EXPECT_THROW_WITH(Device::parse("cpu:1"), InvalidArgumentError, "one CPU device");
}

TEST(DeviceManager, AlwaysListsTheCpuFirst) {
  const auto devices = DeviceManager::instance().get_all_devices();
  ASSERT_GE(devices.size(), 1u);
  EXPECT_TRUE(devices[0].device.is_cpu());
  EXPECT_FALSE(devices[0].name.empty());
  EXPECT_GT(devices[0].total_memory, 0u);
  EXPECT_GT(devices[0].free_memory, 0u);
  EXPECT_GT(devices[0].sm_count, 0);
  EXPECT_EQ(devices.size(), static_cast<std::size_t>(DeviceManager::instance().get_device_count()) + 1);
}

TEST(DeviceManager, UnknownDevicesRaiseTypedErrorsNamingTheReason) {
  auto& dm = DeviceManager::instance();
  const int count = dm.get_device_count();
  try {
    dm.get_device_info(Device::cuda(count));
    FAIL() << "expected CudaError";
  } catch (const CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:" + std::to_string(count)), std::string::npos) << m;
    if (count == 0) {
      EXPECT_NE(m.find(dm.cuda_unavailable_reason()), std::string::npos) << m;
      EXPECT_FALSE(dm.cuda_unavailable_reason().empty());
    } else {
      EXPECT_NE(m.find("exist"), std::string::npos) << m;
    }
  }
  XPURT_EXPECT_THROW_WITH(dm.check_device(Device(DeviceType::kCUDA, -1)), InvalidArgumentError, "non-negative");
  XPURT_EXPECT_THROW_WITH(dm.set_current_device(Device::cuda(count + 7)), CudaError, "cuda:");
}

TEST(DeviceManager, CpuOnlyMachinesReportNoCudaDevicesAndKeepWorking) {
  auto& dm = DeviceManager::instance();
  if (dm.get_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_FALSE(dm.cuda_available());
  EXPECT_EQ(dm.get_current_device(), Device::cpu());
  dm.synchronize(Device::cpu());
  XPURT_EXPECT_THROW_WITH(dm.synchronize(Device::cuda(0)), CudaError, "no CUDA device is available");
}

TEST(DeviceManagerGpu, ReportsCapabilities) {
  XPURT_SKIP_WITHOUT_GPU();
  auto& dm = DeviceManager::instance();
  const DeviceInfo info = dm.get_device_info(Device::cuda(0));
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_memory, 1ULL << 30);
  EXPECT_GT(info.free_memory, 0u);
  EXPECT_LE(info.free_memory, info.total_memory);
  EXPECT_GE(info.compute_capability_major, 7);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_TRUE(info.supports_fp16);
  EXPECT_EQ(info.supports_bf16, info.compute_capability_major >= 8);
  EXPECT_EQ(info.supports_fp8, info.compute_capability_major * 10 + info.compute_capability_minor >= 89);
  EXPECT_GT(info.driver_version, 0);
  EXPECT_GT(info.runtime_version, 0);
  EXPECT_FALSE(info.pci_bus_id.empty());
  dm.set_current_device(Device::cuda(0));
  EXPECT_EQ(dm.get_current_device(), Device::cuda(0));
  dm.synchronize(Device::cuda(0));
}

}  // namespace
}  // namespace xpuruntime
