// The conv2d kernels of the cudnn backend (docs/ops.md):
//   "cudnn"         the algorithm comes from cuDNN's heuristic (cudnnGetConvolutionForwardAlgorithm_v7);
//   "cudnn_search"  every usable algorithm's plan is timed at build time on random inputs of the real shapes, and
//                   the fastest kept (Note [cudnn_search times the plans it runs]).
// Both: NCHW, float32/float16/bfloat16, groups, strides, dilations, symmetric pads; bias, residual and ReLU
// through cudnnConvolutionBiasActivationForward when there is a bias (Note [cuDNN fused conv epilogue]).
// "Usable" means: cuDNN can run it here, its workspace fits the policy's limit (0 = 256 MiB), it is
// deterministic when the policy asks for determinism, and its math type is allowed by the policy's precision
// (Note [cuDNN conv math types]).
//
// The plan's record (JSON) names the algorithm, the math type and the epilogue; `build` with a record re-creates
// the same plan without searching again (Note [cuDNN conv plan record]).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/conv_layout.h"
#include "core/device_kernels.h"
#include "cudnn_utils.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/stream_manager.h"

namespace xpuruntime {

namespace {

using cudnn::kOne;
using cudnn::kZero;

// Note [cuDNN conv math types]
// The math type set on the convolution descriptor tells cuDNN which kernels it may consider; the heuristic and
// the search then report, per algorithm, the math type that algorithm runs with, and that is the one the plan
// sets before running (cuDNN picks its kernel from the pair algorithm + math type).
//   float16 / bfloat16 data: CUDNN_TENSOR_OP_MATH (tensor cores; accumulation in fp32 through the FLOAT
//     compute type, cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configurations). Every reported math type is exact
//     for 16-bit data, so all are allowed.
//   float32 data, precision fp32: CUDNN_FMA_MATH (plain fp32 FMA, no TF32); only FMA_MATH results are usable.
//   float32 data, any other precision (tf32, or fp16/bf16 where a session has left a tensor in fp32):
//     CUDNN_DEFAULT_MATH, which on sm80+ lets cuDNN use TF32 tensor cores. We do not use
//     CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: it down-converts fp32 data to fp16, whose range (65504) is far
//     smaller than TF32's, so it is not what "tf32" promises; results with that math type are not usable.

// Note [cuDNN fused conv epilogue]
// cudnnConvolutionBiasActivationForward computes y = act(alpha1 * conv(x, w) + alpha2 * z + bias) in one pass:
// exactly conv2d's act(conv + bias + residual) with z = residual (alpha2 = 1) or, without a residual, z = y with
// alpha2 = 0 (cuDNN requires a z; with alpha2 = 0 it is not read, as in PyTorch's cudnn_convolution_relu). Its
// activation is RELU or IDENTITY, and IDENTITY is only implemented for
// CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM. So, with a bias:
//   relu: fused, with the best usable algorithm;
//   none: fused with IMPLICIT_PRECOMP_GEMM when it is usable (even when another algorithm ranks first: the
//         fused epilogue saves one or two full passes over y), else unfused with the best usable algorithm.
// Without a bias (and in the unfused case) the plan runs cudnnConvolutionForward, then cudnnAddTensor for the
// bias ([1, O, 1, 1], broadcast) and for the residual, then cudnnActivationForward (ReLU, in place).

// Note [cuDNN conv activations after the epilogue]
// conv_fusion folds SiLU, HardSwish and ReLU6 into depthwise convolutions (cuda_raw's depthwise kernels apply them
// in their epilogue), and the dispatcher times those against cuDNN (Note [Timed first choices]). With cuDNN limited
// to ReLU there was nothing to time: MobileViT's 3x3 depthwise convolutions with SiLU ran on the own kernel at about
// twice cuDNN's time (docs/benchmarks.md). So cuDNN takes them too: the convolution as for "none" (bias fused with
// an identity activation where IMPLICIT_PRECOMP_GEMM is usable), then one in-place pass over y: cuda_raw's
// bias_activation without a bias (the device kernels table, as the cuBLAS GEMMs' epilogues use it). The extra pass is
// what a separate activation node would cost; the timing decides whether it is worth it.

// Note [Convolutions are not timed by default]
// cuDNN's heuristic (cudnnGetConvolutionForwardAlgorithm_v7) is a ranking, not a timing, and the suite's roofline audit
// on an H100 (2026-12-06, docs/benchmarks.md) found its picks far from their floors in every CNN (the 3-channel stems
// at 4-9%). Timing it against cudnn_search at plan build (the dispatcher's timed first choice, as ONNX Runtime's
// exhaustive search and PyTorch's cudnn.benchmark do) was tried and measured on the same H100 the same day: the dense
// convolutions of ResNet-50, RegNet, DenseNet, Inception and ResNeXt timed at 60-264 us on both kernels at plan build,
// the heuristic's tensor-core plans among the slower although CUPTI had measured the same plans' kernels at 11-15 us a
// run, and cuDNN's own search (cudnnFindConvolutionForwardAlgorithmEx, timed the same way) kept IMPLICIT_GEMM without
// tensor cores, 65-212 us a run by CUPTI: ResNet-50 at batch 1 went from 0.38 ms to 1.38 ms. Timings off by up to 20x
// while the kernels' own times are right point at host work inside the timed region (Note [Timing without host gaps]
// in core/dispatcher.cpp gates it out since, and cudnn_search times its algorithms' plans with that timer instead of
// cuDNN's search: Note [cudnn_search times the plans it runs]; the gate passed its GPU test on an H100 later that day).
// With the heuristic untimed again the same H100 ran ResNet-50 at batch 1 in 0.38 ms and Inception-v3 in 0.40 ms
// (2.92 ms timed). The check of the timed choices (tests/python/test_conv_timed_gpu.py: a chain of convolutions under
// BestPerformance not slower than the heuristic's, its plan-time timings near the run's) passed on an H100 the same
// evening (17:02 UTC); the suite's CNNs have not been timed with it since. Until a device run shows timed choices at
// least as fast as the heuristic's on the whole suite, the heuristic's pick stands untimed; cudnn_search stays for a
// KernelPolicy that asks for it (`conv2d: cudnn_search`), and BestPerformance times both. A same-run A/B on an H100
// (2026-12-07, docs/benchmarks.md) had the timed plans at 0.94-1.05x the heuristic's time on ResNet-50, Inception-v3,
// EfficientNetV2 and RegNet: sane since the gate, but no gain worth a default that costs plan-build time.

// Note [cuDNN conv plan record]
// The record is a JSON object:
//   {"algo": "IMPLICIT_PRECOMP_GEMM", "math": "TENSOR_OP_MATH", "fused": true, "workspace": 1258291,
//    "deterministic": true, "chosen_by": "search", "time_ms": 0.0123, "cudnn_version": 91400, "sm": 90}
// "algo", "math" and "fused" are required and define the plan; "workspace" is taken as recorded when the record was
// made by the same cuDNN ("cudnn_version") on a device of the same compute capability ("sm"), and recomputed
// otherwise (another cuDNN or GPU may need a different amount: the query costs about as much as the rest of the
// plan, Note [Build cache]); it must fit the policy's limit; "deterministic" is re-checked against cuDNN when the
// policy asks for determinism; "chosen_by" ("heuristic" or "search") and "time_ms" (search only) are
// informational. A record that names an unknown algorithm or
// math type is an InvalidArgumentError; one that cannot be honoured here (cuDNN does not support that algorithm
// for this convolution, its workspace is over the limit, it is not deterministic under a deterministic policy,
// its math type breaks the precision, or it fuses an identity epilogue without IMPLICIT_PRECOMP_GEMM) is an
// UnsupportedOperationError.

constexpr const char* kLabel = "cudnn conv2d";

struct ConvShape {
  DType dtype = DType::kFloat32;
  std::int64_t n = 0, c = 0, h = 0, w = 0;    // x
  std::int64_t o = 0, kh = 0, kw = 0;         // weight [o, c / groups, kh, kw]
  std::int64_t oh = 0, ow = 0;                // y [n, o, oh, ow]
  std::int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1, groups = 1;
  bool has_bias = false;
  bool has_residual = false;
  bool relu = false;
  std::string after;  // silu, relu6, hard_swish, gelu, gelu_tanh: a pass over y after the epilogue; empty: none
  bool nhwc = false;  // layout=NHWC: x, y, residual channels-last, the weight [o, kh, kw, c / groups]
};

ConvShape conv_shape(const OpDescriptor& desc) {
  ConvShape s;
  s.nhwc = detail::is_nhwc(desc.attrs, "conv2d");
  // Logical NCHW dims whatever the layout (the descriptors carry the memory order).
  const std::vector<std::int64_t> x = detail::as_nchw(desc.inputs[0].shape, s.nhwc);
  const std::vector<std::int64_t> w = detail::as_nchw(desc.inputs[1].shape, s.nhwc);
  const std::vector<std::int64_t> y = detail::as_nchw(desc.outputs[0].shape, s.nhwc);
  s.dtype = desc.inputs[0].dtype;
  s.n = x[0];
  s.c = x[1];
  s.h = x[2];
  s.w = x[3];
  s.o = w[0];
  s.kh = w[2];
  s.kw = w[3];
  s.oh = y[2];
  s.ow = y[3];
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  s.pad_h = pads[0];
  s.pad_w = pads[1];
  s.stride_h = strides[0];
  s.stride_w = strides[1];
  s.dilation_h = dilations[0];
  s.dilation_w = dilations[1];
  s.groups = desc.attrs.get_int("groups", 1);
  s.has_bias = desc.inputs.size() > 2 && desc.inputs[2].present;
  s.has_residual = desc.inputs.size() > 3 && desc.inputs[3].present;
  const std::string activation = desc.attrs.get_string("activation", "none");
  s.relu = activation == "relu";
  if (activation != "none" && activation != "relu") s.after = activation;
  return s;
}

// ---- names ----

constexpr const char* kAlgoNames[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                      "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
constexpr int kNumAlgos = static_cast<int>(sizeof(kAlgoNames) / sizeof(kAlgoNames[0]));
static_assert(kNumAlgos == CUDNN_CONVOLUTION_FWD_ALGO_COUNT, "a cuDNN forward algorithm has no name here");

std::string algo_name(cudnnConvolutionFwdAlgo_t algo) {
  const int index = static_cast<int>(algo);
  return index >= 0 && index < kNumAlgos ? kAlgoNames[index] : detail::str_cat("ALGO_", index);
}

bool algo_from_name(const std::string& name, cudnnConvolutionFwdAlgo_t* algo) {
  for (int k = 0; k < kNumAlgos; ++k) {
    if (name == kAlgoNames[k]) {
      *algo = static_cast<cudnnConvolutionFwdAlgo_t>(k);
      return true;
    }
  }
  return false;
}

struct MathName {
  cudnnMathType_t math;
  const char* name;   // in records
  const char* label;  // in descriptions
};
constexpr MathName kMathNames[] = {
    {CUDNN_DEFAULT_MATH, "DEFAULT_MATH", "default math"},
    {CUDNN_TENSOR_OP_MATH, "TENSOR_OP_MATH", "tensor-op math"},
    {CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, "TENSOR_OP_MATH_ALLOW_CONVERSION", "tensor-op math with conversion"},
    {CUDNN_FMA_MATH, "FMA_MATH", "fma math"},
};

const MathName& math_entry(cudnnMathType_t math) {
  for (const auto& entry : kMathNames) {
    if (entry.math == math) return entry;
  }
  XPURT_INTERNAL_ASSERT(false, "unknown cuDNN math type ", static_cast<int>(math));
  return kMathNames[0];
}

std::string valid_algo_names() {
  std::string out;
  for (int k = 0; k < kNumAlgos; ++k) out += (k ? ", " : "") + std::string(kAlgoNames[k]);
  return out;
}

// ---- math types (Note [cuDNN conv math types]) ----

cudnnMathType_t requested_math(DType dtype, Precision precision) {
  if (dtype != DType::kFloat32) return CUDNN_TENSOR_OP_MATH;
  return kernel_precision(precision) == Precision::kFP32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

bool math_allowed(DType dtype, Precision precision, cudnnMathType_t math) {
  if (dtype != DType::kFloat32) return true;
  if (kernel_precision(precision) == Precision::kFP32) return math == CUDNN_FMA_MATH;
  return math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// ---- descriptors ----

// The cuDNN descriptors of one convolution; written at build time only.
struct ConvDescriptors {
  cudnn::TensorDescriptor x;
  cudnn::FilterDescriptor w;
  cudnn::ConvolutionDescriptor conv;
  cudnn::TensorDescriptor y;     // also z (the residual) of the fused call
  cudnn::TensorDescriptor bias;  // [1, O, 1, 1]

  ConvDescriptors(const ConvShape& s, cudnnMathType_t math) {
    const cudnnDataType_t type = cudnn::data_type(s.dtype);
    cudnn::set_4d(x, s.dtype, s.nhwc, s.n, s.c, s.h, s.w);
    XPURT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), type, s.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                                 static_cast<int>(s.o),
                                                 static_cast<int>(s.c / s.groups), static_cast<int>(s.kh),
                                                 static_cast<int>(s.kw)));
    // Accumulate in fp32 for every data type (PSEUDO_HALF / PSEUDO_BFLOAT16 configurations for 16-bit data).
    XPURT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv.get(), static_cast<int>(s.pad_h), static_cast<int>(s.pad_w), static_cast<int>(s.stride_h),
        static_cast<int>(s.stride_w), static_cast<int>(s.dilation_h), static_cast<int>(s.dilation_w),
        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    XPURT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), static_cast<int>(s.groups)));
    XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math));
    cudnn::set_4d(y, s.dtype, s.nhwc, s.n, s.o, s.oh, s.ow);
    cudnn::set_4d(bias, s.dtype, s.nhwc, 1, s.o, 1, 1);

    int dims[4] = {0, 0, 0, 0};
    XPURT_CUDNN_CHECK(
        cudnnGetConvolution2dForwardOutputDim(conv.get(), x.get(), w.get(), &dims[0], &dims[1], &dims[2], &dims[3]));
    XPURT_INTERNAL_ASSERT(dims[0] == s.n && dims[1] == s.o && dims[2] == s.oh && dims[3] == s.ow,
                          "cuDNN computes the conv2d output [", dims[0], ", ", dims[1], ", ", dims[2], ", ", dims[3],
                          "], the op schema [", s.n, ", ", s.o, ", ", s.oh, ", ", s.ow, "]");
  }

  // cuDNN's workspace for `algo` under the math type set now; false when cuDNN cannot run `algo` here.
  bool workspace_size(cudnnHandle_t handle, cudnnConvolutionFwdAlgo_t algo, std::size_t* bytes) const {
    const cudnnStatus_t status =
        cudnnGetConvolutionForwardWorkspaceSize(handle, x.get(), w.get(), conv.get(), y.get(), algo, bytes);
    return status == CUDNN_STATUS_SUCCESS;
  }
};

