"""autocast: mixed precision named the way ExecutionPolicy names precision (fp32, tf32, fp16, bf16)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Union

import torch

from .. import _core
from ..policies import ExecutionPolicy
from . import _extension
from ._state import STATE

_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class autocast:  # noqa: N801 - named like torch.autocast, which it wraps
    """Run a region in one ExecutionPolicy precision: the same names as inference (``fp32``, ``tf32``, ``fp16``,
    ``bf16``).

    - ``fp16`` / ``bf16``: ``torch.autocast`` with that dtype; routed calls (matmul/linear, conv2d, attention) get
      the same casts, so xpuruntime's kernels run in that dtype too (accumulating in fp32).
    - ``tf32``: fp32 tensors, TF32 tensor-core math for GEMMs and convolutions, in PyTorch
      (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``) and in xpuruntime's kernels
      (their ExecutionPolicy precision becomes ``tf32``); autocast is off inside.
    - ``fp32``: exact fp32 everywhere (TF32 off, autocast off).

    Parameters
    ----------
    precision : str or ExecutionPolicy, optional
        A precision name, or an ExecutionPolicy whose precision to use. Default: the current kernel policy scope's
        ExecutionPolicy precision (``fp32`` when routing is off).
    fp16, bf16 : bool
        Shorthands for ``precision="fp16"`` / ``"bf16"``.
    device_type : str, optional
        ``"cuda"`` or ``"cpu"``; default ``"cuda"`` when CUDA is available.
    enabled : bool
        False makes the region a no-op.
    cache_enabled : bool
        torch.autocast's weight-cast cache. Default False: cached casts made inside a CUDA graph capture would be
        freed while the graph still reads them (PyTorch's graph rules ask for ``cache_enabled=False``).

    Examples
    --------
    >>> with xrt_torch.autocast(fp16=True):
    ...     loss = model(x).float().pow(2).mean()
    >>> with xrt_torch.autocast(xrt.ExecutionPolicy(precision="bf16")): ...
    """

    def __init__(self, precision: Union[str, ExecutionPolicy, None] = None, *, fp16: bool = False,
                 bf16: bool = False, device_type: Optional[str] = None, enabled: bool = True,
                 cache_enabled: bool = False) -> None:
        if fp16 and bf16:
            raise _core.InvalidArgumentError("autocast: choose one of fp16=True and bf16=True, not both")
        named = "fp16" if fp16 else ("bf16" if bf16 else None)
        if isinstance(precision, _core.ExecutionPolicy):
            precision = precision.precision
        if precision is not None and not isinstance(precision, str):
            raise _core.InvalidTypeError(
                f"autocast: precision must be a name ({', '.join(_PRECISIONS)}) or an ExecutionPolicy, got "
                f"{type(precision).__name__}")
        if precision is not None and named is not None and precision != named:
            raise _core.InvalidArgumentError(f"autocast: precision='{precision}' contradicts {named}=True")
        precision = precision or named
        if precision is None:
            scope = STATE.current
            precision = scope.exec_policy.precision if scope is not None else "fp32"
        if precision not in _PRECISIONS:
            raise _core.InvalidArgumentError(
                f"autocast: unknown precision '{precision}'; valid: {', '.join(_PRECISIONS)} (int8 is inference only)")
        if device_type is None:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"
        if device_type not in ("cuda", "cpu"):
            raise _core.InvalidArgumentError(f"autocast: device_type must be 'cuda' or 'cpu', got '{device_type}'")
        self.precision = precision
        self.device_type = device_type
        self.enabled = bool(enabled)
        self.cache_enabled = bool(cache_enabled)
        self._saved: Optional[tuple] = None
        self._torch_autocast: Optional[Any] = None

    def __enter__(self) -> "autocast":
        if not self.enabled:
            return self
        self._saved = (STATE.precision_override, torch.backends.cuda.matmul.allow_tf32,
                       torch.backends.cudnn.allow_tf32)
        if self.precision in _DTYPES:
            self._torch_autocast = torch.autocast(self.device_type, dtype=_DTYPES[self.precision],
                                                  cache_enabled=self.cache_enabled)
            STATE.precision_override = None
        else:
            self._torch_autocast = torch.autocast(self.device_type, enabled=False)
            tf32 = self.precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            STATE.precision_override = self.precision
        self._torch_autocast.__enter__()
        _extension.sync_state()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._torch_autocast is None:
            return
        self._torch_autocast.__exit__(*exc)
        self._torch_autocast = None
        override, matmul_tf32, cudnn_tf32 = self._saved  # type: ignore[misc]
        STATE.precision_override = override
        _extension.sync_state()
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        torch.backends.cudnn.allow_tf32 = cudnn_tf32

    def __call__(self, fn: Callable) -> Callable:
        """Use as a decorator: ``fn`` runs inside this region."""
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.precision, device_type=self.device_type, enabled=self.enabled,
                          cache_enabled=self.cache_enabled):
                return fn(*args, **kwargs)
        return wrapped

    def __repr__(self) -> str:
        return (f"<xpuruntime.pytorch.autocast precision={self.precision} device_type={self.device_type}"
                f"{'' if self.enabled else ' disabled'}>")
