// Normalizations of the cpu backend: batch_norm (inference), softmax (any axis), layer_norm (dims axis..end).
// Statistics accumulate in double (Note [The cpu backend as the oracle], cpu_common.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_isa.h"
#include "core/fused_elementwise.h"

namespace xpuruntime::cpu {

namespace {

std::int64_t normalized_axis(const OpDescriptor& desc, int rank) {
  const std::int64_t axis = desc.attrs.get_int("axis", -1);
  return axis < 0 ? axis + rank : axis;
}

// y = (x - mean) / sqrt(var + eps) * scale + bias over channel axis 1 of x[N, C, ...].
template <typename T>
void run_batch_norm(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x_tensor = launch.input(0);
  const auto& shape = x_tensor.shape();
  const std::int64_t channels = shape[1];
  const std::int64_t inner = product(shape, 2, shape.size());
  const std::int64_t planes = shape[0] * channels;
  const double epsilon = launch.desc->attrs.get_float("epsilon", 1e-5);
  InputBuffer<T> x(x_tensor);
  InputBuffer<T> scale(launch.input(1));
  InputBuffer<T> bias(launch.input(2));
  InputBuffer<T> mean(launch.input(3));
  InputBuffer<T> var(launch.input(4));
  OutputBuffer<T> y(launch.output(0));
  // Per channel: y = x * a + b, with a and b computed once in double.
  std::vector<double> mul(static_cast<std::size_t>(channels)), add(static_cast<std::size_t>(channels));
  for (std::int64_t c = 0; c < channels; ++c) {
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(var[c]) + epsilon);
    mul[c] = static_cast<double>(scale[c]) * inv_std;
    add[c] = static_cast<double>(bias[c]) - static_cast<double>(mean[c]) * mul[c];
  }
  const T* in = x.data();
  T* out = y.data();
  parallel_for(planes, context.threads, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(inner, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t plane = begin; plane < end; ++plane) {
                   const double a = mul[plane % channels], b = add[plane % channels];
                   for (std::int64_t i = 0; i < inner; ++i) {
                     out[plane * inner + i] = static_cast<T>(static_cast<double>(in[plane * inner + i]) * a + b);
                   }
                 }
               });
  y.commit();
}

// Note [Softmax rows in vectors]
// A float32 softmax over the last axis (attention's scores: one row per query and head, the keys along it) spent its
// time in one std::exp call per element and a sum chained through one double (a decode step of 16 rows of 4097 keys:
// 198 us, 9% of its memory floor, 2026-12-05); then, with the vectorised exp but scalar loops around it (the maximum,
// the subtraction, a double sum of eight partials, the scale), 4x ONNX Runtime's time on a [1, 12, 128, 128] row set
// (215 against 55 us, 2026-12-05 22:25 UTC). Now the whole row is IsaKernels::softmax_row_f32, in vectors of the
// instruction set: the maximum (exact) with the NaN check, e^(x - max) by exp_f32's arithmetic (Note [Vectorised exp
// on the CPU] in cpu_fused.cpp: within 2 ulp; below -104, where masked scores lie, exactly 0; subnormal results from
// std::exp), their sum with Kahan's compensation in each lane (its error a few float ulps of the total, not the
// lanes' count of roundings) added up in double, and one multiply by the reciprocal. NaN and +inf rows give NaN, and
// so does a row of only -inf, as the general loop below does. Each pass runs two independent chains and the lanes
// are reduced by halving: with one Kahan chain and loops over the lanes, a 128-key row's fixed cost equalled its
// arithmetic (avx512, one thread: 1.22 -> 0.65 ns an element at 128 keys, 5.8 -> 2.1 at 16, 0.62 -> 0.49 at 8192;
// cpu_softmax_bench's [1, 12, 128, 128] 284 -> 134 us, 2026-12-06).
void softmax_rows_f32(const float* in, float* out, std::int64_t rows, std::int64_t length, const CpuContext& context) {
  const IsaKernels& isa = isa_of(context);
  parallel_for(rows, context.threads, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(length, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t row = begin; row < end; ++row) {
                   float* y = out + row * length;
                   if (!isa.softmax_row_f32(in + row * length, y, length)) {
                     std::fill(y, y + length, std::numeric_limits<float>::quiet_NaN());
                   }
                 }
               });
}

