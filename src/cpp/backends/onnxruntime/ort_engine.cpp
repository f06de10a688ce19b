// The onnxruntime engine: a whole ONNX model run by ONNX Runtime (CPU execution provider, or the CUDA plugin
// execution provider on CUDA devices).
//
// Contract (on top of engine.h):
//  - available(): yes on CPU; on CUDA only when the CUDA plugin library is found (XPURT_ORT_CUDA_PROVIDER, or
//    libonnxruntime_providers_cuda.so next to libonnxruntime.so).
//  - create(): policies map to ORT session/provider options; entries ORT cannot honour are listed in
//    Explanation::policy_notes, and a pinned kernel rule ORT cannot honour throws UnsupportedOperationError.
//  - run(): CPU tensors are bound without copies; outputs are ORT-allocated CPU tensors wrapped zero-copy.
//    Thread-safe: Ort::Session::Run is, and the profile is read once under a mutex.
//  - explain(): the execution provider of every node, read from ORT's profile of the first run.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/onnxruntime/ort_utils.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {
namespace {

constexpr const char* kEngineName = "onnxruntime";
constexpr const char* kCudaProviderEnv = "XPURT_ORT_CUDA_PROVIDER";
constexpr const char* kCudaProviderFile = "libonnxruntime_providers_cuda.so";
constexpr const char* kCudaProviderPackage = "com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9";

// ---- CUDA plugin execution provider ----

// The CUDA provider library to register: $XPURT_ORT_CUDA_PROVIDER, else the file next to libonnxruntime.so.
// Empty with `why` set when there is none.
std::string find_cuda_provider(std::string* why) {
  if (const char* path = std::getenv(kCudaProviderEnv); path != nullptr && *path != '\0') {
    if (std::filesystem::exists(path)) return path;
    *why = detail::str_cat(kCudaProviderEnv, "=", path, " does not exist");
    return {};
  }
  Dl_info info{};
  std::filesystem::path next_to_ort;
  if (dladdr(reinterpret_cast<const void*>(&OrtGetApiBase), &info) != 0 && info.dli_fname != nullptr) {
    next_to_ort = std::filesystem::path(info.dli_fname).parent_path() / kCudaProviderFile;
    if (std::filesystem::exists(next_to_ort)) return next_to_ort.string();
  }
  *why = detail::str_cat("the ONNX Runtime CUDA execution provider (", kCudaProviderFile, ") was not found ",
                         next_to_ort.empty() ? std::string() : "at " + next_to_ort.string() + " ",
                         "nor named by ", kCudaProviderEnv, "; install it from the npm package ", kCudaProviderPackage,
                         " (Plugins/Linux/x64/", kCudaProviderFile, ") and set ", kCudaProviderEnv,
                         "=<path>, or put it next to libonnxruntime.so");
  return {};
}

// The EP device of CUDA device `index` from the plugin library, registered on the Env once per process.
Ort::ConstEpDevice cuda_ep_device(int index) {
  static std::mutex mutex;
  static bool registered = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!registered) {
    std::string why;
    std::string path = find_cuda_provider(&why);
    if (path.empty()) throw UnsupportedOperationError(why);
    XPURT_ORT_CHECK(ort::env().RegisterExecutionProviderLibrary("CUDA", path));
    registered = true;
  }
  std::vector<Ort::ConstEpDevice> devices;
  XPURT_ORT_CHECK(devices = ort::env().GetEpDevices());
  int seen = 0;
  for (const Ort::ConstEpDevice& device : devices) {
    if (std::string(device.EpName()) != "CUDAExecutionProvider") continue;
    if (seen++ == index) return device;
  }
  throw UnsupportedOperationError(detail::str_cat("the ONNX Runtime CUDA execution provider sees ", seen,
                                                  " CUDA device(s); cuda:", index, " is not among them"));
}

// ---- policies -> ORT options ----

