// Communicators: the handle table, the FileStore, the in-process "host" backend, and the dispatch to the NCCL
// backend (backends/nccl) through the device communicator table (core/device_communicators.h). See
// xpuruntime/distributed.h.
#include "xpuruntime/distributed.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/device_communicators.h"
#include "core/half.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::distributed {

namespace {

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<std::int64_t, std::weak_ptr<Communicator>>& table() {
  static auto* t = new std::unordered_map<std::int64_t, std::weak_ptr<Communicator>>();
  return *t;
}

std::int64_t next_handle() {
  static std::atomic<std::int64_t> next{1};
  return next++;
}

std::string timeout_text(std::chrono::milliseconds timeout) {
  return detail::str_cat(static_cast<double>(timeout.count()) / 1000.0, " s");
}

}  // namespace

ReduceOp reduce_op_from_name(const std::string& name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "prod") return ReduceOp::kProd;
  if (name == "max") return ReduceOp::kMax;
  if (name == "min") return ReduceOp::kMin;
  if (name == "avg") return ReduceOp::kAvg;
  throw InvalidArgumentError(
      detail::str_cat("unknown reduction '", name, "'; valid reductions: sum, prod, max, min, avg"));
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

// ---- FileStore ----

FileStore::FileStore(std::string folder) : folder_(std::move(folder)) {
  std::error_code ec;
  std::filesystem::create_directories(folder_, ec);
  XPURT_CHECK(std::filesystem::is_directory(folder_), "FileStore: cannot create or use the folder '", folder_, "'",
              ec ? ": " + ec.message() : std::string());
}

std::string FileStore::path_of(const std::string& key) const {
  XPURT_CHECK(!key.empty() && key.find('/') == std::string::npos && key != "." && key != "..",
              "FileStore: a key is a non-empty file name without '/', got '", key, "'");
  return folder_ + "/" + key;
}

void FileStore::set(const std::string& key, const std::string& value) {
  const std::string path = path_of(key);
  const std::string temporary =
      detail::str_cat(path, ".tmp.", std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(value.data(), static_cast<std::streamsize>(value.size()));
    XPURT_CHECK(file.good(), "FileStore: cannot write '", temporary, "'");
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);  // atomic: a reader sees the whole value or nothing
  XPURT_CHECK(!ec, "FileStore: cannot rename '", temporary, "' to '", path, "': ", ec.message());
}

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = path_of(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    std::ifstream file(path, std::ios::binary);
    if (file.good()) {
      std::ostringstream text;
      text << file.rdbuf();
      return text.str();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw DistributedError(
          detail::str_cat("timeout: FileStore key '", key, "' did not appear in '", folder_, "' within ",
                          timeout_text(timeout), " (has every rank started, with the same folder?)"),
          /*timed_out=*/true);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

// ---- Communicator ----

struct Communicator::State {
  mutable std::mutex mutex;
  std::atomic<bool> aborted{false};
  std::string reason;
};

Communicator::Communicator(std::string backend, int rank, int size, Device device, CommOptions options)
    : state_(std::make_shared<State>()),
      backend_(std::move(backend)),
      rank_(rank),
      size_(size),
      device_(device),
      options_(std::move(options)) {}

Communicator::~Communicator() {
  std::lock_guard<std::mutex> lock(table_mutex());
  table().erase(handle_);
}

void Communicator::register_handle(const std::shared_ptr<Communicator>& self) {
  self->handle_ = next_handle();
  std::lock_guard<std::mutex> lock(table_mutex());
  table()[self->handle_] = self;
}

std::shared_ptr<Communicator> Communicator::find(std::int64_t handle) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(handle);
  std::shared_ptr<Communicator> comm = it == table().end() ? nullptr : it->second.lock();
  if (!comm) {
    throw DistributedError(detail::str_cat("no communicator has handle ", handle,
                                           " (it was destroyed, or never created in this process)"));
  }
  return comm;
}

std::string Communicator::str() const {
  return detail::str_cat("Communicator(", backend_, ", rank ", rank_, " of ", size_, ", ", device_.str(), ", handle ",
                         handle_, aborted() ? ", aborted" : "", ")");
}

bool Communicator::aborted() const { return state_->aborted.load(); }

std::string Communicator::abort_reason() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->reason;
}

