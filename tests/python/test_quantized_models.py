"""Quantized models on the native engine's CPU path (issue 41, item 1): float8 and int4 tensors (Note [Float8 and
4-bit dtypes] in src/cpp/include/xpuruntime/low_bit.h), QuantizeLinear/DequantizeLinear of opsets 19 and 21, Cast, and ONNX
Runtime's com.microsoft MatMulNBits, QLinearAdd, QLinearMul and QGemm, and its QOperator format's QLinearSigmoid,
QLinearLeakyRelu, QLinearConcat, QLinearGlobalAveragePool, QLinearAveragePool and QLinearSoftmax.

Each model runs on the native engine and is compared with a numpy evaluation written here and, where this build
has it, with the onnxruntime engine on the same bytes: the models `xrt.quantize(..., precision="fp8")` and
`precision="int4-weights"` write, initializers in every storage form ONNX allows (raw_data and int32_data, odd
int4 counts), float8 graph outputs, and a MatMulNBits model laid out as ORT's MatMul4BitsQuantizer writes it.
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import has_onnxruntime_engine
from xpuruntime.quantization import _model

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import qdq_reference  # noqa: E402  (tests/python/qdq_reference.py)

HAS_ORT = has_onnxruntime_engine()
requires_ort = pytest.mark.skipif(not HAS_ORT, reason="this build has no ONNX Runtime engine")
FLOAT8E4M3FN, UINT4, INT4 = 17, 21, 22


def _model_proto(nodes, inits: Dict[str, np.ndarray], x_shape, opset: int, extra_inits=(), outputs=("y",),
                 ms_domain: bool = False):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()] + list(extra_inits))
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms_domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = {21: 10, 19: 9}.get(opset, 8)
    return model


def _run(model, feeds, engine: str = "native"):
    session = xrt.InferenceSession(model.SerializeToString(), device="cpu", engine=engine)
    return session.run(feeds)


def _mlp(rng):
    inits = {"w1": (rng.standard_normal((16, 32)) / 4).astype(np.float32),
             "b1": rng.standard_normal(32).astype(np.float32),
             "w2": (rng.standard_normal((32, 24)) / 6).astype(np.float32),
             "b2": rng.standard_normal(24).astype(np.float32),
             "w3t": (rng.standard_normal((10, 24)) / 5).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1"),
             helper.make_node("Relu", ["h1"], ["a1"], name="relu"),
             helper.make_node("MatMul", ["a1", "w2"], ["m2"], name="fc2"),
             helper.make_node("Add", ["m2", "b2"], ["h2"], name="bias2"),
             helper.make_node("Relu", ["h2"], ["a2"], name="relu2"),
             helper.make_node("Gemm", ["a2", "w3t"], ["y"], name="fc3", transB=1)]
    return _model_proto(nodes, inits, ["N", 16], 13)


# The numpy QDQ evaluator (the forms the quantizer writes: int8, float8e4m3fn, int4 blocks) is shared with
# test_quantization.py: tests/python/qdq_reference.py.
evaluate = qdq_reference.evaluate


# ---- the quantizer's models ------------------------------------------------------------------------------------


def test_fp8_model_runs_on_the_native_engine():
    rng = np.random.default_rng(0)
    model = _mlp(rng)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    result = xrt.quantize(model, [{"x": x[:16]}, {"x": x[16:]}], precision="fp8", method="minmax")
    assert any(t.data_type == FLOAT8E4M3FN for t in result.model.graph.initializer)
    got = xrt.InferenceSession(result.to_bytes(), device="cpu", engine="native").run({"x": x})["y"]
    expected = evaluate(result.model, {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # The float8 rounding is what ran: the float model's answer differs.
    assert not np.allclose(evaluate(model, {"x": x})["y"], expected, rtol=1e-4, atol=1e-4)
    per_channel = xrt.quantize(model, [{"x": x}], precision="fp8", per_channel=True)
    np.testing.assert_allclose(_run(per_channel.model, {"x": x})["y"], evaluate(per_channel.model, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    if HAS_ORT:
        np.testing.assert_allclose(_run(result.model, {"x": x}, "onnxruntime")["y"], got, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block_size", [32, 16])
def test_int4_weights_model_runs_on_the_native_engine(block_size):
    rng = np.random.default_rng(1)
    model = _mlp(rng)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    result = xrt.quantize(model, precision="int4-weights", block_size=block_size)
    assert any(t.data_type == INT4 for t in result.model.graph.initializer)
    got = _run(result.model, {"x": x})["y"]
    expected = evaluate(result.model, {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    if HAS_ORT:
        np.testing.assert_allclose(_run(result.model, {"x": x}, "onnxruntime")["y"], got, rtol=1e-4, atol=1e-4)


# ---- storage forms, outputs and tensors ------------------------------------------------------------------------


def _tensor(name: str, code: int, dims, raw: bytes = b"", int32=None):
    t = TensorProto()
    t.name, t.data_type = name, code
    t.dims.extend(dims)
    if int32 is not None:
        t.int32_data.extend(int(v) for v in int32)
    else:
        t.raw_data = raw
    return t


@pytest.mark.parametrize("form", ["raw", "int32_data"])
@pytest.mark.parametrize("count", [1, 5, 8])
def test_int4_and_float8_initializers_in_every_storage_form(form, count):
    rng = np.random.default_rng(count)
    q4 = rng.integers(-8, 8, size=count).astype(np.int8)
    packed = _model.pack_int4(q4)
    f8 = rng.integers(0, 256, size=count).astype(np.uint8)
    f8[f8 & 0x7F == 0x7F] = 0x38  # no NaN codes: the comparison below is of numbers
    u4 = rng.integers(0, 16, size=count).astype(np.uint8)
    u4_packed = _model.pack_int4(u4.astype(np.int8))
    if form == "raw":
        inits = [_tensor("q4", INT4, [count], packed), _tensor("f8", FLOAT8E4M3FN, [count], f8.tobytes()),
                 _tensor("u4", UINT4, [count], u4_packed)]
    else:
        inits = [_tensor("q4", INT4, [count], int32=np.frombuffer(packed, np.uint8)),
                 _tensor("f8", FLOAT8E4M3FN, [count], int32=f8),
                 _tensor("u4", UINT4, [count], int32=np.frombuffer(u4_packed, np.uint8))]
    inits += [_tensor("s", TensorProto.FLOAT, [], np.float32(0.5).tobytes())]
    nodes = [helper.make_node("DequantizeLinear", ["q4", "s"], ["d4"]),
             helper.make_node("DequantizeLinear", ["f8", "s"], ["d8"]),
             helper.make_node("DequantizeLinear", ["u4", "s"], ["du"]),
             helper.make_node("Add", ["d4", "x"], ["y4"]),
             helper.make_node("Add", ["d8", "x"], ["y8"]),
             helper.make_node("Add", ["du", "x"], ["yu"])]
    model = _model_proto(nodes, {}, [count], 21, inits, outputs=("y4", "y8", "yu"))
    x = np.zeros(count, np.float32)
    out = _run(model, {"x": x})
    np.testing.assert_array_equal(out["y4"], q4.astype(np.float32) * 0.5)
    np.testing.assert_array_equal(out["y8"], _model.e4m3_to_float(f8) * 0.5)
    np.testing.assert_array_equal(out["yu"], u4.astype(np.float32) * 0.5)
    if HAS_ORT:
        ort = _run(model, {"x": x}, "onnxruntime")
        for name in ("y4", "y8", "yu"):
            np.testing.assert_array_equal(ort[name], out[name])


def test_float8_and_int4_outputs_come_back_as_numbers():
    """Note [Float8 and int4 in numpy]: a float8 output is a float32 array of its values, an int4 one int8."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z8"], ["q8"]),
             helper.make_node("QuantizeLinear", ["x", "s", "z4"], ["q4"], block_size=0),
             helper.make_node("Cast", ["x"], ["c8"], to=FLOAT8E4M3FN, saturate=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("q8", FLOAT8E4M3FN, [6]), helper.make_tensor_value_info("q4", INT4, [6]),
         helper.make_tensor_value_info("c8", FLOAT8E4M3FN, [6])],
        [numpy_helper.from_array(np.float32(0.25), "s"), _tensor("z8", FLOAT8E4M3FN, [], b"\x00"),
         _tensor("z4", INT4, [], b"\x00")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    x = np.array([0.1, -0.3, 1.0, 200.0, -3.0, 0.0], np.float32)
    out = _run(model, {"x": x})
    assert out["q8"].dtype == np.float32 and out["q4"].dtype == np.int8
    np.testing.assert_array_equal(out["q8"], _model.e4m3_to_float(_model.float_to_e4m3(x / np.float32(0.25))))
    np.testing.assert_array_equal(out["q4"], np.clip(np.rint(x / np.float32(0.25)), -8, 7).astype(np.int8))
    np.testing.assert_array_equal(out["c8"], _model.e4m3_to_float(_model.float_to_e4m3(x)))  # all within 448
    # Tensors: bit patterns viewed as float8, int8 values viewed as int4 (range checked).
    bits = np.array([0x38, 0x7E, 0xC0, 0x7F], np.uint8)
    t = xrt.from_numpy(bits).view("float8e4m3fn")
    assert t.dtype == "float8e4m3fn"
    np.testing.assert_array_equal(t.numpy()[:3], [1.0, 448.0, -2.0])
    assert np.isnan(t.numpy()[3])
    np.testing.assert_array_equal(t.view("uint8").numpy(), bits)
    q = xrt.from_numpy(np.array([-8, 7, 0], np.int8)).view("int4")
    assert q.dtype == "int4" and q.numpy().tolist() == [-8, 7, 0]
    with pytest.raises(xrt.InvalidArgumentError, match=r"outside int4's range \[-8, 7\]"):
        xrt.from_numpy(np.array([3, 9], np.int8)).view("int4")


def test_other_kernels_refuse_float8_with_a_reason():
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["c8"], to=FLOAT8E4M3FN), helper.make_node("Relu", ["c8"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", FLOAT8E4M3FN, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    with pytest.raises((xrt.InvalidTypeError, xrt.InvalidArgumentError, xrt.UnsupportedOperationError)):
        _run(model, {"x": np.ones(3, np.float32)})


# ---- com.microsoft contrib ops ---------------------------------------------------------------------------------


def quantize_matmul_4bits(w: np.ndarray, block: int):
    """A [K, N] float weight as ORT's MatMul4BitsQuantizer lays it out (asymmetric uint4 blocks along K): B uint8
    [N, n_blocks, block / 2] low nibble first, scales [N * n_blocks], zero points packed [N * ceil(n_blocks / 2)],
    and the dequantized [K, N] weight the op multiplies by."""
    k, n = w.shape
    blocks = (k + block - 1) // block
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = w
    wb = padded.T.reshape(n, blocks, block)
    lo, hi = np.minimum(wb.min(-1), 0), np.maximum(wb.max(-1), 0)
    scale = ((hi - lo) / 15).astype(np.float32)
    scale[scale == 0] = 1
    zp = np.clip(np.rint(-lo / scale), 0, 15).astype(np.uint8)
    q = np.clip(np.rint(wb / scale[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    b = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    zp_padded = np.zeros((n, (blocks + 1) // 2 * 2), np.uint8)
    zp_padded[:, :blocks] = zp
    zp_packed = (zp_padded[:, 0::2] | (zp_padded[:, 1::2] << 4)).reshape(-1).astype(np.uint8)
    dequant = ((q.astype(np.float32) - zp[..., None]) * scale[..., None]).reshape(n, -1)[:, :k].T
    return b, scale.reshape(-1), zp_packed, dequant


@pytest.mark.parametrize("with_zero_points", [True, False])
def test_matmul_nbits_agrees_with_numpy_and_onnxruntime(with_zero_points):
    rng = np.random.default_rng(7)
    k, n, block = 48, 5, 16  # three blocks: the zero points' last byte is half empty
    w = rng.standard_normal((k, n)).astype(np.float32)
    b, scales, zp, dequant = quantize_matmul_4bits(w, block)
    bias = rng.standard_normal(n).astype(np.float32)
    if not with_zero_points:  # symmetric: the default zero point 8
        q = np.clip(np.rint(w.T.reshape(n, -1, block) / 0.25) + 8, 0, 15).astype(np.uint8)
        b = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
        scales = np.full(n * (k // block), 0.25, np.float32)
        dequant = ((q.astype(np.float32) - 8) * 0.25).reshape(n, k).T
    inits = {"B": b, "scales": scales, "bias": bias}
    inputs = ["x", "B", "scales", "zp" if with_zero_points else "", "", "bias"]
    if with_zero_points:
        inits["zp"] = zp
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block, accuracy_level=0)
    model = _model_proto([node], inits, [2, 3, k], 17, ms_domain=True)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    got = _run(model, {"x": x})["y"]
    assert got.shape == (2, 3, n)
    np.testing.assert_allclose(got, x @ dequant + bias, rtol=1e-5, atol=1e-5)
    if HAS_ORT:
        np.testing.assert_allclose(_run(model, {"x": x}, "onnxruntime")["y"], got, rtol=1e-4, atol=1e-4)


def _q(values: np.ndarray, scale: float, zp: int, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.rint(values / np.float32(scale)) + zp, info.min, info.max).astype(dtype)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_add_and_mul(op):
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (4, 6)).astype(np.uint8)
    b = rng.integers(0, 256, (6,)).astype(np.uint8)
    inits = {"a_s": np.float32(0.02), "a_z": np.uint8(120), "B": b, "b_s": np.float32(0.03), "b_z": np.uint8(130),
             "c_s": np.float32(0.05 if op == "QLinearAdd" else 0.01), "c_z": np.uint8(125), "s": np.float32(0.02),
             "z": np.uint8(120)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["qa"]),
             helper.make_node(op, ["qa", "a_s", "a_z", "B", "b_s", "b_z", "c_s", "c_z"], ["qc"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["qc", "c_s", "c_z"], ["y"])]
    model = _model_proto(nodes, inits, [4, 6], 13, ms_domain=True)
    x = ((a.astype(np.float32) - 120) * np.float32(0.02)).astype(np.float32)
    got = _run(model, {"x": x})["y"]
    fa = (a.astype(np.float32) - 120) * np.float32(0.02)
    fb = (b.astype(np.float32) - 130) * np.float32(0.03)
    c = _q(fa + fb if op == "QLinearAdd" else fa * fb, inits["c_s"], 125, np.uint8)
    np.testing.assert_array_equal(got, (c.astype(np.float32) - 125) * inits["c_s"])
    if HAS_ORT:  # ONNX Runtime rounds through its own float path: one step apart at most
        ort = _run(model, {"x": x}, "onnxruntime")["y"]
        assert np.abs(ort - got).max() <= inits["c_s"] * 1.001


def test_qgemm_agrees_with_numpy_and_onnxruntime():
    rng = np.random.default_rng(4)
    m, k, n = 3, 8, 5
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    bt = rng.integers(-128, 128, (n, k)).astype(np.int8)
    c = rng.integers(-1000, 1000, (n,)).astype(np.int32)
    b_s = rng.uniform(0.001, 0.01, n).astype(np.float32)
    inits = {"s": np.float32(0.05), "z": np.int8(0), "B": bt, "b_s": b_s, "b_z": np.zeros(n, np.int8), "C": c,
             "y_s": np.float32(0.2), "y_z": np.int8(-3)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["qa"]),
             helper.make_node("QGemm", ["qa", "s", "z", "B", "b_s", "b_z", "C", "y_s", "y_z"], ["qy"],
                              domain="com.microsoft", transB=1, alpha=1.0),
             helper.make_node("DequantizeLinear", ["qy", "y_s", "y_z"], ["y"])]
    model = _model_proto(nodes, inits, [m, k], 13, ms_domain=True)
    x = (a.astype(np.float32) * np.float32(0.05)).astype(np.float32)
    got = _run(model, {"x": x})["y"]
    acc = a.astype(np.int64) @ bt.T.astype(np.int64) + c
    real = acc.astype(np.float32) * (np.float32(0.05) * b_s)
    expected = (_q(real, 0.2, -3, np.int8).astype(np.float32) + 3) * np.float32(0.2)
    np.testing.assert_array_equal(got, expected)
    if HAS_ORT:
        ort = _run(model, {"x": x}, "onnxruntime")["y"]
        assert np.abs(ort - got).max() <= 0.2 * 1.001


# --- ONNX Runtime's QOperator contrib ops (Note [ONNX Runtime's QOperator contrib ops]) ------------------------------

def _qop_model(op: str, inputs, inits: Dict[str, np.ndarray], x_shape, **attrs):
    """x (float) -> QuantizeLinear(s, z) -> op(inputs) -> DequantizeLinear(y_s, y_z) -> y."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["qx"]),
             helper.make_node(op, inputs, ["qy"], domain="com.microsoft", **attrs),
             helper.make_node("DequantizeLinear", ["qy", "y_s", "y_z"], ["y"])]
    return _model_proto(nodes, inits, x_shape, 13, ms_domain=True)


def _dq(q: np.ndarray, scale, zp) -> np.ndarray:
    return (q.astype(np.float32) - np.float32(zp)) * np.float32(scale)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearSoftmax",
                                "QLinearConcat"])
def test_qoperator_contrib_ops_agree_with_numpy_and_onnxruntime(op, dtype):
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    zp, y_zp = (dtype(128), dtype(3)) if dtype == np.uint8 else (dtype(-5), dtype(2))
    shape = [2, 3, 5, 7]
    q = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    inits = {"s": np.float32(0.05), "z": zp, "y_s": np.float32(0.02 if op != "QLinearSoftmax" else 1 / 256),
             "y_z": y_zp if op != "QLinearSoftmax" else dtype(info.min)}
    real = _dq(q, 0.05, zp)
    inputs, attrs = ["qx", "s", "z", "y_s", "y_z"], {}
    if op == "QLinearSigmoid":
        want = 1 / (1 + np.exp(-real))
    elif op == "QLinearLeakyRelu":
        attrs = {"alpha": 0.1}
        want = np.where(real >= 0, real, np.float32(0.1) * real)
    elif op == "QLinearGlobalAveragePool":
        want = real.mean(axis=(2, 3), keepdims=True)
    elif op == "QLinearSoftmax":
        attrs = {"axis": 1, "opset": 13}
        e = np.exp(real - real.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    else:  # two operands: x itself and a constant of another scale, joined along axis 1
        other = rng.integers(info.min, info.max + 1, [2, 4, 5, 7]).astype(dtype)
        inits.update({"o": other, "o_s": np.float32(0.03), "o_z": y_zp})
        inputs, attrs = ["y_s", "y_z", "qx", "s", "z", "o", "o_s", "o_z"], {"axis": 1}
        want = np.concatenate([real, _dq(other, 0.03, y_zp)], axis=1)
    model = _qop_model(op, inputs, inits, shape, **attrs)
    got = _run(model, {"x": real})["y"]
    step = float(inits["y_s"])
    expect = _dq(_q(want.astype(np.float32), inits["y_s"], int(inits["y_z"]), dtype), inits["y_s"], inits["y_z"])
    assert got.shape == expect.shape
    assert np.abs(got - expect).max() <= step * 1.001  # numpy's float32 sums round apart by one step at most
    if HAS_ORT:
        ort = _run(model, {"x": real}, "onnxruntime")["y"]
        assert np.abs(ort - got).max() <= step * 1.001, np.abs(ort - got).max() / step
        if op not in ("QLinearSoftmax", "QLinearGlobalAveragePool"):  # the same float path: the same bytes
            np.testing.assert_array_equal(got, ort)


def test_qoperator_contrib_ops_refuse_bad_operands():
    inits = {"s": np.float32(0.05), "z": np.uint8(128), "y_s": np.float32(0.02), "y_z": np.uint8(3),
             "o": np.zeros([1, 4, 5], np.int8), "o_s": np.float32(0.03), "o_z": np.int8(0)}
    model = _qop_model("QLinearConcat", ["y_s", "y_z", "qx", "s", "z", "o", "o_s", "o_z"], inits, [1, 3, 5], axis=1)
    with pytest.raises(xrt.InvalidTypeError, match="operand 1 must be uint8, got int8"):
        _run(model, {"x": np.zeros([1, 3, 5], np.float32)})


def _average_pool_2d(x: np.ndarray, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), ceil_mode=0,
                     count_include_pad=0) -> np.ndarray:
    """ONNX AveragePool over [N, C, H, W] in float64: a ceil_mode window starting in the end padding is dropped, and
    count_include_pad counts the taps inside the padded input."""
    def output_size(size, k, s, pb, pe):
        if not ceil_mode:
            return (size + pb + pe - k) // s + 1
        n = -(-(size + pb + pe - k) // s) + 1
        return n - 1 if (n - 1) * s >= size + pb else n

    dims = zip(x.shape[2:], kernel_shape, strides, pads[:2], pads[2:])
    out = x.shape[:2] + tuple(output_size(*d) for d in dims)
    y = np.zeros(out, np.float64)
    for i in range(out[2]):
        for j in range(out[3]):
            h0, w0 = i * strides[0] - pads[0], j * strides[1] - pads[1]
            h1, w1 = h0 + kernel_shape[0], w0 + kernel_shape[1]
            window = x[:, :, max(h0, 0):min(h1, x.shape[2]), max(w0, 0):min(w1, x.shape[3])].astype(np.float64)
            count = window.shape[2] * window.shape[3]
            if count_include_pad:
                count = ((min(h1, x.shape[2] + pads[2]) - max(h0, -pads[0]))
                         * (min(w1, x.shape[3] + pads[3]) - max(w0, -pads[1])))
            y[:, :, i, j] = window.sum(axis=(2, 3)) / count
    return y


# (attributes, whether ONNX Runtime's QLinearAveragePool divides the last row and column by the whole kernel: with
# ceil_mode their windows run past the end padding; Note [ONNX Runtime's QOperator contrib ops]).
_AVERAGE_POOLS = {
    "strides_pads": ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, False),
    "strides_pads_include_pad": ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                  "count_include_pad": 1}, False),
    "asymmetric_pads_include_pad": ({"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0],
                                     "count_include_pad": 1}, False),
    "ceil_mode": ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, False),
    "ceil_mode_include_pad": ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 1},
                              True),
    "ceil_mode_drops_a_window_in_the_pads": ({"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                              "ceil_mode": 1, "count_include_pad": 1}, False),
    "channels_last": ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "channels_last": 1}, False),
    "whole_image": ({"kernel_shape": [7, 9]}, False),
}


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("case", list(_AVERAGE_POOLS))
def test_qlinear_average_pool_agrees_with_numpy_and_onnxruntime(case, dtype):
    attrs, ort_divides_by_kernel = _AVERAGE_POOLS[case]
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    zp, y_zp = (dtype(128), dtype(3)) if dtype == np.uint8 else (dtype(-5), dtype(2))
    planar = [2, 3, 7, 9]  # odd spatial sizes
    q = rng.integers(info.min, info.max + 1, planar).astype(dtype)
    channels_last = attrs.get("channels_last", 0) == 1
    to_layout = (lambda a: a.transpose(0, 2, 3, 1)) if channels_last else (lambda a: a)
    inits = {"s": np.float32(0.05), "z": zp, "y_s": np.float32(0.02), "y_z": y_zp}
    real = _dq(q, 0.05, zp)
    pool_attrs = {k: v for k, v in attrs.items() if k != "channels_last"}
    want = to_layout(_average_pool_2d(real, **pool_attrs)).astype(np.float32)
    model = _qop_model("QLinearAveragePool", ["qx", "s", "z", "y_s", "y_z"], inits, list(to_layout(real).shape),
                       **attrs)
    got = _run(model, {"x": np.ascontiguousarray(to_layout(real))})["y"]
    step = float(inits["y_s"])
    expect = _dq(_q(want, inits["y_s"], int(y_zp), dtype), inits["y_s"], y_zp)
    assert got.shape == expect.shape
    assert np.abs(got - expect).max() <= step * 1.001  # sums in double here, float64 in numpy: one step at most
    if HAS_ORT:
        ort = _run(model, {"x": np.ascontiguousarray(to_layout(real))}, "onnxruntime")["y"]
        assert ort.shape == got.shape
        if ort_divides_by_kernel:  # compare the windows inside the padded input
            ort, got = ort[:, :, :-1, :-1], got[:, :, :-1, :-1]
        assert np.abs(ort - got).max() <= step * 1.001, np.abs(ort - got).max() / step  # ORT sums in float32


@pytest.mark.parametrize("attrs,shape,error,message", [
    ({}, [1, 3, 5, 5], xrt.InvalidArgumentError, "kernel_shape attribute is required"),
    ({"kernel_shape": [2]}, [1, 3, 5, 5], xrt.InvalidArgumentError, r"kernel_shape \[2\] must have 2 values"),
    ({"kernel_shape": [2, 2], "dilations": [2, 2]}, [1, 3, 5, 5], xrt.InvalidArgumentError, "no 'dilations'"),
    ({"kernel_shape": [2]}, [3, 5], xrt.InvalidArgumentError, r"must be \[N, C, spatial...\]"),
])
def test_qlinear_average_pool_refuses_malformed_nodes(attrs, shape, error, message):
    inits = {"s": np.float32(0.05), "z": np.uint8(128), "y_s": np.float32(0.02), "y_z": np.uint8(3)}
    model = _qop_model("QLinearAveragePool", ["qx", "s", "z", "y_s", "y_z"], inits, shape, **attrs)
    with pytest.raises(error, match=message):
        _run(model, {"x": np.zeros(shape, np.float32)})


def test_qlinear_average_pool_refuses_a_float_input():
    inits = {"s": np.float32(0.05), "z": np.uint8(128), "y_s": np.float32(0.02), "y_z": np.uint8(3)}
    nodes = [helper.make_node("QLinearAveragePool", ["x", "s", "z", "y_s", "y_z"], ["y"], domain="com.microsoft",
                              kernel_shape=[2, 2])]
    model = _model_proto(nodes, inits, [1, 3, 5, 5], 13, ms_domain=True)
    with pytest.raises(xrt.InvalidTypeError, match="input 'X' must be int8 or uint8, got float32"):
        _run(model, {"x": np.zeros([1, 3, 5, 5], np.float32)})
