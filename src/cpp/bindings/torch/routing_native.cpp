// xpuruntime.pytorch's native path: the routing mode's torch-function handler and the routed linear/matmul calls
// with their autograd node, in C++. Built by xpuruntime.pytorch._extension against the user's PyTorch
// (torch.utils.cpp_extension, once per PyTorch version and source), not by CMake: PyTorch's headers and ABI are
// the user's. It never links libxpuruntime: a plan runs through the C function xpurt_prepared_call_launch, whose
// address the Python module hands over with the plan's (PreparedCall.native_entry).
//
// Note [The native path]
// A routing mode written in Python pays a Python call for every torch call made while it is active, and a routed
// call pays the Python work of its call site and of its autograd node; on calls whose GPU work is a few
// microseconds that host time is the step time. Here the mode's handler (`dispatch`) is a C function:
//  - a call of a torch function the mode does not route goes straight to that function;
//  - a routed call looks its call site up by a key computed here (the function, the policy scope, the precision
//    override, grad mode, and each argument: a tensor by dtype, device, shape, strides and requires_grad; None,
//    bools, ints and floats by value; keyword arguments by name and value). A native site (registered by Python
//    the first time the signature ran, the full way) runs: PyTorch-only sites count the call and call PyTorch;
//    xpuruntime sites (linear, matmul, attention) allocate outputs and workspace with PyTorch's allocator and
//    launch the prepared plan on torch's current stream, inside a C++ autograd node when grad is needed;
//  - anything else (no site yet, keyword arguments of linear and matmul, autocast on, a tensor subclass or wrapper,
//    inputs less than 16-byte aligned, routing suspended) goes to the mode's Python handler, which behaves as
//    without this file.
// The backwards run here too once Python has decided their routes (a site's first backward, and every
// create_graph one, run the Python formulas). Linear: grad_x on xpuruntime's plan, grad_w and grad_b on
// xpuruntime's linear_grad_weight plan (one cuBLASLt call that also sums the bias gradient), or, where the linear
// rule's kernel has none, grad_w with PyTorch's GEMM on the forward kernel's BLAS library and grad_b as a sum.
// Attention: PyTorch's FlashAttention backward on the forward's output and log-sum-exp. Calls are counted in
// atomic counters that the Python decision log adds to its records when it is read.
// State: the site table and the handler set are read and written with the GIL held (every dispatch holds it);
// counters and a site's backward plans are published atomically, because backward runs on autograd's threads.
// Cleared sites are kept (an autograd graph built before the clear may still reference them).

#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#ifdef XRT_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace py = pybind11;

namespace xrt_native {

using LaunchFn = int (*)(const void*, const void* const*, std::size_t, void* const*, std::size_t, void*, std::size_t,
                         void*, char*, std::size_t);

// A failed xpuruntime launch: `code` is xpuruntime's ErrorCode plus 1 (what xpurt_prepared_call_launch returns).
struct LaunchError : std::runtime_error {
  LaunchError(int code_, const std::string& message) : std::runtime_error(message), code(code_) {}
  int code;
};

// Calls counted here, added to the Python decision log's record when the log is read.
struct Counter {
  std::atomic<std::int64_t> calls{0};
  std::int64_t take() { return calls.exchange(0, std::memory_order_relaxed); }
  void add() { calls.fetch_add(1, std::memory_order_relaxed); }
};

#ifdef XRT_TORCH_CUDA
// Note [Workspaces per stream] in _routing.py, here for the native path: one workspace per (device, stream) from
// torch's allocator, grown when a plan needs more (a replaced one is kept: a captured graph may replay on its
// address); while the stream captures, a plan that needs more gets a workspace of its own from the graph's pool.
at::Tensor stream_workspace(const at::Device& device, cudaStream_t stream, std::size_t bytes) {
  static std::mutex mutex;
  static auto* cache = new std::unordered_map<std::uint64_t, at::Tensor>();
  static auto* retired = new std::vector<at::Tensor>();
  const at::TensorOptions options = at::TensorOptions().device(device).dtype(at::kByte);
  const std::uint64_t key =
      reinterpret_cast<std::uintptr_t>(stream) ^ (static_cast<std::uint64_t>(device.index()) << 56);
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& slot = (*cache)[key];
  if (slot.defined() && static_cast<std::size_t>(slot.numel()) >= bytes) {
    return slot;
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess) {
    (void)cudaGetLastError();
    capturing = cudaStreamCaptureStatusActive;  // unknown: do not cache
  }
  at::Tensor fresh = at::empty({static_cast<std::int64_t>(bytes)}, options);
  if (capturing != cudaStreamCaptureStatusNone) {
    return fresh;
  }
  if (slot.defined()) {
    retired->push_back(slot);
  }
  slot = fresh;
  return slot;
}
#endif

// One xpuruntime PreparedCall, launched on PyTorch tensors.
struct Plan {
  LaunchFn launch = nullptr;
  const void* call = nullptr;
  py::object keep;  // the PreparedCall: alive as long as this plan
  std::vector<std::vector<std::int64_t>> output_shapes;
  std::vector<at::ScalarType> output_dtypes;
  std::size_t workspace_bytes = 0;

