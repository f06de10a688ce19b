// The cuda_raw backend's launchers for its registered ops (cuda_raw_register.cpp calls them). Launchers that
// other backends use are in cuda_raw_ops.h; the contract stated there (current device, stream as void*, no
// synchronization, zero-sized work enqueues nothing, typed errors, fp32 compute) holds here too. Every
// pointer addresses a contiguous tensor unless a geometry says otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device_kernels.h"
#include "xpuruntime/dtype.h"

namespace xpuruntime::cuda_raw {

// The most dimensions one kernel indexes after merging (see Note [Coalesced geometry] in elementwise.cu).
constexpr int kMaxDims = 8;

enum class UnaryOp : std::uint8_t {
  // elementwise.cu
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kAbs,
  kErf,
  kReciprocal,
  // activation.cu
  kRelu,
  kSigmoid,
  kTanh,
  kSilu,
  kGelu,      // x * Phi(x), erf form
  kGeluTanh,  // the tanh approximation
};

enum class BinaryOp : std::uint8_t { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum };

enum class ReduceOp : std::uint8_t { kSum, kMean, kMax, kMin, kProd, kSumSquare };  // kSumSquare: sum of x * x

// y[i] = op(x[i]) for n elements. `x == y` is allowed.
// Launches a kernel that stores to an unmapped address (a sticky cudaErrorIllegalAddress): for tests only.
void inject_fault(void* stream);

void unary(UnaryOp op, const void* x, void* y, DType dtype, std::int64_t n, void* stream);
// The activation subset of `unary` (kRelu and after), defined in activation.cu.
void activation(UnaryOp op, const void* x, void* y, DType dtype, std::int64_t n, void* stream);

// Where each output element of `y = a op b` reads its operands, after NumPy broadcasting and merging: the
// output (contiguous) has `shape`; operand k of the element at index i reads at sum(i[d] * strides[d]).
struct BroadcastGeometry {
  std::vector<std::int64_t> shape;  // outermost first; empty for a single element
  std::vector<std::int64_t> a_strides;
  std::vector<std::int64_t> b_strides;
  std::int64_t numel() const;
  // Both operands have the output's shape: the vectorized same-shape kernel applies.
  bool same_shape() const;
};

// Fills `geometry` for contiguous operands of shapes `a` and `b` broadcast to `out`. Returns false with
// `why_not` set when the merged geometry needs more than kMaxDims dimensions.
bool broadcast_geometry(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                        const std::vector<std::int64_t>& out, BroadcastGeometry* geometry, std::string* why_not);
void binary(BinaryOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
            void* stream);

// y = x converted from `from` to `to` (float32, float16, bfloat16, float64), n elements.
void cast(const void* x, DType from, void* y, DType to, std::int64_t n, void* stream);

// ---- data.cu: data movement, where, comparisons, every-dtype cast, integer arithmetic ----
// Data movement copies bits, so only the element size matters (1, 2, 4 or 8 bytes).

// y (contiguous, `shape`)[i...] = x[sum(i[d] * strides[d])], strides in elements (any sign, 0 for broadcast).
// `x` points at the element of index 0 (a slice's first element). Inner runs that x stores contiguously are
// moved in vectors of up to 16 bytes. Used by slice, expand and the run-preserving transposes.
void strided_gather(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& shape,
                    const std::vector<std::int64_t>& strides, void* stream);

// y = x permuted: y.shape[i] = shape[perm[i]] (perm normalized, a permutation). After dropping size-1 dims and
// merging dims that stay adjacent, a permutation that keeps the innermost dim is a strided_gather of
// contiguous runs; one that moves it goes through 32x32 shared-memory tiles (coalesced reads and writes).
void transpose(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& shape,
               const std::vector<std::int64_t>& perm, void* stream);

// y [outer, sum(row_bytes)] (bytes) = the inputs [outer, row_bytes[k]] side by side: one kernel per 64 inputs
// (Note [Concat in one kernel]).
void concat(const std::vector<const void*>& inputs, const std::vector<std::int64_t>& row_bytes, void* y,
            std::int64_t outer, void* stream);

// ONNX Gather of data viewed as [outer, axis_size, inner] with `num_indices` indices (int32 or int64, negative
// ones count from the end) into y [outer, num_indices, inner]. Note [Gather index errors]: an out-of-range index
// writes zeros and raises a flag on the device; `gather_index_error` reads it.
void gather(const void* data, const void* indices, DType index_dtype, void* y, std::size_t element_size,
            std::int64_t outer, std::int64_t axis_size, std::int64_t num_indices, std::int64_t inner, void* stream);
// Whether a gather on the current device met an out-of-range index since the last reset (synchronizes the
// device's work first). `reset` clears the flag.
bool gather_index_error(bool reset);
// Whether XPURT_CUDA_RAW_CHECK_INDICES=1 (read at each launch): the gather kernel then synchronizes around each
// launch and raises InvalidArgumentError on an out-of-range index (a debug check: it serializes the device's
// work, and cannot run inside a CUDA graph capture).
bool gather_checks_enabled();

// Where each output element of a three-operand broadcast (where) reads its operands, merged like
// BroadcastGeometry.
struct WhereGeometry {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides[3];  // cond, a, b
  std::int64_t numel() const;
  // Every operand has the output's shape: the vectorized same-shape kernel applies.
  bool same_shape() const;
};
bool where_geometry(const std::vector<std::int64_t>& cond, const std::vector<std::int64_t>& a,
                    const std::vector<std::int64_t>& b, const std::vector<std::int64_t>& out, WhereGeometry* geometry,
                    std::string* why_not);
// y = cond ? a : b (cond bool, one byte per element).
void where(const void* cond, const void* a, const void* b, void* y, std::size_t element_size,
           const WhereGeometry& geometry, void* stream);

// kAnd, kOr, kXor: the logical ops of bool operands.
enum class CompareOp : std::uint8_t { kEqual, kLess, kGreater, kAnd, kOr, kXor };
// y (bool) = a op b for any dtype (16-bit floats compared as float).
void compare(CompareOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
             void* stream);
// y = !x, bool, n elements.
void logical_not(const void* x, void* y, std::int64_t n, void* stream);

// add/sub/mul/div of int32/int64 with wrap-around; division truncates toward zero, MIN / -1 wraps to MIN, and a
// division by zero gives 0 (documented: the GPU cannot raise; the cpu kernel raises InvalidArgumentError).
void integer_binary(BinaryOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
                    void* stream);
// y = -x for int32/int64 (wrapping), n elements.
void integer_neg(const void* x, void* y, DType dtype, std::int64_t n, void* stream);

// y = x converted between any dtypes (used when either side is not a float dtype): float -> int truncates toward
// zero, saturating, NaN -> 0; int -> int wraps; -> bool is x != 0; bool -> 0 or 1; one rounding to 16-bit floats.
void cast_any(const void* x, DType from, void* y, DType to, std::int64_t n, void* stream);

// Softmax of x viewed as [outer, axis_size, inner] along the middle axis.
void softmax(const void* x, void* y, DType dtype, std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
             void* stream);
// log(softmax(x)) the same way, as x - max - log(sum(exp(x - max))) (no log of a rounded probability).
void log_softmax(const void* x, void* y, DType dtype, std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
                 void* stream);
// Few long rows (Note [Split softmax] in softmax.cu, Note [Split layer norm] in layer_norm.cu): a row kernel's
// [rows, cols] with each row cut into chunks (at least 8192 elements, a multiple of 8) when the rows alone would
// leave most SMs idle (fewer than 264 rows of over 32768 elements); each chunk leaves a pair of floats.
struct RowSplit {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t splits = 1;
  std::int64_t chunk = 0;

