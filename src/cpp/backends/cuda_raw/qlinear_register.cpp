// Registration of qlinear's "dp4a" kernel of the cuda_raw backend (quant_gemm.cu, Note [The dp4a kernel of qlinear]):
// every shape, layout and alignment, ranked after cuBLASLt's IMMA kernel, which takes the aligned [N, K] GEMMs.
#include <algorithm>
#include <memory>
#include <string>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/cuda_utils.h"
#include "core/quantized_gemm.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cuda_raw {

namespace {

using quantized::QLinearProblem;

constexpr int kDp4aComputeCapability = 61;  // __dp4a: Pascal and newer
constexpr std::size_t kScratchAlignment = 256;
constexpr std::int64_t kMaxColumns = std::int64_t{65535} * 64;  // the grid's y extent times the tile's width

void* align_up(void* pointer, std::size_t alignment) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  return reinterpret_cast<void*>((address + alignment - 1) / alignment * alignment);
}

class Dp4aPlan final : public KernelPlan {
 public:
  explicit Dp4aPlan(QLinearProblem q) : q_(q) {}

  void run(const KernelLaunch& launch) const override {
    if (q_.m == 0 || q_.n == 0) return;
    ::xpuruntime::detail::CudaDeviceGuard guard(launch.desc->device.index);
    void* scratch = nullptr;
    if (q_.needs_prologue(false)) {
      XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= workspace_bytes(),
                            "the dp4a qlinear plan needs ", workspace_bytes(), " bytes of workspace, got ",
                            launch.workspace_bytes);
      scratch = align_up(launch.workspace, kScratchAlignment);
      quantized_prologue(q_.prologue(launch, scratch, nullptr), q_.n, launch.stream.handle);
    }
    QLinearDp4a args;
    args.x = launch.input(0).data_ptr();
    args.x_unsigned = q_.x_unsigned;
    args.weight = static_cast<const std::int8_t*>(launch.input(1).data_ptr());
    args.weight_nk = q_.weight_nk;
    args.out = launch.output(0).data_ptr();
    args.m = q_.m;
    args.n = q_.n;
    args.k = q_.k;
    args.epilogue = q_.epilogue(launch, scratch);
    qlinear_dp4a(args, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override {
    return q_.needs_prologue(false) ? q_.prologue_bytes() + kScratchAlignment : 0;
  }

  std::string describe() const override {
    return ::xpuruntime::detail::str_cat("cuda_raw dp4a 64x64 tiles, m=", q_.m, " n=", q_.n, " k=", q_.k, " weight ",
                           q_.weight_nk ? "[N, K]" : "[K, N]", ", epilogue fused: ", q_.describe_epilogue());
  }

 private:
  QLinearProblem q_;
};

class Dp4aKernel final : public Kernel {
 public:
  Dp4aKernel() : Kernel(make_info()) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
    const QLinearProblem q = QLinearProblem::of(desc);
    if (q.n > kMaxColumns) {
      return Support::no(::xpuruntime::detail::str_cat("dp4a qlinear takes up to ", kMaxColumns, " output channels, got ", q.n));
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string&) const override {
    return std::make_unique<Dp4aPlan>(QLinearProblem::of(desc));
  }

 private:
  static KernelInfo make_info() {
    KernelDecl decl;
    decl.subject = "dp4a qlinear";
    decl.input_names = {"x", "weight", "w_scale", "bias", "x_zero_point"};
    decl.on_device = true;
    decl.min_compute_capability = std::max(kDp4aComputeCapability, XPURT_CUDA_RAW_MIN_ARCH);
    decl.built_for_architectures = XPURT_CUDA_RAW_MIN_ARCH >= kDp4aComputeCapability;
    decl.dtypes = DTypeSet{{DType::kInt8, DType::kUInt8, DType::kInt32, DType::kFloat32}, {}};
    decl.layout = Layout::kContiguous;
    return KernelInfo{"qlinear", "dp4a", "cuda_raw", DeviceType::kCUDA, true,
                      "int8 GEMM by __dp4a in 64x64 tiles with the epilogue fused (any shape, alignment and weight "
                      "layout; Note [The dp4a kernel of qlinear])",
                      std::move(decl)};
  }
};

}  // namespace

void register_qlinear(KernelRegistry& registry) { registry.add_kernel(std::make_unique<Dp4aKernel>()); }

}  // namespace xpuruntime::cuda_raw
