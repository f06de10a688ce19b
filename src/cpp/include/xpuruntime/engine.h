// Engines: what runs a whole model behind InferenceSession (the native engine, ONNX Runtime, TensorRT, ...).
//
// An Engine is registered once in the EngineRegistry (`register_<engine>(EngineRegistry&)`, one folder per
// engine under backends/). For a model and SessionOptions it answers `available(options)` with yes or the reason
// why not (library missing, device unsupported), and `create(model, options)` builds an EngineSession, which
// runs the model and explains what ran.
//
// Ownership: the registry owns its engines for the life of the process; an EngineSession is owned by the
// InferenceSession that created it. Thread-safety: EngineSession::run may be called from several threads at once.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/export.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime {

// A model input or output: name, kind (a tensor, a sequence of tensors, an optional: value.h), element type and
// shape (of the tensor, or of the tensors a sequence or optional holds), symbolic dimensions as their names
// ("batch") and unknown ones as "?".
struct XPURT_API ValueInfo {
  std::string name;
  ValueKind kind = ValueKind::kTensor;
  ValueKind element_kind = ValueKind::kTensor;  // kOptional: what it holds (kTensor or kSequence)
  DType dtype = DType::kFloat32;
  std::vector<std::string> shape;
  // ONNX-style type, as ONNX Runtime's NodeArg.type: "tensor(float32)", "seq(tensor(float32))",
  // "optional(tensor(int64))", "optional(seq(tensor(float32)))".
  std::string type() const;
  std::string str() const;  // "input: float32[batch, 3, 224, 224]", "x: seq(float32[?])", "o: optional(int64[3])"
};

// How a session is built. Valid when default-constructed: the CPU, default policies, engine "auto".
struct XPURT_API SessionOptions {
  Device device;                  // default: cpu
  std::string engine = "auto";    // "auto", "native", "onnxruntime", "tensorrt"
  KernelPolicy kernel_policy;     // default: empty (auto for every op)
  ExecutionPolicy exec_policy;    // default: fp32, no determinism requirement
  bool fp16 = false;              // shorthand for exec_policy.precision = fp16
  // Folder of external-data files (default: the model file's folder; a model given as bytes has none, and its
  // external data is refused unless this names one).
  std::string model_dir;
  // Native engine: graph passes turned off by name (docs/native_engine.md; an unknown name is an
  // InvalidArgumentError listing the valid ones), and a file the first run writes its plan's optimized graph to as
  // ONNX, specialised to that run's input shapes (empty: none; like ONNX Runtime's optimized_model_filepath).
  // Other engines refuse a non-empty value.
  // The onnxruntime engine takes optimized_model_path too: ONNX Runtime writes its optimized model there when the
  // session is created (SessionOptions::SetOptimizedModelFilePath).
  std::vector<std::string> disabled_passes;
  std::string optimized_model_path;
  // onnxruntime engine: ONNX Runtime session config entries (key, value), added as they are after xpuruntime's own
  // (xpuruntime.onnxruntime passes SessionOptions.add_session_config_entry's here). Other engines do not read them
  // (xpuruntime.onnxruntime reports them in explain() as kept without effect).
  std::vector<std::pair<std::string, std::string>> session_config;
};

// What ran for one node of the model.
struct XPURT_API NodeExplanation {
  std::string node;       // node name
  std::string op_type;    // ONNX op type
  std::string kernel;     // kernel or execution provider that ran it
  std::string backend;
  std::string precision;
  std::string reason;     // why this kernel
  // Nodes the Dispatcher decided (empty for views, reference-library nodes and engines without a dispatcher):
  std::string op;           // the registry op ("linear"): the key a KernelPolicy rule for this node uses
  std::string rule;         // how the kernel was chosen (Decision::rule: "pinned", "autotuned", ...)
  std::string policy_rule;  // the KernelPolicy rule that applied, in short form ("auto", "pin:cpu")
  std::vector<CandidateReport> candidates;  // every kernel considered; the rejected ones say why
  int segment = 0;  // the plan segment the node ran in (Note [Segmented plans] in capture_plan.h); 0 when unsegmented
};

// A copy or a synchronization that every run of the session makes, as the engine plans it (for the shapes of the
// last run). Copies the caller makes (e.g. device outputs read back into numpy) are not the engine's and not here.
struct XPURT_API TransferExplanation {
  std::string kind;       // "copy", "sync" or "append" (a cache appended in place: only the new positions written)
  std::string value;      // the input or output copied; empty for a sync
  std::string direction;  // copies: "host->device", "device->host", "device->device", "host->host"; syncs: ""
  std::size_t bytes = 0;  // per run (0 for a sync)
  std::string reason;     // why the engine makes it
};

