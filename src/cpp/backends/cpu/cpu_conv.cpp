// conv2d of the cpu backend: a direct kernel for depthwise convolutions, im2col + GEMM in tiles of output pixels for
// the others, with bias, residual and the activation applied to each tile as it is written.
//
// Note [CPU convolution tiles]
// For image n and group g, with Cg = C / groups input and Og = O / groups output channels:
//   col[(c * kh + i) * kw + j, p] = x[n, g * Cg + c, oh * sh - pad_top + i * dh, ow * sw - pad_left + j * dw]
//                                   (0 outside the input; p = oh * OW + ow)
//   y[n, g * Og + o, p] = W[g * Og + o, :] (Cg * kh * kw) @ col[:, p]
// The output pixels are cut into tiles of kTileBytes of col (a multiple of kTileAlign pixels, or all of them), and
// each (image, group, tile) is one task of the pool: it writes its own slice of col into a per-thread scratch that
// stays in cache, runs one GEMM of Og x tile x depth on its thread, and then the epilogue over the rows it wrote. So
// the whole convolution is spread over the threads whatever the batch and group count (a batch of 1 with one group
// still has one task per tile), col never exceeds one tile per thread, and the tiles depend on the shape only: the
// result has the same bits for every thread count. A 1x1 kernel with unit strides and no padding reads x directly
// (col would be a copy of it).
//   The slice of col is written row by row: for each (c, i, j) and output row, the columns whose input position
// falls inside the image are one interval [lo, hi) computed once (first_inside / end_inside), so the copy has no
// per-element test (a memcpy for unit strides), and the outside columns are zeros.
//
// Note [Convolution as a GEMM over windows]
// With the packed GEMM (Note [Packed GEMM] in cpu_gemm.cpp) a convolution needs no im2col: each input plane is
// copied once, padded and split by the strides (Note [Phase-split planes]), and row (c, i, j) of the GEMM's B, over
// the output pixels (oh, ow), reads the split plane c at offset(i, j) + oh * row_stride + ow: runs of out_w
// consecutive floats, one per output row, every row_stride. The GEMM takes one pointer per B row and the run length
// and pitch (gemm_rows, RowsOfB), and copies the runs straight into its packed micro-panels, the copy it makes of any
// B; C is the output itself. So the im2col matrix (kh * kw times the input) is never written, for every stride,
// dilation and padding. The output pixels are cut into tiles (as in Note [CPU convolution tiles]), one task per
// (image, group, tile), each followed by the epilogue on what it wrote; each group's weights are packed once per
// call for all its tasks. float64, the other GEMMs (OpenBLAS, the blocked fallback) and unpadded 1x1 kernels (whose
// im2col is x itself, or one tap per channel when strided) keep the tiles of Note [CPU convolution tiles].
//
// Note [Depthwise convolution on the CPU]
// A convolution with one input channel per group (Cg == 1: depthwise, any channel multiplier Og) is a direct
// kernel, one task per (image, output channel) plane; as a GEMM it would be thousands of Og x pixels x kh*kw calls.
// The task copies its input plane into a phase-split padded plane (Note [Phase-split planes]) and runs the window
// loop of cpu_isa.h (Note [CPU instruction sets] in cpu_isa_baseline.cpp): each output sums its kh * kw taps in
// order (3x3, 5x5 and 7x7 unrolled, with two partial sums), then bias, residual and ReLU are added as the rows are
// copied out; other activations follow in a pass over the plane.
//
// Note [Phase-split planes]
// A window op's taps read x[oh * sh + i * dh - pad_top, ow * sw + j * dw - pad_left]. Bounds tests in the inner
// loop, the strides between consecutive outputs' taps, and rows of a few dozen outputs keep such a loop from
// vectorising well. So the plane is first copied, padded (zeros for a convolution, -inf for max pooling) to the
// extent the windows cover, with its rows split into sh phases and its columns into sw phases: padded row r goes to
// row phase r % sh at row r / sh, padded column c to column phase c % sw at index c / sw (PhaseGeometry in
// cpu_isa.h). Tap (i, j) of output (oh, ow) is then at q + offset(i, j), q = oh * row_stride + ow, where
// row_stride is the split row's length and offset(i, j) = ((i * dh % sh) * phase_rows + i * dh / sh) * row_stride +
// (j * dw % sw) * phase_cols + j * dw / sw. For a fixed tap, consecutive q read consecutive elements whatever the
// strides, dilations and pads, so the loops run over q in one flat range of the whole plane (the values at
// ow >= out_w of each row are computed and dropped when the rows are copied out). The copy costs one pass over the
// input plane (the loops read each input element kh * kw / (sh * sw) times).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"

