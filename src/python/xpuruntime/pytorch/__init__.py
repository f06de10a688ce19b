"""xpuruntime.pytorch - PyTorch interoperability (needs the ``torch`` extra).

Importing this module requires PyTorch; without it the import fails with an ImportError that says how to get
it. The kernel-policy integration (``set_kernel_policy``, ``autocast``, ``capture_graph``) builds on this module.
"""

from __future__ import annotations

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised by the tests without torch
    raise ImportError(
        "xpuruntime.pytorch requires PyTorch, which is not installed. Install it with "
        "`pip install xpuruntime[torch]` (or `pip install torch`), then import xpuruntime.pytorch again."
    ) from error

from .. import _core

__all__ = ["to_torch", "from_torch", "current_stream"]


def to_torch(tensor: "_core.Tensor") -> "torch.Tensor":
    """Return a torch tensor sharing the memory of an xpuruntime tensor (zero-copy through DLPack)."""
    return torch.from_dlpack(tensor)


def from_torch(tensor: "torch.Tensor") -> "_core.Tensor":
    """Return an xpuruntime tensor sharing the memory of a torch tensor (zero-copy through DLPack)."""
    return _core.from_dlpack(tensor)


def current_stream(device: "torch.device | int | None" = None) -> "_core.Stream":
    """Return torch's current CUDA stream as a (non-owning) xpuruntime Stream."""
    stream = torch.cuda.current_stream(device)
    return _core.Stream.from_handle(stream.cuda_stream, f"cuda:{stream.device.index}")
