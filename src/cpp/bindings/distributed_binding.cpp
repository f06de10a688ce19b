// xpuruntime._core.distributed: communicators, the FileStore, NCCL groups (Python API in xpuruntime.distributed).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "xpuruntime/distributed.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::bindings {

namespace {

distributed::CommOptions comm_options(double timeout, const std::string& algo, const std::string& proto,
                                      double init_timeout = 0.0) {
  XPURT_CHECK(timeout > 0, "timeout must be a positive number of seconds, got ", timeout);
  XPURT_CHECK(init_timeout >= 0, "init_timeout must be a positive number of seconds (or 0: the default), got ",
              init_timeout);
  distributed::CommOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000.0));
  if (options.timeout.count() == 0) options.timeout = std::chrono::milliseconds(1);
  options.init_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(init_timeout * 1000.0));
  if (init_timeout > 0 && options.init_timeout.count() == 0) options.init_timeout = std::chrono::milliseconds(1);
  options.nccl_algo = algo;
  options.nccl_proto = proto;
  return options;
}

}  // namespace

void bind_distributed(py::module_& parent) {
  py::module_ m = parent.def_submodule("distributed", "Communicators and collectives (xpuruntime.distributed)");
  using distributed::Communicator;
  py::class_<distributed::Store, std::shared_ptr<distributed::Store>>(m, "Store");
  py::class_<distributed::FileStore, distributed::Store, std::shared_ptr<distributed::FileStore>>(m, "FileStore")
      .def(py::init<std::string>(), py::arg("folder"))
      .def_property_readonly("folder", &distributed::FileStore::folder)
      .def(
          "set", [](distributed::FileStore& s, const std::string& key, const py::bytes& value) { s.set(key, value); },
          py::arg("key"), py::arg("value"))
      .def(
          "get",
          [](distributed::FileStore& s, const std::string& key, double timeout) {
            std::string value;
            {
              py::gil_scoped_release release;
              value = s.get(key, std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000.0)));
            }
            return py::bytes(value);
          },
          py::arg("key"), py::arg("timeout") = 300.0);

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_static(
          "init_all",
          [](const std::vector<py::object>& devices, double timeout, const std::string& algo,
             const std::string& proto, double init_timeout) {
            std::vector<Device> ds;
            for (const auto& d : devices) ds.push_back(to_device(d));
            const distributed::CommOptions options = comm_options(timeout, algo, proto, init_timeout);
            py::gil_scoped_release release;
            return Communicator::init_all(ds, options);
          },
          py::arg("devices"), py::arg("timeout") = 300.0, py::arg("nccl_algo") = "", py::arg("nccl_proto") = "",
          py::arg("init_timeout") = 0.0)
      .def_static(
          "init_rank",
          [](int world_size, int rank, const py::object& device, distributed::Store& store, double timeout,
             const std::string& key, const std::string& algo, const std::string& proto, double init_timeout) {
            const Device d = to_device(device);
            const distributed::CommOptions options = comm_options(timeout, algo, proto, init_timeout);
            py::gil_scoped_release release;
            return Communicator::init_rank(world_size, rank, d, store, options, key);
          },
          py::arg("world_size"), py::arg("rank"), py::arg("device"), py::arg("store"), py::arg("timeout") = 300.0,
          py::arg("key") = "xpuruntime_comm", py::arg("nccl_algo") = "", py::arg("nccl_proto") = "",
          py::arg("init_timeout") = 0.0)
      .def_static("find", &Communicator::find, py::arg("handle"))
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("device", &Communicator::device)
      .def_property_readonly("handle", &Communicator::handle)
      .def_property_readonly("backend", &Communicator::backend)
      .def_property_readonly(
          "timeout", [](const Communicator& c) { return static_cast<double>(c.options().timeout.count()) / 1000.0; })
      .def_property_readonly("init_timeout",
                             [](const Communicator& c) {
                               return static_cast<double>(c.options().creation_timeout().count()) / 1000.0;
                             })
      .def_property_readonly("aborted", &Communicator::aborted)
      .def_property_readonly("abort_reason", &Communicator::abort_reason)
      .def("abort", &Communicator::abort, py::arg("reason") = "aborted by the caller",
           py::call_guard<py::gil_scoped_release>())
      .def(
          "wait",
          [](Communicator& c, const py::object& stream) {
            const StreamView view = to_stream(stream, c.device());
            py::gil_scoped_release release;
            c.wait(view);
          },
          py::arg("stream") = py::none(),
          "Waits for the stream's work (default: the device's current stream), at most the timeout; past it the "
          "communicator is aborted and DistributedTimeoutError raised.")
      .def("__repr__", &Communicator::str);

  m.def("group_start", &distributed::group_start, py::call_guard<py::gil_scoped_release>());
  m.def("group_end", &distributed::group_end, py::call_guard<py::gil_scoped_release>());
  m.def("nccl_available", [] {
    std::string why;
    const bool ok = distributed::nccl_available(&why);
    return py::make_tuple(ok, why);
  });
  m.def("nccl_version", &distributed::nccl_version);
}

}  // namespace xpuruntime::bindings
