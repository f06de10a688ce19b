"""Generated fused kernels (Note [Fused elementwise programs], Note [Generated kernels]): the elementwise_fusion
pass on the real-model suite's exports, what a policy does to it, bad programs, and on a GPU the generated CUDA
kernels: the same answers as the unfused plan, explained, cached on disk and replayed from a lock file by a second
process. The kernels themselves are checked against NumPy at odd shapes in test_conformance.py
(fused_elementwise cases, every kernel)."""

import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import xpuruntime as xrt

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "suite" / "tiny"
HAS_GPU = xrt.get_device_count() > 0
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda:0", marks=requires_gpu)]


def _session(name, device="cpu", **kwargs):
    return xrt.InferenceSession(str(TINY / f"{name}.onnx"), engine="native", device=device, **kwargs)


def _feeds(name):
    data = np.load(TINY / f"{name.split('.')[0]}.npz")
    session = _session(name)
    feeds = {}
    for i in session.get_inputs():
        x = data[f"in.{i.name}"]
        feeds[i.name] = x.astype(np.float16) if "float16" in name and x.dtype == np.float32 else x
    return feeds


def _fused(session):
    return [n for n in session.explain().nodes if n["op_type"] == "xpuruntime:FusedElementwise"]


# What the pass must find on the exports: SiLU and the squeeze-excitation gate (EfficientNet), SwiGLU and RMSNorm's
# tail (Llama), layer scale + residual (ConvNeXt).
@pytest.mark.parametrize("name,at_least,ops", [
    ("efficientnet.dynamo.float32", 20, {"Sigmoid", "Mul"}),
    ("llama.dynamo.float32", 8, {"Sigmoid", "Mul"}),
    ("convnext.dynamo.float32", 3, {"Mul", "Add"}),
])
def test_elementwise_fusion_on_suite_exports(name, at_least, ops):
    session = _session(name)
    fused = _fused(session)
    assert len(fused) >= at_least, collections.Counter(n["op_type"] for n in session.explain().nodes)
    for n in fused:  # each group says what it computes
        assert "program: " in n["reason"], n
    programs = " ".join(n["reason"].split("program: ")[-1] for n in fused)
    assert all(op.lower() in programs for op in ops), programs


def test_rms_norm_of_the_exporter_is_one_group():
    """PyTorch's exporter writes Llama's RMSNorm in float32 between casts: Cast, Pow, ReduceMean, Add, Sqrt,
    Reciprocal, Mul, Cast, Mul. Each becomes one group whose program casts, reduces over the last axis and casts back
    (Note [Fused elementwise programs]); no ReduceMean, Pow or Cast of the norms is left."""
    session = _session("llama.dynamo.float16")
    nodes = session.explain().nodes
    norms = [n for n in _fused(session) if "reduce_mean" in n["reason"]]
    assert len(norms) >= 5, [n["reason"] for n in _fused(session)]  # two per layer and the final norm
    for n in norms:
        program = n["reason"].split("program: ")[-1]
        assert program.startswith(("f32 x0; mul t0 t0; reduce_mean t1", "add x0 x1; f32 t0")), program
        assert "f16" in program, program
    left = collections.Counter(n["op_type"] for n in nodes)
    assert left["ReduceMean"] == 0 and left["Pow"] == 0, left


@pytest.mark.parametrize("name", ["swin_v2.torchscript.float16", "swin_v2.dynamo.float32"])
def test_the_cosine_attentions_normalisations_are_one_group_each(name):
    """Swin V2 normalises q and k with F.normalize: ReduceL2, Clip(min=eps), Expand to q's shape, Div. The Expand
    goes (Note [Expands before broadcasting ops]) and the Clip becomes a Max (Note [Clips between elementwise ops]),
    so each normalisation is one row program that reduces and divides; no Clip, Expand, Sqrt or ReduceSum is left,
    and the window partitions' zero Pads are gone. The outputs match the export's reference."""
    session = _session(name)
    left = collections.Counter(n["op_type"] for n in session.explain().nodes)
    for op in ("Clip", "Expand", "Sqrt", "ReduceSum", "ReduceL2", "Pad"):
        assert left[op] == 0, left
    norms = [n for n in _fused(session) if "reduce_sum" in n["reason"] and "div" in n["reason"]]
    assert len(norms) >= 4, [n["reason"] for n in _fused(session)]  # q and k in each of the tiny model's 2 blocks
    data = np.load(TINY / "swin_v2.npz")
    got = session.run(_feeds(name))
    value = np.asarray(list(got.values())[0] if isinstance(got, dict) else got[0], dtype=np.float32)
    want = data["ref.output"]
    np.testing.assert_allclose(value, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["swin_v2.torchscript.float16", "swin_v2.dynamo.float32"])
def test_swin_v2s_post_norm_adds_are_the_norms_addends(name, device):
    """Swin V2's blocks add each branch after its norm (x + norm(attn(x)), x + norm(mlp(x))): each such Add becomes
    its LayerNormalization's addend input (the post_norm_residual_fusion pass), the last one the final norm's
    residual, so no Add is left; the outputs match the export's reference."""
    session = _session(name, device=device)
    explanation = session.explain()
    left = collections.Counter(n["op_type"] for n in explanation.nodes)
    assert left["Add"] == 0, left
    assert "pass post_norm_residual_fusion: 3 rewrite(s)" in str(explanation)  # 2 blocks x 2, the last a residual
    data = np.load(TINY / "swin_v2.npz")
    got = session.run(_feeds(name))
    value = np.asarray(list(got.values())[0] if isinstance(got, dict) else got[0], dtype=np.float32)
    want = data["ref.output"]
    np.testing.assert_allclose(value, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))


