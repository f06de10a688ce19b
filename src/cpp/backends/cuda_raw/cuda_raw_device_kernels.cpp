// The cuda_raw backend's entries of the device kernels table (Note [Device kernels table] in core/device_kernels.h):
// the launchers that core (Tensor::copy_from, DeviceManager::inject_fault_for_testing) and the cublas and cublasLt
// backends call directly.
#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "core/device_kernels.h"

namespace xpuruntime {

void register_cuda_raw_device_kernels(DeviceKernels& table) {
  table.strided_copy = &cuda_raw::strided_copy;
  table.strided_copy_pairs = &cuda_raw::strided_copy_pairs;
  table.inject_fault = &cuda_raw::inject_fault;
  table.bias_activation = &cuda_raw::bias_activation;
  table.add_into = &cuda_raw::add_into;
  table.attention_softmax = &cuda_raw::attention_softmax;
  table.quantized_epilogue = &cuda_raw::quantized_epilogue;
  table.quantized_prologue = &cuda_raw::quantized_prologue;
  table.argmax_rows = &cuda_raw::argmax_rows;
  table.sample_rows = &cuda_raw::sample_rows;
}

}  // namespace xpuruntime
