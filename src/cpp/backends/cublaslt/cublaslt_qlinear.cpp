// The "cublasLt" kernel of the int8 op qlinear (Note [Quantized registry ops] in core/op_schemas.cpp): x (int8, or
// uint8 moved to int8) times the [N, K] int8 weight into int32 on the IMMA tensor cores (CUBLAS_COMPUTE_32I), then
// cuda_raw's quantized_epilogue through the device kernels table.
//
// Note [cuBLASLt int8 GEMMs]
// cuBLASLt runs int8 x int8 -> int32 in the ordinary (column-major) layouts only as "TN": A transposed and B not,
// both K-contiguous, with m and k (cuBLAS's: N and K here) and the leading dimensions multiples of 4 and the pointers
// 4-byte aligned (cuBLAS documentation, cublasLtMatmul(), "To use IMMA kernels"; the IMMA-specific orderings COL32 /
// COL4_4R2_8C do not exist on Hopper). Row-major y[M, N] = x[M, K] @ w^T read column-major is y^T = w (op T) @ x^T,
// which is that form exactly when the weight is stored [N, K] (weight_layout=nk, as the quantized_fusion pass lays
// out every constant weight); x^T is x as stored. The kernel refuses everything else with the reason, and cuda_raw's
// dp4a kernel takes it (Note [The dp4a kernel of qlinear]). As the float GEMMs (Note [cuBLASLt alignment]) the plan
// is built for 16-byte aligned x and weight (the fast IMMA kernels load 16 bytes at a time).
//
// The epilogue stays a separate pass: cuBLASLt's int8-output form (scale type float32, D int8) scales and rounds in
// the library without a documented rounding mode, a y_zero_point or an int32 bias before the scale, so it cannot be
// shown to round as ONNX's QuantizeLinear (round half to even, saturation) does; the cpu kernel's result is the
// contract here, and the GPU kernels reproduce it bit for bit. The int32 accumulation is exact for K <= 131071
// (Note [Signed operands of the int8 GEMMs] in core/quantized_gemm.h), so every split-K reduction gives the same bits
// and the plan is deterministic whatever its algorithm. Workspace: cuBLASLt's, the int32 accumulator (unless the
// output is int32 or float32: the GEMM then writes into the output and the epilogue runs in place), x as int8 (x
// uint8) and the epilogue's alpha and int_bias (core/quantized_gemm.h), each 256-byte aligned.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cublaslt/cublaslt_common.h"
#include "backends/cublaslt/cublaslt_quantized.h"
#include "core/cublas_utils.h"
#include "core/device_kernels.h"
#include "core/quantized_gemm.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cublaslt {

namespace {

using quantized::QLinearProblem;

constexpr const char* kRecordFormat = "xpuruntime.cublasLt.qlinear.v1";
constexpr std::size_t kDefaultWorkspace = std::size_t{32} << 20;  // policy.workspace_limit == 0
constexpr std::uint32_t kAlignment = 16;
constexpr std::size_t kScratchAlignment = 256;
constexpr std::size_t kDescriptorCacheSize = 256;  // as Note [cuBLASLt descriptors per thread]
constexpr std::int64_t kMaxK = 131071;             // Note [Signed operands of the int8 GEMMs]
constexpr int kMinComputeCapability = 75;          // IMMA (int8 tensor cores): Turing and newer

std::size_t aligned(std::size_t bytes) { return cublas::round_up(bytes, kScratchAlignment); }

using quantized_gemm::Candidate;
using quantized_gemm::Descriptors;

// The GEMM's descriptors (Note [cuBLASLt int8 GEMMs]): A = the weight [N, K] (op T), B = x [M, K] as int8, D = the
// int32 accumulator [M, N], alpha 1 and beta 0 in int32.
Descriptors make_descriptors(const QLinearProblem& q) {
  Descriptors descriptors{MatmulDesc(CUBLAS_COMPUTE_32I, CUDA_R_32I), MatrixLayout(CUDA_R_8I, q.k, q.n, q.k),
                          MatrixLayout(CUDA_R_8I, q.k, q.m, q.k), MatrixLayout(CUDA_R_32I, q.n, q.m, q.n)};
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(CUBLAS_OP_T));
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(CUBLAS_OP_N));
  return descriptors;
}