namespace xpuruntime::cpu {

namespace {

constexpr std::int64_t kTileBytes = 512 * 1024;  // of col per task: well inside a core's L2
constexpr std::int64_t kTileAlign = 16;          // pixels
// Note [Convolution as a GEMM over windows]: fewer output pixels than this keep the tiles.
constexpr std::int64_t kWindowsMinPixels = 8;

struct ConvGeometry {
  std::int64_t batch, channels, height, width;
  std::int64_t out_channels, kh, kw, out_h, out_w;
  std::int64_t groups, cg, og, depth, pixels;
  std::int64_t stride[2], pad[2], pad_end[2], dilation[2];
  Activation activation;
};

ConvGeometry conv_geometry(const KernelLaunch& launch) {
  const OpDescriptor& desc = *launch.desc;
  const auto& x = launch.input(0).shape();
  const auto& w = launch.input(1).shape();
  const auto& y = launch.output(0).shape();
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  ConvGeometry g{};
  g.batch = x[0];
  g.channels = x[1];
  g.height = x[2];
  g.width = x[3];
  g.out_channels = w[0];
  g.kh = w[2];
  g.kw = w[3];
  g.out_h = y[2];
  g.out_w = y[3];
  g.groups = desc.attrs.get_int("groups", 1);
  g.cg = g.channels / g.groups;
  g.og = g.out_channels / g.groups;
  g.depth = g.cg * g.kh * g.kw;  // GEMM K
  g.pixels = g.out_h * g.out_w;  // GEMM N
  for (int d = 0; d < 2; ++d) {
    g.stride[d] = strides[d];
    g.pad[d] = pads[d];
    g.pad_end[d] = pads[d + 2];
    g.dilation[d] = dilations[d];
  }
  g.activation = activation_from_name(desc.attrs.get_string("activation", "none"));
  return g;
}

// A 1x1 kernel without padding: with unit strides, x itself is the GEMM's B (Note [CPU convolution tiles]).
bool unpadded_1x1(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.pad[0] == 0 && g.pad[1] == 0 && g.pad_end[0] == 0 && g.pad_end[1] == 0;
}

// The first output index o >= 0 whose input position o * stride + offset is >= 0, and the end of those whose
// position is < size (the interval [first_inside, end_inside) may be empty; both are clamped to [0, out)).
std::int64_t first_inside(std::int64_t offset, std::int64_t stride, std::int64_t out) {
  if (offset >= 0) return 0;
  return std::min(out, -(offset + 1) / stride + 1);  // ceil(-offset / stride) without overflow for any stride
}
std::int64_t end_inside(std::int64_t offset, std::int64_t stride, std::int64_t size, std::int64_t out) {
  if (offset >= size) return 0;
  return std::clamp<std::int64_t>((size - 1 - offset) / stride + 1, 0, out);
}

// Note [Vectorised SiLU in convolution epilogues]
// A convolution's fused SiLU took std::exp per element: a depthwise 3x3 over 96 planes of 56x56 with SiLU ran 868 us
// against 148 us with ReLU (ONNX Runtime: 381 us). A float row of at least kVectorSiluRow values now adds bias and
// residual in one loop, then takes sigmoid from IsaKernels::exp_f32 (Note [Vectorised exp on the CPU] in
// cpu_fused.cpp) in chunks on the stack and multiplies; arguments outside exp_f32's range and NaN take
// apply_activation's value in a second pass, as the fused elementwise kernel does. Shorter rows (the last pixels of a
// tile, tiny planes) stay scalar: one call per row of a few pixels was slower than the scalar loop.
constexpr std::int64_t kVectorSiluRow = 64;
constexpr std::int64_t kSiluChunk = 256;

// row[p] = silu(row[p] + bias_value + residual[p]) for p in [0, count) (Note [Vectorised SiLU in convolution
// epilogues]).
void silu_epilogue(const IsaKernels& isa, float* __restrict row, std::int64_t count, float bias_value,
                   const float* __restrict residual) {
  if (residual != nullptr) {
    for (std::int64_t p = 0; p < count; ++p) row[p] += bias_value + residual[p];
  } else if (bias_value != 0.0f) {
    for (std::int64_t p = 0; p < count; ++p) row[p] += bias_value;
  }
  float sigmoid[kSiluChunk];
  for (std::int64_t p0 = 0; p0 < count; p0 += kSiluChunk) {
    const std::int64_t n = std::min(kSiluChunk, count - p0);
    float* __restrict x = row + p0;
    if (isa.exp_f32(x, sigmoid, n, /*sigmoid=*/true)) {
      for (std::int64_t k = 0; k < n; ++k) {
        x[k] = !exp_outside(-x[k]) ? x[k] * sigmoid[k] : apply_activation(Activation::kSilu, x[k]);
      }
    } else {
      for (std::int64_t k = 0; k < n; ++k) x[k] *= sigmoid[k];
    }
  }
}

// Note [Convolution epilogues in vectors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A float convolution's bias, residual and none/ReLU/ReLU6/HardSwish run in the instruction-set table's epilogue_f32
// (cpu_isa_kernels.inc, compiled per -march), not in this file's loops, which are compiled for the baseline x86-64
// and so ran in 4-float SSE vectors: ReLU6's clamp after each convolution of the tiny MobileNetV2 export was 13% of
// its run on this machine's AVX-512 CPU (perf, 2026-12-06). The same expressions in the same order: the same bits.
std::optional<RowActivation> row_activation_of(Activation activation) {
  switch (activation) {
    case Activation::kNone: return RowActivation::kNone;
    case Activation::kRelu: return RowActivation::kRelu;
    case Activation::kRelu6: return RowActivation::kRelu6;
    case Activation::kHardSwish: return RowActivation::kHardSwish;
    default: return std::nullopt;
  }
}

// row[p] = kActivation(row[p] + bias_value + residual[p]): the activation known to the compiler, so that the loop
// vectorises where it can (HardSwish: 3136 values of a depthwise plane took 1.3 ns each with the activation chosen per
// element).
template <typename T, Activation kActivation>
inline T activate(T x) {
  if constexpr (kActivation == Activation::kHardSwish) {  // apply_activation's value, written as selects
    T t = x / T(6) + T(0.5);
    t = T(0) < t ? t : T(0);  // std::max(0, t): 0 for NaN
    t = t < T(1) ? t : T(1);  // std::min(1, t)
    return x * t;
  } else {
    return apply_activation(kActivation, x);
  }
}
template <typename T, Activation kActivation>
void activation_row(T* __restrict row, std::int64_t count, T bias_value, const T* __restrict residual) {
  if (residual != nullptr) {
    for (std::int64_t p = 0; p < count; ++p) row[p] = activate<T, kActivation>(row[p] + bias_value + residual[p]);
  } else {
    for (std::int64_t p = 0; p < count; ++p) row[p] = activate<T, kActivation>(row[p] + bias_value);
  }
}

// bias, residual and the activation over `count` values of output channel `channel` starting at `row`; `isa`: the
// plan's instruction-set table (CpuContext::isa).
template <typename T>
void conv_epilogue(const IsaKernels& isa, T* row, std::int64_t count, const T* bias, std::int64_t channel,
                   const T* residual, Activation activation) {
  const T bias_value = bias != nullptr ? bias[channel] : T(0);
  if constexpr (std::is_same_v<T, float>) {
    if (activation == Activation::kSilu && count >= kVectorSiluRow) {
      silu_epilogue(isa, row, count, bias_value, residual);
      return;
    }
    if ((activation == Activation::kGelu || activation == Activation::kGeluTanh) && count >= kVectorSiluRow) {
      // Note [Vectorised tanh, erf and GELU] (cpu_isa_baseline.cpp), as SiLU's rows above
      activation_row<T, Activation::kNone>(row, count, bias_value, residual);
      isa.math_f32(row, row, count, activation == Activation::kGelu ? VectorMath::kGelu : VectorMath::kGeluTanh);
      return;
    }
  }
  if (activation == Activation::kNone && residual == nullptr) {
    if (bias != nullptr) {
      for (std::int64_t p = 0; p < count; ++p) row[p] += bias_value;
    }
    return;
  }
  if constexpr (std::is_same_v<T, float>) {  // Note [Convolution epilogues in vectors]
    const std::optional<RowActivation> act = row_activation_of(activation);
    if (act) {
      isa.epilogue_f32(row, count, bias_value, residual, *act);
      return;
    }
  }
  if (activation == Activation::kRelu) {
    for (std::int64_t p = 0; p < count; ++p) {
      const T value = row[p] + bias_value + (residual != nullptr ? residual[p] : T(0));
      row[p] = value > T(0) ? value : (value != value ? value : T(0));
    }
    return;
  }
  if (activation == Activation::kNone) {
    activation_row<T, Activation::kNone>(row, count, bias_value, residual);
  } else if (activation == Activation::kHardSwish) {
    activation_row<T, Activation::kHardSwish>(row, count, bias_value, residual);
  } else if (activation == Activation::kRelu6) {
    activation_row<T, Activation::kRelu6>(row, count, bias_value, residual);
  } else if (activation == Activation::kSilu) {
    activation_row<T, Activation::kSilu>(row, count, bias_value, residual);
  } else if (activation == Activation::kGelu) {
    activation_row<T, Activation::kGelu>(row, count, bias_value, residual);
  } else {  // kGeluTanh, the one left (kRelu returned above)
    activation_row<T, Activation::kGeluTanh>(row, count, bias_value, residual);
  }
}

// Rows [0, depth) x pixels [p0, p0 + count) of col for the Cg input planes at `image` (Note [CPU convolution tiles]).
// Row (c, i, j) is kernel tap (i, j) of channel c; the loops walk c, i and j in that order (no division per row: a
// small convolution's im2col is as long as its GEMM), each column offset's inside range computed once per call.
template <typename T>
void im2col_tile(const ConvGeometry& g, const T* image, std::int64_t p0, std::int64_t count, T* col) {
  ScratchVector<std::int64_t> lo(static_cast<std::size_t>(g.kw)), hi(static_cast<std::size_t>(g.kw));
  for (std::int64_t j = 0; j < g.kw; ++j) {
    const std::int64_t col_offset = j * g.dilation[1] - g.pad[1];
    lo[static_cast<std::size_t>(j)] = first_inside(col_offset, g.stride[1], g.out_w);
    hi[static_cast<std::size_t>(j)] = end_inside(col_offset, g.stride[1], g.width, g.out_w);
  }
  const std::int64_t end = p0 + count;
  T* out = col;
  for (std::int64_t c = 0; c < g.cg; ++c) {
    const T* plane = image + c * g.height * g.width;
    for (std::int64_t i = 0; i < g.kh; ++i) {
      for (std::int64_t j = 0; j < g.kw; ++j, out += count) {
        const std::int64_t col_offset = j * g.dilation[1] - g.pad[1];
        const std::int64_t lo_j = lo[static_cast<std::size_t>(j)], hi_j = hi[static_cast<std::size_t>(j)];
        std::int64_t p = p0;
        while (p < end) {
          const std::int64_t oh = p / g.out_w;
          const std::int64_t ow0 = p - oh * g.out_w;
          const std::int64_t ow1 = std::min(g.out_w, ow0 + (end - p));
          T* dst = out + (p - p0);  // dst[ow - ow0] for ow in [ow0, ow1)
          const std::int64_t ih = oh * g.stride[0] - g.pad[0] + i * g.dilation[0];
          const std::int64_t a = std::clamp(lo_j, ow0, ow1), b = std::clamp(hi_j, ow0, ow1);
          if (ih < 0 || ih >= g.height || a >= b) {
            std::fill(dst, dst + (ow1 - ow0), T(0));
          } else {
            std::fill(dst, dst + (a - ow0), T(0));
            const T* src = plane + ih * g.width + a * g.stride[1] + col_offset;  // input of output column a
            T* inside = dst + (a - ow0);
            if (g.stride[1] == 1) {
              std::memcpy(inside, src, static_cast<std::size_t>(b - a) * sizeof(T));
            } else {
              for (std::int64_t k = 0; k < b - a; ++k) inside[k] = src[k * g.stride[1]];
            }
            std::fill(dst + (b - ow0), dst + (ow1 - ow0), T(0));
          }
          p += ow1 - ow0;
        }
      }
    }
  }
}

// The depthwise kernel (Note [Depthwise convolution on the CPU]): output plane `plane` (= n * O + o), with
// `padded` scratch of phase_plane_size and `wide` of out_h * row_stride elements.
template <typename T>
void depthwise_plane(const ConvGeometry& g, const PhaseGeometry& phases, const std::vector<std::int64_t>& offsets,
                     const IsaKernels& isa, const T* x, const T* w, const T* bias, const T* residual, T* y,
                     std::int64_t plane, T* padded, T* wide) {
  const std::int64_t n = plane / g.out_channels, o = plane % g.out_channels;
  const T* input = x + (n * g.channels + o / g.og) * g.height * g.width;
  WindowPlane<T> window = window_plane(phases, offsets, g.out_h, g.out_w, static_cast<const T*>(padded), wide);
  window.out = y + plane * g.pixels;
  PlaneEpilogue<T> epilogue;
  epilogue.bias = bias != nullptr ? bias[o] : T(0);
  epilogue.residual = residual != nullptr ? residual + plane * g.pixels : nullptr;
  epilogue.relu = g.activation == Activation::kRelu;
  if constexpr (std::is_same_v<T, float>) {
    isa.fill_phase_f32(phases, input, g.height, g.width, 0.0f, padded);
    isa.depthwise_f32(window, w + o * g.kh * g.kw, epilogue);
  } else {
    isa.fill_phase_f64(phases, input, g.height, g.width, 0.0, padded);
    isa.depthwise_f64(window, w + o * g.kh * g.kw, epilogue);
  }
  if (g.activation != Activation::kNone && g.activation != Activation::kRelu) {
    conv_epilogue(isa, window.out, g.pixels, static_cast<const T*>(nullptr), 0, static_cast<const T*>(nullptr),
                  g.activation);
  }
}

// The operands of one conv2d launch as T buffers.
template <typename T>
struct ConvOperands {
  const T* x;
  const T* w;
  const T* bias;      // or null
  const T* residual;  // or null
  T* y;
  // float weights the plan keeps packed (Note [Weights packed once per plan] in cpu_gemm.cpp): the store when the
  // engine marked them constant, else null; and the weights' tensor.
  PackedConstants* store = nullptr;
  const Tensor* weights = nullptr;
};

// Note [Depthwise convolution of small planes]
// The phase-split copy and the flat window loop (Note [Depthwise convolution on the CPU]) pay per plane and per row:
// on the last stages of a small CNN (2x2 and 1x1 outputs of 3x3 and 5x5 windows, hundreds of channels) the copy, its
// padding rows and the calls were most of the time (the tiny EfficientNet's depthwise convolutions 1.3-1.9x ONNX
// Runtime's). An output plane of at most kDirectDepthwisePixels values is computed directly instead: each output sums
// the taps inside the input (their range per axis computed once per row and column), in row-major tap order, then
// the epilogue runs over the plane.
constexpr std::int64_t kDirectDepthwisePixels = 16;

template <typename T>
void depthwise_plane_direct(const ConvGeometry& g, const IsaKernels& isa, const ConvOperands<T>& v,
                            std::int64_t plane) {
  const std::int64_t n = plane / g.out_channels, o = plane % g.out_channels;
  const T* input = v.x + (n * g.channels + o / g.og) * g.height * g.width;
  const T* weights = v.w + o * g.kh * g.kw;
  T* out = v.y + plane * g.pixels;
  for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
    const std::int64_t row0 = oh * g.stride[0] - g.pad[0];
    // The taps inside the input along each axis (first_inside / end_inside over taps instead of outputs).
    const std::int64_t i_lo = first_inside(row0, g.dilation[0], g.kh);
    const std::int64_t i_hi = end_inside(row0, g.dilation[0], g.height, g.kh);
    for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
      const std::int64_t col0 = ow * g.stride[1] - g.pad[1];
      const std::int64_t j_lo = first_inside(col0, g.dilation[1], g.kw);
      const std::int64_t j_hi = end_inside(col0, g.dilation[1], g.width, g.kw);
      T acc = T(0);
      for (std::int64_t i = i_lo; i < i_hi; ++i) {
        const T* row = input + (row0 + i * g.dilation[0]) * g.width + col0;
        const T* w = weights + i * g.kw;
        for (std::int64_t j = j_lo; j < j_hi; ++j) acc += row[j * g.dilation[1]] * w[j];
      }
      out[oh * g.out_w + ow] = acc;
    }
  }
  conv_epilogue(isa, out, g.pixels, v.bias, o, v.residual != nullptr ? v.residual + plane * g.pixels : nullptr,
                g.activation);
}

