"""examples/quickstart.py claims only comparisons it ran: with ONNX Runtime it compares the native engine with it;
where `auto` ran the native engine (a build or wheel without ONNX Runtime) it says that it could not compare."""

import contextlib
import io
import pathlib
import sys

import xpuruntime as xrt

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import quickstart  # noqa: E402


def _output_of_main() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        quickstart.main()
    return out.getvalue()


def test_the_quickstart_compares_with_onnxruntime_only_when_it_ran():
    text = _output_of_main()
    if "onnxruntime" in xrt.available_engines():
        assert "native engine agrees with onnxruntime: True" in text
    else:
        assert "agrees with onnxruntime" not in text and "onnxruntime was not available" in text
    assert "functional ops agree with the session: True" in text


def test_without_onnxruntime_the_quickstart_says_it_did_not_compare(monkeypatch):
    real = xrt.InferenceSession

    def without_onnxruntime(model, device="cpu", engine="auto", **kwargs):
        # What `auto` does in a build without ONNX Runtime: the native engine runs the model.
        return real(model, device=device, engine="native" if engine == "auto" else engine, **kwargs)

    monkeypatch.setattr(xrt, "InferenceSession", without_onnxruntime)
    text = _output_of_main()
    assert "agrees with onnxruntime" not in text
    assert "onnxruntime was not available, so the native engine was not compared with it" in text
    assert "functional ops agree with the session: True" in text
