// Data-movement ops of the cpu backend (transpose, concat, slice, gather, expand), where, the comparisons (equal,
// less, greater), logical_not, and the every-dtype paths of cast and of integer add/sub/mul/div/neg.
//
// Data movement copies bits: every dtype is handled by its element size, and contiguous runs are copied with
// memcpy. Integer arithmetic wraps (two's complement, no undefined behaviour), division truncates toward zero,
// and an integer division by zero raises InvalidArgumentError (there is no right answer to return). Casts:
// float -> float rounds to nearest even once (cpu_elementwise.cpp), float -> int truncates toward zero and
// saturates at the target's range with NaN -> 0 (what the CUDA conversion instructions do), int -> int wraps
// like NumPy, anything -> bool is `x != 0` (NaN -> true), bool -> anything is 0 or 1.
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backends/cpu/cpu_common.h"
#include "core/shape_str.h"
#include "core/data_ops.h"

namespace xpuruntime::cpu {

namespace {

using Shape = std::vector<std::int64_t>;

constexpr std::int64_t kCopyGrain = 1 << 16;  // elements per thread at least

using detail::shape_str;

// ---- strided copies ----

// to[i] = from[i * step] for `count` elements of type E (no alignment assumed: memcpy per element, which compilers
// turn into plain loads and stores).
template <typename E>
void strided_run(const char* from, char* to, std::int64_t count, std::int64_t step) {
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(to + i * static_cast<std::int64_t>(sizeof(E)), from + i * step * static_cast<std::int64_t>(sizeof(E)),
                sizeof(E));
  }
}

// Note [Transposes in tiles]
// Where the output's innermost axis steps through the source with a stride and the axis before it is the source's
// contiguous one (a transpose of the last two axes, (0, 2, 1) of [257, 263, 269]), copying an output row at a time
// reads each element from another cache line: 58.7 ms for that transpose at one thread against ONNX Runtime's 38.8
// (2026-12-07, cpu_awkward_bench.py). Such a plane is copied in square tiles of kTile x kTile instead: a tile's source
// rows are read along their contiguous axis and stay in L1 while its output rows are written.
constexpr std::int64_t kTile = 32;

// to[a * cols + b] = from[a + b * step] for rows a0 <= a < a1 and b < cols (elements of type E): one plane's rows,
// tile by tile.
template <typename E>
void transpose_plane(const char* from, char* to, std::int64_t cols, std::int64_t step, std::int64_t a0,
                     std::int64_t a1) {
  const auto* src = reinterpret_cast<const E*>(from);
  auto* dst = reinterpret_cast<E*>(to);
  for (std::int64_t at = a0; at < a1; at += kTile) {
    const std::int64_t a_end = std::min(a1, at + kTile);
    for (std::int64_t bt = 0; bt < cols; bt += kTile) {
      const std::int64_t b_end = std::min(cols, bt + kTile);
      std::int64_t a = at;
#if defined(__SSE2__)
      if constexpr (sizeof(E) == 4) {  // 4 x 4 blocks through SSE registers: four loads along a, four stores along b
        for (; a + 4 <= a_end; a += 4) {
          std::int64_t b = bt;
          for (; b + 4 <= b_end; b += 4) {
            __m128 r0 = _mm_loadu_ps(reinterpret_cast<const float*>(src + a + b * step));
            __m128 r1 = _mm_loadu_ps(reinterpret_cast<const float*>(src + a + (b + 1) * step));
            __m128 r2 = _mm_loadu_ps(reinterpret_cast<const float*>(src + a + (b + 2) * step));
            __m128 r3 = _mm_loadu_ps(reinterpret_cast<const float*>(src + a + (b + 3) * step));
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            _mm_storeu_ps(reinterpret_cast<float*>(dst + a * cols + b), r0);
            _mm_storeu_ps(reinterpret_cast<float*>(dst + (a + 1) * cols + b), r1);
            _mm_storeu_ps(reinterpret_cast<float*>(dst + (a + 2) * cols + b), r2);
            _mm_storeu_ps(reinterpret_cast<float*>(dst + (a + 3) * cols + b), r3);
          }
          for (std::int64_t k = 0; k < 4; ++k) {
            for (std::int64_t c = b; c < b_end; ++c) dst[(a + k) * cols + c] = src[a + k + c * step];
          }
        }
      }
#endif
      for (; a < a_end; ++a) {
        for (std::int64_t b = bt; b < b_end; ++b) dst[a * cols + b] = src[a + b * step];
      }
    }
  }
}

// The copy of Note [Transposes in tiles]: the merged shape's last two axes are the plane (sizes[rank - 2] rows at
// source stride 1, sizes[rank - 1] columns at steps[rank - 1]), the axes before them the planes. False (nothing
// copied) for an element size other than 1, 2, 4 or 8 bytes.
bool copy_planes_in_tiles(const char* src, char* dst, std::size_t element_size, const std::vector<std::int64_t>& sizes,
                          const std::vector<std::int64_t>& steps, int threads) {
  const std::size_t rank = sizes.size();
  const std::int64_t rows = sizes[rank - 2], cols = sizes[rank - 1], step = steps[rank - 1];
  std::int64_t planes = 1;
  for (std::size_t d = 0; d + 2 < rank; ++d) planes *= sizes[d];
  const auto es = static_cast<std::int64_t>(element_size);
  const std::int64_t row_tiles = (rows + kTile - 1) / kTile;
  using Plane = void (*)(const char*, char*, std::int64_t, std::int64_t, std::int64_t, std::int64_t);
  Plane plane = nullptr;
  switch (element_size) {
    case 1: plane = transpose_plane<std::uint8_t>; break;
    case 2: plane = transpose_plane<std::uint16_t>; break;
    case 4: plane = transpose_plane<std::uint32_t>; break;
    case 8: plane = transpose_plane<std::uint64_t>; break;
    default: return false;
  }
  parallel_for(planes * row_tiles, threads, std::max<std::int64_t>(1, kCopyGrain / (kTile * cols)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t t = begin; t < end; ++t) {
                   const std::int64_t p = t / row_tiles, a0 = (t % row_tiles) * kTile;
                   std::int64_t offset = 0, rest = p;
                   for (std::size_t d = rank - 2; d-- > 0;) {
                     offset += (rest % sizes[d]) * steps[d];
                     rest /= sizes[d];
                   }
                   plane(src + offset * es, dst + p * rows * cols * es, cols, step, a0, std::min(rows, a0 + kTile));
                 }
               });
  return true;
}

