// The data-dependent ops of segmented plans (Note [Segmented plans] in capture_plan.h): NonZero and
// NonMaxSuppression write their result into an output sized for the largest possible result plus a device count,
// so that they launch without a host synchronization (and inside a CUDA graph); the plan reads the counts once, at
// the segment's end.
//
// non_zero: three deterministic passes over tiles of kTile elements (count per tile, exclusive scan of the tile
// counts, write each tile's indices at its offset), so the indices come in row-major order as ONNX's NonZero gives
// them.
// non_max_suppression: a block per (batch, class) ranks the candidates by counting (score descending, ties: the
// smaller box index first, as a stable sort does), then walks them in that order, each kept box suppressing the
// later ones whose IoU exceeds the threshold (IoU in double, as the reference library computes it), and one block
// writes the kept (batch, class, box) triples in batch, class order.
#include <cub/block/block_scan.cuh>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

constexpr int kNonZeroThreads = 256;
constexpr int kNonZeroItems = 8;
constexpr std::int64_t kTile = kNonZeroThreads * kNonZeroItems;

struct Dims {
  std::int64_t size[kNonZeroMaxRank];
  int rank;
};

// Whether element i is nonzero: every bit but the sign bit of a float (so -0.0 is zero and NaN is not), every bit
// of an integer or bool.
template <typename U>
__device__ __forceinline__ bool nonzero_at(const U* x, std::int64_t i, U mask) {
  return (x[i] & mask) != 0;
}

template <typename U>
__global__ void non_zero_count_kernel(const U* x, std::int64_t n, U mask, std::int64_t* tile_counts) {
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * kTile;
  int local = 0;
  for (int k = 0; k < kNonZeroItems; ++k) {
    const std::int64_t i = begin + static_cast<std::int64_t>(threadIdx.x) * kNonZeroItems + k;
    if (i < n && nonzero_at(x, i, mask)) ++local;
  }
  using Scan = cub::BlockScan<int, kNonZeroThreads>;
  __shared__ typename Scan::TempStorage temp;
  int total = 0;
  Scan(temp).ExclusiveSum(local, local, total);
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}