struct OrtConfig {
  std::vector<std::string> options;       // as set, for explain()
  std::vector<std::string> policy_notes;  // how each policy entry was honoured
  std::unordered_map<std::string, std::string> cuda_options;  // CUDA provider options
};

// Note [Policies ORT can honour]: ORT chooses kernels per node itself. The only kernel choice it exposes is the
// cuDNN convolution algorithm search of the CUDA provider, so a `conv` rule naming cudnn/cudnn_search maps to
// cudnn_conv_algo_search on CUDA; every other rule is listed as not honoured, and a pinned one throws, because
// pinning promises that exactly that kernel runs. CUDA graphs are not enabled: ORT replays a captured graph on
// the addresses of its first run, which only holds with IoBinding on persistent buffers, while run() binds each
// call's own tensors.
OrtConfig map_policies(const SessionOptions& options) {
  OrtConfig config;
  const bool cuda = options.device.is_cuda();
  std::string unhonoured_pins;
  for (const auto& [key, rule] : options.kernel_policy.rules()) {
    if (rule.mode == RuleMode::kAuto) continue;
    const std::string& first = rule.kernels.front();
    if (cuda && key == "conv" && (first == "cudnn" || first == "cudnn_search")) {
      std::string search = first == "cudnn_search" ? "EXHAUSTIVE" : "HEURISTIC";
      config.cuda_options["cudnn_conv_algo_search"] = search;
      config.policy_notes.push_back(detail::str_cat(key, "=", rule.str(), " -> cudnn_conv_algo_search=", search));
      continue;
    }
    std::string why = key == "matmul" || key == "linear" ? "ORT picks its own GEMM"
                                                         : "ORT assigns kernels to nodes itself";
    config.policy_notes.push_back(detail::str_cat(key, "=", rule.str(), ": not honoured by onnxruntime (", why, ")"));
    if (rule.mode == RuleMode::kPinned) {
      unhonoured_pins += detail::str_cat(unhonoured_pins.empty() ? "" : ", ", key, "=", rule.str());
    }
  }
  if (!unhonoured_pins.empty()) {
    throw UnsupportedOperationError(detail::str_cat(
        "the onnxruntime engine cannot honour the pinned kernel rule(s) ", unhonoured_pins,
        " (ORT assigns kernels itself", cuda ? "; on CUDA only conv=cudnn or conv=cudnn_search is honoured" : "",
        "); use engine=\"native\" for pinned kernels, or make the rule preferred"));
  }

  const ExecutionPolicy& policy = options.exec_policy;
  const Precision precision = options.fp16 ? Precision::kFP16 : policy.precision;
  if (cuda) {
    const bool tf32 = precision == Precision::kTF32;
    config.cuda_options["use_tf32"] = tf32 ? "1" : "0";
    config.policy_notes.push_back(detail::str_cat("precision=", precision_name(precision), " -> use_tf32=",
                                                  tf32 ? "1" : "0"));
    config.cuda_options["enable_cuda_graph"] = "0";
    config.cuda_options["device_id"] = std::to_string(options.device.index);
    if (policy.cuda_graphs) {
      config.policy_notes.push_back(
          "cuda_graphs=true: not honoured by onnxruntime (its CUDA graphs need IoBinding on fixed buffers)");
    }
  }
  if (precision == Precision::kFP16 || precision == Precision::kBF16 || precision == Precision::kInt8) {
    config.policy_notes.push_back(detail::str_cat("precision=", precision_name(precision),
                                                  ": not honoured by onnxruntime (the model runs in its own dtypes)"));
  }
  if (policy.workspace_limit != 0) {
    config.policy_notes.push_back("workspace_limit: not honoured by onnxruntime");
  }
  if (policy.memory_limit != 0) {
    if (cuda) {
      config.cuda_options["gpu_mem_limit"] = std::to_string(policy.memory_limit);
      config.policy_notes.push_back(detail::str_cat("memory_limit -> gpu_mem_limit=", policy.memory_limit));
    } else {
      config.policy_notes.push_back("memory_limit: not honoured by onnxruntime on cpu");
    }
  }
  return config;
}

