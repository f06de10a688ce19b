// cuBLAS / cuBLASLt plumbing shared by the cublas and cublasLt backends: the check macros, the RAII handle
// owners, the per-(thread, device) handle pool, and the row-major GEMM helpers both backends use. It lives in core,
// like cuda_utils.h (the CUDA runtime's plumbing), because a backend includes only core and itself
// (docs/architecture.md, "Layering rules"); compiled into the core in CUDA builds (src/cpp/CMakeLists.txt).
//
// Ownership: CublasHandle / CublasLtHandle own one library handle each (move-only). The handles returned by
// `thread_cublas_handle` / `thread_cublaslt_handle` belong to the pool: valid for the calling thread until it
// exits, never to be destroyed by the caller. Thread-safety: a pooled handle is used by one thread at a time
// (see Note [cuBLAS handle pool]); the pool itself is internally locked.
//
// Internal header: only compiled with XPURT_WITH_CUDA; never included by public headers.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_utils.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::cublas {

// Throws for a failed cuBLAS or cuBLASLt call (`library` names which): OutOfMemoryError for
// CUBLAS_STATUS_ALLOC_FAILED, UnsupportedOperationError for NOT_SUPPORTED / ARCH_MISMATCH, CudaError
// otherwise. The message is built by detail::format_library_error.
[[noreturn]] void throw_cublas_error(const char* library, cublasStatus_t status, const char* call, const char* file,
                                     int line);

// "CUBLAS_STATUS_NOT_SUPPORTED" etc. (cublasGetStatusName, with a fallback for unknown codes).
const char* status_name(cublasStatus_t status);

// Owns one cublasHandle_t, created on a given device with the math mode of Note [cuBLAS math mode].
class CublasHandle {
 public:
  CublasHandle() = default;
  // Creates a handle on `device` (made current for the call). Throws on failure.
  static CublasHandle create(int device);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;  // destroys the handle held before

  cublasHandle_t get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  explicit CublasHandle(cublasHandle_t handle) : handle_(handle) {}
  cublasHandle_t handle_ = nullptr;
};

// Owns one cublasLtHandle_t.
class CublasLtHandle {
 public:
  CublasLtHandle() = default;
  static CublasLtHandle create(int device);
  ~CublasLtHandle();
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  CublasLtHandle(CublasLtHandle&& other) noexcept;
  CublasLtHandle& operator=(CublasLtHandle&& other) noexcept;

  cublasLtHandle_t get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  explicit CublasLtHandle(cublasLtHandle_t handle) : handle_(handle) {}
  cublasLtHandle_t handle_ = nullptr;
};

// The calling thread's cuBLAS handle for `device`, created (or taken from the pool) on first use, and bound
// to `stream`. Every call rebinds the stream, which also resets cuBLAS's workspace to its default pool: set
// the launch's workspace afterwards (`bind_workspace`).
cublasHandle_t thread_cublas_handle(int device, cudaStream_t stream);
// The calling thread's cuBLASLt handle for `device` (cuBLASLt takes the stream per call).
cublasLtHandle_t thread_cublaslt_handle(int device);

// Makes cuBLAS use `bytes` bytes at `workspace` (a launch's workspace; may be null / 0: no workspace). The
// pointer is rounded up to the 256 bytes cuBLAS requires; the bytes lost to the rounding are subtracted.
void bind_workspace(cublasHandle_t handle, void* workspace, std::size_t bytes);

// The cuBLAS workspace a plan asks for: the library's recommendation (32 MiB on Hopper and newer, 4 MiB
// before) capped by `policy.workspace_limit` (0 = no cap).
std::size_t default_cublas_workspace(int compute_capability, std::uint64_t workspace_limit);

// `pointer` rounded up to a multiple of `alignment` (a power of two).
void* align_up(void* pointer, std::size_t alignment);
std::size_t round_up(std::size_t value, std::size_t alignment);

// ---- the GEMM description both backends share ----

// cudaDataType of a float dtype (float32, float16, bfloat16). Internal error for any other.
cudaDataType_t cuda_data_type(DType dtype);
// The compute type for `dtype` under `precision`: CUBLAS_COMPUTE_32F, except float32 under tf32 (or a
// reduced-precision policy) -> CUBLAS_COMPUTE_32F_FAST_TF32. See Note [GEMM compute types].
cublasComputeType_t compute_type(DType dtype, Precision precision);
const char* compute_type_name(cublasComputeType_t type);  // "32F", "32F_FAST_TF32"

// What every GEMM-based kernel of these backends declares (Note [Kernel declarations] in core/kernel_registry.cpp):
// no int8 precision, and contiguous float32/float16/bfloat16 inputs, named in reasons as `op` names them
// (input_name). `what` names the kernel in reasons ("cublas", "cublasLt", "unfused attention").
KernelDecl gemm_declaration(const std::string& op, const std::string& what);

