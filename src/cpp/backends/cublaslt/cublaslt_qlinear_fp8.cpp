// The "cublasLt" kernel of the float8 op qlinear_fp8 (Note [Float8 quantized linear] in core/op_schemas.cpp): x and
// the [N, K] weight, both float8e4m3fn, multiplied on the float8 tensor cores (sm_89+) into a float32 accumulator,
// then this backend's epilogue kernel (cublaslt_fp8_epilogue.cu) applies the scales, the bias, the relu and the
// output's rounding.
//
// Note [cuBLASLt float8 GEMMs]
// cuBLASLt runs float8 GEMMs (cublasLtMatmul(), "FP8" requirements) only as "TN" (A transposed, B not: both operands
// K-contiguous), with the leading dimensions of the float8 operands multiples of 16 elements and every pointer
// 16-byte aligned. Row-major y[M, N] = x[M, K] @ w^T read column-major is y^T = w (op T) @ x^T, so A = the weight
// [N, K] (weight_layout=nk, as the quantized_fusion pass lays out every constant weight) with lda = K, B = x with
// ldb = K, D = float32 [M, N] with ldd = N: K a multiple of 16 and N of 4 (16 bytes of float32); M is free. The
// compute type is CUBLAS_COMPUTE_32F and fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM) is off unless the op
// says fast_accumulation=1: Hopper's float8 MMA accumulates with fewer bits than float32 inside an instruction, and
// without fast accumulation cuBLASLt promotes the partial sums to float32 registers regularly, which keeps the error
// of a long K near float32's. With it the partial sums stay in the tensor cores' accumulator along K: about 1.4x
// faster at BERT-base's shapes at M = 2048 on an H200 (torch._scaled_mm, the same cuBLASLt call: 37.5 against 47.1
// us for one layer's four GEMMs, 2026-12-03) and an error that grows with K; the tests allow it a wider bound
// (tests/python/test_quantized_fp8.py). ExecutionPolicy.fp8_fast_accumulation asks for it in a session's plans.
// The A/B scale pointers are left unset (1.0): the per-output-channel weight scale cannot be a scalar scale, and
// CUDA 13 declares CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F (vectors of M and N scales) but its documentation does
// not promise it for float8 on sm_90 in every version, so the scales, the float32 bias and the rounding to
// float16/float8 are applied by one pass over the accumulator whose arithmetic is the cpu kernel's (not cuBLASLt's
// D-scale rounding, which the documentation does not specify). What differs from the cpu kernel is the sums: the
// products of two float8 values are exact in float32, the cpu kernel's float32 sum in k order is within
// (K - 1) 2^-24 sum |products| of the exact one, and cuBLASLt's sums keep fewer bits inside one MMA before their
// promotion to float32; the tests allow (2 K 2^-24 + 2^-12) sum |products| * alpha
// (tests/python/test_quantized_fp8.py), and a float8 output that over y_scale plus one float8 step. Where every
// partial sum is exact the two are equal bit for bit.
//
// Workspace: cuBLASLt's, then the float32 accumulator (M * N * 4 bytes), each 256-byte aligned.
//
// Note [cuBLASLt's own float8 epilogue]
// The float32 accumulator above costs a write and a read of M * N * 4 bytes and a second launch: at BERT's shapes
// (M = 2048-8192) the float8 GEMM took 0.55-0.66x the float16 GEMM's time that way, its tensor cores twice as fast.
// So a plan has two epilogues, named in its record ("epilogue"):
//   "kernel"    the accumulator and this backend's epilogue kernel: the cpu kernel's arithmetic (above);
//   "cublasLt"  cuBLASLt applies it in the GEMM's own epilogue and writes the op's output directly:
//               D = scale_D * epilogue(alpha * scale_A * scale_B * acc + bias), with alpha = x_scale and scale_A the
//               device's w_scale (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a scalar); per-channel weight scales as
//               "outer vector" scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: A's N values, B's M values, all
//               x_scale, alpha 1); the epilogue BIAS / RELU / RELU_BIAS; for a float8 output D is float8e4m3fn with
//               scale_D = 1 / y_scale and C float16. cuBLASLt's float8 GEMMs take a 16-bit bias only, so a small
//               kernel first writes a float32 bias in float16 (with 1 / y_scale and the M x scales) into the
//               workspace; a float16 plan's bias is float16 already (the quantized_fusion pass leaves it so), and
//               a per-tensor GEMM with a float16 output then is one launch.
// The second differs from the first by float32 rounding of the scale products (x_scale * w_scale, in cuBLASLt's
// order), by the bias's rounding to float16 (none in a float16 plan, whose biases are float16 values already), and for
// a float8 output by v * (1 / y_scale) in place of v / y_scale (at most one float8 step at a tie). It is the default
// from M * N = 2^18 outputs on (a float32 accumulator of 1 MiB), where cuBLASLt offers an algorithm for it and the
// output is float16 or float8, or float32 without a bias (a float32 output would take a bfloat16 bias); otherwise,
// or where the output is not 16-byte aligned, the plan keeps the kernel. The threshold is measured (H200, 2026-12-03,
// benchmarks/bench_quant_gemm.py, per-channel scales, float16 output): at M = 2048 and 8192 cuBLASLt's epilogue took
// 0.56-0.69x the kernel epilogue's time (768 x 3072: 16.9 us against 30.2 at M = 2048), at M = 1 and 16 it was
// 1.25-1.45x slower (6.4-6.9 us against 5.0-5.5). Both are tactics of auto:BestPerformance, which times them at the
// node's shape; a record of either replays it. cuBLASLt 13.0 on sm_90 has no algorithm for per-channel (outer
// vector) scales with a float8 output (its heuristic answers CUBLAS_STATUS_INVALID_VALUE): those keep the kernel.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cublaslt/cublaslt_common.h"
#include "backends/cublaslt/cublaslt_quantized.h"
#include "backends/cublaslt/cublaslt_fp8_epilogue.h"
#include "core/cublas_utils.h"
#include "core/cuda_utils.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cublaslt {

