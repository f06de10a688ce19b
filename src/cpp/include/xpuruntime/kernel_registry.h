// KernelRegistry: the table of ops and of the kernels that implement them.
//
// An op is defined once by an OpSchema (its inputs, its policy family, and shape inference that also validates
// the inputs). Kernels are added by backends, each through one registration function
// (`register_<backend>(KernelRegistry&)`, see backends/). A kernel declares what it takes (KernelDecl: dtypes,
// ranks, layout, alignment, compute capability), answers `supports(desc, policy)` with yes or the reason why not (the
// declaration first, then its own `accepts`), and `build(...)` makes a KernelPlan for one descriptor: the validate ->
// build -> execute lifecycle of cudnn-frontend. A plan may carry a `record` (e.g. the cuBLASLt algorithm it picked)
// from which `build` re-creates exactly the same plan: that is what the autotune cache and lock files store.
// Beside the ops, node kernels (NodeKernelInfo) run whole ONNX nodes keyed by (domain, op_type): the cpu backend's ONNX
// reference implementations, which the native engine reaches through find_node_kernel (core/node_kernels.h).
//
// Ownership: the registry owns its schemas and kernels for the life of the process; the pointers it hands out
// stay valid. Thread-safety: `global()` is fully populated on first use; lookups are safe from any thread;
// `add_*` is meant for start-up (it takes a lock, but returned lists are snapshots).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "xpuruntime/device.h"
#include "xpuruntime/export.h"
#include "xpuruntime/op_descriptor.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/value.h"

namespace xpuruntime {

struct ExecutionPolicy;
struct Node;

// The answer to "can this kernel run this op?": yes, or no with a reason a user can act on.
class XPURT_API Support {
 public:
  static Support yes() { return Support(true, {}); }
  static Support no(std::string reason) { return Support(false, std::move(reason)); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const std::string& reason() const { return reason_; }

 private:
  Support(bool ok, std::string reason) : ok_(ok), reason_(std::move(reason)) {}
  bool ok_;
  std::string reason_;
};

// Everything a plan needs to run once. Inputs and outputs are in schema order; an absent optional input is an
// undefined Tensor. Outputs are allocated by the caller with the shapes of `desc.outputs`.
struct XPURT_API KernelLaunch {
  const OpDescriptor* desc = nullptr;
  const Tensor* inputs = nullptr;
  std::size_t num_inputs = 0;
  Tensor* outputs = nullptr;
  std::size_t num_outputs = 0;
  StreamView stream;             // CUDA kernels launch here; ignored on CPU
  void* workspace = nullptr;     // `plan.workspace_bytes()` bytes on the op's device, or null when 0
  std::size_t workspace_bytes = 0;

