"""The int8 registry ops qlinear and qconv2d and the quantized_fusion pass (issue 41, item 2; Note [Quantized registry
ops] in core/op_schemas.cpp, Note [Quantized fusion] in engines/native/passes/fusion_quantized.cpp).

The cpu kernels against numpy references written here (exact integer accumulation, then the epilogue in float32 as
the note writes it), at odd shapes, per tensor and per channel; then quantized models (xrt.quantize's int8 MLP and
CNN on the digits, QLinearMatMul/QLinearConv/MatMulInteger/ConvInteger built with onnx.helper) on the native engine
on the CPU: explain() names the fused ops at int8, and the outputs agree with the unfused run
(disabled_passes=["quantized_fusion"]) within one quantization step on requantized outputs and closely on float ones.
"""

from __future__ import annotations

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytest.importorskip("sklearn.datasets", reason="needs scikit-learn (Debian: python3-sklearn)")
from test_quantization import _calibration, cnn, digits, mlp  # noqa: E402,F401,F811 (fixtures)

PASS = "quantized_fusion"


# ---------------------------------------------------------------------------------------------------------------
# The kernels against numpy
# ---------------------------------------------------------------------------------------------------------------


def _epilogue(acc: np.ndarray, channel_axis: int, x_scale: float, w_scale: np.ndarray, bias, attrs) -> np.ndarray:
    """acc (int64, exact here) -> the output of Note [Quantized registry ops]."""
    out = attrs.get("output_dtype", "float32")
    shape = [1] * acc.ndim
    shape[channel_axis] = -1
    if bias is not None and bias.dtype == np.int32:
        acc = acc + bias.astype(np.int64).reshape(shape)
    if out == "int32":
        return acc.astype(np.int32)
    alpha = (np.float64(np.float32(x_scale)) * w_scale.astype(np.float64)).astype(np.float32)
    real = acc.astype(np.float32) * np.broadcast_to(alpha, (acc.shape[channel_axis],)).reshape(shape)
    if bias is not None and bias.dtype == np.float32:
        real = (real + bias.reshape(shape)).astype(np.float32)
    if attrs.get("activation", "none") == "relu":
        real = np.maximum(real, np.float32(0))
    if out == "float32":
        return real
    if out == "float16":
        return real.astype(np.float16)
    low, high = (-128, 127) if out == "int8" else (0, 255)
    q = np.rint(real / np.float32(attrs["y_scale"])) + attrs.get("y_zero_point", 0)
    return np.clip(q, low, high).astype(np.int8 if out == "int8" else np.uint8)


def _random_q(rng, shape, dtype):
    low, high = (-128, 127) if dtype == np.int8 else (0, 255)
    return rng.integers(low, high + 1, size=shape).astype(dtype)


def _check(actual: np.ndarray, expected: np.ndarray):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype in (np.float32, np.float16):
        np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32), rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(actual, expected)


def _case_attrs(rng, x_dtype, output_dtype, activation):
    attrs = {"x_scale": 0.0173, "x_zero_point": int(rng.integers(-5, 6)) if x_dtype == np.int8 else 131,
             "activation": activation, "output_dtype": output_dtype}
    if output_dtype in ("int8", "uint8"):
        attrs.update(y_scale=0.37, y_zero_point=-3 if output_dtype == "int8" else 17)
    if output_dtype == "int32":
        del attrs["x_scale"]
        attrs["activation"] = "none"
    return attrs


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (2, 4, 33, 9), (64, 64, 10)])
@pytest.mark.parametrize("x_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("output_dtype, bias, activation, layout", [
    ("int8", "float32", "relu", "kn"), ("uint8", "int32", "none", "nk"), ("float32", None, "none", "kn"),
    ("float16", "float32", "relu", "nk"), ("int32", "int32", "none", "kn"), ("int8", None, "none", "nk")])
