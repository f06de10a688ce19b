"""ONNX Runtime's com.microsoft GroupQueryAttention on the native engine (registry op group_query_attention, Note
[Group query attention] in src/cpp/core/op_schemas_gqa.cpp): every output against ONNX Runtime's CPU kernel
(engine="onnxruntime") on random inputs, and against a numpy reference where ONNX Runtime refuses the shapes (head
sizes that are not multiples of 8)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import xpuruntime as xrt
from conftest import requires_gpu, requires_ort

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def gqa_model(heads, kv_heads, head, attrs=None, past=True, rotary=False, packed=False, dtype=F32,
              total_from_mask=False, extra_inputs=(), extra_outputs=0):
    """One GroupQueryAttention node. total_from_mask: total_sequence_length and seqlens_k computed from an int64
    attention_mask [B, T] as onnxruntime-genai's model builder writes them (Shape -> Gather, ReduceSum - 1)."""
    q_width = (heads + 2 * kv_heads) * head if packed else heads * head
    ins = [helper.make_tensor_value_info("query", dtype, ["B", "S", q_width])]
    names = ["query"]
    if packed:
        names += ["", ""]
    else:
        ins += [helper.make_tensor_value_info(n, dtype, ["B", "S", kv_heads * head]) for n in ("key", "value")]
        names += ["key", "value"]
    if past:
        ins += [helper.make_tensor_value_info(n, dtype, ["B", kv_heads, "P", head]) for n in ("past_key", "past_value")]
        names += ["past_key", "past_value"]
    else:
        names += ["", ""]
    nodes = []
    if total_from_mask:
        ins.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"]))
        one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
        nodes += [
            helper.make_node("ReduceSum", ["attention_mask", "one"], ["mask_sum"], keepdims=0),
            helper.make_node("Sub", ["mask_sum", "one"], ["mask_sum_1"]),
            helper.make_node("Cast", ["mask_sum_1"], ["seqlens_k"], to=TensorProto.INT32),
            helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
            helper.make_node("Gather", ["mask_shape", "one_scalar"], ["total_i64"], axis=0),
            helper.make_node("Cast", ["total_i64"], ["total_sequence_length"], to=TensorProto.INT32),
        ]
        inits = [one, helper.make_tensor("one_scalar", TensorProto.INT64, [], [1])]
    else:
        ins += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
                helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
        inits = []
    names += ["seqlens_k", "total_sequence_length"]
    if rotary:
        ins += [helper.make_tensor_value_info(n, dtype, ["M", "R"]) for n in ("cos_cache", "sin_cache")]
        names += ["cos_cache", "sin_cache"]
    for name, shape in extra_inputs:  # inputs 9 and up; None leaves one out
        while len(names) < 9:
            names.append("")
        if name is not None:
            ins.append(helper.make_tensor_value_info(name, dtype, shape))
        names.append(name or "")
    out_names = ["output", "present_key", "present_value"] + [f"extra{i}" for i in range(extra_outputs)]
    nodes.append(helper.make_node("GroupQueryAttention", names, out_names, domain="com.microsoft", name="gqa",
                                  num_heads=heads, kv_num_heads=kv_heads, **(attrs or {})))
    outs = [helper.make_tensor_value_info(n, dtype, None) for n in out_names]
    graph = helper.make_graph(nodes, "gqa", ins, outs, initializer=inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return model.SerializeToString()


def rope(x, pos, cos, sin, interleaved):
    r = cos.shape[1] * 2
    y = x.copy()
    c, s = cos[pos], sin[pos]
    if interleaved:
        a, b = x[:, 0:r:2].copy(), x[:, 1:r:2].copy()
        y[:, 0:r:2], y[:, 1:r:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[:, : r // 2].copy(), x[:, r // 2: r].copy()
        y[:, : r // 2], y[:, r // 2: r] = a * c - b * s, a * s + b * c
    return y


def reference(feeds, heads, kv_heads, scale=0.0, softcap=0.0, window=-1, interleaved=False, smooth=False):
    """numpy GroupQueryAttention as ONNX Runtime's CPU kernel computes it on the valid query rows (the float32 path
    for padded ones: windows clipped to the row, zeros for an empty one)."""
    q = feeds["query"].astype(np.float32)
    b_, s_, _ = q.shape
    head = q.shape[2] // heads
    k, v = feeds["key"].astype(np.float32), feeds["value"].astype(np.float32)
    pk, pv = feeds.get("past_key"), feeds.get("past_value")
    p_ = 0 if pk is None else pk.shape[2]
    total = int(feeds["total_sequence_length"])
    t_ = max(total, p_)
    first = s_ == total
    qh = q.reshape(b_, s_, heads, head).transpose(0, 2, 1, 3)
    kh = k.reshape(b_, s_, kv_heads, head).transpose(0, 2, 1, 3)
    vh = v.reshape(b_, s_, kv_heads, head).transpose(0, 2, 1, 3)
    present_k = np.zeros((b_, kv_heads, t_, head), np.float32)
    present_v = np.zeros_like(present_k)
    out = np.zeros((b_, s_, heads, head), np.float32)
    alpha = scale if scale else 1 / np.sqrt(head)
    for b in range(b_):
        length = int(feeds["seqlens_k"][b]) + 1
        past = 0 if first else length - s_
        pos = np.arange(s_) + past
        qb, kb = qh[b].copy(), kh[b].copy()
        if "cos_cache" in feeds:
            cos, sin = feeds["cos_cache"].astype(np.float32), feeds["sin_cache"].astype(np.float32)
            qb = np.stack([rope(x, pos, cos, sin, interleaved) for x in qb])
            kb = np.stack([rope(x, pos, cos, sin, interleaved) for x in kb])
        if past:
            present_k[b, :, :past] = pk[b, :, :past]
            present_v[b, :, :past] = pv[b, :, :past]
        present_k[b, :, past: past + s_] = kb
        present_v[b, :, past: past + s_] = vh[b]
        for n in range(heads):
            g = n // (heads // kv_heads)
            scores = (qb[n] @ present_k[b, g, :length].T) * alpha
            if softcap > 0:
                scores = softcap * np.tanh(scores / softcap)
            for s in range(s_):
                end = past + s + 1
                hi = min(end, length)
                lo = max(end - window, 0) if window > 0 else 0
                if lo >= hi:
                    continue
                row = scores[s, lo:hi]
                top = max(row.max(), 0.0) if smooth else row.max()
                e = np.exp(row - top)
                out[b, s, n] = (e / (e.sum() + (np.exp(-top) if smooth else 0.0))) @ present_v[b, g, lo:hi]
    return [out.reshape(b_, s_, heads * head), present_k, present_v]


def random_feeds(rng, batch, seq, heads, kv_heads, head, seqlens, total, past_len=None, dtype=np.float32,
                 rotary_half=0, max_pos=64):
    f = {"query": rng.standard_normal((batch, seq, heads * head)).astype(dtype),
         "key": rng.standard_normal((batch, seq, kv_heads * head)).astype(dtype),
         "value": rng.standard_normal((batch, seq, kv_heads * head)).astype(dtype),
         "seqlens_k": np.array(seqlens, np.int32), "total_sequence_length": np.array(total, np.int32)}
    if past_len is not None:
        f["past_key"] = rng.standard_normal((batch, kv_heads, past_len, head)).astype(dtype)
        f["past_value"] = rng.standard_normal((batch, kv_heads, past_len, head)).astype(dtype)
    if rotary_half:
        angles = rng.uniform(0, 6, (max_pos, rotary_half))
        f["cos_cache"], f["sin_cache"] = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    return f


def run_both(model, feeds):
    native = xrt.InferenceSession(model, engine="native").run(None, feeds)
    ort = xrt.InferenceSession(model, engine="onnxruntime").run(None, feeds)
    return native, ort


def assert_close(got, want, dtype=np.float32, what=""):
    atol = 1e-5 if dtype == np.float32 else 2e-3
    for name, g, w in zip(("output", "present_key", "present_value"), got, want):
        assert g.shape == w.shape, f"{what} {name}: {g.shape} vs {w.shape}"
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=atol, atol=atol,
                                   err_msg=f"{what} {name}")


HEADS = [(4, 4), (8, 2), (4, 1)]  # N == K, N = 4K, K = 1


@requires_ort
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("batch,seqlens", [(1, [6]), (2, [6, 3])])
def test_prompt_matches_onnxruntime(heads, kv_heads, batch, seqlens):
    rng = np.random.default_rng(heads * 10 + kv_heads + batch)
    feeds = random_feeds(rng, batch, 7, heads, kv_heads, 8, [s for s in seqlens], 7)
    feeds["seqlens_k"] = np.array([6, 3][:batch] if batch == 2 else [6], np.int32)
    for past in (False, True):
        f = dict(feeds)
        if past:  # a first prompt with an (empty-length) past, as genai feeds it
            f["past_key"] = np.zeros((batch, kv_heads, 0, 8), np.float32)
            f["past_value"] = np.zeros((batch, kv_heads, 0, 8), np.float32)
        native, ort = run_both(gqa_model(heads, kv_heads, 8, past=past), f)
        assert_close(native, ort, what=f"past={past}")
        assert_close(native, reference(f, heads, kv_heads))


def generate(model, feeds, steps, rng, shared, heads, kv_heads, head, max_len, dtype=np.float32, rotary=None):
    """A prompt then `steps` decode steps, each step's present fed back as the past (shared: the past keeps the
    buffer's max length, as genai's past-present-share-buffer mode does; else it grows by one)."""
    sessions = {e: xrt.InferenceSession(model, engine=e) for e in ("native", "onnxruntime")}
    lengths = feeds["seqlens_k"].astype(np.int64) + 1
    batch = len(lengths)
    empty = np.zeros((batch, kv_heads, 0, head), dtype)
    state = {e: (empty, empty) for e in sessions}
    f = dict(feeds)
    for step in range(steps + 1):
        results = {}
        for e, s in sessions.items():
            step_feeds = dict(f)
            step_feeds["past_key"], step_feeds["past_value"] = state[e]
            results[e] = s.run(None, step_feeds)
        assert_close(results["native"], results["onnxruntime"], dtype, what=f"step {step}")
        for e in sessions:
            state[e] = (results[e][1], results[e][2])
        if shared and step == 0:  # the past buffer takes its max length from the first decode step on
            for e in sessions:
                pad = [(0, 0), (0, 0), (0, max_len - state[e][0].shape[2]), (0, 0)]
                state[e] = tuple(np.pad(t, pad) for t in state[e])
        lengths = lengths + 1
        total = int(lengths.max())
        f = {"query": rng.standard_normal((batch, 1, heads * head)).astype(dtype),
             "key": rng.standard_normal((batch, 1, kv_heads * head)).astype(dtype),
             "value": rng.standard_normal((batch, 1, kv_heads * head)).astype(dtype),
             "seqlens_k": (lengths - 1).astype(np.int32), "total_sequence_length": np.array(total, np.int32)}
        if rotary is not None:
            f["cos_cache"], f["sin_cache"] = rotary
    return results


@requires_ort
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("shared", [False, True])
def test_decode_steps_match_onnxruntime(heads, kv_heads, shared):
    rng = np.random.default_rng(7 + heads + kv_heads + shared)
    feeds = random_feeds(rng, 2, 5, heads, kv_heads, 16, [4, 2], 5)
    generate(gqa_model(heads, kv_heads, 16), feeds, 4, rng, shared, heads, kv_heads, 16, max_len=12)


@requires_ort
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_half", [8, 16])
def test_rotary_prompt_and_decode(interleaved, rotary_half):
    rng = np.random.default_rng(interleaved + rotary_half)
    heads, kv_heads, head = 4, 2, 32
    feeds = random_feeds(rng, 2, 5, heads, kv_heads, head, [4, 1], 5, rotary_half=rotary_half)
    model = gqa_model(heads, kv_heads, head, {"do_rotary": 1, "rotary_interleaved": interleaved}, rotary=True)
    native, _ = run_both(model, {**feeds, "past_key": np.zeros((2, 2, 0, head), np.float32),
                                 "past_value": np.zeros((2, 2, 0, head), np.float32)})
    assert_close(native, reference({**feeds}, heads, kv_heads, interleaved=bool(interleaved)))
    generate(model, feeds, 3, rng, False, heads, kv_heads, head, 10,
             rotary=(feeds["cos_cache"], feeds["sin_cache"]))


@requires_ort
@pytest.mark.parametrize("attrs", [{"local_window_size": 1}, {"local_window_size": 3}, {"softcap": 1.5},
                                   {"softcap": 2.0, "local_window_size": 2}, {"scale": 0.3}, {"smooth_softmax": 1},
                                   {"smooth_softmax": 1, "local_window_size": 2}])
def test_scoring_attributes(attrs):
    rng = np.random.default_rng(len(str(attrs)))
    heads, kv_heads, head = 8, 2, 8
    feeds = random_feeds(rng, 2, 6, heads, kv_heads, head, [5, 2], 6)
    model = gqa_model(heads, kv_heads, head, attrs, past=False)
    native, ort = run_both(model, feeds)
    assert_close(native, ort, what=str(attrs))  # every query row, the padded ones of row 1 included
    generate(gqa_model(heads, kv_heads, head, attrs), feeds, 3, rng, True, heads, kv_heads, head, 10)


@requires_ort
@pytest.mark.parametrize("attrs", [{}, {"local_window_size": 2}, {"do_rotary": 1}])
def test_float16(attrs):
    rng = np.random.default_rng(16)
    heads, kv_heads, head = 4, 2, 32
    rotary = bool(attrs.get("do_rotary"))
    feeds = random_feeds(rng, 2, 5, heads, kv_heads, head, [4, 2], 5, dtype=np.float16,
                         rotary_half=8 if rotary else 0)
    model = gqa_model(heads, kv_heads, head, attrs, rotary=rotary, dtype=F16)
    generate(model, feeds, 3, rng, False, heads, kv_heads, head, 10, dtype=np.float16,
             rotary=(feeds["cos_cache"], feeds["sin_cache"]) if rotary else None)


@requires_ort
def test_packed_qkv():
    rng = np.random.default_rng(3)
    heads, kv_heads, head = 4, 2, 16
    model = gqa_model(heads, kv_heads, head, {"do_rotary": 1}, past=False, rotary=True, packed=True)
    feeds = random_feeds(rng, 2, 5, heads, kv_heads, head, [4, 3], 5, rotary_half=8)
    feeds["query"] = np.concatenate([feeds["query"], feeds.pop("key"), feeds.pop("value")], axis=2)
    native, ort = run_both(model, feeds)
    assert_close(native, ort)


@requires_ort
def test_later_prompt_of_batch_one():
    """A prompt appended to a cache (S > 1, S != total_sequence_length): batch 1, positions after the past."""
    rng = np.random.default_rng(5)
    heads, kv_heads, head = 4, 1, 16
    feeds = random_feeds(rng, 1, 3, heads, kv_heads, head, [7], 8, past_len=8, rotary_half=8)
    model = gqa_model(heads, kv_heads, head, {"do_rotary": 1}, rotary=True)
    native, ort = run_both(model, feeds)
    assert_close(native, ort)


@requires_ort
def test_total_length_from_attention_mask_plans_statically():
    """genai's form: total_sequence_length = Shape(attention_mask)[1] folds while the plan is built, so the node
    lowers onto group_query_attention with no plan segment; a graph input ends a segment there instead."""
    rng = np.random.default_rng(11)
    heads, kv_heads, head = 4, 2, 8
    model = gqa_model(heads, kv_heads, head, total_from_mask=True)
    feeds = random_feeds(rng, 2, 1, heads, kv_heads, head, [5, 3], 6, past_len=5)
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64)
    ort_feeds = {k: v for k, v in feeds.items() if k not in ("seqlens_k", "total_sequence_length")}
    ort_feeds["attention_mask"] = mask
    session = xrt.InferenceSession(model, engine="native")
    native = session.run(None, ort_feeds)
    ort = xrt.InferenceSession(model, engine="onnxruntime").run(None, ort_feeds)
    assert_close(native, ort)
    text = str(session.explain())
    assert "group_query_attention" in text and "segment" not in text, text
    graph_input = xrt.InferenceSession(gqa_model(heads, kv_heads, head), engine="native")
    assert_close(graph_input.run(None, feeds), ort)
    assert "data-dependent" in str(graph_input.explain())


@pytest.mark.parametrize("head", [1, 5, 12, 33])
@pytest.mark.parametrize("rotary_half", [0, 2])
def test_head_sizes_onnxruntime_refuses(head, rotary_half):
    """ONNX Runtime asks for head sizes that are multiples of 8 (16 with rotary); the native engine takes any, checked
    against the numpy reference (which agrees with ONNX Runtime where it runs, above)."""
    if rotary_half * 2 > head:
        pytest.skip("rotary dimension larger than the head")
    rng = np.random.default_rng(head + rotary_half)
    heads, kv_heads = 6, 3
    attrs = {"do_rotary": 1, "rotary_interleaved": 1} if rotary_half else {}
    model = gqa_model(heads, kv_heads, head, attrs, rotary=bool(rotary_half))
    session = xrt.InferenceSession(model, engine="native")
    feeds = random_feeds(rng, 2, 4, heads, kv_heads, head, [3, 1], 4, past_len=0, rotary_half=rotary_half)
    assert_close(session.run(None, feeds), reference(feeds, heads, kv_heads, interleaved=True))
    feeds = random_feeds(rng, 2, 1, heads, kv_heads, head, [4, 2], 5, past_len=4, rotary_half=rotary_half)
    assert_close(session.run(None, feeds), reference(feeds, heads, kv_heads, interleaved=True))


def run_native(model, feeds):
    return xrt.InferenceSession(model, engine="native").run(None, feeds)


def test_malformed_inputs_raise_typed_errors():
    rng = np.random.default_rng(0)
    model = gqa_model(4, 2, 8)
    good = random_feeds(rng, 2, 1, 4, 2, 8, [4, 2], 5, past_len=4)
    run_native(model, good)
    with pytest.raises(xrt.InvalidArgumentError, match="num_heads"):
        run_native(gqa_model(6, 4, 8, past=False), random_feeds(rng, 1, 1, 6, 4, 8, [0], 1))
    with pytest.raises(xrt.InvalidArgumentError, match="seqlens_k"):
        run_native(model, {**good, "seqlens_k": np.array([5, 2], np.int32)})  # 6 > present length 5
    with pytest.raises(xrt.InvalidArgumentError, match="seqlens_k"):
        run_native(model, {**good, "seqlens_k": np.array([9, 2], np.int32), "total_sequence_length":
                           np.array(10, np.int32)})  # needs 9 past rows, the past holds 4
    with pytest.raises(xrt.InvalidArgumentError, match="past_key"):
        run_native(model, {**good, "past_key": good["past_key"][:, :1]})
    with pytest.raises(xrt.InvalidArgumentError, match="key"):
        run_native(model, {**good, "key": good["key"][:, :, :8]})
    with pytest.raises(xrt.InvalidArgumentError, match="sequence length"):
        run_native(model, {**random_feeds(rng, 2, 3, 4, 2, 8, [5, 5], 6, past_len=4)})
    with pytest.raises(xrt.InvalidArgumentError, match="cos_cache"):
        rotary = gqa_model(4, 2, 8, {"do_rotary": 1}, rotary=True)
        run_native(rotary, random_feeds(rng, 2, 1, 4, 2, 8, [4, 2], 5, past_len=4, rotary_half=8))
    with pytest.raises(xrt.InvalidArgumentError, match="local_window_size"):
        run_native(gqa_model(4, 2, 8, {"local_window_size": 0}), good)


def test_query_of_wrong_rank_raises():
    rng = np.random.default_rng(1)
    graph_model = gqa_model(4, 2, 8, past=False)
    feeds = random_feeds(rng, 1, 2, 4, 2, 8, [1], 2)
    feeds["query"] = feeds["query"][0]
    with pytest.raises(xrt.XpuRuntimeError, match="query"):
        run_native(graph_model, feeds)


@pytest.mark.parametrize("what,kwargs", [
    ("head_sink", {"extra_inputs": [(None, None), (None, None), ("head_sink", [4])]}),
    ("position_ids", {"extra_inputs": [("position_ids", ["B", "S"])]}),
    ("qk_output", {"attrs": {"qk_output": 1}, "extra_outputs": 1}),
    ("sliding_window_cache", {"attrs": {"sliding_window_cache": 1, "local_window_size": 4}}),
    ("kv_cache_bit_width", {"attrs": {"k_quant_type": "PER_TENSOR", "v_quant_type": "PER_TENSOR",
                                      "kv_cache_bit_width": 8}}),
])
def test_unimplemented_features_are_refused_at_session_creation(what, kwargs):
    kwargs = dict(kwargs)
    model = gqa_model(4, 2, 8, kwargs.pop("attrs", {}), **kwargs)
    with pytest.raises(xrt.UnsupportedOperationError, match=what):
        xrt.InferenceSession(model, engine="native")


# --------------------------------------- the decomposition a CUDA plan runs (Note [Group query attention decomposed])

def node_ops(session):
    return {n["op_type"].split(":")[-1] for n in session.explain().nodes}


def kernel_and_decomposed(monkeypatch, model, feed_list):
    """Each feed run by the cpu kernel of group_query_attention and by the decomposition (XPURT_GQA_DECOMPOSE=1 makes
    a CPU plan decompose the node as a CUDA plan does)."""
    kernel = xrt.InferenceSession(model, engine="native")
    want = [kernel.run(None, f) for f in feed_list]
    assert "GroupQueryAttention" in node_ops(kernel)
    monkeypatch.setenv("XPURT_GQA_DECOMPOSE", "1")
    decomposed = xrt.InferenceSession(model, engine="native")
    got = [decomposed.run(None, f) for f in feed_list]
    monkeypatch.delenv("XPURT_GQA_DECOMPOSE")
    ops = node_ops(decomposed)
    assert "GroupQueryAttention" not in ops and {"MatMul", "Softmax", "Where"} <= ops, ops
    return got, want


def assert_decomposition_matches(got, want, dtype=np.float32, exact_present=True):
    """The output at 1e-5 (float32; its sums are float32, the kernel's double) or one float16 rounding, the present
    key/value bit for bit (data movement only) or, rotated, at the output's tolerance."""
    for step, (g, w) in enumerate(zip(got, want)):
        tol = 1e-5 if dtype == np.float32 else 1e-3
        np.testing.assert_allclose(g[0].astype(np.float32), w[0].astype(np.float32), rtol=tol, atol=tol,
                                   err_msg=f"feed {step} output")
        for name, gp, wp in zip(("present_key", "present_value"), g[1:], w[1:]):
            assert gp.shape == wp.shape and gp.dtype == wp.dtype, f"feed {step} {name}"
            if exact_present:
                np.testing.assert_array_equal(gp, wp, err_msg=f"feed {step} {name}")
            else:
                np.testing.assert_allclose(gp.astype(np.float32), wp.astype(np.float32), rtol=tol, atol=tol,
                                           err_msg=f"feed {step} {name}")


def cache_feeds(rng, heads, kv_heads, head, dtype=np.float32, rotary_half=0, max_len=12):
    """A right-padded prompt (an empty past), decode steps with a grown past (the rows of a shorter row end before
    the past's length) and with a shared max-length past, and a later prompt of batch 1."""
    def feeds(batch, seq, seqlens, total, past_len):
        return random_feeds(rng, batch, seq, heads, kv_heads, head, seqlens, total, past_len, dtype, rotary_half)
    return [feeds(2, 5, [4, 2], 5, 0), feeds(3, 1, [5, 2, 3], 6, 5), feeds(3, 1, [6, 1, 3], 7, max_len),
            feeds(1, 3, [7], 8, 8), feeds(1, 4, [3], 4, max_len)]


@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decomposition_matches_the_kernel(monkeypatch, heads, kv_heads, dtype):
    rng = np.random.default_rng(heads + kv_heads)
    model = gqa_model(heads, kv_heads, 16, dtype=F32 if dtype == np.float32 else F16)
    got, want = kernel_and_decomposed(monkeypatch, model, cache_feeds(rng, heads, kv_heads, 16, dtype))
    assert_decomposition_matches(got, want, dtype)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dtype,rotary_half", [(np.float32, 6), (np.float32, 3), (np.float16, 4)])
def test_decomposition_matches_the_kernel_with_rotary(monkeypatch, interleaved, dtype, rotary_half):
    rng = np.random.default_rng(interleaved + rotary_half)
    model = gqa_model(6, 2, 12, {"do_rotary": 1, "rotary_interleaved": interleaved}, rotary=True,
                      dtype=F32 if dtype == np.float32 else F16)
    feed_list = cache_feeds(rng, 6, 2, 12, dtype, rotary_half)
    got, want = kernel_and_decomposed(monkeypatch, model, feed_list)
    assert_decomposition_matches(got, want, dtype, exact_present=False)


@pytest.mark.parametrize("attrs", [{"local_window_size": 1}, {"local_window_size": 3}, {"softcap": 1.5},
                                   {"softcap": 2.0, "local_window_size": 2}, {"scale": 0.3}, {"smooth_softmax": 1},
                                   {"smooth_softmax": 1, "local_window_size": 2}])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decomposition_matches_the_kernel_with_scoring_attributes(monkeypatch, attrs, dtype):
    rng = np.random.default_rng(len(str(attrs)))
    model = gqa_model(8, 2, 8, attrs, dtype=F32 if dtype == np.float32 else F16)
    got, want = kernel_and_decomposed(monkeypatch, model, cache_feeds(rng, 8, 2, 8, dtype))
    assert_decomposition_matches(got, want, dtype)


def test_decomposition_matches_the_kernel_with_packed_qkv(monkeypatch):
    rng = np.random.default_rng(3)
    model = gqa_model(4, 2, 16, {"do_rotary": 1}, rotary=True, packed=True)
    feed_list = cache_feeds(rng, 4, 2, 16, rotary_half=8)
    for f in feed_list:
        f["query"] = np.concatenate([f["query"], f.pop("key"), f.pop("value")], axis=2)
    got, want = kernel_and_decomposed(monkeypatch, model, feed_list)
    assert_decomposition_matches(got, want, exact_present=False)


@requires_ort
@pytest.mark.parametrize("case,args", [
    (test_prompt_matches_onnxruntime, (8, 2, 2, [6, 3])),
    (test_decode_steps_match_onnxruntime, (4, 1, False)),
    (test_decode_steps_match_onnxruntime, (8, 2, True)),
    (test_rotary_prompt_and_decode, (1, 8)),
    (test_scoring_attributes, ({"softcap": 2.0, "local_window_size": 2},)),
    (test_scoring_attributes, ({"smooth_softmax": 1, "local_window_size": 2},)),
    (test_float16, ({"do_rotary": 1},)),
    (test_packed_qkv, ()),
    (test_later_prompt_of_batch_one, ()),
], ids=lambda v: getattr(v, "__name__", None))
def test_decomposition_matches_onnxruntime(monkeypatch, case, args):
    """The ONNX Runtime comparisons above, with the native engine running the decomposition."""
    monkeypatch.setenv("XPURT_GQA_DECOMPOSE", "1")
    case(*args)


def test_decomposition_of_genai_form_plans_without_a_segment(monkeypatch):
    """total_sequence_length from Shape(attention_mask) folds, so the decomposition needs no plan segment (and no
    host synchronization: a CUDA plan captures it whole)."""
    rng = np.random.default_rng(11)
    model = gqa_model(4, 2, 8, total_from_mask=True)
    feeds = random_feeds(rng, 2, 1, 4, 2, 8, [5, 3], 6, past_len=5)
    feeds = {k: v for k, v in feeds.items() if k not in ("seqlens_k", "total_sequence_length")}
    feeds["attention_mask"] = np.array([[1] * 6, [1] * 4 + [0] * 2], np.int64)
    got, want = kernel_and_decomposed(monkeypatch, model, [feeds])
    assert_decomposition_matches(got, want)
    monkeypatch.setenv("XPURT_GQA_DECOMPOSE", "1")
    session = xrt.InferenceSession(model, engine="native")
    session.run(None, feeds)
    assert "segment" not in str(session.explain())


@pytest.mark.parametrize("attrs,rotary", [({}, False), ({"do_rotary": 1, "local_window_size": 3}, True),
                                          ({"softcap": 2.0, "smooth_softmax": 1}, False)])
def test_decomposition_uses_ops_with_cuda_kernels(monkeypatch, attrs, rotary):
    """Every step of the decomposed node is a view or a registry op that has a CUDA kernel in this build (what lets a
    CUDA plan take it; the GPU test below runs it)."""
    if not any(k.device_type == "cuda" for k in xrt.kernels("matmul")):
        pytest.skip("this build has no CUDA kernels")
    rng = np.random.default_rng(4)
    model = gqa_model(6, 2, 16, attrs, rotary=rotary, packed=True)
    monkeypatch.setenv("XPURT_GQA_DECOMPOSE", "1")
    session = xrt.InferenceSession(model, engine="native")
    for f in cache_feeds(rng, 6, 2, 16, rotary_half=4 if rotary else 0):
        f["query"] = np.concatenate([f["query"], f.pop("key"), f.pop("value")], axis=2)
        session.run(None, f)
        nodes = session.explain().nodes
        assert "GroupQueryAttention" not in node_ops(session)
        for n in nodes:
            assert n["kernel"] == "view" or (n["op"] and any(k.device_type == "cuda" for k in xrt.kernels(n["op"]))), n


def test_generation_through_the_decomposition(monkeypatch):
    """test_generation.py's GroupQueryAttention form (genai's graph: seqlens_k and total_sequence_length from the
    attention mask, a shared past/present buffer per slot, continuous batching) with the decomposition."""
    import test_generation as tg
    monkeypatch.setenv("XPURT_GQA_DECOMPOSE", "1")
    session = xrt.InferenceSession(tg.tiny_gqa_decoder(), engine="native")
    feeds = {i.name: np.zeros([1 if not isinstance(d, int) else d for d in i.shape],
                              np.int64 if "int64" in i.type else np.float32) for i in session.get_inputs()}
    session.run(None, feeds)
    assert "GroupQueryAttention" not in node_ops(session)
    tg.test_the_group_query_attention_form_generates_what_the_concat_form_does(tg.tiny_decoder(with_cache=True),
                                                                               tg.tiny_gqa_decoder(),
                                                                               "native")
    tg.test_continuous_batching_serves_the_group_query_attention_form(tg.tiny_decoder(with_cache=True),
                                                                      tg.tiny_gqa_decoder(),
                                                                      "native")


@requires_gpu
@pytest.mark.parametrize("kv_heads", [None, 1])
def test_cuda_generation_runs_the_decomposition(kv_heads):
    """The GroupQueryAttention decoder generates on CUDA (its attention decomposed) the CPU's greedy tokens."""
    from decoder_models import tiny_gqa_decoder
    from xpuruntime.generation import GenerationConfig, Generator
    model = tiny_gqa_decoder() if kv_heads is None else tiny_gqa_decoder(kv_heads=kv_heads)
    config = GenerationConfig(max_new_tokens=10)
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    for batch in (prompts[:1], prompts):
        assert Generator(model, config, device="cuda", engine="native").generate(batch) == \
            Generator(model, config).generate(batch)


@requires_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("attrs,rotary", [({}, False), ({"do_rotary": 1}, True),
                                          ({"do_rotary": 1, "rotary_interleaved": 1, "local_window_size": 3}, True),
                                          ({"softcap": 2.0, "smooth_softmax": 1}, False)])
@pytest.mark.parametrize("heads,kv_heads,head", [(8, 2, 16), (6, 3, 12), (4, 4, 64)])
def test_cuda_session_runs_the_decomposition(dtype, attrs, rotary, heads, kv_heads, head):
    """A CUDA session (no CPU fallback) runs GroupQueryAttention as the decomposition, with the cpu kernel's results:
    prompts, decode steps with a grown and a shared past, a later prompt."""
    rng = np.random.default_rng(heads * head + len(attrs))
    model = gqa_model(heads, kv_heads, head, attrs, rotary=rotary, dtype=F32 if dtype == np.float32 else F16)
    cuda = xrt.InferenceSession(model, device="cuda:0", engine="native")
    cpu = xrt.InferenceSession(model, engine="native")
    feed_list = cache_feeds(rng, heads, kv_heads, head, dtype, rotary_half=head // 4 if rotary else 0, max_len=12)
    got = [cuda.run(None, f) for f in feed_list]
    want = [cpu.run(None, f) for f in feed_list]
    assert "GroupQueryAttention" not in node_ops(cuda)
    for step, (g, w) in enumerate(zip(got, want)):  # GPU sums in another order: float32 at 1e-4, float16 at 3e-3
        tol = 1e-4 if dtype == np.float32 else 3e-3
        for name, a, b in zip(("output", "present_key", "present_value"), g, w):
            np.testing.assert_allclose(np.asarray(a).astype(np.float32), b.astype(np.float32), rtol=tol, atol=tol,
                                       err_msg=f"feed {step} {name}")