  // Runs the plan on `inputs` (schema order; undefined for an absent optional input), all on `device`.
  std::vector<at::Tensor> run(std::initializer_list<const at::Tensor*> inputs, const at::Device& device) const {
    const void* in[8];
    std::size_t n = 0;
    for (const at::Tensor* t : inputs) {
      in[n++] = (t != nullptr && t->defined()) ? t->data_ptr() : nullptr;
    }
    const at::TensorOptions options = at::TensorOptions().device(device);
    std::vector<at::Tensor> outputs;
    outputs.reserve(output_shapes.size());
    void* out[8];
    for (std::size_t k = 0; k < output_shapes.size(); ++k) {
      outputs.push_back(at::empty(output_shapes[k], options.dtype(output_dtypes[k])));
      out[k] = outputs.back().data_ptr();
    }
    void* stream = nullptr;
    at::Tensor workspace;
#ifdef XRT_TORCH_CUDA
    if (device.is_cuda()) {
      const cudaStream_t cuda_stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
      stream = cuda_stream;
      if (workspace_bytes > 0) {
        workspace = stream_workspace(device, cuda_stream, workspace_bytes);
      }
    }
#endif
    if (workspace_bytes > 0 && !workspace.defined()) {
      workspace = at::empty({static_cast<std::int64_t>(workspace_bytes)}, options.dtype(at::kByte));
    }
    char message[1024] = {0};
    const int rc = launch(call, in, n, out, outputs.size(), workspace.defined() ? workspace.data_ptr() : nullptr,
                          workspace_bytes, stream, message, sizeof(message));
    if (rc != 0) {
      throw LaunchError(rc, message);
    }
    return outputs;
  }
};

std::shared_ptr<Plan> make_plan(const py::object& prepared, const py::list& outputs, std::size_t workspace_bytes) {
  auto plan = std::make_shared<Plan>();
  const py::tuple entry = prepared.attr("native_entry");
  plan->launch = reinterpret_cast<LaunchFn>(entry[0].cast<std::uintptr_t>());
  plan->call = reinterpret_cast<const void*>(entry[1].cast<std::uintptr_t>());
  plan->keep = prepared;
  TORCH_CHECK(outputs.size() <= 8, "xpuruntime native path: a plan with more than 8 outputs");
  for (const py::handle item : outputs) {
    const py::tuple pair = item.cast<py::tuple>();
    plan->output_shapes.push_back(pair[0].cast<std::vector<std::int64_t>>());
    PyObject* dtype = pair[1].ptr();
    TORCH_CHECK(THPDtype_Check(dtype), "xpuruntime native path: expected a torch.dtype");
    plan->output_dtypes.push_back(reinterpret_cast<THPDtype*>(dtype)->scalar_type);
  }
  plan->workspace_bytes = workspace_bytes;
  return plan;
}

enum class SiteKind { kTorch, kLinear, kMatmul, kAttention };

// A routed call signature (Note [The native path]).
struct Site {
  SiteKind kind = SiteKind::kTorch;
  bool grad = false;  // runs inside an autograd node
  std::shared_ptr<Plan> forward;
  std::shared_ptr<Counter> calls = std::make_shared<Counter>();
  // Linear backward, published once Python has decided it.
  std::shared_ptr<Plan> grad_x;
  std::shared_ptr<Counter> grad_x_calls;
  std::atomic<bool> grad_x_ready{false};
  std::shared_ptr<Plan> grad_w;  // linear_grad_weight: grad_w (and the bias gradient when it has 2 outputs)
  int grad_w_blas = -1;  // else PyTorch's BlasBackend value for grad_w's GEMM, -1: leave PyTorch's choice alone
  std::shared_ptr<Counter> grad_w_calls;
  std::atomic<bool> grad_w_ready{false};
  // Attention backward (PyTorch's FlashAttention backward, or its cuDNN attention backward after xpuruntime's cudnn
  // kernel, on the forward's output and log-sum-exp), published once Python has run the first one: the sequence
  // offset and RNG state tensors it takes (unused without dropout), is_causal, scale.
  at::Tensor flash_cum_q, flash_cum_k, flash_seed, flash_offset;
  bool flash_causal = false;
  bool flash_cudnn = false;  // run the cuDNN attention backward instead of FlashAttention's
  c10::optional<double> flash_scale;
  std::shared_ptr<Counter> flash_calls;
  std::atomic<bool> flash_ready{false};
  std::mutex learn;  // serializes the publications below
  // linear: (grad, x, weight, (need_x, need_w, need_b)) -> (grad_x, grad_w, grad_b);
  // attention: (grad, q, k, v, out, lse) -> (grad_q, grad_k, grad_v)
  py::object python_backward;

