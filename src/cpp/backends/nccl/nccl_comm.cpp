// NCCL communicators and the nccl backend's collective kernels.
//
// Note [NCCL loaded at run time]
// xpuruntime must load and run on machines without NCCL (CI, CPU-only users): libnccl.so.2 is opened with dlopen
// the first time a communicator is asked for (XPURT_NCCL_LIBRARY overrides the path), and each entry point is
// looked up by name. The header (nccl.h of the CUDA toolkit or NCCL_ROOT) fixes the ABI at build time; a library
// older than 2.19 (no ncclCommInitRankConfig with a non-blocking config) is refused with its version.
//
// Note [Non-blocking communicators]
// Communicators are created with config.blocking = 0, so that no NCCL call can wait forever for a rank that never
// comes: creation, group ends and collectives return ncclInProgress while they wait, and poll() checks
// ncclCommGetAsyncError against the communicator's deadline, aborting it past the timeout (Note [Collectives that
// never finish] in distributed.h).
#include "backends/nccl/nccl_comm.h"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/cuda_utils.h"
#include "core/device_communicators.h"
#include "core/distributed_ops.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::nccl {

namespace {

struct Api {
  void* library = nullptr;
  std::string error;  // why it cannot be used
  int version = 0;
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
};

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* override_path = std::getenv("XPURT_NCCL_LIBRARY");
    const std::string path = override_path && *override_path ? override_path : "libnccl.so.2";
    a.library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (a.library == nullptr) {
      const char* why = dlerror();
      a.error = detail::str_cat("NCCL could not be loaded (", path, ": ", why ? why : "not found",
                                "); install NCCL 2.19 or newer (Debian/Ubuntu: libnccl2 from NVIDIA's CUDA "
                                "repository; pip: nvidia-nccl-cu13) or point XPURT_NCCL_LIBRARY at libnccl.so.2");
      return;
    }
    bool missing = false;
    std::string names;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(a.library, name));
      if (fn == nullptr) {
        missing = true;
        names += detail::str_cat(names.empty() ? "" : ", ", name);
      }
    };
    load(a.GetVersion, "ncclGetVersion");
    load(a.GetUniqueId, "ncclGetUniqueId");
    load(a.CommInitRankConfig, "ncclCommInitRankConfig");
    load(a.CommGetAsyncError, "ncclCommGetAsyncError");
    load(a.CommAbort, "ncclCommAbort");
    load(a.CommDestroy, "ncclCommDestroy");
    load(a.CommFinalize, "ncclCommFinalize");
    load(a.GetErrorString, "ncclGetErrorString");
    load(a.GetLastError, "ncclGetLastError");
    load(a.AllReduce, "ncclAllReduce");
    load(a.AllGather, "ncclAllGather");
    load(a.ReduceScatter, "ncclReduceScatter");
    load(a.Broadcast, "ncclBroadcast");
    load(a.Send, "ncclSend");
    load(a.Recv, "ncclRecv");
    load(a.GroupStart, "ncclGroupStart");
    load(a.GroupEnd, "ncclGroupEnd");
    if (a.GetVersion != nullptr) a.GetVersion(&a.version);
    if (missing || a.version < 21900) {
      a.error = detail::str_cat("the NCCL library at ", path, " (version ", a.version, ") is too old or incomplete",
                                missing ? " (missing " + names + ")" : std::string(),
                                "; xpuruntime needs NCCL 2.19 or newer");
      return;
    }
  });
  return a;
}

const Api& checked_api() {
  const Api& a = api();
  if (!a.error.empty()) throw UnsupportedOperationError(a.error);
  return a;
}

std::string result_text(ncclResult_t result, ncclComm_t comm = nullptr) {
  const Api& a = api();
  std::string text = a.GetErrorString ? a.GetErrorString(result) : "NCCL error";
  if (comm != nullptr && a.GetLastError) {
    const char* last = a.GetLastError(comm);
    if (last && *last) text += detail::str_cat(" (", last, ")");
  }
  return detail::str_cat(text, " [ncclResult ", static_cast<int>(result), "]");
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt8:
      return ncclInt8;
    case DType::kUInt8:
    case DType::kBool:
      return ncclUint8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kUInt32:
      return ncclUint32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt64:
      return ncclUint64;
    default:
      break;
  }
  throw InvalidTypeError(detail::str_cat("NCCL has no ", dtype_name(dtype), " type"));
}

