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

import enum
import itertools
import os
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from .inference.session import InferenceSession as _XrtSession
from .inference.session import IOBinding
from .policies import ExecutionPolicy, KernelPolicy

__all__ = [
    "InferenceSession", "SessionOptions", "RunOptions", "OrtValue", "IOBinding", "OrtIOBinding", "NodeArg",
    "ModelMetadata",
    "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "get_available_providers", "get_all_providers",
    "get_device", "get_version_string", "set_default_logger_severity", "set_default_logger_verbosity", "set_seed",
    "enable_telemetry_events", "disable_telemetry_events", "__version__",
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
_BASIC_PASSES = {"constant_folding", "shape_folding", "identity_elimination", "dead_node_elimination",
                 "op_decomposition", "conv_bn_folding"}
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
    """The providers this build can serve, in ONNX Runtime's priority order (CUDA first when built with CUDA)."""
    return ([CUDA] if _core.build_info().get("with_cuda") else []) + [CPU]


def get_all_providers() -> List[str]:
    """Every provider name this module understands (the ones it cannot serve raise with what to install)."""
    return list(_ALL_PROVIDERS)


def get_device() -> str:
    """``"GPU"`` when a CUDA device is present, else ``"CPU"`` (ONNX Runtime's build device)."""
    return "GPU" if _core.get_device_count() > 0 else "CPU"


def get_version_string() -> str:
    return __version__


def set_default_logger_severity(severity: int) -> None:
    """Accepted for compatibility: xpuruntime reports through exceptions and ``explain()``, not a log."""
    if not isinstance(severity, int) or not 0 <= severity <= 4:
        raise _core.InvalidArgumentError(f"logger severity must be 0..4, got {severity!r}")


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
            raise _core.InvalidArgumentError(f"{self._what} has no config entry '{key}'")
        return self._config[key]


class SessionOptions(_ConfigEntries):
    """ONNX Runtime's SessionOptions. Mapped: ``graph_optimization_level`` (-> native passes),
    ``intra_op_num_threads`` (-> ``ExecutionPolicy.intra_op_threads``), ``optimized_model_filepath``,
    ``enable_profiling`` / ``profile_file_prefix``, ``use_deterministic_compute`` (-> ``deterministic``),
    ``add_free_dimension_override_by_name`` / ``_by_denotation``. Kept without effect and reported by
    ``explain()``: ``inter_op_num_threads``, ``execution_mode``, ``enable_mem_pattern``, ``enable_mem_reuse``,
    ``enable_cpu_mem_arena``, logging fields, config entries. Refused: custom op libraries, ``add_initializer``."""

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
        raise _core.UnsupportedOperationError(
            "add_initializer: xpuruntime takes initializers from the model (external data files included); "
            "write them into the model instead")

    def add_external_initializers(self, names: Sequence[str], values: Sequence[Any]) -> None:
        self.add_initializer(names[0] if names else "", None)


def _check_dim(value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or value < 0:
        raise _core.InvalidArgumentError(f"a free dimension override must be an integer >= 0, got {value!r}")


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


class OrtValue:
    """A tensor on a device (ONNX Runtime's OrtValue), holding an xpuruntime Tensor."""

    def __init__(self, tensor: _core.Tensor) -> None:
        self._tensor = tensor

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        from .runtime.tensor import from_numpy
        array = np.ascontiguousarray(numpy_obj)
        t = from_numpy(array)
        device = _device_string(device_type, device_id)
        return OrtValue(t if device == "cpu" else t.to(device))

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any, device_type: str = "cpu",
                                     device_id: int = 0) -> "OrtValue":
        from .runtime.tensor import empty
        dtype = np.dtype(element_type).name if not isinstance(element_type, str) else element_type
        return OrtValue(empty(list(shape), dtype=dtype, device=_device_string(device_type, device_id)))

    @staticmethod
    def from_dlpack(data: Any, is_bool_tensor: bool = False) -> "OrtValue":
        from .runtime.tensor import from_dlpack
        return OrtValue(from_dlpack(data))

    def numpy(self) -> np.ndarray:
        t = self._tensor
        return (t if t.device.type == "cpu" else t.to("cpu")).numpy()

    def shape(self) -> List[int]:
        return list(self._tensor.shape)

    def data_type(self) -> str:
        return f"tensor({_ONNX_TYPES.get(self._tensor.dtype, self._tensor.dtype)})"

    def element_type(self) -> type:
        return np.dtype(self._tensor.dtype).type if self._tensor.dtype != "bfloat16" else np.uint16

    def device_name(self) -> str:
        return "cuda" if self._tensor.device.type == "cuda" else "cpu"

    def is_tensor(self) -> bool:
        return True

    def has_value(self) -> bool:
        return True

    def is_sparse_tensor(self) -> bool:
        return False

    def is_tensor_sequence(self) -> bool:
        return False

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copies ``np_arr`` (same shape and dtype) into this value, on its device."""
        array = np.ascontiguousarray(np_arr)
        if list(array.shape) != self.shape() or array.dtype.name != self._tensor.dtype:
            raise _core.InvalidArgumentError(f"update_inplace: got {array.dtype.name}{list(array.shape)}, the value is "
                                             f"{self._tensor.dtype}{self.shape()}")
        from .runtime.tensor import from_numpy
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
            raise _core.InvalidArgumentError(
                f"unknown provider '{name}'; known providers: {', '.join(_ALL_PROVIDERS + list(_XRT_ENGINES))}")
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
        device_id = int(options.get("device_id", "0"))
        if _core.get_device_count() <= device_id:
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
        m.provider_options[CUDA] = dict(options, device_id=str(device_id))
        m.provider_options[CPU] = {}
        _map_cuda_options(m, options)
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
        m.notes.append(f"optimized_model_filepath -> the native engine's optimized model ({m.optimized_model_path})")
    if so.inter_op_num_threads:
        m.notes.append(f"inter_op_num_threads={so.inter_op_num_threads}: ignored (nodes run in plan order)")
    if int(so.execution_mode) != ExecutionMode.ORT_SEQUENTIAL:
        m.notes.append("execution_mode ORT_PARALLEL: ignored (nodes run in plan order on one stream)")
    for field, default in (("enable_mem_pattern", True), ("enable_mem_reuse", True), ("enable_cpu_mem_arena", True)):
        if bool(getattr(so, field)) != default:
            m.notes.append(f"{field}={getattr(so, field)}: ignored (the native engine plans memory at build time)")
    for key, value in sorted(so._config.items()):
        m.notes.append(f"session config entry {key}={value}: kept, no effect in xpuruntime")
    for name, value in sorted(so._free_dims_by_name.items()):
        m.notes.append(f"free dimension '{name}' fixed to {value}")
    for name, value in sorted(so._free_dims_by_denotation.items()):
        m.notes.append(f"free dimensions denoted '{name}' fixed to {value}")


def _override_free_dims(model: Union[str, bytes], so: SessionOptions) -> Tuple[Union[str, bytes], Optional[str]]:
    """The model with free dimensions fixed (add_free_dimension_override_*): bytes, and the folder its external
    data lives in (None when `model` was bytes)."""
    import onnx
    path = None if isinstance(model, bytes) else str(model)
    proto = onnx.load_from_string(model) if path is None else onnx.load(path, load_external_data=False)
    for value in itertools.chain(proto.graph.input, proto.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            fixed = so._free_dims_by_name.get(dim.dim_param) if dim.HasField("dim_param") else None
            if fixed is None and dim.denotation:
                fixed = so._free_dims_by_denotation.get(dim.denotation)
            if fixed is not None:
                dim.ClearField("dim_param")
                dim.dim_value = fixed
    return proto.SerializeToString(), (os.path.dirname(os.path.abspath(path)) if path else None)


# ---------------------------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------------------------


class InferenceSession(_XrtSession):
    """ONNX Runtime's InferenceSession on xpuruntime.

    >>> import xpuruntime.onnxruntime as ort
    >>> so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    >>> sess = ort.InferenceSession("model.onnx", so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    >>> y = sess.run(None, {"x": x})[0]
    >>> sess.get_providers(); sess.get_modelmeta().producer_name; print(sess.explain())

    xpuruntime's own keywords (``kernel_policy``, ``exec_policy``, ``device``, ``engine``) are accepted too; they
    override what the providers and options map to.
    """

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
        self._create(_normalize_providers(providers, provider_options))

    def _create(self, providers: List[Tuple[str, Dict[str, str]]]) -> None:
        so = self._sess_options
        m = _Mapping()
        _map_providers(m, providers, self._fallback_enabled)
        _map_session_options(m, so)
        if "exec_policy" in self._extra and self._extra["exec_policy"] is not None:
            m.exec_policy = self._extra["exec_policy"]
        model = self._model_arg
        if isinstance(model, (bytearray, memoryview)):
            model = bytes(model)
        if isinstance(model, os.PathLike):
            model = os.fspath(model)
        if not isinstance(model, (str, bytes)):
            raise _core.InvalidTypeError(f"path_or_bytes must be a path or bytes, got {type(model).__name__}")
        self._meta_source = model
        if so._free_dims_by_name or so._free_dims_by_denotation:
            model, _ = _override_free_dims(model, so)
        self._profiler = None
        if so.enable_profiling:
            from .runtime.profiler import Profiler
            self._profiler = Profiler().start()
            self._profile_start_ns = time.time_ns()
            m.notes.append(f"enable_profiling -> xpuruntime's profiler; end_profiling() writes "
                           f"{so.profile_file_prefix}<time>.json (Chrome trace)")
        folder = so._config.get("session.model_external_initializers_file_folder_path")
        if folder:
            m.notes.append(f"session config entry session.model_external_initializers_file_folder_path -> "
                           f"external_data_dir={folder}")
        engine = self._extra.get("engine", m.engine)
        native_only = engine == "native" or (engine == "auto" and m.device != "cpu")
        super().__init__(model, device=self._extra.get("device", m.device), engine=engine,
                         kernel_policy=self._extra.get("kernel_policy", m.kernel_policy), exec_policy=m.exec_policy,
                         fp16=self._extra.get("fp16", False),
                         disabled_passes=m.disabled_passes if native_only else None,
                         optimized_model_path=m.optimized_model_path if native_only else None,
                         external_data_dir=folder or None)
        if not native_only and (m.disabled_passes or m.optimized_model_path):
            m.notes.append("graph optimization options apply to the native engine; this session runs "
                           f"{self.engine}")
        self._mapping = m

    # -- ONNX Runtime's session API --

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Optional[RunOptions] = None) -> List[Any]:
        """``run(output_names or None, {name: array or OrtValue}, run_options)`` -> list of numpy arrays."""
        options = _core_run_options(run_options)
        if not isinstance(input_feed, Mapping):
            raise _core.InvalidTypeError(f"input_feed must be a dict, got {type(input_feed).__name__}")
        feeds = {k: (v.tensor() if isinstance(v, OrtValue) else v) for k, v in input_feed.items()}
        outputs = super().run(list(output_names or []), feeds, run_options=options)
        return [o.to("cpu").numpy() if isinstance(o, _core.Tensor) and o.dtype != "bfloat16" else o
                for o in outputs]

    def run_with_ort_values(self, output_names: Optional[Sequence[str]], input_dict_ort_values: Mapping[str, Any],
                            run_options: Optional[RunOptions] = None) -> List[OrtValue]:
        feeds = {k: (v.tensor() if isinstance(v, OrtValue) else v) for k, v in input_dict_ort_values.items()}
        outputs = _XrtSession.run(self, list(output_names or []), feeds, run_options=_core_run_options(run_options))
        from .runtime.tensor import from_numpy
        return [OrtValue(o if isinstance(o, _core.Tensor) else from_numpy(np.ascontiguousarray(o)))
                for o in outputs]

    def get_inputs(self) -> List[NodeArg]:  # type: ignore[override]
        return [NodeArg(i) for i in super().get_inputs()]

    def get_outputs(self) -> List[NodeArg]:  # type: ignore[override]
        return [NodeArg(o) for o in super().get_outputs()]

    def io_binding(self) -> OrtIOBinding:  # type: ignore[override]
        return OrtIOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: Optional[RunOptions] = None) -> None:
        super().run_with_iobinding(iobinding, _core_run_options(run_options))

    def get_overridable_initializers(self) -> List[NodeArg]:
        return []

    def get_providers(self) -> List[str]:
        return list(self._mapping.providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        return {k: dict(v) for k, v in self._mapping.provider_options.items()}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def set_providers(self, providers: Optional[Sequence[Any]] = None,
                      provider_options: Optional[Sequence[Mapping[str, Any]]] = None) -> None:
        """Re-creates the session with other providers."""
        self._create(_normalize_providers(providers, provider_options))

    def disable_fallback(self) -> None:
        """No CPU fallback for nodes without a CUDA kernel (ExecutionPolicy fallback 'error'); takes effect at the
        next ``set_providers``."""
        self._fallback_enabled = False

    def enable_fallback(self) -> None:
        self._fallback_enabled = True

    def get_modelmeta(self) -> ModelMetadata:
        import onnx
        source = self._meta_source
        proto = onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(source,
                                                                                         load_external_data=False)
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
        raise _core.UnsupportedOperationError(
            "set_tuning_results: ONNX Runtime's TunableOp results do not apply to xpuruntime's kernels; replay "
            "tuned choices with xpuruntime.ops.set_autotune_cache('policy.lock.json') (docs/policies.md)")

    def run_async(self, *args: Any, **kwargs: Any) -> None:
        raise _core.UnsupportedOperationError("run_async is not supported: call run() from a thread of your own "
                                              "(sessions are safe to run from several threads)")

    def explain(self) -> _core.Explanation:
        """xpuruntime's explanation, with how the providers and options were mapped in ``options``."""
        e = super().explain()
        e.options = list(e.options) + [f"onnxruntime API: {n}" for n in self._mapping.notes]
        return e
