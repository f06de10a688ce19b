// Tensor: DLPack (both directions, zero-copy), numpy, device copies.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/dlpack.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/low_bit.h"

namespace xpuruntime::bindings {

namespace {

constexpr const char* kLegacyName = "dltensor";
constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kUsedLegacyName = "used_dltensor";
constexpr const char* kUsedVersionedName = "used_dltensor_versioned";

DType to_dtype(const py::handle& obj) {
  if (obj.is_none()) return DType::kFloat32;
  std::string name = py::str(obj).cast<std::string>();
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  if (name.rfind("<class 'numpy.", 0) == 0) name = name.substr(14, name.size() - 16);
  return dtype_from_name(name);
}

std::vector<std::int64_t> to_shape(const py::handle& obj) {
  if (py::isinstance<py::int_>(obj)) return {obj.cast<std::int64_t>()};
  try {
    return obj.cast<std::vector<std::int64_t>>();
  } catch (const py::cast_error&) {
    throw InvalidTypeError(detail::str_cat("Expected a shape (an int or a sequence of ints), got ",
                                           py::str(obj).cast<std::string>()));
  }
}

// int4/uint4 tensors hold one value per byte (Note [Float8 and 4-bit dtypes], xpuruntime/low_bit.h): every byte
// in range.
void check_int4_range(const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
  std::size_t bad = 0;
  const auto* bytes = static_cast<const std::uint8_t*>(host.data_ptr());
  if (!detail::int4_in_range(bytes, static_cast<std::size_t>(host.numel()), t.dtype(), &bad)) {
    const int value = t.dtype() == DType::kInt4 ? static_cast<std::int8_t>(bytes[bad]) : bytes[bad];
    throw InvalidArgumentError(detail::str_cat("view(\"", dtype_name(t.dtype()), "\"): element ", bad, " is ", value,
                                               ", outside ", dtype_name(t.dtype()), "'s range [",
                                               detail::int4_min(t.dtype()), ", ", detail::int4_max(t.dtype()), "]"));
  }
}

DType dtype_of_numpy(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 2) return DType::kFloat16;
  if (kind == 'f' && size == 4) return DType::kFloat32;
  if (kind == 'f' && size == 8) return DType::kFloat64;
  if (kind == 'i' && size == 1) return DType::kInt8;
  if (kind == 'i' && size == 2) return DType::kInt16;
  if (kind == 'i' && size == 4) return DType::kInt32;
  if (kind == 'i' && size == 8) return DType::kInt64;
  if (kind == 'u' && size == 1) return DType::kUInt8;
  if (kind == 'u' && size == 2) return DType::kUInt16;
  if (kind == 'u' && size == 4) return DType::kUInt32;
  if (kind == 'u' && size == 8) return DType::kUInt64;
  if (kind == 'b' && size == 1) return DType::kBool;
  throw InvalidTypeError(detail::str_cat("numpy dtype ", py::str(py::handle(dt)).cast<std::string>(),
                                         " has no xpuruntime equivalent (float16/32/64, int8/16/32/64, "
                                         "uint8/16/32/64, bool)"));
}

// Keeps a Python object alive from C++; takes the GIL to let it go (the last tensor may die anywhere).
std::shared_ptr<void> hold_python(py::object obj) {
  auto* raw = new py::object(std::move(obj));
  return std::shared_ptr<void>(raw, [](void* p) {
    auto* o = static_cast<py::object*>(p);
    if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
    py::gil_scoped_acquire gil;
    delete o;
  });
}

Tensor from_numpy(const py::array& arr) {
  const DType dtype = dtype_of_numpy(arr.dtype());
  const auto itemsize = static_cast<py::ssize_t>(arr.itemsize());
  std::vector<std::int64_t> shape(arr.shape(), arr.shape() + arr.ndim());
  std::vector<std::int64_t> strides;
  for (py::ssize_t i = 0; i < arr.ndim(); ++i) {
    const py::ssize_t s = arr.strides()[i];
    XPURT_CHECK(s % itemsize == 0, "from_numpy: byte stride ", s, " of dimension ", i,
                " is not a multiple of the item size ", itemsize, "; pass np.ascontiguousarray(a)");
    strides.push_back(s / itemsize);
  }
  return Tensor::from_blob(const_cast<void*>(arr.data()), shape, strides, dtype, Device::cpu(), hold_python(arr));
}

void capsule_destructor(PyObject* capsule) {
  // A capsule that was never consumed still owns its managed tensor.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, kLegacyName)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacyName));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, kVersionedName)) {
    auto* m = static_cast<DLManagedTensorVersionedV1*>(PyCapsule_GetPointer(capsule, kVersionedName));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
  PyErr_Restore(type, value, traceback);
}

Tensor import_capsule(const py::handle& capsule) {
  PyObject* c = capsule.ptr();
  if (PyCapsule_IsValid(c, kVersionedName)) {
    auto* m = static_cast<DLManagedTensorVersionedV1*>(PyCapsule_GetPointer(c, kVersionedName));
    PyCapsule_SetName(c, kUsedVersionedName);
    return from_dlpack_versioned(m);
  }
  if (PyCapsule_IsValid(c, kLegacyName)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kLegacyName));
    PyCapsule_SetName(c, kUsedLegacyName);
    return from_dlpack(m);
  }
  throw InvalidTypeError(
      "from_dlpack: expected an unused DLPack capsule (\"dltensor\" or \"dltensor_versioned\"); a capsule can be "
      "consumed only once");
}