  std::size_t workspace_bytes() const;  // rows * splits pairs of 8 bytes when split
  std::string str() const;              // "1 rows x 128256 elements, 63 splits"
};
// `workspace_limit`: bytes at most (0: no limit; fewer splits, down to none, when it is small).
RowSplit row_split_geometry(std::int64_t rows, std::int64_t cols, std::uint64_t workspace_limit);
// softmax (log_output: log_softmax) of [rows, cols] along the last axis by the split geometry `g` (g.splits == 1:
// the row kernels of softmax()). `workspace`: g.workspace_bytes() (null when 0).
void softmax_split(const void* x, void* y, DType dtype, const RowSplit& g, bool log_output, void* workspace,
                   void* stream);

// A per-tensor QuantizeLinear of layer_norm's output, written beside it (Note [Quantized layer norm output] in
// core/op_schemas.cpp): y as stored (rounded to its dtype) / scale, as quantize_linear quantizes it, into `y` bytes
// of `dtype` (int8, uint8, float8e4m3fn, float8e5m2). Null `y`: none.
struct LayerNormQuantized {
  void* y = nullptr;
  DType dtype = DType::kInt8;
  float scale = 1.0f;
  float zero_point = 0.0f;  // 0 for float8
  // 1 / scale correctly rounded, when scale and it are normal floats: the quotient then takes no division (set by
  // layer_norm from `scale`)
  float reciprocal = 0.0f;
};

// y[r, :] = (v[r, :] - mean) / sqrt(var + epsilon) * scale + bias (+ addend) for v = x (+ residual, summed in fp32)
// viewed as [rows, cols]; `residual` and `addend` ([rows, cols]), `scale` and `bias` ([cols]) may be null; the addend
// is added in fp32 before the one rounding to T (a res-post-norm block's x + norm(f(x))). Biased variance, like
// PyTorch and ONNX. `quantized`: y quantized too.
void layer_norm(const void* x, const void* residual, const void* scale, const void* bias, const void* addend, void* y,
                DType dtype,
                std::int64_t rows, std::int64_t cols, float epsilon, void* stream,
                const LayerNormQuantized& quantized = {});
// layer_norm (no quantized output) by the split geometry `g` (row_split_geometry: a GroupNorm of 32 or 1 groups at
// batch 1; g.splits == 1: layer_norm's row kernels). `workspace`: g.workspace_bytes() (null when 0).
void layer_norm_split(const void* x, const void* residual, const void* scale, const void* bias, const void* addend,
                      void* y, DType dtype, const RowSplit& g, float epsilon, void* workspace, void* stream);

// How a reduction runs; made once per descriptor (a plan) by `reduce_geometry`.
struct ReduceGeometry {
  std::int64_t outputs = 0;  // elements of the result
  std::int64_t count = 0;    // input elements reduced into each result (0: an empty axis)
  // The input's dimensions after dropping size-1 ones and merging neighbours of the same kind, outermost
  // first: the kept ones in output order, and the reduced ones.
  std::vector<std::int64_t> kept_sizes;
  std::vector<std::int64_t> kept_strides;
  std::vector<std::int64_t> reduced_sizes;
  std::vector<std::int64_t> reduced_strides;
  // The innermost input dimension is reduced: a group of threads reads each result's contiguous run (the
  // "row" kernel). Otherwise one thread per result walks the reduced dimensions while neighbouring threads
  // read neighbouring elements (the "column" kernel).
  bool inner_reduced = false;
  // The input is [outer, count, inner] reduced over the middle, inner a multiple of 8 (a channels-last mean over H
  // and W): a block of threads reads 16-byte vectors of neighbouring results and combines its rows in shared memory
  // (Note [Middle-axis reductions]).
  bool middle = false;
  std::int64_t inner = 0;
  // Partial results per output; with more than one, a second kernel combines them from the workspace. Chosen
  // from the shape alone, so a plan gives the same bits every run.
  std::int64_t splits = 1;
  std::int64_t chunk = 0;  // reduced elements per partial result (the last one may have fewer)
  // The block kernel of integer reductions and reduce_prod (Note [Block reductions] in reduce.cu): a block per
  // (result, split), 8-byte partials; `splits` and `chunk` are its own then.
  bool block = false;

