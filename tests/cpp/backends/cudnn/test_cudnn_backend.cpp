// Tests of the cudnn backend (src/cpp/backends/cudnn/): conv2d ("cudnn", "cudnn_search"), max_pool2d,
// avg_pool2d, global_avg_pool and batch_norm ("cudnn").
//
// CPU-runnable: registration and the reasons `supports` gives (descriptors on cuda:0 need no GPU).
// GPU (skipped without one): every kernel against the reference on random inputs at odd shapes, for float32,
// float16 and bfloat16. The reference is the cpu backend's kernel of the op; a build whose cpu backend lacks the
// op falls back to the double-precision loops below. Outputs are pre-filled with NaN so that a kernel reading
// its uninitialised output (a wrong beta/alpha2) fails. Inputs are multiples of 1/64 in [-1, 1], exact in every
// dtype, so the reference and the kernel see the same values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

KernelRegistry& registry() { return KernelRegistry::global(); }

// True when this build has the cudnn backend (otherwise its kernels are declared "not in this build").
bool cudnn_in_build() {
  const Kernel* kernel = registry().find_kernel("conv2d", "cudnn");
  return kernel != nullptr && kernel->info().summary != "not in this build";
}

#define SKIP_WITHOUT_CUDNN()                                                      \
  do {                                                                            \
    if (!cudnn_in_build()) GTEST_SKIP() << "this build has no cudnn backend";     \
  } while (0)

const Kernel& kernel_of(const std::string& op, const std::string& name = "cudnn") {
  const Kernel* kernel = registry().find_kernel(op, name);
  if (kernel == nullptr) throw InvalidArgumentError("no kernel " + name + " for " + op);
  return *kernel;
}

// ---- 16-bit conversions (test-local; exact for the values the tests generate) ----

std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// `value` must be 0 or a normal number with at most 11 significant bits (true for multiples of 1/64 in [-2, 2]).
std::uint16_t exact_to_half(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  if ((bits & 0x7fffffffu) == 0) return sign;
  const std::uint32_t exponent = ((bits >> 23) & 0xffu) - 112u;
  return static_cast<std::uint16_t>(sign | (exponent << 10) | ((bits >> 13) & 0x3ffu));
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal or zero
  return sign != 0 ? -magnitude : magnitude;
}

// `value` must have at most 8 significant bits.
std::uint16_t exact_to_bfloat16(float value) { return static_cast<std::uint16_t>(float_bits(value) >> 16); }
float bfloat16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

// ---- host data ----

// Multiples of 1/64 in [lo, hi]: exact in float16 and bfloat16.
std::vector<float> random_values(std::int64_t count, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_int_distribution<int> pick(static_cast<int>(lo * 64), static_cast<int>(hi * 64));
  std::vector<float> values(static_cast<std::size_t>(count));
  for (auto& v : values) v = static_cast<float>(pick(rng)) / 64.0f;
  return values;
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Tensor cpu_tensor(const Shape& shape, const std::vector<float>& values, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  for (std::size_t k = 0; k < values.size(); ++k) {
    if (dtype == DType::kFloat32) {
      static_cast<float*>(t.data_ptr())[k] = values[k];
    } else if (dtype == DType::kFloat16) {
      static_cast<std::uint16_t*>(t.data_ptr())[k] = exact_to_half(values[k]);
    } else {
      static_cast<std::uint16_t*>(t.data_ptr())[k] = exact_to_bfloat16(values[k]);
    }
  }
  return t;
}

std::vector<float> values_of(const Tensor& cpu) {
  std::vector<float> out(static_cast<std::size_t>(cpu.numel()));
  for (std::size_t k = 0; k < out.size(); ++k) {
    if (cpu.dtype() == DType::kFloat32) {
      out[k] = static_cast<const float*>(cpu.data_ptr())[k];
    } else if (cpu.dtype() == DType::kFloat16) {
      out[k] = half_to_float(static_cast<const std::uint16_t*>(cpu.data_ptr())[k]);
    } else {
      out[k] = bfloat16_to_float(static_cast<const std::uint16_t*>(cpu.data_ptr())[k]);
    }
  }
  return out;
}

// ---- descriptors and runs ----

int device_compute_capability(Device device) {
  if (!device.is_cuda()) return 0;
  return DeviceManager::instance().get_device_info(device).compute_capability();
}

OpDescriptor make_desc(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                       const ExecutionPolicy& policy) {
  OpDescriptor desc;
  desc.op = op;
  for (const auto& t : inputs) desc.inputs.push_back(TensorDesc::of(t));
  desc.attrs = attrs;
  desc.device = inputs[0].device();
  desc.compute_capability = device_compute_capability(desc.device);
  desc.precision = policy.precision;
  desc.deterministic = policy.deterministic;
  registry().infer(desc);
  return desc;
}

// Runs `plan` on `inputs` (on the plan's device) and returns the output as floats. CUDA outputs are pre-filled
// with NaN bytes (0xff: NaN in every float dtype).
std::vector<float> run_plan(const KernelPlan& plan, const OpDescriptor& desc, const std::vector<Tensor>& inputs,
                            const StreamView& stream) {
  const TensorDesc& out_desc = desc.outputs[0];
  Tensor out = Tensor::empty(out_desc.shape, out_desc.dtype, desc.device, &stream);
  if (desc.device.is_cuda() && out.numel() > 0) {
    Tensor nan = Tensor::empty(out_desc.shape, out_desc.dtype, Device::cpu());
    std::memset(nan.data_ptr(), 0xff, nan.nbytes());
    out.copy_from(nan, &stream);
  }
  std::vector<Tensor> outputs = {out};
  plan.execute(desc, inputs, outputs, stream);
  stream.synchronize();
  return values_of(out.to(Device::cpu(), &stream));
}

std::vector<Tensor> to_device(const std::vector<Tensor>& cpu_inputs, Device device, const StreamView& stream) {
  std::vector<Tensor> out;
  for (const auto& t : cpu_inputs) out.push_back(t.defined() ? t.to(device, &stream) : Tensor());
  return out;
}

// ---- the double-precision fallback reference (used only when the cpu backend lacks the op) ----

std::vector<double> conv2d_loops(const std::vector<Tensor>& in, const OpDescriptor& desc) {
  const auto x = values_of(in[0]);
  const auto w = values_of(in[1]);
  const std::vector<float> bias = in[2].defined() ? values_of(in[2]) : std::vector<float>();
  const std::vector<float> residual = in[3].defined() ? values_of(in[3]) : std::vector<float>();
  const Shape& xs = desc.inputs[0].shape;
  const Shape& ws = desc.inputs[1].shape;
  const Shape& ys = desc.outputs[0].shape;
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  const std::int64_t groups = desc.attrs.get_int("groups", 1);
  const bool relu = desc.attrs.get_string("activation", "none") == "relu";
  const std::int64_t cg = ws[1], og = ws[0] / groups;
  std::vector<double> y(static_cast<std::size_t>(numel_of(ys)));
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t o = 0; o < ys[1]; ++o)
      for (std::int64_t i = 0; i < ys[2]; ++i)
        for (std::int64_t j = 0; j < ys[3]; ++j) {
          double sum = bias.empty() ? 0.0 : bias[o];
          const std::int64_t g = o / og;
          for (std::int64_t c = 0; c < cg; ++c)
            for (std::int64_t p = 0; p < ws[2]; ++p)
              for (std::int64_t q = 0; q < ws[3]; ++q) {
                const std::int64_t h = i * strides[0] - pads[0] + p * dilations[0];
                const std::int64_t v = j * strides[1] - pads[1] + q * dilations[1];
                if (h < 0 || h >= xs[2] || v < 0 || v >= xs[3]) continue;
                sum += static_cast<double>(x[((n * xs[1] + g * cg + c) * xs[2] + h) * xs[3] + v]) *
                       w[((o * cg + c) * ws[2] + p) * ws[3] + q];
              }
          const std::size_t at = static_cast<std::size_t>(((n * ys[1] + o) * ys[2] + i) * ys[3] + j);
          if (!residual.empty()) sum += residual[at];
          y[at] = relu ? std::max(sum, 0.0) : sum;
        }
  return y;
}

