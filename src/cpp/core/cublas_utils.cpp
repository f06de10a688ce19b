#include "core/cublas_utils.h"
#include "core/shape_str.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/thread_handle_pool.h"

namespace xpuruntime::cublas {

// Note [cuBLAS handle pool]
// cuBLAS and cuBLASLt handles are kept per (thread, device) by detail::thread_handle (Note [Per-thread handle
// pools]) and rebound to the launch stream before each call (`thread_cublas_handle`).
//
// Note [cuBLAS math mode]
// Handles are created with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: with fp16 / bf16 inputs and an
// fp32 compute type cuBLAS may otherwise add split-K partial sums in the 16-bit output type. The contract of
// every GEMM here is "accumulate in fp32" (docs/ops.md), so the reduction must stay in fp32 too.
//
// Note [GEMM compute types]
// fp16 / bf16 inputs use CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulate). fp32 inputs use exact
// CUBLAS_COMPUTE_32F under precision "fp32" and CUBLAS_COMPUTE_32F_FAST_TF32 (TF32 tensor cores, fp32
// accumulate) when the policy allows less: "tf32", and the reduced-precision "fp16" / "bf16" policies (whose
// sessions convert tensors to 16 bits anyway; an fp32 op left under them may use TF32). "int8" is refused in
// supports(): no kernel here has an int8 GEMM.

namespace {

int current_device_or_minus_one() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}

std::vector<std::int64_t> contiguous(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t k = shape.size(); k-- > 1;) strides[k - 1] = strides[k] * shape[k];
  return strides;
}

std::int64_t product(const std::vector<std::int64_t>& values, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t k = begin; k < end; ++k) p *= values[k];
  return p;
}

}  // namespace

const char* status_name(cublasStatus_t status) {
  const char* name = cublasGetStatusName(status);
  return name != nullptr ? name : "CUBLAS_STATUS_UNKNOWN";
}

[[noreturn]] void throw_cublas_error(const char* library, cublasStatus_t status, const char* call, const char* file,
                                     int line) {
  std::string hint;
  if (const char* text = cublasGetStatusString(status)) hint = text;
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      hint += "; the CUDA driver or device may be unavailable (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
      break;
    case CUBLAS_STATUS_ARCH_MISMATCH:
      hint += "; this GPU lacks a feature the call needs (e.g. bfloat16 before sm80)";
      break;
    case CUBLAS_STATUS_INVALID_VALUE:
      hint += "; an argument is out of range (internal error of xpuruntime: please report it)";
      break;
    default:
      break;
  }
  const std::string message = detail::format_library_error(library, status_name(status), static_cast<int>(status), call,
                                                           current_device_or_minus_one(), file, line, hint);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemoryError(message);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH) {
    throw UnsupportedOperationError(message);
  }
  throw CudaError(message);
}

// ---- handles ----

CublasHandle CublasHandle::create(int device) {
  detail::CudaDeviceGuard guard(device);
  cublasHandle_t handle = nullptr;
  XPURT_CUBLAS_CHECK(cublasCreate(&handle));
  CublasHandle owner(handle);
  XPURT_CUBLAS_CHECK(cublasSetMathMode(
      handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  return owner;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) (void)cublasDestroy(handle_);
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

CublasLtHandle CublasLtHandle::create(int device) {
  detail::CudaDeviceGuard guard(device);
  cublasLtHandle_t handle = nullptr;
  XPURT_CUBLASLT_CHECK(cublasLtCreate(&handle));
  return CublasLtHandle(handle);
}

CublasLtHandle::~CublasLtHandle() {
  if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
}

CublasLtHandle::CublasLtHandle(CublasLtHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}

CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

cublasHandle_t thread_cublas_handle(int device, cudaStream_t stream) {
  const cublasHandle_t handle = detail::thread_handle<CublasHandle>(device).get();
  XPURT_CUBLAS_CHECK(cublasSetStream(handle, stream));
  return handle;
}

cublasLtHandle_t thread_cublaslt_handle(int device) {
  return detail::thread_handle<CublasLtHandle>(device).get();
}

void* align_up(void* pointer, std::size_t alignment) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  return reinterpret_cast<void*>((address + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1));
}

std::size_t round_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

void bind_workspace(cublasHandle_t handle, void* workspace, std::size_t bytes) {
  void* aligned = workspace != nullptr ? align_up(workspace, 256) : nullptr;
  const std::size_t lost = static_cast<std::size_t>(static_cast<char*>(aligned) - static_cast<char*>(workspace));
  if (aligned == nullptr || bytes <= lost) {
    XPURT_CUBLAS_CHECK(cublasSetWorkspace(handle, nullptr, 0));
    return;
  }
  XPURT_CUBLAS_CHECK(cublasSetWorkspace(handle, aligned, bytes - lost));
}

std::size_t default_cublas_workspace(int compute_capability, std::uint64_t workspace_limit) {
  // cuBLAS's own recommendation for a user-provided workspace (cuBLAS docs, cublasSetWorkspace).
  const std::size_t recommended = compute_capability >= 90 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
  if (workspace_limit == 0) return recommended;
  return static_cast<std::size_t>(std::min<std::uint64_t>(recommended, workspace_limit));
}

// ---- types ----

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    default:
      break;
  }
  XPURT_INTERNAL_ASSERT(false, "no cuBLAS data type for ", dtype_name(dtype));
  return CUDA_R_32F;
}

