// Running one registry kernel's plan directly, for the tests of a backend's kernels against the cpu kernel: the op's
// descriptor from its inputs, the kernel's plan (re-created from a record when given), one run on a device's
// default stream, the output brought back to the CPU with the plan's record and description.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "xpuruntime/dispatcher.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::kernel_run {

struct KernelRun {
  Tensor output;  // on the CPU
  std::string record;
  std::string describe;
};

// `op`'s descriptor for these inputs and attributes, its outputs inferred.
inline OpDescriptor describe_op(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs) {
  OpDescriptor desc = make_op_descriptor(op, inputs, attrs, ExecutionPolicy());
  KernelRegistry::global().infer(desc);
  return desc;
}

// Kernel `kernel` of `op`; std::runtime_error when there is none.
inline const Kernel& registry_kernel(const std::string& op, const std::string& kernel) {
  const Kernel* k = KernelRegistry::global().find_kernel(op, kernel);
  if (k == nullptr) throw std::runtime_error("no " + op + " kernel " + kernel);
  return *k;
}

// The host tensors moved to `device` (undefined ones stay undefined: absent optional inputs).
inline std::vector<Tensor> on_device(const std::vector<Tensor>& host, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : host) out.push_back(t.defined() ? t.to(device) : Tensor());
  return out;
}

// Any tensor's elements as float32 on the host (brought from its device, cast when needed).
inline std::vector<float> floats_of(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  const Tensor f = host.dtype() == DType::kFloat32 ? host : ops::cast(host, DType::kFloat32);
  const auto* p = static_cast<const float*>(f.data_ptr());
  return std::vector<float>(p, p + f.numel());
}

// `kernel`'s plan for `op` on these inputs (`record`: re-created from it), run once on `device`'s default stream.
// std::runtime_error naming the reason when the kernel refuses the op (what the dispatcher would fall back from).
inline KernelRun run_registry_kernel(const std::string& op, const std::string& kernel,
                                     const std::vector<Tensor>& host_inputs, const Attributes& attrs, Device device,
                                     const std::string& record = {}) {
  const std::vector<Tensor> inputs = on_device(host_inputs, device);
  const OpDescriptor desc = describe_op(op, inputs, attrs);
  const Kernel& k = registry_kernel(op, kernel);
  const Support support = k.supports(desc, ExecutionPolicy());
  if (!support) throw std::runtime_error(kernel + " refuses " + desc.signature() + ": " + support.reason());
  std::unique_ptr<KernelPlan> plan = k.build(desc, ExecutionPolicy(), record);
  const StreamView stream(device, nullptr);
  std::vector<Tensor> outputs = {Tensor::empty(desc.outputs[0].shape, desc.outputs[0].dtype, device, &stream)};
  plan->execute(desc, inputs, outputs, stream);
  if (device.is_cuda()) stream.synchronize();
  return {outputs[0].to(Device::cpu()), plan->record(), plan->describe()};
}

}  // namespace xpuruntime::kernel_run
