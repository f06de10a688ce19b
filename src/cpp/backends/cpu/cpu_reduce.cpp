// Reductions of the cpu backend: reduce_sum, reduce_mean, reduce_max, reduce_min over any set of axes (empty:
// all), keepdims or not. Each output element walks its reduced elements in row-major order, summing in double (few
// long rows: in fixed chunks combined in order, Note [Few long rows split]).
// NaN propagates through max and min (as torch.amax/amin do); an empty reduction gives 0 for sum and NaN for
// mean (0 / 0, like NumPy and PyTorch); max/min of an empty axis is rejected by the op schema.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {

namespace {

enum class ReduceOp : std::uint8_t { kSum, kMean, kMax, kMin, kSumSquare };

// The element a sum accumulates: x, or x * x for reduce_sum_square (squared in double, never rounded to T).
inline double summand(ReduceOp op, double x) { return op == ReduceOp::kSumSquare ? x * x : x; }
inline bool sums(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kMean || op == ReduceOp::kSumSquare; }

// Note [Reductions of trailing axes]
// Where every reduced axis (of size > 1) comes after every kept one, output o reduces the contiguous row
// x[o * count, (o + 1) * count): no coordinates to decode, and the row's sum in sixteen double accumulators that the
// compiler keeps in vector registers (a global average pool, squeeze-excitation's mean over H x W, a norm's row;
// wide_sums in cpu_common.h). The partial sums are added pairwise at the end; in double, a float row's sum differs
// from the sequential one far below float's last bit. With four accumulators and the op tested per element, the sum
// of 3 rows of 1M floats took 0.85 ms against ONNX Runtime's 0.54 (this machine, one thread, 2026-12-07): the loop
// ran at an add's latency per four elements; 0.60 ms now (docs/benchmarks.md).
bool trailing_rows(const std::vector<bool>& reduced, const std::vector<std::int64_t>& shape) {
  bool seen_reduced = false;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (reduced[d]) seen_reduced = true;
    if (!reduced[d] && seen_reduced) return false;
  }
  return true;
}

// Note [Few long rows split]
// A reduction to few rows ran a thread per row: x.max() of 10M floats took 20 ms on 2 cores, one thread comparing an
// element at a time. Fewer than kSplitRows rows of at least 2 kSplitChunk elements are cut into chunks of kSplitChunk
// (fixed, so the bits do not depend on the thread count): each chunk's partial is computed on its own (threads split
// the chunks), then a row's partials are combined in chunk order. Max and min keep eight lanes without a branch
// (NaN tracked apart), so the loop runs on vectors; a sum adds its chunks' double sums, an order that differs from
// one pass's far below float's last bit.
constexpr std::int64_t kSplitChunk = 65536;
constexpr std::int64_t kSplitRows = 64;

// A row's (or a chunk's) sum in double, or its max / min and whether it holds a NaN.
template <typename T>
struct Partial {
  double sum = 0.0;
  T best{};
  bool nan = false;
};

// The better of a candidate and the best so far: the larger (max) or smaller; the best so far when they are equal or
// either is NaN (NaN is tracked apart).
template <typename T>
inline T better(bool max, T candidate, T best) {
  return (max ? candidate > best : candidate < best) ? candidate : best;
}

