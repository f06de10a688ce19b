// Dispatcher, decisions and the autotune cache.
//
// Note [How the dispatcher decides]
// For one OpDescriptor (its signature) the dispatcher decides once and caches the result:
//  1. Every kernel of the op is asked `supports(desc, policy)`; the generic checks come first (device type,
//     determinism, then the kernel's declaration: Note [Kernel declarations] in kernel_registry.cpp) so their
//     reasons read the same for every backend.
//  2. The rule the KernelPolicy gives the op (its own, else its family's, else auto) picks the winner:
//     pinned -> that kernel or an UnsupportedOperationError; preferred -> the first listed kernel that supports
//     it, else the first supported in registry order ("fallback"); auto/FirstSupported -> the first supported in
//     registry order; auto/BestPerformance -> every supported kernel is built and timed on scratch tensors of
//     the real shapes, the fastest wins.
//  3. The winner's plan is built. When an AutotuneCache holds an entry for this key, an auto rule takes the
//     cached kernel (no timing) and any rule that lands on the cached kernel re-creates the cached plan record
//     (e.g. the same cuBLASLt algorithm): a lock file replays exactly.
// Decisions keep every candidate with its reason, so `explain` can show why the others lost. `decide` runs these as
// phases: list_candidates (1), pick_pinned / pick_preferred / pick_auto and autotune (2), build_plan and
// record_decision (3).
#include "xpuruntime/dispatcher.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>

#include "half.h"
#include "policy_serialization.h"
#include "shape_str.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/version.h"

namespace xpuruntime {

namespace {

constexpr const char* kCacheSchema = "xpuruntime.autotune_cache/1";

int compute_capability_of(Device device) {
  if (!device.is_cuda()) return 0;
  static std::mutex mutex;
  static std::map<int, int> cached;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cached.find(device.index);
  if (it != cached.end()) return it->second;
  const int cc = DeviceManager::instance().get_device_info(device).compute_capability();
  cached[device.index] = cc;
  return cc;
}

std::string device_fingerprint(Device device) {
  if (!device.is_cuda()) return "cpu";
  static std::mutex mutex;
  static std::map<int, std::string> cached;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cached.find(device.index);
  if (it != cached.end()) return it->second;
  const DeviceInfo info = DeviceManager::instance().get_device_info(device);
  std::string text = detail::str_cat(info.name, " sm", info.compute_capability_major, info.compute_capability_minor,
                                     " driver ", info.driver_version, " runtime ", info.runtime_version);
  cached[device.index] = text;
  return text;
}

// Random values in [-1, 1) for scratch tensors, in the tensor's dtype, on its device.
Tensor random_tensor(const TensorDesc& desc, std::mt19937& rng) {
  Tensor host = Tensor::empty(desc.shape, desc.dtype, Device::cpu());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::int64_t n = host.numel();
  void* data = host.data_ptr();
  std::memset(data, 0, host.nbytes());  // non-float tensors: zeros
  for (std::int64_t i = 0; i < n; ++i) {
    switch (desc.dtype) {
      case DType::kFloat32: static_cast<float*>(data)[i] = dist(rng); break;
      case DType::kFloat64: static_cast<double*>(data)[i] = dist(rng); break;
      case DType::kFloat16: static_cast<std::uint16_t*>(data)[i] = detail::float_to_half(dist(rng)); break;
      case DType::kBFloat16: static_cast<std::uint16_t*>(data)[i] = detail::float_to_bfloat16(dist(rng)); break;
      default: break;
    }
  }
  return desc.device.is_cpu() ? host : host.to(desc.device);
}

bool is_supported(const std::vector<CandidateReport>& reports, const std::string& kernel) {
  for (const auto& r : reports) {
    if (r.kernel == kernel) return r.supported;
  }
  return false;
}

CandidateReport* report_of(std::vector<CandidateReport>& reports, const std::string& kernel) {
  for (auto& r : reports) {
    if (r.kernel == kernel) return &r;
  }
  return nullptr;
}

std::string reasons_text(const std::vector<CandidateReport>& reports) {
  std::string out;
  for (const auto& r : reports) {
    if (r.supported) continue;
    out += (out.empty() ? "" : "; ") + r.kernel + ": " + r.reason;
  }
  return out;
}

std::string supported_list(const std::vector<CandidateReport>& reports) {
  std::vector<std::string> names;
  for (const auto& r : reports) {
    if (r.supported) names.push_back(r.kernel);
  }
  return names.empty() ? "none" : detail::join_names(names);
}

// Why the dispatcher cannot run an external kernel (Note [External kernels] in kernel_registry.cpp).
std::string external_reason(const ExternalKernelInfo& external) {
  return detail::str_cat(external.summary, ": it runs where ",
                         external.runner == "pytorch" ? "PyTorch runs the model (xpuruntime.pytorch)" : external.runner,
                         ", not in xpuruntime's dispatcher");
}

nlohmann::json decision_tree(const Decision& d) {
  nlohmann::json tree = nlohmann::json::object();
  tree["op"] = d.op;
  tree["family"] = d.family;
  tree["signature"] = d.signature;
  tree["kernel"] = d.kernel;
  tree["backend"] = d.backend;
  tree["rule"] = d.rule;
  tree["policy_rule"] = d.policy_rule;
  tree["reason"] = d.reason;
  tree["plan"] = d.plan_summary;
  tree["plan_record"] = d.plan_record.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(d.plan_record, nullptr, false);
  if (tree["plan_record"].is_discarded()) tree["plan_record"] = d.plan_record;
  nlohmann::json candidates = nlohmann::json::array();
  for (const auto& c : d.candidates) {
    nlohmann::json item = {{"kernel", c.kernel}, {"backend", c.backend}, {"supported", c.supported}};
    if (!c.reason.empty()) item["reason"] = c.reason;
    if (c.time_us >= 0) item["time_us"] = c.time_us;
    candidates.push_back(item);
  }
  tree["candidates"] = candidates;
  return tree;
}

}  // namespace

// ---- Decision ----

std::string Decision::to_json() const { return decision_tree(*this).dump(); }

std::string Decision::str() const {
  std::string out = op + " -> " + kernel + " (" + backend + "): " + reason;
  if (!plan_summary.empty()) out += " [" + plan_summary + "]";
  return out;
}

// ---- AutotuneCache ----

AutotuneCache::AutotuneCache(std::string path, bool autosave) : path_(std::move(path)), autosave_(autosave) {
  std::ifstream probe(path_);
  if (!probe) return;  // a new cache file
  const auto tree = detail::parse_json_text(detail::read_text_file(path_, "autotune cache"),
                                            "autotune cache '" + path_ + "'");
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError(detail::str_cat("autotune cache '", path_, "' is malformed: ", why,
                                                "; delete it to start afresh"));
  };
  if (!tree.is_object() || !tree.contains("entries") || !tree["entries"].is_object()) {
    throw bad("expected an object with \"entries\"");
  }
  if (!tree.contains("schema") || tree["schema"] != kCacheSchema) {
    throw bad(detail::str_cat("schema must be \"", kCacheSchema, "\""));
  }
  for (const auto& [key, value] : tree["entries"].items()) {
    if (!value.is_object() || !value.contains("kernel") || !value["kernel"].is_string()) {
      throw bad("entry '" + key + "' has no kernel");
    }
    Entry entry;
    entry.kernel = value["kernel"].get<std::string>();
    if (value.contains("plan_record") && !value["plan_record"].is_null()) {
      entry.plan_record = value["plan_record"].is_string() ? value["plan_record"].get<std::string>()
                                                           : value["plan_record"].dump();
    }
    if (value.contains("times_us") && value["times_us"].is_object()) {
      for (const auto& [kernel, time] : value["times_us"].items()) {
        if (time.is_number()) entry.times_us[kernel] = time.get<double>();
      }
    }
    entries_[key] = std::move(entry);
  }
}

