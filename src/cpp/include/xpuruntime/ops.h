// Functional ops over xpuruntime tensors. Every call dispatches through a KernelPolicy and an
// ExecutionPolicy (default: the process-wide defaults, see `set_default_policies`) and runs on the inputs'
// device, on `options.stream` (default: that device's current stream). CUDA calls are asynchronous like any
// stream work; outputs are new tensors from the MemoryManager.
//
// Shapes follow the ONNX/PyTorch conventions:
//   matmul(a[..., M, K], b[..., K, N])           -> [..., M, N] (batch dims broadcast)
//   linear(x[..., K], w[N, K], bias[N]?)         -> [..., N], activation "none" | "relu" | "gelu" | "gelu_tanh"
//   conv2d(x[N, C, H, W], w[O, C/g, kh, kw], bias[O]?) with strides, pads (top, left, bottom, right),
//                                                 dilations, groups, activation "none" | "relu"
//   attention(q[B, H, Sq, D], k[B, Hkv, Sk, D], v[B, Hkv, Sk, Dv], mask?) -> [B, H, Sq, Dv]; Hkv divides H;
//                                                 scale (default 1/sqrt(D)), causal (top-left aligned), an
//                                                 additive float mask broadcastable to [B, H, Sq, Sk]
//   softmax(x, axis=-1), layer_norm(x, scale?, bias?, axis=-1, epsilon=1e-5), gelu(x, approximate="none")
//
// Thread-safety: calls from several threads are safe; the cached dispatchers are shared.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xpuruntime/dispatcher.h"
#include "xpuruntime/export.h"

namespace xpuruntime::ops {

struct XPURT_API CallOptions {
  const KernelPolicy* kernel_policy = nullptr;  // default: the process-wide default policy
  const ExecutionPolicy* exec_policy = nullptr;  // default: the process-wide default policy
  const StreamView* stream = nullptr;            // default: the device's current stream
  Decision* decision = nullptr;                  // receives the decision when set
  // Caller-allocated outputs (contiguous, with the op's inferred shapes and dtypes, on the op's device): the op
  // writes into them and `call` returns them. Default (null): new tensors from the MemoryManager. With a
  // caller-allocated `workspace` (at least `plan(...).workspace_bytes` on the op's device) the call allocates
  // nothing: xpuruntime.pytorch passes memory from torch's allocator, which also works inside torch's CUDA graphs.
  std::vector<Tensor>* outputs = nullptr;
  const Tensor* workspace = nullptr;
};

// What `call` would run for these inputs, without running it: the decision (dispatching, and so autotuning,
// like `call`), the outputs' descriptors and the plan's workspace size.
struct XPURT_API CallPlan {
  Decision decision;
  std::vector<TensorDesc> outputs;
  std::size_t workspace_bytes = 0;
};

// The generic entry point every named op below goes through.
XPURT_API std::vector<Tensor> call(const std::string& op, const std::vector<Tensor>& inputs,
                                   const Attributes& attrs = {}, const CallOptions& options = {});

XPURT_API CallPlan plan(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs = {},
                        const CallOptions& options = {});

// A call planned once and launched many times on raw memory: the per-call host path of a framework that owns
// the tensors (xpuruntime.pytorch runs every routed call through one). Construction dispatches like `call` (the
// same Dispatcher, decision and plan, autotuning included) for the descriptors of `inputs` (their shapes, dtypes,
// device and alignment; their data is not read); `launch` then runs that plan on other memory of the same
// descriptors without looking anything up: contiguous inputs, caller-allocated contiguous outputs of `outputs()`
// and a workspace of at least `workspace_bytes()`, on `stream`.
// Thread-safety: immutable after construction; `launch` may be called from several threads at once.
class XPURT_API PreparedCall {
 public:
  PreparedCall(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs = {},
               const CallOptions& options = {});

