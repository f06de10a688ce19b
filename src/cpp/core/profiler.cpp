// Profiler: the event collector, NVTX ranges, summaries and the Chrome trace (see profiler.h).
//
// Note [Kernel to node correlation]
// The native engine's GraphExec records one host-timed "node" event per plan step and, around the step's launches,
// pushes that event's id as a CUPTI external correlation id (CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0). CUPTI then
// reports, for every CUDA API call made meanwhile, an external-correlation record tying the call's correlation id to
// our id; kernels, copies and sets carry the correlation id of the call that launched them. So at stop() each device
// record finds its node: record.correlationId -> external id -> node event (ProfileEvent::parent), and the Chrome
// trace draws a flow arrow from the node to each of its kernels.
// A CUDA graph replay is one API call for every kernel of the graph, so this cannot attribute a replay's kernels to
// nodes: while a profiler records, GraphExec runs its steps eagerly instead of replaying its graph (the graph stays
// instantiated and replays again once profiling stops); the trace's metadata says so ("cuda_graphs"). Eager
// launches cost more host time than a replay, but the kernels and their device times are the same.
//
// Note [Profiler clocks]
// Host events use std::chrono::steady_clock, relative to start(). CUPTI timestamps come from CUPTI's own clock;
// start() samples both and stop() maps device times onto the host clock with that offset.
#include "xpuruntime/profiler.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/profiler_cupti.h"
#include "xpuruntime/caching_allocator.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/device.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/version.h"

#if XPURT_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace xpuruntime {
namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool env_nvtx() {
#if XPURT_WITH_NVTX
  const char* v = std::getenv("XPURT_NVTX");
  return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
#else
  return false;
#endif
}

std::uint32_t idle_state() { return env_nvtx() ? profiler::kNvtx : 0u; }

std::int64_t os_thread_id() {
  thread_local const std::int64_t tid = static_cast<std::int64_t>(::syscall(SYS_gettid));
  return tid;
}

// What the recording profiler collects. Never destroyed (events may arrive from threads during exit).
struct Collector {
  std::mutex mutex;
  std::vector<ProfileEvent> events;
  const Profiler* owner = nullptr;
  // Read by recording threads without the mutex: atomics, set by start() before recording begins.
  std::atomic<std::int64_t> origin_ns{0};  // steady clock at start()
  std::atomic<bool> record_shapes{true};
  std::atomic<bool> cupti{false};
  std::atomic<bool> graph_tracking{false};  // Note [Graph node attribution] (profiler_graph.cpp)
  std::atomic<std::uint64_t> next_id{1};
};

Collector& collector() {
  static Collector* c = new Collector();
  return *c;
}

thread_local std::int64_t range_depth = 0;

#if XPURT_WITH_NVTX
nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("xpuruntime");
  return domain;
}
#endif

std::string us_text(std::int64_t ns) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << static_cast<double>(ns) / 1000.0;
  return os.str();
}

