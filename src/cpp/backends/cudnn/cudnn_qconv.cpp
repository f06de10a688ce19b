// The int8 convolution of the cudnn backend ("cudnn", op "qconv2d"; Note [Quantized registry ops] in
// core/op_schemas.cpp): cuDNN's runtime-fused int8 convolution through its graph API, the epilogue fused in the same
// graph (Note [cuDNN int8 convolution]).
//
// What it runs (accepts() says why not otherwise): layout NHWC, one group, x int8 with zero point 0 (the symmetric
// activations xrt.quantize and TensorRT-style QDQ models give), input channels a multiple of 16 and output channels a
// multiple of 4, every data pointer 16-byte aligned; output int8, uint8, float32 or float16 (not the int32 of
// ConvInteger); per-tensor or per-channel weight scales, int32 or float32 bias, relu. Everything else runs on
// cuda_raw's kernels (int8_mma, then the generic one).
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/conv_layout.h"
#include "cudnn_graph.h"
#include "cudnn_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {
namespace {

// Note [cuDNN int8 convolution]
// cuDNN 9's runtime fusion compiles one kernel for a convolution with int8 x and w, int32 accumulation, and the
// pointwise operations after it, which are the registry op's epilogue (the cpu kernel's, Note [Quantized registry
// ops]). The graph, every tensor NHWC-strided, every tensor between the convolution and y virtual:
//   acc = conv(x int8, w int8)                  int32
//   v = acc + bias                              int32 bias [1, O, 1, 1], computed in float32 (when the bias is int32)
//   v = v * w_scale                             float32 [1, O, 1, 1] or [1, 1, 1, 1] (absent: no step)
//   v = v * x_scale                             a by-value float (only where x_scale != 1: the quantized_constants
//                                               pass folds it into w_scale in models)
//   v = v + bias                                float32 bias [1, O, 1, 1] (when the bias is float32)
//   v = relu(v)                                 (activation relu)
//   y = v / y_scale + y_zero_point              by-value floats; y int8 or uint8, cuDNN's conversion
//   (or y = v, float32 or float16)
// The last step writes y (an identity step when there is none). On an H200 (docs/benchmarks.md, 2026-12-02) it ran
// ResNet-50's convolutions after the stem in 535 us at batch 16 against int8_mma's 1043 and cuDNN float16's 570, so it
// ranks before cuda_raw's kernels (registration order). What it gives up is bit equality with the cpu kernel: cuDNN
// converts the int32 sum to float32 before the bias and scales (the cpu kernel adds an int32 bias exactly first), and
// rounds and saturates to 8 bits by its own code, so an 8-bit output may differ by one level where the exact value
// falls near a half level, and a float output by float32 rounding. A policy that needs the cpu kernel's bits pins
// qconv2d to int8_mma (KernelPolicy(qconv2d="int8_mma")) or asks for deterministic kernels (this one is not
// registered as deterministic: cuDNN does not promise a fixed reduction order for every engine).

constexpr const char* kLabel = "cudnn qconv2d";
constexpr std::int64_t kChannelMultiple = 16;  // of the input channels: the stem (3 or 4 channels) stays on cuda_raw
constexpr std::int64_t kOutputMultiple = 4;

// Unique ids of the tensors the variant pack names; the virtual ones only need to be distinct.
enum Uid : std::int64_t {
  kX = 1, kW = 2, kWScale = 3, kBias = 4, kY = 5, kXScale = 6, kYScale = 7, kYZeroPoint = 8,
  kVirtual = 100,
};

// One qconv2d's sizes (read as NCHW) and epilogue, fixed at build time.
struct QConvShape {
  std::int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, p = 0, q = 0;
  std::int64_t stride[2] = {1, 1}, dilation[2] = {1, 1}, pre[2] = {0, 0}, post[2] = {0, 0};
  bool w_scale = false, per_channel = false, int_bias = false, float_bias = false, relu = false;
  DType out = DType::kFloat32;
  // By-value operands, read by pointer at each run.
  float x_scale = 1.0f, y_scale = 1.0f, y_zero_point = 0.0f;
};

QConvShape shape_of(const OpDescriptor& desc) {
  const auto x = detail::as_nchw(desc.inputs[0].shape, true);
  const auto w = detail::as_nchw(desc.inputs[1].shape, true);
  const auto y = detail::as_nchw(desc.outputs.at(0).shape, true);
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  QConvShape s;
  s.n = x[0];
  s.c = x[1];
  s.h = x[2];
  s.w = x[3];
  s.k = w[0];
  s.r = w[2];
  s.s = w[3];
  s.p = y[2];
  s.q = y[3];
  const std::int64_t in[2] = {s.h, s.w}, out[2] = {s.p, s.q}, kernel[2] = {s.r, s.s};
  for (int d = 0; d < 2; ++d) {
    s.stride[d] = strides.at(static_cast<std::size_t>(d));
    s.dilation[d] = dilations.at(static_cast<std::size_t>(d));
    s.pre[d] = pads.at(static_cast<std::size_t>(d));
    // The padding after the image that gives exactly the inferred output (what the op's end pads mean).
    s.post[d] = std::max<std::int64_t>(
        0, (out[d] - 1) * s.stride[d] + s.dilation[d] * (kernel[d] - 1) + 1 - in[d] - s.pre[d]);
  }
  s.w_scale = desc.inputs.size() > 2 && desc.inputs[2].present;
  s.per_channel = s.w_scale && desc.inputs[2].numel() != 1;
  const bool bias = desc.inputs.size() > 3 && desc.inputs[3].present;
  s.int_bias = bias && desc.inputs[3].dtype == DType::kInt32;
  s.float_bias = bias && !s.int_bias;
  s.relu = desc.attrs.get_string("activation", "none") == "relu";
  s.out = desc.outputs[0].dtype;
  s.x_scale = static_cast<float>(desc.attrs.get_float("x_scale", 1.0));  // float32 first, as the cpu kernel
  s.y_scale = static_cast<float>(desc.attrs.get_float("y_scale", 1.0));
  s.y_zero_point = static_cast<float>(desc.attrs.get_int("y_zero_point", 0));
  return s;
}

bool eight_bit(DType dtype) { return dtype == DType::kInt8 || dtype == DType::kUInt8; }

cudnnDataType_t output_type(DType dtype) {
  switch (dtype) {
    case DType::kInt8: return CUDNN_DATA_INT8;
    case DType::kUInt8: return CUDNN_DATA_UINT8;
    case DType::kFloat16: return CUDNN_DATA_HALF;
    default: return CUDNN_DATA_FLOAT;
  }
}

// The graph of Note [cuDNN int8 convolution] and its plan.
std::unique_ptr<cudnn::BuiltGraph> build_graph(const QConvShape& s, cudnnHandle_t handle,
                                               std::size_t workspace_limit) {
  cudnn::GraphBuilder g(handle, kLabel, kVirtual);
  constexpr std::size_t kNone = cudnn::GraphBuilder::kNone;
  const std::size_t x = g.tensor(kX, CUDNN_DATA_INT8, {s.n, s.c, s.h, s.w}, {s.h * s.w * s.c, 1, s.w * s.c, s.c});
  const std::size_t w = g.tensor(kW, CUDNN_DATA_INT8, {s.k, s.c, s.r, s.s}, {s.r * s.s * s.c, 1, s.s * s.c, s.c});
  const std::vector<std::int64_t> dims = {s.n, s.k, s.p, s.q}, strides = {s.p * s.q * s.k, 1, s.q * s.k, s.k};
  const std::vector<std::int64_t> channel = {1, s.k, 1, 1}, channel_strides = {s.k, 1, 1, 1};
  const std::vector<std::int64_t> one = {1, 1, 1, 1};
  const std::size_t acc = g.virtual_tensor(CUDNN_DATA_INT32, dims, strides);
  {
    cudnn::BackendDescriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    conv.set_data_type(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_DATA_INT32);
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    conv.set_int(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2);
    conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, s.dilation);
    conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, s.stride);
    conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, s.pre);
    conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, s.post);
    conv.finalize();
    cudnn::BackendDescriptor op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    op.set_descriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, g.part(x));
    op.set_descriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, g.part(w));
    op.set_descriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, g.part(acc));
    op.set_descriptor(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
    const float alpha = 1.0f, beta = 0.0f;
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    g.add_operation(std::move(conv), std::move(op));
  }
  // The epilogue's steps (mode, second operand); the last writes y.
  std::vector<std::pair<cudnnPointwiseMode_t, std::size_t>> steps;
  if (s.int_bias) steps.emplace_back(CUDNN_POINTWISE_ADD, g.tensor(kBias, CUDNN_DATA_INT32, channel, channel_strides));
  if (s.w_scale) {
    const std::size_t w_scale = s.per_channel ? g.tensor(kWScale, CUDNN_DATA_FLOAT, channel, channel_strides)
                                              : g.tensor(kWScale, CUDNN_DATA_FLOAT, one, one);
    steps.emplace_back(CUDNN_POINTWISE_MUL, w_scale);
  }
  if (s.x_scale != 1.0f) {
    steps.emplace_back(CUDNN_POINTWISE_MUL, g.tensor(kXScale, CUDNN_DATA_FLOAT, one, one, /*by_value=*/true));
  }
  if (s.float_bias) {
    steps.emplace_back(CUDNN_POINTWISE_ADD, g.tensor(kBias, CUDNN_DATA_FLOAT, channel, channel_strides));
  }
  if (s.relu) steps.emplace_back(CUDNN_POINTWISE_RELU_FWD, kNone);
  if (eight_bit(s.out)) {
    steps.emplace_back(CUDNN_POINTWISE_DIV, g.tensor(kYScale, CUDNN_DATA_FLOAT, one, one, /*by_value=*/true));
    if (s.y_zero_point != 0.0f) {
      steps.emplace_back(CUDNN_POINTWISE_ADD, g.tensor(kYZeroPoint, CUDNN_DATA_FLOAT, one, one, /*by_value=*/true));
    }
  }
  if (steps.empty()) steps.emplace_back(CUDNN_POINTWISE_IDENTITY, kNone);
  const std::size_t y = g.tensor(kY, output_type(s.out), dims, strides);
  std::size_t value = acc;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::size_t into = i + 1 == steps.size() ? y : g.virtual_tensor(CUDNN_DATA_FLOAT, dims, strides);
    g.pointwise_into(steps[i].first, CUDNN_DATA_FLOAT, value, steps[i].second, kNone, into);
    value = into;
  }
  return g.finish(workspace_limit, "");
}

