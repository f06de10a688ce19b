// What a native session says of itself (see explain.h).
#include "engines/native/session/explain.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fused_elementwise.h"
#include "core/shape_str.h"
#include "frontends/onnx/onnx_quantize.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::runtime {
namespace {

std::size_t value_bytes(const PlanValue& v) {
  if (v.bytes > 0 || !v.type.fully_known()) return v.bytes;
  std::size_t bytes = dtype_size(v.type.dtype);
  for (std::int64_t d : v.type.sizes()) bytes *= static_cast<std::size_t>(d);
  return bytes;
}

// "; int8 x (scale 0.02, zero point 3), int8 weights (8 scales, per channel), output int8 (scale 0.05, zero point
// -2)": what explain() says of a qlinear/qconv2d step.
std::string quantized_summary(const PlanStep& s) {
  const Attributes& a = s.attrs;
  const std::string out = a.get_string("output_dtype", "float32");
  std::string text = detail::str_cat("; ", dtype_name(s.desc.inputs[0].dtype), " x");
  if (out != "int32") {
    text += detail::str_cat(" (scale ", a.get_float("x_scale", 0.0), ", zero point ", a.get_int("x_zero_point", 0),
                            ")");
  }
  text += ", int8 weights";
  if (s.desc.inputs.size() > 2 && s.desc.inputs[2].present) {
    const std::int64_t scales = s.desc.inputs[2].numel();
    text += scales == 1 ? " (one scale)" : detail::str_cat(" (", scales, " scales, per channel)");
  }
  text += ", output " + out;
  if (out == "int8" || out == "uint8") {
    text += detail::str_cat(" (scale ", a.get_float("y_scale", 0.0), ", zero point ", a.get_int("y_zero_point", 0),
                            ")");
  }
  return text;
}

// "; int4 weights [4096, 11008] in blocks of 32 (float16 scales, zero points 8)": what explain() says of a matmul_nbits
// step (Note [Int4 weight-only GEMM]).
std::string int4_summary(const PlanStep& s) {
  const std::vector<TensorDesc>& in = s.desc.inputs;
  const bool zero_points = in.size() > 3 && in[3].present;
  return detail::str_cat("; int4 weights [", in[1].shape[0], ", ", in[0].shape.back(), "] in blocks of ",
                         s.attrs.get_int("block_size", 0), " (", dtype_name(in[2].dtype), " scales, zero points ",
                         zero_points ? "packed" : "8", ")");
}

// "; x0 read as [2,5,4,8] (strides [480,96,8,1], offset 32)": the inputs a fused_elementwise step reads through views
// (Note [Inputs read through a view]); empty without any.
std::string fused_views_summary(const PlanStep& s) {
  if (!s.attrs.has("input_views")) return "";
  std::vector<std::vector<std::int64_t>> stored;
  for (const TensorDesc& t : s.desc.inputs) stored.push_back(t.shape);
  const fused::InputViews views = fused::input_views(s.attrs, stored);  // checked by the op's shape inference
  std::string text;
  for (std::size_t k = 0; k < views.size(); ++k) {
    if (!views[k]) continue;
    text += detail::str_cat(text.empty() ? "; " : ", ", "x", k, " read as ", detail::shape_str(views[k]->shape, ","),
                            " (strides ", detail::shape_str(views[k]->strides, ","), ", offset ", views[k]->offset,
                            ")");
  }
  return text;
}

}  // namespace

