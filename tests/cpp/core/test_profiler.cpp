// The Profiler: node events of the native engine (names, kernels, shapes) matching explain(), session events, user
// ranges that nest, start/stop rules, nothing recorded when off, allocator events (a simulated device and the CPU),
// the per-node summary, and a Chrome trace that parses with the required keys and paired flows. On a GPU: CUPTI
// kernels attributed to their nodes, also for a session whose CUDA graph is captured (skipped without one).
// ONNX Runtime's profile: parsing ORT's JSON, placing runs on the timeline, merging a file into a Profiler and into a
// Chrome trace, and onnxruntime-engine sessions whose nodes appear as node events (skipped without ORT).
#include <unistd.h>

#include <algorithm>
#include <cmath>
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
#include "xpuruntime/engine.h"
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

// summary(within): only the node events that start inside a range of that name (the generation loop's phases use it:
// Note [Generation ranges]); shares of those nodes' time; nothing for a name no range has.
TEST(Profiler, SummaryWithinARange) {
  InferenceSession session = linear_relu_session();
  session.run({{"X", input(4)}});
  Profiler profiler(host_only());
  profiler.start();
  session.run({{"X", input(4)}});
  {
    const Profiler::Range range = Profiler::range("phase b");
    for (int i = 0; i < 2; ++i) session.run({{"X", input(4)}});
  }
  {
    const Profiler::Range range = Profiler::range("phase c");
    session.run({{"X", input(4)}});
  }
  profiler.stop();
  const std::vector<NodeSummary> all = profiler.summary(), b = profiler.summary("phase b"),
                                 c = profiler.summary("phase c");
  ASSERT_FALSE(all.empty());
  ASSERT_EQ(b.size(), all.size());
  ASSERT_EQ(c.size(), all.size());
  double share = 0;
  for (const NodeSummary& row : all) EXPECT_EQ(row.calls, 4) << row.node;
  for (const NodeSummary& row : b) {
    EXPECT_EQ(row.calls, 2) << row.node;
    share += row.share;
  }
  for (const NodeSummary& row : c) EXPECT_EQ(row.calls, 1) << row.node;
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_TRUE(profiler.summary("no such range").empty());
  EXPECT_EQ(profiler.summary("").size(), all.size());
  EXPECT_NE(profiler.summary_table(0, "phase c").find(all.front().node), std::string::npos);
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
  // Note [Graph node attribution]: the graph, captured again under step labels, replays while profiling; its
  // kernels are attributed through CUPTI's graph node ids.
  ASSERT_TRUE(profiler.metadata().count("cuda_graph_replays"));
  EXPECT_EQ(profiler.metadata().at("cuda_graph_replays").rfind("replayed", 0), 0u)
      << profiler.metadata().at("cuda_graph_replays");
  EXPECT_EQ(attributed, kernels.size()) << "every kernel of a replay belongs to a node";
  const std::vector<NodeSummary> rows = profiler.summary();
  bool named = false;
  for (const auto& r : rows) named |= !r.device_kernels.empty();
  EXPECT_TRUE(named);
  // After profiling the graph replays again (no node events appear, the session still works).
  auto out = session.run({{"X", input(8)}});
  EXPECT_EQ(out[0].shape(), (std::vector<std::int64_t>{8, 3}));
}

// ---- ONNX Runtime's profile (Note [ORT profile on the timeline] in core/profiler_ort.cpp) ----

