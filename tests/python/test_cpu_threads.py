"""The native engine's CPU worker threads (docs/native_engine.md, "CPU threads"; Note [CPU worker threads] in
src/cpp/backends/cpu/cpu_threads.cpp): the default thread count follows the CPUs the process may use (its affinity
mask, here set with ``taskset``), no worker thread is started where one CPU is all there is, results do not depend
on the thread count or the spin setting, and ExecutionPolicy.allow_spinning is parsed and validated like the other
fields. Speed is not asserted here (benchmarks/cpu_load_bench.py measures it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xpuruntime as xrt


def small_cnn(path) -> str:
    """Conv(3x3) + Relu -> MaxPool -> Conv(1x1) -> Reshape -> MatMul over a [1, 8, 20, 20] input: loops large
    enough to be shared among threads."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 16, 1, 1)).astype(np.float32) * 0.2, "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"]),
        helper.make_node("Reshape", ["c2", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w3t"], ["y"]),
    ]
    shape = numpy_helper.from_array(np.array([1, -1, 100], dtype=np.int64), "shape")
    w3t = numpy_helper.from_array(rng.standard_normal((100, 10)).astype(np.float32) * 0.2, "w3t")
    graph = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  [1, 8, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[w1, w2, shape, w3t])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def feeds():
    return {"x": np.random.default_rng(1).standard_normal((1, 8, 20, 20)).astype(np.float32)}


def thread_reasons(session) -> set:
    """The thread counts the plan's cpu kernels report in explain() ("[cpu reference, 2 threads, ...]")."""
    text = str(session.explain())
    return {part.split("cpu reference, ")[1].split(",")[0].split("]")[0] for part in text.splitlines()
            if "cpu reference, " in part}


def test_default_threads_are_the_usable_cpus(tmp_path):
    session = xrt.InferenceSession(small_cnn(tmp_path / "m.onnx"), device="cpu", engine="native")
    cpus = len(os.sched_getaffinity(0))
    if "OMP_NUM_THREADS" in os.environ:
        pytest.skip("OMP_NUM_THREADS lowers the default thread count")
    assert thread_reasons(session) == {f"{cpus} thread" + ("" if cpus == 1 else "s")}


PROBE = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import xpuruntime as xrt
    before = len(os.listdir("/proc/self/task"))
    session = xrt.InferenceSession(sys.argv[1], device="cpu", engine="native")
    x = np.random.default_rng(1).standard_normal((1, 8, 20, 20)).astype(np.float32)
    for _ in range(5):
        y = session.run({"x": x})["y"]
    after = len(os.listdir("/proc/self/task"))
    reasons = sorted({line.split("cpu reference, ")[1].split(",")[0].split("]")[0]
                      for line in str(session.explain()).splitlines() if "cpu reference, " in line})
    print(json.dumps({"cpus": len(os.sched_getaffinity(0)), "reasons": reasons, "before": before,
                      "after": after, "y": np.asarray(y).ravel().tolist()}))
""")


def probe_under_taskset(cpus: str, path: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    done = subprocess.run(["taskset", "-c", cpus, sys.executable, "-c", PROBE, path], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_one_cpu_under_taskset_means_one_thread_and_no_worker(tmp_path):
    path = small_cnn(tmp_path / "m.onnx")
    probe = probe_under_taskset("0", path)
    assert probe["cpus"] == 1
    assert probe["reasons"] == ["1 thread"]
    assert probe["after"] == probe["before"], "a worker thread was started on a one-CPU affinity mask"
    # The same numbers as this process computes with its own threads.
    session = xrt.InferenceSession(path, device="cpu", engine="native")
    np.testing.assert_array_equal(np.asarray(probe["y"], dtype=np.float32),
                                  np.asarray(session.run(feeds())["y"]).ravel())


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two CPUs")
def test_two_cpus_under_taskset_mean_two_threads_and_one_worker(tmp_path):
    first_two = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))[:2])
    probe = probe_under_taskset(first_two, small_cnn(tmp_path / "m.onnx"))
    assert probe["cpus"] == 2
    assert probe["reasons"] == ["2 threads"]
    assert probe["after"] - probe["before"] <= 1, "more workers than the affinity mask's CPUs less the caller"


def test_results_do_not_depend_on_threads_or_spinning(tmp_path):
    path = small_cnn(tmp_path / "m.onnx")
    results = []
    for threads in (1, 2, 3, 5):
        for spin in (True, False):
            policy = xrt.ExecutionPolicy(intra_op_threads=threads, allow_spinning=spin)
            session = xrt.InferenceSession(path, device="cpu", engine="native", exec_policy=policy)
            results.append(np.asarray(session.run(feeds())["y"]))
            if threads > 1 and not spin:
                assert thread_reasons(session) == {f"{threads} threads"}
                assert "no spinning" in str(session.explain())
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


def test_allow_spinning_field():
    default = xrt.ExecutionPolicy()
    assert default.allow_spinning is True
    assert "allow_spinning" not in json.loads(default.to_json())  # policies written before the key keep their bytes
    parked = xrt.ExecutionPolicy(allow_spinning=False)
    assert json.loads(parked.to_json())["allow_spinning"] is False
    assert xrt.ExecutionPolicy.from_json(parked.to_json()) == parked
    assert parked.fingerprint != default.fingerprint
    assert "allow_spinning=false" in repr(parked)
    assert parked.to_dict()["allow_spinning"] is False
    with pytest.raises(xrt.InvalidArgumentError, match="'allow_spinning' must be True or False, got 'no'"):
        xrt.ExecutionPolicy(allow_spinning="no")
    with pytest.raises(xrt.InvalidArgumentError, match="'allow_spinning' must be true or false, got 1"):
        xrt.ExecutionPolicy.from_json('{"allow_spinning": 1}')
    with pytest.raises(xrt.InvalidArgumentError, match="allow_spinning"):
        xrt.ExecutionPolicy(allow_spining=False)  # the unknown field's message lists the valid ones
