// The tensorrt engine: NVIDIA TensorRT 10. This build does not have it, so it registers a declared engine whose
// available() says what to install (Note [Declared engines] in core/declared_engine.h).
#include "core/declared_engine.h"
#include "xpuruntime/engine.h"

namespace xpuruntime {

void register_tensorrt(EngineRegistry& registry) {
  registry.add(std::make_unique<DeclaredEngine>(
      "tensorrt", "the tensorrt engine needs NVIDIA TensorRT 10, which this build does not have; install TensorRT "
                  "(pip install xpuruntime[tensorrt] / the TensorRT SDK) and rebuild with it"));
}

}  // namespace xpuruntime