  std::size_t workspace_bytes() const;  // outputs * splits partials of 4 bytes (8 for the block kernel) when split
  std::string str() const;  // "3 outputs x 1000 elements, row kernel, 1 split"
};

// Fills `geometry` for a contiguous input of `shape` reduced along the dimensions flagged in `reduced`, with a
// workspace of at most `workspace_limit` bytes (0: no limit; fewer splits, down to none, when it is small).
// `block`: for the block kernel (integer_reduce, float_prod), else for `reduce`; `block_chunk_scale`: its chunks'
// scale over one element a load (32 for bools: two rounds of 16-byte loads, Note [Bools 16 at a time]).
// Returns false with `why_not` set when the kept or the reduced dimensions do not merge into kMaxDims each.
bool reduce_geometry(const std::vector<std::int64_t>& shape, const std::vector<bool>& reduced,
                     std::uint64_t workspace_limit, ReduceGeometry* geometry, std::string* why_not,
                     bool block = false, std::int64_t block_chunk_scale = 1);
// The block kernel's chunk scale for a reduction of `dtype` (32 for bools, else 1).
inline std::int64_t block_chunk_scale(DType dtype) { return dtype == DType::kBool ? 32 : 1; }
// `workspace`: geometry.workspace_bytes() bytes of device memory (null when 0).
void reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* workspace,
            void* stream);

