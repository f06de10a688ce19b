"""The ``xpuruntime`` command line (src/python/xpuruntime/cli.py): every command on the CPU with the tiny classifier and
the tiny model zoo, usage errors (exit code 2, one line, no traceback), runtime errors (exit code 1) and compare's
mismatch exit code. The profiler-backed features (``profile``, ``explain --profile``) are skipped only while this
xpuruntime has no ``xpuruntime.profile``."""

from __future__ import annotations

import io
import json
import os
import pathlib
import shlex
import subprocess
import sys
from typing import List, Tuple

import numpy as np
import pytest

import xpuruntime as xrt
from xpuruntime import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "models" / "tiny_classifier.onnx"

requires_profiler = pytest.mark.skipif(not hasattr(xrt, "profile"),
                                       reason="this xpuruntime has no profiler yet (xpuruntime.profile)")


def _has_ort() -> bool:
    try:
        xrt.InferenceSession(str(TINY), engine="onnxruntime")
    except xrt.UnsupportedOperationError:
        return False
    return True


requires_ort = pytest.mark.skipif(not _has_ort(), reason="this build has no ONNX Runtime engine")


def run_cli(*args: str) -> Tuple[int, str, str]:
    """Runs ``cli.main(args)`` in this process: (exit code, stdout, stderr). argparse's own exits count too."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()


def run_process(*args: str, executable: List[str] = None) -> subprocess.CompletedProcess:
    command = (executable or [sys.executable, "-m", "xpuruntime"]) + [str(a) for a in args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ))


def assert_usage_error(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    pytest.importorskip("onnx", reason="the model zoo is generated with the onnx package (python3-onnx)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_model_zoo

    return make_model_zoo.generate(tmp_path_factory.mktemp("zoo"), tiny_only=True, dtypes=("fp32",))


# ---------------------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------------------


def test_python_dash_m_runs_the_cli():
    result = run_process("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"xpuruntime {xrt.__version__}"
    result = run_process("--help")
    assert result.returncode == 0
    for command in ("devices", "run", "bench", "explain", "profile", "tune", "compare"):
        assert command in result.stdout


def test_console_script_is_declared_and_installed_by_setup():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'xpuruntime = "xpuruntime.cli:main"' in pyproject
    launcher = pathlib.Path(sys.executable).parent / "xpuruntime"
    if not launcher.exists():
        pytest.skip(f"no {launcher}: scripts/setup.sh writes it into the project's .venv")
    result = run_process("devices", executable=[str(launcher)])
    assert result.returncode == 0, result.stderr
    assert "cpu" in result.stdout


def test_no_command_prints_help_and_exits_2():
    code, out, err = run_cli()
    assert code == 2
    assert "COMMAND" in err


# ---------------------------------------------------------------------------------------------------------------
# devices, run, bench
# ---------------------------------------------------------------------------------------------------------------


def test_devices_lists_the_cpu_and_the_build():
    code, out, err = run_cli("devices")
    assert code == 0, err
    assert out.startswith(f"xpuruntime {xrt.__version__}")
    assert "cpu" in out and f"engines on cpu: {', '.join(xrt.available_engines())}\n" in out
    # engines this build or no version has are listed as not available, each with what to do
    for name, reason in xrt.unavailable_engines().items():
        assert f"  not available: {name}: {reason}\n" in out
    assert "not available: tensorrt: the tensorrt engine (NVIDIA TensorRT 10) is not implemented" in out
    assert "pip install xpuruntime[tensorrt]" not in out
    code, out, err = run_cli("devices", "--json")
    data = json.loads(out)
    assert data["available_engines"]["cpu"] == xrt.available_engines()
    assert data["unavailable_engines"]["cpu"] == xrt.unavailable_engines()
    assert data["devices"][0]["type"] == "cpu"
    assert len(data["devices"]) == 1 + xrt.get_device_count()
    assert data["build"]["version"] == xrt.__version__


def test_run_prints_outputs_and_saves_them(tmp_path):
    out_file = tmp_path / "out.npz"
    code, out, err = run_cli("run", TINY, "--engine", "native", "--batch", "3", "--seed", "7", "--output", out_file)
    assert code == 0, err
    assert "output probs: float32[3, 4]" in out and "engine native" in out
    saved = np.load(out_file)
    feeds = cli.random_inputs(xrt.InferenceSession(str(TINY), engine="native"), batch=3, seed=7)
    expected = xrt.InferenceSession(str(TINY), engine="native").run(feeds)["probs"]
    np.testing.assert_allclose(saved["probs"], expected, rtol=1e-6)
    np.testing.assert_allclose(saved["probs"].sum(axis=1), 1.0, rtol=1e-5)


def test_run_reads_inputs_from_npz_and_npy(tmp_path):
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    np.save(tmp_path / "in.npy", x.astype(np.float64))  # float64 is cast to the model's float32
    expected = xrt.InferenceSession(str(TINY), engine="native").run({"x": x})["probs"]
    for name in ("in.npz", "in.npy"):
        code, out, err = run_cli("run", TINY, "--engine", "native", "--inputs", tmp_path / name, "-o", tmp_path / "o.npz")
        assert code == 0, err
        np.testing.assert_allclose(np.load(tmp_path / "o.npz")["probs"], expected, rtol=1e-6)


def test_engine_help_says_which_engines_are_available(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert f"available here on the CPU: {', '.join(xrt.available_engines())}" in text
    assert f"not available: {', '.join(xrt.unavailable_engines())}" in text and "tensorrt" in text


def _gather_model(path: pathlib.Path) -> pathlib.Path:
    """y = x[i] (Gather, axis 0): a float32 input and an int64 one."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"])], "gather",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_inputs_keep_their_dtypes_and_convert_only_without_changing_kind(tmp_path):
    model = _gather_model(tmp_path / "gather.onnx")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for indices in (np.array([3, 1], np.int64), np.array([3, 1], np.int32)):  # kept; int32 -> int64 is exact
        np.savez(tmp_path / "in.npz", x=x, i=indices)
        code, out, err = run_cli("run", model, "--engine", "native", "--inputs", tmp_path / "in.npz",
                                 "-o", tmp_path / "o.npz")
        assert code == 0, err
        assert "i: int64[2]" in out
        np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], x[[3, 1]])
    feeds = cli.load_inputs(xrt.InferenceSession(str(model), engine="native"), str(tmp_path / "in.npz"))
    assert feeds["i"].dtype == np.int64 and feeds["x"].dtype == np.float32
    # int64 data for the float32 input: refused, not silently cast to float32
    np.savez(tmp_path / "ints.npz", x=np.arange(12, dtype=np.int64).reshape(4, 3), i=np.array([0, 1]))
    code, out, err = run_cli("run", model, "--engine", "native", "--inputs", tmp_path / "ints.npz")
    assert_usage_error(code, err, "input 'x' expects float32, got int64 (converting would change its values' kind")
    # floats for the int64 indices: refused as well
    np.savez(tmp_path / "floats.npz", x=x, i=np.array([0.0, 1.0]))
    code, out, err = run_cli("run", model, "--engine", "native", "--inputs", tmp_path / "floats.npz")
    assert_usage_error(code, err, "input 'i' expects int64, got float64")


