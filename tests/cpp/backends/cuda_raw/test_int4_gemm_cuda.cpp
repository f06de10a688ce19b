// matmul_nbits' cuda_raw kernel (Note [Int4 GEMM on the GPU] in backends/cuda_raw/int4_gemm.cu) against its cpu
// kernel on random inputs (GPU; skipped without a CUDA device): both plans (the tensor-core kernel for m <= 64 and
// float16/bfloat16 x, the dequantize + cuBLAS path otherwise), its K splits, block sizes 16 to 256, K not a multiple
// of the block or of 8, zero points and bias of both float types, unaligned x; and which plan a descriptor gets
// (CPU-runnable: no device touched).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernel_run.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

Tensor random_float(const Shape& shape, DType dtype, float lo, float hi, std::mt19937& gen) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::uniform_real_distribution<float> dist(lo, hi);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return dtype == DType::kFloat32 ? t : ops::cast(t, dtype);
}

Tensor random_bytes(const Shape& shape, std::mt19937& gen) {
  Tensor t = Tensor::empty(shape, DType::kUInt8);
  std::uniform_int_distribution<int> byte(0, 255);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<std::uint8_t>(byte(gen));
  return t;
}

using kernel_run::floats_of;

// sum_k |x[m, k] * W[n, k]| from the host inputs: the scale of each output's rounding errors.
std::vector<double> magnitudes(const Tensor& x, const Tensor& w, const Tensor& scales, const Tensor& zp,
                               std::int64_t block) {
  const std::vector<float> xs = floats_of(x), ss = floats_of(scales);
  const std::int64_t k = x.shape().back(), m = x.numel() / k, n = w.shape()[0], blocks = w.shape()[1];
  const auto* codes = static_cast<const std::uint8_t*>(w.data_ptr());
  const auto* zero = zp.defined() ? static_cast<const std::uint8_t*>(zp.data_ptr()) : nullptr;
  std::vector<double> out(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t j = 0; j < n; ++j) {
    for (std::int64_t l = 0; l < k; ++l) {
      const std::int64_t b = l / block;
      const int code = (codes[j * blocks * (block / 2) + l / 2] >> (4 * (l % 2))) & 0xF;
      const int z = zero ? (zero[j * ((blocks + 1) / 2) + b / 2] >> (4 * (b % 2))) & 0xF : 8;
      const double wv = std::fabs((code - z) * static_cast<double>(ss[static_cast<std::size_t>(j * blocks + b)]));
      for (std::int64_t r = 0; r < m; ++r) {
        out[static_cast<std::size_t>(r * n + j)] += wv * std::fabs(xs[static_cast<std::size_t>(r * k + l)]);
      }
    }
  }
  return out;
}

// Relative error of the GPU's weights and products: float16's and bfloat16's dequantized weights round once (2^-11,
// 2^-8), then float32 sums; float32 runs cuBLAS in float32.
double relative_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 2e-3;
    case DType::kBFloat16: return 1.6e-2;
    default: return 3e-5;  // cuBLAS's float32 sums against the cpu kernel's double ones
  }
}

struct Case {
  std::int64_t m, k, n, block;
  bool zero_points;
  int bias;  // 0 none, 1 x's dtype, 2 float32
  bool float_scales;
};

std::string label(const Case& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " +
         std::to_string(c.n) + " block " + std::to_string(c.block) + (c.zero_points ? " zp" : "") +
         (c.bias == 1 ? " bias" : c.bias == 2 ? " float32 bias" : "") + (c.float_scales ? " float32 scales" : "");
}

// A case's inputs on the host (x, w, scales, zero points, bias; absent ones undefined) and the cpu kernel's output.
struct Problem {
  std::vector<Tensor> host;
  Tensor want;
};

Problem problem_of(const Case& c, DType dtype, std::mt19937& gen) {
  const std::int64_t blocks = (c.k + c.block - 1) / c.block;
  Problem p;
  p.host = {random_float({c.m, c.k}, dtype, -1.0f, 1.0f, gen), random_bytes({c.n, blocks, c.block / 2}, gen),
            random_float({c.n, blocks}, c.float_scales ? DType::kFloat32 : dtype, 0.002f, 0.05f, gen),
            c.zero_points ? random_bytes({c.n, (blocks + 1) / 2}, gen) : Tensor(),
            c.bias ? random_float({c.n}, c.bias == 2 ? DType::kFloat32 : dtype, -1.0f, 1.0f, gen) : Tensor()};
  p.want = ops::call("matmul_nbits", p.host, Attributes().set("block_size", c.block))[0];
  return p;
}

