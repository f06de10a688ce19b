// Kernels along one axis of the cpu backend: cum_sum, arg_max / arg_min and top_k (cpu_common.h).
//
// Note [Scans along one axis]
// Each op views its input as [outer, length, inner] around the axis and gives the bits of the ONNX reference
// library's kernel (onnx/onnx_tensor_reduce.cpp), which walks one strided line at a time. Lines are independent, so
// threads split them; where inner > 1 a thread takes a block of adjacent lanes and walks the axis row by row, reading
// contiguous runs and keeping per lane a running sum, a best (value, index) or a buffer of candidates.
//  * cum_sum adds in the reference's order and type (double for floats, wrapping integers): the same bits.
//  * arg_max / arg_min and top_k also cut long lines into chunks when the lines are too few for the threads. The
//    reference's order is total without NaN (ties go to the lower index, the higher with select_last_index), so
//    the best of each chunk, or its k best, combine exactly and the chunks do not show in the result. arg_max
//    starts every chunk from the line's element 0 as the reference does, so a NaN there still wins and any other
//    NaN still loses. A NaN leaves top_k's order to the reference's partial_sort: a line holding one is selected
//    again by that partial_sort, which then gives the reference's order.
// How lines are cut follows the shape and the thread count, the results neither (Note [The cpu backend as the
// oracle]). Each op returns false, having written nothing, for what it does not take: outputs overlapping the input
// (cum_sum computed in place excepted), dtypes outside its schema's, and arg_max / arg_min axes past 2^31 - 1.
#include <bit>
#include <limits>
#include <numeric>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {

namespace {

// Elements a parallel chunk handles at least: below that, waking a worker costs more than the work.
constexpr std::int64_t kMinChunkElements = 16384;

// ---- shapes and work split ----

struct AxisView {
  std::int64_t outer = 1;
  std::int64_t length = 1;
  std::int64_t inner = 1;
};

AxisView view_around(const std::vector<std::int64_t>& shape, std::int64_t axis) {
  const auto a = static_cast<std::size_t>(axis);
  return {product(shape, 0, a), shape[a], product(shape, a + 1, shape.size())};
}

// The attribute "axis" in [0, rank), or -1 outside (the schema has rejected it already).
std::int64_t axis_attr(const Attributes& attrs, std::int64_t fallback, std::size_t rank) {
  const auto r = static_cast<std::int64_t>(rank);
  std::int64_t axis = attrs.get_int("axis", fallback);
  if (axis < 0) axis += r;
  return axis >= 0 && axis < r ? axis : -1;
}

// Whether the byte ranges of two tensors overlap (a memory plan may give an output a dead input's buffer).
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* pa = static_cast<const char*>(a.data_ptr());
  const auto* pb = static_cast<const char*>(b.data_ptr());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// A block of lanes walks the axis one row after another, so each row it reads is in another page once rows pass a
// few KiB, and a narrow block pays a TLB miss and a cold prefetcher for few elements: a [4099, 1001] float32 arg_max
// along axis 0 took 1.3 ms in 2 blocks on 2 threads, 1.7 ms in 4 and 2.3 ms in 8. So lanes are cut into no more
// blocks than there are threads, of at least kMinBlockLanes lanes, at most `most` (what the block's per-lane state
// may take) and `inner`.
constexpr std::int64_t kMinBlockLanes = 256;
constexpr std::int64_t kMostBlockLanes = 4096;  // per-lane state of 32 KiB at most (L1)

std::int64_t lanes_per_block(std::int64_t outer, std::int64_t inner, std::int64_t most, const CpuContext& context) {
  const std::int64_t blocks = ceil_div(context.threads, outer);
  const std::int64_t lanes = std::max(ceil_div(ceil_div(inner, blocks), 16) * 16, kMinBlockLanes);
  return std::max<std::int64_t>(1, std::min({lanes, most, inner}));
}

// Chunks each of `lines` lines (or blocks of lanes) of `length` rows is cut into: 1 when the lines alone give `want`
// items, else enough for that, each at least `min_rows` rows.
std::int64_t chunks_per_line(std::int64_t lines, std::int64_t length, std::int64_t min_rows, std::int64_t want) {
  if (lines >= want) return 1;
  return std::clamp<std::int64_t>(ceil_div(want, lines), 1, std::max<std::int64_t>(1, length / min_rows));
}

std::int64_t chunk_begin(std::int64_t length, std::int64_t chunk, std::int64_t chunks) {
  return length * chunk / chunks;
}

// ---- element types: how the reference loads, sums and stores each dtype (onnx_common.h: Compute) ----

struct Float32 {
  using Storage = float;
  using Compute = float;
  using Sum = double;
  static float load(float v) { return v; }
  static float store(double sum) { return static_cast<float>(sum); }
};
struct Float64 {
  using Storage = double;
  using Compute = double;
  using Sum = double;
  static double load(double v) { return v; }
  static double store(double sum) { return sum; }
};
struct Float16 {
  using Storage = std::uint16_t;
  using Compute = float;
  using Sum = double;
  static float load(std::uint16_t v) { return detail::half_to_float(v); }
  static std::uint16_t store(double sum) { return detail::float_to_half(static_cast<float>(sum)); }
};
struct BFloat16 {
  using Storage = std::uint16_t;
  using Compute = float;
  using Sum = double;
  static float load(std::uint16_t v) { return detail::bfloat16_to_float(v); }
  static std::uint16_t store(double sum) { return detail::float_to_bfloat16(static_cast<float>(sum)); }
};
// The reference sums integers in int64 and narrows: unsigned sums of the element's width give those bits without
// signed overflow.
struct Int32 {
  using Storage = std::int32_t;
  using Compute = std::int32_t;
  using Sum = std::uint32_t;
  static std::int32_t load(std::int32_t v) { return v; }
  static std::int32_t store(std::uint32_t sum) { return static_cast<std::int32_t>(sum); }
};
struct Int64 {
  using Storage = std::int64_t;
  using Compute = std::int64_t;
  using Sum = std::uint64_t;
  static std::int64_t load(std::int64_t v) { return v; }
  static std::int64_t store(std::uint64_t sum) { return static_cast<std::int64_t>(sum); }
};

// f(Float32{}) etc. for the float dtypes (arg_max, arg_min, top_k); false for any other.
template <typename F>
bool dispatch_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(Float32{});
    case DType::kFloat64: return f(Float64{});
    case DType::kFloat16: return f(Float16{});
    case DType::kBFloat16: return f(BFloat16{});
    default: return false;
  }
}