using AlgoPerf = cudnnConvolutionFwdAlgoPerf_t;

// Every algorithm, ranked by cuDNN's heuristic (no GPU work).
std::vector<AlgoPerf> heuristic_ranking(cudnnHandle_t handle, const ConvDescriptors& d) {
  int max_count = 0;
  XPURT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
  std::vector<AlgoPerf> perfs(static_cast<std::size_t>(std::max(max_count, 1)));
  int returned = 0;
  XPURT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                           static_cast<int>(perfs.size()), &returned, perfs.data()));
  perfs.resize(static_cast<std::size_t>(std::max(returned, 0)));
  return perfs;
}

// Replaces each runnable entry's `memory` by the larger of it and what cudnnGetConvolutionForwardWorkspaceSize
// says for that algorithm and math type (the heuristic's figure is an estimate), and marks an entry whose size
// cuDNN cannot give as not supported. Leaves the descriptor's math type at `restore`.
// One entry of refine_workspace; leaves the descriptor's math type at the entry's.
void refine_entry(cudnnHandle_t handle, const ConvDescriptors& d, AlgoPerf& perf) {
  if (perf.status != CUDNN_STATUS_SUCCESS) return;
  XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), perf.mathType));
  std::size_t bytes = 0;
  if (d.workspace_size(handle, perf.algo, &bytes)) {
    perf.memory = std::max(perf.memory, bytes);
  } else {
    perf.status = CUDNN_STATUS_NOT_SUPPORTED;
  }
}

