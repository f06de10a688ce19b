// ONNX Resize (nearest, linear, cubic; every coordinate transformation mode but tf_crop_and_resize; no
// antialias): one thread per output element, fp32 weights and accumulation (Note [fp32 compute]); nearest and
// linear resizes whose offsets fit in int32 take a row kernel (Note [Resize rows]).
//
// Note [Resize taps]
// Along a resized dimension the output coordinate maps to x = transform(o) in input coordinates. Nearest reads one
// element (x rounded by nearest_mode, clamped to the edge); linear reads floor(x) and floor(x) + 1 with weights
// 1 - t and t (t = x - floor(x)); cubic reads floor(x) - 1 .. floor(x) + 2 with Keys' coefficients for `cubic_a`.
// Taps beyond the input read the edge element (ONNX's reference pads with the edge), or, with exclude_outside,
// get weight 0 and the others are renormalized. This equals ONNX's reference, which picks the left pixel when x
// is an integer (t = 1 there, the same taps shifted by one with the same non-zero weights).
//
// Note [Nearest copies]
// Nearest mode copies the element it picks, bit for bit, as ONNX's reference does: no round trip through fp32,
// which would turn -0.0 into +0.0 (0.0f + -0.0f) and drop NaN payloads of 16-bit inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
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
// sizes; not when it gave a scale that does not divide), and the integer output size only where stated. Every
// rounding is spelled out (__fmul_rn, __fmaf_rn) so that the compiler cannot fuse a multiply and an add in one
// kernel and not in another: a coordinate that lands on a rounding boundary (an integer for nearest floor) picks
// the same tap in every kernel here.
__device__ __forceinline__ float source_coordinate(ResizeCoordinates coordinates, float o, std::int64_t in,
                                                   std::int64_t out, float scale) {
  const float length = __fmul_rn(scale, static_cast<float>(in));
  switch (coordinates) {
    case ResizeCoordinates::kHalfPixel: return (o + 0.5f) / scale - 0.5f;
    case ResizeCoordinates::kHalfPixelSymmetric: {
      const float adjustment = static_cast<float>(out) / length;
      const float center = static_cast<float>(in) / 2.0f;
      return __fmaf_rn(center, 1.0f - adjustment, (o + 0.5f) / scale) - 0.5f;
    }
    case ResizeCoordinates::kPytorchHalfPixel: return length > 1.0f ? (o + 0.5f) / scale - 0.5f : -0.5f;
    case ResizeCoordinates::kAlignCorners:
      return length == 1.0f ? 0.0f : o * static_cast<float>(in - 1) / (length - 1.0f);
    case ResizeCoordinates::kAsymmetric: return o / scale;
    case ResizeCoordinates::kTfHalfPixelForNn: return (o + 0.5f) / scale;
  }
  return 0.0f;
}

template <typename Index>
__device__ __forceinline__ Index clamp_to(Index i, Index size) {
  return i < 0 ? Index{0} : (i >= size ? size - 1 : i);
}

// The element nearest mode reads along one dimension (Note [Resize taps]).
template <typename Index>
__device__ __forceinline__ Index nearest_index(ResizeCoordinates coordinates, ResizeNearest nearest, Index o,
                                               Index in, Index out, float scale) {
  const float x = source_coordinate(coordinates, static_cast<float>(o), in, out, scale);
  const float f = floorf(x);
  const float t = x - f;  // ONNX's reference decides on this fraction
  bool up;
  switch (nearest) {
    case ResizeNearest::kRoundPreferFloor: up = t > 0.5f; break;
    case ResizeNearest::kRoundPreferCeil: up = t >= 0.5f; break;
    case ResizeNearest::kFloor: up = false; break;
    default: up = t > 0.0f; break;
  }
  return clamp_to(static_cast<Index>(up ? f + 1.0f : f), in);
}

