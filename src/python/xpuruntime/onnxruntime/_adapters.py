"""ONNX Runtime's LoRA adapters: the ``.onnx_adapter`` file (``AdapterFormat``, read and written here) and
``LoraAdapter`` (its parameters, fed to a run by ``RunOptions.add_active_adapter``).

Note [LoRA adapters as feeds]
-----------------------------
An adapter file holds named parameters; the model has graph inputs of those names that also have an initializer
(overridable initializers, usually empty placeholders). ONNX Runtime feeds an active adapter's parameters to those
inputs for the run. xpuruntime's engines take the graph's non-initializer inputs as feeds, so here a run given
active adapters runs a second session of the same model and options whose initializers of those names hold the
adapters' values (``add_initializer``'s mechanism, Note [Initializers from the caller] in _model.py); it is built on
the first such run and kept for that set of adapters. A parameter the model has no initializer for is an
``InvalidArgument``.

The file is a FlatBuffer (ONNX Runtime's ``adapter_schema.fbs``, identifier ``TORT``): a root table ``Adapter``
(``format_version``, ``adapter_version``, ``model_version``, ``parameters``) of tables ``Parameter`` (``name``,
``dims`` int64, ``data_type`` ONNX element type, ``raw_data`` bytes aligned to 8). The reader follows the FlatBuffer
rules (offsets, vtables, absent fields); the writer lays the objects out front to back (every offset points
forward) and aligns each scalar and vector to its size.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._errors import InvalidArgument, InvalidProtobuf

FORMAT_VERSION = 1
_IDENTIFIER = b"TORT"
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
           10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64, 16: np.uint16}


class _Reader:
    def __init__(self, data: bytes, path: str) -> None:
        self.data, self.path = data, path

    def _unpack(self, fmt: str, pos: int) -> Any:
        if pos < 0 or pos + struct.calcsize(fmt) > len(self.data):
            raise InvalidProtobuf(f"{self.path}: not an ONNX Runtime adapter file (an offset leaves the file)")
        return struct.unpack_from("<" + fmt, self.data, pos)[0]

    def field(self, table: int, index: int) -> Optional[int]:
        """The position of field `index` of the table at `table`, None when absent."""
        vtable = table - self._unpack("i", table)
        if 4 + 2 * index >= self._unpack("H", vtable):
            return None
        offset = self._unpack("H", vtable + 4 + 2 * index)
        return table + offset if offset else None

    def scalar(self, table: int, index: int, fmt: str, default: Any = 0) -> Any:
        pos = self.field(table, index)
        return default if pos is None else self._unpack(fmt, pos)

    def vector(self, table: int, index: int) -> Tuple[int, int]:
        """(position of the first element, length) of a vector field; (0, 0) when absent."""
        pos = self.field(table, index)
        if pos is None:
            return 0, 0
        start = pos + self._unpack("I", pos)
        return start + 4, self._unpack("I", start)


def read_adapter_file(path: str) -> Tuple[int, int, int, Dict[str, np.ndarray]]:
    """(format_version, adapter_version, model_version, {name: array}) of an ``.onnx_adapter`` file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise InvalidArgument(f"cannot read the adapter file {path}: {error}") from None
    if len(data) < 8 or data[4:8] != _IDENTIFIER:
        raise InvalidProtobuf(f"{path}: not an ONNX Runtime adapter file (no '{_IDENTIFIER.decode()}' identifier)")
    r = _Reader(data, path)
    root = r._unpack("I", 0)
    format_version = r.scalar(root, 0, "i")
    if format_version != FORMAT_VERSION:
        raise InvalidArgument(f"{path}: adapter format version {format_version}, this module reads "
                              f"{FORMAT_VERSION}")
    params: Dict[str, np.ndarray] = {}
    first, count = r.vector(root, 3)
    for i in range(count):
        element = first + 4 * i
        table = element + r._unpack("I", element)
        name_at, name_len = r.vector(table, 0)
        name = data[name_at:name_at + name_len].decode("utf-8")
        dims_at, ndims = r.vector(table, 1)
        dims = [r._unpack("q", dims_at + 8 * d) for d in range(ndims)]
        element_type = r.scalar(table, 2, "i")
        if element_type not in _DTYPES:
            raise InvalidArgument(f"{path}: parameter '{name}' has ONNX element type {element_type}, which "
                                  "xpuruntime tensors do not hold")
        raw_at, raw_len = r.vector(table, 3)
        array = np.frombuffer(data[raw_at:raw_at + raw_len], dtype=_DTYPES[element_type]).copy()
        if array.size != int(np.prod(dims, dtype=np.int64)):
            raise InvalidArgument(f"{path}: parameter '{name}' has {array.size} elements for dims {dims}")
        params[name] = array.reshape(dims)
    return format_version, r.scalar(root, 1, "i"), r.scalar(root, 2, "i"), params


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def pad(self, alignment: int, then: int = 0) -> None:
        """Pads so that the position `then` bytes ahead is aligned to `alignment`."""
        while (len(self.buf) + then) % alignment:
            self.buf.append(0)

    def put(self, fmt: str, *values: Any) -> int:
        pos = len(self.buf)
        self.buf += struct.pack("<" + fmt, *values)
        return pos

    def link(self, field_pos: int) -> None:
        """Points the uoffset at `field_pos` to the current position (the object written next)."""
        struct.pack_into("<I", self.buf, field_pos, len(self.buf) - field_pos)

    def table(self, fields: List[Tuple[str, Any]]) -> List[int]:
        """A vtable and its table of 4-byte fields (`("i", value)` or `("o", None)` for an offset to link);
        returns each field's position."""
        self.pad(4)
        vtable = self.put("HH", 4 + 2 * len(fields), 4 + 4 * len(fields))
        for i in range(len(fields)):
            self.put("H", 4 + 4 * i)
        self.pad(4)
        self.put("i", len(self.buf) - vtable)  # the table: its soffset to the vtable, then the fields
        return [self.put("i" if kind == "i" else "I", value or 0) for kind, value in fields]

    def vector(self, field_pos: int, payload: bytes, count: int, alignment: int) -> None:
        self.pad(max(alignment, 4), then=4)
        self.link(field_pos)
        self.put("I", count)
        self.buf += payload


