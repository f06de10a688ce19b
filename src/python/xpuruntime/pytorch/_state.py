"""The routing state of xpuruntime.pytorch that every layer reads: the scope in force and the precision override.

The bottom of the package (Note [The layers of xpuruntime.pytorch] in __init__.py): it imports nothing of it.
Written by ``_mode.activate`` (the scope) and ``xpuruntime.pytorch.autocast`` (the precision override); read by the
router (``_routing``), the custom ops, the fast path and the native path's extension (``_extension.sync_state``).
"""

from __future__ import annotations

from typing import Any, Optional


class _State:
    scope: Any = None                         # the PolicyScope set_kernel_policy returned last (None: routing off)
    current: Any = None                       # its PolicyState (_routing): what the mode and the custom ops read
    precision_override: Optional[str] = None  # "tf32" / "fp32" from xpuruntime.pytorch.autocast


STATE = _State()