def test_qlinear_matches_numpy(shape, x_dtype, per_channel, output_dtype, bias, activation, layout):
    rng = np.random.default_rng(sum(shape) + per_channel)
    *lead, k, n = shape
    x = _random_q(rng, (*lead, k), x_dtype)
    w = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    attrs = _case_attrs(rng, x_dtype, output_dtype, activation)
    attrs["weight_layout"] = layout
    w_scale = (rng.uniform(0.001, 0.01, size=n if per_channel else 1)).astype(np.float32)
    b = None
    if bias == "float32":
        b = rng.uniform(-2, 2, size=n).astype(np.float32)
    elif bias == "int32":
        b = rng.integers(-5000, 5000, size=n).astype(np.int32)
    if output_dtype == "int32":
        w_scale = None
    weight = w if layout == "kn" else np.ascontiguousarray(w.T)
    (y,) = xrt.ops.call("qlinear", [x, weight, w_scale, b], attrs)
    acc = (x.astype(np.int64) - attrs["x_zero_point"]) @ w.astype(np.int64)
    expected = _epilogue(acc, acc.ndim - 1, attrs.get("x_scale", 1.0),
                         w_scale if w_scale is not None else np.ones(1, np.float32), b, attrs)
    _check(np.asarray(y.numpy()), expected)


def _conv_reference(x, w, strides, pads, dilations, groups, zero_point):
    """Exact int64 convolution of (x - zero_point) with w; padding holds the zero point (0 once centered)."""
    xc = x.astype(np.int64) - zero_point
    n, c, h, wd = xc.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), np.int64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = xc
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    og = o // groups
    for r in range(kh):
        for s in range(kw):
            patch = xp[:, :, r * dilations[0]:r * dilations[0] + strides[0] * (oh - 1) + 1:strides[0],
                       s * dilations[1]:s * dilations[1] + strides[1] * (ow - 1) + 1:strides[1]]
            for g in range(groups):
                out[:, g * og:(g + 1) * og] += np.einsum("ncij,oc->noij", patch[:, g * cg:(g + 1) * cg],
                                                         w[g * og:(g + 1) * og, :, r, s].astype(np.int64))
    return out


@pytest.mark.parametrize("geometry", [
    # x shape, weight shape, strides, pads, dilations, groups
    ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 3, 7, 5), (4, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 4, 9, 8), (6, 2, 3, 2), (2, 3), (1, 0, 2, 1), (1, 2), 2),
    ((2, 6, 6, 7), (6, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 6),  # depthwise
])
@pytest.mark.parametrize("x_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("output_dtype, bias, activation", [
    ("int8", "int32", "relu"), ("uint8", "float32", "none"), ("float32", "float32", "relu"), ("int32", None, "none")])
def test_qconv2d_matches_numpy(geometry, x_dtype, per_channel, output_dtype, bias, activation):
    x_shape, w_shape, strides, pads, dilations, groups = geometry
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape) + per_channel)
    x = _random_q(rng, x_shape, x_dtype)
    w = rng.integers(-127, 128, size=w_shape).astype(np.int8)
    o = w_shape[0]
    attrs = _case_attrs(rng, x_dtype, output_dtype, activation)
    attrs.update(strides=list(strides), pads=list(pads), dilations=list(dilations), groups=groups)
    w_scale = None if output_dtype == "int32" else rng.uniform(0.001, 0.01, size=o if per_channel else 1).astype(
        np.float32)
    b = None
    if bias == "float32":
        b = rng.uniform(-2, 2, size=o).astype(np.float32)
    elif bias == "int32":
        b = rng.integers(-5000, 5000, size=o).astype(np.int32)
    (y,) = xrt.ops.call("qconv2d", [x, w, w_scale, b], attrs)
    acc = _conv_reference(x, w, strides, pads, dilations, groups, attrs["x_zero_point"])
    expected = _epilogue(acc, 1, attrs.get("x_scale", 1.0), w_scale if w_scale is not None else np.ones(1, np.float32),
                         b, attrs)
    _check(np.asarray(y.numpy()), expected)


