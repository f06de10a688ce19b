// libFuzzer harness: model bytes -> InferenceSession (native engine, CPU) -> one run on zero inputs. Anything but a
// typed XpuRuntimeError (a crash, an abort, a sanitizer report, an allocation past libFuzzer's -rss_limit_mb, a
// hang past -timeout) is a finding (docs/reliability.md).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/inference_session.h"

using namespace xpuruntime;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  SessionOptions options;
  options.engine = "native";
  options.exec_policy.memory_limit = 256u << 20;  // plans past it are typed OutOfMemoryErrors
  options.exec_policy.intra_op_threads = 1;
  try {
    InferenceSession session = InferenceSession::from_bytes(bytes, options);
    // Bodies of control flow may run for as long as their trip counts say: building them is what is fuzzed.
    for (const auto& node : session.explain().nodes) {
      if (node.op_type == "Loop" || node.op_type == "Scan" || node.op_type == "SequenceMap") return 0;
    }
    std::vector<std::pair<std::string, Tensor>> feeds;
    for (const ValueInfo& in : session.get_inputs()) {
      if (in.kind != ValueKind::kTensor) return 0;
      std::vector<std::int64_t> shape;
      std::int64_t numel = 1;
      for (const std::string& dim : in.shape) {
        std::int64_t d = 1;
        if (!dim.empty() && dim.find_first_not_of("0123456789") == std::string::npos && dim.size() < 7) {
          d = std::stoll(dim);
        }
        shape.push_back(d);
        numel *= d;
        if (numel > (1 << 16)) return 0;
      }
      feeds.emplace_back(in.name, Tensor::zeros(shape, in.dtype));
    }
    session.run(feeds, {});
  } catch (const XpuRuntimeError&) {
    // A typed error: what bad input must give.
  }
  return 0;
}
