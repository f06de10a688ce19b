// The cuda_raw backend's own tests: every cuda_raw kernel against the cpu reference kernel on random inputs at
// odd shapes and all three float dtypes (GPU), the launchers other backends call (GPU), and the reasons
// supports() gives and the reduction plans (CPU-runnable: neither touches a device).
#include <gtest/gtest.h>

#include <algorithm>
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
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"
#if XPURT_WITH_CUDA
#include "backends/cuda_raw/cuda_raw_ops.h"
#endif

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

const std::vector<DType> kFloatTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) out += (k ? "," : "") + std::to_string(shape[k]);
  return out + "]";
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

// ---- descriptors without data (CPU-runnable) ----

TensorDesc desc_of(const Shape& shape, DType dtype, Device device = Device::cuda(0)) {
  return TensorDesc::contiguous(shape, dtype, device);
}

OpDescriptor make_desc(const std::string& op, std::vector<TensorDesc> inputs, const Attributes& attrs = {},
                       Device device = Device::cuda(0)) {
  OpDescriptor desc;
  desc.op = op;
  desc.inputs = std::move(inputs);
  desc.attrs = attrs;
  desc.device = device;
  desc.compute_capability = device.is_cuda() ? 90 : 0;
  KernelRegistry::global().infer(desc);
  return desc;
}

const Kernel& cuda_raw_kernel(const std::string& op) {
  const Kernel* kernel = KernelRegistry::global().find_kernel(op, "cuda_raw");
  if (kernel == nullptr) throw std::runtime_error("no cuda_raw kernel for op '" + op + "'");
  return *kernel;
}

// ---- running kernels ----

int device_compute_capability(Device device) {
  if (!device.is_cuda()) return 0;
  return DeviceManager::instance().get_device_info(device).compute_capability();
}

// Runs `op` with the kernel named `name` on `inputs` (one device; an undefined tensor is an absent optional
// input) and waits for it. Throws when the kernel does not support the descriptor, with its reason.
std::vector<Tensor> run_kernel(const std::string& op, const std::string& name, std::vector<Tensor> inputs,
                               const Attributes& attrs = {}) {
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
  inputs.resize(desc.inputs.size());
  const ExecutionPolicy policy;
  const Support support = kernel->supports(desc, policy);
  if (!support) throw std::runtime_error(name + " does not support " + desc.signature() + ": " + support.reason());
  const auto plan = kernel->build(desc, policy, "");
  std::vector<Tensor> outputs;
  for (const TensorDesc& out : desc.outputs) outputs.push_back(Tensor::empty(out.shape, out.dtype, device));
  const StreamView stream = device.is_cuda() ? StreamManager::instance().current_stream(device) : StreamView();
  plan->execute(desc, inputs, outputs, stream);
  stream.synchronize();
  return outputs;
}

Attributes cast_to(DType dtype) { return Attributes().set("to", std::string(dtype_name(dtype))); }

// A host float32 copy of any float tensor (through the cpu cast kernel for the other dtypes).
Tensor to_host_float32(const Tensor& t) {
  Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  if (host.dtype() == DType::kFloat32) return host;
  return run_kernel("cast", "cpu", {host}, cast_to(DType::kFloat32))[0];
}

// Random host tensor of `dtype`: uniform in [lo, hi), or multiples of 1/8 in [-1, 1] when `eighths` (whose sums
// of up to 2^20 terms are exact in fp32 in any order, so reductions compare exactly).
Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& rng, float lo = -4.0f, float hi = 4.0f,
                     bool eighths = false) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  auto* p = static_cast<float*>(t.data_ptr());
  std::uniform_real_distribution<float> uniform(lo, hi);
  std::uniform_int_distribution<int> eighth(-8, 8);
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = eighths ? static_cast<float>(eighth(rng)) / 8.0f : uniform(rng);
  if (dtype == DType::kFloat32) return t;
  return run_kernel("cast", "cpu", {t}, cast_to(dtype))[0];
}

struct Tolerance {
  double atol;
  double rtol;
};

// About two units in the last place of each dtype (results round once; the two kernels may round differently
// in the last fp32 step), with an absolute floor for values near zero.
Tolerance tolerance_for(DType dtype, double atol_fp32 = 1e-5) {
  switch (dtype) {
    case DType::kFloat16: return {1e-3, 4e-3};
    case DType::kBFloat16: return {8e-3, 1.6e-2};
    default: return {atol_fp32, 1e-4};
  }
}

// Expects `actual` and `expected` (any devices, float dtypes) to agree within `tol` everywhere; NaN matches NaN.
void expect_close(const Tensor& actual, const Tensor& expected, Tolerance tol, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  const Tensor a = to_host_float32(actual);
  const Tensor e = to_host_float32(expected);
  const auto* pa = static_cast<const float*>(a.data_ptr());
  const auto* pe = static_cast<const float*>(e.data_ptr());
  std::int64_t mismatches = 0;
  std::string first;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = pa[i];
    const double y = pe[i];
    const bool same =
        (std::isnan(x) && std::isnan(y)) || x == y || std::fabs(x - y) <= tol.atol + tol.rtol * std::fabs(y);
    if (!same && mismatches++ == 0) {
      first = "element " + std::to_string(i) + ": cuda_raw " + std::to_string(x) + ", cpu " + std::to_string(y);
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << a.numel() << " elements differ; first "
                           << first;
}

// Runs `op` on the cpu kernel (host inputs) and on the cuda_raw kernel (the same inputs moved to the GPU) and
// compares every output.
void compare_with_cpu(const std::string& op, const std::vector<Tensor>& host_inputs, const Attributes& attrs,
                      Tolerance tol, const std::string& what) {
  const std::vector<Tensor> expected = run_kernel(op, "cpu", host_inputs, attrs);
  std::vector<Tensor> device_inputs;
  for (const Tensor& t : host_inputs) device_inputs.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
  const std::vector<Tensor> actual = run_kernel(op, "cuda_raw", device_inputs, attrs);
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t k = 0; k < actual.size(); ++k) expect_close(actual[k], expected[k], tol, what);
}

std::string label(const std::string& op, const Shape& shape, DType dtype, const std::string& extra = {}) {
  return op + " " + std::string(dtype_name(dtype)) + shape_str(shape) + (extra.empty() ? "" : " " + extra);
}

// Contiguous views of `shape` starting `offset` elements into host tensor `t` and into its copy on the GPU: one
// element in leaves a 16-bit or float32 tensor off 16-byte alignment.
std::pair<Tensor, Tensor> host_and_device_views(const Tensor& t, const Shape& shape, std::int64_t offset) {
  const Tensor device = t.to(Device::cuda(0));
  const auto bytes = offset * static_cast<std::int64_t>(dtype_size(t.dtype()));
  const Tensor host_view = Tensor::from_blob(static_cast<char*>(t.data_ptr()) + bytes, shape, {}, t.dtype(),
                                             Device::cpu(), t.storage());
  const Tensor device_view = Tensor::from_blob(static_cast<char*>(device.data_ptr()) + bytes, shape, {}, t.dtype(),
                                               Device::cuda(0), device.storage());
  return {host_view, device_view};
}

// ---- GPU: every kernel against the cpu reference ----

struct UnaryCase {
  std::string op;
  float lo;
  float hi;
  Attributes attrs;
};

std::vector<UnaryCase> unary_cases() {
  return {{"exp", -8, 8, {}},          {"log", 0.05f, 4, {}},        {"sqrt", 0.0f, 4, {}},
          {"neg", -4, 4, {}},          {"abs", -4, 4, {}},           {"erf", -3, 3, {}},
          {"reciprocal", 0.25f, 4, {}}, {"relu", -4, 4, {}},          {"sigmoid", -10, 10, {}},
          {"tanh", -5, 5, {}},         {"silu", -8, 8, {}},          {"gelu", -6, 6, {}},
          {"gelu", -6, 6, Attributes().set("approximate", std::string("tanh"))}};
}

TEST(CudaRawGpu, UnaryOpsMatchTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  for (const auto& c : unary_cases()) {
    for (const DType dtype : kFloatTypes) {
      for (const Shape& shape : std::vector<Shape>{{1}, {7}, {33, 65}, {1000003}, {}}) {
        compare_with_cpu(c.op, {random_tensor(shape, dtype, rng, c.lo, c.hi)}, c.attrs, tolerance_for(dtype),
                         label(c.op, shape, dtype, c.attrs.str()));
      }
    }
  }
}

