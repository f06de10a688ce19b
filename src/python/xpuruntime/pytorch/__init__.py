"""xpuruntime.pytorch - the KernelPolicy for training: routing, autocast, CUDA graphs, a decision log.

Needs the ``torch`` extra. Importing this module without PyTorch raises an ImportError that says how to get it.

The same KernelPolicy file drives training and inference: under :func:`set_kernel_policy`, PyTorch's matmul/linear,
conv2d and scaled_dot_product_attention calls run on the kernels the policy names (xpuruntime's, zero-copy on
torch's memory and current stream, or PyTorch's own backends such as ``torch_flash``), forward and backward, and
every decision is logged in the format of ``InferenceSession.explain()``. See docs/pytorch.md.

Examples
--------
>>> import xpuruntime.pytorch as xrt_torch
>>> xrt_torch.set_kernel_policy(attention="flash_v2", matmul="cublasLt")
>>> with xrt_torch.autocast(fp16=True):
...     loss = model(x).float().square().mean()
...     loss.backward()
>>> print(xrt_torch.decision_log())
>>> step = xrt_torch.capture_graph(train_step, x, y)        # CUDA graph of forward + backward + optimizer
>>> step(x_next, y_next)
"""

from __future__ import annotations

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised by the tests without torch
    raise ImportError(
        "xpuruntime.pytorch requires PyTorch, which is not installed. Install it with "
        "`pip install xpuruntime[torch]` (or `pip install torch`), then import xpuruntime.pytorch again."
    ) from error

import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from .. import _core
from ..policies import ExecutionPolicy, KernelPolicy

# Note [The layers of xpuruntime.pytorch]
# The modules of this package import one another in one direction, top to bottom (scripts/check_layers.py fails on
# an import circle, an import inside a function included):
#
#   entry points   __init__ (the public API), _autocast, _graph
#                  _mode      the routing mode, PolicyScope, activate(); hands the mode down to _extension
#                  _native    registers the fast path's sites with the native path's extension
#                  _fast      the eager fast path: one cached Site per call signature, its autograd Functions
#   kernels/ops    _ops       the custom ops torch.ops.xpuruntime.* (autograd and fake implementations)
#                  _kernels   what a routed call runs: xpuruntime's kernels, PyTorch's backends, backward formulas
#   state and      _routing   PolicyState, the decision per signature (Route, Launcher), suspending routing
#   routing        _log       DecisionLog
#                  _extension building and loading the native path's extension, switching it, its shared state
#                  _state     STATE: the scope in force and autocast's precision override
#                  _compat    what differs between PyTorch versions
#
# A module may import any module below it, never one above. Where a lower module needs something of a higher one,
# the higher one hands it down: _mode registers the mode object with _extension (register_mode); the custom op
# matmul is passed to _kernels.linear_backward; the caller of _fast.run_site registers the site with _native.
# Lazy imports are kept for optional or slow parts of torch only (torch.utils.cpp_extension, torch._dynamo), each
# with its reason.
from . import _extension, _mode, _routing, _state
from ._autocast import autocast
from ._graph import CapturedGraph, GraphCapture, capture_graph
from ._log import DecisionLog
from ._mode import PolicyScope
from ._routing import ROUTED_OPS, TORCH_KERNELS

__all__ = [
    "set_kernel_policy", "get_kernel_policy", "get_exec_policy", "current_scope", "decision_log", "explain",
    "autocast", "capture_graph", "CapturedGraph", "GraphCapture", "DecisionLog", "PolicyScope",
    "ROUTED_OPS", "TORCH_KERNELS", "to_torch", "from_torch", "current_stream", "native_status", "set_native",
]

PolicyLike = Union[KernelPolicy, Mapping[str, Any], str, "os.PathLike[str]", None]

_last_scope: Optional[PolicyScope] = None


class _RoutingOff:
    """What ``set_kernel_policy(None)`` returns: routing is off; as a context manager, leaving restores the
    previous scope."""

    def __init__(self, previous: Optional[PolicyScope]) -> None:
        self._previous = previous

    def __enter__(self) -> "_RoutingOff":
        return self

    def __exit__(self, *exc: Any) -> None:
        _mode.activate(self._previous)

    def __repr__(self) -> str:
        return "<routing off>"


def _kernel_policy(policy: PolicyLike, rules: Mapping[str, Any]) -> KernelPolicy:
    if policy is None:
        result = KernelPolicy()
    elif isinstance(policy, _core.KernelPolicy):
        result = KernelPolicy._wrap(policy)
    elif isinstance(policy, (str, os.PathLike)):
        result = KernelPolicy.load(Path(policy))
    elif isinstance(policy, Mapping):
        result = KernelPolicy(policy)
    else:
        raise _core.InvalidTypeError(
            f"set_kernel_policy: policy must be a KernelPolicy, a policy file path, a dict or None, got "
            f"{type(policy).__name__}")
    for key, rule in rules.items():
        result.set(key, rule)
    return result


def _exec_policy(exec_policy: Any) -> ExecutionPolicy:
    if exec_policy is None:
        return ExecutionPolicy()
    if isinstance(exec_policy, _core.ExecutionPolicy):
        return ExecutionPolicy._wrap(exec_policy)
    if isinstance(exec_policy, (str, os.PathLike)):
        return ExecutionPolicy.load(Path(exec_policy))
    if isinstance(exec_policy, Mapping):
        return ExecutionPolicy(**exec_policy)
    raise _core.InvalidTypeError(
        f"set_kernel_policy: exec_policy must be an ExecutionPolicy, a file path or a dict, got "
        f"{type(exec_policy).__name__}")


