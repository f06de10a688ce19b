// Tests of the cublasLt kernel of the float8 op qlinear_fp8 with each of its two epilogues (Note [cuBLASLt's own
// float8 epilogue] in backends/cublaslt/cublaslt_qlinear_fp8.cpp): the default plan and every tactic of both
// epilogues against the cpu kernel, bit for bit, on inputs whose sums, scale products and biases are exact in float32
// and float16 (x and weight in {0, +-0.5, +-1, +-1.5, +-2}, power-of-two scales), so that every difference would be a
// wrong scale, bias, relu, layout or rounding; odd M, N a multiple of 4 but not of 8, per-tensor and per-channel
// weight scales, each output dtype. Records replay the epilogue they name, and bad records are refused with their
// reason. GPU only: skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_run.h"
#include "test_utils.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

// float8e4m3fn codes of 0, +-0.5, +-1, +-1.5 and +-2.
constexpr std::uint8_t kCodes[] = {0x00, 0x30, 0x38, 0x3C, 0x40, 0xB0, 0xB8, 0xBC, 0xC0};

struct Fp8Case {
  std::int64_t m = 1, k = 16, n = 4;
  bool per_channel = false;
  bool bias = true;
  bool relu = false;
  std::string output = "float16";

  std::string str() const {
    return detail::str_cat("m=", m, " k=", k, " n=", n, per_channel ? " per-channel" : " per-tensor",
                           bias ? " bias" : "", relu ? " relu" : "", " -> ", output);
  }
};

struct Fp8Problem {
  std::vector<Tensor> inputs;  // on the CPU
  Attributes attrs;
};

Tensor pick(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  std::uniform_int_distribution<std::size_t> index(0, sizeof(kCodes) - 1);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = kCodes[index(rng)];
  return t;
}

Tensor floats_from(const Shape& shape, const std::vector<float>& choices, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, DType::kFloat32, Device::cpu());
  std::uniform_int_distribution<std::size_t> index(0, choices.size() - 1);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = choices[index(rng)];
  return t;
}

Fp8Problem make_problem(const Fp8Case& c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Fp8Problem p;
  p.inputs.push_back(pick({c.m, c.k}, DType::kFloat8E4M3FN, rng));
  p.inputs.push_back(pick({c.n, c.k}, DType::kFloat8E4M3FN, rng));
  p.inputs.push_back(floats_from({c.per_channel ? c.n : 1}, {0.5f, 1.0f, 2.0f}, rng));
  p.inputs.push_back(c.bias ? floats_from({c.n}, {0.0f, 0.125f, -0.25f, 3.5f}, rng) : Tensor());
  p.attrs.set("weight_layout", std::string("nk"));
  p.attrs.set("x_scale", 0.25);
  p.attrs.set("activation", std::string(c.relu ? "relu" : "none"));
  p.attrs.set("output_dtype", c.output);
  // Outputs up to |K * 4 * 0.25 * 2| + 3.5: y_scale 1/8 saturates the larger ones, and every real value is a
  // multiple of 1/64 times a power of two, so float8 ties occur.
  if (c.output == "float8e4m3fn") p.attrs.set("y_scale", 0.125);
  return p;
}

using kernel_run::KernelRun;

const Kernel& kernel_named(const std::string& name) { return kernel_run::registry_kernel("qlinear_fp8", name); }

// `kernel`'s plan for the problem (`record`: re-created from it), run once on `device`'s default stream.
KernelRun run_kernel(const std::string& kernel, const Fp8Problem& p, Device device, const std::string& record = {}) {
  return kernel_run::run_registry_kernel("qlinear_fp8", kernel, p.inputs, p.attrs, device, record);
}

std::string epilogue_of(const std::string& record) {
  return nlohmann::json::parse(record).value("epilogue", std::string("kernel"));
}

// The number of elements whose bits differ.
std::int64_t differing(const Tensor& got, const Tensor& want) {
  const std::size_t size = got.element_size();
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const auto offset = static_cast<std::size_t>(i) * size;
    count += std::memcmp(static_cast<const std::uint8_t*>(got.data_ptr()) + offset,
                         static_cast<const std::uint8_t*>(want.data_ptr()) + offset, size) != 0;
  }
  return count;
}

