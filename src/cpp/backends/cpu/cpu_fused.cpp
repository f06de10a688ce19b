// The cpu kernel of fused_elementwise: the program interpreted over chunks of the output (Note [Fused elementwise
// programs] in core/fused_elementwise.h), every instruction in float32.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <tuple>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"
#include "core/fused_elementwise.h"
#include "core/half.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cpu {

namespace {

using fused::Instruction;
using fused::Layout;
using fused::Operand;
using fused::Program;

float read(DType dtype, const void* base, std::int64_t offset) {
  switch (dtype) {
    case DType::kFloat16: return detail::half_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kBFloat16: return detail::bfloat16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    default: return static_cast<const float*>(base)[offset];
  }
}

// out[i] = fused::apply(C, a[i], b[i]) with the op known at compile time: the switch inside apply folds away, so the
// loop is the op itself (vectorised for the arithmetic ones), with the same per-element math as apply.
template <fused::Code C>
void apply_chunk(const float* __restrict a, const float* __restrict b, float* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = fused::apply(C, a[i], b[i]);
}

// Note [Vectorised exp on the CPU]
// std::exp is a call per element (a session running one SiLU over 12288 floats, the size of an activation of the tiny
// suite's EfficientNet, took 68 us a call on this project's 2-vCPU machine; 32 us with the loop below on AVX-512). exp
// and sigmoid chunks therefore take Cephes's expf, written without calls so that the loop vectorises: x = n ln2 + r
// with n = round(x / ln2) and r from a two-part ln2 (Cody-Waite), e^r by its degree-6 polynomial on |r| <= ln2 / 2,
// times 2^n built in the exponent bits. Its error is within 2 ulp of the exact value (std::exp: within 1);
// tests/python/test_fused_elementwise.py checks 2M points from -110 to 100 against numpy's float64 exp (about 1 ulp at
// most seen). Below -104 e^x is +0, std::exp's value (a masked attention score minus its row's maximum lies there:
// before, each took a std::exp call, which made a masked softmax 3.5x slower than an unmasked one). The other inputs
// whose 2^n would leave the normal floats (x between -104 and -87, or above 88) and NaN take std::exp in a second
// pass, so infinities, zeros, subnormals and NaN are std::exp's.
// The loop is IsaKernels::exp_f32 (cpu_isa_kernels.inc), compiled for each instruction set (Note [CPU instruction
// sets] in cpu_isa_baseline.cpp): 4, 8 or 16 floats a step.

// The plan's instruction-set table (CpuContext::isa) on the thread running evaluate's chunks: set at the start of
// each parallel_for task, read by exp_chunk (the chunk functions share one signature without it).
thread_local const IsaKernels* t_chunk_isa = nullptr;

// out[i] = e^a[i], or sigmoid's 1 / (1 + e^-a[i]).
template <bool kSigmoid>
void exp_chunk(const float* __restrict a, float* __restrict out, std::int64_t n) {
  const IsaKernels& isa = t_chunk_isa != nullptr ? *t_chunk_isa : isa_kernels();
  if (!isa.exp_f32(a, out, n, kSigmoid)) return;  // every argument inside exp_f32's range: usually
  const fused::Code code = kSigmoid ? fused::Code::kSigmoid : fused::Code::kExp;
  for (std::int64_t k = 0; k < n; ++k) {
    const float x = kSigmoid ? -a[k] : a[k];
    if (exp_outside(x)) out[k] = fused::apply(code, a[k], a[k]);
  }
}

template <>
void apply_chunk<fused::Code::kExp>(const float* __restrict a, const float*, float* __restrict out, std::int64_t n) {
  exp_chunk<false>(a, out, n);
}
template <>
void apply_chunk<fused::Code::kSigmoid>(const float* __restrict a, const float*, float* __restrict out,
                                        std::int64_t n) {
  exp_chunk<true>(a, out, n);
}

// tanh, erf and the GELUs in vectors (Note [Vectorised tanh, erf and GELU] in cpu_isa_baseline.cpp).
template <VectorMath M>
void math_chunk(const float* __restrict a, float* __restrict out, std::int64_t n) {
  const IsaKernels& isa = t_chunk_isa != nullptr ? *t_chunk_isa : isa_kernels();
  isa.math_f32(a, out, n, M);
}
template <>
void apply_chunk<fused::Code::kTanh>(const float* __restrict a, const float*, float* __restrict out, std::int64_t n) {
  math_chunk<VectorMath::kTanh>(a, out, n);
}
template <>
void apply_chunk<fused::Code::kErf>(const float* __restrict a, const float*, float* __restrict out, std::int64_t n) {
  math_chunk<VectorMath::kErf>(a, out, n);
}
template <>
void apply_chunk<fused::Code::kGelu>(const float* __restrict a, const float*, float* __restrict out, std::int64_t n) {
  math_chunk<VectorMath::kGelu>(a, out, n);
}
template <>
void apply_chunk<fused::Code::kGeluTanh>(const float* __restrict a, const float*, float* __restrict out,
                                         std::int64_t n) {
  math_chunk<VectorMath::kGeluTanh>(a, out, n);
}

using ChunkFn = void (*)(const float*, const float*, float*, std::int64_t);

// The chunk loop of every code, indexed by the code (the reductions' and rotate_half's are never called: those are
// evaluated elsewhere).
template <std::size_t... Codes>
constexpr std::array<ChunkFn, sizeof...(Codes)> chunk_table(std::index_sequence<Codes...>) {
  return {&apply_chunk<static_cast<fused::Code>(Codes)>...};
}
constexpr auto kChunkFns =
    chunk_table(std::make_index_sequence<static_cast<std::size_t>(fused::Code::kRotateHalf) + 1>());

// Where input k's elements for output elements begin, begin + 1, ... are (fused::Layout's strides: a broadcast input
// or a view): begin's coordinates decoded once, then a carry per step instead of a division per dimension and element.
class InputWalk {
 public:
  InputWalk(const fused::Layout& layout, std::size_t k, std::int64_t begin) : layout_(layout), k_(k) {
    XPURT_CHECK(layout.dims.size() <= 8, "fused_elementwise: more than 8 output dimensions");
    std::int64_t rest = begin;
    for (std::size_t d = layout.dims.size(); d-- > 0;) {
      coordinate_[d] = rest % layout.dims[d];
      offset_ += coordinate_[d] * layout.strides[k][d];
      rest /= layout.dims[d];
    }
  }
  std::int64_t offset() const { return offset_; }
  std::int64_t inner_coordinate() const { return coordinate_[layout_.dims.size() - 1]; }
  void next() { carry(layout_.dims.size()); }  // the next element
  // `count` elements on along the innermost axis, staying within its row (or ending at its end: the next row).
  void advance_in_row(std::int64_t count) {
    const std::size_t inner = layout_.dims.size() - 1;
    if (coordinate_[inner] + count >= layout_.dims[inner]) {
      next_row();
      return;
    }
    coordinate_[inner] += count;
    offset_ += count * layout_.strides[k_][inner];
  }
  void next_row() {  // the start of the next row of the innermost axis
    const std::size_t inner = layout_.dims.size() - 1;
    offset_ -= coordinate_[inner] * layout_.strides[k_][inner];
    coordinate_[inner] = 0;
    carry(inner);
  }

