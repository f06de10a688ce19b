"""ExecutionPolicy: precision, determinism, CUDA graphs, shapes, memory limits, threads."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from .. import _core

_FIELDS = ("precision", "deterministic", "cuda_graphs", "static_shape", "workspace_limit", "memory_limit",
           "intra_op_threads")


class ExecutionPolicy(_core.ExecutionPolicy):
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
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__()
        for key, value in kwargs.items():
            if key not in _FIELDS:
                raise _core.InvalidArgumentError(
                    f"unknown ExecutionPolicy field '{key}'; valid fields: {', '.join(sorted(_FIELDS))}")
            if key in ("deterministic", "cuda_graphs", "static_shape") and not isinstance(value, bool):
                raise _core.InvalidArgumentError(f"ExecutionPolicy '{key}' must be True or False, got {value!r}")
            setattr(self, key, value)

    def to_dict(self) -> dict:
        return {field: getattr(self, field) for field in _FIELDS}

    def copy(self) -> "ExecutionPolicy":
        out = type(self)()
        out.assign(self)
        return out

    @classmethod
    def _wrap(cls, core: _core.ExecutionPolicy) -> "ExecutionPolicy":
        out = cls()
        out.assign(core)
        return out

    @classmethod
    def from_json(cls, text: str) -> "ExecutionPolicy":
        return cls._wrap(_core.ExecutionPolicy._from_json(text))

    @classmethod
    def from_yaml(cls, text: str) -> "ExecutionPolicy":
        return cls._wrap(_core.ExecutionPolicy._from_yaml(text))

    @classmethod
    def load(cls, path: Union[str, Path]) -> "ExecutionPolicy":
        """Load a policy file (``.json``, ``.yaml`` or ``.yml``)."""
        return cls._wrap(_core.ExecutionPolicy._load(str(path)))

    def save(self, path: Union[str, Path]) -> None:  # type: ignore[override]
        """Save in canonical form; the format follows the extension."""
        _core.ExecutionPolicy.save(self, str(path))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _core.ExecutionPolicy) and _core.ExecutionPolicy.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return _core.ExecutionPolicy.__repr__(self)