namespace {

// A run-level profile as ONNX Runtime 1.29 writes it (trimmed args), two runs, plus events of kinds left out.
const char* kOrtProfile = R"([
{"cat":"Session","pid":77,"tid":78,"dur":128,"ts":0,"ph":"X","name":"model_run","args":{}},
{"cat":"Session","pid":77,"tid":78,"dur":116,"ts":10,"ph":"X","name":"SequentialExecutor::Execute","args":{}},
{"cat":"Node","pid":77,"tid":78,"dur":83,"ts":12,"ph":"X","name":"add0_kernel_time","args":{"op_name":"Add",
 "provider":"CPUExecutionProvider","node_index":"0","activation_size":"48","parameter_size":"0","output_size":"24",
 "input_type_shape":[{"float":[2,3]},{"float":[2,3]}],"output_type_shape":[{"float":[2,3]}],
 "thread_scheduling_stats":""}},
{"cat":"Node","pid":77,"tid":78,"dur":1,"ts":96,"ph":"X","name":"add0_fence_after","args":{}},
{"cat":"Node","pid":77,"tid":78,"dur":11,"ts":100,"ph":"X","name":"cast0_kernel_time","args":{"op_name":"Cast",
 "provider":"CUDAExecutionProvider","node_index":"1","activation_size":"24","parameter_size":"0","output_size":"12",
 "input_type_shape":[{"float":[2,3]}],"output_type_shape":[{"float16":[2,3]}]}},
{"cat":"Kernel","pid":77,"tid":78,"dur":3,"ts":101,"ph":"X","name":"void cast_kernel<float>","args":{}},
{"cat":"Session","pid":77,"tid":78,"dur":50,"ts":1000,"ph":"X","name":"model_run","args":{}},
{"cat":"Node","pid":77,"tid":78,"dur":20,"ts":1010,"ph":"X","name":"add0_kernel_time","args":{"op_name":"Add",
 "provider":"CPUExecutionProvider","node_index":"0","input_type_shape":[{"float":[2,3]},{"float":[2,3]}],
 "output_type_shape":[{"float":[2,3]}]}}
])";

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

std::vector<std::string> strings_arg(const ProfileEvent& e, const std::string& key) {
  const ProfileArg* a = e.arg(key);
  return a != nullptr && std::holds_alternative<std::vector<std::string>>(*a) ? std::get<std::vector<std::string>>(*a)
                                                                              : std::vector<std::string>{};
}

// A build without ONNX Runtime still names the engine (a DeclaredEngine that says what to install).
bool has_ort_engine() {
  const Engine* ort = EngineRegistry::global().find("onnxruntime");
  return ort != nullptr && ort->available(SessionOptions{});
}

std::string linear_relu_model() {
  return {reinterpret_cast<const char*>(test_models::kLinearReluModel), test_models::kLinearReluModelSize};
}

InferenceSession ort_linear_relu_session() {
  SessionOptions options;
  options.engine = "onnxruntime";
  return InferenceSession::from_bytes(linear_relu_model(), options);
}

}  // namespace

