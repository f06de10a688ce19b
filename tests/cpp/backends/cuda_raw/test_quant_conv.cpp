// qconv2d's GPU kernels: every path of cuda_raw's (backends/cuda_raw/quant_conv.cu, Note [Int8 convolution on the
// GPU]; "cuda_raw": direct and tiled; "int8_mma": the tensor-core tiles of 128 and 64) against the cpu kernel, bit for
// bit, and cudnn's (backends/cudnn/cudnn_qconv.cpp, Note [cuDNN int8 convolution]) within one level, on random inputs
// at odd shapes (GPU); what the kernels take and say, and cuda_raw's plans and records (CPU-runnable: plans are built
// from descriptors alone).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/half.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Ints = std::vector<std::int64_t>;

const Kernel& qconv_kernel(const std::string& name) {
  const Kernel* kernel = KernelRegistry::global().find_kernel("qconv2d", name);
  if (kernel == nullptr) throw std::runtime_error("no qconv2d kernel '" + name + "'");
  return *kernel;
}

// ---- one convolution's inputs and attributes ----

struct Case {
  std::string name;
  std::int64_t n, c, h, w, o, kh, kw;
  Ints strides = {1, 1};
  Ints pads = {0, 0, 0, 0};
  Ints dilations = {1, 1};
  std::int64_t groups = 1;
  bool nhwc = false;
  DType x_dtype = DType::kInt8;
  std::int64_t x_zero_point = 0;
  bool per_channel = true;  // w_scale [O], else [1]
  enum Bias { kNone, kInt, kFloat } bias = kNone;
  bool relu = false;
  std::string output = "float32";
};

std::string describe(const Case& k) {
  return k.name + " (x " + std::string(dtype_name(k.x_dtype)) + " zp " + std::to_string(k.x_zero_point) + ", " +
         (k.nhwc ? "NHWC" : "NCHW") + ", groups " + std::to_string(k.groups) + ", output " + k.output +
         (k.relu ? ", relu" : "") + ")";
}

Tensor random_bytes(const Shape& shape, DType dtype, std::mt19937& rng, int low, int high) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_int_distribution<int> dist(low, high);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<std::uint8_t>(dist(rng));
  return t;
}

Tensor random_floats(const Shape& shape, std::mt19937& rng, float low, float high) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::uniform_real_distribution<float> dist(low, high);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

Tensor random_ints(const Shape& shape, std::mt19937& rng, int low, int high) {
  Tensor t = Tensor::empty(shape, DType::kInt32);
  std::uniform_int_distribution<int> dist(low, high);
  auto* p = static_cast<std::int32_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

// Host inputs (x, weight, w_scale, bias; absent ones undefined) in the case's layout, and its attributes.
struct Problem {
  std::vector<Tensor> inputs;
  Attributes attrs;
};

Problem make_problem(const Case& k, std::mt19937& rng) {
  Problem p;
  const Shape x_shape = k.nhwc ? Shape{k.n, k.h, k.w, k.c} : Shape{k.n, k.c, k.h, k.w};
  const Shape w_shape = k.nhwc ? Shape{k.o, k.kh, k.kw, k.c / k.groups} : Shape{k.o, k.c / k.groups, k.kh, k.kw};
  const bool unsigned_x = k.x_dtype == DType::kUInt8;
  p.inputs.push_back(random_bytes(x_shape, k.x_dtype, rng, unsigned_x ? 0 : -128, unsigned_x ? 255 : 127));
  p.inputs.push_back(random_bytes(w_shape, DType::kInt8, rng, -128, 127));
  const bool raw = k.output == "int32";
  p.inputs.push_back(raw ? Tensor() : random_floats({k.per_channel ? k.o : 1}, rng, 0.002f, 0.02f));
  if (k.bias == Case::kInt) {
    p.inputs.push_back(random_ints({k.o}, rng, -20000, 20000));
  } else if (k.bias == Case::kFloat) {
    p.inputs.push_back(random_floats({k.o}, rng, -3.0f, 3.0f));
  } else {
    p.inputs.push_back(Tensor());
  }
  p.attrs.set("strides", k.strides).set("pads", k.pads).set("dilations", k.dilations).set("groups", k.groups);
  p.attrs.set("layout", std::string(k.nhwc ? "NHWC" : "NCHW")).set("output_dtype", k.output);
  p.attrs.set("x_zero_point", k.x_zero_point).set("activation", std::string(k.relu ? "relu" : "none"));
  if (!raw) p.attrs.set("x_scale", 0.0173);
  if (k.output == "int8" || k.output == "uint8") {
    // About 40 levels per typical output: most outputs inside the range, some saturated.
    const double k_terms = static_cast<double>(k.c / k.groups * k.kh * k.kw);
    p.attrs.set("y_scale", 0.0173 * 0.011 * 80.0 * 70.0 * std::sqrt(k_terms) / 40.0);
    p.attrs.set("y_zero_point", static_cast<std::int64_t>(k.output == "int8" ? -7 : 121));
  }
  return p;
}

// ---- running a kernel ----

// The descriptor of `inputs` on their device, inferred.
OpDescriptor descriptor_of(const std::vector<Tensor>& inputs, const Attributes& attrs) {
  OpDescriptor desc;
  desc.op = "qconv2d";
  for (const Tensor& t : inputs) desc.inputs.push_back(TensorDesc::of(t));
  desc.attrs = attrs;
  desc.device = inputs.at(0).device();
  desc.compute_capability =
      desc.device.is_cuda() ? DeviceManager::instance().get_device_info(desc.device).compute_capability() : 0;
  KernelRegistry::global().infer(desc);
  return desc;
}

// Runs qconv2d with kernel `name` (and plan record `record`, empty: the kernel's choice) and returns the output.
Tensor run(const std::string& name, const std::string& record, const std::vector<Tensor>& inputs,
           const Attributes& attrs, std::string* described = nullptr) {
  const OpDescriptor desc = descriptor_of(inputs, attrs);
  const ExecutionPolicy policy;
  const Kernel& kernel = name == "cpu" ? *KernelRegistry::global().find_kernel("qconv2d", "cpu") : qconv_kernel(name);
  const Support support = kernel.supports(desc, policy);
  if (!support) throw std::runtime_error(name + " does not support " + desc.signature() + ": " + support.reason());
  const auto plan = kernel.build(desc, policy, record);
  if (described != nullptr) *described = plan->describe();
  std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype, desc.device)};
  const StreamView stream =
      desc.device.is_cuda() ? StreamManager::instance().current_stream(desc.device) : StreamView();
  plan->execute(desc, inputs, outputs, stream);
  stream.synchronize();
  return outputs[0];
}