void refine_workspace(cudnnHandle_t handle, const ConvDescriptors& d, std::vector<AlgoPerf>& ranking,
                      cudnnMathType_t restore) {
  for (AlgoPerf& perf : ranking) refine_entry(handle, d, perf);
  XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), restore));
}

// ---- the choice ----

struct ConvChoice {
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t workspace = 0;
  bool fused = false;
  bool deterministic = true;
  std::string chosen_by = "heuristic";  // "heuristic" or "search"
  double time_ms = -1;                  // search only
  int usable = 0;                       // usable candidates the choice was made among (0 when from a record)
  bool from_record = false;
  int compute_capability = 0;  // of the device it was made for (major * 10 + minor)
};

// Why `perf` cannot be used under `policy`, or empty when it can.
std::string unusable_reason(const AlgoPerf& perf, const ConvShape& s, const ExecutionPolicy& policy,
                            std::size_t limit) {
  if (perf.status != CUDNN_STATUS_SUCCESS) return cudnn::status_name(perf.status);
  if (perf.memory > limit) {
    return detail::str_cat("needs ", cudnn::format_bytes(perf.memory), " of workspace, over the limit of ",
                           cudnn::format_bytes(limit));
  }
  if (policy.deterministic && perf.determinism != CUDNN_DETERMINISTIC) return "not deterministic";
  if (!math_allowed(s.dtype, policy.precision, perf.mathType)) {
    return detail::str_cat(math_entry(perf.mathType).label, " is not allowed for ", dtype_name(s.dtype),
                           " under precision ", precision_name(policy.precision));
  }
  return {};
}

