// Tests of cuda_raw's launchers for the int8 ops' epilogue (quant_gemm.cu), which other backends reach through the
// device kernels table: quantized_epilogue against a host evaluation of QuantEpilogueParams' contract written as the
// cpu kernel computes it (backends/cpu/cpu_quant.cpp), bit for bit, for every output dtype, a GEMM's channels (inner
// 1) and a convolution's (inner H * W), the run-time zero point and the special values; quantized_prologue's alpha,
// folded int32 bias and x ^ 0x80 against the host; and the typed refusals, which need no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/cuda_raw/cuda_raw_ops.h"
#include "core/device_kernels.h"
#include "core/half.h"
#include "test_utils.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

#if XPURT_WITH_CUDA

template <typename T>
Tensor host_tensor(const std::vector<T>& values, DType dtype) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, dtype, Device::cpu());
  std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> host_values(const Tensor& device) {
  const Tensor t = device.to(Device::cpu());
  std::vector<T> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.data_ptr(), out.size() * sizeof(T));
  return out;
}

// The contract of QuantEpilogueParams as the cpu kernel computes it, for output element i of channel c.
struct HostEpilogue {
  std::vector<float> alpha;
  bool per_channel = true;
  std::vector<std::int32_t> int_bias, w_col_sums;
  std::vector<float> float_bias;
  int x_zero_point = -1;  // < 0: none
  bool relu = false;
  float y_scale = 1.0f, y_zero_point = 0.0f;

  std::int32_t raw(std::int32_t acc, std::size_t c) const {
    auto wrapped = static_cast<std::uint32_t>(acc);
    if (!int_bias.empty()) wrapped += static_cast<std::uint32_t>(int_bias[c]);
    if (x_zero_point >= 0) {
      wrapped -= static_cast<std::uint32_t>(x_zero_point) * static_cast<std::uint32_t>(w_col_sums[c]);
    }
    return static_cast<std::int32_t>(wrapped);
  }
  float real(std::int32_t acc, std::size_t c) const {
    const float v = static_cast<float>(raw(acc, c)) * alpha[per_channel ? c : 0] +
                    (float_bias.empty() ? 0.0f : float_bias[c]);
    return relu && !(v > 0.0f) && !std::isnan(v) ? 0.0f : v;
  }
  double level(float real_value, double lo, double hi) const {
    const float scaled = real_value / y_scale;
    if (std::isnan(scaled)) return std::min(hi, std::max(lo, static_cast<double>(y_zero_point)));
    return std::min(hi, std::max(lo, std::nearbyint(static_cast<double>(scaled)) + y_zero_point));
  }
};

class QuantEpilogue : public ::testing::Test {
 protected:
  void SetUp() override { XPURT_SKIP_WITHOUT_GPU(); }