// Expects `actual` (any device) to hold the bytes of `expected` (host), naming the first element that differs.
void expect_same_bytes(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  const Tensor host = actual.to(Device::cpu());
  const std::size_t size = dtype_size(expected.dtype());
  const auto* a = static_cast<const std::uint8_t*>(host.data_ptr());
  const auto* e = static_cast<const std::uint8_t*>(expected.data_ptr());
  std::int64_t differing = 0, first = -1;
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    if (std::memcmp(a + i * size, e + i * size, size) != 0 && differing++ == 0) first = i;
  }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << expected.numel()
                          << " elements differ from the cpu kernel's, the first at " << first;
}

std::vector<Case> nchw_cases() {
  std::vector<Case> cases;
  Case k{"1x1, odd channels", 1, 5, 6, 7, 7, 1, 1};
  k.per_channel = false;
  cases.push_back(k);
  k = Case{"3x3 pad 1", 1, 16, 9, 8, 24, 3, 3};
  k.pads = {1, 1, 1, 1};
  k.x_zero_point = -3;
  k.bias = Case::kFloat;
  k.relu = true;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"7x7 stride 2 stem", 3, 3, 17, 15, 16, 7, 7};
  k.strides = {2, 2};
  k.pads = {3, 3, 3, 3};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 128;
  k.bias = Case::kInt;
  k.output = "uint8";
  cases.push_back(k);
  k = Case{"3x3 dilation 2, uneven pads", 1, 8, 11, 10, 20, 3, 3};
  k.dilations = {2, 2};
  k.pads = {1, 0, 2, 1};
  k.x_zero_point = 5;
  k.output = "float16";
  cases.push_back(k);
  k = Case{"groups 2, stride 2", 3, 12, 9, 9, 40, 3, 3};
  k.groups = 2;
  k.strides = {2, 2};
  k.pads = {1, 1, 1, 1};
  k.x_zero_point = -20;
  k.bias = Case::kInt;
  k.relu = true;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"depthwise", 2, 24, 10, 9, 24, 3, 3};
  k.groups = 24;
  k.pads = {1, 1, 1, 1};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 77;
  k.bias = Case::kFloat;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"ConvInteger: int32 accumulator", 1, 6, 8, 8, 10, 3, 3};
  k.pads = {1, 1, 1, 1};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 131;
  k.output = "int32";
  cases.push_back(k);
  k = Case{"groups 3 of two outputs, 5x3", 1, 9, 12, 7, 6, 5, 3};
  k.groups = 3;
  k.pads = {2, 1, 2, 1};
  k.bias = Case::kInt;
  k.output = "float32";
  cases.push_back(k);
  k = Case{"64 -> 96 channels, batch 3", 3, 64, 14, 14, 96, 3, 3};
  k.pads = {1, 1, 1, 1};
  k.x_zero_point = -128;
  k.bias = Case::kFloat;
  k.relu = true;
  k.output = "uint8";
  cases.push_back(k);
  return cases;
}