std::string pad(const std::string& s, std::size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

nlohmann::json arg_json(const ProfileArg& a) {
  return std::visit([](const auto& v) { return nlohmann::json(v); }, a);
}

std::string arg_string(const ProfileEvent& e, const std::string& key) {
  const ProfileArg* a = e.arg(key);
  if (a == nullptr) return {};
  if (const auto* s = std::get_if<std::string>(a)) return *s;
  return {};
}

std::int64_t arg_int(const ProfileEvent& e, const std::string& key) {
  const ProfileArg* a = e.arg(key);
  if (a == nullptr) return 0;
  if (const auto* i = std::get_if<std::int64_t>(a)) return *i;
  if (const auto* d = std::get_if<double>(a)) return static_cast<std::int64_t>(*d);
  return 0;
}

bool is_device_work(const ProfileEvent& e) {
  return e.device && (e.category == "kernel" || e.category == "memcpy" || e.category == "memset");
}

double arg_double(const ProfileEvent& e, const std::string& key) {
  const ProfileArg* a = e.arg(key);
  if (a == nullptr) return 0.0;
  if (const auto* d = std::get_if<double>(a)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(a)) return static_cast<double>(*i);
  return 0.0;
}

std::vector<std::string> arg_strings(const ProfileEvent& e, const std::string& key) {
  const ProfileArg* a = e.arg(key);
  if (a == nullptr) return {};
  if (const auto* v = std::get_if<std::vector<std::string>>(a)) return *v;
  return {};
}

// A node event's roofline work (Note [Roofline work] in core/roofline.cpp): what the engine recorded (native
// steps: flops, floor_bytes, ceiling), else from its op type and shapes (ONNX Runtime's nodes). Views have none.
roofline::NodeWork event_work(const ProfileEvent& e) {
  roofline::NodeWork w;
  if (e.arg("ceiling") != nullptr) {
    w.flops = arg_double(e, "flops");
    w.bytes = arg_double(e, "floor_bytes");
    w.ceiling = arg_string(e, "ceiling");
    return w;
  }
  if (arg_string(e, "kind") == "view" || e.arg("device") != nullptr || e.arg("input_shapes") == nullptr) return w;
  return roofline::onnx_node_work(arg_string(e, "op_type"), arg_strings(e, "input_shapes"),
                                  arg_strings(e, "output_shapes"));
}

// Whose ceilings hold for a node event: its "device" arg, else its execution provider's device (ORT's nodes).
std::string event_device(const ProfileEvent& e) {
  std::string device = arg_string(e, "device");
  if (!device.empty()) return device;
  return arg_string(e, "backend").find("CUDA") != std::string::npos ? "cuda:0" : "cpu";
}

// Fills the roofline fields of `rows` (their floors summed over calls, `work` the calls' work and row) on the
// ceilings of each row's device.
void fill_rooflines(std::vector<NodeSummary>& rows,
                    const std::vector<std::pair<std::size_t, roofline::NodeWork>>& work,
                    const std::function<roofline::DeviceCeilings(const std::string&, const std::vector<std::string>&)>&
                        ceilings_of) {
  std::map<std::string, std::set<std::string>> keys;  // device -> the ceilings its nodes need
  for (const auto& [row, w] : work) {
    if (w.known()) keys[rows[row].device].insert(w.ceiling);
  }
  std::map<std::string, roofline::DeviceCeilings> ceilings;
  for (const auto& [device, needed] : keys) {
    ceilings[device] = ceilings_of(device, std::vector<std::string>(needed.begin(), needed.end()));
  }
  std::vector<double> floor_ns(rows.size(), 0.0);
  std::vector<double> compute_ns(rows.size(), 0.0);
  for (const auto& [row, w] : work) {
    if (!w.known()) continue;
    NodeSummary& s = rows[row];
    s.flops += w.flops;
    s.floor_bytes += w.bytes;
    s.ceiling = w.ceiling;
    const roofline::DeviceCeilings& c = ceilings[s.device];
    const roofline::Floor f = roofline::floor_of(w, c);
    floor_ns[row] += f.ns;
    if (f.bound == "compute") compute_ns[row] += f.ns;
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    NodeSummary& s = rows[i];
    s.floor_ns = static_cast<std::int64_t>(floor_ns[i] + 0.5);
    s.efficiency = roofline::efficiency(floor_ns[i], static_cast<double>(s.total_ns));
    if (floor_ns[i] > 0) s.bound = compute_ns[i] * 2 > floor_ns[i] ? "compute" : "memory";
  }
}

}  // namespace

#if !XPURT_WITH_CUPTI
namespace profiler_detail {
bool cupti_start(std::string* why) {
  *why = "this xpuruntime was built without CUPTI (the CUDA toolkit's cupti.h was not found at configure time)";
  return false;
}
CuptiResult cupti_stop() { return {}; }
std::int64_t cupti_clock_offset_ns() { return 0; }
void cupti_push(std::uint64_t) {}
void cupti_pop() {}
bool cupti_graph_tracking_start(std::string* why) {
  *why = "this build has no CUPTI";
  return false;
}
void cupti_graph_tracking_stop() {}
}  // namespace profiler_detail
#endif

// ---- the hot-path interface ----

