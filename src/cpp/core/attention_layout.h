// The memory layouts of the attention op's q, k, v and output (Note [Attention layouts]), and its fully_masked_rows
// attribute (Note [Fully masked attention rows] in backends/cpu/cpu_attention.cpp). Internal header shared by the op's
// shape inference and its kernels.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime {

// Note [Attention layouts]
// The attention op computes on [B, H, S, D] views of q, k, v and its output; by default each is held so ([B, H, S, D]
// row-major). Two attributes say otherwise:
//  * `bshd`, four 0/1 ints for q, k, v and the output, marks the ones held as [B, S, H, D]: the layout a projection
//    [B, S, H * D] already has before the exporters' `transpose(1, 2)` to heads, and the one
//    `transpose(1, 2).reshape(B, S, H * D)` wants back.
//  * `qkv_parts`, three ints for q, k and v (-1: not packed), marks inputs that are part p of a packed projection
//    [B, S, P, H, D] (GPT-2's c_attn and timm's qkv Linear: [B, S, 3 * H * D] viewed so); q, k and v then name the
//    same tensor and read it at offset p * H * D, rows P * H * D apart. A packed input's `bshd` flag must be 0.
//  * `qkv_packing`, "parts_heads" (the default: [B, S, P, H, D] as above) or "heads_parts": the packed inputs are
//    [B, S, H, P, D], each head's q, k and v side by side (GPT-NeoX's and BLOOM's query_key_value Linear), read at
//    offset p * D with heads P * D apart.
// attention_fusion's head-transpose fold (Note [Attention reads the heads where the projections wrote them] in
// fusion_transformer.cpp) sets them, so the strided copies around attention go. Each kernel reads and writes
// element (b, h, s, d) at offset + b * stride_b + h * stride_h + s * stride_s + d (view() below); the mask and the
// log-sum-exp output keep their [B, H, Sq, Sk] and [B, H, Sq] meaning.
struct AttentionLayout {
  enum Tensor : std::size_t { kQ = 0, kK = 1, kV = 2, kOut = 3 };
  std::array<bool, 4> bshd{};              // q, k, v, output
  std::array<std::int64_t, 3> part{-1, -1, -1};  // q, k, v: the part of a packed [B, S, P, H, D] input, or -1
  bool heads_outer = false;                       // packed inputs are [B, S, H, P, D] (qkv_packing "heads_parts")

  // Where element (b, h, s, d) of a tensor is: offset + b * stride_b + h * stride_h + s * stride_s + d.
  struct View {
    std::int64_t stride_b = 0, stride_h = 0, stride_s = 0, offset = 0;
  };

  // The layout `attrs` declare; InvalidArgumentError for a `bshd` that is not four 0/1 values or `qkv_parts` that
  // is not three values >= -1 (a packed input with its bshd flag set included).
  static AttentionLayout of(const Attributes& attrs) {
    AttentionLayout layout;
    const std::vector<std::int64_t> flags = attrs.get_ints("bshd", {});
    XPURT_CHECK(flags.empty() || flags.size() == 4, "op 'attention': bshd must hold 4 values (q, k, v, output), got ",
                flags.size());
    for (std::size_t i = 0; i < flags.size(); ++i) {
      XPURT_CHECK(flags[i] == 0 || flags[i] == 1, "op 'attention': bshd values must be 0 ([B, H, S, D]) or 1 ([B, S, "
                  "H, D]), got ", flags[i], " for ", name(i));
      layout.bshd[i] = flags[i] == 1;
    }
    const std::vector<std::int64_t> parts = attrs.get_ints("qkv_parts", {});
    XPURT_CHECK(parts.empty() || parts.size() == 3, "op 'attention': qkv_parts must hold 3 values (q, k, v), got ",
                parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
      XPURT_CHECK(parts[i] >= -1, "op 'attention': qkv_parts values must be -1 (not packed) or a part index, got ",
                  parts[i], " for ", name(i));
      XPURT_CHECK(parts[i] < 0 || !layout.bshd[i], "op 'attention': ", name(i), " is part ", parts[i],
                  " of a packed [B, S, P, H, D] input; its bshd flag must be 0");
      layout.part[i] = parts[i];
    }
    const std::string packing = attrs.get_string("qkv_packing", "parts_heads");
    XPURT_CHECK(packing == "parts_heads" || packing == "heads_parts", "op 'attention': qkv_packing must be "
                "\"parts_heads\" ([B, S, P, H, D]) or \"heads_parts\" ([B, S, H, P, D]), got \"", packing, "\"");
    layout.heads_outer = packing == "heads_parts";
    return layout;
  }
  static const char* name(std::size_t i) {
    static const char* const names[] = {"q", "k", "v", "output"};
    return names[i];
  }
  bool packed(std::size_t i) const { return i < 3 && part[i] >= 0; }

