"""xpuruntime - a unified GPU/NPU execution runtime.

The C++ core (``xpuruntime._core``) is the data plane: devices, the caching allocator, streams, CUDA graphs and
DLPack tensors. This package is the control plane on top of it.

Examples
--------
>>> import xpuruntime as xrt
>>> xrt.get_all_devices()          # the CPU, then every CUDA device
>>> t = xrt.from_dlpack(np.ones((2, 3), np.float32))   # zero-copy
"""

from __future__ import annotations

from . import _core
from ._core import (
    CudaError,
    DistributedError,
    DistributedTimeoutError,
    InvalidArgumentError,
    InvalidTypeError,
    OutOfMemoryError,
    RunOptions,
    RunTerminatedError,
    RunTimeoutError,
    UnsupportedOperationError,
    XpuRuntimeError,
)
from . import runtime
from .runtime.device import (
    Device,
    cuda_available,
    get_all_devices,
    get_current_device,
    get_device_count,
    set_current_device,
    synchronize,
)
from .runtime.tensor import Tensor, empty, from_dlpack, from_numpy, tensor, zeros
from .policies import ExecutionPolicy, KernelPolicy, pinned, preferred
from ._core import AutotuneCache, Decision, Dispatcher, KernelInfo
from . import ops
from . import distributed
from .inference import InferenceSession, IOBinding
from . import generation
from .runtime.profiler import Profiler, profile
from . import quantization
from .quantization import quantize

__version__: str = _core.get_version()


def get_version() -> str:
    """Return the version of xpuruntime (the same as ``__version__``)."""
    return _core.get_version()


def kernels(op: str | None = None) -> list:
    """The registered kernels (of ``op``), in priority order: ``KernelInfo`` with op, name, backend,
    device_type (``"cpu"``/``"cuda"``), deterministic, summary."""
    return _core.kernels(op)


def op_schemas() -> list:
    """Every op: name, family (its KernelPolicy key), inputs (optional ones end in ``?``), doc."""
    return _core.op_schemas()


def graph_passes() -> dict:
    """The native engine's graph passes in the order a plan runs them: name -> what it rewrites. The names are what
    ``InferenceSession(..., disabled_passes=[...])`` and ``xpuruntime compare --bisect-passes`` take."""
    return dict(_core.graph_passes())


def _engine_availability(device: "str | Device") -> list:
    """(name, available, reason) per engine; a device that does not exist makes every engine unavailable."""
    if not isinstance(device, Device):
        try:
            device = Device(device)
        except CudaError as error:  # Device("cuda") resolves the current CUDA device, which may not exist
            return [(name, False, str(error)) for name in _core.known_engines() if name != "auto"]
    return _core.engine_availability(device)


def available_engines(device: "str | Device" = "cpu") -> list:
    """The engines (``engine=`` of :class:`InferenceSession`) that can run on ``device`` in this build and on this
    machine, in the order of ``"native"``, ``"onnxruntime"``, ``"tensorrt"``, ... (``"auto"`` picks among them).
    :func:`unavailable_engines` says why each other one cannot."""
    return [name for name, ok, _ in _engine_availability(device) if ok]


def unavailable_engines(device: "str | Device" = "cpu") -> dict:
    """The engines that cannot run on ``device`` here, each with why and what to install or use instead (an engine
    this build lacks, one no version of xpuruntime implements yet, or a device that does not exist)."""
    return {name: reason for name, ok, reason in _engine_availability(device) if not ok}


def cmake_prefix_path() -> str | None:
    """The folder to give CMake (``-DCMAKE_PREFIX_PATH=...``) for ``find_package(xpuruntime)`` against an installed
    wheel (its ``lib/cmake/xpuruntime``); None when running from the source tree (use the build's install)."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    return here if os.path.isdir(os.path.join(here, "lib", "cmake", "xpuruntime")) else None


def build_info() -> dict:
    """Return how the core library was built: version, CUDA and NVTX support, compiler, build type."""
    return _core.build_info()


def __getattr__(name: str):
    # xpuruntime.pytorch is imported lazily so that the core package never needs torch.
    if name == "pytorch":
        import importlib

        return importlib.import_module(".pytorch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "get_version",
    "build_info",
    "available_engines",
    "unavailable_engines",
    "XpuRuntimeError",
    "CudaError",
    "DistributedError",
    "DistributedTimeoutError",
    "OutOfMemoryError",
    "UnsupportedOperationError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "RunTerminatedError",
    "RunTimeoutError",
    "RunOptions",
    "Device",
    "distributed",
    "cuda_available",
    "get_device_count",
    "get_all_devices",
    "get_current_device",
    "set_current_device",
    "synchronize",
    "Tensor",
    "empty",
    "zeros",
    "tensor",
    "from_dlpack",
    "from_numpy",
    "KernelPolicy",
    "ExecutionPolicy",
    "pinned",
    "preferred",
    "AutotuneCache",
    "Decision",
    "Dispatcher",
    "KernelInfo",
    "kernels",
    "op_schemas",
    "graph_passes",
    "ops",
    "InferenceSession",
    "IOBinding",
    "Profiler",
    "profile",
    "quantization",
    "quantize",
    "runtime",
]
