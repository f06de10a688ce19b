// Roofline work per node and device ceilings (see roofline.h).
//
// Note [Roofline work]
// A node's work is what any kernel would have to do for it, from its op, shapes and dtypes alone:
//  - bytes: the sizes of its inputs and outputs, initializers included (what the profiler's node events call
//    "bytes", and kernel_roofline_bench.py's "traffic": every input read once, every output written once). Ops that
//    read only part of an input count only that part: gather, gather_elements, gather_nd and slice read as many
//    bytes of their data as they write (plus their indices), as kernel_roofline_bench.py's gather_outer and
//    slice_last_half cases count them. A view moves nothing and has no floor.
//  - FLOPs, a multiply-add counting 2 (bench_gemm.py's 2 n^3, bench_quant_gemm.py's 2 M N K):
//      matmul, linear, qlinear, matmul_nbits (and ONNX MatMul, Gemm, FusedGemm, MatMulInteger, QLinearMatMul,
//      MatMulNBits):
//        2 * (output elements) * K, K the reduced dimension (input 0's last; Gemm: input 0's elements / M);
//      linear_grad_weight: 2 * (elements of x) * N;
//      conv2d, conv3d, qconv2d (ONNX Conv, ConvInteger, QLinearConv), any rank, groups, dilation, layout:
//        2 * (output elements) * (weight elements / output channels): each output element is a dot product of
//        C/groups * prod(kernel) terms, whatever the strides and dilations (they only shape the output);
//      conv_transpose2d/3d (ONNX ConvTranspose): 2 * (input elements) * (weight elements / input channels);
//      attention: 2 * Sk * (elements of q + elements of y), i.e. 2 B H Sq Sk (D + Dv) (bench_attention.py's
//        4 B H Sq Sk D when Dv = D), halved when causal; the softmax in between is not counted (as the benches);
//      reductions (reduce_*, global_avg_pool, cum_sum, arg_max/min): one per input element;
//      softmax, log_softmax: 5 per element (max, subtract, exp, sum, divide); layer_norm: 8 per element (mean,
//        centre, square, variance, normalise, scale, bias, residual); batch_norm: 2 per element (a folded scale
//        and shift);
//      max/avg pooling: one per output element per kernel tap (kernel_shape);
//      fused_elementwise: one per output element per instruction of its program;
//      other elementwise ops and activations: one per output element;
//      data movement (transpose, concat, gather, pad, resize, ...): none.
// GEMM-like ops (the first four groups) run against the matrix-unit peak of their precision (input 0's dtype;
// float32 under the tf32 policy is "tf32"; qlinear and qconv2d are "int8"); the rest against the "vector" peak.
// Elementwise, reduction and normalisation work is so light (a few operations per 2-8 bytes) that their floor is
// the bytes on every device here; the FLOPs only matter for GEMMs, convolutions and attention.
#include "xpuruntime/roofline.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

#include "core/cuda_utils.h"
#include "core/fused_elementwise.h"

#if XPURT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace xpuruntime::roofline {
namespace {

double numel(const TensorDesc& t) {
  double n = 1;
  for (std::int64_t d : t.shape) n *= static_cast<double>(d);
  return n;
}

double nbytes(const TensorDesc& t) { return t.present ? numel(t) * static_cast<double>(dtype_size(t.dtype)) : 0.0; }

const TensorDesc* at(const std::vector<TensorDesc>& v, std::size_t i) {
  return i < v.size() && v[i].present ? &v[i] : nullptr;
}

std::int64_t last_dim(const TensorDesc& t) { return t.shape.empty() ? 1 : t.shape.back(); }

// The matrix-unit ceiling of a GEMM-like op computing in `dtype` under `precision`.
std::string matrix_ceiling(DType dtype, Precision precision) {
  switch (dtype) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return precision == Precision::kTF32 ? "tf32" : "fp32";
    case DType::kFloat64: return "fp64";
    case DType::kInt8:
    case DType::kUInt8: return "int8";
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ: return "fp8";
    default: return "fp32";
  }
}

