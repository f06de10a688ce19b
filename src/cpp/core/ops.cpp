// The functional ops: named wrappers over one generic call that dispatches through cached Dispatchers.
#include "xpuruntime/ops.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "xpuruntime/exceptions.h"

namespace xpuruntime::ops {

namespace {

struct State {
  std::mutex mutex;
  KernelPolicy kernel_policy;
  ExecutionPolicy exec_policy;
  std::shared_ptr<AutotuneCache> cache;
  std::map<std::string, std::shared_ptr<Dispatcher>> dispatchers;  // by dispatcher_key()
  std::shared_ptr<Dispatcher> default_dispatcher;                   // for the default policies
};

// Identifies a pair of policies, cheaply (this runs on every call): KernelPolicy::str() lists every rule and the
// auto strategy in canonical order, and the ExecutionPolicy fields are few.
std::string dispatcher_key(const KernelPolicy& kernel_policy, const ExecutionPolicy& p) {
  return detail::str_cat(kernel_policy.str(), "|", precision_name(p.precision), p.deterministic ? "d" : "-",
                         p.cuda_graphs ? "g" : "-", p.static_shape ? "s" : "-", p.workspace_limit, ",",
                         p.memory_limit, ",", p.intra_op_threads, p.allow_spinning ? "" : "-");
}

State& state() {
  static State* s = [] {
    auto* created = new State();  // never destroyed: usable from other static destructors
    const char* path = std::getenv("XPURT_AUTOTUNE_CACHE");
    created->cache = path && *path ? std::make_shared<AutotuneCache>(path) : std::make_shared<AutotuneCache>();
    return created;
  }();
  return *s;
}

}  // namespace

std::shared_ptr<Dispatcher> dispatcher_for(const KernelPolicy& kernel_policy, const ExecutionPolicy& exec_policy) {
  State& s = state();
  const std::string key = dispatcher_key(kernel_policy, exec_policy);
  std::lock_guard<std::mutex> lock(s.mutex);
  auto& slot = s.dispatchers[key];
  if (!slot) slot = std::make_shared<Dispatcher>(kernel_policy, exec_policy, s.cache);
  return slot;
}

void set_default_policies(const KernelPolicy& kernel_policy, const ExecutionPolicy& exec_policy) {
  kernel_policy.validate(KernelRegistry::global());
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.kernel_policy = kernel_policy;
  s.exec_policy = exec_policy;
  s.default_dispatcher.reset();
}

KernelPolicy default_kernel_policy() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.kernel_policy;
}

ExecutionPolicy default_exec_policy() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.exec_policy;
}

void set_autotune_cache(std::shared_ptr<AutotuneCache> cache) {
  XPURT_CHECK(cache != nullptr, "set_autotune_cache: the cache must not be null");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.cache = std::move(cache);
  s.dispatchers.clear();  // dispatchers hold the cache they were made with
  s.default_dispatcher.reset();
}

std::shared_ptr<AutotuneCache> autotune_cache() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.cache;
}

namespace {

std::shared_ptr<Dispatcher> dispatcher_of(const CallOptions& options) {
  std::shared_ptr<Dispatcher> dispatcher;
  if (options.kernel_policy == nullptr && options.exec_policy == nullptr) {
    State& s = state();
    std::unique_lock<std::mutex> lock(s.mutex);
    dispatcher = s.default_dispatcher;
    if (!dispatcher) {
      const KernelPolicy kp = s.kernel_policy;
      const ExecutionPolicy ep = s.exec_policy;
      lock.unlock();
      dispatcher = dispatcher_for(kp, ep);
      lock.lock();
      s.default_dispatcher = dispatcher;
    }
  } else {
    dispatcher = dispatcher_for(options.kernel_policy ? *options.kernel_policy : default_kernel_policy(),
                                options.exec_policy ? *options.exec_policy : default_exec_policy());
  }
  return dispatcher;
}

// Kernels take contiguous inputs (the descriptor records the layout they get).
std::vector<Tensor> contiguous_inputs(const std::string& op, const std::vector<Tensor>& inputs) {
  XPURT_CHECK(!inputs.empty() && inputs[0].defined(), "op '", op, "': the first input is required");
  std::vector<Tensor> contiguous;
  contiguous.reserve(inputs.size());
  for (const auto& input : inputs) contiguous.push_back(input.defined() ? input.contiguous() : Tensor());
  return contiguous;
}

}  // namespace