std::vector<double> pool_loops(const std::vector<Tensor>& in, const OpDescriptor& desc) {
  const auto x = values_of(in[0]);
  const Shape& xs = desc.inputs[0].shape;
  const Shape& ys = desc.outputs[0].shape;
  const bool global = desc.op == "global_avg_pool";
  const Shape kernel = global ? Shape{xs[2], xs[3]} : desc.attrs.get_ints("kernel_shape", {});
  const Shape strides = global ? Shape{1, 1} : desc.attrs.get_ints("strides", kernel);
  const Shape pads = global ? Shape{0, 0, 0, 0} : desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const bool is_max = desc.op == "max_pool2d";
  const bool include_pad = desc.attrs.get_int("count_include_pad", 0) != 0;
  std::vector<double> y(static_cast<std::size_t>(numel_of(ys)));
  for (std::int64_t nc = 0; nc < xs[0] * xs[1]; ++nc)
    for (std::int64_t i = 0; i < ys[2]; ++i)
      for (std::int64_t j = 0; j < ys[3]; ++j) {
        const std::int64_t h0 = i * strides[0] - pads[0], v0 = j * strides[1] - pads[1];
        const std::int64_t h1 = std::min(h0 + kernel[0], xs[2] + pads[2]);
        const std::int64_t v1 = std::min(v0 + kernel[1], xs[3] + pads[3]);
        const std::int64_t padded_count = (h1 - h0) * (v1 - v0);
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
        std::int64_t count = 0;
        for (std::int64_t h = std::max<std::int64_t>(h0, 0); h < std::min(h1, xs[2]); ++h)
          for (std::int64_t v = std::max<std::int64_t>(v0, 0); v < std::min(v1, xs[3]); ++v) {
            const double value = x[(nc * xs[2] + h) * xs[3] + v];
            acc = is_max ? std::max(acc, value) : acc + value;
            ++count;
          }
        y[static_cast<std::size_t>((nc * ys[2] + i) * ys[3] + j)] =
            is_max ? acc : acc / static_cast<double>(include_pad ? padded_count : count);
      }
  return y;
}

std::vector<double> batch_norm_loops(const std::vector<Tensor>& in, const OpDescriptor& desc) {
  const auto x = values_of(in[0]);
  const auto scale = values_of(in[1]), bias = values_of(in[2]), mean = values_of(in[3]), var = values_of(in[4]);
  const Shape& xs = desc.inputs[0].shape;
  const double epsilon = desc.attrs.get_float("epsilon", 1e-5);
  std::int64_t spatial = 1;
  for (std::size_t k = 2; k < xs.size(); ++k) spatial *= xs[k];
  std::vector<double> y(x.size());
  for (std::size_t k = 0; k < x.size(); ++k) {
    const std::size_t c = static_cast<std::size_t>((static_cast<std::int64_t>(k) / spatial) % xs[1]);
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(var[c]) + epsilon);
    y[k] = (x[k] - static_cast<double>(mean[c])) * inv_std * scale[c] + bias[c];
  }
  return y;
}

// The expected output: the cpu backend's kernel when it has one for `op`, else the loops above.
std::vector<double> reference(const std::string& op, const std::vector<Tensor>& cpu_inputs, const Attributes& attrs) {
  ExecutionPolicy policy;
  const OpDescriptor desc = make_desc(op, cpu_inputs, attrs, policy);
  const Kernel* cpu = registry().find_kernel(op, "cpu");
  if (cpu != nullptr) {
    const Support support = cpu->supports(desc, policy);
    if (!support) throw InvalidArgumentError("the cpu kernel of " + op + " says no: " + support.reason());
    const auto plan = cpu->build(desc, policy, "");
    const auto values = run_plan(*plan, desc, cpu_inputs, StreamView());
    return std::vector<double>(values.begin(), values.end());
  }
  if (op == "conv2d") return conv2d_loops(cpu_inputs, desc);
  if (op == "batch_norm") return batch_norm_loops(cpu_inputs, desc);
  return pool_loops(cpu_inputs, desc);
}

// |got - want| <= atol + rtol * |want| everywhere (NaN never passes).
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0;
  std::string first;
  double worst = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double error = std::fabs(static_cast<double>(got[k]) - want[k]);
    if (!(error <= atol + rtol * std::fabs(want[k]))) {
      if (bad == 0) first = "index " + std::to_string(k) + ": got " + std::to_string(got[k]) + ", want " +
                            std::to_string(want[k]);
      ++bad;
    }
    if (std::isfinite(error)) worst = std::max(worst, error);
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off (atol " << atol << ", rtol "
                     << rtol << "); first at " << first << "; worst finite error " << worst;
}

// Per-dtype tolerance of a sum of about `terms` products of values in [-1, 1].
void tolerance(DType dtype, double terms, double* atol, double* rtol) {
  const double scale = std::sqrt(std::max(terms, 1.0));
  const double base = dtype == DType::kFloat32 ? 1e-4 : dtype == DType::kFloat16 ? 5e-3 : 3e-2;
  *atol = base * scale;
  *rtol = base;
}

const DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

bool dtype_runs_here(DType dtype) {
  return dtype != DType::kBFloat16 || device_compute_capability(Device::cuda(0)) >= 80;
}

// ---- conv2d cases ----

struct ConvCase {
  std::int64_t n, c, h, w, o, kh, kw, stride, pad, dilation, groups;
  std::string name;
};

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {2, 16, 17, 15, 32, 3, 3, 1, 1, 1, 1, "3x3"},
      {2, 32, 7, 9, 16, 1, 1, 1, 0, 1, 1, "1x1 on 7x9"},
      {1, 3, 57, 57, 16, 7, 7, 2, 3, 1, 1, "7x7 stride 2 on 57x57"},
      {2, 24, 13, 11, 24, 3, 3, 1, 1, 1, 24, "depthwise 3x3"},
      {1, 16, 9, 9, 32, 3, 3, 1, 1, 1, 4, "groups=4"},
      {1, 8, 17, 19, 8, 3, 3, 1, 2, 2, 1, "dilation 2"},
      {4, 32, 1, 1, 64, 1, 1, 1, 0, 1, 1, "1x1 on 1x1"},
      {2, 8, 7, 9, 16, 3, 3, 2, 1, 1, 1, "3x3 stride 2 on 7x9"},
  };
  return cases;
}

