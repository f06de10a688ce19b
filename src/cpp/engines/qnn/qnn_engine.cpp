// The qnn engine: one of the NPU runtimes of the design (npu.md), for Qualcomm Hexagon NPUs. This build does not
// have it, so it registers a declared engine whose available() says what to install (Note [Declared engines] in
// core/declared_engine.h).
#include "core/declared_engine.h"
#include "xpuruntime/engine.h"

namespace xpuruntime {

void register_qnn(EngineRegistry& registry) {
  registry.add(std::make_unique<DeclaredEngine>(
      "qnn", "the qnn engine (Qualcomm Hexagon NPUs) needs the Qualcomm AI Engine Direct SDK (QNN), which this "
             "build does not have; install the QNN SDK from Qualcomm and rebuild with it"));
}

}  // namespace xpuruntime
