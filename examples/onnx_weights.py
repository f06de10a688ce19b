"""Reads the float initializers of a small ONNX model without the onnx package (a minimal protobuf walk), so
the quick start runs with numpy alone."""

from __future__ import annotations

import pathlib
from typing import Dict, Iterator, Tuple

import numpy as np


def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[Tuple[int, int, object]]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def load(path: pathlib.Path) -> Dict[str, np.ndarray]:
    """{name: array} of the model's float32 initializers (raw_data or float_data)."""
    weights = {}
    model = pathlib.Path(path).read_bytes()
    for number, _, graph in _fields(model):
        if number != 7:  # ModelProto.graph
            continue
        for field, _, tensor in _fields(graph):
            if field != 5:  # GraphProto.initializer
                continue
            dims, name, raw, floats = [], "", b"", []
            for f, wire, value in _fields(tensor):
                if f == 1 and wire == 2:  # packed dims
                    i = 0
                    while i < len(value):
                        dim, i = _varint(value, i)
                        dims.append(dim)
                elif f == 1:
                    dims.append(value)
                elif f == 8:
                    name = value.decode()
                elif f == 9:
                    raw = value
                elif f == 4:
                    floats = np.frombuffer(value, np.float32) if wire == 2 else [value]
            data = np.frombuffer(raw, np.float32) if raw else np.asarray(floats, np.float32)
            weights[name] = data.reshape(dims).copy()
    return weights