struct Epilogue {
  bool bias, residual, relu;
  std::string name() const {
    std::string out = bias ? "bias" : "";
    if (residual) out += out.empty() ? "residual" : "+residual";
    if (relu) out += out.empty() ? "relu" : "+relu";
    return out.empty() ? "none" : out;
  }
};

const std::vector<Epilogue>& epilogues() {
  static const std::vector<Epilogue> all = {{false, false, false}, {true, false, false}, {true, false, true},
                                            {false, false, true},  {false, true, true},  {true, true, true},
                                            {true, true, false},   {false, true, false}};
  return all;
}

struct ConvProblem {
  std::vector<Tensor> cpu_inputs;  // x, weight, bias?, residual? in `dtype`
  Attributes attrs;
  double terms = 1;  // products per output element (for the tolerance)
};

ConvProblem conv_problem(const ConvCase& cc, const Epilogue& epilogue, DType dtype, std::uint32_t seed) {
  std::mt19937 rng(seed);
  ConvProblem p;
  p.attrs.set("strides", std::vector<std::int64_t>{cc.stride, cc.stride});
  p.attrs.set("pads", std::vector<std::int64_t>{cc.pad, cc.pad, cc.pad, cc.pad});
  p.attrs.set("dilations", std::vector<std::int64_t>{cc.dilation, cc.dilation});
  p.attrs.set("groups", cc.groups);
  p.attrs.set("activation", std::string(epilogue.relu ? "relu" : "none"));
  const Shape x_shape = {cc.n, cc.c, cc.h, cc.w};
  const Shape w_shape = {cc.o, cc.c / cc.groups, cc.kh, cc.kw};
  p.cpu_inputs.push_back(cpu_tensor(x_shape, random_values(numel_of(x_shape), rng), dtype));
  p.cpu_inputs.push_back(cpu_tensor(w_shape, random_values(numel_of(w_shape), rng), dtype));
  p.cpu_inputs.push_back(epilogue.bias ? cpu_tensor({cc.o}, random_values(cc.o, rng), dtype) : Tensor());
  p.cpu_inputs.push_back(Tensor());
  if (epilogue.residual) {
    const std::int64_t oh = (cc.h + 2 * cc.pad - cc.dilation * (cc.kh - 1) - 1) / cc.stride + 1;
    const std::int64_t ow = (cc.w + 2 * cc.pad - cc.dilation * (cc.kw - 1) - 1) / cc.stride + 1;
    const Shape y_shape = {cc.n, cc.o, oh, ow};
    p.cpu_inputs[3] = cpu_tensor(y_shape, random_values(numel_of(y_shape), rng), dtype);
  }
  p.terms = static_cast<double>((cc.c / cc.groups) * cc.kh * cc.kw);
  return p;
}

struct GpuRun {
  OpDescriptor desc;
  std::unique_ptr<KernelPlan> plan;
  std::vector<float> output;
};

// Builds `kernel` for `problem` on cuda:0 (from `record` when given) and runs it on `stream`.
GpuRun run_on_gpu(const Kernel& kernel, const std::string& op, const std::vector<Tensor>& cpu_inputs,
                  const Attributes& attrs, const ExecutionPolicy& policy, const StreamView& stream,
                  const std::string& record = "") {
  GpuRun run;
  const std::vector<Tensor> inputs = to_device(cpu_inputs, Device::cuda(0), stream);
  run.desc = make_desc(op, inputs, attrs, policy);
  const Support support = kernel.supports(run.desc, policy);
  if (!support) throw InvalidArgumentError(kernel.name() + " says no: " + support.reason());
  run.plan = kernel.build(run.desc, policy, record);
  run.output = run_plan(*run.plan, run.desc, inputs, stream);
  return run;
}

// The text of `key`'s value in a flat JSON object (enough for the plan records compared here).
std::string record_field(const std::string& record, const std::string& key) {
  const std::string tag = "\"" + key + "\":";
  const auto at = record.find(tag);
  if (at == std::string::npos) return "<absent>";
  const auto begin = at + tag.size();
  const auto end = record.find_first_of(",}", begin);
  return record.substr(begin, end - begin);
}

// ================= CPU-runnable tests =================

TEST(CudnnBackend, RegistersItsKernels) {
  SKIP_WITHOUT_CUDNN();
  for (const auto& [op, name] : std::vector<std::pair<std::string, std::string>>{
           {"conv2d", "cudnn"}, {"conv2d", "cudnn_search"}, {"max_pool2d", "cudnn"}, {"avg_pool2d", "cudnn"},
           {"global_avg_pool", "cudnn"}, {"batch_norm", "cudnn"}}) {
    const Kernel* kernel = registry().find_kernel(op, name);
    ASSERT_NE(kernel, nullptr) << op << ":" << name;
    EXPECT_EQ(kernel->info().backend, "cudnn");
    EXPECT_EQ(kernel->info().device_type, DeviceType::kCUDA);
    EXPECT_FALSE(kernel->info().summary.empty());
  }
}

// A descriptor on cuda:0 (sm90 unless told) built without touching a GPU: shape inference only.
OpDescriptor cuda_desc(const std::string& op, const std::vector<TensorDesc>& inputs, const Attributes& attrs,
                       int compute_capability = 90) {
  OpDescriptor desc;
  desc.op = op;
  desc.inputs = inputs;
  desc.attrs = attrs;
  desc.device = inputs[0].device;
  desc.compute_capability = compute_capability;
  registry().infer(desc);
  return desc;
}

TensorDesc tensor_desc(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::cuda(0)) {
  return TensorDesc::contiguous(shape, dtype, device);
}

std::string reason_of(const std::string& op, const std::string& name, const OpDescriptor& desc,
                      const ExecutionPolicy& policy = {}) {
  const Support support = kernel_of(op, name).supports(desc, policy);
  return support ? std::string("yes") : support.reason();
}

#define EXPECT_REASON(reason, fragment) EXPECT_NE((reason).find(fragment), std::string::npos) << (reason)

