// group_query_attention_decomposition: ONNX Runtime's com.microsoft GroupQueryAttention rewritten onto ONNX ops that
// every device runs (Note [Group query attention decomposed]), on devices without a group_query_attention kernel
// (PassContext::decompose_group_query_attention).
//
// Note [Group query attention decomposed]
// The registry op group_query_attention (Note [Group query attention] in core/op_schemas_gqa.cpp) has a cpu kernel
// only. On another device this pass writes the node as ops that have kernels there (MatMul, Softmax, Where,
// GatherElements, Gather, Equal, Less, And, Add, Sub, Mul, Tanh, Cast, Pad, Slice, Concat, Reshape, Transpose,
// Expand), with the same results as the cpu kernel on every position (output and present):
//   sizes B, S, N heads, K kv heads, G = N / K, H, P past rows, T = max(total_sequence_length, P) present rows;
//   L_b = seqlens_k[b] + 1 and p_b = 0 (first prompt, S == total_sequence_length) or L_b - S.
//   Rotary (do_rotary): pos[b, s] = p_b + s; cos/sin = Gather(cache, pos); Q and K rotated in float32 (halves or
//     interleaved pairs, by Slice/Mul/Sub/Add/Concat), then rounded to the input's dtype as the cpu kernel does.
//   present (key and value alike): new = the new rows as [B, K, S, H], placed at rows [p_b, p_b + S): a first
//     prompt pads new to T rows; decoding (S == 1) broadcasts the one row where t == p_b; a later prompt gathers
//     GatherElements(new, clamp(t - p_b, 0, S - 1) along t) where t - p_b is in [0, S); the other rows are the past
//     (zero-padded to T rows) where t < p_b, else 0: ONNX Runtime's zero-filled present.
//   attention in float32 (float16 inputs cast once): Q as [B, K, G*S, H] (query head n = k*G + g reads kv head k,
//     so no repeated KV heads) times present_key^T -> [B, K, G*S, T], times scale (0: 1/sqrt(H)), softcap *
//     tanh(x / softcap) when softcap > 0; keys t of query s allowed when lo <= t < hi, hi = min(p_b + s + 1, L_b),
//     lo = 0 or, with local_window_size W, max(p_b + s + 1 - W, 0) (float32 without softcap or smooth softmax:
//     ONNX Runtime's flash path, an empty window giving 0) or max(hi - W, 0); masked scores -1e30; Softmax (smooth:
//     over the scores and one more 0 logit, Pad then Slice, which is exp(x - m) / (sum + exp(-m)), m = max(0, x));
//     times present_value -> [B, S, N*H].
// Sums are float32 (the cpu kernel's are double): relative differences of about 1e-6. seqlens_k is not
// range-checked here (the cpu kernel raises for an out-of-range value; here such a row reads clamped positions).
// The pass needs static shapes of query/key/value/past, a constant total_sequence_length and opset >= 13 of the
// default domain (the Softmax axis, Slice/Pad/Reshape inputs); otherwise the node stays as it is (and the plan
// refuses it on a device without a kernel, or runs it on the CPU with ExecutionPolicy(fallback="cpu")).
// XPURT_GQA_DECOMPOSE=1 makes the plan decompose on the CPU too (tests compare it with the cpu kernel).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/group_query_attention.h"
#include "core/scalar.h"
#include "core/shape_str.h"
#include "engines/native/passes/pass_utils.h"
#include "engines/native/passes/passes.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {
namespace {

using namespace internal;
using Ints = std::vector<std::int64_t>;

// The sizes of one node (Note [Group query attention decomposed]).
struct GqaSizes {
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, group = 0, head = 0, past = 0, present = 0, total = 0;
  std::int64_t rotary_half = 0;  // cos_cache.shape[1] when do_rotary
  bool packed = false, first_prompt = false;
  DType dtype = DType::kFloat32;
};

// Makes the nodes of one decomposition: each value gets its type in g.types as it is made.
class Builder {
 public:
  Builder(Graph& g, std::string base) : g_(g), base_(std::move(base)) {}

