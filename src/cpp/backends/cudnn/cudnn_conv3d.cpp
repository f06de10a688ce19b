// conv3d and conv_transpose3d ("cudnn"): ONNX Conv and ConvTranspose over three spatial axes through cuDNN's N-d
// descriptors (NCDHW). conv3d is cudnnConvolutionForward; conv_transpose3d is the data gradient of the convolution it
// transposes (Note [ConvTranspose as backward data] in cudnn_conv_transpose.cpp). cuDNN's N-d convolution descriptor
// takes one pad per axis, so both take symmetric pads only (begin == end, what PyTorch's exports write). conv3d's bias,
// residual and ReLU (Note [3-D convolutions fused] in fusion_conv_gemm.cpp) run in the convolution's epilogue through
// cudnnConvolutionBiasActivationForward, by conv2d's rules (Note [cuDNN fused conv epilogue] in cudnn_conv.cpp): with
// a ReLU any algorithm, without one IMPLICIT_PRECOMP_GEMM only; otherwise (and for conv_transpose3d) they are added
// after (cudnnAddTensor, cudnnActivationForward). The algorithm comes from cuDNN's heuristic, the first one whose
// workspace fits the policy's limit (for a fused plan without ReLU, the first IMPLICIT_PRECOMP_GEMM that fits, when
// there is one).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cudnn_utils.h"

namespace xpuruntime {

namespace {

using Ints = std::vector<std::int64_t>;

struct Shape3d {
  DType dtype = DType::kFloat32;
  Ints x, w, y;                   // [N, C, D, H, W], the weight, the output
  Ints pads, strides, dilations;  // 3 each (pads: the begins, equal to the ends)
  std::int64_t groups = 1;
  bool bias = false;
  bool residual = false;  // conv3d's input 3
  bool relu = false;      // conv3d's activation
  bool transpose = false;
};

Shape3d shape_of(const OpDescriptor& desc) {
  Shape3d s;
  s.transpose = desc.op == "conv_transpose3d";
  s.dtype = desc.inputs[0].dtype;
  s.x = desc.inputs[0].shape;
  s.w = desc.inputs[1].shape;
  s.y = desc.outputs[0].shape;
  const Ints pads = desc.attrs.get_ints("pads", Ints(6, 0));
  s.pads = {pads[0], pads[1], pads[2]};
  s.strides = desc.attrs.get_ints("strides", {1, 1, 1});
  s.dilations = desc.attrs.get_ints("dilations", {1, 1, 1});
  s.groups = desc.attrs.get_int("groups", 1);
  s.bias = desc.inputs.size() > 2 && desc.inputs[2].present;
  s.residual = !s.transpose && desc.inputs.size() > 3 && desc.inputs[3].present;
  s.relu = !s.transpose && desc.attrs.get_string("activation", "none") == "relu";
  return s;
}

std::vector<int> as_ints(const Ints& v) { return {v.begin(), v.end()}; }

void set_ncdhw(const cudnn::TensorDescriptor& d, DType dtype, const Ints& shape) {
  const std::vector<int> dims = as_ints(shape);
  std::vector<int> strides(5, 1);
  for (int k = 3; k >= 0; --k)
    strides[static_cast<std::size_t>(k)] =
        strides[static_cast<std::size_t>(k) + 1] * dims[static_cast<std::size_t>(k) + 1];
  XPURT_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d.get(), cudnn::data_type(dtype), 5, dims.data(), strides.data()));
}

struct Descriptors3d {
  cudnn::TensorDescriptor x;  // forward convolution's input (conv_transpose3d: y)
  cudnn::FilterDescriptor w;
  cudnn::ConvolutionDescriptor conv;
  cudnn::TensorDescriptor y;  // forward convolution's output (conv_transpose3d: x)
  cudnn::TensorDescriptor out;
  cudnn::TensorDescriptor bias;

  Descriptors3d(const Shape3d& s, cudnnMathType_t math) {
    set_ncdhw(x, s.dtype, s.transpose ? s.y : s.x);
    set_ncdhw(y, s.dtype, s.transpose ? s.x : s.y);
    set_ncdhw(out, s.dtype, s.y);
    set_ncdhw(bias, s.dtype, {1, s.y[1], 1, 1, 1});
    // The forward convolution's filter: [K, C/groups, kd, kh, kw]; the transposed one's bytes read as [C, O/groups,
    // ...].
    const std::vector<int> filter = as_ints(s.w);
    XPURT_CUDNN_CHECK(
        cudnnSetFilterNdDescriptor(w.get(), cudnn::data_type(s.dtype), CUDNN_TENSOR_NCHW, 5, filter.data()));
    const std::vector<int> pads = as_ints(s.pads), strides = as_ints(s.strides), dilations = as_ints(s.dilations);
    XPURT_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(conv.get(), 3, pads.data(), strides.data(), dilations.data(),
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    XPURT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), static_cast<int>(s.groups)));
    XPURT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math));
  }
};