std::vector<Tensor> on_gpu(const std::vector<Tensor>& host) {
  std::vector<Tensor> out;
  for (const Tensor& t : host) out.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
  return out;
}

// The GPU's output against the cpu kernel's, within the tolerance of each output's magnitude.
void expect_close(const Tensor& got, const Problem& p, const Case& c, DType dtype, const std::string& what) {
  StreamManager::instance().current_stream(Device::cuda(0)).synchronize();
  ASSERT_EQ(got.shape(), p.want.shape()) << what;
  ASSERT_EQ(got.dtype(), p.want.dtype()) << what;
  const std::vector<float> a = floats_of(got), e = floats_of(p.want);
  const std::vector<double> mag = magnitudes(p.host[0], p.host[1], p.host[2], p.host[3], c.block);
  const double rel = relative_tolerance(dtype);
  const double out_ulp = dtype == DType::kFloat16 ? 1e-3 : dtype == DType::kBFloat16 ? 8e-3 : 1e-6;
  std::int64_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double tol = rel * mag[i] + out_ulp * std::fabs(e[i]) + 1e-6;
    if (!(std::fabs(static_cast<double>(a[i]) - e[i]) <= tol) && bad++ == 0) {
      first = "element " + std::to_string(i) + ": cuda_raw " + std::to_string(a[i]) + ", cpu " + std::to_string(e[i]) +
              ", tolerance " + std::to_string(tol);
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " differ; first " << first;
}

ops::CallOptions pinned_to_cuda_raw() {
  static KernelPolicy pinned = [] {
    KernelPolicy policy;
    policy.set("matmul_nbits", "pin:cuda_raw");
    return policy;
  }();
  ops::CallOptions options;
  options.kernel_policy = &pinned;
  return options;
}

// Runs the case on the cpu kernel and on cuda_raw (pinned), and compares. `x_offset`: elements x starts into its
// device buffer (1 leaves it off 16-byte alignment).
void check(const Case& c, DType dtype, std::mt19937& gen, std::int64_t x_offset = 0) {
  const std::string what = label(c, dtype) + (x_offset ? " unaligned x" : "");
  const Problem p = problem_of(c, dtype, gen);
  std::vector<Tensor> device = on_gpu(p.host);
  if (x_offset != 0) {
    const Device gpu = Device::cuda(0);
    Tensor padded = Tensor::zeros({c.m * c.k + x_offset}, dtype, gpu);
    const std::size_t bytes = static_cast<std::size_t>(x_offset) * dtype_size(dtype);
    device[0] = Tensor::from_blob(static_cast<char*>(padded.data_ptr()) + bytes, {c.m, c.k}, {}, dtype, gpu,
                                  padded.storage());
    device[0].copy_from(p.host[0]);
  }
  const Tensor got =
      ops::call("matmul_nbits", device, Attributes().set("block_size", c.block), pinned_to_cuda_raw())[0];
  expect_close(got, p, c, dtype, what);
}

// Every grid the tensor-core kernel offers to autotuning (its tactics: tiles of columns per block, K splits), each
// built from its plan record, gives the cpu kernel's results; a malformed record is an InvalidArgumentError.
TEST(Int4GemmCuda, EveryGridMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  const Kernel* kernel = KernelRegistry::global().find_kernel("matmul_nbits", "cuda_raw");
  ASSERT_NE(kernel, nullptr);
  std::mt19937 gen(23);
  const Case cases[] = {
      {1, 4096, 4096, 32, false, 1, false}, {5, 8192, 72, 128, true, 0, false},  // many columns; few, long K
      {16, 2048, 1000, 16, true, 2, true},  {40, 1000, 264, 64, false, 1, false},
      {9, 96, 40, 32, true, 0, true},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const Problem p = problem_of(c, dtype, gen);
      const std::vector<Tensor> device = on_gpu(p.host);
      const ops::PreparedCall prepared("matmul_nbits", device, Attributes().set("block_size", c.block),
                                       pinned_to_cuda_raw());
      const OpDescriptor& desc = prepared.descriptor();
      const std::vector<std::string> records = kernel->tactics(desc, ExecutionPolicy());
      EXPECT_GE(records.size(), 2u) << label(c, dtype);
      for (const std::string& record : records) {
        const std::unique_ptr<KernelPlan> plan = kernel->build(desc, ExecutionPolicy(), record);
        EXPECT_EQ(plan->record(), record);
        std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, dtype, Device::cuda(0))};
        plan->execute(desc, device, outputs, StreamManager::instance().current_stream(Device::cuda(0)));
        expect_close(outputs[0], p, c, dtype, label(c, dtype) + " grid " + record + " (" + plan->describe() + ")");
      }
      if (&c != &cases[0] || dtype != DType::kFloat16) continue;
      for (const char* bad : {"{\"tiles\": 3, \"splits\": 1}", "{\"tiles\": 2}", "{\"tiles\": 2, \"splits\": 9}",
                              "not json", "{\"tiles\": 1, \"splits\": 1, \"kernel\": \"stream\"}",
                              "{\"tiles\": 2, \"splits\": 1, \"kernel\": \"mma\"}",
                              "{\"tiles\": 4, \"splits\": 1, \"kernel\": \"gemv\"}",
                              "{\"tiles\": 2, \"splits\": 1, \"kernel\": \"stream\", \"ring\": 8192}",
                              "{\"tiles\": 4, \"splits\": 1, \"kernel\": \"stream\", \"ring\": 4096}",
                              "{\"tiles\": 4, \"splits\": 1, \"ring\": 8192}",
                              "{\"tiles\": 4, \"splits\": 1, \"staging\": \"none\"}",
                              "{\"tiles\": 4, \"splits\": 1, \"kernel\": \"stream\", \"staging\": \"all\"}",
                              "{\"tiles\": 4, \"splits\": 1, \"kernel\": \"stream\", \"x\": \"shared\"}"}) {
        EXPECT_THROW(kernel->build(desc, ExecutionPolicy(), bad), InvalidArgumentError) << bad;
      }
    }
  }
}

