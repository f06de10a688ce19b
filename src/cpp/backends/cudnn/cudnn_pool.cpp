// The pooling kernels of the cudnn backend (docs/ops.md): max_pool2d, avg_pool2d and global_avg_pool, named
// "cudnn", through cudnnPoolingForward on NCHW float32/float16/bfloat16 tensors.
//
// cuDNN's legacy pooling descriptor has one pad per spatial dim (symmetric pads only), no dilation, and computes
// floor output sizes: ceil_mode is supported exactly where it gives the floor size (the last window does not
// start past the padded input), and rejected with the two sizes otherwise. avg_pool2d's count_include_pad picks
// CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING or ..._EXCLUDE_PADDING. global_avg_pool is an average pooling
// window of H x W. Max pooling propagates NaN (like PyTorch and the cpu kernel).
//
// Note [Pools are timed]
// cuDNN's pooling is the first choice, but not bandwidth-bound at every shape: ResNet-50's 3x3 stride-2 max pool over
// [16, 64, 112, 112] channels-last took 44 us on an H100, 25% of its floor (the suite's audit, 2026-12-06,
// docs/benchmarks.md). Timing costs little (a model has few distinct pools, and each runs in microseconds), so every
// cuDNN pooling asks the dispatcher to time it against the other kernels that take it (cuda_raw's, a thread per
// output element, whose neighbouring threads read neighbouring channels channels-last) and keeps the faster (Note
// [Timed first choices] in core/dispatcher.cpp).
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/conv_layout.h"
#include "cudnn_utils.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

namespace {

using cudnn::kOne;
using cudnn::kZero;

struct PoolShape {
  DType dtype = DType::kFloat32;
  std::int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  std::int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
  bool global = false;
  bool nhwc = false;  // layout=NHWC: x and y channels-last
};

// Everything but the output sizes comes from the attributes (validated by the op schema before any kernel sees
// the descriptor), the output sizes from shape inference.
PoolShape pool_shape(const OpDescriptor& desc) {
  PoolShape s;
  s.nhwc = detail::is_nhwc(desc.attrs, desc.op);
  // Logical NCHW dims whatever the layout (the descriptors carry the memory order).
  const std::vector<std::int64_t> x = detail::as_nchw(desc.inputs[0].shape, s.nhwc);
  const std::vector<std::int64_t> y = detail::as_nchw(desc.outputs[0].shape, s.nhwc);
  s.dtype = desc.inputs[0].dtype;
  s.n = x[0];
  s.c = x[1];
  s.h = x[2];
  s.w = x[3];
  s.oh = y[2];
  s.ow = y[3];
  if (desc.op == "global_avg_pool") {
    s.global = true;
    s.kernel_h = s.h;
    s.kernel_w = s.w;
    s.mode = CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;  // no padding: the two average modes agree
    return s;
  }
  const auto kernel = desc.attrs.get_ints("kernel_shape", {1, 1});
  const auto strides = desc.attrs.get_ints("strides", kernel);
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  s.kernel_h = kernel[0];
  s.kernel_w = kernel[1];
  s.stride_h = strides[0];
  s.stride_w = strides[1];
  s.pad_h = pads[0];
  s.pad_w = pads[1];
  if (desc.op == "max_pool2d") {
    s.mode = CUDNN_POOLING_MAX;
  } else {
    s.mode = desc.attrs.get_int("count_include_pad", 0) != 0 ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                              : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  }
  return s;
}

// cuDNN's output size: floor((in + 2 * pad - window) / stride) + 1.
std::int64_t floor_size(std::int64_t in, std::int64_t window, std::int64_t stride, std::int64_t pad) {
  return (in + 2 * pad - window) / stride + 1;
}

std::string label_of(const std::string& op) { return "cudnn " + op; }

// What a pooling kernel's declaration (cudnn::declaration, element-size aligned) cannot say.
Support pool_supports(const OpDescriptor& desc) {
  const std::string label = label_of(desc.op);
  try {
    Support limits = cudnn::check_limits(desc, label.c_str());
    if (!limits) return limits;
    if (desc.inputs.empty() || desc.inputs[0].dim() != 4 || desc.outputs.size() != 1 || desc.outputs[0].dim() != 4) {
      return Support::no(label + " needs a 4-D x with the output inferred (call KernelRegistry::infer first)");
    }
    const TensorDesc& x = desc.inputs[0];
    if (desc.op == "global_avg_pool") {
      const PoolShape s = pool_shape(desc);
      if (desc.outputs[0].numel() > 0 && (s.h == 0 || s.w == 0)) {
        return Support::no(detail::str_cat(label, " needs H and W >= 1 (the mean of nothing is undefined), got x ",
                                           x.str()));
      }
      return Support::yes();
    }
    const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
    if (pads.size() == 4 && (pads[0] != pads[2] || pads[1] != pads[3])) {
      return Support::no(detail::str_cat("cudnn needs symmetric pads (top == bottom, left == right), got ",
                                         cudnn::format_ints(pads), "; pad the input explicitly first"));
    }
    if (desc.op == "max_pool2d") {
      const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
      for (const auto d : dilations) {
        if (d != 1) {
          return Support::no(detail::str_cat("cudnn max pooling has no dilation, got dilations ",
                                             cudnn::format_ints(dilations)));
        }
      }
    }
    constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
    for (const char* name : {"kernel_shape", "strides", "pads"}) {
      for (const auto value : desc.attrs.get_ints(name, {})) {
        if (value > kMaxInt) {
          return Support::no(detail::str_cat(label, ": attribute '", name, "' value ", value,
                                             " does not fit cuDNN's 32-bit ints"));
        }
      }
    }
    const PoolShape s = pool_shape(desc);
    const std::int64_t floor_h = floor_size(s.h, s.kernel_h, s.stride_h, s.pad_h);
    const std::int64_t floor_w = floor_size(s.w, s.kernel_w, s.stride_w, s.pad_w);
    if (floor_h != s.oh || floor_w != s.ow) {
      return Support::no(detail::str_cat("cudnn computes floor output sizes: ceil_mode=1 gives ", s.oh, "x", s.ow,
                                         " here but cuDNN would give ", floor_h, "x", floor_w,
                                         "; use ceil_mode=0 or pad the input so that both agree"));
    }
    return Support::yes();
  } catch (const std::exception& e) {
    return Support::no(detail::str_cat(label, ": ", e.what()));
  }
}

class PoolPlan final : public KernelPlan {
 public:
  PoolPlan(const PoolShape& shape, int device) : shape_(shape), device_(device) {
    cudnn::set_4d(x_, shape_.dtype, shape_.nhwc, shape_.n, shape_.c, shape_.h, shape_.w);
    cudnn::set_4d(y_, shape_.dtype, shape_.nhwc, shape_.n, shape_.c, shape_.oh, shape_.ow);
    XPURT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
        pooling_.get(), shape_.mode, CUDNN_PROPAGATE_NAN, static_cast<int>(shape_.kernel_h),
        static_cast<int>(shape_.kernel_w), static_cast<int>(shape_.pad_h), static_cast<int>(shape_.pad_w),
        static_cast<int>(shape_.stride_h), static_cast<int>(shape_.stride_w)));
    int dims[4] = {0, 0, 0, 0};
    XPURT_CUDNN_CHECK(
        cudnnGetPooling2dForwardOutputDim(pooling_.get(), x_.get(), &dims[0], &dims[1], &dims[2], &dims[3]));
    XPURT_INTERNAL_ASSERT(dims[0] == shape_.n && dims[1] == shape_.c && dims[2] == shape_.oh && dims[3] == shape_.ow,
                          "cuDNN computes the pooling output [", dims[0], ", ", dims[1], ", ", dims[2], ", ", dims[3],
                          "], the op schema [", shape_.n, ", ", shape_.c, ", ", shape_.oh, ", ", shape_.ow, "]");
  }

  void run(const KernelLaunch& launch) const override {
    detail::CudaDeviceGuard guard(device_);
    cudnnHandle_t handle = cudnn::thread_handle(device_, static_cast<cudaStream_t>(launch.stream.handle));
    XPURT_CUDNN_CHECK(cudnnPoolingForward(handle, pooling_.get(), &kOne, x_.get(), launch.input(0).data_ptr(), &kZero,
                                          y_.get(), launch.output(0).data_ptr()));
  }

  std::string describe() const override {
    const char* layout = shape_.nhwc ? " (NHWC)" : "";
    if (shape_.global) {
      return detail::str_cat("cudnn global average pooling, window ", shape_.kernel_h, "x", shape_.kernel_w, layout);
    }
    const char* kind = "average pooling (pads not counted)";
    if (shape_.mode == CUDNN_POOLING_MAX) kind = "max pooling";
    if (shape_.mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING) kind = "average pooling (pads counted)";
    return detail::str_cat("cudnn ", kind, " ", shape_.kernel_h, "x", shape_.kernel_w, ", stride ", shape_.stride_h,
                           "x", shape_.stride_w, ", pad ", shape_.pad_h, "x", shape_.pad_w, layout);
  }

 private:
  PoolShape shape_;
  int device_;
  cudnn::TensorDescriptor x_;
  cudnn::TensorDescriptor y_;
  cudnn::PoolingDescriptor pooling_;
};

