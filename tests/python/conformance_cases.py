"""Cases of the cross-backend conformance suite (``test_conformance.py``), like ggml's test-backend-ops.

Every op of ``docs/ops.md`` gets a generator of cases: inputs at several shapes (odd and non-multiple-of-8 ones
included), attributes, and a NumPy float64 reference written from the op's definition in ``docs/ops.md``,
independently of the C++ kernels. Inputs are float32 arrays from a generator seeded by the case id, so every run
and every machine sees the same values. A case runs at float32, float16 and bfloat16: the test rounds the inputs
to the dtype (on the device, through ``xrt.ops.cast``) and the reference is computed in float64 from the same
rounded values (``round_to``), so only the kernel's own error is measured.

Tolerances (``TOLERANCES``) are per tolerance class and dtype, as ``(rtol, atol)`` in the
``numpy.isclose`` sense, ``|y - ref| <= atol + rtol * |ref|``:

* ``exact``: casts are bit-exact (round to nearest even, once).
* ``elementwise``: one fp32 evaluation then one rounding to the output dtype, so about one output ulp:
  fp32 1e-5 (GPU math intrinsics are within a few ulps), fp16 1e-3 (ulp <= 2^-10 relative), bf16 1e-2
  (ulp <= 2^-7 relative).
* ``reduction`` (softmax, layer_norm, batch_norm, pools, reduce_*): fp32 sums in any order: fp32 1e-5,
  fp16 2e-3, bf16 1.6e-2 (one output rounding plus a little); atol 1e-5 / 1e-4 / 1e-3 for outputs near zero
  (a layer_norm output is a difference of O(1) values).
* ``gemm`` (matmul, linear, conv2d, attention): inputs are scaled so that outputs are O(1); fp32 5e-5 (exact fp32
  math in any summation order over K <= a few hundred; TF32 must not be used under the default fp32
  precision), fp16 2e-3 and bf16 1.6e-2 (fp32 accumulation; flash attention may round the softmax
  probabilities to the input dtype before the second GEMM, which stays within these).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

DTYPES = ("float32", "float16", "bfloat16")
# The data-movement ops, where and the comparisons run at every dtype; integer dtypes see integer values.
INT_DTYPES = ("int32", "int64", "int8", "uint8", "int16")
ALL_DTYPES = DTYPES + ("float64",) + INT_DTYPES + ("bool",)
NUMPY_DTYPES = {"float64": np.float64, "int32": np.int32, "int64": np.int64, "int8": np.int8, "uint8": np.uint8,
                "int16": np.int16, "bool": np.bool_}

TOLERANCES: Dict[str, Dict[str, tuple]] = {
    "exact": {dtype: (0.0, 0.0) for dtype in ALL_DTYPES},
    "elementwise": {"float32": (1e-5, 1e-6), "float16": (1e-3, 1e-5), "bfloat16": (1e-2, 1e-5)},
    "reduction": {"float32": (1e-5, 1e-5), "float16": (2e-3, 1e-4), "bfloat16": (1.6e-2, 1e-3)},
    "gemm": {"float32": (5e-5, 5e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)},
}

Array = Optional[np.ndarray]
Reference = Callable[[List[Array], dict], np.ndarray]


@dataclass
class Case:
    """One op invocation: float32 inputs (None for an absent optional input), attributes and a reference."""

    op: str
    name: str
    inputs: List[Array]
    attrs: dict
    reference: Reference
    tolerance: str
    dtypes: Sequence[str] = DTYPES
    # Per input, a dtype that overrides the run's dtype (None: the run's): "bool" for where's cond, "int64" for
    # gather's indices.
    input_dtypes: Sequence[Optional[str]] = ()
    out_dtype: Optional[str] = None  # the output's dtype when it is not the run's (comparisons: "bool")
    # Per output after the first, its dtype when it is not the run's (top_k's indices: "int64").
    more_out_dtypes: Sequence[Optional[str]] = ()

    def output_dtype(self, index: int) -> Optional[str]:
        if index == 0:
            return self.out_dtype
        return self.more_out_dtypes[index - 1] if index - 1 < len(self.more_out_dtypes) else None

    def input_dtype(self, index: int, dtype: str) -> str:
        fixed = self.input_dtypes[index] if index < len(self.input_dtypes) else None
        return fixed or dtype

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"

    def shapes(self) -> List[Optional[tuple]]:
        return [None if a is None else a.shape for a in self.inputs]

    def __repr__(self) -> str:
        return f"Case({self.id}, shapes={self.shapes()}, attrs={self.attrs})"


# ---- helpers ----

def _rng(key: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(key.encode()))


def uniform(rng: np.random.Generator, shape, low=-1.0, high=1.0) -> np.ndarray:
    return rng.uniform(low, high, size=shape).astype(np.float32)


def to_numpy_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``x`` as a NumPy array of the integer or bool ``dtype`` (or float64): integers truncate toward zero
    and wrap, bool is ``x != 0``. The test builds its inputs of those dtypes with this function."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bool":
        return x != 0
    if dtype == "float64":
        return x.astype(np.float64)
    return np.trunc(x).astype(np.int64).astype(NUMPY_DTYPES[dtype])


def round_to(x: Array, dtype: str) -> Array:
    """The float64 values of float32 ``x`` rounded to ``dtype`` (nearest even), as the kernels see them."""
    if x is None:
        return None
    if dtype in INT_DTYPES or dtype == "bool":
        return to_numpy_dtype(x, dtype).astype(np.float64)
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.astype(np.float64)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        shape = x.shape  # 0-d arrays become numpy scalars, whose uint64 shifts numpy refuses
        x = x.reshape(-1)
        bits = x.view(np.uint32).astype(np.uint64)
        nan = np.isnan(x)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        out = (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
        out[nan] = np.nan
        return out.reshape(shape)
    if dtype == "float64":
        return x.astype(np.float64)
    raise ValueError(f"unknown dtype {dtype}")


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


ACTIVATIONS = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
}


# ---- references (float64, from docs/ops.md) ----

def ref_matmul(inputs, attrs):
    a, b = inputs
    return np.matmul(a, b)


def ref_linear(inputs, attrs):
    x, w, bias, *residual = inputs
    w_kn = w.T if attrs.get("weight_layout", "nk") == "nk" else w
    y = x @ w_kn
    if bias is not None:
        y = y + bias
    if residual and residual[0] is not None:
        y = y + residual[0]
    return ACTIVATIONS[attrs.get("activation", "none")](y)


def ref_linear_grad_weight(inputs, attrs):
    grad, x = inputs
    n, k = grad.shape[-1], x.shape[-1]
    return grad.reshape(-1, n).T @ x.reshape(-1, k)


def _out_size(size, kernel, stride, pad_begin, pad_end, dilation, ceil_mode):
    """Output length along one dim (PyTorch/ONNX; ceil_mode drops a window starting in the trailing padding)."""
    effective = dilation * (kernel - 1) + 1
    span = size + pad_begin + pad_end - effective
    if ceil_mode:
        out = -(-span // stride) + 1
        if (out - 1) * stride >= size + pad_begin:
            out -= 1
        return out
    return span // stride + 1


def ref_conv2d(inputs, attrs):
    x, w, bias, residual = inputs
    sh, sw = attrs.get("strides", [1, 1])
    pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
    dh, dw = attrs.get("dilations", [1, 1])
    groups = attrs.get("groups", 1)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = _out_size(h, kh, sh, pt, pb, dh, False)
    ow = _out_size(wd, kw, sw, pl, pr, dw, False)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    og = o // groups
    y = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        wg = w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    if bias is not None:
        y += bias[None, :, None, None]
    if residual is not None:
        y += residual
    activation = attrs.get("activation", "none")
    if activation == "relu":
        y = np.maximum(y, 0.0)
    elif activation == "silu":
        y = y / (1.0 + np.exp(-y))
    elif activation == "hard_swish":
        y = y * np.clip(y / 6.0 + 0.5, 0.0, 1.0)
    elif activation == "relu6":
        y = np.clip(y, 0.0, 6.0)
    elif activation in ("gelu", "gelu_tanh"):
        y = (_gelu if activation == "gelu" else _gelu_tanh)(y)
    return y


def _pool_params(attrs, x):
    kernel = attrs["kernel_shape"]
    strides = attrs.get("strides", kernel)
    pads = attrs.get("pads", [0, 0, 0, 0])
    dilations = attrs.get("dilations", [1, 1])
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    sizes = [_out_size(x.shape[2 + d], kernel[d], strides[d], pads[d], pads[d + 2], dilations[d], ceil_mode)
             for d in range(2)]
    return kernel, strides, pads, dilations, sizes


def ref_max_pool2d(inputs, attrs):
    (x,) = inputs
    kernel, strides, pads, dilations, (oh, ow) = _pool_params(attrs, x)
    h, w = x.shape[2:]
    y = np.empty(x.shape[:2] + (oh, ow))
    for i in range(oh):
        rows = [i * strides[0] - pads[0] + u * dilations[0] for u in range(kernel[0])]
        rows = [r for r in rows if 0 <= r < h]
        for j in range(ow):
            cols = [j * strides[1] - pads[1] + v * dilations[1] for v in range(kernel[1])]
            cols = [c for c in cols if 0 <= c < w]
            y[:, :, i, j] = x[:, :, rows][:, :, :, cols].max(axis=(2, 3))
    return y


def ref_avg_pool2d(inputs, attrs):
    (x,) = inputs
    kernel, strides, pads, _, (oh, ow) = _pool_params(attrs, x)
    include_pad = bool(attrs.get("count_include_pad", 0))
    h, w = x.shape[2:]
    y = np.empty(x.shape[:2] + (oh, ow))
    for i in range(oh):
        h0 = i * strides[0] - pads[0]
        h1 = min(h0 + kernel[0], h + pads[2])  # the window, clipped to the padded input
        for j in range(ow):
            w0 = j * strides[1] - pads[1]
            w1 = min(w0 + kernel[1], w + pads[3])
            window = x[:, :, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)]
            count = (h1 - h0) * (w1 - w0) if include_pad else window.shape[2] * window.shape[3]
            y[:, :, i, j] = window.sum(axis=(2, 3)) / count
    return y


def ref_global_avg_pool(inputs, attrs):
    (x,) = inputs
    return x.mean(axis=(2, 3), keepdims=True)


def ref_batch_norm(inputs, attrs):
    x, scale, bias, mean, var = inputs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    eps = attrs.get("epsilon", 1e-5)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)


def ref_softmax(inputs, attrs):
    (x,) = inputs
    axis = attrs.get("axis", -1)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_layer_norm(inputs, attrs):
    x, scale, bias = inputs[:3]
    if len(inputs) > 3 and inputs[3] is not None:
        x = x + inputs[3]  # the residual input: layer_norm(x + residual)
    axis = attrs.get("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5))
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    if len(inputs) > 4 and inputs[4] is not None:
        y = y + inputs[4]  # the addend: a res-post-norm block's residual, added after the norm
    return y


UNARY = {
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "silu": lambda x: x * _sigmoid(x),
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "neg": np.negative,
    "abs": np.abs,
    "erf": _erf,
    "reciprocal": lambda x: 1.0 / x,
}

BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
}

REDUCE = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min,
          # the square of each element in float64 (Note [Squares summed over leading axes] in fusion_elementwise.cpp)
          "reduce_sum_square": lambda x, **kw: np.sum(np.square(x.astype(np.float64)), **kw)}


def ref_reduce(op):
    def reference(inputs, attrs):
        (x,) = inputs
        axes = tuple(attrs.get("axes", [])) or None
        return np.asarray(REDUCE[op](x, axis=axes, keepdims=bool(attrs.get("keepdims", 1))))
    return reference


def ref_attention(inputs, attrs):
    q, k, v, mask = inputs
    # Note [Attention layouts]: tensors flagged in `bshd` are held as [B, S, H, D]; the reference computes on
    # [B, H, S, D] views and returns the output in its layout.
    bshd = list(attrs.get("bshd", [0, 0, 0, 0]))
    parts = list(attrs.get("qkv_parts", [-1, -1, -1]))
    # A packed input is [B, S, P, H, D] (qkv_packing "heads_parts": [B, S, H, P, D]); part p of it is [B, S, H, D].
    heads_outer = attrs.get("qkv_packing", "parts_heads") == "heads_parts"
    q, k, v = [(x[:, :, :, part] if heads_outer else x[:, :, part]) if part >= 0 else x
               for x, part in zip((q, k, v), parts)]
    q, k, v = [np.swapaxes(x, 1, 2) if flag or part >= 0 else x for x, flag, part in zip((q, k, v), bshd, parts)]
    out = _attention_bhsd(q, k, v, mask, attrs)
    return np.swapaxes(out, 1, 2) if bshd[3] else out


def _attention_bhsd(q, k, v, mask, attrs):
    _, heads, seq_q, head_dim = q.shape
    group = heads // k.shape[1]
    seq_k = k.shape[2]
    k = np.repeat(k, group, axis=1)  # q head h reads kv head h // group
    v = np.repeat(v, group, axis=1)
    scale = attrs.get("scale", 0.0) or 1.0 / math.sqrt(head_dim)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        s = s + mask
    if attrs.get("causal", 0):
        s = np.where(np.tril(np.ones((seq_q, seq_k), dtype=bool)), s, -np.inf)  # query i sees keys j <= i
    if attrs.get("fully_masked_rows", "nan") == "uniform":
        # Note [Fully masked attention rows]: a -inf score (after the mask; causal keys stay out) counts as -1e30.
        s = np.where(s == -np.inf, -1e30, s)
        if attrs.get("causal", 0):
            s = np.where(np.tril(np.ones((seq_q, seq_k), dtype=bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    if attrs.get("fully_masked_rows", "nan") == "zero":
        # Note [Fully masked attention rows]: a row whose every score is -inf is 0 (instead of NaN).
        empty = m == -np.inf
        p = np.exp(s - np.where(empty, 0.0, m))
        return np.matmul(p / np.where(empty, 1.0, p.sum(axis=-1, keepdims=True)), v)
    p = np.exp(s - m)
    return np.matmul(p / p.sum(axis=-1, keepdims=True), v)


def ref_cast(inputs, attrs):
    (x,) = inputs
    return round_to(x.astype(np.float32), attrs["to"])  # exact: x is already a float32/16-bit value


# ---- case generators ----

def matmul_cases() -> List[Case]:
    shapes = {
        "1x1x1": ((1, 1), (1, 1)),
        "7x13x5": ((7, 5), (5, 13)),
        "64x33x17": ((64, 17), (17, 33)),
        "33x65x129": ((33, 129), (129, 65)),
        "batched": ((3, 16, 24), (3, 24, 8)),
        "b_shared": ((2, 3, 5, 7), (7, 9)),
        "a_shared": ((5, 7), (4, 7, 3)),
        "broadcast_both": ((2, 1, 4, 6), (3, 6, 5)),
        "broadcast_inner": ((3, 1, 4, 6), (1, 2, 6, 5)),
    }
    cases = []
    for name, (sa, sb) in shapes.items():
        rng = _rng("matmul" + name)
        k = sa[-1]
        cases.append(Case("matmul", name, [uniform(rng, sa), uniform(rng, sb) / np.float32(math.sqrt(k))], {},
                          ref_matmul, "gemm"))
    return cases


def linear_cases() -> List[Case]:
    specs = [
        ("1x1_bias", (1, 1), 1, "nk", True, "none"),
        ("7x13x5", (7, 13), 5, "nk", False, "none"),
        ("batched_relu", (2, 3, 33), 17, "nk", True, "relu"),
        ("kn_gelu", (64, 40), 24, "kn", True, "gelu"),
        ("gelu_tanh", (5, 65), 9, "nk", True, "gelu_tanh"),
        ("kn_3d", (4, 2, 8), 16, "kn", False, "none"),
        ("wide", (3, 129), 130, "nk", True, "relu"),
        # the residual stream of pre-LN transformers (Note [Residual in the GEMM]): cuBLASLt's C, with and without
        # a bias, before an activation, a row count that is not a multiple of any tile
        ("residual_bias", (2, 9, 32), 48, "nk", True, "none", True),
        ("residual_kn", (37, 24), 40, "kn", False, "none", True),
        ("residual_relu", (5, 16), 24, "nk", True, "relu", True),
    ]
    cases = []
    for name, x_shape, n, layout, has_bias, activation, *has_residual in specs:
        rng = _rng("linear" + name)
        k = x_shape[-1]
        w_shape = (n, k) if layout == "nk" else (k, n)
        inputs = [uniform(rng, x_shape), uniform(rng, w_shape) / np.float32(math.sqrt(k)),
                  uniform(rng, (n,)) if has_bias else None]
        if has_residual:
            inputs.append(uniform(rng, x_shape[:-1] + (n,)))
        cases.append(Case("linear", name, inputs, {"weight_layout": layout, "activation": activation}, ref_linear,
                          "gemm"))
    return cases


def ref_matmul_nbits(inputs, attrs):
    """Note [Int4 weight-only GEMM]: W[n, k] = (code - zero point) * scale of k's block, codes low nibble first."""
    x, w, scales, zp, bias = inputs
    block = attrs["block_size"]
    n, blocks, _ = w.shape
    k = x.shape[-1]
    wb = w.astype(np.int64)
    codes = np.stack([wb & 0xF, wb >> 4], axis=-1).reshape(n, blocks * block)
    zero = np.full((n, blocks), 8, np.int64)
    if zp is not None:
        zb = zp.astype(np.int64).reshape(n, -1)
        zero = np.stack([zb & 0xF, zb >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    weight = (codes - np.repeat(zero, block, axis=1)) * np.repeat(scales.reshape(n, blocks), block, axis=1)
    y = x @ weight[:, :k].T
    return y if bias is None else y + bias


def matmul_nbits_cases() -> List[Case]:
    """The int4 weight-only GEMM: packed codes and zero points as uint8 inputs, scales and bias in the run's dtype."""
    specs = [("gemv_b32", (1, 64), 24, 32, False, True), ("odd_k_b16_zp", (3, 40), 17, 16, True, False),
             ("batched_b64_zp", (2, 3, 96), 9, 64, True, True), ("m17_b128", (17, 200), 33, 128, False, True)]
    cases = []
    for name, x_shape, n, block, zero_points, bias in specs:
        rng = _rng("matmul_nbits" + name)
        k = x_shape[-1]
        blocks = -(-k // block)
        inputs = [uniform(rng, x_shape), np.floor(uniform(rng, (n, blocks, block // 2), 0.0, 256.0)),
                  uniform(rng, (n, blocks), 0.5, 1.5) / np.float32(4 * math.sqrt(k)),
                  np.floor(uniform(rng, (n, -(-blocks // 2)), 0.0, 256.0)) if zero_points else None,
                  uniform(rng, (n,)) if bias else None]
        cases.append(Case("matmul_nbits", name, inputs, {"block_size": block}, ref_matmul_nbits, "gemm",
                          input_dtypes=[None, "uint8", None, "uint8", None]))
    return cases


def linear_grad_weight_cases() -> List[Case]:
    """The weight gradient (output 0). The bias gradient (bias=1, a second output) is checked against a float64
    reference in tests/cpp/backends/cublas/test_gemm_backends.cpp (LinearGradWeightMatchesReference, cpu and cublasLt)."""
    specs = [("1x1", (1, 1), 1), ("7x13x5", (7, 13), 5), ("batched", (2, 3, 33), 17), ("tall", (257, 40), 24),
             ("wide", (3, 129), 130)]
    cases = []
    for name, x_shape, n in specs:
        rng = _rng("linear_grad_weight" + name)
        m = int(np.prod(x_shape[:-1]))
        inputs = [uniform(rng, x_shape[:-1] + (n,)) / np.float32(math.sqrt(m)), uniform(rng, x_shape)]
        cases.append(Case("linear_grad_weight", name, inputs, {}, ref_linear_grad_weight, "gemm"))
    return cases


def conv2d_cases() -> List[Case]:
    # name, x, w, strides, pads, dilations, groups, bias, residual, activation
    specs = [
        ("3x3_pad1", (2, 3, 9, 9), (8, 3, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 1, True, False, "none"),
        ("stride2_dilation2", (1, 4, 13, 11), (6, 4, 3, 3), [2, 2], [0, 0, 0, 0], [2, 2], 1, False, False, "none"),
        ("groups_residual_relu", (2, 4, 8, 8), (6, 2, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 2, True, True, "relu"),
        ("depthwise_5x5", (1, 8, 7, 7), (8, 1, 5, 5), [1, 1], [2, 2, 2, 2], [1, 1], 8, True, False, "none"),
        # the depthwise kernel's tiles (Note [Depthwise tiles]): ConvNeXt's 7x7, EfficientNet's strided 3x3/5x5,
        # planes wider than a tile, dilation, asymmetric pads, residual + relu
        ("depthwise_7x7_wide", (2, 6, 9, 45), (6, 1, 7, 7), [1, 1], [3, 3, 3, 3], [1, 1], 6, True, True, "relu"),
        ("depthwise_3x3_stride2", (2, 5, 17, 13), (5, 1, 3, 3), [2, 2], [0, 1, 1, 0], [1, 1], 5, False, False,
         "none"),
        ("depthwise_5x5_stride2_dilated", (1, 3, 40, 37), (3, 1, 5, 5), [2, 2], [4, 4, 4, 4], [2, 2], 3, True, False,
         "relu"),
        ("depthwise_rect_kernel", (1, 4, 70, 11), (4, 1, 1, 3), [1, 1], [0, 1, 0, 1], [1, 1], 4, False, True, "none"),
        ("depthwise_5x5_stride2", (2, 4, 23, 19), (4, 1, 5, 5), [2, 2], [2, 2, 2, 2], [1, 1], 4, True, True, "relu"),
        ("depthwise_3x3_tall", (1, 3, 67, 5), (3, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 3, True, False, "none"),
        ("depthwise_7x7_stride2", (1, 2, 30, 41), (2, 1, 7, 7), [2, 2], [3, 2, 3, 2], [1, 1], 2, False, False, "none"),
        # one output column 2100 rows tall: the row tile shrinks to keep its staged input within 48 KiB
        ("depthwise_7x7_stride2_one_column", (1, 2, 4200, 1), (2, 1, 7, 7), [2, 2], [3, 3, 3, 3], [1, 1], 2, True,
         False, "none"),
        # several small planes per block (Note [Depthwise planes per block]): ConvNeXt's last stage (7x7 planes),
        # EfficientNet's 14x14 at stride 2, a plane count the block does not divide, residual + relu
        ("depthwise_7x7_planes_per_block", (2, 37, 7, 7), (37, 1, 7, 7), [1, 1], [3, 3, 3, 3], [1, 1], 37, True, True,
         "relu"),
        ("depthwise_3x3_stride2_planes", (3, 19, 14, 14), (19, 1, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 19, True,
         False, "none"),
        ("depthwise_5x5_planes_13x11", (1, 45, 13, 11), (45, 1, 5, 5), [1, 1], [2, 2, 2, 2], [1, 1], 45, False, False,
         "none"),
        # channel counts of whole 16-byte vectors (Note [Channels-last depthwise], NHWC twins in nhwc_cases):
        # ConvNeXt's 7x7 with residual, EfficientNet's strided 3x3 and 5x5, 33 vectors (two blocks of channels, the
        # second part-full), a one-column image, rows not a multiple of the outputs per thread
        ("depthwise_c96_7x7_residual", (2, 96, 11, 11), (96, 1, 7, 7), [1, 1], [3, 3, 3, 3], [1, 1], 96, True, True,
         "none"),
        ("depthwise_c24_3x3_stride2", (2, 24, 17, 13), (24, 1, 3, 3), [2, 2], [0, 1, 1, 0], [1, 1], 24, True, False,
         "relu"),
        ("depthwise_c40_5x5", (1, 40, 9, 11), (40, 1, 5, 5), [1, 1], [2, 2, 2, 2], [1, 1], 40, False, False, "none"),
        ("depthwise_c16_5x5_stride2", (3, 16, 15, 14), (16, 1, 5, 5), [2, 2], [2, 2, 2, 2], [1, 1], 16, True, True,
         "relu"),
        ("depthwise_c264_3x3", (1, 264, 6, 7), (264, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 264, True, False,
         "none"),
        # channels not a multiple of 8 in channels-last tiles (Note [Depthwise channels in part tiles]):
        # ShuffleNetV2's 58 and 116, a count of 4-element vectors, one past a 16-channel tile
        ("depthwise_c58_3x3_stride2", (2, 58, 9, 11), (58, 1, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 58, True, False,
         "none"),
        ("depthwise_c116_3x3", (1, 116, 7, 7), (116, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 116, True, True, "relu"),
        ("depthwise_c12_5x5", (2, 12, 10, 9), (12, 1, 5, 5), [1, 1], [2, 2, 2, 2], [1, 1], 12, False, False, "none"),
        ("depthwise_c17_7x7_stride2", (1, 17, 15, 16), (17, 1, 7, 7), [2, 2], [3, 3, 3, 3], [1, 1], 17, True, False,
         "silu"),
        ("depthwise_c8_7x7_stride2_one_column", (1, 8, 37, 1), (8, 1, 7, 7), [2, 2], [3, 3, 3, 3], [1, 1], 8, True,
         False, "none"),
        # the activations conv_fusion folds into depthwise convolutions (EfficientNet's SiLU, MobileNetV3's
        # HardSwish): the channels-last kernel, the NCHW rows kernel and the plain one (dilation, odd channels)
        ("depthwise_c32_3x3_silu", (2, 32, 9, 10), (32, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 32, True, False,
         "silu"),
        ("depthwise_c24_5x5_stride2_hard_swish", (1, 24, 13, 12), (24, 1, 5, 5), [2, 2], [2, 2, 2, 2], [1, 1], 24,
         True, True, "hard_swish"),
        ("depthwise_3x3_dilated_silu", (1, 5, 11, 9), (5, 1, 3, 3), [1, 1], [2, 2, 2, 2], [2, 2], 5, True, False,
         "silu"),
        ("1x1_relu", (2, 16, 5, 7), (12, 16, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, True, False, "relu"),
        # MobileNetV2's ReLU6 (Note [ReLU6 in the CPU convolution's epilogue]): a 1x1 with a residual, a depthwise
        ("1x1_relu6", (2, 16, 5, 7), (12, 16, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, True, True, "relu6"),
        ("depthwise_c24_3x3_stride2_relu6", (1, 24, 9, 11), (24, 1, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 24, True,
         False, "relu6"),
        # SegFormer's Mix-FFN and MaxViT's MBConv: GELU after the depthwise convolution (conv_fusion folds it in)
        ("depthwise_c40_3x3_gelu", (2, 40, 9, 11), (40, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 40, True, False,
         "gelu"),
        ("depthwise_c19_3x3_gelu_tanh", (1, 19, 7, 8), (19, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 19, True, True,
         "gelu_tanh"),
        ("1x1_gelu", (2, 16, 5, 7), (12, 16, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, True, False, "gelu"),
        ("asymmetric_pads", (1, 3, 6, 6), (4, 3, 3, 3), [1, 1], [0, 1, 2, 1], [1, 1], 1, True, False, "none"),
        ("1x1x1x1", (1, 1, 1, 1), (1, 1, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, False, False, "none"),
        ("rect_kernel_strided", (1, 5, 10, 12), (7, 5, 2, 4), [1, 3], [1, 2, 1, 2], [1, 1], 1, False, True, "none"),
        ("wide_channels", (1, 33, 6, 5), (17, 33, 3, 3), [2, 1], [1, 1, 1, 1], [1, 1], 1, True, False, "relu"),
    ]
    cases = []
    for name, xs, ws, strides, pads, dilations, groups, has_bias, has_residual, activation in specs:
        rng = _rng("conv2d" + name)
        fan_in = ws[1] * ws[2] * ws[3]
        oh = _out_size(xs[2], ws[2], strides[0], pads[0], pads[2], dilations[0], False)
        ow = _out_size(xs[3], ws[3], strides[1], pads[1], pads[3], dilations[1], False)
        inputs = [uniform(rng, xs), uniform(rng, ws) / np.float32(math.sqrt(fan_in)),
                  uniform(rng, (ws[0],)) if has_bias else None,
                  uniform(rng, (xs[0], ws[0], oh, ow)) if has_residual else None]
        if activation == "relu6":  # outputs on both sides of 0 and 6
            inputs[0] = inputs[0] * np.float32(12.0)
        attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups, "activation": activation}
        cases.append(Case("conv2d", name, inputs, attrs, ref_conv2d, "gemm"))
    return cases


def ref_conv_transpose2d(inputs, attrs):
    """ONNX ConvTranspose by scattering: y[oh * s - pad + k * d] += x[ih] * w[k] per input position."""
    x, w, bias = inputs
    sh, sw = attrs.get("strides", [1, 1])
    pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
    dh, dw = attrs.get("dilations", [1, 1])
    oph, opw = attrs.get("output_padding", [0, 0])
    groups = attrs.get("groups", 1)
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    full_h = sh * (h - 1) + oph + dh * (kh - 1) + 1
    full_w = sw * (wd - 1) + opw + dw * (kw - 1) + 1
    y = np.zeros((n, og * groups, full_h, full_w))
    cg = c // groups
    for g in range(groups):
        xg = x[:, g * cg:(g + 1) * cg]
        wg = w[g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", xg, wg[:, :, i, j])
                y[:, g * og:(g + 1) * og, i * dh: i * dh + sh * (h - 1) + 1: sh,
                  j * dw: j * dw + sw * (wd - 1) + 1: sw] += contrib
    y = y[:, :, pt: full_h - pb, pl: full_w - pr]
    if bias is not None:
        y = y + bias[None, :, None, None]
    return y


def conv_transpose2d_cases() -> List[Case]:
    # name, x, w [C, O/g, kh, kw], strides, pads, dilations, groups, output_padding, bias
    specs = [
        ("2x2_stride2", (2, 4, 5, 5), (4, 3, 2, 2), [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], True),
        ("3x3_pad1_outpad1", (1, 6, 7, 5), (6, 5, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 1, [1, 1], True),
        ("groups_dilation", (2, 4, 6, 6), (4, 3, 3, 3), [1, 1], [1, 1, 1, 1], [2, 2], 2, [0, 0], False),
        ("rect_strided", (1, 3, 4, 9), (3, 7, 3, 2), [3, 1], [1, 0, 1, 0], [1, 1], 1, [2, 0], True),
        ("asymmetric_pads", (1, 2, 5, 5), (2, 2, 3, 3), [2, 2], [0, 1, 1, 0], [1, 1], 1, [0, 0], False),
        ("1x1x1x1", (1, 1, 1, 1), (1, 1, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, [0, 0], False),
    ]
    cases = []
    for name, xs, ws, strides, pads, dilations, groups, output_padding, has_bias in specs:
        rng = _rng("conv_transpose2d" + name)
        fan_in = ws[0] * ws[2] * ws[3] // max(1, strides[0] * strides[1])
        inputs = [uniform(rng, xs), uniform(rng, ws) / np.float32(math.sqrt(max(1, fan_in))),
                  uniform(rng, (ws[1] * groups,)) if has_bias else None]
        attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": groups,
                 "output_padding": output_padding}
        cases.append(Case("conv_transpose2d", name, inputs, attrs, ref_conv_transpose2d, "gemm"))
    return cases


def _to_nhwc(a):
    return None if a is None else np.ascontiguousarray(np.transpose(a, (0, 2, 3, 1)))


def _to_nchw(a):
    return None if a is None else np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))


def nhwc_case(case: Case) -> Case:
    """The channels-last (layout=NHWC) twin of an NCHW conv2d/pool case: every 4-D input (x, conv2d's weight
    [O, kh, kw, C/g] and residual) permuted, the reference run on the NCHW inputs and its output permuted back."""

    def reference(inputs, attrs):
        nchw_attrs = {k: v for k, v in attrs.items() if k != "layout"}
        out = case.reference([_to_nchw(a) if a is not None and a.ndim == 4 else a for a in inputs], nchw_attrs)
        return _to_nhwc(out)

    inputs = [_to_nhwc(a) if a is not None and a.ndim == 4 else a for a in case.inputs]
    return Case(case.op, case.name + "_nhwc", inputs, dict(case.attrs, layout="NHWC"), reference, case.tolerance)


def nhwc_cases() -> List[Case]:
    """layout=NHWC: the cuDNN kernels and cuda_raw's depthwise run channels-last natively (the native engine's
    nhwc_layout pass), the cpu kernels through NCHW copies."""
    conv = {c.name: c for c in conv2d_cases()}
    pools = {c.id: c for c in pool_cases()}
    rng = _rng("conv2d_nhwc_c64")
    resnet_like = Case("conv2d", "resnet_3x3_c64_residual_relu",
                       [uniform(rng, (2, 64, 14, 14)), uniform(rng, (64, 64, 3, 3)) / np.float32(24.0),
                        uniform(rng, (64,)), uniform(rng, (2, 64, 14, 14))],
                       {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "groups": 1,
                        "activation": "relu"}, ref_conv2d, "gemm")
    picked = [conv[n] for n in ("3x3_pad1", "groups_residual_relu", "1x1_relu", "asymmetric_pads",
                                "rect_kernel_strided", "wide_channels")] + [resnet_like]
    # every depthwise case: cuda_raw's channels-last kernels (Note [Channels-last depthwise]), the vector ones where
    # the channels fill 16-byte vectors, the plain one elsewhere (dilation, odd channel counts)
    picked += [c for n, c in conv.items() if n.startswith("depthwise")]
    picked += [pools[i] for i in ("max_pool2d-k3s2p1", "max_pool2d-rect", "avg_pool2d-k3s2p1_include_pad",
                                  "avg_pool2d-asymmetric_pads", "global_avg_pool-2x3x7x5", "max_pool2d-ceil_mode_odd",
                                  "avg_pool2d-ceil_mode_exclude_pad")]
    return [nhwc_case(c) for c in picked]


def pool_cases() -> List[Case]:
    max_specs = [
        ("k2s2", (2, 3, 8, 8), {"kernel_shape": [2, 2]}),
        ("k3s2p1", (1, 4, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("ceil_mode", (1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ("dilations", (1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [2, 2]}),
        ("asymmetric_pads", (1, 3, 7, 7), {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 1, 1, 0]}),
        ("k1", (1, 3, 5, 5), {"kernel_shape": [1, 1]}),
        ("rect", (2, 2, 7, 9), {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [1, 1, 1, 1]}),
        # GoogLeNet's and Inception's 3x3 stride-2 pools with ceil_mode on odd sizes: one more output per axis than
        # the floor size (cuDNN declines; cuda_raw takes them)
        ("ceil_mode_odd", (2, 5, 14, 12), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ("ceil_mode_dilations", (1, 3, 12, 10),
         {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 2], "ceil_mode": 1}),
    ]
    avg_specs = [
        ("k2s2", (2, 3, 8, 8), {"kernel_shape": [2, 2]}),
        ("k3s2p1", (1, 4, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("k3s2p1_include_pad", (1, 4, 9, 11),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ("ceil_mode_include_pad", (1, 2, 10, 10),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1}),
        ("ceil_mode_same_size", (1, 1, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ("asymmetric_pads", (1, 3, 6, 7), {"kernel_shape": [3, 2], "strides": [1, 1], "pads": [1, 0, 2, 1]}),
        ("rect", (2, 2, 7, 9), {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [1, 1, 1, 1]}),
        ("ceil_mode_exclude_pad", (2, 3, 14, 12),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ]
    cases = []
    for op, specs, reference in (("max_pool2d", max_specs, ref_max_pool2d), ("avg_pool2d", avg_specs, ref_avg_pool2d)):
        for name, shape, attrs in specs:
            cases.append(Case(op, name, [uniform(_rng(op + name), shape)], attrs, reference, "reduction"))
    for name, shape in (("2x3x7x5", (2, 3, 7, 5)), ("1x16x1x1", (1, 16, 1, 1)), ("3x5x13x13", (3, 5, 13, 13))):
        cases.append(Case("global_avg_pool", name, [uniform(_rng("gap" + name), shape)], {}, ref_global_avg_pool,
                          "reduction"))
    return cases


def batch_norm_cases() -> List[Case]:
    cases = []
    for name, shape, eps in (("nchw", (2, 3, 5, 5), 1e-5), ("nc", (4, 7), 1e-3), ("rank5", (1, 16, 3, 3, 2), 1e-5)):
        rng = _rng("batch_norm" + name)
        c = shape[1]
        inputs = [uniform(rng, shape), uniform(rng, (c,), 0.5, 2.0), uniform(rng, (c,)), uniform(rng, (c,), -0.5, 0.5),
                  uniform(rng, (c,), 0.5, 2.0)]
        cases.append(Case("batch_norm", name, inputs, {"epsilon": eps}, ref_batch_norm, "reduction"))
    return cases


def softmax_cases() -> List[Case]:
    specs = [
        ("7x13", (7, 13), -1, 1.0),
        ("row_1000", (4, 1000), -1, 1.0),
        ("row_1025", (5, 1025), -1, 1.0),
        ("axis1_of_3", (3, 5, 7), 1, 1.0),
        ("axis0", (6, 4), 0, 1.0),
        ("large_logits", (2, 3, 129), -1, 20.0),
        ("single", (1,), 0, 1.0),
        ("row_4096", (2, 4096), -1, 3.0),
    ]
    cases = [Case("softmax", name, [uniform(_rng("softmax" + name), shape) * np.float32(scale)], {"axis": axis},
                  ref_softmax, "reduction") for name, shape, axis, scale in specs]
    # Masked scores: -inf keys and scores far below the row's maximum (e^(x - max) below the float range of the
    # vectorised exp, Note [Softmax rows in vectors] in cpu_norm.cpp), in rows of odd lengths.
    masked = uniform(_rng("softmax_masked"), (6, 4099)) * np.float32(4.0)
    masked[:, ::7] = -np.inf
    masked[1, 5::11] = -150.0
    masked[2, :] = -np.inf
    masked[2, 17] = 3.0
    cases.append(Case("softmax", "masked_4099", [masked], {"axis": -1}, ref_softmax, "reduction"))
    return cases


def layer_norm_cases() -> List[Case]:
    specs = [
        ("7x13_affine", (7, 13), -1, True, True),
        ("2x5x64_plain", (2, 5, 64), -1, False, False),
        ("axis1_scale_only", (3, 4, 6), 1, True, False),
        ("4x1024_bias_only", (4, 1024), -1, False, True),
        ("all_dims", (2, 3, 8), 0, True, True),
        ("row_4097_offset", (3, 4097), -1, True, True),
        # Rows of whole 16-byte vectors take the register-cached kernel, with a warp, 128 or 512 threads per row
        # (cuda_raw); 8192 fp32 is its largest row, 16000 fp32 falls back to the scalar kernel, fp16 does not.
        ("300x768_affine", (300, 768), -1, True, True),
        ("5x8192_offset", (5, 8192), -1, True, False),
        ("3x16000_affine", (3, 16000), -1, True, True),
        # Short rows take groups of 4 to 16 lanes (ConvNeXt's 96 channels), several rows to a warp, and a last
        # block whose later groups have no row; few rows take blocks of one warp.
        ("3001x96_affine", (3001, 96), -1, True, True),
        ("37x16_affine", (37, 16), -1, True, True),
        ("5x9x40_scale_only", (5, 9, 40), -1, True, False),
    ]
    cases = []
    for name, shape, axis, has_scale, has_bias in specs:
        rng = _rng("layer_norm" + name)
        x = uniform(rng, shape)
        if "offset" in name:
            x = x + np.float32(4.0)  # a mean far from 0: a one-pass E[x^2] - E[x]^2 would lose digits
        normalized = shape[axis % len(shape):]
        cases.append(Case("layer_norm", name, [x, uniform(rng, normalized, 0.5, 1.5) if has_scale else None,
                                              uniform(rng, normalized) if has_bias else None],
                          {"axis": axis, "epsilon": 1e-5}, ref_layer_norm, "reduction"))
    # With the residual input (the post-LN transformer's Add + LayerNorm as one kernel).
    for name, shape in (("residual_7x13", (7, 13)), ("residual_2x3x1030", (2, 3, 1030)),
                        ("residual_2x128x768", (2, 128, 768)), ("residual_999x24", (999, 24))):
        rng = _rng("layer_norm" + name)
        cases.append(Case("layer_norm", name, [uniform(rng, shape), uniform(rng, shape[-1:], 0.5, 1.5),
                                              uniform(rng, shape[-1:]), uniform(rng, shape)],
                          {"axis": -1, "epsilon": 1e-5}, ref_layer_norm, "reduction"))
    # With the addend input (Swin V2's x + norm(f(x)) as one kernel), alone and after a residual; the register-cached
    # kernel's shapes (Swin V2's 96 channels, 768) and the scalar kernel's (odd rows).
    for name, shape, residual in (("addend_3001x96", (3001, 96), False), ("addend_2x49x768", (2, 49, 768), False),
                                  ("addend_7x13", (7, 13), False), ("addend_residual_3x1030", (3, 1030), True),
                                  ("addend_residual_5x256", (5, 256), True)):
        rng = _rng("layer_norm" + name)
        cases.append(Case("layer_norm", name, [uniform(rng, shape), uniform(rng, shape[-1:], 0.5, 1.5),
                                              uniform(rng, shape[-1:]), uniform(rng, shape) if residual else None,
                                              uniform(rng, shape)],
                          {"axis": -1, "epsilon": 1e-5}, ref_layer_norm, "reduction"))
    return cases


UNARY_SHAPES = {"1": (1,), "7x13": (7, 13), "3x1025": (3, 1025), "2x3x4x5": (2, 3, 4, 5)}
UNARY_RANGES = {"log": (0.05, 4.0), "sqrt": (0.0, 4.0), "reciprocal": (0.25, 4.0), "exp": (-4.0, 4.0)}


def unary_cases() -> List[Case]:
    cases = []
    for op in list(UNARY) + ["gelu"]:
        low, high = UNARY_RANGES.get(op, (-4.0, 4.0))
        variants = [("none", _gelu), ("tanh", _gelu_tanh)] if op == "gelu" else [(None, UNARY[op])]
        for approximate, fn in variants:
            for shape_name, shape in UNARY_SHAPES.items():
                rng = _rng(f"{op}{approximate}{shape_name}")
                x = uniform(rng, shape, low, high)
                if op == "reciprocal":
                    x = x * np.where(rng.uniform(size=shape) < 0.5, -1, 1).astype(np.float32)
                name = shape_name if approximate is None else f"{approximate}_{shape_name}"
                attrs = {} if approximate is None else {"approximate": approximate}
                cases.append(Case(op, name, [x], attrs, (lambda f: lambda inputs, attrs: f(inputs[0]))(fn),
                                  "elementwise"))
    return cases


BINARY_SHAPES = {
    "same_7x13": ((7, 13), (7, 13)),
    "same_3x1025": ((3, 1025), (3, 1025)),
    "bcast_2x1x5_3x1": ((2, 1, 5), (3, 1)),
    "bcast_row": ((4, 33), (33,)),
    "bcast_scalar_like": ((1,), (5, 6)),
    "bcast_4d": ((3, 1, 7, 1), (1, 5, 1, 9)),
}


def binary_cases() -> List[Case]:
    cases = []
    for op, fn in BINARY.items():
        for name, (sa, sb) in BINARY_SHAPES.items():
            rng = _rng(op + name)
            if op == "pow":
                a, b = uniform(rng, sa, 0.5, 2.0), uniform(rng, sb, -2.0, 2.0)
            elif op == "div":
                a = uniform(rng, sa, -2.0, 2.0)
                b = uniform(rng, sb, 0.5, 2.0) * np.where(rng.uniform(size=sb) < 0.5, -1, 1).astype(np.float32)
            else:
                a, b = uniform(rng, sa, -2.0, 2.0), uniform(rng, sb, -2.0, 2.0)
            cases.append(Case(op, name, [a, b], {}, (lambda f: lambda inputs, attrs: f(inputs[0], inputs[1]))(fn),
                              "elementwise"))
    return cases


# Values that exercise rounding: ties to even at fp16 (2^-11 steps) and bf16 (2^-8 steps), overflow to inf,
# subnormals, signed zero, infinities and NaN.
CAST_SPECIAL = np.array(
    [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.0, 65520.0, 1e-8, 3e-8, 6e-8, 1e-5, 1 + 2 ** -11, 1 + 3 * 2 ** -11,
     1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0e38, -3.4e38, np.inf, -np.inf, np.nan, 1e-40], dtype=np.float32)


def cast_cases() -> List[Case]:
    cases = []
    for to in ("float32", "float16", "bfloat16", "float64"):
        rng = _rng("cast" + to)
        spread = (rng.standard_normal(1025) * 10.0 ** rng.uniform(-6, 5, size=1025)).astype(np.float32)
        cases.append(Case("cast", f"to_{to}_special", [CAST_SPECIAL.copy()], {"to": to}, ref_cast, "exact"))
        cases.append(Case("cast", f"to_{to}_spread", [spread.reshape(5, 205)], {"to": to}, ref_cast, "exact"))
    return cases


def reduce_cases() -> List[Case]:
    specs = [
        ("all", (7, 13), [], 1),
        ("all_nokeep", (3, 5), [], 0),
        ("last", (7, 13), [1], 1),
        ("first_last_nokeep", (4, 5, 6), [0, 2], 0),
        ("middle", (4, 5, 6), [1], 1),
        ("long_rows", (2, 3, 1025), [-1], 1),
        ("long_columns", (1025, 3), [0], 0),
        ("size1_axis", (3, 1, 4), [1], 1),
        ("non_adjacent", (2, 3, 4, 5), [1, 3], 0),
        # the middle kernel (Note [Middle-axis reductions]): channels-last H x W means, one block of channels and
        # several (264 channels: 33 vectors), rows split across blocks, a kept outer axis of 1, inner 8
        ("nhwc_hw", (2, 9, 7, 24), [1, 2], 1),
        ("nhwc_hw_264_channels", (3, 5, 6, 264), [1, 2], 0),
        ("middle_split_rows", (1, 3001, 16), [1], 1),
        ("first_axis_inner_8", (517, 8), [0], 0),
        # trailing axes (Note [Reductions of trailing axes] in cpu_reduce.cpp): an NCHW H x W mean of 21 (four
        # accumulators and a tail of 1), and rows of 3 (all tail)
        ("nchw_hw", (3, 5, 7, 3), [2, 3], 1),
        ("rows_of_3", (11, 3), [-1], 0),
    ]
    cases = []
    for op in REDUCE:
        for name, shape, axes, keepdims in specs:
            cases.append(Case(op, name, [uniform(_rng(op + name), shape)], {"axes": axes, "keepdims": keepdims},
                              ref_reduce(op), "reduction"))
    return cases


def attention_cases() -> List[Case]:
    # name, q [B, H, Sq, D], (Hkv, Sk), Dv, causal, mask shape (or None), scale
    specs = [
        ("d64", (2, 4, 16, 64), (4, 16), 64, 0, None, 0.0),
        ("d128_causal", (1, 2, 33, 128), (2, 33), 128, 1, None, 0.0),
        ("sq_lt_sk", (1, 2, 17, 64), (2, 40), 64, 0, None, 0.0),
        ("sq_lt_sk_causal", (1, 2, 17, 64), (2, 40), 64, 1, None, 0.0),
        ("sq_gt_sk_causal", (1, 1, 40, 64), (1, 17), 64, 1, None, 0.0),
        ("s1", (2, 2, 1, 64), (2, 1), 64, 0, None, 0.0),
        ("decode_s1_sk77", (1, 4, 1, 128), (4, 77), 128, 0, None, 0.0),
        ("s129_causal", (1, 2, 129, 64), (2, 129), 64, 1, None, 0.0),
        ("s129_d128", (1, 1, 129, 128), (1, 129), 128, 0, None, 0.0),
        ("gqa_causal", (2, 8, 33, 64), (2, 33), 64, 1, None, 0.0),
        ("mqa_d128", (1, 4, 20, 128), (1, 20), 128, 0, None, 0.0),
        ("mask_11qk", (1, 2, 24, 64), (2, 24), 64, 0, (1, 1, 24, 24), 0.0),
        ("mask_full_causal", (2, 2, 13, 64), (2, 19), 64, 1, (2, 2, 13, 19), 0.0),
        ("mask_keys_neg_inf", (2, 4, 9, 128), (2, 9), 128, 0, (2, 1, 1, 9), 0.0),
        ("scale", (1, 2, 16, 64), (2, 16), 64, 0, None, 0.3),
        ("d32", (1, 2, 9, 32), (2, 9), 32, 1, None, 0.0),
        ("d80_sk_odd", (1, 3, 7, 80), (3, 11), 80, 0, None, 0.0),
        ("dv_ne_d", (1, 2, 8, 64), (2, 8), 32, 0, None, 0.0),
    ]
    cases = []
    for name, q_shape, (kv_heads, seq_k), dv, causal, mask_shape, scale in specs:
        rng = _rng("attention" + name)
        b, _, _, d = q_shape
        inputs = [uniform(rng, q_shape), uniform(rng, (b, kv_heads, seq_k, d)), uniform(rng, (b, kv_heads, seq_k, dv)),
                  None]
        if mask_shape is not None:
            mask = uniform(rng, mask_shape, -2.0, 0.0)
            if name == "mask_keys_neg_inf":
                mask[..., -3:] = -np.inf  # padded keys; every row keeps 6 visible keys
            inputs[3] = mask
        cases.append(Case("attention", name, inputs, {"causal": causal, "scale": scale}, ref_attention, "gemm"))
    # fully_masked_rows="zero" (Note [Fully masked attention rows] in cpu_attention.cpp), as attention_fusion sets it
    # for the NaN guard of PyTorch's exports: rows -inf at every key (row 2 and the last; with causal also row 0, whose
    # one visible key is masked) are 0; the other rows have some -inf keys or none.
    zero_specs = [
        ("fully_masked_rows_zero", (2, 4, 9, 64), (2, 9), 64, 0, (2, 1, 9, 9)),
        ("fully_masked_rows_zero_causal_d128", (1, 2, 33, 128), (2, 40), 128, 1, (1, 1, 33, 40)),
        ("fully_masked_rows_zero_d80_2d_mask", (1, 3, 7, 80), (3, 11), 80, 0, (7, 11)),
        ("fully_masked_rows_zero_d32_long", (1, 2, 5, 32), (2, 300), 32, 0, (1, 2, 5, 300)),
    ]
    # fully_masked_rows="uniform" (Note [Fully masked attention rows]), as attention_fusion sets it for a masked fill
    # (DeBERTa's masked_fill(mask, finfo.min)): the same masks, rows -inf at every key give the mean of v over the
    # visible keys (with causal, row 0's one key); a [B, 1, 1, Sk] mask that hides every key of batch 1.
    uniform_specs = [(name.replace("zero", "uniform"), *spec) for name, *spec in zero_specs] + [
        ("fully_masked_rows_uniform_batch_masked", (2, 3, 17, 64), (3, 17), 64, 0, (2, 1, 1, 17))]
    for name, q_shape, (kv_heads, seq_k), dv, causal, mask_shape in zero_specs + uniform_specs:
        rng = _rng("attention" + name)
        b, _, seq_q, d = q_shape
        inputs = [uniform(rng, q_shape), uniform(rng, (b, kv_heads, seq_k, d)), uniform(rng, (b, kv_heads, seq_k, dv))]
        mask = uniform(rng, mask_shape, -2.0, 0.0)
        mask[..., ::5] = -np.inf
        if name.endswith("batch_masked"):  # a padding mask [B, 1, 1, Sk]: batch 1 masked at every key
            mask[1] = -np.inf
        else:
            mask[..., 2, :] = -np.inf
            mask[..., seq_q - 1, :] = -np.inf
            mask[..., 0, 0] = -np.inf
        inputs.append(mask)
        rows = "uniform" if "uniform" in name else "zero"
        cases.append(Case("attention", name, inputs, {"causal": causal, "scale": 0.0, "fully_masked_rows": rows},
                          ref_attention, "gemm"))
    # Layouts (Note [Attention layouts]): q, k, v and the output each [B, H, S, D] or [B, S, H, D] (`bshd` flags),
    # as attention_fusion leaves them when it folds the exporters' head transposes.
    layout_specs = [
        ("bshd_all_d64", (2, 4, 33, 64), (4, 33), 64, 0, None, [1, 1, 1, 1]),
        ("bshd_all_d128_causal", (1, 2, 129, 128), (2, 129), 128, 1, None, [1, 1, 1, 1]),
        ("bshd_v_out_gqa_causal", (2, 8, 33, 64), (2, 33), 64, 1, None, [0, 0, 1, 1]),
        ("bshd_q_k_mask", (2, 2, 13, 64), (2, 19), 64, 0, (2, 1, 1, 19), [1, 1, 0, 0]),
        ("bshd_out_d80_sk_odd", (1, 3, 7, 80), (3, 11), 80, 0, None, [0, 0, 0, 1]),
        ("bshd_all_s1", (2, 2, 1, 64), (2, 1), 64, 0, None, [1, 1, 1, 1]),
    ]
    for name, q_shape, (kv_heads, seq_k), dv, causal, mask_shape, bshd in layout_specs:
        rng = _rng("attention" + name)
        b, heads, seq_q, d = q_shape
        logical = [q_shape, (b, kv_heads, seq_k, d), (b, kv_heads, seq_k, dv)]
        inputs = [uniform(rng, (s[0], s[2], s[1], s[3]) if flag else s) for s, flag in zip(logical, bshd)]
        inputs.append(None if mask_shape is None else uniform(rng, mask_shape, -2.0, 0.0))
        cases.append(Case("attention", name, inputs, {"causal": causal, "scale": 0.0, "bshd": bshd}, ref_attention,
                          "gemm"))
    # q, k and v as parts of one packed projection [B, S, P, H, D] (`qkv_parts`), as GPT-2's and timm's are.
    packed_specs = [
        ("packed_qkv_d64", (2, 33, 3, 4, 64), [0, 1, 2], [0, 0, 0, 1], 0, None),
        ("packed_qkv_d128_causal", (1, 129, 3, 2, 128), [0, 1, 2], [0, 0, 0, 0], 1, None),
        ("packed_kvq_order_mask", (2, 13, 3, 2, 64), [2, 0, 1], [0, 0, 0, 1], 0, (2, 1, 1, 13)),
        ("packed_four_parts_d80", (1, 7, 4, 3, 80), [3, 1, 0], [0, 0, 0, 1], 0, None),
    ]
    for name, shape, parts, bshd, causal, mask_shape in packed_specs:
        rng = _rng("attention" + name)
        packed = uniform(rng, shape)
        mask = None if mask_shape is None else uniform(rng, mask_shape, -2.0, 0.0)
        cases.append(Case("attention", name, [packed, packed, packed, mask],
                          {"causal": causal, "scale": 0.0, "bshd": bshd, "qkv_parts": parts}, ref_attention, "gemm"))
    # Each head's q, k and v side by side, [B, S, H, P, D] (qkv_packing "heads_parts": GPT-NeoX's and BLOOM's
    # query_key_value), all three packed, or only v with q and k of their own (GPT-NeoX's rotated q and k).
    for name, shape, causal, mask_shape in [("packed_heads_parts_d64", (2, 33, 4, 3, 64), 0, None),
                                            ("packed_heads_parts_d128_causal", (1, 70, 2, 3, 128), 1, None),
                                            ("packed_heads_parts_d32_mask", (2, 9, 3, 3, 32), 0, (2, 1, 1, 9))]:
        rng = _rng("attention" + name)
        packed = uniform(rng, shape)
        mask = None if mask_shape is None else uniform(rng, mask_shape, -2.0, 0.0)
        cases.append(Case("attention", name, [packed, packed, packed, mask],
                          {"causal": causal, "scale": 0.0, "bshd": [0, 0, 0, 1], "qkv_parts": [0, 1, 2],
                           "qkv_packing": "heads_parts"}, ref_attention, "gemm"))
        b, s, h, _, d = shape
        q, k = uniform(rng, (b, h, s, d)), uniform(rng, (b, h, s, d))
        cases.append(Case("attention", name + "_v_only", [q, k, packed, mask],
                          {"causal": causal, "scale": 0.0, "bshd": [0, 0, 0, 1], "qkv_parts": [-1, -1, 2],
                           "qkv_packing": "heads_parts"}, ref_attention, "gemm"))
    return cases


# ---- data movement, where, comparisons, every-dtype cast, integer arithmetic ----

def integers(rng: np.random.Generator, shape, low=0, high=100) -> np.ndarray:
    """Integer values as float32 (exact in every dtype, bfloat16 included, for |v| <= 256)."""
    return rng.integers(low, high, size=shape).astype(np.float32)


def transpose_cases() -> List[Case]:
    specs = {
        "2d_33x65": ((33, 65), [1, 0]),
        "bert_bshd_to_bhsd": ((2, 7, 3, 5), [0, 2, 1, 3]),
        "last_moves_3d": ((3, 17, 9), [0, 2, 1]),
        "reverse_4d": ((2, 3, 4, 5), [3, 2, 1, 0]),
        "size1_dims": ((3, 1, 5), [2, 1, 0]),
        "keeps_last": ((4, 5, 6), [1, 0, 2]),
        "rank1": ((7,), [0]),
        # Note [Transposes of small matrices]: runs of whole small matrices through shared memory (ShuffleNetV2's
        # channels-last shuffle [N, H, W, 2, C/2] -> [.., C/2, 2]), a long matrix with a short side (strided gather)
        "channel_shuffle_nhwc": ((3, 5, 7, 2, 29), [0, 1, 2, 4, 3]),
        "small_matrices_odd": ((37, 3, 5), [0, 2, 1]),
        "small_matrices_two_batches": ((2, 3, 4, 5), [1, 0, 3, 2]),
        "short_side_long_rows": ((2, 3, 2501), [0, 2, 1]),
    }
    return [Case("transpose", name, [integers(_rng("transpose" + name), shape)], {"perm": perm},
                 lambda inputs, attrs: np.transpose(inputs[0], attrs["perm"]), "exact", ALL_DTYPES)
            for name, (shape, perm) in specs.items()]


def concat_cases() -> List[Case]:
    specs = {
        "axis1_three": ([(2, 3, 5), (2, 1, 5), (2, 7, 5)], 1),
        "axis0": ([(3, 4), (5, 4)], 0),
        "last_axis_negative": ([(3, 2, 3), (3, 2, 1), (3, 2, 9)], -1),
        "single": ([(4, 5)], 0),
        # Note [Concat in one kernel]: more inputs than one launch takes (64), odd and aligned widths
        "channels_25_odd": ([(2, 3, 1 + (k * 7) % 5) for k in range(25)], 2),
        "channels_70": ([(3, 2, 8 * (1 + k % 3)) for k in range(70)], -1),
        "rows_130": ([(1 + k % 2, 4) for k in range(130)], 0),
    }
    cases = []
    for name, (shapes, axis) in specs.items():
        rng = _rng("concat" + name)
        cases.append(Case("concat", name, [integers(rng, s) for s in shapes], {"axis": axis},
                          lambda inputs, attrs: np.concatenate(inputs, axis=attrs["axis"]), "exact", ALL_DTYPES))
    return cases


INT64_MAX = 2 ** 63 - 1
INT64_MIN = -2 ** 63


def ref_slice(inputs, attrs):
    (x,) = inputs
    starts, ends = attrs["starts"], attrs["ends"]
    axes = attrs.get("axes", list(range(len(starts))))
    steps = attrs.get("steps", [1] * len(starts))
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis] = slice(start, end, step)  # Python's slice clamps exactly as ONNX Slice does
    return x[tuple(index)]


def slice_cases() -> List[Case]:
    specs = {
        "leading": ((7, 9), {"starts": [1], "ends": [6]}),
        "to_end_int64_max": ((7, 9), {"starts": [2, -4], "ends": [INT64_MAX, INT64_MAX]}),
        "negative_step": ((5, 6, 37), {"starts": [1, 5, 3], "ends": [4, 0, 35], "steps": [1, -2, 1]}),
        "reverse_int64_min": ((9, 4), {"starts": [-1], "ends": [INT64_MIN], "axes": [0], "steps": [-1]}),
        "axes_negative_step3": ((4, 10, 3), {"starts": [1], "ends": [10], "axes": [-2], "steps": [3]}),
        "clamped_empty": ((4, 5), {"starts": [10], "ends": [20], "axes": [1]}),
    }
    return [Case("slice", name, [integers(_rng("slice" + name), shape)], attrs, ref_slice, "exact", ALL_DTYPES)
            for name, (shape, attrs) in specs.items()]


def ref_gather(inputs, attrs):
    data, indices = inputs
    return np.take(data, indices.astype(np.int64), axis=attrs.get("axis", 0))


def gather_cases() -> List[Case]:
    specs = {
        "embedding_50x33": ((50, 33), (3, 7), 0),
        "embedding_long_rows": ((20, 520), (2, 5), 0),
        "axis1": ((3, 6, 5), (2, 2), 1),
        "last_axis": ((4, 5, 7), (3,), -1),
        "scalar_index": ((6, 4), (), 0),
    }
    cases = []
    for name, (shape, index_shape, axis) in specs.items():
        rng = _rng("gather" + name)
        size = shape[axis]
        indices = rng.integers(-size, size, size=index_shape).astype(np.float32)
        cases.append(Case("gather", name, [integers(rng, shape), indices], {"axis": axis}, ref_gather, "exact",
                          ALL_DTYPES, input_dtypes=[None, "int64"]))
    cases.append(Case("gather", "int32_indices", [integers(_rng("gather32"), (9, 17)),
                                                  np.array([[0, -1], [8, 3]], dtype=np.float32)], {"axis": 0},
                      ref_gather, "exact", ALL_DTYPES, input_dtypes=[None, "int32"]))
    return cases


def expand_cases() -> List[Case]:
    specs = {
        "column": ((3, 1), [2, 1, 4]),
        "inner_run": ((1, 5, 1, 33), [3, 1, 4, 33]),
        "shape_smaller": ((2, 3), [1]),
        "scalar_like": ((1,), [4, 5]),
    }
    return [Case("expand", name, [integers(_rng("expand" + name), shape)], {"shape": target},
                 lambda inputs, attrs: np.broadcast_to(inputs[0], np.broadcast_shapes(inputs[0].shape,
                                                                                      tuple(attrs["shape"]))),
                 "exact", ALL_DTYPES)
            for name, (shape, target) in specs.items()]


def where_cases() -> List[Case]:
    specs = {
        "same_7x13": ((7, 13), (7, 13), (7, 13)),
        "broadcast_3way": ((4, 1, 7), (3, 1), (4, 3, 7)),
        "scalar_b": ((2, 33), (2, 33), (1,)),
    }
    cases = []
    for name, (cs, sa, sb) in specs.items():
        rng = _rng("where" + name)
        cond = (rng.uniform(size=cs) < 0.5).astype(np.float32)
        cases.append(Case("where", name, [cond, integers(rng, sa), integers(rng, sb)], {},
                          lambda inputs, attrs: np.where(inputs[0] != 0, inputs[1], inputs[2]), "exact", ALL_DTYPES,
                          input_dtypes=["bool", None, None]))
    return cases


COMPARISONS = {"equal": np.equal, "less": np.less, "greater": np.greater}


def compare_cases() -> List[Case]:
    cases = []
    for op, fn in COMPARISONS.items():
        dtypes = ALL_DTYPES if op == "equal" else tuple(d for d in ALL_DTYPES if d != "bool")
        for name, (sa, sb) in BINARY_SHAPES.items():
            rng = _rng(op + name)
            # Few distinct values, so that ties (equal elements) are common.
            a, b = integers(rng, sa, 0, 4), integers(rng, sb, 0, 4)
            cases.append(Case(op, name, [a, b], {}, (lambda f: lambda inputs, attrs: f(inputs[0], inputs[1]))(fn),
                              "exact", dtypes, out_dtype="bool"))
    cases.append(Case("logical_not", "7x13", [integers(_rng("logical_not"), (7, 13), 0, 2)], {},
                      lambda inputs, attrs: inputs[0] == 0, "exact", ("bool",)))
    return cases


def ref_cast_any(inputs, attrs):
    """float -> int truncates toward zero and saturates (NaN -> 0); -> bool is x != 0; ints and bool convert
    exactly to the float dtypes here (the inputs are small integers)."""
    (x,) = inputs
    to = attrs["to"]
    if to == "bool":
        return (x != 0).astype(np.float64)
    if to in INT_DTYPES:
        info = np.iinfo(NUMPY_DTYPES[to])
        with np.errstate(invalid="ignore"):
            y = np.clip(np.trunc(x), info.min, info.max)
        return np.where(np.isnan(x), 0.0, y)
    return round_to(x.astype(np.float32), to)


def cast_any_cases() -> List[Case]:
    rng = _rng("cast_any")
    fractional = (rng.uniform(-300.0, 300.0, size=(5, 41))).astype(np.float32)
    special = np.array([0.0, -0.0, 0.5, -0.5, 2.7, -2.7, 127.9, 128.0, -128.9, 255.5, 256.0, 1e10, -1e10, np.inf,
                        -np.inf, np.nan, 32767.5, -32769.0], dtype=np.float32)
    cases = []
    for to in INT_DTYPES + ("bool",):
        cases.append(Case("cast", f"float_to_{to}_special", [special.copy()], {"to": to}, ref_cast_any, "exact",
                          DTYPES + ("float64",)))
        cases.append(Case("cast", f"float_to_{to}_spread", [fractional.copy()], {"to": to}, ref_cast_any, "exact",
                          DTYPES + ("float64",)))
    small = integers(rng, (3, 37), 0, 120)
    small[0, :5] = 0  # zeros for the -> bool direction
    for to in DTYPES + ("float64",) + INT_DTYPES + ("bool",):
        cases.append(Case("cast", f"int_to_{to}", [small.copy()], {"to": to}, ref_cast_any, "exact",
                          INT_DTYPES + ("bool",)))
    return cases


INT_ARITHMETIC = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": lambda a, b: np.trunc(a / b),  # integer division truncates toward zero
}


def integer_arithmetic_cases() -> List[Case]:
    cases = []
    for op, fn in INT_ARITHMETIC.items():
        for name, (sa, sb) in BINARY_SHAPES.items():
            rng = _rng("int" + op + name)
            a = integers(rng, sa, -1000, 1000)
            b = integers(rng, sb, 1, 50) * np.where(rng.uniform(size=sb) < 0.5, -1, 1).astype(np.float32)
            cases.append(Case(op, f"int_{name}", [a, b], {},
                              (lambda f: lambda inputs, attrs: f(inputs[0], inputs[1]))(fn), "exact",
                              ("int32", "int64")))
    cases.append(Case("neg", "int_7x13", [integers(_rng("intneg"), (7, 13), -1000, 1000)], {},
                      lambda inputs, attrs: -inputs[0], "exact", ("int32", "int64")))
    return cases


# ---- the ONNX ops beyond the core set (docs/ops.md, "ONNX ops") ----

def _hard_sigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0.0, 1.0)


POINTWISE = {
    # op: [(variant name, attrs, reference(x, attrs), (low, high))]
    "clip": [("both", {"min": -0.5, "max": 0.7}, lambda x, a: np.clip(x, a["min"], a["max"]), (-2.0, 2.0)),
             ("min_only", {"min": 0.25}, lambda x, a: np.maximum(x, a["min"]), (-2.0, 2.0)),
             ("relu6", {"min": 0.0, "max": 6.0}, lambda x, a: np.clip(x, 0.0, 6.0), (-8.0, 8.0)),
             ("min_above_max", {"min": 1.0, "max": -1.0}, lambda x, a: np.full_like(x, -1.0), (-2.0, 2.0))],
    "hard_sigmoid": [("default", {}, lambda x, a: _hard_sigmoid(x, 0.2, 0.5), (-6.0, 6.0)),
                     ("alpha_beta", {"alpha": 0.3, "beta": 0.4}, lambda x, a: _hard_sigmoid(x, 0.3, 0.4), (-6.0, 6.0))],
    "hard_swish": [("default", {}, lambda x, a: x * _hard_sigmoid(x, 1.0 / 6.0, 0.5), (-6.0, 6.0))],
    "leaky_relu": [("default", {}, lambda x, a: np.where(x >= 0, x, 0.01 * x), (-4.0, 4.0)),
                   ("alpha", {"alpha": 0.2}, lambda x, a: np.where(x >= 0, x, 0.2 * x), (-4.0, 4.0))],
    "elu": [("default", {}, lambda x, a: np.where(x >= 0, x, np.expm1(x)), (-4.0, 4.0)),
            ("alpha", {"alpha": 1.5}, lambda x, a: np.where(x >= 0, x, 1.5 * np.expm1(x)), (-4.0, 4.0))],
    "softplus": [("default", {}, lambda x, a: np.logaddexp(0.0, x), (-30.0, 30.0))],
    "sin": [("default", {}, lambda x, a: np.sin(x), (-6.0, 6.0))],
    "cos": [("default", {}, lambda x, a: np.cos(x), (-6.0, 6.0))],
    "floor": [("default", {}, lambda x, a: np.floor(x), (-40.0, 40.0))],
    "ceil": [("default", {}, lambda x, a: np.ceil(x), (-40.0, 40.0))],
    "round": [("default", {}, lambda x, a: np.round(x), (-40.0, 40.0)),
              ("halves", {}, lambda x, a: np.round(x), (0.0, 0.0))],
    "sign": [("default", {}, lambda x, a: np.sign(x), (-2.0, 2.0))],
    "tan": [("default", {}, lambda x, a: np.tan(x), (-1.2, 1.2))],
    "asin": [("default", {}, lambda x, a: np.arcsin(x), (-0.99, 0.99))],
    "acos": [("default", {}, lambda x, a: np.arccos(x), (-0.99, 0.99))],
    "atan": [("default", {}, lambda x, a: np.arctan(x), (-5.0, 5.0))],
    "sinh": [("default", {}, lambda x, a: np.sinh(x), (-4.0, 4.0))],
    "cosh": [("default", {}, lambda x, a: np.cosh(x), (-4.0, 4.0))],
    "asinh": [("default", {}, lambda x, a: np.arcsinh(x), (-5.0, 5.0))],
    "acosh": [("default", {}, lambda x, a: np.arccosh(x), (1.01, 5.0))],
    "atanh": [("default", {}, lambda x, a: np.arctanh(x), (-0.95, 0.95))],
    "softsign": [("default", {}, lambda x, a: x / (1 + np.abs(x)), (-4.0, 4.0))],
    "selu": [("default", {}, lambda x, a: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x)),
              (-4.0, 4.0)),
             ("alpha_gamma", {"alpha": 2.0, "gamma": 3.0}, lambda x, a: 3.0 * np.where(x > 0, x, 2.0 * np.expm1(x)),
              (-4.0, 4.0))],
    "celu": [("alpha", {"alpha": 2.0}, lambda x, a: np.maximum(0, x) + np.minimum(0, 2.0 * np.expm1(x / 2.0)),
              (-4.0, 4.0))],
    "thresholded_relu": [("alpha", {"alpha": 0.5}, lambda x, a: np.where(x > 0.5, x, 0.0), (-2.0, 2.0))],
    "mish": [("default", {}, lambda x, a: x * np.tanh(np.logaddexp(0.0, x)), (-6.0, 6.0))],
}


def pointwise_cases() -> List[Case]:
    cases = []
    for op, variants in POINTWISE.items():
        for variant, attrs, fn, (low, high) in variants:
            for shape_name, shape in UNARY_SHAPES.items():
                rng = _rng(f"{op}{variant}{shape_name}")
                if variant == "halves":  # ties: every x.5 from -8.5 to 7.5, round half to even
                    x = (np.floor(rng.uniform(-8, 8, size=shape)) + 0.5).astype(np.float32)
                else:
                    x = uniform(rng, shape, low, high)
                if op == "sign" and x.size > 1:
                    x.reshape(-1)[::5] = 0.0
                cases.append(Case(op, f"{variant}_{shape_name}", [x], attrs,
                                  (lambda f: lambda inputs, a: f(inputs[0], a))(fn), "elementwise"))
    special = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 3.0e38, -0.0, 65504.0, np.nan, 1e-30], dtype=np.float32)
    for op, attrs, fn in [("is_nan", {}, lambda x, a: np.isnan(x)),
                          ("is_inf", {}, lambda x, a: np.isinf(x)),
                          ("is_inf", {"detect_negative": 0}, lambda x, a: np.isposinf(x)),
                          ("is_inf", {"detect_positive": 0}, lambda x, a: np.isneginf(x))]:
        name = "_".join(f"{k}{v}" for k, v in attrs.items()) or "default"
        for shape_name, shape in (("special", (10,)), ("2x5x7", (2, 5, 7))):
            x = special.copy() if shape_name == "special" else np.resize(special, shape).astype(np.float32)
            cases.append(Case(op, f"{name}_{shape_name}", [x], attrs,
                              (lambda f: lambda inputs, a: f(inputs[0], a))(fn), "exact", DTYPES + ("float64",),
                              out_dtype="bool"))
    return cases


LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}


def logical_cases() -> List[Case]:
    cases = []
    for op, fn in LOGICAL.items():
        for name, (sa, sb) in BINARY_SHAPES.items():
            rng = _rng(op + name)
            a, b = integers(rng, sa, 0, 2), integers(rng, sb, 0, 2)
            cases.append(Case(op, name, [a, b], {}, (lambda f: lambda inputs, attrs: f(inputs[0], inputs[1]))(fn),
                              "exact", ("bool",), out_dtype="bool"))
    return cases


def ref_cum_sum(inputs, attrs):
    x = inputs[0]
    axis = attrs["axis"]
    if attrs.get("reverse", 0):
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis)
    if attrs.get("exclusive", 0):
        y = y - x
    if attrs.get("reverse", 0):
        y = np.flip(y, axis)
    return y


def cum_sum_cases() -> List[Case]:
    specs = {
        "last_7x13": ((7, 13), {"axis": 1}),
        "middle_4x5x6": ((4, 5, 6), {"axis": 1}),
        "first_exclusive": ((9, 3, 5), {"axis": 0, "exclusive": 1}),
        "reverse": ((3, 17), {"axis": -1, "reverse": 1}),
        "exclusive_reverse": ((2, 33, 3), {"axis": 1, "exclusive": 1, "reverse": 1}),
        "long_1x1025": ((1, 1025), {"axis": 1}),
    }
    cases = []
    for name, (shape, attrs) in specs.items():
        rng = _rng("cum_sum" + name)
        cases.append(Case("cum_sum", name, [uniform(rng, shape)], attrs, ref_cum_sum, "reduction"))
        cases.append(Case("cum_sum", f"int_{name}", [integers(rng, shape, -100, 100)], attrs, ref_cum_sum, "exact",
                          ("int32", "int64", "float64")))
    return cases


def ref_gather_elements(inputs, attrs):
    data, indices = inputs
    axis = attrs.get("axis", 0) % data.ndim
    # indices may be smaller than data in the other dims: only the leading part of data is read there
    data = data[tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))]
    return np.take_along_axis(data, indices.astype(np.int64) % data.shape[axis], axis=axis)


def gather_elements_cases() -> List[Case]:
    specs = {
        "axis0": ((4, 5), (3, 5), 0),
        "axis1": ((3, 4, 5), (3, 2, 5), 1),
        "last_axis_smaller": ((3, 4, 7), (2, 3, 9), -1),
        "positions_2x11": ((2, 514), (2, 11), 1),  # RoBERTa's position ids
    }
    cases = []
    for name, (shape, index_shape, axis) in specs.items():
        rng = _rng("gather_elements" + name)
        size = shape[axis]
        indices = rng.integers(-size, size, size=index_shape).astype(np.float32)
        cases.append(Case("gather_elements", name, [integers(rng, shape), indices], {"axis": axis},
                          ref_gather_elements, "exact", ALL_DTYPES, input_dtypes=[None, "int64"]))
    rng = _rng("gather_elements32")
    cases.append(Case("gather_elements", "int32_indices", [integers(rng, (5, 6)),
                                                           rng.integers(0, 6, size=(5, 4)).astype(np.float32)],
                      {"axis": 1}, ref_gather_elements, "exact", DTYPES, input_dtypes=[None, "int32"]))
    return cases


def ref_gather_nd(inputs, attrs):
    data, indices = inputs
    indices = indices.astype(np.int64)
    b = attrs.get("batch_dims", 0)
    batch_shape = data.shape[:b]
    data_b = data.reshape((-1,) + data.shape[b:])
    idx_b = indices.reshape((-1,) + indices.shape[b:])
    out = []
    for k in range(data_b.shape[0]):
        tuples = idx_b[k].reshape(-1, idx_b.shape[-1])
        depth = tuples.shape[1]
        rows = [data_b[k][tuple(t % np.array(data_b.shape[1:1 + depth]))] for t in tuples]
        out.append(np.stack(rows).reshape(idx_b[k].shape[:-1] + data_b.shape[1 + depth:]))
    return np.stack(out).reshape(batch_shape + indices.shape[b:-1] + data.shape[b + indices.shape[-1]:])


def gather_nd_cases() -> List[Case]:
    specs = {
        "scalars": ((5, 6), (3, 2), 0),
        "rows": ((4, 5, 6), (2, 3, 1), 0),
        "pairs_of_slices": ((3, 4, 7), (5, 2), 0),
        "batch1": ((2, 5, 6), (2, 3, 1), 1),
        "batch1_scalars": ((2, 5, 6), (2, 4, 2), 1),
    }
    cases = []
    for name, (shape, index_shape, b) in specs.items():
        rng = _rng("gather_nd" + name)
        depth = index_shape[-1]
        sizes = np.array(shape[b:b + depth])
        indices = (rng.integers(0, 1 << 20, size=index_shape) % sizes - sizes * (rng.uniform(size=index_shape) < 0.3))
        cases.append(Case("gather_nd", name, [integers(rng, shape), indices.astype(np.float32)], {"batch_dims": b},
                          ref_gather_nd, "exact", ALL_DTYPES, input_dtypes=[None, "int64"]))
    return cases


def ref_pad(inputs, attrs):
    x = inputs[0]
    rank = x.ndim
    pads = attrs["pads"]
    mode = attrs.get("mode", "constant")
    begins, ends = pads[:rank], pads[rank:]
    # crop the negative pads first, then pad the positive ones
    crop = tuple(slice(max(0, -b), x.shape[d] - max(0, -e)) for d, (b, e) in enumerate(zip(begins, ends)))
    x = x[crop]
    widths = [(max(0, b), max(0, e)) for b, e in zip(begins, ends)]
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=attrs.get("value", 0.0))
    return np.pad(x, widths, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])


def pad_cases() -> List[Case]:
    specs = {
        "2d": ((3, 5), [1, 2, 2, 1]),
        "nchw_hw": ((2, 3, 5, 6), [0, 0, 1, 2, 0, 0, 2, 1]),
        "crop": ((4, 6), [0, -1, 1, -2]),
        "swin_window": ((2, 5, 5, 8), [0, 0, 0, 0, 0, 2, 2, 0]),
    }
    cases = []
    for mode in ("constant", "reflect", "edge", "wrap"):
        for name, (shape, pads) in specs.items():
            attrs = {"pads": pads, "mode": mode}
            if mode == "constant" and name == "2d":
                attrs["value"] = 1.0  # also a bool (true)
            cases.append(Case("pad", f"{mode}_{name}", [integers(_rng("pad" + mode + name), shape)], attrs, ref_pad,
                              "exact", ALL_DTYPES))
    return cases


def _resize_taps(o, in_size, out_size, scale, attrs):
    """Note [Resize taps] in resize.cu, in float64: (indices, weights) of one output coordinate."""
    mode = attrs.get("mode", "nearest")
    coordinates = attrs.get("coordinate_transformation_mode", "half_pixel")
    length = scale * in_size  # ONNX's reference: the formulas use scale * in, not the integer output size
    if coordinates == "half_pixel":
        x = (o + 0.5) / scale - 0.5
    elif coordinates == "pytorch_half_pixel":
        x = (o + 0.5) / scale - 0.5 if length > 1 else -0.5
    elif coordinates == "align_corners":
        x = 0.0 if length == 1 else o * (in_size - 1) / (length - 1)
    elif coordinates == "asymmetric":
        x = o / scale
    elif coordinates == "tf_half_pixel_for_nn":
        x = (o + 0.5) / scale
    else:  # half_pixel_symmetric
        adjustment = out_size / (scale * in_size)
        x = in_size / 2 * (1 - adjustment) + (o + 0.5) / scale - 0.5
    clamp = lambda i: min(max(i, 0), in_size - 1)  # noqa: E731
    f = math.floor(x)
    t = x - f
    if mode == "nearest":
        nearest = attrs.get("nearest_mode", "round_prefer_floor")
        up = {"round_prefer_floor": t > 0.5, "round_prefer_ceil": t >= 0.5, "floor": False, "ceil": t > 0}[nearest]
        return [clamp(f + 1 if up else f)], [1.0]
    if mode == "linear":
        return [clamp(f), clamp(f + 1)], [1 - t, t]
    a = attrs.get("cubic_coeff_a", -0.75)

    def keys(d):
        d = abs(d)
        if d <= 1:
            return ((a + 2) * d - (a + 3)) * d * d + 1
        if d < 2:
            return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        return 0.0
    idx = [f - 1 + k for k in range(4)]
    w = [keys(t - (k - 1)) for k in range(4)]
    if attrs.get("exclude_outside", 0):
        w = [wk if 0 <= i < in_size else 0.0 for wk, i in zip(w, idx)]
        total = sum(w)
        w = [wk / total for wk in w]
    return [clamp(i) for i in idx], w


def ref_resize(inputs, attrs):
    y = inputs[0]
    for d, (out_size, scale) in enumerate(zip(attrs["sizes"], attrs["scales"])):
        in_size = y.shape[d]
        if out_size == in_size and scale == 1.0:
            continue
        matrix = np.zeros((out_size, in_size))
        for o in range(out_size):
            for i, w in zip(*_resize_taps(o, in_size, out_size, np.float32(scale).item(), attrs)):
                matrix[o, i] += w
        y = np.moveaxis(np.tensordot(matrix, np.moveaxis(y, d, 0), axes=(1, 0)), 0, d)
    return y


def resize_cases() -> List[Case]:
    up2 = ((1, 2, 5, 7), [1, 2, 10, 14], [1.0, 1.0, 2.0, 2.0])
    odd = ((2, 3, 5, 7), [2, 3, 13, 9], [1.0, 1.0, 13 / 5, 9 / 7])
    down = ((1, 2, 9, 8), [1, 2, 4, 4], [1.0, 1.0, 0.5, 0.5])
    specs = [
        ("linear_half_pixel_up2", up2, {"mode": "linear"}),
        ("linear_half_pixel_odd", odd, {"mode": "linear"}),
        ("linear_align_corners", odd, {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
        ("linear_pytorch_down", down, {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
        ("linear_symmetric_odd", odd, {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}),
        ("nearest_asymmetric_floor", up2, {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                           "nearest_mode": "floor"}),
        ("nearest_round_prefer_floor", odd, {"mode": "nearest"}),
        ("nearest_round_prefer_ceil_down", down, {"mode": "nearest", "nearest_mode": "round_prefer_ceil"}),
        ("nearest_ceil", odd, {"mode": "nearest", "nearest_mode": "ceil",
                               "coordinate_transformation_mode": "asymmetric"}),
        ("cubic_up2", up2, {"mode": "cubic"}),
        ("cubic_exclude_outside", odd, {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}),
        # a scale that does not divide: the coordinate formulas use scale * in = 5.4, not the size 5
        ("linear_align_corners_scale_0_6", ((1, 2, 9, 9), [1, 2, 5, 5], [1.0, 1.0, 0.6, 0.6]),
         {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
        ("nearest_tf_half_pixel_for_nn", ((1, 1, 7, 6), [1, 1, 4, 3], [1.0, 1.0, 0.6, 0.5]),
         {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}),
        ("linear_3d_last", ((3, 4, 5), [3, 4, 11], [1.0, 1.0, 11 / 5]), {"mode": "linear"}),
    ]
    cases = []
    for name, (shape, sizes, scales), attrs in specs:
        full = dict(attrs, sizes=sizes, scales=scales)
        cases.append(Case("resize", name, [uniform(_rng("resize" + name), shape)], full, ref_resize, "reduction"))
    return cases


def integer_reduce_cases() -> List[Case]:
    specs = [("all", (7, 13), [], 0), ("last", (7, 13), [1], 1), ("middle", (4, 5, 6), [1], 0),
             ("long_rows", (2, 1025), [-1], 1), ("first_last", (3, 4, 5), [0, 2], 0)]
    cases = []
    for op in ("reduce_sum", "reduce_max", "reduce_min"):
        for name, shape, axes, keepdims in specs:
            cases.append(Case(op, f"int_{name}", [integers(_rng(op + "int" + name), shape, -1000, 1000)],
                              {"axes": axes, "keepdims": keepdims}, ref_reduce(op), "exact", ("int32", "int64")))
    return cases


def ref_log_softmax(inputs, attrs):
    x = inputs[0]
    axis = attrs.get("axis", -1)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def ref_one_hot(inputs, attrs):
    indices = inputs[0].astype(np.int64)
    depth = attrs["depth"]
    indices = np.where(indices < 0, indices + depth, indices)
    hot = (indices[..., None] == np.arange(depth)).astype(np.float64)
    y = np.where(hot != 0, attrs.get("on", 1.0), attrs.get("off", 0.0))
    return np.moveaxis(y, -1, attrs.get("axis", -1))


def ref_scatter_nd(inputs, attrs):
    data, indices, updates = inputs
    y = data.copy()
    indices = indices.astype(np.int64)
    depth = indices.shape[-1]
    flat_idx = indices.reshape(-1, depth)
    flat_upd = updates.reshape((-1,) + data.shape[depth:])
    for t in range(flat_idx.shape[0]):
        y[tuple(flat_idx[t])] = flat_upd[t]
    return y


def ref_top_k(inputs, attrs):
    x = inputs[0]
    k = attrs["k"]
    largest = attrs.get("largest", 1)
    # a stable sort of (-x or x): ties keep the smaller index first
    order = np.argsort(-x if largest else x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, axis=-1), order


def ref_arg(op):
    def reference(inputs, attrs):
        x = inputs[0]
        axis = attrs.get("axis", 0)
        last = attrs.get("select_last_index", 0)
        fn = np.argmax if op == "arg_max" else np.argmin
        if last:
            y = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            y = fn(x, axis=axis)
        return np.expand_dims(y, axis) if attrs.get("keepdims", 1) else y
    return reference


def second_batch_cases() -> List[Case]:
    cases = []
    for name, (shape, axis) in {"last_7x13": ((7, 13), -1), "middle_4x5x6": ((4, 5, 6), 1),
                                "long_2x1100": ((2, 1100), 1), "first_9x3": ((9, 3), 0)}.items():
        cases.append(Case("log_softmax", name, [uniform(_rng("log_softmax" + name), shape, -4, 4)], {"axis": axis},
                          ref_log_softmax, "reduction"))
    for name, (sx, ss) in {"channel_2x5x3x3": ((2, 5, 3, 3), (5, 1, 1)), "scalar": ((7, 13), (1,)),
                           "same": ((3, 17), (3, 17))}.items():
        rng = _rng("prelu" + name)
        cases.append(Case("prelu", name, [uniform(rng, sx), uniform(rng, ss, 0.0, 0.5)], {},
                          lambda inputs, attrs: np.where(inputs[0] < 0, inputs[1] * inputs[0], inputs[0]),
                          "elementwise"))
    for name, (sa, sb) in {"same_7x13": ((7, 13), (7, 13)), "bcast_row": ((4, 33), (33,))}.items():
        rng = _rng("mod" + name)
        a = integers(rng, sa, -1000, 1000)
        b = integers(rng, sb, 1, 50) * np.where(rng.uniform(size=sb) < 0.5, -1, 1).astype(np.float32)
        cases.append(Case("mod", f"int_{name}", [a, b], {}, lambda inputs, attrs: np.mod(inputs[0], inputs[1]),
                          "exact", ("int32", "int64")))
        cases.append(Case("mod", f"int_fmod_{name}", [a, b], {"fmod": 1},
                          lambda inputs, attrs: np.fmod(inputs[0], inputs[1]), "exact", ("int32", "int64")))
        fa, fb = uniform(rng, sa, -8, 8), uniform(rng, sb, 0.5, 3) * np.where(rng.uniform(size=sb) < 0.5, -1, 1)
        cases.append(Case("mod", f"float_fmod_{name}", [fa, fb.astype(np.float32)], {"fmod": 1},
                          lambda inputs, attrs: np.fmod(inputs[0], inputs[1]), "elementwise", ("float32",)))
    one_hot_specs = {"last": ((3, 4), 5, -1), "first": ((6,), 4, 0), "middle": ((2, 3), 7, 1)}
    for name, (shape, depth, axis) in one_hot_specs.items():
        rng = _rng("one_hot" + name)
        indices = rng.integers(-depth, depth + 2, size=shape).astype(np.float32)  # some out of range: all off
        cases.append(Case("one_hot", name, [indices], {"depth": depth, "axis": axis, "on": 3.0, "off": -1.0,
                                                       "dtype": "float32"},
                          ref_one_hot, "exact", ("int64", "int32"), out_dtype="float32"))
    for name, (shape, k, upper) in {"upper_5x7": ((5, 7), 0, 1), "lower_k1": ((2, 6, 4), 1, 0),
                                    "upper_kneg": ((3, 4, 4), -2, 1), "lower_kbig": ((4, 3), 9, 0)}.items():
        cases.append(Case("trilu", name, [integers(_rng("trilu" + name), shape)], {"k": k, "upper": upper},
                          (lambda up, kk: lambda inputs, attrs: np.triu(inputs[0], kk) if up else
                           np.tril(inputs[0], kk))(upper, k), "exact", ALL_DTYPES))
    for name, (shape, repeats) in {"2d": ((3, 4), [2, 3]), "3d_ones": ((2, 1, 5), [1, 4, 1]),
                                   "zero": ((2, 3), [0, 2])}.items():
        cases.append(Case("tile", name, [integers(_rng("tile" + name), shape)], {"repeats": repeats},
                          lambda inputs, attrs: np.tile(inputs[0], attrs["repeats"]), "exact", ALL_DTYPES))
    for name, (shape, index_shape) in {"rows": ((5, 4), (3, 1)), "scalars": ((4, 5, 6), (7, 3)),
                                       "slices": ((6, 3, 4), (2, 2, 1))}.items():
        rng = _rng("scatter_nd" + name)
        depth = index_shape[-1]
        tuples = int(np.prod(index_shape[:-1]))
        flat = rng.choice(int(np.prod(shape[:depth])), size=tuples, replace=False)  # unique: ONNX leaves duplicates
        idx = np.stack(np.unravel_index(flat, shape[:depth]), axis=-1).reshape(index_shape).astype(np.float32)
        updates = integers(rng, index_shape[:-1] + shape[depth:])
        cases.append(Case("scatter_nd", name, [integers(rng, shape), idx, updates], {}, ref_scatter_nd, "exact",
                          ALL_DTYPES, input_dtypes=[None, "int64", None]))
    for op in ("arg_max", "arg_min"):
        for name, (shape, attrs) in {"last": ((7, 13), {"axis": 1}), "first_nokeep": ((5, 4, 3), {"axis": 0,
                                                                                                   "keepdims": 0}),
                                     "ties_last": ((6, 9), {"axis": 1, "select_last_index": 1})}.items():
            rng = _rng(op + name)
            x = integers(rng, shape, 0, 5) if "ties" in name else uniform(rng, shape)
            cases.append(Case(op, name, [x], attrs, ref_arg(op), "exact", DTYPES + ("float64",), out_dtype="int64"))
    for name, (shape, k, largest) in {"largest_7x13": ((7, 13), 4, 1), "smallest_3x100": ((3, 100), 10, 0),
                                      "ties_5x33": ((5, 33), 33, 1), "row_1x3000": ((1, 3000), 300, 1),
                                      # the radix select (Note [TopK by radix select]): SSDlite's row, ties at the
                                      # k-th key, rows longer than a whole-row sort takes
                                      "ssdlite_1x3234": ((1, 3234), 300, 1), "ties_2x3001": ((2, 3001), 500, 1),
                                      "long_smallest_3x10007": ((3, 10007), 77, 0),
                                      "long_ties_1x5003": ((1, 5003), 4096, 1)}.items():
        rng = _rng("top_k" + name)
        x = integers(rng, shape, 0, 6) if "ties" in name else uniform(rng, shape)
        cases.append(Case("top_k", name, [x], {"k": k, "largest": largest, "axis": -1}, ref_top_k, "exact",
                          more_out_dtypes=["int64"]))
    for name, (shape, axes, keepdims) in {"last": ((7, 5), [1], 1), "all": ((3, 4), [], 0),
                                          "middle": ((2, 3, 4), [1], 0)}.items():
        rng = _rng("reduce_prod" + name)
        x = uniform(rng, shape, 0.5, 1.5) * np.where(rng.uniform(size=shape) < 0.3, -1, 1).astype(np.float32)
        cases.append(Case("reduce_prod", name, [x], {"axes": axes, "keepdims": keepdims},
                          lambda inputs, attrs: np.prod(inputs[0], axis=tuple(attrs["axes"]) or None,
                                                        keepdims=bool(attrs["keepdims"])), "reduction"))
        cases.append(Case("reduce_prod", f"int_{name}", [integers(rng, shape, -3, 4)], {"axes": axes,
                                                                                         "keepdims": keepdims},
                          lambda inputs, attrs: np.prod(inputs[0], axis=tuple(attrs["axes"]) or None,
                                                        keepdims=bool(attrs["keepdims"])), "exact",
                          ("int32", "int64")))
    return cases + data_dependent_cases() + conv3d_cases() + scatter_nd_reduce_cases()


def ref_non_zero(inputs, attrs):
    x = inputs[0]
    found = np.stack(np.nonzero(x)).astype(np.int64) if x.ndim else np.zeros((0, 0), np.int64)
    bounded = np.zeros((x.ndim, x.size), np.int64)
    bounded[:, :found.shape[1]] = found
    return bounded, np.array([found.shape[1]], np.int64)


def ref_nms(inputs, attrs):
    """ONNX NonMaxSuppression (greedy per batch and class, scores descending, ties: the smaller index first), in
    float64, padded to the bounded output."""
    boxes, scores = (np.asarray(a, np.float64) for a in inputs)
    batches, n = boxes.shape[:2]
    classes = scores.shape[1]
    per_class = max(0, min(attrs.get("max_output_boxes_per_class", 0), n))
    iou_threshold = attrs.get("iou_threshold", 0.0)
    if attrs.get("center_point_box", 0):
        xc, yc, w, h = (boxes[..., k] for k in range(4))
        corners = np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    else:
        corners = np.stack([np.minimum(boxes[..., 0], boxes[..., 2]), np.minimum(boxes[..., 1], boxes[..., 3]),
                            np.maximum(boxes[..., 0], boxes[..., 2]), np.maximum(boxes[..., 1], boxes[..., 3])], -1)

    def ious(a, kept):  # a's IoU with each kept box, as the kernels compute it (0 where an area or overlap is empty)
        area_a, area_k = (a[2] - a[0]) * (a[3] - a[1]), (kept[:, 2] - kept[:, 0]) * (kept[:, 3] - kept[:, 1])
        ih = np.minimum(a[2], kept[:, 2]) - np.maximum(a[0], kept[:, 0])
        iw = np.minimum(a[3], kept[:, 3]) - np.maximum(a[1], kept[:, 1])
        inter = ih * iw
        empty = (area_a <= 0) | (area_k <= 0) | (ih <= 0) | (iw <= 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(empty, 0.0, inter / (area_a + area_k - inter))

    rows = []
    for b in range(batches):
        for c in range(classes):
            s = scores[b, c]
            order = [i for i in np.argsort(-s, kind="stable")
                     if "score_threshold" not in attrs or s[i] > attrs["score_threshold"]]
            kept = []
            for i in order:
                if len(kept) >= per_class:
                    break
                if not kept or np.all(ious(corners[b, i], corners[b, kept]) <= iou_threshold):
                    kept.append(i)
                    rows.append((b, c, i))
    bounded = np.zeros((batches * classes * per_class, 3), np.int64)
    if rows:
        bounded[:len(rows)] = np.array(rows, np.int64)
    return bounded, np.array([len(rows)], np.int64)


def ref_conv3d(inputs, attrs, transpose=False):
    """NumPy 3-D convolution (ONNX Conv) or transposed convolution (ONNX ConvTranspose), groups included."""
    x, w = inputs[0].astype(np.float64), inputs[1].astype(np.float64)
    bias = inputs[2] if len(inputs) > 2 else None
    s, d = attrs.get("strides", [1, 1, 1]), attrs.get("dilations", [1, 1, 1])
    p = attrs.get("pads", [0] * 6)
    g = attrs.get("groups", 1)
    n, c = x.shape[:2]
    k = w.shape[2:]
    cg = c // g
    if not transpose:
        xp = np.pad(x, [(0, 0), (0, 0)] + [(p[i], p[3 + i]) for i in range(3)])
        out = [(xp.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(3)]
        og = w.shape[0] // g
        y = np.zeros((n, w.shape[0], *out))
        for kd in range(k[0]):
            for kh in range(k[1]):
                for kw in range(k[2]):
                    offs = (kd * d[0], kh * d[1], kw * d[2])
                    patch = xp[:, :, offs[0]:offs[0] + s[0] * (out[0] - 1) + 1:s[0],
                               offs[1]:offs[1] + s[1] * (out[1] - 1) + 1:s[1],
                               offs[2]:offs[2] + s[2] * (out[2] - 1) + 1:s[2]]
                    for gi in range(g):
                        y[:, gi * og:(gi + 1) * og] += np.einsum(
                            "ncdhw,oc->nodhw", patch[:, gi * cg:(gi + 1) * cg], w[gi * og:(gi + 1) * og, :, kd, kh, kw])
    else:
        op = attrs.get("output_padding", [0, 0, 0])
        og = w.shape[1]
        big = [s[i] * (x.shape[2 + i] - 1) + d[i] * (k[i] - 1) + 1 + op[i] for i in range(3)]
        y = np.zeros((n, og * g, *big))
        for kd in range(k[0]):
            for kh in range(k[1]):
                for kw in range(k[2]):
                    offs = (kd * d[0], kh * d[1], kw * d[2])
                    for gi in range(g):
                        y[:, gi * og:(gi + 1) * og, offs[0]:offs[0] + s[0] * (x.shape[2] - 1) + 1:s[0],
                          offs[1]:offs[1] + s[1] * (x.shape[3] - 1) + 1:s[1],
                          offs[2]:offs[2] + s[2] * (x.shape[4] - 1) + 1:s[2]] += np.einsum(
                            "ncdhw,co->nodhw", x[:, gi * cg:(gi + 1) * cg], w[gi * cg:(gi + 1) * cg, :, kd, kh, kw])
        y = y[:, :, p[0]:big[0] - p[3], p[1]:big[1] - p[4], p[2]:big[2] - p[5]]
    if bias is not None:
        y = y + bias.reshape(1, -1, 1, 1, 1)
    return y


def conv3d_cases() -> List[Case]:
    cases = []
    for name, (x, w, bias, attrs) in {
            "plain_1x3x5x6x7": ((1, 3, 5, 6, 7), (4, 3, 3, 3, 3), True, {"pads": [1] * 6}),
            "strided_2x4x7x5x9": ((2, 4, 7, 5, 9), (6, 2, 3, 1, 3), False,
                                  {"strides": [2, 1, 2], "pads": [1, 0, 1, 1, 0, 1], "groups": 2}),
            "dilated_1x2x6x6x6": ((1, 2, 6, 6, 6), (3, 2, 2, 2, 2), True, {"dilations": [2, 1, 2]})}.items():
        rng = _rng("conv3d" + name)
        inputs = [uniform(rng, x), uniform(rng, w, -0.5, 0.5)] + ([uniform(rng, (w[0],))] if bias else [])
        cases.append(Case("conv3d", name, inputs, attrs, ref_conv3d, "gemm"))
    for name, (x, w, bias, attrs) in {
            "plain_1x3x4x5x3": ((1, 3, 4, 5, 3), (3, 2, 3, 3, 3), True, {"pads": [1] * 6}),
            "strided_2x4x3x4x5": ((2, 4, 3, 4, 5), (4, 3, 3, 2, 3), False,
                                  {"strides": [2, 2, 1], "output_padding": [1, 0, 0], "groups": 2}),
            "asym_1x2x3x3x3": ((1, 2, 3, 3, 3), (2, 2, 2, 3, 2), False,
                               {"strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 0]})}.items():
        rng = _rng("conv_transpose3d" + name)
        out_channels = w[1] * attrs.get("groups", 1)
        inputs = [uniform(rng, x), uniform(rng, w, -0.5, 0.5)] + ([uniform(rng, (out_channels,))] if bias else [])
        cases.append(Case("conv_transpose3d", name, inputs, attrs,
                          lambda i, a: ref_conv3d(i, a, transpose=True), "gemm"))
    return cases


def ref_scatter_nd_reduce(inputs, attrs):
    data, indices, updates = inputs
    y = data.copy()
    depth = indices.shape[-1]
    flat_idx = indices.astype(np.int64).reshape(-1, depth)
    flat_upd = updates.reshape((-1,) + data.shape[depth:])
    combine = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[attrs["reduction"]]
    for t in range(flat_idx.shape[0]):
        at = tuple(flat_idx[t])
        y[at] = combine(y[at], flat_upd[t])
    return y


def scatter_nd_reduce_cases() -> List[Case]:
    """ScatterND with a reduction: duplicate index tuples combine in order."""
    cases = []
    for reduction in ("add", "mul", "max", "min"):
        for name, (shape, index_shape) in {"rows_dup": ((5, 4), (7, 1)), "scalars_dup": ((4, 5, 6), (9, 3))}.items():
            rng = _rng("scatter_nd_" + reduction + name)
            depth = index_shape[-1]
            tuples = int(np.prod(index_shape[:-1]))
            flat = rng.integers(0, int(np.prod(shape[:depth])), size=tuples)  # duplicates on purpose
            idx = np.stack(np.unravel_index(flat, shape[:depth]), axis=-1).reshape(index_shape).astype(np.float32)
            low, high = (1, 3) if reduction == "mul" else (-9, 10)
            data, updates = integers(rng, shape, low, high), integers(rng, index_shape[:-1] + shape[depth:], low, high)
            for tolerance, dtypes in (("elementwise", ("float32", "float16", "bfloat16")),
                                      ("exact", ("int32", "int64"))):
                cases.append(Case("scatter_nd", f"{reduction}_{name}_{tolerance}", [data, idx, updates],
                                  {"reduction": reduction}, ref_scatter_nd_reduce, tolerance, dtypes,
                                  input_dtypes=[None, "int64", None]))
    return cases


def data_dependent_cases() -> List[Case]:
    """The bounded ops of segmented plans (Note [Segmented plans]): the result fills the first count columns
    (non_zero) or rows (non_max_suppression), the rest is zero."""
    cases = []
    for name, (shape, density) in {"vec_37": ((37,), 0.5), "mat_5x7": ((5, 7), 0.3), "cube_2x3x4": ((2, 3, 4), 0.7),
                                   "long_5000": ((5000,), 0.1), "none_6x5": ((6, 5), 0.0),
                                   "tiles_3x2100": ((3, 2100), 0.9)}.items():
        rng = _rng("non_zero" + name)
        x = np.where(rng.uniform(size=shape) < density, integers(rng, shape, 1, 9), 0).astype(np.float32)
        cases.append(Case("non_zero", name, [x], {}, ref_non_zero, "exact", ALL_DTYPES, out_dtype="int64",
                          more_out_dtypes=["int64"]))
    for name, (batches, classes, n, attrs) in {
            "one_class_150": (1, 1, 150, {"max_output_boxes_per_class": 10 ** 9, "iou_threshold": 0.55}),
            "classes_2x3x41": (2, 3, 41, {"max_output_boxes_per_class": 5, "iou_threshold": 0.3,
                                          "score_threshold": 0.2}),
            "center_1x2x67": (1, 2, 67, {"max_output_boxes_per_class": 100, "iou_threshold": 0.5,
                                         "center_point_box": 1}),
            "none_kept": (1, 2, 9, {"max_output_boxes_per_class": 4, "iou_threshold": 0.5,
                                    "score_threshold": 2.0}),
            "tiles_1x1x700": (1, 1, 700, {"max_output_boxes_per_class": 10 ** 6, "iou_threshold": 0.4}),
            # 47 tiles of candidates spread over a wide field: most tile pairs have no overlap (Note [The NMS walk])
            "sparse_1x1x3000": (1, 1, 3000, {"max_output_boxes_per_class": 10 ** 6, "iou_threshold": 0.3}),
            "sparse_2x2x1100": (2, 2, 1100, {"max_output_boxes_per_class": 900, "iou_threshold": 0.5,
                                             "score_threshold": 0.05}),
            # more (batch, class) pairs than one chunk of the offsets' scan
            "classes_2x600x8": (2, 600, 8, {"max_output_boxes_per_class": 3, "iou_threshold": 0.5,
                                            "score_threshold": 0.3})}.items():
        rng = _rng("nms" + name)
        corner = uniform(rng, (batches, n, 2), 0, 100 if name.startswith("sparse") else 8)
        size = uniform(rng, (batches, n, 2), 0.5, 3)
        if attrs.get("center_point_box"):
            boxes = np.concatenate([corner, size], axis=-1)
        else:
            flip = rng.uniform(size=(batches, n, 1)) < 0.2  # some boxes given with corners swapped
            boxes = np.where(flip, np.concatenate([corner + size, corner], -1),
                             np.concatenate([corner, corner + size], -1))
        scores = uniform(rng, (batches, classes, n), 0, 1)
        cases.append(Case("non_max_suppression", name, [boxes.astype(np.float32), scores], attrs, ref_nms, "exact",
                          ("float32", "float16"), out_dtype="int64", more_out_dtypes=["int64"]))
    return cases


# ---- fused_elementwise (Note [Fused elementwise programs]): programs of the shapes the elementwise_fusion pass makes
# from real exports (SiLU, GELU from erf, RMSNorm's and layer scale's tails, squeeze-excitation gates), broadcast
# inputs (per channel, per row, scalars, both sides), odd sizes. The reference runs the program in float64. ----

_ERF = np.vectorize(math.erf, otypes=[np.float64])
_FUSED_MATH = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "pow": np.power, "max": np.maximum, "min": np.minimum, "neg": lambda a: -a, "abs": np.abs,
    "relu": lambda a: np.maximum(a, 0.0), "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)), "tanh": np.tanh,
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "reciprocal": lambda a: 1.0 / a, "erf": _ERF,
    "gelu": lambda a: 0.5 * a * (1.0 + _ERF(a / math.sqrt(2.0))),
    "gelu_tanh": lambda a: 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3))),
    "f32": lambda a: a, "f16": lambda a: a.astype(np.float16).astype(np.float64), "bf16": lambda a: _to_bf16(a),
    "hard_sigmoid": lambda a: np.clip(a / 6.0 + 0.5, 0.0, 1.0),
    "hard_swish": lambda a: a * np.clip(a / 6.0 + 0.5, 0.0, 1.0),
}
_FUSED_REDUCTIONS = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max}


def _to_bf16(a: np.ndarray) -> np.ndarray:
    """Rounds to bfloat16 (nearest even) and back, in float64."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def run_fused_program(program: str, inputs: List[np.ndarray], row_axes: int = 0) -> np.ndarray:
    """A fused_elementwise program evaluated in float64 (the op's definition): the inputs broadcast to the output,
    every instruction at every element, a reduction over the last `row_axes` axes (keepdims, broadcast back)."""
    shape = np.broadcast_shapes(*[np.shape(x) for x in inputs])
    inputs = [np.broadcast_to(np.asarray(x, np.float64), shape) for x in inputs]
    axes = tuple(range(len(shape) - row_axes, len(shape))) if row_axes else None
    values = []
    for instruction in program.split(";"):
        op, *operands = instruction.split()
        args = [inputs[int(o[1:])] if o[0] == "x" else values[int(o[1:])] for o in operands]
        if op in _FUSED_REDUCTIONS:
            value = _FUSED_REDUCTIONS[op](args[0], axis=axes, keepdims=True)
        elif op == "rotate_half":
            half = shape[-1] // 2
            value = np.concatenate([-args[0][..., half:], args[0][..., :half]], axis=-1)
        else:
            value = _FUSED_MATH[op](*args)
        values.append(np.broadcast_to(np.asarray(value, dtype=np.float64), shape))
    return values[-1]


FUSED_PROGRAMS = [
    # name, program, input shapes, (low, high) per input
    ("silu", "sigmoid x0; mul x0 t0", [(7, 13)], None),
    ("silu_4d", "sigmoid x0; mul x0 t0", [(2, 3, 5, 9)], None),
    ("scale_shift_relu", "mul x0 x1; add t0 x2; relu t1", [(2, 3, 5, 7), (3, 1, 1), (1,)], None),
    ("gelu_erf", "div x0 x1; erf t0; add t1 x2; mul x0 t2; mul t3 x3", [(3, 17, 33), (1,), (), (1,)],
     [(-3, 3), (1.4, 1.42), (1, 1), (0.5, 0.5)]),
    ("rms_tail", "mul x0 x1; mul t0 x2", [(4, 9, 16), (4, 9, 1), (16,)], [(-2, 2), (0.5, 2), (-1, 1)]),
    ("layer_scale_residual", "mul x0 x1; add x2 t0", [(2, 7, 7, 24), (24,), (2, 7, 7, 24)], None),
    ("se_gate", "sigmoid x1; mul x0 t0", [(2, 16, 5, 5), (2, 16, 1, 1)], None),
    ("both_sides", "add x0 x1; gelu_tanh t0", [(5, 1, 7), (1, 4, 1)], None),
    ("long_chain", "neg x0; exp t0; add t1 x1; reciprocal t2; tanh t3; sub t4 x0; abs t5; sqrt t6; log t7",
     [(3, 31), (31,)], [(-2, 2), (0.5, 1.5)]),
    ("pow_max_min", "abs x0; pow t0 x1; max t1 x2; min t2 x3; gelu t3", [(6, 11), (1,), (11,), (6, 1)],
     [(-2, 2), (0.5, 2.5), (-1, 1), (0, 2)]),
    ("rows", "sigmoid x0; mul t0 x1", [(1, 1000, 37), (37,)], None),
    # MobileNetV3's activations and squeeze-excitation gate, channels-last; inputs across both kinks (-3 and 3).
    ("hard_swish", "hard_swish x0", [(2, 5, 7, 24)], [(-5, 5)]),
    ("hard_sigmoid_gate", "hard_sigmoid x1; mul x0 t0", [(2, 7, 7, 40), (2, 1, 1, 40)], [(-2, 2), (-5, 5)]),
    ("one_element", "mul x0 x1; add t0 x0", [(1,), ()], None),
    # Casts and row reductions (what the exporters write for RMSNorm, LayerNorm, softmax, squeeze-excitation). A
    # trailing number is row_axes; rows longer than 1024 run a block per row, shorter ones a warp per row.
    ("casts", "f16 x0; mul t0 x1; bf16 t1; f32 t2; add t3 x0", [(5, 19), (19,)], None),
    ("rmsnorm", "f32 x0; mul t0 t0; reduce_mean t1; add t2 x1; sqrt t3; reciprocal t4; mul t0 t5; f16 t6; mul t7 x2",
     [(3, 5, 64), (1,), (64,)], [(-2, 2), (1e-3, 1e-3), (-1, 1)], 1),
    ("layernorm", "reduce_mean x0; sub x0 t0; mul t1 t1; reduce_mean t2; add t3 x1; sqrt t4; div t1 t5; mul t6 x2; "
     "add t7 x3", [(2, 7, 33), (1,), (33,), (33,)], [(-2, 2), (1e-5, 1e-5), (-1, 1), (-1, 1)], 1),
    ("softmax_block_rows", "reduce_max x0; sub x0 t0; exp t1; reduce_sum t2; div t2 t3", [(4, 3, 1030)], None, 1),
    ("softmax_long_rows", "reduce_max x0; sub x0 t0; exp t1; reduce_sum t2; div t2 t3", [(3, 5001)], None, 1),
    ("se_mean_gate", "reduce_mean x0; sigmoid t0; mul x0 t1", [(2, 16, 7, 7)], None, 2),
    ("broadcast_operand", "mul x0 x1; reduce_sum t0; add t1 x0", [(3, 1, 9), (4, 9)], None, 1),
    ("one_row", "reduce_max x0; sub t0 x0; reduce_sum t1; add t1 t2", [(2, 3, 5)], None, 3),
    # The rotary embedding: q * cos + rotate_half(q) * sin, cos and sin broadcast over batch and heads; an input
    # broadcast along the last axis; rotate_half inside a reducing program.
    # Vector loops (Note [Vectorised programs]): SwiGLU, a per-row scale and a bias row along the vector, RMSNorm over
    # rows of 1024 (a warp per row), LayerNorm over short rows (groups of 4 lanes, a last block with rows to spare).
    ("swiglu", "sigmoid x0; mul x0 t0; mul t1 x1", [(5, 2, 88), (5, 2, 88)], None),
    ("row_scale_bias", "mul x0 x1; add t0 x2", [(33, 64), (33, 1), (64,)], None),
    ("rmsnorm_rows_1024", "mul x0 x0; reduce_mean t0; add t1 x1; sqrt t2; reciprocal t3; mul x0 t4; mul t5 x2",
     [(300, 1024), (1,), (1024,)], [(-2, 2), (1e-5, 1e-5), (-1, 1)], 1),
    ("layernorm_short_rows", "reduce_mean x0; sub x0 t0; mul t1 t1; reduce_mean t2; add t3 x1; sqrt t4; div t1 t5; "
     "mul t6 x2; add t7 x3", [(1001, 24), (1,), (24,), (24,)], [(-2, 2), (1e-5, 1e-5), (-1, 1), (-1, 1)], 1),
    ("rotary", "mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2", [(2, 3, 7, 16), (7, 16), (7, 16)], None),
    ("rotary_heads_64", "mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2", [(2, 5, 3, 64), (5, 1, 64), (5, 1, 64)],
     None),
    ("rotary_two_wide", "rotate_half x0; mul t0 x1", [(5, 2), (5, 1)], None),
    ("rotate_half_broadcast", "rotate_half x1; add x0 t0", [(3, 6), (3, 1)], None),
    ("rotate_half_rows", "rotate_half x0; mul t0 t0; reduce_sum t1; div t0 t2", [(4, 10)], [(0.5, 2)], 1),
]


def fused_elementwise_cases() -> List[Case]:
    cases = []
    for name, program, shapes, ranges, *row_axes in FUSED_PROGRAMS:
        rng = _rng("fused" + name)
        inputs = [uniform(rng, shape, *(ranges[k] if ranges else (-2.0, 2.0))) for k, shape in enumerate(shapes)]
        attrs = {"program": program}
        if row_axes:
            attrs["row_axes"] = row_axes[0]
        cases.append(Case("fused_elementwise", name, inputs, attrs,
                          lambda xs, a: run_fused_program(a["program"], xs, a.get("row_axes", 0)), "reduction"))
    return cases


# ---- quantize_linear, dequantize_linear, dynamic_quantize_linear (Note [Quantize registry ops]) ----

_QUANT_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def _per_axis(param: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """A scale or zero point of one element (per tensor) or of x.shape[axis] elements, shaped to broadcast to x."""
    if param.size == 1:
        return param.reshape(())
    shape = [1] * x.ndim
    shape[axis % x.ndim] = param.size
    return param.reshape(shape)


def ref_quantize_linear(inputs, attrs):
    """x / scale in float32, rounded half to even, plus the zero point, saturated; float8e4m3fn rounds the quotient
    once, saturating (ONNX's QuantizeLinear)."""
    x, scale, zero_point = inputs
    axis = attrs.get("axis", 1)
    scaled = np.float32(x) / _per_axis(np.float32(scale), x, axis)
    out = attrs["output_dtype"]
    if out == "float8e4m3fn":
        from xpuruntime.quantization import _model
        return _model.e4m3_to_float(_model.float_to_e4m3(scaled)).astype(np.float64)
    zp = 0.0 if zero_point is None else _per_axis(zero_point, x, axis)
    low, high = _QUANT_RANGES[out]
    return np.clip(np.rint(scaled.astype(np.float64)) + zp, low, high)


def ref_dequantize_linear(inputs, attrs):
    x, scale, zero_point = inputs
    axis = attrs.get("axis", 1)
    zp = 0.0 if zero_point is None else _per_axis(zero_point, x, axis)
    return (x - zp) * _per_axis(scale, x, axis)


def ref_dynamic_quantize_linear(inputs, attrs):
    x = np.float32(inputs[0])
    x_min, x_max = min(np.float32(0), x.min()), max(np.float32(0), x.max())
    scale = np.float32(x_max - x_min) / np.float32(255)
    zp = np.clip(np.rint(np.float32(-x_min) / scale), 0, 255)
    y = np.clip(np.rint(x / scale) + zp, 0, 255)
    return y.astype(np.float64), np.float64(scale), np.float64(zp)


def quantize_cases() -> List[Case]:
    cases = []
    rng = _rng("quantize_linear")
    x = uniform(rng, (5, 41), -4.0, 4.0)
    x[0, :8] = np.array([-0.5, 0.5, 1.5, 2.5, -1.5, -2.5, 100.0, -100.0]) * 0.03125  # ties, saturation
    cases.append(Case("quantize_linear", "per_tensor_int8", [x, np.array([0.03125], np.float32),
                                                             np.array([-3.0], np.float32)],
                      {"output_dtype": "int8"}, ref_quantize_linear, "exact", input_dtypes=(None, None, "int8"),
                      out_dtype="int8"))
    x = uniform(rng, (3, 7, 5), -2.0, 2.0)
    cases.append(Case("quantize_linear", "per_axis_uint8", [x, uniform(rng, (7,), 0.01, 0.05),
                                                            integers(rng, (7,), 0, 20)],
                      {"axis": 1, "output_dtype": "uint8"}, ref_quantize_linear, "exact",
                      input_dtypes=(None, None, "uint8"), out_dtype="uint8"))
    x = uniform(rng, (4, 2, 33), -3.0, 3.0)
    cases.append(Case("quantize_linear", "last_axis_int8_no_zero_point", [x, uniform(rng, (33,), 0.01, 0.05), None],
                      {"axis": -1, "output_dtype": "int8"}, ref_quantize_linear, "exact", out_dtype="int8"))
    x = uniform(rng, (3, 37), -600.0, 600.0)
    cases.append(Case("quantize_linear", "float8e4m3fn", [x, np.array([1.0], np.float32), None],
                      {"output_dtype": "float8e4m3fn"}, ref_quantize_linear, "exact", out_dtype="float8e4m3fn"))
    cases.append(Case("dequantize_linear", "per_tensor_int8", [integers(rng, (3, 37), -128, 128),
                                                               np.array([0.02], np.float32),
                                                               np.array([5.0], np.float32)],
                      {}, ref_dequantize_linear, "elementwise", input_dtypes=("int8", None, "int8")))
    cases.append(Case("dequantize_linear", "per_axis_uint8", [integers(rng, (2, 6, 5), 0, 256),
                                                              uniform(rng, (6,), 0.01, 0.05),
                                                              integers(rng, (6,), 0, 256)],
                      {"axis": 1}, ref_dequantize_linear, "elementwise", input_dtypes=("uint8", None, "uint8")))
    cases.append(Case("dequantize_linear", "last_axis_int32", [integers(rng, (3, 8), -100000, 100000),
                                                               uniform(rng, (8,), 0.001, 0.002), None],
                      {"axis": -1}, ref_dequantize_linear, "elementwise", input_dtypes=("int32",)))
    for name, shape, low, high in [("mixed_7x13", (7, 13), -2.0, 5.0), ("positive_1029", (1029,), 0.5, 3.0),
                                   ("negative_3x5x7", (3, 5, 7), -6.0, -0.1)]:
        cases.append(Case("dynamic_quantize_linear", name, [uniform(_rng("dynamic" + name), shape, low, high)], {},
                          ref_dynamic_quantize_linear, "exact", ("float32",), out_dtype="uint8",
                          more_out_dtypes=["float32", "uint8"]))
    return cases


def _wrap_int32(v: np.ndarray) -> np.ndarray:
    return ((v.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int64)


def qlinear_cases() -> List[Case]:
    """The int8 GEMM (Note [Quantized registry ops]): the reference is the note's arithmetic in NumPy (exact integer
    sums wrapped to int32, then the epilogue in float32 operations: alpha = float32(x_scale * w_scale), the float
    bias added, relu, ONNX's QuantizeLinear with round half to even), so every kernel must match it exactly."""
    specs = [  # name, x dtype, (M, K, N), layout, output, bias (None | "int32" | "float32"), per-channel, relu, zp
        ("1x4x4_int8_out", "int8", (1, 4, 4), "nk", "int8", "int32", True, True, -3),
        ("3x30x7_kn_uint8", "uint8", (3, 30, 7), "kn", "uint8", "float32", False, False, 131),
        ("17x64x100_float32", "int8", (17, 64, 100), "nk", "float32", None, True, False, 0),
        ("9x48x20_float16_relu", "uint8", (9, 48, 20), "nk", "float16", "float32", True, True, 128),
        ("5x12x8_int32", "int8", (5, 12, 8), "kn", "int32", "int32", False, False, 7),
        ("33x96x64_run_time_zero_point", "uint8", (33, 96, 64), "nk", "int32", None, False, False, None),
    ]
    cases = []
    for name, x_dtype, (m, k, n), layout, output, bias, per_channel, relu, zero_point in specs:
        rng = _rng("qlinear" + name)
        low, high = (-128, 127) if x_dtype == "int8" else (0, 255)
        x = rng.integers(low, high + 1, size=(m, k)).astype(np.float32)
        w = rng.integers(-127, 128, size=(n, k) if layout == "nk" else (k, n)).astype(np.float32)
        attrs = {"weight_layout": layout, "output_dtype": output, "activation": "relu" if relu else "none"}
        w_scale = None
        if output != "int32":
            attrs["x_scale"] = 0.031
            w_scale = rng.uniform(0.002, 0.02, size=n if per_channel else 1).astype(np.float32)
        if output in ("int8", "uint8"):
            attrs.update(y_scale=0.031 * 0.01 * 64.0 * 64.0 * math.sqrt(k) / 60.0,
                         y_zero_point=-4 if output == "int8" else 120)
        b = None
        if bias == "int32":
            b = rng.integers(-20000, 20000, size=n).astype(np.float32)
        elif bias == "float32":
            b = uniform(rng, (n,), -10.0, 10.0)
        inputs = [x, w, w_scale, b]
        input_dtypes = [None, "int8", "float32", bias]
        if zero_point is None:  # a run-time zero point (input 4)
            inputs.append(np.array(201, dtype=np.float32))
            input_dtypes.append(x_dtype)
        else:
            attrs["x_zero_point"] = zero_point

        def reference(ins, a, bias=bias, layout=layout):
            xi, wi, si, bi = ins[:4]
            zp = int(ins[4]) if len(ins) > 4 and ins[4] is not None else int(a.get("x_zero_point", 0))
            wk = wi.T if layout == "nk" else wi
            acc = _wrap_int32((xi.astype(np.int64) - zp) @ wk.astype(np.int64))
            if bias == "int32":
                acc = _wrap_int32(acc + bi.astype(np.int64))
            out = a["output_dtype"]
            if out == "int32":
                return acc.astype(np.float64)
            alpha = (np.float64(np.float32(a["x_scale"])) * si.astype(np.float64)).astype(np.float32)
            real = acc.astype(np.float32) * alpha + (bi.astype(np.float32) if bias == "float32" else np.float32(0))
            if a["activation"] == "relu":
                real = np.maximum(real, np.float32(0))
            if out == "float32":
                return real.astype(np.float64)
            if out == "float16":
                return real.astype(np.float16).astype(np.float64)
            lo, hi = (-128, 127) if out == "int8" else (0, 255)
            q = np.rint(real / np.float32(a["y_scale"])).astype(np.float64) + a["y_zero_point"]
            return np.clip(q, lo, hi)

        cases.append(Case("qlinear", name, inputs, attrs, reference, "exact", dtypes=(x_dtype,),
                          input_dtypes=input_dtypes, out_dtype=output))
    return cases


def all_cases() -> List[Case]:
    """Every case of every op, in a stable order."""
    cases = (matmul_cases() + linear_cases() + linear_grad_weight_cases() + conv2d_cases()
             + conv_transpose2d_cases() + pool_cases()
             + batch_norm_cases() + softmax_cases()
             + nhwc_cases() + layer_norm_cases() + unary_cases() + binary_cases() + cast_cases() + reduce_cases()
             + attention_cases() + transpose_cases() + concat_cases() + slice_cases() + gather_cases()
             + expand_cases() + where_cases() + compare_cases() + cast_any_cases() + integer_arithmetic_cases()
             + pointwise_cases() + logical_cases() + cum_sum_cases() + gather_elements_cases() + gather_nd_cases()
             + pad_cases() + resize_cases() + integer_reduce_cases() + second_batch_cases()
             + fused_elementwise_cases() + quantize_cases() + qlinear_cases() + matmul_nbits_cases())
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return cases