// Note [Depthwise convolution of small planes across channels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A plane of at most kDirectDepthwisePixels outputs has too few pixels to fill a vector: the direct loop above runs
// each output's taps one float at a time, and was 23-28% of the tiny MobileNetV2 export's run on this machine (perf,
// 2026-12-06; its last stages are 2x2 and 1x1 planes of hundreds of channels). A float depthwise convolution with one
// output per input channel computes kDepthwiseBlock channels at once instead (IsaKernels::depthwise_block_f32, compiled
// per instruction set): the block's planes transposed to [pixel][channel], each output's taps inside the input summed
// in the same row-major order over a vector of channels, transposed back; then each plane's epilogue. One task per
// (image, block of channels).
void depthwise_across_channels(const ConvGeometry& g, const CpuContext& context, const ConvOperands<float>& v) {
  const std::int64_t blocks = (g.out_channels + kDepthwiseBlock - 1) / kDepthwiseBlock;
  const std::int64_t grain =
      std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(kDepthwiseBlock * g.pixels * g.kh * g.kw, 1));
  parallel_for(g.batch * blocks, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
    DepthwiseBlock b;
    b.height = g.height;
    b.width = g.width;
    b.out_h = g.out_h;
    b.out_w = g.out_w;
    b.kh = g.kh;
    b.kw = g.kw;
    for (int axis = 0; axis < 2; ++axis) {
      b.stride[axis] = g.stride[axis];
      b.pad[axis] = g.pad[axis];
      b.dilation[axis] = g.dilation[axis];
    }
    ScratchVector<float> scratch(static_cast<std::size_t>(depthwise_block_scratch(b)));
    b.scratch = scratch.data();
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t n = task / blocks, c0 = task % blocks * kDepthwiseBlock;
      b.channels = std::min(kDepthwiseBlock, g.out_channels - c0);
      b.x = v.x + (n * g.channels + c0) * g.height * g.width;
      b.w = v.w + c0 * g.kh * g.kw;
      b.y = v.y + (n * g.out_channels + c0) * g.pixels;
      context.isa->depthwise_block_f32(b);
      for (std::int64_t c = 0; c < b.channels; ++c) {
        const std::int64_t plane = n * g.out_channels + c0 + c;
        conv_epilogue(*context.isa, v.y + plane * g.pixels, g.pixels, v.bias, c0 + c,
                      v.residual != nullptr ? v.residual + plane * g.pixels : nullptr, g.activation);
      }
    }
  });
}

