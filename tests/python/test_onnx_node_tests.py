"""The ONNX backend node tests (Debian's libonnx-testdata) through InferenceSession's onnxruntime engine on the
CPU, driven by scripts/run_onnx_node_tests.py imported as a module. The whole suite takes a few seconds per
engine here."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
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
# InferenceSession 36 tests are skipped: 12 use string values (xpuruntime tensors cannot hold them) and 24 sequences or
# optionals, which the onnxruntime engine refuses (it exchanges tensors only; the native engine runs them), so ORT's
# count is out of reach here. bfloat16 values travel as xpuruntime
# Tensors (the runner's docstring). Measured here (2026-11-21): 856 passed, 18 failed, 22 errors, 36 skipped; the
# threshold leaves a little room.
MIN_PASSED = 853

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
    # ORT's CPU provider has no kernel for these type combinations (ORT_NOT_IMPLEMENTED).
    "int16 Max/Min": ["test_max_int16", "test_min_int16"],
    "uint16 Max/Min/BitShift": ["test_max_uint16", "test_min_uint16", "test_bitshift_left_uint16",
                                "test_bitshift_right_uint16"],
    "Pow with unsigned exponents": ["test_pow_types_float32_uint32", "test_pow_types_float32_uint64"],
    # The model declares input 'like' as [3, 4] but the data set feeds shape [1] (ONNX 1.12's generator); the session
    # rejects a feed that contradicts the declared shape, as ONNX Runtime's own API does.
    "inconsistent test data": ["test_castlike_BFLOAT16_to_FLOAT", "test_castlike_BFLOAT16_to_FLOAT_expanded",
                               "test_castlike_FLOAT_to_BFLOAT16", "test_castlike_FLOAT_to_BFLOAT16_expanded"],
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
# Measured here (2026-11-21): 905 passed, 7 failed, 8 errors, 12 skipped (the string tests). The 24 sequence and
# optional tests pass (fed and compared as lists and None, as ONNX Runtime's Python API takes them). Everything else
# that does not pass is random or has inconsistent test data (below). ONNX Runtime's own API passes 883.
MIN_PASSED_NATIVE = 905

KNOWN_NOT_PASSING_NATIVE = {
    # Random outputs (see above); training-mode Dropout with ratio > 0 is refused (UnsupportedOperationError).
    "random ops": ["test_bernoulli", "test_bernoulli_double", "test_bernoulli_double_expanded",
                   "test_bernoulli_expanded", "test_bernoulli_seed", "test_bernoulli_seed_expanded",
                   "test_training_dropout", "test_training_dropout_default", "test_training_dropout_default_mask",
                   "test_training_dropout_mask"],
    # The expected output was made with epsilon 1e-2 while the node leaves epsilon at the schema's 1e-6; CastLike's
    # input 'like' is declared [3, 4] but fed with shape [1] (see KNOWN_NOT_PASSING).
    "inconsistent test data": ["test_adam_multiple", "test_castlike_BFLOAT16_to_FLOAT",
                               "test_castlike_BFLOAT16_to_FLOAT_expanded", "test_castlike_FLOAT_to_BFLOAT16",
                               "test_castlike_FLOAT_to_BFLOAT16_expanded"],
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


# The tests that need the unsigned 16/32/64-bit dtypes or bfloat16 values (fed and returned as xpuruntime Tensors).
UNSIGNED_AND_BFLOAT16_TESTS = (
    [f"test_bitshift_{d}_uint{w}" for d in ("left", "right") for w in (16, 32, 64)]
    + [f"test_{op}_uint{w}" for op in ("max", "min", "mod") for w in (16, 32, 64)]
    + ["test_pow_types_float32_uint32", "test_pow_types_float32_uint64", "test_cast_BFLOAT16_to_FLOAT",
       "test_cast_FLOAT_to_BFLOAT16"])


def test_native_engine_passes_the_unsigned_and_bfloat16_tests():
    names = [n for n in UNSIGNED_AND_BFLOAT16_TESTS if (DATA / n / "model.onnx").is_file()]
    assert len(names) == 19, names
    summary = runner.run_suite(str(DATA), engine="native", names=names)
    for name in names:
        assert summary.results[name].status == "pass", f"{name}: {summary.results[name].detail}"


def test_bfloat16_outputs_compare_as_values_within_one_unit_in_the_last_place():
    expected = np.array([0x3EF5, 0x3F80, 0x7FC0, 0xFF80], dtype=np.uint16)  # 0.478.., 1.0, NaN, -inf

    def tensor(bits):
        return xrt.from_numpy(np.array(bits, dtype=np.uint16)).view("bfloat16")

    assert runner.compare_bfloat16(expected, tensor(expected), 0) is None
    assert runner.compare_bfloat16(expected, tensor([0x3EF6, 0x3F80, 0x7FC1, 0xFF80]), 0) is None  # 1 ulp, any NaN
    assert "values differ" in runner.compare_bfloat16(expected, tensor([0x3EF7, 0x3F80, 0x7FC0, 0xFF80]), 0)
    assert "values differ" in runner.compare_bfloat16(expected, tensor([0x3EF5, 0x3F80, 0x7FC0, 0x7F80]), 0)
    assert "shape" in runner.compare_bfloat16(expected, tensor([0x3EF5]), 0)
    assert "bfloat16 xpuruntime Tensor" in runner.compare_bfloat16(expected, expected, 0)
    assert "bfloat16 xpuruntime Tensor" in runner.compare_bfloat16(expected, tensor(expected).view("uint16"), 0)
    np.testing.assert_array_equal(runner.bfloat16_to_float32(np.array([0x3F80, 0xC020], np.uint16)), [1.0, -2.5])


# The tests with sequence or optional inputs or outputs (lists and None through run()), and sequences inside.
SEQUENCE_AND_OPTIONAL_TESTS = (
    ["test_identity_opt", "test_identity_sequence", "test_if_opt", "test_if_seq", "test_loop13_seq",
     "test_loop16_seq_none", "test_optional_get_element", "test_optional_get_element_sequence",
     "test_optional_has_element", "test_optional_has_element_empty", "test_sequence_insert_at_back",
     "test_sequence_insert_at_front"]
    + [f"test_sequence_map_{case}{suffix}" for case in ("add_1_sequence_1_tensor", "add_2_sequences", "extract_shapes",
                                                        "identity_1_sequence", "identity_1_sequence_1_tensor",
                                                        "identity_2_sequences") for suffix in ("", "_expanded")])


def test_native_engine_passes_the_sequence_and_optional_tests():
    names = [n for n in SEQUENCE_AND_OPTIONAL_TESTS if (DATA / n / "model.onnx").is_file()]
    assert len(names) == 24, names
    summary = runner.run_suite(str(DATA), engine="native", names=names)
    for name in names:
        assert summary.results[name].status == "pass", f"{name}: {summary.results[name].detail}"
    # The onnxruntime engine exchanges tensors only: the same tests are skipped there, saying why.
    ort = runner.run_suite(str(DATA), engine="onnxruntime", names=names[:2])
    for name in names[:2]:
        assert ort.results[name].status == "skip" and "does not take" in ort.results[name].detail, ort.results[name]


def test_sequences_and_optionals_compare_per_element():
    a, b = np.array([1.0, 2.0], np.float32), np.array([3], np.int64)
    assert runner.compare_value([a, b], [a.copy(), b.copy()], 0) is None
    assert runner.compare_value(None, None, 0) is None
    assert runner.compare_value([], [], 0) is None
    assert "expected None" in runner.compare_value(None, a, 0)
    assert "got None" in runner.compare_value(a, None, 0)
    assert "expected a sequence" in runner.compare_value([a], a, 0)
    assert "a sequence of 1 elements, expected 2" in runner.compare_value([a, b], [a], 0)
    assert "(sequence element 1)" in runner.compare_value([a, b], [a, b.astype(np.int32)], 0)
    assert "values differ" in runner.compare_value([a], [a + 1], 0)
