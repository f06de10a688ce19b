// What every kernel of the cpu backend shares: the kernel and plan classes, the support checks, dtype
// conversion between tensors and compute buffers, the OpenMP loop helper, the GEMM entry point and the scalar
// math of the activations. Internal header of src/cpp/backends/cpu/.
//
// Note [The cpu backend as the oracle]
// The cpu backend implements every op of docs/ops.md and is the reference the conformance suite compares the
// GPU kernels with, so correctness comes before speed:
//  * 16-bit inputs (float16, bfloat16) are converted to float32 once (src/cpp/core/half.h, exact), computed
//    in float32 and rounded back to nearest even on the way out; float64 inputs are computed in float64
//    (`dispatch_compute_type` below).
//  * Sums that are not GEMMs (softmax and attention denominators, layer_norm statistics, reductions, average
//    pools) accumulate in double, so the reference adds no error of its own on long rows.
//  * Every kernel is deterministic: each output element is computed by one thread in a fixed order (or, for a
//    reduction of few long rows, from chunks of a size fixed by the shape, combined in order: Note [Few long rows
//    split] in cpu_reduce.cpp). Threads split only independent work (rows, planes, tiles, such chunks), so the loops
//    and the fallback GEMM give the same bits whatever the thread count (Note [CPU worker threads]); an OpenBLAS
//    GEMM gives the same bits run after run for a given thread count (Note [Parallel GEMM blocks] in cpu_gemm.cpp).
//  * GEMMs go through OpenBLAS when the build has it (XPURT_WITH_BLAS) and through the blocked GEMM of
//    cpu_gemm.cpp otherwise; the environment variable XPURT_CPU_GEMM=fallback|blas picks one at plan build
//    time (tests use it to exercise the fallback on a build that has OpenBLAS).
//  * NaN and infinities follow PyTorch (see each file); semantics of every op are those of docs/ops.md.
//
// Ownership: kernels belong to the KernelRegistry; a plan holds its CpuContext by value. Thread-safety: plans
// are immutable and may run concurrently; the helpers here keep no state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/cpu_threads.h"
#include "core/data_ops.h"
#include "core/half.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/run_options.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::cpu {


// ---- plan context ----

enum class GemmImpl : std::uint8_t {
  kBlas,      // OpenBLAS cblas_sgemm / cblas_dgemm (only when XPURT_WITH_BLAS)
  kFallback,  // the blocked GEMM of cpu_gemm.cpp
  kPacked,    // float: the packed GEMM of the instruction set's kernels (cpu_isa.h; Note [Packed GEMM]); double:
              // OpenBLAS when built with it, else the blocked GEMM
};
const char* gemm_impl_name(GemmImpl impl);  // "openblas", "fallback", "packed"

// What a plan fixes at build time.
struct CpuContext {
  int threads = 1;                      // threads of this plan's loops and GEMMs, the caller included (>= 1)
  bool allow_spinning = true;           // ExecutionPolicy::allow_spinning (Note [CPU worker threads])
  GemmImpl gemm = GemmImpl::kFallback;  // how GEMMs run
  const IsaKernels* isa = nullptr;      // the window loops' instruction set (cpu_isa.h; set by make_context)
  // The packed GEMM takes products of under 64K multiply-adds too (Note [OpenBLAS older than the CPU]).
  bool packed_small_gemms = false;
  // Products of fewer than 8 rows or columns run on the skinny kernels, not OpenBLAS (Note [Skinny GEMM]): with
  // packed_small_gemms, XPURT_CPU_GEMM=packed, or a build without OpenBLAS.
  bool skinny_gemms = false;
  // A convolution over windows may read them in place (Note [Windows read in place] in cpu_conv.cpp) or make its
  // pixels the GEMM's rows (Note [Convolution with the pixels as rows]); XPURT_CPU_CONV_WINDOWS=packed packs them
  // always, the output channels as rows (the same bits: tests compare the two).
  bool conv_windows_auto = true;
};

