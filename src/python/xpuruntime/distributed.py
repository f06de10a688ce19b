"""Communicators and collectives across devices (docs/distributed.md).

Two backends: ``"nccl"`` (CUDA devices, NVIDIA's NCCL loaded at run time) and ``"host"`` (CPU ranks of one
process, for sharded plans and tests on machines without a GPU). Collectives are registry ops
(``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``send``, ``recv``): they are dispatched,
explained and captured into CUDA graphs like every other op, and a session with
``ExecutionPolicy(tensor_parallel=N)`` puts them into its plans.

Examples
--------
One process driving two GPUs (one thread per rank, or NCCL's group semantics)::

    comms = xrt.distributed.init_all(["cuda:0", "cuda:1"])
    with xrt.distributed.group():
        ys = [xrt.distributed.all_reduce(x, c) for x, c in zip(xs, comms)]

One process per GPU, meeting through a folder::

    comm = xrt.distributed.init_rank(world_size=2, rank=r, device=f"cuda:{r}",
                                     store=xrt.distributed.FileStore("/tmp/rendezvous"))
    y = xrt.distributed.all_reduce(x, comm)
    comm.wait()   # at most comm.timeout seconds; DistributedTimeoutError (and an aborted comm) past it
"""

from __future__ import annotations

import contextlib
from typing import Any, List, Optional, Sequence

from . import _core
from . import ops as _ops

Communicator = _core.distributed.Communicator
FileStore = _core.distributed.FileStore
DistributedError = _core.DistributedError
DistributedTimeoutError = _core.DistributedTimeoutError

__all__ = ["Communicator", "FileStore", "DistributedError", "DistributedTimeoutError", "init_all", "init_rank",
           "group", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "nccl_available",
           "nccl_version"]


def init_all(devices: Sequence[Any], *, timeout: float = 300.0, nccl_algo: str = "",
             nccl_proto: str = "", init_timeout: Optional[float] = None) -> List[Communicator]:
    """One communicator per device of this process (rank i on ``devices[i]``): NCCL for CUDA devices, the host
    backend for CPU ranks (``["cpu"] * n``). ``timeout`` (seconds) bounds every collective's wait;
    ``init_timeout`` (seconds; default: the larger of ``timeout`` and 120) bounds the creation, NCCL's set-up and
    its connections between the ranks included; ``nccl_algo``/``nccl_proto`` set NCCL_ALGO/NCCL_PROTO for the
    communicators' creation."""
    return Communicator.init_all(list(devices), timeout, nccl_algo, nccl_proto, init_timeout or 0.0)


def init_rank(world_size: int, rank: int, device: Any, store: FileStore, *, timeout: float = 300.0,
              key: str = "xpuruntime_comm", nccl_algo: str = "", nccl_proto: str = "",
              init_timeout: Optional[float] = None) -> Communicator:
    """This process's rank of ``world_size`` on ``device`` (CUDA), meeting the other processes through ``store``
    (rank 0 publishes NCCL's unique id under ``key``). Creation waits at most ``init_timeout`` seconds for every
    rank to join (default: the larger of ``timeout`` and 120: a process that has just started spends seconds on
    imports and CUDA's initialisation); each collective then waits at most ``timeout`` seconds."""
    return Communicator.init_rank(world_size, rank, device, store, timeout, key, nccl_algo, nccl_proto,
                                  init_timeout or 0.0)


@contextlib.contextmanager
def group():
    """NCCL group semantics: collectives of several ranks issued by one thread inside the block launch together
    when it ends (needed when one thread drives several GPUs)."""
    _core.distributed.group_start()
    try:
        yield
    finally:
        _core.distributed.group_end()


def _attrs(comm: Communicator, **extra) -> dict:
    attrs = {"comm": comm.handle}
    attrs.update(extra)
    return attrs


def all_reduce(x, comm: Communicator, op: str = "sum", *, stream=None, out=None, policy=None, exec_policy=None):
    """``op`` (sum, prod, max, min, avg) over the ranks' ``x``; same shape as ``x``."""
    return _ops._single("all_reduce", [x], _attrs(comm, op=op), policy, exec_policy, stream, False, out)


def all_gather(x, comm: Communicator, *, stream=None, out=None, policy=None, exec_policy=None):
    """The ranks' ``x`` stacked along axis 0: shape ``[comm.size * x.shape[0], ...]``."""
    return _ops._single("all_gather", [x], _attrs(comm), policy, exec_policy, stream, False, out)


def reduce_scatter(x, comm: Communicator, op: str = "sum", *, stream=None, out=None, policy=None,
                   exec_policy=None):
    """This rank's part (axis 0 split in ``comm.size`` parts) of ``op`` over the ranks' ``x``."""
    return _ops._single("reduce_scatter", [x], _attrs(comm, op=op), policy, exec_policy, stream, False, out)


def broadcast(x, comm: Communicator, root: int = 0, *, stream=None, out=None, policy=None, exec_policy=None):
    """``x`` of rank ``root`` on every rank (the other ranks' ``x`` gives only shape and dtype)."""
    return _ops._single("broadcast", [x], _attrs(comm, root=root), policy, exec_policy, stream, False, out)


def send(x, comm: Communicator, peer: int, *, stream=None, policy=None, exec_policy=None) -> None:
    """Sends ``x`` to rank ``peer`` (which calls :func:`recv`)."""
    _ops.call("send", [x], _attrs(comm, peer=peer), policy=policy, exec_policy=exec_policy, stream=stream)


def recv(like, comm: Communicator, peer: int, *, stream=None, out=None, policy=None, exec_policy=None):
    """The tensor rank ``peer`` sends; ``like`` gives its shape and dtype (its data is not read)."""
    return _ops._single("recv", [like], _attrs(comm, peer=peer), policy, exec_policy, stream, False, out)


def nccl_available() -> bool:
    """Whether NCCL communicators can be made here (see :func:`nccl_unavailable_reason`)."""
    return bool(_core.distributed.nccl_available()[0])


def nccl_unavailable_reason() -> Optional[str]:
    """Why NCCL cannot be used here, or None."""
    ok, why = _core.distributed.nccl_available()
    return None if ok else why


def nccl_version() -> str:
    """The loaded NCCL's version ("2.28.3"), or "" when it cannot be loaded."""
    return _core.distributed.nccl_version()
