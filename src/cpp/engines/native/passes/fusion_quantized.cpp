// quantized_fusion: a quantized model's DequantizeLinear -> MatMul/Gemm/Conv -> [bias] [Relu] [QuantizeLinear] chains
// -> com.xpuruntime:QLinear / QConv, lowered onto the int8 registry ops qlinear / qconv2d (see passes.h,
// docs/native_engine.md, Note [Quantized registry ops] in core/op_schemas.cpp).
//
// Note [Quantized fusion]
// A QDQ model (xrt.quantize, ONNX Runtime's quantize_static, PyTorch's PT2E export) writes each quantized node as
// DQ(x_q) and DQ(w_q) feeding a float MatMul/Gemm/Conv, often followed by the bias Add, a Relu and the QuantizeLinear
// of the next node's input. Run as written, the activations go int8 -> float32 -> int8 through memory at every node
// and the GEMM runs in float. The pass rewrites the chain into one int8 op with int32 accumulation whose epilogue
// applies the scales, the bias, the Relu and the requantization; the unfused chain computes the same real numbers in
// float32, so the two agree to within one quantization step on the requantized outputs (ties and float32 rounding of
// the sums).
//
// It fires only on exact patterns: x's DQ per tensor (one-element constant float32 scale, constant zero point) of an
// int8/uint8 value; the weight's DQ of a constant int8 tensor, per tensor or per output channel (MatMul axis 1, Gemm
// axis 1 or with transB=1 axis 0, Conv axis 0), zero points absent or 0 (symmetric); the QuantizeLinear per tensor to
// int8/uint8. float8 GEMM chains become QLinearFp8 (Note [Float8 quantized fusion]); float8 convolutions and int4
// (and uint8 weights, blocked scales) stay on the node kernels. Constant folding would
// turn the weight's DQ into a float constant before any pass runs, so while this pass is on the folding keeps those
// DQs (PassContext::keep_quantized_weights) and this pass folds the ones it leaves. ONNX's own quantized operators
// (QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger) become the same nodes here rather than in the lowering's
// table, so that disabled_passes=["quantized_fusion"] runs every quantized model as written, on the node kernels;
// MatMulInteger's a_zero_point may be one value known only at run time (DynamicQuantizeLinear's, as ONNX Runtime's
// quantize_dynamic writes it): qlinear's input x_zero_point. Every QLinear whose weight is a constant reads it as
// [N, K] (weight_layout=nk): a [K, N] weight (MatMul, Gemm without transB, QLinearMatMul, MatMulInteger) is
// transposed here once into a new constant, because cuBLASLt's int8 GEMM takes only K-contiguous operands (Note
// [cuBLASLt int8 GEMMs] in backends/cublaslt/cublaslt_qlinear.cpp); a weight known only at run time stays [K, N] for
// the kernels that take it (cuda_raw's dp4a, the cpu kernel).
//
// Note [Float pinned by the KernelPolicy]
// A KernelPolicy rule for the float op a chain would otherwise leave (linear/matmul or their family for MatMul/Gemm,
// conv2d or its family for Conv), with no rule for the int8 op (qlinear, qconv2d), keeps those chains in float: the
// user chose the float op's kernel, so its nodes run as written (DequantizeLinear, then the float op in the plan's
// precision), and the pass's notes say which rule kept them. This is how a policy pins an op family of a quantized
// model to float16 (ExecutionPolicy precision=fp16 with such a rule); xrt.quantize's `exclude` does the same per node
// when the model is made. A policy that rules fused_elementwise too (what `xpuruntime tune` writes) rules every op
// of the plan it was tuned on and keeps the fusion as tuned (PassContext::keep_unfused).
//
// Note [Quantized fusion in float16 plans]
// A float16 plan (ExecutionPolicy precision=float16) converts the model's float32 constants, the Q/DQ scales among
// them, to float16 before the passes run (CapturePlan::build's convert_precision), so its chains compute in float16:
// the pass then takes float16 scales and biases (their float16 values, widened exactly) and gives the fused node
// output_dtype=float16 where the chain ended in a float. The int8 arithmetic is the same; only the scales carry the
// float16 rounding the user's precision asked for. bfloat16 plans keep the chains on the node kernels.
// Note [Float8 quantized fusion]
// The float8 chains xrt.quantize(precision="fp8") writes, DQ(x float8e4m3fn, per tensor) and DQ(constant weight
// float8e4m3fn, per tensor or per output channel), zero points absent or 0, -> MatMul/Gemm -> [bias] [Relu] ->
// [QuantizeLinear per tensor to float8e4m3fn, saturate=1], become com.xpuruntime:QLinearFp8, lowered onto the
// registry op qlinear_fp8 (Note [Float8 quantized linear] in core/op_schemas.cpp): on CUDA cuBLASLt's float8 tensor
// cores, on the CPU the reference kernel. The matching is the int8 chains' (above), with the constant weight laid out
// [N, K] the same way (cuBLASLt's float8 GEMM is "TN" only, as its int8 one). A CUDA plan fuses only chains whose
// shape cuBLASLt takes on a device it runs on (K a multiple of 16, N of 4, sm_89+; fp8_cuda_problem): the others
// run as written, dequantized to float and multiplied by the float GEMM, and explain() says why (a "pass
// quantized_fusion: kept ..." line each). Mixed chains (an int8 x with a
// float8 weight, or the reverse), float8e5m2, and a QuantizeLinear to int8 after a float8 GEMM are not fused (the
// chain then ends in float, and the QuantizeLinear runs as written). ExecutionPolicy.fp8_fast_accumulation gives every
// QLinearFp8 fast_accumulation=1 (PassContext::fp8_fast_accumulation; Note [cuBLASLt float8 GEMMs]).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engines/native/lowering/lowering.h"
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

