// qconv2d in layout NHWC (Note [Quantized registry ops] in core/op_schemas.cpp): the schema's shapes and checks, and
// the cpu kernel's NHWC (through NCHW copies) equal to its NCHW bit for bit at odd shapes, groups, depthwise, strides,
// pads, dilations, int8 and uint8 x with zero points and every output dtype: the reference of the GPU kernels'
// channels-last paths (tests/cpp/backends/cuda_raw/test_quant_conv.cpp) and of the nhwc_layout pass's int8
// convolutions.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
using Ints = std::vector<std::int64_t>;

Tensor random_bytes(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_int_distribution<int> dist(0, 255);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<std::uint8_t>(dist(rng));
  return t;
}

// A contiguous copy of the 4-D tensor `t` with its dims permuted by `perm`.
Tensor permuted(const Tensor& t, const std::vector<int>& perm) {
  const Shape& s = t.shape();
  const Shape out_shape = {s[perm[0]], s[perm[1]], s[perm[2]], s[perm[3]]};
  Tensor out = Tensor::empty(out_shape, t.dtype());
  const std::size_t size = dtype_size(t.dtype());
  const Shape& st = t.strides();
  const auto* from = static_cast<const std::uint8_t*>(t.data_ptr());
  auto* to = static_cast<std::uint8_t*>(out.data_ptr());
  std::int64_t i = 0;
  for (std::int64_t a = 0; a < out_shape[0]; ++a) {
    for (std::int64_t b = 0; b < out_shape[1]; ++b) {
      for (std::int64_t c = 0; c < out_shape[2]; ++c) {
        for (std::int64_t d = 0; d < out_shape[3]; ++d, ++i) {
          const std::int64_t offset = a * st[perm[0]] + b * st[perm[1]] + c * st[perm[2]] + d * st[perm[3]];
          std::memcpy(to + i * size, from + offset * size, size);
        }
      }
    }
  }
  return out;
}

const std::vector<int> kToNhwc = {0, 2, 3, 1};  // [N, C, H, W] -> [N, H, W, C]; [O, I, kh, kw] -> [O, kh, kw, I]

struct Case {
  std::int64_t n, c, h, w, o, kh, kw, groups;
  Ints strides, pads, dilations;
  DType x_dtype;
  std::int64_t x_zero_point;
  std::string output;
  bool int_bias;
};

