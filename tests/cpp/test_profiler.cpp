// The Profiler: node events of the native engine (names, kernels, shapes) matching explain(), session events, user
// ranges that nest, start/stop rules, nothing recorded when off, allocator events (a simulated device and the CPU),
// the per-node summary, and a Chrome trace that parses with the required keys and paired flows. On a GPU: CUPTI
// kernels attributed to their nodes, also for a session whose CUDA graph is captured (skipped without one).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "onnx_models.h"
#include "test_utils.h"
#include "xpuruntime/caching_allocator.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/profiler.h"

using namespace xpuruntime;

namespace {

InferenceSession linear_relu_session(Device device = Device::cpu()) {
  SessionOptions options;
  options.engine = "native";
  options.device = device;
  const std::string model(reinterpret_cast<const char*>(test_models::kLinearReluModel), test_models::kLinearReluModelSize);
  return InferenceSession::from_bytes(model, options);
}

Tensor input(std::int64_t batch) {
  Tensor x = Tensor::empty({batch, 4}, DType::kFloat32);
  for (std::int64_t i = 0; i < x.numel(); ++i) static_cast<float*>(x.data_ptr())[i] = static_cast<float>(i % 7) - 3.0f;
  return x;
}

ProfilerOptions host_only() {
  ProfilerOptions o;
  o.cuda = ProfilerOptions::CudaActivity::kOff;
  return o;
}

std::vector<ProfileEvent> of_category(const std::vector<ProfileEvent>& events, const std::string& category) {
  std::vector<ProfileEvent> out;
  for (const auto& e : events) {
    if (e.category == category) out.push_back(e);
  }
  return out;
}

std::string str_arg(const ProfileEvent& e, const std::string& key) {
  const ProfileArg* a = e.arg(key);
  if (a == nullptr) return "<missing>";
  const auto* s = std::get_if<std::string>(a);
  return s ? *s : "<not a string>";
}

}  // namespace

TEST(Profiler, NodeEventsMatchTheNativePlan) {
  InferenceSession session = linear_relu_session();
  Profiler profiler(host_only());
  profiler.start();
  session.run({{"X", input(2)}});
  profiler.stop();
  const std::vector<ProfileEvent> events = profiler.events();
  const Explanation explanation = session.explain();
  const auto nodes = of_category(events, "node");
  ASSERT_EQ(nodes.size(), explanation.nodes.size()) << explanation.str();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const ProfileEvent& e = nodes[i];
    const NodeExplanation& n = explanation.nodes[i];
    EXPECT_EQ(e.name, n.node);
    EXPECT_EQ(str_arg(e, "node"), n.node);
    EXPECT_EQ(str_arg(e, "op_type"), n.op_type);
    EXPECT_EQ(str_arg(e, "kernel"), n.kernel);
    EXPECT_EQ(str_arg(e, "backend"), n.backend);
    EXPECT_FALSE(str_arg(e, "reason").empty());
    EXPECT_GE(e.duration_ns, 0);
    EXPECT_GT(e.pid, 0);
    EXPECT_GT(e.tid, 0);
    const ProfileArg* in = e.arg("input_shapes");
    const ProfileArg* out = e.arg("output_shapes");
    ASSERT_NE(in, nullptr);
    ASSERT_NE(out, nullptr);
    EXPECT_FALSE(std::get<std::vector<std::string>>(*out).empty());
    ASSERT_NE(e.arg("bytes"), nullptr);
    EXPECT_GT(std::get<std::int64_t>(*e.arg("bytes")), 0);
  }
  // The first node reads X as float32[2,4]; the last writes Y as float32[2,3].
  const auto& first_inputs = std::get<std::vector<std::string>>(*nodes.front().arg("input_shapes"));
  EXPECT_NE(std::find(first_inputs.begin(), first_inputs.end(), "float32[2,4]"), first_inputs.end());
  const auto& last_outputs = std::get<std::vector<std::string>>(*nodes.back().arg("output_shapes"));
  EXPECT_EQ(last_outputs, std::vector<std::string>{"float32[2,3]"});

  // The session event encloses the plan run, which encloses every node.
  const auto sessions = of_category(events, "session");
  ASSERT_EQ(sessions.size(), 2u);
  const ProfileEvent& run = sessions[0];
  EXPECT_EQ(str_arg(run, "engine"), "native");
  EXPECT_EQ(str_arg(run, "device"), "cpu");
  EXPECT_EQ(std::get<std::vector<std::string>>(*run.arg("input_shapes")), std::vector<std::string>{"X: float32[2,4]"});
  for (const auto& n : nodes) {
    EXPECT_GE(n.start_ns, run.start_ns);
    EXPECT_LE(n.start_ns + n.duration_ns, run.start_ns + run.duration_ns);
  }
  EXPECT_EQ(profiler.metadata().at("cuda_activity").rfind("off", 0), 0u);
}