// Note [Softmax along any axis]
// Softmax (and log_softmax) over an axis that is not the last walked each (outer, inner) line on its own: a strided
// read per element and one std::exp call each, 3x ONNX Runtime's time on [4099, 257] along axis 0 (2026-12-07); and
// log_softmax, on the ONNX reference library, 17x on rows of 50,257 (an LM head's log-probabilities). In float32 the
// lines now go in blocks of up to kAxisLanes neighbouring lines (the inner dimension, contiguous): the maximum per
// lane over the axis, then e^(x - max) by exp_f32's vectors, kRowChunk floats of the block's rows a call (std::exp
// where it declines: the subnormal results), summed per lane in double, then the scale (softmax: e / sum, rounded
// once) or, for log_softmax, x - max - log(sum) in double, rounded once. Rows of log_softmax (inner 1) take the same
// steps along the row (Note [Log-softmax rows in vectors]). A line holding NaN or +inf, or only -inf, gives NaN, as
// torch.softmax and the general loop below have it: no check, the NaN of x - max reaches the line's sum.
constexpr std::int64_t kAxisLanes = 256;
constexpr std::int64_t kRowChunk = 2048;  // floats of e^(x - max) a call of exp_f32 makes, in L1

// Note [Log-softmax rows in vectors]
// A row of log_softmax: its maximum, the sum of e^(x - max), then x - (max + log(sum)) in double, rounded once.
// Written here, compiled for the baseline, its maximum waited on one vmaxps a step, e^(x - max) went through memory
// (x - max, then exp_f32 in place) and was summed in one chain of 8 double partials, and the last pass ran two doubles
// at a time: LogSoftmax over 64 rows of 50,257 (an LM head's log-probabilities) took 1.8x ONNX Runtime's time on one
// thread (2026-12-07). IsaKernels::log_softmax_row_f32 runs in each instruction set's vectors: the maximum in four
// chains of 8 lanes, the exponentials made in registers and added into two compensated float sums per lane (Kahan's,
// as Note [Softmax rows in vectors]; summed in double partials from memory instead, with the conversions, it was 20%
// slower), the last pass 8 doubles at a time. A row with an exponential outside exp_f32's range (a subnormal result,
// NaN, an infinite maximum) is summed again through memory with std::exp there. The sums' order is fixed: the bits do
// not depend on the threads. Computing the last pass in float, x minus the shift in two parts, gained nothing.

// lanes[j] = max(lanes[j], x[j]) over n floats (NaN never wins: the sums carry it). SSE2's maxps is that select;
// the compiler keeps the loop scalar (float max is not associative under NaN), a store and reload per element: 70%
// of log_softmax's time on rows of 50,257.
void max_into(float* lanes, const float* x, std::int64_t n) {
  std::int64_t j = 0;
#if defined(__SSE2__)
  for (; j + 4 <= n; j += 4) _mm_storeu_ps(lanes + j, _mm_max_ps(_mm_loadu_ps(x + j), _mm_loadu_ps(lanes + j)));
#endif
  for (; j < n; ++j) lanes[j] = x[j] > lanes[j] ? x[j] : lanes[j];
}

