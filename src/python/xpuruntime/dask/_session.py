"""ClusterSession: one model run over Dask collections, one InferenceSession per worker (docs/distributed.md)."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import dask
import dask.array as da
import dask.bag as db
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from distributed import Client, get_client

from .. import _core
from ..policies import ExecutionPolicy, KernelPolicy
from . import _worker
from ._errors import KernelMismatchError
from ._worker import ModelSpec, SessionPlugin

PolicyArg = Union[None, str, Path, KernelPolicy, ExecutionPolicy]


def _policy_json(value: PolicyArg, cls: type, argument: str) -> str:
    """A policy as canonical JSON text: a policy object, or a policy file (JSON or YAML; ``xpuruntime tune``'s lock
    file is a KernelPolicy file) read here, on the client."""
    if value is None:
        return ""
    if isinstance(value, (str, Path)):
        if not Path(value).is_file():
            raise _core.InvalidArgumentError(f"{argument}: no policy file {str(value)!r} (give a {cls.__name__} or "
                                             "the path of its JSON or YAML file, read on the client)")
        value = cls.load(value)
    if not isinstance(value, cls._core_class):
        raise _core.InvalidTypeError(f"{argument} must be a {cls.__name__} or a policy file, got "
                                     f"{type(value).__name__}")
    if getattr(value, "calibration", None) is not None:
        raise _core.InvalidArgumentError(
            f"{argument}: an ExecutionPolicy's calibration data is not part of the policy shipped to workers; "
            "quantize once on the client (xrt.quantize) and give the decisions: "
            "ExecutionPolicy(precision=..., quantization={'decisions': result.decisions})")
    return value.to_json()


def _tail(shape: Sequence[Any]) -> Optional[tuple]:
    """A value's shape after the batch axis when every dimension is known, else None."""
    tail = tuple(shape[1:])
    return tail if all(isinstance(d, int) and d >= 0 for d in tail) else None