void Communicator::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->aborted.load()) return;
  state_->reason = reason;
  state_->aborted.store(true);
}

void Communicator::check_usable() const {
  if (aborted()) {
    throw DistributedError(
        detail::str_cat(str(), " was aborted (", abort_reason(), "); create new communicators to go on"));
  }
}

void Communicator::wait(const StreamView& stream) {
  check_usable();
  stream.synchronize();
}

// ---- the host backend ----

namespace {

// Element-wise reduction of `count` elements of `dtype` from `a` into `acc`.
template <typename T>
void reduce_into(T* acc, const T* a, std::int64_t count, ReduceOp op) {
  for (std::int64_t i = 0; i < count; ++i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc[i] = static_cast<T>(acc[i] + a[i]);
        break;
      case ReduceOp::kProd:
        acc[i] = static_cast<T>(acc[i] * a[i]);
        break;
      case ReduceOp::kMax:
        acc[i] = std::max(acc[i], a[i]);
        break;
      case ReduceOp::kMin:
        acc[i] = std::min(acc[i], a[i]);
        break;
    }
  }
}

// The reduction over ranks of element range [begin, end) of each rank's input, into `out` (same range).
void reduce_ranks(const std::vector<const void*>& inputs, void* out, DType dtype, std::int64_t begin, std::int64_t end,
                  ReduceOp op) {
  const std::int64_t count = end - begin;
  const auto ranks = static_cast<double>(inputs.size());
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> acc(static_cast<std::size_t>(count));
    std::memcpy(acc.data(), static_cast<const T*>(inputs[0]) + begin, static_cast<std::size_t>(count) * sizeof(T));
    for (std::size_t r = 1; r < inputs.size(); ++r)
      reduce_into(acc.data(), static_cast<const T*>(inputs[r]) + begin, count, op);
    if (op == ReduceOp::kAvg) {
      for (T& v : acc) v = static_cast<T>(static_cast<double>(v) / ranks);
    }
    std::memcpy(static_cast<T*>(out) + begin, acc.data(), static_cast<std::size_t>(count) * sizeof(T));
  };
  auto sixteen_bit = [&](float (*to_float)(std::uint16_t), std::uint16_t (*from_float)(float)) {
    std::vector<float> acc(static_cast<std::size_t>(count));
    for (std::size_t r = 0; r < inputs.size(); ++r) {
      const auto* in = static_cast<const std::uint16_t*>(inputs[r]) + begin;
      std::vector<float> values(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i) values[i] = to_float(in[i]);
      if (r == 0)
        acc = values;
      else
        reduce_into(acc.data(), values.data(), count, op);
    }
    auto* o = static_cast<std::uint16_t*>(out) + begin;
    for (std::int64_t i = 0; i < count; ++i) {
      o[i] = from_float(op == ReduceOp::kAvg ? acc[i] / static_cast<float>(ranks) : acc[i]);
    }
  };
  switch (dtype) {
    case DType::kFloat32:
      typed(float{});
      break;
    case DType::kFloat64:
      typed(double{});
      break;
    case DType::kInt32:
      typed(std::int32_t{});
      break;
    case DType::kInt64:
      typed(std::int64_t{});
      break;
    case DType::kInt8:
      typed(std::int8_t{});
      break;
    case DType::kUInt8:
      typed(std::uint8_t{});
      break;
    case DType::kFloat16:
      sixteen_bit(detail::half_to_float, detail::float_to_half);
      break;
    case DType::kBFloat16:
      sixteen_bit(detail::bfloat16_to_float, detail::float_to_bfloat16);
      break;
    default:
      throw InvalidTypeError(
          detail::str_cat("collectives reduce float32, float64, float16, bfloat16, int8, uint8, "
                          "int32 and int64 tensors, got ",
                          dtype_name(dtype)));
  }
}

