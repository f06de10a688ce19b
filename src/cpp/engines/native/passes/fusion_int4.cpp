// int4_weight_fusion: a weight-only int4 model's GEMMs -> com.xpuruntime:MatMulNBits, lowered onto the registry op
// matmul_nbits (see passes.h, docs/native_engine.md, Note [Int4 weight-only GEMM] in core/op_schemas_int4.cpp).
//
// Note [Int4 weight fusion]
// A weight-only int4 model comes in two forms: ONNX Runtime's com.microsoft MatMulNBits (ORT's MatMul4BitsQuantizer,
// Olive, optimum), whose packed layout is matmul_nbits' own, and the standard DequantizeLinear(int4 or uint4
// constant, blocked scales along K, opset 21) -> MatMul / Gemm that xrt.quantize(precision="int4-weights") writes.
// Run as written, the DequantizeLinear folds into a float weight of 4 (or 2) bytes an element while the plan is
// built and the GEMM streams that; matmul_nbits streams the half-byte codes and dequantizes them in registers.
// The pass
//  * turns each MatMulNBits that matmul_nbits takes (runtime::lower_matmul_nbits: bits 4, no g_idx, packed uint8
//    zero points or none) into the com.xpuruntime node, its inputs as they are; the others stay for the node kernel,
//    their reason in the notes;
//  * turns DequantizeLinear(constant int4/uint4 W, constant float scales, constant zero points or none) -> MatMul
//    (W [K, N]) or Gemm (transA 0, alpha 1, W [K, N], or [N, K] with transB=1; C a constant [N] with beta 1) [-> Add of
//    a constant [N]] into one node, repacking W at pass time: codes along K into MatMulNBits' [N, n_blocks,
//    block_size / 2] bytes (an int4 value q becomes code q + 8, its zero point z code z + 8, so q - z is unchanged;
//    codes past K take the zero point's, weight 0), the scales into [N, n_blocks] of their own float type, the zero
//    points packed (dropped when all are 8). DQ blocks of B along K become matmul_nbits blocks of the largest power
//    of two dividing B (at least 16; each DQ block is then whole blocks, whose scales repeat); per-tensor and
//    per-output-channel scales become blocks of up to 128 with repeated scales. A block smaller than 16 or not a
//    multiple of 16, or scales blocked along N, leave the nodes as they are.
// Constant folding would turn the weights' DequantizeLinear into float constants before any pass runs, so while this
// pass is on (PassContext::fuse_int4_weights, when the plan's device has a matmul_nbits kernel) the folding keeps the
// DequantizeLinear of int4/uint4 constants (keep_int4_weights) and this pass folds the ones it leaves.
// disabled_passes=["int4_weight_fusion"] runs the model as before: weights folded to float, MatMulNBits on its node
// kernel. The two compute the same real numbers (each weight (q - z) * scale exactly in float32); the sums differ
// only in their order and, on GPUs, in the float16 math of the dequantization.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engines/native/lowering/lowering.h"
#include "engines/native/passes/pass_utils.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

bool is_int4(DType d) { return d == DType::kInt4 || d == DType::kUInt4; }

// A weight in matmul_nbits' layout (Note [Int4 weight-only GEMM]).
struct PackedWeight {
  Tensor weight;       // uint8 [N, n_blocks, block / 2]
  Tensor scales;       // [N, n_blocks], the DequantizeLinear scale's float type
  Tensor zero_points;  // uint8 [N, ceil(n_blocks / 2)]; undefined when every zero point is 8
  std::int64_t block = 0;
};

// The geometry of a DequantizeLinear of a rank-2 weight whose reduction axis (K) is `k_axis`: how its scale (and zero
// point) index follows (n, k).
struct DqScales {
  std::vector<double> scale;  // as stored
  std::vector<double> zero;   // as stored (empty: 0)
  std::int64_t dq_block = 0;  // > 0: blocked along K; 0: per tensor (scale.size() == 1) or per output channel
  bool per_channel = false;
  std::int64_t k_blocks = 1;  // blocked: scale.shape[k_axis]
  bool k_first = true;        // the weight (and a blocked scale) is [K, N], else [N, K]

  std::size_t index(std::int64_t n, std::int64_t k, std::int64_t channels) const {
    if (dq_block > 0) {
      const std::int64_t b = k / dq_block;
      return static_cast<std::size_t>(k_first ? b * channels + n : n * k_blocks + b);
    }
    return per_channel ? static_cast<std::size_t>(n) : 0;
  }
};

