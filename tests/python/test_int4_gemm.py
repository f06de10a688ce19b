"""The int4 weight-only GEMM matmul_nbits and the int4_weight_fusion pass (issue 41; Note [Int4 weight-only GEMM] in
src/cpp/core/op_schemas_int4.cpp, Note [Int4 weight fusion] in src/cpp/engines/native/passes/fusion_int4.cpp).

On the CPU: ONNX Runtime's MatMulNBits models run through matmul_nbits and give the bits of the MatMulNBits node kernel
(the run with disabled_passes=["int4_weight_fusion"]) at block sizes 16, 32 and 128, K a multiple of the block or not,
M = 1, 3 and 17, float32 and float16 x, with and without zero points; xrt.quantize(precision="int4-weights") of a small
MLP runs its three GEMMs on matmul_nbits (explain() says so) and agrees with the DequantizeLinear-folded run.
On a GPU (skipped without one): the cuda_raw kernel against the cpu kernel on random problems of both its plans, and
the same models on cuda.
"""

from __future__ import annotations

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

PASS = "int4_weight_fusion"
ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """[..., 2 j] | [..., 2 j + 1] << 4: MatMulNBits' packing of 4-bit codes along the last axis (even length)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def random_matmul_nbits(rng, k: int, n: int, block: int, zero_points: bool, dtype=np.float32):
    """Random MatMulNBits operands: B [N, n_blocks, block / 2], scales [N * n_blocks], packed zero points or None,
    and the dequantized weight [K, N] (float64) they stand for."""
    blocks = -(-k // block)
    codes = rng.integers(0, 16, size=(n, blocks, block)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(n, blocks)).astype(dtype)
    zp = rng.integers(0, 16, size=(n, blocks)).astype(np.uint8) if zero_points else np.full((n, blocks), 8, np.uint8)
    w = (codes.astype(np.float64) - zp[..., None]) * scales.astype(np.float64)[..., None]
    zp_padded = np.zeros((n, -(-blocks // 2) * 2), np.uint8)
    zp_padded[:, :blocks] = zp
    return (pack_codes(codes), scales.reshape(-1), pack_codes(zp_padded).reshape(-1) if zero_points else None,
            w.reshape(n, -1)[:, :k].T)


def matmul_nbits_model(k, n, block, zero_points, bias, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    b, scales, zp, w = random_matmul_nbits(rng, k, n, block, zero_points, dtype)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["x", "B", "scales", "", "", ""]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
        inputs[3] = "zp"
    b_values = rng.uniform(-1, 1, n).astype(dtype) if bias else np.zeros(n, dtype)
    if bias:
        inits.append(numpy_helper.from_array(b_values, "bias"))
        inputs[5] = "bias"
    node = helper.make_node("MatMulNBits", inputs, ["y"], name="mm", domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=block)
    onnx_type = ONNX_TYPES[dtype]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx_type, ["M", k])],
                              [helper.make_tensor_value_info("y", onnx_type, None)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    return model.SerializeToString(), w, b_values.astype(np.float64)


def sessions(model: bytes, device: str = "cpu", **kw):
    fused = xrt.InferenceSession(model, engine="native", device=device, **kw)
    plain = xrt.InferenceSession(model, engine="native", device=device, disabled_passes=[PASS], **kw)
    return fused, plain


def int4_nodes(session):
    return [n for n in session.explain().nodes if n["op"] == "matmul_nbits"]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block, k", [(16, 64), (16, 40), (32, 96), (32, 100), (128, 256), (128, 300)])
@pytest.mark.parametrize("zero_points", [False, True])
def test_matmul_nbits_runs_on_the_op_with_the_node_kernels_bits(dtype, block, k, zero_points):
    model, w, bias = matmul_nbits_model(k, 7, block, zero_points, bias=block != 32, dtype=dtype, seed=k + block)
    fused, plain = sessions(model)
    (node,) = int4_nodes(fused)
    assert node["kernel"] == "cpu" and f"blocks of {block}" in node["reason"], node
    assert ("zero points packed" in node["reason"]) == zero_points, node["reason"]
    assert not int4_nodes(plain)
    assert [n["kernel"] for n in plain.explain().nodes] == ["onnx_ref"]
    rng = np.random.default_rng(1)
    for m in (1, 3, 17):
        x = rng.uniform(-1, 1, (m, k)).astype(dtype)
        got, want = fused.run({"x": x})["y"], plain.run({"x": x})["y"]
        assert got.dtype == dtype and got.shape == (m, 7)
        np.testing.assert_array_equal(got, want)  # the node kernel's arithmetic, bit for bit
        tol = 2e-3 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got.astype(np.float64), x.astype(np.float64) @ w + bias, rtol=tol, atol=tol)


def mlp_model(seed: int = 3) -> onnx.ModelProto:
    """x [N, 96] -> Gemm(W [96, 80], b) -> Relu -> MatMul(W [80, 64]) + b -> Relu -> Gemm(W^T [10, 64], transB=1)."""
    rng = np.random.default_rng(seed)
    inits = {"w1": (rng.standard_normal((96, 80)) / 10).astype(np.float32),
             "b1": rng.standard_normal(80).astype(np.float32),
             "w2": (rng.standard_normal((80, 64)) / 9).astype(np.float32),
             "b2": rng.standard_normal(64).astype(np.float32),
             "w3t": (rng.standard_normal((10, 64)) / 8).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1"),
             helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
             helper.make_node("MatMul", ["a1", "w2"], ["m2"], name="fc2"),
             helper.make_node("Add", ["m2", "b2"], ["h2"], name="bias2"),
             helper.make_node("Relu", ["h2"], ["a2"], name="relu2"),
             helper.make_node("Gemm", ["a2", "w3t"], ["y"], name="fc3", transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_xrt_quantize_int4_mlp_runs_on_matmul_nbits(block_size):
    result = xrt.quantize(mlp_model(), precision="int4-weights", block_size=block_size)
    fused, plain = sessions(result.to_bytes())
    nodes = int4_nodes(fused)
    assert sorted(n["node"] for n in nodes) == ["fc1", "fc2", "fc3"], [(n["node"], n["op"]) for n in
                                                                       fused.explain().nodes]
    for n in nodes:
        assert n["kernel"] == "cpu" and f"blocks of {block_size}" in n["reason"], n
    explained = fused.explain()
    assert not any(n["op_type"] == "DequantizeLinear" for n in explained.nodes)
    assert not int4_nodes(plain)
    x = np.random.default_rng(4).uniform(0, 1, (33, 96)).astype(np.float32)
    got, want = fused.run({"x": x})["y"], plain.run({"x": x})["y"]
    # The same real weights ((q - z) * scale in float32); only the order of the sums differs.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_int4_weights_in_a_float16_plan():
    """precision=fp16 converts the model (its scales among its constants) to float16 before the passes: the GEMMs take
    matmul_nbits with float16 x and scales and agree with the float32 plan to float16's precision."""
    result = xrt.quantize(mlp_model(), precision="int4-weights")
    half = xrt.InferenceSession(result.to_bytes(), engine="native", device="cpu",
                                exec_policy=xrt.ExecutionPolicy(precision="fp16"))
    nodes = int4_nodes(half)
    assert len(nodes) == 3 and all("float16 scales" in n["reason"] for n in nodes), nodes
    fused, _ = sessions(result.to_bytes())
    x = np.random.default_rng(5).uniform(0, 1, (9, 96)).astype(np.float32)
    got, want = half.run({"x": x})["y"], fused.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))