bool is_8bit(DType d) { return d == DType::kInt8 || d == DType::kUInt8; }

// The float8 format of the chains that become QLinearFp8 (Note [Float8 quantized fusion]).
constexpr DType kFp8 = DType::kFloat8E4M3FN;

// cuBLASLt's float8 GEMM runs on float8 tensor cores (sm_89+) and takes K and N only in multiples of 16 and 4 (Note
// [cuBLASLt float8 GEMMs] in backends/cublaslt/cublaslt_qlinear_fp8.cpp): why a plan on CUDA device `device` keeps a
// chain of this [K, N] unfused, or empty. A device whose capability cannot be read here (no GPU: graph tests) is not
// asked.
std::string fp8_cuda_problem(const Device& device, std::int64_t k, std::int64_t n) {
  int capability = 0;
  try {
    capability = DeviceManager::instance().get_device_info(device).compute_capability();
  } catch (const XpuRuntimeError&) {
    capability = 0;
  }
  if (capability > 0 && capability < 89) {
    return "float8 tensor cores need compute capability 8.9 or newer, and " + device.str() + " is sm_" +
           std::to_string(capability);
  }
  if (k % 16 == 0 && n % 4 == 0 && k > 0) return {};
  return "cuBLASLt's float8 GEMM needs K a multiple of 16 and N a multiple of 4, got K = " + std::to_string(k) +
         " and N = " + std::to_string(n);
}

// Whether the optional zero point input `i` of `n` is absent or a constant of `dtype` holding zeros only.
bool zero_point_absent_or_zero(const Graph& g, const Node& n, std::size_t i, DType dtype) {
  if (!n.has_input(i)) return true;
  const Tensor* zp = constant(g, n.inputs[i]);
  if (zp == nullptr || zp->dtype() != dtype) return false;
  for (double v : to_doubles(*zp)) {
    if (v != 0) return false;
  }
  return true;
}

// The float types a fused chain may compute in: float32, or float16 in a float16 plan (Note [Quantized fusion in
// float16 plans]).
bool is_chain_float(std::optional<DType> d) { return d == DType::kFloat32 || d == DType::kFloat16; }

// A one-element constant of `dtype` (any dtype when nullopt).
std::optional<double> one_element(const Graph& g, const std::string& value, std::optional<DType> dtype) {
  const Tensor* t = value.empty() ? nullptr : constant(g, value);
  if (t == nullptr || t->numel() != 1 || (dtype && t->dtype() != *dtype)) return std::nullopt;
  return to_doubles(*t)[0];
}

// A one-element constant scale: float32, or float16 where a float16 plan converted the model's float32 scales.
std::optional<double> scale_scalar(const Graph& g, const std::string& value) {
  const Tensor* t = value.empty() ? nullptr : constant(g, value);
  if (t == nullptr || !is_chain_float(t->dtype())) return std::nullopt;
  return one_element(g, value, t->dtype());
}

