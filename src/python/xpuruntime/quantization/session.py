"""``ExecutionPolicy(precision="int8", calibration=...)``: quantize at session creation, cached on disk.

:class:`~xpuruntime.InferenceSession` calls :func:`prepare_session_model` before it hands the model to the engine.
When the policy carries ``calibration`` (feeds) or ``quantization`` (options for :func:`~xpuruntime.quantize`, or
``{"decisions": ...}`` to replay), the decisions are made here (calibration, cached: Note [Quantized-model cache])
and handed to the C++ session in its ExecutionPolicy, which applies them to the float model (the same QDQ model
:func:`~xpuruntime.quantize` writes, by the same C++ writer).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .. import _core
from . import _model
from .calibration import iterate_feeds
from .quantizer import PRECISIONS, QuantizationResult, load_decisions, quantize

# Raised whenever quantize()'s default decisions change, so that the disk cache does not serve the old ones.
PLANNER_REVISION = 2

# quantize() options a policy may carry (device and engine are the session's own).
_OPTIONS = ("method", "percentile", "num_bins", "activation_type", "per_channel", "quantize_bias", "exclude",
            "op_types", "max_batches", "decisions", "check_model", "activation_matmuls")


def cache_dir() -> Optional[Path]:
    """Where quantized models are cached: ``$XPURT_QUANTIZATION_CACHE``, else ``$XDG_CACHE_HOME/xpuruntime/
    quantized``, else ``~/.cache/xpuruntime/quantized``; None (no disk cache) when none of them can be formed.
    ``XPURT_QUANTIZATION_CACHE=off`` turns the disk cache off."""
    named = os.environ.get("XPURT_QUANTIZATION_CACHE")
    if named:
        return None if named.lower() in ("off", "0", "none") else Path(named)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "xpuruntime" / "quantized"
    home = os.environ.get("HOME")
    return Path(home) / ".cache" / "xpuruntime" / "quantized" if home else None


def _feed_digest(feeds: List[Mapping[str, Any]]) -> str:
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            value = np.ascontiguousarray(np.asarray(feed[name]))
            h.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
            h.update(value.tobytes())
    return h.hexdigest()


def policy_quantization(exec_policy: Any) -> Tuple[Any, Dict[str, Any]]:
    """``(calibration, options)`` a policy carries (``(None, {})`` when it asks for no quantization)."""
    calibration = getattr(exec_policy, "calibration", None)
    options = getattr(exec_policy, "quantization", None)
    return calibration, dict(options or {})


def check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise _core.InvalidArgumentError(f"ExecutionPolicy quantization: unknown option(s) {', '.join(unknown)}; "
                                         f"valid: {', '.join(_OPTIONS)}")


# Note [Quantized-model cache]
# The key is a hash of the float model's bytes, the options and either the calibration feeds' bytes or the decisions
# replayed, so a session made again with the same model, policy and data reads <key>.onnx and <key>.json (the
# decisions) from the cache instead of calibrating; anything that changes the result changes the key. Files are
# written to a temporary name and renamed, so a concurrent reader sees a whole file or none.
def prepare_session_model(model: Union[str, Path, bytes], exec_policy: Any, device: Any,
                          engine: str) -> Tuple[Optional[QuantizationResult], Any]:
    """``(result, policy)``: the QuantizationResult the session runs (None when the policy asks for no
    quantization) and the ExecutionPolicy to give the C++ session, which carries the result's decisions."""
    calibration, options = policy_quantization(exec_policy)
    if calibration is None and not options:
        return None, exec_policy
    check_options(options)
    precision = str(getattr(exec_policy, "precision", ""))
    if precision not in PRECISIONS:
        raise _core.InvalidArgumentError(f"ExecutionPolicy: calibration/quantization quantize the model, so precision "
                                         f"must be 'int8', 'fp8' or 'int4-weights', got {precision!r}")
    result = _decide(model, calibration, options, precision, device, engine)
    core_policy = _core.ExecutionPolicy()
    core_policy.assign(exec_policy)
    core_policy._quantization_json = json.dumps(result.decisions, sort_keys=True)
    return result, core_policy


def _decide(model: Union[str, Path, bytes], calibration: Any, options: Dict[str, Any], precision: str, device: Any,
            engine: str) -> QuantizationResult:
    """The decisions (and the QDQ model they make) of the policy's calibration or replay, from the cache when it
    holds them."""
    float_model = _model.load_model(model)
    feeds: Optional[List[Mapping[str, Any]]] = None
    h = hashlib.sha256()
    h.update(_model.model_sha256(float_model).encode())
    # The planner's defaults decide too: a cache written before they changed is not this policy's (revision 2:
    # MatMuls of two activations stay float, Note [Activation MatMuls stay float]).
    h.update(f"planner {PLANNER_REVISION}".encode())
    if precision != "int8":  # int8 keys stay those of the caches written before other precisions were taken
        h.update(precision.encode())
    h.update(json.dumps({k: v for k, v in options.items() if k != "decisions"}, sort_keys=True, default=str).encode())
    if "decisions" in options:
        options["decisions"] = load_decisions(options["decisions"])
        h.update(json.dumps(options["decisions"], sort_keys=True).encode())
    if calibration is not None:
        feeds = list(iterate_feeds(calibration, options.get("max_batches")))
        h.update(_feed_digest(feeds).encode())
    key = h.hexdigest()[:32]
    folder = cache_dir()
    if folder is not None:
        model_file, decisions_file = folder / f"{key}.onnx", folder / f"{key}.json"
        if model_file.is_file() and decisions_file.is_file():
            data = model_file.read_bytes()
            return QuantizationResult(_model.load_model(data), json.loads(decisions_file.read_text("utf-8")),
                                      str(model_file))
    result = quantize(float_model, feeds, precision=precision, device=device, engine=engine, **options)
    data = result.to_bytes()
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for path, content in ((decisions_file, (result.decisions_json() + "\n").encode()),
                                  (model_file, data)):
                tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
                tmp.write_bytes(content)
                os.replace(tmp, path)
            result.path = str(model_file)
        except OSError:
            pass  # a read-only or full cache folder costs the next session a calibration, nothing more
    return result