std::vector<Case> nhwc_cases() {
  std::vector<Case> cases;
  Case k{"1x1, 16 -> 8", 1, 16, 7, 7, 8, 1, 1};
  k.nhwc = true;
  k.x_zero_point = -128;
  k.bias = Case::kFloat;
  k.relu = true;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"3x3, 32 -> 72, batch 3", 3, 32, 10, 10, 72, 3, 3};
  k.nhwc = true;
  k.pads = {1, 1, 1, 1};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 100;
  k.bias = Case::kInt;
  k.output = "uint8";
  cases.push_back(k);
  k = Case{"48 -> 130 channels, stride 2, dilation 2 (K tail, partial tiles)", 2, 48, 13, 11, 130, 3, 3};
  k.nhwc = true;
  k.strides = {2, 2};
  k.dilations = {2, 2};
  k.pads = {1, 1, 0, 0};
  k.per_channel = false;
  k.output = "float32";
  cases.push_back(k);
  k = Case{"7x7 stride 2, 16 -> 64", 1, 16, 23, 23, 64, 7, 7};
  k.nhwc = true;
  k.strides = {2, 2};
  k.pads = {3, 3, 3, 3};
  k.x_zero_point = 9;
  k.output = "float16";
  cases.push_back(k);
  k = Case{"56x56, 64 -> 64, batch 2", 2, 64, 56, 56, 64, 3, 3};
  k.nhwc = true;
  k.pads = {1, 1, 1, 1};
  k.x_zero_point = -128;
  k.bias = Case::kFloat;
  k.relu = true;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"deep stage at batch 1: 3x3, 256 -> 260 on 7x7 (split by default)", 1, 256, 7, 7, 260, 3, 3};
  k.nhwc = true;
  k.pads = {1, 1, 1, 1};
  k.x_zero_point = -7;
  k.bias = Case::kInt;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"1x1 stride 2 downsample, 144 -> 36, batch 5 (several 128-row tiles)", 5, 144, 15, 13, 36, 1, 1};
  k.nhwc = true;
  k.strides = {2, 2};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 128;
  k.bias = Case::kFloat;
  k.relu = true;
  k.output = "uint8";
  cases.push_back(k);
  k = Case{"ConvInteger NHWC", 1, 16, 9, 9, 24, 3, 3};
  k.nhwc = true;
  k.pads = {1, 1, 1, 1};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 3;
  k.bias = Case::kInt;
  k.output = "int32";
  cases.push_back(k);
  k = Case{"12 channels (generic only)", 1, 12, 8, 8, 20, 3, 3};
  k.nhwc = true;
  k.pads = {1, 1, 1, 1};
  k.x_zero_point = 4;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"depthwise NHWC", 1, 16, 9, 9, 16, 3, 3};
  k.nhwc = true;
  k.groups = 16;
  k.pads = {1, 1, 1, 1};
  k.x_dtype = DType::kUInt8;
  k.x_zero_point = 90;
  k.output = "uint8";
  cases.push_back(k);
  return cases;
}

// Every path that takes the case's problem `p`, against the cpu kernel.
void check_problem(const Case& k, const Problem& p) {
  const Tensor expected = run("cpu", "", p.inputs, p.attrs);
  std::vector<Tensor> device_inputs;
  for (const Tensor& t : p.inputs) device_inputs.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"cuda_raw", ""}, {"cuda_raw", R"({"path": "direct"})"}, {"cuda_raw", R"({"path": "tiled"})"},
      {"int8_mma", ""}, {"int8_mma", R"({"path": "tensor_core"})"}, {"int8_mma", R"({"path": "tensor_core_64"})"},
      {"int8_mma", R"({"path": "pipelined"})"}, {"int8_mma", R"({"path": "pipelined_64"})"},
      // split-K: partial sums added by several blocks, the epilogue by the last (Note [Pipelined int8 convolution])
      {"int8_mma", R"({"path": "pipelined", "splits": 2})"}, {"int8_mma", R"({"path": "pipelined_64", "splits": 3})"},
      {"int8_mma", R"({"path": "pipelined_64", "splits": 32})"}};
  const bool tensor_core = k.nhwc && k.groups == 1 && k.c % 16 == 0;
  for (const auto& [name, record] : runs) {
    const OpDescriptor desc = descriptor_of(device_inputs, p.attrs);
    const Support support = qconv_kernel(name).supports(desc, ExecutionPolicy());
    EXPECT_EQ(static_cast<bool>(support), name == "cuda_raw" || tensor_core) << name << ": " << support.reason();
    if (!support) continue;
    std::string plan;
    const Tensor actual = run(name, record, device_inputs, p.attrs, &plan);
    expect_same_bytes(actual, expected, name + " " + (record.empty() ? "(its choice)" : record) + ": " + plan);
  }
}