// The float dtypes, int32 and int64 (cum_sum).
template <typename F>
bool dispatch_summable(DType dtype, F&& f) {
  if (dtype == DType::kInt32) return f(Int32{});
  if (dtype == DType::kInt64) return f(Int64{});
  return dispatch_float(dtype, f);
}

// ---- cum_sum ----

// Running sums of one contiguous line, in the reference's order and type.
template <typename E, bool kExclusive>
void cum_sum_line(const typename E::Storage* in, typename E::Storage* out, std::int64_t length, bool reverse) {
  typename E::Sum sum = 0;
  const std::int64_t step = reverse ? -1 : 1;
  for (std::int64_t s = 0, j = reverse ? length - 1 : 0; s < length; ++s, j += step) {
    const auto v = static_cast<typename E::Sum>(E::load(in[j]));
    if (!kExclusive) sum += v;
    out[j] = E::store(sum);
    if (kExclusive) sum += v;
  }
}

// Running sums of `lanes` adjacent lanes: `in` and `out` at lane 0 of row 0, rows `inner` apart. Each lane adds in
// the reference's order; the lanes of a row are one contiguous run, which the compiler vectorises.
template <typename E, bool kExclusive>
void cum_sum_block(const typename E::Storage* in, typename E::Storage* out, std::int64_t length, std::int64_t inner,
                   std::int64_t lanes, bool reverse, typename E::Sum* sums) {
  using Sum = typename E::Sum;
  std::fill(sums, sums + lanes, Sum{0});
  auto row = [&](std::int64_t s) { return (reverse ? length - 1 - s : s) * inner; };
  std::int64_t s = 0;
  // Two rows per pass: the running sums are loaded and stored once for both.
  for (; s + 2 <= length; s += 2) {
    const typename E::Storage *x0 = in + row(s), *x1 = in + row(s + 1);
    typename E::Storage *y0 = out + row(s), *y1 = out + row(s + 1);
    for (std::int64_t p = 0; p < lanes; ++p) {
      const auto v0 = static_cast<Sum>(E::load(x0[p])), v1 = static_cast<Sum>(E::load(x1[p]));
      Sum sum = sums[p];
      if (!kExclusive) sum += v0;
      y0[p] = E::store(sum);
      if (kExclusive) sum += v0;
      if (!kExclusive) sum += v1;
      y1[p] = E::store(sum);
      if (kExclusive) sum += v1;
      sums[p] = sum;
    }
  }
  for (; s < length; ++s) {
    const typename E::Storage* x = in + row(s);
    typename E::Storage* y = out + row(s);
    for (std::int64_t p = 0; p < lanes; ++p) {
      const auto v = static_cast<Sum>(E::load(x[p]));
      if (!kExclusive) sums[p] += v;
      y[p] = E::store(sums[p]);
      if (kExclusive) sums[p] += v;
    }
  }
}