std::string AutotuneCache::key(const OpDescriptor& desc) {
  std::string key = desc.signature() + " | " + device_fingerprint(desc.device);
  const std::string libraries = KernelRegistry::global().library_versions();
  if (!libraries.empty()) key += " | " + libraries;
  return key + " | xpuruntime " + get_version();
}

bool AutotuneCache::lookup(const std::string& key, Entry* entry) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  if (entry) *entry = it->second;
  return true;
}

void AutotuneCache::store(const std::string& key, Entry entry) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_[key] = std::move(entry);
  }
  if (autosave_ && !path_.empty()) save();
}

std::size_t AutotuneCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

void AutotuneCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
}

std::string AutotuneCache::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json tree = {{"schema", kCacheSchema}, {"entries", nlohmann::json::object()}};
  for (const auto& [key, entry] : entries_) {
    nlohmann::json item = {{"kernel", entry.kernel}};
    if (!entry.plan_record.empty()) {
      auto record = nlohmann::json::parse(entry.plan_record, nullptr, false);
      item["plan_record"] = record.is_discarded() ? nlohmann::json(entry.plan_record) : record;
    }
    if (!entry.times_us.empty()) item["times_us"] = entry.times_us;
    tree["entries"][key] = item;
  }
  return detail::to_json_text(tree);
}

void AutotuneCache::save() const {
  if (path_.empty()) {
    throw UnsupportedOperationError("this AutotuneCache has no file; use save(path) or create it with a path");
  }
  save(path_);
}

void AutotuneCache::save(const std::string& path) const { detail::write_text_file(path, to_json(), "autotune cache"); }

// ---- Dispatcher ----

OpDescriptor make_op_descriptor(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                                const ExecutionPolicy& policy) {
  OpDescriptor desc;
  desc.op = op;
  desc.attrs = attrs;
  desc.inputs.reserve(inputs.size());
  bool have_device = false;
  for (const auto& input : inputs) {
    desc.inputs.push_back(TensorDesc::of(input));
    if (input.defined() && !have_device) {
      desc.device = input.device();
      have_device = true;
    }
  }
  desc.compute_capability = compute_capability_of(desc.device);
  desc.precision = kernel_precision(policy.precision);
  desc.deterministic = policy.deterministic;
  return desc;
}

