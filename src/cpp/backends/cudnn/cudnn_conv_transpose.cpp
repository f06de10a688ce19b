// conv_transpose2d ("cudnn"): ONNX ConvTranspose in 2-D as the data gradient of the convolution it transposes.
//
// Note [ConvTranspose as backward data]
// y = ConvTranspose(x, w) with x[N, C, H, W] and w[C, O/g, kh, kw] is the gradient with respect to the input of
// a forward convolution whose input has y's shape [N, O, oh, ow], whose output has x's shape and whose filter is
// w read as [K = C, C' = O/g, kh, kw] (the same bytes): cudnnConvolutionBackwardData(w, dy = x) -> dx = y, with
// the forward convolution's pads, strides, dilations and groups. output_padding needs nothing of its own: it only
// makes y taller or wider than the smallest input that the forward convolution maps onto x's shape, and cuDNN
// takes dx's shape from its descriptor. cuDNN's legacy descriptors take symmetric pads only: with asymmetric ones
// (what auto_pad SAME gives) cuDNN computes with the smaller pad of each axis into a taller or wider buffer in the
// workspace, and a crop kernel copies the window the real pads keep. The bias is added after (cudnnAddTensor).
// The algorithm comes from cuDNN's heuristic (cudnnGetConvolutionBackwardDataAlgorithm_v7), the first one whose
// workspace fits the policy's limit.
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cudnn_kernels.h"
#include "cudnn_utils.h"

namespace xpuruntime {

namespace {

struct TransposeShape {
  DType dtype = DType::kFloat32;
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // x
  std::int64_t o = 0, oh = 0, ow = 0;       // y
  std::int64_t kh = 0, kw = 0, groups = 1;
  std::int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  bool bias = false;
  // Asymmetric pads: cuDNN's output is [N, O, big_h, big_w] (pads pad_h, pad_w: the smaller of each axis), cropped
  // from (crop_top, crop_left).
  std::int64_t big_h = 0, big_w = 0, crop_top = 0, crop_left = 0;
  bool cropped() const { return big_h != oh || big_w != ow; }
};

TransposeShape shape_of(const OpDescriptor& desc) {
  TransposeShape s;
  const auto& x = desc.inputs[0].shape;
  const auto& w = desc.inputs[1].shape;
  const auto& y = desc.outputs[0].shape;
  s.dtype = desc.inputs[0].dtype;
  s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3];
  s.o = y[1], s.oh = y[2], s.ow = y[3];
  s.kh = w[2], s.kw = w[3];
  s.groups = desc.attrs.get_int("groups", 1);
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  s.pad_h = std::min(pads[0], pads[2]), s.pad_w = std::min(pads[1], pads[3]);
  s.crop_top = pads[0] - s.pad_h, s.crop_left = pads[1] - s.pad_w;
  s.big_h = s.oh + (pads[0] - s.pad_h) + (pads[2] - s.pad_h);
  s.big_w = s.ow + (pads[1] - s.pad_w) + (pads[3] - s.pad_w);
  s.stride_h = strides[0], s.stride_w = strides[1];
  s.dilation_h = dilations[0], s.dilation_w = dilations[1];
  s.bias = desc.inputs.size() > 2 && desc.inputs[2].present;
  return s;
}

struct Descriptors {
  cudnn::TensorDescriptor dy;  // x
  cudnn::FilterDescriptor w;
  cudnn::ConvolutionDescriptor conv;
  cudnn::TensorDescriptor dx;  // y, or the buffer it is cropped from
  cudnn::TensorDescriptor y;
  cudnn::TensorDescriptor bias;

  Descriptors(const TransposeShape& s, cudnnMathType_t math) {
    cudnn::set_nchw(dy, s.dtype, s.n, s.c, s.h, s.w);
    XPURT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), cudnn::data_type(s.dtype), CUDNN_TENSOR_NCHW,
                                                 static_cast<int>(s.c), static_cast<int>(s.o / s.groups),
                                                 static_cast<int>(s.kh), static_cast<int>(s.kw)));
    XPURT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.get(), static_cast<int>(s.pad_h), static_cast<int>(s.pad_w),
                                                      static_cast<int>(s.stride_h), static_cast<int>(s.stride_w),
                                                      static_cast<int>(s.dilation_h), static_cast<int>(s.dilation_w),
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    XPURT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), static_cast<int>(s.groups)));
    XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math));
    cudnn::set_nchw(dx, s.dtype, s.n, s.o, s.big_h, s.big_w);
    cudnn::set_nchw(y, s.dtype, s.n, s.o, s.oh, s.ow);
    cudnn::set_nchw(bias, s.dtype, 1, s.o, 1, 1);
  }
};

