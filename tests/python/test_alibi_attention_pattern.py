"""BLOOM's attention as PyTorch's dynamo exporter writes it (transformers' BloomAttention: q, k and v selected from
the [B, S, H, 3, D] projection by Gathers of one index, alibi.baddbmm(q, k^T) on [B * H, S, D] views, the causal
mask added to the 4-D view of the scores): one fused Attention that reads q, k and v in place (Note [A Gather of one
index is a view], Note [Masked-fill scores] in fusion_transformer.cpp), against NumPy in float64."""

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

DEVICES = ["cpu"] + (["cuda:0"] if xrt.get_device_count() > 0 else [])


def _bloom_attention(b, s, h, d, dtype, beta):
    c = h * d
    rng = np.random.default_rng(b * 100 + s * 10 + h)
    np_dtype, onnx_dtype = (np.float16, TensorProto.FLOAT16) if dtype == "float16" else (np.float32, TensorProto.FLOAT)
    w = (rng.standard_normal((c, 3 * c)) / np.sqrt(c)).astype(np_dtype)
    bias = (rng.standard_normal(3 * c) * 0.1).astype(np_dtype)
    alpha = 1.0 / np.sqrt(d)

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    inits = [const("w", w), const("b", bias), const("shape5", np.array([b, s, h, 3, d], np.int64)),
             const("shape3", np.array([b * h, s, d], np.int64)), const("alpha", np.array(alpha, np_dtype)),
             const("beta", np.array(beta, np_dtype)), const("shape4", np.array([b, h, s, s], np.int64)),
             const("shape3s", np.array([b * h, s, s], np.int64)), const("shapeo4", np.array([b, h, s, d], np.int64)),
             const("shapeo", np.array([b, s, c], np.int64))]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["mm"]), n("Add", ["mm", "b"], ["fused"]), n("Reshape", ["fused", "shape5"], ["f5"])]
    for p, name in enumerate("qkv"):
        inits.append(const(f"i{p}", np.array(p, np.int64)))
        nodes += [n("Gather", ["f5", f"i{p}"], [f"{name}_sel"], axis=3),
                  n("Transpose", [f"{name}_sel"], [f"{name}_t"], perm=[0, 2, 1, 3]),
                  n("Reshape", [f"{name}_t", "shape3"], [f"{name}3"])]
    nodes += [n("Transpose", ["k3"], ["kT"], perm=[0, 2, 1]), n("MatMul", ["q3", "kT"], ["qk"]),
              n("Mul", ["qk", "alpha"], ["qk_a"]), n("Mul", ["alibi", "beta"], ["alibi_b"]),
              n("Add", ["alibi_b", "qk_a"], ["scores3"]), n("Reshape", ["scores3", "shape4"], ["scores4"]),
              n("Add", ["scores4", "mask"], ["masked"]), n("Cast", ["masked"], ["wide"], to=TensorProto.FLOAT),
              n("Softmax", ["wide"], ["probs_wide"], axis=-1), n("Cast", ["probs_wide"], ["probs"], to=onnx_dtype),
              n("Reshape", ["probs", "shape3s"], ["probs3"]), n("MatMul", ["probs3", "v3"], ["ctx3"]),
              n("Reshape", ["ctx3", "shapeo4"], ["ctx4"]), n("Transpose", ["ctx4"], ["ctx_t"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ctx_t", "shapeo"], ["y"])]
    graph = helper.make_graph(nodes, "bloom_attention",
                              [helper.make_tensor_value_info("x", onnx_dtype, [b, s, c]),
                               helper.make_tensor_value_info("alibi", onnx_dtype, [b * h, 1, s]),
                               helper.make_tensor_value_info("mask", onnx_dtype, [b, 1, s, s])],
                              [helper.make_tensor_value_info("y", onnx_dtype, [b, s, c])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    x = rng.standard_normal((b, s, c)).astype(np_dtype)
    slopes = 2.0 ** (-8.0 * np.arange(1, h + 1) / h)
    alibi = np.broadcast_to(slopes[None, :, None, None] * np.arange(s)[None, None, None, :], (b, h, 1, s))
    alibi = alibi.reshape(b * h, 1, s).astype(np_dtype)
    mask = np.broadcast_to(np.triu(np.full((s, s), -60000.0), 1), (b, 1, s, s)).astype(np_dtype)
    f = lambda a: a.astype(np.float64)  # noqa: E731
    packed = (f(x) @ f(w) + f(bias)).reshape(b, s, h, 3, d)
    q, k, v = (packed[..., p, :].transpose(0, 2, 1, 3).reshape(b * h, s, d) for p in range(3))
    scores = (f(alibi) * beta + alpha * q @ k.transpose(0, 2, 1)).reshape(b, h, s, s) + f(mask)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ref = (probs.reshape(b * h, s, s) @ v).reshape(b, h, s, d).transpose(0, 2, 1, 3).reshape(b, s, c)
    return model.SerializeToString(), {"x": x, "alibi": alibi, "mask": mask}, ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,s,h,d,dtype,beta", [(2, 7, 4, 8, "float32", 1.0), (1, 13, 3, 16, "float32", 0.5),
                                                (3, 9, 2, 8, "float16", 1.0)])
def test_bloom_attention_is_one_attention_reading_the_projection(device, b, s, h, d, dtype, beta):
    model, feeds, ref = _bloom_attention(b, s, h, d, dtype, beta)
    session = xrt.InferenceSession(model, device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    (out,) = session.run(None, feeds)
    got = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out).astype(np.float64)
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    nodes = session.explain().nodes
    ops = [node["op"] for node in nodes if node["op"]]
    assert ops.count("attention") == 1, ops
    for copy_op in ("gather", "transpose", "softmax", "matmul"):
        assert copy_op not in ops, ops  # the selects, head transposes and the unfused chain are gone
    if beta == 1.0:
        assert "mul" not in ops, ops  # alibi * 1 removed (identity_elimination)
