"""The cross-backend conformance suite: every kernel of every op against a NumPy float64 reference.

For each case of ``conformance_cases.py``, each dtype (float32, float16, bfloat16) and each kernel that
``xrt.kernels(op)`` lists (the cpu reference, and the GPU kernels of cublas, cublasLt, cudnn and cuda_raw), the
kernel is forced with ``KernelPolicy({op: "pin:<kernel>"})`` and its output compared with the reference under the
case's tolerance (see the module docstring of ``conformance_cases``). CPU kernels run on CPU tensors, CUDA kernels
on ``cuda:0`` (skipped, with the reason, on machines without a CUDA device or builds without the backend).

16-bit runs build float32 inputs, convert them on the device with ``xrt.ops.cast`` (the default kernel), and
convert the output back to float32 the same way; the reference is computed from the same rounded inputs. Integer
and bool runs (the data-movement ops, where, the comparisons, cast, integer arithmetic) build their inputs in
NumPy (``to_numpy_dtype``) and compare exactly.

A kernel may decline a case (``supports()`` says no: ``UnsupportedOperationError``) only when ``EXCLUSIONS``
lists that (kernel, op, condition) with the reason; any other rejection fails the test. An excluded case that
runs anyway is checked like any other.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, List

import numpy as np
import pytest

import xpuruntime as xrt
from conformance_cases import TOLERANCES, Case, _out_size, all_cases, round_to, to_numpy_dtype

HAS_GPU = xrt.get_device_count() > 0
CASES = all_cases()
CASE_INDEX = {case.id: index for index, case in enumerate(CASES)}


# ---- exclusions: what a kernel is allowed to decline, and why ----

def _not_cublaslt_int8_form(case: Case, dtype: str) -> bool:
    k, n = case.inputs[0].shape[-1], case.inputs[1].shape[0 if case.attrs.get("weight_layout") == "nk" else 1]
    return case.attrs.get("weight_layout") != "nk" or k % 4 != 0 or n % 4 != 0


@dataclass(frozen=True)
class Exclusion:
    kernel: str
    op: str  # an op name, or "*" for every op
    condition: Callable[[Case, str], bool]  # (case, dtype) -> excluded?
    reason: str


def _head_dim(case: Case, k: int) -> int:
    """D of attention input k (0: q, 2: v): the last dim, of [B, H, S, D], [B, S, H, D] or packed [B, S, P, H, D]."""
    return case.inputs[k].shape[-1]


def _seq_q(case: Case) -> int:
    """Sq of attention's q: [B, H, S, D], [B, S, H, D] (bshd[0]) or packed [B, S, P, H, D] (qkv_parts[0] >= 0)."""
    packed = case.attrs.get("qkv_parts", [-1, -1, -1])[0] >= 0
    bshd = case.attrs.get("bshd", [0, 0, 0, 0])[0] == 1
    return case.inputs[0].shape[1 if packed or bshd else 2]


def _linear_rows(case: Case) -> int:
    """M of linear's x [..., K]: every dim but the last, multiplied."""
    rows = 1
    for d in case.inputs[0].shape[:-1]:
        rows *= d
    return rows


def _linear_vector_dim(case: Case) -> int:
    """The weight's contiguous dim: K of [N, K] (weight_layout=nk, the default), N of [K, N] (kn)."""
    return case.inputs[1].shape[1]


def _asymmetric_pads(case: Case, dtype: str) -> bool:
    pads = case.attrs.get("pads", [0, 0, 0, 0])
    return pads[0] != pads[2] or pads[1] != pads[3]


def _asymmetric_pads_3d(case: Case, dtype: str) -> bool:
    pads = case.attrs.get("pads", [0] * 6)
    return pads[:3] != pads[3:]


def _ceil_changes_size(case: Case, dtype: str) -> bool:
    if not case.attrs.get("ceil_mode", 0):
        return False
    x = case.inputs[0].shape
    kernel = case.attrs["kernel_shape"]
    strides = case.attrs.get("strides", kernel)
    pads = case.attrs.get("pads", [0, 0, 0, 0])
    dilations = case.attrs.get("dilations", [1, 1])
    return any(_out_size(x[2 + d], kernel[d], strides[d], pads[d], pads[d + 2], dilations[d], True)
               != _out_size(x[2 + d], kernel[d], strides[d], pads[d], pads[d + 2], dilations[d], False)
               for d in range(2))


