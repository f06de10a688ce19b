// The collective registry ops (all_reduce, all_gather, reduce_scatter, broadcast, send, recv): their schemas, and
// the one kernel body the "nccl" and "host" backends share (each registers it for its own device type). Internal.
#pragma once

#include <memory>
#include <optional>
#include <utility>
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
// `name`: the kernel's name when it is not `backend` (Note [NCCL algorithm and protocol kernels]).
std::unique_ptr<Kernel> make_collective_kernel(const std::string& op, const std::string& backend,
                                               const std::string& folder, DeviceType device_type,
                                               const std::string& summary, const std::string& name = {});

// Note [NCCL algorithm and protocol kernels]
// NCCL picks its algorithm (Ring, Tree) and protocol (LL, LL128, Simple) per communicator, when the communicator is
// created (NCCL_ALGO / NCCL_PROTO), not per call. So a KernelPolicy names them through all_reduce kernels:
// "nccl_ring", "nccl_tree" and "nccl_<algo>_<proto>" ("nccl_ring_ll128", ...). Each supports only communicators
// created with that algorithm and protocol (CommOptions::nccl_algo / nccl_proto), and a tensor-parallel session
// whose KernelPolicy pins or prefers one creates its communicators with them: the policy replays the same NCCL
// tuning, and explain() shows it as the all_reduce's kernel.
struct NcclTuning {
  std::string algo;   // "Ring", "Tree" ("" = NCCL's choice)
  std::string proto;  // "LL", "LL128", "Simple" ("" = NCCL's choice)
};
// The kernel names of Note [NCCL algorithm and protocol kernels] with their tuning.
const std::vector<std::pair<std::string, NcclTuning>>& nccl_tuned_kernels();
// The tuning a kernel name asks for; nullopt when it is not one of them.
std::optional<NcclTuning> nccl_tuning_of(const std::string& kernel);

}  // namespace xpuruntime::distributed