// Whether `algo`'s plan runs the epilogue in cuDNN's fused call (Note [cuDNN fused conv epilogue]): with a bias, ReLU
// fuses with any algorithm and an identity activation only with IMPLICIT_PRECOMP_GEMM.
bool fuses_epilogue(const ConvShape& s, cudnnConvolutionFwdAlgo_t algo) {
  return s.has_bias && (s.relu || algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
}

// The plan that runs `perf`'s algorithm with its math type and workspace.
ConvChoice choice_of(const AlgoPerf& perf, const ConvShape& s) {
  ConvChoice choice;
  choice.algo = perf.algo;
  choice.math = perf.mathType;
  choice.workspace = perf.memory;
  choice.fused = fuses_epilogue(s, perf.algo);
  choice.deterministic = perf.determinism == CUDNN_DETERMINISTIC;
  return choice;
}

UnsupportedOperationError no_usable_algorithm(const std::string& rejected) {
  return UnsupportedOperationError(detail::str_cat(
      kLabel, ": no cuDNN algorithm is usable for this convolution (", rejected.empty() ? "none reported" : rejected,
      "); raise the workspace limit or drop the determinism requirement"));
}

// `refine`, when given, is applied to each entry before it is judged (refine_workspace for one entry). The heuristic's
// choice stops judging once its pick is certain: the first usable entry, and with a bias but no ReLU
// also the first usable IMPLICIT_PRECOMP_GEMM. Each workspace query builds a cuDNN plan, so refining every entry
// had cost about a millisecond per convolution at session creation (Note [Build phases]).
ConvChoice choose(std::vector<AlgoPerf>& ranking, const ConvShape& s, const ExecutionPolicy& policy,
                  std::size_t limit, const std::function<void(AlgoPerf&)>& refine = {}) {
  const AlgoPerf* first = nullptr;
  const AlgoPerf* precomp = nullptr;
  int usable = 0;
  std::string rejected;
  const bool wants_precomp = s.has_bias && !s.relu;
  for (AlgoPerf& perf : ranking) {
    if (first != nullptr && (precomp != nullptr || !wants_precomp)) break;
    if (refine && perf.status == CUDNN_STATUS_SUCCESS) refine(perf);
    const std::string why = unusable_reason(perf, s, policy, limit);
    if (!why.empty()) {
      rejected += detail::str_cat(rejected.empty() ? "" : "; ", algo_name(perf.algo), ": ", why);
      continue;
    }
    ++usable;
    if (first == nullptr) first = &perf;
    if (precomp == nullptr && perf.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) precomp = &perf;
  }
  if (first == nullptr) throw no_usable_algorithm(rejected);
  // Note [cuDNN fused conv epilogue]: with a bias but no ReLU, IMPLICIT_PRECOMP_GEMM fused wherever it is usable.
  ConvChoice choice = choice_of(wants_precomp && precomp != nullptr ? *precomp : *first, s);
  choice.usable = usable;
  return choice;
}

ConvChoice choice_from_record(const std::string& record, cudnnHandle_t handle, const ConvDescriptors& d,
                              const ConvShape& s, const ExecutionPolicy& policy, int compute_capability) {
  const auto invalid = [&](const std::string& what) {
    return InvalidArgumentError(detail::str_cat(kLabel, ": invalid plan record (", what, "): ", record));
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(record);
  } catch (const nlohmann::json::exception& e) {
    throw invalid(e.what());
  }
  if (!json.is_object()) throw invalid("not a JSON object");
  for (const char* key : {"algo", "math"}) {
    if (!json.contains(key) || !json[key].is_string()) throw invalid(detail::str_cat("'", key, "' must be a string"));
  }
  if (!json.contains("fused") || !json["fused"].is_boolean()) throw invalid("'fused' must be true or false");

  ConvChoice choice;
  const std::string algo = json["algo"].get<std::string>();
  if (!algo_from_name(algo, &choice.algo)) {
    throw invalid(detail::str_cat("unknown algo '", algo, "'; valid: ", valid_algo_names()));
  }
  const std::string math = json["math"].get<std::string>();
  bool math_known = false;
  for (const auto& entry : kMathNames) {
    if (math == entry.name) {
      choice.math = entry.math;
      math_known = true;
    }
  }
  if (!math_known) {
    throw invalid(detail::str_cat("unknown math '", math,
                                  "'; valid: DEFAULT_MATH, TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION, FMA_MATH"));
  }
  choice.fused = json["fused"].get<bool>();
  if (json.contains("chosen_by") && json["chosen_by"].is_string()) {
    choice.chosen_by = json["chosen_by"].get<std::string>();
  }
  if (json.contains("time_ms") && json["time_ms"].is_number()) choice.time_ms = json["time_ms"].get<double>();
  choice.from_record = true;
  choice.compute_capability = compute_capability;

  const auto cannot = [&](const std::string& why) {
    return UnsupportedOperationError(
        detail::str_cat(kLabel, ": cannot re-create the plan of record ", record, ": ", why));
  };
  if (!math_allowed(s.dtype, policy.precision, choice.math)) {
    throw cannot(detail::str_cat(math_entry(choice.math).label, " is not allowed for ", dtype_name(s.dtype),
                                 " under precision ", precision_name(policy.precision)));
  }
  if (choice.fused && !s.has_bias) throw cannot("it fuses a bias epilogue but this conv2d has no bias");
  if (choice.fused && !s.relu && choice.algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) {
    throw cannot("cuDNN fuses an identity activation only with IMPLICIT_PRECOMP_GEMM");
  }
  XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), choice.math));
  std::size_t workspace = 0;
  const auto same_int = [&](const char* key, std::int64_t value) {
    return json.contains(key) && json[key].is_number_integer() && json[key].get<std::int64_t>() == value;
  };
  const bool same_library_and_device = same_int("cudnn_version", static_cast<std::int64_t>(cudnn::runtime_version())) &&
                                       same_int("sm", compute_capability) && json.contains("workspace") &&
                                       json["workspace"].is_number_unsigned();
  if (same_library_and_device) {
    workspace = json["workspace"].get<std::size_t>();
  } else if (!d.workspace_size(handle, choice.algo, &workspace)) {
    throw cannot(detail::str_cat("cuDNN ", cudnn::runtime_version(), " cannot run ", algo, " for this convolution"));
  }
  choice.workspace = workspace;
  const std::size_t limit = cudnn::workspace_limit(policy);
  if (workspace > limit) {
    throw cannot(detail::str_cat(algo, " needs ", cudnn::format_bytes(workspace), " of workspace, over the limit of ",
                                 cudnn::format_bytes(limit)));
  }
  // A record that says whether its algorithm is deterministic is believed unless the policy asks for determinism
  // (the heuristic query below is most of a replay's cost: Note [Build cache]); then determinism is as cuDNN reports
  // it for this algorithm (and math type, when listed) here.
  if (!policy.deterministic && json.contains("deterministic") && json["deterministic"].is_boolean()) {
    choice.deterministic = json["deterministic"].get<bool>();
    return choice;
  }
  XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), requested_math(s.dtype, policy.precision)));
  const AlgoPerf* match = nullptr;
  for (const AlgoPerf& perf : heuristic_ranking(handle, d)) {
    if (perf.algo != choice.algo || perf.status != CUDNN_STATUS_SUCCESS) continue;
    if (match == nullptr || perf.mathType == choice.math) match = &perf;
  }
  XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), choice.math));
  if (match != nullptr) {
    choice.deterministic = match->determinism == CUDNN_DETERMINISTIC;
  } else {
    choice.deterministic = json.value("deterministic", false);
  }
  if (policy.deterministic && !choice.deterministic) {
    throw cannot(detail::str_cat(algo, " is not deterministic and the policy asks for determinism"));
  }
  return choice;
}

