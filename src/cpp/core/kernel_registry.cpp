// KernelRegistry, FunctionKernel and the global registry.
#include "xpuruntime/kernel_registry.h"

#include <algorithm>
#include <set>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
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

// ---- kernel declarations ----

// Note [Kernel declarations]
// Most kernels began their supports() with the same checks, written again in each backend (cudnn's, cublas's and
// cuda_raw's check_common): the op on the kernel's device, no int8 precision, a dtype set, contiguous and aligned
// inputs, the device's compute capability. A KernelDecl states them as data beside the kernel's registration, and
// Kernel::supports checks it before the kernel's own accepts(), which keeps what a declaration cannot say (attributes,
// shapes against each other, a library present, plan limits). accepts() is only asked when the declaration holds, so
// it may index the inputs whose ranks the declaration fixed.
//
// The checks run in one order (the op's device, int8 precision, compute capability, then input by input: device,
// dtype, one dtype, rank, layout, alignment, innermost-dim alignment) and the first that fails is the reason, worded
// the same for every kernel: "<subject> takes <dtypes>, got <dtype> for input '<name>'". A dtype set may carry the
// text reasons name it by ("every dtype except uint16, uint32 and uint64"), so that a backend keeps the words its
// users know. The answer is the conjunction of the declaration and accepts(): a check moved from supports() into a
// declaration changes at most which reason a descriptor failing two checks gets, never whether a kernel runs it.

