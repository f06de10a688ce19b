"""ONNX Runtime's exception classes, which are also xpuruntime's typed errors (Note [Two names for one error]).

Note [Two names for one error]
------------------------------
ONNX Runtime's Python API raises ``Fail``, ``InvalidArgument``, ``NoSuchFile``, ... (its status codes); xpuruntime
raises ``XpuRuntimeError`` and its subclasses. Each ORT class here subclasses the xpuruntime error it corresponds to
(``InvalidArgument`` is an ``xpuruntime.InvalidArgumentError``, ``NotImplemented`` an
``UnsupportedOperationError``), so ``except xrt.InvalidArgumentError`` catches what this module raises. The other
direction: every call of ``xpuruntime.onnxruntime`` passes what the core raises through :func:`translate`, which
re-raises it as the ORT class of its type, made a subclass of the original type as well when the ORT class is not
one already (a ``CudaError`` becomes an ``EPFail`` that is still a ``CudaError``). So both ``except InvalidArgument``
and ``except xrt.InvalidArgumentError`` catch an invalid argument, whichever name the caller knows. Every class is a
``RuntimeError``, as xpuruntime's errors are.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Tuple, Type, TypeVar

from .. import _core


class Fail(_core.XpuRuntimeError):
    """ORT status FAIL (1): a generic failure."""


class InvalidArgument(_core.InvalidArgumentError):
    """ORT status INVALID_ARGUMENT (2)."""


class NoSuchFile(_core.InvalidArgumentError):
    """ORT status NO_SUCHFILE (3): a model or data file that does not exist."""


class NoModel(_core.InvalidArgumentError):
    """ORT status NO_MODEL (4)."""


class EngineError(_core.XpuRuntimeError):
    """ORT status ENGINE_ERROR (5)."""


class RuntimeException(_core.XpuRuntimeError):
    """ORT status RUNTIME_EXCEPTION (6)."""


class InvalidProtobuf(_core.InvalidArgumentError):
    """ORT status INVALID_PROTOBUF (7): bytes that are not an ONNX model."""


class ModelLoaded(_core.XpuRuntimeError):
    """ORT status MODEL_LOADED (8)."""


class NotImplemented(_core.UnsupportedOperationError):  # noqa: A001 - ONNX Runtime's name
    """ORT status NOT_IMPLEMENTED (9): what xpuruntime does not do (the message says why and what to use)."""


class InvalidGraph(_core.InvalidArgumentError):
    """ORT status INVALID_GRAPH (10)."""


class EPFail(_core.XpuRuntimeError):
    """ORT status EP_FAIL (11): the device (execution provider) failed."""


class ModelRequiresCompilation(_core.XpuRuntimeError):
    """ORT status MODEL_REQUIRES_COMPILATION (12)."""


ORT_ERRORS: Tuple[Type[_core.XpuRuntimeError], ...] = (
    Fail, InvalidArgument, NoSuchFile, NoModel, EngineError, RuntimeException, InvalidProtobuf, ModelLoaded,
    NotImplemented, InvalidGraph, EPFail, ModelRequiresCompilation)

# The ORT class each xpuruntime error type becomes (the most derived type of the error that is listed wins).
_ORT_CLASS: Dict[type, type] = {
    _core.XpuRuntimeError: Fail,
    _core.InvalidArgumentError: InvalidArgument,
    _core.InvalidTypeError: InvalidArgument,
    _core.UnsupportedOperationError: NotImplemented,
    _core.CudaError: EPFail,
    _core.OutOfMemoryError: EPFail,
    _core.RunTerminatedError: Fail,
    _core.RunTimeoutError: Fail,
    _core.DistributedError: Fail,
    _core.DistributedTimeoutError: Fail,
}
_COMBINED: Dict[Tuple[type, type], type] = {}


def ort_class_for(error_type: type) -> type:
    """The exception class :func:`translate` gives an error of ``error_type``: an ORT class that is also an
    ``error_type``."""
    if issubclass(error_type, ORT_ERRORS):
        return error_type
    base = next((_ORT_CLASS[t] for t in error_type.__mro__ if t in _ORT_CLASS), Fail)
    if issubclass(base, error_type):
        return base
    key = (base, error_type)
    if key not in _COMBINED:
        _COMBINED[key] = type(base.__name__, (base, error_type), {"__module__": __name__, "__doc__": base.__doc__})
    return _COMBINED[key]


def translate(error: BaseException) -> BaseException:
    """``error`` as ONNX Runtime's class (Note [Two names for one error]); other exceptions unchanged."""
    if not isinstance(error, _core.XpuRuntimeError) or isinstance(error, ORT_ERRORS):
        return error
    translated = ort_class_for(type(error))(*error.args)
    translated.__traceback__ = error.__traceback__
    return translated


F = TypeVar("F", bound=Callable[..., Any])


def ort_errors(function: F) -> F:
    """Decorates a public function or method: xpuruntime errors leave it as ONNX Runtime's classes."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except _core.XpuRuntimeError as error:
            translated = translate(error)
            if translated is error:
                raise
            raise translated from None

    return wrapper  # type: ignore[return-value]


def ort_errors_class(cls: type) -> type:
    """Applies :func:`ort_errors` to every public method (static ones included) of ``cls``."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("_") and name not in ("__init__", "__array__"):
            continue
        if isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(ort_errors(attr.__func__)))
        elif callable(attr) and not isinstance(attr, type):
            setattr(cls, name, ort_errors(attr))
    return cls
