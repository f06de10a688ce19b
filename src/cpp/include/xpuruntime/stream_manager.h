// Streams, events and CUDA graphs.
//
//  - StreamView: a copyable, non-owning reference to a stream of a device. The CPU has one synchronous
//    "stream" (handle nullptr): operations on it are immediate, so code can be written once for both.
//  - Stream: owns one created CUDA stream (move-only; destruction waits for its queued work, then destroys).
//  - Event: owns one CUDA event (move-only), for timing or for ordering streams.
//  - CudaGraph: owns a captured graph, its executable instance and its private memory pool (move-only).
//  - StreamManager: the per-thread current stream of each device and stream priorities.
//  - StreamGuard: makes a stream current for a scope (neither copyable nor movable).
//
// The CUDA types never appear here; handles are void*. Without CUDA (no build support, no driver, no GPU)
// creating a CUDA stream/event/graph throws CudaError naming the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "xpuruntime/caching_allocator.h"
#include "xpuruntime/device.h"
#include "xpuruntime/export.h"

namespace xpuruntime {

class Event;

struct XPURT_API StreamView {
  Device device;           // default: cpu
  void* handle = nullptr;  // cudaStream_t; nullptr = the legacy default stream of `device`

  StreamView() = default;
  StreamView(Device d, void* h) : device(d), handle(h) {}

  StreamId id() const { return reinterpret_cast<StreamId>(handle); }
  bool is_default() const { return handle == nullptr; }
  // Blocks the calling thread until all work queued on the stream is done.
  void synchronize() const;
  // True when all queued work is done.
  bool query() const;
  // Future work on this stream waits for `event` (recorded elsewhere) to complete.
  void wait_event(const Event& event) const;
  // Future work on this stream waits for the work queued on `other` so far.
  void wait_stream(const StreamView& other) const;
  // The stream's priority (lower number = higher priority); 0 for the CPU and the default stream.
  int priority() const;

  friend bool operator==(const StreamView& a, const StreamView& b) {
    return a.device == b.device && a.handle == b.handle;
  }
};

class XPURT_API Stream {
 public:
  // Creates a stream on `device` (CUDA only). `priority`: 0 is normal; negative numbers are higher priority,
  // clamped to the device's range (StreamManager::priority_range). `non_blocking`: does not synchronize with
  // the legacy default stream (default true).
  static Stream create(Device device, int priority = 0, bool non_blocking = true);

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  StreamView view() const { return view_; }
  operator StreamView() const { return view_; }  // NOLINT: a Stream is usable wherever a view is
  Device device() const { return view_.device; }
  void* handle() const { return view_.handle; }
  int priority() const { return priority_; }
  void synchronize() const { view_.synchronize(); }
  bool query() const { return view_.query(); }

 private:
  Stream(StreamView view, int priority) : view_(view), priority_(priority) {}
  void release() noexcept;
  StreamView view_;
  int priority_ = 0;
};

class XPURT_API Event {
 public:
  // Creates an event on `device` (CUDA only). `enable_timing`: can measure elapsed time (default false, which
  // is cheaper). `blocking`: synchronize() yields the CPU instead of spinning (default false).
  explicit Event(Device device, bool enable_timing = false, bool blocking = false);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  void record(const StreamView& stream);
  bool query() const;  // true when the recorded work is done (or nothing was recorded)
  void synchronize() const;
  // Milliseconds between this event and `end`; both must be timing events, recorded and complete.
  float elapsed_ms(const Event& end) const;
  bool recorded() const { return recorded_; }
  bool timing() const { return timing_; }
  Device device() const { return device_; }
  void* handle() const { return handle_; }

 private:
  void release() noexcept;
  Device device_;
  void* handle_ = nullptr;
  bool timing_ = false;
  bool recorded_ = false;
};

class XPURT_API StreamManager {
 public:
  static StreamManager& instance();

  // The legacy default stream of `device`.
  StreamView default_stream(Device device) const;
  // The calling thread's current stream for `device` (the default stream unless set).
  StreamView current_stream(Device device) const;
  void set_current_stream(const StreamView& stream);
  // [greatest, least] priority numbers of `device`: lower numbers run first. {0, 0} for the CPU.
  void priority_range(Device device, int* least, int* greatest) const;

 private:
  StreamManager() = default;
};

// Makes `stream` the current stream of its device for the guard's scope.
class XPURT_API StreamGuard {
 public:
  explicit StreamGuard(const StreamView& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  StreamGuard(StreamGuard&&) = delete;
  StreamGuard& operator=(StreamGuard&&) = delete;

 private:
  StreamView previous_;
};

// Holds a CUDA stream's later work until open() (Note [Timing without host gaps] in core/dispatcher.cpp): the stream
// waits, on a host function it runs, until the gate is opened, destroyed, or `limit_ms` has passed, whichever comes
// first, so that work queued meanwhile runs back to back instead of as fast as the host queues it. The stream must
// not be captured. On the CPU, or with no CUDA in the build, it holds nothing.
class XPURT_API StreamGate {
 public:
  explicit StreamGate(const StreamView& stream, int limit_ms = 50);
  ~StreamGate();
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  StreamGate(StreamGate&&) = delete;
  StreamGate& operator=(StreamGate&&) = delete;

  void open();
  // True when the stream stopped waiting because `limit_ms` passed before open(): something queued behind the gate
  // waited for the stream itself (a synchronous copy, a synchronize), so it did not run back to back. Meaningful
  // once the stream has passed the gate (after a synchronize of later work).
  bool timed_out() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

enum class CaptureMode {
  kGlobal,       // unsafe CUDA calls from any thread fail during capture
  kThreadLocal,  // only this thread's unsafe calls fail (default)
  kRelaxed,      // no checks
};

// A CUDA graph: capture work queued on a stream, instantiate it, replay it many times.
// Allocations made on the capturing stream during capture come from the graph's private pool, which stays
// reserved while the graph exists (so addresses baked into the graph stay valid).
class XPURT_API CudaGraph {
 public:
  CudaGraph() = default;
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();

  // Starts capturing `stream` (a created stream: the legacy default stream cannot be captured). `pool`:
  // share another graph's private pool (default 0: a new pool of its own).
  void capture_begin(const StreamView& stream, MempoolId pool = 0, CaptureMode mode = CaptureMode::kThreadLocal);
  // Ends the capture and instantiates the graph. If capture failed (an illegal call was made), throws
  // CudaError and leaves the graph empty.
  void capture_end();
  // Launches the instantiated graph on `stream` (default: the stream it was captured on).
  void replay();
  void replay(const StreamView& stream);
  // Drops the graph, its instance and its pool reference.
  void reset() noexcept;

  bool is_capturing() const { return capturing_; }
  bool is_instantiated() const { return exec_ != nullptr; }
  MempoolId pool() const { return pool_; }
  std::size_t num_nodes() const;  // nodes in the captured graph

 private:
  void release() noexcept;
  StreamView stream_;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  MempoolId pool_ = 0;
  bool capturing_ = false;
};

}  // namespace xpuruntime