  std::string value(const std::string& hint, DType dtype, const Ints& shape) {
    const std::string name = g_.unique_name(base_ + "_" + hint);
    ValueType t;
    t.dtype = dtype;
    t.has_shape = true;
    for (const std::int64_t d : shape) t.shape.emplace_back(d);
    g_.types[name] = t;
    return name;
  }
  // A node of `op_type` writing `out` (made by value(), or one of the GroupQueryAttention node's outputs).
  const std::string& emit(const std::string& op_type, std::vector<std::string> inputs, const std::string& out,
                          Attributes attrs = {}) {
    nodes_.push_back(make_node(g_, op_type, base_ + "_" + op_type, std::move(inputs), {out}, std::move(attrs)));
    return out;
  }
  std::string op(const std::string& op_type, std::vector<std::string> inputs, DType dtype, const Ints& shape,
                 Attributes attrs = {}) {
    return emit(op_type, std::move(inputs), value(op_type, dtype, shape), std::move(attrs));
  }
  std::string ints(const Ints& values) { return add_constant(g_, base_ + "_ints", int64_tensor(values)); }
  std::string scalar(DType dtype, double v) {
    return add_constant(g_, base_ + "_scalar", from_doubles({}, dtype, {v}));
  }
  std::string reshape(const std::string& x, DType dtype, const Ints& shape, const std::string& out = "") {
    return emit("Reshape", {x, ints(shape)}, out.empty() ? value("Reshape", dtype, shape) : out);
  }
  std::string transpose(const std::string& x, DType dtype, const Ints& shape, const Ints& perm,
                        const std::string& out = "") {
    Attributes a;
    a.set("perm", perm);
    return emit("Transpose", {x}, out.empty() ? value("Transpose", dtype, shape) : out, std::move(a));
  }
  // x[..., start:end, ...] along `axis`; `shape` is the result's.
  std::string slice(const std::string& x, DType dtype, const Ints& shape, std::int64_t axis, std::int64_t start,
                    std::int64_t end) {
    return op("Slice", {x, ints({start}), ints({end}), ints({axis})}, dtype, shape);
  }
  std::string cast(const std::string& x, DType from, DType to, const Ints& shape, const std::string& out = "") {
    if (from == to && out.empty()) return x;
    Attributes a;
    a.set("to", static_cast<std::int64_t>(onnx_dtype_code(to)));
    return emit("Cast", {x}, out.empty() ? value("Cast", to, shape) : out, std::move(a));
  }
  std::vector<Node> take() { return std::move(nodes_); }

 private:
  static int onnx_dtype_code(DType d) {  // the ONNX TensorProto codes of the dtypes this pass casts between
    XPURT_INTERNAL_ASSERT(d == DType::kFloat32 || d == DType::kFloat16, "group_query_attention_decomposition casts "
                          "float32 and float16 only, got ", dtype_name(d));
    return d == DType::kFloat32 ? 1 : 10;
  }

