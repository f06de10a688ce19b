// The cpu kernels of the ONNX ops beyond the core set (clip, hard_sigmoid, hard_swish, leaky_relu, elu, softplus,
// sin, cos, floor, ceil, round, sign, is_nan, is_inf, logical_and/or/xor, cum_sum, gather_elements, gather_nd,
// pad, resize, log_softmax, prelu, mod, one_hot, trilu, tile, scatter_nd, arg_max, arg_min, top_k, reduce_prod) and
// of the int32/int64 reductions: each runs the cpu backend's node kernel of the ONNX operator (its ONNX reference
// implementation, src/cpp/backends/cpu/onnx/, checked against ONNX's backend test data) on the launch's tensors,
// through onnx_ref::run_node (core/node_kernels.h); the float32 activations among them run in vectors instead (Note
// [Vectorised ELU, Softplus and Mish] in cpu_isa_baseline.cpp).
//
// Note [Registry ops through the ONNX reference library]
// A registry op's attributes keep ONNX's names; what ONNX takes as inputs (Clip's min/max, Pad's pads and value,
// CumSum's axis, Resize's scales or sizes) the registry op takes as attributes, fixed when the plan is built, and
// the adapter turns them back into constant inputs. So the cpu kernel is the ONNX operator's node kernel itself,
// and the conformance suite checks both it and the GPU kernels against NumPy.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"
#include "core/node_kernels.h"
#include "core/scalar.h"
#include "xpuruntime/graph.h"