bool one_of(const std::string& op, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (op == n) return true;
  }
  return false;
}

double io_bytes(const std::vector<TensorDesc>& inputs, const std::vector<TensorDesc>& outputs) {
  double b = 0;
  for (const auto& t : inputs) b += nbytes(t);
  for (const auto& t : outputs) b += nbytes(t);
  return b;
}

// A fused node's bytes where inputs are read through views (Note [Inputs read through a view]): a view's elements,
// not its whole tensor (a q cut of a packed projection reads a third of it).
double viewed_io_bytes(const Attributes& attrs, const std::vector<TensorDesc>& inputs,
                       const std::vector<TensorDesc>& outputs) {
  std::vector<std::vector<std::int64_t>> stored;
  for (const TensorDesc& t : inputs) stored.push_back(t.shape);
  fused::InputViews views;
  try {
    views = fused::input_views(attrs, stored);
  } catch (const InvalidArgumentError&) {
    return io_bytes(inputs, outputs);  // the op's shape inference reports it
  }
  double b = io_bytes({}, outputs);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (k < views.size() && views[k] && inputs[k].present) {
      double n = 1;
      for (std::int64_t d : views[k]->shape) n *= static_cast<double>(d);
      b += n * static_cast<double>(dtype_size(inputs[k].dtype));
    } else {
      b += nbytes(inputs[k]);
    }
  }
  return b;
}

double out_elements(const std::vector<TensorDesc>& outputs) {
  const TensorDesc* y = at(outputs, 0);
  return y ? numel(*y) : 0.0;
}

// FLOPs of the GEMM-like ops; false when `op` is not one (or its shapes are missing).
bool matrix_flops(const std::string& op, const Attributes& attrs, const std::vector<TensorDesc>& in,
                  const std::vector<TensorDesc>& out, double* flops) {
  const TensorDesc* x = at(in, 0);
  const TensorDesc* w = at(in, 1);
  const TensorDesc* y = at(out, 0);
  if (x == nullptr || y == nullptr) return false;
  if (one_of(op, {"matmul", "linear", "qlinear", "matmul_nbits"})) {
    *flops = 2.0 * numel(*y) * static_cast<double>(last_dim(*x));
    return true;
  }
  if (op == "linear_grad_weight") {  // grad [..., N], x [..., K]
    if (w == nullptr) return false;
    *flops = 2.0 * numel(*w) * static_cast<double>(last_dim(*x));
    return true;
  }
  if (one_of(op, {"conv2d", "conv3d", "qconv2d"})) {
    if (w == nullptr || w->shape.empty() || w->shape[0] <= 0) return false;
    *flops = 2.0 * numel(*y) * numel(*w) / static_cast<double>(w->shape[0]);
    return true;
  }
  if (one_of(op, {"conv_transpose2d", "conv_transpose3d"})) {
    if (w == nullptr || w->shape.empty() || w->shape[0] <= 0) return false;
    *flops = 2.0 * numel(*x) * numel(*w) / static_cast<double>(w->shape[0]);
    return true;
  }
  if (op == "attention") {  // q, k [.., Sk, D], v; y
    const TensorDesc* k = at(in, 1);
    if (k == nullptr || k->shape.size() < 2) return false;
    const double sk = static_cast<double>(k->shape[k->shape.size() - 2]);
    *flops = 2.0 * sk * (numel(*x) + numel(*y)) * (attrs.get_int("causal", 0) != 0 ? 0.5 : 1.0);
    return true;
  }
  return false;
}

// FLOPs per output element of a fused_elementwise program: its instructions ("mul x0 x1; sigmoid t0").
double program_ops(const Attributes& attrs) {
  const std::string program = attrs.get_string("program", "");
  if (program.empty()) return 1.0;
  // A pieced program (Note [Pieces of a concatenation]): the pieces' mean, each piece writing its part of the output.
  const auto pieces = 1.0 + static_cast<double>(std::count(program.begin(), program.end(), '|'));
  return (pieces + static_cast<double>(std::count(program.begin(), program.end(), ';'))) / pieces;
}