template <typename E, bool kExclusive>
void run_cum_sum(const typename E::Storage* in, typename E::Storage* out, const AxisView& view, bool reverse,
                 const CpuContext& context) {
  const std::int64_t length = view.length;
  if (view.inner == 1) {
    parallel_for(view.outer, context.threads, std::max<std::int64_t>(1, kMinChunkElements / length),
                 [&](std::int64_t begin, std::int64_t end) {
                   for (std::int64_t o = begin; o < end; ++o) {
                     cum_sum_line<E, kExclusive>(in + o * length, out + o * length, length, reverse);
                   }
                 });
    return;
  }
  const std::int64_t lanes = lanes_per_block(view.outer, view.inner, kMostBlockLanes, context);
  const std::int64_t blocks = ceil_div(view.inner, lanes);
  parallel_for(view.outer * blocks, context.threads, std::max<std::int64_t>(1, kMinChunkElements / (length * lanes)),
               [&](std::int64_t begin, std::int64_t end) {
                 ScratchVector<typename E::Sum> sums(static_cast<std::size_t>(lanes));
                 for (std::int64_t item = begin; item < end; ++item) {
                   const std::int64_t o = item / blocks, p0 = item % blocks * lanes;
                   const std::int64_t base = o * length * view.inner + p0;
                   cum_sum_block<E, kExclusive>(in + base, out + base, length, view.inner,
                                                std::min(lanes, view.inner - p0), reverse, sums.data());
                 }
               });
}

// ---- arg_max, arg_min ----

// The reference's step: `v` replaces the best so far when greater (arg_max) or less (arg_min), or equal with
// select_last_index, in one comparison (`>=` is `>` or `==`, both false with a NaN). So a NaN replaces nothing and,
// as the first element, is replaced by nothing.
template <bool kMax, bool kLast, typename C>
inline bool replaces(C v, C best) {
  if constexpr (kMax) return kLast ? v >= best : v > best;
  return kLast ? v <= best : v < best;
}

// `take ? a : b` in bit operations, for a and b of 4 or 8 bytes. Written as a select, a new best that may be the old
// one is a conditional store to the compiler, and the loop does not vectorise.
template <typename T>
inline T select(bool take, T a, T b) {
  using Bits = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>;
  const Bits mask = Bits{0} - static_cast<Bits>(take);
  const Bits a_bits = std::bit_cast<Bits>(a), b_bits = std::bit_cast<Bits>(b);
  return std::bit_cast<T>(static_cast<Bits>(b_bits ^ ((b_bits ^ a_bits) & mask)));
}

template <typename C>
struct Best {
  C value;
  std::int64_t index;
};

// Folds the best of another part of the line into `into`. Both parts started from the line's element 0: when that
// is NaN both are still it (index 0), else neither holds a NaN and the order is total.
template <bool kMax, bool kLast, typename C>
void combine(Best<C>& into, const Best<C>& part) {
  const bool wins = kMax ? part.value > into.value : part.value < into.value;
  const bool tie = part.value == into.value && (kLast ? part.index > into.index : part.index < into.index);
  if (wins || tie) into = part;
}

// Index type of the interleaved lanes: as wide as the value, so compares and selects vectorise together.
template <typename C>
using LaneIndex = std::conditional_t<sizeof(C) == 8, std::int64_t, std::int32_t>;

// The best of line[0] and line[begin, end) (begin >= 1) by the reference's steps: 16 interleaved lanes, each
// started from line[0] and combined at the end, so a long line is not one chain of dependent steps.
template <typename E, bool kMax, bool kLast>
Best<typename E::Compute> best_of_range(const typename E::Storage* line, std::int64_t begin, std::int64_t end) {
  using C = typename E::Compute;
  using I = LaneIndex<C>;
  constexpr int kLanes = 16;
  C value[kLanes];
  I index[kLanes];
  std::fill(value, value + kLanes, E::load(line[0]));
  std::fill(index, index + kLanes, I{0});
  std::int64_t j = begin;
  for (; j + kLanes <= end; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const C v = E::load(line[j + l]);
      const bool better = replaces<kMax, kLast>(v, value[l]);
      value[l] = better ? v : value[l];
      index[l] = better ? static_cast<I>(j + l) : index[l];
    }
  }
  for (; j < end; ++j) {
    const C v = E::load(line[j]);
    if (replaces<kMax, kLast>(v, value[0])) value[0] = v, index[0] = static_cast<I>(j);
  }
  Best<C> best{value[0], index[0]};
  for (int l = 1; l < kLanes; ++l) combine<kMax, kLast>(best, Best<C>{value[l], index[l]});
  return best;
}

// The reference's walk for `lanes` adjacent lanes (`in` at lane 0 of row 0, rows `inner` apart), into out[lanes].
template <typename E, bool kMax, bool kLast>
void best_of_block(const typename E::Storage* in, std::int64_t length, std::int64_t inner, std::int64_t lanes,
                   typename E::Compute* value, LaneIndex<typename E::Compute>* index, std::int64_t* out) {
  using I = LaneIndex<typename E::Compute>;
  for (std::int64_t p = 0; p < lanes; ++p) value[p] = E::load(in[p]), index[p] = 0;
  for (std::int64_t j = 1; j < length; ++j) {
    const typename E::Storage* row = in + j * inner;
    for (std::int64_t p = 0; p < lanes; ++p) {
      const auto v = E::load(row[p]);
      const bool better = replaces<kMax, kLast>(v, value[p]);
      value[p] = select(better, v, value[p]);
      index[p] = select(better, static_cast<I>(j), index[p]);
    }
  }
  for (std::int64_t p = 0; p < lanes; ++p) out[p] = index[p];
}

