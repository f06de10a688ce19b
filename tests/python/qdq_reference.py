"""A numpy evaluator of the QDQ models the quantizer writes, for the quantization tests (test_quantization.py,
test_quantized_models.py): QuantizeLinear/DequantizeLinear in every form xrt.quantize writes (int8, uint8, int32,
float8e4m3fn, int4 blocks; per tensor, per axis, blocked) and the float ops of the tests' models (Gemm, MatMul, Add,
Relu, Clip, Reshape, Flatten, Conv with square stride and padding). Written from ONNX's operator definitions, not
from any engine, so that the engines are checked against it.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
from onnx import helper, numpy_helper

from xpuruntime.quantization import _model

INT8, UINT8, FLOAT8E4M3FN, INT4 = 3, 2, 17, 22
_INTEGER_RANGES = {INT8: (-128, 127), UINT8: (0, 255), INT4: (-8, 7)}


def initializer(t) -> np.ndarray:
    """An initializer's values; float8 as float32, int4 unpacked, from raw_data or int32_data."""
    count = int(np.prod(t.dims)) if t.dims else 1
    if t.data_type in (FLOAT8E4M3FN, INT4):
        raw = t.raw_data if t.raw_data else np.asarray(t.int32_data, np.uint8).tobytes()
        if t.data_type == FLOAT8E4M3FN:
            return _model.e4m3_to_float(np.frombuffer(raw, np.uint8)).reshape(tuple(t.dims))
        return _model.unpack_int4(raw, count).reshape(tuple(t.dims))
    return numpy_helper.to_array(t)


def broadcast_param(value: np.ndarray, x: np.ndarray, axis: int, block: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast against x: per tensor, per `axis`, or in blocks of `block`."""
    if value.ndim == 0 or value.size == 1 and not block:
        return value.reshape(())
    axis = axis % x.ndim
    if block:
        return np.repeat(value, block, axis=axis).take(np.arange(x.shape[axis]), axis=axis)
    shape = [1] * x.ndim
    shape[axis] = value.size
    return value.reshape(shape)


def windows(x: np.ndarray, kernel: Tuple[int, int], stride: int, pad: int) -> np.ndarray:
    """[N, C, H, W] -> [N, Ho, Wo, C, kh, kw] windows of a convolution."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=(2, 3))[:, :, ::stride, ::stride]
    return w.transpose(0, 2, 3, 1, 4, 5)


def conv(x: np.ndarray, weight: np.ndarray, bias, stride: int, pad: int) -> Tuple[np.ndarray, np.ndarray]:
    """Conv2d (groups 1) and its im2col matrix."""
    cols = windows(x, weight.shape[-2:], stride, pad)
    n, ho, wo = cols.shape[:3]
    cols = cols.reshape(n * ho * wo, -1)
    out = cols @ weight.reshape(weight.shape[0], -1).T + bias
    return out.reshape(n, ho, wo, -1).transpose(0, 3, 1, 2), cols


def _quantize_linear(op: str, i, a: dict, zero_point_type: int) -> np.ndarray:
    axis, block = a.get("axis", 1), a.get("block_size", 0)
    scale = broadcast_param(i[1].astype(np.float32), i[0], axis, block)
    zp = broadcast_param(i[2].astype(np.float32), i[0], axis, block) if len(i) > 2 and i[2] is not None \
        else np.float32(0)
    if op == "DequantizeLinear":
        return (i[0].astype(np.float32) - zp) * scale
    if zero_point_type == FLOAT8E4M3FN:
        return _model.e4m3_to_float(_model.float_to_e4m3(i[0] / scale))
    low, high = _INTEGER_RANGES[zero_point_type]
    return np.clip(np.rint(i[0] / scale) + zp, low, high)


def evaluate(model, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Runs `model`'s graph on `feeds`; every value it computes, by name (float32)."""
    values = {t.name: initializer(t) for t in model.graph.initializer}
    kinds = {t.name: t.data_type for t in model.graph.initializer}
    values.update(feeds)
    for node in model.graph.node:
        a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
        i = [values[n] if n else None for n in node.input]
        op = node.op_type
        if op in ("QuantizeLinear", "DequantizeLinear"):
            zero_point_type = kinds.get(node.input[2], UINT8) if len(i) > 2 else UINT8
            out = _quantize_linear(op, i, a, zero_point_type)
        elif op == "Gemm":
            A = i[0].T if a.get("transA", 0) else i[0]
            B = i[1].T if a.get("transB", 0) else i[1]
            out = A @ B + (i[2] if len(i) > 2 else 0)
        elif op == "MatMul":
            out = i[0] @ i[1]
        elif op == "Add":
            out = i[0] + i[1]
        elif op == "Relu":
            out = np.maximum(i[0], 0)
        elif op == "Clip":
            out = np.clip(i[0], i[1], i[2])
        elif op == "Reshape":
            out = i[0].reshape(tuple(int(d) for d in i[1]))
        elif op == "Flatten":
            out = i[0].reshape(len(i[0]), -1)
        elif op == "Conv":
            pad, stride = a.get("pads", [0] * 4)[0], a.get("strides", [1, 1])[0]
            out, _ = conv(i[0], i[1], i[2] if len(i) > 2 else 0, stride, pad)
        else:
            raise NotImplementedError(f"the QDQ reference evaluator has no {op}")
        values[node.output[0]] = np.asarray(out, np.float32)
    return values
