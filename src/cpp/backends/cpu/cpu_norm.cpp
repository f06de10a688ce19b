// Normalizations of the cpu backend: batch_norm (inference), softmax (any axis), layer_norm (dims axis..end).
// Statistics accumulate in double (Note [The cpu backend as the oracle], cpu_common.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

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
  const IsaKernels& isa = context.isa != nullptr ? *context.isa : isa_kernels();
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
  parallel_for(outer, context.threads, std::max<std::int64_t>(1, 8192 / std::max<std::int64_t>(size, 1)),
               [&](std::int64_t begin, std::int64_t end) {
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
                   double sum = 0.0;
                   for (std::int64_t i = 0; i < size; ++i) sum += static_cast<double>(src[i]);
                   const double mean = sum / static_cast<double>(size);
                   double squares = 0.0;
                   for (std::int64_t i = 0; i < size; ++i) {
                     const double d = static_cast<double>(src[i]) - mean;
                     squares += d * d;
                   }
                   const double inv_std = 1.0 / std::sqrt(squares / static_cast<double>(size) + epsilon);
                   for (std::int64_t i = 0; i < size; ++i) {
                     double v = (static_cast<double>(src[i]) - mean) * inv_std;
                     if (gamma != nullptr) v *= static_cast<double>(gamma[i]);
                     if (beta != nullptr) v += static_cast<double>(beta[i]);
                     if (addend != nullptr) v += static_cast<double>(addend[row * size + i]);  // rounded once
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

}  // namespace xpuruntime::cpu