// dst (contiguous, `shape`) [i...] = src[sum(i[d] * strides[d])], strides in elements (any sign, 0 allowed).
// Size-1 dimensions are dropped and neighbours that src steps through as one dimension merged, so the inner
// loop is as long as possible; unit-stride inner runs are memcpy'd.
void copy_to_contiguous(const char* src, char* dst, std::size_t element_size, const Shape& shape,
                        const Shape& strides, int threads) {
  Shape sizes, steps;
  std::int64_t numel = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    numel *= shape[d];
    if (shape[d] == 1) continue;
    if (!sizes.empty() && steps.back() == strides[d] * shape[d]) {
      sizes.back() *= shape[d];
      steps.back() = strides[d];
      continue;
    }
    sizes.push_back(shape[d]);
    steps.push_back(strides[d]);
  }
  if (numel == 0) return;
  if (sizes.empty()) {
    std::memcpy(dst, src, element_size);
    return;
  }
  const std::size_t rank = sizes.size();
  const std::int64_t inner = sizes.back();
  const std::int64_t inner_step = steps.back();
  const std::int64_t rows = numel / inner;
  const auto es = static_cast<std::int64_t>(element_size);
  // Note [Transposes in tiles]: a plane whose rows are the source's contiguous axis, its columns far apart.
  if (rank >= 2 && steps[rank - 2] == 1 && inner_step > 1 && sizes[rank - 2] >= 8 && inner >= 8 &&
      copy_planes_in_tiles(src, dst, element_size, sizes, steps, threads)) {
    return;
  }
  parallel_for(rows, threads, std::max<std::int64_t>(1, kCopyGrain / inner), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      std::int64_t offset = 0, rest = row;
      for (std::size_t d = rank - 1; d-- > 0;) {
        offset += (rest % sizes[d]) * steps[d];
        rest /= sizes[d];
      }
      const char* from = src + offset * es;
      char* to = dst + row * inner * es;
      if (inner_step == 1) {
        std::memcpy(to, from, static_cast<std::size_t>(inner * es));
        continue;
      }
      switch (element_size) {
        case 1: strided_run<std::uint8_t>(from, to, inner, inner_step); break;
        case 2: strided_run<std::uint16_t>(from, to, inner, inner_step); break;
        case 4: strided_run<std::uint32_t>(from, to, inner, inner_step); break;
        case 8: strided_run<std::uint64_t>(from, to, inner, inner_step); break;
        default:
          for (std::int64_t i = 0; i < inner; ++i) std::memcpy(to + i * es, from + i * inner_step * es, element_size);
      }
    }
  });
}

void run_transpose(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const auto rank = static_cast<std::int64_t>(x.dim());
  Shape perm = launch.desc->attrs.get_ints("perm", {});
  if (!launch.desc->attrs.has("perm")) {
    for (std::int64_t k = rank - 1; k >= 0; --k) perm.push_back(k);
  }
  const Shape in_strides = data_ops::contiguous_strides_of(x.shape());
  Shape strides;
  for (const std::int64_t p : perm) strides.push_back(in_strides[static_cast<std::size_t>(p < 0 ? p + rank : p)]);
  copy_to_contiguous(static_cast<const char*>(x.data_ptr()), static_cast<char*>(y.data_ptr()), x.element_size(),
                     y.shape(), strides, context.threads);
}