std::string epilogue_text(const ConvShape& s, bool fused) {
  std::vector<std::string> parts;
  if (s.has_bias) parts.push_back(fused ? "bias" : "bias add");
  if (s.has_residual) parts.push_back(fused ? "residual" : "residual add");
  if (s.relu) parts.push_back("relu");
  std::string out;
  if (!parts.empty()) {
    out = fused ? "fused " : "then ";
    for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? (fused ? "+" : ", ") : "") + parts[k];
  }
  if (!s.after.empty()) out += detail::str_cat(out.empty() ? "then " : ", then ", s.after, " (cuda_raw pass)");
  return out;
}

// ---- the plan ----

class ConvPlan final : public KernelPlan {
 public:
  ConvPlan(const ConvShape& shape, std::unique_ptr<ConvDescriptors> descriptors, ConvChoice choice, int device)
      : shape_(shape), d_(std::move(descriptors)), choice_(std::move(choice)), device_(device) {
    const bool fused_identity = choice_.fused && !shape_.relu;
    XPURT_CUDNN_CHECK(cudnnSetActivationDescriptor(
        activation_.get(), fused_identity ? CUDNN_ACTIVATION_IDENTITY : CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN,
        0.0));
  }

  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= choice_.workspace, kLabel, ": the plan needs ", choice_.workspace,
                " bytes of workspace, the launch gives ", launch.workspace_bytes);
    detail::CudaDeviceGuard guard(device_);
    cudnnHandle_t handle = cudnn::thread_handle(device_, static_cast<cudaStream_t>(launch.stream.handle));
    const void* x = launch.input(0).data_ptr();
    const void* w = launch.input(1).data_ptr();
    const void* bias = shape_.has_bias ? launch.input(2).data_ptr() : nullptr;
    const void* residual = shape_.has_residual ? launch.input(3).data_ptr() : nullptr;
    void* y = launch.output(0).data_ptr();
    void* workspace = choice_.workspace > 0 ? launch.workspace : nullptr;

    if (choice_.fused) {
      // Note [cuDNN fused conv epilogue]: z = residual, or y itself with alpha2 = 0 (not read).
      const float alpha2 = residual != nullptr ? 1.0f : 0.0f;
      XPURT_CUDNN_CHECK(cudnnConvolutionBiasActivationForward(
          handle, &kOne, d_->x.get(), x, d_->w.get(), w, d_->conv.get(), choice_.algo, workspace, choice_.workspace,
          &alpha2, d_->y.get(), residual != nullptr ? residual : y, d_->bias.get(), bias, activation_.get(),
          d_->y.get(), y));
      activation_after(launch, y);
      return;
    }
    XPURT_CUDNN_CHECK(cudnnConvolutionForward(handle, &kOne, d_->x.get(), x, d_->w.get(), w, d_->conv.get(),
                                              choice_.algo, workspace, choice_.workspace, &kZero, d_->y.get(), y));
    if (bias != nullptr) {
      XPURT_CUDNN_CHECK(cudnnAddTensor(handle, &kOne, d_->bias.get(), bias, &kOne, d_->y.get(), y));
    }
    if (residual != nullptr) {
      XPURT_CUDNN_CHECK(cudnnAddTensor(handle, &kOne, d_->y.get(), residual, &kOne, d_->y.get(), y));
    }
    if (shape_.relu) {
      XPURT_CUDNN_CHECK(
          cudnnActivationForward(handle, activation_.get(), &kOne, d_->y.get(), y, &kZero, d_->y.get(), y));
    }
    activation_after(launch, y);
  }

  std::size_t workspace_bytes() const override { return choice_.workspace; }

  std::string record() const override {
    nlohmann::json json;
    json["algo"] = algo_name(choice_.algo);
    json["math"] = math_entry(choice_.math).name;
    json["fused"] = choice_.fused;
    json["workspace"] = choice_.workspace;
    json["deterministic"] = choice_.deterministic;
    json["chosen_by"] = choice_.chosen_by;
    if (choice_.time_ms >= 0) json["time_ms"] = choice_.time_ms;
    json["cudnn_version"] = cudnn::runtime_version();
    json["sm"] = choice_.compute_capability;
    return json.dump();
  }

  std::string describe() const override {
    std::string out = detail::str_cat("cudnn conv algo ", algo_name(choice_.algo), shape_.nhwc ? ", NHWC" : "",
                                      ", ", math_entry(choice_.math).label,
                                      ", workspace ", cudnn::format_bytes(choice_.workspace));
    const std::string epilogue = epilogue_text(shape_, choice_.fused);
    if (!epilogue.empty()) out += ", " + epilogue;
    if (!choice_.deterministic) out += ", not deterministic";
    if (choice_.chosen_by == "search" && choice_.time_ms >= 0) {
      char timing[64];
      std::snprintf(timing, sizeof(timing), ", timed %.4f ms", choice_.time_ms);
      out += timing;
      if (choice_.usable > 0) out += detail::str_cat(" (", choice_.usable, " usable algorithms timed)");
    }
    if (choice_.from_record) out += ", from a record";
    return out;
  }

 private:
  // Note [cuDNN conv activations after the epilogue]: y is packed (its descriptor's strides), n * o * oh * ow.
  void activation_after(const KernelLaunch& launch, void* y) const {
    if (shape_.after.empty()) return;
    required_device_kernel(device_kernels().bias_activation, "bias_activation", kLabel)(
        y, nullptr, shape_.dtype, 1, shape_.n * shape_.o * shape_.oh * shape_.ow, shape_.after, launch.stream.handle);
  }

  ConvShape shape_;
  std::unique_ptr<ConvDescriptors> d_;
  ConvChoice choice_;
  int device_;
  cudnn::ActivationDescriptor activation_;
};

