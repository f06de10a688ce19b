"""ExecutionPolicy: precision, determinism, CUDA graphs, shapes, memory limits, threads."""

from __future__ import annotations

import json

from .. import _core
from ._serializable import SerializablePolicy

_FIELDS = ("precision", "deterministic", "cuda_graphs", "static_shape", "workspace_limit", "memory_limit",
           "intra_op_threads", "allow_spinning", "fallback", "tensor_parallel", "allow_newer_opsets",
           "fp8_fast_accumulation")
_BOOLEANS = ("deterministic", "cuda_graphs", "static_shape", "allow_newer_opsets", "allow_spinning",
             "fp8_fast_accumulation")


class ExecutionPolicy(SerializablePolicy, _core.ExecutionPolicy):
    """How a run executes, apart from which kernel runs each op.

    Parameters
    ----------
    precision : {"fp32", "tf32", "fp16", "bf16", "int8", "fp8", "int4-weights"}
        Default ``"fp32"``. ``tf32`` lets fp32 GEMMs and convolutions use TF32 tensor cores; ``fp16``/``bf16``
        make a session convert weights and activations at build time. ``int8``, ``fp8`` and ``int4-weights``: the
        session runs the QDQ model the policy's quantization decisions make of a float model (``calibration`` or
        ``quantization={"decisions": ...}``; a float model without them is refused), or an already quantized model
        as it is; ``int8`` also keeps float ops off kernels without an int8 path.
    deterministic : bool
        Only kernels that give the same bits run after run. Default False.
    cuda_graphs : bool
        Capture a session's plan into a CUDA graph and replay it. Default True.
    static_shape : bool
        Reject inputs whose shapes differ from the first run's. Default False.
    workspace_limit, memory_limit : int or str
        Bytes (``268435456`` or ``"256MiB"``); 0 = library default / no cap. Default 0.
    intra_op_threads : int
        CPU threads of an op, the calling thread included (the native engine's cpu kernels; ONNX Runtime's
        intra-op threads for the onnxruntime engine); 0 = for the native engine the CPUs this process may use (its
        affinity mask, e.g. ``taskset``, and its cgroup's CPU quota), for ONNX Runtime its own default. Default 0.
    allow_spinning : bool
        Whether the native engine's idle CPU worker threads spin briefly (50 us) after a parallel loop before they
        park, so that the next op finds them awake (like ONNX Runtime's ``session.intra_op.allow_spinning``).
        False: they park at once, leaving the cores to other processes at once. Default True
        (docs/native_engine.md, "CPU threads").
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
    fp8_fast_accumulation : bool
        Float8 GEMMs on cuBLASLt with Hopper's fast accumulation: their partial sums are not promoted to float32
        along K, faster (BERT-base's float8 GEMMs about 1.4x at batch 16 on an H200) and less exact (an error that
        grows with K). Default False (docs/quantization.md, "Float8 GEMMs").
    calibration : feeds, optional
        With ``precision="int8"`` (or ``"fp8"``): an :class:`~xpuruntime.InferenceSession` made under this policy
        calibrates on these feeds (any form :func:`xpuruntime.quantize` takes), cached on disk by model, options and
        data (docs/quantization.md), and runs the model under the decisions that makes. Held by the Python object
        only (it is data): policy files do not carry it.
    quantization : dict, optional
        :func:`xpuruntime.quantize` options for that (``method``, ``exclude``, ``activation_type``, ...), and/or
        ``{"decisions": result.decisions}`` (a dict, a QuantizationResult, JSON text or a file): the decisions
        themselves (scales, zero points, nodes quantized and left float). The decisions belong to the policy: the C++
        ``ExecutionPolicy.quantization`` holds them, policy files (``save``/``load``) carry them and the fingerprint
        covers them, and a session made from the policy, in Python or C++, applies them to the float model (the
        same QDQ model as ``xrt.quantize(model, decisions=...)``). The other options are Python-only, as
        ``calibration``. A loaded policy's ``quantization`` is ``{"decisions": {...}}``.
    """

    _core_class = _core.ExecutionPolicy

    def __init__(self, **kwargs: object) -> None:
        super().__init__()
        self.calibration = kwargs.pop("calibration", None)
        quantization = kwargs.pop("quantization", None)
        if quantization is not None and not isinstance(quantization, dict):
            raise _core.InvalidArgumentError(f"ExecutionPolicy 'quantization' must be a dict of quantize() options, "
                                             f"got {type(quantization).__name__}")
        self.quantization = quantization
        for key, value in kwargs.items():
            if key not in _FIELDS:
                raise _core.InvalidArgumentError(
                    f"unknown ExecutionPolicy field '{key}'; valid fields: "
                    f"{', '.join(sorted(_FIELDS + ('calibration', 'quantization')))}")
            if key in _BOOLEANS and not isinstance(value, bool):
                raise _core.InvalidArgumentError(f"ExecutionPolicy '{key}' must be True or False, got {value!r}")
            setattr(self, key, value)

    @property
    def quantization(self):
        """The quantize() options and/or ``{"decisions": ...}`` (see the class); None when there are none."""
        options = self.__dict__.get("_quantization_options")
        if options is None and self._quantization_json:
            return {"decisions": json.loads(self._quantization_json)}
        return options

    @quantization.setter
    def quantization(self, value) -> None:
        if value is not None and not isinstance(value, dict):
            raise _core.InvalidArgumentError(f"ExecutionPolicy 'quantization' must be a dict of quantize() options, "
                                             f"got {type(value).__name__}")
        decisions = (value or {}).get("decisions")
        if decisions is None:
            self._quantization_json = ""
        else:
            from ..quantization.quantizer import load_decisions

            self._quantization_json = json.dumps(load_decisions(decisions), sort_keys=True)
        self.__dict__["_quantization_options"] = dict(value) if value is not None else None

    def copy(self) -> "ExecutionPolicy":
        """An independent copy (the Python-only ``calibration`` and ``quantization`` included)."""
        out = super().copy()
        out.calibration = getattr(self, "calibration", None)
        out.quantization = dict(self.quantization) if getattr(self, "quantization", None) else None
        return out

    def to_dict(self) -> dict:
        return {field: getattr(self, field) for field in _FIELDS}
