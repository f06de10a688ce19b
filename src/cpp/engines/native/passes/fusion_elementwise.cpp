// elementwise_fusion -> com.xpuruntime:FusedElementwise (see passes.h, Note [Fused elementwise programs] in
// core/fused_elementwise.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/fused_elementwise.h"
#include "engines/native/passes/passes.h"
#include "engines/native/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/onnx_import.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

constexpr std::size_t kMaxInputs = 16;
constexpr std::size_t kMaxInstructions = 64;
// Note [Few long rows stay unfused]
// A program with a reduction runs a row per group of threads, a block at most (Note [Row programs]): a reduction of a
// few long rows, e.g. softmax-like chains over a last axis of millions (x - x.amax(-1, keepdim=True)), would run on a
// few blocks of the GPU. With fewer than kMinFusedRows rows longer than kMaxFewRowsLength elements, the reduction stays
// a node (the registry's reduce_* kernels split a long row over many blocks, Note [Reduction layout] in cuda_raw's
// reduce.cu) and the chains around it fuse on their own.
constexpr std::int64_t kMinFusedRows = 128;
constexpr std::int64_t kMaxFewRowsLength = 65536;

// The program op and the registry op (what a KernelPolicy names) of a node the pass can take, or false.
bool member_code(const Node& n, fused::Code* code, std::string* registry_op) {
  struct Entry {
    const char* op_type;
    fused::Code code;
    const char* registry_op;
    std::size_t inputs;
  };
  static const Entry kOnnx[] = {
      {"Add", fused::Code::kAdd, "add", 2},       {"Sub", fused::Code::kSub, "sub", 2},
      {"Mul", fused::Code::kMul, "mul", 2},       {"Div", fused::Code::kDiv, "div", 2},
      {"Pow", fused::Code::kPow, "pow", 2},       {"Max", fused::Code::kMax, "maximum", 2},
      {"Min", fused::Code::kMin, "minimum", 2},   {"Neg", fused::Code::kNeg, "neg", 1},
      {"Abs", fused::Code::kAbs, "abs", 1},       {"Relu", fused::Code::kRelu, "relu", 1},
      {"Sigmoid", fused::Code::kSigmoid, "sigmoid", 1}, {"Tanh", fused::Code::kTanh, "tanh", 1},
      {"Exp", fused::Code::kExp, "exp", 1},       {"Log", fused::Code::kLog, "log", 1},
      {"Sqrt", fused::Code::kSqrt, "sqrt", 1},    {"Reciprocal", fused::Code::kReciprocal, "reciprocal", 1},
      {"Erf", fused::Code::kErf, "erf", 1},       {"HardSwish", fused::Code::kHardSwish, "hard_swish", 1},
  };
  // PyTorch's hardsigmoid: ONNX HardSigmoid with alpha 1/6 and beta 1/2 (the program op has no other constants).
  if (is_onnx(n, "HardSigmoid") && n.inputs.size() == 1 && n.outputs.size() == 1) {
    if (!near(n.attrs.get_float("alpha", 0.2), 1.0 / 6.0, 1e-6) || n.attrs.get_float("beta", 0.5) != 0.5) return false;
    *code = fused::Code::kHardSigmoid;
    *registry_op = "hard_sigmoid";
    return true;
  }
  if (is_onnx(n, "Cast") && n.inputs.size() == 1 && n.outputs.size() == 1) {
    switch (n.attrs.has("to") ? n.attrs.get_int("to", 0) : 0) {
      case 1: *code = fused::Code::kToF32; break;
      case 10: *code = fused::Code::kToF16; break;
      case 16: *code = fused::Code::kToBF16; break;
      default: return false;
    }
    *registry_op = "cast";
    return true;
  }
  if (n.domain.empty() || n.domain == "ai.onnx") {
    for (const Entry& e : kOnnx) {
      if (n.op_type == e.op_type && n.inputs.size() == e.inputs && n.outputs.size() == 1) {
        *code = e.code;
        *registry_op = e.registry_op;
        return true;
      }
    }
    return false;
  }
  if (n.domain == kXpurtDomain && n.op_type == "Gelu" && n.inputs.size() == 1 && n.outputs.size() == 1) {
    const std::string approximate = n.attrs.get_string("approximate", "none");
    if (approximate != "none" && approximate != "tanh") return false;
    *code = approximate == "tanh" ? fused::Code::kGeluTanh : fused::Code::kGelu;
    *registry_op = "gelu";
    return true;
  }
  return false;
}

