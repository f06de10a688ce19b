// libFuzzer harness: autotune/lock files (AutotuneCache loads them from a path). A file that loads must serialize
// canonically (to_json() of what it loaded loads back to the same bytes).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "xpuruntime/dispatcher.h"
#include "xpuruntime/exceptions.h"

using namespace xpuruntime;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/xpurt_fuzz_autotune_" + std::to_string(getpid()) + ".json";
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const AutotuneCache cache(path, /*autosave=*/false);
    const std::string json = cache.to_json();
    {
      std::ofstream file(path, std::ios::binary | std::ios::trunc);
      file << json;
    }
    const AutotuneCache again(path, /*autosave=*/false);
    if (again.to_json() != json) std::abort();
  } catch (const XpuRuntimeError&) {
  }
  return 0;
}
