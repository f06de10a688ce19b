// nhwc_layout: channels-last convolutions and pools on CUDA (see passes.h, docs/native_engine.md).
//
// Note [Channels last]
// cuDNN's tensor-core convolutions work on NHWC data. Given NCHW float16/bfloat16 tensors it converts x and the
// filter to NHWC and y back, on every call: for ResNet-50 at batch 1 on an H100 those conversions were 160 of the
// run's 218 kernels and 40% of its GPU time. This pass makes the convolutions channels-last instead: every
// FusedConv whose channel counts suit tensor cores (multiples of 8, one group) gets layout=NHWC and a weight
// permuted to [O, kh, kw, C] once, here; a pool reading a channels-last value becomes its com.xpuruntime twin
// with layout=NHWC. Values cross between the layouts through Transpose nodes: one into NHWC where a converted node
// reads a value produced in NCHW (the model's input, say), one back to NCHW after each converted node. The way
// back is only kept where something in NCHW reads it: a chain of converted nodes passes its NHWC values directly,
// so a ResNet runs channels-last from its first converted conv to the global pool, whose [N, 1, 1, C] output is
// NCHW [N, C, 1, 1] by a Reshape (a view). Runs only for CUDA plans (on the CPU the cpu kernels would permute
// through NCHW, which costs).
#include <cstring>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/runtime/passes.h"
#include "core/runtime/passes/pass_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::passes {

using namespace internal;  // NOLINT(google-build-using-namespace): the passes' own helpers

namespace {

bool is_half_float(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// The 4-D shape of `value` when it is known, static and of a 16-bit float type.
std::optional<std::vector<std::int64_t>> half_4d_shape(const Graph& g, const std::string& value) {
  auto type = value_type(g, value);
  if (!type || !is_half_float(type->dtype)) return std::nullopt;
  auto shape = static_shape(g, value);
  if (!shape || shape->size() != 4) return std::nullopt;
  return shape;
}

// A copy of the 4-D constant `w` [O, I, kh, kw] as [O, kh, kw, I].
Tensor ohwi_from_oihw(const Tensor& w) {
  const auto& s = w.shape();
  const std::int64_t o = s[0], in = s[1], kh = s[2], kw = s[3];
  const Tensor src = w.contiguous();
  Tensor dst = Tensor::empty({o, kh, kw, in}, w.dtype());
  const std::size_t es = dtype_size(w.dtype());
  const auto* from = static_cast<const unsigned char*>(src.data_ptr());
  auto* to = static_cast<unsigned char*>(dst.data_ptr());
  for (std::int64_t a = 0; a < o; ++a) {
    for (std::int64_t c = 0; c < in; ++c) {
      for (std::int64_t i = 0; i < kh; ++i) {
        for (std::int64_t j = 0; j < kw; ++j) {
          const std::int64_t source = ((a * in + c) * kh + i) * kw + j;
          const std::int64_t target = ((a * kh + i) * kw + j) * in + c;
          std::memcpy(to + target * es, from + source * es, es);
        }
      }
    }
  }
  return dst;
}

// Whether FusedConv `n` is worth running channels-last (Note [Channels last]).
bool convertible_conv(const Graph& g, const Node& n) {
  if (n.domain != kXpurtDomain || n.op_type != "FusedConv" || n.outputs.size() != 1) return false;
  if (n.attrs.get_string("layout", "NCHW") != "NCHW" || n.attrs.get_int("group", 1) != 1) return false;
  const Tensor* w = n.inputs.size() > 1 ? constant(g, n.inputs[1]) : nullptr;
  auto x = half_4d_shape(g, n.inputs[0]);
  if (w == nullptr || w->dim() != 4 || !x || w->dtype() != *value_dtype(g, n.inputs[0])) return false;
  return (*x)[1] % 8 == 0 && w->shape()[0] % 8 == 0;
}

// The ONNX pool `n` as a channels-last com.xpuruntime node reading `x` (NHWC) into `y`; false when its
// attributes are outside what the registry pools take (auto_pad SAME_*, storage order, the Indices output).
bool nhwc_pool(const Node& n, const std::string& x, const std::string& y, Node* out) {
  const bool global = is_onnx(n, "GlobalAveragePool");
  const bool max = is_onnx(n, "MaxPool");
  if (!global && !max && !is_onnx(n, "AveragePool")) return false;
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) return false;
  out->name = n.name;
  out->domain = kXpurtDomain;
  out->op_type = n.op_type;
  out->inputs = {x};
  out->outputs = {y};
  out->attrs.set("layout", std::string("NHWC"));
  if (global) return true;
  const std::string auto_pad = n.attrs.get_string("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID") return false;
  if (n.attrs.get_int("storage_order", 0) != 0) return false;
  const auto kernel = n.attrs.get_ints("kernel_shape", {});
  if (kernel.size() != 2) return false;
  const auto pads = auto_pad == "VALID" ? std::vector<std::int64_t>{0, 0, 0, 0}
                                        : n.attrs.get_ints("pads", {0, 0, 0, 0});
  if (pads.size() != 4) return false;
  out->attrs.set("kernel_shape", kernel);
  out->attrs.set("strides", n.attrs.get_ints("strides", {1, 1}));
  out->attrs.set("pads", pads);
  out->attrs.set("ceil_mode", n.attrs.get_int("ceil_mode", 0));
  if (max) {
    out->attrs.set("dilations", n.attrs.get_ints("dilations", {1, 1}));
  } else {
    if (n.attrs.get_ints("dilations", {1, 1}) != std::vector<std::int64_t>{1, 1}) return false;
    out->attrs.set("count_include_pad", n.attrs.get_int("count_include_pad", 0));
  }
  return true;
}

Node transpose_node(const std::string& name, const std::string& in, const std::string& out,
                    const std::vector<std::int64_t>& perm) {
  Node t;
  t.name = name;
  t.op_type = "Transpose";
  t.inputs = {in};
  t.outputs = {out};
  t.attrs.set("perm", perm);
  return t;
}

}  // namespace

