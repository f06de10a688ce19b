"""Tensors: device-aware, strided, exchanged zero-copy through DLPack."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import _core

Tensor = _core.Tensor
empty = _core.empty
zeros = _core.zeros
from_dlpack = _core.from_dlpack
from_numpy = _core.from_numpy


def tensor(data: Any, dtype: Optional[str] = None, device: Any = "cpu") -> Tensor:
    """Return a new tensor holding a copy of ``data`` (anything ``numpy.asarray`` accepts).

    Parameters
    ----------
    data
        Nested sequences, a scalar, a numpy array or any DLPack tensor.
    dtype
        Element type name (``"float32"``, ``"float16"``, ``"int64"``, ...); default: inferred by numpy.
    device
        Where the copy lives (``"cpu"``, ``"cuda:0"``, ...).
    """
    if hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
        source = from_dlpack(data)
        if dtype is not None and source.dtype != dtype:
            source = from_numpy(np.asarray(source.to_numpy(), dtype=dtype))
    else:
        source = from_numpy(np.ascontiguousarray(np.asarray(data, dtype=dtype)))
    out = empty(source.shape, source.dtype, device)
    out.copy_(source)
    return out


__all__ = ["Tensor", "empty", "zeros", "tensor", "from_dlpack", "from_numpy"]