namespace profiler {

std::atomic<std::uint32_t> g_state{idle_state()};

std::int64_t now_ns() { return steady_ns() - collector().origin_ns.load(std::memory_order_relaxed); }

bool record_shapes() { return collector().record_shapes.load(std::memory_order_relaxed); }

std::uint64_t next_event_id() { return collector().next_id.fetch_add(1, std::memory_order_relaxed); }

void record(ProfileEvent event) {
  if (!recording()) return;
  try {
    if (event.id == 0) event.id = next_event_id();
    if (event.pid == 0 && !event.device) event.pid = static_cast<std::int64_t>(::getpid());
    if (event.tid == 0 && !event.device) event.tid = os_thread_id();
    Collector& c = collector();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.owner != nullptr) c.events.push_back(std::move(event));
  } catch (...) {
    // Out of host memory while profiling: the event is lost, the work it describes is not disturbed.
  }
}

void record_allocation(const std::string& device, const char* what, std::int64_t bytes, std::int64_t allocated_bytes,
                       const void* ptr) {
  if (!recording()) return;
  try {
    ProfileEvent e;
    e.name = what;
    e.category = "alloc";
    e.start_ns = now_ns();
    std::ostringstream address;
    address << ptr;
    e.args = {{"device", device}, {"bytes", bytes}, {"allocated_bytes", allocated_bytes}, {"address", address.str()}};
    record(std::move(e));
  } catch (...) {
    // As in record(): profiling never makes an allocation or a free fail.
  }
}

void nvtx_push(const char* name) {
#if XPURT_WITH_NVTX
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  nvtxDomainRangePushEx(nvtx_domain(), &attributes);
#else
  (void)name;
#endif
}

void nvtx_pop() {
#if XPURT_WITH_NVTX
  nvtxDomainRangePop(nvtx_domain());
#endif
}

bool graph_tracking() { return collector().graph_tracking.load(std::memory_order_relaxed); }

void push_correlation(std::uint64_t event_id) {
  if (collector().cupti.load(std::memory_order_relaxed)) profiler_detail::cupti_push(event_id);
}

void pop_correlation() {
  if (collector().cupti.load(std::memory_order_relaxed)) profiler_detail::cupti_pop();
}

}  // namespace profiler

// ---- ProfileEvent ----

const ProfileArg* ProfileEvent::arg(const std::string& key) const {
  for (const auto& [k, v] : args) {
    if (k == key) return &v;
  }
  return nullptr;
}

// ---- Range ----

Profiler::Range::Range(std::string name) : name_(std::move(name)) {
  const std::uint32_t state = profiler::state();
  profiler::nvtx_push(name_.c_str());
  open_ = true;
  depth_ = range_depth++;
  start_ns_ = (state & profiler::kRecording) ? profiler::now_ns() : -1;
}

Profiler::Range::Range(Range&& other) noexcept { *this = std::move(other); }

Profiler::Range& Profiler::Range::operator=(Range&& other) noexcept {
  if (this != &other) {
    end();
    name_ = std::move(other.name_);
    start_ns_ = other.start_ns_;
    depth_ = other.depth_;
    open_ = other.open_;
    other.open_ = false;
  }
  return *this;
}

void Profiler::Range::end() {
  if (!open_) return;
  open_ = false;
  profiler::nvtx_pop();
  if (range_depth > 0) --range_depth;
  if (start_ns_ < 0 || !profiler::recording()) return;
  ProfileEvent e;
  e.name = name_;
  e.category = "range";
  e.start_ns = start_ns_;
  e.duration_ns = profiler::now_ns() - start_ns_;
  e.args = {{"depth", depth_}};
  profiler::record(std::move(e));
}

// ---- Profiler ----

Profiler::Profiler(ProfilerOptions options) : options_(options) {}

Profiler::~Profiler() {
  try {
    stop();
  } catch (...) {
    // A destructor does not throw; the CUPTI records are lost.
  }
}

