"""Pointwise 1-D convolutions as GEMMs (Note [Pointwise 1-D convolutions as GEMMs] in decomposition.cpp): a Conv of
kernel 1 over [N, C, L] with 1 to 4 groups (SqueezeBERT's layers) becomes MatMul(W, x) with a block-diagonal W, plus
its bias; against NumPy in float64 at odd sizes, on every device; more groups, a stride or a padding stay
convolutions."""

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if xrt.get_device_count() > 0 else [])


def _host(y):
    """A run's output as a numpy float64 array (a CUDA session returns device tensors)."""
    return np.asarray(y if isinstance(y, np.ndarray) else y.to("cpu").numpy()).astype(np.float64)


def _model(n, c, length, out, groups, bias, dtype, strides=1, pads=0):
    rng = np.random.default_rng(c + out + groups + length)
    np_dtype, onnx_dtype = (np.float16, TensorProto.FLOAT16) if dtype == "float16" else (np.float32, TensorProto.FLOAT)
    w = (rng.standard_normal((out, c // groups, 1)) / np.sqrt(c / groups)).astype(np_dtype)
    b = rng.standard_normal(out).astype(np_dtype)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if bias else [])
    out_len = (length + 2 * pads - 1) // strides + 1
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], group=groups, strides=[strides],
                              pads=[pads, pads]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", onnx_dtype, [n, c, length])],
                              [helper.make_tensor_value_info("y", onnx_dtype, [n, out, out_len])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal((n, c, length)).astype(np_dtype)
    f = lambda a: a.astype(np.float64)  # noqa: E731
    xp = np.pad(f(x), [(0, 0), (0, 0), (pads, pads)])[:, :, ::strides]
    cg, og = c // groups, out // groups
    want = np.concatenate([np.einsum("oc,ncl->nol", f(w)[g * og:(g + 1) * og, :, 0], xp[:, g * cg:(g + 1) * cg])
                           for g in range(groups)], axis=1)
    if bias:
        want = want + f(b)[None, :, None]
    return model.SerializeToString(), x, np.maximum(want, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n,c,length,out,groups,bias", [
    (2, 24, 13, 40, 1, True), (1, 32, 7, 16, 4, True), (3, 12, 5, 20, 4, False), (2, 6, 9, 6, 2, True)])
def test_pointwise_conv1d_runs_as_one_matmul(device, dtype, n, c, length, out, groups, bias):
    model, x, want = _model(n, c, length, out, groups, bias, dtype)
    session = xrt.InferenceSession(model, device=device, engine="native")
    (y,) = session.run(None, {"x": x})
    tol = 2e-2 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(_host(y), want, rtol=tol, atol=tol)
    ops = [nd["op"] for nd in session.explain().nodes]
    assert "matmul" in ops and not [o for o in ops if o.startswith("conv")], ops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("groups,strides,pads", [(8, 1, 0), (1, 2, 0), (1, 1, 1)])
def test_other_1d_convolutions_stay_convolutions(device, groups, strides, pads):
    model, x, want = _model(2, 16, 11, 16, groups, True, "float32", strides, pads)
    session = xrt.InferenceSession(model, device=device, engine="native")
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    ops = [nd["op"] for nd in session.explain().nodes]
    assert "conv2d" in ops and "matmul" not in ops, ops
