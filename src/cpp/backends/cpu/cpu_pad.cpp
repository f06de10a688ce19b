// Pad's reflect, edge and wrap modes on the cpu backend (cpu_common.h: pad_fast).
//
// Note [Pad by rows]
// In these modes each output coordinate takes its value from one input coordinate per axis, chosen by that axis
// alone (pad_source below, the ONNX reference library's mapping, negative pads cropping), so the copy is separable:
// a table per axis maps every output coordinate to its source. The output is written row by row (a row: every
// output element that shares all coordinates but the innermost padded axis's); each row's source row is the sum of
// the outer axes' table offsets, its interior is one memcpy of the source row and only its borders go element by
// element through the innermost table. Trailing axes without pads whose rows are short are merged into the element
// (a "unit" of bytes), so a pad of H in NCHW with a small W still copies long runs. Rows are independent: threads
// split them, and the result is the same bits as the reference's whatever the thread count (pure data movement).
#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {

namespace {

enum class PadMode : std::uint8_t { kReflect, kEdge, kWrap };

// The input coordinate of padded coordinate `i` (may lie outside [0, n)) on an axis of n > 0 elements: the
// reference's pad_source (onnx/onnx_tensor.cpp), reflect periodic with period 2(n - 1) as numpy's for wide pads.
std::int64_t pad_source(std::int64_t i, std::int64_t n, PadMode mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PadMode::kEdge:
      return i < 0 ? 0 : n - 1;
    case PadMode::kWrap:
      return ((i % n) + n) % n;
    case PadMode::kReflect:
      break;
  }
  if (n == 1) return 0;
  const std::int64_t period = 2 * (n - 1);
  const std::int64_t m = ((i % period) + period) % period;
  return m < n ? m : period - m;
}

// Rows shorter than this many bytes pay a per-row cost comparable to their copy: a trailing axis without pads whose
// run (unit * its size) is shorter is merged into the unit.
constexpr std::int64_t kMergeBelowBytes = 1024;
// Bytes of output a parallel chunk writes at least: below that, waking a worker costs more than the copy.
constexpr std::int64_t kChunkBytes = 16384;

// The copy of one padded tensor as rows of units (Note [Pad by rows]).
struct PadRows {
  std::vector<std::vector<std::int64_t>> outer_offsets;  // per outer axis, per output coordinate: input byte offset
  std::vector<std::int64_t> outer_sizes;                 // the outer axes' output sizes
  std::vector<std::int64_t> row_source;                  // per output unit of a row: its unit in the input row
  std::int64_t row_units = 0;                            // units per output row
  std::int64_t interior_begin = 0;                       // [interior_begin, interior_end): one memcpy from
  std::int64_t interior_end = 0;                         //   row_source[interior_begin] on
  std::size_t unit = 0;                                  // bytes per unit
};

// One output row from the input row at `in`. kUnit: the unit's size when fixed at compile time (a memcpy of a
// constant size is one move), 0 for any other.
template <std::size_t kUnit>
void copy_row(const PadRows& rows, const char* in, char* out) {
  const std::size_t unit = kUnit != 0 ? kUnit : rows.unit;
  const std::int64_t* source = rows.row_source.data();
  for (std::int64_t o = 0; o < rows.interior_begin; ++o) {
    std::memcpy(out + o * unit, in + source[o] * unit, kUnit != 0 ? kUnit : unit);
  }
  if (rows.interior_end > rows.interior_begin) {
    std::memcpy(out + rows.interior_begin * unit, in + source[rows.interior_begin] * unit,
                static_cast<std::size_t>(rows.interior_end - rows.interior_begin) * unit);
  }
  for (std::int64_t o = rows.interior_end; o < rows.row_units; ++o) {
    std::memcpy(out + o * unit, in + source[o] * unit, kUnit != 0 ? kUnit : unit);
  }
}

// Output rows [begin, end): the outer coordinates of `begin` are found once, then stepped like an odometer.
template <std::size_t kUnit>
void copy_rows(const PadRows& rows, const char* in, char* out, std::int64_t begin, std::int64_t end) {
  const std::size_t outer = rows.outer_sizes.size();
  std::vector<std::int64_t> coords(outer, 0);
  std::int64_t rest = begin;
  for (std::size_t d = outer; d-- > 0;) {
    coords[d] = rest % rows.outer_sizes[d];
    rest /= rows.outer_sizes[d];
  }
  const auto row_bytes = static_cast<std::int64_t>(rows.unit) * rows.row_units;
  auto source_offset = [&] {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < outer; ++d) offset += rows.outer_offsets[d][static_cast<std::size_t>(coords[d])];
    return offset;
  };
  std::int64_t offset = source_offset();
  for (std::int64_t r = begin; r < end; ++r) {
    copy_row<kUnit>(rows, in + offset, out + r * row_bytes);
    if (outer == 0) continue;
    std::size_t d = outer - 1;
    while (++coords[d] == rows.outer_sizes[d] && d > 0) coords[d--] = 0;
    if (r + 1 < end) offset = source_offset();
  }
}

