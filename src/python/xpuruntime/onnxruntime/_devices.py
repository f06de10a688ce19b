"""ONNX Runtime's device and memory descriptions: ``OrtDevice``, ``OrtMemoryInfo``, ``OrtArenaCfg`` and their
enums, as plain descriptions of where a value lives. xpuruntime allocates from its own allocators
(docs/memory.md); these objects say where, they do not configure an allocator."""

from __future__ import annotations

import enum
from typing import Any, Dict, Optional

from .. import _core
from ._errors import InvalidArgument


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids, as ONNX Runtime's ``OrtDevice`` reports them."""
    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    INTEL = 0x8086


class OrtAllocatorType(enum.IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(enum.IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class OrtDeviceMemoryType(enum.IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfoDeviceType(enum.IntEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "gpu": 1}


class OrtDevice:
    """A device as ONNX Runtime names it: ``device_type()`` 0 (CPU) or 1 (GPU), ``device_id()``,
    ``device_vendor_id()`` and ``device_mem_type()``."""

    CPU = 0
    GPU = 1

    def __init__(self, device_type: int = 0, mem_type: int = 0, device_id: int = 0, vendor_id: int = 0) -> None:
        if int(device_type) not in (0, 1):
            raise InvalidArgument(f"OrtDevice: device type {device_type} is not CPU (0) or GPU (1); "
                                             "xpuruntime has CPU and CUDA devices")
        self._type, self._mem_type, self._id, self._vendor = int(device_type), int(mem_type), int(device_id), \
            int(vendor_id)

    @staticmethod
    def make(device: str, device_id: int = 0) -> "OrtDevice":
        """``OrtDevice.make("cpu", 0)`` or ``OrtDevice.make("cuda", N)`` (NVIDIA's vendor id)."""
        kind = str(device).lower()
        if kind not in _DEVICE_TYPES:
            raise InvalidArgument(f"OrtDevice.make: unknown device '{device}' (xpuruntime has 'cpu' and "
                                             "'cuda')")
        is_gpu = _DEVICE_TYPES[kind] == 1
        return OrtDevice(_DEVICE_TYPES[kind], 0, int(device_id), OrtDeviceVendorId.NVIDIA if is_gpu else 0)

    def device_type(self) -> int:
        return self._type

    def device_id(self) -> int:
        return self._id

    def device_vendor_id(self) -> int:
        return self._vendor

    def device_mem_type(self) -> int:
        return self._mem_type

    def xpuruntime_device(self) -> str:
        """The device in xpuruntime's spelling (``"cpu"``, ``"cuda:N"``)."""
        return "cpu" if self._type == 0 else f"cuda:{self._id}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtDevice) and (self._type, self._id, self._mem_type) == (other._type, other._id,
                                                                                             other._mem_type)

    def __hash__(self) -> int:
        return hash((self._type, self._id, self._mem_type))

    def __repr__(self) -> str:
        return f"OrtDevice({self.xpuruntime_device()}, vendor=0x{self._vendor:04X}, mem_type={self._mem_type})"


class OrtMemoryInfo:
    """Where a value's memory is: ``name`` ("Cpu", "Cuda"), ``device_id``, ``mem_type``, ``allocator_type``,
    ``device_mem_type``, ``device_vendor_id``."""

    def __init__(self, name: str, allocator_type: int, device_id: int, mem_type: int) -> None:
        self.name = str(name)
        self.allocator_type = OrtAllocatorType(int(allocator_type))
        self.device_id = int(device_id)
        self.mem_type = OrtMemType(int(mem_type))
        self.device_mem_type = OrtDeviceMemoryType.DEFAULT
        is_gpu = self.name.lower().startswith("cuda")
        self.device_vendor_id = int(OrtDeviceVendorId.NVIDIA) if is_gpu else 0

    @staticmethod
    def create_v2(name: str, device_type: int, vendor_id: int, device_id: int, device_mem_type: int,
                  alignment: int, allocator_type: int) -> "OrtMemoryInfo":
        if int(alignment) < 0:
            raise InvalidArgument(f"OrtMemoryInfo.create_v2: alignment must be >= 0, got {alignment}")
        info = OrtMemoryInfo(name, allocator_type, device_id, OrtMemType.DEFAULT)
        info.device_mem_type = OrtDeviceMemoryType(int(device_mem_type))
        info.device_vendor_id = int(vendor_id)
        info._device_type = OrtMemoryInfoDeviceType(int(device_type))
        return info

    @staticmethod
    def for_device(device: str) -> "OrtMemoryInfo":
        """The memory info of values on an xpuruntime device (``"cpu"``, ``"cuda:N"``)."""
        if device.startswith("cuda"):
            index = int(device.split(":")[1]) if ":" in device else 0
            return OrtMemoryInfo("Cuda", OrtAllocatorType.ORT_ARENA_ALLOCATOR, index, OrtMemType.DEFAULT)
        return OrtMemoryInfo("Cpu", OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, OrtMemType.DEFAULT)

    def __repr__(self) -> str:
        return (f"OrtMemoryInfo(name='{self.name}', device_id={self.device_id}, mem_type={self.mem_type.name}, "
                f"allocator_type={self.allocator_type.name})")


class OrtArenaCfg:
    """ONNX Runtime's arena settings: ``OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes,
    max_dead_bytes_per_chunk)`` or ``OrtArenaCfg({key: value})``. xpuruntime's caching allocator has its own
    settings (docs/memory.md); this object keeps the values for code that reads them back."""

    _KEYS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes", "max_dead_bytes_per_chunk",
             "initial_growth_chunk_size_bytes", "max_power_of_two_extend_bytes")

    def __init__(self, *args: Any) -> None:
        values: Dict[str, int] = {k: -1 for k in self._KEYS}
        if len(args) == 1 and isinstance(args[0], dict):
            unknown = set(args[0]) - set(self._KEYS)
            if unknown:
                raise InvalidArgument(f"OrtArenaCfg: unknown keys {sorted(unknown)}; known: "
                                                 f"{', '.join(self._KEYS)}")
            values.update({k: int(v) for k, v in args[0].items()})
        elif len(args) == 4:
            values.update(zip(self._KEYS[:4], (int(a) for a in args)))
        elif args:
            raise InvalidArgument("OrtArenaCfg takes (max_mem, arena_extend_strategy, "
                                             "initial_chunk_size_bytes, max_dead_bytes_per_chunk) or a dict")
        for key, value in values.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return "OrtArenaCfg(" + ", ".join(f"{k}={getattr(self, k)}" for k in self._KEYS) + ")"


_registered_allocators: Dict[str, OrtMemoryInfo] = {}


def create_and_register_allocator(memory_info: OrtMemoryInfo, arena_cfg: Optional[OrtArenaCfg]) -> None:
    """Accepted for the CPU: xpuruntime sessions already share the process-wide allocators of each device
    (docs/memory.md), which is what ``session.use_env_allocators`` asks of ONNX Runtime."""
    if not isinstance(memory_info, OrtMemoryInfo):
        raise _core.InvalidTypeError(f"create_and_register_allocator takes an OrtMemoryInfo, got "
                                     f"{type(memory_info).__name__}")
    _registered_allocators[memory_info.name] = memory_info


def create_and_register_allocator_v2(provider_type: str, memory_info: OrtMemoryInfo, provider_options: Dict,
                                     arena_cfg: Optional[OrtArenaCfg]) -> None:
    """As :func:`create_and_register_allocator`, for a provider's device."""
    create_and_register_allocator(memory_info, arena_cfg)
