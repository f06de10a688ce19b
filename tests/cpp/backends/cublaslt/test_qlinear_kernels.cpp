// Tests of the GPU kernels of the int8 op qlinear: cuBLASLt's IMMA GEMM ("cublasLt", Note [cuBLASLt int8 GEMMs]),
// cuda_raw's dp4a kernel ("dp4a", Note [The dp4a kernel of qlinear]), int8_mma and int8_wgmma (Note [int8 GEMM by
// wgmma], on compute capability 9.0) against the cpu kernel on the same random
// inputs, bit for bit (every output dtype, relu, int32 and float32 bias, per-tensor and per-channel scales, uint8 x
// with zero points, the run-time zero point, odd shapes, ties of the requantization); the plan record round trip and
// every tactic giving the same bits; a misaligned x; and -- without a GPU -- the reasons supports() gives.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_run.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/dispatcher.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

// ---- inputs ----

Tensor random_bytes(const Shape& shape, DType dtype, std::uint32_t seed, int lo, int hi) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  auto* p = static_cast<std::uint8_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<std::uint8_t>(dist(rng));
  return t;
}

Tensor random_floats(const Shape& shape, std::uint32_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::kFloat32, Device::cpu());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

Tensor random_ints(const Shape& shape, std::uint32_t seed, int lo, int hi) {
  Tensor t = Tensor::empty(shape, DType::kInt32, Device::cpu());
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  auto* p = static_cast<std::int32_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

const char* kOutputs[] = {"int8", "uint8", "float32", "float16", "int32"};

// One qlinear problem: x [M, K], weight [N, K] (nk) or [K, N], and the epilogue's choices.
struct Case {
  std::int64_t m = 1, k = 4, n = 4;
  bool nk = true;
  bool x_unsigned = false;
  std::string output = "float32";
  bool relu = false;
  int bias = 0;                 // 0 none, 1 int32, 2 float32
  bool per_channel = true;      // w_scale [N] (else one element)
  bool dynamic_zero_point = false;
  std::int64_t zero_point = 0;  // the attribute's (or the input's) value
  bool ties = false;            // unit scales and y_scale 2: real / y_scale lands on .5 for every odd sum

  std::string str() const {
    return detail::str_cat("m=", m, " k=", k, " n=", n, nk ? " nk" : " kn", x_unsigned ? " x uint8" : " x int8",
                           " zp ", zero_point, dynamic_zero_point ? " (input)" : "", " -> ", output,
                           relu ? " relu" : "", bias == 1 ? " int bias" : bias == 2 ? " float bias" : "",
                           per_channel ? " per-channel" : " per-tensor", ties ? " ties" : "");
  }
};

struct Problem {
  std::vector<Tensor> inputs;  // schema order, absent ones undefined
  Attributes attrs;
};

Problem make_problem(const Case& c, std::uint32_t seed) {
  Problem p;
  const bool raw = c.output == "int32";
  const int x_lo = c.ties ? (c.x_unsigned ? 125 : -3) : (c.x_unsigned ? 0 : -128);
  const int x_hi = c.ties ? (c.x_unsigned ? 131 : 3) : (c.x_unsigned ? 255 : 127);
  const int w_abs = c.ties ? 3 : 127;
  p.inputs.push_back(random_bytes({c.m, c.k}, c.x_unsigned ? DType::kUInt8 : DType::kInt8, seed, x_lo, x_hi));
  p.inputs.push_back(random_bytes(c.nk ? Shape{c.n, c.k} : Shape{c.k, c.n}, DType::kInt8, seed + 1, -w_abs, w_abs));
  if (raw) {
    p.inputs.emplace_back();
  } else if (c.ties) {
    p.inputs.push_back(random_floats({1}, seed + 2, 1.0f, 1.0f));
  } else {
    p.inputs.push_back(random_floats({c.per_channel ? c.n : 1}, seed + 2, 0.001f, 0.02f));
  }
  if (c.bias == 1) {
    p.inputs.push_back(random_ints({c.n}, seed + 3, -100000, 100000));
  } else if (c.bias == 2) {
    p.inputs.push_back(random_floats({c.n}, seed + 3, -20.0f, 20.0f));
  } else {
    p.inputs.emplace_back();
  }
  if (c.dynamic_zero_point) {
    Tensor zp = Tensor::empty({}, c.x_unsigned ? DType::kUInt8 : DType::kInt8, Device::cpu());
    *static_cast<std::uint8_t*>(zp.data_ptr()) = static_cast<std::uint8_t>(c.zero_point);
    p.inputs.push_back(zp);
  } else {
    p.inputs.emplace_back();
    p.attrs.set("x_zero_point", c.zero_point);
  }
  p.attrs.set("weight_layout", std::string(c.nk ? "nk" : "kn"));
  p.attrs.set("output_dtype", c.output);
  p.attrs.set("activation", std::string(c.relu ? "relu" : "none"));
  if (!raw) {
    p.attrs.set("x_scale", c.ties ? 1.0 : 0.05);
    // Outputs around +-100 steps: some saturate, most not.
    const double typical = c.ties ? 2.0 : 0.05 * 0.01 * 64.0 * 64.0 * std::sqrt(static_cast<double>(c.k));
    p.attrs.set("y_scale", c.ties ? 2.0 : typical / 60.0);
    p.attrs.set("y_zero_point", static_cast<std::int64_t>(c.output == "uint8" ? 120 : -5));
  }
  return p;
}

// ---- running a kernel ----

using kernel_run::KernelRun;

OpDescriptor describe_op(const std::vector<Tensor>& inputs, const Attributes& attrs) {
  return kernel_run::describe_op("qlinear", inputs, attrs);
}

// `kernel`'s plan for the problem (`record`: re-created from it), run once on `device`'s default stream.
KernelRun run_kernel(const std::string& kernel, const std::vector<Tensor>& host_inputs, const Attributes& attrs,
                     Device device, const std::string& record = {}) {
  return kernel_run::run_registry_kernel("qlinear", kernel, host_inputs, attrs, device, record);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// How many elements differ, with the first few described.
std::string first_differences(const Tensor& got, const Tensor& want) {
  std::string text;
  int shown = 0;
  const std::size_t size = got.element_size();
  for (std::int64_t i = 0; i < got.numel() && shown < 4; ++i) {
    const auto* g = static_cast<const std::uint8_t*>(got.data_ptr()) + i * static_cast<std::int64_t>(size);
    const auto* w = static_cast<const std::uint8_t*>(want.data_ptr()) + i * static_cast<std::int64_t>(size);
    if (std::memcmp(g, w, size) != 0) {
      std::uint64_t gv = 0, wv = 0;
      std::memcpy(&gv, g, size);
      std::memcpy(&wv, w, size);
      text += detail::str_cat(" [", i, "] bits ", gv, " vs ", wv, ";");
      ++shown;
    }
  }
  return text;
}

// Runs `kernel` on the GPU and the cpu kernel; the outputs must be equal bit for bit. False when the kernel refused
// (supports() said no, or its build found no algorithm: what the dispatcher falls back from); the reason is printed.
bool check_kernel(const std::string& kernel, const Case& c, std::uint32_t seed) {
  const Problem p = make_problem(c, seed);
  const KernelRun want = run_kernel("cpu", p.inputs, p.attrs, Device::cpu());
  KernelRun got;
  try {
    got = run_kernel(kernel, p.inputs, p.attrs, Device::cuda(0));
  } catch (const UnsupportedOperationError& e) {
    std::cout << kernel << " " << c.str() << ": " << e.what() << "\n";
    return false;
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find("refuses") != std::string::npos) return false;
    throw;
  }
  EXPECT_TRUE(same_bits(got.output, want.output))
      << kernel << " " << c.str() << " [" << got.describe << "]:" << first_differences(got.output, want.output);
  return true;
}

// Whether GPU 0 is compute capability 9.0, where int8_wgmma runs (sm_90a).
bool hopper() {
  DeviceManager& devices = DeviceManager::instance();
  return devices.get_device_count() > 0 && devices.get_device_info(Device::cuda(0)).compute_capability() == 90;
}

Case with(std::int64_t m, std::int64_t k, std::int64_t n, int variant) {
  Case c;
  c.m = m;
  c.k = k;
  c.n = n;
  c.output = kOutputs[variant % 5];
  c.x_unsigned = (variant / 5) % 2 == 1;
  c.relu = c.output != "int32" && (variant / 2) % 2 == 1;
  c.bias = c.output == "int32" ? (variant % 3 == 0 ? 1 : 0) : variant % 3;
  c.per_channel = (variant / 3) % 2 == 0;
  c.dynamic_zero_point = variant % 4 == 3;
  c.zero_point = c.x_unsigned ? 100 + variant % 56 : -20 + variant % 41;
  return c;
}

// ---- on the GPU ----

TEST(QLinearKernels, MatchTheCpuKernelBitForBitAtManyShapes) {
  XPURT_SKIP_WITHOUT_GPU();
  int variant = 0;
  int lt_runs = 0;
  for (std::int64_t m : {1, 3, 17, 128}) {
    for (std::int64_t k : {4, 12, 30, 768}) {
      for (std::int64_t n : {1, 3, 4, 17, 64, 100, 1024}) {
        Case c = with(m, k, n, variant);
        const auto seed = static_cast<std::uint32_t>(1000 + variant);
        ++variant;
        c.nk = true;
        EXPECT_TRUE(check_kernel("dp4a", c, seed)) << c.str();
        // The pipelined tensor-core kernel takes [N, K] weights with K a multiple of 16.
        EXPECT_EQ(check_kernel("int8_mma", c, seed), k % 16 == 0) << c.str();
        EXPECT_EQ(check_kernel("int8_wgmma", c, seed), k % 16 == 0 && hopper()) << c.str();
        const bool took = check_kernel("cublasLt", c, seed);
        lt_runs += took ? 1 : 0;
        // cuBLASLt takes every aligned [N, K] GEMM with K and N multiples of 4 on sm_75+.
        EXPECT_EQ(took, k % 4 == 0 && n % 4 == 0) << c.str();
        c.nk = false;
        EXPECT_TRUE(check_kernel("dp4a", c, seed)) << c.str();
        EXPECT_FALSE(check_kernel("cublasLt", c, seed)) << "cublasLt took a [K, N] weight: " << c.str();
      }
    }
  }
  EXPECT_GT(lt_runs, 40);
}

TEST(QLinearKernels, EveryEpilogueAtTwoShapes) {
  XPURT_SKIP_WITHOUT_GPU();
  std::uint32_t seed = 5000;
  for (const Shape& mkn : {Shape{17, 30, 100}, Shape{33, 768, 256}}) {
    for (const char* output : kOutputs) {
      for (int bias = 0; bias < 3; ++bias) {
        for (int mode = 0; mode < 6; ++mode) {  // x int8 / uint8 x zero point 0 / attribute / input
          Case c;
          c.m = mkn[0];
          c.k = mkn[1];
          c.n = mkn[2];
          c.output = output;
          if (c.output == "int32" && bias == 2) continue;  // the schema takes no float bias for the accumulator
          c.bias = bias;
          c.relu = c.output != "int32" && bias != 1;
          c.per_channel = bias != 0;
          c.x_unsigned = mode >= 3;
          c.zero_point = mode % 3 == 0 ? (c.x_unsigned ? 128 : 0) : (c.x_unsigned ? 37 : -11);
          c.dynamic_zero_point = mode % 3 == 2;
          EXPECT_TRUE(check_kernel("dp4a", c, ++seed)) << c.str();
          c.nk = true;
          EXPECT_EQ(check_kernel("int8_mma", c, seed), c.k % 16 == 0) << c.str();
          EXPECT_EQ(check_kernel("int8_wgmma", c, seed), c.k % 16 == 0 && hopper()) << c.str();
          c.zero_point = mode % 3 == 0 ? 0 : c.zero_point;  // uint8 with zero point 0 too
          EXPECT_TRUE(check_kernel("dp4a", c, ++seed)) << c.str();
          EXPECT_EQ(check_kernel("cublasLt", c, ++seed), c.k % 4 == 0) << c.str();
        }
      }
    }
  }
}

TEST(QLinearKernels, RequantizationTiesRoundToEven) {
  XPURT_SKIP_WITHOUT_GPU();
  for (const char* output : {"int8", "uint8"}) {
    for (bool x_unsigned : {false, true}) {
      Case c;
      c.m = 64;
      c.k = 8;
      c.n = 64;
      c.output = output;
      c.x_unsigned = x_unsigned;
      c.zero_point = x_unsigned ? 128 : 0;
      c.ties = true;
      c.per_channel = false;
      EXPECT_TRUE(check_kernel("dp4a", c, 77)) << c.str();
      EXPECT_TRUE(check_kernel("cublasLt", c, 78)) << c.str();
      c.k = 32;  // the tensor-core kernel's K is a multiple of 16
      EXPECT_TRUE(check_kernel("int8_mma", c, 79)) << c.str();
      EXPECT_EQ(check_kernel("int8_wgmma", c, 80), hopper()) << c.str();
    }
  }
}

// The dynamic quantization of ONNX Runtime: x uint8 with a run-time zero point, output int32 (MatMulInteger), at
// BERT-like sizes.
TEST(QLinearKernels, RunTimeZeroPointAtLargeSizes) {
  XPURT_SKIP_WITHOUT_GPU();
  for (const Shape& mkn : {Shape{256, 768, 2304}, Shape{5, 3072, 768}}) {
    for (std::int64_t zp : {0, 1, 128, 255}) {
      Case c;
      c.m = mkn[0];
      c.k = mkn[1];
      c.n = mkn[2];
      c.output = "int32";
      c.x_unsigned = true;
      c.dynamic_zero_point = true;
      c.zero_point = zp;
      EXPECT_TRUE(check_kernel("cublasLt", c, 900 + static_cast<std::uint32_t>(zp))) << c.str();
      EXPECT_TRUE(check_kernel("dp4a", c, 900 + static_cast<std::uint32_t>(zp))) << c.str();
      EXPECT_TRUE(check_kernel("int8_mma", c, 900 + static_cast<std::uint32_t>(zp))) << c.str();
      EXPECT_EQ(check_kernel("int8_wgmma", c, 900 + static_cast<std::uint32_t>(zp)), hopper()) << c.str();
    }
  }
}

// int8_wgmma (Note [int8 GEMM by wgmma]) past one tile each way: several 128-byte stages of K with a partial last one,
// M and N ending inside a tile, every tile height and both pipelines (records; Note [int8 GEMM by wgmma, fed by TMA]),
// every output dtype, uint8 x with a zero point.
TEST(QLinearKernels, WgmmaKernelMatchesTheCpuKernelOverManyTiles) {
  XPURT_SKIP_WITHOUT_GPU();
  if (!hopper()) GTEST_SKIP() << "int8_wgmma runs on compute capability 9.0 only";
  int variant = 0;
  for (const Shape& mkn : {Shape{300, 1040, 260}, Shape{129, 144, 131}, Shape{64, 768, 128}, Shape{256, 2064, 384},
                           Shape{1, 16, 1}, Shape{190, 528, 1000}}) {
    for (const char* record : {R"({"warpgroups": 2, "row_tiles": 2, "pipeline": "tma"})",
                               R"({"warpgroups": 2, "pipeline": "tma"})", R"({"warpgroups": 1, "pipeline": "tma"})",
                               R"({"warpgroups": 2, "row_tiles": 2})",
                               R"({"warpgroups": 2})", R"({"warpgroups": 1, "row_tiles": 2})",
                               R"({"warpgroups": 1})"}) {
      Case c = with(mkn[0], mkn[1], mkn[2], variant++);
      c.nk = true;
      const Problem p = make_problem(c, 7000 + static_cast<std::uint32_t>(variant));
      const KernelRun want = run_kernel("cpu", p.inputs, p.attrs, Device::cpu());
      const KernelRun got = run_kernel("int8_wgmma", p.inputs, p.attrs, Device::cuda(0), record);
      EXPECT_TRUE(same_bits(got.output, want.output))
          << c.str() << " " << record << " [" << got.describe << "]:" << first_differences(got.output, want.output);
    }
  }
}

TEST(QLinearKernels, RecordRoundTripAndEveryTacticGiveTheSameBits) {
  XPURT_SKIP_WITHOUT_GPU();
  Case c;
  c.m = 128;
  c.k = 768;
  c.n = 768;
  c.output = "int8";
  c.bias = 1;
  c.x_unsigned = true;
  c.zero_point = 131;
  const Problem p = make_problem(c, 4242);
  const KernelRun want = run_kernel("cpu", p.inputs, p.attrs, Device::cpu());
  const KernelRun first = run_kernel("cublasLt", p.inputs, p.attrs, Device::cuda(0));
  ASSERT_FALSE(first.record.empty());
  EXPECT_NE(first.describe.find("IMMA"), std::string::npos) << first.describe;
  const KernelRun again = run_kernel("cublasLt", p.inputs, p.attrs, Device::cuda(0), first.record);
  EXPECT_EQ(again.record, first.record);
  EXPECT_TRUE(same_bits(again.output, want.output));
  std::vector<Tensor> device_inputs;
  for (const Tensor& t : p.inputs) device_inputs.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
  const OpDescriptor desc = describe_op(device_inputs, p.attrs);
  const Kernel* k = KernelRegistry::global().find_kernel("qlinear", "cublasLt");
  const std::vector<std::string> tactics = k->tactics(desc, ExecutionPolicy());
  EXPECT_FALSE(tactics.empty());
  for (const std::string& record : tactics) {
    const KernelRun tactic = run_kernel("cublasLt", p.inputs, p.attrs, Device::cuda(0), record);
    EXPECT_TRUE(same_bits(tactic.output, want.output)) << tactic.describe;
  }
  XPURT_EXPECT_THROW_WITH(run_kernel("cublasLt", p.inputs, p.attrs, Device::cuda(0), "{\"format\": \"other\"}"),
                          UnsupportedOperationError, "cannot re-create");
  // The pipelined tensor-core kernel: its record replays, every tactic (tiles, splits) gives the same bits, and
  // forced splits of the reduction too (int32 sums: the order of the blocks does not matter).
  const Kernel* mma = KernelRegistry::global().find_kernel("qlinear", "int8_mma");
  const KernelRun chosen = run_kernel("int8_mma", p.inputs, p.attrs, Device::cuda(0));
  EXPECT_TRUE(same_bits(chosen.output, want.output)) << chosen.describe;
  std::vector<std::string> records = mma->tactics(desc, ExecutionPolicy());
  records.push_back(chosen.record);
  records.push_back(R"({"tiles": 64, "splits": 5})");
  records.push_back(R"({"tiles": 128, "splits": 12})");
  for (const std::string& record : records) {
    const KernelRun tactic = run_kernel("int8_mma", p.inputs, p.attrs, Device::cuda(0), record);
    EXPECT_TRUE(same_bits(tactic.output, want.output)) << record << ": " << tactic.describe;
  }
}

// x at an odd address (a view one byte into a buffer): cuBLASLt refuses it, dp4a reads it byte by byte.
TEST(QLinearKernels, MisalignedXGoesToDp4a) {
  XPURT_SKIP_WITHOUT_GPU();
  Case c;
  c.m = 9;
  c.k = 64;
  c.n = 32;
  c.output = "float16";
  const Problem p = make_problem(c, 31);
  const KernelRun want = run_kernel("cpu", p.inputs, p.attrs, Device::cpu());
  Tensor buffer = Tensor::empty({c.m * c.k + 1}, DType::kInt8, Device::cuda(0));
  auto owner = std::make_shared<Tensor>(buffer);
  Tensor x = Tensor::from_blob(static_cast<std::uint8_t*>(buffer.data_ptr()) + 1, {c.m, c.k}, {}, DType::kInt8,
                               Device::cuda(0), std::shared_ptr<void>(owner, owner.get()));
  x.copy_from(p.inputs[0]);
  std::vector<Tensor> inputs = {x};
  for (std::size_t i = 1; i < p.inputs.size(); ++i) {
    inputs.push_back(p.inputs[i].defined() ? p.inputs[i].to(Device::cuda(0)) : Tensor());
  }
  const OpDescriptor desc = describe_op(inputs, p.attrs);
  const Support lt = KernelRegistry::global().find_kernel("qlinear", "cublasLt")->supports(desc, ExecutionPolicy());
  EXPECT_FALSE(lt);
  EXPECT_NE(lt.reason().find("aligned"), std::string::npos) << lt.reason();
  const Kernel* dp4a = KernelRegistry::global().find_kernel("qlinear", "dp4a");
  ASSERT_TRUE(dp4a->supports(desc, ExecutionPolicy())) << dp4a->supports(desc, ExecutionPolicy()).reason();
  std::unique_ptr<KernelPlan> plan = dp4a->build(desc, ExecutionPolicy(), {});
  const StreamView stream(Device::cuda(0), nullptr);
  std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype, Device::cuda(0))};
  plan->execute(desc, inputs, outputs, stream);
  stream.synchronize();
  EXPECT_TRUE(same_bits(outputs[0].to(Device::cpu()), want.output));
}