// ---- model inputs and outputs ----

std::vector<ValueInfo> value_infos(const Ort::Session& session, bool inputs) {
  Ort::AllocatorWithDefaultOptions allocator;
  std::vector<ValueInfo> infos;
  const size_t count = inputs ? session.GetInputCount() : session.GetOutputCount();
  const char* kind = inputs ? "input" : "output";
  for (size_t i = 0; i < count; ++i) {
    ValueInfo info;
    Ort::TypeInfo type_info(nullptr);
    XPURT_ORT_CHECK(info.name = (inputs ? session.GetInputNameAllocated(i, allocator)
                                        : session.GetOutputNameAllocated(i, allocator))
                                    .get());
    XPURT_ORT_CHECK(type_info = inputs ? session.GetInputTypeInfo(i) : session.GetOutputTypeInfo(i));
    if (type_info.GetONNXType() != ONNX_TYPE_TENSOR) {
      throw UnsupportedOperationError(detail::str_cat(kind, " '", info.name,
                                                      "' is not a tensor (a sequence, map or optional); the "
                                                      "onnxruntime engine exchanges tensors only"));
    }
    auto tensor_info = type_info.GetTensorTypeAndShapeInfo();
    const ONNXTensorElementDataType element = tensor_info.GetElementType();
    if (!ort::dtype_from_onnx(element, &info.dtype)) {
      throw UnsupportedOperationError(detail::str_cat(kind, " '", info.name, "' has element type ",
                                                      ort::onnx_type_name(element),
                                                      ", which xpuruntime tensors cannot hold"));
    }
    const std::vector<int64_t> dims = tensor_info.GetShape();
    const std::vector<const char*> symbols = tensor_info.GetSymbolicDimensions();
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] >= 0) {
        info.shape.push_back(std::to_string(dims[d]));
      } else if (d < symbols.size() && symbols[d] != nullptr && *symbols[d] != '\0') {
        info.shape.push_back(symbols[d]);
      } else {
        info.shape.push_back("?");
      }
    }
    infos.push_back(std::move(info));
  }
  return infos;
}

std::string describe(DType dtype, const std::vector<std::string>& shape) {
  std::string out = detail::str_cat(dtype_name(dtype), "[");
  for (size_t i = 0; i < shape.size(); ++i) out += detail::str_cat(i ? ", " : "", shape[i]);
  return out + "]";
}

std::string describe(const Tensor& tensor) {
  std::vector<std::string> shape;
  for (int64_t d : tensor.shape()) shape.push_back(std::to_string(d));
  return describe(tensor.dtype(), shape);
}

std::string names_of(const std::vector<ValueInfo>& infos) {
  std::string out;
  for (const ValueInfo& info : infos) out += detail::str_cat(out.empty() ? "" : ", ", "'", info.name, "'");
  return out;
}

// A unique file-name prefix in the temporary folder for this session's profile.
std::string profile_prefix() {
  static std::atomic<std::uint64_t> counter{0};
  std::filesystem::path dir = std::filesystem::temp_directory_path();
  return (dir / detail::str_cat("xpurt_ort_profile_", static_cast<long>(::getpid()), "_", counter.fetch_add(1)))
      .string();
}

