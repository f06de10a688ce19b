// CapturePlan::build: specialise, optimize, lower, dispatch and plan memory (see capture_plan.h).
//
// Note [Build phases]
// Session creation is part of what a user waits for (a server's cold start, a notebook's first cell), so a plan
// records where its build went: "prepare" (the graph copied and specialised), type inference and constant folding,
// each graph pass (with its re-inference), the segment split, kernel selection per backend of the chosen kernels
// (cuDNN's and cuBLASLt's heuristics, NVRTC compiling or loading generated kernels: Note [Generated kernels]),
// the rest of lowering, lifetimes and memory plan, and the constants' copy to the device. The native session adds
// the ONNX import and lists every plan's phases in explain().build, so the cost of a policy, a pass or a cold
// codegen cache shows up where it is paid.
#include "xpuruntime/capture_plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/build_clock.h"
#include "core/fnv1a.h"
#include "core/half.h"
#include "core/node_kernels.h"
#include "engines/native/lowering/lowering.h"
#include "engines/native/plan/segments.h"
#include "engines/native/inference/shape_inference.h"
#include "xpuruntime/device_manager.h"
#include "core/shape_str.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {
namespace {

constexpr std::size_t kAlignment = 256;

std::size_t align_up(std::size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// "512 B", "12.5 KiB", "3.25 MiB", "208 MiB".
std::string mib(std::size_t bytes) {
  std::ostringstream os;
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) {
    os << bytes << " B";
  } else if (bytes < (1u << 20)) {
    os.precision(1);
    os << std::fixed << b / 1024.0 << " KiB";
  } else {
    os.precision(bytes >= (100u << 20) ? 0 : 2);
    os << std::fixed << b / (1024.0 * 1024.0) << " MiB";
  }
  return os.str();
}

// Fits each declared input type to the concrete shape given for it.
void specialise_inputs(Graph& g, const std::vector<std::vector<std::int64_t>>& shapes) {
  XPURT_CHECK(shapes.size() == g.inputs.size(), "the model has ", g.inputs.size(), " inputs, got shapes for ",
              shapes.size());
  std::map<std::string, std::int64_t> symbols;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string& name = g.inputs[i];
    ValueType& vt = g.types[name];
    if (!vt.is_tensor()) {
      // A sequence or an optional: its tensors' shapes are known only when it runs (the reference library's).
      XPURT_INTERNAL_ASSERT(shapes[i].empty(), "input '", name, "' is ", vt.type_str(), ": it takes no plan shape");
      continue;
    }
    if (vt.has_shape) {
      XPURT_CHECK(vt.shape.size() == shapes[i].size(), "input '", name, "' expects rank ", vt.shape.size(), " (",
                  vt.str(), "), got shape ", detail::shape_str(shapes[i], ","));
      for (std::size_t d = 0; d < shapes[i].size(); ++d) {
        const Dim& dim = vt.shape[d];
        if (dim.known()) {
          XPURT_CHECK(dim.value == shapes[i][d], "input '", name, "' expects ", vt.str(), ", got shape ",
                      detail::shape_str(shapes[i], ","), " (dimension ", d, " must be ", dim.value, ")");
        } else if (!dim.symbol.empty()) {
          auto [it, inserted] = symbols.emplace(dim.symbol, shapes[i][d]);
          XPURT_CHECK(inserted || it->second == shapes[i][d], "input '", name, "': dimension '", dim.symbol,
                      "' is ", shapes[i][d], " here but ", it->second, " in another input");
        }
      }
    }
    vt.has_shape = true;
    vt.shape.clear();
    for (auto d : shapes[i]) vt.shape.emplace_back(d);
  }
}

// Runs a float32 model in `to` (float16/bfloat16): float32 initializers are converted, float32 inputs and outputs
// are cast at the boundary, Casts to float32 become casts to `to`.
// The float32 initializers that only ops with integer inputs and outputs read (QLinearConv's scales, ...): their
// float32 is the model's arithmetic, not its compute precision, and ONNX types them float32 whatever the plan.
std::set<std::string> read_only_by_integer_ops(const Graph& g) {
  static const std::set<std::string> kIntegerOps = {
      "QLinearMatMul",    "QLinearConv",        "QLinearAdd",           "QLinearMul",
      "QLinearConcat",    "QLinearSigmoid",     "QLinearLeakyRelu",     "QLinearAveragePool",
      "QLinearGlobalAveragePool", "QGemm"};
  std::set<std::string> integer, other;
  for (const Node& n : g.nodes) {
    const bool integer_op = kIntegerOps.count(n.op_type) != 0 && (n.domain.empty() || n.domain == "com.microsoft");
    for (const std::string& in : n.inputs) (integer_op ? integer : other).insert(in);
  }
  std::set<std::string> only;
  for (const std::string& name : integer) {
    if (!other.count(name)) only.insert(name);
  }
  return only;
}

// Note [Constants saturate in lower precision]
// Exporters write a float32 model's masks with the most negative float32 (PyTorch: torch.finfo(float32).min, added
// to the scores of masked keys). Rounded to float16 that is -inf, which changes what the model computes: a row whose
// every key is masked gets a uniform softmax in float32 but NaN in float16 (exp(-inf - (-inf))), and the attention
// pattern's NaN guard (Where(IsNaN(p), 0, p)) can no longer be dropped, so attention_fusion left the attention of
// every masked float32 transformer unfused in float16 plans (BERT, GPT-2, Llama of the suite; the int8 BERT in a
// float16 plan on an H200 ran 0.6 ms of attention ops a run instead of one fused kernel). So a finite float32 constant
// beyond the target's range becomes its largest finite value of that sign (float16: 65504), as ONNX's float16
// converters clip (onnxconverter-common's convert_float_to_float16, max_finite_val); infinities and NaN stay.
std::uint16_t saturated(float v, DType to) {
  const std::uint16_t bits = to == DType::kFloat16 ? detail::float_to_half(v) : detail::float_to_bfloat16(v);
  const bool became_infinite = (bits & 0x7FFFu) == (to == DType::kFloat16 ? 0x7C00u : 0x7F80u);
  if (!became_infinite || !std::isfinite(v)) return bits;
  const std::uint16_t largest = to == DType::kFloat16 ? 0x7BFFu : 0x7F7Fu;
  return static_cast<std::uint16_t>(largest | (v < 0.0f ? 0x8000u : 0u));
}