// Every path that takes the case, against the cpu kernel.
void check_case(const Case& k, std::mt19937& rng) {
  SCOPED_TRACE(describe(k));
  check_problem(k, make_problem(k, rng));
}

TEST(QConv2dGpu, EveryPathMatchesTheCpuKernelBitForBitNchw) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  for (const Case& k : nchw_cases()) check_case(k, rng);
}

TEST(QConv2dGpu, EveryPathMatchesTheCpuKernelBitForBitNhwc) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(42);
  for (const Case& k : nhwc_cases()) check_case(k, rng);
}

// Per-tensor and per-channel scales, every output dtype, relu or not, int8 and uint8 x with and without zero points:
// the epilogue's combinations on one NHWC shape the tensor cores take and one grouped NCHW shape they do not.
TEST(QConv2dGpu, EveryEpilogueMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  for (const bool nhwc : {true, false}) {
    for (const char* output : {"int8", "uint8", "float32", "float16", "int32"}) {
      for (const DType x_dtype : {DType::kInt8, DType::kUInt8}) {
        for (const int variant : {0, 1}) {
          Case k = nhwc ? Case{"NHWC 32 -> 40", 2, 32, 6, 5, 40, 3, 3} : Case{"NCHW groups 2", 2, 10, 6, 5, 36, 3, 3};
          k.nhwc = nhwc;
          k.groups = nhwc ? 1 : 2;
          k.pads = {1, 0, 1, 2};
          k.output = output;
          k.x_dtype = x_dtype;
          k.x_zero_point = variant == 0 ? 0 : (x_dtype == DType::kUInt8 ? 255 : -128);
          k.per_channel = variant == 1;
          const bool raw = k.output == "int32";
          k.relu = !raw && variant == 1;
          k.bias = raw ? (variant == 1 ? Case::kInt : Case::kNone) : (variant == 1 ? Case::kInt : Case::kFloat);
          check_case(k, rng);
        }
      }
    }
  }
}

// The 8-bit requantization without a division (Note [Requantization without a division]): scales whose quotients
// fall exactly on half levels (x_scale * w_scale / y_scale = 1/2: every odd sum is a tie), scales with inexact
// reciprocals, zeros of both signs from a float bias, ReLU or not, zero points at both ends: every path's levels
// equal the cpu kernel's, which divides.
TEST(QConv2dGpu, TiesAndZerosRequantizeAsTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(44);
  for (const double y_scale : {0.25, 0.1, 3.0, 1.0e-3}) {
    for (const char* output : {"int8", "uint8"}) {
      for (const int variant : {0, 1, 2}) {
        Case k{"NHWC ties", 2, 32, 5, 6, 40, 1, 1};
        k.nhwc = true;
        k.output = output;
        k.per_channel = false;
        k.relu = variant != 0;
        k.bias = variant == 2 ? Case::kFloat : Case::kNone;
        SCOPED_TRACE(describe(k) + ", y_scale " + std::to_string(y_scale) + ", variant " + std::to_string(variant));
        Problem p = make_problem(k, rng);
        p.inputs[0] = random_bytes({k.n, k.h, k.w, k.c}, DType::kInt8, rng, -3, 3);  // small sums: many ties
        p.inputs[1] = random_bytes({k.o, 1, 1, k.c}, DType::kInt8, rng, -2, 2);
        p.inputs[2] = Tensor::empty({1}, DType::kFloat32);
        *static_cast<float*>(p.inputs[2].data_ptr()) = 0.25f;
        if (k.bias == Case::kFloat) {
          auto* bias = static_cast<float*>(p.inputs[3].data_ptr());
          for (std::int64_t o = 0; o < k.o; ++o) bias[o] = o % 3 == 0 ? -0.0f : (o % 3 == 1 ? 0.0625f : -0.125f);
        }
        const bool is_signed = std::string(output) == "int8";
        p.attrs.set("x_scale", 0.5).set("y_scale", y_scale);
        p.attrs.set("y_zero_point", static_cast<std::int64_t>(variant == 1 ? (is_signed ? -128 : 255) : (is_signed ? 3 : 0)));
        check_problem(k, p);
      }
    }
  }
}