  // Publishes a backward route once (a later call keeps the first): `set` fills its fields, then `ready` is
  // released to the autograd threads that read them.
  template <typename Set>
  void publish(std::atomic<bool>& ready, Set set) {
    std::lock_guard<std::mutex> lock(learn);
    if (ready.load()) {
      return;
    }
    set();
    ready.store(true, std::memory_order_release);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Module state
// ---------------------------------------------------------------------------------------------------------------

struct KeyHash {
  std::size_t operator()(const std::vector<std::int64_t>& key) const noexcept {
    std::size_t h = key.size();
    for (const std::int64_t v : key) {
      h ^= std::hash<std::int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }
};

struct State {
  std::unordered_set<PyObject*> handled;  // the torch functions the mode routes (references kept in `refs`)
  py::list refs;
  py::object fallback;       // the mode's Python handler: (func, types, args, kwargs) -> result
  py::object error_factory;  // (code, message) -> the xpuruntime exception to raise
  PyObject* parameter_type = nullptr;
  std::unordered_map<std::vector<std::int64_t>, std::shared_ptr<Site>, KeyHash> sites;
  std::vector<std::shared_ptr<Site>> retired;
  // Routed calls by how they went (read by native_status): served natively, or handed to Python because routing
  // was off or suspended, the key could not describe the call, no site had its key, or an input was misaligned.
  std::int64_t served = 0, off = 0, no_key = 0, no_site = 0, misaligned = 0;
  std::int64_t scope = -1;     // the current policy scope's id (-1: routing off)
  std::int64_t precision = 0;  // a token of the precision override (0: none)
};

State& state() {
  static State* s = new State();  // never destroyed: Python objects inside outlive interpreter teardown order
  return *s;
}

thread_local int t_suspended = 0;

// ---------------------------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------------------------

bool is_plain_tensor(PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  return type == reinterpret_cast<PyTypeObject*>(THPVariableClass) ||
         (state().parameter_type != nullptr && type == reinterpret_cast<PyTypeObject*>(state().parameter_type));
}

// Appends the key of one argument; false when the key cannot describe it (the call goes to Python).
bool append_arg(std::vector<std::int64_t>& key, PyObject* arg) {
  if (is_plain_tensor(arg)) {
    const at::Tensor& t = THPVariable_Unpack(arg);
    if (t.layout() != at::kStrided || !t.has_storage()) {
      return false;
    }
    key.push_back(1);
    key.push_back(static_cast<std::int64_t>(t.scalar_type()));
    key.push_back(static_cast<std::int64_t>(t.device().type()));
    key.push_back(t.device().index());
    key.push_back(t.requires_grad());
    key.push_back(t.dim());
    for (const std::int64_t s : t.sizes()) {
      key.push_back(s);
    }
    for (const std::int64_t s : t.strides()) {
      key.push_back(s);
    }
    return true;
  }
  if (arg == Py_None) {
    key.push_back(2);
    return true;
  }
  if (PyBool_Check(arg)) {
    key.push_back(3);
    key.push_back(arg == Py_True);
    return true;
  }
  if (PyLong_CheckExact(arg)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    key.push_back(4);
    key.push_back(v);
    return true;
  }
  if (PyFloat_CheckExact(arg)) {
    const double v = PyFloat_AS_DOUBLE(arg);
    std::int64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    key.push_back(5);
    key.push_back(bits);
    return true;
  }
  return false;
}

bool autocast_on() {
  return !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutocastCUDA) ||
         !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutocastCPU);
}

// Appends a keyword argument's name, exactly: its length and its UTF-8 bytes in 8-byte words.
bool append_name(std::vector<std::int64_t>& key, PyObject* name) {
  Py_ssize_t size = 0;
  const char* text = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &size) : nullptr;
  if (text == nullptr) {
    PyErr_Clear();
    return false;
  }
  key.push_back(size);
  for (Py_ssize_t at = 0; at < size; at += 8) {
    std::int64_t word = 0;
    std::memcpy(&word, text + at, static_cast<std::size_t>(std::min<Py_ssize_t>(8, size - at)));
    key.push_back(word);
  }
  return true;
}

// The call's key, or false (the call goes to Python). Keyword arguments are keyed by name and value after the
// positional ones; only attention sites are registered with any (a linear or matmul call with keyword arguments
// finds no site and goes to Python).
bool make_key(std::vector<std::int64_t>& key, PyObject* func, PyObject* args, PyObject* kwargs) {
  if (!PyTuple_Check(args) || autocast_on()) {
    return false;
  }
  const State& s = state();
  key.clear();
  key.push_back(reinterpret_cast<std::intptr_t>(func));
  key.push_back(s.scope);
  key.push_back(s.precision);
  key.push_back(at::GradMode::is_enabled());
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  key.push_back(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!append_arg(key, PyTuple_GET_ITEM(args, i))) {
      return false;
    }
  }
  if (kwargs != nullptr && kwargs != Py_None) {
    if (!PyDict_Check(kwargs)) {
      return false;
    }
    if (PyDict_GET_SIZE(kwargs) == 0) {
      return true;  // no keyword arguments: keyed like None
    }
    key.push_back(6);
    key.push_back(PyDict_GET_SIZE(kwargs));
    Py_ssize_t position = 0;
    PyObject* name = nullptr;
    PyObject* value = nullptr;
    while (PyDict_Next(kwargs, &position, &name, &value)) {
      if (!append_name(key, name) || !append_arg(key, value)) {
        return false;
      }
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// The routed linear's autograd node
// ---------------------------------------------------------------------------------------------------------------

// PyTorch's preferred BLAS library switched to `backend` for a scope (PyTorch >= 2.3; -1: no switch).
class BlasScope {
 public:
  explicit BlasScope(int backend) {
#if XRT_TORCH_VERSION >= 203
    if (backend >= 0) {
      const auto wanted = static_cast<at::BlasBackend>(backend);
      previous_ = at::globalContext().blasPreferredBackend();
      if (previous_ != wanted) {
        at::globalContext().setBlasPreferredBackend(wanted);
        switched_ = true;
      }
    }
#else
    (void)backend;
#endif
  }
  ~BlasScope() {
#if XRT_TORCH_VERSION >= 203
    if (switched_) {
      at::globalContext().setBlasPreferredBackend(previous_);
    }
#endif
  }
  BlasScope(const BlasScope&) = delete;
  BlasScope& operator=(const BlasScope&) = delete;

 private:
#if XRT_TORCH_VERSION >= 203
  at::BlasBackend previous_ = at::BlasBackend::Cublas;
  bool switched_ = false;
#endif
};

bool aligned(const at::Tensor& t) {
  return !t.defined() || (reinterpret_cast<std::uintptr_t>(t.data_ptr()) & 15) == 0;
}

// `t` contiguous and 16-byte aligned (what xpuruntime's plans were prepared on).
at::Tensor kernel_input(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return aligned(c) ? c : c.clone();
}

struct RoutedLinear : public torch::autograd::Function<RoutedLinear> {
  // `bias` is an optional (not an undefined tensor): autograd records an input edge only for a present one.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, std::int64_t site_address, const at::Tensor& x,
                            const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
    const auto* site = reinterpret_cast<const Site*>(site_address);
    ctx->saved_data["site"] = site_address;
    ctx->saved_data["bias"] = bias.has_value();
    ctx->save_for_backward({x, weight});
    const at::Tensor* b = bias.has_value() ? &*bias : nullptr;
    return site->forward->run({&x, &weight, b}, x.device())[0];
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* site = reinterpret_cast<Site*>(ctx->saved_data["site"].toInt());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& grad = grads[0];
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_w = ctx->needs_input_grad(1);
    const bool need_b = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);
    const bool native = !at::GradMode::is_enabled() && (!need_x || site->grad_x_ready.load(std::memory_order_acquire)) &&
                        (!need_w || site->grad_w_ready.load(std::memory_order_acquire));
    if (!native) {
      py::gil_scoped_acquire gil;
      const py::tuple result = site->python_backward(grad, x, weight, py::make_tuple(need_x, need_w, need_b));
      const auto tensor_or_none = [](const py::handle& h) {
        return h.is_none() ? at::Tensor() : h.cast<at::Tensor>();
      };
      return {at::Tensor(), tensor_or_none(result[0]), tensor_or_none(result[1]), tensor_or_none(result[2])};
    }
    at::Tensor grad_x, grad_w, grad_b;
    const std::int64_t n = weight.size(0);
    const std::int64_t k = weight.size(1);
    const at::Tensor grad_c = kernel_input(grad);
    if (need_x) {
      grad_x = site->grad_x->run({&grad_c, &weight}, grad.device())[0];
      site->grad_x_calls->add();
    }
    if (need_w || need_b) {
      const at::Tensor grad2 = grad_c.dim() == 2 ? grad_c : grad_c.reshape({-1, n});
      const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, k});
      if (need_w && site->grad_w) {
        const at::Tensor x2c = kernel_input(x2);
        std::vector<at::Tensor> outputs = site->grad_w->run({&grad2, &x2c}, grad.device());
        grad_w = std::move(outputs[0]);
        if (need_b && outputs.size() > 1) {
          grad_b = std::move(outputs[1]);  // summed in the same call
        }
        site->grad_w_calls->add();
      } else if (need_w) {
        BlasScope blas(site->grad_w_blas);
        grad_w = at::mm(grad2.t(), x2);
        site->grad_w_calls->add();
      }
      if (need_b && !grad_b.defined()) {
        grad_b = grad2.sum(0);
      }
    }
    return {at::Tensor(), grad_x, grad_w, grad_b};
  }
};