void convert_precision(Graph& g, DType to) {
  const std::int64_t onnx_to = to == DType::kFloat16 ? 10 : 16;
  // A float32 constant in `to`, rounded to nearest even, finite values saturating (Note [Constants saturate in lower
  // precision]).
  auto convert = [to](const Tensor& t) {
    Tensor c = Tensor::empty(t.shape(), to);
    const auto* src = static_cast<const float*>(t.contiguous().data_ptr());
    auto* dst = static_cast<std::uint16_t*>(c.data_ptr());
    for (std::int64_t i = 0; i < t.numel(); ++i) dst[i] = saturated(src[i], to);
    return c;
  };
  const std::set<std::string> integer_only = read_only_by_integer_ops(g);
  for (auto& [name, t] : g.initializers) {
    if (t.dtype() != DType::kFloat32 || integer_only.count(name)) continue;
    t = convert(t);
    g.types[name].dtype = to;
  }
  for (Node& n : g.nodes) {
    if (n.domain.empty() && (n.op_type == "Cast") && n.attrs.get_int("to", 0) == 1) n.attrs.set("to", onnx_to);
    if (n.op_type != "ConstantOfShape" && n.op_type != "Constant") continue;
    for (auto& [name, t] : n.tensor_attrs) {
      if (t.dtype() == DType::kFloat32) t = convert(t);
    }
  }
  std::vector<Node> prologue;
  for (auto& in : g.inputs) {
    ValueType& vt = g.types[in];
    if (vt.dtype != DType::kFloat32) continue;
    const std::string internal = g.unique_name(in + "_" + std::string(dtype_name(to)));
    for (Node& n : g.nodes) {
      for (auto& x : n.inputs) {
        if (x == in) x = internal;
      }
    }
    for (auto& out : g.outputs) {
      if (out == in) out = internal;  // an input that is also an output: handled by the output cast below
    }
    Node cast;
    cast.name = g.unique_name("cast_" + in);
    cast.op_type = "Cast";
    cast.inputs = {in};
    cast.outputs = {internal};
    cast.attrs.set("to", onnx_to);
    ValueType it = vt;
    it.dtype = to;
    g.types[internal] = it;
    prologue.push_back(std::move(cast));
  }
  g.nodes.insert(g.nodes.begin(), prologue.begin(), prologue.end());
  for (auto& out : g.outputs) {
    auto t = g.types.find(out);
    if (t == g.types.end() || t->second.dtype != DType::kFloat32) continue;
    // The node producing `out` now makes `to`; rename its output and cast back under the model's name.
    const std::string internal = g.unique_name(out + "_" + std::string(dtype_name(to)));
    bool renamed = false;
    for (Node& n : g.nodes) {
      for (auto& o : n.outputs) {
        if (o == out) {
          o = internal;
          renamed = true;
        }
      }
      for (auto& x : n.inputs) {
        if (x == out) x = internal;
      }
    }
    if (!renamed) continue;  // an input or initializer passed through
    Node cast;
    cast.name = g.unique_name("cast_" + out);
    cast.op_type = "Cast";
    cast.inputs = {internal};
    cast.outputs = {out};
    cast.attrs.set("to", std::int64_t{1});
    g.nodes.push_back(std::move(cast));
  }
  g.validate();
}

TensorDesc desc_of(const ValueType& vt, Device device) {
  return TensorDesc::contiguous(vt.sizes(), vt.dtype, device, static_cast<std::uint32_t>(kAlignment));
}

// Greedy best-fit offset assignment by decreasing size (TFLite's "greedy by size"): each value takes the lowest
// aligned offset where it does not overlap any already placed value that is alive at the same time.
std::size_t assign_offsets(std::vector<PlanValue>& values, const std::vector<int>& ids) {
  std::vector<int> order = ids;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return values[a].bytes > values[b].bytes; });
  std::vector<int> placed;
  std::size_t arena = 0;
  for (int id : order) {
    PlanValue& v = values[id];
    std::vector<std::pair<std::size_t, std::size_t>> busy;  // [offset, end) of overlapping lifetimes
    for (int p : placed) {
      const PlanValue& o = values[p];
      if (o.first_step <= v.last_step && v.first_step <= o.last_step) busy.emplace_back(o.offset, o.offset + o.bytes);
    }
    std::sort(busy.begin(), busy.end());
    std::size_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + v.bytes <= begin) break;
      offset = std::max(offset, align_up(end));
    }
    v.offset = offset;
    arena = std::max(arena, align_up(offset + v.bytes));
    placed.push_back(id);
  }
  return arena;
}

}  // namespace

std::string MemoryPlan::str() const {
  std::ostringstream os;
  os << "peak " << mib(peak_bytes()) << " = arena " << mib(arena_bytes);
  if (unshared_bytes > 0) {
    os << " (" << planned_values << " values; without reuse " << mib(unshared_bytes) << ")";
  }
  os << " + workspace " << mib(workspace_bytes) << " + constants " << mib(constant_bytes);
  if (dynamic_values) os << "; " << dynamic_values << " values allocated at run time";
  return os.str();
}

std::string MemoryPlan::to_json() const {
  std::ostringstream os;
  os << "{\"peak_bytes\":" << peak_bytes() << ",\"arena_bytes\":" << arena_bytes
     << ",\"unshared_bytes\":" << unshared_bytes << ",\"workspace_bytes\":" << workspace_bytes
     << ",\"constant_bytes\":" << constant_bytes << ",\"planned_values\":" << planned_values
     << ",\"dynamic_values\":" << dynamic_values << "}";
  return os.str();
}

// Note [Outputs written where the caller gets them]
// A graph output in the arena is copied out at the end of a run, since the next run reuses the arena: on the CPU
// that copy was as long as the whole computation of a small model with a large output (a Neg of 3.2 MB: 40% of the
// run in collect_outputs' memmove, 2026-12-03). So on the CPU, an output that a static kernel step writes, that is
// not a view and of which no other value is a view, and that the graph lists once, is written into a tensor of its
// own each run (the allocator's), which the caller then receives as it is; its arena slot stays unused. CUDA plans
// keep the arena (a captured CUDA graph writes fixed addresses) and so do outputs that other values view.
std::vector<bool> CapturePlan::direct_outputs() const {
  std::vector<bool> direct(values_.size(), false);
  if (device_.is_cuda()) return direct;
  std::vector<int> listed(values_.size(), 0);
  for (int id : outputs_) ++listed[static_cast<std::size_t>(id)];
  std::vector<bool> viewed(values_.size(), false);
  for (const PlanValue& v : values_) {
    if (v.view_of >= 0) viewed[static_cast<std::size_t>(v.view_of)] = true;
  }
  for (int id : outputs_) {
    const auto k = static_cast<std::size_t>(id);
    const PlanValue& v = values_[k];
    if (!v.planned || v.kind != PlanValue::Kind::kIntermediate || v.view_of >= 0 || viewed[k] || listed[k] != 1 ||
        v.first_step < 0) {
      continue;
    }
    const PlanStep& producer = steps_[static_cast<std::size_t>(v.first_step)];
    direct[k] = producer.kind == PlanStep::Kind::kKernel && !producer.dynamic;
  }
  return direct;
}

// Note [Cache appended in place]
// A decoder exported with a cache computes each layer's present as Concat(past, new) along the positions: every
// decode step reads the whole past and writes it again, and with I/O binding the present is then copied once more
// from the arena into the caller's buffer (and on CUDA the past into its fixed arena slot first): three passes over
// the cache for one position. When the caller binds the present output to a buffer whose leading part along the
// Concat's axis IS the past input (the same address and strides: the past a view of the present's first positions,
// as the generator's static cache binds them, Note [Static cache layout] in generation/kv_cache.cpp), the past's
// elements are already where the present wants them. The run then writes only the new positions, into that buffer
// at the past's length, and the Concat's readers read the buffer itself: nothing copies the cache. Which steps may
// do so is known when the plan is built (cache_appends: a static Concat whose first input is a graph input that no
// other step reads and whose output is a graph output listed once); whether a run does is decided per run from the
// bound tensors (GraphExec, Note [Appends of a run] in exec/graph_exec.cpp), so any other binding runs the Concat
// as before.
std::vector<CacheAppend> CapturePlan::cache_appends() const {
  std::vector<CacheAppend> appends;
  if (boundary_) return appends;
  std::vector<int> readers(values_.size(), 0), listed(values_.size(), 0);
  for (const PlanStep& step : steps_) {
    for (int id : step.inputs) {
      if (id >= 0) ++readers[static_cast<std::size_t>(id)];
    }
  }
  for (int id : outputs_) ++listed[static_cast<std::size_t>(id)];
  auto index_in = [](const std::vector<int>& ids, int id) {
    return static_cast<std::size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
  };
  for (std::size_t index = 0; index < steps_.size(); ++index) {
    const PlanStep& step = steps_[index];
    if (step.kind != PlanStep::Kind::kKernel || step.dynamic || step.op != "concat" || step.inputs.size() < 2 ||
        step.outputs.size() != 1) {
      continue;
    }
    const int past = step.inputs[0], present = step.outputs[0];
    if (past < 0 || present < 0 || values_[static_cast<std::size_t>(past)].kind != PlanValue::Kind::kInput ||
        readers[static_cast<std::size_t>(past)] != 1 || listed[static_cast<std::size_t>(past)] != 0 ||
        listed[static_cast<std::size_t>(present)] != 1 || !values_[static_cast<std::size_t>(past)].type.is_tensor()) {
      continue;
    }
    const auto rank = static_cast<std::int64_t>(step.desc.outputs[0].shape.size());
    std::int64_t axis = step.desc.attrs.get_int("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) continue;
    appends.push_back({index, index_in(inputs_, past), index_in(outputs_, present), axis});
  }
  return appends;
}

bool CapturePlan::capturable(std::string* why) const {
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  if (!device_.is_cuda()) return no("the plan runs on the CPU");
  for (const PlanStep& s : steps_) {
    if (s.kind == PlanStep::Kind::kReference) return no("node '" + s.node + "' runs in the reference library");
    if (s.dynamic) return no("node '" + s.node + "' has shapes known only at run time");
  }
  return true;
}

std::string CapturePlan::str() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const PlanStep& s = steps_[i];
    os << i << ": " << s.node << " (" << s.op_type << ") ";
    switch (s.kind) {
      case PlanStep::Kind::kKernel:
        os << s.op;
        if (s.dispatch) os << " -> " << s.dispatch->decision.kernel;
        if (s.dynamic) os << " [dynamic]";
        break;
      case PlanStep::Kind::kView: os << "view"; break;
      case PlanStep::Kind::kReference: os << "reference (" << s.reason << ")"; break;
    }
    os << "\n";
  }
  os << memory_.str() << "\n";
  return os.str();
}

namespace {

// The build phase a kernel selection of `backend` counts in: the first one in this process also pays the library's
// loading and handle creation (Note [Build phases]), so it is a phase of its own.
std::string first_use(const std::string& backend) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  return seen.insert(backend).second ? backend + ", first in this process" : backend;
}

// ---- Phase "specialise shapes" (with specialise_inputs and convert_precision above) ----