void run_slice(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const auto rank = static_cast<std::int64_t>(x.dim());
  const Attributes& attrs = launch.desc->attrs;
  const Shape starts = attrs.get_ints("starts", {});
  const Shape ends = attrs.get_ints("ends", {});
  Shape axes = attrs.get_ints("axes", {});
  if (!attrs.has("axes")) {
    for (std::size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<std::int64_t>(k));
  }
  const Shape steps = attrs.get_ints("steps", Shape(starts.size(), 1));
  const Shape in_strides = data_ops::contiguous_strides_of(x.shape());
  Shape strides = in_strides;
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const auto axis = static_cast<std::size_t>(axes[k] < 0 ? axes[k] + rank : axes[k]);
    const data_ops::SliceDim dim = data_ops::resolve_slice(x.shape()[axis], starts[k], ends[k], steps[k]);
    XPURT_INTERNAL_ASSERT(dim.size == y.shape()[axis], "slice: inferred size ", y.shape()[axis], " vs ", dim.size);
    offset += dim.start * in_strides[axis];
    strides[axis] = in_strides[axis] * dim.step;
  }
  if (y.numel() == 0) return;
  copy_to_contiguous(static_cast<const char*>(x.data_ptr()) + offset * static_cast<std::int64_t>(x.element_size()),
                     static_cast<char*>(y.data_ptr()), x.element_size(), y.shape(), strides, context.threads);
}

void run_expand(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  copy_to_contiguous(static_cast<const char*>(x.data_ptr()), static_cast<char*>(y.data_ptr()), x.element_size(),
                     y.shape(), data_ops::broadcast_strides(x.shape(), y.shape()), context.threads);
}

// Concat: each output row is the inputs' rows one after another. Many rows: one loop over them, every input's piece
// of a row copied by the thread that has the row (a loop per input, as before, paid each loop's start for small
// pieces: 8 inputs of [31, 37, <20] took 3.4x ONNX Runtime's time, 2026-12-07). Fewer rows than the threads can share
// (a concat along axis 0 is one row): the pieces cut in kConcatChunk bytes, so that one large input is not one
// thread's memcpy (16 MB along axis 0: 3x ONNX Runtime's time).
constexpr std::int64_t kConcatChunk = std::int64_t{1} << 18;

void run_concat(const KernelLaunch& launch, const CpuContext& context) {
  Tensor& y = launch.output(0);
  const auto rank = static_cast<std::int64_t>(y.dim());
  std::int64_t axis = launch.desc->attrs.get_int("axis", 0);
  if (axis < 0) axis += rank;
  const std::int64_t outer = product(y.shape(), 0, static_cast<std::size_t>(axis));
  const auto es = static_cast<std::int64_t>(y.element_size());
  const std::int64_t out_row = product(y.shape(), static_cast<std::size_t>(axis), y.shape().size()) * es;
  char* out = static_cast<char*>(y.data_ptr());
  std::vector<const char*> in;
  std::vector<std::int64_t> in_row;  // bytes of input k's rows
  for (std::size_t k = 0; k < launch.num_inputs; ++k) {
    const Tensor& x = launch.input(k);
    in.push_back(static_cast<const char*>(x.data_ptr()));
    in_row.push_back(product(x.shape(), static_cast<std::size_t>(axis), x.shape().size()) * es);
  }
  if (out_row == 0 || outer == 0) return;
  if (outer >= 4 * context.threads || outer * out_row <= kConcatChunk) {
    parallel_for(outer, context.threads, std::max<std::int64_t>(1, kCopyGrain / out_row),
                 [&](std::int64_t begin, std::int64_t end) {
                   for (std::int64_t r = begin; r < end; ++r) {
                     char* dst = out + r * out_row;
                     for (std::size_t k = 0; k < in.size(); ++k) {
                       if (in_row[k] > 0) std::memcpy(dst, in[k] + r * in_row[k], static_cast<std::size_t>(in_row[k]));
                       dst += in_row[k];
                     }
                   }
                 });
    return;
  }
  struct Piece {
    char* dst;
    const char* src;
    std::int64_t bytes;
  };
  std::vector<Piece> pieces;
  for (std::int64_t r = 0; r < outer; ++r) {
    char* dst = out + r * out_row;
    for (std::size_t k = 0; k < in.size(); ++k) {
      for (std::int64_t at = 0; at < in_row[k]; at += kConcatChunk) {
        pieces.push_back({dst + at, in[k] + r * in_row[k] + at, std::min(kConcatChunk, in_row[k] - at)});
      }
      dst += in_row[k];
    }
  }
  parallel_for(static_cast<std::int64_t>(pieces.size()), context.threads, 1,
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t i = begin; i < end; ++i) {
                   const Piece& p = pieces[static_cast<std::size_t>(i)];
                   std::memcpy(p.dst, p.src, static_cast<std::size_t>(p.bytes));
                 }
               });
}