NodeExplanation node_explanation(const CapturePlan& plan, const PlanStep& s) {
  NodeExplanation n;
  n.node = s.node;
  n.op_type = s.op_type;
  switch (s.kind) {
    case PlanStep::Kind::kKernel:
      if (s.dispatch) {
        const Decision& d = s.dispatch->decision;
        n.kernel = d.kernel;
        n.backend = d.backend;
        n.precision = precision_name(s.desc.precision);
        n.reason = s.op + ": " + d.reason;
        if (!d.plan_summary.empty()) n.reason += " [" + d.plan_summary + "]";
        if (s.op == "fused_elementwise") {  // Note [Fused elementwise programs]: the group's program
          n.reason += fused_views_summary(s) + "; program: " + s.attrs.get_string("program", "");
          if (s.attrs.has("pieces")) {  // Note [Pieces of a concatenation]: "; pieces along axis 3: 16, 48"
            const std::vector<std::int64_t> p = s.attrs.get_ints("pieces", {});
            n.reason += detail::str_cat("; pieces along axis ", p.empty() ? 0 : p[0], ":");
            for (std::size_t k = 1; k < p.size(); ++k) n.reason += detail::str_cat(k > 1 ? ", " : " ", p[k]);
          }
        }
        if (s.op == "matmul_nbits") n.reason += int4_summary(s);  // Note [Int4 weight-only GEMM]
        if (s.op == "qlinear" || s.op == "qconv2d") {  // Note [Quantized registry ops]: int8 whatever the policy's
          n.precision = "int8";
          n.reason += quantized_summary(s);
        }
        n.op = s.op;
        n.rule = d.rule;
        n.policy_rule = d.policy_rule;
        n.candidates = d.candidates;
      } else {
        n.kernel = "(dispatched at run time)";
        n.backend = "cpu";
        n.reason = s.op + ": input shapes known only at run time";
        n.op = s.op;
      }
      break;
    case PlanStep::Kind::kView:
      n.kernel = "view";
      n.backend = "-";
      n.reason = plan.values()[s.outputs[0]].view_offset == 0 && s.op_type != "Slice" && s.op_type != "Gather"
                     ? "a reshape of its input's bytes: no kernel, no copy"
                     : detail::str_cat("a contiguous block of its input's bytes from byte ",
                                       plan.values()[s.outputs[0]].view_offset, ": no kernel, no copy");
      break;
    case PlanStep::Kind::kReference:
      n.kernel = "onnx_ref";
      n.backend = "cpu";
      n.reason = "ONNX reference implementation: " + s.reason;
      break;
  }
  return n;
}