// Lines of inner == 1: each whole, or cut into chunks whose bests are combined in order.
template <typename E, bool kMax, bool kLast>
void arg_of_lines(const typename E::Storage* in, std::int64_t* out, const AxisView& view, const CpuContext& context) {
  using C = typename E::Compute;
  const std::int64_t length = view.length;
  // Chunks cost one combine each: a few per thread balance the load.
  const std::int64_t want = context.threads > 1 ? std::int64_t{context.threads} * kChunksPerThread : 1;
  const std::int64_t chunks = chunks_per_line(view.outer, length, kMinChunkElements, want);
  if (chunks == 1) {
    parallel_for(view.outer, context.threads, std::max<std::int64_t>(1, kMinChunkElements / length),
                 [&](std::int64_t begin, std::int64_t end) {
                   for (std::int64_t o = begin; o < end; ++o) {
                     out[o] = best_of_range<E, kMax, kLast>(in + o * length, 1, length).index;
                   }
                 });
    return;
  }
  ScratchVector<Best<C>> parts(static_cast<std::size_t>(view.outer * chunks));
  parallel_for(view.outer * chunks, context.threads, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t o = item / chunks, c = item % chunks;
      parts[static_cast<std::size_t>(item)] = best_of_range<E, kMax, kLast>(
          in + o * length, std::max<std::int64_t>(1, chunk_begin(length, c, chunks)),
          chunk_begin(length, c + 1, chunks));
    }
  });
  for (std::int64_t o = 0; o < view.outer; ++o) {
    Best<C> best = parts[static_cast<std::size_t>(o * chunks)];
    for (std::int64_t c = 1; c < chunks; ++c) {
      combine<kMax, kLast>(best, parts[static_cast<std::size_t>(o * chunks + c)]);
    }
    out[o] = best.index;
  }
}

template <typename E, bool kMax, bool kLast>
void run_arg(const typename E::Storage* in, std::int64_t* out, const AxisView& view, const CpuContext& context) {
  if (view.inner == 1) {
    arg_of_lines<E, kMax, kLast>(in, out, view, context);
    return;
  }
  const std::int64_t lanes = lanes_per_block(view.outer, view.inner, kMostBlockLanes, context);
  const std::int64_t blocks = ceil_div(view.inner, lanes);
  const std::int64_t grain = std::max<std::int64_t>(1, kMinChunkElements / (view.length * lanes));
  parallel_for(view.outer * blocks, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<typename E::Compute> value(static_cast<std::size_t>(lanes));
    ScratchVector<LaneIndex<typename E::Compute>> index(static_cast<std::size_t>(lanes));
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t o = item / blocks, p0 = item % blocks * lanes;
      best_of_block<E, kMax, kLast>(in + o * view.length * view.inner + p0, view.length, view.inner,
                                    std::min(lanes, view.inner - p0), value.data(), index.data(),
                                    out + o * view.inner + p0);
    }
  });
}

// ---- top_k ----

template <typename C>
struct Candidate {
  C value;
  std::int64_t index;
};

// The reference's order: the better value first (greater with largest), equal values by the lower index. A strict
// total order over candidates without NaN.
template <bool kLargest, typename C>
struct Ahead {
  bool operator()(const Candidate<C>& a, const Candidate<C>& b) const {
    if (a.value != b.value) return kLargest ? a.value > b.value : a.value < b.value;
    return a.index < b.index;
  }
};

// Up to this k a selection keeps its k best sorted and inserts each element that beats the worst of them, so its
// threshold follows every insertion; a [4096, 1031] top_k with k = 7 spent most of its time letting through elements
// a stale threshold did not reject. Larger k buffer their candidates.
constexpr std::int64_t kMostSortedK = 16;

// The k best of one lane's elements, offered in increasing index order. Small k: the k best so far, sorted. Else a
// buffer of up to `cap` candidates (cap > k, or at least every element offered) cut back to its k best when full.
// Once k are held, the worst of them (the threshold) rejects every later element that does not beat its value (an
// equal later one loses on its index). A NaN is only noted: its line is selected again as the reference does (Note
// [Scans along one axis]).
template <bool kLargest, typename C>
class Selection {
 public:
  Selection(Candidate<C>* buffer, std::int64_t cap, std::int64_t k) : buffer_(buffer), cap_(cap), k_(k) {}

  // Whether v can be dropped without a look: it neither beats the threshold nor is NaN.
  bool rejects(C v) const { return thresholded_ && (kLargest ? v <= threshold_ : v >= threshold_); }
  void offer(C v, std::int64_t index) {
    if (v != v) {
      saw_nan_ = true;
      return;
    }
    if (!rejects(v)) enter(v, index);
  }
  // The k best (fewer when fewer were offered), best first, at data().
  std::int64_t finish() {
    if (k_ <= kMostSortedK) return size_;
    if (size_ > k_) {
      std::nth_element(buffer_, buffer_ + k_ - 1, buffer_ + size_, Ahead<kLargest, C>{});
      size_ = k_;
    }
    std::sort(buffer_, buffer_ + size_, Ahead<kLargest, C>{});
    return size_;
  }
  const Candidate<C>* data() const { return buffer_; }
  std::int64_t k() const { return k_; }
  // Rejects what is worse than `bound` until k are held; `bound` must be no better than the k-th best to come.
  void seed(C bound) {
    constexpr C kWorst = kLargest ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
    if (bound == kWorst) return;  // no element is worse
    set_threshold(std::nextafter(bound, kWorst));  // an element equal to bound beats that threshold
  }
  bool thresholded() const { return thresholded_; }
  C threshold() const { return threshold_; }
  bool saw_nan() const { return saw_nan_; }

