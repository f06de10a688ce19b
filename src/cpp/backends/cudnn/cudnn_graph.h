// cuDNN's graph (backend) API without the cudnn-frontend library, as the graph kernels of the cudnn backend build it
// (cudnn_attention.cpp, cudnn_qconv.cpp): an RAII owner of backend descriptors, a builder of operation graphs out of
// tensors and pointwise operations that picks the first execution plan cuDNN's heuristic ranks (Note [cuDNN engine
// choice]), and the per-handle store of built graphs a plan keeps (Note [cuDNN graphs per handle]).
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cudnn_utils.h"

namespace xpuruntime::cudnn {

// Owns one cuDNN backend descriptor (cudnnBackendCreateDescriptor / cudnnBackendDestroyDescriptor).
class BackendDescriptor {
 public:
  explicit BackendDescriptor(cudnnBackendDescriptorType_t type) {
    XPURT_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &descriptor_));
  }
  BackendDescriptor(BackendDescriptor&& other) noexcept : descriptor_(std::exchange(other.descriptor_, nullptr)) {}
  BackendDescriptor& operator=(BackendDescriptor&& other) noexcept {
    if (this != &other) {
      release();
      descriptor_ = std::exchange(other.descriptor_, nullptr);
    }
    return *this;
  }
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;
  ~BackendDescriptor() { release(); }

  cudnnBackendDescriptor_t get() const { return descriptor_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count,
           const void* values) {
    XPURT_CUDNN_CHECK(cudnnBackendSetAttribute(descriptor_, name, type, count, values));
  }
  void set_descriptor(cudnnBackendAttributeName_t name, const BackendDescriptor& value) {
    cudnnBackendDescriptor_t raw = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  void set_int(cudnnBackendAttributeName_t name, std::int64_t value) { set(name, CUDNN_TYPE_INT64, 1, &value); }
  void set_data_type(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
    set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
  }
  void finalize() { XPURT_CUDNN_CHECK(cudnnBackendFinalize(descriptor_)); }

 private:
  void release() noexcept {
    if (descriptor_ != nullptr) cudnnBackendDestroyDescriptor(descriptor_);
    descriptor_ = nullptr;
  }
  cudnnBackendDescriptor_t descriptor_ = nullptr;
};

// One built graph and execution plan, tied to the cuDNN handle it was built with.
struct BuiltGraph {
  std::vector<BackendDescriptor> parts;  // tensors and operations the graph refers to, kept alive with it
  std::unique_ptr<BackendDescriptor> graph;
  std::unique_ptr<BackendDescriptor> config;  // the engine configuration the plan runs, kept with it
  std::unique_ptr<BackendDescriptor> plan;
  std::int64_t workspace = 0;
  std::int64_t engine = -1;  // cuDNN's global engine index
};

// Builds one operation graph on `handle`: tensors and operations are added in order, then finish() finalizes the
// graph and picks its plan. `label` names the kernel in errors ("cudnn attention").
class GraphBuilder {
 public:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  // `first_virtual_uid`: virtual tensors get unique ids from here up (above every id the variant pack names).
  GraphBuilder(cudnnHandle_t handle, std::string label, std::int64_t first_virtual_uid)
      : handle_(handle), label_(std::move(label)), next_virtual_(first_virtual_uid),
        built_(std::make_unique<BuiltGraph>()) {}

