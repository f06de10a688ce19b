"""Streams, events and CUDA graphs.

A :class:`Stream` created here owns its CUDA stream; ``with stream:`` makes it the current stream of its
device. :class:`Event` orders streams and measures time. :class:`CudaGraph` captures work queued on a stream
and replays it; allocations made during capture come from the graph's private memory pool.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from .. import _core

Stream = _core.Stream
Event = _core.Event
CudaGraph = _core.CudaGraph
CaptureMode = _core.CaptureMode
current_stream = _core.current_stream
default_stream = _core.default_stream
set_current_stream = _core.set_current_stream
stream_priority_range = _core.stream_priority_range


@contextlib.contextmanager
def graph(
    cuda_graph: CudaGraph,
    stream: Optional[Stream] = None,
    pool: int = 0,
    mode: CaptureMode = CaptureMode.THREAD_LOCAL,
) -> Iterator[CudaGraph]:
    """Capture the work queued inside the ``with`` block into ``cuda_graph``.

    Parameters
    ----------
    cuda_graph
        The graph to capture into; replay it afterwards with ``cuda_graph.replay()``.
    stream
        The stream to capture on (default: a new stream of the current device). It becomes the current
        stream inside the block and first waits for the work already queued on the previous current stream.
    pool
        Share the private memory pool of another graph (its ``pool`` id); 0 gives the graph its own.
    mode
        How strictly CUDA rejects unsafe calls during capture.
    """
    if stream is None:
        stream = Stream(_core.get_current_device())
    previous = current_stream(stream.device)
    stream.wait_stream(previous)
    with stream:
        cuda_graph.capture_begin(stream, pool, mode)
        try:
            yield cuda_graph
        finally:
            cuda_graph.capture_end()
    previous.wait_stream(stream)