// Whether the GEMM writes into the output itself (an int32 or float32 output: 4 bytes an element, so the epilogue
// can run in place), or into an accumulator in the workspace.
bool accumulates_in_output(const QLinearProblem& q) {
  return q.out_dtype == DType::kInt32 || q.out_dtype == DType::kFloat32;
}

// Offsets of the plan's parts of the workspace (after cuBLASLt's own `algo_workspace` bytes).
struct WorkspaceLayout {
  std::size_t accumulator = 0, x_signed = 0, prologue = 0, total = 0;
};

WorkspaceLayout workspace_layout(const QLinearProblem& q, std::size_t algo_workspace) {
  WorkspaceLayout layout;
  std::size_t at = aligned(algo_workspace);
  layout.accumulator = at;
  if (!accumulates_in_output(q)) at += aligned(sizeof(std::int32_t) * static_cast<std::size_t>(q.m * q.n));
  layout.x_signed = at;
  if (q.x_unsigned) at += aligned(static_cast<std::size_t>(q.m * q.k));
  layout.prologue = at;
  if (q.needs_prologue(true)) at += q.prologue_bytes();
  layout.total = at;
  return layout;
}

// The heuristic's candidates, in its order, within `limit` bytes of workspace that cublasLtMatmulAlgoCheck passes.
std::vector<Candidate> algorithm_candidates(cublasLtHandle_t handle, const QLinearProblem& q, std::size_t limit) {
  return quantized_gemm::heuristic_candidates(handle, make_descriptors(q), limit, kAlignment, std::nullopt);
}

class QLinearPlan final : public KernelPlan {
 public:
  // An empty output: nothing to run.
  QLinearPlan(QLinearProblem q, int device) : q_(q), device_(device) {}

  QLinearPlan(QLinearProblem q, int device, int compute_capability, const cublasLtMatmulAlgo_t& algo,
              std::size_t algo_workspace)
      : q_(q), device_(device), algo_(algo), has_algo_(true), algo_workspace_(algo_workspace) {
    layout_ = workspace_layout(q_, algo_workspace_);
    const AlgoConfig config = config_of(algo_);
    record_ = make_record(config, compute_capability);
    describe_ = make_describe(config);
  }

