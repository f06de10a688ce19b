// The openvino engine: one of the NPU runtimes of the design (npu.md), for Intel NPUs and Intel CPUs/GPUs. This
// build does not have it, so it registers a declared engine whose available() says what to install (Note [Declared
// engines] in core/declared_engine.h).
#include "core/declared_engine.h"
#include "xpuruntime/engine.h"

namespace xpuruntime {

void register_openvino(EngineRegistry& registry) {
  registry.add(std::make_unique<DeclaredEngine>(
      "openvino", "the openvino engine (Intel NPUs, and Intel CPUs/GPUs) needs the OpenVINO runtime 2024+, which "
                  "this build does not have; install OpenVINO (apt install openvino / the OpenVINO archive from "
                  "Intel) and rebuild with it"));
}

}  // namespace xpuruntime
