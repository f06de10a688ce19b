"""The native engine behind InferenceSession: the tiny zoo models (MLP, BERT, ResNet-50; float32 and float16) against
the NumPy float64 references of test_model_zoo.py and against ONNX Runtime, explain() naming a kernel for every node
and the memory plan, typed errors (corrupted and truncated files, missing inputs, wrong dtypes and shapes,
unknown engines and outputs), a plan per input shape (static_shape rejects others), concurrent runs, and on a GPU the
same models replayed from a CUDA graph.

Tolerances as in test_model_zoo.py: float32 1e-4, float16 3e-2 (float16 accumulates ~10 bits of mantissa over a few
dozen ops)."""

from __future__ import annotations

import json
import pathlib
import sys
import threading
from typing import Dict

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx", reason="the model zoo is generated with the onnx package (python3-onnx)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_model_zoo as zoo  # noqa: E402
from test_model_zoo import REFERENCES, TOLERANCE, make_input, weights  # noqa: E402

EXAMPLE = ROOT / "examples" / "models" / "tiny_classifier.onnx"
HAS_GPU = xrt.get_device_count() > 0


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Dict[str, pathlib.Path]:
    return zoo.generate(tmp_path_factory.mktemp("zoo"), tiny_only=True)


def model_path(models, name: str, dtype: str) -> pathlib.Path:
    return models[zoo.file_name(name, True, dtype).removesuffix(".onnx")]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_tiny_models_match_the_numpy_reference(models, name, dtype):
    path = model_path(models, name, dtype)
    session = xrt.InferenceSession(path, engine="native")
    assert session.engine == "native"
    (info,) = session.get_inputs()
    assert info.shape[0] == "batch"
    (output,) = session.get_outputs()
    w = weights(path)
    for batch in (1, 3):
        x = make_input(name, batch, dtype)
        result = session.run({info.name: x})[output.name]
        expected = REFERENCES[name](w, x)
        assert result.shape == expected.shape
        assert result.dtype == (np.float16 if dtype == "fp16" else np.float32)
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(result.astype(np.float64), expected, rtol=tol, atol=tol,
                                   err_msg=f"{name} {dtype} batch {batch}")


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_tiny_models_match_onnxruntime(models, name):
    path = model_path(models, name, "fp32")
    try:
        ort = xrt.InferenceSession(path, engine="onnxruntime")
    except xrt.UnsupportedOperationError as error:
        pytest.skip(f"no onnxruntime engine in this build: {error}")
    native = xrt.InferenceSession(path, engine="native")
    (info,) = native.get_inputs()
    x = make_input(name, 2, "fp32")
    a = native.run(None, {info.name: x})[0]
    b = ort.run(None, {info.name: x})[0]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_explain_names_a_kernel_for_every_node_and_the_memory_plan(models, name):
    path = model_path(models, name, "fp32")
    session = xrt.InferenceSession(path, engine="native")
    (info,) = session.get_inputs()
    session.run({info.name: make_input(name, 2, "fp32")})
    e = session.explain()
    assert e.engine == "native"
    assert e.nodes, "a plan with no steps"
    for node in e.nodes:
        assert node["kernel"] and node["reason"], node
    assert e.memory.startswith("peak "), e.memory
    assert "arena" in e.memory
    text = str(e)
    assert "memory: peak" in text
    # The compute nodes run registry kernels chosen by the dispatcher, not the reference library.
    kernels = {n["op_type"]: n["kernel"] for n in e.nodes}
    for op in ("Gemm", "Conv", "MatMul"):
        if op in kernels:
            assert kernels[op] == "cpu", kernels


