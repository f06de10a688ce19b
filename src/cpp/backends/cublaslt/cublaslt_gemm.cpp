// The "cublasLt" kernel of matmul and linear: one cublasLtMatmul per op, with linear's bias and activation fused
// into the GEMM's epilogue where cuBLASLt has that epilogue, the algorithm chosen by
// cublasLtMatmulAlgoGetHeuristic at build time, recorded in the plan, and re-created from the record.
//
// Note [cuBLASLt plan record]
// KernelPlan::record() is one JSON object (keys sorted, compact):
//   format            "xpuruntime.cublasLt.v1"
//   algo              the 8 uint64 words of cublasLtMatmulAlgo_t, as "0x%016x" strings: the algorithm itself
//   algo_id, tile, tile_id, stages, stages_id, splitk, reduction_scheme, swizzle, custom_option,
//   inner_shape_id, cluster_shape_id
//                     the readable configuration (cublasLtMatmulAlgoConfigGetAttribute), for people and diffs
//   epilogue          "DEFAULT", "BIAS", "RELU", "RELU_BIAS", "GELU", "GELU_BIAS"
//   post_bias, post_activation
//                     what the cuda_raw bias_activation kernel does after the GEMM (exact GELU, or a fallback
//                     when cuBLASLt had no algorithm for the fused epilogue)
//   compute_type      "32F" or "32F_FAST_TF32"
//   reduction_schemes the split-K reductions the plan allowed ("none" / "none|compute_type" / "any")
//   deterministic     whether the plan was built for a deterministic policy
//   workspace_bytes   what the algorithm needs
//   cublaslt_version, compute_capability
//                     where the record was made (informational: cublasLtMatmulAlgoCheck decides whether a
//                     record still fits)
// build(desc, policy, record) restores the algorithm words, re-creates the descriptors for `desc`, and asks
// cublasLtMatmulAlgoCheck whether that algorithm can run them here; if not (another GPU, another cuBLASLt, a
// changed policy) it throws UnsupportedOperationError saying so. The re-created plan has the same record and
// gives the same bits.
//
// Note [cuBLASLt descriptors per thread]
// The matmul descriptor carries the bias pointer, which changes from run to run, and cuBLASLt does not document
// its descriptors as safe to share between threads. Plans must run concurrently, so a plan keeps plain values
// (shapes, epilogue, algorithm), and each thread keeps its own descriptors of each plan it runs: a thread-local
// cache keyed by the plan's id (unique for the process's life, so a plan built at a freed one's address never
// finds stale descriptors), filled on the thread's first run of the plan and emptied whenever it reaches
// kDescriptorCacheSize plans. A run only sets the bias pointer on them, instead of creating and destroying four
// descriptors (host time that counts when the GEMM itself takes microseconds).
//
// Note [cuBLASLt alignment]
// Heuristics assume the operands are 256-byte aligned unless told otherwise, and a plan is cached by a signature
// that only distinguishes alignments below 16 bytes. So plans are built for exactly 16-byte alignment
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES = 16), supports() requires 16-byte aligned inputs, and run()
// checks the actual pointers. The heuristic also infers the bias vector's alignment from the (never
// dereferenced) bias pointer value in the descriptor, so at build time it is set to the address 16.
//
// Note [cuBLASLt determinism and split-K]
// cuBLASLt may split the K dimension and add the partial products in a second step (the reduction scheme). Per
// cublasLt.h every scheme is ordered (INPLACE uses counters "to guarantee the sequentiality"), but the library
// does not promise bit-reproducibility across split-K configurations in its documentation, so a deterministic
// policy allows no split-K at all (reduction scheme NONE), both in the heuristic's preference and when checking
// a recorded algorithm. Independently, fp16 / bf16 GEMMs never use the INPLACE and OUTPUT_TYPE schemes, which
// add partial sums in the 16-bit output type: every GEMM here accumulates in fp32 (docs/ops.md).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cublaslt/cublaslt_common.h"
#include "core/cublas_utils.h"
#include "core/device_kernels.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cublaslt {

