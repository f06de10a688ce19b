// Registration of qconv2d's cuda_raw kernels (quant_conv.cu, Note [Int8 convolution on the GPU]):
//   "int8_mma"  the tensor-core implicit GEMM (mma.sync m16n8k32) of NHWC convolutions of one group whose input
//               channels are a multiple of 16, x and weight 16-byte aligned, sm_80+; registered first, so that it is
//               the first choice where it fits (the nhwc_layout pass makes the convolutions it takes);
//   "cuda_raw"  the generic kernel of every other qconv2d: either layout, any strides, pads, dilations and groups.
// Both are deterministic and take precision int8 (the op is int8 whatever the policy's precision). A plan's record
// names its path ({"path": "tiled"}); tactics() offers the other path of the same kernel to autotuning.
// register_quantized_conv is called by register_cuda_raw.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda_raw/cuda_raw_register.h"
#include "backends/cuda_raw/quant_conv.h"
#include "core/conv_layout.h"
#include "core/cuda_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cuda_raw {
namespace {

// The geometry of a qconv2d descriptor whose outputs are inferred (sizes read as NCHW whatever the layout).
QConvGeometry qconv_geometry(const OpDescriptor& desc) {
  const bool nhwc = ::xpuruntime::detail::is_nhwc(desc.attrs, desc.op);
  const auto x = ::xpuruntime::detail::as_nchw(desc.inputs[0].shape, nhwc);
  const auto w = ::xpuruntime::detail::as_nchw(desc.inputs[1].shape, nhwc);
  const auto y = ::xpuruntime::detail::as_nchw(desc.outputs.at(0).shape, nhwc);
  const auto strides = desc.attrs.get_ints("strides", {1, 1});
  const auto pads = desc.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto dilations = desc.attrs.get_ints("dilations", {1, 1});
  QConvGeometry g;
  g.nhwc = nhwc;
  g.batch = static_cast<int>(x[0]);
  g.channels = static_cast<int>(x[1]);
  g.in_h = static_cast<int>(x[2]);
  g.in_w = static_cast<int>(x[3]);
  g.out_channels = static_cast<int>(w[0]);
  g.out_h = static_cast<int>(y[2]);
  g.out_w = static_cast<int>(y[3]);
  g.kernel_h = static_cast<int>(w[2]);
  g.kernel_w = static_cast<int>(w[3]);
  g.stride_h = static_cast<int>(strides[0]);
  g.stride_w = static_cast<int>(strides[1]);
  g.pad_top = static_cast<int>(pads[0]);
  g.pad_left = static_cast<int>(pads[1]);
  g.dilation_h = static_cast<int>(dilations[0]);
  g.dilation_w = static_cast<int>(dilations[1]);
  g.groups = static_cast<int>(desc.attrs.get_int("groups", 1));
  return g;
}

// Every size of `desc` within int: the geometry's ints hold them (qconv2d_fits_int32 checks the products).
bool sizes_fit_int(const OpDescriptor& desc) {
  constexpr std::int64_t kMax = 1 << 30;
  const auto small = [&](std::int64_t v) { return v >= 0 && v <= kMax; };
  for (const TensorDesc* t : {&desc.inputs[0], &desc.inputs[1], &desc.outputs[0]}) {
    for (const std::int64_t d : t->shape) {
      if (!small(d)) return false;
    }
  }
  for (const char* name : {"strides", "pads", "dilations"}) {
    for (const std::int64_t v : desc.attrs.get_ints(name, {})) {
      if (!small(v)) return false;
    }
  }
  return small(desc.attrs.get_int("groups", 1));
}

const char* path_key(QConvPath path) {
  switch (path) {
    case QConvPath::kDirect: return "direct";
    case QConvPath::kTiled: return "tiled";
    case QConvPath::kTensorCore: return "tensor_core";
    case QConvPath::kTensorCore64: return "tensor_core_64";
    case QConvPath::kPipelined: return "pipelined";
    case QConvPath::kPipelined64: return "pipelined_64";
  }
  return "";
}

// {"path": ..., "splits": n} (splits only where the path splits the reduction).
std::string record_of(QConvPath path, int splits) {
  nlohmann::json json;
  json["path"] = path_key(path);
  if (splits > 1) json["splits"] = splits;
  return json.dump();
}

// The paths a kernel runs: the tensor-core tiles for "int8_mma", direct and tiled for "cuda_raw".
std::vector<QConvPath> paths_of(bool tensor_core) {
  if (tensor_core) {
    return {QConvPath::kPipelined, QConvPath::kPipelined64, QConvPath::kTensorCore, QConvPath::kTensorCore64};
  }
  return {QConvPath::kDirect, QConvPath::kTiled};
}

// The split count a record names (1 when absent); InvalidArgumentError outside 1..32.
int splits_from_record(const std::string& record, const std::string& who) {
  const nlohmann::json json = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("splits")) return 1;
  const nlohmann::json& splits = json["splits"];
  if (!splits.is_number_integer() || splits.get<std::int64_t>() < 1 || splits.get<std::int64_t>() > 32) {
    throw InvalidArgumentError(
        ::xpuruntime::detail::str_cat(who, ": invalid plan record ('splits' must be an integer 1..32): ", record));
  }
  return static_cast<int>(splits.get<std::int64_t>());
}