// Expects `actual` (any device) within one level of `expected` (host) for 8-bit outputs, within float32 rounding of
// the scaled sum for float32 and within float16 rounding for float16; returns how many elements differ at all.
std::int64_t expect_within_one_level(const Tensor& actual, const Tensor& expected, const std::string& what) {
  EXPECT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_EQ(actual.dtype(), expected.dtype()) << what;
  const Tensor host = actual.to(Device::cpu());
  std::int64_t differing = 0, beyond = 0, first_beyond = -1;
  double worst = 0.0;
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    double a = 0.0, e = 0.0, tolerance = 0.0;
    switch (expected.dtype()) {
      case DType::kInt8:
        a = static_cast<const std::int8_t*>(host.data_ptr())[i];
        e = static_cast<const std::int8_t*>(expected.data_ptr())[i];
        tolerance = 1.0;
        break;
      case DType::kUInt8:
        a = static_cast<const std::uint8_t*>(host.data_ptr())[i];
        e = static_cast<const std::uint8_t*>(expected.data_ptr())[i];
        tolerance = 1.0;
        break;
      case DType::kFloat16:
        a = detail::half_to_float(static_cast<const std::uint16_t*>(host.data_ptr())[i]);
        e = detail::half_to_float(static_cast<const std::uint16_t*>(expected.data_ptr())[i]);
        tolerance = 1e-3 * (1.0 + std::fabs(e));
        break;
      default:
        a = static_cast<const float*>(host.data_ptr())[i];
        e = static_cast<const float*>(expected.data_ptr())[i];
        tolerance = 1e-5 * (1.0 + std::fabs(e));
    }
    const double diff = std::fabs(a - e);
    if (diff != 0.0) ++differing;
    worst = std::max(worst, diff);
    if (!(diff <= tolerance) && beyond++ == 0) first_beyond = i;
  }
  EXPECT_EQ(beyond, 0) << what << ": " << beyond << " of " << expected.numel() << " elements beyond the tolerance, "
                       << "the first at " << first_beyond << "; largest difference " << worst;
  return differing;
}

// cudnn's qconv2d (Note [cuDNN int8 convolution]) on the convolutions it takes: within one level of the cpu kernel,
// at odd sizes, strides, dilations, uneven pads, every output dtype and epilogue; and the ones it refuses, refused.
TEST(QConv2dGpu, CudnnMatchesTheCpuKernelWithinOneLevel) {
  XPURT_SKIP_WITHOUT_GPU();
  if (KernelRegistry::global().find_kernel("qconv2d", "cudnn") == nullptr) GTEST_SKIP() << "built without cuDNN";
  std::mt19937 rng(45);
  std::vector<Case> cases;
  Case k{"3x3 pad 1, 16 -> 24", 1, 16, 9, 8, 24, 3, 3};
  k.pads = {1, 1, 1, 1};
  k.bias = Case::kFloat;
  k.relu = true;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"1x1, 64 -> 256, batch 3, int32 bias", 3, 64, 14, 14, 256, 1, 1};
  k.bias = Case::kInt;
  k.relu = true;
  k.output = "int8";
  cases.push_back(k);
  k = Case{"3x3 stride 2, uneven pads, 32 -> 36, per-tensor scale", 2, 32, 13, 11, 36, 3, 3};
  k.strides = {2, 2};
  k.pads = {1, 0, 1, 2};
  k.per_channel = false;
  k.output = "uint8";
  cases.push_back(k);
  k = Case{"3x3 dilation 2, 48 -> 64", 1, 48, 12, 10, 64, 3, 3};
  k.dilations = {2, 2};
  k.pads = {2, 2, 2, 2};
  k.bias = Case::kInt;
  k.output = "float32";
  cases.push_back(k);
  k = Case{"7x7 stride 2, 16 -> 64", 1, 16, 23, 23, 64, 7, 7};
  k.strides = {2, 2};
  k.pads = {3, 3, 3, 3};
  k.bias = Case::kFloat;
  k.output = "float16";
  cases.push_back(k);
  k = Case{"1x1 stride 2 downsample, 256 -> 512, batch 2", 2, 256, 14, 14, 512, 1, 1};
  k.strides = {2, 2};
  k.relu = true;
  k.output = "float32";
  cases.push_back(k);
  std::int64_t differing = 0, total = 0;
  for (Case& c : cases) {
    c.nhwc = true;
    SCOPED_TRACE(describe(c));
    Problem p = make_problem(c, rng);
    if (c.output == "int8") p.attrs.set("y_zero_point", std::int64_t{0});  // the symmetric form; uint8 keeps 121
    const Tensor expected = run("cpu", "", p.inputs, p.attrs);
    std::vector<Tensor> device_inputs;
    for (const Tensor& t : p.inputs) device_inputs.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
    std::string plan;
    const Tensor actual = run("cudnn", "", device_inputs, p.attrs, &plan);
    EXPECT_NE(plan.find("cudnn int8 convolution"), std::string::npos) << plan;
    const std::int64_t differ = expect_within_one_level(actual, expected, "cudnn: " + plan);
    if (c.output == "int8" || c.output == "uint8") {  // float outputs differ by float32 rounding anywhere
      differing += differ;
      total += expected.numel();
    }
    // x_scale folded into w_scale (the quantized_constants pass's form: x_scale 1): the same bounds.
    p.attrs.set("x_scale", 1.0);
    const Tensor folded = run("cudnn", "", device_inputs, p.attrs);
    expect_within_one_level(folded, run("cpu", "", p.inputs, p.attrs), "cudnn, x_scale 1");
  }
  std::printf("cudnn qconv2d: %lld of %lld 8-bit outputs differ from the cpu kernel's (all within one level)\n",
              static_cast<long long>(differing), static_cast<long long>(total));
  EXPECT_LT(differing * 100, total) << "more than 1% of the 8-bit outputs differ: a systematic rounding difference";
}