// The scales of `dq` (a DequantizeLinear of the [K, N] or [N, K] int4 constant `w`), or the reason they are not what
// the pass repacks.
std::optional<DqScales> dq_scales(const Graph& g, const Node& dq, const Tensor& w, bool k_first, std::string* why) {
  const Tensor* scale = constant(g, dq.inputs[1]);
  if (scale == nullptr || !is_fusable_float(scale->dtype())) {
    *why = "the weight's scale is not a float32/float16/bfloat16 constant";
    return std::nullopt;
  }
  const std::int64_t k_axis = k_first ? 0 : 1;
  const std::int64_t channels = w.shape()[static_cast<std::size_t>(1 - k_axis)];
  std::int64_t axis = dq.attrs.get_int("axis", 1);
  if (axis < 0) axis += 2;
  DqScales s;
  s.k_first = k_first;
  s.dq_block = dq.attrs.get_int("block_size", 0);
  if (s.dq_block > 0) {
    const std::int64_t k = w.shape()[static_cast<std::size_t>(k_axis)];
    s.k_blocks = (k + s.dq_block - 1) / s.dq_block;
    const std::vector<std::int64_t> want = k_first ? std::vector<std::int64_t>{s.k_blocks, channels}
                                                   : std::vector<std::int64_t>{channels, s.k_blocks};
    if (axis != k_axis || scale->shape() != want) {
      *why = "the scales are not blocked along K";
      return std::nullopt;
    }
    if ((s.dq_block & -s.dq_block) < 16) {
      *why = detail::str_cat("block_size ", s.dq_block, " is not a multiple of 16");
      return std::nullopt;
    }
  } else if (scale->numel() != 1) {
    s.per_channel = true;
    if (scale->dim() != 1 || scale->numel() != channels || axis != 1 - k_axis) {
      *why = "the scales are neither blocked along K, per tensor nor per output channel";
      return std::nullopt;
    }
  }
  s.scale = to_doubles(*scale);
  if (dq.has_input(2)) {
    const Tensor* zp = constant(g, dq.inputs[2]);
    if (zp == nullptr || zp->dtype() != w.dtype() || zp->numel() != scale->numel()) {
      *why = "the zero point is not a constant of the weight's type and the scale's shape";
      return std::nullopt;
    }
    s.zero = to_doubles(*zp);
  }
  return s;
}

// `w` (the int4/uint4 constant a DequantizeLinear reads, [K, N] when k_first, else [N, K]) with its scales, in
// matmul_nbits' layout.
PackedWeight pack(const Tensor& w, const Tensor& scale_like, const DqScales& s) {
  const bool signed4 = w.dtype() == DType::kInt4;
  const std::int64_t k = w.shape()[s.k_first ? 0 : 1], n = w.shape()[s.k_first ? 1 : 0];
  PackedWeight out;
  if (s.dq_block > 0) {
    out.block = s.dq_block & -s.dq_block;  // the largest power of two dividing the DQ block
  } else {
    out.block = 16;
    while (out.block < 128 && out.block < k) out.block *= 2;
  }
  const std::int64_t blocks = (k + out.block - 1) / out.block, half = out.block / 2, zp_row = (blocks + 1) / 2;
  const std::vector<double> q = to_doubles(w);
  const auto code = [&](double v) { return static_cast<unsigned>(static_cast<int>(v) + (signed4 ? 8 : 0)); };
  out.weight = Tensor::empty({n, blocks, half}, DType::kUInt8);
  auto* packed = static_cast<std::uint8_t*>(out.weight.data_ptr());
  std::vector<double> scales(static_cast<std::size_t>(n * blocks));
  Tensor zeros = Tensor::zeros({n, zp_row}, DType::kUInt8);
  auto* zp = static_cast<std::uint8_t*>(zeros.data_ptr());
  bool all_eight = true;
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::size_t p = s.index(j, b * out.block, n);
      scales[static_cast<std::size_t>(j * blocks + b)] = s.scale[p];
      const unsigned z = code(s.zero.empty() ? 0.0 : s.zero[p]);
      all_eight = all_eight && z == 8;
      zp[j * zp_row + b / 2] = static_cast<std::uint8_t>(zp[j * zp_row + b / 2] | (z << (4 * (b % 2))));
      for (std::int64_t i = 0; i < half; ++i) {
        unsigned pair = 0;
        for (std::int64_t h = 0; h < 2; ++h) {
          const std::int64_t kk = b * out.block + 2 * i + h;
          const unsigned c =
              kk < k ? code(q[static_cast<std::size_t>(s.k_first ? kk * n + j : j * k + kk)]) : z;  // past K: weight 0
          pair |= c << (4 * h);
        }
        packed[(j * blocks + b) * half + i] = static_cast<std::uint8_t>(pair);
      }
    }
  }
  out.scales = detail::from_doubles({n, blocks}, scale_like.dtype(), scales);
  if (!all_eight) out.zero_points = zeros;
  return out;
}

