// ONNX Runtime's profile in xpuruntime's Profiler: reading ORT's JSON, placing its events on the profiler's
// timeline, and merging a profile file into a Profiler or into an exported Chrome trace (profiler.h). Needs no ORT:
// a profile is JSON, so every build can read one.
//
// Note [ORT profile on the timeline]
// ONNX Runtime profiles a session (SessionOptions::EnableProfiling: from creation until EndProfiling) or, since ORT
// 1.25, single runs (RunOptions::EnableProfiling: each Run writes "<prefix>_<date>.json" as it ends; ORT ignores the
// run option while the session's own profiling is on). Either way "ts" counts microseconds since ORT's profiler
// started -- ORT's clock, not ours -- and each run is a "model_run" session event enclosing the "<node>_kernel_time"
// node events of the nodes it ran. The onnxruntime engine (engines/onnxruntime/ort_profiling.h) profiles only the
// runs that need it: while a Profiler records, and the first run of a session, for explain(). Each ORT Run call then
// gets RunOptions of its own with profiling into a file of its own; the host time (profiler::now_ns) is taken just
// before the call, and after the run the file is read (parse_ort_profile), its model_run placed at that time
// (align_ort_profile), its events recorded and the file removed. ORT starts its profiler a few microseconds after
// Run is entered, so its events sit up to that much early on our timeline; they still fall inside the run's
// "session run (onnxruntime)" event, whose start is taken earlier. Node times are ORT's host times: on the CPU the
// kernels' compute time; on CUDA mostly the launches (kernels run asynchronously), as for native nodes without
// CUPTI. A session with CUDA graphs runs without its graph while a Profiler records (a replay runs no node
// one by one, so ORT would report none), as the native engine does.
// A profile written elsewhere (onnxruntime used directly) is placed by Profiler::merge_ort_profile: by an explicit
// offset, by ORT's profiling start (system clock, ns since the epoch) against the profiler's "start_time_unix_ns",
// or by pairing model_run events in order with the profile's "session run (onnxruntime)" events.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime {
namespace {

using nlohmann::json;

constexpr const char* kNodeSuffix = "_kernel_time";
constexpr const char* kOrtRunName = "onnxruntime run";      // ORT's "model_run"
constexpr const char* kSessionRunName = "session run (onnxruntime)";  // InferenceSession::run's event

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ORT writes most numbers of "args" as strings ("24"); ts, dur, pid and tid as numbers.
std::int64_t int_of(const json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number()) return static_cast<std::int64_t>(std::llround(v.get<double>()));
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    char* end = nullptr;
    const long long parsed = std::strtoll(s.c_str(), &end, 10);
    if (end != s.c_str() && *end == '\0') return parsed;
  }
  return 0;
}

std::int64_t ns_of(const json& event, const char* key) {
  auto it = event.find(key);
  if (it == event.end() || !it->is_number()) return 0;
  return static_cast<std::int64_t>(std::llround(it->get<double>() * 1000.0));
}

