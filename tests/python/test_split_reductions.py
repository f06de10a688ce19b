"""Reductions and scans of a whole large tensor into few results, as exporters write them (issue 42, "no kernel off a
cliff"): ``torch.isinf(x).any()`` (IsInf, Cast to bool and to int64, ReduceMax, Cast to bool), ``(x > 0).all()``
(ReduceMin of int64 flags), ``x.max()``, ``x.argmax()`` of a flattened tensor and a CumSum of one long vector, at
10M+ and prime sizes, against NumPy. On CUDA they run the split kernels of cuda_raw (Note [Block reductions] in
reduce.cu, Note [Split arg reductions] in select.cu, Note [Split scans] in scan.cu); every node is lowered (no
``onnx_ref``), and a second run gives the same bits."""

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if xrt.get_device_count() > 0 else [])
N = 10_000_019  # a prime above 10M


def _model(nodes, x, out_type, out_shape, initializers=()):
    elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int64: TensorProto.INT64}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", elem[x.dtype.type], list(x.shape))],
        [helper.make_tensor_value_info("y", out_type, list(out_shape))], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model.SerializeToString()


def _run(model, x, device):
    session = xrt.InferenceSession(model, device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    outs = []
    for _ in range(2):
        (out,) = session.run(None, {"x": x})
        outs.append(np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out))
    kernels = {n["kernel"] for n in session.explain().nodes}
    assert "onnx_ref" not in kernels, kernels
    assert outs[0].tobytes() == outs[1].tobytes(), "a second run gave other bits"
    return outs[0]


def _any_inf_model(x):
    nodes = [helper.make_node("IsInf", ["x"], ["inf"]),
             helper.make_node("Cast", ["inf"], ["b"], to=TensorProto.BOOL),
             helper.make_node("Cast", ["b"], ["i"], to=TensorProto.INT64),
             helper.make_node("ReduceMax", ["i"], ["m"], keepdims=0),
             helper.make_node("Cast", ["m"], ["y"], to=TensorProto.BOOL)]
    return _model(nodes, x, TensorProto.BOOL, [])


def _all_positive_model(x):
    zero = numpy_helper.from_array(np.zeros((), x.dtype), "zero")
    nodes = [helper.make_node("Greater", ["x", "zero"], ["b"]),
             helper.make_node("Cast", ["b"], ["i"], to=TensorProto.INT64),
             helper.make_node("ReduceMin", ["i"], ["m"], keepdims=0),
             helper.make_node("Cast", ["m"], ["y"], to=TensorProto.BOOL)]
    return _model(nodes, x, TensorProto.BOOL, [], [zero])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["none", "first", "last", "middle"])
def test_isinf_any_of_a_large_tensor(device, where):
    x = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    if where != "none":
        x[{"first": 0, "last": N - 1, "middle": N // 2}[where]] = -np.inf if where == "middle" else np.inf
    got = _run(_any_inf_model(x), x, device)
    assert bool(got) == bool(np.isinf(x).any())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["all", "first", "last"])
def test_all_positive_of_a_large_tensor(device, where):
    x = np.abs(np.random.default_rng(2).standard_normal(N)).astype(np.float32) + 0.5
    if where != "all":
        x[0 if where == "first" else N - 1] = -1.0
    got = _run(_all_positive_model(x), x, device)
    assert bool(got) == bool((x > 0).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_global_max_and_min(device, dtype, op):
    x = np.random.default_rng(3).standard_normal(N).astype(dtype)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    got = _run(_model([helper.make_node(op, ["x"], ["y"], keepdims=0)], x, elem, []), x, device)
    assert got == (x.max() if op == "ReduceMax" else x.min())
    x[N // 3] = np.nan
    got = _run(_model([helper.make_node(op, ["x"], ["y"], keepdims=0)], x, elem, []), x, device)
    assert np.isnan(got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_of_a_flattened_tensor(device, op):
    # Values on a coarse grid: the extreme value occurs many times, and the first occurrence must win.
    x = (np.random.default_rng(4).integers(-64, 65, size=(7, N // 7)) / 8.0).astype(np.float32)
    shape = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"]),
             helper.make_node(op, ["f"], ["y"], axis=0, keepdims=0)]
    got = _run(_model(nodes, x, TensorProto.INT64, [], [shape]), x, device)
    want = x.reshape(-1).argmax() if op == "ArgMax" else x.reshape(-1).argmin()
    assert int(got) == int(want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.int64, np.float32])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_of_a_long_vector(device, dtype, reverse):
    # Multiples of 1/8 whose running sums stay small: exact in float32 in any order.
    x = (np.random.default_rng(5).integers(-8, 9, size=1_000_003) * (1 if dtype == np.int64 else 0.125)).astype(dtype)
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    elem = TensorProto.INT64 if dtype == np.int64 else TensorProto.FLOAT
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"], reverse=reverse)]
    got = _run(_model(nodes, x, elem, list(x.shape), [axis]), x, device)
    want = np.cumsum(x[::-1])[::-1] if reverse else np.cumsum(x)
    np.testing.assert_array_equal(got, want.astype(dtype))
