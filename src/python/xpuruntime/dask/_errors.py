"""The typed errors of xpuruntime.dask. They travel from a worker to the client inside Dask's task errors, so each
one pickles with its fields (``__reduce__``)."""

from __future__ import annotations

from typing import Any, Optional

from .. import _core


class BadRecordError(_core.InvalidArgumentError):
    """A record the model cannot take (a missing input, another shape, a value the model refuses).

    Attributes
    ----------
    partition : int
        The partition (array block, bag partition, DataFrame partition) that holds it, counted from 0.
    record : int or None
        The record's index inside that partition, counted from 0; None when the partition's batch failed but no
        single record did on its own.
    """

    def __init__(self, message: str, partition: int, record: Optional[int]) -> None:
        super().__init__(message)
        self.partition = partition
        self.record = record

    def __reduce__(self) -> Any:
        return (type(self), (self.args[0], self.partition, self.record))


class KernelMismatchError(_core.XpuRuntimeError):
    """Two workers resolved a model differently: another kernel, precision or rule for a node (a different GPU
    model, a different library version), or other policies.

    Attributes
    ----------
    worker : str
        The worker that differs from the reference worker.
    node : str or None
        The node whose decision differs; None when the workers' policies themselves differ.
    reference_worker : str
        The worker compared against (the first by address).
    expected, got : object
        The reference worker's decision (or policy fingerprint) and this worker's.
    """

    def __init__(self, message: str, worker: str, node: Optional[str], reference_worker: str, expected: Any,
                 got: Any) -> None:
        super().__init__(message)
        self.worker = worker
        self.node = node
        self.reference_worker = reference_worker
        self.expected = expected
        self.got = got

    def __reduce__(self) -> Any:
        return (type(self), (self.args[0], self.worker, self.node, self.reference_worker, self.expected, self.got))
