"""The float8 GEMM qlinear_fp8 and the float8 chains of the quantized_fusion pass (issue 41; Note [Float8 quantized
linear] in core/op_schemas.cpp, Note [Float8 quantized fusion] in engines/native/passes/fusion_quantized.cpp, Note
[cuBLASLt float8 GEMMs] in backends/cublaslt/cublaslt_qlinear_fp8.cpp; docs/quantization.md).

On the CPU: the cpu kernel against a numpy reference at odd shapes (per tensor and per channel, bias, relu, outputs
float32 / float16 / float8e4m3fn); the schema's refusals; xrt.quantize(precision="fp8") models run fused by the pass
(explain() names qlinear_fp8 on the cpu kernel) and agree with the unfused run. On a GPU (skipped here): the cublasLt
kernel against the cpu kernel at M = 1, 7, 128, 1000, K = 64, 768, 3072, N = 8, 768, 2304 within the tolerance of
float32 sums taken in another order; bit for bit where every sum is exact (so the float8 rounding, ties and
saturation are ONNX's); the quantized model fused on cuda:0 and a K cuBLASLt cannot take left unfused with its reason.

Tolerance. The cpu kernel adds the exact products (a float8 times a float8 is exact in float32) in k order in
float32: within (K - 1) 2^-24 sum_k |x w| of the exact sum. cuBLASLt (fast accumulation off) promotes its partial sums
to float32 every few MMA blocks, but inside one Hopper float8 MMA the sum keeps fewer bits than float32 (about 14,
as measured by DeepSeek-V3's report), so the GPU's float outputs are held to 2^-12 sum_k |x w| alpha (plus the float32
bound, and half a float16 step for float16): loose against float32 rounding, tight against any wrong index or scale
(which moves outputs by the order of that sum). Float8 outputs: the float difference over y_scale plus one float8 step
(each side rounds to nearest), and most elements equal. Where every partial sum is exact (small multiples of 1/4),
the GPU equals the cpu kernel bit for bit, which checks the epilogue and ONNX's float8 rounding (ties, saturation).
"""

from __future__ import annotations

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu
from xpuruntime.quantization import _model

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

PASS = "quantized_fusion"


def _codes(rng, shape, magnitude: float) -> np.ndarray:
    """float8e4m3fn codes of values uniform in [-magnitude, magnitude] (no NaN)."""
    return _model.float_to_e4m3(rng.uniform(-magnitude, magnitude, size=shape).astype(np.float32))


def _fp8(codes: np.ndarray, device=None):
    t = xrt.from_numpy(np.ascontiguousarray(codes)).view("float8e4m3fn")
    return t.to(device) if device is not None else t


def _problem(rng, m, k, n, per_channel, bias, magnitude=200.0):
    x = _codes(rng, (m, k), magnitude)
    w = _codes(rng, (n, k), magnitude)  # [N, K]
    w_scale = (rng.uniform(0.001, 0.004, size=n if per_channel else 1)).astype(np.float32)
    b = rng.uniform(-1, 1, size=n).astype(np.float32) if bias else None
    return x, w, w_scale, b


def _reference(x, w_nk, w_scale, b, attrs):
    """Note [Float8 quantized linear] in float64 (exact sums): the real values before the output's rounding, and the
    tolerance bound sum_k |x w| * alpha."""
    xf = _model.e4m3_to_float(x).astype(np.float64).reshape(-1, x.shape[-1])
    wf = _model.e4m3_to_float(w_nk).astype(np.float64)
    alpha = (np.float64(attrs["x_scale"]) * w_scale.astype(np.float64)).astype(np.float32).astype(np.float64)
    real = (xf @ wf.T) * alpha + (b.astype(np.float64) if b is not None else 0.0)
    if attrs.get("activation") == "relu":
        real = np.maximum(real, 0)
    return real, (np.abs(xf) @ np.abs(wf).T) * alpha


def _float8_step(values: np.ndarray) -> np.ndarray:
    """One float8e4m3fn step at |values| (in float8 units)."""
    a = np.maximum(np.abs(values), 2.0 ** -6)
    return np.exp2(np.floor(np.log2(a)) - 3)