namespace {

constexpr const char* kRecordFormat = "xpuruntime.cublasLt.qlinear_fp8.v1";
constexpr std::size_t kDefaultWorkspace = std::size_t{32} << 20;  // policy.workspace_limit == 0
constexpr std::uint32_t kAlignment = 16;
constexpr std::size_t kScratchAlignment = 256;
constexpr std::size_t kDescriptorCacheSize = 256;  // as Note [cuBLASLt descriptors per thread]
constexpr int kMinComputeCapability = 89;          // float8 tensor cores: Ada and Hopper and newer
// The default epilogue is cuBLASLt's own from this many outputs (a float32 accumulator of 1 MiB) on: measured on an
// H200 (Note [cuBLASLt's own float8 epilogue]), below it the two launches of the kernel epilogue were faster.
constexpr std::int64_t kOwnEpilogueMinOutputs = std::int64_t{1} << 18;

// The GEMM of one descriptor (the schema has validated it).
struct Fp8Problem {
  std::int64_t m = 0, n = 0, k = 0;
  bool weight_nk = false;
  bool w_scale_per_channel = false;
  bool has_bias = false;
  bool bias_half = false;  // a float16 bias (a float16 plan's): cuBLASLt's epilogue reads it as it is
  bool relu = false;
  float x_scale = 1.0f, y_scale = 1.0f;
  Fp8Output output = Fp8Output::kFloat32;
  bool deterministic = false;  // no split-K (Note [cuBLASLt determinism and split-K] in cublaslt_gemm.cpp)
  bool fast_accumulation = false;  // the op's fast_accumulation=1 (Note [cuBLASLt float8 GEMMs])
  std::uint32_t out_alignment = 256;

  static Fp8Problem of(const OpDescriptor& desc, const ExecutionPolicy& policy) {
    Fp8Problem q;
    q.deterministic = desc.deterministic || policy.deterministic;
    const TensorDesc& x = desc.inputs[0];
    const TensorDesc& w = desc.inputs[1];
    q.weight_nk = desc.attrs.get_string("weight_layout", "kn") == "nk";
    q.k = x.shape.empty() ? 0 : x.shape.back();
    q.n = q.weight_nk ? w.shape[0] : w.shape[1];
    q.m = q.k > 0 ? x.numel() / q.k : 0;
    if (!desc.outputs.empty()) q.out_alignment = desc.outputs[0].alignment;
    q.w_scale_per_channel = desc.inputs[2].numel() > 1;
    q.has_bias = desc.inputs.size() > 3 && desc.inputs[3].present;
    q.bias_half = q.has_bias && desc.inputs[3].dtype == DType::kFloat16;
    q.relu = desc.attrs.get_string("activation", "none") == "relu";
    q.fast_accumulation = desc.attrs.get_int("fast_accumulation", 0) != 0;
    q.x_scale = static_cast<float>(desc.attrs.get_float("x_scale", 1.0));
    q.y_scale = static_cast<float>(desc.attrs.get_float("y_scale", 1.0));
    const std::string out = desc.attrs.get_string("output_dtype", "float32");
    q.output = out == "float8e4m3fn" ? Fp8Output::kFloat8E4M3FN
                                     : (out == "float16" ? Fp8Output::kFloat16 : Fp8Output::kFloat32);
    return q;
  }