// ---- the kernels ----

// What conv2d's declaration (cudnn::declaration, 16-byte aligned: Note [cuDNN data alignment]) cannot say.
Support conv_supports(const OpDescriptor& desc) {
  try {
    const std::string activation = desc.attrs.get_string("activation", "none");
    if (activation != "none" && activation != "relu" && activation != "silu" && activation != "relu6" &&
        activation != "hard_swish" && activation != "gelu" && activation != "gelu_tanh") {
      return Support::no(detail::str_cat(kLabel, " takes activation none, relu, silu, relu6, hard_swish, gelu or "
                                         "gelu_tanh, not ", activation));
    }
    const DType dtype = desc.inputs.empty() ? DType::kFloat32 : desc.inputs[0].dtype;
    if (activation != "none" && activation != "relu" && dtype != DType::kFloat32 && dtype != DType::kFloat16 &&
        dtype != DType::kBFloat16) {
      return Support::no(detail::str_cat(kLabel, " applies ", activation, " to float32, float16 or bfloat16 only"));
    }
    Support limits = cudnn::check_limits(desc, kLabel);
    if (!limits) return limits;
    if (desc.inputs.size() < 2 || desc.outputs.size() != 1 || desc.inputs[0].dim() != 4 ||
        desc.inputs[1].dim() != 4 || desc.outputs[0].dim() != 4) {
      return Support::no(detail::str_cat(kLabel, " needs x [N, C, H, W] and weight [O, C/groups, kh, kw] (NHWC: "
                                         "[N, H, W, C] and [O, kh, kw, C/groups]) with the output inferred (call "
                                         "KernelRegistry::infer first)"));
    }
    const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
    if (pads.size() == 4 && (pads[0] != pads[2] || pads[1] != pads[3])) {
      return Support::no(detail::str_cat("cudnn needs symmetric pads (top == bottom, left == right), got ",
                                         cudnn::format_ints(pads), "; pad the input explicitly first"));
    }
    constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
    for (const char* name : {"pads", "strides", "dilations"}) {
      for (const auto value : desc.attrs.get_ints(name, {})) {
        if (value > kMaxInt) {
          return Support::no(detail::str_cat(kLabel, ": attribute '", name, "' value ", value,
                                             " does not fit cuDNN's 32-bit ints"));
        }
      }
    }
    const std::int64_t channels = desc.inputs[0].shape[detail::is_nhwc(desc.attrs, "conv2d") ? 3 : 1];
    if (desc.outputs[0].numel() > 0 && (channels == 0 || desc.inputs[1].numel() == 0)) {
      return Support::no(detail::str_cat(kLabel, " needs at least one input channel and a non-empty weight, got x ",
                                         desc.inputs[0].str(), " and weight ", desc.inputs[1].str()));
    }
    return Support::yes();
  } catch (const std::exception& e) {
    return Support::no(detail::str_cat(kLabel, ": ", e.what()));
  }
}