def _check_output(got: np.ndarray, real: np.ndarray, bound: np.ndarray, attrs, k: int, exact_fraction=0.9,
                  gpu=False, bias=None):
    """got (the op's output as float32 values) against the exact real values; `gpu`: cuBLASLt's tolerance, and the
    bias's rounding to float16 where cuBLASLt applies the epilogue itself (Note [cuBLASLt's own float8 epilogue])."""
    out = attrs["output_dtype"]
    sums = (2 * k * 2.0 ** -24 + (2.0 ** -12 if gpu else 0.0)) * bound + 1e-30
    if gpu and bias is not None:
        sums = sums + np.abs(bias.astype(np.float64)) * 2.0 ** -11
    got = got.reshape(real.shape)
    if out == "float32":
        assert np.all(np.abs(got - real) <= sums + np.abs(real) * 2.0 ** -23), np.max(np.abs(got - real) - sums)
    elif out == "float16":
        assert np.all(np.abs(got - real) <= sums + np.abs(real) * 2.0 ** -11 + 2.0 ** -25)
    else:
        scaled = np.clip(real / attrs["y_scale"], -448, 448)
        expected = _model.e4m3_to_float(_model.float_to_e4m3(scaled.astype(np.float32)))
        step = _float8_step(np.maximum(np.abs(scaled), np.abs(got)))
        assert np.all(np.abs(got - expected) <= step * 1.0001 + sums / attrs["y_scale"])
        assert np.mean(got == expected) >= exact_fraction


def _call(x, w, w_scale, b, attrs, device=None):
    inputs = [_fp8(x, device), _fp8(w, device), xrt.from_numpy(w_scale), None if b is None else xrt.from_numpy(b)]
    if device is not None:
        inputs[2] = inputs[2].to(device)
        if inputs[3] is not None:
            inputs[3] = inputs[3].to(device)
    (y,), decision = xrt.ops.call("qlinear_fp8", inputs, attrs, return_decision=True)
    return np.asarray(y.to("cpu").numpy(), dtype=np.float32), decision


def _attrs(output_dtype, activation="none", layout="nk"):
    attrs = {"weight_layout": layout, "x_scale": 0.0123, "activation": activation, "output_dtype": output_dtype}
    if output_dtype == "float8e4m3fn":
        attrs["y_scale"] = 0.05
    return attrs


# ---------------------------------------------------------------------------------------------------------------
# The cpu kernel
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (3, 33, 17)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("output_dtype", ["float32", "float16", "float8e4m3fn"])
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_cpu_kernel_matches_numpy(shape, per_channel, output_dtype, layout):
    m, k, n = shape
    rng = np.random.default_rng(m * 100 + k + n)
    x, w, w_scale, b = _problem(rng, m, k, n, per_channel, bias=True)
    attrs = _attrs(output_dtype, "relu", layout)
    weight = w if layout == "nk" else np.ascontiguousarray(w.T)
    got, decision = _call(x, weight, w_scale, b, attrs)
    assert decision.kernel == "cpu"
    real, bound = _reference(x, w, w_scale, b, attrs)
    _check_output(got, real, bound, attrs, k, exact_fraction=0.8)


def test_cpu_kernel_batched_x_and_saturation():
    rng = np.random.default_rng(3)
    x = _codes(rng, (2, 3, 16), 448.0)
    w = _codes(rng, (4, 16), 448.0)
    attrs = {"weight_layout": "nk", "x_scale": 1.0, "output_dtype": "float8e4m3fn", "y_scale": 1.0}
    got, _ = _call(x, w, np.ones(1, np.float32), None, attrs)
    assert got.shape == (2, 3, 4)
    real = _model.e4m3_to_float(x).astype(np.float64) @ _model.e4m3_to_float(w).astype(np.float64).T
    assert np.all(np.abs(got[np.abs(real) > 1000]) == 448)  # saturated, not NaN
    assert np.all(np.sign(got[np.abs(real) > 1000]) == np.sign(real[np.abs(real) > 1000]))


