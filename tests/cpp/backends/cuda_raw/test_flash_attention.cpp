// The flash_v2 attention kernel (cuda_raw backend) through the public kernel API: what supports() accepts and
// the reasons it gives otherwise (runs anywhere: descriptors need no device), and on a GPU its results against
// the cpu kernel of "attention" on random inputs: head dims 32, 64 and 128, float16 and bfloat16, causal or not, GQA
// and MQA, Sq != Sk, odd lengths that end in partial tiles, explicit masks broadcast in several ways, a custom
// scale, every output element written, and bit-identical reruns; with return_lse=1 the log-sum-exp output against
// the cpu kernel's, and the other attention kernels' refusal of it; with fully_masked_rows="zero" rows masked at every
// key against the cpu kernel's zeros (flash_v2, and the cublas backend's unfused kernel in float32 too), and cudnn's
// refusal of it. The cudnn backend's attention kernel (cuDNN's fused flash attention through its graph API) is
// checked the same way on the cases it supports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"
#include "xpuruntime/version.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

const Kernel* flash_kernel() { return KernelRegistry::global().find_kernel("attention", "flash_v2"); }

// flash_v2 exists in every build with CUDA (the cuda_raw backend); without CUDA (the sanitizer builds) it is at
// most a declared kernel that refuses everything, and there is nothing to test.
#define SKIP_WITHOUT_FLASH()                                                                   \
  do {                                                                                         \
    if (flash_kernel() == nullptr || !get_build_info().with_cuda) {                            \
      GTEST_SKIP() << "this build has no flash_v2 kernel (built without CUDA)";                \
    }                                                                                          \
  } while (0)

TensorDesc tensor_desc(const Shape& shape, DType dtype, Device device = Device::cuda(0),
                       std::uint32_t alignment = 256) {
  return TensorDesc::contiguous(shape, dtype, device, alignment);
}

// A descriptor of attention(q, k, v[, mask]) on `device`, shapes validated by the op schema.
OpDescriptor attention_desc(const Shape& q, const Shape& k, const Shape& v, DType dtype = DType::kBFloat16,
                            bool causal = false, Device device = Device::cuda(0), int compute_capability = 90,
                            const Shape& mask = {}) {
  OpDescriptor desc;
  desc.op = "attention";
  desc.inputs = {tensor_desc(q, dtype, device), tensor_desc(k, dtype, device), tensor_desc(v, dtype, device),
                 mask.empty() ? TensorDesc() : tensor_desc(mask, dtype, device)};
  desc.attrs.set("causal", std::int64_t{causal ? 1 : 0});
  desc.device = device;
  desc.compute_capability = device.is_cuda() ? compute_capability : 0;
  KernelRegistry::global().infer(desc);
  return desc;
}

Support flash_supports(const OpDescriptor& desc) { return flash_kernel()->supports(desc, ExecutionPolicy{}); }

void expect_no(const OpDescriptor& desc, const std::string& fragment) {
  const Support support = flash_supports(desc);
  EXPECT_FALSE(support.ok()) << "expected flash_v2 to refuse " << desc.signature();
  EXPECT_NE(support.reason().find(fragment), std::string::npos) << support.reason();
}

// ---- supports(): no GPU needed ----

TEST(FlashAttention, IsRegisteredAsDeterministicCudaRawKernel) {
  SKIP_WITHOUT_FLASH();
  const KernelInfo& info = flash_kernel()->info();
  EXPECT_EQ(info.op, "attention");
  EXPECT_EQ(info.name, "flash_v2");
  EXPECT_EQ(info.backend, "cuda_raw");
  EXPECT_EQ(info.device_type, DeviceType::kCUDA);
  EXPECT_TRUE(info.deterministic);
}

TEST(FlashAttention, AcceptsSupportedDescriptors) {
  SKIP_WITHOUT_FLASH();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {64, 128}) {
      for (bool causal : {false, true}) {
        EXPECT_TRUE(flash_supports(attention_desc({2, 8, 77, d}, {2, 2, 129, d}, {2, 2, 129, d}, dtype, causal)))
            << d;
        EXPECT_TRUE(flash_supports(attention_desc({1, 4, 1, d}, {1, 1, 1, d}, {1, 1, 1, d}, dtype, causal)));
      }
    }
  }
  // Masks in q's dtype, broadcast from any rank <= 4.
  EXPECT_TRUE(flash_supports(attention_desc({2, 4, 17, 64}, {2, 4, 33, 64}, {2, 4, 33, 64}, DType::kFloat16, false,
                                            Device::cuda(0), 90, {17, 33})));
  EXPECT_TRUE(flash_supports(attention_desc({2, 4, 17, 64}, {2, 4, 33, 64}, {2, 4, 33, 64}, DType::kFloat16, true,
                                            Device::cuda(0), 90, {2, 1, 1, 33})));
  EXPECT_TRUE(flash_supports(attention_desc({2, 4, 17, 64}, {2, 4, 33, 64}, {2, 4, 33, 64}, DType::kFloat16, false,
                                            Device::cuda(0), 90, {2, 4, 17, 33})));
  // Under a deterministic policy too.
  ExecutionPolicy deterministic;
  deterministic.deterministic = true;
  EXPECT_TRUE(flash_kernel()->supports(attention_desc({1, 2, 64, 128}, {1, 2, 64, 128}, {1, 2, 64, 128}),
                                       deterministic));
}

// The bias shapes of MatchesCpuWithABiasOfAnyBroadcastShape, as descriptors (no GPU needed).
TEST(FlashAttention, AcceptsABiasOfAnyBroadcastShape) {
  SKIP_WITHOUT_FLASH();
  const std::int64_t B = 2, H = 4, S = 49;
  for (const Shape& bias : {Shape{1, H, S, S}, Shape{B, 1, S, S}, Shape{B, H, 1, S}, Shape{1, 1, 1, S}, Shape{S, S},
                            Shape{S}, Shape{H, 1, 1}}) {
    for (std::int64_t d : {32, 64, 128}) {
      for (bool causal : {false, true}) {
        const OpDescriptor desc = attention_desc({B, H, S, d}, {B, 2, S, d}, {B, 2, S, d}, DType::kFloat16, causal,
                                                 Device::cuda(0), 90, bias);
        const Support support = flash_supports(desc);
        EXPECT_TRUE(support.ok()) << desc.signature() << ": " << support.reason();
      }
    }
  }
}

TEST(FlashAttention, RefusesOtherHeadDims) {
  SKIP_WITHOUT_FLASH();
  expect_no(attention_desc({1, 2, 16, 80}, {1, 2, 16, 80}, {1, 2, 16, 80}), "head dims 32, 64 and 128, got 80");
  expect_no(attention_desc({1, 2, 16, 256}, {1, 2, 16, 256}, {1, 2, 16, 256}), "head dims 32, 64 and 128, got 256");
  expect_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 128}), "Dv");
}

TEST(FlashAttention, RefusesFloat32) {
  SKIP_WITHOUT_FLASH();
  expect_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}, DType::kFloat32),
            "supports float16 and bfloat16, got float32");
}

TEST(FlashAttention, RefusesCpuTensors) {
  SKIP_WITHOUT_FLASH();
  expect_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}, DType::kFloat16, false, Device::cpu()),
            "runs on CUDA devices; the input is on cpu");
}

TEST(FlashAttention, RefusesMisalignedInputs) {
  SKIP_WITHOUT_FLASH();
  OpDescriptor desc = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64});
  desc.inputs[1].alignment = 2;
  expect_no(desc, "16-byte aligned");
  expect_no(desc, "'k' is only 2-byte aligned");
}

TEST(FlashAttention, RefusesNonContiguousInputs) {
  SKIP_WITHOUT_FLASH();
  OpDescriptor desc = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64});
  desc.inputs[2].strides = {2048, 64, 128, 1};  // v viewed [B, S, H, D] -> [B, H, S, D]
  expect_no(desc, "needs contiguous input 'v'");
}