cublasComputeType_t compute_type(DType dtype, Precision precision) {
  if (dtype != DType::kFloat32) return CUBLAS_COMPUTE_32F;
  return precision == Precision::kFP32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
}

const char* compute_type_name(cublasComputeType_t type) {
  switch (type) {
    case CUBLAS_COMPUTE_32F:
      return "32F";
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      return "32F_FAST_TF32";
    default:
      return "other";
  }
}

std::string shape_str(const std::vector<std::int64_t>& shape) { return detail::shape_str(shape, ","); }

const char* input_name(const std::string& op, std::size_t index) {
  static const std::unordered_map<std::string, std::vector<const char*>> names = {
      {"matmul", {"a", "b"}}, {"linear", {"x", "weight", "bias", "residual"}}, {"attention", {"q", "k", "v", "mask"}},
      {"linear_grad_weight", {"grad", "x"}}};
  const auto it = names.find(op);
  if (it == names.end() || index >= it->second.size()) return "input";
  return it->second[index];
}

KernelDecl gemm_declaration(const std::string& op, const std::string& what) {
  KernelDecl decl;
  decl.subject = what;
  for (std::size_t k = 0; std::string(input_name(op, k)) != "input"; ++k) decl.input_names.push_back(input_name(op, k));
  decl.no_int8 = true;
  decl.dtypes = {{DType::kFloat32, DType::kFloat16, DType::kBFloat16}, "float32, float16 and bfloat16"};
  decl.layout = Layout::kContiguous;
  return decl;
}

Support check_gemm_device(const OpDescriptor& desc, const char* what) {
  if (!desc.device.is_cuda()) {
    return Support::no(detail::str_cat(what, " runs on CUDA devices; the input is on ", desc.device.str()));
  }
  if (!desc.inputs.empty() && desc.inputs[0].dtype == DType::kBFloat16 && desc.compute_capability > 0 &&
      desc.compute_capability < 80) {
    return Support::no(detail::str_cat(what,
                                       " needs compute capability 8.0 or newer for bfloat16 GEMMs; this "
                                       "device is sm",
                                       desc.compute_capability));
  }
  return Support::yes();
}

// ---- GEMM shapes ----