// Vector (non-matrix) FLOPs.
double vector_flops(const std::string& op, const Attributes& attrs, const std::vector<TensorDesc>& in,
                    const std::vector<TensorDesc>& out) {
  const TensorDesc* x = at(in, 0);
  const double in_n = x ? numel(*x) : 0.0;
  const double out_n = out_elements(out);
  if (op.rfind("reduce_", 0) == 0 || one_of(op, {"global_avg_pool", "cum_sum", "arg_max", "arg_min"})) return in_n;
  if (one_of(op, {"softmax", "log_softmax"})) return 5.0 * in_n;
  if (op == "layer_norm") return 8.0 * in_n;
  if (op == "batch_norm") return 2.0 * in_n;
  if (one_of(op, {"max_pool2d", "avg_pool2d"})) {
    double taps = 1;
    for (std::int64_t k : attrs.get_ints("kernel_shape", {})) taps *= static_cast<double>(k);
    return out_n * taps;
  }
  if (op == "fused_elementwise") return out_n * program_ops(attrs);
  if (one_of(op, {"transpose", "concat", "slice", "gather", "gather_elements", "gather_nd", "expand", "pad",
                  "resize", "tile", "trilu", "one_hot", "scatter_nd", "copy", "non_zero", "top_k"})) {
    return 0.0;
  }
  return out_n;
}

std::string strip_domain(const std::string& op_type) {
  const auto colon = op_type.rfind(':');
  return colon == std::string::npos ? op_type : op_type.substr(colon + 1);
}

}  // namespace

NodeWork node_work(const std::string& op, const Attributes& attrs, const std::vector<TensorDesc>& inputs,
                   const std::vector<TensorDesc>& outputs, Precision precision) {
  NodeWork w;
  if (one_of(op, {"gather", "gather_elements", "gather_nd", "slice"})) {
    const TensorDesc* y = at(outputs, 0);
    w.bytes = 2.0 * (y ? nbytes(*y) : 0.0);
    for (std::size_t i = 1; i < inputs.size(); ++i) w.bytes += nbytes(inputs[i]);  // indices (and slice's bounds)
  } else if (op == "fused_elementwise" && attrs.has("input_views")) {
    w.bytes = viewed_io_bytes(attrs, inputs, outputs);
  } else {
    w.bytes = io_bytes(inputs, outputs);
  }
  double flops = 0;
  if (matrix_flops(op, attrs, inputs, outputs, &flops)) {
    w.flops = flops;
    const TensorDesc* x = at(inputs, 0);
    w.ceiling = one_of(op, {"qlinear", "qconv2d"}) ? "int8" : matrix_ceiling(x->dtype, precision);
    return w;
  }
  w.flops = vector_flops(op, attrs, inputs, outputs);
  if (w.flops > 0 || w.bytes > 0) w.ceiling = "vector";
  return w;
}

NodeWork node_work(const OpDescriptor& desc) {
  return node_work(desc.op, desc.attrs, desc.inputs, desc.outputs, desc.precision);
}

bool parse_shape_text(const std::string& text, TensorDesc* out) {
  const auto open = text.find('[');
  if (open == std::string::npos || text.empty() || text.back() != ']') return false;
  TensorDesc t;
  try {
    t.dtype = dtype_from_name(text.substr(0, open));
  } catch (const XpuRuntimeError&) {
    return false;
  }
  const std::string dims = text.substr(open + 1, text.size() - open - 2);
  std::stringstream in(dims);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty()) continue;
    char* end = nullptr;
    const long long d = std::strtoll(part.c_str(), &end, 10);
    if (end == part.c_str() || *end != '\0' || d < 0) return false;  // a symbolic or unknown dimension
    t.shape.push_back(d);
  }
  t.present = true;
  t.strides.clear();
  *out = std::move(t);
  return true;
}