TEST(CudnnBackend, Conv2dSupportsAndReasons) {
  SKIP_WITHOUT_CUDNN();
  const auto conv = [](DType dtype, std::vector<std::int64_t> pads, Device device = Device::cuda(0),
                       int cc = 90) {
    Attributes attrs;
    attrs.set("pads", std::move(pads));
    return cuda_desc("conv2d",
                     {tensor_desc({2, 8, 9, 9}, dtype, device), tensor_desc({4, 8, 3, 3}, dtype, device),
                      TensorDesc(), TensorDesc()},
                     attrs, cc);
  };
  for (const char* name : {"cudnn", "cudnn_search"}) {
    EXPECT_EQ(reason_of("conv2d", name, conv(DType::kFloat32, {1, 1, 1, 1})), "yes");
    EXPECT_EQ(reason_of("conv2d", name, conv(DType::kFloat16, {0, 2, 0, 2})), "yes");
    EXPECT_EQ(reason_of("conv2d", name, conv(DType::kBFloat16, {0, 0, 0, 0})), "yes");
    EXPECT_EQ(reason_of("conv2d", name, conv(DType::kFloat32, {1, 1, 2, 2})),
              "cudnn needs symmetric pads (top == bottom, left == right), got [1, 1, 2, 2]; pad the input explicitly "
              "first");
    EXPECT_REASON(reason_of("conv2d", name, conv(DType::kFloat32, {0, 0, 0, 0}, Device::cpu())),
                  "runs on CUDA devices; the input is on cpu");
    EXPECT_REASON(reason_of("conv2d", name, conv(DType::kFloat64, {0, 0, 0, 0})),
                  "takes float32, float16 or bfloat16, got float64");
    EXPECT_REASON(reason_of("conv2d", name, conv(DType::kBFloat16, {0, 0, 0, 0}, Device::cuda(0), 75)),
                  "compute capability 8.0+ for bfloat16, the device has 7.5");
    ExecutionPolicy int8;
    int8.precision = Precision::kInt8;
    EXPECT_REASON(reason_of("conv2d", name, conv(DType::kFloat32, {0, 0, 0, 0}), int8), "no int8 kernel");

    OpDescriptor strided = conv(DType::kFloat32, {0, 0, 0, 0});
    strided.inputs[0].strides = {648, 1, 72, 8};  // channels-last view
    EXPECT_REASON(reason_of("conv2d", name, strided), "needs contiguous input");
    // Note [cuDNN data alignment]: conv needs 16-byte aligned inputs whatever the dtype.
    OpDescriptor misaligned = conv(DType::kFloat32, {0, 0, 0, 0});
    misaligned.inputs[1].alignment = 8;
    EXPECT_EQ(reason_of("conv2d", name, misaligned),
              "cudnn conv2d needs 16-byte aligned data; input 1 is 8-byte aligned (a view at an offset?): copy it to "
              "a fresh tensor");
    misaligned.inputs[1].alignment = 16;
    EXPECT_EQ(reason_of("conv2d", name, misaligned), "yes");
  }
  // More than 2^31 elements in x.
  const OpDescriptor huge = cuda_desc(
      "conv2d", {tensor_desc({1024, 64, 256, 256}), tensor_desc({8, 64, 1, 1}), TensorDesc(), TensorDesc()}, {});
  EXPECT_REASON(reason_of("conv2d", "cudnn", huge), "32-bit ints");
}

// Note [Pools are timed]: every cuDNN pooling asks to be timed against the other kernels (the dispatcher drops the
// request where no other kernel takes the descriptor). No GPU needed.
TEST(CudnnBackend, PoolsAskToBeTimed) {
  SKIP_WITHOUT_CUDNN();
  Attributes attrs;
  attrs.set("kernel_shape", std::vector<std::int64_t>{3, 3});
  const OpDescriptor pool = cuda_desc("max_pool2d", {tensor_desc({16, 64, 112, 112}, DType::kFloat16)}, attrs);
  EXPECT_NE(kernel_of("max_pool2d").timed_against_others(pool).find("own kernel may be faster"), std::string::npos);
}

TEST(CudnnBackend, PoolSupportsAndReasons) {
  SKIP_WITHOUT_CUDNN();
  const auto pool = [](const std::string& op, Shape x, Shape kernel, Shape strides, Shape pads, int ceil_mode,
                       Shape dilations = {1, 1}) {
    Attributes attrs;
    attrs.set("kernel_shape", std::move(kernel));
    attrs.set("strides", std::move(strides));
    attrs.set("pads", std::move(pads));
    attrs.set("ceil_mode", static_cast<std::int64_t>(ceil_mode));
    if (op == "max_pool2d") attrs.set("dilations", std::move(dilations));
    return cuda_desc(op, {tensor_desc(x)}, attrs);
  };
  for (const char* op : {"max_pool2d", "avg_pool2d"}) {
    EXPECT_EQ(reason_of(op, "cudnn", pool(op, {1, 2, 8, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, 0)), "yes");
    EXPECT_EQ(reason_of(op, "cudnn", pool(op, {1, 2, 8, 8}, {3, 3}, {2, 2}, {0, 0, 1, 1}, 0)),
              "cudnn needs symmetric pads (top == bottom, left == right), got [0, 0, 1, 1]; pad the input "
              "explicitly first");
    // 9x9, window 3, stride 2: (9 - 3) / 2 is exact, so ceil_mode gives the floor size.
    EXPECT_EQ(reason_of(op, "cudnn", pool(op, {1, 2, 9, 9}, {3, 3}, {2, 2}, {0, 0, 0, 0}, 1)), "yes");
    // 8x8: ceil_mode gives 4x4, floor 3x3.
    EXPECT_EQ(reason_of(op, "cudnn", pool(op, {1, 2, 8, 8}, {3, 3}, {2, 2}, {0, 0, 0, 0}, 1)),
              "cudnn computes floor output sizes: ceil_mode=1 gives 4x4 here but cuDNN would give 3x3; use "
              "ceil_mode=0 or pad the input so that both agree");
  }
  EXPECT_EQ(reason_of("max_pool2d", "cudnn", pool("max_pool2d", {1, 2, 9, 9}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 0, {2, 2})),
            "cudnn max pooling has no dilation, got dilations [2, 2]");
  EXPECT_EQ(reason_of("global_avg_pool", "cudnn", cuda_desc("global_avg_pool", {tensor_desc({2, 3, 7, 9})}, {})),
            "yes");
  // Pooling needs only element-size alignment.
  OpDescriptor offset = pool("max_pool2d", {1, 2, 8, 8}, {2, 2}, {2, 2}, {0, 0, 0, 0}, 0);
  offset.inputs[0].alignment = 4;
  EXPECT_EQ(reason_of("max_pool2d", "cudnn", offset), "yes");
  offset.inputs[0].alignment = 2;
  EXPECT_REASON(reason_of("max_pool2d", "cudnn", offset), "needs 4-byte aligned data; input 0 is 2-byte aligned");
  const TensorDesc on_cpu = tensor_desc({2, 3, 7, 9}, DType::kFloat32, Device::cpu());
  EXPECT_REASON(reason_of("global_avg_pool", "cudnn", cuda_desc("global_avg_pool", {on_cpu}, {})),
                "runs on CUDA devices");
}

TEST(CudnnBackend, BatchNormSupportsAndReasons) {
  SKIP_WITHOUT_CUDNN();
  const auto bn = [](Shape x, DType dtype, double epsilon) {
    Attributes attrs;
    attrs.set("epsilon", epsilon);
    const TensorDesc c = tensor_desc({x[1]}, dtype);
    return cuda_desc("batch_norm", {tensor_desc(x, dtype), c, c, c, c}, attrs);
  };
  EXPECT_EQ(reason_of("batch_norm", "cudnn", bn({2, 3, 5, 7}, DType::kFloat32, 1e-5)), "yes");
  EXPECT_EQ(reason_of("batch_norm", "cudnn", bn({2, 3}, DType::kFloat16, 1e-5)), "yes");
  EXPECT_EQ(reason_of("batch_norm", "cudnn", bn({2, 3, 4, 5, 6, 7}, DType::kBFloat16, 0.0)), "yes");
  EXPECT_REASON(reason_of("batch_norm", "cudnn", bn({2, 3, 5}, DType::kFloat32, -1.0)), "epsilon >= 0");
  EXPECT_REASON(reason_of("batch_norm", "cudnn", bn({2, 3, 5}, DType::kFloat64, 1e-5)), "got float64");
}

// ================= GPU tests =================

TEST(CudnnBackend, Conv2dMatchesReferenceAcrossShapesEpiloguesAndDtypes) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  const Kernel& kernel = kernel_of("conv2d", "cudnn");
  Stream stream = Stream::create(Device::cuda(0));
  ExecutionPolicy policy;  // precision fp32: FMA math for float32
  std::uint32_t seed = 1;
  for (const DType dtype : kDtypes) {
    if (!dtype_runs_here(dtype)) continue;
    for (const ConvCase& cc : conv_cases()) {
      for (const Epilogue& epilogue : epilogues()) {
        const std::string what = cc.name + ", " + epilogue.name() + ", " + std::string(dtype_name(dtype));
        SCOPED_TRACE(what);
        const ConvProblem p = conv_problem(cc, epilogue, dtype, seed++);
        const GpuRun run = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, policy, stream);
        double atol, rtol;
        tolerance(dtype, p.terms, &atol, &rtol);
        expect_close(run.output, reference("conv2d", p.cpu_inputs, p.attrs), atol, rtol,
                     what + " [" + run.plan->describe() + "]");
        // With a bias and ReLU the epilogue is always fused (Note [cuDNN fused conv epilogue] in cudnn_conv.cpp).
        if (epilogue.bias && epilogue.relu) {
          EXPECT_NE(run.plan->describe().find("fused bias"), std::string::npos) << run.plan->describe();
        }
        if (!epilogue.bias && (epilogue.residual || epilogue.relu)) {
          EXPECT_NE(run.plan->describe().find(", then "), std::string::npos) << run.plan->describe();
        }
      }
    }
  }
}

