#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
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

// The elements (offsets into one buffer) a view of [offset, shape, strides] touches.
std::vector<std::int64_t> elements_of(std::int64_t offset, const std::vector<std::int64_t>& shape,
                                      const std::vector<std::int64_t>& strides) {
  std::vector<std::int64_t> out = {offset};
  for (std::size_t d = 0; d < shape.size(); ++d) {
    std::vector<std::int64_t> next;
    for (std::int64_t base : out) {
      for (std::int64_t i = 0; i < shape[d]; ++i) next.push_back(base + i * strides[d]);
    }
    out = std::move(next);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool share_an_element(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  std::vector<std::int64_t> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  return !common.empty();
}

// may_overlap never says "disjoint" for views that share an element, and for two views of one shape and strides of
// a layout that does not overlap itself (a KV cache's positions, permuted and strided views) it is exact.
TEST(Tensor, MayOverlapNeverMissesASharedElementAndIsExactForOneLayout) {
  Tensor buffer = Tensor::zeros({4096}, DType::kFloat32);
  std::mt19937 rng(11);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto view = [&](std::int64_t offset, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& st) {
    return Tensor::from_blob(static_cast<float*>(buffer.data_ptr()) + offset, shape, st, DType::kFloat32,
                             Device::cpu(), buffer.storage());
  };
  int exact_disjoint = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int rank = pick(1, 4);
    std::vector<std::int64_t> shape, strides;
    const bool nested = trial % 2 == 0;  // strides that each exceed the span below them (a layout without overlap)
    std::int64_t span = 1;
    for (int d = 0; d < rank; ++d) {
      shape.push_back(pick(1, 5));
      strides.push_back(nested ? span + pick(0, 3) : pick(1, 9));
      span = strides.back() * shape.back();
    }
    std::reverse(shape.begin(), shape.end());
    std::reverse(strides.begin(), strides.end());
    if (trial % 3 == 0) std::swap(shape.front(), shape.back()), std::swap(strides.front(), strides.back());
    const std::int64_t a_off = pick(0, 300), b_off = pick(0, 300);
    const auto ea = elements_of(a_off, shape, strides);
    const auto eb = elements_of(b_off, shape, strides);
    const bool shared = share_an_element(ea, eb);
    const bool may = may_overlap(view(a_off, shape, strides), view(b_off, shape, strides));
    if (shared) {
      ASSERT_TRUE(may) << "trial " << trial;
    }
    if (nested && !shared) {
      ASSERT_FALSE(may) << "trial " << trial << ": a disjoint pair of one nested layout counted as overlapping";
      ++exact_disjoint;
    }
    // Views of other shapes: only soundness is promised.
    std::vector<std::int64_t> other = shape;
    other.back() = pick(1, 5);
    const auto ec = elements_of(b_off, other, strides);
    if (share_an_element(ea, ec)) {
      ASSERT_TRUE(may_overlap(view(a_off, shape, strides), view(b_off, other, strides)));
    }
  }
  EXPECT_GT(exact_disjoint, 200);  // the interesting case happened often
  // Two positions of a [batch, heads, positions, head_dim] cache buffer: disjoint though their spans interleave.
  Tensor cache = Tensor::zeros({2, 3, 9, 4}, DType::kFloat16);
  auto position = [&](std::int64_t p) {
    return Tensor::from_blob(static_cast<std::uint16_t*>(cache.data_ptr()) + p * 4, {2, 3, 1, 4}, {108, 36, 4, 1},
                             DType::kFloat16, Device::cpu(), cache.storage());
  };
  EXPECT_FALSE(may_overlap(position(8), position(3)));
  EXPECT_TRUE(may_overlap(position(5), position(5)));
  EXPECT_FALSE(may_overlap(position(0), Tensor::zeros({2, 3, 1, 4}, DType::kFloat16)));  // another buffer
}

// copy_tensors means copy_from pair by pair, in order: on the CPU (and for pairs that overlap) it is exactly that.
TEST(Tensor, CopyTensorsCopiesEveryPairInOrderAndChecksThem) {
  Tensor a = Tensor::zeros({2, 3}, DType::kFloat32);
  Tensor b = Tensor::zeros({2, 3}, DType::kFloat32);
  const Tensor src = iota_tensor({2, 3});
  EXPECT_FALSE(copy_tensors({a, b}, {src, a}));  // b gets a after a got src
  EXPECT_EQ(at(b, {1, 2}), 5.0f);
  EXPECT_EQ(at(a, {0, 1}), 1.0f);
  XPURT_EXPECT_THROW_WITH(copy_tensors({a}, {src, src}), InvalidArgumentError, "1 destinations for 2 sources");
  XPURT_EXPECT_THROW_WITH(copy_tensors({a, b}, {src, Tensor::zeros({2, 3}, DType::kInt32)}), InvalidTypeError,
                          "pair 1 copies int32");
  XPURT_EXPECT_THROW_WITH(copy_tensors({a, b}, {src, Tensor::zeros({3, 2}, DType::kFloat32)}), InvalidArgumentError,
                          "[3, 2]");
  EXPECT_EQ(at(b, {1, 2}), 5.0f);  // a refused call copied nothing
}

// On a GPU the disjoint positions of several cache buffers go in one launch, also past 128 pairs (two launches) and
// at odd shapes and element sizes; pairs that overlap fall back to copies in order.
TEST(TensorGpu, CopyTensorsMovesDisjointCachePositionsInOneLaunch) {
  XPURT_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (const DType dtype : {DType::kFloat16, DType::kFloat32, DType::kUInt8, DType::kInt64}) {
    for (const std::size_t slots : {std::size_t{3}, std::size_t{130}}) {
      const std::int64_t batch = 2, heads = 3, positions = 9, head_dim = dtype == DType::kUInt8 ? 7 : 5;
      const std::size_t es = dtype_size(dtype);
      std::vector<Tensor> hosts, gpus, into, from;
      for (std::size_t s = 0; s < slots; ++s) {
        Tensor h = Tensor::empty({batch, heads, positions, head_dim}, dtype);
        auto* bytes = static_cast<unsigned char*>(h.data_ptr());
        for (std::size_t i = 0; i < h.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
        hosts.push_back(h);
        gpus.push_back(h.to(Device::cuda(0)));
        const std::vector<std::int64_t> st = {heads * positions * head_dim, positions * head_dim, head_dim, 1};
        auto at_position = [&](const Tensor& t, std::int64_t p) {
          return Tensor::from_blob(static_cast<char*>(t.data_ptr()) + p * head_dim * static_cast<std::int64_t>(es),
                                   {batch, heads, 1, head_dim}, st, dtype, t.device(), t.storage());
        };
        into.push_back(at_position(gpus.back(), static_cast<std::int64_t>(s % 8)));
        from.push_back(at_position(gpus.back(), 8));
      }
      ASSERT_TRUE(copy_tensors(into, from)) << dtype_name(dtype);
      for (std::size_t s = 0; s < slots; ++s) {
        const Tensor got = gpus[s].to(Device::cpu());
        const auto* g = static_cast<const unsigned char*>(got.data_ptr());
        const auto* h = static_cast<const unsigned char*>(hosts[s].data_ptr());
        for (std::int64_t row = 0; row < batch * heads; ++row) {
          for (std::int64_t p = 0; p < positions; ++p) {
            const std::int64_t source = p == static_cast<std::int64_t>(s % 8) ? 8 : p;
            ASSERT_EQ(std::memcmp(g + (row * positions + p) * head_dim * es,
                                  h + (row * positions + source) * head_dim * es, head_dim * es), 0)
                << dtype_name(dtype) << " slot " << s << " row " << row << " position " << p;
          }
        }
      }
    }
  }
  // A chain: pair 1 reads what pair 0 writes, so the copies go one by one, in order.
  Tensor x = iota_tensor({4, 6}).to(Device::cuda(0));
  Tensor y = Tensor::zeros({4, 6}, DType::kFloat32, Device::cuda(0));
  Tensor z = Tensor::zeros({4, 6}, DType::kFloat32, Device::cuda(0));
  EXPECT_FALSE(copy_tensors({y, z}, {x, y}));
  EXPECT_EQ(at(z.to(Device::cpu()), {3, 5}), 23.0f);
}

}  // namespace
}  // namespace xpuruntime
