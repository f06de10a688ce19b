"""The native engine's op_decomposition pass (docs/native_engine.md): ONNX ops rewritten onto registry ops (Einsum,
Instance/GroupNormalization, DepthToSpace/SpaceToDepth, ReduceL1/L2/SumSquare/LogSumExp, variadic Sum/Max/Min/Mean),
each checked against NumPy on random inputs at odd shapes, and checked to run without the ONNX reference library
(every node lowered: on CUDA that is what lets fallback="error" run them)."""

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if xrt.get_device_count() > 0 else [])


def _model(node, inputs, output_shape, opset, initializers=()):
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)) for name, a in inputs],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, list(output_shape))],
        initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _run(model, feeds, device):
    session = xrt.InferenceSession(model, device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    (out,) = session.run(None, feeds)
    out = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out)
    kernels = {n["kernel"] for n in session.explain().nodes}
    assert "onnx_ref" not in kernels, kernels
    return out


EINSUM = [
    ("bhid,bhjd->bhij", [(2, 3, 5, 7), (2, 3, 6, 7)]),   # attention scores
    ("bhij,bhjd->bhid", [(2, 3, 5, 6), (2, 3, 6, 7)]),   # attention output
    ("ij,jk->ik", [(5, 9), (9, 4)]),
    ("bnd,dk->bkn", [(2, 7, 5), (5, 3)]),                # output permuted
    ("i,i->", [(11,), (11,)]),                           # inner product
    ("abc,cd->ad", [(3, 4, 5), (5, 2)]),                 # b summed on one side
    ("ij->ji", [(4, 7)]),
    ("bij->bj", [(2, 5, 3)]),
    ("ii->i", [(6, 6)]),                                 # diagonals: Transpose, Reshape, Gather first
    ("bii->bi", [(3, 5, 5)]),
    ("ii->", [(7, 7)]),                                  # trace
    ("iij->ji", [(4, 4, 3)]),
    ("ij,jj->i", [(5, 6), (6, 6)]),
    ("iijj->ij", [(3, 3, 2, 2)]),
    # batch labels keep their own dims (a 5-D MatMul: MaxViT's windowed attention), grouped labels are viewed
    ("bwhid,bwhjd->bwhij", [(2, 3, 2, 5, 4), (2, 3, 2, 7, 4)]),
    ("bwhij,bwhjd->bwhid", [(2, 3, 2, 5, 7), (2, 3, 2, 7, 4)]),
    ("bxyk,bkz->bzyx", [(2, 3, 4, 5), (2, 5, 6)]),       # two free labels of one side, output permuted
    ("bkl,bklz->bz", [(3, 4, 2), (3, 4, 2, 5)]),         # two contracted labels, no free label on one side
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("equation,shapes", EINSUM, ids=[e for e, _ in EINSUM])
def test_einsum(device, equation, shapes):
    rng = np.random.default_rng(len(equation))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    expected = np.einsum(equation, *arrays)
    names = [f"x{k}" for k in range(len(arrays))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    opset = 12 if "->bj" in equation else 13  # Einsum-12: ReduceSum takes its axes as an attribute there
    got = _run(_model(node, list(zip(names, arrays)), expected.shape, opset), dict(zip(names, arrays)), device)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def _group_norm_reference(x, scale, bias, groups, epsilon):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1).astype(np.float64)
    normalized = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + epsilon)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return normalized * scale.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,groups,opset", [("InstanceNormalization", None, 13), ("GroupNormalization", 3, 21),
                                             ("GroupNormalization", 2, 18)])