// Note [cudnn_search times the plans it runs]
// cudnn_search keeps the fastest usable algorithm by timing, for each one, the plan it would run (the epilogue fused
// as Note [cuDNN fused conv epilogue] says, the activation after it included) with the runtime's own timer
// (time_plan in core/dispatcher.cpp: random inputs of the real shapes, on the timing stream, each run behind a gate so
// that host work is not timed). It used cuDNN's own search (cudnnFindConvolutionForwardAlgorithmEx), which times the
// bare convolution, not the fused plan, with its events around cuDNN's host work: on an H100 (2026-12-06) that kept
// IMPLICIT_GEMM without tensor cores for most of the suite's convolutions, 65-212 us a run where the heuristic's
// tensor-core plans ran in 11-15 us (Note [Convolutions are not timed by default]). The candidates are the heuristic's
// list (every algorithm and the math type each runs with), their workspaces checked, those the policy does not allow
// left out with the reason; an algorithm whose plan fails to run is left out too.
// `d` holds the convolution at the math type `requested`, and is left at it.
ConvChoice searched_choice(const OpDescriptor& desc, const ConvShape& s, const ExecutionPolicy& policy,
                           cudnnHandle_t handle, const ConvDescriptors& d, cudnnMathType_t requested,
                           std::size_t limit) {
  std::vector<AlgoPerf> ranking = heuristic_ranking(handle, d);
  refine_workspace(handle, d, ranking, requested);
  std::optional<ConvChoice> best;
  double best_us = 0;
  int usable = 0;
  std::string rejected;
  for (const AlgoPerf& perf : ranking) {
    std::string why = unusable_reason(perf, s, policy, limit);
    ConvChoice candidate = choice_of(perf, s);
    candidate.chosen_by = "search";
    candidate.compute_capability = desc.compute_capability;
    double us = 0;
    if (why.empty()) {
      try {
        const ConvPlan plan(s, std::make_unique<ConvDescriptors>(s, candidate.math), candidate, desc.device.index);
        us = time_plan(plan, desc);
      } catch (const XpuRuntimeError& e) {
        why = detail::str_cat("its plan did not run: ", e.what());
      }
    }
    if (!why.empty()) {
      rejected += detail::str_cat(rejected.empty() ? "" : "; ", algo_name(perf.algo), ": ", why);
      continue;
    }
    ++usable;
    if (!best || us < best_us) {
      best = candidate;
      best_us = us;
    }
  }
  if (!best) throw no_usable_algorithm(rejected);
  best->time_ms = best_us / 1000.0;
  best->usable = usable;
  return *best;
}