// A routed scaled_dot_product_attention that requires grad: the forward runs the site's plan (flash_v2 or cudnn with
// return_lse: the output and the softmax log-sum-exp), the backward PyTorch's backward of the same family on them
// (FlashAttention's or cuDNN's; no recomputation) once Python has run a first one and published its arguments
// (Note [The native path]).
struct RoutedAttention : public torch::autograd::Function<RoutedAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, std::int64_t site_address, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v) {
    const auto* site = reinterpret_cast<const Site*>(site_address);
    ctx->saved_data["site"] = site_address;
    std::vector<at::Tensor> outputs = site->forward->run({&q, &k, &v, nullptr}, q.device());
    TORCH_CHECK(outputs.size() == 2, "xpuruntime native path: the attention plan must return the log-sum-exp");
    ctx->save_for_backward({q, k, v, outputs[0], outputs[1]});
    return outputs[0];
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* site = reinterpret_cast<Site*>(ctx->saved_data["site"].toInt());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_q, grad_k, grad_v;
#if defined(XRT_TORCH_CUDA) && XRT_TORCH_VERSION >= 203
    if (!at::GradMode::is_enabled() && site->flash_ready.load(std::memory_order_acquire)) {
#if XRT_TORCH_VERSION >= 209
      if (site->flash_cudnn) {
        // cuDNN's stats are [B, H, Sq, 1]: a view of the forward's lse [B, H, Sq].
        std::tie(grad_q, grad_k, grad_v) = at::_scaled_dot_product_cudnn_attention_backward(
            grad, saved[0], saved[1], saved[2], saved[3], saved[4].unsqueeze(-1), site->flash_seed,
            site->flash_offset, at::Tensor(), site->flash_cum_q, site->flash_cum_k, saved[0].size(2),
            saved[1].size(2), 0.0, site->flash_causal, site->flash_scale);
        site->flash_calls->add();
        return {at::Tensor(), grad_q, grad_k, grad_v};
      }
#endif
      std::tie(grad_q, grad_k, grad_v) = at::_scaled_dot_product_flash_attention_backward(
          grad, saved[0], saved[1], saved[2], saved[3], saved[4], site->flash_cum_q, site->flash_cum_k,
          saved[0].size(2), saved[1].size(2), 0.0, site->flash_causal, site->flash_seed, site->flash_offset,
          site->flash_scale);
      site->flash_calls->add();
      return {at::Tensor(), grad_q, grad_k, grad_v};
    }
#endif
    py::gil_scoped_acquire gil;
    const py::tuple result = site->python_backward(grad, saved[0], saved[1], saved[2], saved[3], saved[4]);
    return {at::Tensor(), result[0].cast<at::Tensor>(), result[1].cast<at::Tensor>(), result[2].cast<at::Tensor>()};
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------------------------

// Calls func(*args, **kwargs). A Python error becomes python_error (PyTorch's convention inside HANDLE_TH_ERRORS,
// whose warning handler must see the exception in flight).
PyObject* call_function(PyObject* func, PyObject* args, PyObject* kwargs) {
  const bool has_kwargs = kwargs != nullptr && kwargs != Py_None && PyDict_GET_SIZE(kwargs) != 0;
  PyObject* result = PyObject_Call(func, args, has_kwargs ? kwargs : nullptr);
  if (result == nullptr) {
    throw python_error();
  }
  return result;
}

// Runs a routed site's plan on its tensors (without the GIL): linear (x, weight, bias or undefined), matmul (a, b),
// attention (q, k, v); inside an autograd node when the site requires grad.
at::Tensor launch_site(Site* site, const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  const auto address = reinterpret_cast<std::int64_t>(site);
  switch (site->kind) {
    case SiteKind::kAttention:
      if (site->grad) return RoutedAttention::apply(address, a, b, c);
      return site->forward->run({&a, &b, &c, nullptr}, a.device())[0];
    case SiteKind::kLinear:
      if (site->grad) {
        const c10::optional<at::Tensor> bias = c.defined() ? c10::optional<at::Tensor>(c) : c10::optional<at::Tensor>();
        return RoutedLinear::apply(address, a, b, bias);
      }
      return site->forward->run({&a, &b, &c}, a.device())[0];
    default:
      return site->forward->run({&a, &b}, a.device())[0];
  }
}

PyObject* run_native(PyObject* func, PyObject* args, PyObject* kwargs) {
  State& s = state();
  if (s.scope < 0 || t_suspended > 0) {
    ++s.off;
    return nullptr;
  }
  thread_local std::vector<std::int64_t> key;
  if (!make_key(key, func, args, kwargs)) {
    ++s.no_key;
    return nullptr;
  }
  const auto found = s.sites.find(key);
  if (found == s.sites.end()) {
    ++s.no_site;
    return nullptr;
  }
  Site* site = found->second.get();
  if (site->kind == SiteKind::kTorch) {
    ++s.served;
    site->calls->add();
    return call_function(func, args, kwargs);
  }
  // The site's tensors are its first positional arguments (Python registers no other): a and b, and a third for
  // attention (v) and linear (the bias, possibly None or absent).
  const at::Tensor& a = THPVariable_Unpack(PyTuple_GET_ITEM(args, 0));
  const at::Tensor& b = THPVariable_Unpack(PyTuple_GET_ITEM(args, 1));
  at::Tensor c;
  if (site->kind != SiteKind::kMatmul && PyTuple_GET_SIZE(args) > 2 && PyTuple_GET_ITEM(args, 2) != Py_None) {
    c = THPVariable_Unpack(PyTuple_GET_ITEM(args, 2));
  }
  if (!aligned(a) || !aligned(b) || !aligned(c)) {
    ++s.misaligned;
    return nullptr;  // Python copies such inputs first
  }
  ++s.served;
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;
    out = launch_site(site, a, b, c);
  }
  site->calls->add();
  return THPVariable_Wrap(std::move(out));
}