// One block of `width` neighbouring lines of [length, inner] at `in` (Note [Softmax along any axis]).
// The block's rows go to exp_f32 kRowChunk / width at a time, gathered into one buffer as x - max (a call per row
// of 31 or 65 lanes cost more than its arithmetic: softmax over axis 1 of [17, 4099, 31], over axis 0 of
// [4099, 257] in four blocks).
void softmax_block_f32(const IsaKernels& isa, const float* in, float* out, std::int64_t length, std::int64_t inner,
                       std::int64_t width, bool log) {
  float max_value[kAxisLanes], t[kRowChunk];
  double sum[kAxisLanes];
  std::fill(max_value, max_value + width, -std::numeric_limits<float>::infinity());
  std::fill(sum, sum + width, 0.0);
  for (std::int64_t i = 0; i < length; ++i) max_into(max_value, in + i * inner, width);
  const std::int64_t step = kRowChunk / width;  // rows a call of exp_f32
  for (std::int64_t i = 0; i < length; i += step) {
    const std::int64_t rows = std::min(step, length - i);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = in + (i + r) * inner;
      for (std::int64_t j = 0; j < width; ++j) t[r * width + j] = row[j] - max_value[j];
    }
    if (isa.exp_f32(t, t, rows * width, false)) {  // std::exp where it declines, from x (as exp_shifted)
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = in + (i + r) * inner;
        for (std::int64_t j = 0; j < width; ++j) {
          const float d = row[j] - max_value[j];
          if (exp_outside(d)) t[r * width + j] = std::exp(d);
        }
      }
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < width; ++j) sum[j] += static_cast<double>(t[r * width + j]);
      if (!log) std::copy(t + r * width, t + (r + 1) * width, out + (i + r) * inner);
    }
  }
  for (std::int64_t j = 0; j < width; ++j) sum[j] = log ? std::log(sum[j]) : 1.0 / sum[j];
  for (std::int64_t i = 0; i < length; ++i) {
    const float* row = in + i * inner;
    float* y = out + i * inner;
    if (log) {
      for (std::int64_t j = 0; j < width; ++j) {
        y[j] = static_cast<float>(static_cast<double>(row[j]) - static_cast<double>(max_value[j]) - sum[j]);
      }
    } else {
      for (std::int64_t j = 0; j < width; ++j) y[j] = static_cast<float>(static_cast<double>(y[j]) * sum[j]);
    }
  }
}

// Softmax or log_softmax of float32 x viewed as [outer, length, inner] (Note [Softmax along any axis]): log_softmax
// rows one by one, other shapes in blocks of neighbouring lines.
void softmax_lines_f32(const float* in, float* out, std::int64_t outer, std::int64_t length, std::int64_t inner,
                       bool log, const CpuContext& context) {
  const IsaKernels& isa = isa_of(context);
  if (inner == 1) {
    parallel_for(outer, context.threads, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(length, 1)),
                 [&](std::int64_t begin, std::int64_t end) {
                   ScratchVector<float> t(static_cast<std::size_t>(std::min(length, kLogSoftmaxChunk)));
                   for (std::int64_t row = begin; row < end; ++row) {
                     isa.log_softmax_row_f32(in + row * length, out + row * length, length, t.data());
                   }
                 });
    return;
  }
  // Blocks of equal width, at least two per thread where the lines allow (16 or more a block); a lane's result does
  // not depend on its block.
  const auto ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  const std::int64_t wanted = std::min(ceil_div(2 * context.threads, outer), ceil_div(inner, 16));
  const std::int64_t blocks = std::max(ceil_div(inner, kAxisLanes), wanted);
  const std::int64_t width = ceil_div(inner, blocks);
  const std::int64_t grain = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(length * width, 1));
  parallel_for(outer * blocks, context.threads, grain,
               [&](std::int64_t begin, std::int64_t end) {
                 for (std::int64_t item = begin; item < end; ++item) {
                   const std::int64_t o = item / blocks, j0 = item % blocks * width;
                   if (j0 >= inner) continue;
                   const std::int64_t base = o * length * inner + j0;
                   softmax_block_f32(isa, in + base, out + base, length, inner, std::min(width, inner - j0), log);
                 }
               });
}