std::string string_of(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// ORT's type names ("float", "double", "int64", "float16", ...) as xpuruntime's dtype names.
std::string dtype_of(const std::string& ort) {
  if (ort == "float") return "float32";
  if (ort == "double") return "float64";
  return ort;
}

std::string precision_of(const std::string& dtype) {
  if (dtype == "float32") return "fp32";
  if (dtype == "float16") return "fp16";
  if (dtype == "bfloat16") return "bf16";
  if (dtype == "int8" || dtype == "uint8") return "int8";
  return dtype;
}

// [{"float": [2, 3]}, ...] -> {"float32[2,3]", ...}; the first dtype goes to `first_dtype`.
std::vector<std::string> shapes_of(const json& args, const char* key, std::string* first_dtype) {
  std::vector<std::string> out;
  auto it = args.find(key);
  if (it == args.end() || !it->is_array()) return out;
  for (const json& value : *it) {
    if (!value.is_object() || value.empty()) continue;
    const auto entry = value.begin();
    const std::string dtype = dtype_of(entry.key());
    if (first_dtype != nullptr && first_dtype->empty()) *first_dtype = dtype;
    std::vector<std::int64_t> dims;
    if (entry.value().is_array()) {
      for (const json& d : entry.value()) dims.push_back(int_of(d));
    }
    out.push_back(dtype + detail::shape_str(dims, ","));
  }
  return out;
}

ProfileEvent node_event(const json& e, const std::string& name, bool shapes) {
  const json args = e.contains("args") && e.at("args").is_object() ? e.at("args") : json::object();
  const std::string provider = string_of(args, "provider");
  ProfileEvent out;
  out.name = name.substr(0, name.size() - std::string(kNodeSuffix).size());
  out.category = "node";
  out.start_ns = ns_of(e, "ts");
  out.duration_ns = ns_of(e, "dur");
  out.pid = int_of(e.value("pid", json(0)));
  out.tid = int_of(e.value("tid", json(0)));
  std::string output_dtype, input_dtype;
  std::vector<std::string> inputs = shapes_of(args, "input_type_shape", &input_dtype);
  std::vector<std::string> outputs = shapes_of(args, "output_type_shape", &output_dtype);
  const std::int64_t bytes = int_of(args.value("activation_size", json(0))) +
                             int_of(args.value("parameter_size", json(0))) +
                             int_of(args.value("output_size", json(0)));
  out.args = {{"node", out.name},
              {"op_type", string_of(args, "op_name")},
              {"kernel", provider},
              {"backend", provider},
              {"precision", precision_of(output_dtype.empty() ? input_dtype : output_dtype)},
              {"reason", "ONNX Runtime ran it on " + (provider.empty() ? std::string("its") : provider) +
                             " (assigned by ORT's graph partitioner; time from ORT's profile)"},
              {"engine", "onnxruntime"},
              {"node_index", int_of(args.value("node_index", json(-1)))},
              {"bytes", bytes}};
  if (shapes) {
    out.args.emplace_back("input_shapes", std::move(inputs));
    out.args.emplace_back("output_shapes", std::move(outputs));
  }
  return out;
}

ProfileEvent session_event(const json& e, const std::string& name) {
  ProfileEvent out;
  out.name = name == "model_run" ? kOrtRunName : "onnxruntime " + name;
  out.category = "session";
  out.start_ns = ns_of(e, "ts");
  out.duration_ns = ns_of(e, "dur");
  out.pid = int_of(e.value("pid", json(0)));
  out.tid = int_of(e.value("tid", json(0)));
  out.args = {{"engine", "onnxruntime"}, {"ort_event", name}};
  return out;
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream file(path, std::ios::binary);
  XPURT_CHECK(file.good(), "cannot read the ", what, " '", path, "'");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string us_text(std::int64_t ns) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << static_cast<double>(ns) / 1000.0;
  return os.str();
}

std::string json_type(const json& v) { return v.type_name(); }

// Places `profile` on a timeline: `session_starts_ns` are the starts of its "session run (onnxruntime)" events and
// `unix_start_ns` the system clock at the profiler's start (0: unknown). Returns the alignment in words.
std::string place(profiler::OrtProfile& profile, const OrtProfileMergeOptions& options,
                  const std::vector<std::int64_t>& session_starts_ns, std::int64_t unix_start_ns,
                  const std::string& path) {
  auto shift_all = [&](std::int64_t ns) {
    for (auto& e : profile.events) e.start_ns += ns;
    for (auto& r : profile.runs) r.first += ns;
  };
  if (options.offset_us) {
    XPURT_CHECK(std::isfinite(*options.offset_us), "offset_us must be a finite number of microseconds, got ",
                *options.offset_us);
    shift_all(static_cast<std::int64_t>(std::llround(*options.offset_us * 1000.0)));
    return "offset_us=" + us_text(static_cast<std::int64_t>(std::llround(*options.offset_us * 1000.0)));
  }
  if (options.start_time_ns) {
    XPURT_CHECK(unix_start_ns > 0,
                "start_time_ns needs the profile's start on the system clock (metadata start_time_unix_ns), which "
                "this profile does not have; pass offset_us instead");
    XPURT_CHECK(*options.start_time_ns > 0, "start_time_ns must be ORT's profiling start in ns since the Unix epoch "
                "(Ort::Session::GetProfilingStartTimeNs()), got ", *options.start_time_ns);
    const std::int64_t offset = *options.start_time_ns - unix_start_ns;
    shift_all(offset);
    return "start_time_ns: ORT's profiling started " + us_text(offset) + " us after the profiler";
  }
  XPURT_CHECK(!profile.runs.empty() && !session_starts_ns.empty(), "cannot place the ONNX Runtime profile '", path,
              "' on this profile's timeline: ",
              profile.runs.empty() ? "it has no model_run event"
                                   : "this profile has no \"session run (onnxruntime)\" event to pair its runs with",
              "; pass offset_us (ORT's ts + offset_us = microseconds since the profiler started) or start_time_ns "
              "(ORT's profiling start, ns since the Unix epoch: Ort::Session::GetProfilingStartTimeNs(), "
              "onnxruntime.InferenceSession.get_profiling_start_time_ns())");
  const std::size_t runs = profile.runs.size();
  profiler::align_ort_profile(profile, session_starts_ns);
  if (runs == session_starts_ns.size()) {
    return std::to_string(runs) + " model_run event(s) paired in order with the profile's " + kSessionRunName +
           " events";
  }
  return "placed by its first model_run at the first " + std::string(kSessionRunName) + " event (" +
         std::to_string(runs) + " model_run events, " + std::to_string(session_starts_ns.size()) +
         " session runs: counts differ, so ORT's own spacing is kept)";
}

OrtProfileMergeResult count(const profiler::OrtProfile& profile, std::string alignment) {
  OrtProfileMergeResult r;
  for (const auto& e : profile.events) (e.category == "node" ? r.node_events : r.session_events) += 1;
  r.skipped = profile.skipped;
  r.alignment = std::move(alignment);
  return r;
}

}  // namespace