def test_schemas_refuse_what_the_ops_do_not_take():
    x = np.zeros((2, 3), np.int8)
    w = np.zeros((3, 4), np.int8)
    with pytest.raises(xrt.InvalidTypeError, match="weight.*int8"):
        xrt.ops.call("qlinear", [x, w.astype(np.uint8), None, None], {"x_scale": 1.0})
    with pytest.raises(xrt.InvalidArgumentError, match="w_scale must have shape"):
        xrt.ops.call("qlinear", [x, w, np.ones(3, np.float32), None], {"x_scale": 1.0})
    with pytest.raises(xrt.InvalidArgumentError, match="y_scale"):
        xrt.ops.call("qlinear", [x, w, None, None], {"x_scale": 1.0, "output_dtype": "int8"})
    with pytest.raises(xrt.InvalidArgumentError, match="x_zero_point"):
        xrt.ops.call("qlinear", [x, w, None, None], {"x_scale": 1.0, "x_zero_point": 200})


# ---------------------------------------------------------------------------------------------------------------
# Models on the native engine: fused against unfused
# ---------------------------------------------------------------------------------------------------------------


def _sessions(model_bytes: bytes):
    fused = xrt.InferenceSession(model_bytes, engine="native", device="cpu")
    plain = xrt.InferenceSession(model_bytes, engine="native", device="cpu", disabled_passes=[PASS])
    return fused, plain


def _fused_nodes(session):
    return [n for n in session.explain().nodes if n["op"] in ("qlinear", "qconv2d")]


@pytest.mark.parametrize("net, fused_ops", [("mlp", {"qlinear": 3}), ("cnn", {"qconv2d": 2, "qlinear": 1})])
def test_xrt_quantize_models_run_fused(request, digits, net, fused_ops):
    model = request.getfixturevalue(net)
    result = xrt.quantize(model, calibration=_calibration(digits), precision="int8", method="entropy")
    fused, plain = _sessions(result.to_bytes())
    nodes = _fused_nodes(fused)
    counts = {}
    for n in nodes:
        counts[n["op"]] = counts.get(n["op"], 0) + 1
        assert n["precision"] == "int8" and n["kernel"] == "cpu", n
        assert "int8 weights" in n["reason"], n["reason"]
    assert counts == fused_ops, [(n["node"], n["op"]) for n in fused.explain().nodes]
    assert not _fused_nodes(plain)
    dequantize = [sum(n["op_type"] == "DequantizeLinear" for n in s.explain().nodes) for s in (fused, plain)]
    assert dequantize[0] < dequantize[1], dequantize  # the activations' DQs went into the int8 ops
    xte = digits[2]
    got, want = fused.run({"x": xte})["logits"], plain.run({"x": xte})["logits"]
    # The logits are the last GEMM's float output: the int8 inputs of each layer may differ by one step where a
    # requantization falls on a tie, which moves a logit by a small fraction of its range.
    spread = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= 0.02 * spread, float(np.abs(got - want).max())
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.995
    yte = digits[3]
    assert abs(float((got.argmax(1) == yte).mean()) - float((want.argmax(1) == yte).mean())) <= 0.005 + 1e-9


@pytest.mark.parametrize("net, fused_ops", [("mlp", {"qlinear": 3}), ("cnn", {"qconv2d": 2, "qlinear": 1})])
def test_float16_plans_fuse_too(request, digits, net, fused_ops):
    """Note [Quantized fusion in float16 plans]: precision=fp16 converts the scales to float16 first; the chains fuse
    all the same, the float outputs in float16, and the predictions are the float32 plan's."""
    model = request.getfixturevalue(net)
    result = xrt.quantize(model, calibration=_calibration(digits), precision="int8", method="minmax")
    half = xrt.InferenceSession(result.to_bytes(), engine="native", device="cpu",
                                exec_policy=xrt.ExecutionPolicy(precision="fp16"))
    counts = {}
    for n in _fused_nodes(half):
        counts[n["op"]] = counts.get(n["op"], 0) + 1
        assert n["precision"] == "int8", n
    assert counts == fused_ops, [(n["node"], n["op"]) for n in half.explain().nodes]
    assert any("float16" in n["reason"] for n in _fused_nodes(half) if n["op"] == "qlinear")
    fused, _ = _sessions(result.to_bytes())
    xte = digits[2]
    got, want = half.run({"x": xte})["logits"], fused.run({"x": xte})["logits"]
    assert got.dtype == np.float32  # the model's output type, cast back at the plan's end
    spread = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= 0.03 * spread, float(np.abs(got - want).max())
    assert float((got.argmax(1) == want.argmax(1)).mean()) >= 0.99