bool blocked(const Node& dq) { return dq.attrs.get_int("block_size", 0) != 0; }

// The DequantizeLinear producing `value`, not taken yet.
std::optional<std::size_t> dequantize_of(const Graph& g, const Uses& uses, const Rewriter& rw,
                                         const std::string& value) {
  auto p = uses.producer(value);
  if (!p || rw.taken(*p) || !is_onnx(g.nodes[*p], "DequantizeLinear") || g.nodes[*p].inputs.size() < 2 ||
      blocked(g.nodes[*p])) {
    return std::nullopt;
  }
  return p;
}

// x's DequantizeLinear: per tensor, of an int8/uint8 value, or of a float8e4m3fn one with its zero point 0 (`fp8`).
struct ActivationDq {
  std::size_t node = 0;
  std::string q;
  double scale = 0;
  std::int64_t zero_point = 0;
  bool fp8 = false;
};

std::optional<ActivationDq> activation_dq(const Graph& g, const Uses& uses, const Rewriter& rw,
                                          const std::string& value) {
  auto p = dequantize_of(g, uses, rw, value);
  if (!p) return std::nullopt;
  const Node& dq = g.nodes[*p];
  auto dtype = value_dtype(g, dq.inputs[0]);
  if (dtype == kFp8) {
    auto scale = scale_scalar(g, dq.inputs[1]);
    if (!scale || !(*scale > 0) || !zero_point_absent_or_zero(g, dq, 2, kFp8)) return std::nullopt;
    return ActivationDq{*p, dq.inputs[0], *scale, 0, true};
  }
  if (!dtype || !is_8bit(*dtype)) return std::nullopt;
  auto scale = scale_scalar(g, dq.inputs[1]);
  auto zp = dq.has_input(2) ? one_element(g, dq.inputs[2], *dtype) : std::optional<double>(0.0);
  if (!scale || !zp || !(*scale > 0)) return std::nullopt;
  return ActivationDq{*p, dq.inputs[0], *scale, static_cast<std::int64_t>(*zp)};
}

// The weight's DequantizeLinear: a constant int8 tensor of `rank`, one scale or one per index of `channel_axis`
// (`channels` of them), zero points absent or 0.
struct WeightDq {
  std::size_t node = 0;
  std::string q;
  std::vector<double> scales;  // one, or `channels`
};

std::optional<WeightDq> weight_dq(const Graph& g, const Uses& uses, const Rewriter& rw, const std::string& value,
                                  int rank, int channel_axis) {
  auto p = dequantize_of(g, uses, rw, value);
  if (!p) return std::nullopt;
  const Node& dq = g.nodes[*p];
  const Tensor* w = constant(g, dq.inputs[0]);
  const Tensor* scale = constant(g, dq.inputs[1]);
  if (w == nullptr || (w->dtype() != DType::kInt8 && w->dtype() != kFp8) || w->dim() != rank || scale == nullptr ||
      !is_chain_float(scale->dtype())) {
    return std::nullopt;
  }
  const std::int64_t channels = w->shape()[static_cast<std::size_t>(channel_axis)];
  if (scale->numel() != 1) {
    std::int64_t axis = dq.attrs.get_int("axis", 1);
    if (axis < 0) axis += rank;
    if (scale->dim() != 1 || scale->numel() != channels || axis != channel_axis) return std::nullopt;
  }
  if (!zero_point_absent_or_zero(g, dq, 2, w->dtype())) return std::nullopt;
  WeightDq out{*p, dq.inputs[0], to_doubles(*scale)};
  for (double s : out.scales) {
    if (!(s > 0)) return std::nullopt;
  }
  return out;
}

