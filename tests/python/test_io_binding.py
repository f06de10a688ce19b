"""I/O binding (InferenceSession.io_binding / run_with_iobinding, ONNX Runtime's API): inputs and outputs bound
once, outputs written in place or returned on a device, the same values as run(), typed errors for bad bindings.
The CUDA part (ORT's CUDA graphs replayed over the bound tensors) runs only with a GPU."""

import pathlib
import sys

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import make_model_zoo as zoo  # noqa: E402

ENGINES = ("native", "onnxruntime")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return zoo.generate(tmp_path_factory.mktemp("zoo"), tiny_only=True)


def make_session(path, engine, device="cpu", **kwargs):
    try:
        return xrt.InferenceSession(path, engine=engine, device=device, **kwargs)
    except xrt.UnsupportedOperationError as error:
        pytest.skip(f"engine {engine} unavailable: {error}")


def feeds_for(session, batch, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        shape = [batch if isinstance(d, str) else d for d in info.shape]
        if info.dtype.startswith("int"):
            feeds[info.name] = rng.integers(0, 50, size=shape).astype(info.dtype)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
    return feeds


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model", ["mlp_tiny", "bert_tiny"])
def test_outputs_bound_in_place_match_run(models, engine, model):
    session = make_session(models[model], engine)
    for batch, seed in ((2, 0), (2, 1), (3, 2)):
        feeds = feeds_for(session, batch, seed)
        expected = session.run(feeds)
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_input(name, value)
        outs = {o.name: xrt.empty(list(expected[o.name].shape), dtype=o.dtype) for o in session.get_outputs()}
        for name, tensor in outs.items():
            binding.bind_output(name, tensor)
        before = {name: t.data_ptr for name, t in outs.items()}
        session.run_with_iobinding(binding)
        results = binding.get_outputs()
        for (name, tensor), result in zip(outs.items(), results):
            assert result.data_ptr == before[name], "a tensor bound in place must be the output itself"
            np.testing.assert_allclose(tensor.numpy(), expected[name], rtol=1e-5, atol=1e-5)
        # A second run with other values in the same bound input memory.
        for name, value in feeds.items():
            if value.dtype.kind == "f":
                value *= 0.5
        expected = session.run(feeds)
        session.run_with_iobinding(binding)
        for name, array in zip(outs, binding.copy_outputs_to_cpu()):
            np.testing.assert_allclose(array, expected[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
def test_outputs_bound_to_a_device_are_new_tensors(models, engine):
    session = make_session(models["mlp_tiny"], engine)
    feeds = feeds_for(session, 4)
    (out_name,) = [o.name for o in session.get_outputs()]
    binding = session.io_binding()
    binding.bind_cpu_input(*next(iter(feeds.items())))
    binding.bind_output(out_name, "cpu")
    session.run_with_iobinding(binding)
    first = binding.get_outputs()[0]
    session.run_with_iobinding(binding)
    second = binding.get_outputs()[0]
    assert first.data_ptr != second.data_ptr
    np.testing.assert_allclose(second.numpy(), session.run(feeds)[out_name], rtol=1e-5, atol=1e-6)
    binding.clear_binding_outputs()
    assert binding.get_outputs() == []
    binding.bind_output(out_name)  # the session's device
    session.run_with_iobinding(binding)
    assert binding.get_outputs()[0].device.type == "cpu"


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_bindings_raise_typed_errors(models, engine):
    session = make_session(models["mlp_tiny"], engine)
    feeds = feeds_for(session, 2)
    (in_name,) = feeds
    (out_name,) = [o.name for o in session.get_outputs()]
    binding = session.io_binding()
    with pytest.raises(xrt.InvalidArgumentError, match="unknown input 'nope'; the model's inputs are"):
        binding.bind_input("nope", feeds[in_name])
    with pytest.raises(xrt.InvalidTypeError, match="is float32, the bound tensor is float64"):
        binding.bind_input(in_name, feeds[in_name].astype(np.float64))
    with pytest.raises(xrt.InvalidArgumentError, match="unknown output 'nope'"):
        binding.bind_output("nope", "cpu")
    with pytest.raises(xrt.InvalidTypeError, match="the bound tensor is int64"):
        binding.bind_output(out_name, xrt.empty([2, 4], dtype="int64"))
    binding.bind_input(in_name, feeds[in_name])
    with pytest.raises(xrt.InvalidArgumentError, match="no output is bound"):
        session.run_with_iobinding(binding)
    wrong = xrt.empty([5, 5], dtype="float32")
    binding.bind_output(out_name, wrong)
    with pytest.raises(xrt.XpuRuntimeError, match="shape"):
        session.run_with_iobinding(binding)
    binding.clear_binding_inputs()
    binding.bind_output(out_name, "cpu")
    with pytest.raises(xrt.InvalidArgumentError, match="is not fed|missing input"):
        session.run_with_iobinding(binding)
    other = make_session(models["mlp_tiny"], engine)
    with pytest.raises(xrt.InvalidTypeError, match="made by this session"):
        other.run_with_iobinding(binding)
    with pytest.raises(xrt.InvalidTypeError, match="run_options"):
        session.run_with_iobinding(binding, run_options={"x": 1})


def _pass_through_model(rows) -> bytes:
    """Outputs x (the graph input itself, no node), y = x + x and w (an initializer)."""
    from onnx import TensorProto, helper, numpy_helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 3])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [3])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g", [x], [x, y, w],
                              initializer=[numpy_helper.from_array(np.array([7, 8, 9], np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("rows", [2, "batch"])
def test_an_output_that_is_a_graph_input_is_a_copy_of_the_feed(engine, rows):
    """A graph output naming a graph input came back from the onnxruntime engine as uninitialised memory (values
    like 2.7e16) when its shape was static, and as a view of the run's temporary feed when it was not (Note [Outputs
    that are graph inputs] in src/cpp/engines/onnxruntime/ort_engine.cpp). Both engines return a copy of the feed,
    through run() and through I/O binding, run after run."""
    session = make_session(_pass_through_model(rows), engine)
    rng = np.random.default_rng(0)
    for run in range(4):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        given = x.copy()
        out = session.run(None, {"x": x})
        np.testing.assert_array_equal(out[0], given, err_msg=f"run {run}")
        np.testing.assert_array_equal(out[1], given + given)
        np.testing.assert_array_equal(out[2], [7, 8, 9])
        x[...] = -1  # the output is a copy, not a view of the feed
        np.testing.assert_array_equal(out[0], given)
        only = session.run(["x"], {"x": given})  # the pass-through output alone: ORT has nothing to run
        np.testing.assert_array_equal(only[0], given)
        np.testing.assert_array_equal(session.run(["y", "x"], {"x": given})[1], given)
    # I/O binding: one output bound in place, the other to a device.
    x = rng.standard_normal((2, 3)).astype(np.float32)
    binding = session.io_binding()
    binding.bind_input("x", x)
    bound = xrt.empty([2, 3], dtype="float32")
    binding.bind_output("x", bound)
    binding.bind_output("y", "cpu")
    for _ in range(3):
        session.run_with_iobinding(binding)
        got_x, got_y = binding.get_outputs()
        assert got_x.data_ptr == bound.data_ptr
        np.testing.assert_array_equal(bound.numpy(), x)
        np.testing.assert_array_equal(got_y.numpy(), x + x)
        x *= 0.5  # the bound input's memory, read again by the next run
    wrong = xrt.empty([4, 3], dtype="float32")
    binding.bind_output("x", wrong)
    with pytest.raises(xrt.XpuRuntimeError, match="shape"):
        session.run_with_iobinding(binding)


@requires_gpu
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model", ["mlp_tiny_fp16", "bert_tiny_fp16", "resnet50_tiny_fp16"])
def test_cuda_graph_replays_over_bound_tensors(models, engine, model):
    """With CUDA graphs, runs over the same bound tensors replay (ORT: a graph captured over them); new values in
    the bound inputs give new outputs, and binding other tensors still gives right answers."""
    session = make_session(models[model], engine, device="cuda:0",
                           exec_policy=xrt.ExecutionPolicy(cuda_graphs=True))
    reference = make_session(models[model], engine, device="cuda:0",
                             exec_policy=xrt.ExecutionPolicy(cuda_graphs=False))
    feeds = feeds_for(session, 2)
    on_device = {k: xrt.from_numpy(v).to("cuda:0") for k, v in feeds.items()}
    expected = [t.to("cpu").numpy() for t in reference.run(list(o.name for o in session.get_outputs()), on_device)]
    binding = session.io_binding()
    for name, tensor in on_device.items():
        binding.bind_input(name, tensor)
    outs = [xrt.empty(list(e.shape), dtype=o.dtype, device="cuda:0") for e, o in zip(expected, session.get_outputs())]
    for o, tensor in zip(session.get_outputs(), outs):
        binding.bind_output(o.name, tensor)
    for _ in range(4):  # ORT captures on the second run with a graph id, then replays
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        for tensor, e in zip(outs, expected):
            np.testing.assert_allclose(tensor.to("cpu").numpy().astype(np.float32), e.astype(np.float32),
                                       rtol=2e-2, atol=2e-2)
    # New values written into the bound inputs: the replay reads them.
    for name, value in feeds.items():
        if value.dtype.kind == "f":
            new = (value * -0.5).astype(value.dtype)
            on_device[name].copy_(xrt.from_numpy(new).to("cuda:0"))
            feeds[name] = new
    expected = [t.to("cpu").numpy() for t in reference.run(list(o.name for o in session.get_outputs()),
                                                             {k: xrt.from_numpy(v).to("cuda:0") for k, v in feeds.items()})]
    session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    for tensor, e in zip(outs, expected):
        np.testing.assert_allclose(tensor.to("cpu").numpy().astype(np.float32), e.astype(np.float32),
                                   rtol=2e-2, atol=2e-2)
    # Other tensors bound: still right (staged), and explain() says so for the onnxruntime engine.
    fresh = [xrt.empty(list(e.shape), dtype=o.dtype, device="cuda:0") for e, o in zip(expected, session.get_outputs())]
    for o, tensor in zip(session.get_outputs(), fresh):
        binding.bind_output(o.name, tensor)
    session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    for tensor, e in zip(fresh, expected):
        np.testing.assert_allclose(tensor.to("cpu").numpy().astype(np.float32), e.astype(np.float32),
                                   rtol=2e-2, atol=2e-2)
    if engine == "onnxruntime":
        assert any("bound tensors" in note for note in session.explain().policy_notes)
