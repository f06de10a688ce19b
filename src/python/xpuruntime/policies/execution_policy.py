"""ExecutionPolicy: precision, determinism, CUDA graphs, shapes, memory limits, threads."""

from __future__ import annotations

from .. import _core
from ._serializable import SerializablePolicy

_FIELDS = ("precision", "deterministic", "cuda_graphs", "static_shape", "workspace_limit", "memory_limit",
           "intra_op_threads", "fallback", "tensor_parallel", "allow_newer_opsets")


class ExecutionPolicy(SerializablePolicy, _core.ExecutionPolicy):
    """How a run executes, apart from which kernel runs each op.

    Parameters
    ----------
    precision : {"fp32", "tf32", "fp16", "bf16", "int8"}
        Default ``"fp32"``. ``tf32`` lets fp32 GEMMs and convolutions use TF32 tensor cores; ``fp16``/``bf16``
        make a session convert weights and activations at build time; ``int8`` only where a kernel supports it.
    deterministic : bool
        Only kernels that give the same bits run after run. Default False.
    cuda_graphs : bool
        Capture a session's plan into a CUDA graph and replay it. Default True.
    static_shape : bool
        Reject inputs whose shapes differ from the first run's. Default False.
    workspace_limit, memory_limit : int or str
        Bytes (``268435456`` or ``"256MiB"``); 0 = library default / no cap. Default 0.
    intra_op_threads : int
        CPU threads; 0 = all cores. Default 0.
    fallback : {"error", "cpu"}
        A CUDA session's nodes that no CUDA kernel can run: ``"error"`` (default) refuses the model at session
        creation listing every such node; ``"cpu"`` runs them on the CPU with the copies listed in
        ``explain().transfers`` (and no CUDA graph).
    tensor_parallel : int
        Shard a native session's model over this many ranks (1 to 64; default 1): on ``cuda:d`` the GPUs
        ``cuda:d`` .. ``cuda:d+N-1`` through NCCL, on the CPU N ranks of the host communicator. Transformer blocks'
        GEMMs become column/row-parallel with an all-reduce after each row-parallel GEMM; ``explain()`` lists the
        sharding (docs/distributed.md).
    allow_newer_opsets : bool
        Run a model whose IR version or ONNX opset is newer than the ONNX schemas xpuruntime knows, each operator
        with the newest semantics xpuruntime knows of it. Default False: such a model raises
        ``UnsupportedOperationError`` naming the opset and a node (docs/reliability.md).
    """

    _core_class = _core.ExecutionPolicy

    def __init__(self, **kwargs: object) -> None:
        super().__init__()
        for key, value in kwargs.items():
            if key not in _FIELDS:
                raise _core.InvalidArgumentError(
                    f"unknown ExecutionPolicy field '{key}'; valid fields: {', '.join(sorted(_FIELDS))}")
            if key in ("deterministic", "cuda_graphs", "static_shape", "allow_newer_opsets") and \
                    not isinstance(value, bool):
                raise _core.InvalidArgumentError(f"ExecutionPolicy '{key}' must be True or False, got {value!r}")
            setattr(self, key, value)

    def to_dict(self) -> dict:
        return {field: getattr(self, field) for field in _FIELDS}