// Past kUnaryUnrollFrom vectors a thread loads several before it stores (Note [Unary loads in flight]); an odd
// length leaves a partial group of vectors and a scalar tail.
TEST(CudaRawGpu, LargeUnaryOpsMatchTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  for (const DType dtype : kFloatTypes) {
    const std::int64_t vector = 16 / static_cast<std::int64_t>(dtype_size(dtype));
    const Shape shape = {(std::int64_t{1} << 21) * vector + 5 * 256 * vector + 3};
    for (const std::string op : {"gelu", "sigmoid"}) {
      compare_with_cpu(op, {random_tensor(shape, dtype, rng, -6, 6)}, Attributes(), tolerance_for(dtype),
                       label(op, shape, dtype, "unrolled"));
    }
  }
}

TEST(CudaRawGpu, UnaryOpsOnMisalignedInputsTakeTheScalarPath) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  for (const DType dtype : kFloatTypes) {
    // A view starting one element into a device buffer: not 16-byte aligned, so no vector loads.
    const auto views = host_and_device_views(random_tensor({1025}, dtype, rng), {1024}, 1);
    const Tensor expected = run_kernel("tanh", "cpu", {views.first})[0];
    const Tensor actual = run_kernel("tanh", "cuda_raw", {views.second})[0];
    expect_close(actual, expected, tolerance_for(dtype), label("tanh (misaligned)", {1024}, dtype));
  }
}

struct BinaryCase {
  Shape a;
  Shape b;
};

TEST(CudaRawGpu, BinaryOpsBroadcastLikeTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  const std::vector<BinaryCase> shapes = {
      {{1}, {1}},          {{7}, {7}},          {{33, 65}, {33, 65}},       {{1000003}, {1000003}},
      {{3, 1, 5}, {1, 4, 1}}, {{8, 128, 64}, {64}}, {{2, 3, 4, 5}, {3, 1, 5}}, {{1}, {33, 65}},
      {{}, {4}},           {{33, 1}, {1, 65}},  {{1000003}, {1}},
      // eight dimensions that cannot merge: the most the stride tables take
      {{2, 1, 2, 1, 2, 1, 2, 1}, {1, 2, 1, 2, 1, 2, 1, 2}}};
  for (const std::string op : {"add", "sub", "mul", "div", "pow", "maximum", "minimum"}) {
    // div and pow keep away from 0 and from negative bases.
    const bool positive = op == "div" || op == "pow";
    for (const DType dtype : kFloatTypes) {
      for (const auto& c : shapes) {
        const Tensor a = random_tensor(c.a, dtype, rng, positive ? 0.5f : -4.0f, positive ? 2.0f : 4.0f);
        const Tensor b = random_tensor(c.b, dtype, rng, positive ? (op == "pow" ? -2.0f : 0.5f) : -4.0f,
                                       positive ? 2.0f : 4.0f);
        compare_with_cpu(op, {a, b}, {}, tolerance_for(dtype),
                         label(op, c.a, dtype, "with " + shape_str(c.b)));
      }
    }
  }
}

TEST(CudaRawGpu, CastRoundsLikeTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  const std::vector<DType> types = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64};
  for (const DType from : types) {
    for (const DType to : types) {
      for (const Shape& shape : std::vector<Shape>{{1}, {7}, {33, 65}, {1000003}}) {
        // Beyond float16's range (inf) and within its subnormals. float64 sources come from float32 values.
        for (const float range : {70000.0f, 1e-4f}) {
          Tensor x = random_tensor(shape, from == DType::kFloat64 ? DType::kFloat32 : from, rng, -range, range);
          if (from == DType::kFloat64) x = run_kernel("cast", "cpu", {x}, cast_to(DType::kFloat64))[0];
          compare_with_cpu("cast", {x}, cast_to(to), {0.0, 0.0},
                           label("cast", shape, from, "to " + std::string(dtype_name(to)) + " range " +
                                                          std::to_string(range)));
        }
      }
    }
  }
}

TEST(CudaRawGpu, SoftmaxMatchesTheCpuKernelAlongAnyAxis) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  struct Case {
    Shape shape;
    std::int64_t axis;
  };
  const std::vector<Case> cases = {
      {{4, 1}, -1},    {{5, 31}, -1},     {{5, 32}, -1},  {{3, 1025}, -1}, {{3, 50000}, -1}, {{1, 7}, 1},
      {{65, 33}, -1},  {{4, 33, 5}, 1},   {{4, 33, 5}, 0}, {{2, 3, 4, 5}, -3}, {{7}, 0},     {{300, 2, 3}, 0}};
  for (const DType dtype : kFloatTypes) {
    for (const auto& c : cases) {
      // Outputs can be as small as 1/50000: an absolute floor below them.
      Tolerance tol = tolerance_for(dtype);
      tol.atol = dtype == DType::kFloat32 ? 1e-7 : 1e-6;
      compare_with_cpu("softmax", {random_tensor(c.shape, dtype, rng, -8, 8)},
                       Attributes().set("axis", std::int64_t{c.axis}), tol,
                       label("softmax", c.shape, dtype, "axis " + std::to_string(c.axis)));
    }
  }
}

TEST(CudaRawGpu, LayerNormMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  struct Case {
    Shape shape;
    std::int64_t axis;
  };
  const std::vector<Case> cases = {{{5, 1}, -1},    {{4, 768}, -1},  {{3, 4099}, -1}, {{2, 3, 7, 11}, 2},
                                   {{2, 3, 7, 11}, 1}, {{1, 33}, 0}, {{6, 1024}, -1}, {{2, 1025}, -1}};
  for (const DType dtype : kFloatTypes) {
    for (const auto& c : cases) {
      const std::int64_t axis = c.axis < 0 ? c.axis + static_cast<std::int64_t>(c.shape.size()) : c.axis;
      const Shape normalized(c.shape.begin() + axis, c.shape.end());
      // Inputs with a mean far from zero test the two-pass variance.
      const Tensor x = random_tensor(c.shape, dtype, rng, 2.0f, 6.0f);
      for (int variant = 0; variant < 4; ++variant) {
        const Tensor scale = variant & 1 ? random_tensor(normalized, dtype, rng, -2, 2) : Tensor();
        const Tensor bias = variant & 2 ? random_tensor(normalized, dtype, rng, -2, 2) : Tensor();
        const Attributes attrs = Attributes().set("axis", std::int64_t{c.axis}).set("epsilon", 1e-5);
        compare_with_cpu("layer_norm", {x, scale, bias}, attrs, tolerance_for(dtype, 1e-4),
                         label("layer_norm", c.shape, dtype,
                               "axis " + std::to_string(c.axis) + (variant & 1 ? " scale" : "") +
                                   (variant & 2 ? " bias" : "")));
      }
      compare_with_cpu("layer_norm", {x, Tensor(), Tensor(), Tensor(), random_tensor(c.shape, dtype, rng, -8, 8)},
                       Attributes().set("axis", std::int64_t{c.axis}).set("epsilon", 1e-5),
                       tolerance_for(dtype, 1e-4), label("layer_norm", c.shape, dtype, "addend"));
    }
  }
}

TEST(CudaRawGpu, ReductionsMatchTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  struct Case {
    Shape shape;
    Shape axes;
  };
  const std::vector<Case> cases = {
      {{1000003}, {}},          {{1}, {}},            {{7}, {0}},            {{33, 65}, {0}},
      {{33, 65}, {1}},          {{33, 65}, {0, 1}},   {{3, 4, 5, 6}, {1, 3}}, {{3, 4, 5, 6}, {0, 2}},
      {{3, 4, 5, 6}, {-1}},     {{7, 50000}, {1}},    {{100000, 3}, {0}},    {{5, 1, 7}, {1}},
      {{2, 40000, 3}, {0, 2}},  {{2, 3, 40000}, {0, 2}}, {{}, {}},            {{1000, 1000}, {0}}};
  for (const std::string op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"}) {
    for (const DType dtype : kFloatTypes) {
      for (const auto& c : cases) {
        for (const std::int64_t keepdims : {0, 1}) {
          const Tensor x = random_tensor(c.shape, dtype, rng, 0, 0, /*eighths=*/true);
          const Attributes attrs = Attributes().set("axes", c.axes).set("keepdims", keepdims);
          // Sums of eighths are exact in fp32; only the mean's division may round differently.
          Tolerance tol = tolerance_for(dtype);
          if (dtype == DType::kFloat32) tol = {0.0, 1e-6};
          compare_with_cpu(op, {x}, attrs, tol,
                           label(op, c.shape, dtype, "axes " + shape_str(c.axes) + " keepdims " +
                                                         std::to_string(keepdims)));
        }
      }
    }
  }
  // An empty axis: the sum is 0 and the mean NaN.
  for (const std::string op : {"reduce_sum", "reduce_mean"}) {
    const Tensor x = Tensor::empty({2, 0, 3}, DType::kFloat32);
    compare_with_cpu(op, {x}, Attributes().set("axes", Shape{1}), {0.0, 0.0}, op + " of an empty axis");
  }
}

