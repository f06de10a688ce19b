"""The native path's call sites (Note [The native path] in src/cpp/bindings/torch/routing_native.cpp): registering a
call signature the Python path has decided with the extension, so that later calls of it run in C++, and the
backward formulas the extension hands back to Python.

The extension itself (building, loading, switching it on and off) is ``_extension``; this module sits above the fast
path (``_fast``), whose sites it registers, and below the routing mode (``_mode``), which calls :func:`register`
(Note [The layers of xpuruntime.pytorch] in __init__.py).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import _compat, _extension, _fast, _kernels
from ._fast import Site

class _Needs:
    """What a Python backward formula reads of autograd's ctx."""

    __slots__ = ("needs_input_grad",)

    def __init__(self, needs) -> None:
        self.needs_input_grad = (False,) + tuple(needs)


def _plan(launcher: Any) -> Any:
    return _extension.MODULE.Plan(launcher.prepared, list(launcher.outputs), launcher.workspace_bytes)


def _blas_value(kernel: str) -> Optional[int]:
    """PyTorch's BlasBackend value the extension switches to for ``kernel`` (-1: no switch; None: it cannot)."""
    backend = _compat.blas_library(kernel).backend
    if backend is None:
        return -1
    if isinstance(backend, str) or _extension.torch_version() < 203:
        return None
    return int(getattr(backend, "value", backend))


def _linear_backward(site: Any, native_site: Any, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     needs) -> tuple:
    """A backward the extension hands back to Python (a site's first, or create_graph): the Python formulas, then
    the routes they decided are handed to the extension for the next backwards."""
    with _fast.no_torch_function():
        grads = _fast._linear_backward(site, _Needs(needs), grad, x, weight)
    if torch.is_grad_enabled() or _extension.MODULE is None:
        return grads
    log, state = site.scope.log, site.backward_state
    plans_run = not grad.is_cuda or _extension.HAS_CUDA  # the extension launches CUDA plans only when built with CUDA
    grad_x = state.get("grad_x")
    if grad_x is not None and grad_x.on_xpuruntime and plans_run:
        native_site.set_grad_x(_plan(grad_x.launcher), log.native_counter(grad_x, "xpuruntime::matmul"))
    grad_w_plan = state.get("grad_w_plan")
    grad_w = state.get("grad_w")
    if grad_w_plan is not None and plans_run:
        native_site.set_grad_w(log.native_counter(grad_w_plan, "xpuruntime::linear_grad_weight"),
                               plan=_plan(grad_w_plan.launcher))
    elif grad_w is not None:
        blas = _blas_value(_kernels._backward_gemm_kernel(site.route))
        if blas is not None:
            native_site.set_grad_w(log.native_counter(grad_w, "backward of linear"), blas=blas)
    return grads


def register(site: Any, func: Any, args: tuple, kwargs: dict) -> None:
    """Serve later calls of this signature (this call's func, args, kwargs) natively, where the site allows."""
    if _extension.DISPATCH is None:
        return
    site.native_tried = True
    if kwargs and isinstance(site, Site) and site.op != "attention":
        return  # the native linear and matmul sites read their tensors from the positional arguments only

    try:
        if not isinstance(site, Site):  # a TorchSite: PyTorch runs the call as it is
            native = _torch_site(site.scope, site.route, site.name)
        else:
            native = _routed_site(site, args)
            if native is None:
                return
        _extension.MODULE.register_site(func, args, kwargs, native)
    except ValueError:  # arguments the native key does not describe: the Python path serves them
        return


def _attention_backward(site: Any, native_site: Any, grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> tuple:
    """An attention backward the extension hands back to Python (a site's first, a create_graph one, or every one
    where the extension cannot call PyTorch's flash backward itself): the Python path's backward, then its arguments
    are handed to the extension for the next backwards."""
    is_causal, scale, enable_gqa = site.attrs
    with _fast.no_torch_function():
        if torch.is_grad_enabled():  # create_graph: the differentiable formulas
            return _kernels.attention_backward(grad, q, k, v, None, is_causal, scale, enable_gqa, site.scope.id,
                                               site.route.id)
        route, kind, args = _fast.lse_backward_route(site, grad, q, k, v)
        site.scope.log.record(route, "backward of attention")
        grads = _kernels.lse_backward(kind, grad, q, k, v, out, lse, *args, is_causal, scale)
    # The extension calls PyTorch's flash backward itself from 2.3, its cuDNN backward (whose signature settled
    # later) from 2.9; otherwise this Python backward keeps running.
    if _extension.MODULE is not None and _extension.HAS_CUDA and \
            _extension.torch_version() >= (209 if kind == "torch_cudnn" else 203):
        native_site.set_flash_backward(*args, bool(is_causal), scale,
                                       site.scope.log.native_counter(route, "backward of attention"),
                                       kind == "torch_cudnn")
    return grads


def _routed_site(site: Any, args: tuple) -> Any:
    route = site.route
    if route.kernel == "torch" and not route.on_xpuruntime:  # PyTorch's own dispatch, no backend context
        return _torch_site(site.scope, route, site.name)
    if site.op == "attention":
        return _attention_site(site, args)
    if site.op not in ("linear", "matmul") or any(site.casts) or any(site.contig):
        return None
    if site.op == "matmul" and site.grad:
        return None
    if route.on_xpuruntime:
        if route.launcher.device.type == "cuda" and not _extension.HAS_CUDA:
            return None
        holder: list = []
        backward = None
        if site.grad:
            def backward(grad, x, weight, needs):
                return _linear_backward(site, holder[0], grad, x, weight, needs)
        counter = site.scope.log.native_counter(route, site.name)
        native = _extension.MODULE.Site(site.op, _plan(route.launcher), site.grad, counter, backward)
        holder.append(native)
        return native
    return None


def _attention_site(site: Any, args: tuple) -> Any:
    """A native attention site: xpuruntime's kernel on q, k, v (the first three positional arguments, contiguous as
    they come); with grad, only where the forward returns the log-sum-exp for PyTorch's flash backward."""
    route = site.route
    if len(args) < 3:  # q, k or v given by keyword: the extension reads them positionally
        return None
    if not route.on_xpuruntime or any(site.casts) or any(site.contig) or not _extension.HAS_CUDA:
        return None
    if route.launcher.device.type != "cuda" or (site.grad and site.lse_launcher is None):
        return None
    holder: list = []
    backward = None
    if site.grad:
        def backward(grad, q, k, v, out, lse):
            return _attention_backward(site, holder[0], grad, q, k, v, out, lse)
    launcher = site.lse_launcher if site.grad else route.launcher
    native = _extension.MODULE.Site("attention", _plan(launcher), site.grad,
                                    site.scope.log.native_counter(route, site.name), backward)
    holder.append(native)
    return native


def _torch_site(scope: Any, route: Any, name: str) -> Any:
    """A native site that counts the call for ``route`` and calls PyTorch's function as it is."""
    return _extension.MODULE.Site("torch", None, False, scope.log.native_counter(route, name), None)