  void run(const KernelLaunch& launch) const override {
    if (!has_algo_) return;
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= workspace_bytes(),
                          "the cublasLt qlinear plan needs ", workspace_bytes(), " bytes of workspace, got ",
                          launch.workspace_bytes);
    auto* base = static_cast<unsigned char*>(cublas::align_up(launch.workspace, kScratchAlignment));
    void* out = launch.output(0).data_ptr();
    auto* accumulator = accumulates_in_output(q_) ? out : base + layout_.accumulator;
    auto* x_signed = q_.x_unsigned ? reinterpret_cast<std::int8_t*>(base + layout_.x_signed) : nullptr;
    void* scratch = base + layout_.prologue;
    if (q_.needs_prologue(true)) {
      required_device_kernel(device_kernels().quantized_prologue, "quantized_prologue", "cublasLt qlinear")(
          q_.prologue(launch, scratch, x_signed), q_.n, launch.stream.handle);
    }
    const void* x = x_signed != nullptr ? static_cast<const void*>(x_signed) : launch.input(0).data_ptr();
    const void* weight = launch.input(1).data_ptr();
    check_alignment(x, "x");
    check_alignment(weight, "weight");
    check_alignment(accumulator, "the output");
    const Descriptors& descriptors = thread_descriptors();
    const std::int32_t alpha = 1;
    const std::int32_t beta = 0;
    void* workspace = algo_workspace_ > 0 ? base : nullptr;
    XPURT_CUBLASLT_CHECK(cublasLtMatmul(cublas::thread_cublaslt_handle(device_), descriptors.operation.get(), &alpha,
                                        weight, descriptors.a.get(), x, descriptors.b.get(), &beta, accumulator,
                                        descriptors.d.get(), accumulator, descriptors.d.get(), &algo_, workspace,
                                        algo_workspace_, stream));
    const QuantEpilogueParams epilogue = q_.epilogue(launch, scratch);
    if (q_.out_dtype == DType::kInt32 && epilogue.int_bias == nullptr) return;  // the accumulator is the output
    required_device_kernel(device_kernels().quantized_epilogue, "quantized_epilogue", "cublasLt qlinear")(
        static_cast<const std::int32_t*>(accumulator), out, q_.m * q_.n, q_.n, 1, epilogue, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override { return has_algo_ ? layout_.total + kScratchAlignment : 0; }
  std::string record() const override { return record_; }
  std::string describe() const override { return has_algo_ ? describe_ : "cublasLt qlinear: empty output"; }

 private:
  void check_alignment(const void* pointer, const char* what) const {
    if (cublas::is_aligned(pointer, kAlignment)) return;
    throw InvalidArgumentError(detail::str_cat("the cublasLt qlinear plan was built for ", kAlignment,
                                               "-byte aligned operands (see supports()), but ", what,
                                               " is not; pass aligned tensors or use the dp4a kernel"));
  }

  // This thread's descriptors of this plan (Note [cuBLASLt descriptors per thread] in cublaslt_gemm.cpp).
  const Descriptors& thread_descriptors() const {
    return quantized_gemm::thread_descriptors(id_, kDescriptorCacheSize, [this] { return make_descriptors(q_); });
  }


  std::string make_record(const AlgoConfig& config, int compute_capability) const {
    return quantized_gemm::plan_record(kRecordFormat, algo_, config, "32I", algo_workspace_, compute_capability);
  }


  std::string make_describe(const AlgoConfig& config) const {
    std::string text = detail::str_cat("cublasLt int8 IMMA algo ", config.id, " tile ", enum_name(kTileNames, config.tile),
                                       " stages ", enum_name(kStagesNames, config.stages), " splitK ", config.splitk,
                                       ", m=", q_.m, " n=", q_.n, " k=", q_.k, " int8 x int8 -> int32, workspace ",
                                       algo_workspace_, " B; epilogue (cuda_raw quantized_epilogue): ",
                                       q_.describe_epilogue());
    return text;
  }

  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  std::uint64_t id_ = next_id();
  QLinearProblem q_;
  int device_ = 0;
  cublasLtMatmulAlgo_t algo_{};
  bool has_algo_ = false;
  std::size_t algo_workspace_ = 0;
  WorkspaceLayout layout_;
  std::string record_;
  std::string describe_;
};

[[noreturn]] void throw_bad_record(const std::string& why) {
  throw UnsupportedOperationError(
      detail::str_cat("cannot re-create the cublasLt qlinear plan from its record: ", why,
                      ". Drop the record (e.g. clear the autotune cache entry) to let cuBLASLt choose afresh"));
}

// The algorithm of a record, checked against this GEMM here (cublasLtMatmulAlgoCheck); its workspace.
Candidate candidate_from_record(cublasLtHandle_t handle, const QLinearProblem& q, std::size_t limit,
                                const std::string& text) {
  return quantized_gemm::candidate_from_record(handle, make_descriptors(q), limit, text, kRecordFormat, false,
                                               throw_bad_record);
}

std::size_t workspace_limit_of(const ExecutionPolicy& policy) {
  return policy.workspace_limit == 0 ? kDefaultWorkspace : static_cast<std::size_t>(policy.workspace_limit);
}

KernelDecl qlinear_declaration() {
  KernelDecl decl;
  decl.subject = "cublasLt qlinear";
  decl.input_names = {"x", "weight", "w_scale", "bias", "x_zero_point"};
  decl.on_device = true;
  decl.min_compute_capability = kMinComputeCapability;
  decl.dtypes = DTypeSet{{DType::kInt8, DType::kUInt8, DType::kInt32, DType::kFloat32}, {}};
  decl.layout = Layout::kContiguous;
  return decl;
}

class QLinearKernel final : public Kernel {
 public:
  QLinearKernel()
      : Kernel(KernelInfo{"qlinear", "cublasLt", "cublasLt", DeviceType::kCUDA, true,
                          "cuBLASLt int8 GEMM on the IMMA tensor cores (int32 accumulation, weight [N, K]); the "
                          "epilogue by cuda_raw, rounded as the cpu kernel; heuristic algorithm, recorded in the plan",
                          qlinear_declaration()}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (!desc.device.is_cuda()) return Support::no("cublasLt qlinear runs on CUDA devices");
    if (desc.outputs.empty()) return Support::no("cublasLt needs the op's outputs inferred first");
    const QLinearProblem q = QLinearProblem::of(desc);
    if (!q.weight_nk) {
      return Support::no("cuBLASLt's int8 GEMM takes only K-contiguous operands (the 'TN' form, Note [cuBLASLt int8 "
                         "GEMMs]), and this weight is [K, N] (weight_layout=kn); the quantized_fusion pass lays "
                         "constant weights out [N, K]; the dp4a kernel takes both");
    }
    if (q.k == 0) return Support::no("K = 0: there is no product for cuBLASLt (the dp4a kernel writes the epilogue)");
    if (q.k % 4 != 0 || q.n % 4 != 0) {
      return Support::no(detail::str_cat("cuBLASLt's int8 GEMM needs K and N multiples of 4, got K = ", q.k,
                                         " and N = ", q.n, "; the dp4a kernel takes any"));
    }
    if (q.k > kMaxK) {
      return Support::no(detail::str_cat("K = ", q.k, " is above ", kMaxK, ", where int8 sums can overflow int32 "
                                         "(the dp4a kernel wraps as the cpu kernel does)"));
    }
    for (std::size_t j = 0; j < 2; ++j) {
      if (desc.inputs[j].alignment < kAlignment && desc.inputs[j].numel() > 0) {
        return Support::no(detail::str_cat("cublasLt qlinear plans are built for ", kAlignment, "-byte aligned x and "
                                           "weight, but '", j == 0 ? "x" : "weight", "' is only ",
                                           desc.inputs[j].alignment, "-byte aligned; the dp4a kernel takes any"));
      }
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    const QLinearProblem q = QLinearProblem::of(desc);
    const int device = desc.device.index;
    if (q.m == 0 || q.n == 0) {
      if (!record.empty()) throw_bad_record("it names an algorithm, but this output is empty");
      return std::make_unique<QLinearPlan>(q, device);
    }
    const std::size_t limit = workspace_limit_of(policy);
    const cublasLtHandle_t handle = cublas::thread_cublaslt_handle(device);
    Candidate chosen;
    if (!record.empty()) {
      chosen = candidate_from_record(handle, q, limit, record);
    } else {
      const std::vector<Candidate> valid = algorithm_candidates(handle, q, limit);
      if (valid.empty()) {
        throw UnsupportedOperationError(detail::str_cat(
            "cuBLASLt has no int8 algorithm for this GEMM (m=", q.m, " n=", q.n, " k=", q.k, ") within ", limit,
            " bytes of workspace on sm", desc.compute_capability, "; the dp4a kernel takes it"));
      }
      chosen = valid.front();
    }
    return std::make_unique<QLinearPlan>(q, device, desc.compute_capability, chosen.algo, chosen.workspace);
  }

  // The heuristic's other valid algorithms (Note [Tactics] in dispatcher.cpp).
  std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    const QLinearProblem q = QLinearProblem::of(desc);
    if (q.m == 0 || q.n == 0) return {};
    const cublasLtHandle_t handle = cublas::thread_cublaslt_handle(desc.device.index);
    std::vector<std::string> records;
    for (const Candidate& c : algorithm_candidates(handle, q, workspace_limit_of(policy))) {
      records.push_back(QLinearPlan(q, desc.device.index, desc.compute_capability, c.algo, c.workspace).record());
    }
    return records;
  }
};

}  // namespace

std::unique_ptr<Kernel> make_qlinear_kernel() { return std::make_unique<QLinearKernel>(); }

}  // namespace xpuruntime::cublaslt
