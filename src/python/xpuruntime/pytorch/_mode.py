"""The TorchFunctionMode that routes matmul/linear, conv2d and scaled_dot_product_attention calls.

Note [The routing mode]
``set_kernel_policy`` pushes one :class:`RoutingMode` on the calling thread's torch function mode stack (and pops
it when routing is turned off). For every torch function call it sees, the mode looks the function up in
``_HANDLERS``; anything else passes straight through. A handler binds the call's arguments, checks that
xpuruntime can take it (plain dense tensors on the CPU or CUDA, the ranks and options the op supports; otherwise
the call stays on PyTorch and the log says why), applies autocast's cast the way autocast would (custom ops have
no autocast rule), and then:

- eagerly: decides the route (cached per signature) and runs it: an xpuruntime kernel through the custom op
  ``torch.ops.xpuruntime.<op>`` (autograd and the backward formulas come with it), or PyTorch's own function under
  the backend context the route names (its own autograd);
- while ``torch.compile`` traces (Dynamo inlines this mode from PyTorch 2.5 on): calls of ops the policy routes to
  anything but PyTorch's default become the custom op with route -1, which decides at run time on real tensors
  (and logs there); the mode reads no mutable state here besides the current scope, so Dynamo's guards stay
  valid. Calls the policy leaves to PyTorch stay torch calls that Inductor compiles as usual.

The top layer (Note [The layers of xpuruntime.pytorch] in __init__.py): it imports every module below it, and hands
the mode object down to the native path's extension (``_extension.register_mode``) instead of being imported by it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack, _pop_mode, _push_mode

from ..policies import ExecutionPolicy, KernelPolicy
from . import _compat, _extension, _fast, _kernels, _native, _ops, _routing
from ._fast import conv2d_args, linear_args, sdpa_args
from ._log import DecisionLog
from ._routing import PolicyState
from ._state import STATE

_DEVICE_TYPES = ("cpu", "cuda")
_ROUTABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _why_not_plain(tensors) -> Optional[str]:
    """Why xpuruntime cannot take these tensors (None: it can). Plain loops: Dynamo traces this."""
    first = None
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            return f"an argument is a {type(t).__name__}, not a tensor"
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            return f"a tensor subclass ({type(t).__name__}) keeps its own dispatch"
        if t.layout != torch.strided:
            return f"a {t.layout} tensor: xpuruntime takes dense tensors"
        if t.device.type not in _DEVICE_TYPES:
            return f"a tensor on {t.device}: xpuruntime runs on the CPU and CUDA"
        if t.dtype not in _ROUTABLE_DTYPES:
            return f"a {t.dtype} tensor: xpuruntime's kernels take floating-point tensors"
        if t.numel() == 0:
            return "an empty tensor"
        if first is None:
            first = t
        elif t.device != first.device:
            return "inputs on different devices"
        elif t.dtype != first.dtype and _compat.autocast_dtype(t.device.type) is None:
            # Under autocast the binder casts every floating input to autocast's dtype (_cast), as autocast would.
            return "inputs of different dtypes"
    return None


def _cast(tensors, device_type: str) -> list:
    dtype = _compat.autocast_dtype(device_type)
    if dtype is None:
        return list(tensors)
    return [_compat.autocast_cast(t, dtype) for t in tensors]


def _broadcastable(a, b) -> bool:
    for x, y in zip(reversed(list(a)), reversed(list(b))):
        if x != y and x != 1 and y != 1:
            return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Argument binding and eligibility, per op. A binder returns (op tensors, op attributes, None) for a call xpuruntime
# can take, else (None, None, reason): PyTorch runs the call (reason None: PyTorch will raise its own error).
# No exceptions: Dynamo traces binders.
# ---------------------------------------------------------------------------------------------------------------

def _bind_matmul(kind: str):
    def bind(args, kwargs):
        if kwargs.get("out") is not None:
            return None, None, "out= is given"
        if len(args) != 2 or len(kwargs) > ("out" in kwargs):
            return None, None, None
        a, b = args[0], args[1]
        why = _why_not_plain((a, b))
        if why:
            return None, None, why
        if a.dim() < 2 or b.dim() < 2:
            return None, None, "a 1-D operand: xpuruntime's matmul takes operands of rank >= 2"
        if kind == "mm" and (a.dim() != 2 or b.dim() != 2):
            return None, None, None
        if kind == "bmm" and (a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]):
            return None, None, None
        if a.shape[-1] != b.shape[-2] or not _broadcastable(a.shape[:-2], b.shape[:-2]):
            return None, None, None
        return _cast((a, b), a.device.type), None, None
    return bind


def _bind_linear(args, kwargs):
    x, weight, bias = linear_args(*args, **kwargs)
    why = _why_not_plain((x, weight, bias))
    if why:
        return None, None, why
    if x.dim() < 2 or weight.dim() != 2 or (bias is not None and bias.dim() != 1):
        return None, None, "xpuruntime's linear takes x of rank >= 2, a 2-D weight and a 1-D bias"
    if x.shape[-1] != weight.shape[1] or (bias is not None and bias.shape[0] != weight.shape[0]):
        return None, None, None
    return _cast((x, weight, bias), x.device.type), None, None


def _pair(value) -> Optional[Tuple[int, int]]:
    if isinstance(value, int):
        return (value, value)
    value = [int(v) for v in value]
    if len(value) == 1:
        return (value[0], value[0])
    return (value[0], value[1]) if len(value) == 2 else None


def _bind_conv2d(args, kwargs):
    x, weight, bias, stride, padding, dilation, groups = conv2d_args(*args, **kwargs)
    why = _why_not_plain((x, weight, bias))
    if why:
        return None, None, why
    if x.dim() != 4 or weight.dim() != 4:
        return None, None, "xpuruntime's conv2d takes a batched 4-D input (NCHW) and a 4-D weight"
    stride, dilation = _pair(stride), _pair(dilation)
    if stride is None or dilation is None:
        return None, None, None
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same":
            total_h = dilation[0] * (weight.shape[2] - 1)
            total_w = dilation[1] * (weight.shape[3] - 1)
            if stride != (1, 1) or total_h % 2 or total_w % 2:
                return None, None, "padding='same' needs asymmetric padding here (or has a stride)"
            padding = (total_h // 2, total_w // 2)
        else:
            return None, None, None
    else:
        padding = _pair(padding)
        if padding is None:
            return None, None, None
    if x.shape[1] != weight.shape[1] * groups:
        return None, None, None
    tensors = _cast((x, weight, bias), x.device.type)
    return tensors, (list(stride), list(padding), list(dilation), int(groups)), None


def _bind_attention(args, kwargs):
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = sdpa_args(*args, **kwargs)
    why = _why_not_plain((q, k, v))
    if why:
        return None, None, why
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return None, None, "xpuruntime's attention takes 4-D [batch, heads, seq, dim] tensors"
    if dropout_p:
        return None, None, f"dropout_p={dropout_p}: xpuruntime's attention kernels have no dropout"
    if mask is not None and is_causal:
        return None, None, None
    if k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1] or (q.shape[1] != k.shape[1] and not enable_gqa):
        return None, None, None
    q, k, v = _cast((q, k, v), q.device.type)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.requires_grad or mask.dim() > 4:
            return None, None, "an attn_mask that is not a plain tensor of rank <= 4, or that requires grad"
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=mask.device).masked_fill(~mask, float("-inf"))
        elif mask.is_floating_point():
            mask = mask.to(q.dtype)
        else:
            return None, None, f"an attn_mask of dtype {mask.dtype}"
        if mask.dim() < 4:
            mask = mask.reshape([1] * (4 - mask.dim()) + list(mask.shape))
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return [q, k, v, mask], (bool(is_causal), scale, bool(enable_gqa)), None


# ---------------------------------------------------------------------------------------------------------------
# Running a bound call
# ---------------------------------------------------------------------------------------------------------------

def _decide(op: str, scope: PolicyState, tensors, attrs) -> _routing.Route:
    if op == "matmul":
        return _kernels.decide_matmul(scope, *tensors)
    if op == "linear":
        return _kernels.decide_linear(scope, *tensors)
    if op == "conv2d":
        return _kernels.decide_conv2d(scope, *tensors, *attrs)
    return _kernels.decide_attention(scope, *tensors, *attrs)


def _run_op(op: str, tensors, attrs, scope_id: int, route_id: int) -> torch.Tensor:
    if op == "matmul":
        return _ops.matmul(tensors[0], tensors[1], scope_id, route_id, 0)
    if op == "linear":
        return _ops.linear(tensors[0], tensors[1], tensors[2], scope_id, route_id)
    if op == "conv2d":
        return _ops.conv2d(tensors[0], tensors[1], tensors[2], *attrs, scope_id, route_id)
    return _ops.attention(*tensors, *attrs, scope_id, route_id)


_BINDERS: Dict[str, Callable] = {}
_HANDLERS: Dict[Any, Tuple[str, str, Callable]] = {}  # torch function -> (op, display name, binder)


def _register(functions, op: str, binder: Callable) -> None:
    for func, name in functions:
        if func is not None:
            _HANDLERS[func] = (op, name, binder)


_register([(torch.matmul, "torch.matmul"), (torch.Tensor.matmul, "Tensor.matmul"),
           (torch.Tensor.__matmul__, "Tensor.__matmul__")], "matmul", _bind_matmul("matmul"))
_register([(torch.mm, "torch.mm"), (torch.Tensor.mm, "Tensor.mm")], "matmul", _bind_matmul("mm"))
_register([(torch.bmm, "torch.bmm"), (torch.Tensor.bmm, "Tensor.bmm")], "matmul", _bind_matmul("bmm"))
_register([(F.linear, "F.linear")], "linear", _bind_linear)
_register([(F.conv2d, "F.conv2d")], "conv2d", _bind_conv2d)
_register([(getattr(F, "scaled_dot_product_attention", None), "F.scaled_dot_product_attention")], "attention",
          _bind_attention)


def _passthrough_tensors(op: str, args, kwargs):
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    return tensors[:4] if op in ("attention",) else tensors[:3]


class RoutingMode(TorchFunctionMode):
    """Routes the torch functions in ``_HANDLERS`` under the current policy scope (Note [The routing mode])."""

    def _torch_function_py(self, func, types, args=(), kwargs=None):
        handler = _HANDLERS.get(func)
        if handler is None:  # every torch call passes here: keep this path short
            return func(*args, **kwargs) if kwargs else func(*args)
        kwargs = kwargs or {}
        scope = STATE.current
        if scope is None:
            return func(*args, **kwargs)
        op, name, binder = handler
        if _compat.is_compiling():
            if op not in scope.routed_ops:
                return func(*args, **kwargs)
            tensors, attrs, _ = binder(args, kwargs)
            if tensors is None:
                return func(*args, **kwargs)
            return _run_op(op, tensors, attrs, scope.id, -1)
        if _routing.routing_suspended():
            return func(*args, **kwargs)
        return self._eager(scope, op, name, binder, func, args, kwargs)

    # What PyTorch and Dynamo call. In eager mode the native path replaces it on the mode object itself
    # (Note [The native path] in routing_native.cpp; _extension._attach).
    __torch_function__ = _torch_function_py

    def _eager(self, scope: PolicyState, op: str, name: str, binder, func, args, kwargs):
        key = _fast.call_key(func, scope, args, kwargs)
        if key is not None:
            site = _fast.SITES.get(key)
            if site is not None:
                result = site(func, args, kwargs)
                if not site.native_tried and _extension.DISPATCH is not None:
                    _native.register(site, func, args, kwargs)
                return result
        if scope.rule_for(op) is None:
            route = self._log_torch(scope, op, name, args, kwargs, "unrouted", None)
            return self._passthrough(key, route, name, func, args, kwargs)
        tensors, attrs, reason = binder(args, kwargs)
        if tensors is None:
            route = self._log_torch(scope, op, name, args, kwargs, "fallback", reason) if reason is not None else None
            return self._passthrough(key, route, name, func, args, kwargs)
        route = _decide(op, scope, tensors, attrs)
        if key is not None:
            site = _fast.make_site(op, name, scope, route, attrs, args, kwargs, tensors)
            if site is not None:
                result = _fast.run_site(key, site, func, args, kwargs)
                _native.register(site, func, args, kwargs)  # after the call: a grad site needs its first backward
                return result
        scope.log.record(route, name)
        if route.on_xpuruntime:
            return _run_op(op, tensors, attrs, scope.id, route.id)
        with _routing.suspended(), _kernels.torch_context(route):
            return func(*args, **kwargs)

    @staticmethod
    def _passthrough(key: Optional[tuple], route: Optional[_routing.Route], name: str, func, args, kwargs):
        """PyTorch runs the call as it is; later calls of the signature go straight to it (logged as ``route``)."""
        if key is not None and route is not None:
            site = _fast.TorchSite(route, name)
            with _fast._sites_lock:
                _fast.SITES.setdefault(key, site)
            _native.register(site, func, args, kwargs)
        return func(*args, **kwargs)

    @staticmethod
    def _log_torch(scope: PolicyState, op: str, name: str, args, kwargs, rule: str,
                   reason: Optional[str]) -> Optional[_routing.Route]:
        tensors = _passthrough_tensors(op, args, kwargs)
        if not tensors or any(_compat.is_traced(t) for t in tensors):
            return None
        if rule == "unrouted":
            family = _routing.FAMILIES.get(op, op)
            where = f"'{op}'" + (f" or its family '{family}'" if family != op else "")
            reason = f"the KernelPolicy has no rule for {where}: PyTorch's own dispatch"
        else:
            reason = f"{reason}; PyTorch runs it"
        route = _routing.torch_route(scope, op, "forward", tensors, "torch", reason, rule=rule,
                                     tf32=_compat.tf32_allowed(tensors[0].device.type))
        scope.log.record(route, name)
        return route


_MODE = RoutingMode()
_extension.register_mode(_MODE, list(_HANDLERS), _MODE._torch_function_py)


class PolicyScope:
    """A kernel policy put in force by :func:`~xpuruntime.pytorch.set_kernel_policy`, with the decision log of the
    calls routed since. Used as a context manager, leaving it restores the policy that was in force before.

    Attributes
    ----------
    policy : KernelPolicy
    exec_policy : ExecutionPolicy
    log : DecisionLog
        One record per call site routed under this scope (the backward passes of its forward calls included).
    """

    def __init__(self, state: PolicyState, previous: Optional["PolicyScope"]) -> None:
        self.state = state
        self._previous = previous
        self.log = DecisionLog(repr(state.policy), repr(state.exec_policy))
        state.log.hand_over(self.log)
        state.log = self.log  # the state's routes record here from now on

    @property
    def policy(self) -> KernelPolicy:
        return self.state.policy

    @property
    def exec_policy(self) -> ExecutionPolicy:
        return self.state.exec_policy

    def decision_log(self) -> DecisionLog:
        """The decisions logged under this scope (also ``self.log``)."""
        return self.log

    def __enter__(self) -> "PolicyScope":
        return self

    def __exit__(self, *exc: Any) -> None:
        activate(self._previous)

    def __repr__(self) -> str:
        return f"<PolicyScope {self.policy!r} {self.exec_policy!r}, {len(self.log)} call sites>"


def activate(scope: Optional[PolicyScope]) -> None:
    """Make ``scope`` current (None: routing off) and keep the routing mode on this thread's stack accordingly."""
    STATE.scope = scope
    STATE.current = scope.state if scope is not None else None
    if scope is not None:
        _extension.ensure_loaded()
    _extension.sync_state()
    stack = _get_current_function_mode_stack()
    if scope is not None and not any(m is _MODE for m in stack):
        _push_mode(_MODE)
    elif scope is None and stack and stack[-1] is _MODE:
        _pop_mode()
