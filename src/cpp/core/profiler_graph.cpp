// CUDA graph replays under the Profiler: labels for plan steps, the graph node -> label table, and the node events
// built from a replay's device records.
//
// Note [Graph node attribution]
// A CUDA graph replay is one API call for all of the graph's kernels, so CUPTI's correlation ids (Note [Kernel to
// node correlation] in profiler.cpp) tie every kernel of a replay to the replay, not to the plan step that launched
// it during capture. CUPTI does tell which graph node ran each kernel, copy or set (graphNodeId in the activity
// records), and it reports, through resource callbacks, every graph node created (a stream capture adds one per
// launch, on the capturing thread) and every node cloned (cudaGraphInstantiate clones the captured graph's nodes into
// the executable graph, whose node ids are the ones the records carry). So:
//  - GraphExec registers one label per plan step, with the step's node event as a proto (register_graph_label), and
//    captures each step inside a GraphLabelScope;
//  - while a profiler records with CUPTI, graph tracking is on (cupti_graph_tracking_start): the node-created
//    callback gives each new node the label set on its thread, the node-cloned callback gives a clone its
//    original's label;
//  - at stop(), each labelled device record joins the node event of its (label, graph launch) pair, built from the
//    proto and spanning the device time of its records (GraphReplayNodes).
// Tracking is only on while a profiler records, so a graph captured before has no labels: GraphExec captures its
// graph again (once) on its first replay under a tracking profiler, and keeps that graph afterwards. Labels live as
// long as their GraphExec (forget_graph_labels).
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <unordered_map>

#include "core/profiler_cupti.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime {
namespace {

struct Labels {
  std::mutex mutex;
  std::uint64_t next = 1;
  std::unordered_map<std::uint64_t, ProfileEvent> protos;        // label -> node event proto
  std::unordered_map<std::uint64_t, std::uint64_t> graph_nodes;  // CUPTI graph node id -> label
};

Labels& labels() {
  static Labels* l = new Labels();  // never destroyed: CUPTI callbacks may run during exit
  return *l;
}

thread_local std::uint64_t t_capture_label = 0;

}  // namespace

namespace profiler {

std::uint64_t register_graph_label(ProfileEvent proto) {
  Labels& l = labels();
  std::lock_guard<std::mutex> lock(l.mutex);
  const std::uint64_t label = l.next++;
  l.protos.emplace(label, std::move(proto));
  return label;
}

void forget_graph_labels(const std::vector<std::uint64_t>& forgotten) {
  if (forgotten.empty()) return;
  Labels& l = labels();
  std::lock_guard<std::mutex> lock(l.mutex);
  for (std::uint64_t label : forgotten) l.protos.erase(label);
  for (auto it = l.graph_nodes.begin(); it != l.graph_nodes.end();) {
    it = l.protos.count(it->second) == 0 ? l.graph_nodes.erase(it) : std::next(it);
  }
}

GraphLabelScope::GraphLabelScope(std::uint64_t label) : previous_(t_capture_label) { t_capture_label = label; }
GraphLabelScope::~GraphLabelScope() { t_capture_label = previous_; }

std::string demangle_kernel_name(const char* name) {
  if (name == nullptr) return {};
  if (std::strncmp(name, "_Z", 2) != 0) return name;
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) {
    std::free(demangled);
    return name;
  }
  std::string out(demangled);
  std::free(demangled);
  return out;
}

}  // namespace profiler

namespace profiler_detail {

std::uint64_t current_capture_label() { return t_capture_label; }

void note_graph_node(std::uint64_t graph_node, std::uint64_t label) {
  Labels& l = labels();
  std::lock_guard<std::mutex> lock(l.mutex);
  if (l.protos.count(label) != 0) l.graph_nodes[graph_node] = label;
}

std::uint64_t graph_node_label(std::uint64_t graph_node) {
  Labels& l = labels();
  std::lock_guard<std::mutex> lock(l.mutex);
  auto it = l.graph_nodes.find(graph_node);
  return it == l.graph_nodes.end() ? 0 : it->second;
}

std::uint64_t GraphReplayNodes::parent_of(const DeviceRecord& record, std::int64_t start_ns, std::int64_t duration_ns,
                                          std::int64_t tid, std::uint64_t& next_id) {
  if (record.graph_node == 0) return 0;
  const std::uint64_t label = graph_node_label(record.graph_node);
  if (label == 0) return 0;
  const Key key{label, record.correlation};
  auto it = index_.find(key);
  if (it == index_.end()) {
    ProfileEvent node;
    {
      Labels& l = labels();
      std::lock_guard<std::mutex> lock(l.mutex);
      auto proto = l.protos.find(label);
      if (proto == l.protos.end()) return 0;
      node = proto->second;
    }
    node.id = next_id++;
    node.category = "node";
    node.start_ns = start_ns;
    node.tid = tid;
    node.args.emplace_back("timing", "device time of the node's kernels in a CUDA graph replay");
    node.args.emplace_back("graph_launch", static_cast<std::int64_t>(record.correlation));
    it = index_.emplace(key, nodes_.size()).first;
    nodes_.push_back(std::move(node));
    ends_.push_back(start_ns + duration_ns);
  }
  ProfileEvent& node = nodes_[it->second];
  std::int64_t& end = ends_[it->second];
  node.start_ns = std::min(node.start_ns, start_ns);
  end = std::max(end, start_ns + duration_ns);
  return node.id;
}

void GraphReplayNodes::emit(std::vector<ProfileEvent>& events) {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i].duration_ns = ends_[i] - nodes_[i].start_ns;
    events.push_back(std::move(nodes_[i]));
  }
  nodes_.clear();
  ends_.clear();
  index_.clear();
}

}  // namespace profiler_detail
}  // namespace xpuruntime
