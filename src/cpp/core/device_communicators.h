// The communicators on devices that a backend provides to distributed::Communicator: a table of function pointers
// the nccl backend fills and core/distributed.cpp reads (Note [Device communicator table]). Internal header of
// src/cpp.
//
// Note [Device communicator table]
// Communicator::init_all and init_rank create NCCL communicators for CUDA devices, and GroupGuard, nccl_available
// and nccl_version ask NCCL, but core includes no backend (docs/architecture.md, "Layering rules"). So core
// declares what it needs here and the nccl backend fills it (register_nccl_communicators, backends/nccl/
// nccl_comm.cpp) when device_communicators() is first called. device_communicators() is defined in
// core/backend_registration.cpp, the one place that names the backends of this build, and is filled on its own
// first use (a communicator may be created before any kernel is looked up). Null entries: no backend of this build
// provides device communicators (a build without NCCL's header); core/distributed.cpp then raises
// UnsupportedOperationError saying what to install, as it did before the table.
//
// Every entry keeps the contract of the nccl function it points to (backends/nccl/nccl_comm.h), which is that of the
// Communicator member or free function of xpuruntime/distributed.h that calls it, after that caller's checks of its
// arguments.
//
// Ownership: the table is static, filled once (thread-safe) and never changed afterwards. Thread-safety: read it
// from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/distributed.h"

namespace xpuruntime::distributed {

struct DeviceCommunicators {
  // Whether the library can be used here (loaded, a CUDA build), else why not in *why_not.
  bool (*available)(std::string* why_not) = nullptr;
  std::string (*version)() = nullptr;  // "2.28.3", empty when unavailable
  // One communicator per device, all in this process (Communicator::init_all on CUDA devices).
  std::vector<std::shared_ptr<Communicator>> (*init_all)(const std::vector<Device>& devices,
                                                         const CommOptions& options) = nullptr;
  // This process's rank, meeting the others through `store` under `key` (Communicator::init_rank).
  std::shared_ptr<Communicator> (*init_rank)(int world_size, int rank, Device device, Store& store,
                                             const CommOptions& options, const std::string& key) = nullptr;
  void (*group_start)() = nullptr;  // ncclGroupStart
  void (*group_end)() = nullptr;    // ncclGroupEnd, then the grouped collectives' completion
};

// The table of this build, filled on the first call (core/backend_registration.cpp).
const DeviceCommunicators& device_communicators();

}  // namespace xpuruntime::distributed

namespace xpuruntime {

// Fills `table` with the nccl backend's functions (backends/nccl/nccl_comm.cpp); called only by
// distributed::device_communicators(), in builds with that backend.
void register_nccl_communicators(distributed::DeviceCommunicators& table);

}  // namespace xpuruntime