// A record fixes the path; the same plan gives the same bits run after run.
TEST(QConv2dGpu, PlansRunTheSameBitsTwice) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(44);
  Case k{"3x3, 32 -> 64", 2, 32, 12, 12, 64, 3, 3};
  k.nhwc = true;
  k.pads = {1, 1, 1, 1};
  k.x_zero_point = -5;
  k.output = "int8";
  const Problem p = make_problem(k, rng);
  std::vector<Tensor> device_inputs;
  for (const Tensor& t : p.inputs) device_inputs.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
  for (const char* name : {"int8_mma", "cuda_raw"}) {
    const Tensor first = run(name, "", device_inputs, p.attrs).to(Device::cpu());
    expect_same_bytes(run(name, "", device_inputs, p.attrs), first, name);
  }
}

// ---- CPU-runnable: what the kernels take and say ----

TensorDesc desc_of(const Shape& shape, DType dtype, std::uint32_t alignment = 256) {
  return TensorDesc::contiguous(shape, dtype, Device::cuda(0), alignment);
}

OpDescriptor qconv_desc(const Shape& x, const Shape& w, bool nhwc, std::int64_t groups = 1,
                        DType x_dtype = DType::kInt8, std::uint32_t alignment = 256) {
  OpDescriptor desc;
  desc.op = "qconv2d";
  desc.device = Device::cuda(0);
  desc.compute_capability = 90;
  desc.inputs = {desc_of(x, x_dtype, alignment), desc_of(w, DType::kInt8, alignment),
                 desc_of({w[0]}, DType::kFloat32), TensorDesc()};
  desc.attrs.set("layout", std::string(nhwc ? "NHWC" : "NCHW")).set("groups", groups).set("x_scale", 0.5);
  desc.attrs.set("pads", Ints{1, 1, 1, 1});
  KernelRegistry::global().infer(desc);
  return desc;
}

TEST(QConv2dKernels, BothAreRegisteredDeterministicCudaKernels) {
  for (const char* name : {"int8_mma", "cuda_raw"}) {
    const Kernel& kernel = qconv_kernel(name);
    EXPECT_EQ(kernel.info().backend, "cuda_raw") << name;
    EXPECT_EQ(kernel.info().device_type, DeviceType::kCUDA) << name;
    EXPECT_TRUE(kernel.info().deterministic) << name;
  }
#if XPURT_WITH_CUDA
  // cudnn (where built) ranks first, then int8_mma: the dispatcher's first choices where they fit.
  const auto kernels = KernelRegistry::global().kernels("qconv2d");
  ASSERT_GE(kernels.size(), 3u);
  const std::size_t first = kernels[0]->name() == "cudnn" ? 1 : 0;
  EXPECT_EQ(kernels[first]->name(), "int8_mma");
  EXPECT_EQ(kernels[first + 1]->name(), "cuda_raw");
#endif
}