@pytest.mark.parametrize("output_dtype", ["float32", "float16", "float8e4m3fn"])
def test_a_float16_bias_is_its_value_widened(output_dtype):
    # A float16 plan's bias (Note [Quantized fusion in float16 plans]): the kernel reads float16 as the float32 of
    # the same value, so the outputs equal those of that float32 bias bit for bit.
    rng = np.random.default_rng(11)
    x, w, w_scale, b = _problem(rng, 9, 32, 12, per_channel=False, bias=True)
    b16 = b.astype(np.float16)
    attrs = _attrs(output_dtype, "relu")
    with_half, _ = _call(x, w, w_scale, b16, attrs)
    with_float, _ = _call(x, w, w_scale, b16.astype(np.float32), attrs)
    np.testing.assert_array_equal(with_half, with_float)
    with pytest.raises(xrt.InvalidTypeError, match="float32 or float16"):
        _call(x, w, w_scale, b.astype(np.float64), attrs)


def test_schema_refusals():
    x = _fp8(np.zeros((2, 16), np.uint8))
    w = _fp8(np.zeros((4, 16), np.uint8))
    s = np.ones(1, np.float32)
    with pytest.raises(xrt.InvalidTypeError, match="float8e4m3fn"):
        xrt.ops.call("qlinear_fp8", [np.zeros((2, 16), np.int8), w, s, None], _attrs("float32"))
    with pytest.raises(xrt.InvalidArgumentError, match="y_scale"):
        xrt.ops.call("qlinear_fp8", [x, w, s, None], {"weight_layout": "nk", "x_scale": 1.0,
                                                      "output_dtype": "float8e4m3fn"})
    with pytest.raises(xrt.InvalidArgumentError, match="output_dtype"):
        xrt.ops.call("qlinear_fp8", [x, w, s, None], {**_attrs("float32"), "output_dtype": "int8"})
    with pytest.raises(xrt.InvalidArgumentError, match="w_scale"):
        xrt.ops.call("qlinear_fp8", [x, w, np.ones(3, np.float32), None], _attrs("float32"))


# ---------------------------------------------------------------------------------------------------------------
# xrt.quantize(precision="fp8") models through the pass
# ---------------------------------------------------------------------------------------------------------------