  // Runs the launcher on `acc` and compares every output dtype with the host, bit for bit.
  void check(const std::vector<std::int32_t>& acc, std::int64_t channels, std::int64_t inner, const HostEpilogue& h) {
    const Device gpu = Device::cuda(0);
    const Tensor acc_d = host_tensor(acc, DType::kInt32).to(gpu);
    const Tensor alpha_d = host_tensor(h.alpha, DType::kFloat32).to(gpu);
    Tensor int_bias_d, col_sums_d, float_bias_d, zp_d;
    QuantEpilogueParams p;
    p.alpha = static_cast<const float*>(alpha_d.data_ptr());
    p.alpha_per_channel = h.per_channel;
    if (!h.int_bias.empty()) {
      int_bias_d = host_tensor(h.int_bias, DType::kInt32).to(gpu);
      p.int_bias = static_cast<const std::int32_t*>(int_bias_d.data_ptr());
    }
    if (!h.float_bias.empty()) {
      float_bias_d = host_tensor(h.float_bias, DType::kFloat32).to(gpu);
      p.float_bias = static_cast<const float*>(float_bias_d.data_ptr());
    }
    if (h.x_zero_point >= 0) {
      col_sums_d = host_tensor(h.w_col_sums, DType::kInt32).to(gpu);
      zp_d = host_tensor(std::vector<std::uint8_t>{static_cast<std::uint8_t>(h.x_zero_point)}, DType::kUInt8).to(gpu);
      p.w_col_sums = static_cast<const std::int32_t*>(col_sums_d.data_ptr());
      p.x_zero_point = static_cast<const std::uint8_t*>(zp_d.data_ptr());
    }
    p.relu = h.relu;
    p.y_scale = h.y_scale;
    p.y_zero_point = h.y_zero_point;
    const auto count = static_cast<std::int64_t>(acc.size());
    for (DType dtype : {DType::kInt32, DType::kFloat32, DType::kFloat16, DType::kInt8, DType::kUInt8}) {
      p.out_dtype = dtype;
      Tensor out = Tensor::empty({count}, dtype, gpu);
      cuda_raw::quantized_epilogue(static_cast<const std::int32_t*>(acc_d.data_ptr()), out.data_ptr(), count,
                                   channels, inner, p, nullptr);
      const Tensor got = out.to(Device::cpu());
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < count; ++i) {
        const auto c = static_cast<std::size_t>((i / inner) % channels);
        const std::int32_t a = acc[static_cast<std::size_t>(i)];
        std::uint32_t want = 0, have = 0;
        switch (dtype) {
          case DType::kInt32: want = static_cast<std::uint32_t>(h.raw(a, c)); break;
          case DType::kFloat32: {
            const float v = h.real(a, c);
            std::memcpy(&want, &v, 4);
            break;
          }
          case DType::kFloat16: want = detail::float_to_half(h.real(a, c)); break;
          case DType::kInt8:
            want = static_cast<std::uint8_t>(static_cast<std::int8_t>(h.level(h.real(a, c), -128, 127)));
            break;
          default: want = static_cast<std::uint8_t>(h.level(h.real(a, c), 0, 255)); break;
        }
        std::memcpy(&have, static_cast<const std::uint8_t*>(got.data_ptr()) + i * got.element_size(),
                    got.element_size());
        if (have != want && ++bad <= 4) {
          ADD_FAILURE() << dtype_name(dtype) << " element " << i << " (acc " << a << ", channel " << c << "): bits "
                        << have << ", expected " << want;
        }
      }
      EXPECT_EQ(bad, 0) << dtype_name(dtype);
    }
  }
};

std::vector<std::int32_t> random_acc(std::size_t n, std::uint32_t seed, std::int32_t lo, std::int32_t hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> dist(lo, hi);
  std::vector<std::int32_t> out(n);
  for (auto& v : out) v = dist(rng);
  return out;
}

TEST_F(QuantEpilogue, GemmChannelsEveryDtype) {
  const std::int64_t rows = 37, channels = 29;
  HostEpilogue h;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> scale(1e-4f, 1e-3f);
  for (std::int64_t c = 0; c < channels; ++c) {
    h.alpha.push_back(scale(rng));
    h.int_bias.push_back(static_cast<std::int32_t>(rng() % 20001) - 10000);
    h.float_bias.push_back(static_cast<float>(static_cast<int>(rng() % 200) - 100) / 7.0f);
  }
  h.relu = true;
  h.y_scale = 0.37f;
  h.y_zero_point = -7.0f;
  check(random_acc(static_cast<std::size_t>(rows * channels), 2, -200000, 200000), channels, 1, h);
  h.relu = false;
  h.float_bias.clear();
  h.per_channel = false;
  h.y_zero_point = 131.0f;
  check(random_acc(static_cast<std::size_t>(rows * channels), 3, -200000, 200000), channels, 1, h);
}

