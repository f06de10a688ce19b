"""What a routed call runs: xpuruntime's kernels on torch's memory and stream, PyTorch's backends, and the
backward formulas (xpuruntime's forward kernels, its linear_grad_weight, and PyTorch's gradients elsewhere).

Note [Running an xpuruntime kernel inside PyTorch]
A route to an xpuruntime kernel holds its C++ plan, prepared once (``_routing.Launcher``): each call allocates the
outputs and the workspace with ``torch.empty`` and launches the plan on the tensors' data pointers and
``torch.cuda.current_stream()`` (Note [The routed call's host path] in _routing).

Note [Backward]
Gradients run on xpuruntime's kernels where it has them, else on PyTorch, on the same library where one exists:
- linear: grad input = grad @ W goes through the policy's rule again (an xpuruntime matmul when the rule names
  one: its operands are contiguous as they are); grad weight = gradᵀ @ x and grad bias go to xpuruntime's
  ``linear_grad_weight`` under the same rule (cuBLASLt reads grad transposed in place and sums the bias gradient
  in the GEMM's BGRADB epilogue: one call where PyTorch runs a GEMM and a reduction; the cpu kernel on the CPU).
  Where the rule's kernel has no ``linear_grad_weight`` (cublas), PyTorch's GEMM on the forward kernel's library
  runs grad weight (cublas -> torch_cublas) and grad bias is a sum. The differentiable formulas
  (``create_graph=True``) always use PyTorch's GEMM.
- matmul: both gradients need a transposed operand: PyTorch's GEMM on the forward kernel's library.
- conv2d: ``aten.convolution_backward`` (cuDNN on CUDA).
- attention: where the forward kernel wrote the log-sum-exp (flash_v2 and cudnn with ``return_lse``), PyTorch's
  backward of the same family runs on the forward's output and log-sum-exp with no recomputation: cuDNN's
  (``aten._scaled_dot_product_cudnn_attention_backward``) after xpuruntime's cudnn, FlashAttention's after
  flash_v2. Otherwise the forward's softmax statistics are recomputed by a PyTorch backend, then its backward
  runs: cuDNN's first after a cuDNN forward, then FlashAttention's, the memory-efficient backend's, and an
  explicit fp32 math backward. A rule that lists PyTorch backends (``["flash_v2", "torch_flash"]``) puts them
  first. The decision log records each backward kernel and why.

The middle layer (Note [The layers of xpuruntime.pytorch] in __init__.py): it imports ``_compat`` and ``_routing``
of the package; the custom ops (``_ops``), the fast path and the mode call it.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .. import _core
from . import _compat, _routing
from ._routing import PolicyState, Route, suspended

# ---------------------------------------------------------------------------------------------------------------
# Support answers of PyTorch's kernels
# ---------------------------------------------------------------------------------------------------------------

def gemm_support(device: torch.device):
    def support(kernel: str) -> Tuple[bool, str]:
        if kernel == "torch":
            return True, ""
        if device.type != "cuda":
            return False, f"runs on CUDA devices; the call is on {device}"
        if not _compat.has_blas_choice():
            return False, f"PyTorch {torch.__version__} cannot choose its BLAS library (needs >= 2.3)"
        return True, ""
    return support


def conv_support(device: torch.device):
    def support(kernel: str) -> Tuple[bool, str]:
        if kernel == "torch":
            return True, ""
        if device.type != "cuda":
            return False, f"runs on CUDA devices; the call is on {device}"
        if not torch.backends.cudnn.is_available():
            return False, "this PyTorch has no cuDNN"
        return True, ""
    return support


def attention_support(q, k, v, mask, is_causal: bool, enable_gqa: bool):
    def support(kernel: str) -> Tuple[bool, str]:
        return _compat.sdpa_support(kernel, q, k, v, mask, 0.0, is_causal, enable_gqa)
    return support


# ---------------------------------------------------------------------------------------------------------------
# Running on xpuruntime (Note [Running an xpuruntime kernel inside PyTorch])
# ---------------------------------------------------------------------------------------------------------------

def run_xpuruntime(route: Route, inputs: Sequence[Optional[torch.Tensor]]) -> torch.Tensor:
    """Runs the route's xpuruntime kernel on ``inputs`` (contiguous; schema order, None for an absent optional
    input) and returns its first output (Note [The routed call's host path] in _routing)."""
    return route.launcher(inputs)[0]


def _record(scope: PolicyState, route: Route, op_type: str, inputs: Sequence[Optional[torch.Tensor]]) -> None:
    if not any(t is not None and _compat.is_traced(t) for t in inputs):
        scope.log.record(route, op_type)


def torch_context(route: Route) -> contextlib.AbstractContextManager:
    """The context that makes PyTorch run ``route.kernel``: a BLAS library, cuDNN, an SDPA backend. (TF32 follows
    PyTorch's own flags, which xpuruntime.pytorch.autocast sets.)"""
    return _routing.torch_backend_context(route.kernel, route.op)


def run_forward(scope_id: int, route_id: int, tensors: Tuple[Optional[torch.Tensor], ...],
                decide: Callable[..., Route], op_type: str, torch_call: Callable[..., torch.Tensor],
                absent: Tuple[None, ...] = ()) -> torch.Tensor:
    """The forward of a routed op: its route (decided by the mode, or now over contiguous ``tensors`` and logged as
    ``op_type``), then xpuruntime's kernel on ``tensors`` plus ``absent`` optional inputs, or ``torch_call`` under
    the route's PyTorch context."""
    scope = _routing.scope_by_id(scope_id)
    with suspended():
        if route_id >= 0:
            route = _routing.route_by_id(route_id)
        else:
            tensors = tuple(t.contiguous() if t is not None else None for t in tensors)
            route = decide(scope, *tensors)
            _record(scope, route, op_type, tensors)
        if route.on_xpuruntime:
            return run_xpuruntime(route, tensors + absent)
        with torch_context(route):
            return torch_call(*tensors)


# ---------------------------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------------------------

#: phase index of the matmul custom op -> (phase name, the op whose policy rule applies)
MATMUL_PHASES = (("forward", "matmul"), ("backward: grad input", "linear"))


def _gemm_backward_note(route: Route, what: str) -> str:
    kernel = _routing.TORCH_EQUIVALENT.get(route.kernel, route.kernel)
    if route.on_xpuruntime:
        return f"{what} on {kernel} (PyTorch's GEMM on the library of {route.kernel})"
    return f"{what} on PyTorch's autograd ({route.kernel})"


def decide_matmul(scope: PolicyState, a: torch.Tensor, b: torch.Tensor, phase: int = 0) -> Route:
    name, rule_op = MATMUL_PHASES[phase]
    return _routing.decide(scope, "matmul", name, (a, b), {}, (), gemm_support(a.device), rule_op=rule_op,
                           backward=lambda r: _gemm_backward_note(r, "grad a, grad b") if phase == 0 else "")


def matmul_forward(a: torch.Tensor, b: torch.Tensor, scope_id: int, route_id: int, phase: int) -> torch.Tensor:
    return run_forward(scope_id, route_id, (a, b), lambda scope, a, b: decide_matmul(scope, a, b, phase),
                       "xpuruntime::matmul", torch.matmul)


def _backward_gemm_kernel(forward: Optional[Route]) -> str:
    if forward is None:
        return "torch"
    return _routing.TORCH_EQUIVALENT.get(forward.kernel, forward.kernel) if forward.kernel != "torch" else "torch"


def backward_gemm_route(scope: PolicyState, forward: Optional[Route], op: str, phase: str,
                        operands: Tuple[torch.Tensor, torch.Tensor], kernel: str) -> Route:
    """The (cached) record of a backward GEMM that PyTorch's ``kernel`` runs."""
    if forward is not None and forward.on_xpuruntime:
        reason = (f"needs a transposed operand, which xpuruntime's matmul does not read in place: PyTorch's GEMM on "
                  f"the library of the forward kernel ({forward.kernel}) runs it")
    else:
        reason = "the forward ran on PyTorch: its GEMM runs the gradient"
    return _routing.torch_route(scope, op, phase, operands, kernel, reason,
                                tf32=_compat.tf32_allowed(operands[0].device.type))


def _log_backward_gemm(scope: PolicyState, forward: Optional[Route], op: str, phase: str,
                       operands: Tuple[torch.Tensor, torch.Tensor], kernel: str) -> None:
    if not _compat.is_traced(operands[0]):
        scope.log.record(backward_gemm_route(scope, forward, op, phase, operands, kernel), f"backward of {op}")


def matmul_backward(scope_id: int, route_id: int, grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    need_a: bool, need_b: bool) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    scope = _routing.scope_by_id(scope_id)
    forward = _routing.route_by_id(route_id) if route_id >= 0 else None
    kernel = _backward_gemm_kernel(forward)
    grad_a = grad_b = None
    with suspended(), _routing.torch_backend_context(kernel, "matmul"):
        if need_a:
            bt = b.transpose(-1, -2)
            _log_backward_gemm(scope, forward, "matmul", "backward: grad a", (grad, bt), kernel)
            grad_a = torch.matmul(grad, bt)
            if grad_a.shape != a.shape:
                grad_a = grad_a.sum_to_size(a.shape)
        if need_b:
            at = a.transpose(-1, -2)
            _log_backward_gemm(scope, forward, "matmul", "backward: grad b", (at, grad), kernel)
            grad_b = torch.matmul(at, grad)
            if grad_b.shape != b.shape:
                grad_b = grad_b.sum_to_size(b.shape)
    return grad_a, grad_b


# ---------------------------------------------------------------------------------------------------------------
# linear
# ---------------------------------------------------------------------------------------------------------------

_LINEAR_ATTRS = {"activation": "none", "weight_layout": "nk"}
_LINEAR_ATTRS_KEY = (("activation", "none"), ("weight_layout", "nk"))


def decide_linear(scope: PolicyState, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Route:
    def backward(route: Route) -> str:
        if not route.on_xpuruntime:
            return f"PyTorch's autograd ({route.kernel})"
        return ("grad input: matmul under the linear rule (grad @ W); grad weight and grad bias: linear_grad_weight "
                "under the linear rule (gradᵀ @ x in place, the bias gradient fused where the kernel can), else " +
                _gemm_backward_note(route, "grad weight") + " and a PyTorch sum")
    return _routing.decide(scope, "linear", "forward", (x, weight, bias), _LINEAR_ATTRS, _LINEAR_ATTRS_KEY,
                           gemm_support(x.device), backward=backward)


def decide_grad_weight(scope: PolicyState, forward: Route, grad2: torch.Tensor, x2: torch.Tensor,
                       bias: bool) -> Optional[Route]:
    """The route of linear's weight gradient (and, with ``bias``, its bias gradient in the same call) on xpuruntime's
    ``linear_grad_weight`` under the linear rule: gradᵀ @ x read in place (cuBLASLt: the bias gradient summed in
    the GEMM's BGRADB epilogue, no separate reduction). None where the forward ran on PyTorch or the rule's kernel
    does not implement it: PyTorch's GEMM on the forward kernel's library runs the gradient then (Note [Backward]).
    ``grad2`` [M, N] and ``x2`` [M, K] are contiguous."""
    if not forward.on_xpuruntime:
        return None
    for with_bias in ((True, False) if bias else (False,)):  # no fused bias gradient: grad bias is a sum then
        try:
            route = _routing.decide(scope, "linear_grad_weight", "backward: grad weight", (grad2, x2),
                                    {"bias": int(with_bias)}, (("bias", int(with_bias)),), gemm_support(grad2.device),
                                    rule_op="linear")
        except _core.UnsupportedOperationError:  # a pinned kernel without linear_grad_weight, or no algorithm
            continue
        if route.on_xpuruntime:
            return route
    return None


def linear_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], scope_id: int,
                   route_id: int) -> torch.Tensor:
    return run_forward(scope_id, route_id, (x, weight, bias), decide_linear, "xpuruntime::linear", F.linear)


def linear_backward(scope_id: int, route_id: int, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    needs: Sequence[bool], matmul: Callable[..., torch.Tensor]) -> Tuple[
                        Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The differentiable gradients of a routed linear (grad x, grad weight, grad bias; None where ``needs`` says
    no). ``matmul`` is the custom op ``_ops.matmul``, which the caller passes (this layer does not import the custom
    ops above it): grad x = grad @ W runs through it, decided again under the linear rule (phase 1)."""
    scope = _routing.scope_by_id(scope_id)
    forward = _routing.route_by_id(route_id) if route_id >= 0 else None
    kernel = _backward_gemm_kernel(forward)
    grad_x = grad_w = grad_b = None
    n, k = weight.shape
    with suspended():
        if needs[0]:
            # grad @ W: [.., N] x [N, K], both contiguous as they are: the linear rule decides again.
            grad_x = matmul(grad.contiguous(), weight, scope_id, -1, 1)
        if needs[1] or needs[2]:
            grad2 = grad.reshape(-1, n)
            if needs[1]:
                with _routing.torch_backend_context(kernel, "linear"):
                    gt = grad2.t()
                    _log_backward_gemm(scope, forward, "linear", "backward: grad weight", (gt, x.reshape(-1, k)),
                                       kernel)
                    grad_w = torch.matmul(gt, x.reshape(-1, k))
            if needs[2]:
                grad_b = grad2.sum(0)
    return grad_x, grad_w, grad_b


# ---------------------------------------------------------------------------------------------------------------
# conv2d
# ---------------------------------------------------------------------------------------------------------------

def conv_attrs(stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int):
    attrs = {"strides": list(stride), "pads": [padding[0], padding[1], padding[0], padding[1]],
             "dilations": list(dilation), "groups": int(groups), "activation": "none"}
    return attrs, (tuple(stride), tuple(padding), tuple(dilation), int(groups))


def _conv_backward_kernel(device: torch.device) -> str:
    return "torch_cudnn" if device.type == "cuda" and torch.backends.cudnn.is_available() and \
        torch.backends.cudnn.enabled else "torch"


def decide_conv2d(scope: PolicyState, x, weight, bias, stride, padding, dilation, groups) -> Route:
    attrs, key = conv_attrs(stride, padding, dilation, groups)
    backward_kernel = _conv_backward_kernel(x.device)
    return _routing.decide(scope, "conv2d", "forward", (x, weight, bias, None), attrs, key, conv_support(x.device),
                           backward=lambda r: f"aten.convolution_backward ({backward_kernel})"
                           if r.on_xpuruntime else f"PyTorch's autograd ({r.kernel})")


def conv2d_forward(x, weight, bias, stride, padding, dilation, groups: int, scope_id: int,
                   route_id: int) -> torch.Tensor:
    return run_forward(
        scope_id, route_id, (x, weight, bias),
        lambda scope, x, weight, bias: decide_conv2d(scope, x, weight, bias, stride, padding, dilation, groups),
        "xpuruntime::conv2d",
        lambda x, weight, bias: F.conv2d(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups),
        absent=(None,))  # no residual input


def conv2d_backward(scope_id: int, grad, x, weight, has_bias: bool, stride, padding, dilation, groups: int,
                    needs: Sequence[bool]):
    scope = _routing.scope_by_id(scope_id)
    kernel = _conv_backward_kernel(x.device)
    with suspended():
        if not _compat.is_traced(grad):
            route = _routing.torch_route(scope, "conv2d", "backward", (grad, x, weight), kernel,
                                         "xpuruntime has no convolution backward kernel: "
                                         "aten.convolution_backward runs the gradients",
                                         tf32=x.device.type == "cuda" and torch.backends.cudnn.allow_tf32)
            scope.log.record(route, "backward of conv2d")
        mask = [bool(needs[0]), bool(needs[1]), bool(has_bias and needs[2])]
        grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad.contiguous(), x, weight, [weight.shape[0]] if has_bias else None, list(stride), list(padding),
            list(dilation), False, [0, 0], groups, mask)
    return (grad_x if mask[0] else None, grad_w if mask[1] else None, grad_b if mask[2] else None)


def conv2d_output_shape(x, weight, stride, padding, dilation) -> List[int]:
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return [n, o, oh, ow]


# ---------------------------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------------------------

def decide_attention(scope: PolicyState, q, k, v, mask, is_causal: bool, scale: float, enable_gqa: bool) -> Route:
    attrs = {"causal": int(bool(is_causal)), "scale": float(scale)}
    gqa = {"enable_gqa": True} if enable_gqa else {}
    return _routing.decide(scope, "attention", "forward", (q, k, v, mask), attrs, (bool(is_causal), float(scale)),
                           attention_support(q, k, v, mask, is_causal, enable_gqa),
                           backward=lambda r: "recompute + " + ", else ".join(_attention_backward_order(r))
                           if r.on_xpuruntime else f"PyTorch's autograd ({r.kernel})",
                           torch_call=lambda q, k, v, mask: F.scaled_dot_product_attention(
                               q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, **gqa))


def attention_forward(q, k, v, mask, is_causal: bool, scale: float, enable_gqa: bool, scope_id: int,
                      route_id: int) -> torch.Tensor:
    kwargs = {"enable_gqa": True} if enable_gqa else {}
    return run_forward(
        scope_id, route_id, (q, k, v, mask),
        lambda scope, q, k, v, mask: decide_attention(scope, q, k, v, mask, is_causal, scale, enable_gqa),
        "xpuruntime::attention",
        lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0,
                                                             is_causal=is_causal, scale=scale, **kwargs))


_BACKWARD_BACKENDS = ("torch_cudnn", "torch_flash", "torch_efficient", "torch_math")


def _attention_backward_order(forward: Optional[Route]) -> List[str]:
    """PyTorch backends to try for the backward: the ones the rule lists, then by the forward kernel."""
    listed = [k for k in (forward.policy_kernels if forward else []) if k in _BACKWARD_BACKENDS]
    kernel = forward.kernel if forward else "torch"
    if kernel in ("cudnn", "torch_cudnn"):  # cuDNN's forward: its own backward first
        default = ["torch_cudnn", "torch_flash", "torch_efficient", "torch_math"]
    elif kernel in ("flash_v2", "torch_flash", "torch"):
        default = ["torch_flash", "torch_efficient", "torch_math"]
    elif kernel == "torch_efficient":
        default = ["torch_efficient", "torch_math"]
    else:  # unfused, cpu, torch_math: the math backward is what they compute
        default = ["torch_math"]
    return list(dict.fromkeys(listed + default))


_backward_choices: Dict[tuple, Tuple[str, str]] = {}
_unusable: Dict[str, str] = {}  # backend -> why calling it failed (signature drift between PyTorch versions)


def _attention_backward_choice(forward: Optional[Route], q, k, v, mask, is_causal: bool) -> Tuple[str, str]:
    key = (forward.id if forward else None, q.shape, k.shape, v.shape, q.dtype, q.device,
           None if mask is None else (mask.shape, mask.dtype), is_causal)
    choice = _backward_choices.get(key)
    if choice is not None:
        return choice
    skipped = []
    chosen = "torch_math"
    for kernel in _attention_backward_order(forward):
        ok, why = _backward_backend_support(kernel, q, k, v, mask, is_causal)
        if ok:
            chosen = kernel
            break
        skipped.append(f"{kernel}: {why}")
    what = forward.kernel if forward else "the forward kernel"
    reason = (f"xpuruntime's {what} has no backward kernel: PyTorch's {chosen} backward, after recomputing the "
              f"forward's softmax statistics" if chosen != "torch_math" else
              f"xpuruntime's {what} has no backward kernel: the explicit fp32 math backward")
    if skipped:
        reason += f" (skipped: {'; '.join(skipped)})"
    choice = (chosen, reason)
    _backward_choices[key] = choice
    return choice


def _backward_backend_support(kernel: str, q, k, v, mask, is_causal: bool) -> Tuple[bool, str]:
    if kernel == "torch_math":
        return True, ""
    if kernel in _unusable:
        return False, _unusable[kernel]
    if q.device.type != "cuda":
        return False, f"runs on CUDA devices; the call is on {q.device}"
    if mask is not None:
        return False, "a mask: this backward is called without one"
    if kernel == "torch_flash" and (q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] % 8 != 0 or
                                    q.shape[-1] > 256 or v.shape[-1] != q.shape[-1]):
        return False, "needs float16/bfloat16 and a head dim that is a multiple of 8, at most 256, equal for q and v"
    if kernel == "torch_flash" and is_causal and q.shape[-2] != k.shape[-2]:
        return False, "causal with different query and key lengths (FlashAttention aligns the mask bottom-right)"
    return _compat.sdpa_support(kernel, q, k, v, None, 0.0, is_causal, False)


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _reduce_kv(grad: torch.Tensor, heads: int) -> torch.Tensor:
    if grad.shape[1] == heads:
        return grad
    b, h, s, d = grad.shape
    return grad.view(b, heads, h // heads, s, d).sum(2)


def _math_attention_backward(grad, q, k, v, mask, is_causal: bool, scale: float):
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf, gf = (t.to(compute) for t in (q, k, v, grad))
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.to(compute)
    if is_causal:
        sq, sk = scores.shape[-2], scores.shape[-1]
        upper = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(upper, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    grad_v = torch.matmul(probs.transpose(-1, -2), gf)
    grad_probs = torch.matmul(gf, vf.transpose(-1, -2))
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    grad_q = torch.matmul(grad_scores, kf) * scale
    grad_k = torch.matmul(grad_scores.transpose(-1, -2), qf) * scale
    return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype)


def flash_backward(grad, q, k, v, out, lse, cum_q, cum_k, seed, offset, is_causal: bool, scale: float):
    """PyTorch's FlashAttention backward on a forward's output and log-sum-exp (and its RNG state tensors, unused
    without dropout): (grad q, grad k, grad v)."""
    grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad, q, k, v, out, lse, cum_q, cum_k, q.shape[2], k.shape[2], 0.0, is_causal, seed, offset, scale=scale)
    return grads[0], grads[1], grads[2]


def cudnn_backward(grad, q, k, v, out, lse, cum_q, cum_k, seed, offset, is_causal: bool, scale: float):
    """PyTorch's cuDNN attention backward on a forward's output and log-sum-exp (``lse`` [B, H, Sq] or cuDNN's
    [B, H, Sq, 1]; the RNG state tensors are unused without dropout): (grad q, grad k, grad v)."""
    if lse.dim() == 3:
        lse = lse.unsqueeze(-1)
    grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        grad, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, q.shape[2], k.shape[2], 0.0, is_causal,
        scale=scale)
    return grads[0], grads[1], grads[2]


def lse_backward(kind: str, *args):
    """The backward of PyTorch's backend ``kind`` ("torch_flash" or "torch_cudnn") on a forward's output and
    log-sum-exp: ``flash_backward`` or ``cudnn_backward`` with the same arguments."""
    return (cudnn_backward if kind == "torch_cudnn" else flash_backward)(*args)


def _cudnn_attention_backward(grad, q, k, v, is_causal: bool, scale: float):
    results = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, is_causal, False,
                                                                 scale=scale)
    out, lse, cum_q, cum_k, _, _, seed, offset = results[:8]
    return cudnn_backward(grad, q, k, v, out, lse, cum_q, cum_k, seed, offset, is_causal, scale)


def _flash_attention_backward(grad, q, k, v, is_causal: bool, scale: float):
    results = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)
    out, lse, cum_q, cum_k, _, _, seed, offset = results[:8]
    return flash_backward(grad, q, k, v, out, lse, cum_q, cum_k, seed, offset, is_causal, scale)


def _efficient_attention_backward(grad, q, k, v, is_causal: bool, scale: float):
    aten = torch.ops.aten
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, is_causal,
                                                                          scale=scale)[:4]
    grads = aten._scaled_dot_product_efficient_attention_backward(grad, q, k, v, None, out, lse, seed, offset, 0.0,
                                                                  [True, True, True, False], is_causal, scale=scale)
    return grads[0], grads[1], grads[2]


def attention_backward(grad, q, k, v, mask, is_causal: bool, scale: float, enable_gqa: bool, scope_id: int,
                       route_id: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scope = _routing.scope_by_id(scope_id)
    forward = _routing.route_by_id(route_id) if route_id >= 0 else None
    with suspended():
        heads = q.shape[1]
        grad = grad.contiguous()
        ke, ve = _expand_kv(k, heads), _expand_kv(v, heads)
        while True:  # GQA: the backends run on keys and values expanded to every query head
            kernel, reason = _attention_backward_choice(forward, q, ke, ve, mask, is_causal)
            if kernel == "torch_math":
                result = _math_attention_backward(grad, q, ke, ve, mask, is_causal, scale)
                break
            run = {"torch_flash": _flash_attention_backward, "torch_cudnn": _cudnn_attention_backward}.get(
                kernel, _efficient_attention_backward)
            try:
                result = run(grad, q.contiguous(), ke.contiguous(), ve.contiguous(), is_causal, scale)
                break
            except torch.cuda.OutOfMemoryError:
                raise
            except (RuntimeError, TypeError, AttributeError) as error:
                # An aten op or signature this PyTorch lacks: say why, and try the next backend.
                _unusable[kernel] = f"calling it failed on PyTorch {torch.__version__}: {error}"
                _backward_choices.clear()
        route = _routing.torch_route(scope, "attention", "backward", (grad, q, k, v, mask), kernel, reason)
        scope.log.record(route, "backward of attention")
        grad_q, grad_k, grad_v = result
        return grad_q, _reduce_kv(grad_k, k.shape[1]), _reduce_kv(grad_v, v.shape[1])