TEST(CudaRawGpu, KernelsGiveTheSameBitsEveryRun) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  struct Case {
    std::string op;
    Shape shape;
    Attributes attrs;
  };
  const std::vector<Case> cases = {{"reduce_sum", {1000003}, {}},
                                   {"reduce_sum", {100000, 3}, Attributes().set("axes", Shape{0})},
                                   {"reduce_mean", {7, 50000}, Attributes().set("axes", Shape{1})},
                                   {"softmax", {3, 50000}, {}},
                                   {"layer_norm", {3, 4099}, {}}};
  for (const auto& c : cases) {
    const Tensor x = random_tensor(c.shape, DType::kFloat32, rng).to(Device::cuda(0));
    const Tensor first = run_kernel(c.op, "cuda_raw", {x}, c.attrs)[0].to(Device::cpu());
    for (int run = 0; run < 3; ++run) {
      const Tensor again = run_kernel(c.op, "cuda_raw", {x}, c.attrs)[0].to(Device::cpu());
      ASSERT_EQ(std::memcmp(first.data_ptr(), again.data_ptr(), first.nbytes()), 0) << c.op << shape_str(c.shape);
    }
  }
}

#if XPURT_WITH_CUDA

// ---- GPU: the launchers of cuda_raw_ops.h ----

void* stream_handle() { return StreamManager::instance().current_stream(Device::cuda(0)).handle; }
void synchronize() { StreamManager::instance().current_stream(Device::cuda(0)).synchronize(); }

TEST(CudaRawGpu, BiasActivationMatchesAddThenActivation) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  for (const DType dtype : kFloatTypes) {
    for (const std::int64_t cols : {1, 7, 64, 1000}) {
      for (const std::string activation : {"none", "relu", "gelu", "gelu_tanh", "silu", "relu6", "hard_swish"}) {
        for (const bool with_bias : {false, true}) {
          const std::int64_t rows = 5;
          const Tensor y_host = random_tensor({rows, cols}, dtype, rng);
          const Tensor bias_host = random_tensor({cols}, dtype, rng);
          Tensor expected = with_bias ? run_kernel("add", "cpu", {y_host, bias_host})[0] : y_host;
          if (activation == "relu") expected = run_kernel("relu", "cpu", {expected})[0];
          if (activation == "gelu") expected = run_kernel("gelu", "cpu", {expected})[0];
          if (activation == "gelu_tanh") {
            expected = run_kernel("gelu", "cpu", {expected}, Attributes().set("approximate", std::string("tanh")))[0];
          }
          // conv2d's activations, which cuDNN's convolutions apply through this kernel (Note [cuDNN conv activations
          // after the epilogue])
          if (activation == "silu") expected = run_kernel("silu", "cpu", {expected})[0];
          if (activation == "hard_swish") expected = run_kernel("hard_swish", "cpu", {expected})[0];
          if (activation == "relu6") {
            expected = run_kernel("clip", "cpu", {expected}, Attributes().set("min", 0.0).set("max", 6.0))[0];
          }
          Tensor y = y_host.to(Device::cuda(0));
          const Tensor bias = bias_host.to(Device::cuda(0));
          cuda_raw::bias_activation(y.data_ptr(), with_bias ? bias.data_ptr() : nullptr, dtype, rows, cols,
                                    activation, stream_handle());
          synchronize();
          // The cpu composition rounds between add and activation; the fused kernel does not.
          Tolerance tol = tolerance_for(dtype);
          tol.rtol *= 2;
          tol.atol *= 2;
          expect_close(y, expected, tol, label("bias_activation " + activation, {rows, cols}, dtype,
                                               with_bias ? "bias" : "no bias"));
        }
      }
    }
  }
  float unused = 0;
  XPURT_EXPECT_THROW_WITH(cuda_raw::bias_activation(&unused, nullptr, DType::kFloat32, 1, 1, "swish", nullptr),
                          InvalidArgumentError, "gelu_tanh");
}

TEST(CudaRawGpu, SoftmaxLastdimWorksInPlace) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  for (const DType dtype : kFloatTypes) {
    for (const std::int64_t cols : {1, 33, 2000}) {
      const Tensor x_host = random_tensor({3, cols}, dtype, rng, -8, 8);
      const Tensor expected = run_kernel("softmax", "cpu", {x_host})[0];
      Tensor x = x_host.to(Device::cuda(0));
      cuda_raw::softmax_lastdim(x.data_ptr(), x.data_ptr(), dtype, 3, cols, stream_handle());
      synchronize();
      Tolerance tol = tolerance_for(dtype);
      tol.atol = 1e-6;
      expect_close(x, expected, tol, label("softmax_lastdim in place", {3, cols}, dtype));
    }
  }
}

// The attention softmax against a float64 host computation from the same (dtype-rounded) values. Fully masked rows
// are NaN, or 0 with zero_fully_masked_rows (Note [Fully masked attention rows]), in the register-cached kernel and
// in the online one (Sk = 5000).
TEST(CudaRawGpu, AttentionSoftmaxScalesMasksAndIsCausal) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  struct Case {
    std::int64_t batch, heads, sq, sk;
    bool causal;
    int mask;  // 0: none, 1: [B, 1, 1, Sk], 2: [B, H, Sq, Sk], 3: [1, 1, Sq, Sk] with some rows fully -inf
    FullyMaskedRows rows = FullyMaskedRows::kNan;
  };
  constexpr FullyMaskedRows kZero = FullyMaskedRows::kZero, kUniform = FullyMaskedRows::kUniform;
  const std::vector<Case> cases = {{2, 3, 5, 7, false, 0},         {2, 3, 5, 7, true, 0},
                                   {2, 3, 7, 5, true, 1},          {1, 2, 4, 4, false, 2},
                                   {2, 1, 3, 1030, true, 2},       {1, 1, 1, 1, true, 0},
                                   {2, 2, 6, 9, false, 3},         {1, 2, 3, 2000, false, 1},
                                   {2, 2, 6, 9, false, 3, kZero},  {2, 2, 6, 9, true, 3, kZero},
                                   {1, 2, 6, 5000, false, 3},      {1, 2, 6, 5000, false, 3, kZero},
                                   {2, 3, 5, 7, true, 1, kZero},   {2, 2, 6, 9, false, 3, kUniform},
                                   {2, 2, 6, 9, true, 3, kUniform}, {1, 2, 6, 5000, false, 3, kUniform}};
  for (const DType dtype : kFloatTypes) {
    for (const auto& c : cases) {
      const float scale = 0.37f;
      const Shape scores_shape = {c.batch * c.heads, c.sq, c.sk};
      const Tensor scores_host = random_tensor(scores_shape, dtype, rng, -8, 8);
      Shape mask_shape;
      std::vector<std::int64_t> mask_strides = {0, 0, 0, 0};
      if (c.mask == 1) {
        mask_shape = {c.batch, 1, 1, c.sk};
        mask_strides = {c.sk, 0, 0, 1};
      } else if (c.mask == 2) {
        mask_shape = {c.batch, c.heads, c.sq, c.sk};
        mask_strides = {c.heads * c.sq * c.sk, c.sq * c.sk, c.sk, 1};
      } else if (c.mask == 3) {
        mask_shape = {1, 1, c.sq, c.sk};
        mask_strides = {0, 0, c.sk, 1};
      }
      Tensor mask_host;
      if (c.mask != 0) {
        Tensor mask32 = random_tensor(mask_shape, DType::kFloat32, rng, -2, 2);
        if (c.mask == 3) {  // rows 1 and 4 fully masked, and a few single -inf entries
          auto* m = static_cast<float*>(mask32.data_ptr());
          for (std::int64_t j = 0; j < c.sk; ++j) m[1 * c.sk + j] = m[4 * c.sk + j] = -INFINITY;
          m[2 * c.sk + 3] = -INFINITY;
        }
        mask_host = dtype == DType::kFloat32 ? mask32 : run_kernel("cast", "cpu", {mask32}, cast_to(dtype))[0];
      }
      // The reference, in float64.
      const Tensor s32 = to_host_float32(scores_host);
      const Tensor m32 = mask_host.defined() ? to_host_float32(mask_host) : Tensor();
      const auto* s = static_cast<const float*>(s32.data_ptr());
      const auto* m = m32.defined() ? static_cast<const float*>(m32.data_ptr()) : nullptr;
      Tensor expected32 = Tensor::empty(scores_shape, DType::kFloat32);
      auto* e = static_cast<float*>(expected32.data_ptr());
      for (std::int64_t b = 0; b < c.batch; ++b) {
        for (std::int64_t h = 0; h < c.heads; ++h) {
          for (std::int64_t i = 0; i < c.sq; ++i) {
            const std::int64_t row = ((b * c.heads + h) * c.sq + i) * c.sk;
            std::vector<double> v(static_cast<std::size_t>(c.sk));
            double max = -INFINITY;
            for (std::int64_t j = 0; j < c.sk; ++j) {
              double value = static_cast<double>(s[row + j]) * scale;
              if (m != nullptr) {
                value += m[b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2] + j * mask_strides[3]];
              }
              // fully_masked_rows="uniform": a masked score counts as kUniformMaskedScore, a causal one stays out.
              if (c.rows == FullyMaskedRows::kUniform && value == -INFINITY) value = kUniformMaskedScore;
              if (c.causal && j > i) value = -INFINITY;
              v[static_cast<std::size_t>(j)] = value;
              max = std::max(max, value);
            }
            double sum = 0;
            for (const double value : v) sum += max == -INFINITY ? 0.0 : std::exp(value - max);
            const float masked = c.rows == FullyMaskedRows::kZero ? 0.0f : std::numeric_limits<float>::quiet_NaN();
            for (std::int64_t j = 0; j < c.sk; ++j) {
              e[row + j] = max == -INFINITY ? masked
                                            : static_cast<float>(std::exp(v[static_cast<std::size_t>(j)] - max) / sum);
            }
          }
        }
      }
      const Tensor expected =
          dtype == DType::kFloat32 ? expected32 : run_kernel("cast", "cpu", {expected32}, cast_to(dtype))[0];
      Tensor scores = scores_host.to(Device::cuda(0));
      const Tensor mask = mask_host.defined() ? mask_host.to(Device::cuda(0)) : Tensor();
      cuda_raw::attention_softmax(scores.data_ptr(), dtype, c.batch * c.heads, c.heads, c.sq, c.sk, scale, c.causal,
                                  c.rows, mask.defined() ? mask.data_ptr() : nullptr, mask_strides,
                                  stream_handle());
      synchronize();
      Tolerance tol = tolerance_for(dtype);
      tol.atol = 1e-6;
      expect_close(scores, expected, tol,
                   label("attention_softmax", scores_shape, dtype,
                         std::string(c.causal ? "causal" : "full") + " mask " + std::to_string(c.mask) +
                             (c.rows == FullyMaskedRows::kZero      ? " zero rows"
                              : c.rows == FullyMaskedRows::kUniform ? " uniform rows"
                                                                    : "")));
    }
  }
  XPURT_EXPECT_THROW_WITH(cuda_raw::attention_softmax(nullptr, DType::kFloat32, 5, 2, 1, 1, 1.0f, false,
                                                      FullyMaskedRows::kNan, nullptr, {}, nullptr),
                          InvalidArgumentError, "divide");
}

