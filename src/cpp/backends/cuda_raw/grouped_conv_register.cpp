// conv2d's "grouped_gemm" kernel of the cuda_raw backend (Note [Grouped convolutions as GEMMs] in grouped_conv.cu):
// a channels-last grouped convolution whose groups reduce over at least kMinGroupDepth values, as the gather of
// grouped_conv.cu and one cuBLAS strided batch of the groups' GEMMs per round of output positions, then the residual,
// bias and activation in place. register_cuda_raw_grouped_conv is called on its own, before cudnn's registration
// (core/backend_registration.cpp), so that it is the first choice for the convolutions it takes and is timed against
// cuDNN's plans there (Note [Timed first choices] in core/dispatcher.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/conv_layout.h"
#include "core/cublas_utils.h"
#include "core/cuda_utils.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

// A group's GEMM reduces over at least this many values (C/g x kh x kw): below it the gather's kh x kw copies of the
// input cost more than cuDNN's grouped kernels lose (ResNeXt's and RegNet's 3x3 groups reduce over 36-504).
constexpr std::int64_t kMinGroupDepth = 1024;
// The gathered patches a round holds at most (the workspace's first part; the policy's workspace_limit may lower it).
constexpr std::size_t kGatherBudget = std::size_t{64} << 20;
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

cuda_raw::GroupedConvGeometry geometry_of(const OpDescriptor& desc) {
  const auto& x = desc.inputs[0].shape;       // [N, H, W, C]
  const auto& w = desc.inputs[1].shape;       // [O, kh, kw, C/g]
  const auto& y = desc.outputs.at(0).shape;   // [N, OH, OW, O]
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  cuda_raw::GroupedConvGeometry g;
  g.n = x[0];
  g.h = x[1];
  g.w = x[2];
  g.c = x[3];
  g.o = w[0];
  g.kh = w[1];
  g.kw = w[2];
  g.oh = y[1];
  g.ow = y[2];
  g.groups = desc.attrs.get_int("groups", 1);
  g.stride_h = strides.at(0);
  g.stride_w = strides.at(1);
  g.pad_h = pads.at(0);
  g.pad_w = pads.at(1);
  g.dilation_h = dilations.at(0);
  g.dilation_w = dilations.at(1);
  return g;
}

// The groups' GEMMs of one round of `rows` output positions (Note [Row-major GEMM through column-major cuBLAS] in
// core/cublas_utils.cpp): row-major y[rows, O/g] of group j (columns j * O/g.., ld O) = col_j[rows, K] @ w_j[O/g, K]^T.
cublas::GemmShape round_shape(const cuda_raw::GroupedConvGeometry& g, std::int64_t rows) {
  const std::int64_t per_group = g.o / g.groups;
  cublas::GemmShape shape;
  shape.m = per_group;
  shape.n = rows;
  shape.k = g.depth();
  shape.transpose_lhs = true;
  shape.ld_lhs = g.depth();
  shape.ld_rhs = g.depth();
  shape.ld_out = g.o;
  shape.batch = g.groups;
  shape.stride_lhs = per_group * g.depth();
  shape.stride_rhs = rows * g.depth();
  shape.stride_out = per_group;
  return shape;
}

class GroupedGemmConvPlan final : public KernelPlan {
 public:
  GroupedGemmConvPlan(const cuda_raw::GroupedConvGeometry& g, std::int64_t rows, std::size_t gather_bytes,
                      std::size_t cublas_workspace, cublasComputeType_t compute, std::string activation, int device)
      : g_(g),
        rows_(rows),
        gather_bytes_(gather_bytes),
        cublas_workspace_(cublas_workspace),
        compute_(compute),
        activation_(std::move(activation)),
        device_(device) {}