// A constant adding one float32 value per output channel to an output whose channel axis is `axis_from_end` from the
// last: its values (`channels` of them), or nullopt.
std::optional<std::vector<double>> channel_bias(const Graph& g, const std::string& value, std::int64_t channels,
                                                std::size_t axis_from_end) {
  const Tensor* c = value.empty() ? nullptr : constant(g, value);
  if (c == nullptr || !is_chain_float(c->dtype())) return std::nullopt;
  std::vector<double> values = to_doubles(*c);
  if (values.size() == 1 && c->dim() <= 1) return std::vector<double>(static_cast<std::size_t>(channels), values[0]);
  if (static_cast<std::int64_t>(values.size()) != channels || c->dim() < static_cast<int>(axis_from_end) + 1) {
    return std::nullopt;
  }
  for (int i = 0; i < c->dim(); ++i) {
    const auto from_end = static_cast<std::size_t>(c->dim() - 1 - i);
    if (from_end != axis_from_end && c->shape()[static_cast<std::size_t>(i)] != 1) return std::nullopt;
  }
  return values;
}

// What the matched chain became: the fused node's inputs and attributes are filled in as the chain is read.
struct Chain {
  std::vector<std::size_t> pattern;
  std::vector<std::string> parts;
  std::string out;
  std::optional<std::vector<double>> bias;
  std::string activation = "none";
  std::string output_dtype = "float32";
  double y_scale = 0;
  std::int64_t y_zero_point = 0;
  bool fp8 = false;  // a float8 chain: QLinearFp8, whose QuantizeLinear may only be to float8e4m3fn
};

// The QuantizeLinear `q` that ends a float8 chain: per tensor to float8e4m3fn (a zero point of zeros, or opset 21's
// output_dtype without one), saturating (ONNX's default saturate=1); its scale, or nullopt.
std::optional<double> fp8_output_scale(const Graph& g, const Node& q) {
  const bool to_fp8 = q.has_input(2)
                           ? zero_point_absent_or_zero(g, q, 2, kFp8) && constant(g, q.inputs[2])->numel() == 1
                           : q.attrs.get_int("output_dtype", 0) == 17;  // TensorProto.FLOAT8E4M3FN
  if (!to_fp8 || q.attrs.get_int("saturate", 1) != 1) return std::nullopt;
  auto scale = scale_scalar(g, q.inputs[1]);
  if (!scale || !(*scale > 0)) return std::nullopt;
  return scale;
}

// [Add(per-channel constant)] [Relu] [QuantizeLinear per tensor to int8/uint8] after chain.out.
void read_epilogue(const Graph& g, const Uses& uses, const Rewriter& rw, std::int64_t channels,
                   std::size_t axis_from_end, Chain& chain) {
  if (!chain.bias) {
    if (auto ai = sole_reader(g, uses, rw, chain.out, "Add")) {
      const Node& add = g.nodes[*ai];
      auto values = add.inputs.size() == 2 ? channel_bias(g, other_input(add, chain.out), channels, axis_from_end)
                                           : std::nullopt;
      auto add_type = value_type(g, add.outputs[0]);
      auto own_type = value_type(g, chain.out);
      if (values && add_type && own_type && same_shape(*add_type, *own_type)) {
        chain.bias = values;
        chain.pattern.push_back(*ai);
        chain.parts.push_back(describe(add) + " (bias)");
        chain.out = add.outputs[0];
      }
    }
  }
  if (auto ri = sole_reader(g, uses, rw, chain.out, "Relu")) {
    chain.activation = "relu";
    chain.pattern.push_back(*ri);
    chain.parts.push_back(describe(g.nodes[*ri]));
    chain.out = g.nodes[*ri].outputs[0];
  }
  if (auto qi = sole_reader(g, uses, rw, chain.out, "QuantizeLinear")) {
    const Node& q = g.nodes[*qi];
    if (q.inputs.size() < 2 || blocked(q)) return;
    if (chain.fp8) {
      const auto y_scale = fp8_output_scale(g, q);
      if (!y_scale) return;
      chain.output_dtype = "float8e4m3fn";
      chain.y_scale = *y_scale;
      chain.pattern.push_back(*qi);
      chain.parts.push_back(describe(q));
      chain.out = q.outputs[0];
      return;
    }
    auto scale = scale_scalar(g, q.inputs[1]);
    std::optional<double> zp = 0.0;
    DType dtype = DType::kUInt8;  // ONNX's default without a zero point
    if (q.has_input(2)) {
      const Tensor* z = constant(g, q.inputs[2]);
      zp = z != nullptr && is_8bit(z->dtype()) ? one_element(g, q.inputs[2], std::nullopt) : std::nullopt;
      if (z != nullptr) dtype = z->dtype();
    } else if (q.attrs.has("output_dtype")) {
      return;  // opset 21's output_dtype without a zero point: int4, float8, 16-bit, ... left to the node kernel
    }
    if (!scale || !(*scale > 0) || !zp) return;
    chain.output_dtype = dtype == DType::kInt8 ? "int8" : "uint8";
    chain.y_scale = *scale;
    chain.y_zero_point = static_cast<std::int64_t>(*zp);
    chain.pattern.push_back(*qi);
    chain.parts.push_back(describe(q));
    chain.out = q.outputs[0];
  }
}

