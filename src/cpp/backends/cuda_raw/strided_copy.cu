// Copies between two strided views on one CUDA device (Tensor::copy_from and contiguous() use it for CUDA
// tensors whose layouts differ).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_ops.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// Element i (row-major over the merged shape) goes from src + offsets[0] to dst + offsets[1]. Only the element
// size matters, so E is an unsigned integer of that size.
template <typename E, typename Index>
__device__ __forceinline__ void copy_elements(const E* src, E* dst, Index n, const OffsetCalculator<2, Index>& calc) {
  const Index stride = static_cast<Index>(blockDim.x) * static_cast<Index>(gridDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) + static_cast<Index>(threadIdx.x);
       i < n; i += stride) {
    Index offsets[2];
    calc.offsets(i, offsets);
    dst[offsets[1]] = src[offsets[0]];
  }
}

template <typename E, typename Index>
__global__ void strided_copy_kernel(const E* src, E* dst, Index n, OffsetCalculator<2, Index> calc) {
  copy_elements(src, dst, n, calc);
}

// The pairs of one batched launch (Note [Copies in one launch] in core/tensor.cpp): pair blockIdx.y copies srcs[y] to
// dsts[y], every pair over the same merged geometry. Passed by value: 2 KiB of pointers plus the geometry stays under
// the 4 KiB that every CUDA version takes as kernel parameters.
constexpr int kPairsPerLaunch = 128;
struct PairPointers {
  const void* srcs[kPairsPerLaunch];
  void* dsts[kPairsPerLaunch];
};

template <typename E, typename Index>
__global__ void strided_copy_pairs_kernel(PairPointers pairs, Index n, OffsetCalculator<2, Index> calc) {
  copy_elements(static_cast<const E*>(pairs.srcs[blockIdx.y]), static_cast<E*>(pairs.dsts[blockIdx.y]), n, calc);
}

struct CopyGeometry {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> src_strides;
  std::vector<std::int64_t> dst_strides;
};

template <typename E>
void launch_strided_copy(const void* src, void* dst, const CopyGeometry& g, std::int64_t n, cudaStream_t stream) {
  const std::vector<std::int64_t>* const strides[2] = {&g.src_strides, &g.dst_strides};
  if (fits_int32(n, g.shape, {&g.src_strides, &g.dst_strides})) {
    strided_copy_kernel<E, std::int32_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const E*>(src), static_cast<E*>(dst), static_cast<std::int32_t>(n),
        make_offset_calculator<2, std::int32_t>(g.shape, strides));
  } else {
    strided_copy_kernel<E, std::int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const E*>(src), static_cast<E*>(dst), n, make_offset_calculator<2, std::int64_t>(g.shape, strides));
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

template <typename E>
void launch_pairs(const PairPointers& pairs, unsigned count, const CopyGeometry& g, std::int64_t n,
                  cudaStream_t stream) {
  const std::vector<std::int64_t>* const strides[2] = {&g.src_strides, &g.dst_strides};
  // Blocks per pair so that all the pairs together fill the device about as one large copy would.
  const dim3 grid(grid_for(n, kThreads, std::max<std::int64_t>(1, kMaxBlocks / count)), count);
  if (fits_int32(n, g.shape, {&g.src_strides, &g.dst_strides})) {
    strided_copy_pairs_kernel<E, std::int32_t><<<grid, kThreads, 0, stream>>>(
        pairs, static_cast<std::int32_t>(n), make_offset_calculator<2, std::int32_t>(g.shape, strides));
  } else {
    strided_copy_pairs_kernel<E, std::int64_t><<<grid, kThreads, 0, stream>>>(
        pairs, n, make_offset_calculator<2, std::int64_t>(g.shape, strides));
  }
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// Copies a merged geometry; more than kMaxDims dimensions are peeled off the front, one launch per index.
void copy_geometry(const char* src, char* dst, std::size_t element_size, const CopyGeometry& g, cudaStream_t stream) {
  if (g.shape.size() > static_cast<std::size_t>(kMaxDims)) {
    CopyGeometry inner;
    inner.shape.assign(g.shape.begin() + 1, g.shape.end());
    inner.src_strides.assign(g.src_strides.begin() + 1, g.src_strides.end());
    inner.dst_strides.assign(g.dst_strides.begin() + 1, g.dst_strides.end());
    const auto es = static_cast<std::int64_t>(element_size);
    for (std::int64_t k = 0; k < g.shape[0]; ++k) {
      copy_geometry(src + k * g.src_strides[0] * es, dst + k * g.dst_strides[0] * es, element_size, inner, stream);
    }
    return;
  }
  std::int64_t n = 1;
  for (const std::int64_t d : g.shape) n *= d;
  if (g.shape.empty() || (g.shape.size() == 1 && g.src_strides[0] == 1 && g.dst_strides[0] == 1)) {
    XPURT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * element_size, cudaMemcpyDeviceToDevice,
                                     stream));
    return;
  }
  switch (element_size) {
    case 1: return launch_strided_copy<std::uint8_t>(src, dst, g, n, stream);
    case 2: return launch_strided_copy<std::uint16_t>(src, dst, g, n, stream);
    case 4: return launch_strided_copy<std::uint32_t>(src, dst, g, n, stream);
    case 8: return launch_strided_copy<std::uint64_t>(src, dst, g, n, stream);
    default: XPURT_INTERNAL_ASSERT(false, "unexpected element size ", element_size);
  }
}