TEST(FlashAttention, RefusesOldGpus) {
  SKIP_WITHOUT_FLASH();
  expect_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}, DType::kFloat16, false, Device::cuda(0),
                           75),
            "compute capability 8.0");
}

TEST(FlashAttention, RefusesZeroKeysAndInt8Precision) {
  SKIP_WITHOUT_FLASH();
  expect_no(attention_desc({1, 2, 16, 64}, {1, 2, 0, 64}, {1, 2, 0, 64}), "Sk = 0");
  OpDescriptor desc = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64});
  desc.precision = Precision::kInt8;
  expect_no(desc, "int8");
}

TEST(FlashAttention, BuildRejectsAPlanRecord) {
  SKIP_WITHOUT_FLASH();
  const OpDescriptor desc = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64});
  XPURT_EXPECT_THROW_WITH(flash_kernel()->build(desc, ExecutionPolicy{}, "{\"algo\": 3}"), UnsupportedOperationError,
                          "no plan record");
  EXPECT_NE(flash_kernel()->build(desc, ExecutionPolicy{}, "")->describe().find("flash_v2"), std::string::npos);
}

// ---- return_lse: no GPU needed ----

OpDescriptor with_return_lse(OpDescriptor desc, std::int64_t return_lse) {
  desc.attrs.set("return_lse", return_lse);
  KernelRegistry::global().infer(desc);
  return desc;
}

TEST(FlashAttention, ReturnLseAddsAFloat32Output) {
  SKIP_WITHOUT_FLASH();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const OpDescriptor desc =
        with_return_lse(attention_desc({2, 8, 77, 64}, {2, 2, 129, 64}, {2, 2, 129, 64}, dtype, true), 1);
    ASSERT_EQ(desc.outputs.size(), 2u);
    EXPECT_EQ(desc.outputs[0].dtype, dtype);
    EXPECT_EQ(desc.outputs[1].dtype, DType::kFloat32);
    EXPECT_EQ(desc.outputs[1].shape, (Shape{2, 8, 77}));
    EXPECT_TRUE(flash_supports(desc)) << flash_supports(desc).reason();
    EXPECT_NE(flash_kernel()->build(desc, ExecutionPolicy{}, "")->describe().find("log-sum-exp"), std::string::npos);
  }
  EXPECT_EQ(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}).outputs.size(), 1u);
  // A descriptor whose outputs disagree with return_lse is refused, not run.
  OpDescriptor missing = with_return_lse(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}), 1);
  missing.outputs.resize(1);
  expect_no(missing, "writes 2 output(s) for return_lse=1");
  OpDescriptor wrong_dtype = with_return_lse(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}), 1);
  wrong_dtype.outputs[1].dtype = DType::kFloat16;
  expect_no(wrong_dtype, "log-sum-exp as float32 [1, 2, 16]");
}

TEST(FlashAttention, ReturnLseMustBeZeroOrOne) {
  SKIP_WITHOUT_FLASH();
  const OpDescriptor desc = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64});
  XPURT_EXPECT_THROW_WITH(with_return_lse(desc, 2), InvalidArgumentError, "return_lse must be 0 or 1, got 2");
  XPURT_EXPECT_THROW_WITH(with_return_lse(desc, -1), InvalidArgumentError, "return_lse must be 0 or 1, got -1");
}

// Note [Timed attention]: flash_v2 asks the dispatcher to time it against the other attention kernels while the
// unfused kernel's scores stay small enough to build, and runs untimed past that. No GPU needed.
TEST(FlashAttention, AsksToBeTimedWhileTheScoresAreSmall) {
  SKIP_WITHOUT_FLASH();
  OpDescriptor small = attention_desc({1, 32, 128, 64}, {1, 8, 128, 64}, {1, 8, 128, 64}, DType::kFloat16, true);
  KernelRegistry::global().infer(small);
  ASSERT_TRUE(flash_supports(small)) << flash_supports(small).reason();
  EXPECT_NE(flash_kernel()->timed_against_others(small).find("may be faster"), std::string::npos);
  OpDescriptor large = attention_desc({16, 32, 4096, 128}, {16, 8, 4096, 128}, {16, 8, 4096, 128}, DType::kFloat16,
                                      true);
  KernelRegistry::global().infer(large);
  ASSERT_TRUE(flash_supports(large)) << flash_supports(large).reason();
  EXPECT_EQ(flash_kernel()->timed_against_others(large), "");  // 17 GB of scores for the unfused candidate
  OpDescriptor decode = attention_desc({4, 32, 1, 64}, {4, 8, 300, 64}, {4, 8, 300, 64}, DType::kFloat16);
  KernelRegistry::global().infer(decode);
  ASSERT_TRUE(flash_supports(decode)) << flash_supports(decode).reason();
  EXPECT_EQ(flash_kernel()->timed_against_others(decode), "");  // a decode step: Sk changes every step
}

// Every attention kernel either implements fully_masked_rows="zero" or refuses it, saying so (the dispatcher then
// picks another): cpu, flash_v2 and unfused take it; cudnn refuses it. No GPU needed.
TEST(FlashAttention, EveryKernelTakesOrRefusesFullyMaskedRowsZero) {
  SKIP_WITHOUT_FLASH();
  OpDescriptor desc = attention_desc({2, 4, 33, 64}, {2, 2, 40, 64}, {2, 2, 40, 64}, DType::kFloat16, false,
                                     Device::cuda(0), 90, {2, 1, 33, 40});
  desc.attrs.set("fully_masked_rows", std::string("zero"));
  KernelRegistry::global().infer(desc);
  EXPECT_TRUE(flash_supports(desc)) << flash_supports(desc).reason();
  EXPECT_NE(flash_kernel()->build(desc, ExecutionPolicy{}, "")->describe().find("fully masked rows give 0"),
            std::string::npos);
  for (const Kernel* kernel : KernelRegistry::global().kernels("attention")) {
    if (kernel->info().summary == "not in this build" || kernel->info().device_type != DeviceType::kCUDA) continue;
    const Support s = kernel->supports(desc, ExecutionPolicy{});
    if (kernel->name() == "cudnn") {
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.reason().find("fully_masked_rows=\"zero\""), std::string::npos) << s.reason();
    } else if (kernel->name() == "flash_decode") {  // takes it for decode steps (FlashDecode tests), not Sq = 33
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.reason().find("decode steps of up to 8 query positions, got Sq = 33"), std::string::npos)
          << s.reason();
    } else {
      EXPECT_TRUE(s.ok()) << kernel->name() << ": " << s.reason();
    }
  }
  OpDescriptor cpu = attention_desc({2, 4, 33, 64}, {2, 2, 40, 64}, {2, 2, 40, 64}, DType::kFloat16, false,
                                    Device::cpu(), 0, {2, 1, 33, 40});
  cpu.attrs.set("fully_masked_rows", std::string("zero"));
  KernelRegistry::global().infer(cpu);
  const Kernel* cpu_kernel = KernelRegistry::global().find_kernel("attention", "cpu");
  EXPECT_TRUE(cpu_kernel->supports(cpu, ExecutionPolicy{})) << cpu_kernel->supports(cpu, ExecutionPolicy{}).reason();
  desc.attrs.set("fully_masked_rows", std::string("yes"));
  XPURT_EXPECT_THROW_WITH(KernelRegistry::global().infer(desc), InvalidArgumentError,
                          "fully_masked_rows must be \"nan\" (the default), \"zero\" or \"uniform\", got \"yes\"");
}