// What that declaration cannot say, which every such kernel's accepts() asks first: the op runs on a CUDA device
// (its inputs' devices are not asked), and a bfloat16 input 0 needs compute capability 8.0 or newer (an unknown
// capability passes). Yes, or the reason why not, naming the kernel as `what`.
Support check_gemm_device(const OpDescriptor& desc, const char* what);

// One row-major GEMM problem C[batch][M, N] = op(A)[batch][M, K] @ op(B)[batch][K, N], described in the
// column-major terms cuBLAS takes. See Note [Row-major GEMM through column-major cuBLAS].
//
// The first cuBLAS operand ("lhs", m x k column-major) is our right operand, the second ("rhs", k x n) our
// left one: m = N, n = M. `outer_*` describe extra batch dims that one strided-batch call cannot express; they
// are looped over on the host (see Note [Broadcast batch dims]).
struct GemmShape {
  std::int64_t m = 0;  // rows of the column-major result = N of the row-major one
  std::int64_t n = 0;  // columns of the column-major result = M
  std::int64_t k = 0;
  bool transpose_lhs = false;  // the row-major right operand is given as [N, K] (linear's "nk" weight)
  bool transpose_rhs = false;  // the row-major left operand is given transposed (linear_grad_weight's grad)
  std::int64_t ld_lhs = 0;
  std::int64_t ld_rhs = 0;
  std::int64_t ld_out = 0;
  // One strided batch: `batch` GEMMs, operand i at base + i * stride (0 = the same matrix for all).
  std::int64_t batch = 1;
  std::int64_t stride_lhs = 0;
  std::int64_t stride_rhs = 0;
  std::int64_t stride_out = 0;
  // Host loop over the remaining batch dims: `outer_offsets_*[j]` is the element offset of the j-th launch.
  std::vector<std::int64_t> outer_offsets_lhs = {0};
  std::vector<std::int64_t> outer_offsets_rhs = {0};
  std::vector<std::int64_t> outer_offsets_out = {0};

  bool empty() const { return m == 0 || n == 0 || batch == 0 || outer_offsets_out.empty(); }
  std::size_t launches() const { return outer_offsets_out.size(); }
};

// The GEMM of `matmul` (inputs a[..., M, K], b[..., K, N], contiguous). Batch dims broadcast; a batched `a`
// against an unbatched `b` is folded into one [batch * M, K] GEMM.
GemmShape matmul_shape(const OpDescriptor& desc);
// The GEMM of `linear` (x[..., K] flattened to [M, K]; weight [N, K] ("nk") or [K, N] ("kn")).
GemmShape linear_shape(const OpDescriptor& desc);
// The GEMM of `linear_grad_weight` (inputs grad[..., N], x[..., K], contiguous): grad_weight[N, K] = grad^T @ x over
// the flattened leading dims (M). Read column-major it is grad_weight^T[K, N] = x^T[K, M] @ grad[M, N]: cuBLAS's
// first operand is x as stored, its second grad transposed (op = T, transpose_rhs); m = K, n = N, k = M.
GemmShape linear_grad_weight_shape(const OpDescriptor& desc);

// How many host-side launches `matmul_shape(desc)` needs, without building its offsets (for supports()).
std::int64_t matmul_outer_launches(const OpDescriptor& desc);
// Yes when every size and leading dimension fits the 32-bit ints of the cuBLAS (not _64) API.
Support check_int32(const GemmShape& shape, const char* what);

// Runs `shape` on `handle` (bound to the stream and workspace already): out = alpha * lhs-op @ rhs, beta = 0,
// one cublasGemmEx or cublasGemmStridedBatchedEx per outer launch. Needs shape.k > 0.
void gemm(cublasHandle_t handle, const GemmShape& shape, DType dtype, cublasComputeType_t compute, const void* lhs,
          const void* rhs, void* out, float alpha = 1.0f);

// "[2,3]" for messages.
std::string shape_str(const std::vector<std::int64_t>& shape);
// The schema name of input `index` of `op` ("a", "weight", "mask", ...) for messages.
const char* input_name(const std::string& op, std::size_t index);
bool is_aligned(const void* pointer, std::size_t alignment);

}  // namespace xpuruntime::cublas

#define XPURT_CUBLAS_CHECK(expr)                                                                           \
  do {                                                                                                     \
    const cublasStatus_t xpurt_cublas_status_ = (expr);                                                    \
    if (xpurt_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      ::xpuruntime::cublas::throw_cublas_error("cuBLAS", xpurt_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                                      \
  } while (0)

// cuBLASLt reports with the cuBLAS status type; this variant names the library in the message.
#define XPURT_CUBLASLT_CHECK(expr)                                                                           \
  do {                                                                                                       \
    const cublasStatus_t xpurt_cublas_status_ = (expr);                                                      \
    if (xpurt_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      ::xpuruntime::cublas::throw_cublas_error("cuBLASLt", xpurt_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                                        \
  } while (0)
