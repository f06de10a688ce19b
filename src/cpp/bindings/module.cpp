// The xpuruntime._core module: the C++ core as seen from Python.
#include "bindings.h"
#include "xpuruntime/version.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "xpuruntime C++ core (devices, memory, streams, graphs, tensors, policies, kernels)";
  using namespace xpuruntime;
  bindings::bind_exceptions(m);
  bindings::bind_devices(m);
  bindings::bind_streams(m);
  bindings::bind_memory(m);
  bindings::bind_tensors(m);
  bindings::bind_policies(m);
  bindings::bind_kernels(m);
  bindings::bind_session(m);
  bindings::bind_generation(m);
  bindings::bind_profiler(m);
  bindings::bind_distributed(m);

  m.def("get_version", &get_version, "The version of the xpuruntime core library.");
  m.def("build_info", [] {
    BuildInfo info = get_build_info();
    py::dict d;
    d["version"] = info.version;
    d["with_cuda"] = info.with_cuda;
    d["with_nvtx"] = info.with_nvtx;
    d["cuda_runtime_version"] = info.cuda_runtime_version;
    d["compiler"] = info.compiler;
    d["build_type"] = info.build_type;
    return d;
  }, "How the core library was built: version, CUDA/NVTX support, compiler.");
}