namespace {

using cublas::GemmShape;

constexpr const char* kRecordFormat = "xpuruntime.cublasLt.v1";
constexpr std::size_t kDefaultWorkspace = std::size_t{32} << 20;  // policy.workspace_limit == 0
constexpr int kHeuristicCandidates = 8;
constexpr std::uint32_t kAlignment = 16;  // see Note [cuBLASLt alignment]
constexpr std::size_t kWorkspaceAlignment = 256;
constexpr std::size_t kDescriptorCacheSize = 256;  // plans per thread, see Note [cuBLASLt descriptors per thread]

// ---- the problem ----

// What runs after (or instead of) the fused epilogue.
struct Epilogue {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool post_bias = false;                // the cuda_raw kernel adds the bias
  std::string post_activation = "none";  // ... and applies this activation
  bool fused_bias() const {
    return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
           epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  bool has_post() const { return post_bias || post_activation != "none"; }
  // linear_grad_weight's bias gradient: the sum of B over k, written to the bias pointer.
  bool bias_gradient() const { return epilogue == CUBLASLT_EPILOGUE_BGRADB; }
  bool uses_bias_pointer() const { return fused_bias() || bias_gradient(); }
};

const char* epilogue_name(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_RELU:
      return "RELU";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU:
      return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    default:
      return "OTHER";
  }
}

// The ways to run (bias?, activation): the fused one first, then the all-after-the-GEMM fallback (when the
// fused one fuses anything). cuBLASLt's GELU epilogue is the tanh approximation, so exact "gelu" fuses only the
// bias and applies the erf form afterwards.
std::vector<Epilogue> epilogue_options(bool has_bias, const std::string& activation) {
  Epilogue fused;
  if (activation == "relu") {
    fused.epilogue = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  } else if (activation == "gelu_tanh") {
    fused.epilogue = has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  } else {
    fused.epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    fused.post_activation = activation;  // "none" or the exact "gelu"
  }
  std::vector<Epilogue> options = {fused};
  if (fused.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    Epilogue fallback;
    fallback.post_bias = has_bias;
    fallback.post_activation = activation;
    options.push_back(fallback);
  }
  return options;
}

struct Problem {
  std::string op;  // "matmul", "linear" or "linear_grad_weight"
  GemmShape shape;
  DType dtype = DType::kFloat32;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  bool has_bias = false;
  bool has_residual = false;  // linear's residual: cuBLASLt's C, added with beta = 1 before the epilogue
  std::string activation = "none";
  bool deterministic = false;
  std::uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  int device = 0;
  int compute_capability = 0;

  // Nothing for cuBLASLt to do: an empty output, or K = 0 (zeros, then bias and activation).
  bool degenerate() const { return shape.empty() || shape.k == 0; }
  bool grad_weight() const { return op == "linear_grad_weight"; }
};

// The ways to run `problem`: linear_grad_weight sums its bias gradient in the BGRADB epilogue (one GEMM, no
// separate reduction) or has no bias output; matmul and linear: epilogue_options above.
std::vector<Epilogue> epilogue_options(const Problem& problem) {
  if (problem.grad_weight()) {
    Epilogue only;
    only.epilogue = problem.has_bias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    return {only};
  }
  return epilogue_options(problem.has_bias, problem.activation);
}

std::uint32_t reduction_mask(DType dtype, bool deterministic) {
  if (deterministic) return CUBLASLT_REDUCTION_SCHEME_NONE;  // Note [cuBLASLt determinism and split-K]
  if (dtype != DType::kFloat32) {
    return static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE) |
           static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  }
  return CUBLASLT_REDUCTION_SCHEME_MASK;
}

std::string reduction_mask_name(std::uint32_t mask) {
  if (mask == CUBLASLT_REDUCTION_SCHEME_NONE) return "none";
  if (mask == CUBLASLT_REDUCTION_SCHEME_MASK) return "any";
  return "none|compute_type";
}

Problem make_problem(const OpDescriptor& desc, const ExecutionPolicy& policy) {
  Problem problem;
  problem.op = desc.op;
  const bool linear = desc.op == "linear";
  if (problem.grad_weight()) {
    problem.shape = cublas::linear_grad_weight_shape(desc);
  } else {
    problem.shape = linear ? cublas::linear_shape(desc) : cublas::matmul_shape(desc);
  }
  problem.dtype = desc.inputs[0].dtype;
  problem.compute = cublas::compute_type(problem.dtype, desc.precision);
  problem.has_bias = problem.grad_weight() ? desc.attrs.get_int("bias", 0) == 1
                                           : linear && desc.inputs.size() > 2 && desc.inputs[2].present;
  problem.has_residual = linear && desc.inputs.size() > 3 && desc.inputs[3].present;
  problem.activation = linear ? desc.attrs.get_string("activation", "none") : "none";
  problem.deterministic = desc.deterministic || policy.deterministic;
  problem.reduction_mask = reduction_mask(problem.dtype, problem.deterministic);
  problem.device = desc.device.index;
  problem.compute_capability = desc.compute_capability;
  return problem;
}

