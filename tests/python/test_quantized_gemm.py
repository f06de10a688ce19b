"""qlinear's run-time zero point and its GPU kernels (docs/quantization.md, "The GPU kernels of qlinear"; Note
[Quantized registry ops] in core/op_schemas.cpp, Note [cuBLASLt int8 GEMMs] in backends/cublaslt/cublaslt_qlinear.cpp,
Note [The dp4a kernel of qlinear] in backends/cuda_raw/quant_gemm.cu).

On the CPU: qlinear's fifth input x_zero_point (one element of x's dtype) against numpy and against the same zero
point given as the attribute; the schema's refusals; ONNX Runtime's dynamic quantization (DynamicQuantizeLinear ->
MatMulInteger -> Cast -> Mul) run fused by the quantized_fusion pass (explain() names qlinear at int8) and equal to the
unfused run bit for bit. On a GPU: both kernels ("cublasLt", "dp4a", pinned) equal the cpu kernel bit for bit, and the
dynamic model on cuda:0 runs its MatMulInteger as qlinear on one of them with the exact int32 sums.
"""

from __future__ import annotations

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

PASS = "quantized_fusion"


def _random_q(rng, shape, dtype):
    low, high = (-128, 127) if dtype == np.int8 else (0, 255)
    return rng.integers(low, high + 1, size=shape).astype(dtype)