def _float_mlp(k: int, hidden: int, n: int, seed: int = 0) -> bytes:
    """x [batch, k] -> MatMul -> Add -> Relu -> Gemm(transB) -> y [batch, n] (float32)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (k, hidden)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, hidden).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (n, hidden)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, n).astype(np.float32), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _quantized(k, hidden, n, per_channel):
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.normal(0, 1, (16, k)).astype(np.float32)} for _ in range(2)]
    result = xrt.quantize(_float_mlp(k, hidden, n), calibration, precision="fp8", per_channel=per_channel)
    return result.model.SerializeToString()


def _fused_ops(session):
    return [(n["node"], n["kernel"]) for n in session.explain().nodes if n["op"] == "qlinear_fp8"]


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("sizes", [(13, 7, 5), (48, 40, 24)])
def test_quantized_models_run_fused_on_the_cpu(per_channel, sizes):
    k, hidden, n = sizes
    model = _quantized(k, hidden, n, per_channel)
    fused = xrt.InferenceSession(model, engine="native", device="cpu")
    plain = xrt.InferenceSession(model, engine="native", device="cpu", disabled_passes=[PASS])
    assert len(_fused_ops(fused)) == 2, [(n["node"], n["op"]) for n in fused.explain().nodes]
    assert all(kernel == "cpu" for _, kernel in _fused_ops(fused))
    assert _fused_ops(plain) == []
    x = np.random.default_rng(2).normal(0, 1, (9, k)).astype(np.float32)
    (a,) = fused.run(None, {"x": x})
    (b,) = plain.run(None, {"x": x})
    # The hidden activations are requantized to float8: one step apart on a few elements at most, which moves the
    # output by a small fraction of its range.
    span = float(np.max(np.abs(b)))
    assert np.max(np.abs(a - b)) <= 0.05 * span + 1e-6
    assert np.mean(np.abs(a - b)) <= 0.005 * span + 1e-6


def test_a_policy_rule_for_the_float_op_keeps_float8_chains_float():
    """Note [Float pinned by the KernelPolicy] for float8 chains: a rule for matmul's family and none for qlinear_fp8
    keeps them float, and explain() says so per chain; a rule for qlinear_fp8 too fuses them again."""
    model = _quantized(16, 8, 4, per_channel=False)
    kept = xrt.InferenceSession(model, engine="native", device="cpu", kernel_policy=xrt.KernelPolicy({"matmul": "cpu"}))
    assert _fused_ops(kept) == []
    reasons = [o for o in kept.explain().options if o.startswith("pass quantized_fusion: kept")]
    assert len(reasons) == 2 and all("none for 'qlinear_fp8'" in o for o in reasons), kept.explain().options
    both = xrt.InferenceSession(model, engine="native", device="cpu",
                                kernel_policy=xrt.KernelPolicy({"matmul": "cpu", "qlinear_fp8": "cpu"}))
    assert len(_fused_ops(both)) == 2


def test_fp8_fast_accumulation_is_a_policy_field():
    """ExecutionPolicy.fp8_fast_accumulation: off by default and then absent from policy files (older policies keep
    their bytes and fingerprints), serialized and printed when on, a bool only."""
    default = xrt.ExecutionPolicy()
    assert default.fp8_fast_accumulation is False
    assert "fp8_fast_accumulation" not in default.to_json()
    fast = xrt.ExecutionPolicy(fp8_fast_accumulation=True)
    assert '"fp8_fast_accumulation": true' in fast.to_json()
    assert "fp8_fast_accumulation=true" in repr(fast)
    assert xrt.ExecutionPolicy.from_json(fast.to_json()).fp8_fast_accumulation is True
    assert fast.fingerprint != default.fingerprint
    with pytest.raises(xrt.InvalidArgumentError, match="'fp8_fast_accumulation' must be True or False"):
        xrt.ExecutionPolicy(fp8_fast_accumulation=1)
    with pytest.raises(xrt.InvalidArgumentError, match="fp8_fast_accumulation"):
        xrt.ExecutionPolicy.from_json('{"fp8_fast_accumulation": "yes"}')


def test_fast_accumulation_reaches_the_fused_gemms():
    """The policy gives every qlinear_fp8 of the quantized_fusion pass fast_accumulation=1 (the pass's notes say so);
    the cpu kernel's sums stay float32, so its outputs do not change; the op refuses any other value."""
    model = _quantized(48, 40, 24, per_channel=True)
    fast = xrt.InferenceSession(model, engine="native", device="cpu",
                                exec_policy=xrt.ExecutionPolicy(fp8_fast_accumulation=True))
    plain = xrt.InferenceSession(model, engine="native", device="cpu")
    notes = [o for o in fast.explain().options if "-> QLinearFp8" in o]
    assert notes and all("(qlinear_fp8, float8, fast accumulation)" in o for o in notes), notes
    assert len(_fused_ops(fast)) == 2
    assert not any("fast accumulation" in o for o in plain.explain().options)
    x = np.random.default_rng(5).normal(0, 1, (9, 48)).astype(np.float32)
    np.testing.assert_array_equal(fast.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])
    rng = np.random.default_rng(6)
    x8, w, w_scale, b = _problem(rng, 3, 16, 8, per_channel=False, bias=False)
    with pytest.raises(xrt.XpuRuntimeError, match="fast_accumulation must be 0 or 1, got 2"):
        _call(x8, w, w_scale, b, dict(_attrs("float32"), fast_accumulation=2))


# ---------------------------------------------------------------------------------------------------------------
# The cublasLt kernel (GPU)
# ---------------------------------------------------------------------------------------------------------------

_GPU_KN = [(64, 8), (64, 768), (768, 8), (768, 768), (768, 2304), (3072, 768), (3072, 2304)]


@requires_gpu
@pytest.mark.parametrize("m", [1, 7, 128, 1000])
@pytest.mark.parametrize("kn", _GPU_KN)
@pytest.mark.parametrize("variant", [("float8e4m3fn", True, "relu"), ("float16", False, "none"),
                                     ("float32", True, "none")])