  // A tensor descriptor; returns its index among the parts. 16-byte alignment (the kernels check their data's).
  // `by_value`: a host scalar the variant pack passes by pointer.
  std::size_t tensor(std::int64_t uid, cudnnDataType_t type, const std::vector<std::int64_t>& dims,
                     const std::vector<std::int64_t>& strides, bool by_value = false, bool is_virtual = false);
  std::size_t virtual_tensor(cudnnDataType_t type, const std::vector<std::int64_t>& dims,
                             const std::vector<std::int64_t>& strides) {
    return tensor(next_virtual_++, type, dims, strides, /*by_value=*/false, /*is_virtual=*/true);
  }
  // A pointwise op y = mode(x[, b[, t]]) computed in `compute` into a new virtual tensor of `out_type` (returns its
  // index); `axis` for the modes that take one (GEN_INDEX).
  std::size_t pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, std::size_t x, std::size_t b,
                        std::size_t t, const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& strides,
                        cudnnDataType_t out_type, std::int64_t axis = -1) {
    const std::size_t y = virtual_tensor(out_type, dims, strides);
    pointwise_into(mode, compute, x, b, t, y, axis);
    return y;
  }
  // The same into the existing tensor `y`.
  void pointwise_into(cudnnPointwiseMode_t mode, cudnnDataType_t compute, std::size_t x, std::size_t b,
                      std::size_t t, std::size_t y, std::int64_t axis = -1);
  // Finalizes operation `op` and appends it to the graph; `inner` is the descriptor of its math (convolution,
  // matmul, reduction, pointwise), kept alive with it.
  void add_operation(BackendDescriptor inner, BackendDescriptor op);

  const BackendDescriptor& part(std::size_t index) const { return built_->parts.at(index); }
  cudnnHandle_t handle() const { return handle_; }

  // Finalizes the graph of the operations added and picks its plan (Note [cuDNN engine choice]). Throws
  // UnsupportedOperationError with cuDNN's reasons when no configuration runs it; `no_engine_hint` ends the message
  // when cuDNN proposes none at all ("use flash_v2").
  std::unique_ptr<BuiltGraph> finish(std::size_t workspace_limit, const std::string& no_engine_hint);

 private:
  void choose_plan(std::size_t workspace_limit, const std::string& no_engine_hint);

  cudnnHandle_t handle_;
  std::string label_;
  std::int64_t next_virtual_;
  std::unique_ptr<BuiltGraph> built_;          // the graph being built
  std::vector<cudnnBackendDescriptor_t> ops_;  // its operations, in order
};

// Runs `built`'s plan on `handle` (bound to the launch's stream) over the `count` tensors of `uids` at `data`
// (a by-value scalar's pointer is to host memory), with `workspace`.
void execute(cudnnHandle_t handle, const BuiltGraph& built, std::int64_t count, const std::int64_t* uids,
             void* const* data, void* workspace);

// What build() of a graph kernel checks first: a graph kernel keeps cuDNN's heuristic choice, so it takes no plan
// record, and `kernel` supports `desc` under `policy`. UnsupportedOperationError naming `label` otherwise.
void check_graph_build(const Kernel& kernel, const char* label, const OpDescriptor& desc,
                       const ExecutionPolicy& policy, const std::string& record);

// Note [cuDNN graphs per handle]
// A cuDNN operation graph and its execution plan are made for one cudnnHandle_t, and handles are per thread
// (Note [cuDNN handle pool]). The graph built by Kernel::build serves the building thread; another thread that runs
// the same plan gets its own graph, built on its first run by the same function (so the same heuristic choice), and
// kept. A mutex guards the small list; a run holds it only to look its entry up. A later graph may not need more
// workspace than the first (the plan stated its workspace from the first).
class GraphsPerHandle {
 public:
  using Build = std::function<std::unique_ptr<BuiltGraph>(cudnnHandle_t)>;

  // `first`: the graph built on `handle`; `build` makes another thread's; `label` names the kernel in errors.
  GraphsPerHandle(cudnnHandle_t handle, std::unique_ptr<BuiltGraph> first, Build build, std::string label);

  const BuiltGraph& first() const { return *graphs_.front().second; }
  // The graph of `handle`, built now if it has none.
  const BuiltGraph& of(cudnnHandle_t handle) const;

 private:
  Build build_;
  std::string label_;
  mutable std::mutex mutex_;
  mutable std::vector<std::pair<cudnnHandle_t, std::unique_ptr<BuiltGraph>>> graphs_;
};

}  // namespace xpuruntime::cudnn
