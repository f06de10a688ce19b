// The onnxruntime engine: a whole ONNX model run by ONNX Runtime (CPU execution provider, or the CUDA plugin
// execution provider on CUDA devices).
//
// Contract (on top of engine.h):
//  - available(): yes on CPU; on CUDA only when the CUDA plugin library is found (XPURT_ORT_CUDA_PROVIDER, or
//    libonnxruntime_providers_cuda.so next to libonnxruntime.so).
//  - create(): policies map to ORT session/provider options; entries ORT cannot honour are listed in
//    Explanation::policy_notes, and a pinned kernel rule ORT cannot honour throws UnsupportedOperationError.
//  - run(): OrtValues over xpuruntime memory (Note [Bound runs]): feeds on the session's device are bound in place,
//    others are copied (CPU feeds of a CUDA session by ORT itself); outputs are tensors of xpuruntime's allocator
//    when their shapes are known beforehand, else ORT's own buffers wrapped without a copy. On CUDA with
//    ExecutionPolicy::cuda_graphs, runs replay ORT-captured CUDA graphs over staging buffers (Note [CUDA graphs
//    through ORT]). Thread-safe: Ort::Session::Run is, every run has its own values, the shape cache and the
//    profile are guarded by mutexes, and graph runs are serialized.
//  - explain(): the execution provider of every node, read from ORT's profile of the first run.
//  - Profiling (ort_profiling.h, Note [ORT profile on the timeline] in core/profiler_ort.cpp): ORT profiles a run
//    only while a Profiler records (every node ORT runs becomes a "node" event of the Profiler; CUDA graph sessions
//    run without their graph meanwhile) and the session's first run (for explain()); other runs cost two relaxed
//    atomic loads.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <onnxruntime_run_options_config_keys.h>
#include <onnxruntime_session_options_config_keys.h>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engines/onnxruntime/ort_model_fixes.h"
#include "frontends/onnx/onnx_quantize.h"
#include "engines/onnxruntime/ort_profiling.h"
#include "engines/onnxruntime/ort_memory_budget.h"
#include "engines/onnxruntime/ort_stop.h"
#include "engines/onnxruntime/ort_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/profiler.h"
#include "xpuruntime/stream_manager.h"

namespace xpuruntime {
namespace {

constexpr const char* kEngineName = "onnxruntime";
constexpr const char* kCudaProviderEnv = "XPURT_ORT_CUDA_PROVIDER";
constexpr const char* kCudaProviderFile = "libonnxruntime_providers_cuda.so";
constexpr const char* kCudaProviderPackage = "com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9";
// Input-shape signatures that get their own CUDA graph and staging buffers; later ones run without a graph.
constexpr size_t kMaxGraphSignatures = 8;
// Input-shape signatures whose output shapes are remembered (Note [Bound runs]).
constexpr size_t kMaxCachedSignatures = 256;

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

// ONNX Runtime's provider bridge (libonnxruntime_providers_shared.so, which exports Provider_GetHost): the CUDA
// plugin resolves symbols from it, and the plugin route does not load it the way ORT's own provider loader does.
// Loaded globally once, from next to the plugin or next to libonnxruntime.so; when neither has it, registering the
// plugin reports the missing symbol.
void load_providers_shared(const std::string& plugin_path) {
  std::vector<std::filesystem::path> candidates = {std::filesystem::path(plugin_path).parent_path()};
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&OrtGetApiBase), &info) != 0 && info.dli_fname != nullptr) {
    candidates.push_back(std::filesystem::path(info.dli_fname).parent_path());
  }
  for (const auto& folder : candidates) {
    const std::filesystem::path file = folder / "libonnxruntime_providers_shared.so";
    if (std::filesystem::exists(file) && dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return;
  }
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
    load_providers_shared(path);
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
// pinning promises that exactly that kernel runs. ExecutionPolicy::cuda_graphs maps to enable_cuda_graph (Note
// [CUDA graphs through ORT]); `cuda_graphs` false here turns it off whatever the policy says (the fallback when
// ORT refuses graph capture for a model).
OrtConfig map_policies(const SessionOptions& options, bool cuda_graphs) {
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
    const bool graphs = policy.cuda_graphs && cuda_graphs;
    config.cuda_options["enable_cuda_graph"] = graphs ? "1" : "0";
    config.cuda_options["device_id"] = std::to_string(options.device.index);
    if (graphs) {
      config.policy_notes.push_back(detail::str_cat(
          "cuda_graphs=true -> enable_cuda_graph=1: per input-shape signature (at most ", kMaxGraphSignatures,
          ") device staging buffers at fixed addresses; each run copies its feeds in and its outputs out (one "
          "device copy per input and output, plus a synchronization), runs of the session are serialized, the "
          "first run of a signature runs without a graph and the second captures one"));
    } else if (!policy.cuda_graphs) {
      config.policy_notes.push_back("cuda_graphs=false -> enable_cuda_graph=0");
    }
  }
  if (std::string note = onnx_frontend::quantization_note(policy); !note.empty()) {
    config.policy_notes.push_back(detail::str_cat("precision=", precision_name(precision), " -> ", note,
                                                  " (the policy's decisions, applied to the model ORT loads)"));
  } else if (precision != Precision::kFP32 && precision != Precision::kTF32) {
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
      config.policy_notes.push_back(detail::str_cat("memory_limit -> each run's CPU allocations charged to a budget of ",
                                                    policy.memory_limit, " bytes (Note [memory_limit through ORT])"));
    }
  }
  return config;
}

// The rules of ONNX Runtime 1.29's graph optimizer that misread float8 QuantizeLinear (Note [Float8 QDQ through ORT's
// CPU] in ort_model_fixes.cpp): Relu -> Q drops the Relu, Clip -> Q throws on the float8 zero point. Separated by ';':
// ORT 1.29 splits the entry at ';' (its header says commas; "A,B" disables neither).
constexpr const char* kFloat8UnsafeRules = "ReluQuantRewrite;ClipQuantRewrite";