 private:
  void carry(std::size_t axes) {  // one step of axis axes - 1, carried into the ones before
    for (std::size_t d = axes; d-- > 0;) {
      offset_ += layout_.strides[k_][d];
      if (++coordinate_[d] < layout_.dims[d]) break;
      offset_ -= coordinate_[d] * layout_.strides[k_][d];
      coordinate_[d] = 0;
    }
  }
  const fused::Layout& layout_;
  const std::size_t k_;
  std::int64_t coordinate_[8] = {};
  std::int64_t offset_ = 0;
};

// Elements [begin, begin + n) of input k in float32.
void load_input(const fused::Layout& layout, std::size_t k, DType dtype, const void* base, std::int64_t begin,
                std::int64_t n, float* out) {
  if (layout.full(k)) {
    if (dtype == DType::kFloat32) {
      std::copy(static_cast<const float*>(base) + begin, static_cast<const float*>(base) + begin + n, out);
    } else {
      for (std::int64_t i = 0; i < n; ++i) out[i] = read(dtype, base, begin + i);
    }
    return;
  }
  InputWalk walk(layout, k, begin);
  const std::size_t inner = layout.dims.size() - 1;
  const std::int64_t step = layout.strides[k][inner];
  if (step == 0 || step == 1) {
    // Runs along the innermost axis: contiguous (a view's rows, Note [Inputs read through a view]) or one value
    // (a broadcast): a copy or a fill per run instead of a coordinate step per element.
    for (std::int64_t i = 0; i < n;) {
      const std::int64_t run = std::min(n - i, layout.dims[inner] - walk.inner_coordinate());
      const std::int64_t offset = walk.offset();
      if (step == 0) {
        std::fill(out + i, out + i + run, read(dtype, base, offset));
      } else if (dtype == DType::kFloat32) {
        std::copy(static_cast<const float*>(base) + offset, static_cast<const float*>(base) + offset + run, out + i);
      } else {
        for (std::int64_t j = 0; j < run; ++j) out[i + j] = read(dtype, base, offset + j);
      }
      i += run;
      walk.next_row();
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i, walk.next()) out[i] = read(dtype, base, walk.offset());
}

// rotate_half of input k (Note [Fused elementwise programs]) for output elements [begin, begin + n) into out.
void rotate_half_into(const Layout& layout, std::size_t k, DType dtype, const void* input, std::int64_t begin,
                      std::int64_t n, float* out) {
  const std::int64_t half = layout.last / 2, step = layout.strides[k].back();
  InputWalk walk(layout, k, begin);  // the chunk's offsets into input k
  if (step == 1 && dtype == DType::kFloat32) {
    // A contiguous float32 last axis: the chunk in runs that stay within one row of the rotated axis and of the
    // walk's innermost axis, each a negated copy of the upper half and a copy of the lower one.
    const auto* x = static_cast<const float*>(input);
    const std::int64_t inner = layout.dims.back();
    for (std::int64_t i = 0; i < n;) {
      const std::int64_t c = (begin + i) % layout.last;
      const std::int64_t run = std::min({n - i, (c < half ? half : layout.last) - c, inner - walk.inner_coordinate()});
      const float* from = x + walk.offset() + (c < half ? half : -half);
      float* to = out + i;
      if (c < half) {
        for (std::int64_t t = 0; t < run; ++t) to[t] = -from[t];
      } else {
        for (std::int64_t t = 0; t < run; ++t) to[t] = from[t];
      }
      i += run;
      walk.advance_in_row(run);
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i, walk.next()) {
    const bool negates = fused::rotate_half_negates((begin + i) % layout.last, layout.last);
    const float v = read(dtype, input, walk.offset() + (negates ? half : -half) * step);
    out[i] = negates ? -v : v;
  }
}

// n values from `result` to output elements [at, at + n) of `output` (of `output_dtype`, int8/uint8/float8 quantized
// by `quantization`).
void write_values(DType output_dtype, const fused::OutputQuantization& quantization, void* output, const float* result,
                  std::int64_t at, std::int64_t n) {
  switch (output_dtype) {
    case DType::kFloat16: {
      auto* y = static_cast<std::uint16_t*>(output) + at;
      for (std::int64_t i = 0; i < n; ++i) y[i] = detail::float_to_half(result[i]);
      break;
    }
    case DType::kBFloat16: {
      auto* y = static_cast<std::uint16_t*>(output) + at;
      for (std::int64_t i = 0; i < n; ++i) y[i] = detail::float_to_bfloat16(result[i]);
      break;
    }
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2: {  // Note [Quantized output of a fused program]
      auto* y = static_cast<std::uint8_t*>(output) + at;
      for (std::int64_t i = 0; i < n; ++i) y[i] = fused::quantized_byte(result[i], quantization, output_dtype);
      break;
    }
    default: std::copy(result, result + n, static_cast<float*>(output) + at);
  }
}

// Where output element i is stored: at i (run 0: contiguous), or, for a piece of a concatenation (Note [Pieces of a
// concatenation]), at (i / run) * stride + i % run: rows of `run` elements `stride` apart.
struct OutputRows {
  std::int64_t run = 0, stride = 0;
};

// Runs `program` for `layout`: inputs of `input_dtypes` (float32, float16, bfloat16), an output of `output_dtype`
// (int8/uint8 quantized by `quantization`) stored as `rows` says. Without a reduction, over 256-element chunks of the
// output; with reductions, row by row (Note [Row
// programs] in fused_elementwise.cpp): one pass over the row's chunks per reduction, then one that writes the row.
void evaluate(const Program& program, const Layout& layout, const std::vector<DType>& input_dtypes, DType output_dtype,
              const fused::OutputQuantization& quantization, const std::vector<const void*>& inputs, void* output,
              int threads, const IsaKernels& isa, OutputRows rows = {}) {
  constexpr std::int64_t kChunk = 256;
  const std::size_t num_inputs = inputs.size();
  std::vector<char> full(num_inputs), scalar(num_inputs);
  for (std::size_t k = 0; k < num_inputs; ++k) {
    full[k] = layout.full(k);
    scalar[k] = layout.scalar(k);
  }
  const std::size_t slots = num_inputs + program.code.size();
  // Where operand o's values sit in a chunk's registers.
  auto slot = [&](const Operand& o) {
    return (o.input ? static_cast<std::size_t>(o.index) : num_inputs + static_cast<std::size_t>(o.index)) * kChunk;
  };
  fused::check_rotate_half(program, layout);
  std::vector<ChunkFn> chunk_fns;
  for (const Instruction& in : program.code) {
    const auto index = static_cast<std::size_t>(in.code);  // kRotateHalf is the last code (fused_elementwise.h)
    XPURT_CHECK(index < kChunkFns.size(), "fused_elementwise: code ", index, " has no cpu loop");
    chunk_fns.push_back(kChunkFns[index]);
  }
  // Instructions [0, upto) over output elements [begin, begin + n) into regs; reduction j reads reduced[j], or with
  // `row_length` > 0 (a chunk of whole rows of that length, Note [Short rows in one chunk]) reduced[j * kChunk + q]
  // for the chunk's row q.
  auto compute = [&](std::vector<float>& regs, std::int64_t begin, std::int64_t n, std::size_t upto,
                     const std::vector<float>& reduced, std::int64_t row_length = 0) {
    for (std::size_t k = 0; k < num_inputs; ++k) {
      float* r = regs.data() + k * kChunk;
      if (scalar[k]) {
        std::fill(r, r + n, read(input_dtypes[k], inputs[k], 0));
      } else {
        load_input(layout, k, input_dtypes[k], inputs[k], begin, n, r);
      }
    }
    for (std::size_t j = 0; j < upto; ++j) {
      const Instruction& in = program.code[j];
      float* out = regs.data() + (num_inputs + j) * kChunk;
      if (fused::is_reduction(in.code)) {
        if (row_length == 0) {
          std::fill(out, out + n, reduced[j]);
        } else {
          for (std::int64_t q = 0; q * row_length < n; ++q) {
            std::fill(out + q * row_length, out + (q + 1) * row_length,
                      reduced[j * kChunk + static_cast<std::size_t>(q)]);
          }
        }
        continue;
      }
      if (in.code == fused::Code::kRotateHalf) {  // Note [Fused elementwise programs]: rotate_half
        const auto k = static_cast<std::size_t>(in.a.index);
        rotate_half_into(layout, k, input_dtypes[k], inputs[k], begin, n, out);
        continue;
      }
      const float* a = regs.data() + slot(in.a);
      const float* b = fused::is_binary(in.code) ? regs.data() + slot(in.b) : a;
      chunk_fns[j](a, b, out, n);
    }
  };
  auto write = [&](const float* result, std::int64_t at, std::int64_t n) {
    write_values(output_dtype, quantization, output, result, at, n);
  };
  auto store = [&](const std::vector<float>& regs, std::int64_t begin, std::int64_t n) {
    const float* result = regs.data() + (slots - 1) * kChunk;
    if (rows.run == 0) {
      write(result, begin, n);
      return;
    }
    for (std::int64_t k = 0; k < n;) {  // a run of the row at a time
      const std::int64_t i = begin + k, row = i / rows.run, at = i - row * rows.run;
      const std::int64_t count = std::min(n - k, rows.run - at);
      write(result + k, row * rows.stride + at, count);
      k += count;
    }
  };
  if (!program.reduces()) {
    const std::int64_t chunks = (layout.numel + kChunk - 1) / kChunk;
    parallel_for(chunks, threads, 16, [&](std::int64_t c0, std::int64_t c1) {
      t_chunk_isa = &isa;
      std::vector<float> regs(slots * kChunk);
      const std::vector<float> none;
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::int64_t begin = c * kChunk;
        const std::int64_t n = std::min(kChunk, layout.numel - begin);
        compute(regs, begin, n, program.code.size(), none);
        store(regs, begin, n);
      }
    });
    return;
  }
  if (layout.numel == 0) return;
  const std::int64_t row = layout.row;
  if (row < kChunk / 2) {
    // Note [Short rows in one chunk]
    // Rows much shorter than a chunk (an RMSNorm over 32 or 64 features, a softmax over a few keys) took one chunk
    // each, twice: the loads, the instruction dispatch and the broadcast inputs' walks per row cost more than the row's
    // arithmetic (the tiny Llama's RMSNorms over [3, 11, 32]: 8-11 us a node, 2026-12-05). A chunk holds as many whole
    // rows as fit instead: each reduction is taken per row over the chunk's values (in the same order as a row alone,
    // so the same result), and every element reads its own row's.
    const std::int64_t per_chunk = kChunk / row;
    const std::int64_t groups = (layout.rows() + per_chunk - 1) / per_chunk;
    parallel_for(groups, threads, std::max<std::int64_t>(1, 16), [&](std::int64_t g0, std::int64_t g1) {
      t_chunk_isa = &isa;
      std::vector<float> regs(slots * kChunk);
      std::vector<float> reduced(program.code.size() * kChunk, 0.0f);
      for (std::int64_t g = g0; g < g1; ++g) {
        const std::int64_t begin = g * per_chunk * row;
        const std::int64_t n = std::min(per_chunk * row, layout.numel - begin);
        for (std::size_t j = 0; j < program.code.size(); ++j) {
          const Instruction& in = program.code[j];
          if (!fused::is_reduction(in.code)) continue;
          compute(regs, begin, n, j, reduced, row);
          const float* v = regs.data() + slot(in.a);
          for (std::int64_t q = 0; q * row < n; ++q) {
            float acc = fused::reduce_init(in.code);
            for (std::int64_t i = q * row; i < (q + 1) * row; ++i) acc = fused::reduce_step(in.code, acc, v[i]);
            reduced[j * kChunk + static_cast<std::size_t>(q)] = fused::reduce_finish(in.code, acc, row);
          }
        }
        compute(regs, begin, n, program.code.size(), reduced, row);
        store(regs, begin, n);
      }
    });
    return;
  }
  parallel_for(layout.rows(), threads, std::max<std::int64_t>(1, 4096 / row), [&](std::int64_t r0, std::int64_t r1) {
    t_chunk_isa = &isa;
    std::vector<float> regs(slots * kChunk);
    std::vector<float> reduced(program.code.size(), 0.0f);
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::size_t j = 0; j < program.code.size(); ++j) {
        const Instruction& in = program.code[j];
        if (!fused::is_reduction(in.code)) continue;
        float acc = fused::reduce_init(in.code);
        for (std::int64_t begin = r * row; begin < (r + 1) * row; begin += kChunk) {
          const std::int64_t n = std::min(kChunk, (r + 1) * row - begin);
          compute(regs, begin, n, j, reduced);
          const float* v = regs.data() + slot(in.a);
          for (std::int64_t i = 0; i < n; ++i) acc = fused::reduce_step(in.code, acc, v[i]);
        }
        reduced[j] = fused::reduce_finish(in.code, acc, row);
      }
      for (std::int64_t begin = r * row; begin < (r + 1) * row; begin += kChunk) {
        const std::int64_t n = std::min(kChunk, (r + 1) * row - begin);
        compute(regs, begin, n, program.code.size(), reduced);
        store(regs, begin, n);
      }
    }
  });
}