struct Candidate {
  fused::Code code;
  std::vector<std::int64_t> shape;  // the output's
  DType dtype;
  std::int64_t row_axes = 0;        // a reduction's: how many trailing axes it reduces
  std::string rotated;               // a rotate_half's input
  std::vector<std::size_t> absorbed;  // a rotate_half's Slice and Neg nodes, replaced with the group
};

// The [start, end) a Slice cuts from the last axis of its input of rank `rank` and last size `last`, steps 1, or
// false.
bool last_axis_slice(const Graph& g, const Node& n, std::int64_t rank, std::int64_t last, std::int64_t* start,
                     std::int64_t* end) {
  auto range = single_axis_slice(g, n, rank);
  if (!range || range->axis != rank - 1) return false;
  *start = std::clamp<std::int64_t>(range->start < 0 ? range->start + last : range->start, 0, last);
  *end = std::clamp<std::int64_t>(range->end < 0 ? range->end + last : range->end, 0, last);
  return true;
}

// The rotary embedding's rotate_half as exporters write it: Concat(Neg(Slice(x, D/2:D)), Slice(x, 0:D/2)) on the
// last axis of x [..., D], the slices and the negation read by nothing else. Fills c.rotated and c.absorbed.
bool rotate_half(const Graph& g, const Uses& uses, const Node& n, Candidate* c) {
  if (!is_onnx(n, "Concat") || n.inputs.size() != 2 || n.outputs.size() != 1) return false;
  auto out = static_shape(g, n.outputs[0]);
  if (!out || out->empty()) return false;
  const auto rank = static_cast<std::int64_t>(out->size());
  const std::int64_t axis = n.attrs.get_int("axis", 0);
  if (axis != -1 && axis != rank - 1) return false;
  const std::int64_t last = out->back();
  if (last < 2 || last % 2 != 0) return false;
  auto neg = uses.producer(n.inputs[0]), lo = uses.producer(n.inputs[1]);
  if (!neg || !lo || !is_onnx(g.nodes[*neg], "Neg")) return false;
  auto hi = uses.producer(g.nodes[*neg].inputs[0]);
  if (!hi) return false;
  const Node& slice_hi = g.nodes[*hi];
  const Node& slice_lo = g.nodes[*lo];
  const std::string& x = slice_hi.inputs.empty() ? std::string() : slice_hi.inputs[0];
  if (x.empty() || slice_lo.inputs.empty() || slice_lo.inputs[0] != x || static_shape(g, x) != out) return false;
  std::int64_t a0 = 0, a1 = 0, b0 = 0, b1 = 0;
  if (!last_axis_slice(g, slice_hi, rank, last, &a0, &a1) || !last_axis_slice(g, slice_lo, rank, last, &b0, &b1) ||
      a0 != last / 2 || a1 != last || b0 != 0 || b1 != last / 2) {
    return false;
  }
  for (const std::string& v : {n.inputs[0], n.inputs[1], g.nodes[*neg].inputs[0]}) {
    if (uses.is_graph_output(v) || uses.read_by_subgraph(v) || uses.readers(v).size() != 1) return false;
  }
  c->rotated = x;
  c->absorbed = {*hi, *neg, *lo};
  return true;
}