// The routing mode's __torch_function__(func, types, args=(), kwargs=None).
PyObject* dispatch(PyObject* /*mode*/, PyObject* const* argv, Py_ssize_t nargs, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  PyObject* func = nargs > 0 ? argv[0] : nullptr;
  PyObject* args = nargs > 2 ? argv[2] : nullptr;
  PyObject* kwargs = nargs > 3 ? argv[3] : nullptr;
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
    if (name != nullptr && std::strcmp(name, "args") == 0) {
      args = argv[nargs + i];
    } else if (name != nullptr && std::strcmp(name, "kwargs") == 0) {
      kwargs = argv[nargs + i];
    }
  }
  if (func == nullptr || nargs < 2) {
    throw torch::TypeError("__torch_function__(func, types, args=(), kwargs=None)");
  }
  py::tuple empty;
  if (args == nullptr) {
    args = empty.ptr();
  }
  State& s = state();
  if (s.handled.find(func) == s.handled.end()) {
    return call_function(func, args, kwargs);
  }
  PyObject* result = nullptr;
  try {
    result = run_native(func, args, kwargs);
  } catch (const LaunchError& e) {
    py::object error = s.error_factory(e.code, e.what());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    throw python_error();
  }
  if (result != nullptr) {
    return result;
  }
  if (PyErr_Occurred()) {
    throw python_error();
  }
  py::object none = py::none();
  result = PyObject_CallFunctionObjArgs(s.fallback.ptr(), func, argv[1], args,
                                        kwargs != nullptr ? kwargs : none.ptr(), nullptr);
  if (result == nullptr) {
    throw python_error();
  }
  return result;
  END_HANDLE_TH_ERRORS
}

