// The cuda_raw kernels that reduce or scan a long axis into few results (issue 42, "no kernel off a cliff"): integer
// reductions and reduce_prod (Note [Block reductions] in reduce.cu), arg_max / arg_min (Note [Split arg reductions]
// in select.cu) and cum_sum (Note [Split scans] in scan.cu). Their plans split the axis when the results are few
// (CPU-runnable: building a plan touches no device); on a GPU, every split against the cpu kernel at awkward shapes
// (one result from 10M+ elements, prime sizes, one huge row, strided axes), all-false / all-true flags, NaNs and ties,
// and the same bits on a second run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

#if XPURT_WITH_CUDA
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"
#endif

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? "," : "") + std::to_string(shape[k]);
  return out + "]";
}

#if XPURT_WITH_CUDA

// ---- plans (CPU-runnable) ----

const Kernel& cuda_raw_kernel(const std::string& op) {
  const Kernel* kernel = KernelRegistry::global().find_kernel(op, "cuda_raw");
  if (kernel == nullptr) throw std::runtime_error("no cuda_raw kernel for op '" + op + "'");
  return *kernel;
}

// The plan cuda_raw builds for `op` on a CUDA tensor of `shape` and `dtype` (a descriptor only: nothing runs).
std::unique_ptr<KernelPlan> plan_of(const std::string& op, const Shape& shape, DType dtype, const Attributes& attrs,
                                    const ExecutionPolicy& policy = {}) {
  OpDescriptor desc;
  desc.op = op;
  desc.inputs = {TensorDesc::contiguous(shape, dtype, Device::cuda(0))};
  desc.attrs = attrs;
  desc.device = Device::cuda(0);
  desc.compute_capability = 90;
  KernelRegistry::global().infer(desc);
  const Support support = cuda_raw_kernel(op).supports(desc, policy);
  EXPECT_TRUE(support) << op << shape_str(shape) << ": " << support.reason();
  return cuda_raw_kernel(op).build(desc, policy, "");
}

void expect_plan(const KernelPlan& plan, const std::string& fragment, std::size_t workspace) {
  EXPECT_NE(plan.describe().find(fragment), std::string::npos) << plan.describe() << " lacks '" << fragment << "'";
  EXPECT_EQ(plan.workspace_bytes(), workspace) << plan.describe();
}

TEST(CudaRawSplitPlans, IntegerReductionsAndProductsSplitWhenResultsAreFew) {
  // isinf(x).any() of 10M elements: blocks of 5120 (at most 2048 blocks), 2048 partials of 8 bytes.
  expect_plan(*plan_of("reduce_max", {10485760}, DType::kInt64, Attributes().set("keepdims", std::int64_t{0})),
              "1 outputs x 10485760 elements, block kernel, 2048 splits", 2048 * 8);
  // T5's guard at batch 1: 65,536 elements in 32 chunks of 2048, one round of 8 loads a thread.
  expect_plan(*plan_of("reduce_max", {1, 128, 512}, DType::kInt64, Attributes().set("keepdims", std::int64_t{0})),
              "1 outputs x 65536 elements, block kernel, 32 splits", 32 * 8);
  expect_plan(*plan_of("reduce_sum", {7, 50000}, DType::kInt32, Attributes().set("axes", Shape{1})),
              "7 outputs x 50000 elements, block kernel, 25 splits", 7 * 25 * 8);
  expect_plan(*plan_of("reduce_prod", {1000003}, DType::kFloat16, {}), "block kernel, 489 splits", 489 * 8);
  // Enough results to fill the GPU, or short ones: one pass.
  expect_plan(*plan_of("reduce_min", {4096, 4096}, DType::kInt32, Attributes().set("axes", Shape{1})),
              "4096 outputs x 4096 elements, block kernel, 1 split", 0);
  expect_plan(*plan_of("reduce_max", {4095}, DType::kInt64, {}), "block kernel, 1 split", 0);
  // Bools (Note [Bools 16 at a time]): chunks of 65,536 (two rounds of 16-byte loads a thread), so T5's guard after
  // predicate_reduction is one block, and any() of 10M bools 160 blocks.
  const Attributes all_axes = Attributes().set("keepdims", std::int64_t{0});
  expect_plan(*plan_of("reduce_max", {1, 128, 512}, DType::kBool, all_axes),
              "1 outputs x 65536 elements, block kernel, 1 split", 0);
  expect_plan(*plan_of("reduce_min", {10485760}, DType::kBool, all_axes), "block kernel, 160 splits", 160 * 8);
  expect_plan(*plan_of("reduce_max", {3, 1000003}, DType::kBool, Attributes().set("axes", Shape{1})),
              "3 outputs x 1000003 elements, block kernel, 16 splits", 3 * 16 * 8);
  // Float sums keep their own kernels and 4-byte partials.
  expect_plan(*plan_of("reduce_sum", {1000003}, DType::kFloat32, {}), "row kernel, 123 splits", 123 * 4);
  // The workspace limit caps the partials: 64 bytes hold 8, 15 bytes none.
  for (const auto& [limit, splits] : std::vector<std::pair<std::uint64_t, std::size_t>>{{64, 8}, {15, 1}}) {
    ExecutionPolicy limited;
    limited.workspace_limit = limit;
    expect_plan(*plan_of("reduce_max", {10485760}, DType::kInt64, {}, limited),
                "block kernel, " + std::to_string(splits) + (splits == 1 ? " split" : " splits"),
                splits == 1 ? 0 : splits * 8);
  }
}