#if XPURT_WITH_CUDA
// What cudnn's qconv2d takes (Note [cuDNN int8 convolution]): the reasons of what it refuses, which cuda_raw's
// kernels then run.
TEST(QConv2dKernels, TheCudnnKernelSaysWhatItTakes) {
  const Kernel* cudnn = KernelRegistry::global().find_kernel("qconv2d", "cudnn");
  if (cudnn == nullptr) GTEST_SKIP() << "built without cuDNN";
  EXPECT_EQ(cudnn->info().backend, "cudnn");
  EXPECT_FALSE(cudnn->info().deterministic);
  const ExecutionPolicy policy;
  const OpDescriptor fits = qconv_desc({2, 9, 9, 32}, {48, 3, 3, 32}, true);
  EXPECT_TRUE(cudnn->supports(fits, policy)) << cudnn->supports(fits, policy).reason();
  const auto refused = [&](const OpDescriptor& desc, const std::string& fragment) {
    const Support support = cudnn->supports(desc, policy);
    EXPECT_FALSE(support) << desc.signature();
    EXPECT_NE(support.reason().find(fragment), std::string::npos) << support.reason();
  };
  refused(qconv_desc({2, 32, 9, 9}, {48, 32, 3, 3}, false), "layout NHWC");
  refused(qconv_desc({2, 9, 9, 32}, {48, 3, 3, 16}, true, 2), "one group, got 2");
  refused(qconv_desc({2, 9, 9, 32}, {48, 3, 3, 32}, true, 1, DType::kUInt8), "signed int8 x");
  refused(qconv_desc({2, 9, 9, 24}, {48, 3, 3, 24}, true), "multiple of 16");
  refused(qconv_desc({2, 9, 9, 32}, {46, 3, 3, 32}, true), "32 -> 46");
  refused(qconv_desc({2, 9, 9, 32}, {48, 3, 3, 32}, true, 1, DType::kInt8, 8), "16-byte aligned");
  OpDescriptor zero_point = fits;
  zero_point.attrs.set("x_zero_point", std::int64_t{-128});
  refused(zero_point, "zero point 0");
  OpDescriptor raw = fits;
  raw.attrs.set("output_dtype", std::string("int32"));
  raw.inputs[2] = TensorDesc();
  KernelRegistry::global().infer(raw);
  refused(raw, "not int32");
  OpDescriptor old_device = fits;
  old_device.compute_capability = 75;
  refused(old_device, "compute capability");
  // It keeps cuDNN's heuristic choice: a record is refused before any cuDNN call.
  XPURT_EXPECT_THROW_WITH(cudnn->build(fits, policy, R"({"path": "tiled"})"), UnsupportedOperationError,
                          "has no plan record");
}
#endif  // XPURT_WITH_CUDA

#if XPURT_WITH_CUDA

TEST(QConv2dKernels, TheTensorCoreKernelSaysWhatItTakes) {
  const ExecutionPolicy policy;
  const Kernel& mma = qconv_kernel("int8_mma");
  const Kernel& generic = qconv_kernel("cuda_raw");
  const OpDescriptor fits = qconv_desc({2, 9, 9, 32}, {48, 3, 3, 32}, true);
  EXPECT_TRUE(mma.supports(fits, policy)) << mma.supports(fits, policy).reason();
  EXPECT_TRUE(generic.supports(fits, policy));
  // int8 precision: the op is int8 whatever the policy says.
  ExecutionPolicy int8;
  int8.precision = Precision::kInt8;
  EXPECT_TRUE(mma.supports(fits, int8));
  EXPECT_TRUE(generic.supports(fits, int8));
  const auto refused = [&](const OpDescriptor& desc, const std::string& fragment) {
    const Support support = mma.supports(desc, policy);
    EXPECT_FALSE(support) << desc.signature();
    EXPECT_NE(support.reason().find(fragment), std::string::npos) << support.reason();
    EXPECT_TRUE(generic.supports(desc, policy)) << generic.supports(desc, policy).reason();
  };
  refused(qconv_desc({2, 32, 9, 9}, {48, 32, 3, 3}, false), "layout NHWC, one group");
  refused(qconv_desc({2, 9, 9, 32}, {48, 3, 3, 16}, true, 2), "groups 2");
  refused(qconv_desc({2, 9, 9, 24}, {48, 3, 3, 24}, true), "24 input channels");
  refused(qconv_desc({2, 9, 9, 32}, {48, 3, 3, 32}, true, 1, DType::kInt8, 8), "16-byte aligned");
  // A CPU descriptor goes to the cpu kernel.
  OpDescriptor cpu = fits;
  cpu.device = Device::cpu();
  for (TensorDesc& t : cpu.inputs) t.device = Device::cpu();
  EXPECT_FALSE(mma.supports(cpu, policy));
  EXPECT_FALSE(generic.supports(cpu, policy));
}

