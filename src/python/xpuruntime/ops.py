"""Functional ops over tensors, each call dispatched through a KernelPolicy and an ExecutionPolicy.

Inputs may be xpuruntime Tensors or any DLPack tensor (numpy, torch, cupy), taken zero-copy; outputs are
xpuruntime Tensors on the inputs' device (``np.from_dlpack(y)`` / ``torch.from_dlpack(y)`` view them zero-copy).
CUDA calls run on ``stream`` (an xpuruntime Stream, a torch/cupy stream or a raw handle; default: xpuruntime's
current stream of the device) and are asynchronous like any stream work. ``out=`` (a tensor, or a list for
:func:`call`) makes an op write into caller-allocated outputs (contiguous, of the op's output shapes and dtypes;
:func:`plan` tells them) instead of new ones: a framework's own memory, e.g. torch tensors.

Semantics of every op: ``docs/ops.md``. Why a kernel was chosen: pass ``return_decision=True`` or read
:func:`decisions`.

Examples
--------
>>> y = xrt.ops.matmul(a, b, policy=xrt.KernelPolicy(matmul="pin:cublasLt"))
>>> y, decision = xrt.ops.attention(q, k, v, causal=True, return_decision=True)
>>> print(decision.kernel, decision.reason)
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

from . import _core
from .policies import ExecutionPolicy, KernelPolicy

__all__ = [
    "call", "plan", "decisions", "set_default_policies", "default_policies", "set_autotune_cache", "autotune_cache",
    "matmul", "linear", "conv2d", "attention", "scaled_dot_product_attention", "softmax", "layer_norm", "gelu",
    "relu", "sigmoid", "tanh", "silu", "exp", "log", "sqrt", "neg", "abs", "erf", "reciprocal", "add", "sub",
    "mul", "div", "pow", "maximum", "minimum", "cast", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
    "max_pool2d", "avg_pool2d", "global_avg_pool", "batch_norm",
]


def _policies(policy: Optional[_core.KernelPolicy], exec_policy: Optional[_core.ExecutionPolicy]):
    if policy is not None and not isinstance(policy, _core.KernelPolicy):
        if isinstance(policy, dict):
            policy = KernelPolicy(policy)
        else:
            raise _core.InvalidTypeError(f"policy must be a KernelPolicy or a dict, got {type(policy).__name__}")
    if exec_policy is not None and not isinstance(exec_policy, _core.ExecutionPolicy):
        if isinstance(exec_policy, dict):
            exec_policy = ExecutionPolicy(**exec_policy)
        else:
            raise _core.InvalidTypeError(
                f"exec_policy must be an ExecutionPolicy or a dict, got {type(exec_policy).__name__}")
    return policy, exec_policy


def call(op: str, inputs: Sequence[Any], attrs: Optional[dict] = None, *, policy=None, exec_policy=None,
         stream=None, out: Optional[Sequence[Any]] = None, workspace: Any = None, return_decision: bool = False):
    """Run ``op`` on ``inputs`` (None for an absent optional input) with ``attrs``.

    ``out``: caller-allocated outputs (any DLPack tensors: contiguous, of the shapes and dtypes :func:`plan` gives);
    ``workspace``: a caller-allocated byte buffer of at least ``plan(...)[2]`` bytes on the op's device (only with
    ``out``). With both, the call allocates nothing. Returns the list of outputs (xpuruntime views of ``out`` when
    given), or ``(outputs, decision)`` with ``return_decision=True``.
    """
    policy, exec_policy = _policies(policy, exec_policy)
    if out is None and workspace is not None:
        raise _core.InvalidArgumentError(f"{op}: workspace= needs out= (caller-allocated outputs)")
    return _core.ops_call(op, list(inputs), attrs, policy, exec_policy, stream, return_decision,
                          None if out is None else list(out), workspace)


def plan(op: str, inputs: Sequence[Any], attrs: Optional[dict] = None, *, policy=None, exec_policy=None):
    """What :func:`call` would run, without running it: ``(decision, [(shape, dtype)] of the outputs,
    workspace_bytes)`` (dispatching, and so autotuning, like ``call``)."""
    policy, exec_policy = _policies(policy, exec_policy)
    return _core.ops_plan(op, list(inputs), attrs, policy, exec_policy)


def _single(op: str, inputs: Sequence[Any], attrs: Optional[dict], policy, exec_policy, stream, return_decision,
            out=None):
    result = call(op, inputs, attrs, policy=policy, exec_policy=exec_policy, stream=stream,
                  out=None if out is None else [out], return_decision=return_decision)
    if return_decision:
        outputs, decision = result
        return outputs[0], decision
    return result[0]


def decisions(policy=None, exec_policy=None) -> List[_core.Decision]:
    """Every distinct decision the functional ops made under these policies (default: the default ones)."""
    policy, exec_policy = _policies(policy, exec_policy)
    kp = policy if policy is not None else _core.ops_default_kernel_policy()
    ep = exec_policy if exec_policy is not None else _core.ops_default_exec_policy()
    return _core.ops_dispatcher(kp, ep).decisions()


def set_default_policies(policy=None, exec_policy=None) -> None:
    """Set the policies used by calls that pass none (process-wide)."""
    policy, exec_policy = _policies(policy, exec_policy)
    _core.ops_set_default_policies(policy if policy is not None else KernelPolicy(),
                                   exec_policy if exec_policy is not None else ExecutionPolicy())


def default_policies():
    """The process-wide default ``(KernelPolicy, ExecutionPolicy)``."""
    return (KernelPolicy._wrap(_core.ops_default_kernel_policy()),
            ExecutionPolicy._wrap(_core.ops_default_exec_policy()))


def set_autotune_cache(cache: Union[str, "_core.AutotuneCache"]) -> "_core.AutotuneCache":
    """Use ``cache`` (an AutotuneCache or a file path) for the functional ops' decisions; returns it."""
    if not isinstance(cache, _core.AutotuneCache):
        cache = _core.AutotuneCache(str(cache))
    _core.ops_set_autotune_cache(cache)
    return cache