TEST(CudaRawSplitPlans, ArgReductionsSplitALongAxis) {
  const auto axis = [](std::int64_t a) { return Attributes().set("axis", a).set("keepdims", std::int64_t{0}); };
  expect_plan(*plan_of("arg_max", {1000003}, DType::kFloat32, axis(0)),
              "1 lines x 1000003 elements, row kernel, 245 splits", 245 * 16);
  expect_plan(*plan_of("arg_min", {100000, 3}, DType::kFloat16, axis(0)),
              "3 lines x 100000 elements, column kernel, 391 splits", 3 * 391 * 16);
  expect_plan(*plan_of("arg_max", {64, 32000}, DType::kBFloat16, axis(1)),
              "64 lines x 32000 elements, row kernel, 8 splits", 64 * 8 * 16);
  expect_plan(*plan_of("arg_max", {4096, 1000}, DType::kFloat32, axis(1)), "row kernel, 1 split", 0);
  ExecutionPolicy limited;
  limited.workspace_limit = 160;
  expect_plan(*plan_of("arg_max", {1000003}, DType::kFloat32, axis(0), limited), "row kernel, 10 splits", 160);
}

TEST(CudaRawSplitPlans, CumSumSplitsALongAxis) {
  const auto axis = [](std::int64_t a) { return Attributes().set("axis", a); };
  expect_plan(*plan_of("cum_sum", {1000003}, DType::kFloat32, axis(0)), "1 lines x 1000003 elements, 7813 splits",
              7813 * 8);
  expect_plan(*plan_of("cum_sum", {4, 100000}, DType::kInt64, axis(1)), "4 lines x 100000 elements, 782 splits",
              4 * 782 * 8);
  expect_plan(*plan_of("cum_sum", {100000, 1000}, DType::kFloat16, axis(0)),
              "1000 lines x 100000 elements, 66 splits", 1000 * 66 * 8);
  expect_plan(*plan_of("cum_sum", {65536, 300}, DType::kFloat32, axis(1)), "65536 lines x 300 elements, 1 split", 0);
  // Few short lines: a block per line, no workspace (a [1, 128] position cumsum); too short an axis stays a walk.
  expect_plan(*plan_of("cum_sum", {255}, DType::kInt32, axis(0)), "1 lines x 255 elements, a block per line", 0);
  expect_plan(*plan_of("cum_sum", {1, 128}, DType::kInt64, axis(1)), "1 lines x 128 elements, a block per line", 0);
  expect_plan(*plan_of("cum_sum", {3, 20}, DType::kInt64, axis(1)), "3 lines x 20 elements, 1 split", 0);
  ExecutionPolicy limited;
  limited.workspace_limit = 8;  // no room for split sums: a block per line walks the long axis in tiles
  expect_plan(*plan_of("cum_sum", {4, 100000}, DType::kInt64, axis(1), limited),
              "4 lines x 100000 elements, a block per line", 0);
}

TEST(CudaRawSplitPlans, SoftmaxSplitsFewLongRows) {
  const auto axis = [](std::int64_t a) { return Attributes().set("axis", a); };
  expect_plan(*plan_of("softmax", {1, 128256}, DType::kFloat16, axis(-1)), "1 rows x 128256 elements, 63 splits",
              63 * 8);
  expect_plan(*plan_of("log_softmax", {2, 1048583}, DType::kFloat32, axis(1)),
              "2 rows x 1048583 elements, 132 splits", 2 * 132 * 8);
  expect_plan(*plan_of("softmax", {64, 32000}, DType::kFloat16, axis(-1)), "cuda_raw softmax", 0);  // cached rows
  expect_plan(*plan_of("softmax", {300, 100000}, DType::kFloat16, axis(-1)), "cuda_raw softmax", 0);  // rows enough
  expect_plan(*plan_of("softmax", {100000, 3}, DType::kFloat32, axis(0)), "cuda_raw softmax", 0);  // an inner axis
  ExecutionPolicy limited;
  limited.workspace_limit = 64;
  expect_plan(*plan_of("softmax", {1, 128256}, DType::kFloat16, axis(-1), limited), "8 splits", 64);
}