// Note [Sequence and optional values] (value.h): they live on the CPU, in the reference library; a CUDA plan
// with such inputs or outputs is refused (UnsupportedOperationError naming them).
void refuse_host_values(const Graph& g, Device device) {
  if (!device.is_cuda()) return;
  std::string values;
  for (const auto* names : {&g.inputs, &g.outputs}) {
    for (const std::string& name : *names) {
      const ValueType* vt = g.type(name);
      if (vt == nullptr || vt->is_tensor()) continue;
      values += detail::str_cat(values.empty() ? "" : ", ", "'", name, "' (", vt->type_str(), ")");
    }
  }
  if (!values.empty()) {
    throw UnsupportedOperationError(detail::str_cat(
        "the native engine runs sequence and optional values on the CPU only: this model's ", values,
        " cannot run on ", device.str(), " (use device cpu, or engine onnxruntime)"));
  }
}

// What type inference, folding and the graph passes of a plan of `options` take.
runtime::InferOptions inference_options(const PlanOptions& options) {
  runtime::InferOptions infer_options;
  infer_options.fold_constants = options.fold_constants;
  infer_options.registry = &options.dispatcher->registry();
  infer_options.device = options.device;
  infer_options.tp_size = options.tp_size;
  infer_options.tp_rank = options.tp_rank;
  infer_options.tp_comm = options.tp_comm;
  // ExecutionPolicy.memory_limit caps folding too: no folded constant may exceed it (each is counted in the plan's
  // constants, which the limit checks below).
  if (options.memory_limit != 0) {
    infer_options.max_folded_bytes =
        std::min<std::size_t>(infer_options.max_folded_bytes, static_cast<std::size_t>(options.memory_limit));
  }
  // quantized_fusion (Note [Quantized fusion]): where the device has kernels of the int8 ops, for float32 and float16
  // plans (Note [Quantized fusion in float16 plans]) on one rank.
  const KernelRegistry* kernels = &options.dispatcher->registry();
  const auto on_device = [&](const char* op) {
    for (const Kernel* k : kernels->kernels(op)) {
      if (k->info().device_type == options.device.type) return true;
    }
    return false;
  };
  const bool float_plan = options.compute_float == DType::kFloat32 || options.compute_float == DType::kFloat16;
  infer_options.fuse_quantized = float_plan && options.tp_size == 1 && on_device("qlinear") && on_device("qconv2d");
  infer_options.fp8_fast_accumulation = options.fp8_fast_accumulation;
  // int4_weight_fusion (Note [Int4 weight fusion]): where the device has a matmul_nbits kernel, on one rank.
  infer_options.fuse_int4_weights = options.tp_size == 1 && on_device("matmul_nbits");
  // group_query_attention_decomposition (Note [Group query attention decomposed]): where the device has no kernel of
  // group_query_attention, or everywhere with XPURT_GQA_DECOMPOSE=1 (what the tests compare with the cpu kernel).
  const char* force_gqa = std::getenv("XPURT_GQA_DECOMPOSE");
  infer_options.decompose_group_query_attention =
      !on_device("group_query_attention") || (force_gqa != nullptr && std::string(force_gqa) == "1");
  // elementwise_fusion (Note [Fused elementwise programs]): where a fused_elementwise kernel runs on the device, and
  // not for ops the KernelPolicy gives a rule of their own.
  const KernelRegistry* registry = &options.dispatcher->registry();
  OpDescriptor probe;
  probe.op = "fused_elementwise";
  probe.device = options.device;
  probe.inputs.push_back(TensorDesc::contiguous({1}, DType::kFloat32, options.device));
  probe.attrs.set("program", std::string("neg x0"));
  registry->infer(probe);
  bool runnable = false;
  for (const Kernel* k : registry->kernels("fused_elementwise")) {
    runnable = runnable || k->supports(probe, options.dispatcher->exec_policy()).ok();
  }
  infer_options.fuse_elementwise = runnable;
  // A rule of the policy for an op or its family keeps that op's nodes out of the groups: the user chose their
  // kernel. Unless the policy rules fused_elementwise too: then it was written for a plan with fused groups (what
  // `xpuruntime tune` writes: a rule per op, fused and unfused alike), and replaying it must group the same nodes;
  // its per-op rules then apply to the nodes the pass leaves unfused.
  const KernelPolicy& policy = options.dispatcher->kernel_policy();
  const OpSchema* fused_schema = registry->find_schema("fused_elementwise");
  const bool fusion_ruled = fused_schema != nullptr &&
                            policy.resolve("fused_elementwise", fused_schema->family).mode != RuleMode::kAuto;
  infer_options.keep_unfused = [registry, policy, fusion_ruled](const std::string& op) {
    if (fusion_ruled) return false;
    const OpSchema* schema = registry->find_schema(op);
    return schema != nullptr && policy.resolve(op, schema->family).mode != RuleMode::kAuto;
  };
  return infer_options;
}

// ---- Phases "lower" and "select kernels" ----

// A static kernel step whose descriptor is known, waiting for its kernel (Note [Parallel kernel selection]).
struct Selection {
  std::size_t step;
  std::int64_t opset;
  OpDescriptor desc;
  std::shared_ptr<const Dispatch> dispatch;
  std::exception_ptr error;
  double ms = 0;
};

// Lowers the nodes of an optimised graph into a plan's steps and values: the value table (one id per name), each
// node as a kernel, view or reference step, and the list of nodes that cannot run (refused at the end, all at once).
class StepLowering {
 public:
  StepLowering(const Graph& g, const PlanOptions& options, std::vector<PlanValue>& values,
               std::vector<PlanStep>& steps)
      : g_(g), options_(options), device_(options.device), values_(values), steps_(steps) {
    if (device_.is_cuda()) {
      compute_capability_ = DeviceManager::instance().get_device_info(device_).compute_capability();
    }
    defined_.insert(g.inputs.begin(), g.inputs.end());
    for (const auto& [name, t] : g.initializers) defined_.insert(name);
    for (const Node& node : g.nodes) defined_.insert(node.outputs.begin(), node.outputs.end());
  }