// Prints one plan description per epilogue (a readable record of what cuDNN chose on this machine) and checks
// their shape: "cudnn conv algo IMPLICIT_PRECOMP_GEMM, tensor-op math, workspace 1.2 MiB, fused bias+relu".
TEST(CudnnBackend, Conv2dDescribesItsPlans) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  std::uint32_t seed = 50;
  for (const char* name : {"cudnn", "cudnn_search"}) {
    for (const Epilogue& epilogue : epilogues()) {
      const ConvProblem p = conv_problem(conv_cases()[0], epilogue, DType::kFloat16, seed++);
      const GpuRun run = run_on_gpu(kernel_of("conv2d", name), "conv2d", p.cpu_inputs, p.attrs, {}, stream);
      const std::string text = run.plan->describe();
      std::printf("  %-12s %-20s %s\n    record %s\n", name, epilogue.name().c_str(), text.c_str(),
                  run.plan->record().c_str());
      EXPECT_EQ(text.rfind("cudnn conv algo ", 0), 0u) << text;
      EXPECT_NE(text.find(" math, workspace "), std::string::npos) << text;
    }
  }
}

// Views that start `offset` bytes into their allocation (Note [cuDNN data alignment] in cudnn_utils.h): conv2d
// runs correctly on 16-byte aligned inputs, pooling and batch norm on inputs aligned only to their element size.
TEST(CudnnBackend, KernelsRunOnTheLeastAlignedDataTheyAccept) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream owned_stream = Stream::create(Device::cuda(0));
  const StreamView stream = owned_stream.view();
  const auto offset_copy = [&](const Tensor& cpu, std::size_t offset) {
    Tensor base = Tensor::empty({cpu.numel() + 64}, cpu.dtype(), Device::cuda(0), &stream);
    Tensor view = Tensor::from_blob(static_cast<char*>(base.data_ptr()) + offset, cpu.shape(), {}, cpu.dtype(),
                                    Device::cuda(0), base.storage(), base.nbytes());
    view.copy_from(cpu, &stream);
    return view;
  };
  const auto offset_all = [&](const std::vector<Tensor>& cpu, std::size_t offset) {
    std::vector<Tensor> out;
    for (const auto& t : cpu) out.push_back(t.defined() ? offset_copy(t, offset) : Tensor());
    return out;
  };
  const ExecutionPolicy policy;
  std::uint32_t seed = 900;
  for (const DType dtype : kDtypes) {
    if (!dtype_runs_here(dtype)) continue;
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const std::size_t element = dtype_size(dtype);

    const ConvProblem p = conv_problem(conv_cases()[0], {true, true, true}, dtype, seed++);
    for (const char* name : {"cudnn", "cudnn_search"}) {
      const Kernel& kernel = kernel_of("conv2d", name);
      const std::vector<Tensor> element_aligned = offset_all(p.cpu_inputs, element);
      EXPECT_FALSE(kernel.supports(make_desc("conv2d", element_aligned, p.attrs, policy), policy));
      const std::vector<Tensor> inputs = offset_all(p.cpu_inputs, 16);
      const OpDescriptor desc = make_desc("conv2d", inputs, p.attrs, policy);
      EXPECT_EQ(desc.inputs[0].alignment, 16u);
      ASSERT_TRUE(kernel.supports(desc, policy)) << kernel.supports(desc, policy).reason();
      const auto plan = kernel.build(desc, policy, "");
      double atol, rtol;
      tolerance(dtype, p.terms, &atol, &rtol);
      expect_close(run_plan(*plan, desc, inputs, stream), reference("conv2d", p.cpu_inputs, p.attrs), atol, rtol,
                   std::string(name) + " on 16-byte aligned views [" + plan->describe() + "]");
    }

    std::mt19937 rng(seed++);
    const Shape x_shape = {2, 3, 9, 7};
    const Tensor x = cpu_tensor(x_shape, random_values(numel_of(x_shape), rng), dtype);
    Attributes pool_attrs;
    pool_attrs.set("kernel_shape", std::vector<std::int64_t>{3, 3});
    pool_attrs.set("strides", std::vector<std::int64_t>{1, 1});
    double atol, rtol;
    tolerance(dtype, 1.0, &atol, &rtol);
    for (const char* op : {"max_pool2d", "avg_pool2d"}) {
      const std::vector<Tensor> inputs = {offset_copy(x, element)};
      const OpDescriptor desc = make_desc(op, inputs, pool_attrs, policy);
      EXPECT_EQ(desc.inputs[0].alignment, element);
      ASSERT_TRUE(kernel_of(op).supports(desc, policy)) << kernel_of(op).supports(desc, policy).reason();
      const auto plan = kernel_of(op).build(desc, policy, "");
      expect_close(run_plan(*plan, desc, inputs, stream), reference(op, {x}, pool_attrs), atol, rtol,
                   std::string(op) + " on an element-aligned view");
    }
    const std::vector<Tensor> bn_cpu = {x, cpu_tensor({3}, {0.5f, 1.0f, -1.0f}, dtype),
                                        cpu_tensor({3}, {0.25f, 0.0f, 1.0f}, dtype),
                                        cpu_tensor({3}, {0.0f, 0.5f, -0.5f}, dtype),
                                        cpu_tensor({3}, {1.0f, 0.5f, 2.0f}, dtype)};
    const std::vector<Tensor> bn_inputs = offset_all(bn_cpu, element);
    const OpDescriptor bn_desc = make_desc("batch_norm", bn_inputs, {}, policy);
    ASSERT_TRUE(kernel_of("batch_norm").supports(bn_desc, policy));
    const auto bn_plan = kernel_of("batch_norm").build(bn_desc, policy, "");
    expect_close(run_plan(*bn_plan, bn_desc, bn_inputs, stream), reference("batch_norm", bn_cpu, {}), 4 * atol, rtol,
                 "batch_norm on element-aligned views");
  }
}

