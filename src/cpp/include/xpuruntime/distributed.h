// Communicators and collectives across devices (docs/distributed.md).
//
// A Communicator connects `size()` ranks, each bound to one device. Two backends:
//   - "nccl": CUDA devices, through NVIDIA's NCCL (libnccl.so.2, loaded at run time: a machine without it gets
//     UnsupportedOperationError saying what to install). One process driving several GPUs (`init_all`), or one
//     process per GPU meeting through a Store (`init_rank`).
//   - "host": ranks of one process on the CPU (threads meeting in shared memory): the same collectives for CPU
//     tensors, so that sharded (tensor-parallel) plans run and are tested on machines without a GPU.
// Collectives are registry ops (all_reduce, all_gather, reduce_scatter, broadcast, send, recv) whose attribute
// "comm" is a communicator's handle(): they are dispatched, explained and captured into CUDA graphs like every
// other op (ops::call, or nodes of a plan).
//
//   auto comms = distributed::Communicator::init_all({Device::cuda(0), Device::cuda(1)});
//   // one thread per rank, or inside distributed::GroupGuard:
//   ops::call("all_reduce", {x0}, Attributes().set("comm", comms[0]->handle()));
//
// Note [Collectives that never finish]
// A collective waits on the GPU for every rank; a rank that died or never calls leaves the others spinning.
// Every communicator has a timeout (CommOptions::timeout): Communicator::wait() (what sessions use instead of a
// bare stream synchronize) polls the stream and NCCL's asynchronous error and, past the deadline, aborts the
// communicator (ncclCommAbort makes the spinning kernels return) and raises DistributedError. An aborted
// communicator refuses every later call with the reason; its handle stays valid until it is destroyed.
//
// Ownership: communicators are shared (std::shared_ptr); the handle table holds weak references, so a handle
// outliving its communicator is refused with a clear error. Thread-safety: a communicator may be used from one
// thread per rank at a time (NCCL's rule); handles, abort() and aborted() are safe from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/export.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::distributed {

enum class ReduceOp { kSum, kProd, kMax, kMin, kAvg };
XPURT_API ReduceOp reduce_op_from_name(const std::string& name);  // "sum", "prod", "max", "min", "avg"
XPURT_API const char* reduce_op_name(ReduceOp op);

struct XPURT_API CommOptions {
  // How long a collective may wait for the other ranks before the communicator is aborted.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How long creating a communicator may wait for every rank to join and for NCCL to initialise (the rendezvous
  // through a store, ncclCommInitRankConfig). 0 (default): the larger of `timeout` and kDefaultInitTimeout.
  // Note [Cold starts are not collectives]: a process that has just started spends seconds importing and
  // initialising CUDA before it joins (6.6 s on an H200 machine), which a collective's timeout must not count. NCCL
  // 2.22+ still connects the ranks at their first collective, under that collective's timeout: forcing the
  // connections at creation (NCCL_RUNTIME_CONNECT=0) let a rank's spinning kernels block another rank's first
  // allocation with no deadline left to end it (docs/distributed.md, "The multi-GPU tests, run after run").
  std::chrono::milliseconds init_timeout{0};
  static constexpr std::chrono::milliseconds kDefaultInitTimeout{std::chrono::minutes(2)};
  std::chrono::milliseconds creation_timeout() const {
    return init_timeout.count() > 0 ? init_timeout : std::max(timeout, kDefaultInitTimeout);
  }
  // NCCL's algorithm and protocol ("" = NCCL's own choice): NCCL_ALGO / NCCL_PROTO for this communicator's
  // creation, e.g. "Ring", "Tree"; "Simple", "LL", "LL128". NCCL reads them when a communicator is created.
  std::string nccl_algo;
  std::string nccl_proto;
};

// A key-value rendezvous for `init_rank` (what torch.distributed calls a store).
class XPURT_API Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits for `key` up to `timeout`; DistributedError naming the key and the wait when it does not appear.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

