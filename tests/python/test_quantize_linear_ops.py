"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear as registry ops (issue 41; Note [Quantize registry ops]
in src/cpp/core/quantize_ops.h): the ops through xrt.ops.call against numpy, and QDQ models built with onnx.helper
(Q -> DQ -> Relu -> Q -> DQ per tensor and per axis, float8 in both saturation modes, int4, float16,
DynamicQuantizeLinear -> DequantizeLinear) on the native engine: on the CPU every Q/DQ node runs on the cpu registry kernel (explain() says
so) and the outputs equal numpy's evaluation written here from ONNX's definitions; on CUDA (skipped without a GPU)
every node runs on the GPU under fallback="error" and the outputs equal the CPU's bit for bit. Blocked scales stay on
the node kernels, with the reason.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

QUANTIZE_OPS = {"quantize_linear", "dequantize_linear", "dynamic_quantize_linear"}

# ---- numpy, from ONNX's definitions ----

_INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15)}
_FLOAT8 = {"float8e4m3fn": (3, 7, False), "float8e4m3fnuz": (3, 8, True), "float8e5m2": (2, 15, False),
           "float8e5m2fnuz": (2, 16, True)}


def _float8_values(name: str) -> np.ndarray:
    """The value of each code 0..255 of a float8 format (NaN for its NaN codes, +-inf for e5m2's)."""
    mantissa_bits, bias, fnuz = _FLOAT8[name]
    exponent_mask = (1 << (7 - mantissa_bits)) - 1
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent, mantissa = (code >> mantissa_bits) & exponent_mask, code & ((1 << mantissa_bits) - 1)
        if (fnuz and code == 0x80) or (name == "float8e4m3fn" and code & 0x7F == 0x7F):
            values.append(math.nan)
        elif name == "float8e5m2" and exponent == exponent_mask:
            values.append(sign * math.inf if mantissa == 0 else math.nan)
        elif exponent == 0:
            values.append(sign * mantissa * 2.0 ** (1 - bias - mantissa_bits))
        else:
            values.append(sign * (1 + mantissa / 2 ** mantissa_bits) * 2.0 ** (exponent - bias))
    return np.array(values)


def to_float8(x: np.ndarray, name: str, saturate: bool) -> np.ndarray:
    """float64 values rounded to the float8 format `name` (nearest, ties to the even code), with ONNX's rules for
    what does not fit: saturate -> +-max; else Inf (e5m2) or NaN. Returns the float8 values as float64."""
    values = _float8_values(name)[:128]
    finite = np.isfinite(values)
    codes = np.arange(128)[finite]
    positive = values[finite]
    top = positive[-1]
    ulp = top - positive[-2]
    grid = np.append(positive, top + ulp)  # the value past the largest: rounding to it overflows
    grid_codes = np.append(codes, codes[-1] + 1)
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    upper = np.clip(np.searchsorted(grid, np.minimum(a, grid[-1]), side="left"), 1, len(grid) - 1)
    lower = upper - 1
    d_up, d_low = grid[upper] - a, a - grid[lower]
    pick = np.where((d_up < d_low) | ((d_up == d_low) & (grid_codes[upper] % 2 == 0)), upper, lower)
    overflow = (pick == len(grid) - 1) | np.isinf(a)
    magnitude = np.where(overflow, top if saturate else (math.inf if name == "float8e5m2" else math.nan), grid[pick])
    return np.where(np.isnan(x), math.nan, np.copysign(magnitude, x))