// The context for `policy`: threads = policy.intra_op_threads (0: default_threads(), the CPUs the process may use),
// allow_spinning from the policy; GEMM from
// XPURT_CPU_GEMM (unset or "auto": OpenBLAS when built with it), the instruction set from XPURT_CPU_ISA (isa_kernels
// in cpu_isa.h). Throws InvalidArgumentError on an unknown XPURT_CPU_GEMM or XPURT_CPU_ISA value and
// UnsupportedOperationError for "blas" on a build without OpenBLAS or an instruction set the CPU lacks.
XPURT_API CpuContext make_context(const ExecutionPolicy& policy);

// The kernels of the context's instruction set, or of the process's when it names none (a context made by hand).
inline const IsaKernels& isa_of(const CpuContext& context) {
  return context.isa != nullptr ? *context.isa : isa_kernels();
}

// ---- kernels ----

using CpuRunFn = std::function<void(const KernelLaunch&, const CpuContext&)>;

// The run function of a conv2d/pool kernel written for NCHW that also takes layout=NHWC (core/conv_layout.h): an
// NHWC launch runs `nchw` on NCHW copies of its 4-D inputs (x, and conv2d's weight [O, kh, kw, C/g] and
// residual) into an NCHW scratch output, which is then permuted into the NHWC output. A reference path: the cpu
// backend's NHWC exists for conformance (every op has a cpu kernel), the GPU kernels run NHWC natively.
CpuRunFn nhwc_through_nchw(CpuRunFn nchw);

// The dtypes a cpu kernel takes (its op schema has validated the exact combination already).
enum class DTypeSet : std::uint8_t {
  kFloat,        // float32, float16, bfloat16, float64: the float ops
  kFloatAndInt,  // the floats and int32, int64: add, sub, mul, div, neg
  kAll,          // every dtype of Tensor: data movement, where, comparisons, logical_not, cast
  kQuantized,    // int8, uint8, int32, float32, float16: qlinear, qconv2d (which also run under precision int8)
};

// What every cpu kernel declares (Note [Kernel declarations] in core/kernel_registry.cpp): contiguous inputs of a
// dtype of `dtypes`. Reasons name the kernel "the cpu kernel of '<op>'" and the inputs by index.
KernelDecl declaration(const std::string& op, DTypeSet dtypes);

// What that declaration cannot say, which every cpu kernel's accepts() asks: the op and every present input on
// the CPU ("runs on CPU tensors"), a policy that does not ask for int8 unless the kernel is one of the int8 ops
// (DTypeSet::kQuantized; the descriptor's precision is not asked),
// and every present output contiguous, on the CPU and of a dtype of `dtypes`.
Support check_placement(const OpDescriptor& desc, const ExecutionPolicy& policy, DTypeSet dtypes);

// A cpu kernel: KernelInfo{op, "cpu", "cpu", kCPU, deterministic, declaration(op, dtypes)}, check_placement (every
// cpu kernel takes any shape the op schema accepts), and plans that call `run` with the context fixed at build.
class CpuKernel final : public Kernel {
 public:
  CpuKernel(const std::string& op, std::string summary, CpuRunFn run, DTypeSet dtypes = DTypeSet::kFloat);
  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override;
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override;

 private:
  CpuRunFn run_;
  DTypeSet dtypes_;
};

inline void add_cpu_kernel(KernelRegistry& registry, const std::string& op, std::string summary, CpuRunFn run,
                           DTypeSet dtypes = DTypeSet::kFloat) {
  registry.add_kernel(std::make_unique<CpuKernel>(op, std::move(summary), std::move(run), dtypes));
}