NodeWork onnx_node_work(const std::string& op_type, const std::vector<std::string>& input_shapes,
                        const std::vector<std::string>& output_shapes) {
  auto parse = [](const std::vector<std::string>& texts) {
    std::vector<TensorDesc> out(texts.size());
    for (std::size_t i = 0; i < texts.size(); ++i) {
      if (!parse_shape_text(texts[i], &out[i])) out[i] = TensorDesc{};
    }
    return out;
  };
  return onnx_node_work(op_type, parse(input_shapes), parse(output_shapes));
}

NodeWork onnx_node_work(const std::string& op_type, const std::vector<TensorDesc>& in,
                        const std::vector<TensorDesc>& out) {
  const std::string op = strip_domain(op_type);
  if (op == "Gemm" || op == "FusedGemm") {  // A [M, K] or [K, M]: K = A's elements / M, M = the output's rows
    const TensorDesc* a = at(in, 0);
    const TensorDesc* y = at(out, 0);
    NodeWork w;
    w.bytes = io_bytes(in, out);
    if (a && y && y->shape.size() == 2 && y->shape[0] > 0) {
      w.flops = 2.0 * numel(*y) * numel(*a) / static_cast<double>(y->shape[0]);
      w.ceiling = matrix_ceiling(a->dtype, Precision::kFP32);
    }
    return w;
  }
  static const std::map<std::string, std::string> registry_op = {
      {"MatMul", "matmul"}, {"FusedMatMul", "matmul"}, {"MatMulInteger", "qlinear"}, {"MatMulNBits", "matmul_nbits"},
      {"Conv", "conv2d"}, {"FusedConv", "conv2d"}, {"ConvInteger", "qconv2d"}, {"ConvTranspose", "conv_transpose2d"},
      {"Softmax", "softmax"}, {"LogSoftmax", "log_softmax"}, {"LayerNormalization", "layer_norm"},
      {"SkipLayerNormalization", "layer_norm"}, {"BatchNormalization", "batch_norm"},
      {"GlobalAveragePool", "global_avg_pool"}, {"Transpose", "transpose"}, {"Concat", "concat"}, {"Slice", "slice"},
      {"Gather", "gather"}, {"GatherElements", "gather_elements"}, {"GatherND", "gather_nd"}, {"Expand", "expand"},
      {"Pad", "pad"}, {"Resize", "resize"}, {"Tile", "tile"}, {"ReduceSum", "reduce_sum"},
      {"ReduceMean", "reduce_mean"}, {"ReduceMax", "reduce_max"}, {"ReduceMin", "reduce_min"},
      {"ReduceProd", "reduce_prod"}, {"ReduceSumSquare", "reduce_sum_square"}, {"CumSum", "cum_sum"},
      {"ArgMax", "arg_max"}, {"ArgMin", "arg_min"},
      {"Attention", "attention"}};
  if (op == "QLinearMatMul" || op == "QLinearConv") {  // x, x_scale, x_zp, w, w_scale, w_zp, ...: x and w
    std::vector<TensorDesc> xw = {in.size() > 0 ? in[0] : TensorDesc{}, in.size() > 3 ? in[3] : TensorDesc{}};
    NodeWork w = node_work(op == "QLinearMatMul" ? "qlinear" : "qconv2d", {}, xw, out);
    w.bytes = io_bytes(in, out);
    return w;
  }
  if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Identity") {
    return {};  // views where the engine makes them; ORT may copy, but nothing needs to move
  }
  auto it = registry_op.find(op);
  // Unknown op types (elementwise in the main) fall to the per-output-element count of vector_flops.
  return node_work(it != registry_op.end() ? it->second : op, {}, in, out);
}

// ---- ceilings ----

