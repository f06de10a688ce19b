"""Batch inference over a Dask cluster (docs/distributed.md, "Batch inference over a Dask cluster").

One :class:`ClusterSession` runs a model over Dask collections (an array chunked along the batch, a dict of arrays, a
bag of records, a DataFrame) with one :class:`~xpuruntime.InferenceSession` per worker, made once and reused; the
model's bytes and its policies travel to the workers by content hash, not by path. ``explain()`` of any worker and a
check that every worker resolved the same kernels come back to the client. :func:`local_gpu_cluster` starts one
worker process per GPU.

Optional: ``import xpuruntime`` does not import Dask; importing this module needs Dask and Dask Distributed.

Examples
--------
>>> from distributed import Client, LocalCluster
>>> import xpuruntime.dask as xdask
>>> client = Client(LocalCluster(n_workers=2, threads_per_worker=1))       # or xdask.local_gpu_cluster()
>>> model = xdask.ClusterSession("model.onnx", client, kernel_policy="policy.lock.json")
>>> y = model.run(dask.array.from_array(x, chunks=(64, -1)))["y"].compute()
"""

from __future__ import annotations

try:
    import dask as _dask  # noqa: F401
    import distributed as _distributed  # noqa: F401
except ImportError as _error:
    raise ImportError(
        "xpuruntime.dask needs Dask and Dask Distributed, which are not installed: on Debian "
        "`apt-get install python3-dask python3-distributed`, or `pip install 'dask[distributed]'`") from _error

from ._cluster import gpu_worker_spec, local_gpu_cluster
from ._errors import BadRecordError, KernelMismatchError
from ._session import ClusterSession
from ._worker import ModelSpec, SessionPlugin

__all__ = ["ClusterSession", "BadRecordError", "KernelMismatchError", "ModelSpec", "SessionPlugin",
           "local_gpu_cluster", "gpu_worker_spec"]