@pytest.mark.parametrize("key", ["dynamo.float16", "dynamo.float32", "torchscript.float32"])
def test_the_rotary_embedding_is_one_group(key):
    """q * cos + rotate_half(q) * sin, with rotate_half written as Concat(Neg(Slice(q, D/2:)), Slice(q, :D/2)): one
    group whose program reads q rotated (Note [Fused elementwise programs]); no Slice, Neg or Concat of it is left."""
    session = _session(f"llama.{key}")
    programs = [n["reason"].split("program: ")[-1] for n in _fused(session)]
    rotary = [p for p in programs if "rotate_half" in p]
    assert len(rotary) >= 4, programs  # q and k in each of the two layers
    left = collections.Counter(n["op_type"] for n in session.explain().nodes)
    assert left["Concat"] == 0 and left["Neg"] == 0, left


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["efficientnet.dynamo.float32", "llama.dynamo.float16", "convnext.dynamo.float16",
                                  "llama.dynamo.float32", "t5_encoder.dynamo.float16"])
def test_fused_plan_matches_the_unfused_plan(name, device):
    feeds = _feeds(name)
    # linear_epilogue_fusion would take ConvNeXt's layer-scale groups into its GEMMs first (CUDA plans).
    fused = _session(name, device, disabled_passes=["linear_epilogue_fusion"])
    # concat_fusion would make the rotary Concat (a Neg's and a Slice's) one node of pieces (Note [Concats of fused
    # values])
    plain = _session(name, device, disabled_passes=["elementwise_fusion", "linear_epilogue_fusion", "concat_fusion"])
    assert _fused(fused) and not _fused(plain)
    for a, b in zip(fused.run(None, feeds), plain.run(None, feeds)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(1.0, float(np.abs(b).max()))
        tol = 2e-2 if "float16" in name else 1e-4  # the fused group skips float16 roundings of its intermediates
        assert float(np.abs(a - b).max()) <= tol * scale


def test_a_policy_rule_keeps_its_ops_out_of_the_groups():
    """A KernelPolicy rule for an op or its family means the user chose that node's kernel: it stays a node."""
    fused = len(_fused(_session("efficientnet.dynamo.float32")))
    kept = _session("efficientnet.dynamo.float32", kernel_policy=xrt.KernelPolicy({"sigmoid": "cpu"}))
    assert len(_fused(kept)) < fused
    assert any(n["op_type"] == "Sigmoid" for n in kept.explain().nodes)
    family = _session("efficientnet.dynamo.float32", kernel_policy=xrt.KernelPolicy({"activation": "pin:cpu"}))
    assert not any("sigmoid" in n["reason"].split("program: ")[-1] for n in _fused(family))


def test_bad_programs_are_typed_errors():
    x = np.ones((2, 3), np.float32)
    for program, match in [("", "no instruction"), ("frob x0", "unknown op 'frob'"), ("add x0", "takes 2 operand"),
                           ("neg x1", "the node has 1 inputs"), ("neg t0", "not computed yet"),
                           ("neg x0; exp y2", "neither x<input> nor t<instruction>")]:
        with pytest.raises(xrt.InvalidArgumentError, match=match):
            xrt.ops.call("fused_elementwise", [x], {"program": program})
    with pytest.raises(xrt.InvalidArgumentError, match="input x1 is never read"):
        xrt.ops.call("fused_elementwise", [x, x], {"program": "neg x0"})
    with pytest.raises(xrt.InvalidTypeError, match="float32, float16 or bfloat16"):
        xrt.ops.call("fused_elementwise", [x, x.astype(np.int32)], {"program": "add x0 x1"})
    with pytest.raises(xrt.InvalidArgumentError, match="row_axes = 3 for an output of rank 2"):
        xrt.ops.call("fused_elementwise", [x], {"program": "reduce_sum x0", "row_axes": 3})
    with pytest.raises(xrt.InvalidTypeError, match="output_dtype int64"):
        xrt.ops.call("fused_elementwise", [x], {"program": "neg x0", "output_dtype": "int64"})
    with pytest.raises(xrt.InvalidArgumentError, match="rotate_half reads an input"):
        xrt.ops.call("fused_elementwise", [x], {"program": "neg x0; rotate_half t0"})
    with pytest.raises(xrt.InvalidArgumentError, match="rotate_half needs an output whose last axis has an even size"):
        xrt.ops.call("fused_elementwise", [x], {"program": "rotate_half x0"})  # the last axis is 3
    # Mixed float dtypes are fine (casts fuse); the output is input 0's dtype unless output_dtype says otherwise.
    y = xrt.ops.call("fused_elementwise", [x.astype(np.float16), x],
                     {"program": "add x0 x1", "output_dtype": "float32"})
    assert np.asarray(y[0]).dtype == np.float32 and float(np.asarray(y[0]).max()) == 2.0
    with pytest.raises(xrt.InvalidArgumentError, match="cannot be broadcast"):
        xrt.ops.call("fused_elementwise", [x, np.ones((4,), np.float32)], {"program": "add x0 x1"})


@requires_gpu
def test_generated_kernels_are_explained_and_cached_on_disk(tmp_path):
    session = _session("efficientnet.dynamo.float16", "cuda:0")
    fused = _fused(session)
    assert fused and all(n["kernel"] == "generated" and n["backend"] == "codegen" for n in fused), fused[:2]
    assert all("source " in n["reason"] and "program: " in n["reason"] for n in fused)
    # A fresh process (this one may hold the kernels in memory from earlier tests) writes them to the cache folder.
    build = ("import sys, xpuruntime as xrt; "
             "xrt.InferenceSession(sys.argv[1], engine='native', device='cuda:0')")
    out = subprocess.run([sys.executable, "-c", build, str(TINY / "efficientnet.dynamo.float16.onnx")],
                         env=dict(os.environ, XPURT_CODEGEN_CACHE=str(tmp_path)), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    cubins = sorted(tmp_path.glob("*.cubin"))
    assert cubins and len(list(tmp_path.glob("*.cu"))) == len(cubins)
    assert "__global__" in cubins[0].with_suffix(".cu").read_text()


REPLAY = textwrap.dedent("""
    import json, sys
    import numpy as np
    import xpuruntime as xrt
    cache = xrt.AutotuneCache(sys.argv[1])
    d = xrt.Dispatcher(xrt.KernelPolicy(auto_strategy="BestPerformance"), xrt.ExecutionPolicy(), cache)
    x = xrt.from_numpy(np.linspace(-3, 3, 4 * 37, dtype=np.float32).reshape(4, 37)).to("cuda:0")
    w = xrt.from_numpy(np.linspace(0.5, 1.5, 37, dtype=np.float32)).to("cuda:0")
    out, decision = d.run("fused_elementwise", [x, w], {"program": "sigmoid x0; mul x0 t0; mul t1 x1"})
    print(json.dumps({"kernel": decision.kernel, "rule": decision.rule, "record": decision.plan_record,
                      "sum": float(np.asarray(out[0].numpy(), np.float64).sum())}))
""")


@requires_gpu
def test_a_lock_file_replays_the_same_generated_kernel_in_a_second_process(tmp_path):
    lock = tmp_path / "policy.lock.json"
    env = dict(os.environ, XPURT_CODEGEN_CACHE=str(tmp_path / "codegen"))

    def run():
        out = subprocess.run([sys.executable, "-c", REPLAY, str(lock)], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["kernel"] == "generated" and first["rule"] == "autotuned"
    assert second["kernel"] == "generated" and second["rule"] == "autotune-cache"
    assert json.loads(second["record"])["source_hash"] == json.loads(first["record"])["source_hash"]
    assert second["sum"] == first["sum"]
    # A lock file naming code this version does not generate is refused, not silently replaced.
    text = lock.read_text()
    lock.write_text(text.replace(json.loads(first["record"])["source_hash"], "0123456789abcdef"))
    out = subprocess.run([sys.executable, "-c", REPLAY, str(lock)], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "0123456789abcdef" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_scalar_shapes(device):
    x = xrt.from_numpy(np.zeros((0, 5), np.float32)).to(device)
    b = xrt.from_numpy(np.ones((5,), np.float32)).to(device)
    (y,) = xrt.ops.call("fused_elementwise", [x, b], {"program": "add x0 x1; sigmoid t0"})
    assert y.shape == [0, 5] or tuple(y.shape) == (0, 5)
    s = xrt.from_numpy(np.array(2.0, np.float32)).to(device)
    (z,) = xrt.ops.call("fused_elementwise", [s, s], {"program": "mul x0 x1; sqrt t0"})
    np.testing.assert_allclose(z.numpy(), 2.0, rtol=1e-6)


@pytest.mark.parametrize("name", ["llama.dynamo.float32", "llama.dynamo.float16"])
def test_a_tuned_policy_replays_the_same_groups(name):
    """`xpuruntime tune` pins a kernel per registry op, fused_elementwise and the unfused add/mul nodes alike; a
    session under that policy must fuse the same nodes (the rule for fused_elementwise says the policy was written for
    a fused plan), and run each node on the kernel it names."""
    from xpuruntime import cli

    first = _session(name)
    explained = first.explain()
    policy, _, _ = cli.resolved_policy(explained)
    # Ops also fused elsewhere: the policy has rules for them, which must not keep the groups from forming.
    assert any(f"\"{op}\"" in policy.to_json() for op in ("add", "mul", "sigmoid", "cast", "sub", "div")), \
        policy.to_json()
    replay = _session(name, kernel_policy=policy)
    assert [(n["node"], n["op_type"], n["kernel"]) for n in replay.explain().nodes] == \
           [(n["node"], n["op_type"], n["kernel"]) for n in explained.nodes]
    assert _fused(replay)


# ---- a QuantizeLinear at the end of a group (Note [Quantized output of a fused program]) ----

def _add_relu_quantize(zero_point, shape=(2, 8, 5, 7), relu_is_output=False) -> bytes:
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s")]
    q_inputs = ["r", "s"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(np.array(zero_point[0], zero_point[1]), "z"))
        q_inputs.append("z")
    out_type = TensorProto.UINT8 if zero_point is None or zero_point[1] == np.uint8 else TensorProto.INT8
    nodes = [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("QuantizeLinear", q_inputs, ["q"])]
    outputs = [helper.make_tensor_value_info("q", out_type, list(shape))]
    if relu_is_output:
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(shape)))
    graph = helper.make_graph(nodes, "add_relu_q", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape))
                                                    for n in ("a", "b")], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model.SerializeToString()