// The DLPack stream number for `view`: 1 means the legacy default stream.
py::object dlpack_stream_number(const StreamView& view) {
  return view.is_default() ? py::int_(1) : py::int_(view.id());
}

Tensor import_object(const py::object& obj) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  if (py::isinstance<py::array>(obj)) return from_numpy(obj.cast<py::array>());
  if (PyCapsule_CheckExact(obj.ptr())) return import_capsule(obj);
  if (!py::hasattr(obj, "__dlpack__")) {
    throw InvalidTypeError(detail::str_cat("from_dlpack: expected an object with __dlpack__ (numpy, torch, cupy, "
                                           "...) or a DLPack capsule, got ",
                                           py::str(py::type::of(obj)).cast<std::string>()));
  }
  py::object stream = py::none();
  if (py::hasattr(obj, "__dlpack_device__")) {
    auto dev = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    if (dev.first == kDLCUDA) {
      const Device d = Device::cuda(dev.second);
      DeviceManager::instance().check_device(d);
      stream = dlpack_stream_number(StreamManager::instance().current_stream(d));
    }
  }
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")(py::arg("stream") = stream, py::arg("max_version") = py::make_tuple(1, 0));
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = obj.attr("__dlpack__")(py::arg("stream") = stream);  // producers before DLPack 1.0
  }
  return import_capsule(capsule);
}

py::object export_capsule(const Tensor& t, const py::object& stream, const py::object& max_version,
                          const py::object& dl_device, const py::object& copy) {
  Tensor out = t;
  if (!dl_device.is_none()) {
    auto dev = dl_device.cast<std::pair<int, int>>();
    Device target;
    if (dev.first == kDLCPU || dev.first == kDLCUDAHost) {
      target = Device::cpu();
    } else if (dev.first == kDLCUDA) {
      target = Device::cuda(dev.second);
    } else {
      throw py::buffer_error(detail::str_cat("__dlpack__: cannot export to DLPack device type ", dev.first));
    }
    if (target != t.device()) {
      if (!copy.is_none() && !copy.cast<bool>()) {
        throw py::buffer_error("__dlpack__: the tensor is on " + t.device().str() + " and copy=False forbids moving it");
      }
      py::gil_scoped_release release;
      out = t.to(target);
    }
  }
  if (!copy.is_none() && copy.cast<bool>() && out.storage() == t.storage()) {
    py::gil_scoped_release release;
    Tensor fresh = Tensor::empty(t.shape(), t.dtype(), t.device());
    fresh.copy_from(t);
    out = fresh;
  }
  if (out.device().is_cuda() && !stream.is_none()) {
    const auto number = stream.cast<long long>();
    XPURT_CHECK(number != 0, "__dlpack__: stream=0 is ambiguous for CUDA; use 1 for the legacy default stream");
    if (number != -1) {
      void* handle = number == 1 ? nullptr : reinterpret_cast<void*>(static_cast<std::uintptr_t>(number));
      const StreamView consumer(out.device(), handle);
      const StreamView producer = StreamManager::instance().current_stream(out.device());
      py::gil_scoped_release release;
      consumer.wait_stream(producer);
    }
  }
  bool versioned = false;
  if (!max_version.is_none()) versioned = max_version.cast<std::pair<int, int>>().first >= 1;
  if (versioned) {
    DLManagedTensorVersionedV1* m = to_dlpack_versioned(out);
    if (out.storage() != t.storage()) m->flags |= kDLPackFlagIsCopied;
    return py::reinterpret_steal<py::object>(PyCapsule_New(m, kVersionedName, capsule_destructor));
  }
  return py::reinterpret_steal<py::object>(PyCapsule_New(to_dlpack(out), kLegacyName, capsule_destructor));
}

}  // namespace