// Note [Depthwise convolution on the CPU].
template <typename T>
void conv_depthwise(const ConvGeometry& g, const CpuContext& context, const ConvOperands<T>& v) {
  if constexpr (std::is_same_v<T, float>) {  // Note [Depthwise convolution of small planes across channels]
    if (g.pixels <= kDirectDepthwisePixels && g.og == 1) {
      depthwise_across_channels(g, context, v);
      return;
    }
  }
  if (g.pixels <= kDirectDepthwisePixels) {  // Note [Depthwise convolution of small planes]
    const std::int64_t grain = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(g.pixels * g.kh * g.kw, 1));
    parallel_for(g.batch * g.out_channels, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t plane = begin; plane < end; ++plane) depthwise_plane_direct(g, *context.isa, v, plane);
    });
    return;
  }
  const PhaseGeometry phases = phase_geometry(g.out_h, g.out_w, g.kh, g.kw, g.stride, g.dilation, g.pad[0], g.pad[1]);
  const std::vector<std::int64_t> offsets = phase_offsets(phases, g.kh, g.kw, g.dilation);
  const std::int64_t grain = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(g.pixels * g.kh * g.kw, 1));
  parallel_for(g.batch * g.out_channels, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<T> padded(static_cast<std::size_t>(phase_plane_size(phases)));
    ScratchVector<T> wide(static_cast<std::size_t>(g.out_h * phases.row_stride));
    for (std::int64_t plane = begin; plane < end; ++plane) {
      depthwise_plane(g, phases, offsets, *context.isa, v.x, v.w, v.bias, v.residual, v.y, plane, padded.data(),
                      wide.data());
    }
  });
}

