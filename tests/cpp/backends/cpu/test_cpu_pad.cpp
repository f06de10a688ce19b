// The cpu kernel of 'pad' in reflect, edge and wrap modes (pad_fast, cpu_pad.cpp; Note [Pad by rows]) through the
// registry: on random inputs of ranks 1-5 and dtypes of every element size, its bits against the ONNX reference
// library's Pad (onnx_ref::run_node, the path the kernel takes where pad_fast declines) and against numpy's modes
// written here as index maps; the same bits on 1 and 2 threads; and the cases pad_fast leaves to the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/node_kernels.h"
#include "core/shape_str.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

// Random elements of `dtype`: finite floats (so that no NaN payload question arises), any integer, 0/1 bools.
Tensor random_tensor(const Shape& shape, DType dtype, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> real(-100.0f, 100.0f);
  Tensor t = Tensor::empty(shape, dtype);
  const std::int64_t n = t.numel();
  void* p = t.data_ptr();
  for (std::int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat32:
        static_cast<float*>(p)[i] = real(rng);
        break;
      case DType::kFloat64:
        static_cast<double*>(p)[i] = static_cast<double>(real(rng)) / 3.0;
        break;
      case DType::kFloat16:
        static_cast<std::uint16_t*>(p)[i] = detail::float_to_half(real(rng));
        break;
      case DType::kBool:
        static_cast<bool*>(p)[i] = (rng() & 1) != 0;
        break;
      default: {
        const std::uint64_t bits = rng();
        std::memcpy(static_cast<char*>(p) + i * static_cast<std::int64_t>(t.element_size()), &bits,
                    t.element_size());
      }
    }
  }
  return t;
}

Tensor int64_vector(const Shape& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::kInt64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(std::int64_t));
  return t;
}

OpDescriptor describe_pad(const Tensor& x, const Shape& pads, const std::string& mode, double value = 0.0) {
  OpDescriptor desc;
  desc.op = "pad";
  desc.inputs.push_back(TensorDesc::of(x));
  desc.attrs.set("pads", pads).set("mode", mode).set("value", value);
  desc.device = x.device();
  KernelRegistry::global().infer(desc);
  return desc;
}

// The cpu kernel of 'pad' into `y` (a fresh output when undefined).
Tensor run_pad(const Tensor& x, const Shape& pads, const std::string& mode, int threads = 0, Tensor y = Tensor(),
               double value = 0.0) {
  ExecutionPolicy policy;
  policy.intra_op_threads = threads;
  const OpDescriptor desc = describe_pad(x, pads, mode, value);
  const Kernel* kernel = KernelRegistry::global().find_kernel("pad", "cpu");
  if (kernel == nullptr) throw InvalidArgumentError("no cpu kernel for pad");
  const Support support = kernel->supports(desc, policy);
  if (!support) throw UnsupportedOperationError(support.reason());
  auto plan = kernel->build(desc, policy, "");
  std::vector<Tensor> outputs{y.defined() ? y : Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype)};
  plan->execute(desc, {x}, outputs);
  return outputs[0];
}

// The ONNX reference library's Pad (opset 21: pads as an input).
Tensor reference_pad(const Tensor& x, const Shape& pads, const std::string& mode) {
  Node node;
  node.op_type = "Pad";
  node.name = "pad";
  node.inputs = {"x", "pads"};
  node.outputs = {"y"};
  node.attrs.set("mode", mode);
  return onnx_ref::run_node(node, 21, {x, int64_vector(pads)}).at(0);
}

// numpy's modes written independently of both: reflect mirrors again and again (numpy pads wide pads in rounds).
std::int64_t numpy_source(std::int64_t i, std::int64_t n, const std::string& mode) {
  if (mode == "edge") return std::min(std::max<std::int64_t>(i, 0), n - 1);
  if (mode == "wrap") return ((i % n) + n) % n;
  if (n == 1) return 0;
  while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
  return i;
}

Tensor naive_pad(const Tensor& x, const Shape& pads, const std::string& mode) {
  const std::size_t rank = x.shape().size();
  Shape out_shape(rank);
  for (std::size_t d = 0; d < rank; ++d) out_shape[d] = x.shape()[d] + pads[d] + pads[d + rank];
  Tensor y = Tensor::empty(out_shape, x.dtype());
  const auto es = static_cast<std::int64_t>(x.element_size());
  Shape idx(rank, 0);
  for (std::int64_t linear = 0; linear < y.numel(); ++linear) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      offset = offset * x.shape()[d] + numpy_source(idx[d] - pads[d], x.shape()[d], mode);
    }
    std::memcpy(static_cast<char*>(y.data_ptr()) + linear * es, static_cast<const char*>(x.data_ptr()) + offset * es,
                static_cast<std::size_t>(es));
    for (std::size_t d = rank; d-- > 0;) {
      if (++idx[d] < out_shape[d]) break;
      idx[d] = 0;
    }
  }
  return y;
}