void Profiler::start() {
  Collector& c = collector();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.owner == this) throw InvalidArgumentError("this profiler is already recording; stop() it first");
    if (c.owner != nullptr) {
      throw InvalidArgumentError("another profiler is recording in this process; one profiler records at a time");
    }
  }
  cuda_activity_ = false;
  cuda_reason_.clear();
  if (options_.cuda == ProfilerOptions::CudaActivity::kOff) {
    cuda_reason_ = "off (ProfilerOptions.cuda)";
  } else if (DeviceManager::instance().get_device_count() == 0) {
    cuda_reason_ = "no CUDA device: " + DeviceManager::instance().cuda_unavailable_reason();
  } else {
    std::string why;
    cuda_activity_ = profiler_detail::cupti_start(&why);
    if (!cuda_activity_) cuda_reason_ = why;
  }
  // Note [Graph node attribution] (profiler_graph.cpp)
  std::string graph_why = cuda_activity_ ? "" : "no CUDA activity";
  const bool graph_tracking = cuda_activity_ && profiler_detail::cupti_graph_tracking_start(&graph_why);
  if (!cuda_activity_ && options_.cuda == ProfilerOptions::CudaActivity::kOn) {
    throw UnsupportedOperationError("CUDA activity was asked for (cuda=True) but cannot be recorded: " + cuda_reason_);
  }
  std::int64_t unix_start_ns = 0;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.owner != nullptr) {
      if (cuda_activity_) (void)profiler_detail::cupti_stop();
      if (graph_tracking) profiler_detail::cupti_graph_tracking_stop();
      throw InvalidArgumentError("another profiler is recording in this process; one profiler records at a time");
    }
    c.owner = this;
    c.graph_tracking = graph_tracking;
    c.events.clear();
    c.origin_ns = steady_ns();
    // The same instant on the system clock: places profiles timed by it (merge_ort_profile's start_time_ns).
    unix_start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    c.record_shapes = options_.record_shapes;
    c.cupti = cuda_activity_;
    c.next_id.store(1, std::memory_order_relaxed);
  }
  events_.clear();
  metadata_.clear();
  metadata_["xpuruntime_version"] = get_version();
  metadata_["start_time_unix_ns"] = std::to_string(unix_start_ns);
  metadata_["cuda_activity"] = cuda_activity_ ? "cupti" : "off: " + cuda_reason_;
  if (cuda_activity_) {
    metadata_["cuda_graph_replays"] =
        graph_tracking ? "replayed; kernels attributed to nodes through CUPTI graph node ids"
                       : "run eagerly while profiling (graph node tracking unavailable: " + graph_why + ")";
  }
  metadata_["record_shapes"] = options_.record_shapes ? "true" : "false";
  recording_ = true;
  profiler::g_state.store(profiler::kRecording | profiler::kNvtx, std::memory_order_relaxed);
}