def write_adapter_file(path: str, adapter_version: int, model_version: int, params: Dict[str, np.ndarray]) -> None:
    w = _Writer()
    w.put("I", 0)
    w.buf += _IDENTIFIER
    root_fields = w.table([("i", FORMAT_VERSION), ("i", adapter_version), ("i", model_version), ("o", None)])
    struct.pack_into("<I", w.buf, 0, root_fields[0] - 4)  # the root offset points at the table's soffset
    w.pad(4, then=4)
    w.link(root_fields[3])
    w.put("I", len(params))
    slots = [w.put("I", 0) for _ in params]
    for slot, (name, array) in zip(slots, params.items()):
        element_type = {np.dtype(v): k for k, v in _DTYPES.items() if k != 16}.get(array.dtype)
        if element_type is None:
            raise InvalidArgument(f"adapter parameter '{name}': {array.dtype} is not an element type of the format")
        w.pad(4)
        fields = w.table([("o", None), ("o", None), ("i", element_type), ("o", None)])
        struct.pack_into("<I", w.buf, slot, fields[0] - 4 - slot)
        encoded = name.encode("utf-8")
        w.vector(fields[0], encoded + b"\0", len(encoded), 4)
        w.vector(fields[1], np.asarray(array.shape, np.int64).tobytes(), array.ndim, 8)
        raw = np.ascontiguousarray(array).tobytes()
        w.vector(fields[3], raw, len(raw), 8)
    with open(path, "wb") as f:
        f.write(bytes(w.buf))