  void run(const KernelLaunch& launch) const override {
    detail::CudaDeviceGuard guard(device_);
    const std::int64_t positions = g_.positions();
    if (positions == 0 || g_.o == 0) return;
    XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= workspace_bytes(),
                          "conv2d grouped_gemm needs ", workspace_bytes(), " bytes of workspace, got ",
                          launch.workspace_bytes);
    const DType dtype = launch.input(0).dtype();
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    char* col = static_cast<char*>(launch.workspace);
    const cublasHandle_t handle = cublas::thread_cublas_handle(device_, stream);
    cublas::bind_workspace(handle, col + gather_bytes_, launch.workspace_bytes - gather_bytes_);
    const auto element = static_cast<std::int64_t>(dtype_size(dtype));
    char* y = static_cast<char*>(launch.output(0).data_ptr());
    for (std::int64_t p0 = 0; p0 < positions; p0 += rows_) {
      const std::int64_t rows = std::min(rows_, positions - p0);
      cuda_raw::grouped_conv_im2col(launch.input(0).data_ptr(), col, dtype, g_, p0, rows, launch.stream.handle);
      cublas::gemm(handle, round_shape(g_, rows), dtype, compute_, launch.input(1).data_ptr(), col,
                   y + p0 * g_.o * element);
    }
    const bool residual = launch.num_inputs > 3 && launch.input(3).defined();
    if (residual) {
      cuda_raw::add_into(y, launch.input(3).data_ptr(), dtype, positions * g_.o, launch.stream.handle);
    }
    const bool bias = launch.num_inputs > 2 && launch.input(2).defined();
    cuda_raw::bias_activation(y, bias ? launch.input(2).data_ptr() : nullptr, dtype, positions, g_.o, activation_,
                              launch.stream.handle);
  }

  std::size_t workspace_bytes() const override { return gather_bytes_ + cublas_workspace_; }

  std::string describe() const override {
    return detail::str_cat("grouped convolution as GEMMs: the patches of ", rows_, " of ", g_.positions(),
                           " output positions a round gathered into the workspace, then a cuBLAS strided batch of ",
                           g_.groups, " GEMMs (m=", g_.o / g_.groups, ", k=", g_.depth(), "), compute ",
                           cublas::compute_type_name(compute_), ", activation ", activation_);
  }

 private:
  cuda_raw::GroupedConvGeometry g_;
  std::int64_t rows_;
  std::size_t gather_bytes_;
  std::size_t cublas_workspace_;
  cublasComputeType_t compute_;
  std::string activation_;
  int device_;
};

// The workspace split of a plan: the cuBLAS part, the positions a round gathers (0: not even one fits) and the
// gathered patches' bytes (aligned).
struct Budget {
  std::size_t cublas_workspace = 0;
  std::int64_t rows = 0;
  std::size_t gather_bytes = 0;
};

Budget budget_of(const OpDescriptor& desc, const ExecutionPolicy& policy, const cuda_raw::GroupedConvGeometry& g) {
  Budget b;
  b.cublas_workspace = cublas::default_cublas_workspace(desc.compute_capability, policy.workspace_limit);
  std::size_t gather = kGatherBudget;
  if (policy.workspace_limit > 0) {
    b.cublas_workspace = std::min<std::size_t>(b.cublas_workspace, policy.workspace_limit / 4);
    const std::size_t left = policy.workspace_limit - b.cublas_workspace;
    gather = std::min(gather, left > kAlign ? left - kAlign : 0);
  }
  const std::size_t row_bytes =
      static_cast<std::size_t>(g.groups * g.depth()) * dtype_size(desc.inputs[0].dtype);
  b.rows = std::min<std::int64_t>(static_cast<std::int64_t>(gather / std::max<std::size_t>(row_bytes, 1)),
                                  g.positions());
  b.gather_bytes = align_up(static_cast<std::size_t>(b.rows) * row_bytes);
  return b;
}

