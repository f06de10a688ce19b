#include "xpuruntime/device.h"

#include <cctype>
#include <charconv>

#include "xpuruntime/exceptions.h"

namespace xpuruntime {

Device Device::parse(std::string_view text) {
  std::string lower;
  for (char c : text) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  std::string_view s = lower;
  std::string_view kind = s.substr(0, s.find(':'));
  DeviceType type;
  if (kind == "cpu") {
    type = DeviceType::kCPU;
  } else if (kind == "cuda" || kind == "gpu") {
    type = DeviceType::kCUDA;
  } else if (kind == "npu") {
    // The design's NPU spelling (npu.md): NPUs are to be reached through their vendors' runtimes, whose engines no
    // version implements yet (Note [Declared engines] in core/declared_engine.h).
    throw UnsupportedOperationError(detail::str_cat(
        "device \"", text, "\": xpuruntime does not run on NPUs yet: their engines, openvino (Intel, OpenVINO) and qnn "
        "(Qualcomm, QNN), are named but not implemented in this version, and installing those runtimes does not add "
        "them; devices: \"cpu\", \"cuda:N\""));
  } else {
    throw InvalidArgumentError(detail::str_cat("Expected a device like \"cpu\", \"cuda\" or \"cuda:0\", but got \"",
                                               text, "\""));
  }
  int index = 0;
  if (kind.size() < s.size()) {
    std::string_view number = s.substr(kind.size() + 1);
    auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), index);
    XPURT_CHECK(error == std::errc() && end == number.data() + number.size() && !number.empty() && index >= 0,
                "Expected a device like \"cuda:0\" (a non-negative index after ':'), but got \"", text, "\"");
    XPURT_CHECK(type != DeviceType::kCPU || index == 0, "There is one CPU device, \"cpu\" (or \"cpu:0\"), but got \"",
                text, "\"");
  }
  return Device(type, index);
}

std::string Device::str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }

}  // namespace xpuruntime
