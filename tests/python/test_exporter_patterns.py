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


# Attention that the dynamo and TorchScript exports of MaxViT and Swin V2 write in forms beyond the 4-D one: MaxViT an
# Einsum over [B, windows, heads, N, d] (Note [Attention over more than one batch dim]), Swin V2 its cosine attention's
# temperature per head times the scores (Note [Per-head scales of the scores]). Every softmax fuses.
@pytest.mark.parametrize("key", ["maxvit.dynamo.float32", "maxvit.dynamo.float16", "maxvit.torchscript.float16",
                                 "swin_v2.dynamo.float32", "swin_v2.torchscript.float32",
                                 "swin_v2.torchscript.float16"])
def test_attention_fusion_takes_windowed_and_cosine_attention(key):
    name, rest = key.split(".", 1)
    model, explained = _explained(name, rest)
    softmaxes = sum(n.op_type == "Softmax" for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert softmaxes > 0
    assert ran["xpuruntime:Attention"] == softmaxes, dict(ran)
    assert ran["Softmax"] == 0, dict(ran)


# DeBERTa-v2: disentangled attention over 3-D bmm views of the heads, masked with masked_fill(~mask, finfo.min) on a
# [B, H, S, S] view (Note [Masked-fill scores]): every softmax fuses, with fully_masked_rows="uniform", in both
# exporters' forms, and the outputs agree with the unfused chain with a padded row in the mask.
@pytest.mark.parametrize("key", ["dynamo.float32", "dynamo.float16", "torchscript.float32", "torchscript.float16"])
def test_attention_fusion_takes_masked_fill_disentangled_attention(key):
    model, explained = _explained("deberta_v2", key)
    softmaxes = sum(n.op_type == "Softmax" for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert softmaxes > 0
    assert ran["xpuruntime:Attention"] == softmaxes, dict(ran)
    assert ran["Softmax"] == 0, dict(ran)
    import numpy as np
    path = str(TINY / f"deberta_v2.{key}.onnx")
    data = np.load(TINY / "deberta_v2.npz")
    fused = xrt.InferenceSession(path, engine="native")
    unfused = xrt.InferenceSession(path, engine="native", disabled_passes=["attention_fusion"])
    feeds = {i.name: data[f"in.{i.name}"].copy() for i in fused.get_inputs()}
    feeds["attention_mask"][-1, feeds["attention_mask"].shape[1] // 2:] = 0  # padded queries: rows masked entirely
    got = np.asarray(list(fused.run(feeds).values())[0], np.float64)
    want = np.asarray(list(unfused.run(feeds).values())[0], np.float64)
    assert np.isfinite(got).all() and np.isfinite(want).all()
    tolerance = 1e-5 if key.endswith("float32") else 5e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * np.abs(want).max())


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


# The same transformers as PyTorch's TorchScript exporter writes scaled_dot_product_attention: q and k each scaled by
# sqrt(sqrt(1/D)), a boolean mask as Where(mask, 0, -inf) of float32 constants, and Where(IsNaN(p), 0, p) after the
# softmax; in the float16 exports the float32 mask promotes the float16 scores to float32 (a Cast after the MatMul)
# and v is cast to float32 too. The ones whose mask may hold -inf get fully_masked_rows="zero" (Note [The NaN guard of
# fully masked rows]); until the Attention op could say that, their attention stayed unfused in both dtypes.
MINUS_INF_MASKS = ["bert", "clip_text", "distilbert", "gpt2", "llama", "roberta"]


@pytest.mark.parametrize("name", ATTENTION_DYNAMO)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_fusion_takes_every_softmax_of_torchscript_exports(name, dtype, tmp_path):
    key = f"torchscript.{dtype}"
    model, explained = _explained(name, key)
    softmaxes = sum(n.op_type == "Softmax" for n in model.graph.node)
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert softmaxes > 0
    assert ran["xpuruntime:Attention"] == softmaxes, dict(ran)
    assert ran["Softmax"] == 0 and ran["IsNaN"] == 0, dict(ran)
    rows = {attrs.get("fully_masked_rows", b"nan") for attrs in _optimized_attentions(name, key, tmp_path)}
    assert rows == ({b"zero"} if name in MINUS_INF_MASKS else {b"nan"}), rows


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fully_masked_rows_of_a_left_padded_batch_are_zero_fused_or_not(name, dtype):
    """Note [Fully masked attention rows]: left padding masks every key the first query row sees (the causal rule
    leaves it key 0, a padding one); the export's NaN guard makes that row 0, and so does the fused Attention's
    fully_masked_rows="zero": the outputs match the unfused chain (attention_fusion disabled), with no NaN."""
    import numpy as np
    path = str(TINY / f"{name}.torchscript.{dtype}.onnx")
    data = np.load(TINY / f"{name}.npz")
    fused = xrt.InferenceSession(path, engine="native")
    unfused = xrt.InferenceSession(path, engine="native", disabled_passes=["attention_fusion"])
    ran = collections.Counter(n["op_type"] for n in fused.explain().nodes)
    assert ran["xpuruntime:Attention"] > 0 and ran["IsNaN"] == 0, dict(ran)
    feeds = {i.name: data[f"in.{i.name}"].copy() for i in fused.get_inputs()}
    feeds["attention_mask"][0, :2] = 0
    got = np.asarray(list(fused.run(feeds).values())[0], np.float64)
    want = np.asarray(list(unfused.run(feeds).values())[0], np.float64)
    assert not np.isnan(got).any() and not np.isnan(want).any()
    # float16: the unfused chain rounds the scaled q, k and their product to float16 (Note [Scores promoted to
    # float32 by a float32 mask]).
    tolerance = 1e-5 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * np.abs(want).max())


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
    assert ran["xpuruntime:Attention"] == sum(n.op_type == "Softmax" for n in model.graph.node), dict(ran)
    assert expands >= 2 * ran["xpuruntime:Attention"]
    # The TorchScript exports expand their boolean mask once for all layers (/inner/Expand): that one stays.
    left = [n["node"] for n in explained.nodes if n["op_type"] == "Expand"]
    assert not [node for node in left if "self_attn" in node], left


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


# Decoders exported with their KV cache, as llama_generation_bench.py's CacheWrapper exports transformers' Llama
# (the suite's exports have no cache). Per layer: q, k, v projected and reshaped by shapes the graph computes
# (Shape/Gather/Concat), Transpose(0, 2, 1, 3) to heads, present = Concat(past, new) along the positions (a graph
# output), repeat_kv as Unsqueeze -> Expand (its shape through the TorchScript exporter's Where(Equal(shape, -1))) ->
# Reshape, K^T as Transpose(0, 1, 3, 2), an additive mask [B, 1, S, T] made once from attention_mask (causal and
# padding, every query sees itself), then the softmax in the three forms the exporters write (Note [Softmax in
# float32]): "torchscript" (eager: scale, mask, Softmax -> Cast(float) -> Cast back), "dynamo" (eager: Cast(float) ->
# Softmax -> Cast back) and "sdpa" (TorchScript's scaled_dot_product_attention: q and K^T each by sqrt(scale)).
CACHE_HEADS, CACHE_KV_HEADS, CACHE_DIM, CACHE_LAYERS = 4, 2, 8, 2


def _cached_decoder_weights(seed: int = 3) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    embed = CACHE_HEADS * CACHE_DIM
    w = {}
    for layer in range(CACHE_LAYERS):
        for name, width in (("q", embed), ("k", CACHE_KV_HEADS * CACHE_DIM), ("v", CACHE_KV_HEADS * CACHE_DIM),
                            ("o", embed)):
            w[f"l{layer}.w{name}"] = (rng.standard_normal((embed, width)) / np.sqrt(embed)).astype(np.float16)
    return w


def cached_decoder(form: str) -> bytes:
    """CACHE_LAYERS attention layers of a Llama-style decoder with its cache, float16, opset 17 (see above)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    f16, rep, d = TensorProto.FLOAT16, CACHE_HEADS // CACHE_KV_HEADS, CACHE_DIM
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in _cached_decoder_weights().items()]
    ints = {"zero": 0, "one": 1, "neg1": [-1], "ax0": [0], "ax1": [1], "ax2": [2], "dim": [d], "rep": [rep],
            "rep_s": rep, "i0": 0, "i1": 1, "i2": 2, "i3": 3}
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    inits += [numpy_helper.from_array(np.array(v, np.float16), k) for k, v in
              (("scale", d ** -0.5), ("sqrt_scale", d ** -0.25), ("zero16", 0.0), ("low16", -65504.0))]

    def op(kind, inputs, output, **attrs):
        nodes.append(helper.make_node(kind, inputs, [output], **attrs))
        return output

    def dims(value, prefix, count):  # Gather(Shape(value), i), each Unsqueezed to [1]
        shape = op("Shape", [value], f"{prefix}_shape")
        return [op("Unsqueeze", [op("Gather", [shape, f"i{i}"], f"{prefix}_d{i}", axis=0), "ax0"], f"{prefix}_u{i}")
                for i in range(count)]

    # The mask: Where((keys <= queries & attention_mask) | keys == queries, 0, lowest), [B, 1, S, T].
    total = op("Gather", [op("Shape", ["attention_mask"], "am_shape"), "i1"], "total", axis=0)
    seq = op("Gather", [op("Shape", ["x"], "x_shape"), "i1"], "seq", axis=0)
    queries = op("Unsqueeze", [op("Range", [op("Sub", [total, seq], "first"), total, "one"], "qpos"), "ax1"], "q2")
    keys = op("Unsqueeze", [op("Range", ["zero", total, "one"], "kpos"), "ax0"], "k2")
    causal = op("Unsqueeze", [op("LessOrEqual", [keys, queries], "le"), "ax0"], "le3")
    causal = op("Unsqueeze", [causal, "ax0"], "le4")
    padding = op("Unsqueeze", [op("Cast", ["attention_mask"], "am_bool", to=TensorProto.BOOL), "ax1"], "am3")
    padding = op("Unsqueeze", [padding, "ax1"], "am4")
    itself = op("Unsqueeze", [op("Unsqueeze", [op("Equal", [keys, queries], "eq"), "ax0"], "eq3"), "ax0"], "eq4")
    allowed = op("Or", [op("And", [causal, padding], "and"), itself], "allowed")
    mask = op("Where", [allowed, "zero16", "low16"], "mask")
    x = "x"
    for layer in range(CACHE_LAYERS):
        p = f"l{layer}"
        b, s = dims(x, f"{p}_x", 2)
        heads = {}
        for name in ("q", "k", "v"):
            proj = op("MatMul", [x, f"{p}.w{name}"], f"{p}_{name}_proj")
            shape = op("Concat", [b, s, "neg1", "dim"], f"{p}_{name}_heads", axis=0)
            heads[name] = op("Transpose", [op("Reshape", [proj, shape], f"{p}_{name}_bshd")], f"{p}_{name}",
                             perm=[0, 2, 1, 3])
        for name in ("k", "v"):
            kind = "key" if name == "k" else "value"
            present = op("Concat", [f"past_key_values.{layer}.{kind}", heads[name]], f"present.{layer}.{kind}",
                         axis=-2)
            pb, ph, ps, pd = dims(present, f"{p}_{name}_p", 4)
            expand = op("Concat", [pb, ph, "rep", ps, pd], f"{p}_{name}_expand", axis=0)
            ones = op("ConstantOfShape", [op("Shape", [expand], f"{p}_{name}_es")], f"{p}_{name}_ones",
                      value=numpy_helper.from_array(np.array([1], np.int64)))
            minus = op("Equal", [expand, op("Mul", [ones, "neg1"], f"{p}_{name}_m1")], f"{p}_{name}_eqm1")
            expand = op("Where", [minus, ones, expand], f"{p}_{name}_expand_to")
            repeated = op("Expand", [op("Unsqueeze", [present, "ax2"], f"{p}_{name}_u"), expand], f"{p}_{name}_e")
            merged = op("Mul", [op("Gather", [f"{p}_{name}_p_shape", "i1"], f"{p}_{name}_h", axis=0), "rep_s"],
                        f"{p}_{name}_hr")
            merged = op("Concat", [pb, op("Unsqueeze", [merged, "ax0"], f"{p}_{name}_hr1"), ps, pd],
                        f"{p}_{name}_merged", axis=0)
            heads[name] = op("Reshape", [repeated, merged], f"{p}_{name}_r")
        q, kt = heads["q"], op("Transpose", [heads["k"]], f"{p}_kt", perm=[0, 1, 3, 2])
        if form == "sdpa":
            q, kt = op("Mul", [q, "sqrt_scale"], f"{p}_qs"), op("Mul", [kt, "sqrt_scale"], f"{p}_kts")
            scores = op("Add", [op("MatMul", [q, kt], f"{p}_s"), mask], f"{p}_sm")
        else:
            scores = op("Add", [op("Mul", [op("MatMul", [q, kt], f"{p}_s"), "scale"], f"{p}_ss"), mask], f"{p}_sm")
        if form == "torchscript":
            probabilities = op("Softmax", [scores], f"{p}_ph", axis=-1)
            probabilities = op("Cast", [op("Cast", [probabilities], f"{p}_pf", to=TensorProto.FLOAT)], f"{p}_p", to=f16)
        elif form == "dynamo":
            probabilities = op("Softmax", [op("Cast", [scores], f"{p}_sf", to=TensorProto.FLOAT)], f"{p}_pf", axis=-1)
            probabilities = op("Cast", [probabilities], f"{p}_p", to=f16)
        else:
            probabilities = op("Softmax", [scores], f"{p}_p", axis=-1)
        attended = op("MatMul", [probabilities, heads["v"]], f"{p}_o")
        attended = op("Transpose", [attended], f"{p}_obshd", perm=[0, 2, 1, 3])
        flat = op("Reshape", [attended, op("Concat", [b, s, "neg1"], f"{p}_flat", axis=0)], f"{p}_of")
        x = op("MatMul", [flat, f"{p}.wo"], f"{p}_y")
    kv = [CACHE_KV_HEADS, CACHE_DIM]
    inputs = [helper.make_tensor_value_info("x", f16, ["batch", "seq", CACHE_HEADS * d]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"])]
    outputs = [helper.make_tensor_value_info(x, f16, ["batch", "seq", CACHE_HEADS * d])]
    for layer in range(CACHE_LAYERS):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{layer}.{kind}", f16,
                                                        ["batch", kv[0], "past", kv[1]]))
            outputs.append(helper.make_tensor_value_info(f"present.{layer}.{kind}", f16,
                                                         ["batch", kv[0], "total", kv[1]]))
    graph = helper.make_graph(nodes, f"cached_decoder_{form}", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _cached_decoder_reference(feeds: dict) -> list:
    """The layers in float32 NumPy: [y, present.0.key, present.0.value, ...]."""
    import numpy as np
    w = {k: v.astype(np.float32) for k, v in _cached_decoder_weights().items()}
    x = feeds["x"].astype(np.float32)
    batch, seq, _ = x.shape
    total = feeds["attention_mask"].shape[1]
    queries, keys = np.arange(total - seq, total)[:, None], np.arange(total)[None, :]
    allowed = ((keys <= queries)[None, None] & feeds["attention_mask"].astype(bool)[:, None, None, :]) | \
        (keys == queries)[None, None]
    mask = np.where(allowed, 0.0, -65504.0).astype(np.float32)
    presents = []
    for layer in range(CACHE_LAYERS):
        def heads(name, count):
            return (x @ w[f"l{layer}.w{name}"]).reshape(batch, seq, count, CACHE_DIM).transpose(0, 2, 1, 3)
        q = heads("q", CACHE_HEADS)
        k = np.concatenate([feeds[f"past_key_values.{layer}.key"], heads("k", CACHE_KV_HEADS)], axis=2)
        v = np.concatenate([feeds[f"past_key_values.{layer}.value"], heads("v", CACHE_KV_HEADS)], axis=2)
        presents += [k, v]
        rep = CACHE_HEADS // CACHE_KV_HEADS
        scores = q @ np.repeat(k, rep, axis=1).transpose(0, 1, 3, 2) * CACHE_DIM ** -0.5 + mask
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out = (p / p.sum(-1, keepdims=True)) @ np.repeat(v, rep, axis=1)
        x = out.transpose(0, 2, 1, 3).reshape(batch, seq, -1) @ w[f"l{layer}.wo"]
    return [x] + presents


@pytest.mark.parametrize("form", ["torchscript", "dynamo", "sdpa"])
@pytest.mark.parametrize("batch,seq,past,padded", [(2, 1, 7, 2), (2, 5, 0, 2), (1, 1, 16, 0)],
                         ids=["decode", "prefill", "static-decode"])
@pytest.mark.parametrize("disabled", [[], ["identity_elimination"]], ids=["all-passes", "no-identity-elimination"])
def test_attention_of_decoders_with_a_cache_fuses(form, batch, seq, past, padded, disabled):
    """Note [Softmax in float32] and Note [Grouped-query attention reads its kv heads]: each layer's attention of a
    decoder exported with its cache is one Attention reading the present kv heads (no Softmax, Expand or MatMul of
    activations left) at decode (seq 1, a padded row), prefill (an empty past) and the Generator's static decode
    shape (the cache's unfilled tail masked), whichever passes ran before attention_fusion (TorchScript's
    Softmax -> Cast -> Cast form was found only by identity_elimination); the outputs are the unfused plan's and
    float32 NumPy's within float16 noise."""
    import numpy as np
    rng = np.random.default_rng(seq + past)
    total = past + seq
    feeds = {"x": rng.standard_normal((batch, seq, CACHE_HEADS * CACHE_DIM)).astype(np.float16),
             "attention_mask": np.ones((batch, total), np.int64)}
    feeds["attention_mask"][batch - 1, :padded] = 0  # left padding of the last row
    if past == 16:
        feeds["attention_mask"][:, 9:past] = 0  # the static layout: the cache's unfilled positions
    for layer in range(CACHE_LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = rng.standard_normal(
                (batch, CACHE_KV_HEADS, past, CACHE_DIM)).astype(np.float16)
    model = cached_decoder(form)
    fused = xrt.InferenceSession(model, engine="native", disabled_passes=disabled)
    got = [np.asarray(o, np.float32) for o in fused.run(None, feeds)]
    ran = collections.Counter(n["op_type"] for n in fused.explain().nodes)
    assert ran["xpuruntime:Attention"] == CACHE_LAYERS, dict(ran)
    assert ran["Softmax"] == 0 and ran["Expand"] == 0 and ran["MatMul"] == 0, dict(ran)
    if seq == 1:  # q and the output in place (bshd), the new k and v transposed at seq 1: views
        copies = [n["node"] for n in fused.explain().nodes if n["op_type"] == "Transpose" and n["kernel"] != "view"]
        assert not copies, copies
    unfused = xrt.InferenceSession(model, engine="native", disabled_passes=disabled + ["attention_fusion"])
    reference = unfused.run(None, feeds)
    assert collections.Counter(n["op_type"] for n in unfused.explain().nodes)["Softmax"] == CACHE_LAYERS
    for name, a, b, want in zip(["y"] + [f"present{i}" for i in range(2 * CACHE_LAYERS)], got, reference,
                                _cached_decoder_reference(feeds)):
        np.testing.assert_allclose(a, np.asarray(b, np.float32), rtol=2e-2, atol=2e-2, err_msg=name)
        np.testing.assert_allclose(a, want, rtol=2e-2, atol=2e-2, err_msg=name)


def _t5_guard_model(dtype):
    """T5's float16 guard as transformers writes it and dynamo exports it: clamp_value = where(isinf(h.float()).any(),
    max - 1000, max), h = clamp(h, -clamp_value, clamp_value), then h + r (Note [Reductions of predicates])."""
    from onnx import TensorProto, helper
    elem = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    fmax = 65504.0 if dtype == "float16" else 3.4028234663852886e38
    wide = TensorProto.FLOAT if dtype == "float16" else TensorProto.DOUBLE
    nodes = [helper.make_node("Cast", ["h"], ["hf"], to=wide),
             helper.make_node("IsInf", ["hf"], ["inf"]),
             helper.make_node("Cast", ["inf"], ["flags"], to=TensorProto.INT64),
             helper.make_node("ReduceMax", ["flags"], ["m"], keepdims=0),
             helper.make_node("Cast", ["m"], ["any"], to=TensorProto.BOOL),
             helper.make_node("Where", ["any", "lowered", "top"], ["clamp"]),
             helper.make_node("Neg", ["clamp"], ["low"]),
             helper.make_node("Max", ["h", "low"], ["above"]),
             helper.make_node("Min", ["above", "clamp"], ["clamped"]),
             helper.make_node("Add", ["clamped", "r"], ["y"])]
    inits = [helper.make_tensor("lowered", elem, [], [fmax - 1000.0 if dtype == "float16" else 1e30]),
             helper.make_tensor("top", elem, [], [fmax])]
    graph = helper.make_graph(nodes, "t5_guard", [helper.make_tensor_value_info("h", elem, ["b", 7, 33]),
                                                  helper.make_tensor_value_info("r", elem, ["b", 7, 33])],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(
    xrt.get_device_count() == 0, reason="needs a CUDA device"))])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_any_of_a_predicate_reduces_the_bools(device, dtype):
    """Note [Reductions of predicates]: the guard's IsInf reads h itself, its ReduceMax the bools (no Cast left of the
    guard), with and without an infinity in h; the outputs are NumPy's and the plan's without the pass."""
    import numpy as np
    model = _t5_guard_model(dtype)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    session = xrt.InferenceSession(model, engine="native", device=device,
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    plain = xrt.InferenceSession(model, engine="native", device=device, disabled_passes=["predicate_reduction"])
    ran = collections.Counter(n["op_type"] for n in session.explain().nodes)
    assert ran["Cast"] == 0 and ran["ReduceMax"] == 1 and ran["IsInf"] == 1, dict(ran)
    assert collections.Counter(n["op_type"] for n in plain.explain().nodes)["Cast"] >= 3
    rng = np.random.default_rng(3)
    for batch, inf_at in [(1, None), (3, (2, 6, 32)), (2, (0, 0, 0))]:
        h = (rng.standard_normal((batch, 7, 33)) * 1000).astype(np_dtype)
        if inf_at is not None:
            h[inf_at] = -np.inf
        r = rng.standard_normal((batch, 7, 33)).astype(np_dtype)
        top = np.float32(65504.0 if dtype == "float16" else np.finfo(np.float32).max)
        clamp = np.float32(65504.0 - 1000.0 if dtype == "float16" else 1e30) if np.isinf(h).any() else top
        want = np.clip(h.astype(np.float32), -clamp, clamp).astype(np_dtype) + r
        got = np.asarray(session.run(None, {"h": h, "r": r})[0])
        np.testing.assert_array_equal(got, np.asarray(plain.run(None, {"h": h, "r": r})[0]))
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-2)