namespace xpuruntime::cpu {

namespace {

// The opset the adapters speak: every op's current form (inputs instead of the older attributes).
constexpr std::int64_t kOpset = 21;

// A 0-d constant input of `dtype` holding `value` (converted as the graph passes convert constants).
Tensor scalar_of(double value, DType dtype) { return detail::from_doubles({}, dtype, {value}); }

// A 0-d int64 constant input holding `value` exactly (through a double, 2^63 - 1 would not survive).
Tensor int64_scalar(std::int64_t value) {
  Tensor t = Tensor::empty({}, DType::kInt64);
  *static_cast<std::int64_t*>(t.data_ptr()) = value;
  return t;
}

Tensor int64_vector(const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

// Note [Reference kernels write into the launch's outputs]
// The library's kernels allocate their outputs (OpContext::allocate_output); run through run_node_into, an output
// whose shape and dtype the launch's output has is that tensor, so the kernel writes the plan's buffer directly: no
// fresh allocation per run (large ones are new pages from the system: a page fault per 4 KiB, half of the time of
// FCN's 28 -> 224 Resize, 2026-12-03) and no copy after it. A launch output that shares memory with an input (the
// memory plan reusing a dead input's buffer) is not given to the kernel, which may still read the input after writing
// some outputs; an output the kernel made elsewhere (an input passed through) is copied as before.
//
// The library's node of `op_type` with `attrs` for `inputs` (undefined tensors: absent optional inputs) and the
// launch's outputs.
Node reference_node(const KernelLaunch& launch, const std::string& op_type, Attributes attrs,
                    const std::vector<Tensor>& inputs) {
  Node node;
  node.op_type = op_type;
  node.name = launch.desc->op;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    node.inputs.push_back(inputs[k].defined() ? detail::str_cat("input", k) : std::string());
  }
  for (std::size_t k = 0; k < launch.desc->outputs.size(); ++k) node.outputs.push_back(detail::str_cat("y", k));
  node.attrs = std::move(attrs);
  return node;
}

// Runs the library's `op_type` with `attrs` on `inputs` (undefined tensors: absent optional inputs) into the
// launch's outputs.
void run_reference(const KernelLaunch& launch, const std::string& op_type, Attributes attrs,
                   const std::vector<Tensor>& inputs) {
  const Node node = reference_node(launch, op_type, std::move(attrs), inputs);
  // The launch's outputs as destinations (Note [Reference kernels write into the launch's outputs]).
  std::vector<Tensor> into;
  for (std::size_t k = 0; k < launch.desc->outputs.size(); ++k) into.push_back(launch.output(k));
  const std::vector<Tensor> outputs = onnx_ref::run_node_into(node, kOpset, inputs, into);
  XPURT_INTERNAL_ASSERT(outputs.size() == launch.desc->outputs.size(), "the reference library's ", op_type, " made ",
                        outputs.size(), " outputs, the schema of '", launch.desc->op, "' has ",
                        launch.desc->outputs.size());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    Tensor& y = launch.output(k);
    XPURT_INTERNAL_ASSERT(outputs[k].dtype() == y.dtype() && outputs[k].shape() == y.shape(),
                          "the reference library's ", op_type, " disagrees with the schema of '", launch.desc->op,
                          "' on output ", k);
    if (y.nbytes() == 0 || outputs[k].data_ptr() == y.data_ptr()) continue;  // written in place
    const Tensor result = outputs[k].contiguous();
    std::memcpy(y.data_ptr(), result.data_ptr(), static_cast<std::size_t>(y.nbytes()));
  }
}

// Note [Elementwise reference ops in chunks]
// The unary elementwise ops that run the ONNX reference library's kernel (Elu, Softplus, Mish, the trigonometric
// ones...) ran it on one thread over the whole tensor: Elu of [1, 64, 112, 112] took 8x ONNX Runtime's time, Mish
// 6.5x (2026-12-07). Each element's value depends on that element alone, so the tensor is cut into chunks of at least
// kElementwiseChunk elements, each run through the same kernel on a 1-D view of its input and output on the pool's
// threads: the reference's bits, the threads' share of the time. The float32 activations among them (Elu, Selu, Celu,
// Softplus, Mish, LeakyRelu, HardSigmoid, HardSwish, Softsign, ThresholdedRelu) run in vectors instead
// (run_vector_activation; Note [Vectorised ELU, Softplus and Mish] in cpu_isa_baseline.cpp).
constexpr std::int64_t kElementwiseChunk = std::int64_t{1} << 16;

// The fewest elements of a thread's share of a vectorised activation (run_vector_activation): as the unary
// elementwise ops of cpu_elementwise.cpp.
constexpr std::int64_t kActivationGrain = 32768;

void run_reference_elementwise(const KernelLaunch& launch, const std::string& op_type, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const std::int64_t n = x.numel();
  const bool chunked = launch.num_inputs == 1 && launch.desc->outputs.size() == 1 && x.is_contiguous() &&
                       y.is_contiguous() && y.numel() == n && context.threads > 1 && n >= 2 * kElementwiseChunk &&
                       x.data_ptr() != y.data_ptr();
  if (!chunked) {
    run_reference(launch, op_type, launch.desc->attrs, {x});
    return;
  }
  const Node node = reference_node(launch, op_type, launch.desc->attrs, {x});
  const std::int64_t chunks = (n + kElementwiseChunk - 1) / kElementwiseChunk;
  const auto xs = static_cast<std::int64_t>(x.element_size()), ys = static_cast<std::int64_t>(y.element_size());
  parallel_for(chunks, context.threads, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t c = begin; c < end; ++c) {
      const std::int64_t first = c * kElementwiseChunk, count = std::min(kElementwiseChunk, n - first);
      const Tensor xc = Tensor::from_blob(static_cast<char*>(x.data_ptr()) + first * xs, {count}, {}, x.dtype(),
                                          x.device(), x.storage());
      Tensor yc = Tensor::from_blob(static_cast<char*>(y.data_ptr()) + first * ys, {count}, {}, y.dtype(), y.device(),
                                    y.storage());
      const std::vector<Tensor> out = onnx_ref::run_node_into(node, kOpset, {xc}, {yc});
      XPURT_INTERNAL_ASSERT(out.size() == 1 && out[0].data_ptr() == yc.data_ptr(), "the reference library's ", op_type,
                            " did not write the chunk in place");
    }
  });
}

// The activations IsaKernels::activation_f32 computes for float32 (Note [Vectorised ELU, Softplus and Mish] in
// cpu_isa_baseline.cpp), by ONNX op type; nullopt for the other ops.
std::optional<VectorActivation> vector_activation_of(const std::string& op_type) {
  static const std::pair<const char*, VectorActivation> kVectorised[] = {
      {"Elu", VectorActivation::kElu},
      {"Selu", VectorActivation::kSelu},
      {"Celu", VectorActivation::kCelu},
      {"Softplus", VectorActivation::kSoftplus},
      {"Mish", VectorActivation::kMish},
      {"LeakyRelu", VectorActivation::kLeakyRelu},
      {"HardSigmoid", VectorActivation::kHardSigmoid},
      {"HardSwish", VectorActivation::kHardSwish},
      {"Softsign", VectorActivation::kSoftsign},
      {"ThresholdedRelu", VectorActivation::kThresholdedRelu},
  };
  for (const auto& [name, op] : kVectorised) {
    if (op_type == name) return op;
  }
  return std::nullopt;
}