class CudnnConvKernel final : public Kernel {
 public:
  CudnnConvKernel(KernelInfo info, bool search) : Kernel(std::move(info)), search_(search) {}

  // cuDNN's first use (its handle and the engines of its heuristic) through one small float16 convolution.
  std::optional<OpDescriptor> warm_up(Device device) const override {
    if (search_) return std::nullopt;
    OpDescriptor desc;
    desc.op = "conv2d";
    desc.device = device;
    desc.inputs.push_back(TensorDesc::contiguous({1, 32, 16, 16}, DType::kFloat16, device));
    desc.inputs.push_back(TensorDesc::contiguous({32, 32, 3, 3}, DType::kFloat16, device));
    desc.attrs.set("pads", std::vector<std::int64_t>{1, 1, 1, 1});
    return desc;
  }

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    return conv_supports(desc);
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    const ConvShape s = conv_shape(desc);
    if (desc.outputs[0].numel() == 0) return std::make_unique<cudnn::EmptyPlan>();
    const int device = desc.device.index;
    detail::CudaDeviceGuard guard(device);
    const StreamView stream = StreamManager::instance().current_stream(desc.device);
    cudnnHandle_t handle = cudnn::thread_handle(device, static_cast<cudaStream_t>(stream.handle));
    auto descriptors = std::make_unique<ConvDescriptors>(s, requested_math(s.dtype, policy.precision));

    ConvChoice choice;
    if (!record.empty()) {
      choice = choice_from_record(record, handle, *descriptors, s, policy, desc.compute_capability);
    } else {
      const std::size_t limit = cudnn::workspace_limit(policy);
      const cudnnMathType_t requested = requested_math(s.dtype, policy.precision);
      if (search_) {
        // Note [cudnn_search times the plans it runs]
        choice = searched_choice(desc, s, policy, handle, *descriptors, requested, limit);
      } else {
        std::vector<AlgoPerf> ranking = heuristic_ranking(handle, *descriptors);
        choice = choose(ranking, s, policy, limit, [&](AlgoPerf& perf) {
          refine_entry(handle, *descriptors, perf);
          XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(descriptors->conv.get(), requested));
        });
      }
      XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(descriptors->conv.get(), choice.math));
      choice.compute_capability = desc.compute_capability;
    }
    return std::make_unique<ConvPlan>(s, std::move(descriptors), std::move(choice), device);
  }

 private:
  bool search_;
};

}  // namespace

void register_cudnn_conv(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<CudnnConvKernel>(
      KernelInfo{"conv2d", "cudnn", "cudnn", DeviceType::kCUDA, true,
                 "cuDNN convolution (NCHW or NHWC), algorithm from cuDNN's heuristic; bias/residual/ReLU fused by "
                 "cudnnConvolutionBiasActivationForward; deterministic algorithms only under a deterministic policy",
                 cudnn::declaration(kLabel, cudnn::kConvAlignment)},
      /*search=*/false));
  registry.add_kernel(std::make_unique<CudnnConvKernel>(
      KernelInfo{"conv2d", "cudnn_search", "cudnn", DeviceType::kCUDA, true,
                 "cuDNN convolution (NCHW or NHWC), every algorithm timed at build time, fastest usable kept; "
                 "deterministic algorithms only under a deterministic policy",
                 cudnn::declaration(kLabel, cudnn::kConvAlignment)},
      /*search=*/true));
}

}  // namespace xpuruntime