Dispatcher::Dispatcher(KernelPolicy kernel_policy, ExecutionPolicy exec_policy, std::shared_ptr<AutotuneCache> cache,
                       const KernelRegistry* registry)
    : Dispatcher(std::move(kernel_policy), std::move(exec_policy), std::move(cache), registry, Options{}) {}

Dispatcher::Dispatcher(KernelPolicy kernel_policy, ExecutionPolicy exec_policy, std::shared_ptr<AutotuneCache> cache,
                       const KernelRegistry* registry, Options options)
    : kernel_policy_(std::move(kernel_policy)),
      exec_policy_(std::move(exec_policy)),
      cache_(std::move(cache)),
      registry_(registry ? registry : &KernelRegistry::global()),
      options_(options) {
  kernel_policy_.validate(*registry_);
  XPURT_CHECK(options_.autotune_iterations >= 1 && options_.autotune_warmup >= 0,
              "Dispatcher options: autotune_iterations must be >= 1 and autotune_warmup >= 0");
}

void Dispatcher::prepare(OpDescriptor& desc) const {
  desc.precision = kernel_precision(exec_policy_.precision);
  desc.deterministic = exec_policy_.deterministic;
  registry_->infer(desc);
}

std::shared_ptr<const Dispatch> Dispatcher::select(OpDescriptor& desc) {
  prepare(desc);
  const std::string signature = desc.signature();
  std::promise<std::shared_ptr<const Dispatch>> promise;
  std::shared_future<std::shared_ptr<const Dispatch>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = dispatches_.find(signature);
    if (it != dispatches_.end()) return it->second;
    const auto flight = in_flight_.find(signature);
    if (flight != in_flight_.end()) {
      pending = flight->second;
    } else {
      in_flight_.emplace(signature, promise.get_future().share());
      order_.push_back(signature);
    }
  }
  if (pending.valid()) return pending.get();  // another thread decides it (its error is rethrown here)
  std::shared_ptr<const Dispatch> dispatch;
  try {
    dispatch = decide(desc);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_.erase(signature);
      order_.erase(std::find(order_.begin(), order_.end(), signature));
    }
    promise.set_exception(std::current_exception());
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dispatches_.emplace(signature, dispatch);
    in_flight_.erase(signature);
  }
  promise.set_value(dispatch);
  return dispatch;
}

std::mutex& gpu_timing_mutex() {
  static auto* mutex = new std::mutex();  // never destroyed: usable from static destructors
  return *mutex;
}

// Note [Timings on a stream of their own]
// Kernels are chosen on several threads at once (Note [Parallel kernel selection]), and a thread that has not set a
// stream works on the device's legacy default stream. Timing there measures every other thread's work queued on it
// between the two events (the candidates' random inputs copied from the host, cuDNN's scratch memsets). So whatever
// times kernels does it on this stream, non-blocking (the legacy stream's implicit synchronisation does not reach it)
// and used by nothing else, after the inputs' stream has finished making them, with gpu_timing_mutex() held. (It did
// not explain the convolution timings of Note [Convolutions are not timed by default]: those stayed as far off on
// it, on an H100, 2026-12-06.)
//
// Note [Timing without host gaps]
// Two events around a kernel's launch measure the GPU's time line between them, and that includes the time the GPU
// waits for the host to finish queueing the work: a library call that does host work of its own before it launches is
// measured at that host work where it is longer than the kernel. The runs the timing predicts have no such gaps: the
// native engine replays its plans from CUDA graphs. So each timed run is queued behind a StreamGate: the stream waits
// until the start event, the run and the stop event are all queued, then does them back to back, and the events see the
// GPU's work alone. (The suspected cause of Note [Convolutions are not timed by default]'s timings; the gate passed its
// GPU test on an H100, 2026-12-06, but whether it mends those timings is not measured yet.) A run that waits for the
// stream itself (a synchronous copy in a host step) would hold the gate to its limit (50 ms); the rest of its runs are
// timed ungated. A session that runs without CUDA graphs pays the host work the timing no longer sees; there the kernel
// with less host work per call may be the faster one.
StreamView gpu_timing_stream(Device device) {
  static auto* streams = new std::map<int, Stream>();  // never destroyed, like the mutex; guarded by it
  auto found = streams->find(device.index);
  if (found == streams->end()) found = streams->emplace(device.index, Stream::create(device, 0, true)).first;
  return found->second.view();
}

std::vector<CandidateReport> Dispatcher::evaluate(const OpDescriptor& desc) const {
  std::vector<CandidateReport> candidates;
  for (const Kernel* kernel : registry_->kernels(desc.op)) {
    CandidateReport report;
    report.kernel = kernel->name();
    report.backend = kernel->info().backend;
    const auto& info = kernel->info();
    if (info.device_type != desc.device.type) {
      report.reason = detail::str_cat("runs on ", info.device_type == DeviceType::kCUDA ? "CUDA devices" : "the CPU",
                                      "; the op is on ", desc.device.str());
    } else if (exec_policy_.deterministic && !info.deterministic) {
      report.reason = "not deterministic, and ExecutionPolicy.deterministic is on";
    } else {
      try {
        const Support support = kernel->supports(desc, exec_policy_);
        report.supported = support.ok();
        report.reason = support.reason();
      } catch (const std::exception& e) {
        report.reason = std::string("supports() failed: ") + e.what();
      }
    }
    candidates.push_back(std::move(report));
  }
  return candidates;
}

