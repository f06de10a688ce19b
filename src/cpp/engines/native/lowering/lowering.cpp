// Lowering of ONNX nodes onto registry ops (see lowering.h).
#include "engines/native/lowering/lowering.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include "core/attention_layout.h"
#include "core/fused_elementwise.h"
#include "core/group_query_attention.h"
#include "core/quantize_ops.h"
#include "engines/native/passes/pass_utils.h"
#include "core/scalar.h"
#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/onnx_import.h"

namespace xpuruntime::runtime {
namespace {

using Ints = std::vector<std::int64_t>;

struct Ctx {
  const Node& node;
  std::int64_t opset;
  const std::vector<const ValueType*>& types;
  const std::vector<const Tensor*>& constants;

  bool has(std::size_t i) const { return node.has_input(i); }
  const ValueType* type(std::size_t i) const { return i < types.size() ? types[i] : nullptr; }
  const Tensor* constant(std::size_t i) const { return i < constants.size() ? constants[i] : nullptr; }
  bool known(std::size_t i) const { return type(i) && type(i)->fully_known(); }
  Ints shape(std::size_t i) const { return type(i)->sizes(); }
  std::int64_t rank(std::size_t i) const {
    return type(i) && type(i)->has_shape ? static_cast<std::int64_t>(type(i)->shape.size()) : -1;
  }
  // Only output 0 is used.
  bool single_output() const {
    for (std::size_t i = 1; i < node.outputs.size(); ++i) {
      if (!node.outputs[i].empty()) return false;
    }
    return true;
  }
};

Lowered reference(std::string reason) {
  Lowered l;
  l.kind = Lowered::Kind::kReference;
  l.reason = std::move(reason);
  return l;
}

Lowered registry(std::string op, std::vector<int> inputs, Attributes attrs = {}) {
  Lowered l;
  l.kind = Lowered::Kind::kRegistry;
  l.op = std::move(op);
  l.inputs = std::move(inputs);
  l.attrs = std::move(attrs);
  return l;
}

Lowered view(Ints shape, std::int64_t offset = 0) {
  Lowered l;
  l.kind = Lowered::Kind::kView;
  l.inputs = {0};
  l.view_shape = std::move(shape);
  l.view_offset = offset;
  return l;
}

// Note [Views at an offset]
// A Slice or Gather that keeps one contiguous block of its input is a view: its output is the input's bytes from
// an offset on, with no kernel and no copy (PlanValue::view_offset; the memory plan gives the view the slot of its
// root at that offset). The block is contiguous when the one axis cut (Slice with step 1, or Gather of a single
// constant index) has only axes of size 1 before it: the exporters' `select`/`getitem` of q, k and v on the outer
// axis of a [3, B, H, S, D] tensor, of a batch row, of a chunk. The element offset of such a block starting at
// `start` on `axis` of an input of `shape` and `dtype`; nullopt when the block is not contiguous, or starts at a
// byte offset that is not a multiple of 16: kernels are planned for operands at least 16-byte aligned (the
// arena's slots are; Note [cuBLASLt alignment]), so such a block is copied by the kernel instead.
std::optional<std::int64_t> outer_block_offset(const Ints& shape, DType dtype, std::size_t axis, std::int64_t start) {
  for (std::size_t d = 0; d < axis; ++d) {
    if (shape[d] != 1) return std::nullopt;
  }
  std::int64_t inner = 1;
  for (std::size_t d = axis + 1; d < shape.size(); ++d) {
    if (shape[d] < 0 || __builtin_mul_overflow(inner, shape[d], &inner)) return std::nullopt;  // (fuzzed shapes)
  }
  std::int64_t offset = 0, bytes = 0;
  if (__builtin_mul_overflow(start, inner, &offset) ||
      __builtin_mul_overflow(offset, static_cast<std::int64_t>(dtype_size(dtype)), &bytes) || bytes % 16 != 0) {
    return std::nullopt;
  }
  return offset;
}

bool read_const_ints(const Tensor* t, Ints* out) {
  if (t == nullptr) return false;
  if (t->dtype() == DType::kInt64) {
    out->assign(static_cast<const std::int64_t*>(t->data_ptr()),
                static_cast<const std::int64_t*>(t->data_ptr()) + t->numel());
    return true;
  }
  if (t->dtype() == DType::kInt32) {
    const auto* p = static_cast<const std::int32_t*>(t->data_ptr());
    out->assign(p, p + t->numel());
    return true;
  }
  return false;
}

// Axes from the attribute (before `input_since`) or the constant input `index` (from it on). False when the input
// is given but not constant.
bool axes_of(const Ctx& c, std::int64_t input_since, std::size_t index, Ints* axes) {
  if (c.opset < input_since) {
    *axes = c.node.attrs.get_ints("axes", {});
    return true;
  }
  if (!c.has(index)) {
    axes->clear();
    return true;
  }
  return read_const_ints(c.constant(index), axes);
}

std::int64_t norm_axis(std::int64_t axis, std::int64_t rank) { return axis < 0 ? axis + rank : axis; }

// ---- per-op lowerings ----

using LowerFn = std::function<Lowered(const Ctx&)>;

Lowered lower_unary(const Ctx&, const std::string& op) { return registry(op, {0}); }

Lowered lower_binary(const Ctx& c, const std::string& op) {
  if (c.node.inputs.size() != 2) return reference("variadic form with other than two inputs");
  // Before opset 7 the arithmetic and comparison ops broadcast ONNX's legacy way (broadcast/axis attributes).
  if (c.opset < 7) return reference("opset < 7 legacy broadcasting");
  return registry(op, {0, 1});
}

// Softmax and LogSoftmax (`op`: "softmax" or "log_softmax").
Lowered lower_softmax(const Ctx& c, const std::string& op) {
  const std::int64_t rank = c.rank(0);
  if (rank < 0) return reference("input rank unknown");
  const std::int64_t axis = norm_axis(c.node.attrs.get_int("axis", c.opset >= 13 ? -1 : 1), rank);
  if (c.opset < 13 && axis != rank - 1) return reference("opset < 13 " + c.node.op_type + " over a flattened 2-D view");
  Attributes a;
  a.set("axis", axis);
  return registry(op, {0}, a);
}

Lowered lower_matmul(const Ctx& c) {
  if (c.rank(0) < 2 || c.rank(1) < 2) return reference("operands of unknown rank or 1-D");
  return registry("matmul", {0, 1});
}

Lowered lower_gemm(const Ctx& c) {
  if (c.node.attrs.get_int("transA", 0) != 0) return reference("transA=1");
  if (c.node.attrs.get_float("alpha", 1.0) != 1.0) return reference("alpha != 1");
  if (c.has(2) && c.node.attrs.get_float("beta", 1.0) != 1.0) return reference("beta != 1");
  if (c.rank(0) != 2 || c.rank(1) != 2) return reference("operands of unknown rank");
  if (c.has(2) && (c.rank(2) != 1)) return reference("C is not a 1-D bias");
  Attributes a;
  a.set("weight_layout", std::string(c.node.attrs.get_int("transB", 0) ? "nk" : "kn"));
  return registry("linear", {0, 1, c.has(2) ? 2 : -1}, a);
}

// ONNX conv/pool padding (explicit pads or auto_pad resolved against the known input shape) as
// [top, left, bottom, right].
// Explicit pads (begins, then ends) for a convolution or pool over kernel.size() spatial axes.
bool resolve_pads(const Ctx& c, const Ints& kernel, const Ints& strides, const Ints& dilations, Ints* pads) {
  const std::string auto_pad = c.node.attrs.get_string("auto_pad", "NOTSET");
  const std::size_t dims = kernel.size();
  if (strides.size() != dims || dilations.size() != dims) return false;
  if (auto_pad == "NOTSET") {
    *pads = c.node.attrs.get_ints("pads", Ints(2 * dims, 0));
    return pads->size() == 2 * dims;
  }
  if (auto_pad == "VALID") {
    *pads = Ints(2 * dims, 0);
    return true;
  }
  if (!c.known(0)) return false;
  const Ints x = c.shape(0);
  pads->assign(2 * dims, 0);
  for (std::size_t k = 0; k < dims; ++k) {
    const std::int64_t in = x[2 + k];
    const std::int64_t out = (in + strides[k] - 1) / strides[k];
    const std::int64_t total =
        std::max<std::int64_t>(0, (out - 1) * strides[k] + (kernel[k] - 1) * dilations[k] + 1 - in);
    const std::int64_t small = total / 2;
    const std::int64_t large = total - small;
    (*pads)[k] = auto_pad == "SAME_LOWER" ? large : small;
    (*pads)[k + dims] = auto_pad == "SAME_LOWER" ? small : large;
  }
  return true;
}

// ONNX Conv in 3-D (x [N, C, D, H, W]) -> conv3d; a 3-D FusedConv (Note [3-D convolutions fused] in
// fusion_conv_gemm.cpp) also gives its residual and activation.
Lowered lower_conv3d(const Ctx& c, bool fused) {
  if (!c.known(1)) return reference("weight shape unknown");
  const Ints w = c.shape(1);
  const Ints kernel = {w[2], w[3], w[4]};
  const Ints strides = c.node.attrs.get_ints("strides", {1, 1, 1});
  const Ints dilations = c.node.attrs.get_ints("dilations", {1, 1, 1});
  Ints pads;
  if (fused) {
    pads = c.node.attrs.get_ints("pads", Ints(6, 0));
  } else if (!resolve_pads(c, kernel, strides, dilations, &pads)) {
    return reference("auto_pad with unknown input shape");
  }
  Attributes a;
  a.set("strides", strides);
  a.set("pads", pads);
  a.set("dilations", dilations);
  a.set("groups", c.node.attrs.get_int("group", 1));
  if (fused) a.set("activation", c.node.attrs.get_string("activation", "none"));
  return registry("conv3d", {0, 1, c.has(2) ? 2 : -1, fused && c.has(3) ? 3 : -1}, a);
}

Lowered lower_conv(const Ctx& c, bool fused) {
  if (c.rank(1) == 5 && c.rank(0) == 5) return lower_conv3d(c, fused);
  if (c.rank(1) != 4 || c.rank(0) != 4) return reference("not a 2-D or 3-D convolution (or ranks unknown)");
  if (!c.known(1)) return reference("weight shape unknown");
  const Ints w = c.shape(1);
  // FusedConv may be channels-last (the nhwc_layout pass): weight [O, kh, kw, C/g].
  const std::string layout = fused ? c.node.attrs.get_string("layout", "NCHW") : "NCHW";
  const Ints kernel = layout == "NHWC" ? Ints{w[1], w[2]} : Ints{w[2], w[3]};
  const Ints strides = c.node.attrs.get_ints("strides", {1, 1});
  const Ints dilations = c.node.attrs.get_ints("dilations", {1, 1});
  Ints pads;
  if (!fused) {
    if (!resolve_pads(c, kernel, strides, dilations, &pads)) return reference("auto_pad with unknown input shape");
  } else {
    pads = c.node.attrs.get_ints("pads", {0, 0, 0, 0});
  }
  Attributes a;
  a.set("strides", strides);
  a.set("pads", pads);
  a.set("dilations", dilations);
  a.set("groups", c.node.attrs.get_int("group", 1));
  if (fused) a.set("activation", c.node.attrs.get_string("activation", "none"));
  if (layout != "NCHW") a.set("layout", layout);
  return registry("conv2d", {0, 1, c.has(2) ? 2 : -1, fused && c.has(3) ? 3 : -1}, a);
}

// ONNX ConvTranspose in 2-D. auto_pad SAME_UPPER/SAME_LOWER/VALID and output_shape become explicit pads when the
// shapes are known, by the rule of ONNX's spec (the reference library's ConvTranspose computes the same).
Lowered lower_conv_transpose(const Ctx& c) {
  const bool three = c.rank(1) == 5 && c.rank(0) == 5;
  if (!three && (c.rank(1) != 4 || c.rank(0) != 4)) {
    return reference("not a 2-D or 3-D transposed convolution (or ranks unknown)");
  }
  const std::size_t dims = three ? 3 : 2;
  const std::string auto_pad = c.node.attrs.get_string("auto_pad", "NOTSET");
  Ints output_shape = c.node.attrs.get_ints("output_shape", {});
  if (output_shape.size() == dims + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
  const Ints strides = c.node.attrs.get_ints("strides", Ints(dims, 1));
  const Ints dilations = c.node.attrs.get_ints("dilations", Ints(dims, 1));
  const Ints output_padding = c.node.attrs.get_ints("output_padding", Ints(dims, 0));
  Ints pads = c.node.attrs.get_ints("pads", Ints(2 * dims, 0));
  if (strides.size() != dims || dilations.size() != dims || output_padding.size() != dims || pads.size() != 2 * dims) {
    return reference("attributes of another rank");
  }
  if (auto_pad == "VALID") pads = Ints(2 * dims, 0);
  if (!output_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    if (!c.known(0) || !c.known(1) || (!output_shape.empty() && output_shape.size() != dims)) {
      return reference("auto_pad or output_shape with unknown shapes");
    }
    const Ints x = c.shape(0);
    const Ints w = c.shape(1);
    for (std::size_t d = 0; d < dims; ++d) {
      const std::int64_t natural = strides[d] * (x[2 + d] - 1) + output_padding[d] + (w[2 + d] - 1) * dilations[d] + 1;
      const std::int64_t target = !output_shape.empty() ? output_shape[d] : x[2 + d] * strides[d];
      const std::int64_t total = natural - target;
      if (total < 0) return reference("output_shape larger than the natural output (negative pads)");
      const std::int64_t half = total / 2;
      pads[d] = auto_pad == "SAME_UPPER" ? half : total - half;
      pads[dims + d] = total - pads[d];
    }
  } else if (auto_pad != "NOTSET" && auto_pad != "VALID") {
    return reference("auto_pad " + auto_pad);
  }
  Attributes a;
  a.set("strides", strides);
  a.set("pads", pads);
  a.set("dilations", dilations);
  a.set("groups", c.node.attrs.get_int("group", 1));
  a.set("output_padding", output_padding);
  return registry(three ? "conv_transpose3d" : "conv_transpose2d", {0, 1, c.has(2) ? 2 : -1}, a);
}

Lowered lower_pool(const Ctx& c, const std::string& op) {
  if (c.rank(0) != 4) return reference("not a 2-D pool (or rank unknown)");
  if (!c.single_output()) return reference("the Indices output is used");
  if (c.node.attrs.get_int("storage_order", 0) != 0) return reference("storage_order=1");
  const Ints kernel = c.node.attrs.get_ints("kernel_shape", {});
  if (kernel.size() != 2) return reference("kernel_shape is not 2-D");
  const Ints strides = c.node.attrs.get_ints("strides", {1, 1});
  const Ints dilations = c.node.attrs.get_ints("dilations", {1, 1});
  Ints pads;
  if (!resolve_pads(c, kernel, strides, dilations, &pads)) return reference("auto_pad with unknown input shape");
  Attributes a;
  a.set("kernel_shape", kernel);
  a.set("strides", strides);
  a.set("pads", pads);
  a.set("ceil_mode", c.node.attrs.get_int("ceil_mode", 0));
  // The com.xpuruntime pools (the nhwc_layout pass) carry a layout.
  if (c.node.domain == kXpurtDomain) a.set("layout", c.node.attrs.get_string("layout", "NCHW"));
  if (op == "max_pool2d") {
    a.set("dilations", dilations);
  } else {
    if (dilations != Ints{1, 1}) return reference("dilated average pooling");
    a.set("count_include_pad", c.node.attrs.get_int("count_include_pad", 0));
  }
  return registry(op, {0}, a);
}

Lowered lower_reduce(const Ctx& c, const std::string& op, std::int64_t axes_input_since) {
  Ints axes;
  if (!axes_of(c, axes_input_since, 1, &axes)) return reference("axes are not a constant");
  if (axes.empty() && c.node.attrs.get_int("noop_with_empty_axes", 0) != 0) return reference("noop_with_empty_axes");
  Attributes a;
  a.set("axes", axes);
  a.set("keepdims", c.node.attrs.get_int("keepdims", 1));
  return registry(op, {0}, a);
}

Lowered lower_cast(const Ctx& c) {
  const AttrValue* to = nullptr;
  auto it = c.node.attrs.values().find("to");
  if (it != c.node.attrs.values().end()) to = &it->second;
  if (to == nullptr || !std::holds_alternative<std::int64_t>(*to)) return reference("'to' is not a type code");
  DType dtype;
  if (!dtype_from_onnx_type(std::get<std::int64_t>(*to), &dtype)) return reference("cast to an unsupported type");
  // float8 and int4 (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h): the registry's cast takes neither; the node
  // kernel rounds with the node's `saturate`.
  if (is_low_bit_dtype(dtype) || (c.type(0) != nullptr && is_low_bit_dtype(c.type(0)->dtype))) {
    return reference("a cast from or to float8/int4 runs in the node kernel");
  }
  Attributes a;
  a.set("to", std::string(dtype_name(dtype)));
  return registry("cast", {0}, a);
}

// ---- views ----

Lowered lower_reshape(const Ctx& c) {
  if (!c.known(0)) return reference("input shape unknown");
  Ints target;
  if (c.opset < 5) {
    target = c.node.attrs.get_ints("shape", {});
  } else if (!read_const_ints(c.constant(1), &target)) {
    return reference("the target shape is not a constant");
  }
  const Ints in = c.shape(0);
  const bool allowzero = c.node.attrs.get_int("allowzero", 0) != 0;
  std::int64_t known = 1;
  int infer_at = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] == 0 && !allowzero) {
      if (i >= in.size()) return reference("0 refers past the input's rank");
      target[i] = in[i];
    }
    if (target[i] == -1) {
      if (infer_at >= 0) return reference("two -1 dimensions");
      infer_at = static_cast<int>(i);
    } else {
      if (target[i] < 0) return reference("negative dimension");
      if (__builtin_mul_overflow(known, target[i], &known)) return reference("the target's size is past int64");
    }
  }
  std::int64_t total = 1;
  for (auto d : in) {
    if (__builtin_mul_overflow(total, d, &total)) return reference("the input's size is past int64");  // (fuzzed)
  }
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) return reference("-1 cannot be inferred");
    target[infer_at] = total / known;
  } else if (known != total) {
    return reference("element count differs");
  }
  return view(target);
}

