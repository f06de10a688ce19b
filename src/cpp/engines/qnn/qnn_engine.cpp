// The qnn engine: one of the NPU runtimes of the design (npu.md), for Qualcomm Hexagon NPUs. No version of
// xpuruntime implements it yet, so every build registers a declared engine whose available() says so and what runs
// the model instead (Note [Declared engines] in core/declared_engine.h).
#include "core/declared_engine.h"
#include "xpuruntime/engine.h"

namespace xpuruntime {

void register_qnn(EngineRegistry& registry) {
  registry.add(std::make_unique<DeclaredEngine>(
      "qnn", "the qnn engine (Qualcomm AI Engine Direct, for Hexagon NPUs) is not implemented in this version of "
             "xpuruntime: no build has it and installing the QNN SDK does not add it; on the CPU run the model "
             "with engine=\"onnxruntime\" or engine=\"native\""));
}

}  // namespace xpuruntime