// One block: tile_counts becomes its exclusive prefix sum; *count gets the total.
__global__ void non_zero_scan_kernel(std::int64_t* tile_counts, std::int64_t tiles, std::int64_t* count) {
  using Scan = cub::BlockScan<std::int64_t, 1024>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ std::int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (std::int64_t base = 0; base < tiles; base += 1024) {
    const std::int64_t i = base + threadIdx.x;
    std::int64_t v = i < tiles ? tile_counts[i] : 0;
    std::int64_t total = 0;
    Scan(temp).ExclusiveSum(v, v, total);
    if (i < tiles) tile_counts[i] = v + carry;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = carry;
}

template <typename U>
__global__ void non_zero_write_kernel(const U* x, std::int64_t n, U mask, Dims dims,
                                      const std::int64_t* tile_offsets, std::int64_t* y) {
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * kTile + threadIdx.x * kNonZeroItems;
  int local = 0;
  for (int k = 0; k < kNonZeroItems; ++k) {
    const std::int64_t i = begin + k;
    if (i < n && nonzero_at(x, i, mask)) ++local;
  }
  using Scan = cub::BlockScan<int, kNonZeroThreads>;
  __shared__ typename Scan::TempStorage temp;
  int offset = 0;
  Scan(temp).ExclusiveSum(local, offset);
  std::int64_t at = tile_offsets[blockIdx.x] + offset;
  for (int k = 0; k < kNonZeroItems; ++k) {
    const std::int64_t i = begin + k;
    if (i >= n || !nonzero_at(x, i, mask)) continue;
    std::int64_t rest = i;
    for (int d = dims.rank - 1; d >= 0; --d) {
      const std::int64_t size = dims.size[d];
      y[d * n + at] = rest % size;
      rest /= size;
    }
    ++at;
  }
}

template <typename U>
void launch_non_zero(const void* x, std::int64_t n, U mask, const Dims& dims, std::int64_t* y, std::int64_t* count,
                     std::int64_t* tile_counts, cudaStream_t stream) {
  const std::int64_t tiles = (n + kTile - 1) / kTile;
  const auto* xs = static_cast<const U*>(x);
  non_zero_count_kernel<U><<<static_cast<unsigned>(tiles), kNonZeroThreads, 0, stream>>>(xs, n, mask, tile_counts);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  non_zero_scan_kernel<<<1, 1024, 0, stream>>>(tile_counts, tiles, count);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  non_zero_write_kernel<U><<<static_cast<unsigned>(tiles), kNonZeroThreads, 0, stream>>>(xs, n, mask, dims,
                                                                                         tile_counts, y);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- NonMaxSuppression ----

template <typename T>
__device__ __forceinline__ double load(const T* p, std::int64_t i) {
  return static_cast<double>(to_float(p[i]));
}

// Corners (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2, as the reference library derives them.
template <typename T>
__device__ void corners_of(const T* box, bool center, double c[4]) {
  const double b0 = load(box, 0), b1 = load(box, 1), b2 = load(box, 2), b3 = load(box, 3);
  if (!center) {
    c[0] = fmin(b0, b2);
    c[1] = fmin(b1, b3);
    c[2] = fmax(b0, b2);
    c[3] = fmax(b1, b3);
  } else {
    c[0] = b1 - b3 / 2;
    c[1] = b0 - b2 / 2;
    c[2] = b1 + b3 / 2;
    c[3] = b0 + b2 / 2;
  }
}

__device__ double iou_of(const double a[4], const double b[4]) {
  const double area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
  if (area_a <= 0 || area_b <= 0) return 0.0;
  const double ih = fmin(a[2], b[2]) - fmax(a[0], b[0]);
  const double iw = fmin(a[3], b[3]) - fmax(a[1], b[1]);
  if (ih <= 0 || iw <= 0) return 0.0;
  const double inter = ih * iw;
  return inter / (area_a + area_b - inter);
}

// Workspace: order int32 [BC * S], removed uint8 [BC * S], kept int32 [BC * K], counts int32 [BC] (valid, kept).
struct NmsScratch {
  std::int32_t* order;
  std::uint8_t* removed;
  std::int32_t* kept;
  std::int32_t* valid;
  std::int32_t* kept_count;
};

template <typename T>
__global__ void nms_rank_kernel(const T* scores, NmsGeometry g, NmsScratch s) {
  const std::int64_t bc = blockIdx.x;
  const T* sc = scores + bc * g.boxes;
  std::int32_t* order = s.order + bc * g.boxes;
  __shared__ int valid;
  if (threadIdx.x == 0) valid = 0;
  __syncthreads();
  for (std::int64_t i = threadIdx.x; i < g.boxes; i += blockDim.x) {
    s.removed[bc * g.boxes + i] = 0;
    const double si = load(sc, i);
    if (g.has_score_threshold && !(si > g.score_threshold)) continue;
    atomicAdd(&valid, 1);  // a count only: the order below does not depend on it
    std::int64_t rank = 0;
    for (std::int64_t j = 0; j < g.boxes; ++j) {
      const double sj = load(sc, j);
      if (g.has_score_threshold && !(sj > g.score_threshold)) continue;
      if (sj > si || (sj == si && j < i)) ++rank;
    }
    order[rank] = static_cast<std::int32_t>(i);
  }
  __syncthreads();
  if (threadIdx.x == 0) s.valid[bc] = valid;
}

template <typename T>
__global__ void nms_select_kernel(const T* boxes, NmsGeometry g, NmsScratch s) {
  const std::int64_t bc = blockIdx.x;
  const std::int64_t b = bc / g.classes;
  const T* bx = boxes + b * g.boxes * 4;
  const std::int32_t* order = s.order + bc * g.boxes;
  std::uint8_t* removed = s.removed + bc * g.boxes;
  std::int32_t* kept = s.kept + bc * g.max_per_class;
  const int n = s.valid[bc];
  int count = 0;
  for (int r = 0; r < n && count < g.max_per_class; ++r) {
    __syncthreads();  // the removals of the previous kept box are visible
    if (removed[r]) continue;
    const int i = order[r];
    if (threadIdx.x == 0) kept[count] = i;
    ++count;
    if (count == g.max_per_class) break;
    double ci[4];
    corners_of(bx + static_cast<std::int64_t>(i) * 4, g.center_point_box, ci);
    for (int q = r + 1 + static_cast<int>(threadIdx.x); q < n; q += blockDim.x) {
      if (removed[q]) continue;
      double cq[4];
      corners_of(bx + static_cast<std::int64_t>(order[q]) * 4, g.center_point_box, cq);
      if (iou_of(ci, cq) > g.iou_threshold) removed[q] = 1;
    }
  }
  if (threadIdx.x == 0) s.kept_count[bc] = count;
}

// One block: the kept triples of every (batch, class) in order, and the total.
__global__ void nms_write_kernel(NmsGeometry g, NmsScratch s, std::int64_t* selected, std::int64_t* count) {
  const std::int64_t pairs = g.batches * g.classes;
  std::int64_t at = 0;
  for (std::int64_t bc = 0; bc < pairs; ++bc) {
    const int n = s.kept_count[bc];
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
      std::int64_t* row = selected + (at + k) * 3;
      row[0] = bc / g.classes;
      row[1] = bc % g.classes;
      row[2] = s.kept[bc * g.max_per_class + k];
    }
    at += n;
  }
  if (threadIdx.x == 0) *count = at;
}

std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

NmsScratch scratch_of(const NmsGeometry& g, void* workspace) {
  const auto pairs = static_cast<std::size_t>(g.batches * g.classes);
  auto* p = static_cast<std::uint8_t*>(workspace);
  NmsScratch s{};
  s.order = reinterpret_cast<std::int32_t*>(p);
  p += align256(pairs * static_cast<std::size_t>(g.boxes) * sizeof(std::int32_t));
  s.removed = p;
  p += align256(pairs * static_cast<std::size_t>(g.boxes));
  s.kept = reinterpret_cast<std::int32_t*>(p);
  p += align256(pairs * static_cast<std::size_t>(g.max_per_class) * sizeof(std::int32_t));
  s.valid = reinterpret_cast<std::int32_t*>(p);
  p += align256(pairs * sizeof(std::int32_t));
  s.kept_count = reinterpret_cast<std::int32_t*>(p);
  return s;
}

}  // namespace

