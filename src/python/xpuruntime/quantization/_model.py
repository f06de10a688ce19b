"""ONNX model plumbing for quantization: loading, hashing, node keys, the opset upgrade (through the C++ one),
float8/int4 value conversions, and the runner of calibration and evaluation runs.

Everything here reads an ``onnx.ModelProto`` with the ``onnx`` Python package; the QDQ model itself is written by
the C++ ``apply_quantization`` (src/cpp/frontends/onnx/onnx_quantize.cpp). The package installed may be older
than the opsets the quantized models use (Debian 12 ships onnx 1.12, which knows opset 17 and neither float8 nor
4-bit types), so nothing here relies on ``onnx.checker``, on shape inference of the output, or on
``TensorProto``'s newer enum names: element types are written as their integer codes (Note [Element type codes]).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from .. import _core

ModelLike = Union[str, Path, bytes, bytearray, memoryview, "onnx.ModelProto"]  # noqa: F821

# Note [Element type codes]
# TensorProto.DataType codes written by the quantizer. TensorProto.data_type and TypeProto.Tensor.elem_type are
# int32 fields, so an onnx package that predates float8 (1.14) and int4 (1.16) still stores these codes.
FLOAT = 1
UINT8 = 2
INT8 = 3
INT32 = 6
FLOAT8E4M3FN = 17
INT4 = 22

DTYPE_NAMES = {FLOAT: "float32", UINT8: "uint8", INT8: "int8", INT32: "int32", FLOAT8E4M3FN: "float8e4m3fn",
               INT4: "int4"}

# The IR version each default-domain opset needs (ONNX's versioning table).
_IR_FOR_OPSET = [(21, 10), (19, 9), (15, 8), (13, 7), (11, 6), (10, 5), (9, 4), (7, 3)]


def onnx_module():
    """The ``onnx`` package; UnsupportedOperationError naming what to install when it is missing."""
    try:
        import onnx
    except ImportError:
        raise _core.UnsupportedOperationError("xpuruntime.quantization edits models with the onnx Python package; "
                                              "install it (Debian: python3-onnx, or pip install onnx)") from None
    return onnx


def load_model(model: ModelLike):
    """A private copy of ``model`` (a path, serialized bytes or an ``onnx.ModelProto``) as a ModelProto; external
    data is loaded into it."""
    onnx = onnx_module()
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    if isinstance(model, (bytearray, memoryview)):
        model = bytes(model)
    if isinstance(model, bytes):
        out = onnx.ModelProto()
        try:
            out.ParseFromString(model)
        except Exception as error:  # protobuf's DecodeError
            raise _core.InvalidArgumentError(f"model: the bytes are not a serialized ONNX model ({error})") from None
        return out
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise _core.InvalidArgumentError(f"model: '{model}' is not a file")
        try:
            return onnx.load(str(path))
        except Exception as error:
            raise _core.InvalidArgumentError(f"model: cannot read '{model}' as an ONNX model ({error})") from None
    raise _core.InvalidTypeError(f"model must be a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def serialize(model) -> bytes:
    """The model's bytes. Deterministic for one protobuf library: the quantizer's replay guarantee rests on it."""
    return model.SerializeToString(deterministic=True)


def model_sha256(model) -> str:
    return hashlib.sha256(serialize(model)).hexdigest()


def node_key(node, index: int) -> str:
    """How quantization names a node: its name, or ``<op_type>_<index>`` for an unnamed one (index in the graph)."""
    return node.name or f"{node.op_type}_{index}"


def default_opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def ensure_opset(model, needed: int, why: str) -> int:
    """Makes the model's default-domain import at least ``needed`` and its IR version what that opset requires, in
    place; returns the import's version afterwards. The C++ ``upgrade_opset`` does it (Note [Opset upgrades the
    quantizer makes] in src/cpp/frontends/onnx/onnx_quantize.cpp), the one implementation the QDQ writer uses too.
    InvalidArgumentError naming the blocking ops when the upgrade could change the model's meaning."""
    if default_opset(model) >= needed:
        return default_opset(model)
    data, version = _core.upgrade_opset(serialize(model), needed, why)
    model.ParseFromString(data)
    return int(version)


# ---- quantized values ----------------------------------------------------------------------------------------