// Drops size-1 dimensions and merges neighbours that both views step through as one dimension.
CopyGeometry merged_geometry(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& src_strides,
                             const std::vector<std::int64_t>& dst_strides) {
  CopyGeometry g;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!g.shape.empty() && g.src_strides.back() == src_strides[d] * shape[d] &&
        g.dst_strides.back() == dst_strides[d] * shape[d]) {
      g.shape.back() *= shape[d];
      g.src_strides.back() = src_strides[d];
      g.dst_strides.back() = dst_strides[d];
      continue;
    }
    g.shape.push_back(shape[d]);
    g.src_strides.push_back(src_strides[d]);
    g.dst_strides.push_back(dst_strides[d]);
  }
  return g;
}

}  // namespace

void strided_copy(const void* src, void* dst, DType dtype, const std::vector<std::int64_t>& shape,
                  const std::vector<std::int64_t>& src_strides, const std::vector<std::int64_t>& dst_strides,
                  void* stream) {
  XPURT_CHECK(src_strides.size() == shape.size() && dst_strides.size() == shape.size(),
              "cuda_raw::strided_copy: expected ", shape.size(), " strides per view, got ", src_strides.size(),
              " (src) and ", dst_strides.size(), " (dst)");
  for (const std::int64_t d : shape) {
    XPURT_CHECK(d >= 0, "cuda_raw::strided_copy: dimensions must be >= 0");
    if (d == 0) return;
  }
  copy_geometry(static_cast<const char*>(src), static_cast<char*>(dst), dtype_size(dtype),
                merged_geometry(shape, src_strides, dst_strides), as_stream(stream));
}

void strided_copy_pairs(const std::vector<const void*>& srcs, const std::vector<void*>& dsts, DType dtype,
                        const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& src_strides,
                        const std::vector<std::int64_t>& dst_strides, void* stream) {
  XPURT_CHECK(srcs.size() == dsts.size(), "cuda_raw::strided_copy_pairs: ", srcs.size(), " sources for ",
              dsts.size(), " destinations");
  XPURT_CHECK(src_strides.size() == shape.size() && dst_strides.size() == shape.size(),
              "cuda_raw::strided_copy_pairs: expected ", shape.size(), " strides per view, got ", src_strides.size(),
              " (src) and ", dst_strides.size(), " (dst)");
  for (const std::int64_t d : shape) {
    XPURT_CHECK(d >= 0, "cuda_raw::strided_copy_pairs: dimensions must be >= 0");
    if (d == 0) return;
  }
  const CopyGeometry g = merged_geometry(shape, src_strides, dst_strides);
  const std::size_t es = dtype_size(dtype);
  const cudaStream_t s = as_stream(stream);
  if (g.shape.size() > static_cast<std::size_t>(kMaxDims)) {  // rare: one launch per pair, as strided_copy
    for (std::size_t p = 0; p < srcs.size(); ++p) {
      copy_geometry(static_cast<const char*>(srcs[p]), static_cast<char*>(dsts[p]), es, g, s);
    }
    return;
  }
  std::int64_t n = 1;
  for (const std::int64_t d : g.shape) n *= d;
  for (std::size_t first = 0; first < srcs.size(); first += kPairsPerLaunch) {
    const auto count = static_cast<unsigned>(std::min<std::size_t>(kPairsPerLaunch, srcs.size() - first));
    PairPointers pairs{};
    for (unsigned p = 0; p < count; ++p) {
      pairs.srcs[p] = srcs[first + p];
      pairs.dsts[p] = dsts[first + p];
    }
    switch (es) {
      case 1: launch_pairs<std::uint8_t>(pairs, count, g, n, s); break;
      case 2: launch_pairs<std::uint16_t>(pairs, count, g, n, s); break;
      case 4: launch_pairs<std::uint32_t>(pairs, count, g, n, s); break;
      case 8: launch_pairs<std::uint64_t>(pairs, count, g, n, s); break;
      default: XPURT_INTERNAL_ASSERT(false, "unexpected element size ", es);
    }
  }
}

}  // namespace xpuruntime::cuda_raw