def test_explain_says_where_session_creation_and_each_plan_build_went(models):
    # Note [Build phases]: the import, then per plan (the probe at batch 1 at creation, batch 3 at the first run) its
    # phases: the passes by name, kernel selection per backend, memory plan, and a total at least their sum.
    path = model_path(models, "resnet50", "fp32")
    session = xrt.InferenceSession(path, engine="native")
    created = session.explain().build
    assert created[0]["phase"] == "import" and created[0]["ms"] > 0
    (info,) = session.get_inputs()
    session.run({info.name: make_input("resnet50", 3, "fp32")})
    e = session.explain()
    phases = [b["phase"] for b in e.build]
    assert phases[: len(created)] == [b["phase"] for b in created]  # creation's phases come first, unchanged
    plans = sorted({p.split(":")[0] for p in phases if p.startswith("plan ")})
    assert len(plans) == 2 and plans[1].startswith("plan [3,"), plans
    for plan in plans:
        mine = {p[len(plan) + 2:]: b["ms"] for p, b in zip(phases, e.build) if p.startswith(plan + ":")}
        assert {"prepare", "pass conv_fusion", "kernel selection (cpu)", "lifetimes and memory plan",
                "total"} <= set(mine), mine
        assert all(ms >= 0 for ms in mine.values())
        assert mine["total"] >= sum(ms for name, ms in mine.items() if name != "total") * 0.99
    assert json.loads(e.to_json())["build"] == e.build


def test_fp16_option_runs_a_float32_model_in_float16(models):
    path = model_path(models, "mlp", "fp32")
    session = xrt.InferenceSession(path, engine="native", fp16=True)
    (info,) = session.get_inputs()
    x = make_input("mlp", 2, "fp32")
    result = session.run({info.name: x})[session.get_outputs()[0].name]
    assert result.dtype == np.float32  # the model's interface is unchanged
    expected = REFERENCES["mlp"](weights(path), x)
    np.testing.assert_allclose(result.astype(np.float64), expected, rtol=3e-2, atol=3e-2)
    assert any(n["precision"] == "fp16" for n in session.explain().nodes)


