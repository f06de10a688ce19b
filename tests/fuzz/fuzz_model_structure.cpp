// libFuzzer harness with a structure-aware mutator: libFuzzer picks inputs by coverage as usual, but a new input is
// made by parsing the model as an onnx::ModelProto and applying 1-3 structural edits (structure_mutator.h) instead
// of flipping bytes, which almost never gets past protobuf parsing and the importer. One input in eight, and every
// input that does not parse, is mutated on bytes by libFuzzer (dictionary, comparisons) as fuzz_model does.
// The run is fuzz_model's (model_harness.h); XPURT_FUZZ_ENGINE=onnxruntime fuzzes the onnxruntime engine.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "model_harness.h"
#include "structure_mutator.h"

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
  if (seed % 8 != 0) {
    std::string mutant;
    const std::string model(reinterpret_cast<const char*>(data), size);
    if (xpuruntime::fuzz::mutate_model_structure(model, seed, &mutant) && mutant.size() <= max_size) {
      std::memcpy(data, mutant.data(), mutant.size());
      return mutant.size();
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

namespace {

// Ends the process at once (no static destructors, no LeakSanitizer pass), the status libFuzzer gave exit().
[[noreturn]] void exit_without_teardown() { std::_Exit(0); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // Control flow runs too, under a deadline well inside libFuzzer's -timeout (model_harness.h): a Loop without
  // an end is a typed RunTimeoutError after a second.
  xpuruntime::fuzz::run_model_bytes(bytes, xpuruntime::fuzz::fuzz_engine(), /*run_control_flow=*/true,
                                    std::chrono::seconds(1));
  if (xpuruntime::fuzz::fuzz_engine() == "onnxruntime") {
    // ONNX Runtime 1.29 leaves a thread of its own running when libFuzzer calls exit() after its last input, and
    // that thread read a static string the exit handlers had freed (ASan: heap-use-after-free in a thread started
    // inside libonnxruntime, 1 CI run in 5). A handler registered after every input runs before any static
    // destructor registered earlier, ORT's included, and ends the process there; libFuzzer's findings end it with
    // their own status before exit() is reached, so only the clean ending is cut short.
    std::atexit(exit_without_teardown);
  }
  return 0;
}
