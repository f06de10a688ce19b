"""Host-side timing shared by the benchmark scripts (run them as `python benchmarks/<script>.py`)."""

from __future__ import annotations

import time
from typing import Callable, Optional


def best_us(fn: Callable[[], object], iterations: int, *, repeats: int = 7, warmup: Optional[int] = None,
            sync: Optional[Callable[[], object]] = None) -> float:
    """Microseconds per call of ``fn``: the best of ``repeats`` batches of ``iterations`` back-to-back calls.

    ``warmup`` untimed calls come first (default ``max(1, iterations // 10)``). ``sync`` (e.g.
    ``torch.cuda.synchronize``), when given, runs after the warm-up and at the end of each batch, inside its
    timing, so that asynchronous work is counted.
    """
    for _ in range(max(1, iterations // 10) if warmup is None else warmup):
        fn()
    if sync:
        sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        if sync:
            sync()
        best = min(best, (time.perf_counter_ns() - start) / 1e3 / iterations)
    return best