ncclRedOp_t nccl_op(distributed::ReduceOp op) {
  switch (op) {
    case distributed::ReduceOp::kSum:
      return ncclSum;
    case distributed::ReduceOp::kProd:
      return ncclProd;
    case distributed::ReduceOp::kMax:
      return ncclMax;
    case distributed::ReduceOp::kMin:
      return ncclMin;
    case distributed::ReduceOp::kAvg:
      return ncclAvg;
  }
  return ncclSum;
}

// NCCL_ALGO / NCCL_PROTO for the creation of communicators with these options (NCCL reads them then).
class TuningEnv {
 public:
  explicit TuningEnv(const distributed::CommOptions& options) : lock_(mutex()) {
    set("NCCL_ALGO", options.nccl_algo, saved_algo_);
    set("NCCL_PROTO", options.nccl_proto, saved_proto_);
  }
  ~TuningEnv() {
    restore("NCCL_ALGO", saved_algo_);
    restore("NCCL_PROTO", saved_proto_);
  }
  TuningEnv(const TuningEnv&) = delete;
  TuningEnv& operator=(const TuningEnv&) = delete;

 private:
  struct Saved {
    bool changed = false;
    bool had = false;
    std::string value;
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static void set(const char* name, const std::string& value, Saved& saved) {
    if (value.empty()) return;
    const char* old = std::getenv(name);
    saved.changed = true;
    saved.had = old != nullptr;
    if (old) saved.value = old;
    setenv(name, value.c_str(), 1);
  }
  static void restore(const char* name, const Saved& saved) {
    if (!saved.changed) return;
    if (saved.had)
      setenv(name, saved.value.c_str(), 1);
    else
      unsetenv(name);
  }
  std::unique_lock<std::mutex> lock_;
  Saved saved_algo_;
  Saved saved_proto_;
};

class NcclCommunicator;

// Waiting for NCCL or a stream: spin (yielding) for the first 2 ms, where small collectives finish, then sleep in
// short steps. A sleep from the start cost a small all-reduce ~150 us (measured on 2 H200s).
class Backoff {
 public:
  void pause() {
    if (std::chrono::steady_clock::now() - start_ < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// This thread's open NCCL groups (group_start/group_end nest) and the communicators that enqueued work in them:
// a non-blocking group end leaves them in progress, so group_end polls each (Note [Non-blocking communicators]).
thread_local int g_group_depth = 0;
thread_local std::vector<std::shared_ptr<distributed::Communicator>> g_group_members;

class NcclCommunicator final : public distributed::Communicator {
 public:
  NcclCommunicator(int rank, int size, Device device, const distributed::CommOptions& options)
      : Communicator("nccl", rank, size, device, options) {}

  ~NcclCommunicator() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) return;
    detail::CudaDeviceGuard guard(device().index);
    // An aborted or failed communicator has been freed by ncclCommAbort already (comm_ is null then).
    (void)api().CommDestroy(comm_);
    comm_ = nullptr;
  }

  // Creates the communicators of `ranks` (each: rank, device) of a world of `size` with `id`, in one NCCL group
  // (needed when one thread creates several), and waits for them to be ready.
  static std::vector<std::shared_ptr<distributed::Communicator>> create(
      const std::vector<std::pair<int, Device>>& ranks, int size, const ncclUniqueId& id,
      const distributed::CommOptions& options) {
    const Api& a = checked_api();
    std::vector<std::shared_ptr<NcclCommunicator>> comms;
    for (const auto& [rank, device] : ranks)
      comms.push_back(std::make_shared<NcclCommunicator>(rank, size, device, options));
    {
      TuningEnv env(options);
      if (ranks.size() > 1) check(a.GroupStart(), "ncclGroupStart");
      std::string failure;
      for (auto& c : comms) {
        detail::CudaDeviceGuard guard(c->device().index);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;  // Note [Non-blocking communicators]
        const ncclResult_t r = a.CommInitRankConfig(&c->comm_, size, id, c->rank(), &config);
        if (r != ncclSuccess && r != ncclInProgress && failure.empty()) {
          failure = detail::str_cat("ncclCommInitRankConfig (rank ", c->rank(), " on ", c->device().str(),
                                    ") failed: ", result_text(r));
        }
      }
      if (ranks.size() > 1) {
        const ncclResult_t r = a.GroupEnd();
        if (r != ncclSuccess && r != ncclInProgress && failure.empty()) {
          failure = "ncclGroupEnd after creating the communicators failed: " + result_text(r);
        }
      }
      if (!failure.empty()) {
        for (auto& c : comms) c->abort(failure);
        throw DistributedError(failure);
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + options.creation_timeout();
    for (auto& c : comms) {
      c->poll(deadline, "creating the communicator (waiting for every rank to join)", options.creation_timeout());
    }
    std::vector<std::shared_ptr<distributed::Communicator>> out;
    for (auto& c : comms) {
      c->register_handle(c);
      out.push_back(c);
    }
    return out;
  }

  void all_reduce(const Tensor& x, Tensor& y, distributed::ReduceOp op, const StreamView& stream) override {
    enqueue("ncclAllReduce", [&](ncclComm_t comm) {
      return api().AllReduce(x.data_ptr(), y.data_ptr(), static_cast<std::size_t>(x.numel()), nccl_type(x.dtype()),
                             nccl_op(op), comm, cuda_stream(stream));
    });
  }
  void all_gather(const Tensor& x, Tensor& y, const StreamView& stream) override {
    enqueue("ncclAllGather", [&](ncclComm_t comm) {
      return api().AllGather(x.data_ptr(), y.data_ptr(), static_cast<std::size_t>(x.numel()), nccl_type(x.dtype()),
                             comm, cuda_stream(stream));
    });
  }
  void reduce_scatter(const Tensor& x, Tensor& y, distributed::ReduceOp op, const StreamView& stream) override {
    enqueue("ncclReduceScatter", [&](ncclComm_t comm) {
      return api().ReduceScatter(x.data_ptr(), y.data_ptr(), static_cast<std::size_t>(y.numel()), nccl_type(x.dtype()),
                                 nccl_op(op), comm, cuda_stream(stream));
    });
  }
  void broadcast(const Tensor& x, Tensor& y, int root, const StreamView& stream) override {
    enqueue("ncclBroadcast", [&](ncclComm_t comm) {
      return api().Broadcast(x.data_ptr(), y.data_ptr(), static_cast<std::size_t>(x.numel()), nccl_type(x.dtype()),
                             root, comm, cuda_stream(stream));
    });
  }
  void send(const Tensor& x, int peer, const StreamView& stream) override {
    enqueue("ncclSend", [&](ncclComm_t comm) {
      return api().Send(x.data_ptr(), static_cast<std::size_t>(x.numel()), nccl_type(x.dtype()), peer, comm,
                        cuda_stream(stream));
    });
  }
  void recv(Tensor& y, int peer, const StreamView& stream) override {
    enqueue("ncclRecv", [&](ncclComm_t comm) {
      return api().Recv(y.data_ptr(), static_cast<std::size_t>(y.numel()), nccl_type(y.dtype()), peer, comm,
                        cuda_stream(stream));
    });
  }

  void wait(const StreamView& stream) override {
    check_usable();
    detail::CudaDeviceGuard guard(device().index);
    const auto deadline = std::chrono::steady_clock::now() + options().timeout;
    auto* s = cuda_stream(stream);
    Backoff backoff;
    while (true) {
      const cudaError_t status = cudaStreamQuery(s);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) XPURT_CUDA_CHECK(status);
      check_async("waiting for a collective");
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string reason = detail::str_cat("timeout: ", str(), " waited more than ",
                                                   static_cast<double>(options().timeout.count()) / 1000.0,
                                                   " s for the other ranks (a rank died, hung, or skipped a "
                                                   "collective); the communicator was aborted");
        abort(reason);
        throw DistributedError(reason, /*timed_out=*/true);
      }
      backoff.pause();
    }
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_ != nullptr) {
        detail::CudaDeviceGuard guard(device().index);
        (void)api().CommAbort(comm_);  // pending kernels return; the communicator is freed
        comm_ = nullptr;
      }
    }
    Communicator::abort(reason);
  }