PassResult nhwc_layout(Graph& g, const PassContext& ctx) {
  PassResult result{"nhwc_layout", 0, {}};
  if (!ctx.device.is_cuda()) return result;
  std::unordered_map<std::string, std::string> nhwc_of;  // an NCHW value -> its channels-last twin
  std::set<std::string> back_values;                     // outputs of the Transposes back to NCHW made here
  std::set<std::string> replaced_weights;
  std::set<std::string> shape_constants;  // of the Reshapes back to NCHW
  std::set<std::string> taken_names;                     // names made here (not in g until the end)
  const auto fresh = [&](const std::string& hint) {
    std::string name = g.unique_name(hint);
    for (int k = 2; taken_names.count(name) != 0; ++k) name = g.unique_name(detail::str_cat(hint, "_", k));
    taken_names.insert(name);
    return name;
  };
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() * 2);
  // The channels-last twin of `value`, made by a Transpose into NHWC when it has none yet.
  const auto to_nhwc = [&](const std::string& value) {
    auto it = nhwc_of.find(value);
    if (it != nhwc_of.end()) return it->second;
    const std::string twin = fresh(value + "_nhwc");
    nodes.push_back(transpose_node(fresh(value + "_to_nhwc"), value, twin, {0, 2, 3, 1}));
    nhwc_of[value] = twin;
    return twin;
  };
  // After a converted node wrote `twin`: the NCHW `value` back, for the readers that stay NCHW.
  const auto back_to_nchw = [&](const std::string& value, const std::string& twin,
                                const std::vector<std::int64_t>& nchw_shape) {
    if (nchw_shape[2] == 1 && nchw_shape[3] == 1) {
      // [N, 1, 1, C] and [N, C, 1, 1] have the same memory order: a Reshape (a view).
      Tensor shape = Tensor::empty({4}, DType::kInt64);
      std::memcpy(shape.data_ptr(), nchw_shape.data(), 4 * sizeof(std::int64_t));
      Node reshape;
      reshape.name = fresh(value + "_to_nchw");
      reshape.op_type = "Reshape";
      reshape.inputs = {twin, add_constant(g, value + "_nchw_shape", shape)};
      shape_constants.insert(reshape.inputs[1]);
      reshape.outputs = {value};
      nodes.push_back(std::move(reshape));
    } else {
      nodes.push_back(transpose_node(fresh(value + "_to_nchw"), twin, value, {0, 3, 1, 2}));
    }
    nhwc_of[value] = twin;
    back_values.insert(value);
  };

  // Copies, not moves: fresh() asks the graph for unused names, so every node must stay in g.nodes until the end.
  for (const Node& n : g.nodes) {
    if (convertible_conv(g, n)) {
      const auto y_shape = half_4d_shape(g, n.outputs[0]);
      if (!y_shape) {
        nodes.push_back(n);
        continue;
      }
      Node conv = n;
      conv.inputs[0] = to_nhwc(n.inputs[0]);
      replaced_weights.insert(n.inputs[1]);
      conv.inputs[1] = add_constant(g, n.inputs[1] + "_ohwi", ohwi_from_oihw(*constant(g, n.inputs[1])));
      if (n.inputs.size() > 3 && !n.inputs[3].empty()) conv.inputs[3] = to_nhwc(n.inputs[3]);
      const std::string twin = fresh(n.outputs[0] + "_nhwc");
      conv.outputs = {twin};
      conv.attrs.set("layout", std::string("NHWC"));
      result.notes.push_back(detail::str_cat(describe(n), " -> NHWC"));
      nodes.push_back(std::move(conv));
      back_to_nchw(n.outputs[0], twin, *y_shape);
      ++result.rewrites;
      continue;
    }
    // A pool whose input is already channels-last follows it.
    if (!n.inputs.empty() && nhwc_of.count(n.inputs[0]) != 0 && !n.outputs.empty()) {
      const auto y_shape = half_4d_shape(g, n.outputs[0]);
      Node pool;
      const std::string twin = y_shape ? fresh(n.outputs[0] + "_nhwc") : std::string();
      if (y_shape && nhwc_pool(n, nhwc_of[n.inputs[0]], twin, &pool)) {
        result.notes.push_back(detail::str_cat(describe(n), " -> NHWC"));
        nodes.push_back(std::move(pool));
        back_to_nchw(n.outputs[0], twin, *y_shape);
        ++result.rewrites;
        continue;
      }
    }
    nodes.push_back(n);
  }
  g.nodes = std::move(nodes);
  if (result.rewrites == 0) return result;
  // Drop the ways back to NCHW that nothing reads (Note [Channels last]).
  const Uses uses(g);
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    if (n.outputs.size() == 1 && back_values.count(n.outputs[0]) != 0 && uses.unused(n.outputs[0])) continue;
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
  replaced_weights.insert(shape_constants.begin(), shape_constants.end());
  remove_unused_constants(g, replaced_weights);
  return result;
}

}  // namespace xpuruntime::passes