TEST(CudaRawSplitPlans, LayerNormSplitsFewLongRows) {
  const auto axis = [](std::int64_t a) { return Attributes().set("axis", a).set("epsilon", 1e-5); };
  // GroupNorm(1) of a [64, 56, 56] map at batch 1, GroupNorm(32) of [320, 64, 64] at batch 2
  expect_plan(*plan_of("layer_norm", {1, 64, 56, 56}, DType::kFloat16, axis(1)),
              "1 rows x 200704 elements, 98 splits", 98 * 8);
  expect_plan(*plan_of("layer_norm", {2, 32, 10, 64, 64}, DType::kFloat32, axis(2)),
              "64 rows x 40960 elements, 5 splits", 64 * 5 * 8);
  expect_plan(*plan_of("layer_norm", {128, 768}, DType::kFloat16, axis(-1)), "cuda_raw layer_norm", 0);
  expect_plan(*plan_of("layer_norm", {300, 40000}, DType::kFloat16, axis(-1)), "cuda_raw layer_norm", 0);
  Attributes quantized = axis(1);
  quantized.set("quantized_dtype", std::string("int8")).set("y_scale", 0.05).set("y_zero_point", std::int64_t{0});
  expect_plan(*plan_of("layer_norm", {1, 64, 56, 56}, DType::kFloat16, quantized), "cuda_raw layer_norm", 0);
}

TEST(CudaRawSplitPlans, TopKTakesTheRadixSelectForLongRowsAndAnyRowLength) {
  EXPECT_TRUE(cuda_raw::top_k_by_radix_select(3234, 300));  // SSDlite's per-class TopK
  EXPECT_TRUE(cuda_raw::top_k_by_radix_select(100000, 4096));
  EXPECT_FALSE(cuda_raw::top_k_by_radix_select(3000, 1500));  // k a large part of the row: the whole row sorted
  EXPECT_FALSE(cuda_raw::top_k_by_radix_select(1000, 10));    // short rows: the whole row sorted
  EXPECT_TRUE(cuda_raw::top_k_supports(32000, 50));            // top-k sampling over a vocabulary
  EXPECT_TRUE(cuda_raw::top_k_supports(4096, 4096));
  EXPECT_FALSE(cuda_raw::top_k_supports(100000, 4097));
  OpDescriptor desc;
  desc.op = "top_k";
  desc.inputs = {TensorDesc::contiguous({2, 100000}, DType::kFloat16, Device::cuda(0))};
  desc.attrs = Attributes().set("k", std::int64_t{5000}).set("axis", std::int64_t{-1});
  desc.device = Device::cuda(0);
  desc.compute_capability = 90;
  const Support refused = cuda_raw_kernel("top_k").supports(desc, ExecutionPolicy{});
  EXPECT_FALSE(refused);
  EXPECT_NE(refused.reason().find("k <= 4096 of a row over 4096 elements"), std::string::npos) << refused.reason();
  desc.attrs.set("k", std::int64_t{4096});
  EXPECT_TRUE(cuda_raw_kernel("top_k").supports(desc, ExecutionPolicy{}));
}

// Note [TopK of few long rows]: a chunk is at least 8192 elements and four times k, the rows times splits at most
// 264 blocks, the candidates (8-byte indices and the values) within the workspace limit.
TEST(CudaRawSplitPlans, TopKSplitsFewLongRows) {
  const auto k = [](std::int64_t v) { return Attributes().set("k", v).set("axis", std::int64_t{-1}); };
  expect_plan(*plan_of("top_k", {1, 1048583}, DType::kFloat32, k(100)), "1 rows x 1048583 elements, k 100, 128 splits",
              128 * 100 * 12);
  expect_plan(*plan_of("top_k", {64, 32000}, DType::kFloat16, k(50)), "64 rows x 32000 elements, k 50, 3 splits",
              64 * 3 * 50 * 10);
  expect_plan(*plan_of("top_k", {2, 100000}, DType::kBFloat16, k(4096)), "k 4096, 6 splits", 2 * 6 * 4096 * 10);
  expect_plan(*plan_of("top_k", {1, 3234}, DType::kFloat32, k(300)), "k 300, 1 split", 0);      // one chunk
  expect_plan(*plan_of("top_k", {1, 20000}, DType::kFloat32, k(4096)), "k 4096, 1 split", 0);   // chunks under 4k
  expect_plan(*plan_of("top_k", {300, 100000}, DType::kFloat16, k(10)), "k 10, 1 split", 0);    // rows enough
  expect_plan(*plan_of("top_k", {1, 1048583}, DType::kFloat32, k(0)), "k 0, 1 split", 0);
  ExecutionPolicy limited;
  limited.workspace_limit = 12000;
  expect_plan(*plan_of("top_k", {1, 1048583}, DType::kFloat32, k(100), limited), "10 splits", 10 * 100 * 12);
  limited.workspace_limit = 2000;
  expect_plan(*plan_of("top_k", {1, 1048583}, DType::kFloat32, k(100), limited), "1 split", 0);
  // 263 rows fill 263 of the 264 blocks: two splits at most; chunks of 8193 (not 8192: the balanced split of 16385)
  expect_plan(*plan_of("top_k", {263, 16385}, DType::kFloat16, k(2048)), "k 2048, 2 splits", 263 * 2 * 2048 * 10);
  expect_plan(*plan_of("top_k", {3, 16385}, DType::kFloat16, k(4096)), "k 4096, 1 split", 0);  // chunks of 16384+
}


#endif  // XPURT_WITH_CUDA

// ---- GPU: against the cpu kernel ----

int device_compute_capability(Device device) {
  if (!device.is_cuda()) return 0;
  return DeviceManager::instance().get_device_info(device).compute_capability();
}

