// Depthwise 2-D convolution (groups == channels == outputs), NCHW: the convolutions of ConvNeXt, EfficientNet and
// MobileNet, which cuDNN runs with a slow grouped direct kernel in float16 NCHW (issue 19's profile: 1.3 of
// ConvNeXt-T's 2.5 ms at batch 16).
//
// Note [Depthwise tiles]
// A block computes one tile of one (n, c) plane: it stages the input rows and columns the tile reads (the halo
// included, zeros outside the image) and the channel's kh x kw weights in shared memory as float, then each thread
// computes one output from shared memory with fp32 accumulation, adds bias and residual and applies relu. The tile
// is as wide as the output (up to 32) and 256 / width rows high, so small late-stage planes (7 x 7) do not leave
// most threads idle. Any kernel size, stride, dilation and padding; each output is computed by one thread in a fixed
// order, so the bits do not depend on the launch.
//
// Note [Channels-last depthwise]
// Channels-last (NHWC) depthwise convolutions are what lets EfficientNet, MobileNet and ConvNeXt run channels-last
// end to end (nhwc_layout, Note [Layouts propagate]). A block takes a tile of output columns for a group of channels
// (a multiple of 8: 16-byte loads), stages the input it reads in shared memory as float, and each thread computes
// kColumnOutputs outputs down one column of one channel, the channel's weights in registers. The tile's channels
// grow where the output is narrow (7 x 7 planes: 8 columns by 32 channels), so late stages still fill 256 threads.
// Each staged element is converted from 16 bits once: a first version converted every input per use (16-byte
// vectors of channels in registers) and ran ConvNeXt's 7x7 layers 1.7x slower than the NCHW kernel, bound by
// the conversions. Channel counts that are not a multiple of 8 (ShuffleNetV2's 58 and 116) or an input not
// 16-byte aligned stage element by element instead, the tile's channels past the last masked (Note [Depthwise
// channels in part tiles]). Other shapes (dilation, other kernel sizes) take a plain kernel with one thread per
// output. All accumulate in fp32 in a fixed order.
//
// Note [Depthwise channel groups side by side]
// A channels-last tile reads and writes `channels` of a pixel's channels: 32 bytes of each pixel's 128 where 16
// float16 channels of 64 make a tile. The blocks of one spatial tile's channel groups are neighbours in blockIdx.x
// (the group varies fastest), so they run at about the same time and share each 128-byte line while it is in L2.
// With the group in the slowest grid dim (as first written), a group's blocks came a pass over a whole image after
// the previous group's, the line's other quarters read and written again from wherever that pass left them.
//
// Note [Depthwise channels in part tiles]
// ShuffleNetV2's depthwise layers have 58, 116 and 232 channels; the first two took the one-thread-per-output
// kernel, which reads each input K x K times from the cache: 12.7 us a layer at batch 16 on an H200, 165 us of an
// 0.85 ms run. The tiled kernel takes them in tiles of 8 to 32 channels; a tile may reach past the last channel,
// where it stages zeros, holds zero weights and writes nothing. Staging is one element per thread per step
// (consecutive threads consecutive channels, so a warp still reads each pixel's channel run in whole sectors).
#include <algorithm>

#include "backends/cuda_raw/cuda_raw_common.cuh"
#include "backends/cuda_raw/cuda_raw_kernels.h"

