// Registration of the cpu backend, its kernel and plan classes, and the checks every cpu kernel makes.
// See Note [The cpu backend as the oracle] in cpu_common.h.
#include <cstdlib>
#include <string>

#include "core/distributed_ops.h"
#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/onnx/onnx_kernels.h"
#include "core/conv_layout.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

namespace cpu {

namespace {

bool is_cpu_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat64;
}

class CpuPlan final : public KernelPlan {
 public:
  CpuPlan(const CpuRunFn* run, CpuContext context, bool uses_gemm, bool uses_isa)
      : run_(run), context_(context), uses_gemm_(uses_gemm), uses_isa_(uses_isa) {}
  void run(const KernelLaunch& launch) const override {
    const SpinScope spin(context_.allow_spinning);  // the policy of this kernel's parallel loops
    (*run_)(launch, context_);
  }
  std::string describe() const override {
    const bool packed = uses_gemm_ && context_.gemm == GemmImpl::kPacked;
    return detail::str_cat("cpu reference, ", context_.threads, context_.threads == 1 ? " thread" : " threads",
                           context_.allow_spinning || context_.threads == 1 ? "" : ", no spinning",
                           uses_gemm_ ? ", gemm " : "", uses_gemm_ ? gemm_impl_name(context_.gemm) : "",
                           uses_isa_ || packed ? ", isa " : "", uses_isa_ || packed ? context_.isa->name : "",
                           packed && XPURT_WITH_BLAS ? " (" + packed_gemm_limits(context_) + ")" : std::string());
  }

 private:
  const CpuRunFn* run_;  // owned by the kernel, which the registry keeps for the life of the process
  CpuContext context_;
  bool uses_gemm_;  // the op runs on the GEMM (its description names the GEMM implementation)
  bool uses_isa_;   // the op runs cpu_isa.h kernels (its description names the instruction set)
};

}  // namespace

const char* gemm_impl_name(GemmImpl impl) {
  switch (impl) {
    case GemmImpl::kBlas:
      return "openblas";
    case GemmImpl::kPacked:
      return "packed";
    case GemmImpl::kFallback:
      break;
  }
  return "fallback";
}

CpuContext make_context(const ExecutionPolicy& policy) {
  CpuContext context;
  context.threads = std::max(policy.intra_op_threads > 0 ? policy.intra_op_threads : default_threads(), 1);
  context.allow_spinning = policy.allow_spinning;
  context.isa = &isa_kernels();
  const char* env = std::getenv("XPURT_CPU_GEMM");
  const std::string choice = env != nullptr ? env : "auto";
  if (choice == "fallback") {
    context.gemm = GemmImpl::kFallback;
  } else if (choice == "blas" || choice == "openblas") {
    if (!XPURT_WITH_BLAS) {
      throw UnsupportedOperationError(
          "XPURT_CPU_GEMM=blas, but this xpuruntime was built without OpenBLAS; install libopenblas-dev and "
          "rebuild, or unset XPURT_CPU_GEMM");
    }
    context.gemm = GemmImpl::kBlas;
  } else if (choice == "packed") {
    context.gemm = GemmImpl::kPacked;
  } else {
    XPURT_CHECK(choice == "auto" || choice.empty(), "XPURT_CPU_GEMM='", choice,
                "' is not valid; use 'auto' (the packed GEMM on an AVX2 or AVX-512 CPU, else OpenBLAS when built "
                "with it), 'packed', 'blas' or 'fallback'");
    // Note [Packed GEMM]: measured against OpenBLAS on AVX-512 only; on SSE2 alone auto keeps OpenBLAS.
    const bool vector_isa = std::string(context.isa->name) != "baseline";
    context.gemm = vector_isa ? GemmImpl::kPacked : (XPURT_WITH_BLAS ? GemmImpl::kBlas : GemmImpl::kFallback);
  }
  context.packed_small_gemms = context.gemm == GemmImpl::kPacked && blas_older_than(*context.isa);
  context.skinny_gemms = context.gemm == GemmImpl::kPacked &&
                         (context.packed_small_gemms || choice == "packed" || !XPURT_WITH_BLAS);
  const char* windows_env = std::getenv("XPURT_CPU_CONV_WINDOWS");
  const std::string windows = windows_env != nullptr ? windows_env : "auto";
  XPURT_CHECK(windows == "auto" || windows == "packed" || windows.empty(), "XPURT_CPU_CONV_WINDOWS='", windows,
              "' is not valid; use 'auto' (a convolution's windows read in place or its pixels as the GEMM's rows "
              "where that pays) or 'packed' (the windows always packed, the output channels as rows)");
  context.conv_windows_auto = windows != "packed";
  return context;
}

