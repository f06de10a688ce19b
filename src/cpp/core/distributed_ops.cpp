// Collective ops: schemas and the kernel body shared by the communicator backends (core/distributed_ops.h).
#include "core/distributed_ops.h"

#include <cctype>

#include "xpuruntime/distributed.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::distributed {

namespace {

std::shared_ptr<Communicator> comm_of(const OpDescriptor& desc) {
  XPURT_CHECK(desc.attrs.has("comm"), desc.op, " needs the attribute 'comm' (a communicator's handle)");
  return Communicator::find(desc.attrs.get_int("comm", -1));
}

// The peer or root rank attribute `name` of `desc`, checked against the communicator's size.
int rank_attr(const OpDescriptor& desc, const Communicator& comm, const char* name, std::int64_t fallback) {
  const std::int64_t r = desc.attrs.get_int(name, fallback);
  XPURT_CHECK(r >= 0 && r < comm.size(), desc.op, ": ", name, " must be a rank in [0, ", comm.size(), "), got ", r);
  return static_cast<int>(r);
}

std::vector<TensorDesc> infer_collective(const OpDescriptor& desc) {
  XPURT_CHECK(!desc.inputs.empty() && desc.inputs[0].present, desc.op, " needs its input x");
  const std::shared_ptr<Communicator> comm = comm_of(desc);
  const TensorDesc& x = desc.inputs[0];
  std::vector<std::int64_t> shape = x.shape;
  if (desc.op == "all_reduce" || desc.op == "reduce_scatter") {
    (void)reduce_op_from_name(desc.attrs.get_string("op", "sum"));
  }
  if (desc.op == "all_gather" || desc.op == "reduce_scatter") {
    XPURT_CHECK(!shape.empty(), desc.op, " needs a tensor of rank >= 1 (it works along axis 0), got a scalar");
  }
  if (desc.op == "all_gather") shape[0] *= comm->size();
  if (desc.op == "reduce_scatter") {
    XPURT_CHECK(shape[0] % comm->size() == 0, "reduce_scatter: axis 0 of x (", shape[0],
                ") must be a multiple of the number of ranks (", comm->size(), ")");
    shape[0] /= comm->size();
  }
  if (desc.op == "broadcast") rank_attr(desc, *comm, "root", 0);
  if (desc.op == "send" || desc.op == "recv") {
    const int peer = rank_attr(desc, *comm, "peer", -1);
    XPURT_CHECK(peer != comm->rank(), desc.op, ": peer ", peer, " is this rank itself");
  }
  if (desc.op == "send") return {};
  return {TensorDesc::contiguous(shape, x.dtype, desc.device)};
}

bool reducible(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt32:
    case DType::kInt64:
      return true;
    default:
      return false;
  }
}

}  // namespace

const std::vector<std::string>& collective_ops() {
  static const std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter",
                                               "broadcast",  "send",       "recv"};
  return ops;
}

void register_collective_schemas(KernelRegistry& registry) {
  auto add = [&](const char* name, std::vector<std::string> outputs, const char* doc) {
    OpSchema schema;
    schema.name = name;
    schema.family = "collective";
    schema.inputs = {"x"};
    schema.outputs = std::move(outputs);
    schema.doc = doc;
    schema.infer = infer_collective;
    registry.add_schema(std::move(schema));
  };
  add("all_reduce", {"y"}, "y = op over ranks of x; comm (a communicator handle), op=sum|prod|max|min|avg");
  add("all_gather", {"y"}, "y = the ranks' x stacked along axis 0 ([size * x.shape[0], ...]); comm");
  add("reduce_scatter", {"y"},
      "y = this rank's share (axis 0 split in size parts) of op over ranks of x; comm, op=sum|prod|max|min|avg");
  add("broadcast", {"y"}, "y = x of rank root on every rank; comm, root=0");
  add("send", {}, "sends x to rank peer (no output); comm, peer");
  add("recv", {"y"}, "y = the tensor rank peer sends (x gives its shape and dtype; its data is not read); comm, peer");
}