  std::string describe_epilogue() const {
    std::string text = detail::str_cat("x_scale ", x_scale, " * w_scale (",
                                       w_scale_per_channel ? "per output channel" : "per tensor", ")");
    if (has_bias) text += ", + bias";
    if (relu) text += ", relu";
    switch (output) {
      case Fp8Output::kFloat8E4M3FN:
        return text + detail::str_cat(", -> float8e4m3fn (y_scale ", y_scale, ", round to nearest even, saturate)");
      case Fp8Output::kFloat16:
        return text + ", -> float16";
      case Fp8Output::kFloat32:
        break;
    }
    return text + ", -> float32";
  }
};

std::size_t aligned(std::size_t bytes) { return cublas::round_up(bytes, kScratchAlignment); }

using quantized_gemm::Candidate;
using quantized_gemm::Descriptors;

// Which epilogue a plan runs (Note [cuBLASLt's own float8 epilogue]).
enum class Epilogue : std::uint8_t { kKernel, kCublasLt };

const char* epilogue_name(Epilogue e) { return e == Epilogue::kCublasLt ? "cublasLt" : "kernel"; }

// Why cuBLASLt cannot apply this problem's epilogue itself; empty when it may.
std::string cublaslt_epilogue_refusal(const Fp8Problem& q) {
  if (q.output == Fp8Output::kFloat32 && q.has_bias) {
    return "a float32 output with a bias (cuBLASLt's float8 GEMM would take the bias in bfloat16)";
  }
  if (q.out_alignment < kAlignment) {
    return detail::str_cat("the output is only ", q.out_alignment, "-byte aligned");
  }
  return {};
}

// The heuristic needs pointer values for the scales and the bias to infer their alignment; they are set per run.
const void* build_time_pointer() { return reinterpret_cast<const void*>(std::uintptr_t{kScratchAlignment}); }

cudaDataType_t output_type(Fp8Output output) {
  switch (output) {
    case Fp8Output::kFloat8E4M3FN:
      return CUDA_R_8F_E4M3;
    case Fp8Output::kFloat16:
      return CUDA_R_16F;
    case Fp8Output::kFloat32:
      break;
  }
  return CUDA_R_32F;
}

// The descriptors of cuBLASLt's own epilogue: scales, bias (float16), relu, D of the output's type.
void set_cublaslt_epilogue(Descriptors& descriptors, const Fp8Problem& q) {
  const MatmulDesc& op = descriptors.operation;
  if (q.w_scale_per_channel) {
    const auto outer = static_cast<std::int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
    op.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer);
    op.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer);
    op.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, build_time_pointer());
  }
  op.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, build_time_pointer());
  if (q.output == Fp8Output::kFloat8E4M3FN) op.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, build_time_pointer());
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (q.relu) epilogue = q.has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  else if (q.has_bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
  op.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (q.has_bias) {
    op.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(CUDA_R_16F));
    op.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, build_time_pointer());
  }
}

// The GEMM's descriptors (Note [cuBLASLt float8 GEMMs]): A = the weight [N, K] (op T), B = x [M, K], D = the float32
// accumulator [M, N] ("kernel") or the op's output ("cublasLt", C float16 for a float8 D); alpha and beta in float32.
Descriptors make_descriptors(const Fp8Problem& q, Epilogue epilogue) {
  const cudaDataType_t d_type = epilogue == Epilogue::kCublasLt ? output_type(q.output) : CUDA_R_32F;
  Descriptors descriptors{MatmulDesc(CUBLAS_COMPUTE_32F, CUDA_R_32F), MatrixLayout(CUDA_R_8F_E4M3, q.k, q.n, q.k),
                          MatrixLayout(CUDA_R_8F_E4M3, q.k, q.m, q.k), MatrixLayout(d_type, q.n, q.m, q.n)};
  if (d_type == CUDA_R_8F_E4M3) descriptors.c.emplace(CUDA_R_16F, q.n, q.m, q.n);
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(CUBLAS_OP_T));
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(CUBLAS_OP_N));
  descriptors.operation.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<std::int8_t>(q.fast_accumulation ? 1 : 0));
  if (epilogue == Epilogue::kCublasLt) set_cublaslt_epilogue(descriptors, q);
  return descriptors;
}