// ---- pointwise.cu: the ONNX pointwise ops with parameters, rounding and bool results ----

enum class PointwiseOp : std::uint8_t {
  kClip,         // min(max(x, alpha), beta); NaN stays NaN; alpha > beta gives beta (np.clip)
  kHardSigmoid,  // max(0, min(1, alpha * x + beta))
  kHardSwish,    // x * max(0, min(1, x / 6 + 1 / 2))
  kLeakyRelu,    // x >= 0 ? x : alpha * x
  kElu,          // x >= 0 ? x : alpha * (exp(x) - 1)
  kSoftplus,     // log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|))
  kSin,
  kCos,
  kFloor,
  kCeil,
  kRound,  // half to even
  kSign,   // -1, 0 or 1 (NaN stays NaN)
  kTan,
  kAsin,
  kAcos,
  kAtan,
  kSinh,
  kCosh,
  kAsinh,
  kAcosh,
  kAtanh,
  kSoftsign,         // x / (1 + |x|)
  kSelu,             // gamma * (x > 0 ? x : alpha * (exp(x) - 1))  (alpha, beta = gamma)
  kCelu,             // max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
  kThresholdedRelu,  // x > alpha ? x : 0
  kMish,             // x * tanh(softplus(x))
};
// y[i] = op(x[i]; alpha, beta) for n float32/float16/bfloat16 elements, computed in fp32.
void pointwise(PointwiseOp op, const void* x, void* y, DType dtype, std::int64_t n, float alpha, float beta,
               void* stream);
// y (bool)[i] = isnan(x[i]) when `nan`, else (detect_positive && x[i] == +inf) || (detect_negative && x[i] == -inf).
void is_nan_or_inf(const void* x, void* y, DType dtype, std::int64_t n, bool nan, bool detect_positive,
                   bool detect_negative, void* stream);

// ---- scan.cu ----

// How cum_sum runs [outer, axis_size, inner] (Note [Split scans] in scan.cu): lines = outer * inner, each split into
// `splits` chunks of `chunk` elements (three passes when more than one), or a block per line when the lines are few
// and short (`block`). Chosen from the shape and the workspace limit alone.
struct ScanGeometry {
  std::int64_t lines = 0;
  std::int64_t axis_size = 0;
  std::int64_t inner = 1;
  std::int64_t splits = 1;
  std::int64_t chunk = 0;
  bool block = false;

  std::size_t workspace_bytes() const;  // lines * splits sums of 8 bytes when split
  std::string str() const;              // "1 lines x 1000003 elements, 7813 splits"
};
// `workspace_limit`: bytes at most (0: no limit; fewer splits, down to none, when it is small).
ScanGeometry cum_sum_geometry(std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
                              std::uint64_t workspace_limit);
// ONNX CumSum of x viewed as [outer, axis_size, inner] along the middle axis (`exclusive`: each output excludes its
// own element; `reverse`: sums run from the end). A thread per (line, split) in a fixed order, so the bits do not
// depend on the launch. Floats accumulate in fp32 (float64 in double), int32/int64 wrap. `workspace`: the
// geometry's workspace_bytes() (null when 0).
void cum_sum(const void* x, void* y, DType dtype, const ScanGeometry& geometry, bool exclusive, bool reverse,
             void* workspace, void* stream);