class GroupedGemmConvKernel final : public Kernel {
 public:
  GroupedGemmConvKernel() : Kernel(info()) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    try {
      if (Support device = cublas::check_gemm_device(desc, "conv2d grouped_gemm"); !device) return device;
      if (!detail::is_nhwc(desc.attrs, desc.op)) {
        return Support::no("conv2d grouped_gemm takes channels-last convolutions only (layout NHWC)");
      }
      if (desc.outputs.empty()) return Support::no("conv2d grouped_gemm needs the op's output inferred first");
      const cuda_raw::GroupedConvGeometry g = geometry_of(desc);
      if (g.groups <= 1 || g.c % g.groups != 0 || g.o % g.groups != 0) {
        return Support::no("conv2d grouped_gemm takes grouped convolutions only (groups > 1)");
      }
      if (g.positions() == 0 || g.o == 0) return Support::no("conv2d grouped_gemm: an empty output");
      if (g.group_channels() == 1) {
        return Support::no("conv2d grouped_gemm does not take depthwise convolutions (one channel a group)");
      }
      if (g.depth() < kMinGroupDepth) {
        return Support::no(detail::str_cat("conv2d grouped_gemm takes groups that reduce over at least ",
                                           kMinGroupDepth, " values (C/groups x kh x kw), this one ", g.depth()));
      }
      const std::string activation = desc.attrs.get_string("activation", "none");
      if (activation != "none" && activation != "relu" && activation != "relu6" && activation != "silu" &&
          activation != "hard_swish" && activation != "gelu" && activation != "gelu_tanh") {
        return Support::no("activation none, relu, relu6, silu, hard_swish, gelu or gelu_tanh");
      }
      const Budget b = budget_of(desc, policy, g);
      if (b.rows < 1) {
        return Support::no(detail::str_cat("conv2d grouped_gemm gathers ", g.groups * g.depth(),
                                           " values per output position into its workspace, more than the policy's "
                                           "workspace_limit of ", policy.workspace_limit, " bytes leaves"));
      }
      return cublas::check_int32(round_shape(g, b.rows), "conv2d grouped_gemm");
    } catch (const std::exception& e) {
      return Support::no(detail::str_cat("conv2d grouped_gemm: ", e.what()));
    }
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    if (!record.empty()) {
      throw InvalidArgumentError(
          detail::str_cat("conv2d grouped_gemm has no plan record (its plan follows from the shapes), got '", record,
                          "'"));
    }
    const cuda_raw::GroupedConvGeometry g = geometry_of(desc);
    const Budget b = budget_of(desc, policy, g);
    XPURT_CHECK(b.rows >= 1, "conv2d grouped_gemm: the workspace limit leaves no room for one output position");
    return std::make_unique<GroupedGemmConvPlan>(g, b.rows, b.gather_bytes, b.cublas_workspace,
                                                 cublas::compute_type(desc.inputs[0].dtype, desc.precision),
                                                 desc.attrs.get_string("activation", "none"), desc.device.index);
  }

  std::string timed_against_others(const OpDescriptor&) const override {
    return "the grouped GEMMs or cuDNN's plans may be faster at this shape";
  }

 private:
  static KernelInfo info() {
    KernelDecl decl = cuda_raw::declaration("conv2d", {"x", "weight", "bias", "residual"});
    decl.subject = "grouped_gemm";
    decl.input_ranks = {{4, 4}, {4, 4}};
    decl.one_dtype = true;
    return KernelInfo{"conv2d", "grouped_gemm", "cuda_raw", DeviceType::kCUDA, true,
                      "grouped convolution (channels-last, groups reducing over 1024+ values) as GEMMs: the patches "
                      "gathered into the workspace, one cuBLAS strided batch over the groups, then residual, bias "
                      "and activation (Note [Grouped convolutions as GEMMs])",
                      std::move(decl)};
  }
};

}  // namespace

void register_cuda_raw_grouped_conv(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<GroupedGemmConvKernel>());
}

}  // namespace xpuruntime