 private:
  static void check(ncclResult_t r, const char* call) {
    if (r != ncclSuccess && r != ncclInProgress) {
      throw DistributedError(detail::str_cat(call, " failed: ", result_text(r)));
    }
  }

  static cudaStream_t cuda_stream(const StreamView& stream) { return static_cast<cudaStream_t>(stream.handle); }

  ncclComm_t handle_checked() {
    check_usable();
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) {
      throw DistributedError(detail::str_cat(str(), " has no NCCL communicator (aborted)"));
    }
    return comm_;
  }

  // Runs one NCCL call (enqueueing a collective); a non-blocking communicator may answer ncclInProgress, which
  // is polled to completion (Note [Non-blocking communicators]).
  template <typename Call>
  void enqueue(const char* name, Call call) {
    ncclComm_t comm = handle_checked();
    detail::CudaDeviceGuard guard(device().index);
    const ncclResult_t r = call(comm);
    if (g_group_depth > 0 && (r == ncclSuccess || r == ncclInProgress)) {
      // Launched when the group ends (group_end polls this communicator then).
      g_group_members.push_back(Communicator::find(handle()));
      return;
    }
    if (r == ncclInProgress) {
      poll(std::chrono::steady_clock::now() + options().timeout, name);
      return;
    }
    if (r != ncclSuccess) {
      const std::string reason = detail::str_cat(name, " on ", str(), " failed: ", result_text(r, comm));
      abort(reason);
      throw DistributedError(reason);
    }
  }

 public:
  // Polls ncclCommGetAsyncError until the communicator is no longer in progress; aborts past `deadline`.
  // `allowed`: the wait the deadline stands for, for the message (default: the collectives' timeout).
  void poll(std::chrono::steady_clock::time_point deadline, const char* what,
            std::chrono::milliseconds allowed = std::chrono::milliseconds(0)) {
    if (allowed.count() == 0) allowed = options().timeout;
    Backoff backoff;
    while (true) {
      ncclComm_t comm;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        comm = comm_;
      }
      if (comm == nullptr) check_usable();
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = api().CommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string reason = detail::str_cat(what, " on ", str(), " failed: ", result_text(state, comm));
        abort(reason);
        throw DistributedError(reason);
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string reason = detail::str_cat("timeout: ", what, " on ", str(), " took longer than ",
                                                   static_cast<double>(allowed.count()) / 1000.0, " s");
        abort(reason);
        throw DistributedError(reason, /*timed_out=*/true);
      }
      backoff.pause();
    }
  }

 private:
  // An asynchronous NCCL error (a peer failed, a network error) aborts the communicator.
  void check_async(const char* what) {
    ncclComm_t comm;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      comm = comm_;
    }
    if (comm == nullptr) {
      check_usable();
      return;
    }
    ncclResult_t state = ncclSuccess;
    if (api().CommGetAsyncError(comm, &state) != ncclSuccess) return;
    if (state == ncclSuccess || state == ncclInProgress) return;
    const std::string reason = detail::str_cat(what, " on ", str(), ": NCCL reported ", result_text(state, comm));
    abort(reason);
    throw DistributedError(reason);
  }

  std::mutex mutex_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool available(std::string* why_not) {
  const Api& a = api();
  if (!a.error.empty()) {
    if (why_not) *why_not = a.error;
    return false;
  }
  return true;
}

