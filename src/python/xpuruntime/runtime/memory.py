"""Memory: allocations, caching-allocator statistics, limits and the cache.

CUDA memory comes from one stream-ordered caching allocator per device (see ``docs/memory.md``); pinned host
memory from a caching allocator whose blocks wait for their streams; CPU memory from aligned host allocations.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .. import _core

Buffer = _core.Buffer
CachingAllocator = _core.CachingAllocator
allocate = _core.allocate
memory_stats = _core.memory_stats
pinned_memory_stats = _core.pinned_memory_stats
memory_snapshot = _core.memory_snapshot
empty_cache = _core.empty_cache
reset_peak_memory_stats = _core.reset_peak_memory_stats
set_memory_limit = _core.set_memory_limit
get_memory_limit = _core.get_memory_limit


def memory_allocated(device: Any = None) -> int:
    """Return the bytes currently handed out on ``device`` (rounded allocation sizes)."""
    return memory_stats(device)["allocated_bytes.current"]


def max_memory_allocated(device: Any = None) -> int:
    """Return the peak of :func:`memory_allocated` since start or the last peak reset."""
    return memory_stats(device)["allocated_bytes.peak"]


def memory_reserved(device: Any = None) -> int:
    """Return the bytes held from the system on ``device`` (allocated plus cached)."""
    return memory_stats(device)["reserved_bytes.current"]


def max_memory_reserved(device: Any = None) -> int:
    """Return the peak of :func:`memory_reserved`."""
    return memory_stats(device)["reserved_bytes.peak"]


__all__ = [
    "Buffer",
    "CachingAllocator",
    "allocate",
    "memory_stats",
    "pinned_memory_stats",
    "memory_snapshot",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "empty_cache",
    "reset_peak_memory_stats",
    "set_memory_limit",
    "get_memory_limit",
]