 private:
  void enter(C v, std::int64_t index) {
    if (k_ <= kMostSortedK) {
      insert(v, index);
      return;
    }
    if (size_ == cap_) cut();
    buffer_[size_++] = {v, index};
  }
  // Later than every candidate, v goes after those not worse than it; the worst falls off when k are held.
  void insert(C v, std::int64_t index) {
    std::int64_t at = size_ < k_ ? size_++ : k_ - 1;
    for (; at > 0 && (kLargest ? buffer_[at - 1].value < v : buffer_[at - 1].value > v); --at) {
      buffer_[at] = buffer_[at - 1];
    }
    buffer_[at] = {v, index};
    if (size_ == k_) set_threshold(buffer_[k_ - 1].value);
  }
  void cut() {
    std::nth_element(buffer_, buffer_ + k_ - 1, buffer_ + size_, Ahead<kLargest, C>{});
    size_ = k_;
    set_threshold(buffer_[k_ - 1].value);
  }
  void set_threshold(C value) {
    threshold_ = value;
    thresholded_ = true;
  }

  Candidate<C>* buffer_;
  std::int64_t cap_, k_, size_ = 0;
  C threshold_{};
  bool thresholded_ = false, saw_nan_ = false;
};

// Elements tested together against a threshold: one vectorised test finds those of a block that beat it or are NaN
// (!(v <= t) is both at once), and only they are offered.
constexpr int kTestBlock = 16;

// Bit l set where x[l] beats `threshold` or is NaN, l < kTestBlock.
template <typename E, bool kLargest>
unsigned entering(const typename E::Storage* x, typename E::Compute threshold) {
#if defined(__SSE2__)
  // Written out: the compiler leaves the loop below scalar, a branch per element, once it is inlined.
  if constexpr (std::is_same_v<typename E::Storage, float>) {
    const __m128 t = _mm_set1_ps(threshold);
    unsigned mask = 0;
    for (int l = 0; l < kTestBlock; l += 4) {
      const __m128 v = _mm_loadu_ps(x + l);
      mask |= static_cast<unsigned>(_mm_movemask_ps(kLargest ? _mm_cmpnle_ps(v, t) : _mm_cmpnge_ps(v, t))) << l;
    }
    return mask;
  } else if constexpr (std::is_same_v<typename E::Storage, double>) {
    const __m128d t = _mm_set1_pd(threshold);
    unsigned mask = 0;
    for (int l = 0; l < kTestBlock; l += 2) {
      const __m128d v = _mm_loadu_pd(x + l);
      mask |= static_cast<unsigned>(_mm_movemask_pd(kLargest ? _mm_cmpnle_pd(v, t) : _mm_cmpnge_pd(v, t))) << l;
    }
    return mask;
  }
#endif
  unsigned mask = 0;
  for (int l = 0; l < kTestBlock; ++l) {
    const auto v = E::load(x[l]);
    mask |= static_cast<unsigned>(kLargest ? !(v <= threshold) : !(v >= threshold)) << l;
  }
  return mask;
}

// Blocks of a line's start that seed its selection (seed_bound).
constexpr std::int64_t kSeedBlocks = 64;

// The best of x[0, kTestBlock) that is not NaN (the worst value when all are).
template <typename E, bool kLargest>
typename E::Compute block_best(const typename E::Storage* x) {
  using C = typename E::Compute;
  C best = kLargest ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
#if defined(__SSE2__)
  if constexpr (std::is_same_v<typename E::Storage, float>) {  // maxps(v, b) is v > b ? v : b: never a NaN v
    __m128 b = _mm_set1_ps(best);
    for (int l = 0; l < kTestBlock; l += 4) {
      b = kLargest ? _mm_max_ps(_mm_loadu_ps(x + l), b) : _mm_min_ps(_mm_loadu_ps(x + l), b);
    }
    float lanes[4];
    _mm_storeu_ps(lanes, b);
    for (const float v : lanes) best = (kLargest ? v > best : v < best) ? v : best;
    return best;
  }
#endif
  for (int l = 0; l < kTestBlock; ++l) {
    const C v = E::load(x[l]);
    best = (kLargest ? v > best : v < best) ? v : best;
  }
  return best;
}