// Runs `op` with kernel `name` on `inputs` (one device) and waits; the plan's workspace comes from the launch. Gives
// output `output`.
Tensor run_kernel(const std::string& op, const std::string& name, const std::vector<Tensor>& inputs,
                  const Attributes& attrs, std::size_t output = 0) {
  KernelRegistry& registry = KernelRegistry::global();
  const Kernel* kernel = registry.find_kernel(op, name);
  if (kernel == nullptr) throw std::runtime_error("no kernel '" + name + "' for op '" + op + "'");
  const Device device = inputs.at(0).device();
  OpDescriptor desc;
  desc.op = op;
  for (const Tensor& t : inputs) desc.inputs.push_back(TensorDesc::of(t));
  desc.attrs = attrs;
  desc.device = device;
  desc.compute_capability = device_compute_capability(device);
  registry.infer(desc);
  const ExecutionPolicy policy;
  const Support support = kernel->supports(desc, policy);
  if (!support) throw std::runtime_error(name + " does not support " + desc.signature() + ": " + support.reason());
  const auto plan = kernel->build(desc, policy, "");
  std::vector<Tensor> outputs;
  for (const TensorDesc& out : desc.outputs) outputs.push_back(Tensor::empty(out.shape, out.dtype, device));
  const StreamView stream = device.is_cuda() ? StreamManager::instance().current_stream(device) : StreamView();
  plan->execute(desc, inputs, outputs, stream);
  stream.synchronize();
  return outputs.at(output);
}

Attributes cast_to(DType dtype) { return Attributes().set("to", std::string(dtype_name(dtype))); }

// A host tensor of `dtype` holding `values` (float32 values cast by the cpu kernel; exact for the values used here).
Tensor host_tensor(const std::vector<float>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(float));
  if (dtype == DType::kFloat32) return t;
  return run_kernel("cast", "cpu", {t}, cast_to(dtype));
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

// The cpu result and the cuda_raw one (twice: the same bits both times), as host tensors.
std::pair<Tensor, Tensor> cpu_and_cuda(const std::string& op, const Tensor& host, const Attributes& attrs,
                                       const std::string& what, std::size_t output = 0) {
  const Tensor expected = run_kernel(op, "cpu", {host}, attrs, output);
  const Tensor device = host.to(Device::cuda(0));
  const Tensor actual = run_kernel(op, "cuda_raw", {device}, attrs, output).to(Device::cpu());
  const Tensor again = run_kernel(op, "cuda_raw", {device}, attrs, output).to(Device::cpu());
  EXPECT_EQ(std::memcmp(actual.data_ptr(), again.data_ptr(), actual.nbytes()), 0) << what << ": bits changed";
  EXPECT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_EQ(actual.dtype(), expected.dtype()) << what;
  return {expected, actual};
}

// Whether the element at `p` of a float dtype is a NaN (any sign and payload).
bool is_nan_element(const unsigned char* p, DType dtype) {
  if (dtype == DType::kFloat32) {
    float v = 0.0f;
    std::memcpy(&v, p, sizeof v);
    return std::isnan(v);
  }
  std::uint16_t bits = 0;
  std::memcpy(&bits, p, sizeof bits);
  if (dtype == DType::kFloat16) return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;
  if (dtype == DType::kBFloat16) return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0;
  return false;
}

// Expects the same bytes (integer results, indices, and float results that are exact in every order); a NaN equals
// any NaN (the host's NaN * -1 keeps the operand's sign, the GPU's products give its canonical NaN).
void expect_same_bytes(const Tensor& expected, const Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.nbytes(), actual.nbytes()) << what;
  const auto* e = static_cast<const unsigned char*>(expected.data_ptr());
  const auto* a = static_cast<const unsigned char*>(actual.data_ptr());
  const std::size_t element = dtype_size(expected.dtype());
  for (std::size_t i = 0; i < expected.nbytes(); i += element) {
    if (is_nan_element(e + i, expected.dtype()) && is_nan_element(a + i, expected.dtype())) continue;
    if (std::memcmp(e + i, a + i, element) != 0) {
      ADD_FAILURE() << what << ": element " << i / element << " differs (of " << expected.nbytes() / element << ")";
      return;
    }
  }
}