TEST(FlashAttention, UnfusedRefusesReturnLse) {
  SKIP_WITHOUT_FLASH();
  const Kernel* unfused = KernelRegistry::global().find_kernel("attention", "unfused");
  ASSERT_NE(unfused, nullptr);
  const OpDescriptor plain = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}, DType::kFloat16);
  EXPECT_TRUE(unfused->supports(plain, ExecutionPolicy{})) << unfused->supports(plain, ExecutionPolicy{}).reason();
  const Support support = unfused->supports(with_return_lse(plain, 1), ExecutionPolicy{});
  EXPECT_FALSE(support.ok());
  EXPECT_NE(support.reason().find("does not output the log-sum-exp (return_lse=1); use flash_v2 or cpu"),
            std::string::npos)
      << support.reason();
  // Every attention kernel answers: those that cannot write lse say so instead of running with one output.
  for (const Kernel* kernel : KernelRegistry::global().kernels("attention")) {
    if (kernel->name() == "flash_v2" || kernel->name() == "cudnn" || kernel->name() == "cpu" ||
        kernel->name() == "flash_decode") {
      continue;
    }
    const Support s = kernel->supports(with_return_lse(plain, 1), ExecutionPolicy{});
    EXPECT_FALSE(s.ok()) << kernel->name();
  }
}

// ---- numerics on a GPU, against the cpu kernel ----

// Runs `kernel` on `inputs` (absent optional inputs: undefined tensors). Outputs are allocated on the inputs'
// device; on CUDA they are first filled with NaN so that an element the kernel does not write shows up.
std::vector<Tensor> run_kernel(const Kernel& kernel, std::vector<Tensor> inputs, const Attributes& attrs) {
  OpDescriptor desc;
  desc.op = kernel.op();
  const std::size_t count = KernelRegistry::global().schema(desc.op).inputs.size();
  inputs.resize(count);
  for (const Tensor& input : inputs) desc.inputs.push_back(TensorDesc::of(input));
  desc.attrs = attrs;
  desc.device = inputs[0].device();
  if (desc.device.is_cuda()) {
    const DeviceInfo info = DeviceManager::instance().get_device_info(desc.device);
    desc.compute_capability = info.compute_capability();
  }
  KernelRegistry::global().infer(desc);
  const ExecutionPolicy policy;
  const Support support = kernel.supports(desc, policy);
  if (!support) throw UnsupportedOperationError(kernel.name() + ": " + support.reason());
  auto plan = kernel.build(desc, policy, "");
  const StreamView stream =
      desc.device.is_cuda() ? StreamManager::instance().current_stream(desc.device) : StreamView();
  std::vector<Tensor> outputs;
  for (const TensorDesc& out : desc.outputs) {
    if (desc.device.is_cuda()) {
      Tensor poison = Tensor::empty(out.shape, out.dtype);
      std::memset(poison.data_ptr(), 0xff, poison.nbytes());  // all-ones: NaN in fp16 and bf16
      outputs.push_back(poison.to(desc.device, &stream));
    } else {
      outputs.push_back(Tensor::empty(out.shape, out.dtype, desc.device));
    }
  }
  plan->execute(desc, inputs, outputs, stream);
  if (desc.device.is_cuda()) stream.synchronize();
  return outputs;
}

Tensor cpu_cast(const Tensor& x, DType to) {
  const Kernel* cast = KernelRegistry::global().find_kernel("cast", "cpu");
  return run_kernel(*cast, {x}, Attributes().set("to", std::string(dtype_name(to))))[0];
}

// Uniform random values in [low, high] as a CPU tensor of `dtype` (drawn in float32, then rounded).
Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& gen, float low = -1.f, float high = 1.f) {
  Tensor values = Tensor::empty(shape, DType::kFloat32);
  std::uniform_real_distribution<float> dist(low, high);
  float* data = static_cast<float*>(values.data_ptr());
  for (std::int64_t i = 0; i < values.numel(); ++i) data[i] = dist(gen);
  return cpu_cast(values, dtype);
}

std::vector<float> to_floats(const Tensor& t) {
  const Tensor host = cpu_cast(t.device().is_cuda() ? t.to(Device::cpu()) : t, DType::kFloat32);
  const float* data = static_cast<const float*>(host.data_ptr());
  return std::vector<float>(data, data + host.numel());
}

struct Case {
  std::int64_t batch, heads, kv_heads, seq_q, seq_k, head_dim;
  bool causal = false;
  Shape mask_shape = {};  // empty: no mask
  double scale = 0.0;
  // With a mask [.., Sq, Sk]: this query row is -inf at every key (and every 7th mask entry is -inf); -1: none.
  std::int64_t masked_row = -1;
  bool zero_rows = false;  // fully_masked_rows="zero" (Note [Fully masked attention rows] in cpu_attention.cpp)
  bool uniform_rows = false;  // fully_masked_rows="uniform": the masked row is the mean of v
};

std::string case_name(const Case& c, DType dtype) {
  std::string name = std::string(dtype_name(dtype)) + " B" + std::to_string(c.batch) + " H" +
                     std::to_string(c.heads) + " Hkv" + std::to_string(c.kv_heads) + " Sq" +
                     std::to_string(c.seq_q) + " Sk" + std::to_string(c.seq_k) + " D" +
                     std::to_string(c.head_dim) + (c.causal ? " causal" : "");
  if (!c.mask_shape.empty()) {
    name += " mask[";
    for (std::size_t k = 0; k < c.mask_shape.size(); ++k) name += (k ? "," : "") + std::to_string(c.mask_shape[k]);
    name += "]";
  }
  if (c.masked_row >= 0) name += " row " + std::to_string(c.masked_row) + " masked";
  if (c.zero_rows) name += " fully_masked_rows=zero";
  if (c.uniform_rows) name += " fully_masked_rows=uniform";
  return name;
}

// Sets row `row` of a float32 mask [.., Sq, Sk] to -inf at every key in every outer slice, and every 7th entry to -inf.
void mask_out_row(Tensor& values, std::int64_t row) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const Shape& shape = values.shape();
  const std::int64_t sk = shape.back(), sq = shape[shape.size() - 2];
  float* m = static_cast<float*>(values.data_ptr());
  for (std::int64_t i = 0; i < values.numel(); i += 7) m[i] = kNegInf;
  for (std::int64_t outer = 0; outer < values.numel() / (sq * sk); ++outer) {
    for (std::int64_t j = 0; j < sk; ++j) m[(outer * sq + row) * sk + j] = kNegInf;
  }
}

// Relative tolerance of a GPU kernel's attention output against the cpu kernel's on the same (rounded) inputs: both
// sides round P and the output to the 16-bit type; bf16 carries 8 significant bits, fp16 11.
double output_tolerance(DType dtype) { return dtype == DType::kBFloat16 ? 2e-2 : 4e-3; }