// A keepdims ReduceSum/ReduceMean/ReduceMax over the trailing axes of its input, with the axes static: the program's
// reduction and how many trailing axes it reduces, or false.
bool reduction(const Graph& g, const Node& n, std::int64_t opset, fused::Code* code, std::int64_t* row_axes) {
  if (!(n.domain.empty() || n.domain == "ai.onnx") || n.outputs.size() != 1 || n.inputs.empty() ||
      n.inputs.size() > 2) {
    return false;
  }
  if (n.op_type == "ReduceSum") {
    *code = fused::Code::kReduceSum;
  } else if (n.op_type == "ReduceMean") {
    *code = fused::Code::kReduceMean;
  } else if (n.op_type == "ReduceMax") {
    *code = fused::Code::kReduceMax;
  } else {
    return false;
  }
  if (n.attrs.get_int("keepdims", 1) != 1 || n.attrs.get_int("noop_with_empty_axes", 0) != 0) return false;
  const std::int64_t input_since = n.op_type == "ReduceSum" ? 13 : 18;
  if (opset < input_since && n.inputs.size() != 1) return false;
  auto axes = constant_axes(g, n, input_since);  // absent: every axis, not a row
  auto x = value_type(g, n.inputs[0]);
  if (!axes || !x || !x->fully_known() || axes->empty()) return false;
  const auto rank = static_cast<std::int64_t>(x->shape.size());
  std::set<std::int64_t> normalized;
  for (std::int64_t a : *axes) {
    if (a < -rank || a >= rank) return false;
    normalized.insert(a < 0 ? a + rank : a);
  }
  // The trailing axes, every one of them: {rank - k, ..., rank - 1}.
  const auto k = static_cast<std::int64_t>(normalized.size());
  if (*normalized.begin() != rank - k || *normalized.rbegin() != rank - 1) return false;
  std::int64_t rows = 1, row = 1;
  const std::vector<std::int64_t> sizes = x->sizes();
  for (std::int64_t d = 0; d < rank; ++d) {
    std::int64_t& product = d < rank - k ? rows : row;
    if (sizes[static_cast<std::size_t>(d)] <= 0 ||
        __builtin_mul_overflow(product, sizes[static_cast<std::size_t>(d)], &product)) {
      return false;  // empty, or past int64 (candidate() refuses both)
    }
  }
  if (rows < kMinFusedRows && row > kMaxFewRowsLength) return false;  // Note [Few long rows stay unfused]
  *row_axes = k;
  return true;
}

// Whether `shape` broadcasts to `to` (numpy, one way).
bool broadcasts_to(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& to) {
  if (shape.size() > to.size()) return false;
  for (std::size_t j = 0; j < shape.size(); ++j) {
    const std::int64_t d = shape[shape.size() - 1 - j];
    if (d != 1 && d != to[to.size() - 1 - j]) return false;
  }
  return true;
}

// Whether node `i` can be a member: an op the programs have, the policy does not keep it on its own kernel, every
// input and the output of one float dtype with static shapes, inputs no bigger than the output.
std::optional<Candidate> candidate(const Graph& g, const Uses& uses, const PassContext& ctx, std::size_t i) {
  const Node& n = g.nodes[i];
  Candidate c;
  std::string registry_op;
  if (rotate_half(g, uses, n, &c)) {
    c.code = fused::Code::kRotateHalf;
    if (ctx.keep_unfused && (ctx.keep_unfused("concat") || ctx.keep_unfused("slice") || ctx.keep_unfused("neg"))) {
      return std::nullopt;
    }
    auto out = value_type(g, n.outputs[0]);
    if (!out || !is_fusable_float(out->dtype)) return std::nullopt;
    c.shape = out->sizes();
    c.dtype = out->dtype;
    return c;
  }
  if (reduction(g, n, g.opset(""), &c.code, &c.row_axes)) {
    registry_op = n.op_type == "ReduceSum" ? "reduce_sum" : n.op_type == "ReduceMean" ? "reduce_mean" : "reduce_max";
  } else if (!member_code(n, &c.code, &registry_op)) {
    return std::nullopt;
  }
  if (ctx.keep_unfused && ctx.keep_unfused(registry_op)) return std::nullopt;
  auto out = value_type(g, n.outputs[0]);
  if (!out || !out->fully_known() || !is_fusable_float(out->dtype)) return std::nullopt;
  c.shape = out->sizes();
  c.dtype = out->dtype;
  std::int64_t numel = 1;
  for (std::int64_t d : c.shape) {
    if (d <= 0 || __builtin_mul_overflow(numel, d, &numel)) return std::nullopt;  // empty, or past int64
  }
  const std::size_t operands = fused::is_reduction(c.code) ? 1 : n.inputs.size();
  for (std::size_t k = 0; k < operands; ++k) {
    const std::string& x = n.inputs[k];
    auto t = value_type(g, x);
    if (x.empty() || !t || !t->fully_known() || t->shape.size() > c.shape.size()) return std::nullopt;
    // A cast reads any float dtype; every other op reads its output's.
    if (c.code == fused::Code::kToF32 || c.code == fused::Code::kToF16 || c.code == fused::Code::kToBF16
            ? !is_fusable_float(t->dtype)
            : t->dtype != c.dtype) {
      return std::nullopt;
    }
  }
  return c;
}