// Copies an iota of int32 through strided_copy and checks every element on the host.
void check_strided_copy(const Shape& shape, const Shape& src_strides, std::int64_t src_offset,
                        const Shape& dst_strides, std::int64_t dst_offset, std::int64_t buffer_elements) {
  Tensor src_host = Tensor::empty({buffer_elements}, DType::kInt32);
  auto* sp = static_cast<std::int32_t*>(src_host.data_ptr());
  for (std::int64_t i = 0; i < buffer_elements; ++i) sp[i] = static_cast<std::int32_t>(i);
  const Tensor src = src_host.to(Device::cuda(0));
  Tensor dst = Tensor::zeros({buffer_elements}, DType::kInt32, Device::cuda(0));
  cuda_raw::strided_copy(static_cast<std::int32_t*>(src.data_ptr()) + src_offset,
                         static_cast<std::int32_t*>(dst.data_ptr()) + dst_offset, DType::kInt32, shape, src_strides,
                         dst_strides, stream_handle());
  synchronize();
  const Tensor dst_host = dst.to(Device::cpu());
  const auto* dp = static_cast<const std::int32_t*>(dst_host.data_ptr());
  std::vector<std::int64_t> index(shape.size(), 0);
  std::int64_t errors = 0;
  for (std::int64_t n = 0; n < numel_of(shape); ++n) {
    std::int64_t s_off = src_offset;
    std::int64_t d_off = dst_offset;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      s_off += index[d] * src_strides[d];
      d_off += index[d] * dst_strides[d];
    }
    if (dp[d_off] != sp[s_off]) ++errors;
    for (std::size_t d = shape.size(); d > 0; --d) {
      if (++index[d - 1] < shape[d - 1]) break;
      index[d - 1] = 0;
    }
  }
  EXPECT_EQ(errors, 0) << "strided_copy of " << shape_str(shape) << " from strides " << shape_str(src_strides)
                       << " to " << shape_str(dst_strides);
}

TEST(CudaRawGpu, StridedCopyHandlesPermutationsNegativeStridesAndHighRanks) {
  XPURT_SKIP_WITHOUT_GPU();
  // A transpose, and a contiguous-to-contiguous copy (one memcpy).
  check_strided_copy({33, 65}, {1, 33}, 0, {65, 1}, 0, 33 * 65);
  check_strided_copy({33, 65}, {65, 1}, 0, {65, 1}, 0, 33 * 65);
  // Rows reversed (negative stride), into a view with gaps.
  check_strided_copy({4, 6}, {-6, 1}, 18, {12, 2}, 0, 48);
  // A broadcast source (stride 0).
  check_strided_copy({5, 7}, {0, 1}, 0, {7, 1}, 0, 35);
  // Ten dimensions of 2 that cannot merge: more than kMaxDims, one launch per leading index.
  Shape shape(10, 2);
  Shape src_strides(10);
  Shape dst_strides(10);
  for (std::size_t d = 0; d < 10; ++d) {
    src_strides[d] = std::int64_t{1} << (9 - d);
    dst_strides[d] = std::int64_t{1} << d;
  }
  check_strided_copy(shape, src_strides, 0, dst_strides, 0, 1024);
  // Nothing to copy.
  cuda_raw::strided_copy(nullptr, nullptr, DType::kFloat32, {3, 0}, {1, 1}, {1, 1}, stream_handle());
}

// The vectorized broadcast path (Note [Vectorized broadcast] in elementwise.cu) and its fallbacks: innermost sizes
// that are and are not multiples of the 16-byte vector (8 halves, 4 floats), operands broadcast along the inner
// dimension, along outer ones, or both, and operands one element off 16-byte alignment.
TEST(CudaRawGpu, BinaryOpsVectorizedBroadcastMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  const std::vector<BinaryCase> shapes = {
      {{37, 64}, {64}},              // bias over rows: both operands vectors
      {{37, 64}, {37, 1}},           // b broadcast along the inner dimension
      {{2, 3, 8, 8}, {2, 3, 1, 1}},  // per-channel gate, merged to [6, 64]
      {{33, 1}, {1, 64}},            // both operands broadcast, each along one dimension
      {{1}, {4096}},                 // a scalar
      {{5, 12}, {12}},               // a multiple of 4 (vectors for float32) but not of 8 (scalar for 16-bit)
      {{5, 4}, {4}},
      {{7, 3, 40}, {3, 1}},
      {{3, 4, 16}, {3, 1, 16}},      // broadcast along an outer dimension
      {{9, 1, 24}, {1, 5, 24}},
      {{2, 2, 2, 2, 2, 2, 2, 8}, {2, 1, 2, 1, 2, 1, 2, 8}},
      {{17, 65}, {65}},              // odd inner sizes: the general kernel
      {{9, 1, 33}, {1, 5, 33}},
      {{3, 50001}, {3, 1}},
      {{300, 4096}, {4096}},         // several blocks of vectors, a partial last tile
      {{1031, 1032}, {1031, 1}}};
  for (const std::string op : {"add", "sub", "mul", "div", "pow", "maximum", "minimum"}) {
    const bool positive = op == "div" || op == "pow";
    for (const DType dtype : kFloatTypes) {
      for (const auto& c : shapes) {
        for (const bool swap : {false, true}) {
          const Shape& shape_a = swap ? c.b : c.a;
          const Shape& shape_b = swap ? c.a : c.b;
          const Tensor a = random_tensor(shape_a, dtype, rng, positive ? 0.5f : -4.0f, positive ? 2.0f : 4.0f);
          const Tensor b = random_tensor(shape_b, dtype, rng, positive ? (op == "pow" ? -2.0f : 0.5f) : -4.0f,
                                         positive ? 2.0f : 4.0f);
          compare_with_cpu(op, {a, b}, {}, tolerance_for(dtype),
                           label(op, shape_a, dtype, "with " + shape_str(shape_b)));
        }
      }
    }
  }
  // Operands one element off alignment take the general kernel (or load only the aligned operand as vectors);
  // eight elements off keeps 16-byte alignment.
  const std::vector<BinaryCase> misaligned = {{{37, 64}, {64}}, {{37, 64}, {37, 1}}, {{33, 1}, {1, 64}}};
  for (const DType dtype : kFloatTypes) {
    for (const auto& c : misaligned) {
      for (const std::int64_t offset_a : {0, 1, 8}) {
        for (const std::int64_t offset_b : {0, 1}) {
          const Tensor a = random_tensor({numel_of(c.a) + offset_a}, dtype, rng);
          const Tensor b = random_tensor({numel_of(c.b) + offset_b}, dtype, rng);
          const auto [a_host, a_device] = host_and_device_views(a, c.a, offset_a);
          const auto [b_host, b_device] = host_and_device_views(b, c.b, offset_b);
          const Tensor expected = run_kernel("mul", "cpu", {a_host, b_host})[0];
          const Tensor actual = run_kernel("mul", "cuda_raw", {a_device, b_device})[0];
          expect_close(actual, expected, tolerance_for(dtype),
                       label("mul", c.a, dtype,
                             "with " + shape_str(c.b) + " offsets " + std::to_string(offset_a) + ", " +
                                 std::to_string(offset_b)));
        }
      }
    }
  }
}