def _param(value: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    if value.size == 1:
        return value.reshape(())
    shape = [1] * x.ndim
    shape[axis % x.ndim] = value.size
    return value.reshape(shape)


def quantize(x, scale, zero_point, dtype: str, axis: int = 1, saturate: bool = True) -> np.ndarray:
    """ONNX QuantizeLinear: x / scale in float32, then round half to even + zero point, saturated (float8: rounded
    once to the format). Returns the quantized values as float64."""
    scaled = (np.asarray(x, np.float32) / _param(np.asarray(scale, np.float32), x, axis)).astype(np.float64)
    zp = _param(np.asarray(zero_point, np.float64), x, axis) if zero_point is not None else 0.0
    if dtype in _FLOAT8:
        return to_float8(scaled + zp, dtype, saturate)
    low, high = _INTEGER_RANGES[dtype]
    return np.clip(np.where(np.isnan(scaled), zp, np.rint(scaled) + zp), low, high)


def dequantize(q, scale, zero_point, axis: int = 1, out=np.float32) -> np.ndarray:
    """ONNX DequantizeLinear: (q - zero point) * scale in float32, rounded to the scale's dtype."""
    zp = _param(np.asarray(zero_point, np.float64), q, axis) if zero_point is not None else 0.0
    centered = (np.asarray(q, np.float64) - zp).astype(np.float32)
    return (centered * _param(np.asarray(scale, np.float32), q, axis).astype(np.float32)).astype(out)


def dynamic_quantize(x: np.ndarray):
    x = np.asarray(x, np.float32)
    x_min, x_max = min(np.float32(0), x.min(initial=0)), max(np.float32(0), x.max(initial=0))
    scale = np.float32(x_max - x_min) / np.float32(255)
    zp = float(np.clip(np.rint(np.float32(-x_min) / scale), 0, 255)) if scale > 0 else 0.0
    y = np.clip(np.rint(x / scale) + zp, 0, 255) if scale > 0 else np.zeros_like(x)
    return y.astype(np.uint8), np.float32(scale), np.uint8(zp)


# ---- the registry ops through xrt.ops.call ----

def _tensor(array: np.ndarray, dtype: str = None):
    tensor = xrt.from_numpy(np.ascontiguousarray(array))
    return tensor if dtype is None else tensor.view(dtype)


@pytest.mark.parametrize("shape,axis", [((17,), None), ((3, 5, 7), 1), ((3, 5, 7), -1), ((2, 9, 4), 0)])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4", "uint4"])
def test_quantize_and_dequantize_ops_match_numpy(shape, axis, dtype):
    rng = np.random.default_rng(len(shape) * 7 + (axis or 0))
    count = 1 if axis is None else shape[axis]
    scale = rng.uniform(0.01, 0.1, count).astype(np.float32)
    low, high = _INTEGER_RANGES[dtype]
    zp = rng.integers(low, high + 1, count).astype(np.int8 if low < 0 else np.uint8)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.flat[:4] = [np.nan, np.inf, -np.inf, 2.5 * scale[0]]  # NaN -> the zero point, saturation, a tie
    attrs = {"axis": axis if axis is not None else 1, "output_dtype": dtype}
    scale_t = _tensor(scale if axis is not None else scale.reshape(()))
    zp_t = _tensor(zp if axis is not None else zp.reshape(()), dtype)
    (q,) = xrt.ops.call("quantize_linear", [_tensor(x), scale_t, zp_t], attrs)
    assert q.dtype == dtype
    expected = quantize(x, scale, zp, dtype, attrs["axis"])
    got = q.numpy().astype(np.float64)
    np.testing.assert_array_equal(got, expected)
    (y,) = xrt.ops.call("dequantize_linear", [q, scale_t, zp_t], {"axis": attrs["axis"]})
    np.testing.assert_array_equal(y.numpy(), dequantize(expected, scale, zp, attrs["axis"]))


@pytest.mark.parametrize("dtype", list(_FLOAT8))
@pytest.mark.parametrize("saturate", [1, 0])
def test_float8_quantize_matches_numpy(dtype, saturate):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(301) * 2.0 ** rng.integers(-12, 18, 301)).astype(np.float32)
    x[:6] = [np.nan, np.inf, -np.inf, 1e9, -1e9, -0.0]
    (q,) = xrt.ops.call("quantize_linear", [_tensor(x), _tensor(np.float32(1.0).reshape(()))],
                        {"output_dtype": dtype, "saturate": saturate})
    assert q.dtype == dtype
    np.testing.assert_array_equal(q.numpy().astype(np.float64), quantize(x, np.float32(1.0), None, dtype,
                                                                         saturate=bool(saturate)))


def test_dynamic_quantize_op_matches_numpy():
    x = (np.random.default_rng(3).standard_normal((4, 33)) * 5 + 1).astype(np.float32)
    y, scale, zp = xrt.ops.call("dynamic_quantize_linear", [_tensor(x)], {})
    ey, escale, ezp = dynamic_quantize(x)
    assert (y.dtype, scale.dtype, zp.dtype) == ("uint8", "float32", "uint8")
    np.testing.assert_array_equal(y.numpy(), ey)
    assert scale.numpy() == escale and zp.numpy() == ezp


def test_ops_raise_typed_errors():
    x = _tensor(np.ones((2, 3), np.float32))
    with pytest.raises(xrt.InvalidArgumentError, match="blocked scales"):
        xrt.ops.call("quantize_linear", [x, _tensor(np.ones((2, 3), np.float32))], {})
    with pytest.raises(xrt.InvalidTypeError, match="int16/uint16"):
        xrt.ops.call("quantize_linear", [x, _tensor(np.float32(1).reshape(()))], {"output_dtype": "int16"})
    with pytest.raises(xrt.InvalidTypeError, match="must be float32"):
        xrt.ops.call("dynamic_quantize_linear", [xrt.ops.cast(x, "float16")], {})


# ---- QDQ models on the native engine ----

FLOAT8E4M3FN, FLOAT8E5M2, UINT4, INT4 = 17, 19, 21, 22  # TensorProto's numbers (this onnx may predate them)


