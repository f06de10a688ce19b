// Shared declarations of the _core binding files.
#pragma once

#include <pybind11/pybind11.h>

#include "xpuruntime/device.h"
#include "xpuruntime/stream_manager.h"

namespace xpuruntime::bindings {

namespace py = pybind11;

void bind_exceptions(py::module_& m);
void bind_devices(py::module_& m);
void bind_memory(py::module_& m);
void bind_streams(py::module_& m);
void bind_tensors(py::module_& m);

// Accepts a Device, "cpu"/"cuda:N", an int N (cuda:N), or None (the current device).
Device to_device(const py::handle& obj);
// Accepts a Stream, or None (the current stream of `device`).
StreamView to_stream(const py::handle& obj, Device device);

}  // namespace xpuruntime::bindings