TEST(Profiler, RecordShapesOffLeavesShapesOut) {
  InferenceSession session = linear_relu_session();
  ProfilerOptions options = host_only();
  options.record_shapes = false;
  Profiler profiler(options);
  profiler.start();
  session.run({{"X", input(1)}});
  profiler.stop();
  const auto nodes = of_category(profiler.events(), "node");
  ASSERT_FALSE(nodes.empty());
  for (const auto& e : nodes) {
    EXPECT_EQ(e.arg("input_shapes"), nullptr);
    EXPECT_NE(e.arg("kernel"), nullptr);
  }
}

TEST(Profiler, RangesNest) {
  InferenceSession session = linear_relu_session();
  Profiler profiler(host_only());
  profiler.start();
  {
    Profiler::Range outer = Profiler::range("outer");
    {
      Profiler::Range inner = Profiler::range("inner");
      session.run({{"X", input(1)}});
    }
    Profiler::Range ended = Profiler::range("ended early");
    ended.end();
    ended.end();  // idempotent
  }
  profiler.stop();
  const auto ranges = of_category(profiler.events(), "range");
  ASSERT_EQ(ranges.size(), 3u);
  std::map<std::string, ProfileEvent> by_name;
  for (const auto& r : ranges) by_name[r.name] = r;
  const ProfileEvent& outer = by_name.at("outer");
  const ProfileEvent& inner = by_name.at("inner");
  EXPECT_EQ(std::get<std::int64_t>(*outer.arg("depth")), 0);
  EXPECT_EQ(std::get<std::int64_t>(*inner.arg("depth")), 1);
  EXPECT_GE(inner.start_ns, outer.start_ns);
  EXPECT_LE(inner.start_ns + inner.duration_ns, outer.start_ns + outer.duration_ns);
  EXPECT_EQ(inner.tid, outer.tid);
  for (const auto& n : of_category(profiler.events(), "node")) {
    EXPECT_GE(n.start_ns, inner.start_ns);
    EXPECT_LE(n.start_ns + n.duration_ns, inner.start_ns + inner.duration_ns);
  }
}

TEST(Profiler, StartStopRules) {
  InferenceSession session = linear_relu_session();
  Profiler profiler(host_only());
  EXPECT_FALSE(profiler.recording());
  profiler.stop();  // not recording: nothing happens
  profiler.start();
  EXPECT_TRUE(profiler.recording());
  EXPECT_TRUE(profiler::recording());
  XPURT_EXPECT_THROW_WITH(profiler.start(), InvalidArgumentError, "already recording");
  Profiler other(host_only());
  XPURT_EXPECT_THROW_WITH(other.start(), InvalidArgumentError, "another profiler");
  session.run({{"X", input(1)}});
  const std::size_t so_far = profiler.events().size();  // readable while recording
  EXPECT_GT(so_far, 0u);
  profiler.stop();
  EXPECT_FALSE(profiler::recording());
  profiler.stop();
  EXPECT_EQ(profiler.events().size(), so_far);
  // A restart starts from an empty profile; the other profiler can record now.
  profiler.start();
  EXPECT_TRUE(profiler.events().empty());
  profiler.stop();
  other.start();
  session.run({{"X", input(1)}});
  other.stop();
  EXPECT_FALSE(of_category(other.events(), "node").empty());
}

TEST(Profiler, OffRecordsNothing) {
  InferenceSession session = linear_relu_session();
  Profiler never(host_only());
  session.run({{"X", input(3)}});
  EXPECT_TRUE(never.events().empty());
  EXPECT_FALSE(profiler::recording());

  Profiler stopped(host_only());
  stopped.start();
  session.run({{"X", input(3)}});
  stopped.stop();
  const std::size_t count = stopped.events().size();
  session.run({{"X", input(3)}});
  Tensor t = Tensor::empty({1024}, DType::kFloat32);
  { Profiler::Range r = Profiler::range("after stop"); }
  EXPECT_EQ(stopped.events().size(), count);
  EXPECT_TRUE(of_category(stopped.events(), "range").empty());
}