def test_cublaslt_matches_the_cpu_kernel(m, kn, variant):
    k, n = kn
    output_dtype, per_channel, activation = variant
    rng = np.random.default_rng(m + k + n)
    x, w, w_scale, b = _problem(rng, m, k, n, per_channel, bias=True, magnitude=8.0)
    typical = 0.0123 * 0.0025 * 20 * np.sqrt(k)  # the size of an output's sum
    b = (b * typical).astype(np.float32)
    attrs = _attrs(output_dtype, activation)
    if output_dtype == "float8e4m3fn":
        attrs["y_scale"] = float(typical / 30)  # the outputs span float8's range, a few saturate
    gpu, decision = _call(x, w, w_scale, b, attrs, device=xrt.Device("cuda:0"))
    assert decision.kernel == "cublasLt", decision
    assert gpu.shape == (m, n)
    cpu, _ = _call(x, w, w_scale, b, attrs)
    real, bound = _reference(x, w, w_scale, b, attrs)
    _check_output(gpu, real, bound, attrs, k, exact_fraction=0.8, gpu=True, bias=b)
    # The two float results apart (the bias in float16 where cuBLASLt applies it).
    tol = (2 * k * 2.0 ** -24 + 2.0 ** -12) * bound + np.abs(b.astype(np.float64)) * 2.0 ** -11 + 1e-30
    if output_dtype == "float8e4m3fn":
        step = _float8_step(np.maximum(np.abs(gpu), np.abs(cpu)))
        assert np.all(np.abs(gpu - cpu) <= step * 1.0001 + tol / attrs["y_scale"])
        assert np.mean(gpu == cpu) >= 0.8
    else:
        tol = tol + (np.abs(cpu) * 2.0 ** -10 if output_dtype == "float16" else np.abs(cpu) * 2.0 ** -22)
        assert np.all(np.abs(gpu - cpu) <= tol), np.max(np.abs(gpu - cpu) - tol)


@requires_gpu
@pytest.mark.parametrize("output_dtype", ["float8e4m3fn", "float16", "float32"])
def test_cublaslt_equals_the_cpu_kernel_where_the_sums_are_exact(output_dtype):
    """Small float8 values (multiples of 1/2 up to 2): every product is a multiple of 1/4 and every partial sum one
    below 2^8, exact in float32 and in the narrower sums inside an MMA, so the GPU equals the cpu kernel bit for bit:
    the epilogue's arithmetic, the float8 rounding of ties and the saturation included (y_scale puts outputs on ties
    and past 448)."""
    rng = np.random.default_rng(9)
    m, k, n = 37, 48, 24
    values = np.array([0.5, 1.0, 1.5, 2.0, -0.5, -1.0, -1.5, -2.0, 0.0], np.float32)
    x = _model.float_to_e4m3(rng.choice(values, size=(m, k)))
    w = _model.float_to_e4m3(rng.choice(values, size=(n, k)))
    w_scale = rng.choice(np.array([0.5, 1.0, 2.0], np.float32), size=n).astype(np.float32)
    b = rng.choice(np.array([0.0, 0.125, -0.25], np.float32), size=n).astype(np.float32)
    attrs = {"weight_layout": "nk", "x_scale": 1.0, "activation": "none", "output_dtype": output_dtype}
    if output_dtype == "float8e4m3fn":
        attrs["y_scale"] = 1.0 / 64  # outputs up to ~400 * 64: saturated; multiples of 1/64 land on float8 ties
    gpu, decision = _call(x, w, w_scale, b, attrs, device=xrt.Device("cuda:0"))
    assert decision.kernel == "cublasLt"
    cpu, _ = _call(x, w, w_scale, b, attrs)
    np.testing.assert_array_equal(gpu, cpu)
    if output_dtype == "float8e4m3fn":
        assert np.any(np.abs(cpu) == 448)


@requires_gpu
@pytest.mark.parametrize("m", [16, 4096])  # the kernel epilogue, and cuBLASLt's own (m * n >= 2^18)
@pytest.mark.parametrize("output_dtype", ["float16", "float8e4m3fn"])
def test_cublaslt_reads_a_float16_bias_as_its_value(m, output_dtype):
    rng = np.random.default_rng(12)
    x, w, w_scale, b = _problem(rng, m, 256, 128, per_channel=False, bias=True, magnitude=4.0)
    b16 = (b * 0.01).astype(np.float16)
    attrs = _attrs(output_dtype)
    gpu = xrt.Device("cuda:0")
    with_half, decision = _call(x, w, w_scale, b16, attrs, device=gpu)
    assert decision.kernel == "cublasLt"
    with_float, _ = _call(x, w, w_scale, b16.astype(np.float32), attrs, device=gpu)
    np.testing.assert_array_equal(with_half, with_float)