// Softmax along one axis: x viewed as [outer, length, inner]; each (outer, inner) line is independent.
// Stable: exp(x - max). A line that is all -inf, or holds a NaN or +inf, gives NaN (as torch.softmax does).
template <typename T>
void run_softmax(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x_tensor = launch.input(0);
  const auto& shape = x_tensor.shape();
  const std::int64_t axis = normalized_axis(*launch.desc, x_tensor.dim());
  const std::int64_t outer = product(shape, 0, static_cast<std::size_t>(axis));
  const std::int64_t length = shape[static_cast<std::size_t>(axis)];
  const std::int64_t inner = product(shape, static_cast<std::size_t>(axis) + 1, shape.size());
  InputBuffer<T> x(x_tensor);
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  T* out = y.data();
  if constexpr (std::is_same_v<T, float>) {
    if (inner == 1 && length > 0) {  // Note [Softmax rows in vectors]
      softmax_rows_f32(in, out, outer, length, context);
      y.commit();
      return;
    }
    if (length > 0) {  // Note [Softmax along any axis]
      softmax_lines_f32(in, out, outer, length, inner, /*log=*/false, context);
      y.commit();
      return;
    }
  }
  parallel_for(outer * inner, context.threads, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(length, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 ScratchVector<double> e(static_cast<std::size_t>(length));
                 for (std::int64_t line = begin; line < end; ++line) {
                   const std::int64_t base = (line / inner) * length * inner + line % inner;
                   double max_value = -std::numeric_limits<double>::infinity();
                   bool has_nan = false;
                   for (std::int64_t i = 0; i < length; ++i) {
                     const double v = static_cast<double>(in[base + i * inner]);
                     has_nan = has_nan || v != v;
                     max_value = std::max(max_value, v);
                   }
                   // exp in the compute type (max_value is one of the inputs, so x - max is exact or
                   // correctly rounded), the sum in double.
                   const T shift = static_cast<T>(max_value);
                   double sum = 0.0;
                   for (std::int64_t i = 0; i < length; ++i) {
                     e[i] = static_cast<double>(std::exp(in[base + i * inner] - shift));
                     sum += e[i];
                   }
                   for (std::int64_t i = 0; i < length; ++i) {
                     out[base + i * inner] = has_nan ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(e[i] / sum);
                   }
                 }
               });
  y.commit();
}

// layer_norm's second output (Note [Quantized layer norm output] in core/op_schemas.cpp): QuantizeLinear per tensor
// of output 0 as stored, read back as float32 (16-bit values widened exactly).
void quantize_output(const KernelLaunch& launch, const CpuContext& context) {
  const InputBuffer<float> y(launch.output(0));
  Tensor& yq = launch.output(1);
  const fused::OutputQuantization q = fused::output_quantization(launch.desc->attrs, yq.dtype());
  const DType out = yq.dtype();
  auto* bytes = static_cast<std::uint8_t*>(yq.data_ptr());
  parallel_for(y.size(), context.threads, 16384, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) bytes[i] = fused::quantized_byte(y[i], q, out);
  });
}

// Note [Layer norm rows in independent chains]
// A row's mean and squares are sums in sixteen double chains (wide_sums: four chains and one before them were each
// slower, one chain taking 3.7x ONNX Runtime's time on InstanceNormalization of [2, 64, 128, 128]), and the row is
// written by a loop per combination of the optional operands (gamma, beta, the addend), chosen once per row: with
// the tests inside, the compiler kept the loop scalar (the layer_norm of that InstanceNormalization, rows of 16,384:
// 2.35 ms of a profiled 5.5 ms, 2.17 ms since; the whole op 4.0 -> 3.7 ms against ONNX Runtime's 0.98 ms, this
// machine, one thread, 2026-12-07: the rest is the per-channel affine after it, a fused_elementwise pass, and the
// output's fresh pages). The arithmetic is the same per element: (x - mean) * inv_std, times gamma, plus beta, plus
// the addend, in double, rounded once to T. For float the row is IsaKernels::layer_norm_row_f32 (the same sums and
// loops compiled for each instruction set, cpu_isa_kernels.inc): with AVX-512's eight doubles a vector in place of
// SSE2's two, that layer_norm went from 1.4 to 0.75 ms and the InstanceNormalization from 3.85 to 3.02 ms (this
// machine, one thread, 2026-12-07).
template <bool kGamma, bool kBeta, bool kAddend, typename T>
void normalize_row_as(const T* __restrict src, std::int64_t size, double mean, double inv_std,
                      const T* __restrict gamma, const T* __restrict beta, const T* __restrict addend,
                      T* __restrict dst) {
  for (std::int64_t i = 0; i < size; ++i) {
    double v = (static_cast<double>(src[i]) - mean) * inv_std;
    if constexpr (kGamma) v *= static_cast<double>(gamma[i]);
    if constexpr (kBeta) v += static_cast<double>(beta[i]);
    if constexpr (kAddend) v += static_cast<double>(addend[i]);  // rounded once
    dst[i] = static_cast<T>(v);
  }
}

