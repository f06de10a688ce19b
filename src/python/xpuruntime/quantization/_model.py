"""ONNX model plumbing for quantization: loading, hashing, node keys, opset upgrades, quantized initializers, and
the runner of calibration and evaluation runs.

Everything here edits an ``onnx.ModelProto`` with the ``onnx`` Python package. The package installed may be older
than the opsets the quantized models use (Debian 12 ships onnx 1.12, which knows opset 17 and neither float8 nor
4-bit types), so nothing here relies on ``onnx.checker``, on shape inference of the output, or on
``TensorProto``'s newer enum names: element types are written as their integer codes (Note [Element type codes]).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

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


# Note [Opset upgrades the quantizer makes]
# QDQ needs QuantizeLinear-13 (per-axis scales) for int8, -19 for float8 and -21 for int4 blocks. A model whose
# default-domain import is older gets the newer import only when every default-domain op of its graph means the same
# under both: _SEMANTIC_CHANGES lists, per op, the opset versions in which a model's existing node would start to
# behave differently (an attribute becoming an input, new broadcasting, a different axis meaning). Versions that
# only add types, or add attributes, inputs and attribute values whose defaults keep the old behaviour (Resize-18's
# antialias and axes, Resize-19's half_pixel_symmetric, ScatterND-16's reduction), are absent. An op missing from
# the table, or with a change inside (old, new], blocks the upgrade: re-exporting the model at the newer opset is
# the way out, and the error says so. A few such changes are mechanical and _ADAPTERS rewrites the node instead
# (Reduce*-18 takes its axes as an input, Split-18 states num_outputs).
_SEMANTIC_CHANGES: Dict[str, Tuple[int, ...]] = {
    **{op: (6, 7) for op in ("Add", "Sub", "Mul", "Div", "Gemm")},
    **{op: (6,) for op in ("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Floor", "Ceil",
                           "Reciprocal", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Cast")},
    **{op: (7,) for op in ("Pow", "Equal", "Less", "Greater", "And", "Or", "Xor")},
    **{op: () for op in ("MatMul", "Transpose", "Identity", "Flatten", "Gather", "Shape", "Constant", "Where",
                         "Expand", "ConstantOfShape", "Range", "GlobalAveragePool", "GlobalMaxPool", "AveragePool",
                         "MaxPool", "Erf", "Softplus", "HardSwish", "LayerNormalization", "Einsum", "Not",
                         "QuantizeLinear", "DequantizeLinear", "MatMulInteger", "Gelu", "GreaterOrEqual",
                         "LessOrEqual", "IsNaN", "IsInf", "GatherElements", "GatherND", "ScatterND",
                         "ScatterElements", "CumSum", "Sin", "Cos", "Mod", "NonZero", "Sign", "Round", "CastLike",
                         "Size", "Trilu", "OneHot", "DepthToSpace", "SpaceToDepth", "Celu", "Mish", "If", "Loop",
                         "LpNormalization")},
    "Conv": (11,), "ConvTranspose": (11,), "Concat": (4,), "Reshape": (5,), "Softmax": (13,), "LogSoftmax": (13,),
    "Dropout": (7, 10, 12), "InstanceNormalization": (6,), "GroupNormalization": (21,), "Scan": (8, 9),
    "BatchNormalization": (6, 7, 9), "Clip": (6, 11), "Squeeze": (11, 13), "Unsqueeze": (11, 13),
    "ReduceSum": (11, 13), "Pad": (2, 11), "Slice": (10,), "Split": (2, 11, 13, 18), "PRelu": (6, 7, 9),
    "Max": (6, 8), "Min": (6, 8), "Sum": (6, 8), "Mean": (6, 8), "Tile": (6,), "TopK": (10, 11),
    "ArgMax": (11,), "ArgMin": (11,), "Resize": (11, 13), "NonMaxSuppression": (10, 11),
    **{op: (11, 18) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                               "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}


def _ops_in(graph) -> Iterable:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from _ops_in(attr.g)
            for g in attr.graphs:
                yield from _ops_in(g)


def _graph_nodes(graph) -> Iterable[Tuple[object, object]]:
    """``(graph, node)`` for every node, subgraphs included."""
    for node in graph.node:
        yield graph, node
        for attr in node.attribute:
            for g in ([attr.g] if attr.g.node else []) + list(attr.graphs):
                yield from _graph_nodes(g)


def _axes_to_input(graph, node, names: "NameScope") -> None:
    """Reduce*-18: the ``axes`` attribute becomes the second input (an int64 initializer); without it the node
    reduces every axis in both versions."""
    for i, attr in enumerate(node.attribute):
        if attr.name == "axes":
            axes = np.asarray(list(attr.ints), dtype=np.int64)
            del node.attribute[i]
            name = names.fresh(f"{node.name or node.op_type}_axes")
            onnx_module()
            from onnx import numpy_helper

            graph.initializer.append(numpy_helper.from_array(axes, name))
            node.input.append(name)
            return


def _split_num_outputs(graph, node, names: "NameScope") -> None:
    """Split-18: without a ``split`` input, ``num_outputs`` must say the number of equal parts (Split-13 took it
    from the number of outputs)."""
    if len(node.input) < 2 or not node.input[1]:
        node.attribute.append(onnx_module().helper.make_attribute("num_outputs", len(node.output)))


# Opset bumps that need the node rewritten, not just read under the newer version: (op, version) -> adapter.
_ADAPTERS = {
    **{(op, 18): _axes_to_input for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
    ("Split", 18): _split_num_outputs,
}


def ensure_opset(model, needed: int, why: str) -> int:
    """Makes the model's default-domain import at least ``needed`` (Note [Opset upgrades the quantizer makes]) and
    its IR version what that opset requires; returns the import's version afterwards. InvalidArgumentError naming
    the blocking ops when the upgrade could change the model's meaning."""
    current = default_opset(model)
    if current >= needed:
        return current
    if current == 0:
        raise _core.InvalidArgumentError("model: it imports no default ONNX domain (opset_import lacks '')")
    blocking = set()
    adapt = []
    for graph, node in _graph_nodes(model.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        changes = _SEMANTIC_CHANGES.get(node.op_type)
        if changes is None:
            blocking.add(node.op_type)
            continue
        for version in (v for v in changes if current < v <= needed):
            adapter = _ADAPTERS.get((node.op_type, version))
            if adapter is None:
                blocking.add(node.op_type)
            else:
                adapt.append((adapter, graph, node))
    if blocking:
        raise _core.InvalidArgumentError(
            f"model: {why} needs ONNX opset {needed}, the model imports opset {current}, and the meaning of "
            f"{', '.join(sorted(blocking))} may differ between those opsets (or is not known to the quantizer); "
            f"re-export the model at opset {needed} or newer")
    names = NameScope(model.graph)
    for adapter, graph, node in adapt:
        adapter(graph, node, names)
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = needed
    for opset, ir in _IR_FOR_OPSET:
        if needed >= opset:
            model.ir_version = max(int(model.ir_version), ir)
            break
    return needed


# ---- quantized initializers ----------------------------------------------------------------------------------


def make_tensor(name: str, code: int, array: np.ndarray):
    """A TensorProto of element type ``code`` holding ``array`` (already in its storage form: int8/uint8/int32
    values, float8 bytes as uint8, int4 values as int8 which are packed two per byte here), raw little-endian."""
    onnx = onnx_module()
    t = onnx.TensorProto()
    t.name = name
    t.data_type = code
    t.dims.extend(int(d) for d in array.shape)
    if code == FLOAT:
        t.raw_data = np.ascontiguousarray(array, dtype="<f4").tobytes()
    elif code == INT32:
        t.raw_data = np.ascontiguousarray(array, dtype="<i4").tobytes()
    elif code in (INT8, UINT8, FLOAT8E4M3FN):
        t.raw_data = np.ascontiguousarray(array).astype(np.uint8 if code != INT8 else np.int8).tobytes()
    elif code == INT4:
        t.raw_data = pack_int4(array)
    else:
        raise _core.InvalidArgumentError(f"internal: no storage for element type {code}")
    return t


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


class NameScope:
    """Fresh value and node names that collide with nothing in the graph (nor with each other)."""

    def __init__(self, graph) -> None:
        self.used = set()
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            self.used.add(vi.name)
        for init in graph.initializer:
            self.used.add(init.name)
        for node in _ops_in(graph):
            self.used.add(node.name)
            self.used.update(node.input)
            self.used.update(node.output)

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


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


def consumers(graph) -> Dict[str, List[Tuple[int, int]]]:
    """value name -> [(node index, input slot)] over the graph's top-level nodes."""
    out: Dict[str, List[Tuple[int, int]]] = {}
    for i, node in enumerate(graph.node):
        for slot, name in enumerate(node.input):
            if name:
                out.setdefault(name, []).append((i, slot))
    return out


def subgraph_inputs(graph) -> set:
    """Names that subgraphs (If/Loop/Scan bodies) of top-level nodes read from the outer scope."""
    names = set()
    for node in graph.node:
        for attr in node.attribute:
            for g in ([attr.g] if attr.g.node else []) + list(attr.graphs):
                for inner in _ops_in(g):
                    names.update(inner.input)
    return names


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