@pytest.mark.parametrize("x_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("output_dtype", ["int32", "float32", "int8"])
def test_run_time_zero_point_on_the_cpu(x_dtype, layout, output_dtype):
    rng = np.random.default_rng(11)
    x = _random_q(rng, (2, 3, 13), x_dtype)
    w = rng.integers(-127, 128, size=(13, 5)).astype(np.int8)
    zp = np.array(-7 if x_dtype == np.int8 else 201, x_dtype)
    weight = w if layout == "kn" else np.ascontiguousarray(w.T)
    attrs = {"weight_layout": layout, "output_dtype": output_dtype}
    w_scale = None
    if output_dtype != "int32":
        attrs["x_scale"] = 0.02
        w_scale = rng.uniform(0.001, 0.01, size=5).astype(np.float32)
    if output_dtype == "int8":
        attrs.update(y_scale=0.3, y_zero_point=4)
    (y,) = xrt.ops.call("qlinear", [x, weight, w_scale, None, zp], attrs)
    (y_attr,) = xrt.ops.call("qlinear", [x, weight, w_scale, None, None], {**attrs, "x_zero_point": int(zp)})
    got = np.asarray(y.numpy())
    np.testing.assert_array_equal(got, np.asarray(y_attr.numpy()))
    if output_dtype == "int32":
        expected = (x.astype(np.int64) - int(zp)) @ w.astype(np.int64)
        np.testing.assert_array_equal(got, expected.astype(np.int32))


def test_run_time_zero_point_refusals():
    x = np.zeros((2, 4), np.uint8)
    w = np.zeros((4, 3), np.int8)
    attrs = {"output_dtype": "int32"}
    with pytest.raises(xrt.InvalidTypeError, match="x's dtype"):
        xrt.ops.call("qlinear", [x, w, None, None, np.array(1, np.int8)], attrs)
    with pytest.raises(xrt.InvalidArgumentError, match="one element"):
        xrt.ops.call("qlinear", [x, w, None, None, np.array([1, 2], np.uint8)], attrs)
    with pytest.raises(xrt.InvalidArgumentError, match="both as an input"):
        xrt.ops.call("qlinear", [x, w, None, None, np.array(1, np.uint8)], {**attrs, "x_zero_point": 3})


def _dynamic_model(k=48, n=40, batch=("batch", 7)):
    """ONNX Runtime's quantize_dynamic form of y = x @ W: DynamicQuantizeLinear -> MatMulInteger(x_q, W_q, x_zp)
    -> Cast -> Mul(x_scale * w_scale); the accumulator is also an output."""
    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    inits = {"w": w, "w_scale": np.float32(0.013), "w_zp": np.array(0, np.int8)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"], name="dql"),
             helper.make_node("MatMulInteger", ["xq", "w", "xzp", "w_zp"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["xs", "w_scale"], ["s"], name="scale"),
             helper.make_node("Mul", ["accf", "s"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*batch, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*batch, n]),
                               helper.make_tensor_value_info("acc", TensorProto.INT32, [*batch, n])],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model.SerializeToString(), w


def _reference_acc(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """ONNX's DynamicQuantizeLinear then the exact integer product."""
    low, high = np.minimum(np.float32(0), x.min()), np.maximum(np.float32(0), x.max())
    scale = (high - low) / np.float32(255)
    zp = np.clip(np.rint((np.float32(0) - low) / scale), 0, 255)
    xq = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.int64)
    return ((xq - int(zp)) @ w.astype(np.int64)).astype(np.int32)


def test_dynamic_quantization_runs_fused_on_the_cpu():
    model, w = _dynamic_model()
    fused = xrt.InferenceSession(model, engine="native", device="cpu")
    plain = xrt.InferenceSession(model, engine="native", device="cpu", disabled_passes=[PASS])
    nodes = {n["node"]: n for n in fused.explain().nodes}
    assert nodes["mmi"]["op"] == "qlinear" and nodes["mmi"]["precision"] == "int8", nodes["mmi"]
    assert {n["node"]: n["kernel"] for n in plain.explain().nodes}["mmi"] == "onnx_ref"
    x = np.random.default_rng(6).uniform(-2, 3, size=(3, 7, 48)).astype(np.float32)
    got, want = fused.run({"x": x}), plain.run({"x": x})
    np.testing.assert_array_equal(got["acc"], want["acc"])
    np.testing.assert_array_equal(got["y"], want["y"])
    np.testing.assert_array_equal(got["acc"], _reference_acc(x, w))


def test_chained_dynamic_layers_fuse_every_matmul_integer():
    """Two dynamically quantized layers (ONNX Runtime's quantize_dynamic of an MLP): the second MatMulInteger's input
    comes after the first's, so its shapes must be known while the plan is built (shape inference's MatMulInteger
    formula; the zero point, a run-time scalar, kept the stand-ins from running it), or it stays on the node kernel
    and everything after it is known only at run time (refused on CUDA)."""
    rng = np.random.default_rng(8)
    w1 = rng.integers(-127, 128, size=(48, 40)).astype(np.int8)
    w2 = rng.integers(-127, 128, size=(40, 24)).astype(np.int8)
    inits = {"w1": w1, "w2": w2, "ws": np.float32(0.013), "wzp": np.array(0, np.int8)}

    def layer(i, src):
        return [helper.make_node("DynamicQuantizeLinear", [src], [f"q{i}", f"s{i}", f"z{i}"], name=f"dql{i}"),
                helper.make_node("MatMulInteger", [f"q{i}", f"w{i}", f"z{i}", "wzp"], [f"acc{i}"], name=f"mmi{i}"),
                helper.make_node("Cast", [f"acc{i}"], [f"f{i}"], to=TensorProto.FLOAT),
                helper.make_node("Mul", [f"s{i}", "ws"], [f"k{i}"]),
                helper.make_node("Mul", [f"f{i}", f"k{i}"], [f"m{i}"])]

    nodes = layer(1, "x") + [helper.make_node("Relu", ["m1"], ["h"])] + layer(2, "h")
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 48])],
                              [helper.make_tensor_value_info("m2", TensorProto.FLOAT, ["batch", 24])],
                              [numpy_helper.from_array(np.asarray(v), name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    fused = xrt.InferenceSession(model.SerializeToString(), engine="native", device="cpu")
    ops = {n["node"]: n["op"] for n in fused.explain().nodes}
    assert ops["mmi1"] == "qlinear" and ops["mmi2"] == "qlinear", ops
    plain = xrt.InferenceSession(model.SerializeToString(), engine="native", device="cpu", disabled_passes=[PASS])
    x = rng.uniform(-2, 3, size=(5, 48)).astype(np.float32)
    np.testing.assert_array_equal(fused.run({"x": x})["m2"], plain.run({"x": x})["m2"])


# ---------------------------------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------------------------------


def _gpu_case(rng, m, k, n, x_dtype, output_dtype, bias, per_channel, zero_point, dynamic):
    x = _random_q(rng, (m, k), x_dtype)
    w = rng.integers(-127, 128, size=(n, k)).astype(np.int8)
    attrs = {"weight_layout": "nk", "output_dtype": output_dtype}
    w_scale = b = None
    if output_dtype != "int32":
        attrs.update(x_scale=0.05, activation="relu" if bias == "float32" else "none")
        w_scale = rng.uniform(0.001, 0.02, size=n if per_channel else 1).astype(np.float32)
    if output_dtype in ("int8", "uint8"):
        attrs.update(y_scale=0.05 * 0.01 * 64 * 64 * np.sqrt(k) / 60, y_zero_point=3 if output_dtype == "int8" else 99)
    if bias == "int32":
        b = rng.integers(-50000, 50000, size=n).astype(np.int32)
    elif bias == "float32" and output_dtype != "int32":
        b = rng.uniform(-5, 5, size=n).astype(np.float32)
    zp = None
    if dynamic:
        zp = np.array(zero_point, x_dtype)
    else:
        attrs["x_zero_point"] = zero_point
    return [x, w, w_scale, b, zp], attrs


@requires_gpu
@pytest.mark.parametrize("kernel", ["cublasLt", "dp4a", "int8_mma", "int8_wgmma"])
@pytest.mark.parametrize("m, k, n", [(1, 4, 4), (3, 12, 8), (17, 768, 1024), (128, 64, 100), (5, 30, 7)])
@pytest.mark.parametrize("x_dtype, zero_point, dynamic", [(np.int8, 0, False), (np.int8, -9, True),
                                                          (np.uint8, 128, False), (np.uint8, 37, True)])
@pytest.mark.parametrize("output_dtype, bias, per_channel", [("int8", "int32", True), ("uint8", "float32", False),
                                                             ("float32", None, True), ("float16", "float32", True),
                                                             ("int32", "int32", False)])
def test_gpu_kernels_equal_the_cpu_kernel(kernel, m, k, n, x_dtype, zero_point, dynamic, output_dtype, bias,
                                          per_channel):
    if kernel == "cublasLt" and (k % 4 or n % 4):
        pytest.skip("cuBLASLt's int8 GEMM needs K and N multiples of 4 (the dp4a kernel runs these)")
    if kernel in ("int8_mma", "int8_wgmma") and k % 16:
        pytest.skip("the tensor-core GEMMs need K a multiple of 16 (the dp4a kernel runs these)")
    if kernel == "int8_wgmma" and tuple(xrt.Device("cuda:0").compute_capability) != (9, 0):
        pytest.skip("int8_wgmma runs on compute capability 9.0 only (sm_90a)")
    rng = np.random.default_rng(m * 7 + k + n)
    inputs, attrs = _gpu_case(rng, m, k, n, x_dtype, output_dtype, bias, per_channel, zero_point, dynamic)
    (want,) = xrt.ops.call("qlinear", inputs, attrs)
    gpu = xrt.Device("cuda:0")
    device_inputs = [None if a is None else xrt.from_numpy(np.ascontiguousarray(a)).to(gpu) for a in inputs]
    (got,), decision = xrt.ops.call("qlinear", device_inputs, attrs, policy=xrt.KernelPolicy(qlinear=f"pin:{kernel}"),
                                    return_decision=True)
    assert decision.kernel == kernel
    got = np.asarray(got.to("cpu").numpy())
    want = np.asarray(want.numpy())
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=decision.plan_summary)


def _cuda_int8_ops() -> bool:
    """Whether this build has CUDA kernels of both int8 ops (the quantized_fusion pass runs on a device only then)."""
    return all(any(k.device_type == "cuda" and k.summary != "not in this build" for k in xrt.kernels(op))
               for op in ("qlinear", "qconv2d"))


@requires_gpu
def test_dynamic_quantization_runs_on_the_gpu():
    if not _cuda_int8_ops():
        pytest.skip("this build has no CUDA kernel of qconv2d, so quantized_fusion does not run on cuda:0")
    model, w = _dynamic_model()
    session = xrt.InferenceSession(model, engine="native", device="cuda:0")
    nodes = {n["node"]: n for n in session.explain().nodes}
    assert nodes["mmi"]["op"] == "qlinear" and nodes["mmi"]["kernel"] in ("int8_wgmma", "int8_mma", "cublasLt", "dp4a"), \
        nodes["mmi"]
    x = np.random.default_rng(8).uniform(-2, 3, size=(4, 7, 48)).astype(np.float32)
    got = session.run({"x": x})
    np.testing.assert_array_equal(got["acc"], _reference_acc(x, w))
    plain = xrt.InferenceSession(model, engine="native", device="cpu", disabled_passes=[PASS]).run({"x": x})
    np.testing.assert_allclose(got["y"], plain["y"], rtol=1e-6, atol=0)