class TransposePlan final : public KernelPlan {
 public:
  TransposePlan(const TransposeShape& s, int device, std::size_t limit) : s_(s), device_(device) {
    const cudnnMathType_t math = s.dtype == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    d_ = std::make_unique<Descriptors>(s, math);
    detail::CudaDeviceGuard guard(device_);
    cudnnHandle_t handle = cudnn::thread_handle(device_, nullptr);
    int max_count = 0;
    XPURT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(static_cast<std::size_t>(std::max(max_count, 1)));
    int returned = 0;
    XPURT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d_->w.get(), d_->dy.get(), d_->conv.get(),
                                                                  d_->dx.get(), max_count, &returned, perfs.data()));
    for (int k = 0; k < returned; ++k) {
      const auto& p = perfs[static_cast<std::size_t>(k)];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      std::size_t bytes = 0;
      if (cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d_->w.get(), d_->dy.get(), d_->conv.get(), d_->dx.get(),
                                                       p.algo, &bytes) != CUDNN_STATUS_SUCCESS ||
          bytes > limit) {
        continue;
      }
      algo_ = p.algo;
      cudnn_workspace_ = bytes;
      found_ = true;
      break;
    }
    if (!found_) {
      throw UnsupportedOperationError(detail::str_cat(
          "cudnn conv_transpose2d: no backward-data algorithm fits the workspace limit ", cudnn::format_bytes(limit)));
    }
  }

  // cuDNN's workspace, then (asymmetric pads) the uncropped output, 256-byte aligned.
  std::size_t workspace_bytes() const override { return buffer_offset() + buffer_bytes(); }

  void run(const KernelLaunch& launch) const override {
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    cudnnHandle_t handle = cudnn::thread_handle(device_, stream);
    void* out = launch.output(0).data_ptr();
    void* target = s_.cropped() ? static_cast<char*>(launch.workspace) + buffer_offset() : out;
    XPURT_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &cudnn::kOne, d_->w.get(), launch.input(1).data_ptr(),
                                                   d_->dy.get(), launch.input(0).data_ptr(), d_->conv.get(), algo_,
                                                   cudnn_workspace_ > 0 ? launch.workspace : nullptr,
                                                   cudnn_workspace_, &cudnn::kZero, d_->dx.get(), target));
    if (s_.cropped()) {
      cudnn::launch_crop_2d(dtype_size(s_.dtype), target, out, s_.n * s_.o, s_.big_h, s_.big_w, s_.oh, s_.ow,
                            s_.crop_top, s_.crop_left, stream);
    }
    if (s_.bias) {
      XPURT_CUDNN_CHECK(cudnnAddTensor(handle, &cudnn::kOne, d_->bias.get(), launch.input(2).data_ptr(), &cudnn::kOne,
                                       d_->y.get(), out));
    }
  }

  std::string describe() const override {
    return detail::str_cat("cudnn backward-data algo ", static_cast<int>(algo_), " (ConvTranspose ", s_.kh, "x", s_.kw,
                           ", stride ", s_.stride_h, "x", s_.stride_w, ", groups ", s_.groups, "), workspace ",
                           cudnn::format_bytes(cudnn_workspace_), s_.cropped() ? ", asymmetric pads by a crop" : "");
  }

 private:
  std::size_t buffer_offset() const { return (cudnn_workspace_ + 255) / 256 * 256; }
  std::size_t buffer_bytes() const {
    return s_.cropped() ? static_cast<std::size_t>(s_.n * s_.o * s_.big_h * s_.big_w) * dtype_size(s_.dtype) : 0;
  }

  TransposeShape s_;
  int device_;
  std::unique_ptr<Descriptors> d_;
  cudnnConvolutionBwdDataAlgo_t algo_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  std::size_t cudnn_workspace_ = 0;
  bool found_ = false;
};

class CudnnConvTransposeKernel final : public Kernel {
 public:
  CudnnConvTransposeKernel()
      : Kernel(
            KernelInfo{"conv_transpose2d", "cudnn", "cudnn", DeviceType::kCUDA, false,
                       "cuDNN's convolution data gradient (Note [ConvTranspose as backward data])",
                       cudnn::declaration("cudnn conv_transpose2d", cudnn::kConvAlignment)}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    const Support limits = cudnn::check_limits(desc, "cudnn conv_transpose2d");
    if (!limits) return limits;
    if (policy.deterministic) {
      return Support::no(
          "cudnn conv_transpose2d: cuDNN's data-gradient algorithms may accumulate with atomics "
          "(deterministic=true)");
    }
    const auto strides = desc.attrs.get_ints("strides", {1, 1});
    const auto output_padding = desc.attrs.get_ints("output_padding", {0, 0});
    for (int k = 0; k < 2; ++k) {
      if (output_padding[k] >= strides[k]) {
        return Support::no(detail::str_cat("cudnn conv_transpose2d needs output_padding smaller than the stride, got ",
                                           cudnn::format_ints(output_padding), " with strides ",
                                           cudnn::format_ints(strides)));
      }
    }
    const std::size_t element = dtype_size(desc.inputs[0].dtype);
    if (element != 2 && element != 4) return Support::no("cudnn conv_transpose2d takes float32/float16/bfloat16");
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string&) const override {
    if (desc.outputs[0].numel() == 0) return std::make_unique<cudnn::EmptyPlan>();
    return std::make_unique<TransposePlan>(shape_of(desc), desc.device.index, cudnn::workspace_limit(policy));
  }
};

}  // namespace

void register_cudnn_conv_transpose(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<CudnnConvTransposeKernel>());
}

}  // namespace xpuruntime