def _quantize_feeds(shape=(2, 8, 5, 7)):
    rng = np.random.default_rng(5)
    # Multiples of 0.025 = half a level: many sums fall on ties; large values saturate; one NaN.
    a = (rng.integers(-300, 300, shape) * 0.025).astype(np.float32)
    b = (rng.integers(-40, 40, shape) * 0.025).astype(np.float32)
    a.flat[3] = np.nan
    return {"a": a, "b": b}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zero_point", [(-3, np.int8), (17, np.uint8), None], ids=["int8", "uint8", "no-zp"])
def test_a_quantize_linear_ends_the_group_with_the_unfused_levels(device, zero_point):
    model = _add_relu_quantize(zero_point)
    feeds = _quantize_feeds()
    fused = xrt.InferenceSession(model, engine="native", device=device)
    plain = xrt.InferenceSession(model, engine="native", device=device, disabled_passes=["elementwise_fusion"])
    ops = collections.Counter(n["op_type"] for n in fused.explain().nodes)
    assert ops == {"xpuruntime:FusedElementwise": 1}, ops
    assert "QuantizeLinear" in str(fused.explain())  # the pass's note: what it fused
    got, want = np.asarray(fused.run(feeds)["q"]), np.asarray(plain.run(feeds)["q"])
    assert got.dtype == want.dtype == (np.int8 if zero_point is not None and zero_point[1] == np.int8 else np.uint8)
    np.testing.assert_array_equal(got, want)
    levels = np.asarray(want).astype(np.int32)
    assert levels.min() != levels.max()


def test_a_quantize_linear_stays_when_the_group_value_has_other_readers():
    model = _add_relu_quantize((-3, np.int8), relu_is_output=True)
    session = xrt.InferenceSession(model, engine="native", device="cpu")
    ops = collections.Counter(n["op_type"] for n in session.explain().nodes)
    assert ops["QuantizeLinear"] == 1 and ops["xpuruntime:FusedElementwise"] == 1, ops


