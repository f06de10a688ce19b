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


def graph_ms(calls, iters: int) -> float:
    """Per-call milliseconds of `calls` (callables) captured in order into one xpuruntime CUDA graph on cuda:0, median of
    `iters` replays timed by CUDA events (no host overhead in the figure)."""
    import statistics

    import xpuruntime as xrt

    for fn in calls[:2]:
        fn()  # plans, handles and allocator blocks exist before the capture
    device = xrt.Device("cuda:0")
    stream = xrt.runtime.Stream(device)
    graph = xrt.runtime.CudaGraph()
    with xrt.runtime.graph(graph, stream=stream):
        for fn in calls:
            fn()
    graph.replay(stream)
    stream.synchronize()
    times = []
    for _ in range(iters):
        begin = xrt.runtime.Event(device, enable_timing=True)
        done = xrt.runtime.Event(device, enable_timing=True)
        begin.record(stream)
        graph.replay(stream)
        done.record(stream)
        done.synchronize()
        times.append(begin.elapsed_time(done) / len(calls))
    return statistics.median(times)


def emit_table(lines: list, out: Optional[str]) -> None:
    """Prints a benchmark's table (its lines) and, with `out`, writes it there too."""
    import pathlib

    text = "\n".join(lines)
    print(text)
    if out:
        pathlib.Path(out).write_text(text + "\n")
