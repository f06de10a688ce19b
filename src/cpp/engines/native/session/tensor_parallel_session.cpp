// Tensor-parallel sessions (see tensor_parallel_session.h).
#include "engines/native/session/tensor_parallel_session.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/distributed_ops.h"
#include "engines/native/session/native_session.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/distributed.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::runtime {
namespace {

// Note [Tensor-parallel sessions]
// ExecutionPolicy.tensor_parallel = N > 1: one NativeSession per rank, each on its device with plans built by the
// tensor_parallel pass for its rank (Note [Sharding by propagation] in passes/tensor_parallel.cpp), its
// all-reduces on its communicator of one set made by Communicator::init_all (NCCL on CUDA devices, the host
// backend on the CPU). A run feeds every rank the same inputs and runs them at once, rank 0 on the calling thread
// and the others on one worker thread each (NCCL's one-thread-per-GPU model; the host backend's ranks need their
// own threads too); each rank replays its own CUDA graph, NCCL kernels inside. The outputs are rank 0's (every
// graph output is replicated: the pass never leaves one sharded). A rank that fails aborts every communicator, so
// that the others' collectives return instead of waiting forever; the session is then unusable (its
// communicators are gone) and says so. A watchdog aborts them too when a run outlasts the communicators' timeout.
class TensorParallelSession final : public EngineSession {
 public:
  TensorParallelSession(const Graph& graph, const SessionOptions& options) : options_(options) {
    const int n = options.exec_policy.tensor_parallel;
    std::vector<Device> devices;
    if (options.device.is_cuda()) {
      const int count = DeviceManager::instance().get_device_count();
      if (options.device.index + n > count) {
        throw UnsupportedOperationError(detail::str_cat(
            "tensor_parallel=", n, " on ", options.device.str(), " needs CUDA devices ", options.device.index, "..",
            options.device.index + n - 1, "; this machine has ", count));
      }
      for (int r = 0; r < n; ++r) devices.push_back(Device::cuda(options.device.index + r));
    } else {
      devices.assign(static_cast<std::size_t>(n), Device::cpu());
    }
    distributed::CommOptions comm_options;
    if (const char* env = std::getenv("XPURT_COMM_TIMEOUT_S")) {
      comm_options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::atof(env) * 1000.0));
    }
    // Note [NCCL algorithm and protocol kernels]: a policy naming an NCCL tuning gets communicators made with it.
    if (options.device.is_cuda()) {
      for (const std::string& kernel : options.kernel_policy.resolve("all_reduce", "collective").kernels) {
        if (auto tuning = distributed::nccl_tuning_of(kernel)) {
          comm_options.nccl_algo = tuning->algo;
          comm_options.nccl_proto = tuning->proto;
          break;
        }
      }
    }
    comms_ = distributed::Communicator::init_all(devices, comm_options);
    for (int r = 0; r < n; ++r) {
      SessionOptions rank_options = options;
      rank_options.device = devices[static_cast<std::size_t>(r)];
      if (r > 0) rank_options.optimized_model_path.clear();
      ranks_.push_back(std::make_unique<NativeSession>(graph, rank_options,
                                                       TensorParallelRank{n, r, comms_[r]->handle()}));
    }
    for (int r = 1; r < n; ++r) workers_.push_back(std::make_unique<Worker>());
    watchdog_ = std::thread([this] { watch(); });
  }

  ~TensorParallelSession() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    workers_.clear();
    ranks_.clear();
  }

  const std::vector<ValueInfo>& inputs() const override { return ranks_[0]->inputs(); }
  const std::vector<ValueInfo>& outputs() const override { return ranks_[0]->outputs(); }

  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names) override {
    std::vector<Tensor> out;
    run_all([&](NativeSession& rank, bool first) {
      std::vector<Tensor> result = rank.run(feeds, output_names);
      if (first) out = std::move(result);
    });
    return out;
  }

  void run_into(const std::vector<std::pair<std::string, Tensor>>& feeds, const std::vector<std::string>& output_names,
                std::vector<Tensor>& outputs) override {
    run_all([&](NativeSession& rank, bool first) {
      if (first) {
        rank.run_into(feeds, output_names, outputs);
      } else {
        (void)rank.run(feeds, output_names);
      }
    });
  }

  std::vector<Value> run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                const std::vector<std::string>& output_names) override {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, value] : feeds) {
      XPURT_CHECK_TYPE(!value.defined() || value.is_tensor(), "input '", name, "': a tensor-parallel session takes "
                       "tensors, got ", value.str());
      tensors.emplace_back(name, value.is_tensor() ? value.tensor() : Tensor());
    }
    std::vector<Tensor> outputs = run(tensors, output_names);
    return {outputs.begin(), outputs.end()};
  }

  Explanation explain() const override {
    Explanation e = ranks_[0]->explain();
    std::string devices;
    for (const auto& c : comms_) devices += (devices.empty() ? "" : ", ") + c->device().str();
    const std::string backend = comms_[0]->backend() == "nccl"
                                    ? "NCCL " + distributed::nccl_version()
                                    : std::string("the host communicator (in-process CPU ranks)");
    std::vector<std::string> options = {
        detail::str_cat("tensor_parallel=", comms_.size(), " over ", devices, " (", backend,
                        "); one plan per rank, this explanation is rank 0's")};
    for (std::size_t r = 1; r < ranks_.size(); ++r) {
      Explanation other = ranks_[r]->explain();
      options.push_back(detail::str_cat("rank ", r, " on ", comms_[r]->device().str(), ": ", other.nodes.size(),
                                        " steps, ", other.memory));
    }
    e.options.insert(e.options.begin(), options.begin(), options.end());
    return e;
  }

 private:
  // A thread that runs one job at a time for one rank.
  class Worker {
   public:
    Worker() : thread_([this] { loop(); }) {}
    ~Worker() {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    void start(std::function<void()> job) {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = std::move(job);
      done_ = false;
      error_ = nullptr;
      cv_.notify_all();
    }
    std::exception_ptr wait() {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return done_; });
      return error_;
    }

   private:
    void loop() {
      std::unique_lock<std::mutex> lock(mutex_);
      while (true) {
        cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
        if (stop_) return;
        std::function<void()> job = std::move(job_);
        job_ = nullptr;
        lock.unlock();
        std::exception_ptr error;
        try {
          job();
        } catch (...) {
          error = std::current_exception();
        }
        lock.lock();
        error_ = error;
        done_ = true;
        cv_.notify_all();
      }
    }
    std::mutex mutex_;
    std::condition_variable cv_;
    std::function<void()> job_;
    bool done_ = true;
    bool stop_ = false;
    std::exception_ptr error_;
    std::thread thread_;
  };

  void abort_all(const std::string& reason) {
    for (const auto& c : comms_) c->abort(reason);
  }

  template <typename Fn>
  void run_all(Fn fn) {
    std::lock_guard<std::mutex> lock(run_mutex_);  // one run at a time: every rank's collectives in one order
    for (const auto& c : comms_) c->check_usable();
    {
      std::lock_guard<std::mutex> watch(watch_mutex_);
      run_started_ = std::chrono::steady_clock::now();
      running_ = true;
    }
    auto failed = [&](std::size_t r, const std::exception_ptr& error) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
      abort_all(detail::str_cat("rank ", r, " failed: ", what));
    };
    for (std::size_t r = 1; r < ranks_.size(); ++r) {
      NativeSession* session = ranks_[r].get();
      workers_[r - 1]->start([this, session, fn, r, failed]() mutable {
        try {
          fn(*session, false);
        } catch (...) {
          failed(r, std::current_exception());
          throw;
        }
      });
    }
    std::exception_ptr first_error;
    try {
      fn(*ranks_[0], true);
    } catch (...) {
      first_error = std::current_exception();
      failed(0, first_error);
    }
    for (auto& w : workers_) {
      std::exception_ptr error = w->wait();
      if (error && !first_error) first_error = error;
    }
    {
      std::lock_guard<std::mutex> watch(watch_mutex_);
      running_ = false;
    }
    if (first_error) std::rethrow_exception(first_error);
  }

  // Aborts the communicators when a run outlasts their timeout (Note [Tensor-parallel sessions]).
  void watch() {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    const auto timeout = comms_[0]->options().timeout;
    while (!stopping_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (running_ && std::chrono::steady_clock::now() - run_started_ > timeout) {
        running_ = false;
        lock.unlock();
        abort_all(detail::str_cat("timeout: a tensor-parallel run took longer than ",
                                  static_cast<double>(timeout.count()) / 1000.0, " s"));
        lock.lock();
      }
    }
  }

  SessionOptions options_;
  std::vector<std::shared_ptr<distributed::Communicator>> comms_;
  std::vector<std::unique_ptr<NativeSession>> ranks_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex run_mutex_;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  bool running_ = false;
  std::chrono::steady_clock::time_point run_started_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<EngineSession> make_tensor_parallel_session(const Graph& graph, const SessionOptions& options) {
  return std::make_unique<TensorParallelSession>(graph, options);
}

}  // namespace xpuruntime::runtime
