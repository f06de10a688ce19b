// The collective registry ops (all_reduce, all_gather, reduce_scatter, broadcast, send, recv): their schemas, and
// the one kernel body the "nccl" and "host" backends share (each registers it for its own device type). Internal.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::distributed {

// The collective ops' names, in documentation order.
const std::vector<std::string>& collective_ops();
// Adds the collective op schemas (family "collective").
void register_collective_schemas(KernelRegistry& registry);
// The kernel of collective `op` for communicators of `backend` ("nccl" or "host", also the kernel's name), from
// backend folder `folder`, on `device_type`: it supports a descriptor whose "comm" attribute names a live
// communicator of that backend on the descriptor's device, and runs the communicator's collective on the launch's
// stream.
std::unique_ptr<Kernel> make_collective_kernel(const std::string& op, const std::string& backend,
                                               const std::string& folder, DeviceType device_type,
                                               const std::string& summary);

}  // namespace xpuruntime::distributed