// Note [Row-major GEMM through column-major cuBLAS]
// cuBLAS is column-major. A row-major matrix X[r, c] (leading dimension c) is, read column-major, the matrix
// X^T[c, r] with the same leading dimension. So the row-major C = A B is computed as the column-major
// C^T = B^T A^T: cuBLAS's first operand is our B (m = N rows), its second our A (n = M columns), k = K, and
// no data moves. linear's "nk" weight W[N, K] read column-major is W^T[K, N]; y^T = W x^T then takes it with
// op = T (transpose_lhs). The bias of linear is a per-row vector of the column-major result (length m = N),
// which is exactly what cuBLASLt's bias epilogues broadcast.
//
// Note [Broadcast batch dims]
// matmul broadcasts the batch dims of a[..., M, K] and b[..., K, N]. Each operand's batch stride per output
// batch dim is its contiguous stride, or 0 where the operand has size 1 (broadcast). The innermost run of
// output batch dims along which every operand's offset is `index * stride` (all of an operand's dims in the
// run broadcast, or none) becomes one strided-batch call (stride 0 = the same matrix for every GEMM of the
// batch); the remaining outer dims are looped over on the host, one call each. Special case: when b has no
// batch at all, a's batch dims fold into M (one larger GEMM, contiguous a and c make that exact).
GemmShape matmul_shape(const OpDescriptor& desc) {
  const auto& a = desc.inputs[0].shape;
  const auto& b = desc.inputs[1].shape;
  const auto& c = desc.outputs[0].shape;
  const std::size_t rank_a = a.size();
  const std::size_t rank_b = b.size();
  const std::int64_t m = a[rank_a - 2];
  const std::int64_t k = a[rank_a - 1];
  const std::int64_t n = b[rank_b - 1];

  GemmShape shape;
  shape.m = n;
  shape.k = k;
  shape.transpose_lhs = false;
  shape.ld_lhs = std::max<std::int64_t>(1, n);
  shape.ld_rhs = std::max<std::int64_t>(1, k);
  shape.ld_out = std::max<std::int64_t>(1, n);

  const std::size_t rank = c.size() - 2;  // output batch dims
  const std::int64_t batch_b = product(b, 0, rank_b - 2);
  if (batch_b == 1) {
    shape.n = product(c, 0, rank) * m;  // fold a's batch into M
    return shape;
  }
  shape.n = m;

  // Per output batch dim: each operand's stride (0 where it broadcasts) and the output's.
  std::vector<std::int64_t> sizes(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(rank));
  auto batch_strides = [&](const std::vector<std::int64_t>& shape_x, std::int64_t matrix) {
    const std::size_t batch_rank = shape_x.size() - 2;
    const std::vector<std::int64_t> dims(shape_x.begin(), shape_x.begin() + static_cast<std::ptrdiff_t>(batch_rank));
    const std::vector<std::int64_t> strides = contiguous(dims);
    std::vector<std::int64_t> out(rank, 0);
    for (std::size_t j = 0; j < batch_rank; ++j) {
      const std::size_t target = rank - batch_rank + j;
      out[target] = dims[j] == 1 ? 0 : strides[j] * matrix;
    }
    return out;
  };
  const std::vector<std::int64_t> stride_a = batch_strides(a, m * k);
  const std::vector<std::int64_t> stride_b = batch_strides(b, k * n);
  std::vector<std::int64_t> stride_c = contiguous(sizes);
  for (auto& s : stride_c) s *= m * n;

  // Drop size-1 output dims: they never move an offset.
  std::vector<std::size_t> dims;
  for (std::size_t j = 0; j < rank; ++j) {
    if (sizes[j] != 1) dims.push_back(j);
  }
  // The innermost run [first, dims.size()) where every operand's offset is linear in the flat index.
  std::size_t first = dims.size();
  while (first > 0) {
    const std::size_t candidate = first - 1;
    if (candidate + 1 < dims.size()) {
      const std::size_t j = dims[candidate];
      const std::size_t next = dims[candidate + 1];
      const bool linear = stride_a[j] == stride_a[next] * sizes[next] && stride_b[j] == stride_b[next] * sizes[next];
      if (!linear) break;
    }
    first = candidate;
  }
  shape.batch = 1;
  if (first < dims.size()) {
    const std::size_t inner = dims.back();
    for (std::size_t q = first; q < dims.size(); ++q) shape.batch *= sizes[dims[q]];
    shape.stride_lhs = stride_b[inner];
    shape.stride_rhs = stride_a[inner];
    shape.stride_out = stride_c[inner];
  }
  // Host loop over the outer dims dims[0, first), in row-major order.
  shape.outer_offsets_lhs = {0};
  shape.outer_offsets_rhs = {0};
  shape.outer_offsets_out = {0};
  for (std::size_t q = 0; q < first; ++q) {
    const std::size_t j = dims[q];
    std::vector<std::int64_t> lhs, rhs, out;
    for (std::size_t base = 0; base < shape.outer_offsets_out.size(); ++base) {
      for (std::int64_t i = 0; i < sizes[j]; ++i) {
        lhs.push_back(shape.outer_offsets_lhs[base] + i * stride_b[j]);
        rhs.push_back(shape.outer_offsets_rhs[base] + i * stride_a[j]);
        out.push_back(shape.outer_offsets_out[base] + i * stride_c[j]);
      }
    }
    shape.outer_offsets_lhs = std::move(lhs);
    shape.outer_offsets_rhs = std::move(rhs);
    shape.outer_offsets_out = std::move(out);
  }
  return shape;
}

std::int64_t matmul_outer_launches(const OpDescriptor& desc) {
  // The same walk as matmul_shape without materialising the offsets (supports() must stay cheap).
  const auto& a = desc.inputs[0].shape;
  const auto& b = desc.inputs[1].shape;
  const auto& c = desc.outputs[0].shape;
  if (product(b, 0, b.size() - 2) == 1) return 1;
  const std::size_t rank = c.size() - 2;
  auto broadcast = [&](const std::vector<std::int64_t>& shape_x, std::size_t j) {
    const std::size_t batch_rank = shape_x.size() - 2;
    if (j < rank - batch_rank) return true;
    return shape_x[j - (rank - batch_rank)] == 1;
  };
  std::vector<std::size_t> dims;
  for (std::size_t j = 0; j < rank; ++j) {
    if (c[j] != 1) dims.push_back(j);
  }
  std::size_t first = dims.size();
  while (first > 0) {
    const std::size_t candidate = first - 1;
    if (candidate + 1 < dims.size()) {
      const std::size_t j = dims[candidate];
      const std::size_t next = dims[candidate + 1];
      // Contiguous operands: linear across (j, next) exactly when both dims broadcast or neither does.
      if (broadcast(a, j) != broadcast(a, next) || broadcast(b, j) != broadcast(b, next)) break;
    }
    first = candidate;
  }
  std::int64_t launches = 1;
  for (std::size_t q = 0; q < first; ++q) launches *= c[dims[q]];
  return launches;
}