  const Tensor& input(std::size_t i) const { return inputs[i]; }
  Tensor& output(std::size_t i) const { return outputs[i]; }
};

// A kernel specialised to one OpDescriptor (algorithm chosen, descriptors created). Immutable after build;
// `run` may be called concurrently from several threads with different launches.
class XPURT_API KernelPlan {
 public:
  virtual ~KernelPlan() = default;
  virtual void run(const KernelLaunch& launch) const = 0;
  virtual std::size_t workspace_bytes() const { return 0; }
  // Runs once with `inputs` (schema order; absent optional inputs undefined) into pre-allocated `outputs`: takes
  // `workspace_bytes()` from the MemoryManager on `stream` (freed stream-ordered after the launch), or uses the
  // caller's `workspace` when given (contiguous, at least workspace_bytes() on the op's device: memory from a
  // framework's allocator, e.g. inside its CUDA graph pool), fills a KernelLaunch and calls run(). `stream` is
  // ignored on the CPU.
  void execute(const OpDescriptor& desc, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
               const StreamView& stream = {}, const Tensor* workspace = nullptr) const;
  // Text (JSON object) from which `Kernel::build` re-creates this plan; empty when there is nothing to choose.
  virtual std::string record() const { return {}; }
  // One line for humans: "cublasLt algo 21, tile 128x256, 4 stages, epilogue GELU_BIAS".
  virtual std::string describe() const { return {}; }
};

// What a kernel takes, declared beside it: the constraints every backend used to check by hand at the top of its
// supports(). Kernel::supports checks them (check_declaration) before the kernel's own accepts(), in one order and in
// one wording for every kernel (Note [Kernel declarations] in kernel_registry.cpp). The default declares nothing.
struct XPURT_API DTypeSet {
  std::vector<DType> dtypes;  // empty: any dtype
  // How reasons name the set ("float32, float16 or bfloat16"); empty: the dtypes, joined with ", " and " or ".
  std::string text;
  bool contains(DType dtype) const;
  std::string str() const;  // `text`, or the joined dtypes
};

struct XPURT_API RankRange {
  int min = 0;   // the least rank
  int max = -1;  // the greatest rank; -1: no limit
};

enum class Layout : std::uint8_t {
  kAny,
  kContiguous,    // row-major (TensorDesc::is_contiguous; an empty tensor always is)
  kChannelsLast,  // a rank-4 tensor stored NHWC (strides C*W, 1, W*C, C of its NCHW shape), or contiguous below rank 4
};

struct XPURT_API KernelDecl {
  // Who the reasons name ("cudnn conv2d"); empty: they start with the constraint.
  std::string subject;
  // The inputs' names for the reasons ("x", "weight"); the last one repeats for a variadic input. Empty: "input k".
  std::vector<std::string> input_names;
  // The op's device and every present input's device are of KernelInfo::device_type.
  bool on_device = false;
  // Refuses precision int8 (the policy's or the descriptor's).
  bool no_int8 = false;
  // The device's compute capability (major * 10 + minor) is at least this one when known (> 0). 0: any.
  int min_compute_capability = 0;
  // min_compute_capability is the oldest architecture the kernels were compiled for (CMAKE_CUDA_ARCHITECTURES): the
  // reason then says how to rebuild rather than what the hardware lacks.
  bool built_for_architectures = false;
  // Every present input's dtype is in `dtypes`; input k's also in input_dtypes[k] when listed.
  DTypeSet dtypes;
  std::vector<DTypeSet> input_dtypes;
  bool one_dtype = false;  // every present input has input 0's dtype
  // Input k's rank is within input_ranks[k] (inputs beyond the list: any rank).
  std::vector<RankRange> input_ranks;
  Layout layout = Layout::kAny;  // of every present input
  // Every present input's data pointer is aligned to this many bytes (TensorDesc::alignment); 0: any.
  std::uint32_t alignment = 0;
  bool element_aligned = false;  // ... and to its element size
  // The bytes of every present input's innermost dim (shape.back() * element size) are a multiple of this; 0: any.
  std::uint32_t inner_alignment = 0;
  // The plan may write output 0 over input 0 (the same memory). Checked by nothing at decision time (a decision
  // has no memory yet): what a memory planner may rely on.
  bool in_place = false;
};

struct XPURT_API KernelInfo {
  std::string op;       // the op it implements
  std::string name;     // the name policies use: "cublasLt", "flash_v2", "cpu", ...
  std::string backend;  // the backend folder it comes from: "cpu", "cublas", "cublasLt", "cudnn", "cuda_raw"
  DeviceType device_type = DeviceType::kCPU;
  bool deterministic = true;  // same inputs -> same bits, run after run
  std::string summary;        // one line: what it is
  KernelDecl decl;            // what it takes (nothing declared by default)
};

// Whether `desc` under `policy` meets `decl` for a kernel of `device_type`: yes, or the first failing constraint
// named the same way for every kernel ("cudnn conv2d takes float32, float16 or bfloat16, got float64 for input 0").
// Never throws.
XPURT_API Support check_declaration(const KernelDecl& decl, DeviceType device_type, const OpDescriptor& desc,
                                    const ExecutionPolicy& policy);

class XPURT_API Kernel {
 public:
  explicit Kernel(KernelInfo info) : info_(std::move(info)) {}
  virtual ~Kernel() = default;
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  const KernelInfo& info() const { return info_; }
  const std::string& name() const { return info_.name; }
  const std::string& op() const { return info_.op; }