// A GEMM's output with channels a multiple of 4 takes the pass in rows of four (Note [The epilogue pass in rows of
// four]): per-channel and per-tensor alpha, ReLU or not, both zero points, a run-time x zero point, ties (y_scale 2
// on integer reals), zeros (half of the ReLU's outputs) and saturation at both ends.
TEST_F(QuantEpilogue, RowsOfFourEveryDtype) {
  for (const std::int64_t channels : {4, 64, 772}) {
    const std::int64_t rows = channels == 772 ? 5 : 33;
    HostEpilogue h;
    std::mt19937 rng(static_cast<std::uint32_t>(channels));
    std::uniform_real_distribution<float> scale(1e-4f, 1e-2f);
    for (std::int64_t c = 0; c < channels; ++c) {
      h.alpha.push_back(scale(rng));
      h.int_bias.push_back(static_cast<std::int32_t>(rng() % 20001) - 10000);
      h.float_bias.push_back(static_cast<float>(static_cast<int>(rng() % 200) - 100) / 7.0f);
      h.w_col_sums.push_back(static_cast<std::int32_t>(rng() % 2001) - 1000);
    }
    const auto n = static_cast<std::size_t>(rows * channels);
    h.relu = true;
    h.y_scale = 0.37f;
    h.y_zero_point = -7.0f;
    check(random_acc(n, 5, -200000, 200000), channels, 1, h);
    h.relu = false;
    h.x_zero_point = 113;
    h.y_zero_point = 131.0f;
    check(random_acc(n, 6, -200000, 200000), channels, 1, h);
    // Integer reals over y_scale 2: every odd one a tie.
    h.x_zero_point = -1;
    h.float_bias.clear();
    h.int_bias.clear();
    h.per_channel = false;
    h.alpha = {1.0f};
    h.y_scale = 2.0f;
    h.y_zero_point = 0.0f;
    check(random_acc(n, 7, -300, 300), channels, 1, h);
    h.relu = true;
    h.y_scale = 1e-30f;  // a reciprocal that is not normal: the division stays __fdiv_rn
    check(random_acc(n, 8, -3, 3), channels, 1, h);
  }
}

TEST_F(QuantEpilogue, ConvolutionChannelsAndRunTimeZeroPoint) {
  const std::int64_t batch = 3, channels = 5, inner = 7 * 11;
  HostEpilogue h;
  for (std::int64_t c = 0; c < channels; ++c) {
    h.alpha.push_back(0.01f * static_cast<float>(c + 1));
    h.int_bias.push_back(static_cast<std::int32_t>(c * 1000 - 2000));
    h.w_col_sums.push_back(static_cast<std::int32_t>(c * 37 - 80));
  }
  h.x_zero_point = 201;
  h.y_scale = 2.0f;  // odd sums land on ties
  check(random_acc(static_cast<std::size_t>(batch * channels * inner), 4, -3000, 3000), channels, inner, h);
}

// Sums that wrap, the extremes of int32, saturation, ties at both ends, and a zero alpha (a product of scales that
// underflowed): a negative sum times it is -0.0, which the cpu kernel's + 0.0f makes +0.0.
TEST_F(QuantEpilogue, SpecialValues) {
  HostEpilogue h;
  h.alpha = {1.0f, 0.5f, 0.0f};
  h.int_bias = {std::numeric_limits<std::int32_t>::max(), 1, -1};
  h.y_scale = 1.0f;
  h.y_zero_point = 3.0f;
  std::vector<std::int32_t> acc;
  for (std::int32_t v : {0, 1, -1, 2, -2, 3, -3, 125, 126, 127, 128, -128, -129, -130, 255, 256, 1 << 30,
                         std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()}) {
    for (int c = 0; c < 3; ++c) acc.push_back(v);
  }
  check(acc, 3, 1, h);
}