std::vector<unsigned char> bytes(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  return std::vector<unsigned char>(p, p + t.nbytes());
}

std::string describe_case(const Shape& shape, const Shape& pads, const std::string& mode, DType dtype) {
  return detail::str_cat(mode, " ", dtype_name(dtype), " x ", detail::shape_str(shape), " pads ",
                         detail::shape_str(pads));
}

// Each case in every dtype: the kernel, the reference library and the naive loops agree bit for bit.
void expect_all_agree(const Shape& shape, const Shape& pads, const std::vector<std::string>& modes, unsigned seed) {
  for (const DType dtype : {DType::kFloat32, DType::kInt64, DType::kUInt8, DType::kFloat16, DType::kBool}) {
    const Tensor x = random_tensor(shape, dtype, seed);
    for (const std::string& mode : modes) {
      const std::string what = describe_case(shape, pads, mode, dtype);
      const Tensor y = run_pad(x, pads, mode);
      const Tensor expected = reference_pad(x, pads, mode);
      ASSERT_EQ(y.shape(), expected.shape()) << what;
      EXPECT_EQ(y.dtype(), dtype) << what;
      EXPECT_EQ(bytes(y), bytes(expected)) << what;
      EXPECT_EQ(bytes(y), bytes(naive_pad(x, pads, mode))) << what;
    }
  }
}

const std::vector<std::string> kAllModes = {"reflect", "edge", "wrap"};

TEST(CpuPad, Rank1) {
  expect_all_agree({7}, {3, 6}, kAllModes, 1);  // 6 = dim - 1
  expect_all_agree({2}, {1, 1}, kAllModes, 2);
  expect_all_agree({1}, {4, 5}, {"edge", "wrap"}, 3);
  expect_all_agree({5}, {0, 0}, kAllModes, 4);
}

TEST(CpuPad, Rank2And3) {
  expect_all_agree({5, 9}, {0, 8, 4, 0}, kAllModes, 10);  // dim - 1 on both axes, 0 on the others
  expect_all_agree({3, 4, 5}, {2, 0, 1, 1, 3, 4}, kAllModes, 11);
  expect_all_agree({2, 1, 6}, {1, 0, 2, 0, 0, 5}, kAllModes, 12);  // a 1-wide axis without pads
}

TEST(CpuPad, Rank4And5) {
  expect_all_agree({2, 3, 6, 7}, {0, 0, 5, 6, 0, 0, 5, 6}, kAllModes, 20);
  expect_all_agree({2, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 0, 1, 2, 3, 4}, kAllModes, 21);
  expect_all_agree({2, 2, 3, 2, 3}, {1, 0, 2, 1, 2, 0, 1, 0, 1, 2}, kAllModes, 22);
  expect_all_agree({1, 2, 3, 2, 3}, {0, 0, 2, 1, 2, 0, 1, 0, 1, 2}, kAllModes, 23);  // a 1-wide leading axis
}

// Pads wider than the axis: edge repeats, wrap goes round again, reflect mirrors again (numpy, as the reference).
TEST(CpuPad, PadsWiderThanTheAxis) {
  expect_all_agree({3, 4}, {7, 9, 10, 5}, kAllModes, 30);
  expect_all_agree({2, 3}, {5, 11, 6, 8}, kAllModes, 31);
  expect_all_agree({3}, {20, 13}, kAllModes, 32);
}

// Negative pads crop (the schema's "negative crops"), alone or beside padding on the other side or axis.
TEST(CpuPad, NegativePadsCrop) {
  expect_all_agree({6, 8}, {-2, 3, 1, -3}, kAllModes, 40);
  expect_all_agree({6, 8}, {2, -3, -1, 4}, kAllModes, 41);
  expect_all_agree({3, 5, 7}, {-1, 0, -2, -1, 2, 3}, kAllModes, 42);
  expect_all_agree({4, 5}, {-2, 0, -2, 0}, kAllModes, 43);  // an empty output
}