std::string version() {
  const Api& a = api();
  if (!a.error.empty()) return {};
  return detail::str_cat(a.version / 10000, ".", (a.version / 100) % 100, ".", a.version % 100);
}

std::vector<std::shared_ptr<distributed::Communicator>> init_all(const std::vector<Device>& devices,
                                                                 const distributed::CommOptions& options) {
  const Api& a = checked_api();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  for (const Device& d : devices) {
    if (d.index < 0 || d.index >= count) {
      throw CudaError(
          detail::str_cat("Communicator.init_all: ", d.str(), " does not exist (", count, " CUDA device(s) here)"));
    }
  }
  ncclUniqueId id;
  const ncclResult_t r = a.GetUniqueId(&id);
  if (r != ncclSuccess) throw DistributedError("ncclGetUniqueId failed: " + result_text(r));
  std::vector<std::pair<int, Device>> ranks;
  for (std::size_t i = 0; i < devices.size(); ++i) ranks.emplace_back(static_cast<int>(i), devices[i]);
  return NcclCommunicator::create(ranks, static_cast<int>(devices.size()), id, options);
}

std::shared_ptr<distributed::Communicator> init_rank(int world_size, int rank, Device device, distributed::Store& store,
                                                     const distributed::CommOptions& options, const std::string& key) {
  const Api& a = checked_api();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (device.index < 0 || device.index >= count) {
    throw CudaError(
        detail::str_cat("Communicator.init_rank: ", device.str(), " does not exist (", count, " CUDA device(s) here)"));
  }
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = a.GetUniqueId(&id);
    if (r != ncclSuccess) throw DistributedError("ncclGetUniqueId failed: " + result_text(r));
    store.set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    const std::string bytes = store.get(key, options.creation_timeout());
    if (bytes.size() != sizeof(id)) {
      throw DistributedError(detail::str_cat("the store's value of '", key, "' has ", bytes.size(),
                                             " bytes, not an NCCL unique id (", sizeof(id), " bytes)"));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  return NcclCommunicator::create({{rank, device}}, world_size, id, options).front();
}

void group_start() {
  const ncclResult_t r = checked_api().GroupStart();
  if (r != ncclSuccess) throw DistributedError("ncclGroupStart failed: " + result_text(r));
  ++g_group_depth;
}

void group_end() {
  XPURT_CHECK(g_group_depth > 0, "group_end without a matching group_start");
  const ncclResult_t r = checked_api().GroupEnd();
  --g_group_depth;
  if (g_group_depth > 0) return;
  std::vector<std::shared_ptr<distributed::Communicator>> members;
  members.swap(g_group_members);
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string reason = "ncclGroupEnd failed: " + result_text(r);
    for (auto& m : members) m->abort(reason);
    throw DistributedError(reason);
  }
  for (auto& m : members) {
    static_cast<NcclCommunicator&>(*m).poll(std::chrono::steady_clock::now() + m->options().timeout,
                                            "a grouped collective");
  }
}

}  // namespace xpuruntime::nccl

namespace xpuruntime {

void register_nccl_communicators(distributed::DeviceCommunicators& table) {
  table.available = &nccl::available;
  table.version = &nccl::version;
  table.init_all = &nccl::init_all;
  table.init_rank = &nccl::init_rank;
  table.group_start = &nccl::group_start;
  table.group_end = &nccl::group_end;
}

void register_nccl(KernelRegistry& registry) {
  for (const std::string& op : distributed::collective_ops()) {
    registry.add_kernel(distributed::make_collective_kernel(
        op, "nccl", "nccl", DeviceType::kCUDA, "NCCL " + op + " on the launch's stream (capturable in CUDA graphs)"));
  }
  // Note [NCCL algorithm and protocol kernels] (core/distributed_ops.h).
  for (const auto& [name, tuning] : distributed::nccl_tuned_kernels()) {
    registry.add_kernel(distributed::make_collective_kernel(
        "all_reduce", "nccl", "nccl", DeviceType::kCUDA,
        detail::str_cat("NCCL all_reduce on a communicator created with NCCL_ALGO=", tuning.algo,
                        tuning.proto.empty() ? std::string() : " NCCL_PROTO=" + tuning.proto),
        name));
  }
}

}  // namespace xpuruntime
