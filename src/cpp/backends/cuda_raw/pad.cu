// ONNX Pad (constant, reflect, edge, wrap; negative pads crop): one thread per output element maps each of its
// coordinates back to the input, so any element size and any rank up to kMaxDims take one kernel.
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// Per dimension, innermost first: output size, input size, input stride, leading pad (negative: cropped).
struct PadGeometry {
  int rank = 0;
  std::int64_t out_size[kMaxDims] = {};
  std::int64_t in_size[kMaxDims] = {};
  std::int64_t in_stride[kMaxDims] = {};
  std::int64_t begin[kMaxDims] = {};
};

// The input coordinate that output coordinate `o` reads along one dimension, or -1 for the constant.
__device__ __forceinline__ std::int64_t source_coordinate(std::int64_t o, std::int64_t begin, std::int64_t size,
                                                          PadMode mode) {
  std::int64_t i = o - begin;
  if (i >= 0 && i < size) return i;
  switch (mode) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return i < 0 ? 0 : size - 1;
    case PadMode::kWrap: {
      const std::int64_t r = i % size;
      return r < 0 ? r + size : r;
    }
    case PadMode::kReflect: {
      // Reflection without repeating the edge: period 2 * (size - 1) (size > 1, checked by the caller).
      const std::int64_t period = 2 * (size - 1);
      std::int64_t r = i % period;
      if (r < 0) r += period;
      return r < size ? r : period - r;
    }
  }
  return -1;
}

template <typename E>
__global__ void pad_kernel(const E* x, E* y, std::int64_t n, PadGeometry g, PadMode mode, E value) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::int64_t rest = i, offset = 0;
    bool inside = true;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == g.rank) break;
      const std::int64_t q = rest / g.out_size[d];
      const std::int64_t o = rest - q * g.out_size[d];
      rest = q;
      const std::int64_t source = source_coordinate(o, g.begin[d], g.in_size[d], mode);
      inside = inside && source >= 0;
      offset += source * g.in_stride[d];
    }
    y[i] = inside ? x[offset] : value;
  }
}

}  // namespace

void pad(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& in_shape,
         const std::vector<std::int64_t>& out_shape, const std::vector<std::int64_t>& begins, PadMode mode,
         std::uint64_t value_bits, void* stream) {
  XPURT_CHECK(in_shape.size() == out_shape.size() && begins.size() == in_shape.size() &&
                  in_shape.size() <= static_cast<std::size_t>(kMaxDims),
              "cuda_raw::pad: input rank ", in_shape.size(), ", output rank ", out_shape.size(), " and ",
              begins.size(), " leading pads must agree and be <= ", kMaxDims);
  std::int64_t n = 1, in_numel = 1;
  for (std::size_t d = 0; d < out_shape.size(); ++d) {
    n *= out_shape[d];
    in_numel *= in_shape[d];
  }
  if (n == 0) return;
  XPURT_CHECK(in_numel > 0 || mode == PadMode::kConstant, "cuda_raw::pad: an empty input can only be padded with a "
              "constant");
  PadGeometry g;
  g.rank = static_cast<int>(in_shape.size());
  std::int64_t stride = 1;
  for (int d = 0; d < g.rank; ++d) {
    const std::size_t from = in_shape.size() - 1 - static_cast<std::size_t>(d);
    XPURT_CHECK(mode != PadMode::kReflect || in_shape[from] > 1 || out_shape[from] == in_shape[from],
                "cuda_raw::pad: reflect mode needs more than one element along padded dimension ", from);
    g.out_size[d] = out_shape[from];
    g.in_size[d] = in_shape[from];
    g.in_stride[d] = stride;
    g.begin[d] = begins[from];
    stride *= in_shape[from];
  }
  const cudaStream_t s = as_stream(stream);
  dispatch_element_size(element_size, "pad", [&](auto tag) {
    using E = decltype(tag);
    pad_kernel<E><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const E*>(x), static_cast<E*>(y), n, g,
                                                             mode, element_of<E>(value_bits));
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
