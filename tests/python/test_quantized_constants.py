"""The quantized_constant_folding pass (Note [Quantized constants folded at build time] in
engines/native/passes/quantized_constants.cpp): alpha and the zero point's int32 correction of each QLinear / QConv
computed once while the plan is built, instead of by a prologue kernel at every GPU launch.

On the CPU: quantized models (xrt.quantize's int8 MLP and CNN with int8 and uint8 activations; ONNX's QLinearMatMul,
QLinearConv, MatMulInteger and ConvInteger with zero points and int32 biases) give the same bits with and without the
pass, and explain() lists what it folded. On the GPU: the same plans give the CPU's bits.
"""

from __future__ import annotations

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

onnx = pytest.importorskip("onnx")
pytest.importorskip("sklearn.datasets", reason="needs scikit-learn (Debian: python3-sklearn)")
from test_quantization import _calibration, cnn, digits, mlp  # noqa: E402,F401,F811 (fixtures)
from test_quantized_fusion import _qlinear_conv_model, _qlinear_matmul_model, _random_q  # noqa: E402

PASS = "quantized_constant_folding"


def _session(model: bytes, device: str = "cpu", disabled=()):
    return xrt.InferenceSession(model, engine="native", device=device, disabled_passes=list(disabled))


def _notes(session):
    return [o for o in session.explain().options if o.startswith(f"pass {PASS}")]


def _host(value) -> np.ndarray:
    """An output as a NumPy array on the host (a session on a GPU may hand back device tensors)."""
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value.to("cpu").numpy())


def _assert_same_bits(got: dict, want: dict):
    assert got.keys() == want.keys()
    for name, value in want.items():
        mine, theirs = _host(got[name]), _host(value)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert mine.tobytes() == theirs.tobytes(), f"{name}: the bits differ"


def _quantized(request, digits, net: str, activation_type: str) -> bytes:
    model = request.getfixturevalue(net)
    result = xrt.quantize(model, calibration=_calibration(digits), precision="int8", method="minmax",
                          activation_type=activation_type)
    return result.to_bytes()


def _onnx_quantized(kind: str, x_dtype, per_channel: bool):
    if kind == "matmul":
        model, rng = _qlinear_matmul_model(x_dtype, per_channel)
        return model.SerializeToString(), {"a": _random_q(rng, (5, 37), x_dtype)}
    model, rng = _qlinear_conv_model(x_dtype, per_channel)
    return model.SerializeToString(), {"x": _random_q(rng, (2, 4, 9, 7), x_dtype)}


@pytest.mark.parametrize("net, folded", [("mlp", 3), ("cnn", 3)])
@pytest.mark.parametrize("activation_type", ["int8", "uint8"])
def test_xrt_quantize_models_same_bits_with_and_without_the_pass(request, digits, net, folded, activation_type):
    model = _quantized(request, digits, net, activation_type)
    with_pass, without = _session(model), _session(model, disabled=[PASS])
    notes = _notes(with_pass)
    assert len(notes) == 1 and f"{folded} rewrite(s) (folded alpha" in notes[0], notes
    assert not _notes(without)
    xte = digits[2]
    _assert_same_bits(with_pass.run({"x": xte}), without.run({"x": xte}))


@pytest.mark.parametrize("kind", ["matmul", "conv"])
@pytest.mark.parametrize("x_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_onnx_quantized_operators_fold_their_zero_points(kind, x_dtype, per_channel):
    """QLinearConv's int32 bias and QLinearMatMul's / the *Integer ops' zero points: the correction goes into a
    constant int32 bias (the *Integer ops' int32 outputs have no alpha to fold)."""
    model, feeds = _onnx_quantized(kind, x_dtype, per_channel)
    with_pass, without = _session(model), _session(model, disabled=[PASS])
    notes = _notes(with_pass)
    assert len(notes) == 1 and "2 rewrite(s)" in notes[0] and "correction into the int32 bias" in notes[0], notes
    _assert_same_bits(with_pass.run(feeds), without.run(feeds))


@requires_gpu
@pytest.mark.parametrize("net", ["mlp", "cnn"])
@pytest.mark.parametrize("activation_type", ["int8", "uint8"])
def test_gpu_plans_with_folded_constants_give_the_cpus_bits(request, digits, net, activation_type):
    model = _quantized(request, digits, net, activation_type)
    gpu = _session(model, "cuda")
    assert _notes(gpu)
    xte = digits[2]
    _assert_same_bits(gpu.run({"x": xte}), _session(model, disabled=[PASS]).run({"x": xte}))


@requires_gpu
@pytest.mark.parametrize("kind", ["matmul", "conv"])
@pytest.mark.parametrize("x_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_gpu_onnx_quantized_operators_give_the_cpus_bits(kind, x_dtype, per_channel):
    model, feeds = _onnx_quantized(kind, x_dtype, per_channel)
    gpu = _session(model, "cuda")
    assert _notes(gpu)
    _assert_same_bits(gpu.run(feeds), _session(model, disabled=[PASS]).run(feeds))
