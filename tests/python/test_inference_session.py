"""InferenceSession from Python: engine choice and its errors, running the shipped example model through the
onnxruntime engine on the CPU, ONNX Runtime-style API, explain(), bad inputs and corrupted models."""

import pathlib
import sys
import threading

import numpy as np
import pytest

import xpuruntime as xrt

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "tiny_classifier.onnx"
sys.path.insert(0, str(ROOT / "examples"))
import onnx_weights  # noqa: E402


def _ort_available() -> bool:
    try:
        xrt.InferenceSession(MODEL, engine="onnxruntime")
    except xrt.UnsupportedOperationError:
        return False
    return True


requires_ort = pytest.mark.skipif(not _ort_available(), reason="this build has no ONNX Runtime engine")


def reference(x: np.ndarray) -> np.ndarray:
    w = onnx_weights.load(MODEL)
    h = np.maximum(x @ w["w1"] + w["b1"], 0)
    logits = h @ w["w2"] + w["b2"]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_engine_errors_are_typed_and_say_what_to_do(tmp_path):
    with pytest.raises(xrt.InvalidArgumentError, match="unknown engine 'trt'; valid engines: auto, native, onnxruntime, tensorrt"):
        xrt.InferenceSession(MODEL, engine="trt")
    with pytest.raises(xrt.UnsupportedOperationError, match="needs NVIDIA TensorRT"):
        xrt.InferenceSession(MODEL, engine="tensorrt")
    with pytest.raises(xrt.UnsupportedOperationError, match="native engine is not available"):
        xrt.InferenceSession(MODEL, engine="native")
    with pytest.raises(xrt.InvalidArgumentError, match="cannot open the model file"):
        xrt.InferenceSession(tmp_path / "missing.onnx")
    with pytest.raises(xrt.InvalidArgumentError, match="the model is empty"):
        xrt.InferenceSession(b"")
    with pytest.raises(xrt.InvalidTypeError, match="model must be a path or bytes"):
        xrt.InferenceSession(42)
    with pytest.raises(xrt.InvalidArgumentError, match="unknown kernel"):
        xrt.InferenceSession(MODEL, kernel_policy=xrt.KernelPolicy({"matmul": "cublasLt"}).set("matmul", "x"))


@requires_ort
def test_runs_the_example_model_like_onnxruntime():
    session = xrt.InferenceSession(MODEL)
    assert session.engine == "onnxruntime"
    (x_info,) = session.get_inputs()
    assert (x_info.name, x_info.dtype, x_info.type, x_info.shape) == ("x", "float32", "tensor(float32)", ["batch", 8])
    assert [o.name for o in session.get_outputs()] == ["probs"]
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    outputs = session.run({"x": x})
    np.testing.assert_allclose(outputs["probs"], reference(x), rtol=1e-5, atol=1e-6)
    (probs,) = session.run(["probs"], {"x": x})
    np.testing.assert_array_equal(probs, outputs["probs"])
    (probs,) = session.run(None, {"x": x[:1]})
    assert probs.shape == (1, 4)
    explanation = session.explain()
    assert explanation.engine == "onnxruntime" and "CPU" in explanation.engine_reason
    kernels = {n["node"]: n["kernel"] for n in explanation.nodes}
    assert kernels and all(k == "CPUExecutionProvider" for k in kernels.values()), kernels
    assert "onnxruntime" in str(explanation) and explanation.to_json().startswith("{")


@requires_ort
def test_bad_feeds_and_corrupted_models_raise_typed_errors():
    session = xrt.InferenceSession(MODEL)
    with pytest.raises(xrt.InvalidTypeError, match="'x'"):
        session.run({"x": np.ones((2, 8), np.int64)})
    with pytest.raises(xrt.InvalidArgumentError, match="'x'"):
        session.run({})
    with pytest.raises(xrt.InvalidArgumentError, match="'y'"):
        session.run({"x": np.ones((2, 8), np.float32), "y": np.ones(1, np.float32)})
    with pytest.raises(xrt.InvalidArgumentError):
        session.run(["nope"], {"x": np.ones((2, 8), np.float32)})
    with pytest.raises(xrt.InvalidArgumentError):
        session.run({"x": np.ones((2, 7), np.float32)})
    data = MODEL.read_bytes()
    for corrupted in (data[: len(data) // 2], b"\x08\x07garbage" * 10):
        with pytest.raises(xrt.InvalidArgumentError):
            xrt.InferenceSession(corrupted)


@requires_ort
def test_run_is_thread_safe():
    session = xrt.InferenceSession(MODEL)
    xs = [np.random.default_rng(i).standard_normal((3, 8)).astype(np.float32) for i in range(8)]
    results = [None] * len(xs)

    def work(i):
        for _ in range(20):
            results[i] = session.run({"x": xs[i]})["probs"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, r in zip(xs, results):
        np.testing.assert_allclose(r, reference(x), rtol=1e-5, atol=1e-6)