// The heuristic's candidates, in its order, within `limit` bytes of workspace that cublasLtMatmulAlgoCheck passes.
std::vector<Candidate> algorithm_candidates(cublasLtHandle_t handle, const Fp8Problem& q, Epilogue epilogue,
                                            std::size_t limit) {
  if (epilogue == Epilogue::kCublasLt && !cublaslt_epilogue_refusal(q).empty()) return {};
  const std::uint32_t reductions =
      static_cast<std::uint32_t>(q.deterministic ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_MASK);
  return quantized_gemm::heuristic_candidates(handle, make_descriptors(q, epilogue), limit, kAlignment, reductions,
                                              epilogue == Epilogue::kCublasLt);
}

class Fp8Plan final : public KernelPlan {
 public:
  // An empty output: nothing to run.
  Fp8Plan(Fp8Problem q, int device) : q_(q), device_(device) {}

  Fp8Plan(Fp8Problem q, int device, int compute_capability, Epilogue epilogue, const cublasLtMatmulAlgo_t& algo,
          std::size_t algo_workspace)
      : q_(q), device_(device), epilogue_(epilogue), algo_(algo), has_algo_(true), algo_workspace_(algo_workspace) {
    std::size_t at = aligned(algo_workspace_);
    const auto reserve = [&at](std::size_t bytes) {
      const std::size_t offset = at;
      at += aligned(bytes);
      return offset;
    };
    const auto m = static_cast<std::size_t>(q_.m);
    const auto n = static_cast<std::size_t>(q_.n);
    if (epilogue_ == Epilogue::kKernel) {
      accumulator_offset_ = reserve(sizeof(float) * m * n);
    } else {
      if (q_.has_bias && !q_.bias_half) bias16_offset_ = reserve(sizeof(std::uint16_t) * n);
      if (q_.output == Fp8Output::kFloat8E4M3FN) d_scale_offset_ = reserve(sizeof(float));
      if (q_.w_scale_per_channel) x_scales_offset_ = reserve(sizeof(float) * m);
    }
    total_ = at;
    const AlgoConfig config = config_of(algo_);
    record_ = make_record(config, compute_capability);
    describe_ = detail::str_cat("cublasLt float8 algo ", config.id, " tile ", enum_name(kTileNames, config.tile),
                                " stages ", enum_name(kStagesNames, config.stages), " splitK ", config.splitk,
                                q_.fast_accumulation ? ", fast accumulation" : "", ", m=", q_.m, " n=", q_.n,
                                " k=", q_.k, " float8e4m3fn x float8e4m3fn -> ",
                                epilogue_ == Epilogue::kKernel ? "float32" : "the output", ", workspace ",
                                algo_workspace_, " B; epilogue (", epilogue_ == Epilogue::kKernel ? "this backend's "
                                "kernel" : "cuBLASLt's own", "): ", q_.describe_epilogue());
  }

