// libFuzzer harness: model bytes -> InferenceSession (CPU; XPURT_FUZZ_ENGINE picks the engine, native by default)
// -> one run on zero inputs (model_harness.h). Anything but a typed XpuRuntimeError (a crash, an abort, a sanitizer
// report, an allocation past libFuzzer's -rss_limit_mb, a hang past -timeout) is a finding (docs/reliability.md).
// Mutations are libFuzzer's, on bytes; fuzz_model_structure mutates the model's protobuf structure instead.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  xpuruntime::fuzz::run_model_bytes(bytes, xpuruntime::fuzz::fuzz_engine(), /*run_control_flow=*/false);
  return 0;
}