namespace profiler {

OrtProfile parse_ort_profile(const std::string& json_text, bool shapes) {
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  XPURT_CHECK(!root.is_discarded(), "an ONNX Runtime profile is JSON; this text is not (", json_text.size(),
              " bytes)");
  const json* events = &root;
  if (root.is_object() && root.contains("traceEvents")) events = &root.at("traceEvents");
  XPURT_CHECK(events->is_array(),
              "an ONNX Runtime profile is a JSON array of trace events (or an object with \"traceEvents\"), got a "
              "JSON ", json_type(*events));
  OrtProfile profile;
  auto skip = [&](const std::string& category) {
    profile.skipped += 1;
    if (std::find(profile.skipped_categories.begin(), profile.skipped_categories.end(), category) ==
        profile.skipped_categories.end()) {
      profile.skipped_categories.push_back(category);
    }
  };
  for (const json& e : *events) {
    if (!e.is_object()) {
      skip("(not an object)");
      continue;
    }
    const std::string category = string_of(e, "cat");
    const std::string name = string_of(e, "name");
    if (category == "Node") {
      if (ends_with(name, kNodeSuffix)) {
        profile.events.push_back(node_event(e, name, shapes));
      } else {
        skip("Node (not *_kernel_time)");  // fence_before / fence_after of older ORT versions
      }
    } else if (category == "Session") {
      // The executor's span repeats model_run's (minus a few microseconds): left out.
      if (ends_with(name, "Executor::Execute")) continue;
      profile.events.push_back(session_event(e, name));
      if (name == "model_run") profile.runs.emplace_back(ns_of(e, "ts"), ns_of(e, "dur"));
    } else {
      skip(category.empty() ? "(no cat)" : category);
    }
  }
  std::stable_sort(profile.events.begin(), profile.events.end(),
                   [](const ProfileEvent& a, const ProfileEvent& b) { return a.start_ns < b.start_ns; });
  std::sort(profile.runs.begin(), profile.runs.end());
  return profile;
}

void align_ort_profile(OrtProfile& profile, const std::vector<std::int64_t>& run_starts_ns) {
  XPURT_INTERNAL_ASSERT(!profile.runs.empty() && !run_starts_ns.empty(), "align_ort_profile needs runs and starts");
  const bool paired = profile.runs.size() == run_starts_ns.size();
  const std::int64_t first_shift = run_starts_ns.front() - profile.runs.front().first;
  // The run whose span holds `t` (ORT's clock): the last one starting at or before it, if it has not ended.
  auto shift_at = [&](std::int64_t t) {
    if (!paired) return first_shift;
    auto after = std::upper_bound(profile.runs.begin(), profile.runs.end(), std::make_pair(t, INT64_MAX));
    if (after == profile.runs.begin()) return first_shift;
    const auto k = static_cast<std::size_t>(std::distance(profile.runs.begin(), after) - 1);
    const auto& run = profile.runs[k];
    if (t > run.first + run.second) return first_shift;
    return run_starts_ns[k] - run.first;
  };
  for (auto& e : profile.events) e.start_ns += shift_at(e.start_ns);
  for (std::size_t k = 0; k < profile.runs.size(); ++k) {
    profile.runs[k].first += paired ? run_starts_ns[k] - profile.runs[k].first : first_shift;
  }
}

}  // namespace profiler