template <typename Index>
void read_indices(const Tensor& indices, std::int64_t axis_size, std::int64_t axis, std::vector<std::int64_t>* out) {
  const auto* p = static_cast<const Index*>(indices.data_ptr());
  const std::int64_t n = indices.numel();
  out->resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto index = static_cast<std::int64_t>(p[i]);
    if (index < -axis_size || index >= axis_size) {
      Shape position(indices.shape().size());
      std::int64_t rest = i;
      for (std::size_t d = position.size(); d-- > 0;) {
        position[d] = rest % indices.shape()[d];
        rest /= indices.shape()[d];
      }
      throw InvalidArgumentError(detail::str_cat("op 'gather': index ", index, " at position ", shape_str(position),
                                                 " of 'indices' is out of range for axis ", axis, " of size ",
                                                 axis_size, " (valid: ", -axis_size, " to ", axis_size - 1, ")"));
    }
    (*out)[static_cast<std::size_t>(i)] = index < 0 ? index + axis_size : index;
  }
}

void run_gather(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& data = launch.input(0);
  const Tensor& indices = launch.input(1);
  Tensor& y = launch.output(0);
  const auto rank = static_cast<std::int64_t>(data.dim());
  std::int64_t axis = launch.desc->attrs.get_int("axis", 0);
  if (axis < 0) axis += rank;
  const auto a = static_cast<std::size_t>(axis);
  const std::int64_t axis_size = data.shape()[a];
  std::vector<std::int64_t> index;
  if (indices.dtype() == DType::kInt32) {
    read_indices<std::int32_t>(indices, axis_size, axis, &index);
  } else {
    read_indices<std::int64_t>(indices, axis_size, axis, &index);
  }
  if (y.numel() == 0) return;
  const std::int64_t outer = product(data.shape(), 0, a);
  const auto es = static_cast<std::int64_t>(data.element_size());
  const std::int64_t row = product(data.shape(), a + 1, data.shape().size()) * es;  // bytes per gathered row
  const auto n = static_cast<std::int64_t>(index.size());
  const char* in = static_cast<const char*>(data.data_ptr());
  char* out = static_cast<char*>(y.data_ptr());
  parallel_for(outer * n, context.threads, std::max<std::int64_t>(1, kCopyGrain / std::max<std::int64_t>(row, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t r = begin; r < end; ++r) {
                   const std::int64_t o = r / n, j = r % n;
                   std::memcpy(out + r * row, in + (o * axis_size + index[static_cast<std::size_t>(j)]) * row,
                               static_cast<std::size_t>(row));
                 }
               });
}

// ---- broadcasting elementwise ----

// Calls f(row, count, offsets, inner_strides) for every run of `count` consecutive output elements starting at
// output index row * count, where operand k starts at element offsets[k] and steps inner_strides[k]. Operand
// shapes broadcast to `out_shape` (NumPy rules); size-1 dims are dropped and mergeable neighbours merged.
template <std::size_t N, typename F>
void broadcast_rows(const Shape& out_shape, const std::array<const Shape*, N>& shapes, int threads, F&& f) {
  std::int64_t numel = 1;
  for (const auto d : out_shape) numel *= d;
  if (numel == 0) return;
  std::array<Shape, N> full;
  for (std::size_t k = 0; k < N; ++k) full[k] = data_ops::broadcast_strides(*shapes[k], out_shape);
  Shape sizes;
  std::array<Shape, N> strides;
  for (std::size_t d = 0; d < out_shape.size(); ++d) {
    if (out_shape[d] == 1) continue;
    bool mergeable = !sizes.empty();
    for (std::size_t k = 0; k < N && mergeable; ++k) mergeable = strides[k].back() == full[k][d] * out_shape[d];
    if (mergeable) {
      sizes.back() *= out_shape[d];
      for (std::size_t k = 0; k < N; ++k) strides[k].back() = full[k][d];
      continue;
    }
    sizes.push_back(out_shape[d]);
    for (std::size_t k = 0; k < N; ++k) strides[k].push_back(full[k][d]);
  }
  if (sizes.empty()) {
    sizes = {1};
    for (std::size_t k = 0; k < N; ++k) strides[k] = {0};
  }
  const std::size_t rank = sizes.size();
  const std::int64_t inner = sizes.back();
  std::array<std::int64_t, N> inner_strides;
  for (std::size_t k = 0; k < N; ++k) inner_strides[k] = strides[k].back();
  parallel_for(numel / inner, threads, std::max<std::int64_t>(1, kCopyGrain / inner),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t row = begin; row < end; ++row) {
                   std::array<std::int64_t, N> offsets{};
                   std::int64_t rest = row;
                   for (std::size_t d = rank - 1; d-- > 0;) {
                     const std::int64_t i = rest % sizes[d];
                     rest /= sizes[d];
                     for (std::size_t k = 0; k < N; ++k) offsets[k] += i * strides[k][d];
                   }
                   f(row, inner, offsets, inner_strides);
                 }
               });
}

