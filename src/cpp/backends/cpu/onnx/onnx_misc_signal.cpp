// ONNX reference ops, signal processing: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow,
// MelWeightMatrix. See backends/cpu/onnx/onnx_kernels.h.
//
// Complex values use ONNX's layout: a trailing dimension of 2 (real, imaginary); real inputs have a trailing
// dimension of 1. Transforms run in double as a mixed-radix Cooley-Tukey FFT over the length's prime factors
// (direct sums for the prime factors themselves), with one exact twiddle table (angle index k*n mod length):
// O(n log n) for smooth lengths such as 400 or 512, O(n^2) for a prime length.
#include <cmath>
#include <complex>

#include "backends/cpu/onnx/onnx_misc.h"

namespace xpuruntime::onnx_ref {
namespace {

using namespace misc;  // NOLINT(google-build-using-namespace): this group's helpers (onnx_misc.h)

constexpr double kPi = 3.14159265358979323846;
using Shape = std::vector<std::int64_t>;
using Complex = std::complex<double>;

// The DFT of one length: out[k] = sum_n in[n] * exp(-+2*pi*i*k*n / length) (the inverse divides by length).
class Fft {
 public:
  explicit Fft(std::int64_t length) : n_(static_cast<std::size_t>(length)), twiddles_(n_) {
    for (std::size_t j = 0; j < n_; ++j) {
      const double angle = -2.0 * kPi * static_cast<double>(j) / static_cast<double>(n_);
      twiddles_[j] = Complex(std::cos(angle), std::sin(angle));
    }
  }

  // `in` has `length` values; fills the first out.size() (<= length) bins.
  void run(ScratchVector<Complex>& in, ScratchVector<Complex>& out, bool inverse) {
    // The inverse through the forward transform: ifft(x) = conj(fft(conj(x))) / n.
    if (inverse) {
      for (Complex& v : in) v = std::conj(v);
    }
    full_.resize(n_);
    transform(in.data(), 1, n_, full_.data(), 1);
    for (std::size_t k = 0; k < out.size(); ++k) {
      out[k] = inverse ? std::conj(full_[k]) / static_cast<double>(n_) : full_[k];
    }
  }

 private:
  // out[0..n) = DFT of x[0], x[stride], ..., x[(n-1)*stride]; twiddles of length n are every `step`-th entry.
  void transform(const Complex* x, std::size_t stride, std::size_t n, Complex* out, std::size_t step) {
    if (n == 1) {
      out[0] = x[0];
      return;
    }
    std::size_t p = 2;
    while (p * p <= n && n % p != 0) ++p;
    if (n % p != 0) p = n;  // prime: direct sum
    const std::size_t m = n / p;
    if (m == 1) {
      for (std::size_t k = 0; k < n; ++k) {
        Complex acc(0.0, 0.0);
        std::size_t index = 0;  // j * k mod n
        for (std::size_t j = 0; j < n; ++j) {
          acc += x[j * stride] * twiddles_[index * step];
          index += k;
          if (index >= n) index -= n;
        }
        out[k] = acc;
      }
      return;
    }
    // p interleaved sub-sequences of length m, then X[k + q*m] = sum_r W_n^(r*(k + q*m)) * Y_r[k].
    for (std::size_t r = 0; r < p; ++r) transform(x + r * stride, stride * p, m, out + r * m, step * p);
    ScratchVector<Complex> sub(out, out + n);
    for (std::size_t k = 0; k < m; ++k) {
      for (std::size_t q = 0; q < p; ++q) {
        const std::size_t bin = k + q * m;
        Complex acc(0.0, 0.0);
        for (std::size_t r = 0; r < p; ++r) acc += twiddles_[(r * bin % n) * step] * sub[r * m + k];
        out[bin] = acc;
      }
    }
  }