// `kernel` (flash_v2 by default) on the GPU against the cpu kernel on the same (rounded) inputs.
void check_against_cpu(const Case& c, DType dtype, unsigned seed, const Kernel* kernel = flash_kernel()) {
  SCOPED_TRACE(kernel->name() + " " + case_name(c, dtype));
  std::mt19937 gen(seed);
  const Tensor q = random_tensor({c.batch, c.heads, c.seq_q, c.head_dim}, dtype, gen, -2.f, 2.f);
  const Tensor k = random_tensor({c.batch, c.kv_heads, c.seq_k, c.head_dim}, dtype, gen, -2.f, 2.f);
  const Tensor v = random_tensor({c.batch, c.kv_heads, c.seq_k, c.head_dim}, dtype, gen);
  Tensor mask;
  if (!c.mask_shape.empty()) {
    Tensor values = random_tensor(c.mask_shape, DType::kFloat32, gen, -3.f, 3.f);
    if (c.masked_row >= 0) mask_out_row(values, c.masked_row);
    mask = cpu_cast(values, dtype);
  }
  Attributes attrs;
  attrs.set("causal", std::int64_t{c.causal ? 1 : 0});
  attrs.set("scale", c.scale);
  if (c.zero_rows) attrs.set("fully_masked_rows", std::string("zero"));
  if (c.uniform_rows) attrs.set("fully_masked_rows", std::string("uniform"));

  const Device gpu = Device::cuda(0);
  const std::vector<Tensor> gpu_inputs = {q.to(gpu), k.to(gpu), v.to(gpu), mask.defined() ? mask.to(gpu) : Tensor()};
  const Tensor out = run_kernel(*kernel, gpu_inputs, attrs)[0];
  const Tensor ref = run_kernel(*KernelRegistry::global().find_kernel("attention", "cpu"), {q, k, v, mask}, attrs)[0];
  ASSERT_EQ(out.shape(), ref.shape());
  ASSERT_EQ(out.dtype(), dtype);

  const std::vector<float> got = to_floats(out);
  const std::vector<float> want = to_floats(ref);
  const double tolerance = output_tolerance(dtype);
  double max_error = 0.0, error_sq = 0.0, ref_sq = 0.0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(error <= tolerance * (1.0 + std::fabs(want[i])))) {  // NaN fails too
      if (bad++ < 5) ADD_FAILURE() << "element " << i << ": " << kernel->name() << " " << got[i] << ", cpu " << want[i];
    }
    if (std::isfinite(error)) max_error = std::max(max_error, error);
    error_sq += error * error;
    ref_sq += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_EQ(bad, 0u) << "of " << got.size() << " elements; max |error| " << max_error;
  EXPECT_LE(std::sqrt(error_sq / std::max(ref_sq, 1e-30)), tolerance / 2) << "relative L2 error";
  if (c.zero_rows && c.masked_row >= 0) {  // exactly 0, in every (batch, head)
    std::size_t nonzero = 0;
    for (std::int64_t bh = 0; bh < c.batch * c.heads; ++bh) {
      for (std::int64_t d = 0; d < c.head_dim; ++d) {
        nonzero += got[static_cast<std::size_t>((bh * c.seq_q + c.masked_row) * c.head_dim + d)] != 0.0f ? 1 : 0;
      }
    }
    EXPECT_EQ(nonzero, 0u) << "elements of the fully masked row " << c.masked_row << " that are not 0";
  }
}

TEST(FlashAttentionGpu, MatchesCpuAcrossShapes) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 1;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {32, 64, 128}) {  // 32: Swin's heads (64-byte rows, Note [flash_v2 tiling])
      for (bool causal : {false, true}) {
        for (std::int64_t s : {1, 17, 64, 129}) check_against_cpu({2, 3, 3, s, s, d, causal}, dtype, seed++);
        check_against_cpu({1, 2, 2, 1000, 1000, d, causal}, dtype, seed++);
      }
    }
  }
}

TEST(FlashAttentionGpu, MatchesCpuWithGqaAndUnequalLengths) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 100;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {32, 64, 128}) {
      for (bool causal : {false, true}) {
        check_against_cpu({2, 8, 2, 77, 200, d, causal}, dtype, seed++);   // GQA, Sq < Sk
        check_against_cpu({1, 4, 1, 300, 129, d, causal}, dtype, seed++);  // MQA, Sq > Sk
        check_against_cpu({1, 2, 2, 1, 257, d, causal}, dtype, seed++);    // one query (decoding)
        check_against_cpu({1, 2, 1, 129, 1, d, causal}, dtype, seed++);    // one key
      }
    }
  }
}

TEST(FlashAttentionGpu, MatchesCpuWithMasksAndScale) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 200;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {64, 128}) {
      for (bool causal : {false, true}) {
        check_against_cpu({2, 2, 1, 129, 77, d, causal, {2, 2, 129, 77}}, dtype, seed++);  // full
        check_against_cpu({2, 2, 2, 65, 130, d, causal, {65, 130}}, dtype, seed++);        // [Sq, Sk]
        check_against_cpu({3, 2, 2, 33, 100, d, causal, {3, 1, 1, 100}}, dtype, seed++);   // padding mask
        check_against_cpu({1, 4, 2, 40, 40, d, causal, {4, 1, 40}, 0.3}, dtype, seed++);   // per head, scale
      }
      check_against_cpu({2, 2, 2, 50, 60, d, false, {}, 0.05}, dtype, seed++);  // custom scale, no mask
    }
  }
}

// Additive biases of every broadcast shape the models write (Note [Attention with additive terms] in
// fusion_transformer.cpp): a relative-position table [1, H, S, S], a per-batch term [B, 1, S, S], a per-query-row-free
// term [B, H, 1, S], a key bias [1, 1, 1, S] and a 2-d [S, S] (ALiBi, Swin's windows); odd window lengths (Swin's
// 7 x 7 = 49, CLIP's 77), grouped-query heads, causal or not. The bias is added in float32 to the scaled scores.
TEST(FlashAttentionGpu, MatchesCpuWithABiasOfAnyBroadcastShape) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 260;
  const std::int64_t B = 2, H = 4, Hkv = 2;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {32, 64, 128}) {
      for (std::int64_t s : {49, 77}) {
        for (const Shape& bias : {Shape{1, H, s, s}, Shape{B, 1, s, s}, Shape{B, H, 1, s}, Shape{1, 1, 1, s},
                                  Shape{s, s}}) {
          for (bool causal : {false, true}) check_against_cpu({B, H, Hkv, s, s, d, causal, bias}, dtype, seed++);
        }
      }
      check_against_cpu({B, H, Hkv, 49, 300, d, false, {1, H, 49, 300}}, dtype, seed++);  // Sq < Sk, several tiles
    }
  }
}

// A row whose every key is masked with -inf has no softmax: NaN, as in the cpu kernel (Note [Attention
// semantics] in cpu_attention.cpp); the other rows are unaffected.
TEST(FlashAttentionGpu, FullyMaskedRowIsNaN) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  std::mt19937 gen(7);
  const std::int64_t sq = 20, sk = 70, d = 64;
  const Tensor q = random_tensor({1, 1, sq, d}, DType::kFloat16, gen);
  const Tensor k = random_tensor({1, 1, sk, d}, DType::kFloat16, gen);
  const Tensor v = random_tensor({1, 1, sk, d}, DType::kFloat16, gen);
  Tensor mask_values = Tensor::zeros({sq, sk}, DType::kFloat32);
  float* m = static_cast<float*>(mask_values.data_ptr());
  for (std::int64_t j = 0; j < sk; ++j) m[3 * sk + j] = -std::numeric_limits<float>::infinity();
  const Tensor mask = cpu_cast(mask_values, DType::kFloat16);
  const Device gpu = Device::cuda(0);
  const std::vector<float> out =
      to_floats(run_kernel(*flash_kernel(), {q.to(gpu), k.to(gpu), v.to(gpu), mask.to(gpu)}, Attributes())[0]);
  for (std::int64_t i = 0; i < sq; ++i) {
    for (std::int64_t c = 0; c < d; ++c) {
      EXPECT_EQ(std::isnan(out[i * d + c]), i == 3) << "row " << i << ", column " << c;
    }
  }
}

// fully_masked_rows="zero" (Note [Fully masked attention rows]): rows masked at every key are 0, as in the cpu kernel;
// a row whose only visible key (causal: row 0) is masked too; the other rows as without the attribute. Masks of every
// broadcast shape flash_v2 reads, rows in the first and a later 128-row block, several key tiles.
TEST(FlashAttentionGpu, FullyMaskedRowsZeroMatchCpu) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 600;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {32, 64, 128}) {
      for (bool causal : {false, true}) {
        check_against_cpu({2, 4, 2, 77, 130, d, causal, {2, 1, 77, 130}, 0.0, 5, true}, dtype, seed++);
        check_against_cpu({1, 2, 2, 200, 61, d, causal, {200, 61}, 0.3, 150, true}, dtype, seed++);  // 2nd block
        check_against_cpu({2, 2, 1, 33, 300, d, causal, {2, 2, 33, 300}, 0.0, 0, true}, dtype, seed++);
        check_against_cpu({1, 2, 2, 1, 257, d, causal, {1, 1, 1, 257}, 0.0, 0, true}, dtype, seed++);  // one query
      }
    }
  }
}