// Max (kMax) or min of p[0, count) into r->best, and whether a NaN is among them into r->nan: eight lanes of
// compare-and-select that never branch (a NaN never wins a comparison; it is flagged apart): SSE2's maxps/minps for
// float, which are that select (the compiler does not vectorize it: float max is not associative under NaN). Within a
// lane the first of equal values wins, as std::max/min keep it; across lanes -0 and +0 may come either way.
template <bool kMax, typename T>
void extreme_of(const T* p, std::int64_t count, Partial<T>* r) {
  constexpr int kLanes = 8;
  const T init = kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  T best[kLanes];
  int nan[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    best[j] = init;
    nan[j] = 0;
  }
  std::int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {  // maxps(v, b) is v > b ? v : b: the select below, two vectors at a time
    __m128 b0 = _mm_set1_ps(init), b1 = b0, bad = _mm_setzero_ps();
    for (; i + kLanes <= count; i += kLanes) {
      const __m128 v0 = _mm_loadu_ps(p + i), v1 = _mm_loadu_ps(p + i + 4);
      bad = _mm_or_ps(bad, _mm_or_ps(_mm_cmpunord_ps(v0, v0), _mm_cmpunord_ps(v1, v1)));
      b0 = kMax ? _mm_max_ps(v0, b0) : _mm_min_ps(v0, b0);
      b1 = kMax ? _mm_max_ps(v1, b1) : _mm_min_ps(v1, b1);
    }
    _mm_storeu_ps(best, b0);
    _mm_storeu_ps(best + 4, b1);
    nan[0] = _mm_movemask_ps(bad) != 0;
  }
#endif
  for (; i + kLanes <= count; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const T v = p[i + j];
      nan[j] |= v != v;
      best[j] = better(kMax, v, best[j]);
    }
  }
  for (; i < count; ++i) {
    const T v = p[i];
    nan[0] |= v != v;
    best[0] = better(kMax, v, best[0]);
  }
  r->best = best[0];
  r->nan = nan[0] != 0;
  for (int j = 1; j < kLanes; ++j) {
    r->best = better(kMax, best[j], r->best);
    r->nan = r->nan || nan[j] != 0;
  }
}

template <typename T>
Partial<T> partial_of(ReduceOp op, const T* p, std::int64_t count, const IsaKernels& isa) {
  Partial<T> r;
  if (sums(op) && std::is_same_v<T, float>) {  // the chains in the CPU's widest double vectors (IsaKernels::sum_f32)
    r.sum = isa.sum_f32(reinterpret_cast<const float*>(p), count, op == ReduceOp::kSumSquare);
    return r;
  }
  if (sums(op)) {
    // The op chosen outside the loop: a test of it per element kept the compiler from vectorizing the loop.
    r.sum = op == ReduceOp::kSumSquare ? wide_sums<16>(p, count, [](double v) { return v * v; })
                                       : wide_sums<16>(p, count, [](double v) { return v; });
    return r;
  }
  if (op == ReduceOp::kMax) {
    extreme_of<true>(p, count, &r);
  } else {
    extreme_of<false>(p, count, &r);
  }
  return r;
}

// Folds a chunk's (or a run's) partial into the one of its row, after those before it.
template <typename T>
void combine(Partial<T>& into, const Partial<T>& part, bool max) {
  into.sum += part.sum;
  into.nan = into.nan || part.nan;
  into.best = better(max, part.best, into.best);
}

template <typename T>
T finish(ReduceOp op, const Partial<T>& r, std::int64_t count) {
  if (op == ReduceOp::kMean) return static_cast<T>(r.sum / static_cast<double>(count));
  if (sums(op)) return static_cast<T>(r.sum);
  return r.nan ? std::numeric_limits<T>::quiet_NaN() : r.best;
}

// Note [Reductions of short rows]
// partial_of sets up sixteen double chains (and max/min eight lanes) per row and folds them at the end: for rows of a
// few elements that is most of the work. ReduceL2 over rows of 3 of [100003, 3] took 5.5x ONNX Runtime's time at one
// thread (2026-12-07, cpu_awkward_bench.py), about 10 ns a row in partial_of. Rows shorter than the chains are
// summed in one chain from +0.0 here, which is what wide_sums does with them (every element goes into partial 0, the
// other partials stay +0.0 and adding them changes no bits: a sum that starts at +0.0 is never -0.0), and max/min of
// fewer than eight take extreme_of's scalar tail, its first lane: the same bits, without the per-row setup.
template <typename T>
T short_row(ReduceOp op, const T* p, std::int64_t count) {
  if (sums(op)) {
    double sum = 0.0;
    if (op == ReduceOp::kSumSquare) {
      for (std::int64_t i = 0; i < count; ++i) sum += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    } else {
      for (std::int64_t i = 0; i < count; ++i) sum += static_cast<double>(p[i]);
    }
    return finish(op, Partial<T>{sum, T{}, false}, count);
  }
  const bool max = op == ReduceOp::kMax;
  Partial<T> r;
  r.best = max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < count; ++i) {
    r.nan = r.nan || p[i] != p[i];
    r.best = better(max, p[i], r.best);
  }
  return finish(op, r, count);
}