TEST(QConv2dNhwc, TheCpuKernelGivesTheNchwBitsInEitherLayout) {
  const std::vector<Case> cases = {
      {1, 5, 6, 7, 7, 1, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, DType::kInt8, 0, "float32", false},
      {2, 16, 9, 8, 24, 3, 3, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}, DType::kInt8, -3, "int8", false},
      {3, 3, 17, 15, 16, 7, 7, 1, {2, 2}, {3, 3, 3, 3}, {1, 1}, DType::kUInt8, 128, "uint8", true},
      {1, 8, 11, 10, 20, 3, 3, 1, {1, 2}, {1, 0, 2, 1}, {2, 2}, DType::kInt8, 5, "float16", true},
      {2, 12, 9, 9, 40, 3, 3, 2, {2, 2}, {1, 1, 1, 1}, {1, 1}, DType::kUInt8, 200, "int8", false},
      {2, 24, 10, 9, 24, 3, 3, 24, {1, 1}, {1, 1, 1, 1}, {1, 1}, DType::kUInt8, 77, "uint8", false},
      {1, 6, 8, 8, 10, 3, 3, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}, DType::kUInt8, 131, "int32", true},
  };
  std::mt19937 rng(45);
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.c) + " -> " + std::to_string(k.o) + " " + std::to_string(k.kh) + "x" +
                 std::to_string(k.kw) + ", groups " + std::to_string(k.groups) + ", output " + k.output);
    const Tensor x = random_bytes({k.n, k.c, k.h, k.w}, k.x_dtype, rng);
    const Tensor w = random_bytes({k.o, k.c / k.groups, k.kh, k.kw}, DType::kInt8, rng);
    const bool raw = k.output == "int32";
    Tensor w_scale, bias;
    if (!raw) {
      w_scale = Tensor::empty({k.o}, DType::kFloat32);
      for (std::int64_t i = 0; i < k.o; ++i) static_cast<float*>(w_scale.data_ptr())[i] = 0.001f * (1 + i % 7);
    }
    bias = Tensor::empty({k.o}, k.int_bias ? DType::kInt32 : DType::kFloat32);
    for (std::int64_t i = 0; i < k.o; ++i) {
      if (k.int_bias) {
        static_cast<std::int32_t*>(bias.data_ptr())[i] = static_cast<std::int32_t>(i * 997 % 4001) - 2000;
      } else {
        static_cast<float*>(bias.data_ptr())[i] = 0.25f * static_cast<float>(i % 9) - 1.0f;
      }
    }
    if (raw && !k.int_bias) bias = Tensor();
    Attributes attrs;
    attrs.set("strides", k.strides).set("pads", k.pads).set("dilations", k.dilations).set("groups", k.groups);
    attrs.set("x_zero_point", k.x_zero_point).set("output_dtype", k.output);
    if (!raw) attrs.set("x_scale", 0.03).set("activation", std::string("relu"));
    if (k.output == "int8" || k.output == "uint8") {
      attrs.set("y_scale", 0.9).set("y_zero_point", static_cast<std::int64_t>(k.output == "int8" ? 3 : 100));
    }
    const Tensor nchw = ops::call("qconv2d", {x, w, w_scale, bias}, attrs).at(0);
    attrs.set("layout", std::string("NHWC"));
    const Tensor nhwc = ops::call("qconv2d", {permuted(x, kToNhwc), permuted(w, kToNhwc), w_scale, bias}, attrs).at(0);
    const Tensor expected = permuted(nchw, kToNhwc);
    ASSERT_EQ(nhwc.shape(), expected.shape());
    ASSERT_EQ(nhwc.dtype(), expected.dtype());
    EXPECT_EQ(std::memcmp(nhwc.data_ptr(), expected.data_ptr(), expected.nbytes()), 0);
  }
}

TEST(QConv2dNhwc, TheSchemaInfersChannelsLastShapes) {
  OpDescriptor desc;
  desc.op = "qconv2d";
  desc.device = Device::cpu();
  desc.inputs = {TensorDesc::contiguous({2, 9, 7, 32}, DType::kUInt8, Device::cpu()),
                 TensorDesc::contiguous({48, 3, 3, 16}, DType::kInt8, Device::cpu()),
                 TensorDesc::contiguous({48}, DType::kFloat32, Device::cpu()), TensorDesc()};
  desc.attrs.set("layout", std::string("NHWC")).set("groups", static_cast<std::int64_t>(2)).set("strides", Ints{2, 1});
  desc.attrs.set("pads", Ints{1, 1, 1, 1}).set("x_scale", 0.1).set("output_dtype", std::string("int8"));
  desc.attrs.set("y_scale", 0.2);
  KernelRegistry::global().infer(desc);
  ASSERT_EQ(desc.outputs.size(), 1u);
  EXPECT_EQ(desc.outputs[0].shape, (Shape{2, 5, 7, 48}));
  EXPECT_EQ(desc.outputs[0].dtype, DType::kInt8);
  // A weight of the other layout: 3 input channels per group against x's 32 / 2.
  OpDescriptor wrong = desc;
  wrong.inputs[1] = TensorDesc::contiguous({48, 16, 3, 3}, DType::kInt8, Device::cpu());
  EXPECT_THROW(KernelRegistry::global().infer(wrong), InvalidArgumentError);
  OpDescriptor layout = desc;
  layout.attrs.set("layout", std::string("NWHC"));
  XPURT_EXPECT_THROW_WITH(KernelRegistry::global().infer(layout), InvalidArgumentError, "'layout'");
}

}  // namespace
}  // namespace xpuruntime