  std::size_t n_;
  ScratchVector<Complex> twiddles_;
  ScratchVector<Complex> full_;
};

void check_signal_dtype(const OpContext& ctx, const Tensor& t, const char* name) {
  XPURT_CHECK_TYPE(is_float_dtype(t.dtype()), ctx.where(), ": input '", name,
                   "' must be a floating-point tensor, got ", dtype_name(t.dtype()));
}

std::int64_t read_int_scalar(const OpContext& ctx, std::size_t input, const char* name) {
  const std::vector<std::int64_t> v = read_ints(ctx.input(input), detail::str_cat(ctx.where(), " input '", name, "'"));
  XPURT_CHECK(v.size() == 1, ctx.where(), ": input '", name, "' must be a scalar, got ", v.size(), " values");
  return v[0];
}

void dft(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  check_signal_dtype(ctx, x, "input");
  const std::int64_t rank = x.dim();
  XPURT_CHECK(rank >= 2 && (x.shape().back() == 1 || x.shape().back() == 2), ctx.where(),
              ": input must be [batch, signal dims..., 1 or 2] (real or complex), got rank ", rank,
              rank > 0 ? detail::str_cat(" with last dimension ", x.shape().back()) : std::string());
  constexpr std::size_t kLengthInput = 1;  // dft_length, in every version
  std::int64_t axis = 1;
  if (ctx.opset() >= 20) {  // the axis moved from an attribute (default 1) to input 2 (default -2)
    axis = ctx.has_input(2) ? read_int_scalar(ctx, 2, "axis") : -2;
  } else {
    axis = ctx.attr_int("axis", 1);
  }
  XPURT_CHECK((axis >= -rank && axis <= -2) || (axis >= 0 && axis <= rank - 2), ctx.where(), ": axis ", axis,
              " is out of range [", -rank, ", -2] U [0, ", rank - 2, "] for an input of rank ", rank);
  if (axis < 0) axis += rank;
  const bool inverse = ctx.attr_int("inverse", 0) != 0;
  const bool onesided = ctx.attr_int("onesided", 0) != 0;
  // inverse with onesided: the inverse of a real signal's one-sided spectrum (numpy.fft.irfft), a real output.
  const bool irfft = inverse && onesided;
  const bool complex_in = x.shape().back() == 2;
  XPURT_CHECK(!irfft || complex_in, ctx.where(), ": inverse=1 with onesided=1 takes a complex one-sided spectrum "
              "(last dimension 2), got a real input");
  XPURT_CHECK(!onesided || inverse || !complex_in, ctx.where(), ": onesided=1 needs a real input (the spectrum of "
              "a complex signal has no conjugate symmetry); set onesided=0 for complex input");
  const auto ax = static_cast<std::size_t>(axis);
  const std::int64_t in_len = x.shape()[ax];
  // The transform length: dft_length, else the input's length (for irfft: 2 * (bins - 1), as numpy).
  std::int64_t length = irfft ? 2 * (in_len - 1) : in_len;
  if (ctx.has_input(kLengthInput)) {
    length = read_int_scalar(ctx, kLengthInput, "dft_length");
    XPURT_CHECK(length >= 1, ctx.where(), ": dft_length must be >= 1, got ", length);
  }
  XPURT_CHECK(length >= 1, ctx.where(), ": the signal dimension ", axis, " of length ", in_len,
              " gives an empty transform");
  const std::int64_t out_len = onesided && !inverse ? length / 2 + 1 : length;
  const std::int64_t out_comps = irfft ? 1 : 2;
  Shape out_shape = x.shape();
  out_shape[ax] = out_len;
  out_shape.back() = out_comps;
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= x.shape()[static_cast<std::size_t>(d)];
  for (std::int64_t d = axis + 1; d < rank - 1; ++d) inner *= x.shape()[static_cast<std::size_t>(d)];
  const ScratchVector<double> xs = to_doubles(x);
  ScratchVector<double> ys(static_cast<std::size_t>(numel_of(out_shape)));
  Fft fft(length);
  ScratchVector<Complex> in(static_cast<std::size_t>(length)), out(static_cast<std::size_t>(out_len));
  const std::int64_t comps = complex_in ? 2 : 1;
  // Bins read from the input: all `length` of them (zero past the input's end), or for irfft the first
  // length / 2 + 1, the rest following from Hermitian symmetry.
  const std::int64_t read_len = irfft ? length / 2 + 1 : length;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      for (std::int64_t n = 0; n < read_len; ++n) {
        if (n >= in_len) {
          in[static_cast<std::size_t>(n)] = Complex(0.0, 0.0);
          continue;
        }
        const auto src = static_cast<std::size_t>(((o * in_len + n) * inner + i) * comps);
        in[static_cast<std::size_t>(n)] = Complex(xs[src], complex_in ? xs[src + 1] : 0.0);
      }
      if (irfft) {
        // A real signal's spectrum: X[0] and (even lengths) X[n/2] are real; X[n - k] = conj(X[k]).
        in[0].imag(0.0);
        if (length % 2 == 0) in[static_cast<std::size_t>(length / 2)].imag(0.0);
        for (std::int64_t k = read_len; k < length; ++k) {
          in[static_cast<std::size_t>(k)] = std::conj(in[static_cast<std::size_t>(length - k)]);
        }
      }
      fft.run(in, out, inverse);
      for (std::int64_t k = 0; k < out_len; ++k) {
        const auto dst = static_cast<std::size_t>(((o * out_len + k) * inner + i) * out_comps);
        ys[dst] = out[static_cast<std::size_t>(k)].real();
        if (!irfft) ys[dst + 1] = out[static_cast<std::size_t>(k)].imag();
      }
    }
  }
  store_doubles(ctx.allocate_output(0, out_shape, x.dtype()), ys);
}