  // The graph inputs' values, in order (their ids appended to `inputs`).
  void add_inputs(std::vector<int>& inputs) {
    for (const auto& in : g_.inputs) {
      const int id = value_id(in);
      values_[id].kind = PlanValue::Kind::kInput;
      inputs.push_back(id);
    }
  }

  // One step per node, in order. The kernel steps whose descriptors are known are returned for kernel selection;
  // their outputs' types are inferred already (later steps read them).
  std::vector<Selection> lower_nodes() {
    std::vector<Selection> selections;
    for (std::size_t index = 0; index < g_.nodes.size(); ++index) {
      const Node& node = g_.nodes[index];
      PlanStep step;
      step.node = node.name;
      step.op_type = node.domain == kXpurtDomain ? "xpuruntime:" + node.op_type
                     : node.domain.empty()      ? node.op_type
                                                : node.domain + ":" + node.op_type;
      std::vector<const ValueType*> types;
      std::vector<const Tensor*> constants;
      for (const auto& in : node.inputs) {
        types.push_back(in.empty() ? nullptr : g_.type(in));
        auto c = g_.initializers.find(in);
        constants.push_back(in.empty() || c == g_.initializers.end() ? nullptr : &c->second);
      }
      const std::int64_t opset = g_.opset(node.domain);
      runtime::Lowered lowered = runtime::lower_node(node, opset, types, constants);
      for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : value_id(in));
      for (const auto& out : node.outputs) step.outputs.push_back(out.empty() ? -1 : value_id(out));
      if (lowered.kind == runtime::Lowered::Kind::kView) {
        lower_view(step, lowered);
      } else if (lowered.kind == runtime::Lowered::Kind::kRegistry) {
        lower_registry_op(index, step, node, opset, lowered, selections);
      } else {
        fall_back(index, step, node, opset, lowered.reason);
      }
      steps_.push_back(std::move(step));
    }
    return selections;
  }

  // The chosen kernels into their steps (a step whose selection failed falls back); returns the selection time per
  // backend of the chosen kernels, summed over the threads (Note [Build phases]).
  std::map<std::string, double> take_selections(std::vector<Selection>& selections) {
    std::map<std::string, double> selection_ms;
    for (Selection& sel : selections) {
      PlanStep& step = steps_[sel.step];
      if (sel.error) {
        selection_ms["(none)"] += sel.ms;
        try {
          std::rethrow_exception(sel.error);
        } catch (const XpuRuntimeError& e) {
          fall_back(sel.step, step, g_.nodes[sel.step], sel.opset, no_kernel(sel.desc, e.what()));
        }
        continue;
      }
      selection_ms[first_use(sel.dispatch->decision.backend)] += sel.ms;
      step.dispatch = std::move(sel.dispatch);
      step.desc = std::move(sel.desc);
    }
    return selection_ms;
  }

  // UnsupportedOperationError listing every node that cannot run, in step order; nothing when all can.
  void refuse_unsupported() {
    std::sort(unsupported_.begin(), unsupported_.end());
    if (unsupported_.empty()) return;
    std::string list;
    for (const auto& [index, why] : unsupported_) list += "\n  " + why;
    throw UnsupportedOperationError(detail::str_cat(
        "the native engine cannot run ", unsupported_.size(), " node(s) of this model on ", device_.str(), ":", list,
        device_.is_cuda() && !options_.cpu_fallback
            ? "\n(ExecutionPolicy(fallback=\"cpu\") runs such nodes on the CPU, with copies; engine=\"onnxruntime\" "
              "runs the model through ONNX Runtime)"
            : ""));
  }

  // The graph outputs' values, in order (their ids appended to `outputs`).
  void add_outputs(std::vector<int>& outputs) {
    for (const auto& out : g_.outputs) {
      const int id = value_id(out);
      values_[id].is_output = true;
      outputs.push_back(id);
    }
  }

 private:
  // The id of value `name`, added on first use (a constant with its tensor and exact type).
  int value_id(const std::string& name) {
    auto it = id_of_.find(name);
    if (it != id_of_.end()) return it->second;
    PlanValue v;
    v.name = name;
    if (const ValueType* vt = g_.type(name)) v.type = *vt;
    if (g_.is_constant(name)) {
      v.kind = PlanValue::Kind::kConstant;
      v.constant = g_.initializers.at(name);
      v.type.dtype = v.constant.dtype();
      v.type.has_shape = true;
      v.type.shape.clear();
      for (auto d : v.constant.shape()) v.type.shape.emplace_back(d);
    }
    values_.push_back(std::move(v));
    const int id = static_cast<int>(values_.size() - 1);
    id_of_[name] = id;
    return id;
  }

  // A view step: the output shares input 0's bytes, from the lowered offset.
  void lower_view(PlanStep& step, const runtime::Lowered& lowered) {
    step.kind = PlanStep::Kind::kView;
    PlanValue& out = values_[step.outputs[0]];
    out.view_of = step.inputs[0];
    out.view_offset = static_cast<std::size_t>(lowered.view_offset) * dtype_size(values_[step.inputs[0]].type.dtype);
    out.type.dtype = values_[step.inputs[0]].type.dtype;
    out.type.has_shape = true;
    out.type.shape.clear();
    for (auto d : lowered.view_shape) out.type.shape.emplace_back(d);
  }

  // A kernel step: static (its descriptor prepared, queued in `selections`), dynamic on the CPU (Note [Static and
  // dynamic steps]), or a fallback when its shapes are known only at run time on CUDA or no kernel takes it.
  void lower_registry_op(std::size_t index, PlanStep& step, const Node& node, std::int64_t opset,
                         const runtime::Lowered& lowered, std::vector<Selection>& selections) {
    step.kind = PlanStep::Kind::kKernel;
    step.op = lowered.op;
    step.attrs = lowered.attrs;
    // Registry inputs in schema order.
    std::vector<int> reg_inputs;
    for (int idx : lowered.inputs) reg_inputs.push_back(idx < 0 ? -1 : step.inputs[idx]);
    step.inputs = reg_inputs;
    bool all_known = true;
    for (int id : reg_inputs) {
      if (id >= 0 && !values_[id].type.fully_known()) all_known = false;
    }
    if (!all_known) {
      if (device_.is_cuda()) {
        fall_back(index, step, node, opset, "input shapes are known only at run time");
      } else {
        step.dynamic = true;
        // The reference library runs it when the registry op refuses what the run gives (graph_exec.cpp).
        step.reference_node = std::make_shared<const Node>(node);
        step.opset = opset;
        for (const auto& in : node.inputs) step.reference_inputs.push_back(in.empty() ? -1 : value_id(in));
      }
      return;
    }
    OpDescriptor desc;
    desc.op = lowered.op;
    desc.attrs = lowered.attrs;
    desc.device = device_;
    desc.compute_capability = compute_capability_;
    for (int id : reg_inputs) {
      desc.inputs.push_back(id < 0 ? TensorDesc{} : desc_of(values_[id].type, device_));
      desc.inputs.back().constant = id >= 0 && values_[id].kind == PlanValue::Kind::kConstant;
    }
    // The outputs' types now (later steps read them); the kernel later (Note [Parallel kernel selection]).
    try {
      options_.dispatcher->prepare(desc);
      for (std::size_t o = 0; o < step.outputs.size() && o < desc.outputs.size(); ++o) {
        if (step.outputs[o] < 0) continue;
        PlanValue& out = values_[step.outputs[o]];
        out.type.dtype = desc.outputs[o].dtype;
        out.type.has_shape = true;
        out.type.shape.clear();
        for (auto d : desc.outputs[o].shape) out.type.shape.emplace_back(d);
      }
      selections.push_back({index, opset, std::move(desc), nullptr, nullptr, 0});
    } catch (const XpuRuntimeError& e) {
      fall_back(index, step, node, opset, no_kernel(desc, e.what()));
    }
  }

  // Step `index` (node `node`) runs in the reference library instead, or the plan is refused on CUDA.
  void fall_back(std::size_t index, PlanStep& step, const Node& node, std::int64_t opset, const std::string& reason) {
    // The reference library reads the node's inputs in the node's order, which a registry op's may not be (a step
    // lowered onto group_query_attention holds them reordered).
    step.inputs.clear();
    for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : value_id(in));
    step.kind = PlanStep::Kind::kReference;
    step.reason = reason;
    step.dispatch.reset();
    step.reference_node = std::make_shared<const Node>(node);
    step.opset = opset;
    for (const auto& [attr, sub] : node.graph_attrs) {
      if (!sub) continue;
      for (const std::string& name : onnx_ref::outer_names(*sub)) {
        const bool listed = std::find(step.implicit_inputs.begin(), step.implicit_inputs.end(), name) !=
                            step.implicit_inputs.end();
        if (!defined_.count(name) || listed) continue;
        step.implicit_inputs.push_back(name);
        step.inputs.push_back(value_id(name));
      }
    }
    if (device_.is_cuda() && !options_.cpu_fallback) {
      unsupported_.emplace_back(index, detail::str_cat("node '", node.name, "' (", step.op_type, "): ", reason));
      return;
    }
    // On CUDA (Note [Mixed execution]) the node runs on the host between copies; the plan is then not capturable.
    step.on_host = device_.is_cuda();
    if (!onnx_ref::has_node_kernel(node.domain, node.op_type)) {
      unsupported_.emplace_back(index, detail::str_cat("node '", node.name, "' (", step.op_type, "): ", reason,
                                                       ", and the reference library has no ", node.op_type));
    }
  }

  std::string no_kernel(const OpDescriptor& desc, const std::string& what) const {
    return device_.is_cuda() ? detail::str_cat("no kernel for ", desc.op, " here: ", what)
                             : detail::str_cat("registry op ", desc.op, " cannot take it: ", what);
  }

  const Graph& g_;
  const PlanOptions& options_;
  const Device device_;
  int compute_capability_ = 0;
  std::vector<PlanValue>& values_;
  std::vector<PlanStep>& steps_;
  std::unordered_map<std::string, int> id_of_;
  std::unordered_set<std::string> defined_;  // every name the graph defines (subgraphs' outer names resolve here)
  std::vector<std::pair<std::size_t, std::string>> unsupported_;  // (step, why), listed in step order
};