def test_a_policy_rule_for_the_float_op_keeps_its_chains_float(cnn, digits):
    """Note [Float pinned by the KernelPolicy]: a rule for conv2d's family (and none for qconv2d) keeps the convolutions
    float, the GEMM still int8; a rule for qconv2d too puts them back on the int8 op."""
    result = xrt.quantize(cnn, calibration=_calibration(digits), precision="int8", method="minmax")
    model = result.to_bytes()
    kept = xrt.InferenceSession(model, engine="native", device="cpu", kernel_policy=xrt.KernelPolicy({"conv": "cpu"}))
    ops = [n["op"] for n in _fused_nodes(kept)]
    assert ops == ["qlinear"], ops
    # Float conv2d (each Conv with its Relu fused once the DequantizeLinear before it has a known type).
    assert sum(n["op"] == "conv2d" for n in kept.explain().nodes) == 2
    both = xrt.InferenceSession(model, engine="native", device="cpu",
                                kernel_policy=xrt.KernelPolicy({"conv": "cpu", "qconv2d": "cpu"}))
    assert sorted(n["op"] for n in _fused_nodes(both)) == ["qconv2d", "qconv2d", "qlinear"]
    _, plain = _sessions(model)
    xte = digits[2]
    np.testing.assert_allclose(kept.run({"x": xte})["logits"], plain.run({"x": xte})["logits"], rtol=0, atol=0.05)


def test_requantized_outputs_within_one_step_and_policy_off(mlp, digits):
    """A QDQ model whose output is the requantized int8 of a fused chain."""
    result = xrt.quantize(mlp, calibration=_calibration(digits), precision="int8", method="minmax")
    model = onnx.load_from_string(result.to_bytes())
    # The output of relu2's QuantizeLinear (the int8 input of fc3) becomes a graph output.
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and "a2" in n.input[0])
    model.graph.output.append(helper.make_tensor_value_info(q.output[0], TensorProto.INT8, None))
    fused, plain = _sessions(model.SerializeToString())
    assert any(n["op"] == "qlinear" and "output int8" in n["reason"] for n in fused.explain().nodes)
    xte = digits[2]
    got = fused.run({"x": xte})[q.output[0]].astype(np.int32)
    want = plain.run({"x": xte})[q.output[0]].astype(np.int32)
    assert int(np.abs(got - want).max()) <= 1
    assert float((got != want).mean()) < 0.01


