// Running one registry op on its cpu kernel, and one ONNX op on the reference library, for the cpu kernel tests that
// compare the two (test_cpu_scan.cpp, test_cpu_activations.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::cpu_test {

// `op`'s descriptor on `inputs`, its outputs inferred.
inline OpDescriptor describe(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs) {
  OpDescriptor desc;
  desc.op = op;
  for (const Tensor& t : inputs) desc.inputs.push_back(TensorDesc::of(t));
  desc.attrs = attrs;
  desc.device = inputs[0].device();
  KernelRegistry::global().infer(desc);
  return desc;
}

// The registry's cpu kernel of `op` under `threads` intra-op threads, into `outputs` when given (else new tensors).
inline std::vector<Tensor> run_cpu(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs,
                                   int threads, std::vector<Tensor> outputs = {}) {
  const OpDescriptor desc = describe(op, inputs, attrs);
  ExecutionPolicy policy;
  policy.intra_op_threads = threads;
  const Kernel* kernel = KernelRegistry::global().find_kernel(op, "cpu");
  EXPECT_NE(kernel, nullptr) << op;
  if (kernel == nullptr) return outputs;
  const Support support = kernel->supports(desc, policy);
  EXPECT_TRUE(static_cast<bool>(support)) << support.reason();
  auto plan = kernel->build(desc, policy, "");
  if (outputs.empty()) {
    for (const auto& out : desc.outputs) outputs.push_back(Tensor::empty(out.shape, out.dtype));
  }
  plan->execute(desc, inputs, outputs);
  return outputs;
}

// The reference library's `op_type` (opset 21) on `inputs`, `outputs` of them.
inline std::vector<Tensor> run_reference(const std::string& op_type, const std::vector<Tensor>& inputs,
                                         const Attributes& attrs, std::size_t outputs) {
  Node node;
  node.op_type = op_type;
  node.name = "n";
  for (std::size_t i = 0; i < inputs.size(); ++i) node.inputs.push_back("x" + std::to_string(i));
  for (std::size_t i = 0; i < outputs; ++i) node.outputs.push_back("y" + std::to_string(i));
  node.attrs = attrs;
  return onnx_ref::run_node(node, 21, inputs);
}

}  // namespace xpuruntime::cpu_test