  void run(const KernelLaunch& launch) const override {
    if (!has_algo_) return;
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= workspace_bytes(),
                          "the cublasLt qlinear_fp8 plan needs ", workspace_bytes(), " bytes of workspace, got ",
                          launch.workspace_bytes);
    auto* base = static_cast<unsigned char*>(cublas::align_up(launch.workspace, kScratchAlignment));
    const void* x = launch.input(0).data_ptr();
    const void* weight = launch.input(1).data_ptr();
    check_alignment(x, "x");
    check_alignment(weight, "weight");
    void* workspace = algo_workspace_ > 0 ? base : nullptr;
    if (epilogue_ == Epilogue::kCublasLt) {
      run_cublaslt_epilogue(launch, base, x, weight, workspace, stream);
      return;
    }
    auto* accumulator = reinterpret_cast<float*>(base + accumulator_offset_);
    const Descriptors& descriptors = thread_descriptors();
    const float alpha = 1.0f;
    const float beta = 0.0f;
    XPURT_CUBLASLT_CHECK(cublasLtMatmul(cublas::thread_cublaslt_handle(device_), descriptors.operation.get(), &alpha,
                                        weight, descriptors.a.get(), x, descriptors.b.get(), &beta, accumulator,
                                        descriptors.d.get(), accumulator, descriptors.d.get(), &algo_, workspace,
                                        algo_workspace_, stream));
    Fp8EpilogueParams epilogue;
    epilogue.accumulator = accumulator;
    epilogue.out = launch.output(0).data_ptr();
    epilogue.m = q_.m;
    epilogue.n = q_.n;
    epilogue.x_scale = q_.x_scale;
    epilogue.w_scale = static_cast<const float*>(launch.input(2).data_ptr());
    epilogue.w_scale_per_channel = q_.w_scale_per_channel;
    epilogue.bias = q_.has_bias ? launch.input(3).data_ptr() : nullptr;
    epilogue.bias_half = q_.bias_half;
    epilogue.relu = q_.relu;
    epilogue.y_scale = q_.y_scale;
    epilogue.output = q_.output;
    XPURT_CUDA_CHECK(launch_fp8_epilogue(epilogue, stream));
  }

  std::size_t workspace_bytes() const override { return has_algo_ ? total_ + kScratchAlignment : 0; }
  std::string record() const override { return record_; }
  std::string describe() const override { return has_algo_ ? describe_ : "cublasLt qlinear_fp8: empty output"; }

 private:
  // Note [cuBLASLt's own float8 epilogue]: the float16 bias (unless it is one already), 1 / y_scale and the x scales
  // into the workspace, then the GEMM writes the output; a per-tensor plan with a float16 bias and a float16 output
  // launches the GEMM alone.
  void run_cublaslt_epilogue(const KernelLaunch& launch, unsigned char* base, const void* x, const void* weight,
                             void* workspace, cudaStream_t stream) const {
    void* out = launch.output(0).data_ptr();
    check_alignment(out, "the output");
    Fp8PrepareParams prepare;
    prepare.n = q_.n;
    prepare.m = q_.m;
    prepare.x_scale = q_.x_scale;
    const void* bias16 = nullptr;
    if (q_.has_bias && q_.bias_half) {
      bias16 = launch.input(3).data_ptr();
    } else if (q_.has_bias) {
      prepare.bias = static_cast<const float*>(launch.input(3).data_ptr());
      prepare.bias16 = base + bias16_offset_;
      bias16 = prepare.bias16;
    }
    if (q_.output == Fp8Output::kFloat8E4M3FN) {
      prepare.d_scale = reinterpret_cast<float*>(base + d_scale_offset_);
      prepare.d_scale_value = 1.0f / q_.y_scale;
    }
    if (q_.w_scale_per_channel) prepare.x_scales = reinterpret_cast<float*>(base + x_scales_offset_);
    XPURT_CUDA_CHECK(launch_fp8_prepare(prepare, stream));
    const Descriptors& descriptors = thread_descriptors();
    const MatmulDesc& op = descriptors.operation;
    op.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, launch.input(2).data_ptr());
    if (q_.w_scale_per_channel) op.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<void*>(prepare.x_scales));
    if (prepare.d_scale != nullptr) op.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<void*>(prepare.d_scale));
    if (q_.has_bias) op.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias16);
    const float alpha = q_.w_scale_per_channel ? 1.0f : q_.x_scale;  // per channel: x_scale is B's scale vector
    const float beta = 0.0f;
    // C is not read (beta 0); a float8 D has a float16 C layout, so C cannot be D's memory: no C at all.
    const void* c = descriptors.c ? nullptr : out;
    XPURT_CUBLASLT_CHECK(cublasLtMatmul(cublas::thread_cublaslt_handle(device_), op.get(), &alpha, weight,
                                        descriptors.a.get(), x, descriptors.b.get(), &beta, c,
                                        descriptors.c_layout(), out, descriptors.d.get(), &algo_, workspace,
                                        algo_workspace_, stream));
  }

  void check_alignment(const void* pointer, const char* what) const {
    if (cublas::is_aligned(pointer, kAlignment)) return;
    throw InvalidArgumentError(detail::str_cat("the cublasLt qlinear_fp8 plan was built for ", kAlignment,
                                               "-byte aligned operands (see supports()), but ", what,
                                               " is not; pass aligned tensors"));
  }

  // This thread's descriptors of this plan (Note [cuBLASLt descriptors per thread] in cublaslt_gemm.cpp).
  const Descriptors& thread_descriptors() const {
    return quantized_gemm::thread_descriptors(id_, kDescriptorCacheSize,
                                              [this] { return make_descriptors(q_, epilogue_); });
  }

  std::string make_record(const AlgoConfig& config, int compute_capability) const {
    return quantized_gemm::plan_record(kRecordFormat, algo_, config, "32F", algo_workspace_, compute_capability,
                                       {{"epilogue", epilogue_name(epilogue_)}});
  }

  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  std::uint64_t id_ = next_id();
  Fp8Problem q_;
  int device_ = 0;
  Epilogue epilogue_ = Epilogue::kKernel;
  cublasLtMatmulAlgo_t algo_{};
  bool has_algo_ = false;
  std::size_t algo_workspace_ = 0;
  std::size_t accumulator_offset_ = 0;
  std::size_t bias16_offset_ = 0;
  std::size_t d_scale_offset_ = 0;
  std::size_t x_scales_offset_ = 0;
  std::size_t total_ = 0;
  std::string record_;
  std::string describe_;
};