// Note [Few convolution tasks]
// A GEMM-based convolution runs one task per (image, group, tile of pixels), each task's GEMM on its own thread. With
// few tasks the threads cannot share them evenly: ResNet-50's 3x3 convolution at 14x14 is 4 tasks of 64, 64, 64 and 4
// pixels, 2 and 1.06 tiles' work on 2 threads (1.45x one thread's speed). So a convolution over windows (Note
// [Convolution as a GEMM over windows]) cuts its pixels into at least kFewConvTasks tasks where they allow (tiles stay
// whole micro-panels), and when there are still fewer than kChunksPerThread a thread, runs the tasks one after the
// other on the caller, each GEMM spreading its own tiles over the threads instead (Note [Balanced GEMM tiles] in
// cpu_gemm.cpp: rows too when the columns are too few). The same sums either way: the packed GEMM's sums do not
// depend on its tiles. The 1x1 tiles (conv_tiles) keep theirs: there a smaller tile can move a product to another
// GEMM, and MobileNet's 1x1 96 -> 24 at 56x56 was 25% slower on one thread in 8 tasks than in 3.
constexpr std::int64_t kFewConvTasks = 8;

int task_threads(const CpuContext& context, std::int64_t tasks) {
  return tasks >= kChunksPerThread * context.threads ? context.threads : 1;
}

// Output pixels per task of a GEMM-based convolution: about kTileBytes of B per task, and with `at_least_few` (the
// windows, whose GEMM is the packed one whatever the tile) at least kFewConvTasks tasks where the pixels allow (Note
// [Few convolution tasks]); from the shape alone, so that the tiles do not depend on the thread count. A multiple of
// `align` (the packed GEMM's micro-panel width: no partial panel but the last tile's).
std::int64_t conv_tile(const ConvGeometry& g, std::int64_t extent, std::int64_t element_bytes, std::int64_t align,
                       bool at_least_few) {
  std::int64_t tile = kTileBytes / element_bytes / std::max<std::int64_t>(g.depth, 1);
  tile = std::max(align, tile / align * align);
  const std::int64_t planes = std::max<std::int64_t>(g.batch * g.groups, 1);
  if (at_least_few && planes * ((extent + tile - 1) / tile) < kFewConvTasks) {
    const std::int64_t tiles = (kFewConvTasks + planes - 1) / planes;
    tile = std::min(tile, std::max(align, ((extent + tiles - 1) / tiles + align - 1) / align * align));
  }
  return std::min(tile, extent);
}

// The weights of each group packed for the GEMM, as its A or (`transposed`, Note [Convolution with the pixels as rows])
// transposed as its B: kept in the store when the engine marked them constant (Note [Weights packed once per plan] in
// cpu_gemm.cpp; `store` and `weights` non-null; tag group, or -3 - group), else packed into `own` for this call.
std::vector<const float*> packed_groups(const ConvGeometry& g, const CpuContext& context, const float* w,
                                        PackedConstants* store, const Tensor* weights,
                                        std::vector<ScratchVector<float>>& own, bool transposed = false) {
  std::vector<const float*> packed;
  own.reserve(static_cast<std::size_t>(g.groups));
  for (std::int64_t group = 0; group < g.groups; ++group) {
    const float* group_w = w + group * g.og * g.depth;
    const auto pack = [&, group_w] {
      return transposed ? pack_gemm_b(context, g.depth, g.og, group_w, g.depth, /*trans=*/true)
                        : pack_gemm_a(context, g.og, g.depth, group_w, g.depth);
    };
    if (store != nullptr && weights != nullptr) {
      packed.push_back(store->get(*weights, transposed ? -3 - group : group, context.isa, pack));
    } else {
      own.push_back(pack());
      packed.push_back(own.back().data());
    }
  }
  return packed;
}

// Note [Convolution with the pixels as rows]
// The packed GEMM holds gemm_mr rows x gemm_nr columns of C in registers, the columns whole vectors (6 x 64 floats on
// AVX-512). A convolution over windows makes the output channels C's rows and the pixels its columns, so a task of few
// pixels computes lanes it throws away: ResNet-50's last 3x3 convolutions have 49 pixels, 49 of a 64-lane micro-panel;
// a last task of 8 pixels uses 8 of a vector's 16 lanes. Where the output channels fill the lanes at least
// kPixelRowsGain times better, the task computes C^T = windows^T W^T instead: the pixels are the rows (49 of a
// 54-row panel), the output channels the columns (512 of 512), the windows gathered straight into A's micro-panels
// (each depth row's values at the panel's pixels), W^T packed as B (kept in the store like the other packing when the
// weights are constant: tag -3 - group) and C^T written to a scratch that is transposed into the output before the
// epilogue. Every output adds the same products in the same order (each depth slice's fused multiply-adds from zero,
// the slices added in order; a * b is b * a), so the bits are those of the other orientation
// (XPURT_CPU_CONV_WINDOWS=packed keeps it; tests compare the two). Measured on this project's 2-vCPU AVX-512 VM
// (docs/benchmarks.md, 2026-12-07): ResNet-50's last 3x3 1.21x faster on one thread, 1.11x on two (the gather spread
// over the threads where the task runs alone). The same for 1x1 convolutions read in place (A gathered from x's
// planes) was 1.02x on one thread and 0.96x on two at ResNet-50's last 1x1: their B is x itself, already cheap to
// pack, so they keep the other orientation.
constexpr double kPixelRowsGain = 1.1;

// Whether a task of `count` pixels and `og` output channels uses the micro-tiles' lanes kPixelRowsGain times better
// with its pixels as rows.
}  // namespace

