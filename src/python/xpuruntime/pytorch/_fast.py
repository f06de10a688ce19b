"""The eager fast path of routed calls: one cached :class:`Site` per call signature.

Note [Call sites]
Deciding a routed call (binding its arguments, checking that xpuruntime can take it, choosing the kernel, planning
it) happens once per signature: the function called, the policy scope, the precision override, grad mode,
autocast's state, and every argument (a tensor by type, dtype, device, shape, strides and requires_grad; other
arguments by value). :func:`call_key` computes that key; the first call with a new key goes the full way (the
mode's binder and the router) and leaves a :class:`Site` behind; later calls with the same key only take the
tensors out of the arguments, cast them as autocast would, make them contiguous where the key says they are not,
count the call in the decision log and launch the prepared plan. Calls whose arguments the key cannot describe
(tensor subclasses, masks passed to attention, unusual argument types) keep taking the full way.

Autograd: when grad mode is on and an input requires grad, the site's call runs through a lean
``torch.autograd.Function`` of the op (one per op below), whose backward runs the same formulas as the custom ops
(Note [Backward] in _kernels) with torch function handling disabled (``torch._C.DisableTorchFunction``: the
backward's own torch calls are not user calls, and would otherwise each pass through the routing mode) and with
its routes decided once per site. A backward that must itself be differentiable (``create_graph=True``) runs the
custom ops' formulas instead.

Attention: when the forward kernel is ``flash_v2`` and PyTorch's FlashAttention backward will run the gradient,
the forward also returns the softmax log-sum-exp (``return_lse``), which the backward hands to
``aten._scaled_dot_product_flash_attention_backward``: no recomputation of the forward.

The top layer, with the routing mode (Note [The layers of xpuruntime.pytorch] in __init__.py): it imports the
router, the kernels and the custom ops; the mode (``_mode``) calls it, and registers its sites with the native path
(``_native``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from .. import _core
from . import _compat, _extension, _kernels, _ops, _routing
from ._routing import Launcher, PolicyState, Route
from ._state import STATE

_Parameter = torch.nn.Parameter
_strided = torch.strided
_SCALARS = (int, float, bool, str, type(None))


_UNDECIDED = object()


class _NoKey(Exception):
    """An argument the call key cannot describe: the call takes the full way."""


def _meta(value: Any) -> Any:
    kind = type(value)
    if kind is torch.Tensor or kind is _Parameter:
        if value.layout is not _strided:
            raise _NoKey
        return (value.dtype, value.device, value.shape, value.stride(), value.requires_grad)
    if kind in _SCALARS:
        return (kind, value)
    if kind is tuple or kind is list:
        if all(type(v) is int for v in value):
            return (kind, tuple(value))
    raise _NoKey


def _autocast_state() -> Tuple[Optional[torch.dtype], Optional[torch.dtype]]:
    return (_compat.autocast_dtype("cuda"), _compat.autocast_dtype("cpu"))


def call_key(func: Any, scope: PolicyState, args: tuple, kwargs: dict) -> Optional[tuple]:
    """The key of a call's site (Note [Call sites]), or None when the call must take the full way."""
    try:
        parts = [func, scope.id, STATE.precision_override, torch.is_grad_enabled(), _autocast_state()]
        for a in args:
            parts.append(_meta(a))
        if kwargs:
            for name, value in kwargs.items():
                parts.append(name)
                parts.append(_meta(value))
    except _NoKey:
        return None
    return tuple(parts)


SITES: Dict[tuple, "Site"] = {}
_sites_lock = threading.Lock()


def clear() -> None:
    """Forget every call site (the Python path's and the native path's)."""
    with _sites_lock:
        SITES.clear()
    _extension.clear()


def clear_routes() -> None:
    """Forget every cached decision and call site (the C++ dispatchers keep their plans)."""
    _routing.clear_decisions()
    clear()


# ---------------------------------------------------------------------------------------------------------------
# Disabling torch function handling (the routing mode) inside backward formulas
# ---------------------------------------------------------------------------------------------------------------