// A store in a folder of a shared file system (one file per key, written atomically: a temporary file renamed).
class XPURT_API FileStore final : public Store {
 public:
  explicit FileStore(std::string folder);  // created if missing; InvalidArgumentError when it cannot be
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  const std::string& folder() const { return folder_; }

 private:
  std::string path_of(const std::string& key) const;
  std::string folder_;
};

class XPURT_API Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // One communicator per device, all in this process (rank i on devices[i]): NCCL for CUDA devices, "host" for
  // CPU devices (devices all CUDA or all CPU; CUDA devices distinct).
  static std::vector<std::shared_ptr<Communicator>> init_all(const std::vector<Device>& devices,
                                                             const CommOptions& options = {});
  // This process's rank of `world_size`, on `device` (CUDA), meeting the other processes through `store` under
  // `key` (rank 0 publishes NCCL's unique id there). Waits at most options.timeout for every rank.
  static std::shared_ptr<Communicator> init_rank(int world_size, int rank, Device device, Store& store,
                                                 const CommOptions& options = {},
                                                 const std::string& key = "xpuruntime_comm");
  // The communicator of `handle`; DistributedError when there is none (destroyed, or never made).
  static std::shared_ptr<Communicator> find(std::int64_t handle);

  int rank() const { return rank_; }
  int size() const { return size_; }
  Device device() const { return device_; }
  std::int64_t handle() const { return handle_; }  // the ops' "comm" attribute
  const std::string& backend() const { return backend_; }  // "nccl" or "host"
  const CommOptions& options() const { return options_; }
  std::string str() const;  // "Communicator(nccl, rank 0 of 2, cuda:0, handle 3)"

  // Collectives, enqueued on `stream` (CPU: run at once). Shapes: all_reduce and broadcast y = x;
  // all_gather y = [size * x.shape[0], ...] (ranks' tensors stacked along axis 0); reduce_scatter
  // y = [x.shape[0] / size, ...]. Inputs and outputs contiguous, on this communicator's device, of one dtype.
  virtual void all_reduce(const Tensor& x, Tensor& y, ReduceOp op, const StreamView& stream) = 0;
  virtual void all_gather(const Tensor& x, Tensor& y, const StreamView& stream) = 0;
  virtual void reduce_scatter(const Tensor& x, Tensor& y, ReduceOp op, const StreamView& stream) = 0;
  virtual void broadcast(const Tensor& x, Tensor& y, int root, const StreamView& stream) = 0;
  virtual void send(const Tensor& x, int peer, const StreamView& stream) = 0;
  virtual void recv(Tensor& y, int peer, const StreamView& stream) = 0;

  // Waits for `stream`'s work, at most options().timeout (Note [Collectives that never finish]).
  virtual void wait(const StreamView& stream);
  // Aborts: pending collectives return, every later call raises DistributedError with `reason`.
  virtual void abort(const std::string& reason);
  bool aborted() const;
  std::string abort_reason() const;
  // DistributedError when aborted (every collective checks it first).
  void check_usable() const;

 protected:
  Communicator(std::string backend, int rank, int size, Device device, CommOptions options);
  void register_handle(const std::shared_ptr<Communicator>& self);
  struct State;
  std::shared_ptr<State> state_;

 private:
  std::string backend_;
  int rank_ = 0;
  int size_ = 1;
  Device device_;
  CommOptions options_;
  std::int64_t handle_ = -1;
};

// NCCL group semantics (ncclGroupStart/End): inside a group, collectives of several ranks driven by one thread
// are launched together when the group ends. No effect on the host backend (its ranks need their own threads).
class XPURT_API GroupGuard {
 public:
  GroupGuard();
  ~GroupGuard() noexcept(false);
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;
};
XPURT_API void group_start();
XPURT_API void group_end();

// Whether NCCL can be used here (libnccl loaded and a CUDA build), else why not; and its version ("2.28.3").
XPURT_API bool nccl_available(std::string* why_not = nullptr);
XPURT_API std::string nccl_version();

}  // namespace xpuruntime::distributed