template <typename T>
void reduce_rows(ReduceOp op, const T* in, T* out, std::int64_t rows, std::int64_t count, const CpuContext& context) {
  const IsaKernels& isa = isa_of(context);
  if (count > 0 && count < (sums(op) ? 16 : 8)) {  // Note [Reductions of short rows]
    parallel_for(rows, context.threads, std::max<std::int64_t>(1, 32768 / count), [&](std::int64_t begin,
                                                                                        std::int64_t end) {
      for (std::int64_t o = begin; o < end; ++o) out[o] = short_row(op, in + o * count, count);
    });
    return;
  }
  if (rows < kSplitRows && count >= 2 * kSplitChunk) {  // Note [Few long rows split]
    const std::int64_t chunks = (count + kSplitChunk - 1) / kSplitChunk;
    std::vector<Partial<T>> parts(static_cast<std::size_t>(rows * chunks));
    parallel_for(rows * chunks, context.threads, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const std::int64_t first = (t % chunks) * kSplitChunk;
        parts[static_cast<std::size_t>(t)] =
            partial_of(op, in + (t / chunks) * count + first, std::min(kSplitChunk, count - first), isa);
      }
    });
    for (std::int64_t o = 0; o < rows; ++o) {
      Partial<T> row = parts[static_cast<std::size_t>(o * chunks)];
      for (std::int64_t c = 1; c < chunks; ++c) {
        combine(row, parts[static_cast<std::size_t>(o * chunks + c)], op == ReduceOp::kMax);
      }
      out[o] = finish(op, row, count);
    }
    return;
  }
  parallel_for(rows, context.threads, std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(count, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t o = begin; o < end; ++o) {
                   out[o] = finish(op, partial_of(op, in + o * count, count, isa), count);
                 }
               });
}

// Note [Reductions that keep the innermost axis]
// Where the innermost axis (of size > 1) is kept (a sum over the batch or a middle axis; the mean over the sequence of
// [batch, seq, hidden]), each output walked its reduced elements with the kept block's stride between them, one
// double chain of additions: reduce_sum over the middle axis of [64, 997, 64] took 6.5x ONNX Runtime's time
// (2026-12-07). Now the trailing kept axes are one contiguous block of outputs, and each group of them (the other
// kept coordinates) adds its reduced rows into one accumulator per output, a row at a time in row-major order of the
// reduced coordinates: the order each output summed in before (the same bits), in unit-stride loops the compiler
// vectorises (max/min of float: maxps/minps, NaN tracked per lane). Groups, and blocks of at most kColumnBlock
// outputs, are split over the threads. A float row's adds are IsaKernels::accumulate_row_f32, the same loop compiled
// for each instruction set: AVX-512 adds eight doubles a vector where SSE2 adds two (ReduceSum over axis 0 of [1009,
// 1013] at one thread 0.54 -> 0.36 ms, 2026-12-07). Likewise partial_of's float sums are IsaKernels::sum_f32,
// wide_sums<16>'s chains in the widest double vectors (ReduceMean over axes 0 and 2 of [31, 257, 129] 0.46 -> 0.36 ms,
// over H and W of [2, 67, 131, 137] 0.53 -> 0.43).
constexpr std::int64_t kColumnBlock = 256;

// The axes of x (sizes > 1) in order: size, element stride, reduced or kept.
struct Axis {
  std::int64_t size, stride;
  bool reduced;
};

// Max (kMax) or min of `row` into best[0, n), NaN flagged per lane (Note [Reductions that keep the innermost axis]).
template <bool kMax, typename T>
void extreme_into(T* best, int* nan, const T* row, std::int64_t n) {
  std::int64_t j = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    for (; j + 4 <= n; j += 4) {
      const __m128 v = _mm_loadu_ps(row + j), b = _mm_loadu_ps(best + j);
      _mm_storeu_ps(best + j, kMax ? _mm_max_ps(v, b) : _mm_min_ps(v, b));
      const int bad = _mm_movemask_ps(_mm_cmpunord_ps(v, v));
      for (int l = 0; l < 4; ++l) nan[j + l] |= (bad >> l) & 1;
    }
  }