// fully_masked_rows="uniform" (a masked fill's finite value, Note [Masked-fill scores]): rows masked at every key are
// the mean of v over the visible keys, as in the cpu kernel, through flash_v2 and the unfused kernel.
TEST(FlashAttentionGpu, FullyMaskedRowsUniformMatchCpu) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  const Kernel* unfused = KernelRegistry::global().find_kernel("attention", "unfused");
  ASSERT_NE(unfused, nullptr);
  unsigned seed = 800;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (bool causal : {false, true}) {
      for (std::int64_t d : {32, 64, 128}) {
        check_against_cpu({2, 4, 2, 77, 130, d, causal, {2, 1, 77, 130}, 0.0, 5, false, true}, dtype, seed++);
        check_against_cpu({1, 2, 2, 200, 61, d, causal, {200, 61}, 0.3, 150, false, true}, dtype, seed++);
      }
      check_against_cpu({2, 4, 2, 77, 130, 64, causal, {2, 1, 77, 130}, 0.0, 5, false, true}, dtype, seed++,
                        unfused);
      check_against_cpu({1, 2, 2, 6, 5000, 32, causal, {1, 1, 6, 5000}, 0.0, 4, false, true}, dtype, seed++, unfused);
    }
  }
}

// The same cases through the unfused kernel (cuBLAS GEMMs around cuda_raw's attention softmax), float32 included:
// the kernel float32 attention runs on, and where attention_fusion's float32 TorchScript exports go on a GPU.
TEST(FlashAttentionGpu, UnfusedFullyMaskedRowsZeroMatchCpu) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  const Kernel* unfused = KernelRegistry::global().find_kernel("attention", "unfused");
  ASSERT_NE(unfused, nullptr);
  unsigned seed = 700;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (bool causal : {false, true}) {
      check_against_cpu({2, 4, 2, 77, 130, 64, causal, {2, 1, 77, 130}, 0.0, 5, true}, dtype, seed++, unfused);
      check_against_cpu({1, 3, 3, 7, 11, 80, causal, {7, 11}, 0.0, 0, true}, dtype, seed++, unfused);
      check_against_cpu({1, 2, 2, 6, 5000, 32, causal, {1, 1, 6, 5000}, 0.0, 4, true}, dtype, seed++, unfused);
    }
  }
}

// flash_v2's lse (return_lse=1) against the cpu kernel's on the same rounded inputs; output 0 is bit-identical
// to the run without return_lse. lse is written for every row (the output starts as NaN), -inf for a fully
// masked row. Tolerance: both compute fp32 scores from the same 16-bit inputs; lse is O(log Sk + max score).
void check_lse_against_cpu(const Case& c, DType dtype, unsigned seed, std::int64_t masked_row = -1,
                           const Kernel* kernel = flash_kernel()) {
  SCOPED_TRACE(kernel->name() + " " + case_name(c, dtype) +
               (masked_row >= 0 ? " row " + std::to_string(masked_row) + " masked" : ""));
  std::mt19937 gen(seed);
  const Tensor q = random_tensor({c.batch, c.heads, c.seq_q, c.head_dim}, dtype, gen, -2.f, 2.f);
  const Tensor k = random_tensor({c.batch, c.kv_heads, c.seq_k, c.head_dim}, dtype, gen, -2.f, 2.f);
  const Tensor v = random_tensor({c.batch, c.kv_heads, c.seq_k, c.head_dim}, dtype, gen);
  Tensor mask;
  if (!c.mask_shape.empty()) {
    // Random values in [-3, 3] with some -inf; with `masked_row` (mask [.., Sq, Sk]) that whole row is -inf.
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    Tensor values = random_tensor(c.mask_shape, DType::kFloat32, gen, -3.f, 3.f);
    float* m = static_cast<float*>(values.data_ptr());
    for (std::int64_t i = 0; i < values.numel(); i += 7) m[i] = kNegInf;
    if (masked_row >= 0) {
      const std::int64_t sk = c.mask_shape.back(), sq = c.mask_shape[c.mask_shape.size() - 2];
      for (std::int64_t outer = 0; outer < values.numel() / (sq * sk); ++outer) {
        for (std::int64_t j = 0; j < sk; ++j) m[(outer * sq + masked_row) * sk + j] = kNegInf;
      }
    }
    mask = cpu_cast(values, dtype);
  }
  Attributes attrs;
  attrs.set("causal", std::int64_t{c.causal ? 1 : 0});
  attrs.set("scale", c.scale);
  Attributes lse_attrs = attrs;
  lse_attrs.set("return_lse", std::int64_t{1});

  const Device gpu = Device::cuda(0);
  const std::vector<Tensor> gpu_inputs = {q.to(gpu), k.to(gpu), v.to(gpu), mask.defined() ? mask.to(gpu) : Tensor()};
  const std::vector<Tensor> got = run_kernel(*kernel, gpu_inputs, lse_attrs);
  const std::vector<Tensor> ref =
      run_kernel(*KernelRegistry::global().find_kernel("attention", "cpu"), {q, k, v, mask}, lse_attrs);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(got[1].dtype(), DType::kFloat32);
  ASSERT_EQ(got[1].shape(), (Shape{c.batch, c.heads, c.seq_q}));
  const std::vector<float> got_lse = to_floats(got[1]);
  const std::vector<float> want_lse = to_floats(ref[1]);
  std::size_t bad = 0;
  double max_error = 0.0;
  for (std::size_t i = 0; i < got_lse.size(); ++i) {
    bool ok;
    if (std::isnan(want_lse[i]) || std::isinf(want_lse[i])) {
      ok = std::isnan(want_lse[i]) ? std::isnan(got_lse[i]) : got_lse[i] == want_lse[i];
    } else {
      const double error = std::fabs(static_cast<double>(got_lse[i]) - want_lse[i]);
      ok = error <= 1e-3 + 1e-4 * std::fabs(want_lse[i]);  // NaN fails
      if (std::isfinite(error)) max_error = std::max(max_error, error);
    }
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << "lse " << i << ": " << kernel->name() << " " << got_lse[i] << ", cpu " << want_lse[i];
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << got_lse.size() << " rows; max |error| " << max_error;
  if (masked_row >= 0) {
    for (std::int64_t bh = 0; bh < c.batch * c.heads; ++bh) {
      EXPECT_EQ(got_lse[bh * c.seq_q + masked_row], -std::numeric_limits<float>::infinity()) << "head " << bh;
    }
  }
  // Writing lse leaves output 0 as it was (flash_v2: bit for bit; cuDNN may run another engine without stats).
  if (kernel != flash_kernel()) {
    const std::vector<float> plain = to_floats(run_kernel(*kernel, gpu_inputs, attrs)[0]);
    const std::vector<float> with_lse = to_floats(got[0]);
    ASSERT_EQ(plain.size(), with_lse.size());
    const double tolerance = output_tolerance(dtype);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < plain.size(); ++i) {
      if (!(std::fabs(plain[i] - with_lse[i]) <= tolerance * (1.0 + std::fabs(plain[i])))) ++differ;
    }
    EXPECT_EQ(differ, 0u) << "elements of y differ with and without return_lse";
    return;
  }
  const Tensor plain = run_kernel(*flash_kernel(), gpu_inputs, attrs)[0].to(Device::cpu());
  const Tensor with_lse = got[0].to(Device::cpu());
  ASSERT_EQ(plain.nbytes(), with_lse.nbytes());
  EXPECT_EQ(std::memcmp(plain.data_ptr(), with_lse.data_ptr(), plain.nbytes()), 0);
}