def pack_int4(values: np.ndarray) -> bytes:
    """ONNX's 4-bit packing: the flattened tensor two elements a byte, the first in the low nibble, an odd count
    padded with a zero nibble."""
    flat = np.asarray(values, dtype=np.int8).reshape(-1).astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()


def unpack_int4(data: bytes, count: int) -> np.ndarray:
    """The inverse of :func:`pack_int4`: ``count`` signed 4-bit values as int8."""
    raw = np.frombuffer(data, dtype=np.uint8)
    nibbles = np.empty(raw.size * 2, np.uint8)
    nibbles[0::2] = raw & 0x0F
    nibbles[1::2] = raw >> 4
    values = nibbles[:count].astype(np.int8)
    return np.where(values > 7, values - 16, values).astype(np.int8)


# Note [float8e4m3fn encoding]
# E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, 0x7F/0xFF are NaN, 448 the largest
# finite value. Codes 0..126 are the non-negative finite values in increasing order, so rounding to the nearest
# code is a search in that table; a tie goes to the even code (round half to even, as QuantizeLinear does), and
# values beyond 448 saturate (QuantizeLinear-19's default saturate=1).
def _e4m3_table() -> np.ndarray:
    codes = np.arange(127)
    exponent, mantissa = codes >> 3, codes & 7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent.astype(np.float64) - 7.0)
    subnormal = (mantissa / 8.0) * 2.0 ** -6
    return np.where(exponent == 0, subnormal, normal)


_E4M3_VALUES = _e4m3_table()
E4M3_MAX = float(_E4M3_VALUES[-1])  # 448


def float_to_e4m3(values: np.ndarray) -> np.ndarray:
    """float32 -> float8e4m3fn codes (uint8), round to nearest even, saturating (Note [float8e4m3fn encoding])."""
    x = np.asarray(values, dtype=np.float64)
    a = np.minimum(np.abs(x), E4M3_MAX)
    upper = np.clip(np.searchsorted(_E4M3_VALUES, a, side="left"), 0, 126)
    lower = np.maximum(upper - 1, 0)
    d_up = _E4M3_VALUES[upper] - a
    d_low = a - _E4M3_VALUES[lower]
    pick_up = (d_up < d_low) | ((d_up == d_low) & (upper % 2 == 0))
    code = np.where(pick_up, upper, lower).astype(np.uint8)
    code = np.where(np.signbit(x), code | 0x80, code)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


def e4m3_to_float(codes: np.ndarray) -> np.ndarray:
    """float8e4m3fn codes -> float32."""
    c = np.asarray(codes, dtype=np.uint8)
    magnitude = c & 0x7F
    out = np.where(magnitude == 0x7F, np.nan, _E4M3_VALUES[np.minimum(magnitude, 126)])
    return np.where(c & 0x80, -out, out).astype(np.float32)


def initializer_map(graph) -> Dict[str, object]:
    return {init.name: init for init in graph.initializer}


def to_array(initializer) -> np.ndarray:
    """A float initializer as a numpy array (the onnx package's own conversion)."""
    from onnx import numpy_helper

    return numpy_helper.to_array(initializer)


def graph_input_names(graph) -> List[str]:
    """The model's real inputs: graph inputs that no initializer backs."""
    inits = {i.name for i in graph.initializer}
    return [vi.name for vi in graph.input if vi.name not in inits]


def declared_shape(value_info) -> Optional[List[object]]:
    """A value's declared shape: ints for fixed dims, strings (or None) for symbolic ones; None when no shape."""
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def elem_type(value_info) -> int:
    return int(value_info.type.tensor_type.elem_type)


def ordered_unique(items: Sequence[str]) -> List[str]:
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """Left-aligned text columns: the header, a rule, the rows."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


class Runner:
    """Runs a model on the session engine (``_core.InferenceSession``: this package sits below
    ``xpuruntime.inference``, whose InferenceSession quantizes through it) and returns numpy arrays."""

    def __init__(self, model_bytes: bytes, device: object, engine: str) -> None:
        self._session = _core.InferenceSession(model_bytes, device, engine, None, None, False, [], "", "")

    def run(self, names: Sequence[str], feed: Dict[str, np.ndarray]) -> List[np.ndarray]:
        """The outputs ``names`` (every output when empty) as numpy arrays."""
        names = list(names) or [o.name for o in self._session.get_outputs()]
        values = self._session._run_values(feed, names, None)
        return [v if isinstance(v, np.ndarray) else v.to("cpu").numpy() for v in values]