// Whether the byte ranges of two tensors overlap (a memory plan may give an output a dead input's buffer).
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* pa = static_cast<const char*>(a.data_ptr());
  const auto* pb = static_cast<const char*>(b.data_ptr());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

bool pad_fast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  const Attributes& attrs = launch.desc->attrs;
  const std::string mode_name = attrs.get_string("mode", "constant");
  PadMode mode;
  if (mode_name == "reflect") {
    mode = PadMode::kReflect;
  } else if (mode_name == "edge") {
    mode = PadMode::kEdge;
  } else if (mode_name == "wrap") {
    mode = PadMode::kWrap;
  } else {
    return false;
  }
  const std::vector<std::int64_t> pads = attrs.get_ints("pads", {});
  const std::size_t rank = x.shape().size();
  if (rank == 0 || pads.size() != 2 * rank || y.shape().size() != rank || x.dtype() != y.dtype() ||
      !x.is_contiguous() || !y.is_contiguous() || overlaps(x, y)) {
    return false;
  }
  const std::vector<std::int64_t>& in_shape = x.shape();
  const std::vector<std::int64_t>& out_shape = y.shape();
  for (std::size_t d = 0; d < rank; ++d) {
    if (out_shape[d] != in_shape[d] + pads[d] + pads[d + rank]) return false;
    // The reference rejects a padded empty axis; so does the op schema, before any plan is built.
    if (in_shape[d] == 0 && out_shape[d] != 0) return false;
  }
  if (y.numel() == 0) return true;

  // The innermost padded axis; the trailing unpadded axes after it form the unit while their runs are short.
  PadRows rows;
  rows.unit = x.element_size();
  std::size_t last = rank - 1;
  while (last > 0 && pads[last] == 0 && pads[last + rank] == 0 &&
         static_cast<std::int64_t>(rows.unit) * in_shape[last] < kMergeBelowBytes) {
    rows.unit *= static_cast<std::size_t>(in_shape[last]);
    --last;
  }
  std::vector<std::int64_t> in_strides(last + 1, static_cast<std::int64_t>(rows.unit));  // bytes
  for (std::size_t d = last; d-- > 0;) in_strides[d] = in_strides[d + 1] * in_shape[d + 1];
  for (std::size_t d = 0; d < last; ++d) {
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(out_shape[d]));
    for (std::int64_t o = 0; o < out_shape[d]; ++o) {
      offsets[static_cast<std::size_t>(o)] = pad_source(o - pads[d], in_shape[d], mode) * in_strides[d];
    }
    rows.outer_offsets.push_back(std::move(offsets));
    rows.outer_sizes.push_back(out_shape[d]);
  }
  const std::int64_t begin_pad = pads[last];
  const std::int64_t n = in_shape[last];
  rows.row_units = out_shape[last];
  rows.row_source.resize(static_cast<std::size_t>(rows.row_units));
  for (std::int64_t o = 0; o < rows.row_units; ++o) {
    rows.row_source[static_cast<std::size_t>(o)] = pad_source(o - begin_pad, n, mode);
  }
  rows.interior_begin = std::clamp<std::int64_t>(begin_pad, 0, rows.row_units);
  rows.interior_end = std::clamp<std::int64_t>(begin_pad + n, 0, rows.row_units);

  const auto* in = static_cast<const char*>(x.data_ptr());
  auto* out = static_cast<char*>(y.data_ptr());
  const std::int64_t row_bytes = static_cast<std::int64_t>(rows.unit) * rows.row_units;
  const std::int64_t row_count = y.numel() * static_cast<std::int64_t>(x.element_size()) / row_bytes;
  const std::int64_t grain = std::max<std::int64_t>(1, kChunkBytes / row_bytes);
  parallel_for(row_count, context.threads, grain, [&](std::int64_t begin, std::int64_t end) {
    switch (rows.unit) {
      case 1:
        copy_rows<1>(rows, in, out, begin, end);
        break;
      case 2:
        copy_rows<2>(rows, in, out, begin, end);
        break;
      case 4:
        copy_rows<4>(rows, in, out, begin, end);
        break;
      case 8:
        copy_rows<8>(rows, in, out, begin, end);
        break;
      default:
        copy_rows<0>(rows, in, out, begin, end);
    }
  });
  return true;
}

}  // namespace xpuruntime::cpu