#endif
  for (; j < n; ++j) {
    nan[j] |= static_cast<int>(row[j] != row[j]);
    best[j] = better(kMax, row[j], best[j]);
  }
}

// Outputs [g * block + c0, + width) of a reduction that keeps the innermost axis: group g's base offset in x `base`,
// the reduced axes `reduced` walked in row-major order (an odometer over their strides).
template <typename T>
void reduce_column_block(ReduceOp op, const T* in, T* out, std::int64_t base, const std::vector<Axis>& reduced,
                         std::int64_t count, std::int64_t width, const IsaKernels& isa) {
  double acc[kColumnBlock];
  T best[kColumnBlock];
  int nan[kColumnBlock];
  const T init = op == ReduceOp::kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  std::fill(acc, acc + width, 0.0);
  std::fill(best, best + width, init);
  std::fill(nan, nan + width, 0);
  std::vector<std::int64_t> index(reduced.size(), 0);
  std::int64_t offset = 0;
  for (std::int64_t r = 0; r < count; ++r) {
    const T* row = in + base + offset;
    if (sums(op) && std::is_same_v<T, float>) {  // the adds in double vectors of the CPU's widest (IsaKernels)
      isa.accumulate_row_f32(acc, reinterpret_cast<const float*>(row), width, op == ReduceOp::kSumSquare);
    } else if (sums(op)) {
      for (std::int64_t j = 0; j < width; ++j) acc[j] += summand(op, static_cast<double>(row[j]));
    } else if (op == ReduceOp::kMax) {
      extreme_into<true>(best, nan, row, width);
    } else {
      extreme_into<false>(best, nan, row, width);
    }
    for (std::size_t d = reduced.size(); d-- > 0;) {  // the next reduced coordinate, row-major
      offset += reduced[d].stride;
      if (++index[d] < reduced[d].size) break;
      offset -= reduced[d].stride * reduced[d].size;
      index[d] = 0;
    }
  }
  for (std::int64_t j = 0; j < width; ++j) {
    Partial<T> partial;
    partial.sum = acc[j];
    partial.best = best[j];
    partial.nan = nan[j] != 0;
    out[j] = finish(op, partial, count);
  }
}

// A reduction whose innermost axis is kept (Note [Reductions that keep the innermost axis]); false for other axis
// sets. `axes`: x's axes of size > 1.
template <typename T>
bool reduce_columns(ReduceOp op, const T* in, T* out, const std::vector<Axis>& axes, std::int64_t outputs,
                    const CpuContext& context) {
  if (axes.empty() || axes.back().reduced) return false;
  std::size_t suffix = axes.size();
  std::int64_t block = 1;
  while (suffix > 0 && !axes[suffix - 1].reduced) block *= axes[--suffix].size;
  std::vector<Axis> kept, reduced;
  for (std::size_t d = 0; d < suffix; ++d) (axes[d].reduced ? reduced : kept).push_back(axes[d]);
  if (reduced.empty()) return false;
  std::int64_t count = 1;
  for (const Axis& a : reduced) count *= a.size;
  const std::int64_t groups = outputs / block, blocks = (block + kColumnBlock - 1) / kColumnBlock;
  const std::int64_t work = count * std::min(block, kColumnBlock);
  const IsaKernels& isa = isa_of(context);
  parallel_for(groups * blocks, context.threads, std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(work, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t item = begin; item < end; ++item) {
                   const std::int64_t g = item / blocks, c0 = item % blocks * kColumnBlock;
                   std::int64_t base = c0, rest = g;
                   for (std::size_t d = kept.size(); d-- > 0;) {
                     base += rest % kept[d].size * kept[d].stride;
                     rest /= kept[d].size;
                   }
                   reduce_column_block(op, in, out + g * block + c0, base, reduced, count,
                                       std::min(kColumnBlock, block - c0), isa);
                 }
               });
  return true;
}

// Which axes of input 0 the launch reduces (its `axes`; none listed: every one).
std::vector<bool> reduced_flags(const KernelLaunch& launch) {
  const int rank = launch.input(0).dim();
  const auto axes = launch.desc->attrs.get_ints("axes", {});
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (auto axis : axes) reduced[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)] = true;
  return reduced;
}