TEST(FlashAttentionGpu, LogSumExpMatchesCpu) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 300;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {32, 64, 128}) {
      for (bool causal : {false, true}) {
        check_lse_against_cpu({2, 3, 3, 200, 200, d, causal}, dtype, seed++);           // Sq past one 128 block
        check_lse_against_cpu({2, 8, 2, 77, 300, d, causal}, dtype, seed++);            // GQA, partial tiles
        check_lse_against_cpu({1, 4, 1, 300, 129, d, causal}, dtype, seed++);           // MQA, Sq > Sk
        check_lse_against_cpu({1, 2, 2, 1, 257, d, causal}, dtype, seed++);             // one query
        check_lse_against_cpu({2, 4, 2, 77, 130, d, causal, {2, 1, 77, 130}}, dtype, seed++, 5);  // mask, a -inf row
        check_lse_against_cpu({1, 2, 2, 200, 61, d, causal, {200, 61}, 0.3}, dtype, seed++);     // [Sq, Sk], scale
      }
      check_lse_against_cpu({2, 2, 2, 50, 60, d, false, {}, 0.05}, dtype, seed++);  // custom scale, no mask
    }
  }
}

TEST(FlashAttentionGpu, IsBitwiseDeterministic) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  std::mt19937 gen(11);
  const Device gpu = Device::cuda(0);
  const Tensor q = random_tensor({2, 4, 300, 128}, DType::kBFloat16, gen).to(gpu);
  const Tensor k = random_tensor({2, 2, 333, 128}, DType::kBFloat16, gen).to(gpu);
  const Tensor v = random_tensor({2, 2, 333, 128}, DType::kBFloat16, gen).to(gpu);
  const Attributes attrs = Attributes().set("causal", std::int64_t{1});
  const Tensor first = run_kernel(*flash_kernel(), {q, k, v}, attrs)[0].to(Device::cpu());
  const Tensor second = run_kernel(*flash_kernel(), {q, k, v}, attrs)[0].to(Device::cpu());
  ASSERT_EQ(first.nbytes(), second.nbytes());
  EXPECT_EQ(std::memcmp(first.data_ptr(), second.data_ptr(), first.nbytes()), 0);
}

// ---- the cudnn backend's attention kernel ----

const Kernel* cudnn_kernel() { return KernelRegistry::global().find_kernel("attention", "cudnn"); }

// The kernel is declared in every build (absent without cuDNN: it then says so); a usable one needs cuDNN.
bool has_cudnn_attention() {
  const Kernel* kernel = cudnn_kernel();
  return kernel != nullptr && kernel->info().summary != "not in this build";
}

#define SKIP_WITHOUT_CUDNN_ATTENTION()                                                       \
  do {                                                                                       \
    if (!has_cudnn_attention()) GTEST_SKIP() << "this build has no cuDNN attention kernel";  \
  } while (0)

void expect_cudnn_no(const OpDescriptor& desc, const std::string& fragment,
                     const ExecutionPolicy& policy = ExecutionPolicy{}) {
  const Support support = cudnn_kernel()->supports(desc, policy);
  EXPECT_FALSE(support.ok()) << "expected cudnn to refuse " << desc.signature();
  EXPECT_NE(support.reason().find(fragment), std::string::npos) << support.reason();
}

TEST(CudnnAttention, IsRegisteredAfterFlashAsANonDeterministicCudnnKernel) {
  ASSERT_NE(cudnn_kernel(), nullptr) << "policies may name attention=cudnn in every build";
  SKIP_WITHOUT_CUDNN_ATTENTION();
  const KernelInfo& info = cudnn_kernel()->info();
  EXPECT_EQ(info.backend, "cudnn");
  EXPECT_EQ(info.device_type, DeviceType::kCUDA);
  EXPECT_FALSE(info.deterministic);
  std::vector<std::string> order;
  for (const Kernel* kernel : KernelRegistry::global().kernels("attention")) order.push_back(kernel->name());
  const auto flash = std::find(order.begin(), order.end(), "flash_v2");
  const auto cudnn = std::find(order.begin(), order.end(), "cudnn");
  ASSERT_NE(cudnn, order.end());
  if (flash != order.end()) {
    EXPECT_LT(flash - order.begin(), cudnn - order.begin());
  }
}

TEST(CudnnAttention, AcceptsSupportedDescriptors) {
  SKIP_WITHOUT_CUDNN_ATTENTION();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {8, 64, 72, 128}) {
      for (bool causal : {false, true}) {
        const OpDescriptor desc = attention_desc({2, 8, 77, d}, {2, 2, 129, d}, {2, 2, 129, d}, dtype, causal);
        EXPECT_TRUE(cudnn_kernel()->supports(desc, ExecutionPolicy{})) << d;
        EXPECT_TRUE(cudnn_kernel()->supports(with_return_lse(desc, 1), ExecutionPolicy{})) << d;
      }
    }
  }
  // Masks [B or 1, H or 1, Sq, Sk], lower ranks as leading 1s.
  for (const Shape& mask : {Shape{17, 33}, Shape{4, 17, 33}, Shape{2, 1, 17, 33}, Shape{2, 4, 17, 33}}) {
    const OpDescriptor desc = attention_desc({2, 4, 17, 64}, {2, 4, 33, 64}, {2, 4, 33, 64}, DType::kFloat16, true,
                                             Device::cuda(0), 90, mask);
    EXPECT_TRUE(cudnn_kernel()->supports(desc, ExecutionPolicy{})) << cudnn_kernel()->supports(desc, {}).reason();
  }
  // Head dims up to 256 on Hopper, 128 before.
  EXPECT_TRUE(cudnn_kernel()->supports(attention_desc({1, 2, 16, 256}, {1, 2, 16, 256}, {1, 2, 16, 256}),
                                       ExecutionPolicy{}));
  expect_cudnn_no(attention_desc({1, 2, 16, 256}, {1, 2, 16, 256}, {1, 2, 16, 256}, DType::kBFloat16, false,
                                 Device::cuda(0), 80),
                  "multiples of 8 up to 128");
}

TEST(CudnnAttention, RefusesWhatItsGraphDoesNotDescribe) {
  SKIP_WITHOUT_CUDNN_ATTENTION();
  expect_cudnn_no(attention_desc({2, 4, 17, 64}, {2, 4, 33, 64}, {2, 4, 33, 64}, DType::kFloat16, false,
                                 Device::cuda(0), 90, {2, 1, 1, 33}),
                  "takes masks of shape [B or 1, H or 1, Sq, Sk]");
  expect_cudnn_no(attention_desc({1, 2, 16, 60}, {1, 2, 16, 60}, {1, 2, 16, 60}), "multiples of 8");
  expect_cudnn_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 128}), "D = Dv");
  expect_cudnn_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}, DType::kFloat32),
                  "supports float16 and bfloat16, got float32");
  expect_cudnn_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}, DType::kFloat16, false,
                                 Device::cuda(0), 75),
                  "compute capability 8.0");
  expect_cudnn_no(attention_desc({1, 2, 16, 64}, {1, 2, 0, 64}, {1, 2, 0, 64}), "Sk = 0");
  expect_cudnn_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}, DType::kFloat16, false,
                                 Device::cpu()),
                  "runs on CUDA devices");
  OpDescriptor misaligned = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64});
  misaligned.inputs[2].alignment = 8;
  expect_cudnn_no(misaligned, "16-byte aligned");
  OpDescriptor strided = attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64});
  strided.inputs[0].strides = {2048, 64, 128, 1};
  expect_cudnn_no(strided, "contiguous");
  ExecutionPolicy deterministic;
  deterministic.deterministic = true;
  expect_cudnn_no(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}), "not deterministic",
                  deterministic);
  OpDescriptor missing = with_return_lse(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}), 1);
  missing.outputs.resize(1);
  expect_cudnn_no(missing, "writes 2 output(s) for return_lse=1");
  XPURT_EXPECT_THROW_WITH(
      cudnn_kernel()->build(attention_desc({1, 2, 16, 64}, {1, 2, 16, 64}, {1, 2, 16, 64}), ExecutionPolicy{},
                            "{\"algo\": 3}"),
      UnsupportedOperationError, "no plan record");
}