// Note [Parallel kernel selection]
// Choosing a kernel is mostly the libraries' host work: cuDNN's heuristic ranking and workspace queries, cuBLASLt's
// algorithm heuristic, NVRTC loading or compiling a generated kernel. It took 60-90% of the plan builds of the
// suite's CNNs (Note [Build phases]), one node after another. The nodes' descriptors are known once lowering has
// inferred every output, so the kernels are chosen on up to 8 threads (a CUDA plan; a CPU plan's choices are
// cheap and stay on this thread): the Dispatcher decides distinct signatures at once (a thread asking for one
// that another decides waits for it), the libraries' handles are per thread (Note [Per-thread handle pools]),
// and whatever times kernels on the GPU holds gpu_timing_mutex(), so timings never overlap. The choices do not
// depend on the order: each is a function of its descriptor, the policies and the autotune cache.
//
// Fills each selection's dispatch (or error) and time; returns the number of threads it used.
std::size_t select_kernels(std::vector<Selection>& selections, Dispatcher& dispatcher, Device device) {
  const auto work = [&](std::atomic<std::size_t>& next) {
    for (std::size_t i = next++; i < selections.size(); i = next++) {
      Selection& sel = selections[i];
      const auto start = std::chrono::steady_clock::now();
      try {
        sel.dispatch = dispatcher.select(sel.desc);
      } catch (...) {
        sel.error = std::current_exception();
      }
      sel.ms = detail::ms_since(start);
    }
  };
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads =
      device.is_cuda() ? std::min<std::size_t>({std::size_t{8}, std::size_t{hardware}, selections.size()}) : 1;
  std::atomic<std::size_t> next{0};
  if (threads <= 1) {
    work(next);
  } else {
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(work, std::ref(next));
    for (std::thread& t : pool) t.join();
  }
  return threads;
}

