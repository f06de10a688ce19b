// libFuzzer harness with a structure-aware mutator: libFuzzer picks inputs by coverage as usual, but a new input is
// made by parsing the model as an onnx::ModelProto and applying 1-3 structural edits (structure_mutator.h) instead
// of flipping bytes, which almost never gets past protobuf parsing and the importer. One input in eight, and every
// input that does not parse, is mutated on bytes by libFuzzer (dictionary, comparisons) as fuzz_model does.
// The run is fuzz_model's (model_harness.h); XPURT_FUZZ_ENGINE=onnxruntime fuzzes the onnxruntime engine.
#include <cstddef>
#include <cstdint>
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

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // Control flow runs too, under a deadline well inside libFuzzer's -timeout (model_harness.h): a Loop without
  // an end is a typed RunTimeoutError after a second.
  xpuruntime::fuzz::run_model_bytes(bytes, xpuruntime::fuzz::fuzz_engine(), /*run_control_flow=*/true,
                                    std::chrono::seconds(1));
  return 0;
}