// The DequantizeLinear of an int4/uint4 rank-2 constant producing `value`, not taken yet.
std::optional<std::size_t> int4_dequantize_of(const Graph& g, const Uses& uses, const Rewriter& rw,
                                              const std::string& value) {
  auto p = uses.producer(value);
  if (!p || rw.taken(*p) || !is_onnx(g.nodes[*p], "DequantizeLinear") || g.nodes[*p].inputs.size() < 2 ||
      g.nodes[*p].outputs.size() != 1) {
    return std::nullopt;
  }
  const Tensor* w = constant(g, g.nodes[*p].inputs[0]);
  if (w == nullptr || !is_int4(w->dtype()) || w->dim() != 2) return std::nullopt;
  return p;
}

// A constant holding one float value per output channel ([N], or [1, ..., 1, N]) of `dtype`, or nullopt.
std::optional<std::string> channel_constant(const Graph& g, const std::string& value, std::int64_t n, DType dtype) {
  const Tensor* c = value.empty() ? nullptr : constant(g, value);
  if (c == nullptr || c->dtype() != dtype || c->numel() != n || c->dim() < 1 || c->shape().back() != n) {
    return std::nullopt;
  }
  return value;
}

// The MatMul or Gemm at `mi` reading a dequantized int4 weight: the MatMulNBits node, or nothing (a reason in
// `result.notes` when the weight is int4 but the pattern does not fit).
bool fuse_dequantized_gemm(Graph& g, const Uses& uses, Rewriter& rw, std::size_t mi, PassResult& result) {
  const Node& mm = g.nodes[mi];
  const bool gemm = is_onnx(mm, "Gemm");
  if ((!gemm && !is_onnx(mm, "MatMul")) || mm.outputs.size() != 1 || mm.inputs.size() < 2) return false;
  auto dqi = int4_dequantize_of(g, uses, rw, mm.inputs[1]);
  if (!dqi) return false;
  const auto refuse = [&](const std::string& why) {
    result.notes.push_back("kept " + describe(mm) + " on a float weight: " + why);
    return false;
  };
  const auto x_type = value_type(g, mm.inputs[0]);
  if (!x_type || !is_fusable_float(x_type->dtype) || !x_type->has_shape || x_type->shape.empty() ||
      (gemm && x_type->shape.size() != 2)) {
    return refuse("x is not a float32/float16/bfloat16 tensor of known rank");
  }
  const bool k_first = !(gemm && mm.attrs.get_int("transB", 0) != 0);
  if (gemm && (mm.attrs.get_int("transA", 0) != 0 || mm.attrs.get_float("alpha", 1.0) != 1.0)) {
    return refuse("transA or alpha");
  }
  const Node& dq = g.nodes[*dqi];
  const Tensor& w = *constant(g, dq.inputs[0]);
  std::string why;
  const std::optional<DqScales> scales = dq_scales(g, dq, w, k_first, &why);
  if (!scales) return refuse(why);
  const std::int64_t n = w.shape()[k_first ? 1 : 0];
  std::vector<std::size_t> pattern = {mi};
  std::string out = mm.outputs[0], bias, parts = describe(mm);
  if (const DType sd = constant(g, dq.inputs[1])->dtype(); sd != x_type->dtype && sd != DType::kFloat32) {
    return refuse("the scales' type is neither x's nor float32");
  }
  if (gemm && mm.has_input(2)) {
    auto c = channel_constant(g, mm.inputs[2], n, x_type->dtype);
    if (!c || mm.attrs.get_float("beta", 1.0) != 1.0) return refuse("C is not a constant bias [N] with beta 1");
    bias = *c;
  } else if (auto ai = sole_reader(g, uses, rw, out, "Add")) {
    const Node& add = g.nodes[*ai];
    auto c = add.inputs.size() == 2 ? channel_constant(g, other_input(add, out), n, x_type->dtype) : std::nullopt;
    auto add_type = value_type(g, add.outputs[0]);
    auto own_type = value_type(g, out);
    if (c && add_type && own_type && same_shape(*add_type, *own_type)) {
      bias = *c;
      pattern.push_back(*ai);
      parts += " + " + describe(add) + " (bias)";
      out = add.outputs[0];
    }
  }
  const PackedWeight packed = pack(w, *constant(g, dq.inputs[1]), *scales);
  if (!bias.empty() && constant(g, bias)->dim() != 1) {  // [1, N] -> the [N] matmul_nbits takes
    const Tensor* c = constant(g, bias);
    bias = add_constant(g, mm.name + "_bias", detail::from_doubles({n}, c->dtype(), to_doubles(*c)));
  }
  Node fused;
  fused.name = mm.name;
  fused.domain = kXpurtDomain;
  fused.op_type = "MatMulNBits";
  fused.inputs = {mm.inputs[0], add_constant(g, mm.name + "_int4_weight", packed.weight),
                  add_constant(g, mm.name + "_int4_scales", packed.scales),
                  packed.zero_points.defined() ? add_constant(g, mm.name + "_int4_zero_points", packed.zero_points)
                                               : std::string(),
                  bias};
  while (fused.inputs.back().empty()) fused.inputs.pop_back();
  fused.outputs = {out};
  fused.attrs.set("block_size", packed.block);
  fused.attrs.set("bits", std::int64_t{4});
  if (uses.only_reader(mm.inputs[1], mi)) pattern.push_back(*dqi);
  const std::string note = detail::str_cat("fused ", describe(dq), " + ", parts, " -> MatMulNBits '", mm.name,
                                           "' (matmul_nbits, block ", packed.block, ")");
  rw.replace(pattern, {std::move(fused)}, note);
  return true;
}

