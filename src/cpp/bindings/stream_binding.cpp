// Streams, events and CUDA graphs.
#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "bindings.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::bindings {

namespace {

// The Python Stream: owns a created stream, or views the default stream or a stream of another library.
struct PyStream {
  std::shared_ptr<Stream> owned;
  StreamView view;
  std::vector<StreamView> previous;  // streams made current by `with`
};

}  // namespace

StreamView to_stream(const py::handle& obj, Device device) {
  if (obj.is_none()) {
    if (device.is_cpu()) return StreamView();
    return StreamManager::instance().current_stream(device);
  }
  if (py::isinstance<PyStream>(obj)) {
    const StreamView v = obj.cast<const PyStream&>().view;
    XPURT_CHECK(device.is_cpu() || v.device == device, "Expected a stream of ", device.str(), ", but got a stream of ",
                v.device.str());
    return v;
  }
  // A foreign stream: a raw cudaStream_t as an int, or an object with `cuda_stream` (torch.cuda.Stream,
  // cupy.cuda.Stream's `ptr`), used without taking ownership.
  if (!device.is_cpu()) {
    py::object handle;
    if (py::isinstance<py::int_>(obj)) handle = py::reinterpret_borrow<py::object>(obj);
    else if (py::hasattr(obj, "cuda_stream")) handle = obj.attr("cuda_stream");
    else if (py::hasattr(obj, "ptr")) handle = obj.attr("ptr");
    if (handle) return StreamView(device, reinterpret_cast<void*>(handle.cast<std::uintptr_t>()));
  }
  throw InvalidTypeError(detail::str_cat("Expected an xpuruntime Stream, a CUDA stream handle (int or an object "
                                         "with .cuda_stream) or None, got ",
                                         py::str(py::type::of(obj)).cast<std::string>()));
}