class ClusterSession:
    """One ONNX model run over Dask collections by the workers of a Dask cluster, each worker with one
    :class:`~xpuruntime.InferenceSession` made once and reused (Note [One session per worker, keyed by content]).

    Parameters
    ----------
    model : str, Path or bytes
        The model, read here: the workers get its bytes, not its path. Its weights must be inside the file
        (external-data files are not shipped).
    client : distributed.Client, optional
        Default: the current client (``distributed.get_client()``).
    device : str
        ``"cpu"`` (default) or ``"cuda"``: each worker's GPU, ``cuda:0`` under the ``CUDA_VISIBLE_DEVICES`` its worker
        is pinned to (:func:`local_gpu_cluster`, or ``CUDA_VISIBLE_DEVICES=i dask worker ...``).
    engine : str
        As :class:`~xpuruntime.InferenceSession` (default ``"auto"``).
    kernel_policy, exec_policy : policy or path, optional
        A :class:`~xpuruntime.KernelPolicy` / :class:`~xpuruntime.ExecutionPolicy`, or the path of its file (the lock
        file ``xpuruntime tune -o`` writes is a KernelPolicy file), read on the client and shipped as JSON.
    disabled_passes : list of str, optional
        As :class:`~xpuruntime.InferenceSession`.

    Examples
    --------
    >>> client = distributed.Client(cluster)
    >>> model = xrt.dask.ClusterSession("resnet.onnx", client, kernel_policy="policy.lock.json")
    >>> y = model.run(x)["logits"]                 # x: a dask array chunked along the batch
    >>> y.compute()
    >>> model.check_same_kernels({"pixel_values": x[:2].compute()})
    """

    def __init__(self, model: Union[str, Path, bytes], client: Optional[Client] = None, *, device: str = "cpu",
                 engine: str = "auto", kernel_policy: PolicyArg = None, exec_policy: PolicyArg = None,
                 disabled_passes: Optional[Sequence[str]] = None) -> None:
        if isinstance(model, (str, Path)):
            model = Path(model).read_bytes()
        if not isinstance(model, (bytes, bytearray, memoryview)):
            raise _core.InvalidTypeError(f"model must be a path or bytes, got {type(model).__name__}")
        if device != "cpu" and not str(device).startswith("cuda"):
            raise _core.InvalidArgumentError(f"device must be 'cpu' or 'cuda' (each worker's GPU), got {device!r}")
        self.client = client if client is not None else get_client()
        self.spec = ModelSpec(bytes(model), _policy_json(kernel_policy, KernelPolicy, "kernel_policy"),
                              _policy_json(exec_policy, ExecutionPolicy, "exec_policy"), str(engine), str(device),
                              tuple(disabled_passes or ()))
        # register_plugin since Distributed 2023.9; register_worker_plugin before (Debian 12 has 2022.12).
        register = getattr(self.client, "register_plugin", None) or self.client.register_worker_plugin
        register(SessionPlugin(self.spec), name=self.spec.plugin_name)
        # The model's signature, from one worker (which makes its session: a model error shows here, not in a task).
        info = self.client.submit(_worker.describe, self.spec.key, pure=False).result()
        self.engine: str = info["engine"]
        self._inputs: List[Dict[str, Any]] = info["inputs"]
        self._outputs: List[Dict[str, Any]] = info["outputs"]

    @property
    def key(self) -> str:
        """The SHA-256 of the model bytes and the policies: the workers' sessions are cached under it."""
        return self.spec.key

    @property
    def workers(self) -> List[str]:
        """The addresses of the cluster's workers now, sorted."""
        return sorted(self.client.scheduler_info()["workers"])

    def get_inputs(self) -> List[Dict[str, Any]]:
        """The model's inputs: dicts of name, dtype, kind, shape (symbolic dimensions as strings)."""
        return [dict(i) for i in self._inputs]

    def get_outputs(self) -> List[Dict[str, Any]]:
        """The model's outputs, as :meth:`get_inputs`."""
        return [dict(o) for o in self._outputs]

    def run(self, data: Any, *, columns: Optional[Mapping[str, Union[str, Sequence[str]]]] = None) -> Any:
        """Runs the model over ``data``; the result is a lazy Dask collection in ``data``'s order.

        - a dask array chunked along axis 0 (the batch): the model's one input; returns ``{output name: dask
          array}`` with the same batch chunks;
        - a dict of input name -> dask array: one feed per block (rechunked to the first array's batch chunks);
          returns the same;
        - a dask bag of records (dicts of input name -> one record's value, no batch axis): each partition runs as
          one batch; returns a bag of dicts of output name -> that record's output, with the record's other keys
          copied over;
        - a dask DataFrame: each partition runs as one batch, inputs from columns (``columns``, or by name: the
          column ``x`` for input ``x`` of shape ``[batch]``/``[batch, 1]``, else the columns ``x_0 .. x_{k-1}``
          reshaped to the input's shape); returns a DataFrame on the same index and divisions, each output a column
          ``y`` (one value per row) or columns ``y_0 .. y_{k-1}`` (flattened after the batch axis).

        A record the model refuses fails the computation with :class:`~xpuruntime.dask.BadRecordError` naming the
        partition and the record. Outputs must keep the batch axis first.
        """
        import dask.dataframe as dd

        if isinstance(data, da.Array):
            if len(self._inputs) != 1:
                raise _core.InvalidArgumentError(f"the model has {len(self._inputs)} inputs "
                                                 f"({[i['name'] for i in self._inputs]}): give a dict of arrays")
            return self._run_arrays({self._inputs[0]["name"]: data})
        if isinstance(data, Mapping):
            return self._run_arrays(dict(data))
        if isinstance(data, db.Bag):
            return self._run_bag(data)
        if isinstance(data, dd.DataFrame):
            return self._run_frame(data, columns or {})
        raise _core.InvalidTypeError(f"run() takes a dask array, a dict of dask arrays, a dask bag of records or a "
                                     f"dask DataFrame, got {type(data).__name__}")

    def _output_tails(self, probe: Any) -> Dict[str, Tuple[tuple, str]]:
        """Each output's shape after the batch axis and its dtype: from the model, or when a dimension is symbolic,
        from one record run on a worker (``probe``: a callable giving the Delayed that does it)."""
        tails = {o["name"]: (_tail(o["shape"]), o["dtype"]) for o in self._outputs}
        if all(tail is not None for tail, _ in tails.values()):
            return tails
        return self.client.compute(probe()).result()

    def _run_arrays(self, arrays: Dict[str, da.Array]) -> Dict[str, da.Array]:
        inputs = {i["name"]: i for i in self._inputs}
        if set(arrays) != set(inputs):
            raise _core.InvalidArgumentError(f"feeds {sorted(arrays)} do not match the model's inputs "
                                             f"{sorted(inputs)}")
        for name, array in arrays.items():
            if not isinstance(array, da.Array) or array.ndim < 1:
                raise _core.InvalidTypeError(f"input '{name}' must be a dask array with a batch axis, got "
                                             f"{type(array).__name__}")
        names = [i["name"] for i in self._inputs]
        batch = arrays[names[0]].chunks[0]
        arrays = {name: arrays[name].astype(inputs[name]["dtype"]).rechunk(
                  {0: batch, **{axis: -1 for axis in range(1, arrays[name].ndim)}}) for name in names}
        outputs = self._output_tails(lambda: dask.delayed(_worker.probe)(self.key, {n: a[:1] for n, a in
                                                                                    arrays.items()}))
        signature = [(name, tuple(tail), dtype) for name, (tail, dtype) in outputs.items()]
        token = tokenize(self.key, [arrays[n].name for n in names])
        run_name = "xpuruntime-run-" + token
        single = len(signature) == 1   # the run's result is the output's block: no getitem task per block
        suffix = (0,) * len(signature[0][1]) if single else ()
        layers: Dict[str, Any] = {}
        dependencies: Dict[str, Any] = {}
        for array in arrays.values():
            layers.update(array.dask.layers)
            dependencies.update(array.dask.dependencies)
        layers[run_name] = {(run_name, i) + suffix: (
            _worker.run_block, self.key, i, names, signature, single,
            *[(arrays[n].name, i) + (0,) * (arrays[n].ndim - 1) for n in names]) for i in range(len(batch))}
        dependencies[run_name] = {arrays[n].name for n in names}
        if single:
            name, tail, dtype = signature[0]
            graph = HighLevelGraph(layers, dependencies)
            return {name: da.Array(graph, run_name, chunks=(batch, *[(d,) for d in tail]), dtype=dtype)}
        results = {}
        for j, (name, tail, dtype) in enumerate(signature):
            out_name = f"xpuruntime-{name}-{token}"
            graph = HighLevelGraph(
                {**layers, out_name: {(out_name, i) + (0,) * len(tail): (operator.getitem, (run_name, i), j)
                                      for i in range(len(batch))}},
                {**dependencies, out_name: {run_name}})
            results[name] = da.Array(graph, out_name, chunks=(batch, *[(d,) for d in tail]), dtype=dtype)
        return results

    def _run_bag(self, bag: db.Bag) -> db.Bag:
        parts = bag.to_delayed(optimize_graph=False)
        run = dask.delayed(_worker.run_records, pure=True)
        return db.from_delayed([run(self.key, i, part) for i, part in enumerate(parts)])

    def _frame_inputs(self, frame: Any, columns: Mapping[str, Union[str, Sequence[str]]]) -> Dict[str, Any]:
        """Input name -> (columns, shape after the batch, dtype), by the mapping run()'s docstring states."""
        inputs = {}
        unknown = set(columns) - {i["name"] for i in self._inputs}
        if unknown:
            raise _core.InvalidArgumentError(f"columns= names {sorted(unknown)}, not inputs of the model "
                                             f"({[i['name'] for i in self._inputs]})")
        for info in self._inputs:
            name, tail = info["name"], _tail(info["shape"])
            chosen = columns.get(name)
            if chosen is None:
                numbered = sorted((c for c in frame.columns if str(c).startswith(name + "_")
                                   and str(c)[len(name) + 1:].isdigit()), key=lambda c: int(str(c)[len(name) + 1:]))
                chosen = [name] if name in frame.columns else numbered
            chosen = [chosen] if isinstance(chosen, str) else list(chosen)
            missing = [c for c in chosen if c not in frame.columns]
            if not chosen or missing:
                raise _core.InvalidArgumentError(
                    f"input '{name}': no column {missing or [name]} in the DataFrame (columns {list(frame.columns)}); "
                    f"name it, or its columns {name}_0, {name}_1, ..., or map it with columns={{'{name}': [...]}}")
            if tail is None:
                if len(info["shape"]) != 2:
                    raise _core.InvalidArgumentError(f"input '{name}' has shape {info['shape']}: a DataFrame feeds "
                                                     "inputs of known shape, or of rank 2 (one row of columns)")
                tail = (len(chosen),)
            if int(np.prod(tail)) != len(chosen):
                raise _core.InvalidArgumentError(f"input '{name}' takes {int(np.prod(tail))} values per row (shape "
                                                 f"{info['shape']}), got {len(chosen)} columns {chosen}")
            inputs[name] = (chosen, tail, info["dtype"])
        return inputs

    def _run_frame(self, frame: Any, columns: Mapping[str, Union[str, Sequence[str]]]) -> Any:
        import dask.dataframe as dd
        import pandas as pd

        inputs = self._frame_inputs(frame, columns)
        tails = self._output_tails(lambda: dask.delayed(_worker.probe_frame)(
            self.key, frame.head(1, npartitions=-1, compute=False).to_delayed()[0], inputs))
        outputs = {}
        for name, (tail, dtype) in tails.items():
            size = int(np.prod(tail))
            names = [name] if size == 1 else [f"{name}_{j}" for j in range(size)]
            outputs[name] = (names, dtype)
        meta = pd.DataFrame({c: np.zeros(0, dtype) for names, dtype in outputs.values() for c in names},
                            index=frame._meta.index)
        run = dask.delayed(_worker.run_frame, pure=True)
        parts = [run(self.key, i, part, inputs, outputs) for i, part in enumerate(frame.to_delayed())]
        return dd.from_delayed(parts, meta=meta, divisions=frame.divisions, verify_meta=False)

    def explain(self, worker: Optional[str] = None) -> Dict[str, Any]:
        """A worker's explanation of its session (``Explanation.to_json()`` as a dict: engine, nodes with their
        kernels, ...), with ``worker`` and ``policy_sha256`` (of the policies it was made with); with no ``worker``,
        ``{address: that}`` for every worker."""
        addresses = [worker] if worker is not None else self.workers
        futures = {w: self.client.submit(_worker.explain_worker, self.key, workers=[w], allow_other_workers=False,
                                         pure=False) for w in addresses}
        results = {w: f.result() for w, f in futures.items()}
        return results[worker] if worker is not None else results

    def check_same_kernels(self, feeds: Mapping[str, Any]) -> Dict[str, Dict[str, str]]:
        """Checks that every worker resolves the model the same way: each worker makes a new session as its own,
        runs ``feeds`` (a small batch of numpy arrays) and reports every node's kernel, backend, precision and rule;
        they must equal the first worker's, and so must the fingerprints of the policies they were made with.

        Returns ``{worker: {node: kernel}}``; raises :class:`~xpuruntime.dask.KernelMismatchError` naming the
        worker and the node (or the policies) where one differs.
        """
        feeds = {name: np.asarray(value) for name, value in feeds.items()}
        futures = {w: self.client.submit(_worker.decisions_worker, self.key, feeds, workers=[w],
                                         allow_other_workers=False, pure=False) for w in self.workers}
        reports = {w: f.result() for w, f in futures.items()}
        reference_worker = min(reports)
        reference = {n["node"]: n for n in reports[reference_worker]["nodes"]}
        for worker, report in sorted(reports.items()):
            _compare_decisions(reference_worker, reference, worker, report)
            if report["policy_sha256"] != reports[reference_worker]["policy_sha256"]:
                raise KernelMismatchError(
                    f"worker {worker} made its session with other policies than worker {reference_worker} "
                    f"(policy fingerprint {report['policy_sha256'][:12]} vs "
                    f"{reports[reference_worker]['policy_sha256'][:12]})", worker, None, reference_worker,
                    reports[reference_worker]["policy_sha256"], report["policy_sha256"])
        return {w: {n["node"]: n["kernel"] for n in r["nodes"]} for w, r in reports.items()}

    def _set_worker_kernel_policy_for_tests(self, worker: str, kernel_policy: Optional[KernelPolicy]) -> None:
        """Test hook: ``worker`` makes its session with ``kernel_policy`` instead of the shipped one (None: the
        shipped one again)."""
        self.client.run(_worker.set_kernel_policy_override, self.key,
                        kernel_policy.to_json() if kernel_policy is not None else "", workers=[worker])

    def __repr__(self) -> str:
        ins = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in self._inputs)
        return f"<ClusterSession {self.key[:12]} engine={self.engine} device={self.spec.device} inputs=[{ins}]>"


def _decision(node: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: node[k] for k in ("op_type", "kernel", "backend", "precision", "rule", "policy_rule")}


def _compare_decisions(reference_worker: str, reference: Mapping[str, Mapping[str, Any]], worker: str,
                       report: Mapping[str, Any]) -> None:
    nodes = {n["node"]: n for n in report["nodes"]}
    for node in sorted(set(reference) | set(nodes)):
        expected = _decision(reference[node]) if node in reference else None
        got = _decision(nodes[node]) if node in nodes else None
        if expected != got:
            raise KernelMismatchError(
                f"worker {worker} resolved node '{node}' differently from worker {reference_worker}: {got} vs "
                f"{expected} (another GPU model or library version, or other policies)", worker, node,
                reference_worker, expected, got)
