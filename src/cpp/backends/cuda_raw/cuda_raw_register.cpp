// Registration of the cuda_raw backend: xpuruntime's own CUDA kernels for the elementwise, activation, cast,
// softmax, layer_norm, reduce, data-movement (transpose, concat, slice, gather, expand), where and comparison
// ops (kernel name "cuda_raw"), flash attention ("flash_v2", flash_attention.cu) and conv2d's "depthwise". Every float
// kernel computes in fp32 (Note [fp32 compute] in cuda_raw_common.cuh); every kernel uses no atomics (deterministic)
// and needs contiguous inputs (the functional API makes them so). Each family registers beside its sources
// (<family>_register.cpp, cuda_raw_register.h); this file has the helpers they share, the depthwise kernel and
// register_cuda_raw, which calls the families in order.
#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_register.h"
#include "backends/cuda_raw/flash_attention.h"
#include "core/conv_layout.h"
#include "core/cuda_utils.h"
#include "core/data_ops.h"
#include "core/scalar.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cuda_raw {
namespace {

// The oldest architecture the kernels were compiled for (CMAKE_CUDA_ARCHITECTURES), 0 when unknown.
constexpr int kMinArch = XPURT_CUDA_RAW_MIN_ARCH;

bool takes(DTypes dtypes, DType dtype) {
  switch (dtypes) {
    case DTypes::kFloat: return is_kernel_float(dtype);
    case DTypes::kFloatAndInt: return is_kernel_float(dtype) || data_ops::is_arithmetic_int_dtype(dtype);
    case DTypes::kAll: return is_cuda_raw_dtype(dtype);
  }
  return false;
}

const char* dtypes_text(DTypes dtypes) {
  switch (dtypes) {
    case DTypes::kFloat: return "float32, float16 and bfloat16";
    case DTypes::kFloatAndInt: return "float32, float16, bfloat16, int32 and int64";
    case DTypes::kAll: return "every dtype except uint16, uint32 and uint64";
  }
  return "";
}

}  // namespace

bool is_kernel_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

bool is_cuda_raw_dtype(DType dtype) {
  return data_ops::is_any_supported_dtype(dtype) && dtype != DType::kUInt16 && dtype != DType::kUInt32 &&
         dtype != DType::kUInt64;
}

KernelDecl declaration(const std::string& op, std::vector<std::string> names, DTypes dtypes) {
  KernelDecl decl;
  decl.subject = "cuda_raw '" + op + "'";
  decl.input_names = std::move(names);
  decl.on_device = true;
  decl.no_int8 = true;
  decl.min_compute_capability = kMinArch;
  decl.built_for_architectures = true;
  // Every DType (kUInt64 is the last) that `dtypes` takes.
  for (int k = 0; k <= static_cast<int>(DType::kUInt64); ++k) {
    if (takes(dtypes, static_cast<DType>(k))) decl.dtypes.dtypes.push_back(static_cast<DType>(k));
  }
  decl.dtypes.text = dtypes_text(dtypes);
  decl.layout = Layout::kContiguous;
  return decl;
}

std::int64_t normalized_axis(std::int64_t axis, int rank) { return axis < 0 ? axis + rank : axis; }

std::int64_t product(const std::vector<std::int64_t>& shape, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t k = begin; k < end; ++k) n *= shape[k];
  return n;
}

std::int64_t inner_of(const std::vector<std::int64_t>& shape, std::size_t axis) {
  return product(shape, axis + 1, shape.size());
}

std::size_t axis_of(const OpDescriptor& desc, int rank) {
  return static_cast<std::size_t>(normalized_axis(desc.attrs.get_int("axis", 0), rank));
}

Support two_operand_geometry(const OpDescriptor& desc) {
  if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
  BroadcastGeometry geometry;
  std::string why_not;
  if (!broadcast_geometry(desc.inputs[0].shape, desc.inputs[1].shape, desc.outputs[0].shape, &geometry, &why_not)) {
    return Support::no(why_not);
  }
  return Support::yes();
}