void Profiler::stop() {
  if (!recording_) return;
  profiler::g_state.store(idle_state(), std::memory_order_relaxed);
  Collector& c = collector();
  std::int64_t origin = 0;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    events_ = std::move(c.events);
    c.events.clear();
    c.owner = nullptr;
    c.cupti = false;
    c.graph_tracking = false;
    origin = c.origin_ns.load();
  }
  recording_ = false;
  const std::int64_t stop_ns = steady_ns() - origin;
  metadata_["duration_us"] = us_text(stop_ns);
  bool eager_while_profiling = false;
  for (const auto& e : events_) {
    // The native engine's captured plans, and onnxruntime-engine sessions with CUDA graphs.
    const std::string graph = arg_string(e, "cuda_graph");
    if (e.category == "session" &&
        (graph == "captured; run eagerly while profiling" || graph == "enabled; run eagerly while profiling")) {
      eager_while_profiling = true;
    }
  }
  if (eager_while_profiling) {
    metadata_["cuda_graphs"] =
        "CUDA graph replays ran eagerly while profiling, so that every node is seen and each kernel is attributed "
        "to its node; the graphs replay again afterwards (docs/profiling.md)";
  }
  if (cuda_activity_) {
    profiler_detail::CuptiResult r = profiler_detail::cupti_stop();
    profiler_detail::cupti_graph_tracking_stop();
    profiler_detail::GraphReplayNodes replay_nodes;  // Note [Graph node attribution]
    // Note [Profiler clocks]
    const std::int64_t offset = profiler_detail::cupti_clock_offset_ns();
    std::unordered_map<std::uint64_t, std::int64_t> node_tid;  // node event id -> its OS thread
    for (const auto& e : events_) {
      if (e.category == "node") node_tid[e.id] = e.tid;
    }
    // CUPTI names threads its own way; the API calls made inside node events tell which OS thread each one is.
    std::unordered_map<std::uint32_t, std::int64_t> os_thread;
    for (const auto& [correlation, external] : r.external) {
      auto t = r.thread_of.find(correlation);
      auto n = node_tid.find(external);
      if (t != r.thread_of.end() && n != node_tid.end()) os_thread[t->second] = n->second;
    }
    // The OS thread that made the CUDA API call `correlation` (CUPTI's own thread id when unknown; 0 when unseen).
    auto calling_thread = [&](std::uint32_t correlation) -> std::int64_t {
      auto t = r.thread_of.find(correlation);
      if (t == r.thread_of.end()) return 0;
      auto os = os_thread.find(t->second);
      return os != os_thread.end() ? os->second : static_cast<std::int64_t>(t->second);
    };
    const auto pid = static_cast<std::int64_t>(::getpid());
    std::uint64_t next_id = c.next_id.load(std::memory_order_relaxed);
    std::size_t attributed = 0;
    for (auto& rec : r.records) {
      ProfileEvent e;
      e.id = next_id++;
      e.name = std::move(rec.name);
      e.category = rec.category;
      e.start_ns = static_cast<std::int64_t>(rec.start) - offset - origin;
      e.duration_ns = rec.end > rec.start ? static_cast<std::int64_t>(rec.end - rec.start) : 0;
      e.args = std::move(rec.args);
      if (rec.category == "sync") {
        e.pid = pid;  // a host thread waiting
        e.tid = calling_thread(rec.correlation);
      } else {
        e.device = true;
        e.pid = rec.device;
        e.tid = rec.stream;
        e.args.emplace_back("device", "cuda:" + std::to_string(rec.device));
        e.args.emplace_back("stream", rec.stream);
        auto ext = r.external.find(rec.correlation);
        if (ext != r.external.end() && node_tid.count(ext->second)) {
          e.parent = ext->second;
          ++attributed;
        } else if (rec.graph_node != 0) {
          const std::uint64_t parent =
              replay_nodes.parent_of(rec, e.start_ns, e.duration_ns, calling_thread(rec.correlation), next_id);
          if (parent != 0) {
            e.parent = parent;
            e.args.emplace_back("graph_node", static_cast<std::int64_t>(rec.graph_node));
            ++attributed;
          }
        }
      }
      events_.push_back(std::move(e));
    }
    metadata_["cuda_graph_replay_nodes"] = std::to_string(replay_nodes.size());
    replay_nodes.emit(events_);
    for (auto& e : events_) {
      if (e.pid == 0 && e.category == "node") e.pid = pid;
    }
    metadata_["cupti_records"] = std::to_string(r.records.size());
    metadata_["cupti_attributed_to_nodes"] = std::to_string(attributed);
    metadata_["cupti_dropped"] = std::to_string(r.dropped);
  }
  // Node events carry what their device work did: kernel names and device time.
  std::unordered_map<std::uint64_t, std::size_t> index;
  for (std::size_t i = 0; i < events_.size(); ++i) index[events_[i].id] = i;
  std::unordered_map<std::uint64_t, std::pair<std::int64_t, std::vector<std::string>>> device_work;
  for (const auto& e : events_) {
    if (e.parent == 0 || !is_device_work(e)) continue;
    auto& w = device_work[e.parent];
    w.first += e.duration_ns;
    if (e.category == "kernel" && std::find(w.second.begin(), w.second.end(), e.name) == w.second.end()) {
      w.second.push_back(e.name);
    }
  }
  for (auto& [id, w] : device_work) {
    auto it = index.find(id);
    if (it == index.end()) continue;
    ProfileEvent& node = events_[it->second];
    node.args.emplace_back("device_us", static_cast<double>(w.first) / 1000.0);
    if (!w.second.empty()) node.args.emplace_back("device_kernels", w.second);
  }
  std::stable_sort(events_.begin(), events_.end(),
                   [](const ProfileEvent& a, const ProfileEvent& b) { return a.start_ns < b.start_ns; });
}

