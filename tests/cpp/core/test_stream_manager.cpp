#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/version.h"

#if XPURT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace xpuruntime {
namespace {

TEST(StreamManager, CpuStreamsAreSynchronousNoOps) {
  const StreamView cpu = StreamManager::instance().current_stream(Device::cpu());
  EXPECT_TRUE(cpu.device.is_cpu());
  EXPECT_TRUE(cpu.is_default());
  EXPECT_TRUE(cpu.query());
  cpu.synchronize();
  EXPECT_EQ(cpu.priority(), 0);
  StreamGate gate(cpu);  // holds nothing on the CPU
  gate.open();
  EXPECT_FALSE(gate.timed_out());
}

TEST(StreamManager, WithoutGpuCreatingStreamsEventsAndGraphsRaisesCudaError) {
  if (DeviceManager::instance().get_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  if (!get_build_info().with_cuda) GTEST_SKIP() << "built without CUDA: no CUDA error to give";
  XPURT_EXPECT_THROW_WITH(Stream::create(Device::cuda(0)), CudaError, "cuda:0");
  XPURT_EXPECT_THROW_WITH(Event(Device::cuda(0)), CudaError, "cuda:0");
  CudaGraph graph;
  XPURT_EXPECT_THROW_WITH(graph.capture_begin(StreamView(Device::cuda(0), reinterpret_cast<void*>(1))), CudaError,
                          "cuda:0");
  XPURT_EXPECT_THROW_WITH(graph.replay(), InvalidArgumentError, "not been captured");
  XPURT_EXPECT_THROW_WITH(Stream::create(Device::cpu()), InvalidArgumentError, "needs a CUDA device");
}

#if XPURT_WITH_CUDA
cudaStream_t native(const StreamView& s) { return static_cast<cudaStream_t>(s.handle); }

TEST(StreamManagerGpu, CreatesStreamsWithPrioritiesAndGuardsTheCurrentStream) {
  XPURT_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  int least = 0;
  int greatest = 0;
  StreamManager::instance().priority_range(gpu, &least, &greatest);
  EXPECT_LE(greatest, least);
  Stream high = Stream::create(gpu, greatest);
  Stream normal = Stream::create(gpu);
  EXPECT_EQ(high.view().priority(), greatest);
  EXPECT_EQ(normal.view().priority(), 0);
  Stream clamped = Stream::create(gpu, -1000);
  EXPECT_EQ(clamped.priority(), greatest);
  EXPECT_TRUE(StreamManager::instance().current_stream(gpu).is_default());
  {
    StreamGuard guard(high);
    EXPECT_EQ(StreamManager::instance().current_stream(gpu), high.view());
  }
  EXPECT_TRUE(StreamManager::instance().current_stream(gpu).is_default());
}

TEST(StreamManagerGpu, MoveAssignmentReleasesTheOldStreamAndEvent) {
  XPURT_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Stream a = Stream::create(gpu);
  Stream b = Stream::create(gpu);
  void* b_handle = b.handle();
  a = std::move(b);
  EXPECT_EQ(a.handle(), b_handle);
  EXPECT_EQ(b.handle(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(a.query());
  Event e1(gpu);
  Event e2(gpu, /*enable_timing=*/true);
  void* e2_handle = e2.handle();
  e1 = std::move(e2);
  EXPECT_EQ(e1.handle(), e2_handle);
  EXPECT_TRUE(e1.timing());
  EXPECT_EQ(e2.handle(), nullptr);  // NOLINT(bugprone-use-after-move)
}

// Note [Timing without host gaps]: a StreamGate holds the stream's later work until opened; the events around work
// queued behind it, slowly, measure the GPU's time alone; a gate nobody opens lets the stream go after its limit.
TEST(StreamManagerGpu, AGateHoldsTheStreamUntilOpened) {
  XPURT_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  DataPtr buf = MemoryManager::instance().allocate(gpu, 1 << 20, stream);
  Event start(gpu, true);
  Event stop(gpu, true);
  {
    StreamGate gate(stream, 10000);
    start.record(stream);
    ASSERT_EQ(cudaMemsetAsync(buf.get(), 1, 1 << 20, native(stream)), cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a slow host between the events
    stop.record(stream);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(stop.query());  // held at the gate
    gate.open();
    stop.synchronize();
    EXPECT_FALSE(gate.timed_out());
  }
  EXPECT_LT(start.elapsed_ms(stop), 10.0f);  // the GPU's memset, not the host's 30 ms
  {
    StreamGate gate(stream, 20);  // never opened before its limit
    stop.record(stream);
    stop.synchronize();
    EXPECT_TRUE(gate.timed_out());
  }
  StreamGate cpu(StreamView{});  // holds nothing
  EXPECT_FALSE(cpu.timed_out());
}

TEST(StreamManagerGpu, EventsOrderStreamsAndMeasureTime) {
  XPURT_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Stream s1 = Stream::create(gpu);
  Stream s2 = Stream::create(gpu);
  DataPtr buf = MemoryManager::instance().allocate(gpu, 64 << 20, s1);
  Event start(gpu, true);
  Event end(gpu, true);
  start.record(s1);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(cudaMemsetAsync(buf.get(), i, 64 << 20, native(s1)), cudaSuccess);
  end.record(s1);
  s2.view().wait_event(end);
  unsigned char host = 0;
  ASSERT_EQ(cudaMemcpyAsync(&host, buf.get(), 1, cudaMemcpyDeviceToHost, native(s2)), cudaSuccess);
  s2.synchronize();
  EXPECT_EQ(host, 7);  // s2 saw all of s1's memsets
  EXPECT_TRUE(end.query());
  EXPECT_GT(start.elapsed_ms(end), 0.0f);
  Event untimed(gpu);
  untimed.record(s1);
  XPURT_EXPECT_THROW_WITH(untimed.elapsed_ms(end), InvalidArgumentError, "enable_timing");
}

TEST(StreamManagerGpu, GraphCaptureReplaysAndKeepsItsPrivatePool) {
  XPURT_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  auto& mm = MemoryManager::instance();
  Stream stream = Stream::create(gpu);
  DataPtr output = mm.allocate(gpu, 4096, stream);
  CudaGraph graph;
  void* scratch_address = nullptr;
  std::size_t reserved_after_capture = 0;
  {
    graph.capture_begin(stream);
    // An allocation made during capture: it comes from the graph's pool and stays valid for replays.
    DataPtr scratch = mm.allocate(gpu, 4096, stream);
    scratch_address = scratch.get();
    ASSERT_EQ(cudaMemsetAsync(scratch.get(), 42, 4096, native(stream)), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(output.get(), scratch.get(), 4096, cudaMemcpyDeviceToDevice, native(stream)),
              cudaSuccess);
    scratch.reset();  // freed inside the capture: back to the graph's pool, not to others
    graph.capture_end();
    reserved_after_capture = mm.get_reserved_size(gpu);
  }
  EXPECT_TRUE(graph.is_instantiated());
  EXPECT_EQ(graph.num_nodes(), 2u);
  auto snap = mm.device_allocator(gpu).snapshot();
  EXPECT_TRUE(std::any_of(snap.begin(), snap.end(), [&](const SegmentInfo& s) { return s.pool == graph.pool(); }));
  // Ordinary allocations never receive the graph's memory.
  DataPtr other = mm.allocate(gpu, 4096, stream);
  EXPECT_NE(other.get(), scratch_address);
  mm.empty_cache(gpu);
  ASSERT_EQ(cudaMemsetAsync(output.get(), 0, 4096, native(stream)), cudaSuccess);
  for (int i = 0; i < 3; ++i) graph.replay();
  std::vector<unsigned char> host(4096);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), output.get(), 4096, cudaMemcpyDeviceToHost, native(stream)), cudaSuccess);
  stream.synchronize();
  EXPECT_EQ(host[0], 42);
  EXPECT_EQ(host[4095], 42);
  const std::size_t with_graph = mm.get_reserved_size(gpu);
  EXPECT_GT(reserved_after_capture, 0u);
  graph.reset();  // the pool is released with the graph
  mm.empty_cache(gpu);
  EXPECT_LT(mm.get_reserved_size(gpu), with_graph);
  snap = mm.device_allocator(gpu).snapshot();
  EXPECT_FALSE(std::any_of(snap.begin(), snap.end(), [&](const SegmentInfo& s) { return s.pool != 0; }));
}

TEST(StreamManagerGpu, IllegalCallsDuringCaptureGiveATypedError) {
  XPURT_SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  CudaGraph graph;
  XPURT_EXPECT_THROW_WITH(graph.capture_begin(StreamManager::instance().default_stream(gpu)), InvalidArgumentError,
                          "legacy default stream cannot be captured");
  graph.capture_begin(stream);
  EXPECT_NE(cudaStreamSynchronize(native(stream)), cudaSuccess);  // illegal: invalidates the capture
  (void)cudaGetLastError();
  XPURT_EXPECT_THROW_WITH(graph.capture_end(), CudaError, "capture on cuda:0 failed");
  EXPECT_FALSE(graph.is_instantiated());
  // The stream and the allocator are usable again.
  DataPtr p = MemoryManager::instance().allocate(gpu, 1024, stream);
  ASSERT_EQ(cudaMemsetAsync(p.get(), 0, 1024, native(stream)), cudaSuccess);
  stream.synchronize();
}
#endif

}  // namespace
}  // namespace xpuruntime