// The dispatcher's first choice: cuBLASLt for the aligned [N, K] GEMMs, dp4a for the rest (int8_mma ranks after
// cuBLASLt: Note [qlinear as a 1x1 convolution]).
TEST(QLinearKernels, TheDispatcherPicksCublasLtThenDp4a) {
  XPURT_SKIP_WITHOUT_GPU();
  Dispatcher dispatcher{KernelPolicy(), ExecutionPolicy()};
  for (const auto& [k, nk, expected] : {std::tuple<std::int64_t, bool, const char*>{64, true, "cublasLt"},
                                        {36, true, "cublasLt"},
                                        {64, false, "dp4a"},
                                        {30, true, "dp4a"}}) {
    Case c;
    c.m = 8;
    c.k = k;
    c.n = 16;
    c.nk = nk;
    Problem p = make_problem(c, 3);
    std::vector<Tensor> inputs;
    for (const Tensor& t : p.inputs) inputs.push_back(t.defined() ? t.to(Device::cuda(0)) : Tensor());
    OpDescriptor desc = describe_op(inputs, p.attrs);
    EXPECT_EQ(dispatcher.select(desc)->decision.kernel, expected) << c.str();
  }
}

// ---- without a GPU: the declarations and reasons ----

OpDescriptor cuda_descriptor(std::int64_t m, std::int64_t k, std::int64_t n, const std::string& layout,
                             std::uint32_t x_alignment = 256) {
  OpDescriptor desc;
  desc.op = "qlinear";
  desc.device = Device::cuda(0);
  desc.inputs = {TensorDesc::contiguous({m, k}, DType::kUInt8, desc.device, x_alignment),
                 TensorDesc::contiguous(layout == "nk" ? Shape{n, k} : Shape{k, n}, DType::kInt8, desc.device),
                 TensorDesc::contiguous({n}, DType::kFloat32, desc.device), TensorDesc(),
                 TensorDesc::contiguous({}, DType::kUInt8, desc.device)};
  desc.attrs.set("weight_layout", layout).set("x_scale", 0.1).set("output_dtype", std::string("float32"));
  KernelRegistry::global().infer(desc);
  return desc;
}