// The fused node of a matched chain.
Node fused_node(Graph& g, const Node& op, const std::string& op_type, const ActivationDq& x, const WeightDq& w,
                std::int64_t channels, const Chain& chain) {
  Node fused;
  fused.name = op.name;
  fused.domain = kXpurtDomain;
  fused.op_type = op_type;
  const std::int64_t scales = static_cast<std::int64_t>(w.scales.size());
  fused.inputs = {x.q, w.q, add_constant(g, op.name + "_w_scale", from_doubles({scales}, DType::kFloat32, w.scales))};
  // A float8 chain of a float16 plan keeps its bias in float16 (its values are the plan's float16 constants, so
  // exactly): cuBLASLt's float8 epilogue reads a 16-bit bias as it is (Note [Quantized fusion in float16 plans]).
  const DType bias_dtype = chain.fp8 && chain.output_dtype == "float16" ? DType::kFloat16 : DType::kFloat32;
  if (chain.bias) {
    fused.inputs.push_back(add_constant(g, op.name + "_bias", from_doubles({channels}, bias_dtype, *chain.bias)));
  }
  fused.outputs = {chain.out};
  fused.attrs.set("x_scale", x.scale);
  if (!chain.fp8) fused.attrs.set("x_zero_point", x.zero_point);
  if (chain.output_dtype != "float32" && chain.output_dtype != "float16") {
    fused.attrs.set("y_scale", chain.y_scale);
    if (!chain.fp8) fused.attrs.set("y_zero_point", chain.y_zero_point);
  }
  fused.attrs.set("activation", chain.activation);
  fused.attrs.set("output_dtype", chain.output_dtype);
  return fused;
}

// The constant weights of QLinear nodes laid out [N, K] (Note [Quantized fusion]): each [K, N] constant transposed
// once into a new constant, whatever number of nodes read it.
class NkWeights {
 public:
  // The name of the [N, K] copy of the constant int8 or float8 [K, N] tensor `kn` (one byte an element).
  std::string of(Graph& g, const std::string& kn) {
    const auto found = names_.find(kn);
    if (found != names_.end()) return found->second;
    const Tensor w = constant(g, kn)->contiguous();
    const std::int64_t k = w.shape()[0], n = w.shape()[1];
    Tensor t = Tensor::empty({n, k}, w.dtype(), Device::cpu());
    const auto* src = static_cast<const std::int8_t*>(w.data_ptr());
    auto* dst = static_cast<std::int8_t*>(t.data_ptr());
    for (std::int64_t r = 0; r < k; ++r) {
      for (std::int64_t c = 0; c < n; ++c) dst[c * k + r] = src[r * n + c];
    }
    return names_.emplace(kn, add_constant(g, kn + "_nk", t)).first->second;
  }
  // The [K, N] constants transposed: removed once no node reads them.
  std::set<std::string> originals() const {
    std::set<std::string> out;
    for (const auto& entry : names_) out.insert(entry.first);
    return out;
  }

 private:
  std::map<std::string, std::string> names_;
};

