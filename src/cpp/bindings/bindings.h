// Shared declarations of the _core binding files.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "xpuruntime/device.h"
#include "xpuruntime/stream_manager.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime::bindings {

namespace py = pybind11;

void bind_exceptions(py::module_& m);
void bind_devices(py::module_& m);
void bind_memory(py::module_& m);
void bind_streams(py::module_& m);
void bind_tensors(py::module_& m);
void bind_policies(py::module_& m);
void bind_kernels(py::module_& m);
void bind_session(py::module_& m);
void bind_generation(py::module_& m);  // after bind_session: a Generator takes an InferenceSession
void bind_profiler(py::module_& m);
void bind_distributed(py::module_& m);

// Accepts a Device, "cpu"/"cuda:N", an int N (cuda:N), or None (the current device).
Device to_device(const py::handle& obj);
// Accepts a Stream, a raw CUDA stream handle (int, or an object with .cuda_stream such as torch.cuda.Stream),
// or None (the current stream of `device`).
StreamView to_stream(const py::handle& obj, Device device);

// An xpuruntime Tensor viewing `obj` zero-copy: a Tensor, a numpy array, or any object with __dlpack__.
Tensor to_tensor(const py::handle& obj);
// `t` as a numpy array viewing its memory (a device tensor is copied to the host first); bfloat16 raises.
py::array to_numpy(const Tensor& t);

}  // namespace xpuruntime::bindings