// The path a record names, among the kernel's; InvalidArgumentError for a malformed record, UnsupportedOperationError
// for a path of the other kernel.
QConvPath path_from_record(const std::string& record, bool tensor_core, const std::string& who) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(record);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(::xpuruntime::detail::str_cat(who, ": invalid plan record (", e.what(), "): ", record));
  }
  if (!json.is_object() || !json.contains("path") || !json["path"].is_string()) {
    throw InvalidArgumentError(
        ::xpuruntime::detail::str_cat(who, ": invalid plan record ('path' must be a string): ", record));
  }
  const std::string key = json["path"].get<std::string>();
  for (const QConvPath path : paths_of(tensor_core)) {
    if (key == path_key(path)) return path;
  }
  for (const QConvPath path : paths_of(!tensor_core)) {
    if (key == path_key(path)) {
      throw UnsupportedOperationError(
          ::xpuruntime::detail::str_cat(who, ": cannot re-create the plan of record ", record, ": path '", key,
                                        "' is the ", tensor_core ? "cuda_raw" : "int8_mma", " kernel's"));
    }
  }
  throw InvalidArgumentError(::xpuruntime::detail::str_cat(who, ": invalid plan record (unknown path '", key,
                                                           "'; valid: direct, tiled, pipelined, pipelined_64, tensor_core, "
                                                           "tensor_core_64): ",
                                                           record));
}

// The multiprocessors of the descriptor's device (they pick the tensor-core tile), or an H100's 132 where the device
// is not present: plans are built from the descriptor alone, so a machine without it can still make them.
int multiprocessors(const OpDescriptor& desc) {
  constexpr int kUnknownDevice = 132;
  DeviceManager& devices = DeviceManager::instance();
  if (desc.device.index < 0 || desc.device.index >= devices.get_device_count()) return kUnknownDevice;
  return devices.get_device_info(desc.device).sm_count;
}

// The launch's operands and epilogue (Note [Quantized registry ops]).
QConvArgs qconv_args(const KernelLaunch& launch) {
  const Attributes& attrs = launch.desc->attrs;
  const Tensor& x = launch.input(0);
  const Tensor* w_scale = launch.num_inputs > 2 && launch.input(2).defined() ? &launch.input(2) : nullptr;
  const Tensor* bias = launch.num_inputs > 3 && launch.input(3).defined() ? &launch.input(3) : nullptr;
  QConvArgs a;
  a.x = x.data_ptr();
  a.x_unsigned = x.dtype() == DType::kUInt8;
  a.x_zero_point = static_cast<int>(attrs.get_int("x_zero_point", 0));
  a.zero_point_folded = attrs.get_int("zero_point_folded", 0) != 0;
  a.x_scale = static_cast<float>(attrs.get_float("x_scale", 1.0));  // as the cpu kernel: float32 first
  a.w = static_cast<const std::int8_t*>(launch.input(1).data_ptr());
  if (w_scale != nullptr) {
    a.w_scale = static_cast<const float*>(w_scale->data_ptr());
    a.w_scale_count = w_scale->numel();
  }
  if (bias != nullptr) {
    a.bias = bias->data_ptr();
    a.bias_int = bias->dtype() == DType::kInt32;
  }
  a.relu = attrs.get_string("activation", "none") == "relu";
  a.y_scale = static_cast<float>(attrs.get_float("y_scale", 1.0));
  a.y_zero_point = static_cast<int>(attrs.get_int("y_zero_point", 0));
  a.out_dtype = launch.output(0).dtype();
  a.y = launch.output(0).data_ptr();
  return a;
}

class QConvPlan final : public KernelPlan {
 public:
  QConvPlan(QConvGeometry geometry, QConvPath path, int splits, int device)
      : g_(geometry), path_(path), splits_(splits), device_(device) {}

  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= workspace_bytes(), "cuda_raw qconv2d: the plan needs ", workspace_bytes(),
                " bytes of workspace, the launch gives ", launch.workspace_bytes);
    ::xpuruntime::detail::CudaDeviceGuard guard(device_);
    qconv2d(g_, qconv_args(launch), path_, launch.workspace, launch.stream.handle, splits_);
  }
  std::size_t workspace_bytes() const override { return qconv2d_workspace_bytes(g_, path_, splits_); }
  std::string record() const override { return record_of(path_, splits_); }
  std::string describe() const override {
    return ::xpuruntime::detail::str_cat(
        "int8 ", qconv2d_path_name(path_), g_.nhwc ? ", NHWC" : ", NCHW",
        splits_ > 1 ? ::xpuruntime::detail::str_cat(", reduction split in ", splits_) : std::string(),
        ", int32 accumulation, epilogue fused");
  }

 private:
  QConvGeometry g_;
  QConvPath path_;
  int splits_;
  int device_;
};

