"""CUDA faults (docs/reliability.md, Note [Sticky CUDA errors] and Note [Errors name their node]): a kernel fault
makes the device unusable with a clear, typed error everywhere instead of failures at random places later; errors
raised while a step runs name their node. The fault runs in a process of its own: it ruins that process's CUDA
context."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

MODEL = "models/suite/tiny/bert.dynamo.float32.onnx"


def test_device_fault_is_empty_without_a_fault():
    assert xrt._core.device_fault("cpu") == ""


@requires_gpu
def test_a_kernel_fault_marks_the_device_unusable(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np, xpuruntime as xrt
        data = np.load("models/suite/tiny/bert.npz")
        sess = xrt.InferenceSession("{MODEL}", device="cuda:0", engine="native")
        feeds = {{i.name: data["in." + i.name] for i in sess.get_inputs()}}
        sess.run(feeds)
        xrt._core._inject_device_fault("cuda:0")
        try:
            xrt.synchronize("cuda:0")
            print("NO FAULT")
        except xrt.CudaError as e:
            print("FAULT", "sticky" in str(e), "IllegalAddress" in str(e))
        print("RECORDED", "IllegalAddress" in xrt._core.device_fault("cuda:0"))
        for what, call in (("RUN", lambda: sess.run(feeds)),
                           ("NEW", lambda: xrt.InferenceSession("{MODEL}", device="cuda:0").run(feeds)),
                           ("OP", lambda: xrt.ops.relu(xrt.from_numpy(np.ones(4, np.float32)).to("cuda:0")))):
            try:
                call()
                print(what, "ran")
            except xrt.CudaError as e:
                print(what, "unusable" in str(e) and "IllegalAddress" in str(e))
        print(np.asarray(xrt.InferenceSession("{MODEL}", device="cpu", engine="native").run(feeds)["last_hidden_state"]).shape)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "FAULT True True" in lines, done.stdout
    assert "RECORDED True" in lines
    for what in ("RUN", "NEW", "OP"):
        assert f"{what} True" in lines, done.stdout
    assert lines[-1].startswith("(")  # the CPU still works


def test_errors_during_a_step_name_the_node():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    table = helper.make_tensor("table", TensorProto.FLOAT, [5, 3], np.arange(15, dtype=np.float32).tolist())
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup_rows")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [2, 3])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = xrt.InferenceSession(model.SerializeToString(), device="cpu", engine="native")
    np.testing.assert_array_equal(sess.run({"ids": np.array([4, 0])})["rows"], [[12, 13, 14], [0, 1, 2]])
    with pytest.raises(xrt.InvalidArgumentError, match=r"^node 'lookup_rows' \(Gather, kernel cpu\): "):
        sess.run({"ids": np.array([4, 7])})


def _tiny_bert(device):
    data = np.load("models/suite/tiny/bert.npz")
    session = xrt.InferenceSession(MODEL, device=device, engine="native")
    feeds = {i.name: data["in." + i.name] for i in session.get_inputs()}
    return session, feeds


def _outputs(result):
    return {k: np.asarray(v.cpu().numpy() if hasattr(v, "cpu") else v) for k, v in result.items()}


@pytest.fixture
def repo_root(monkeypatch):
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    return root


def test_out_of_memory_in_a_step_names_the_node_and_the_session_goes_on(repo_root):
    """Note [Failed captures]: an out-of-memory raised while a step runs is an OutOfMemoryError naming the node; the
    next run of the same session works."""
    session, feeds = _tiny_bert("cpu")
    expected = _outputs(session.run(feeds))
    node = session.explain().nodes[3]["node"]
    xrt._core._inject_step_fault(node, "oom")
    with pytest.raises(xrt.OutOfMemoryError, match=f"node '{node}'.*injected"):
        session.run(feeds)
    for name, value in _outputs(session.run(feeds)).items():
        np.testing.assert_array_equal(value, expected[name])


@requires_gpu
@pytest.mark.parametrize("kind", ["capture", "oom"])
def test_a_failed_capture_raises_at_its_node_and_the_session_goes_on(repo_root, kind):
    """The second run captures the plan; a step that breaks the capture (a synchronization inside it) or runs out of
    memory there raises a typed error naming the node; the session's next runs work: eagerly after a broken capture
    (explain says why), captured again after an out-of-memory."""
    session, feeds = _tiny_bert("cuda:0")
    expected = _outputs(session.run(feeds))
    node = session.explain().nodes[2]["node"]
    xrt._core._inject_step_fault(node, kind)
    with pytest.raises(xrt.OutOfMemoryError if kind == "oom" else xrt.XpuRuntimeError, match=f"node '{node}'"):
        session.run(feeds)
    assert xrt._core.device_fault("cuda:0") == ""  # nothing sticky
    for _ in range(3):
        for name, value in _outputs(session.run(feeds)).items():
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-5)
    options = " ".join(session.explain().options)
    if kind == "capture":
        assert "capture failed" in options, options
    else:
        assert "captured and replayed" in options, options


@requires_gpu
def test_device_out_of_memory_leaves_the_session_usable(repo_root):
    """A device memory limit below what a run needs makes the run an OutOfMemoryError; lifting it lets the same
    session run again."""
    session, feeds = _tiny_bert("cuda:0")
    expected = _outputs(session.run(feeds))
    before = xrt.runtime.get_memory_limit("cuda:0")
    xrt.runtime.empty_cache("cuda:0")  # what is reserved now is in use: any new block must be reserved
    xrt.runtime.set_memory_limit(1, "cuda:0")
    try:
        with pytest.raises(xrt.OutOfMemoryError, match="memory limit"):
            fresh = xrt.InferenceSession(MODEL, device="cuda:0", engine="native")
            fresh.run(feeds)
    finally:
        xrt.runtime.set_memory_limit(before, "cuda:0")
    for name, value in _outputs(session.run(feeds)).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-5)