// The two taps linear mode reads along one dimension and their weights (Note [Resize taps]).
template <typename Index>
__device__ __forceinline__ void linear_taps(ResizeCoordinates coordinates, Index o, Index in, Index out, float scale,
                                            Index (&index)[2], float (&weight)[2]) {
  const float x = source_coordinate(coordinates, static_cast<float>(o), in, out, scale);
  const float f = floorf(x);
  const float t = x - f;
  const auto base = static_cast<Index>(f);
  index[0] = clamp_to(base, in);
  index[1] = base < 0 ? 0 : (base >= in - 1 ? in - 1 : base + 1);  // clamp_to(base + 1, in), without overflow
  weight[0] = 1.0f - t;
  weight[1] = t;
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
  if (g.mode == ResizeMode::kNearest) {
    index[0] = nearest_index(g.coordinates, g.nearest, o, in, out, scale);
    weight[0] = 1.0f;
    return 1;
  }
  if (g.mode == ResizeMode::kLinear) {
    std::int64_t pair[2];
    float pair_weight[2];
    linear_taps(g.coordinates, o, in, out, scale, pair, pair_weight);
    for (int k = 0; k < 2; ++k) {
      index[k] = pair[k];
      weight[k] = pair_weight[k];
    }
    return 2;
  }
  const float x = source_coordinate(g.coordinates, static_cast<float>(o), in, out, scale);
  const float f = floorf(x);
  const float t = x - f;
  const auto base = static_cast<std::int64_t>(f);
  float total = 0.0f;
  for (int k = 0; k < 4; ++k) {
    const std::int64_t i = base - 1 + k;
    float w = cubic_weight(t - static_cast<float>(k - 1), g.cubic_a);
    if (g.exclude_outside && (i < 0 || i >= in)) w = 0.0f;
    index[k] = clamp_to(i, in);
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
    if (g.mode == ResizeMode::kNearest) {  // one tap per dimension (Note [Nearest copies])
      std::int64_t offset = base;
      for (int s = 0; s < kMaxResized; ++s) {
        if (tap_stride[s] != 0) offset += index[s][0] * tap_stride[s];
      }
      y[i] = x[offset];
      continue;
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
          sum = __fmaf_rn(wa * wb * wc, to_float(x[base + oa + ob + oc]), sum);  // as the row kernel rounds
        }
      }
    }
    y[i] = from_float<T>(sum);
  }
}

// Note [Resize rows]
// The general kernel spends most of its time on one 64-bit division per dimension and element, and on the
// coordinate transform of every resized dimension for every element. Nearest resizes, and linear ones that resize
// at most one dimension besides the innermost, run as rows instead when every offset fits in int32:
// - The host drops the copied dimensions of size 1 and merges neighbouring copied dimensions (same size in and out,
//   scale 1: coordinates map to themselves). Resized dimensions stay as they are, in their order. A 2x upsampling
//   of x[64, 128, 64, 64] becomes rows of 128 outputs over [8192, 128] rows (H resized, N and C merged).
// - A thread owns kVec consecutive columns of the output rows (a 16-byte vector store, or 8, 4, 2 bytes or one
//   element, whichever the row width and y's alignment allow) and computes their taps once, with the general
//   kernel's nearest_index or linear_taps. It then walks rows, finding each row's input offset (and, linear, its
//   two taps) once per row, with a fast division per outer dimension (Note [Fast division] in
//   cuda_raw_common.cuh). The coordinate transforms of the row kernels are out of line (row_nearest_index,
//   row_linear_taps), which keeps the unrolled kernels small.
// - Nearest handles kNearestRowsPerStep rows per step, all loads before the stores. When the innermost outer
//   dimension is resized to at most kRowTable rows (H in an NCHW upsampling), each block first tabulates its input
//   offsets in shared memory (one coordinate transform per output coordinate and block, not one per row and thread),
//   and a row looks its offset up there. At full vector width, with x
//   16-byte aligned and the innermost dimension keeping its size (kFactor 1) or doubling (kFactor 2), a thread whose
//   columns read kVec / kFactor consecutive inputs from an aligned one, each kFactor times in a row, loads them as
//   one 16- or 8-byte word per row and repeats them in registers (repeat_elements). Each thread checks its own
//   columns: in a 2x upsampling, all of them pass with PyTorch's coordinates (asymmetric, floor), ONNX's defaults
//   (half_pixel, round_prefer_floor) and most other pairs. Other threads, widths and scales gather their columns
//   element by element (one row at a time in the kernels for words, whose occupancy needs the registers).
// - A block of kThreads threads is as many column owners as a row needs (up to kThreads) times as many rows; its
//   rows repeat every gridDim.y * blockDim.y rows, about kRowsPerThread rows per thread once the grid has
//   kMinRowBlocks blocks, which amortizes the column taps.
// - Both kernels take their coordinates from source_coordinate, whose roundings are explicit, and linear sums its
//   taps in the general kernel's order (the innermost dimension's taps outermost) with the same fused
//   multiply-adds and weight products (the general kernel's extra factors are exactly 1), so both give the same
//   bits; nearest copies (Note [Nearest copies]).
// Cubic, linear over two or more outer dimensions and int64-sized tensors stay on the general kernel.
constexpr std::int64_t kRowsPerThread = 16;
constexpr std::int64_t kMinRowBlocks = 4096;
constexpr int kNearestRowsPerStep = 4;
constexpr int kRowTable = 1024;  // the most output rows of the innermost outer dimension nearest tabulates
// Rows and columns stay below INT32_MAX - kIndexHeadroom, so that stepping past the last row cannot overflow.
constexpr std::int64_t kIndexHeadroom = std::int64_t{1} << 26;