// Turns off ORT's QDQ fusion and the rules above for a model with float8 QuantizeLinear/DequantizeLinear, listing
// the entries in `config` (Note [Float8 QDQ through ORT's CPU] in ort_model_fixes.cpp).
void without_qdq_fusion(Ort::SessionOptions& session_options, OrtConfig& config) {
  XPURT_ORT_CHECK(session_options.AddConfigEntry(kOrtSessionOptionsDisableQuantQDQ, "1"));
  XPURT_ORT_CHECK(session_options.AddConfigEntry(kOrtSessionOptionsDisableSpecifiedOptimizers, kFloat8UnsafeRules));
  config.options.push_back(detail::str_cat(kOrtSessionOptionsDisableQuantQDQ, "=1"));
  config.options.push_back(detail::str_cat(kOrtSessionOptionsDisableSpecifiedOptimizers, "=", kFloat8UnsafeRules));
  config.policy_notes.push_back(detail::str_cat(
      "float8 QuantizeLinear/DequantizeLinear in the model -> ", kOrtSessionOptionsDisableQuantQDQ, "=1 and ",
      kOrtSessionOptionsDisableSpecifiedOptimizers, "=", kFloat8UnsafeRules, ": ONNX Runtime ", Ort::GetVersionString(),
      "'s CPU optimizer would turn DequantizeLinear -> Gemm/MatMul into QGemm/MatMulIntegerToFloat, which take no "
      "float8, drop a Relu before a float8 QuantizeLinear and refuse a Clip before one; the quantize and dequantize "
      "nodes run as written (Note [Float8 QDQ through ORT's CPU])"));
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

// ---- the session ----

// Note [Bound runs]: a run hands ORT OrtValues over xpuruntime memory (Session::Run is thread-safe; nothing per-run is
// shared). Inputs: a feed on the session's device is bound in place (made contiguous first); a CPU feed of a CUDA
// session is bound as host memory and ORT copies it to the device; a feed on another device is copied to the session's
// device first. ORT runs on a stream of its own, so on CUDA the caller's current stream is synchronized before Run:
// device feeds were written on it, and an xpuruntime-allocated output may reuse memory that work queued on it still
// reads (the caching allocator orders reuse on that stream only). ORT synchronizes its streams before Run returns, so
// the outputs are ready for any stream. Outputs: an output whose shape is known before the run -- every dimension
// static in the model, or seen in an earlier run with the same input shapes (the "signature", at most
// kMaxCachedSignatures remembered) -- is allocated by xpuruntime's allocator on the session's device and passed to Run
// pre-allocated; otherwise ORT allocates it and the tensor wraps ORT's buffer without a copy (keeping the value and the
// session alive). Plain Run would allocate such outputs in host memory, so a CUDA run with one goes through an
// Ort::IoBinding of its own that binds it to the device instead. An output whose shape depends on values (NonZero)
// makes ORT reject a pre-allocated buffer of another shape: the run is retried with ORT allocating, and that signature
// is not pre-allocated again.
//
// Note [CUDA graphs through ORT]: with enable_cuda_graph=1, ORT captures the CUDA EP's kernels into a graph during
// the first run with a given graph annotation id (run option "gpu_graph_id"; it runs the model twice inside that
// call: once to allocate, once to capture) and replays it afterwards on the addresses bound at capture; id -1
// runs without a graph. A graph therefore needs buffers whose addresses never change: per input-shape signature
// the session keeps staging tensors for every input and output (xpuruntime's allocator), one IoBinding over them
// and an id. A run copies its feeds into the staging inputs, replays, and copies the wanted outputs into fresh
// tensors, because the next run overwrites the staging outputs: one device copy per input and output, each
// synchronized (a few microseconds each plus bytes / bandwidth). For batch-1 models that is a visible share of
// the run, so ORT's graphs gain less here than for a caller who owns fixed buffers; benchmarks/session_bench.py
// measures both. The first run of a signature runs without a graph (it learns the output shapes and takes ORT's
// profile); the second sets the staging up and captures. Staging buffers, graphs and the intermediate buffers
// baked into them are shared, so all runs of such a session are serialized by one mutex (ORT does not support
// concurrent runs with CUDA graphs either). At most kMaxGraphSignatures signatures get a graph; later ones, and a
// signature whose capture failed (a data-dependent shape, an input ORT wants on the host), run bound without a
// graph, which explain() lists. When ORT refuses graph capture for the whole model (nodes outside the CUDA EP),
// the session is rebuilt without it and explain() says why.

using Shape = std::vector<int64_t>;
using SignatureKey = std::vector<int64_t>;  // per input: rank, then the dimensions
constexpr int kNoGraph = -1;                // gpu_graph_id of a run without a CUDA graph

// Keeps ORT's output buffer alive: the value, and the session whose allocator owns the memory.
struct OrtOutputOwner {
  std::shared_ptr<Ort::Session> session;
  Ort::Value value;
};

// One CUDA graph of a session: the staging tensors bound at fixed addresses and the run options naming the graph.
struct GraphSet {
  int id = 0;
  std::vector<Tensor> inputs;   // model input order
  std::vector<Tensor> outputs;  // model output order
  std::unique_ptr<Ort::IoBinding> binding;
  Ort::RunOptions run_options{nullptr};
  bool captured = false;  // a graph run succeeded (ORT captured)
  bool usable = true;     // false after a failed capture: the signature runs without a graph
  bool moved_noted = false;  // bound sets: a run with other tensors was noted
};

bool is_static(const std::vector<std::string>& dims) {
  return std::all_of(dims.begin(), dims.end(), [](const std::string& d) {
    return !d.empty() && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  });
}

std::string shape_text(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += detail::str_cat(i ? ", " : "", shape[i]);
  return out + "]";
}

std::string signature_text(const std::vector<Tensor>& feeds) {
  std::string out;
  for (const Tensor& t : feeds) out += detail::str_cat(out.empty() ? "" : ", ", shape_text(t.shape()));
  return out;
}

// ORT's message when enable_cuda_graph=1 cannot work for a model (nodes on other providers, control flow).
bool is_graph_capture_refusal(const std::string& message) {
  return message.find("cannot use the graph capture feature") != std::string::npos;
}

class OrtSession final : public EngineSession {
 public:
  OrtSession(const std::string& model, const SessionOptions& options)
      : options_(options), device_(options.device), cpu_memory_(nullptr) {
    XPURT_ORT_CHECK(cpu_memory_ = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault));
    if (device_.is_cuda()) {
      ep_device_ = cuda_ep_device(device_.index);
      XPURT_ORT_CHECK(device_memory_ = ep_device_.GetMemoryInfo(OrtDeviceMemoryType_DEFAULT));
      XPURT_INTERNAL_ASSERT(device_memory_ != nullptr, "the CUDA execution provider reports no device memory");
    }
    // Note [External data through ORT]: ORT is handed the model as bytes, so it learns the folder of the model's
    // external-data files from the session config entry kOrtSessionOptionsModelExternalInitializersFileFolderPath
    // (SessionOptions::model_dir: the model file's folder, or the caller's external_data_dir=); without it ORT
    // looked in the working directory. Before ORT reads anything, every external-data file passes the ONNX
    // frontend's checks, as in the native engine (onnx_frontend::check_external_data: inside that folder, no link out
    // of it, a regular file -- a FIFO would block ORT's read forever --, the span inside the file), and a model given
    // as bytes without a folder is refused, as the native engine refuses it. ORT then opens the files itself: a file
    // swapped between the check and ORT's read is outside what these checks cover.
    // Note [Models checked against ONNX's schemas] (frontends/onnx/onnx_validate.cpp): the checks the native engine
    // makes when it reads a model run before ORT sees it (ORT 1.29 aborted the process on a Tanh with an INTS
    // attribute it does not take, tests/fuzz/corpus/model/regression-ort-tanh-with-an-attribute-it-does-not-take.onnx).
    // check_for_ort makes them, and this engine's own (ort_model_fixes.h), on one parse of the model.
    onnx_frontend::CheckOptions checks;
    checks.allow_newer_opsets = options.exec_policy.allow_newer_opsets;
    checks.model_dir = options.model_dir;
    const ort::ModelForOrt checked = ort::check_for_ort(model, checks);
    float8_qdq_ = checked.float8_qdq;  // Note [Float8 QDQ through ORT's CPU] (ort_model_fixes.cpp)
    const std::string& for_ort = checked.rewritten.empty() ? model : checked.rewritten;
    const bool want_graphs = device_.is_cuda() && options.exec_policy.cuda_graphs;
    try {
      build(for_ort, want_graphs);
      graphs_enabled_ = want_graphs;
    } catch (const XpuRuntimeError& error) {
      if (!want_graphs || !is_graph_capture_refusal(error.what())) throw;
      build(for_ort, /*cuda_graphs=*/false);
      policy_notes_.push_back(detail::str_cat(
          "cuda_graphs=true: not honoured by onnxruntime, which refuses graph capture for this model (every node "
          "must run on the CUDA execution provider, without control flow); the session runs without CUDA graphs. "
          "ORT said: ",
          error.what()));
    }
    inputs_ = value_infos(*session_, /*inputs=*/true);
    outputs_ = value_infos(*session_, /*inputs=*/false);
    for (const ValueInfo& info : inputs_) input_names_.push_back(info.name.c_str());
    for (const ValueInfo& info : outputs_) {  // Note [Outputs that are graph inputs]
      auto it = std::find_if(inputs_.begin(), inputs_.end(), [&](const ValueInfo& v) { return v.name == info.name; });
      feed_of_output_.push_back(it == inputs_.end() ? -1 : static_cast<int>(it - inputs_.begin()));
    }
    XPURT_ORT_CHECK(plain_run_options_ = Ort::RunOptions());
    if (graphs_enabled_) {
      XPURT_ORT_CHECK(plain_run_options_.AddConfigEntry(kOrtRunOptionsConfigCudaGraphAnnotation,
                                                        std::to_string(kNoGraph).c_str()));
    }
    for (const ValueInfo& info : outputs_) {
      std::optional<Shape> shape;
      if (is_static(info.shape)) {
        shape.emplace();
        for (const std::string& d : info.shape) shape->push_back(std::stoll(d));
      }
      static_output_shapes_.push_back(std::move(shape));
    }
    options_list_.push_back(detail::str_cat(
        "io_binding: feeds on ", device_.str(), " bound in place", device_.is_cuda() ? ", CPU feeds copied by ORT" : "",
        "; outputs in xpuruntime-allocated tensors when their shapes are known (static in the model or seen with "
        "the same input shapes), else ORT-allocated and wrapped"));
  }

  ~OrtSession() override = default;

  OrtSession(const OrtSession&) = delete;
  OrtSession& operator=(const OrtSession&) = delete;

  const std::vector<ValueInfo>& inputs() const override { return inputs_; }
  const std::vector<ValueInfo>& outputs() const override { return outputs_; }

  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names) override {
    const std::vector<Tensor> by_input = check_feeds(feeds);
    const std::vector<size_t> wanted = check_outputs(output_names);
    if (passes_feeds(wanted)) return run_passing_feeds(feeds, by_input, wanted, nullptr);
    const SignatureKey key = signature_of(by_input);
    const std::unique_ptr<ort::ProfiledRun> profiled = profile_this_run();  // null unless ORT profiles this run
    std::vector<Tensor> result;
    if (graphs_enabled_) {
      std::lock_guard<std::mutex> lock(graph_mutex_);
      result = run_with_graph(by_input, wanted, key);
    } else {
      result = run_bound(by_input, wanted, key, {});
    }
    finish_profiled_run(profiled.get());
    return result;
  }

  // Note [I/O binding] (core/engine.cpp): outputs bound in place are handed to ORT as the run's output buffers.
  // With CUDA graphs, when every output is bound in place and every input is a contiguous tensor on the device, the
  // graph of the input-shape signature is captured over those very tensors and replayed while they stay the same
  // (Note [CUDA graphs through ORT]): no staging copies, as when ORT is used directly with an IoBinding.
  void run_into(const std::vector<std::pair<std::string, Tensor>>& feeds, const std::vector<std::string>& output_names,
                std::vector<Tensor>& outputs) override {
    const std::vector<Tensor> by_input = check_feeds(feeds);
    const std::vector<size_t> wanted = check_outputs(output_names);
    XPURT_INTERNAL_ASSERT(outputs.size() == wanted.size(), "run_into: ", outputs.size(), " outputs for ",
                          wanted.size(), " names");
    if (passes_feeds(wanted)) {
      outputs = run_passing_feeds(feeds, by_input, wanted, &outputs);
      return;
    }
    std::vector<Tensor> preset(outputs_.size());  // by model output index
    for (size_t k = 0; k < wanted.size(); ++k) {
      if (!outputs[k].defined()) continue;
      XPURT_CHECK(!preset[wanted[k]].defined(), "output '", outputs_[wanted[k]].name, "' is bound twice");
      preset[wanted[k]] = outputs[k];
    }
    const SignatureKey key = signature_of(by_input);
    const std::unique_ptr<ort::ProfiledRun> profiled = profile_this_run();  // null unless ORT profiles this run
    std::vector<Tensor> result;
    if (graphs_enabled_) {
      std::lock_guard<std::mutex> lock(graph_mutex_);
      if (replay_bound_graph(by_input, preset, key)) {
        finish_profiled_run(profiled.get());
        return;  // written in place
      }
      result = run_with_graph(by_input, wanted, key);
    } else {
      result = run_bound(by_input, wanted, key, preset);
    }
    finish_profiled_run(profiled.get());
    for (size_t k = 0; k < wanted.size(); ++k) {
      if (!outputs[k].defined()) {
        outputs[k] = std::move(result[k]);
      } else if (result[k].data_ptr() != outputs[k].data_ptr()) {
        XPURT_CHECK(outputs[k].shape() == result[k].shape(), "output '", outputs_[wanted[k]].name,
                    "' is bound to a tensor of shape ", shape_text(outputs[k].shape()), " but the run produced ",
                    shape_text(result[k].shape()));
        outputs[k].copy_from(result[k]);
      }
    }
  }

  Explanation explain() const override {
    Explanation explanation;
    explanation.engine = kEngineName;
    explanation.engine_reason = detail::str_cat("ONNX Runtime ", Ort::GetVersionString());
    explanation.device = options_.device.str();
    explanation.options = options_list_;
    explanation.options.push_back(detail::str_cat("onnxruntime_version=", Ort::GetVersionString()));
    explanation.policy_notes = policy_notes_;
    {
      std::lock_guard<std::mutex> lock(notes_mutex_);
      explanation.policy_notes.insert(explanation.policy_notes.end(), run_notes_.begin(), run_notes_.end());
    }
    std::lock_guard<std::mutex> lock(profile_mutex_);
    if (!profile_done_) {
      explanation.options.push_back("nodes: not run yet (execution providers are reported after the first run)");
    } else {
      explanation.nodes = nodes_;
      if (!profile_error_.empty()) explanation.options.push_back("nodes: " + profile_error_);
    }
    return explanation;
  }

 private:
  // Creates session_ with CUDA graphs on or off; sets options_list_ and policy_notes_.
  void build(const std::string& model, bool cuda_graphs) {
    OrtConfig config = map_policies(options_, cuda_graphs);
    Ort::SessionOptions session_options;
    XPURT_ORT_CHECK(session_options.SetIntraOpNumThreads(options_.exec_policy.intra_op_threads));
    config.options.push_back(detail::str_cat("intra_op_num_threads=", options_.exec_policy.intra_op_threads));
    XPURT_ORT_CHECK(session_options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL));
    config.options.push_back("graph_optimization_level=ORT_ENABLE_ALL");
    if (options_.exec_policy.deterministic) {
      XPURT_ORT_CHECK(session_options.SetDeterministicCompute(true));
      config.options.push_back("use_deterministic_compute=1");
      config.policy_notes.push_back("deterministic=true -> use_deterministic_compute=1");
    }
    config.options.push_back(
        "profiling: ORT's run-level profiling for the first run (execution providers) and while a Profiler records");
    const bool allow_cpu_nodes = device_.is_cuda() && cpu_nodes_allowed();
    if (device_.is_cuda()) {
      XPURT_ORT_CHECK(session_options.AppendExecutionProvider_V2(ort::env(), {ep_device_}, config.cuda_options));
      if (!allow_cpu_nodes) {
        // Note [No CPU nodes beside the CUDA plugin]
        XPURT_ORT_CHECK(session_options.AddConfigEntry("session.disable_cpu_ep_fallback", "1"));
      }
      config.options.push_back(allow_cpu_nodes
                                   ? "execution_provider=CUDAExecutionProvider (plugin), then CPUExecutionProvider "
                                     "(XPURT_ORT_ALLOW_CPU_NODES=1)"
                                   : "execution_provider=CUDAExecutionProvider (plugin) only: "
                                     "session.disable_cpu_ep_fallback=1");
      for (const auto& [key, value] : std::map<std::string, std::string>(config.cuda_options.begin(),
                                                                        config.cuda_options.end())) {
        config.options.push_back(detail::str_cat("cuda.", key, "=", value));
      }
    } else {
      config.options.push_back("execution_provider=CPUExecutionProvider");
      if (options_.exec_policy.memory_limit != 0) {  // Note [memory_limit through ORT]
        ort::use_budgeted_cpu_allocator(session_options);
        config.options.push_back("session.use_env_allocators=1 (xpuruntime's budgeted CPU allocator)");
      }
    }
    if (float8_qdq_) without_qdq_fusion(session_options, config);  // Note [Float8 QDQ through ORT's CPU]
    if (!options_.model_dir.empty()) {
      // Note [External data through ORT]
      XPURT_ORT_CHECK(session_options.AddConfigEntry(kOrtSessionOptionsModelExternalInitializersFileFolderPath,
                                                     options_.model_dir.c_str()));
      config.options.push_back(detail::str_cat(kOrtSessionOptionsModelExternalInitializersFileFolderPath, "=",
                                               options_.model_dir));
    }
    if (!options_.optimized_model_path.empty()) {
      XPURT_ORT_CHECK(session_options.SetOptimizedModelFilePath(options_.optimized_model_path.c_str()));
      config.options.push_back("optimized_model_filepath=" + options_.optimized_model_path);
    }
    for (const auto& [key, value] : options_.session_config) {  // xpuruntime.onnxruntime's config entries
      XPURT_ORT_CHECK(session_options.AddConfigEntry(key.c_str(), value.c_str()));
      config.options.push_back(detail::str_cat(key, "=", value));
    }
    try {
      XPURT_ORT_CHECK(session_ = std::make_shared<Ort::Session>(ort::env(), model.data(), model.size(),
                                                                session_options));
    } catch (const XpuRuntimeError& error) {
      if (std::string(error.what()).find("fallback to CPU EP has been explicitly disabled") == std::string::npos) {
        throw;
      }
      throw UnsupportedOperationError(detail::str_cat(
          "onnxruntime on ", device_.str(), ": ONNX Runtime would run some nodes of this model on its CPU execution "
          "provider beside the CUDA plugin, and ONNX Runtime ", Ort::GetVersionString(), "'s CUDA plugin crashes the "
          "process (a segmentation fault in Run) on such mixed placements, BERT's among them (Note [No CPU nodes "
          "beside the CUDA plugin]); run the model with engine=\"native\" (or engine=\"auto\"), or set "
          "XPURT_ORT_ALLOW_CPU_NODES=1 "
          "to try anyway. ORT said: ",
          error.what()));
    }
    options_list_ = std::move(config.options);
    policy_notes_ = std::move(config.policy_notes);
  }

  // The feeds in model input order, checked against the model's inputs.
  std::vector<Tensor> check_feeds(const std::vector<std::pair<std::string, Tensor>>& feeds) const {
    std::vector<Tensor> by_input(inputs_.size());
    for (const auto& feed : feeds) {
      const std::string& name = feed.first;  // not a structured binding: clang < 16 cannot capture those
      const Tensor& tensor = feed.second;
      auto it = std::find_if(inputs_.begin(), inputs_.end(), [&](const ValueInfo& v) { return v.name == name; });
      XPURT_CHECK(it != inputs_.end(), "unknown input '", name, "'; the model's inputs are ", names_of(inputs_));
      const size_t index = static_cast<size_t>(it - inputs_.begin());
      XPURT_CHECK(!by_input[index].defined(), "input '", name, "' is fed twice");
      XPURT_CHECK(tensor.defined(), "input '", name, "' is an undefined tensor");
      by_input[index] = tensor;
    }
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const ValueInfo& info = inputs_[i];
      XPURT_CHECK(by_input[i].defined(), "input '", info.name, "' (", describe(info.dtype, info.shape),
                  ") is not fed; the model's inputs are ", names_of(inputs_));
      const Tensor& given = by_input[i];
      XPURT_CHECK_TYPE(given.dtype() == info.dtype, "input '", info.name, "' expects ",
                       describe(info.dtype, info.shape), ", got ", describe(given));
      bool shape_ok = given.dim() == static_cast<int>(info.shape.size());
      for (size_t d = 0; shape_ok && d < info.shape.size(); ++d) {
        if (is_static({info.shape[d]})) shape_ok = std::to_string(given.shape()[d]) == info.shape[d];
      }
      XPURT_CHECK(shape_ok, "input '", info.name, "' expects ", describe(info.dtype, info.shape), ", got ",
                  describe(given));
    }
    return by_input;
  }

  // Indices into outputs_ of the wanted outputs (every output when `names` is empty).
  std::vector<size_t> check_outputs(const std::vector<std::string>& names) const {
    std::vector<size_t> wanted;
    if (names.empty()) {
      for (size_t i = 0; i < outputs_.size(); ++i) wanted.push_back(i);
      return wanted;
    }
    for (const std::string& name : names) {
      auto it = std::find_if(outputs_.begin(), outputs_.end(), [&](const ValueInfo& v) { return v.name == name; });
      XPURT_CHECK(it != outputs_.end(), "unknown output '", name, "'; the model's outputs are ", names_of(outputs_));
      wanted.push_back(static_cast<size_t>(it - outputs_.begin()));
    }
    return wanted;
  }

  // Note [Outputs that are graph inputs]: ORT runs nothing for a graph output that names a graph input. Given a
  // pre-allocated buffer for it, Run leaves the buffer as it was (a fresh tensor's uninitialised memory came back,
  // values like 2.7e16); left to allocate, Run returns the feed's own OrtValue, which views memory bound for that
  // run only (a contiguous copy made for it, or the caller's array). So ORT is not asked for such outputs: each is
  // a copy of its feed on the session's device (as the native engine returns it), written into the caller's tensor
  // when run_into binds one; the other outputs run as usual.
  bool passes_feeds(const std::vector<size_t>& wanted) const {
    return std::any_of(wanted.begin(), wanted.end(), [&](size_t o) { return feed_of_output_[o] >= 0; });
  }

  // run() (`bound` null) or run_into() (`bound`: its tensors, as many as `wanted`) when some wanted outputs are
  // graph inputs (Note [Outputs that are graph inputs]): the wanted outputs, in order.
  std::vector<Tensor> run_passing_feeds(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                        const std::vector<Tensor>& by_input, const std::vector<size_t>& wanted,
                                        const std::vector<Tensor>* bound) {
    std::vector<std::string> names;  // the outputs ORT computes
    std::vector<size_t> positions;   // their positions in `wanted`
    for (size_t k = 0; k < wanted.size(); ++k) {
      if (feed_of_output_[wanted[k]] >= 0) continue;
      names.push_back(outputs_[wanted[k]].name);
      positions.push_back(k);
    }
    std::vector<Tensor> result(wanted.size());
    if (!names.empty()) {
      std::vector<Tensor> computed;
      if (bound == nullptr) {
        computed = run(feeds, names);
      } else {
        for (size_t position : positions) computed.push_back((*bound)[position]);
        run_into(feeds, names, computed);
      }
      for (size_t i = 0; i < positions.size(); ++i) result[positions[i]] = std::move(computed[i]);
    }
    for (size_t k = 0; k < wanted.size(); ++k) {
      const int input = feed_of_output_[wanted[k]];
      if (input < 0) continue;
      const Tensor& feed = by_input[static_cast<size_t>(input)];
      if (bound != nullptr && (*bound)[k].defined()) {
        result[k] = (*bound)[k];
        XPURT_CHECK(result[k].shape() == feed.shape() && result[k].dtype() == feed.dtype(), "output '",
                    outputs_[wanted[k]].name, "' is bound to a tensor of shape ", shape_text(result[k].shape()), " (",
                    dtype_name(result[k].dtype()), ") but it is the graph input, fed ", describe(feed));
      } else {
        result[k] = Tensor::empty(feed.shape(), feed.dtype(), device_);
      }
      result[k].copy_from(feed);
    }
    return result;
  }

  // An OrtValue over `tensor`'s memory (contiguous), labelled with the memory info of its device.
  Ort::Value value_over(const Tensor& tensor) const {
    static std::uint64_t empty_storage = 0;  // ORT wants a non-null pointer even for zero elements
    void* data = tensor.numel() == 0 ? static_cast<void*>(&empty_storage) : tensor.data_ptr();
    const OrtMemoryInfo* memory = tensor.device().is_cpu() ? static_cast<const OrtMemoryInfo*>(cpu_memory_)
                                                           : device_memory_;
    Ort::Value value(nullptr);
    XPURT_ORT_CHECK(value = Ort::Value::CreateTensor(memory, data, tensor.nbytes(), tensor.shape().data(),
                                                     tensor.shape().size(), ort::onnx_from_dtype(tensor.dtype())));
    return value;
  }

  // The tensor to bind for a feed (Note [Bound runs]).
  Tensor bindable_feed(const Tensor& given) const {
    if (device_.is_cpu()) return given.device().is_cpu() ? given.contiguous() : given.to(Device::cpu()).contiguous();
    if (given.device().is_cpu()) return given.contiguous();  // ORT copies host feeds to the device itself
    return given.device() == device_ ? given.contiguous() : given.to(device_).contiguous();
  }

  // The output shapes known before a run with signature `key`: static ones, then those remembered.
  std::vector<std::optional<Shape>> known_output_shapes(const SignatureKey& key) const {
    std::lock_guard<std::mutex> lock(shape_mutex_);
    if (value_dependent_.count(key) != 0) return std::vector<std::optional<Shape>>(outputs_.size());
    std::vector<std::optional<Shape>> known = static_output_shapes_;
    auto it = seen_output_shapes_.find(key);
    if (it != seen_output_shapes_.end()) {
      for (size_t i = 0; i < known.size(); ++i) {
        if (!known[i]) known[i] = it->second[i];
      }
    }
    return known;
  }

  void remember_output_shapes(const SignatureKey& key, const std::vector<size_t>& bound,
                              const std::vector<Tensor>& values) {
    std::lock_guard<std::mutex> lock(shape_mutex_);
    if (value_dependent_.count(key) != 0) return;
    auto it = seen_output_shapes_.find(key);
    if (it == seen_output_shapes_.end()) {
      if (seen_output_shapes_.size() >= kMaxCachedSignatures) return;
      it = seen_output_shapes_.emplace(key, std::vector<std::optional<Shape>>(outputs_.size())).first;
    }
    for (size_t j = 0; j < bound.size(); ++j) it->second[bound[j]] = values[j].shape();
  }

  void forget_output_shapes(const SignatureKey& key) {
    std::lock_guard<std::mutex> lock(shape_mutex_);
    seen_output_shapes_.erase(key);
    if (value_dependent_.size() < kMaxCachedSignatures) value_dependent_.insert(key);
  }

  // One bound run of the outputs `bound` (distinct indices into outputs_); `known` pre-binds outputs of known shape.
  // `preset` (by model output index, may be empty): tensors bound in place by the caller, used as ORT's buffers.
  std::vector<Tensor> run_bound_once(const std::vector<Tensor>& feeds, const std::vector<size_t>& bound,
                                     const std::vector<std::optional<Shape>>& known, const std::vector<Tensor>& preset) {
    std::vector<Tensor> keep;  // the bound feeds stay alive through Run
    std::vector<Ort::Value> input_values;
    keep.reserve(feeds.size());
    input_values.reserve(feeds.size());
    for (size_t i = 0; i < feeds.size(); ++i) {
      keep.push_back(bindable_feed(feeds[i]));
      input_values.push_back(value_over(keep.back()));
    }
    std::vector<Tensor> results(bound.size());
    std::vector<Ort::Value> values;  // null for the outputs ORT allocates
    std::vector<const char*> output_names;
    bool unknown = false;
    for (size_t j = 0; j < bound.size(); ++j) {
      const ValueInfo& info = outputs_[bound[j]];
      output_names.push_back(info.name.c_str());
      if (!preset.empty() && preset[bound[j]].defined()) {
        results[j] = preset[bound[j]];
        values.push_back(value_over(results[j]));
      } else if (known[bound[j]]) {
        results[j] = Tensor::empty(*known[bound[j]], info.dtype, device_);
        values.push_back(value_over(results[j]));
      } else {
        values.emplace_back(nullptr);
        unknown = true;
      }
    }
    if (device_.is_cuda()) StreamManager::instance().current_stream(device_).synchronize();
    if (unknown && device_.is_cuda()) {
      // Plain Run would put the outputs it allocates in host memory: bind them to the device instead.
      Ort::IoBinding binding(nullptr);
      XPURT_ORT_CHECK(binding = Ort::IoBinding(*session_));
      for (size_t i = 0; i < feeds.size(); ++i) {
        XPURT_ORT_CHECK(binding.BindInput(input_names_[i], input_values[i]));
      }
      for (size_t j = 0; j < bound.size(); ++j) {
        if (values[j]) {
          XPURT_ORT_CHECK(binding.BindOutput(output_names[j], values[j]));
        } else {
          XPURT_ORT_CHECK(binding.BindOutput(output_names[j], device_memory_));
        }
      }
      const Ort::RunOptions& options = call_options();
      ort::run_watched(options, run_memory_limit(), [&] {  // Note [Stopping ORT runs]
        XPURT_ORT_CHECK(session_->Run(options, binding));
      });
      XPURT_ORT_CHECK(values = binding.GetOutputValues());
    } else {
      const Ort::RunOptions& options = call_options();
      ort::run_watched(options, run_memory_limit(), [&] {  // Note [Stopping ORT runs]
        XPURT_ORT_CHECK(session_->Run(options, input_names_.data(), input_values.data(), input_values.size(),
                                      output_names.data(), values.data(), values.size()));
      });
    }
    XPURT_INTERNAL_ASSERT(values.size() == bound.size(), "ORT returned ", values.size(), " outputs, expected ",
                          bound.size());
    for (size_t j = 0; j < bound.size(); ++j) {
      if (results[j].defined()) continue;
      const ValueInfo& info = outputs_[bound[j]];
      XPURT_INTERNAL_ASSERT(values[j].IsTensor(), "output '", info.name, "' is not a tensor");
      auto owner = std::make_shared<OrtOutputOwner>(OrtOutputOwner{session_, std::move(values[j])});
      const auto device_type = owner->value.GetTensorMemoryInfo().GetDeviceType();
      XPURT_INTERNAL_ASSERT(device_type == (device_.is_cuda() ? OrtMemoryInfoDeviceType_GPU
                                                              : OrtMemoryInfoDeviceType_CPU),
                            "ORT returned output '", info.name, "' outside the memory of ", device_.str());
      auto tensor_info = owner->value.GetTensorTypeAndShapeInfo();
      const Shape shape = tensor_info.GetShape();
      const size_t bytes = tensor_info.GetElementCount() * dtype_size(info.dtype);
      void* data = owner->value.GetTensorMutableRawData();
      // The tensor views ORT's buffer and owns the value (and session) that free it.
      results[j] = Tensor::from_blob(data, shape, {}, info.dtype, device_, std::shared_ptr<void>(owner, data), bytes);
    }
    return results;
  }

  // A run without a CUDA graph (Note [Bound runs]): the wanted outputs, in order.
  std::vector<Tensor> run_bound(const std::vector<Tensor>& feeds, const std::vector<size_t>& wanted,
                                const SignatureKey& key, const std::vector<Tensor>& preset) {
    std::vector<size_t> bound;  // distinct outputs to bind
    std::vector<size_t> slot;   // wanted[k] is bound[slot[k]]
    for (size_t index : wanted) {
      auto it = std::find(bound.begin(), bound.end(), index);
      slot.push_back(static_cast<size_t>(it - bound.begin()));
      if (it == bound.end()) bound.push_back(index);
    }
    const std::vector<std::optional<Shape>> known = known_output_shapes(key);
    const bool prebound = std::any_of(bound.begin(), bound.end(), [&](size_t i) {
      return known[i].has_value() || (!preset.empty() && preset[i].defined());
    });
    std::vector<Tensor> values;
    try {
      values = run_bound_once(feeds, bound, known, preset);
    } catch (const InvalidArgumentError&) {
      if (!prebound) throw;
      // ORT rejects a pre-bound output of the wrong shape with ORT_INVALID_ARGUMENT: the shape may depend on the
      // values (or the model's declared shape is wrong). Run once more with ORT allocating; if that fails as well,
      // its error is the real one.
      values = run_bound_once(feeds, bound, std::vector<std::optional<Shape>>(outputs_.size()), {});
      forget_output_shapes(key);
    }
    if (std::any_of(bound.begin(), bound.end(), [&](size_t i) { return !known[i].has_value(); })) {
      remember_output_shapes(key, bound, values);
    }
    std::vector<Tensor> result;
    result.reserve(wanted.size());
    for (size_t s : slot) result.push_back(values[s]);
    return result;
  }

  // A run of a session with CUDA graphs (Note [CUDA graphs through ORT]). Caller holds graph_mutex_.
  std::vector<Tensor> run_with_graph(const std::vector<Tensor>& feeds, const std::vector<size_t>& wanted,
                                     const SignatureKey& key) {
    if (profiling_eagerly() || placement_ == Placement::kRefused) return run_bound(feeds, wanted, key, {});
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      std::vector<size_t> all(outputs_.size());
      for (size_t i = 0; i < all.size(); ++i) all[i] = i;
      std::vector<Tensor> outputs = run_bound(feeds, all, key, {});
      bool value_dependent = false;
      {
        std::lock_guard<std::mutex> lock(shape_mutex_);
        value_dependent = value_dependent_.count(key) != 0;
      }
      const bool too_many = next_graph_id_ > static_cast<int>(kMaxGraphSignatures);
      if (!value_dependent && !too_many) {
        graphs_.emplace(key, make_graph_set(feeds, outputs));
      } else if (graphs_.size() < kMaxCachedSignatures) {
        if (value_dependent) {
          add_run_note(detail::str_cat("cuda graph for input shapes ", signature_text(feeds),
                                       ": not used (the output shapes depend on the input values)"));
        } else if (!graph_limit_noted_) {
          graph_limit_noted_ = true;
          add_run_note(detail::str_cat("cuda graphs: the session has ", kMaxGraphSignatures,
                                       " (one per input-shape signature); further signatures run without a graph"));
        }
        GraphSet skipped;
        skipped.usable = false;
        graphs_.emplace(key, std::move(skipped));
      }
      std::vector<Tensor> result;
      for (size_t index : wanted) result.push_back(outputs[index]);
      return result;
    }
    GraphSet& set = it->second;
    if (!set.usable) return run_bound(feeds, wanted, key, {});
    for (size_t i = 0; i < feeds.size(); ++i) set.inputs[i].copy_from(feeds[i]);  // synchronous
    if (!run_graph_set(set, detail::str_cat("cuda graph for input shapes ", signature_text(feeds)),
                       "runs without a graph")) {
      return run_bound(feeds, wanted, key, {});
    }
    std::vector<Tensor> result;
    result.reserve(wanted.size());
    for (size_t index : wanted) {
      const Tensor& staged = set.outputs[index];
      Tensor out = Tensor::empty(staged.shape(), staged.dtype(), device_);
      out.copy_from(staged);  // synchronous: the next run may overwrite the staging output
      result.push_back(std::move(out));
    }
    return result;
  }

  // Staging tensors shaped like this run's feeds and outputs, bound once, with a new graph id.
  GraphSet make_graph_set(const std::vector<Tensor>& feeds, const std::vector<Tensor>& outputs) {
    std::vector<Tensor> inputs, staged;
    for (const Tensor& t : feeds) inputs.push_back(Tensor::empty(t.shape(), t.dtype(), device_));
    for (const Tensor& t : outputs) staged.push_back(Tensor::empty(t.shape(), t.dtype(), device_));
    return bind_graph_set(std::move(inputs), std::move(staged));
  }

  // A GraphSet with a new graph id over `inputs` and `outputs` (model order), which it keeps alive.
  GraphSet bind_graph_set(std::vector<Tensor> inputs, std::vector<Tensor> outputs) {
    GraphSet set;
    set.id = next_graph_id_++;
    set.inputs = std::move(inputs);
    set.outputs = std::move(outputs);
    XPURT_ORT_CHECK(set.binding = std::make_unique<Ort::IoBinding>(*session_));
    for (size_t i = 0; i < set.inputs.size(); ++i) {
      XPURT_ORT_CHECK(set.binding->BindInput(inputs_[i].name.c_str(), value_over(set.inputs[i])));
    }
    for (size_t i = 0; i < set.outputs.size(); ++i) {
      XPURT_ORT_CHECK(set.binding->BindOutput(outputs_[i].name.c_str(), value_over(set.outputs[i])));
    }
    XPURT_ORT_CHECK(set.run_options = Ort::RunOptions());
    XPURT_ORT_CHECK(set.run_options.AddConfigEntry(kOrtRunOptionsConfigCudaGraphAnnotation,
                                                   std::to_string(set.id).c_str()));
    return set;
  }

  static SignatureKey signature_of(const std::vector<Tensor>& feeds) {
    SignatureKey key;
    for (const Tensor& t : feeds) {
      key.push_back(t.dim());
      key.insert(key.end(), t.shape().begin(), t.shape().end());
    }
    return key;
  }

  // The graph path of run_into (Note [I/O binding] above): replays the signature's graph over the caller's bound
  // tensors; false when it cannot (an output not bound in place, an input to stage, tensors other than those the
  // graph was captured over, too many graphs, a failed capture), and the caller runs the staged path instead.
  // Caller holds graph_mutex_.
  bool replay_bound_graph(const std::vector<Tensor>& feeds, const std::vector<Tensor>& preset, const SignatureKey& key) {
    if (profiling_eagerly() || placement_ != Placement::kCudaOnly) return false;  // the staged path checks first
    for (const Tensor& t : preset) {
      if (!t.defined() || t.numel() == 0) return false;
    }
    for (const Tensor& t : feeds) {
      if (t.device() != device_ || !t.is_contiguous() || t.numel() == 0) return false;
    }
    auto it = bound_graphs_.find(key);
    if (it == bound_graphs_.end()) {
      if (next_graph_id_ > static_cast<int>(kMaxGraphSignatures)) return false;
      // The set holds the bound tensors: their memory stays valid for the graph while the session lives.
      it = bound_graphs_.emplace(key, bind_graph_set(feeds, preset)).first;
    }
    GraphSet& set = it->second;
    if (!set.usable) return false;
    bool same = true;
    for (size_t i = 0; same && i < feeds.size(); ++i) same = feeds[i].data_ptr() == set.inputs[i].data_ptr();
    for (size_t i = 0; same && i < preset.size(); ++i) {
      same = preset[i].data_ptr() == set.outputs[i].data_ptr() && preset[i].shape() == set.outputs[i].shape();
    }
    if (!same) {
      if (!set.moved_noted) {
        set.moved_noted = true;
        add_run_note(detail::str_cat("cuda graph over bound tensors for input shapes ", signature_text(feeds),
                                     ": later runs bound other tensors, which run through staging copies (keep the "
                                     "bound tensors to replay without copies)"));
      }
      return false;
    }
    // The feeds were written on the caller's stream; ORT runs on its own.
    StreamManager::instance().current_stream(device_).synchronize();
    return run_graph_set(set, detail::str_cat("cuda graph over bound tensors for input shapes ", signature_text(feeds)),
                         "runs through staging copies");
  }

  // Runs `set`'s graph (ORT captures it on its first runs). A failure before the graph was ever captured marks the
  // set unusable, notes `what`: capture failed, `instead`, and returns false; a failure of a captured graph throws.
  bool run_graph_set(GraphSet& set, const std::string& what, const char* instead) {
    if (!set.captured) {
      const Placement placement = check_placement();
      if (placement != Placement::kCudaOnly) {
        if (placement == Placement::kRefused) {
          set.usable = false;
          set.binding.reset();
          set.inputs.clear();
          set.outputs.clear();
        }
        return false;
      }
    }
    try {
      XPURT_ORT_CHECK(session_->Run(set.run_options, *set.binding));
      set.captured = true;
    } catch (const XpuRuntimeError& error) {
      if (set.captured) throw;
      set.usable = false;
      set.binding.reset();
      set.inputs.clear();
      set.outputs.clear();
      add_run_note(detail::str_cat(what, ": capture failed, ", instead, " (", error.what(), ")"));
      return false;
    }
    return true;
  }

  // Note [No CPU nodes beside the CUDA plugin]: the CUDA execution provider of the bundled ONNX Runtime (1.29, the
  // plugin library registered through RegisterExecutionProviderLibrary) crashes the process with a segmentation fault
  // in the first Run of some models whose placement mixes it with the CPU execution provider (seen on an H200,
  // 2026-11-25: every BERT, DistilBERT, RoBERTa and GPT-2 export of the real-model suite, both exporters, with and
  // without CUDA graphs, also through ORT's own C++ API in benchmarks/ort_direct_bench; the Llama exports, whose CPU
  // nodes are only shape arithmetic, ran). Nothing tells in advance which mixed models crash, and a crash cannot be
  // caught, so CUDA sessions are created with session.disable_cpu_ep_fallback=1: ORT then refuses every mixed
  // placement at session creation, which becomes an UnsupportedOperationError naming the way out (the native engine;
  // engine="auto" picks it when it runs every node), and the process and its CUDA context live on.
  // XPURT_ORT_ALLOW_CPU_NODES=1 creates mixed sessions anyway (a model known to run, or an ONNX Runtime build
  // without the bug).
  static bool cpu_nodes_allowed() {
    const char* value = std::getenv("XPURT_ORT_ALLOW_CPU_NODES");
    return value != nullptr && std::string(value) == "1";
  }

  // Note [Placement before capture]: a graph ORT captures while some nodes run on the CPU execution provider, or
  // with the copies ORT inserts between providers, can fail inside the capture with a sticky CUDA error
  // (cudaErrorInvalidAddressSpace at the next synchronize, seen with PyTorch's dynamo exports of BERT, whose
  // attention-mask arithmetic ORT places on the CPU): the process's CUDA context is then lost for every later call.
  // ORT's own check (its "cannot use the graph capture feature" refusal at session creation) does not catch these
  // models. So before the first capture, the first run's profile (which names each node's provider) is read: only a
  // placement with every node on the CUDA execution provider and no Memcpy node is captured. Otherwise the session
  // runs without CUDA graphs, and explain()'s policy notes say which nodes decided it. An unreadable profile counts
  // as a refusal: a capture is attempted only on a placement that was seen.
  enum class Placement : std::uint8_t { kUnknown, kCudaOnly, kRefused };

  Placement check_placement() {
    if (placement_ != Placement::kUnknown) return placement_;
    std::vector<std::string> outside, copies;
    std::string refusal;
    {
      std::lock_guard<std::mutex> lock(profile_mutex_);
      if (!profile_done_) return Placement::kUnknown;  // the first run (profiled) comes before any capture
      if (nodes_.empty()) {
        placement_ = Placement::kRefused;
        refusal = detail::str_cat(
            "cuda_graphs=true: not used: ORT's node placement could not be read from the first run's profile (",
            profile_error_.empty() ? "no nodes" : profile_error_,
            "), and a capture over nodes outside the CUDA execution provider can lose the CUDA context (Note "
            "[Placement before capture])");
      }
      for (const NodeExplanation& node : nodes_) {  // none when the profile was unreadable
        if (node.op_type.rfind("Memcpy", 0) == 0) {
          copies.push_back(node.node);
        } else if (node.kernel != "CUDAExecutionProvider") {
          outside.push_back(detail::str_cat("'", node.node, "' (", node.op_type, ") on ", node.kernel));
        }
      }
    }
    if (!refusal.empty()) {
      add_run_note(refusal);
      return placement_;
    }
    if (outside.empty() && copies.empty()) {
      placement_ = Placement::kCudaOnly;
      return placement_;
    }
    placement_ = Placement::kRefused;
    std::string examples;
    for (size_t k = 0; k < outside.size() && k < 3; ++k) examples += (k ? ", " : "") + outside[k];
    add_run_note(detail::str_cat(
        "cuda_graphs=true: not used: ORT placed ", outside.size(), " node(s) outside the CUDA execution provider",
        examples.empty() ? "" : " (" + examples + (outside.size() > 3 ? ", ..." : "") + ")", " and inserted ",
        copies.size(), " copy node(s); capturing such a graph can fail with a sticky CUDA error that loses the CUDA "
        "context (Note [Placement before capture]), so the session runs without CUDA graphs"));
    return placement_;
  }

  void add_run_note(std::string note) {
    std::lock_guard<std::mutex> lock(notes_mutex_);
    run_notes_.push_back(std::move(note));
  }

  // ---- profiling (ort_profiling.h; Note [ORT profile on the timeline] in core/profiler_ort.cpp) ----

  // The profiled run this run is, when ORT must profile it: a Profiler records, or explain() has no profile yet.
  std::unique_ptr<ort::ProfiledRun> profile_this_run() {
    const bool recording = profiler::recording();
    const bool for_explain = explain_profile_pending_.load(std::memory_order_relaxed) &&
                             explain_profile_pending_.exchange(false, std::memory_order_relaxed);
    if (!recording && !for_explain) return nullptr;
    std::vector<std::pair<std::string, std::string>> config;
    if (graphs_enabled_) config.emplace_back(kOrtRunOptionsConfigCudaGraphAnnotation, std::to_string(kNoGraph));
    return std::make_unique<ort::ProfiledRun>(this, profile_folder_, std::move(config), recording,
                                              for_explain ? &explain_profile_pending_ : nullptr);
  }

  // Note [memory_limit through ORT]: the budget of a CPU session's Run calls (0: none).
  std::uint64_t run_memory_limit() const { return device_.is_cpu() ? options_.exec_policy.memory_limit : 0; }

  // The RunOptions of the Run call about to be made: its own, profiling, in a profiled run; the thread's own in a run
  // that can stop (Note [Stopping ORT runs]); else the shared ones.
  const Ort::RunOptions& call_options() {
    ort::ProfiledRun* profiled = ort::ProfiledRun::active(this);
    const Ort::RunOptions* options = profiled != nullptr ? profiled->call_options() : nullptr;
    return options != nullptr ? *options : ort::run_options_for_call(plain_run_options_, graphs_enabled_);
  }

  // While a Profiler records, sessions with CUDA graphs run without them: a replay runs no node one by one, so ORT
  // would report none (as the native engine runs its steps eagerly). The graphs replay again afterwards.
  bool profiling_eagerly() const {
    const ort::ProfiledRun* profiled = ort::ProfiledRun::active(this);
    return profiled != nullptr && profiled->recording();
  }

  // After a run: its ORT profile becomes explain()'s nodes (the first run) and the recording Profiler's events. A
  // profile is a report: one that cannot be read does not fail the run (the "onnxruntime run" events say so).
  void finish_profiled_run(ort::ProfiledRun* profiled) {
    if (profiled == nullptr) return;
    std::vector<std::string> unreadable;
    profiler::OrtProfile profile = profiled->collect(profiled->recording() && profiler::record_shapes(), &unreadable);
    if (profiled->for_explain()) {
      // Taken once, whatever came back: a run is not profiled again for explain() (a graph without nodes has none).
      std::lock_guard<std::mutex> lock(profile_mutex_);
      nodes_ = ort::explain_nodes(profile,
                                  precision_name(options_.fp16 ? Precision::kFP16 : options_.exec_policy.precision));
      if (profile.runs.empty()) {
        profile_error_ = "unavailable: ONNX Runtime's profile of the first run could not be read";
        for (const std::string& why : unreadable) profile_error_ += "; " + why;
      }
      profile_done_ = true;
      profiled->explained();
    }
    if (!profiled->recording()) return;
    if (profile.runs.empty()) {
      // Nothing came back (the run could not be profiled): say so where the run's ORT events would be.
      ProfileEvent e;
      e.name = "onnxruntime run";
      e.category = "session";
      e.start_ns = profiler::now_ns();
      e.args = {{"engine", kEngineName}, {"device", device_.str()}, {"ort_profile", "unavailable"}};
      e.args.emplace_back("ort_profiles_unreadable", unreadable);
      profiler::record(std::move(e));
      return;
    }
    const std::string graphs = !graphs_enabled_ ? "off" : "enabled; run eagerly while profiling";
    for (ProfileEvent& e : profile.events) {
      e.pid = 0;  // this process (ORT's tid is the OS thread id, as the profiler's)
      if (e.category == "session" && e.name == "onnxruntime run") {
        e.args.emplace_back("device", device_.str());
        if (device_.is_cuda()) e.args.emplace_back("cuda_graph", graphs);
        if (profile.skipped > 0) {
          e.args.emplace_back("ort_events_left_out", profile.skipped);
          e.args.emplace_back("ort_categories_left_out", profile.skipped_categories);
        }
        if (!unreadable.empty()) e.args.emplace_back("ort_profiles_unreadable", unreadable);
      }
      profiler::record(std::move(e));
    }
  }

  SessionOptions options_;
  Device device_;
  Ort::ConstEpDevice ep_device_{nullptr};          // CUDA sessions: the plugin EP's device (lives with the Env)
  const OrtMemoryInfo* device_memory_ = nullptr;  // CUDA sessions: its device memory (owned by the EP device)
  Ort::MemoryInfo cpu_memory_;
  std::shared_ptr<Ort::Session> session_;  // shared with outputs that wrap ORT's buffers
  bool graphs_enabled_ = false;
  bool float8_qdq_ = false;  // the model has float8 QDQ: ORT's QDQ fusion off (Note [Float8 QDQ through ORT's CPU])
  std::vector<ValueInfo> inputs_;
  std::vector<ValueInfo> outputs_;
  std::vector<const char*> input_names_;  // point into inputs_
  std::vector<int> feed_of_output_;       // per output: the input it names, or -1 (Note [Outputs that are graph inputs])
  Ort::RunOptions plain_run_options_{nullptr};  // runs without a CUDA graph (shared: Run only reads it)
  std::vector<std::optional<Shape>> static_output_shapes_;  // per output: its shape when every dim is static
  std::vector<std::string> options_list_;
  std::vector<std::string> policy_notes_;

  mutable std::mutex shape_mutex_;  // guards the two below
  std::map<SignatureKey, std::vector<std::optional<Shape>>> seen_output_shapes_;
  std::set<SignatureKey> value_dependent_;

  std::mutex graph_mutex_;  // serializes runs when graphs_enabled_; guards the two below
  std::map<SignatureKey, GraphSet> graphs_;  // destroyed before session_ (declared after it)
  std::map<SignatureKey, GraphSet> bound_graphs_;  // over tensors bound by run_into (Note [I/O binding] above)
  int next_graph_id_ = 1;                    // ORT reserves 0; -1 is "no graph"
  bool graph_limit_noted_ = false;

  mutable std::mutex notes_mutex_;
  std::vector<std::string> run_notes_;  // graph decisions made while running, for explain()

  mutable std::mutex profile_mutex_;  // guards the three below
  bool profile_done_ = false;
  Placement placement_ = Placement::kUnknown;  // guarded by graph_mutex_ (read and set by the graph paths only)
  std::vector<NodeExplanation> nodes_;
  std::string profile_error_;  // why nodes_ is empty when the first run's profile could not be read
  std::atomic<bool> explain_profile_pending_{true};  // the next run takes explain()'s profile
  ort::ProfileFolder profile_folder_;                // where ORT writes this session's profiles
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
    DeviceManager::instance().check_device(options.device);  // Note [A device that does not exist] (core/engine.cpp)
    Support support = available(options);
    if (!support) {
      throw UnsupportedOperationError(detail::str_cat("the onnxruntime engine cannot run on ", options.device.str(),
                                                      ": ", support.reason()));
    }
    // A policy's quantization decisions make the QDQ model first (frontends/onnx/onnx_quantize.h).
    std::string quantized;
    return std::make_unique<OrtSession>(onnx_frontend::model_for_policy(model, options, quantized), options);
  }
};

}  // namespace

void register_onnxruntime(EngineRegistry& registry) { registry.add(std::make_unique<OrtEngine>()); }

}  // namespace xpuruntime