std::unique_ptr<Kernel> make_collective_kernel(const std::string& op, const std::string& backend,
                                               const std::string& folder, DeviceType device_type,
                                               const std::string& summary, const std::string& name) {
  const std::string kernel_name = name.empty() ? backend : name;
  auto supports = [op, backend, device_type, kernel_name](const OpDescriptor& desc, const ExecutionPolicy&) -> Support {
    if (desc.device.type != device_type) {
      return Support::no(device_type == DeviceType::kCPU ? "runs on the CPU" : "runs on CUDA devices");
    }
    std::shared_ptr<Communicator> comm;
    try {
      comm = comm_of(desc);
    } catch (const XpuRuntimeError& e) {
      return Support::no(e.what());
    }
    if (comm->backend() != backend) {
      return Support::no(detail::str_cat("communicator ", comm->handle(), " is a ", comm->backend(), " communicator"));
    }
    if (auto tuning = nccl_tuning_of(kernel_name)) {
      // Note [NCCL algorithm and protocol kernels]
      if (comm->options().nccl_algo != tuning->algo || comm->options().nccl_proto != tuning->proto) {
        return Support::no(detail::str_cat("communicator ", comm->handle(), " was created with NCCL_ALGO='",
                                           comm->options().nccl_algo, "' NCCL_PROTO='", comm->options().nccl_proto,
                                           "', this kernel needs '", tuning->algo, "' '", tuning->proto, "'"));
      }
    }
    if (comm->device() != desc.device) {
      return Support::no(
          detail::str_cat(comm->str(), " is bound to ", comm->device().str(), ", the op runs on ", desc.device.str()));
    }
    for (const TensorDesc& in : desc.inputs) {
      if (in.present && !in.is_contiguous()) return Support::no("collectives take contiguous tensors");
    }
    const bool reduces = op == "all_reduce" || op == "reduce_scatter";
    if (reduces && !reducible(desc.inputs[0].dtype)) {
      return Support::no(detail::str_cat("no reduction of ", dtype_name(desc.inputs[0].dtype), " tensors"));
    }
    return Support::yes();
  };
  auto run = [op](const KernelLaunch& launch) {
    const OpDescriptor& desc = *launch.desc;
    const std::shared_ptr<Communicator> comm = comm_of(desc);
    const Tensor& x = launch.input(0);
    if (op == "all_reduce") {
      comm->all_reduce(x, launch.output(0), reduce_op_from_name(desc.attrs.get_string("op", "sum")), launch.stream);
    } else if (op == "all_gather") {
      comm->all_gather(x, launch.output(0), launch.stream);
    } else if (op == "reduce_scatter") {
      comm->reduce_scatter(x, launch.output(0), reduce_op_from_name(desc.attrs.get_string("op", "sum")), launch.stream);
    } else if (op == "broadcast") {
      comm->broadcast(x, launch.output(0), static_cast<int>(desc.attrs.get_int("root", 0)), launch.stream);
    } else if (op == "send") {
      comm->send(x, static_cast<int>(desc.attrs.get_int("peer", -1)), launch.stream);
    } else if (op == "recv") {
      comm->recv(launch.output(0), static_cast<int>(desc.attrs.get_int("peer", -1)), launch.stream);
    }
  };
  // Collectives reduce in a fixed order for a fixed communicator (NCCL: for a fixed topology and algorithm).
  return std::make_unique<FunctionKernel>(KernelInfo{op, kernel_name, folder, device_type, true, summary}, supports, run);
}

const std::vector<std::pair<std::string, NcclTuning>>& nccl_tuned_kernels() {
  static const auto* kernels = [] {
    auto* out = new std::vector<std::pair<std::string, NcclTuning>>();
    for (const char* algo : {"Ring", "Tree"}) {
      std::string lower_algo(algo);
      for (char& ch : lower_algo) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      out->push_back({"nccl_" + lower_algo, NcclTuning{algo, ""}});
      for (const char* proto : {"LL", "LL128", "Simple"}) {
        std::string lower_proto(proto);
        for (char& ch : lower_proto) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        out->push_back({"nccl_" + lower_algo + "_" + lower_proto, NcclTuning{algo, proto}});
      }
    }
    return out;
  }();
  return *kernels;
}

std::optional<NcclTuning> nccl_tuning_of(const std::string& kernel) {
  for (const auto& [name, tuning] : nccl_tuned_kernels()) {
    if (name == kernel) return tuning;
  }
  return std::nullopt;
}

}  // namespace xpuruntime::distributed