@requires_gpu
def test_a_float16_plan_of_a_float8_model_agrees_with_the_float32_plan():
    model = _quantized(64, 256, 64, per_channel=False)
    half = xrt.InferenceSession(model, engine="native", device="cuda",
                                exec_policy=xrt.ExecutionPolicy(precision="fp16"))
    full = xrt.InferenceSession(model, engine="native", device="cuda")
    assert [kernel for _, kernel in _fused_ops(half)] == ["cublasLt", "cublasLt"]
    x = np.random.default_rng(5).normal(0, 1, (2048, 64)).astype(np.float16).astype(np.float32)
    (a,) = half.run(None, {"x": x})
    (b,) = full.run(None, {"x": x})
    span = float(np.max(np.abs(b)))
    assert np.max(np.abs(np.asarray(a, np.float32) - b)) <= 0.05 * span + 1e-3


@requires_gpu
def test_quantized_model_on_cuda():
    model = _quantized(64, 48, 24, per_channel=True)
    fused = xrt.InferenceSession(model, engine="native", device="cuda")
    cpu = xrt.InferenceSession(model, engine="native", device="cpu")
    assert [kernel for _, kernel in _fused_ops(fused)] == ["cublasLt", "cublasLt"]
    x = np.random.default_rng(4).normal(0, 1, (33, 64)).astype(np.float32)
    (a,) = fused.run(None, {"x": x})
    (b,) = cpu.run(None, {"x": x})
    span = float(np.max(np.abs(b)))
    assert np.max(np.abs(np.asarray(a) - b)) <= 0.05 * span + 1e-6
    # K = 13 (the first GEMM) is not a multiple of 16: that chain runs unfused, and explain() says why.
    odd = xrt.InferenceSession(_quantized(13, 48, 24, per_channel=False), engine="native", device="cuda")
    assert [node for node, _ in _fused_ops(odd)] == ["fc2"]
    assert any("K a multiple of 16" in line and "K = 13" in line for line in odd.explain().options)


@requires_gpu
@pytest.mark.parametrize("m", [1, 128, 1000])
@pytest.mark.parametrize("kn", [(64, 768), (768, 768), (3072, 768)])
def test_cublaslt_fast_accumulation(m, kn):
    """fast_accumulation=1: cuBLASLt keeps the float8 MMA's partial sums along K without promoting them to float32.
    Each of the K / 32 steps of an MMA chain may lose about 2^-13 of the partial sum (Hopper's float8 accumulator keeps
    about 14 bits), so the outputs are held to (K / 32 + 1) 2^-12 sum_k |x w| alpha; their relative L2 error over a
    whole output to 2^-8 (a wrong index or scale moves it by the order of 1). The plan says it runs so."""
    k, n = kn
    rng = np.random.default_rng(m * 7 + k + n)
    x, w, w_scale, b = _problem(rng, m, k, n, per_channel=True, bias=True, magnitude=8.0)
    attrs = dict(_attrs("float32"), fast_accumulation=1)
    typical = 0.0123 * 0.0025 * 20 * np.sqrt(k)
    b = (b * typical).astype(np.float32)
    gpu, decision = _call(x, w, w_scale, b, attrs, device=xrt.Device("cuda:0"))
    assert decision.kernel == "cublasLt" and "fast accumulation" in decision.plan_summary, decision.plan_summary
    real, bound = _reference(x, w, w_scale, b, attrs)
    tol = ((k / 32 + 1) * 2.0 ** -12 + 2 * k * 2.0 ** -24) * bound + np.abs(b.astype(np.float64)) * 2.0 ** -11 + 1e-30
    err = np.abs(gpu.astype(np.float64) - real)
    assert np.all(err <= tol), float(np.max(err / tol))
    assert np.linalg.norm(err) <= 2.0 ** -8 * np.linalg.norm(real) + 1e-30
    worst = float(np.max(err / (bound + 1e-30)))
    print(f"fast accumulation m={m} k={k} n={n}: max error / sum|xw|alpha = {worst:.2e}, "
          f"relative L2 = {float(np.linalg.norm(err) / np.linalg.norm(real)):.2e}")