TEST(OrtProfile, ParsesNodeAndSessionEvents) {
  const profiler::OrtProfile p = profiler::parse_ort_profile(kOrtProfile, /*shapes=*/true);
  ASSERT_EQ(p.runs.size(), 2u);
  EXPECT_EQ(p.runs[0], std::make_pair(std::int64_t{0}, std::int64_t{128000}));
  EXPECT_EQ(p.runs[1], std::make_pair(std::int64_t{1000000}, std::int64_t{50000}));
  const auto nodes = of_category(p.events, "node");
  ASSERT_EQ(nodes.size(), 3u);
  const ProfileEvent& add = nodes[0];
  EXPECT_EQ(add.name, "add0");
  EXPECT_EQ(add.start_ns, 12000);
  EXPECT_EQ(add.duration_ns, 83000);
  EXPECT_EQ(add.pid, 77);
  EXPECT_EQ(add.tid, 78);
  EXPECT_EQ(str_arg(add, "op_type"), "Add");
  EXPECT_EQ(str_arg(add, "backend"), "CPUExecutionProvider");
  EXPECT_EQ(str_arg(add, "kernel"), "CPUExecutionProvider");
  EXPECT_EQ(str_arg(add, "engine"), "onnxruntime");
  EXPECT_EQ(str_arg(add, "precision"), "fp32");
  EXPECT_EQ(std::get<std::int64_t>(*add.arg("bytes")), 72);
  EXPECT_EQ(std::get<std::int64_t>(*add.arg("node_index")), 0);
  EXPECT_EQ(strings_arg(add, "input_shapes"), (std::vector<std::string>{"float32[2,3]", "float32[2,3]"}));
  EXPECT_EQ(strings_arg(add, "output_shapes"), std::vector<std::string>{"float32[2,3]"});
  EXPECT_EQ(str_arg(nodes[1], "backend"), "CUDAExecutionProvider");
  EXPECT_EQ(str_arg(nodes[1], "precision"), "fp16");  // from its output
  const auto sessions = of_category(p.events, "session");
  ASSERT_EQ(sessions.size(), 2u);  // the executor's span repeats model_run's: left out
  EXPECT_EQ(sessions[0].name, "onnxruntime run");
  // Left out and counted: the fence event and the Kernel event.
  EXPECT_EQ(p.skipped, 2);
  EXPECT_EQ(p.skipped_categories, (std::vector<std::string>{"Node (not *_kernel_time)", "Kernel"}));
  // Without shapes; and as an object with "traceEvents".
  const profiler::OrtProfile bare =
      profiler::parse_ort_profile(std::string(R"({"traceEvents":)") + kOrtProfile + "}", /*shapes=*/false);
  EXPECT_EQ(of_category(bare.events, "node").size(), 3u);
  EXPECT_EQ(of_category(bare.events, "node")[0].arg("input_shapes"), nullptr);
  XPURT_EXPECT_THROW_WITH(profiler::parse_ort_profile("not json", true), InvalidArgumentError, "is JSON");
  XPURT_EXPECT_THROW_WITH(profiler::parse_ort_profile(R"({"a": 1})", true), InvalidArgumentError, "JSON array");
}

TEST(OrtProfile, AlignPlacesEachRunAtItsStart) {
  profiler::OrtProfile p = profiler::parse_ort_profile(kOrtProfile, true);
  profiler::align_ort_profile(p, {5000000, 9000000});
  const auto nodes = of_category(p.events, "node");
  EXPECT_EQ(nodes[0].start_ns, 5000000 + 12000);   // run 1
  EXPECT_EQ(nodes[2].start_ns, 9000000 + 10000);   // run 2, placed by its own start
  EXPECT_EQ(p.runs[1].first, 9000000);
  // Counts differ: everything moves with the first pair, ORT's spacing kept.
  profiler::OrtProfile q = profiler::parse_ort_profile(kOrtProfile, true);
  profiler::align_ort_profile(q, {5000000});
  EXPECT_EQ(of_category(q.events, "node")[2].start_ns, 5000000 + 1010000);
}

