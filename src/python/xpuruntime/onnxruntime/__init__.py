"""ONNX Runtime's Python API on xpuruntime: ``import xpuruntime.onnxruntime as ort`` in place of
``import onnxruntime as ort``.

``InferenceSession(path_or_bytes, sess_options, providers, provider_options)``, ``SessionOptions``, ``RunOptions``,
``OrtValue``, ``IOBinding``, ``GraphOptimizationLevel``, ``ExecutionMode``, ``get_available_providers`` and the
session's ``get_providers``, ``get_provider_options``, ``get_modelmeta``, ``end_profiling`` behave as ONNX
Runtime's do. Providers name the device and the engine (Note [Providers]); every option is applied, mapped onto an
xpuruntime policy, or reported as ignored, and ``explain()`` says which. docs/engines.md has the table of every
public name: supported, mapped, or refused with the reason.

Note [Providers]
----------------
ONNX Runtime assigns each node to the first provider in ``providers`` that can run it, with the CPU provider as
the last resort. Here the list picks the session's device and engine:

- ``CUDAExecutionProvider`` (``device_id`` in its provider options) -> ``device="cuda:N"``; without a CUDA device it
  falls back to the CPU with a warning, as ONNX Runtime does when a provider is unavailable.
- ``CPUExecutionProvider`` -> ``device="cpu"``. Listed after CUDA it also means ONNX Runtime's CPU fallback: the
  native engine runs nodes without a CUDA kernel on the CPU (``ExecutionPolicy(fallback="cpu")``), unless
  ``disable_fallback()`` was called.
- ``TensorrtExecutionProvider``, ``OpenVINOExecutionProvider``, ``QNNExecutionProvider`` -> the ``tensorrt``,
  ``openvino`` and ``qnn`` engines, which say what to install.
- xpuruntime's own engines as providers: ``"native"``, ``"onnxruntime"``, ``"auto"`` (alone, or before a device
  provider: ``["native", "CUDAExecutionProvider"]``).
"""

from __future__ import annotations

import copy
import enum
import threading
import os
import time
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from ..inference.session import InferenceSession as _XrtSession
from ..inference.session import IOBinding
from ..policies import ExecutionPolicy, KernelPolicy
from ._devices import (OrtAllocatorType, OrtArenaCfg, OrtDevice, OrtDeviceMemoryType, OrtDeviceVendorId,
                       OrtMemoryInfo, OrtMemoryInfoDeviceType, OrtMemType, create_and_register_allocator,
                       create_and_register_allocator_v2)
from ._errors import (EngineError, EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, ModelLoaded,
                      NoModel, NoSuchFile, NotImplemented, RuntimeException, ort_errors, ort_errors_class)
from ._errors import NotImplemented as OrtNotImplemented  # the module-internal name: no clash with the builtin
from ._sparse import OrtSparseFormat, SparseTensor

__all__ = [
    "InferenceSession", "SessionOptions", "RunOptions", "OrtValue", "IOBinding", "OrtIOBinding", "NodeArg",
    "ModelMetadata",
    "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "get_available_providers", "get_all_providers",
    "get_device", "get_version_string", "set_default_logger_severity", "set_default_logger_verbosity", "set_seed",
    "enable_telemetry_events", "disable_telemetry_events", "__version__", "get_build_info",
    "set_default_logger_callback", "OrtDevice", "OrtDeviceVendorId", "OrtMemoryInfo", "OrtMemoryInfoDeviceType",
    "OrtMemType", "OrtDeviceMemoryType", "OrtAllocatorType", "OrtArenaCfg", "create_and_register_allocator",
    "create_and_register_allocator_v2", "SparseTensor", "OrtSparseFormat", "LoraAdapter", "AdapterFormat",
    "Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException", "InvalidProtobuf",
    "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail",
]

__version__ = _core.get_version()

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
# Providers of ONNX Runtime that name one of xpuruntime's engines.
_ENGINE_PROVIDERS = {
    "TensorrtExecutionProvider": "tensorrt",
    "NvTensorRTRTXExecutionProvider": "tensorrt",
    "OpenVINOExecutionProvider": "openvino",
    "QNNExecutionProvider": "qnn",
}
_XRT_ENGINES = ("auto", "native", "onnxruntime", "tensorrt", "openvino", "qnn")
_ALL_PROVIDERS = [CUDA, "TensorrtExecutionProvider", "OpenVINOExecutionProvider", "QNNExecutionProvider", CPU]

# The native engine's graph passes by ONNX Runtime's optimization levels (docs/native_engine.md, "Graph passes").
_BASIC_PASSES = {"constant_folding", "shape_folding", "predicate_reduction", "identity_elimination",
                 "dead_node_elimination", "op_decomposition", "conv_bn_folding"}
_EXTENDED_PASSES = {"gelu_fusion", "layer_norm_fusion", "residual_layer_norm_fusion", "attention_fusion",
                    "gemm_fusion", "conv_fusion"}
_LAYOUT_PASSES = {"nhwc_layout"}

_ONNX_TYPES = {"float32": "float", "float64": "double", "float16": "float16", "bfloat16": "bfloat16",
               "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
               "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool"}


class GraphOptimizationLevel(enum.IntEnum):
    """ONNX Runtime's levels; each maps onto the native engine's passes (``disabled_passes``)."""
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


def get_available_providers() -> List[str]:
    """The providers this build can serve on this machine, in ONNX Runtime's priority order: CUDA first when the
    build has CUDA and the machine a CUDA device (ONNX Runtime lists a provider it was built with even without its
    device; code that picks providers from this list then gets one that runs)."""
    with_cuda = bool(_core.build_info().get("with_cuda")) and _core.get_device_count() > 0
    return ([CUDA] if with_cuda else []) + [CPU]


def get_build_info() -> str:
    """How this xpuruntime was built, in ONNX Runtime's form (``"Build Info: ..."``)."""
    info = _core.build_info()
    return ("Build Info: xpuruntime " + str(info.get("version", __version__)) + ", "
            + ", ".join(f"{k}={v}" for k, v in sorted(info.items()) if k != "version"))


def get_all_providers() -> List[str]:
    """Every provider name this module understands (the ones it cannot serve raise with what to install)."""
    return list(_ALL_PROVIDERS)


def get_device() -> str:
    """``"GPU"`` when a CUDA device is present, else ``"CPU"`` (ONNX Runtime's build device)."""
    return "GPU" if _core.get_device_count() > 0 else "CPU"


def get_version_string() -> str:
    return __version__


# Note [The compatibility log]: what this module decides (each provider and option mapped, each session created)
# goes to the callback set by set_default_logger_callback, at ONNX Runtime's severities (0 verbose .. 4 fatal), as
# well as to explain(). The engines' own logs do not: xpuruntime reports through exceptions and explain().
_logger: Dict[str, Any] = {"callback": None, "severity": 2}


def set_default_logger_severity(severity: int) -> None:
    """The least severity (0 verbose, 1 info, 2 warning, 3 error, 4 fatal) the log callback receives."""
    if not isinstance(severity, int) or not 0 <= severity <= 4:
        raise _core.InvalidArgumentError(f"logger severity must be 0..4, got {severity!r}")
    _logger["severity"] = severity


def set_default_logger_callback(callback: Optional[Any], severity: Optional[int] = None) -> None:
    """Routes this module's log (Note [The compatibility log]) to ``callback(severity, category, logid,
    code_location, message)``; ``None`` stops it. ``severity`` also sets the least severity logged. A callback
    that raises is reported once as a warning and does not stop the session."""
    if callback is not None and not callable(callback):
        raise _core.InvalidArgumentError(f"set_default_logger_callback takes a callable or None, got "
                                         f"{type(callback).__name__}")
    if severity is not None:
        set_default_logger_severity(severity)
    _logger["callback"] = callback