// The descriptors of one cublasLtMatmul call (Note [Row-major GEMM through column-major cuBLAS]): A is our
// right operand, B our left one, C = D the output (beta = 0).
struct Descriptors {
  MatmulDesc operation;
  MatrixLayout a;
  MatrixLayout b;
  MatrixLayout d;
};

Descriptors make_descriptors(const Problem& problem, const Epilogue& epilogue, const void* bias) {
  const GemmShape& s = problem.shape;
  const cudaDataType_t type = cublas::cuda_data_type(problem.dtype);
  Descriptors descriptors{
      MatmulDesc(problem.compute, CUDA_R_32F),
      s.transpose_lhs ? MatrixLayout(type, s.k, s.m, s.ld_lhs) : MatrixLayout(type, s.m, s.k, s.ld_lhs),
      s.transpose_rhs ? MatrixLayout(type, s.n, s.k, s.ld_rhs) : MatrixLayout(type, s.k, s.n, s.ld_rhs),
      MatrixLayout(type, s.m, s.n, s.ld_out),
  };
  const auto transa = static_cast<std::int32_t>(s.transpose_lhs ? CUBLAS_OP_T : CUBLAS_OP_N);
  const auto transb = static_cast<std::int32_t>(s.transpose_rhs ? CUBLAS_OP_T : CUBLAS_OP_N);
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_TRANSA, transa);
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_TRANSB, transb);
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(epilogue.epilogue));
  if (epilogue.uses_bias_pointer()) {
    descriptors.operation.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(type));
    descriptors.operation.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  if (s.batch > 1) {
    descriptors.a.set_batch(s.batch, s.stride_lhs);
    descriptors.b.set_batch(s.batch, s.stride_rhs);
    descriptors.d.set_batch(s.batch, s.stride_out);
  }
  return descriptors;
}

// The heuristic needs a bias pointer value to infer its alignment (Note [cuBLASLt alignment]).
const void* build_time_bias_pointer() { return reinterpret_cast<const void*>(std::uintptr_t{kAlignment}); }

std::size_t workspace_limit_of(const ExecutionPolicy& policy) {
  return policy.workspace_limit == 0 ? kDefaultWorkspace : static_cast<std::size_t>(policy.workspace_limit);
}

// ---- the plan ----

class LtPlan final : public KernelPlan {
 public:
  // A degenerate problem (empty output or K = 0): no algorithm.
  explicit LtPlan(Problem problem) : problem_(std::move(problem)) {}

  LtPlan(Problem problem, Epilogue epilogue, const cublasLtMatmulAlgo_t& algo, std::size_t algo_workspace)
      : problem_(std::move(problem)),
        epilogue_(std::move(epilogue)),
        algo_(algo),
        has_algo_(true),
        algo_workspace_(algo_workspace) {
    config_ = config_of(algo_);
    record_ = make_record();
    describe_ = make_describe();
  }