void bind_tensors(py::module_& m) {
  py::class_<Tensor>(m, "Tensor",
                     "A device-aware strided tensor. Exchanges memory zero-copy through DLPack (__dlpack__, "
                     "from_dlpack) with numpy, torch and cupy.")
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("strides", [](const Tensor& t) { return py::tuple(py::cast(t.strides())); },
                             "Strides in elements.")
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("device", &Tensor::device)
      .def_property_readonly("ndim", &Tensor::dim)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("itemsize", &Tensor::element_size)
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()); })
      .def_property_readonly("is_pinned", &Tensor::is_pinned)
      .def("numel", &Tensor::numel)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("to",
           [](const Tensor& t, const py::object& device, const py::object& stream, bool non_blocking) {
             const Device d = to_device(device);
             const Device cuda = d.is_cuda() ? d : t.device();
             std::optional<StreamView> s;
             if (!stream.is_none()) s = to_stream(stream, cuda);
             py::gil_scoped_release release;
             return t.to(d, s ? &*s : nullptr, non_blocking);
           },
           py::arg("device"), py::arg("stream") = py::none(), py::arg("non_blocking") = false,
           "A copy on `device` (this tensor when already there). CUDA copies run on `stream` (default: current); "
           "unless non_blocking, the call returns when the copy is done.")
      .def("cpu", [](const Tensor& t) {
             py::gil_scoped_release release;
             return t.to(Device::cpu());
           })
      .def("cuda", [](const Tensor& t, int index) {
             py::gil_scoped_release release;
             return t.to(Device::cuda(index));
           }, py::arg("index") = 0)
      .def("copy_",
           [](Tensor& t, const py::object& src, const py::object& stream, bool non_blocking) -> Tensor& {
             const Tensor source = import_object(src);
             const Device cuda = t.device().is_cuda() ? t.device() : source.device();
             std::optional<StreamView> s;
             if (!stream.is_none()) s = to_stream(stream, cuda);
             py::gil_scoped_release release;
             t.copy_from(source, s ? &*s : nullptr, non_blocking);
             return t;
           },
           py::arg("src"), py::arg("stream") = py::none(), py::arg("non_blocking") = false,
           py::return_value_policy::reference_internal,
           "Copies `src` (any DLPack tensor or numpy array of the same shape and dtype) into this tensor.")
      .def("view",
           [](const Tensor& t, const py::object& dtype) {
             XPURT_CHECK_TYPE(!dtype.is_none(), "view(): dtype is required (e.g. \"uint16\" or \"bfloat16\")");
             const DType to = to_dtype(dtype);
             Tensor out = t.view(to);
             if (is_int4_dtype(to) && to != t.dtype()) check_int4_range(out);
             return out;
           },
           py::arg("dtype"),
           "The same memory read as `dtype` (a name such as \"bfloat16\", or a numpy/torch dtype) of the same "
           "element size: the bits are reinterpreted, not converted, and the storage is shared (like torch's "
           "Tensor.view(dtype)). Raises InvalidTypeError for a dtype of another element size. int8/uint8 bytes "
           "viewed as int4/uint4 must lie in [-8, 7] / [0, 15] (InvalidArgumentError otherwise); a uint8 tensor of "
           "bit patterns viewed as a float8 dtype makes a float8 tensor.")
      .def("contiguous", [](const Tensor& t) {
             py::gil_scoped_release release;
             return t.contiguous();
           })
      .def("zero_", [](Tensor& t) -> Tensor& {
             py::gil_scoped_release release;
             t.zero_();
             return t;
           }, py::return_value_policy::reference_internal)
      .def("record_stream", [](const Tensor& t, const py::object& stream) { t.record_stream(to_stream(stream, t.device())); },
           py::arg("stream"))
      .def("to_numpy", &to_numpy,
           "A numpy array: a view of the same memory for CPU tensors, a copy for CUDA tensors.")
      .def("numpy", &to_numpy)
      .def("__array__",
           [](const Tensor& t, const py::object& dtype, const py::object& /*copy*/) {
             py::array a = to_numpy(t);
             return dtype.is_none() ? py::object(a) : py::object(a.attr("astype")(dtype));
           },
           py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack__", &export_capsule, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const Tensor& t) {
        const DLDevice d = to_dlpack_device(t);
        return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
      })
      .def("__len__", [](const Tensor& t) {
        XPURT_CHECK_TYPE(t.dim() > 0, "len() of a 0-d tensor");
        return t.shape()[0];
      })
      .def("__repr__", &Tensor::str);

  m.def("empty",
        [](const py::object& shape, const py::object& dtype, const py::object& device, const py::object& stream,
           bool pinned) {
          const std::vector<std::int64_t> s = to_shape(shape);
          const DType dt = to_dtype(dtype);
          const Device d = device.is_none() ? Device::cpu() : to_device(device);
          std::optional<StreamView> sv;
          if (!stream.is_none()) sv = to_stream(stream, d.is_cpu() && pinned ? to_stream(stream, Device::cpu()).device : d);
          py::gil_scoped_release release;
          return Tensor::empty(s, dt, d, sv ? &*sv : nullptr, pinned);
        },
        py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu", py::arg("stream") = py::none(),
        py::arg("pinned") = false, "An uninitialised tensor.");
  m.def("zeros",
        [](const py::object& shape, const py::object& dtype, const py::object& device, const py::object& stream) {
          const std::vector<std::int64_t> s = to_shape(shape);
          const DType dt = to_dtype(dtype);
          const Device d = device.is_none() ? Device::cpu() : to_device(device);
          std::optional<StreamView> sv;
          if (!stream.is_none()) sv = to_stream(stream, d);
          py::gil_scoped_release release;
          return Tensor::zeros(s, dt, d, sv ? &*sv : nullptr);
        },
        py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu", py::arg("stream") = py::none());
  m.def("from_dlpack", &import_object, py::arg("obj"),
        "A Tensor viewing the memory of any DLPack producer (numpy, torch, cupy, a capsule), zero-copy.");
  m.def("from_numpy", &from_numpy, py::arg("array"), "A CPU Tensor viewing a numpy array's memory, zero-copy.");
}