  // Whether this kernel can run `desc` under `policy`: its declaration (`info().decl`, check_declaration) and then
  // accepts(). Never throws for an unsupported descriptor.
  Support supports(const OpDescriptor& desc, const ExecutionPolicy& policy) const;
  // What the declaration cannot say (attributes, shapes against each other, library present, plan limits), asked
  // only when the declaration holds. Never throws for an unsupported descriptor.
  virtual Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const = 0;
  // A plan for `desc` (only called when `supports` said yes). `record`: a previous plan's record to re-create
  // exactly (empty: choose afresh). Throws UnsupportedOperationError when the record cannot be honoured.
  virtual std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                            const std::string& record) const = 0;
  // Why this kernel should rank before the kernels registered ahead of it for `desc`, or empty when registry order
  // holds (Note [Shape-dependent priority] in dispatcher.cpp). Only asked of kernels that support `desc`; it orders
  // the first-supported pick (auto rules and a preferred rule's fallback), never a pinned or preferred kernel.
  virtual std::string ranks_first(const OpDescriptor& desc) const {
    (void)desc;
    return {};
  }
  // Why the first-supported pick should time this kernel against the other kernels that support `desc` when it is
  // the pick, or empty (the default: the pick stands). For a kernel whose speed against a library's depends on shapes
  // no rule of thumb separates (Note [Timed first choices] in dispatcher.cpp). Asked only of the pick, never under a
  // pinned or preferred rule.
  virtual std::string timed_against_others(const OpDescriptor& desc) const {
    (void)desc;
    return {};
  }
  // Whether this kernel's cost on `desc` is reading a constant weight once (a GEMV's weight stream): then, in a model
  // whose constants outgrow the device's L2 cache, its candidates are timed with the weight read from memory (Note
  // [Weights timed from memory] in dispatcher.cpp). False by default.
  virtual bool streams_weight(const OpDescriptor& desc) const {
    (void)desc;
    return false;
  }
  // Tactics: the records of other plans this kernel can run `desc` with (cuBLASLt: its heuristic's other
  // algorithms), each accepted by build(desc, policy, record). Autotuning (auto:BestPerformance) times them
  // besides the default plan and keeps the fastest (Note [Tactics] in dispatcher.cpp). None by default.
  virtual std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const {
    (void)desc;
    (void)policy;
    return {};
  }
  // A small problem of this kernel's op (op, inputs and attributes; outputs left to KernelRegistry::infer) whose plan
  // makes the kernel's library do on `device` what it does on its first use in a process: load its kernel modules
  // and heuristics, create the calling thread's handle. nullopt (the default) when that first use costs nothing
  // worth hiding. A native session builds it on a helper thread while it reads its model (Note [Libraries warmed
  // while the model is read] in native_engine.cpp).
  virtual std::optional<OpDescriptor> warm_up(Device device) const {
    (void)device;
    return std::nullopt;
  }

 private:
  KernelInfo info_;
};

// A kernel whose plan is a plain function (most elementwise kernels): no choices, nothing to record.
class XPURT_API FunctionKernel final : public Kernel {
 public:
  using SupportsFn = std::function<Support(const OpDescriptor&, const ExecutionPolicy&)>;
  using RunFn = std::function<void(const KernelLaunch&)>;
  using ReasonFn = std::function<std::string(const OpDescriptor&)>;
  // `accepts`: what the declaration in `info` cannot say (Kernel::accepts). `timed`: Kernel::timed_against_others
  // (none: the pick stands).
  FunctionKernel(KernelInfo info, SupportsFn accepts, RunFn run, ReasonFn timed = nullptr);
  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override;
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override;
  std::string timed_against_others(const OpDescriptor& desc) const override;