TEST(CudnnBackend, Conv2dSearchMatchesReference) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  const Kernel& kernel = kernel_of("conv2d", "cudnn_search");
  Stream stream = Stream::create(Device::cuda(0));
  ExecutionPolicy policy;
  policy.precision = Precision::kTF32;  // also exercises DEFAULT math for float32
  std::uint32_t seed = 100;
  for (const DType dtype : kDtypes) {
    if (!dtype_runs_here(dtype)) continue;
    for (std::size_t k = 0; k < conv_cases().size(); k += 2) {
      const ConvCase& cc = conv_cases()[k];
      const Epilogue& epilogue = epilogues()[k % epilogues().size()];
      const std::string what = cc.name + ", " + epilogue.name() + ", " + std::string(dtype_name(dtype));
      SCOPED_TRACE(what);
      const ConvProblem p = conv_problem(cc, epilogue, dtype, seed++);
      const GpuRun run = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, policy, stream);
      EXPECT_NE(run.plan->record().find("\"chosen_by\":\"search\""), std::string::npos) << run.plan->record();
      EXPECT_EQ(run.plan->record().find("TENSOR_OP_MATH_ALLOW_CONVERSION"), std::string::npos) << run.plan->record();
      double atol, rtol;
      // TF32 for float32: 10-bit mantissa products.
      tolerance(dtype == DType::kFloat32 ? DType::kFloat16 : dtype, p.terms, &atol, &rtol);
      expect_close(run.output, reference("conv2d", p.cpu_inputs, p.attrs), atol, rtol,
                   what + " [" + run.plan->describe() + "]");
    }
  }
}

TEST(CudnnBackend, Conv2dRecordRoundTripRecreatesTheSamePlan) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  ExecutionPolicy policy;
  std::uint32_t seed = 200;
  for (const char* name : {"cudnn", "cudnn_search"}) {
    const Kernel& kernel = kernel_of("conv2d", name);
    for (const DType dtype : {DType::kFloat32, DType::kFloat16}) {
      for (const Epilogue& epilogue : {Epilogue{true, false, true}, Epilogue{true, true, false},
                                       Epilogue{false, true, true}}) {
        const ConvCase& cc = conv_cases()[0];
        const std::string what = std::string(name) + ", " + epilogue.name() + ", " + std::string(dtype_name(dtype));
        SCOPED_TRACE(what);
        const ConvProblem p = conv_problem(cc, epilogue, dtype, seed++);
        const GpuRun first = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, policy, stream);
        const std::string record = first.plan->record();
        ASSERT_FALSE(record.empty());
        EXPECT_NE(record.find("\"algo\":"), std::string::npos) << record;
        EXPECT_NE(record.find("\"math\":"), std::string::npos) << record;
        EXPECT_NE(record.find("\"workspace\":"), std::string::npos) << record;
        EXPECT_NE(first.plan->describe().find("cudnn conv algo "), std::string::npos) << first.plan->describe();
        if (dtype == DType::kFloat32) {
          EXPECT_NE(record.find("\"math\":\"FMA_MATH\""), std::string::npos) << record;
        }

        const GpuRun again = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, policy, stream, record);
        const std::string replayed = again.plan->record();
        for (const char* key : {"algo", "math", "fused", "workspace", "deterministic", "chosen_by"}) {
          EXPECT_EQ(record_field(replayed, key), record_field(record, key)) << key << ": " << replayed;
        }
        EXPECT_EQ(again.plan->workspace_bytes(), first.plan->workspace_bytes());
        EXPECT_NE(again.plan->describe().find("from a record"), std::string::npos) << again.plan->describe();
        ASSERT_EQ(again.output.size(), first.output.size());
        EXPECT_EQ(std::memcmp(again.output.data(), first.output.data(), first.output.size() * sizeof(float)), 0)
            << "a plan re-created from its record must give the same bits";
      }
    }
  }
}

TEST(CudnnBackend, Conv2dRecordErrors) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  const Kernel& kernel = kernel_of("conv2d", "cudnn");
  ExecutionPolicy policy;
  const ConvProblem with_bias = conv_problem(conv_cases()[0], {true, false, false}, DType::kFloat16, 7);
  const ConvProblem no_bias = conv_problem(conv_cases()[0], {false, false, true}, DType::kFloat16, 8);
  XPURT_EXPECT_THROW_WITH(run_on_gpu(kernel, "conv2d", with_bias.cpu_inputs, with_bias.attrs, policy, stream,
                                     R"({"algo":"FASTEST","math":"TENSOR_OP_MATH","fused":true})"),
                          InvalidArgumentError, "unknown algo 'FASTEST'");
  XPURT_EXPECT_THROW_WITH(run_on_gpu(kernel, "conv2d", with_bias.cpu_inputs, with_bias.attrs, policy, stream,
                                     "not json"),
                          InvalidArgumentError, "invalid plan record");
  XPURT_EXPECT_THROW_WITH(run_on_gpu(kernel, "conv2d", with_bias.cpu_inputs, with_bias.attrs, policy, stream,
                                     R"({"algo":"GEMM","math":"TENSOR_OP_MATH","fused":true})"),
                          UnsupportedOperationError, "identity activation only with IMPLICIT_PRECOMP_GEMM");
  XPURT_EXPECT_THROW_WITH(run_on_gpu(kernel, "conv2d", no_bias.cpu_inputs, no_bias.attrs, policy, stream,
                                     R"({"algo":"IMPLICIT_GEMM","math":"TENSOR_OP_MATH","fused":true})"),
                          UnsupportedOperationError, "has no bias");
  const ConvProblem fp32 = conv_problem(conv_cases()[0], {false, false, false}, DType::kFloat32, 9);
  XPURT_EXPECT_THROW_WITH(run_on_gpu(kernel, "conv2d", fp32.cpu_inputs, fp32.attrs, policy, stream,
                                     R"({"algo":"IMPLICIT_GEMM","math":"TENSOR_OP_MATH","fused":false})"),
                          UnsupportedOperationError, "not allowed for float32 under precision fp32");
  // A valid hand-written record: IMPLICIT_GEMM needs no workspace and always runs.
  const GpuRun manual = run_on_gpu(kernel, "conv2d", fp32.cpu_inputs, fp32.attrs, policy, stream,
                                   R"({"algo":"IMPLICIT_GEMM","math":"FMA_MATH","fused":false})");
  EXPECT_NE(manual.plan->describe().find("IMPLICIT_GEMM, fma math"), std::string::npos) << manual.plan->describe();
  double atol, rtol;
  tolerance(DType::kFloat32, fp32.terms, &atol, &rtol);
  expect_close(manual.output, reference("conv2d", fp32.cpu_inputs, fp32.attrs), atol, rtol, "IMPLICIT_GEMM record");
}