def _matmul_needs_several_batches(case: Case, dtype: str) -> bool:
    """Whether a's and b's batch dims broadcast against each other in a pattern one strided batch cannot express
    (the same walk as cublas::matmul_outer_launches)."""
    a, b = case.inputs[0].shape, case.inputs[1].shape
    if int(np.prod(b[:-2])) == 1:
        return False
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    rank = len(batch)

    def broadcast(shape, j):
        batch_rank = len(shape) - 2
        return j < rank - batch_rank or shape[j - (rank - batch_rank)] == 1

    dims = [j for j in range(rank) if batch[j] != 1]
    first = len(dims)
    while first > 0:
        candidate = first - 1
        if candidate + 1 < len(dims):
            j, following = dims[candidate], dims[candidate + 1]
            if broadcast(a, j) != broadcast(a, following) or broadcast(b, j) != broadcast(b, following):
                break
        first = candidate
    return first > 0


def _deep_grouped_nhwc(case) -> bool:
    """Whether conv2d's grouped_gemm kernel takes `case`: NHWC, groups > 1 of more than one channel, and a group's
    reduction (C/groups x kh x kw) of at least 1024 values."""
    if case.attrs.get("layout", "NCHW") != "NHWC":
        return False
    groups = case.attrs.get("groups", 1)
    channels = case.inputs[0].shape[3]
    kh, kw = case.inputs[1].shape[1], case.inputs[1].shape[2]  # NHWC weight: [O, kh, kw, C/groups]
    return groups > 1 and channels // groups > 1 and (channels // groups) * kh * kw >= 1024