#endif  // XPURT_WITH_CUDA

// ---- CPU-runnable: the kernels, their supports() reasons and the reduction plans ----

const std::vector<std::string> kCudaRawOps = {
    "softmax", "layer_norm", "gelu", "relu",  "sigmoid",    "tanh",       "silu",       "exp",       "log",
    "sqrt",    "neg",        "abs",  "erf",   "reciprocal", "add",        "sub",        "mul",       "div",
    "pow",     "maximum",    "minimum", "cast", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min"};

TEST(CudaRawKernels, EveryOpOfTheContractHasADeterministicCudaKernel) {
  for (const auto& op : kCudaRawOps) {
    const Kernel* kernel = KernelRegistry::global().find_kernel(op, "cuda_raw");
    ASSERT_NE(kernel, nullptr) << op;
    EXPECT_EQ(kernel->info().backend, "cuda_raw") << op;
    EXPECT_EQ(kernel->info().device_type, DeviceType::kCUDA) << op;
    EXPECT_TRUE(kernel->info().deterministic) << op;
    EXPECT_FALSE(kernel->info().summary.empty()) << op;
  }
}

#if XPURT_WITH_CUDA

TEST(CudaRawKernels, SupportsCudaFloatDescriptors) {
  const ExecutionPolicy policy;
  for (const DType dtype : kFloatTypes) {
    EXPECT_TRUE(cuda_raw_kernel("exp").supports(make_desc("exp", {desc_of({7}, dtype)}), policy));
    EXPECT_TRUE(cuda_raw_kernel("add").supports(
        make_desc("add", {desc_of({3, 1, 5}, dtype), desc_of({1, 4, 1}, dtype)}), policy));
    EXPECT_TRUE(cuda_raw_kernel("softmax").supports(make_desc("softmax", {desc_of({3, 5}, dtype)}), policy));
    EXPECT_TRUE(cuda_raw_kernel("reduce_max").supports(make_desc("reduce_max", {desc_of({3, 5}, dtype)}), policy));
  }
  const OpDescriptor ln = make_desc("layer_norm", {desc_of({4, 768}, DType::kFloat16), desc_of({768}, DType::kFloat16),
                                                   TensorDesc()});
  EXPECT_TRUE(cuda_raw_kernel("layer_norm").supports(ln, policy));
  // cast also converts from and to float64.
  EXPECT_TRUE(cuda_raw_kernel("cast").supports(
      make_desc("cast", {desc_of({7}, DType::kFloat64)}, cast_to(DType::kBFloat16)), policy));
  EXPECT_TRUE(cuda_raw_kernel("cast").supports(
      make_desc("cast", {desc_of({7}, DType::kFloat16)}, cast_to(DType::kFloat64)), policy));
  // TF32, fp16 and bf16 precision policies are fine: these kernels compute in exact fp32.
  ExecutionPolicy tf32;
  tf32.precision = Precision::kTF32;
  EXPECT_TRUE(cuda_raw_kernel("exp").supports(make_desc("exp", {desc_of({7}, DType::kFloat32)}), tf32));
}

TEST(CudaRawKernels, SaysWhyItCannotRunADescriptor) {
  const ExecutionPolicy policy;
  auto reason = [&](const std::string& op, const OpDescriptor& desc, const ExecutionPolicy& p) {
    const Support support = cuda_raw_kernel(op).supports(desc, p);
    EXPECT_FALSE(support) << op << " " << desc.signature();
    return support.reason();
  };
  // A CPU descriptor.
  EXPECT_NE(reason("exp", make_desc("exp", {desc_of({7}, DType::kFloat32, Device::cpu())}, {}, Device::cpu()), policy)
                .find("runs on CUDA devices; the input is on cpu"),
            std::string::npos);
  // An integer dtype (the op schema would reject it too; the kernel still answers).
  OpDescriptor int_desc;
  int_desc.op = "relu";
  int_desc.inputs = {desc_of({7}, DType::kInt32)};
  int_desc.outputs = {desc_of({7}, DType::kInt32)};
  int_desc.device = Device::cuda(0);
  EXPECT_NE(reason("relu", int_desc, policy).find("float32, float16 and bfloat16, got int32"), std::string::npos);
  // float64 outside cast.
  EXPECT_NE(reason("softmax", make_desc("softmax", {desc_of({3, 5}, DType::kFloat64)}), policy).find("got float64"),
            std::string::npos);
  // A non-contiguous input.
  TensorDesc transposed = desc_of({5, 3}, DType::kFloat32);
  transposed.strides = {1, 5};
  EXPECT_NE(reason("tanh", make_desc("tanh", {transposed}), policy).find("needs contiguous input 'x'"),
            std::string::npos);
  // int8 precision.
  ExecutionPolicy int8;
  int8.precision = Precision::kInt8;
  EXPECT_NE(reason("exp", make_desc("exp", {desc_of({7}, DType::kFloat32)}), int8).find("int8"), std::string::npos);
  // A device older than the architectures the kernels were built for.
  OpDescriptor old = make_desc("exp", {desc_of({7}, DType::kFloat32)});
  old.compute_capability = 50;
  EXPECT_NE(reason("exp", old, policy).find("CMAKE_CUDA_ARCHITECTURES=50"), std::string::npos);
  // Nine dimensions that cannot merge: more than the stride tables hold.
  const Shape a = {2, 1, 2, 1, 2, 1, 2, 1, 2};
  const Shape b = {1, 2, 1, 2, 1, 2, 1, 2, 1};
  EXPECT_NE(reason("mul", make_desc("mul", {desc_of(a, DType::kFloat32), desc_of(b, DType::kFloat32)}), policy)
                .find("at most 8 dimensions"),
            std::string::npos);
  // A reduction over every other axis of a rank-18 tensor: 9 kept and 9 reduced dimensions.
  const Shape tall(18, 2);
  Shape every_other;
  for (std::int64_t d = 0; d < 18; d += 2) every_other.push_back(d);
  EXPECT_NE(reason("reduce_sum", make_desc("reduce_sum", {desc_of(tall, DType::kFloat32)},
                                           Attributes().set("axes", every_other)),
                   policy)
                .find("at most 8 kept and 8 reduced"),
            std::string::npos);
}

// Plans are built from the descriptor alone (no device work), so their geometry is checkable anywhere.
TEST(CudaRawKernels, ReductionPlansSplitWhenOutputsAreFew) {
  const ExecutionPolicy policy;
  auto plan_of = [&](const std::string& op, const Shape& shape, const Shape& axes) {
    const OpDescriptor desc = make_desc(op, {desc_of(shape, DType::kFloat16)}, Attributes().set("axes", axes));
    EXPECT_TRUE(cuda_raw_kernel(op).supports(desc, policy));
    return cuda_raw_kernel(op).build(desc, policy, "");
  };
  const auto full = plan_of("reduce_sum", {1000003}, {});
  EXPECT_NE(full->describe().find("1 outputs x 1000003 elements, row kernel, 123 splits"), std::string::npos)
      << full->describe();
  EXPECT_EQ(full->workspace_bytes(), 123 * sizeof(float));
  const auto rows = plan_of("reduce_mean", {7, 50000}, {1});
  EXPECT_NE(rows->describe().find("7 outputs x 50000 elements, row kernel, 7 splits"), std::string::npos)
      << rows->describe();
  const auto columns = plan_of("reduce_max", {100000, 3}, {0});
  EXPECT_NE(columns->describe().find("3 outputs x 100000 elements, column kernel, 391 splits"), std::string::npos)
      << columns->describe();
  EXPECT_EQ(columns->workspace_bytes(), 3 * 391 * sizeof(float));
  const auto small = plan_of("reduce_min", {33, 65}, {0});
  EXPECT_NE(small->describe().find("65 outputs x 33 elements, column kernel, 1 split"), std::string::npos)
      << small->describe();
  EXPECT_EQ(small->workspace_bytes(), 0u);
  // Size-1 dimensions vanish and neighbours merge: [2, 1, 40000, 3] over axes (1, 2) reduces 40000 elements of
  // stride 3 for each of 6 outputs.
  const auto merged = plan_of("reduce_sum", {2, 1, 40000, 3}, {1, 2});
  EXPECT_NE(merged->describe().find("6 outputs x 40000 elements, column kernel"), std::string::npos)
      << merged->describe();
  // The policy's workspace limit caps the partials: 64 bytes hold 16, 3 bytes none (one pass).
  for (const auto& [limit, splits] : std::vector<std::pair<std::uint64_t, std::size_t>>{{64, 16}, {3, 1}}) {
    ExecutionPolicy limited;
    limited.workspace_limit = limit;
    const OpDescriptor desc = make_desc("reduce_sum", {desc_of({1000003}, DType::kFloat32)});
    ASSERT_TRUE(cuda_raw_kernel("reduce_sum").supports(desc, limited));
    const auto plan = cuda_raw_kernel("reduce_sum").build(desc, limited, "");
    EXPECT_EQ(plan->workspace_bytes(), splits == 1 ? 0 : splits * sizeof(float)) << plan->describe();
    EXPECT_NE(plan->describe().find(std::to_string(splits) + (splits == 1 ? " split" : " splits")), std::string::npos)
        << plan->describe();
  }
}

#else  // !XPURT_WITH_CUDA

TEST(CudaRawKernels, ABuildWithoutCudaSaysSo) {
  const Kernel* kernel = KernelRegistry::global().find_kernel("exp", "cuda_raw");
  ASSERT_NE(kernel, nullptr);
  OpDescriptor desc = make_desc("exp", {desc_of({7}, DType::kFloat32)});
  const Support support = kernel->supports(desc, ExecutionPolicy());
  EXPECT_FALSE(support);
  EXPECT_NE(support.reason().find("without CUDA"), std::string::npos) << support.reason();
}

#endif  // XPURT_WITH_CUDA

// The contiguous-row kernel's groups (parts of a warp, a warp, a block) and the middle kernel at their edges (Note
// [Contiguous row reductions] and Note [Middle-axis reductions] in reduce.cu) against the cpu kernel: rows from 1 to
// 40001 elements, many and few of them, split ones; middle reductions of 1 to 256 rows over inner sizes 1 to 4096;
// NaNs for max and min; inputs off 16-byte alignment; and the same bits on a second run.
TEST(CudaRawGpu, RowAndMiddleReductionsMatchTheCpuKernelAtTheirEdges) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  struct Case {
    Shape shape;
    Shape axes;
    std::int64_t offset;  // elements the input starts into its buffer (1 and 3: off 16-byte alignment)
  };
  std::vector<Case> cases;
  for (const std::int64_t length : {1, 7, 32, 33, 1000, 4096, 4097}) {
    for (const std::int64_t rows : {1, 3, 2000}) cases.push_back({{rows, length}, {1}, 0});
    cases.push_back({{37, length}, {1}, 1});
  }
  for (const std::int64_t inner : {1, 3, 8, 64, 4096}) {
    for (const std::int64_t reduced : {1, 5, 256}) cases.push_back({{2, reduced, inner}, {1}, 0});
  }
  const std::vector<Case> more = {
      {{20000, 64}, {1}, 0},       // parts of warps, many tasks
      {{1000, 100}, {1}, 0},       // groups of 4 to 16 threads
      {{1000, 200}, {1}, 0},
      {{1000, 400}, {1}, 0},
      {{1, 400}, {1}, 1},
      {{4096, 1000}, {1}, 0},      // a warp per row filling the GPU
      {{5, 4097}, {1}, 3},         // odd rows at odd alignments
      {{3, 40001}, {1}, 0},        // split rows: chunks start off alignment
      {{3, 40001}, {1}, 1},
      {{2, 256, 64}, {1}, 1},      // a misaligned middle reduction (the column kernel)
      {{4, 64, 12, 12}, {1}, 0},   // NCHW channels: the middle kernel
      {{4, 64, 12, 12}, {2, 3}, 0},
      {{70000, 2, 8}, {1}, 0}};    // more outer blocks than a grid's z dimension holds
  cases.insert(cases.end(), more.begin(), more.end());
  for (const std::string op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"}) {
    const bool extremum = op == "reduce_max" || op == "reduce_min";
    for (const DType dtype : kFloatTypes) {
      for (const auto& c : cases) {
        for (const bool with_nan : {false, true}) {
          if (with_nan && !extremum) continue;
          // Multiples of 1/8 (exact sums), a few NaNs for max and min, `offset` elements into the buffer.
          const Tensor values = random_tensor({numel_of(c.shape) + c.offset}, DType::kFloat32, rng, 0, 0, true);
          if (with_nan) {
            auto* p = static_cast<float*>(values.data_ptr());
            for (std::int64_t i = c.offset; i < values.numel(); i += 997) {
              p[i] = std::numeric_limits<float>::quiet_NaN();
            }
          }
          const Tensor buffer =
              dtype == DType::kFloat32 ? values : run_kernel("cast", "cpu", {values}, cast_to(dtype))[0];
          const auto views = host_and_device_views(buffer, c.shape, c.offset);
          const Attributes attrs = Attributes().set("axes", c.axes).set("keepdims", std::int64_t{0});
          const std::string what = label(op, c.shape, dtype,
                                         "axes " + shape_str(c.axes) + " offset " + std::to_string(c.offset) +
                                             (with_nan ? " with NaNs" : ""));
          const Tensor expected = run_kernel(op, "cpu", {views.first}, attrs)[0];
          const Tensor actual = run_kernel(op, "cuda_raw", {views.second}, attrs)[0].to(Device::cpu());
          // Sums of eighths are exact in fp32; only the mean's division may round differently.
          const Tolerance tol = dtype == DType::kFloat32 ? Tolerance{0.0, 1e-6} : tolerance_for(dtype);
          expect_close(actual, expected, tol, what);
          const Tensor again = run_kernel(op, "cuda_raw", {views.second}, attrs)[0].to(Device::cpu());
          ASSERT_EQ(std::memcmp(actual.data_ptr(), again.data_ptr(), actual.nbytes()), 0) << what;
        }
      }
    }
  }
  // A warp per row of 4096 (the bandwidth-bound case the kernel was written for) and a middle reduction of NCHW
  // channels at full width, sums only (the others take the same paths above).
  const std::vector<std::pair<Shape, Shape>> wide = {{{4096, 4096}, {1}}, {{4, 256, 4096}, {1}}};
  for (const DType dtype : kFloatTypes) {
    for (const auto& [shape, axes] : wide) {
      const Tensor x = random_tensor(shape, dtype, rng, 0, 0, /*eighths=*/true);
      const Tolerance tol = dtype == DType::kFloat32 ? Tolerance{0.0, 1e-6} : tolerance_for(dtype);
      compare_with_cpu("reduce_sum", {x}, Attributes().set("axes", axes), tol,
                       label("reduce_sum", shape, dtype, "axes " + shape_str(axes)));
    }
  }
}