namespace {

void bind_stream(py::module_& m) {
  py::class_<PyStream, std::shared_ptr<PyStream>>(
      m, "Stream",
      "A CUDA stream. Stream(device, priority=0) creates one (lower priority numbers run first); "
      "`with stream:` makes it the current stream of its device.")
      .def(py::init([](const py::object& device, int priority) {
             auto s = std::make_shared<PyStream>();
             s->owned = std::make_shared<Stream>(Stream::create(to_device(device), priority));
             s->view = s->owned->view();
             return s;
           }),
           py::arg("device") = py::none(), py::arg("priority") = 0)
      .def_static("from_handle",
                  [](std::uintptr_t handle, const py::object& device) {
                    const Device d = to_device(device);
                    DeviceManager::instance().check_device(d);
                    auto s = std::make_shared<PyStream>();
                    s->view = StreamView(d, reinterpret_cast<void*>(handle));
                    return s;
                  },
                  py::arg("handle"), py::arg("device") = py::none(),
                  "A non-owning view of a stream created elsewhere (e.g. torch.cuda.Stream().cuda_stream).")
      .def_property_readonly("device", [](const PyStream& s) { return s.view.device; })
      .def_property_readonly("handle", [](const PyStream& s) { return reinterpret_cast<std::uintptr_t>(s.view.handle); },
                             "The cudaStream_t as an integer (0 = legacy default stream).")
      .def_property_readonly("cuda_stream",
                             [](const PyStream& s) { return reinterpret_cast<std::uintptr_t>(s.view.handle); })
      .def_property_readonly("priority", [](const PyStream& s) { return s.view.priority(); })
      .def_property_readonly("is_default", [](const PyStream& s) { return s.view.is_default(); })
      .def("synchronize", [](const PyStream& s) { s.view.synchronize(); }, py::call_guard<py::gil_scoped_release>())
      .def("query", [](const PyStream& s) { return s.view.query(); }, py::call_guard<py::gil_scoped_release>())
      .def("wait_event", [](const PyStream& s, const Event& e) { s.view.wait_event(e); },
           py::call_guard<py::gil_scoped_release>())
      .def("wait_stream", [](const PyStream& s, const PyStream& other) { s.view.wait_stream(other.view); },
           py::call_guard<py::gil_scoped_release>())
      .def("record_event",
           [](const PyStream& s, const py::object& event) -> py::object {
             if (event.is_none()) {
               Event e(s.view.device);
               e.record(s.view);
               return py::cast(std::move(e));
             }
             event.cast<Event&>().record(s.view);
             return event;
           },
           py::arg("event") = py::none(), "Records `event` (a new one when None) on this stream and returns it.")
      .def("__enter__",
           [](PyStream& s) -> PyStream& {
             s.previous.push_back(StreamManager::instance().current_stream(s.view.device));
             StreamManager::instance().set_current_stream(s.view);
             return s;
           },
           py::return_value_policy::reference)
      .def("__exit__",
           [](PyStream& s, const py::args&) {
             if (!s.previous.empty()) {
               StreamManager::instance().set_current_stream(s.previous.back());
               s.previous.pop_back();
             }
           })
      .def("__eq__", [](const PyStream& a, const py::object& b) {
        return py::isinstance<PyStream>(b) && a.view == b.cast<const PyStream&>().view;
      })
      .def("__hash__", [](const PyStream& s) { return std::hash<std::uintptr_t>()(s.view.id()); })
      .def("__repr__", [](const PyStream& s) {
        char buffer[96];
        std::snprintf(buffer, sizeof(buffer), "<Stream %s handle=0x%zx%s>", s.view.device.str().c_str(),
                      static_cast<std::size_t>(s.view.id()), s.view.is_default() ? " (default)" : "");
        return std::string(buffer);
      });
}

// The streams of a device: default_stream, current_stream, set_current_stream, stream_priority_range.
void bind_current_streams(py::module_& m) {
  m.def("default_stream",
        [](const py::object& device) {
          auto s = std::make_shared<PyStream>();
          s->view = StreamManager::instance().default_stream(to_device(device));
          return s;
        },
        py::arg("device") = py::none(), "The legacy default stream of `device`.");
  m.def("current_stream",
        [](const py::object& device) {
          auto s = std::make_shared<PyStream>();
          s->view = StreamManager::instance().current_stream(to_device(device));
          return s;
        },
        py::arg("device") = py::none(), "The calling thread's current stream of `device`.");
  m.def("set_current_stream", [](const PyStream& s) { StreamManager::instance().set_current_stream(s.view); },
        py::arg("stream"));
  m.def("stream_priority_range",
        [](const py::object& device) {
          int least = 0;
          int greatest = 0;
          StreamManager::instance().priority_range(to_device(device), &least, &greatest);
          return py::make_tuple(least, greatest);
        },
        py::arg("device") = py::none(), "(least, greatest) priority numbers; lower numbers run first.");
}

void bind_event(py::module_& m) {
  py::class_<Event>(m, "Event", "A CUDA event for ordering streams or timing (enable_timing=True).")
      .def(py::init([](const py::object& device, bool enable_timing, bool blocking) {
             return Event(to_device(device), enable_timing, blocking);
           }),
           py::arg("device") = py::none(), py::arg("enable_timing") = false, py::arg("blocking") = false)
      .def("record",
           [](Event& e, const py::object& stream) { e.record(to_stream(stream, e.device())); },
           py::arg("stream") = py::none())
      .def("query", &Event::query, py::call_guard<py::gil_scoped_release>())
      .def("synchronize", &Event::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("wait", [](const Event& e, const py::object& stream) { to_stream(stream, e.device()).wait_event(e); },
           py::arg("stream") = py::none(), "Makes `stream` (default: current) wait for this event.")
      .def("elapsed_time", &Event::elapsed_ms, py::arg("end"), "Milliseconds from this event to `end`.")
      .def_property_readonly("device", &Event::device)
      .def_property_readonly("recorded", &Event::recorded)
      .def("__repr__", [](const Event& e) {
        return "<Event " + e.device().str() + (e.timing() ? " timing" : "") + (e.recorded() ? " recorded" : "") + ">";
      });
}

// CaptureMode and CudaGraph.
void bind_cuda_graph(py::module_& m) {
  py::enum_<CaptureMode>(m, "CaptureMode")
      .value("GLOBAL", CaptureMode::kGlobal)
      .value("THREAD_LOCAL", CaptureMode::kThreadLocal)
      .value("RELAXED", CaptureMode::kRelaxed);

  py::class_<CudaGraph>(m, "CudaGraph",
                        "A captured CUDA graph with its private memory pool: capture_begin(stream), queue work, "
                        "capture_end(), then replay() many times.")
      .def(py::init<>())
      .def("capture_begin",
           [](CudaGraph& g, const PyStream& stream, MempoolId pool, CaptureMode mode) {
             g.capture_begin(stream.view, pool, mode);
           },
           py::arg("stream"), py::arg("pool") = 0, py::arg("mode") = CaptureMode::kThreadLocal)
      .def("capture_end", &CudaGraph::capture_end, py::call_guard<py::gil_scoped_release>())
      .def("replay", [](CudaGraph& g, const py::object& stream) {
             if (stream.is_none()) {
               py::gil_scoped_release release;
               g.replay();
             } else {
               const StreamView v = stream.cast<const PyStream&>().view;
               py::gil_scoped_release release;
               g.replay(v);
             }
           },
           py::arg("stream") = py::none())
      .def("reset", &CudaGraph::reset)
      .def_property_readonly("pool", &CudaGraph::pool, "The id of the graph's private memory pool.")
      .def_property_readonly("is_capturing", &CudaGraph::is_capturing)
      .def_property_readonly("is_instantiated", &CudaGraph::is_instantiated)
      .def_property_readonly("num_nodes", &CudaGraph::num_nodes)
      .def("__repr__", [](const CudaGraph& g) {
        return detail::str_cat("<CudaGraph ", g.is_instantiated() ? "instantiated" : (g.is_capturing() ? "capturing" : "empty"),
                               " pool=", g.pool(), ">");
      });
}

}  // namespace

// In the order of the classes' definitions (a signature names the classes bound before it).
void bind_streams(py::module_& m) {
  bind_stream(m);
  bind_current_streams(m);
  bind_event(m);
  bind_cuda_graph(m);
}

}  // namespace xpuruntime::bindings