// Integer reductions: values in [-1000, 1000] (products: +-1), flags that are all 0, all 1, or 0 but one 1 (first,
// last), over a whole tensor of 10M+ elements, prime lengths, a row and a column of one.
TEST(CudaRawSplitGpu, IntegerReductionsMatchTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(42);
  struct Case {
    Shape shape;
    Shape axes;
  };
  const std::vector<Case> cases = {{{10000019}, {}},        {{1000003}, {0}},  {{3, 1000003}, {1}},
                                   {{1000003, 3}, {0}},     {{2, 40001, 3}, {0, 2}}, {{7, 16385}, {1}},
                                   {{5, 7}, {1}}};
  std::uniform_int_distribution<int> value(-1000, 1000), sign(0, 1);
  for (const DType dtype : {DType::kInt32, DType::kInt64}) {
    for (const auto& c : cases) {
      const std::int64_t n = numel_of(c.shape);
      for (const std::string op : {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}) {
        std::vector<float> values(static_cast<std::size_t>(n));
        for (float& v : values) v = static_cast<float>(op == "reduce_prod" ? 2 * sign(rng) - 1 : value(rng));
        const Tensor x = host_tensor(values, c.shape, dtype);
        const Attributes attrs = Attributes().set("axes", c.axes).set("keepdims", std::int64_t{0});
        const std::string what = op + " " + std::string(dtype_name(dtype)) + shape_str(c.shape) + " axes " +
                                 shape_str(c.axes);
        const auto [expected, actual] = cpu_and_cuda(op, x, attrs, what);
        expect_same_bytes(expected, actual, what);
      }
    }
  }
  // The same as bools (Note [Bools 16 at a time]): rows that start off 16-byte boundaries, strided axes (the byte
  // kernel), the deciding byte in a head, a vector or a tail.
  for (const auto& c : cases) {
    const std::int64_t n = numel_of(c.shape);
    for (const int density : {0, 1, 1000, -1}) {  // all false, mostly true, one in a thousand true, all true
      std::vector<float> values(static_cast<std::size_t>(n));
      std::uniform_int_distribution<int> one_in(0, std::max(density, 1) - 1);
      for (float& v : values) v = density == -1 || (density > 0 && one_in(rng) == 0) ? 1.0f : 0.0f;
      if (density == 1) values[static_cast<std::size_t>(n / 2)] = 0.0f;
      const Tensor x = host_tensor(values, c.shape, DType::kBool);
      for (const std::string op : {"reduce_max", "reduce_min"}) {
        const Attributes attrs = Attributes().set("axes", c.axes).set("keepdims", std::int64_t{0});
        const std::string what = op + " bool" + shape_str(c.shape) + " axes " + shape_str(c.axes) + " density " +
                                 std::to_string(density);
        const auto [expected, actual] = cpu_and_cuda(op, x, attrs, what);
        expect_same_bytes(expected, actual, what);
      }
    }
  }
  // isinf(x).any() and (x > 0).all(): int64 flags of 10M+ elements reduced by max and min.
  const std::int64_t n = 10000019;
  for (const std::int64_t one_at : {std::int64_t{-1}, std::int64_t{0}, n - 1, n / 2, std::int64_t{-2}}) {
    std::vector<float> flags(static_cast<std::size_t>(n), one_at == -2 ? 1.0f : 0.0f);
    if (one_at >= 0) flags[static_cast<std::size_t>(one_at)] = 1.0f;
    const Tensor x = host_tensor(flags, {n}, DType::kInt64);
    for (const std::string op : {"reduce_max", "reduce_min", "reduce_sum"}) {
      const std::string what = op + " of int64 flags, one_at " + std::to_string(one_at);
      const auto [expected, actual] = cpu_and_cuda(op, x, Attributes().set("keepdims", std::int64_t{0}), what);
      expect_same_bytes(expected, actual, what);
    }
  }
}

// reduce_prod of floats: +-1 with four 2s and four 0.5s (every partial product a power of two within 2^-4..2^4, so
// exact in any order and any precision), and NaN.
TEST(CudaRawSplitGpu, FloatProductsMatchTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  std::uniform_int_distribution<int> sign(0, 1);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{1000003}, {}}, {{3, 400009}, {1}}, {{200003, 3}, {0}}, {{17, 19}, {0, 1}}};
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [shape, axes] : cases) {
      for (const bool with_nan : {false, true}) {
        std::vector<float> values(static_cast<std::size_t>(numel_of(shape)));
        for (float& v : values) v = sign(rng) == 0 ? 1.0f : -1.0f;
        std::uniform_int_distribution<std::size_t> at(0, values.size() - 1);
        for (int k = 0; k < 8; ++k) values[at(rng)] = k < 4 ? 2.0f : 0.5f;
        if (with_nan) values[values.size() / 3] = std::numeric_limits<float>::quiet_NaN();
        const Tensor x = host_tensor(values, shape, dtype);
        const std::string what = "reduce_prod " + std::string(dtype_name(dtype)) + shape_str(shape) +
                                 (with_nan ? " with a NaN" : "");
        const auto [expected, actual] =
            cpu_and_cuda("reduce_prod", x, Attributes().set("axes", axes).set("keepdims", std::int64_t{1}), what);
        expect_same_bytes(expected, actual, what);
      }
    }
  }
}

// The contract's arg_max / arg_min along `axis` of a row-major `shape` (cuda_raw_kernels.h): NaN counts as the max and
// as the min, the first NaN winning; ties: the first index, or the last. (The cpu kernel skips NaNs.)
std::vector<std::int64_t> nan_aware_arg(const std::vector<float>& x, const Shape& shape, std::int64_t axis, bool max,
                                        bool last) {
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const std::int64_t size = shape[static_cast<std::size_t>(axis)];
  std::vector<std::int64_t> out;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      const float* p = x.data() + o * size * inner + i;
      std::int64_t at = 0;
      for (std::int64_t k = 1; k < size && !std::isnan(p[at * inner]); ++k) {
        const float v = p[k * inner], best = p[at * inner];
        if (std::isnan(v) || (max ? v > best : v < best) || (last && v == best)) at = k;
      }
      out.push_back(at);
    }
  }
  return out;
}