// The registration functions of each op family (one per file).
void register_gemm_kernels(KernelRegistry& registry);         // matmul, linear
void register_conv_kernels(KernelRegistry& registry);         // conv2d
void register_pool_kernels(KernelRegistry& registry);         // max_pool2d, avg_pool2d, global_avg_pool
void register_norm_kernels(KernelRegistry& registry);         // batch_norm, softmax, layer_norm
void register_elementwise_kernels(KernelRegistry& registry);  // activations, unary, binary, cast
void register_reduce_kernels(KernelRegistry& registry);       // reduce_sum/mean/max/min
void register_attention_kernels(KernelRegistry& registry);    // attention
void register_onnx_kernels(KernelRegistry& registry);  // the ONNX ops beyond the core set (cpu_onnx_ops.cpp)
void register_fused_kernels(KernelRegistry& registry);  // fused_elementwise (cpu_fused.cpp)
void register_quantized_kernels(KernelRegistry& registry);  // qlinear, qconv2d (cpu_quant.cpp)

// Kernels of ops that the ONNX reference library runs where they do not take the launch (Note [Registry ops through
// the ONNX reference library] in cpu_onnx_ops.cpp): each returns false, having written nothing, where it does not, and
// the caller then runs the reference.
bool log_softmax_fast(const KernelLaunch& launch, const CpuContext& context);  // cpu_norm.cpp
bool pad_fast(const KernelLaunch& launch, const CpuContext& context);          // cpu_pad.cpp: reflect, edge, wrap
bool cum_sum_fast(const KernelLaunch& launch, const CpuContext& context);      // cpu_scan.cpp
bool arg_extreme_fast(const KernelLaunch& launch, const CpuContext& context);  // cpu_scan.cpp: arg_max, arg_min
bool top_k_fast(const KernelLaunch& launch, const CpuContext& context);        // cpu_scan.cpp
bool tile_fast(const KernelLaunch& launch, const CpuContext& context);         // cpu_data.cpp
bool gather_elements_fast(const KernelLaunch& launch, const CpuContext& context);  // cpu_data.cpp
void register_int4_kernels(KernelRegistry& registry);       // matmul_nbits (cpu_int4.cpp)
void register_gqa_kernels(KernelRegistry& registry);        // group_query_attention (cpu_gqa.cpp)
// quantize_linear, dequantize_linear, dynamic_quantize_linear (cpu_quantize.cpp)
void register_quantize_kernels(KernelRegistry& registry);
// reduce_sum/max/min of int32/int64 through the ONNX reference library (cpu_onnx_ops.cpp).
void run_reference_reduce(const KernelLaunch& launch);
void register_data_kernels(KernelRegistry& registry);  // transpose, concat, slice, gather, expand, where, comparisons,
                                                       // logical_not (cpu_data.cpp)

// Integer add/sub/mul/div/neg and cast between any dtypes (cpu_data.cpp; the elementwise kernels call them for
// the dtypes they do not compute themselves). `op`: "add", "sub", "mul", "div" or "neg".
void run_integer_arithmetic(const std::string& op, const KernelLaunch& launch, const CpuContext& context);
void run_any_cast(const KernelLaunch& launch, const CpuContext& context);

// ---- scratch without zero-filling ----