  Graph& g_;
  std::string base_;
  std::vector<Node> nodes_;
};

// What group_query_attention's shape inference checks (core/op_schemas_gqa.cpp), with its messages: the
// decomposition would read clamped positions where the cpu kernel's plan refuses the inputs.
void check_sizes(const Graph& g, const Node& n, const GqaSizes& s) {
  const std::string op = "op 'group_query_attention': ";
  const auto q = static_shape(g, n.inputs[0]);
  const std::int64_t parts = s.packed ? s.heads + 2 * s.kv_heads : s.heads;
  XPURT_CHECK(s.heads % s.kv_heads == 0 && (*q)[2] % parts == 0, op, "the last dim of 'query' (", (*q)[2],
              ") must be a positive multiple of ", parts);
  const auto check_shape = [&](std::size_t i, const char* name, const Ints& want) {
    const auto shape = static_shape(g, n.inputs[i]);
    XPURT_CHECK(shape && *shape == want, op, "input '", name, "' must have shape ", detail::shape_str(want),
                ", got ", shape ? detail::shape_str(*shape) : std::string("an unknown shape"));
  };
  if (!s.packed) {
    check_shape(1, "key", {s.batch, s.seq, s.kv_heads * s.head});
    check_shape(2, "value", {s.batch, s.seq, s.kv_heads * s.head});
  }
  if (n.has_input(3)) {
    check_shape(3, "past_key", {s.batch, s.kv_heads, s.past, s.head});
    check_shape(4, "past_value", {s.batch, s.kv_heads, s.past, s.head});
  }
  check_shape(5, "seqlens_k", {s.batch});
  XPURT_CHECK(s.first_prompt || s.seq == 1 || s.batch == 1, op, "sequence length ", s.seq,
              " differs from total_sequence_length ", s.total, " (not a first prompt), so it must be 1 (decoding) or "
              "the batch must be 1 (a later prompt), got batch ", s.batch);
  if (s.rotary_half > 0 || n.attrs.get_int("do_rotary", 0) != 0) {
    const auto cos = static_shape(g, n.inputs[7]);
    XPURT_CHECK(s.rotary_half >= 1 && 2 * s.rotary_half <= s.head && (*cos)[0] >= s.total, op,
                "input 'cos_cache' must be [max_position >= ", s.total, ", rotary_dim / 2 <= ", s.head / 2,
                "], got ", detail::shape_str(*cos));
    check_shape(8, "sin_cache", *cos);
  }
}

// The node's sizes when the decomposition can be written (static shapes, constant total_sequence_length); else none.
std::optional<GqaSizes> sizes_of(const Graph& g, const Node& n) {
  const Attributes& a = n.attrs;
  const Tensor* total = n.has_input(gqa::kTotalSequenceLengthInput)
                            ? constant(g, n.inputs[gqa::kTotalSequenceLengthInput]) : nullptr;
  const auto q = static_shape(g, n.inputs[0]);
  const auto dtype = value_dtype(g, n.inputs[0]);
  if (total == nullptr || total->dtype() != DType::kInt32 || total->numel() != 1 || !q || q->size() != 3 || !dtype ||
      (*dtype != DType::kFloat32 && *dtype != DType::kFloat16)) {
    return std::nullopt;
  }
  GqaSizes s;
  s.dtype = *dtype;
  s.batch = (*q)[0];
  s.seq = (*q)[1];
  s.heads = a.get_int("num_heads", 0);
  s.kv_heads = a.get_int("kv_num_heads", 0);
  s.group = s.heads / s.kv_heads;
  s.packed = !n.has_input(1);
  s.head = (*q)[2] / (s.packed ? s.heads + 2 * s.kv_heads : s.heads);
  s.total = *static_cast<const std::int32_t*>(total->data_ptr());
  if (n.has_input(3)) {
    const auto past = static_shape(g, n.inputs[3]);
    if (!past || past->size() != 4 || !static_shape(g, n.inputs[4])) return std::nullopt;
    s.past = (*past)[2];
  }
  s.present = std::max(s.total, s.past);
  s.first_prompt = s.seq == s.total;
  if (a.get_int("do_rotary", 0) != 0) {
    const auto cos = n.has_input(7) ? static_shape(g, n.inputs[7]) : std::nullopt;
    if (!cos || cos->size() != 2) return std::nullopt;
    s.rotary_half = (*cos)[1];
  }
  if (s.batch <= 0 || s.seq <= 0 || s.head <= 0 || s.total < 1) return std::nullopt;
  check_sizes(g, n, s);
  return s;
}

// The new rows of key or value in `x` ([B, S, K*H]) placed into the present [B, K, T, H] (Note [Group query attention
// decomposed]); `past` may be "" (no past); `offset` [B, 1] int64 holds p_b ("" on a first prompt: 0).
std::string build_present(Builder& b, const GqaSizes& s, const std::string& x, const std::string& past,
                          const std::string& offset, const std::string& out) {
  const DType dt = s.dtype;
  const Ints fresh_shape = {s.batch, s.kv_heads, s.seq, s.head};
  const Ints present_shape = {s.batch, s.kv_heads, s.present, s.head};
  const std::string rows = b.reshape(x, dt, {s.batch, s.seq, s.kv_heads, s.head});
  if (offset.empty() && s.present == s.seq) return b.transpose(rows, dt, fresh_shape, {0, 2, 1, 3}, out);
  const std::string fresh = b.transpose(rows, dt, fresh_shape, {0, 2, 1, 3});
  const std::string result = out.empty() ? b.value("present", dt, present_shape) : out;
  if (offset.empty()) {  // a first prompt: the new rows at [0, S), zeros after them (not the past's rows)
    return b.emit("Pad", {fresh, b.ints({0, 0, 0, 0, 0, 0, s.present - s.seq, 0})}, result);
  }
  Ints positions(static_cast<std::size_t>(s.present));
  for (std::int64_t t = 0; t < s.present; ++t) positions[static_cast<std::size_t>(t)] = t;
  const std::string t_row = b.reshape(b.ints(positions), DType::kInt64, {1, s.present});
  std::string gathered, is_new;
  const Ints mask_shape = {s.batch, 1, s.present, 1};
  if (s.seq == 1) {  // decoding: the one new row, broadcast, at t == p_b
    gathered = fresh;
    is_new = b.reshape(b.op("Equal", {t_row, offset}, DType::kBool, {s.batch, s.present}), DType::kBool, mask_shape);
  } else {  // a later prompt: j = t - p_b clamped into [0, S - 1] (by Where: int Min/Max lack kernels on CUDA)
    const std::string j = b.op("Sub", {t_row, offset}, DType::kInt64, {s.batch, s.present});
    const Ints j_shape = {s.batch, s.present};
    const std::string zero = b.scalar(DType::kInt64, 0);
    const std::string last = b.scalar(DType::kInt64, static_cast<double>(s.seq - 1));
    const std::string low = b.op("Where", {b.op("Less", {j, zero}, DType::kBool, j_shape), zero, j}, DType::kInt64,
                                 j_shape);
    const std::string clamped = b.op("Where", {b.op("Less", {last, low}, DType::kBool, j_shape), last, low},
                                     DType::kInt64, j_shape);
    const std::string index = b.op("Expand", {b.reshape(clamped, DType::kInt64, mask_shape), b.ints(present_shape)},
                                   DType::kInt64, present_shape);
    Attributes axis;
    axis.set("axis", std::int64_t{2});
    gathered = b.op("GatherElements", {fresh, index}, dt, present_shape, axis);
    is_new = b.reshape(b.op("Equal", {j, clamped}, DType::kBool, j_shape), DType::kBool, mask_shape);
  }
  std::string rest = b.scalar(dt, 0.0);
  if (!past.empty()) {
    std::string padded = past;
    if (s.past < s.present) {
      padded = b.op("Pad", {past, b.ints({0, 0, 0, 0, 0, 0, s.present - s.past, 0})}, dt, present_shape);
    }
    const std::string is_past = b.reshape(b.op("Less", {t_row, offset}, DType::kBool, {s.batch, s.present}),
                                          DType::kBool, {s.batch, 1, s.present, 1});
    rest = b.op("Where", {is_past, padded, rest}, dt, present_shape);
  }
  return b.emit("Where", {is_new, gathered, rest}, result);
}

// Rotates the first 2 * rotary_half dims of each of `heads` heads of `x` ([B, S, heads*H]) at the positions whose
// cos/sin rows are `cos`/`sin` (float32 [B, S, 1, R/2], or [B, S, 1, R/2, 1] interleaved); rounded to the dtype.
std::string rotate(Builder& b, const GqaSizes& s, const std::string& x, std::int64_t heads, const std::string& cos,
                   const std::string& sin, bool interleaved) {
  const DType f = DType::kFloat32;
  const std::int64_t half = s.rotary_half, B = s.batch, S = s.seq, H = s.head;
  const std::string x4 = b.reshape(b.cast(x, s.dtype, f, {B, S, heads * H}), f, {B, S, heads, H});
  std::string x1, x2;
  Ints part;
  if (interleaved) {
    const std::string pairs = b.reshape(b.slice(x4, f, {B, S, heads, 2 * half}, 3, 0, 2 * half), f,
                                        {B, S, heads, half, 2});
    part = {B, S, heads, half, 1};
    x1 = b.slice(pairs, f, part, 4, 0, 1);
    x2 = b.slice(pairs, f, part, 4, 1, 2);
  } else {
    part = {B, S, heads, half};
    x1 = b.slice(x4, f, part, 3, 0, half);
    x2 = b.slice(x4, f, part, 3, half, 2 * half);
  }
  const auto mul = [&](const std::string& u, const std::string& v) { return b.op("Mul", {u, v}, f, part); };
  const std::string y1 = b.op("Sub", {mul(x1, cos), mul(x2, sin)}, f, part);
  const std::string y2 = b.op("Add", {mul(x1, sin), mul(x2, cos)}, f, part);
  Attributes last;
  last.set("axis", static_cast<std::int64_t>(part.size() - 1));
  Ints joined = part;
  joined.back() = 2 * part.back();
  std::string rotated = b.op("Concat", {y1, y2}, f, joined, last);
  if (interleaved) rotated = b.reshape(rotated, f, {B, S, heads, 2 * half});
  if (2 * half < H) {
    Attributes axis3;
    axis3.set("axis", std::int64_t{3});
    rotated = b.op("Concat", {rotated, b.slice(x4, f, {B, S, heads, H - 2 * half}, 3, 2 * half, H)}, f,
                   {B, S, heads, H}, axis3);
  }
  return b.cast(b.reshape(rotated, f, {B, S, heads * H}), f, s.dtype, {B, S, heads * H});
}

// The keys each query may read, [B, 1, 1, S, T] bool, and (flash window only) which queries read any, [B, 1, 1, S, 1].
std::pair<std::string, std::string> attention_mask(Builder& b, const GqaSizes& s, const Attributes& a,
                                                   const std::string& offset, const std::string& length) {
  const DType i64 = DType::kInt64, bl = DType::kBool;
  Ints steps(static_cast<std::size_t>(s.seq)), positions(static_cast<std::size_t>(s.present));
  for (std::int64_t k = 0; k < s.seq; ++k) steps[static_cast<std::size_t>(k)] = k + 1;
  for (std::int64_t t = 0; t < s.present; ++t) positions[static_cast<std::size_t>(t)] = t;
  const Ints bs = {s.batch, s.seq};
  const std::string step_row = b.reshape(b.ints(steps), i64, {1, s.seq});
  // end = p_b + s + 1; hi = min(end, L_b).
  const std::string end = offset.empty() ? b.op("Expand", {step_row, b.ints(bs)}, i64, bs)
                                         : b.op("Add", {offset, step_row}, i64, bs);
  const std::string hi = b.op("Where", {b.op("Less", {end, length}, bl, bs), end, length}, i64, bs);
  const std::string t = b.reshape(b.ints(positions), i64, {1, 1, s.present});
  const Ints bst = {s.batch, s.seq, s.present};
  std::string allowed = b.op("Less", {t, b.reshape(hi, i64, {s.batch, s.seq, 1})}, bl, bst);
  std::string nonempty;
  const std::int64_t window = a.get_int("local_window_size", -1);
  if (window > 0) {
    const bool flash = s.dtype == DType::kFloat32 && a.get_float("softcap", 0.0) == 0.0 &&
                       a.get_int("smooth_softmax", 0) == 0;
    const std::string from = b.op("Sub", {flash ? end : hi, b.scalar(i64, static_cast<double>(window))}, i64, bs);
    const std::string zero = b.scalar(i64, 0);
    const std::string lo = b.op("Where", {b.op("Less", {from, zero}, bl, bs), zero, from}, i64, bs);
    const std::string inside = b.op("Not", {b.op("Less", {t, b.reshape(lo, i64, {s.batch, s.seq, 1})}, bl, bst)}, bl,
                                    bst);
    allowed = b.op("And", {allowed, inside}, bl, bst);
    if (flash) nonempty = b.reshape(b.op("Less", {lo, hi}, bl, bs), bl, {s.batch, 1, 1, s.seq, 1});
  }
  return {b.reshape(allowed, bl, {s.batch, 1, 1, s.seq, s.present}), nonempty};
}

// softmax(mask(scale * Q K^T)) V in float32 for the query `q` ([B, S, N*H], rotated) and the presents; writes `out`.
void attend(Builder& b, const GqaSizes& s, const Attributes& a, const std::string& q, const std::string& keys,
            const std::string& values, const std::string& offset, const std::string& length, const std::string& out) {
  const DType f = DType::kFloat32;
  const std::int64_t B = s.batch, S = s.seq, K = s.kv_heads, G = s.group, H = s.head, T = s.present;
  const std::string q5 = b.reshape(b.cast(q, s.dtype, f, {B, S, s.heads * H}), f, {B, S, K, G, H});
  const std::string qg = b.reshape(b.transpose(q5, f, {B, K, G, S, H}, {0, 2, 3, 1, 4}), f, {B, K, G * S, H});
  const std::string kt = b.transpose(b.cast(keys, s.dtype, f, {B, K, T, H}), f, {B, K, H, T}, {0, 1, 3, 2});
  const Ints scores_shape = {B, K, G, S, T};
  double scale = a.get_float("scale", 0.0);
  scale = scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(static_cast<float>(H))) : scale;
  std::string scores = b.op("Mul", {b.op("MatMul", {qg, kt}, f, {B, K, G * S, T}), b.scalar(f, scale)}, f,
                            {B, K, G * S, T});
  scores = b.reshape(scores, f, scores_shape);
  const double softcap = a.get_float("softcap", 0.0);
  if (softcap > 0.0) {
    const std::string cap = b.scalar(f, softcap);
    scores = b.op("Mul", {b.op("Tanh", {b.op("Div", {scores, cap}, f, scores_shape)}, f, scores_shape), cap}, f,
                  scores_shape);
  }
  const auto [allowed, nonempty] = attention_mask(b, s, a, offset, length);
  // Masked scores -1e30, not -inf: exp underflows to 0 all the same, and a softmax that keeps a running max (long
  // rows on CUDA) never computes -inf - -inf, even for a row whose first keys are masked (a local window).
  scores = b.op("Where", {allowed, scores, b.scalar(f, -1e30)}, f, scores_shape);
  Attributes last;
  last.set("axis", std::int64_t{-1});
  std::string probs;
  if (a.get_int("smooth_softmax", 0) != 0) {
    const Ints wider = {B, K, G, S, T + 1};
    const std::string padded = b.op("Pad", {scores, b.ints({0, 0, 0, 0, 0, 0, 0, 0, 0, 1})}, f, wider);
    probs = b.slice(b.op("Softmax", {padded}, f, wider, last), f, scores_shape, 4, 0, T);
  } else {
    probs = b.op("Softmax", {scores}, f, scores_shape, last);
  }
  if (!nonempty.empty()) probs = b.op("Where", {nonempty, probs, b.scalar(f, 0.0)}, f, scores_shape);
  const std::string context = b.op("MatMul", {b.reshape(probs, f, {B, K, G * S, T}), b.cast(values, s.dtype, f,
                                                                                            {B, K, T, H})},
                                   f, {B, K, G * S, H});
  const std::string heads = b.transpose(b.reshape(context, f, {B, K, G, S, H}), f, {B, S, K, G, H}, {0, 3, 1, 2, 4});
  if (s.dtype == f) {
    b.reshape(heads, f, {B, S, s.heads * H}, out);
  } else {
    b.cast(b.reshape(heads, f, {B, S, s.heads * H}), f, s.dtype, {B, S, s.heads * H}, out);
  }
}

