// Internal helpers of the cudnn backend: the cuDNN check macro, RAII owners of cuDNN handles and descriptors, the
// per-(thread, device) handle pool, the declaration every cudnn kernel makes and the checks its accepts() shares.
//
// Ownership: each owner below holds exactly one cuDNN object, destroys it in its destructor, and is movable but
// not copyable. Handles come from `thread_handle` and are never destroyed by callers (see Note [cuDNN handle
// pool]). Thread-safety: descriptors are written only while a plan is built and are read-only afterwards, so one
// plan may run on several threads at once; a handle is used by one thread only.
#pragma once

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_utils.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::detail {

// Throws for a failed cuDNN call: UnsupportedOperationError for the CUDNN_STATUS_NOT_SUPPORTED family,
// OutOfMemoryError for allocation failures, CudaError otherwise. The message (detail::format_library_error)
// carries the status name and code, the call, the device, file:line and cuDNN's own last error text.
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line);

}  // namespace xpuruntime::detail

#define XPURT_CUDNN_CHECK(expr)                                                         \
  do {                                                                                  \
    const cudnnStatus_t xpurt_cudnn_status_ = (expr);                                   \
    if (xpurt_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                  \
      ::xpuruntime::detail::throw_cudnn_error(xpurt_cudnn_status_, #expr, __FILE__, __LINE__); \
    }                                                                                   \
  } while (0)

namespace xpuruntime::cudnn {

// ---- RAII owners ----

// Owns one cudnnHandle_t, created on `device`.
class Handle {
 public:
  Handle() = default;
  static Handle create(int device);
  Handle(Handle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  cudnnHandle_t get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }
  void reset() noexcept;  // destroys now; a failure is reported to stderr (destructor path)

 private:
  explicit Handle(cudnnHandle_t handle) : handle_(handle) {}
  cudnnHandle_t handle_ = nullptr;
};

// Owns one cuDNN descriptor of the kind `Traits` names (`type`, `create`, `destroy`, `name`).
template <typename Traits>
class Descriptor {
 public:
  using Type = typename Traits::Type;
  Descriptor() { XPURT_CUDNN_CHECK(Traits::create(&descriptor_)); }
  Descriptor(Descriptor&& other) noexcept : descriptor_(std::exchange(other.descriptor_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    if (this != &other) {
      release();
      descriptor_ = std::exchange(other.descriptor_, nullptr);
    }
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { release(); }

  Type get() const { return descriptor_; }

 private:
  void release() noexcept {
    if (descriptor_ != nullptr) Traits::destroy(descriptor_);  // destroying a descriptor cannot fail usefully
    descriptor_ = nullptr;
  }
  Type descriptor_ = nullptr;
};

struct TensorTraits {
  using Type = cudnnTensorDescriptor_t;
  static cudnnStatus_t create(Type* d) { return cudnnCreateTensorDescriptor(d); }
  static cudnnStatus_t destroy(Type d) { return cudnnDestroyTensorDescriptor(d); }
};
struct FilterTraits {
  using Type = cudnnFilterDescriptor_t;
  static cudnnStatus_t create(Type* d) { return cudnnCreateFilterDescriptor(d); }
  static cudnnStatus_t destroy(Type d) { return cudnnDestroyFilterDescriptor(d); }
};
struct ConvolutionTraits {
  using Type = cudnnConvolutionDescriptor_t;
  static cudnnStatus_t create(Type* d) { return cudnnCreateConvolutionDescriptor(d); }
  static cudnnStatus_t destroy(Type d) { return cudnnDestroyConvolutionDescriptor(d); }
};
struct PoolingTraits {
  using Type = cudnnPoolingDescriptor_t;
  static cudnnStatus_t create(Type* d) { return cudnnCreatePoolingDescriptor(d); }
  static cudnnStatus_t destroy(Type d) { return cudnnDestroyPoolingDescriptor(d); }
};
struct ActivationTraits {
  using Type = cudnnActivationDescriptor_t;
  static cudnnStatus_t create(Type* d) { return cudnnCreateActivationDescriptor(d); }
  static cudnnStatus_t destroy(Type d) { return cudnnDestroyActivationDescriptor(d); }
};

using TensorDescriptor = Descriptor<TensorTraits>;
using FilterDescriptor = Descriptor<FilterTraits>;
using ConvolutionDescriptor = Descriptor<ConvolutionTraits>;
using PoolingDescriptor = Descriptor<PoolingTraits>;
using ActivationDescriptor = Descriptor<ActivationTraits>;

// ---- handles ----

// Note [cuDNN handle pool]
// cudnnCreate is expensive (milliseconds: it loads kernels) and a handle must not be used by two threads at
// once, so handles are kept per (thread, device) by detail::thread_handle (Note [Per-thread handle pools]).

// The calling thread's cuDNN handle for CUDA device `device` (created on first use; the caller need not make
// `device` current), bound to `stream` (nullptr: the legacy default stream) for the calls that follow.
cudnnHandle_t thread_handle(int device, cudaStream_t stream);

// ---- types and formatting ----

// cuDNN's data type for a tensor of `dtype` (float32, float16 or bfloat16).
cudnnDataType_t data_type(DType dtype);
// "CUDNN_STATUS_BAD_PARAM" etc.
const char* status_name(cudnnStatus_t status);
// cudnnGetVersion() of the library loaded at run time, e.g. 91400.
std::size_t runtime_version();
// "0 B", "512 B", "1.5 KiB", "1.2 MiB", "3.0 GiB".
std::string format_bytes(std::size_t bytes);
// "[1, 2, 3]".
std::string format_ints(const std::vector<std::int64_t>& values);

// Sets `descriptor` to a packed NCHW tensor of `dtype`.
void set_nchw(const TensorDescriptor& descriptor, DType dtype, std::int64_t n, std::int64_t c, std::int64_t h,
              std::int64_t w);
// The same dims (n, c, h, w are logical) in channels-last memory order when `nhwc` (CUDNN_TENSOR_NHWC).
void set_4d(const TensorDescriptor& descriptor, DType dtype, bool nhwc, std::int64_t n, std::int64_t c, std::int64_t h,
            std::int64_t w);

// ---- what every cudnn kernel takes ----

// What every cudnn kernel declares (Note [Kernel declarations] in core/kernel_registry.cpp): the op and every
// present input on a CUDA device, no int8 precision, and contiguous float32/float16/bfloat16 inputs aligned to
// `alignment` bytes (0: to their element size; see Note [cuDNN data alignment]). `subject` names the kernel in
// reasons ("cudnn conv2d"); inputs are named by index ("input 1").
KernelDecl declaration(const std::string& subject, std::uint32_t alignment = 0);

// What the declaration cannot say, which every cudnn kernel's accepts() asks first: bfloat16 inputs only on sm80+
// (an unknown compute capability refuses them too), and every tensor (inputs and outputs) within cuDNN's 32-bit
// indexing. `op_label` names the kernel as its declaration's subject does.
Support check_limits(const OpDescriptor& desc, const char* op_label);

// Note [cuDNN data alignment]
// cuDNN picks a convolution kernel from the descriptors alone, never from the data pointers, and its tensor-core
// kernels load 16 bytes at a time: on an H200 (cuDNN 9.19) a float16/bfloat16 conv through
// IMPLICIT_PRECOMP_GEMM fails with CUDNN_STATUS_EXECUTION_FAILED_CUDART (a misaligned-address fault that
// poisons the CUDA context) when x starts 2, 4 or 8 bytes into an allocation, and works from 16 bytes on. So
// conv2d requires 16-byte aligned inputs for every dtype (TF32 kernels load the same way). Pooling and batch
// norm ran correctly at element-size alignment for every dtype and need no more.
constexpr std::uint32_t kConvAlignment = 16;

// The workspace a plan may take under `policy`: its limit, or `kDefaultWorkspaceLimit` when that is 0.
constexpr std::size_t kDefaultWorkspaceLimit = std::size_t{256} << 20;
std::size_t workspace_limit(const ExecutionPolicy& policy);

// The plan of an op whose output is empty (a batch of 0, or 0 channels): nothing to compute, and cuDNN
// rejects descriptors with a zero dimension, so no cuDNN object is made.
class EmptyPlan final : public KernelPlan {
 public:
  void run(const KernelLaunch&) const override {}
  std::string describe() const override { return "cudnn: empty output, nothing to compute"; }
};

// Host scalars cuDNN blends with (`alpha` and `beta` are float for every data type but double).
inline constexpr float kOne = 1.0f;
inline constexpr float kZero = 0.0f;

}  // namespace xpuruntime::cudnn

namespace xpuruntime {
// Registration helpers, one per source file of this backend (called by register_cudnn).
void register_cudnn_conv(KernelRegistry& registry);
void register_cudnn_pool(KernelRegistry& registry);
void register_cudnn_batch_norm(KernelRegistry& registry);
void register_cudnn_conv_transpose(KernelRegistry& registry);
void register_cudnn_conv3d(KernelRegistry& registry);  // conv3d, conv_transpose3d
void register_cudnn_qconv(KernelRegistry& registry);   // qconv2d (cudnn_qconv.cpp)
}  // namespace xpuruntime