TEST(OrtProfile, MergeIntoAProfiler) {
  const std::string path = write_temp("xpurt_test_ort_profile.json", kOrtProfile);
  Profiler profiler(host_only());
  profiler.start();
  XPURT_EXPECT_THROW_WITH(profiler.merge_ort_profile(path), InvalidArgumentError, "stop() it first");
  profiler.stop();
  // Nothing to pair ORT's runs with: the error names the options.
  XPURT_EXPECT_THROW_WITH(profiler.merge_ort_profile(path), InvalidArgumentError, "offset_us");
  OrtProfileMergeOptions at_offset;
  at_offset.offset_us = 250.0;
  const OrtProfileMergeResult r = profiler.merge_ort_profile(path, at_offset);
  EXPECT_EQ(r.node_events, 3);
  EXPECT_EQ(r.session_events, 2);
  EXPECT_EQ(r.skipped, 2);
  EXPECT_NE(r.alignment.find("offset_us"), std::string::npos) << r.alignment;
  const auto nodes = of_category(profiler.events(), "node");
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].start_ns, 250000 + 12000);
  std::set<std::uint64_t> ids;
  for (const auto& e : profiler.events()) EXPECT_TRUE(ids.insert(e.id).second) << "duplicate id " << e.id;
  // The summary and the table show ORT's nodes like native ones.
  const auto rows = profiler.summary();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].node, "add0");
  EXPECT_EQ(rows[0].calls, 2);
  EXPECT_EQ(rows[0].total_ns, 103000);
  EXPECT_EQ(rows[0].backend, "CPUExecutionProvider");
  EXPECT_EQ(rows[0].op_type, "Add");
  EXPECT_NE(profiler.summary_table().find("CUDAExecutionProvider"), std::string::npos);
  EXPECT_NE(profiler.metadata().at("ort_profiles_merged").find(path), std::string::npos);

  // By ORT's profiling start on the system clock: 1.5 ms after the profiler started.
  Profiler timed(host_only());
  timed.start();
  timed.stop();
  OrtProfileMergeOptions by_clock;
  by_clock.start_time_ns = std::stoll(timed.metadata().at("start_time_unix_ns")) + 1500000;
  timed.merge_ort_profile(path, by_clock);
  EXPECT_EQ(of_category(timed.events(), "node")[0].start_ns, 1500000 + 12000);

  XPURT_EXPECT_THROW_WITH(timed.merge_ort_profile("/nonexistent/ort.json", at_offset), InvalidArgumentError,
                          "cannot read");
  const std::string not_ort = write_temp("xpurt_test_not_ort.json", R"([{"cat":"Other","name":"x"}])");
  XPURT_EXPECT_THROW_WITH(timed.merge_ort_profile(not_ort, at_offset), InvalidArgumentError, "no ONNX Runtime node");
  std::filesystem::remove(not_ort);
  std::filesystem::remove(path);
}

TEST(OrtProfile, MergeIntoAChromeTrace) {
  const std::string path = write_temp("xpurt_test_ort_profile_chrome.json", kOrtProfile);
  Profiler profiler(host_only());
  profiler.start();
  { Profiler::Range r = Profiler::range("step"); }
  profiler.stop();
  OrtProfileMergeOptions options;
  options.offset_us = 10.0;
  OrtProfileMergeResult result;
  const std::string merged = Profiler::merge_ort_profile_into_chrome_trace(profiler.chrome_trace(), path, options,
                                                                           &result);
  EXPECT_EQ(result.node_events, 3);
  const nlohmann::json trace = nlohmann::json::parse(merged);
  std::vector<nlohmann::json> nodes;
  bool range = false, ort_process = false;
  std::set<std::int64_t> ids;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") {
      EXPECT_TRUE(ids.insert(e.at("args").at("id").get<std::int64_t>()).second) << e.dump();
      if (e.at("cat") == "node") nodes.push_back(e);
      range |= e.at("cat") == "range";
    }
    if (e.at("ph") == "M" && e.at("name") == "process_name" && e.at("pid") == 77) ort_process = true;
  }
  EXPECT_TRUE(range);        // what the trace had stays
  EXPECT_TRUE(ort_process);  // ORT's process (pid 77 here) is named
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_DOUBLE_EQ(nodes[0].at("ts").get<double>(), 22.0);
  EXPECT_EQ(nodes[0].at("args").at("backend"), "CPUExecutionProvider");
  EXPECT_TRUE(trace.at("metadata").contains("ort_profiles_merged"));
  XPURT_EXPECT_THROW_WITH(Profiler::merge_ort_profile_into_chrome_trace("[]", path, options), InvalidArgumentError,
                          "traceEvents");
  std::filesystem::remove(path);
}

