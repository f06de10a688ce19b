// Communicators from C++: the host backend's collectives through ops::call on one thread per rank, timeouts that
// abort the group, the FileStore, and the tensor_parallel policy field (docs/distributed.md).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "xpuruntime/device_manager.h"
#include "xpuruntime/distributed.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/ops.h"

namespace xpuruntime {
namespace {

using distributed::Communicator;

Tensor filled(std::int64_t n, float value) {
  Tensor t = Tensor::empty({n}, DType::kFloat32);
  for (std::int64_t i = 0; i < n; ++i) static_cast<float*>(t.data_ptr())[i] = value + static_cast<float>(i);
  return t;
}

TEST(Distributed, HostAllReduceAndAllGatherThroughOps) {
  auto comms = Communicator::init_all({Device::cpu(), Device::cpu(), Device::cpu()});
  ASSERT_EQ(comms.size(), 3u);
  std::vector<Tensor> sums(3), gathered(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const Tensor x = filled(7, static_cast<float>(r));
      sums[r] = ops::call("all_reduce", {x}, Attributes().set("comm", comms[r]->handle()))[0];
      gathered[r] = ops::call("all_gather", {x}, Attributes().set("comm", comms[r]->handle()))[0];
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(gathered[r].shape(), (std::vector<std::int64_t>{21}));
    for (std::int64_t i = 0; i < 7; ++i) {
      EXPECT_FLOAT_EQ(static_cast<const float*>(sums[r].data_ptr())[i], 3.0f * static_cast<float>(i) + 3.0f);
      for (int q = 0; q < 3; ++q) {
        EXPECT_FLOAT_EQ(static_cast<const float*>(gathered[r].data_ptr())[q * 7 + i], static_cast<float>(q + i));
      }
    }
  }
}

TEST(Distributed, AMissingRankTimesOutAndAbortsTheGroup) {
  distributed::CommOptions options;
  options.timeout = std::chrono::milliseconds(100);
  auto comms = Communicator::init_all({Device::cpu(), Device::cpu()}, options);
  try {
    ops::call("all_reduce", {filled(4, 1)}, Attributes().set("comm", comms[0]->handle()));
    FAIL() << "expected a timeout";
  } catch (const DistributedError& e) {
    EXPECT_TRUE(e.timed_out());
  }
  EXPECT_TRUE(comms[1]->aborted());
  EXPECT_THROW(ops::call("all_reduce", {filled(4, 1)}, Attributes().set("comm", comms[1]->handle())), DistributedError);
}

TEST(Distributed, UnknownHandlesAndBadArgumentsAreTyped) {
  EXPECT_THROW(Communicator::find(1 << 30), DistributedError);
  EXPECT_THROW(Communicator::init_all({}), InvalidArgumentError);
  EXPECT_THROW(Communicator::init_all({Device::cpu(), Device::cuda(0)}), InvalidArgumentError);
  if (DeviceManager::instance().get_device_count() == 0) {
    // No GPU: NCCL communicators fail with a typed error, never a crash.
    EXPECT_THROW(Communicator::init_all({Device::cuda(0), Device::cuda(1)}), XpuRuntimeError);
  }
}

TEST(Distributed, FileStoreRendezvous) {
  const auto folder = std::filesystem::temp_directory_path() / "xpurt_test_file_store";
  std::filesystem::remove_all(folder);
  distributed::FileStore store(folder.string());
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    distributed::FileStore(folder.string()).set("id", std::string("\0abc", 4));
  });
  EXPECT_EQ(store.get("id", std::chrono::seconds(30)), std::string("\0abc", 4));
  writer.join();
  try {
    store.get("never", std::chrono::milliseconds(20));
    FAIL() << "expected a timeout";
  } catch (const DistributedError& e) {
    EXPECT_TRUE(e.timed_out());
  }
  EXPECT_THROW(store.set("../escape", "x"), InvalidArgumentError);
  std::filesystem::remove_all(folder);
}

TEST(Distributed, TensorParallelPolicyField) {
  ExecutionPolicy p;
  p.tensor_parallel = 4;
  EXPECT_EQ(ExecutionPolicy::from_json(p.to_json()).tensor_parallel, 4);
  EXPECT_THROW(ExecutionPolicy::from_json(R"({"tensor_parallel": 0})"), InvalidArgumentError);
}

}  // namespace
}  // namespace xpuruntime
