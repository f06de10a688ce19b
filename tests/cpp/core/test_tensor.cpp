#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "test_utils.h"
#include "xpuruntime/dlpack.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

Tensor iota_tensor(const std::vector<std::int64_t>& shape) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  auto* p = static_cast<float*>(t.data_ptr());
  std::iota(p, p + t.numel(), 0.0f);
  return t;
}

// A view of `base` with permuted dimensions (no copy).
Tensor permuted(const Tensor& base, const std::vector<int>& order) {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  for (int i : order) {
    shape.push_back(base.shape()[static_cast<std::size_t>(i)]);
    strides.push_back(base.strides()[static_cast<std::size_t>(i)]);
  }
  return Tensor::from_blob(base.data_ptr(), shape, strides, base.dtype(), base.device(), base.storage());
}

float at(const Tensor& t, std::initializer_list<std::int64_t> index) {
  std::int64_t off = 0;
  std::size_t i = 0;
  for (std::int64_t v : index) off += v * t.strides()[i++];
  return static_cast<const float*>(t.data_ptr())[off];
}

TEST(Tensor, EmptyZerosAndProperties) {
  Tensor t = Tensor::zeros({2, 3, 5}, DType::kFloat16);
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(t.strides(), (std::vector<std::int64_t>{15, 5, 1}));
  EXPECT_TRUE(t.is_contiguous());
  const auto* p = static_cast<const std::uint16_t*>(t.data_ptr());
  for (int i = 0; i < 30; ++i) EXPECT_EQ(p[i], 0);
  EXPECT_EQ(t.str(), "Tensor(shape=[2, 3, 5], dtype=float16, device=cpu)");
  Tensor scalar = Tensor::empty({}, DType::kInt64);
  EXPECT_EQ(scalar.numel(), 1);
  Tensor none = Tensor::empty({0, 4}, DType::kFloat32);
  EXPECT_EQ(none.numel(), 0);
  XPURT_EXPECT_THROW_WITH(Tensor::empty({2, -1}, DType::kFloat32), InvalidArgumentError, "[2, -1]");
}

TEST(Tensor, ContiguousCopiesOfPermutedViewsAtOddShapes) {
  for (auto shape : std::vector<std::vector<std::int64_t>>{{3, 5, 7}, {1, 9, 2}, {4, 1, 13}, {2, 2, 2}}) {
    Tensor base = iota_tensor(shape);
    Tensor view = permuted(base, {2, 0, 1});
    EXPECT_FALSE(view.is_contiguous() && shape[2] > 1);
    Tensor dense = view.contiguous();
    ASSERT_TRUE(dense.is_contiguous());
    for (std::int64_t a = 0; a < view.shape()[0]; ++a)
      for (std::int64_t b = 0; b < view.shape()[1]; ++b)
        for (std::int64_t c = 0; c < view.shape()[2]; ++c) ASSERT_EQ(at(dense, {a, b, c}), at(base, {b, c, a}));
  }
}

TEST(Tensor, CopyFromChecksDtypeAndShape) {
  Tensor a = Tensor::zeros({2, 3}, DType::kFloat32);
  XPURT_EXPECT_THROW_WITH(a.copy_from(Tensor::zeros({3, 2}, DType::kFloat32)), InvalidArgumentError, "[3, 2]");
  XPURT_EXPECT_THROW_WITH(a.copy_from(Tensor::zeros({2, 3}, DType::kInt32)), InvalidTypeError, "int32");
  Tensor src = iota_tensor({2, 3});
  a.copy_from(src);
  EXPECT_EQ(at(a, {1, 2}), 5.0f);
  Tensor t = permuted(a, {1, 0});
  t.zero_();
  EXPECT_EQ(at(a, {1, 2}), 0.0f);
}

TEST(Tensor, CpuToCpuIsTheSameTensorAndCudaWithoutGpuIsTypedError) {
  Tensor a = iota_tensor({4});
  Tensor b = a.to(Device::cpu());
  EXPECT_EQ(a.data_ptr(), b.data_ptr());
  if (DeviceManager::instance().get_device_count() == 0) {
    XPURT_EXPECT_THROW_WITH(a.to(Device::cuda(0)), CudaError, "no CUDA device is available");
    XPURT_EXPECT_THROW_WITH(Tensor::empty({2}, DType::kFloat32, Device::cuda(0)), CudaError, "cuda:0");
  }
}