class CudnnPoolKernel final : public Kernel {
 public:
  explicit CudnnPoolKernel(KernelInfo info) : Kernel(std::move(info)) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    return pool_supports(desc);
  }

  // Note [Pools are timed].
  std::string timed_against_others(const OpDescriptor&) const override {
    return "cuDNN's pooling is not bandwidth-bound at every shape (the own kernel may be faster)";
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string&) const override {
    if (desc.outputs[0].numel() == 0) return std::make_unique<cudnn::EmptyPlan>();
    return std::make_unique<PoolPlan>(pool_shape(desc), desc.device.index);
  }
};

}  // namespace

void register_cudnn_pool(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<CudnnPoolKernel>(
      KernelInfo{"max_pool2d", "cudnn", "cudnn", DeviceType::kCUDA, true,
                 "cuDNN max pooling (NCHW or NHWC; symmetric pads, no dilation, floor output sizes)",
                 cudnn::declaration(label_of("max_pool2d"))}));
  registry.add_kernel(std::make_unique<CudnnPoolKernel>(
      KernelInfo{"avg_pool2d", "cudnn", "cudnn", DeviceType::kCUDA, true,
                 "cuDNN average pooling (NCHW or NHWC; symmetric pads, floor output sizes, count_include_pad either way)",
                 cudnn::declaration(label_of("avg_pool2d"))}));
  registry.add_kernel(std::make_unique<CudnnPoolKernel>(
      KernelInfo{"global_avg_pool", "cudnn", "cudnn", DeviceType::kCUDA, true,
                 "cuDNN average pooling with an H x W window (NCHW or NHWC)",
                 cudnn::declaration(label_of("global_avg_pool"))}));
}

}  // namespace xpuruntime