// What the ranks of one host group share: a generation barrier with a slot per rank, and mailboxes for send/recv.
struct HostGroup {
  explicit HostGroup(int n) : size(n), inputs(n), outputs(n) {}
  std::mutex mutex;
  std::condition_variable changed;
  int size;
  int arrived = 0;
  std::uint64_t generation = 0;
  bool aborted = false;
  std::string reason;
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  std::map<std::pair<int, int>, std::deque<std::string>> mailboxes;  // (from, to) -> messages
  std::vector<std::weak_ptr<Communicator>> members;
};

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(std::shared_ptr<HostGroup> group, int rank, const CommOptions& options)
      : Communicator("host", rank, group->size, Device::cpu(), options), group_(std::move(group)) {}

  static std::vector<std::shared_ptr<Communicator>> create(int n, const CommOptions& options) {
    auto group = std::make_shared<HostGroup>(n);
    std::vector<std::shared_ptr<Communicator>> comms;
    for (int r = 0; r < n; ++r) {
      auto comm = std::make_shared<HostCommunicator>(group, r, options);
      comm->register_handle(comm);
      group->members.push_back(comm);
      comms.push_back(std::move(comm));
    }
    return comms;
  }

  void all_reduce(const Tensor& x, Tensor& y, ReduceOp op, const StreamView&) override {
    exchange(
        x.data_ptr(), y.data_ptr(),
        [&](const std::vector<const void*>& in, const std::vector<void*>&) {
          // Each rank reduces its share of the elements into every rank's output.
          const std::int64_t n = x.numel();
          const std::int64_t chunk = (n + size() - 1) / size();
          const std::int64_t begin = std::min(n, chunk * rank());
          const std::int64_t end = std::min(n, begin + chunk);
          if (begin >= end) return;
          reduce_ranks(in, y.data_ptr(), x.dtype(), begin, end, op);
        },
        [&](const std::vector<const void*>&, const std::vector<void*>& out) {
          // Then every rank copies the other ranks' shares from their outputs.
          const std::int64_t n = x.numel();
          const std::int64_t chunk = (n + size() - 1) / size();
          const std::size_t element = dtype_size(x.dtype());
          for (int r = 0; r < size(); ++r) {
            if (r == rank()) continue;
            const std::int64_t begin = std::min(n, chunk * r);
            const std::int64_t end = std::min(n, begin + chunk);
            if (begin >= end) continue;
            std::memcpy(static_cast<char*>(y.data_ptr()) + begin * element,
                        static_cast<const char*>(out[r]) + begin * element,
                        static_cast<std::size_t>(end - begin) * element);
          }
        });
  }

  void all_gather(const Tensor& x, Tensor& y, const StreamView&) override {
    exchange(x.data_ptr(), y.data_ptr(), [&](const std::vector<const void*>& in, const std::vector<void*>&) {
      for (int r = 0; r < size(); ++r) {
        std::memcpy(static_cast<char*>(y.data_ptr()) + static_cast<std::size_t>(r) * x.nbytes(), in[r], x.nbytes());
      }
    });
  }

  void reduce_scatter(const Tensor& x, Tensor& y, ReduceOp op, const StreamView&) override {
    exchange(x.data_ptr(), y.data_ptr(), [&](const std::vector<const void*>& in, const std::vector<void*>&) {
      const std::int64_t count = y.numel();
      std::vector<const void*> shifted;
      const std::size_t offset = static_cast<std::size_t>(count * rank()) * dtype_size(x.dtype());
      for (const void* p : in) shifted.push_back(static_cast<const char*>(p) + offset);
      std::vector<char> scratch(y.nbytes());
      reduce_ranks(shifted, scratch.data(), x.dtype(), 0, count, op);
      std::memcpy(y.data_ptr(), scratch.data(), y.nbytes());
    });
  }

  void broadcast(const Tensor& x, Tensor& y, int root, const StreamView&) override {
    exchange(x.data_ptr(), y.data_ptr(), [&](const std::vector<const void*>& in, const std::vector<void*>&) {
      if (y.data_ptr() != in[root]) std::memmove(y.data_ptr(), in[root], y.nbytes());
    });
  }

  void send(const Tensor& x, int peer, const StreamView&) override {
    check_usable();
    std::string message(static_cast<const char*>(x.data_ptr()), x.nbytes());
    std::lock_guard<std::mutex> lock(group_->mutex);
    group_->mailboxes[{rank(), peer}].push_back(std::move(message));
    group_->changed.notify_all();
  }

  void recv(Tensor& y, int peer, const StreamView&) override {
    check_usable();
    std::unique_lock<std::mutex> lock(group_->mutex);
    auto& box = group_->mailboxes[{peer, rank()}];
    wait_locked(
        lock, [&] { return !box.empty(); }, detail::str_cat("recv from rank ", peer));
    const std::string message = std::move(box.front());
    box.pop_front();
    XPURT_CHECK(message.size() == y.nbytes(), "recv: rank ", peer, " sent ", message.size(),
                " bytes, this rank "
                "expects ",
                y.nbytes());
    std::memcpy(y.data_ptr(), message.data(), message.size());
  }

  void abort(const std::string& reason) override {
    // One rank's failure would leave the others waiting: the whole group is aborted.
    std::vector<std::shared_ptr<Communicator>> members;
    {
      std::lock_guard<std::mutex> lock(group_->mutex);
      if (!group_->aborted) {
        group_->aborted = true;
        group_->reason = reason;
      }
      for (auto& weak : group_->members) {
        if (auto m = weak.lock()) members.push_back(std::move(m));
      }
      group_->changed.notify_all();
    }
    for (auto& m : members) m->Communicator::abort(reason);
    Communicator::abort(reason);
  }

 private:
  // Waits (holding `lock`) until `ready()`, the group is aborted, or the timeout; aborts the group on timeout.
  template <typename Ready>
  void wait_locked(std::unique_lock<std::mutex>& lock, Ready ready, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + options().timeout;
    while (!ready()) {
      if (group_->aborted) {
        throw DistributedError(
            detail::str_cat(str(), ": ", what, " failed: the group was aborted (", group_->reason, ")"));
      }
      if (group_->changed.wait_until(lock, deadline) == std::cv_status::timeout && !ready() && !group_->aborted) {
        const std::string reason =
            detail::str_cat("timeout: rank ", rank(), " waited ", timeout_text(options().timeout), " in ", what,
                            " for the other ranks");
        lock.unlock();
        abort(reason);
        throw DistributedError(reason, /*timed_out=*/true);
      }
    }
  }

  // Every rank publishes its input and output, waits for all, runs `phase` for each function given (with a barrier
  // after each, so that no rank leaves while another still reads its memory).
  template <typename... Phases>
  void exchange(const void* in, void* out, Phases&&... phases) {
    check_usable();
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
    {
      std::unique_lock<std::mutex> lock(group_->mutex);
      group_->inputs[rank()] = in;
      group_->outputs[rank()] = out;
      barrier(lock, "a collective");
      inputs = group_->inputs;
      outputs = group_->outputs;
    }
    auto run_phase = [&](auto& phase) {
      phase(inputs, outputs);
      std::unique_lock<std::mutex> lock(group_->mutex);
      barrier(lock, "a collective");
    };
    (run_phase(phases), ...);
  }

  void barrier(std::unique_lock<std::mutex>& lock, const char* what) {
    const std::uint64_t generation = group_->generation;
    if (++group_->arrived == group_->size) {
      group_->arrived = 0;
      ++group_->generation;
      group_->changed.notify_all();
      return;
    }
    wait_locked(
        lock, [&] { return group_->generation != generation; }, what);
  }

  std::shared_ptr<HostGroup> group_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> Communicator::init_all(const std::vector<Device>& devices,
                                                                  const CommOptions& options) {
  XPURT_CHECK(!devices.empty(), "Communicator.init_all needs at least one device");
  XPURT_CHECK(options.timeout.count() > 0, "a communicator's timeout must be positive, got ", options.timeout.count(),
              " ms");
  const bool cpu = devices.front().is_cpu();
  for (const Device& d : devices) {
    XPURT_CHECK(d.is_cpu() == cpu && (d.is_cpu() || d.is_cuda()),
                "Communicator.init_all takes CUDA devices (NCCL) or CPU ranks (the host backend), not a mix; got ",
                d.str(), " beside ", devices.front().str());
  }
  if (cpu) return HostCommunicator::create(static_cast<int>(devices.size()), options);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      XPURT_CHECK(devices[i] != devices[j], "Communicator.init_all: ", devices[i].str(),
                  " is listed twice (NCCL takes one rank per GPU in a process)");
    }
  }
  // Note [Device communicator table] (core/device_communicators.h): the nccl backend's, null without it.
  const auto init_all = device_communicators().init_all;
  if (init_all == nullptr) {
    throw UnsupportedOperationError(
        "NCCL communicators need a CUDA build of xpuruntime (cmake -DXPURT_WITH_CUDA=ON) "
        "with NCCL's header (nccl.h) found at build time");
  }
  return init_all(devices, options);
}