TEST_F(QuantEpilogue, PrologueAgainstTheHost) {
  const Device gpu = Device::cuda(0);
  for (bool nk : {true, false}) {
    for (std::int64_t k : {0, 5, 64, 1001}) {
      const std::int64_t n = 19;
      std::mt19937 rng(static_cast<std::uint32_t>(k) + (nk ? 1 : 0));
      std::vector<std::int8_t> w(static_cast<std::size_t>(n * k));
      for (auto& v : w) v = static_cast<std::int8_t>(static_cast<int>(rng() % 255) - 127);
      std::vector<float> w_scale(static_cast<std::size_t>(n));
      for (auto& v : w_scale) v = 1e-3f * static_cast<float>(rng() % 100 + 1);
      std::vector<std::int32_t> bias(static_cast<std::size_t>(n));
      for (auto& v : bias) v = static_cast<std::int32_t>(rng() % 100000) - 50000;
      std::vector<std::uint8_t> x(1003);
      for (auto& v : x) v = static_cast<std::uint8_t>(rng());
      const Tensor w_d = host_tensor(w, DType::kInt8).to(gpu), w_scale_d = host_tensor(w_scale, DType::kFloat32).to(gpu);
      const Tensor bias_d = host_tensor(bias, DType::kInt32).to(gpu), x_d = host_tensor(x, DType::kUInt8).to(gpu);
      const Tensor zp_d = host_tensor(std::vector<std::int8_t>{-7}, DType::kInt8).to(gpu);
      Tensor alpha_d = Tensor::empty({n}, DType::kFloat32, gpu), int_bias_d = Tensor::empty({n}, DType::kInt32, gpu);
      Tensor x_signed_d = Tensor::empty({1003}, DType::kInt8, gpu);
      QuantPrologueParams p;
      p.x_scale = 0.0371f;
      p.w_scale = static_cast<const float*>(w_scale_d.data_ptr());
      p.alpha_per_channel = true;
      p.bias = static_cast<const std::int32_t*>(bias_d.data_ptr());
      p.weight = static_cast<const std::int8_t*>(w_d.data_ptr());
      p.weight_nk = nk;
      p.k = k;
      p.zero_point_correction = 128 - 3;
      p.x_zero_point = zp_d.data_ptr();
      p.x_zero_point_signed = true;
      p.alpha = static_cast<float*>(alpha_d.data_ptr());
      p.int_bias = static_cast<std::int32_t*>(int_bias_d.data_ptr());
      p.x = static_cast<const std::uint8_t*>(x_d.data_ptr()) + 1;  // unaligned: the byte path
      p.x_signed = static_cast<std::int8_t*>(x_signed_d.data_ptr()) + 1;
      p.x_count = 1001;
      cuda_raw::quantized_prologue(p, n, nullptr);
      const auto alpha = host_values<float>(alpha_d);
      const auto int_bias = host_values<std::int32_t>(int_bias_d);
      const auto x_signed = host_values<std::int8_t>(x_signed_d);
      for (std::int64_t c = 0; c < n; ++c) {
        std::uint32_t sum = 0;
        for (std::int64_t j = 0; j < k; ++j) {
          sum += static_cast<std::uint32_t>(w[static_cast<std::size_t>(nk ? c * k + j : j * n + c)]);
        }
        const auto u = static_cast<std::size_t>(c);
        EXPECT_EQ(alpha[u], static_cast<float>(static_cast<double>(0.0371f) * w_scale[u]));
        EXPECT_EQ(static_cast<std::uint32_t>(int_bias[u]),
                  static_cast<std::uint32_t>(bias[u]) + 125u * sum + 7u * sum)
            << "channel " << c << " k " << k << (nk ? " nk" : " kn");
      }
      for (std::size_t i = 1; i < 1002; ++i) {
        EXPECT_EQ(static_cast<std::uint8_t>(x_signed[i]), x[i] ^ 0x80u) << i;
      }
    }
  }
}

// Refused before anything is enqueued (no GPU needed).
TEST(QuantEpilogueChecks, BadParamsAreTypedErrors) {
  QuantEpilogueParams p;
  p.out_dtype = DType::kFloat64;
  XPURT_EXPECT_THROW_WITH(cuda_raw::quantized_epilogue(nullptr, nullptr, 4, 2, 1, p, nullptr),
                          UnsupportedOperationError, "float64");
  p.out_dtype = DType::kInt8;
  XPURT_EXPECT_THROW_WITH(cuda_raw::quantized_epilogue(nullptr, nullptr, 4, 2, 1, p, nullptr), InvalidArgumentError,
                          "needs alpha");
  p.out_dtype = DType::kInt32;
  XPURT_EXPECT_THROW_WITH(cuda_raw::quantized_epilogue(nullptr, nullptr, 4, 0, 1, p, nullptr), InvalidArgumentError,
                          "channels");
  std::uint8_t zp = 0;
  p.x_zero_point = &zp;
  XPURT_EXPECT_THROW_WITH(cuda_raw::quantized_epilogue(nullptr, nullptr, 4, 2, 1, p, nullptr), InvalidArgumentError,
                          "w_col_sums");
  QuantPrologueParams q;
  std::int32_t out = 0;
  q.int_bias = &out;
  q.zero_point_correction = 128;
  q.k = 4;
  XPURT_EXPECT_THROW_WITH(cuda_raw::quantized_prologue(q, 2, nullptr), InvalidArgumentError, "weight");
}

#endif  // XPURT_WITH_CUDA (a build without CUDA has no cuda_raw launchers: the file then holds no test; the
        // kernels that reach the launchers refuse CUDA descriptors there, test_quant_conv.cpp checks it)

}  // namespace
}  // namespace xpuruntime