// A bound for the k best of line[0, n): its first blocks (up to kSeedBlocks, at least 4 per group) in k groups, and
// the worst of the groups' bests, which k elements reach. Without it a selection of a short line lets through about
// k ln(n / k) elements, each beating the threshold that rises from its first k: a [4096, 1031] top_k with k = 7 took
// 4.4 ms on one thread, 2.6 ms with it. Returns false when the line is too short for 4 blocks a group.
template <typename E, bool kLargest>
bool seed_bound(const typename E::Storage* line, std::int64_t n, std::int64_t k, typename E::Compute& bound) {
  using C = typename E::Compute;
  const std::int64_t blocks = std::min<std::int64_t>(n / kTestBlock, kSeedBlocks);
  if (blocks < 4 * k) return false;
  bound = kLargest ? std::numeric_limits<C>::infinity() : -std::numeric_limits<C>::infinity();
  for (std::int64_t g = 0; g < k; ++g) {
    C best = kLargest ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
    for (std::int64_t b = blocks * g / k; b < blocks * (g + 1) / k; ++b) {
      const C v = block_best<E, kLargest>(line + b * kTestBlock);
      best = (kLargest ? v > best : v < best) ? v : best;
    }
    bound = (kLargest ? best < bound : best > bound) ? best : bound;
  }
  return true;
}

// Offers line[r0, r1) of a contiguous line, a block at a time once a threshold stands.
template <typename E, bool kLargest>
void offer_line(Selection<kLargest, typename E::Compute>& selection, const typename E::Storage* line,
                std::int64_t r0, std::int64_t r1) {
  std::int64_t j = r0;
  if (typename E::Compute bound; seed_bound<E, kLargest>(line + r0, r1 - r0, selection.k(), bound)) {
    selection.seed(bound);
  }
  for (; j < r1 && !selection.thresholded(); ++j) selection.offer(E::load(line[j]), j);
  for (; j + kTestBlock <= r1; j += kTestBlock) {
    for (unsigned mask = entering<E, kLargest>(line + j, selection.threshold()); mask != 0; mask &= mask - 1) {
      const int l = std::countr_zero(mask);
      selection.offer(E::load(line[j + l]), j + l);
    }
  }
  for (; j < r1; ++j) selection.offer(E::load(line[j]), j);
}

// Offers rows [r0, r1) of `lanes` adjacent lanes (`in` at lane 0 of row 0, rows `inner` apart).
template <typename E, bool kLargest>
void offer_rows(Selection<kLargest, typename E::Compute>* selections, const typename E::Storage* in,
                std::int64_t inner, std::int64_t lanes, std::int64_t r0, std::int64_t r1) {
  for (std::int64_t j = r0; j < r1; ++j) {
    const typename E::Storage* row = in + j * inner;
    for (std::int64_t p = 0; p < lanes; ++p) {
      const auto v = E::load(row[p]);
      if (!selections[p].rejects(v)) selections[p].offer(v, j);
    }
  }
}

// One top_k: the tensors, the view, and how the lines are cut: blocks of `lanes` lanes, each cut into `chunks`
// chunks of rows; an item is one chunk of one block, (o * blocks + b) * chunks + c.
template <typename E>
struct TopK {
  const typename E::Storage* in;
  typename E::Storage* values;
  std::int64_t* indices;
  AxisView view;
  std::int64_t k, lanes, blocks, chunks, cap;
};

// Writes line (o, p) from its k best, best first: each value as the input holds it.
template <typename E>
void write_line(const TopK<E>& job, std::int64_t o, std::int64_t p, const Candidate<typename E::Compute>* best) {
  const AxisView& v = job.view;
  for (std::int64_t j = 0; j < job.k; ++j) {
    const std::int64_t at = (o * job.k + j) * v.inner + p;
    job.values[at] = job.in[(o * v.length + best[j].index) * v.inner + p];
    job.indices[at] = best[j].index;
  }
}

// Line (o, p) as the reference selects it: std::partial_sort of the indices with its comparison. A NaN compares
// equal to everything there, which leaves the order to the algorithm; the same algorithm on the same comparisons
// gives the same order.
template <typename E, bool kLargest>
void select_as_reference(const TopK<E>& job, std::int64_t o, std::int64_t p) {
  const AxisView& v = job.view;
  ScratchVector<typename E::Compute> line(static_cast<std::size_t>(v.length));
  for (std::int64_t j = 0; j < v.length; ++j) {
    line[static_cast<std::size_t>(j)] = E::load(job.in[(o * v.length + j) * v.inner + p]);
  }
  ScratchVector<std::int64_t> order(static_cast<std::size_t>(v.length));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + job.k, order.end(), [&](std::int64_t a, std::int64_t b) {
    const auto va = line[static_cast<std::size_t>(a)], vb = line[static_cast<std::size_t>(b)];
    if (va != vb) return kLargest ? va > vb : va < vb;
    return a < b;
  });
  ScratchVector<Candidate<typename E::Compute>> best(static_cast<std::size_t>(job.k));
  for (std::int64_t j = 0; j < job.k; ++j) best[static_cast<std::size_t>(j)].index = order[static_cast<std::size_t>(j)];
  write_line(job, o, p, best.data());
}

