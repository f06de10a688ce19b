// Device: a value naming where memory lives and work runs ("cpu", "cuda:0").
// Devices are plain values: copyable, comparable, hashable; they own nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "xpuruntime/export.h"

namespace xpuruntime {

enum class DeviceType : std::int8_t {
  kCPU = 0,
  kCUDA = 1,
};

struct XPURT_API Device {
  DeviceType type = DeviceType::kCPU;  // default: the host CPU
  int index = 0;                       // default: 0 (the only CPU device; the first CUDA device)

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i) : type(t), index(i) {}

  static constexpr Device cpu() { return Device(DeviceType::kCPU, 0); }
  static constexpr Device cuda(int i = 0) { return Device(DeviceType::kCUDA, i); }

  // Parses "cpu", "cpu:0", "cuda", "cuda:N", "gpu", "gpu:N". Throws InvalidArgumentError on anything else.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;  // "cpu" or "cuda:N"

  friend constexpr bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
};

}  // namespace xpuruntime

template <>
struct std::hash<xpuruntime::Device> {
  std::size_t operator()(const xpuruntime::Device& d) const noexcept {
    return std::hash<int>()(static_cast<int>(d.type) * 1024 + d.index);
  }
};
