"""Low-level runtime API: devices, streams, events, CUDA graphs, memory and tensors."""

from __future__ import annotations

from .device import (
    Device,
    DeviceInfo,
    cuda_available,
    cuda_unavailable_reason,
    get_all_devices,
    get_current_device,
    get_device_count,
    get_device_info,
    set_current_device,
    synchronize,
)
from .memory import (
    Buffer,
    CachingAllocator,
    allocate,
    empty_cache,
    get_memory_limit,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    pinned_memory_stats,
    reset_peak_memory_stats,
    set_memory_limit,
)
from .stream import (
    CaptureMode,
    CudaGraph,
    Event,
    Stream,
    current_stream,
    default_stream,
    graph,
    set_current_stream,
    stream_priority_range,
)
from .tensor import Tensor, empty, from_dlpack, from_numpy, tensor, zeros
from . import profiler
from .profiler import Profiler, is_profiling, profile

__all__ = [name for name in dir() if not name.startswith("_")]
