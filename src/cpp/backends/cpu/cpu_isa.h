// Inner loops of the cpu backend compiled for several x86 instruction sets and picked once per process by what
// the CPU supports (Note [CPU instruction sets] in cpu_isa_baseline.cpp). Internal header of src/cpp/backends/cpu/.
//
// Ownership: the tables are static constants. Thread-safety: isa_kernels() may be called from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "xpuruntime/export.h"

namespace xpuruntime::cpu {

// The padded input plane that a window op's output plane reads, split by the strides (Note [Phase-split planes] in
// cpu_conv.cpp): padded row r (input row r - pad_top) goes to row phase r % row_phases at row r / row_phases of that
// phase, and padded column c (input column c - pad_left) to column phase c % phases at index c / phases. Stored
// [row_phases][phase_rows][phases][phase_cols]; row_stride = phases * phase_cols.
struct PhaseGeometry {
  std::int64_t rows = 0, cols = 0;  // the padded extent the output's windows cover
  std::int64_t row_phases = 1, phase_rows = 0;
  std::int64_t phases = 1, phase_cols = 0, row_stride = 0;
  std::int64_t pad_top = 0, pad_left = 0;
};

// Elements of the buffer fill_phase_* writes: the plane and one staging row.
inline std::int64_t phase_plane_size(const PhaseGeometry& g) {
  return (g.row_phases * g.phase_rows + 1) * g.row_stride;
}

// One output plane of a sliding-window op over a phase-split plane (Note [Phase-split planes]): output (oh, ow)
// reads, for each tap t, input[q + offsets[t]] with q = oh * row_stride + ow. The loops run over q in one flat
// range into `wide` ([out_h, row_stride]; the columns past out_w are computed and dropped), then copy each row's
// first out_w values into `out` with the epilogue.
template <typename T>
struct WindowPlane {
  const T* input = nullptr;
  std::int64_t row_stride = 0;
  const std::int64_t* offsets = nullptr;  // [taps]
  std::int64_t taps = 0;
  std::int64_t out_h = 0, out_w = 0;
  T* wide = nullptr;  // scratch, out_h * row_stride
  T* out = nullptr;   // [out_h, out_w], contiguous
};

// One plane of max or average pooling (Notes [Max pooling by rows] and [Average pooling by rows] in cpu_pool.cpp):
// input [height, width] -> out [out_h, out_w], windows as Note [Pooling windows] there. Max pooling: `row` is scratch
// of row_length >= max(pad_left + width, (out_w - 1) * stride_w + (kernel_w - 1) * dilation_w + 1) elements.
template <typename T>
struct PoolPlane {
  const T* input = nullptr;
  std::int64_t height = 0, width = 0, out_h = 0, out_w = 0;
  std::int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  std::int64_t pad_top = 0, pad_left = 0;
  T* row = nullptr;
  std::int64_t row_length = 0;
  T* out = nullptr;
  // Average pooling only (Note [Average pooling by rows]): the trailing pads, the divisor rule, and `sums`, scratch
  // of width + out_w doubles (`row` is unused).
  std::int64_t pad_bottom = 0, pad_right = 0;
  bool count_include_pad = false;
  double* sums = nullptr;
};

// The epilogue of a depthwise plane: + bias, + residual (same shape as out, or null), then ReLU when relu.
template <typename T>
struct PlaneEpilogue {
  T bias = T(0);
  const T* residual = nullptr;
  bool relu = false;
};

// The rows of a B given by pointers: column j of row p is rows[p][(c / segment) * pitch + c % segment], c = col0 + j
// (runs of `segment` floats every `pitch`).
struct RowsOfB {
  const float* const* rows = nullptr;
  std::int64_t col0 = 0, segment = 1, pitch = 1;
  // B[k][j] = rows[k][col0 + j], read in place by the micro-tiles (no packing; segment and pitch unused): each row
  // readable up to the whole vector past its last column (Note [Windows read in place] in cpu_conv.cpp).
  bool in_place = false;
};

// One tile of a packed float GEMM (Note [Packed GEMM] in cpu_gemm.cpp): C[rows, cols] (ldc) = A[rows, depth] (lda)
// * op(B)[depth, cols] (ldb; op(B) = B^T with B stored [cols, depth] when trans_b), C overwritten. The scratch holds
// the packed panels: pack_a round_up(rows, mr) * kc floats, pack_b round_up(cols, nr) * kc floats.
struct GemmTile {
  std::int64_t rows = 0, cols = 0, depth = 0;
  const float* a = nullptr;
  std::int64_t lda = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0;
  bool trans_b = false;
  // Instead of b when b_rows.rows is set: B given by row pointers (a convolution's windows of its padded input, Note
  // [Convolution as a GEMM over windows] in cpu_conv.cpp).
  RowsOfB b_rows;
  float* c = nullptr;
  std::int64_t ldc = 0;
  float* pack_a = nullptr;
  float* pack_b = nullptr;
  // When set, A packed once for all tiles by pack_gemm_a_f32 (packed_a_rows: its rows rounded up to gemm_mr) and
  // this tile's rows start at row packed_a_row0 of it; pack_a is then unused.
  const float* packed_a = nullptr;
  std::int64_t packed_a_rows = 0, packed_a_row0 = 0;
  // When set, op(B) packed once for all tiles by pack_gemm_b (cpu_gemm.cpp: each depth slice of gemm_kc, its columns
  // padded to packed_b_cols, in micro-panels of gemm_nr) and this tile's columns start at column packed_b_col0 of it;
  // b, b_rows and pack_b are then unused.
  const float* packed_b = nullptr;
  std::int64_t packed_b_cols = 0, packed_b_col0 = 0;
};

// The functions IsaKernels::math_f32 computes.
enum class VectorMath : std::uint8_t { kTanh, kErf, kGelu, kGeluTanh };

// The ONNX activations IsaKernels::activation_f32 computes (Note [Vectorised ELU, Softplus and Mish] in
// cpu_isa_baseline.cpp), with the formulas of the ONNX reference library's float kernels.
enum class VectorActivation : std::uint8_t {
  kElu,              // x < 0 ? alpha (e^x - 1) : x
  kSelu,             // x < 0 ? alpha (e^x - 1) : gamma x
  kCelu,             // x < 0 ? alpha (e^(x / alpha) - 1) : x, for a finite alpha > 0 only
  kSoftplus,         // log(1 + e^x)
  kMish,             // x tanh(log(1 + e^x))
  kLeakyRelu,        // x < 0 ? alpha x : x
  kHardSigmoid,      // max(0, min(1, alpha x + beta)), NaN staying NaN
  kHardSwish,        // x max(0, min(1, x / 6 + 1/2))
  kSoftsign,         // x / (1 + |x|)
  kThresholdedRelu,  // x > alpha ? x : 0
};

// One VectorActivation and its attributes in float. Valid as constructed: ELU with alpha 1.
struct ActivationParams {
  VectorActivation op = VectorActivation::kElu;
  // ELU's, CELU's and LeakyRelu's alpha (the negative side's scale), HardSigmoid's slope, ThresholdedRelu's
  // threshold; SELU: ONNX's gamma * alpha, rounded once from the product in double as the reference rounds it.
  float alpha = 1.0f;
  float beta = 0.0f;   // HardSigmoid's offset
  float gamma = 1.0f;  // SELU's scale of x >= 0
};

// Channels of a depthwise convolution IsaKernels::depthwise_block_f32 computes at once (Note [Depthwise convolution of
// small planes across channels] in cpu_conv.cpp), and one block's problem: `channels` (at most kDepthwiseBlock)
// consecutive input planes of height x width, their kh x kw weights and output planes, one output channel per input
// channel; scratch holds depthwise_block_scratch floats.
constexpr std::int64_t kDepthwiseBlock = 16;
struct DepthwiseBlock {
  const float* x = nullptr;
  const float* w = nullptr;
  float* y = nullptr;
  std::int64_t channels = 0;
  std::int64_t height = 0, width = 0, out_h = 0, out_w = 0, kh = 0, kw = 0;
  std::int64_t stride[2] = {1, 1}, pad[2] = {0, 0}, dilation[2] = {1, 1};
  float* scratch = nullptr;
};
inline std::int64_t depthwise_block_scratch(const DepthwiseBlock& b) {
  return kDepthwiseBlock * (b.height * b.width + b.kh * b.kw + b.out_h * b.out_w);
}

// Planes IsaKernels::avg_pool_block_f32 pools at once (Note [Average pooling of small planes across channels] in
// cpu_pool.cpp), and one block's problem: `planes` (at most kPoolBlock) consecutive input planes of `shape`'s geometry
// (no dilation; its input, out, row and sums unused) averaged into as many output planes (Note [Pooling windows]);
// scratch holds pool_block_scratch floats.
constexpr std::int64_t kPoolBlock = 16;
struct PoolBlock {
  const float* x = nullptr;
  float* y = nullptr;
  std::int64_t planes = 0;
  PoolPlane<float> shape;
  float* scratch = nullptr;
};
inline std::int64_t pool_block_scratch(const PoolPlane<float>& s) {
  return kPoolBlock * (s.height * s.width + s.out_h * s.out_w);
}

// The activations IsaKernels::epilogue_f32 applies (Note [Convolution epilogues in vectors] in cpu_conv.cpp).
enum class RowActivation : std::uint8_t { kNone, kRelu, kRelu6, kHardSwish };

// The kernels of one instruction set.
struct IsaKernels {
  const char* name;  // "avx512", "avx2", "baseline"
  // out = sum over taps of weights[t] * input tap, then the epilogue.
  void (*depthwise_f32)(const WindowPlane<float>&, const float* weights, const PlaneEpilogue<float>&);
  void (*depthwise_f64)(const WindowPlane<double>&, const double* weights, const PlaneEpilogue<double>&);
  // One plane of max pooling (NaN propagates), of average pooling.
  void (*max_pool_plane_f32)(const PoolPlane<float>&);
  void (*max_pool_plane_f64)(const PoolPlane<double>&);
  void (*avg_pool_plane_f32)(const PoolPlane<float>&);
  void (*avg_pool_plane_f64)(const PoolPlane<double>&);
  // Writes the phase-split padded copy of `plane` ([height, width]) into `out`: `pad` outside the input (0 for
  // convolutions, -inf for max pooling). `out` holds phase_plane_size(g) elements (one row more than the plane, a
  // staging row).
  void (*fill_phase_f32)(const PhaseGeometry&, const float* plane, std::int64_t height, std::int64_t width, float pad,
                         float* out);
  void (*fill_phase_f64)(const PhaseGeometry&, const double* plane, std::int64_t height, std::int64_t width,
                         double pad, double* out);
  // The packed float GEMM: its micro-tile (gemm_mr rows x gemm_nr columns, held in registers) and depth slice
  // (gemm_kc), and one tile of C.
  std::int64_t gemm_mr, gemm_nr, gemm_kc;
  void (*gemm_tile_f32)(const GemmTile&);
  // A[rows, depth] (lda) packed for every tile at once: round_up(rows, gemm_mr) * depth floats at out.
  void (*pack_gemm_a_f32)(const float* a, std::int64_t lda, std::int64_t rows, std::int64_t depth, float* out);
  // op(B)[depth, cols] (B [depth, cols] with ldb, or [cols, depth] when trans) for GemmTile::packed_b: each depth
  // slice of gemm_kc as gemm_tile_f32 would pack it (micro-panels of gemm_nr columns), slice after slice, a slice's
  // columns padded to a whole panel (out holds round_up(cols, gemm_nr) * depth floats).
  void (*pack_gemm_b_f32)(const float* b, std::int64_t ldb, bool trans, std::int64_t depth, std::int64_t cols,
                          float* out);
  // Products with fewer than 8 rows or columns (Note [Skinny GEMM] in cpu_gemm.cpp), on the calling thread.
  // gemm_dots_f32: out[x * out_x + y * out_y] = the dot product of many's row x (ld_many) and few's row y (ld_few)
  // over `depth`, for x < count and y < few_count (1 to 7).
  void (*gemm_dots_f32)(const float* many, std::int64_t ld_many, std::int64_t count, const float* few,
                        std::int64_t ld_few, int few_count, std::int64_t depth, float* out, std::int64_t out_x,
                        std::int64_t out_y);
  // gemm_few_rows_f32: C[rows, cols] (ldc) = A[rows, depth] (lda) * B[depth, cols] (ldb), rows 1 to 7.
  void (*gemm_few_rows_f32)(const float* a, std::int64_t lda, int rows, const float* b, std::int64_t ldb,
                            std::int64_t cols, std::int64_t depth, float* c, std::int64_t ldc);
  // out[i] = e^a[i], or 1 / (1 + e^-a[i]) when `sigmoid`, for the arguments of the exponential within [kExpLow,
  // kExpHigh] or below kExpZero (e^x is +0 there, as std::exp has it); other elements (exp_outside: NaN included) get
  // some value, which the caller replaces (Note [Vectorised exp on the CPU] in cpu_fused.cpp). Returns whether there
  // was any such element.
  bool (*exp_f32)(const float* a, float* out, std::int64_t n, bool sigmoid);
  // out[i] = op(a[i]) for tanh, erf and the two GELUs (Note [Vectorised tanh, erf and GELU] in cpu_isa_baseline.cpp):
  // every float argument, NaN and the infinities included; a and out may be the same array.
  void (*math_f32)(const float* a, float* out, std::int64_t n, VectorMath op);
  // y = softmax(x) over one row of n floats (Note [Softmax rows in vectors] in cpu_norm.cpp): the maximum, e^(x - max)
  // by exp_f32's arithmetic (std::exp's for subnormal results), a compensated sum, one scale. False, y untouched,
  // for a row holding NaN or +inf or only -inf (the caller's NaN row); y must not overlap x.
  bool (*softmax_row_f32)(const float* x, float* y, std::int64_t n);
  // row[p] = act(row[p] + bias + residual[p]) (residual null: act(row[p] + bias)) over `count` floats, act one of
  // RowActivation with apply_activation's values (NaN stays NaN), the sums in that order (Note [Convolution epilogues
  // in vectors] in cpu_conv.cpp).
  void (*epilogue_f32)(float* row, std::int64_t count, float bias, const float* residual, RowActivation act);
  // y = the depthwise convolution of one DepthwiseBlock, no epilogue; each output sums the taps inside the input in
  // row-major order (Note [Depthwise convolution of small planes across channels] in cpu_conv.cpp).
  void (*depthwise_block_f32)(const DepthwiseBlock& block);
  // y = the average pooling of one PoolBlock's planes, as avg_pool_plane_f32 computes each (Note [Average pooling of
  // small planes across channels] in cpu_pool.cpp).
  void (*avg_pool_block_f32)(const PoolBlock& block);
  // out[i] = act(a[i]) (Note [Vectorised ELU, Softplus and Mish] in cpu_isa_baseline.cpp): every float argument, NaN
  // and the infinities included; a and out may be the same array.
  void (*activation_f32)(const float* a, float* out, std::int64_t n, const ActivationParams& act);
  // y = log_softmax(x) over one row of n floats (Note [Log-softmax rows in vectors] in cpu_norm.cpp): the maximum,
  // the sum of e^(x - max) made in registers (compensated float sums; where an exponential leaves exp_f32's range,
  // again kLogSoftmaxChunk floats at a time through t in double, with std::exp there), then x - (max + log(sum)) in
  // double, rounded once. A row holding NaN or +inf, or only -inf, gives NaN.
  void (*log_softmax_row_f32)(const float* x, float* y, std::int64_t n, float* t);
  // One row of layer_norm over n floats (Note [Layer norm rows in independent chains] in cpu_norm.cpp): the mean and
  // the squares about it as sums of sixteen double chains (wide_sums<16>'s order), then each element's (x - mean) *
  // inv_std, times gamma[i], plus beta[i], plus addend[i] (each optional: null), in double, rounded once; the row's
  // mean and inv_std into *stats when it is not null. With row_affine (Note [Per-row affine of a layer norm] in
  // core/op_schemas.cpp) gamma and beta must be null: the row is runs of affine_run elements (n itself when 0; it
  // divides n), run k taking (x - mean) * inv_std * row_affine[2k] + row_affine[2k + 1] (+ addend[i]). dst may be src.
  void (*layer_norm_row_f32)(const float* src, std::int64_t n, double epsilon, const float* gamma, const float* beta,
                             const float* addend, const double* row_affine, std::int64_t affine_run, float* dst,
                             double* stats);
  // acc[j] += row[j] (or row[j]^2 when square), in double, for j < n (Note [Reductions that keep the innermost axis] in
  // cpu_reduce.cpp).
  void (*accumulate_row_f32)(double* acc, const float* row, std::int64_t n, bool square);
  // The sum of x[i] (or x[i]^2 when square) over n floats in double, in wide_sums<16>'s order (cpu_common.h; the
  // squares may be fused multiply-adds above the baseline, Note [CPU instruction sets]).
  double (*sum_f32)(const float* x, std::int64_t n, bool square);
};

// The floats of e^(x - max) IsaKernels::log_softmax_row_f32 makes at a time (its scratch t holds that many).
constexpr std::int64_t kLogSoftmaxChunk = 2048;

// The arguments of the exponential exp_f32 computes itself (2^n of its reduction a normal float), and the bound below
// which e^x rounds to +0 in float (e^-104 < 2^-150, half the smallest subnormal): a masked score (-1e4, -1e9, the
// lowest float, -inf) minus its row's maximum lies there.
constexpr float kExpLow = -87.0f, kExpHigh = 88.0f, kExpZero = -104.0f;

// Whether exp_f32 left e^x to its caller (a subnormal result, an overflow near the top, NaN).
inline bool exp_outside(float x) { return !(x >= kExpLow && x <= kExpHigh) && !(x < kExpZero); }

// The kernels of the best instruction set this CPU has, or the one XPURT_CPU_ISA names (baseline, avx2, avx512;
// read once per process; InvalidArgumentError for another value, UnsupportedOperationError for one the CPU
// lacks, both thrown by the first call).
const IsaKernels& isa_kernels();

// Whether this CPU can run `name`'s kernels (tests: which tables to compare).
XPURT_API bool isa_supported(const std::string& name);

// The table of `name` (baseline, avx2, avx512); InvalidArgumentError for another name or one the CPU lacks.
XPURT_API const IsaKernels& isa_kernels_named(const std::string& name);

}  // namespace xpuruntime::cpu
