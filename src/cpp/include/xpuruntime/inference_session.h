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
#include "xpuruntime/run_options.h"

namespace xpuruntime {

// I/O binding (ONNX Runtime's IoBinding): inputs and outputs bound to tensors once and reused by every
// run_with_binding(). An output bound to a tensor is written in place (its dtype and shape must be the output's);
// one bound to a device gets a new tensor there each run. With CUDA graphs, a session whose bound tensors keep
// their addresses from run to run replays its graph over them without staging copies (the onnxruntime engine;
// docs/engines.md). Made by InferenceSession::io_binding(), which checks names and dtypes as they are bound.
//
//   IoBinding binding = session.io_binding();
//   binding.bind_input("x", x_cuda);
//   binding.bind_output("y", y_cuda);  // or binding.bind_output("y", Device::cuda(0))
//   session.run_with_binding(binding);  // y_cuda now holds the output
//
// Not thread-safe: one binding per thread (a session runs several bindings at once).
class XPURT_API IoBinding {
 public:
  void bind_input(const std::string& name, Tensor value);
  void bind_output(const std::string& name, Tensor value);
  void bind_output(const std::string& name, Device device);
  void clear_inputs() { inputs_.clear(); }
  void clear_outputs() {
    outputs_.clear();
    results_.clear();
  }
  const std::vector<std::pair<std::string, Tensor>>& inputs() const { return inputs_; }
  std::vector<std::string> output_names() const;
  // The outputs of the last run, in binding order: the bound tensors themselves, or the new ones.
  const std::vector<Tensor>& outputs() const { return results_; }

 private:
  friend class InferenceSession;
  struct Output {
    std::string name;
    Tensor tensor;  // bound in place, or undefined
    Device device;  // where a new output goes when `tensor` is undefined
  };
  IoBinding(std::vector<ValueInfo> inputs, std::vector<ValueInfo> outputs, Device device)
      : model_inputs_(std::move(inputs)), model_outputs_(std::move(outputs)), device_(device) {}

  std::vector<ValueInfo> model_inputs_;
  std::vector<ValueInfo> model_outputs_;
  Device device_;
  std::vector<std::pair<std::string, Tensor>> inputs_;
  std::vector<Output> outputs_;
  std::vector<Tensor> results_;
};

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
  // Runs the model; `output_names` empty means every output, in model order. Tensors only: a model with
  // sequence or optional inputs or outputs runs through run_values (InvalidTypeError here naming the value).
  // `run_options` (run_options.h; default: none) may stop the run: RunTerminatedError saying where and why
  // (Note [Stopping a run]); every run method takes them.
  std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          const std::vector<std::string>& output_names = {},
                          const RunOptions& run_options = RunOptions()) const;
  // Runs the model with values of any kind (value.h), as ONNX Runtime's Run with Ort::Values: a tensor, a sequence
  // (Value::sequence) or an optional per input, as get_inputs() declares it (ValueInfo::type); an optional input
  // also takes its element itself (a tensor or a sequence), wrapped as ONNX Runtime does, and Value::none() for
  // nothing. Returns one value per output: a tensor, a sequence, or an optional (empty or holding its element).
  // A feed of the wrong kind or element type is InvalidTypeError naming the input. The native engine runs
  // sequences and optionals on the CPU (a CUDA session refuses such a model when it is created); other engines
  // take tensor values only (UnsupportedOperationError).
  //
  //   auto out = session.run_values({{"seq", Value::sequence({a, b}, DType::kFloat32)}, {"opt", Value::none()}});
  //   for (const Tensor& t : out[0].elements()) ...
  std::vector<Value> run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                const std::vector<std::string>& output_names = {},
                                const RunOptions& run_options = RunOptions()) const;
  // A new, empty I/O binding for this session.
  IoBinding io_binding() const;
  // Runs with `binding`'s inputs and outputs (at least one output bound); the outputs are then in
  // binding.outputs().
  void run_with_binding(IoBinding& binding, const RunOptions& run_options = RunOptions()) const;
  Explanation explain() const;
  const std::string& engine() const { return engine_; }
  const SessionOptions& options() const { return options_; }

 private:
  InferenceSession() = default;
  void build(const std::string& model);
  template <typename Run>
  void run_profiled(const std::vector<std::pair<std::string, Tensor>>& feeds, const Run& run) const;

  SessionOptions options_;
  std::string engine_;
  std::string engine_reason_;
  std::unique_ptr<EngineSession> session_;
};

// The engine names known to xpuruntime, whether or not this build has them.
XPURT_API std::vector<std::string> known_engines();

// Whether an engine can run on a device in this build and on this machine; when not, `reason` says what is missing
// and what to install or use instead (the engine's Engine::available).
struct EngineAvailability {
  std::string name;
  bool available = false;
  std::string reason;  // empty when available
};
// Every known engine but "auto", in known_engines() order, asked about `device` (a device that does not exist
// makes every engine unavailable, with DeviceManager's reason).
XPURT_API std::vector<EngineAvailability> engine_availability(Device device = Device::cpu());

}  // namespace xpuruntime