bool conv_pixel_rows_pay(const CpuContext& context, std::int64_t count, std::int64_t og) {
  const IsaKernels& isa = *context.isa;
  const auto used = [](std::int64_t n, std::int64_t step) {
    return static_cast<double>(n) / static_cast<double>((n + step - 1) / step * step);
  };
  const double channel_rows = used(count, isa.gemm_nr) * used(og, isa.gemm_mr);
  const double pixel_rows = used(og, isa.gemm_nr) * used(count, isa.gemm_mr);
  return context.conv_windows_auto && pixel_rows > kPixelRowsGain * channel_rows;
}

namespace {

// The windows of pixels [b.col0, b.col0 + count) as A for the packed GEMM (pixels as rows, depth row k of the windows
// as column k), laid out as pack_gemm_a lays out A: each depth slice of gemm_kc, its rows in micro-panels of gemm_mr
// stored column by column; rows past count are zeros. `at`: scratch of count offsets. Over the context's threads (one
// when called inside another loop's chunk), a (depth slice, micro-panel) each.
void pack_windows_as_a(const CpuContext& context, const RowsOfB& b, std::int64_t depth, std::int64_t count,
                       std::int64_t* at, float* out) {
  const IsaKernels& isa = *context.isa;
  const std::int64_t mr = isa.gemm_mr, padded = (count + mr - 1) / mr * mr, panels = padded / mr;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t p = b.col0 + i;
    at[i] = p / b.segment * b.pitch + p % b.segment;
  }
  const std::int64_t slices = (depth + isa.gemm_kc - 1) / isa.gemm_kc;
  parallel_for(slices * panels, context.threads, std::max<std::int64_t>(1, 16384 / (mr * isa.gemm_kc)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t item = begin; item < end; ++item) {
                   const std::int64_t k0 = item / panels * isa.gemm_kc, r0 = item % panels * mr;
                   const std::int64_t slice = std::min(isa.gemm_kc, depth - k0);
                   float* panel = out + k0 * padded + r0 * slice;
                   const std::int64_t live = std::min(mr, count - r0);
                   for (std::int64_t k = 0; k < slice; ++k) {
                     const float* src = b.rows[k0 + k];
                     float* dst = panel + k * mr;
                     for (std::int64_t i = 0; i < live; ++i) dst[i] = src[at[r0 + i]];
                     for (std::int64_t i = live; i < mr; ++i) dst[i] = 0.0f;
                   }
                 }
               });
}

// Note [Windows read in place]
// The windows' B rows are runs of out_w pixels every row_stride floats of a phase-split plane (Note [Phase-split
// planes]), and packing them into the GEMM's micro-panels took 9-13% of a dense 3x3 convolution's time at 56x56 and
// 14x14 (perf, 2026-12-07), while the micro-tiles ran at about 93% of the core's FMA peak. Where the planes' rows carry
// few columns past the output's (the positions q = oh * row_stride + ow of a plane, ow < row_stride, at most
// kInPlaceExtra more than the pixels), a task computes every q of its range, the columns past out_w included, with B
// read straight from the planes (RowsOfB::in_place: B[k][q] = rows[k][q]); its C goes to a scratch of q columns, whose
// output columns are copied into y before the epilogue. The planes get a micro-panel of slack at the end, so that the
// last vector a micro-tile reads stays inside. Same bits (the same products in the same order;
// XPURT_CPU_CONV_WINDOWS=packed packs them, and tests compare the two). Measured (docs/benchmarks.md, 2026-12-07, one
// thread): 1.01-1.06x at 56x56, 28x28 and the stem (3-4% more columns), 1.15x at 14x14 (14% more: it was packed
// under a first limit of 10%); 7x7 (24% more) keeps Note [Convolution with the pixels as rows], 1.25x there.
constexpr double kInPlaceExtra = 1.2;

// The q range of the task covering [q0, q0 + count) of a plane, as output pixels: [first, end) (empty when the range
// holds only columns past out_w).
struct PixelSpan {
  std::int64_t first = 0, end = 0;
};

PixelSpan pixels_of_q(std::int64_t q0, std::int64_t count, std::int64_t row_stride, std::int64_t out_w) {
  const auto pixel_at_or_after = [&](std::int64_t q) {
    const std::int64_t oh = q / row_stride, ow = q % row_stride;
    return ow < out_w ? oh * out_w + ow : (oh + 1) * out_w;
  };
  return {pixel_at_or_after(q0), pixel_at_or_after(q0 + count)};
}

// A task's scratch for pixel_rows_task, sized at its first use to a tile of `tile` pixels.
struct PixelRowsScratch {
  UninitScratch<float> a, c;
  UninitScratch<std::int64_t> at;
};

// One task of Note [Convolution with the pixels as rows]: C^T = A B for `count` pixels (A's rows gathered from `b`,
// pixels b.col0 ..) and the group's packed W^T, written transposed to `out` (output channel o at out + o * g.pixels).
void pixel_rows_task(const ConvGeometry& g, const CpuContext& context, const RowsOfB& b, std::int64_t count,
                     std::int64_t tile, const float* packed_wt, float* out, PixelRowsScratch& scratch) {
  if (scratch.a.size() == 0) {
    const std::int64_t rows = (tile + context.isa->gemm_mr - 1) / context.isa->gemm_mr * context.isa->gemm_mr;
    scratch.a.resize(static_cast<std::size_t>(rows * g.depth));
    scratch.c.resize(static_cast<std::size_t>(tile * g.og));
    scratch.at.resize(static_cast<std::size_t>(tile));
  }
  pack_windows_as_a(context, b, g.depth, count, scratch.at.data(), scratch.a.data());
  gemm_packed_ab(context, count, g.og, g.depth, scratch.a.data(), packed_wt, scratch.c.data(), g.og);
  for (std::int64_t o = 0; o < g.og; ++o) {
    for (std::int64_t i = 0; i < count; ++i) out[o * g.pixels + i] = scratch.c[static_cast<std::size_t>(i * g.og + o)];
  }
}