// `op` with the launch's attributes (the ONNX defaults where absent), rounded to float as the reference's float kernel
// rounds them.
ActivationParams activation_params(VectorActivation op, const Attributes& attrs) {
  ActivationParams act;
  act.op = op;
  switch (op) {
    case VectorActivation::kElu:
    case VectorActivation::kCelu:
    case VectorActivation::kThresholdedRelu: act.alpha = static_cast<float>(attrs.get_float("alpha", 1.0)); break;
    case VectorActivation::kSelu: {
      const double gamma = attrs.get_float("gamma", 1.05070102214813232421875);
      act.alpha = static_cast<float>(gamma * attrs.get_float("alpha", 1.67326319217681884765625));
      act.gamma = static_cast<float>(gamma);
      break;
    }
    case VectorActivation::kLeakyRelu: act.alpha = static_cast<float>(attrs.get_float("alpha", 0.01)); break;
    case VectorActivation::kHardSigmoid:
      act.alpha = static_cast<float>(attrs.get_float("alpha", 0.2));
      act.beta = static_cast<float>(attrs.get_float("beta", 0.5));
      break;
    case VectorActivation::kSoftplus:
    case VectorActivation::kMish:
    case VectorActivation::kHardSwish:
    case VectorActivation::kSoftsign: break;
  }
  return act;
}

// y = op(x) through IsaKernels::activation_f32 on the pool's threads for contiguous float32 tensors (CELU: a finite
// alpha > 0); false, nothing written, for the other launches, which the reference runs.
bool run_vector_activation(VectorActivation op, const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  if (x.dtype() != DType::kFloat32 || y.dtype() != DType::kFloat32 || !x.is_contiguous() || !y.is_contiguous() ||
      x.numel() != y.numel()) {
    return false;
  }
  const ActivationParams act = activation_params(op, launch.desc->attrs);
  if (op == VectorActivation::kCelu && !(act.alpha > 0.0f && act.alpha <= std::numeric_limits<float>::max())) {
    return false;
  }
  const IsaKernels& isa = isa_of(context);
  const auto* in = static_cast<const float*>(x.data_ptr());
  auto* out = static_cast<float*>(y.data_ptr());
  parallel_for(y.numel(), context.threads, kActivationGrain, [&](std::int64_t begin, std::int64_t end) {
    isa.activation_f32(in + begin, out + begin, end - begin, act);
  });
  return true;
}

std::vector<Tensor> launch_inputs(const KernelLaunch& launch) {
  std::vector<Tensor> inputs;
  for (std::size_t k = 0; k < launch.num_inputs; ++k) inputs.push_back(launch.input(k));
  return inputs;
}

// The registry op's attributes without `drop` (those it passes as inputs instead).
Attributes attrs_without(const Attributes& attrs, std::initializer_list<const char*> drop) {
  Attributes out;
  for (const auto& [name, value] : attrs.values()) {
    bool dropped = false;
    for (const char* d : drop) dropped = dropped || name == d;
    if (!dropped) out.set(name, value);
  }
  return out;
}

// Clip of float32/float64 in one pass, numpy's order (min(max(x, lo), hi): hi when lo > hi; NaN stays NaN, both
// comparisons being false), as the reference computes it.
template <typename T>
void clip_values(const Tensor& x, Tensor& y, const Attributes& attrs, const CpuContext& context) {
  const T lo = attrs.has("min") ? static_cast<T>(attrs.get_float("min", 0)) : -std::numeric_limits<T>::infinity();
  const T hi = attrs.has("max") ? static_cast<T>(attrs.get_float("max", 0)) : std::numeric_limits<T>::infinity();
  const T* in = static_cast<const T*>(x.data_ptr());
  T* out = static_cast<T*>(y.data_ptr());
  parallel_for(x.numel(), context.threads, 16384, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const T raised = in[i] < lo ? lo : in[i];  // max(x, min), then min(., max): max wins when min > max
      out[i] = raised > hi ? hi : raised;
    }
  });
}