TEST(QLinearKernels, ReasonsOfTheKernelsThatRefuse) {
  const Kernel* lt = KernelRegistry::global().find_kernel("qlinear", "cublasLt");
  const Kernel* dp4a = KernelRegistry::global().find_kernel("qlinear", "dp4a");
  ASSERT_NE(lt, nullptr);
  ASSERT_NE(dp4a, nullptr);
#if XPURT_WITH_CUDA
  const ExecutionPolicy policy;
  auto reason = [&](const OpDescriptor& desc) { return lt->supports(desc, policy).reason(); };
  EXPECT_TRUE(lt->supports(cuda_descriptor(5, 64, 32, "nk"), policy)) << reason(cuda_descriptor(5, 64, 32, "nk"));
  EXPECT_NE(reason(cuda_descriptor(5, 64, 32, "kn")).find("'TN'"), std::string::npos);
  EXPECT_NE(reason(cuda_descriptor(5, 30, 32, "nk")).find("multiples of 4"), std::string::npos);
  EXPECT_NE(reason(cuda_descriptor(5, 64, 30, "nk")).find("multiples of 4"), std::string::npos);
  EXPECT_NE(reason(cuda_descriptor(5, 131072, 32, "nk")).find("overflow"), std::string::npos);
  EXPECT_NE(reason(cuda_descriptor(5, 64, 32, "nk", 4)).find("aligned"), std::string::npos);
  OpDescriptor old = cuda_descriptor(5, 64, 32, "nk");
  old.compute_capability = 70;  // no IMMA
  EXPECT_FALSE(lt->supports(old, policy));
  for (const char* layout : {"nk", "kn"}) {
    for (std::int64_t k : {0, 1, 30, 64}) {
      const OpDescriptor desc = cuda_descriptor(3, k, 7, layout, 1);
      EXPECT_TRUE(dp4a->supports(desc, policy)) << desc.signature() << ": " << dp4a->supports(desc, policy).reason();
    }
  }
  // The pipelined tensor-core kernel: [N, K], K a multiple of 16, 16-byte aligned operands; its plans name their
  // tiles and split, and records outside the range are refused.
  const Kernel* mma = KernelRegistry::global().find_kernel("qlinear", "int8_mma");
  ASSERT_NE(mma, nullptr);
  auto mma_reason = [&](const OpDescriptor& desc) { return mma->supports(desc, policy).reason(); };
  EXPECT_TRUE(mma->supports(cuda_descriptor(5, 64, 32, "nk"), policy)) << mma_reason(cuda_descriptor(5, 64, 32, "nk"));
  EXPECT_NE(mma_reason(cuda_descriptor(5, 64, 32, "kn")).find("weight_layout=nk"), std::string::npos);
  EXPECT_NE(mma_reason(cuda_descriptor(5, 40, 32, "nk")).find("multiple of 16"), std::string::npos);
  EXPECT_NE(mma_reason(cuda_descriptor(5, 64, 32, "nk", 8)).find("aligned"), std::string::npos);
  EXPECT_TRUE(mma->ranks_first(cuda_descriptor(5, 64, 32, "nk")).empty());  // after cuBLASLt
  const OpDescriptor bert = cuda_descriptor(2048, 768, 3072, "nk");  // 16 x 24 tiles of 128: more than 132
  const auto plan = mma->build(bert, policy, "");
  EXPECT_EQ(plan->record(), R"({"splits":1,"tiles":128})");
  EXPECT_NE(plan->describe().find("128x128 tiles"), std::string::npos) << plan->describe();
  const OpDescriptor decode = cuda_descriptor(1, 768, 768, "nk");  // one row: 64 x 64 tiles, the reduction split
  const auto split = mma->build(decode, policy, "");
  EXPECT_EQ(split->record(), R"({"splits":3,"tiles":64})");  // 12 steps of 64 bytes, at least 4 a split
  EXPECT_GT(split->workspace_bytes(), 768u * 4u);
  EXPECT_EQ(mma->tactics(decode, policy), std::vector<std::string>{R"({"splits":1,"tiles":64})"});
  EXPECT_EQ(mma->build(decode, policy, R"({"tiles": 128, "splits": 2})")->record(), R"({"splits":2,"tiles":128})");
  XPURT_EXPECT_THROW_WITH(mma->build(decode, policy, R"({"tiles": 96, "splits": 2})"), InvalidArgumentError,
                          "'tiles' must be 64 or 128");
  XPURT_EXPECT_THROW_WITH(mma->build(decode, policy, R"({"tiles": 64, "splits": 33})"), InvalidArgumentError,
                          "'splits' must be an integer 1..32");
  XPURT_EXPECT_THROW_WITH(mma->build(decode, policy, "tiles=64"), InvalidArgumentError, "invalid plan record");
  // On the CPU neither is asked.
  OpDescriptor cpu = cuda_descriptor(5, 64, 32, "nk");
  cpu.device = Device::cpu();
  for (TensorDesc& t : cpu.inputs) t.device = Device::cpu();
  EXPECT_FALSE(lt->supports(cpu, policy));
  EXPECT_FALSE(dp4a->supports(cpu, policy));
#else
  EXPECT_FALSE(lt->supports(cuda_descriptor(5, 64, 32, "nk"), ExecutionPolicy()));
#endif
}