// BudgetAllocator whose vectors leave their elements default-initialised (for trivial types: not written) when sized:
// a GEMM's packing buffers, which packing overwrites before anything reads them. A per-head attention GEMM (128 x 128
// x 64) spent a fifth of its time zero-filling its 66 KiB of panels.
template <typename T>
class UninitBudgetAllocator : public BudgetAllocator<T> {
 public:
  using BudgetAllocator<T>::BudgetAllocator;
  template <typename U>
  struct rebind {
    using other = UninitBudgetAllocator<U>;
  };
  template <typename U>
  void construct(U* ptr) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(ptr)) U;
  }
  template <typename U, typename... Args>
  void construct(U* ptr, Args&&... args) {
    ::new (static_cast<void*>(ptr)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using UninitScratch = std::vector<T, UninitBudgetAllocator<T>>;

// ---- dtype conversion ----

// float64 is computed in double, every other float dtype in float (Note [The cpu backend as the oracle]).
template <typename F>
decltype(auto) dispatch_compute_type(DType dtype, F&& f) {
  if (dtype == DType::kFloat64) return f(double{});
  return f(float{});
}

// A CpuRunFn calling Run<T>::run(launch, context), T the compute type of input 0's dtype.
template <template <typename> class Run>
CpuRunFn typed_run() {
  return [](const KernelLaunch& launch, const CpuContext& context) {
    dispatch_compute_type(launch.desc->inputs[0].dtype, [&](auto zero) { Run<decltype(zero)>::run(launch, context); });
  };
}

// double -> 16-bit float with a single rounding: round to odd into float (24 significant bits, more than
// 2 beyond the 11 of half and 8 of bfloat16), then round to nearest even. Converting double -> float -> half
// directly could round twice.
inline float round_to_odd_float(double value) {
  float rounded = static_cast<float>(value);
  if (!std::isfinite(value) || static_cast<double>(rounded) == value) return rounded;
  if (std::isinf(rounded) || std::fabs(static_cast<double>(rounded)) > std::fabs(value)) {
    rounded = std::nextafter(rounded, 0.0f);  // truncate toward zero
  }
  std::uint32_t bits;
  std::memcpy(&bits, &rounded, sizeof(bits));
  bits |= 1u;  // inexact: make the last bit odd
  std::memcpy(&rounded, &bits, sizeof(bits));
  return rounded;
}

template <typename T>
inline void load_elements(const void* src, DType dtype, T* dst, std::int64_t n) {
  switch (dtype) {
    case DType::kFloat32: {
      const float* s = static_cast<const float*>(src);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(s[i]);
      return;
    }
    case DType::kFloat64: {
      const double* s = static_cast<const double*>(src);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(s[i]);
      return;
    }
    case DType::kFloat16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(detail::half_to_float(s[i]));
      return;
    }
    case DType::kBFloat16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(detail::bfloat16_to_float(s[i]));
      return;
    }
    default:
      XPURT_INTERNAL_ASSERT(false, "cpu backend: load of non-float dtype ", dtype_name(dtype));
  }
}

template <typename T>
inline void store_elements(const T* src, void* dst, DType dtype, std::int64_t n) {
  switch (dtype) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst);
      for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(src[i]);
      return;
    }
    case DType::kFloat64: {
      double* d = static_cast<double*>(dst);
      for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(src[i]);
      return;
    }
    case DType::kFloat16: {
      std::uint16_t* d = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<T, double>) {
          d[i] = detail::float_to_half(round_to_odd_float(src[i]));
        } else {
          d[i] = detail::float_to_half(static_cast<float>(src[i]));
        }
      }
      return;
    }
    case DType::kBFloat16: {
      std::uint16_t* d = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<T, double>) {
          d[i] = detail::float_to_bfloat16(round_to_odd_float(src[i]));
        } else {
          d[i] = detail::float_to_bfloat16(static_cast<float>(src[i]));
        }
      }
      return;
    }
    default:
      XPURT_INTERNAL_ASSERT(false, "cpu backend: store to non-float dtype ", dtype_name(dtype));
  }
}

// The dtype whose elements are T (float or double).
template <typename T>
constexpr DType native_dtype() {
  return std::is_same_v<T, double> ? DType::kFloat64 : DType::kFloat32;
}

// The elements of a contiguous tensor as T: the tensor's own memory when its dtype is T, else a converted
// copy. An undefined tensor gives data() == nullptr.
template <typename T>
class InputBuffer {
 public:
  explicit InputBuffer(const Tensor& tensor) {
    if (!tensor.defined()) return;
    size_ = tensor.numel();
    if (native_dtype<T>() == tensor.dtype()) {
      data_ = static_cast<const T*>(tensor.data_ptr());
    } else {
      copy_.resize(static_cast<std::size_t>(size_));
      load_elements(tensor.data_ptr(), tensor.dtype(), copy_.data(), size_);
      data_ = copy_.data();
    }
  }
  InputBuffer(const InputBuffer&) = delete;
  InputBuffer& operator=(const InputBuffer&) = delete;