std::vector<Tensor> call(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                         const CallOptions& options) {
  const std::vector<Tensor> contiguous = contiguous_inputs(op, inputs);
  const std::shared_ptr<Dispatcher> dispatcher = dispatcher_of(options);
  if (options.outputs == nullptr) {
    XPURT_CHECK(options.workspace == nullptr, "op '", op,
                "': a caller-allocated workspace needs caller-allocated outputs");
    return dispatcher->run(op, contiguous, attrs, options.stream, options.decision);
  }
  dispatcher->run_into(op, contiguous, attrs, *options.outputs, options.stream, options.decision, options.workspace);
  return *options.outputs;
}

CallPlan plan(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
              const CallOptions& options) {
  const std::vector<Tensor> contiguous = contiguous_inputs(op, inputs);
  const std::shared_ptr<Dispatcher> dispatcher = dispatcher_of(options);
  OpDescriptor desc = make_op_descriptor(op, contiguous, attrs, dispatcher->exec_policy());
  const std::shared_ptr<const Dispatch> dispatch = dispatcher->select(desc);
  CallPlan out;
  out.decision = dispatch->decision;
  out.outputs = desc.outputs;
  out.workspace_bytes = dispatch->plan ? dispatch->plan->workspace_bytes() : 0;
  return out;
}

PreparedCall::PreparedCall(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                           const CallOptions& options) {
  const std::vector<Tensor> contiguous = contiguous_inputs(op, inputs);
  const std::shared_ptr<Dispatcher> dispatcher = dispatcher_of(options);
  desc_ = make_op_descriptor(op, contiguous, attrs, dispatcher->exec_policy());
  dispatch_ = dispatcher->select(desc_);
  workspace_bytes_ = dispatch_->plan ? dispatch_->plan->workspace_bytes() : 0;
}

const Decision& PreparedCall::decision() const { return dispatch_->decision; }

namespace {
// Whether a prepared call of `desc` may be given `num_inputs` inputs: all of them, or fewer where the ones left out
// are trailing optional inputs it was prepared without (linear's residual for the callers that pass x, weight and
// bias).
bool input_count_fits(const OpDescriptor& desc, std::size_t num_inputs) {
  if (num_inputs > desc.inputs.size()) return false;
  for (std::size_t k = num_inputs; k < desc.inputs.size(); ++k) {
    if (desc.inputs[k].present) return false;
  }
  return true;
}
}  // namespace

bool PreparedCall::accepts(const void* const* inputs, std::size_t num_inputs) const {
  if (!input_count_fits(desc_, num_inputs)) return false;
  for (std::size_t k = 0; k < num_inputs; ++k) {
    const TensorDesc& want = desc_.inputs[k];
    if ((inputs[k] != nullptr) != want.present) return false;
    // Kernels ask for at most 16-byte alignment (cuBLASLt, flash_v2, cuDNN): a plan prepared on better-aligned
    // memory runs on any 16-byte aligned memory.
    const std::uint32_t needed = std::min<std::uint32_t>(want.alignment, 16);
    if (want.present && want.numel() > 0 && TensorDesc::alignment_of(inputs[k]) < needed) return false;
  }
  return true;
}

void PreparedCall::launch(const void* const* inputs, std::size_t num_inputs, void* const* outputs,
                          std::size_t num_outputs, void* workspace, std::size_t workspace_bytes,
                          const StreamView& stream) const {
  XPURT_CHECK(input_count_fits(desc_, num_inputs) && num_outputs == desc_.outputs.size(), "op '", desc_.op, "': the prepared call takes ", desc_.inputs.size(), " input(s) and ",
              desc_.outputs.size(), " output(s), but got ", num_inputs, " and ", num_outputs);
  XPURT_CHECK(accepts(inputs, num_inputs), "op '", desc_.op, "': the inputs' addresses do not match the prepared "
              "call (an input that was absent is given or the reverse, or one is less aligned than when prepared)");
  XPURT_CHECK(workspace_bytes >= workspace_bytes_ && (workspace_bytes_ == 0 || workspace != nullptr), "op '",
              desc_.op, "': the prepared call needs a workspace of ", workspace_bytes_, " bytes, but got ",
              workspace_bytes);
  std::vector<Tensor> in(desc_.inputs.size());  // the left-out trailing inputs stay absent
  for (std::size_t k = 0; k < num_inputs; ++k) {
    const TensorDesc& d = desc_.inputs[k];
    if (d.present) {
      in[k] = Tensor::from_blob(const_cast<void*>(inputs[k]), d.shape, {}, d.dtype, desc_.device, nullptr);
    }
  }
  std::vector<Tensor> out(num_outputs);
  for (std::size_t k = 0; k < num_outputs; ++k) {
    const TensorDesc& d = desc_.outputs[k];
    XPURT_CHECK(outputs[k] != nullptr || d.numel() == 0, "op '", desc_.op, "': output ", k, " is null");
    out[k] = Tensor::from_blob(outputs[k], d.shape, {}, d.dtype, desc_.device, nullptr);
  }
  Tensor workspace_tensor;
  if (workspace != nullptr && workspace_bytes > 0) {
    workspace_tensor = Tensor::from_blob(workspace, {static_cast<std::int64_t>(workspace_bytes)}, {}, DType::kUInt8,
                                         desc_.device, nullptr);
  }
  dispatch_->plan->execute(desc_, in, out, stream, workspace_tensor.defined() ? &workspace_tensor : nullptr);
}