// Any (reduce_max) and all (reduce_min) of bools over trailing axes: memchr for the deciding byte (a bool is 0 or
// 1), rows split as Note [Few long rows split] says; other axis sets take the reference kernel.
bool run_bool_rows(ReduceOp op, const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  if (!trailing_rows(reduced_flags(launch), x.shape()) || !x.is_contiguous() || !launch.output(0).is_contiguous()) {
    return false;
  }
  const std::int64_t rows = launch.output(0).numel();
  const std::int64_t count = rows == 0 ? 0 : x.numel() / rows;
  const auto* in = static_cast<const unsigned char*>(x.data_ptr());
  auto* out = static_cast<unsigned char*>(launch.output(0).data_ptr());
  const int decisive = op == ReduceOp::kMax ? 1 : 0;  // any: a 1 decides; all: a 0
  const std::int64_t chunk = rows < kSplitRows ? kSplitChunk : std::max<std::int64_t>(count, 1);
  const std::int64_t chunks = std::max<std::int64_t>(1, (count + chunk - 1) / chunk);
  std::vector<unsigned char> found(static_cast<std::size_t>(rows * chunks), 0);
  parallel_for(rows * chunks, context.threads, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t first = (t % chunks) * chunk;
      const std::int64_t n = std::min(chunk, count - first);
      found[static_cast<std::size_t>(t)] =
          n > 0 && std::memchr(in + (t / chunks) * count + first, decisive, static_cast<std::size_t>(n)) != nullptr;
    }
  });
  for (std::int64_t o = 0; o < rows; ++o) {
    bool hit = false;
    for (std::int64_t c = 0; c < chunks; ++c) hit = hit || found[static_cast<std::size_t>(o * chunks + c)] != 0;
    out[o] = static_cast<unsigned char>(op == ReduceOp::kMax ? hit : !hit);
  }
  return true;
}

template <typename T>
void run_reduce(ReduceOp op, const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x_tensor = launch.input(0);
  const auto& shape = x_tensor.shape();
  const int rank = x_tensor.dim();
  const std::vector<bool> reduced = reduced_flags(launch);

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
  std::vector<Axis> axes;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] != 1) axes.push_back({shape[d], strides[d], reduced[d]});
  }
  if (reduce_columns(op, in, out, axes, outputs, context)) {  // Note [Reductions that keep the innermost axis]
    y.commit();
    return;
  }
  const std::int64_t inner = sizes.empty() ? 1 : sizes.back();
  const std::int64_t inner_step = sizes.empty() ? 0 : steps.back();
  const std::int64_t outer_count = inner > 0 ? count / inner : 0;
  const IsaKernels& isa = isa_of(context);
  parallel_for(outputs, context.threads, std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(count, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t o = begin; o < end; ++o) {
                   std::int64_t base = 0, rest = o;
                   for (std::size_t d = kept_sizes.size(); d-- > 0;) {
                     base += (rest % kept_sizes[d]) * kept_strides[d];
                     rest /= kept_sizes[d];
                   }
                   Partial<T> acc;
                   acc.best =
                       op == ReduceOp::kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
                   for (std::int64_t r = 0; r < outer_count; ++r) {
                     std::int64_t offset = base, rest_r = r;
                     for (std::size_t d = sizes.empty() ? 0 : sizes.size() - 1; d-- > 0;) {
                       offset += (rest_r % sizes[d]) * steps[d];
                       rest_r /= sizes[d];
                     }
                     const T* p = in + offset;
                     if (inner_step == 1) {  // a contiguous run: four sums or eight lanes (partial_of), then combined
                       combine(acc, partial_of(op, p, inner, isa), op == ReduceOp::kMax);
                     } else if (sums(op)) {
                       for (std::int64_t i = 0; i < inner; ++i) {
                         acc.sum += summand(op, static_cast<double>(p[i * inner_step]));
                       }
                     } else {
                       for (std::int64_t i = 0; i < inner; ++i) {
                         const T v = p[i * inner_step];
                         acc.nan = acc.nan || v != v;
                         acc.best = better(op == ReduceOp::kMax, v, acc.best);
                       }
                     }
                   }
                   out[o] = finish(op, acc, count);
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
                     if (dtype == DType::kBool && run_bool_rows(kind, launch, context)) return;  // any, all
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