namespace xpuruntime::cuda_raw {

namespace {

using namespace detail;  // NOLINT: the backend's own helpers

// The fused activation (after bias and residual); NaN stays NaN.
__device__ __forceinline__ float activate(float v, DepthwiseActivation a) {
  switch (a) {
    case DepthwiseActivation::kRelu: return relu(v);
    case DepthwiseActivation::kRelu6: return relu6(v);
    case DepthwiseActivation::kSilu: return silu(v);
    case DepthwiseActivation::kHardSwish: return hard_swish(v);
    case DepthwiseActivation::kGelu: return gelu_erf(v);
    case DepthwiseActivation::kGeluTanh: return gelu_tanh(v);
    case DepthwiseActivation::kNone: break;
  }
  return v;
}

template <typename T>
__global__ void depthwise_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                 const T* __restrict__ residual, T* __restrict__ y, DepthwiseGeometry g, int tile_w,
                                 int tile_h) {
  extern __shared__ float staged[];
  const int nc = blockIdx.z;
  const int c = nc % g.channels;
  const int oh0 = blockIdx.y * tile_h;
  const int ow0 = blockIdx.x * tile_w;
  const int ih0 = oh0 * g.stride_h - g.pad_top;
  const int iw0 = ow0 * g.stride_w - g.pad_left;
  const int rows = (tile_h - 1) * g.stride_h + (g.kernel_h - 1) * g.dilation_h + 1;
  const int cols = (tile_w - 1) * g.stride_w + (g.kernel_w - 1) * g.dilation_w + 1;
  float* tile = staged;
  float* weights = staged + rows * cols;
  const T* plane = x + static_cast<std::int64_t>(nc) * g.in_h * g.in_w;
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    const int r = i / cols, col = i - r * cols;
    const int ih = ih0 + r, iw = iw0 + col;
    tile[i] = (ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w) ? to_float(plane[ih * g.in_w + iw]) : 0.0f;
  }
  const int taps = g.kernel_h * g.kernel_w;
  for (int i = threadIdx.x; i < taps; i += blockDim.x) weights[i] = to_float(w[c * taps + i]);
  __syncthreads();
  const int tx = threadIdx.x % tile_w, ty = threadIdx.x / tile_w;
  const int oh = oh0 + ty, ow = ow0 + tx;
  if (ty >= tile_h || oh >= g.out_h || ow >= g.out_w) return;
  float acc = 0.0f;
  const float* base = tile + ty * g.stride_h * cols + tx * g.stride_w;
  for (int kh = 0; kh < g.kernel_h; ++kh) {
    const float* row = base + kh * g.dilation_h * cols;
    const float* wrow = weights + kh * g.kernel_w;
    for (int kw = 0; kw < g.kernel_w; ++kw) acc = fmaf(row[kw * g.dilation_w], wrow[kw], acc);
  }
  if (bias != nullptr) acc += to_float(bias[c]);
  const std::int64_t o = (static_cast<std::int64_t>(nc) * g.out_h + oh) * g.out_w + ow;
  if (residual != nullptr) acc += to_float(residual[o]);
  acc = activate(acc, g.activation);
  y[o] = from_float<T>(acc);
}

// The common shapes (square kernels of 3, 5 or 7, stride 1 or 2, no dilation): weights in registers, and each
// thread computes kRows outputs down a column, so an input row staged in shared memory is read once for every
// output row it feeds (about 0.4 shared loads per multiply-add for 7x7, against 2 in depthwise_kernel).
constexpr int kRows = 4;

// Note [Depthwise planes per block]: where one tile covers a whole plane (the 14 x 14 and 7 x 7 planes of late
// stages), a block takes `planes` of them, one tile of threads each, so that blocks keep about 256 threads instead of
// 14 or 56 (7 x 7 outputs of 4 rows each is 14 threads).
template <typename T, int K, int S>
__global__ void depthwise_rows_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                                      const T* __restrict__ residual, T* __restrict__ y, DepthwiseGeometry g,
                                      int tile_w, int tile_h, int planes) {
  extern __shared__ float shared_tiles[];
  const int tile_threads = tile_w * tile_h;
  const int local = static_cast<int>(threadIdx.x) % tile_threads;
  const int nc = static_cast<int>(blockIdx.z) * planes + static_cast<int>(threadIdx.x) / tile_threads;
  const bool active = nc < g.batch * g.channels;  // the last block's spare planes only join the barrier
  const int c = nc % g.channels;
  const int out_rows = tile_h * kRows;
  const int oh0 = blockIdx.y * out_rows;
  const int ow0 = blockIdx.x * tile_w;
  const int ih0 = oh0 * S - g.pad_top;
  const int iw0 = ow0 * S - g.pad_left;
  const int rows = (out_rows - 1) * S + K;
  const int cols = (tile_w - 1) * S + K;
  float* staged = shared_tiles + (static_cast<int>(threadIdx.x) / tile_threads) * rows * cols;
  const T* plane = x + static_cast<std::int64_t>(nc) * g.in_h * g.in_w;
  for (int i = local; active && i < rows * cols; i += tile_threads) {
    const int r = i / cols, col = i - r * cols;
    const int ih = ih0 + r, iw = iw0 + col;
    staged[i] = (ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w) ? to_float(plane[ih * g.in_w + iw]) : 0.0f;
  }
  float wr[K * K];
#pragma unroll
  for (int i = 0; i < K * K; ++i) wr[i] = active ? to_float(w[c * K * K + i]) : 0.0f;
  __syncthreads();
  const int tx = local % tile_w, ty = local / tile_w;
  const int ow = ow0 + tx;
  if (!active || ty >= tile_h || ow >= g.out_w) return;
  float acc[kRows];
#pragma unroll
  for (int p = 0; p < kRows; ++p) acc[p] = 0.0f;
  const float* base = staged + (ty * kRows * S) * cols + tx * S;
#pragma unroll
  for (int r = 0; r < (kRows - 1) * S + K; ++r) {
#pragma unroll
    for (int kw = 0; kw < K; ++kw) {
      const float v = base[r * cols + kw];
#pragma unroll
      for (int p = 0; p < kRows; ++p) {
        const int kh = r - p * S;
        if (kh >= 0 && kh < K) acc[p] = fmaf(v, wr[kh * K + kw], acc[p]);
      }
    }
  }
  const float b = bias != nullptr ? to_float(bias[c]) : 0.0f;
#pragma unroll
  for (int p = 0; p < kRows; ++p) {
    const int oh = oh0 + ty * kRows + p;
    if (oh >= g.out_h) break;
    float out = acc[p] + b;
    const std::int64_t o = (static_cast<std::int64_t>(nc) * g.out_h + oh) * g.out_w + ow;
    if (residual != nullptr) out += to_float(residual[o]);
    out = activate(out, g.activation);
    y[o] = from_float<T>(out);
  }
}