// One phase of creating a session or of building one of its plans, with its wall time (Note [Build phases] in
// engines/native/plan/capture_plan.cpp). The native engine names them "import" (ONNX -> graph) and "plan <shapes>:
// <phase>" (passes, kernel selection per backend, constants to the device, ...).
struct XPURT_API BuildPhase {
  std::string phase;
  double ms = 0;
};

struct XPURT_API Explanation {
  std::string engine;               // the engine that runs the session
  std::string engine_reason;        // why this engine
  std::string device;
  std::vector<NodeExplanation> nodes;
  // Policy entries and how the engine honoured them ("conv=cudnn -> cudnn_conv_algo_search=HEURISTIC", or
  // "matmul=pin:cublasLt: not honoured: ...").
  std::vector<std::string> policy_notes;
  std::vector<std::string> options;  // engine options as set ("intra_op_num_threads=2", ...)
  std::string memory;                // the memory plan, when the engine has one ("peak 12 MiB = arena ...")
  std::string memory_json;           // the same as one JSON object (MemoryPlan::to_json), or empty
  std::vector<TransferExplanation> transfers;  // copies and syncs per run (engines that plan them; else empty)
  // The native engine's plan segments, one line each, when the last run's plan was segmented at data-dependent
  // nodes (Note [Segmented plans]): steps, CUDA graph, memory, and where and why each segment ends.
  std::vector<std::string> segments;
  // Where session creation and the plan builds since went, in order (engines that report it; else empty).
  std::vector<BuildPhase> build;
  std::string to_json() const;       // one JSON object
  std::string str() const;           // a text report with a table of nodes
};

class XPURT_API EngineSession {
 public:
  virtual ~EngineSession() = default;
  virtual const std::vector<ValueInfo>& inputs() const = 0;
  virtual const std::vector<ValueInfo>& outputs() const = 0;
  // Runs the model. `feeds`: one tensor per input, by name (any device the engine accepts; others are copied).
  // `output_names`: the outputs wanted, in order (empty: all). Returns them in that order.
  virtual std::vector<Tensor> run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                  const std::vector<std::string>& output_names) = 0;
  // Runs with outputs bound by the caller (IoBinding; Note [I/O binding] in core/engine.cpp). `outputs` holds one
  // entry per name in `output_names` (not empty): a defined entry is a tensor of that output's dtype and shape, on
  // the session's device, that the run writes; an undefined one is set to a tensor the engine allocates. The
  // default runs run() and copies into the defined entries; engines that can write in place override it.
  virtual void run_into(const std::vector<std::pair<std::string, Tensor>>& feeds,
                        const std::vector<std::string>& output_names, std::vector<Tensor>& outputs);
  // Runs with feeds and outputs of any value kind (tensors, sequences, optionals; value.h), as
  // InferenceSession::run_values. The default takes tensor feeds only (UnsupportedOperationError naming the first
  // other one) and runs run(); engines that run sequences and optionals override it.
  virtual std::vector<Value> run_values(const std::vector<std::pair<std::string, Value>>& feeds,
                                        const std::vector<std::string>& output_names);
  virtual Explanation explain() const = 0;
};

class XPURT_API Engine {
 public:
  explicit Engine(std::string name) : name_(std::move(name)) {}
  virtual ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  const std::string& name() const { return name_; }
  // Whether this engine can serve `options` at all in this build and on this machine (never throws).
  virtual Support available(const SessionOptions& options) const = 0;
  // Builds a session for the serialized ONNX model `model`. Throws InvalidArgumentError for a malformed model,
  // UnsupportedOperationError when the engine cannot run it (naming every unsupported node).
  virtual std::unique_ptr<EngineSession> create(const std::string& model, const SessionOptions& options) const = 0;

 private:
  std::string name_;
};

class XPURT_API EngineRegistry {
 public:
  EngineRegistry() = default;
  EngineRegistry(const EngineRegistry&) = delete;
  EngineRegistry& operator=(const EngineRegistry&) = delete;
  static EngineRegistry& global();  // every engine of this build registered
  void add(std::unique_ptr<Engine> engine);
  const Engine* find(const std::string& name) const;  // null when unknown
  std::vector<std::string> names() const;            // in registration order

 private:
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

// Registration functions, one per engine (src/cpp/engines/<name>/), called by EngineRegistry::global().
void register_onnxruntime(EngineRegistry& registry);
void register_native(EngineRegistry& registry);
void register_tensorrt(EngineRegistry& registry);  // today a named refusal: what to install (core/declared_engine.h)
void register_openvino(EngineRegistry& registry);  // likewise
void register_qnn(EngineRegistry& registry);       // likewise

}  // namespace xpuruntime