std::vector<CandidateReport> Dispatcher::candidates(OpDescriptor& desc) const {
  desc.precision = kernel_precision(exec_policy_.precision);
  desc.deterministic = exec_policy_.deterministic;
  registry_->infer(desc);
  return evaluate(desc);
}

// ---- Dispatcher::decide, phase by phase (Note [How the dispatcher decides]) ----

// One decision while its phases run: the descriptor, the rule the policy gives it, the op's kernels in priority
// order, the dispatch being filled (its decision lists every candidate) and the autotune cache's entry, if any.
struct Dispatcher::Selection {
  Selection(const OpDescriptor& d, KernelRule r, std::vector<const Kernel*> k)
      : desc(d), rule(std::move(r)), kernels(std::move(k)), dispatch(std::make_shared<Dispatch>()) {}

  const OpDescriptor& desc;
  const KernelRule rule;
  const std::vector<const Kernel*> kernels;
  std::shared_ptr<Dispatch> dispatch;
  AutotuneCache::Entry cached;
  std::string cache_key;
  bool have_cached = false;
  std::string ranked_first_why;  // the claim of the kernel first_supported() returned (Note [Shape-dependent priority])

  Decision& decision() { return dispatch->decision; }
  std::vector<CandidateReport>& candidates() { return dispatch->decision.candidates; }
  bool supported(const std::string& name) const { return is_supported(dispatch->decision.candidates, name); }

  const Kernel* kernel_named(const std::string& name) const {
    for (const Kernel* k : kernels) {
      if (k->name() == name) return k;
    }
    return nullptr;
  }

  // Note [Shape-dependent priority]
  // Registration order is the priority among an op's kernels, except that a supported kernel may claim the front
  // for one descriptor (Kernel::ranks_first): cuDNN's fused attention on sm_90+ from 2^22 scores on, where it beats
  // flash_v2 (docs/benchmarks.md). The claim is a pure function of the descriptor, so the pick stays reproducible,
  // and its reason goes into the decision.
  const Kernel* first_supported() {
    ranked_first_why.clear();
    for (const Kernel* k : kernels) {
      if (!supported(k->name())) continue;
      std::string why = k->ranks_first(desc);
      if (!why.empty()) {
        ranked_first_why = std::move(why);
        return k;
      }
    }
    for (const Kernel* k : kernels) {
      if (supported(k->name())) return k;
    }
    return nullptr;
  }
  std::string priority_reason(const std::string& base) const {
    return ranked_first_why.empty() ? base : detail::str_cat(base, " (", ranked_first_why, ")");
  }
  UnsupportedOperationError none_supported(const std::string& what) const {
    return UnsupportedOperationError(detail::str_cat(what, " no kernel can run ", dispatch->decision.signature, ": ",
                                                     reasons_text(dispatch->decision.candidates)));
  }
  // A kernel whose plan build failed counts as unsupported, with the build's error as its reason.
  void mark_build_failed(const std::string& name, const UnsupportedOperationError& e) {
    CandidateReport* r = report_of(candidates(), name);
    r->supported = false;
    r->reason = std::string("plan build failed: ") + e.what();
  }
};

std::shared_ptr<Dispatch> Dispatcher::decide(const OpDescriptor& desc) {
  // Policy lookup: the op's rule (its own, else its family's, else auto).
  const OpSchema& schema = registry_->schema(desc.op);
  Selection s(desc, kernel_policy_.resolve(desc.op, schema.family), registry_->kernels(desc.op));
  list_candidates(s, schema);

  // Note [Build failures]
  // supports() answers from the descriptor alone; a library can still find no algorithm when the plan is built
  // (cuDNN's heuristic proposing no engine for an attention graph, say). Such a kernel is then unsupported, with
  // the build's error as its reason, and the rule picks again: a preferred or first-supported rule falls through to
  // the next kernel as it would for a supports() refusal. A pinned kernel, or a plan re-created from the autotune
  // cache, still fails with the error.
  for (;;) {
    for (auto& r : s.candidates()) {
      if (r.supported) r.reason.clear();  // reasons set by the previous pick
    }
    const Kernel* winner = nullptr;
    switch (s.rule.mode) {
      case RuleMode::kPinned: winner = pick_pinned(s); break;
      case RuleMode::kPreferred: winner = pick_preferred(s); break;
      case RuleMode::kAuto: winner = pick_auto(s); break;
    }
    for (auto& r : s.candidates()) {
      if (r.supported && r.kernel != winner->name() && r.reason.empty()) {
        r.reason = "not chosen (" + s.decision().rule + ")";
      }
    }
    if (!build_plan(s, *winner)) continue;  // the build failed: the rule picks again
    record_decision(s, *winner);
    return s.dispatch;
  }
}

