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


def torch_graph(fn: Callable[[], object], calls: int = 1):
    """A ``torch.cuda.CUDAGraph`` of ``calls`` calls of ``fn``, captured the way torch.cuda.graph requires: three
    warm-up calls on a side stream first. Returns the graph (``graph.replay()`` runs it)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph
