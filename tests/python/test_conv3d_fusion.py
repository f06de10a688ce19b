"""3-D convolutions with their bias, residual and ReLU in one node (Note [3-D convolutions fused] in
fusion_conv_gemm.cpp): a video block as exporters write it (Conv with bias, Add of the block's input, Relu; a Conv
without bias after it) runs as conv3d nodes carrying the epilogue, against NumPy in float64 at odd shapes, with
strides and groups; on CUDA cuDNN runs the epilogue inside the convolution (its plan says so)."""

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if xrt.get_device_count() > 0 else [])


def _host(y):
    """A run's output as a numpy float64 array (a CUDA session returns device tensors)."""
    return np.asarray(y if isinstance(y, np.ndarray) else y.to("cpu").numpy()).astype(np.float64)


def _conv3d(x, w, b, stride, pad, groups):
    """float64 reference: x [N, C, D, H, W], w [O, C/groups, kd, kh, kw], symmetric pads."""
    x = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    n, c, dd, hh, ww = x.shape
    o, cg, kd, kh, kw = w.shape
    od, oh, ow = ((dd - kd) // stride[0] + 1, (hh - kh) // stride[1] + 1, (ww - kw) // stride[2] + 1)
    y = np.zeros((n, o, od, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for i in range(kd):
            for j in range(kh):
                for k in range(kw):
                    patch = xs[:, :, i:i + stride[0] * od:stride[0], j:j + stride[1] * oh:stride[1],
                               k:k + stride[2] * ow:stride[2]]
                    y[:, g * og:(g + 1) * og] += np.einsum("ncdhw,oc->nodhw", patch, w[g * og:(g + 1) * og, :, i, j, k])
    return y + (0 if b is None else b[None, :, None, None, None])


def _block(shape, out, kernel, stride, groups, dtype):
    """x -> Conv(w1, b1) -> Add(z) -> Relu -> Conv(w2) (no bias, 1x1x1) -> y; z has the first Conv's output shape."""
    n, c = shape[:2]
    pad = [k // 2 for k in kernel]
    spatial = [(s + 2 * p - k) // st + 1 for s, p, k, st in zip(shape[2:], pad, kernel, stride)]
    rng = np.random.default_rng(sum(shape) + out)
    np_dtype, onnx_dtype = (np.float16, TensorProto.FLOAT16) if dtype == "float16" else (np.float32, TensorProto.FLOAT)
    w1 = (rng.standard_normal((out, c // groups, *kernel)) / np.sqrt(c * np.prod(kernel) / groups)).astype(np_dtype)
    b1 = rng.standard_normal(out).astype(np_dtype)
    w2 = (rng.standard_normal((out, out, 1, 1, 1)) / np.sqrt(out)).astype(np_dtype)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=list(stride), pads=pad + pad, group=groups),
             helper.make_node("Add", ["c1", "z"], ["r"]), helper.make_node("Relu", ["r"], ["a"]),
             helper.make_node("Conv", ["a", "w2"], ["y"])]
    y_shape = [n, out, *spatial]
    graph = helper.make_graph(nodes, "video_block",
                              [helper.make_tensor_value_info("x", onnx_dtype, list(shape)),
                               helper.make_tensor_value_info("z", onnx_dtype, y_shape)],
                              [helper.make_tensor_value_info("y", onnx_dtype, y_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal(shape).astype(np_dtype)
    z = rng.standard_normal(y_shape).astype(np_dtype)
    f = lambda a: a.astype(np.float64)  # noqa: E731
    a = np.maximum(_conv3d(f(x), f(w1), f(b1), stride, pad, groups) + f(z), 0)
    want = _conv3d(a, f(w2), None, (1, 1, 1), (0, 0, 0), 1)
    return model.SerializeToString(), {"x": x, "z": z}, want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape,out,kernel,stride,groups", [
    ((2, 3, 5, 9, 11), 8, (3, 3, 3), (1, 2, 2), 1),  # a stem: 3 channels, odd sizes, strided
    ((1, 8, 4, 7, 6), 8, (3, 1, 3), (1, 1, 1), 2),   # grouped, a kernel of unequal sides
    ((3, 16, 3, 5, 5), 24, (1, 3, 3), (2, 1, 1), 1),
])
def test_a_video_block_fuses_its_epilogue(device, dtype, shape, out, kernel, stride, groups):
    if dtype == "float16" and device == "cpu":
        pytest.skip("the cpu plans of 3-D convolutions run the reference library in float32 and float64 only")
    model, feeds, want = _block(shape, out, kernel, stride, groups, dtype)
    session = xrt.InferenceSession(model, device=device, engine="native")
    (y,) = session.run(None, feeds)
    tol = 3e-2 if dtype == "float16" else 1e-4
    np.testing.assert_allclose(_host(y), want, rtol=tol, atol=tol)
    nodes = session.explain().nodes
    convs = [n for n in nodes if n["op"] == "conv3d"]
    assert len(convs) == 2, [n["op"] for n in nodes]  # the Add and the Relu joined the first one
    assert not [n for n in nodes if n["op"] in ("add", "relu")], [n["op"] for n in nodes]
    if device != "cpu":
        assert "fused epilogue: bias + residual + ReLU" in convs[0].get("reason", ""), convs[0]
    unfused = xrt.InferenceSession(model, device=device, engine="native", disabled_passes=["conv_fusion"])
    (u,) = unfused.run(None, feeds)
    np.testing.assert_allclose(_host(y), _host(u), rtol=tol, atol=tol)
