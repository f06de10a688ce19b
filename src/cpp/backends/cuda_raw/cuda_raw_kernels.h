// The cuda_raw backend's launchers for its registered ops (cuda_raw_register.cpp calls them). Launchers that
// other backends use are in cuda_raw_ops.h; the contract stated there (current device, stream as void*, no
// synchronization, zero-sized work enqueues nothing, typed errors, fp32 compute) holds here too. Every
// pointer addresses a contiguous tensor unless a geometry says otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

enum class ReduceOp : std::uint8_t { kSum, kMean, kMax, kMin };

// y[i] = op(x[i]) for n elements. `x == y` is allowed.
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

// Softmax of x viewed as [outer, axis_size, inner] along the middle axis.
void softmax(const void* x, void* y, DType dtype, std::int64_t outer, std::int64_t axis_size, std::int64_t inner,
             void* stream);

// y[r, :] = (x[r, :] - mean) / sqrt(var + epsilon) * scale + bias for x viewed as [rows, cols]; `scale` and
// `bias` ([cols]) may be null. Biased variance, like PyTorch and ONNX.
void layer_norm(const void* x, const void* scale, const void* bias, void* y, DType dtype, std::int64_t rows,
                std::int64_t cols, float epsilon, void* stream);

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
  // Partial results per output; with more than one, a second kernel combines them from the workspace. Chosen
  // from the shape alone, so a plan gives the same bits every run.
  std::int64_t splits = 1;
  std::int64_t chunk = 0;  // reduced elements per partial result (the last one may have fewer)

  std::size_t workspace_bytes() const;
  std::string str() const;  // "3 outputs x 1000 elements, row kernel, 1 split"
};

// Fills `geometry` for a contiguous input of `shape` reduced along the dimensions flagged in `reduced`, with a
// workspace of at most `workspace_limit` bytes (0: no limit; fewer splits, down to none, when it is small).
// Returns false with `why_not` set when the kept or the reduced dimensions do not merge into kMaxDims each.
bool reduce_geometry(const std::vector<std::int64_t>& shape, const std::vector<bool>& reduced,
                     std::uint64_t workspace_limit, ReduceGeometry* geometry, std::string* why_not);
// `workspace`: geometry.workspace_bytes() bytes of device memory (null when 0).
void reduce(ReduceOp op, const ReduceGeometry& geometry, const void* x, void* y, DType dtype, void* workspace,
            void* stream);

}  // namespace xpuruntime::cuda_raw