void run_clip(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  const Attributes& attrs = launch.desc->attrs;
  Tensor& y = launch.output(0);
  if (x.dtype() == y.dtype() && x.is_contiguous() && y.is_contiguous() &&
      (x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64)) {
    if (x.dtype() == DType::kFloat32) {
      clip_values<float>(x, y, attrs, context);
    } else {
      clip_values<double>(x, y, attrs, context);
    }
    return;
  }
  run_reference(launch, "Clip", {},
                {x, attrs.has("min") ? scalar_of(attrs.get_float("min", 0), x.dtype()) : Tensor(),
                 attrs.has("max") ? scalar_of(attrs.get_float("max", 0), x.dtype()) : Tensor()});
}

void run_cum_sum(const KernelLaunch& launch, const CpuContext& context) {
  if (cum_sum_fast(launch, context)) return;
  run_reference(launch, "CumSum", attrs_without(launch.desc->attrs, {"axis"}),
                {launch.input(0), int64_scalar(launch.desc->attrs.get_int("axis", 0))});
}

// Pad in constant mode with pads >= 0, any dtype: the output is filled with the value, then each innermost row of x
// is copied to its place (one memcpy per row). False when the pads or mode need the reference.
bool pad_constant(const KernelLaunch& launch) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const Attributes& attrs = launch.desc->attrs;
  const std::vector<std::int64_t> pads = attrs.get_ints("pads", {});
  const std::size_t rank = x.shape().size();
  if (attrs.get_string("mode", "constant") != "constant" || pads.size() != 2 * rank || rank == 0 ||
      !x.is_contiguous() || !y.is_contiguous() || x.dtype() != y.dtype()) {
    return false;
  }
  for (std::int64_t p : pads) {
    if (p < 0) return false;
  }
  const std::size_t es = x.element_size();
  const Tensor value = scalar_of(attrs.get_float("value", 0.0), x.dtype());
  auto* out = static_cast<char*>(y.data_ptr());
  const auto total = static_cast<std::size_t>(y.numel()) * es;
  if (total > 0) std::memcpy(out, value.data_ptr(), es);
  for (std::size_t filled = es; filled < total; filled *= 2) {  // the value, doubled until it covers y
    std::memcpy(out + filled, out, std::min(filled, total - filled));
  }
  if (x.numel() == 0) return true;
  const std::int64_t row = x.shape()[rank - 1];
  const std::int64_t rows = x.numel() / row;
  const auto* in = static_cast<const char*>(x.data_ptr());
  std::vector<std::int64_t> y_strides(rank, 1);
  for (std::size_t d = rank - 1; d-- > 0;) y_strides[d] = y_strides[d + 1] * y.shape()[d + 1];
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t rest = r, offset = pads[rank - 1];
    for (std::size_t d = rank - 1; d-- > 0;) {
      offset += (rest % x.shape()[d] + pads[d]) * y_strides[d];
      rest /= x.shape()[d];
    }
    std::memcpy(out + offset * static_cast<std::int64_t>(es), in + r * row * static_cast<std::int64_t>(es),
                static_cast<std::size_t>(row) * es);
  }
  return true;
}

void run_pad(const KernelLaunch& launch, const CpuContext& context) {
  if (pad_constant(launch) || pad_fast(launch, context)) return;
  const Tensor& x = launch.input(0);
  const Attributes& attrs = launch.desc->attrs;
  const std::string mode = attrs.get_string("mode", "constant");
  Attributes pad_attrs;
  pad_attrs.set("mode", mode);
  run_reference(launch, "Pad", pad_attrs,
                {x, int64_vector(attrs.get_ints("pads", {})),
                 mode == "constant" ? scalar_of(attrs.get_float("value", 0.0), x.dtype()) : Tensor()});
}

// Scales when they give the sizes (the reference then uses them in the coordinate transform, as the model
// asked), the sizes otherwise (the lowering then set scales = sizes / input sizes).
void run_resize(const KernelLaunch& launch) {
  const Tensor& x = launch.input(0);
  const Attributes& attrs = launch.desc->attrs;
  const std::vector<std::int64_t> sizes = attrs.get_ints("sizes", {});
  const std::vector<double> scales = attrs.get_floats("scales", {});
  bool scales_give_sizes = true;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    const auto from_scale = static_cast<std::int64_t>(
        std::floor(static_cast<double>(x.shape()[d]) * static_cast<double>(static_cast<float>(scales[d]))));
    scales_give_sizes = scales_give_sizes && from_scale == sizes[d];
  }
  Attributes resize_attrs = attrs_without(attrs, {"sizes", "scales"});
  if (scales_give_sizes) {
    const Tensor scale_input =
        detail::from_doubles({static_cast<std::int64_t>(scales.size())}, DType::kFloat32, scales);
    run_reference(launch, "Resize", resize_attrs, {x, Tensor(), scale_input});
  } else {
    run_reference(launch, "Resize", resize_attrs, {x, Tensor(), Tensor(), int64_vector(sizes)});
  }
}

