"""Sensitivity: which quantized nodes cost the most accuracy, measured on evaluation feeds.

The model is planned once (calibration or replayed decisions), then written and run once per quantized node:
``mode="single"`` quantizes that node alone, ``mode="exclude"`` quantizes every node but that one. Each variant's
outputs are compared with the float model's on the same feeds (cosine similarity of each output over all feeds,
the worst output counting; max and mean absolute error).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from .. import _core
from . import _model
from .calibration import Calibration, FeedChecker, iterate_feeds
from .quantizer import apply_decisions, load_decisions, plan

MODES = ("single", "exclude")


@dataclass
class SensitivityEntry:
    """One node's measurement: its ``cosine`` similarity to the float outputs (1 = same direction), ``max_abs_error``
    and ``mean_abs_error``, with only that node quantized (``mode="single"``) or only it left float
    (``"exclude"``)."""

    node: str
    op_type: str
    cosine: float
    max_abs_error: float
    mean_abs_error: float

    def __repr__(self) -> str:
        return (f"<SensitivityEntry {self.node} ({self.op_type}) cosine={self.cosine:.6f} "
                f"max_abs_error={self.max_abs_error:.4g}>")


class SensitivityReport(list):
    """:class:`SensitivityEntry` items, worst first: in ``"single"`` mode the node whose quantization alone hurts the
    most, in ``"exclude"`` mode the node whose staying float helps the most. ``baseline`` measures the model with
    every planned node quantized; ``str()`` is a table."""

    def __init__(self, entries: Iterable[SensitivityEntry], mode: str, baseline: SensitivityEntry,
                 decisions: Dict[str, Any]) -> None:
        super().__init__(entries)
        self.mode = mode
        self.baseline = baseline
        self.decisions = decisions

    def to_dict(self) -> Dict[str, Any]:
        return {"mode": self.mode, "precision": self.decisions["precision"], "baseline": asdict(self.baseline),
                "nodes": [asdict(e) for e in self]}

    def table(self) -> str:
        what = "quantized alone" if self.mode == "single" else "left float, the rest quantized"
        rows = [[e.node, e.op_type, f"{e.cosine:.6f}", f"{e.max_abs_error:.4g}", f"{e.mean_abs_error:.4g}"]
                for e in self]
        b = self.baseline
        lines = [f"sensitivity ({self.decisions['precision']}, each node {what}; worst first)"]
        lines += _model.table(["node", "op", "cosine", "max abs error", "mean abs error"], rows)
        lines.append(f"every node quantized: cosine {b.cosine:.6f}, max abs error {b.max_abs_error:.4g}, "
                     f"mean abs error {b.mean_abs_error:.4g}")
        return "\n".join(lines)

    __str__ = table

    def __repr__(self) -> str:
        return f"<SensitivityReport mode={self.mode} nodes={len(self)}>"


def output_error(outputs: Sequence[Mapping[str, np.ndarray]], reference: Sequence[Mapping[str, np.ndarray]]):
    """``(cosine, max_abs_error, mean_abs_error)`` of ``outputs`` against ``reference`` (lists of output dicts, one
    per feed): each output name's values over all feeds as one vector; the least cosine and the largest errors."""
    cosine, max_abs, total, count = 1.0, 0.0, 0.0, 0
    for name in reference[0]:
        a = np.concatenate([np.asarray(o[name], np.float64).reshape(-1) for o in outputs])
        r = np.concatenate([np.asarray(o[name], np.float64).reshape(-1) for o in reference])
        if not a.size:
            continue
        diff = np.abs(a - r)
        max_abs = max(max_abs, float(diff.max()))
        total += float(diff.sum())
        count += diff.size
        na, nr = np.linalg.norm(a), np.linalg.norm(r)
        c = 1.0 if na == 0 and nr == 0 else float(np.dot(a, r) / max(na * nr, 1e-300))
        cosine = min(cosine, c)
    return cosine, max_abs, total / max(count, 1)


def _run_all(model_bytes: bytes, feeds: Sequence[Dict[str, np.ndarray]], device: Any, engine: str):
    session = _model.Runner(model_bytes, device, engine)
    names = [o.name for o in _model.load_model(model_bytes).graph.output]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]


def sensitivity(model: Any, calibration: Calibration = None, eval_feeds: Any = None, *, precision: str = "int8",
                mode: str = "single", decisions: Any = None, device: Any = "cpu", engine: str = "auto",
                **options: Any) -> SensitivityReport:
    """Measures, node by node, what quantization costs on ``eval_feeds``.

    Parameters
    ----------
    model : str, Path, bytes or onnx.ModelProto
        The float model.
    calibration : as :func:`~xpuruntime.quantize`
        Calibration feeds (or give ``decisions`` to measure earlier decisions).
    eval_feeds : dict or iterable of dicts
        The feeds the outputs are compared on (a few batches of held-out data).
    precision : {"int8", "fp8", "int4-weights"}
    mode : {"single", "exclude"}
        ``"single"`` (default): quantize one node at a time, the rest float. ``"exclude"``: quantize all but one.
    decisions : optional
        Decisions to measure instead of planning new ones (as :func:`~xpuruntime.quantize` takes them).
    device, engine : str
        Where every variant runs (default the CPU, engine ``"auto"``).
    **options
        More :func:`~xpuruntime.quantize` options (``method``, ``exclude``, ``activation_type``, ...).

    Returns
    -------
    SensitivityReport
        Worst first; ``print(report)`` shows the table.
    """
    if mode not in MODES:
        raise _core.InvalidArgumentError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    float_model = _model.load_model(model)
    if eval_feeds is None:
        raise _core.InvalidArgumentError("eval_feeds: the feeds the outputs are compared on are needed")
    check = FeedChecker(float_model, what="eval")
    feeds = [check(i, f) for i, f in enumerate(iterate_feeds(eval_feeds))]
    if not feeds:
        raise _core.InvalidArgumentError("eval_feeds: no feeds (the iterable was empty)")
    if decisions is not None:
        chosen = load_decisions(decisions)
    else:
        chosen = plan(float_model, calibration, precision=precision, device=device, engine=engine, **options)
    reference = _run_all(_model.serialize(float_model), feeds, device, engine)
    keys = {_model.node_key(n, i): n.op_type for i, n in enumerate(float_model.graph.node)}

    def measure(node: str, skip: Sequence[str]) -> SensitivityEntry:
        variant = apply_decisions(float_model, chosen, skip_nodes=skip)
        cosine, max_abs, mean_abs = output_error(_run_all(_model.serialize(variant), feeds, device, engine),
                                                 reference)
        return SensitivityEntry(node, keys.get(node, ""), cosine, max_abs, mean_abs)

    baseline = measure("(all)", [])
    entries = []
    for node in chosen["nodes"]:
        skip = [n for n in chosen["nodes"] if n != node] if mode == "single" else [node]
        entries.append(measure(node, skip))
    if mode == "single":
        entries.sort(key=lambda e: (e.cosine, -e.max_abs_error))
    else:
        entries.sort(key=lambda e: (-e.cosine, e.max_abs_error))
    return SensitivityReport(entries, mode, baseline, chosen)
