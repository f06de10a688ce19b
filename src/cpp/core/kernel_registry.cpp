// KernelRegistry, FunctionKernel and the global registry.
#include "xpuruntime/kernel_registry.h"

#include <algorithm>
#include <set>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/memory_manager.h"

namespace xpuruntime {

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k) out += (k ? ", " : "") + names[k];
  return out;
}

class FunctionPlan final : public KernelPlan {
 public:
  explicit FunctionPlan(const FunctionKernel::RunFn* run) : run_(run) {}
  void run(const KernelLaunch& launch) const override { (*run_)(launch); }

 private:
  const FunctionKernel::RunFn* run_;
};

}  // namespace

void KernelPlan::execute(const OpDescriptor& desc, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                         const StreamView& stream, const Tensor* given_workspace) const {
  const std::size_t bytes = workspace_bytes();
  DataPtr workspace;
  void* workspace_ptr = nullptr;
  std::size_t workspace_size = bytes;
  if (given_workspace != nullptr && given_workspace->defined()) {
    XPURT_CHECK(given_workspace->device() == desc.device, "op '", desc.op, "': expected a workspace on ",
                desc.device.str(), ", but got one on ", given_workspace->device().str());
    XPURT_CHECK(given_workspace->is_contiguous() && given_workspace->nbytes() >= bytes, "op '", desc.op,
                "': expected a contiguous workspace of at least ", bytes,
                " bytes (the plan's workspace_bytes), but got ", given_workspace->nbytes(),
                given_workspace->is_contiguous() ? " bytes" : " bytes, not contiguous");
    workspace_ptr = bytes > 0 ? given_workspace->data_ptr() : nullptr;
    workspace_size = bytes > 0 ? given_workspace->nbytes() : 0;
  } else if (bytes > 0) {
    workspace = MemoryManager::instance().allocate(desc.device, bytes, stream);
    workspace_ptr = workspace.get();
  }
  KernelLaunch launch;
  launch.desc = &desc;
  launch.inputs = inputs.data();
  launch.num_inputs = inputs.size();
  launch.outputs = outputs.data();
  launch.num_outputs = outputs.size();
  launch.stream = stream;
  launch.workspace = workspace_ptr;
  launch.workspace_bytes = workspace_size;
  run(launch);
}

FunctionKernel::FunctionKernel(KernelInfo info, SupportsFn supports, RunFn run)
    : Kernel(std::move(info)), supports_(std::move(supports)), run_(std::move(run)) {}

Support FunctionKernel::supports(const OpDescriptor& desc, const ExecutionPolicy& policy) const {
  return supports_(desc, policy);
}

std::unique_ptr<KernelPlan> FunctionKernel::build(const OpDescriptor&, const ExecutionPolicy&,
                                                  const std::string&) const {
  return std::make_unique<FunctionPlan>(&run_);
}

std::size_t OpSchema::num_required_inputs() const {
  std::size_t n = 0;
  for (const auto& input : inputs) {
    if (input.empty() || input.back() != '?') ++n;
  }
  return n;
}

bool OpSchema::is_variadic() const {
  const std::string suffix = "...";
  return !inputs.empty() && inputs.back().size() > suffix.size() &&
         inputs.back().compare(inputs.back().size() - suffix.size(), suffix.size(), suffix) == 0;
}

void KernelRegistry::add_schema(OpSchema schema) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& existing : schemas_) {
    XPURT_CHECK(existing.name != schema.name, "op '", schema.name, "' is already defined");
  }
  XPURT_CHECK(static_cast<bool>(schema.infer), "op '", schema.name, "' has no shape inference");
  if (schema.family.empty()) schema.family = schema.name;
  schemas_.push_back(std::move(schema));
}

void KernelRegistry::add_kernel(std::unique_ptr<Kernel> kernel) {
  XPURT_CHECK(kernel != nullptr, "add_kernel: null kernel");
  const auto& info = kernel->info();
  XPURT_CHECK(find_schema(info.op) != nullptr, "kernel '", info.name, "' of backend '", info.backend,
              "' implements op '", info.op, "', which is not defined; defined ops: ", join(ops()));
  XPURT_CHECK(find_kernel(info.op, info.name) == nullptr, "op '", info.op, "' already has a kernel named '",
              info.name, "'");
  std::lock_guard<std::mutex> lock(mutex_);
  kernels_.push_back(std::move(kernel));
}

const OpSchema* KernelRegistry::find_schema(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& schema : schemas_) {
    if (schema.name == op) return &schema;
  }
  return nullptr;
}

const OpSchema& KernelRegistry::schema(const std::string& op) const {
  const OpSchema* found = find_schema(op);
  if (found == nullptr) {
    throw InvalidArgumentError(detail::str_cat("unknown op '", op, "'; valid ops: ", join(ops())));
  }
  return *found;
}

std::vector<std::string> KernelRegistry::ops() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> names;
  for (const auto& schema : schemas_) names.push_back(schema.name);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> KernelRegistry::families() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::string> names;
  for (const auto& schema : schemas_) names.insert(schema.family);
  return {names.begin(), names.end()};
}