  void run(const KernelLaunch& launch) const override {
    const GemmShape& s = problem_.shape;
    if (s.empty()) return;
    detail::CudaDeviceGuard guard(problem_.device);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    Tensor& out = launch.output(0);
    if (problem_.grad_weight()) {
      run_grad_weight(launch, stream);
      return;
    }
    const void* bias = problem_.has_bias ? launch.input(2).data_ptr() : nullptr;
    const void* residual = problem_.has_residual ? launch.input(3).data_ptr() : nullptr;
    if (!has_algo_) {
      // K = 0: the product is all zeros (the residual, if any); the bias and the activation still apply.
      if (residual != nullptr) {
        XPURT_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), residual, out.nbytes(), cudaMemcpyDeviceToDevice, stream));
      } else {
        XPURT_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream));
      }
      if (problem_.has_bias || problem_.activation != "none") {
        required_device_kernel(device_kernels().bias_activation, "bias_activation", "cublasLt linear")(
            out.data_ptr(), bias, problem_.dtype, s.n, s.m, problem_.activation, launch.stream.handle);
      }
      return;
    }
    const void* lhs = launch.input(1).data_ptr();  // cuBLAS's A: our right operand
    const void* rhs = launch.input(0).data_ptr();  // cuBLAS's B: our left operand
    check_alignment(lhs, 1);
    check_alignment(rhs, 0);
    check_alignment(out.data_ptr(), -1);
    if (epilogue_.fused_bias()) check_alignment(bias, 2);
    if (residual != nullptr) check_alignment(residual, 3);
    matmul(launch, lhs, rhs, out.data_ptr(), bias, stream, residual);
    if (epilogue_.has_post()) {
      required_device_kernel(device_kernels().bias_activation, "bias_activation", "cublasLt linear")(
          out.data_ptr(), epilogue_.post_bias ? bias : nullptr, problem_.dtype, s.n, s.m, epilogue_.post_activation,
          launch.stream.handle);
    }
  }

  std::size_t workspace_bytes() const override {
    return algo_workspace_ > 0 ? algo_workspace_ + kWorkspaceAlignment : 0;
  }
  std::string record() const override { return record_; }
  std::string describe() const override {
    if (!has_algo_) {
      return problem_.shape.empty() ? "cublasLt: empty output, nothing to run"
                                    : "cublasLt: K = 0, the output is zeros (+ bias / activation by cuda_raw)";
    }
    return describe_;
  }

 private:
  // linear_grad_weight: grad_weight (output 0) = grad^T @ x, and with a bias output the bias gradient (output 1)
  // summed over M by the BGRADB epilogue in the same call.
  void run_grad_weight(const KernelLaunch& launch, cudaStream_t stream) const {
    Tensor& out = launch.output(0);
    void* bias = problem_.has_bias ? launch.output(1).data_ptr() : nullptr;
    if (!has_algo_) {  // M = 0: both gradients are zeros
      XPURT_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream));
      if (bias != nullptr) XPURT_CUDA_CHECK(cudaMemsetAsync(bias, 0, launch.output(1).nbytes(), stream));
      return;
    }
    const void* lhs = launch.input(1).data_ptr();  // cuBLAS's A: x as stored
    const void* rhs = launch.input(0).data_ptr();  // cuBLAS's B: grad, transposed
    check_alignment(lhs, 1);
    check_alignment(rhs, 0);
    check_alignment(out.data_ptr(), -1);
    if (bias != nullptr) check_alignment(bias, -1);
    matmul(launch, lhs, rhs, out.data_ptr(), bias, stream);
  }

  // One cublasLtMatmul of this plan's algorithm: out = lhs-op-rhs (+ `residual`, cuBLASLt's C with beta = 1, laid
  // out as the output) with `bias` the epilogue's bias pointer.
  void matmul(const KernelLaunch& launch, const void* lhs, const void* rhs, void* out, const void* bias,
              cudaStream_t stream, const void* residual = nullptr) const {
    void* workspace = nullptr;
    if (algo_workspace_ > 0) {
      XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= workspace_bytes(),
                            "the cublasLt plan needs ", workspace_bytes(), " bytes of workspace, got ",
                            launch.workspace_bytes);
      workspace = cublas::align_up(launch.workspace, kWorkspaceAlignment);
    }
    const cublasLtHandle_t handle = cublas::thread_cublaslt_handle(problem_.device);
    const Descriptors& descriptors = thread_descriptors(bias);  // Note [cuBLASLt descriptors per thread]
    const float alpha = 1.0f;
    const float beta = residual != nullptr ? 1.0f : 0.0f;
    XPURT_CUBLASLT_CHECK(cublasLtMatmul(handle, descriptors.operation.get(), &alpha, lhs, descriptors.a.get(), rhs,
                                        descriptors.b.get(), &beta, residual != nullptr ? residual : out,
                                        descriptors.d.get(), out, descriptors.d.get(),
                                        &algo_, workspace, algo_workspace_, stream));
  }

  // This thread's descriptors of this plan, with `bias` as the bias pointer (Note [cuBLASLt descriptors per thread]).
  const Descriptors& thread_descriptors(const void* bias) const {
    thread_local std::unordered_map<std::uint64_t, std::unique_ptr<Descriptors>> cache;
    const auto found = cache.find(id_);
    if (found != cache.end()) {
      if (epilogue_.uses_bias_pointer()) found->second->operation.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
      return *found->second;
    }
    if (cache.size() >= kDescriptorCacheSize) cache.clear();
    auto descriptors = std::make_unique<Descriptors>(make_descriptors(problem_, epilogue_, bias));
    return *cache.emplace(id_, std::move(descriptors)).first->second;
  }

  // `index`: the input checked (schema order), -1 for the output. See Note [cuBLASLt alignment].
  void check_alignment(const void* pointer, int index) const {
    if (cublas::is_aligned(pointer, kAlignment)) return;
    std::size_t alignment = 1;
    while (alignment < kAlignment && cublas::is_aligned(pointer, alignment * 2)) alignment *= 2;
    const std::string what =
        index < 0 ? std::string("the output")
                  : detail::str_cat("input '", cublas::input_name(problem_.op, static_cast<std::size_t>(index)), "'");
    throw InvalidArgumentError(
        detail::str_cat("the cublasLt plan was built for ", kAlignment, "-byte aligned operands (see supports()), but ",
                        what, " is only ", alignment, "-byte aligned; pass aligned tensors or use the cublas kernel"));
  }

  std::string make_record() const {
    nlohmann::json record;
    nlohmann::json words = nlohmann::json::array();
    for (const std::uint64_t word : algo_.data) {
      char text[24];
      std::snprintf(text, sizeof(text), "0x%016" PRIx64, word);
      words.push_back(text);
    }
    record["format"] = kRecordFormat;
    record["algo"] = words;
    record["algo_id"] = config_.id;
    record["tile"] = enum_name(kTileNames, config_.tile);
    record["tile_id"] = config_.tile;
    record["stages"] = enum_name(kStagesNames, config_.stages);
    record["stages_id"] = config_.stages;
    record["splitk"] = config_.splitk;
    record["reduction_scheme"] = reduction_scheme_name(config_.reduction_scheme);
    record["swizzle"] = config_.swizzle;
    record["custom_option"] = config_.custom_option;
    record["inner_shape_id"] = config_.inner_shape;
    record["cluster_shape_id"] = config_.cluster_shape;
    record["epilogue"] = epilogue_name(epilogue_.epilogue);
    record["post_bias"] = epilogue_.post_bias;
    record["post_activation"] = epilogue_.post_activation;
    record["compute_type"] = cublas::compute_type_name(problem_.compute);
    record["reduction_schemes"] = reduction_mask_name(problem_.reduction_mask);
    record["deterministic"] = problem_.deterministic;
    record["workspace_bytes"] = algo_workspace_;
    record["cublaslt_version"] = cublasLtGetVersion();
    record["compute_capability"] = problem_.compute_capability;
    return record.dump();
  }

  std::string make_describe() const {
    std::string text = detail::str_cat("cublasLt algo ", config_.id, " tile ", enum_name(kTileNames, config_.tile),
                                       " stages ", enum_name(kStagesNames, config_.stages), " splitK ", config_.splitk);
    if (config_.splitk > 1) text += detail::str_cat(" reduction ", reduction_scheme_name(config_.reduction_scheme));
    text += detail::str_cat(" swizzle ", config_.swizzle, " custom ", config_.custom_option, " epilogue ",
                            epilogue_name(epilogue_.epilogue));
    if (epilogue_.has_post()) {
      text += detail::str_cat(" + cuda_raw bias_activation(", epilogue_.post_bias ? "bias, " : "",
                              epilogue_.post_activation, ")");
      if (epilogue_.post_activation == "gelu")
        text += " [exact erf GELU: cuBLASLt's GELU epilogue is the tanh form]";
      else if (epilogue_.epilogue == CUBLASLT_EPILOGUE_DEFAULT)
        text += " [no cuBLASLt algorithm for the fused epilogue]";
    }
    const GemmShape& s = problem_.shape;
    text += detail::str_cat(", m=", s.m, " n=", s.n, " k=", s.k);
    if (s.batch > 1) text += detail::str_cat(" batch ", s.batch);
    text += detail::str_cat(" ", dtype_name(problem_.dtype), " compute ", cublas::compute_type_name(problem_.compute),
                            ", workspace ", algo_workspace_, " B");
    if (problem_.deterministic) text += ", deterministic (no split-K)";
    return text;
  }

  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  std::uint64_t id_ = next_id();  // Note [cuBLASLt descriptors per thread]
  Problem problem_;
  Epilogue epilogue_;
  cublasLtMatmulAlgo_t algo_{};
  bool has_algo_ = false;
  std::size_t algo_workspace_ = 0;
  AlgoConfig config_;
  std::string record_;
  std::string describe_;
};

