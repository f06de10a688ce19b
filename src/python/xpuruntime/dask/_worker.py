"""What runs on a Dask worker: the model specs a plugin installs, one InferenceSession per spec and worker, and the
task functions.

Note [One session per worker, keyed by content]
-----------------------------------------------
A :class:`ModelSpec` holds the model's bytes and the policies as canonical JSON text (never a path: a worker on
another machine has no such file), and its key is the SHA-256 of all of it. :class:`SessionPlugin` carries the spec
to every worker, those that join later included (Dask's scheduler keeps worker plugins and installs them on new
workers), so the bytes travel once per worker, not once per task. The tasks name the spec by its key only; the first
task on a worker creates the session (``session_for``) and every later task of that worker reuses it. Two clients
with the same model and policies share one session per worker.

Tasks are pure functions of (key, partition index, partition): the same inputs always give the same outputs and
nothing of a task's outcome lives outside its result, so when a worker dies Dask runs its lost partitions again on
another worker and the result is the same (the same policies there: ``check_same_kernels``).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np
from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from .. import _core
from ..inference import InferenceSession
from ..policies import ExecutionPolicy, KernelPolicy
from ._errors import BadRecordError

# Errors of the run or the machine, not of a record: a batch failing with one of these is not searched for a record.
_NOT_RECORD_ERRORS = (_core.OutOfMemoryError, _core.CudaError, _core.RunTerminatedError, _core.RunTimeoutError)


@dataclass(frozen=True)
class ModelSpec:
    """A model and how to run it, as data: the ONNX bytes, the KernelPolicy and ExecutionPolicy as canonical JSON
    ("" for none), the engine, the device (``"cpu"``, or ``"cuda"``: the worker's GPU, ``cuda:0`` under the
    ``CUDA_VISIBLE_DEVICES`` its worker is pinned to) and the graph passes turned off. ``key`` is the SHA-256 of
    all of it (Note [One session per worker, keyed by content])."""

    model: bytes
    kernel_policy: str
    exec_policy: str
    engine: str
    device: str
    disabled_passes: Tuple[str, ...]
    key: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha256(self.model)
        for part in (self.kernel_policy, self.exec_policy, self.engine, self.device, *self.disabled_passes):
            digest.update(b"\0" + part.encode())
        object.__setattr__(self, "key", digest.hexdigest())

    @property
    def plugin_name(self) -> str:
        return "xpuruntime-session-" + self.key[:24]

    def __repr__(self) -> str:
        return (f"<ModelSpec {self.key[:12]} {len(self.model)} bytes engine={self.engine} device={self.device} "
                f"kernel_policy={'yes' if self.kernel_policy else 'none'} "
                f"exec_policy={'yes' if self.exec_policy else 'none'}>")


# This worker process's state (each Dask worker process imports this module once).
_LOCK = threading.Lock()
_SPECS: Dict[str, ModelSpec] = {}
_SESSIONS: Dict[str, Tuple[InferenceSession, str]] = {}   # key -> (session, policy fingerprint)
_KERNEL_POLICY_OVERRIDES: Dict[str, str] = {}             # key -> KernelPolicy JSON; tests only


class SessionPlugin(WorkerPlugin):
    """Installs a :class:`ModelSpec` on every worker (and on each worker that joins later)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.name = spec.plugin_name

    def setup(self, worker: Any) -> None:
        with _LOCK:
            _SPECS[self.spec.key] = self.spec

    def teardown(self, worker: Any) -> None:
        with _LOCK:
            _SPECS.pop(self.spec.key, None)
            _SESSIONS.pop(self.spec.key, None)

    def __repr__(self) -> str:
        return f"<SessionPlugin {self.spec!r}>"


def worker_address() -> str:
    """This worker's address, or "local" outside a worker (a task run by another scheduler)."""
    try:
        return get_worker().address
    except ValueError:
        return "local"


def _create_session(spec: ModelSpec) -> Tuple[InferenceSession, str]:
    kernel_policy = _KERNEL_POLICY_OVERRIDES.get(spec.key, spec.kernel_policy)
    fingerprint = hashlib.sha256(f"{kernel_policy}\0{spec.exec_policy}".encode()).hexdigest()
    session = InferenceSession(
        spec.model, device="cuda:0" if spec.device == "cuda" else spec.device, engine=spec.engine,
        kernel_policy=KernelPolicy.from_json(kernel_policy) if kernel_policy else None,
        exec_policy=ExecutionPolicy.from_json(spec.exec_policy) if spec.exec_policy else None,
        disabled_passes=list(spec.disabled_passes))
    return session, fingerprint


def _spec(key: str) -> ModelSpec:
    spec = _SPECS.get(key)
    if spec is None:
        raise _core.XpuRuntimeError(
            f"worker {worker_address()} has no model {key[:12]}: its SessionPlugin is not installed here (make the "
            "ClusterSession with a client of this worker's scheduler)")
    return spec


def session_for(key: str) -> Tuple[InferenceSession, str]:
    """This worker's session of the spec ``key`` and the fingerprint of the policies it was made with; made by the
    first call, reused by the others."""
    with _LOCK:
        entry = _SESSIONS.get(key)
        if entry is None:
            entry = _SESSIONS[key] = _create_session(_spec(key))
        return entry