// A pieced node (Note [Pieces of a concatenation]): each piece evaluated straight into its slabs of the output (rows
// of n_p * inner elements, the output's rows of the axis times inner apart).
void evaluate_pieces(const fused::Pieces& pieces, const std::vector<Layout>& layouts,
                     const std::vector<DType>& input_dtypes, DType output_dtype,
                     const std::vector<const void*>& inputs, void* output, const std::vector<std::int64_t>& shape,
                     int threads, const IsaKernels& isa) {
  const std::int64_t inner = pieces.inner(shape);
  const auto element = static_cast<std::int64_t>(dtype_size(output_dtype));
  std::int64_t start = 0;
  for (std::size_t p = 0; p < pieces.pieces.size(); ++p) {
    const fused::Piece& piece = pieces.pieces[p];
    std::vector<const void*> piece_inputs;
    for (std::size_t k : piece.inputs) piece_inputs.push_back(inputs[k]);
    OutputRows rows;
    rows.run = piece.size * inner;
    rows.stride = shape[static_cast<std::size_t>(pieces.axis)] * inner;
    evaluate(piece.program, layouts[p], fused::piece_dtypes(piece, input_dtypes), output_dtype, {}, piece_inputs,
             static_cast<char*>(output) + start * inner * element, threads, isa, rows.run > 0 ? rows : OutputRows{});
    start += piece.size;
  }
}

