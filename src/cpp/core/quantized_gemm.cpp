// What the GPU kernels of qlinear share (core/quantized_gemm.h, Note [Signed operands of the int8 GEMMs]).
#include "core/quantized_gemm.h"

#include <sstream>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::quantized {

namespace {

constexpr std::size_t kScratchAlignment = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment; }

const Tensor* optional_input(const KernelLaunch& launch, std::size_t i) {
  return i < launch.num_inputs && launch.input(i).defined() ? &launch.input(i) : nullptr;
}

bool present(const OpDescriptor& desc, std::size_t i) { return i < desc.inputs.size() && desc.inputs[i].present; }

DType output_dtype(const std::string& name) {
  if (name == "int8") return DType::kInt8;
  if (name == "uint8") return DType::kUInt8;
  if (name == "float16") return DType::kFloat16;
  if (name == "int32") return DType::kInt32;
  return DType::kFloat32;
}

}  // namespace

QLinearProblem QLinearProblem::of(const OpDescriptor& desc) {
  QLinearProblem p;
  const TensorDesc& x = desc.inputs.at(0);
  const TensorDesc& w = desc.inputs.at(1);
  p.weight_nk = desc.attrs.get_string("weight_layout", "kn") == "nk";
  p.k = x.shape.empty() ? 0 : x.shape.back();
  p.n = p.weight_nk ? w.shape.at(0) : w.shape.at(1);
  p.m = 1;
  for (std::size_t d = 0; d + 1 < x.shape.size(); ++d) p.m *= x.shape[d];
  p.x_unsigned = x.dtype == DType::kUInt8;
  p.dynamic_zero_point = present(desc, 4);
  p.zero_point_signed = p.dynamic_zero_point && desc.inputs[4].dtype == DType::kInt8;
  p.zero_point_correction =
      (p.x_unsigned ? 128 : 0) - static_cast<std::int32_t>(desc.attrs.get_int("x_zero_point", 0));
  p.has_w_scale = present(desc, 2);
  p.w_scale_per_channel = p.has_w_scale && desc.inputs[2].numel() > 1;
  p.int_bias_input = present(desc, 3) && desc.inputs[3].dtype == DType::kInt32;
  p.float_bias_input = present(desc, 3) && desc.inputs[3].dtype == DType::kFloat32;
  p.relu = desc.attrs.get_string("activation", "none") == "relu";
  // As the cpu kernel (backends/cpu/cpu_quant.cpp): the scales rounded to float32 first.
  p.x_scale = static_cast<float>(desc.attrs.get_float("x_scale", 1.0));
  p.y_scale = static_cast<float>(desc.attrs.get_float("y_scale", 1.0));
  p.y_zero_point = static_cast<float>(desc.attrs.get_int("y_zero_point", 0));
  p.out_dtype = output_dtype(desc.attrs.get_string("output_dtype", "float32"));
  return p;
}

std::size_t QLinearProblem::prologue_bytes() const {
  const auto channels = static_cast<std::size_t>(n);
  return aligned(sizeof(float) * (w_scale_per_channel ? channels : 1)) + aligned(sizeof(std::int32_t) * channels);
}

QuantPrologueParams QLinearProblem::prologue(const KernelLaunch& launch, void* scratch, std::int8_t* x_signed) const {
  QuantPrologueParams p;
  auto* bytes = static_cast<unsigned char*>(scratch);
  p.x_scale = x_scale;
  if (const Tensor* w_scale = optional_input(launch, 2)) p.w_scale = static_cast<const float*>(w_scale->data_ptr());
  p.alpha_per_channel = w_scale_per_channel;
  if (makes_alpha()) p.alpha = reinterpret_cast<float*>(bytes);
  if (folds_correction()) {
    p.int_bias = reinterpret_cast<std::int32_t*>(bytes + aligned(sizeof(float) * (w_scale_per_channel ? n : 1)));
    if (int_bias_input) p.bias = static_cast<const std::int32_t*>(launch.input(3).data_ptr());
    p.weight = static_cast<const std::int8_t*>(launch.input(1).data_ptr());
    p.weight_nk = weight_nk;
    p.k = k;
    p.zero_point_correction = zero_point_correction;
    if (dynamic_zero_point) {
      p.x_zero_point = launch.input(4).data_ptr();
      p.x_zero_point_signed = zero_point_signed;
    }
  }
  if (x_signed != nullptr && x_unsigned) {
    p.x = static_cast<const std::uint8_t*>(launch.input(0).data_ptr());
    p.x_signed = x_signed;
    p.x_count = m * k;
  }
  return p;
}

QuantEpilogueParams QLinearProblem::epilogue(const KernelLaunch& launch, void* scratch) const {
  QuantEpilogueParams p;
  auto* bytes = static_cast<unsigned char*>(scratch);
  if (alpha_is_w_scale()) {
    p.alpha = static_cast<const float*>(launch.input(2).data_ptr());
  } else if (needs_alpha()) {
    p.alpha = reinterpret_cast<const float*>(bytes);
  }
  p.alpha_per_channel = w_scale_per_channel;
  if (folds_correction()) {
    p.int_bias = reinterpret_cast<const std::int32_t*>(bytes + aligned(sizeof(float) * (w_scale_per_channel ? n : 1)));
  } else if (int_bias_input) {
    p.int_bias = static_cast<const std::int32_t*>(launch.input(3).data_ptr());
  }
  if (float_bias_input) p.float_bias = static_cast<const float*>(launch.input(3).data_ptr());
  p.relu = relu;
  p.y_scale = y_scale;
  p.y_zero_point = y_zero_point;
  p.out_dtype = out_dtype;
  return p;
}

std::string QLinearProblem::describe_epilogue() const {
  std::ostringstream text;
  if (x_unsigned) text << "x uint8 as x - 128 (int8), ";
  if (folds_correction()) {
    text << (dynamic_zero_point ? "run-time x_zero_point and " : "") << "zero-point correction "
         << zero_point_correction << " * column sums folded into the int32 bias, ";
  } else if (int_bias_input) {
    text << "int32 bias, ";
  }
  if (needs_alpha()) {
    text << (w_scale_per_channel ? "per-channel" : "per-tensor") << (alpha_is_w_scale() ? " alpha (folded), "
                                                                                         : " scales, ");
  }
  if (float_bias_input) text << "float32 bias, ";
  if (relu) text << "relu, ";
  text << "-> " << dtype_name(out_dtype);
  if (out_dtype == DType::kInt8 || out_dtype == DType::kUInt8) {
    text << " (y_scale " << y_scale << ", y_zero_point " << y_zero_point << ")";
  }
  return text.str();
}

}  // namespace xpuruntime::quantized