  const T* data() const { return data_; }
  std::int64_t size() const { return size_; }
  T operator[](std::int64_t i) const { return data_[i]; }

 private:
  ScratchVector<T> copy_;  // Note [Scratch memory under the budget]
  const T* data_ = nullptr;
  std::int64_t size_ = 0;
};

// A T buffer for a contiguous output tensor: the tensor's own memory when its dtype is T, else a scratch
// buffer that `commit()` rounds into the tensor. Kernels write every element, then call commit().
template <typename T>
class OutputBuffer {
 public:
  explicit OutputBuffer(Tensor& tensor) : tensor_(tensor), size_(tensor.numel()) {
    if (native_dtype<T>() == tensor.dtype()) {
      data_ = static_cast<T*>(tensor.data_ptr());
    } else {
      copy_.resize(static_cast<std::size_t>(size_));
      data_ = copy_.data();
    }
  }
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;

  T* data() { return data_; }
  std::int64_t size() const { return size_; }
  void commit() {
    if (!copy_.empty()) store_elements(copy_.data(), tensor_.data_ptr(), tensor_.dtype(), size_);
  }

 private:
  Tensor& tensor_;
  ScratchVector<T> copy_;
  T* data_ = nullptr;
  std::int64_t size_ = 0;
};

// ---- threads ----

// While a run can stop, a thread's share of a parallel loop is cut into up to this many slices, with a check of the
// run's token before each (Note [Stopping a run] in run_options.h).
inline constexpr std::int64_t kRunStopSlices = 16;

// f(begin, end), in slices of at least `grain` items with a stop check before each when `stop` is set.
template <typename F>
void run_slices(std::int64_t begin, std::int64_t end, std::int64_t grain, const RunStop* stop, F& f) {
  if (stop == nullptr) {
    f(begin, end);
    return;
  }
  const std::int64_t n = end - begin;
  const std::int64_t slices = std::clamp<std::int64_t>(n / grain, 1, kRunStopSlices);
  for (std::int64_t s = 0; s < slices; ++s) {
    stop->check("in a CPU kernel's parallel loop");
    f(begin + n * s / slices, begin + n * (s + 1) / slices);
  }
}

// Chunks per thread of a parallel loop: more chunks than threads, so that the threads that run take the share of
// one the OS has not scheduled (Note [CPU worker threads] in cpu_threads.cpp).
inline constexpr std::int64_t kChunksPerThread = 4;

// Runs f(begin, end) over [0, n) split into contiguous chunks of at least `grain` items (at most kChunksPerThread *
// `threads` of them), on the calling thread and up to `threads - 1` workers of the cpu backend's pool (cpu_threads.h;
// one call on the calling thread when that gives one chunk, or inside another loop's chunk). `f` must take any such
// range and write only the outputs of its range: which thread runs a chunk is not fixed. An exception thrown by `f`
// on a worker (e.g. std::bad_alloc) is carried back and rethrown here; the other chunks still run. The workers run
// under the calling thread's memory budget, so the scratch they make is charged to the run (Note [Scratch memory
// under the budget]), and under its stop token: within a run that can stop, each chunk runs in slices of at least
// `grain` items (run_slices). Workers spin after the loop or park at once as SpinScope::current() says.
template <typename F>
void parallel_for(std::int64_t n, int threads, std::int64_t grain, F&& f) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t most_chunks = (n + grain - 1) / grain;
  const RunStop* stop = RunStop::current();
  if (threads <= 1 || most_chunks <= 1 || in_parallel_loop()) {
    run_slices(std::int64_t{0}, n, grain, stop, f);
    return;
  }
  const std::int64_t chunks = std::min<std::int64_t>(most_chunks, kChunksPerThread * threads);
  auto chunk = [&](std::int64_t c) { run_slices(n * c / chunks, n * (c + 1) / chunks, grain, stop, f); };
  using Chunk = decltype(chunk);
  run_chunks(chunks, threads, SpinScope::current(),
             ChunkBody{[](void* context, std::int64_t c) { (*static_cast<Chunk*>(context))(c); }, &chunk});
}