// A MatMul or Gemm node at `mi` whose operands are dequantized: the QLinear node (QLinearFp8 for a float8 chain), or
// nothing; a float8 chain that a CUDA plan keeps unfused says why in `result`'s notes.
bool fuse_gemm(Graph& g, const Uses& uses, Rewriter& rw, std::size_t mi, NkWeights& nk_weights,
               const PassContext& ctx, PassResult& result) {
  const Node& mm = g.nodes[mi];
  const bool gemm = is_onnx(mm, "Gemm");
  if (!gemm && !is_onnx(mm, "MatMul")) return false;
  if (mm.inputs.size() < 2 || mm.outputs.size() != 1 || !is_chain_float(value_dtype(g, mm.outputs[0]))) return false;
  auto x_type = value_type(g, mm.inputs[0]);
  if (!x_type || !x_type->has_shape || x_type->shape.empty() || (gemm && x_type->shape.size() != 2)) return false;
  const bool nk = gemm && mm.attrs.get_int("transB", 0) != 0;
  if (gemm && (mm.attrs.get_int("transA", 0) != 0 || g.opset(mm.domain) < 7)) return false;
  auto x = activation_dq(g, uses, rw, mm.inputs[0]);
  auto w = x ? weight_dq(g, uses, rw, mm.inputs[1], 2, nk ? 0 : 1) : std::nullopt;
  if (!w) return false;
  const Tensor& wq = *constant(g, w->q);
  const bool fp8 = wq.dtype() == kFp8;
  if (fp8 != x->fp8) return false;  // int8 with float8: no kernel multiplies them
  const std::int64_t channels = wq.shape()[nk ? 0 : 1];
  if (fp8 && ctx.device.is_cuda()) {
    const std::string problem = fp8_cuda_problem(ctx.device, wq.shape()[nk ? 1 : 0], channels);
    if (!problem.empty()) {
      result.notes.push_back("kept " + describe(mm) + " unfused (DequantizeLinear, then the float op): " + problem);
      return false;
    }
  }
  Chain chain;
  chain.fp8 = fp8;
  chain.pattern = {mi};
  chain.parts = {describe(mm)};
  chain.out = mm.outputs[0];
  if (value_dtype(g, chain.out) == DType::kFloat16) chain.output_dtype = "float16";
  if (gemm) {
    const double alpha = mm.attrs.get_float("alpha", 1.0);
    for (double& s : w->scales) s *= alpha;
    if (mm.has_input(2)) {
      chain.bias = channel_bias(g, mm.inputs[2], channels, 0);
      if (!chain.bias) return false;  // a C of shape [M, N] (or not constant) is not a bias
      for (double& v : *chain.bias) v *= mm.attrs.get_float("beta", 1.0);
    }
  }
  read_epilogue(g, uses, rw, channels, 0, chain);
  Node fused = fused_node(g, mm, fp8 ? "QLinearFp8" : "QLinear", *x, *w, channels, chain);
  if (!nk) fused.inputs[1] = nk_weights.of(g, w->q);
  fused.attrs.set("weight_layout", std::string("nk"));
  if (fp8 && ctx.fp8_fast_accumulation) fused.attrs.set("fast_accumulation", std::int64_t{1});
  std::vector<std::size_t> pattern = chain.pattern;
  if (uses.only_reader(mm.inputs[0], mi)) pattern.push_back(x->node);
  if (uses.only_reader(mm.inputs[1], mi)) pattern.push_back(w->node);
  std::string note = "fused " + describe(g.nodes[x->node]) + " + " + describe(g.nodes[w->node]);
  for (const std::string& part : chain.parts) note += " + " + part;
  const char* accumulation = ctx.fp8_fast_accumulation ? ", fast accumulation" : "";
  rw.replace(pattern, {std::move(fused)},
             note + (fp8 ? " -> QLinearFp8 '" + mm.name + "' (qlinear_fp8, float8" + accumulation + ")"
                         : " -> QLinear '" + mm.name + "' (qlinear, int8)"));
  return true;
}

