// conv2d's "grouped_gemm" kernel of the cuda_raw backend (Note [Grouped convolutions as GEMMs] in grouped_conv.cu):
// which convolutions it takes and how its plan splits the workspace (CPU-runnable: building a plan touches no
// device), its place before cuDNN in the priority order; on a GPU, its outputs against the cpu kernel's at awkward
// shapes (odd group widths that take the element-wise gather, strides, dilations, asymmetric pads, a 1-D kernel as
// wav2vec 2.0's, several rounds under a workspace limit, every epilogue) in float32, float16 and bfloat16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernel_run.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

struct GroupedCase {
  std::int64_t n, c, h, w, o, kh, kw, groups;
  Shape strides, pads, dilations;  // pads [top, left, bottom, right]
  std::string name;
};

// wav2vec 2.0's positional convolution (as the 1-D decomposition writes it: height 1), at batch 1.
GroupedCase wav2vec2_case() {
  return {1, 768, 1, 49, 768, 1, 128, 16, {1, 1}, {0, 64, 0, 64}, {1, 1}, "wav2vec2 positional"};
}

Attributes attrs_of(const GroupedCase& gc, const std::string& activation) {
  return Attributes()
      .set("strides", gc.strides)
      .set("pads", gc.pads)
      .set("dilations", gc.dilations)
      .set("groups", gc.groups)
      .set("layout", std::string("NHWC"))
      .set("activation", activation);
}

// The descriptor of `gc` channels-last on cuda:0 (compute capability 9.0), its output inferred; nothing runs.
OpDescriptor grouped_desc(const GroupedCase& gc, DType dtype, const std::string& activation = "none",
                          bool bias = true) {
  OpDescriptor desc;
  desc.op = "conv2d";
  desc.device = Device::cuda(0);
  desc.compute_capability = 90;
  desc.inputs = {TensorDesc::contiguous({gc.n, gc.h, gc.w, gc.c}, dtype, desc.device),
                 TensorDesc::contiguous({gc.o, gc.kh, gc.kw, gc.c / gc.groups}, dtype, desc.device)};
  if (bias) desc.inputs.push_back(TensorDesc::contiguous({gc.o}, dtype, desc.device));
  desc.attrs = attrs_of(gc, activation);
  KernelRegistry::global().infer(desc);
  return desc;
}

const Kernel* grouped_kernel() { return KernelRegistry::global().find_kernel("conv2d", "grouped_gemm"); }

#if XPURT_WITH_CUDA

TEST(GroupedConvPlans, TakesDeepGroupsChannelsLastOnly) {
  const Kernel* k = grouped_kernel();
  ASSERT_NE(k, nullptr);
  const ExecutionPolicy policy;
  const GroupedCase wav = wav2vec2_case();
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const Support support = k->supports(grouped_desc(wav, dtype), policy);
    EXPECT_TRUE(support) << support.reason();
  }
  EXPECT_FALSE(k->timed_against_others(grouped_desc(wav, DType::kFloat16)).empty());
  // ResNeXt's 3x3 groups of 32 channels reduce over 288 values: cuDNN's.
  const GroupedCase resnext{1, 1024, 14, 14, 1024, 3, 3, 32, {1, 1}, {1, 1, 1, 1}, {1, 1}, "resnext"};
  const Support shallow = k->supports(grouped_desc(resnext, DType::kFloat16), policy);
  EXPECT_FALSE(shallow);
  EXPECT_NE(shallow.reason().find("at least 1024"), std::string::npos) << shallow.reason();
  // Depthwise and ungrouped convolutions, NCHW.
  GroupedCase depthwise = wav;
  depthwise.groups = 768;
  depthwise.kw = 1025;
  depthwise.pads = {0, 512, 0, 512};
  EXPECT_FALSE(k->supports(grouped_desc(depthwise, DType::kFloat16), policy));
  GroupedCase dense = wav;
  dense.groups = 1;
  EXPECT_FALSE(k->supports(grouped_desc(dense, DType::kFloat16), policy));
  OpDescriptor nchw = grouped_desc(wav, DType::kFloat16);
  nchw.attrs.set("layout", std::string("NCHW"));
  nchw.inputs[0] = TensorDesc::contiguous({1, 768, 1, 49}, DType::kFloat16, nchw.device);
  nchw.inputs[1] = TensorDesc::contiguous({768, 48, 1, 128}, DType::kFloat16, nchw.device);
  KernelRegistry::global().infer(nchw);
  OpDescriptor mixed = grouped_desc(wav, DType::kFloat16);
  mixed.inputs[1].dtype = DType::kFloat32;
  const Support dtypes = k->supports(mixed, policy);
  EXPECT_FALSE(dtypes);
  EXPECT_NE(dtypes.reason().find("one dtype"), std::string::npos) << dtypes.reason();
  const Support layout = k->supports(nchw, policy);
  EXPECT_FALSE(layout);
  EXPECT_NE(layout.reason().find("NHWC"), std::string::npos) << layout.reason();
}