// Removes profile files ORT wrote under `prefix` ("<prefix>_<date>.json"); ORT creates one even when loading the
// model fails.
void remove_profiles(const std::string& prefix) {
  const std::filesystem::path base(prefix);
  const std::string stem = base.filename().string();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(base.parent_path(), error)) {
    if (entry.path().filename().string().rfind(stem + "_", 0) == 0) {
      std::error_code ignored;
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

// Node explanations from ORT's profile: the "Node" events named "<node>_kernel_time" carry op_name and provider.
std::vector<NodeExplanation> parse_profile(const std::string& path, const std::string& precision) {
  std::vector<NodeExplanation> nodes;
  std::ifstream file(path);
  if (!file) return nodes;
  nlohmann::json events = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (!events.is_array()) return nodes;
  std::set<std::string> seen;
  const std::string suffix = "_kernel_time";
  for (const auto& event : events) {
    if (!event.is_object() || event.value("cat", "") != "Node") continue;
    std::string name = event.value("name", "");
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    name.resize(name.size() - suffix.size());
    if (!seen.insert(name).second) continue;
    const nlohmann::json args = event.value("args", nlohmann::json::object());
    NodeExplanation node;
    node.node = name;
    node.op_type = args.value("op_name", "");
    node.kernel = args.value("provider", "");
    node.backend = kEngineName;
    node.precision = precision;
    node.reason = "assigned by ONNX Runtime's graph partitioner (profile of the first run)";
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// ---- the session ----

class OrtSession final : public EngineSession {
 public:
  OrtSession(const std::string& model, const SessionOptions& options) : options_(options) {
    OrtConfig config = map_policies(options);
    Ort::SessionOptions session_options;
    XPURT_ORT_CHECK(session_options.SetIntraOpNumThreads(options.exec_policy.intra_op_threads));
    config.options.push_back(detail::str_cat("intra_op_num_threads=", options.exec_policy.intra_op_threads));
    XPURT_ORT_CHECK(session_options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL));
    config.options.push_back("graph_optimization_level=ORT_ENABLE_ALL");
    if (options.exec_policy.deterministic) {
      XPURT_ORT_CHECK(session_options.SetDeterministicCompute(true));
      config.options.push_back("use_deterministic_compute=1");
      config.policy_notes.push_back("deterministic=true -> use_deterministic_compute=1");
    }
    const std::string prefix = profile_prefix();
    XPURT_ORT_CHECK(session_options.EnableProfiling(prefix.c_str()));
    config.options.push_back("profiling=on until the first run (to report execution providers)");
    if (options.device.is_cuda()) {
      Ort::ConstEpDevice device = cuda_ep_device(options.device.index);
      XPURT_ORT_CHECK(session_options.AppendExecutionProvider_V2(ort::env(), {device}, config.cuda_options));
      config.options.push_back("execution_provider=CUDAExecutionProvider (plugin), then CPUExecutionProvider");
      for (const auto& [key, value] : std::map<std::string, std::string>(config.cuda_options.begin(),
                                                                        config.cuda_options.end())) {
        config.options.push_back(detail::str_cat("cuda.", key, "=", value));
      }
    } else {
      config.options.push_back("execution_provider=CPUExecutionProvider");
    }
    try {
      XPURT_ORT_CHECK(session_ = std::make_unique<Ort::Session>(ort::env(), model.data(), model.size(),
                                                                session_options));
    } catch (...) {
      remove_profiles(prefix);
      throw;
    }
    options_list_ = std::move(config.options);
    policy_notes_ = std::move(config.policy_notes);
    inputs_ = value_infos(*session_, /*inputs=*/true);
    outputs_ = value_infos(*session_, /*inputs=*/false);
    for (const ValueInfo& info : inputs_) input_names_.push_back(info.name.c_str());
  }

  ~OrtSession() override {
    // A session destroyed with profiling on writes its profile: end it here and remove the file.
    try {
      std::lock_guard<std::mutex> lock(profile_mutex_);
      end_profiling_locked();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; the profile is only a report
    }
  }

  OrtSession(const OrtSession&) = delete;
  OrtSession& operator=(const OrtSession&) = delete;

  const std::vector<ValueInfo>& inputs() const override { return inputs_; }
  const std::vector<ValueInfo>& outputs() const override { return outputs_; }

  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names) override {
    // Feeds, in the model's input order. `keep` holds contiguous CPU copies alive through Run.
    std::vector<const Tensor*> by_input(inputs_.size(), nullptr);
    for (const auto& [name, tensor] : feeds) {
      auto it = std::find_if(inputs_.begin(), inputs_.end(), [&](const ValueInfo& v) { return v.name == name; });
      XPURT_CHECK(it != inputs_.end(), "unknown input '", name, "'; the model's inputs are ", names_of(inputs_));
      const size_t index = static_cast<size_t>(it - inputs_.begin());
      XPURT_CHECK(by_input[index] == nullptr, "input '", name, "' is fed twice");
      XPURT_CHECK(tensor.defined(), "input '", name, "' is an undefined tensor");
      by_input[index] = &tensor;
    }
    std::vector<Tensor> keep;
    keep.reserve(inputs_.size());
    std::vector<Ort::Value> values;
    values.reserve(inputs_.size());
    const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const ValueInfo& info = inputs_[i];
      XPURT_CHECK(by_input[i] != nullptr, "input '", info.name, "' (", describe(info.dtype, info.shape),
                  ") is not fed; the model's inputs are ", names_of(inputs_));
      const Tensor& given = *by_input[i];
      XPURT_CHECK_TYPE(given.dtype() == info.dtype, "input '", info.name, "' expects ",
                       describe(info.dtype, info.shape), ", got ", describe(given));
      bool shape_ok = given.dim() == static_cast<int>(info.shape.size());
      for (size_t d = 0; shape_ok && d < info.shape.size(); ++d) {
        const std::string& dim = info.shape[d];
        if (!dim.empty() && std::all_of(dim.begin(), dim.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          shape_ok = std::to_string(given.shape()[d]) == dim;
        }
      }
      XPURT_CHECK(shape_ok, "input '", info.name, "' expects ", describe(info.dtype, info.shape), ", got ",
                  describe(given));
      // Note [Zero-copy feeds]: ORT reads a CPU feed in place; other devices are copied to the host first (ORT
      // then copies to the execution provider's device itself).
      Tensor host = given.device().is_cpu() ? given.contiguous() : given.to(Device::cpu()).contiguous();
      keep.push_back(host);
      static std::uint64_t empty_storage = 0;  // ORT wants a non-null pointer even for zero elements
      void* data = host.numel() == 0 ? static_cast<void*>(&empty_storage) : host.data_ptr();
      XPURT_ORT_CHECK(values.push_back(Ort::Value::CreateTensor(cpu, data, host.nbytes(), host.shape().data(),
                                                                host.shape().size(),
                                                                ort::onnx_from_dtype(host.dtype()))));
    }

    std::vector<std::string> wanted = output_names;
    if (wanted.empty()) {
      for (const ValueInfo& info : outputs_) wanted.push_back(info.name);
    }
    std::vector<const char*> wanted_c;
    std::vector<DType> wanted_dtypes;
    for (const std::string& name : wanted) {
      auto it = std::find_if(outputs_.begin(), outputs_.end(), [&](const ValueInfo& v) { return v.name == name; });
      XPURT_CHECK(it != outputs_.end(), "unknown output '", name, "'; the model's outputs are ", names_of(outputs_));
      wanted_c.push_back(name.c_str());
      wanted_dtypes.push_back(it->dtype);
    }

    std::vector<Ort::Value> results;
    XPURT_ORT_CHECK(results = session_->Run(Ort::RunOptions{nullptr}, input_names_.data(), values.data(),
                                            values.size(), wanted_c.data(), wanted_c.size()));
    finish_profile_once();

    std::vector<Tensor> outputs;
    outputs.reserve(results.size());
    for (size_t i = 0; i < results.size(); ++i) {
      XPURT_INTERNAL_ASSERT(results[i].IsTensor(), "output '", wanted[i], "' is not a tensor");
      auto owner = std::make_shared<Ort::Value>(std::move(results[i]));
      auto tensor_info = owner->GetTensorTypeAndShapeInfo();
      XPURT_INTERNAL_ASSERT(owner->GetTensorMemoryInfo().GetDeviceType() == OrtMemoryInfoDeviceType_CPU,
                            "ORT returned output '", wanted[i], "' outside host memory");
      const std::vector<int64_t> shape = tensor_info.GetShape();
      const size_t bytes = tensor_info.GetElementCount() * dtype_size(wanted_dtypes[i]);
      void* data = owner->GetTensorMutableRawData();
      // Note [Zero-copy outputs]: the Tensor views ORT's buffer and owns the Ort::Value that frees it.
      outputs.push_back(Tensor::from_blob(data, shape, {}, wanted_dtypes[i], Device::cpu(),
                                          std::shared_ptr<void>(owner, data), bytes));
    }
    return outputs;
  }

  Explanation explain() const override {
    Explanation explanation;
    explanation.engine = kEngineName;
    explanation.engine_reason = detail::str_cat("ONNX Runtime ", Ort::GetVersionString());
    explanation.device = options_.device.str();
    explanation.options = options_list_;
    explanation.options.push_back(detail::str_cat("onnxruntime_version=", Ort::GetVersionString()));
    explanation.policy_notes = policy_notes_;
    std::lock_guard<std::mutex> lock(profile_mutex_);
    if (!profile_done_) {
      explanation.options.push_back("nodes: not run yet (execution providers are reported after the first run)");
    } else {
      explanation.nodes = nodes_;
    }
    return explanation;
  }

 private:
  void finish_profile_once() {
    std::lock_guard<std::mutex> lock(profile_mutex_);
    if (!profile_done_) end_profiling_locked();
  }

  // Note [Profile of the first run]: ORT records per-node events while profiling is on; ending it after the first
  // run writes them once (profiling every run would cost time and grow the file), and the file is removed after
  // reading. Caller holds profile_mutex_.
  void end_profiling_locked() {
    if (profile_done_) return;
    profile_done_ = true;
    Ort::AllocatorWithDefaultOptions allocator;
    std::string path;
    XPURT_ORT_CHECK(path = session_->EndProfilingAllocated(allocator).get());
    if (path.empty()) return;
    nodes_ = parse_profile(path, precision_name(options_.fp16 ? Precision::kFP16 : options_.exec_policy.precision));
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }

  SessionOptions options_;
  std::unique_ptr<Ort::Session> session_;
  std::vector<ValueInfo> inputs_;
  std::vector<ValueInfo> outputs_;
  std::vector<const char*> input_names_;  // point into inputs_
  std::vector<std::string> options_list_;
  std::vector<std::string> policy_notes_;
  mutable std::mutex profile_mutex_;
  bool profile_done_ = false;
  std::vector<NodeExplanation> nodes_;
};

class OrtEngine final : public Engine {
 public:
  OrtEngine() : Engine(kEngineName) {}

  Support available(const SessionOptions& options) const override {
    try {
      ort::ort_api();
    } catch (const XpuRuntimeError& error) {
      return Support::no(error.what());
    }
    if (options.device.is_cpu()) return Support::yes();
    if (!options.device.is_cuda()) {
      return Support::no(detail::str_cat("the onnxruntime engine runs on cpu and cuda devices, not ",
                                         options.device.str()));
    }
    std::string why;
    if (find_cuda_provider(&why).empty()) return Support::no(why);
    return Support::yes();
  }

  std::unique_ptr<EngineSession> create(const std::string& model, const SessionOptions& options) const override {
    Support support = available(options);
    if (!support) {
      throw UnsupportedOperationError(detail::str_cat("the onnxruntime engine cannot run on ", options.device.str(),
                                                      ": ", support.reason()));
    }
    return std::make_unique<OrtSession>(model, options);
  }
};

}  // namespace

void register_onnxruntime(EngineRegistry& registry) { registry.add(std::make_unique<OrtEngine>()); }

}  // namespace xpuruntime