// A [rows, cols] view one element past the start of a random buffer in [lo, hi), on the host and (the same
// values) on the GPU: kernels cannot take it with 16-byte loads.
std::pair<Tensor, Tensor> misaligned_rows(std::int64_t rows, std::int64_t cols, DType dtype, std::mt19937& rng,
                                          float lo, float hi) {
  return host_and_device_views(random_tensor({rows * cols + 1}, dtype, rng, lo, hi), {rows, cols}, 1);
}

// The last-axis softmax and log_softmax at the row lengths around each path of softmax.cu (Note [Register-cached
// softmax]): a thread to 512 threads per row holding 16-byte vectors or elements, and the online kernel past the
// cached limit (16384 halves or 8192 floats of vectors: 16392; 8192 elements: 8193). Many rows (blocks of four
// warps, the grid-stride loop) and few (one-warp blocks, larger groups), -inf entries and a fully -inf row (NaN),
// and an input one element off 16-byte alignment (element loads).
TEST(CudaRawGpu, SoftmaxRowsMatchTheCpuKernelOnEveryPath) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  const std::vector<std::int64_t> lengths = {1,    7,    8,    31,   32,   33,   128,  1000,
                                             1024, 2048, 4096, 4097, 8192, 8193, 16384, 16392};
  for (const DType dtype : kFloatTypes) {
    Tolerance tol = tolerance_for(dtype);
    tol.atol = dtype == DType::kFloat32 ? 1e-7 : 1e-6;
    const Tolerance log_tol = tolerance_for(dtype, 1e-5);
    for (const std::int64_t cols : lengths) {
      // Many rows: more than 1024 warps' worth for every sub-warp group.
      const std::int64_t many = std::clamp<std::int64_t>((std::int64_t{1} << 21) / cols, 300, 40000);
      const Shape many_shape = {many, cols};
      compare_with_cpu("softmax", {random_tensor(many_shape, dtype, rng, -8, 8)}, {}, tol,
                       label("softmax", many_shape, dtype));
      // Few rows, with -inf entries: every fifth of row 0, all of row 1 (NaN, as on the cpu).
      const Shape few_shape = {3, cols};
      Tensor x32 = random_tensor(few_shape, DType::kFloat32, rng, -8, 8);
      auto* p = static_cast<float*>(x32.data_ptr());
      for (std::int64_t j = 0; j < cols; j += 5) p[j] = -INFINITY;
      for (std::int64_t j = 0; j < cols; ++j) p[cols + j] = -INFINITY;
      const Tensor few = dtype == DType::kFloat32 ? x32 : run_kernel("cast", "cpu", {x32}, cast_to(dtype))[0];
      compare_with_cpu("softmax", {few}, {}, tol, label("softmax", few_shape, dtype, "with -inf"));
      compare_with_cpu("log_softmax", {few}, {}, log_tol, label("log_softmax", few_shape, dtype, "with -inf"));
      // One element off 16-byte alignment: element loads (the output is aligned).
      const auto [host_view, device_view] = misaligned_rows(5, cols, dtype, rng, -8, 8);
      for (const std::string op : {"softmax", "log_softmax"}) {
        const Tensor expected = run_kernel(op, "cpu", {host_view})[0];
        const Tensor actual = run_kernel(op, "cuda_raw", {device_view})[0];
        expect_close(actual, expected, op == "softmax" ? tol : log_tol, label(op, Shape{5, cols}, dtype, "misaligned"));
      }
    }
  }
}