// ---- Phase "plan memory" ----

// Each value's first_step (its producer; -1 for inputs) and last_step (its last reader; outputs: the number of
// steps). A view keeps its root alive as long as itself.
void compute_lifetimes(std::vector<PlanValue>& values, const std::vector<PlanStep>& steps,
                       const std::vector<int>& inputs, const std::vector<int>& outputs) {
  const int num_steps = static_cast<int>(steps.size());
  auto root = [&](int id) {
    while (values[id].view_of >= 0) id = values[id].view_of;
    return id;
  };
  for (int s = 0; s < num_steps; ++s) {
    const PlanStep& step = steps[s];
    for (int id : step.outputs) {
      if (id >= 0) values[id].first_step = s;
    }
    std::vector<int> reads = step.inputs;
    reads.insert(reads.end(), step.reference_inputs.begin(), step.reference_inputs.end());
    for (int id : reads) {
      if (id < 0) continue;
      const int r = root(id);
      values[r].last_step = std::max(values[r].last_step, s);
      values[id].last_step = std::max(values[id].last_step, s);
    }
  }
  for (int id : outputs) {
    values[root(id)].last_step = num_steps;
    values[id].last_step = num_steps;
  }
  for (int id : inputs) values[id].first_step = -1;
}

// Views of planned values share the slot, from their offset in it (Note [Views at an offset]).
void place_views(std::vector<PlanValue>& values) {
  for (PlanValue& v : values) {
    if (v.view_of < 0) continue;
    std::size_t offset = 0;
    int r = static_cast<int>(&v - values.data());
    for (; values[r].view_of >= 0; r = values[r].view_of) offset += values[r].view_offset;
    const PlanValue& root_value = values[r];
    v.planned = root_value.planned;
    v.offset = root_value.offset + offset;
    if (offset == 0) {
      v.bytes = root_value.bytes;
    } else {
      std::size_t elements = 1;
      for (std::int64_t d : v.type.sizes()) elements *= static_cast<std::size_t>(d);
      v.bytes = elements * dtype_size(v.type.dtype);
    }
  }
}

// The memory plan. Planned: inputs and values produced by static kernel steps (views share their root's slot), at
// offsets of one arena; reference and dynamic steps allocate at run time.
MemoryPlan plan_memory(std::vector<PlanValue>& values, const std::vector<PlanStep>& steps, Device device) {
  MemoryPlan mem;
  std::vector<int> planned;
  for (std::size_t id = 0; id < values.size(); ++id) {
    PlanValue& v = values[id];
    if (v.kind == PlanValue::Kind::kConstant) {
      mem.constant_bytes += v.constant.nbytes();
      continue;
    }
    if (v.view_of >= 0) continue;
    bool produced_static = v.kind == PlanValue::Kind::kInput;
    if (v.first_step >= 0) {
      const PlanStep& producer = steps[v.first_step];
      produced_static = producer.kind == PlanStep::Kind::kKernel && !producer.dynamic;
    }
    if (!produced_static || !v.type.fully_known()) {
      ++mem.dynamic_values;
      continue;
    }
    v.planned = true;
    v.bytes = static_cast<std::size_t>(TensorDesc::contiguous(v.type.sizes(), v.type.dtype, device).numel()) *
              dtype_size(v.type.dtype);
    if (v.last_step < 0) v.last_step = v.first_step;  // produced but never read (an unused output of a kernel)
    mem.unshared_bytes += align_up(v.bytes);
    planned.push_back(static_cast<int>(id));
  }
  mem.planned_values = planned.size();
  mem.arena_bytes = assign_offsets(values, planned);
  for (const PlanStep& s : steps) {
    if (s.dispatch && s.dispatch->plan) {
      mem.workspace_bytes = std::max(mem.workspace_bytes, s.dispatch->plan->workspace_bytes());
    }
  }
  mem.workspace_bytes = align_up(mem.workspace_bytes);
  place_views(values);
  return mem;
}

// OutOfMemoryError when the plan needs more than ExecutionPolicy.memory_limit (PlanOptions::memory_limit).
void check_memory_limit(const MemoryPlan& mem, const PlanOptions& options,
                        const std::vector<std::vector<std::int64_t>>& input_shapes) {
  if (options.memory_limit == 0 || mem.peak_bytes() <= options.memory_limit) return;
  std::string shapes;
  for (const auto& shape : input_shapes) shapes += detail::shape_str(shape, ",");
  throw OutOfMemoryError(detail::str_cat("the plan for input shapes ", shapes, " needs ", mib(mem.peak_bytes()), " (",
                                         mem.str(), "), more than ExecutionPolicy.memory_limit = ",
                                         mib(static_cast<std::size_t>(options.memory_limit))));
}

}  // namespace