// The QuantizeLinear that a group may end in (Note [Quantized output of a fused program] in core/fused_elementwise.h).
struct QuantizeTail {
  std::size_t node = 0;
  DType dtype = DType::kInt8;
  double scale = 1.0;
  std::int64_t zero_point = 0;
};

// Node `qi` when it is a QuantizeLinear of `value` per tensor to int8/uint8, or to float8e4m3fn/float8e5m2 with zero
// point 0 and saturate=1, of constant scale and zero point, and nothing keeps it unfused: what a kernel may write in
// its place (Note [Quantized output of a fused program] in core/fused_elementwise.h); nullopt otherwise.
std::optional<QuantizeTail> fusable_quantize(const Graph& g, const PassContext& ctx, std::size_t qi,
                                             const std::string& value) {
  const Node& q = g.nodes[qi];
  if (!is_onnx(q, "QuantizeLinear") || q.inputs.size() < 2 || q.inputs[0] != value || q.outputs.size() != 1) {
    return std::nullopt;
  }
  if (ctx.keep_unfused && ctx.keep_unfused("quantize_linear")) return std::nullopt;
  const Tensor* scale_tensor = constant(g, q.inputs[1]);
  const std::optional<double> scale = scalar_constant(g, q.inputs[1]);
  if (scale_tensor == nullptr || scale_tensor->numel() != 1 || !scale) return std::nullopt;
  QuantizeTail tail;
  tail.node = qi;
  tail.scale = *scale;
  const bool has_zero_point = q.inputs.size() > 2 && !q.inputs[2].empty();
  if (has_zero_point) {
    const Tensor* zp = constant(g, q.inputs[2]);
    const std::optional<double> zero_point = scalar_constant(g, q.inputs[2]);
    if (zp == nullptr || zp->numel() != 1 || !zero_point) return std::nullopt;
    if (is_float8_dtype(zp->dtype()) && *zero_point != 0.0) return std::nullopt;  // NaN too
    tail.dtype = zp->dtype();
    tail.zero_point = static_cast<std::int64_t>(*zero_point);
  } else {
    // ONNX: uint8 without a zero point, unless opset 21's output_dtype says otherwise (int8 3, float8e4m3fn 17,
    // float8e5m2 19).
    const std::int64_t to = q.attrs.get_int("output_dtype", 0);
    if (to != 0 && to != 2 && to != 3 && to != 17 && to != 19) return std::nullopt;
    tail.dtype = to == 3    ? DType::kInt8
                 : to == 17 ? DType::kFloat8E4M3FN
                 : to == 19 ? DType::kFloat8E5M2
                            : DType::kUInt8;
  }
  if (!fused::quantized_output(tail.dtype)) return std::nullopt;
  if (is_float8_dtype(tail.dtype) && q.attrs.get_int("saturate", 1) != 1) return std::nullopt;
  const float scale32 = static_cast<float>(tail.scale);
  if (!(scale32 > 0.0f) || !std::isfinite(scale32)) return std::nullopt;  // left to the node, which reports it
  return tail;
}

// The fusable QuantizeLinear (fusable_quantize) that alone reads the group's output `value` (not a graph output);
// nullopt otherwise.
std::optional<QuantizeTail> quantize_tail(const Graph& g, const Uses& uses, const Rewriter& rw, const PassContext& ctx,
                                          const std::string& value) {
  if (uses.is_graph_output(value) || uses.read_by_subgraph(value)) return std::nullopt;
  const auto& readers = uses.readers(value);
  if (readers.size() != 1 || !uses.only_reader(value, readers[0]) || rw.taken(readers[0])) return std::nullopt;
  return fusable_quantize(g, ctx, readers[0], value);
}