// A com.microsoft MatMulNBits at `i` -> the com.xpuruntime node when matmul_nbits takes it; else its reason goes into
// the notes and it stays for its node kernel.
bool convert_matmul_nbits(Graph& g, Rewriter& rw, std::size_t i, PassResult& result) {
  const Node& n = g.nodes[i];
  if (n.domain != "com.microsoft" || n.op_type != "MatMulNBits") return false;
  std::vector<std::optional<ValueType>> stored;
  stored.reserve(n.inputs.size());
  std::vector<const ValueType*> types;
  for (const std::string& in : n.inputs) {
    stored.push_back(in.empty() ? std::nullopt : value_type(g, in));
    types.push_back(stored.back() ? &*stored.back() : nullptr);
  }
  const runtime::Lowered lowered = runtime::lower_matmul_nbits(n, types);
  if (lowered.kind != runtime::Lowered::Kind::kRegistry) {
    result.notes.push_back("kept " + describe(n) + " for its node kernel: " + lowered.reason);
    return false;
  }
  Node fused;
  fused.name = n.name;
  fused.domain = kXpurtDomain;
  fused.op_type = "MatMulNBits";
  for (int k : lowered.inputs) fused.inputs.push_back(k >= 0 ? n.inputs[static_cast<std::size_t>(k)] : std::string());
  while (!fused.inputs.empty() && fused.inputs.back().empty()) fused.inputs.pop_back();
  fused.outputs = {n.outputs[0]};
  fused.attrs = lowered.attrs;
  rw.replace({i}, {std::move(fused)},
             detail::str_cat(describe(n), " -> MatMulNBits '", n.name, "' (matmul_nbits, block ",
                             lowered.attrs.get_int("block_size", 0), ")"));
  return true;
}

}  // namespace

bool is_int4_weight_dequantize(const Graph& g, const Node& n) {
  if (!is_onnx(n, "DequantizeLinear") || n.inputs.empty()) return false;
  const Tensor* q = constant(g, n.inputs[0]);
  return q != nullptr && is_int4(q->dtype());
}

PassResult int4_weight_fusion(Graph& g, const PassContext& ctx) {
  PassResult result{"int4_weight_fusion", 0, {}};
  if (ctx.fuse_int4_weights) {
    Rewriter rw(g);
    const Uses uses(g);
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      if (rw.taken(i)) continue;
      if (!fuse_dequantized_gemm(g, uses, rw, i, result)) convert_matmul_nbits(g, rw, i, result);
    }
    rw.apply(result);
  }
  if (ctx.keep_int4_weights) {
    // The weights' DequantizeLinear nodes the folding kept for this pass and it did not fuse: folded now.
    PassContext fold = ctx;
    fold.keep_int4_weights = false;
    PassResult folded;
    result.rewrites += fold_constants(g, fold, folded);
  }
  g.validate();
  return result;
}

}  // namespace xpuruntime::passes