// Each case (in float16 and bfloat16; where `unaligned` says so, also with x off 16-byte alignment) run by the plan of
// each record, against the cpu kernel.
template <std::size_t kCases>
void check_records(const Kernel& kernel, const Case (&cases)[kCases], const std::vector<const char*>& records,
                   bool (*unaligned)(const Case&), std::mt19937& gen) {
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (const std::int64_t x_offset : {0, 1}) {
        if (x_offset == 1 && !unaligned(c)) continue;
        const Problem p = problem_of(c, dtype, gen);
        std::vector<Tensor> device = on_gpu(p.host);
        Tensor padded;
        if (x_offset != 0) {  // x one element into its buffer: off 16-byte alignment
          padded = Tensor::zeros({c.m * c.k + x_offset}, dtype, Device::cuda(0));
          device[0] = Tensor::from_blob(static_cast<char*>(padded.data_ptr()) + dtype_size(dtype), {c.m, c.k}, {},
                                        dtype, Device::cuda(0), padded.storage());
          device[0].copy_from(p.host[0]);
        }
        const ops::PreparedCall prepared("matmul_nbits", device, Attributes().set("block_size", c.block),
                                         pinned_to_cuda_raw());
        const OpDescriptor& desc = prepared.descriptor();
        for (const char* record : records) {
          const std::unique_ptr<KernelPlan> plan = kernel.build(desc, ExecutionPolicy(), record);
          std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, dtype, Device::cuda(0))};
          plan->execute(desc, device, outputs, StreamManager::instance().current_stream(Device::cuda(0)));
          expect_close(outputs[0], p, c, dtype,
                       label(c, dtype) + (x_offset ? " unaligned x" : "") + " " + record + " (" + plan->describe() +
                           ")");
        }
      }
    }
  }
}