def _qlinear_matmul_model(a_dtype, per_column: bool, opset=13):
    rng = np.random.default_rng(7)
    k, n = 37, 11
    tp = TensorProto.INT8 if a_dtype == np.int8 else TensorProto.UINT8
    b = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    inits = {"a_scale": np.float32(0.02), "a_zp": np.array(3 if a_dtype == np.int8 else 130, a_dtype),
             "b": b, "b_scale": rng.uniform(0.002, 0.01, size=n if per_column else ()).astype(np.float32),
             "b_zp": np.zeros(n if per_column else (), np.int8), "y_scale": np.float32(0.09),
             "y_zp": np.array(-4, np.int8), "mi_b": b}
    nodes = [helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"],
                              ["y"], name="qmm"),
             helper.make_node("MatMulInteger", ["a", "mi_b", "a_zp"], ["acc"], name="mmi")]
    graph = helper.make_graph(nodes, "qmm", [helper.make_tensor_value_info("a", tp, [5, k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, [5, n]),
                               helper.make_tensor_value_info("acc", TensorProto.INT32, [5, n])],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model, rng


def _qlinear_conv_model(x_dtype, per_channel: bool):
    rng = np.random.default_rng(8)
    tp = TensorProto.INT8 if x_dtype == np.int8 else TensorProto.UINT8
    w = rng.integers(-127, 128, size=(6, 2, 3, 3)).astype(np.int8)
    inits = {"x_scale": np.float32(0.03), "x_zp": np.array(-2 if x_dtype == np.int8 else 120, x_dtype), "w": w,
             "w_scale": rng.uniform(0.002, 0.01, size=6 if per_channel else ()).astype(np.float32),
             "w_zp": np.zeros(6 if per_channel else (), np.int8), "y_scale": np.float32(0.11),
             "y_zp": np.array(9, np.uint8), "bias": rng.integers(-3000, 3000, size=6).astype(np.int32), "ci_w": w}
    nodes = [helper.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp",
                                              "bias"], ["y"], name="qconv", group=2, strides=[2, 1],
                              pads=[1, 1, 0, 2]),
             helper.make_node("ConvInteger", ["x", "ci_w", "x_zp"], ["acc"], name="ci", group=2, pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", tp, [2, 4, 9, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 6, 4, 8]),
                               helper.make_tensor_value_info("acc", TensorProto.INT32, [2, 6, 9, 7])],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model, rng


@pytest.mark.parametrize("kind", ["matmul", "conv"])
@pytest.mark.parametrize("x_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_onnx_quantized_operators_lower_onto_the_int8_ops(kind, x_dtype, per_channel):
    if kind == "matmul":
        model, rng = _qlinear_matmul_model(x_dtype, per_channel)
        feeds = {"a": _random_q(rng, (5, 37), x_dtype)}
        ops = {"qmm": "qlinear", "mmi": "qlinear"}
    else:
        model, rng = _qlinear_conv_model(x_dtype, per_channel)
        feeds = {"x": _random_q(rng, (2, 4, 9, 7), x_dtype)}
        ops = {"qconv": "qconv2d", "ci": "qconv2d"}
    fused, plain = _sessions(model.SerializeToString())
    nodes = {n["node"]: n for n in fused.explain().nodes}
    for name, op in ops.items():
        assert nodes[name]["op"] == op and nodes[name]["precision"] == "int8", nodes[name]
    assert all(n["kernel"] == "onnx_ref" for n in plain.explain().nodes)
    got, want = fused.run(feeds), plain.run(feeds)
    np.testing.assert_array_equal(got["acc"], want["acc"])  # the int32 accumulator: exact
    diff = np.abs(got["y"].astype(np.int32) - want["y"].astype(np.int32))
    assert int(diff.max()) <= 1 and float((diff != 0).mean()) < 0.02


def test_near_misses_stay_on_the_node_kernels():
    """uint8 weights (MatMulInteger) and a per-row a_scale (QLinearMatMul) are not what the int8 ops take."""
    rng = np.random.default_rng(9)
    b = rng.integers(0, 256, size=(6, 4)).astype(np.uint8)
    inits = {"b": b, "a_scale": np.full(3, 0.02, np.float32), "a_zp": np.zeros(3, np.uint8), "qb": b.astype(np.int8),
             "b_scale": np.float32(0.01), "b_zp": np.array(0, np.int8), "y_scale": np.float32(0.1),
             "y_zp": np.array(0, np.uint8)}
    nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["acc"], name="mmi"),
             helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "qb", "b_scale", "b_zp", "y_scale", "y_zp"],
                              ["y"], name="qmm")]
    graph = helper.make_graph(nodes, "near", [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 6])],
                              [helper.make_tensor_value_info("acc", TensorProto.INT32, None),
                               helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    session = xrt.InferenceSession(model.SerializeToString(), engine="native", device="cpu")
    assert {n["node"]: n["kernel"] for n in session.explain().nodes} == {"mmi": "onnx_ref", "qmm": "onnx_ref"}
    a = rng.integers(0, 256, size=(3, 6)).astype(np.uint8)
    np.testing.assert_array_equal(session.run({"a": a})["acc"], a.astype(np.int32) @ b.astype(np.int32))


def test_float_models_are_untouched(mlp, digits):
    fused, plain = _sessions(mlp.SerializeToString())
    assert not _fused_nodes(fused)
    xte = digits[2]
    np.testing.assert_array_equal(fused.run({"x": xte})["logits"], plain.run({"x": xte})["logits"])