// The parsed program of `text` over `num_inputs` inputs, kept per thread: a node's program is the same text on every
// run, and parsing it again (its checks, a dynamic_cast per instruction) cost 3% of a small CNN's run. The cache
// holds at most kParsedPrograms programs (cleared past that: a process running many plans parses again).
const Program& parsed_program(const std::string& text, std::size_t num_inputs) {
  constexpr std::size_t kParsedPrograms = 4096;
  thread_local std::unordered_map<std::string, std::pair<std::size_t, Program>> cache;
  auto found = cache.find(text);
  if (found != cache.end() && found->second.first == num_inputs) return found->second.second;
  Program program = fused::parse(text, num_inputs);  // throws for a bad program: nothing is cached
  if (cache.size() >= kParsedPrograms) cache.clear();
  auto& entry = cache[text];
  entry = {num_inputs, std::move(program)};
  return entry.second;
}

// A pieced node's parsed pieces (Note [Pieces of a concatenation]), kept per thread like parsed_program's programs:
// parsing the pieces' programs on every run made GPT-NeoX's pieced kernels half as slow again as the three nodes
// they replaced.
const fused::Pieces& parsed_pieces(const Attributes& attrs, std::size_t num_inputs) {
  constexpr std::size_t kParsedPieces = 1024;
  thread_local std::map<std::tuple<std::string, std::vector<std::int64_t>, std::size_t>, fused::Pieces> cache;
  auto key = std::make_tuple(attrs.get_string("program", ""), attrs.get_ints("pieces", {}), num_inputs);
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  fused::Pieces pieces = fused::pieces(attrs, num_inputs);  // throws for bad pieces: nothing is cached
  if (cache.size() >= kParsedPieces) cache.clear();
  return cache[std::move(key)] = std::move(pieces);
}

}  // namespace