std::shared_ptr<Communicator> Communicator::init_rank(int world_size, int rank, Device device, Store& store,
                                                      const CommOptions& options, const std::string& key) {
  XPURT_CHECK(world_size >= 1, "Communicator.init_rank: world_size must be at least 1, got ", world_size);
  XPURT_CHECK(rank >= 0 && rank < world_size, "Communicator.init_rank: rank must be in [0, ", world_size, "), got ",
              rank);
  XPURT_CHECK(options.timeout.count() > 0, "a communicator's timeout must be positive");
  if (!device.is_cuda()) {
    throw UnsupportedOperationError(detail::str_cat(
        "Communicator.init_rank connects processes through NCCL on CUDA devices, got ", device.str(),
        "; the host backend connects the ranks of one process (Communicator.init_all with CPU devices)"));
  }
  const auto init_rank = device_communicators().init_rank;
  if (init_rank == nullptr) {
    throw UnsupportedOperationError(
        "NCCL communicators need a CUDA build of xpuruntime (cmake -DXPURT_WITH_CUDA=ON) "
        "with NCCL's header (nccl.h) found at build time");
  }
  return init_rank(world_size, rank, device, store, options, key);
}

GroupGuard::GroupGuard() { group_start(); }
GroupGuard::~GroupGuard() noexcept(false) {
  if (std::uncaught_exceptions() > 0) {
    try {
      group_end();
    } catch (...) {
      // the exception in flight is the one to report
    }
    return;
  }
  group_end();
}

void group_start() {
  const DeviceCommunicators& nccl = device_communicators();
  std::string why;
  if (nccl.available != nullptr && nccl.available(&why)) nccl.group_start();
}

void group_end() {
  const DeviceCommunicators& nccl = device_communicators();
  std::string why;
  if (nccl.available != nullptr && nccl.available(&why)) nccl.group_end();
}

bool nccl_available(std::string* why_not) {
  const DeviceCommunicators& nccl = device_communicators();
  if (nccl.available != nullptr) return nccl.available(why_not);
  if (why_not) *why_not = "this xpuruntime was built without NCCL (a CUDA build with nccl.h found at build time)";
  return false;
}

std::string nccl_version() {
  const DeviceCommunicators& nccl = device_communicators();
  return nccl.version != nullptr ? nccl.version() : std::string();
}

}  // namespace xpuruntime::distributed
