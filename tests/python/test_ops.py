"""The functional ops from Python: dispatch through policies, decisions, zero-copy inputs, errors."""

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu


def test_kernels_and_schemas_are_listed():
    kernels = xrt.kernels()
    assert {(k.op, k.name) for k in kernels} >= {("matmul", "cpu"), ("attention", "cpu")}
    names = {k.name for k in xrt.kernels("matmul")}
    assert {"cpu", "cublas", "cublasLt"} <= names
    assert {"cpu", "flash_v2", "unfused"} <= {k.name for k in xrt.kernels("attention")}
    assert xrt.kernels("matmul")[-1].name == "cpu"  # the reference comes last in priority order
    schemas = {s["name"]: s for s in xrt.op_schemas()}
    assert schemas["linear"]["family"] == "matmul"
    assert schemas["linear"]["inputs"] == ["x", "weight", "bias?", "residual?"]
    with pytest.raises(xrt.InvalidArgumentError, match="unknown op 'matmull'; valid ops: "):
        xrt.kernels("matmull")


def test_matmul_on_numpy_and_the_decision():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 7, 5), np.float32), rng.standard_normal((5, 2), np.float32)
    y, decision = xrt.ops.matmul(a, b, return_decision=True)
    np.testing.assert_allclose(y.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    assert decision.kernel == "cpu" and decision.backend == "cpu"
    assert decision.op == "matmul" and decision.family == "matmul"
    assert decision.signature == "matmul(float32[3,7,5],float32[5,2]){} cpu fp32"
    reasons = {c["kernel"]: c["reason"] for c in decision.candidates}
    if xrt.get_device_count() == 0:
        assert "runs on CUDA devices; the op is on cpu" in reasons["cublasLt"]
    assert decision.to_json().startswith("{")
    assert any(d.signature == decision.signature for d in xrt.ops.decisions())


def test_preferred_gpu_kernel_falls_back_on_cpu_and_pinned_raises():
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    policy = xrt.KernelPolicy(activation="cuda_raw")
    y, decision = xrt.ops.relu(x, policy=policy, return_decision=True)
    np.testing.assert_array_equal(y.numpy(), np.maximum(x, 0))
    assert decision.rule == "fallback" and decision.kernel == "cpu"
    assert "cuda_raw: runs on CUDA devices" in decision.reason
    with pytest.raises(xrt.UnsupportedOperationError, match="pinned kernel 'cuda_raw' cannot run relu"):
        xrt.ops.relu(x, policy=xrt.KernelPolicy(relu="pin:cuda_raw"))


def test_linear_attention_softmax_layer_norm_against_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 8), np.float32)
    w = rng.standard_normal((5, 8), np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(xrt.ops.linear(x, w, b, "relu").numpy(), np.maximum(x @ w.T + b, 0), rtol=1e-5,
                               atol=1e-5)
    s = xrt.ops.softmax(x, axis=1).numpy()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(s, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    q, k, v = (rng.standard_normal((1, 2, 4, 8), np.float32) for _ in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(xrt.ops.attention(q, k, v).numpy(), (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-4,
                               atol=1e-5)


def test_attention_fully_masked_rows():
    """A query row masked at every key is NaN by default and 0 with fully_masked_rows="zero"; the others agree."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 3, 4), np.float32) for _ in range(3))
    mask = np.zeros((3, 3), np.float32)
    mask[1] = -np.inf
    plain = xrt.ops.attention(q, k, v, mask).numpy()
    zero = xrt.ops.attention(q, k, v, mask, fully_masked_rows="zero").numpy()
    assert np.isnan(plain[:, :, 1]).all()
    np.testing.assert_array_equal(zero[:, :, 1], 0.0)
    np.testing.assert_array_equal(zero[:, :, [0, 2]], plain[:, :, [0, 2]])
    with pytest.raises(xrt.InvalidArgumentError, match="fully_masked_rows"):
        xrt.ops.attention(q, k, v, mask, fully_masked_rows="zeros")


def test_bad_inputs_raise_typed_errors():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(xrt.InvalidArgumentError, match="do not chain"):
        xrt.ops.matmul(a, a)
    with pytest.raises(xrt.InvalidTypeError, match="must be float32, float16 or bfloat16, got int32"):
        xrt.ops.relu(np.ones(3, np.int32))
    with pytest.raises(xrt.InvalidTypeError, match="must have the dtype of 'a'"):
        xrt.ops.add(a, a.astype(np.float64))
    with pytest.raises(xrt.InvalidArgumentError, match="cannot be broadcast together"):
        xrt.ops.add(a, np.ones((4,), np.float32))
    with pytest.raises(xrt.InvalidArgumentError, match="unknown op"):
        xrt.ops.call("nope", [a])
    with pytest.raises(xrt.InvalidTypeError, match="attrs must be a dict"):
        xrt.ops.call("softmax", [a], [1])
    with pytest.raises(TypeError):
        xrt.ops.softmax(a, axes=1)
    with pytest.raises(xrt.InvalidTypeError, match="policy must be a KernelPolicy"):
        xrt.ops.relu(a, policy="cpu")


def test_autotune_best_performance_on_cpu_uses_the_cache(tmp_path):
    cache = xrt.AutotuneCache(str(tmp_path / "lock.json"))
    d = xrt.Dispatcher(xrt.KernelPolicy(auto_strategy="BestPerformance"), xrt.ExecutionPolicy(), cache)
    outputs, decision = d.run("gelu", [np.ones((4, 4), np.float32)])
    assert decision.rule == "autotuned" and decision.kernel == "cpu"
    assert len(cache) == 1 and (tmp_path / "lock.json").exists()
    again = xrt.Dispatcher(xrt.KernelPolicy(auto_strategy="BestPerformance"), xrt.ExecutionPolicy(),
                           xrt.AutotuneCache(str(tmp_path / "lock.json")))
    _, decision = again.run("gelu", [np.ones((4, 4), np.float32)])
    assert decision.rule == "autotune-cache"


def test_dlpack_inputs_are_zero_copy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = xrt.from_dlpack(a)
    assert t.data_ptr == a.ctypes.data
    y = xrt.ops.add(t, a)
    np.testing.assert_array_equal(np.from_dlpack(y), a + a)


@requires_gpu
def test_gpu_ops_run_on_the_device_with_gpu_kernels():
    rng = np.random.default_rng(2)
    a = xrt.from_numpy(rng.standard_normal((64, 32), np.float32)).to("cuda:0")
    b = xrt.from_numpy(rng.standard_normal((32, 16), np.float32)).to("cuda:0")
    y, decision = xrt.ops.matmul(a, b, return_decision=True)
    assert decision.backend in ("cublasLt", "cublas")
    np.testing.assert_allclose(y.cpu().numpy(), a.cpu().numpy() @ b.cpu().numpy(), rtol=1e-4, atol=1e-4)
    with pytest.raises(xrt.UnsupportedOperationError, match="pinned kernel 'cpu' cannot run"):
        xrt.ops.matmul(a, b, policy=xrt.KernelPolicy(matmul="pin:cpu"))


def _decode_linear_model(k: int, n: int):
    """y = x @ W for one float16 row of x and a constant W [k, n] (a decode step's projection): (model, W)."""
    from onnx import TensorProto, helper, numpy_helper
    weight = (np.random.default_rng(3).standard_normal((k, n), np.float32) / np.sqrt(k)).astype(np.float16)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, n])],
                              initializer=[numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), weight


@requires_gpu
def test_gpu_weight_streams_are_timed_from_memory_when_the_constants_outgrow_the_l2(monkeypatch):
    """Note [Weights timed from memory]: a one-row Linear whose weight is larger than the GPU's L2 has gemv and
    cuBLASLt timed with the L2 cleared before each run, and explain() says so; a model that fits keeps warm timing."""
    monkeypatch.setenv("XPURT_BUILD_CACHE", "0")  # decide afresh: a cached decision is replayed, not timed
    l2 = xrt.Device(0).l2_cache_bytes
    k = 2048
    n = (int(1.25 * l2) // (2 * k) + 7) // 8 * 8
    x = np.random.default_rng(4).standard_normal((1, k), np.float32).astype(np.float16)
    for cols, cold in ((n, True), (512, False)):
        model, weight = _decode_linear_model(k, cols)
        session = xrt.InferenceSession(model, device="cuda", engine="native")
        (y,) = session.run(None, {"x": x})
        y = y.cpu().numpy() if isinstance(y, xrt.Tensor) else y
        explained = str(session.explain())
        assert ("timed with the weight read from memory" in explained) == cold, explained
        assert ("weight streams timed from memory" in explained) == cold, explained  # the session's option line
        want = x.astype(np.float32) @ weight.astype(np.float32)
        np.testing.assert_allclose(y.astype(np.float32), want, rtol=2e-2, atol=2e-2)


def _reduction_model(op, dtype, shape, axes, keepdims=0):
    from onnx import TensorProto, helper
    elem = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
            "bool": TensorProto.BOOL}[dtype]
    inputs = ["x"]
    inits = []
    if axes is not None:
        inputs.append("axes")
        inits.append(helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes))
    node = helper.make_node(op, inputs, ["y"], keepdims=keepdims)
    graph = helper.make_graph([node], "reduce", [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


@pytest.mark.parametrize("shape,axes", [((1048583,), None), ((3, 300007), [1]), ((2, 5, 40000), [1, 2]),
                                        ((70, 140000), [1]), ((4, 131072), [1])])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_cpu_reductions_of_few_long_rows(shape, axes, dtype):
    """Note [Few long rows split] (cpu_reduce.cpp): rows cut into chunks of 65,536 when they are few: sums within
    float rounding of NumPy's in double, max and min exact with NaN anywhere, and the same bits on 1 and 2 threads."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(dtype)
    x_nan = x.copy()
    x_nan.reshape(shape[0], -1)[0, -1] = np.nan  # the last chunk of the first row
    reduced = tuple(range(len(shape)))[1:] if axes else None
    for op, ref in [("ReduceSum", lambda a: a.astype(np.float64).sum(axis=reduced)),
                    ("ReduceMean", lambda a: a.astype(np.float64).mean(axis=reduced)),
                    ("ReduceMax", lambda a: a.max(axis=reduced)), ("ReduceMin", lambda a: a.min(axis=reduced))]:
        model = _reduction_model(op, dtype, shape, axes)
        outs = []
        for threads in (1, 2):
            session = xrt.InferenceSession(model, engine="native", device="cpu",
                                           exec_policy=xrt.ExecutionPolicy(intra_op_threads=threads))
            outs.append([np.asarray(session.run(None, {"x": a})[0]) for a in (x, x_nan)])
        for got_1, got_2 in zip(*outs):
            np.testing.assert_array_equal(got_1, got_2)
        tol = 1e-3 if dtype == "float16" else 1e-6
        np.testing.assert_allclose(outs[0][0].astype(np.float64), np.asarray(ref(x), np.float64).astype(dtype),
                                   rtol=tol, atol=tol * 10, err_msg=op)
        if op in ("ReduceMax", "ReduceMin"):
            assert np.isnan(outs[0][1].reshape(-1)[0]) and not np.isnan(outs[0][1].reshape(-1)[1:]).any(), op


@pytest.mark.parametrize("shape,axes", [((1048583,), None), ((3, 300007), [1]), ((100, 777), [1]),
                                        ((5, 7, 3), [0]), ((2, 131072), [1])])
def test_cpu_any_all_of_bools(shape, axes):
    """ReduceMax / ReduceMin of bools (any / all, Note [Reductions of predicates]): the deciding byte at the start, in
    the middle or at the end of a row, or nowhere; trailing axes by memchr over chunks, others by the reference."""
    n = int(np.prod(shape))
    for where in (None, 0, n // 2, n - 1):
        for fill in (False, True):
            x = np.full(shape, fill, np.bool_)
            if where is not None:
                x.reshape(-1)[where] = not fill
            reduced = tuple(axes) if axes else None
            for op, ref in [("ReduceMax", np.any), ("ReduceMin", np.all)]:
                session = xrt.InferenceSession(_reduction_model(op, "bool", shape, axes), engine="native",
                                               device="cpu")
                got = np.asarray(session.run(None, {"x": x})[0])
                np.testing.assert_array_equal(got, ref(x, axis=reduced), err_msg=f"{op} {where} {fill}")