void register_fused_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "fused_elementwise",
                 "the program interpreted over 256-element chunks of the output (rows, for a program that reduces), "
                 "float32 math, OpenMP over chunks or rows",
                 [](const KernelLaunch& launch, const CpuContext& context) {
                   const OpDescriptor& desc = *launch.desc;
                   std::vector<std::vector<std::int64_t>> stored;
                   std::vector<const void*> inputs;
                   std::vector<DType> dtypes;
                   for (std::size_t k = 0; k < launch.num_inputs; ++k) {
                     stored.push_back(launch.input(k).shape());
                     inputs.push_back(launch.input(k).data_ptr());
                     dtypes.push_back(launch.input(k).dtype());
                   }
                   // Note [Inputs read through a view]: the view's strides, its offset added to the pointer
                   const fused::InputViews views = fused::input_views(desc.attrs, stored);
                   for (std::size_t k = 0; k < views.size(); ++k) {
                     if (views[k]) {
                       inputs[k] = static_cast<const char*>(inputs[k]) +
                                   views[k]->offset * static_cast<std::int64_t>(dtype_size(dtypes[k]));
                     }
                   }
                   const DType out = launch.output(0).dtype();
                   if (desc.attrs.has("pieces")) {  // Note [Pieces of a concatenation]
                     const fused::Pieces& pieces = parsed_pieces(desc.attrs, desc.inputs.size());
                     const std::vector<std::int64_t>& shape = launch.output(0).shape();
                     evaluate_pieces(pieces, fused::piece_layouts(pieces, fused::read_shapes(views, stored), views,
                                                                  shape),
                                     dtypes, out, inputs, launch.output(0).data_ptr(), shape, context.threads,
                                     *context.isa);
                     return;
                   }
                   const Program& program = parsed_program(desc.attrs.get_string("program", ""), desc.inputs.size());
                   const Layout layout = fused::layout(fused::read_shapes(views, stored), launch.output(0).shape(),
                                                       desc.attrs.get_int("row_axes", 0), views);
                   const fused::OutputQuantization quantization =
                       fused::quantized_output(out) ? fused::output_quantization(desc.attrs, out)
                                                    : fused::OutputQuantization();
                   evaluate(program, layout, dtypes, out, quantization, inputs, launch.output(0).data_ptr(),
                            context.threads, *context.isa);
                 },
                 // the op schema takes float inputs, and a float or (quantized) int8/uint8/float8 output
                 DTypeSet::kAll);
}

}  // namespace xpuruntime::cpu