PyMethodDef dispatch_def = {"dispatch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&dispatch)),
                            METH_FASTCALL | METH_KEYWORDS,
                            "The routing mode's __torch_function__ (Note [The native path] in routing_native.cpp)."};

// ---------------------------------------------------------------------------------------------------------------
// Registration (from Python)
// ---------------------------------------------------------------------------------------------------------------

void register_site(const py::handle& func, const py::tuple& args, const py::object& kwargs,
                   const std::shared_ptr<Site>& site) {
  std::vector<std::int64_t> key;
  if (!make_key(key, func.ptr(), args.ptr(), kwargs.ptr())) {
    throw py::value_error("xpuruntime native path: this call's arguments have no native key");
  }
  state().sites[key] = site;
}

void clear_sites() {
  State& s = state();
  for (auto& entry : s.sites) {
    s.retired.push_back(entry.second);
  }
  s.sites.clear();
}

}  // namespace xrt_native

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace xrt_native;
  m.doc() = "xpuruntime.pytorch's native path (Note [The native path] in src/cpp/bindings/torch/routing_native.cpp)";
  py::class_<Counter, std::shared_ptr<Counter>>(m, "Counter")
      .def(py::init<>())
      .def("take", &Counter::take, "The calls counted since the last take (and reset to 0).")
      .def("__repr__", [](const Counter& c) { return "<Counter " + std::to_string(c.calls.load()) + ">"; });
  py::class_<Plan, std::shared_ptr<Plan>>(m, "Plan")
      .def(py::init(&make_plan), py::arg("prepared"), py::arg("outputs"), py::arg("workspace_bytes"))
      .def("__repr__", [](const Plan& p) { return "<Plan " + py::repr(p.keep).cast<std::string>() + ">"; });
  py::class_<Site, std::shared_ptr<Site>>(m, "Site")
      .def(py::init([](const std::string& kind, const std::shared_ptr<Plan>& forward, bool grad,
                       const std::shared_ptr<Counter>& calls, const py::object& python_backward) {
             auto site = std::make_shared<Site>();
             if (kind == "torch") {
               site->kind = SiteKind::kTorch;
             } else if (kind == "linear") {
               site->kind = SiteKind::kLinear;
             } else if (kind == "matmul") {
               site->kind = SiteKind::kMatmul;
             } else if (kind == "attention") {
               site->kind = SiteKind::kAttention;
             } else {
               throw py::value_error("xpuruntime native path: unknown site kind '" + kind + "'");
             }
             TORCH_CHECK(site->kind == SiteKind::kTorch || forward, "xpuruntime native path: a routed site needs "
                         "a plan");
             TORCH_CHECK(!grad || site->kind == SiteKind::kLinear || site->kind == SiteKind::kAttention,
                         "xpuruntime native path: only linear and attention sites run an autograd node");
             site->forward = forward;
             site->grad = grad;
             site->calls = calls;
             site->python_backward = python_backward;
             return site;
           }),
           py::arg("kind"), py::arg("forward"), py::arg("grad"), py::arg("calls"), py::arg("python_backward"))
      .def(
          "set_grad_x",
          [](Site& site, const std::shared_ptr<Plan>& plan, const std::shared_ptr<Counter>& calls) {
            site.publish(site.grad_x_ready, [&] {
              site.grad_x = plan;
              site.grad_x_calls = calls;
            });
          },
          "grad_x of the linear backward runs `plan` from now on, counted in `calls`.")
      .def(
          "set_grad_w",
          [](Site& site, const std::shared_ptr<Counter>& calls, const std::shared_ptr<Plan>& plan, int blas) {
            site.publish(site.grad_w_ready, [&] {
              site.grad_w = plan;
              site.grad_w_blas = blas;
              site.grad_w_calls = calls;
            });
          },
          py::arg("calls"), py::arg("plan") = nullptr, py::arg("blas") = -1,
          "grad_w of the linear backward from now on, counted in `calls`: `plan` (linear_grad_weight on (grad, x); "
          "it also gives grad_b when it has a second output), or without one PyTorch's GEMM on BLAS backend `blas` "
          "(-1: PyTorch's choice).")
      .def(
          "set_flash_backward",
          [](Site& site, const c10::optional<at::Tensor>& cum_q, const c10::optional<at::Tensor>& cum_k,
             const c10::optional<at::Tensor>& seed, const c10::optional<at::Tensor>& offset, bool is_causal,
             c10::optional<double> scale, const std::shared_ptr<Counter>& calls, bool cudnn) {
            site.publish(site.flash_ready, [&] {
              // PyTorch's flash forward gives None for the sequence offsets of dense inputs: undefined tensors.
              site.flash_cum_q = cum_q.value_or(at::Tensor());
              site.flash_cum_k = cum_k.value_or(at::Tensor());
              site.flash_seed = seed.value_or(at::Tensor());
              site.flash_offset = offset.value_or(at::Tensor());
              site.flash_causal = is_causal;
              site.flash_scale = scale;
              site.flash_calls = calls;
              site.flash_cudnn = cudnn;
            });
          },
          py::arg("cum_q"), py::arg("cum_k"), py::arg("seed"), py::arg("offset"), py::arg("is_causal"),
          py::arg("scale"), py::arg("calls"), py::arg("cudnn") = false,
          "The attention backward runs PyTorch's FlashAttention backward (`cudnn`: its cuDNN attention backward) with "
          "these arguments from now on, counted in `calls` (with CUDA, PyTorch >= 2.3 for FlashAttention's, >= 2.9 "
          "for cuDNN's; else the Python backward keeps running it).")
      .def_property_readonly("backward_ready",
                             [](const Site& s) { return s.grad_x_ready.load() && s.grad_w_ready.load(); });
  m.def(
      "configure",
      [](const py::list& functions, const py::object& fallback, const py::object& error_factory,
         const py::object& parameter_type) {
        State& s = state();
        s.handled.clear();
        s.refs = functions;
        for (const py::handle f : functions) {
          s.handled.insert(f.ptr());
        }
        s.fallback = fallback;
        s.error_factory = error_factory;
        s.parameter_type = parameter_type.ptr();
        s.refs.append(parameter_type);
      },
      py::arg("functions"), py::arg("fallback"), py::arg("error_factory"), py::arg("parameter_type"),
      "The torch functions the mode routes, its Python handler, the xpuruntime error factory, torch.nn.Parameter.");
  m.def(
      "set_state",
      [](std::int64_t scope, std::int64_t precision) {
        state().scope = scope;
        state().precision = precision;
      },
      py::arg("scope"), py::arg("precision"), "The current policy scope's id (-1: off) and precision token.");
  m.def("suspend", [](int delta) { t_suspended += delta; }, py::arg("delta"),
        "Routing suspended on this thread (+1 on entry, -1 on exit).");
  m.def("register_site", &register_site, py::arg("func"), py::arg("args"), py::arg("kwargs"), py::arg("site"),
        "Serve later calls with the key of this call (func, args, kwargs now) from `site`.");
  m.def("clear_sites", &clear_sites, "Forget every site (kept alive for autograd graphs that reference them).");
  m.def(
      "stats",
      []() {
        const State& s = state();
        py::dict d;
        d["sites"] = s.sites.size();
        d["served"] = s.served;
        d["routing_off"] = s.off;
        d["no_key"] = s.no_key;
        d["no_site"] = s.no_site;
        d["misaligned"] = s.misaligned;
        return d;
      },
      "Routed calls by how they went: served natively, or handed to Python (routing off or suspended, arguments "
      "the key cannot describe, no site yet, a misaligned input); and the number of sites.");
  m.def("num_sites", []() { return state().sites.size(); });
  m.def(
      "bind",
      [](const py::object& mode) {
        return py::reinterpret_steal<py::object>(PyCFunction_NewEx(&dispatch_def, mode.ptr(), nullptr));
      },
      py::arg("mode"),
      "`dispatch` bound to the routing mode: PyTorch requires a mode's __torch_function__ to be a method of it "
      "(its __self__ is the mode).");
}
