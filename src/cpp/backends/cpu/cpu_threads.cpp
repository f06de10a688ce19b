// The worker threads of the cpu backend (cpu_threads.h).
//
// Note [CPU worker threads]
// The parallel loops of the cpu kernels ran on OpenMP and the GEMMs on OpenBLAS's own pthreads. On a busy machine
// (2 cores, 4-8 other busy processes) a tiny ResNet took 40-150 ms per run instead of 0.4-1 ms, a single MaxPool
// 16 ms (docs/benchmarks.md, "The CPU engine under load"), for three reasons:
//  * static scheduling: `omp parallel for schedule(static)` gives each thread one fixed share and ends in a barrier,
//    so when the OS has not scheduled one worker (its core runs another process for a time slice, 3-12 ms), the
//    whole op waits for it, however small the op;
//  * spinning: libgomp's idle workers spin up to GOMP_SPINCOUNT (300,000 iterations) and OpenBLAS's up to 2^28
//    cycles with sched_yield after every call, taking the CPU time the thread doing the work needs;
//  * two pools: OpenMP's and OpenBLAS's threads (each as many as online CPUs, not as many as the process may use)
//    competed for the same cores.
// This pool works the way ONNX Runtime's does (onnxruntime/core/platform/EigenNonBlockingThreadPool.h: the caller
// runs part of the loop, workers claim iteration blocks with an atomic counter, spin then block):
//  * A loop is cut into more chunks than threads (parallel_for: up to kChunksPerThread per thread, each of at least
//    the kernel's grain) and every participant, the caller included, claims the next chunk from one atomic counter.
//    A worker that is not running when the loop starts claims nothing and so delays nothing: the caller and the
//    workers that do run take its share. The caller waits only for chunks already claimed, and it waits parked
//    (a futex), leaving its core to the worker it waits for.
//  * Idle workers park on a condition variable. With ExecutionPolicy::allow_spinning (the default, like ONNX
//    Runtime's session.intra_op.allow_spinning) a worker first spins for kSpin after its last loop, so the next op's
//    loop, microseconds later, finds it awake; the spin is bounded in time, not in iterations, and is never repeated
//    until the worker has run another loop. Without it workers park at once and each loop wakes them.
//  * A worker the OS preempts in the middle of a chunk still holds up its loop: the caller must wait for that chunk,
//    for as long as the worker is off its core (a time slice of each runnable thread before it: 3-30 ms on a
//    loaded machine, for a loop of microseconds). When a caller has waited far longer than its own chunks took, the
//    machine has more runnable threads than cores and dividing an op among threads only adds such waits: every loop
//    of the process then runs on its caller alone for a back-off period (Note [Stalled loops] below: 50 ms doubled
//    on each stall up to 2 s), after which loops are shared again, and stay shared while the workers keep up.
//  * A caller that itself waits for a core (Note [Loops on a busy machine] below) runs its loops alone: the stall
//    back-off above reacts only after a loop has waited a time slice, which at 4 other busy processes on 2 cores was
//    the p99 of the default pool (6.5x and 18.8x its p50, docs/benchmarks.md, 2026-12-06).
//  * One pool per process, as many workers as usable_cpus() - 1 (the caller is the last thread): the affinity mask
//    and the cgroup quota, not the online CPUs (a container given 2 of 64 cores gets 2 threads). A policy asking
//    for more threads than that gets them (the pool grows to the largest request).
//  * OpenBLAS runs on one thread (cpu_gemm.cpp sets it once) and large GEMMs are cut into blocks that run on this
//    pool (Note [Parallel GEMM blocks] in cpu_gemm.cpp), so no second pool competes for the cores.
//  * Loops too small to pay for waking a thread run on the caller alone: parallel_for uses one thread when the loop
//    has a single chunk of the kernel's grain (each kernel sizes its grain to ~16K elementary operations), and a loop
//    started inside a chunk (nested) runs serially.
// Determinism is unchanged: chunks cover independent outputs (Note [The cpu backend as the oracle]), so which thread
// runs a chunk, and how many threads there are, does not change a bit of the result.
#include "backends/cpu/cpu_threads.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "xpuruntime/memory_manager.h"
#include "xpuruntime/run_options.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace xpuruntime::cpu {

namespace {

// How long a worker spins for the next loop after finishing one, and how long a caller spins for the chunks workers
// are still running before it parks (Note [CPU worker threads]).
constexpr std::chrono::microseconds kSpin{50};

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until `done()` or kSpin has passed; returns done().
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (done()) return true;
    spin_pause();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return done();
  }
}

// ---- usable CPUs ----