TEST(Profiler, AllocatorEvents) {
  CachingAllocator allocator(std::make_unique<SimulatedMemoryBacking>(std::size_t{64} << 20));
  Profiler profiler(host_only());
  profiler.start();
  void* a = allocator.allocate(3000, 0);  // rounded to 3072
  void* b = allocator.allocate(1 << 20, 0);
  allocator.free(a);
  Tensor host = Tensor::empty({256}, DType::kFloat32);  // 1 KiB of CPU memory
  host = Tensor();
  profiler.stop();
  allocator.free(b);  // after stop: not recorded

  const MemoryEventsSummary memory = profiler.memory();
  ASSERT_TRUE(memory.devices.count("simulated device")) << "devices: " << memory.devices.size();
  const auto& sim = memory.devices.at("simulated device");
  EXPECT_EQ(sim.allocations, 2);
  EXPECT_EQ(sim.frees, 1);
  EXPECT_EQ(sim.allocated_bytes, 3072 + (1 << 20));
  EXPECT_EQ(sim.freed_bytes, 3072);
  EXPECT_EQ(sim.peak_bytes, 3072 + (1 << 20));
  ASSERT_TRUE(memory.devices.count("cpu"));
  EXPECT_GE(memory.devices.at("cpu").allocations, 1);
  EXPECT_GE(memory.devices.at("cpu").frees, 1);
  EXPECT_GE(memory.devices.at("cpu").allocated_bytes, 1024);
  EXPECT_GE(memory.total.allocations, 3);
  EXPECT_EQ(memory.total.peak_bytes, std::max(sim.peak_bytes, memory.devices.at("cpu").peak_bytes));
  for (const auto& e : of_category(profiler.events(), "alloc")) {
    EXPECT_TRUE(e.name == "allocate" || e.name == "free") << e.name;
    EXPECT_NE(e.arg("bytes"), nullptr);
    EXPECT_NE(e.arg("allocated_bytes"), nullptr);
  }
}

TEST(Profiler, SummaryAggregatesCallsPerNode) {
  InferenceSession session = linear_relu_session();
  session.run({{"X", input(4)}});  // warm-up outside the profile
  Profiler profiler(host_only());
  profiler.start();
  for (int i = 0; i < 3; ++i) session.run({{"X", input(4)}});
  profiler.stop();
  const std::vector<NodeSummary> rows = profiler.summary();
  const Explanation explanation = session.explain();
  ASSERT_EQ(rows.size(), explanation.nodes.size());
  double share = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].calls, 3) << rows[i].node;
    EXPECT_FALSE(rows[i].kernel.empty());
    EXPECT_GT(rows[i].bytes, 0);
    if (i > 0) {
      EXPECT_GE(rows[i - 1].total_ns, rows[i].total_ns);
    }
    share += rows[i].share;
  }
  EXPECT_NEAR(share, 1.0, 1e-9);
  const std::string table = profiler.summary_table();
  EXPECT_NE(table.find("op_type"), std::string::npos);
  EXPECT_NE(table.find("total_us"), std::string::npos);
  for (const auto& n : explanation.nodes) EXPECT_NE(table.find(n.node), std::string::npos) << table;
  if (rows.size() > 1) {
    EXPECT_NE(profiler.summary_table(1).find("more nodes"), std::string::npos);
  }
}