GemmShape linear_shape(const OpDescriptor& desc) {
  const auto& x = desc.inputs[0].shape;
  const auto& w = desc.inputs[1].shape;
  const bool nk = desc.attrs.get_string("weight_layout", "nk") == "nk";
  const std::int64_t k = x.back();
  const std::int64_t n = nk ? w[0] : w[1];
  GemmShape shape;
  shape.m = n;
  shape.n = product(x, 0, x.size() - 1);
  shape.k = k;
  shape.transpose_lhs = nk;
  shape.ld_lhs = std::max<std::int64_t>(1, nk ? k : n);
  shape.ld_rhs = std::max<std::int64_t>(1, k);
  shape.ld_out = std::max<std::int64_t>(1, n);
  return shape;
}

GemmShape linear_grad_weight_shape(const OpDescriptor& desc) {
  const auto& grad = desc.inputs[0].shape;
  const auto& x = desc.inputs[1].shape;
  const std::int64_t n = grad.back();
  const std::int64_t k = x.back();
  GemmShape shape;
  shape.m = k;
  shape.n = n;
  shape.k = product(x, 0, x.size() - 1);
  shape.transpose_rhs = true;
  shape.ld_lhs = std::max<std::int64_t>(1, k);
  shape.ld_rhs = std::max<std::int64_t>(1, n);
  shape.ld_out = std::max<std::int64_t>(1, k);
  return shape;
}

Support check_int32(const GemmShape& shape, const char* what) {
  const std::int64_t limit = INT_MAX;
  const std::int64_t values[] = {shape.m, shape.n, shape.k, shape.ld_lhs, shape.ld_rhs, shape.ld_out, shape.batch};
  for (const std::int64_t value : values) {
    if (value > limit) {
      return Support::no(detail::str_cat(what, " passes 32-bit sizes to cuBLAS; this GEMM (m=", shape.m,
                                         ", n=", shape.n, ", k=", shape.k, ", batch=", shape.batch,
                                         ") has a size above 2^31-1: split it"));
    }
  }
  return Support::yes();
}

void gemm(cublasHandle_t handle, const GemmShape& shape, DType dtype, cublasComputeType_t compute, const void* lhs,
          const void* rhs, void* out, float alpha) {
  const float beta = 0.0f;
  const cudaDataType_t type = cuda_data_type(dtype);
  const std::size_t element = dtype_size(dtype);
  const cublasOperation_t op_lhs = shape.transpose_lhs ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_rhs = shape.transpose_rhs ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(shape.m);
  const int n = static_cast<int>(shape.n);
  const int k = static_cast<int>(shape.k);
  const int ld_lhs = static_cast<int>(shape.ld_lhs);
  const int ld_rhs = static_cast<int>(shape.ld_rhs);
  const int ld_out = static_cast<int>(shape.ld_out);
  for (std::size_t j = 0; j < shape.launches(); ++j) {
    const void* l = static_cast<const char*>(lhs) + shape.outer_offsets_lhs[j] * static_cast<std::int64_t>(element);
    const void* r = static_cast<const char*>(rhs) + shape.outer_offsets_rhs[j] * static_cast<std::int64_t>(element);
    void* o = static_cast<char*>(out) + shape.outer_offsets_out[j] * static_cast<std::int64_t>(element);
    if (shape.batch == 1) {
      XPURT_CUBLAS_CHECK(cublasGemmEx(handle, op_lhs, op_rhs, m, n, k, &alpha, l, type, ld_lhs, r, type, ld_rhs,
                                      &beta, o, type, ld_out, compute, CUBLAS_GEMM_DEFAULT));
    } else {
      XPURT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_lhs, op_rhs, m, n, k, &alpha, l, type, ld_lhs,
                                                    shape.stride_lhs, r, type, ld_rhs, shape.stride_rhs, &beta, o, type,
                                                    ld_out, shape.stride_out, static_cast<int>(shape.batch), compute,
                                                    CUBLAS_GEMM_DEFAULT));
    }
  }
}

bool is_aligned(const void* pointer, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0;
}

}  // namespace xpuruntime::cublas
