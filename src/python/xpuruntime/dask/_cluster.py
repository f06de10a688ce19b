"""A local Dask cluster of one worker process per GPU, each pinned to its GPU by CUDA_VISIBLE_DEVICES (what
dask_cuda's LocalCUDACluster does, without needing dask_cuda)."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from distributed import Nanny, Scheduler, SpecCluster

from .. import _core


def gpu_worker_spec(gpus: Sequence[int], threads_per_worker: int = 1, **worker_options: Any) -> dict:
    """The SpecCluster worker specs of one Nanny-supervised worker process per GPU of ``gpus`` (indices among the
    GPUs this process sees): each gets ``CUDA_VISIBLE_DEVICES`` of its one GPU (the physical id when this process's
    own ``CUDA_VISIBLE_DEVICES`` renumbers them), a ``GPU: 1`` resource, and is named ``gpu-<index>``."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    specs = {}
    for gpu in gpus:
        if visible and not 0 <= gpu < len(visible):
            raise _core.InvalidArgumentError(f"GPU {gpu}: this process sees {len(visible)} GPUs "
                                             f"(CUDA_VISIBLE_DEVICES={','.join(visible)})")
        options = {"nthreads": threads_per_worker, "resources": {"GPU": 1}, **worker_options}
        options["env"] = {**options.get("env", {}), "CUDA_VISIBLE_DEVICES": visible[gpu] if visible else str(gpu)}
        specs[f"gpu-{gpu}"] = {"cls": Nanny, "options": options}
    return specs


def local_gpu_cluster(gpus: Optional[Sequence[int]] = None, *, threads_per_worker: int = 1,
                      dashboard_address: Optional[str] = ":8787", **worker_options: Any) -> SpecCluster:
    """A local cluster of one worker process per GPU (default: every GPU this process sees), each pinned to its GPU
    with ``CUDA_VISIBLE_DEVICES``, so that ``ClusterSession(..., device="cuda")`` puts each worker's session on its
    own GPU. ``worker_options`` go to each :class:`distributed.Nanny` (``memory_limit``, ...). Close it (or use
    ``with``) when done. For CPU workers use ``distributed.LocalCluster(n_workers=N, threads_per_worker=1,
    processes=True)``."""
    if gpus is None:
        gpus = list(range(_core.get_device_count()))
    if not gpus:
        raise _core.UnsupportedOperationError(
            "local_gpu_cluster: no CUDA device here; for CPU workers start "
            "distributed.LocalCluster(n_workers=N, threads_per_worker=1, processes=True)")
    scheduler = {"cls": Scheduler, "options": {"dashboard": dashboard_address is not None,
                                               "dashboard_address": dashboard_address or ":0"}}
    return SpecCluster(workers=gpu_worker_spec(list(gpus), threads_per_worker, **worker_options),
                       scheduler=scheduler, name="xpuruntime-gpus")
