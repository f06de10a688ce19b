// Structure-aware mutation of ONNX models (docs/reliability.md, Fuzzing): the model is parsed as an
// onnx::ModelProto, 1-3 random structural edits are applied (a node loses, repeats or rewires an input, an op type is
// swapped, an attribute changes type or value, a shape or dtype changes, an initializer is truncated, nodes are
// dropped, repeated or reordered, opset and IR versions change; in the main graph or any If/Loop/Scan body), and the
// result is serialized. Byte mutations rarely get past protobuf parsing and the importer's checks; these edits
// keep the model well-formed protobuf, so they reach graph passes, shape inference and kernels.
//
// Used by fuzz_model_structure (libFuzzer's LLVMFuzzerCustomMutator) and by fuzz_mutate (the standalone CLI that
// scripts/fuzz_structure.py drives for its campaign of both engines).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xpuruntime::fuzz {

// Writes to `out` the model `model` after 1-3 structural edits chosen by `seed` (the same seed and model give the
// same mutant) and appends a description of each edit to `edits` when not null. Returns false, leaving `out` as it
// was, when `model` does not parse as an onnx::ModelProto.
bool mutate_model_structure(const std::string& model, std::uint64_t seed, std::string* out,
                            std::vector<std::string>* edits = nullptr);

}  // namespace xpuruntime::fuzz
