"""ONNX Runtime's ``SparseTensor`` as a host-side container: COO and CSR(C) values with their indices, on the CPU.

xpuruntime's engines take dense tensors only: a sparse tensor is built, inspected and handed to
``OrtValue.ort_value_from_sparse_tensor``, but feeding one to a session raises ``NotImplemented`` (docs/engines.md,
the parity table). ``to_cuda`` is refused with a typed error: no engine here would read a sparse tensor on the GPU.
"""

from __future__ import annotations

import enum
from typing import Any, Sequence

import numpy as np

from ._devices import OrtDevice
from ._errors import InvalidArgument
from ._errors import NotImplemented as OrtNotImplemented

_ONNX_NAMES = {"float32": "float", "float64": "double", "int8": "int8", "int16": "int16", "int32": "int32",
               "int64": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
               "bool": "bool", "float16": "float16"}


class OrtSparseFormat(enum.IntEnum):
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def _indices(array: Any, what: str) -> np.ndarray:
    indices = np.ascontiguousarray(array)
    if indices.dtype != np.int64:
        raise InvalidArgument(f"SparseTensor: {what} must be int64, got {indices.dtype}")
    return indices.copy()


class _CooView:
    def __init__(self, indices: np.ndarray) -> None:
        self._indices = indices

    def indices(self) -> np.ndarray:
        return _read_only(self._indices)


class _CsrcView:
    def __init__(self, inner: np.ndarray, outer: np.ndarray) -> None:
        self._inner, self._outer = inner, outer

    def inner(self) -> np.ndarray:
        return _read_only(self._inner)

    def outer(self) -> np.ndarray:
        return _read_only(self._outer)


class SparseTensor:
    """A sparse tensor on the CPU: ``sparse_coo_from_numpy(dense_shape, values, indices, device)`` (linear or
    2-D coordinates) or ``sparse_csr_from_numpy(dense_shape, values, inner_indices, outer_indices, device)``."""

    def __init__(self, sparse_format: OrtSparseFormat, dense_shape: Sequence[int], values: np.ndarray,
                 views: Any) -> None:
        self._format, self._shape, self._values, self._views = sparse_format, [int(d) for d in dense_shape], \
            values, views

    @staticmethod
    def _check(dense_shape: Sequence[int], values: Any, device: OrtDevice) -> np.ndarray:
        if not isinstance(device, OrtDevice) or device.device_type() != OrtDevice.CPU:
            raise OrtNotImplemented("SparseTensor: xpuruntime builds sparse tensors on the CPU only (OrtDevice.make("
                                 "'cpu', 0))")
        if any(int(d) < 0 for d in dense_shape):
            raise InvalidArgument(f"SparseTensor: dense shape {list(dense_shape)} has a negative dim")
        array = np.asarray(values)
        if array.ndim != 1:
            raise InvalidArgument(f"SparseTensor: values must be 1-D, got shape {list(array.shape)}")
        if array.dtype.kind in "US":
            return np.array(array, dtype=object)
        return array.copy()

    @staticmethod
    def sparse_coo_from_numpy(dense_shape: Sequence[int], values: Any, indices: Any,
                              device: OrtDevice) -> "SparseTensor":
        array = SparseTensor._check(dense_shape, values, device)
        coords = _indices(indices, "COO indices")
        if coords.size not in (len(array), 2 * len(array)):
            raise InvalidArgument(f"SparseTensor: {len(array)} values need {len(array)} linear or "
                                             f"{2 * len(array)} 2-D COO indices, got {coords.size}")
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_COO, dense_shape, array, _CooView(coords))

    @staticmethod
    def sparse_csr_from_numpy(dense_shape: Sequence[int], values: Any, inner_indices: Any, outer_indices: Any,
                              device: OrtDevice) -> "SparseTensor":
        array = SparseTensor._check(dense_shape, values, device)
        inner, outer = _indices(inner_indices, "inner indices"), _indices(outer_indices, "outer indices")
        if len(dense_shape) != 2 or inner.size != len(array) or outer.size != int(dense_shape[0]) + 1:
            raise InvalidArgument(
                f"SparseTensor CSR: a 2-D dense shape, one inner index per value ({len(array)}) and rows + 1 outer "
                f"indices; got shape {list(dense_shape)}, {inner.size} inner, {outer.size} outer")
        return SparseTensor(OrtSparseFormat.ORT_SPARSE_CSRC, dense_shape, array, _CsrcView(inner, outer))

    def format(self) -> OrtSparseFormat:
        return self._format

    def dense_shape(self) -> list:
        return list(self._shape)

    def data_type(self) -> str:
        name = "string" if self._values.dtype == object else _ONNX_NAMES.get(self._values.dtype.name,
                                                                           self._values.dtype.name)
        return f"sparse_tensor({name})"

    def device_name(self) -> str:
        return "cpu"

    def values(self) -> np.ndarray:
        """The values (read-only; strings as a ``str`` array)."""
        if self._values.dtype == object:
            return np.array(self._values, dtype=str)
        return _read_only(self._values)

    def as_coo_view(self) -> _CooView:
        if self._format != OrtSparseFormat.ORT_SPARSE_COO:
            raise InvalidArgument(f"SparseTensor: as_coo_view on a {self._format.name} tensor")
        return self._views

    def as_csrc_view(self) -> _CsrcView:
        if self._format != OrtSparseFormat.ORT_SPARSE_CSRC:
            raise InvalidArgument(f"SparseTensor: as_csrc_view on a {self._format.name} tensor")
        return self._views

    def to_cuda(self, device: OrtDevice) -> "SparseTensor":
        raise OrtNotImplemented("SparseTensor.to_cuda: xpuruntime keeps sparse tensors on the CPU (no engine here "
                             "reads a sparse tensor on the GPU; densify it and feed the dense tensor)")

    def __repr__(self) -> str:
        return f"<SparseTensor {self._format.name} {self.data_type()} dense_shape={self._shape}>"