// Element values as the comparisons and casts see them: 16-bit floats widened to float.
struct HalfValue {
  using Storage = std::uint16_t;
  static float load(Storage v) { return detail::half_to_float(v); }
};
struct BFloat16Value {
  using Storage = std::uint16_t;
  static float load(Storage v) { return detail::bfloat16_to_float(v); }
};
template <typename T>
struct PlainValue {
  using Storage = T;
  static T load(Storage v) { return v; }
};
struct BoolValue {
  using Storage = std::uint8_t;
  static std::uint8_t load(Storage v) { return v != 0 ? 1 : 0; }
};

// Calls f(Value{}) with the value reader of `dtype`.
template <typename F>
void dispatch_value(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return f(HalfValue{});
    case DType::kBFloat16: return f(BFloat16Value{});
    case DType::kFloat32: return f(PlainValue<float>{});
    case DType::kFloat64: return f(PlainValue<double>{});
    case DType::kInt8: return f(PlainValue<std::int8_t>{});
    case DType::kUInt8: return f(PlainValue<std::uint8_t>{});
    case DType::kInt16: return f(PlainValue<std::int16_t>{});
    case DType::kInt32: return f(PlainValue<std::int32_t>{});
    case DType::kInt64: return f(PlainValue<std::int64_t>{});
    case DType::kBool: return f(BoolValue{});
    case DType::kUInt16: return f(PlainValue<std::uint16_t>{});
    case DType::kUInt32: return f(PlainValue<std::uint32_t>{});
    case DType::kUInt64: return f(PlainValue<std::uint64_t>{});
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kInt4:
    case DType::kUInt4:
      break;  // storage-only: the op schemas refuse them (data_ops::is_any_supported_dtype)
  }
  XPURT_INTERNAL_ASSERT(false, "the cpu data kernels do not take ", dtype_name(dtype));
}

enum class Compare : std::uint8_t { kEqual, kLess, kGreater };

void run_compare(Compare kind, const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& a = launch.input(0);
  const Tensor& b = launch.input(1);
  Tensor& y = launch.output(0);
  dispatch_value(a.dtype(), [&](auto value) {
    using V = decltype(value);
    using S = typename V::Storage;
    const S* pa = static_cast<const S*>(a.data_ptr());
    const S* pb = static_cast<const S*>(b.data_ptr());
    auto* out = static_cast<std::uint8_t*>(y.data_ptr());
    broadcast_rows<2>(y.shape(), {&a.shape(), &b.shape()}, context.threads,
                      [&](std::int64_t row, std::int64_t count, const std::array<std::int64_t, 2>& offsets,
                          const std::array<std::int64_t, 2>& steps) {
                        std::uint8_t* o = out + row * count;
                        for (std::int64_t i = 0; i < count; ++i) {
                          const auto va = V::load(pa[offsets[0] + i * steps[0]]);
                          const auto vb = V::load(pb[offsets[1] + i * steps[1]]);
                          bool r = false;
                          switch (kind) {
                            case Compare::kEqual: r = va == vb; break;
                            case Compare::kLess: r = va < vb; break;
                            case Compare::kGreater: r = va > vb; break;
                          }
                          o[i] = r ? 1 : 0;
                        }
                      });
  });
}

template <typename E>
void where_typed(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& cond = launch.input(0);
  const Tensor& a = launch.input(1);
  const Tensor& b = launch.input(2);
  Tensor& y = launch.output(0);
  const auto* pc = static_cast<const std::uint8_t*>(cond.data_ptr());
  const E* pa = static_cast<const E*>(a.data_ptr());
  const E* pb = static_cast<const E*>(b.data_ptr());
  E* out = static_cast<E*>(y.data_ptr());
  broadcast_rows<3>(y.shape(), {&cond.shape(), &a.shape(), &b.shape()}, context.threads,
                    [&](std::int64_t row, std::int64_t count, const std::array<std::int64_t, 3>& offsets,
                        const std::array<std::int64_t, 3>& steps) {
                      E* o = out + row * count;
                      for (std::int64_t i = 0; i < count; ++i) {
                        o[i] = pc[offsets[0] + i * steps[0]] != 0 ? pa[offsets[1] + i * steps[1]]
                                                                  : pb[offsets[2] + i * steps[2]];
                      }
                    });
}

void run_where(const KernelLaunch& launch, const CpuContext& context) {
  switch (launch.input(1).element_size()) {
    case 1: return where_typed<std::uint8_t>(launch, context);
    case 2: return where_typed<std::uint16_t>(launch, context);
    case 4: return where_typed<std::uint32_t>(launch, context);
    case 8: return where_typed<std::uint64_t>(launch, context);
    default: XPURT_INTERNAL_ASSERT(false, "where: element size ", launch.input(1).element_size());
  }
}

void run_logical_not(const KernelLaunch& launch, const CpuContext& context) {
  const auto* in = static_cast<const std::uint8_t*>(launch.input(0).data_ptr());
  auto* out = static_cast<std::uint8_t*>(launch.output(0).data_ptr());
  parallel_for(launch.output(0).numel(), context.threads, kCopyGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = in[i] != 0 ? 0 : 1;
  });
}

