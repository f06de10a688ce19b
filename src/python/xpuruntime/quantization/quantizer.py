"""Post-training quantization: a float ONNX model -> a QDQ model, through decisions that replay exactly.

:func:`quantize` works in two steps (Note [Decisions, then the model]):

1. :func:`plan` chooses what to quantize and how: the nodes (by op type, minus the exclude list), the activations'
   scales from calibration, the weights' scales from their values; all of it in one JSON-serializable dict, the
   *decisions*.
2. :func:`apply_decisions` writes the QDQ model from the float model and the decisions alone, through the C++
   ``apply_quantization`` (include/xpuruntime/quantization.h), which a C++ session with the decisions in its
   ExecutionPolicy runs too.

Quantizing with calibration data and replaying the decisions later run the same second step, so they give the same
bytes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from . import _model
from .calibration import Calibration, check_method, collect_ranges

FORMAT = "xpuruntime.quantization/1"
PRECISIONS = ("int8", "fp8", "int4-weights")
ACTIVATION_TYPES = ("int8", "uint8")

# The op types each precision quantizes by default, and those it can quantize when asked (op_types=...).
DEFAULT_OP_TYPES = {"int8": ("Conv", "Gemm", "MatMul"), "fp8": ("Conv", "Gemm", "MatMul"),
                    "int4-weights": ("Gemm", "MatMul")}
SUPPORTED_OP_TYPES = {"int8": ("Add", "Concat", "Conv", "Gemm", "MatMul", "Mul"),
                      "fp8": ("Add", "Concat", "Conv", "Gemm", "MatMul", "Mul"),
                      "int4-weights": ("Gemm", "MatMul")}
# The default-domain opset each precision's QDQ form needs (Note [Opset upgrades the quantizer makes]).
OPSET_NEEDED = {"int8": 13, "fp8": 19, "int4-weights": 21}

INT8_WEIGHT_MAX = 127.0   # symmetric weights use [-127, 127], so -w quantizes to -q
INT4_WEIGHT_MAX = 7.0


# ---- the roles of a node's inputs ----------------------------------------------------------------------------


def _input_roles(node) -> List[Tuple[int, str]]:
    """``[(slot, role)]`` of a quantizable node: ``"activation"``, ``"weight"`` (per-channel capable) or
    ``"bias"``. Which weights are constant is decided later: a non-constant "weight" is quantized as an
    activation."""
    op = node.op_type
    n = len(node.input)
    if op == "Conv":
        return [(0, "activation"), (1, "weight")] + ([(2, "bias")] if n > 2 and node.input[2] else [])
    if op == "Gemm":
        return [(0, "activation"), (1, "weight")] + ([(2, "bias")] if n > 2 and node.input[2] else [])
    if op == "MatMul":
        return [(0, "activation"), (1, "weight")]
    return [(i, "activation") for i in range(n) if node.input[i]]


def _attr(node, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _weight_axes(node, rank: int) -> Tuple[int, int]:
    """``(output-channel axis, reduction axis)`` of the weight input of Conv, Gemm or MatMul."""
    if node.op_type == "Conv":
        return 0, 1
    if node.op_type == "Gemm":
        return (0, 1) if _attr(node, "transB", 0) else (1, 0)
    return rank - 1, rank - 2  # MatMul: [..., K, N]


# ---- scales ------------------------------------------------------------------------------------------------


def _f32(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def _positive(scale: np.ndarray) -> np.ndarray:
    """Scales of all-zero tensors (or channels) become 1: any positive scale quantizes zeros to zero."""
    scale = _f32(scale)
    return np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)


def int8_weight_scales(weight: np.ndarray, axis: Optional[int]) -> np.ndarray:
    """Symmetric int8 scales of ``weight``: ``amax / 127`` per index of ``axis`` (a 1-D array), or over the whole
    tensor when ``axis`` is None (a 0-d array)."""
    w = np.abs(_f32(weight))
    if axis is None:
        return _positive(w.max() / np.float32(INT8_WEIGHT_MAX) if w.size else 1.0)
    reduce = tuple(d for d in range(w.ndim) if d != axis)
    return _positive(w.max(axis=reduce) / np.float32(INT8_WEIGHT_MAX))


def fp8_scale(amax: float) -> np.ndarray:
    return _positive(np.float32(amax) / np.float32(_model.E4M3_MAX))


def int4_block_scales(weight: np.ndarray, axis: int, block_size: int) -> np.ndarray:
    """Symmetric int4 scales, one per ``block_size`` consecutive elements along ``axis`` (the last block may be
    shorter): the shape of ``weight`` with ``ceil(dim / block_size)`` on ``axis``."""
    w = np.abs(_f32(weight))
    dim = w.shape[axis]
    blocks = -(-dim // block_size)
    pad = blocks * block_size - dim
    if pad:
        widths = [(0, 0)] * w.ndim
        widths[axis] = (0, pad)
        w = np.pad(w, widths)
    shape = list(w.shape)
    shape[axis:axis + 1] = [blocks, block_size]
    return _positive(w.reshape(shape).max(axis=axis + 1) / np.float32(INT4_WEIGHT_MAX))


def activation_decision(value_range, precision: str, activation_type: str) -> Dict[str, Any]:
    """Scale and zero point of one activation from its calibrated range."""
    t = float(value_range.threshold)
    entry: Dict[str, Any] = {"min": value_range.min, "max": value_range.max, "amax": value_range.amax,
                             "threshold": t}
    if precision == "fp8":
        entry.update(dtype="float8e4m3fn", scale=float(fp8_scale(t)), zero_point=0)
    elif activation_type == "int8":
        entry.update(dtype="int8", scale=float(_positive(np.float32(t) / np.float32(127.0))), zero_point=0)
    else:
        low = min(0.0, max(value_range.min, -t))
        high = max(0.0, min(value_range.max, t))
        scale = _positive(np.float32((high - low) / 255.0))
        zero_point = int(np.clip(np.rint(-low / float(scale)), 0, 255))
        entry.update(dtype="uint8", scale=float(scale), zero_point=zero_point)
    return entry


# ---- planning ------------------------------------------------------------------------------------------------


def _value_types(model) -> Dict[str, int]:
    """Element types of the model's values where known (declared, or by the onnx package's shape inference)."""
    types = {init.name: int(init.data_type) for init in model.graph.initializer}
    try:
        from onnx import shape_inference

        inferred = shape_inference.infer_shapes(model).graph
    except Exception:  # an onnx package older than the model's opset: declared types only
        inferred = model.graph
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        code = _model.elem_type(vi)
        if code:
            types.setdefault(vi.name, code)
    return types


def _constant_names(model) -> set:
    """The values quantized as weights: every initializer (also those an old IR lists among the graph inputs,
    which quantization freezes)."""
    return {init.name for init in model.graph.initializer}


# Note [Activation MatMuls stay float]
# A MatMul of two activations (attention's q @ k^T and probabilities @ v) has no weight to compress, and QDQ pairs on
# its inputs split the attention pattern that the native engine runs as one fused kernel: in BERT-base quantized with
# them (H200, batch 16, 2026-12-02) the attention ran as float16 GEMMs, a Softmax, the exporter's IsNaN/Where guard and
# head transposes, about 0.6 ms a run against 0.14 ms for the fused kernel of the float16 plan, and their 96
# QuantizeLinear/DequantizeLinear launches came on top. So by default they stay float, with this reason in the
# decisions' `excluded` (a replay keeps them float too); `activation_matmuls=True` (CLI `--activation-matmuls`)
# quantizes them as ONNX Runtime's quantize_static does. A MatMul counts as one of two activations when neither input
# is computed from constants alone (a Transpose or Cast of a weight is still a weight).
ACTIVATION_MATMUL_REASON = ("both inputs are activations (attention's batched MatMul): left float so that the "
                            "attention runs fused (activation_matmuls=True quantizes it)")


def _constant_derived(model, constants: set) -> set:
    """The values computed from constants alone: the initializers, Constant nodes' outputs, and the outputs of nodes
    whose every input is one of them (graph order is topological)."""
    derived = set(constants)
    for node in model.graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant" or (inputs and all(name in derived for name in inputs)):
            derived.update(name for name in node.output if name)
    return derived


def _resolve_exclude(model, exclude: Iterable[str]) -> Tuple[set, set]:
    """Splits the exclude list into node keys and op types; InvalidArgumentError for an entry that is neither."""
    if isinstance(exclude, str):
        exclude = [exclude]
    keys = {_model.node_key(n, i) for i, n in enumerate(model.graph.node)}
    ops = {n.op_type for n in model.graph.node}
    by_key, by_op = set(), set()
    for entry in exclude or ():
        if not isinstance(entry, str):
            raise _core.InvalidTypeError(f"exclude: entries are node names or op types (str), got {entry!r}")
        if entry in keys:
            by_key.add(entry)
        elif entry in ops:
            by_op.add(entry)
        else:
            raise _core.InvalidArgumentError(
                f"exclude: '{entry}' is neither a node name nor an op type of the model (unnamed nodes are "
                f"'<op_type>_<index>'); its nodes: {', '.join(sorted(keys)[:20])}")
    return by_key, by_op


def _check_options(precision: str, activation_type: str, op_types: Optional[Sequence[str]],
                   block_size: int) -> Tuple[str, ...]:
    if precision not in PRECISIONS:
        raise _core.InvalidArgumentError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if activation_type not in ACTIVATION_TYPES:
        raise _core.InvalidArgumentError(
            f"activation_type must be one of {', '.join(ACTIVATION_TYPES)}, got {activation_type!r}")
    if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
        raise _core.InvalidArgumentError(f"block_size must be a power of two >= 16, got {block_size!r}")
    if op_types is None:
        return DEFAULT_OP_TYPES[precision]
    if isinstance(op_types, str):
        op_types = [op_types]
    bad = [o for o in op_types if o not in SUPPORTED_OP_TYPES[precision]]
    if bad:
        raise _core.InvalidArgumentError(f"op_types: {', '.join(bad)} cannot be quantized to {precision}; "
                                         f"supported: {', '.join(SUPPORTED_OP_TYPES[precision])}")
    return tuple(sorted(set(op_types)))


def plan(model, calibration: Calibration = None, *, precision: str = "int8", method: Optional[str] = None,
         percentile: float = 99.99, num_bins: int = 2048, activation_type: str = "int8",
         per_channel: Optional[bool] = None, quantize_bias: bool = False, exclude: Iterable[str] = (),
         op_types: Optional[Sequence[str]] = None, block_size: int = 32, device: Any = "cpu", engine: str = "auto",
         max_batches: Optional[int] = None, activation_matmuls: bool = False) -> Dict[str, Any]:
    """The decisions of :func:`quantize` for ``model`` (a ModelProto, not modified); see there for the arguments."""
    op_types = _check_options(precision, activation_type, op_types, block_size)
    if method is None:
        method = "entropy" if precision == "int8" else "minmax"
    check_method(method, percentile, num_bins)
    if per_channel is None:
        per_channel = precision == "int8"
    graph = model.graph
    excluded_keys, excluded_ops = _resolve_exclude(model, exclude)
    constants = _constant_names(model)
    inits = _model.initializer_map(graph)
    types = _value_types(model)
    from_constants = _constant_derived(model, constants)

    nodes: List[str] = []
    excluded: Dict[str, str] = {}
    activations: List[str] = []
    weights: Dict[str, Dict[str, Any]] = {}
    biases: Dict[str, Tuple[str, str, str]] = {}  # bias -> (node key, activation, weight)
    for index, node in enumerate(graph.node):
        if node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
            continue
        key = _model.node_key(node, index)
        if key in excluded_keys or node.op_type in excluded_ops:
            excluded[key] = "exclude list"
            continue
        if (node.op_type == "MatMul" and not activation_matmuls and precision != "int4-weights"
                and not any(name in from_constants for name in node.input)):
            excluded[key] = ACTIVATION_MATMUL_REASON
            continue
        reason, node_acts, node_weights, node_bias = _plan_node(node, precision, per_channel, block_size, constants,
                                                                inits, types, weights)
        if reason:
            excluded[key] = reason
            continue
        nodes.append(key)
        activations.extend(node_acts)
        weights.update(node_weights)
        if node_bias and quantize_bias and precision == "int8":
            biases[node_bias[0]] = (key, node_bias[1], node_bias[2])

    activations = _model.ordered_unique(activations)
    decisions: Dict[str, Any] = {
        "format": FORMAT, "precision": precision,
        "method": method if precision != "int4-weights" else None,
        "percentile": float(percentile) if method == "percentile" else None,
        "num_bins": num_bins if method == "entropy" else None,
        "activation_type": ("float8e4m3fn" if precision == "fp8" else activation_type)
        if precision != "int4-weights" else None,
        "per_channel": bool(per_channel) if precision != "int4-weights" else None,
        "block_size": block_size if precision == "int4-weights" else None,
        "quantize_bias": bool(quantize_bias) and precision == "int8",
        "op_types": list(op_types), "opset": max(_model.default_opset(model), OPSET_NEEDED[precision]),
        "model_sha256": _model.model_sha256(model), "nodes": nodes, "excluded": excluded,
        "activations": {}, "weights": weights, "biases": {},
    }
    if activations:
        ranges = collect_ranges(model, activations, calibration, method=method, percentile=percentile,
                                num_bins=num_bins, device=device, engine=engine, max_batches=max_batches)
        decisions["activations"] = {name: activation_decision(ranges[name], precision, activation_type)
                                    for name in activations}
    for bias, (key, activation, weight) in biases.items():
        x_scale = np.float32(decisions["activations"][activation]["scale"])
        w_scale = _f32(weights[weight]["scale"])
        decisions["biases"][bias] = {"dtype": "int32", "axis": 0 if w_scale.ndim else None,
                                     "scale": _floats(x_scale * w_scale)}
    return decisions


def _floats(array: np.ndarray) -> Any:
    """float32 values as JSON numbers (a Python float holds a float32 exactly, so they round-trip)."""
    a = _f32(array)
    return float(a) if a.ndim == 0 else [float(v) for v in a.reshape(-1)]


def _plan_node(node, precision: str, per_channel: bool, block_size: int, constants: set, inits: Mapping[str, Any],
               types: Mapping[str, int], weights: Mapping[str, Dict[str, Any]]):
    """``(reason not quantized or "", activations, weight decisions, (bias, activation, weight) or None)``."""
    acts: List[str] = []
    new_weights: Dict[str, Dict[str, Any]] = {}
    bias = None
    activation_of_node = weight_of_node = None
    for slot, role in _input_roles(node):
        name = node.input[slot]
        code = types.get(name)
        if role == "bias":
            if name in constants and code == _model.FLOAT and len(inits[name].dims) == 1:
                bias = name
            continue
        if code is not None and code != _model.FLOAT:
            type_name = _model.DTYPE_NAMES.get(code, f"element type {code}")
            return f"input '{name}' is {type_name}, not float32", [], {}, None
        if name in constants:
            w = _model.to_array(inits[name])
            if role == "weight" and w.ndim >= 2:
                channel_axis, reduction_axis = _weight_axes(node, w.ndim)
                entry = _weight_decision(w, precision, per_channel, channel_axis, reduction_axis, block_size)
            elif precision == "int4-weights":
                return f"input '{name}' is a constant of rank {w.ndim}; int4 blocks need a weight of rank >= 2", \
                    [], {}, None
            else:
                entry = _weight_decision(w, precision, False, 0, 0, block_size)
            previous = weights.get(name) or new_weights.get(name)
            if previous is not None and previous.get("axis") != entry.get("axis"):
                return f"weight '{name}' is shared with a node that quantizes it along another axis", [], {}, None
            new_weights[name] = entry
            if role == "weight":
                weight_of_node = name
        elif precision == "int4-weights":
            if role == "weight":
                return f"weight '{name}' is not a constant (int4-weights quantizes initializers only)", [], {}, None
        else:
            acts.append(name)
            if slot == 0:
                activation_of_node = name
    if precision == "int4-weights" and not new_weights:
        return "no constant weight", [], {}, None
    if bias is not None and (activation_of_node is None or weight_of_node is None):
        bias = None
    return "", acts, new_weights, (bias, activation_of_node, weight_of_node) if bias else None


def _weight_decision(w: np.ndarray, precision: str, per_channel: bool, channel_axis: int, reduction_axis: int,
                     block_size: int) -> Dict[str, Any]:
    if precision == "int4-weights":
        scale = int4_block_scales(w, reduction_axis, block_size)
        return {"dtype": "int4", "axis": reduction_axis, "block_size": block_size, "scale_shape": list(scale.shape),
                "scale": _floats(scale)}
    if precision == "fp8":
        magnitude = np.abs(_f32(w))
        if per_channel and w.ndim >= 2:
            reduce = tuple(d for d in range(w.ndim) if d != channel_axis)
            scale = _positive(magnitude.max(axis=reduce) / np.float32(_model.E4M3_MAX))
            return {"dtype": "float8e4m3fn", "axis": channel_axis, "scale": _floats(scale)}
        return {"dtype": "float8e4m3fn", "axis": None,
                "scale": _floats(fp8_scale(float(magnitude.max()) if w.size else 0.0))}
    if per_channel and w.ndim >= 2:
        return {"dtype": "int8", "axis": channel_axis, "scale": _floats(int8_weight_scales(w, channel_axis))}
    return {"dtype": "int8", "axis": None, "scale": _floats(int8_weight_scales(w, None))}


# ---- writing the QDQ model -----------------------------------------------------------------------------------


# The QDQ model is written by the C++ apply_quantization (Note [Decisions, then the model] in
# src/cpp/frontends/onnx/onnx_quantize.cpp), the one writer: a C++ InferenceSession whose ExecutionPolicy carries the
# decisions builds the same model.
def apply_decisions(model, decisions: Mapping[str, Any], *, skip_nodes: Iterable[str] = ()) -> Any:
    """The QDQ model of ``model`` (a ModelProto, not modified) under ``decisions``; nodes in ``skip_nodes`` stay
    float (the sensitivity analysis uses that)."""
    _check_decisions(decisions)
    text = json.dumps(decisions, default=lambda v: v.item() if isinstance(v, np.generic) else str(v))
    data = _core.apply_quantization(_model.serialize(_model.load_model(model)), text, [str(k) for k in skip_nodes])
    return _model.load_model(data)


def _check_decisions(decisions: Any) -> None:
    if not isinstance(decisions, Mapping):
        raise _core.InvalidTypeError(f"decisions must be a dict (QuantizationResult.decisions, or its JSON), got "
                                     f"{type(decisions).__name__}")
    if decisions.get("format") != FORMAT:
        raise _core.InvalidArgumentError(f"decisions: format {decisions.get('format')!r} is not {FORMAT!r}")
    if decisions.get("precision") not in PRECISIONS:
        raise _core.InvalidArgumentError(f"decisions: precision {decisions.get('precision')!r} is not one of "
                                         f"{', '.join(PRECISIONS)}")
    for key in ("nodes", "activations", "weights", "biases", "excluded"):
        if key not in decisions:
            raise _core.InvalidArgumentError(f"decisions: '{key}' is missing")


# ---- the public entry point ----------------------------------------------------------------------------------


class QuantizationResult:
    """What :func:`quantize` made: the QDQ ``model`` (an ``onnx.ModelProto``), the ``decisions`` (a JSON-serializable
    dict that ``quantize(model, decisions=...)`` replays into the same bytes) and the ``path`` it was saved to."""

    def __init__(self, model: Any, decisions: Dict[str, Any], path: Optional[str] = None) -> None:
        self.model = model
        self.decisions = decisions
        self.path = path

    def to_bytes(self) -> bytes:
        """The serialized QDQ model (deterministic)."""
        return _model.serialize(self.model)

    def save(self, path: Union[str, Path]) -> None:
        """Writes the QDQ model to ``path``."""
        Path(path).write_bytes(self.to_bytes())
        self.path = str(path)

    def decisions_json(self, indent: Optional[int] = 1) -> str:
        """The decisions as JSON text (``json.loads`` of it replays as the dict does)."""
        return json.dumps(self.decisions, indent=indent, sort_keys=True)

    def save_decisions(self, path: Union[str, Path]) -> None:
        Path(path).write_text(self.decisions_json() + "\n", encoding="utf-8")

    @property
    def quantized_nodes(self) -> List[str]:
        return list(self.decisions["nodes"])

    @property
    def excluded(self) -> Dict[str, str]:
        """Nodes of a quantizable op type left in float, with the reason."""
        return dict(self.decisions["excluded"])

    def summary(self) -> str:
        """A few lines: precision, method, nodes quantized and left float (with why), values and their scales."""
        _table = _model.table
        d = self.decisions
        lines = [f"precision {d['precision']}" + (f", method {d['method']}" if d.get("method") else "")
                 + f", opset {d['opset']}: {len(d['nodes'])} nodes quantized, {len(d['excluded'])} left float"]
        for key, reason in d["excluded"].items():
            lines.append(f"  float: {key} ({reason})")
        rows = [[name, e["dtype"], f"{e['scale']:.6g}", str(e["zero_point"]), f"{e['min']:.4g}", f"{e['max']:.4g}",
                 f"{e['threshold']:.4g}"] for name, e in d["activations"].items()]
        if rows:
            lines += ["  " + line for line in _table(["activation", "dtype", "scale", "zero point", "min", "max",
                                                      "threshold"], rows)]
        rows = [[name, e["dtype"], "per-tensor" if e.get("axis") is None else
                 (f"blocks of {e['block_size']} on axis {e['axis']}" if e.get("block_size") else f"axis {e['axis']}"),
                 str(np.size(e["scale"]))] for name, e in d["weights"].items()]
        if rows:
            lines += ["  " + line for line in _table(["weight", "dtype", "scales", "count"], rows)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        d = self.decisions
        where = f" path={self.path!r}" if self.path else ""
        return (f"<QuantizationResult {d['precision']} nodes={len(d['nodes'])} excluded={len(d['excluded'])} "
                f"activations={len(d['activations'])} weights={len(d['weights'])}{where}>")


def load_decisions(decisions: Union[Mapping[str, Any], str, Path, "QuantizationResult"]) -> Dict[str, Any]:
    """Decisions from a dict, a QuantizationResult, JSON text or a JSON file."""
    if isinstance(decisions, QuantizationResult):
        return decisions.decisions
    if isinstance(decisions, Path) or (isinstance(decisions, str) and not decisions.lstrip().startswith("{")):
        path = Path(decisions)
        if not path.is_file():
            raise _core.InvalidArgumentError(f"decisions: '{decisions}' is not a file")
        decisions = path.read_text(encoding="utf-8")
    if isinstance(decisions, str):
        try:
            decisions = json.loads(decisions)
        except ValueError as error:
            raise _core.InvalidArgumentError(f"decisions: not valid JSON ({error})") from None
    _check_decisions(decisions)
    return copy.deepcopy(dict(decisions))


def quantize(model: Any, calibration: Calibration = None, *, precision: str = "int8", method: Optional[str] = None,
             percentile: float = 99.99, num_bins: int = 2048, activation_type: str = "int8",
             per_channel: Optional[bool] = None, quantize_bias: bool = False, exclude: Iterable[str] = (),
             op_types: Optional[Sequence[str]] = None, block_size: int = 32, device: Any = "cpu",
             engine: str = "auto", max_batches: Optional[int] = None, decisions: Any = None,
             check_model: bool = True, output_path: Optional[Union[str, Path]] = None,
             activation_matmuls: bool = False) -> QuantizationResult:
    """Post-training quantization of a float ONNX model into a QDQ model (docs/quantization.md).

    Parameters
    ----------
    model : str, Path, bytes or onnx.ModelProto
        The float32 model (not modified).
    calibration : dict, iterable of dicts, callable or reader
        Representative feeds (input name -> numpy array): one dict, an iterable of them, a callable returning
        either, or an object with ``get_next()`` (ONNX Runtime's CalibrationDataReader). Needed for ``int8`` and
        ``fp8``; ``int4-weights`` needs none.
    precision : {"int8", "fp8", "int4-weights"}
        ``int8``: QuantizeLinear/DequantizeLinear pairs (opset 13+) on the inputs of Conv, Gemm and MatMul, weights
        symmetric int8 per output channel. ``fp8``: the same in float8e4m3fn (opset 19+), per-tensor scales
        ``amax / 448``. ``int4-weights``: weight-only, int4 weights in blocks along the reduction axis dequantized
        by DequantizeLinear-21 in front of MatMul/Gemm; activations stay float.
    method : {"minmax", "percentile", "entropy"}
        How activation ranges are chosen from calibration; default ``"entropy"`` for int8, ``"minmax"`` for fp8.
    percentile : float
        The percentile of activation magnitudes kept by ``method="percentile"`` (default 99.99).
    num_bins : int
        Histogram bins of the percentile and entropy methods (default 2048).
    activation_type : {"int8", "uint8"}
        int8 activations symmetric (zero point 0, TensorRT's form; default) or asymmetric uint8.
    per_channel : bool
        Weight scales per output channel (Conv axis 0, MatMul/Gemm the output-channel axis, ``transB`` considered).
        Default True for int8, False for fp8.
    quantize_bias : bool
        int8 only: Conv/Gemm biases become int32 with scale ``x_scale * w_scale`` (default False: they stay float).
    exclude : list of str
        Node names (``<op_type>_<index>`` for unnamed nodes) or op types to keep in float.
    op_types : list of str
        The op types to quantize (default Conv, Gemm, MatMul; int8/fp8 also take Add, Mul, Concat).
    activation_matmuls : bool
        Also quantize MatMuls whose two inputs are activations (attention's batched products). Default False: they
        stay float (listed in ``excluded`` with the reason) so that the attention can run as one fused kernel.
    block_size : int
        int4 block size along the reduction axis (default 32).
    device, engine : str
        Where the calibration runs of the float model go (default the CPU, engine ``"auto"``).
    max_batches : int, optional
        Use at most this many calibration feeds.
    decisions : dict, QuantizationResult, JSON text or file, optional
        Replay earlier decisions instead of calibrating: the same model bytes as the run that made them (the
        decisions carry every option, so give none of the others).
    check_model : bool
        With ``decisions``: refuse a model whose hash differs from the one the decisions were made for (default
        True).
    output_path : str or Path, optional
        Also save the QDQ model there.

    Returns
    -------
    QuantizationResult
        ``.model`` (ModelProto), ``.decisions`` (dict), ``.to_bytes()``, ``.save(path)``, ``.summary()``.

    Raises
    ------
    InvalidArgumentError
        A bad argument (named in the message), a calibration feed that does not fit the model, an exclude entry
        that names no node, an opset that cannot be upgraded safely.
    """
    float_model = _model.load_model(model)
    if decisions is not None:
        if calibration is not None:
            raise _core.InvalidArgumentError("calibration and decisions: give one of them (decisions replay "
                                             "earlier calibration)")
        chosen = load_decisions(decisions)
        if precision != "int8" and precision != chosen["precision"]:
            raise _core.InvalidArgumentError(f"precision={precision!r} but the decisions are for "
                                             f"{chosen['precision']!r}")
        if check_model and chosen.get("model_sha256") != _model.model_sha256(float_model):
            raise _core.InvalidArgumentError(
                "decisions: they were made for another model (sha256 "
                f"{str(chosen.get('model_sha256'))[:12]}..., this one is {_model.model_sha256(float_model)[:12]}...);"
                " pass check_model=False to apply them anyway")
    else:
        chosen = plan(float_model, calibration, precision=precision, method=method, percentile=percentile,
                      num_bins=num_bins, activation_type=activation_type, per_channel=per_channel,
                      quantize_bias=quantize_bias, exclude=exclude, op_types=op_types, block_size=block_size,
                      device=device, engine=engine, max_batches=max_batches, activation_matmuls=activation_matmuls)
        # The JSON round trip makes a fresh run and a replay start from identical values.
        chosen = json.loads(json.dumps(chosen))
    result = QuantizationResult(apply_decisions(float_model, chosen), chosen)
    if output_path is not None:
        result.save(output_path)
    return result
