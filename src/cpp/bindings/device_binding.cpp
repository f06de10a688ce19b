// Device, DeviceInfo and the device functions.
#include <pybind11/stl.h>

#include "bindings.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph_exec.h"

namespace xpuruntime::bindings {

Device to_device(const py::handle& obj) {
  if (obj.is_none()) return DeviceManager::instance().get_current_device();
  if (py::isinstance<Device>(obj)) return obj.cast<Device>();
  if (py::isinstance<py::bool_>(obj)) throw InvalidTypeError("Expected a device (\"cpu\", \"cuda:0\", 0), got a bool");
  if (py::isinstance<py::int_>(obj)) {
    const auto index = obj.cast<long long>();
    XPURT_CHECK(index >= 0 && index < (1 << 20), "Expected a non-negative CUDA device index, but got ", index);
    return Device::cuda(static_cast<int>(index));
  }
  if (py::isinstance<py::str>(obj)) return Device::parse(obj.cast<std::string>());
  throw InvalidTypeError(detail::str_cat("Expected a device (xpuruntime.Device, \"cpu\", \"cuda:0\" or an index), got ",
                                         py::str(py::type::of(obj)).cast<std::string>()));
}

namespace {

DeviceInfo info_of(const Device& d) {
  py::gil_scoped_release release;
  return DeviceManager::instance().get_device_info(d);
}

}  // namespace

void bind_devices(py::module_& m) {
  py::class_<DeviceInfo>(m, "DeviceInfo", "Everything known about one device, read when it was queried.")
      .def_readonly("device", &DeviceInfo::device)
      .def_readonly("device_id", &DeviceInfo::device_id)
      .def_readonly("name", &DeviceInfo::name)
      .def_readonly("total_memory", &DeviceInfo::total_memory)
      .def_readonly("free_memory", &DeviceInfo::free_memory)
      .def_readonly("compute_capability_major", &DeviceInfo::compute_capability_major)
      .def_readonly("compute_capability_minor", &DeviceInfo::compute_capability_minor)
      .def_readonly("sm_count", &DeviceInfo::sm_count)
      .def_readonly("l2_cache_bytes", &DeviceInfo::l2_cache_bytes)
      .def_readonly("supports_fp16", &DeviceInfo::supports_fp16)
      .def_readonly("supports_bf16", &DeviceInfo::supports_bf16)
      .def_readonly("supports_int8", &DeviceInfo::supports_int8)
      .def_readonly("supports_fp8", &DeviceInfo::supports_fp8)
      .def_readonly("driver_version", &DeviceInfo::driver_version)
      .def_readonly("runtime_version", &DeviceInfo::runtime_version)
      .def_readonly("pci_bus_id", &DeviceInfo::pci_bus_id)
      .def("__repr__", [](const DeviceInfo& i) { return "<DeviceInfo " + i.str() + ">"; });

  py::class_<Device>(m, "Device",
                     "A device: Device(\"cpu\"), Device(\"cuda:0\"), Device(0), Device(\"cuda\", 1).\n\n"
                     "Creating a CUDA device that does not exist raises CudaError naming the reason.")
      .def(py::init([](const py::object& spec, std::optional<int> index) {
             Device d = to_device(spec);
             if (index) {
               XPURT_CHECK(py::isinstance<py::str>(spec) && std::string(spec.cast<std::string>()).find(':') == std::string::npos,
                           "Give the index either in the string or as the second argument, not both");
               d.index = *index;
             }
             DeviceManager::instance().check_device(d);
             return d;
           }),
           py::arg("spec") = py::none(), py::arg("index") = py::none())
      .def_property_readonly("type", [](const Device& d) { return d.is_cpu() ? "cpu" : "cuda"; })
      .def_property_readonly("index", [](const Device& d) { return d.index; })
      .def_property_readonly("id", [](const Device& d) { return d.index; })
      .def_property_readonly("info", &info_of, "DeviceInfo, with free memory read now")
      .def_property_readonly("name", [](const Device& d) { return info_of(d).name; })
      .def_property_readonly("total_memory", [](const Device& d) { return info_of(d).total_memory; })
      .def_property_readonly("total_memory_gb",
                             [](const Device& d) { return static_cast<double>(info_of(d).total_memory) / (1 << 30); })
      .def_property_readonly("free_memory", [](const Device& d) { return info_of(d).free_memory; })
      .def_property_readonly("compute_capability",
                             [](const Device& d) {
                               const DeviceInfo i = info_of(d);
                               return py::make_tuple(i.compute_capability_major, i.compute_capability_minor);
                             })
      .def_property_readonly("sm_count", [](const Device& d) { return info_of(d).sm_count; })
      .def_property_readonly("l2_cache_bytes", [](const Device& d) { return info_of(d).l2_cache_bytes; })
      .def_property_readonly("supports_fp16", [](const Device& d) { return info_of(d).supports_fp16; })
      .def_property_readonly("supports_bf16", [](const Device& d) { return info_of(d).supports_bf16; })
      .def_property_readonly("supports_int8", [](const Device& d) { return info_of(d).supports_int8; })
      .def_property_readonly("supports_fp8", [](const Device& d) { return info_of(d).supports_fp8; })
      .def_property_readonly("driver_version", [](const Device& d) { return info_of(d).driver_version; })
      .def_property_readonly("runtime_version", [](const Device& d) { return info_of(d).runtime_version; })
      .def("synchronize", [](const Device& d) { DeviceManager::instance().synchronize(d); },
           py::call_guard<py::gil_scoped_release>(), "Wait for all work on this device.")
      .def("__str__", &Device::str)
      .def("__repr__",
           [](const Device& d) {
             const DeviceInfo i = info_of(d);
             char gb[32];
             std::snprintf(gb, sizeof(gb), "%.1f GB", static_cast<double>(i.total_memory) / (1 << 30));
             return "<Device " + d.str() + ": " + i.name + " (" + gb + ")>";
           })
      .def("__eq__",
           [](const Device& d, const py::object& other) {
             try {
               return d == to_device(other);
             } catch (const XpuRuntimeError&) {
               return false;
             }
           })
      .def("__hash__", [](const Device& d) { return std::hash<Device>()(d); });

  m.def("get_device_count", [] { return DeviceManager::instance().get_device_count(); },
        "Number of CUDA devices (0 without a driver or GPU).");
  m.def("cuda_available", [] { return DeviceManager::instance().cuda_available(); });
  m.def("_inject_device_fault", [](const py::object& device) {
    DeviceManager::instance().inject_fault_for_testing(to_device(device));
  }, "Tests only: a kernel storing to an unmapped address (a sticky CUDA error at the next synchronization).");
  m.def("_inject_step_fault", [](const std::string& node, const std::string& kind) {
    GraphExec::inject_step_fault_for_testing(node, kind);
  }, py::arg("node"), py::arg("kind") = "capture",
        "Tests only (Note [Failed captures]): the next time step `node` runs, 'capture' synchronizes its stream during "
        "a CUDA graph capture (the capture fails), 'oom' raises OutOfMemoryError there. One shot.");
  m.def("device_fault", [](const py::object& device) {
    const Device d = to_device(device);
    return d.is_cuda() ? DeviceManager::instance().fault(d.index) : std::string();
  }, "Why the device became unusable (a sticky CUDA error earlier in this process), or an empty string.");
  m.def("cuda_unavailable_reason", [] { return DeviceManager::instance().cuda_unavailable_reason(); },
        "Why there are no CUDA devices (empty when there are).");
  m.def("get_all_devices",
        [] {
          std::vector<Device> out{Device::cpu()};
          for (int i = 0; i < DeviceManager::instance().get_device_count(); ++i) out.push_back(Device::cuda(i));
          return out;
        },
        "The CPU device, then every CUDA device.");
  m.def("get_device_info", [](const py::object& d) { return info_of(to_device(d)); }, py::arg("device") = py::none());
  m.def("get_current_device", [] { return DeviceManager::instance().get_current_device(); });
  m.def("set_current_device", [](const py::object& d) { DeviceManager::instance().set_current_device(to_device(d)); },
        py::arg("device"));
  m.def("synchronize",
        [](const py::object& d) {
          const Device device = to_device(d);
          py::gil_scoped_release release;
          DeviceManager::instance().synchronize(device);
        },
        py::arg("device") = py::none(), "Wait for all work on `device` (default: the current device).");
}

}  // namespace xpuruntime::bindings