def set_kernel_policy_override(key: str, kernel_policy: str) -> str:
    """Test hook: this worker makes the session of ``key`` with ``kernel_policy`` (JSON; "" for the spec's own again)
    instead of the spec's, from its next task on (the session it has is dropped)."""
    with _LOCK:
        if kernel_policy:
            _KERNEL_POLICY_OVERRIDES[key] = kernel_policy
        else:
            _KERNEL_POLICY_OVERRIDES.pop(key, None)
        _SESSIONS.pop(key, None)
    return worker_address()


def _value_info(info: Any) -> Dict[str, Any]:
    return {"name": info.name, "dtype": info.dtype, "kind": info.kind,
            "shape": [d if isinstance(d, int) else str(d) for d in info.shape]}


def describe(key: str) -> Dict[str, Any]:
    """The model's inputs and outputs on this worker (making its session)."""
    session, fingerprint = session_for(key)
    return {"worker": worker_address(), "engine": session.engine, "policy_sha256": fingerprint,
            "inputs": [_value_info(i) for i in session.get_inputs()],
            "outputs": [_value_info(o) for o in session.get_outputs()]}


def _to_numpy(value: Any, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "to_numpy"):
        if str(getattr(value, "dtype", "")) == "bfloat16":
            raise _core.InvalidTypeError(f"output '{name}' is bfloat16, which numpy cannot hold: run the model with an "
                                         "ExecutionPolicy whose precision keeps outputs in float32 or float16")
        return value.to_numpy()  # a device output: copied to the host for Dask
    return np.asarray(value)


def _batch_size(feeds: Mapping[str, Any]) -> int:
    return int(next(iter(feeds.values())).shape[0]) if feeds else 0


def run_batch(session: InferenceSession, feeds: Dict[str, np.ndarray], partition: int) -> Dict[str, np.ndarray]:
    """``session.run(feeds)`` with numpy outputs. When the batch fails, the records are run one by one to name the
    first one the model refuses (:class:`BadRecordError` with ``partition`` and ``record``)."""
    try:
        outputs = session.run(feeds)
    except _NOT_RECORD_ERRORS:
        raise
    except _core.XpuRuntimeError as batch_error:
        for record in range(_batch_size(feeds)):
            try:
                session.run({name: value[record:record + 1] for name, value in feeds.items()})
            except _NOT_RECORD_ERRORS:
                raise
            except _core.XpuRuntimeError as record_error:
                raise BadRecordError(f"partition {partition}, record {record}: the model refused it on worker "
                                     f"{worker_address()}: {record_error}", partition, record) from record_error
        raise BadRecordError(f"partition {partition}: its batch of {_batch_size(feeds)} records failed on worker "
                             f"{worker_address()}, though each record runs on its own: {batch_error}",
                             partition, None) from batch_error
    return {name: _to_numpy(value, name) for name, value in outputs.items()}


def run_block(key: str, partition: int, input_names: Sequence[str], outputs: Sequence[Tuple[str, tuple, str]],
              single: bool, *blocks: np.ndarray) -> Any:
    """One block of arrays chunked along the batch: the outputs ``[(name, shape after the batch, dtype)]`` in order
    as a tuple, or with ``single`` the one output itself (no task to take it out of a tuple)."""
    feeds = {name: np.ascontiguousarray(block) for name, block in zip(input_names, blocks)}
    if _batch_size(feeds) == 0:
        results = {name: np.zeros((0, *tail), dtype) for name, tail, dtype in outputs}
    else:
        results = run_batch(session_for(key)[0], feeds, partition)
    values = tuple(results[name] for name, _, _ in outputs)
    return values[0] if single else values


def _record_feeds(session: InferenceSession, records: Sequence[Any], partition: int) -> Dict[str, np.ndarray]:
    """Stacks a partition's records (dicts of input name -> one record's value) into a batch, naming the first record
    that lacks an input, does not convert to its dtype or has another shape than the partition's first record."""
    inputs = [(i.name, i.dtype) for i in session.get_inputs()]
    model_shapes = {i.name: list(i.shape[1:]) for i in session.get_inputs()}
    columns: Dict[str, List[np.ndarray]] = {name: [] for name, _ in inputs}
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise BadRecordError(f"partition {partition}, record {index}: expected a dict of input name -> value, "
                                 f"got {type(record).__name__}", partition, index)
        for name, dtype in inputs:
            if name not in record:
                raise BadRecordError(f"partition {partition}, record {index}: input '{name}' is missing (the record "
                                     f"has {sorted(map(str, record))})", partition, index)
            try:
                value = np.asarray(record[name], dtype=dtype)
            except (TypeError, ValueError) as err:
                raise BadRecordError(f"partition {partition}, record {index}: input '{name}' does not convert to "
                                     f"{dtype}: {err}", partition, index) from err
            expected = model_shapes[name]
            if len(value.shape) != len(expected) or any(isinstance(d, int) and d != n
                                                        for d, n in zip(expected, value.shape)):
                raise BadRecordError(f"partition {partition}, record {index}: input '{name}' has shape "
                                     f"{list(value.shape)}, the model takes {expected} per record",
                                     partition, index)
            first = columns[name][0] if columns[name] else value
            if value.shape != first.shape:
                raise BadRecordError(f"partition {partition}, record {index}: input '{name}' has shape "
                                     f"{list(value.shape)}, the partition's first record {list(first.shape)} (a "
                                     "partition runs as one batch)", partition, index)
            columns[name].append(value)
    return {name: np.stack(values) for name, values in columns.items()}