template <typename T>
void normalize_row(const T* src, std::int64_t size, double mean, double inv_std, const T* gamma, const T* beta,
                   const T* addend, T* dst) {
  const int which = (gamma != nullptr ? 4 : 0) | (beta != nullptr ? 2 : 0) | (addend != nullptr ? 1 : 0);
  switch (which) {
    case 0: return normalize_row_as<false, false, false>(src, size, mean, inv_std, gamma, beta, addend, dst);
    case 1: return normalize_row_as<false, false, true>(src, size, mean, inv_std, gamma, beta, addend, dst);
    case 2: return normalize_row_as<false, true, false>(src, size, mean, inv_std, gamma, beta, addend, dst);
    case 3: return normalize_row_as<false, true, true>(src, size, mean, inv_std, gamma, beta, addend, dst);
    case 4: return normalize_row_as<true, false, false>(src, size, mean, inv_std, gamma, beta, addend, dst);
    case 5: return normalize_row_as<true, false, true>(src, size, mean, inv_std, gamma, beta, addend, dst);
    case 6: return normalize_row_as<true, true, false>(src, size, mean, inv_std, gamma, beta, addend, dst);
    default: return normalize_row_as<true, true, true>(src, size, mean, inv_std, gamma, beta, addend, dst);
  }
}

// layer_norm over dims axis..end: x viewed as [outer, size]; y = (x - mean) / sqrt(var + eps) * scale + bias,
// var biased (divided by size), two passes in double.
template <typename T>
void run_layer_norm(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x_tensor = launch.input(0);
  const auto& shape = x_tensor.shape();
  const std::int64_t axis = normalized_axis(*launch.desc, x_tensor.dim());
  const std::int64_t outer = product(shape, 0, static_cast<std::size_t>(axis));
  const std::int64_t size = product(shape, static_cast<std::size_t>(axis), shape.size());
  const double epsilon = launch.desc->attrs.get_float("epsilon", 1e-5);
  InputBuffer<T> x(x_tensor);
  InputBuffer<T> scale(launch.num_inputs > 1 ? launch.input(1) : Tensor());
  InputBuffer<T> bias(launch.num_inputs > 2 ? launch.input(2) : Tensor());
  InputBuffer<T> residual(launch.num_inputs > 3 ? launch.input(3) : Tensor());
  InputBuffer<T> addend_in(launch.num_inputs > 4 ? launch.input(4) : Tensor());
  const T* res = residual.data();
  const T* addend = addend_in.data();
  OutputBuffer<T> y(launch.output(0));
  const T* in = x.data();
  const T* gamma = scale.data();
  const T* beta = bias.data();
  T* out = y.data();
  const IsaKernels& isa = isa_of(context);
  // Note [Per-row affine of a layer norm]: run k of row r (runs of affine_run elements, the row when 0) takes
  // scale[(r * runs + k) % period] and bias[(r * runs + k) % period].
  const std::int64_t period = launch.desc->attrs.get_int("row_affine", 0) == 0 ? 0
                              : gamma != nullptr                               ? scale.size()
                              : beta != nullptr                                ? bias.size()
                                                                               : 0;
  const std::int64_t affine_run = period > 0 ? launch.desc->attrs.get_int("affine_run", 0) : 0;
  const std::int64_t runs = affine_run > 0 ? size / affine_run : 1;
  parallel_for(outer, context.threads, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(size, 1)),
               [&](std::int64_t begin, std::int64_t end) {
                 // Each row's scale and bias pairs, one a run (period > 0), rewritten row by row.
                 ScratchVector<double> affine(static_cast<std::size_t>(period > 0 ? 2 * runs : 0));
                 for (std::int64_t row = begin; row < end; ++row) {
                   // x + residual in the compute type (float for 16-bit inputs, not rounded in between).
                   ScratchVector<T> sum_row;
                   const T* src = in + row * size;
                   if (res != nullptr) {
                     sum_row.resize(static_cast<std::size_t>(size));
                     for (std::int64_t i = 0; i < size; ++i) {
                       sum_row[i] = static_cast<T>(static_cast<double>(src[i]) + static_cast<double>(res[row * size + i]));
                     }
                     src = sum_row.data();
                   }
                   T* dst = out + row * size;
                   const T* row_addend = addend == nullptr ? nullptr : addend + row * size;
                   for (std::int64_t k = 0; period > 0 && k < runs; ++k) {
                     const std::int64_t c = (row * runs + k) % period;
                     affine[static_cast<std::size_t>(2 * k)] = gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0;
                     affine[static_cast<std::size_t>(2 * k + 1)] = beta != nullptr ? static_cast<double>(beta[c]) : 0.0;
                   }
                   const T* row_gamma = period > 0 ? nullptr : gamma;
                   const T* row_beta = period > 0 ? nullptr : beta;
                   if constexpr (std::is_same_v<T, float>) {  // Note [Layer norm rows in independent chains]
                     isa.layer_norm_row_f32(src, size, epsilon, row_gamma, row_beta, row_addend,
                                            period > 0 ? affine.data() : nullptr, affine_run, dst, nullptr);
                     continue;
                   }
                   const double mean = wide_sums<16>(src, size, [](double v) { return v; }) / static_cast<double>(size);
                   const double squares =
                       wide_sums<16>(src, size, [mean](double v) { return (v - mean) * (v - mean); });
                   const double inv_std = 1.0 / std::sqrt(squares / static_cast<double>(size) + epsilon);
                   if (period == 0) {
                     normalize_row(src, size, mean, inv_std, row_gamma, row_beta, row_addend, dst);
                     continue;
                   }
                   const std::int64_t run = size / runs;
                   for (std::int64_t i = 0; i < size; ++i) {
                     const auto k = static_cast<std::size_t>(i / run);
                     double v = (static_cast<double>(src[i]) - mean) * inv_std * affine[2 * k] + affine[2 * k + 1];
                     if (row_addend != nullptr) v += static_cast<double>(row_addend[i]);
                     dst[i] = static_cast<T>(v);
                   }
                 }
               });
  y.commit();
  if (launch.num_outputs > 1 && launch.output(1).defined()) quantize_output(launch, context);
}

