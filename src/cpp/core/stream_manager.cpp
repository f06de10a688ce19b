#include "xpuruntime/stream_manager.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/memory_manager.h"

namespace xpuruntime {

namespace {

#if XPURT_WITH_CUDA
cudaStream_t native(const StreamView& s) { return static_cast<cudaStream_t>(s.handle); }
#endif

// The calling thread's current stream per CUDA device index (nullptr = default stream).
thread_local std::vector<void*> t_current_streams;

void require_cuda(Device device, const char* what) {
  XPURT_CHECK(device.is_cuda(), what, " needs a CUDA device, but got ", device.str());
#if !XPURT_WITH_CUDA
  XPURT_THROW_NO_CUDA_BUILD(what);
#endif
  DeviceManager::instance().check_device(device);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// StreamView

void StreamView::synchronize() const {
  if (device.is_cpu()) return;
#if XPURT_WITH_CUDA
  XPURT_CUDA_CHECK(cudaStreamSynchronize(native(*this)));
#endif
}

bool StreamView::query() const {
  if (device.is_cpu()) return true;
#if XPURT_WITH_CUDA
  const cudaError_t status = cudaStreamQuery(native(*this));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  XPURT_CUDA_CHECK(status);
#endif
  return true;
}

void StreamView::wait_event(const Event& event) const {
  if (device.is_cpu()) {
    event.synchronize();
    return;
  }
  if (!event.recorded()) return;
#if XPURT_WITH_CUDA
  XPURT_CUDA_CHECK(cudaStreamWaitEvent(native(*this), static_cast<cudaEvent_t>(event.handle()), 0));
#endif
}

void StreamView::wait_stream(const StreamView& other) const {
  if (*this == other || other.device.is_cpu()) return;
  if (device.is_cpu()) {
    other.synchronize();
    return;
  }
  Event event(other.device);
  event.record(other);
  wait_event(event);
}

int StreamView::priority() const {
  if (device.is_cpu() || handle == nullptr) return 0;
  int priority = 0;
#if XPURT_WITH_CUDA
  XPURT_CUDA_CHECK(cudaStreamGetPriority(native(*this), &priority));
#endif
  return priority;
}

// ---------------------------------------------------------------------------------------------------------
// Stream

Stream Stream::create(Device device, int priority, bool non_blocking) {
  require_cuda(device, "Stream::create");
  int least = 0;
  int greatest = 0;
  StreamManager::instance().priority_range(device, &least, &greatest);
  const int clamped = std::clamp(priority, greatest, least);
  void* handle = nullptr;
#if XPURT_WITH_CUDA
  detail::CudaDeviceGuard guard(device.index);
  cudaStream_t stream = nullptr;
  XPURT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault,
                                                clamped));
  handle = stream;
#else
  (void)non_blocking;
#endif
  return Stream(StreamView(device, handle), clamped);
}

Stream::Stream(Stream&& other) noexcept : view_(other.view_), priority_(other.priority_) {
  other.view_.handle = nullptr;
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    release();
    view_ = other.view_;
    priority_ = other.priority_;
    other.view_.handle = nullptr;
  }
  return *this;
}

Stream::~Stream() { release(); }

void Stream::release() noexcept {
  if (view_.handle == nullptr) return;
#if XPURT_WITH_CUDA
  // Wait for queued work first: the caching allocator may hand this stream's blocks to a new stream that
  // reuses the handle value, which is only safe once the old work is done.
  if (cudaStreamSynchronize(native(view_)) != cudaSuccess || cudaStreamDestroy(native(view_)) != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "xpuruntime: failed to destroy a CUDA stream on %s\n", view_.device.str().c_str());
  }
#endif
  view_.handle = nullptr;
}

// ---------------------------------------------------------------------------------------------------------
// Event

Event::Event(Device device, bool enable_timing, bool blocking) : device_(device), timing_(enable_timing) {
  require_cuda(device, "Event");
#if XPURT_WITH_CUDA
  detail::CudaDeviceGuard guard(device.index);
  unsigned flags = enable_timing ? cudaEventDefault : cudaEventDisableTiming;
  if (blocking) flags |= cudaEventBlockingSync;
  cudaEvent_t event = nullptr;
  XPURT_CUDA_CHECK(cudaEventCreateWithFlags(&event, flags));
  handle_ = event;
#else
  (void)blocking;
#endif
}

Event::Event(Event&& other) noexcept
    : device_(other.device_), handle_(other.handle_), timing_(other.timing_), recorded_(other.recorded_) {
  other.handle_ = nullptr;
  other.recorded_ = false;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    handle_ = other.handle_;
    timing_ = other.timing_;
    recorded_ = other.recorded_;
    other.handle_ = nullptr;
    other.recorded_ = false;
  }
  return *this;
}

Event::~Event() { release(); }

void Event::release() noexcept {
  if (handle_ == nullptr) return;
#if XPURT_WITH_CUDA
  if (cudaEventDestroy(static_cast<cudaEvent_t>(handle_)) != cudaSuccess) (void)cudaGetLastError();
#endif
  handle_ = nullptr;
}