// The streaming kernel of m <= 16 (Note [Int4 GEMM streamed through shared memory]) at each of its grids, on the shapes
// that exercise its edges: m 1 to 16 (x rows past m; past 8 a second MMA per weight fragment), columns not a multiple
// of 16 or 32, K ending inside a chunk or not a multiple of 8 (x read element by element), x off 16-byte alignment,
// blocks of 32 to 256 (128 and up: the scale after the MMAs), zero points, float32 scales, both biases, K splits,
// the deep ring of 4 tiles (where x is read other than in whole chunks, or m > 8, the default ring or kernel runs), x
// and the scales staged in shared memory (the default where they fit: Note [x in shared memory for the streaming
// kernel]), the scales only, x only and nothing (records with "staging");
// and at m > 16 or with blocks of 16 a stream record runs the other kernel.
TEST(Int4GemmCuda, StreamingKernelMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  const Kernel* kernel = KernelRegistry::global().find_kernel("matmul_nbits", "cuda_raw");
  ASSERT_NE(kernel, nullptr);
  std::mt19937 gen(24);
  const Case cases[] = {
      {1, 4096, 4096, 32, false, 0, false}, {2, 1024, 77, 16, true, 1, false},  {3, 4104, 33, 64, false, 2, true},
      {8, 512, 1000, 256, true, 1, false},  {7, 96, 40, 32, true, 0, true},     {4, 1001, 50, 32, true, 1, false},
      {5, 8192, 72, 128, true, 0, false},   {6, 2048, 129, 16, false, 2, false}, {12, 512, 40, 32, true, 1, false},
      {16, 4096, 264, 32, false, 0, false}, {9, 1000, 100, 64, true, 2, true},  {13, 2048, 77, 128, false, 1, false},
      {20, 512, 40, 32, true, 1, false},    {2, 1024, 50, 128, true, 2, true},   // float32 scales after the MMA
  };
  const std::vector<const char*> records = {
      "{\"kernel\": \"stream\", \"splits\": 1, \"tiles\": 2}",
      "{\"kernel\": \"stream\", \"splits\": 1, \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"splits\": 3, \"tiles\": 2}",
      "{\"kernel\": \"stream\", \"splits\": 2, \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"ring\": 8192, \"splits\": 1, \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"ring\": 8192, \"splits\": 2, \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"splits\": 1, \"staging\": \"none\", \"tiles\": 2}",
      "{\"kernel\": \"stream\", \"splits\": 3, \"staging\": \"none\", \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"splits\": 1, \"staging\": \"scales\", \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"splits\": 2, \"staging\": \"scales\", \"tiles\": 2}",
      "{\"kernel\": \"stream\", \"splits\": 2, \"staging\": \"x\", \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"ring\": 8192, \"splits\": 1, \"staging\": \"scales\", \"tiles\": 4}",
      "{\"kernel\": \"stream\", \"splits\": 1, \"tiles\": 4, \"x\": \"global\"}"};  // older: staging "none"
  check_records(*kernel, cases, records, [](const Case& c) { return c.m <= 3 || c.m == 9; }, gen);
}

// The GEMV kernel of m <= 4 (Note [Int4 GEMV with sub-blocks as the MMA's columns]) at each of its grids, on the
// shapes that exercise its edges: m 1 to 4 (x rows past m in a set of two; m 3-4 a second MMA per weight fragment),
// columns not a multiple of 16, K not a multiple of a group (128 codes) or of the block, blocks of 32 to 256 (the
// zero points' nibble per sub-block), zero points, float32 scales, both biases, K splits, a split of one group; and
// where it does not take the problem (m > 4, blocks of 16, K not a multiple of 32, x off 16-byte alignment) a gemv
// record runs the streaming kernel or the other kernel.
TEST(Int4GemmCuda, GemvKernelMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  const Kernel* kernel = KernelRegistry::global().find_kernel("matmul_nbits", "cuda_raw");
  ASSERT_NE(kernel, nullptr);
  std::mt19937 gen(25);
  const Case cases[] = {
      {1, 4096, 4096, 32, false, 0, false}, {2, 4128, 77, 32, true, 1, false},  {3, 4104, 33, 64, false, 2, true},
      {4, 512, 1000, 256, true, 1, false},  {1, 96, 40, 32, true, 0, true},     {4, 1024, 50, 128, true, 2, true},
      {1, 11008, 129, 128, false, 1, false}, {2, 640, 300, 64, true, 0, false}, {3, 160, 17, 32, true, 1, false},
      {5, 512, 40, 32, true, 1, false},     {2, 1024, 77, 16, true, 1, false},  {1, 1000, 50, 32, true, 0, false},
  };
  const std::vector<const char*> records = {"{\"kernel\": \"gemv\", \"splits\": 1, \"tiles\": 2}",
                                            "{\"kernel\": \"gemv\", \"splits\": 3, \"tiles\": 2}",
                                            "{\"kernel\": \"gemv\", \"splits\": 8, \"tiles\": 2}"};
  check_records(*kernel, cases, records, [](const Case& c) { return c.m == 2; }, gen);
}