OrtProfileMergeResult Profiler::merge_ort_profile(const std::string& ort_profile_path,
                                                  const OrtProfileMergeOptions& options) {
  XPURT_CHECK(!recording_, "merge_ort_profile: the profiler is recording; stop() it first");
  profiler::OrtProfile profile =
      profiler::parse_ort_profile(read_text(ort_profile_path, "ONNX Runtime profile"), options_.record_shapes);
  XPURT_CHECK(!profile.events.empty(), "'", ort_profile_path,
              "' has no ONNX Runtime node or session events (is it a profile ONNX Runtime wrote?)");
  std::vector<std::int64_t> session_starts;
  std::uint64_t next_id = 1;
  for (const auto& e : events_) {
    next_id = std::max(next_id, e.id + 1);
    const ProfileArg* engine = e.arg("engine");
    if (e.category == "session" && e.name == kSessionRunName && engine != nullptr &&
        std::holds_alternative<std::string>(*engine) && std::get<std::string>(*engine) == "onnxruntime") {
      session_starts.push_back(e.start_ns);
    }
  }
  std::int64_t unix_start = 0;
  if (auto it = metadata_.find("start_time_unix_ns"); it != metadata_.end()) {
    unix_start = std::strtoll(it->second.c_str(), nullptr, 10);
  }
  OrtProfileMergeResult result =
      count(profile, place(profile, options, session_starts, unix_start, ort_profile_path));
  const auto pid = static_cast<std::int64_t>(::getpid());
  for (auto& e : profile.events) {
    e.id = next_id++;
    if (e.pid == 0) e.pid = pid;
    events_.push_back(std::move(e));
  }
  std::stable_sort(events_.begin(), events_.end(),
                   [](const ProfileEvent& a, const ProfileEvent& b) { return a.start_ns < b.start_ns; });
  std::string& merged = metadata_["ort_profiles_merged"];
  merged += (merged.empty() ? "" : "; ") + ort_profile_path + " (" + result.alignment + ")";
  return result;
}