def test_matmul_nbits_op_errors_name_the_argument():
    x = np.zeros((2, 40), np.float32)
    w = np.zeros((6, 3, 8), np.uint8)
    scales = np.ones((6, 3), np.float32)
    with pytest.raises(xrt.InvalidArgumentError, match=r"must be \[N, 2, 16\]"):
        xrt.ops.call("matmul_nbits", [x, w, scales], {"block_size": 32})
    with pytest.raises(xrt.InvalidTypeError, match="'weight' must be uint8"):
        xrt.ops.call("matmul_nbits", [x, w.astype(np.int8), scales], {"block_size": 16})
    (y,) = xrt.ops.call("matmul_nbits", [x, w, scales], {"block_size": 16})
    assert y.numpy().shape == (2, 6)


# ---- GPU ----

def _cpu_and_cuda(inputs, attrs, dtype):
    host = [None if a is None else xrt.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    device = [None if t is None else t.to("cuda:0") for t in host]
    if dtype != "float32":
        host[0] = xrt.ops.cast(host[0], dtype)
        device[0] = xrt.ops.cast(device[0], dtype)
    (want,) = xrt.ops.call("matmul_nbits", host, attrs)
    (got,), decision = xrt.ops.call("matmul_nbits", device, attrs, policy={"matmul_nbits": "pin:cuda_raw"},
                                    return_decision=True)
    f32 = [xrt.ops.cast(t, "float32").to("cpu").numpy() for t in (got, want)]
    return f32[0], f32[1], decision


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("m, k, n, block, zero_points", [
    (1, 4096, 512, 32, False), (1, 4096, 4096, 128, True), (3, 1000, 77, 16, True), (16, 2048, 300, 64, False),
    (17, 300, 129, 32, True), (64, 512, 96, 128, True), (65, 512, 200, 32, False), (300, 1024, 256, 128, True),
    (5, 40, 17, 16, False), (2, 4128, 257, 32, True), (4, 640, 1000, 64, True), (3, 4096, 129, 256, False),
    (1, 11008, 300, 32, True)])
def test_cuda_kernel_matches_the_cpu_kernel(dtype, m, k, n, block, zero_points):
    rng = np.random.default_rng(m * 7 + k + n)
    b, scales, zp, w = random_matmul_nbits(rng, k, n, block, zero_points)
    blocks = -(-k // block)
    x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    got, want, decision = _cpu_and_cuda([x, b, scales.reshape(n, blocks), zp, bias], {"block_size": block}, dtype)
    assert decision.kernel == "cuda_raw"
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w) + np.abs(bias)
    rel = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 3e-5}[dtype]
    assert np.all(np.abs(got - want) <= rel * magnitude + 1e-5), float(np.max(np.abs(got - want) / magnitude))


