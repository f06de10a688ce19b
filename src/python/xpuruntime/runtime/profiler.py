"""The profiler: which node ran which kernel, for how long, and what the allocators did meanwhile.

While a :class:`Profiler` records, the runtime collects

- ``"session"`` events: every ``InferenceSession.run`` (engine, device, input shapes) and every run of a native-engine
  plan;
- ``"node"`` events: every step of the native engine, host-timed, with the kernel, backend, precision and the
  dispatcher's reason, the input/output shapes and the bytes they hold; and every node ONNX Runtime runs for a
  session with ``engine="onnxruntime"``, from ORT's own profile of that run (op type, execution provider as backend,
  ORT's timing), next to an ``"onnxruntime run"`` session event;
- on CUDA (CUPTI): ``"kernel"``, ``"memcpy"``, ``"memset"`` and ``"sync"`` events, each kernel, copy and set linked to
  the node that launched it (``parent``);
- ``"alloc"`` events from the allocators (allocation and free, bytes, the running allocated bytes);
- ``"range"`` events: your own ranges (:meth:`Profiler.range`), also NVTX ranges for Nsight Systems.

Examples
--------
>>> import xpuruntime as xrt
>>> with xrt.profile() as p:
...     sess.run(feeds)
...     with p.range("second run"):
...         sess.run(feeds)
>>> print(p.summary_table())
>>> p.export_chrome_trace("trace.json")      # open in https://ui.perfetto.dev or chrome://tracing

A profile ONNX Runtime wrote elsewhere (onnxruntime used directly, ``enable_profiling``) is added with
:func:`merge_ort_profile` (or :meth:`Profiler.merge_ort_profile`).

See docs/profiling.md for what is recorded where, and how kernels are tied to nodes.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Union

from .. import _core

__all__ = ["Profiler", "profile", "is_profiling", "merge_ort_profile"]

PathLike = Union[str, "os.PathLike[str]"]


def _range_name(within: Any) -> str:
    """``within`` of :meth:`Profiler.summary` checked: a range name (InvalidTypeError otherwise)."""
    if not isinstance(within, str):
        raise _core.InvalidTypeError(f"within must be a range name (str), got {type(within).__name__}")
    return within


class Profiler:
    """Collects runtime events between :meth:`start` and :meth:`stop` (or inside a ``with`` block).

    Parameters
    ----------
    cuda : bool or None
        ``None`` (default): CUDA activity through CUPTI when a CUDA device and CUPTI are present. ``True``: CUDA
        activity, or :class:`~xpuruntime.UnsupportedOperationError` from :meth:`start` saying why it cannot be had.
        ``False``: host events only.
    record_shapes : bool
        Node and session events carry their input and output shapes (default ``True``).

    Notes
    -----
    One profiler records at a time in a process; starting a second one raises
    :class:`~xpuruntime.InvalidArgumentError`. While recording, native-engine sessions on CUDA run their steps
    eagerly instead of replaying their CUDA graph, so that every kernel is attributed to its node.
    """

    def __init__(self, cuda: Optional[bool] = None, record_shapes: bool = True) -> None:
        if cuda is not None and not isinstance(cuda, bool):
            raise _core.InvalidTypeError(f"cuda must be True, False or None, got {type(cuda).__name__}")
        self._profiler = _core.Profiler(cuda, bool(record_shapes))
        self._cuda = cuda
        self._record_shapes = bool(record_shapes)

    # ---- lifecycle ----
    def start(self) -> "Profiler":
        """Start recording (what an earlier start collected is discarded). Returns the profiler."""
        self._profiler.start()
        return self

    def stop(self) -> "Profiler":
        """Stop recording and collect the CUDA activity records. Does nothing when not recording."""
        self._profiler.stop()
        return self

    def __enter__(self) -> "Profiler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def recording(self) -> bool:
        """Whether the profiler is recording now."""
        return self._profiler.recording

    @property
    def cuda_activity(self) -> bool:
        """Whether CUDA activity (CUPTI) is, or was, collected."""
        return self._profiler.cuda_activity

    @property
    def cuda_activity_reason(self) -> str:
        """Why CUDA activity is not collected (empty when it is)."""
        return self._profiler.cuda_activity_reason

    def range(self, name: str) -> "_core.ProfilerRange":
        """A user range, for a ``with`` block: a ``"range"`` event while recording, and an NVTX range."""
        if not isinstance(name, str):
            raise _core.InvalidTypeError(f"range name must be a str, got {type(name).__name__}")
        return _core.ProfilerRange(name)

    # ---- results ----
    def events(self) -> List[Dict[str, Any]]:
        """Every event, by start time: dicts with ``name``, ``cat``, ``ts_us`` (since start), ``dur_us``, ``pid``,
        ``tid``, ``id``, ``parent`` (the node event that launched a kernel/copy/set, else None), ``device`` and
        ``args`` (node, op_type, kernel, backend, precision, reason, input_shapes, output_shapes, bytes, ...)."""
        return self._profiler.events()

    def summary(self, within: str = "") -> List[Dict[str, Any]]:
        """One dict per node, by total time (descending): ``node``, ``op_type``, ``op`` (the registry op),
        ``kernel``, ``backend``, ``precision``, ``reason`` (why the kernel was chosen), ``device``,
        ``device_kernels`` (CUDA kernel names), ``calls``, ``total_us``, ``mean_us``, ``share`` (of all nodes' time,
        0..1) and ``bytes`` (what its inputs and outputs hold, over all calls). Times are device times where CUPTI
        saw the node's kernels, else host times.

        The roofline of each node (docs/profiling.md, "Roofline audit"), over all calls: ``flops``,
        ``floor_bytes``, ``ceiling`` (the peak its FLOPs run against: ``"fp16"``, ..., ``"vector"``; ``""`` for
        views), ``floor_us`` (max(bytes / bandwidth, FLOPs / peak) on :meth:`ceilings`), ``bound`` (``"memory"``
        or ``"compute"``), ``efficiency`` (floor / time), ``lost_share`` (share * (1 - efficiency)) and
        ``flagged`` (over 2% of the run at under 50% of its floor).

        ``within``: only the node events that start inside a range of that name (:meth:`range`; the generation
        loop's ``"generation prefill"`` and ``"generation decode"``), shares of their time; empty: every node."""
        return self._profiler.summary(_range_name(within))

    def audit(self, top: int = 0) -> List[Dict[str, Any]]:
        """The roofline audit: :meth:`summary` rows that have a floor, the run time furthest from it first (by
        ``lost_share``); ``top`` 0: every row."""
        if not isinstance(top, int) or isinstance(top, bool) or top < 0:
            raise _core.InvalidArgumentError(f"top must be an int >= 0, got {top!r}")
        return self._profiler.audit(top)

    def set_ceilings(self, device: str = "cpu", **figures: float) -> "Profiler":
        """Override the roofline's ceilings of ``device`` (``"cpu"``, ``"cuda"`` or one ``"cuda:N"``) for this
        profiler's summaries: ``bandwidth`` (copy bandwidth, read + write bytes per second) and peaks in FLOP/s
        (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``, ``int8``, ``fp64``, ``vector``). Figures not given stay
        measured (or as the ``XPURT_ROOFLINE_CPU`` / ``XPURT_ROOFLINE_CUDA`` environment variables set them).

        >>> p.set_ceilings("cuda", bandwidth=4.23e12, fp16=727e12)
        """
        for key, value in figures.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _core.InvalidTypeError(f"ceiling {key} must be a number, got {type(value).__name__}")
        self._profiler.set_ceilings(str(device), {k: float(v) for k, v in figures.items()})
        return self

    def ceilings(self, device: str = "cpu") -> Dict[str, Any]:
        """The ceilings the roofline uses for ``device``: ``bandwidth`` (bytes/s), ``peaks`` (FLOP/s by key) and
        ``source`` (how each figure was had: measured, the architecture table, or an override). Measured once
        per process on first use."""
        return self._profiler.ceilings(str(device))

    def summary_table(self, max_rows: int = 0, within: str = "") -> str:
        """:meth:`summary` as a text table (``max_rows`` 0: every node; ``within`` as for :meth:`summary`)."""
        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 0:
            raise _core.InvalidArgumentError(f"max_rows must be an int >= 0, got {max_rows!r}")
        return self._profiler.summary_table(max_rows, _range_name(within))

    @property
    def memory(self) -> Dict[str, Any]:
        """Allocator activity while profiling: ``allocations``, ``frees``, ``allocated_bytes``, ``freed_bytes``,
        ``peak_bytes`` (the most bytes allocated at once on one device), and the same per device under
        ``devices``."""
        return self._profiler.memory()

    @property
    def metadata(self) -> Dict[str, str]:
        """Facts about the profile (``cuda_activity``, ``cuda_graphs``, ``cupti_dropped``, ...)."""
        return dict(self._profiler.metadata)

    def chrome_trace(self) -> Dict[str, Any]:
        """The trace in the Chrome trace format, as a dict (``traceEvents``, ``displayTimeUnit``, ``metadata``)."""
        return json.loads(self._profiler.chrome_trace())

    def export_chrome_trace(self, path: PathLike) -> str:
        """Write the Chrome trace JSON to ``path`` (Perfetto and chrome://tracing open it). Returns the path."""
        if not isinstance(path, (str, os.PathLike)):
            raise _core.InvalidTypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        path = os.fspath(path)
        self._profiler.export_chrome_trace(path)
        return path

    def merge_ort_profile(self, path: PathLike, *, offset_us: Optional[float] = None,
                          start_time_ns: Optional[int] = None) -> Dict[str, Any]:
        """Add the profile ONNX Runtime wrote to ``path`` to this (stopped) profile.

        Its node events become ``"node"`` events (``backend``: the execution provider) in :meth:`events`,
        :meth:`summary` and the Chrome trace; its ``model_run`` events become ``"onnxruntime run"`` session events.
        Sessions with ``engine="onnxruntime"`` need none of this: their runs are mapped while recording. This is for
        profiles from onnxruntime used directly.

        Parameters
        ----------
        path : str or os.PathLike
            The JSON file ONNX Runtime wrote (``SessionOptions.enable_profiling`` / ``end_profiling()``, or a
            run-level profile).
        offset_us : float, optional
            Place ORT's events at ``ts + offset_us`` microseconds after this profiler started.
        start_time_ns : int, optional
            When ORT's profiling started, in ns since the Unix epoch (onnxruntime's
            ``InferenceSession.get_profiling_start_time_ns()``); compared with ``metadata["start_time_unix_ns"]``.
            With neither option, ORT's ``model_run`` events are paired in order with this profile's
            ``"session run (onnxruntime)"`` events.

        Returns
        -------
        dict
            ``node_events``, ``session_events`` (added), ``skipped`` (ORT events of other kinds, left out) and
            ``alignment`` (how they were placed, in words).

        Raises
        ------
        InvalidArgumentError
            While recording, when the file cannot be read or is not an ORT profile, or when nothing tells where its
            events belong (pass ``offset_us`` or ``start_time_ns``).
        """
        return self._profiler.merge_ort_profile(_path(path, "path"), _offset(offset_us), _start(start_time_ns))

    def __repr__(self) -> str:
        state = "recording" if self.recording else "stopped"
        cuda = "auto" if self._cuda is None else str(self._cuda)
        return f"<Profiler {state} cuda={cuda} record_shapes={self._record_shapes} events={len(self.events())}>"


def profile(cuda: Optional[bool] = None, record_shapes: bool = True) -> Profiler:
    """A :class:`Profiler`, not yet started: use it as ``with xrt.profile() as p:`` or call ``p.start()``.

    Parameters are those of :class:`Profiler`.
    """
    return Profiler(cuda=cuda, record_shapes=record_shapes)


def is_profiling() -> bool:
    """Whether a profiler is recording in this process."""
    return bool(_core.profiler_active())


def merge_ort_profile(trace: Union[Profiler, Dict[str, Any], PathLike], ort_json: PathLike, *,
                      offset_us: Optional[float] = None, start_time_ns: Optional[int] = None,
                      output: Optional[PathLike] = None) -> Dict[str, Any]:
    """Merge a profile ONNX Runtime wrote (``ort_json``) into an xpuruntime trace.

    Parameters
    ----------
    trace : Profiler, dict or str or os.PathLike
        A stopped :class:`Profiler` (merged into it: :meth:`Profiler.merge_ort_profile`), a Chrome trace as
        :meth:`Profiler.chrome_trace` returns it (updated in place), or the path of a trace
        :meth:`Profiler.export_chrome_trace` wrote (rewritten, or written to ``output``).
    ort_json : str or os.PathLike
        The JSON file ONNX Runtime wrote.
    offset_us, start_time_ns
        Where ORT's events go on the trace's timeline, as in :meth:`Profiler.merge_ort_profile`.
    output : str or os.PathLike, optional
        With a trace path: write the merged trace here instead of over ``trace``.

    Returns
    -------
    dict
        ``node_events``, ``session_events``, ``skipped`` and ``alignment``, as :meth:`Profiler.merge_ort_profile`.

    Examples
    --------
    >>> import onnxruntime as ort                               # ONNX Runtime used directly
    >>> so = ort.SessionOptions(); so.enable_profiling = True
    >>> ort_sess = ort.InferenceSession("model.onnx", so)
    >>> with xrt.profile() as p:
    ...     ort_sess.run(None, feeds)
    >>> merge_ort_profile(p, ort_sess.end_profiling(), start_time_ns=ort_sess.get_profiling_start_time_ns())
    """
    if output is not None and not isinstance(trace, (str, os.PathLike)):
        raise _core.InvalidArgumentError("output is for a trace given as a path; a Profiler or a dict is merged in "
                                         "place")
    if isinstance(trace, Profiler):
        return trace.merge_ort_profile(ort_json, offset_us=offset_us, start_time_ns=start_time_ns)
    ort_path = _path(ort_json, "ort_json")
    if isinstance(trace, dict):
        merged, added = _core.merge_ort_profile_into_chrome_trace(json.dumps(trace), ort_path, _offset(offset_us),
                                                                  _start(start_time_ns))
        trace.clear()
        trace.update(json.loads(merged))
        return added
    if isinstance(trace, (str, os.PathLike)):
        trace_path = os.fspath(trace)
        try:
            with open(trace_path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise _core.InvalidArgumentError(f"cannot read the Chrome trace '{trace_path}': {e.strerror}") from None
        merged, added = _core.merge_ort_profile_into_chrome_trace(text, ort_path, _offset(offset_us),
                                                                  _start(start_time_ns))
        target = _path(output, "output") if output is not None else trace_path
        try:
            with open(target, "w", encoding="utf-8") as f:
                f.write(merged)
        except OSError as e:
            raise _core.InvalidArgumentError(f"cannot write the merged trace to '{target}': {e.strerror}") from None
        return added
    raise _core.InvalidTypeError("trace must be a Profiler, a Chrome trace dict or the path of a trace file, got "
                                 f"{type(trace).__name__}")


def _path(value: Any, what: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise _core.InvalidTypeError(f"{what} must be a str or os.PathLike, got {type(value).__name__}")
    return os.fspath(value)


def _offset(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _core.InvalidTypeError(f"offset_us must be a number of microseconds or None, got {type(value).__name__}")
    return float(value)


def _start(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _core.InvalidTypeError(f"start_time_ns must be an int (ns since the Unix epoch) or None, got "
                                     f"{type(value).__name__}")
    return value