void stft(OpContext& ctx) {
  const Tensor& signal = ctx.input(0);
  check_signal_dtype(ctx, signal, "signal");
  XPURT_CHECK(signal.dim() == 3 && (signal.shape()[2] == 1 || signal.shape()[2] == 2), ctx.where(),
              ": 'signal' must be [batch, signal_length, 1 or 2], got rank ", signal.dim());
  const std::int64_t step = read_int_scalar(ctx, 1, "frame_step");
  XPURT_CHECK(step >= 1, ctx.where(), ": frame_step must be >= 1, got ", step);
  ScratchVector<double> window;
  if (ctx.has_input(2)) {
    const Tensor& w = ctx.input(2);
    check_signal_dtype(ctx, w, "window");
    XPURT_CHECK(w.dim() == 1, ctx.where(), ": 'window' must be 1-D, got rank ", w.dim());
    window = to_doubles(w);
  }
  std::int64_t frame_length = static_cast<std::int64_t>(window.size());
  if (ctx.has_input(3)) {
    frame_length = read_int_scalar(ctx, 3, "frame_length");
    XPURT_CHECK(window.empty() || static_cast<std::int64_t>(window.size()) == frame_length, ctx.where(),
                ": frame_length ", frame_length, " differs from the window's length ", window.size());
  } else {
    XPURT_CHECK(!window.empty(), ctx.where(), ": either 'window' or 'frame_length' must be given");
  }
  const std::int64_t batch = signal.shape()[0], signal_length = signal.shape()[1];
  XPURT_CHECK(frame_length >= 1 && frame_length <= signal_length, ctx.where(), ": frame_length ", frame_length,
              " must be in [1, signal_length = ", signal_length, "]");
  const bool onesided = ctx.attr_int("onesided", 1) != 0;
  XPURT_CHECK(!onesided || signal.shape()[2] == 1, ctx.where(), ": onesided=1 (the default) needs a real signal; "
              "set onesided=0 for a complex one");
  const std::int64_t frames = (signal_length - frame_length) / step + 1;
  const std::int64_t bins = onesided ? frame_length / 2 + 1 : frame_length;
  const bool complex_in = signal.shape()[2] == 2;
  const std::int64_t comps = complex_in ? 2 : 1;
  const ScratchVector<double> xs = to_doubles(signal);
  const Shape out_shape{batch, frames, bins, 2};
  ScratchVector<double> ys(static_cast<std::size_t>(numel_of(out_shape)));
  Fft fft(frame_length);
  ScratchVector<Complex> in(static_cast<std::size_t>(frame_length)), out(static_cast<std::size_t>(bins));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t f = 0; f < frames; ++f) {
      for (std::int64_t n = 0; n < frame_length; ++n) {
        const auto src = static_cast<std::size_t>((b * signal_length + f * step + n) * comps);
        const double w = window.empty() ? 1.0 : window[static_cast<std::size_t>(n)];
        in[static_cast<std::size_t>(n)] = Complex(xs[src] * w, complex_in ? xs[src + 1] * w : 0.0);
      }
      fft.run(in, out, false);
      for (std::int64_t k = 0; k < bins; ++k) {
        const auto dst = static_cast<std::size_t>(((b * frames + f) * bins + k) * 2);
        ys[dst] = out[static_cast<std::size_t>(k)].real();
        ys[dst + 1] = out[static_cast<std::size_t>(k)].imag();
      }
    }
  }
  store_doubles(ctx.allocate_output(0, out_shape, signal.dtype()), ys);
}

// The generalized cosine windows: w[n] = sum_j (-1)^j a_j cos(2*pi*j*n / N), N = size (periodic) or size - 1.
void cosine_window(OpContext& ctx, const ScratchVector<double>& coefficients) {
  const std::int64_t size = read_int_scalar(ctx, 0, "size");
  XPURT_CHECK(size >= 0, ctx.where(), ": size must be >= 0, got ", size);
  const DType out_dtype = dtype_from_onnx(ctx.attr_int("output_datatype", 1), ctx.where(), "output_datatype");
  const bool periodic = ctx.attr_int("periodic", 1) != 0;
  const std::int64_t denominator = periodic ? size : size - 1;
  ScratchVector<double> w(static_cast<std::size_t>(size));
  for (std::int64_t n = 0; n < size; ++n) {
    const double phase = denominator > 0 ? 2.0 * kPi * static_cast<double>(n) / static_cast<double>(denominator) : 0.0;
    double v = 0.0;
    for (std::size_t j = 0; j < coefficients.size(); ++j) {
      v += (j % 2 == 0 ? 1.0 : -1.0) * coefficients[j] * std::cos(static_cast<double>(j) * phase);
    }
    w[static_cast<std::size_t>(n)] = v;
  }
  store_doubles(ctx.allocate_output(0, {size}, out_dtype), w);
}