// ---- depthwise.cu ----

// The activation a depthwise convolution applies after bias and residual (conv2d's `activation`).
enum class DepthwiseActivation : std::uint8_t { kNone, kRelu, kSilu, kHardSwish, kRelu6, kGelu, kGeluTanh };
struct DepthwiseGeometry {
  int batch = 0, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int kernel_h = 0, kernel_w = 0, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dilation_h = 1,
      dilation_w = 1;
  DepthwiseActivation activation = DepthwiseActivation::kNone;  // set by depthwise_conv2d
};
// The shared memory one block of depthwise_conv2d takes (Note [Depthwise tiles]).
std::size_t depthwise_shared_bytes(const DepthwiseGeometry& g);
// y[N, C, OH, OW] = act(depthwise conv(x[N, C, H, W], w[C, 1, kh, kw]) + bias[C]? + residual[N, C, OH, OW]?),
// act none, relu, silu or hard_swish; float32/float16/bfloat16, fp32 accumulation (Note [Depthwise tiles]). `nhwc`: x [N, H, W, C],
// y and residual [N, OH, OW, C], w [C, kh, kw, 1] (the same memory; Note [Channels-last depthwise]).
void depthwise_conv2d(const void* x, const void* w, const void* bias, const void* residual, void* y, DType dtype,
                      const DepthwiseGeometry& g, DepthwiseActivation activation, bool nhwc, void* stream);

// ---- grouped_conv.cu (Note [Grouped convolutions as GEMMs]) ----

// A channels-last grouped convolution: x [n, h, w, c], y [n, oh, ow, o], weight [o, kh, kw, c / groups].
struct GroupedConvGeometry {
  std::int64_t n = 0, h = 0, w = 0, c = 0, o = 0, oh = 0, ow = 0, kh = 1, kw = 1, groups = 1;
  std::int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  std::int64_t group_channels() const { return c / groups; }
  std::int64_t depth() const { return kh * kw * group_channels(); }  // the reduction of a group's GEMM
  std::int64_t positions() const { return n * oh * ow; }
};
// col [groups, rows, depth] for output positions p0 .. p0 + rows - 1: col[j, r, (iy * kw + ix) * c / groups + ch] =
// x at tap (iy, ix) of position p0 + r, channel j * c / groups + ch, or zero past the borders. float32, float16 or
// bfloat16 (copied as bits); `col` holds groups * rows * depth elements.
void grouped_conv_im2col(const void* x, void* col, DType dtype, const GroupedConvGeometry& g, std::int64_t p0,
                         std::int64_t rows, void* stream);

// ---- pad.cu ----

enum class PadMode : std::uint8_t { kConstant, kReflect, kEdge, kWrap };
// ONNX Pad of a contiguous x of `in_shape` into y of `out_shape` (out = in + begins + ends per dim; negative
// pads crop): each output element reads the input element its mode maps it to, or `value_bits` (the constant,
// already in x's dtype, in the low element_size bytes) in constant mode. Reflect needs every padded dim > 1.
void pad(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& in_shape,
         const std::vector<std::int64_t>& out_shape, const std::vector<std::int64_t>& begins, PadMode mode,
         std::uint64_t value_bits, void* stream);

// ---- data.cu: index ops (Note [Gather index errors] applies: an out-of-range index writes zeros) ----

// ONNX GatherElements: y (indices' shape) [i] = data[i with i[axis] replaced by indices[i]].
void gather_elements(const void* data, const std::vector<std::int64_t>& data_shape, const void* indices,
                     DType index_dtype, const std::vector<std::int64_t>& index_shape, std::int64_t axis, void* y,
                     std::size_t element_size, void* stream);
// ONNX GatherND with data viewed as [batch, data_shape...] (data_shape: the dims after the batch dims) and
// indices as [batch, tuples, depth]: y [batch, tuples, slice] = data[b][indices[b, t, :]][slice...], slice =
// the product of data_shape[depth:].
void gather_nd(const void* data, const std::vector<std::int64_t>& data_shape, const void* indices, DType index_dtype,
               std::int64_t batch, std::int64_t tuples, std::int64_t depth, void* y, std::size_t element_size,
               void* stream);