TEST(GroupedConvPlans, GathersAsManyPositionsAsTheWorkspaceHolds) {
  const Kernel* k = grouped_kernel();
  ASSERT_NE(k, nullptr);
  const GroupedCase wav = wav2vec2_case();  // 50 positions of 16 x 6144 values: 1.5 MiB of float16 a position
  const OpDescriptor desc = grouped_desc(wav, DType::kFloat16, "gelu");
  const auto plan = k->build(desc, ExecutionPolicy(), "");
  EXPECT_NE(plan->describe().find("50 of 50 output positions a round"), std::string::npos) << plan->describe();
  EXPECT_NE(plan->describe().find("16 GEMMs (m=48, k=6144)"), std::string::npos) << plan->describe();
  EXPECT_NE(plan->describe().find("activation gelu"), std::string::npos) << plan->describe();
  EXPECT_GE(plan->workspace_bytes(), std::size_t{50} * 16 * 6144 * 2);
  // A limit of 8 MiB: a quarter for cuBLAS, 6 MiB less alignment for the gather = 31 positions of 196,608 bytes.
  ExecutionPolicy limited;
  limited.workspace_limit = std::uint64_t{8} << 20;
  ASSERT_TRUE(k->supports(desc, limited));
  const auto rounds = k->build(desc, limited, "");
  EXPECT_NE(rounds->describe().find("31 of 50 output positions a round"), std::string::npos) << rounds->describe();
  EXPECT_LE(rounds->workspace_bytes(), limited.workspace_limit);
  // Too small for one position: refused with the reason.
  limited.workspace_limit = 100000;
  const Support tight = k->supports(desc, limited);
  EXPECT_FALSE(tight);
  EXPECT_NE(tight.reason().find("workspace_limit"), std::string::npos) << tight.reason();
  EXPECT_THROW(k->build(desc, ExecutionPolicy(), "{\"rows\": 4}"), InvalidArgumentError);
}

TEST(GroupedConvPlans, RanksBeforeCudnn) {
  std::vector<std::string> names;
  for (const Kernel* k : KernelRegistry::global().kernels("conv2d")) names.push_back(k->name());
  const auto grouped = std::find(names.begin(), names.end(), "grouped_gemm");
  const auto cudnn = std::find(names.begin(), names.end(), "cudnn");
  ASSERT_NE(grouped, names.end());
  if (cudnn != names.end()) {
    EXPECT_LT(grouped - names.begin(), cudnn - names.begin());
  }
}

#endif  // XPURT_WITH_CUDA

// ---- GPU: against the cpu kernel ----

Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937* rng) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) p[i] = value(*rng);
  return dtype == DType::kFloat32 ? t : ops::cast(t, dtype);
}

