"""The custom ops routed calls go through: ``torch.ops.xpuruntime.{matmul,linear,conv2d,attention}``.

Each is a ``torch.library.custom_op`` (PyTorch >= 2.4) with a fake implementation (shapes only, so that
``torch.compile`` traces it as one opaque node) and an autograd formula (Note [Backward] in _kernels). On older
PyTorch the same implementations run through ``torch.autograd.Function``.

The non-tensor arguments: ``scope`` (the policy scope's id), ``route`` (the id of the route decided in eager mode,
or -1: decide at run time, which is what compiled graphs pass) and, for matmul, ``phase`` (0: a forward call, 1: the
grad-input GEMM of a linear backward, decided under the linear rule).

The middle layer, above ``_kernels`` (Note [The layers of xpuruntime.pytorch] in __init__.py): the custom ops call
the kernels; a kernel formula that needs a custom op (linear's differentiable grad input) is passed it.
"""

# No `from __future__ import annotations`: custom_op reads the type hints as objects.
from typing import Callable, List, Optional, Tuple

import torch

from . import _compat, _kernels

Tensor = torch.Tensor


def _autograd_function(name: str, impl: Callable, setup: Optional[Callable],
                       backward: Optional[Callable]) -> Callable:
    if backward is None:
        return impl

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):  # type: ignore[override]
            output = impl(*args)
            setup(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):  # type: ignore[override]
            return backward(ctx, *grads)

    _Function.__name__ = f"xpuruntime_{name}"
    return _Function.apply


def _define(name: str, impl: Callable, fake: Callable, setup: Optional[Callable] = None,
            backward: Optional[Callable] = None) -> Callable:
    eager = _autograd_function(name, impl, setup, backward)
    if not _compat.HAS_CUSTOM_OP:
        return eager
    op = torch.library.custom_op(f"xpuruntime::{name}", impl, mutates_args=())
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup)

    # Note [Eager calls skip the custom op]: a torch.library.custom_op call costs about 200 us of host time in eager
    # mode on PyTorch 2.11 (its autograd wrapper and Dynamo-disable guards: measured on an H200, docs/pytorch.md),
    # more than the kernels it routes to take for small and mid-size calls. Eager calls therefore run the same
    # impl / setup_context / backward through a torch.autograd.Function; while torch.compile traces, the call is the
    # custom op (one opaque node, shapes from the fake implementation), and so it is whenever its tensors are
    # tracing tensors (AOTAutograd tracing a backward that calls another routed op).
    def call(*args):
        if _compat.is_compiling() or any(isinstance(a, torch.Tensor) and _compat.is_traced(a) for a in args):
            return op(*args)
        return eager(*args)

    call.__name__ = f"xpuruntime_{name}"
    call.custom_op = op
    return call


# ---- matmul ----

def _matmul_impl(a: Tensor, b: Tensor, scope: int, route: int, phase: int) -> Tensor:
    return _kernels.matmul_forward(a, b, scope, route, phase)


def _matmul_fake(a, b, scope, route, phase):
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty(tuple(batch) + (a.shape[-2], b.shape[-1]))


def _matmul_setup(ctx, inputs, output):
    a, b, scope, route, _ = inputs
    ctx.save_for_backward(a, b)
    ctx.scope, ctx.route = scope, route


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a, grad_b = _kernels.matmul_backward(ctx.scope, ctx.route, grad, a, b, ctx.needs_input_grad[0],
                                              ctx.needs_input_grad[1])
    return grad_a, grad_b, None, None, None


matmul = _define("matmul", _matmul_impl, _matmul_fake, _matmul_setup, _matmul_backward)


# ---- linear ----

def _linear_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], scope: int, route: int) -> Tensor:
    return _kernels.linear_forward(x, weight, bias, scope, route)


def _linear_fake(x, weight, bias, scope, route):
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, scope, route = inputs
    ctx.save_for_backward(x, weight)
    ctx.scope, ctx.route = scope, route


def _linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    grads = _kernels.linear_backward(ctx.scope, ctx.route, grad, x, weight, ctx.needs_input_grad[:3], matmul)
    return grads + (None, None)


linear = _define("linear", _linear_impl, _linear_fake, _linear_setup, _linear_backward)


# ---- conv2d ----

def _conv2d_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
                 dilation: List[int], groups: int, scope: int, route: int) -> Tensor:
    return _kernels.conv2d_forward(x, weight, bias, stride, padding, dilation, groups, scope, route)


def _conv2d_fake(x, weight, bias, stride, padding, dilation, groups, scope, route):
    return x.new_empty(_kernels.conv2d_output_shape(x, weight, stride, padding, dilation))


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups, scope, route = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.conv = (list(stride), list(padding), list(dilation), groups)
    ctx.scope = scope


def _conv2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.conv
    grads = _kernels.conv2d_backward(ctx.scope, grad, x, weight, ctx.has_bias, stride, padding, dilation, groups,
                                     ctx.needs_input_grad[:3])
    return grads + (None,) * 6


conv2d = _define("conv2d", _conv2d_impl, _conv2d_fake, _conv2d_setup, _conv2d_backward)


# ---- attention ----

def _attention_backward_impl(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                             is_causal: bool, scale: float, enable_gqa: bool, scope: int,
                             route: int) -> Tuple[Tensor, Tensor, Tensor]:
    grad_q, grad_k, grad_v = _kernels.attention_backward(grad, q, k, v, mask, is_causal, scale, enable_gqa, scope,
                                                         route)
    return grad_q.contiguous(), grad_k.contiguous(), grad_v.contiguous()


def _attention_backward_fake(grad, q, k, v, mask, is_causal, scale, enable_gqa, scope, route):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# Opaque as well: which PyTorch backward runs (flash, efficient, math) is decided at run time, on real tensors.
attention_backward = _define("attention_backward", _attention_backward_impl, _attention_backward_fake)


def _attention_impl(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool, scale: float,
                    enable_gqa: bool, scope: int, route: int) -> Tensor:
    return _kernels.attention_forward(q, k, v, mask, is_causal, scale, enable_gqa, scope, route).contiguous()


def _attention_fake(q, k, v, mask, is_causal, scale, enable_gqa, scope, route):
    return q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))


def _attention_setup(ctx, inputs, output):
    q, k, v, mask, is_causal, scale, enable_gqa, scope, route = inputs
    ctx.save_for_backward(q, k, v, mask)
    ctx.attrs = (is_causal, scale, enable_gqa, scope, route)


def _attention_backward(ctx, grad):
    q, k, v, mask = ctx.saved_tensors
    grad_q, grad_k, grad_v = attention_backward(grad, q, k, v, mask, *ctx.attrs)
    needs = ctx.needs_input_grad
    return (grad_q if needs[0] else None, grad_k if needs[1] else None, grad_v if needs[2] else None,
            None, None, None, None, None, None)


attention = _define("attention", _attention_impl, _attention_fake, _attention_setup, _attention_backward)