struct ResizeRows {
  std::int32_t rows = 1;      // output rows: the product of the outer output sizes
  std::int32_t width = 1;     // output size of the innermost dimension
  std::int32_t in_width = 1;  // its input size
  bool width_resized = false;
  float width_scale = 1.0f;
  ResizeCoordinates coordinates = ResizeCoordinates::kHalfPixel;
  ResizeNearest nearest = ResizeNearest::kRoundPreferFloor;
  bool row_table = false;  // nearest: the innermost outer dimension's offsets come from a table (Note [Resize rows])
  int outer = 0;  // the dimensions above it, innermost first:
  FastDivider out_size[kMaxDims - 1];
  std::int32_t in_size[kMaxDims - 1] = {};
  std::int32_t in_stride[kMaxDims - 1] = {};
  bool resized[kMaxDims - 1] = {};
  float scale[kMaxDims - 1] = {};
};

// The row kernels' taps, out of line: inlined, the coordinate modes' code would be copied for every column, row
// and dimension the kernels unroll.
__device__ __noinline__ std::int32_t row_nearest_index(ResizeCoordinates coordinates, ResizeNearest nearest,
                                                       std::int32_t o, std::int32_t in, std::int32_t out,
                                                       float scale) {
  return nearest_index(coordinates, nearest, o, in, out, scale);
}

struct LinearTaps {
  std::int32_t index[2];
  float weight[2];
};

__device__ __noinline__ LinearTaps row_linear_taps(ResizeCoordinates coordinates, std::int32_t o, std::int32_t in,
                                                   std::int32_t out, float scale) {
  LinearTaps taps;
  linear_taps(coordinates, o, in, out, scale, taps.index, taps.weight);
  return taps;
}

// Nearest mode: the input offset of the element that the first column of output row `row` reads; `table` holds the
// innermost outer dimension's offsets when r.row_table.
__device__ __forceinline__ std::int32_t nearest_row_offset(const ResizeRows& r, const std::int32_t* table,
                                                          std::int32_t row) {
  std::int32_t offset = 0;
#pragma unroll
  for (int d = 0; d < kMaxDims - 1; ++d) {
    if (d == r.outer) break;
    std::int32_t o = row;  // the outermost dimension takes the rest
    if (d + 1 < r.outer) {
      row = r.out_size[d].div(o);
      o -= row * r.out_size[d].value();
    }
    if (d == 0 && r.row_table) {
      offset += table[o];
      continue;
    }
    if (r.resized[d]) {
      o = row_nearest_index(r.coordinates, r.nearest, o, r.in_size[d], r.out_size[d].value(), r.scale[d]);
    }
    offset += o * r.in_stride[d];
  }
  return offset;
}

// The 16 bytes of output that the words `in` (8 or 16 bytes of elements E) make when each element is repeated
// kFactor (1 or 2) times: registers only.
template <typename E, int kFactor>
__device__ __forceinline__ Vec<std::uint32_t, 4> repeat_elements(const Vec<std::uint32_t, 4 / kFactor>& in) {
  Vec<std::uint32_t, 4> out;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (kFactor == 1 || sizeof(E) == 4) {
      out.v[j] = in.v[j / kFactor];
    } else {
      static_assert(sizeof(E) == 2, "nearest rows copy 16- or 32-bit elements");
      // Output word j: the first (j even) or second half of input word j / 2, twice.
      out.v[j] = __byte_perm(in.v[j / 2], 0, j % 2 == 0 ? 0x1010 : 0x3232);
    }
  }
  return out;
}