def autotune_cache() -> "_core.AutotuneCache":
    """The AutotuneCache the functional ops use (in memory, or the file named by XPURT_AUTOTUNE_CACHE)."""
    return _core.ops_autotune_cache()


# ---- named ops (docs/ops.md) ----

def matmul(a, b, *, policy=None, exec_policy=None, stream=None, out=None, return_decision=False):
    """``a[..., M, K] @ b[..., K, N]`` with broadcast batch dims."""
    return _single("matmul", [a, b], None, policy, exec_policy, stream, return_decision, out)


def linear(x, weight, bias=None, activation: str = "none", *, weight_layout: str = "nk", policy=None,
           exec_policy=None, stream=None, out=None, return_decision=False):
    """``act(x @ weight.T + bias)``; ``weight`` is ``[N, K]`` (``weight_layout="kn"``: ``[K, N]``).
    ``activation``: ``"none"``, ``"relu"``, ``"gelu"`` or ``"gelu_tanh"``."""
    return _single("linear", [x, weight, bias], {"activation": activation, "weight_layout": weight_layout}, policy,
                   exec_policy, stream, return_decision, out)


def conv2d(x, weight, bias=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups: int = 1,
           activation: str = "none", *, residual=None, policy=None, exec_policy=None, stream=None, out=None,
           return_decision=False):
    """NCHW convolution ``act(conv(x, weight) + bias + residual)``; ``pads`` is (top, left, bottom, right)
    (two values mean symmetric)."""
    pads = tuple(pads)
    if len(pads) == 2:
        pads = (pads[0], pads[1], pads[0], pads[1])
    attrs = {"strides": list(strides), "pads": list(pads), "dilations": list(dilations), "groups": int(groups),
             "activation": activation}
    return _single("conv2d", [x, weight, bias, residual], attrs, policy, exec_policy, stream, return_decision, out)


def attention(q, k, v, mask=None, causal: bool = False, scale: Optional[float] = None, *,
              fully_masked_rows: str = "nan", policy=None, exec_policy=None, stream=None, out=None,
              return_decision=False):
    """``softmax(q @ k.T * scale + mask) @ v`` over ``[B, H, S, D]`` tensors (GQA when k/v have fewer heads).
    ``scale`` defaults to ``1/sqrt(D)``; ``causal`` masks keys after each query (top-left aligned).
    ``fully_masked_rows``: what a query row whose every key is masked (-inf) gives, ``"nan"`` (the softmax's 0/0),
    ``"zero"`` (PyTorch's guarded form) or ``"uniform"`` (the mean of v over the visible keys: masked_fill with the
    dtype's lowest value, then softmax; Note [Fully masked attention rows])."""
    attrs = {"causal": int(bool(causal)), "scale": float(scale) if scale else 0.0,
             "fully_masked_rows": str(fully_masked_rows)}
    return _single("attention", [q, k, v, mask], attrs, policy, exec_policy, stream, return_decision, out)