// A block's tile: tile_w x tile_h threads and the shared memory its staged input takes; `planes` tiles per block
// (Note [Depthwise planes per block]; depthwise_rows_kernel only).
struct Tile {
  int tile_w = 1, tile_h = 1;
  std::size_t shared = 0;
  int planes = 1;
};

// depthwise_rows_kernel's tile: up to 32 x 8 threads of kRows outputs each, fewer rows where the staged input would
// pass 48 KiB (a narrow, tall image: one column of 1024 outputs at stride 2 stages 2053 x 7 floats).
Tile rows_tile(const DepthwiseGeometry& g, int k, int s) {
  Tile t;
  t.tile_w = std::min(32, std::max(1, g.out_w));
  t.tile_h = std::max(1, std::min(256 / t.tile_w, (g.out_h + kRows - 1) / kRows));
  const int cols = (t.tile_w - 1) * s + k;
  for (;; --t.tile_h) {
    const int rows = (t.tile_h * kRows - 1) * s + k;
    t.shared = static_cast<std::size_t>(rows * cols) * sizeof(float);
    if (t.shared <= 48 * 1024 || t.tile_h == 1) break;
  }
  // One tile covers the plane: as many planes as keep the block near 256 threads and its tiles within 48 KiB.
  if (t.tile_w >= g.out_w && t.tile_h * kRows >= g.out_h) {
    const std::int64_t total = static_cast<std::int64_t>(g.batch) * g.channels;
    const int by_threads = std::max(1, 256 / (t.tile_w * t.tile_h));
    const int by_memory = static_cast<int>(std::max<std::size_t>(1, 48 * 1024 / t.shared));
    t.planes = static_cast<int>(std::min<std::int64_t>({by_threads, by_memory, std::max<std::int64_t>(1, total)}));
    t.shared *= static_cast<std::size_t>(t.planes);
  }
  return t;
}

// depthwise_kernel's tile (Note [Depthwise tiles]): 32 columns (fewer for a narrower output) by 256 / width rows.
Tile generic_tile(const DepthwiseGeometry& g) {
  Tile t;
  t.tile_w = std::min(32, std::max(1, g.out_w));
  t.tile_h = std::max(1, 256 / t.tile_w);
  const int rows = (t.tile_h - 1) * g.stride_h + (g.kernel_h - 1) * g.dilation_h + 1;
  const int cols = (t.tile_w - 1) * g.stride_w + (g.kernel_w - 1) * g.dilation_w + 1;
  t.shared = static_cast<std::size_t>(rows * cols + g.kernel_h * g.kernel_w) * sizeof(float);
  return t;
}