// int8_wgmma's reasons, its shape-dependent priority, its tile choice and records (Note [int8 GEMM by wgmma]).
TEST(QLinearKernels, WgmmaKernelReasonsPriorityAndRecords) {
#if XPURT_WITH_CUDA
  const Kernel* wgmma = KernelRegistry::global().find_kernel("qlinear", "int8_wgmma");
  ASSERT_NE(wgmma, nullptr);
  const ExecutionPolicy policy;
  const auto on = [](OpDescriptor desc, int cc) {
    desc.compute_capability = cc;
    return desc;
  };
  const auto reason = [&](const OpDescriptor& desc, int cc) { return wgmma->supports(on(desc, cc), policy).reason(); };
  const OpDescriptor bert = on(cuda_descriptor(2048, 768, 3072, "nk"), 90);  // 16 x 24 tiles of 128: more than 132
  EXPECT_TRUE(wgmma->supports(bert, policy)) << reason(bert, 90);
  EXPECT_NE(wgmma->ranks_first(bert).find("ranks first on sm_90 from 256 rows"), std::string::npos);
  EXPECT_TRUE(wgmma->ranks_first(on(cuda_descriptor(255, 768, 768, "nk"), 90)).empty());  // cuBLASLt first
  EXPECT_TRUE(wgmma->ranks_first(on(bert, 0)).empty());
  EXPECT_NE(reason(bert, 80).find("compute capability 9.0"), std::string::npos) << reason(bert, 80);
  EXPECT_NE(reason(bert, 100).find("9.0 only"), std::string::npos) << reason(bert, 100);
  EXPECT_NE(reason(cuda_descriptor(5, 30, 32, "nk"), 90).find("multiple of 16"), std::string::npos);
  EXPECT_NE(reason(cuda_descriptor(5, 64, 32, "kn"), 90).find("[N, K]"), std::string::npos);
  EXPECT_NE(reason(cuda_descriptor(5, 64, 32, "nk", 8), 90).find("aligned"), std::string::npos);
  const auto plan = wgmma->build(bert, policy, "");
  // 8 x 24 tiles of 256 x 128 cover 132 SMs: the TMA pipeline's
  EXPECT_EQ(plan->record(), R"({"pipeline":"tma","row_tiles":2,"warpgroups":2})");
  EXPECT_NE(plan->describe().find("256x128 tiles"), std::string::npos) << plan->describe();
  EXPECT_NE(plan->describe().find("producer warpgroup's TMA copies"), std::string::npos) << plan->describe();
  const OpDescriptor narrow = on(cuda_descriptor(256, 768, 768, "nk"), 90);  // 2 x 6 tiles of 128: 64-row tiles
  EXPECT_EQ(wgmma->build(narrow, policy, "")->record(), R"({"row_tiles":1,"warpgroups":1})");
  EXPECT_EQ(wgmma->tactics(narrow, policy),
            (std::vector<std::string>{R"({"pipeline":"tma","row_tiles":2,"warpgroups":2})",
                                      R"({"pipeline":"tma","row_tiles":1,"warpgroups":2})",
                                      R"({"row_tiles":2,"warpgroups":2})", R"({"row_tiles":1,"warpgroups":2})",
                                      R"({"row_tiles":2,"warpgroups":1})"}));
  EXPECT_EQ(wgmma->build(narrow, policy, R"({"warpgroups": 2})")->record(), R"({"row_tiles":1,"warpgroups":2})");
  const auto cp_async = wgmma->build(narrow, policy, R"({"warpgroups": 2, "pipeline": "cp.async"})");
  EXPECT_EQ(cp_async->record(), R"({"row_tiles":1,"warpgroups":2})");
  EXPECT_NE(cp_async->describe().find("cp.async into"), std::string::npos) << cp_async->describe();
  const auto one_consumer = wgmma->build(narrow, policy, R"({"warpgroups": 1, "pipeline": "tma"})");
  EXPECT_EQ(one_consumer->record(), R"({"pipeline":"tma","row_tiles":1,"warpgroups":1})");
  EXPECT_NE(one_consumer->describe().find("64x128 tiles"), std::string::npos) << one_consumer->describe();
  XPURT_EXPECT_THROW_WITH(wgmma->build(narrow, policy, R"({"warpgroups": 1, "row_tiles": 2, "pipeline": "tma"})"),
                          InvalidArgumentError, "the \"tma\" pipeline's one warpgroup takes one strip");
  XPURT_EXPECT_THROW_WITH(wgmma->build(narrow, policy, R"({"warpgroups": 2, "pipeline": "bulk"})"),
                          InvalidArgumentError, "'pipeline' must be \"tma\" or \"cp.async\"");
  XPURT_EXPECT_THROW_WITH(wgmma->build(narrow, policy, R"({"warpgroups": 3})"), InvalidArgumentError,
                          "'warpgroups' must be 1 or 2");
  XPURT_EXPECT_THROW_WITH(wgmma->build(narrow, policy, R"({"warpgroups": 1, "row_tiles": 4})"),
                          InvalidArgumentError, "'row_tiles' must be 1 or 2");
  XPURT_EXPECT_THROW_WITH(wgmma->build(narrow, policy, "[]"), InvalidArgumentError, "invalid plan record");
#else
  EXPECT_EQ(KernelRegistry::global().find_kernel("qlinear", "int8_wgmma"), nullptr);
#endif
}

}  // namespace
}  // namespace xpuruntime
