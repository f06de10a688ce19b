// ONNX Resize (nearest, linear, cubic; every coordinate transformation mode but tf_crop_and_resize; no
// antialias): one thread per output element, fp32 weights and accumulation (Note [fp32 compute]).
//
// Note [Resize taps]
// Along a resized dimension the output coordinate maps to x = transform(o) in input coordinates. Nearest reads one
// element (x rounded by nearest_mode, clamped to the edge); linear reads floor(x) and floor(x) + 1 with weights
// 1 - t and t (t = x - floor(x)); cubic reads floor(x) - 1 .. floor(x) + 2 with Keys' coefficients for `cubic_a`.
// Taps beyond the input read the edge element (ONNX's reference pads with the edge), or, with exclude_outside,
// get weight 0 and the others are renormalized. This equals ONNX's reference, which picks the left pixel when x
// is an integer (t = 1 there, the same taps shifted by one with the same non-zero weights).
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

constexpr int kMaxResized = 3;

struct ResizeGeometry {
  int rank = 0;
  std::int64_t out_size[kMaxDims] = {};  // innermost first
  std::int64_t in_size[kMaxDims] = {};
  std::int64_t in_stride[kMaxDims] = {};
  int resized_slot[kMaxDims] = {};       // -1: copied; else the index into the arrays below
  float scale[kMaxResized] = {};
  ResizeMode mode = ResizeMode::kNearest;
  ResizeCoordinates coordinates = ResizeCoordinates::kHalfPixel;
  ResizeNearest nearest = ResizeNearest::kRoundPreferFloor;
  float cubic_a = -0.75f;
  bool exclude_outside = false;
};

// ONNX's reference: the formulas use the output length scale * in (equal to the output size when the model gave
// sizes; not when it gave a scale that does not divide), and the integer output size only where stated.
__device__ __forceinline__ float source_coordinate(const ResizeGeometry& g, float o, std::int64_t in,
                                                   std::int64_t out, float scale) {
  const float length = scale * static_cast<float>(in);
  switch (g.coordinates) {
    case ResizeCoordinates::kHalfPixel: return (o + 0.5f) / scale - 0.5f;
    case ResizeCoordinates::kHalfPixelSymmetric: {
      const float adjustment = static_cast<float>(out) / length;
      const float center = static_cast<float>(in) / 2.0f;
      return center * (1.0f - adjustment) + (o + 0.5f) / scale - 0.5f;
    }
    case ResizeCoordinates::kPytorchHalfPixel: return length > 1.0f ? (o + 0.5f) / scale - 0.5f : -0.5f;
    case ResizeCoordinates::kAlignCorners:
      return length == 1.0f ? 0.0f : o * static_cast<float>(in - 1) / (length - 1.0f);
    case ResizeCoordinates::kAsymmetric: return o / scale;
    case ResizeCoordinates::kTfHalfPixelForNn: return (o + 0.5f) / scale;
  }
  return 0.0f;
}

__device__ __forceinline__ float cubic_weight(float d, float a) {  // Keys' kernel at distance |d|
  d = fabsf(d);
  if (d <= 1.0f) return ((a + 2.0f) * d - (a + 3.0f)) * d * d + 1.0f;
  if (d < 2.0f) return ((a * d - 5.0f * a) * d + 8.0f * a) * d - 4.0f * a;
  return 0.0f;
}

// The taps of one resized dimension (Note [Resize taps]); returns their count.
__device__ __forceinline__ int taps(const ResizeGeometry& g, std::int64_t o, std::int64_t in, std::int64_t out,
                                    float scale, std::int64_t (&index)[4], float (&weight)[4]) {
  const float x = source_coordinate(g, static_cast<float>(o), in, out, scale);
  const auto clamp = [in](std::int64_t i) { return i < 0 ? std::int64_t{0} : (i >= in ? in - 1 : i); };
  if (g.mode == ResizeMode::kNearest) {
    const float f = floorf(x);
    const float t = x - f;  // ONNX's reference decides on this fraction
    bool up;
    switch (g.nearest) {
      case ResizeNearest::kRoundPreferFloor: up = t > 0.5f; break;
      case ResizeNearest::kRoundPreferCeil: up = t >= 0.5f; break;
      case ResizeNearest::kFloor: up = false; break;
      default: up = t > 0.0f; break;
    }
    const float r = up ? f + 1.0f : f;
    index[0] = clamp(static_cast<std::int64_t>(r));
    weight[0] = 1.0f;
    return 1;
  }
  const float f = floorf(x);
  const float t = x - f;
  const auto base = static_cast<std::int64_t>(f);
  if (g.mode == ResizeMode::kLinear) {
    index[0] = clamp(base);
    index[1] = clamp(base + 1);
    weight[0] = 1.0f - t;
    weight[1] = t;
    return 2;
  }
  float total = 0.0f;
  for (int k = 0; k < 4; ++k) {
    const std::int64_t i = base - 1 + k;
    float w = cubic_weight(t - static_cast<float>(k - 1), g.cubic_a);
    if (g.exclude_outside && (i < 0 || i >= in)) w = 0.0f;
    index[k] = clamp(i);
    weight[k] = w;
    total += w;
  }
  if (g.exclude_outside && total != 0.0f) {
    for (int k = 0; k < 4; ++k) weight[k] /= total;
  }
  return 4;
}