TEST(OrtProfile, OnnxRuntimeSessionNodesAreProfiled) {
  if (!has_ort_engine()) GTEST_SKIP() << "this build has no ONNX Runtime (onnxruntime engine)";
  InferenceSession session = ort_linear_relu_session();
  session.run({{"X", input(2)}});  // the first run: explain()'s profile, outside the Profiler
  const Explanation explanation = session.explain();
  ASSERT_FALSE(explanation.nodes.empty()) << explanation.str();
  Profiler profiler(host_only());
  profiler.start();
  session.run({{"X", input(2)}});
  session.run({{"X", input(3)}});
  profiler.stop();
  const std::vector<ProfileEvent> events = profiler.events();
  const auto nodes = of_category(events, "node");
  ASSERT_EQ(nodes.size(), 2 * explanation.nodes.size()) << explanation.str();
  std::vector<ProfileEvent> runs, ort_runs;
  for (const auto& e : of_category(events, "session")) {
    (e.name == "onnxruntime run" ? ort_runs : runs).push_back(e);
  }
  ASSERT_EQ(runs.size(), 2u);
  ASSERT_EQ(ort_runs.size(), 2u);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const ProfileEvent& e = nodes[i];
    const NodeExplanation& n = explanation.nodes[i % explanation.nodes.size()];
    EXPECT_EQ(e.name, n.node);
    EXPECT_EQ(str_arg(e, "op_type"), n.op_type);
    EXPECT_EQ(str_arg(e, "backend"), "CPUExecutionProvider");
    EXPECT_EQ(str_arg(e, "kernel"), n.kernel);  // explain()'s kernel: the execution provider
    EXPECT_EQ(e.pid, static_cast<std::int64_t>(::getpid()));
    EXPECT_GT(e.tid, 0);
    // Inside its session run and its ORT run (Note [ORT profile on the timeline]).
    const ProfileEvent& run = runs[i / explanation.nodes.size()];
    const ProfileEvent& ort_run = ort_runs[i / explanation.nodes.size()];
    EXPECT_GE(e.start_ns, run.start_ns);
    EXPECT_LE(e.start_ns + e.duration_ns, run.start_ns + run.duration_ns);
    EXPECT_GE(e.start_ns, ort_run.start_ns);
    EXPECT_LE(e.start_ns + e.duration_ns, ort_run.start_ns + ort_run.duration_ns + 1000);
  }
  // The shapes are those of each run.
  const auto last_outputs = strings_arg(nodes.back(), "output_shapes");
  EXPECT_EQ(last_outputs, std::vector<std::string>{"float32[3,3]"});
  EXPECT_EQ(str_arg(ort_runs[0], "device"), "cpu");
  // The summary has one row per ORT node, two calls each.
  const std::vector<NodeSummary> rows = profiler.summary();
  ASSERT_EQ(rows.size(), explanation.nodes.size());
  for (const auto& r : rows) {
    EXPECT_EQ(r.calls, 2) << r.node;
    EXPECT_EQ(r.backend, "CPUExecutionProvider");
  }
  // Runs after stop() are not profiled and record nothing; explain() keeps its report.
  session.run({{"X", input(2)}});
  EXPECT_EQ(profiler.events().size(), events.size());
  EXPECT_EQ(session.explain().nodes.size(), explanation.nodes.size());
}

TEST(OrtProfile, FirstRunUnderAProfilerServesBoth) {
  if (!has_ort_engine()) GTEST_SKIP() << "this build has no ONNX Runtime (onnxruntime engine)";
  InferenceSession session = ort_linear_relu_session();
  EXPECT_TRUE(session.explain().nodes.empty());
  Profiler profiler(host_only());
  profiler.start();
  session.run({{"X", input(1)}});
  profiler.stop();
  const Explanation explanation = session.explain();
  ASSERT_FALSE(explanation.nodes.empty());
  EXPECT_EQ(of_category(profiler.events(), "node").size(), explanation.nodes.size());
  for (const auto& n : explanation.nodes) EXPECT_EQ(n.backend, "onnxruntime");
}

