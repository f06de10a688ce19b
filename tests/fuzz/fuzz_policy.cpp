// libFuzzer harness: policy files. The first byte picks KernelPolicy or ExecutionPolicy, JSON or YAML; the rest is
// the text. A text that loads must serialize canonically: to_json() loads back to an equal policy with the same
// bytes (else abort: a finding).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_policy.h"

using namespace xpuruntime;

namespace {

template <typename Policy>
void round_trip(const std::string& text, bool yaml) {
  const Policy p = yaml ? Policy::from_yaml(text) : Policy::from_json(text);
  const std::string json = p.to_json();
  const Policy again = Policy::from_json(json);
  if (!(again == p) || again.to_json() != json) std::abort();
  if (yaml) {
    const Policy from_yaml = Policy::from_yaml(p.to_yaml());
    if (!(from_yaml == p)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool yaml = (data[0] & 1) != 0;
  try {
    if (data[0] & 2) {
      round_trip<ExecutionPolicy>(text, yaml);
    } else {
      round_trip<KernelPolicy>(text, yaml);
    }
  } catch (const XpuRuntimeError&) {
    // A typed error (UnsupportedOperationError for YAML in a build without yaml-cpp).
  }
  return 0;
}