// The sum of f(x[i]) over n elements in double, in kWide partials: partial j sums the elements i with
// i % kWide == j (the tail after the last whole group into partial 0), and the partials are added pairwise at the end
// ((0 + 1) + (2 + 3)) + ...: a fixed order (the bits do not depend on the threads). The kWide independent chains
// keep additions in flight: one chain runs at an add's latency an element, and four (what the reductions and norms
// had before) a long row's sum at under half the memory's speed.
template <int kWide, typename T, typename F>
double wide_sums(const T* x, std::int64_t n, F f) {
  static_assert(kWide >= 2 && (kWide & (kWide - 1)) == 0, "a power of two of partials");
  double acc[kWide] = {};
  std::int64_t i = 0;
  for (; i + kWide <= n; i += kWide) {
    for (int j = 0; j < kWide; ++j) acc[j] += f(static_cast<double>(x[i + j]));
  }
  for (; i < n; ++i) acc[0] += f(static_cast<double>(x[i]));
  for (int width = kWide / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] = acc[2 * j] + acc[2 * j + 1];
  }
  return acc[0];
}

// ---- GEMM ----

// C[m, n] = A[m, k] * op(B)[k, n], all row-major with leading dims lda, ldb, ldc. op(B) = B ([k, n]) or,
// with trans_b, B^T (B stored [n, k]). C is overwritten (its old contents, NaN included, are ignored; k == 0
// gives zeros). Deterministic: each element sums over k in one fixed order whatever the
// thread count. Defined for float and double in cpu_gemm.cpp.
template <typename T>
void gemm(const CpuContext& context, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc);

// C[m, n] = A[m, k] * B with B given by rows (RowsOfB, cpu_isa.h): the packed GEMM (Note [Packed GEMM] in
// cpu_gemm.cpp) over rows that need not be evenly spaced, copied into its panels as it packs them. Requires
// context.gemm == GemmImpl::kPacked. packed_a: A as pack_gemm_a packed it (several GEMMs with the same A pack it
// once), or null.
void gemm_rows(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
               std::int64_t lda, const RowsOfB& b, float* c, std::int64_t ldc, const float* packed_a = nullptr);

// What the packed GEMM leaves to OpenBLAS, for plan summaries: "openblas under 8 rows, 8 columns or 64K
// multiply-adds" (Note [Packed GEMM] in cpu_gemm.cpp).
std::string packed_gemm_limits(const CpuContext& context);

// OpenBLAS's kernel family as it names it (openblas_get_corename, lowercase; "none" without OpenBLAS), and whether
// those kernels lack AVX2 while `isa` has it (Note [OpenBLAS older than the CPU] in cpu_gemm.cpp).
XPURT_API std::string blas_core_name();
bool blas_older_than(const IsaKernels& isa);
XPURT_API bool blas_core_lacks_avx2(const std::string& core);  // by OpenBLAS's core name (lowercase)

// A[m, k] (lda) packed for gemm_rows (requires context.gemm == GemmImpl::kPacked).
ScratchVector<float> pack_gemm_a(const CpuContext& context, std::int64_t m, std::int64_t k, const float* a,
                                 std::int64_t lda);

// Whether gemm<float>(context, false, m, n, k, ...) runs on the packed GEMM (so that it can take a packed A).
bool gemm_is_packed(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k);
// C[m, n] = A[m, k] * B[k, n] (ldb) on the packed GEMM with A as pack_gemm_a packed it (gemm_is_packed holds).
void gemm_packed_a(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* packed_a,
                   const float* b, std::int64_t ldb, float* c, std::int64_t ldc);

// op(B)[k, n] (B [k, n] with ldb, or [n, k] when trans) packed for the packed GEMM's tiles: each depth slice of
// gemm_kc in micro-panels of gemm_nr columns, the columns padded with zeros to a whole panel; and C[m, n] = A[m, k]
// (lda) * that B (gemm_is_packed holds).
ScratchVector<float> pack_gemm_b(const CpuContext& context, std::int64_t k, std::int64_t n, const float* b,
                                 std::int64_t ldb, bool trans);