TEST(CudnnAttentionGpu, MatchesCpuAcrossShapes) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN_ATTENTION();
  unsigned seed = 400;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {64, 128}) {
      for (bool causal : {false, true}) {
        for (std::int64_t s : {1, 17, 64, 129}) {
          check_against_cpu({2, 3, 3, s, s, d, causal}, dtype, seed++, cudnn_kernel());
        }
        check_against_cpu({1, 2, 2, 1000, 1000, d, causal}, dtype, seed++, cudnn_kernel());
        check_against_cpu({2, 8, 2, 77, 200, d, causal}, dtype, seed++, cudnn_kernel());   // GQA, Sq < Sk
        check_against_cpu({1, 4, 1, 300, 129, d, causal}, dtype, seed++, cudnn_kernel());  // MQA, Sq > Sk
        check_against_cpu({1, 2, 2, 1, 257, d, causal}, dtype, seed++, cudnn_kernel());    // one query
      }
      check_against_cpu({2, 2, 2, 50, 60, d, false, {}, 0.05}, dtype, seed++, cudnn_kernel());  // custom scale
    }
    check_against_cpu({2, 2, 2, 33, 47, 72, true}, dtype, seed++, cudnn_kernel());   // head dim 72
    check_against_cpu({1, 2, 2, 40, 40, 256, false}, dtype, seed++, cudnn_kernel());  // head dim 256 (sm90)
  }
}

TEST(CudnnAttentionGpu, MatchesCpuWithMasks) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN_ATTENTION();
  unsigned seed = 450;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {64, 128}) {
      for (bool causal : {false, true}) {
        check_against_cpu({2, 2, 1, 129, 77, d, causal, {2, 2, 129, 77}}, dtype, seed++, cudnn_kernel());  // full
        check_against_cpu({2, 2, 2, 65, 130, d, causal, {65, 130}}, dtype, seed++, cudnn_kernel());        // [Sq, Sk]
        check_against_cpu({1, 4, 2, 40, 40, d, causal, {4, 40, 40}, 0.3}, dtype, seed++, cudnn_kernel());  // per head
        check_against_cpu({3, 2, 2, 33, 64, d, causal, {3, 1, 33, 64}}, dtype, seed++, cudnn_kernel());    // per batch
      }
    }
  }
}

// cuDNN's graph takes a bias [B or 1, H or 1, Sq, Sk] (Note [cuDNN attention graph]); the odd lengths and GQA of the
// flash_v2 test. Biases broadcast along Sq or Sk it refuses, saying so (explain() shows that reason and flash_v2 runs).
TEST(CudnnAttentionGpu, MatchesCpuWithABias) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN_ATTENTION();
  unsigned seed = 470;
  const std::int64_t B = 2, H = 4, Hkv = 2;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {32, 64}) {  // 32: Swin's head dim
      for (std::int64_t s : {49, 77}) {
        for (const Shape& bias : {Shape{1, H, s, s}, Shape{B, 1, s, s}, Shape{s, s}}) {
          for (bool causal : {false, true}) {
            check_against_cpu({B, H, Hkv, s, s, d, causal, bias}, dtype, seed++, cudnn_kernel());
          }
        }
      }
    }
  }
}

TEST(CudnnAttention, RefusesABiasBroadcastAlongTheQueries) {
  SKIP_WITHOUT_CUDNN_ATTENTION();
  expect_cudnn_no(attention_desc({2, 4, 49, 64}, {2, 4, 49, 64}, {2, 4, 49, 64}, DType::kFloat16, false,
                                 Device::cuda(0), 90, {2, 4, 1, 49}),
                  "takes masks of shape [B or 1, H or 1, Sq, Sk]");
}

TEST(CudnnAttentionGpu, LogSumExpMatchesCpu) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN_ATTENTION();
  unsigned seed = 500;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {64, 128}) {
      for (bool causal : {false, true}) {
        check_lse_against_cpu({2, 3, 3, 200, 200, d, causal}, dtype, seed++, -1, cudnn_kernel());
        check_lse_against_cpu({2, 8, 2, 77, 300, d, causal}, dtype, seed++, -1, cudnn_kernel());
        check_lse_against_cpu({1, 4, 1, 300, 129, d, causal}, dtype, seed++, -1, cudnn_kernel());
      }
      check_lse_against_cpu({2, 2, 2, 50, 60, d, false, {}, 0.05}, dtype, seed++, -1, cudnn_kernel());
    }
  }
}

// The plan describes cuDNN's choice, and a second thread (another cuDNN handle) runs the same plan correctly.
TEST(CudnnAttentionGpu, PlanRunsOnAnotherThread) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN_ATTENTION();
  const OpDescriptor desc = attention_desc({1, 2, 64, 64}, {1, 2, 64, 64}, {1, 2, 64, 64}, DType::kBFloat16, true);
  auto plan = cudnn_kernel()->build(desc, ExecutionPolicy{}, "");
  EXPECT_NE(plan->describe().find("cudnn fused attention"), std::string::npos) << plan->describe();
  std::mt19937 gen(3);
  const Device gpu = Device::cuda(0);
  const std::vector<Tensor> inputs = {random_tensor({1, 2, 64, 64}, DType::kBFloat16, gen).to(gpu),
                                      random_tensor({1, 2, 64, 64}, DType::kBFloat16, gen).to(gpu),
                                      random_tensor({1, 2, 64, 64}, DType::kBFloat16, gen).to(gpu), Tensor()};
  std::vector<Tensor> here = {Tensor::empty({1, 2, 64, 64}, DType::kBFloat16, gpu)};
  std::vector<Tensor> there = {Tensor::empty({1, 2, 64, 64}, DType::kBFloat16, gpu)};
  const StreamView stream = StreamManager::instance().current_stream(gpu);
  plan->execute(desc, inputs, here, stream);
  stream.synchronize();
  std::thread other([&] {
    const StreamView other_stream = StreamManager::instance().current_stream(gpu);
    plan->execute(desc, inputs, there, other_stream);
    other_stream.synchronize();
  });
  other.join();
  const std::vector<float> a = to_floats(here[0]), b = to_floats(there[0]);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-2 * (1 + std::fabs(a[i]))) << i;
}

// ---- flash_decode (Note [Split-K decode attention] in flash_decode.cu) ----

const Kernel* decode_kernel() { return KernelRegistry::global().find_kernel("attention", "flash_decode"); }