// Note [Device ceilings]
// Bandwidth is a copy's: read + write bytes over the time of a large copy (the convention of
// kernel_roofline_bench.py and shared/docs/DEVICE.md's "device-to-device copy (read+write)"), so a node moving B
// bytes (inputs + outputs) at copy speed takes B / bandwidth.
//  - CPU: std::memcpy of 32 MiB (past the last-level caches of the machines here), the best of 6 after one warm-up.
//    Peaks: the registry's float32 matmul (the kernel nodes use, on the CPU thread pool) at 384^3, the best of 4
//    after a warm-up; every other key takes that figure (the CPU's fp16, bf16 and int8 kernels compute in float32
//    or in the same SIMD units; an override sets them apart).
//  - CUDA: cudaMemcpyAsync device to device of 256 MiB, the best of 5 after a warm-up, timed by CUDA events. Peaks
//    come from kCudaRates below: dense FLOP per clock per SM for each architecture and precision (NVIDIA's
//    architecture whitepapers: the datasheet TFLOP/s divided by SMs and boost clock), times the device's SM count
//    and its clock (cudaDevAttrClockRate, the boost clock). An H100/H200 SXM (sm_90, 132 SMs, 1.98 GHz) gives
//    4096 * 132 * 1.98e9 = 1070 TFLOP/s fp16 (the datasheet's 989 at 1.83 GHz); measured cuBLAS reaches 727
//    (shared/docs/DEVICE.md), so GEMMs show about 70% of this floor at their best. Override with measured figures
//    (XPURT_ROOFLINE_CUDA="fp16=727e12,bf16=777e12") to hold kernels to what the device's best library does.
struct ArchRates {
  int major;           // compute capability major (minor ignored unless listed apart)
  int minor;           // -1: any
  double fp16, bf16, tf32, fp32, fp8, int8, fp64, vector;  // dense FLOP per clock per SM
};

constexpr ArchRates kCudaRates[] = {
    // fp16, bf16 tensor; tf32 tensor; fp32 (fp32 FMA units); fp8, int8 tensor; fp64; vector (fp32 FMA units)
    {7, 0, 1024, 0, 0, 128, 0, 0, 64, 128},          // V100
    {7, 5, 1024, 0, 0, 128, 0, 2048, 4, 128},        // T4
    {8, 0, 2048, 2048, 1024, 128, 0, 4096, 128, 128},  // A100
    {8, 6, 1024, 1024, 512, 256, 0, 2048, 4, 256},   // GA10x
    {8, 7, 1024, 1024, 512, 256, 0, 2048, 4, 256},   // Orin
    {8, 9, 1024, 1024, 512, 256, 2048, 2048, 4, 256},  // Ada
    {9, 0, 4096, 4096, 2048, 256, 8192, 8192, 256, 256},  // H100, H200
    {10, -1, 8192, 8192, 4096, 256, 16384, 16384, 256, 256},  // B200, GB200
    {12, -1, 1024, 1024, 512, 256, 2048, 2048, 4, 256},  // RTX 50xx, RTX PRO Blackwell
};