Lowered lower_flatten(const Ctx& c) {
  if (!c.known(0)) return reference("input shape unknown");
  const Ints in = c.shape(0);
  const auto rank = static_cast<std::int64_t>(in.size());
  const std::int64_t axis = norm_axis(c.node.attrs.get_int("axis", 1), rank);
  if (axis < 0 || axis > rank) return reference("axis out of range");
  std::int64_t a = 1, b = 1;
  for (std::int64_t i = 0; i < rank; ++i) {
    std::int64_t& side = i < axis ? a : b;
    if (__builtin_mul_overflow(side, in[i], &side)) return reference("the input's size is past int64");  // (fuzzed)
  }
  return view({a, b});
}

Lowered lower_squeeze(const Ctx& c) {
  if (!c.known(0)) return reference("input shape unknown");
  Ints axes;
  if (!axes_of(c, 13, 1, &axes)) return reference("axes are not a constant");
  const Ints in = c.shape(0);
  const auto rank = static_cast<std::int64_t>(in.size());
  std::vector<bool> drop(in.size(), false);
  if (axes.empty()) {
    for (std::size_t i = 0; i < in.size(); ++i) drop[i] = in[i] == 1;
  } else {
    for (auto ax : axes) {
      ax = norm_axis(ax, rank);
      if (ax < 0 || ax >= rank || in[ax] != 1) return reference("squeezed axis is not of size 1");
      drop[ax] = true;
    }
  }
  Ints out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!drop[i]) out.push_back(in[i]);
  }
  return view(out);
}