def _log(severity: int, logid: str, message: str, code_location: str = "xpuruntime.onnxruntime") -> None:
    callback = _logger["callback"]
    if callback is None or severity < _logger["severity"]:
        return
    try:
        callback(int(severity), "xpuruntime", str(logid), code_location, str(message))
    except Exception as error:  # a user's callback must not break a session
        _logger["callback"] = None
        warnings.warn(f"the log callback raised {error!r}; it is removed", RuntimeWarning, stacklevel=3)


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted for compatibility (see set_default_logger_severity)."""
    if not isinstance(verbosity, int) or verbosity < 0:
        raise _core.InvalidArgumentError(f"logger verbosity must be an integer >= 0, got {verbosity!r}")


def enable_telemetry_events() -> None:
    """Accepted for compatibility: xpuruntime sends no telemetry."""


def disable_telemetry_events() -> None:
    """Accepted for compatibility: xpuruntime sends no telemetry."""


def set_seed(seed: int) -> None:
    """Seeds numpy's global generator (xpuruntime's random ops take their seed from the model)."""
    np.random.seed(int(seed))


# ---------------------------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------------------------


class _ConfigEntries:
    """String key/value entries kept by SessionOptions and RunOptions (ONNX Runtime's config entries)."""

    _what = ""

    def __init__(self) -> None:
        self._config: Dict[str, str] = {}

    def _set_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def _entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"{self._what} does not have configuration with key: {key}")
        return self._config[key]