// Candidate listing: every kernel's answer (evaluate: device type, determinism, then Kernel::supports, which checks
// the kernel's declaration before its accepts()), the external kernels the rule names, and the autotune cache's entry.
void Dispatcher::list_candidates(Selection& s, const OpSchema& schema) const {
  const OpDescriptor& desc = s.desc;
  Decision& decision = s.decision();
  decision.op = desc.op;
  decision.family = schema.family;
  decision.signature = desc.signature();
  decision.policy_rule = s.rule.str();
  decision.candidates = evaluate(desc);
  // External kernels the rule names (Note [External kernels]) are candidates that this dispatcher cannot run.
  for (const auto& name : s.rule.kernels) {
    const ExternalKernelInfo* external = registry_->find_external_kernel(desc.op, name);
    if (external != nullptr && report_of(decision.candidates, name) == nullptr) {
      decision.candidates.push_back({name, external->runner, false, external_reason(*external), -1});
    }
  }
  XPURT_INTERNAL_ASSERT(!s.kernels.empty(), "op '", desc.op, "' has no kernels");
  s.cache_key = cache_ ? AutotuneCache::key(desc) : std::string();
  s.have_cached = cache_ && cache_->lookup(s.cache_key, &s.cached);
}

// pinned: that kernel, or an UnsupportedOperationError saying why it cannot run and which kernels could.
const Kernel* Dispatcher::pick_pinned(Selection& s) const {
  const OpDescriptor& desc = s.desc;
  Decision& decision = s.decision();
  const std::string& name = s.rule.kernels.at(0);
  const Kernel* winner = s.kernel_named(name);
  if (const ExternalKernelInfo* external = registry_->find_external_kernel(desc.op, name);
      winner == nullptr && external != nullptr) {
    throw UnsupportedOperationError(detail::str_cat(
        "the KernelPolicy pins '", name, "' for '", desc.op, "': ", external_reason(*external),
        ". Kernels that could run ", decision.signature, " here: ", supported_list(decision.candidates),
        " (pin one of them, or list \"", name, "\" with a fallback: [\"", name, "\", ...])"));
  }
  if (winner == nullptr) {
    std::vector<std::string> names;
    for (const Kernel* k : s.kernels) names.push_back(k->name());
    throw UnsupportedOperationError(detail::str_cat(
        "the KernelPolicy pins '", name, "' for '", desc.op, "', but that kernel does not implement op '",
        desc.op, "'; kernels of ", desc.op, ": ", detail::join_names(names)));
  }
  if (!s.supported(name)) {
    throw UnsupportedOperationError(detail::str_cat(
        "pinned kernel '", name, "' cannot run ", decision.signature, ": ",
        report_of(decision.candidates, name)->reason, ". Kernels that could: ", supported_list(decision.candidates),
        " (unpin it, or use \"", name,
        "\" as a preferred kernel to allow a fallback)"));
  }
  decision.rule = "pinned";
  decision.reason = "pinned by the KernelPolicy";
  return winner;
}

// preferred: the first listed kernel that supports the op, else the first supported in priority order ("fallback").
const Kernel* Dispatcher::pick_preferred(Selection& s) const {
  Decision& decision = s.decision();
  const Kernel* winner = nullptr;
  std::string skipped;
  for (const auto& name : s.rule.kernels) {
    const Kernel* k = s.kernel_named(name);
    if (k != nullptr && s.supported(name)) {
      winner = k;
      break;
    }
    const CandidateReport* report = report_of(decision.candidates, name);
    skipped += (skipped.empty() ? "" : "; ") + name + ": " +
               (report != nullptr ? report->reason : "does not implement " + s.desc.op);
  }
  if (winner != nullptr && skipped.empty()) {
    decision.rule = "preferred";
    decision.reason = "preferred by the KernelPolicy";
  } else if (winner != nullptr) {
    decision.rule = "preferred";
    decision.reason = "preferred by the KernelPolicy (earlier preferences skipped: " + skipped + ")";
  } else {
    winner = s.first_supported();
    if (winner == nullptr) throw s.none_supported("preferred kernels cannot run it (" + skipped + ") and");
    decision.rule = "fallback";
    decision.reason =
        s.priority_reason("no preferred kernel could run it (" + skipped + "); fell back to the first supported");
  }
  return winner;
}

// Note [Timed first choices]
// A kernel may ask to be timed when it is the first-supported pick (Kernel::timed_against_others): the own depthwise
// convolution, the first choice for the suite's CNNs, ran MobileViT's 128 x 128 planes at batch 16 at half the speed
// of cuDNN's (docs/benchmarks.md), and no rule of thumb on the descriptor is known to separate the shapes where each
// wins. Then the pick is BestPerformance's over the kernels that support the descriptor: each is built and timed on
// the descriptor's shapes, the fastest kept, and the decision says why it was timed. Unlike a ranking, a timing is
// not a pure function of the descriptor (two kernels within noise of each other may swap), so a build cache or
// autotune cache replays such a choice like any timed one (a second session does not time again, a lock file replays
// it exactly); an entry without timings, left by an untimed pick, is timed afresh. The cost is at plan build: each
// distinct descriptor's candidates built and run (for a convolution, cuDNN's own algorithm search as
// `cudnn_search`), once per build cache.