std::vector<std::string> KernelRegistry::ops_in_family(const std::string& family) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> names;
  for (const auto& schema : schemas_) {
    if (schema.family == family) names.push_back(schema.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<const Kernel*> KernelRegistry::kernels(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<const Kernel*> found;
  for (const auto& kernel : kernels_) {
    if (kernel->op() == op) found.push_back(kernel.get());
  }
  return found;
}

const Kernel* KernelRegistry::find_kernel(const std::string& op, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kernel : kernels_) {
    if (kernel->op() == op && kernel->name() == name) return kernel.get();
  }
  return nullptr;
}

std::vector<std::string> KernelRegistry::kernel_names(const std::string& policy_key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::string> ops_of_key;
  for (const auto& schema : schemas_) {
    if (schema.name == policy_key || schema.family == policy_key) ops_of_key.insert(schema.name);
  }
  std::set<std::string> names;
  for (const auto& kernel : kernels_) {
    if (ops_of_key.count(kernel->op()) != 0) names.insert(kernel->name());
  }
  for (const auto& external : external_kernels_) {
    if (ops_of_key.count(external->op) != 0) names.insert(external->name);
  }
  return {names.begin(), names.end()};
}

// Note [External kernels]
// Training runs under the same KernelPolicy as inference (docs/pytorch.md), and a training policy may name
// PyTorch's own backends ("torch_flash", "torch_cublaslt"): names no kernel of this library implements. They are
// declared here as external kernels so that a policy naming them validates, saves and loads everywhere (unknown
// names still fail, listing the valid ones). xpuruntime.pytorch runs them; the Dispatcher never does: a preferred
// rule skips them with their reason (an InferenceSession falls back to the next preference), a pinned one is an
// UnsupportedOperationError. They are not Kernels: `kernels()` and the priority order do not list them.
void KernelRegistry::add_external_kernel(ExternalKernelInfo info) {
  XPURT_CHECK(find_schema(info.op) != nullptr, "external kernel '", info.name, "' implements op '", info.op,
              "', which is not defined; defined ops: ", join(ops()));
  XPURT_CHECK(find_kernel(info.op, info.name) == nullptr && find_external_kernel(info.op, info.name) == nullptr,
              "op '", info.op, "' already has a kernel named '", info.name, "'");
  std::lock_guard<std::mutex> lock(mutex_);
  external_kernels_.push_back(std::make_unique<ExternalKernelInfo>(std::move(info)));
}

const ExternalKernelInfo* KernelRegistry::find_external_kernel(const std::string& op, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& external : external_kernels_) {
    if (external->op == op && external->name == name) return external.get();
  }
  return nullptr;
}

std::vector<ExternalKernelInfo> KernelRegistry::external_kernels(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ExternalKernelInfo> found;
  for (const auto& external : external_kernels_) {
    if (op.empty() || external->op == op) found.push_back(*external);
  }
  return found;
}

bool KernelRegistry::is_policy_key(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& schema : schemas_) {
    if (schema.name == key || schema.family == key) return true;
  }
  return false;
}

std::vector<std::string> KernelRegistry::policy_keys() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::string> keys;
  for (const auto& schema : schemas_) {
    keys.insert(schema.name);
    keys.insert(schema.family);
  }
  return {keys.begin(), keys.end()};
}

void KernelRegistry::infer(OpDescriptor& desc) const {
  const OpSchema& op_schema = schema(desc.op);
  const std::size_t required = op_schema.num_required_inputs();
  if (op_schema.is_variadic()) {
    // Fixed inputs first (all required), then one or more of the variadic one, every one given.
    XPURT_CHECK(desc.inputs.size() >= required, "op '", desc.op, "' takes ", required, " or more inputs (",
                join(op_schema.inputs), "), got ", desc.inputs.size());
    for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
      const std::string& name = op_schema.inputs[std::min(k, op_schema.inputs.size() - 1)];
      XPURT_CHECK(desc.inputs[k].present, "op '", desc.op, "': input ", k, " ('", name,
                  "') is required but was not given");
    }
    desc.outputs = op_schema.infer(desc);
    return;
  }
  XPURT_CHECK(desc.inputs.size() >= required && desc.inputs.size() <= op_schema.inputs.size(), "op '", desc.op,
              "' takes ", required == op_schema.inputs.size() ? "" : "from ", required,
              required == op_schema.inputs.size() ? "" : " to ",
              required == op_schema.inputs.size() ? std::string() : std::to_string(op_schema.inputs.size()),
              " inputs (", join(op_schema.inputs), "), got ", desc.inputs.size());
  for (std::size_t k = 0; k < required; ++k) {
    XPURT_CHECK(desc.inputs[k].present, "op '", desc.op, "': input '", op_schema.inputs[k],
                "' is required but was not given");
  }
  desc.inputs.resize(op_schema.inputs.size());  // absent optional inputs
  desc.outputs = op_schema.infer(desc);
}

void KernelRegistry::add_library_version(const std::string& library, const std::string& version) {
  std::lock_guard<std::mutex> lock(mutex_);
  library_versions_[library] = version;
}

std::string KernelRegistry::library_versions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const auto& [library, version] : library_versions_) out += (out.empty() ? "" : ",") + library + "=" + version;
  return out;
}

}  // namespace xpuruntime