def run_records(key: str, partition: int, records: Sequence[Any]) -> List[Dict[str, Any]]:
    """One partition of a bag of records, run as one batch: a dict per record of its outputs, with the record's keys
    that are not model inputs (an id, say) copied over."""
    records = list(records)
    if not records:
        return []
    session, _ = session_for(key)
    outputs = run_batch(session, _record_feeds(session, records, partition), partition)
    input_names = {i.name for i in session.get_inputs()}
    results = []
    for index, record in enumerate(records):
        result = {k: v for k, v in record.items() if k not in input_names and k not in outputs}
        result.update({name: value[index] for name, value in outputs.items()})
        results.append(result)
    return results


def _frame_feed(frame: Any, name: str, columns: Sequence[str], tail: Sequence[int], dtype: str,
                partition: int) -> np.ndarray:
    try:
        values = frame[list(columns)].to_numpy(dtype=dtype)
    except (TypeError, ValueError) as err:
        for index in range(len(frame)):
            try:
                frame[list(columns)].iloc[index:index + 1].to_numpy(dtype=dtype)
            except (TypeError, ValueError):
                shown = list(columns) if len(columns) <= 4 else f"{columns[0]} .. {columns[-1]}"
                raise BadRecordError(f"partition {partition}, record {index} (index {frame.index[index]!r}): columns "
                                     f"{shown} of input '{name}' do not convert to {dtype}: {err}",
                                     partition, index) from err
        raise
    return values.reshape((len(frame), *tail))


def run_frame(key: str, partition: int, frame: Any, inputs: Mapping[str, Tuple[List[str], tuple, str]],
              outputs: Mapping[str, Tuple[List[str], str]]) -> Any:
    """One DataFrame partition: the model's inputs from its columns (``inputs``: name -> (columns, shape after the
    batch, dtype)), its outputs as columns (``outputs``: name -> (columns, dtype), the output flattened after the
    batch axis), on the partition's index."""
    import pandas as pd

    if not len(frame):
        return pd.DataFrame({column: np.zeros(0, dtype) for names, dtype in outputs.values() for column in names},
                            index=frame.index)
    session, _ = session_for(key)
    feeds = {name: _frame_feed(frame, name, cols, tail, dtype, partition)
             for name, (cols, tail, dtype) in inputs.items()}
    results = run_batch(session, feeds, partition)
    columns: Dict[str, np.ndarray] = {}
    for name, (names, _) in outputs.items():
        flat = results[name].reshape(len(frame), -1)
        columns.update({column: flat[:, j] for j, column in enumerate(names)})
    return pd.DataFrame(columns, index=frame.index)


def probe(key: str, feeds: Mapping[str, Any]) -> Dict[str, Tuple[tuple, str]]:
    """Runs one record (``feeds`` with a batch of 1 or more) to learn each output's shape after the batch axis and
    its dtype."""
    session, _ = session_for(key)
    feeds = {name: np.ascontiguousarray(np.asarray(value)[:1]) for name, value in feeds.items()}
    results = run_batch(session, feeds, 0)
    return {name: (tuple(value.shape[1:]), str(value.dtype)) for name, value in results.items()}


def probe_frame(key: str, frame: Any, inputs: Mapping[str, Tuple[List[str], tuple, str]]) -> Dict[str, Any]:
    """:func:`probe` on a DataFrame's first row."""
    feeds = {name: _frame_feed(frame.iloc[:1], name, cols, tail, dtype, 0) for name, (cols, tail, dtype) in
             inputs.items()}
    return probe(key, feeds)


def explain_worker(key: str) -> Dict[str, Any]:
    """This worker's session's explanation (as JSON), its address and its policies' fingerprint."""
    import json

    session, fingerprint = session_for(key)
    return {"worker": worker_address(), "policy_sha256": fingerprint,
            "explain": json.loads(session.explain().to_json())}


def decisions_worker(key: str, feeds: Mapping[str, Any]) -> Dict[str, Any]:
    """A new session of ``key`` (made as the worker's own) runs ``feeds`` and reports each node's decision, so that
    every worker is compared on the same run whatever shapes its own session has seen."""
    spec = _spec(key)
    with _LOCK:
        session, fingerprint = _create_session(spec)
    session.run({name: np.asarray(value) for name, value in feeds.items()})
    nodes = [{k: node.get(k, "") for k in ("node", "op_type", "op", "kernel", "backend", "precision", "rule",
                                           "policy_rule")} for node in session.explain().nodes]
    return {"worker": worker_address(), "policy_sha256": fingerprint, "engine": session.engine, "nodes": nodes}