def _init(name, array, code=None):
    """An initializer: numpy's, or of element type `code` from unpacked values (int4/uint4, packed two per byte, the
    first in the low nibble) or float8 codes."""
    if code is None:
        return numpy_helper.from_array(np.asarray(array), name)
    values = np.asarray(array).astype(np.int64).flatten() & 0xFF
    if code in (INT4, UINT4):
        values = np.append(values & 0xF, np.zeros(values.size % 2, np.int64))
        values = values[0::2] | (values[1::2] << 4)
    t = onnx.TensorProto()
    t.name, t.data_type = name, code
    t.dims.extend(np.shape(array))
    t.raw_data = bytes(int(v) for v in values)
    return t


def _model(nodes, inits, x_shape, opset, x_type=TensorProto.FLOAT, y_type=TensorProto.FLOAT):
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", x_type, list(x_shape))],
                              [helper.make_tensor_value_info("y", y_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = {21: 10, 19: 9}.get(opset, 8)
    return model.SerializeToString()


def _qdq_chain(q1, q2, axis1=1, axis2=1, q_attrs=None, q2_attrs=None):
    """x -> Q(s1, z1) -> DQ -> Relu -> Q(s2, z2) -> DQ -> y."""
    z1 = ["z1"] if q1 else []
    z2 = ["z2"] if q2 else []
    return [helper.make_node("QuantizeLinear", ["x", "s1"] + z1, ["q1"], axis=axis1, **(q_attrs or {})),
            helper.make_node("DequantizeLinear", ["q1", "s1"] + z1, ["d1"], axis=axis1),
            helper.make_node("Relu", ["d1"], ["r"]),
            helper.make_node("QuantizeLinear", ["r", "s2"] + z2, ["q2"], axis=axis2, **(q2_attrs or {})),
            helper.make_node("DequantizeLinear", ["q2", "s2"] + z2, ["y"], axis=axis2)]


def _int8_model(rng, per_axis: bool):
    shape = (2, 3, 5, 7)
    s1 = rng.uniform(0.02, 0.05, 3 if per_axis else 1).astype(np.float32)
    z1 = rng.integers(-10, 10, s1.size).astype(np.int8)
    s2 = rng.uniform(0.01, 0.03, 7 if per_axis else 1).astype(np.float32)
    z2 = rng.integers(0, 20, s2.size).astype(np.uint8)
    if not per_axis:
        s1, z1, s2, z2 = (a.reshape(()) for a in (s1, z1, s2, z2))
    inits = [_init("s1", s1), _init("z1", z1), _init("s2", s2), _init("z2", z2)]
    model = _model(_qdq_chain(True, True, 1, -1), inits, shape, 13)

    def reference(x):
        d1 = dequantize(quantize(x, s1, z1, "int8", 1), s1, z1, 1)
        return dequantize(quantize(np.maximum(d1, 0), s2, z2, "uint8", -1), s2, z2, -1)
    return model, shape, reference


def _float8_model(rng, per_axis: bool):
    shape = (3, 4, 9)
    s1 = rng.uniform(0.5, 1.0, 4 if per_axis else 1).astype(np.float32)
    s2 = rng.uniform(0.001, 0.003, 4 if per_axis else 1).astype(np.float32)
    if not per_axis:
        s1, s2 = s1.reshape(()), s2.reshape(())
    zeros = np.zeros(s1.shape, np.uint8)
    inits = [_init("s1", s1), _init("z1", zeros, FLOAT8E4M3FN), _init("s2", s2),
             _init("z2", zeros, FLOAT8E5M2)]
    nodes = _qdq_chain(True, True, 1, 1, q_attrs={"saturate": 1}, q2_attrs={"saturate": 0})
    model = _model(nodes, inits, shape, 19)

    def reference(x):
        d1 = dequantize(quantize(x, s1, 0, "float8e4m3fn", 1, True), s1, None, 1)
        return dequantize(quantize(np.maximum(d1, 0), s2, 0, "float8e5m2", 1, False), s2, None, 1)
    return model, shape, reference


def _int4_model(rng, per_axis: bool):
    shape = (5, 6)
    s1 = rng.uniform(0.2, 0.5, 6 if per_axis else 1).astype(np.float32)
    s2 = rng.uniform(0.2, 0.5, 6 if per_axis else 1).astype(np.float32)
    if not per_axis:
        s1, s2 = s1.reshape(()), s2.reshape(())
    z2 = np.full(s2.shape, 3, np.uint8)
    inits = [_init("s1", s1), _init("s2", s2), _init("z2", z2, UINT4)]
    nodes = _qdq_chain(False, True, 1, 1, q_attrs={"output_dtype": INT4})
    model = _model(nodes, inits, shape, 21)

    def reference(x):
        d1 = dequantize(quantize(x, s1, None, "int4", 1), s1, None, 1)
        return dequantize(quantize(np.maximum(d1, 0), s2, z2, "uint4", 1), s2, z2, 1)
    return model, shape, reference


def _float16_model(rng, per_axis: bool):
    shape = (4, 6, 3)
    s1 = rng.uniform(0.02, 0.05, 6 if per_axis else 1).astype(np.float16)
    s2 = rng.uniform(0.01, 0.03, 6 if per_axis else 1).astype(np.float16)
    if not per_axis:
        s1, s2 = s1.reshape(()), s2.reshape(())
    z1 = np.full(s1.shape, -3, np.int8)
    z2 = np.full(s2.shape, 9, np.uint8)
    inits = [_init("s1", s1), _init("z1", z1), _init("s2", s2), _init("z2", z2)]
    model = _model(_qdq_chain(True, True), inits, shape, 19, TensorProto.FLOAT16, TensorProto.FLOAT16)

    def reference(x):
        d1 = dequantize(quantize(x, s1, z1, "int8"), s1, z1, out=np.float16)
        return dequantize(quantize(np.maximum(d1, 0), s2, z2, "uint8"), s2, z2, out=np.float16)
    return model, shape, reference


def _dynamic_model(rng, per_axis: bool):
    del rng, per_axis
    shape = (3, 17)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    model = _model(nodes, [], shape, 13)

    def reference(x):
        q, s, z = dynamic_quantize(x)
        return dequantize(q, s, z)
    return model, shape, reference


MODELS = {"int8": _int8_model, "float8": _float8_model, "int4": _int4_model, "float16": _float16_model,
          "dynamic": _dynamic_model}


def _inputs(rng, shape, name):
    x = (rng.standard_normal(shape) * (100.0 if name == "float8" else 1.5))
    if name != "dynamic":  # saturation (float8: past e4m3fn's largest value, then e5m2's Inf without saturation)
        x.flat[0] = 6e4
    return x.astype(np.float16 if name == "float16" else np.float32)


def _run(model, x, device, fallback="cpu"):
    session = xrt.InferenceSession(model, device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback=fallback))
    (out,) = session.run(None, {"x": x})
    out = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out)
    return out, session.explain().nodes


