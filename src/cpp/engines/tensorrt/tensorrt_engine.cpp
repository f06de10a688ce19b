// The tensorrt engine: NVIDIA TensorRT 10. No version of xpuruntime implements it yet, so every build registers a
// declared engine whose available() says so and what runs the model instead (Note [Declared engines] in
// core/declared_engine.h). The refusal names only things that exist: there is no build option or package that
// enables it, so it tells nobody to install TensorRT.
#include "core/declared_engine.h"
#include "xpuruntime/engine.h"

namespace xpuruntime {

void register_tensorrt(EngineRegistry& registry) {
  registry.add(std::make_unique<DeclaredEngine>(
      "tensorrt", "the tensorrt engine (NVIDIA TensorRT 10) is not implemented in this version of xpuruntime: no "
                  "build has it and installing TensorRT does not add it; on an NVIDIA GPU run the model with "
                  "engine=\"native\" (xpuruntime's CUDA engine) or engine=\"onnxruntime\""));
}

}  // namespace xpuruntime