void run_one_hot(const KernelLaunch& launch) {
  const Attributes& attrs = launch.desc->attrs;
  const Tensor values = detail::from_doubles({2}, launch.desc->outputs[0].dtype,
                                             {attrs.get_float("off", 0.0), attrs.get_float("on", 1.0)});
  Attributes one_hot_attrs;
  one_hot_attrs.set("axis", attrs.get_int("axis", -1));
  run_reference(launch, "OneHot", one_hot_attrs,
                {launch.input(0), int64_scalar(attrs.get_int("depth", 1)), values});
}

void run_conv_transpose2d(const KernelLaunch& launch) {
  const Attributes& a = launch.desc->attrs;
  Attributes attrs;
  attrs.set("strides", a.get_ints("strides", {1, 1}))
      .set("pads", a.get_ints("pads", {0, 0, 0, 0}))
      .set("dilations", a.get_ints("dilations", {1, 1}))
      .set("group", a.get_int("groups", 1))
      .set("output_padding", a.get_ints("output_padding", {0, 0}));
  run_reference(launch, "ConvTranspose", attrs, launch_inputs(launch));
}

// conv3d's epilogue (Note [3-D convolutions fused] in fusion_conv_gemm.cpp): y = act(y + residual) after the
// reference convolution, through the reference library's Add and Relu.
void run_conv3d_epilogue(const KernelLaunch& launch) {
  const bool residual = launch.num_inputs > 3 && launch.input(3).defined();
  const bool relu = launch.desc->attrs.get_string("activation", "none") == "relu";
  if (!residual && !relu) return;
  Tensor& y = launch.output(0);
  Tensor value = y;
  Node node;
  node.name = "conv3d_epilogue";
  node.outputs = {"y"};
  if (residual) {
    node.op_type = "Add";
    node.inputs = {"y", "residual"};
    value = onnx_ref::run_node(node, kOpset, {value, launch.input(3)})[0];
  }
  if (relu) {
    node.op_type = "Relu";
    node.inputs = {"y"};
    value = onnx_ref::run_node(node, kOpset, {value})[0];
  }
  const Tensor result = value.contiguous();
  if (y.nbytes() > 0) std::memcpy(y.data_ptr(), result.data_ptr(), static_cast<std::size_t>(y.nbytes()));
}

// 3-D Conv (or ConvTranspose when `transpose`): the reference library's, which takes any number of spatial axes.
void run_conv3d(const KernelLaunch& launch, bool transpose) {
  const Attributes& a = launch.desc->attrs;
  Attributes attrs;
  attrs.set("strides", a.get_ints("strides", {1, 1, 1}))
      .set("pads", a.get_ints("pads", {0, 0, 0, 0, 0, 0}))
      .set("dilations", a.get_ints("dilations", {1, 1, 1}))
      .set("group", a.get_int("groups", 1));
  if (transpose) attrs.set("output_padding", a.get_ints("output_padding", {0, 0, 0}));
  std::vector<Tensor> inputs = launch_inputs(launch);
  if (inputs.size() > 3) inputs.resize(3);  // x, w, bias: the residual is the epilogue's
  run_reference(launch, transpose ? "ConvTranspose" : "Conv", attrs, inputs);
  if (!transpose) run_conv3d_epilogue(launch);
}

void run_trilu(const KernelLaunch& launch) {
  Attributes attrs;
  attrs.set("upper", launch.desc->attrs.get_int("upper", 1));
  run_reference(launch, "Trilu", attrs,
                {launch.input(0), int64_scalar(launch.desc->attrs.get_int("k", 0))});
}