TEST(DLPack, RoundTripSharesMemoryAndCallsTheDeleterOnce) {
  Tensor a = iota_tensor({3, 4});
  DLManagedTensor* m = to_dlpack(a);
  EXPECT_EQ(m->dl_tensor.data, a.data_ptr());
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(m->dl_tensor.strides[0], 4);
  Tensor b = from_dlpack(m);
  EXPECT_EQ(b.data_ptr(), a.data_ptr());
  EXPECT_EQ(b.shape(), a.shape());

  DLManagedTensorVersionedV1* v = to_dlpack_versioned(permuted(a, {1, 0}));
  EXPECT_EQ(v->version.major, 1u);
  Tensor c = from_dlpack_versioned(v);
  EXPECT_EQ(c.strides(), (std::vector<std::int64_t>{1, 4}));
  EXPECT_EQ(at(c, {3, 2}), 11.0f);
}

struct CountingContext {
  int deleted = 0;
  std::vector<std::int64_t> shape{2, 2};
  float data[4] = {1, 2, 3, 4};
  DLManagedTensor managed{};
};

TEST(DLPack, ImportErrorsStillRunTheDeleter) {
  CountingContext ctx;
  ctx.managed.dl_tensor.data = ctx.data;
  ctx.managed.dl_tensor.device = {kDLOpenCL, 0};
  ctx.managed.dl_tensor.ndim = 2;
  ctx.managed.dl_tensor.dtype = {kDLFloat, 32, 1};
  ctx.managed.dl_tensor.shape = ctx.shape.data();
  ctx.managed.manager_ctx = &ctx;
  ctx.managed.deleter = [](DLManagedTensor* self) { static_cast<CountingContext*>(self->manager_ctx)->deleted++; };
  XPURT_EXPECT_THROW_WITH(from_dlpack(&ctx.managed), InvalidTypeError, "device type 4");
  EXPECT_EQ(ctx.deleted, 1);
  ctx.managed.dl_tensor.device = {kDLCPU, 0};
  ctx.managed.dl_tensor.dtype = {kDLComplex, 64, 1};
  XPURT_EXPECT_THROW_WITH(from_dlpack(&ctx.managed), InvalidTypeError, "unsupported dtype");
  EXPECT_EQ(ctx.deleted, 2);
  ctx.managed.dl_tensor.dtype = {kDLFloat, 32, 1};
  {
    Tensor t = from_dlpack(&ctx.managed);
    EXPECT_EQ(at(t, {1, 1}), 4.0f);
    EXPECT_EQ(ctx.deleted, 2);
  }
  EXPECT_EQ(ctx.deleted, 3);
}

TEST(TensorGpu, RoundTripsThroughTheDeviceAtOddShapes) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (auto shape : std::vector<std::vector<std::int64_t>>{{1}, {7, 13}, {3, 1, 129}, {2, 3, 5, 7}}) {
    Tensor host = Tensor::empty(shape, DType::kFloat32);
    auto* p = static_cast<float*>(host.data_ptr());
    std::uniform_real_distribution<float> dist(-1, 1);
    for (std::int64_t i = 0; i < host.numel(); ++i) p[i] = dist(rng);
    Tensor gpu = host.to(Device::cuda(0));
    EXPECT_TRUE(gpu.device().is_cuda());
    Tensor back = gpu.to(Device::cpu());
    ASSERT_EQ(std::memcmp(back.data_ptr(), host.data_ptr(), host.nbytes()), 0);
    // Non-contiguous in both directions.
    std::vector<int> order(shape.size());
    std::iota(order.rbegin(), order.rend(), 0);
    Tensor t_host = permuted(host, order);
    Tensor t_gpu = t_host.to(Device::cuda(0));  // dense: keeps the strides
    EXPECT_EQ(t_gpu.strides(), t_host.strides());
    Tensor t_back = t_gpu.to(Device::cpu()).contiguous();
    Tensor expect = t_host.contiguous();
    ASSERT_EQ(std::memcmp(t_back.data_ptr(), expect.data_ptr(), expect.nbytes()), 0);
    Tensor dense_host = Tensor::empty(t_host.shape(), DType::kFloat32);
    dense_host.copy_from(t_gpu);  // device view -> contiguous host
    ASSERT_EQ(std::memcmp(dense_host.data_ptr(), expect.data_ptr(), expect.nbytes()), 0);
  }
  Tensor z = Tensor::zeros({5, 3}, DType::kInt64, Device::cuda(0));
  Tensor zh = z.to(Device::cpu());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(static_cast<const std::int64_t*>(zh.data_ptr())[i], 0);
}

