// ONNX reference ops, control flow: If (branches of any value kind: tensors, sequences, optionals), Loop (opsets
// 1-21; loop-carried values of any kind, tensor scan outputs) and Scan (opset 8 with its batch axis, opset 9+ with
// axes and directions; tensors). Bodies run through onnx_ref::run_graph; names they read from enclosing graphs
// resolve through the context's outer scope (the native engine passes the enclosing values, see CapturePlan's
// implicit inputs).
#include <cstring>
#include <limits>

#include "backends/cpu/onnx/onnx_common.h"
#include "core/scalar.h"
#include "xpuruntime/run_options.h"

namespace xpuruntime::onnx_ref {
namespace {

using Shape = std::vector<std::int64_t>;

const Graph& body_of(const OpContext& ctx, const char* attr) {
  auto it = ctx.node().graph_attrs.find(attr);
  XPURT_CHECK(it != ctx.node().graph_attrs.end() && it->second != nullptr, ctx.where(), ": the '", attr,
              "' subgraph attribute is required");
  return *it->second;
}

bool read_bool(const Tensor& t, const std::string& where) {
  XPURT_CHECK(t.numel() == 1, where, ": the condition must have one element, got ", t.numel());
  return read_scalar(t, where) != 0.0;
}

Tensor scalar_tensor_i64(std::int64_t v) {
  Tensor t = Tensor::empty({}, DType::kInt64);
  *static_cast<std::int64_t*>(t.data_ptr()) = v;
  return t;
}

Tensor scalar_tensor_bool(bool v) {
  Tensor t = Tensor::empty({}, DType::kBool);
  *static_cast<bool*>(t.data_ptr()) = v;
  return t;
}

// t with dimension `axis` fixed at `index` (that dimension removed), contiguous.
Tensor select(const Tensor& t, std::int64_t axis, std::int64_t index) {
  const Tensor c = t.contiguous();
  const Shape& shape = c.shape();
  Shape out_shape;
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
    if (d < axis) outer *= shape[d];
    if (d > axis) inner *= shape[d];
    if (d != axis) out_shape.push_back(shape[d]);
  }
  Tensor out = Tensor::empty(out_shape, c.dtype());
  const std::size_t row = static_cast<std::size_t>(inner) * c.element_size();
  const auto* src = static_cast<const std::uint8_t*>(c.data_ptr());
  auto* dst = static_cast<std::uint8_t*>(out.data_ptr());
  for (std::int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + o * row, src + (o * shape[axis] + index) * row, row);
  }
  return out;
}

// Stacks equally shaped tensors along a new dimension `axis` (in [0, rank]).
Tensor stack(const std::vector<Tensor>& parts, std::int64_t axis, const std::string& where) {
  XPURT_INTERNAL_ASSERT(!parts.empty(), "stack of nothing");
  const Shape& shape = parts[0].shape();
  for (const Tensor& p : parts) {
    XPURT_CHECK(p.shape() == shape && p.dtype() == parts[0].dtype(), where,
                ": scan outputs must have the same shape and type in every iteration");
  }
  Shape out_shape = shape;
  out_shape.insert(out_shape.begin() + axis, static_cast<std::int64_t>(parts.size()));
  Tensor out = Tensor::empty(out_shape, parts[0].dtype());
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) (d < axis ? outer : inner) *= shape[d];
  const std::size_t row = static_cast<std::size_t>(inner) * out.element_size();
  auto* dst = static_cast<std::uint8_t*>(out.data_ptr());
  const auto n = static_cast<std::int64_t>(parts.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const Tensor c = parts[i].contiguous();
    const auto* src = static_cast<const std::uint8_t*>(c.data_ptr());
    for (std::int64_t o = 0; o < outer; ++o) std::memcpy(dst + (o * n + i) * row, src + o * row, row);
  }
  return out;
}

// A body output that must be a tensor (a scan output, a Scan state).
Tensor tensor_output(const OpContext& ctx, const Graph& body, const Value& v, std::size_t index) {
  XPURT_CHECK_TYPE(v.is_tensor(), ctx.where(), ": body output ", index, " ('", body.outputs[index],
                   "') must be a tensor, got ", v.str());
  return v.tensor();
}

DType declared_dtype(const Graph& body, const std::string& value) {
  const ValueType* vt = body.type(value);
  return vt ? vt->dtype : DType::kFloat32;
}