// arg_max / arg_min: values from a small set (many ties), first and last index, NaNs (the first one wins), all equal.
TEST(CudaRawSplitGpu, ArgReductionsMatchTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(44);
  std::uniform_int_distribution<int> eighth(-64, 64);
  struct Case {
    Shape shape;
    std::int64_t axis;
  };
  const std::vector<Case> cases = {{{10000019}, 0},    {{1000003}, 0},    {{3, 1000003}, 1}, {{1000003, 3}, 0},
                                   {{64, 32003}, 1},   {{64, 32003}, 0},  {{5, 8191, 7}, 1}, {{4096, 100}, 1},
                                   {{1}, 0},           {{9, 1}, 1}};
  enum class Fill { kRandom, kNaNs, kEqual };
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    for (const auto& c : cases) {
      for (const Fill fill : {Fill::kRandom, Fill::kNaNs, Fill::kEqual}) {
        if (numel_of(c.shape) > 2000000 && (dtype == DType::kFloat64 || fill == Fill::kEqual)) continue;
        std::vector<float> values(static_cast<std::size_t>(numel_of(c.shape)));
        for (float& v : values) v = fill == Fill::kEqual ? 0.5f : static_cast<float>(eighth(rng)) / 8.0f;
        if (fill == Fill::kNaNs) {
          for (std::size_t i = values.size() / 5; i < values.size(); i += values.size() / 3 + 1) {
            values[i] = std::numeric_limits<float>::quiet_NaN();
          }
        }
        const Tensor x = host_tensor(values, c.shape, dtype);
        for (const std::string op : {"arg_max", "arg_min"}) {
          for (const std::int64_t last : {0, 1}) {
            const Attributes attrs =
                Attributes().set("axis", c.axis).set("keepdims", std::int64_t{0}).set("select_last_index", last);
            const std::string what = op + " " + std::string(dtype_name(dtype)) + shape_str(c.shape) + " axis " +
                                     std::to_string(c.axis) + " last " + std::to_string(last) + " fill " +
                                     std::to_string(static_cast<int>(fill));
            const auto [from_cpu, actual] = cpu_and_cuda(op, x, attrs, what);
            Tensor expected = from_cpu;
            if (fill == Fill::kNaNs) {
              const std::vector<std::int64_t> want = nan_aware_arg(values, c.shape, c.axis, op == "arg_max", last != 0);
              expected = Tensor::empty(from_cpu.shape(), DType::kInt64);
              ASSERT_EQ(static_cast<std::int64_t>(want.size()), expected.numel()) << what;
              std::memcpy(expected.data_ptr(), want.data(), want.size() * sizeof(std::int64_t));
            }
            expect_same_bytes(expected, actual, what);
          }
        }
      }
    }
  }
}

#if XPURT_WITH_CUDA  // calls the cuda_raw launcher itself, which a CPU build lacks
// The generation loop's greedy tokens (Note [Logits read back] in generation/step_io.cpp): cuda_raw::argmax_rows
// (the device kernels table's entry) over [rows, vocab] with no workspace, a small one (fewer splits) and a large
// one, against the rule the host Sampler keeps (the first NaN, else the first maximum).
TEST(CudaRawSplitGpu, ArgmaxRowsOfTheDeviceKernelsTableKeepTheSamplersRule) {
  XPURT_SKIP_WITHOUT_GPU();
  const auto argmax_rows = &cuda_raw::argmax_rows;
  std::mt19937 rng(45);
  std::uniform_int_distribution<int> eighth(-64, 64);
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 128256}, {3, 37}, {64, 5003}, {8, 1}};
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [rows, cols] : shapes) {
      std::vector<float> values(static_cast<std::size_t>(rows * cols));
      for (float& v : values) v = static_cast<float>(eighth(rng)) / 8.0f;  // many ties
      if (rows > 1) values[static_cast<std::size_t>(cols + cols / 2)] = std::numeric_limits<float>::quiet_NaN();
      std::vector<std::int64_t> want(static_cast<std::size_t>(rows));
      for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t best = 0;
        for (std::int64_t c = 0; c < cols; ++c) {
          const float v = values[static_cast<std::size_t>(r * cols + c)];
          if (std::isnan(v)) {
            best = c;
            break;
          }
          if (v > values[static_cast<std::size_t>(r * cols + best)]) best = c;
        }
        want[static_cast<std::size_t>(r)] = best;
      }
      const Tensor x = host_tensor(values, {rows, cols}, dtype).to(Device::cuda(0));
      for (const std::size_t workspace_bytes : {std::size_t{0}, std::size_t{4096}, std::size_t{65536}}) {
        Tensor out = Tensor::empty({rows}, DType::kInt64, Device::cuda(0));
        Tensor workspace = Tensor::empty({65536}, DType::kUInt8, Device::cuda(0));
        const StreamView stream = StreamManager::instance().current_stream(Device::cuda(0));
        argmax_rows(x.data_ptr(), dtype, rows, cols, static_cast<std::int64_t*>(out.data_ptr()),
                    workspace_bytes ? workspace.data_ptr() : nullptr, workspace_bytes, stream.handle);
        const Tensor got = out.to(Device::cpu(), &stream);
        const auto* ids = static_cast<const std::int64_t*>(got.data_ptr());
        EXPECT_EQ(std::vector<std::int64_t>(ids, ids + rows), want)
            << dtype_name(dtype) << " [" << rows << ", " << cols << "] workspace " << workspace_bytes;
      }
    }
  }
}