[[noreturn]] void throw_bad_record(const std::string& why) {
  throw UnsupportedOperationError(
      detail::str_cat("cannot re-create the cublasLt qlinear_fp8 plan from its record: ", why,
                      ". Drop the record (e.g. clear the autotune cache entry) to let cuBLASLt choose afresh"));
}

// The epilogue a record names ("kernel" when it names none: records made before there was a choice).
Epilogue epilogue_of_record(const Fp8Problem& q, const std::string& text) {
  std::string name = "kernel";
  try {
    const nlohmann::json record = nlohmann::json::parse(text);
    if (record.is_object() && record.contains("epilogue")) name = record.at("epilogue").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw_bad_record(detail::str_cat("it is not JSON with the fields of a record (", e.what(), ")"));
  }
  if (name == "kernel") return Epilogue::kKernel;
  if (name != "cublasLt") throw_bad_record("'epilogue' must be \"kernel\" or \"cublasLt\", got \"" + name + "\"");
  const std::string refusal = cublaslt_epilogue_refusal(q);
  if (!refusal.empty()) throw_bad_record("it names cuBLASLt's own epilogue, which this GEMM cannot take: " + refusal);
  return Epilogue::kCublasLt;
}

// The algorithm of a record, checked against this GEMM here (cublasLtMatmulAlgoCheck); its workspace.
Candidate candidate_from_record(cublasLtHandle_t handle, const Fp8Problem& q, Epilogue epilogue, std::size_t limit,
                                const std::string& text) {
  return quantized_gemm::candidate_from_record(handle, make_descriptors(q, epilogue), limit, text, kRecordFormat,
                                               q.deterministic, throw_bad_record);
}

std::size_t workspace_limit_of(const ExecutionPolicy& policy) {
  return policy.workspace_limit == 0 ? kDefaultWorkspace : static_cast<std::size_t>(policy.workspace_limit);
}

KernelDecl qlinear_fp8_declaration() {
  KernelDecl decl;
  decl.subject = "cublasLt qlinear_fp8";
  decl.input_names = {"x", "weight", "w_scale", "bias"};
  decl.on_device = true;
  decl.min_compute_capability = kMinComputeCapability;
  decl.dtypes = DTypeSet{{DType::kFloat8E4M3FN, DType::kFloat32, DType::kFloat16}, {}};
  decl.layout = Layout::kContiguous;
  return decl;
}