class QConvPlan final : public KernelPlan {
 public:
  QConvPlan(const QConvShape& shape, int device, std::size_t workspace_limit) : shape_(shape), device_(device) {
    detail::CudaDeviceGuard guard(device_);
    cudnnHandle_t handle = cudnn::thread_handle(device_, nullptr);
    std::unique_ptr<cudnn::BuiltGraph> first = build_graph(shape_, handle, workspace_limit);
    workspace_ = static_cast<std::size_t>(first->workspace);
    engine_ = first->engine;
    graphs_ = std::make_unique<cudnn::GraphsPerHandle>(
        handle, std::move(first),
        [shape = shape_, workspace_limit](cudnnHandle_t h) { return build_graph(shape, h, workspace_limit); },
        kLabel);
  }

  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= workspace_, kLabel, ": the plan needs ", workspace_,
                " bytes of workspace, the launch gives ", launch.workspace_bytes);
    std::int64_t uids[8] = {kX, kW, kY};
    void* data[8] = {launch.input(0).data_ptr(), launch.input(1).data_ptr(), launch.output(0).data_ptr()};
    std::int64_t count = 3;
    const auto add = [&](std::int64_t uid, const void* pointer) {
      uids[count] = uid;
      data[count++] = const_cast<void*>(pointer);
    };
    if (shape_.w_scale) add(kWScale, launch.input(2).data_ptr());
    if (shape_.int_bias || shape_.float_bias) add(kBias, launch.input(3).data_ptr());
    if (shape_.x_scale != 1.0f) add(kXScale, &shape_.x_scale);
    if (eight_bit(shape_.out)) {
      add(kYScale, &shape_.y_scale);
      if (shape_.y_zero_point != 0.0f) add(kYZeroPoint, &shape_.y_zero_point);
    }
    for (std::int64_t i = 0; i < count; ++i) {
      const bool by_value = uids[i] == kXScale || uids[i] == kYScale || uids[i] == kYZeroPoint;
      XPURT_CHECK(by_value || reinterpret_cast<std::uintptr_t>(data[i]) % 16 == 0, kLabel, " needs 16-byte aligned "
                  "operands, but operand ", uids[i], " starts at address ", reinterpret_cast<std::uintptr_t>(data[i]),
                  "; run the plan on the tensors it was built for");
    }
    detail::CudaDeviceGuard guard(device_);
    cudnnHandle_t handle = cudnn::thread_handle(device_, static_cast<cudaStream_t>(launch.stream.handle));
    cudnn::execute(handle, graphs_->of(handle), count, uids, data, launch.workspace);
  }

  std::size_t workspace_bytes() const override { return workspace_; }

  std::string describe() const override {
    return detail::str_cat("cudnn int8 convolution (cuDNN ", cudnn::runtime_version(), ", engine ", engine_,
                           "), NHWC, int32 accumulation, epilogue fused in cuDNN's graph (",
                           shape_.int_bias ? "int32 bias, " : "", shape_.float_bias ? "float bias, " : "",
                           shape_.relu ? "relu, " : "", dtype_name(shape_.out), " output), workspace ",
                           cudnn::format_bytes(workspace_));
  }

 private:
  QConvShape shape_;
  int device_;
  std::size_t workspace_ = 0;
  std::int64_t engine_ = -1;
  std::unique_ptr<cudnn::GraphsPerHandle> graphs_;
};

