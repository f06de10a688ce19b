// fuzz_worker: a long-lived process that runs model files through the fuzzers' harness (model_harness.h), one per
// line of stdin, and answers one line per model on stdout. scripts/fuzz_structure.py starts one per engine and
// starts it again when a model kills it (the model it was running is the finding), so a campaign of tens of
// thousands of mutants does not pay a process start per mutant.
//
//   fuzz_worker --engine native|onnxruntime [--run-timeout-ms 5000]
//   stdin:  /path/to/model.onnx
//   stdout: ran | built | typed\t<ErrorCode>\t<message> | untyped\t<what>
//
// Models with Loop, Scan or SequenceMap are run too, each run under a RunOptions timeout (a valid endless Loop ends
// as a typed RunTimeoutError); the driver's per-model deadline catches what does not stop.
#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "model_harness.h"

namespace {

std::string code_name(xpuruntime::ErrorCode code) {
  using xpuruntime::ErrorCode;
  switch (code) {
    case ErrorCode::kInternal: return "Internal";
    case ErrorCode::kCuda: return "Cuda";
    case ErrorCode::kOutOfMemory: return "OutOfMemory";
    case ErrorCode::kUnsupported: return "Unsupported";
    case ErrorCode::kInvalidArgument: return "InvalidArgument";
    case ErrorCode::kInvalidType: return "InvalidType";
    case ErrorCode::kDistributed: return "Distributed";
    case ErrorCode::kTerminated: return "Terminated";
    default: return "code " + std::to_string(static_cast<int>(code));  // codes added later
  }
}

// One line: no tabs or line breaks, at most 300 bytes.
std::string one_line(std::string s) {
  if (s.size() > 300) s.resize(300);
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\n' || c == '\t' || c == '\r'; }, ' ');
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string engine = "native";
  long run_timeout_ms = 5000;  // well inside the driver's per-model deadline
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--engine") engine = argv[++i];
    else if (std::string(argv[i]) == "--run-timeout-ms") run_timeout_ms = std::stol(argv[++i]);
  }
  std::string path;
  while (std::getline(std::cin, path)) {
    std::ifstream f(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::string answer;
    try {
      const xpuruntime::fuzz::ModelResult r =
          xpuruntime::fuzz::run_model_bytes(bytes, engine, true, std::chrono::milliseconds(run_timeout_ms));
      switch (r.outcome) {
        case xpuruntime::fuzz::ModelOutcome::kRan: answer = "ran"; break;
        case xpuruntime::fuzz::ModelOutcome::kBuiltOnly: answer = "built"; break;
        case xpuruntime::fuzz::ModelOutcome::kTypedError:
          answer = "typed\t" + code_name(r.code) + "\t" + one_line(r.message);
          break;
      }
    } catch (const std::exception& e) {
      answer = "untyped\t" + one_line(e.what());
    } catch (...) {
      answer = "untyped\tnot a std::exception";
    }
    std::cout << answer << std::endl;
  }
  return 0;
}