std::vector<TransferExplanation> transfers_of(const CapturePlan& plan, const std::vector<bool>& feeds_on_device,
                                              Device device, bool cuda_graphs, bool appended) {
  std::vector<TransferExplanation> out;
  const bool cuda = device.is_cuda();
  const bool fixed_addresses = cuda && cuda_graphs && plan.capturable();
  const auto& values = plan.values();
  std::vector<bool> past(plan.inputs().size(), false), present(plan.outputs().size(), false);
  if (appended) {
    for (const CacheAppend& a : plan.cache_appends()) {
      past[a.input] = present[a.output] = true;
      TransferExplanation t;
      t.kind = "append";
      t.value = values[static_cast<std::size_t>(plan.outputs()[a.output])].name;
      t.direction = cuda ? "device->device" : "host->host";
      const PlanStep& step = plan.steps()[a.step];
      for (std::size_t k = 1; k < step.inputs.size(); ++k) {
        t.bytes += value_bytes(values[static_cast<std::size_t>(step.inputs[k])]);
      }
      t.reason = "the present is bound over its past (Note [Cache appended in place]): only the new positions are "
                 "written, nothing copies the cache";
      out.push_back(std::move(t));
    }
  }
  for (std::size_t i = 0; i < plan.inputs().size(); ++i) {
    if (past[i]) continue;
    const PlanValue& v = values[plan.inputs()[i]];
    const bool on_device = i < feeds_on_device.size() ? feeds_on_device[i] : !cuda;
    TransferExplanation t;
    t.kind = "copy";
    t.value = v.name;
    t.bytes = value_bytes(v);
    if (!on_device) {
      t.direction = "host->device";
      t.reason = "input fed from host memory, copied to " + device.str();
    } else if (fixed_addresses) {
      t.direction = "device->device";
      t.reason = "input copied into its arena slot: a CUDA graph replays fixed addresses";
    } else {
      continue;  // bound in place (zero-copy)
    }
    out.push_back(std::move(t));
  }
  const std::vector<bool> direct = plan.direct_outputs();
  for (std::size_t k = 0; k < plan.outputs().size(); ++k) {
    if (present[k]) continue;
    const int id = plan.outputs()[k];
    const PlanValue& v = values[id];
    const bool owned_by_run = direct[static_cast<std::size_t>(id)] ||
                              (!v.planned && v.kind == PlanValue::Kind::kIntermediate &&
                               (v.view_of < 0 || !values[v.view_of].planned));
    if (owned_by_run) continue;  // returned as allocated by its step
    TransferExplanation t;
    t.kind = "copy";
    t.value = v.name;
    t.bytes = value_bytes(v);
    t.direction = cuda ? "device->device" : "host->host";
    t.reason = v.kind == PlanValue::Kind::kIntermediate
                   ? "output copied out of the arena (the next run reuses it); it stays on " + device.str()
                   : "output is an input or constant passed through; copied so that the caller owns it";
    out.push_back(std::move(t));
  }
  // Note [Mixed execution] (ExecutionPolicy fallback "cpu"): host steps of a CUDA plan.
  for (const PlanStep& step : plan.steps()) {
    if (!step.on_host) continue;
    TransferExplanation sync;
    sync.kind = "sync";
    sync.reason = "node '" + step.node + "' (" + step.op_type + ") runs on the CPU (fallback \"cpu\"): the stream is "
                  "synchronized before its inputs are copied to the host";
    out.push_back(std::move(sync));
    for (std::size_t k = 0; k < step.inputs.size(); ++k) {
      if (step.inputs[k] < 0 || values[step.inputs[k]].kind == PlanValue::Kind::kConstant) continue;
      TransferExplanation t;
      t.kind = "copy";
      t.value = values[step.inputs[k]].name;
      t.bytes = value_bytes(values[step.inputs[k]]);
      t.direction = "device->host";
      t.reason = "input of node '" + step.node + "', which runs on the CPU (no CUDA kernel: " + step.reason + ")";
      out.push_back(std::move(t));
    }
    for (int id : step.outputs) {
      if (id < 0) continue;
      TransferExplanation t;
      t.kind = "copy";
      t.value = values[id].name;
      t.bytes = value_bytes(values[id]);
      t.direction = "host->device";
      t.reason = "output of node '" + step.node + "', which runs on the CPU, copied back to " + device.str();
      out.push_back(std::move(t));
    }
  }
  if (cuda) {
    TransferExplanation t;
    t.kind = "sync";
    t.reason = "one stream synchronization per run, after the outputs are copied (run() returns ready outputs)";
    out.push_back(std::move(t));
  }
  return out;
}

namespace {

// Note [Segmented plans]: the segments the last run went through (from `plan`, each boundary's last next plan),
// with their transfers, syncs and nodes.
void explain_segments(const std::shared_ptr<const CapturePlan>& plan, const SessionOptions& options, Explanation& e) {
  std::vector<std::shared_ptr<const CapturePlan>> chain = {plan};
  while (chain.back()->boundary()) {
    std::shared_ptr<const CapturePlan> next = chain.back()->boundary()->last();
    if (!next) break;
    chain.push_back(std::move(next));
  }
  for (std::size_t k = 0; k < chain.size() && chain.size() > 1; ++k) {
    const CapturePlan& segment = *chain[k];
    std::string graph;
    if (options.device.is_cuda()) {
      std::string not_capturable;
      graph = !options.exec_policy.cuda_graphs     ? "; cuda_graphs off"
              : segment.capturable(&not_capturable) ? "; captured into a CUDA graph from its second run"
                                                    : "; not capturable: " + not_capturable;
    }
    e.segments.push_back(detail::str_cat("segment ", k, ": ", segment.steps().size(), " steps", graph, "; ",
                                         segment.memory().str(),
                                         segment.boundary() ? "; " + segment.boundary()->str() : std::string()));
    if (k == 0) continue;
    std::vector<TransferExplanation> more =
        transfers_of(segment, std::vector<bool>(segment.inputs().size(), true), options.device,
                     options.exec_policy.cuda_graphs);
    for (auto& t : more) t.reason = detail::str_cat("segment ", k, ": ", t.reason);
    e.transfers.insert(e.transfers.end(), more.begin(), more.end());
  }
  if (chain.size() == 1 && plan->boundary()) {
    e.segments.push_back(detail::str_cat("segment 0: ", plan->steps().size(), " steps; ", plan->boundary()->str(),
                                         " (not run yet)"));
  }
  for (std::size_t k = 0; k + 1 < chain.size(); ++k) {
    TransferExplanation sync;
    sync.kind = "sync";
    sync.reason = detail::str_cat("segment ", k, " ", chain[k]->boundary()->str());
    e.transfers.push_back(std::move(sync));
  }
  for (std::size_t k = 0; k < chain.size(); ++k) {
    for (const PlanStep& s : chain[k]->steps()) {
      NodeExplanation n = node_explanation(*chain[k], s);
      n.segment = static_cast<int>(k);
      e.nodes.push_back(std::move(n));
    }
  }
}

}  // namespace