class QConvKernel final : public Kernel {
 public:
  QConvKernel(KernelInfo info, bool tensor_core) : Kernel(std::move(info)), tensor_core_(tensor_core) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    try {
      if (desc.inputs.size() < 2 || desc.outputs.size() != 1 || desc.outputs[0].dim() != 4) {
        return Support::no(::xpuruntime::detail::str_cat(label(), " needs the output inferred (call "
                                                         "KernelRegistry::infer first)"));
      }
      if (!sizes_fit_int(desc) || !qconv2d_fits_int32(qconv_geometry(desc))) {
        return Support::no(::xpuruntime::detail::str_cat(label(), " indexes in 32 bits: x ", desc.inputs[0].str(),
                                                         ", weight ", desc.inputs[1].str(), " and y ",
                                                         desc.outputs[0].str(), " are too large"));
      }
      const QConvGeometry g = qconv_geometry(desc);
      if (tensor_core_ && !qconv2d_tensor_core_fits(g)) {
        return Support::no(::xpuruntime::detail::str_cat(
            label(), " takes layout NHWC, one group and input channels a multiple of 16; got layout ",
            g.nhwc ? "NHWC" : "NCHW", ", groups ", g.groups, ", ", g.channels, " input channels"));
      }
      return Support::yes();
    } catch (const std::exception& e) {
      return Support::no(::xpuruntime::detail::str_cat(label(), ": ", e.what()));
    }
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    const Support support = supports(desc, policy);
    if (!support) throw UnsupportedOperationError(support.reason());
    const QConvGeometry g = qconv_geometry(desc);
    QConvPath path;
    int splits = 1;
    if (!record.empty()) {
      path = path_from_record(record, tensor_core_, label());
      splits = splits_from_record(record, label());
    } else {
      path = qconv2d_path(g, tensor_core_, multiprocessors(desc));
      splits = qconv2d_splits(g, path, multiprocessors(desc));
    }
    return std::make_unique<QConvPlan>(g, path, splits, desc.device.index);
  }

  // The kernel's other paths (each with its own split choice) and the chosen path unsplit, for autotuning.
  std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    if (!supports(desc, policy)) return {};
    const QConvGeometry g = qconv_geometry(desc);
    const int sms = multiprocessors(desc);
    const QConvPath chosen = qconv2d_path(g, tensor_core_, sms);
    std::vector<std::string> out;
    if (qconv2d_splits(g, chosen, sms) > 1) out.push_back(record_of(chosen, 1));
    for (const QConvPath path : paths_of(tensor_core_)) {
      if (path != chosen) out.push_back(record_of(path, qconv2d_splits(g, path, sms)));
    }
    return out;
  }

 private:
  const char* label() const { return tensor_core_ ? "int8_mma qconv2d" : "cuda_raw qconv2d"; }
  bool tensor_core_;
};

// What both kernels declare: cuda_raw's declaration with the int8 operands, int8 precision allowed.
KernelDecl qconv_declaration(bool tensor_core) {
  KernelDecl decl = declaration("qconv2d", {"x", "weight", "w_scale", "bias"}, DTypes::kAll);
  decl.subject = tensor_core ? "int8_mma qconv2d" : "cuda_raw 'qconv2d'";
  decl.no_int8 = false;  // an int8 op: it runs whatever the precision
  decl.dtypes =
      DTypeSet{{DType::kInt8, DType::kUInt8, DType::kInt32, DType::kFloat32}, "int8, uint8, int32 and float32"};
  decl.input_dtypes = {DTypeSet{{DType::kInt8, DType::kUInt8}, "int8 or uint8"}, DTypeSet{{DType::kInt8}, "int8"},
                       DTypeSet{{DType::kFloat32}, "float32"},
                       DTypeSet{{DType::kInt32, DType::kFloat32}, "int32 or float32"}};
  decl.input_ranks = {{4, 4}, {4, 4}};
  if (tensor_core) {
    decl.alignment = 16;  // 16-byte loads of x and the weight
    if (decl.min_compute_capability < 80) {  // mma.sync m16n8k32 on integers: sm_80+
      decl.min_compute_capability = 80;
      decl.built_for_architectures = false;
    }
  }
  return decl;
}

}  // namespace

void register_quantized_conv(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<QConvKernel>(
      KernelInfo{"qconv2d", "int8_mma", "cuda_raw", DeviceType::kCUDA, true,
                 "int8 implicit GEMM on tensor cores (mma.sync m16n8k32, s8/u8 x s8 -> s32), NHWC, one group, input "
                 "channels a multiple of 16; zero points, scales, bias, relu and requantization fused "
                 "(Note [Int8 convolution on the GPU])",
                 qconv_declaration(true)},
      /*tensor_core=*/true));
  registry.add_kernel(std::make_unique<QConvKernel>(
      KernelInfo{"qconv2d", "cuda_raw", "cuda_raw", DeviceType::kCUDA, true,
                 "int8 convolution of any shape, NCHW or NHWC: dp4a implicit GEMM tiles per group, or one thread per "
                 "output for depthwise and small groups; int32 accumulation, epilogue fused "
                 "(Note [Int8 convolution on the GPU])",
                 qconv_declaration(false)},
      /*tensor_core=*/false));
}

}  // namespace xpuruntime::cuda_raw
