// ORT's run-level profiling for the onnxruntime engine (ort_profiling.h; Note [ORT profile on the timeline] in
// core/profiler_ort.cpp).
#include "engines/onnxruntime/ort_profiling.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>
#include <variant>

#include "xpuruntime/exceptions.h"

namespace xpuruntime::ort {
namespace {

// The profiled run in progress on this thread (ProfiledRun::active).
thread_local ProfiledRun* t_active = nullptr;

// The files ORT wrote for `prefix` ("<prefix>_<date>.json"), in name order.
std::vector<std::filesystem::path> files_of(const std::string& prefix) {
  const std::filesystem::path base(prefix);
  const std::string stem = base.filename().string() + "_";
  std::vector<std::filesystem::path> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(base.parent_path(), error)) {
    if (entry.path().filename().string().rfind(stem, 0) == 0) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void remove_files(const std::string& prefix) {
  for (const auto& file : files_of(prefix)) {
    std::error_code ignored;
    std::filesystem::remove(file, ignored);
  }
}

}  // namespace

// ---- ProfileFolder ----

ProfileFolder::~ProfileFolder() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string ProfileFolder::next_prefix() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (path_.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "xpurt_ort_profile_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw XpuRuntimeError(detail::str_cat("cannot make a folder for ONNX Runtime's profile (mkdtemp ", pattern,
                                            " failed); profiling an onnxruntime-engine session needs a writable "
                                            "temporary directory (TMPDIR)"));
    }
    path_ = pattern;
  }
  return (path_ / detail::str_cat("run", next_++)).string();
}

// ---- ProfiledRun ----

ProfiledRun::ProfiledRun(const void* owner, ProfileFolder& folder,
                         std::vector<std::pair<std::string, std::string>> config, bool recording,
                         std::atomic<bool>* explain_pending)
    : owner_(owner),
      folder_(folder),
      config_(std::move(config)),
      recording_(recording),
      explain_pending_(explain_pending),
      previous_(t_active) {
  t_active = this;
}

ProfiledRun::~ProfiledRun() {
  t_active = previous_;
  for (const Call& call : calls_) remove_files(call.prefix);
  if (explain_pending_ != nullptr) explain_pending_->store(true, std::memory_order_relaxed);
}

ProfiledRun* ProfiledRun::active(const void* owner) {
  for (ProfiledRun* run = t_active; run != nullptr; run = run->previous_) {
    if (run->owner_ == owner) return run;
  }
  return nullptr;
}

const Ort::RunOptions* ProfiledRun::call_options() {
  Call call;
  try {
    call.prefix = folder_.next_prefix();
    XPURT_ORT_CHECK(call.options = Ort::RunOptions());
    for (const auto& [key, value] : config_) XPURT_ORT_CHECK(call.options.AddConfigEntry(key.c_str(), value.c_str()));
    XPURT_ORT_CHECK(call.options.EnableProfiling(call.prefix.c_str()));
  } catch (const XpuRuntimeError& error) {
    // A profile is a report: the run itself goes on.
    errors_.push_back(detail::str_cat("a Run call was not profiled: ", error.what()));
    return nullptr;
  }
  call.start_ns = profiler::now_ns();
  return &calls_.emplace_back(std::move(call)).options;
}

profiler::OrtProfile ProfiledRun::collect(bool shapes, std::vector<std::string>* unreadable) {
  profiler::OrtProfile all;
  if (unreadable != nullptr) unreadable->insert(unreadable->end(), errors_.begin(), errors_.end());
  errors_.clear();
  for (Call& call : calls_) {
    const std::vector<std::filesystem::path> files = files_of(call.prefix);
    if (files.empty() && unreadable != nullptr) unreadable->push_back(call.prefix + "_*.json (not written)");
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      in.close();
      std::error_code ignored;
      std::filesystem::remove(file, ignored);
      profiler::OrtProfile one;
      try {
        one = profiler::parse_ort_profile(text.str(), shapes);
      } catch (const InvalidArgumentError& error) {
        if (unreadable != nullptr) unreadable->push_back(file.string() + ": " + error.what());
        continue;
      }
      if (one.runs.empty()) {
        if (unreadable != nullptr) unreadable->push_back(file.string() + ": no model_run event");
        continue;
      }
      profiler::align_ort_profile(one, {call.start_ns});
      for (auto& e : one.events) all.events.push_back(std::move(e));
      for (const auto& r : one.runs) all.runs.push_back(r);
      all.skipped += one.skipped;
      for (auto& c : one.skipped_categories) {
        if (std::find(all.skipped_categories.begin(), all.skipped_categories.end(), c) ==
            all.skipped_categories.end()) {
          all.skipped_categories.push_back(std::move(c));
        }
      }
    }
  }
  calls_.clear();
  std::stable_sort(all.events.begin(), all.events.end(),
                   [](const ProfileEvent& a, const ProfileEvent& b) { return a.start_ns < b.start_ns; });
  std::sort(all.runs.begin(), all.runs.end());
  return all;
}

std::vector<NodeExplanation> explain_nodes(const profiler::OrtProfile& profile, const std::string& precision) {
  std::vector<NodeExplanation> nodes;
  std::set<std::string> seen;
  auto text = [](const ProfileEvent& e, const char* key) {
    const ProfileArg* a = e.arg(key);
    return a != nullptr && std::holds_alternative<std::string>(*a) ? std::get<std::string>(*a) : std::string();
  };
  for (const ProfileEvent& e : profile.events) {
    if (e.category != "node" || !seen.insert(e.name).second) continue;
    NodeExplanation node;
    node.node = e.name;
    node.op_type = text(e, "op_type");
    node.kernel = text(e, "backend");  // the execution provider
    node.backend = "onnxruntime";
    node.precision = precision;
    node.reason = "assigned by ONNX Runtime's graph partitioner (from ORT's profile of the first run)";
    nodes.push_back(std::move(node));
  }
  return nodes;
}

}  // namespace xpuruntime::ort