// Note [Segmented plans] (capture_plan.h): the bounded forms of NonZero and NonMaxSuppression; the result fills the
// first `count` columns (rows), the rest of the output is zero.
void run_non_zero(const KernelLaunch& launch) {
  Node node;
  node.op_type = "NonZero";
  node.name = "non_zero";
  node.inputs = {"x"};
  node.outputs = {"y"};
  const Tensor y = onnx_ref::run_node(node, kOpset, {launch.input(0)})[0].contiguous();
  Tensor& out = launch.output(0);
  if (out.nbytes() > 0) std::memset(out.data_ptr(), 0, out.nbytes());  // empty tensors may have no data
  const std::int64_t rank = y.shape()[0], found = y.shape()[1], bound = out.shape()[1];
  for (std::int64_t d = 0; d < rank && found > 0; ++d) {
    std::memcpy(static_cast<std::int64_t*>(out.data_ptr()) + d * bound,
                static_cast<const std::int64_t*>(y.data_ptr()) + d * found,
                static_cast<std::size_t>(found) * sizeof(std::int64_t));
  }
  *static_cast<std::int64_t*>(launch.output(1).data_ptr()) = found;
}

void run_non_max_suppression(const KernelLaunch& launch) {
  const Attributes& a = launch.desc->attrs;
  const Tensor y = [&] {
    Node node;
    node.op_type = "NonMaxSuppression";
    node.name = "non_max_suppression";
    node.inputs = {"boxes", "scores", "max", "iou"};
    node.outputs = {"y"};
    node.attrs.set("center_point_box", a.get_int("center_point_box", 0));
    std::vector<Tensor> inputs = {launch.input(0), launch.input(1),
                                  int64_vector({a.get_int("max_output_boxes_per_class", 0)}),
                                  scalar_of(a.get_float("iou_threshold", 0.0), DType::kFloat32)};
    if (a.has("score_threshold")) {
      node.inputs.push_back("score");
      inputs.push_back(scalar_of(a.get_float("score_threshold", 0.0), DType::kFloat32));
    }
    return onnx_ref::run_node(node, kOpset, inputs)[0].contiguous();
  }();
  Tensor& out = launch.output(0);
  XPURT_INTERNAL_ASSERT(y.numel() <= out.numel(), "non_max_suppression: ", y.shape()[0],
                        " boxes kept, more than the bound ", out.shape()[0]);
  if (out.nbytes() > 0) std::memset(out.data_ptr(), 0, out.nbytes());  // may have no data
  if (y.nbytes() > 0) std::memcpy(out.data_ptr(), y.data_ptr(), y.nbytes());
  *static_cast<std::int64_t*>(launch.output(1).data_ptr()) = y.shape()[0];
}