  // The [B, H, S, D] dims of tensor i from its stored shape (rank 5 for a packed input, else rank 4; other ranks are
  // returned unchanged for the caller's rank check to report). InvalidArgumentError for a part past P.
  std::vector<std::int64_t> logical(std::size_t i, const std::vector<std::int64_t>& stored) const {
    if (packed(i)) {
      XPURT_CHECK(stored.size() == 5, "op 'attention': ", name(i), " is part ", part[i], " of a packed input, which "
                  "must be ", heads_outer ? "[B, S, H, P, D]" : "[B, S, P, H, D]", "; got rank ", stored.size());
      const std::int64_t parts = stored[heads_outer ? 3 : 2], heads = stored[heads_outer ? 2 : 3];
      XPURT_CHECK(part[i] < parts, "op 'attention': ", name(i), " is part ", part[i], " of a packed input of only ",
                  parts, " parts");
      return {stored[0], heads, stored[1], stored[4]};
    }
    if (!bshd[i] || stored.size() != 4) return stored;
    return {stored[0], stored[2], stored[1], stored[3]};
  }
  // The stored shape of the output whose [B, H, S, D] dims are `dims`.
  std::vector<std::int64_t> stored_output(const std::vector<std::int64_t>& dims) const {
    if (!bshd[kOut]) return dims;
    return {dims[0], dims[2], dims[1], dims[3]};
  }
  // Where tensor i's elements are, from its stored shape (the output's: stored_output()).
  View view(std::size_t i, const std::vector<std::int64_t>& stored) const {
    if (packed(i)) {  // [B, S, P, H, D], or [B, S, H, P, D]
      const std::int64_t seq = stored[1], d = stored[4];
      const std::int64_t parts = stored[heads_outer ? 3 : 2], heads = stored[heads_outer ? 2 : 3];
      if (heads_outer) return {seq * heads * parts * d, parts * d, heads * parts * d, part[i] * d};
      return {seq * parts * heads * d, d, parts * heads * d, part[i] * heads * d};
    }
    const std::int64_t d = stored[3];
    if (bshd[i]) return {stored[1] * stored[2] * d, d, stored[2] * d, 0};  // [B, S, H, D]
    return {stored[1] * stored[2] * d, stored[2] * d, d, 0};               // [B, H, S, D]
  }

  // The [B, H, S, D] dims of q, k, v and the output ([B, H, Sq, Dv]), from q, k and v's stored shapes.
  std::array<std::vector<std::int64_t>, 4> dims(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                                                const std::vector<std::int64_t>& v) const {
    std::array<std::vector<std::int64_t>, 4> out = {logical(kQ, q), logical(kK, k), logical(kV, v), {}};
    if (out[0].size() == 4 && out[2].size() == 4) out[3] = {out[0][0], out[0][1], out[0][2], out[2][3]};
    return out;
  }
  // Where q, k, v and the output's elements are, from q, k and v's stored shapes (valid ones: the op's schema
  // checked them).
  std::array<View, 4> views(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                            const std::vector<std::int64_t>& v) const {
    return {view(kQ, q), view(kK, k), view(kV, v), view(kOut, stored_output(dims(q, k, v)[3]))};
  }

  // Copies the layout attributes of a graph node to the attributes of the op it becomes.
  static void forward(const Attributes& node, Attributes* op) {
    for (const char* name : {"bshd", "qkv_parts"}) {
      if (node.has(name)) op->set(name, node.get_ints(name, {}));
    }
    if (node.has("qkv_packing")) op->set("qkv_packing", node.get_string("qkv_packing", "parts_heads"));
  }
};

// What a query row whose every visible score is -inf gives (the op's `fully_masked_rows` attribute; Note [Fully
// masked attention rows] in backends/cpu/cpu_attention.cpp): NaN ("nan", the default), 0 ("zero"), or the mean of v
// over the row's visible keys, every -inf score taken as the lowest finite one ("uniform").
enum class FullyMaskedRows { kNan, kZero, kUniform };

// The op's fully_masked_rows. InvalidArgumentError for another value (the op's shape inference calls it first, so
// kernels see only valid ones).
inline FullyMaskedRows fully_masked_rows_of(const Attributes& attrs) {
  const std::string rows = attrs.get_string("fully_masked_rows", "nan");
  XPURT_CHECK(rows == "nan" || rows == "zero" || rows == "uniform", "op 'attention': fully_masked_rows must be "
              "\"nan\" (the default), \"zero\" or \"uniform\", got \"", rows, "\"");
  if (rows == "zero") return FullyMaskedRows::kZero;
  return rows == "uniform" ? FullyMaskedRows::kUniform : FullyMaskedRows::kNan;
}

// The finite score that stands for a -inf one under fully_masked_rows="uniform" (in the kernels' float32 or double
// arithmetic): below any score of a float32 or 16-bit model, so exp(it - max) is 0 beside a finite score and 1 in a
// row of nothing else.
inline constexpr float kUniformMaskedScore = -1e30f;

// Copies the fully_masked_rows attribute of a graph node to the attributes of the op it becomes.
inline void forward_fully_masked_rows(const Attributes& node, Attributes* op) {
  if (node.has("fully_masked_rows")) op->set("fully_masked_rows", node.get_string("fully_masked_rows", "nan"));
}

}  // namespace xpuruntime