TEST(Profiler, ChromeTraceHasTheRequiredKeys) {
  InferenceSession session = linear_relu_session();
  Profiler profiler(host_only());
  profiler.start();
  {
    Profiler::Range r = Profiler::range("step");
    session.run({{"X", input(2)}});
  }
  profiler.stop();
  const auto path = std::filesystem::temp_directory_path() / "xpurt_test_profiler_trace.json";
  profiler.export_chrome_trace(path.string());
  std::ifstream file(path);
  const nlohmann::json trace = nlohmann::json::parse(file);
  std::filesystem::remove(path);
  ASSERT_TRUE(trace.contains("traceEvents"));
  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");
  ASSERT_TRUE(trace.at("metadata").is_object());
  EXPECT_TRUE(trace.at("metadata").contains("xpuruntime_version"));
  std::set<std::string> categories;
  bool process_name = false;
  std::map<std::int64_t, int> flows;
  for (const auto& e : trace.at("traceEvents")) {
    ASSERT_TRUE(e.contains("ph")) << e.dump();
    ASSERT_TRUE(e.contains("pid")) << e.dump();
    const std::string ph = e.at("ph");
    if (ph == "X") {
      for (const char* key : {"name", "cat", "ts", "dur", "pid", "tid", "args"}) {
        EXPECT_TRUE(e.contains(key)) << key << " missing in " << e.dump();
      }
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
      categories.insert(e.at("cat").get<std::string>());
      if (e.at("cat") == "node") {
        for (const char* key : {"node", "op_type", "kernel", "backend", "precision", "reason", "input_shapes"}) {
          EXPECT_TRUE(e.at("args").contains(key)) << key << " missing in " << e.dump();
        }
      }
    } else if (ph == "M") {
      process_name |= e.at("name") == "process_name";
    } else if (ph == "s" || ph == "f") {
      flows[e.at("id").get<std::int64_t>()] += ph == "s" ? 1 : 100;
    }
  }
  EXPECT_TRUE(process_name);
  EXPECT_TRUE(categories.count("node"));
  EXPECT_TRUE(categories.count("session"));
  EXPECT_TRUE(categories.count("range"));
  for (const auto& [id, count] : flows) EXPECT_EQ(count, 101) << "flow " << id << " is not one s and one f";
  XPURT_EXPECT_THROW_WITH(profiler.export_chrome_trace("/nonexistent-folder/trace.json"), InvalidArgumentError,
                          "cannot write");
}

TEST(Profiler, CudaActivityOnNeedsAGpu) {
  if (DeviceManager::instance().get_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  ProfilerOptions options;
  options.cuda = ProfilerOptions::CudaActivity::kOn;
  Profiler profiler(options);
  XPURT_EXPECT_THROW_WITH(profiler.start(), UnsupportedOperationError, "CUDA activity");
  EXPECT_FALSE(profiler.recording());
  EXPECT_FALSE(profiler::recording());
  // kAuto falls back to host events and says why.
  Profiler automatic;
  automatic.start();
  automatic.stop();
  EXPECT_FALSE(automatic.cuda_activity());
  EXPECT_FALSE(automatic.cuda_activity_reason().empty());
}

TEST(Profiler, CuptiKernelsAreAttributedToTheirNodes) {
  XPURT_SKIP_WITHOUT_GPU();
  InferenceSession session = linear_relu_session(Device::cuda(0));
  // Two runs without the profiler: the second captures the plan into a CUDA graph.
  session.run({{"X", input(8)}});
  session.run({{"X", input(8)}});
  Profiler profiler;
  profiler.start();
  if (!profiler.cuda_activity()) {
    const std::string why = profiler.cuda_activity_reason();
    profiler.stop();
    GTEST_SKIP() << "no CUDA activity: " << why;
  }
  session.run({{"X", input(8)}});
  session.run({{"X", input(8)}});
  profiler.stop();
  const std::vector<ProfileEvent> events = profiler.events();
  std::map<std::uint64_t, const ProfileEvent*> nodes;
  for (const auto& e : events) {
    if (e.category == "node") nodes[e.id] = &e;
  }
  const auto kernels = of_category(events, "kernel");
  ASSERT_FALSE(kernels.empty());
  std::size_t attributed = 0;
  for (const auto& k : kernels) {
    EXPECT_TRUE(k.device);
    EXPECT_GT(k.duration_ns, 0);
    if (k.parent == 0) continue;
    ++attributed;
    ASSERT_TRUE(nodes.count(k.parent)) << "kernel " << k.name << " points at a missing node";
    const ProfileEvent& node = *nodes.at(k.parent);
    // A kernel starts after its node launched it (50 us of slack for the CUPTI-to-host clock mapping).
    EXPECT_LE(node.start_ns, k.start_ns + 50000) << k.name;
  }
  EXPECT_GT(attributed, 0u);
  EXPECT_FALSE(of_category(events, "memcpy").empty());  // the input upload and the output download
  EXPECT_TRUE(profiler.metadata().count("cuda_graphs")) << "the captured graph ran eagerly while profiling";
  const std::vector<NodeSummary> rows = profiler.summary();
  bool named = false;
  for (const auto& r : rows) named |= !r.device_kernels.empty();
  EXPECT_TRUE(named);
  // After profiling the graph replays again (no node events appear, the session still works).
  auto out = session.run({{"X", input(8)}});
  EXPECT_EQ(out[0].shape(), (std::vector<std::int64_t>{8, 3}));
}