template <typename T>
struct BatchNorm {
  static void run(const KernelLaunch& l, const CpuContext& c) { run_batch_norm<T>(l, c); }
};
template <typename T>
struct Softmax {
  static void run(const KernelLaunch& l, const CpuContext& c) { run_softmax<T>(l, c); }
};
template <typename T>
struct LayerNorm {
  static void run(const KernelLaunch& l, const CpuContext& c) { run_layer_norm<T>(l, c); }
};

}  // namespace

void register_norm_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "batch_norm", "reference inference batch norm over axis 1 (per-channel affine in double)",
                 typed_run<BatchNorm>());
  add_cpu_kernel(registry, "softmax", "reference stable softmax along any axis, accumulated in double",
                 typed_run<Softmax>());
  add_cpu_kernel(registry, "layer_norm",
                 "reference layer norm over dims axis..end (two-pass mean/variance in double, optional affine, "
                 "residual before and addend after); the optional quantized output quantize_linear's arithmetic on "
                 "the output as stored",
                 typed_run<LayerNorm>(), DTypeSet::kAll);  // the schema takes float inputs; the quantized output's
                                                           // dtype is int8/uint8/float8
}

// log_softmax of float32 along any axis (Note [Softmax along any axis]); other dtypes take the reference.
bool log_softmax_fast(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  Tensor& y = launch.output(0);
  if (x.dtype() != DType::kFloat32 || y.dtype() != DType::kFloat32 || !x.is_contiguous() || !y.is_contiguous() ||
      x.dim() == 0) {
    return false;
  }
  const auto& shape = x.shape();
  const std::int64_t axis = normalized_axis(*launch.desc, x.dim());
  const std::int64_t outer = product(shape, 0, static_cast<std::size_t>(axis));
  const std::int64_t length = shape[static_cast<std::size_t>(axis)];
  const std::int64_t inner = product(shape, static_cast<std::size_t>(axis) + 1, shape.size());
  if (x.numel() == 0) return true;
  softmax_lines_f32(static_cast<const float*>(x.data_ptr()), static_cast<float*>(y.data_ptr()), outer, length, inner,
                    /*log=*/true, context);
  return true;
}

}  // namespace xpuruntime::cpu