Lowered lower_unsqueeze(const Ctx& c) {
  if (!c.known(0)) return reference("input shape unknown");
  Ints axes;
  if (!axes_of(c, 13, 1, &axes)) return reference("axes are not a constant");
  const Ints in = c.shape(0);
  const auto rank = static_cast<std::int64_t>(in.size() + axes.size());
  std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
  for (auto ax : axes) {
    ax = norm_axis(ax, rank);
    if (ax < 0 || ax >= rank || inserted[ax]) return reference("invalid axes");
    inserted[ax] = true;
  }
  Ints out;
  std::size_t next = 0;
  for (std::int64_t i = 0; i < rank; ++i) out.push_back(inserted[i] ? 1 : in[next++]);
  return view(out);
}

Lowered lower_identity(const Ctx& c) {
  if (!c.known(0)) return reference("input shape unknown");
  if (!c.single_output()) return reference("the mask output is used");
  if (c.node.op_type == "Dropout" && c.has(2)) {
    // training_mode input: only a constant false keeps it an identity.
    const Tensor* t = c.constant(2);
    if (t == nullptr || t->numel() != 1 || *static_cast<const bool*>(t->data_ptr())) {
      return reference("training_mode is not a constant false");
    }
  }
  return view(c.shape(0));
}

// ---- data movement (registry ops "transpose", "concat", "slice", "gather", "expand", "where") ----

// Note [Transposes of size-1 axes are views]
// A Transpose that moves only axes of size 1 keeps every other axis in its order, so the output's bytes are the
// input's, in the same order: a reshape, no kernel and no copy. Decoders' decode steps are full of them: the new
// token's keys and values [B, 1, H, D] to [B, H, 1, D] (Transpose(0, 2, 1, 3) at seq 1) before their Concat onto the
// cache, two copy kernels per layer and step otherwise.
std::optional<Ints> size_one_transpose(const Ctx& c, const Ints& perm) {
  if (!c.known(0)) return std::nullopt;
  const Ints in = c.shape(0);
  if (perm.size() != in.size()) return std::nullopt;
  Ints out;
  std::int64_t last = -1;  // the last axis of size other than 1 taken
  std::vector<bool> seen(in.size(), false);
  for (std::int64_t axis : perm) {
    if (axis < 0 || axis >= static_cast<std::int64_t>(in.size()) || seen[axis]) return std::nullopt;
    seen[axis] = true;
    if (in[axis] != 1) {
      if (axis < last) return std::nullopt;
      last = axis;
    }
    out.push_back(in[axis]);
  }
  return out;
}