std::size_t non_zero_workspace_bytes(std::int64_t numel) {
  return static_cast<std::size_t>(std::max<std::int64_t>(1, (numel + kTile - 1) / kTile)) * sizeof(std::int64_t);
}

void non_zero(const void* x, DType dtype, const std::vector<std::int64_t>& shape, void* y, void* count,
              void* workspace, void* stream) {
  XPURT_CHECK(!shape.empty() && shape.size() <= static_cast<std::size_t>(kNonZeroMaxRank),
              "cuda_raw::non_zero: rank 1 to ", kNonZeroMaxRank, ", got ", shape.size());
  Dims dims{};
  dims.rank = static_cast<int>(shape.size());
  std::int64_t n = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    dims.size[d] = shape[d];
    n *= shape[d];
  }
  auto* out = static_cast<std::int64_t*>(y);
  auto* total = static_cast<std::int64_t*>(count);
  const cudaStream_t s = as_stream(stream);
  if (n == 0) {
    XPURT_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(std::int64_t), s));
    return;
  }
  // The columns past the count are zero (as the cpu kernel leaves them): the output never holds stale bytes.
  XPURT_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(n * dims.rank) * sizeof(std::int64_t), s));
  auto* tiles = static_cast<std::int64_t*>(workspace);
  switch (dtype) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
      return launch_non_zero<std::uint8_t>(x, n, 0xffu, dims, out, total, tiles, s);
    case DType::kInt16:
    case DType::kUInt16:
      return launch_non_zero<std::uint16_t>(x, n, 0xffffu, dims, out, total, tiles, s);
    case DType::kFloat16:
    case DType::kBFloat16:
      return launch_non_zero<std::uint16_t>(x, n, 0x7fffu, dims, out, total, tiles, s);
    case DType::kInt32:
    case DType::kUInt32:
      return launch_non_zero<std::uint32_t>(x, n, 0xffffffffu, dims, out, total, tiles, s);
    case DType::kFloat32:
      return launch_non_zero<std::uint32_t>(x, n, 0x7fffffffu, dims, out, total, tiles, s);
    case DType::kInt64:
    case DType::kUInt64:
      return launch_non_zero<unsigned long long>(x, n, ~0ull, dims, out, total, tiles, s);
    case DType::kFloat64:
      return launch_non_zero<unsigned long long>(x, n, 0x7fffffffffffffffull, dims, out, total, tiles, s);
    default:
      throw UnsupportedOperationError(
          ::xpuruntime::detail::str_cat("cuda_raw::non_zero does not take ", dtype_name(dtype)));
  }
}

std::size_t nms_workspace_bytes(const NmsGeometry& g) {
  const auto pairs = static_cast<std::size_t>(g.batches * g.classes);
  return align256(pairs * static_cast<std::size_t>(g.boxes) * sizeof(std::int32_t)) +
         align256(pairs * static_cast<std::size_t>(g.boxes)) +
         align256(pairs * static_cast<std::size_t>(g.max_per_class) * sizeof(std::int32_t)) +
         align256(pairs * sizeof(std::int32_t)) + align256(pairs * sizeof(std::int32_t));
}

void non_max_suppression(const void* boxes, const void* scores, DType dtype, const NmsGeometry& g, void* selected,
                         void* count, void* workspace, void* stream) {
  const cudaStream_t s = as_stream(stream);
  auto* total = static_cast<std::int64_t*>(count);
  const std::int64_t pairs = g.batches * g.classes;
  if (pairs == 0 || g.boxes == 0 || g.max_per_class == 0) {
    XPURT_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(std::int64_t), s));
    return;
  }
  XPURT_CUDA_CHECK(cudaMemsetAsync(selected, 0, static_cast<std::size_t>(pairs * g.max_per_class * 3) *
                                                    sizeof(std::int64_t), s));
  const NmsScratch scratch = scratch_of(g, workspace);
  dispatch_float(dtype, "non_max_suppression", [&](auto tag) {
    using T = decltype(tag);
    nms_rank_kernel<T><<<static_cast<unsigned>(pairs), 256, 0, s>>>(static_cast<const T*>(scores), g, scratch);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
    nms_select_kernel<T><<<static_cast<unsigned>(pairs), 256, 0, s>>>(static_cast<const T*>(boxes), g, scratch);
    XPURT_CUDA_RAW_LAUNCH_CHECK();
  });
  nms_write_kernel<<<1, 256, 0, s>>>(g, scratch, static_cast<std::int64_t*>(selected), total);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace xpuruntime::cuda_raw