def test_normalizations(device, op, groups, opset):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 5, 7)).astype(np.float32) * 3 + 1
    channels = 6
    per = channels if (op == "InstanceNormalization" or opset >= 21) else groups
    scale = rng.uniform(0.5, 1.5, per).astype(np.float32)
    bias = rng.uniform(-1, 1, per).astype(np.float32)
    attrs = {"epsilon": 1e-3}
    if groups:
        attrs["num_groups"] = groups
    node = helper.make_node(op, ["x", "scale", "bias"], ["y"], **attrs)
    inits = [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(bias, "bias")]
    g = channels if op == "InstanceNormalization" else groups
    full_scale = scale if per == channels else np.repeat(scale, channels // groups)
    full_bias = bias if per == channels else np.repeat(bias, channels // groups)
    expected = _group_norm_reference(x, full_scale, full_bias, g, 1e-3)
    got = _run(_model(node, [("x", x)], x.shape, opset, inits), {"x": x}, device)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,shape,groups", [("InstanceNormalization", (3, 6, 11), 6),
                                             ("InstanceNormalization", (2, 6, 5, 7), 6),
                                             ("InstanceNormalization", (1, 5, 2, 3, 4), 5),
                                             ("GroupNormalization", (2, 6, 3, 3), 6),
                                             ("GroupNormalization", (2, 6, 5, 7), 3),
                                             ("GroupNormalization", (3, 8, 9), 2)])
def test_instance_norm_affine_in_the_layer_norm(device, op, shape, groups):
    """Note [Per-row affine of a layer norm]: on the CPU an InstanceNormalization or GroupNormalization is one
    layer_norm whose rows (one channel a group) or runs of S elements (several) take their channel's scale and bias, no
    Mul and Add after it; CUDA plans keep them. Any rank from 3 on, against NumPy in float64."""
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4 + 2).astype(np.float32)
    channels = shape[1]
    scale = rng.uniform(-1.5, 1.5, channels).astype(np.float32)
    bias = rng.uniform(-1, 1, channels).astype(np.float32)
    attrs = {"epsilon": 1e-4}
    if op == "GroupNormalization":
        attrs["num_groups"] = groups
    node = helper.make_node(op, ["x", "scale", "bias"], ["y"], **attrs)
    inits = [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(bias, "bias")]
    model = _model(node, [("x", x)], x.shape, 21 if op == "GroupNormalization" else 13, inits)
    session = xrt.InferenceSession(model, device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    (out,) = session.run(None, {"x": x})
    got = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out)
    np.testing.assert_allclose(got, _group_norm_reference(x, scale, bias, groups, 1e-4), rtol=1e-5, atol=1e-5)
    ops = [n["op"] for n in session.explain().nodes]
    if device == "cpu":
        assert [o for o in ops if o] == ["layer_norm"], ops  # the grouped views have no op
    else:
        assert "layer_norm" in ops and len(ops) > 1, ops  # the affine stays a pass of its own, fused after


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,mode", [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", None)])
def test_depth_space(device, op, mode):
    rng = np.random.default_rng(5)
    b = 2
    if op == "DepthToSpace":
        x = rng.standard_normal((2, 12, 3, 5)).astype(np.float32)
        n, c, h, w = x.shape
        if mode == "DCR":
            expected = x.reshape(n, b, b, c // 4, h, w).transpose(0, 3, 4, 1, 5, 2).reshape(n, c // 4, h * b, w * b)
        else:
            expected = x.reshape(n, c // 4, b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // 4, h * b, w * b)
        node = helper.make_node(op, ["x"], ["y"], blocksize=b, mode=mode)
    else:
        x = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
        n, c, h, w = x.shape
        expected = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4).reshape(n, c * 4, h // b, w // b)
        node = helper.make_node(op, ["x"], ["y"], blocksize=b)
    got = _run(_model(node, [("x", x)], expected.shape, 13), {"x": x}, device)
    np.testing.assert_array_equal(got, expected)


REDUCTIONS = {
    "ReduceL1": lambda x, ax, k: np.abs(x).sum(axis=ax, keepdims=k),
    "ReduceL2": lambda x, ax, k: np.sqrt((x * x).sum(axis=ax, keepdims=k)),
    "ReduceSumSquare": lambda x, ax, k: (x * x).sum(axis=ax, keepdims=k),
    "ReduceLogSumExp": lambda x, ax, k: np.log(np.exp(x.astype(np.float64)).sum(axis=ax, keepdims=k)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(device, op, keepdims):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 5, 7)) * 4).astype(np.float32)  # exp up to e^20: the max shift keeps it finite
    expected = REDUCTIONS[op](x, (1,), bool(keepdims))
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    inits = [numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")]
    got = _run(_model(node, [("x", x)], expected.shape, 18, inits), {"x": x}, device)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_variadic(device, op, count):
    rng = np.random.default_rng(count)
    shapes = [(3, 5), (5,), (1, 5)][:count]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fn = {"Sum": np.add, "Max": np.maximum, "Min": np.minimum, "Mean": np.add}[op]
    expected = arrays[0]
    for a in arrays[1:]:
        expected = fn(expected, a)
    if op == "Mean":
        expected = expected / count
    expected = np.broadcast_to(expected, np.broadcast_shapes(*shapes))
    names = [f"x{k}" for k in range(count)]
    node = helper.make_node(op, names, ["y"])
    got = _run(_model(node, list(zip(names, arrays)), expected.shape, 13), dict(zip(names, arrays)), device)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


CONV_TRANSPOSE = [
    # x, w [C, O/g, kh, kw], attributes
    ((2, 4, 5, 5), (4, 3, 2, 2), {"strides": [2, 2]}),
    ((1, 6, 7, 5), (6, 5, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((2, 4, 6, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "dilations": [2, 2], "group": 2}),
    ((1, 3, 4, 9), (3, 7, 3, 2), {"strides": [3, 1], "pads": [0, 1, 2, 0]}),  # asymmetric: cudnn crops
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CONV_TRANSPOSE)))
def test_conv_transpose(device, case):
    import conformance_cases as cc
    xs, ws, attrs = CONV_TRANSPOSE[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(ws[0] * ws[2] * ws[3])).astype(np.float32)
    b = rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)
    ref_attrs = dict(attrs)
    ref_attrs["groups"] = ref_attrs.pop("group", 1)
    expected = cc.ref_conv_transpose2d([x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)], ref_attrs)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    model = _model(node, [("x", x)], expected.shape, 17,
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    np.testing.assert_allclose(_run(model, {"x": x}, device), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_conv_transpose_1d_runs_as_2d(device):
    import conformance_cases as cc
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 9)).astype(np.float32)
    w = (rng.standard_normal((4, 3, 3)) / 6).astype(np.float32)
    attrs = {"strides": [2], "pads": [1, 1], "output_padding": [1]}
    expected = cc.ref_conv_transpose2d(
        [x[:, :, None, :].astype(np.float64), w[:, :, None, :].astype(np.float64), None],
        {"strides": [1, 2], "pads": [0, 1, 0, 1], "output_padding": [0, 1]})[:, :, 0, :]
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    model = _model(node, [("x", x)], expected.shape, 17, [numpy_helper.from_array(w, "w")])
    np.testing.assert_allclose(_run(model, {"x": x}, device), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(
    xrt.get_device_count() == 0, reason="needs a CUDA device"))])
