// The native engine: ONNX -> Graph -> CapturePlan (one per input-shape signature, cached) -> GraphExec (a pool per
// plan, so that several threads can run one session at once). See docs/native_engine.md.
//
// create() imports the model (warming the libraries meanwhile on CUDA: session/warm_up.h) and makes the session:
// NativeSession (session/native_session.h; its roles in session/session_io.h, plan_cache.h, build_cache.h,
// explain.h), or for tensor_parallel > 1 one per rank (session/tensor_parallel_session.h).
//
// Note [Support check at session creation]
// Shapes are known only when inputs arrive, but a model whose nodes cannot run on the device must fail when the
// session is created (and engine "auto" must know then whether to fall back). So create() builds a probe plan
// with every symbolic or unknown input dimension set to 1: that lowers and dispatches every node. The probe plan
// is kept and serves runs with exactly those shapes. A probe that fails for another reason than an unsupported
// node or a plan over ExecutionPolicy.memory_limit (a model that needs batch > 1, ...) is ignored: the first run
// reports the problem.
#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "core/build_clock.h"
#include "frontends/onnx/onnx_quantize.h"
#include "engines/native/session/native_session.h"
#include "engines/native/session/tensor_parallel_session.h"
#include "engines/native/session/warm_up.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/engine.h"
#include "xpuruntime/onnx_import.h"

namespace xpuruntime {
namespace {

using runtime::NativeSession;
using runtime::TensorParallelRank;

class NativeEngine final : public Engine {
 public:
  NativeEngine() : Engine("native") {}

  Support available(const SessionOptions& options) const override {
    if (options.device.is_cpu()) return Support::yes();
    if (options.device.is_cuda()) {
#if XPURT_WITH_CUDA
      return Support::yes();
#else
      return Support::no("this xpuruntime was built without CUDA");
#endif
    }
    return Support::no("the native engine runs on cpu and cuda devices");
  }

  std::unique_ptr<EngineSession> create(const std::string& model, const SessionOptions& options) const override {
    DeviceManager::instance().check_device(options.device);  // Note [A device that does not exist] (core/engine.cpp)
    OnnxImportOptions import_options;
    import_options.model_dir = options.model_dir;
    import_options.allow_newer_opsets = options.exec_policy.allow_newer_opsets;
    // Note [Libraries warmed while the model is read]: the session keeps the helper's future (its destruction waits
    // for the helper); on the other paths this future's destructor does.
    std::future<double> warming;
    if (options.device.is_cuda()) {
      warming = std::async(std::launch::async, runtime::warm_libraries, options.device, options.exec_policy);
    }
    const auto start = std::chrono::steady_clock::now();
    // A policy's quantization decisions make the QDQ model first (frontends/onnx/onnx_quantize.h).
    std::string quantized;
    Graph graph = import_onnx(onnx_frontend::model_for_policy(model, options, quantized), import_options);
    const double import_ms = detail::ms_since(start);
    if (options.exec_policy.tensor_parallel > 1) return runtime::make_tensor_parallel_session(graph, options);
    auto session = std::make_unique<NativeSession>(std::move(graph), options, TensorParallelRank{}, import_ms);
    if (warming.valid()) session->keep_warm_up(warming.share());
    return session;
  }
};

}  // namespace

void register_native(EngineRegistry& registry) { registry.add(std::make_unique<NativeEngine>()); }

}  // namespace xpuruntime