template <typename T, int K, int S>
bool launch_rows(const void* x, const void* w, const void* bias, const void* residual, void* y,
                 const DepthwiseGeometry& g, void* stream) {
  if (g.kernel_h != K || g.kernel_w != K || g.stride_h != S || g.stride_w != S || g.dilation_h != 1 ||
      g.dilation_w != 1) {
    return false;
  }
  const Tile t = rows_tile(g, K, S);
  const int tile_w = t.tile_w, tile_h = t.tile_h;
  const std::size_t shared = t.shared;
  const std::int64_t planes = static_cast<std::int64_t>(g.batch) * g.channels;
  const dim3 grid(static_cast<unsigned>((g.out_w + tile_w - 1) / tile_w),
                  static_cast<unsigned>((g.out_h + tile_h * kRows - 1) / (tile_h * kRows)),
                  static_cast<unsigned>((planes + t.planes - 1) / t.planes));
  depthwise_rows_kernel<T, K, S><<<grid, tile_w * tile_h * t.planes, shared, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
      static_cast<const T*>(residual), static_cast<T*>(y), g, tile_w, tile_h, t.planes);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  return true;
}

template <typename T>
void launch(const void* x, const void* w, const void* bias, const void* residual, void* y, const DepthwiseGeometry& g,
            DepthwiseActivation activation, void* stream) {
  DepthwiseGeometry rg = g;
  rg.activation = activation;
  if (launch_rows<T, 3, 1>(x, w, bias, residual, y, rg, stream) ||
      launch_rows<T, 3, 2>(x, w, bias, residual, y, rg, stream) ||
      launch_rows<T, 5, 1>(x, w, bias, residual, y, rg, stream) ||
      launch_rows<T, 5, 2>(x, w, bias, residual, y, rg, stream) ||
      launch_rows<T, 7, 1>(x, w, bias, residual, y, rg, stream) ||
      launch_rows<T, 7, 2>(x, w, bias, residual, y, rg, stream)) {
    return;
  }
  const Tile t = generic_tile(g);
  const int width = t.tile_w, tile_h = t.tile_h;
  const std::size_t shared = t.shared;
  const dim3 grid(static_cast<unsigned>((g.out_w + width - 1) / width),
                  static_cast<unsigned>((g.out_h + tile_h - 1) / tile_h), static_cast<unsigned>(g.batch * g.channels));
  depthwise_kernel<T><<<grid, width * tile_h, shared, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
      static_cast<const T*>(residual), static_cast<T*>(y), rg, width, tile_h);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

// ---- channels-last (Note [Channels-last depthwise]) ----

// Outputs per thread down a column: 8 at stride 1, 4 at stride 2 (whose staged rows are twice as many).
template <int S>
constexpr int kColumnOutputs = S == 1 ? 8 : 4;

// A block's channels-last tile: `channels` channels (a multiple of 8) by `tile_w` output columns, one thread per
// (channel, column) computing kColumnOutputs<S> outputs down the column.
struct NhwcTile {
  int channels = 8, tile_w = 32;
  std::size_t shared = 0;
};

template <int K, int S>
NhwcTile nhwc_tile(const DepthwiseGeometry& g, bool wide) {
  NhwcTile t;
  // Columns: the output width up to 256 / 16; channels: the rest of 256 threads (16 at least, for full 32-byte
  // sectors, where the channel count allows), so 7x7 planes still fill a block. Wide tiles divide the channels;
  // part tiles (Note [Depthwise channels in part tiles]) grow while they do not pass the channel count.
  t.tile_w = std::min(g.out_w, (wide ? g.channels % 16 == 0 : g.channels >= 16) ? 16 : 32);
  t.channels = 8;
  while (t.channels * 2 * t.tile_w <= 256 &&
         (wide ? g.channels % (t.channels * 2) == 0 : t.channels < g.channels)) {
    t.channels *= 2;
  }
  for (;;) {
    const int rows = (kColumnOutputs<S> - 1) * S + K;
    const int cols = (t.tile_w - 1) * S + K;
    t.shared = static_cast<std::size_t>(rows * cols * t.channels) * sizeof(float);
    if (t.shared <= 48 * 1024 || t.tile_w == 1) break;
    t.tile_w = std::max(1, t.tile_w / 2);
  }
  return t;
}