def test_t5_guards_reduce_the_bools_of_h():
    """Every guard of the T5 export: its IsInf reads h without the float32 copy, its ReduceMax the bools; the outputs
    are the same bits as the plan's without the pass."""
    model, explained = _explained("t5_encoder", "dynamo.float16")
    guards = sum(n.op_type == "IsInf" for n in model.graph.node)
    notes = [o for o in explained.options if o.startswith("pass predicate_reduction:")]
    assert guards > 0 and notes, explained.options
    assert notes[0].startswith(f"pass predicate_reduction: {2 * guards} rewrite(s)"), notes[0]
    ran = collections.Counter(n["op_type"] for n in explained.nodes)
    assert ran["IsInf"] == guards and ran["ReduceMax"] == guards and ran["Cast"] <= 1, dict(ran)
    import numpy as np
    path = str(TINY / "t5_encoder.dynamo.float16.onnx")
    data = np.load(TINY / "t5_encoder.npz")
    rewritten = xrt.InferenceSession(path, engine="native")
    plain = xrt.InferenceSession(path, engine="native", disabled_passes=["predicate_reduction"])
    feeds = {i.name: (data[f"in.{i.name}"].astype(np.float16) if data[f"in.{i.name}"].dtype.kind == "f"
                      else data[f"in.{i.name}"]) for i in rewritten.get_inputs()}
    for got, want in zip(rewritten.run(None, feeds), plain.run(None, feeds)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