void mel_weight_matrix(OpContext& ctx) {
  const std::int64_t num_mel_bins = read_int_scalar(ctx, 0, "num_mel_bins");
  const std::int64_t dft_length = read_int_scalar(ctx, 1, "dft_length");
  const std::int64_t sample_rate = read_int_scalar(ctx, 2, "sample_rate");
  const double lower_hz = read_scalar(ctx.input(3), ctx.where());
  const double upper_hz = read_scalar(ctx.input(4), ctx.where());
  XPURT_CHECK(num_mel_bins >= 1 && dft_length >= 1 && sample_rate >= 1, ctx.where(),
              ": num_mel_bins, dft_length and sample_rate must be >= 1, got ", num_mel_bins, ", ", dft_length,
              " and ", sample_rate);
  XPURT_CHECK(lower_hz >= 0 && lower_hz <= upper_hz, ctx.where(), ": expected 0 <= lower_edge_hertz <= "
              "upper_edge_hertz, got ", lower_hz, " and ", upper_hz);
  const DType out_dtype = dtype_from_onnx(ctx.attr_int("output_datatype", 1), ctx.where(), "output_datatype");
  const std::int64_t spectrogram_bins = dft_length / 2 + 1;
  // num_mel_bins + 2 points evenly spaced on the mel scale, mapped back to Hz, then to DFT bin indices.
  auto to_mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const double low_mel = to_mel(lower_hz), high_mel = to_mel(upper_hz);
  const double mel_step = (high_mel - low_mel) / static_cast<double>(num_mel_bins + 2);
  std::vector<std::int64_t> bins(static_cast<std::size_t>(num_mel_bins + 2));
  for (std::size_t i = 0; i < bins.size(); ++i) {
    const double mel = static_cast<double>(i) * mel_step + low_mel;
    const double hz = 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0);
    const double bin = static_cast<double>(dft_length + 1) * hz / static_cast<double>(sample_rate);
    // Compared as a double first: converting one past int64's range to int64 is undefined.
    XPURT_CHECK(bin < static_cast<double>(spectrogram_bins), ctx.where(), ": upper_edge_hertz ", upper_hz,
                " maps past the last spectrogram bin (", spectrogram_bins, " bins for dft_length ", dft_length,
                " at sample_rate ", sample_rate, ")");
    bins[i] = static_cast<std::int64_t>(std::floor(bin));
  }
  ScratchVector<double> out(static_cast<std::size_t>(spectrogram_bins * num_mel_bins), 0.0);
  auto at = [&](std::int64_t row, std::int64_t col) -> double& {
    return out[static_cast<std::size_t>(row * num_mel_bins + col)];
  };
  for (std::int64_t i = 0; i < num_mel_bins; ++i) {
    const std::int64_t low = bins[static_cast<std::size_t>(i)], center = bins[static_cast<std::size_t>(i + 1)];
    const std::int64_t high = bins[static_cast<std::size_t>(i + 2)];
    if (center == low) {
      at(center, i) = 1.0;
    } else {
      for (std::int64_t j = low; j <= center; ++j) {
        at(j, i) = static_cast<double>(j - low) / static_cast<double>(center - low);
      }
    }
    for (std::int64_t j = center; j < high; ++j) {
      at(j, i) = static_cast<double>(high - j) / static_cast<double>(high - center);
    }
  }
  store_doubles(ctx.allocate_output(0, {spectrogram_bins, num_mel_bins}, out_dtype), out);
}

}  // namespace

void register_misc_signal_ops(NodeKernelRegistrar& kernels) {
  kernels.add("", "DFT", dft);
  kernels.add("", "STFT", stft);
  kernels.add("", "HannWindow", [](OpContext& ctx) { cosine_window(ctx, {0.5, 0.5}); });
  kernels.add("", "HammingWindow", [](OpContext& ctx) { cosine_window(ctx, {25.0 / 46.0, 21.0 / 46.0}); });
  kernels.add("", "BlackmanWindow", [](OpContext& ctx) { cosine_window(ctx, {0.42, 0.5, 0.08}); });
  kernels.add("", "MelWeightMatrix", mel_weight_matrix);
}

}  // namespace xpuruntime::onnx_ref