std::vector<ProfileEvent> Profiler::events() const {
  if (!recording_) return events_;
  Collector& c = collector();
  std::vector<ProfileEvent> out;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    out = c.events;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ProfileEvent& a, const ProfileEvent& b) { return a.start_ns < b.start_ns; });
  return out;
}

std::vector<NodeSummary> Profiler::summary() const { return summary(std::string()); }

std::vector<NodeSummary> Profiler::summary(const std::string& within) const {
  const std::vector<ProfileEvent> all = events();
  // The host intervals of the ranges named `within`: a node event counts when it starts inside one.
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const auto& e : all) {
    if (!within.empty() && e.category == "range" && e.name == within) {
      ranges.emplace_back(e.start_ns, e.start_ns + e.duration_ns);
    }
  }
  const auto counted = [&](const ProfileEvent& e) {
    return within.empty() || std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) {
             return e.start_ns >= r.first && e.start_ns < r.second;
           });
  };
  std::unordered_map<std::uint64_t, std::int64_t> device_ns;  // node event id -> its device work
  for (const auto& e : all) {
    if (e.parent != 0 && is_device_work(e)) device_ns[e.parent] += e.duration_ns;
  }
  std::vector<NodeSummary> rows;
  std::unordered_map<std::string, std::size_t> row_of;
  std::vector<std::pair<std::size_t, roofline::NodeWork>> work;  // per node event: its row and its work
  for (const auto& e : all) {
    if (e.category != "node" || !counted(e)) continue;
    auto [it, inserted] = row_of.emplace(e.name, rows.size());
    if (inserted) {
      NodeSummary s;
      s.node = e.name;
      s.op_type = arg_string(e, "op_type");
      s.kernel = arg_string(e, "kernel");
      s.backend = arg_string(e, "backend");
      s.precision = arg_string(e, "precision");
      s.op = arg_string(e, "op");
      s.reason = arg_string(e, "reason");
      s.device = event_device(e);
      rows.push_back(std::move(s));
    }
    work.emplace_back(it->second, event_work(e));
    NodeSummary& s = rows[it->second];
    s.calls += 1;
    auto d = device_ns.find(e.id);
    s.total_ns += d != device_ns.end() ? d->second : e.duration_ns;
    s.bytes += arg_int(e, "bytes");
    if (const ProfileArg* k = e.arg("device_kernels")) {
      for (const auto& name : std::get<std::vector<std::string>>(*k)) {
        if (std::find(s.device_kernels.begin(), s.device_kernels.end(), name) == s.device_kernels.end()) {
          s.device_kernels.push_back(name);
        }
      }
    }
  }
  std::int64_t sum = 0;
  for (const auto& s : rows) sum += s.total_ns;
  for (auto& s : rows) s.share = sum > 0 ? static_cast<double>(s.total_ns) / static_cast<double>(sum) : 0.0;
  fill_rooflines(rows, work, [this](const std::string& device, const std::vector<std::string>& keys) {
    return ceilings_with(device, keys);
  });
  std::stable_sort(rows.begin(), rows.end(),
                   [](const NodeSummary& a, const NodeSummary& b) { return a.total_ns > b.total_ns; });
  return rows;
}

std::vector<NodeSummary> Profiler::audit(std::size_t top) const {
  std::vector<NodeSummary> rows;
  for (auto& s : summary()) {
    if (s.floor_ns > 0) rows.push_back(std::move(s));
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const NodeSummary& a, const NodeSummary& b) { return a.lost_share() > b.lost_share(); });
  if (top != 0 && rows.size() > top) rows.resize(top);
  return rows;
}