def test_a_device_that_does_not_exist_is_refused_before_running():
    count = xrt.get_device_count()
    code, out, err = run_cli("run", TINY, "--device", f"cuda:{count}")
    assert code == 1 and out == ""
    assert err.startswith("xpuruntime run: CudaError: ") and len(err.strip().splitlines()) == 1
    assert ("the only device here is cpu" if count == 0 else f"only {count} CUDA device") in err


def test_run_zoo_models_with_random_inputs(zoo):
    for stem in ("mlp_tiny", "bert_tiny", "resnet50_tiny"):
        code, out, err = run_cli("run", zoo[stem], "--engine", "native", "--batch", "2")
        assert code == 0, (stem, err)
        assert "output" in out
    # BERT's int64 token ids come from --int-range
    session = xrt.InferenceSession(str(zoo["bert_tiny"]), engine="native")
    feeds = cli.random_inputs(session, batch=2, int_range=(3, 9))
    (ids,) = feeds.values()
    assert ids.dtype == np.int64 and ids.shape[0] == 2 and ids.min() >= 3 and ids.max() < 9


def test_bench_reports_percentiles_and_throughput():
    code, out, err = run_cli("bench", TINY, "--engine", "native", "--warmup", "2", "-n", "30", "--batch", "4", "--json")
    assert code == 0, err
    data = json.loads(out)
    lat = data["latency_ms"]
    assert data["iterations"] == 30 and data["batch"] == 4 and data["engine"] == "native"
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert data["throughput"]["samples_per_s"] == pytest.approx(4 * data["throughput"]["runs_per_s"])
    assert err == ""  # stderr is not a terminal: no progress bar
    code, out, err = run_cli("bench", TINY, "--warmup", "0", "-n", "5")
    assert code == 0 and "p99" in out and "throughput" in out