// One task of Note [Windows read in place]: q positions [q0, q0 + count) of image n's planes (its windows' rows at
// `rows`) for output channels channel0 .. + og, their output columns copied into y, then the epilogue.
void windows_in_place_task(const ConvGeometry& g, const CpuContext& context, const float* const* rows, std::int64_t q0,
                           std::int64_t count, std::int64_t tile, std::int64_t row_stride, const float* packed_w,
                           const ConvOperands<float>& v, std::int64_t n, std::int64_t channel0,
                           UninitScratch<float>& columns_q) {
  if (columns_q.size() == 0) columns_q.resize(static_cast<std::size_t>(g.og * tile));
  RowsOfB b{rows, q0, 1, 1};
  b.in_place = true;
  gemm_rows(context, g.og, count, g.depth, v.w + channel0 * g.depth, g.depth, b, columns_q.data(), tile, packed_w);
  const PixelSpan span = pixels_of_q(q0, count, row_stride, g.out_w);
  if (span.end <= span.first) return;  // only columns past out_w
  for (std::int64_t o = 0; o < g.og; ++o) {
    float* out = v.y + (n * g.out_channels + channel0 + o) * g.pixels;
    const float* from = columns_q.data() + o * tile;
    for (std::int64_t p = span.first; p < span.end;) {  // one output row's run at a time
      const std::int64_t oh = p / g.out_w, ow = p % g.out_w;
      const std::int64_t run = std::min(g.out_w - ow, span.end - p);
      std::memcpy(out + p, from + (oh * row_stride + ow - q0), static_cast<std::size_t>(run) * sizeof(float));
      p += run;
    }
    const std::int64_t at = (n * g.out_channels + channel0 + o) * g.pixels + span.first;
    conv_epilogue(*context.isa, v.y + at, span.end - span.first, v.bias, channel0 + o,
                  v.residual != nullptr ? v.residual + at : nullptr, g.activation);
  }
}

// Note [Convolution as a GEMM over windows]: float, the packed GEMM.
void conv_windows(const ConvGeometry& g, const CpuContext& context, const ConvOperands<float>& v) {
  const PhaseGeometry phases = phase_geometry(g.out_h, g.out_w, g.kh, g.kw, g.stride, g.dilation, g.pad[0], g.pad[1]);
  const std::vector<std::int64_t> offsets = phase_offsets(phases, g.kh, g.kw, g.dilation);
  const std::int64_t plane = phase_plane_size(phases);
  // Note [Windows read in place]: the q positions of a plane's outputs, and whether to read them in place.
  const std::int64_t extent_q = (g.out_h - 1) * phases.row_stride + g.out_w;
  const bool in_place =
      context.conv_windows_auto && static_cast<double>(extent_q) <= kInPlaceExtra * static_cast<double>(g.pixels);
  ScratchVector<float> padded(static_cast<std::size_t>(g.batch * g.channels * plane + context.isa->gemm_nr));
  parallel_for(g.batch * g.channels, context.threads, std::max<std::int64_t>(1, 16384 / plane),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t c = begin; c < end; ++c) {
                   context.isa->fill_phase_f32(phases, v.x + c * g.height * g.width, g.height, g.width, 0.0f,
                                               padded.data() + c * plane);
                 }
               });
  const std::int64_t extent = in_place ? extent_q : g.pixels;  // of the tasks' tiles: q positions or pixels
  const std::int64_t tile = conv_tile(g, extent, sizeof(float), context.isa->gemm_nr, true);
  const std::int64_t tiles = (extent + tile - 1) / tile;
  const std::int64_t work = std::max<std::int64_t>(g.og * tile * g.depth, 1);
  // Note [Convolution with the pixels as rows]: whole tiles and the last one of each plane may differ.
  const bool whole_swap = !in_place && conv_pixel_rows_pay(context, tile, g.og);
  const bool last_swap = !in_place && conv_pixel_rows_pay(context, g.pixels - (tiles - 1) * tile, g.og);
  // The weights of each group, packed once for all its tasks (or kept from an earlier call), as the GEMM's A and,
  // where a task swaps, transposed as its B.
  std::vector<ScratchVector<float>> own, own_t;
  const std::vector<const float*> packed_w = whole_swap && last_swap
                                                 ? std::vector<const float*>()
                                                 : packed_groups(g, context, v.w, v.store, v.weights, own);
  const std::vector<const float*> packed_wt =
      whole_swap || last_swap ? packed_groups(g, context, v.w, v.store, v.weights, own_t, /*transposed=*/true)
                              : std::vector<const float*>();
  parallel_for(g.batch * g.groups * tiles, task_threads(context, g.batch * g.groups * tiles),
               std::max<std::int64_t>(1, (std::int64_t{1} << 17) / work),
               [&](std::int64_t begin, std::int64_t end) {
                 ScratchVector<const float*> rows(static_cast<std::size_t>(g.depth));
                 PixelRowsScratch swapped;
                 UninitScratch<float> columns_q;  // Note [Windows read in place]: C over the task's q positions
                 const std::int64_t taps = g.kh * g.kw;
                 for (std::int64_t task = begin; task < end; ++task) {
                   const std::int64_t t = task % tiles, ng = task / tiles;
                   const std::int64_t n = ng / g.groups, group = ng % g.groups;
                   const std::int64_t p0 = t * tile, count = std::min(tile, extent - p0);
                   const float* planes = padded.data() + (n * g.channels + group * g.cg) * plane;
                   for (std::int64_t c = 0; c < g.cg; ++c) {
                     for (std::int64_t tap = 0; tap < taps; ++tap) {
                       rows[static_cast<std::size_t>(c * taps + tap)] =
                           planes + c * plane + offsets[static_cast<std::size_t>(tap)];
                     }
                   }
                   const std::int64_t channel0 = group * g.og;
                   if (in_place) {
                     windows_in_place_task(g, context, rows.data(), p0, count, tile, phases.row_stride,
                                           packed_w[static_cast<std::size_t>(group)], v, n, channel0, columns_q);
                     continue;
                   }
                   const std::int64_t offset = (n * g.out_channels + channel0) * g.pixels + p0;
                   // Output pixel (oh, ow) reads its window at oh * row_stride + ow from each row's start.
                   const RowsOfB b{rows.data(), p0, g.out_w, phases.row_stride};
                   if (t + 1 < tiles ? whole_swap : last_swap) {  // Note [Convolution with the pixels as rows]
                     pixel_rows_task(g, context, b, count, tile, packed_wt[static_cast<std::size_t>(group)],
                                     v.y + offset, swapped);
                   } else {
                     gemm_rows(context, g.og, count, g.depth, v.w + channel0 * g.depth, g.depth, b, v.y + offset,
                               g.pixels, packed_w[static_cast<std::size_t>(group)]);
                   }
                   for (std::int64_t o = 0; o < g.og; ++o) {
                     const std::int64_t at = offset + o * g.pixels;
                     conv_epilogue(*context.isa, v.y + at, count, v.bias, channel0 + o,
                                   v.residual != nullptr ? v.residual + at : nullptr, g.activation);
                   }
                 }
               });
}