// Every plan of `c` (the default and each tactic) against the cpu kernel; the epilogues its tactics offered.
std::vector<std::string> check_every_plan(const Fp8Case& c, std::uint32_t seed) {
  const Fp8Problem p = make_problem(c, seed);
  const KernelRun want = run_kernel("cpu", p, Device::cpu());
  const KernelRun chosen = run_kernel("cublasLt", p, Device::cuda(0));
  EXPECT_EQ(differing(chosen.output, want.output), 0) << c.str() << " [" << chosen.describe << "]";
  const OpDescriptor desc =
      kernel_run::describe_op("qlinear_fp8", kernel_run::on_device(p.inputs, Device::cuda(0)), p.attrs);
  std::vector<std::string> epilogues;
  for (const std::string& record : kernel_named("cublasLt").tactics(desc, ExecutionPolicy())) {
    KernelRun tactic;
    try {
      tactic = run_kernel("cublasLt", p, Device::cuda(0), record);
    } catch (const std::runtime_error& e) {
      ADD_FAILURE() << c.str() << ": tactic " << record << " failed: " << e.what();
      continue;
    }
    EXPECT_EQ(tactic.record, record) << c.str();
    EXPECT_EQ(differing(tactic.output, want.output), 0) << c.str() << " [" << tactic.describe << "]";
    const std::string epilogue = epilogue_of(record);
    if (epilogues.empty() || epilogues.back() != epilogue) epilogues.push_back(epilogue);
  }
  std::cout << c.str() << ": default epilogue " << epilogue_of(chosen.record) << ", tactics' epilogues";
  for (const std::string& e : epilogues) std::cout << " " << e;
  std::cout << "\n";
  return epilogues;
}

TEST(QLinearFp8Cuda, EveryPlanOfBothEpiloguesMatchesTheCpuKernel) {
  XPURT_SKIP_WITHOUT_GPU();
  struct Mkn {
    std::int64_t m, k, n;
  };
  const Mkn shapes[] = {{1, 16, 4}, {7, 48, 20}, {33, 64, 24}, {128, 768, 768}, {1000, 3072, 772}};
  const char* outputs[] = {"float16", "float8e4m3fn", "float32"};
  std::uint32_t seed = 1;
  for (const auto& shape : shapes) {
    for (int variant = 0; variant < 12; ++variant) {
      Fp8Case c;
      c.m = shape.m;
      c.k = shape.k;
      c.n = shape.n;
      c.output = outputs[variant % 3];
      c.per_channel = (variant / 3) % 2 == 1;
      c.relu = variant / 6 == 1;
      c.bias = c.output != "float32" || variant % 2 == 0;
      const std::vector<std::string> epilogues = check_every_plan(c, ++seed);
      if (c.output == "float16" && c.n % 8 == 0 && c.m >= 128) {
        // cuBLASLt's own epilogue is offered for a float16 output of 16-byte rows on sm_89+.
        EXPECT_NE(std::find(epilogues.begin(), epilogues.end(), "cublasLt"), epilogues.end()) << c.str();
      }
    }
  }
}

TEST(QLinearFp8Cuda, RecordsNameTheirEpilogueAndBadOnesAreRefused) {
  XPURT_SKIP_WITHOUT_GPU();
  Fp8Case c;
  c.m = 512;  // 2^18 outputs: the default is cuBLASLt's own epilogue
  c.k = 64;
  c.n = 512;
  const Fp8Problem p = make_problem(c, 77);
  const KernelRun chosen = run_kernel("cublasLt", p, Device::cuda(0));
  EXPECT_EQ(epilogue_of(chosen.record), "cublasLt") << chosen.record;
  EXPECT_NE(chosen.describe.find("cuBLASLt's own"), std::string::npos) << chosen.describe;
  nlohmann::json record = nlohmann::json::parse(chosen.record);
  record["epilogue"] = "bogus";
  XPURT_EXPECT_THROW_WITH(run_kernel("cublasLt", p, Device::cuda(0), record.dump()), UnsupportedOperationError,
                          "'epilogue' must be");
  // A float32 output with a bias cannot take cuBLASLt's epilogue (its bias would be bfloat16).
  Fp8Case wide = c;
  wide.output = "float32";
  const Fp8Problem q = make_problem(wide, 78);
  const KernelRun kernel = run_kernel("cublasLt", q, Device::cuda(0));
  EXPECT_EQ(epilogue_of(kernel.record), "kernel") << kernel.record;
  record = nlohmann::json::parse(kernel.record);
  record["epilogue"] = "cublasLt";
  XPURT_EXPECT_THROW_WITH(run_kernel("cublasLt", q, Device::cuda(0), record.dump()), UnsupportedOperationError,
                          "bfloat16");
  // A record made before the choice existed (no "epilogue") replays the kernel's epilogue.
  record.erase("epilogue");
  EXPECT_EQ(epilogue_of(run_kernel("cublasLt", q, Device::cuda(0), record.dump()).record), "kernel");
}

}  // namespace
}  // namespace xpuruntime