void gemm_packed_b(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                   std::int64_t lda, const float* packed_b, float* c, std::int64_t ldc);
// Whether a convolution task over windows of `count` pixels and `og` output channels computes C^T, its pixels as the
// GEMM's rows (Note [Convolution with the pixels as rows] in cpu_conv.cpp).
XPURT_API bool conv_pixel_rows_pay(const CpuContext& context, std::int64_t count, std::int64_t og);

// C[m, n] = A * B with A packed as pack_gemm_a packs it (round_up(m, gemm_mr) rows) and B as pack_gemm_b does, on
// the packed GEMM at any size (context.gemm == GemmImpl::kPacked).
void gemm_packed_ab(const CpuContext& context, std::int64_t m, std::int64_t n, std::int64_t k, const float* packed_a,
                    const float* packed_b, float* c, std::int64_t ldc);

// Note [Weights packed once per plan] (cpu_gemm.cpp): packings of constant inputs, each made once and kept while the
// tensor's storage lives. Thread-safe (plans run concurrently).
class XPURT_API PackedConstants {
 public:
  // The packing `tag` (>= 0: group `tag` of a convolution's weights as A; -1, -2: a linear layer's or MatMul's
  // weights as B, [K, N] or [N, K]; -3 - g: group g of a convolution's weights transposed as B, Note [Convolution
  // with the pixels as rows] in cpu_conv.cpp) for the instruction set's GEMM `layout` (its IsaKernels) of `source`:
  // made by `pack` on the first call for that storage, address, tag and layout, the kept one after.
  const float* get(const Tensor& source, std::int64_t tag, const void* layout,
                   const std::function<ScratchVector<float>()>& pack);
  std::size_t size();  // the packings kept for storages still alive

 private:
  struct Entry {
    std::weak_ptr<Storage> storage;  // expired: the tensor is gone, and the entry with it
    std::int64_t tag = 0;
    const void* layout = nullptr;
    ScratchVector<float> packed;
  };
  void drop_expired();  // under mutex_
  std::mutex mutex_;
  std::unordered_map<const void*, std::vector<std::unique_ptr<Entry>>> entries_;  // by the data's address
};

// The process's store: every cpu plan's (plans of one model at several input shapes share one packing of its weights).
XPURT_API PackedConstants& shared_packed_constants();

// The store for input `index` of the launch when the engine marked it constant (TensorDesc::constant), else null:
// the caller packs for this call only.
inline PackedConstants* constant_store(const KernelLaunch& launch, std::size_t index) {
  const bool constant = index < launch.desc->inputs.size() && launch.desc->inputs[index].constant;
  return constant && index < launch.num_inputs && launch.input(index).defined() ? &shared_packed_constants() : nullptr;
}

// ---- shapes ----

inline std::int64_t product(const std::vector<std::int64_t>& shape, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < end && i < shape.size(); ++i) p *= shape[i];
  return p;
}

// Element strides of `shape` broadcast to `out_shape` (right-aligned, NumPy rules): 0 on broadcast dims.
using data_ops::broadcast_strides;

// ---- sliding windows (Note [Phase-split planes] in cpu_conv.cpp) ----