// ---- integer arithmetic ----

enum class IntOp : std::uint8_t { kAdd, kSub, kMul, kDiv };

// Two's complement wrap-around without signed overflow: the arithmetic is done in the unsigned type.
template <typename T>
T wrap_op(IntOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case IntOp::kAdd: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case IntOp::kSub: return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
    case IntOp::kMul: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case IntOp::kDiv:
      if (b == -1) return static_cast<T>(U(0) - static_cast<U>(a));  // MIN / -1 wraps to MIN
      return static_cast<T>(a / b);                                  // truncates toward zero
  }
  return T(0);
}

template <typename T>
void integer_binary(IntOp op, const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& a = launch.input(0);
  const Tensor& b = launch.input(1);
  Tensor& y = launch.output(0);
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* out = static_cast<T*>(y.data_ptr());
  broadcast_rows<2>(y.shape(), {&a.shape(), &b.shape()}, context.threads,
                    [&](std::int64_t row, std::int64_t count, const std::array<std::int64_t, 2>& offsets,
                        const std::array<std::int64_t, 2>& steps) {
                      T* o = out + row * count;
                      for (std::int64_t i = 0; i < count; ++i) {
                        const T vb = pb[offsets[1] + i * steps[1]];
                        if (op == IntOp::kDiv && vb == 0) {
                          throw InvalidArgumentError(detail::str_cat(
                              "op 'div': integer division by zero (", dtype_name(y.dtype()), " divisor ",
                              shape_str(b.shape()), " has a zero that element ", row * count + i, " of the output ",
                              shape_str(y.shape()), " divides by)"));
                        }
                        o[i] = wrap_op<T>(op, pa[offsets[0] + i * steps[0]], vb);
                      }
                    });
}

template <typename T>
void integer_neg(const KernelLaunch& launch, const CpuContext& context) {
  using U = std::make_unsigned_t<T>;
  const T* in = static_cast<const T*>(launch.input(0).data_ptr());
  T* out = static_cast<T*>(launch.output(0).data_ptr());
  parallel_for(launch.output(0).numel(), context.threads, kCopyGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = static_cast<T>(U(0) - static_cast<U>(in[i]));
  });
}

// ---- cast ----

// A source element as the conversion sees it: floats exactly as double, signed integers exactly as int64,
// unsigned integers and bool exactly as uint64.
template <typename To>
To convert_from_double(double v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != 0.0;
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else {
    if (v != v) return To(0);
    constexpr double lowest = static_cast<double>(std::numeric_limits<To>::lowest());
    constexpr double upper = static_cast<double>(std::numeric_limits<To>::max()) + 1.0;  // exact: a power of two
    if (v <= lowest) return std::numeric_limits<To>::lowest();
    if (v >= upper) return std::numeric_limits<To>::max();
    return static_cast<To>(v);  // truncates toward zero
  }
}

template <typename To, typename Int>
To convert_from_int(Int v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != 0;
  } else if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else {
    return static_cast<To>(static_cast<std::make_unsigned_t<To>>(static_cast<std::uint64_t>(v)));  // wraps
  }
}

// Writes element `i` of the output from a source value (double for float sources, int64 for signed integers,
// uint64 for unsigned integers and bool).
template <typename Source>
void store_converted(void* out, DType to, std::int64_t i, Source v) {
  constexpr bool from_float = std::is_same_v<Source, double>;
  auto convert = [&](auto tag) {
    using To = decltype(tag);
    if constexpr (from_float) {
      return convert_from_double<To>(v);
    } else {
      return convert_from_int<To, Source>(v);
    }
  };
  switch (to) {
    case DType::kFloat16:
    case DType::kBFloat16: {
      // One rounding: an exact double (or int64) -> round to odd float -> nearest even 16-bit.
      const float narrowed = round_to_odd_float(static_cast<double>(v));
      static_cast<std::uint16_t*>(out)[i] =
          to == DType::kFloat16 ? detail::float_to_half(narrowed) : detail::float_to_bfloat16(narrowed);
      return;
    }
    case DType::kFloat32: static_cast<float*>(out)[i] = convert(float{}); return;
    case DType::kFloat64: static_cast<double*>(out)[i] = convert(double{}); return;
    case DType::kInt8: static_cast<std::int8_t*>(out)[i] = convert(std::int8_t{}); return;
    case DType::kUInt8: static_cast<std::uint8_t*>(out)[i] = convert(std::uint8_t{}); return;
    case DType::kInt16: static_cast<std::int16_t*>(out)[i] = convert(std::int16_t{}); return;
    case DType::kInt32: static_cast<std::int32_t*>(out)[i] = convert(std::int32_t{}); return;
    case DType::kInt64: static_cast<std::int64_t*>(out)[i] = convert(std::int64_t{}); return;
    case DType::kBool: static_cast<std::uint8_t*>(out)[i] = convert(bool{}) ? 1 : 0; return;
    case DType::kUInt16: static_cast<std::uint16_t*>(out)[i] = convert(std::uint16_t{}); return;
    case DType::kUInt32: static_cast<std::uint32_t*>(out)[i] = convert(std::uint32_t{}); return;
    case DType::kUInt64: static_cast<std::uint64_t*>(out)[i] = convert(std::uint64_t{}); return;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kInt4:
    case DType::kUInt4:
      break;  // storage-only: cast's schema refuses them (data_ops::is_any_supported_dtype)
  }
  XPURT_INTERNAL_ASSERT(false, "the cpu cast does not write ", dtype_name(to));
}

}  // namespace