std::vector<CandidateReport> candidates(const std::string& op, const std::vector<Tensor>& inputs,
                                        const Attributes& attrs, const CallOptions& options) {
  const std::vector<Tensor> contiguous = contiguous_inputs(op, inputs);
  const std::shared_ptr<Dispatcher> dispatcher = dispatcher_of(options);
  OpDescriptor desc = make_op_descriptor(op, contiguous, attrs, dispatcher->exec_policy());
  return dispatcher->candidates(desc);
}

namespace {
Tensor single(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
              const CallOptions& options) {
  return call(op, inputs, attrs, options).at(0);
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, const CallOptions& options) {
  return single("matmul", {a, b}, {}, options);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::string& activation,
              const CallOptions& options) {
  return single("linear", {x, weight, bias}, Attributes().set("activation", activation), options);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const std::vector<std::int64_t>& strides,
              const std::vector<std::int64_t>& pads, const std::vector<std::int64_t>& dilations, std::int64_t groups,
              const std::string& activation, const CallOptions& options) {
  Attributes attrs;
  attrs.set("strides", strides).set("pads", pads).set("dilations", dilations).set("groups", groups);
  attrs.set("activation", activation);
  return single("conv2d", {x, weight, bias}, attrs, options);
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal, double scale,
                 const CallOptions& options) {
  Attributes attrs;
  attrs.set("causal", static_cast<std::int64_t>(causal ? 1 : 0)).set("scale", scale);
  return single("attention", {q, k, v, mask}, attrs, options);
}

Tensor softmax(const Tensor& x, std::int64_t axis, const CallOptions& options) {
  return single("softmax", {x}, Attributes().set("axis", axis), options);
}

Tensor layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, std::int64_t axis, double epsilon,
                  const CallOptions& options) {
  return single("layer_norm", {x, scale, bias}, Attributes().set("axis", axis).set("epsilon", epsilon), options);
}

Tensor gelu(const Tensor& x, const std::string& approximate, const CallOptions& options) {
  return single("gelu", {x}, Attributes().set("approximate", approximate), options);
}

Tensor add(const Tensor& a, const Tensor& b, const CallOptions& options) { return single("add", {a, b}, {}, options); }
Tensor mul(const Tensor& a, const Tensor& b, const CallOptions& options) { return single("mul", {a, b}, {}, options); }
Tensor relu(const Tensor& x, const CallOptions& options) { return single("relu", {x}, {}, options); }

Tensor cast(const Tensor& x, DType dtype, const CallOptions& options) {
  return single("cast", {x}, Attributes().set("to", std::string(dtype_name(dtype))), options);
}

extern "C" int xpurt_prepared_call_launch(const void* call, const void* const* inputs, std::size_t num_inputs,
                                          void* const* outputs, std::size_t num_outputs, void* workspace,
                                          std::size_t workspace_bytes, void* stream, char* message,
                                          std::size_t message_size) noexcept {
  const auto fail = [&](ErrorCode code, const char* what) {
    if (message != nullptr && message_size > 0) {
      std::snprintf(message, message_size, "%s", what);
    }
    return static_cast<int>(code) + 1;
  };
  try {
    const auto* prepared = static_cast<const PreparedCall*>(call);
    const Device device = prepared->descriptor().device;
    const StreamView view = device.is_cpu() ? StreamView() : StreamView(device, stream);
    prepared->launch(inputs, num_inputs, outputs, num_outputs, workspace, workspace_bytes, view);
    return 0;
  } catch (const XpuRuntimeError& e) {
    return fail(e.code(), e.what());
  } catch (const std::exception& e) {
    return fail(ErrorCode::kInternal, e.what());
  } catch (...) {
    return fail(ErrorCode::kInternal, "unknown error");
  }
}

}  // namespace xpuruntime::ops
