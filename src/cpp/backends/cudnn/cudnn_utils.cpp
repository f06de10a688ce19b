#include "cudnn_utils.h"

#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>

#include "core/thread_handle_pool.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::detail {

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  char last_error[512] = {0};
  cudnnGetLastErrorString(last_error, sizeof(last_error));
  std::string hint = last_error;
  const int code = static_cast<int>(status);
  if (status == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED) {
    if (!hint.empty()) hint += "; ";
    hint += "libcudnn.so found but not its sub-libraries (libcudnn_cnn.so.9, libcudnn_ops.so.9): add their folder "
            "to LD_LIBRARY_PATH";
  }
  const std::string message = format_library_error("cuDNN", cudnn::status_name(status), code, call, device, file,
                                                   line, hint);
  // Note: the categories are the thousands of the status code (cudnn_graph.h): 3xxx not supported, 4003/4004
  // host/device allocation failed.
  if (code / 1000 == 3) throw UnsupportedOperationError(message);
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    throw OutOfMemoryError(message);
  }
  throw CudaError(message);
}

}  // namespace xpuruntime::detail

namespace xpuruntime::cudnn {

// ---- Handle ----

Handle Handle::create(int device) {
  detail::CudaDeviceGuard guard(device);
  cudnnHandle_t handle = nullptr;
  XPURT_CUDNN_CHECK(cudnnCreate(&handle));
  return Handle(handle);
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void Handle::reset() noexcept {
  if (handle_ == nullptr) return;
  const cudnnStatus_t status = cudnnDestroy(handle_);
  if (status != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "xpuruntime: cudnnDestroy failed: %s\n", status_name(status));
  }
  handle_ = nullptr;
}

// ---- per-thread handles (Note [cuDNN handle pool]) ----

cudnnHandle_t thread_handle(int device, cudaStream_t stream) {
  XPURT_INTERNAL_ASSERT(device >= 0, "a cuDNN handle needs a CUDA device index, got ", device);
  cudnnHandle_t handle = detail::thread_handle<Handle>(device).get();
  XPURT_CUDNN_CHECK(cudnnSetStream(handle, stream));
  return handle;
}

// ---- types and formatting ----

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return CUDNN_DATA_FLOAT;
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  XPURT_INTERNAL_ASSERT(false, "no cuDNN data type for ", dtype_name(dtype), " (supports() should have said no)");
  return CUDNN_DATA_FLOAT;
}

const char* status_name(cudnnStatus_t status) {
  // cuDNN 9's cudnnGetErrorString returns the enumerator's name ("CUDNN_STATUS_BAD_PARAM").
  return cudnnGetErrorString(status);
}

std::size_t runtime_version() { return cudnnGetVersion(); }

std::string format_bytes(std::size_t bytes) {
  if (bytes < 1024) return detail::str_cat(bytes, " B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", value, units[unit]);
  return text;
}

std::string format_ints(const std::vector<std::int64_t>& values) {
  std::string out = "[";
  for (std::size_t k = 0; k < values.size(); ++k) out += (k ? ", " : "") + std::to_string(values[k]);
  return out + "]";
}

void set_nchw(const TensorDescriptor& descriptor, DType dtype, std::int64_t n, std::int64_t c, std::int64_t h,
              std::int64_t w) {
  set_4d(descriptor, dtype, /*nhwc=*/false, n, c, h, w);
}

void set_4d(const TensorDescriptor& descriptor, DType dtype, bool nhwc, std::int64_t n, std::int64_t c, std::int64_t h,
            std::int64_t w) {
  XPURT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(descriptor.get(), nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                               data_type(dtype),
                                               static_cast<int>(n), static_cast<int>(c), static_cast<int>(h),
                                               static_cast<int>(w)));
}

// ---- what every cudnn kernel takes ----

namespace {

constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();

// Checks one tensor's dimensions and element count against cuDNN's 32-bit indexing.
Support check_int32(const TensorDesc& tensor, const char* what, std::size_t index, const char* op_label) {
  std::int64_t numel = 1;
  for (const auto dim : tensor.shape) {
    if (dim > kMaxInt) {
      return Support::no(detail::str_cat(op_label, " indexes with 32-bit ints: ", what, " ", index, " has shape ",
                                         format_ints(tensor.shape), " with a dimension over 2^31-1"));
    }
    numel *= dim;
    if (numel > kMaxInt) {
      return Support::no(detail::str_cat(op_label, " indexes with 32-bit ints: ", what, " ", index, " ",
                                         format_ints(tensor.shape), " has more than 2^31-1 elements; split the batch"));
    }
  }
  return Support::yes();
}

}  // namespace

KernelDecl declaration(const std::string& subject, std::uint32_t alignment) {
  KernelDecl decl;
  decl.subject = subject;
  decl.on_device = true;
  decl.no_int8 = true;
  decl.dtypes.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};  // "float32, float16 or bfloat16"
  decl.layout = Layout::kContiguous;
  decl.alignment = alignment;
  decl.element_aligned = alignment == 0;
  return decl;
}

Support check_limits(const OpDescriptor& desc, const char* op_label) {
  for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
    const TensorDesc& input = desc.inputs[k];
    if (!input.present) continue;
    if (input.dtype == DType::kBFloat16 && desc.compute_capability < 80) {
      return Support::no(detail::str_cat(op_label, " needs compute capability 8.0+ for bfloat16, the device has ",
                                         desc.compute_capability / 10, ".", desc.compute_capability % 10));
    }
    Support fits = check_int32(input, "input", k, op_label);
    if (!fits) return fits;
  }
  for (std::size_t k = 0; k < desc.outputs.size(); ++k) {
    Support fits = check_int32(desc.outputs[k], "output", k, op_label);
    if (!fits) return fits;
  }
  return Support::yes();
}

std::size_t workspace_limit(const ExecutionPolicy& policy) {
  return policy.workspace_limit == 0 ? kDefaultWorkspaceLimit : static_cast<std::size_t>(policy.workspace_limit);
}

}  // namespace xpuruntime::cudnn
