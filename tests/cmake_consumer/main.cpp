// Uses the installed xpuruntime: lists devices, round-trips a tensor through DLPack, checks an error type.
#include <xpuruntime/device_manager.h>
#include <xpuruntime/dlpack.h>
#include <xpuruntime/exceptions.h>
#include <xpuruntime/tensor.h>
#include <xpuruntime/version.h>

#include <cstdio>

int main() {
  using namespace xpuruntime;
  std::printf("xpuruntime %s\n", get_version().c_str());
  for (const DeviceInfo& d : DeviceManager::instance().get_all_devices()) std::printf("  %s\n", d.str().c_str());
  Tensor t = Tensor::zeros({2, 3}, DType::kFloat32);
  Tensor u = from_dlpack(to_dlpack(t));
  if (u.data_ptr() != t.data_ptr()) return 1;
  try {
    Device::parse("tpu:0");
    return 2;
  } catch (const InvalidArgumentError& e) {
    std::printf("typed error: %s\n", e.what());
  }
  std::printf("ok\n");
  return 0;
}
