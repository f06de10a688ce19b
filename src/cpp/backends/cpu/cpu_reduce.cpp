// Reductions of the cpu backend: reduce_sum, reduce_mean, reduce_max, reduce_min over any set of axes (empty:
// all), keepdims or not. Each output element walks its reduced elements in row-major order, summing in double.
// NaN propagates through max and min (as torch.amax/amin do); an empty reduction gives 0 for sum and NaN for
// mean (0 / 0, like NumPy and PyTorch); max/min of an empty axis is rejected by the op schema.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {

namespace {

enum class ReduceOp : std::uint8_t { kSum, kMean, kMax, kMin, kSumSquare };

// The element a sum accumulates: x, or x * x for reduce_sum_square (squared in double, never rounded to T).
inline double summand(ReduceOp op, double x) { return op == ReduceOp::kSumSquare ? x * x : x; }
inline bool sums(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kMean || op == ReduceOp::kSumSquare; }

// Note [Reductions of trailing axes]
// Where every reduced axis (of size > 1) comes after every kept one, output o reduces the contiguous row
// x[o * count, (o + 1) * count): no coordinates to decode, and the row's sum in four double accumulators that the
// compiler keeps in vector registers (a global average pool, squeeze-excitation's mean over H x W, a norm's row).
// The four partial sums are added at the end; in double, a float row's sum differs from the sequential one far below
// float's last bit.
bool trailing_rows(const std::vector<bool>& reduced, const std::vector<std::int64_t>& shape) {
  bool seen_reduced = false;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (reduced[d]) seen_reduced = true;
    if (!reduced[d] && seen_reduced) return false;
  }
  return true;
}

template <typename T>
void reduce_rows(ReduceOp op, const T* in, T* out, std::int64_t rows, std::int64_t count, const CpuContext& context) {
  parallel_for(rows, context.threads, std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(count, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t o = begin; o < end; ++o) {
                   const T* p = in + o * count;
                   if (sums(op)) {
                     double acc[4] = {0.0, 0.0, 0.0, 0.0};
                     std::int64_t i = 0;
                     for (; i + 4 <= count; i += 4) {
                       for (int j = 0; j < 4; ++j) acc[j] += summand(op, static_cast<double>(p[i + j]));
                     }
                     for (; i < count; ++i) acc[0] += summand(op, static_cast<double>(p[i]));
                     const double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                     out[o] = static_cast<T>(op == ReduceOp::kMean ? sum / static_cast<double>(count) : sum);
                     continue;
                   }
                   T best = op == ReduceOp::kMax ? -std::numeric_limits<T>::infinity()
                                                 : std::numeric_limits<T>::infinity();
                   bool nan = false;
                   for (std::int64_t i = 0; i < count; ++i) {
                     nan = nan || p[i] != p[i];
                     best = op == ReduceOp::kMax ? std::max(best, p[i]) : std::min(best, p[i]);
                   }
                   out[o] = nan ? std::numeric_limits<T>::quiet_NaN() : best;
                 }
               });
}