// The pipeline, one phase after another; each phase's time goes to build_phases_ (Note [Build phases]).
std::shared_ptr<const CapturePlan> CapturePlan::build(const Graph& graph,
                                                      const std::vector<std::vector<std::int64_t>>& input_shapes,
                                                      const PlanOptions& options) {
  XPURT_CHECK(options.dispatcher != nullptr, "CapturePlan::build needs a dispatcher");
  std::shared_ptr<CapturePlan> plan(new CapturePlan());
  detail::PhaseClock clock(&plan->build_phases_);
  plan->device_ = options.device;
  plan->compute_float_ = options.compute_float;
  plan->memory_limit_ = options.memory_limit;
  plan->dispatcher_ = options.dispatcher;
  const Device device = options.device;
  Graph& g = plan->graph_;
  g = graph;

  // 1. Specialise shapes: the graph copied, its inputs fitted to `input_shapes`, its floats in the compute type.
  refuse_host_values(g, device);
  specialise_inputs(g, input_shapes);
  if (options.compute_float != DType::kFloat32) convert_precision(g, options.compute_float);
  const runtime::InferOptions infer_options = inference_options(options);
  clock.mark("prepare");

  // 2. Optimise: type inference, constant folding and the graph passes (each a phase of its own), then where the
  //    plan ends (Note [Segmented plans]).
  plan->pass_notes_ = runtime::optimize(g, infer_options, options.disabled_passes, &plan->build_phases_);
  clock.restart();
  plan->boundary_ = runtime::split_segments(g, options);
  clock.mark("segments");

  // 3. Lower: every node to a kernel, view or reference step; the kernel steps' outputs inferred.
  StepLowering lowering(g, options, plan->values_, plan->steps_);
  lowering.add_inputs(plan->inputs_);
  std::vector<Selection> selections = lowering.lower_nodes();
  clock.mark("lowering");

  // 4. Select kernels (Note [Parallel kernel selection]). Several threads: the wall time, then each backend's
  //    thread time; one thread: each backend's time says it all.
  const std::size_t threads = select_kernels(selections, *options.dispatcher, device);
  if (threads > 1) {
    clock.mark(detail::str_cat("kernel selection (", threads, " threads)"));
  } else {
    clock.restart();
  }
  for (const auto& [backend, ms] : lowering.take_selections(selections)) {
    plan->build_phases_.push_back({"kernel selection (" + backend + (threads > 1 ? "), thread time" : ")"), ms});
  }
  lowering.refuse_unsupported();
  lowering.add_outputs(plan->outputs_);

  // 5. Plan memory: lifetimes, then one arena with offsets reused across lifetimes that do not overlap.
  compute_lifetimes(plan->values_, plan->steps_, plan->inputs_, plan->outputs_);
  plan->memory_ = plan_memory(plan->values_, plan->steps_, device);
  check_memory_limit(plan->memory_, options, input_shapes);
  clock.mark("lifetimes and memory plan");

  // 6. Constants on the device, shared with the session's other plans (Note [Constants shared between plans]);
  // capture itself is GraphExec's, on a plan's first runs (graph_exec.h).
  if (device.is_cuda()) {
    for (PlanValue& v : plan->values_) {
      if (v.kind != PlanValue::Kind::kConstant) continue;
      v.constant = options.constants ? options.constants->get(v.constant, device) : v.constant.to(device);
    }
    clock.mark("constants to the device");
  }
  return plan;
}

// Note [Constants shared between plans]
// A native session builds a plan per input-shape signature, and each plan copied every constant it reads to the
// device: a session that met many shapes held its weights once per plan. On an H200 a 1.2 B-parameter Llama (2.8 GB
// of float16 weights) held 8.6 GiB (weights and arenas) after the plans of batch 1 (prefill and decode), 31.6 GiB
// after those of batch 64, and continuous batching, whose decode steps have a new shape whenever the running batch
// or its longest past does, ran out of the device's 140 GB. The plans of one session now take their device constants from one cache
// (PlanOptions::constants, made by the session): a constant whose dtype, shape and bytes equal one already copied is
// that tensor. Equal bytes, not the same host tensor: the passes run per plan and rebuild some constants (qkv_fusion
// concatenates the q, k and v weights; a float16 plan converts float32 ones), and those are equal from plan to plan.
// Candidates are found by a fingerprint (dtype, shape, device and a hash of the bytes: all of them for a constant up
// to 64 KiB, else 64 windows of 1 KiB spread over it and its last KiB), so the first plan pays almost nothing; a
// candidate is then compared byte for byte with the new constant (the device copy read back), so a shared constant
// is an equal one, never a fingerprint collision. A later plan thus reads its equal constants back once instead of
// copying them up again. Constants are read-only once built (kernels take them as inputs), so sharing one tensor
// between plans, and between threads running them, is safe. The cache lives as long as the session (its plans do).
namespace {

std::uint64_t constant_fingerprint(const Tensor& host) {
  constexpr std::size_t kWhole = 64 * 1024, kWindow = 1024, kWindows = 64;
  const auto* bytes = static_cast<const unsigned char*>(host.data_ptr());
  const std::size_t n = host.nbytes();
  std::uint64_t h = detail::kFnv1aOffset ^ n;
  if (n <= kWhole) return detail::fnv1a(h, bytes, n);
  const std::size_t stride = (n - kWindow) / kWindows;
  for (std::size_t w = 0; w < kWindows; ++w) h = detail::fnv1a(h, bytes + w * stride, kWindow);
  return detail::fnv1a(h, bytes + n - kWindow, kWindow);
}

// Whether device (or host) tensor `cached` holds the bytes of host tensor `host` (same size).
bool same_bytes(const Tensor& cached, const Tensor& host) {
  const Tensor back = cached.device().is_cpu() ? cached : cached.to(Device::cpu());
  return std::memcmp(back.data_ptr(), host.data_ptr(), host.nbytes()) == 0;
}

}  // namespace

Tensor DeviceConstantCache::get(const Tensor& host, Device device) {
  if (!host.device().is_cpu()) return host.to(device);  // already somewhere else: not this cache's business
  const Tensor dense = host.contiguous();
  const std::uint64_t fingerprint = constant_fingerprint(dense);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto range = entries_.equal_range(fingerprint);
  for (auto it = range.first; it != range.second; ++it) {
    const Entry& e = it->second;
    if (e.dtype == dense.dtype() && e.shape == dense.shape() && e.device == device && same_bytes(e.tensor, dense)) {
      ++shared_;
      return e.tensor;
    }
  }
  Tensor copy = dense.to(device);
  entries_.emplace(fingerprint, Entry{dense.dtype(), dense.shape(), device, copy});
  bytes_ += copy.nbytes();
  return copy;
}

std::size_t DeviceConstantCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

std::size_t DeviceConstantCache::shared() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shared_;
}

std::size_t DeviceConstantCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace xpuruntime