// ---- the kernel ----

struct Candidate {
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
};

// The heuristic's candidates, in its order, that fit the workspace limit and the reduction mask and pass
// cublasLtMatmulAlgoCheck; empty when there is none.
std::vector<Candidate> algorithm_candidates(cublasLtHandle_t handle, const Problem& problem, const Epilogue& epilogue,
                                            std::size_t limit) {
  std::vector<Candidate> valid;
  const Descriptors descriptors = make_descriptors(problem, epilogue, build_time_bias_pointer());
  Preference preference;
  preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(limit));
  preference.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, problem.reduction_mask);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, kAlignment);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, kAlignment);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, kAlignment);
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, kAlignment);
  std::array<cublasLtMatmulHeuristicResult_t, kHeuristicCandidates> results{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, descriptors.operation.get(), descriptors.a.get(), descriptors.b.get(), descriptors.d.get(),
      descriptors.d.get(), preference.get(), kHeuristicCandidates, results.data(), &returned);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return valid;  // no algorithm at all for this problem
  XPURT_CUBLASLT_CHECK(status);
  for (int j = 0; j < returned; ++j) {
    const cublasLtMatmulHeuristicResult_t& result = results[static_cast<std::size_t>(j)];
    if (result.state != CUBLAS_STATUS_SUCCESS || result.workspaceSize > limit) continue;
    if (!reduction_allowed(config_of(result.algo), problem.reduction_mask)) continue;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(handle, descriptors.operation.get(), descriptors.a.get(), descriptors.b.get(),
                                descriptors.d.get(), descriptors.d.get(), &result.algo,
                                &check) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    Candidate candidate;
    candidate.algo = result.algo;
    candidate.workspace = std::max(result.workspaceSize, check.workspaceSize);
    if (candidate.workspace > limit) continue;
    valid.push_back(candidate);
  }
  return valid;
}