Activation activation_from_name(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  if (name == "silu") return Activation::kSilu;
  if (name == "hard_swish") return Activation::kHardSwish;
  if (name == "relu6") return Activation::kRelu6;
  XPURT_CHECK(name == "none", "unknown activation '", name,
              "'; valid: none, relu, gelu, gelu_tanh, silu, hard_swish, relu6");
  return Activation::kNone;
}

bool in_set(DType dtype, DTypeSet dtypes) {
  switch (dtypes) {
    case DTypeSet::kFloat: return is_cpu_float(dtype);
    case DTypeSet::kFloatAndInt: return is_cpu_float(dtype) || dtype == DType::kInt32 || dtype == DType::kInt64;
    case DTypeSet::kAll: return true;
    case DTypeSet::kQuantized:
      return dtype == DType::kInt8 || dtype == DType::kUInt8 || dtype == DType::kInt32 || dtype == DType::kFloat32 ||
             dtype == DType::kFloat16;
  }
  return false;
}

const char* set_text(DTypeSet dtypes) {
  switch (dtypes) {
    case DTypeSet::kFloat: return "float32, float16, bfloat16 and float64";
    case DTypeSet::kFloatAndInt: return "float32, float16, bfloat16, float64, int32 and int64";
    case DTypeSet::kAll: return "every dtype";
    case DTypeSet::kQuantized: return "int8, uint8, int32, float32 and float16";
  }
  return "";
}

namespace {

// A view of the 4-D tensor `t` with its dims permuted by `perm` (no copy; the view keeps `t` alive).
Tensor permuted(const Tensor& t, const std::vector<int>& perm) {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  for (const int d : perm) {
    shape.push_back(t.shape()[static_cast<std::size_t>(d)]);
    strides.push_back(t.strides()[static_cast<std::size_t>(d)]);
  }
  return Tensor::from_blob(t.data_ptr(), shape, strides, t.dtype(), t.device(), std::make_shared<Tensor>(t));
}

const std::vector<int> kToNchw = {0, 3, 1, 2};  // [N, H, W, C] -> [N, C, H, W]; [O, kh, kw, I] -> [O, I, kh, kw]
const std::vector<int> kToNhwc = {0, 2, 3, 1};  // [N, C, H, W] -> [N, H, W, C]

}  // namespace

CpuRunFn nhwc_through_nchw(CpuRunFn nchw) {
  return [nchw = std::move(nchw)](const KernelLaunch& launch, const CpuContext& context) {
    const OpDescriptor& desc = *launch.desc;
    if (!detail::is_nhwc(desc.attrs, desc.op)) {
      nchw(launch, context);
      return;
    }
    OpDescriptor nchw_desc = desc;
    nchw_desc.attrs.set("layout", std::string("NCHW"));
    std::vector<Tensor> inputs(launch.inputs, launch.inputs + launch.num_inputs);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      // x, conv2d's weight and residual are 4-D and channels-last; the bias [O] is not.
      if (!inputs[i].defined() || inputs[i].dim() != 4) continue;
      inputs[i] = permuted(inputs[i], kToNchw).contiguous();
      nchw_desc.inputs[i].shape = inputs[i].shape();
      nchw_desc.inputs[i].strides = inputs[i].strides();
      // A copy made for this call: nothing to keep packed (Note [Weights packed once per plan] in cpu_gemm.cpp).
      nchw_desc.inputs[i].constant = false;
    }
    Tensor& out = launch.output(0);
    Tensor scratch = Tensor::empty(detail::nhwc_to_nchw(out.shape()), out.dtype(), out.device());
    nchw_desc.outputs[0].shape = scratch.shape();
    nchw_desc.outputs[0].strides = scratch.strides();
    KernelLaunch inner = launch;
    inner.desc = &nchw_desc;
    inner.inputs = inputs.data();
    inner.outputs = &scratch;
    inner.num_outputs = 1;
    nchw(inner, context);
    out.copy_from(permuted(scratch, kToNhwc));
  };
}

KernelDecl declaration(const std::string& op, DTypeSet dtypes) {
  KernelDecl decl;
  decl.subject = "the cpu kernel of '" + op + "'";
  // Every DType (kUInt64 is the last) in `dtypes`; kAll declares no dtype set, which takes any.
  if (dtypes != DTypeSet::kAll) {
    for (int k = 0; k <= static_cast<int>(DType::kUInt64); ++k) {
      if (in_set(static_cast<DType>(k), dtypes)) decl.dtypes.dtypes.push_back(static_cast<DType>(k));
    }
  }
  decl.dtypes.text = set_text(dtypes);
  decl.layout = Layout::kContiguous;
  return decl;
}