void run_integer_arithmetic(const std::string& op, const KernelLaunch& launch, const CpuContext& context) {
  const DType dtype = launch.input(0).dtype();
  XPURT_INTERNAL_ASSERT(dtype == DType::kInt32 || dtype == DType::kInt64, "integer ", op, " of ", dtype_name(dtype));
  const bool wide = dtype == DType::kInt64;
  if (op == "neg") {
    return wide ? integer_neg<std::int64_t>(launch, context) : integer_neg<std::int32_t>(launch, context);
  }
  IntOp kind = IntOp::kAdd;
  if (op == "sub") {
    kind = IntOp::kSub;
  } else if (op == "mul") {
    kind = IntOp::kMul;
  } else if (op == "div") {
    kind = IntOp::kDiv;
  } else {
    XPURT_INTERNAL_ASSERT(op == "add", "integer arithmetic op ", op);
  }
  if (wide) {
    integer_binary<std::int64_t>(kind, launch, context);
  } else {
    integer_binary<std::int32_t>(kind, launch, context);
  }
}

void run_any_cast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const DType to = y.dtype();
  void* out = y.data_ptr();
  dispatch_value(x.dtype(), [&](auto value) {
    using V = decltype(value);
    using S = typename V::Storage;
    const S* in = static_cast<const S*>(x.data_ptr());
    parallel_for(x.numel(), context.threads, kCopyGrain, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const auto v = V::load(in[i]);
        if constexpr (std::is_floating_point_v<decltype(v)>) {
          store_converted<double>(out, to, i, static_cast<double>(v));
        } else if constexpr (std::is_unsigned_v<decltype(v)>) {
          store_converted<std::uint64_t>(out, to, i, static_cast<std::uint64_t>(v));
        } else {
          store_converted<std::int64_t>(out, to, i, static_cast<std::int64_t>(v));
        }
      }
    });
  });
}

void register_data_kernels(KernelRegistry& registry) {
  const DTypeSet all = DTypeSet::kAll;
  add_cpu_kernel(registry, "transpose", "reference permutation: strided copy, contiguous runs memcpy'd",
                 run_transpose, all);
  add_cpu_kernel(registry, "concat", "reference concatenation: one memcpy per input row", run_concat, all);
  add_cpu_kernel(registry, "slice", "reference ONNX Slice: strided copy (negative steps too)", run_slice, all);
  add_cpu_kernel(registry, "gather",
                 "reference ONNX Gather: one memcpy per gathered row; an out-of-range index raises "
                 "InvalidArgumentError",
                 run_gather, all);
  add_cpu_kernel(registry, "expand", "reference ONNX Expand: broadcast copy", run_expand, all);
  add_cpu_kernel(registry, "where", "reference cond ? a : b with NumPy broadcasting", run_where, all);
  const std::pair<const char*, Compare> comparisons[] = {
      {"equal", Compare::kEqual}, {"less", Compare::kLess}, {"greater", Compare::kGreater}};
  for (const auto& [op, kind] : comparisons) {
    add_cpu_kernel(
        registry, op, std::string("reference ") + op + "(a, b) -> bool with NumPy broadcasting (16-bit floats as fp32)",
        [kind = kind](const KernelLaunch& launch, const CpuContext& context) { run_compare(kind, launch, context); },
        all);
  }
  add_cpu_kernel(registry, "logical_not", "reference !x for bool x", run_logical_not, all);
}

// Tile as one strided copy: y viewed as [repeats[0], x.shape[0], repeats[1], x.shape[1], ...] is x broadcast over
// the repeats (source strides 0 there), in the row-major order of y (the ONNX reference library's Tile walked each
// output element's coordinates: 44x ONNX Runtime's time on [64, 1, 512] tiled to [64, 64, 512], 2026-12-07).
bool tile_fast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const std::vector<std::int64_t> repeats = launch.desc->attrs.get_ints("repeats", {});
  if (!x.is_contiguous() || !y.is_contiguous() || x.dtype() != y.dtype() ||
      repeats.size() != static_cast<std::size_t>(x.dim())) {
    return false;
  }
  if (y.numel() == 0) return true;
  const Shape x_strides = contiguous_strides(x.shape());
  Shape shape, strides;
  for (std::size_t d = 0; d < repeats.size(); ++d) {
    if (repeats[d] < 0 || x.shape()[d] * repeats[d] != y.shape()[d]) return false;
    shape.insert(shape.end(), {repeats[d], x.shape()[d]});
    strides.insert(strides.end(), {0, x_strides[d]});
  }
  copy_to_contiguous(static_cast<const char*>(x.data_ptr()), static_cast<char*>(y.data_ptr()), x.element_size(),
                     shape, strides, context.threads);
  return true;
}