void run_if(OpContext& ctx) {
  const bool cond = read_bool(ctx.input(0), ctx.where());
  const Graph& branch = body_of(ctx, cond ? "then_branch" : "else_branch");
  std::vector<Value> outs = run_graph(branch, {}, ctx.outer());
  XPURT_CHECK(outs.size() == ctx.num_outputs(), ctx.where(), ": the branch has ", outs.size(),
              " outputs, the node ", ctx.num_outputs());
  for (std::size_t i = 0; i < outs.size(); ++i) ctx.set_output(i, outs[i]);
}

void run_loop(OpContext& ctx) {
  const Graph& body = body_of(ctx, "body");
  const std::int64_t max_trips = ctx.has_input(0) ? detail::scalar_as_int64(ctx.input(0), ctx.where() + " input 'M'")
                                                  : std::numeric_limits<std::int64_t>::max();
  bool cond = ctx.has_input(1) ? read_bool(ctx.input(1), ctx.where()) : true;
  std::vector<Value> carried;
  for (std::size_t i = 2; i < ctx.num_inputs(); ++i) carried.push_back(ctx.value(i));
  const std::size_t n = carried.size();
  XPURT_CHECK(body.inputs.size() == n + 2, ctx.where(), ": the body takes ", body.inputs.size(),
              " inputs, expected 2 + ", n, " loop-carried values");
  XPURT_CHECK(body.outputs.size() >= n + 1, ctx.where(), ": the body has ", body.outputs.size(),
              " outputs, expected at least 1 + ", n);
  const std::size_t k = body.outputs.size() - 1 - n;
  std::vector<std::vector<Tensor>> scans(k);
  for (std::int64_t i = 0; i < max_trips && cond; ++i) {
    check_run_stop("in ", ctx.where(), " at iteration ", i);  // Note [Stopping a run] (run_options.h)
    std::vector<Value> in = {scalar_tensor_i64(i), scalar_tensor_bool(cond)};
    in.insert(in.end(), carried.begin(), carried.end());
    std::vector<Value> outs = run_graph(body, in, ctx.outer());
    cond = read_bool(tensor_output(ctx, body, outs[0], 0), ctx.where());
    for (std::size_t j = 0; j < n; ++j) carried[j] = outs[1 + j];
    for (std::size_t j = 0; j < k; ++j) scans[j].push_back(tensor_output(ctx, body, outs[1 + n + j], 1 + n + j));
  }
  for (std::size_t j = 0; j < n && j < ctx.num_outputs(); ++j) ctx.set_output(j, carried[j]);
  for (std::size_t j = 0; j < k && n + j < ctx.num_outputs(); ++j) {
    if (scans[j].empty()) {
      ctx.allocate_output(n + j, {0}, declared_dtype(body, body.outputs[1 + n + j]));
    } else {
      ctx.set_output(n + j, stack(scans[j], 0, ctx.where()));
    }
  }
}

// Scan over `scan_inputs` (already without a batch axis): the opset 9+ algorithm.
std::vector<Tensor> scan_once(const OpContext& ctx, const Graph& body, std::vector<Tensor> states,
                              const std::vector<Tensor>& scan_inputs, const Shape& in_axes, const Shape& in_dirs,
                              const Shape& out_axes, const Shape& out_dirs) {
  const std::size_t n = states.size();
  const std::size_t m = scan_inputs.size();
  XPURT_CHECK(body.inputs.size() == n + m, ctx.where(), ": the body takes ", body.inputs.size(), " inputs, expected ",
              n + m);
  const std::size_t k = body.outputs.size() - n;
  std::int64_t length = -1;
  for (std::size_t j = 0; j < m; ++j) {
    const std::int64_t axis = normalize_axis(in_axes[j], scan_inputs[j].dim(), ctx.where());
    const std::int64_t len = scan_inputs[j].shape()[axis];
    XPURT_CHECK(length < 0 || len == length, ctx.where(), ": scan inputs have different sequence lengths (", length,
                " and ", len, ")");
    length = len;
  }
  if (length < 0) length = 0;
  std::vector<std::vector<Tensor>> outs_per_step(k);
  for (std::int64_t t = 0; t < length; ++t) {
    check_run_stop("in ", ctx.where(), " at iteration ", t);  // Note [Stopping a run] (run_options.h)
    std::vector<Value> in(states.begin(), states.end());
    for (std::size_t j = 0; j < m; ++j) {
      const std::int64_t axis = normalize_axis(in_axes[j], scan_inputs[j].dim(), ctx.where());
      in.push_back(select(scan_inputs[j], axis, in_dirs[j] ? length - 1 - t : t));
    }
    std::vector<Value> outs = run_graph(body, in, ctx.outer());
    for (std::size_t s = 0; s < n; ++s) states[s] = tensor_output(ctx, body, outs[s], s);
    for (std::size_t j = 0; j < k; ++j) outs_per_step[j].push_back(tensor_output(ctx, body, outs[n + j], n + j));
  }
  std::vector<Tensor> results = states;
  for (std::size_t j = 0; j < k; ++j) {
    auto& steps = outs_per_step[j];
    XPURT_CHECK(!steps.empty(), ctx.where(), ": a scan over an empty sequence has no output shape");
    if (out_dirs[j]) std::reverse(steps.begin(), steps.end());
    const std::int64_t axis = normalize_axis(out_axes[j], steps[0].dim() + 1, ctx.where());
    results.push_back(stack(steps, axis, ctx.where()));
  }
  return results;
}