// auto: the autotune cache's kernel when it may replay it, else the first supported (FirstSupported, timed where that
// kernel asks: Note [Timed first choices]) or the fastest (BestPerformance, autotune()).
const Kernel* Dispatcher::pick_auto(Selection& s) {
  Decision& decision = s.decision();
  const bool first_supported = s.rule.strategy == AutoSelectStrategy::kFirstSupported;
  const Kernel* first = first_supported ? s.first_supported() : nullptr;
  std::string timed_why = first != nullptr ? first->timed_against_others(s.desc) : std::string();
  if (!timed_why.empty()) {
    const auto others = std::count_if(s.kernels.begin(), s.kernels.end(),
                                      [&](const Kernel* k) { return k != first && s.supported(k->name()); });
    if (others == 0) timed_why.clear();
  }
  // An entry of a timed first choice holds its timings; one an untimed pick left (an older version's) is re-timed.
  const bool replay_choice =
      !options_.build_cache || !first_supported || (!timed_why.empty() && !s.cached.times_us.empty());
  if (s.have_cached && replay_choice && s.kernel_named(s.cached.kernel) != nullptr && s.supported(s.cached.kernel)) {
    decision.rule = "autotune-cache";
    decision.reason = "replayed from the autotune cache";
    for (const auto& [name, time] : s.cached.times_us) {
      if (CandidateReport* r = report_of(decision.candidates, name)) r->time_us = time;
    }
    return s.kernel_named(s.cached.kernel);
  }
  if (first_supported && !timed_why.empty()) return autotune(s, timed_why);
  if (first_supported) {
    const Kernel* winner = first;
    if (winner == nullptr) throw s.none_supported("");
    decision.rule = "first-supported";
    decision.reason = s.priority_reason("first supported kernel in priority order");
    return winner;
  }
  return autotune(s);
}

// BestPerformance: build and time every supported candidate, and each one's tactics (Note [Tactics]); the fastest
// plan goes into the dispatch.
const Kernel* Dispatcher::autotune(Selection& s, const std::string& why) {
  const OpDescriptor& desc = s.desc;
  Decision& decision = s.decision();
  std::vector<std::pair<const Kernel*, std::shared_ptr<const KernelPlan>>> built;
  std::vector<std::vector<std::string>> tactics;
  std::size_t plans = 0;
  for (const Kernel* k : s.kernels) {
    if (!s.supported(k->name())) continue;
    try {
      built.emplace_back(k, k->build(desc, exec_policy_, {}));
    } catch (const UnsupportedOperationError& e) {
      s.mark_build_failed(k->name(), e);
      continue;
    }
    tactics.push_back(k->tactics(desc, exec_policy_));
    plans += 1 + tactics.back().size();
  }
  if (built.empty()) throw s.none_supported("");
  // Note [Weights timed from memory]
  const bool cold = options_.weights_from_memory && desc.device.is_cuda() &&
                    std::any_of(built.begin(), built.end(),
                                [&](const auto& b) { return b.first->streams_weight(desc); });
  Tensor flush;  // written before each timed run to push everything else out of the L2, once for every candidate
  if (cold) {
    const std::size_t l2 = DeviceManager::instance().get_device_info(desc.device).l2_cache_bytes;
    const StreamView stream = StreamManager::instance().current_stream(desc.device);
    if (l2 > 0) flush = Tensor::empty({static_cast<std::int64_t>(2 * l2)}, DType::kUInt8, desc.device, &stream);
  }
  const Tensor* flush_with = flush.defined() ? &flush : nullptr;
  const Kernel* winner = nullptr;
  double best = 0;
  std::string tuned;  // what the winner's tactics came to, for the reason
  for (std::size_t j = 0; j < built.size(); ++j) {
    const Kernel* k = built[j].first;
    std::shared_ptr<const KernelPlan> plan = built[j].second;
    double time = plans == 1 ? -1 : time_candidate(*plan, desc, flush_with);
    std::size_t timed = 1;
    for (const std::string& record : tactics[j]) {
      if (record == plan->record()) continue;
      std::shared_ptr<const KernelPlan> other;
      try {
        other = k->build(desc, exec_policy_, record);
      } catch (const UnsupportedOperationError&) {
        continue;  // a tactic this build cannot re-create: not a candidate
      }
      const double other_time = time_candidate(*other, desc, flush_with);
      ++timed;
      if (other_time < time) {
        time = other_time;
        plan = std::move(other);
      }
    }
    report_of(decision.candidates, k->name())->time_us = time;
    if (winner == nullptr || time < best) {
      winner = k;
      best = time;
      s.dispatch->plan = plan;
      tuned = timed > 1 ? detail::str_cat("; ", k->name(), ": the fastest of ", timed, " tactics") : "";
    }
  }
  decision.rule = "autotuned";
  decision.reason = plans == 1 ? "autotuned: the only supported kernel"
                               : detail::str_cat("autotuned: fastest of ", built.size(), " (",
                                                 static_cast<std::int64_t>(best * 1000) / 1000.0, " us)", tuned);
  if (!why.empty()) decision.reason = detail::str_cat(decision.reason, "; timed because ", why);
  if (cold && plans > 1) {
    decision.reason = detail::str_cat(decision.reason, "; timed with the weight read from memory (the L2 cache ",
                                      "cleared before each run: the model's constants outgrow it)");
  }
  for (auto& r : decision.candidates) {
    if (r.supported && r.kernel != winner->name() && r.reason.empty()) {
      r.reason = detail::str_cat("slower (", static_cast<std::int64_t>(r.time_us * 1000) / 1000.0, " us)");
    }
  }
  return winner;
}