def test_bench_draws_a_progress_bar_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert cli.main(["bench", str(TINY), "--warmup", "3", "-n", "10"]) == 0
    assert "\rbench   [" + "#" * 30 + "] 10/10\n" in tty.getvalue()
    assert "warm-up [" in tty.getvalue()
    tty.truncate(0)
    assert cli.main(["bench", str(TINY), "-n", "3", "--no-progress"]) == 0
    assert tty.getvalue().strip("\x00") == ""


# ---------------------------------------------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------------------------------------------


def test_explain_text_names_kernels_reasons_rejected_candidates_copies_and_memory():
    code, out, err = run_cli("explain", TINY, "--engine", "native", "--batch", "2")
    assert code == 0, err
    assert "engine:  native (requested by the session options)" in out
    assert "memory:  peak" in out
    assert "per run: " in out
    for node in ("fc1", "fc2", "softmax"):
        assert f"\n{node} " in out
    # every GPU kernel of linear is a rejected candidate on the CPU, with its reason
    assert "rejected candidates:" in out
    assert "fc1: cublasLt (cublasLt): runs on CUDA devices" in out


def test_explain_json_has_candidates_transfers_and_memory_plan(zoo):
    code, out, err = run_cli("explain", zoo["resnet50_tiny"], "--engine", "native", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == "xpuruntime.explain_report/1"
    assert data["engine"] == "native" and data["device"] == "cpu"
    assert data["memory"]["plan"]["peak_bytes"] > 0
    assert data["memory"]["plan"]["arena_bytes"] <= data["memory"]["plan"]["unshared_bytes"]
    assert data["transfers"]["reported_by_engine"] is True
    # on the CPU the output is written where the caller gets it (no copy out of the arena), nothing crosses a bus and
    # nothing syncs
    summary = data["transfers"]["summary"]
    assert summary["host_to_device_bytes"] == 0 and summary["syncs_per_run"] == 0
    assert summary["host_to_host_bytes"] == 0
    convs = [n for n in data["nodes"] if n["op"] in ("conv2d", "fused_conv2d") or "Conv" in n["op_type"]]
    assert convs
    for n in data["nodes"]:
        if not n["op"]:
            continue
        assert n["kernel"] and n["rule"] and n["policy_rule"]
        assert any(c["kernel"] == n["kernel"] and c["supported"] for c in n["candidates"])
        for c in n["rejected"]:
            assert c["reason"], (n["node"], c)


@requires_ort
def test_explain_onnxruntime_engine_says_copies_are_not_reported():
    code, out, err = run_cli("explain", TINY, "--engine", "onnxruntime")
    assert code == 0, err
    assert "engine:  onnxruntime" in out
    assert "not reported by this engine" in out
    assert "CPUExecutionProvider" in out


def test_explain_html_writes_a_self_contained_page(tmp_path):
    page = tmp_path / "report.html"
    code, out, err = run_cli("explain", TINY, "--engine", "native", "--format", "html", "-o", page)
    assert code == 0, err
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    data = json.loads(text.split('id="report-data">')[1].split("</script>")[0])
    assert [n["node"] for n in data["nodes"]] == ["fc1", "fc2", "softmax"]
    assert data["timeline"]["events"], "the HTML report always has a timeline"


@requires_profiler
def test_explain_profile_adds_per_node_times_from_the_profiler():
    code, out, err = run_cli("explain", TINY, "--engine", "native", "--profile", "--format", "json",
                             "--iterations", "2")
    assert code == 0, err
    data = json.loads(out)
    assert data["timeline"]["source"] == "profiler"
    assert any(e["cat"] == "node" for e in data["timeline"]["events"])
    timed = [n for n in data["nodes"] if n.get("time_us") is not None]
    assert {n["node"] for n in timed} == {"fc1", "fc2", "softmax"}
    assert sum(n["share"] for n in timed) == pytest.approx(1.0, abs=1e-3)


# ---------------------------------------------------------------------------------------------------------------
# profile
# ---------------------------------------------------------------------------------------------------------------


@requires_profiler
def test_profile_writes_a_chrome_trace_with_node_events(tmp_path, zoo):
    trace = tmp_path / "trace.json"
    code, out, err = run_cli("profile", zoo["mlp_tiny"], "--engine", "native", "-o", trace, "--iterations", "3")
    assert code == 0, err
    assert f"wrote {trace}" in out
    data = json.loads(trace.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    complete = [e for e in events if e.get("ph") == "X"]
    assert complete and all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in complete)
    names = {e["name"] for e in complete}
    assert sum(1 for e in complete if e["name"].startswith("iteration ")) == 3
    session = xrt.InferenceSession(str(zoo["mlp_tiny"]), engine="native")
    session.run(cli.random_inputs(session))
    assert any(n["node"] in " ".join(names) for n in session.explain().nodes)


@requires_profiler
@requires_ort
def test_profile_onnxruntime_engine_shows_ort_nodes(tmp_path):
    trace = tmp_path / "trace.json"
    code, out, err = run_cli("profile", TINY, "--engine", "onnxruntime", "-o", trace, "--iterations", "2")
    assert code == 0, err
    assert "CPUExecutionProvider" in out  # the summary table: ORT's nodes with their execution provider
    events = json.loads(trace.read_text())["traceEvents"]
    nodes = [e for e in events if e.get("ph") == "X" and e.get("cat") == "node"]
    session = xrt.InferenceSession(str(TINY), engine="onnxruntime")
    session.run(cli.random_inputs(session))
    explained = [n["node"] for n in session.explain().nodes]
    assert explained and [e["name"] for e in nodes] == explained * 2
    assert all(e["args"]["backend"] == "CPUExecutionProvider" and e["args"]["engine"] == "onnxruntime" for e in nodes)
    assert sum(1 for e in events if e.get("name") == "onnxruntime run") == 2


def test_profile_without_a_profiler_is_a_clean_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_profiler_factory", lambda: None)
    code, out, err = run_cli("profile", TINY, "-o", tmp_path / "t.json")
    assert code == 1
    assert "has no profiler" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# tune
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--batch", "3"]])
def test_tunes_follow_up_command_works_as_printed(tmp_path, monkeypatch, extra):
    # The printed follow-up once said `--policy policy.lock.json` alone, which the default engine (auto ->
    # onnxruntime on the CPU) refuses: it cannot honour pinned kernels.
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("tune", TINY, "-o", "policy.lock.json", *extra)
    assert code == 0, err
    printed = [line.strip() for line in out.splitlines() if line.strip().startswith("xpuruntime run ")]
    assert len(printed) == 1, out
    argv = shlex.split(printed[0])[1:]
    assert argv[:2] == ["run", str(TINY)] and "--policy" in argv and "--engine" in argv
    result = run_process(*argv)  # as a user would paste it: a new process, in the folder tune wrote to
    assert result.returncode == 0, result.stderr
    assert "engine native on cpu" in result.stdout


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_tune_writes_a_policy_that_reproduces_the_same_kernels(tmp_path, zoo, suffix):
    if suffix == ".yaml":
        try:
            xrt.KernelPolicy().to_yaml()
        except xrt.UnsupportedOperationError:
            pytest.skip("this build has no yaml-cpp (YAML policy files)")
    model = zoo["resnet50_tiny"]
    policy_file = tmp_path / f"policy.lock{suffix}"
    code, out, err = run_cli("tune", model, "-o", policy_file, "--batch", "2")
    assert code == 0, err
    assert f"wrote {policy_file}" in out and "autotuned" in out
    policy = xrt.KernelPolicy.load(policy_file)
    # the tuned session: BestPerformance timed every supported kernel
    tuned = xrt.InferenceSession(str(model), engine="native", kernel_policy=xrt.KernelPolicy(auto_strategy="BestPerformance"))
    feeds = cli.random_inputs(tuned, batch=2)
    tuned.run(feeds)
    tuned_nodes = [n for n in tuned.explain().nodes if n["op"]]
    assert tuned_nodes and all(n["rule"] == "autotuned" for n in tuned_nodes)
    # every op pinned to what ran ...
    assert policy.preferences == {n["op"]: f"pin:{n['kernel']}" for n in tuned_nodes}
    # ... and a session under the loaded file runs the same kernel on every node, each pinned
    pinned = xrt.InferenceSession(str(model), engine="native", kernel_policy=policy)
    pinned.run(feeds)
    replayed = {n["node"]: n for n in pinned.explain().nodes if n["op"]}
    assert {k: n["kernel"] for k, n in replayed.items()} == {n["node"]: n["kernel"] for n in tuned_nodes}
    assert all(n["rule"] == "pinned" for n in replayed.values())
    # and through the CLI: explain --policy shows the same
    code, out, err = run_cli("explain", model, "--engine", "native", "--policy", policy_file, "--format", "json")
    assert code == 0, err
    assert {n["node"]: n["kernel"] for n in json.loads(out)["nodes"] if n["op"]} == \
        {n["node"]: n["kernel"] for n in tuned_nodes}


def test_tune_gives_conflicting_nodes_a_preferred_rule():
    class Explanation:
        nodes = [
            {"node": "a", "op": "matmul", "kernel": "cublasLt", "rule": "autotuned", "candidates": []},
            {"node": "b", "op": "matmul", "kernel": "cublas", "rule": "autotuned", "candidates": []},
            {"node": "c", "op": "matmul", "kernel": "cublasLt", "rule": "autotuned", "candidates": []},
            {"node": "d", "op": "softmax", "kernel": "cpu", "rule": "autotuned", "candidates": []},
            {"node": "v", "op": "", "kernel": "view", "rule": "", "candidates": []},
        ]

    policy, decisions, conflicts = cli.resolved_policy(Explanation())
    assert conflicts == ["matmul"]
    assert policy.preferences == {"matmul": "cublasLt,cublas", "softmax": "pin:cpu"} or \
        policy.rules["matmul"] == {"mode": "preferred", "kernels": ["cublasLt", "cublas"]}
    assert policy.get("softmax") == "pin:cpu"
    assert decisions["matmul"][0] == ["cublasLt", "cublas"]


@requires_ort
def test_tune_with_an_engine_without_a_dispatcher_fails_cleanly(tmp_path):
    code, out, err = run_cli("tune", TINY, "--engine", "onnxruntime", "-o", tmp_path / "p.json")
    assert code == 1
    assert "makes no kernel decisions" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------------------------------


@requires_ort
@pytest.mark.parametrize("stem", ["mlp_tiny", "bert_tiny", "resnet50_tiny"])
def test_compare_native_and_onnxruntime_agree_on_the_zoo(zoo, stem):
    code, out, err = run_cli("compare", zoo[stem], "--batch", "2", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["passed"] and data["engines"] == ["native", "onnxruntime"] and data["reference"] == "onnxruntime"
    for stats in data["outputs"].values():
        assert stats["mismatches"] == 0 and stats["max_abs"] < 1e-3


@requires_ort
def test_compare_intermediates_compares_every_node_output(zoo):
    code, out, err = run_cli("compare", zoo["bert_tiny"], "--intermediates", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    import onnx

    model = onnx.load(str(zoo["bert_tiny"]))
    produced = [o for node in model.graph.node for o in node.output if o]
    compared = [i["value"] for i in data["intermediates"]]
    assert compared == [o for o in produced if o not in data["skipped_intermediates"]]
    assert len(compared) > 0.9 * len(produced)
    assert data["first_diverging_node"] is None
    assert list(data["outputs"]) == [o.name for o in model.graph.output]


@requires_ort
def test_compare_exits_1_on_a_mismatch_with_a_tiny_tolerance(zoo):
    # two implementations of BERT's LayerNorm, GELU and softmax do not agree to the last bit
    result = run_process("compare", zoo["bert_tiny"], "--atol", "0", "--rtol", "0", "--intermediates")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and "first diverging node: " in result.stdout
    assert "Traceback" not in result.stderr


@requires_ort
def test_compare_finds_the_first_diverging_node_of_a_corrupted_engine(monkeypatch):
    """A native engine that corrupts fc2's output (logits): compare must name fc2, not fc1 (before it, fine) nor
    softmax (after it, diverging only because of fc2)."""
    real = xrt.InferenceSession

    class Corrupted(real):
        def run(self, *args, **kwargs):
            outputs = super().run(*args, **kwargs)
            if self.engine == "native" and "logits" in outputs:
                outputs["logits"] = outputs["logits"] + 0.5
                outputs["probs"] = outputs["probs"] * 0.9
            return outputs

    monkeypatch.setattr(xrt, "InferenceSession", Corrupted)
    code, out, err = run_cli("compare", TINY, "--intermediates", "--json", "--batch", "3")
    assert code == 1, err
    data = json.loads(out)
    assert not data["passed"]
    first = data["first_diverging_node"]
    assert (first["node"], first["op_type"], first["value"]) == ("fc2", "Gemm", "logits")
    assert first["max_abs"] == pytest.approx(0.5, rel=1e-5) and first["mismatches"] == 12
    by_value = {i["value"]: i for i in data["intermediates"]}
    assert by_value["h"]["passed"] and by_value["a"]["passed"] and not by_value["probs"]["passed"]
    code, out, err = run_cli("compare", TINY, "--intermediates", "--batch", "3")
    assert code == 1
    assert "first diverging node: fc2 (Gemm), output 'logits'" in out and out.rstrip().endswith("FAILED")


def _corrupted_unless(monkeypatch, culprit, needs=None):
    """xrt.InferenceSession whose native runs add 0.5 to the probabilities unless graph pass `culprit` is off (None:
    always, as a wrong kernel would); one without pass `needs` cannot be made (as a CUDA plan without
    op_decomposition)."""
    real = xrt.InferenceSession

    class Corrupted(real):
        def __init__(self, *args, disabled_passes=None, **kwargs):
            if needs is not None and needs in (disabled_passes or []):
                raise xrt.UnsupportedOperationError(f"cannot run without {needs}")
            super().__init__(*args, disabled_passes=disabled_passes, **kwargs)
            self.corrupt = culprit is None or culprit not in (disabled_passes or [])

        def run(self, *args, **kwargs):
            outputs = super().run(*args, **kwargs)
            if self.engine == "native" and self.corrupt:
                outputs["probs"] = outputs["probs"] + 0.5
            return outputs

    monkeypatch.setattr(xrt, "InferenceSession", Corrupted)


def test_graph_passes_lists_what_disabled_passes_takes_in_plan_order():
    passes = xrt.graph_passes()
    names = list(passes)
    assert names[0] == "constant_folding" and {"gemm_fusion", "nhwc_layout", "elementwise_fusion"} <= set(names)
    assert names.index("op_decomposition") < names.index("nhwc_layout") < names.index("elementwise_fusion")
    assert all(isinstance(doc, str) and doc for doc in passes.values())
    xrt.InferenceSession(str(TINY), engine="native", disabled_passes=names)  # every one is a valid name
    with pytest.raises(xrt.InvalidArgumentError, match="valid names: constant_folding, "):
        xrt.InferenceSession(str(TINY), engine="native", disabled_passes=["no_such_pass"])


def test_compare_bisect_passes_names_the_pass_a_mismatch_goes_with(monkeypatch):
    _corrupted_unless(monkeypatch, "gemm_fusion")
    code, out, err = run_cli("compare", TINY, "--bisect-passes", "--json", "--batch", "3", "--reference-device", "cpu")
    assert code == 1, err
    data = json.loads(out)
    bisect = data["bisect_passes"]
    assert data["reference_device"] == "cpu" and not data["passed"]
    assert bisect["culprits"] == ["gemm_fusion"] and bisect["all_off"]["passed"]
    assert [e["pass"] for e in bisect["each_off"]] == list(xrt.graph_passes())
    off = {e["pass"]: e for e in bisect["each_off"]}
    assert off["constant_folding"]["max_abs"] == pytest.approx(0.5, rel=1e-5) and not off["constant_folding"]["passed"]
    code, out, err = run_cli("compare", TINY, "--bisect-passes", "--batch", "3")
    assert code == 1 and "the mismatch goes with: gemm_fusion" in out and "every pass off" in out


def test_compare_bisect_passes_points_at_a_kernel_when_no_pass_explains_it(monkeypatch):
    _corrupted_unless(monkeypatch, None, needs="op_decomposition")
    code, out, err = run_cli("compare", TINY, "--bisect-passes", "--batch", "2")
    assert code == 1, err
    assert "the mismatch stays with every pass off: a kernel" in out and out.rstrip().endswith("FAILED")
    assert "every pass off but op_decomposition (needed to run here)" in out
    assert "op_decomposition off" in out and "UnsupportedOperationError: cannot run without op_decomposition" in out


def test_compare_bisect_passes_skips_agreement_and_needs_the_native_engine_first():
    code, out, err = run_cli("compare", TINY, "--bisect-passes", "--json")
    assert code == 0, err
    assert json.loads(out)["bisect_passes"] == {"skipped": "no mismatch"}
    result = run_process("compare", TINY, "--bisect-passes", "--engines", "onnxruntime,native")
    assert result.returncode == 2 and "engine A must be native" in result.stderr
    assert "Traceback" not in result.stderr


def test_error_stats_tolerances_and_nans():
    ref = np.array([1.0, 2.0, np.nan, 0.0], np.float32)
    same = cli.error_stats(ref.copy(), ref, rtol=0, atol=0)
    assert same["passed"] and same["max_abs"] == 0 and same["mismatches"] == 0
    off = cli.error_stats(np.array([1.001, 2.0, np.nan, 1e-6], np.float32), ref, rtol=1e-3, atol=1e-5)
    assert off["passed"]  # 0.001 <= 1e-5 + 1e-3 * 1; 1e-6 <= 1e-5
    bad = cli.error_stats(np.array([1.1, 2.0, 0.0, 0.0], np.float32), ref, rtol=1e-3, atol=1e-5)
    assert not bad["passed"] and bad["mismatches"] == 2  # 1.1 vs 1, and a number where the reference is NaN
    assert bad["max_abs"] == pytest.approx(0.1, rel=1e-5)
    shape = cli.error_stats(np.zeros(3), np.zeros(4), rtol=1, atol=1)
    assert not shape["passed"] and "shape" in shape["note"]


# ---------------------------------------------------------------------------------------------------------------
# Usage errors: exit code 2, one line, no traceback
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def bad_files(tmp_path):
    files = {
        "bad_json": tmp_path / "bad.json",
        "unknown_kernel": tmp_path / "unknown.json",
        "policy_txt": tmp_path / "policy.txt",
        "wrong_name": tmp_path / "wrong_name.npz",
        "wrong_shape": tmp_path / "wrong_shape.npz",
        "wrong_dtype": tmp_path / "wrong_dtype.npz",
        "not_npz": tmp_path / "not.npz",
        "garbage_model": tmp_path / "garbage.onnx",
    }
    files["bad_json"].write_text('{"rules": {"matmul": ')
    files["unknown_kernel"].write_text('{"rules": {"matmul": "no_such_kernel"}}')
    files["policy_txt"].write_text("{}")
    np.savez(files["wrong_name"], y=np.zeros((1, 8), np.float32))
    np.savez(files["wrong_shape"], x=np.zeros((1, 9), np.float32))
    np.savez(files["wrong_dtype"], x=np.zeros((1, 8), np.complex64))
    files["not_npz"].write_text("not an archive")
    files["garbage_model"].write_bytes(b"\x08\x07garbage that is not an onnx model" * 3)
    return files


USAGE_ERRORS = [
    (["run", "missing.onnx"], "model file 'missing.onnx' does not exist"),
    (["run", "{TINY}", "--engine", "warp"], "invalid choice: 'warp'"),
    (["run", "{TINY}", "--device", "tpu:0"], "device"),
    (["run", "{TINY}", "--policy", "{bad_json}"], "bad.json"),
    (["run", "{TINY}", "--policy", "{unknown_kernel}"], "no_such_kernel"),
    (["run", "{TINY}", "--policy", "{policy_txt}"], "expected a .json, .yaml or .yml file"),
    (["run", "{TINY}", "--policy", "missing.json"], "policy file 'missing.json' does not exist"),
    (["run", "{TINY}", "--inputs", "missing.npz"], "inputs file 'missing.npz' does not exist"),
    (["run", "{TINY}", "--inputs", "{wrong_name}"], "unknown input(s) y; the model's inputs are: x"),
    (["run", "{TINY}", "--inputs", "{wrong_shape}"], "input 'x' expects shape [batch, 8] (float32), got [1, 9]"),
    (["run", "{TINY}", "--inputs", "{wrong_dtype}"], "input 'x' expects float32, got complex64"),
    (["run", "{TINY}", "--inputs", "{not_npz}"], "cannot read --inputs"),
    (["run", "{garbage_model}"], "garbage.onnx"),
    (["bench", "{TINY}", "--batch", "0"], "expected a positive integer, got 0"),
    (["bench", "{TINY}", "--iterations", "many"], "expected a positive integer, got 'many'"),
    (["run", "{TINY}", "--int-range", "5,1"], "expected LOW < HIGH"),
    (["explain", "{TINY}", "--format", "pdf"], "invalid choice: 'pdf'"),
    (["explain", "{TINY}", "-o", "/no/such/folder/r.html"], "does not exist"),
    (["profile", "{TINY}"], "the following arguments are required: --output/-o"),
    (["tune", "{TINY}", "-o", "policy.txt"], "expected a .json, .yaml or .yml file"),
    (["compare", "{TINY}", "--engines", "native"], "--engines takes two engines"),
    (["compare", "{TINY}", "--engines", "native,warp"], "unknown engine 'warp'"),
    (["compare", "{TINY}", "--rtol", "-1"], "expected a number >= 0"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
]


@pytest.mark.parametrize("argv,needle", USAGE_ERRORS, ids=[" ".join(a[:3]) for a, _ in USAGE_ERRORS])
def test_bad_arguments_are_one_line_usage_errors(argv, needle, bad_files):
    values = {"TINY": str(TINY), **{k: str(v) for k, v in bad_files.items()}}
    code, out, err = run_cli(*[a.format(**values) for a in argv])
    assert_usage_error(code, err, needle)


def test_usage_errors_from_a_separate_process_have_no_traceback(bad_files):
    result = run_process("run", TINY, "--policy", bad_files["unknown_kernel"])
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("xpuruntime run: error: ")


def test_runtime_errors_exit_1_with_one_line():
    code, out, err = run_cli("run", TINY, "--engine", "tensorrt")
    assert code == 1
    assert err.startswith("xpuruntime run: UnsupportedOperationError: ") and "TensorRT" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_traceback_flag_shows_the_exception():
    with pytest.raises(xrt.UnsupportedOperationError):
        cli.main(["--traceback", "run", str(TINY), "--engine", "tensorrt"])