// The input a channels-last block stages: image n, channels [c0, c0 + channels), rows and columns from (ih0, iw0).
struct StagedTile {
  std::int64_t n;
  int c0, ih0, iw0, rows, cols, channels;
};

// Note [Depthwise staging loads in flight]
// Staging is the memory-bound part of a channels-last block, and a loop that stores each load's values before the
// next load leaves one load in flight per thread: eight blocks of an SM then kept about as many bytes in flight as
// the copy bandwidth needs, only while all of them were staging. Each thread now issues kStageInFlight loads before
// it converts and stores any.
constexpr int kStageInFlight = 2;

// Whole 16-byte vectors of 8 channels (the tile's channels a multiple of 8, x 16-byte aligned), stored as float
// with 16-byte shared-memory stores (neighbouring threads' vectors are 32 bytes apart: 4-byte stores hit 8-way on
// the banks). Pixels outside the image stage zeros.
template <typename T>
__device__ __forceinline__ void stage_vectors(const T* __restrict__ x, float* staged, const DepthwiseGeometry& g,
                                              const StagedTile& t) {
  constexpr int V = 8, kLoad = kVec16<T>, kParts = V / kLoad;
  const int vectors = t.channels / V, total = t.rows * t.cols * vectors;
  const int step = static_cast<int>(blockDim.x);
  for (int base = static_cast<int>(threadIdx.x); base < total; base += kStageInFlight * step) {
    Vec<T, kLoad> loaded[kStageInFlight][kParts];
    bool inside[kStageInFlight];
#pragma unroll
    for (int u = 0; u < kStageInFlight; ++u) {
      const int i = base + u * step, pixel = i / vectors;
      const int r = pixel / t.cols, ih = t.ih0 + r, iw = t.iw0 + pixel - r * t.cols;
      inside[u] = i < total && ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
      if (inside[u]) {
        const T* from = x + ((t.n * g.in_h + ih) * g.in_w + iw) * g.channels + t.c0 + (i % vectors) * V;
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          loaded[u][part] = *reinterpret_cast<const Vec<T, kLoad>*>(from + part * kLoad);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kStageInFlight; ++u) {
      const int i = base + u * step;
      if (i >= total) break;
      float v[V];
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
#pragma unroll
        for (int e = 0; e < kLoad; ++e) v[part * kLoad + e] = inside[u] ? to_float(loaded[u][part].v[e]) : 0.0f;
      }
      float4* to = reinterpret_cast<float4*>(staged + (i / vectors) * t.channels + (i % vectors) * V);
      to[0] = make_float4(v[0], v[1], v[2], v[3]);
      to[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

// One element per thread and step (Note [Depthwise channels in part tiles]): channels past the last stage zeros.
template <typename T>
__device__ __forceinline__ void stage_elements(const T* __restrict__ x, float* staged, const DepthwiseGeometry& g,
                                               const StagedTile& t) {
  const int total = t.rows * t.cols * t.channels, step = static_cast<int>(blockDim.x);
  for (int base = static_cast<int>(threadIdx.x); base < total; base += kStageInFlight * step) {
    float v[kStageInFlight];
#pragma unroll
    for (int u = 0; u < kStageInFlight; ++u) {
      const int i = base + u * step, e = i % t.channels, pixel = i / t.channels;
      const int r = pixel / t.cols, ih = t.ih0 + r, iw = t.iw0 + pixel - r * t.cols;
      const bool inside = i < total && ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w && t.c0 + e < g.channels;
      v[u] = inside ? to_float(x[((t.n * g.in_h + ih) * g.in_w + iw) * g.channels + t.c0 + e]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kStageInFlight; ++u) {
      if (base + u * step < total) staged[base + u * step] = v[u];
    }
  }
}

// Note [Channels-last depthwise]: the block stages its input tile [rows][cols][channels] as float (each element
// converted once: converting per use made the 7x7 layers conversion-bound), then each thread multiplies down its
// column from shared memory with its channel's K x K weights in registers. Consecutive threads are consecutive
// channels, so staged reads are conflict-free at stride 1. kWide: the tile's channels are whole 16-byte vectors
// inside the channel count; otherwise staged per element and masked (Note [Depthwise channels in part tiles]).
template <typename T, int K, int S, bool kWide>
__global__ void __launch_bounds__(256) depthwise_nhwc_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                             const T* __restrict__ bias,
                                                             const T* __restrict__ residual, T* __restrict__ y,
                                                             DepthwiseGeometry g, int channels, int tile_w) {
  constexpr int R = kColumnOutputs<S>;
  extern __shared__ __align__(16) float staged_nhwc[];
  const int rows = (R - 1) * S + K;
  const int cols = (tile_w - 1) * S + K;
  const int groups = (g.channels + channels - 1) / channels;
  const std::int64_t n = blockIdx.z;  // Note [Depthwise channel groups side by side]: the group varies fastest
  const int c0 = static_cast<int>(blockIdx.x % groups) * channels;
  const int oh0 = static_cast<int>(blockIdx.y) * R, ow0 = static_cast<int>(blockIdx.x / groups) * tile_w;
  const int ih0 = oh0 * S - g.pad_top, iw0 = ow0 * S - g.pad_left;
  const StagedTile tile{n, c0, ih0, iw0, rows, cols, channels};
  if constexpr (kWide) {
    stage_vectors(x, staged_nhwc, g, tile);
  } else {
    stage_elements(x, staged_nhwc, g, tile);
  }
  const int lane_c = static_cast<int>(threadIdx.x) % channels, tx = static_cast<int>(threadIdx.x) / channels;
  const int c = c0 + lane_c;
  const bool channel = kWide || c < g.channels;
  float wr[K * K];
#pragma unroll
  for (int i = 0; i < K * K; ++i) wr[i] = channel ? to_float(w[static_cast<std::int64_t>(c) * K * K + i]) : 0.0f;
  __syncthreads();
  const int ow = ow0 + tx;
  if (tx >= tile_w || ow >= g.out_w || !channel) return;
  float acc[R];
#pragma unroll
  for (int p = 0; p < R; ++p) acc[p] = 0.0f;
  const float* base = staged_nhwc + (tx * S) * channels + lane_c;
#pragma unroll
  for (int r = 0; r < rows; ++r) {
#pragma unroll
    for (int kw = 0; kw < K; ++kw) {
      const float v = base[(r * cols + kw) * channels];
#pragma unroll
      for (int p = 0; p < R; ++p) {
        const int kh = r - p * S;
        if (kh >= 0 && kh < K) acc[p] = fmaf(v, wr[kh * K + kw], acc[p]);
      }
    }
  }
  const float b = bias != nullptr ? to_float(bias[c]) : 0.0f;
#pragma unroll
  for (int p = 0; p < R; ++p) {
    const int oh = oh0 + p;
    if (oh >= g.out_h) break;
    const std::int64_t o = ((n * g.out_h + oh) * g.out_w + ow) * g.channels + c;
    float out = acc[p] + b;
    if (residual != nullptr) out += to_float(residual[o]);
    out = activate(out, g.activation);
    y[o] = from_float<T>(out);
  }
}

// Any geometry: one thread per output, channels fastest.
template <typename T>
__global__ void depthwise_nhwc_generic_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                              const T* __restrict__ bias, const T* __restrict__ residual,
                                              T* __restrict__ y, DepthwiseGeometry g) {
  const std::int64_t total = static_cast<std::int64_t>(g.batch) * g.out_h * g.out_w * g.channels;
  const int taps = g.kernel_h * g.kernel_w;
  for (std::int64_t o = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; o < total;
       o += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(o % g.channels);
    std::int64_t p = o / g.channels;
    const int ow = static_cast<int>(p % g.out_w);
    p /= g.out_w;
    const int oh = static_cast<int>(p % g.out_h);
    const std::int64_t n = p / g.out_h;
    float acc = 0.0f;
    for (int kh = 0; kh < g.kernel_h; ++kh) {
      const int ih = oh * g.stride_h - g.pad_top + kh * g.dilation_h;
      if (ih < 0 || ih >= g.in_h) continue;
      for (int kw = 0; kw < g.kernel_w; ++kw) {
        const int iw = ow * g.stride_w - g.pad_left + kw * g.dilation_w;
        if (iw < 0 || iw >= g.in_w) continue;
        acc = fmaf(to_float(x[((n * g.in_h + ih) * g.in_w + iw) * g.channels + c]),
                   to_float(w[static_cast<std::int64_t>(c) * taps + kh * g.kernel_w + kw]), acc);
      }
    }
    if (bias != nullptr) acc += to_float(bias[c]);
    if (residual != nullptr) acc += to_float(residual[o]);
    acc = activate(acc, g.activation);
    y[o] = from_float<T>(acc);
  }
}

template <typename T, int K, int S>
bool launch_nhwc(const void* x, const void* w, const void* bias, const void* residual, void* y,
                 const DepthwiseGeometry& g, void* stream) {
  if (g.kernel_h != K || g.kernel_w != K || g.stride_h != S || g.stride_w != S || g.dilation_h != 1 ||
      g.dilation_w != 1) {
    return false;
  }
  const bool wide = g.channels % 8 == 0 && is_aligned(x, 16);
  const NhwcTile t = nhwc_tile<K, S>(g, wide);
  // Note [Depthwise channel groups side by side]: blockIdx.x = column tile * groups + channel group.
  const std::int64_t groups = (g.channels + t.channels - 1) / t.channels;
  const std::int64_t rows = (g.out_h + kColumnOutputs<S> - 1) / kColumnOutputs<S>;
  if (t.shared > 48 * 1024 || g.batch > 65535 || rows > 65535) return false;  // gridDim.y's and .z's limits
  const dim3 grid(static_cast<unsigned>((g.out_w + t.tile_w - 1) / t.tile_w * groups), static_cast<unsigned>(rows),
                  static_cast<unsigned>(g.batch));
  auto* const kernel = wide ? depthwise_nhwc_kernel<T, K, S, true> : depthwise_nhwc_kernel<T, K, S, false>;
  kernel<<<grid, t.channels * t.tile_w, t.shared, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
      static_cast<const T*>(residual), static_cast<T*>(y), g, t.channels, t.tile_w);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
  return true;
}

template <typename T>
void launch_channels_last(const void* x, const void* w, const void* bias, const void* residual, void* y,
                          const DepthwiseGeometry& g, DepthwiseActivation activation, void* stream) {
  DepthwiseGeometry rg = g;
  rg.activation = activation;
  if (launch_nhwc<T, 3, 1>(x, w, bias, residual, y, rg, stream) ||
      launch_nhwc<T, 3, 2>(x, w, bias, residual, y, rg, stream) ||
      launch_nhwc<T, 5, 1>(x, w, bias, residual, y, rg, stream) ||
      launch_nhwc<T, 5, 2>(x, w, bias, residual, y, rg, stream) ||
      launch_nhwc<T, 7, 1>(x, w, bias, residual, y, rg, stream) ||
      launch_nhwc<T, 7, 2>(x, w, bias, residual, y, rg, stream)) {
    return;
  }
  const std::int64_t total = static_cast<std::int64_t>(g.batch) * g.out_h * g.out_w * g.channels;
  depthwise_nhwc_generic_kernel<T><<<grid_for(total, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
      static_cast<const T*>(residual), static_cast<T*>(y), rg);
  XPURT_CUDA_RAW_LAUNCH_CHECK();
}

}  // namespace

std::size_t depthwise_shared_bytes(const DepthwiseGeometry& g) { return generic_tile(g).shared; }

void depthwise_conv2d(const void* x, const void* w, const void* bias, const void* residual, void* y, DType dtype,
                      const DepthwiseGeometry& g, DepthwiseActivation activation, bool nhwc, void* stream) {
  if (static_cast<std::int64_t>(g.batch) * g.channels * g.out_h * g.out_w == 0) return;
  switch (dtype) {
    case DType::kFloat32:
      (nhwc ? launch_channels_last<float> : launch<float>)(x, w, bias, residual, y, g, activation, stream);
      break;
    case DType::kFloat16:
      (nhwc ? launch_channels_last<__half> : launch<__half>)(x, w, bias, residual, y, g, activation, stream);
      break;
    case DType::kBFloat16:
      (nhwc ? launch_channels_last<__nv_bfloat16> : launch<__nv_bfloat16>)(x, w, bias, residual, y, g, activation, stream);
      break;
    default: throw UnsupportedOperationError("depthwise_conv2d: float32, float16 or bfloat16 only");
  }
}

}  // namespace xpuruntime::cuda_raw