// Note [Quantized layer norm output] (core/op_schemas.cpp): each com.xpuruntime:LayerNormalization whose output a
// fusable QuantizeLinear reads (whoever else reads it) writes that QuantizeLinear's output as its second output; the
// QuantizeLinear goes. One per LayerNormalization (the first in graph order).
void layer_norm_quantized_outputs(Graph& g, const PassContext& ctx, PassResult& result) {
  const Uses uses(g);
  Rewriter rw(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& ln = g.nodes[i];
    if (ln.domain != kXpurtDomain || ln.op_type != "LayerNormalization" || ln.outputs.size() != 1) continue;
    const std::string& y = ln.outputs[0];
    if (uses.read_by_subgraph(y)) continue;
    for (std::size_t reader : uses.readers(y)) {
      if (rw.taken(reader)) continue;
      const std::optional<QuantizeTail> q = fusable_quantize(g, ctx, reader, y);
      if (!q) continue;
      Node fused = ln;
      fused.outputs.push_back(g.nodes[reader].outputs[0]);
      fused.attrs.set("quantized_dtype", std::string(dtype_name(q->dtype)));
      fused.attrs.set("y_scale", q->scale);
      fused.attrs.set("y_zero_point", q->zero_point);
      const std::string what = describe(g.nodes[reader]);
      rw.replace({i}, {std::move(fused)}, "fused " + what + " into " + describe(ln) + " (its second output, " +
                                              std::string(dtype_name(q->dtype)) + ")");
      rw.replace({reader}, {}, what + ": written by " + describe(ln));
      break;
    }
  }
  rw.apply(result);
}

// Note [Rotary reads the heads where the projection wrote them]
// Llama-style models rotate q and k between their head transpose and the attention: Reshape to [B, S, H, D],
// Transpose (0, 2, 1, 3), the rotary group (a FusedElementwise with rotate_half), Attention. Since the rotary is
// elementwise over batch, heads and positions, it reads [B, S, H, D] as the projection wrote it, its cos and sin
// (broadcast over batch and heads) read as [.., S, 1, D] views, and the attention reads its output with the bshd flag
// (Note [Attention layouts]): the transpose, a copy of q and of k in every layer, goes. Only where the transpose and
// the group's output have no other reader, and every other input of the group broadcasts along H or S (so that
// swapping the two is a view).
int fold_rotary_head_transposes(Graph& g, std::vector<std::string>& notes) {
  const Uses uses(g);
  int folded = 0;
  std::map<std::size_t, std::vector<Node>> views_before;  // node index -> Reshapes to insert before it
  std::map<std::string, std::string> view_of;             // an input -> its [.., S, H, ..]-swapped view
  std::set<std::size_t> dropped;                          // folded Transposes
  for (std::size_t f = 0; f < g.nodes.size(); ++f) {
    Node& fused_node = g.nodes[f];
    if (fused_node.domain != kXpurtDomain || fused_node.op_type != "FusedElementwise" ||
        fused_node.outputs.size() != 1 || fused_node.attrs.has("row_axes") || fused_node.attrs.has("pieces")) {
      continue;
    }
    const fused::Program program = fused::parse(fused_node.attrs.get_string("program", ""), fused_node.inputs.size());
    int rotated = -1;
    for (const fused::Instruction& in : program.code) {
      if (in.code == fused::Code::kRotateHalf) rotated = rotated == -1 || rotated == in.a.index ? in.a.index : -2;
    }
    if (rotated < 0) continue;
    const std::string& out = fused_node.outputs[0];
    const auto& readers = uses.readers(out);
    if (readers.size() != 1 || !uses.only_reader(out, readers[0])) continue;
    Node& attention = g.nodes[readers[0]];
    if (attention.domain != kXpurtDomain || attention.op_type != "Attention") continue;
    std::vector<std::int64_t> bshd = attention.attrs.get_ints("bshd", {0, 0, 0, 0});
    const std::vector<std::int64_t> parts = attention.attrs.get_ints("qkv_parts", {-1, -1, -1});
    const int slot = !attention.inputs.empty() && attention.inputs[0] == out   ? 0
                     : attention.inputs.size() > 1 && attention.inputs[1] == out ? 1
                                                                                  : -1;
    // (a packed input is read as [B, S, P, H, D]; v may be while the rotated q and k are not)
    if (slot < 0 || bshd.size() != 4 || bshd[slot] != 0 || parts.size() != 3 || parts[slot] >= 0 ||
        (attention.inputs.size() > 2 && attention.inputs[2] == out)) {
      continue;
    }
    const std::string& x = fused_node.inputs[rotated];
    auto transpose = uses.producer(x);
    if (!transpose || !is_onnx(g.nodes[*transpose], "Transpose") ||
        g.nodes[*transpose].attrs.get_ints("perm", {}) != std::vector<std::int64_t>{0, 2, 1, 3} ||
        !uses.only_reader(x, f)) {
      continue;
    }
    auto out_shape = static_shape(g, out);
    if (!out_shape || out_shape->size() != 4) continue;
    // Every other input as [a, b, c, d] (rank 4 from the left) with b or c 1: its swap is a view.
    bool ok = true;
    std::vector<std::pair<std::size_t, std::vector<std::int64_t>>> swapped;
    for (std::size_t i = 0; i < fused_node.inputs.size() && ok; ++i) {
      if (static_cast<int>(i) == rotated) continue;
      auto shape = static_shape(g, fused_node.inputs[i]);
      if (!shape || shape->size() > 4) {
        ok = false;
        break;
      }
      std::vector<std::int64_t> padded(4 - shape->size(), 1);
      padded.insert(padded.end(), shape->begin(), shape->end());
      if (padded[1] != 1 && padded[2] != 1) ok = false;
      if (padded[1] != padded[2]) swapped.emplace_back(i, std::vector<std::int64_t>{padded[0], padded[2], padded[1],
                                                                                    padded[3]});
    }
    if (!ok) continue;
    for (const auto& [i, shape] : swapped) {
      const std::string& value = fused_node.inputs[i];
      auto it = view_of.find(value);
      if (it == view_of.end()) {
        Node view;
        view.name = g.unique_name(value + "_bshd");
        view.op_type = "Reshape";
        view.inputs = {value, add_constant(g, value + "_bshd_shape", int64_tensor(shape))};
        view.outputs = {g.unique_name(value + "_bshd")};
        it = view_of.emplace(value, view.outputs[0]).first;
        views_before[f].push_back(std::move(view));
      }
      fused_node.inputs[i] = it->second;
    }
    fused_node.inputs[rotated] = g.nodes[*transpose].inputs[0];
    bshd[slot] = 1;
    attention.attrs.set("bshd", bshd);
    g.types.erase(out);  // [B, S, H, D] now: inferred again
    dropped.insert(*transpose);
    notes.push_back(detail::str_cat(describe(g.nodes[*transpose]), " folded into ", describe(fused_node), " and ",
                                    describe(attention), " (bshd)"));
    ++folded;
  }
  if (folded > 0) insert_before(g, std::move(views_before), dropped);
  return folded;
}