def test_3d_conv_and_conv_transpose_from_pytorch(tmp_path, device):
    """A PyTorch Conv3d / ConvTranspose3d network (TorchScript export) runs on the registry's conv3d and
    conv_transpose3d (cudnn on CUDA) and matches PyTorch."""
    torch = pytest.importorskip("torch")
    from torch_export import export_onnx

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv3d(3, 8, 3, stride=(1, 2, 2), padding=1), torch.nn.ReLU(),
        torch.nn.Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1), groups=2),
        torch.nn.ConvTranspose3d(8, 4, 3, stride=2, padding=1, output_padding=1), torch.nn.Sigmoid()).eval()
    x = torch.randn(2, 3, 5, 9, 11)
    path = tmp_path / "conv3d.onnx"
    export_onnx(model, x, path)
    with torch.no_grad():
        expected = model(x).numpy()
    session = xrt.InferenceSession(str(path), engine="native", device=device)
    (y,) = session.run(None, {"x": x.numpy()})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    ops = {n["op"] for n in session.explain().nodes}
    assert {"conv3d", "conv_transpose3d"} <= ops, ops
    kernels = {n["kernel"] for n in session.explain().nodes if n["op"] in ("conv3d", "conv_transpose3d")}
    assert kernels == ({"cpu"} if device == "cpu" else {"cudnn"}), kernels