// ---- reduce.cu: integer reductions ----

// reduce_sum (wrapping), reduce_max, reduce_min, reduce_prod (wrapping) of int32/int64, and reduce_max (any) and
// reduce_min (all) of bools, with a block per (output,
// block split) and a second pass over the splits (Note [Block reductions]); `geometry` from reduce_geometry,
// `workspace` its workspace_bytes() (may be null when that is 0).
void integer_reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* workspace,
                    void* stream);
// reduce_prod of float32/float16/bfloat16: the same block kernel, fp32 products in a fixed tree (deterministic).
void float_prod(const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* workspace, void* stream);

// ---- resize.cu ----

enum class ResizeMode : std::uint8_t { kNearest, kLinear, kCubic };
enum class ResizeCoordinates : std::uint8_t {
  kHalfPixel, kHalfPixelSymmetric, kPytorchHalfPixel, kAlignCorners, kAsymmetric, kTfHalfPixelForNn
};
enum class ResizeNearest : std::uint8_t { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };
// What ONNX Resize needs per dimension (opset 11-19 semantics without roi).
struct ResizeParams {
  ResizeMode mode = ResizeMode::kNearest;
  ResizeCoordinates coordinates = ResizeCoordinates::kHalfPixel;
  ResizeNearest nearest = ResizeNearest::kRoundPreferFloor;
  float cubic_a = -0.75f;
  bool exclude_outside = false;
  std::vector<std::int64_t> in_shape, out_shape;  // every dim; at most 3 of them change size
  std::vector<float> scales;                      // per dim: the scale the coordinate transform divides by
};
// Whether the kernel takes `params` (dims, resized dims); `why_not` says why not.
bool resize_supported(const ResizeParams& params, std::string* why_not);
void resize(const ResizeParams& params, const void* x, void* y, DType dtype, void* stream);

// ---- pool.cu ----

// max_pool2d / avg_pool2d of a [N, C, H, W] (or NHWC) tensor, every window the op schema takes (Note [Pooling
// windows] in backends/cpu/cpu_pool.cpp): ceil_mode output sizes (out_h, out_w from shape inference), asymmetric pads,
// dilations (max only), count_include_pad (avg only).
struct PoolParams {
  std::int64_t n = 0, c = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  std::int64_t kernel[2] = {1, 1}, stride[2] = {1, 1}, pad_begin[2] = {0, 0}, pad_end[2] = {0, 0};
  std::int64_t dilation[2] = {1, 1};
  bool nhwc = false, max = true, count_include_pad = false;
};
void pool2d(const PoolParams& params, const void* x, void* y, DType dtype, void* stream);

// ---- pointwise.cu: binary ops with broadcasting ----

enum class BinaryExtOp : std::uint8_t {
  kPrelu,  // a < 0 ? b * a : a (b: the slope)
  kFmod,   // C fmod: the sign of a (floats; integers: a % b truncated, by zero: 0)
  kMod,    // Python/NumPy mod: the sign of b (integers; by zero: 0)
};
// y = op(a, b) for float32/float16/bfloat16 (fp32 compute) or int32/int64 (kFmod, kMod) over `geometry`.
void binary_ext(BinaryExtOp op, const void* a, const void* b, void* y, DType dtype, const BroadcastGeometry& geometry,
                void* stream);

// ---- generate.cu: one_hot, trilu, tile, scatter_nd ----

// ONNX OneHot: indices (int32/int64, n of them; negative count from the end) -> y [outer, depth, inner] with
// y = on where the index equals the position along depth, else off (both already in y's dtype, element_size bytes).
void one_hot(const void* indices, DType index_dtype, void* y, std::size_t element_size, std::int64_t outer,
             std::int64_t depth, std::int64_t inner, std::uint64_t on_bits, std::uint64_t off_bits, void* stream);
// ONNX Trilu over the last two dims [batch, rows, cols]: keeps j - i >= k (upper) or j - i <= k (lower), else 0.
void trilu(const void* x, void* y, std::size_t element_size, std::int64_t batch, std::int64_t rows, std::int64_t cols,
           std::int64_t k, bool upper, void* stream);