namespace {

// GatherElements' rows of the output's last axis [begin, end) with elements of kBytes bytes.
template <std::size_t kBytes, typename Index>
void gather_element_rows(const char* src, char* dst, const Index* indices, const Shape& shape, const Shape& x_strides,
                         std::size_t axis, std::int64_t axis_size, std::int64_t begin, std::int64_t end) {
  const std::size_t last = shape.size() - 1;
  const std::int64_t width = shape[last];
  for (std::int64_t row = begin; row < end; ++row) {
    std::int64_t base = 0, rest = row;  // the row's offset in x without the axis' term
    for (std::size_t d = last; d-- > 0;) {
      if (d != axis) base += rest % shape[d] * x_strides[d];
      rest /= shape[d];
    }
    for (std::int64_t j = 0; j < width; ++j) {
      auto v = static_cast<std::int64_t>(indices[row * width + j]);
      v = v < 0 ? v + axis_size : v;
      const std::int64_t offset = base + (axis == last ? 0 : j) + v * x_strides[axis];
      std::memcpy(dst + (row * width + j) * static_cast<std::int64_t>(kBytes),
                  src + offset * static_cast<std::int64_t>(kBytes), kBytes);
    }
  }
}

}  // namespace

// GatherElements by rows of the output's last axis on the pool's threads: the ONNX reference library's kernel walks
// them on one thread (4.3x ONNX Runtime's time on [256, 1024] along axis 1, 2026-12-07). The indices are checked
// first: one out of range leaves the launch to the reference, which names it, with nothing written.
bool gather_elements_fast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  const Tensor& indices = launch.input(1);
  Tensor& y = launch.output(0);
  const bool int64 = indices.dtype() == DType::kInt64;
  if (!x.is_contiguous() || !indices.is_contiguous() || !y.is_contiguous() || x.dtype() != y.dtype() || x.dim() < 1 ||
      indices.dim() != x.dim() || y.shape() != indices.shape() || (!int64 && indices.dtype() != DType::kInt32)) {
    return false;
  }
  const std::size_t es = x.element_size();
  if (es != 1 && es != 2 && es != 4 && es != 8) return false;
  std::int64_t axis = launch.desc->attrs.get_int("axis", 0);
  axis = axis < 0 ? axis + x.dim() : axis;
  if (axis < 0 || axis >= x.dim()) return false;
  const auto a = static_cast<std::size_t>(axis);
  const std::int64_t axis_size = x.shape()[a];
  const std::int64_t n = indices.numel();
  for (std::size_t d = 0; d < x.shape().size(); ++d) {
    if (d != a && indices.shape()[d] > x.shape()[d]) return false;
  }
  const void* ix = indices.data_ptr();
  const auto in_range = [&](auto* p) {  // one pass, without a branch per index
    bool ok = true;
    for (std::int64_t k = 0; k < n; ++k) ok &= static_cast<std::int64_t>(p[k]) >= -axis_size && p[k] < axis_size;
    return ok;
  };
  if (!(int64 ? in_range(static_cast<const std::int64_t*>(ix)) : in_range(static_cast<const std::int32_t*>(ix)))) {
    return false;
  }
  if (n == 0) return true;
  const Shape& shape = indices.shape();
  const Shape x_strides = contiguous_strides(x.shape());
  const std::int64_t width = shape.back(), rows = n / width;
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(y.data_ptr());
  parallel_for(rows, context.threads, std::max<std::int64_t>(1, kCopyGrain / std::max<std::int64_t>(width, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 const auto rows_of = [&](auto bytes) {
                   constexpr std::size_t kBytes = decltype(bytes)::value;
                   if (int64) {
                     gather_element_rows<kBytes>(src, dst, static_cast<const std::int64_t*>(ix), shape, x_strides, a,
                                                 axis_size, begin, end);
                   } else {
                     gather_element_rows<kBytes>(src, dst, static_cast<const std::int32_t*>(ix), shape, x_strides, a,
                                                 axis_size, begin, end);
                   }
                 };
                 switch (es) {
                   case 1: rows_of(std::integral_constant<std::size_t, 1>{}); break;
                   case 2: rows_of(std::integral_constant<std::size_t, 2>{}); break;
                   case 4: rows_of(std::integral_constant<std::size_t, 4>{}); break;
                   default: rows_of(std::integral_constant<std::size_t, 8>{});
                 }
               });
  return true;
}

}  // namespace xpuruntime::cpu