// What accepts() asks beyond the declaration.
Support check_qconv(const OpDescriptor& desc) {
  if (desc.inputs.size() < 2 || desc.outputs.size() != 1 || desc.outputs[0].dim() != 4) {
    return Support::no(detail::str_cat(kLabel, " needs the output inferred (call KernelRegistry::infer first)"));
  }
  if (!detail::is_nhwc(desc.attrs, desc.op)) {
    return Support::no(detail::str_cat(kLabel, " takes layout NHWC (the nhwc_layout pass makes it), got NCHW"));
  }
  const std::int64_t groups = desc.attrs.get_int("groups", 1);
  if (groups != 1) return Support::no(detail::str_cat(kLabel, " takes one group, got ", groups));
  if (desc.inputs[0].dtype != DType::kInt8) {
    return Support::no(detail::str_cat(kLabel, " takes a signed int8 x, got ", dtype_name(desc.inputs[0].dtype),
                                       " (uint8 activations run on int8_mma)"));
  }
  const std::int64_t zero_point = desc.attrs.get_int("x_zero_point", 0);
  if (zero_point != 0) {
    return Support::no(detail::str_cat(kLabel, " takes x's zero point 0 (cuDNN pads with zeros), got ", zero_point));
  }
  const DType out = desc.outputs[0].dtype;
  if (!eight_bit(out) && out != DType::kFloat32 && out != DType::kFloat16) {
    return Support::no(detail::str_cat(kLabel, " writes int8, uint8, float32 or float16, not ", dtype_name(out)));
  }
  const std::int64_t channels = desc.inputs[0].shape[3], outputs = desc.inputs[1].shape[0];
  if (channels % kChannelMultiple != 0 || outputs % kOutputMultiple != 0) {
    return Support::no(detail::str_cat(kLabel, " takes input channels a multiple of ", kChannelMultiple,
                                       " and output channels a multiple of ", kOutputMultiple, ", got ", channels,
                                       " -> ", outputs));
  }
  return cudnn::check_limits(desc, kLabel);
}

