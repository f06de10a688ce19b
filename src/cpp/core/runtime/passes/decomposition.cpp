// op_decomposition: ONNX ops rewritten onto ops the registry runs, so that they run on every device without a kernel
// of their own (Note [Decompositions]):
//   Split (static input shape, constant split sizes or num_outputs) -> one Slice per output;
//   1-D Conv (constant weight) -> Unsqueeze + 2-D Conv (kernel height 1) + Squeeze: the Unsqueeze and Squeeze are
//     views, and the 2-D Conv takes the conv passes (bias, activation, cuDNN);
//   LayerNormalization whose constant scale or bias has another float type than X (PyTorch's TorchScript exporter
//     writes float32 statistics beside float16 parameters) -> the same node with the constants in X's type.
#include <cstring>

#include "core/runtime/passes.h"
#include "core/runtime/passes/pass_utils.h"

namespace xpuruntime::passes {
namespace {

using namespace internal;
using Ints = std::vector<std::int64_t>;

Tensor int64_tensor(const Ints& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

// The sizes a Split node cuts `dim` into, or empty when they are not known while the plan is built.
Ints split_sizes(const Graph& g, const Node& n, std::int64_t opset, std::int64_t dim) {
  Ints sizes;
  if (opset < 13) {
    sizes = n.attrs.get_ints("split", {});
  } else if (n.has_input(1)) {
    const Tensor* t = constant(g, n.inputs[1]);
    if (t == nullptr || t->dtype() != DType::kInt64) return {};
    const auto* p = static_cast<const std::int64_t*>(t->data_ptr());
    sizes.assign(p, p + t->numel());
  }
  const auto outputs = static_cast<std::int64_t>(n.outputs.size());
  if (sizes.empty()) {
    // Equal parts; from opset 18 `num_outputs` may leave a smaller last part (ceil division).
    const std::int64_t parts = opset >= 18 ? n.attrs.get_int("num_outputs", outputs) : outputs;
    if (parts <= 0 || parts != outputs) return {};
    const std::int64_t each = opset >= 18 ? (dim + parts - 1) / parts : dim / parts;
    if (opset < 18 && dim % parts != 0) return {};
    for (std::int64_t k = 0; k < parts; ++k) sizes.push_back(std::max<std::int64_t>(0, std::min(each, dim - k * each)));
  }
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  if (total != dim || static_cast<std::int64_t>(sizes.size()) != outputs) return {};
  return sizes;
}

// A node of `op_type` taking `axes` as an attribute (before opset `input_since`) or a constant input.
Node with_axes(Graph& g, const std::string& op_type, const std::string& name, const std::string& in,
               const std::string& out, const Ints& axes, std::int64_t opset, std::int64_t input_since) {
  Node n;
  n.op_type = op_type;
  n.name = g.unique_name(name);
  n.inputs = {in};
  n.outputs = {out};
  if (opset < input_since) {
    n.attrs.set("axes", axes);
  } else {
    n.inputs.push_back(add_constant(g, n.name + "_axes", int64_tensor(axes)));
  }
  return n;
}

}  // namespace

PassResult op_decomposition(Graph& g, const PassContext&) {
  PassResult result{"op_decomposition", 0, {}};
  const std::int64_t opset = g.opset("");
  Rewriter rewriter(g);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node n = g.nodes[i];
    if (!n.domain.empty() || rewriter.taken(i)) continue;
    if (n.op_type == "Split" && !n.inputs.empty()) {
      const auto shape = static_shape(g, n.inputs[0]);
      if (!shape) continue;
      const auto rank = static_cast<std::int64_t>(shape->size());
      std::int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis >= rank) continue;
      const Ints sizes = split_sizes(g, n, opset, (*shape)[axis]);
      if (sizes.empty()) continue;
      std::vector<Node> slices;
      std::int64_t start = 0;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        if (n.outputs[k].empty()) {
          start += sizes[k];
          continue;
        }
        Node s;
        s.op_type = "Slice";
        s.name = g.unique_name(n.name + "_part" + std::to_string(k));
        s.outputs = {n.outputs[k]};
        s.inputs = {n.inputs[0]};
        if (opset < 10) {
          s.attrs.set("starts", Ints{start});
          s.attrs.set("ends", Ints{start + sizes[k]});
          s.attrs.set("axes", Ints{axis});
        } else {
          s.inputs.push_back(add_constant(g, s.name + "_starts", int64_tensor({start})));
          s.inputs.push_back(add_constant(g, s.name + "_ends", int64_tensor({start + sizes[k]})));
          s.inputs.push_back(add_constant(g, s.name + "_axes", int64_tensor({axis})));
        }
        start += sizes[k];
        slices.push_back(std::move(s));
      }
      rewriter.replace({i}, std::move(slices),
                       describe(n) + " -> " + std::to_string(sizes.size()) + " Slice(s) along axis " +
                           std::to_string(axis));
    } else if (n.op_type == "Conv" && n.inputs.size() >= 2) {
      const Tensor* w = constant(g, n.inputs[1]);
      const auto x = value_type(g, n.inputs[0]);
      if (w == nullptr || w->dim() != 3 || !x || !x->has_shape || x->shape.size() != 3) continue;
      if (n.has_input(2) && !is_constant(g, n.inputs[2])) continue;
      const std::string auto_pad = n.attrs.get_string("auto_pad", "NOTSET");
      if (auto_pad != "NOTSET" && auto_pad != "VALID") continue;
      const Ints pads = n.attrs.get_ints("pads", {0, 0});
      if (pads.size() != 2) continue;
      Node conv = n;
      conv.name = n.name;
      const std::string x4 = g.unique_name(n.inputs[0] + "_2d");
      const std::string y4 = g.unique_name(n.outputs[0] + "_2d");
      Node unsqueeze = with_axes(g, "Unsqueeze", n.name + "_unsqueeze", n.inputs[0], x4, {2}, opset, 13);
      const Tensor wc = w->contiguous();
      Tensor w4 = Tensor::empty({wc.shape()[0], wc.shape()[1], 1, wc.shape()[2]}, wc.dtype());
      std::memcpy(w4.data_ptr(), wc.data_ptr(), static_cast<std::size_t>(wc.nbytes()));
      conv.inputs[0] = x4;
      conv.inputs[1] = add_constant(g, n.name + "_weight_2d", w4);
      conv.outputs = {y4};
      conv.attrs.set("kernel_shape", Ints{1, w->shape()[2]});
      conv.attrs.set("strides", Ints{1, n.attrs.get_ints("strides", {1})[0]});
      conv.attrs.set("dilations", Ints{1, n.attrs.get_ints("dilations", {1})[0]});
      conv.attrs.set("pads", Ints{0, pads[0], 0, pads[1]});
      if (auto_pad != "NOTSET") conv.attrs.set("auto_pad", auto_pad);
      Node squeeze = with_axes(g, "Squeeze", n.name + "_squeeze", y4, n.outputs[0], {2}, opset, 13);
      ValueType t4 = *x;
      t4.shape.insert(t4.shape.begin() + 2, Dim(std::int64_t{1}));
      g.types[x4] = t4;
      rewriter.replace({i}, {unsqueeze, conv, squeeze}, describe(n) + " (1-D) -> Unsqueeze + 2-D Conv + Squeeze");
    } else if (n.op_type == "Clip" && opset >= 11 && ((n.has_input(1) && !is_constant(g, n.inputs[1])) ||
                                                        (n.has_input(2) && !is_constant(g, n.inputs[2])))) {
      // Bounds computed at run time (T5's fp16 clamp to finfo.max, or finfo.max - 1000 after an overflow):
      // Max(x, min) then Min(., max), the same values (NaN kept; min > max gives max, like np.clip).
      std::vector<Node> parts;
      std::string current = n.inputs[0];
      for (std::size_t k = 1; k < 3; ++k) {
        if (!n.has_input(k)) continue;
        const bool last = k == 2 || !n.has_input(2);
        Node bound;
        bound.op_type = k == 1 ? "Max" : "Min";
        bound.name = g.unique_name(n.name + (k == 1 ? "_min" : "_max"));
        bound.inputs = {current, n.inputs[k]};
        bound.outputs = {last ? n.outputs[0] : g.unique_name(n.outputs[0] + "_lower")};
        if (!last) {
          if (const ValueType* t = g.type(n.inputs[0])) g.types[bound.outputs[0]] = *t;
        }
        current = bound.outputs[0];
        parts.push_back(std::move(bound));
      }
      rewriter.replace({i}, std::move(parts), describe(n) + " with run-time bounds -> Max/Min");
    } else if (n.op_type == "LayerNormalization" && n.inputs.size() >= 2) {
      const auto x = value_dtype(g, n.inputs[0]);
      if (!x || !is_fusable_float(*x)) continue;
      Node fixed = n;
      bool changed = false;
      for (std::size_t k = 1; k < n.inputs.size() && k < 3; ++k) {
        const Tensor* c = n.has_input(k) ? constant(g, n.inputs[k]) : nullptr;
        if (c == nullptr || c->dtype() == *x || !is_fusable_float(c->dtype())) continue;
        fixed.inputs[k] = add_constant(g, n.inputs[k] + "_" + std::string(dtype_name(*x)),
                                       from_doubles(c->shape(), *x, to_doubles(*c)));
        changed = true;
      }
      if (changed) {
        rewriter.replace({i}, {fixed}, describe(n) + ": scale/bias converted to " + std::string(dtype_name(*x)));
      }
    }
  }
  rewriter.apply(result);
  return result;
}

}  // namespace xpuruntime::passes