void Profiler::set_ceilings(const std::string& device_type, const std::map<std::string, double>& figures) {
  const Device device = Device::parse(device_type);  // "cpu", "cuda", "cuda:1"; InvalidArgumentError otherwise
  std::string text;
  for (const auto& [key, value] : figures) {
    std::ostringstream entry;
    entry << std::setprecision(17) << key << "=" << value;
    text += (text.empty() ? "" : ",") + entry.str();
  }
  const std::map<std::string, double> checked = roofline::parse_overrides(text);
  const bool one_device = device_type.find(':') != std::string::npos;
  auto& slot = ceiling_overrides_[one_device ? device.str() : std::string(device.is_cuda() ? "cuda" : "cpu")];
  for (const auto& [key, value] : checked) slot[key] = value;
}

roofline::DeviceCeilings Profiler::ceilings(const std::string& device) const {
  std::vector<std::string> keys;
  for (const auto& k : roofline::ceiling_keys()) {
    if (k != "bandwidth") keys.push_back(k);
  }
  return ceilings_with(device, keys);
}

roofline::DeviceCeilings Profiler::ceilings_with(const std::string& device, const std::vector<std::string>& keys) const {
  const Device d = Device::parse(device);
  std::map<std::string, double> overrides;
  for (const std::string& scope : {std::string(d.is_cuda() ? "cuda" : "cpu"), d.str()}) {
    auto it = ceiling_overrides_.find(scope);
    if (it == ceiling_overrides_.end()) continue;
    for (const auto& [k, v] : it->second) overrides[k] = v;
  }
  return roofline::ceilings(d.str(), keys, overrides);
}