// A 2-D Conv at `ci` whose operands are dequantized (explicit or VALID padding): the QConv node, or nothing.
bool fuse_conv(Graph& g, const Uses& uses, Rewriter& rw, std::size_t ci) {
  const Node& conv = g.nodes[ci];
  if (!is_onnx(conv, "Conv") || conv.inputs.size() < 2 || conv.outputs.size() != 1 ||
      !is_chain_float(value_dtype(g, conv.outputs[0]))) {
    return false;
  }
  auto x_type = value_type(g, conv.inputs[0]);
  if (!x_type || !x_type->has_shape || x_type->shape.size() != 4) return false;
  auto x = activation_dq(g, uses, rw, conv.inputs[0]);
  auto w = x ? weight_dq(g, uses, rw, conv.inputs[1], 4, 0) : std::nullopt;
  if (!w || x->fp8 || constant(g, w->q)->dtype() != DType::kInt8) return false;  // float8 convolutions stay unfused
  const std::vector<std::int64_t>& ws = constant(g, w->q)->shape();
  const std::vector<std::int64_t> kernel = {ws[2], ws[3]};
  if (conv.attrs.has("kernel_shape") && conv.attrs.get_ints("kernel_shape", {}) != kernel) return false;
  const auto strides = conv.attrs.get_ints("strides", {1, 1});
  const auto dilations = conv.attrs.get_ints("dilations", {1, 1});
  const std::string auto_pad = conv.attrs.get_string("auto_pad", "NOTSET");
  auto pads = auto_pad == "VALID" ? std::vector<std::int64_t>{0, 0, 0, 0} : conv.attrs.get_ints("pads", {0, 0, 0, 0});
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4 ||
      (auto_pad != "NOTSET" && auto_pad != "VALID")) {
    return false;
  }
  Chain chain;
  chain.pattern = {ci};
  chain.parts = {describe(conv)};
  chain.out = conv.outputs[0];
  if (value_dtype(g, chain.out) == DType::kFloat16) chain.output_dtype = "float16";
  if (conv.has_input(2)) {
    chain.bias = channel_bias(g, conv.inputs[2], ws[0], 0);
    if (!chain.bias) return false;
  }
  read_epilogue(g, uses, rw, ws[0], 2, chain);
  Node fused = fused_node(g, conv, "QConv", *x, *w, ws[0], chain);
  fused.attrs.set("strides", strides);
  fused.attrs.set("pads", pads);
  fused.attrs.set("dilations", dilations);
  fused.attrs.set("groups", conv.attrs.get_int("group", 1));
  std::vector<std::size_t> pattern = chain.pattern;
  if (uses.only_reader(conv.inputs[0], ci)) pattern.push_back(x->node);
  if (uses.only_reader(conv.inputs[1], ci)) pattern.push_back(w->node);
  std::string note = "fused " + describe(g.nodes[x->node]) + " + " + describe(g.nodes[w->node]);
  for (const std::string& part : chain.parts) note += " + " + part;
  rw.replace(pattern, {std::move(fused)}, note + " -> QConv '" + conv.name + "' (qconv2d, int8)");
  return true;
}

// ONNX's QLinearMatMul, MatMulInteger, QLinearConv or ConvInteger at `i` -> QLinear / QConv, on the conditions of
// runtime::lower_quantized_onnx; otherwise its reason goes into the notes and the node stays for its node kernel.
bool convert_quantized_onnx(Graph& g, Rewriter& rw, std::size_t i, PassResult& result, NkWeights& nk_weights) {
  const Node& n = g.nodes[i];
  static const std::set<std::string> kOps = {"QLinearMatMul", "MatMulInteger", "QLinearConv", "ConvInteger"};
  if (!kOps.count(n.op_type) || !is_onnx(n, n.op_type.c_str()) || n.outputs.size() != 1) return false;
  std::vector<std::optional<ValueType>> stored;
  stored.reserve(n.inputs.size());
  std::vector<const ValueType*> types;
  std::vector<const Tensor*> constants;
  for (const std::string& in : n.inputs) {
    stored.push_back(in.empty() ? std::nullopt : value_type(g, in));
    types.push_back(stored.back() ? &*stored.back() : nullptr);
    constants.push_back(in.empty() ? nullptr : constant(g, in));
  }
  const runtime::Lowered lowered = runtime::lower_quantized_onnx(n, g.opset(n.domain), types, constants);
  if (lowered.kind != runtime::Lowered::Kind::kRegistry) {
    result.notes.push_back("kept " + describe(n) + " for its node kernel: " + lowered.reason);
    return false;
  }
  Node fused;
  fused.name = n.name;
  fused.domain = kXpurtDomain;
  fused.op_type = lowered.op == "qlinear" ? "QLinear" : "QConv";
  for (int k : lowered.inputs) fused.inputs.push_back(k >= 0 ? n.inputs[static_cast<std::size_t>(k)] : std::string());
  while (!fused.inputs.empty() && fused.inputs.back().empty()) fused.inputs.pop_back();
  fused.outputs = n.outputs;
  fused.attrs = lowered.attrs;
  if (lowered.op == "qlinear" && fused.attrs.get_string("weight_layout", "kn") == "kn" &&
      constant(g, fused.inputs[1]) != nullptr) {
    fused.inputs[1] = nk_weights.of(g, fused.inputs[1]);
    fused.attrs.set("weight_layout", std::string("nk"));
  }
  rw.replace({i}, {std::move(fused)}, describe(n) + " -> " + (lowered.op == "qlinear" ? "QLinear '" : "QConv '") +
                                          n.name + "' (" + lowered.op + ", int8)");
  return true;
}