def set_kernel_policy(policy: PolicyLike = None, /, *, exec_policy: Any = None,
                      **rules: Any) -> Union[PolicyScope, _RoutingOff]:
    """Route PyTorch's matmul/linear, conv2d and attention calls by a KernelPolicy, from now on (on this thread).

    The policy is the inference one: a :class:`~xpuruntime.KernelPolicy`, a policy file (JSON/YAML), a dict or
    keyword rules (``matmul="cublasLt"``, ``attention=["flash_v2", "torch_flash"]``, ``conv="pin:cudnn"``). Rule
    kernels are xpuruntime's (``cublasLt``, ``cublas``, ``flash_v2``, ``unfused``, ``cudnn``, ``cpu``, ...) or
    PyTorch's own (:data:`TORCH_KERNELS`: ``torch``, ``torch_cublas``, ``torch_cublaslt``, ``torch_flash``,
    ``torch_efficient``, ``torch_math``, ``torch_cudnn``); unknown names raise InvalidArgumentError listing the
    valid ones. Ops the policy has no rule for keep PyTorch's own dispatch. How a call is decided:
    docs/pytorch.md.

    Returns the new :class:`PolicyScope` (its ``log`` records every routed call from now on). Used as a context
    manager (``with set_kernel_policy(...):``), leaving the block restores the previous policy.
    ``set_kernel_policy(None)`` turns routing off. Decisions and plans are kept per distinct pair of policies:
    setting the same ones again decides nothing twice.

    Parameters
    ----------
    policy : KernelPolicy, str, PathLike, dict or None
    exec_policy : ExecutionPolicy, str, PathLike or dict, optional
        The ExecutionPolicy of xpuruntime's kernels (``precision="tf32"`` lets fp32 GEMMs use TF32;
        ``deterministic=True`` keeps to deterministic kernels). Default: ``ExecutionPolicy()``.
    **rules
        Rules set on top of ``policy``.
    """
    global _last_scope
    previous = _state.STATE.scope
    if policy is None and not rules and exec_policy is None:
        _mode.activate(None)
        return _RoutingOff(previous)
    state = _routing.policy_state(_kernel_policy(policy, rules), _exec_policy(exec_policy))
    scope = PolicyScope(state, previous)
    _mode.activate(scope)
    _last_scope = scope
    return scope


def current_scope() -> Optional[PolicyScope]:
    """The scope in force, or None when routing is off."""
    return _state.STATE.scope


def get_kernel_policy() -> Optional[KernelPolicy]:
    """A copy of the KernelPolicy in force, or None when routing is off."""
    scope = _state.STATE.current
    return scope.policy.copy() if scope is not None else None


def get_exec_policy() -> Optional[ExecutionPolicy]:
    """A copy of the ExecutionPolicy in force, or None when routing is off."""
    scope = _state.STATE.current
    return scope.exec_policy.copy() if scope is not None else None


def decision_log(scope: Optional[PolicyScope] = None) -> DecisionLog:
    """The decision log of ``scope`` (default: the scope in force, else the last one set)."""
    scope = scope or _state.STATE.scope or _last_scope
    if scope is None:
        raise _core.XpuRuntimeError("no kernel policy has been set: call xpuruntime.pytorch.set_kernel_policy first")
    return scope.log


def explain(scope: Optional[PolicyScope] = None, format: str = "text") -> Any:  # noqa: A002 - like the CLI flag
    """The decision log as an explain report: ``format`` ``"text"`` (a string), ``"json"``, ``"html"`` or
    ``"dict"`` (the report dict of :mod:`xpuruntime.report`)."""
    log = decision_log(scope)
    if format == "dict":
        return log.to_report()
    if format == "text":
        return log.to_text()
    if format == "json":
        return log.to_json()
    if format == "html":
        return log.to_html()
    raise _core.InvalidArgumentError(f"explain: unknown format '{format}'; valid formats: dict, html, json, text")


# ---- interoperability ----

def native_status() -> dict:
    """Whether routed calls take the native path (a C++ routing handler and autograd node built against this
    PyTorch the first time routing is turned on; docs/pytorch.md, "The native path"):
    ``{"enabled", "loaded", "active", "cuda", "reason", "path"}``. Without it routing runs on the Python path:
    the same decisions and results, more host time per call."""
    return _extension.status()


def set_native(enabled: bool) -> dict:
    """Route on the native path (building it where needed) or, with False, on the Python path; returns
    :func:`native_status`. The environment variable ``XPURUNTIME_TORCH_NATIVE=0`` starts with it off."""
    _extension.set_enabled(enabled)
    return _extension.status()


def to_torch(tensor: "_core.Tensor") -> "torch.Tensor":
    """Return a torch tensor sharing the memory of an xpuruntime tensor (zero-copy through DLPack)."""
    return torch.from_dlpack(tensor)


def from_torch(tensor: "torch.Tensor") -> "_core.Tensor":
    """Return an xpuruntime tensor sharing the memory of a torch tensor (zero-copy through DLPack)."""
    return _core.from_dlpack(tensor)


def current_stream(device: "torch.device | int | None" = None) -> "_core.Stream":
    """Return torch's current CUDA stream as a (non-owning) xpuruntime Stream."""
    stream = torch.cuda.current_stream(device)
    return _core.Stream.from_handle(stream.cuda_stream, f"cuda:{stream.device.index}")


def _check_kernel_tables() -> None:
    """The torch kernel names here and the registry's external kernels must agree (one list of names)."""
    for op in ROUTED_OPS:
        declared = {k["name"] for k in _core.external_kernels(op)}
        if declared != set(TORCH_KERNELS[op]):  # pragma: no cover - a build/package mismatch
            raise ImportError(f"xpuruntime.pytorch: the core library declares PyTorch kernels {sorted(declared)} for "
                              f"{op}, this package {sorted(TORCH_KERNELS[op])}; rebuild xpuruntime._core")


_check_kernel_tables()
