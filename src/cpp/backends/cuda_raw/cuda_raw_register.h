// The cuda_raw backend's registration, shared by its family files (<family>_register.cpp beside the .cu sources):
// the declaration every cuda_raw kernel makes, the FunctionKernel helper, small shape helpers, and the family
// registration functions that register_cuda_raw (cuda_raw_register.cpp) calls in order. Internal to the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "core/cuda_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cuda_raw {

// The input dtypes a cuda_raw kernel takes (the op schema has validated the exact combination already).
enum class DTypes : std::uint8_t {
  kFloat,        // float32, float16, bfloat16: the float math
  kFloatAndInt,  // those and int32, int64: add, sub, mul, div, neg
  kAll,          // every dtype but uint16/uint32/uint64: data movement, where, comparisons, logical_not, cast
};

bool is_kernel_float(DType dtype);  // float32, float16, bfloat16
// The dtypes data.cu instantiates its kernels for: every dtype of Tensor except the unsigned 16/32/64-bit integers,
// which run on the cpu backend.
bool is_cuda_raw_dtype(DType dtype);

// What every cuda_raw kernel declares (Note [Kernel declarations] in core/kernel_registry.cpp): the op and its
// inputs on a CUDA device it was built for (CMAKE_CUDA_ARCHITECTURES), no int8 precision, and contiguous inputs of
// `dtypes`. `names`: the schema's input names, for the reasons (the last one repeats for variadic inputs).
KernelDecl declaration(const std::string& op, std::vector<std::string> names, DTypes dtypes = DTypes::kFloat);

using Extra = std::function<Support(const OpDescriptor&)>;
// Adds the "cuda_raw" kernel of `op`: declaration(op, names, dtypes), then `extra` (null: none) for what the
// declaration cannot say, then `run` on the launch's device and stream. Its accepts() never throws: a malformed
// attribute becomes the reason.
void add_kernel(KernelRegistry& registry, const std::string& op, const std::string& summary,
                std::vector<std::string> names, Extra extra, FunctionKernel::RunFn run,
                DTypes dtypes = DTypes::kFloat);

std::int64_t normalized_axis(std::int64_t axis, int rank);
// The product of shape[begin, end).
std::int64_t product(const std::vector<std::int64_t>& shape, std::size_t begin, std::size_t end);
// The last dims of `shape` after `axis`, multiplied.
std::int64_t inner_of(const std::vector<std::int64_t>& shape, std::size_t axis);
// The normalized value of an int attribute that names an axis of a tensor of rank `rank` (validated by the schema).
std::size_t axis_of(const OpDescriptor& desc, int rank);
// Whether inputs 0 and 1 broadcast to output 0 within the stride tables (the reason why not).
Support two_operand_geometry(const OpDescriptor& desc);
BroadcastGeometry geometry_of(const Tensor& a, const Tensor& b, const Tensor& y);
// The bits of `value` converted to `dtype` (pad's constant, one_hot's on/off values), in the low bytes.
std::uint64_t value_bits(double value, DType dtype);

// ---- kernels whose plan has a split geometry and its workspace (cum_sum, arg_max, arg_min, softmax, log_softmax,
// layer_norm) ----

// A plan that runs `run` with the launch's workspace (at least `bytes`) on the launch's device.
class SplitPlan final : public KernelPlan {
 public:
  using Run = std::function<void(const KernelLaunch&)>;
  SplitPlan(std::size_t bytes, std::string description, Run run)
      : bytes_(bytes), description_(std::move(description)), run_(std::move(run)) {}

  void run(const KernelLaunch& launch) const override {
    XPURT_CHECK(launch.workspace_bytes >= bytes_, description_, ": the plan needs ", bytes_,
                " bytes of workspace (workspace_bytes()), the launch gives ", launch.workspace_bytes);
    ::xpuruntime::detail::CudaDeviceGuard guard(launch.desc->device.index);
    run_(launch);
  }
  std::size_t workspace_bytes() const override { return bytes_; }
  std::string describe() const override { return description_; }

 private:
  std::size_t bytes_;
  std::string description_;
  Run run_;
};

// A cuda_raw kernel whose plan `make_plan` builds from the descriptor and the policy (its workspace limit); `extra`
// (null: none) says what the declaration cannot. Nothing is recorded: the plan follows from the descriptor and the
// policy.
class SplitKernel final : public Kernel {
 public:
  using MakePlan = std::function<std::unique_ptr<KernelPlan>(const OpDescriptor&, const ExecutionPolicy&)>;
  SplitKernel(const std::string& op, const std::string& summary, Extra extra, MakePlan make_plan,
              DTypes dtypes = DTypes::kAll, std::vector<std::string> names = {"x"})
      : Kernel(KernelInfo{op, "cuda_raw", "cuda_raw", DeviceType::kCUDA, true, summary,
                          declaration(op, std::move(names), dtypes)}),
        extra_(std::move(extra)),
        make_plan_(std::move(make_plan)) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    try {
      return extra_ ? extra_(desc) : Support::yes();
    } catch (const std::exception& e) {
      return Support::no(e.what());
    }
  }
  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string&) const override {
    return make_plan_(desc, policy);
  }

 private:
  Extra extra_;
  MakePlan make_plan_;
};

// ---- the families, in the order register_cuda_raw calls them (the order is each op's priority among its kernels) --

void register_elementwise(KernelRegistry& registry);    // elementwise_register.cpp
void register_softmax(KernelRegistry& registry);        // normalization_register.cpp
void register_layer_norm(KernelRegistry& registry);     // normalization_register.cpp
void register_reductions(KernelRegistry& registry);     // reduce_register.cpp
void register_data(KernelRegistry& registry);           // data_register.cpp
void register_data_dependent(KernelRegistry& registry); // data_register.cpp
void register_pointwise(KernelRegistry& registry);      // elementwise_register.cpp
void register_scan(KernelRegistry& registry);           // reduce_register.cpp
void register_index(KernelRegistry& registry);          // data_register.cpp
void register_pad(KernelRegistry& registry);            // data_register.cpp
void register_resize(KernelRegistry& registry);         // data_register.cpp
void register_pool(KernelRegistry& registry);           // data_register.cpp: max_pool2d, avg_pool2d
void register_log_softmax(KernelRegistry& registry);    // normalization_register.cpp
void register_binary_ext(KernelRegistry& registry);     // elementwise_register.cpp
void register_generate(KernelRegistry& registry);       // data_register.cpp
void register_select(KernelRegistry& registry);         // reduce_register.cpp
void register_quantized_conv(KernelRegistry& registry); // quant_conv_register.cpp: qconv2d's int8_mma and cuda_raw
void register_qlinear(KernelRegistry& registry);        // qlinear_register.cpp: qlinear's "dp4a"
void register_gemv(KernelRegistry& registry);           // gemv.cu: linear for M <= 8 (a weight stream)
void register_quantize(KernelRegistry& registry);       // quantize_register.cpp
void register_int4_gemm(KernelRegistry& registry);      // int4_gemm_register.cpp: matmul_nbits

}  // namespace xpuruntime::cuda_raw