 private:
  SupportsFn accepts_;
  RunFn run_;
  ReasonFn timed_;
};

// A kernel name that a KernelPolicy may use for an op although no kernel of this library implements it: PyTorch's
// own backends ("torch_flash", "torch_cublaslt", ...), which xpuruntime.pytorch runs when training under a
// policy. See Note [External kernels] in kernel_registry.cpp.
struct XPURT_API ExternalKernelInfo {
  std::string op;       // the op it implements: "matmul", "linear", "conv2d", "attention"
  std::string name;     // the name policies use
  std::string runner;   // who runs it: "pytorch"
  std::string summary;  // one line: what it is
};

// ---- Node kernels: ONNX operators run on whole nodes (Note [Node kernels] in kernel_registry.cpp) ----

// Resolves a value of an enclosing graph by name (the outer scope of an If/Loop/Scan/SequenceMap body); an
// undefined value when the name is unknown there.
using ValueLookup = std::function<Value(const std::string&)>;

// Runs `node` (its op_type and attributes; `opset`: the version of its domain the model imports) on CPU values, one
// per node input (undefined for absent optional inputs), and returns one value per node output (undefined for
// unused optional outputs it skipped). Names of enclosing graphs resolve through `outer` (may be empty).
using NodeKernelFn = std::function<std::vector<Value>(const Node& node, std::int64_t opset,
                                                      const std::vector<Value>& inputs, const ValueLookup& outer)>;
// A node kernel run with destinations: tensor output i is written into into[i] where that tensor has the output's
// shape and dtype, is contiguous on the CPU and shares no memory with an input; elsewhere into a new tensor, as
// NodeKernelFn does.
using NodeKernelIntoFn = std::function<std::vector<Value>(const Node& node, std::int64_t opset,
                                                          const std::vector<Value>& inputs,
                                                          const std::vector<Tensor>& into)>;

// A kernel of an ONNX operator, keyed by (domain, op_type) rather than by a registry op: ONNX's full semantics on
// whole nodes, output shapes known only when it runs. The cpu backend registers one per operator of ai.onnx,
// ai.onnx.ml, ai.onnx.preview.training and com.xpuruntime (its ONNX reference implementations, backends/cpu/onnx/).
struct XPURT_API NodeKernelInfo {
  std::string domain;               // "" for ai.onnx (an "ai.onnx" given to add/find means "" too)
  std::string op_type;              // "Add", "LabelEncoder", "FusedConv"
  std::string name = "onnx_ref";    // the kernel name explain() shows for nodes it runs
  std::string backend = "cpu";      // the backend folder it comes from
  NodeKernelFn run;                 // handles every opset of the operator (reading `opset` where they differ)
  NodeKernelIntoFn run_into;        // the same with output destinations (null: run_node_into calls `run`)
  std::string key() const;          // "Add", "ai.onnx.ml:LabelEncoder"
};

// Defines an op: its inputs and attributes (documentation and validation), the policy family it belongs to,
// and shape inference.
struct XPURT_API OpSchema {
  std::string name;    // "linear"
  std::string family;  // the KernelPolicy key that also governs it: "matmul" for matmul and linear
  // Input names, optional ones suffixed with '?' ("bias?"). A last name suffixed with "..." ("x...") is
  // variadic: it stands for one or more inputs (concat).
  std::vector<std::string> inputs;
  std::vector<std::string> outputs = {"y"};
  std::string doc;                            // one line, with the attributes and their defaults
  // Validates `desc.inputs`/`desc.attrs` (InvalidArgumentError / InvalidTypeError naming the argument, the
  // expected and the actual value) and returns the output descriptors (dtype and contiguous shape).
  std::function<std::vector<TensorDesc>(const OpDescriptor&)> infer;

  std::size_t num_required_inputs() const;  // a variadic input counts once
  bool is_variadic() const;                   // the last input name ends with "..."
};

class XPURT_API KernelRegistry {
 public:
  KernelRegistry() = default;
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