def _probe_disable() -> Callable[[], Any]:
    """``torch._C.DisableTorchFunction`` where it also disables torch function modes (PyTorch >= 2.0), else the
    routing mode's own suspension (slower: the mode still sees each call)."""
    disable = getattr(torch._C, "DisableTorchFunction", None)
    if disable is None:
        return _routing.suspended
    seen = []

    class _Probe(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    try:
        with _Probe():
            with disable():
                torch.zeros(1).add(1)
    except Exception:  # noqa: BLE001 - any failure: use the slower, safe way
        return _routing.suspended
    return disable if not seen else _routing.suspended


no_torch_function = _probe_disable()


# ---------------------------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------------------------

# The signatures of the routed torch functions, bound by calling these with a call's arguments (the mode's binders
# use them too): each returns the arguments in order, with PyTorch's defaults.

def linear_args(input, weight, bias=None):  # noqa: A002 - PyTorch's argument names
    return input, weight, bias


def conv2d_args(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    return input, weight, bias, stride, padding, dilation, groups


def sdpa_args(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa


def _extract_matmul(args, kwargs):
    return args[0], args[1]


def _extract_linear(args, kwargs):
    if not kwargs:
        return (args[0], args[1], args[2] if len(args) > 2 else None)
    return linear_args(*args, **kwargs)


def _extract_conv2d(args, kwargs):
    return conv2d_args(*args, **kwargs)[:3]


def _extract_attention(args, kwargs):
    return sdpa_args(*args, **kwargs)[:3]


_EXTRACT = {"matmul": _extract_matmul, "linear": _extract_linear, "conv2d": _extract_conv2d,
            "attention": _extract_attention}
#: The schema's optional inputs a routed call never passes (conv2d's residual, attention's mask on a site).
_ABSENT = {"matmul": (), "linear": (), "conv2d": (None,), "attention": (None,)}


class Site:
    """One routed call signature, decided (Note [Call sites])."""

    __slots__ = ("op", "name", "scope", "route", "attrs", "extract", "casts", "contig", "grad", "absent",
                 "function", "lse_launcher", "backward_state", "native_tried")

    def __init__(self, op: str, name: str, scope: PolicyState, route: Route, attrs: Optional[tuple],
                 originals: Sequence[Optional[torch.Tensor]], bound: Sequence[Optional[torch.Tensor]]) -> None:
        self.op = op
        self.name = name
        self.scope = scope
        self.route = route
        self.attrs = attrs
        self.extract = _EXTRACT[op]
        # What the binder did to each tensor, redone per call: autocast's cast, a contiguous copy.
        self.casts = tuple(b.dtype if o is not None and b is not None and b.dtype != o.dtype else None
                           for o, b in zip(originals, bound))
        self.contig = tuple(o is not None and (c is not None or not o.is_contiguous())
                            for o, c in zip(originals, self.casts))
        self.grad = torch.is_grad_enabled() and any(o is not None and o.requires_grad for o in originals)
        self.absent = _ABSENT[op]
        self.function = _FUNCTIONS[op]
        self.lse_launcher: Optional[Launcher] = None
        self.backward_state: Dict[str, Any] = {}
        self.native_tried = False  # offered to the native path (Note [The native path])
        if op == "attention" and self.grad and route.on_xpuruntime:
            self.lse_launcher = _attention_lse_launcher(route, bound)

    def tensors(self, args: tuple, kwargs: dict) -> list:
        tensors = list(self.extract(args, kwargs))
        for i, dtype in enumerate(self.casts):
            if dtype is not None:
                tensors[i] = tensors[i].to(dtype)
        for i, flag in enumerate(self.contig):
            if flag:
                tensors[i] = tensors[i].contiguous()
        return tensors

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        route = self.route
        self.scope.log.record(route, self.name)
        if not route.on_xpuruntime:
            with _kernels.torch_context(route):
                return func(*args, **kwargs)
        tensors = self.tensors(args, kwargs)
        if self.grad:
            return _apply(self.function, self, tensors)
        return route.launcher(tensors + list(self.absent))[0]


class TorchSite:
    """A call signature PyTorch runs as it is (no rule for the op, or xpuruntime cannot take the call): logged only.
    """

    __slots__ = ("route", "name", "scope", "native_tried")

    def __init__(self, route: Route, name: str) -> None:
        self.route = route
        self.name = name
        self.scope = _routing.scope_by_id(route.scope_id)
        self.native_tried = False

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        self.scope.log.record(self.route, self.name)
        return func(*args, **kwargs)


_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
_C_APPLY: Dict[type, Callable[..., Any]] = {}


def _apply(function: type, site: "Site", tensors: list) -> Any:
    """``function.apply(site, *tensors)``, straight into autograd's C++ ``apply`` when no functorch transform is
    active: what ``torch.autograd.Function.apply`` does then, minus its Python wrapper (argument binding and a pytree
    pass over the arguments for dead functorch wrappers, which plain tensors never are), a sizeable part of a
    routed call's host time."""
    if _functorch_active():
        return function.apply(site, *tensors)
    apply = _C_APPLY.get(function)
    if apply is None:
        apply = super(torch.autograd.Function, function).apply  # type: ignore[misc]
        _C_APPLY[function] = apply
    return apply(site, *tensors)


def make_site(op: str, name: str, scope: PolicyState, route: Route, attrs: Optional[tuple], args: tuple,
              kwargs: dict, bound: Sequence[Optional[torch.Tensor]]) -> Optional[Site]:
    """A site for a call the full way has just bound (``bound``: the binder's tensors) and decided; None when the
    binder did more than the site can redo (an attention mask)."""
    if op == "attention" and bound[3] is not None:
        return None
    originals = list(_EXTRACT[op](args, kwargs))
    return Site(op, name, scope, route, attrs, originals, bound[:len(originals)])


def run_site(key: tuple, site: Site, func: Any, args: tuple, kwargs: dict) -> Any:
    """Keep ``site`` for later calls of ``key`` and run this call on it (the caller then registers it with the
    native path: after the call, since a grad site's native node needs its first backward)."""
    with _sites_lock:
        SITES.setdefault(key, site)
    return site(func, args, kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Backward helpers
# ---------------------------------------------------------------------------------------------------------------

def _backward_route(site: Site, name: str, make: Callable[[], Route]) -> Route:
    route = site.backward_state.get(name)
    if route is None:
        route = make()
        site.backward_state[name] = route
    return route


# ---- linear ----

def _linear_backward(site: Site, ctx: Any, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor):
    scope, route = site.scope, site.route
    if torch.is_grad_enabled():  # create_graph: the custom ops' differentiable formulas
        return _kernels.linear_backward(scope.id, route.id, grad, x, weight, ctx.needs_input_grad[1:4], _ops.matmul)
    needs = ctx.needs_input_grad
    log = scope.log
    grad_x = grad_w = grad_b = None
    n, k = weight.shape
    if needs[1]:
        grad_c = grad if grad.is_contiguous() else grad.contiguous()
        gx_route = _backward_route(site, "grad_x", lambda: _kernels.decide_matmul(scope, grad_c, weight, 1))
        log.record(gx_route, "xpuruntime::matmul")
        if gx_route.on_xpuruntime:
            grad_x = gx_route.launcher([grad_c, weight])[0]
        else:
            with _kernels.torch_context(gx_route):
                grad_x = torch.matmul(grad_c, weight)
    if needs[2] or needs[3]:
        grad2 = grad if grad.dim() == 2 else grad.reshape(-1, n)
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        gw_plan = site.backward_state.get("grad_w_plan", _UNDECIDED) if needs[2] else None
        if gw_plan is not None:  # decided on (or to run on) contiguous, aligned operands
            grad2, x2 = _compat.kernel_input(grad2), _compat.kernel_input(x2)
            if gw_plan is _UNDECIDED:
                gw_plan = _kernels.decide_grad_weight(scope, route, grad2, x2, bool(needs[3]))
                site.backward_state["grad_w_plan"] = gw_plan
        if gw_plan is not None:
            log.record(gw_plan, "xpuruntime::linear_grad_weight")
            outputs = gw_plan.launcher([grad2, x2])
            grad_w = outputs[0]
            if needs[3] and len(outputs) > 1:
                grad_b = outputs[1]  # summed in the same call
        elif needs[2]:
            kernel = _kernels._backward_gemm_kernel(route)
            gt = grad2.t()
            gw_route = _backward_route(site, "grad_w", lambda: _kernels.backward_gemm_route(
                scope, route, "linear", "backward: grad weight", (gt, x2), kernel))
            log.record(gw_route, "backward of linear")
            with _compat.blas_library(kernel):
                grad_w = torch.matmul(gt, x2)
        if needs[3] and grad_b is None:
            grad_b = grad2.sum(0)
    return grad_x, grad_w, grad_b


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, site, x, weight, bias):  # type: ignore[override]
        ctx.site = site
        ctx.save_for_backward(x, weight)
        return site.route.launcher([x, weight, bias])[0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        with no_torch_function():
            x, weight = ctx.saved_tensors
            grad_x, grad_w, grad_b = _linear_backward(ctx.site, ctx, grad, x, weight)
        return None, grad_x, grad_w, grad_b


# ---- matmul ----

def _matmul_backward(site: Site, ctx: Any, grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
    scope, route = site.scope, site.route
    needs = ctx.needs_input_grad
    if torch.is_grad_enabled():
        return _kernels.matmul_backward(scope.id, route.id, grad, a, b, needs[1], needs[2])
    kernel = _kernels._backward_gemm_kernel(route)
    grad_a = grad_b = None
    with _compat.blas_library(kernel):
        if needs[1]:
            grad_a = _matmul_grad(site, "grad a", grad, b.transpose(-1, -2), a.shape, kernel)
        if needs[2]:
            grad_b = _matmul_grad(site, "grad b", a.transpose(-1, -2), grad, b.shape, kernel)
    return grad_a, grad_b


def _matmul_grad(site: Site, which: str, lhs: torch.Tensor, rhs: torch.Tensor, shape: torch.Size,
                 kernel: str) -> torch.Tensor:
    """One gradient of a routed matmul, ``lhs @ rhs`` summed to ``shape`` (broadcast batch dims), logged."""
    route = _backward_route(site, which, lambda: _kernels.backward_gemm_route(
        site.scope, site.route, "matmul", f"backward: {which}", (lhs, rhs), kernel))
    site.scope.log.record(route, "backward of matmul")
    result = torch.matmul(lhs, rhs)
    return result if result.shape == shape else result.sum_to_size(shape)


class _MatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, site, a, b):  # type: ignore[override]
        ctx.site = site
        ctx.save_for_backward(a, b)
        return site.route.launcher([a, b])[0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        with no_torch_function():
            a, b = ctx.saved_tensors
            grad_a, grad_b = _matmul_backward(ctx.site, ctx, grad, a, b)
        return None, grad_a, grad_b


# ---- conv2d ----

class _Conv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, site, x, weight, bias):  # type: ignore[override]
        ctx.site = site
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return site.route.launcher([x, weight, bias, None])[0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        site = ctx.site
        stride, padding, dilation, groups = site.attrs
        with no_torch_function():
            x, weight = ctx.saved_tensors
            grads = _kernels.conv2d_backward(site.scope.id, grad, x, weight, ctx.has_bias, stride, padding, dilation,
                                             groups, ctx.needs_input_grad[1:4])
        return (None,) + tuple(grads)


# ---- attention ----

# What the backward of PyTorch's backend runs after an xpuruntime forward kernel that wrote the log-sum-exp.
_LSE_BACKWARD = {"flash_v2": "torch_flash", "cudnn": "torch_cudnn"}


class _LseBackwardArgs:
    """What ``aten._scaled_dot_product_flash_attention_backward`` (kind "torch_flash") or
    ``aten._scaled_dot_product_cudnn_attention_backward`` ("torch_cudnn") takes besides the tensors, learnt once
    per device from PyTorch's own forward of that backend on a small input: the sequence-offset and (unused without
    dropout) RNG state tensors, and whether its log-sum-exp has the layout xpuruntime's ``return_lse`` writes
    ([B, H, Sq] float32; cuDNN's [B, H, Sq, 1] is a view of it)."""

    _known: Dict[Tuple[str, torch.device, torch.dtype, int], Optional[tuple]] = {}

    @classmethod
    def get(cls, kind: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> Optional[tuple]:
        key = (kind, device, dtype, head_dim)
        if key in cls._known:
            return cls._known[key]
        result = None
        if not torch.cuda.is_current_stream_capturing():
            try:
                q = torch.zeros(1, 1, 33, head_dim, device=device, dtype=dtype)
                if kind == "torch_cudnn":
                    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True, 0.0, False, False)
                    expected = (1, 1, 33, 1)
                else:
                    out = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, False, False)
                    expected = (1, 1, 33)
                lse, cum_q, cum_k, seed, offset = out[1], out[2], out[3], out[6], out[7]
                if tuple(lse.shape) == expected and lse.dtype == torch.float32:
                    result = (cum_q, cum_k, seed, offset)
            except (RuntimeError, TypeError, IndexError, AttributeError):
                result = None
            cls._known[key] = result
        return result


def _attention_lse_launcher(route: Route, bound: Sequence[Optional[torch.Tensor]]) -> Optional[Launcher]:
    """The forward kernel (flash_v2 or cudnn) with ``return_lse=1``, for a forward whose backward PyTorch's backend of
    the same family can take directly (Note [Backward] in _kernels)."""
    q, k, v = bound[0], bound[1], bound[2]
    kind = _LSE_BACKWARD.get(route.kernel)
    if kind is None or q.device.type != "cuda" or k.shape[1] != q.shape[1]:
        return None
    is_causal = bool(route.attrs.get("causal", 0))
    choice, _ = _kernels._attention_backward_choice(route, q, k, v, None, is_causal)
    if choice != kind or _LseBackwardArgs.get(kind, q.device, q.dtype, q.shape[-1]) is None:
        return None
    attrs = dict(route.attrs, return_lse=1)
    inputs = _routing.xpuruntime_views((q, k, v, None))
    try:
        prepared = _core.PreparedCall("attention", inputs, attrs, route.kernel_policy, route.exec_policy)
    except (_core.UnsupportedOperationError, _core.InvalidArgumentError):
        return None
    return Launcher(prepared, q.device)


def lse_backward_route(site: Site, grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor) -> Tuple[Route, str, tuple]:
    """The logged route of an attention site's backward on PyTorch's backend of the forward kernel's family (the
    forward returned the log-sum-exp), that backend ("torch_flash" or "torch_cudnn"), and its backward's
    (cum_q, cum_k, seed, offset) arguments."""
    kind = _LSE_BACKWARD[site.route.kernel]
    args = _LseBackwardArgs.get(kind, q.device, q.dtype, q.shape[-1])
    route = _backward_route(site, "lse", lambda: _routing.torch_route(
        site.scope, "attention", "backward", (grad, q, k, v, None), kind,
        f"xpuruntime's {site.route.kernel} has no backward kernel: PyTorch's {kind} backward, on the forward's "
        "output and log-sum-exp (return_lse)"))
    return route, kind, args


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, site, q, k, v):  # type: ignore[override]
        ctx.site = site
        if site.lse_launcher is not None:
            out, lse = site.lse_launcher([q, k, v, None])
            ctx.save_for_backward(q, k, v, out, lse)
            return out
        ctx.save_for_backward(q, k, v)
        return site.route.launcher([q, k, v, None])[0]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        site = ctx.site
        is_causal, scale, enable_gqa = site.attrs
        with no_torch_function():
            saved = ctx.saved_tensors
            q, k, v = saved[0], saved[1], saved[2]
            if len(saved) == 5 and not torch.is_grad_enabled():
                out, lse = saved[3], saved[4]
                route, kind, args = lse_backward_route(site, grad, q, k, v)
                site.scope.log.record(route, "backward of attention")
                grad_q, grad_k, grad_v = _kernels.lse_backward(kind, grad.contiguous(), q, k, v, out, lse, *args,
                                                               is_causal, scale)
            else:
                grad_q, grad_k, grad_v = _kernels.attention_backward(grad, q, k, v, None, is_causal, scale,
                                                                     enable_gqa, site.scope.id, site.route.id)
        needs = ctx.needs_input_grad
        return (None, grad_q if needs[1] else None, grad_k if needs[2] else None, grad_v if needs[3] else None)


_FUNCTIONS = {"matmul": _MatmulFunction, "linear": _LinearFunction, "conv2d": _Conv2dFunction,
              "attention": _AttentionFunction}