  const Decision& decision() const;
  const OpDescriptor& descriptor() const { return desc_; }
  const std::vector<TensorDesc>& outputs() const { return desc_.outputs; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // Whether memory at these input addresses (schema order, null for an absent optional input) can run the plan:
  // each present input as aligned as the input it was prepared for (up to 16 bytes: no kernel asks for more), and
  // absent exactly where it was absent. Trailing inputs it was prepared without may be left out (num_inputs less
  // than the op's).
  bool accepts(const void* const* inputs, std::size_t num_inputs) const;
  // Runs the plan. InvalidArgumentError (nothing launched) when `accepts` is false, the counts differ from the
  // op's inputs (past what `accepts` allows) and outputs, an output is null, or the workspace is smaller than `workspace_bytes()`.
  void launch(const void* const* inputs, std::size_t num_inputs, void* const* outputs, std::size_t num_outputs,
              void* workspace, std::size_t workspace_bytes, const StreamView& stream) const;

 private:
  OpDescriptor desc_;
  std::shared_ptr<const Dispatch> dispatch_;
  std::size_t workspace_bytes_ = 0;
};

// The C entry of PreparedCall::launch, for code compiled apart from xpuruntime that holds a PreparedCall's address
// (xpuruntime.pytorch's native path, built against the user's PyTorch with its own compiler flags: only this C
// signature crosses between the two). `stream` is a raw cudaStream_t (ignored on the CPU). Returns 0, or the
// ErrorCode of the failure plus 1 with its message copied (truncated, NUL-terminated) to `message`. Never throws.
extern "C" XPURT_API int xpurt_prepared_call_launch(const void* call, const void* const* inputs,
                                                    std::size_t num_inputs, void* const* outputs,
                                                    std::size_t num_outputs, void* workspace,
                                                    std::size_t workspace_bytes, void* stream, char* message,
                                                    std::size_t message_size) noexcept;

// Every kernel's answer to "can you run this call?" under the options' ExecutionPolicy, in priority order (no
// decision, no plan).
XPURT_API std::vector<CandidateReport> candidates(const std::string& op, const std::vector<Tensor>& inputs,
                                                  const Attributes& attrs = {}, const CallOptions& options = {});

// The Dispatcher used for a pair of policies (cached by their fingerprints; shares one AutotuneCache).
XPURT_API std::shared_ptr<Dispatcher> dispatcher_for(const KernelPolicy& kernel_policy,
                                                     const ExecutionPolicy& exec_policy);
XPURT_API void set_default_policies(const KernelPolicy& kernel_policy, const ExecutionPolicy& exec_policy);
XPURT_API KernelPolicy default_kernel_policy();
XPURT_API ExecutionPolicy default_exec_policy();
// The AutotuneCache the functional ops use (default: in memory, or the file named by XPURT_AUTOTUNE_CACHE).
XPURT_API void set_autotune_cache(std::shared_ptr<AutotuneCache> cache);
XPURT_API std::shared_ptr<AutotuneCache> autotune_cache();

XPURT_API Tensor matmul(const Tensor& a, const Tensor& b, const CallOptions& options = {});
XPURT_API Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                        const std::string& activation = "none", const CallOptions& options = {});
XPURT_API Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
                        const std::vector<std::int64_t>& strides = {1, 1},
                        const std::vector<std::int64_t>& pads = {0, 0, 0, 0},
                        const std::vector<std::int64_t>& dilations = {1, 1}, std::int64_t groups = 1,
                        const std::string& activation = "none", const CallOptions& options = {});
XPURT_API Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {},
                           bool causal = false, double scale = 0.0, const CallOptions& options = {});
XPURT_API Tensor softmax(const Tensor& x, std::int64_t axis = -1, const CallOptions& options = {});
XPURT_API Tensor layer_norm(const Tensor& x, const Tensor& scale = {}, const Tensor& bias = {},
                            std::int64_t axis = -1, double epsilon = 1e-5, const CallOptions& options = {});
XPURT_API Tensor gelu(const Tensor& x, const std::string& approximate = "none", const CallOptions& options = {});
XPURT_API Tensor add(const Tensor& a, const Tensor& b, const CallOptions& options = {});
XPURT_API Tensor mul(const Tensor& a, const Tensor& b, const CallOptions& options = {});
XPURT_API Tensor relu(const Tensor& x, const CallOptions& options = {});
XPURT_API Tensor cast(const Tensor& x, DType dtype, const CallOptions& options = {});

}  // namespace xpuruntime::ops