// Note [cuDNN conv plan record]: the recorded workspace is taken as is from a record of the same cuDNN on a device of
// the same compute capability (the query it saves is most of a replayed plan's cost), recomputed from any other.
TEST(CudnnBackend, Conv2dRecordWorkspaceIsTrustedOnlyFromTheSameLibraryAndDevice) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  const Kernel& kernel = kernel_of("conv2d", "cudnn");
  ExecutionPolicy policy;
  const ConvProblem p = conv_problem(conv_cases()[0], {true, false, true}, DType::kFloat16, 21);
  const GpuRun first = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, policy, stream);
  const std::string record = first.plan->record();
  const std::size_t needed = first.plan->workspace_bytes();
  EXPECT_EQ(record_field(record, "sm"), std::to_string(device_compute_capability(Device::cuda(0)))) << record;
  // The same record with a larger workspace (still enough to run): taken as recorded.
  const std::string larger = std::to_string(needed + 4096);
  // `json` with the value of `key` replaced by `value`.
  auto with = [](std::string json, const std::string& key, const std::string& value) {
    const std::string tag = "\"" + key + "\":";
    const auto at = json.find(tag) + tag.size();
    json.replace(at, json.find_first_of(",}", at) - at, value);
    return json;
  };
  const std::string larger_record = with(record, "workspace", larger);
  const GpuRun trusted = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, policy, stream, larger_record);
  EXPECT_EQ(trusted.plan->workspace_bytes(), needed + 4096);
  EXPECT_EQ(std::memcmp(trusted.output.data(), first.output.data(), first.output.size() * sizeof(float)), 0);
  // Another device or another cuDNN: queried again.
  for (const char* key : {"sm", "cudnn_version"}) {
    SCOPED_TRACE(key);
    const std::string changed = with(larger_record, key, "1");
    const GpuRun queried = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, policy, stream, changed);
    EXPECT_EQ(queried.plan->workspace_bytes(), needed) << changed;
  }
}

TEST(CudnnBackend, Conv2dHonoursDeterminismAndWorkspaceLimit) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  ExecutionPolicy deterministic;
  deterministic.deterministic = true;
  ExecutionPolicy tiny;
  tiny.workspace_limit = 1;  // only algorithms without workspace
  std::uint32_t seed = 300;
  for (const char* name : {"cudnn", "cudnn_search"}) {
    const Kernel& kernel = kernel_of("conv2d", name);
    for (const ConvCase& cc : {conv_cases()[0], conv_cases()[2], conv_cases()[3]}) {
      SCOPED_TRACE(std::string(name) + ", " + cc.name);
      const ConvProblem p = conv_problem(cc, {true, false, true}, DType::kFloat16, seed++);
      const auto want = reference("conv2d", p.cpu_inputs, p.attrs);
      double atol, rtol;
      tolerance(DType::kFloat16, p.terms, &atol, &rtol);

      const GpuRun det = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, deterministic, stream);
      EXPECT_NE(det.plan->record().find("\"deterministic\":true"), std::string::npos) << det.plan->record();
      expect_close(det.output, want, atol, rtol, "deterministic");
      const GpuRun det_again = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, deterministic, stream,
                                          det.plan->record());
      EXPECT_EQ(std::memcmp(det_again.output.data(), det.output.data(), det.output.size() * sizeof(float)), 0);

      const GpuRun small = run_on_gpu(kernel, "conv2d", p.cpu_inputs, p.attrs, tiny, stream);
      EXPECT_EQ(small.plan->workspace_bytes(), 0u) << small.plan->describe();
      expect_close(small.output, want, atol, rtol, "workspace limit 1 byte");
    }
  }
}

TEST(CudnnBackend, Conv2dPlanRunsConcurrentlyOnTwoThreads) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  const ConvProblem p = conv_problem(conv_cases()[0], {true, true, true}, DType::kFloat32, 400);
  const GpuRun run = run_on_gpu(kernel_of("conv2d", "cudnn"), "conv2d", p.cpu_inputs, p.attrs, {}, stream);
  std::vector<std::vector<float>> outputs(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      Stream own = Stream::create(Device::cuda(0));
      const std::vector<Tensor> inputs = to_device(p.cpu_inputs, Device::cuda(0), own);
      for (int repeat = 0; repeat < 5; ++repeat) outputs[t] = run_plan(*run.plan, run.desc, inputs, own);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& out : outputs) {
    ASSERT_EQ(out.size(), run.output.size());
    EXPECT_EQ(std::memcmp(out.data(), run.output.data(), out.size() * sizeof(float)), 0);
  }
}

TEST(CudnnBackend, Conv2dEmptyBatchIsANoOp) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  const ConvCase empty{0, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, "empty batch"};
  const ConvProblem p = conv_problem(empty, {true, false, true}, DType::kFloat32, 500);
  const GpuRun run = run_on_gpu(kernel_of("conv2d", "cudnn"), "conv2d", p.cpu_inputs, p.attrs, {}, stream);
  EXPECT_TRUE(run.output.empty());
  EXPECT_EQ(run.plan->workspace_bytes(), 0u);
}