TEST(OrtProfile, OnnxRuntimeCudaSessionRunsWithoutItsGraphWhileProfiling) {
  if (!has_ort_engine()) GTEST_SKIP() << "this build has no ONNX Runtime (onnxruntime engine)";
  XPURT_SKIP_WITHOUT_GPU();
  SessionOptions options;
  options.engine = "onnxruntime";
  options.device = Device::cuda(0);
  options.exec_policy.cuda_graphs = true;
  const Support support = EngineRegistry::global().find("onnxruntime")->available(options);
  if (!support) GTEST_SKIP() << "no ONNX Runtime CUDA execution provider: " << support.reason();
  InferenceSession session = InferenceSession::from_bytes(linear_relu_model(), options);
  const Tensor x = input(4).to(Device::cuda(0));
  auto host = [](const Tensor& t) {
    const Tensor h = t.to(Device::cpu());
    const float* p = static_cast<const float*>(h.data_ptr());
    return std::vector<float>(p, p + h.numel());
  };
  // The same kernels, eager or replayed: equal up to rounding.
  auto near = [](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::fabs(a[i] - b[i]) > 1e-4f * (1.0f + std::fabs(b[i]))) return false;
    }
    return true;
  };
  const std::vector<float> expected = host(session.run({{"X", x}})[0]);  // the first run: explain()'s profile
  session.run({{"X", x}});                                               // captures the graph
  session.run({{"X", x}});                                               // replays it
  const Explanation explanation = session.explain();
  ASSERT_FALSE(explanation.nodes.empty()) << explanation.str();
  Profiler profiler;  // CUPTI when it can be had
  profiler.start();
  EXPECT_TRUE(near(host(session.run({{"X", x}})[0]), expected));
  EXPECT_TRUE(near(host(session.run({{"X", x}})[0]), expected));
  profiler.stop();
  const std::vector<ProfileEvent> events = profiler.events();
  const auto nodes = of_category(events, "node");
  ASSERT_EQ(nodes.size(), 2 * explanation.nodes.size()) << explanation.str();
  bool on_cuda = false;
  for (const auto& n : nodes) on_cuda |= str_arg(n, "backend") == "CUDAExecutionProvider";
  EXPECT_TRUE(on_cuda);
  std::size_t ort_runs = 0;
  for (const auto& e : of_category(events, "session")) {
    if (e.name != "onnxruntime run") continue;
    ++ort_runs;
    EXPECT_EQ(str_arg(e, "cuda_graph"), "enabled; run eagerly while profiling");
    EXPECT_EQ(str_arg(e, "device"), "cuda:0");
  }
  EXPECT_EQ(ort_runs, 2u);
  EXPECT_TRUE(profiler.metadata().count("cuda_graphs"));
  if (profiler.cuda_activity()) {
    EXPECT_FALSE(of_category(events, "kernel").empty()) << "CUPTI saw none of ORT's kernels";
  }
  // Afterwards the graph replays again, with the same results.
  EXPECT_TRUE(near(host(session.run({{"X", x}})[0]), expected));
}

TEST(Profiler, CuptiKernelNamesAreDemangled) {
  // CUPTI reports kernels by their mangled symbols; the trace shows them demangled (the mangled one stays in args).
  EXPECT_EQ(profiler::demangle_kernel_name("_Z10add_kernelPfPKfi"), "add_kernel(float*, float const*, int)");
  EXPECT_EQ(profiler::demangle_kernel_name(
                "_ZN7cutlass6KernelINS_4gemm6kernel4GemmINS1_11threadblock9MmaPolicyIfLi4EEEEEEEvNT_6ParamsE"),
            "void cutlass::Kernel<cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPolicy<float, 4> > >"
            "(cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPolicy<float, 4> >::Params)");
  EXPECT_EQ(profiler::demangle_kernel_name("sm90_xmma_gemm_f16f16_f16f32"), "sm90_xmma_gemm_f16f16_f16f32");
  EXPECT_EQ(profiler::demangle_kernel_name("_Znot a symbol"), "_Znot a symbol");
  EXPECT_EQ(profiler::demangle_kernel_name(nullptr), "");
}
