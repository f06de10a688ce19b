// fuzz_mutate: the structure-aware mutator (structure_mutator.h) as a command, for campaigns outside libFuzzer
// (scripts/fuzz_structure.py) and for reproducing a mutant from its seed.
//
//   fuzz_mutate --seed N --count K OUT_DIR CORPUS...   # CORPUS: .onnx files or folders of them
//
// Writes K mutants OUT_DIR/mutant-<N>-<i>.onnx; mutant i starts from corpus file (N + i) mod (number of files), in
// name order, with seed N * 1000003 + i. Prints one line per mutant: its file, the corpus file, the edits ("; ").
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "structure_mutator.h"

namespace fs = std::filesystem;

namespace {

int usage() {
  std::cerr << "usage: fuzz_mutate --seed N --count K OUT_DIR CORPUS...\n";
  return 2;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  std::uint64_t count = 1;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--seed" || a == "--count") && i + 1 < argc) {
      (a == "--seed" ? seed : count) = std::stoull(argv[++i]);
    } else if (a.rfind("--", 0) == 0) {
      return usage();
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() < 2) return usage();
  const fs::path out_dir = positional[0];
  std::vector<fs::path> corpus;
  for (std::size_t i = 1; i < positional.size(); ++i) {
    const fs::path p = positional[i];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p)) {
        if (e.is_regular_file() && e.path().extension() == ".onnx") corpus.push_back(e.path());
      }
    } else {
      corpus.push_back(p);
    }
  }
  std::sort(corpus.begin(), corpus.end());
  if (corpus.empty()) {
    std::cerr << "fuzz_mutate: no .onnx files in the corpus\n";
    return 2;
  }
  fs::create_directories(out_dir);
  std::vector<std::string> models;
  models.reserve(corpus.size());
  for (const fs::path& p : corpus) models.push_back(read_file(p));
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::size_t source = static_cast<std::size_t>((seed + i) % corpus.size());
    std::string mutant;
    std::vector<std::string> edits;
    if (!xpuruntime::fuzz::mutate_model_structure(models[source], seed * 1000003u + i, &mutant, &edits)) {
      std::cerr << "fuzz_mutate: " << corpus[source].string() << " is not an ONNX model, skipped\n";
      continue;
    }
    const fs::path out = out_dir / ("mutant-" + std::to_string(seed) + "-" + std::to_string(i) + ".onnx");
    std::ofstream(out, std::ios::binary).write(mutant.data(), static_cast<std::streamsize>(mutant.size()));
    std::cout << out.string() << '\t' << corpus[source].string() << '\t';
    std::string line;
    for (std::size_t e = 0; e < edits.size(); ++e) line += (e ? "; " : "") + edits[e];
    std::replace_if(line.begin(), line.end(), [](char c) { return c == '\n' || c == '\t' || c == '\r'; }, ' ');
    std::cout << line << '\n';
  }
  return 0;
}