Tensor to_tensor(const py::handle& obj) { return import_object(py::reinterpret_borrow<py::object>(obj)); }

// Note [Float8 and int4 in numpy]
// numpy has no float8 and no 4-bit integers. A float8 tensor's numpy() is a float32 array of its values (a copy,
// exact: every float8 value is a float32), so an InferenceSession output of a float8 type comes back as numbers;
// t.view("uint8").numpy() gives the bit patterns instead (a view). int4/uint4, held one value per byte, come back
// as int8/uint8 arrays of the values (views). To make such tensors: from_numpy(uint8 bit patterns).view(
// "float8e4m3fn"), from_numpy(int8 values).view("int4") (range checked).
py::array to_numpy(const Tensor& t) {
  XPURT_CHECK_TYPE(t.dtype() != DType::kBFloat16,
                   "to_numpy: numpy has no bfloat16; t.view(\"uint16\").numpy() gives the bit patterns, "
                   "torch.from_dlpack(t) a torch tensor, and a cast to float32 the values");
  Tensor host = t;
  if (t.device().is_cuda()) {
    py::gil_scoped_release release;
    host = t.to(Device::cpu());
  }
  if (is_float8_dtype(host.dtype())) {  // Note [Float8 and int4 in numpy]: the values, as float32
    const Tensor bits = host.contiguous();
    std::vector<py::ssize_t> dims(bits.shape().begin(), bits.shape().end());
    py::array_t<float> values(dims);
    const auto* in = static_cast<const std::uint8_t*>(bits.data_ptr());
    float* out = values.mutable_data();
    for (std::int64_t i = 0; i < bits.numel(); ++i) out[i] = detail::float8_to_float(in[i], bits.dtype());
    return values;
  }
  if (host.dtype() == DType::kInt4) host = host.view(DType::kInt8);
  if (host.dtype() == DType::kUInt4) host = host.view(DType::kUInt8);
  std::vector<py::ssize_t> shape(host.shape().begin(), host.shape().end());
  std::vector<py::ssize_t> strides;
  for (std::int64_t s : host.strides()) strides.push_back(static_cast<py::ssize_t>(s * host.element_size()));
  // The array views the tensor's memory; the capsule keeps the storage alive.
  auto* keep = new Tensor(host);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(py::dtype(std::string(dtype_name(host.dtype()))), shape, strides, host.data_ptr(), base);
}

}  // namespace xpuruntime::bindings