Lowered lower_transpose(const Ctx& c) {
  Attributes a;
  Ints perm = c.node.attrs.get_ints("perm", {});
  if (perm.empty()) {
    const std::int64_t rank = c.rank(0);
    if (rank < 0) return reference("input rank unknown");
    for (std::int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  if (auto shape = size_one_transpose(c, perm)) return view(*shape);  // Note [Transposes of size-1 axes are views]
  a.set("perm", perm);
  return registry("transpose", {0}, a);
}

Lowered lower_concat(const Ctx& c) {
  std::vector<int> inputs;
  for (std::size_t i = 0; i < c.node.inputs.size(); ++i) {
    if (!c.has(i)) return reference("an absent input");
    inputs.push_back(static_cast<int>(i));
  }
  if (c.opset < 4 && !c.node.attrs.has("axis")) return reference("opset < 4 default axis");
  Attributes a;
  a.set("axis", c.node.attrs.get_int("axis", 0));
  return registry("concat", inputs, a);
}

// A Slice that cuts one axis with step 1, only size-1 axes before it (Note [Views at an offset]).
std::optional<Lowered> slice_view(const Ctx& c, const Ints& starts, const Ints& ends, const Ints& axes,
                                  const Ints& steps) {
  if (!c.known(0) || starts.size() != ends.size() || (!axes.empty() && axes.size() != starts.size()) ||
      (!steps.empty() && steps.size() != starts.size())) {
    return std::nullopt;
  }
  Ints shape = c.shape(0);
  const auto rank = static_cast<std::int64_t>(shape.size());
  Ints out = shape;
  std::optional<std::size_t> cut;
  std::int64_t cut_start = 0;
  std::vector<bool> seen(shape.size(), false);
  for (std::size_t k = 0; k < starts.size(); ++k) {
    std::int64_t axis = axes.empty() ? static_cast<std::int64_t>(k) : axes[k];
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || seen[static_cast<std::size_t>(axis)]) return std::nullopt;
    seen[static_cast<std::size_t>(axis)] = true;
    if (!steps.empty() && steps[k] != 1) return std::nullopt;
    const std::int64_t dim = shape[static_cast<std::size_t>(axis)];
    auto clamp = [dim](std::int64_t v) {
      if (v < 0) v = v < -dim ? 0 : v + dim;
      return std::min(v, dim);
    };
    const std::int64_t begin = clamp(starts[k]), end = std::max(clamp(ends[k]), begin);
    if (begin == 0 && end == dim) continue;  // the whole axis
    if (cut) return std::nullopt;            // a second axis cut: not one block
    cut = static_cast<std::size_t>(axis);
    cut_start = begin;
    out[*cut] = end - begin;
  }
  if (!cut) return view(out);
  const auto offset = outer_block_offset(shape, c.type(0)->dtype, *cut, cut_start);
  if (!offset) return std::nullopt;
  return view(out, out[*cut] == 0 ? 0 : *offset);
}

Lowered lower_slice(const Ctx& c) {
  Ints starts, ends, axes, steps;
  if (c.opset < 10) {
    starts = c.node.attrs.get_ints("starts", {});
    ends = c.node.attrs.get_ints("ends", {});
    axes = c.node.attrs.get_ints("axes", {});
  } else {
    if (!read_const_ints(c.constant(1), &starts) || !read_const_ints(c.constant(2), &ends)) {
      return reference("starts/ends are not constants");
    }
    if (c.has(3) && !read_const_ints(c.constant(3), &axes)) return reference("axes are not a constant");
    if (c.has(4) && !read_const_ints(c.constant(4), &steps)) return reference("steps are not a constant");
  }
  if (auto v = slice_view(c, starts, ends, axes, steps)) return *v;
  Attributes a;
  a.set("starts", starts);
  a.set("ends", ends);
  if (!axes.empty()) a.set("axes", axes);
  if (!steps.empty()) a.set("steps", steps);
  return registry("slice", {0}, a);
}

// A Gather of one constant index along an axis with only size-1 axes before it (Note [Views at an offset]).
std::optional<Lowered> gather_view(const Ctx& c) {
  if (!c.known(0) || !c.known(1)) return std::nullopt;
  const Ints shape = c.shape(0);
  std::int64_t axis = c.node.attrs.get_int("axis", 0);
  const auto rank = static_cast<std::int64_t>(shape.size());
  if (axis < 0) axis += rank;
  Ints index;
  if (axis < 0 || axis >= rank || !read_const_ints(c.constant(1), &index) || index.size() != 1) return std::nullopt;
  std::int64_t i = index[0] < 0 ? index[0] + shape[static_cast<std::size_t>(axis)] : index[0];
  if (i < 0 || i >= shape[static_cast<std::size_t>(axis)]) return std::nullopt;  // the kernel reports it
  const auto offset = outer_block_offset(shape, c.type(0)->dtype, static_cast<std::size_t>(axis), i);
  if (!offset) return std::nullopt;
  Ints out(shape.begin(), shape.begin() + axis);
  for (std::int64_t d : c.shape(1)) out.push_back(d);  // [] (a scalar index) or [1]
  out.insert(out.end(), shape.begin() + axis + 1, shape.end());
  return view(out, *offset);
}

Lowered lower_gather(const Ctx& c) {
  if (auto v = gather_view(c)) return *v;
  Attributes a;
  a.set("axis", c.node.attrs.get_int("axis", 0));
  return registry("gather", {0, 1}, a);
}

Lowered lower_expand(const Ctx& c) {
  Ints shape;
  if (!read_const_ints(c.constant(1), &shape)) return reference("the shape is not a constant");
  Attributes a;
  a.set("shape", shape);
  return registry("expand", {0}, a);
}

// ---- the ONNX ops beyond the core set (docs/ops.md: their attributes keep ONNX's names; what ONNX takes as
// constant inputs becomes attributes) ----

// The value of a one-element constant as a double (any dtype). False otherwise.
bool read_const_scalar(const Tensor* t, double* out) {
  if (t == nullptr || t->numel() != 1) return false;
  *out = detail::scalar_as_double(*t, "a constant scalar");  // Note [Scalars read from tensors]
  return true;
}

// The value of a one-element constant as an int64: integers exactly, floats truncated (scalar_as_int64). False when
// `t` is not a one-element constant or its value is beyond int64 (the reference library then runs the node and says
// what is wrong with it): an int64 axis of 2^63 - 1 read through a double and cast back was undefined behaviour,
// found by the structural fuzzer.
bool read_const_int(const Tensor* t, std::int64_t* out) {
  if (t == nullptr || t->numel() != 1) return false;
  try {
    *out = detail::scalar_as_int64(*t, "a constant scalar");
  } catch (const InvalidArgumentError&) {
    return false;
  }
  return true;
}

// The values of a float32/float64 constant (Resize's scales). False otherwise.
bool read_const_floats(const Tensor* t, std::vector<double>* out) {
  if (t == nullptr || (t->dtype() != DType::kFloat32 && t->dtype() != DType::kFloat64)) return false;
  *out = passes::internal::to_doubles(*t);
  return true;
}

// A float-only pointwise op with the node's attributes `copied` (ONNX names) set when present.
Lowered lower_float_pointwise(const Ctx& c, const std::string& op, std::initializer_list<const char*> copied = {}) {
  Attributes a;
  for (const char* name : copied) {
    auto it = c.node.attrs.values().find(name);
    if (it != c.node.attrs.values().end()) a.set(name, it->second);
  }
  return registry(op, {0}, a);
}

Lowered lower_clip(const Ctx& c) {
  Attributes a;
  if (c.opset < 11) {
    if (c.node.attrs.has("min")) a.set("min", c.node.attrs.get_float("min", 0.0));
    if (c.node.attrs.has("max")) a.set("max", c.node.attrs.get_float("max", 0.0));
    return registry("clip", {0}, a);
  }
  for (std::size_t k = 1; k < 3; ++k) {
    if (!c.has(k)) continue;
    double v = 0.0;
    if (!read_const_scalar(c.constant(k), &v)) {
      return reference(k == 1 ? "min is not a constant" : "max is not a constant");
    }
    a.set(k == 1 ? "min" : "max", v);
  }
  return registry("clip", {0}, a);
}

Lowered lower_cum_sum(const Ctx& c) {
  std::int64_t axis = 0;
  if (!read_const_int(c.constant(1), &axis)) return reference("axis is not a constant integer");
  Attributes a;
  a.set("axis", axis);
  a.set("exclusive", c.node.attrs.get_int("exclusive", 0));
  a.set("reverse", c.node.attrs.get_int("reverse", 0));
  return registry("cum_sum", {0}, a);
}

Lowered lower_pad(const Ctx& c) {
  const std::int64_t rank = c.rank(0);
  if (rank < 0) return reference("input rank unknown");
  Ints pads;
  double value = 0.0;
  Ints axes;
  if (c.opset < 11) {
    pads = c.node.attrs.get_ints("pads", {});
    value = c.node.attrs.get_float("value", 0.0);
  } else {
    if (!read_const_ints(c.constant(1), &pads)) return reference("pads are not a constant");
    if (c.has(2) && !read_const_scalar(c.constant(2), &value)) return reference("constant_value is not a constant");
    if (c.has(3) && !read_const_ints(c.constant(3), &axes)) return reference("axes are not a constant");
  }
  if (!axes.empty()) {  // opset 18: pads for the listed axes only
    if (pads.size() != 2 * axes.size()) return reference("pads do not match axes");
    Ints full(static_cast<std::size_t>(2 * rank), 0);
    for (std::size_t k = 0; k < axes.size(); ++k) {
      const std::int64_t axis = norm_axis(axes[k], rank);
      if (axis < 0 || axis >= rank) return reference("an axis is out of range");
      full[static_cast<std::size_t>(axis)] = pads[k];
      full[static_cast<std::size_t>(axis + rank)] = pads[k + axes.size()];
    }
    pads = full;
  }
  Attributes a;
  a.set("pads", pads);
  a.set("mode", c.node.attrs.get_string("mode", "constant"));
  a.set("value", value);
  return registry("pad", {0}, a);
}

Lowered lower_resize(const Ctx& c) {
  if (c.opset < 11) return reference("opset < 11 Resize");
  if (!c.known(0)) return reference("input shape unknown");
  const Ints in = c.shape(0);
  const auto rank = static_cast<std::int64_t>(in.size());
  const std::string coordinates = c.node.attrs.get_string("coordinate_transformation_mode", "half_pixel");
  if (coordinates == "tf_crop_and_resize") return reference("tf_crop_and_resize reads roi");
  if (c.node.attrs.get_string("keep_aspect_ratio_policy", "stretch") != "stretch") {
    return reference("keep_aspect_ratio_policy other than stretch");
  }
  Ints axes = c.node.attrs.get_ints("axes", {});
  if (axes.empty()) {
    for (std::int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  Ints sizes = in;
  std::vector<double> scales(static_cast<std::size_t>(rank), 1.0);
  Ints given_sizes;
  std::vector<double> given_scales;
  if (c.has(3) && read_const_ints(c.constant(3), &given_sizes) && !given_sizes.empty()) {
    if (given_sizes.size() != axes.size()) return reference("sizes do not match axes");
    for (std::size_t k = 0; k < axes.size(); ++k) {
      const auto d = static_cast<std::size_t>(norm_axis(axes[k], rank));
      if (d >= in.size() || in[d] == 0) return reference("an axis is out of range or empty");
      sizes[d] = given_sizes[k];
      scales[d] = static_cast<double>(given_sizes[k]) / static_cast<double>(in[d]);
    }
  } else if (c.has(2) && read_const_floats(c.constant(2), &given_scales) && !given_scales.empty()) {
    if (given_scales.size() != axes.size()) return reference("scales do not match axes");
    for (std::size_t k = 0; k < axes.size(); ++k) {
      const auto d = static_cast<std::size_t>(norm_axis(axes[k], rank));
      if (d >= in.size() || !(given_scales[k] > 0)) return reference("an axis is out of range or a scale <= 0");
      // ONNX: floor(input * scale), with the scale as the model stores it (float32).
      sizes[d] = static_cast<std::int64_t>(
          std::floor(static_cast<double>(in[d]) * static_cast<double>(static_cast<float>(given_scales[k]))));
      scales[d] = given_scales[k];
    }
  } else {
    return reference("neither sizes nor scales is a constant");
  }
  Attributes a;
  a.set("sizes", sizes);
  a.set("scales", scales);
  a.set("mode", c.node.attrs.get_string("mode", "nearest"));
  a.set("coordinate_transformation_mode", coordinates);
  a.set("nearest_mode", c.node.attrs.get_string("nearest_mode", "round_prefer_floor"));
  a.set("cubic_coeff_a", c.node.attrs.get_float("cubic_coeff_a", -0.75));
  a.set("exclude_outside", c.node.attrs.get_int("exclude_outside", 0));
  a.set("antialias", c.node.attrs.get_int("antialias", 0));
  return registry("resize", {0}, a);
}

Lowered lower_one_hot(const Ctx& c) {
  std::int64_t depth = 0;
  if (!read_const_int(c.constant(1), &depth)) return reference("depth is not a constant integer");
  const Tensor* values = c.constant(2);
  if (values == nullptr || values->numel() != 2) return reference("values are not a 2-element constant");
  const std::vector<double> off_on = passes::internal::to_doubles(*values);
  Attributes a;
  a.set("depth", depth);
  a.set("axis", c.node.attrs.get_int("axis", -1));
  a.set("on", off_on[1]);
  a.set("off", off_on[0]);
  a.set("dtype", std::string(dtype_name(values->dtype())));
  return registry("one_hot", {0}, a);
}

Lowered lower_trilu(const Ctx& c) {
  std::int64_t k = 0;
  if (c.has(1) && !read_const_int(c.constant(1), &k)) return reference("k is not a constant integer");
  Attributes a;
  a.set("k", k);
  a.set("upper", c.node.attrs.get_int("upper", 1));
  return registry("trilu", {0}, a);
}

Lowered lower_tile(const Ctx& c) {
  if (c.opset < 6) return reference("opset < 6 Tile (tiles and axis inputs)");
  Ints repeats;
  if (!read_const_ints(c.constant(1), &repeats)) return reference("repeats are not a constant");
  Attributes a;
  a.set("repeats", repeats);
  return registry("tile", {0}, a);
}

Lowered lower_top_k(const Ctx& c) {
  Ints k;
  if (c.opset < 10) {
    k = {c.node.attrs.get_int("k", -1)};
  } else if (!read_const_ints(c.constant(1), &k) || k.size() != 1) {
    return reference("K is not a constant");
  }
  Attributes a;
  a.set("k", k[0]);
  a.set("axis", c.node.attrs.get_int("axis", -1));
  a.set("largest", c.node.attrs.get_int("largest", 1));
  a.set("sorted", c.node.attrs.get_int("sorted", 1));
  return registry("top_k", {0}, a);
}

Lowered lower_arg_reduce(const Ctx& c, const std::string& op) {
  Attributes a;
  a.set("axis", c.node.attrs.get_int("axis", 0));
  a.set("keepdims", c.node.attrs.get_int("keepdims", 1));
  a.set("select_last_index", c.node.attrs.get_int("select_last_index", 0));
  return registry(op, {0}, a);
}

// ---- int8 GEMM and convolution: qlinear, qconv2d (Note [Quantized registry ops] in core/op_schemas.cpp) ----

bool is_8bit(const ValueType* t) { return t != nullptr && (t->dtype == DType::kInt8 || t->dtype == DType::kUInt8); }

// The attributes `<prefix>_scale` and `<prefix>_zero_point` from the node's inputs `scale` and `zp` (absent or -1:
// none; an absent zero point is 0): each a one-element constant, the scale float32. The reason when not.
std::string per_tensor_params(const Ctx& c, int scale, int zp, const std::string& prefix, Attributes& a) {
  double value = 0;
  if (scale >= 0) {
    const Tensor* t = c.constant(static_cast<std::size_t>(scale));
    if (t == nullptr || t->dtype() != DType::kFloat32 || !read_const_scalar(t, &value)) {
      return prefix + "_scale is not a one-element float32 constant";
    }
    a.set(prefix + "_scale", value);
  }
  if (zp >= 0 && c.has(static_cast<std::size_t>(zp))) {
    std::int64_t zero_point = 0;
    if (!read_const_int(c.constant(static_cast<std::size_t>(zp)), &zero_point)) {
      return prefix + "_zero_point is not a one-element integer constant";
    }
    a.set(prefix + "_zero_point", zero_point);
  }
  return {};
}

// Why the weight (input `w`, its zero point `zp`) is not what qlinear/qconv2d take: int8 of rank `rank`, the zero
// point absent or constant zeros. Empty when it is.
std::string int8_weight_problem(const Ctx& c, int w, int zp, std::int64_t rank) {
  const ValueType* t = c.type(static_cast<std::size_t>(w));
  if (t == nullptr || t->dtype != DType::kInt8) return "the weight is not int8 (the int8 ops take symmetric int8)";
  if (c.rank(static_cast<std::size_t>(w)) != rank) return detail::str_cat("the weight is not of rank ", rank);
  if (zp >= 0 && c.has(static_cast<std::size_t>(zp))) {
    const Tensor* z = c.constant(static_cast<std::size_t>(zp));
    if (z == nullptr) return "the weight's zero point is not constant";
    for (double v : passes::internal::to_doubles(*z)) {
      if (v != 0) return "the weight's zero point is not 0 (the int8 ops take symmetric weights)";
    }
  }
  return {};
}

// A per-tensor or per-output-channel float32 weight scale (input `scale`) of `channels` channels, 0-D or 1-D.
bool channel_scale(const Ctx& c, int scale, std::int64_t channels) {
  const ValueType* t = c.type(static_cast<std::size_t>(scale));
  if (t == nullptr || t->dtype != DType::kFloat32 || !t->fully_known() || t->shape.size() > 1) return false;
  const Ints sizes = t->sizes();
  return sizes.empty() || sizes[0] == 1 || sizes[0] == channels;
}

// The output dtype named by a y_zero_point input (`zp`) of type int8 or uint8.
std::string output_dtype_of(const Ctx& c, int zp) {
  const ValueType* t = c.type(static_cast<std::size_t>(zp));
  return t != nullptr && t->dtype == DType::kInt8 ? "int8" : "uint8";
}

// Whether MatMulInteger's a_zero_point (input 2) is one value known only at run time (DynamicQuantizeLinear's zero
// point): qlinear's input x_zero_point.
bool run_time_zero_point(const Ctx& c) {
  if (!c.has(2) || c.constant(2) != nullptr || !c.known(2) || c.type(2)->dtype != c.type(0)->dtype) return false;
  const Ints sizes = c.shape(2);
  return sizes.size() <= 1 && (sizes.empty() || sizes[0] == 1);
}

// ONNX QLinearMatMul (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point) and MatMulInteger
// (A, B, a_zero_point, b_zero_point) -> qlinear: per-tensor constant parameters of a and y (MatMulInteger's
// a_zero_point also one value known only at run time), b a 2-D int8 weight with zero points 0 and a per-tensor or
// per-column scale.
Lowered lower_quantized_matmul(const Ctx& c, bool integer) {
  const int w = integer ? 1 : 3;
  if (!is_8bit(c.type(0)) || c.rank(0) < 1) return reference("a is not int8 or uint8");
  std::string problem = int8_weight_problem(c, w, integer ? 3 : 5, 2);
  if (!problem.empty()) return reference(problem);
  Attributes a;
  a.set("weight_layout", std::string("kn"));
  if (integer && run_time_zero_point(c)) {
    a.set("output_dtype", std::string("int32"));
    return registry("qlinear", {0, 1, -1, -1, 2}, a);
  }
  problem = per_tensor_params(c, integer ? -1 : 1, 2, "x", a);
  if (problem.empty() && !integer) problem = per_tensor_params(c, 6, 7, "y", a);
  if (!problem.empty()) return reference(problem);
  if (integer) {
    a.set("output_dtype", std::string("int32"));
    return registry("qlinear", {0, 1, -1, -1}, a);
  }
  if (!c.known(3) || !channel_scale(c, 4, c.shape(3)[1])) return reference("b_scale is not per tensor or per column");
  a.set("output_dtype", output_dtype_of(c, 7));
  return registry("qlinear", {0, 3, 4, -1}, a);
}

// ONNX QLinearConv (x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B) and ConvInteger
// (x, w, x_zero_point, w_zero_point) in 2-D -> qconv2d, on the conditions of lower_quantized_matmul.
Lowered lower_quantized_conv(const Ctx& c, bool integer) {
  const int w = integer ? 1 : 3;
  if (!is_8bit(c.type(0)) || c.rank(0) != 4) return reference("x is not a 4-D int8 or uint8 tensor");
  std::string problem = int8_weight_problem(c, w, integer ? 3 : 5, 4);
  if (!problem.empty()) return reference(problem);
  if (!c.known(static_cast<std::size_t>(w))) return reference("weight shape unknown");
  const Ints ws = c.shape(static_cast<std::size_t>(w));
  const Ints kernel = {ws[2], ws[3]};
  if (c.node.attrs.has("kernel_shape") && c.node.attrs.get_ints("kernel_shape", {}) != kernel) {
    return reference("kernel_shape differs from the weight's");
  }
  const Ints strides = c.node.attrs.get_ints("strides", {1, 1});
  const Ints dilations = c.node.attrs.get_ints("dilations", {1, 1});
  Ints pads;
  if (!resolve_pads(c, kernel, strides, dilations, &pads)) return reference("auto_pad with unknown input shape");
  Attributes a;
  a.set("strides", strides);
  a.set("pads", pads);
  a.set("dilations", dilations);
  a.set("groups", c.node.attrs.get_int("group", 1));
  problem = per_tensor_params(c, integer ? -1 : 1, 2, "x", a);
  if (problem.empty() && !integer) problem = per_tensor_params(c, 6, 7, "y", a);
  if (!problem.empty()) return reference(problem);
  if (integer) {
    a.set("output_dtype", std::string("int32"));
    return registry("qconv2d", {0, 1, -1, -1}, a);
  }
  if (!channel_scale(c, 4, ws[0])) return reference("w_scale is not per tensor or per output channel");
  if (c.has(8) && (c.type(8) == nullptr || c.type(8)->dtype != DType::kInt32)) return reference("B is not int32");
  a.set("output_dtype", output_dtype_of(c, 7));
  return registry("qconv2d", {0, 3, 4, c.has(8) ? 8 : -1}, a);
}

// com.xpuruntime QLinear / QConv (the quantized_fusion pass): their attributes are the registry op's.
Lowered lower_fused_quantized(const Ctx& c, const std::string& op) {
  std::vector<int> inputs = {0, 1, c.has(2) ? 2 : -1, c.has(3) ? 3 : -1};
  if (op == "qlinear") inputs.push_back(c.has(4) ? 4 : -1);  // the run-time x_zero_point
  return registry(op, inputs, c.node.attrs);
}

// ---- QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear (Note [Quantize registry ops] in core/quantize_ops.h) --

// Why the node's scale (input 1) is not a registry form: blocked (block_size), not a float, or of unknown shape.
// Empty when it is one (per tensor or per axis; the schema checks the shape against x).
std::string quantize_scale_problem(const Ctx& c) {
  if (c.opset >= 21 && c.node.attrs.get_int("block_size", 0) != 0) {
    return "blocked scales (block_size) run on the node kernel";
  }
  const ValueType* scale = c.type(1);
  if (scale == nullptr || !quantize_ops::is_real_dtype(scale->dtype)) {
    return "the scale is not float32, float16 or bfloat16";
  }
  if (!c.known(1)) return "the scale's shape is unknown";
  const Ints shape = c.shape(1);
  const bool per_tensor = shape.size() <= 1 && (shape.empty() || shape[0] == 1);
  if (!per_tensor && c.opset < 13) return "a per-axis scale before opset 13 (the node kernel says why not)";
  return {};
}

// Whether the quantized dtype `d` exists at the node's opset (the node kernel names the opset that brings it).
bool quantized_dtype_in_opset(DType d, std::int64_t opset) {
  if (is_float8_dtype(d)) return opset >= 19;
  if (is_int4_dtype(d)) return opset >= 21;
  return true;
}

// The zero point input (2), or -1 when absent or when it is a float8 constant of zeros: the arithmetic adds or
// subtracts 0 either way, and without it the GPU converts through cuda_fp8.h (Note [Float8 on the GPU] in
// backends/cuda_raw/quantize.cu).
int quantize_zero_point(const Ctx& c) {
  if (!c.has(2)) return -1;
  const Tensor* zp = c.constant(2);
  if (zp == nullptr || !is_float8_dtype(zp->dtype())) return 2;
  for (const double v : detail::to_doubles(*zp)) {
    if (v != 0.0) return 2;
  }
  return -1;
}

// ONNX QuantizeLinear -> quantize_linear: float x, a per-tensor or per-axis scale, an output of int8, uint8, int4,
// uint4 or a float8 (the zero point's type, else output_dtype, else uint8).
Lowered lower_quantize_linear(const Ctx& c) {
  const ValueType* x = c.type(0);
  if (x == nullptr || !quantize_ops::is_real_dtype(x->dtype)) {
    return reference("x is not float32, float16 or bfloat16 (int32 x runs on the node kernel)");
  }
  std::string problem = quantize_scale_problem(c);
  if (!problem.empty()) return reference(problem);
  DType out = DType::kUInt8;
  const std::int64_t output_dtype = c.opset >= 21 ? c.node.attrs.get_int("output_dtype", 0) : 0;
  if (output_dtype != 0 && !dtype_from_onnx_type(output_dtype, &out)) return reference("output_dtype is unsupported");
  if (c.has(2)) {
    if (c.type(2) == nullptr || (output_dtype != 0 && c.type(2)->dtype != out)) {
      return reference("the zero point's type is unknown or differs from output_dtype");
    }
    out = c.type(2)->dtype;
  }
  if (!quantize_ops::is_quantized_dtype(out) || !quantized_dtype_in_opset(out, c.opset)) {
    return reference(detail::str_cat("quantizing to ", dtype_name(out), " at opset ", c.opset,
                                     " runs on the node kernel"));
  }
  Attributes a;
  a.set("axis", c.node.attrs.get_int("axis", 1));
  a.set("saturate", c.opset >= 19 ? c.node.attrs.get_int("saturate", 1) : std::int64_t{1});
  a.set("output_dtype", std::string(dtype_name(out)));
  return registry("quantize_linear", {0, 1, quantize_zero_point(c)}, a);
}

// ONNX DequantizeLinear -> dequantize_linear: x int8, uint8, int32, int4, uint4 or a float8, a per-tensor or per-axis
// float scale (the output's dtype).
Lowered lower_dequantize_linear(const Ctx& c) {
  const ValueType* x = c.type(0);
  if (x == nullptr || !quantize_ops::is_dequantizable_dtype(x->dtype) || !quantized_dtype_in_opset(x->dtype, c.opset)) {
    const std::string what = x == nullptr ? std::string("an unknown type") : std::string(dtype_name(x->dtype));
    return reference(detail::str_cat("dequantizing ", what, " at opset ", c.opset, " runs on the node kernel"));
  }
  std::string problem = quantize_scale_problem(c);
  if (!problem.empty()) return reference(problem);
  if (c.has(2) && (c.type(2) == nullptr || c.type(2)->dtype != x->dtype)) {
    return reference("the zero point's type is unknown or differs from x's");
  }
  Attributes a;
  a.set("axis", c.node.attrs.get_int("axis", 1));
  return registry("dequantize_linear", {0, 1, quantize_zero_point(c)}, a);
}

// ---- int4 weight-only GEMM: matmul_nbits (Note [Int4 weight-only GEMM] in core/op_schemas_int4.cpp) ----

bool is_matmul_float(const ValueType* t) {
  return t != nullptr && (t->dtype == DType::kFloat32 || t->dtype == DType::kFloat16 || t->dtype == DType::kBFloat16);
}

// com.microsoft MatMulNBits (A, B, scales, zero_points, g_idx, bias) -> matmul_nbits, or the reason why not.
Lowered lower_ms_matmul_nbits(const Ctx& c) {
  const Attributes& attrs = c.node.attrs;
  const std::int64_t bits = attrs.get_int("bits", 4), block = attrs.get_int("block_size", 0);
  const std::int64_t k = attrs.get_int("K", 0), n = attrs.get_int("N", 0);
  if (bits != 4) return reference(detail::str_cat("bits=", bits, " (matmul_nbits takes 4-bit codes)"));
  if (block < 16 || (block & (block - 1)) != 0 || k <= 0 || n <= 0) return reference("K, N or block_size invalid");
  if (!c.single_output() || c.node.inputs.size() < 3) return reference("not a MatMulNBits of one output");
  if (c.has(4)) return reference("g_idx reorders K into the blocks (act-order); the node kernel runs it");
  if (!is_matmul_float(c.type(0))) return reference("A is not float32, float16 or bfloat16");
  if (c.rank(0) >= 1) {
    const Dim& last = c.type(0)->shape.back();
    if (last.known() && last.value != k) return reference("A's last dim is not K");
  }
  const std::int64_t blocks = (k + block - 1) / block;
  if (!c.known(1) || c.type(1)->dtype != DType::kUInt8 || c.shape(1) != Ints{n, blocks, block / 2}) {
    return reference(detail::str_cat("B is not uint8 [", n, ", ", blocks, ", ", block / 2, "]"));
  }
  const ValueType* scales = c.type(2);
  if (!c.known(2) || (scales->dtype != DType::kFloat32 && scales->dtype != c.type(0)->dtype) ||
      (c.shape(2) != Ints{n * blocks} && c.shape(2) != Ints{n, blocks})) {
    return reference("scales are not [N * n_blocks] of A's float type");
  }
  if (c.has(3)) {
    if (!c.known(3) || c.type(3)->dtype != DType::kUInt8) {
      return reference("zero points are not packed uint8 (float zero points run on the node kernel)");
    }
    const std::int64_t bytes = n * ((blocks + 1) / 2);
    if (c.shape(3) != Ints{bytes} && c.shape(3) != Ints{n, (blocks + 1) / 2}) {
      return reference(detail::str_cat("zero points are not ", bytes, " packed bytes"));
    }
  }
  if (c.has(5) && (!c.known(5) || !is_matmul_float(c.type(5)) || c.shape(5) != Ints{n})) {
    return reference("bias is not a float [N]");
  }
  Attributes a;
  a.set("block_size", block);
  a.set("bits", std::int64_t{4});
  return registry("matmul_nbits", {0, 1, 2, c.has(3) ? 3 : -1, c.has(5) ? 5 : -1}, a);
}

// com.microsoft GroupQueryAttention -> group_query_attention (Note [Group query attention] in core/op_schemas_gqa.cpp)
// once its total_sequence_length is a constant: onnxruntime-genai's models compute it from Shape(attention_mask),
// which folds in a plan specialised to the inputs' shapes; a graph input ends a plan segment there (Note [Segmented
// plans]) and the next segment has it as a constant. What the registry op does not implement is refused here, at
// session creation (UnsupportedOperationError naming the attribute or input).
Lowered lower_group_query_attention(const Ctx& c) {
  gqa::check_supported(c.node);
  const Tensor* total = c.constant(gqa::kTotalSequenceLengthInput);
  if (total == nullptr) return reference("total_sequence_length is known only at run time");
  if (total->dtype() != DType::kInt32 || total->numel() != 1) {
    return reference("total_sequence_length is not one int32 value");
  }
  std::vector<int> inputs;
  for (std::size_t i : gqa::registry_inputs()) inputs.push_back(c.has(i) ? static_cast<int>(i) : -1);
  const std::int64_t value = *static_cast<const std::int32_t*>(total->data_ptr());
  return registry("group_query_attention", inputs, gqa::registry_attributes(c.node.attrs, value));
}

// com.xpuruntime MatMulNBits (the int4_weight_fusion pass): inputs and attributes are the registry op's.
Lowered lower_fused_matmul_nbits(const Ctx& c) {
  Attributes a;
  a.set("block_size", c.node.attrs.get_int("block_size", 0));
  a.set("bits", c.node.attrs.get_int("bits", 4));
  return registry("matmul_nbits", {0, 1, 2, c.has(3) ? 3 : -1, c.has(4) ? 4 : -1}, a);
}

const std::map<std::string, LowerFn>& onnx_table() {
  static const auto* table = new std::map<std::string, LowerFn>{
      {"Relu", [](const Ctx& c) { return lower_unary(c, "relu"); }},
      {"Sigmoid", [](const Ctx& c) { return lower_unary(c, "sigmoid"); }},
      {"Tanh", [](const Ctx& c) { return lower_unary(c, "tanh"); }},
      {"Exp", [](const Ctx& c) { return lower_unary(c, "exp"); }},
      {"Log", [](const Ctx& c) { return lower_unary(c, "log"); }},
      {"Sqrt", [](const Ctx& c) { return lower_unary(c, "sqrt"); }},
      {"Neg", [](const Ctx& c) { return lower_unary(c, "neg"); }},
      {"Abs", [](const Ctx& c) { return lower_unary(c, "abs"); }},
      {"Erf", [](const Ctx& c) { return lower_unary(c, "erf"); }},
      {"Reciprocal", [](const Ctx& c) { return lower_unary(c, "reciprocal"); }},
      {"Not", [](const Ctx& c) { return lower_unary(c, "logical_not"); }},
      {"Add", [](const Ctx& c) { return lower_binary(c, "add"); }},
      {"Sub", [](const Ctx& c) { return lower_binary(c, "sub"); }},
      {"Mul", [](const Ctx& c) { return lower_binary(c, "mul"); }},
      {"Div", [](const Ctx& c) { return lower_binary(c, "div"); }},
      {"Pow", [](const Ctx& c) { return lower_binary(c, "pow"); }},
      {"Max", [](const Ctx& c) { return lower_binary(c, "maximum"); }},
      {"Min", [](const Ctx& c) { return lower_binary(c, "minimum"); }},
      {"Equal", [](const Ctx& c) { return lower_binary(c, "equal"); }},
      {"Less", [](const Ctx& c) { return lower_binary(c, "less"); }},
      {"Greater", [](const Ctx& c) { return lower_binary(c, "greater"); }},
      {"Where", [](const Ctx&) { return registry("where", {0, 1, 2}); }},
      {"Softmax", [](const Ctx& c) { return lower_softmax(c, "softmax"); }},
      {"Gelu",
       [](const Ctx& c) {
         Attributes a;
         a.set("approximate", c.node.attrs.get_string("approximate", "none"));
         return registry("gelu", {0}, a);
       }},
      {"MatMul", lower_matmul},
      {"Gemm", lower_gemm},
      {"Conv", [](const Ctx& c) { return lower_conv(c, false); }},
      {"ConvTranspose", lower_conv_transpose},
      {"MaxPool", [](const Ctx& c) { return lower_pool(c, "max_pool2d"); }},
      {"AveragePool", [](const Ctx& c) { return lower_pool(c, "avg_pool2d"); }},
      {"GlobalAveragePool",
       [](const Ctx& c) { return c.rank(0) == 4 ? registry("global_avg_pool", {0}) : reference("not 4-D"); }},
      {"BatchNormalization",
       [](const Ctx& c) {
         if (!c.single_output() || c.node.attrs.get_int("training_mode", 0) != 0) return reference("training mode");
         Attributes a;
         a.set("epsilon", c.node.attrs.get_float("epsilon", 1e-5));
         return registry("batch_norm", {0, 1, 2, 3, 4}, a);
       }},
      {"LayerNormalization",
       [](const Ctx& c) {
         if (!c.single_output()) return reference("the Mean/InvStdDev outputs are used");
         if (c.node.attrs.get_int("stash_type", 1) != 1) return reference("stash_type != float");
         Attributes a;
         a.set("axis", c.node.attrs.get_int("axis", -1));
         a.set("epsilon", c.node.attrs.get_float("epsilon", 1e-5));
         return registry("layer_norm", {0, c.has(1) ? 1 : -1, c.has(2) ? 2 : -1}, a);
       }},
      {"ReduceSum", [](const Ctx& c) { return lower_reduce(c, "reduce_sum", 13); }},
      {"ReduceSumSquare", [](const Ctx& c) { return lower_reduce(c, "reduce_sum_square", 18); }},
      {"ReduceMean", [](const Ctx& c) { return lower_reduce(c, "reduce_mean", 18); }},
      {"ReduceMax", [](const Ctx& c) { return lower_reduce(c, "reduce_max", 18); }},
      {"ReduceMin", [](const Ctx& c) { return lower_reduce(c, "reduce_min", 18); }},
      {"Cast", lower_cast}, {"Reshape", lower_reshape}, {"Flatten", lower_flatten},
      {"Squeeze", lower_squeeze},
      {"Unsqueeze", lower_unsqueeze},
      {"Identity", lower_identity},
      {"Dropout", lower_identity},
      {"Transpose", lower_transpose},
      {"Concat", lower_concat},
      {"Slice", lower_slice},
      {"Gather", lower_gather},
      {"Expand", lower_expand},
      {"Clip", lower_clip},
      {"HardSigmoid", [](const Ctx& c) { return lower_float_pointwise(c, "hard_sigmoid", {"alpha", "beta"}); }},
      {"HardSwish", [](const Ctx& c) { return lower_float_pointwise(c, "hard_swish"); }},
      {"LeakyRelu", [](const Ctx& c) { return lower_float_pointwise(c, "leaky_relu", {"alpha"}); }},
      {"Elu", [](const Ctx& c) { return lower_float_pointwise(c, "elu", {"alpha"}); }},
      {"Softplus", [](const Ctx& c) { return lower_float_pointwise(c, "softplus"); }},
      {"Sin", [](const Ctx& c) { return lower_float_pointwise(c, "sin"); }},
      {"Cos", [](const Ctx& c) { return lower_float_pointwise(c, "cos"); }},
      {"Floor", [](const Ctx& c) { return lower_float_pointwise(c, "floor"); }},
      {"Ceil", [](const Ctx& c) { return lower_float_pointwise(c, "ceil"); }},
      {"Round", [](const Ctx& c) { return lower_float_pointwise(c, "round"); }},
      {"Sign", [](const Ctx& c) { return lower_float_pointwise(c, "sign"); }},
      {"Tan", [](const Ctx& c) { return lower_float_pointwise(c, "tan"); }},
      {"Asin", [](const Ctx& c) { return lower_float_pointwise(c, "asin"); }},
      {"Acos", [](const Ctx& c) { return lower_float_pointwise(c, "acos"); }},
      {"Atan", [](const Ctx& c) { return lower_float_pointwise(c, "atan"); }},
      {"Sinh", [](const Ctx& c) { return lower_float_pointwise(c, "sinh"); }},
      {"Cosh", [](const Ctx& c) { return lower_float_pointwise(c, "cosh"); }},
      {"Asinh", [](const Ctx& c) { return lower_float_pointwise(c, "asinh"); }},
      {"Acosh", [](const Ctx& c) { return lower_float_pointwise(c, "acosh"); }},
      {"Atanh", [](const Ctx& c) { return lower_float_pointwise(c, "atanh"); }},
      {"Softsign", [](const Ctx& c) { return lower_float_pointwise(c, "softsign"); }},
      {"Selu", [](const Ctx& c) { return lower_float_pointwise(c, "selu", {"alpha", "gamma"}); }},
      {"Celu", [](const Ctx& c) { return lower_float_pointwise(c, "celu", {"alpha"}); }},
      {"ThresholdedRelu", [](const Ctx& c) { return lower_float_pointwise(c, "thresholded_relu", {"alpha"}); }},
      {"Mish", [](const Ctx& c) { return lower_float_pointwise(c, "mish"); }},
      {"IsNaN", [](const Ctx& c) { return lower_float_pointwise(c, "is_nan"); }},
      {"IsInf",
       [](const Ctx& c) { return lower_float_pointwise(c, "is_inf", {"detect_positive", "detect_negative"}); }},
      {"And", [](const Ctx& c) { return lower_binary(c, "logical_and"); }},
      {"Or", [](const Ctx& c) { return lower_binary(c, "logical_or"); }},
      {"Xor", [](const Ctx& c) { return lower_binary(c, "logical_xor"); }},
      {"CumSum", lower_cum_sum},
      {"GatherElements",
       [](const Ctx& c) {
         Attributes a;
         a.set("axis", c.node.attrs.get_int("axis", 0));
         return registry("gather_elements", {0, 1}, a);
       }},
      {"GatherND",
       [](const Ctx& c) {
         Attributes a;
         a.set("batch_dims", c.node.attrs.get_int("batch_dims", 0));
         return registry("gather_nd", {0, 1}, a);
       }},
      {"Pad", lower_pad},
      {"Resize", lower_resize},
      {"Sum", [](const Ctx& c) { return lower_binary(c, "add"); }},
      {"LogSoftmax", [](const Ctx& c) { return lower_softmax(c, "log_softmax"); }},
      {"PRelu", [](const Ctx& c) { return c.opset < 7 ? reference("opset < 7 PRelu") : registry("prelu", {0, 1}); }},
      {"Mod",
       [](const Ctx& c) {
         Attributes a;
         a.set("fmod", c.node.attrs.get_int("fmod", 0));
         return registry("mod", {0, 1}, a);
       }},
      {"OneHot", lower_one_hot},
      {"Trilu", lower_trilu},
      {"Tile", lower_tile},
      {"ScatterND",
       [](const Ctx& c) {
         Attributes a;
         a.set("reduction", c.node.attrs.get_string("reduction", "none"));
         return registry("scatter_nd", {0, 1, 2}, a);
       }},
      {"ArgMax", [](const Ctx& c) { return lower_arg_reduce(c, "arg_max"); }},
      {"ArgMin", [](const Ctx& c) { return lower_arg_reduce(c, "arg_min"); }},
      {"TopK", lower_top_k},
      {"ReduceProd", [](const Ctx& c) { return lower_reduce(c, "reduce_prod", 18); }},
      {"QuantizeLinear", lower_quantize_linear},
      {"DequantizeLinear", lower_dequantize_linear},
      {"DynamicQuantizeLinear",
       [](const Ctx& c) {
         if (c.type(0) == nullptr || c.type(0)->dtype != DType::kFloat32) return reference("x is not float32");
         return registry("dynamic_quantize_linear", {0});
       }},
  };
  return *table;
}

const std::map<std::string, LowerFn>& xpurt_table() {
  static const auto* table = new std::map<std::string, LowerFn>{
      {"FusedConv", [](const Ctx& c) { return lower_conv(c, true); }},
      {"QLinear", [](const Ctx& c) { return lower_fused_quantized(c, "qlinear"); }},
      {"QConv", [](const Ctx& c) { return lower_fused_quantized(c, "qconv2d"); }},
      {"QLinearFp8",  // Note [Float8 quantized linear]
       [](const Ctx& c) { return registry("qlinear_fp8", {0, 1, 2, c.has(3) ? 3 : -1}, c.node.attrs); }},
      {"MatMulNBits", lower_fused_matmul_nbits},
      {"MaxPool", [](const Ctx& c) { return lower_pool(c, "max_pool2d"); }},
      {"AveragePool", [](const Ctx& c) { return lower_pool(c, "avg_pool2d"); }},
      {"GlobalAveragePool",
       [](const Ctx& c) {
         Attributes a;
         a.set("layout", c.node.attrs.get_string("layout", "NCHW"));
         return registry("global_avg_pool", {0}, a);
       }},
      {"Linear",
       [](const Ctx& c) {
         Attributes a;
         a.set("weight_layout", c.node.attrs.get_string("weight_layout", "nk"));
         a.set("activation", c.node.attrs.get_string("activation", "none"));
         return registry("linear", {0, 1, c.has(2) ? 2 : -1, c.has(3) ? 3 : -1}, a);
       }},
      {"Gelu",
       [](const Ctx& c) {
         Attributes a;
         a.set("approximate", c.node.attrs.get_string("approximate", "none"));
         return registry("gelu", {0}, a);
       }},
      {"LayerNormalization",
       [](const Ctx& c) {
         Attributes a;
         a.set("axis", c.node.attrs.get_int("axis", -1));
         a.set("epsilon", c.node.attrs.get_float("epsilon", 1e-5));
         // the quantized second output's (Note [Quantized layer norm output]), a per-row affine (Note [Per-row affine
         // of a layer norm])
         for (const char* name : {"quantized_dtype", "y_scale", "y_zero_point", "row_affine", "affine_run"}) {
           if (c.node.attrs.has(name)) a.set(name, c.node.attrs.values().at(name));
         }
         return registry("layer_norm",
                         {0, c.has(1) ? 1 : -1, c.has(2) ? 2 : -1, c.has(3) ? 3 : -1, c.has(4) ? 4 : -1}, a);
       }},
      {"FusedElementwise",
       [](const Ctx& c) {
         // Made by the elementwise_fusion pass (Note [Fused elementwise programs]).
         const Attributes a = fused::registry_attributes(c.node.attrs);
         std::vector<int> inputs;
         for (std::size_t i = 0; i < c.node.inputs.size(); ++i) inputs.push_back(static_cast<int>(i));
         return registry("fused_elementwise", inputs, a);
       }},
      {"AllReduce",
       [](const Ctx& c) {
         // Made by the tensor_parallel pass after each row-parallel GEMM.
         Attributes a;
         a.set("comm", c.node.attrs.get_int("comm", -1));
         a.set("op", c.node.attrs.get_string("op", "sum"));
         return registry("all_reduce", {0}, a);
       }},
      // Note [Segmented plans] (capture_plan.h): the bounded forms made where a plan ends at a data-dependent node.
      {"NonZero", [](const Ctx&) { return registry("non_zero", {0}); }},
      {"NonMaxSuppression",
       [](const Ctx& c) {
         Attributes a;
         for (const char* name : {"center_point_box", "max_output_boxes_per_class"}) {
           a.set(name, c.node.attrs.get_int(name, 0));
         }
         a.set("iou_threshold", c.node.attrs.get_float("iou_threshold", 0.0));
         if (c.node.attrs.has("score_threshold")) {
           a.set("score_threshold", c.node.attrs.get_float("score_threshold", 0.0));
         }
         return registry("non_max_suppression", {0, 1}, a);
       }},
      {"Attention",
       [](const Ctx& c) {
         Attributes a;
         a.set("scale", c.node.attrs.get_float("scale", 0.0));
         a.set("causal", c.node.attrs.get_int("causal", 0));
         AttentionLayout::forward(c.node.attrs, &a);  // Note [Attention layouts]
         forward_fully_masked_rows(c.node.attrs, &a);  // Note [Fully masked attention rows]
         return registry("attention", {0, 1, 2, c.has(3) ? 3 : -1}, a);
       }},
  };
  return *table;
}

}  // namespace

Lowered lower_quantized_onnx(const Node& node, std::int64_t opset, const std::vector<const ValueType*>& types,
                             const std::vector<const Tensor*>& constants) {
  const Ctx c{node, opset, types, constants};
  if (!node.domain.empty() && node.domain != "ai.onnx") return reference("not an ONNX operator");
  if (node.op_type == "QLinearMatMul") return lower_quantized_matmul(c, false);
  if (node.op_type == "MatMulInteger") return lower_quantized_matmul(c, true);
  if (node.op_type == "QLinearConv") return lower_quantized_conv(c, false);
  if (node.op_type == "ConvInteger") return lower_quantized_conv(c, true);
  return reference("not a quantized ONNX operator");
}

Lowered lower_matmul_nbits(const Node& node, const std::vector<const ValueType*>& types) {
  const std::vector<const Tensor*> constants;
  const Ctx c{node, 1, types, constants};
  if (node.domain != "com.microsoft" || node.op_type != "MatMulNBits") return reference("not a MatMulNBits");
  return lower_ms_matmul_nbits(c);
}

Lowered lower_node(const Node& node, std::int64_t opset, const std::vector<const ValueType*>& types,
                   const std::vector<const Tensor*>& constants) {
  const Ctx c{node, opset, types, constants};
  if (node.domain == "com.microsoft" && node.op_type == "GroupQueryAttention") return lower_group_query_attention(c);
  if (node.domain == "com.microsoft" && node.op_type == "MatMulNBits") {
    // The int4_weight_fusion pass turns the ones matmul_nbits takes into com.xpuruntime nodes; this one it left.
    const Lowered lowered = lower_ms_matmul_nbits(c);
    return reference(lowered.kind == Lowered::Kind::kReference
                         ? lowered.reason
                         : "int4_weight_fusion did not run (disabled, or no matmul_nbits kernel on the device)");
  }
  for (const ValueType* vt : types) {
    if (vt != nullptr && !vt->is_tensor()) {
      return reference(std::string("it reads a ") + value_kind_name(vt->kind) +
                       " (sequences and optionals run in the reference library)");
    }
  }
  const std::map<std::string, LowerFn>* table = nullptr;
  if (node.domain.empty() || node.domain == "ai.onnx") table = &onnx_table();
  if (node.domain == kXpurtDomain) table = &xpurt_table();
  if (table == nullptr) return reference("domain '" + node.domain + "' has no registry lowering");
  auto it = table->find(node.op_type);
  if (it == table->end()) return reference("no registry op implements " + node.op_type);
  Lowered lowered = it->second(c);
  // A registry op's input the node does not have (a malformed node, found by fuzz_model: a Conv without its weight
  // read past the node's inputs): the reference library reports it with ONNX's semantics.
  for (int idx : lowered.inputs) {
    if (idx >= 0 && !node.has_input(static_cast<std::size_t>(idx))) {
      return reference(detail::str_cat("input ", idx, " of ", node.op_type, " is missing"));
    }
    // float8 and int4 (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h): no registry op but quantize_linear and
    // dequantize_linear (Note [Quantize registry ops] in core/quantize_ops.h) and qlinear_fp8 (Note [Float8 quantized
    // linear]) take them (the others' schemas refuse them); the node kernels move them (Transpose, Concat, Slice,
    // Gather, ...) or say why not.
    const ValueType* vt = idx >= 0 ? c.type(static_cast<std::size_t>(idx)) : nullptr;
    const bool takes_low_bit =
        lowered.op == "quantize_linear" || lowered.op == "dequantize_linear" || lowered.op == "qlinear_fp8";
    if (lowered.kind == Lowered::Kind::kRegistry && !takes_low_bit && vt != nullptr && is_low_bit_dtype(vt->dtype)) {
      return reference(detail::str_cat("input ", idx, " is ", dtype_name(vt->dtype), ", which no registry op takes"));
    }
  }
  return lowered;
}

}  // namespace xpuruntime::runtime