TEST(GroupedConvGpu, MatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  const int cc = DeviceManager::instance().get_device_info(Device::cuda(0)).compute_capability();
  const std::vector<GroupedCase> cases = {
      wav2vec2_case(),
      {2, 64, 1, 37, 96, 1, 129, 4, {1, 2}, {0, 64, 0, 63}, {1, 1}, "1-D, stride 2, asymmetric pads, batch 2"},
      // groups that reduce over 1188 and 1078 values (the kernel takes 1024 or more)
      {1, 36, 20, 30, 24, 9, 11, 3, {2, 1}, {2, 3, 1, 2}, {1, 2}, "12 channels a group (element gather), dilation"},
      {3, 44, 6, 5, 10, 7, 7, 2, {1, 1}, {3, 3, 3, 3}, {1, 1}, "22 channels a group (element gather), 7x7"},
  };
  struct Epilogue {
    bool bias, residual;
    std::string activation;
  };
  const std::vector<Epilogue> epilogues = {{false, false, "none"}, {true, false, "gelu"}, {true, true, "relu"},
                                           {false, true, "silu"}};
  std::mt19937 rng(7);
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    if (dtype == DType::kBFloat16 && cc < 80) continue;
    for (const GroupedCase& gc : cases) {
      for (const Epilogue& e : epilogues) {
        std::vector<Tensor> inputs = {random_tensor({gc.n, gc.h, gc.w, gc.c}, dtype, &rng),
                                      random_tensor({gc.o, gc.kh, gc.kw, gc.c / gc.groups}, dtype, &rng),
                                      e.bias ? random_tensor({gc.o}, dtype, &rng) : Tensor(), Tensor()};
        const Attributes attrs = attrs_of(gc, e.activation);
        if (e.residual) {
          const OpDescriptor desc = kernel_run::describe_op("conv2d", {inputs[0], inputs[1]}, attrs);
          inputs[3] = random_tensor(desc.outputs[0].shape, dtype, &rng);
        }
        const std::string what = gc.name + " " + std::string(dtype_name(dtype)) + " bias " +
                                 std::to_string(e.bias) + " residual " + std::to_string(e.residual) + " " +
                                 e.activation;
        const auto want = kernel_run::floats_of(
            kernel_run::run_registry_kernel("conv2d", "cpu", inputs, attrs, Device::cpu()).output);
        const auto run = kernel_run::run_registry_kernel("conv2d", "grouped_gemm", inputs, attrs, Device::cuda(0));
        const auto got = kernel_run::floats_of(run.output);
        ASSERT_EQ(got.size(), want.size()) << what;
        const double terms = static_cast<double>(gc.c / gc.groups * gc.kh * gc.kw);
        // float32: TF32 tensor cores where the policy's precision allows them (Note [GEMM compute types]).
        const double base = dtype == DType::kFloat32 ? 1e-3 : dtype == DType::kFloat16 ? 4e-3 : 3e-2;
        const double atol = base * std::sqrt(terms);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          if (!(std::fabs(got[i] - want[i]) <= atol + base * std::fabs(want[i]))) ++bad;
        }
        EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " off (atol " << atol << "); "
                           << run.describe;
      }
    }
  }
}

// Several rounds of gathered positions (a workspace limit) give the output of one round.
TEST(GroupedConvGpu, RoundsUnderAWorkspaceLimitMatchOneRound) {
  XPURT_SKIP_WITHOUT_GPU();
  GroupedCase gc = wav2vec2_case();
  gc.n = 3;  // 150 positions
  std::mt19937 rng(11);
  const std::vector<Tensor> host = {random_tensor({gc.n, gc.h, gc.w, gc.c}, DType::kFloat16, &rng),
                                    random_tensor({gc.o, gc.kh, gc.kw, gc.c / gc.groups}, DType::kFloat16, &rng),
                                    random_tensor({gc.o}, DType::kFloat16, &rng)};
  const std::vector<Tensor> inputs = kernel_run::on_device(host, Device::cuda(0));
  const Attributes attrs = attrs_of(gc, "none");
  const OpDescriptor desc = kernel_run::describe_op("conv2d", inputs, attrs);
  const Kernel& k = kernel_run::registry_kernel("conv2d", "grouped_gemm");
  const StreamView stream(Device::cuda(0), nullptr);
  std::vector<std::vector<float>> outputs;
  for (const std::uint64_t limit : {std::uint64_t{0}, std::uint64_t{8} << 20}) {
    ExecutionPolicy policy;
    policy.workspace_limit = limit;
    ASSERT_TRUE(k.supports(desc, policy));
    const auto plan = k.build(desc, policy, "");
    std::vector<Tensor> out = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype, Device::cuda(0), &stream)};
    plan->execute(desc, inputs, out, stream);
    stream.synchronize();
    outputs.push_back(kernel_run::floats_of(out[0]));
  }
  // The same values up to the GEMMs' accumulation order (cuBLAS may pick another algorithm for fewer rows).
  ASSERT_EQ(outputs[0].size(), outputs[1].size());
  const double atol = 4e-3 * std::sqrt(6144.0);
  for (std::size_t i = 0; i < outputs[0].size(); ++i) {
    ASSERT_LE(std::fabs(outputs[0][i] - outputs[1][i]), atol + 4e-3 * std::fabs(outputs[0][i])) << "element " << i;
  }
}

}  // namespace
}  // namespace xpuruntime
