"""The ONNX backend node tests (Debian's libonnx-testdata) through InferenceSession's onnxruntime engine on the
CPU, driven by scripts/run_onnx_node_tests.py imported as a module. The whole suite takes about 2 s here."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

import xpuruntime as xrt

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run_onnx_node_tests.py"

pytest.importorskip("onnx", reason="reading the node-test protobufs needs the onnx package (python3-onnx)")


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_onnx_node_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


runner = _load_runner()
DATA = pathlib.Path(runner.DEFAULT_DATA)


def _ort_unavailable_reason():
    try:
        xrt.InferenceSession(str(DATA / "test_abs" / "model.onnx"), engine="onnxruntime")
    except xrt.UnsupportedOperationError as exc:
        return str(exc)
    return None


if not DATA.is_dir():
    pytest.skip(f"no ONNX node-test data at {DATA} (Debian: apt install libonnx-testdata)", allow_module_level=True)
_REASON = _ort_unavailable_reason()
if _REASON is not None:
    pytest.skip(f"the onnxruntime engine is unavailable: {_REASON}", allow_module_level=True)

# The pass threshold. ONNX Runtime 1.29 on the CPU passes 883 of the 932 tests through its own API, but through
# InferenceSession 59 tests cannot be expressed at all (string, uint16/32/64, bfloat16, sequence and optional
# values: xpuruntime tensors and numpy cannot hold them) and are skipped, so ORT's count is out of reach here.
# Measured here: 843 passed, 18 failed, 12 errors, 59 skipped; the threshold leaves a little room.
MIN_PASSED = 840

# The tests ONNX Runtime 1.29's CPU provider does not pass under the backend-test rule, by cause. A test that
# leaves this list (it passes now) is good news; a test that joins it is a regression in the engine.
KNOWN_NOT_PASSING = {
    # Random outputs: the expected values are one draw of the reference implementation's generator.
    "random ops": ["test_bernoulli", "test_bernoulli_double", "test_bernoulli_double_expanded",
                   "test_bernoulli_expanded", "test_bernoulli_seed", "test_bernoulli_seed_expanded",
                   "test_training_dropout", "test_training_dropout_default", "test_training_dropout_default_mask",
                   "test_training_dropout_mask"],
    # Values near zero differ by ~1e-5..3e-4 absolute: within fp32 FFT rounding, outside atol=1e-7.
    "DFT/STFT tolerance": ["test_dft", "test_dft_axis", "test_dft_inverse", "test_stft", "test_stft_with_window"],
    # ORT's own results differ from the reference for these cases.
    "ORT semantics": ["test_maxunpool_export_with_output_shape", "test_resize_downsample_scales_cubic_align_corners",
                      "test_resize_downsample_scales_linear_align_corners"],
    # ai.onnx.preview.training ops are not registered in ORT's inference build.
    "training ops": ["test_adagrad", "test_adagrad_multiple", "test_adam", "test_adam_multiple", "test_momentum",
                     "test_momentum_multiple", "test_nesterov_momentum"],
    # Recurrent layout=1 (batch-major) is not implemented by ORT's CPU RNN/GRU/LSTM.
    "RNN layout=1": ["test_gru_batchwise", "test_lstm_batchwise", "test_simple_rnn_batchwise"],
    # ORT has no int16 Max/Min kernel.
    "int16 Max/Min": ["test_max_int16", "test_min_int16"],
}

FAST_TESTS = ["test_abs", "test_add_bcast", "test_softmax_axis_0", "test_conv_with_strides_padding",
              "test_gemm_default_scalar_bias"]


@pytest.fixture(scope="module")
def suite():
    summary = runner.run_suite(str(DATA), engine="onnxruntime", device="cpu")
    runner.print_summary(summary)
    return summary


def test_named_tests_pass():
    names = [n for n in FAST_TESTS if (DATA / n / "model.onnx").is_file()]
    assert names, f"none of {FAST_TESTS} is in {DATA}"
    summary = runner.run_suite(str(DATA), names=names)
    for name in names:
        result = summary.results[name]
        assert result.status == "pass", f"{name}: {result.status}: {result.detail}"


def test_whole_suite_pass_count(suite):
    print(suite.line())
    assert len(suite.results) == len(runner.list_tests(str(DATA)))
    assert suite.passed >= MIN_PASSED, f"{suite.line()}; not passing: " + json.dumps(
        {n: r.detail for n, r in suite.results.items() if r.status in ("fail", "error")}, indent=1)


def test_whole_suite_no_new_failures(suite):
    known = {name for names in KNOWN_NOT_PASSING.values() for name in names}
    new = {n: f"{r.status}: {r.detail}" for n, r in suite.results.items()
           if r.status in ("fail", "error") and n not in known}
    assert not new, f"tests that fail or raise and are not known to: {json.dumps(new, indent=1)}"


def test_skips_say_why(suite):
    for name in suite.names("skip"):
        assert suite.results[name].detail, name


def test_whole_suite_in_a_child_process_does_not_crash(tmp_path):
    """The script, run as a program over every test, exits normally (no test crashed the process) and writes a
    result for every test folder."""
    out = tmp_path / "node_tests.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(xrt.__file__).resolve().parents[1])] + ([env["PYTHONPATH"]] if "PYTHONPATH" in env else []))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out), "--min-pass", str(MIN_PASSED)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    results = json.loads(out.read_text())
    assert sorted(results) == runner.list_tests(str(DATA))
    assert all(r["status"] in runner.STATUSES for r in results.values())
    assert "passed" in proc.stdout.splitlines()[-1]


# ---- the native engine ----------------------------------------------------------------------------------------
# Measured here: 862 passed, 7 failed, 4 errors, 59 skipped (the same 59 unrepresentable tests as above).
MIN_PASSED_NATIVE = 862

KNOWN_NOT_PASSING_NATIVE = {
    # Random outputs (see above); training-mode Dropout with ratio > 0 is refused (UnsupportedOperationError).
    "random ops": ["test_bernoulli", "test_bernoulli_double", "test_bernoulli_double_expanded",
                   "test_bernoulli_expanded", "test_bernoulli_seed", "test_bernoulli_seed_expanded",
                   "test_training_dropout", "test_training_dropout_default", "test_training_dropout_default_mask",
                   "test_training_dropout_mask"],
    # The expected output was made with epsilon 1e-2 while the node leaves epsilon at the schema's 1e-6.
    "inconsistent test data": ["test_adam_multiple"],
}


@pytest.fixture(scope="module")
def native_suite():
    summary = runner.run_suite(str(DATA), engine="native", device="cpu")
    runner.print_summary(summary)
    return summary


def test_native_engine_pass_count(native_suite):
    print(native_suite.line())
    assert native_suite.passed >= MIN_PASSED_NATIVE, f"{native_suite.line()}; not passing: " + json.dumps(
        {n: r.detail for n, r in native_suite.results.items() if r.status in ("fail", "error")}, indent=1)


def test_native_engine_no_new_failures(native_suite):
    known = {name for names in KNOWN_NOT_PASSING_NATIVE.values() for name in names}
    new = {n: f"{r.status}: {r.detail}" for n, r in native_suite.results.items()
           if r.status in ("fail", "error") and n not in known}
    assert not new, f"tests that fail or raise and are not known to: {json.dumps(new, indent=1)}"
