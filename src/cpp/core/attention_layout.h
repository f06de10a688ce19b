// The memory layouts of the attention op's q, k, v and output (Note [Attention layouts]). Internal header shared
// by the op's shape inference and its kernels.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime {

// Note [Attention layouts]
// The attention op computes on [B, H, S, D] views of q, k, v and its output; by default each is held so ([B, H, S, D]
// row-major). The `bshd` attribute, four 0/1 ints for q, k, v and the output, marks the ones held as [B, S, H, D]
// instead: the layout a projection [B, S, H * D] already has before the exporters' `transpose(1, 2)` to heads, and
// the one `transpose(1, 2).reshape(B, S, H * D)` wants back. attention_fusion's head-transpose fold
// (Note [Attention reads the heads where the projections wrote them] in fusion_transformer.cpp) sets it, so the
// four strided copies per layer of every transformer go. Each kernel reads and writes element (b, h, s, d) at
// b * stride_b + h * stride_h + s * stride_s + d (strides() below); the mask and the log-sum-exp output keep their
// [B, H, Sq, Sk] and [B, H, Sq] meaning.
struct AttentionLayout {
  enum Tensor : std::size_t { kQ = 0, kK = 1, kV = 2, kOut = 3 };
  std::array<bool, 4> bshd{};  // q, k, v, output

  // The layout `attrs` declare; InvalidArgumentError for a `bshd` that is not four 0/1 values.
  static AttentionLayout of(const Attributes& attrs) {
    AttentionLayout layout;
    const std::vector<std::int64_t> flags = attrs.get_ints("bshd", {});
    if (flags.empty()) return layout;
    XPURT_CHECK(flags.size() == 4, "op 'attention': bshd must hold 4 values (q, k, v, output), got ", flags.size());
    for (std::size_t i = 0; i < 4; ++i) {
      XPURT_CHECK(flags[i] == 0 || flags[i] == 1, "op 'attention': bshd values must be 0 ([B, H, S, D]) or 1 ([B, S, "
                  "H, D]), got ", flags[i], " for ", name(i));
      layout.bshd[i] = flags[i] == 1;
    }
    return layout;
  }
  static const char* name(std::size_t i) {
    static const char* const names[] = {"q", "k", "v", "output"};
    return names[i];
  }
  bool any() const { return bshd[0] || bshd[1] || bshd[2] || bshd[3]; }

  // The [B, H, S, D] dims of tensor i from its stored shape (a rank-4 shape; others are returned unchanged).
  std::vector<std::int64_t> logical(std::size_t i, const std::vector<std::int64_t>& stored) const {
    if (!bshd[i] || stored.size() != 4) return stored;
    return {stored[0], stored[2], stored[1], stored[3]};
  }
  // The stored shape of tensor i whose [B, H, S, D] dims are `dims` (the same swap: it is its own inverse).
  std::vector<std::int64_t> stored(std::size_t i, const std::vector<std::int64_t>& dims) const {
    return logical(i, dims);
  }
  // Element strides {b, h, s} of tensor i held contiguously in its layout, from its [B, H, S, D] dims (d: 1).
  std::array<std::int64_t, 3> strides(std::size_t i, const std::vector<std::int64_t>& dims) const {
    const std::int64_t heads = dims[1], seq = dims[2], d = dims[3];
    if (bshd[i]) return {seq * heads * d, d, heads * d};
    return {heads * seq * d, seq * d, d};
  }
};

}  // namespace xpuruntime
