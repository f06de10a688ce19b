// Profiler and its user ranges. The Python module xpuruntime.runtime.profiler wraps these (xpuruntime.profile).
#include <pybind11/stl.h>

#include "bindings.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/profiler.h"

namespace xpuruntime::bindings {

namespace {

py::object arg_object(const ProfileArg& arg) {
  return std::visit([](const auto& v) -> py::object { return py::cast(v); }, arg);
}

py::dict event_dict(const ProfileEvent& e) {
  py::dict args;
  for (const auto& [k, v] : e.args) args[py::str(k)] = arg_object(v);
  py::dict d;
  d["name"] = e.name;
  d["cat"] = e.category;
  d["ts_us"] = static_cast<double>(e.start_ns) / 1000.0;
  d["dur_us"] = static_cast<double>(e.duration_ns) / 1000.0;
  d["pid"] = e.pid;
  d["tid"] = e.tid;
  d["id"] = e.id;
  d["parent"] = e.parent == 0 ? py::object(py::none()) : py::object(py::int_(e.parent));
  d["device"] = e.device;
  d["args"] = args;
  return d;
}

py::dict per_device_dict(const MemoryEventsSummary::PerDevice& p) {
  py::dict d;
  d["allocations"] = p.allocations;
  d["frees"] = p.frees;
  d["allocated_bytes"] = p.allocated_bytes;
  d["freed_bytes"] = p.freed_bytes;
  d["peak_bytes"] = p.peak_bytes;
  return d;
}

OrtProfileMergeOptions merge_options(const py::object& offset_us, const py::object& start_time_ns) {
  OrtProfileMergeOptions options;
  if (!offset_us.is_none()) {
    if (!py::isinstance<py::float_>(offset_us) && !py::isinstance<py::int_>(offset_us)) {
      throw InvalidTypeError("offset_us must be a number of microseconds or None, got " +
                             std::string(py::str(offset_us.get_type().attr("__name__"))));
    }
    options.offset_us = offset_us.cast<double>();
  }
  if (!start_time_ns.is_none()) {
    if (!py::isinstance<py::int_>(start_time_ns)) {
      throw InvalidTypeError("start_time_ns must be an int (ns since the Unix epoch) or None, got " +
                             std::string(py::str(start_time_ns.get_type().attr("__name__"))));
    }
    options.start_time_ns = start_time_ns.cast<std::int64_t>();
  }
  return options;
}

py::dict merge_result_dict(const OrtProfileMergeResult& r) {
  py::dict d;
  d["node_events"] = r.node_events;
  d["session_events"] = r.session_events;
  d["skipped"] = r.skipped;
  d["alignment"] = r.alignment;
  return d;
}

py::dict summary_dict(const NodeSummary& s) {
  py::dict d;
  d["node"] = s.node;
  d["op_type"] = s.op_type;
  d["op"] = s.op;
  d["kernel"] = s.kernel;
  d["backend"] = s.backend;
  d["precision"] = s.precision;
  d["reason"] = s.reason;
  d["device"] = s.device;
  d["device_kernels"] = s.device_kernels;
  d["calls"] = s.calls;
  d["total_us"] = static_cast<double>(s.total_ns) / 1000.0;
  d["mean_us"] = s.mean_ns() / 1000.0;
  d["share"] = s.share;
  d["bytes"] = s.bytes;
  d["flops"] = s.flops;
  d["floor_bytes"] = s.floor_bytes;
  d["ceiling"] = s.ceiling;
  d["floor_us"] = static_cast<double>(s.floor_ns) / 1000.0;
  d["bound"] = s.bound;
  d["efficiency"] = s.efficiency;
  d["lost_share"] = s.lost_share();
  d["flagged"] = s.flagged();
  return d;
}

}  // namespace

void bind_profiler(py::module_& m) {
  py::class_<Profiler::Range>(m, "ProfilerRange", "A user range of the profiler (and an NVTX range); a context manager.")
      .def(py::init<std::string>(), py::arg("name"))
      .def("end", &Profiler::Range::end, "Ends the range now (idempotent).")
      .def("__enter__", [](Profiler::Range& r) -> Profiler::Range& { return r; }, py::return_value_policy::reference)
      .def("__exit__", [](Profiler::Range& r, const py::args&) { r.end(); });

  py::class_<Profiler>(m, "Profiler", "Records sessions, nodes, CUDA kernels and copies (CUPTI), allocations, ranges.")
      .def(py::init([](const py::object& cuda, bool record_shapes) {
             ProfilerOptions options;
             if (cuda.is_none()) {
               options.cuda = ProfilerOptions::CudaActivity::kAuto;
             } else if (py::isinstance<py::bool_>(cuda)) {
               options.cuda = cuda.cast<bool>() ? ProfilerOptions::CudaActivity::kOn : ProfilerOptions::CudaActivity::kOff;
             } else {
               throw InvalidTypeError("cuda must be True, False or None (CUDA activity when a GPU is present), got " +
                                      std::string(py::str(cuda.get_type().attr("__name__"))));
             }
             options.record_shapes = record_shapes;
             return std::make_unique<Profiler>(options);
           }),
           py::arg("cuda") = py::none(), py::arg("record_shapes") = true)
      .def("start", &Profiler::start)
      .def("stop", &Profiler::stop)
      .def_property_readonly("recording", &Profiler::recording)
      .def_property_readonly("cuda_activity", &Profiler::cuda_activity)
      .def_property_readonly("cuda_activity_reason", &Profiler::cuda_activity_reason)
      .def("events", [](const Profiler& p) {
        py::list out;
        for (const auto& e : p.events()) out.append(event_dict(e));
        return out;
      })
      .def(
          "summary",
          [](const Profiler& p, const std::string& within) {
            py::list out;
            for (const auto& s : p.summary(within)) out.append(summary_dict(s));
            return out;
          },
          py::arg("within") = "")
      .def(
          "audit",
          [](const Profiler& p, std::size_t top) {
            py::list out;
            for (const auto& s : p.audit(top)) out.append(summary_dict(s));
            return out;
          },
          py::arg("top") = 0)
      .def("set_ceilings", &Profiler::set_ceilings, py::arg("device"), py::arg("figures"))
      .def(
          "ceilings",
          [](const Profiler& p, const std::string& device) {
            const roofline::DeviceCeilings c = p.ceilings(device);
            py::dict d;
            d["device"] = c.device;
            d["bandwidth"] = c.bandwidth;
            d["peaks"] = c.peaks;
            d["source"] = c.source;
            return d;
          },
          py::arg("device"))
      .def("summary_table", &Profiler::summary_table, py::arg("max_rows") = 0, py::arg("within") = "")
      .def("memory", [](const Profiler& p) {
        const MemoryEventsSummary mem = p.memory();
        py::dict d = per_device_dict(mem.total);
        py::dict devices;
        for (const auto& [name, per] : mem.devices) devices[py::str(name)] = per_device_dict(per);
        d["devices"] = devices;
        return d;
      })
      .def_property_readonly("metadata", &Profiler::metadata)
      .def("chrome_trace", &Profiler::chrome_trace)
      .def("export_chrome_trace", &Profiler::export_chrome_trace, py::arg("path"))
      .def(
          "merge_ort_profile",
          [](Profiler& p, const std::string& path, const py::object& offset_us, const py::object& start_time_ns) {
            return merge_result_dict(p.merge_ort_profile(path, merge_options(offset_us, start_time_ns)));
          },
          py::arg("path"), py::arg("offset_us") = py::none(), py::arg("start_time_ns") = py::none());

  m.def(
      "merge_ort_profile_into_chrome_trace",
      [](const std::string& trace_json, const std::string& path, const py::object& offset_us,
         const py::object& start_time_ns) {
        OrtProfileMergeResult result;
        std::string merged = Profiler::merge_ort_profile_into_chrome_trace(
            trace_json, path, merge_options(offset_us, start_time_ns), &result);
        return py::make_tuple(merged, merge_result_dict(result));
      },
      py::arg("trace_json"), py::arg("path"), py::arg("offset_us") = py::none(), py::arg("start_time_ns") = py::none(),
      "Merges ONNX Runtime's profile at `path` into a Chrome trace (JSON text): (the merged text, what was added).");

  m.def("profiler_active", [] { return profiler::recording(); }, "Whether a Profiler is recording in this process.");
}

}  // namespace xpuruntime::bindings
