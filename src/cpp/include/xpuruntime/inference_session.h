// InferenceSession: the front door. Loads an ONNX model (a file or bytes), picks an engine under the session's
// options, runs it and explains what ran.
//
//   xpuruntime::SessionOptions options;
//   options.engine = "onnxruntime";
//   xpuruntime::InferenceSession session("model.onnx", options);
//   auto outputs = session.run({{"input", x}});
//   std::cout << session.explain().str();
//
// Engines: "native" (xpuruntime's own runtime, docs/native_engine.md), "onnxruntime", "tensorrt" (declared: it says
// what is missing) and "auto" (native on CUDA when it can run every node, else onnxruntime). The choice and its
// reason are in explain().
//
// Ownership: a session owns its engine session; tensors returned by run() own their memory.
// Thread-safety: run() may be called from several threads at once; explain() too.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/engine.h"
#include "xpuruntime/export.h"

namespace xpuruntime {

class XPURT_API InferenceSession {
 public:
  // From a model file (InvalidArgumentError when it cannot be read).
  explicit InferenceSession(const std::string& model_path, SessionOptions options = {});
  // From the serialized model itself.
  static InferenceSession from_bytes(const std::string& model, SessionOptions options = {});

  InferenceSession(InferenceSession&&) noexcept = default;
  InferenceSession& operator=(InferenceSession&&) noexcept = default;

  const std::vector<ValueInfo>& get_inputs() const;
  const std::vector<ValueInfo>& get_outputs() const;
  // Runs the model; `output_names` empty means every output, in model order.
  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names = {}) const;
  Explanation explain() const;
  const std::string& engine() const { return engine_; }
  const SessionOptions& options() const { return options_; }

 private:
  InferenceSession() = default;
  void build(const std::string& model);
  std::vector<Tensor> run_profiled(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                   const std::vector<std::string>& output_names) const;

  SessionOptions options_;
  std::string engine_;
  std::string engine_reason_;
  std::unique_ptr<EngineSession> session_;
};

// The engine names known to xpuruntime, whether or not this build has them.
XPURT_API std::vector<std::string> known_engines();

}  // namespace xpuruntime