// ONNX Tile: y (out_shape = in_shape * repeats)[i] = x[i mod in_shape].
void tile(const void* x, void* y, std::size_t element_size, const std::vector<std::int64_t>& in_shape,
          const std::vector<std::int64_t>& out_shape, void* stream);
// ONNX ScatterND (reduction none): y = data, then y[indices[t]] = updates[t] slice by slice, in order t = 0, 1, ...
// (one thread per slice element walks the tuples in order, so duplicates resolve to the last, deterministically).
// data_shape: every dim; indices [tuples, depth]; slice = product(data_shape[depth:]).
// `reduction`: 0 none (the element size is all that matters), 1 add, 2 mul, 3 max, 4 min (`dtype`: float32/16,
// bfloat16, int32, int64; each step combines in fp32 or the integer type and stores the element type).
void scatter_nd(const void* data, const void* indices, DType index_dtype, const void* updates, void* y,
                std::size_t element_size, const std::vector<std::int64_t>& data_shape, std::int64_t tuples,
                std::int64_t depth, void* stream, DType dtype = DType::kFloat32, int reduction = 0);

// ---- select.cu: arg_max / arg_min, top_k ----

// How arg_reduce runs [outer, axis_size, inner] (Note [Split arg reductions] in select.cu): a warp (inner == 1) or a
// thread per (line, split) task, lines = outer * inner; with more than one split, a second pass over the candidates.
// Chosen from the shape and the workspace limit alone.
struct ArgReduceGeometry {
  std::int64_t lines = 0;
  std::int64_t axis_size = 0;
  std::int64_t inner = 1;
  std::int64_t splits = 1;
  std::int64_t chunk = 0;  // axis elements per split (the last one may have fewer)

  std::size_t workspace_bytes() const;  // lines * splits candidates of 16 bytes when split
  std::string str() const;              // "1 lines x 1000003 elements, row kernel, 245 splits"
};
// `workspace_limit`: bytes at most (0: no limit; fewer splits, down to none, when it is small).
ArgReduceGeometry arg_reduce_geometry(std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
                                      std::uint64_t workspace_limit);
// Index (int64) of the max / min along the middle axis of [outer, axis_size, inner]; ties: the first
// (select_last_index: the last); NaN counts as the max (and as the min, like NumPy). `workspace`: the geometry's
// workspace_bytes() (null when 0).
void arg_reduce(bool max, bool select_last_index, const void* x, DType dtype, void* y,
                const ArgReduceGeometry& geometry, void* workspace, void* stream);