// CUDA tensors of different layouts (and host sources into CUDA views with gaps) copy through the cuda_raw
// backend's gather kernel.
TEST(TensorGpu, CopiesBetweenDeviceLayoutsRunOnTheDevice) {
  XPURT_SKIP_WITHOUT_GPU();
  const Tensor host = iota_tensor({3, 4, 5});
  const Tensor host_view = permuted(host, {2, 0, 1});  // [5, 3, 4]
  const Tensor expect = host_view.contiguous();
  const Tensor gpu_view = host_view.to(Device::cuda(0));  // dense: keeps the permuted strides
  ASSERT_FALSE(gpu_view.is_contiguous());
  const Tensor gpu_contiguous = gpu_view.contiguous();
  EXPECT_TRUE(gpu_contiguous.is_contiguous());
  EXPECT_TRUE(gpu_contiguous.device().is_cuda());
  const Tensor back = gpu_contiguous.to(Device::cpu());
  ASSERT_EQ(std::memcmp(back.data_ptr(), expect.data_ptr(), expect.nbytes()), 0);
  // Into a device view with gaps (every other element of the last dimension), from the device and from the host.
  for (const Tensor& source : {gpu_view, host_view}) {
    Tensor big = Tensor::zeros({5, 3, 8}, DType::kFloat32, Device::cuda(0));
    Tensor gaps = Tensor::from_blob(big.data_ptr(), {5, 3, 4}, {24, 8, 2}, DType::kFloat32, Device::cuda(0),
                                    big.storage());
    gaps.copy_from(source);
    const Tensor big_host = big.to(Device::cpu());
    for (std::int64_t i = 0; i < 5; ++i) {
      for (std::int64_t j = 0; j < 3; ++j) {
        for (std::int64_t k = 0; k < 8; ++k) {
          const float want = k % 2 == 0 ? at(expect, {i, j, k / 2}) : 0.0f;
          ASSERT_EQ(at(big_host, {i, j, k}), want) << source.device().str() << " source at " << i << "," << j << ","
                                                   << k;
        }
      }
    }
  }
  // Within one storage: a square matrix overwritten by its own transpose (the source is staged first).
  Tensor square = iota_tensor({4, 4}).to(Device::cuda(0));
  square.copy_from(permuted(square, {1, 0}));
  const Tensor square_host = square.to(Device::cpu());
  for (std::int64_t i = 0; i < 4; ++i) {
    for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(at(square_host, {i, j}), static_cast<float>(4 * j + i));
  }
  // Other dtypes (only the element size matters to the kernel).
  for (const DType dtype : {DType::kInt64, DType::kUInt8, DType::kFloat16}) {
    Tensor raw = Tensor::empty({6, 7}, dtype);
    auto* bytes = static_cast<unsigned char*>(raw.data_ptr());
    for (std::size_t b = 0; b < raw.nbytes(); ++b) bytes[b] = static_cast<unsigned char>(b * 31 + 7);
    const Tensor transposed = permuted(raw, {1, 0}).to(Device::cuda(0)).contiguous().to(Device::cpu());
    const Tensor want = permuted(raw, {1, 0}).contiguous();
    EXPECT_EQ(std::memcmp(transposed.data_ptr(), want.data_ptr(), want.nbytes()), 0) << dtype_name(dtype);
  }
}

// Found by fuzz_model (tests/fuzz/corpus/model/regression-empty-tensor-huge-dims.onnx): an empty tensor whose other
// dims multiply past int64 overflowed its strides (signed overflow, UB). They saturate now; it holds nothing.
TEST(Tensor, EmptyTensorWithHugeDimsHasNoOverflow) {
  const std::int64_t huge = std::int64_t{1} << 40;
  const Tensor t = Tensor::empty({huge, 0, huge, huge}, DType::kFloat64);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.strides()[0], std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(t.strides()[3], 1);
}

}  // namespace
}  // namespace xpuruntime
