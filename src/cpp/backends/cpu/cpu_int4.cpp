// The cpu kernel of matmul_nbits, the int4 weight-only GEMM (Note [Int4 weight-only GEMM] in
// core/op_schemas_int4.cpp): the reference the GPU kernels are checked against, computing as the com.microsoft
// MatMulNBits node kernel (backends/cpu/onnx/onnx_misc_quant.cpp) does, bit for bit: each weight row dequantized in
// float32 ((code - zero point) * scale), the products summed in double over k in order, rounded to float once, the
// bias added in float32, the result rounded to x's dtype.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_common.h"

namespace xpuruntime::cpu {
namespace {

// The float32 values of a float tensor (scales, bias), any float dtype.
ScratchVector<float> floats_of(const Tensor& t) {
  ScratchVector<float> out(static_cast<std::size_t>(t.numel()));
  load_elements(t.data_ptr(), t.dtype(), out.data(), t.numel());
  return out;
}

void run_matmul_nbits(const KernelLaunch& launch, const CpuContext& context) {
  const Tensor& x = launch.input(0);
  const Tensor& w = launch.input(1);
  const Tensor* zero_points = launch.num_inputs > 3 && launch.input(3).defined() ? &launch.input(3) : nullptr;
  const Tensor* bias_input = launch.num_inputs > 4 && launch.input(4).defined() ? &launch.input(4) : nullptr;
  Tensor& y = launch.output(0);
  const std::int64_t k = x.shape().back();
  const std::int64_t n = w.shape()[0];
  const std::int64_t blocks = w.shape()[1];
  const std::int64_t block = w.shape()[2] * 2;
  const std::int64_t rows = x.numel() / k;
  const std::int64_t zp_row = (blocks + 1) / 2;
  const ScratchVector<float> xs = floats_of(x);
  const ScratchVector<float> scales = floats_of(launch.input(2));
  const ScratchVector<float> bias = bias_input != nullptr ? floats_of(*bias_input) : ScratchVector<float>();
  const auto* codes = static_cast<const std::uint8_t*>(w.data_ptr());
  const auto* zp = zero_points != nullptr ? static_cast<const std::uint8_t*>(zero_points->data_ptr()) : nullptr;
  ScratchVector<float> out(static_cast<std::size_t>(rows * n));
  // Threads split the output columns: each column is one thread's, summed in one order whatever the split.
  parallel_for(n, context.threads, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(rows * k, 1)),
               [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> row(static_cast<std::size_t>(k));
    for (std::int64_t j = begin; j < end; ++j) {
      const std::uint8_t* packed = codes + j * blocks * (block / 2);
      for (std::int64_t l = 0; l < k; ++l) {
        const std::int64_t b = l / block;
        const unsigned byte = packed[l / 2];
        const auto code = static_cast<float>(l % 2 == 0 ? byte & 0xFu : byte >> 4);
        float zero = 8.0f;
        if (zp != nullptr) {
          const unsigned z = zp[j * zp_row + b / 2];
          zero = static_cast<float>(b % 2 == 0 ? z & 0xFu : z >> 4);
        }
        row[static_cast<std::size_t>(l)] = (code - zero) * scales[static_cast<std::size_t>(j * blocks + b)];
      }
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = xs.data() + r * k;
        double sum = 0.0;
        for (std::int64_t l = 0; l < k; ++l) {
          sum += static_cast<double>(xr[l]) * static_cast<double>(row[static_cast<std::size_t>(l)]);
        }
        const auto value = static_cast<float>(sum);
        out[static_cast<std::size_t>(r * n + j)] = bias.empty() ? value : value + bias[static_cast<std::size_t>(j)];
      }
    }
  });
  store_elements(out.data(), y.data_ptr(), y.dtype(), rows * n);
}

}  // namespace

void register_int4_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "matmul_nbits",
                 "reference int4 weight-only GEMM: weights dequantized in float32, products summed in double (the "
                 "MatMulNBits node kernel's arithmetic)",
                 run_matmul_nbits, DTypeSet::kAll);
}

}  // namespace xpuruntime::cpu
