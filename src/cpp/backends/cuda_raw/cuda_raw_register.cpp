// Registration of the cuda_raw backend: xpuruntime's own CUDA kernels for the elementwise, activation, cast,
// softmax, layer_norm, reduce, data-movement (transpose, concat, slice, gather, expand), where and comparison
// ops (kernel name "cuda_raw"), flash attention ("flash_v2", flash_attention.cu) and conv2d's "depthwise". Every float
// kernel computes in fp32 (Note [fp32 compute] in cuda_raw_common.cuh); every kernel uses no atomics (deterministic)
// and needs contiguous inputs (the functional API makes them so). Each family registers beside its sources
// (<family>_register.cpp, cuda_raw_register.h; conv2d's "depthwise" in depthwise_register.cpp); this file has the
// helpers they share and register_cuda_raw, which calls the families in order.
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
  cuda_raw::register_pool(registry);             // max_pool2d, avg_pool2d: after cudnn's
  cuda_raw::register_log_softmax(registry);
  cuda_raw::register_binary_ext(registry);      // prelu, mod
  cuda_raw::register_generate(registry);        // one_hot, trilu, tile, scatter_nd
  cuda_raw::register_select(registry);          // arg_max, arg_min, top_k
  cuda_raw::register_quantized_conv(registry);  // qconv2d: int8_mma (tensor cores), then cuda_raw
  cuda_raw::register_qlinear(registry);         // qlinear's "dp4a" (after cuBLASLt's IMMA kernel)
  cuda_raw::register_quantize(registry);        // quantize_linear, dequantize_linear, dynamic_quantize_linear
  cuda_raw::register_int4_gemm(registry);       // matmul_nbits (int4_gemm_register.cpp)
  cuda_raw::register_gemv(registry);            // linear for M <= 8, timed against cuBLASLt (gemv.cu)
  // ---- attention: flash_v2 (flash_attention.cu) ----
  register_flash_attention(registry);
}

}  // namespace xpuruntime