// Note [Squares summed over leading axes]
// A sum of squares over axes that are not the trailing ones (ConvNeXt V2's global response normalization: the L2 norm
// of each channel over H and W, channels-last [N, H, W, C] over axes 1 and 2, which the dynamo exporter writes
// Mul(x, x) -> ReduceSum -> Sqrt) cannot join a fused program (its reductions are over trailing axes), so the square
// was a kernel of its own that wrote the whole x * x for the reduction to read back. ReduceSum(Mul(x, x)) with the
// Mul read by nothing else becomes ReduceSumSquare(x): reduce_sum_square squares each element as it loads it, in
// float32 (the unfused graph rounds x * x to x's type first, and overflows float16 from |x| = 256; the fused form is
// the closer to exact). Sums over trailing axes stay as they are, for elementwise_fusion's row reductions.
void square_reductions(Graph& g, const PassContext& ctx, PassResult& result) {
  if (ctx.keep_unfused && (ctx.keep_unfused("reduce_sum") || ctx.keep_unfused("mul"))) return;
  Rewriter rw(g);
  const Uses uses(g);
  const std::int64_t opset = g.opset("");
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& sum = g.nodes[i];
    if (!is_onnx(sum, "ReduceSum") || sum.inputs.empty() || opset < 13) continue;
    auto mi = uses.producer(sum.inputs[0]);
    if (!mi || rw.taken(*mi) || !is_onnx(g.nodes[*mi], "Mul") || g.nodes[*mi].inputs.size() != 2 ||
        g.nodes[*mi].inputs[0] != g.nodes[*mi].inputs[1] || !uses.only_reader(sum.inputs[0], i)) {
      continue;
    }
    const auto axes = constant_axes(g, sum, 13);
    const auto shape = static_shape(g, sum.inputs[0]);
    const auto dtype = value_dtype(g, sum.inputs[0]);
    if (!axes || axes->empty() || !shape || !dtype || !is_fusable_float(*dtype)) continue;
    const auto rank = static_cast<std::int64_t>(shape->size());
    if (std::any_of(axes->begin(), axes->end(), [&](std::int64_t a) { return a < -rank || a >= rank; })) continue;
    std::vector<bool> reduced(shape->size(), false);
    for (std::int64_t a : *axes) reduced[static_cast<std::size_t>(a < 0 ? a + rank : a)] = true;
    bool trailing = true, seen = false;  // every reduced axis (of size > 1) after every kept one
    for (std::size_t d = 0; d < shape->size(); ++d) {
      if ((*shape)[d] == 1) continue;
      seen = seen || reduced[d];
      trailing = trailing && (reduced[d] || !seen);
    }
    if (trailing) continue;
    Node square = sum;
    square.op_type = "ReduceSumSquare";
    square.inputs[0] = g.nodes[*mi].inputs[0];
    if (opset < 18) {  // ReduceSumSquare takes its axes as an attribute until opset 18
      square.inputs.resize(1);
      square.attrs.set("axes", *axes);
    }
    rw.replace({*mi, i}, {square}, describe(g.nodes[*mi]) + " + " + describe(sum) + " -> ReduceSumSquare");
  }
  rw.apply(result);
}

}  // namespace