// The heuristic's first valid candidate (algorithm_candidates); false when there is none.
bool choose_algorithm(cublasLtHandle_t handle, const Problem& problem, const Epilogue& epilogue, std::size_t limit,
                      Candidate* chosen) {
  const std::vector<Candidate> valid = algorithm_candidates(handle, problem, epilogue, limit);
  if (valid.empty()) return false;
  *chosen = valid.front();
  return true;
}

[[noreturn]] void throw_bad_record(const std::string& why) {
  throw UnsupportedOperationError(
      detail::str_cat("cannot re-create the cublasLt plan from its record: ", why,
                      ". Drop the record (e.g. clear the autotune cache entry) to let cuBLASLt choose afresh"));
}

std::unique_ptr<KernelPlan> plan_from_record(cublasLtHandle_t handle, Problem problem, std::size_t limit,
                                             const std::string& text) {
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_bad_record(detail::str_cat("it is not JSON (", e.what(), ")"));
  }
  if (!record.is_object() || record.value("format", std::string()) != kRecordFormat) {
    throw_bad_record(detail::str_cat("it is not a record of format ", kRecordFormat, ": ", text));
  }
  cublasLtMatmulAlgo_t algo{};
  std::string epilogue_text;
  std::string compute_text;
  std::size_t recorded_workspace = 0;
  std::size_t recorded_version = 0;
  int recorded_cc = 0;
  try {
    const auto& words = record.at("algo");
    if (!words.is_array() || words.size() != 8) throw_bad_record("'algo' must hold 8 words");
    for (std::size_t j = 0; j < 8; ++j) algo.data[j] = std::stoull(words[j].get<std::string>(), nullptr, 16);
    epilogue_text = record.at("epilogue").get<std::string>();
    compute_text = record.at("compute_type").get<std::string>();
    recorded_workspace = record.at("workspace_bytes").get<std::size_t>();
    recorded_version = record.value("cublaslt_version", std::size_t{0});
    recorded_cc = record.value("compute_capability", 0);
  } catch (const nlohmann::json::exception& e) {
    throw_bad_record(detail::str_cat("a field is missing or of the wrong type (", e.what(), ")"));
  } catch (const std::logic_error& e) {  // std::stoull: not a hex number
    throw_bad_record(detail::str_cat("an 'algo' word is not a hex number (", e.what(), ")"));
  }
  if (compute_text != cublas::compute_type_name(problem.compute)) {
    throw_bad_record(detail::str_cat("it was made for compute type ", compute_text, " but this op needs ",
                                     cublas::compute_type_name(problem.compute), " (the precision policy differs)"));
  }
  const std::vector<Epilogue> options = epilogue_options(problem);
  const auto match = std::find_if(options.begin(), options.end(),
                                  [&](const Epilogue& e) { return epilogue_text == epilogue_name(e.epilogue); });
  if (match == options.end()) {
    throw_bad_record(detail::str_cat("it uses epilogue ", epilogue_text, ", which does not compute this op (",
                                     problem.has_bias ? "bias, " : "no bias, ", "activation ", problem.activation,
                                     ")"));
  }
  const AlgoConfig config = config_of(algo);
  if (!reduction_allowed(config, problem.reduction_mask)) {
    throw_bad_record(detail::str_cat("its algorithm splits K ", config.splitk, " ways with reduction scheme ",
                                     reduction_scheme_name(config.reduction_scheme), ", which this policy excludes (",
                                     problem.deterministic ? "deterministic: no split-K" : "fp32 accumulation", ")"));
  }
  const Descriptors descriptors = make_descriptors(problem, *match, build_time_bias_pointer());
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t status =
      cublasLtMatmulAlgoCheck(handle, descriptors.operation.get(), descriptors.a.get(), descriptors.b.get(),
                              descriptors.d.get(), descriptors.d.get(), &algo, &check);
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw_bad_record(
        detail::str_cat("cublasLtMatmulAlgoCheck rejects its algorithm (algo ", config.id, ", tile ",
                        enum_name(kTileNames, config.tile), ") for this GEMM: ", cublas::status_name(status),
                        "; the record was made with cuBLASLt ", recorded_version, " on sm", recorded_cc,
                        ", this is cuBLASLt ", cublasLtGetVersion(), " on sm", problem.compute_capability));
  }
  const std::size_t workspace = std::max(recorded_workspace, check.workspaceSize);
  if (workspace > limit) {
    throw_bad_record(detail::str_cat("its algorithm needs ", workspace,
                                     " bytes of workspace, above the policy's "
                                     "limit of ",
                                     limit, " bytes"));
  }
  return std::make_unique<LtPlan>(std::move(problem), *match, algo, workspace);
}