// The whole decomposition of node `n` of sizes `s`.
std::vector<Node> decompose(Graph& g, const Node& n, const GqaSizes& s) {
  Builder b(g, n.name.empty() ? std::string("gqa") : n.name);
  const DType dt = s.dtype;
  const std::int64_t NH = s.heads * s.head, KH = s.kv_heads * s.head;
  std::string q = n.inputs[0], k, v;
  if (s.packed) {
    k = b.slice(q, dt, {s.batch, s.seq, KH}, 2, NH, NH + KH);
    v = b.slice(q, dt, {s.batch, s.seq, KH}, 2, NH + KH, NH + 2 * KH);
    q = b.slice(q, dt, {s.batch, s.seq, NH}, 2, 0, NH);
  } else {
    k = n.inputs[1];
    v = n.inputs[2];
  }
  Attributes to64;
  to64.set("to", std::int64_t{7});
  const std::string length = b.op("Add", {b.op("Cast", {n.inputs[5]}, DType::kInt64, {s.batch}, to64),
                                          b.scalar(DType::kInt64, 1)}, DType::kInt64, {s.batch});
  const std::string length_col = b.reshape(length, DType::kInt64, {s.batch, 1});
  const std::string offset =
      s.first_prompt ? std::string()
                     : b.op("Sub", {length_col, b.scalar(DType::kInt64, static_cast<double>(s.seq))}, DType::kInt64,
                            {s.batch, 1});
  if (n.attrs.get_int("do_rotary", 0) != 0) {
    Ints steps(static_cast<std::size_t>(s.seq));
    for (std::int64_t i = 0; i < s.seq; ++i) steps[static_cast<std::size_t>(i)] = i;
    const std::string step_row = b.reshape(b.ints(steps), DType::kInt64, {1, s.seq});
    const std::string pos = offset.empty() ? b.op("Expand", {step_row, b.ints({s.batch, s.seq})}, DType::kInt64,
                                                  {s.batch, s.seq})
                                           : b.op("Add", {offset, step_row}, DType::kInt64, {s.batch, s.seq});
    const bool interleaved = n.attrs.get_int("rotary_interleaved", 0) != 0;
    const Ints table = interleaved ? Ints{s.batch, s.seq, 1, s.rotary_half, 1} : Ints{s.batch, s.seq, 1, s.rotary_half};
    const auto rows = [&](const std::string& cache) {
      const std::string picked = b.op("Gather", {cache, pos}, dt, {s.batch, s.seq, s.rotary_half});
      return b.reshape(b.cast(picked, dt, DType::kFloat32, {s.batch, s.seq, s.rotary_half}), DType::kFloat32, table);
    };
    const std::string cos = rows(n.inputs[7]), sin = rows(n.inputs[8]);
    q = rotate(b, s, q, s.heads, cos, sin, interleaved);
    k = rotate(b, s, k, s.kv_heads, cos, sin, interleaved);
  }
  const auto output = [&](std::size_t i) { return i < n.outputs.size() ? n.outputs[i] : std::string(); };
  const std::string keys = build_present(b, s, k, n.has_input(3) ? n.inputs[3] : "", offset, output(1));
  const std::string values = build_present(b, s, v, n.has_input(4) ? n.inputs[4] : "", offset, output(2));
  attend(b, s, n.attrs, q, keys, values, offset, length_col, n.outputs[0]);
  return b.take();
}

}  // namespace

PassResult group_query_attention_decomposition(Graph& g, const PassContext& ctx) {
  PassResult result{"group_query_attention_decomposition", 0, {}};
  if (!ctx.decompose_group_query_attention || g.opset("") < 13) return result;
  Rewriter rewriter(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node n = g.nodes[i];
    if (n.domain != "com.microsoft" || n.op_type != "GroupQueryAttention" || n.inputs.size() < 7) continue;
    gqa::check_supported(n);  // what neither form implements is refused by name (as the lowering would)
    const std::optional<GqaSizes> sizes = sizes_of(g, n);
    if (!sizes) continue;
    std::vector<Node> nodes = decompose(g, n, *sizes);
    const std::size_t count = nodes.size();
    rewriter.replace({i}, std::move(nodes), describe(n) + " -> " + std::to_string(count) + " ONNX nodes");
  }
  rewriter.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