// What the items of lines cut into chunks leave for the merge: per item and lane, up to k candidates best first and
// their count, -1 where the chunk held a NaN.
template <typename C>
struct ChunkResults {
  UninitScratch<Candidate<C>> candidates;  // [item][lane][k]
  ScratchVector<std::int64_t> counts;      // [item][lane]
};

// Selects item `item` of `job` with `scratch` (lanes * cap candidates): its lanes' k best are written out when the
// lines are whole (results null), else left in `results`.
template <typename E, bool kLargest>
void select_item(const TopK<E>& job, std::int64_t item, Candidate<typename E::Compute>* scratch,
                 std::vector<Selection<kLargest, typename E::Compute>>& selections,
                 ChunkResults<typename E::Compute>* results) {
  const AxisView& v = job.view;
  const std::int64_t c = item % job.chunks, block = item / job.chunks;
  const std::int64_t o = block / job.blocks, p0 = block % job.blocks * job.lanes;
  const std::int64_t lanes = std::min(job.lanes, v.inner - p0);
  const std::int64_t r0 = chunk_begin(v.length, c, job.chunks), r1 = chunk_begin(v.length, c + 1, job.chunks);
  selections.clear();
  for (std::int64_t p = 0; p < lanes; ++p) selections.emplace_back(scratch + p * job.cap, job.cap, job.k);
  const typename E::Storage* base = job.in + o * v.length * v.inner + p0;
  if (v.inner == 1) {
    offer_line<E, kLargest>(selections[0], base, r0, r1);
  } else {
    offer_rows<E, kLargest>(selections.data(), base, v.inner, lanes, r0, r1);
  }
  for (std::int64_t p = 0; p < lanes; ++p) {
    auto& selection = selections[static_cast<std::size_t>(p)];
    if (results == nullptr) {
      if (selection.saw_nan()) {
        select_as_reference<E, kLargest>(job, o, p0 + p);
      } else {
        selection.finish();
        write_line(job, o, p0 + p, selection.data());
      }
      continue;
    }
    const std::int64_t slot = item * job.lanes + p;
    const std::int64_t count = selection.saw_nan() ? -1 : selection.finish();
    results->counts[static_cast<std::size_t>(slot)] = count;
    if (count > 0) std::copy(selection.data(), selection.data() + count, results->candidates.data() + slot * job.k);
  }
}

// Line (o, p) from the k best of each of its chunks: the k best of their union, which are the line's.
template <typename E, bool kLargest>
void merge_line(const TopK<E>& job, const ChunkResults<typename E::Compute>& results, std::int64_t o, std::int64_t p,
                ScratchVector<Candidate<typename E::Compute>>& pool) {
  const std::int64_t block = o * job.blocks + p / job.lanes, lane = p % job.lanes;
  pool.clear();
  for (std::int64_t c = 0; c < job.chunks; ++c) {
    const std::int64_t slot = (block * job.chunks + c) * job.lanes + lane;
    const std::int64_t count = results.counts[static_cast<std::size_t>(slot)];
    if (count < 0) {
      select_as_reference<E, kLargest>(job, o, p);
      return;
    }
    const auto* first = results.candidates.data() + slot * job.k;
    pool.insert(pool.end(), first, first + count);
  }
  std::nth_element(pool.begin(), pool.begin() + job.k - 1, pool.end(), Ahead<kLargest, typename E::Compute>{});
  std::sort(pool.begin(), pool.begin() + job.k, Ahead<kLargest, typename E::Compute>{});
  write_line(job, o, p, pool.data());
}

// Candidates one item keeps at most over its lanes (16 bytes each): a block of lanes is narrowed to stay within.
constexpr std::int64_t kItemCandidates = 65536;

template <typename E, bool kLargest>
void run_top_k(TopK<E> job, const CpuContext& context) {
  using C = typename E::Compute;
  const AxisView& v = job.view;
  job.cap = job.k <= kMostSortedK ? job.k : std::max(2 * job.k, job.k + 64);
  job.lanes = v.inner == 1 ? 1 : lanes_per_block(v.outer, v.inner, kItemCandidates / job.cap, context);
  job.blocks = ceil_div(v.inner, job.lanes);
  // A chunk pays for its selection's warm-up (many elements enter before its threshold is tight) and of its share of
  // the merge: one chunk per thread, each of at least 4k rows.
  const std::int64_t min_rows = std::max(ceil_div(kMinChunkElements, job.lanes), 4 * job.k);
  job.chunks = chunks_per_line(v.outer * job.blocks, v.length, min_rows, context.threads);
  const std::int64_t chunk_rows = ceil_div(v.length, job.chunks);
  job.cap = std::min(job.cap, chunk_rows);  // a buffer as long as the chunk is never cut
  const std::int64_t items = v.outer * job.blocks * job.chunks;
  ChunkResults<C> results;
  if (job.chunks > 1) {
    results.candidates.resize(static_cast<std::size_t>(items * job.lanes * job.k));
    results.counts.resize(static_cast<std::size_t>(items * job.lanes));
  }
  ChunkResults<C>* kept = job.chunks > 1 ? &results : nullptr;
  const std::int64_t grain = std::max<std::int64_t>(1, kMinChunkElements / (chunk_rows * job.lanes));
  parallel_for(items, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
    UninitScratch<Candidate<C>> scratch(static_cast<std::size_t>(job.lanes * job.cap));
    std::vector<Selection<kLargest, C>> selections;
    selections.reserve(static_cast<std::size_t>(job.lanes));
    for (std::int64_t item = begin; item < end; ++item) {
      select_item<E, kLargest>(job, item, scratch.data(), selections, kept);
    }
  });
  if (job.chunks == 1) return;
  const std::int64_t merge_grain = std::max<std::int64_t>(1, kMinChunkElements / (job.chunks * job.k));
  parallel_for(v.outer * v.inner, context.threads, merge_grain, [&](std::int64_t begin, std::int64_t end) {
    ScratchVector<Candidate<C>> pool;
    for (std::int64_t line = begin; line < end; ++line) {
      merge_line<E, kLargest>(job, results, line / v.inner, line % v.inner, pool);
    }
  });
}

}  // namespace