// Whether the KernelPolicy keeps the MatMul/Gemm/Conv at `i` in float (Note [Float pinned by the KernelPolicy]): its
// note, or nullopt. Only a node that reads a dequantized weight gets a note.
std::optional<std::string> kept_float(const Graph& g, const Uses& uses, const PassContext& ctx, std::size_t i) {
  const Node& n = g.nodes[i];
  const bool conv = is_onnx(n, "Conv");
  if (!ctx.keep_unfused || (!conv && !is_onnx(n, "MatMul") && !is_onnx(n, "Gemm")) || n.inputs.size() < 2) {
    return std::nullopt;
  }
  auto p = uses.producer(n.inputs[1]);
  if (!p || !is_onnx(g.nodes[*p], "DequantizeLinear")) return std::nullopt;
  const std::vector<std::string> float_ops = conv ? std::vector<std::string>{"conv2d"}
                                                  : std::vector<std::string>{"linear", "matmul"};
  const Tensor* wq = g.nodes[*p].inputs.empty() ? nullptr : constant(g, g.nodes[*p].inputs[0]);
  const bool fp8 = wq != nullptr && wq->dtype() == kFp8;
  const std::string quantized_op = conv ? "qconv2d" : (fp8 ? "qlinear_fp8" : "qlinear");
  if (ctx.keep_unfused(quantized_op)) return std::nullopt;  // the quantized op is ruled too
  for (const std::string& op : float_ops) {
    if (ctx.keep_unfused(op)) {
      return "kept " + describe(n) + " in float: the KernelPolicy has a rule for '" + op + "' (or its family) and none "
             "for '" + quantized_op + "'";
    }
  }
  return std::nullopt;
}

// Removes the DequantizeLinear nodes in `candidates` (by output name) that nothing reads any more.
void remove_unread_dequantize(Graph& g, const std::set<std::string>& candidates) {
  if (candidates.empty()) return;
  const Uses uses(g);
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (Node& n : g.nodes) {
    const bool drop = is_onnx(n, "DequantizeLinear") && n.outputs.size() == 1 && candidates.count(n.outputs[0]) &&
                      uses.unused(n.outputs[0]);
    if (!drop) kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

}  // namespace

bool is_quantized_weight_dequantize(const Graph& g, const Node& n) {
  if (!is_onnx(n, "DequantizeLinear") || n.inputs.empty()) return false;
  const Tensor* q = constant(g, n.inputs[0]);
  return q != nullptr && (is_8bit(q->dtype()) || q->dtype() == kFp8);
}

PassResult quantized_fusion(Graph& g, const PassContext& ctx) {
  PassResult result{"quantized_fusion", 0, {}};
  if (ctx.fuse_quantized) {
    Rewriter rw(g);
    const Uses uses(g);
    std::set<std::string> dequantized;  // the DQ outputs the fused nodes read past
    NkWeights nk_weights;
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (rw.taken(i) || n.inputs.size() < 2) continue;
      const std::string x = n.inputs[0], w = n.inputs[1];
      if (auto note = kept_float(g, uses, ctx, i)) {
        result.notes.push_back(*note);
        continue;
      }
      if (fuse_gemm(g, uses, rw, i, nk_weights, ctx, result) || fuse_conv(g, uses, rw, i)) {
        dequantized.insert(x);
        dequantized.insert(w);
      } else {
        convert_quantized_onnx(g, rw, i, result, nk_weights);
      }
    }
    rw.apply(result);
    remove_unread_dequantize(g, dequantized);
    remove_unused_constants(g, nk_weights.originals());
  }
  if (ctx.keep_quantized_weights) {
    // The weights' DequantizeLinear nodes the folding kept for this pass and it did not fuse: folded now.
    PassContext fold = ctx;
    fold.keep_quantized_weights = false;
    PassResult folded;
    result.rewrites += fold_constants(g, fold, folded);
  }
  g.validate();
  return result;
}

}  // namespace xpuruntime::passes