// The ops whose registry form is the ONNX operator's as it is: the same attributes, the same inputs.
void register_mapped_kernels(KernelRegistry& registry) {
  struct Mapped {
    const char* op;
    const char* op_type;
    DTypeSet dtypes;
    bool unary = false;  // one input, elementwise: Note [Elementwise reference ops in chunks]
  };
  const Mapped direct[] = {
      {"hard_sigmoid", "HardSigmoid", DTypeSet::kFloat, true}, {"hard_swish", "HardSwish", DTypeSet::kFloat, true},
      {"leaky_relu", "LeakyRelu", DTypeSet::kFloat, true},     {"elu", "Elu", DTypeSet::kFloat, true},
      {"softplus", "Softplus", DTypeSet::kFloat, true},        {"sin", "Sin", DTypeSet::kFloat, true},
      {"cos", "Cos", DTypeSet::kFloat, true},                  {"floor", "Floor", DTypeSet::kFloat, true},
      {"ceil", "Ceil", DTypeSet::kFloat, true},                {"round", "Round", DTypeSet::kFloat, true},
      {"sign", "Sign", DTypeSet::kFloat, true},                {"is_nan", "IsNaN", DTypeSet::kAll, true},
      {"is_inf", "IsInf", DTypeSet::kAll, true},             {"logical_and", "And", DTypeSet::kAll},
      {"logical_or", "Or", DTypeSet::kAll},              {"logical_xor", "Xor", DTypeSet::kAll},
      {"gather_nd", "GatherND", DTypeSet::kAll},
      {"prelu", "PRelu", DTypeSet::kFloat},
      {"mod", "Mod", DTypeSet::kFloatAndInt},            {"scatter_nd", "ScatterND", DTypeSet::kAll},
      {"tan", "Tan", DTypeSet::kFloat, true},                  {"asin", "Asin", DTypeSet::kFloat, true},
      {"acos", "Acos", DTypeSet::kFloat, true},                {"atan", "Atan", DTypeSet::kFloat, true},
      {"sinh", "Sinh", DTypeSet::kFloat, true},                {"cosh", "Cosh", DTypeSet::kFloat, true},
      {"asinh", "Asinh", DTypeSet::kFloat, true},              {"acosh", "Acosh", DTypeSet::kFloat, true},
      {"atanh", "Atanh", DTypeSet::kFloat, true},              {"softsign", "Softsign", DTypeSet::kFloat, true},
      {"selu", "Selu", DTypeSet::kFloat, true},                {"celu", "Celu", DTypeSet::kFloat, true},
      {"thresholded_relu", "ThresholdedRelu", DTypeSet::kFloat, true}, {"mish", "Mish", DTypeSet::kFloat, true},
  };
  for (const Mapped& m : direct) {
    const std::optional<VectorActivation> vector = vector_activation_of(m.op_type);
    const std::string reference = std::string("the ONNX reference library's ") + m.op_type +
                                  (m.unary ? ", in chunks on the threads" : "");
    add_cpu_kernel(
        registry, m.op,
        vector ? "float32 in vectors (Note [Vectorised ELU, Softplus and Mish]), else " + reference : reference,
        [op_type = std::string(m.op_type), unary = m.unary, vector](const KernelLaunch& launch,
                                                                    const CpuContext& context) {
          if (vector && run_vector_activation(*vector, launch, context)) return;
          if (unary) {
            run_reference_elementwise(launch, op_type, context);
          } else {
            run_reference(launch, op_type, launch.desc->attrs, launch_inputs(launch));
          }
        },
        m.dtypes);
  }
  // Kernels of their own where they take the launch, the reference otherwise.
  const struct {
    const char* op;
    const char* op_type;
    const char* summary;
    bool (*fast)(const KernelLaunch&, const CpuContext&);
    DTypeSet dtypes;
  } with_fast[] = {
      {"log_softmax", "LogSoftmax",
       "log_softmax: float32 along any axis in vectors (Note [Softmax along any axis] in cpu_norm.cpp), the ONNX "
       "reference library's LogSoftmax for the other dtypes",
       log_softmax_fast, DTypeSet::kFloat},
      {"arg_max", "ArgMax",
       "arg_max: any axis, float dtypes (Note [Scans along one axis]), else the ONNX reference library's",
       arg_extreme_fast, DTypeSet::kAll},
      {"arg_min", "ArgMin",
       "arg_min: any axis, float dtypes (Note [Scans along one axis]), else the ONNX reference library's",
       arg_extreme_fast, DTypeSet::kAll},
      {"gather_elements", "GatherElements",
       "gather_elements: rows of the output on the threads (cpu_data.cpp), else the ONNX reference library's",
       gather_elements_fast, DTypeSet::kAll},
  };
  for (const auto& m : with_fast) {
    add_cpu_kernel(
        registry, m.op, m.summary,
        [op_type = std::string(m.op_type), fast = m.fast](const KernelLaunch& launch, const CpuContext& context) {
          if (!fast(launch, context)) run_reference(launch, op_type, launch.desc->attrs, launch_inputs(launch));
        },
        m.dtypes);
  }
}

// Note [Registry ops through the ONNX reference library]: the ops whose constant inputs the registry op takes as
// attributes (Clip's min/max, CumSum's axis, Pad's pads and value, ReduceProd's axes, OneHot's depth and values).
void register_constant_input_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "clip",
                 "clip: one pass for float32/float64, the ONNX reference library's Clip for the other dtypes (min/max "
                 "as constant inputs)",
                 [](const KernelLaunch& launch, const CpuContext& context) { run_clip(launch, context); });
  add_cpu_kernel(registry, "cum_sum",
                 "cum_sum: any axis (cpu_scan.cpp), else the ONNX reference library's CumSum (axis as a constant "
                 "input)",
                 [](const KernelLaunch& launch, const CpuContext& context) { run_cum_sum(launch, context); },
                 DTypeSet::kFloatAndInt);
  add_cpu_kernel(registry, "pad",
                 "pad: constant mode with pads >= 0 as a fill and row copies, reflect, edge and wrap by rows "
                 "(cpu_pad.cpp), the ONNX reference library's Pad otherwise (pads and value as constant inputs)",
                 [](const KernelLaunch& launch, const CpuContext& context) { run_pad(launch, context); },
                 DTypeSet::kAll);
  add_cpu_kernel(registry, "reduce_prod", "the ONNX reference library's ReduceProd (axes as a constant input)",
                 [](const KernelLaunch& launch, const CpuContext&) { run_reference_reduce(launch); },
                 DTypeSet::kFloatAndInt);
  add_cpu_kernel(registry, "one_hot", "the ONNX reference library's OneHot (depth and values as constant inputs)",
                 [](const KernelLaunch& launch, const CpuContext&) { run_one_hot(launch); }, DTypeSet::kAll);
}