TEST(Int4GemmCuda, TensorCoreKernelMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 gen(21);
  const Case cases[] = {
      {1, 4096, 256, 32, false, 0, false},  {1, 4096, 4096, 128, true, 1, false}, {2, 1000, 77, 16, true, 0, false},
      {3, 4104, 33, 64, false, 2, true},    {8, 512, 1000, 256, true, 1, false},  {9, 96, 40, 32, true, 0, true},
      {16, 2048, 512, 128, false, 2, false}, {17, 300, 129, 32, true, 1, false},  {33, 1024, 64, 64, false, 0, true},
      {64, 256, 96, 16, true, 1, false},    {5, 8192, 64, 128, true, 0, false},   // few columns, long K: splits
      {1, 11008, 24, 32, false, 1, false},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) check(c, dtype, gen);
  }
  // K not a multiple of 8 and x off 16-byte alignment: x read element by element.
  check({4, 1001, 50, 32, true, 1, false}, DType::kFloat16, gen);
  check({3, 512, 70, 64, false, 0, false}, DType::kBFloat16, gen, /*x_offset=*/1);
}

TEST(Int4GemmCuda, DequantizeAndCublasPathMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 gen(22);
  const Case cases[] = {
      {65, 512, 300, 32, true, 1, false},  // m past the tensor-core kernel
      {200, 1024, 1000, 128, false, 2, true},
      {3, 40, 17, 16, true, 1, false},     // an odd number of 16-blocks: rows not 16-byte multiples
      {1, 48, 5, 16, false, 0, false},
  };
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) check(c, dtype, gen);
  }
  // float32 x always takes this path (the cuBLAS GEMM in float32 under the default precision).
  check({1, 4096, 128, 128, true, 2, true}, DType::kFloat32, gen);
  check({16, 1001, 33, 32, false, 1, false}, DType::kFloat32, gen);
}

TEST(Int4GemmCuda, PlansByShape) {
#if !XPURT_WITH_CUDA
  GTEST_SKIP() << "a build without CUDA: cuda_raw's matmul_nbits is declared only, and refuses every descriptor";
#endif
  const Kernel* kernel = KernelRegistry::global().find_kernel("matmul_nbits", "cuda_raw");
  ASSERT_NE(kernel, nullptr);
  const auto describe = [&](std::int64_t m, std::int64_t k, DType dtype, std::int64_t block) {
    OpDescriptor desc;
    desc.op = "matmul_nbits";
    desc.device = Device::cuda(0);
    desc.compute_capability = 90;
    const std::int64_t blocks = (k + block - 1) / block;
    desc.inputs = {TensorDesc::contiguous({m, k}, dtype, desc.device),
                   TensorDesc::contiguous({64, blocks, block / 2}, DType::kUInt8, desc.device),
                   TensorDesc::contiguous({64, blocks}, dtype, desc.device)};
    desc.attrs.set("block_size", block);
    KernelRegistry::global().infer(desc);
    return kernel->supports(desc, ExecutionPolicy());
  };
  EXPECT_TRUE(describe(1, 4096, DType::kFloat16, 32).ok());
  EXPECT_TRUE(describe(1000, 4096, DType::kBFloat16, 128).ok());
  EXPECT_TRUE(describe(7, 40, DType::kFloat32, 16).ok());
  if (DeviceManager::instance().get_device_count() == 0) return;
  // Building a plan asks the device (its SM count): which plan each shape gets.
  const auto plan_text = [&](std::int64_t m, std::int64_t k, DType dtype, std::int64_t block) {
    const std::int64_t blocks = (k + block - 1) / block;
    Tensor x = Tensor::zeros({m, k}, dtype, Device::cuda(0));
    Tensor w = Tensor::zeros({64, blocks, block / 2}, DType::kUInt8, Device::cuda(0));
    Tensor s = Tensor::zeros({64, blocks}, dtype, Device::cuda(0));
    KernelPolicy pinned;
    pinned.set("matmul_nbits", "pin:cuda_raw");
    ops::CallOptions options;
    options.kernel_policy = &pinned;
    return ops::plan("matmul_nbits", {x, w, s}, Attributes().set("block_size", block), options).decision.plan_summary;
  };
  EXPECT_NE(plan_text(16, 4096, DType::kFloat16, 32).find("tensor-core"), std::string::npos);
  EXPECT_NE(plan_text(65, 4096, DType::kFloat16, 32).find("cuBLAS"), std::string::npos);
  EXPECT_NE(plan_text(1, 4096, DType::kFloat32, 32).find("cuBLAS"), std::string::npos);
  EXPECT_NE(plan_text(1, 48, DType::kFloat16, 16).find("cuBLAS"), std::string::npos);
}

}  // namespace
}  // namespace xpuruntime
