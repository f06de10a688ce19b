// Registration of conv2d's "depthwise" kernel of the cuda_raw backend (depthwise.cu): cuda_raw's declaration with x
// and weight of rank 4, and what a declaration cannot say (depthwise groups, one dtype, the fused activations, the
// NCHW tile's shared memory). register_cuda_raw_depthwise is called on its own, before cudnn's registration
// (core/backend_registration.cpp), not by register_cuda_raw.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_register.h"
#include "core/conv_layout.h"
#include "core/cuda_utils.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

// conv2d's "depthwise" kernel (depthwise.cu, Notes [Depthwise tiles] and [Channels-last depthwise]): registered
// before cudnn, so that it is the first choice for the depthwise convolutions it takes, and timed against cuDNN's
// there (Note [Timed first choices] in core/dispatcher.cpp): on an H200 it ran MobileViT's 128 x 128 planes at batch
// 16 at half cuDNN's speed (329 against 169 us for seven convolutions).
void register_cuda_raw_depthwise(KernelRegistry& registry) {
  auto depthwise_activation = [](const std::string& name) {
    if (name == "relu") return cuda_raw::DepthwiseActivation::kRelu;
    if (name == "silu") return cuda_raw::DepthwiseActivation::kSilu;
    if (name == "hard_swish") return cuda_raw::DepthwiseActivation::kHardSwish;
    if (name == "relu6") return cuda_raw::DepthwiseActivation::kRelu6;
    if (name == "gelu") return cuda_raw::DepthwiseActivation::kGelu;
    if (name == "gelu_tanh") return cuda_raw::DepthwiseActivation::kGeluTanh;
    return cuda_raw::DepthwiseActivation::kNone;
  };
  // The geometry of a conv2d descriptor, whatever its layout (sizes read as NCHW, Note [Channels last]).
  auto geometry = [](const OpDescriptor& desc) {
    const bool nhwc = detail::is_nhwc(desc.attrs, desc.op);
    const auto x = detail::as_nchw(desc.inputs[0].shape, nhwc);
    const auto w = detail::as_nchw(desc.inputs[1].shape, nhwc);
    const auto strides = desc.attrs.get_ints("strides", {1, 1});
    const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
    const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
    cuda_raw::DepthwiseGeometry g;
    g.batch = static_cast<int>(x[0]);
    g.channels = static_cast<int>(x[1]);
    g.in_h = static_cast<int>(x[2]);
    g.in_w = static_cast<int>(x[3]);
    if (!desc.outputs.empty()) {
      const auto y = detail::as_nchw(desc.outputs[0].shape, nhwc);
      g.out_h = static_cast<int>(y[2]);
      g.out_w = static_cast<int>(y[3]);
    } else {
      g.out_w = 32;
    }
    g.kernel_h = static_cast<int>(w[2]);
    g.kernel_w = static_cast<int>(w[3]);
    g.stride_h = static_cast<int>(strides[0]);
    g.stride_w = static_cast<int>(strides[1]);
    g.pad_top = static_cast<int>(pads[0]);
    g.pad_left = static_cast<int>(pads[1]);
    g.dilation_h = static_cast<int>(dilations[0]);
    g.dilation_w = static_cast<int>(dilations[1]);
    return g;
  };
  // The declaration: cuda_raw's, with x and weight of rank 4.
  KernelDecl decl = cuda_raw::declaration("conv2d", {"x", "weight", "bias", "residual"});
  decl.subject = "depthwise";
  decl.input_ranks = {{4, 4}, {4, 4}};
  auto accepts = [geometry](const OpDescriptor& desc, const ExecutionPolicy&) -> Support {
    try {
      const bool nhwc = detail::is_nhwc(desc.attrs, desc.op);
      const auto x = detail::as_nchw(desc.inputs[0].shape, nhwc);
      const auto w = detail::as_nchw(desc.inputs[1].shape, nhwc);
      const std::int64_t groups = desc.attrs.get_int("groups", 1);
      if (groups != x[1] || w[0] != x[1] || w[1] != 1 || groups == 1) {
        return Support::no("depthwise convolutions only (groups == channels == outputs, weight [C, 1, kh, kw], "
                           "NHWC [C, kh, kw, 1])");
      }
      for (const TensorDesc& t : desc.inputs) {
        if (t.present && t.dtype != desc.inputs[0].dtype) return Support::no("inputs of one dtype only");
      }
      const std::string activation = desc.attrs.get_string("activation", "none");
      if (activation != "none" && activation != "relu" && activation != "silu" && activation != "hard_swish" &&
          activation != "relu6" && activation != "gelu" && activation != "gelu_tanh") {
        return Support::no("activation none, relu, relu6, silu, hard_swish, gelu or gelu_tanh");
      }
      // The NCHW kernels stage a tile of the input; the channels-last ones read it directly.
      if (!nhwc && cuda_raw::depthwise_shared_bytes(geometry(desc)) > 48 * 1024) {
        return Support::no("the kernel's tile needs over 48 KiB");
      }
      return Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  };
  auto run = [geometry, depthwise_activation](const KernelLaunch& launch) {
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    const OpDescriptor& desc = *launch.desc;
    const cuda_raw::DepthwiseGeometry g = geometry(desc);
    const Tensor* bias = launch.num_inputs > 2 && launch.input(2).defined() ? &launch.input(2) : nullptr;
    const Tensor* residual = launch.num_inputs > 3 && launch.input(3).defined() ? &launch.input(3) : nullptr;
    cuda_raw::depthwise_conv2d(launch.input(0).data_ptr(), launch.input(1).data_ptr(),
                               bias ? bias->data_ptr() : nullptr, residual ? residual->data_ptr() : nullptr,
                               launch.output(0).data_ptr(), launch.input(0).dtype(), g,
                               depthwise_activation(desc.attrs.get_string("activation", "none")),
                               detail::is_nhwc(desc.attrs, desc.op), launch.stream.handle);
  };
  registry.add_kernel(std::make_unique<FunctionKernel>(
      KernelInfo{"conv2d", "depthwise", "cuda_raw", DeviceType::kCUDA, true,
                 "depthwise convolution, NCHW (input tile and weights staged in shared memory, one output per "
                 "thread) or NHWC (16-byte channel vectors, a row of outputs per thread); fp32 accumulation, bias, "
                 "residual and relu/relu6/silu/hard_swish/gelu fused (Notes [Depthwise tiles], "
                 "[Channels-last depthwise])",
                 std::move(decl)},
      accepts, run, [](const OpDescriptor&) {
        return std::string("the own depthwise kernel or cuDNN's may be faster at this shape");
      }));
}

}  // namespace xpuruntime
