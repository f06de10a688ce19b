"""Segmented plans (Note [Segmented plans] in capture_plan.h, docs/native_engine.md): a plan ends where shapes
depend on values (NonZero, NonMaxSuppression, an If or TopK on values computed from data), and the next segment is
planned for the shapes the run produced. The real-model check is SSDlite in test_model_suite.py; these models
isolate each kind of boundary and compare with NumPy."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import xpuruntime as xrt
from conformance_cases import ref_nms

HAS_GPU = xrt.get_device_count() > 0
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda:0", marks=requires_gpu)]


def _const(name, values, dtype=TensorProto.INT64):
    array = np.asarray(values)
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, dtype, array.shape,
                                                                             array.flatten().tolist()))


def detector_model() -> bytes:
    """scores [N], boxes [N, 4] -> the boxes and scores NMS keeps among the top 5 scores above 0.5, and the
    NonZero indices themselves (a bounded value that is also a graph output)."""
    nodes = [
        _const("thr", [0.5], TensorProto.FLOAT), _const("five", [5]), _const("axes0", [0]), _const("axes01", [0, 1]),
        _const("two", 2), _const("max_out", [3]), _const("iou", [0.5], TensorProto.FLOAT),
        helper.make_node("Greater", ["scores", "thr"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
        helper.make_node("GatherND", ["scores", "idx"], ["s_k"]),
        helper.make_node("GatherND", ["boxes", "idx"], ["b_k"]),
        helper.make_node("Shape", ["s_k"], ["count"]),
        helper.make_node("Concat", ["count", "five"], ["both"], axis=0),
        helper.make_node("ReduceMin", ["both"], ["k"], keepdims=1),
        helper.make_node("TopK", ["s_k", "k"], ["top_v", "top_i"]),
        helper.make_node("Gather", ["b_k", "top_i"], ["sel_boxes"], axis=0),
        helper.make_node("Unsqueeze", ["sel_boxes", "axes0"], ["boxes3"]),
        helper.make_node("Unsqueeze", ["top_v", "axes01"], ["scores3"]),
        helper.make_node("NonMaxSuppression", ["boxes3", "scores3", "max_out", "iou"], ["keep"]),
        helper.make_node("Gather", ["keep", "two"], ["keep_idx"], axis=1),
        helper.make_node("Gather", ["sel_boxes", "keep_idx"], ["out_boxes"], axis=0),
        helper.make_node("Gather", ["top_v", "keep_idx"], ["out_scores"], axis=0),
    ]
    graph = helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("out_boxes", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("out_scores", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("nz", TensorProto.INT64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def detector_reference(scores, boxes):
    nz = np.stack(np.nonzero(scores > 0.5)).astype(np.int64)
    s_k, b_k = scores[nz[0]], boxes[nz[0]]
    order = np.argsort(-s_k, kind="stable")[:min(len(s_k), 5)]
    top_v, sel = s_k[order], b_k[order]
    bounded, count = ref_nms([sel[None], top_v[None, None]], {"max_output_boxes_per_class": 3, "iou_threshold": 0.5})
    keep = bounded[:count[0], 2]
    return sel[keep], top_v[keep], nz


def branch_model() -> bytes:
    """x [N] -> x * 2 when sum(x) > 0, else concat(x, x) (another shape); then its top k, k = argmax(x) + 1."""
    then_graph = helper.make_graph([helper.make_node("Mul", ["x", "two_f"], ["y_then"])], "then", [],
                                   [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["y_else"], axis=0)], "else", [],
                                   [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, None)])
    nodes = [
        _const("zero", 0.0, TensorProto.FLOAT), _const("two_f", 2.0, TensorProto.FLOAT), _const("one", [1]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
        helper.make_node("ArgMax", ["x"], ["at"], keepdims=1),
        helper.make_node("Add", ["at", "one"], ["k"]),
        helper.make_node("TopK", ["y", "k"], ["top", "top_i"]),
    ]
    graph = helper.make_graph(nodes, "branch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("top", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def branch_reference(x):
    y = x * 2 if x.sum() > 0 else np.concatenate([x, x])
    k = int(np.argmax(x)) + 1
    return -np.sort(-y, kind="stable")[:k]


def _detector_inputs(seed, n=40, above=0.5):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0, 1, n).astype(np.float32)
    scores[rng.uniform(size=n) > above] *= 0.5  # about `above` of them pass the 0.5 threshold
    corner = rng.uniform(0, 4, (n, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(0.5, 2, (n, 2)).astype(np.float32)], axis=1)
    return scores, boxes


@pytest.mark.parametrize("device", DEVICES)
def test_nonzero_topk_nms_chain_matches_numpy(device):
    session = xrt.InferenceSession(detector_model(), engine="native", device=device,
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    for seed, n, above in [(0, 40, 0.5), (1, 7, 0.9), (2, 40, 0.5), (3, 129, 0.3), (0, 40, 0.5), (4, 6, 0.0)]:
        scores, boxes = _detector_inputs(seed, n, above)
        for _ in range(3):  # the second and third runs of a signature replay captured segments on CUDA
            out_boxes, out_scores, nz = session.run(None, {"scores": scores, "boxes": boxes})
            ref_boxes, ref_scores, ref_nz = detector_reference(scores, boxes)
            np.testing.assert_array_equal(nz, ref_nz)
            np.testing.assert_array_equal(out_scores, ref_scores)
            np.testing.assert_array_equal(out_boxes, ref_boxes)
    e = session.explain()
    assert len(e.segments) == 3, e.segments
    assert "NonZero 'NonZero_8'" in e.segments[0] or "NonZero" in e.segments[0]
    assert "NonMaxSuppression" in e.segments[1]
    assert {n["segment"] for n in e.nodes} == {0, 1, 2}
    kernels = {n["kernel"] for n in e.nodes}
    assert "onnx_ref" not in kernels and "(dispatched at run time)" not in kernels, kernels
    if device != "cpu":
        assert "cpu" not in kernels, kernels
        assert "captured" in e.segments[0], e.segments
    assert sum(t["kind"] == "sync" and "ends at" in t["reason"] for t in e.transfers) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_if_and_topk_on_values_from_data(device):
    session = xrt.InferenceSession(branch_model(), engine="native", device=device)
    rng = np.random.default_rng(7)
    for x in [rng.uniform(-1, 1, 9).astype(np.float32) + 0.5, rng.uniform(-1, 1, 9).astype(np.float32) - 0.5,
              np.array([3.0, -9.0, 1.0, 2.0], np.float32)]:
        (top,) = session.run(None, {"x": x})
        np.testing.assert_allclose(top, branch_reference(x), rtol=1e-6)
    e = session.explain()
    assert len(e.segments) == 3, e.segments  # the If, then the TopK whose input came out of it
    assert "If" in e.segments[0] and "1 value(s) computed from data" in e.segments[0]
    assert "TopK" in e.segments[1] and "1 value(s) computed from data" in e.segments[1]
    assert any("inlined" in o for o in e.options) or any(n["segment"] == 1 for n in e.nodes)
    assert "onnx_ref" not in {n["kernel"] for n in e.nodes}


def test_next_segment_plans_are_bounded():
    session = xrt.InferenceSession(detector_model(), engine="native", device="cpu")
    for count in range(1, 24):
        scores = np.full(30, 0.1, np.float32)
        scores[:count] = np.linspace(0.9, 0.6, count)
        boxes = np.tile(np.arange(30, dtype=np.float32)[:, None] * 3, (1, 4)) + np.array([0, 0, 1, 1], np.float32)
        out_boxes, out_scores, nz = session.run(None, {"scores": scores, "boxes": boxes})
        assert nz.shape == (1, count)
        assert len(out_scores) == min(count, 3)
    assert "(16 plan(s) cached)" in session.explain().segments[0]


def test_empty_results_flow_through():
    session = xrt.InferenceSession(detector_model(), engine="native", device="cpu")
    scores, boxes = np.full(12, 0.2, np.float32), np.zeros((12, 4), np.float32)
    out_boxes, out_scores, nz = session.run(None, {"scores": scores, "boxes": boxes})
    assert out_boxes.shape == (0, 4) and out_scores.shape == (0,) and nz.shape == (1, 0)


@requires_gpu
def test_cuda_segments_match_the_cpu_on_the_tiny_detector():
    model = "models/suite/tiny/ssdlite.torchscript.float32.onnx"
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    data = np.load(root / "models/suite/tiny/ssdlite.npz")
    cpu = xrt.InferenceSession(str(root / model), engine="native", device="cpu")
    gpu = xrt.InferenceSession(str(root / model), engine="native", device="cuda:0")
    expected = cpu.run(None, {"images": data["in.images"]})
    for _ in range(3):
        got = gpu.run(None, {"images": data["in.images"]})
        for g, c in zip(got, expected):
            assert g.shape == c.shape
            np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-4)
    segments = gpu.explain().segments
    assert len(segments) == 3 and all("captured" in s for s in segments), segments