const char* summary_of(const std::string& op) {
  if (op == "linear") {
    return "cuBLASLt GEMM with fused bias / ReLU / GELU(tanh) epilogues; heuristic algorithm, recorded in the plan";
  }
  if (op == "linear_grad_weight") {
    return "cuBLASLt GEMM grad^T @ x with the bias gradient summed in its BGRADB epilogue (one call); heuristic "
           "algorithm, recorded in the plan";
  }
  return "cuBLASLt GEMM (one strided batch, broadcast by stride 0); heuristic algorithm, recorded in the plan";
}

class LtGemmKernel final : public Kernel {
 public:
  explicit LtGemmKernel(const std::string& op)
      : Kernel(KernelInfo{op, "cublasLt", "cublasLt", DeviceType::kCUDA, true,
                          summary_of(op), cublas::gemm_declaration(op, "cublasLt")}) {}

  // The library's first use (its handle, kernel modules and heuristic: about 100 ms on an H200) through one
  // float16 matmul; the other GEMM ops of this backend then find it loaded.
  std::optional<OpDescriptor> warm_up(Device device) const override {
    if (op() != "matmul") return std::nullopt;
    OpDescriptor desc;
    desc.op = "matmul";
    desc.device = device;
    for (int k = 0; k < 2; ++k) desc.inputs.push_back(TensorDesc::contiguous({64, 64}, DType::kFloat16, device));
    return desc;
  }

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (Support device = cublas::check_gemm_device(desc, "cublasLt"); !device) return device;
    if (desc.outputs.empty()) return Support::no("cublasLt needs the op's outputs inferred first");
    if (op() == "matmul") {
      if (desc.inputs.size() < 2 || desc.inputs[0].dim() < 2 || desc.inputs[1].dim() < 2) {
        return Support::no("cublasLt matmul needs a[..., M, K] and b[..., K, N]");
      }
      if (cublas::matmul_outer_launches(desc) > 1) {
        return Support::no(detail::str_cat("cublasLt runs one strided batch, but the batch dims of a ",
                                           cublas::shape_str(desc.inputs[0].shape), " and b ",
                                           cublas::shape_str(desc.inputs[1].shape),
                                           " broadcast against each other in different dims; "
                                           "the cublas kernel loops over them"));
      }
      const GemmShape shape = cublas::matmul_shape(desc);
      if (shape.batch > INT32_MAX) {
        return Support::no(detail::str_cat("cublasLt takes a 32-bit batch count; this matmul has ", shape.batch));
      }
    } else if (op() == "linear_grad_weight") {
      if (desc.inputs.size() != 2 || desc.inputs[0].dim() < 1) {
        return Support::no("cublasLt linear_grad_weight needs grad[..., N] and x[..., K]");
      }
      if (Support fits = cublas::check_int32(cublas::linear_grad_weight_shape(desc), "cublasLt"); !fits) return fits;
      if (desc.inputs[1].shape.back() == 0 && desc.attrs.get_int("bias", 0) == 1) {
        return Support::no("cublasLt linear_grad_weight sums the bias gradient in the GEMM's epilogue, and x has no "
                           "features (K = 0), so there is no GEMM to run it in");
      }
    } else if (desc.inputs.size() < 2 || desc.inputs[0].dim() < 1 || desc.inputs[1].dim() != 2) {
      return Support::no("cublasLt linear needs x[..., K] and weight[N, K] or [K, N]");
    }
    for (std::size_t j = 0; j < desc.inputs.size(); ++j) {
      const TensorDesc& input = desc.inputs[j];
      if (input.present && input.alignment < kAlignment && input.numel() > 0) {
        return Support::no(
            detail::str_cat("cublasLt plans are built for ", kAlignment,
                            "-byte aligned operands (its fast fp16/bf16 tensor-core "
                            "kernels load 16 bytes at a time), but '",
                            cublas::input_name(desc.op, j), "' is only ", input.alignment,
                            "-byte aligned (a view at an offset?); the cublas kernel takes any alignment"));
      }
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    Problem problem = make_problem(desc, policy);
    if (problem.degenerate()) {
      if (!record.empty()) {
        throw_bad_record("it names an algorithm, but this GEMM is empty (K = 0 or an empty output) and runs none");
      }
      return std::make_unique<LtPlan>(std::move(problem));
    }
    const std::size_t limit = workspace_limit_of(policy);
    const cublasLtHandle_t handle = cublas::thread_cublaslt_handle(problem.device);
    if (!record.empty()) return plan_from_record(handle, std::move(problem), limit, record);

    for (const Epilogue& epilogue : epilogue_options(problem)) {
      Candidate chosen;
      if (choose_algorithm(handle, problem, epilogue, limit, &chosen)) {
        return std::make_unique<LtPlan>(std::move(problem), epilogue, chosen.algo, chosen.workspace);
      }
    }
    const GemmShape& s = problem.shape;
    throw UnsupportedOperationError(detail::str_cat(
        "cuBLASLt has no algorithm for this GEMM (m=", s.m, " n=", s.n, " k=", s.k, " batch ", s.batch,
        s.batch > 1 && (s.stride_lhs == 0 || s.stride_rhs == 0) ? " with a broadcast (stride 0) operand" : "", ", ",
        dtype_name(problem.dtype), ", compute ", cublas::compute_type_name(problem.compute), ") within ", limit,
        " bytes of workspace", problem.deterministic ? " without split-K (deterministic policy)" : "", " on sm",
        problem.compute_capability, "; use the cublas kernel (KernelPolicy matmul=\"cublas\")"));
  }

  // The records of the heuristic's other valid algorithms for the fused epilogue (Note [Tactics] in
  // dispatcher.cpp): build() takes each back through plan_from_record.
  std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    Problem problem = make_problem(desc, policy);
    if (problem.degenerate()) return {};
    const cublasLtHandle_t handle = cublas::thread_cublaslt_handle(problem.device);
    const Epilogue epilogue = epilogue_options(problem).front();
    std::vector<std::string> records;
    for (const Candidate& c : algorithm_candidates(handle, problem, epilogue, workspace_limit_of(policy))) {
      records.push_back(LtPlan(problem, epilogue, c.algo, c.workspace).record());
    }
    return records;
  }
};

}  // namespace

std::unique_ptr<Kernel> make_gemm_kernel(const std::string& op) { return std::make_unique<LtGemmKernel>(op); }

}  // namespace xpuruntime::cublaslt