@requires_gpu
def test_a_quantize_linear_ends_a_float16_group_with_the_unfused_levels():
    # In a float16 plan the group's value is rounded to float16 before the QuantizeLinear reads it (the program ends
    # in f16): the levels equal the unfused float16 plan's.
    model = _add_relu_quantize((-3, np.int8))
    feeds = _quantize_feeds()
    policy = xrt.ExecutionPolicy(precision="fp16")
    fused = xrt.InferenceSession(model, engine="native", device="cuda:0", exec_policy=policy)
    plain = xrt.InferenceSession(model, engine="native", device="cuda:0", exec_policy=policy,
                                 disabled_passes=["elementwise_fusion"])
    programs = [n for n in fused.explain().nodes if n["op_type"] == "xpuruntime:FusedElementwise"]
    assert len(programs) == 1
    np.testing.assert_array_equal(fused.run(feeds)["q"], plain.run(feeds)["q"])


@pytest.mark.parametrize("device", DEVICES)
def test_one_elementwise_op_and_its_quantize_linear_become_one_kernel(device):
    # BERT's GELU -> QuantizeLinear: a group of one op fuses when a QuantizeLinear ends it.
    from onnx import TensorProto, helper, numpy_helper
    shape = [4, 6, 40]
    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["a"], ["t"]), helper.make_node("QuantizeLinear", ["t", "s", "z"], ["q"])],
        "sigmoid_q", [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("q", TensorProto.INT8, shape)],
        [numpy_helper.from_array(np.array(1.0 / 127, np.float32), "s"),
         numpy_helper.from_array(np.array(0, np.int8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    feeds = {"a": np.random.default_rng(6).normal(0, 3, shape).astype(np.float32)}
    fused = xrt.InferenceSession(model.SerializeToString(), engine="native", device=device)
    ops = collections.Counter(n["op_type"] for n in fused.explain().nodes)
    assert ops == {"xpuruntime:FusedElementwise": 1}, ops
    plain = xrt.InferenceSession(model.SerializeToString(), engine="native", device=device,
                                 disabled_passes=["elementwise_fusion"])
    np.testing.assert_array_equal(np.asarray(fused.run(feeds)["q"]), np.asarray(plain.run(feeds)["q"]))


# ---- a QuantizeLinear to float8 at the end of a group (Note [Quantized output of a fused program]) ----

FLOAT8 = {"float8e4m3fn": 17, "float8e5m2": 19}


def _float8_quantize_model(first_op: str, dtype: str, scale: float, zero_point: str, saturate=None,
                           float_type=None) -> bytes:
    """first_op (one op, or "Add+Relu") -> QuantizeLinear-19 to `dtype`; zero_point "zero" (a float8 0 initializer),
    "none" (opset 21's output_dtype attribute instead) or "one" (a float8 1.0: not fusable)."""
    from onnx import TensorProto, helper, numpy_helper
    float_type = float_type or TensorProto.FLOAT
    code = FLOAT8[dtype]
    inits = [numpy_helper.from_array(np.array(scale, np.float32 if float_type == TensorProto.FLOAT else np.float16),
                                     "s")]
    q_inputs = ["r", "s"]
    q_attrs = {}
    if zero_point == "none":
        q_attrs["output_dtype"] = code
    else:
        z = TensorProto()
        z.name, z.data_type = "z", code
        z.raw_data = bytes([0x00 if zero_point == "zero" else (0x38 if dtype == "float8e4m3fn" else 0x3C)])
        inits.append(z)
        q_inputs.append("z")
    if saturate is not None:
        q_attrs["saturate"] = saturate
    if first_op == "Add+Relu":
        nodes = [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Relu", ["t"], ["r"])]
        inputs = ["a", "b"]
    else:
        nodes = [helper.make_node(first_op, ["a"], ["r"])]
        inputs = ["a"]
    nodes.append(helper.make_node("QuantizeLinear", q_inputs, ["q"], **q_attrs))
    graph = helper.make_graph(nodes, "float8_q", [helper.make_tensor_value_info(n, float_type, ["d0", "d1"])
                                                  for n in inputs],
                              [helper.make_tensor_value_info("q", code, ["d0", "d1"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21 if zero_point == "none" else 19)])
    model.ir_version = 9
    return model.SerializeToString()


def _all_float16_values() -> np.ndarray:
    """Every float16 bit pattern (NaNs of both signs, infinities, subnormals, zeros) as float32, exactly."""
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).reshape(256, 256)


def _codes_of(result) -> np.ndarray:
    """A float8 output as run() returns it (its values in float32, exactly) as bits: equal bits, equal codes, signed
    zeros included; a NaN decodes to one float32 NaN whatever its sign, so NaN signs are not compared here."""
    values = np.asarray(result)
    assert values.dtype == np.float32
    return values.view(np.uint32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", sorted(FLOAT8))
@pytest.mark.parametrize("scale", [1.0, 0.37, 2.0 ** -12, 300.0])
def test_a_float8_quantize_linear_ends_the_group_with_the_unfused_codes(device, dtype, scale):
    # Every float16 value (so every tie, subnormal, saturation and NaN of both formats is met), negated by the group:
    # the fused codes equal the unfused QuantizeLinear's on the cpu, bit for bit.
    model = _float8_quantize_model("Neg", dtype, scale, "zero")
    feeds = {"a": _all_float16_values()}
    fused = xrt.InferenceSession(model, engine="native", device=device)
    ops = collections.Counter(n["op_type"] for n in fused.explain().nodes)
    assert ops == {"xpuruntime:FusedElementwise": 1}, ops
    plain = xrt.InferenceSession(model, engine="native", device="cpu", disabled_passes=["elementwise_fusion"])
    assert collections.Counter(n["op_type"] for n in plain.explain().nodes)["QuantizeLinear"] == 1
    got_codes, want_codes = _codes_of(fused.run(feeds)["q"]), _codes_of(plain.run(feeds)["q"])
    np.testing.assert_array_equal(got_codes, want_codes)
    assert len(np.unique(want_codes)) > 100  # the values cover much of the format


@pytest.mark.parametrize("device", DEVICES)
def test_a_float8_quantize_linear_without_a_zero_point_fuses_and_others_stay(device):
    rng = np.random.default_rng(8)
    feeds = {"a": rng.normal(0, 40, (50, 33)).astype(np.float32), "b": rng.normal(0, 40, (50, 33)).astype(np.float32)}
    model = _float8_quantize_model("Add+Relu", "float8e4m3fn", 0.05, "none")
    fused = xrt.InferenceSession(model, engine="native", device=device)
    assert collections.Counter(n["op_type"] for n in fused.explain().nodes) == {"xpuruntime:FusedElementwise": 1}
    plain = xrt.InferenceSession(model, engine="native", device="cpu", disabled_passes=["elementwise_fusion"])
    np.testing.assert_array_equal(_codes_of(fused.run(feeds)["q"]), _codes_of(plain.run(feeds)["q"]))
    # A zero point other than 0 and saturate=0 are left to the QuantizeLinear node.
    for zero_point, saturate in (("one", None), ("zero", 0)):
        kept = xrt.InferenceSession(_float8_quantize_model("Add+Relu", "float8e5m2", 0.05, zero_point, saturate),
                                    engine="native", device=device)
        assert collections.Counter(n["op_type"] for n in kept.explain().nodes)["QuantizeLinear"] == 1


@requires_gpu
@pytest.mark.parametrize("dtype", sorted(FLOAT8))
@pytest.mark.parametrize("scale", [0.02, 300.0, 2.0 ** -12])
def test_a_float8_quantize_linear_ends_a_float16_group_with_the_unfused_codes(dtype, scale):
    # In a float16 plan the group's value is rounded to float16 first (the program ends in f16), as unfused, and the
    # quotient takes the branch-free correction: every float16 value (infinities, NaN, zeros, subnormals), negated.
    model = _float8_quantize_model("Neg", dtype, scale, "zero")
    feeds = {"a": _all_float16_values()}
    policy = xrt.ExecutionPolicy(precision="fp16")
    fused = xrt.InferenceSession(model, engine="native", device="cuda:0", exec_policy=policy)
    plain = xrt.InferenceSession(model, engine="native", device="cuda:0", exec_policy=policy,
                                 disabled_passes=["elementwise_fusion"])
    assert [n for n in fused.explain().nodes if n["op_type"] == "xpuruntime:FusedElementwise"]
    np.testing.assert_array_equal(_codes_of(fused.run(feeds)["q"]), _codes_of(plain.run(feeds)["q"]))


# ---- a QuantizeLinear written by the LayerNormalization it reads (Note [Quantized layer norm output]) ----

def _layer_norm_quantize_model(dtype: str, residual: bool, scale=0.03, shape=("rows", 96)) -> bytes:
    """x [+ r] -> LayerNormalization -> y (a graph output: the residual path's reader) and -> QuantizeLinear -> q."""
    from onnx import TensorProto, helper, numpy_helper
    cols = shape[-1]
    rng = np.random.default_rng(cols)
    inits = [numpy_helper.from_array(rng.normal(1, 0.3, cols).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.normal(0, 0.3, cols).astype(np.float32), "beta"),
             numpy_helper.from_array(np.array(scale, np.float32), "s")]
    if dtype in FLOAT8:
        z = TensorProto()
        z.name, z.data_type, z.raw_data = "z", FLOAT8[dtype], b"\x00"
        inits.append(z)
        out_type, opset = FLOAT8[dtype], 19
    else:
        inits.append(numpy_helper.from_array(np.array(-3 if dtype == "int8" else 120,
                                                      np.int8 if dtype == "int8" else np.uint8), "z"))
        out_type, opset = (TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8), 17
    nodes = []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    ln_in = "x"
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(shape)))
        nodes.append(helper.make_node("Add", ["x", "r"], ["sum"]))
        ln_in = "sum"
    nodes += [helper.make_node("LayerNormalization", [ln_in, "gamma", "beta"], ["y"], epsilon=1e-5),
              helper.make_node("QuantizeLinear", ["y", "s", "z"], ["q"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape)),
               helper.make_tensor_value_info("q", out_type, list(shape))]
    graph = helper.make_graph(nodes, "ln_q", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model.SerializeToString()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "float8e4m3fn", "float8e5m2"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cols", [96, 770, 1030, 4096])  # cached rows; odd rows: a warp, a block; a long row
def test_a_layer_norm_writes_the_quantize_linear_that_reads_it(device, dtype, residual, cols):
    model = _layer_norm_quantize_model(dtype, residual, shape=("rows", cols))
    rng = np.random.default_rng(cols + residual)
    feeds = {"x": rng.normal(0, 2, (37, cols)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.normal(0, 2, (37, cols)).astype(np.float32)
    fused = xrt.InferenceSession(model, engine="native", device=device)
    ops = collections.Counter(n["op_type"] for n in fused.explain().nodes)
    assert "QuantizeLinear" not in ops, ops
    assert any("its second output" in line for line in str(fused.explain()).splitlines())
    plain = xrt.InferenceSession(model, engine="native", device=device, disabled_passes=["elementwise_fusion"])
    assert collections.Counter(n["op_type"] for n in plain.explain().nodes)["QuantizeLinear"] == 1
    got, want = fused.run(feeds), plain.run(feeds)
    np.testing.assert_array_equal(np.asarray(got["y"]), np.asarray(want["y"]))
    if dtype in FLOAT8:
        np.testing.assert_array_equal(_codes_of(got["q"]), _codes_of(want["q"]))
    else:
        np.testing.assert_array_equal(np.asarray(got["q"]), np.asarray(want["q"]))
        assert len(np.unique(np.asarray(want["q"]))) > 50


@requires_gpu
@pytest.mark.parametrize("dtype", ["int8", "float8e4m3fn"])
def test_a_float16_layer_norm_quantizes_its_stored_value(dtype):
    model = _layer_norm_quantize_model(dtype, residual=True, shape=("rows", 768))
    rng = np.random.default_rng(3)
    feeds = {name: rng.normal(0, 2, (2048, 768)).astype(np.float32) for name in ("x", "r")}
    policy = xrt.ExecutionPolicy(precision="fp16")
    fused = xrt.InferenceSession(model, engine="native", device="cuda:0", exec_policy=policy)
    plain = xrt.InferenceSession(model, engine="native", device="cuda:0", exec_policy=policy,
                                 disabled_passes=["elementwise_fusion"])
    assert "QuantizeLinear" not in collections.Counter(n["op_type"] for n in fused.explain().nodes)
    got, want = fused.run(feeds), plain.run(feeds)
    np.testing.assert_array_equal(np.asarray(got["y"]), np.asarray(want["y"]))
    np.testing.assert_array_equal(np.asarray(got["q"]).view(np.uint8 if dtype == "int8" else np.uint32),
                                  np.asarray(want["q"]).view(np.uint8 if dtype == "int8" else np.uint32))


def test_layer_norm_quantized_output_attributes_are_checked():
    x = np.ones((2, 8), np.float32)
    y, yq = xrt.ops.call("layer_norm", [x], {"quantized_dtype": "float8e5m2", "y_scale": 0.5, "y_zero_point": 0})
    assert (yq.dtype, tuple(yq.shape)) == ("float8e5m2", (2, 8))
    with pytest.raises(xrt.InvalidTypeError, match="quantized_dtype"):
        xrt.ops.call("layer_norm", [x], {"quantized_dtype": "float16", "y_scale": 0.5})
    with pytest.raises(xrt.InvalidArgumentError, match="y_scale"):
        xrt.ops.call("layer_norm", [x], {"quantized_dtype": "int8", "y_scale": 0.0})
    with pytest.raises(xrt.InvalidArgumentError, match="y_zero_point"):
        xrt.ops.call("layer_norm", [x], {"quantized_dtype": "float8e4m3fn", "y_scale": 0.5, "y_zero_point": 1})


def test_cpu_exp_and_sigmoid_are_within_two_ulp():
    """Note [Vectorised exp on the CPU] in backends/cpu/cpu_fused.cpp: the cpu kernel's exp and sigmoid (a polynomial,
    vectorised) against numpy's float64 values, 2M points from -110 to 100 at odd lengths (the blocks' tails), where
    the float32 result is a normal number within 2 ulp for exp and 4 for sigmoid (1 / (1 + e^-x) adds two roundings to
    exp's: with std::exp it reached 3.7 ulp, now 2.35); NaN, infinities, zeros and the ends of the range (subnormal or
    overflowing results, which take std::exp) as the float64 values rounded to float32."""
    x = np.linspace(-110, 100, 2_000_003).astype(np.float32)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -87.01, -87.0, 88.0, 88.01, 88.72, 88.73,
                         -103.3, -104.0], np.float32)
    x = np.concatenate([x, specials])
    exact = {"exp": np.exp(x.astype(np.float64)), "sigmoid": 1.0 / (1.0 + np.exp(-x.astype(np.float64)))}
    ulps = {"exp": 2, "sigmoid": 4}
    for code, reference in exact.items():
        for n in (len(x), 7, 1):  # a whole program, and tails shorter than one block
            got = np.asarray(xrt.ops.call("fused_elementwise", [x[-n:]], {"program": f"{code} x0"})[0])
            want = reference[-n:]
            finfo = np.finfo(np.float32)
            normal = np.isfinite(want) & (np.abs(want) >= finfo.tiny) & (np.abs(want) <= finfo.max)
            step = np.spacing(np.abs(want[normal]).astype(np.float32)).astype(np.float64)
            assert np.all(np.abs(got[normal] - want[normal]) <= ulps[code] * step), (code, n)
            # The rest (std::exp's) as the float64 value rounded to float32: exp within one subnormal step (glibc's
            # expf rounds a few subnormal results the other way); sigmoid below -88.7 is 1 / (1 + inf) = 0 in float32,
            # within the smallest normal float of its subnormal value.
            atol = 2.0 ** -149 if code == "exp" else float(finfo.tiny)
            with np.errstate(over="ignore"):
                np.testing.assert_allclose(got[~normal], want[~normal].astype(np.float32), rtol=0, atol=atol,
                                           err_msg=code)


def _strided(x, offset, shape, strides):
    """NumPy's view of x's elements from `offset` on with element `strides`: what input_views declares."""
    flat = np.ascontiguousarray(x).reshape(-1)
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[offset:], shape=shape, strides=[s * item for s in strides])


# (program, stored shapes, views per input (offset, shape, strides) or None, output shape): Phi-3's rotated k cut of a
# packed projection, SwiGLU over a projection's halves, a head transpose, a strided step, a row program (RMSNorm) over
# a cut, broadcast axes of size 1 in a view, odd sizes throughout.
VIEW_CASES = [
    ("mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2", [(2, 5, 96), (5, 1, 8), (5, 1, 8)],
     [(32, (2, 5, 4, 8), (480, 96, 8, 1)), None, None], (2, 5, 4, 8)),
    ("sigmoid x0; mul x0 t0; mul t1 x1", [(7, 66), (7, 66)],
     [(0, (7, 33), (66, 1)), (33, (7, 33), (66, 1))], (7, 33)),
    ("add x0 x1", [(3, 5, 2, 7), (3, 2, 5, 7)], [(0, (3, 2, 5, 7), (70, 7, 14, 1)), None], (3, 2, 5, 7)),
    ("mul x0 x0; add t0 x1", [(5, 19), (1,)], [(1, (5, 9), (19, 2)), None], (5, 9)),
    ("f32 x0; mul t0 t0; reduce_mean t1; add t2 x1; sqrt t3; div t0 t4", [(6, 3, 40), ()],
     [(8, (6, 3, 24), (120, 40, 1)), None], (6, 3, 24)),
    ("add x0 x1", [(4, 11), (3, 12)], [(2, (4, 1, 9), (11, 5, 1)), (1, (1, 3, 9), (7, 12, 1))], (4, 3, 9)),
]


def _views_attr(views):
    ints = []
    for k, v in enumerate(views):
        if v is None:
            continue
        offset, shape, strides = v
        ints += [k, len(shape), offset, *shape, *strides]
    return ints


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", range(len(VIEW_CASES)))
def test_inputs_read_through_views_match_numpy(case, dtype, device):
    """Note [Inputs read through a view]: each input with a view reads its tensor at offset + sum(c_d * stride_d), the
    program computing on what NumPy's as_strided view gives (the generated kernel on CUDA, the cpu kernel here)."""
    program, stored, views, out_shape = VIEW_CASES[case]
    rng = np.random.default_rng(case)
    xs = [rng.uniform(0.5, 2.0, size=s).astype(dtype) for s in stored]
    read = [x if v is None else _strided(x, *v) for x, v in zip(xs, views)]
    plain = [xrt.from_numpy(np.ascontiguousarray(r)).to(device) for r in read]
    viewed = [xrt.from_numpy(x).to(device) for x in xs]
    attrs = {"program": program}
    if "reduce" in program:
        attrs["row_axes"] = 1
    (want,) = xrt.ops.call("fused_elementwise", plain, attrs)
    (got,) = xrt.ops.call("fused_elementwise", viewed, {**attrs, "input_views": _views_attr(views)})
    assert tuple(got.shape) == out_shape
    np.testing.assert_array_equal(np.asarray(got.to("cpu").numpy()), np.asarray(want.to("cpu").numpy()))


def test_a_view_past_its_tensor_is_a_typed_error():
    x = np.zeros((3, 10), np.float32)
    with pytest.raises(xrt.InvalidArgumentError, match="reaches element 30 of a tensor of 30"):
        xrt.ops.call("fused_elementwise", [x], {"program": "neg x0", "input_views": [0, 2, 3, 3, 8, 10, 1]})
    with pytest.raises(xrt.InvalidArgumentError, match="input 1 of a node of 1 inputs"):
        xrt.ops.call("fused_elementwise", [x], {"program": "neg x0", "input_views": [1, 1, 0, 8, 1]})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["phi3.dynamo.float16", "gpt_neox.dynamo.float32"])
def test_the_views_plan_matches_the_plan_with_copies(name, device):
    """fused_input_views (Note [Fused nodes read their inputs' views]) on the decoders with packed projections: the
    plan whose kernels read the cuts in place gives the plan with the Slice copies' answers."""
    feeds = _feeds(name)
    viewed = _session(name, device)
    copies = _session(name, device, disabled_passes=["fused_input_views", "concat_fusion"])  # both read views
    for a, b in zip(viewed.run(None, feeds), copies.run(None, feeds)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # explain() of the run's plan names the views: the rotary kernels read q and k cuts [B, S, H, D] in place
    reasons = [n["reason"] for n in _fused(viewed)]
    assert sum(" read as " in r and "rotate_half" in r for r in reasons) >= 4, reasons
    assert not any(" read as " in n["reason"] for n in _fused(copies))


# Note [Pieces of a concatenation]: (program, pieces [axis, n_0, ...], stored shapes, views per input or None):
# GPT-NeoX's rotated quarter of a head beside the other three quarters, both cut from the head-interleaved projection;
# three pieces along a middle axis of odd sizes with a broadcast input shared by two; a piece broadcast along the axis
# itself; the leading axis (one block per piece).
PIECE_CASES = [
    ("mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2 | f32 x3", [3, 16, 48],
     [(2, 5, 768), (1, 1, 5, 16), (1, 1, 5, 16), (2, 5, 768)],
     [(0, (2, 4, 5, 16), (3840, 192, 768, 1)), None, None, (16, (2, 4, 5, 48), (3840, 192, 768, 1))]),
    ("sigmoid x0; mul x0 t0 | add x1 x2 | neg x2", [1, 3, 5, 1], [(4, 3, 7), (4, 5, 7), (1, 1, 7)], None),
    ("add x0 x1 | f32 x2", [2, 1, 4], [(3, 5, 1), (1, 1, 1), (3, 5, 4)], None),
    ("exp x0 | f32 x1 | mul x1 x1", [0, 2, 6, 6], [(2, 3, 16), (6, 3, 16)], None),
]


def _piece_programs(program):
    """Each piece's program over its own inputs, and the node's inputs it reads (what the kernels compute)."""
    out = []
    for text in program.split("|"):
        used = sorted({int(k) for k in re.findall(r"x(\d+)", text)})
        local = re.sub(r"x(\d+)", lambda m: f"x{used.index(int(m.group(1)))}", text.strip())
        out.append((local, used))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", range(len(PIECE_CASES)))
def test_pieces_match_the_concatenation_of_their_programs(case, dtype, device):
    """A pieced node computes np.concatenate of its pieces' programs, each run as a node of its own (the generated
    kernel on CUDA: vectors where every slab allows them; the cpu kernel here), bit for bit."""
    program, pieces, stored, views = PIECE_CASES[case]
    rng = np.random.default_rng(10 + case)
    xs = [rng.uniform(-2.0, 2.0, size=s).astype(dtype) for s in stored]
    views = views or [None] * len(xs)
    attrs = {"program": program, "pieces": pieces}
    if any(v is not None for v in views):
        attrs["input_views"] = _views_attr(views)
    (got,) = xrt.ops.call("fused_elementwise", [xrt.from_numpy(x).to(device) for x in xs], attrs)
    parts = []
    for (local, used), size in zip(_piece_programs(program), pieces[1:]):
        read = [np.ascontiguousarray(xs[k] if views[k] is None else _strided(xs[k], *views[k])) for k in used]
        (part,) = xrt.ops.call("fused_elementwise", [xrt.from_numpy(r).to(device) for r in read],
                               {"program": local, "output_dtype": np.dtype(dtype).name})
        target = list(got.shape)
        target[pieces[0]] = size
        parts.append(np.broadcast_to(np.asarray(part.to("cpu").numpy()), target))
    want = np.concatenate(parts, axis=pieces[0])
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(np.asarray(got.to("cpu").numpy()), want)


def test_malformed_pieces_are_typed_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(xrt.InvalidArgumentError, match="read by no piece"):
        xrt.ops.call("fused_elementwise", [x, x], {"program": "neg x0 | neg x0", "pieces": [1, 3, 3]})
    with pytest.raises(xrt.InvalidArgumentError, match="does not broadcast"):
        xrt.ops.call("fused_elementwise", [x, np.zeros((4, 3), np.float32)],
                     {"program": "neg x0 | neg x1", "pieces": [1, 3, 3]})
    with pytest.raises(xrt.InvalidArgumentError, match="does not reduce"):
        xrt.ops.call("fused_elementwise", [x, x], {"program": "neg x0 | neg x1", "pieces": [1, 3, 3], "row_axes": 1})


@requires_gpu
@pytest.mark.parametrize("name", ["gpt_neox.dynamo.float16", "shufflenet_v2.dynamo.float16", "swin_v2.dynamo.float32"])
def test_concats_of_fused_values_match_the_plan_with_concats(name):
    """concat_fusion (Note [Concats of fused values]): GPT-NeoX's partial rotary heads, ShuffleNetV2's channel split
    joined to its branch, Swin V2's patch merging: the CUDA plan whose pieced kernels write each concatenation gives the
    plan with the Concats' answers, and explain() names the pieces."""
    if not (TINY / f"{name}.onnx").exists():
        pytest.skip(f"{name} not exported")
    device = "cuda:0"
    feeds = _feeds(name)
    pieced = _session(name, device)
    concats = _session(name, device, disabled_passes=["concat_fusion"])
    for a, b in zip(pieced.run(None, feeds), concats.run(None, feeds)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any("; pieces along axis" in n["reason"] for n in _fused(pieced))
    assert not any("; pieces along axis" in n["reason"] for n in _fused(concats))


def test_attention_packing_is_checked():
    """qkv_packing (Note [Attention layouts]): "parts_heads" or "heads_parts"; anything else is a typed error."""
    packed = np.zeros((1, 4, 2, 3, 8), np.float32)  # [B, S, H, P, D]
    attrs = {"qkv_parts": [0, 1, 2], "qkv_packing": "heads_parts"}
    (y,) = xrt.ops.call("attention", [packed, packed, packed], attrs)
    assert tuple(y.shape) == (1, 2, 4, 8)
    with pytest.raises(xrt.InvalidArgumentError, match="qkv_packing must be"):
        xrt.ops.call("attention", [packed, packed, packed], {**attrs, "qkv_packing": "heads"})
    with pytest.raises(xrt.InvalidArgumentError, match="only 3 parts"):
        xrt.ops.call("attention", [packed, packed, packed], {**attrs, "qkv_parts": [0, 1, 3]})


def test_cpu_plans_keep_their_concats():
    """On the CPU a Concat's memcpys cost less than a piece's float round trip: concat_fusion leaves CPU plans alone."""
    assert not any("; pieces along axis" in n["reason"] for n in _fused(_session("gpt_neox.dynamo.float32")))


def _graph_session(nodes, inputs, outputs, initializers, opset=17):
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return xrt.InferenceSession(model.SerializeToString(), engine="native")


def test_a_row_reduction_after_a_reshape_stays_after_it():
    """Note [Unary ops move before view chains]: a one-input fused program that reduces over rows (x - mean(x)) depends
    on the shape it reads, so it does not move before the Transpose and Reshape that make its rows (it reduced rows of
    4 of the Transpose's input instead of the Reshape's rows of 8: found by review)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["r", "m"], ["y"])]
    session = _graph_session(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
                             [numpy_helper.from_array(np.array([3, 8], np.int64), "shape")])
    r = x.transpose(1, 0, 2).reshape(3, 8)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], r - r.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis,opset", [(3, 17), (3, 11), (4, 17), (-1, 11)])
def test_attention_of_rank_five_fuses_only_a_softmax_over_the_keys(axis, opset):
    """Note [Attention over more than one batch dim]: Q K^T of [B, W, H, Sq, Sk] with a Softmax over axis 3 normalizes
    over the queries (opset 13 on) or over Sq * Sk flattened (before 13): not attention's, not fused (found by
    review); over the last axis it fuses. Checked against NumPy with each opset's Softmax."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(axis + opset)
    q, k, v = (rng.standard_normal((2, 3, 2, 4, 8)).astype(np.float32) for _ in range(3))
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 2, 4, 3]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=axis), helper.make_node("MatMul", ["p", "v"], ["y"])]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 2, 4, 8]) for n in "qkv"]
    session = _graph_session(nodes, info, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 2, 4, 8])],
                             [numpy_helper.from_array(np.array(0.25, np.float32), "scale")], opset)
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(0.25)
    flat = s.reshape(s.shape[:axis % 5] + (-1,)) if opset < 13 else np.moveaxis(s, axis, -1)
    e = np.exp(flat - flat.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    p = p.reshape(s.shape) if opset < 13 else np.moveaxis(p, -1, axis)
    np.testing.assert_allclose(session.run(None, {"q": q, "k": k, "v": v})[0], p @ v, rtol=1e-4, atol=1e-5)
    fused = collections.Counter(n["op_type"] for n in session.explain().nodes)["xpuruntime:Attention"]
    assert fused == (1 if axis % 5 == 4 else 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,axis,index", [((2, 5, 3, 4), 2, 1), ((2, 5, 3, 4), -2, -1), ((3, 6, 7), 0, 2),
                                              ((4, 2, 3, 2, 5), 3, 0)])
def test_a_gather_of_one_index_is_read_as_a_view(device, shape, axis, index):
    """Note [A Gather of one index is a view]: PyTorch's select (x[..., i, :]), a Gather of a rank-0 constant index,
    feeding an elementwise op reads x in place (no gather node in the plan); against NumPy."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(len(shape) * 10 + axis)
    x = rng.standard_normal(shape).astype(np.float32)
    out_shape = [d for k, d in enumerate(shape) if k != axis % len(shape)]
    nodes = [helper.make_node("Gather", ["x", "i"], ["picked"], axis=axis),
             helper.make_node("Relu", ["picked"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "select", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              initializer=[numpy_helper.from_array(np.array(index, np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = xrt.InferenceSession(model.SerializeToString(), device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    (out,) = session.run(None, {"x": x})
    got = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out)
    np.testing.assert_array_equal(got, -np.maximum(np.take(x, index, axis=axis), 0))
    assert "gather" not in [n["op"] for n in session.explain().nodes], session.explain().nodes