// PhaseGeometry (cpu_isa.h): the phase-split padded plane of a window op.
inline PhaseGeometry phase_geometry(std::int64_t out_h, std::int64_t out_w, std::int64_t kh, std::int64_t kw,
                                    const std::int64_t stride[2], const std::int64_t dilation[2],
                                    std::int64_t pad_top, std::int64_t pad_left) {
  PhaseGeometry g;
  g.rows = (out_h - 1) * stride[0] + (kh - 1) * dilation[0] + 1;
  g.cols = (out_w - 1) * stride[1] + (kw - 1) * dilation[1] + 1;
  // A stride past the extent leaves one window along that axis: one phase per padded position lays the plane out as
  // that stride would (position p in phase p, index 0), without a plane of `stride` phases (a model's stride may be
  // as large as int64 allows).
  g.row_phases = std::min(stride[0], g.rows);
  g.phase_rows = (g.rows + g.row_phases - 1) / g.row_phases;
  g.phases = std::min(stride[1], g.cols);
  g.phase_cols = (g.cols + g.phases - 1) / g.phases;
  g.row_stride = g.phases * g.phase_cols;
  g.pad_top = pad_top;
  g.pad_left = pad_left;
  return g;
}

// Offset of tap (i, j) of output (0, 0) in a phase-split plane, for i < kh, j < kw (row-major).
inline std::vector<std::int64_t> phase_offsets(const PhaseGeometry& g, std::int64_t kh, std::int64_t kw,
                                               const std::int64_t dilation[2]) {
  std::vector<std::int64_t> offsets;
  offsets.reserve(static_cast<std::size_t>(kh * kw));
  for (std::int64_t i = 0; i < kh; ++i) {
    const std::int64_t r = i * dilation[0];
    const std::int64_t row = (r % g.row_phases) * g.phase_rows + r / g.row_phases;
    for (std::int64_t j = 0; j < kw; ++j) {
      const std::int64_t c = j * dilation[1];
      offsets.push_back(row * g.row_stride + (c % g.phases) * g.phase_cols + c / g.phases);
    }
  }
  return offsets;
}

// The window plane of an op over a phase-split plane (cpu_isa.h): its taps at `offsets`, input `padded`, flat scratch
// `wide` of out_h * row_stride elements; the caller sets `out` for each plane.
template <typename T>
WindowPlane<T> window_plane(const PhaseGeometry& g, const std::vector<std::int64_t>& offsets, std::int64_t out_h,
                            std::int64_t out_w, const T* padded, T* wide) {
  WindowPlane<T> window;
  window.input = padded;
  window.row_stride = g.row_stride;
  window.offsets = offsets.data();
  window.taps = static_cast<std::int64_t>(offsets.size());
  window.out_h = out_h;
  window.out_w = out_w;
  window.wide = wide;
  return window;
}

// ---- scalar math shared by activations and GEMM epilogues ----

template <typename T>
inline T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
}

template <typename T>
inline T gelu_tanh(T x) {
  const T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);  // sqrt(2/pi)
  return T(0.5) * x * (T(1) + std::tanh(inner));
}

template <typename T>
inline T sigmoid(T x) {
  // exp(-x) overflows to inf for very negative x, giving 0 as it should.
  return T(1) / (T(1) + std::exp(-x));
}

// Activation of GEMM and conv epilogues ("none", "relu", "gelu", "gelu_tanh", "silu", "hard_swish", "relu6").
enum class Activation : std::uint8_t { kNone, kRelu, kGelu, kGeluTanh, kSilu, kHardSwish, kRelu6 };
Activation activation_from_name(const std::string& name);  // validated by the op schemas already

template <typename T>
inline T apply_activation(Activation activation, T x) {
  switch (activation) {
    case Activation::kRelu:
      return x > T(0) ? x : (x != x ? x : T(0));  // NaN stays NaN, like torch.relu
    case Activation::kGelu:
      return gelu_erf(x);
    case Activation::kGeluTanh:
      return gelu_tanh(x);
    case Activation::kSilu:
      return x / (T(1) + std::exp(-x));
    case Activation::kHardSwish:  // x * min(1, max(0, x / 6 + 1 / 2)); NaN stays NaN
      return x * std::min(T(1), std::max(T(0), x / T(6) + T(0.5)));
    case Activation::kRelu6:  // ONNX Clip(x, 0, 6); NaN stays NaN
      return x < T(0) ? T(0) : (x > T(6) ? T(6) : x);
    case Activation::kNone:
      break;
  }
  return x;
}

}  // namespace xpuruntime::cpu
