"""Devices: the CPU and every CUDA device, with their capabilities.

Without a CUDA driver or GPU there are zero CUDA devices and nothing fails until a CUDA device is asked for,
which raises :class:`xpuruntime.CudaError` naming the reason.
"""

from __future__ import annotations

from typing import List, Optional, Union

from .. import _core

Device = _core.Device
DeviceInfo = _core.DeviceInfo

DeviceLike = Union[Device, str, int, None]


def get_device_count() -> int:
    """Return the number of CUDA devices (0 without a driver or GPU)."""
    return _core.get_device_count()


def cuda_available() -> bool:
    """Return True when at least one CUDA device can be used."""
    return _core.cuda_available()


def cuda_unavailable_reason() -> str:
    """Return why no CUDA device is available ('' when one is)."""
    return _core.cuda_unavailable_reason()


def get_all_devices() -> List[Device]:
    """Return the CPU device followed by every CUDA device."""
    return _core.get_all_devices()


def get_device_info(device: DeviceLike = None) -> DeviceInfo:
    """Return the :class:`DeviceInfo` of ``device`` (default: the current device), free memory read now."""
    return _core.get_device_info(device)


def get_current_device() -> Device:
    """Return the calling thread's current device (cuda:0 when a GPU exists, else cpu, unless set)."""
    return _core.get_current_device()


def set_current_device(device: DeviceLike) -> None:
    """Make ``device`` current for the calling thread (``Device``, ``"cuda:1"`` or ``1``)."""
    _core.set_current_device(device)


def synchronize(device: DeviceLike = None) -> None:
    """Wait until all work queued on ``device`` (default: the current device) is done."""
    _core.synchronize(device)