EXCLUSIONS: List[Exclusion] = [
    Exclusion("depthwise", "conv2d", lambda c, dt: c.attrs.get("groups", 1) == 1
              or c.inputs[1].shape[0] != c.inputs[0].shape[3 if c.attrs.get("layout", "NCHW") == "NHWC" else 1]
              or c.inputs[1].shape[3 if c.attrs.get("layout", "NCHW") == "NHWC" else 1] != 1,
              "the depthwise kernel takes depthwise convolutions only (groups == channels == outputs, NCHW or NHWC); "
              "the others run on cudnn"),
    Exclusion("grouped_gemm", "conv2d", lambda c, dt: not _deep_grouped_nhwc(c),
              "the grouped_gemm kernel takes channels-last grouped convolutions (not depthwise) whose groups reduce "
              "over 1024 values or more (Note [Grouped convolutions as GEMMs]); the others run on cudnn"),
    Exclusion("flash_v2", "attention", lambda c, dt: dt == "float32",
              "flash_v2 is a float16/bfloat16 kernel (tensor-core mma); float32 attention runs on 'unfused'"),
    Exclusion("flash_v2", "attention", lambda c, dt: _head_dim(c, 0) not in (32, 64, 128),
              "flash_v2 is instantiated for head dims 32, 64 and 128 only"),
    Exclusion("flash_v2", "attention", lambda c, dt: _head_dim(c, 2) != _head_dim(c, 0),
              "flash_v2 needs v's head dim equal to q's (Dv == D)"),
    Exclusion("flash_decode", "attention", lambda c, dt: dt == "float32" or _head_dim(c, 0) not in (32, 64, 128)
              or _head_dim(c, 2) != _head_dim(c, 0),
              "flash_decode takes flash_v2's dtypes and head dims (float16/bfloat16; D = Dv in 32, 64, 128)"),
    Exclusion("flash_decode", "attention", lambda c, dt: _seq_q(c) > 8 or c.attrs.get("causal", 0) == 1,
              "flash_decode is for decode steps: up to 8 query positions, no causal mask; flash_v2 runs the rest"),
    Exclusion("gemv", "linear", lambda c, dt: dt == "float32" or _linear_rows(c) > 8
              or _linear_vector_dim(c) % 8 != 0,
              "gemv is linear for 1 to 8 rows of float16/bfloat16 x, the weight read in 16-byte vectors along its "
              "rows (K a multiple of 8 for weight_layout=nk, N for kn); cuBLASLt runs the rest"),
    Exclusion("cudnn", "attention", lambda c, dt: dt == "float32",
              "cuDNN's fused attention takes float16/bfloat16; float32 attention runs on 'unfused'"),
    Exclusion("cudnn", "attention", lambda c, dt: c.inputs[3] is not None
              and tuple(c.inputs[3].shape[-2:]) != (c.inputs[0].shape[2], c.inputs[1].shape[2]),
              "cuDNN's attention bias is [B or 1, H or 1, Sq, Sk]; masks broadcast along Sq or Sk run on flash_v2"),
    Exclusion("cudnn", "attention", lambda c, dt: _head_dim(c, 2) != _head_dim(c, 0),
              "the cudnn attention kernel needs v's head dim equal to q's (Dv == D)"),
    Exclusion("cudnn", "attention", lambda c, dt: c.attrs.get("fully_masked_rows", "nan") != "nan",
              "cuDNN does not document what its fused softmax gives a row whose every score is -inf, so it cannot "
              "promise fully_masked_rows=\"zero\" or \"uniform\"; flash_v2 and unfused implement them"),
    Exclusion("cudnn", "conv_transpose3d", _asymmetric_pads_3d,
              "cuDNN's N-d convolution descriptor takes one pad per axis (begin == end)"),
    Exclusion("cudnn", "conv3d", _asymmetric_pads_3d,
              "cuDNN's N-d convolution descriptor takes one pad per axis (begin == end)"),
    Exclusion("cudnn", "conv2d", _asymmetric_pads,
              "cuDNN convolution takes symmetric pads (top == bottom, left == right) only"),
    Exclusion("cudnn_search", "conv2d", _asymmetric_pads,
              "cuDNN convolution takes symmetric pads (top == bottom, left == right) only"),
    Exclusion("cudnn", "max_pool2d", _asymmetric_pads, "cuDNN pooling takes symmetric pads only"),
    Exclusion("cudnn", "avg_pool2d", _asymmetric_pads, "cuDNN pooling takes symmetric pads only"),
    Exclusion("cudnn", "max_pool2d", lambda c, dt: list(c.attrs.get("dilations", [1, 1])) != [1, 1],
              "cuDNN max pooling has no dilation"),
    Exclusion("cudnn", "max_pool2d", _ceil_changes_size,
              "cuDNN computes floor output sizes; ceil_mode is supported only where it gives the same size"),
    Exclusion("cudnn", "avg_pool2d", _ceil_changes_size,
              "cuDNN computes floor output sizes; ceil_mode is supported only where it gives the same size"),
    Exclusion("cublasLt", "matmul", _matmul_needs_several_batches,
              "cuBLASLt runs one strided batch; batch dims broadcasting in different dims need the cublas kernel"),
    Exclusion("cublasLt", "qlinear", _not_cublaslt_int8_form,
              "cuBLASLt's int8 GEMM takes a [N, K] weight with K and N multiples of 4 (Note [cuBLASLt int8 GEMMs]); "
              "the dp4a kernel takes the rest"),
    Exclusion("int8_wgmma", "qlinear",
              lambda c, dt: c.attrs.get("weight_layout") != "nk" or c.inputs[0].shape[-1] % 16 or not _hopper(),
              "Hopper's warpgroup int8 GEMM (sm_90a, compute capability 9.0 only) takes a [N, K] weight with K a "
              "multiple of 16 (16-byte copies into its swizzled stages); the other kernels take the rest"),
    Exclusion("int8_mma", "qlinear", lambda c, dt: c.attrs.get("weight_layout") != "nk" or c.inputs[0].shape[-1] % 16,
              "the tensor-core kernel (qlinear as a 1x1 convolution) takes a [N, K] weight with K a multiple of 16 "
              "(its m16n8k32 tiles read K in 16-byte rows); the dp4a and cublasLt kernels take the rest"),
]


@functools.lru_cache(maxsize=None)
def _hopper() -> bool:
    """Whether the first GPU has compute capability 9.0 (where int8_wgmma runs)."""
    gpus = [d for d in xrt.get_all_devices() if str(d.type) == "cuda"]
    return bool(gpus) and tuple(gpus[0].compute_capability) == (9, 0)


def exclusion_for(kernel: str, case: Case, dtype: str):
    for exclusion in EXCLUSIONS:
        if exclusion.kernel == kernel and exclusion.op in (case.op, "*") and exclusion.condition(case, dtype):
            return exclusion
    return None


# ---- parameters: (case, dtype, kernel) for every kernel of every op ----