// kFactor 0: every thread gathers; 1 or 2: threads whose columns allow it read whole words (Note [Resize rows]).
template <typename E, int kVec, int kFactor>
__global__ void __launch_bounds__(kThreads) resize_nearest_rows_kernel(const E* x, E* y, ResizeRows r) {
  static_assert(kFactor == 0 || kVec * sizeof(E) == 16, "whole words at full vector width only");
  __shared__ std::int32_t table[kRowTable];
  if (r.row_table) {
    const auto threads = static_cast<std::int32_t>(blockDim.x * blockDim.y);
    const std::int32_t out = r.out_size[0].value();
    for (auto o = static_cast<std::int32_t>(threadIdx.y * blockDim.x + threadIdx.x); o < out; o += threads) {
      table[o] = row_nearest_index(r.coordinates, r.nearest, o, r.in_size[0], out, r.scale[0]) * r.in_stride[0];
    }
    __syncthreads();
  }
  const auto first_column = static_cast<std::int32_t>((blockIdx.x * blockDim.x + threadIdx.x) * kVec);
  if (first_column >= r.width) return;
  std::int32_t column[kVec];  // the input column each output column reads (kFactor 1: itself)
  bool packed = kFactor == 1;  // the columns read kVec / kFactor inputs from an aligned one, kFactor times each
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const std::int32_t o = first_column + k;
    column[k] = kFactor != 1 && r.width_resized
                    ? row_nearest_index(r.coordinates, r.nearest, o, r.in_width, r.width, r.width_scale)
                    : o;
  }
  if constexpr (kFactor == 2) {
    packed = column[0] % (kVec / 2) == 0;
#pragma unroll
    for (int k = 0; k < kVec; ++k) packed = packed && column[k] == column[0] + k / 2;
  }
  const auto stride = static_cast<std::int32_t>(blockDim.y * gridDim.y);
  for (auto row = static_cast<std::int32_t>(blockIdx.y * blockDim.y + threadIdx.y); row < r.rows;
       row += kNearestRowsPerStep * stride) {
    std::int32_t offset[kNearestRowsPerStep];  // -1: past the last row
#pragma unroll
    for (int u = 0; u < kNearestRowsPerStep; ++u) {
      offset[u] = row + u * stride < r.rows ? nearest_row_offset(r, table, row + u * stride) : -1;
    }
    if constexpr (kFactor > 0) {
      if (packed) {
        using Words = Vec<std::uint32_t, 4 / kFactor>;
        Words in[kNearestRowsPerStep];
#pragma unroll
        for (int u = 0; u < kNearestRowsPerStep; ++u) {  // every load before the first store
          if (offset[u] >= 0) in[u] = *reinterpret_cast<const Words*>(x + offset[u] + column[0]);
        }
#pragma unroll
        for (int u = 0; u < kNearestRowsPerStep; ++u) {
          if (offset[u] >= 0) {
            *reinterpret_cast<Vec<std::uint32_t, 4>*>(y + (row + u * stride) * r.width + first_column) =
                repeat_elements<E, kFactor>(in[u]);
          }
        }
        continue;
      }
    }
    constexpr int kBatch = kFactor > 0 ? 1 : kNearestRowsPerStep;  // rows whose loads precede their stores
#pragma unroll
    for (int batch = 0; batch < kNearestRowsPerStep; batch += kBatch) {
      Vec<E, kVec> out[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (offset[batch + b] < 0) continue;
        const E* in = x + offset[batch + b];
#pragma unroll
        for (int k = 0; k < kVec; ++k) out[b].v[k] = in[column[k]];
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (offset[batch + b] >= 0) {
          *reinterpret_cast<Vec<E, kVec>*>(y + (row + (batch + b) * stride) * r.width + first_column) = out[b];
        }
      }
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) resize_linear_rows_kernel(const T* x, T* y, ResizeRows r) {
  const auto first_column = static_cast<std::int32_t>((blockIdx.x * blockDim.x + threadIdx.x) * kVec);
  if (first_column >= r.width) return;
  // Each column's taps along the innermost dimension: two when it is resized, else the column itself.
  std::int32_t column[kVec][2];
  float column_weight[kVec][2];
  const int column_taps = r.width_resized ? 2 : 1;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const std::int32_t o = first_column + k;
    column[k][0] = column[k][1] = o;
    column_weight[k][0] = 1.0f;
    column_weight[k][1] = 0.0f;
    if (r.width_resized) {
      const LinearTaps taps = row_linear_taps(r.coordinates, o, r.in_width, r.width, r.width_scale);
      column[k][0] = taps.index[0];
      column[k][1] = taps.index[1];
      column_weight[k][0] = taps.weight[0];
      column_weight[k][1] = taps.weight[1];
    }
  }
  const auto stride = static_cast<std::int32_t>(blockDim.y * gridDim.y);
  for (auto row = static_cast<std::int32_t>(blockIdx.y * blockDim.y + threadIdx.y); row < r.rows; row += stride) {
    // The row's taps: two input rows when an outer dimension is resized (at most one is), else one.
    std::int32_t offset[2] = {0, 0};
    float row_weight[2] = {1.0f, 0.0f};
    int row_taps = 1;
    std::int32_t rest = row;
#pragma unroll
    for (int d = 0; d < kMaxDims - 1; ++d) {
      if (d == r.outer) break;
      std::int32_t o = rest;  // the outermost dimension takes the rest
      if (d + 1 < r.outer) {
        rest = r.out_size[d].div(o);
        o -= rest * r.out_size[d].value();
      }
      if (r.resized[d]) {
        const LinearTaps taps = row_linear_taps(r.coordinates, o, r.in_size[d], r.out_size[d].value(), r.scale[d]);
        offset[1] = offset[0] + taps.index[1] * r.in_stride[d];
        offset[0] += taps.index[0] * r.in_stride[d];
        row_weight[0] = taps.weight[0];
        row_weight[1] = taps.weight[1];
        row_taps = 2;
      } else {
        offset[0] += o * r.in_stride[d];
        offset[1] += o * r.in_stride[d];
      }
    }
    Vec<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float sum = 0.0f;
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        if (a >= column_taps) break;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if (b >= row_taps) break;
          sum = __fmaf_rn(column_weight[k][a] * row_weight[b], to_float(x[offset[b] + column[k][a]]), sum);
        }
      }
      out.v[k] = from_float<T>(sum);
    }
    *reinterpret_cast<Vec<T, kVec>*>(y + row * r.width + first_column) = out;
  }
}

