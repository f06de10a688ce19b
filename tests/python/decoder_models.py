"""Tiny decoder-only transformers built with onnx.helper, for the generation tests (test_generation.py).

`tiny_decoder(with_cache=True)` is a GPT-style model as transformers exports it with a cache: inputs input_ids
[batch, seq], attention_mask [batch, past + seq], position_ids [batch, seq] and past_key_values.{i}.key/value
[batch, heads, past, head_dim]; outputs logits [batch, seq, vocab] and present.{i}.key/value = Concat(past, new K/V).
`with_cache=False` is the same model, same weights, without the cache (past length 0): the reference that
recomputes the whole sequence.
"""

from __future__ import annotations

import inspect

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB = 37
EMBED = 16
HEADS = 2
HEAD_DIM = 8
LAYERS = 2
MAX_POSITIONS = 64


def _weights(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    w = {"wte": rng.normal(0, 1.0, (VOCAB, EMBED)), "wpe": rng.normal(0, 0.5, (MAX_POSITIONS, EMBED)),
         "lm_head": rng.normal(0, 0.5, (EMBED, VOCAB)), "ln_f.g": 1 + rng.normal(0, 0.1, EMBED),
         "ln_f.b": rng.normal(0, 0.1, EMBED), "neg": np.array(-1e4)}
    for layer in range(LAYERS):
        for name in ("wq", "wk", "wv", "wo"):
            w[f"l{layer}.{name}"] = rng.normal(0, 0.4, (EMBED, EMBED))
        w[f"l{layer}.w1"] = rng.normal(0, 0.4, (EMBED, 4 * EMBED))
        w[f"l{layer}.b1"] = rng.normal(0, 0.1, 4 * EMBED)
        w[f"l{layer}.w2"] = rng.normal(0, 0.4, (4 * EMBED, EMBED))
        for ln in ("ln1", "ln2"):
            w[f"l{layer}.{ln}.g"] = 1 + rng.normal(0, 0.1, EMBED)
            w[f"l{layer}.{ln}.b"] = rng.normal(0, 0.1, EMBED)
    return {k: v.astype(np.float32) for k, v in w.items()}


def _i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _mask_nodes() -> list:
    """allowed [batch, 1, seq, total]: key j visible to query i (at absolute position past + i) when j <= past + i
    and attention_mask[b, j] is 1."""
    n = helper.make_node
    return [
        n("Shape", ["input_ids"], ["n1"], start=1, end=2),
        n("Shape", ["attention_mask"], ["t1"], start=1, end=2),
        n("Squeeze", ["n1", "axis0"], ["n"]),
        n("Squeeze", ["t1", "axis0"], ["t"]),
        n("Sub", ["t", "n"], ["past_len"]),
        n("Range", ["zero", "t", "one"], ["kidx"]),
        n("Range", ["past_len", "t", "one"], ["qidx"]),
        n("Unsqueeze", ["kidx", "axis0"], ["kidx2"]),
        n("Unsqueeze", ["qidx", "axis1"], ["qidx2"]),
        n("LessOrEqual", ["kidx2", "qidx2"], ["causal"]),
        n("Cast", ["attention_mask"], ["mask_b"], to=TensorProto.BOOL),
        n("Unsqueeze", ["mask_b", "axes12"], ["mask4"]),
        n("And", ["causal", "mask4"], ["allowed"]),
    ]


def _block_tail(p: str, x: str) -> list:
    """A layer after its attention ({p}.o2 [batch, seq, embed]): output projection, residual, LayerNorm, MLP,
    residual -> {p}.x2."""
    n = helper.make_node
    return [
        n("MatMul", [f"{p}.o2", f"{p}.wo"], [f"{p}.o"]),
        n("Add", [x, f"{p}.o"], [f"{p}.x1"]),
        n("LayerNormalization", [f"{p}.x1", f"{p}.ln2.g", f"{p}.ln2.b"], [f"{p}.h2"], axis=-1, epsilon=1e-5),
        n("MatMul", [f"{p}.h2", f"{p}.w1"], [f"{p}.m0"]),
        n("Add", [f"{p}.m0", f"{p}.b1"], [f"{p}.m1"]),
        n("Relu", [f"{p}.m1"], [f"{p}.m2"]),
        n("MatMul", [f"{p}.m2", f"{p}.w2"], [f"{p}.m3"]),
        n("Add", [f"{p}.x1", f"{p}.m3"], [f"{p}.x2"]),
    ]


def _layer(layer: int, x: str, with_cache: bool) -> "tuple[list, str]":
    n = helper.make_node
    p = f"l{layer}"
    nodes = [n("LayerNormalization", [x, f"{p}.ln1.g", f"{p}.ln1.b"], [f"{p}.h"], axis=-1, epsilon=1e-5)]
    for name in ("q", "k", "v"):
        nodes += [n("MatMul", [f"{p}.h", f"{p}.w{name}"], [f"{p}.{name}0"]),
                  n("Reshape", [f"{p}.{name}0", "split_heads"], [f"{p}.{name}1"]),
                  n("Transpose", [f"{p}.{name}1"], [f"{p}.{name}"], perm=[0, 2, 1, 3])]
    if with_cache:
        nodes += [n("Concat", [f"past_key_values.{layer}.key", f"{p}.k"], [f"present.{layer}.key"], axis=2),
                  n("Concat", [f"past_key_values.{layer}.value", f"{p}.v"], [f"present.{layer}.value"], axis=2)]
        keys, values = f"present.{layer}.key", f"present.{layer}.value"
    else:
        keys, values = f"{p}.k", f"{p}.v"
    nodes += [
        n("Transpose", [keys], [f"{p}.kt"], perm=[0, 1, 3, 2]),
        n("MatMul", [f"{p}.q", f"{p}.kt"], [f"{p}.s0"]),
        n("Mul", [f"{p}.s0", "scale"], [f"{p}.s1"]),
        n("Where", ["allowed", f"{p}.s1", "neg"], [f"{p}.s2"]),
        n("Softmax", [f"{p}.s2"], [f"{p}.p"], axis=-1),
        n("MatMul", [f"{p}.p", values], [f"{p}.o0"]),
        n("Transpose", [f"{p}.o0"], [f"{p}.o1"], perm=[0, 2, 1, 3]),
        n("Reshape", [f"{p}.o1", "merge_heads"], [f"{p}.o2"]),
    ] + _block_tail(p, x)
    return nodes, f"{p}.x2"


def tiny_decoder(with_cache: bool = True, seed: int = 0, position_ids: bool = True, float16: bool = False) -> bytes:
    """The serialized model (see the module docstring); the same `seed` gives the same weights either way.
    `float16`: weights, cache and logits in float16."""
    dtype, elem = (np.float16, TensorProto.FLOAT16) if float16 else (np.float32, TensorProto.FLOAT)
    n = helper.make_node
    w = {k: v.astype(dtype) for k, v in _weights(seed).items()}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [_i64("zero", 0), _i64("one", 1), _i64("axis0", [0]), _i64("axis1", [1]), _i64("axes12", [1, 2]),
              _i64("split_heads", [0, 0, HEADS, HEAD_DIM]), _i64("merge_heads", [0, 0, EMBED]),
              numpy_helper.from_array(np.array(HEAD_DIM ** -0.5, dtype), "scale")]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"])]
    nodes = [n("Gather", ["wte", "input_ids"], ["tok"])]
    if position_ids:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]))
        nodes += [n("Gather", ["wpe", "position_ids"], ["pos"]), n("Add", ["tok", "pos"], ["x0"])]
    else:
        nodes += [n("Identity", ["tok"], ["x0"])]
    outputs = [helper.make_tensor_value_info("logits", elem, ["batch", "seq", VOCAB])]
    nodes += _mask_nodes()
    x = "x0"
    for layer in range(LAYERS):
        if with_cache:
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_key_values.{layer}.{kind}", elem,
                                                            ["batch", HEADS, "past", HEAD_DIM]))
                outputs.append(helper.make_tensor_value_info(f"present.{layer}.{kind}", elem,
                                                             ["batch", HEADS, "total", HEAD_DIM]))
        layer_nodes, x = _layer(layer, x, with_cache)
        nodes += layer_nodes
    nodes += [n("LayerNormalization", [x, "ln_f.g", "ln_f.b"], ["xf"], axis=-1, epsilon=1e-5),
              n("MatMul", ["xf", "lm_head"], ["logits"])]
    graph = helper.make_graph(nodes, "tiny_decoder" + ("_with_past" if with_cache else ""), inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def tiny_gqa_decoder(seed: int = 0, kv_heads: int = HEADS, float16: bool = False) -> bytes:
    """The tiny decoder in ONNX Runtime's GroupQueryAttention form (as onnxruntime-genai's model builder writes it):
    each layer's attention is one com.microsoft GroupQueryAttention node fed Q/K/V [batch, seq, heads x head_dim],
    past_key_values.{i}.key/value [batch, kv_heads, past, head_dim] (present: past + new, not a shared buffer), and
    seqlens_k = sum(attention_mask) - 1, total_sequence_length = attention_mask's width, both int32 and computed in
    the graph; rows are right-padded. With kv_heads == HEADS it computes what tiny_decoder(seed) does (same weights);
    fewer kv_heads keep the first kv_heads x head_dim columns of wk and wv (grouped-query attention)."""
    assert HEADS % kv_heads == 0
    dtype, elem = (np.float16, TensorProto.FLOAT16) if float16 else (np.float32, TensorProto.FLOAT)
    n = helper.make_node
    w = {k: v.astype(dtype) for k, v in _weights(seed).items() if k != "neg"}
    for layer in range(LAYERS):
        for name in ("wk", "wv"):
            w[f"l{layer}.{name}"] = np.ascontiguousarray(w[f"l{layer}.{name}"][:, :kv_heads * HEAD_DIM])
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [_i64("axis0", [0]), _i64("axes1", [1]), _i64("one", 1)]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("logits", elem, ["batch", "seq", VOCAB])]
    nodes = [n("Gather", ["wte", "input_ids"], ["tok"]), n("Gather", ["wpe", "position_ids"], ["pos"]),
             n("Add", ["tok", "pos"], ["x0"]),
             n("ReduceSum", ["attention_mask", "axes1"], ["mask_sum"], keepdims=0),
             n("Sub", ["mask_sum", "one"], ["seqlens64"]),
             n("Cast", ["seqlens64"], ["seqlens_k"], to=TensorProto.INT32),
             n("Shape", ["attention_mask"], ["total1"], start=1, end=2),
             n("Squeeze", ["total1", "axis0"], ["total64"]),
             n("Cast", ["total64"], ["total_sequence_length"], to=TensorProto.INT32)]
    x = "x0"
    for layer in range(LAYERS):
        p = f"l{layer}"
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{layer}.{kind}", elem,
                                                        ["batch", kv_heads, "past", HEAD_DIM]))
            outputs.append(helper.make_tensor_value_info(f"present.{layer}.{kind}", elem,
                                                         ["batch", kv_heads, "total", HEAD_DIM]))
        nodes += [n("LayerNormalization", [x, f"{p}.ln1.g", f"{p}.ln1.b"], [f"{p}.h"], axis=-1, epsilon=1e-5)]
        nodes += [n("MatMul", [f"{p}.h", f"{p}.w{name}"], [f"{p}.{name}0"]) for name in ("q", "k", "v")]
        nodes += [
            n("GroupQueryAttention", [f"{p}.q0", f"{p}.k0", f"{p}.v0", f"past_key_values.{layer}.key",
                                      f"past_key_values.{layer}.value", "seqlens_k", "total_sequence_length"],
              [f"{p}.o2", f"present.{layer}.key", f"present.{layer}.value"], domain="com.microsoft",
              num_heads=HEADS, kv_num_heads=kv_heads),
        ] + _block_tail(p, x)
        x = f"{p}.x2"
    nodes += [n("LayerNormalization", [x, "ln_f.g", "ln_f.b"], ["xf"], axis=-1, epsilon=1e-5),
              n("MatMul", ["xf", "lm_head"], ["logits"])]
    graph = helper.make_graph(nodes, "tiny_gqa_decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def reference_greedy(model: bytes, prompts: list, steps: int, engine: str = "native") -> list:
    """Greedy tokens by running the no-cache model over the whole left-padded sequence at every step, in Python:
    the reference the Generator's cached loop must reproduce."""
    import xpuruntime as xrt

    sess = xrt.InferenceSession(model, engine=engine)
    names = {i.name for i in sess.get_inputs()}
    width = max(len(p) for p in prompts)
    ids = np.array([[0] * (width - len(p)) + list(p) for p in prompts], np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.int64)
    out = [[] for _ in prompts]
    for _ in range(steps):
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "position_ids" in names:
            positions = np.cumsum(mask, axis=1) - 1
            feeds["position_ids"] = np.where(mask == 0, 1, positions).astype(np.int64)
        logits = np.asarray(sess.run(["logits"], feeds)[0])
        nxt = logits[:, -1, :].argmax(axis=-1)
        for r, t in enumerate(nxt):
            out[r].append(int(t))
        ids = np.concatenate([ids, nxt[:, None].astype(np.int64)], axis=1)
        mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
    return out


def torch_decoder_export(path) -> "torch.nn.Module":
    """A GPT-style torch decoder (2 layers, 4 heads of 8, vocabulary 41) exported by torch.onnx.export with its cache
    as transformers names it (past_key_values.{i}.key/value -> present.{i}.key/value, Concat in the graph) to `path`;
    returns the torch model, whose own greedy decode is the reference. Needs torch."""
    import torch

    torch.manual_seed(0)
    model = _TorchDecoder().eval()
    batch, past_len, seq = 2, 3, 4
    past = [torch.randn(batch, 4, past_len, 8) for _ in range(4)]
    ids = torch.randint(0, 41, (batch, seq))
    mask = torch.ones(batch, past_len + seq, dtype=torch.long)
    positions = torch.arange(past_len, past_len + seq).repeat(batch, 1)
    pasts = [f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")]
    presents = [f"present.{i}.{k}" for i in range(2) for k in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({name: {0: "batch", 2: "past"} for name in pasts})
    axes.update({name: {0: "batch", 2: "total"} for name in presents})
    # The TorchScript exporter (dynamo=False): torch 2.11's default dynamo exporter cannot turn these dynamic_axes into
    # dynamic_shapes, nor flatten the cache list. Older torch (Debian's) has no `dynamo` argument and only that exporter.
    choice = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    torch.onnx.export(model, (ids, mask, positions, *past), str(path), opset_version=17, dynamic_axes=axes,
                      input_names=["input_ids", "attention_mask", "position_ids"] + pasts,
                      output_names=["logits"] + presents, **choice)
    return model


def torch_greedy(model, prompts: list, steps: int) -> list:
    """`model`'s (torch_decoder_export) own greedy decode: the whole left-padded sequence every step, empty past."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    empty = [torch.zeros(len(prompts), 4, 0, 8) for _ in range(4)]
    out = [[] for _ in prompts]
    with torch.no_grad():
        for _ in range(steps):
            positions = (mask.cumsum(1) - 1).masked_fill(mask == 0, 1)
            nxt = model(ids, mask, positions, *empty)[0][:, -1].argmax(-1)
            for r in range(len(prompts)):
                out[r].append(int(nxt[r]))
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=torch.long)], 1)
    return out


def _TorchDecoder():
    """GPT-style: token + position embeddings, pre-norm blocks of causal attention (past keys/values concatenated in
    front) and a GELU MLP, final norm, LM head. forward(input_ids, attention_mask, position_ids, *past) -> (logits,
    *presents)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, embed: int, heads: int) -> None:
            super().__init__()
            self.heads, self.head_dim = heads, embed // heads
            self.ln1, self.ln2 = torch.nn.LayerNorm(embed), torch.nn.LayerNorm(embed)
            self.qkv, self.out = torch.nn.Linear(embed, 3 * embed), torch.nn.Linear(embed, embed)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(embed, 4 * embed), torch.nn.GELU(),
                                           torch.nn.Linear(4 * embed, embed))

        def forward(self, x, bias, past_key, past_value):
            batch, seq, embed = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(embed, dim=-1)
            q, k, v = [t.view(batch, seq, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v)]
            k, v = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
            attention = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5 + bias, -1) @ v
            x = x + self.out(attention.transpose(1, 2).reshape(batch, seq, embed))
            return x + self.mlp(self.ln2(x)), k, v

    class Decoder(torch.nn.Module):
        def __init__(self, vocab: int = 41, embed: int = 32, heads: int = 4, layers: int = 2) -> None:
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(vocab, embed), torch.nn.Embedding(64, embed)
            self.blocks = torch.nn.ModuleList([Block(embed, heads) for _ in range(layers)])
            self.ln, self.head = torch.nn.LayerNorm(embed), torch.nn.Linear(embed, vocab, bias=False)

        def forward(self, input_ids, attention_mask, position_ids, *past):
            seq, total = input_ids.shape[1], attention_mask.shape[1]
            x = self.wte(input_ids) + self.wpe(position_ids)
            queries = torch.arange(total - seq, total).unsqueeze(1)
            keys = torch.arange(total).unsqueeze(0)
            allowed = (keys <= queries)[None, None] & attention_mask.bool()[:, None, None, :]
            bias = torch.where(allowed, torch.zeros(()), torch.full((), -1e9))
            presents = []
            for i, block in enumerate(self.blocks):
                x, k, v = block(x, bias, past[2 * i], past[2 * i + 1])
                presents += [k, v]
            return (self.head(self.ln(x)), *presents)

    return Decoder()