class Conv3dPlan final : public KernelPlan {
 public:
  Conv3dPlan(const Shape3d& s, int device, std::size_t limit) : s_(s), device_(device) {
    const cudnnMathType_t math = s.dtype == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    d_ = std::make_unique<Descriptors3d>(s, math);
    detail::CudaDeviceGuard guard(device_);
    cudnnHandle_t handle = cudnn::thread_handle(device_, nullptr);
    int max_count = 0;
    if (!s.transpose) {
      XPURT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(static_cast<std::size_t>(std::max(max_count, 1)));
      int returned = 0;
      XPURT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, d_->x.get(), d_->w.get(), d_->conv.get(),
                                                               d_->y.get(), max_count, &returned, perfs.data()));
      // Without a ReLU the fused epilogue needs IMPLICIT_PRECOMP_GEMM: that one first, then the ranking unfused.
      const bool want_precomp = s.bias && !s.relu;
      for (int pass = want_precomp ? 0 : 1; pass < 2 && !found_; ++pass) {
        for (int k = 0; k < returned && !found_; ++k) {
          const auto& p = perfs[static_cast<std::size_t>(k)];
          if (pass == 0 && p.algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) continue;
          std::size_t bytes = 0;
          if (p.status != CUDNN_STATUS_SUCCESS ||
              cudnnGetConvolutionForwardWorkspaceSize(handle, d_->x.get(), d_->w.get(), d_->conv.get(), d_->y.get(),
                                                      p.algo, &bytes) != CUDNN_STATUS_SUCCESS ||
              bytes > limit) {
            continue;
          }
          forward_ = p.algo;
          workspace_ = bytes;
          found_ = true;
        }
      }
      fused_ = s.bias && (s.relu || forward_ == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
      XPURT_CUDNN_CHECK(cudnnSetActivationDescriptor(activation_.get(),
                                                     s.relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
                                                     CUDNN_PROPAGATE_NAN, 0.0));
    } else {
      XPURT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(static_cast<std::size_t>(std::max(max_count, 1)));
      int returned = 0;
      XPURT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d_->w.get(), d_->y.get(), d_->conv.get(),
                                                                    d_->x.get(), max_count, &returned, perfs.data()));
      for (int k = 0; k < returned && !found_; ++k) {
        const auto& p = perfs[static_cast<std::size_t>(k)];
        std::size_t bytes = 0;
        if (p.status != CUDNN_STATUS_SUCCESS ||
            cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d_->w.get(), d_->y.get(), d_->conv.get(), d_->x.get(),
                                                         p.algo, &bytes) != CUDNN_STATUS_SUCCESS ||
            bytes > limit) {
          continue;
        }
        backward_ = p.algo;
        workspace_ = bytes;
        found_ = true;
      }
    }
    if (!found_) {
      throw UnsupportedOperationError(detail::str_cat("cudnn ", s.transpose ? "conv_transpose3d" : "conv3d",
                                                      ": no algorithm fits the workspace limit ",
                                                      cudnn::format_bytes(limit)));
    }
  }

  std::size_t workspace_bytes() const override { return workspace_; }

  void run(const KernelLaunch& launch) const override {
    detail::CudaDeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(launch.stream.handle);
    cudnnHandle_t handle = cudnn::thread_handle(device_, stream);
    void* out = launch.output(0).data_ptr();
    void* scratch = workspace_ > 0 ? launch.workspace : nullptr;
    const void* residual = s_.residual ? launch.input(3).data_ptr() : nullptr;
    if (fused_) {  // act(conv + bias + residual): z = residual, or y itself with alpha2 = 0 (not read)
      const float alpha2 = residual != nullptr ? 1.0f : 0.0f;
      const cudnnStatus_t status = cudnnConvolutionBiasActivationForward(
          handle, &cudnn::kOne, d_->x.get(), launch.input(0).data_ptr(), d_->w.get(), launch.input(1).data_ptr(),
          d_->conv.get(), forward_, scratch, workspace_, &alpha2, d_->out.get(), residual != nullptr ? residual : out,
          d_->bias.get(), launch.input(2).data_ptr(), activation_.get(), d_->out.get(), out);
      // A cuDNN that declines the fused form for these descriptors says so before launching anything: the same
      // result then comes from the unfused calls below (the bias, residual and ReLU after the convolution).
      if (status != CUDNN_STATUS_NOT_SUPPORTED) {
        XPURT_CUDNN_CHECK(status);
        return;
      }
    }
    if (!s_.transpose) {
      XPURT_CUDNN_CHECK(cudnnConvolutionForward(handle, &cudnn::kOne, d_->x.get(), launch.input(0).data_ptr(),
                                                d_->w.get(), launch.input(1).data_ptr(), d_->conv.get(), forward_,
                                                scratch, workspace_, &cudnn::kZero, d_->y.get(), out));
    } else {
      XPURT_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &cudnn::kOne, d_->w.get(), launch.input(1).data_ptr(),
                                                     d_->y.get(), launch.input(0).data_ptr(), d_->conv.get(), backward_,
                                                     scratch, workspace_, &cudnn::kZero, d_->x.get(), out));
    }
    if (s_.bias) {
      XPURT_CUDNN_CHECK(cudnnAddTensor(handle, &cudnn::kOne, d_->bias.get(), launch.input(2).data_ptr(), &cudnn::kOne,
                                       d_->out.get(), out));
    }
    if (residual != nullptr) {
      XPURT_CUDNN_CHECK(cudnnAddTensor(handle, &cudnn::kOne, d_->out.get(), residual, &cudnn::kOne, d_->out.get(), out));
    }
    if (s_.relu) {
      XPURT_CUDNN_CHECK(cudnnActivationForward(handle, activation_.get(), &cudnn::kOne, d_->out.get(), out,
                                               &cudnn::kZero, d_->out.get(), out));
    }
  }

  std::string describe() const override {
    return detail::str_cat("cudnn ", s_.transpose ? "backward-data" : "forward", " algo ",
                           s_.transpose ? static_cast<int>(backward_) : static_cast<int>(forward_), " (3-D, kernel ",
                           cudnn::format_ints({s_.w[2], s_.w[3], s_.w[4]}), ", groups ", s_.groups, "), workspace ",
                           cudnn::format_bytes(workspace_), epilogue());
  }

 private:
  Shape3d s_;
  int device_;
  std::unique_ptr<Descriptors3d> d_;
  cudnnConvolutionFwdAlgo_t forward_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t backward_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  std::size_t workspace_ = 0;
  bool found_ = false;
  bool fused_ = false;  // cudnnConvolutionBiasActivationForward
  cudnn::ActivationDescriptor activation_;

  // ", fused epilogue: bias + residual + ReLU" / ", then bias, ReLU" ("" with nothing after the convolution).
  std::string epilogue() const {
    std::string parts;
    for (const auto& [on, name] : {std::pair{s_.bias, "bias"}, {s_.residual, "residual"}, {s_.relu, "ReLU"}}) {
      if (on) parts += (parts.empty() ? "" : fused_ ? " + " : ", ") + std::string(name);
    }
    if (parts.empty()) return {};
    return (fused_ ? ", fused epilogue: " : ", then ") + parts;
  }
};

