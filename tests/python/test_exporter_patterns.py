"""The patterns PyTorch's exporters write, recognised on the real-model suite's exports (models/suite/tiny): each
test names the pass, the models it must rewrite and what must be left of the pattern. The suite's own tests check
that the rewritten models still match PyTorch (test_model_suite.py)."""

import collections
import json
import pathlib

import onnx
import pytest

import xpuruntime as xrt

TINY = pathlib.Path(__file__).resolve().parents[2] / "models" / "suite" / "tiny"
MANIFEST = json.loads((TINY / "manifest.json").read_text())


def _zeros(info):
    import numpy as np
    shape = [d if isinstance(d, int) and d > 0 else 2 for d in info.shape]
    dtype = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32,
             "bool": np.bool_}[info.type.removeprefix("tensor(").removesuffix(")")]
    return np.zeros(shape, dtype)


def _explained(name, key):
    if key not in MANIFEST["models"][name]["exports"]:
        pytest.skip(f"PyTorch's exporter could not write {name}.{key}")
    path = TINY / f"{name}.{key}.onnx"
    session = xrt.InferenceSession(str(path), engine="native")
    return onnx.load(str(path)), session.explain()


# Every transformer of the suite, as the dynamo exporter writes scaled_dot_product_attention: q and k each scaled by
# sqrt(sqrt(1/D)), K^T through a Reshape/Transpose/Reshape that merges batch and heads, additive masks from Where,
# and Where(IsNaN(p), 0, p) after the softmax.
ATTENTION_DYNAMO = ["beit", "bert", "clip_text", "clip_vision", "deit", "distilbert", "gpt2", "llama", "roberta",
                    "swin", "t5_encoder", "vit", "whisper_encoder"]