@requires_gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_models_on_cuda_run_matmul_nbits(precision):
    result = xrt.quantize(mlp_model(), precision="int4-weights")
    policy = xrt.ExecutionPolicy(precision=precision)
    gpu = xrt.InferenceSession(result.to_bytes(), engine="native", device="cuda", exec_policy=policy)
    nodes = int4_nodes(gpu)
    assert len(nodes) == 3 and all(n["kernel"] == "cuda_raw" for n in nodes), nodes
    cpu, _ = sessions(result.to_bytes())
    for m in (1, 16, 100):
        x = np.random.default_rng(m).uniform(0, 1, (m, 96)).astype(np.float32)
        got, want = gpu.run({"x": x})["y"], cpu.run({"x": x})["y"]
        tol = 1e-4 if precision == "fp32" else 2e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))
    model, _, _ = matmul_nbits_model(4096, 256, 128, True, True, dtype=np.float16, seed=9)
    gpu = xrt.InferenceSession(model, engine="native", device="cuda")
    assert [n["kernel"] for n in int4_nodes(gpu)] == ["cuda_raw"]
    cpu, _ = sessions(model)
    x = np.random.default_rng(10).uniform(-1, 1, (4, 4096)).astype(np.float16)
    # float16 outputs may come back as xpuruntime Tensors (numpy's float16 is not always taken): compare as float32.
    got, want = (np.asarray(v.numpy() if hasattr(v, "numpy") else v, dtype=np.float32)
                 for v in (gpu.run({"x": x})["y"], cpu.run({"x": x})["y"]))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))