@pytest.mark.parametrize("precision,largest", [("fp16", 65504.0), ("bf16", 3.3895313892515355e38)])
def test_float32_constants_saturate_in_lower_precision_plans(precision, largest):
    """Note [Constants saturate in lower precision]: a finite float32 constant beyond the plan's float range (the
    exporters' finfo(float32).min masks) becomes the largest finite value of its sign, not an infinity; infinities,
    NaN and values in range convert as they are (rounded to nearest even)."""
    from onnx import TensorProto, helper, numpy_helper
    c = np.array([-3.4028235e38, 3.4028235e38, -np.inf, np.inf, 70000.0, -1.5, 0.0], np.float32)
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "saturate",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])],
                              [numpy_helper.from_array(c, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    session = xrt.InferenceSession(model.SerializeToString(), engine="native",
                                   exec_policy=xrt.ExecutionPolicy(precision=precision))
    y = session.run({"x": np.zeros(7, np.float32)})["y"]
    beyond = largest if precision == "fp16" else 70000.0  # 70000 is in bfloat16's range (rounded: 70144)
    expected = [-largest, largest, -np.inf, np.inf, beyond if precision == "fp16" else 70144.0, -1.5, 0.0]
    np.testing.assert_array_equal(y, np.array(expected, np.float32))


def test_a_plan_per_input_shape_and_static_shape(models):
    path = model_path(models, "mlp", "fp32")
    session = xrt.InferenceSession(path, engine="native")
    (info,) = session.get_inputs()
    for batch in (1, 4, 1, 7):
        out = session.run({info.name: make_input("mlp", batch, "fp32")})
        assert next(iter(out.values())).shape[0] == batch
    policy = xrt.ExecutionPolicy(static_shape=True)
    fixed = xrt.InferenceSession(path, engine="native", exec_policy=policy)
    fixed.run({info.name: make_input("mlp", 4, "fp32")})
    with pytest.raises(xrt.InvalidArgumentError, match="static_shape"):
        fixed.run({info.name: make_input("mlp", 5, "fp32")})


def test_bad_inputs_raise_typed_errors(tmp_path):
    session = xrt.InferenceSession(EXAMPLE, engine="native")
    (info,) = session.get_inputs()
    good = np.zeros((2, 8), np.float32)
    with pytest.raises(xrt.InvalidArgumentError, match="missing input 'x'"):
        session.run({})
    with pytest.raises(xrt.InvalidArgumentError, match="unknown input 'y'"):
        session.run({"x": good, "y": good})
    with pytest.raises(xrt.InvalidTypeError, match="float32"):
        session.run({"x": good.astype(np.float64)})
    with pytest.raises(xrt.InvalidArgumentError, match="expects"):
        session.run({"x": np.zeros((2, 9), np.float32)})
    with pytest.raises(xrt.InvalidArgumentError, match="unknown output"):
        session.run(["nope"], {"x": good})
    with pytest.raises(xrt.InvalidArgumentError, match="unknown engine"):
        xrt.InferenceSession(EXAMPLE, engine="warp-drive")
    data = EXAMPLE.read_bytes()
    for bad in (data[: len(data) // 2], b"\x08\x07garbage" * 10, b"not an onnx file at all"):
        with pytest.raises(xrt.InvalidArgumentError):
            xrt.InferenceSession(bad, engine="native")
    corrupted = tmp_path / "corrupted.onnx"
    corrupted.write_bytes(data[:-7])
    with pytest.raises(xrt.InvalidArgumentError):
        xrt.InferenceSession(corrupted, engine="native")
    with pytest.raises(xrt.InvalidArgumentError):
        xrt.InferenceSession(tmp_path / "missing.onnx", engine="native")
    # The session still works after all of that.
    assert session.run({"x": good})["probs"].shape == (2, 4)


def test_model_errors_are_typed(tmp_path):
    from onnx import TensorProto, helper

    # A node reading a value nobody produces.
    graph = helper.make_graph([helper.make_node("Relu", ["ghost"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(xrt.InvalidArgumentError, match="ghost"):
        xrt.InferenceSession(model.SerializeToString(), engine="native")
    # A cycle.
    graph = helper.make_graph([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(xrt.InvalidArgumentError, match="cycle"):
        xrt.InferenceSession(model.SerializeToString(), engine="native")
    # An op nobody implements: UnsupportedOperationError naming the node.
    graph = helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="com.example")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=8)
    with pytest.raises(xrt.UnsupportedOperationError, match="fancy"):
        xrt.InferenceSession(model.SerializeToString(), engine="native")


def test_run_from_several_threads(models):
    path = model_path(models, "bert", "fp32")
    session = xrt.InferenceSession(path, engine="native")
    (info,) = session.get_inputs()
    inputs = [make_input("bert", 1 + i % 3, "fp32") for i in range(8)]
    expected = [session.run({info.name: x})[session.get_outputs()[0].name] for x in inputs]
    errors = []
    results = [None] * len(inputs)

    def work(i):
        try:
            for _ in range(3):
                results[i] = session.run({info.name: inputs[i]})[session.get_outputs()[0].name]
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_gpu_replays_a_cuda_graph_and_matches_the_cpu(models, name):
    path = model_path(models, name, "fp16")
    gpu = xrt.InferenceSession(path, engine="native", device="cuda:0")
    cpu = xrt.InferenceSession(path, engine="native")
    (info,) = gpu.get_inputs()
    for batch in (1, 3):
        x = make_input(name, batch, "fp16")
        want = cpu.run(None, {info.name: x})[0].astype(np.float64)
        for _ in range(3):  # warm-up, capture, replay
            got = gpu.run(None, {info.name: x})[0]
            got = np.asarray(got.cpu() if hasattr(got, "cpu") else got).astype(np.float64)
            np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2, err_msg=f"{name} batch {batch}")
    e = gpu.explain()
    assert any("captured and replayed" in o for o in e.options), e.options
    assert all(n["kernel"] != "onnx_ref" for n in e.nodes)
    if name == "resnet50":  # the nhwc_layout pass: channels-last convolutions whose channels are multiples of 8
        assert any("NHWC" in n["reason"] for n in e.nodes), [n["reason"] for n in e.nodes]


def test_control_flow_reads_values_of_the_enclosing_graph():
    """If and Loop bodies read a value computed by a kernel step of the outer graph (an implicit input: its arena slot
    must stay alive until the control-flow node has run)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    then_g = helper.make_graph([helper.make_node("Add", ["r", "r"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [4])])
    else_g = helper.make_graph([helper.make_node("Mul", ["r", "two"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [4])], [two])
    # Loop: 3 iterations of acc = acc + r.
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "r"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [4])])
    trips = helper.make_tensor("trips", TensorProto.INT64, [], [3])
    zeros = helper.make_tensor("zeros", TensorProto.FLOAT, [4], [0.0] * 4)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Loop", ["trips", "", "zeros"], ["z"], body=body)],
        "control_flow", [x, flag], [y, z], [trips, zeros])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = xrt.InferenceSession(model.SerializeToString(), engine="native")
    data = np.array([-1.0, 0.5, 2.0, -3.0], np.float32)
    relu = np.maximum(data, 0)
    for cond in (True, False):
        out = session.run({"x": data, "flag": np.array(cond)})
        np.testing.assert_allclose(out["y"], relu * 2)  # r + r and r * 2 agree, through either branch
        np.testing.assert_allclose(out["z"], relu * 3)
    kernels = {n["op_type"]: n["kernel"] for n in session.explain().nodes}
    assert kernels["Loop"] == "onnx_ref" and kernels["Relu"] == "cpu"
    # An If on a fed condition ends a segment; the next one runs the branch taken (the last run's: else) inlined
    # (Note [Segmented plans]), reading r across the boundary.
    assert "If" not in kernels and kernels["Mul"] == "cpu"
    assert "If 'If_1'" in session.explain().segments[0] or "If" in session.explain().segments[0]


def test_passes_can_be_turned_off_by_name_and_the_optimized_graph_saved(models, tmp_path):
    path = model_path(models, "bert", "fp32")
    x = make_input("bert", 2, "fp32")
    saved = tmp_path / "bert_optimized.onnx"
    fused = xrt.InferenceSession(path, engine="native", optimized_model_path=saved)
    plain = xrt.InferenceSession(path, engine="native", disabled_passes=["attention_fusion", "gemm_fusion"])
    ops_fused = {n["op_type"] for n in fused.explain().nodes}
    ops_plain = {n["op_type"] for n in plain.explain().nodes}
    assert {"xpuruntime:Attention", "xpuruntime:Linear"} <= ops_fused
    assert "xpuruntime:Attention" not in ops_plain and "xpuruntime:Linear" not in ops_plain and "MatMul" in ops_plain
    (info,) = fused.get_inputs()
    a = fused.run(None, {info.name: x})[0]  # the first run writes the optimized graph (for its input shapes)
    np.testing.assert_allclose(plain.run(None, {info.name: x})[0], a, rtol=1e-4, atol=1e-4)
    # The saved graph is valid ONNX with the fused nodes, and the native engine runs it to the same result.
    model = onnx.load(str(saved))
    assert any(n.domain == "com.xpuruntime" and n.op_type == "Attention" for n in model.graph.node)
    reloaded = xrt.InferenceSession(saved, engine="native")
    np.testing.assert_allclose(reloaded.run(None, {info.name: x})[0], a, rtol=1e-5, atol=1e-5)
    with pytest.raises(xrt.InvalidArgumentError, match="unknown graph pass 'gemm_fusoin'.*valid names"):
        xrt.InferenceSession(path, engine="native", disabled_passes=["gemm_fusoin"])
    with pytest.raises(xrt.InvalidArgumentError, match="disabled_passes is an option of the native engine"):
        xrt.InferenceSession(path, engine="onnxruntime", disabled_passes=["gemm_fusion"])


def test_memory_limit_below_the_plans_peak_is_a_typed_error(models):
    path = model_path(models, "resnet50", "fp32")
    with pytest.raises(xrt.OutOfMemoryError, match="memory_limit"):
        xrt.InferenceSession(path, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit="64KiB"))
    session = xrt.InferenceSession(path, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit="256MiB"))
    (info,) = session.get_inputs()
    assert session.run(None, {info.name: make_input("resnet50", 1, "fp32")})[0].shape[0] == 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not HAS_GPU,
                                                                                       reason="needs a CUDA device"))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_outer_slices_and_gathers_are_views_at_an_offset(device, dtype):
    """Note [Views at an offset]: q, k and v cut from the outer axis of a [3, B, H, S, D] tensor (Gather of one
    index, Slice + Squeeze, Split) are views into its bytes, no kernel; cuts that are not one contiguous block or not
    16-byte aligned stay kernels; every output matches NumPy."""
    from onnx import TensorProto, helper

    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    shape = [3, 2, 3, 5, 8]
    ints = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)  # noqa: E731
    nodes = [
        helper.make_node("Add", ["x", "x"], ["qkv"]),  # an intermediate: a slot of the arena
        helper.make_node("Gather", ["qkv", "i1"], ["k"], name="take_k", axis=0),
        helper.make_node("Slice", ["qkv", "s2", "e3", "a0"], ["v5"], name="cut_v"),
        helper.make_node("Squeeze", ["v5", "a0"], ["v"]),
        helper.make_node("Split", ["qkv", "split"], ["p0", "p1", "p2"], name="split", axis=0),
        helper.make_node("Gather", ["qkv", "im1"], ["last"], name="take_last", axis=0),  # index -1
        helper.make_node("Gather", ["qkv", "i1"], ["inner"], name="take_inner", axis=1),  # not one block
        helper.make_node("Slice", ["qkv", "s2", "e3", "a4"], ["odd"], name="cut_odd"),  # D cut: strided
        helper.make_node("Slice", ["p1", "s1", "e2", "a3"], ["row"], name="cut_row"),  # row 1 of 5 in p1: strided
        helper.make_node("Mul", ["k", "v"], ["kv"]),
        helper.make_node("Add", ["y", "y"], ["yy"]),
        helper.make_node("Gather", ["yy", "i1"], ["y1"], name="take_y1", axis=0),  # from byte 5 * size: unaligned
    ]
    inits = [helper.make_tensor("i1", TensorProto.INT64, [], [1]),
             helper.make_tensor("im1", TensorProto.INT64, [], [-1]), ints("s2", [2]), ints("e3", [3]), ints("a0", [0]),
             ints("a4", [4]), ints("s1", [1]), ints("e2", [2]),
             ints("a3", [3]), ints("split", [1, 1, 1])]
    outs = ["kv", "p0", "p2", "last", "inner", "odd", "row", "y1"]
    graph = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", elem, shape),
                                               helper.make_tensor_value_info("y", elem, [3, 5])],
                              [helper.make_tensor_value_info(o, elem, None) for o in outs], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = xrt.InferenceSession(model.SerializeToString(), engine="native", device=device)
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype)
    y = np.random.default_rng(4).standard_normal([3, 5]).astype(dtype)
    got = dict(zip(outs, session.run(None, {"x": x, "y": y})))
    q = x + x
    want = {"kv": q[1] * q[2], "p0": q[0:1], "p2": q[2:3], "last": q[-1], "inner": q[:, 1], "odd": q[..., 2:3],
            "row": q[1:2, :, :, 1:2], "y1": (y + y)[1]}
    for name in outs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    kernels = {n["node"]: (n["kernel"], n["reason"]) for n in session.explain().nodes}
    for viewed in ("take_k", "cut_v", "take_last"):
        assert kernels[viewed][0] == "view" and "contiguous block" in kernels[viewed][1], kernels[viewed]
    for copied in ("take_inner", "cut_odd", "cut_row", "take_y1"):
        assert kernels[copied][0] != "view", kernels[copied]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not HAS_GPU,
                                                                                       reason="needs a CUDA device"))])
def test_transposes_of_size_one_axes_are_views(device):
    """Note [Transposes of size-1 axes are views]: a decode step's new key [B, 1, H, D] -> [B, H, 1, D] (and any
    Transpose that keeps the order of the axes longer than 1) is a view, no kernel; one that reorders two such axes
    stays a kernel; every output matches NumPy."""
    from onnx import TensorProto, helper

    x = np.arange(2 * 1 * 3 * 4, dtype=np.float32).reshape(2, 1, 3, 4)
    nodes = [helper.make_node("Add", ["x", "x"], ["xx"]),  # an intermediate: a slot of the arena
             helper.make_node("Transpose", ["xx"], ["heads"], name="heads", perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["heads"], ["back"], name="back", perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["xx"], ["front"], name="front", perm=[1, 0, 2, 3]),
             helper.make_node("Transpose", ["xx"], ["swapped"], name="swapped", perm=[0, 1, 3, 2])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
               for name in ("heads", "back", "front", "swapped")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 3, 4])]
    graph = helper.make_graph(nodes, "transposes", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = xrt.InferenceSession(model.SerializeToString(), engine="native", device=device)
    got = session.run({"x": x})
    xx = x + x
    want = {"heads": xx.transpose(0, 2, 1, 3), "back": xx, "front": xx.transpose(1, 0, 2, 3),
            "swapped": xx.transpose(0, 1, 3, 2)}
    for name, value in want.items():
        np.testing.assert_array_equal(np.asarray(got[name].cpu().numpy() if hasattr(got[name], "cpu") else got[name]),
                                      value, err_msg=name)
    kernels = {n["node"]: n["kernel"] for n in session.explain().nodes}
    assert [kernels[name] for name in ("heads", "back", "front")] == ["view"] * 3, kernels
    assert kernels["swapped"] != "view", kernels


def eager_gqa_attention_model(batch=2, heads=4, kv_heads=2, seq=5, dim=8, softmax_first=False) -> bytes:
    """transformers' eager attention in float16 (Note [Softmax in float32]): repeat_kv (Unsqueeze, Expand, Reshape) of
    k and v, MatMul(q, k^T) * scale + mask, Cast(to=float) -> Softmax -> Cast back, MatMul(p, v). `softmax_first`:
    as PyTorch's TorchScript exporter writes softmax(dtype=float32).to(float16): Softmax -> Cast(float) -> Cast back
    (Note [Round-trip casts])."""
    from onnx import TensorProto, helper, numpy_helper

    rep = heads // kv_heads
    f16 = TensorProto.FLOAT16
    inputs = [helper.make_tensor_value_info("q", f16, [batch, heads, seq, dim]),
              helper.make_tensor_value_info("k", f16, [batch, kv_heads, seq, dim]),
              helper.make_tensor_value_info("v", f16, [batch, kv_heads, seq, dim]),
              helper.make_tensor_value_info("mask", f16, [batch, 1, seq, seq])]
    consts = [numpy_helper.from_array(np.array([2], np.int64), "axis2"),
              numpy_helper.from_array(np.array([batch, kv_heads, rep, seq, dim], np.int64), "expanded"),
              numpy_helper.from_array(np.array([batch, heads, seq, dim], np.int64), "merged"),
              numpy_helper.from_array(np.array(dim ** -0.5, np.float16), "scale")]
    nodes = []
    for t in ("k", "v"):
        nodes += [helper.make_node("Unsqueeze", [t, "axis2"], [f"{t}_u"]),
                  helper.make_node("Expand", [f"{t}_u", "expanded"], [f"{t}_e"]),
                  helper.make_node("Reshape", [f"{t}_e", "merged"], [f"{t}_r"])]
    nodes += [helper.make_node("Transpose", ["k_r"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Add", ["ss", "mask"], ["sm"]),
              helper.make_node("Cast", ["sm"], ["sf"], to=TensorProto.FLOAT),
              helper.make_node("Softmax", ["sf"], ["pf"], axis=-1),
              helper.make_node("Cast", ["pf"], ["p"], to=f16),
              helper.make_node("MatMul", ["p", "v_r"], ["o"])]
    if softmax_first:
        nodes[-4:-1] = [helper.make_node("Softmax", ["sm"], ["ph"], axis=-1),
                        helper.make_node("Cast", ["ph"], ["pf"], to=TensorProto.FLOAT),
                        helper.make_node("Cast", ["pf"], ["p"], to=f16)]
    graph = helper.make_graph(nodes, "eager_gqa_attention", inputs,
                              [helper.make_tensor_value_info("o", f16, [batch, heads, seq, dim])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("softmax_first", [False, True], ids=["cast-softmax-cast", "softmax-cast-cast"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_GPU,
                                                                                          reason="needs a GPU"))])
def test_eager_attention_with_a_float32_softmax_and_repeated_kv_heads_fuses(device, softmax_first):
    """Note [Softmax in float32], Note [Round-trip casts] and Note [Grouped-query attention reads its kv heads]: the
    whole chain becomes one Attention reading the kv heads in place, and its output is float32 attention's within
    float16 noise."""
    batch, heads, kv_heads, seq, dim = 2, 4, 2, 5, 8
    rng = np.random.default_rng(5)
    q = rng.normal(0, 1, (batch, heads, seq, dim)).astype(np.float16)
    k = rng.normal(0, 1, (batch, kv_heads, seq, dim)).astype(np.float16)
    v = rng.normal(0, 1, (batch, kv_heads, seq, dim)).astype(np.float16)
    causal = np.triu(np.full((seq, seq), -65504.0, np.float32), 1)
    mask = np.broadcast_to(causal, (batch, 1, seq, seq)).astype(np.float16).copy()
    mask[1, :, :, 0] = -65504.0  # the second row's first position is padding (every query still sees itself)
    np.fill_diagonal(mask[1, 0], 0)
    session = xrt.InferenceSession(eager_gqa_attention_model(batch, heads, kv_heads, seq, dim, softmax_first),
                                   engine="native", device=device)
    out = session.run({"q": q, "k": k, "v": v, "mask": mask})["o"]
    ran = [n["op_type"] for n in session.explain().nodes]
    assert "xpuruntime:Attention" in ran, ran
    assert not {"Softmax", "Cast", "Expand", "MatMul"} & set(ran), ran
    kr = np.repeat(k.astype(np.float32), heads // kv_heads, axis=1)
    vr = np.repeat(v.astype(np.float32), heads // kv_heads, axis=1)
    scores = q.astype(np.float32) @ kr.transpose(0, 1, 3, 2) * dim ** -0.5 + mask.astype(np.float32)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    reference = (p / p.sum(-1, keepdims=True)) @ vr
    np.testing.assert_allclose(np.asarray(out, np.float32), reference, rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_gpu_plans_of_several_shapes_share_their_device_constants(models):
    """Note [Constants shared between plans]: a CUDA session run at three batch sizes builds a plan per shape over one
    device copy of its weights, and each plan's outputs are still the CPU's."""
    import re

    path = model_path(models, "bert", "fp32")
    session = xrt.InferenceSession(path, engine="native", device="cuda")
    cpu = xrt.InferenceSession(path, engine="native")
    (info,) = session.get_inputs()
    for batch in (1, 2, 3):
        x = make_input("bert", batch, "fp32")
        np.testing.assert_allclose(session.run(None, {info.name: x})[0], cpu.run(None, {info.name: x})[0],
                                   rtol=1e-3, atol=1e-3)
    text = str(session.explain())
    plans = int(re.search(r"plans built: (\d+)", text)[1])
    shared = re.search(r"device constants: (\d+) tensors, ([\d.]+) MiB, shared by the plans \((\d+) taken", text)
    per_plan = re.search(r"constants ([\d.]+) (MiB|KiB)", text)
    assert plans >= 3 and shared, text
    assert int(shared[3]) > 0
    per_plan_mib = float(per_plan[1]) / (1024 if per_plan[2] == "KiB" else 1)
    assert float(shared[2]) < 1.5 * per_plan_mib, (shared[0], per_plan[0])  # about one copy, not one per plan


def test_idle_executors_give_their_memory_back_when_a_run_is_out_of_memory():
    """Note [Idle executors give their memory back]: under a memory limit that the arena of one shape fits but not
    two, a run of a second shape drops the first shape's idle executor and runs (the explanation says so); with no
    idle executor to drop, the run is a typed OutOfMemoryError and the session still works afterwards."""
    import re

    from onnx import TensorProto, helper, numpy_helper

    import xpuruntime.runtime as rt

    weight = np.random.default_rng(0).normal(0, 0.1, (256, 256)).astype(np.float32)
    nodes, previous = [], "x"
    for i in range(6):
        nodes += [helper.make_node("MatMul", [previous, "w"], [f"h{i}"]),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        previous = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 256])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["b", 256])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()

    def reference(x):
        for _ in range(6):
            x = np.maximum(x @ weight, 0)
        return x

    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4096, 256)).astype(np.float32), rng.normal(size=(4000, 256)).astype(np.float32)
    session = xrt.InferenceSession(model, engine="native")
    session.run({"x": a})
    arena = float(re.search(r"arena ([\d.]+) MiB", str(session.explain()))[1]) * 2 ** 20
    try:
        rt.set_memory_limit(int(rt.memory_allocated("cpu") + 0.75 * arena), "cpu")
        out = session.run({"x": b})[previous]
        np.testing.assert_allclose(out, reference(b), rtol=1e-4, atol=1e-4)
        assert "1 idle executor(s) gave their arenas back" in str(session.explain())
        fresh = xrt.InferenceSession(model, engine="native")
        with pytest.raises(xrt.OutOfMemoryError):  # nothing idle to give back: the error stands
            fresh.run({"x": np.concatenate([a, a])})
    finally:
        rt.set_memory_limit(0, "cpu")
    np.testing.assert_allclose(session.run({"x": a})[previous], reference(a), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,one,kept", [("Mul", np.float32(1.0), False), ("Div", np.float32(1.0), False),
                                         ("Mul", np.ones((1, 1), np.float32), False),
                                         ("Mul", np.float32(1.5), True),             # not 1
                                         ("Mul", np.ones((2, 1, 1), np.float32), True)])  # broadcasts x up a rank
def test_mul_and_div_by_one_go(op, one, kept):
    """identity_elimination: x * 1 and x / 1 by a one-element constant that does not grow x are removed, also when
    the result is a graph output (its producer is renamed); a factor that is not 1 or that broadcasts x stays."""
    from onnx import TensorProto, helper, numpy_helper

    x = np.array([[1.5, -0.0, np.inf], [np.nan, -2.25, 3.0]], np.float32)
    out_shape = list(np.broadcast_shapes(x.shape, np.shape(one)))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Add", ["r", "n"], ["a"]), helper.make_node(op, ["a", "c"], ["y"])]
    graph = helper.make_graph(nodes, "by_one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(one, np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = xrt.InferenceSession(model.SerializeToString(), device="cpu", engine="native",
                                   disabled_passes=["elementwise_fusion"])
    (y,) = session.run(None, {"x": x})
    with np.errstate(invalid="ignore"):  # inf + -inf: NaN, as the graph gives
        a = np.maximum(x, 0) + -x
    want = a * one if op == "Mul" else a / one
    np.testing.assert_array_equal(np.asarray(y), want)
    ops = [n["op"] for n in session.explain().nodes if n["op"]]
    assert (op.lower() in ops) == kept, ops