#endif  // XPURT_WITH_CUDA

// cum_sum: integers exactly; floats of eighths (float32/float64 sums exact in any order), 16-bit floats within a
// rounding of the stored value; forward, reverse, exclusive.
TEST(CudaRawSplitGpu, CumSumMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(45);
  std::uniform_int_distribution<int> eighth(-8, 8);
  struct Case {
    Shape shape;
    std::int64_t axis;
  };
  const std::vector<Case> cases = {{{10000019}, 0}, {{1000003}, 0},  {{3, 100003}, 1}, {{100003, 3}, 0},
                                   {{7, 257}, 1},   {{2, 4099, 5}, 1}, {{255}, 0},     {{1}, 0},
                                   {{1, 128}, 1},   {{33}, 0},         {{2, 255, 3}, 1}, {{1000, 77}, 1},
                                   {{3, 31}, 1}};
  for (const DType dtype : {DType::kInt32, DType::kInt64, DType::kFloat32, DType::kFloat64, DType::kFloat16}) {
    for (const auto& c : cases) {
      const bool sixteen = dtype == DType::kFloat16;
      if (sixteen && numel_of(c.shape) > 20000) continue;  // 16-bit sums of many terms round on every store
      std::vector<float> values(static_cast<std::size_t>(numel_of(c.shape)));
      const float unit = dtype == DType::kInt32 || dtype == DType::kInt64 ? 1.0f : 0.125f;
      for (float& v : values) v = static_cast<float>(eighth(rng)) * unit;
      const Tensor x = host_tensor(values, c.shape, dtype);
      for (const std::int64_t reverse : {0, 1}) {
        for (const std::int64_t exclusive : {0, 1}) {
          const Attributes attrs =
              Attributes().set("axis", c.axis).set("reverse", reverse).set("exclusive", exclusive);
          const std::string what = "cum_sum " + std::string(dtype_name(dtype)) + shape_str(c.shape) + " axis " +
                                   std::to_string(c.axis) + " reverse " + std::to_string(reverse) + " exclusive " +
                                   std::to_string(exclusive);
          const auto [expected, actual] = cpu_and_cuda("cum_sum", x, attrs, what);
          if (!sixteen) {
            expect_same_bytes(expected, actual, what);
            continue;
          }
          const Tensor e = run_kernel("cast", "cpu", {expected}, cast_to(DType::kFloat32));
          const Tensor a = run_kernel("cast", "cpu", {actual}, cast_to(DType::kFloat32));
          const auto* pe = static_cast<const float*>(e.data_ptr());
          const auto* pa = static_cast<const float*>(a.data_ptr());
          for (std::int64_t i = 0; i < e.numel(); ++i) {
            ASSERT_NEAR(pa[i], pe[i], 1e-3 + 4e-3 * std::fabs(pe[i])) << what << " element " << i;
          }
        }
      }
    }
  }
}

// TopK (Note [TopK by radix select] in select.cu): values and indices the same bytes as the cpu kernel's, on both
// kernels (whole-row sorts and radix selects), with ties at the k-th value (small integers, -0 beside +0), rows of
// one element, rows longer than a whole-row sort takes, prime lengths, largest and smallest; few long rows split into
// chunks (Note [TopK of few long rows]: ties across chunks, k of a whole chunk).
TEST(CudaRawSplitGpu, TopKMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(46);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  struct Case {
    Shape shape;
    std::int64_t k;
    bool ties;
  };
  const std::vector<Case> cases = {{{1, 3234}, 300, false}, {{2, 3001}, 500, true},   {{3, 10007}, 77, false},
                                   {{1, 5003}, 4096, true}, {{5, 33}, 33, true},      {{1, 1}, 1, false},
                                   {{4, 100003}, 1, false}, {{1, 1048583}, 2048, true}, {{7, 2500}, 2500, true},
                                   {{64, 32000}, 50, false}, {{2, 100000}, 4096, true},
                                   {{3, 65537}, 1, true},    {{1, 16384}, 2048, false}};
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const auto& c : cases) {
      std::vector<float> values(static_cast<std::size_t>(numel_of(c.shape)));
      for (float& v : values) v = c.ties ? static_cast<float>(small(rng)) : uniform(rng);
      for (std::size_t i = 0; c.ties && i < values.size(); i += 3) {
        if (values[i] == 0.0f) values[i] = -0.0f;
      }
      const Tensor x = host_tensor(values, c.shape, dtype);
      for (const std::int64_t largest : {1, 0}) {
        const Attributes attrs = Attributes().set("k", c.k).set("axis", std::int64_t{-1}).set("largest", largest);
        const std::string what = "top_k " + std::string(dtype_name(dtype)) + shape_str(c.shape) + " k " +
                                 std::to_string(c.k) + (largest ? " largest" : " smallest");
        for (const std::size_t output : {std::size_t{0}, std::size_t{1}}) {
          const auto [expected, actual] = cpu_and_cuda("top_k", x, attrs, what, output);
          expect_same_bytes(expected, actual, what + (output == 0 ? " values" : " indices"));
        }
      }
    }
  }
}