void run_scan(OpContext& ctx) {
  const Graph& body = body_of(ctx, "body");
  const auto m = static_cast<std::size_t>(ctx.attr_int("num_scan_inputs", 0));
  XPURT_CHECK(m >= 1, ctx.where(), ": num_scan_inputs must be >= 1");
  const bool batched = ctx.opset() < 9;  // opset 8: input 0 is sequence_lens, every value has a batch axis 0
  const std::size_t first = batched ? 1 : 0;
  XPURT_CHECK(ctx.num_inputs() >= first + m, ctx.where(), ": expected at least ", first + m, " inputs");
  const std::size_t n = ctx.num_inputs() - first - m;
  // Before k: a body with fewer outputs than state variables made k wrap around (a vector of 2^64 axes).
  XPURT_CHECK(body.outputs.size() >= n, ctx.where(), ": the body has ", body.outputs.size(),
              " outputs, expected at least ", n, " (one per state variable)");
  const std::size_t k = body.outputs.size() - n;
  auto ints = [&](const char* name, std::size_t count) {
    Shape v = ctx.attr_ints(name, Shape(count, 0));
    XPURT_CHECK(v.size() == count, ctx.where(), ": attribute '", name, "' must have ", count, " values");
    return v;
  };
  const Shape in_dirs = ints(batched ? "directions" : "scan_input_directions", m);
  const Shape in_axes = batched ? Shape(m, 0) : ints("scan_input_axes", m);
  const Shape out_axes = batched ? Shape(k, 0) : ints("scan_output_axes", k);
  const Shape out_dirs = batched ? Shape(k, 0) : ints("scan_output_directions", k);
  std::vector<Tensor> states, scans;
  for (std::size_t i = 0; i < n; ++i) states.push_back(ctx.input(first + i));
  for (std::size_t j = 0; j < m; ++j) scans.push_back(ctx.input(first + n + j));
  if (!batched) {
    std::vector<Tensor> results = scan_once(ctx, body, states, scans, in_axes, in_dirs, out_axes, out_dirs);
    for (std::size_t i = 0; i < results.size() && i < ctx.num_outputs(); ++i) ctx.set_output(i, results[i]);
    return;
  }
  const std::int64_t batch = scans[0].shape().at(0);
  if (ctx.has_input(0)) {
    const std::vector<std::int64_t> lens = read_ints(ctx.input(0), ctx.where());
    for (auto len : lens) {
      XPURT_CHECK(len == scans[0].shape().at(1), ctx.where(),
                  ": sequence_lens shorter than the scan inputs are not supported");
    }
  }
  std::vector<std::vector<Tensor>> per_batch(n + k);
  for (std::int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> s, x;
    for (const Tensor& t : states) s.push_back(select(t, 0, b));
    for (const Tensor& t : scans) x.push_back(select(t, 0, b));
    std::vector<Tensor> results = scan_once(ctx, body, s, x, in_axes, in_dirs, out_axes, out_dirs);
    for (std::size_t i = 0; i < results.size(); ++i) per_batch[i].push_back(results[i]);
  }
  for (std::size_t i = 0; i < per_batch.size() && i < ctx.num_outputs(); ++i) {
    ctx.set_output(i, stack(per_batch[i], 0, ctx.where()));
  }
}

}  // namespace

void register_control_flow_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "If", run_if);
  kernels.add("", "Loop", run_loop);
  kernels.add("", "Scan", run_scan);
}

}  // namespace xpuruntime::onnx_ref