@ort_errors_class
class SessionOptions(_ConfigEntries):
    """ONNX Runtime's SessionOptions. Mapped: ``graph_optimization_level`` (-> native passes),
    ``intra_op_num_threads`` (-> ``ExecutionPolicy.intra_op_threads``), ``optimized_model_filepath``,
    ``enable_profiling`` / ``profile_file_prefix``, ``use_deterministic_compute`` (-> ``deterministic``),
    ``add_free_dimension_override_by_name`` / ``_by_denotation``. Kept without effect and reported by
    ``explain()``: ``inter_op_num_threads``, ``execution_mode``, ``enable_mem_pattern``, ``enable_mem_reuse``,
    ``enable_cpu_mem_arena``, logging fields. Config entries go to ONNX Runtime on the onnxruntime engine (kept and
    reported on the others). ``add_initializer`` / ``add_external_initializers`` /
    ``add_external_initializers_from_files_in_memory`` replace the model's initializers before the session is
    built (Note [Initializers from the caller]). Refused: custom op libraries."""

    _what = "SessionOptions"

    def __init__(self) -> None:
        super().__init__()
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.optimized_model_filepath = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_cpu_mem_arena = True
        self.use_deterministic_compute = False
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self._free_dims_by_name: Dict[str, int] = {}
        self._free_dims_by_denotation: Dict[str, int] = {}
        self._initializers: Dict[str, np.ndarray] = {}
        self._external_files: Dict[str, bytes] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._set_entry(key, value)

    def get_session_config_entry(self, key: str) -> str:
        return self._entry(key)

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fixes the symbolic dimension ``dim_name`` of every input to ``dim_value`` (the model's shapes change)."""
        _check_dim(dim_value)
        self._free_dims_by_name[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        _check_dim(dim_value)
        self._free_dims_by_denotation[str(dim_denotation)] = int(dim_value)

    def register_custom_ops_library(self, library_path: str) -> None:
        raise _core.UnsupportedOperationError(
            "register_custom_ops_library: xpuruntime does not load ONNX Runtime custom-op libraries; run such a "
            "model with onnxruntime itself, or add the op as an xpuruntime kernel (docs/ops.md)")

    def add_initializer(self, name: str, value: Any) -> None:
        """Replaces the model's initializer ``name`` with ``value`` (an OrtValue on the CPU or an array) in every
        session made with these options; the value is copied when the session is created."""
        self._initializers[str(name)] = _host_array(value, f"add_initializer('{name}')")

    def add_external_initializers(self, names: Sequence[str], values: Sequence[Any]) -> None:
        """Provides the initializers ``names`` whose data the model keeps in external files (the files need not
        exist)."""
        if len(names) != len(values):
            raise InvalidArgument(f"add_external_initializers: {len(names)} names for {len(values)} values")
        for name, value in zip(names, values):
            self.add_initializer(name, value)

    def add_external_initializers_from_files_in_memory(self, file_names: Sequence[str], buffers: Sequence[Any],
                                                       lengths: Sequence[int]) -> None:
        """Provides the contents of the external-data files ``file_names`` (as the model names them) from memory."""
        if not len(file_names) == len(buffers) == len(lengths):
            raise InvalidArgument(f"add_external_initializers_from_files_in_memory: {len(file_names)} names, "
                                  f"{len(buffers)} buffers, {len(lengths)} lengths: give one of each per file")
        for name, buffer, length in zip(file_names, buffers, lengths):
            data = bytes(memoryview(buffer).cast("B"))
            if int(length) > len(data) or int(length) < 0:
                raise InvalidArgument(f"external file '{name}': length {length} is outside its {len(data)}-byte "
                                      "buffer")
            self._external_files[os.path.normpath(str(name))] = data[:int(length)]


def _host_array(value: Any, what: str) -> np.ndarray:
    """An OrtValue, xpuruntime Tensor or array-like as a numpy array on the host (copied)."""
    if isinstance(value, OrtValue):
        return np.array(value.numpy())
    if isinstance(value, _core.Tensor):
        return np.array((value if value.device.type == "cpu" else value.to("cpu")).numpy())
    if isinstance(value, (np.ndarray, list, tuple, int, float, bool, np.generic)):
        return np.array(value)
    raise _core.InvalidTypeError(f"{what}: expected an OrtValue or a numpy array, got {type(value).__name__}")


def _check_dim(value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or value < 0:
        raise _core.InvalidArgumentError(f"a free dimension override must be an integer >= 0, got {value!r}")


@ort_errors_class
class RunOptions(_ConfigEntries):
    """ONNX Runtime's RunOptions: ``logid`` (names the run in its errors), ``log_severity_level`` /
    ``log_verbosity_level`` (kept), ``terminate`` (set from any thread: the run in flight stops at its next check, a
    later run before it starts, with :class:`xpuruntime.RunTerminatedError`; both engines),
    ``only_execute_path_to_fetches`` (accepted: the native engine computes what the graph's outputs need), run config
    entries (kept). xpuruntime adds ``timeout`` (seconds; None: no limit), which stops the run with
    :class:`xpuruntime.RunTimeoutError`."""

    _what = "RunOptions"

    def __init__(self) -> None:
        super().__init__()
        self._options = _core.RunOptions()
        self._adapters: List[Any] = []
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.only_execute_path_to_fetches = False

    @property
    def terminate(self) -> bool:
        return self._options.terminate

    @terminate.setter
    def terminate(self, value: bool) -> None:
        self._options.terminate = bool(value)

    @property
    def logid(self) -> str:
        return self._options.tag

    @logid.setter
    def logid(self, value: str) -> None:
        self._options.tag = str(value)

    @property
    def timeout(self) -> Optional[float]:
        return self._options.timeout

    @timeout.setter
    def timeout(self, seconds: Optional[float]) -> None:
        self._options.timeout = seconds

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._set_entry(key, value)

    def get_run_config_entry(self, key: str) -> str:
        return self._entry(key)

    def _without_adapters(self) -> "RunOptions":
        options = copy.copy(self)
        options._adapters = []
        return options

    def add_active_adapter(self, adapter: "LoraAdapter") -> None:
        """Feeds ``adapter``'s parameters to the runs given these options (Note [LoRA adapters as feeds])."""
        if not isinstance(adapter, LoraAdapter):
            raise _core.InvalidTypeError(f"add_active_adapter takes a LoraAdapter, got {type(adapter).__name__}")
        self._adapters.append(adapter)


# ---------------------------------------------------------------------------------------------------------------
# Values and metadata
# ---------------------------------------------------------------------------------------------------------------


def _core_run_options(run_options: Optional[RunOptions]) -> Optional[_core.RunOptions]:
    """The xpuruntime RunOptions behind ONNX Runtime's (an xpuruntime.RunOptions is taken as well)."""
    if run_options is None or isinstance(run_options, _core.RunOptions):
        return run_options
    if not isinstance(run_options, RunOptions):
        raise _core.InvalidTypeError(f"run_options must be a RunOptions, got {type(run_options).__name__}")
    return run_options._options


def _device_string(device_type: str, device_id: int) -> str:
    kind = str(device_type).lower()
    if kind in ("cuda", "gpu"):
        return f"cuda:{int(device_id)}"
    if kind == "cpu":
        return "cpu"
    raise _core.InvalidArgumentError(f"OrtValue device_type must be 'cpu' or 'cuda', got {device_type!r}")


# ONNX's TensorProto element types (what ONNX Runtime's OrtValue.element_type() returns).
_ONNX_ELEMENT_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
                       "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "bfloat16": 16}
_DTYPE_OF_ELEMENT_TYPE = {v: k for k, v in _ONNX_ELEMENT_TYPES.items()}


@ort_errors_class
class OrtValue:
    """A value on a device (ONNX Runtime's OrtValue): an xpuruntime Tensor, or a sparse tensor on the host
    (``ort_value_from_sparse_tensor``). There is no separate C-level object: ``_ortvalue`` and
    ``_get_c_value()`` are the value itself (``capi._pybind_state.OrtValue`` is this class)."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    @property
    def _ortvalue(self) -> "OrtValue":
        return self

    def _get_c_value(self) -> "OrtValue":
        return self

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data: np.ndarray, onnx_element_type: int) -> "OrtValue":
        """An OrtValue on the CPU holding ``data``'s bytes as the ONNX element type ``onnx_element_type``
        (1 float, 7 int64, 16 bfloat16, ...; ``data``'s item size must match)."""
        dtype = _DTYPE_OF_ELEMENT_TYPE.get(int(onnx_element_type))
        if dtype is None:
            raise OrtNotImplemented(f"ortvalue_from_numpy_with_onnx_type: ONNX element type {onnx_element_type} is not "
                                 f"one xpuruntime tensors hold ({sorted(_DTYPE_OF_ELEMENT_TYPE)})")
        array = np.ascontiguousarray(data)
        from ..runtime.tensor import from_numpy
        if dtype == "bfloat16":
            if array.dtype.itemsize != 2:
                raise InvalidArgument(f"bfloat16 needs 2-byte elements, got {array.dtype}")
            return OrtValue(from_numpy(array.view(np.uint16)).view("bfloat16"))
        if array.dtype.itemsize != np.dtype(dtype).itemsize:
            raise InvalidArgument(f"ortvalue_from_numpy_with_onnx_type: {array.dtype} elements are "
                                  f"{array.dtype.itemsize} bytes, ONNX type {onnx_element_type} ({dtype}) needs "
                                  f"{np.dtype(dtype).itemsize}")
        return OrtValue(from_numpy(array.view(np.dtype(dtype))))

    @staticmethod
    def ort_value_from_sparse_tensor(sparse_tensor: SparseTensor) -> "OrtValue":
        if not isinstance(sparse_tensor, SparseTensor):
            raise _core.InvalidTypeError(f"expected a SparseTensor, got {type(sparse_tensor).__name__}")
        return OrtValue(sparse_tensor)

    def as_sparse_tensor(self) -> SparseTensor:
        if not isinstance(self._tensor, SparseTensor):
            raise InvalidArgument("as_sparse_tensor: this OrtValue holds a dense tensor")
        return self._tensor

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        from ..runtime.tensor import from_numpy
        array = np.ascontiguousarray(numpy_obj)
        t = from_numpy(array)
        device = _device_string(device_type, device_id)
        return OrtValue(t if device == "cpu" else t.to(device))

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any, device_type: str = "cpu",
                                     device_id: int = 0) -> "OrtValue":
        from ..runtime.tensor import empty
        dtype = np.dtype(element_type).name if not isinstance(element_type, str) else element_type
        return OrtValue(empty(list(shape), dtype=dtype, device=_device_string(device_type, device_id)))

    @staticmethod
    def from_dlpack(data: Any, is_bool_tensor: bool = False) -> "OrtValue":
        """Zero-copy from a DLPack capsule or any object with ``__dlpack__`` (an OrtValue included). Booleans
        keep their type (DLPack's bool code); ``is_bool_tensor=True`` reads a uint8 tensor as bool."""
        from ..runtime.tensor import from_dlpack
        t = from_dlpack(data._tensor if isinstance(data, OrtValue) else data)
        if is_bool_tensor and t.dtype == "uint8":
            t = t.view("bool")
        return OrtValue(t)

    def numpy(self) -> np.ndarray:
        t = self._dense("numpy")
        return (t if t.device.type == "cpu" else t.to("cpu")).numpy()

    def shape(self) -> List[int]:
        if isinstance(self._tensor, SparseTensor):
            return self._tensor.dense_shape()
        return list(self._tensor.shape)

    def data_type(self) -> str:
        if isinstance(self._tensor, SparseTensor):
            return self._tensor.data_type()
        return f"tensor({_ONNX_TYPES.get(self._tensor.dtype, self._tensor.dtype)})"

    def element_type(self) -> int:
        """The ONNX element type (TensorProto: 1 float, 7 int64, ...), as ONNX Runtime returns it."""
        return _ONNX_ELEMENT_TYPES[self._dense("element_type").dtype]

    def tensor_size_in_bytes(self) -> int:
        return int(self._dense("tensor_size_in_bytes").nbytes)

    def device_name(self) -> str:
        if isinstance(self._tensor, SparseTensor):
            return "cpu"
        return "cuda" if self._tensor.device.type == "cuda" else "cpu"

    def is_tensor(self) -> bool:
        return not isinstance(self._tensor, SparseTensor)

    def has_value(self) -> bool:
        return True

    def is_sparse_tensor(self) -> bool:
        return isinstance(self._tensor, SparseTensor)

    def _dense(self, what: str) -> _core.Tensor:
        if isinstance(self._tensor, SparseTensor):
            raise InvalidArgument(f"{what}: this OrtValue holds a sparse tensor (as_sparse_tensor())")
        return self._tensor

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        """numpy's array protocol: the CPU tensor's memory without a copy (same dtype), else a converted copy."""
        array = self.numpy()
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return np.array(array, copy=True) if copy else array

    def is_tensor_sequence(self) -> bool:
        return False

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copies ``np_arr`` (same shape and dtype) into this value, on its device."""
        array = np.ascontiguousarray(np_arr)
        if list(array.shape) != self.shape() or array.dtype.name != self._tensor.dtype:
            raise _core.InvalidArgumentError(f"update_inplace: got {array.dtype.name}{list(array.shape)}, the value is "
                                             f"{self._tensor.dtype}{self.shape()}")
        from ..runtime.tensor import from_numpy
        self._tensor.copy_(from_numpy(array))

    def data_ptr(self) -> int:
        ptr = self._tensor.data_ptr
        return int(ptr() if callable(ptr) else ptr)

    def to_dlpack(self) -> Any:
        return self._tensor.__dlpack__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tensor.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._tensor.__dlpack_device__()

    def tensor(self) -> _core.Tensor:
        """The xpuruntime Tensor (an xpuruntime extension)."""
        return self._tensor

    def __repr__(self) -> str:
        return f"<OrtValue {self.data_type()} {self.shape()} on {self.device_name()}>"


class NodeArg:
    """An input or output as ONNX Runtime describes it: ``name``, ``shape`` (ints, dim names, None) and ``type``
    in ONNX's spelling (``"tensor(float)"``)."""

    def __init__(self, info: Any) -> None:
        self.name = info.name
        self.shape = list(info.shape) if info.shape is not None else None
        onnx = _ONNX_TYPES.get(info.dtype, info.dtype)
        self.type = info.type.replace(f"tensor({info.dtype})", f"tensor({onnx})")

    @classmethod
    def from_value_info(cls, value_info: Any) -> "NodeArg":
        """A NodeArg of an ONNX ValueInfoProto (a tensor's; used for the overridable initializers)."""
        from onnx import helper
        arg = cls.__new__(cls)
        arg.name = value_info.name
        tensor = value_info.type.tensor_type
        if not tensor.elem_type:
            dtype = "undefined"
        elif hasattr(helper, "tensor_dtype_to_np_dtype"):  # onnx >= 1.13
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
        else:
            from onnx import mapping
            dtype = np.dtype(mapping.TENSOR_TYPE_TO_NP_TYPE[tensor.elem_type]).name
        arg.type = f"tensor({_ONNX_TYPES.get(dtype, dtype)})"
        arg.shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        return arg

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class ModelMetadata:
    """``producer_name``, ``graph_name``, ``domain``, ``description``, ``graph_description``, ``version``,
    ``custom_metadata_map`` of the model."""

    def __init__(self, producer_name: str = "", graph_name: str = "", domain: str = "", description: str = "",
                 graph_description: str = "", version: int = 0,
                 custom_metadata_map: Optional[Dict[str, str]] = None) -> None:
        self.producer_name = producer_name
        self.graph_name = graph_name
        self.domain = domain
        self.description = description
        self.graph_description = graph_description
        self.version = version
        self.custom_metadata_map = dict(custom_metadata_map or {})


@ort_errors_class
class OrtIOBinding(IOBinding):
    """ONNX Runtime's IOBinding: OrtValues in and out (``bind_ortvalue_input``/``_output``, ``get_outputs`` gives
    OrtValues), ``bind_input(name, value)``, ``bind_cpu_input``, ``bind_output(name, device_type, device_id)``.
    ONNX Runtime's raw-pointer form (``bind_input(name, device_type, device_id, element_type, shape, buffer_ptr)``)
    is refused: xpuruntime binds tensors it can keep alive (an OrtValue, a DLPack tensor, a numpy array)."""

    def bind_input(self, name: str, device_type: Any = None, device_id: int = 0, element_type: Any = None,
                   shape: Any = None, buffer_ptr: Any = None) -> None:
        if buffer_ptr is not None or shape is not None or element_type is not None:
            raise _core.UnsupportedOperationError(
                "IOBinding.bind_input with a raw buffer pointer is not supported: bind the OrtValue "
                "(bind_ortvalue_input(name, ortvalue)) or a DLPack tensor (bind_input(name, tensor))")
        value = device_type.tensor() if isinstance(device_type, OrtValue) else device_type
        super().bind_input(name, value)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        super().bind_input(name, ortvalue.tensor())

    def bind_output(self, name: str, device_type: Any = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Any = None, buffer_ptr: Any = None) -> None:
        if buffer_ptr is not None:
            raise _core.UnsupportedOperationError(
                "IOBinding.bind_output with a raw buffer pointer is not supported: bind an OrtValue "
                "(bind_ortvalue_output(name, ortvalue)) or a device ('cpu', 'cuda')")
        if isinstance(device_type, OrtValue):
            device_type = device_type.tensor()
        super().bind_output(name, device_type, device_id)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        super().bind_output(name, ortvalue.tensor())

    def get_outputs(self) -> List[OrtValue]:  # type: ignore[override]
        return [OrtValue(t) for t in super().get_outputs()]

    def get_outputs_as_ortvaluevector(self) -> List[OrtValue]:
        return self.get_outputs()


# ---------------------------------------------------------------------------------------------------------------
# Providers -> device, engine, policies
# ---------------------------------------------------------------------------------------------------------------


def _normalize_providers(providers: Optional[Sequence[Any]],
                         provider_options: Optional[Sequence[Mapping[str, Any]]]) -> List[Tuple[str, Dict[str, str]]]:
    if providers is None:
        return []
    if isinstance(providers, str):
        raise _core.InvalidTypeError("providers must be a list of provider names (or (name, options) tuples), "
                                     f"got the string {providers!r}")
    if provider_options is not None and len(provider_options) != len(providers):
        raise _core.InvalidArgumentError(f"provider_options has {len(provider_options)} entries for "
                                         f"{len(providers)} providers: give one dict per provider")
    out = []
    for i, p in enumerate(providers):
        if isinstance(p, (tuple, list)):
            if len(p) != 2 or not isinstance(p[0], str) or not isinstance(p[1], Mapping):
                raise _core.InvalidTypeError(f"provider {p!r}: expected a name or a (name, options dict) tuple")
            name, options = p[0], dict(p[1])
        elif isinstance(p, str):
            name, options = p, {}
        else:
            raise _core.InvalidTypeError(f"provider {p!r}: expected a name or a (name, options dict) tuple")
        if provider_options is not None:
            options.update(provider_options[i])
        known = name in _ALL_PROVIDERS or name in _ENGINE_PROVIDERS or name in _XRT_ENGINES
        if not known:
            raise InvalidArgument(f"Unknown Provider Type: {name}; known providers: "
                                  f"{', '.join(_ALL_PROVIDERS + list(_XRT_ENGINES))}")
        out.append((name, {str(k): str(v) for k, v in options.items()}))
    return out


class _Mapping:
    """What a provider list and SessionOptions become: the arguments of xpuruntime's InferenceSession, and the
    notes explain() adds."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.engine = "auto"
        self.exec_policy = ExecutionPolicy()
        self.kernel_policy: Optional[KernelPolicy] = None
        self.disabled_passes: List[str] = []
        self.optimized_model_path = ""
        self.providers: List[str] = []
        self.provider_options: Dict[str, Dict[str, str]] = {}
        self.notes: List[str] = []


def _map_providers(m: _Mapping, providers: List[Tuple[str, Dict[str, str]]], fallback_enabled: bool) -> None:
    if not providers:
        providers = [(CPU, {})]
        m.notes.append("providers: none given -> CPUExecutionProvider (ONNX Runtime's default)")
    names = [n for n, _ in providers]
    for name, options in providers:
        if name in _XRT_ENGINES:
            m.engine = name
            m.notes.append(f"provider '{name}': xpuruntime's {name} engine")
        elif name in _ENGINE_PROVIDERS:
            m.engine = _ENGINE_PROVIDERS[name]
            m.providers.append(name)
            m.provider_options[name] = options
            m.notes.append(f"provider {name}: xpuruntime's {m.engine} engine")
            return
    device_providers = [(n, o) for n, o in providers if n in (CUDA, CPU)]
    if not device_providers:
        m.device = "cpu"
        m.providers, m.provider_options[CPU] = [CPU], {}
        return
    name, options = device_providers[0]
    if name == CUDA:
        options = _cuda_provider_options(options)
        device_id = int(options["device_id"])
        if 0 < _core.get_device_count() <= device_id:
            raise InvalidArgument(f"CUDAExecutionProvider device_id {device_id}: this machine has "
                                  f"{_core.get_device_count()} CUDA device(s) (ids 0..{_core.get_device_count() - 1})")
        if _core.get_device_count() == 0:
            warnings.warn(f"CUDAExecutionProvider (device_id {device_id}) is not available here "
                          f"({_core.get_device_count()} CUDA device(s)); falling back to CPUExecutionProvider",
                          RuntimeWarning, stacklevel=4)
            m.notes.append(f"provider CUDAExecutionProvider: no CUDA device {device_id} here -> "
                           "CPUExecutionProvider (ONNX Runtime's fallback)")
            m.device = "cpu"
            m.providers, m.provider_options[CPU] = [CPU], {}
            return
        m.device = f"cuda:{device_id}"
        m.providers = [CUDA, CPU]
        m.provider_options[CUDA] = options
        m.provider_options[CPU] = {}
        _map_cuda_options(m, {k: v for k, v in options.items() if v != _CUDA_DEFAULTS.get(k)})
        if CPU in names and fallback_enabled:
            m.exec_policy.fallback = "cpu"
            m.notes.append("providers CUDAExecutionProvider, CPUExecutionProvider: device cuda:"
                           f"{device_id}; nodes without a CUDA kernel run on the CPU (ExecutionPolicy "
                           "fallback='cpu'), as ONNX Runtime assigns them to its CPU provider")
        else:
            m.notes.append(f"provider CUDAExecutionProvider: device cuda:{device_id}"
                           + ("" if CPU in names else "; no CPU provider listed, so no node falls back to the CPU")
                           + ("; fallback disabled (disable_fallback())" if not fallback_enabled else ""))
    else:
        m.device = "cpu"
        m.providers, m.provider_options[CPU] = [CPU], options
        m.notes.append("provider CPUExecutionProvider: device cpu")


# ONNX Runtime's CUDA provider options, with the values that say what xpuruntime does when they are not given
# (get_provider_options() lists them all, as ONNX Runtime does): no memory limit, CUDA graphs on, the cuDNN
# heuristic, fp32 (no TF32), xpuruntime's own streams and allocator.
_CUDA_DEFAULTS = {
    "device_id": "0", "gpu_mem_limit": str(2**64 - 1), "arena_extend_strategy": "kNextPowerOfTwo",
    "cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": "1", "enable_cuda_graph": "1",
    "use_tf32": "0", "has_user_compute_stream": "0", "user_compute_stream": "0", "gpu_external_alloc": "0",
    "gpu_external_free": "0", "gpu_external_empty_cache": "0", "cudnn_conv_use_max_workspace": "1",
    "cudnn_conv1d_pad_to_nc1d": "0", "tunable_op_enable": "0", "tunable_op_tuning_enable": "0",
    "tunable_op_max_tuning_duration_ms": "0", "enable_skip_layer_norm_strict_mode": "0", "prefer_nhwc": "0",
    "use_ep_level_unified_stream": "0", "sdpa_kernel": "0", "fuse_conv_bias": "0"}
_CUDA_CHOICES = {"arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested"),
                 "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")}
_CUDA_UNSIGNED = ("device_id", "gpu_mem_limit")


def _cuda_provider_options(given: Dict[str, str]) -> Dict[str, str]:
    """Every CUDA provider option: ``given`` checked (unknown names, choices, non-negative integers are
    ``InvalidArgument``, as ONNX Runtime refuses them) over :data:`_CUDA_DEFAULTS`."""
    unknown = sorted(set(given) - set(_CUDA_DEFAULTS))
    if unknown:
        raise InvalidArgument(f"CUDAExecutionProvider: unknown provider option(s) {unknown}; known: "
                              f"{', '.join(sorted(_CUDA_DEFAULTS))}")
    for key, value in given.items():
        if key in _CUDA_CHOICES and value not in _CUDA_CHOICES[key]:
            raise InvalidArgument(f"CUDAExecutionProvider option {key}={value!r}: expected one of "
                                  f"{', '.join(_CUDA_CHOICES[key])}")
        if key in _CUDA_UNSIGNED and not value.isdigit():
            raise InvalidArgument(f"CUDAExecutionProvider option {key}={value!r}: expected an integer >= 0")
    options = dict(_CUDA_DEFAULTS, **given)
    if "user_compute_stream" in given:
        options["has_user_compute_stream"] = "0" if given["user_compute_stream"] == "0" else "1"
    return options


def _map_cuda_options(m: _Mapping, options: Dict[str, str]) -> None:
    for key, value in options.items():
        if key == "device_id":
            continue
        if key == "gpu_mem_limit":
            m.exec_policy.memory_limit = int(value)
            m.notes.append(f"CUDA option gpu_mem_limit={value} -> ExecutionPolicy.memory_limit")
        elif key == "enable_cuda_graph":
            m.exec_policy.cuda_graphs = value.lower() in ("1", "true")
            m.notes.append(f"CUDA option enable_cuda_graph={value} -> ExecutionPolicy.cuda_graphs="
                           f"{m.exec_policy.cuda_graphs} (xpuruntime's default is on)")
        elif key == "cudnn_conv_algo_search":
            if value.upper() == "EXHAUSTIVE":
                m.kernel_policy = KernelPolicy(conv="auto:BestPerformance")
                m.notes.append("CUDA option cudnn_conv_algo_search=EXHAUSTIVE -> KernelPolicy(conv='auto:"
                               "BestPerformance') (convolution algorithms timed on the model's shapes)")
            else:
                m.notes.append(f"CUDA option cudnn_conv_algo_search={value}: xpuruntime's default heuristic")
        elif key == "use_tf32":
            if value.lower() in ("1", "true"):
                m.exec_policy.precision = "tf32"
            m.notes.append(f"CUDA option use_tf32={value} -> ExecutionPolicy.precision={m.exec_policy.precision}")
        else:
            m.notes.append(f"CUDA option {key}={value}: kept, no effect in xpuruntime")


def _map_session_options(m: _Mapping, so: SessionOptions) -> None:
    level = GraphOptimizationLevel(int(so.graph_optimization_level))
    if level == GraphOptimizationLevel.ORT_DISABLE_ALL:
        m.disabled_passes = sorted(_BASIC_PASSES | _EXTENDED_PASSES | _LAYOUT_PASSES)
    elif level == GraphOptimizationLevel.ORT_ENABLE_BASIC:
        m.disabled_passes = sorted(_EXTENDED_PASSES | _LAYOUT_PASSES)
    elif level == GraphOptimizationLevel.ORT_ENABLE_EXTENDED:
        m.disabled_passes = sorted(_LAYOUT_PASSES)
    if level != GraphOptimizationLevel.ORT_ENABLE_ALL:
        m.notes.append(f"graph_optimization_level {level.name} -> native passes off: {', '.join(m.disabled_passes)}")
    if so.intra_op_num_threads:
        m.exec_policy.intra_op_threads = int(so.intra_op_num_threads)
        m.notes.append(f"intra_op_num_threads={so.intra_op_num_threads} -> ExecutionPolicy.intra_op_threads")
    if so.use_deterministic_compute:
        m.exec_policy.deterministic = True
        m.notes.append("use_deterministic_compute -> ExecutionPolicy.deterministic=True")
    if so.optimized_model_filepath:
        m.optimized_model_path = str(so.optimized_model_filepath)
        m.notes.append(f"optimized_model_filepath -> {m.optimized_model_path} (onnxruntime engine: ONNX Runtime's "
                       "optimized model, written when the session is created; native engine: its plan's graph, "
                       "written by the first run)")
    if so.inter_op_num_threads:
        m.notes.append(f"inter_op_num_threads={so.inter_op_num_threads}: ignored (nodes run in plan order)")
    if int(so.execution_mode) != ExecutionMode.ORT_SEQUENTIAL:
        m.notes.append("execution_mode ORT_PARALLEL: ignored (nodes run in plan order on one stream)")
    for field, default in (("enable_mem_pattern", True), ("enable_mem_reuse", True), ("enable_cpu_mem_arena", True)):
        if bool(getattr(so, field)) != default:
            m.notes.append(f"{field}={getattr(so, field)}: ignored (the native engine plans memory at build time)")
    for name, value in sorted(so._free_dims_by_name.items()):
        m.notes.append(f"free dimension '{name}' fixed to {value}")
    for name, value in sorted(so._free_dims_by_denotation.items()):
        m.notes.append(f"free dimensions denoted '{name}' fixed to {value}")


# ---------------------------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------------------------

# Session config entries xpuruntime itself sets on the onnxruntime engine (the caller's are not passed twice).
_ENGINE_OWNED_CONFIG = {"session.model_external_initializers_file_folder_path", "session.disable_cpu_ep_fallback"}
# How the onnxruntime engine refuses a model with a sequence, map or optional input or output (ort_engine.cpp).
_NOT_A_TENSOR = "is not a tensor (a sequence, map or optional)"


class InferenceSession(_XrtSession):
    """ONNX Runtime's InferenceSession on xpuruntime.

    >>> import xpuruntime.onnxruntime as ort
    >>> so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    >>> sess = ort.InferenceSession("model.onnx", so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    >>> y = sess.run(None, {"x": x})[0]
    >>> sess.get_providers(); sess.get_modelmeta().producer_name; print(sess.explain())

    xpuruntime's own keywords (``kernel_policy``, ``exec_policy``, ``device``, ``engine``) are accepted too; they
    override what the providers and options map to. Errors are ONNX Runtime's classes, which are xpuruntime's
    typed errors as well (Note [Two names for one error] in _errors.py).
    """

    @ort_errors
    def __init__(self, path_or_bytes: Union[str, bytes, os.PathLike], sess_options: Optional[SessionOptions] = None,
                 providers: Optional[Sequence[Any]] = None,
                 provider_options: Optional[Sequence[Mapping[str, Any]]] = None, **kwargs: Any) -> None:
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise _core.InvalidTypeError(f"sess_options must be a SessionOptions, got {type(sess_options).__name__}")
        self._model_arg = path_or_bytes
        self._sess_options = sess_options or SessionOptions()
        self._fallback_enabled = kwargs.pop("_fallback_enabled", True)
        self._extra = dict(kwargs)
        unknown = set(kwargs) - {"kernel_policy", "exec_policy", "device", "engine", "fp16"}
        if unknown:
            raise TypeError(f"InferenceSession() got unexpected keyword arguments {sorted(unknown)}")
        self._sess = _SessionCore(self)
        self._providers_arg = _normalize_providers(providers, provider_options)
        self._create(self._providers_arg)

    def _model_source(self) -> Union[str, bytes]:
        model = self._model_arg
        if isinstance(model, (bytearray, memoryview)):
            model = bytes(model)
        if isinstance(model, os.PathLike):
            model = os.fspath(model)
        if not isinstance(model, (str, bytes)):
            raise _core.InvalidTypeError(f"path_or_bytes must be a path or bytes, got {type(model).__name__}")
        return model

    def _create(self, providers: List[Tuple[str, Dict[str, str]]]) -> None:
        from . import _model
        so = self._sess_options
        model = self._model_source()
        if isinstance(model, str) and not os.path.isfile(model):
            raise NoSuchFile(f"Load model from {model} failed: File doesn't exist")
        self._meta_source = model
        config_notes, config_folder = [], None
        if os.environ.get("ORT_LOAD_CONFIG_FROM_MODEL") == "1":
            proto = _model.load_proto(model)
            config_notes = _model.apply_config_from_model(proto, so)
            if config_notes:  # applied here: the engine gets the model without it (Note [Options from the model])
                config_folder = os.path.dirname(os.path.abspath(model)) if isinstance(model, str) else None
                model = _model.without_ort_config(proto)
        m = _Mapping()
        m.notes.extend(config_notes)
        _map_providers(m, providers, self._fallback_enabled)
        _map_session_options(m, so)
        if "exec_policy" in self._extra and self._extra["exec_policy"] is not None:
            m.exec_policy = self._extra["exec_policy"]
        model, model_folder = _model.prepare_model(model, so)
        model_folder = model_folder or config_folder
        self._start_profiler(m)
        folder = so._config.get("session.model_external_initializers_file_folder_path") or model_folder
        if so._config.get("session.model_external_initializers_file_folder_path"):
            m.notes.append(f"session config entry session.model_external_initializers_file_folder_path -> "
                           f"external_data_dir={folder}")
        engine = self._extra.get("engine", m.engine)
        config = [(k, v) for k, v in sorted(so._config.items()) if k not in _ENGINE_OWNED_CONFIG]
        try:
            self._build(model, m, engine, folder, config)
        except _core.UnsupportedOperationError as error:
            if engine != "auto" or m.device != "cpu" or _NOT_A_TENSOR not in str(error):
                raise
            # Note [Sequences through the compatibility layer] (_model.py)
            m.notes.append("inputs or outputs that are sequences, maps or optionals -> the native engine (the "
                           "onnxruntime engine exchanges tensors only)")
            self._build(model, m, "native", folder, config)
        where = "ONNX Runtime's session config" if self.engine == "onnxruntime" else "kept, no effect"
        m.notes.extend(f"session config entry {k}={v}: {where}" for k, v in config)
        if self.engine != "native" and m.disabled_passes:
            m.notes.append(f"graph_optimization_level applies to the native engine's passes; this session runs "
                           f"{self.engine}")
        self._mapping = m
        logid = so.logid or "InferenceSession"
        for note in m.notes:
            _log(1, logid, note)
        _log(0, logid, f"session created: engine {self.engine}, device {self._device}, providers "
                       f"{m.providers}")

    def _build(self, model: Union[str, bytes], m: "_Mapping", engine: str, folder: Optional[str],
               config: List[Tuple[str, str]]) -> None:
        native_only = engine == "native" or (engine == "auto" and m.device != "cpu")
        declared_only = engine in ("tensorrt", "openvino", "qnn")
        super().__init__(model, device=self._extra.get("device", m.device), engine=engine,
                         kernel_policy=self._extra.get("kernel_policy", m.kernel_policy), exec_policy=m.exec_policy,
                         fp16=self._extra.get("fp16", False),
                         disabled_passes=m.disabled_passes if native_only else None,
                         optimized_model_path=None if declared_only else (m.optimized_model_path or None),
                         external_data_dir=folder or None, session_config=config)

    def _start_profiler(self, m: "_Mapping") -> None:
        so = self._sess_options
        self._profiler = None
        if so.enable_profiling:
            from ..runtime.profiler import Profiler
            self._profiler = Profiler().start()
            self._profile_start_ns = time.time_ns()
            m.notes.append(f"enable_profiling -> xpuruntime's profiler; end_profiling() writes "
                           f"{so.profile_file_prefix}<time>.json (Chrome trace)")

    # -- ONNX Runtime's session API --

    @ort_errors
    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Optional[RunOptions] = None) -> List[Any]:
        """``run(output_names or None, {name: array, list or OrtValue}, run_options)`` -> list of numpy arrays
        (lists of arrays for sequences, None for an empty optional)."""
        adapters = getattr(run_options, "_adapters", [])
        if adapters:
            return self._with_adapters(adapters).run(output_names, input_feed, run_options._without_adapters())
        outputs = _XrtSession.run(self, list(output_names or []), self._feeds(input_feed),
                                  run_options=_core_run_options(run_options))
        return [o.to("cpu").numpy() if isinstance(o, _core.Tensor) and o.dtype != "bfloat16" else o
                for o in outputs]

    def _with_adapters(self, adapters: List[Any]) -> "InferenceSession":
        """The session whose initializers are the adapters' parameters (Note [LoRA adapters as feeds]), built on
        first use and kept for this set of adapters."""
        key = tuple(id(a) for a in adapters)
        cache = self.__dict__.setdefault("_adapter_sessions", {})
        if key not in cache:
            so = copy.copy(self._sess_options)
            so._initializers = dict(so._initializers)
            for adapter in adapters:
                so._initializers.update(adapter.parameters())
            cache[key] = (InferenceSession(self._model_arg, so, providers=self._providers_arg, **self._extra),
                          adapters)  # the adapters are kept alive so that their ids stay theirs
        return cache[key][0]

    def _feeds(self, input_feed: Mapping[str, Any]) -> Dict[str, Any]:
        """The feeds as the core takes them (Note [Feeds as ONNX Runtime takes them])."""
        if not isinstance(input_feed, Mapping):
            raise _core.InvalidTypeError(f"input_feed must be a dict, got {type(input_feed).__name__}")
        inputs = {i.name: i for i in _XrtSession.get_inputs(self)}
        missing = [name for name in inputs if name not in input_feed and not self._optional_input(name)]
        if missing:
            raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed ({list(input_feed)}).")
        feeds = {}
        for name, value in input_feed.items():
            if isinstance(value, OrtValue) and not value.is_sparse_tensor():
                value = value._dense(f"input '{name}'")
            elif isinstance(value, (SparseTensor, OrtValue)):
                raise OrtNotImplemented(f"input '{name}': xpuruntime's engines take dense tensors; densify the "
                                     "SparseTensor first")
            info = inputs.get(name)
            if info is not None and info.kind == "tensor" and isinstance(value, (list, tuple)):
                # ONNX Runtime converts a list fed to a tensor input to the input's element type
                value = np.asarray(value, dtype=info.dtype if info.dtype in _ONNX_ELEMENT_TYPES and
                                   info.dtype != "bfloat16" else None)
            _refuse_strings(name, value)
            feeds[name] = value
        return feeds

    def _optional_input(self, name: str) -> bool:
        return name in self._initializer_inputs()

    def _initializer_inputs(self) -> Dict[str, Any]:
        """Graph inputs that have an initializer (ONNX Runtime's overridable initializers), by name."""
        if not hasattr(self, "_overridable"):
            from ._model import load_proto
            proto = load_proto(self._meta_source)
            names = {t.name for t in proto.graph.initializer}
            self._overridable = {v.name: v for v in proto.graph.input if v.name in names}
        return self._overridable

    @ort_errors
    def run_with_ort_values(self, output_names: Optional[Sequence[str]], input_dict_ort_values: Mapping[str, Any],
                            run_options: Optional[RunOptions] = None) -> List[OrtValue]:
        outputs = _XrtSession.run(self, list(output_names or []), self._feeds(input_dict_ort_values),
                                  run_options=_core_run_options(run_options))
        from ..runtime.tensor import from_numpy
        return OrtValueVector(OrtValue(o if isinstance(o, _core.Tensor) else from_numpy(np.ascontiguousarray(o)))
                              for o in outputs)

    def run_async(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any], callback: Any,
                  user_data: Any, run_options: Optional[RunOptions] = None) -> None:
        """Runs on a thread of its own and calls ``callback(outputs, user_data, error_text)`` from it (``outputs``
        None and the error's text when the run fails, "" otherwise), as ONNX Runtime's run_async does."""
        if not callable(callback):
            raise InvalidArgument(f"run_async: callback must be callable, got {type(callback).__name__}")

        def work() -> None:
            try:
                outputs = self.run(output_names, input_feed, run_options)
            except Exception as error:  # the callback gets the error, as in ONNX Runtime
                callback(None, user_data, str(error))
                return
            callback(outputs, user_data, "")

        threading.Thread(target=work, name="xpuruntime-run-async", daemon=True).start()

    def get_inputs(self) -> List[NodeArg]:  # type: ignore[override]
        return [NodeArg(i) for i in super().get_inputs()]

    def get_outputs(self) -> List[NodeArg]:  # type: ignore[override]
        return [NodeArg(o) for o in super().get_outputs()]

    def get_input_memory_infos(self) -> List[OrtMemoryInfo]:
        """Where each input is expected: the session's device."""
        return [OrtMemoryInfo.for_device(self._device) for _ in super().get_inputs()]

    def get_output_memory_infos(self) -> List[OrtMemoryInfo]:
        """Where each output is produced: the session's device."""
        return [OrtMemoryInfo.for_device(self._device) for _ in super().get_outputs()]

    def get_input_epdevices(self) -> List[None]:
        """One entry per input; None: xpuruntime has no OrtEpDevice objects (plugin EP devices)."""
        return [None for _ in super().get_inputs()]

    def io_binding(self) -> OrtIOBinding:  # type: ignore[override]
        return OrtIOBinding(self)

    @ort_errors
    def run_with_iobinding(self, iobinding: IOBinding, run_options: Optional[RunOptions] = None) -> None:
        super().run_with_iobinding(iobinding, _core_run_options(run_options))

    def get_overridable_initializers(self) -> List[NodeArg]:
        """The graph inputs that have an initializer (a feed of that name replaces it for one run)."""
        return [NodeArg.from_value_info(v) for v in self._initializer_inputs().values()]

    def get_providers(self) -> List[str]:
        return list(self._mapping.providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        return {k: dict(v) for k, v in self._mapping.provider_options.items()}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    @ort_errors
    def set_providers(self, providers: Optional[Sequence[Any]] = None,
                      provider_options: Optional[Sequence[Mapping[str, Any]]] = None) -> None:
        """Re-creates the session with other providers."""
        self._providers_arg = _normalize_providers(providers, provider_options)
        self._create(self._providers_arg)
        self.__dict__.pop("_adapter_sessions", None)

    def disable_fallback(self) -> None:
        """No CPU fallback for nodes without a CUDA kernel (ExecutionPolicy fallback 'error'); takes effect at the
        next ``set_providers``."""
        self._fallback_enabled = False

    def enable_fallback(self) -> None:
        self._fallback_enabled = True

    @ort_errors
    def get_modelmeta(self) -> ModelMetadata:
        from ._model import load_proto
        proto = load_proto(self._meta_source)
        return ModelMetadata(producer_name=proto.producer_name, graph_name=proto.graph.name, domain=proto.domain,
                             description=proto.doc_string, graph_description=proto.graph.doc_string,
                             version=int(proto.model_version),
                             custom_metadata_map={p.key: p.value for p in proto.metadata_props})

    def end_profiling(self) -> str:
        """Stops profiling and writes the Chrome trace; returns its path ("" when profiling was off)."""
        if self._profiler is None:
            return ""
        self._profiler.stop()
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime())
        path = f"{self._sess_options.profile_file_prefix}{stamp}.json"
        self._profiler.export_chrome_trace(path)
        self._profiler = None
        return path

    def get_profiling_start_time_ns(self) -> int:
        return getattr(self, "_profile_start_ns", 0)

    def get_tuning_results(self) -> List[Dict[str, Any]]:
        """ONNX Runtime's TunableOp results: none here; xpuruntime's tuned choices are its autotune cache
        (``xpuruntime.ops.set_autotune_cache``, docs/policies.md)."""
        return []

    def set_tuning_results(self, results: Any, error_on_invalid: bool = False) -> None:
        raise OrtNotImplemented(
            "set_tuning_results: ONNX Runtime's TunableOp results do not apply to xpuruntime's kernels; replay "
            "tuned choices with xpuruntime.ops.set_autotune_cache('policy.lock.json') (docs/policies.md)")

    @ort_errors
    def get_provider_graph_assignment_info(self) -> List["EpAssignedSubgraph"]:
        """Which provider runs each node, one subgraph per node (needs the session config entry
        ``session.record_ep_graph_assignment_info=1``, as in ONNX Runtime). The nodes are those ``explain()``
        reports; before the first run of an onnxruntime-engine session on the CPU, the model's nodes on
        CPUExecutionProvider (the only provider such a session has)."""
        if self._sess_options._config.get("session.record_ep_graph_assignment_info") != "1":
            raise Fail("Session configuration entry 'session.record_ep_graph_assignment_info' must be set to \"1\" "
                       "to retrieve EP graph assignment information.")
        nodes = [(n.node, n.op_type, _provider_of(n.backend, n.kernel)) for n in self.explain().nodes]
        if not nodes:
            if self._device != "cpu":
                raise Fail(f"the node assignment of this {self.engine} session on {self._device} is known after "
                           "its first run")
            from ._model import load_proto
            nodes = [(n.name, n.op_type, CPU) for n in load_proto(self._meta_source).graph.node]
        domains = self._node_domains()
        return [EpAssignedSubgraph(provider, [EpAssignedNode(domains.get(name, ""), op_type, name)])
                for name, op_type, provider in nodes]

    def _node_domains(self) -> Dict[str, str]:
        from ._model import load_proto
        return {n.name: n.domain for n in load_proto(self._meta_source).graph.node}

    def explain(self) -> _core.Explanation:
        """xpuruntime's explanation, with how the providers and options were mapped in ``options``."""
        e = super().explain()
        e.options = list(e.options) + [f"onnxruntime API: {n}" for n in self._mapping.notes]
        return e


# Note [Feeds as ONNX Runtime takes them]: an OrtValue feeds its tensor; a list or tuple fed to a tensor input is
# converted with numpy (ONNX Runtime does the same), to a sequence input it is the sequence; a string tensor is
# refused (xpuruntime tensors hold numbers and booleans: docs/engines.md, the parity table).
def _refuse_strings(name: str, value: Any) -> None:
    array = value if isinstance(value, np.ndarray) else None
    if array is not None and (array.dtype.kind in "USOV"):
        raise OrtNotImplemented(f"input '{name}': string tensors are not supported by xpuruntime (its tensors hold "
                             f"numbers and booleans; got a numpy {array.dtype} array); run string models with "
                             "onnxruntime itself")


def _provider_of(backend: str, kernel: str) -> str:
    text = f"{backend} {kernel}".lower()
    return CUDA if ("cuda" in text or "cublas" in text or "cudnn" in text) else CPU


class EpAssignedNode:
    """A node as ``get_provider_graph_assignment_info`` reports it: ``domain``, ``op_type``, ``name``."""

    def __init__(self, domain: str, op_type: str, name: str) -> None:
        self.domain, self.op_type, self.name = domain, op_type, name

    def __repr__(self) -> str:
        return f"EpAssignedNode({self.domain}:{self.op_type}/{self.name})"


class EpAssignedSubgraph:
    """The nodes one provider runs together: ``ep_name`` and ``get_nodes()``."""

    def __init__(self, ep_name: str, nodes: List[EpAssignedNode]) -> None:
        self.ep_name, self._nodes = ep_name, nodes

    def get_nodes(self) -> List[EpAssignedNode]:
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"EpAssignedSubgraph({self.ep_name}, {self._nodes})"


class OrtValueVector(list):
    """The list of OrtValues ``run_with_ort_values`` returns (ONNX Runtime's OrtValueVector)."""


class _SessionCore:
    """``InferenceSession._sess``: ONNX Runtime's C-level session calls, on the same session."""

    def __init__(self, session: InferenceSession) -> None:
        self._session = session

    def run_with_ort_values(self, feeds: Mapping[str, Any], output_names: Sequence[str],
                            run_options: Optional[RunOptions] = None) -> OrtValueVector:
        return self._session.run_with_ort_values(output_names, feeds, run_options)

    def run(self, output_names: Sequence[str], feeds: Mapping[str, Any], run_options: Any = None) -> List[Any]:
        return self._session.run(output_names, feeds, run_options)


class AdapterFormat:
    """An ``.onnx_adapter`` file's contents (Note [LoRA adapters as feeds] in _adapters.py): adapter and model
    versions and named parameters (OrtValues)."""

    def __init__(self) -> None:
        self._adapter_version, self._model_version = 0, 0
        self._params: Dict[str, OrtValue] = {}

    @staticmethod
    def read_adapter(file_path: str) -> "AdapterFormat":
        from ._adapters import read_adapter_file
        adapter = AdapterFormat()
        _, adapter._adapter_version, adapter._model_version, params = read_adapter_file(os.fspath(file_path))
        adapter.set_parameters({k: OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
        return adapter

    def export_adapter(self, file_path: str) -> None:
        from ._adapters import write_adapter_file
        write_adapter_file(os.fspath(file_path), self._adapter_version, self._model_version,
                           {k: v.numpy() for k, v in self._params.items()})

    def get_format_version(self) -> int:
        from ._adapters import FORMAT_VERSION
        return FORMAT_VERSION

    def set_adapter_version(self, version: int) -> None:
        self._adapter_version = int(version)

    def get_adapter_version(self) -> int:
        return self._adapter_version

    def set_model_version(self, version: int) -> None:
        self._model_version = int(version)

    def get_model_version(self) -> int:
        return self._model_version

    def set_parameters(self, params: Mapping[str, OrtValue]) -> None:
        for name, value in params.items():
            if not isinstance(value, OrtValue) or not value.is_tensor():
                raise _core.InvalidTypeError(f"adapter parameter '{name}' must be a dense OrtValue")
        self._params = dict(params)

    def get_parameters(self) -> Dict[str, OrtValue]:
        return dict(self._params)

    def __repr__(self) -> str:
        return (f"AdapterFormat(adapter_version={self._adapter_version}, model_version={self._model_version}, "
                f"parameters={sorted(self._params)})")


class LoraAdapter:
    """A LoRA adapter loaded from an ``.onnx_adapter`` file; ``RunOptions.add_active_adapter(adapter)`` feeds its
    parameters to a run (Note [LoRA adapters as feeds])."""

    def __init__(self) -> None:
        self._params: Dict[str, np.ndarray] = {}

    def Load(self, file_path: str) -> None:  # noqa: N802 - ONNX Runtime's name
        from ._adapters import read_adapter_file
        self._params = read_adapter_file(os.fspath(file_path))[3]

    def parameters(self) -> Dict[str, np.ndarray]:
        return dict(self._params)

    def __repr__(self) -> str:
        return f"LoraAdapter(parameters={sorted(self._params)})"