// Softmax and log_softmax of few long rows (Note [Split softmax] in softmax.cu) against the cpu kernel: a vocabulary
// at batch 1, two rows of a million (prime), rows with -inf entries (masked), float32 and float16.
TEST(CudaRawSplitGpu, SoftmaxOfFewLongRowsMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(47);
  std::uniform_real_distribution<float> uniform(-8.0f, 8.0f);
  std::uniform_int_distribution<int> masked(0, 9);
  for (const DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (const Shape& shape : {Shape{1, 128256}, Shape{2, 1048583}, Shape{3, 40009}}) {
      std::vector<float> values(static_cast<std::size_t>(numel_of(shape)));
      for (float& v : values) v = masked(rng) == 0 ? -std::numeric_limits<float>::infinity() : uniform(rng);
      const Tensor x = host_tensor(values, shape, dtype);
      for (const std::string op : {"softmax", "log_softmax"}) {
        const std::string what = op + " " + std::string(dtype_name(dtype)) + shape_str(shape);
        const auto [expected, actual] = cpu_and_cuda(op, x, Attributes().set("axis", std::int64_t{-1}), what);
        const Tensor e = run_kernel("cast", "cpu", {expected}, cast_to(DType::kFloat32));
        const Tensor a = run_kernel("cast", "cpu", {actual}, cast_to(DType::kFloat32));
        const auto* pe = static_cast<const float*>(e.data_ptr());
        const auto* pa = static_cast<const float*>(a.data_ptr());
        const double rtol = dtype == DType::kFloat32 ? 1e-4 : 2e-3;
        for (std::int64_t i = 0; i < e.numel(); ++i) {
          if (std::isinf(pe[i])) {
            ASSERT_EQ(pa[i], pe[i]) << what << " element " << i;
            continue;
          }
          ASSERT_NEAR(pa[i], pe[i], 1e-9 + rtol * std::fabs(pe[i])) << what << " element " << i;
        }
      }
    }
  }
}

// layer_norm of few long rows (Note [Split layer norm] in layer_norm.cu) against the cpu kernel: a whole feature map,
// GroupNorm(32)'s rows at batch 2, a prime length, with a mean far from zero, the scale and bias, the residual and the
// addend; float32, float16 and bfloat16.
TEST(CudaRawSplitGpu, LayerNormOfFewLongRowsMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(48);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const auto random = [&](const Shape& shape, DType dtype, float offset) {
    std::vector<float> values(static_cast<std::size_t>(numel_of(shape)));
    for (float& v : values) v = offset + uniform(rng);
    return host_tensor(values, shape, dtype);
  };
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const Shape& shape : {Shape{1, 200704}, Shape{64, 40960}, Shape{3, 1000003}}) {
      const Shape row = {shape[1]};
      const Tensor x = random(shape, dtype, 5.0f);
      const Tensor scale = random(row, dtype, 1.0f);
      const Tensor bias = random(row, dtype, 0.0f);
      const Tensor residual = random(shape, dtype, 0.0f);
      const Tensor addend = random(shape, dtype, 0.0f);
      const Attributes attrs = Attributes().set("axis", std::int64_t{-1}).set("epsilon", 1e-5);
      const std::vector<std::vector<Tensor>> variants = {{x, scale, bias}, {x, Tensor(), Tensor(), residual},
                                                         {x, scale, bias, residual, addend}};
      for (std::size_t v = 0; v < variants.size(); ++v) {
        const std::string what = "layer_norm " + std::string(dtype_name(dtype)) + shape_str(shape) + " variant " +
                                 std::to_string(v);
        const Tensor expected = run_kernel("layer_norm", "cpu", variants[v], attrs);
        std::vector<Tensor> device;
        for (const Tensor& t : variants[v]) device.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
        const Tensor actual = run_kernel("layer_norm", "cuda_raw", device, attrs).to(Device::cpu());
        const Tensor again = run_kernel("layer_norm", "cuda_raw", device, attrs).to(Device::cpu());
        EXPECT_EQ(std::memcmp(actual.data_ptr(), again.data_ptr(), actual.nbytes()), 0) << what << ": bits changed";
        const Tensor e = run_kernel("cast", "cpu", {expected}, cast_to(DType::kFloat32));
        const Tensor a = run_kernel("cast", "cpu", {actual}, cast_to(DType::kFloat32));
        const auto* pe = static_cast<const float*>(e.data_ptr());
        const auto* pa = static_cast<const float*>(a.data_ptr());
        const double tol = dtype == DType::kFloat32 ? 2e-4 : dtype == DType::kFloat16 ? 1e-2 : 6e-2;
        for (std::int64_t i = 0; i < e.numel(); ++i) {
          ASSERT_NEAR(pa[i], pe[i], tol * (1.0 + std::fabs(pe[i]))) << what << " element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace xpuruntime