namespace {

struct Cache {
  std::mutex mutex;
  std::map<std::string, DeviceCeilings> measured;  // by device name
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: summaries may run during exit
  return *c;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double cpu_copy_bandwidth() {
  const std::size_t bytes = 32u << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
    if (i > 0) best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(bytes) / best;
}

// The registry's matmul of n x n float32 matrices on the CPU: FLOP/s, best of `repeats` after a warm-up.
double cpu_matmul_rate(std::int64_t n, int repeats) {
  Tensor host = Tensor::empty({n, n}, DType::kFloat32);
  auto* p = static_cast<float*>(host.data_ptr());
  for (std::int64_t i = 0; i < n * n; ++i) p[i] = static_cast<float>((i * 7919) % 13) * 0.0625f - 0.375f;
  const Tensor& a = host;
  const Tensor& b = host;
  double best = 1e30;
  for (int i = 0; i <= repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor c = ops::matmul(a, b);
    if (i > 0) best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

void measure_cpu(DeviceCeilings& c, const std::vector<std::string>& keys, const std::map<std::string, double>& given) {
  if (c.bandwidth == 0 && given.count("bandwidth") == 0) {
    c.bandwidth = cpu_copy_bandwidth();
    c.source["bandwidth"] = "measured: memcpy of 32 MiB, read + write";
  }
  bool wanted = false;
  for (const auto& k : keys) wanted = wanted || (given.count(k) == 0 && c.peaks.count(k) == 0);
  if (!wanted) return;
  if (c.peaks.count("fp32") == 0) {
    const double rate = cpu_matmul_rate(384, 4);
    for (const auto& k : ceiling_keys()) {
      if (k == "bandwidth") continue;
      c.peaks[k] = rate;
      c.source[k] = k == "fp32" ? "measured: the registry's float32 matmul, 384^3"
                                : "the measured float32 matmul rate (the CPU's only measured peak)";
    }
  }
}

#if XPURT_WITH_CUDA
double cuda_copy_bandwidth(int index) {
  const std::size_t bytes = 256u << 20;
  int previous = 0;
  XPURT_CUDA_CHECK(cudaGetDevice(&previous));
  XPURT_CUDA_CHECK(cudaSetDevice(index));
  void* a = nullptr;
  void* b = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  double best = 1e30;
  auto release = [&] {
    if (a) (void)cudaFree(a);
    if (b) (void)cudaFree(b);
    if (start) (void)cudaEventDestroy(start);
    if (stop) (void)cudaEventDestroy(stop);
    (void)cudaSetDevice(previous);
  };
  try {
    XPURT_CUDA_CHECK(cudaMalloc(&a, bytes));
    XPURT_CUDA_CHECK(cudaMalloc(&b, bytes));
    XPURT_CUDA_CHECK(cudaMemset(a, 0, bytes));
    XPURT_CUDA_CHECK(cudaEventCreate(&start));
    XPURT_CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 6; ++i) {
      XPURT_CUDA_CHECK(cudaEventRecord(start, nullptr));
      XPURT_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr));
      XPURT_CUDA_CHECK(cudaEventRecord(stop, nullptr));
      XPURT_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      XPURT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (i > 0 && ms > 0) best = std::min(best, static_cast<double>(ms) * 1e-3);
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  return 2.0 * static_cast<double>(bytes) / best;
}
#endif

void measure_cuda(DeviceCeilings& c, const Device& device, const std::map<std::string, double>& given) {
#if XPURT_WITH_CUDA
  DeviceManager::instance().check_device(device);  // a typed error naming why, before any CUDA call
  if (c.bandwidth == 0 && given.count("bandwidth") == 0) {
    c.bandwidth = cuda_copy_bandwidth(device.index);
    c.source["bandwidth"] = "measured: cudaMemcpyAsync device to device of 256 MiB, read + write";
  }
  if (!c.peaks.empty()) return;
  const DeviceInfo info = DeviceManager::instance().get_device_info(device);
  int clock_khz = 0;
  XPURT_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device.index));
  const ArchRates* rates = nullptr;
  for (const auto& r : kCudaRates) {
    if (r.major == info.compute_capability_major && (r.minor < 0 || r.minor == info.compute_capability_minor)) {
      rates = &r;
    }
  }
  if (rates == nullptr) {  // an architecture the table lacks: the nearest older one
    for (const auto& r : kCudaRates) {
      if (r.major <= info.compute_capability_major) rates = &r;
    }
  }
  if (rates == nullptr) return;
  const double per_clock = static_cast<double>(info.sm_count) * static_cast<double>(clock_khz) * 1e3;
  const std::pair<const char*, double> figures[] = {
      {"fp16", rates->fp16}, {"bf16", rates->bf16}, {"tf32", rates->tf32}, {"fp32", rates->fp32},
      {"fp8", rates->fp8},   {"int8", rates->int8}, {"fp64", rates->fp64}, {"vector", rates->vector}};
  std::ostringstream arch;
  arch << "sm" << info.compute_capability() << ": " << info.sm_count << " SMs at " << clock_khz / 1000 << " MHz";
  for (const auto& [key, rate] : figures) {
    // A precision the architecture lacks runs in the next wider one: its peak is fp32's.
    c.peaks[key] = (rate > 0 ? rate : rates->fp32) * per_clock;
    std::ostringstream s;
    s << "table (Note [Device ceilings]): " << (rate > 0 ? rate : rates->fp32) << " FLOP/clock/SM x " << arch.str();
    c.source[key] = s.str();
  }
#else
  (void)c;
  (void)given;
  throw UnsupportedOperationError("the roofline of " + device.str() + " needs a build with CUDA");
#endif
}

}  // namespace