class CudnnQConvKernel final : public Kernel {
 public:
  CudnnQConvKernel()
      : Kernel(KernelInfo{"qconv2d", "cudnn", "cudnn", DeviceType::kCUDA, false,
                          "cuDNN's runtime-fused int8 convolution through its graph API (int8 x with zero point 0, "
                          "NHWC, one group), bias, scales, relu and requantization fused; within one level of the "
                          "cpu kernel (Note [cuDNN int8 convolution])",
                          declaration()}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    try {
      return check_qconv(desc);
    } catch (const std::exception& e) {
      return Support::no(detail::str_cat(kLabel, ": ", e.what()));
    }
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    cudnn::check_graph_build(*this, kLabel, desc, policy, record);
    if (desc.outputs[0].numel() == 0) return std::make_unique<cudnn::EmptyPlan>();
    return std::make_unique<QConvPlan>(shape_of(desc), desc.device.index, cudnn::workspace_limit(policy));
  }

 private:
  static KernelDecl declaration() {
    KernelDecl decl = cudnn::declaration(kLabel, cudnn::kConvAlignment);
    decl.input_names = {"x", "weight", "w_scale", "bias"};
    decl.no_int8 = false;  // an int8 op: it runs whatever the precision
    decl.min_compute_capability = 80;
    // uint8 x passes the declaration so that accepts() can say where it runs instead.
    decl.dtypes =
        DTypeSet{{DType::kInt8, DType::kUInt8, DType::kInt32, DType::kFloat32}, "int8, uint8, int32 and float32"};
    decl.input_dtypes = {DTypeSet{{DType::kInt8, DType::kUInt8}, "int8 or uint8"}, DTypeSet{{DType::kInt8}, "int8"},
                         DTypeSet{{DType::kFloat32}, "float32"},
                         DTypeSet{{DType::kInt32, DType::kFloat32}, "int32 or float32"}};
    decl.input_ranks = {{4, 4}, {4, 4}};
    return decl;
  }
};

}  // namespace

void register_cudnn_qconv(KernelRegistry& registry) { registry.add_kernel(std::make_unique<CudnnQConvKernel>()); }

}  // namespace xpuruntime