bool cum_sum_fast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const Attributes& attrs = launch.desc->attrs;
  const std::int64_t axis = axis_attr(attrs, 0, x.shape().size());
  // In place is fine: each element is read before it is written, by the thread that writes it.
  if (axis < 0 || y.dtype() != x.dtype() || y.shape() != x.shape() || !x.is_contiguous() || !y.is_contiguous() ||
      (overlaps(x, y) && x.data_ptr() != y.data_ptr())) {
    return false;
  }
  const AxisView view = view_around(x.shape(), axis);
  const bool exclusive = attrs.get_int("exclusive", 0) != 0;
  const bool reverse = attrs.get_int("reverse", 0) != 0;
  return dispatch_summable(x.dtype(), [&](auto elem) {
    using E = decltype(elem);
    const auto* in = static_cast<const typename E::Storage*>(x.data_ptr());
    auto* out = static_cast<typename E::Storage*>(y.data_ptr());
    if (x.numel() == 0) return true;
    if (exclusive) {
      run_cum_sum<E, true>(in, out, view, reverse, context);
    } else {
      run_cum_sum<E, false>(in, out, view, reverse, context);
    }
    return true;
  });
}

bool arg_extreme_fast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const Attributes& attrs = launch.desc->attrs;
  const std::int64_t axis = axis_attr(attrs, 0, x.shape().size());
  if (axis < 0 || y.dtype() != DType::kInt64 || !x.is_contiguous() || !y.is_contiguous() || overlaps(x, y)) {
    return false;
  }
  const AxisView view = view_around(x.shape(), axis);
  // The reference rejects an empty axis; the lanes' indices are int32 for float32.
  if (view.length == 0 || view.length > std::numeric_limits<std::int32_t>::max() ||
      y.numel() != view.outer * view.inner) {
    return false;
  }
  const bool is_max = launch.desc->op == "arg_max";
  const bool last = attrs.get_int("select_last_index", 0) != 0;
  return dispatch_float(x.dtype(), [&](auto elem) {
    using E = decltype(elem);
    const auto* in = static_cast<const typename E::Storage*>(x.data_ptr());
    auto* out = static_cast<std::int64_t*>(y.data_ptr());
    if (y.numel() == 0) return true;
    if (is_max) {
      last ? run_arg<E, true, true>(in, out, view, context) : run_arg<E, true, false>(in, out, view, context);
    } else {
      last ? run_arg<E, false, true>(in, out, view, context) : run_arg<E, false, false>(in, out, view, context);
    }
    return true;
  });
}

bool top_k_fast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& values = launch.output(0);
  Tensor& indices = launch.output(1);
  const Attributes& attrs = launch.desc->attrs;
  const std::int64_t axis = axis_attr(attrs, -1, x.shape().size());
  if (axis < 0) return false;
  const AxisView view = view_around(x.shape(), axis);
  const std::int64_t k = attrs.get_int("k", -1);
  std::vector<std::int64_t> shape = x.shape();
  shape[static_cast<std::size_t>(axis)] = k;
  if (k < 0 || k > view.length || values.dtype() != x.dtype() || indices.dtype() != DType::kInt64 ||
      values.shape() != shape || indices.shape() != shape || !x.is_contiguous() || !values.is_contiguous() ||
      !indices.is_contiguous() || overlaps(x, values) || overlaps(x, indices) || overlaps(values, indices)) {
    return false;
  }
  const bool largest = attrs.get_int("largest", 1) != 0;
  return dispatch_float(x.dtype(), [&](auto elem) {
    using E = decltype(elem);
    TopK<E> job{static_cast<const typename E::Storage*>(x.data_ptr()),
                static_cast<typename E::Storage*>(values.data_ptr()),
                static_cast<std::int64_t*>(indices.data_ptr()), view, k, 0, 0, 0, 0};
    if (values.numel() == 0) return true;
    if (largest) {
      run_top_k<E, true>(job, context);
    } else {
      run_top_k<E, false>(job, context);
    }
    return true;
  });
}

}  // namespace xpuruntime::cpu