// Trailing unpadded axes merge into the copied unit: units of 8 bytes, 3 bytes, 84 bytes and whole rows.
TEST(CpuPad, UnpaddedTrailingAxes) {
  expect_all_agree({5, 2}, {1, 0, 2, 0}, kAllModes, 50);
  expect_all_agree({5, 3}, {2, 0, 4, 0}, kAllModes, 51);
  expect_all_agree({5, 7, 3}, {4, 0, 0, 3, 0, 0}, kAllModes, 52);
  expect_all_agree({3, 4, 300}, {0, 2, 0, 0, 3, 0}, kAllModes, 53);
}

// Element sizes the other cases do not take: int8 (1), bfloat16 (2), int32 (4), float64 (8).
TEST(CpuPad, OtherDtypes) {
  for (const DType dtype : {DType::kInt8, DType::kBFloat16, DType::kInt32, DType::kFloat64}) {
    const Tensor x = random_tensor({3, 5, 6}, dtype, 60);
    const Shape pads = {1, 2, 4, 2, 1, 5};
    for (const std::string& mode : kAllModes) {
      const std::string what = describe_case(x.shape(), pads, mode, dtype);
      EXPECT_EQ(bytes(run_pad(x, pads, mode)), bytes(reference_pad(x, pads, mode))) << what;
      EXPECT_EQ(bytes(run_pad(x, pads, mode)), bytes(naive_pad(x, pads, mode))) << what;
    }
  }
}

// Outputs large enough to split across threads: the same bits on 1 and 2 threads, and the reference's.
TEST(CpuPad, SameBitsOnOneAndTwoThreads) {
  struct Case {
    Shape shape, pads;
    std::string mode;
  };
  const Case cases[] = {
      {{1, 67, 131, 137}, {0, 0, 3, 5, 0, 0, 7, 2}, "reflect"},
      {{3, 5, 31, 37, 41}, {0, 1, 2, 3, 4, 0, 1, 2, 3, 4}, "edge"},
      {{64, 300}, {5, 7, 9, 3}, "wrap"},
      {{100000}, {17, 23}, "reflect"},
      {{200, 3, 50}, {30, 0, 0, 40, 0, 0}, "edge"},
  };
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.shape, DType::kFloat32, 70);
    const std::string what = describe_case(c.shape, c.pads, c.mode, DType::kFloat32);
    const auto one = bytes(run_pad(x, c.pads, c.mode, 1));
    const auto two = bytes(run_pad(x, c.pads, c.mode, 2));
    EXPECT_EQ(one, two) << what;
    EXPECT_EQ(one, bytes(reference_pad(x, c.pads, c.mode))) << what;
  }
}

// What pad_fast leaves to the reference still comes out right: constant mode with negative pads (pad_constant
// declines too) and an output over the input's own memory (the reference writes a fresh tensor, then copies).
TEST(CpuPad, DeclinedCasesRunTheReference) {
  const Tensor x = random_tensor({4, 6}, DType::kFloat32, 80);
  const Shape crop = {-1, 2, 1, -3};
  Tensor expected = Tensor::zeros({4, 5}, DType::kFloat32);  // rows 1-3 of x, columns 0-2, at column 2; zeros
  const auto* in = static_cast<const float*>(x.data_ptr());
  auto* out = static_cast<float*>(expected.data_ptr());
  for (std::int64_t i = 0; i < 3; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) out[i * 5 + j + 2] = in[(i + 1) * 6 + j];
  }
  EXPECT_EQ(bytes(run_pad(x, crop, "constant")), bytes(expected));

  // y = rows 0-1 of x written over rows 1-2: row by row in place, y's row 1 would read x's row 1 overwritten.
  const Tensor source = random_tensor({4, 6}, DType::kFloat32, 81);
  const Tensor expected_rows = reference_pad(source, {0, 0, -2, 0}, "edge");
  Tensor aliased = Tensor::from_blob(static_cast<float*>(source.data_ptr()) + 6, {2, 6}, {}, DType::kFloat32,
                                     Device::cpu(), nullptr);
  run_pad(source, {0, 0, -2, 0}, "edge", 0, aliased);
  EXPECT_EQ(bytes(aliased), bytes(expected_rows));
}

// The op schema rejects what the reference cannot pad, before any kernel runs.
TEST(CpuPad, SchemaRejectsPaddedEmptyAndOneWideReflect) {
  EXPECT_THROW(describe_pad(Tensor::empty({0, 3}, DType::kFloat32), {1, 0, 0, 0}, "edge"), XpuRuntimeError);
  EXPECT_THROW(describe_pad(Tensor::empty({1, 3}, DType::kFloat32), {1, 0, 0, 0}, "reflect"), XpuRuntimeError);
}

}  // namespace
}  // namespace xpuruntime