  // The process-wide registry with every op schema and every backend of this build registered.
  static KernelRegistry& global();

  void add_schema(OpSchema schema);     // InvalidArgumentError when the name is taken
  void add_kernel(std::unique_ptr<Kernel> kernel);  // the op must exist; (op, name) must be new

  // Lookups. `schema` throws InvalidArgumentError listing the valid op names when `op` is unknown.
  const OpSchema& schema(const std::string& op) const;
  const OpSchema* find_schema(const std::string& op) const;
  std::vector<std::string> ops() const;       // sorted
  std::vector<std::string> families() const;  // sorted, unique
  std::vector<std::string> ops_in_family(const std::string& family) const;
  // The kernels of `op` in priority order (the order used when the policy says nothing).
  std::vector<const Kernel*> kernels(const std::string& op) const;
  const Kernel* find_kernel(const std::string& op, const std::string& name) const;
  // Kernel names valid for a policy key (an op or a family), sorted, unique; external kernels included.
  std::vector<std::string> kernel_names(const std::string& policy_key) const;
  // External kernels (valid policy names that run outside this library); the op must exist, (op, name) be new.
  void add_external_kernel(ExternalKernelInfo info);
  const ExternalKernelInfo* find_external_kernel(const std::string& op, const std::string& name) const;
  std::vector<ExternalKernelInfo> external_kernels(const std::string& op = {}) const;  // of one op, or all
  bool is_policy_key(const std::string& key) const;  // an op name or a family name
  std::vector<std::string> policy_keys() const;       // families and ops, sorted, unique

  // Shape inference: fills `desc.outputs` (validating the inputs) through the op's schema.
  void infer(OpDescriptor& desc) const;

  // Versions of the vendor libraries the backends load ("cublasLt" -> "130200"), found at registration time.
  // They are part of the autotune cache key: a tuned choice is only replayed with the same libraries.
  void add_library_version(const std::string& library, const std::string& version);
  std::string library_versions() const;  // "cublasLt=130200,cudnn=91400" (sorted)

  // Node kernels (NodeKernelInfo). (domain, op_type) must be new (InternalError otherwise).
  void add_node_kernel(NodeKernelInfo info);
  const NodeKernelInfo* find_node_kernel(const std::string& domain, const std::string& op_type) const;  // or null
  std::vector<const NodeKernelInfo*> node_kernels() const;  // sorted by key()

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::string> library_versions_;
  std::vector<OpSchema> schemas_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<std::unique_ptr<ExternalKernelInfo>> external_kernels_;  // stable addresses
  std::map<std::pair<std::string, std::string>, std::unique_ptr<NodeKernelInfo>> node_kernels_;  // stable addresses
};

// Registration functions, one per backend (src/cpp/backends/<name>/). `register_ops` adds the op schemas.
XPURT_API void register_ops(KernelRegistry& registry);
void register_cpu(KernelRegistry& registry);
void register_cuda_raw(KernelRegistry& registry);
void register_cuda_raw_depthwise(KernelRegistry& registry);  // conv2d's "depthwise", before cudnn in priority
void register_cuda_raw_grouped_conv(KernelRegistry& registry);  // conv2d's "grouped_gemm", before cudnn too
void register_cublas(KernelRegistry& registry);
void register_cublaslt(KernelRegistry& registry);
void register_cudnn(KernelRegistry& registry);
void register_nccl(KernelRegistry& registry);
void register_codegen(KernelRegistry& registry);  // kernels generated while plans are built (NVRTC)
// The cudnn backend's attention kernel, registered after cuda_raw so that it ranks after flash_v2.
void register_cudnn_attention(KernelRegistry& registry);
// PyTorch's own backends as external kernels (run by xpuruntime.pytorch; docs/pytorch.md).
void declare_pytorch_kernels(KernelRegistry& registry);

}  // namespace xpuruntime