// Fills `rows` (Note [Resize rows]) and returns true when a row kernel covers the resize; false leaves it to the
// general kernel.
bool make_resize_rows(const ResizeGeometry& g, std::int64_t n, ResizeRows* rows) {
  constexpr std::int64_t kInt32 = std::numeric_limits<std::int32_t>::max();
  if (g.mode == ResizeMode::kCubic || n > kInt32 - kIndexHeadroom) return false;
  std::int64_t in_numel = 1;
  for (int d = 0; d < g.rank; ++d) in_numel *= g.in_size[d];
  if (in_numel > kInt32) return false;
  struct Dim {
    std::int64_t out, in, stride;
    int slot;  // -1: copied
  };
  std::vector<Dim> dims;
  for (int d = 0; d < g.rank; ++d) {
    const int slot = g.resized_slot[d];
    if (slot < 0 && g.in_size[d] == 1) continue;
    if (slot < 0 && !dims.empty() && dims.back().slot < 0) {  // contiguous: only size-1 dimensions between
      dims.back().out *= g.out_size[d];
      dims.back().in *= g.in_size[d];
      continue;
    }
    dims.push_back({g.out_size[d], g.in_size[d], g.in_stride[d], slot});
  }
  if (dims.empty()) dims.push_back({1, 1, 1, -1});
  int outer_resized = 0;
  for (std::size_t d = 1; d < dims.size(); ++d) outer_resized += dims[d].slot >= 0 ? 1 : 0;
  if (g.mode == ResizeMode::kLinear && outer_resized > 1) return false;
  rows->width = static_cast<std::int32_t>(dims[0].out);
  rows->in_width = static_cast<std::int32_t>(dims[0].in);
  rows->width_resized = dims[0].slot >= 0;
  rows->width_scale = dims[0].slot >= 0 ? g.scale[dims[0].slot] : 1.0f;
  rows->coordinates = g.coordinates;
  rows->nearest = g.nearest;
  rows->outer = static_cast<int>(dims.size()) - 1;
  std::int64_t row_count = 1;
  for (int d = 0; d < rows->outer; ++d) {
    const Dim& dim = dims[static_cast<std::size_t>(d) + 1];
    rows->out_size[d] = FastDivider(dim.out);
    rows->in_size[d] = static_cast<std::int32_t>(dim.in);
    rows->in_stride[d] = static_cast<std::int32_t>(dim.stride);
    rows->resized[d] = dim.slot >= 0;
    rows->scale[d] = dim.slot >= 0 ? g.scale[dim.slot] : 1.0f;
    row_count *= dim.out;
  }
  rows->rows = static_cast<std::int32_t>(row_count);
  rows->row_table = g.mode == ResizeMode::kNearest && rows->outer > 0 && rows->resized[0] &&
                    rows->out_size[0].divisor <= static_cast<std::uint32_t>(kRowTable);
  return true;
}