def _inner_axis_linear_model(shape, axis, out_features, bias, dtype, perm_back=None, bias_rank=1):
    """Transpose (axis moved last) -> MatMul(W) [-> Add(b)] -> Transpose (back): CaiT's talking heads. `bias_rank`:
    b's rank (ones before N); past x's rank it makes the sum one rank more, which the second Transpose permutes."""
    rank = len(shape)
    perm = [d for d in range(rank) if d != axis] + [axis]
    back = perm_back or [d for d in range(axis)] + [rank - 1] + [d for d in range(axis, rank - 1)]
    rng = np.random.default_rng(rank + axis + out_features)
    np_dtype, onnx_dtype = (np.float16, TensorProto.FLOAT16) if dtype == "float16" else (np.float32, TensorProto.FLOAT)
    w = rng.uniform(-1, 1, (shape[axis], out_features)).astype(np_dtype)
    b = rng.uniform(-1, 1, (1,) * (bias_rank - 1) + (out_features,)).astype(np_dtype)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
             helper.make_node("MatMul", ["t", "w"], ["m"])]
    last = "m"
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        nodes.append(helper.make_node("Add", ["m", "b"], ["mb"]))
        inits.append(numpy_helper.from_array(b, "b"))
        last = "mb"
    nodes.append(helper.make_node("Transpose", [last], ["y"], perm=back))
    moved = [1] * max(0, bias_rank - rank) + [shape[d] for d in perm[:-1]] + [out_features]
    out_shape = [moved[p] for p in back]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx_dtype, list(shape))],
                              [helper.make_tensor_value_info("y", onnx_dtype, out_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_normal(shape).astype(np_dtype)
    expected = np.transpose(x.astype(np.float64).transpose(perm) @ w.astype(np.float64) +
                            (b.astype(np.float64) if bias else 0.0), back)
    if bias_rank > rank and perm_back is None:
        raise ValueError("a bias of higher rank needs its own perm_back")
    return model.SerializeToString(), x, expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,axis,out_features,bias", [((2, 4, 7, 7), 1, 4, True),    # CaiT: heads of scores
                                                          ((3, 5, 8, 4), 1, 3, False),
                                                          ((2, 3, 5, 8, 4), 2, 6, True),  # an inner axis of rank 5
                                                          ((1, 9, 6, 9), 0, 2, True)])    # the leading axis
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_linear_over_an_inner_axis(device, shape, axis, out_features, bias, dtype):
    """Note [Linears over an inner axis]: Transpose -> MatMul(W) [+ b] -> Transpose back is one MatMul of W^T and x
    viewed as [outer, K, inner], no Transpose left; against NumPy in float64."""
    model, x, expected = _inner_axis_linear_model(shape, axis, out_features, bias, dtype)
    session = xrt.InferenceSession(model, device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    (out,) = session.run(None, {"x": x})
    got = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out).astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 1e-2  # float16: the inputs' own rounding and the output's
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * 4)
    ops = [n["op"] for n in session.explain().nodes if n["op"]]
    assert "transpose" not in ops, ops


@pytest.mark.parametrize("shape,axis,perm_back,bias_rank", [((2, 4, 3, 11), 1, [0, 3, 2, 1], 1),  # not back
                                                            ((64, 4, 3, 5), 1, None, 1),  # 15 columns: thin GEMMs
                                                            # a bias of rank 5 makes the sum [1, 2, 3, 11, 4]
                                                            ((2, 4, 3, 11), 1, [0, 4, 1, 2, 3], 5)])
def test_linear_over_an_inner_axis_keeps_other_forms(shape, axis, perm_back, bias_rank):
    """A Transpose pair that is not "axis a last, then back" stays (the rewrite would change the answer), and so does
    one with fewer than 32 elements after the axis (a batch of GEMMs that thin is the slower form)."""
    model, x, expected = _inner_axis_linear_model(shape, axis, 4, True, "float32", perm_back=perm_back,
                                                  bias_rank=bias_rank)
    session = xrt.InferenceSession(model, device="cpu", engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    (out,) = session.run(None, {"x": x})
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    assert "transpose" in [n["op"] for n in session.explain().nodes], session.explain().nodes