// layer_norm's cached kernel runs a persistent grid (Note [Streaming rows] in layer_norm.cu): with more rows than
// a GPU holds groups at once (under 20000 sub-warp groups of 8 lanes, 3200 warps, 800, 300 and 150 blocks of 128,
// 256 and 512 threads on today's largest GPUs), each group takes several rows, prefetching the next while it
// writes one. Every group size, row counts that leave part of the last rows' block idle, with and without the
// residual.
TEST(CudaRawGpu, LayerNormCachedRowsLoopOverSeveralRowsPerGroup) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  const Attributes attrs = Attributes().set("axis", std::int64_t{-1}).set("epsilon", 1e-5);
  // {rows, cols}: float16 and bfloat16 groups of 8 lanes, a warp, 128, 256 and 512 threads (float32: 16 lanes,
  // 128, 256 and 512 threads, then the scalar kernel).
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {60001, 96}, {8001, 1024}, {2001, 4096}, {1001, 8192}, {401, 16384}};
  for (const DType dtype : kFloatTypes) {
    const Tolerance tol = tolerance_for(dtype, 1e-4);
    for (const auto& rows_cols : shapes) {
      const Shape shape = {rows_cols.first, rows_cols.second};
      const Tensor x = random_tensor(shape, dtype, rng, 2.0f, 6.0f);
      const Tensor scale = random_tensor({rows_cols.second}, dtype, rng, -2, 2);
      const Tensor bias = random_tensor({rows_cols.second}, dtype, rng, -2, 2);
      compare_with_cpu("layer_norm", {x, scale, bias}, attrs, tol, label("layer_norm", shape, dtype));
      compare_with_cpu("layer_norm", {x, Tensor(), Tensor(), random_tensor(shape, dtype, rng, -2, 2)}, attrs, tol,
                       label("layer_norm", shape, dtype, "residual, no scale or bias"));
    }
  }
}

// layer_norm's register-cached kernel (Note [Register-cached rows] in layer_norm.cu) from one vector a row to
// 2048 (16384 halves; 16392 takes the scalar kernel), for few rows and many, with and without the residual; rows
// of 4097 and a misaligned input take the scalar kernel.
TEST(CudaRawGpu, LayerNormCachedRowsMatchTheCpuKernelForManyAndFewRows) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  const Attributes attrs = Attributes().set("axis", std::int64_t{-1}).set("epsilon", 1e-5);
  for (const DType dtype : kFloatTypes) {
    const Tolerance tol = tolerance_for(dtype, 1e-4);
    for (const std::int64_t cols : {8, 16, 96, 768, 1000, 1024, 4096, 4097, 8192, 16384, 16392}) {
      const Tensor scale = random_tensor({cols}, dtype, rng, -2, 2);
      const Tensor bias = random_tensor({cols}, dtype, rng, -2, 2);
      const std::int64_t many = std::clamp<std::int64_t>((std::int64_t{1} << 21) / cols, 300, 40000);
      for (const std::int64_t rows : {std::int64_t{3}, many}) {
        const Shape shape = {rows, cols};
        const Tensor x = random_tensor(shape, dtype, rng, 2.0f, 6.0f);
        compare_with_cpu("layer_norm", {x, scale, bias}, attrs, tol, label("layer_norm", shape, dtype));
        const Tensor residual = random_tensor(shape, dtype, rng, -2, 2);
        compare_with_cpu("layer_norm", {x, Tensor(), Tensor(), residual}, attrs, tol,
                         label("layer_norm", shape, dtype, "residual, no scale or bias"));
        // a res-post-norm block's addend (Swin V2), alone and with the residual
        const Tensor addend = random_tensor(shape, dtype, rng, -8, 8);
        compare_with_cpu("layer_norm", {x, scale, bias, Tensor(), addend}, attrs, tol,
                         label("layer_norm", shape, dtype, "addend"));
        compare_with_cpu("layer_norm", {x, Tensor(), bias, residual, addend}, attrs, tol,
                         label("layer_norm", shape, dtype, "residual and addend, no scale"));
      }
      const auto [host_view, device_view] = misaligned_rows(5, cols, dtype, rng, 2.0f, 6.0f);
      const Tensor expected = run_kernel("layer_norm", "cpu", {host_view, scale, bias}, attrs)[0];
      const Tensor actual =
          run_kernel("layer_norm", "cuda_raw", {device_view, scale.to(Device::cuda(0)), bias.to(Device::cuda(0))},
                     attrs)[0];
      expect_close(actual, expected, tol, label("layer_norm", Shape{5, cols}, dtype, "misaligned"));
    }
  }
}

// ---- pad and resize: the row kernels (Note [Pad rows] in pad.cu, Note [Resize rows] in resize.cu) ----

// `actual` and `expected` (any devices) hold the same bytes: for kernels that copy elements.
void expect_same_bytes(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  const Tensor a = actual.device().is_cpu() ? actual : actual.to(Device::cpu());
  const Tensor e = expected.device().is_cpu() ? expected : expected.to(Device::cpu());
  EXPECT_EQ(std::memcmp(a.data_ptr(), e.data_ptr(), a.nbytes()), 0) << what;
}

// A host tensor of `shape` and `dtype` with random bytes (any dtype; floats may hold NaNs, which pad copies).
Tensor random_bytes(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<unsigned char*>(t.data_ptr());
  for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  return t;
}

