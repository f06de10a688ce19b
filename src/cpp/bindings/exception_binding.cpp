// The exception hierarchy, created as Python classes and translated from the C++ types.
#include <Python.h>

#include "bindings.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::bindings {

namespace {

PyObject* make_exception(py::module_& m, const char* name, const char* doc, PyObject* bases) {
  const std::string qualified = std::string("xpuruntime.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;  // kept for the life of the process
}

PyObject* g_base = nullptr;
PyObject* g_cuda = nullptr;
PyObject* g_oom = nullptr;
PyObject* g_unsupported = nullptr;
PyObject* g_invalid_argument = nullptr;
PyObject* g_invalid_type = nullptr;
PyObject* g_distributed = nullptr;
PyObject* g_distributed_timeout = nullptr;
PyObject* g_terminated = nullptr;
PyObject* g_run_timeout = nullptr;

}  // namespace

void bind_exceptions(py::module_& m) {
  g_base = make_exception(m, "XpuRuntimeError", "Base class of every error xpuruntime raises.", PyExc_RuntimeError);
  py::tuple base_only = py::make_tuple(py::handle(g_base));
  g_cuda = make_exception(m, "CudaError", "A CUDA call failed, or CUDA is unavailable (the message says why).",
                          base_only.ptr());
  g_oom = make_exception(m, "OutOfMemoryError",
                         "An allocation could not be satisfied; the message says what was asked, allocated, "
                         "reserved and free.",
                         base_only.ptr());
  g_unsupported = make_exception(m, "UnsupportedOperationError",
                                 "This build or device cannot do what was asked; the message says what to install.",
                                 base_only.ptr());
  py::tuple value_bases = py::make_tuple(py::handle(g_base), py::handle(PyExc_ValueError));
  g_invalid_argument =
      make_exception(m, "InvalidArgumentError", "A bad argument value (also a ValueError).", value_bases.ptr());
  py::tuple type_bases = py::make_tuple(py::handle(g_base), py::handle(PyExc_TypeError));
  g_invalid_type =
      make_exception(m, "InvalidTypeError", "An argument of the wrong dtype or kind (also a TypeError).",
                     type_bases.ptr());

  g_distributed = make_exception(m, "DistributedError",
                                 "A collective or communicator failed: a rank timed out, died or aborted.",
                                 base_only.ptr());
  py::tuple timeout_bases = py::make_tuple(py::handle(g_distributed), py::handle(PyExc_TimeoutError));
  g_distributed_timeout = make_exception(
      m, "DistributedTimeoutError",
      "A collective or rendezvous waited longer than its communicator's timeout (also a DistributedError and a "
      "TimeoutError); the communicator was aborted.",
      timeout_bases.ptr());

  g_terminated = make_exception(m, "RunTerminatedError",
                                "A run stopped before its end: its RunOptions' terminate was set, or it was "
                                "interrupted; the message says where. The session can run again.",
                                base_only.ptr());
  py::tuple run_timeout_bases = py::make_tuple(py::handle(g_terminated), py::handle(PyExc_TimeoutError));
  g_run_timeout = make_exception(m, "RunTimeoutError",
                                 "A run took longer than its RunOptions' timeout and stopped (also a "
                                 "RunTerminatedError and a TimeoutError); the message says where.",
                                 run_timeout_bases.ptr());

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OutOfMemoryError& e) {
      PyErr_SetString(g_oom, e.what());
    } catch (const CudaError& e) {
      PyErr_SetString(g_cuda, e.what());
    } catch (const UnsupportedOperationError& e) {
      PyErr_SetString(g_unsupported, e.what());
    } catch (const InvalidArgumentError& e) {
      PyErr_SetString(g_invalid_argument, e.what());
    } catch (const InvalidTypeError& e) {
      PyErr_SetString(g_invalid_type, e.what());
    } catch (const DistributedError& e) {
      PyErr_SetString(e.timed_out() ? g_distributed_timeout : g_distributed, e.what());
    } catch (const RunTerminatedError& e) {
      PyErr_SetString(e.timed_out() ? g_run_timeout : g_terminated, e.what());
    } catch (const XpuRuntimeError& e) {
      PyErr_SetString(g_base, e.what());
    }
  });
}

}  // namespace xpuruntime::bindings