// ceil(quota / period) from a cgroup's files, or INT_MAX when unlimited or unreadable.
int quota_cpus(double quota, double period) {
  if (quota <= 0 || period <= 0) return INT_MAX;
  return std::max(1, static_cast<int>((quota + period - 1) / period));
}

// cgroup v2: "max 100000" or "200000 100000" in cpu.max of the process's group and each group above it.
int cgroup_v2_cpus(const std::string& group) {
  int cpus = INT_MAX;
  std::string path = group;
  for (;;) {
    std::ifstream file("/sys/fs/cgroup" + path + (path == "/" ? "" : "/") + "cpu.max");
    std::string quota;
    double period = 0;
    if (file >> quota >> period && quota != "max") cpus = std::min(cpus, quota_cpus(std::atof(quota.c_str()), period));
    if (path == "/" || path.empty()) break;
    const auto slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return cpus;
}

// cgroup v1: cpu.cfs_quota_us (-1: unlimited) / cpu.cfs_period_us under the cpu controller's mount.
int cgroup_v1_cpus(const std::string& group) {
  int cpus = INT_MAX;
  for (const char* mount : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    for (const std::string& dir : {std::string(mount) + group, std::string(mount)}) {
      std::ifstream quota_file(dir + "/cpu.cfs_quota_us");
      std::ifstream period_file(dir + "/cpu.cfs_period_us");
      double quota = 0, period = 0;
      if (quota_file >> quota && period_file >> period) cpus = std::min(cpus, quota_cpus(quota, period));
    }
  }
  return cpus;
}

// The CPU limit of this process's cgroups (/proc/self/cgroup: "0::/path" for v2, "N:cpu,cpuacct:/path" for v1).
int cgroup_cpus() {
  std::ifstream file("/proc/self/cgroup");
  std::string line;
  int cpus = INT_MAX;
  while (std::getline(file, line)) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? std::string::npos : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string group = line.substr(second + 1);
    if (controllers.empty()) {
      cpus = std::min(cpus, cgroup_v2_cpus(group));
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {
      cpus = std::min(cpus, cgroup_v1_cpus(group));
    }
  }
  return cpus;
}

int affinity_cpus() {
  for (int size = 1024; size <= (1 << 16); size *= 2) {
    cpu_set_t* set = CPU_ALLOC(size);
    if (set == nullptr) break;
    const std::size_t bytes = CPU_ALLOC_SIZE(size);
    CPU_ZERO_S(bytes, set);
    const int got = sched_getaffinity(0, bytes, set);
    const int count = got == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (got == 0) return std::max(count, 1);
    if (errno != EINVAL) break;  // EINVAL: the kernel's mask is larger than `size` CPUs
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

// ---- the pool ----

// One parallel loop. Shared between its caller and the workers that join it; a worker may still touch the counters
// after the caller has returned (it then finds no chunk left), so the loop lives on the heap.
struct Loop {
  Loop(std::int64_t chunks, int max_helpers, bool spin, ChunkBody body)
      : chunks(chunks), max_helpers(max_helpers), spin(spin), body(body) {}
  const std::int64_t chunks;
  const int max_helpers;  // workers that may join (threads - 1)
  const bool spin;
  const ChunkBody body;   // valid while the caller is in run_chunks, i.e. while a chunk is unfinished
  std::shared_ptr<MemoryBudget> budget = MemoryBudgetScope::current();
  const RunStop* stop = RunStop::current();
  std::atomic<std::int64_t> next{0};      // the next chunk to claim
  std::atomic<std::int64_t> finished{0};  // chunks done
  std::atomic<int> joined{0};             // workers that asked to join
  std::atomic<int> done{0};               // 1 once finished == chunks: the futex word the caller parks on
  std::mutex error_mutex;
  std::exception_ptr error;  // the first exception a chunk threw
};

thread_local bool t_in_loop = false;
thread_local bool t_spin = true;

// Note [Stalled loops]: a caller that waited for a worker's chunk more than kStallFloor and more than kStallFactor
// times its own chunks' mean time makes every loop of the process serial for a back-off period (kFirstBackOff,
// doubled on each stall up to kMaxBackOff, halved by each loop that finishes without one).
constexpr std::chrono::nanoseconds kStallFloor = std::chrono::milliseconds(1);
constexpr std::int64_t kStallFactor = 8;
constexpr std::chrono::nanoseconds kFirstBackOff = std::chrono::milliseconds(50);
constexpr std::chrono::nanoseconds kMaxBackOff = std::chrono::seconds(2);

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Contention {
 public:
  bool serial(std::int64_t now) const { return now < serial_until_.load(std::memory_order_relaxed); }
  // A loop's caller finished its own `chunks` chunks in `own` ns and then waited `waited` ns for the workers'.
  void record(std::int64_t own, std::int64_t chunks, std::int64_t waited, std::int64_t now) {
    const std::int64_t mean = chunks > 0 ? own / chunks : 0;
    const std::int64_t back_off = back_off_.load(std::memory_order_relaxed);
    if (chunks > 0 && waited > kStallFloor.count() && waited > kStallFactor * mean) {
      serial_until_.store(now + back_off, std::memory_order_relaxed);
      back_off_.store(std::min<std::int64_t>(2 * back_off, kMaxBackOff.count()), std::memory_order_relaxed);
    } else if (back_off > kFirstBackOff.count()) {
      back_off_.store(std::max<std::int64_t>(back_off / 2, kFirstBackOff.count()), std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<std::int64_t> serial_until_{0};
  std::atomic<std::int64_t> back_off_{kFirstBackOff.count()};
};

Contention& contention() {
  static Contention* c = new Contention();  // never destroyed: loops may run during static destruction
  return *c;
}

// Note [Loops on a busy machine]
// Where every core already has another runnable thread, a loop's helpers only add waits: a worker scheduled late, or
// preempted inside its chunk, holds the loop for a time slice. The kernel says how crowded the machine is from this
// thread's own point of view, in its container too (where /proc/loadavg counts the whole host): the run delay of
// /proc/thread-self/schedstat, the time the thread was runnable but waited for a core. A caller reads it at most
// every kLoadWindow; once the window holds kMinRunnable of runnable time (running or waiting; sleeping between calls
// is neither), it runs its loops alone while more than kBusyShare of that time was spent waiting, and shares them
// again once a window is under it. Without schedstat (a kernel built without it) loops are shared as before. Only
// the caller's view counts: each calling thread decides for itself, with no shared state.
constexpr std::int64_t kLoadWindow = 10'000'000;  // ns
constexpr std::int64_t kMinRunnable = 1'000'000;  // ns
constexpr double kBusyShare = 1.0 / 3.0;

// This thread's time on a core and waiting on a run queue (ns), from /proc/thread-self/schedstat.
bool read_schedstat(std::int64_t* exec, std::int64_t* waited) {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[128];
  const ssize_t got = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  char* end = nullptr;
  const long long run = std::strtoll(text, &end, 10);
  if (end == text) return false;
  char* rest = end;
  const long long delay = std::strtoll(rest, &end, 10);
  if (end == rest) return false;
  *exec = run;
  *waited = delay;
  return true;
}

struct RunQueueWindow {
  std::int64_t at = 0;     // when the window was last looked at
  std::int64_t exec = -1;  // its start (-1: none yet)
  std::int64_t waited = 0;
  bool busy = false;
};
thread_local RunQueueWindow t_window;

bool caller_waits_for_cores(std::int64_t now) {
  RunQueueWindow& w = t_window;
  if (w.exec >= 0 && now - w.at < kLoadWindow) return w.busy;
  w.at = now;
  std::int64_t exec = 0, waited = 0;
  if (!read_schedstat(&exec, &waited)) return w.busy = false;
  if (w.exec < 0 || exec < w.exec || waited < w.waited) {  // the first look, or counters that went back
    w.exec = exec;
    w.waited = waited;
    return w.busy;
  }
  const std::int64_t ran = exec - w.exec, delayed = waited - w.waited;
  if (ran + delayed < kMinRunnable) return w.busy;  // too little runnable time yet: the window grows
  w.busy = waits_for_cores(delayed, ran + delayed);
  w.exec = exec;
  w.waited = waited;
  return w.busy;
}

// Runs chunks of `loop` until none is left to claim; returns how many it ran.
std::int64_t work(Loop& loop) {
  for (std::int64_t ran = 0;; ++ran) {
    const std::int64_t chunk = loop.next.fetch_add(1, std::memory_order_relaxed);
    if (chunk >= loop.chunks) return ran;
    try {
      loop.body.call(loop.body.context, chunk);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(loop.error_mutex);
      if (!loop.error) loop.error = std::current_exception();
    }
    if (loop.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == loop.chunks) {
      loop.done.store(1, std::memory_order_release);
      loop.done.notify_one();
    }
  }
}

class Pool {
 public:
  // The process's pool: created on first use, replaced (the old one leaked, its threads gone) in a fork's child.
  static Pool& instance() {
    static const bool registered = [] {
      pthread_atfork(nullptr, nullptr, [] { current_pool().store(nullptr); });
      return true;
    }();
    (void)registered;
    Pool* pool = current_pool().load(std::memory_order_acquire);
    if (pool != nullptr) return *pool;
    static std::mutex creation;
    const std::lock_guard<std::mutex> lock(creation);
    pool = current_pool().load(std::memory_order_acquire);
    if (pool == nullptr) {
      pool = new Pool();  // never destroyed: workers stay parked until the process exits
      current_pool().store(pool, std::memory_order_release);
    }
    return *pool;
  }

  // Makes `loop` the one idle workers join, with enough workers for `helpers` of them, and wakes that many.
  void publish(const std::shared_ptr<Loop>& loop, int helpers) {
    int wake = 0;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      grow(helpers);
      current_ = loop;
      ++epoch_;
      published_.store(epoch_, std::memory_order_release);
      wake = std::min(helpers, parked_);
    }
    for (int i = 0; i < wake; ++i) wake_.notify_one();
  }

 private:
  static std::atomic<Pool*>& current_pool() {
    static std::atomic<Pool*> pool{nullptr};
    return pool;
  }

  // Starts workers until there are `count` (under mutex_). A thread that cannot be created leaves the pool smaller:
  // the loops still complete, on fewer threads.
  void grow(int count) {
    while (workers_ < count) {
      try {
        std::thread(&Pool::worker_main, this, epoch_).detach();
      } catch (const std::system_error&) {
        return;
      }
      ++workers_;
    }
  }

  void worker_main(std::uint64_t seen) {
    t_in_loop = true;  // a loop a chunk starts runs on this worker alone
    bool spin = false;
    for (;;) {
      if (spin) spin_until([&] { return published_.load(std::memory_order_acquire) != seen; });
      std::shared_ptr<Loop> loop;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        while (epoch_ == seen) {
          ++parked_;
          wake_.wait(lock);
          --parked_;
        }
        seen = epoch_;
        loop = current_;
      }
      spin = false;
      if (loop && loop->joined.fetch_add(1, std::memory_order_relaxed) < loop->max_helpers) {
        const MemoryBudgetScope budget(loop->budget);
        const RunStopScope stop(loop->stop);
        work(*loop);
        spin = loop->spin;
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::shared_ptr<Loop> current_;  // the last loop published (finished or not)
  std::uint64_t epoch_ = 0;        // loops published so far
  std::atomic<std::uint64_t> published_{0};  // epoch_, read by spinning workers without the lock
  int workers_ = 0;
  int parked_ = 0;  // workers waiting on wake_
};

}  // namespace

bool waits_for_cores(std::int64_t waited_ns, std::int64_t runnable_ns) {
  return runnable_ns > 0 && static_cast<double>(waited_ns) > kBusyShare * static_cast<double>(runnable_ns);
}

bool caller_runs_loops_alone() { return caller_waits_for_cores(now_ns()); }

int usable_cpus() {
  static const int cpus = std::max(1, std::min(affinity_cpus(), cgroup_cpus()));
  return cpus;
}

int default_threads() {
  static const int threads = [] {
    int count = usable_cpus();
    if (const char* env = std::getenv("OMP_NUM_THREADS")) {
      char* end = nullptr;
      const long value = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && value > 0) count = std::min<long>(count, value);
    }
    return count;
  }();
  return threads;
}

bool in_parallel_loop() { return t_in_loop; }

SpinScope::SpinScope(bool spin) noexcept : previous_(t_spin) { t_spin = spin; }
SpinScope::~SpinScope() { t_spin = previous_; }
bool SpinScope::current() noexcept { return t_spin; }

void run_chunks(std::int64_t chunks, int threads, bool spin, ChunkBody body) {
  const std::int64_t start = now_ns();
  const int wanted = static_cast<int>(std::min<std::int64_t>(threads, chunks)) - 1;
  // Note [Stalled loops], Note [Loops on a busy machine]
  const bool serial = wanted <= 0 || contention().serial(start) || caller_waits_for_cores(start);
  const int helpers = serial ? 0 : wanted;
  const auto loop = std::make_shared<Loop>(chunks, std::max(helpers, 0), spin, body);
  if (helpers > 0) Pool::instance().publish(loop, helpers);
  const bool was_in_loop = t_in_loop;
  t_in_loop = true;
  const std::int64_t own_chunks = work(*loop);
  t_in_loop = was_in_loop;
  const auto all_done = [&] { return loop->finished.load(std::memory_order_acquire) == chunks; };
  if (helpers > 0) {
    const std::int64_t own_end = now_ns();
    if (!all_done() && !(spin && spin_until(all_done))) {
      while (loop->done.load(std::memory_order_acquire) == 0) loop->done.wait(0, std::memory_order_acquire);
    }
    const std::int64_t end = now_ns();
    contention().record(own_end - start, own_chunks, end - own_end, end);
  }
  if (loop->error) std::rethrow_exception(loop->error);
}

}  // namespace xpuruntime::cpu