// The winner's plan: re-created from the cache's record when the cache chose the same kernel (a lock file replays the
// same algorithm), else built afresh (unless autotuning already built it). False when the build failed in a way that
// makes the rule pick again (Note [Build failures]); throws when it cannot.
bool Dispatcher::build_plan(Selection& s, const Kernel& winner) {
  const bool cached_winner = s.have_cached && s.cached.kernel == winner.name();
  if (s.dispatch->plan && !cached_winner) return true;
  std::string record = cached_winner ? s.cached.plan_record : std::string();
  try {
    try {
      s.dispatch->plan = winner.build(s.desc, exec_policy_, record);
    } catch (const UnsupportedOperationError&) {
      if (record.empty() || !options_.build_cache) throw;
      record.clear();  // a stale build-cache entry: build afresh
      s.dispatch->plan = winner.build(s.desc, exec_policy_, record);
    }
  } catch (const UnsupportedOperationError& e) {
    if (record.empty() && s.rule.mode != RuleMode::kPinned) {
      s.mark_build_failed(winner.name(), e);
      return false;
    }
    if (record.empty()) throw;
    throw UnsupportedOperationError(detail::str_cat("the autotune cache's plan for ", winner.name(), " on ",
                                                    s.decision().signature, " cannot be re-created: ", e.what(),
                                                    " (delete the entry or the cache file to re-tune)"));
  }
  return true;
}

// Recording: the winner and its plan into the decision, and the decision into the autotune cache (a new entry, or
// a re-tuned one).
void Dispatcher::record_decision(Selection& s, const Kernel& winner) const {
  Decision& decision = s.decision();
  s.dispatch->kernel = &winner;
  decision.kernel = winner.name();
  decision.backend = winner.info().backend;
  decision.plan_record = s.dispatch->plan->record();
  decision.plan_summary = s.dispatch->plan->describe();
  if (cache_ && (decision.rule == "autotuned" || !s.have_cached)) {
    AutotuneCache::Entry entry;
    entry.kernel = decision.kernel;
    entry.plan_record = decision.plan_record;
    for (const auto& r : decision.candidates) {
      if (r.time_us >= 0) entry.times_us[r.kernel] = r.time_us;
    }
    cache_->store(s.cache_key, std::move(entry));
  }
}

// Note [Tactics]
// A kernel may offer tactics (Kernel::tactics): the records of other plans it can run the op with, such as the
// other algorithms cuBLASLt's heuristic returns. A library's heuristic ranks algorithms without running them, and
// on some shapes its first choice is slower than another it lists (or than another library's). Under
// auto:BestPerformance every supported kernel's default plan and each of its tactics are built and timed on the
// same inputs; a kernel's time is its fastest plan's, and the winner keeps that plan. Its record goes to the
// autotune cache like any plan's, so a replay re-creates the same algorithm. A tactic whose record the build
// refuses is skipped. Pinned and preferred rules never time anything: they get the kernel's default plan.

// Note [Weights timed from memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A candidate is timed by running it again and again on the same inputs, so whatever fits in the GPU's L2 cache (50
// MiB on an H100) is read from there after the first run. In a model whose constants outgrow the L2 (a 1B Llama reads
// 2.5 GB a decode step), each weight comes from memory every run instead: a decode step's q, k, v, o and down
// projections (2-32 MB each) were timed at L2 speed, where the kernel that is best at streaming from memory need not
// win. So when the session says so (Options::weights_from_memory: its constants exceed the device's L2) and a
// candidate's cost is streaming its weight (Kernel::streams_weight: the GEMV kernels), every candidate of that
// descriptor is timed after a write of twice the L2's size to a scratch buffer, outside the timed interval; the
// decision's reason says so. Other descriptors keep the warm timing: a convolution's or an attention's input is
// usually the output its producer just wrote, still in the L2. On that 1B Llama (H100, 2026-12-06), timed warm,
// gemv ran 81 of a decode step's 97 GEMMs; timed cold, cuBLASLt's GEMMs won every one, the GEMMs' share of a greedy
// step at batch 1 went from 1.38 to 1.14 ms and the step from 2.68 to 2.07-2.30 ms (with Note [Value rows in
// flight] in backends/cuda_raw/flash_decode.cu).
double Dispatcher::time_candidate(const KernelPlan& plan, const OpDescriptor& desc, const Tensor* flush) {
  return time_plan(plan, desc, options_.autotune_warmup, options_.autotune_iterations, flush);
}