// Decode steps (Sq <= 8, no causal mask) only, and before every other attention kernel there: its claim to rank
// first comes ahead of cuDNN's (registered after it), and flash_v2 has none. No GPU needed.
TEST(FlashDecode, TakesDecodeStepsAndRanksFirstThere) {
  SKIP_WITHOUT_FLASH();
  ASSERT_NE(decode_kernel(), nullptr);
  EXPECT_TRUE(decode_kernel()->info().deterministic);
  const ExecutionPolicy policy;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {32, 64, 128}) {
      for (const Shape& q : {Shape{1, 32, 1, d}, Shape{64, 32, 1, d}, Shape{2, 12, 8, d}}) {
        const std::int64_t kv = q[1] == 12 ? 1 : 8;
        const OpDescriptor desc = attention_desc(q, {q[0], kv, 4096, d}, {q[0], kv, 4096, d}, dtype, false,
                                                 Device::cuda(0), 90, {q[0], 1, 1, 4096});
        const Support s = decode_kernel()->supports(desc, policy);
        EXPECT_TRUE(s.ok()) << desc.signature() << ": " << s.reason();
        EXPECT_NE(decode_kernel()->ranks_first(desc).find("a decode step"), std::string::npos);
      }
    }
  }
  const auto refuses = [&](const OpDescriptor& desc, const std::string& fragment) {
    const Support s = decode_kernel()->supports(desc, policy);
    EXPECT_FALSE(s.ok()) << desc.signature();
    EXPECT_NE(s.reason().find(fragment), std::string::npos) << s.reason();
  };
  refuses(attention_desc({1, 8, 9, 64}, {1, 8, 100, 64}, {1, 8, 100, 64}), "got Sq = 9; flash_v2 runs longer");
  refuses(attention_desc({1, 8, 1, 64}, {1, 8, 100, 64}, {1, 8, 100, 64}, DType::kFloat16, true), "no causal mask");
  refuses(attention_desc({1, 8, 1, 64}, {1, 8, 100, 64}, {1, 8, 100, 64}, DType::kFloat32), "float16 and bfloat16");
  refuses(attention_desc({1, 8, 1, 80}, {1, 8, 100, 80}, {1, 8, 100, 80}), "head dims 32, 64 and 128");
  refuses(attention_desc({1, 8, 1, 64}, {1, 8, 100, 64}, {1, 8, 100, 64}, DType::kFloat16, false, Device::cpu(), 0),
          "runs on CUDA devices");
  // Registry order: flash_v2, flash_decode, then cuDNN's kernel; the first claim to rank first wins.
  std::vector<std::string> order;
  for (const Kernel* kernel : KernelRegistry::global().kernels("attention")) order.push_back(kernel->name());
  const auto at = [&](const std::string& name) { return std::find(order.begin(), order.end(), name) - order.begin(); };
  EXPECT_LT(at("flash_v2"), at("flash_decode"));
  if (std::find(order.begin(), order.end(), "cudnn") != order.end()) {
    EXPECT_LT(at("flash_decode"), at("cudnn"));
  }
  EXPECT_TRUE(flash_kernel()->ranks_first(attention_desc({1, 32, 1, 64}, {1, 8, 300, 64}, {1, 8, 300, 64})).empty());
  // Timed against cuDNN's where batch x KV heads alone make 64 blocks or more (docs/benchmarks.md), not below.
  EXPECT_TRUE(decode_kernel()->timed_against_others(attention_desc({1, 32, 1, 64}, {1, 8, 576, 64},
                                                                   {1, 8, 576, 64})).empty());
  EXPECT_NE(decode_kernel()->timed_against_others(attention_desc({8, 32, 1, 64}, {8, 8, 576, 64}, {8, 8, 576, 64}))
                .find("cuDNN"),
            std::string::npos);
}

// Decode shapes against the cpu kernel: one key and thousands (one split and many), grouped heads (groups of 4, 8
// and MQA's 12, two blocks of rows), several query positions, batch 64, masks of the broadcast shapes decoders
// write, a custom scale.
TEST(FlashDecodeGpu, MatchesCpuAtDecodeShapes) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 900;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::int64_t d : {32, 64, 128}) {
      check_against_cpu({1, 32, 8, 1, 576, d}, dtype, seed++, decode_kernel());
      check_against_cpu({4, 8, 2, 1, 1, d}, dtype, seed++, decode_kernel());
      check_against_cpu({2, 12, 1, 1, 1000, d}, dtype, seed++, decode_kernel());
      check_against_cpu({3, 4, 4, 3, 130, d}, dtype, seed++, decode_kernel());
      check_against_cpu({1, 16, 2, 8, 4097, d}, dtype, seed++, decode_kernel());
      check_against_cpu({64, 32, 8, 1, 256, d}, dtype, seed++, decode_kernel());
      check_against_cpu({2, 8, 2, 1, 300, d, false, {2, 1, 1, 300}}, dtype, seed++, decode_kernel());
      check_against_cpu({2, 8, 2, 2, 77, d, false, {2, 8, 2, 77}, 0.3}, dtype, seed++, decode_kernel());
      check_against_cpu({1, 4, 4, 1, 129, d, false, {129}}, dtype, seed++, decode_kernel());
    }
  }
}

// Fully masked rows: 0 or the mean of v as the attribute says (check_against_cpu), NaN by default; the log-sum-exp
// output equals the cpu kernel's (-inf for the masked row).
TEST(FlashDecodeGpu, FullyMaskedRowsAndTheLogSumExpMatchCpu) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  unsigned seed = 950;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (std::int64_t d : {64, 128}) {
      check_against_cpu({2, 4, 2, 1, 257, d, false, {2, 1, 1, 257}, 0.0, 0, true}, dtype, seed++, decode_kernel());
      check_against_cpu({1, 8, 2, 2, 3000, d, false, {2, 3000}, 0.0, 1, true}, dtype, seed++, decode_kernel());
      Case uniform{2, 4, 2, 1, 257, d, false, {2, 1, 1, 257}, 0.0, 0};
      uniform.uniform_rows = true;
      check_against_cpu(uniform, dtype, seed++, decode_kernel());
    }
  }
  std::mt19937 gen(21);
  const std::int64_t sq = 2, sk = 700, d = 64;
  const Tensor q = random_tensor({1, 4, sq, d}, DType::kFloat16, gen);
  const Tensor k = random_tensor({1, 2, sk, d}, DType::kFloat16, gen);
  const Tensor v = random_tensor({1, 2, sk, d}, DType::kFloat16, gen);
  Tensor mask_values = Tensor::zeros({sq, sk}, DType::kFloat32);
  float* m = static_cast<float*>(mask_values.data_ptr());
  for (std::int64_t j = 0; j < sk; ++j) m[sk + j] = -std::numeric_limits<float>::infinity();  // row 1
  const Tensor mask = cpu_cast(mask_values, DType::kFloat16);
  Attributes attrs;
  attrs.set("return_lse", std::int64_t{1});
  const Device gpu = Device::cuda(0);
  const std::vector<Tensor> out = run_kernel(*decode_kernel(), {q.to(gpu), k.to(gpu), v.to(gpu), mask.to(gpu)}, attrs);
  const std::vector<Tensor> ref =
      run_kernel(*KernelRegistry::global().find_kernel("attention", "cpu"), {q, k, v, mask}, attrs);
  ASSERT_EQ(out.size(), 2u);
  const std::vector<float> y = to_floats(out[0]), lse = to_floats(out[1]), ref_lse = to_floats(ref[1]);
  for (std::int64_t h = 0; h < 4; ++h) {
    for (std::int64_t i = 0; i < sq; ++i) {
      for (std::int64_t c = 0; c < d; ++c) EXPECT_EQ(std::isnan(y[(h * sq + i) * d + c]), i == 1) << h << "," << i;
      const float got = lse[h * sq + i], want = ref_lse[h * sq + i];
      if (i == 1) {
        EXPECT_EQ(got, -std::numeric_limits<float>::infinity()) << "head " << h;
      } else {
        EXPECT_NEAR(got, want, 1e-3 * (1 + std::fabs(want))) << "head " << h;
      }
    }
  }
}

// Through the dispatcher: a decode step picks flash_decode, saying why; a prefill does not.
TEST(FlashDecodeGpu, TheDispatcherPicksItForDecodeSteps) {
  XPURT_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FLASH();
  std::mt19937 gen(31);
  const Device gpu = Device::cuda(0);
  Dispatcher dispatcher(KernelPolicy{}, ExecutionPolicy{});
  Decision decision;
  for (const std::int64_t sq : {1, 64}) {
    const Tensor q = random_tensor({1, 32, sq, 64}, DType::kFloat16, gen).to(gpu);
    const Tensor kv = random_tensor({1, 8, 512, 64}, DType::kFloat16, gen).to(gpu);
    dispatcher.run("attention", {q, kv, kv, Tensor()}, Attributes(), nullptr, &decision);
    if (sq == 1) {
      EXPECT_EQ(decision.kernel, "flash_decode");
      EXPECT_NE(decision.reason.find("a decode step"), std::string::npos) << decision.reason;
    } else {
      EXPECT_NE(decision.kernel, "flash_decode");
    }
  }
}

}  // namespace
}  // namespace xpuruntime