template <int kVec, typename E>
void launch_resize_rows(void (*kernel)(const E*, E*, ResizeRows), const void* x, void* y, const ResizeRows& rows,
                        cudaStream_t stream) {
  const std::int64_t chunks = rows.width / kVec;
  const std::int64_t threads_x = std::min<std::int64_t>(chunks, kThreads);
  const std::int64_t threads_y = kThreads / threads_x;
  const std::int64_t blocks_x = (chunks + threads_x - 1) / threads_x;
  const std::int64_t all_rows = (rows.rows + threads_y - 1) / threads_y;  // blocks_y for one row per thread
  const std::int64_t blocks_y =
      std::clamp<std::int64_t>(std::max((rows.rows + threads_y * kRowsPerThread - 1) / (threads_y * kRowsPerThread),
                                        (kMinRowBlocks + blocks_x - 1) / blocks_x),
                               1, std::min<std::int64_t>(all_rows, 65535));
  kernel<<<dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y)),
           dim3(static_cast<unsigned>(threads_x), static_cast<unsigned>(threads_y)), 0, stream>>>(
      static_cast<const E*>(x), static_cast<E*>(y), rows);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// Calls launch(std::integral_constant<int, V>{}) for V the widest of 8, 4, 2, 1 (at most 16 bytes of `T`) that
// divides the row width and whose vector `y` is aligned for.
template <typename T, typename Launch>
void with_row_vector(std::int32_t width, const void* y, Launch&& launch) {
  int vec = kVec16<T>;
  while (vec > 1 && (width % vec != 0 || !is_aligned(y, static_cast<std::size_t>(vec) * sizeof(T)))) vec /= 2;
  switch (vec) {
    case 8:
      if constexpr (kVec16<T> >= 8) launch(std::integral_constant<int, 8>{});
      return;
    case 4: launch(std::integral_constant<int, 4>{}); return;
    case 2: launch(std::integral_constant<int, 2>{}); return;
    default: launch(std::integral_constant<int, 1>{}); return;
  }
}

// The nearest row kernel for element type E (a copy: one kernel per element size) and kVec columns a thread.
template <typename E, int kVec>
void launch_resize_nearest_rows(const void* x, void* y, const ResizeRows& rows, cudaStream_t stream) {
  if constexpr (kVec == kVec16<E>) {  // whole words (Note [Resize rows])
    if (is_aligned(x, 16) && !rows.width_resized) {
      launch_resize_rows<kVec>(resize_nearest_rows_kernel<E, kVec, 1>, x, y, rows, stream);
      return;
    }
    // width % kVec == 0 (with_row_vector), so in_width % (kVec / 2) == 0: the input rows start on whole words.
    if (is_aligned(x, 16) && rows.width == 2 * static_cast<std::int64_t>(rows.in_width)) {
      launch_resize_rows<kVec>(resize_nearest_rows_kernel<E, kVec, 2>, x, y, rows, stream);
      return;
    }
  }
  launch_resize_rows<kVec>(resize_nearest_rows_kernel<E, kVec, 0>, x, y, rows, stream);
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
  ResizeRows rows;
  const bool by_rows = make_resize_rows(g, n, &rows);
  const cudaStream_t s = as_stream(stream);
  dispatch_float(dtype, "resize", [&](auto tag) {
    using T = decltype(tag);
    if (!by_rows) {
      resize_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n,
                                                                  g);
      XPURT_CUDA_RAW_LAUNCH_CHECK();
      return;
    }
    with_row_vector<T>(rows.width, y, [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      if (g.mode == ResizeMode::kNearest) {
        using E = std::conditional_t<sizeof(T) == 2, std::uint16_t, std::uint32_t>;
        launch_resize_nearest_rows<E, kVec>(x, y, rows, s);
      } else {
        launch_resize_rows<kVec>(resize_linear_rows_kernel<T, kVec>, x, y, rows, s);
      }
    });
  });
}

}  // namespace xpuruntime::cuda_raw