// ONNX TopK along the last axis of [rows, cols] (the caller transposes other axes): values and int64 indices
// [rows, k], largest or smallest first when sorted (ties: the smaller index first; NaN before +inf when largest,
// after it when smallest). One block per row (Note [TopK by radix select] in select.cu): a sort of the whole row
// (cols <= kTopKMaxCols) or a radix select of k <= kTopKMaxSelected, for rows of up to kTopKMaxAxis elements.
constexpr std::int64_t kTopKMaxCols = 4096;
constexpr std::int64_t kTopKMaxSelected = 4096;
constexpr std::int64_t kTopKMaxAxis = 0x7fffffff;
constexpr std::int64_t kTopKRadixMinCols = 1024;
constexpr int kTopKRadixThreads = 1024;
// The power of two at or above n (n >= 1), the size top_k's sorts pad to.
inline std::int64_t top_k_padded(std::int64_t n) {
  std::int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
// Whether top_k takes the radix select for a row of cols elements and k selected: any row longer than a whole-row
// sort takes, and a long row whose padded k is at most a quarter of it (a whole-row sort of SSDlite's 3234 scores
// for 300 of them took 75 us on an H200).
inline bool top_k_by_radix_select(std::int64_t cols, std::int64_t k) {
  if (cols > kTopKMaxCols) return true;
  return cols > kTopKRadixMinCols && 4 * top_k_padded(k) <= top_k_padded(cols);
}
// Whether top_k takes rows of cols elements and k selected.
inline bool top_k_supports(std::int64_t cols, std::int64_t k) {
  return cols >= 1 && cols <= kTopKMaxAxis && k >= 0 && k <= cols && (cols <= kTopKMaxCols || k <= kTopKMaxSelected);
}
// Few long rows (Note [TopK of few long rows] in select.cu): when the rows alone would leave most SMs idle (fewer
// than kTopKSplitTargetBlocks) and a row holds at least two chunks of kTopKSplitMinChunk elements (and of 4k), each
// row is cut into `splits` balanced chunks; a block per chunk selects the chunk's k best into the workspace
// (values and int64 row indices, k a chunk), then a block per row selects the k best of its splits x k candidates.
constexpr std::int64_t kTopKSplitTargetBlocks = 264;
constexpr std::int64_t kTopKSplitMinChunk = 8192;
struct TopKSplit {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t k = 0;
  std::int64_t splits = 1;
  std::int64_t chunk = 0;
  std::size_t value_bytes = 4;  // the element's size (the candidates' values in the workspace)

  std::size_t workspace_bytes() const;  // rows * splits * k candidates of value_bytes + 8 bytes when split
  std::string str() const;              // "1 rows x 1048583 elements, k 100, 128 splits"
};
// `workspace_limit`: bytes at most (0: no limit; fewer splits, down to none, when it is small).
TopKSplit top_k_split_geometry(std::int64_t rows, std::int64_t cols, std::int64_t k, DType dtype,
                               std::uint64_t workspace_limit);
// TopK of [g.rows, g.cols] by the geometry `g` (g.splits == 1: a block per row). `workspace`: g.workspace_bytes()
// (null when 0).
void top_k(const void* x, DType dtype, void* values, void* indices, const TopKSplit& g, bool largest,
           void* workspace, void* stream);

// ---- data_dependent.cu: non_zero, non_max_suppression (Note [Segmented plans] in capture_plan.h) ----

// ONNX NonZero of x (shape `shape`, rank 1..kNonZeroMaxRank, n elements): y int64 [rank, n], whose first *count
// columns are the indices in row-major order (floats: -0.0 is zero, NaN is not); count int64 [1].
constexpr int kNonZeroMaxRank = 8;
std::size_t non_zero_workspace_bytes(std::int64_t numel);
void non_zero(const void* x, DType dtype, const std::vector<std::int64_t>& shape, void* y, void* count,
              void* workspace, void* stream);

// ONNX NonMaxSuppression: boxes [batches, boxes, 4], scores [batches, classes, boxes] (float32/16, bfloat16);
// selected int64 [batches * classes * max_per_class, 3] whose first *count rows are the (batch, class, box) triples
// in batch, class, descending-score order; count int64 [1].
struct NmsGeometry {
  std::int64_t batches = 0, classes = 0, boxes = 0;
  std::int64_t max_per_class = 0;  // min(max_output_boxes_per_class, boxes), >= 0
  bool center_point_box = false;
  double iou_threshold = 0;
  bool has_score_threshold = false;
  double score_threshold = 0;
};
std::size_t nms_workspace_bytes(const NmsGeometry& geometry);
void non_max_suppression(const void* boxes, const void* scores, DType dtype, const NmsGeometry& geometry,
                         void* selected, void* count, void* workspace, void* stream);

// qlinear by __dp4a with its epilogue fused (quant_gemm.cu, Note [The dp4a kernel of qlinear]): out[m, n] =
// epilogue(sum_k x'[m, k] * w[k, n]) with x' = x - 128 for a uint8 x (x itself for int8): the zero points are
// folded into epilogue.int_bias by quantized_prologue beforehand (Note [Signed operands of the int8 GEMMs] in
// core/quantized_gemm.h). Any M, N, K and alignment; N up to 65535 * 64.
struct QLinearDp4a {
  const void* x = nullptr;  // [m, k] int8 or uint8
  bool x_unsigned = false;
  const std::int8_t* weight = nullptr;  // [n, k] when weight_nk, else [k, n]
  bool weight_nk = true;
  void* out = nullptr;  // [m, n] of epilogue.out_dtype
  std::int64_t m = 0, n = 0, k = 0;
  QuantEpilogueParams epilogue;
};
void qlinear_dp4a(const QLinearDp4a& args, void* stream);

}  // namespace xpuruntime::cuda_raw