const std::vector<std::string>& ceiling_keys() {
  static const std::vector<std::string> keys = {"bandwidth", "fp32", "tf32", "fp16", "bf16",
                                                "fp8",       "int8", "fp64", "vector"};
  return keys;
}

double DeviceCeilings::peak(const std::string& key) const {
  auto it = peaks.find(key);
  return it == peaks.end() ? 0.0 : it->second;
}

std::map<std::string, double> parse_overrides(const std::string& text) {
  std::map<std::string, double> out;
  std::stringstream in(text);
  std::string entry;
  const auto& keys = ceiling_keys();
  while (std::getline(in, entry, ',')) {
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    if (entry.empty()) continue;
    const auto eq = entry.find('=');
    XPURT_CHECK(eq != std::string::npos, "roofline ceiling '", entry, "' is not KEY=VALUE (e.g. bandwidth=4.23e12)");
    const std::string key = entry.substr(0, eq);
    const std::string value = entry.substr(eq + 1);
    XPURT_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(), "unknown roofline ceiling '", key,
                "': expected bandwidth (bytes/s) or a peak (FLOP/s): fp32, tf32, fp16, bf16, fp8, int8, fp64, vector");
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    XPURT_CHECK(end != value.c_str() && *end == '\0' && v > 0, "roofline ceiling ", key, "=", value,
                ": expected a positive number (bytes or operations per second, e.g. 4.23e12)");
    out[key] = v;
  }
  return out;
}

DeviceCeilings ceilings(const std::string& device_text, const std::vector<std::string>& keys,
                        const std::map<std::string, double>& overrides) {
  const Device device = Device::parse(device_text);
  std::map<std::string, double> given;
  if (const char* env = std::getenv(device.is_cuda() ? "XPURT_ROOFLINE_CUDA" : "XPURT_ROOFLINE_CPU")) {
    given = parse_overrides(env);
  }
  for (const auto& [k, v] : overrides) given[k] = v;
  DeviceCeilings c;
  {
    Cache& cc = cache();
    std::lock_guard<std::mutex> lock(cc.mutex);  // measured once: concurrent summaries wait for the first
    DeviceCeilings& m = cc.measured[device.str()];
    m.device = device.str();
    // A device that cannot be measured here (a profile of a CUDA run read on a machine without one) has unknown
    // figures (0) but for the overrides, and says why: a summary never fails for want of a ceiling.
    try {
      if (device.is_cuda()) {
        measure_cuda(m, device, given);
      } else {
        measure_cpu(m, keys, given);
      }
      m.source.erase("error");
    } catch (const XpuRuntimeError& e) {
      m.source["error"] = std::string("not measured: ") + e.what();
    }
    c = m;
  }
  for (const auto& [k, v] : given) {
    const bool from_env = overrides.count(k) == 0;
    const std::string how = from_env ? std::string("override: ") +
                                           (device.is_cuda() ? "XPURT_ROOFLINE_CUDA" : "XPURT_ROOFLINE_CPU")
                                     : std::string("override: given");
    if (k == "bandwidth") {
      c.bandwidth = v;
    } else {
      c.peaks[k] = v;
    }
    c.source[k] = how;
  }
  return c;
}

Floor floor_of(const NodeWork& work, const DeviceCeilings& c) {
  Floor f;
  if (!work.known()) return f;
  const double memory_ns = c.bandwidth > 0 ? work.bytes / c.bandwidth * 1e9 : 0.0;
  const double peak = c.peak(work.ceiling);
  const double compute_ns = peak > 0 ? work.flops / peak * 1e9 : 0.0;
  f.ns = std::max(memory_ns, compute_ns);
  if (f.ns > 0) f.bound = compute_ns > memory_ns ? "compute" : "memory";
  return f;
}

double efficiency(double floor_ns, double measured_ns) {
  return floor_ns > 0 && measured_ns > 0 ? floor_ns / measured_ns : 0.0;
}

}  // namespace xpuruntime::roofline
