"""Calibration: the ranges of a float model's activations, measured by running it on representative feeds.

The float model runs with the values to calibrate added as graph outputs, through :class:`xpuruntime.
InferenceSession` on the device and engine asked for. Each value's minimum, maximum and largest magnitude are
collected over every feed; the percentile and entropy methods then need a histogram of magnitudes over exactly
``[0, amax]``, which a second pass over the same feeds fills (Note [Two calibration passes]). The method turns that
into a threshold ``T``: activations are quantized over ``[-T, T]`` (symmetric) or ``[max(min, -T), min(max, T)]``
(asymmetric).

- ``"minmax"``: ``T`` is the largest magnitude seen.
- ``"percentile"``: ``T`` is the given percentile of the magnitudes (99.99 by default).
- ``"entropy"``: ``T`` minimises the KL divergence between the histogram clipped at ``T`` and its quantized form
  (Note [Entropy calibration]); TensorRT's default for int8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from .. import _core
from . import _model

METHODS = ("minmax", "percentile", "entropy")

FeedDict = Mapping[str, Any]
Calibration = Union[FeedDict, Iterable[FeedDict], Callable[[], Union[FeedDict, Iterable[FeedDict]]], Any]


def check_method(method: str, percentile: float, num_bins: int) -> None:
    """InvalidArgumentError naming the argument when ``method``, ``percentile`` or ``num_bins`` is not valid."""
    if method not in METHODS:
        raise _core.InvalidArgumentError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(percentile, (int, float)) or not 0.0 < float(percentile) <= 100.0:
        raise _core.InvalidArgumentError(f"percentile must be a number in (0, 100], got {percentile!r}")
    if not isinstance(num_bins, int) or num_bins < 256 or num_bins % 2:
        raise _core.InvalidArgumentError(f"num_bins must be an even integer >= 256, got {num_bins!r}")


def iterate_feeds(calibration: Calibration, max_batches: Optional[int] = None) -> Iterator[FeedDict]:
    """The feed dicts of ``calibration``: one dict; an iterable of dicts; a callable returning either (called once,
    so a generator function gives lazily made feeds); or an object with ``get_next()`` returning dicts then None
    (ONNX Runtime's ``CalibrationDataReader``). At most ``max_batches`` of them."""
    if calibration is None:
        raise _core.InvalidArgumentError("calibration: quantizing activations needs calibration feeds (or "
                                         "decisions= to replay earlier ones)")
    if hasattr(calibration, "get_next") and callable(calibration.get_next):
        def reader() -> Iterator[FeedDict]:
            while True:
                feed = calibration.get_next()
                if feed is None:
                    return
                yield feed
        source: Iterable[Any] = reader()
    else:
        if callable(calibration) and not isinstance(calibration, Mapping):
            calibration = calibration()
        source = [calibration] if isinstance(calibration, Mapping) else calibration
        if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
            raise _core.InvalidTypeError(
                f"calibration must be a feed dict (input name -> array), an iterable of them, a callable returning "
                f"either, or an object with get_next(); got {type(calibration).__name__}")
    for count, feed in enumerate(source):
        if max_batches is not None and count >= max_batches:
            return
        yield feed


class FeedChecker:
    """Checks each feed against the model's inputs before it runs: every input present, no unknown names, ranks and
    fixed dimensions equal, dtypes castable within their kind (float64 -> float32)."""

    def __init__(self, model, what: str = "calibration") -> None:
        graph = model.graph
        real = set(_model.graph_input_names(graph))
        self.inputs = [vi for vi in graph.input if vi.name in real]
        self.what = what

    def __call__(self, index: int, feed: Any) -> Dict[str, np.ndarray]:
        where = f"{self.what} feed {index}"
        if not isinstance(feed, Mapping):
            raise _core.InvalidTypeError(f"{where}: expected a dict of input name -> array, got {type(feed).__name__}")
        names = [vi.name for vi in self.inputs]
        unknown = sorted(set(feed) - set(names))
        if unknown:
            raise _core.InvalidArgumentError(f"{where}: unknown input(s) {', '.join(map(str, unknown))}; the model's "
                                             f"inputs are: {', '.join(names)}")
        missing = [n for n in names if n not in feed]
        if missing:
            raise _core.InvalidArgumentError(f"{where}: input(s) {', '.join(missing)} missing; the model's inputs "
                                             f"are: {', '.join(names)}")
        out = {}
        for vi in self.inputs:
            value = np.asarray(feed[vi.name])
            shape = _model.declared_shape(vi)
            if shape is not None:
                fits = value.ndim == len(shape) and all(not isinstance(d, int) or d == 0 or d == s
                                                        for d, s in zip(shape, value.shape))
                if not fits:
                    text = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
                    raise _core.InvalidArgumentError(f"{where}: input '{vi.name}' expects shape {text}, got "
                                                     f"{list(value.shape)}")
            code = _model.elem_type(vi)
            if code == _model.FLOAT and value.dtype != np.float32:
                if not np.can_cast(value.dtype, np.float32, casting="same_kind"):
                    raise _core.InvalidArgumentError(f"{where}: input '{vi.name}' expects float32, got {value.dtype}")
                value = value.astype(np.float32)
            out[vi.name] = np.ascontiguousarray(value)
        return out


# Note [Two calibration passes]
# The histogram of a value's magnitudes spans [0, amax] in num_bins equal bins, amax over all the feeds, so that
# thresholds mean the same whatever order the feeds come in and however many there are. The first pass measures
# min/max/amax, the second fills the histograms; the feeds are kept in memory between the passes (an iterator or a
# reader can be read once only). A histogram that grew as batches came (doubling its range and merging bins) would
# need one pass, but its resolution over [0, amax] would depend on the first batch, and the entropy search moves
# with the resolution: measurably, on the digits CNN of tests/python/test_quantization.py.
class RangeCollector:
    """The range of one value: :meth:`observe` every batch (min, max, largest magnitude), then optionally
    :meth:`accumulate` every batch again into a histogram of magnitudes over ``[0, amax]``."""

    def __init__(self, num_bins: int = 2048) -> None:
        self.num_bins = num_bins
        self.min = math.inf
        self.max = -math.inf
        self.count = 0
        self.hist: Optional[np.ndarray] = None
        self.zeros = 0  # exact zeros among the accumulated values (Note [Exact zeros in entropy calibration])

    @property
    def amax(self) -> float:
        return max(abs(self.min), abs(self.max)) if self.count else 0.0

    @staticmethod
    def _finite(value: np.ndarray) -> np.ndarray:
        x = np.asarray(value, dtype=np.float32).reshape(-1)
        return x[np.isfinite(x)]

    def observe(self, value: np.ndarray) -> None:
        x = self._finite(value)
        if x.size:
            self.count += x.size
            self.min = min(self.min, float(x.min()))
            self.max = max(self.max, float(x.max()))

    def accumulate(self, value: np.ndarray) -> None:
        """Adds ``|value|`` to the histogram (after every batch was observed; magnitudes beyond amax, which a
        different second pass could give, count in the last bin)."""
        if self.hist is None:
            self.hist = np.zeros(self.num_bins, np.int64)
        amax = self.amax
        if amax == 0.0:
            return
        a = np.minimum(np.abs(self._finite(value)), amax)
        counts, _ = np.histogram(a, bins=self.num_bins, range=(0.0, amax))
        self.hist += counts
        self.zeros += int(np.count_nonzero(a == 0))

    def threshold(self, method: str, percentile: float = 99.99, quantized_bins: int = 128) -> float:
        """The clipping threshold of ``method``: in (0, amax], or 0 when every value was 0."""
        amax = self.amax
        if method == "minmax" or self.hist is None or amax == 0.0:
            return amax
        width = amax / self.num_bins
        if method == "percentile":
            return min(percentile_threshold(self.hist, width, percentile), amax)
        hist = self.hist.copy()
        hist[0] -= self.zeros  # Note [Exact zeros in entropy calibration]
        return min(entropy_threshold(hist, width, quantized_bins), amax)


def percentile_threshold(hist: np.ndarray, width: float, percentile: float) -> float:
    """The upper edge of the first bin where the cumulative share of ``hist`` reaches ``percentile`` percent."""
    cdf = np.cumsum(hist, dtype=np.float64)
    total = cdf[-1]
    if total <= 0:
        return 0.0
    index = int(np.searchsorted(cdf, total * percentile / 100.0, side="left"))
    return (min(index, hist.size - 1) + 1) * width


# Note [Exact zeros in entropy calibration]
# Exact zeros (most of a ReLU output's values) quantize to zero exactly at every threshold, so they carry no
# information about where to clip; left in the first bin, their mass dominates P and Q alike and the KL search can
# settle on the narrowest candidate, clipping a ReLU output of the digits CNN (tests/python/test_quantization.py) at
# 6% of its range and costing 20 points of accuracy. The entropy method measures the nonzero magnitudes only; the
# percentile method keeps them (a share of all values is what a percentile means). Without the zeros, a value with
# few distinct magnitudes (the digits' 17 grey levels) has candidates whose kept bins hold one level: P is then one
# spike, the clipped values folded onto it, and Q equals it, so KL is 0 at a threshold that clips nearly everything;
# candidates that keep fewer than two occupied bins are skipped.
#
# Note [Entropy calibration]
# For each candidate threshold at the upper edge of bin i (i from `quantized_bins` to the last non-empty bin): P is
# the histogram's first i bins with everything beyond folded into bin i-1 (what clipping at the threshold does to
# the values), Q is those i bins quantized to `quantized_bins` levels: the bins split into `quantized_bins`
# contiguous groups, each group's mass spread evenly over its non-empty bins. The threshold with the least KL(P || Q)
# balances the rounding error of a wide range against the clipping error of a narrow one. A distribution that fits
# in fewer than `quantized_bins` bins is not clipped. This is the procedure TensorRT's entropy calibrator describes
# (Migacz, "8-bit Inference with TensorRT", GTC 2017), written here from that description.
def entropy_threshold(hist: np.ndarray, width: float, quantized_bins: int = 128) -> float:
    """The KL-divergence-minimising threshold of a magnitude histogram (Note [Entropy calibration])."""
    h = np.asarray(hist, dtype=np.float64)
    nonzero_bins = np.nonzero(h)[0]
    if not nonzero_bins.size:
        return 0.0
    last = int(nonzero_bins[-1]) + 1  # bins up to the last non-empty one
    if last <= quantized_bins:
        return last * width
    suffix = np.concatenate([np.cumsum(h[::-1])[::-1], [0.0]])  # suffix[i] = sum(h[i:])
    best_i, best_kl = last, math.inf
    tiny = 1e-12
    for i in range(quantized_bins, last + 1):
        kept = h[:i]
        p = kept.copy()
        p[i - 1] += suffix[i]
        group = (np.arange(i) * quantized_bins) // i
        occupied = kept > 0
        mass = np.bincount(group, weights=kept, minlength=quantized_bins)
        filled = np.bincount(group, weights=occupied, minlength=quantized_bins)
        q = np.where(occupied, mass[group] / np.maximum(filled[group], 1.0), 0.0)
        p_sum, q_sum = p.sum(), q.sum()
        if q_sum <= 0 or np.count_nonzero(kept) < 2:
            continue  # P would be one spike, equal to Q whatever the threshold: KL 0 says nothing
        p /= p_sum
        q /= q_sum
        support = p > 0
        kl = float(np.sum(p[support] * np.log(p[support] / np.maximum(q[support], tiny))))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i * width


@dataclass
class ValueRange:
    """What calibration measured of one value: ``min``, ``max``, ``amax`` and the method's ``threshold``."""

    min: float
    max: float
    amax: float
    threshold: float


def collect_ranges(model, values: Sequence[str], calibration: Calibration, *, method: str = "minmax",
                   percentile: float = 99.99, num_bins: int = 2048, device: Any = "cpu", engine: str = "auto",
                   max_batches: Optional[int] = None) -> Dict[str, ValueRange]:
    """Runs ``model`` (a float ModelProto, not modified) on every calibration feed with ``values`` as extra outputs
    and returns each value's :class:`ValueRange`. Model inputs among ``values`` are measured from the feeds. The
    percentile and entropy methods run the feeds twice (Note [Two calibration passes])."""
    check_method(method, percentile, num_bins)
    inputs = set(_model.graph_input_names(model.graph))
    augmented = _model.load_model(model)
    existing = {o.name for o in augmented.graph.output}
    onnx = _model.onnx_module()
    for name in values:
        if name not in inputs and name not in existing:
            augmented.graph.output.append(onnx.helper.make_tensor_value_info(name, _model.FLOAT, None))
            existing.add(name)
    session = _model.Runner(_model.serialize(augmented), device, engine)
    collectors = {name: RangeCollector(num_bins) for name in values}
    check = FeedChecker(model)
    wanted = [n for n in values if n not in inputs]
    two_passes = method != "minmax"

    def run(feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        got = dict(zip(wanted, session.run(wanted, feed))) if wanted else {}
        return {name: feed[name] if name in inputs else got[name] for name in values}

    kept: List[Dict[str, np.ndarray]] = []
    batches = 0
    for index, raw in enumerate(iterate_feeds(calibration, max_batches)):
        feed = check(index, raw)
        for name, value in run(feed).items():
            collectors[name].observe(value)
        if two_passes:
            kept.append(feed)
        batches += 1
    if not batches:
        raise _core.InvalidArgumentError("calibration: no feeds (the iterable was empty)")
    if two_passes:
        for feed in kept:
            for name, value in run(feed).items():
                collectors[name].accumulate(value)
    quantized_bins = 128
    return {name: ValueRange(c.min if c.count else 0.0, c.max if c.count else 0.0, c.amax,
                             c.threshold(method, percentile, quantized_bins))
            for name, c in collectors.items()}
