// Registration of the cudnn backend: conv2d ("cudnn", "cudnn_search"), max_pool2d, avg_pool2d, global_avg_pool
// and batch_norm ("cudnn"), all on CUDA devices through cuDNN 9's legacy API. Registering touches no GPU and
// does not load cuDNN's sub-libraries: the first handle (the first plan built) does.
#include "cudnn_utils.h"

namespace xpuruntime {

void register_cudnn(KernelRegistry& registry) {
  register_cudnn_conv(registry);
  register_cudnn_pool(registry);
  register_cudnn_batch_norm(registry);
}

}  // namespace xpuruntime