BroadcastGeometry geometry_of(const Tensor& a, const Tensor& b, const Tensor& y) {
  BroadcastGeometry geometry;
  std::string why_not;
  if (!broadcast_geometry(a.shape(), b.shape(), y.shape(), &geometry, &why_not)) {
    throw UnsupportedOperationError(why_not);
  }
  return geometry;
}

// The conversion is the graph passes' (detail::from_doubles, core/scalar.h).
std::uint64_t value_bits(double value, DType dtype) {
  const Tensor element = detail::from_doubles({}, dtype, {value});
  std::uint64_t bits = 0;
  std::memcpy(&bits, element.data_ptr(), element.element_size());
  return bits;
}

void add_kernel(KernelRegistry& registry, const std::string& op, const std::string& summary,
                std::vector<std::string> names, Extra extra, FunctionKernel::RunFn run, DTypes dtypes) {
  auto accepts = [extra = std::move(extra)](const OpDescriptor& desc, const ExecutionPolicy&) -> Support {
    try {
      return extra ? extra(desc) : Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  };
  auto guarded_run = [run = std::move(run)](const KernelLaunch& launch) {
    detail::CudaDeviceGuard guard(launch.desc->device.index);
    run(launch);
  };
  KernelDecl decl = declaration(op, std::move(names), dtypes);
  registry.add_kernel(std::make_unique<FunctionKernel>(
      KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true, summary, std::move(decl)}, std::move(accepts),
      std::move(guarded_run)));
}

}  // namespace xpuruntime::cuda_raw

namespace xpuruntime {

// conv2d's "depthwise" kernel (depthwise.cu, Notes [Depthwise tiles] and [Channels-last depthwise]): registered
// before cudnn, so that it is the first choice for the depthwise convolutions it takes; `auto:BestPerformance` times
// it against cuDNN.
void register_cuda_raw_depthwise(KernelRegistry& registry) {
  auto depthwise_activation = [](const std::string& name) {
    if (name == "relu") return cuda_raw::DepthwiseActivation::kRelu;
    if (name == "silu") return cuda_raw::DepthwiseActivation::kSilu;
    if (name == "hard_swish") return cuda_raw::DepthwiseActivation::kHardSwish;
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
      if (activation != "none" && activation != "relu" && activation != "silu" && activation != "hard_swish") {
        return Support::no("activation none, relu, silu or hard_swish");
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
                 "residual and relu/silu/hard_swish fused (Notes [Depthwise tiles], [Channels-last depthwise])",
                 std::move(decl)},
      accepts, run));
}

void register_cuda_raw(KernelRegistry& registry) {
  cuda_raw::register_elementwise(registry);     // exp ... reciprocal, activations, add ... minimum, cast
  cuda_raw::register_softmax(registry);
  cuda_raw::register_layer_norm(registry);
  cuda_raw::register_reductions(registry);
  cuda_raw::register_data(registry);            // transpose, concat, slice, gather, expand, where, comparisons
  cuda_raw::register_data_dependent(registry);  // non_zero, non_max_suppression
  // ---- the ONNX ops beyond the core set ----
  cuda_raw::register_pointwise(registry);       // clip ... mish, is_nan, is_inf, logical_and/or/xor
  cuda_raw::register_scan(registry);            // cum_sum
  cuda_raw::register_index(registry);           // gather_elements, gather_nd
  cuda_raw::register_pad(registry);
  cuda_raw::register_resize(registry);
  cuda_raw::register_log_softmax(registry);
  cuda_raw::register_binary_ext(registry);      // prelu, mod
  cuda_raw::register_generate(registry);        // one_hot, trilu, tile, scatter_nd
  cuda_raw::register_select(registry);          // arg_max, arg_min, top_k
  // ---- attention: flash_v2 (flash_attention.cu) ----
  register_flash_attention(registry);
}

}  // namespace xpuruntime
