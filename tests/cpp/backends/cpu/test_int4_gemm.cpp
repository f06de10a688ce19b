// matmul_nbits' cpu kernel (Note [Int4 weight-only GEMM] in core/op_schemas_int4.cpp) against the com.microsoft
// MatMulNBits node kernel, which it must reproduce bit for bit: with and without zero points and bias, block sizes
// 16, 32 and 128, K a multiple of the block or not (the last block padded), M = 1, 3 and 17, float32, float16 and
// bfloat16 x (the scales in x's dtype, as MatMulNBits has them, and float32); then the schema's refusals.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/ops.h"
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

// MatMulNBits (A, B, scales, zero_points, g_idx, bias) with the given inputs present.
Node matmul_nbits_node(std::int64_t k, std::int64_t n, std::int64_t block, bool zero_points, bool bias) {
  Node node;
  node.name = "mm";
  node.op_type = "MatMulNBits";
  node.domain = "com.microsoft";
  node.inputs = {"a", "b", "scales", zero_points ? "zp" : "", "", bias ? "bias" : ""};
  node.outputs = {"y"};
  node.attrs.set("K", k).set("N", n).set("bits", std::int64_t{4}).set("block_size", block);
  return node;
}

// The same memory as `shape` (a contiguous tensor).
Tensor reshaped(const Tensor& t, const Shape& shape) {
  return Tensor::from_blob(t.data_ptr(), shape, {}, t.dtype(), t.device(), t.storage());
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << what;
}

struct Case {
  std::int64_t m, k, n, block;
  bool zero_points, bias;
};

TEST(Int4Gemm, CpuKernelMatchesTheMatMulNBitsNodeKernelBitForBit) {
  const Case cases[] = {
      {1, 64, 8, 16, true, false},   {3, 40, 5, 16, true, true},    {17, 48, 7, 16, false, true},
      {1, 96, 6, 32, false, false},  {3, 100, 9, 32, true, false},  {17, 256, 4, 32, true, true},
      {1, 300, 3, 128, true, true},  {3, 128, 10, 128, false, true}, {17, 200, 5, 128, true, false},
  };
  std::mt19937 gen(11);
  for (const Case& c : cases) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (bool float_scales : {false, true}) {
        const std::int64_t blocks = (c.k + c.block - 1) / c.block;
        const std::string what = "m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " +
                                 std::to_string(c.n) + " block " + std::to_string(c.block) + " " +
                                 std::string(dtype_name(dtype)) + (float_scales ? " float32 scales" : "") +
                                 (c.zero_points ? " zero points" : "") + (c.bias ? " bias" : "");
        const Tensor x = random_float({c.m, c.k}, dtype, -2.0f, 2.0f, gen);
        const Tensor w = random_bytes({c.n, blocks, c.block / 2}, gen);
        const Tensor scales =
            random_float({c.n, blocks}, float_scales ? DType::kFloat32 : dtype, 0.01f, 0.2f, gen);
        const Tensor zp = c.zero_points ? random_bytes({c.n, (blocks + 1) / 2}, gen) : Tensor();
        const Tensor bias = c.bias ? random_float({c.n}, dtype, -1.0f, 1.0f, gen) : Tensor();
        const Tensor want = onnx_ref::run_node(matmul_nbits_node(c.k, c.n, c.block, c.zero_points, c.bias), 1,
                                               {x, w, scales, zp, Tensor(), bias})[0];
        const Attributes attrs = Attributes().set("block_size", c.block);
        const Tensor got = ops::call("matmul_nbits", {x, w, scales, zp, bias}, attrs)[0];
        expect_same_bits(got, want, what);
        // MatMulNBits' flat scales [N * n_blocks] and zero points are the same op.
        const Tensor flat = ops::call("matmul_nbits",
                                      {x, w, reshaped(scales, {c.n * blocks}),
                                       c.zero_points ? reshaped(zp, {zp.numel()}) : Tensor(), bias},
                                      attrs)[0];
        expect_same_bits(flat, want, what + " (flat)");
      }
    }
  }
}

TEST(Int4Gemm, LeadingDimsOfXAreKept) {
  std::mt19937 gen(12);
  const Tensor x = random_float({2, 3, 40}, DType::kFloat32, -1.0f, 1.0f, gen);
  const Tensor w = random_bytes({6, 2, 16}, gen);
  const Tensor scales = random_float({6, 2}, DType::kFloat32, 0.01f, 0.1f, gen);
  const Tensor y = ops::call("matmul_nbits", {x, w, scales}, Attributes().set("block_size", std::int64_t{32}))[0];
  EXPECT_EQ(y.shape(), (Shape{2, 3, 6}));
  const Tensor want = onnx_ref::run_node(matmul_nbits_node(40, 6, 32, false, false), 1, {x, w, scales})[0];
  expect_same_bits(y, want, "rank 3");
}

TEST(Int4Gemm, SchemaRefusesWhatItDoesNotTake) {
  std::mt19937 gen(13);
  const Tensor x = random_float({2, 40}, DType::kFloat32, -1.0f, 1.0f, gen);
  const Tensor w = random_bytes({6, 3, 8}, gen);
  const Tensor scales = random_float({6, 3}, DType::kFloat32, 0.01f, 0.1f, gen);
  const Attributes block16 = Attributes().set("block_size", std::int64_t{16});
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {x, random_bytes({6, 2, 8}, gen), scales}, block16),
                          InvalidArgumentError, "must be [N, 3, 8]");
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {x, w, scales}, Attributes().set("block_size", std::int64_t{24})),
                          InvalidArgumentError, "power of two >= 16");
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {x, w, scales}), InvalidArgumentError, "block_size");
  const Attributes bits8 = Attributes().set("block_size", std::int64_t{16}).set("bits", std::int64_t{8});
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {x, w, scales}, bits8), InvalidArgumentError, "bits must be 4");
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {x, w, ops::cast(scales, DType::kFloat16)}, block16),
                          InvalidTypeError, "float32 or x's dtype");
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {x, w, random_float({6, 2}, DType::kFloat32, 0, 1, gen)}, block16),
                          InvalidArgumentError, "'scales' must have shape [6, 3]");
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {x, w, scales, random_bytes({6, 1}, gen)}, block16),
                          InvalidArgumentError, "'zero_points' must have shape [6, 2]");
  XPURT_EXPECT_THROW_WITH(
      ops::call("matmul_nbits", {x, w, scales, Tensor(), random_float({5}, DType::kFloat32, 0, 1, gen)}, block16),
      InvalidArgumentError, "bias must have shape [6]");
  XPURT_EXPECT_THROW_WITH(ops::call("matmul_nbits", {ops::cast(x, DType::kFloat64), w, scales}, block16),
                          InvalidTypeError, "float32, float16 or bfloat16");
}

}  // namespace
}  // namespace xpuruntime