// Note [CPU convolution tiles].
template <typename T>
void conv_tiles(const ConvGeometry& g, const CpuContext& context, const ConvOperands<T>& v) {
  const bool direct = unpadded_1x1(g) && g.stride[0] == 1 && g.stride[1] == 1;
  const std::int64_t tile = conv_tile(g, g.pixels, sizeof(T), kTileAlign, false);
  const std::int64_t tiles = (g.pixels + tile - 1) / tile;
  const std::int64_t tasks = g.batch * g.groups * tiles;
  const std::int64_t task_work = std::max<std::int64_t>(g.og * tile * g.depth, 1);
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 17) / task_work);
  // Kept packed weights (Note [Weights packed once per plan]): only where the plan keeps them, for the tiles the
  // packed GEMM takes; the others pack per call as before.
  std::vector<ScratchVector<float>> own;
  std::vector<const float*> packed_w;
  if constexpr (std::is_same_v<T, float>) {
    if (v.store != nullptr && gemm_is_packed(context, g.og, tile, g.depth)) {
      packed_w = packed_groups(g, context, v.w, v.store, v.weights, own);
    }
  }
  parallel_for(tasks, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<T> col(direct ? 0 : static_cast<std::size_t>(g.depth * tile));
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t t = task % tiles, ng = task / tiles;
      const std::int64_t n = ng / g.groups, group = ng % g.groups;
      const std::int64_t p0 = t * tile, count = std::min(tile, g.pixels - p0);
      const T* image = v.x + (n * g.channels + group * g.cg) * g.height * g.width;
      const T* columns = image + p0;
      std::int64_t ldb = g.pixels;
      if (!direct) {
        im2col_tile(g, image, p0, count, col.data());
        columns = col.data();
        ldb = count;
      }
      const std::int64_t channel0 = group * g.og;
      T* out = v.y + (n * g.out_channels + channel0) * g.pixels + p0;
      bool done = false;
      if constexpr (std::is_same_v<T, float>) {
        if (!packed_w.empty() && gemm_is_packed(context, g.og, count, g.depth)) {
          gemm_packed_a(context, g.og, count, g.depth, packed_w[static_cast<std::size_t>(group)], columns, ldb, out,
                        g.pixels);
          done = true;
        }
      }
      if (!done) {
        gemm<T>(context, false, g.og, count, g.depth, v.w + channel0 * g.depth, g.depth, columns, ldb, out, g.pixels);
      }
      for (std::int64_t o = 0; o < g.og; ++o) {
        const std::int64_t offset = (n * g.out_channels + channel0 + o) * g.pixels + p0;
        conv_epilogue(*context.isa, v.y + offset, count, v.bias, channel0 + o,
                      v.residual != nullptr ? v.residual + offset : nullptr, g.activation);
      }
    }
  });
}

// A 1x1 convolution of 1x1 images with one group (squeeze-excitation blocks, a classifier head written as a Conv):
// the batch is the GEMM's rows, y[N, O] = x[N, C] @ W[O, C]^T, one GEMM instead of one per image.
template <typename T>
void conv_single_pixel(const ConvGeometry& g, const CpuContext& context, const ConvOperands<T>& v) {
  gemm<T>(context, true, g.batch, g.out_channels, g.depth, v.x, g.depth, v.w, g.depth, v.y, g.out_channels);
  for (std::int64_t n = 0; n < g.batch; ++n) {
    for (std::int64_t o = 0; o < g.out_channels; ++o) {
      const std::int64_t at = n * g.out_channels + o;
      conv_epilogue(*context.isa, v.y + at, 1, v.bias, o, v.residual != nullptr ? v.residual + at : nullptr,
                    g.activation);
    }
  }
}

template <typename T>
void run_conv2d(const KernelLaunch& launch, const CpuContext& context) {
  const ConvGeometry g = conv_geometry(launch);
  InputBuffer<T> x(launch.input(0));
  InputBuffer<T> w(launch.input(1));
  InputBuffer<T> bias(launch.num_inputs > 2 ? launch.input(2) : Tensor());
  InputBuffer<T> residual(launch.num_inputs > 3 ? launch.input(3) : Tensor());
  OutputBuffer<T> y(launch.output(0));
  ConvOperands<T> v{x.data(), w.data(), bias.data(), residual.data(), y.data()};
  if constexpr (std::is_same_v<T, float>) {
    v.store = constant_store(launch, 1);
    v.weights = &launch.input(1);
  }
  if (g.cg == 1) {
    conv_depthwise(g, context, v);
  } else if (unpadded_1x1(g) && g.groups == 1 && g.height == 1 && g.width == 1) {  // output 1x1 too
    conv_single_pixel(g, context, v);
  } else if constexpr (std::is_same_v<T, float>) {
    // Unpadded 1x1 kernels keep the tiles: x as B itself, or an im2col of one tap per channel when strided.
    if (context.gemm == GemmImpl::kPacked && !unpadded_1x1(g) && g.pixels >= kWindowsMinPixels) {
      conv_windows(g, context, v);
    } else {
      conv_tiles(g, context, v);
    }
  } else {
    conv_tiles(g, context, v);
  }
  y.commit();
}

}  // namespace

void register_conv_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "conv2d",
                 "conv2d: direct depthwise kernel; im2col + GEMM in tiles of output pixels, one task per (image, "
                 "group, tile), bias/residual/activation per tile (NHWC through NCHW copies)",
                 nhwc_through_nchw([](const KernelLaunch& launch, const CpuContext& context) {
                   dispatch_compute_type(launch.desc->inputs[0].dtype,
                                         [&](auto zero) { run_conv2d<decltype(zero)>(launch, context); });
                 }));
}

}  // namespace xpuruntime::cpu