// Pad copies elements, so the cuda_raw kernel must give the cpu kernel's bytes in every mode and dtype: odd and even
// shapes, rows shorter than a 16-byte vector, widths of 1, asymmetric pads, crops, a dimension cropped on one side and
// padded on the other, padded channels, more outer dimensions than the row kernel takes (the general kernel), rank
// 8, and tensors large enough for several chunks per thread and many blocks (constant pads without crops: many
// staged tiles, Note [Constant pad staging]); 1-, 2-, 4- and 8-byte elements; and inputs one element off 16-byte
// alignment (the interior runs and the staged spans read whole words from before x's start).
TEST(CudaRawGpu, PadRowKernelMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  struct Case {
    Shape shape;
    Shape pads;  // all begins, then all ends
  };
  const std::vector<Case> cases = {
      {{2, 3, 7, 7}, {0, 0, 1, 1, 0, 0, 1, 1}},
      {{2, 3, 7, 7}, {0, 0, 2, 0, 0, 0, 0, 3}},
      {{2, 3, 7, 7}, {0, 0, -1, -2, 0, 0, -1, 0}},
      {{2, 3, 7, 7}, {0, 0, -1, 2, 0, 0, 1, -3}},
      {{2, 3, 7, 7}, {0, 1, 0, 0, 0, 2, 0, 0}},
      {{2, 3, 3, 65}, {1, 0, 1, 3, 0, 1, 1, 2}},
      {{2, 3, 65, 1}, {0, 0, 1, 0, 0, 0, 2, 0}},
      {{1, 3, 1, 3}, {0, 0, 0, 1, 0, 0, 0, 1}},
      {{2, 3, 8, 8}, {0, 0, 0, 0, 0, 0, 0, 0}},
      {{7}, {3, 5}},
      {{3, 5, 33, 17}, {0, 1, 2, 3, 1, 0, 3, 2}},
      {{2, 4, 9, 40}, {0, 0, 0, 5, 0, 0, 0, -3}},
      {{2, 3, 5, 6, 7, 9}, {1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 2}},
      {{2, 1, 2, 3, 1, 2, 2, 3}, {0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 2, 0, 0, 1, 0}},
      {{4, 16, 64, 64}, {0, 0, 1, 1, 0, 0, 1, 1}},
      {{2, 8, 64, 67}, {0, 0, 2, 1, 0, 0, 1, 3}},
      {{3, 2, 45, 37}, {2, 0, 3, 0, 1, 1, 0, 5}}};
  for (const Case& c : cases) {
    const std::size_t rank = c.shape.size();
    bool reflectable = true;  // reflect needs 2 or more elements along every padded dimension
    for (std::size_t d = 0; d < rank; ++d) {
      if ((c.pads[d] > 0 || c.pads[d + rank] > 0) && c.shape[d] < 2) reflectable = false;
    }
    for (const std::string mode : {"constant", "reflect", "edge", "wrap"}) {
      if (mode == "reflect" && !reflectable) continue;
      const Attributes attrs = Attributes().set("pads", c.pads).set("mode", mode).set("value", 3.0);
      for (const DType dtype : {DType::kFloat16, DType::kFloat32, DType::kUInt8, DType::kInt64}) {
        const Tensor x = random_bytes(c.shape, dtype, rng);
        const Tensor expected = run_kernel("pad", "cpu", {x}, attrs)[0];
        const Tensor actual = run_kernel("pad", "cuda_raw", {x.to(Device::cuda(0))}, attrs)[0];
        const std::string what = label("pad", c.shape, dtype, mode + " pads " + shape_str(c.pads));
        expect_same_bytes(actual, expected, what);
        if (dtype == DType::kUInt8) continue;  // one element off leaves 1-byte tensors aligned to their size
        const Tensor buffer = random_bytes({numel_of(c.shape) + 1}, dtype, rng);
        const auto views = host_and_device_views(buffer, c.shape, 1);
        expect_same_bytes(run_kernel("pad", "cuda_raw", {views.second}, attrs)[0],
                          run_kernel("pad", "cpu", {views.first}, attrs)[0], what + " misaligned");
      }
    }
  }
}

// Nearest with scales 2, 3, a non-integer scale and downsampling under every coordinate transformation mode, and
// linear under every mode; H or W of 1, rows shorter than a vector, one resized dimension, three, channels last
// (linear takes the general kernel there), the innermost dimension kept or doubled at full vector width (whole-word
// rows, each thread checking its columns), and enough rows for several per thread and many blocks; H resized to at
// most kRowTable rows (nearest's offset table) and to more; inputs one
// element off 16-byte alignment (element gathers). Sizes are the floor of size * scale, as the lowering makes them.
// Nearest copies, so it must give the cpu kernel's bytes. Left out: at the non-integer scales, the nearest pairs
// whose coordinates land on a rounding boundary (the cpu kernel computes them in float64, the cuda_raw kernels in
// float32, so they may round apart); and tf_half_pixel_for_nn where it moves the dimensions that keep their size
// (x = o + 0.5 there: ceil, round_prefer_ceil and linear), which the cuda_raw kernels copy instead.
TEST(CudaRawGpu, ResizeRowKernelsMatchTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(16);
  struct Case {
    Shape in;
    Shape out;
    std::vector<double> scales;
    bool integer;  // every scale a whole number
    bool every_mode;  // every transform and rounding (else a few, for the large cases)
    bool linear = true;  // linear too (its float32 coordinates drift from the cpu kernel's float64 on long axes)
  };
  const std::vector<Case> cases = {
      {{2, 3, 7, 7}, {2, 3, 14, 14}, {1, 1, 2, 2}, true, true},
      {{2, 3, 7, 7}, {2, 3, 21, 21}, {1, 1, 3, 3}, true, true},
      {{2, 3, 5, 5}, {2, 3, 8, 8}, {1, 1, 1.6, 1.6}, false, true},
      {{2, 3, 65, 65}, {2, 3, 32, 32}, {1, 1, 0.5, 0.5}, false, true},
      {{1, 3, 1, 7}, {1, 3, 3, 14}, {1, 1, 3, 2}, true, true},
      {{1, 3, 7, 1}, {1, 3, 14, 3}, {1, 1, 2, 3}, true, true},
      {{2, 3, 7, 7}, {2, 3, 7, 14}, {1, 1, 1, 2}, true, true},
      {{2, 3, 7, 7}, {2, 3, 14, 7}, {1, 1, 2, 1}, true, true},
      {{1, 4, 4, 3}, {1, 8, 8, 3}, {1, 2, 2, 1}, true, true},
      {{2, 3, 4, 5}, {2, 6, 8, 10}, {1, 2, 2, 2}, true, true},
      {{7}, {14}, {2}, true, true},
      {{2, 3, 4, 12}, {2, 3, 8, 24}, {1, 1, 2, 2}, true, true},
      {{2, 4, 12, 16}, {2, 4, 24, 16}, {1, 1, 2, 1}, true, true},
      {{1, 6, 6, 8}, {1, 12, 12, 8}, {1, 2, 2, 1}, true, true},
      {{2, 8, 32, 32}, {2, 8, 64, 64}, {1, 1, 2, 2}, true, true},
      {{4, 16, 32, 32}, {4, 16, 64, 64}, {1, 1, 2, 2}, true, false},
      {{4, 16, 64, 64}, {4, 16, 128, 64}, {1, 1, 2, 1}, true, false},
      {{1, 2, 700, 3}, {1, 2, 1400, 6}, {1, 1, 2, 2}, true, true, false}};
  const std::vector<std::string> transforms = {"half_pixel",    "half_pixel_symmetric", "pytorch_half_pixel",
                                               "align_corners", "asymmetric",           "tf_half_pixel_for_nn"};
  const std::vector<std::string> roundings = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  for (const Case& c : cases) {
    for (const DType dtype : kFloatTypes) {
      const Tensor x = random_tensor(c.in, dtype, rng);
      const Tensor buffer = random_tensor({numel_of(c.in) + 1}, dtype, rng);
      const auto views = host_and_device_views(buffer, c.in, 1);
      // Linear weights come from float32 coordinates (the cpu kernel's are float64), rounded to 2^-18 near 64.
      const auto run = [&](const Attributes& mode_attrs, bool nearest, const std::string& what) {
        const Attributes attrs = Attributes(mode_attrs).set("sizes", c.out).set("scales", c.scales);
        const std::string name = label("resize", c.in, dtype, what);
        if (nearest) {
          expect_same_bytes(run_kernel("resize", "cuda_raw", {x.to(Device::cuda(0))}, attrs)[0],
                            run_kernel("resize", "cpu", {x}, attrs)[0], name);
          expect_same_bytes(run_kernel("resize", "cuda_raw", {views.second}, attrs)[0],
                            run_kernel("resize", "cpu", {views.first}, attrs)[0], name + " misaligned");
        } else {
          compare_with_cpu("resize", {x}, attrs, tolerance_for(dtype, 1e-4), name);
        }
      };
      for (const std::string& transform : transforms) {
        if (!c.every_mode && transform != "half_pixel" && transform != "asymmetric") continue;
        for (const std::string& rounding : roundings) {
          const bool to_nearest = rounding.rfind("round", 0) == 0;
          if ((!c.integer && (transform == "half_pixel_symmetric" || (transform == "asymmetric" && to_nearest) ||
                              (transform == "align_corners" && !to_nearest))) ||
              (transform == "tf_half_pixel_for_nn" && (rounding == "ceil" || rounding == "round_prefer_ceil"))) {
            continue;
          }
          run(Attributes()
                  .set("mode", std::string("nearest"))
                  .set("coordinate_transformation_mode", transform)
                  .set("nearest_mode", rounding),
              true, "nearest " + transform + " " + rounding + " to " + shape_str(c.out));
        }
        if (transform == "tf_half_pixel_for_nn" || !c.linear) continue;
        run(Attributes().set("mode", std::string("linear")).set("coordinate_transformation_mode", transform), false,
            "linear " + transform + " to " + shape_str(c.out));
      }
    }
  }
}

}  // namespace
}  // namespace xpuruntime
