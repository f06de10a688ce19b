// What every model fuzzer does with one input (fuzz_model, fuzz_model_structure, the campaign's fuzz_worker): model
// bytes -> InferenceSession on the CPU (the native engine, or the onnxruntime engine) -> one run on zero inputs.
// Anything but a typed XpuRuntimeError (a crash, an abort, a sanitizer report, another exception, an allocation past
// the fuzzer's memory limit, a hang) is a finding (docs/reliability.md, Fuzzing).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/run_options.h"

namespace xpuruntime::fuzz {

enum class ModelOutcome {
  kRan,         // created and ran
  kBuiltOnly,   // created; not run (control flow whose trip counts may be endless, inputs too large)
  kTypedError,  // an XpuRuntimeError: what bad input must give
};

struct ModelResult {
  ModelOutcome outcome = ModelOutcome::kRan;
  ErrorCode code = ErrorCode::kInternal;  // kTypedError's code
  std::string message;                    // kTypedError's message
};

// The engine the fuzzers drive: XPURT_FUZZ_ENGINE ("native", the default, or "onnxruntime").
inline const std::string& fuzz_engine() {
  static const std::string engine = [] {
    const char* e = std::getenv("XPURT_FUZZ_ENGINE");
    return std::string(e != nullptr && *e != '\0' ? e : "native");
  }();
  return engine;
}

// Creates a session from `bytes` and runs it once on zero inputs (symbolic dims are 1), for at most `run_timeout`
// (RunOptions::timeout; 0: no limit): a Loop whose trip count and condition let it run for ever -- valid ONNX --
// stops with a typed RunTimeoutError. Unless `run_control_flow`, a model with Loop, Scan or SequenceMap is built,
// not run. Exceptions other than XpuRuntimeError propagate: they are findings.
inline ModelResult run_model_bytes(const std::string& bytes, const std::string& engine, bool run_control_flow,
                                   std::chrono::milliseconds run_timeout = std::chrono::milliseconds(0)) {
  SessionOptions options;
  options.engine = engine;
  options.exec_policy.memory_limit = 256u << 20;  // plans past it are typed OutOfMemoryErrors
  options.exec_policy.intra_op_threads = 1;
  ModelResult result;
  try {
    InferenceSession session = InferenceSession::from_bytes(bytes, options);
    if (!run_control_flow) {
      for (const auto& node : session.explain().nodes) {
        if (node.op_type == "Loop" || node.op_type == "Scan" || node.op_type == "SequenceMap") {
          result.outcome = ModelOutcome::kBuiltOnly;
          return result;
        }
      }
    }
    std::vector<std::pair<std::string, Tensor>> feeds;
    for (const ValueInfo& in : session.get_inputs()) {
      if (in.kind != ValueKind::kTensor) {
        result.outcome = ModelOutcome::kBuiltOnly;
        return result;
      }
      std::vector<std::int64_t> shape;
      std::int64_t numel = 1;
      for (const std::string& dim : in.shape) {
        std::int64_t d = 1;
        if (!dim.empty() && dim.find_first_not_of("0123456789") == std::string::npos && dim.size() < 7) {
          d = std::stoll(dim);
        }
        shape.push_back(d);
        numel *= d;
        if (numel > (1 << 16)) {
          result.outcome = ModelOutcome::kBuiltOnly;
          return result;
        }
      }
      feeds.emplace_back(in.name, Tensor::zeros(shape, in.dtype));
    }
    RunOptions run_options;
    run_options.timeout = run_timeout;
    session.run(feeds, {}, run_options);
  } catch (const XpuRuntimeError& e) {
    result.outcome = ModelOutcome::kTypedError;
    result.code = e.code();
    result.message = e.what();
  }
  return result;
}

}  // namespace xpuruntime::fuzz