template <typename T>
void run_reduce(ReduceOp op, const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x_tensor = launch.input(0);
  const auto& shape = x_tensor.shape();
  const int rank = x_tensor.dim();
  const auto axes = launch.desc->attrs.get_ints("axes", {});
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (auto axis : axes) reduced[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)] = true;

  // Kept dims (outer index) and reduced dims (inner walk), each with its element strides in x.
  const auto strides = contiguous_strides(shape);
  std::vector<std::int64_t> kept_sizes, kept_strides, red_sizes, red_strides;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 1) continue;  // contributes nothing either way
    (reduced[d] ? red_sizes : kept_sizes).push_back(shape[d]);
    (reduced[d] ? red_strides : kept_strides).push_back(strides[d]);
  }
  // Merge adjacent reduced dims that are contiguous with each other (e.g. all trailing dims).
  std::vector<std::int64_t> sizes, steps;
  for (std::size_t i = 0; i < red_sizes.size(); ++i) {
    if (!sizes.empty() && steps.back() == red_strides[i] * red_sizes[i]) {
      sizes.back() *= red_sizes[i];
      steps.back() = red_strides[i];
    } else {
      sizes.push_back(red_sizes[i]);
      steps.push_back(red_strides[i]);
    }
  }
  const std::int64_t count = product(red_sizes, 0, red_sizes.size());
  const std::int64_t outputs = launch.output(0).numel();

  InputBuffer<T> x(x_tensor);
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  T* out = y.data();
  if (trailing_rows(reduced, shape)) {  // Note [Reductions of trailing axes]
    reduce_rows(op, in, out, outputs, count, context);
    y.commit();
    return;
  }
  const std::int64_t inner = sizes.empty() ? 1 : sizes.back();
  const std::int64_t inner_step = sizes.empty() ? 0 : steps.back();
  const std::int64_t outer_count = inner > 0 ? count / inner : 0;
  parallel_for(outputs, context.threads, std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(count, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t o = begin; o < end; ++o) {
                   std::int64_t base = 0, rest = o;
                   for (std::size_t d = kept_sizes.size(); d-- > 0;) {
                     base += (rest % kept_sizes[d]) * kept_strides[d];
                     rest /= kept_sizes[d];
                   }
                   double sum = 0.0;
                   T best =
                       op == ReduceOp::kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
                   bool nan = false;
                   for (std::int64_t r = 0; r < outer_count; ++r) {
                     std::int64_t offset = base, rest_r = r;
                     for (std::size_t d = sizes.empty() ? 0 : sizes.size() - 1; d-- > 0;) {
                       offset += (rest_r % sizes[d]) * steps[d];
                       rest_r /= sizes[d];
                     }
                     const T* p = in + offset;
                     if (sums(op)) {
                       for (std::int64_t i = 0; i < inner; ++i) {
                         sum += summand(op, static_cast<double>(p[i * inner_step]));
                       }
                     } else {
                       for (std::int64_t i = 0; i < inner; ++i) {
                         const T v = p[i * inner_step];
                         nan = nan || v != v;
                         best = op == ReduceOp::kMax ? std::max(best, v) : std::min(best, v);
                       }
                     }
                   }
                   switch (op) {
                     case ReduceOp::kSum:
                     case ReduceOp::kSumSquare:
                       out[o] = static_cast<T>(sum);
                       break;
                     case ReduceOp::kMean:
                       out[o] = static_cast<T>(sum / static_cast<double>(count));
                       break;
                     case ReduceOp::kMax:
                     case ReduceOp::kMin:
                       out[o] = nan ? std::numeric_limits<T>::quiet_NaN() : best;
                       break;
                   }
                 }
               });
  y.commit();
}

}  // namespace

void register_reduce_kernels(KernelRegistry& registry) {
  const std::pair<const char*, ReduceOp> reductions[] = {{"reduce_sum", ReduceOp::kSum},
                                                         {"reduce_mean", ReduceOp::kMean},
                                                         {"reduce_max", ReduceOp::kMax},
                                                         {"reduce_min", ReduceOp::kMin},
                                                         {"reduce_sum_square", ReduceOp::kSumSquare}};
  for (const auto& [op, kind] : reductions) {
    add_cpu_kernel(registry, op,
                   std::string("reference ") + op + " over any axes (keepdims), sums accumulated in double",
                   [kind = kind](const KernelLaunch& launch, const CpuContext& context) {
                     const DType dtype = launch.desc->inputs[0].dtype;
                     if (dtype == DType::kInt32 || dtype == DType::kInt64 || dtype == DType::kBool) {
                       return run_reference_reduce(launch);  // bool: max/min only (the schema's any/all)
                     }
                     dispatch_compute_type(dtype,
                                           [&](auto zero) { run_reduce<decltype(zero)>(kind, launch, context); });
                   },
                   kind == ReduceOp::kMean || kind == ReduceOp::kSumSquare ? DTypeSet::kFloat
                   : kind == ReduceOp::kMax || kind == ReduceOp::kMin      ? DTypeSet::kAll  // the schema: bool too
                                                                           : DTypeSet::kFloatAndInt);
  }
}

}  // namespace xpuruntime::cpu