@pytest.mark.parametrize("name", ATTENTION_DYNAMO)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_fusion_takes_every_softmax_of_dynamo_exports(name, dtype):
    model, explained = _explained(name, f"dynamo.{dtype}")
    softmaxes = sum(n.op_type == "Softmax" for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert softmaxes > 0
    assert ran["xpuruntime:Attention"] == softmaxes, dict(ran)
    assert ran["Softmax"] == 0 and ran["IsNaN"] == 0, dict(ran)


@pytest.mark.parametrize("name", ATTENTION_DYNAMO)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_attention_fusion_takes_float32_exports_in_lower_precision_plans(name, precision):
    """Note [Constants saturate in lower precision]: a float32 export run with ExecutionPolicy(precision=fp16/bf16)
    keeps its masks finite, so its attention fuses as in a float32 plan (the masked ones, BERT, GPT-2 and Llama, did
    not: their finfo(float32).min became -inf)."""
    key = "dynamo.float32"
    if key not in MANIFEST["models"][name]["exports"]:
        pytest.skip(f"PyTorch's exporter could not write {name}.{key}")
    path = TINY / f"{name}.{key}.onnx"
    model = onnx.load(str(path))
    session = xrt.InferenceSession(str(path), engine="native", exec_policy=xrt.ExecutionPolicy(precision=precision))
    ran = collections.Counter(n["op_type"] for n in session.explain().nodes)
    assert ran["xpuruntime:Attention"] == sum(n.op_type == "Softmax" for n in model.graph.node), dict(ran)
    assert ran["Softmax"] == 0 and ran["IsNaN"] == 0, dict(ran)


@pytest.mark.parametrize("name,key", [("swin", "torchscript.float32")])
def test_q_k_v_cut_from_the_packed_projection_are_views(name, key):
    """Note [Views at an offset]: the exporters' select/unbind/split of q, k and v on the outer axis of the packed
    [3, B, H, S, D] projection costs no kernel."""
    _, explained = _explained(name, key)
    cuts = [n for n in explained.nodes if n["op_type"] in ("Gather", "Slice") and "contiguous block" in n["reason"]]
    assert len(cuts) >= 3, [(n["node"], n["op_type"], n["kernel"]) for n in explained.nodes]
    assert all(n["kernel"] == "view" for n in cuts)


@pytest.mark.parametrize("key", ["dynamo.float32", "dynamo.float16", "torchscript.float32"])
def test_grouped_query_attention_reads_its_kv_heads(key):
    """Note [Grouped-query attention reads its kv heads]: Llama's repeat_kv (Unsqueeze, Expand, Reshape of k and v)
    goes; each Attention reads the kv heads themselves, and the answers still match PyTorch (test_model_suite.py)."""
    model, explained = _explained("llama", key)
    expands = sum(n.op_type == "Expand" for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    if ran["xpuruntime:Attention"] == 0:
        pytest.skip(f"attention is not fused in llama.{key}")
    assert expands >= 2 * ran["xpuruntime:Attention"]
    assert ran["Expand"] == 0, dict(ran)


@pytest.mark.parametrize("key", ["dynamo.float32", "dynamo.float16", "torchscript.float32"])
def test_gpt2_gelu_goes_into_its_linear(key):
    """GPT-2's Conv1D is a 2-D Gemm reshaped back to 3-D before gelu_new (tanh GELU): gemm_fusion moves the Reshape
    after the Linear and gives the Linear the activation (cuBLASLt's GELU epilogue is this tanh GELU)."""
    model, explained = _explained("gpt2", key)
    gelus = sum(n.op_type in ("Tanh", "Gelu") for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert gelus > 0
    assert ran["xpuruntime:Gelu"] == 0 and ran["Tanh"] == 0, dict(ran)


def _optimized_attentions(name, key, tmp_path):
    optimized = tmp_path / "optimized.onnx"
    session = xrt.InferenceSession(str(TINY / f"{name}.{key}.onnx"), engine="native",
                                   optimized_model_path=str(optimized))
    session.run(None, {i.name: _zeros(i) for i in session.get_inputs()})
    attrs = []
    for node in onnx.load(str(optimized)).graph.node:
        if node.op_type == "Attention":
            attrs.append({a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
    return attrs


@pytest.mark.parametrize("name,key", [("vit", "dynamo.float16"), ("vit", "torchscript.float16"),
                                      ("vit", "dynamo.float32"), ("gpt2", "dynamo.float32"),
                                      ("gpt2", "dynamo.float16")])
def test_attention_reads_q_k_v_from_their_packed_projection(name, key, tmp_path):
    """Note [Attention reads q, k and v from their packed projection]: GPT-2's c_attn and timm's qkv Linear are cut
    into q, k and v by Slices (GPT-2: strided copies) or by a Transpose of the whole projection and outer-axis Slices
    (timm); the Attention reads the projection [B, S, 3, H, D] itself instead, and the cuts go."""
    model, explained = _explained(name, key)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert ran["xpuruntime:Attention"] > 0
    assert ran["Slice"] == 0 and ran["Squeeze"] == 0, dict(ran)
    five_d = [n for n in model.graph.node if n.op_type == "Transpose"
              and any(a.name == "perm" and list(a.ints) == [2, 0, 3, 1, 4] for a in n.attribute)]
    assert ran["Transpose"] <= sum(n.op_type == "Transpose" for n in model.graph.node) - len(five_d)
    attentions = _optimized_attentions(name, key, tmp_path)
    assert len(attentions) == ran["xpuruntime:Attention"]
    for attrs in attentions:
        assert list(attrs["qkv_parts"]) == [0, 1, 2], attrs


# Models whose every Transpose is a head transpose around attention (the rest of their graph has none).
HEADS_ONLY = ["bert", "clip_text", "distilbert", "gpt2", "roberta", "t5_encoder"]


@pytest.mark.parametrize("name", HEADS_ONLY)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_reads_the_heads_where_the_projections_wrote_them(name, dtype, tmp_path):
    """Note [Attention reads the heads where the projections wrote them]: the transposes that move q, k, v into
    [B, H, S, D] and the output back to [B, S, H, D] go; each Attention reads and writes [B, S, H, D] (its `bshd`
    flags, Note [Attention layouts]), and the answers still match PyTorch (test_model_suite.py)."""
    model, explained = _explained(name, f"dynamo.{dtype}")
    transposes = sum(n.op_type == "Transpose" for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert transposes >= 4 * ran["xpuruntime:Attention"] > 0, (transposes, dict(ran))
    assert ran["Transpose"] == 0, dict(ran)
    # The optimized graph (SessionOptions.optimized_model_path) shows every Attention's layouts.
    attentions = _optimized_attentions(name, f"dynamo.{dtype}", tmp_path)
    assert len(attentions) == ran["xpuruntime:Attention"]
    for attrs in attentions:
        # q, k and v of one packed projection (GPT-2's c_attn, or the Linear qkv_fusion makes of the others),
        # read in place; the output written as [B, S, H, D].
        assert list(attrs["bshd"]) == [0, 0, 0, 1], attrs
        assert list(attrs["qkv_parts"]) == [0, 1, 2], attrs


# Transformers whose q, k and v come from three Linears of one input (Whisper scales its queries after q_proj).
SEPARATE_QKV = ["beit", "bert", "clip_text", "clip_vision", "deit", "distilbert", "roberta", "t5_encoder",
                "whisper_encoder"]


@pytest.mark.parametrize("name", SEPARATE_QKV)
def test_one_gemm_projects_q_k_and_v(name, tmp_path):
    """Note [One GEMM for q, k and v]: the three projections become one Linear with the weights concatenated, whose
    [B, S, 3 * H * D] output each Attention reads as its packed projection; the answers still match PyTorch
    (test_model_suite.py)."""
    model, explained = _explained(name, "dynamo.float16")
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    attentions = ran["xpuruntime:Attention"]
    assert attentions > 0
    notes = [o for o in explained.options if o.startswith("pass qkv_fusion:")]
    assert notes and notes[0].startswith(f"pass qkv_fusion: {attentions} rewrite(s)"), explained.options
    for attrs in _optimized_attentions(name, "dynamo.float16", tmp_path):
        assert list(attrs["qkv_parts"]) == [0, 1, 2], attrs


# Pre-LN transformers add each attention and MLP projection to the residual stream; the Linear takes that Add as its
# residual input (cuBLASLt's C, Note [Residual in the GEMM]), also behind GPT-2's 2-D Gemm and Reshape (TorchScript).
# What stays an Add: the embeddings' sum (and GPT-2's TorchScript attention mask of a layer attention_fusion leaves).
PRE_LN = [("gpt2", "dynamo", 1), ("gpt2", "torchscript", 2), ("vit", "dynamo", 1), ("vit", "torchscript", 1),
          ("llama", "dynamo", 0), ("whisper_encoder", "dynamo", 1), ("deit", "dynamo", 1), ("clip_text", "dynamo", 1)]


@pytest.mark.parametrize("name,exporter,left", PRE_LN)
def test_residual_adds_ride_in_the_projection_gemm(name, exporter, left):
    model, explained = _explained(name, f"{exporter}.float16")
    exported = sum(n.op_type == "Add" for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert exported >= 4, exported
    assert ran["Add"] <= left, dict(ran)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rotary_reads_the_heads_where_the_projection_wrote_them(dtype):
    """Note [Rotary reads the heads where the projection wrote them]: Llama's q and k head transposes before the
    rotary go; the rotary group reads [B, S, H, D] and the attention reads its output with the bshd flags."""
    model, explained = _explained("llama", f"dynamo.{dtype}")
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert sum(n.op_type == "Transpose" for n in model.graph.node) >= 4
    assert ran["Transpose"] == 0, dict(ran)
    assert ran["xpuruntime:Attention"] == 2, dict(ran)


# Vision transformers' patch embedding: Conv with kernel = stride (16 x 16 at full size, the tiny exports' 8 x 8), then
# flatten(2).transpose(1, 2) to tokens. Swin's and ConvNeXt's 4 x 4 stems stay convolutions.
PATCH_EMBEDDINGS = ["vit", "deit", "beit", "clip_vision"]


@pytest.mark.parametrize("name", PATCH_EMBEDDINGS)
@pytest.mark.parametrize("key", ["dynamo.float32", "torchscript.float32", "dynamo.float16"])
def test_patch_embedding_is_one_transpose_and_a_gemm(name, key):
    """Note [Patch embedding as a GEMM]: the Conv, its flatten and the transpose to tokens become one Transpose of the
    image's patches and a Linear that writes the tokens; the outputs equal the unrewritten model's."""
    import numpy as np
    model, explained = _explained(name, key)
    assert sum(n.op_type == "Conv" for n in model.graph.node) == 1
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert ran["Conv"] == 0 and ran["xpuruntime:FusedConv"] == 0, dict(ran)
    notes = [o for o in explained.options if o.startswith("pass patch_embedding_gemm:")]
    assert notes and notes[0].startswith("pass patch_embedding_gemm: 1 rewrite(s)"), explained.options
    assert "writing the tokens" in notes[0], notes[0]
    path = str(TINY / f"{name}.{key}.onnx")
    rewritten = xrt.InferenceSession(path, engine="native")
    plain = xrt.InferenceSession(path, engine="native", disabled_passes=["patch_embedding_gemm"])
    data = np.load(TINY / f"{name}.npz")
    feeds = {i.name: data[f"in.{i.name}"].astype(np.float16 if "float16" in key else np.float32)
             for i in rewritten.get_inputs()}
    got, want = rewritten.run(None, feeds)[0], plain.run(None, feeds)[0]
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(
    xrt.get_device_count() == 0, reason="needs a CUDA device"))])
@pytest.mark.parametrize("dtype,batch,channels,out_channels,patch,height,width,bias,symbolic", [
    ("float32", 2, 3, 5, (8, 8), 16, 24, True, False),     # odd channel counts, 2 x 3 patches
    ("float32", 3, 4, 7, (8, 16), 24, 32, False, True),    # rectangular patches, no bias, symbolic batch
    ("float16", 1, 3, 16, (16, 16), 32, 48, True, True),
])
def test_patch_convolution_alone_keeps_its_nchw_output(device, dtype, batch, channels, out_channels, patch, height,
                                                       width, bias, symbolic):
    """A patch Conv whose output is not flattened to tokens: the Linear's output goes back to [N, O, H/p, W/q]
    through a Reshape and a Transpose; checked against NumPy's convolution on random inputs."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(sum(patch) + channels)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    elem = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    p, q = patch
    w = (rng.standard_normal((out_channels, channels, p, q)) / np.sqrt(channels * p * q)).astype(np_dtype)
    b = rng.standard_normal(out_channels).astype(np_dtype)
    x = rng.standard_normal((batch, channels, height, width)).astype(np_dtype)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if bias else [])
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], kernel_shape=[p, q], strides=[p, q])
    n = "batch" if symbolic else batch
    graph = helper.make_graph([conv], "patch", [helper.make_tensor_value_info("x", elem, [n, channels, height, width])],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = xrt.InferenceSession(model.SerializeToString(), engine="native", device=device)
    ran = collections.Counter(n["op_type"] for n in session.explain().nodes)
    assert ran["Conv"] == 0 and ran["xpuruntime:FusedConv"] == 0 and ran["xpuruntime:Linear"] == 1, dict(ran)
    got = session.run(None, {"x": xrt.from_numpy(x).to(device) if device != "cpu" else x})[0]
    got = np.asarray(got.cpu().numpy() if hasattr(got, "cpu") else got, np.float32)
    patches = x.astype(np.float64).reshape(batch, channels, height // p, p, width // q, q)
    want = np.einsum("nchpwq,ocpq->nohw", patches, w.astype(np.float64))
    if bias:
        want += b.astype(np.float64)[None, :, None, None]
    assert got.shape == want.shape
    tol = 2e-2 if dtype == "float16" else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