void Event::record(const StreamView& stream) {
  XPURT_CHECK(handle_ != nullptr, "Event::record on a moved-from event");
  XPURT_CHECK(stream.device == device_, "Event of ", device_.str(), " cannot be recorded on a stream of ",
              stream.device.str());
#if XPURT_WITH_CUDA
  detail::CudaDeviceGuard guard(device_.index);
  XPURT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), native(stream)));
#endif
  recorded_ = true;
}

bool Event::query() const {
  if (handle_ == nullptr || !recorded_) return true;
#if XPURT_WITH_CUDA
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  XPURT_CUDA_CHECK(status);
#endif
  return true;
}

void Event::synchronize() const {
  if (handle_ == nullptr || !recorded_) return;
#if XPURT_WITH_CUDA
  XPURT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
#endif
}

float Event::elapsed_ms(const Event& end) const {
  XPURT_CHECK(timing_ && end.timing_, "elapsed_ms needs two events created with enable_timing=true");
  XPURT_CHECK(recorded_ && end.recorded_, "elapsed_ms needs both events to have been recorded");
  float ms = 0.0f;
#if XPURT_WITH_CUDA
  XPURT_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)));
#endif
  return ms;
}

// ---------------------------------------------------------------------------------------------------------
// StreamManager

StreamManager& StreamManager::instance() {
  static StreamManager* manager = new StreamManager();
  return *manager;
}

StreamView StreamManager::default_stream(Device device) const {
  DeviceManager::instance().check_device(device);
  return StreamView(device, nullptr);
}

StreamView StreamManager::current_stream(Device device) const {
  if (device.is_cuda() && device.index >= 0 && static_cast<std::size_t>(device.index) < t_current_streams.size()) {
    return StreamView(device, t_current_streams[static_cast<std::size_t>(device.index)]);
  }
  return default_stream(device);
}

void StreamManager::set_current_stream(const StreamView& stream) {
  DeviceManager::instance().check_device(stream.device);
  if (stream.device.is_cpu()) return;
  const auto index = static_cast<std::size_t>(stream.device.index);
  if (t_current_streams.size() <= index) t_current_streams.resize(index + 1, nullptr);
  t_current_streams[index] = stream.handle;
}

void StreamManager::priority_range(Device device, int* least, int* greatest) const {
  *least = 0;
  *greatest = 0;
  if (device.is_cpu()) return;
  require_cuda(device, "priority_range");
#if XPURT_WITH_CUDA
  detail::CudaDeviceGuard guard(device.index);
  XPURT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(least, greatest));
#endif
}

StreamGuard::StreamGuard(const StreamView& stream)
    : previous_(StreamManager::instance().current_stream(stream.device)) {
  StreamManager::instance().set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  try {
    StreamManager::instance().set_current_stream(previous_);
  } catch (...) {  // restoring a previously valid stream cannot fail; stay noexcept regardless
  }
}

// ---------------------------------------------------------------------------------------------------------
// StreamGate

struct StreamGate::State {
  std::mutex mutex;
  std::condition_variable opened_cv;
  bool opened = false;
  bool timed_out = false;
  int limit_ms = 50;
};

namespace {

#if XPURT_WITH_CUDA
// Runs on CUDA's host-function thread when the stream reaches the gate; `data` is a heap copy of the gate's state
// pointer (the gate may be gone by then), deleted here.
void CUDART_CB wait_at_gate(void* data) {
  std::unique_ptr<std::shared_ptr<StreamGate::State>> owned(static_cast<std::shared_ptr<StreamGate::State>*>(data));
  StreamGate::State& state = **owned;
  std::unique_lock<std::mutex> lock(state.mutex);
  if (!state.opened_cv.wait_for(lock, std::chrono::milliseconds(state.limit_ms), [&] { return state.opened; })) {
    state.timed_out = true;
  }
}
#endif

}  // namespace

StreamGate::StreamGate(const StreamView& stream, int limit_ms) {
  if (stream.device.is_cpu()) return;
#if XPURT_WITH_CUDA
  state_ = std::make_shared<State>();
  state_->limit_ms = std::max(limit_ms, 0);
  auto* data = new std::shared_ptr<State>(state_);
  detail::CudaDeviceGuard guard(stream.device.index);
  const cudaError_t status = cudaLaunchHostFunc(native(stream), wait_at_gate, data);
  if (status != cudaSuccess) {
    delete data;
    state_.reset();
    XPURT_CUDA_CHECK(status);
  }
#else
  (void)limit_ms;
#endif
}

StreamGate::~StreamGate() { open(); }

void StreamGate::open() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->opened = true;
  }
  state_->opened_cv.notify_all();
}

bool StreamGate::timed_out() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->timed_out;
}

// ---------------------------------------------------------------------------------------------------------
// CudaGraph

CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : stream_(other.stream_), graph_(other.graph_), exec_(other.exec_), pool_(other.pool_),
      capturing_(other.capturing_) {
  other.graph_ = nullptr;
  other.exec_ = nullptr;
  other.pool_ = 0;
  other.capturing_ = false;
}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    release();
    stream_ = other.stream_;
    graph_ = other.graph_;
    exec_ = other.exec_;
    pool_ = other.pool_;
    capturing_ = other.capturing_;
    other.graph_ = nullptr;
    other.exec_ = nullptr;
    other.pool_ = 0;
    other.capturing_ = false;
  }
  return *this;
}

CudaGraph::~CudaGraph() { release(); }

void CudaGraph::reset() noexcept { release(); }

void CudaGraph::capture_begin(const StreamView& stream, MempoolId pool, CaptureMode mode) {
  require_cuda(stream.device, "CUDA graph capture");
  XPURT_CHECK(!capturing_, "capture_begin: this graph is already capturing");
  XPURT_CHECK(graph_ == nullptr, "capture_begin: this graph already holds a capture; call reset() first");
  XPURT_CHECK(!stream.is_default(),
              "CUDA graph capture needs a created stream (Stream::create); the legacy default stream cannot be "
              "captured");
#if XPURT_WITH_CUDA
  CachingAllocator& allocator = MemoryManager::instance().device_allocator(stream.device);
  if (pool == 0) {
    pool = allocator.create_pool();
  } else {
    allocator.retain_pool(pool);
  }
  pool_ = pool;
  stream_ = stream;
  try {
    allocator.begin_allocate_to_pool(pool_, stream.id());
  } catch (...) {
    release();
    throw;
  }
  cudaStreamCaptureMode native_mode = cudaStreamCaptureModeThreadLocal;
  if (mode == CaptureMode::kGlobal) native_mode = cudaStreamCaptureModeGlobal;
  if (mode == CaptureMode::kRelaxed) native_mode = cudaStreamCaptureModeRelaxed;
  detail::CudaDeviceGuard guard(stream.device.index);
  const cudaError_t status = cudaStreamBeginCapture(native(stream), native_mode);
  if (status != cudaSuccess) {
    allocator.end_allocate_to_pool(pool_);
    release();
    XPURT_CUDA_CHECK(status);
  }
  capturing_ = true;
#else
  (void)pool;
  (void)mode;
#endif
}

void CudaGraph::capture_end() {
  XPURT_CHECK(capturing_, "capture_end without capture_begin");
#if XPURT_WITH_CUDA
  detail::CudaDeviceGuard guard(stream_.device.index);
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(native(stream_), &graph);
  capturing_ = false;
  MemoryManager::instance().device_allocator(stream_.device).end_allocate_to_pool(pool_);
  if (status != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    release();
    (void)cudaGetLastError();
    throw CudaError(detail::str_cat(
        "CUDA graph capture on ", stream_.device.str(), " failed: ", cudaGetErrorName(status), " (",
        cudaGetErrorString(status),
        "). An operation that is illegal during capture was issued (a synchronization, a copy from pageable "
        "host memory, work on the legacy default stream, or a capture from another thread in global mode)"),
        static_cast<int>(status));
  }
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  XPURT_CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  exec_ = exec;
#endif
}

void CudaGraph::replay() { replay(stream_); }

void CudaGraph::replay(const StreamView& stream) {
  XPURT_CHECK(exec_ != nullptr, "replay: the graph has not been captured and instantiated (capture_end)");
  XPURT_CHECK(stream.device == stream_.device, "replay: the graph was captured on ", stream_.device.str(),
              " but the stream is on ", stream.device.str());
#if XPURT_WITH_CUDA
  detail::CudaDeviceGuard guard(stream.device.index);
  XPURT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), native(stream)));
#endif
}

std::size_t CudaGraph::num_nodes() const {
  std::size_t count = 0;
#if XPURT_WITH_CUDA
  if (graph_ != nullptr) XPURT_CUDA_CHECK(cudaGraphGetNodes(static_cast<cudaGraph_t>(graph_), nullptr, &count));
#endif
  return count;
}

void CudaGraph::release() noexcept {
#if XPURT_WITH_CUDA
  if (capturing_) {
    cudaGraph_t aborted = nullptr;
    if (cudaStreamEndCapture(native(stream_), &aborted) == cudaSuccess && aborted != nullptr) {
      cudaGraphDestroy(aborted);
    }
    (void)cudaGetLastError();
    try {
      MemoryManager::instance().device_allocator(stream_.device).end_allocate_to_pool(pool_);
    } catch (...) {
    }
    capturing_ = false;
  }
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  (void)cudaGetLastError();
  if (pool_ != 0) {
    try {
      MemoryManager::instance().device_allocator(stream_.device).release_pool(pool_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "xpuruntime: releasing graph pool %llu: %s\n", static_cast<unsigned long long>(pool_),
                   e.what());
    }
  }
#endif
  exec_ = nullptr;
  graph_ = nullptr;
  pool_ = 0;
}

}  // namespace xpuruntime