std::string Profiler::summary_table(std::size_t max_rows, const std::string& within) const {
  const std::vector<NodeSummary> rows = summary(within);
  const std::size_t shown = max_rows == 0 ? rows.size() : std::min(rows.size(), max_rows);
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"node", "op_type", "kernel", "backend", "precision", "calls", "total_us", "mean_us", "share",
                   "bytes", "floor_us", "efficiency"});
  std::int64_t total = 0;
  for (const auto& s : rows) total += s.total_ns;
  for (std::size_t i = 0; i < shown; ++i) {
    const NodeSummary& s = rows[i];
    std::ostringstream share;
    share << std::fixed << std::setprecision(1) << 100.0 * s.share << "%";
    std::ostringstream efficiency;
    if (s.floor_ns > 0) efficiency << std::fixed << std::setprecision(0) << 100.0 * s.efficiency << "%";
    cells.push_back({s.node, s.op_type, s.kernel, s.backend, s.precision, std::to_string(s.calls),
                     us_text(s.total_ns), us_text(static_cast<std::int64_t>(s.mean_ns())), share.str(),
                     format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(s.bytes, 0))),
                     s.floor_ns > 0 ? us_text(s.floor_ns) : "-", s.floor_ns > 0 ? efficiency.str() : "-"});
  }
  std::vector<std::size_t> width(cells[0].size(), 0);
  for (const auto& row : cells) {
    for (std::size_t k = 0; k < row.size(); ++k) width[k] = std::max(width[k], row[k].size());
  }
  std::string out;
  for (const auto& row : cells) {
    for (std::size_t k = 0; k < row.size(); ++k) {
      const bool numeric = k >= 5;
      out += (k ? "  " : "") + pad(row[k], width[k], numeric);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  if (shown < rows.size()) out += "... " + std::to_string(rows.size() - shown) + " more nodes\n";
  out += "total " + us_text(total) + " us over " + std::to_string(rows.size()) + " nodes";
  out += cuda_activity_ ? " (device time from CUPTI where kernels were seen)\n" : " (host time)\n";
  return out;
}

MemoryEventsSummary Profiler::memory() const {
  MemoryEventsSummary m;
  for (const auto& e : events()) {
    if (e.category != "alloc") continue;
    MemoryEventsSummary::PerDevice& d = m.devices[arg_string(e, "device")];
    const std::int64_t bytes = arg_int(e, "bytes");
    if (e.name == "allocate") {
      d.allocations += 1;
      d.allocated_bytes += bytes;
      m.total.allocations += 1;
      m.total.allocated_bytes += bytes;
    } else {
      d.frees += 1;
      d.freed_bytes += bytes;
      m.total.frees += 1;
      m.total.freed_bytes += bytes;
    }
    d.peak_bytes = std::max(d.peak_bytes, arg_int(e, "allocated_bytes"));
    m.total.peak_bytes = std::max(m.total.peak_bytes, d.peak_bytes);
  }
  return m;
}

std::string Profiler::chrome_trace() const {
  using nlohmann::json;
  const std::vector<ProfileEvent> all = events();
  const auto host_pid = static_cast<std::int64_t>(::getpid());
  json trace = json::array();
  auto us = [](std::int64_t ns) { return static_cast<double>(ns) / 1000.0; };
  std::set<std::pair<std::int64_t, std::int64_t>> host_threads;
  std::set<std::pair<std::int64_t, std::int64_t>> device_streams;
  std::set<std::int64_t> devices;
  std::unordered_map<std::uint64_t, const ProfileEvent*> by_id;
  for (const auto& e : all) by_id[e.id] = &e;
  std::int64_t flow_id = 0;
  for (const auto& e : all) {
    (e.device ? device_streams : host_threads).insert({e.pid, e.tid});
    if (e.device) devices.insert(e.pid);
    json args = json::object();
    for (const auto& [k, v] : e.args) args[k] = arg_json(v);
    args["id"] = e.id;
    if (e.parent) args["parent"] = e.parent;
    if (e.category == "alloc") {
      trace.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "i"}, {"s", "t"}, {"ts", us(e.start_ns)},
                       {"pid", e.pid}, {"tid", e.tid}, {"args", args}});
      trace.push_back({{"name", "allocated bytes"}, {"ph", "C"}, {"ts", us(e.start_ns)}, {"pid", e.pid},
                       {"args", {{arg_string(e, "device"), arg_int(e, "allocated_bytes")}}}});
      continue;
    }
    trace.push_back({{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"ts", us(e.start_ns)},
                     {"dur", us(e.duration_ns)}, {"pid", e.pid}, {"tid", e.tid}, {"args", args}});
    if (e.parent != 0) {
      auto p = by_id.find(e.parent);
      if (p == by_id.end()) continue;
      const ProfileEvent& node = *p->second;
      ++flow_id;
      trace.push_back({{"name", "launch"}, {"cat", "flow"}, {"ph", "s"}, {"id", flow_id}, {"ts", us(node.start_ns)},
                       {"pid", node.pid}, {"tid", node.tid}});
      trace.push_back({{"name", "launch"}, {"cat", "flow"}, {"ph", "f"}, {"bp", "e"}, {"id", flow_id},
                       {"ts", us(e.start_ns)}, {"pid", e.pid}, {"tid", e.tid}});
    }
  }
  json meta = json::array();
  meta.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", host_pid}, {"tid", 0},
                  {"args", {{"name", "xpuruntime (host)"}}}});
  meta.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", host_pid}, {"tid", 0},
                  {"args", {{"sort_index", 0}}}});
  for (const auto& [pid, tid] : host_threads) {
    meta.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                    {"args", {{"name", "thread " + std::to_string(tid)}}}});
  }
  for (std::int64_t d : devices) {
    meta.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", d}, {"tid", 0},
                    {"args", {{"name", "cuda:" + std::to_string(d)}}}});
    meta.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", d}, {"tid", 0},
                    {"args", {{"sort_index", 1 + d}}}});
  }
  for (const auto& [pid, tid] : device_streams) {
    meta.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                    {"args", {{"name", "stream " + std::to_string(tid)}}}});
  }
  for (auto& m : trace) meta.push_back(std::move(m));
  json metadata = json::object();
  for (const auto& [k, v] : metadata_) metadata[k] = v;
  json root = {{"traceEvents", meta}, {"displayTimeUnit", "ms"}, {"metadata", metadata}};
  return root.dump(-1, ' ', false, json::error_handler_t::replace);
}

void Profiler::export_chrome_trace(const std::string& path) const {
  const std::string text = chrome_trace();
  std::ofstream file(path, std::ios::binary);
  XPURT_CHECK(file.good(), "cannot write the Chrome trace to '", path, "'");
  file << text;
  XPURT_CHECK(file.good(), "writing the Chrome trace to '", path, "' failed");
}

}  // namespace xpuruntime
