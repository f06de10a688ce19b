// GraphExec: eager execution of a CapturePlan's steps, CUDA graph capture and replay (see graph_exec.h).
#include "xpuruntime/graph_exec.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "core/node_kernels.h"
#include "core/shape_str.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/profiler.h"
#include "xpuruntime/roofline.h"
#include "xpuruntime/run_options.h"

namespace xpuruntime {
namespace {

// Copied (never moved) into a kept tensor table to undefine an entry: Note [Tensor tables kept from run to run].
const Tensor kNoTensor;

// `t`'s bytes from `offset` on, as a contiguous tensor of `shape` (Note [Views at an offset]).
Tensor view_as(const Tensor& t, const std::vector<std::int64_t>& shape, std::size_t offset = 0) {
  return Tensor::from_blob(static_cast<std::uint8_t*>(t.data_ptr()) + offset, shape, {}, t.dtype(), t.device(),
                           t.storage(), 0);
}

// What a node event says of its step: node, op_type, step, kind, kernel, backend, precision, reason (and op). A
// dynamic step's dispatch is the one made while it ran (`dynamic`, null if none).
std::vector<std::pair<std::string, ProfileArg>> step_args(const PlanStep& step, std::size_t index,
                                                          const Dispatch* dynamic, const std::string& dynamic_precision) {
  std::string kernel, backend, precision, reason, kind;
  switch (step.kind) {
    case PlanStep::Kind::kKernel: {
      kind = step.dynamic ? "dynamic kernel" : "kernel";
      const Dispatch* d = step.dynamic ? dynamic : step.dispatch.get();
      if (d != nullptr) {
        kernel = d->decision.kernel;
        backend = d->decision.backend;
        reason = d->decision.reason;
        if (!d->decision.plan_summary.empty()) reason += " [" + d->decision.plan_summary + "]";
      }
      precision = step.dynamic ? dynamic_precision : precision_name(step.desc.precision);
      break;
    }
    case PlanStep::Kind::kView:
      kind = "view";
      kernel = "view";
      backend = "-";
      reason = "a reshape of its input's bytes: no kernel, no copy";
      break;
    case PlanStep::Kind::kReference:
      kind = "reference";
      kernel = "onnx_ref";
      backend = "cpu";
      reason = "ONNX reference implementation: " + step.reason;
      break;
  }
  std::vector<std::pair<std::string, ProfileArg>> args = {
      {"node", step.node}, {"op_type", step.op_type}, {"step", static_cast<std::int64_t>(index)},
      {"kind", kind},      {"kernel", kernel},        {"backend", backend},
      {"precision", precision}, {"reason", reason}};
  if (step.kind == PlanStep::Kind::kKernel) args.emplace_back("op", step.op);
  return args;
}

// What a node event says of the step's roofline work (Note [Roofline work] in core/roofline.cpp): flops,
// floor_bytes and ceiling, and the device the ceilings are of. A view has none.
void add_work_args(std::vector<std::pair<std::string, ProfileArg>>& args, const roofline::NodeWork& work,
                   const Device& device) {
  args.emplace_back("device", device.str());
  if (!work.known()) return;
  args.emplace_back("flops", work.flops);
  args.emplace_back("floor_bytes", work.bytes);
  args.emplace_back("ceiling", work.ceiling);
}

// One step under the profiler: an NVTX range, and while recording a "node" event whose id is the CUPTI external
// correlation id of the step's launches (Note [Kernel to node correlation] in core/profiler.cpp). Built only when
// profiling; the event is recorded by finish() once the step has run (a failed step leaves none).
class StepScope {
 public:
  StepScope(std::uint32_t profiling, const PlanStep& step) : recording_((profiling & profiler::kRecording) != 0) {
    profiler::nvtx_push(step.node.c_str());
    if (recording_) {
      id_ = profiler::next_event_id();
      profiler::push_correlation(id_);
      start_ns_ = profiler::now_ns();
    }
  }
  ~StepScope() {
    if (recording_) profiler::pop_correlation();
    profiler::nvtx_pop();
  }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

  // A dynamic step's dispatch, made while it ran.
  void ran(const Dispatch& dispatch, const OpDescriptor& desc) {
    dynamic_dispatch_ = &dispatch;
    dynamic_precision_ = precision_name(desc.precision);
    if (recording_) dynamic_work_ = roofline::node_work(desc);
  }

  void finish(const PlanStep& step, std::size_t index, const std::vector<Tensor>& values, const Device& device) {
    if (!recording_) return;
    ProfileEvent e;
    e.id = id_;
    e.name = step.node;
    e.category = "node";
    e.start_ns = start_ns_;
    e.duration_ns = profiler::now_ns() - start_ns_;
    e.args = step_args(step, index, dynamic_dispatch_, dynamic_precision_);
    std::int64_t bytes = 0;
    std::vector<std::string> in_shapes, out_shapes;
    const bool shapes = profiler::record_shapes();
    auto describe = [&](int id, std::vector<std::string>& into) {
      const Tensor& t = values[id];
      if (!t.defined()) return;
      bytes += static_cast<std::int64_t>(t.nbytes());
      if (shapes) into.push_back(std::string(dtype_name(t.dtype())) + detail::shape_str(t.shape(), ","));
    };
    const std::size_t declared = step.kind == PlanStep::Kind::kReference && step.reference_node
                                     ? step.reference_node->inputs.size()
                                     : step.inputs.size();
    for (std::size_t i = 0; i < declared && i < step.inputs.size(); ++i) {
      if (step.inputs[i] >= 0) describe(step.inputs[i], in_shapes);
    }
    for (int id : step.outputs) {
      if (id >= 0) describe(id, out_shapes);
    }
    e.args.emplace_back("bytes", bytes);
    if (shapes) {
      e.args.emplace_back("input_shapes", std::move(in_shapes));
      e.args.emplace_back("output_shapes", std::move(out_shapes));
    }
    add_work_args(e.args, work(step, declared, values), step.on_host ? Device::cpu() : device);
    profiler::record(std::move(e));
  }

 private:
  // The step's roofline work: a kernel's from its descriptor, a reference node's from its op type and values.
  roofline::NodeWork work(const PlanStep& step, std::size_t declared, const std::vector<Tensor>& values) const {
    switch (step.kind) {
      case PlanStep::Kind::kKernel: return step.dynamic ? dynamic_work_ : roofline::node_work(step.desc);
      case PlanStep::Kind::kView: return {};
      case PlanStep::Kind::kReference: break;
    }
    auto descs = [&](const std::vector<int>& ids, std::size_t count) {
      std::vector<TensorDesc> out;
      for (std::size_t i = 0; i < count && i < ids.size(); ++i) {
        out.push_back(ids[i] >= 0 && values[ids[i]].defined() ? TensorDesc::of(values[ids[i]]) : TensorDesc{});
      }
      return out;
    };
    return roofline::onnx_node_work(step.op_type, descs(step.inputs, declared),
                                    descs(step.outputs, step.outputs.size()));
  }

