// The NCCL backend of distributed::Communicator (CUDA builds). libnccl.so.2 is opened with dlopen on first use
// (Note [NCCL loaded at run time] in nccl_comm.cpp), so it is never a link dependency. Core calls these functions
// through the device communicator table (core/device_communicators.h, filled by register_nccl_communicators).
// Internal header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/distributed.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::nccl {

bool available(std::string* why_not);
std::string version();  // "2.28.3", empty when unavailable
std::vector<std::shared_ptr<distributed::Communicator>> init_all(const std::vector<Device>& devices,
                                                                 const distributed::CommOptions& options);
std::shared_ptr<distributed::Communicator> init_rank(int world_size, int rank, Device device,
                                                     distributed::Store& store,
                                                     const distributed::CommOptions& options, const std::string& key);
void group_start();
void group_end();

}  // namespace xpuruntime::nccl

namespace xpuruntime {
void register_nccl(KernelRegistry& registry);
}