class QLinearFp8Kernel final : public Kernel {
 public:
  QLinearFp8Kernel()
      : Kernel(KernelInfo{"qlinear_fp8", "cublasLt", "cublasLt", DeviceType::kCUDA, true,
                          "cuBLASLt float8 GEMM on the float8 tensor cores (float32 accumulation, weight [N, K]); "
                          "scales, bias, relu and the output's rounding in cuBLASLt's own epilogue where it takes "
                          "them, else in this backend's epilogue kernel as the cpu kernel computes them; heuristic "
                          "algorithm and epilogue, recorded in the plan",
                          qlinear_fp8_declaration()}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    if (!desc.device.is_cuda()) return Support::no("cublasLt qlinear_fp8 runs on CUDA devices");
    if (desc.outputs.empty()) return Support::no("cublasLt needs the op's outputs inferred first");
    const Fp8Problem q = Fp8Problem::of(desc, policy);
    if (!q.weight_nk) {
      return Support::no("cuBLASLt's float8 GEMM takes only K-contiguous operands (the 'TN' form, Note [cuBLASLt "
                         "float8 GEMMs]), and this weight is [K, N] (weight_layout=kn); the quantized_fusion pass "
                         "lays constant weights out [N, K]");
    }
    if (q.k == 0 || q.k % 16 != 0 || q.n % 4 != 0) {
      return Support::no(detail::str_cat("cuBLASLt's float8 GEMM needs K a multiple of 16 (and > 0) and N a "
                                         "multiple of 4, got K = ", q.k, " and N = ", q.n,
                                         "; the quantized_fusion pass leaves such chains unfused on CUDA"));
    }
    for (std::size_t j = 0; j < 2; ++j) {
      if (desc.inputs[j].alignment < kAlignment && desc.inputs[j].numel() > 0) {
        return Support::no(detail::str_cat("cublasLt qlinear_fp8 plans are built for ", kAlignment, "-byte aligned "
                                           "x and weight, but '", j == 0 ? "x" : "weight", "' is only ",
                                           desc.inputs[j].alignment, "-byte aligned"));
      }
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    const Fp8Problem q = Fp8Problem::of(desc, policy);
    const int device = desc.device.index;
    if (q.m == 0 || q.n == 0) {
      if (!record.empty()) throw_bad_record("it names an algorithm, but this output is empty");
      return std::make_unique<Fp8Plan>(q, device);
    }
    const std::size_t limit = workspace_limit_of(policy);
    const cublasLtHandle_t handle = cublas::thread_cublaslt_handle(device);
    if (!record.empty()) {
      const Epilogue epilogue = epilogue_of_record(q, record);
      const Candidate chosen = candidate_from_record(handle, q, epilogue, limit, record);
      return std::make_unique<Fp8Plan>(q, device, desc.compute_capability, epilogue, chosen.algo, chosen.workspace);
    }
    // Note [cuBLASLt's own float8 epilogue]: cuBLASLt's for outputs of kOwnEpilogueMinOutputs elements or more
    // where it has an algorithm, else this backend's kernel.
    std::vector<Epilogue> choices;
    if (q.m * q.n >= kOwnEpilogueMinOutputs) choices.push_back(Epilogue::kCublasLt);
    choices.push_back(Epilogue::kKernel);
    for (const Epilogue epilogue : choices) {
      const std::vector<Candidate> valid = algorithm_candidates(handle, q, epilogue, limit);
      if (!valid.empty()) {
        return std::make_unique<Fp8Plan>(q, device, desc.compute_capability, epilogue, valid.front().algo,
                                         valid.front().workspace);
      }
    }
    throw UnsupportedOperationError(detail::str_cat(
        "cuBLASLt has no float8 algorithm for this GEMM (m=", q.m, " n=", q.n, " k=", q.k, ") within ", limit,
        " bytes of workspace on sm", desc.compute_capability,
        "; run the model with disabled_passes=['quantized_fusion'] to keep its float8 chains unfused"));
  }

  // The heuristic's other valid algorithms, with either epilogue (Note [Tactics] in dispatcher.cpp).
  std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    const Fp8Problem q = Fp8Problem::of(desc, policy);
    if (q.m == 0 || q.n == 0) return {};
    const cublasLtHandle_t handle = cublas::thread_cublaslt_handle(desc.device.index);
    std::vector<std::string> records;
    for (const Epilogue epilogue : {Epilogue::kCublasLt, Epilogue::kKernel}) {
      for (const Candidate& c : algorithm_candidates(handle, q, epilogue, workspace_limit_of(policy))) {
        records.push_back(
            Fp8Plan(q, desc.device.index, desc.compute_capability, epilogue, c.algo, c.workspace).record());
      }
    }
    return records;
  }
};

}  // namespace

std::unique_ptr<Kernel> make_qlinear_fp8_kernel() { return std::make_unique<QLinearFp8Kernel>(); }

}  // namespace xpuruntime::cublaslt