  bool recording_;
  std::uint64_t id_ = 0;
  std::int64_t start_ns_ = 0;
  const Dispatch* dynamic_dispatch_ = nullptr;
  std::string dynamic_precision_;
  roofline::NodeWork dynamic_work_;
};

// Note [Pooled streams]
// The caching allocator keeps freed blocks per stream (a block is handed out again on the stream that freed it).
// A GraphExec that created its own stream and destroyed it with itself left its arena's and constants' blocks
// tagged with a dead stream, which no later stream asked for: a session created and destroyed 1000 times on an
// H200 grew the allocator's reserved memory by 1.8 GiB (benchmarks/soak.py). So GraphExecs take their streams
// from a pool per device and give them back (synchronized) when they are destroyed: the next GraphExec reuses the
// stream and with it the cached blocks. The pool holds at most as many streams as GraphExecs ever lived at once.
std::mutex& stream_pool_mutex() {
  static std::mutex m;
  return m;
}

std::map<int, std::vector<std::unique_ptr<Stream>>>& stream_pool() {
  static auto* pool = new std::map<int, std::vector<std::unique_ptr<Stream>>>();  // never destroyed: see below
  return *pool;
}

std::unique_ptr<Stream> take_stream(Device device) {
  {
    std::lock_guard<std::mutex> lock(stream_pool_mutex());
    auto& free = stream_pool()[device.index];
    if (!free.empty()) {
      std::unique_ptr<Stream> s = std::move(free.back());
      free.pop_back();
      return s;
    }
  }
  return std::make_unique<Stream>(Stream::create(device));
}

// The pool outlives every GraphExec (it is leaked on purpose: streams destroyed at exit would race the CUDA
// runtime's own teardown).
void return_stream(std::unique_ptr<Stream> stream) {
  const int index = stream->view().device.index;
  std::lock_guard<std::mutex> lock(stream_pool_mutex());
  stream_pool()[index].push_back(std::move(stream));
}

// Note [Errors name their node]
// An error raised while a step runs (a launch that fails, an allocation, a collective that times out, the reference
// library's own checks) is re-raised with the same type, prefixed with the node, its op and its kernel. A kernel
// fault is asynchronous: it surfaces at the run's synchronization, after every step was launched;
// XPURT_SYNC_STEPS=1 synchronizes after each step of an eager run (not inside a CUDA graph capture, which cannot be
// synchronized) so that the fault names its node.
[[noreturn]] void rethrow_at(const PlanStep& step) {
  const std::string kernel = step.dispatch                            ? step.dispatch->decision.kernel
                             : step.kind == PlanStep::Kind::kReference ? std::string("onnx reference")
                                                                       : std::string("chosen at run time");
  const std::string where = detail::str_cat("node '", step.node, "' (", step.op_type, ", kernel ", kernel, "): ");
  auto with = [&](const std::exception& e) {
    const std::string what = e.what();
    return what.rfind("node '", 0) == 0 ? what : where + what;
  };
  try {
    throw;
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(with(e));
  } catch (const CudaError& e) {
    throw CudaError(with(e), e.cuda_status());
  } catch (const DistributedError& e) {
    throw DistributedError(with(e), e.timed_out());
  } catch (const RunTerminatedError& e) {
    throw RunTerminatedError(with(e), e.timed_out());
  } catch (const UnsupportedOperationError& e) {
    throw UnsupportedOperationError(with(e));
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(with(e));
  } catch (const InvalidTypeError& e) {
    throw InvalidTypeError(with(e));
  } catch (const XpuRuntimeError& e) {
    throw XpuRuntimeError(with(e), e.code());
  }
}

// The run's one synchronization; a kernel fault found there says how to find its node.
void finish_run(const StreamView& stream, const CapturePlan& plan, bool replayed) {
  try {
    stream.synchronize();
  } catch (const CudaError& e) {
    throw CudaError(detail::str_cat("a kernel of this plan (", plan.steps().size(), " steps on ", plan.device().str(),
                                    replayed ? ", replayed from its CUDA graph" : "", ") failed: ", e.what(),
                                    "; XPURT_SYNC_STEPS=1 checks each step of an eager run "
                                    "(ExecutionPolicy(cuda_graphs=False)) and names the failing node"),
                    e.cuda_status());
  }
}

// Note [Failed captures]
// A step that cannot be captured (a kernel that synchronizes, allocates outside the graph's pool, or fails) ends the
// capture: the capture is closed and dropped, and the run raises the step's error, typed and naming the node (Note
// [Errors name their node]). The executor keeps no graph: an out-of-memory is transient, so the next run tries to
// capture again; any other failure is recorded (GraphExec::capture_failure, explain()) and the executor runs the
// plan eagerly from then on. Nothing sticky is left on the device: the session stays usable.
struct StepFault {
  std::mutex mutex;
  std::string node;
  std::string kind;
};

StepFault& step_fault() {
  static StepFault fault;
  return fault;
}

// The injected fault for `node`, consumed; empty when none.
std::string take_step_fault(const std::string& node) {
  StepFault& f = step_fault();
  std::lock_guard<std::mutex> lock(f.mutex);
  if (f.node.empty() || f.node != node) return {};
  f.node.clear();
  return f.kind;
}

bool sync_steps() {
  static const bool on = [] {
    const char* v = std::getenv("XPURT_SYNC_STEPS");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}

}  // namespace

GraphExec::GraphExec(std::shared_ptr<const CapturePlan> plan, GraphExecOptions options)
    : plan_(std::move(plan)), options_(options) {
  XPURT_CHECK(plan_ != nullptr, "GraphExec needs a plan");
  const Device device = plan_->device();
  StreamView stream;
  if (device.is_cuda()) {
    stream_ = take_stream(device);  // Note [Pooled streams]
    stream = stream_->view();
  }
  const MemoryPlan& mem = plan_->memory();
  if (mem.arena_bytes > 0) arena_ = Tensor::empty({static_cast<std::int64_t>(mem.arena_bytes)}, DType::kUInt8, device, &stream);
  if (mem.workspace_bytes > 0) {
    workspace_ = Tensor::empty({static_cast<std::int64_t>(mem.workspace_bytes)}, DType::kUInt8, device, &stream);
  }
  const auto& values = plan_->values();
  slots_.resize(values.size());
  replay_values_.resize(values.size());
  for (std::size_t id = 0; id < values.size(); ++id) {
    const PlanValue& v = values[id];
    if (!v.planned) continue;
    auto* base = static_cast<std::uint8_t*>(arena_.data_ptr()) + v.offset;
    slots_[id] = Tensor::from_blob(base, v.type.sizes(), {}, v.type.dtype, device, arena_.storage(), v.bytes);
  }
  direct_outputs_ = plan_->direct_outputs();  // Note [Outputs written where the caller gets them]
  for (const PlanStep& step : plan_->steps()) has_boxed_ |= step.kind == PlanStep::Kind::kReference;
  for (int id : plan_->inputs()) has_boxed_ |= !values[id].type.is_tensor();
  if (has_boxed_) boxed_.resize(values.size());
  if (!has_boxed_) appends_ = plan_->cache_appends();  // Note [Cache appended in place]
  append_of_step_.assign(plan_->steps().size(), -1);
  for (std::size_t a = 0; a < appends_.size(); ++a) append_of_step_[appends_[a].step] = static_cast<int>(a);
  appending_.assign(appends_.size(), 0);
  if (!appends_.empty()) past_in_place_.assign(plan_->inputs().size(), 0);
  if (device.is_cuda()) stream.synchronize();
}

GraphExec::~GraphExec() {
  profiler::forget_graph_labels(graph_labels_);
  if (stream_) {
    bool healthy = true;
    try {
      graph_.reset();  // its private pool's blocks go back before the stream does
      stream_->synchronize();
    } catch (...) {
      // Destructors do not throw; a failed device is reported by the next call that uses it.
      healthy = false;
    }
    // The arena and workspace are freed after this body, stream-ordered on this stream: it must stay alive, so it
    // goes back to the pool (Note [Pooled streams]) rather than being destroyed; a stream of a failed device is not
    // handed out again.
    if (healthy) {
      return_stream(std::move(stream_));
    } else {
      (void)stream_.release();  // leaked: destroying it could fail the same way
    }
  }
}

bool GraphExec::graph_captured() const { return graph_ && graph_->is_instantiated(); }

void GraphExec::inject_step_fault_for_testing(const std::string& node, const std::string& kind) {
  XPURT_CHECK(node.empty() || kind == "capture" || kind == "oom", "inject_step_fault_for_testing: kind must be "
              "'capture' or 'oom', got '", kind, "'");
  StepFault& f = step_fault();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.node = node;
  f.kind = kind;
}

void GraphExec::bind_inputs(const std::vector<Tensor>& inputs, std::vector<Tensor>& values) {
  const auto& plan_values = plan_->values();
  const auto& ids = plan_->inputs();
  XPURT_CHECK(inputs.size() == ids.size(), "the plan takes ", ids.size(), " inputs, got ", inputs.size());
  const Device device = plan_->device();
  const bool fixed_addresses = graph_ != nullptr || (options_.use_cuda_graph && plan_->capturable());
  const StreamView stream = stream_ ? stream_->view() : StreamView{};
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const PlanValue& v = plan_values[ids[i]];
    if (!v.type.is_tensor()) {
      XPURT_CHECK_TYPE(boxed_[ids[i]].defined(), "input '", v.name, "' is ", v.type.type_str(),
                       ": feed it through run_values");
      continue;  // bound by run_values
    }
    const Tensor& t = inputs[i];
    XPURT_CHECK(t.defined(), "input '", v.name, "' is missing");
    XPURT_CHECK_TYPE(t.dtype() == v.type.dtype, "input '", v.name, "' expects ", dtype_name(v.type.dtype), ", got ",
                     dtype_name(t.dtype()));
    XPURT_CHECK(t.shape() == v.type.sizes(), "input '", v.name, "' expects shape ", detail::shape_str(v.type.sizes(), ","),
                " (the plan's), got ", detail::shape_str(t.shape(), ","));
    if (!past_in_place_.empty() && past_in_place_[i]) {  // Note [Appends of a run]: read where it lies
      values[ids[i]] = t;
    } else if (!fixed_addresses && t.device() == device && t.is_contiguous()) {
      values[ids[i]] = t;  // zero-copy
    } else if (slots_[ids[i]].defined()) {
      slots_[ids[i]].copy_from(t, stream_ ? &stream : nullptr, /*non_blocking=*/true);
      values[ids[i]] = slots_[ids[i]];
    } else {
      values[ids[i]] = t.to(device).contiguous();
    }
  }
}

// Note [Appends of a run]
// A candidate append (Note [Cache appended in place] in capture_plan.cpp) runs in place when its present output is
// bound (`into`) to a contiguous tensor of the plan's shape and dtype on the plan's device whose leading part along the
// axis is the fed past: the same address of the first element and the same strides (each past element then sits
// where the present keeps it), the past not empty. The past is then bound as it is (no copy into the arena, even a
// strided view), the present value is the bound tensor, and the Concat step copies its other inputs into that tensor
// after the past. Any other binding runs the Concat. A CUDA graph bakes addresses in: graph_appends_ holds the
// presents it was captured with (null for a Concat run as such), and a run whose appends differ drops the graph and
// captures again (the generator keeps its cache buffers for a whole generation, so a generation captures at most once).
bool GraphExec::prepare_appends(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into) {
  bool any = false;
  for (std::size_t a = 0; a < appends_.size(); ++a) {
    const CacheAppend& append = appends_[a];
    bool on = into != nullptr && append.output < into->size() && append.input < inputs.size();
    if (on) {
      const Tensor& present = (*into)[append.output];
      const Tensor& past = inputs[append.input];
      const ValueType& declared = plan_->values()[static_cast<std::size_t>(plan_->outputs()[append.output])].type;
      on = present.defined() && past.defined() && past.numel() > 0 && present.device() == plan_->device() &&
           past.device() == present.device() && present.dtype() == declared.dtype && past.dtype() == present.dtype() &&
           present.shape() == declared.sizes() && present.is_contiguous() && past.data_ptr() == present.data_ptr() &&
           past.strides() == present.strides() && past.dim() == present.dim();
      for (int d = 0; on && d < present.dim(); ++d) {
        const std::int64_t p = past.shape()[static_cast<std::size_t>(d)];
        const std::int64_t q = present.shape()[static_cast<std::size_t>(d)];
        on = d == append.axis ? p <= q : p == q;
      }
    }
    appending_[a] = on ? 1 : 0;
    any |= on;
  }
  std::fill(past_in_place_.begin(), past_in_place_.end(), 0);
  for (std::size_t a = 0; a < appends_.size(); ++a) {
    if (appending_[a]) past_in_place_[appends_[a].input] = 1;
  }
  return any;
}

void GraphExec::bind_appends(const std::vector<Tensor>* into, std::vector<Tensor>& values) const {
  for (std::size_t a = 0; a < appends_.size(); ++a) {
    if (!appending_[a]) continue;
    values[static_cast<std::size_t>(plan_->outputs()[appends_[a].output])] = (*into)[appends_[a].output];
  }
}

// The Concat of `append` as an append: its inputs after the past copied into the bound present, one after the other,
// from the past's length on along the axis.
void GraphExec::run_append(const CacheAppend& append, std::vector<Tensor>& values, const StreamView& stream) const {
  const PlanStep& step = plan_->steps()[append.step];
  const Tensor& present = values[static_cast<std::size_t>(step.outputs[0])];
  const auto axis = static_cast<std::size_t>(append.axis);
  std::int64_t at = values[static_cast<std::size_t>(step.inputs[0])].shape()[axis];
  const auto element = static_cast<std::int64_t>(present.element_size());
  for (std::size_t i = 1; i < step.inputs.size(); ++i) {
    const Tensor& part = values[static_cast<std::size_t>(step.inputs[i])];
    XPURT_INTERNAL_ASSERT(part.defined(), "append of an undefined value in step ", step.node);
    std::vector<std::int64_t> shape = present.shape();
    shape[axis] = part.shape()[axis];
    if (shape[axis] == 0) continue;
    auto* base = static_cast<std::uint8_t*>(present.data_ptr()) + at * present.strides()[axis] * element;
    Tensor slab =
        Tensor::from_blob(base, shape, present.strides(), present.dtype(), present.device(), present.storage());
    slab.copy_from(part, stream_ ? &stream : nullptr, /*non_blocking=*/true);
    at += shape[axis];
  }
}

// Long function: the interpreter loop of every run, one switch over the three step kinds with the per-step
// state (stop check, profiling scope, labels, Note [Errors name their node]) around it; its cases read the
// executor's private slots, workspace and boxed values (splitting them means new members in graph_exec.h).
void GraphExec::execute_steps(std::vector<Tensor>& values, const StreamView& stream, std::uint32_t profiling,
                              bool labelled) {
  const auto& plan_values = plan_->values();
  const Device device = plan_->device();
  const auto& steps = plan_->steps();
  // What the steps allocate beyond the plan (dynamic and reference steps' outputs) is charged to the rest of
  // ExecutionPolicy.memory_limit (Note [Run memory budgets] in memory_manager.h).
  std::optional<MemoryBudgetScope> budget;
  if (plan_->memory_limit() != 0) {
    const std::size_t limit = static_cast<std::size_t>(plan_->memory_limit());
    const std::size_t peak = plan_->memory().peak_bytes();
    budget.emplace(std::make_shared<MemoryBudget>(limit > peak ? limit - peak : 0, std::function<std::string()>([=] {
      return detail::str_cat("ExecutionPolicy.memory_limit = ", format_bytes(limit), " less the plan's peak of ",
                             format_bytes(peak));
    })));
  }
  const RunStop* stop = RunStop::current();  // Note [Stopping a run] (run_options.h)
  step_inputs_.resize(steps.size());
  step_outputs_.resize(steps.size());
  for (std::size_t index = 0; index < steps.size(); ++index) {
    const PlanStep& step = steps[index];
    if (stop != nullptr) {
      stop->check("before node '", step.node, "' (", step.op_type, ", step ", index + 1, " of ", steps.size(), ")");
    }
    std::optional<StepScope> scope;
    if (profiling) scope.emplace(profiling, step);
    std::optional<profiler::GraphLabelScope> label;
    if (labelled) label.emplace(graph_labels_[index]);
    if (const std::string fault = take_step_fault(step.node); !fault.empty()) {  // Note [Failed captures]
      try {
        if (fault == "oom") throw OutOfMemoryError("out of memory (injected by a test)");
        if (capturing_) {
          stream.synchronize();  // illegal while capturing: what a kernel that synchronizes does
        }
      } catch (const XpuRuntimeError&) {
        rethrow_at(step);
      }
    }
    try {  // Note [Errors name their node]
      switch (step.kind) {
        case PlanStep::Kind::kView: {
          const Tensor& in = values[step.inputs[0]];
          XPURT_INTERNAL_ASSERT(in.defined(), "view of an undefined value in step ", step.node);
          const int out = step.outputs[0];
          values[out] = view_as(in.is_contiguous() ? in : in.contiguous(), plan_values[out].type.sizes(),
                              plan_values[out].view_offset);
          break;
        }
        case PlanStep::Kind::kKernel: {
          if (append_of_step_[index] >= 0 && appending_[static_cast<std::size_t>(append_of_step_[index])]) {
            run_append(appends_[static_cast<std::size_t>(append_of_step_[index])], values, stream);
            break;
          }
          std::vector<Tensor>& inputs = step_inputs_[index];  // Note [Tensor tables kept from run to run]
          inputs.resize(step.inputs.size());
          for (std::size_t k = 0; k < step.inputs.size(); ++k) {
            const int id = step.inputs[k];
            // A sequence or optional where a kernel takes a tensor (a SequenceConstruct feeding a Concat, made by
            // the structural fuzzer): the kernel read an undefined tensor.
            XPURT_CHECK_TYPE(!has_boxed_ || id < 0 || !boxed_[id].defined(), "node '", step.node, "' (",
                             step.op_type, "): an input is ", boxed_[id < 0 ? 0 : id].str(), ", but ", step.op_type,
                             " takes tensors");
            if (id < 0) {
              inputs[k] = kNoTensor;
            } else {
              inputs[k] = values[id];
            }
          }
          if (!step.dynamic) {
            std::vector<Tensor>& outputs = step_outputs_[index];
            outputs.resize(step.desc.outputs.size());
            for (std::size_t o = 0; o < outputs.size(); ++o) {
              const int id = o < step.outputs.size() ? step.outputs[o] : -1;
              if (id >= 0 && slots_[id].defined() && !direct_outputs_[static_cast<std::size_t>(id)]) {
                outputs[o] = slots_[id];
              } else {
                outputs[o] = Tensor::empty(step.desc.outputs[o].shape, step.desc.outputs[o].dtype, device,
                                           stream_ ? &stream : nullptr);
              }
            }
            if (!device.is_cuda()) {
              for (std::size_t i = 0; i < inputs.size(); ++i) {
                if (!inputs[i].defined()) continue;
                XPURT_CHECK(inputs[i].shape() == step.desc.inputs[i].shape, "node '", step.node, "': input ", i,
                            " has shape ", detail::shape_str(inputs[i].shape(), ","),
                            " at run time but the model declared ", detail::shape_str(step.desc.inputs[i].shape, ","));
                if (!inputs[i].is_contiguous()) inputs[i] = inputs[i].contiguous();
              }
            }
            KernelLaunch launch;
            launch.desc = &step.desc;
            launch.inputs = inputs.data();
            launch.num_inputs = inputs.size();
            launch.outputs = outputs.data();
            launch.num_outputs = outputs.size();
            launch.stream = stream;
            launch.workspace = workspace_.defined() ? workspace_.data_ptr() : nullptr;
            launch.workspace_bytes = workspace_.defined() ? static_cast<std::size_t>(workspace_.nbytes()) : 0;
            step.dispatch->plan->run(launch);
            if (device.is_cuda() && sync_steps() && !capturing_) stream.synchronize();
            for (std::size_t o = 0; o < outputs.size() && o < step.outputs.size(); ++o) {
              if (step.outputs[o] >= 0) values[step.outputs[o]] = outputs[o];
            }
          } else {
            for (auto& t : inputs) {
              if (t.defined() && !t.is_contiguous()) t = t.contiguous();
            }
            std::shared_ptr<const Dispatch> dispatch;
            OpDescriptor desc;
            try {
              desc = make_op_descriptor(step.op, inputs, step.attrs, plan_->dispatcher()->exec_policy());
              dispatch = plan_->dispatcher()->select(desc);
            } catch (const XpuRuntimeError&) {
              if (!step.reference_node) throw;
              // The registry op refuses what this run gives it (a dtype its kernels lack, e.g. an int64 reduction
              // of a data-dependent shape): the reference library runs the node, with ONNX's full semantics.
              std::vector<Tensor> ref_inputs;
              for (int id : step.reference_inputs) ref_inputs.push_back(id < 0 ? Tensor() : values[id]);
              std::vector<Tensor> outs = onnx_ref::run_node(*step.reference_node, step.opset, ref_inputs);
              for (std::size_t o = 0; o < outs.size() && o < step.outputs.size(); ++o) {
                if (step.outputs[o] >= 0) values[step.outputs[o]] = outs[o];
              }
              break;
            }
            std::vector<Tensor> outputs;
            for (const auto& od : desc.outputs) outputs.push_back(Tensor::empty(od.shape, od.dtype, device));
            dispatch->plan->execute(desc, inputs, outputs, stream);
            if (scope) scope->ran(*dispatch, desc);
            for (std::size_t o = 0; o < outputs.size() && o < step.outputs.size(); ++o) {
              if (step.outputs[o] >= 0) values[step.outputs[o]] = outputs[o];
            }
          }
          break;
        }
        case PlanStep::Kind::kReference: {
          // A value is a tensor in `values` or a sequence/optional in boxed_ (Note [Sequence and optional values]).
          // Note [Mixed execution]: a CUDA plan's host step reads host copies of its inputs (after the stream has
          // finished producing them) and its outputs go back to the device.
          if (step.on_host) stream.synchronize();
          auto value_of = [&](int id) -> Value {
            if (boxed_[id].defined()) return boxed_[id];
            const Tensor& t = values[id];
            return Value(step.on_host && t.defined() && t.device().is_cuda() ? t.to(Device::cpu()) : t);
          };
          const std::size_t declared = step.reference_node->inputs.size();
          std::vector<Value> inputs;
          inputs.reserve(declared);
          for (std::size_t i = 0; i < declared; ++i) {
            const int id = step.inputs[i];
            inputs.push_back(id < 0 ? Value() : value_of(id));
          }
          onnx_ref::ValueLookup outer;
          if (!step.implicit_inputs.empty()) {
            outer = [&](const std::string& name) -> Value {
              for (std::size_t i = 0; i < step.implicit_inputs.size(); ++i) {
                if (step.implicit_inputs[i] == name) return value_of(step.inputs[declared + i]);
              }
              return Value();
            };
          }
          std::vector<Value> outputs = onnx_ref::run_node_values(*step.reference_node, step.opset, inputs, outer);
          for (std::size_t o = 0; o < step.outputs.size(); ++o) {
            const int id = step.outputs[o];
            if (id < 0) continue;
            XPURT_CHECK(o < outputs.size() && outputs[o].defined(), "node '", step.node, "' (", step.op_type,
                        ") did not produce its output ", o);
            if (outputs[o].is_tensor()) {
              values[id] = step.on_host ? outputs[o].tensor().to(device, &stream) : outputs[o].tensor();
              boxed_[id] = Value();
            } else {
              values[id] = Tensor();
              boxed_[id] = std::move(outputs[o]);
            }
          }
          break;
        }
      }
    } catch (const XpuRuntimeError&) {
      rethrow_at(step);
    }
    if (scope) scope->finish(step, index, values, device);
  }
}

void GraphExec::register_graph_labels() {
  if (!graph_labels_.empty()) return;
  const auto& steps = plan_->steps();
  const auto& plan_values = plan_->values();
  graph_labels_.reserve(steps.size());
  for (std::size_t index = 0; index < steps.size(); ++index) {
    const PlanStep& step = steps[index];
    ProfileEvent proto;
    proto.name = step.node;
    proto.category = "node";
    proto.args = step_args(step, index, nullptr, "");
    std::int64_t bytes = 0;
    std::vector<std::string> in_shapes, out_shapes;
    auto describe = [&](int id, std::vector<std::string>& into) {
      if (id < 0) return;
      const ValueType& type = plan_values[id].type;
      std::int64_t n = 1;
      for (std::int64_t d : type.sizes()) n *= d;
      bytes += n * static_cast<std::int64_t>(dtype_size(type.dtype));
      into.push_back(std::string(dtype_name(type.dtype)) + detail::shape_str(type.sizes(), ","));
    };
    for (int id : step.inputs) describe(id, in_shapes);
    for (int id : step.outputs) describe(id, out_shapes);
    proto.args.emplace_back("bytes", bytes);
    proto.args.emplace_back("input_shapes", std::move(in_shapes));
    proto.args.emplace_back("output_shapes", std::move(out_shapes));
    // Replayed steps are the captured ones: static kernels (a graph holds no dynamic or reference step).
    const bool static_kernel = step.kind == PlanStep::Kind::kKernel && !step.dynamic;
    add_work_args(proto.args, static_kernel ? roofline::node_work(step.desc) : roofline::NodeWork{}, plan_->device());
    graph_labels_.push_back(profiler::register_graph_label(std::move(proto)));
  }
}

std::vector<Tensor> GraphExec::collect_outputs(const std::vector<Tensor>& values, const StreamView& stream,
                                               const std::vector<Tensor>* into) {
  std::vector<Tensor> outputs;
  const auto& plan_values = plan_->values();
  for (std::size_t k = 0; k < plan_->outputs().size(); ++k) {
    const int id = plan_->outputs()[k];
    const PlanValue& v = plan_values[id];
    const Tensor& t = v.kind == PlanValue::Kind::kConstant ? v.constant : values[id];
    if (!t.defined() && has_boxed_ && boxed_[id].defined()) {
      outputs.emplace_back();  // a sequence or optional: run_values reads it from boxed_
      continue;
    }
    XPURT_INTERNAL_ASSERT(t.defined(), "output '", v.name, "' was not computed");
    if (into != nullptr && (*into)[k].defined()) {
      Tensor out = (*into)[k];
      XPURT_CHECK(out.shape() == t.shape(), "output '", v.name, "' is bound to a tensor of shape ",
                  detail::shape_str(out.shape(), ","), " but the run produced ", detail::shape_str(t.shape(), ","));
      // An append in place wrote the bound tensor itself (Note [Appends of a run]).
      if (out.data_ptr() != t.data_ptr() || out.strides() != t.strides()) {
        out.copy_from(t, stream_ ? &stream : nullptr, /*non_blocking=*/true);
      }
      outputs.push_back(out);
      continue;
    }
    // Values in the arena (and inputs or constants passed through) are copied: the next run reuses the arena.
    const bool owned_by_run = direct_outputs_[static_cast<std::size_t>(id)] ||
                              (!v.planned && v.kind == PlanValue::Kind::kIntermediate &&
                               (v.view_of < 0 || !plan_values[v.view_of].planned));
    if (owned_by_run && t.is_contiguous()) {
      outputs.push_back(t);
      continue;
    }
    Tensor out = Tensor::empty(t.shape(), t.dtype(), t.device(), stream_ ? &stream : nullptr);
    out.copy_from(t, stream_ ? &stream : nullptr, /*non_blocking=*/true);
    outputs.push_back(out);
  }
  return outputs;
}

std::vector<Tensor> GraphExec::run(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into) {
  // Note [Sticky CUDA errors]: a device lost to an earlier fault is refused here, with the cause.
  if (plan_->device().is_cuda()) DeviceManager::instance().check_device(plan_->device());
  if (plan_->boundary()) return run_segmented(inputs, into);
  if (!has_boxed_) return run_bound(inputs, into);
  std::vector<Tensor> outputs;
  try {
    outputs = run_bound(inputs, into);
    for (int id : plan_->outputs()) {
      XPURT_CHECK_TYPE(!boxed_[id].defined(), "output '", plan_->values()[id].name, "' is ", boxed_[id].str(),
                       ", not a tensor: run the model with run_values");
    }
  } catch (...) {
    std::fill(boxed_.begin(), boxed_.end(), Value());
    throw;
  }
  std::fill(boxed_.begin(), boxed_.end(), Value());
  return outputs;
}

// Note [Segmented plans]: this segment, one read of its counts (and of the values computed from data that the next
// segment takes as constants), the bounded outputs cut to their counts, then the next segment's plan for those
// shapes, run by a GraphExec of its own (which captures and replays it when the same shapes come again).
std::vector<Tensor> GraphExec::run_segmented(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into) {
  const SegmentBoundary& boundary = *plan_->boundary();
  const std::vector<Tensor> first = run_bound(inputs, nullptr);  // returns when its outputs are ready
  std::vector<std::int64_t> counts;
  if (boundary.counts_output >= 0) {
    const Tensor host = first[boundary.counts_output].to(Device::cpu());
    const auto* p = static_cast<const std::int64_t*>(host.data_ptr());
    counts.assign(p, p + host.numel());
  }
  const StreamView stream = stream_ ? stream_->view() : StreamView{};
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, Tensor>> host;
  for (const SegmentBoundary::Carried& c : boundary.carried) {
    const Tensor& source = c.source >= 0 ? first[static_cast<std::size_t>(c.source)]
                                         : inputs[static_cast<std::size_t>(-1 - c.source)];
    switch (c.kind) {
      case SegmentBoundary::Carried::Kind::kTensor: tensors.push_back(source); break;
      case SegmentBoundary::Carried::Kind::kHost: host.emplace_back(c.name, source.to(Device::cpu())); break;
      case SegmentBoundary::Carried::Kind::kRows:
      case SegmentBoundary::Carried::Kind::kColumns: {
        const std::int64_t n = counts.at(static_cast<std::size_t>(c.count));
        const std::int64_t rows = source.shape()[0], bound = source.shape()[1];
        const bool by_rows = c.kind == SegmentBoundary::Carried::Kind::kRows;
        XPURT_INTERNAL_ASSERT(n >= 0 && n <= (by_rows ? rows : bound), "segment boundary: count ", n,
                              " of value '", c.name, "' exceeds its bound");
        auto* base = static_cast<std::uint8_t*>(source.data_ptr());
        if (by_rows || rows == 1) {  // a prefix of the bounded output
          const std::vector<std::int64_t> shape = by_rows ? std::vector<std::int64_t>{n, bound}
                                                          : std::vector<std::int64_t>{rows, n};
          tensors.push_back(Tensor::from_blob(base, shape, {}, source.dtype(), source.device(), source.storage(),
                                              static_cast<std::size_t>(source.nbytes())));
          break;
        }
        Tensor cut = Tensor::empty({rows, n}, source.dtype(), source.device(), stream_ ? &stream : nullptr);
        const std::size_t row_bytes = static_cast<std::size_t>(n) * source.element_size();
        for (std::int64_t r = 0; r < rows && n > 0; ++r) {
          Tensor from = Tensor::from_blob(base + r * bound * static_cast<std::int64_t>(source.element_size()), {n},
                                          {}, source.dtype(), source.device(), source.storage(), row_bytes);
          auto* row = static_cast<std::uint8_t*>(cut.data_ptr()) + r * static_cast<std::int64_t>(row_bytes);
          Tensor to = Tensor::from_blob(row, {n}, {}, cut.dtype(), cut.device(), cut.storage(), row_bytes);
          to.copy_from(from, stream_ ? &stream : nullptr);
        }
        tensors.push_back(cut);
        break;
      }
    }
  }
  check_run_stop("between plan segments (Note [Segmented plans])");  // Note [Stopping a run]
  std::shared_ptr<const CapturePlan> next = boundary.next(tensors, host);
  const std::vector<Tensor> second = next_exec(next).run(tensors, nullptr);
  std::vector<Tensor> outputs;
  for (std::size_t k = 0; k < boundary.outputs.size(); ++k) {
    const int at = boundary.outputs[k];
    Tensor t = at >= 0 ? first[static_cast<std::size_t>(at)] : second[static_cast<std::size_t>(-1 - at)];
    if (into != nullptr && k < into->size() && (*into)[k].defined()) {
      Tensor out = (*into)[k];
      XPURT_CHECK(out.shape() == t.shape(), "output ", k, " is bound to a tensor of shape ",
                  detail::shape_str(out.shape(), ","), " but the run produced ", detail::shape_str(t.shape(), ","));
      out.copy_from(t, stream_ ? &stream : nullptr);
      t = out;
    }
    outputs.push_back(std::move(t));
  }
  ++runs_;
  return outputs;
}

GraphExec& GraphExec::next_exec(const std::shared_ptr<const CapturePlan>& plan) {
  for (auto it = next_.begin(); it != next_.end(); ++it) {
    if ((*it)->plan_ != plan) continue;
    next_.splice(next_.begin(), next_, it);
    return *next_.front();
  }
  next_.push_front(std::make_unique<GraphExec>(plan, options_));
  while (next_.size() > std::max<std::size_t>(plan_->boundary()->max_plans, 1)) next_.pop_back();
  return *next_.front();
}

std::vector<Value> GraphExec::run_values(const std::vector<Value>& inputs) {
  const auto& plan_values = plan_->values();
  const auto& ids = plan_->inputs();
  XPURT_CHECK(inputs.size() == ids.size(), "the plan takes ", ids.size(), " inputs, got ", inputs.size());
  XPURT_CHECK(plan_->device().is_cpu(), "sequence and optional values run on the CPU only, the plan runs on ",
              plan_->device().str());
  if (boxed_.empty()) boxed_.resize(plan_values.size());
  has_boxed_ = true;
  std::fill(boxed_.begin(), boxed_.end(), Value());
  // Tensors the caller or the plan owns: an output that is one of them is copied (as collect_outputs does).
  std::set<const Storage*> shared;
  std::vector<Tensor> tensors(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const PlanValue& v = plan_values[ids[i]];
    const Value& value = inputs[i];
    XPURT_CHECK(value.defined(), "input '", v.name, "' is missing");
    if (v.type.is_tensor()) {
      XPURT_CHECK_TYPE(value.is_tensor(), "input '", v.name, "' expects a tensor (", v.type.str(), "), got ",
                       value.str());
      tensors[i] = value.tensor();
      shared.insert(tensors[i].storage().get());
      continue;
    }
    XPURT_CHECK_TYPE(!value.is_tensor(), "input '", v.name, "' expects ", v.type.type_str(), ", got ", value.str());
    const Value& inner = value.is_optional() && value.has_element() ? value.element() : value;
    if (inner.is_sequence()) {
      for (const Tensor& t : inner.elements()) {
        XPURT_CHECK(t.device().is_cpu(), "input '", v.name, "': sequence elements must be CPU tensors, got one on ",
                    t.device().str());
        shared.insert(t.storage().get());
      }
    } else if (inner.is_tensor()) {
      XPURT_CHECK(inner.tensor().device().is_cpu(), "input '", v.name, "': the tensor in the optional must be on the "
                  "CPU, got ", inner.tensor().device().str());
      shared.insert(inner.tensor().storage().get());
    }
    boxed_[ids[i]] = value;
  }
  for (const PlanValue& v : plan_values) {
    if (v.kind == PlanValue::Kind::kConstant) shared.insert(v.constant.storage().get());
  }
  std::vector<Tensor> tensor_outputs;
  try {
    tensor_outputs = run_bound(tensors, nullptr);
  } catch (...) {
    std::fill(boxed_.begin(), boxed_.end(), Value());
    throw;
  }
  // A value with its tensors that belong to an input or a constant copied (the caller owns what it gets).
  std::function<Value(const Value&)> own = [&](const Value& v) -> Value {
    if (v.is_tensor()) {
      if (!shared.count(v.tensor().storage().get())) return v;
      Tensor copy = Tensor::empty(v.tensor().shape(), v.tensor().dtype());
      copy.copy_from(v.tensor());
      return copy;
    }
    if (v.is_sequence()) {
      std::vector<Tensor> elements;
      for (const Tensor& t : v.elements()) elements.push_back(own(t).tensor());
      return Value::sequence(std::move(elements), v.element_dtype());
    }
    return v.has_element() ? Value::optional(own(v.element())) : v;
  };
  std::vector<Value> outputs;
  for (std::size_t k = 0; k < plan_->outputs().size(); ++k) {
    const int id = plan_->outputs()[k];
    const Value& boxed = boxed_[id];
    // As the output is declared: e.g. an optional output a node filled with a tensor or a sequence. A tensor output
    // may be a sequence element fed by the caller (SequenceAt): copied too.
    outputs.push_back(onnx_ref::conform_value(own(boxed.defined() ? boxed : Value(tensor_outputs[k])),
                                              &plan_values[id].type));
  }
  std::fill(boxed_.begin(), boxed_.end(), Value());
  return outputs;
}

std::vector<Tensor> GraphExec::run_bound(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into) {
  // Note [Profiler off cost] (profiler.h): one relaxed load per run; the steps get its value.
  const std::uint32_t profiling = profiler::state();
  if (profiling == 0) return run_steps(inputs, 0, into);
  return run_profiled(inputs, profiling, into);
}

std::vector<Tensor> GraphExec::run_profiled(const std::vector<Tensor>& inputs, std::uint32_t profiling,
                                            const std::vector<Tensor>* into) {
  const bool recording = (profiling & profiler::kRecording) != 0;
  const bool captured = graph_captured();
  std::string why_not;
  const bool graph_wanted = options_.use_cuda_graph && plan_->capturable(&why_not);
  profiler::nvtx_push("xpuruntime plan run");
  const std::int64_t start = recording ? profiler::now_ns() : 0;
  const std::int64_t replays_before = replays_;
  std::vector<Tensor> outputs;
  try {
    outputs = run_steps(inputs, profiling, into);
  } catch (...) {
    profiler::nvtx_pop();
    throw;
  }
  profiler::nvtx_pop();
  if (recording) {
    ProfileEvent e;
    e.name = "plan run";
    e.category = "session";
    e.start_ns = start;
    e.duration_ns = profiler::now_ns() - start;
    std::string graph_state = replays_ > replays_before ? "replayed; nodes from CUPTI graph node ids"
                              : captured               ? "captured; run eagerly while profiling"
                              : graph_wanted      ? "not captured yet; run eagerly while profiling"
                              : !options_.use_cuda_graph ? "off"
                                                         : "not capturable: " + why_not;
    e.args = {{"device", plan_->device().str()},
              {"steps", static_cast<std::int64_t>(plan_->steps().size())},
              {"cuda_graph", graph_state},
              {"run", runs_ - 1}};
    profiler::record(std::move(e));
  }
  return outputs;
}

// Note [Tensor tables kept from run to run]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An eager run fills a table of every plan value (constants, arena slots, inputs, step outputs) and hands each kernel
// step a vector of its inputs and one of its outputs. Made afresh per run, every Tensor copied into them allocated its
// shape and stride vectors: on the tiny MobileNetV3 export on this machine's CPU, malloc and free were about a quarter
// of a run (perf, 2026-12-06). The table and the step vectors are members now, copy-assigned into from run to run (a
// Tensor's vectors keep their capacity; a move from a temporary would free it), and when a run ends every entry but
// the constants is reset by a copy of an undefined tensor, so that no input, output or intermediate outlives its run.
struct GraphExec::TablesReleased {
  GraphExec& exec;
  explicit TablesReleased(GraphExec& e) : exec(e) {}
  TablesReleased(const TablesReleased&) = delete;
  TablesReleased& operator=(const TablesReleased&) = delete;
  ~TablesReleased() {
    const auto& plan_values = exec.plan_->values();
    for (std::size_t id = 0; id < exec.eager_values_.size() && id < plan_values.size(); ++id) {
      if (plan_values[id].kind != PlanValue::Kind::kConstant) exec.eager_values_[id] = kNoTensor;
    }
    for (auto* tables : {&exec.step_inputs_, &exec.step_outputs_}) {
      for (std::vector<Tensor>& step : *tables) {
        for (Tensor& t : step) t = kNoTensor;
      }
    }
  }
};

std::vector<Tensor> GraphExec::run_steps(const std::vector<Tensor>& inputs, std::uint32_t profiling,
                                         const std::vector<Tensor>* into) {
  const StreamView stream = stream_ ? stream_->view() : StreamView{};
  // Note [Kernel to node correlation]: a recording profiler that cannot tell which graph node ran each kernel sees
  // the steps run eagerly. One that can (Note [Graph node attribution] in core/profiler_graph.cpp) sees replays
  // of a graph captured under step labels: a graph captured without them is captured again, once.
  const bool recording = (profiling & profiler::kRecording) != 0;
  const bool tracked = recording && profiler::graph_tracking();
  const bool eager_only = recording && !tracked;
  if (tracked && graph_ && !graph_labelled_) graph_.reset();
  // Note [Appends of a run]: which appends this run makes in place, and the presents a graph would write.
  if (!appends_.empty()) {
    if (prepare_appends(inputs, into)) ++runs_appending_;
    run_appends_.assign(appends_.size(), nullptr);  // no allocation after the first run
    for (std::size_t a = 0; a < appends_.size(); ++a) {
      if (!appending_[a]) continue;
      run_appends_[a] = (*into)[appends_[a].output].data_ptr();
      ++appends_in_place_;
    }
    if (graph_ && run_appends_ != graph_appends_) graph_.reset();  // captured over other presents: capture again
  }
  if (graph_ && graph_->is_instantiated() && !eager_only) {
    // Replay: every value lives in its arena slot (or is a constant), so only the inputs are bound and only the
    // outputs read back, through a table kept from run to run whose input and output entries are reset after each
    // (Note [Python run path] in bindings/session_binding.cpp: a replay's host work is on every batch-1 latency).
    std::vector<Tensor>& values = replay_values_;
    auto reset = [&] {
      for (int id : plan_->inputs()) values[id] = Tensor();
      for (int id : plan_->outputs()) values[id] = Tensor();
    };
    std::vector<Tensor> outputs;
    try {
      bind_inputs(inputs, values);
      if (!appends_.empty()) bind_appends(into, values);
      graph_->replay(stream);
      ++replays_;
      for (int id : plan_->outputs()) {
        if (!values[id].defined() && slots_[id].defined()) values[id] = slots_[id];
      }
      outputs = collect_outputs(values, stream, into);
    } catch (...) {
      reset();
      throw;
    }
    reset();
    finish_run(stream, *plan_, true);
    ++runs_;
    return outputs;
  }
  // Note [Tensor tables kept from run to run]
  std::vector<Tensor>& values = eager_values_;
  values.resize(plan_->values().size());
  for (std::size_t id = 0; id < values.size(); ++id) {
    const PlanValue& v = plan_->values()[id];
    if (v.kind == PlanValue::Kind::kConstant) values[id] = v.constant;
    else if (v.planned) values[id] = slots_[id];
    else values[id] = kNoTensor;
  }
  const TablesReleased released(*this);
  bind_inputs(inputs, values);
  if (!appends_.empty()) bind_appends(into, values);
  const bool use_graph = options_.use_cuda_graph && plan_->capturable() && !eager_only && capture_failure_.empty();
  if (use_graph && runs_ >= 1) {
    if (!graph_) {
      if (tracked) register_graph_labels();
      graph_ = std::make_unique<CudaGraph>();
      graph_labelled_ = tracked;
      graph_appends_ = run_appends_;
      graph_->capture_begin(stream);
      capturing_ = true;
      // Note [Failed captures]: the capture is closed and dropped, the step's error raised; an out-of-memory may
      // pass, so only other failures make this executor eager.
      auto abandon = [&] {
        capturing_ = false;
        try {
          graph_->capture_end();
        } catch (...) {
          // The capture is abandoned; the original error is the one to report.
        }
        graph_.reset();
      };
      try {
        execute_steps(values, stream, 0, tracked);
        capturing_ = false;
        graph_->capture_end();
      } catch (const OutOfMemoryError&) {
        abandon();
        throw;
      } catch (const std::exception& e) {
        abandon();
        capture_failure_ = e.what();
        throw;
      }
    }
    graph_->replay(stream);
    ++replays_;
    // Values computed inside the graph live in the arena: the slots hold them.
  } else {
    execute_steps(values, stream, profiling);
  }
  std::vector<Tensor> outputs = collect_outputs(values, stream, into);
  if (stream_) finish_run(stream, *plan_, graph_ != nullptr);
  ++runs_;
  return outputs;
}

}  // namespace xpuruntime