// ConvTranspose (2-D) and the 3-D Conv and ConvTranspose.
void register_reference_conv_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "conv_transpose2d", "the ONNX reference library's ConvTranspose",
                 [](const KernelLaunch& launch, const CpuContext&) { run_conv_transpose2d(launch); },
                 DTypeSet::kFloat);
  for (const char* op : {"conv3d", "conv_transpose3d"}) {
    const bool transpose = std::string(op) == "conv_transpose3d";
    add_cpu_kernel(
        registry, op, transpose ? "the ONNX reference library's ConvTranspose" : "the ONNX reference library's Conv",
        [transpose](const KernelLaunch& launch, const CpuContext&) { run_conv3d(launch, transpose); },
        DTypeSet::kFloat);
  }
}

// Trilu, Tile and TopK, whose k (repeats) the registry op takes as an attribute.
void register_index_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "trilu", "the ONNX reference library's Trilu (k as a constant input)",
                 [](const KernelLaunch& launch, const CpuContext&) { run_trilu(launch); }, DTypeSet::kAll);
  add_cpu_kernel(
      registry, "tile", "tile: one strided copy (cpu_data.cpp), else the ONNX reference library's Tile (repeats as a "
      "constant input)",
      [](const KernelLaunch& launch, const CpuContext& context) {
        if (tile_fast(launch, context)) return;
        run_reference(launch, "Tile", {}, {launch.input(0), int64_vector(launch.desc->attrs.get_ints("repeats", {}))});
      },
      DTypeSet::kAll);
  add_cpu_kernel(registry, "top_k",
                 "top_k: any axis by partial selection per line (cpu_scan.cpp), else the ONNX reference library's "
                 "TopK (k as a constant input)",
                 [](const KernelLaunch& launch, const CpuContext& context) {
                   if (top_k_fast(launch, context)) return;
                   run_reference(launch, "TopK", attrs_without(launch.desc->attrs, {"k"}),
                                 {launch.input(0), int64_vector({launch.desc->attrs.get_int("k", 0)})});
                 },
                 DTypeSet::kAll);
}

// NonZero and NonMaxSuppression into their bounded outputs (run_non_zero).
void register_bounded_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "non_zero", "the ONNX reference library's NonZero, into the bounded output",
                 [](const KernelLaunch& launch, const CpuContext&) { run_non_zero(launch); }, DTypeSet::kAll);
  add_cpu_kernel(registry, "non_max_suppression",
                 "the ONNX reference library's NonMaxSuppression, into the bounded output",
                 [](const KernelLaunch& launch, const CpuContext&) { run_non_max_suppression(launch); },
                 DTypeSet::kAll);  // the schema takes float boxes and scores; the outputs are int64
}

}  // namespace

void run_reference_reduce(const KernelLaunch& launch) {
  const std::string& op = launch.desc->op;
  const std::string op_type = op == "reduce_sum"    ? "ReduceSum"
                              : op == "reduce_max"  ? "ReduceMax"
                              : op == "reduce_min"  ? "ReduceMin"
                              : op == "reduce_prod" ? "ReduceProd"
                                                    : "ReduceMean";
  const std::vector<std::int64_t> axes = launch.desc->attrs.get_ints("axes", {});
  Attributes attrs;
  attrs.set("keepdims", launch.desc->attrs.get_int("keepdims", 1));
  run_reference(launch, op_type, attrs, {launch.input(0), axes.empty() ? Tensor() : int64_vector(axes)});
}

// In the order of before the split: the registry keeps its kernels in the order they were added.
void register_onnx_kernels(KernelRegistry& registry) {
  register_mapped_kernels(registry);
  register_constant_input_kernels(registry);
  register_reference_conv_kernels(registry);
  register_index_kernels(registry);
  register_bounded_kernels(registry);
  add_cpu_kernel(registry, "resize", "the ONNX reference library's Resize (scales or sizes as constant inputs)",
                 [](const KernelLaunch& launch, const CpuContext&) { run_resize(launch); });
}

}  // namespace xpuruntime::cpu