bool DTypeSet::contains(DType dtype) const {
  return dtypes.empty() || std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

std::string DTypeSet::str() const {
  if (!text.empty()) return text;
  std::string out;
  for (std::size_t k = 0; k < dtypes.size(); ++k) {
    out += k == 0 ? "" : (k + 1 == dtypes.size() ? " or " : ", ");
    out += dtype_name(dtypes[k]);
  }
  return out;
}

namespace {

const char* devices_text(DeviceType type) { return type == DeviceType::kCUDA ? "CUDA devices" : "the CPU"; }

std::string cc_text(int cc) { return detail::str_cat(cc / 10, ".", cc % 10); }

std::string rank_text(const RankRange& range) {
  if (range.max < 0) return detail::str_cat(range.min, " or more");
  if (range.min == range.max) return std::to_string(range.min);
  if (range.min <= 0) return detail::str_cat("up to ", range.max);
  return detail::str_cat(range.min, " to ", range.max);
}

// A rank-4 tensor whose strides are NHWC's for its NCHW shape (size-1 dims take any stride).
bool is_channels_last(const TensorDesc& t) {
  if (t.dim() != 4) return t.is_contiguous();
  if (t.numel() == 0) return true;
  const std::int64_t c = t.shape[1], h = t.shape[2], w = t.shape[3];
  // No strides: row-major NCHW.
  const std::vector<std::int64_t> strides = t.strides.empty() ? std::vector<std::int64_t>{c * h * w, h * w, w, 1}
                                                               : t.strides;
  const std::int64_t expected[4] = {c * h * w, 1, w * c, c};
  for (std::size_t k = 0; k < 4; ++k) {
    if (t.shape[k] != 1 && strides[k] != expected[k]) return false;
  }
  return true;
}

}  // namespace

Support check_declaration(const KernelDecl& decl, DeviceType device_type, const OpDescriptor& desc,
                          const ExecutionPolicy& policy) {
  const std::string who = decl.subject.empty() ? std::string() : decl.subject + " ";
  // How reasons name input k: 'x' (the last name repeats for a variadic input), else its index.
  const auto input = [&](std::size_t k) {
    if (decl.input_names.empty()) return std::to_string(k);
    return "'" + (k < decl.input_names.size() ? decl.input_names[k] : decl.input_names.back()) + "'";
  };
  if (decl.on_device && desc.device.type != device_type) {
    return Support::no(detail::str_cat(who, "runs on ", devices_text(device_type), "; the input is on ",
                                       desc.device.str()));
  }
  if (decl.no_int8 && (policy.precision == Precision::kInt8 || desc.precision == Precision::kInt8)) {
    return Support::no(who + "has no int8 kernel; use precision fp32, tf32, fp16 or bf16");
  }
  const int cc = desc.compute_capability;
  if (decl.min_compute_capability > 0 && cc > 0 && cc < decl.min_compute_capability) {
    if (decl.built_for_architectures) {
      return Support::no(detail::str_cat(who, "was built for sm_", decl.min_compute_capability,
                                         " and newer, this device is sm_", cc,
                                         "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=", cc));
    }
    return Support::no(detail::str_cat(who, "needs compute capability ", cc_text(decl.min_compute_capability),
                                       " or newer, this device has ", cc_text(cc)));
  }
  for (std::size_t k = 0; k < desc.inputs.size(); ++k) {
    const TensorDesc& t = desc.inputs[k];
    if (!t.present) continue;
    if (decl.on_device && t.device.type != device_type) {
      return Support::no(detail::str_cat(who, "runs on ", devices_text(device_type), "; input ", input(k), " is on ",
                                         t.device.str()));
    }
    if (!decl.dtypes.contains(t.dtype)) {
      return Support::no(detail::str_cat(who, "takes ", decl.dtypes.str(), ", got ", dtype_name(t.dtype),
                                         " for input ", input(k)));
    }
    if (k < decl.input_dtypes.size() && !decl.input_dtypes[k].contains(t.dtype)) {
      return Support::no(detail::str_cat(who, "takes ", decl.input_dtypes[k].str(), " for input ", input(k),
                                         ", got ", dtype_name(t.dtype)));
    }
    if (decl.one_dtype && t.dtype != desc.inputs[0].dtype) {
      return Support::no(detail::str_cat(who, "takes inputs of one dtype; input ", input(k), " is ",
                                         dtype_name(t.dtype), ", input ", input(0), " is ",
                                         dtype_name(desc.inputs[0].dtype)));
    }
    if (k < decl.input_ranks.size()) {
      const RankRange& range = decl.input_ranks[k];
      if (t.dim() < range.min || (range.max >= 0 && t.dim() > range.max)) {
        return Support::no(detail::str_cat(who, "takes input ", input(k), " of rank ", rank_text(range), ", got ",
                                           t.str()));
      }
    }
    if (decl.layout == Layout::kContiguous && !t.is_contiguous()) {
      return Support::no(detail::str_cat(who, "needs contiguous input ", input(k), " (", t.str(),
                                         "); call contiguous() first"));
    }
    if (decl.layout == Layout::kChannelsLast && !is_channels_last(t)) {
      return Support::no(detail::str_cat(who, "needs channels-last input ", input(k), " (NHWC strides), got ",
                                         t.str()));
    }
    const std::uint32_t alignment = std::max<std::uint32_t>(
        decl.alignment, decl.element_aligned ? static_cast<std::uint32_t>(dtype_size(t.dtype)) : 0);
    if (alignment != 0 && t.alignment < alignment) {
      return Support::no(detail::str_cat(who, "needs ", alignment, "-byte aligned data; input ", input(k), " is ",
                                         t.alignment,
                                         "-byte aligned (a view at an offset?): copy it to a fresh tensor"));
    }
    if (decl.inner_alignment != 0 && !t.shape.empty()) {
      const auto row_bytes = static_cast<std::uint64_t>(t.shape.back()) * dtype_size(t.dtype);
      if (row_bytes % decl.inner_alignment != 0) {
        return Support::no(detail::str_cat(who, "needs the innermost dim of input ", input(k), " in multiples of ",
                                           decl.inner_alignment, " bytes, got ", row_bytes, " bytes (", t.str(), ")"));
      }
    }
  }
  return Support::yes();
}

Support Kernel::supports(const OpDescriptor& desc, const ExecutionPolicy& policy) const {
  Support declared = check_declaration(info_.decl, info_.device_type, desc, policy);
  if (!declared) return declared;
  return accepts(desc, policy);
}

FunctionKernel::FunctionKernel(KernelInfo info, SupportsFn accepts, RunFn run, ReasonFn timed)
    : Kernel(std::move(info)), accepts_(std::move(accepts)), run_(std::move(run)), timed_(std::move(timed)) {}

std::string FunctionKernel::timed_against_others(const OpDescriptor& desc) const {
  return timed_ ? timed_(desc) : std::string();
}

Support FunctionKernel::accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const {
  return accepts_(desc, policy);
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

// Note [Node kernels]
// One op vocabulary: everything that computes is a kernel of the registry. Most are kernels of registry ops (an
// OpDescriptor, shapes known when the plan is built, the Dispatcher picks one under the KernelPolicy). A node kernel
// runs a whole ONNX node instead, keyed by its (domain, op_type): ONNX's full semantics across opsets (attribute vs
// input forms, every dtype, sequences and optionals, subgraphs), output shapes known only when it runs. The cpu
// backend registers one per ONNX operator it implements (register_cpu -> register_onnx_node_kernels,
// backends/cpu/onnx/), including the com.xpuruntime nodes of the graph passes. The native engine runs through them
// the nodes that have no registry lowering, constant folding and shape inference's evaluation of small constant
// subgraphs, always through core/node_kernels.h (run_node, run_node_values, run_graph), which looks them up here.
// There is one node kernel per (domain, op_type); there is no policy choice among them.

std::string NodeKernelInfo::key() const { return domain.empty() ? op_type : domain + ":" + op_type; }

namespace {

std::string node_domain(const std::string& domain) { return domain == "ai.onnx" ? std::string() : domain; }

}  // namespace

void KernelRegistry::add_node_kernel(NodeKernelInfo info) {
  info.domain = node_domain(info.domain);
  XPURT_INTERNAL_ASSERT(static_cast<bool>(info.run), "node kernel ", info.key(), " has no function");
  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_pair(info.domain, info.op_type);
  XPURT_INTERNAL_ASSERT(node_kernels_.count(key) == 0, "ONNX op registered twice: ", info.key());
  node_kernels_[std::move(key)] = std::make_unique<NodeKernelInfo>(std::move(info));
}

const NodeKernelInfo* KernelRegistry::find_node_kernel(const std::string& domain, const std::string& op_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = node_kernels_.find({node_domain(domain), op_type});
  return it == node_kernels_.end() ? nullptr : it->second.get();
}

std::vector<const NodeKernelInfo*> KernelRegistry::node_kernels() const {
  std::vector<const NodeKernelInfo*> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, info] : node_kernels_) out.push_back(info.get());
  }
  std::sort(out.begin(), out.end(),
            [](const NodeKernelInfo* a, const NodeKernelInfo* b) { return a->key() < b->key(); });
  return out;
}

}  // namespace xpuruntime