def scaled_dot_product_attention(query, key, value, attn_mask=None, is_causal: bool = False,
                                 scale: Optional[float] = None, **kwargs):
    """PyTorch-style alias of :func:`attention`."""
    return attention(query, key, value, attn_mask, is_causal, scale, **kwargs)


def softmax(x, axis: int = -1, **kw):
    """Softmax along ``axis``."""
    return _op("softmax", [x], {"axis": axis}, kw)


def layer_norm(x, scale=None, bias=None, axis: int = -1, epsilon: float = 1e-5, **kw):
    """Normalize over dims ``axis..end`` (scale/bias of shape ``x.shape[axis:]``)."""
    return _op("layer_norm", [x, scale, bias], {"axis": axis, "epsilon": float(epsilon)}, kw)


def gelu(x, approximate: str = "none", **kw):
    """GELU (``approximate="tanh"`` for the tanh form)."""
    return _op("gelu", [x], {"approximate": approximate}, kw)


def cast(x, dtype: str, **kw):
    """Convert to the float dtype ``dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float64"``)."""
    return _op("cast", [x], {"to": str(dtype)}, kw)


def _reduce(op):
    def reduce(x, axes: Sequence[int] = (), keepdims: bool = True, **kw):
        return _op(op, [x], {"axes": list(axes), "keepdims": int(bool(keepdims))}, kw)
    reduce.__name__ = op
    reduce.__doc__ = f"``{op}`` over ``axes`` (empty: all), keeping reduced dims when ``keepdims``."
    return reduce


def _unary(op):
    def unary(x, **kw):
        return _op(op, [x], None, kw)
    unary.__name__ = op
    unary.__doc__ = f"Elementwise ``{op}(x)``."
    return unary


def _binary(op):
    def binary(a, b, **kw):
        return _op(op, [a, b], None, kw)
    binary.__name__ = op
    binary.__doc__ = f"Elementwise ``{op}(a, b)`` with NumPy broadcasting."
    return binary


def _op(op, inputs, attrs, kw):
    if not kw:  # the common call: default policies and stream, no decision (the fast path for tiny ops)
        return _core.ops_call(op, inputs, attrs)[0]
    unknown = set(kw) - {"policy", "exec_policy", "stream", "return_decision"}
    if unknown:
        raise TypeError(f"{op}() got unexpected keyword arguments {sorted(unknown)}")
    return _single(op, inputs, attrs, kw.get("policy"), kw.get("exec_policy"), kw.get("stream"),
                   kw.get("return_decision", False))


relu, sigmoid, tanh, silu = (_unary(o) for o in ("relu", "sigmoid", "tanh", "silu"))
exp, log, sqrt, neg, abs, erf, reciprocal = (_unary(o) for o in ("exp", "log", "sqrt", "neg", "abs", "erf", "reciprocal"))
add, sub, mul, div, pow, maximum, minimum = (_binary(o) for o in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"))
reduce_sum, reduce_mean, reduce_max, reduce_min = (_reduce(o) for o in ("reduce_sum", "reduce_mean", "reduce_max",
                                                                         "reduce_min"))


def max_pool2d(x, kernel_shape, strides=None, pads=(0, 0, 0, 0), dilations=(1, 1), ceil_mode: bool = False, **kw):
    """NCHW max pooling (``strides`` default to ``kernel_shape``)."""
    attrs = {"kernel_shape": list(kernel_shape), "strides": list(strides or kernel_shape), "pads": list(pads),
             "dilations": list(dilations), "ceil_mode": int(bool(ceil_mode))}
    return _op("max_pool2d", [x], attrs, kw)


def avg_pool2d(x, kernel_shape, strides=None, pads=(0, 0, 0, 0), ceil_mode: bool = False,
               count_include_pad: bool = False, **kw):
    """NCHW average pooling (``strides`` default to ``kernel_shape``)."""
    attrs = {"kernel_shape": list(kernel_shape), "strides": list(strides or kernel_shape), "pads": list(pads),
             "ceil_mode": int(bool(ceil_mode)), "count_include_pad": int(bool(count_include_pad))}
    return _op("avg_pool2d", [x], attrs, kw)


def global_avg_pool(x, **kw):
    """Mean over H and W of an NCHW tensor -> ``[N, C, 1, 1]``."""
    return _op("global_avg_pool", [x], None, kw)


def batch_norm(x, scale, bias, mean, var, epsilon: float = 1e-5, **kw):
    """Inference batch normalization over axis 1."""
    return _op("batch_norm", [x, scale, bias, mean, var], {"epsilon": float(epsilon)}, kw)
