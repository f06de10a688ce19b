// The openvino engine: one of the NPU runtimes of the design (npu.md), for Intel NPUs and Intel CPUs/GPUs. No
// version of xpuruntime implements it yet, so every build registers a declared engine whose available() says so and
// what runs the model instead (Note [Declared engines] in core/declared_engine.h).
#include "core/declared_engine.h"
#include "xpuruntime/engine.h"

namespace xpuruntime {

void register_openvino(EngineRegistry& registry) {
  registry.add(std::make_unique<DeclaredEngine>(
      "openvino", "the openvino engine (OpenVINO, for Intel NPUs and Intel CPUs/GPUs) is not implemented in this "
                  "version of xpuruntime: no build has it and installing OpenVINO does not add it; on the CPU run "
                  "the model with engine=\"onnxruntime\" or engine=\"native\""));
}

}  // namespace xpuruntime