std::string Profiler::merge_ort_profile_into_chrome_trace(const std::string& chrome_trace_json,
                                                          const std::string& ort_profile_path,
                                                          const OrtProfileMergeOptions& options,
                                                          OrtProfileMergeResult* result) {
  json trace = json::parse(chrome_trace_json, nullptr, /*allow_exceptions=*/false);
  XPURT_CHECK(!trace.is_discarded() && trace.is_object() && trace.contains("traceEvents") &&
                  trace.at("traceEvents").is_array(),
              "expected a Chrome trace as Profiler::chrome_trace() writes it (a JSON object with a \"traceEvents\" "
              "array), got ",
              trace.is_discarded() ? std::string("text that is not JSON") : "a JSON " + json_type(trace));
  json& trace_events = trace.at("traceEvents");
  if (!trace.contains("metadata") || !trace.at("metadata").is_object()) trace["metadata"] = json::object();
  json& metadata = trace.at("metadata");
  const bool shapes = string_of(metadata, "record_shapes") != "false";
  std::int64_t unix_start = 0;
  if (metadata.contains("start_time_unix_ns")) unix_start = int_of(metadata.at("start_time_unix_ns"));

  std::vector<std::int64_t> session_starts;
  std::uint64_t next_id = 1;
  std::set<std::int64_t> named_processes;
  std::set<std::tuple<std::string, std::int64_t, std::int64_t>> meta_seen;  // (name, pid, tid) of "M" events
  for (const json& e : trace_events) {
    if (!e.is_object()) continue;
    const std::string ph = string_of(e, "ph");
    const json args = e.contains("args") && e.at("args").is_object() ? e.at("args") : json::object();
    if (args.contains("id")) {
      next_id = std::max<std::uint64_t>(next_id, static_cast<std::uint64_t>(int_of(args.at("id"))) + 1);
    }
    if (ph == "M") {
      const std::int64_t pid = int_of(e.value("pid", json(0)));
      meta_seen.emplace(string_of(e, "name"), pid, int_of(e.value("tid", json(0))));
      if (string_of(e, "name") == "process_name") named_processes.insert(pid);
    } else if (ph == "X" && string_of(e, "cat") == "session" && string_of(e, "name") == kSessionRunName &&
               string_of(args, "engine") == "onnxruntime") {
      session_starts.push_back(ns_of(e, "ts"));
    }
  }
  std::sort(session_starts.begin(), session_starts.end());

  profiler::OrtProfile profile =
      profiler::parse_ort_profile(read_text(ort_profile_path, "ONNX Runtime profile"), shapes);
  XPURT_CHECK(!profile.events.empty(), "'", ort_profile_path,
              "' has no ONNX Runtime node or session events (is it a profile ONNX Runtime wrote?)");
  const OrtProfileMergeResult added =
      count(profile, place(profile, options, session_starts, unix_start, ort_profile_path));

  // The new events in the Chrome format, drawn by the same code as chrome_trace().
  Profiler renderer;
  std::set<std::int64_t> new_pids;
  for (auto& e : profile.events) {
    e.id = next_id++;
    new_pids.insert(e.pid);
    renderer.events_.push_back(std::move(e));
  }
  const json rendered = json::parse(renderer.chrome_trace());
  for (const json& e : rendered.at("traceEvents")) {
    const std::string ph = string_of(e, "ph");
    if (ph == "M") {
      // Only the thread names of the new events' threads; processes are named below.
      if (string_of(e, "name") != "thread_name" || !new_pids.count(int_of(e.at("pid")))) continue;
      if (meta_seen.count({"thread_name", int_of(e.at("pid")), int_of(e.at("tid"))})) continue;
    }
    trace_events.push_back(e);
  }
  for (std::int64_t pid : new_pids) {
    if (named_processes.count(pid)) continue;
    trace_events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                            {"args", {{"name", "onnxruntime (pid " + std::to_string(pid) + ")"}}}});
  }
  std::string merged = string_of(metadata, "ort_profiles_merged");
  merged += (merged.empty() ? "" : "; ") + ort_profile_path + " (" + added.alignment + ")";
  metadata["ort_profiles_merged"] = merged;
  if (result != nullptr) *result = added;
  return trace.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace xpuruntime