class CudnnConv3dKernel final : public Kernel {
 public:
  explicit CudnnConv3dKernel(const std::string& op)
      : Kernel(KernelInfo{op, "cudnn", "cudnn", DeviceType::kCUDA, false,
                          op == "conv3d" ? "cuDNN's N-d convolution forward (NCDHW, symmetric pads)"
                                         : "cuDNN's N-d convolution data gradient (NCDHW, symmetric pads)",
                          cudnn::declaration("cudnn " + op, cudnn::kConvAlignment)}),
        op_(op) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    const std::string label = "cudnn " + op_;
    const Support limits = cudnn::check_limits(desc, label.c_str());
    if (!limits) return limits;
    const Ints pads = desc.attrs.get_ints("pads", Ints(6, 0));
    if (pads.size() != 6 || pads[0] != pads[3] || pads[1] != pads[4] || pads[2] != pads[5]) {
      return Support::no(label + " takes symmetric pads only (begin == end per axis), got " + cudnn::format_ints(pads));
    }
    if (op_ == "conv_transpose3d") {
      if (policy.deterministic) {
        return Support::no(label +
                           ": cuDNN's data-gradient algorithms may accumulate with atomics (deterministic=true)");
      }
      const Ints strides = desc.attrs.get_ints("strides", {1, 1, 1});
      const Ints output_padding = desc.attrs.get_ints("output_padding", {0, 0, 0});
      for (std::size_t k = 0; k < 3; ++k) {
        if (output_padding[k] >= strides[k]) {
          return Support::no(label + " needs output_padding smaller than the stride, got " +
                             cudnn::format_ints(output_padding));
        }
      }
    }
    const std::size_t element = dtype_size(desc.inputs[0].dtype);
    if (element != 2 && element != 4) return Support::no(label + " takes float32/float16/bfloat16");
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string&) const override {
    if (desc.outputs[0].numel() == 0) return std::make_unique<cudnn::EmptyPlan>();
    return std::make_unique<Conv3dPlan>(shape_of(desc), desc.device.index, cudnn::workspace_limit(policy));
  }

 private:
  std::string op_;
};

}  // namespace

void register_cudnn_conv3d(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<CudnnConv3dKernel>("conv3d"));
  registry.add_kernel(std::make_unique<CudnnConv3dKernel>("conv_transpose3d"));
}

}  // namespace xpuruntime