TEST(QConv2dKernels, PlansNameTheirPathAndReplayTheirRecords) {
  const ExecutionPolicy policy;
  const Kernel& mma = qconv_kernel("int8_mma");
  const Kernel& generic = qconv_kernel("cuda_raw");
  // Few output tiles: the 64 x 64 pipelined tiles, the reduction split (9 steps of 64 bytes: 2 ranges, each at least
  // 4 steps); many: the 128 x 128 ones, unsplit.
  const OpDescriptor small = qconv_desc({1, 7, 7, 64}, {64, 3, 3, 64}, true);
  const auto small_plan = mma.build(small, policy, "");
  EXPECT_NE(small_plan->describe().find("pipelined"), std::string::npos) << small_plan->describe();
  EXPECT_NE(small_plan->describe().find("64x64 tiles, NHWC, reduction split in 2"), std::string::npos)
      << small_plan->describe();
  EXPECT_EQ(small_plan->record(), R"({"path":"pipelined_64","splits":2})");
  // alpha and the folded bias (64 * 4 bytes each, 256-aligned), the split's int32 sums (49 x 64) and one counter
  EXPECT_EQ(small_plan->workspace_bytes(), 512u + 12544u + 256u);
  EXPECT_EQ(mma.tactics(small, policy),
            (std::vector<std::string>{R"({"path":"pipelined_64"})", R"({"path":"pipelined","splits":2})",
                                      R"({"path":"tensor_core"})", R"({"path":"tensor_core_64"})"}));
  EXPECT_EQ(mma.build(small, policy, R"({"path": "pipelined_64"})")->workspace_bytes(), 512u);
  const OpDescriptor large = qconv_desc({32, 56, 56, 64}, {256, 1, 1, 64}, true);
  EXPECT_NE(mma.build(large, policy, "")->describe().find("128x128 tiles"), std::string::npos);
  EXPECT_EQ(mma.build(large, policy, "")->record(), R"({"path":"pipelined"})");
  EXPECT_EQ(mma.tactics(large, policy),
            (std::vector<std::string>{R"({"path":"pipelined_64"})", R"({"path":"tensor_core"})",
                                      R"({"path":"tensor_core_64"})"}));
  EXPECT_NE(mma.build(large, policy, R"({"path": "tensor_core_64"})")->describe().find("64x64"), std::string::npos);
  // A split count is an integer 1..32.
  XPURT_EXPECT_THROW_WITH(mma.build(large, policy, R"({"path": "pipelined", "splits": 0})"), InvalidArgumentError,
                          "'splits' must be an integer 1..32");
  XPURT_EXPECT_THROW_WITH(mma.build(large, policy, R"({"path": "pipelined", "splits": "4"})"), InvalidArgumentError,
                          "'splits' must be an integer 1..32");
  // The generic kernel: tiles for a plain convolution, one thread per output for a depthwise one.
  const OpDescriptor plain = qconv_desc({1, 32, 9, 9}, {48, 32, 3, 3}, false);
  EXPECT_EQ(generic.build(plain, policy, "")->record(), R"({"path":"tiled"})");
  const OpDescriptor depthwise = qconv_desc({1, 32, 9, 9}, {32, 1, 3, 3}, false, 32);
  EXPECT_EQ(generic.build(depthwise, policy, "")->record(), R"({"path":"direct"})");
  EXPECT_EQ(generic.tactics(depthwise, policy), std::vector<std::string>{R"({"path":"tiled"})"});
  // Records of the other kernel, unknown paths and malformed text.
  XPURT_EXPECT_THROW_WITH(generic.build(plain, policy, R"({"path": "tensor_core"})"), UnsupportedOperationError,
                          "int8_mma kernel's");
  XPURT_EXPECT_THROW_WITH(generic.build(plain, policy, R"({"path": "fast"})"), InvalidArgumentError, "unknown path");
  XPURT_EXPECT_THROW_WITH(generic.build(plain, policy, "path=tiled"), InvalidArgumentError, "invalid plan record");
}

#else  // !XPURT_WITH_CUDA

TEST(QConv2dKernels, ABuildWithoutCudaSaysSo) {
  for (const char* name : {"int8_mma", "cuda_raw"}) {
    OpDescriptor desc;
    desc.op = "qconv2d";
    desc.device = Device::cuda(0);
    const Support support = qconv_kernel(name).supports(desc, ExecutionPolicy());
    EXPECT_FALSE(support);
    EXPECT_NE(support.reason().find("without CUDA"), std::string::npos) << support.reason();
  }
}

#endif  // XPURT_WITH_CUDA

}  // namespace
}  // namespace xpuruntime