def _params():
    params = []
    for case in CASES:
        for info in xrt.kernels(case.op):
            for dtype in case.dtypes:
                marks = []
                if info.device_type == "cuda" and not HAS_GPU:
                    marks.append(pytest.mark.skip(
                        reason=f"needs a CUDA device: {xrt.runtime.cuda_unavailable_reason()}"))
                params.append(pytest.param(case, dtype, info, marks=marks, id=f"{case.id}-{dtype}-{info.name}"))
    return params


@functools.lru_cache(maxsize=None)
def _reference(case_index: int, dtype: str) -> np.ndarray:
    case = CASES[case_index]
    with np.errstate(all="ignore"):
        inputs = [round_to(x, case.input_dtype(k, dtype)) for k, x in enumerate(case.inputs)]
        expected = case.reference(inputs, case.attrs)
        # Several outputs (top_k: values, indices) come back as a tuple.
        if isinstance(expected, tuple):
            return tuple(np.asarray(e, dtype=np.float64) for e in expected)
        return np.asarray(expected, dtype=np.float64)


def _device_input(array, dtype: str, device: str):
    if array is None:
        return None
    if dtype not in ("float32", "float16", "bfloat16"):
        tensor = xrt.from_numpy(np.array(to_numpy_dtype(array, dtype), order="C"))  # keeps 0-d arrays 0-d
        return tensor if device == "cpu" else tensor.to(device)
    tensor = xrt.from_numpy(np.ascontiguousarray(array, dtype=np.float32).copy())
    if device != "cpu":
        tensor = tensor.to(device)
    return tensor if dtype == "float32" else xrt.ops.cast(tensor, dtype)


def _to_float64(tensor) -> np.ndarray:
    if tensor.dtype in ("float16", "bfloat16"):
        tensor = xrt.ops.cast(tensor, "float32")
    return np.array(tensor.numpy(), dtype=np.float64)


@pytest.mark.parametrize("case,dtype,info", _params())
def test_kernel_matches_reference(case: Case, dtype: str, info):
    if info.summary == "not in this build":
        pytest.skip(f"{info.name} ({info.backend}) is not in this build")
    device = "cuda:0" if info.device_type == "cuda" else "cpu"
    exclusion = exclusion_for(info.name, case, dtype)
    inputs = [_device_input(x, case.input_dtype(k, dtype), device) for k, x in enumerate(case.inputs)]
    policy = xrt.KernelPolicy({case.op: f"pin:{info.name}"})
    try:
        outputs, decision = xrt.ops.call(case.op, inputs, case.attrs, policy=policy, return_decision=True)
    except xrt.UnsupportedOperationError as error:
        if exclusion is not None:
            pytest.skip(f"excluded: {exclusion.reason} (the kernel says: {error})")
        pytest.fail(f"{info.name} unexpectedly declined {case!r} at {dtype}: {error}\n"
                    "Fix the kernel, or add an entry with its reason to EXCLUSIONS in test_conformance.py.")
    assert decision.kernel == info.name, decision
    expected_all = _reference(CASE_INDEX[case.id], dtype)
    expected_all = expected_all if isinstance(expected_all, tuple) else (expected_all,)
    assert len(outputs) == len(expected_all)
    for index, (output, expected) in enumerate(zip(outputs, expected_all)):
        out_dtype = case.attrs["to"] if case.op == "cast" else (case.output_dtype(index) or dtype)
        assert output.dtype == out_dtype
        _check_close(case, info, dtype, _to_float64(output), expected, index)


def _check_close(case: Case, info, dtype: str, actual: np.ndarray, expected: np.ndarray, index: int) -> None:
    assert actual.shape == expected.shape, f"{case!r} output {index}: shape {actual.shape}, expected {expected.shape}"
    rtol, atol = TOLERANCES[case.tolerance][dtype]
    close = np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    if not close.all():
        bad = np.argwhere(~close)
        error = np.abs(actual - expected)
        worst = np.unravel_index(np.nanargmax(np.where(close, 0.0, error)), error.shape)
        samples = ", ".join(f"{tuple(int(i) for i in idx)}: got {actual[tuple(idx)]!r}, expected "
                            f"{expected[tuple(idx)]!r}" for idx in bad[:5])
        pytest.fail(f"{info.name} on {case!r} at {dtype}, output {index}: {len(bad)} of {actual.size} elements off "
                    f"(rtol={rtol}, atol={atol}); worst at {tuple(int(i) for i in worst)}: got {actual[worst]!r}, "
                    f"expected {expected[worst]!r}; first: {samples}")