double time_plan(const KernelPlan& plan, const OpDescriptor& desc, int warmup, int iterations, const Tensor* flush) {
  XPURT_CHECK(iterations > 0, "time_plan: iterations must be positive, got ", iterations);
  std::mt19937 rng(1234);
  std::vector<Tensor> inputs;
  for (const auto& input : desc.inputs) inputs.push_back(input.present ? random_tensor(input, rng) : Tensor());
  const StreamView made_on =
      desc.device.is_cuda() ? StreamManager::instance().current_stream(desc.device) : StreamView();
  std::vector<Tensor> outputs;
  for (const auto& output : desc.outputs) {
    outputs.push_back(Tensor::empty(output.shape, output.dtype, desc.device, &made_on));
  }
  Tensor scratch = flush != nullptr && desc.device.is_cuda() ? *flush : Tensor();  // a handle to the same bytes
  std::lock_guard<std::mutex> timing(gpu_timing_mutex());
  // Note [Timings on a stream of their own]
  const StreamView stream = desc.device.is_cuda() ? gpu_timing_stream(desc.device) : made_on;
  made_on.synchronize();
  for (int i = 0; i < warmup; ++i) plan.execute(desc, inputs, outputs, stream);
  std::vector<double> times;
  if (desc.device.is_cuda()) {
    Event start(desc.device, true), stop(desc.device, true);
    bool gated = true;  // Note [Timing without host gaps]
    for (int i = 0; i < iterations; ++i) {
      StreamGate gate(gated ? stream : StreamView());
      if (scratch.defined()) scratch.zero_(&stream);
      start.record(stream);
      plan.execute(desc, inputs, outputs, stream);
      stop.record(stream);
      gate.open();
      stop.synchronize();
      gated = gated && !gate.timed_out();
      times.push_back(start.elapsed_ms(stop) * 1000.0);
    }
  } else {
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      plan.execute(desc, inputs, outputs, stream);
      times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<Tensor> Dispatcher::run(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                                    const StreamView* stream, Decision* decision) {
  OpDescriptor desc = make_op_descriptor(op, inputs, attrs, exec_policy_);
  const std::shared_ptr<const Dispatch> dispatch = select(desc);
  const StreamView run_stream =
      stream ? *stream : (desc.device.is_cuda() ? StreamManager::instance().current_stream(desc.device) : StreamView());
  std::vector<Tensor> full_inputs = inputs;
  full_inputs.resize(desc.inputs.size());
  std::vector<Tensor> outputs;
  outputs.reserve(desc.outputs.size());
  for (const auto& output : desc.outputs) {
    outputs.push_back(Tensor::empty(output.shape, output.dtype, desc.device, &run_stream));
  }
  dispatch->plan->execute(desc, full_inputs, outputs, run_stream);
  if (decision) *decision = dispatch->decision;
  return outputs;
}

void Dispatcher::run_into(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                          std::vector<Tensor>& outputs, const StreamView* stream, Decision* decision,
                          const Tensor* workspace) {
  OpDescriptor desc = make_op_descriptor(op, inputs, attrs, exec_policy_);
  const std::shared_ptr<const Dispatch> dispatch = select(desc);
  XPURT_CHECK(outputs.size() == desc.outputs.size(), "op '", op, "': expected ", desc.outputs.size(),
              " output tensor(s), but got ", outputs.size());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    const TensorDesc& want = desc.outputs[k];
    XPURT_CHECK(out.defined(), "op '", op, "': output ", k, " is undefined");
    XPURT_CHECK(out.shape() == want.shape && out.dtype() == want.dtype && out.device() == desc.device &&
                    out.is_contiguous(),
                "op '", op, "': expected output ", k, " as a contiguous ", dtype_name(want.dtype),
                detail::shape_str(want.shape), " tensor on ", desc.device.str(), ", but got ", dtype_name(out.dtype()),
                detail::shape_str(out.shape()), " on ", out.device().str(),
                out.is_contiguous() ? "" : " (not contiguous)");
  }
  const StreamView run_stream =
      stream ? *stream : (desc.device.is_cuda() ? StreamManager::instance().current_stream(desc.device) : StreamView());
  std::vector<Tensor> full_inputs = inputs;
  full_inputs.resize(desc.inputs.size());
  dispatch->plan->execute(desc, full_inputs, outputs, run_stream, workspace);
  if (decision) *decision = dispatch->decision;
}

std::vector<Decision> Dispatcher::decisions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Decision> out;
  for (const auto& signature : order_) {
    const auto it = dispatches_.find(signature);
    if (it != dispatches_.end()) out.push_back(it->second->decision);  // else still being decided
  }
  return out;
}

}  // namespace xpuruntime