PassResult elementwise_fusion(Graph& g, const PassContext& ctx) {
  PassResult result{"elementwise_fusion", 0, {}};
  if (!ctx.fuse_elementwise) return result;
  layer_norm_quantized_outputs(g, ctx, result);
  square_reductions(g, ctx, result);  // Note [Squares summed over leading axes]
  Rewriter rw(g);
  const Uses uses(g);
  std::vector<std::optional<Candidate>> cand(g.nodes.size());
  std::set<std::string> axes;  // the fused reductions' axes inputs, removed when nothing else reads them
  for (std::size_t i = 0; i < g.nodes.size(); ++i) cand[i] = candidate(g, uses, ctx, i);
  // Roots from the last node back: a root's group grows backwards through producers whose output only the group
  // reads and whose shape broadcasts to the root's (a reduction: over the root's trailing axes, the same ones for
  // every reduction of the group, of an operand of the root's shape). A value read outside the group ends it there
  // (the reader outside becomes a root of its own), so the group has one output and every value it reads from
  // outside is produced before the root (where the fused node goes). A reduction is never a root: the kernels write
  // one value per element of the output.
  for (std::size_t r = g.nodes.size(); r-- > 0;) {
    if (!cand[r] || rw.taken(r) || fused::is_reduction(cand[r]->code)) continue;
    const Candidate& root = *cand[r];
    std::set<std::size_t> members = {r};
    std::vector<std::size_t> frontier = {r};
    std::int64_t row_axes = 0;  // the group's reductions'
    while (!frontier.empty() && members.size() < kMaxInstructions) {
      const std::size_t m = frontier.back();
      frontier.pop_back();
      // A rotate_half reads an input of the group: the group does not grow through it.
      const std::size_t operands = cand[m]->code == fused::Code::kRotateHalf ? 0
                                   : fused::is_reduction(cand[m]->code)     ? 1
                                                                            : g.nodes[m].inputs.size();
      for (std::size_t k = 0; k < operands; ++k) {
        const std::string& x = g.nodes[m].inputs[k];
        auto p = uses.producer(x);
        if (!p || members.count(*p) || rw.taken(*p) || !cand[*p]) continue;
        if (!broadcasts_to(cand[*p]->shape, root.shape)) continue;
        if (fused::is_reduction(cand[*p]->code)) {
          if (row_axes != 0 && cand[*p]->row_axes != row_axes) continue;
          auto operand = static_shape(g, g.nodes[*p].inputs[0]);
          if (!operand || *operand != root.shape) continue;
        }
        if (uses.is_graph_output(x) || uses.read_by_subgraph(x)) continue;
        bool inside = true;
        for (std::size_t reader : uses.readers(x)) inside = inside && members.count(reader);
        if (!inside) continue;
        members.insert(*p);
        frontier.push_back(*p);
        if (fused::is_reduction(cand[*p]->code)) row_axes = cand[*p]->row_axes;
      }
    }
    // One op fuses only with the QuantizeLinear that ends it (BERT's GELU -> Q: Note [Quantized output of a fused
    // program]); alone it stays the registry's kernel.
    const std::optional<QuantizeTail> tail = quantize_tail(g, uses, rw, ctx, g.nodes[r].outputs[0]);
    if (members.size() < 2 && !tail) continue;
    // The program: members in graph order (topological), inputs numbered as first read.
    std::vector<std::size_t> ordered(members.begin(), members.end());
    std::map<std::string, fused::Operand> operand_of;
    std::vector<std::string> inputs;
    fused::Program program;
    bool ok = true;
    std::vector<std::size_t> replaced = ordered;  // and the rotate_halfs' slices and negations
    // The operand reading `value`: the instruction computing it, or an input of the node (numbered as first read).
    auto operand = [&](const std::string& value) {
      auto it = operand_of.find(value);
      if (it == operand_of.end()) {
        it = operand_of.emplace(value, fused::Operand{true, static_cast<int>(inputs.size())}).first;
        inputs.push_back(value);
      }
      return it->second;
    };
    for (std::size_t m : ordered) {
      fused::Instruction in;
      in.code = cand[m]->code;
      const Node& n = g.nodes[m];
      const std::optional<double> exponent =
          in.code == fused::Code::kPow ? scalar_constant(g, n.inputs[1]) : std::nullopt;
      if (in.code == fused::Code::kRotateHalf) {
        in.a = operand(cand[m]->rotated);
        ok = ok && in.a.input;  // rotate_half reads an input
        replaced.insert(replaced.end(), cand[m]->absorbed.begin(), cand[m]->absorbed.end());
      } else if (exponent && *exponent == 2.0) {  // x ** 2 (RMSNorm, variance): one multiply, not powf
        in.code = fused::Code::kMul;
        in.a = in.b = operand(n.inputs[0]);
      } else {
        const std::size_t operands = fused::is_reduction(in.code) ? 1 : n.inputs.size();
        for (std::size_t k = 0; k < operands; ++k) (k == 0 ? in.a : in.b) = operand(n.inputs[k]);
      }
      operand_of[n.outputs[0]] = fused::Operand{false, static_cast<int>(program.code.size())};
      program.code.push_back(in);
    }
    program.num_inputs = inputs.size();
    if (!ok || inputs.size() > kMaxInputs || rw.any_taken(replaced)) continue;
    const Node& last = g.nodes[r];
    Node fused_node;
    fused_node.name = last.name + "_fused";
    fused_node.domain = kXpurtDomain;
    fused_node.op_type = "FusedElementwise";
    fused_node.inputs = inputs;
    fused_node.outputs = {last.outputs[0]};
    if (row_axes != 0) fused_node.attrs.set("row_axes", row_axes);
    if (tail) {
      // The group's value was rounded to its 16-bit dtype before the QuantizeLinear read it: so it is here.
      if (root.dtype == DType::kFloat16 || root.dtype == DType::kBFloat16) {
        fused::Instruction cast;
        cast.code = root.dtype == DType::kFloat16 ? fused::Code::kToF16 : fused::Code::kToBF16;
        cast.a = fused::Operand{false, static_cast<int>(program.code.size()) - 1};
        program.code.push_back(cast);
      }
      fused_node.outputs = {g.nodes[tail->node].outputs[0]};
      fused_node.attrs.set("output_dtype", std::string(dtype_name(tail->dtype)));
      fused_node.attrs.set("y_scale", tail->scale);
      fused_node.attrs.set("y_zero_point", tail->zero_point);
      replaced.push_back(tail->node);
    } else if (value_dtype(g, inputs[0]) != root.dtype) {
      fused_node.attrs.set("output_dtype", std::string(dtype_name(root.dtype)));
    }
    fused_node.attrs.set("program", program.text());
    std::sort(replaced.begin(), replaced.end());
    std::string note = "fused ";
    for (std::size_t k = 0; k < replaced.size(); ++k) note += (k ? " + " : "") + describe(g.nodes[replaced[k]]);
    note += " -> FusedElementwise '" + fused_node.name + "' (" + program.text() + ")";
    for (std::size_t m : ordered) {
      if (fused::is_reduction(cand[m]->code) && g.nodes[m].inputs.size() > 1) axes.insert(g.nodes[m].inputs[1]);
    }
    std::vector<Node> replacement;
    replacement.push_back(std::move(fused_node));
    rw.replace(replaced, std::move(replacement), std::move(note));
  }
  rw.apply(result);
  remove_unused_constants(g, axes);
  result.rewrites += fold_rotary_head_transposes(g, result.notes);
  return result;
}

}  // namespace xpuruntime::passes