template <typename T>
__global__ void resize_kernel(const T* x, T* y, std::int64_t n, ResizeGeometry g) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::int64_t rest = i, base = 0;
    std::int64_t index[kMaxResized][4];
    float weight[kMaxResized][4];
    int count[kMaxResized] = {1, 1, 1};
    std::int64_t tap_stride[kMaxResized] = {0, 0, 0};
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == g.rank) break;
      const std::int64_t q = rest / g.out_size[d];
      const std::int64_t o = rest - q * g.out_size[d];
      rest = q;
      const int slot = g.resized_slot[d];
      if (slot < 0) {
        base += o * g.in_stride[d];
      } else {
        count[slot] = taps(g, o, g.in_size[d], g.out_size[d], g.scale[slot], index[slot], weight[slot]);
        tap_stride[slot] = g.in_stride[d];
      }
    }
    float sum = 0.0f;
    for (int a = 0; a < count[0]; ++a) {
      const std::int64_t oa = tap_stride[0] == 0 ? 0 : index[0][a] * tap_stride[0];
      const float wa = tap_stride[0] == 0 ? 1.0f : weight[0][a];
      for (int b = 0; b < count[1]; ++b) {
        const std::int64_t ob = tap_stride[1] == 0 ? 0 : index[1][b] * tap_stride[1];
        const float wb = tap_stride[1] == 0 ? 1.0f : weight[1][b];
        for (int c = 0; c < count[2]; ++c) {
          const std::int64_t oc = tap_stride[2] == 0 ? 0 : index[2][c] * tap_stride[2];
          const float wc = tap_stride[2] == 0 ? 1.0f : weight[2][c];
          sum += wa * wb * wc * to_float(x[base + oa + ob + oc]);
        }
      }
    }
    y[i] = from_float<T>(sum);
  }
}

}  // namespace

bool resize_supported(const ResizeParams& params, std::string* why_not) {
  const std::size_t rank = params.in_shape.size();
  if (rank == 0 || rank > static_cast<std::size_t>(kMaxDims) || params.out_shape.size() != rank ||
      params.scales.size() != rank) {
    *why_not = ::xpuruntime::detail::str_cat("cuda_raw resize takes ranks 1 to ", kMaxDims,
                                             " with one scale per dimension");
    return false;
  }
  int resized = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    if (params.in_shape[d] == params.out_shape[d] && params.scales[d] == 1.0f) continue;
    if (params.in_shape[d] == 0 || !(params.scales[d] > 0.0f)) {
      *why_not = ::xpuruntime::detail::str_cat("cuda_raw resize needs a non-empty input and a positive scale along "
                                               "dimension ", d);
      return false;
    }
    ++resized;
  }
  if (resized > kMaxResized) {
    *why_not = ::xpuruntime::detail::str_cat("cuda_raw resize changes at most ", kMaxResized, " dimensions, got ",
                                             resized);
    return false;
  }
  return true;
}

void resize(const ResizeParams& params, const void* x, void* y, DType dtype, void* stream) {
  std::string why_not;
  XPURT_CHECK(resize_supported(params, &why_not), why_not);
  std::int64_t n = 1;
  for (const std::int64_t d : params.out_shape) n *= d;
  if (n == 0) return;
  ResizeGeometry g;
  g.rank = static_cast<int>(params.in_shape.size());
  g.mode = params.mode;
  g.coordinates = params.coordinates;
  g.nearest = params.nearest;
  g.cubic_a = params.cubic_a;
  g.exclude_outside = params.exclude_outside;
  std::int64_t stride = 1;
  int slots = 0;
  for (int d = 0; d < g.rank; ++d) {
    const std::size_t from = params.in_shape.size() - 1 - static_cast<std::size_t>(d);
    g.out_size[d] = params.out_shape[from];
    g.in_size[d] = params.in_shape[from];
    g.in_stride[d] = stride;
    stride *= params.in_shape[from];
    if (params.in_shape[from] == params.out_shape[from] && params.scales[from] == 1.0f) {
      g.resized_slot[d] = -1;
    } else {
      g.scale[slots] = params.scales[from];
      g.resized_slot[d] = slots++;
    }
  }
  dispatch_float(dtype, "resize", [&](auto tag) {
    using T = decltype(tag);
    resize_kernel<T><<<grid_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(static_cast<const T*>(x),
                                                                                static_cast<T*>(y), n, g);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
}

}  // namespace xpuruntime::cuda_raw
