#include "cudnn_graph.h"

#include <algorithm>

#include "xpuruntime/exceptions.h"

namespace xpuruntime::cudnn {
namespace {

std::int64_t engine_index(const BackendDescriptor& config) {
  try {
    BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t raw = engine.get();
    std::int64_t got = 0;
    XPURT_CUDNN_CHECK(cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &raw));
    std::int64_t index = -1;
    XPURT_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                               &index));
    return index;
  } catch (const XpuRuntimeError&) {
    return -1;  // informational only
  }
}

}  // namespace

std::size_t GraphBuilder::tensor(std::int64_t uid, cudnnDataType_t type, const std::vector<std::int64_t>& dims,
                                 const std::vector<std::int64_t>& strides, bool by_value, bool is_virtual) {
  BackendDescriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set_int(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(dims.size()), dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<std::int64_t>(strides.size()), strides.data());
  t.set_int(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
  if (is_virtual) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  if (by_value) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  t.finalize();
  built_->parts.push_back(std::move(t));
  return built_->parts.size() - 1;
}

void GraphBuilder::pointwise_into(cudnnPointwiseMode_t mode, cudnnDataType_t compute, std::size_t x, std::size_t b,
                                  std::size_t t, std::size_t y, std::int64_t axis) {
  BackendDescriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set_data_type(CUDNN_ATTR_POINTWISE_MATH_PREC, compute);
  if (axis >= 0) pw.set_int(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw.finalize();
  BackendDescriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, built_->parts[x]);
  if (b != kNone) op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, built_->parts[b]);
  if (t != kNone) op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, built_->parts[t]);
  op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, built_->parts[y]);
  const float alpha = 1.f;  // y = op(alpha1 * x, alpha2 * b), as cudnn-frontend sets them
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha);
  add_operation(std::move(pw), std::move(op));
}

void GraphBuilder::add_operation(BackendDescriptor inner, BackendDescriptor op) {
  op.finalize();
  built_->parts.push_back(std::move(inner));
  built_->parts.push_back(std::move(op));
  ops_.push_back(built_->parts.back().get());
}

std::unique_ptr<BuiltGraph> GraphBuilder::finish(std::size_t workspace_limit, const std::string& no_engine_hint) {
  built_->graph = std::make_unique<BackendDescriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  built_->graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                     static_cast<std::int64_t>(ops_.size()), ops_.data());
  built_->graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
  built_->graph->finalize();
  choose_plan(workspace_limit, no_engine_hint);
  ops_.clear();
  return std::move(built_);
}

// Note [cuDNN engine choice]
// cuDNN's heuristic (mode A) ranks the engine configurations that can run the graph; the first whose execution plan
// finalizes and whose workspace fits the policy's limit is used, as cudnn-frontend's build_plans does. A
// configuration that fails to finalize (CUDNN_STATUS_NOT_SUPPORTED_*) is skipped with its reason; when none remains
// the build fails with all of them.
void GraphBuilder::choose_plan(std::size_t workspace_limit, const std::string& no_engine_hint) {
  BackendDescriptor heuristic(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristic.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *built_->graph);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristic.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  heuristic.finalize();
  std::int64_t count = 0;
  XPURT_CUDNN_CHECK(cudnnBackendGetAttribute(heuristic.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  if (count <= 0) {
    throw UnsupportedOperationError(detail::str_cat(label_, ": cuDNN ", runtime_version(),
                                                    " has no engine for this graph", no_engine_hint));
  }
  std::vector<BackendDescriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  std::int64_t returned = 0;
  XPURT_CUDNN_CHECK(cudnnBackendGetAttribute(heuristic.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()));
  std::string skipped;
  for (std::int64_t i = 0; i < returned; ++i) {
    BackendDescriptor& config = configs[static_cast<std::size_t>(i)];
    try {
      auto plan = std::make_unique<BackendDescriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
      plan->set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      plan->finalize();
      std::int64_t workspace = 0;
      std::int64_t got = 0;
      XPURT_CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                 CUDNN_TYPE_INT64, 1, &got, &workspace));
      if (workspace < 0 || static_cast<std::size_t>(workspace) > workspace_limit) {
        skipped += detail::str_cat("; configuration ", i, " needs ",
                                   format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(workspace, 0))),
                                   " of workspace, over the limit ", format_bytes(workspace_limit));
        continue;
      }
      built_->workspace = workspace;
      built_->engine = engine_index(config);
      built_->config = std::make_unique<BackendDescriptor>(std::move(config));
      built_->plan = std::move(plan);
      return;
    } catch (const UnsupportedOperationError& e) {
      skipped += detail::str_cat("; configuration ", i, ": ", e.what());
    }
  }
  throw UnsupportedOperationError(detail::str_cat(label_, ": none of the ", returned, " engine configurations cuDNN ",
                                                  runtime_version(), " proposes can run this graph", skipped));
}

void execute(cudnnHandle_t handle, const BuiltGraph& built, std::int64_t count, const std::int64_t* uids,
             void* const* data, void* workspace) {
  BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, data);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  XPURT_CUDNN_CHECK(cudnnBackendExecute(handle, built.plan->get(), pack.get()));
}

void check_graph_build(const Kernel& kernel, const char* label, const OpDescriptor& desc,
                       const ExecutionPolicy& policy, const std::string& record) {
  if (!record.empty()) {
    throw UnsupportedOperationError(detail::str_cat(
        label, " keeps cuDNN's heuristic choice and has no plan record, but was given one: '", record,
        "' (a record of another kernel?)"));
  }
  const Support support = kernel.supports(desc, policy);
  if (!support) {
    throw UnsupportedOperationError(detail::str_cat(label, " cannot run ", desc.signature(), ": ", support.reason()));
  }
}

GraphsPerHandle::GraphsPerHandle(cudnnHandle_t handle, std::unique_ptr<BuiltGraph> first, Build build,
                                 std::string label)
    : build_(std::move(build)), label_(std::move(label)) {
  graphs_.emplace_back(handle, std::move(first));
}

const BuiltGraph& GraphsPerHandle::of(cudnnHandle_t handle) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& entry : graphs_) {
    if (entry.first == handle) return *entry.second;
  }
  std::unique_ptr<BuiltGraph> built = build_(handle);
  const std::int64_t first_workspace = graphs_.front().second->workspace;
  XPURT_CHECK(built->workspace <= first_workspace, label_, ": this thread's cuDNN plan needs ", built->workspace,
              " bytes of workspace, more than the ", first_workspace, " the plan was built with");
  graphs_.emplace_back(handle, std::move(built));
  return *graphs_.back().second;
}

}  // namespace xpuruntime::cudnn