Explanation explain_session(const SessionOptions& options, const SessionState& state) {
  Explanation e;
  e.engine = "native";
  e.device = options.device.str();
  e.options.push_back(detail::str_cat("plans built: ", state.plans, " (one per input-shape signature)"));
  if (state.constants > 0) {  // Note [Constants shared between plans] (engines/native/plan/capture_plan.cpp)
    e.options.push_back(detail::str_cat("device constants: ", state.constants, " tensors, ",
                                        static_cast<double>(state.constant_bytes) / (1 << 20),
                                        " MiB, shared by the plans (",
                                        state.constants_shared, " taken by a later plan instead of a new copy)"));
  }
  if (state.executors_released > 0) {  // Note [Idle executors give their memory back] (session/plan_cache.cpp)
    e.options.push_back(detail::str_cat("out of memory during a run: ", state.executors_released,
                                        " idle executor(s) gave their arenas back and the run was made again"));
  }
  if (state.appends_in_place > 0) {  // Note [Cache appended in place] (engines/native/plan/capture_plan.cpp)
    e.options.push_back(detail::str_cat("cache appended in place: ", state.appends_in_place, " Concat step(s) over ",
                                        state.runs_appending, " run(s) wrote only the new positions into the bound "
                                        "present, whose leading part was the past fed (no copy of the cache)"));
  }
  if (!state.capture_failure.empty()) {
    e.options.push_back("a CUDA graph capture failed (Note [Failed captures]); that executor runs eagerly: " +
                        state.capture_failure);
  }
  if (options.device.is_cuda()) {
    e.options.push_back(detail::str_cat("cuda_graphs=", options.exec_policy.cuda_graphs ? "true" : "false",
                                        state.captured ? " (captured and replayed)" : ""));
  }
  e.options.push_back(detail::str_cat("precision=", precision_name(options.exec_policy.precision)));
  if (std::string note = onnx_frontend::quantization_note(options.exec_policy); !note.empty()) {
    e.options.push_back(note + " (the policy's decisions, applied to the model before it was imported)");
  }
  if (!state.build_cache.empty()) e.options.push_back("build cache (Note [Build cache]): " + state.build_cache);
  if (!state.weight_timing.empty()) e.options.push_back(state.weight_timing);
  e.build = state.build;
  const std::shared_ptr<const CapturePlan>& plan = state.last_plan;
  if (!plan) {
    e.options.push_back("no plan built yet (the first run builds one)");
    return e;
  }
  std::string why;
  if (options.device.is_cuda() && !plan->capturable(&why)) e.options.push_back("not capturable: " + why);
  for (const auto& note : plan->pass_notes()) e.options.push_back("pass " + note);
  e.memory = plan->memory().str();
  e.memory_json = plan->memory().to_json();
  e.transfers = transfers_of(*plan, state.feeds_on_device, options.device, options.exec_policy.cuda_graphs,
                             state.appends_in_place > 0);
  explain_segments(plan, options, e);
  return e;
}

}  // namespace xpuruntime::runtime