Support check_placement(const OpDescriptor& desc, const ExecutionPolicy& policy, DTypeSet dtypes) {
  if (desc.device.type != DeviceType::kCPU) {
    return Support::no(detail::str_cat("the cpu kernel of '", desc.op, "' runs on CPU tensors; the inputs are on ",
                                       desc.device.str(), " (copy them with .to('cpu') or use a CUDA kernel)"));
  }
  if (policy.precision == Precision::kInt8 && dtypes != DTypeSet::kQuantized) {
    return Support::no("the cpu kernels have no int8 path; use precision fp32, tf32, fp16 or bf16");
  }
  auto on_cpu = [&](const TensorDesc& tensor, const char* role, std::size_t index) -> Support {
    if (!tensor.present || tensor.device.type == DeviceType::kCPU) return Support::yes();
    return Support::no(detail::str_cat("the cpu kernel of '", desc.op, "' runs on CPU tensors; ", role, " ", index,
                                       " is on ", tensor.device.str()));
  };
  auto check = [&](const TensorDesc& tensor, const char* role, std::size_t index) -> Support {
    if (!tensor.present) return Support::yes();
    if (Support placed = on_cpu(tensor, role, index); !placed) return placed;
    if (!in_set(tensor.dtype, dtypes)) {
      return Support::no(detail::str_cat("the cpu kernel of '", desc.op, "' supports ", set_text(dtypes), "; ", role,
                                         " ", index, " is ", dtype_name(tensor.dtype)));
    }
    if (!tensor.is_contiguous()) {
      return Support::no(detail::str_cat("the cpu kernel of '", desc.op, "' needs contiguous tensors; ", role, " ",
                                         index, " is ", tensor.str(), " (call .contiguous() first)"));
    }
    return Support::yes();
  };
  for (std::size_t i = 0; i < desc.inputs.size(); ++i) {  // their dtype and layout: the declaration's
    Support s = on_cpu(desc.inputs[i], "input", i);
    if (!s) return s;
  }
  for (std::size_t i = 0; i < desc.outputs.size(); ++i) {
    Support s = check(desc.outputs[i], "output", i);
    if (!s) return s;
  }
  return Support::yes();
}

CpuKernel::CpuKernel(const std::string& op, std::string summary, CpuRunFn run, DTypeSet dtypes)
    : Kernel(KernelInfo{op, "cpu", "cpu", DeviceType::kCPU, true, std::move(summary), declaration(op, dtypes)}),
      run_(std::move(run)),
      dtypes_(dtypes) {}

Support CpuKernel::accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const {
  return check_placement(desc, policy, dtypes_);
}

std::unique_ptr<KernelPlan> CpuKernel::build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                             const std::string& record) const {
  (void)record;  // nothing to choose, nothing recorded
  Support support = supports(desc, policy);
  if (!support) throw UnsupportedOperationError(support.reason());
  const bool uses_gemm = desc.op == "matmul" || desc.op == "linear" || desc.op == "linear_grad_weight" ||
                         desc.op == "conv2d" || desc.op == "attention";
  const bool uses_isa = desc.op == "conv2d" || desc.op == "max_pool2d";
  return std::make_unique<CpuPlan>(&run_, make_context(policy), uses_gemm, uses_isa);
}

}  // namespace cpu

void register_cpu(KernelRegistry& registry) {
  cpu::register_gemm_kernels(registry);
  cpu::register_conv_kernels(registry);
  cpu::register_pool_kernels(registry);
  cpu::register_norm_kernels(registry);
  cpu::register_elementwise_kernels(registry);
  cpu::register_reduce_kernels(registry);
  cpu::register_attention_kernels(registry);
  cpu::register_data_kernels(registry);
  cpu::register_onnx_kernels(registry);
  cpu::register_fused_kernels(registry);
  cpu::register_quantized_kernels(registry);
  cpu::register_int4_kernels(registry);
  cpu::register_gqa_kernels(registry);
  cpu::register_quantize_kernels(registry);
  // The ONNX reference implementations as node kernels (Note [Node kernels] in core/kernel_registry.cpp).
  onnx_ref::register_onnx_node_kernels(registry);
  // The host communicators' collectives (core/distributed.cpp): ranks of one process on the CPU.
  for (const std::string& op : distributed::collective_ops()) {
    registry.add_kernel(distributed::make_collective_kernel(
        op, "host", "cpu", DeviceType::kCPU, "in-process " + op + " between the CPU ranks of a host communicator"));
  }
}

}  // namespace xpuruntime