@pytest.mark.parametrize("per_axis", [False, True], ids=["per_tensor", "per_axis"])
@pytest.mark.parametrize("name", list(MODELS))
def test_qdq_model_runs_on_the_registry_ops_on_cpu(name, per_axis):
    rng = np.random.default_rng(11)
    model, shape, reference = MODELS[name](rng, per_axis)
    x = _inputs(rng, shape, name)
    y, nodes = _run(model, x, "cpu")
    quantize_nodes = [n for n in nodes if n["op_type"] in ("QuantizeLinear", "DequantizeLinear",
                                                          "DynamicQuantizeLinear")]
    assert quantize_nodes
    for node in quantize_nodes:
        assert node["op"] in QUANTIZE_OPS and node["kernel"] == "cpu", node
    np.testing.assert_array_equal(y, reference(x))
    assert len(np.unique(y)) > 4  # not all saturated
    if name == "float8":
        assert np.isinf(y).any()  # e5m2 without saturation


@requires_gpu
@pytest.mark.parametrize("per_axis", [False, True], ids=["per_tensor", "per_axis"])
@pytest.mark.parametrize("name", list(MODELS))
def test_qdq_model_runs_every_node_on_the_gpu(name, per_axis):
    rng = np.random.default_rng(11)
    model, shape, reference = MODELS[name](rng, per_axis)
    x = _inputs(rng, shape, name)
    y, nodes = _run(model, x, "cuda:0", fallback="error")
    for node in nodes:
        if node["op"] in QUANTIZE_OPS:
            assert node["kernel"] == "cuda_raw", node
    np.testing.assert_array_equal(y, reference(x))
    np.testing.assert_array_equal(y, _run(model, x, "cpu")[0])


def test_blocked_scales_stay_on_the_node_kernel():
    x_shape = (4, 8)
    scale = np.full((4, 2), 0.05, np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"], axis=1, block_size=4),
             helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=4)]
    model = _model(nodes, [_init("s", scale)], x_shape, 21)
    x = np.random.default_rng(2).standard_normal(x_shape).astype(np.float32)
    y, explained = _run(model, x, "cpu")
    blocked = [n for n in explained if n["op_type"] in ("QuantizeLinear", "DequantizeLinear")]
    assert blocked and all(n["kernel"] == "onnx_ref" and "block_size" in n["reason"] for n in blocked), blocked
    expected = dequantize(quantize(x, np.float32(0.05), None, "uint8"), np.float32(0.05), None)
    np.testing.assert_array_equal(y, expected)
