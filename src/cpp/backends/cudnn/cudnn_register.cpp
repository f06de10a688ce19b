// Registration of the cudnn backend: conv2d ("cudnn", "cudnn_search"), conv_transpose2d, conv3d, conv_transpose3d,
// max_pool2d, avg_pool2d, global_avg_pool and batch_norm ("cudnn"), all on CUDA devices through cuDNN 9's legacy API;
// qconv2d ("cudnn") through its graph API.
// Registering touches no GPU and loads none of cuDNN's sub-libraries (cudnnGetVersion is answered by libcudnn.so
// itself); the first handle, made when the first plan is built, does.
#include <string>

#include "cudnn_utils.h"

namespace xpuruntime {

void register_cudnn(KernelRegistry& registry) {
  // The version loaded at run time (e.g. 91400) keys the autotune cache: a timed choice is replayed only with it.
  registry.add_library_version("cudnn", std::to_string(cudnn::runtime_version()));
  register_cudnn_conv(registry);
  register_cudnn_pool(registry);
  register_cudnn_batch_norm(registry);
  register_cudnn_conv_transpose(registry);
  register_cudnn_conv3d(registry);
  register_cudnn_qconv(registry);  // before cuda_raw's qconv2d kernels (Note [cuDNN int8 convolution])
}

}  // namespace xpuruntime