// Every plan of this backend can be captured into a CUDA graph (after one eager warm-up run, as a session
// does) and its replay gives the eager output bit for bit.
TEST(CudnnBackend, PlansReplayFromACudaGraph) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream owned_stream = Stream::create(Device::cuda(0));
  const StreamView stream = owned_stream.view();
  const ExecutionPolicy policy;
  std::mt19937 rng(1000);
  const DType dtype = DType::kFloat16;
  struct Case {
    std::string op, kernel;
    std::vector<Tensor> cpu_inputs;
    Attributes attrs;
  };
  std::vector<Case> cases;
  for (const char* name : {"cudnn", "cudnn_search"}) {
    for (const Epilogue& epilogue : {Epilogue{true, true, true}, Epilogue{false, true, true}}) {
      const ConvProblem p = conv_problem(conv_cases()[0], epilogue, dtype, static_cast<std::uint32_t>(rng()));
      cases.push_back({"conv2d", name, p.cpu_inputs, p.attrs});
    }
  }
  const Shape x_shape = {2, 3, 9, 7};
  const Tensor x = cpu_tensor(x_shape, random_values(numel_of(x_shape), rng), dtype);
  Attributes pool_attrs;
  pool_attrs.set("kernel_shape", std::vector<std::int64_t>{3, 3});
  cases.push_back({"max_pool2d", "cudnn", {x}, pool_attrs});
  cases.push_back({"global_avg_pool", "cudnn", {x}, {}});
  cases.push_back({"batch_norm", "cudnn",
                   {x, cpu_tensor({3}, {0.5f, 1.0f, -1.0f}, dtype), cpu_tensor({3}, {0.25f, 0.0f, 1.0f}, dtype),
                    cpu_tensor({3}, {0.0f, 0.5f, -0.5f}, dtype), cpu_tensor({3}, {1.0f, 0.5f, 2.0f}, dtype)},
                   {}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + ":" + c.kernel);
    const Kernel& kernel = kernel_of(c.op, c.kernel);
    const std::vector<Tensor> inputs = to_device(c.cpu_inputs, Device::cuda(0), stream);
    const OpDescriptor desc = make_desc(c.op, inputs, c.attrs, policy);
    const auto plan = kernel.build(desc, policy, "");
    const std::vector<float> eager = run_plan(*plan, desc, inputs, stream);

    // Workspace and launch are set up by hand here: they must exist before the capture begins.
    Tensor out = Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype, desc.device, &stream);
    DataPtr workspace;
    if (plan->workspace_bytes() > 0) {
      workspace = MemoryManager::instance().allocate(desc.device, plan->workspace_bytes(), stream);
    }
    KernelLaunch launch;
    launch.desc = &desc;
    launch.inputs = inputs.data();
    launch.num_inputs = inputs.size();
    launch.outputs = &out;
    launch.num_outputs = 1;
    launch.stream = stream;
    launch.workspace = workspace.get();
    launch.workspace_bytes = plan->workspace_bytes();
    stream.synchronize();
    CudaGraph graph;
    graph.capture_begin(stream);
    plan->run(launch);
    graph.capture_end();
    EXPECT_GT(graph.num_nodes(), 0u);
    graph.replay();
    stream.synchronize();
    const std::vector<float> replayed = values_of(out.to(Device::cpu(), &stream));
    ASSERT_EQ(replayed.size(), eager.size());
    EXPECT_EQ(std::memcmp(replayed.data(), eager.data(), eager.size() * sizeof(float)), 0) << plan->describe();
  }
}

TEST(CudnnBackend, PoolsMatchReference) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  struct PoolCase {
    std::string op;
    Shape x, kernel, strides, pads;
    int ceil_mode;
    int count_include_pad;
  };
  const std::vector<PoolCase> cases = {
      {"max_pool2d", {2, 3, 57, 57}, {3, 3}, {2, 2}, {1, 1, 1, 1}, 0, 0},
      {"max_pool2d", {2, 5, 7, 9}, {2, 2}, {2, 2}, {0, 0, 0, 0}, 0, 0},
      {"max_pool2d", {1, 4, 9, 9}, {3, 3}, {2, 2}, {0, 0, 0, 0}, 1, 0},  // ceil_mode == floor here
      {"max_pool2d", {3, 2, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, 0, 0},
      {"avg_pool2d", {2, 3, 57, 57}, {3, 3}, {2, 2}, {1, 1, 1, 1}, 0, 1},
      {"avg_pool2d", {2, 3, 57, 57}, {3, 3}, {2, 2}, {1, 1, 1, 1}, 0, 0},
      {"avg_pool2d", {2, 5, 7, 9}, {3, 2}, {1, 1}, {1, 0, 1, 0}, 0, 0},
      {"avg_pool2d", {2, 5, 7, 9}, {3, 3}, {1, 2}, {1, 1, 1, 1}, 0, 1},
      {"global_avg_pool", {2, 3, 7, 9}, {}, {}, {}, 0, 0},
      {"global_avg_pool", {2, 16, 57, 57}, {}, {}, {}, 0, 0},
      {"global_avg_pool", {4, 8, 1, 1}, {}, {}, {}, 0, 0},
  };
  std::uint32_t seed = 600;
  for (const DType dtype : kDtypes) {
    if (!dtype_runs_here(dtype)) continue;
    for (const PoolCase& pc : cases) {
      Attributes attrs;
      if (pc.op != "global_avg_pool") {
        attrs.set("kernel_shape", pc.kernel);
        attrs.set("strides", pc.strides);
        attrs.set("pads", pc.pads);
        attrs.set("ceil_mode", static_cast<std::int64_t>(pc.ceil_mode));
        if (pc.op == "avg_pool2d") attrs.set("count_include_pad", static_cast<std::int64_t>(pc.count_include_pad));
      }
      const std::string what = pc.op + " " + attrs.str() + " on " + std::to_string(pc.x[2]) + "x" +
                               std::to_string(pc.x[3]) + ", " + std::string(dtype_name(dtype));
      SCOPED_TRACE(what);
      std::mt19937 rng(seed++);
      const std::vector<Tensor> cpu_inputs = {cpu_tensor(pc.x, random_values(numel_of(pc.x), rng), dtype)};
      const GpuRun run = run_on_gpu(kernel_of(pc.op), pc.op, cpu_inputs, attrs, {}, stream);
      double atol, rtol;
      tolerance(dtype, 1.0, &atol, &rtol);  // a max or a mean of values in [-1, 1]
      expect_close(run.output, reference(pc.op, cpu_inputs, attrs), atol, rtol,
                   what + " [" + run.plan->describe() + "]");
    }
  }
}

TEST(CudnnBackend, BatchNormMatchesReference) {
  SKIP_WITHOUT_CUDNN();
  XPURT_SKIP_WITHOUT_GPU();
  Stream stream = Stream::create(Device::cuda(0));
  const std::vector<Shape> shapes = {{2, 3, 7, 9}, {5, 16}, {2, 6, 13}, {1, 4, 3, 5, 7}, {3, 70, 57, 57}, {2, 3, 1, 1}};
  std::uint32_t seed = 700;
  for (const DType dtype : kDtypes) {
    if (!dtype_runs_here(dtype)) continue;
    for (const Shape& shape : shapes) {
      std::string what = "batch_norm on [";
      for (std::size_t k = 0; k < shape.size(); ++k) what += (k ? "," : "") + std::to_string(shape[k]);
      what += "], " + std::string(dtype_name(dtype));
      SCOPED_TRACE(what);
      std::mt19937 rng(seed++);
      const std::int64_t c = shape[1];
      const std::vector<Tensor> cpu_inputs = {
          cpu_tensor(shape, random_values(numel_of(shape), rng), dtype),
          cpu_tensor({c}, random_values(c, rng), dtype),             // scale
          cpu_tensor({c}, random_values(c, rng), dtype),             // bias
          cpu_tensor({c}, random_values(c, rng, -0.5f, 0.5f), dtype),  // mean
          cpu_tensor({c}, random_values(c, rng, 0.25f, 2.0f), dtype),  // var
      };
      Attributes attrs;
      attrs.set("epsilon", 1e-3);
      const GpuRun run = run_on_gpu(kernel_of("batch_norm"), "batch_norm", cpu_inputs, attrs, {}, stream);
      EXPECT_EQ(run.plan->workspace_bytes() > 0, dtype != DType::kFloat32) << run.plan->describe();
      double atol, rtol;
      tolerance(dtype, 4.0, &atol, &rtol);
      expect_close(run.output, reference("batch_norm", cpu_inputs, attrs), atol, rtol,
                   what + " [" + run.plan->describe() + "]");
    }
  }
}

}  // namespace
}  // namespace xpuruntime
