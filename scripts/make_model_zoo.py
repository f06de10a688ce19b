#!/usr/bin/env python3
"""Generates the model zoo used by tests and benchmarks: an MLP, a BERT-base-like encoder and a ResNet-50, each
full-size and tiny, in float32 and float16, with random weights from a fixed seed (nothing is downloaded).

Every model is ONNX opset 17 with ``ir_version = 8`` (so ONNX Runtime 1.29 and Debian's python3-onnx 1.12 both
read it), has a symbolic batch dimension named ``"batch"`` on its inputs and outputs, and passes
``onnx.checker.check_model``. Weights are scaled so activations stay O(1): the float16 variants must not
overflow. See docs/model_zoo.md for the models, their sizes and the tests that use them.

Usage::

    python3 scripts/make_model_zoo.py [--out models/zoo] [--tiny-only] [--dtype fp32|fp16|both] [--seed 0]

The module is also imported by tests/python/test_model_zoo.py: ``generate()`` writes files, the ``build_*``
functions return ``onnx.ModelProto`` objects and ``to_fp16()`` converts one.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import zlib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
BATCH = "batch"
MODEL_NAMES = ("mlp", "bert", "resnet50")
# onnx.save cannot write one protobuf over 2 GB; every zoo model is far below, but keep the guard for growth.
EXTERNAL_DATA_THRESHOLD = int(1.5 * 1024**3)


# ----------------------------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MlpConfig:
    width: int
    layers: int = 4


@dataclass(frozen=True)
class BertConfig:
    layers: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    vocab: int
    epsilon: float = 1e-12


@dataclass(frozen=True)
class ResNetConfig:
    stem: int
    widths: Sequence[int]
    blocks: Sequence[int]
    image: int
    classes: int = 1000
    expansion: int = 4
    epsilon: float = 1e-5


MLP = {False: MlpConfig(width=4096), True: MlpConfig(width=64)}
BERT = {
    False: BertConfig(layers=12, hidden=768, heads=12, ffn=3072, seq=128, vocab=30522),
    True: BertConfig(layers=2, hidden=64, heads=4, ffn=128, seq=16, vocab=1000),
}
RESNET = {
    False: ResNetConfig(stem=64, widths=(64, 128, 256, 512), blocks=(3, 4, 6, 3), image=224),
    True: ResNetConfig(stem=4, widths=(4, 8, 16, 32), blocks=(1, 1, 1, 1), image=32),
}


def _rng(name: str, seed: int) -> np.random.Generator:
    """One generator per model, so a model's weights do not depend on which other models were generated."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# ----------------------------------------------------------------------------------------------------------------
# Graph builder
# ----------------------------------------------------------------------------------------------------------------


class _Graph:
    """Collects nodes and float32 initializers with unique names; ``model()`` assembles the checked ModelProto."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self._count: Dict[str, int] = {}

    def _unique(self, prefix: str) -> str:
        n = self._count.get(prefix, 0)
        self._count[prefix] = n + 1
        return f"{prefix}_{n}"

    def const(self, name: str, value: np.ndarray) -> str:
        value = np.asarray(value)
        if value.dtype == np.float64:
            value = value.astype(np.float32)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: Iterable[str], prefix: Optional[str] = None, **attrs) -> str:
        out = self._unique(prefix or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def model(self, inputs: List[onnx.ValueInfoProto], outputs: List[onnx.ValueInfoProto], doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, initializer=self.initializers, doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="xpuruntime-zoo")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


# ----------------------------------------------------------------------------------------------------------------
# MLP
# ----------------------------------------------------------------------------------------------------------------


def build_mlp(tiny: bool = False, seed: int = 0) -> onnx.ModelProto:
    """``layers`` x (Gemm(width) + Relu) on x: float[batch, width] -> y: float[batch, width].

    He initialisation (std sqrt(2 / fan_in)) keeps the second moment of the ReLU activations ~1 layer to layer.
    Gemm weights are stored as [out, in] with transB=1, the layout PyTorch's Linear exports.
    """
    cfg = MLP[tiny]
    rng = _rng("mlp", seed)
    g = _Graph("mlp_tiny" if tiny else "mlp")
    h = "x"
    for i in range(cfg.layers):
        w = g.const(f"fc{i}.weight", rng.standard_normal((cfg.width, cfg.width)) * math.sqrt(2.0 / cfg.width))
        b = g.const(f"fc{i}.bias", rng.standard_normal(cfg.width) * 0.1)
        h = g.op("Gemm", [h, w, b], prefix=f"fc{i}", transB=1)
        h = g.op("Relu", [h], prefix=f"relu{i}")
    g.nodes[-1].output[0] = "y"
    return g.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, cfg.width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BATCH, cfg.width])],
        f"MLP: {cfg.layers} x (Gemm {cfg.width} + Relu)",
    )


# ----------------------------------------------------------------------------------------------------------------
# BERT
# ----------------------------------------------------------------------------------------------------------------


def build_bert(tiny: bool = False, seed: int = 0) -> onnx.ModelProto:
    """A BERT-base-like post-LayerNorm encoder: input_ids int64[batch, seq] -> last_hidden_state float[batch, seq, hidden].

    Word (Gather) + position embeddings, LayerNormalization, then per layer: Q/K/V MatMul+Add, Reshape to
    [batch, seq, heads, d], Transpose, MatMul, Div(sqrt(d)), Softmax, MatMul, Transpose, Reshape, output
    projection, residual Add + LayerNormalization, FFN with Gelu written as 0.5*x*(1+Erf(x/sqrt(2))) (Gelu is
    not an opset-17 op), residual Add + LayerNormalization. Weights use BERT's N(0, 0.02) initialisation; the
    LayerNormalizations keep activations O(1).
    """
    cfg = BERT[tiny]
    rng = _rng("bert", seed)
    g = _Graph("bert_tiny" if tiny else "bert")
    d = cfg.hidden // cfg.heads

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return rng.standard_normal(shape) * std

    def layer_norm(x: str, name: str) -> str:
        gamma = g.const(f"{name}.weight", 1.0 + normal(cfg.hidden, std=0.1))
        beta = g.const(f"{name}.bias", normal(cfg.hidden, std=0.1))
        return g.op("LayerNormalization", [x, gamma, beta], prefix=name, axis=-1, epsilon=cfg.epsilon)

    def linear(x: str, name: str, n_in: int, n_out: int) -> str:
        w = g.const(f"{name}.weight", normal(n_in, n_out))
        b = g.const(f"{name}.bias", normal(n_out))
        return g.op("Add", [g.op("MatMul", [x, w], prefix=f"{name}.matmul"), b], prefix=f"{name}.add")

    split_heads = g.const("shape.split_heads", np.array([0, 0, cfg.heads, d], np.int64))
    merge_heads = g.const("shape.merge_heads", np.array([0, 0, cfg.hidden], np.int64))
    sqrt_d = g.const("const.sqrt_head_dim", np.array(math.sqrt(d), np.float32))
    half = g.const("const.half", np.array(0.5, np.float32))
    one = g.const("const.one", np.array(1.0, np.float32))
    sqrt2 = g.const("const.sqrt2", np.array(math.sqrt(2.0), np.float32))

    word = g.const("embeddings.word_embeddings", normal(cfg.vocab, cfg.hidden))
    position = g.const("embeddings.position_embeddings", normal(cfg.seq, cfg.hidden))
    h = g.op("Gather", [word, "input_ids"], prefix="embeddings.gather", axis=0)
    h = g.op("Add", [h, position], prefix="embeddings.add")
    h = layer_norm(h, "embeddings.layer_norm")

    for i in range(cfg.layers):
        p = f"layer{i}"
        heads = {}
        for which, perm in (("query", [0, 2, 1, 3]), ("key", [0, 2, 3, 1]), ("value", [0, 2, 1, 3])):
            t = linear(h, f"{p}.attention.{which}", cfg.hidden, cfg.hidden)
            t = g.op("Reshape", [t, split_heads], prefix=f"{p}.attention.{which}.reshape")
            heads[which] = g.op("Transpose", [t], prefix=f"{p}.attention.{which}.transpose", perm=perm)
        scores = g.op("MatMul", [heads["query"], heads["key"]], prefix=f"{p}.attention.scores")
        scores = g.op("Div", [scores, sqrt_d], prefix=f"{p}.attention.scale")
        probs = g.op("Softmax", [scores], prefix=f"{p}.attention.softmax", axis=-1)
        ctx = g.op("MatMul", [probs, heads["value"]], prefix=f"{p}.attention.context")
        ctx = g.op("Transpose", [ctx], prefix=f"{p}.attention.context.transpose", perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, merge_heads], prefix=f"{p}.attention.context.reshape")
        attn = linear(ctx, f"{p}.attention.output", cfg.hidden, cfg.hidden)
        h = layer_norm(g.op("Add", [attn, h], prefix=f"{p}.attention.residual"), f"{p}.attention.layer_norm")

        f = linear(h, f"{p}.ffn.intermediate", cfg.hidden, cfg.ffn)
        erf = g.op("Erf", [g.op("Div", [f, sqrt2], prefix=f"{p}.ffn.gelu.div")], prefix=f"{p}.ffn.gelu.erf")
        gate = g.op("Mul", [g.op("Add", [erf, one], prefix=f"{p}.ffn.gelu.add"), half], prefix=f"{p}.ffn.gelu.half")
        f = g.op("Mul", [f, gate], prefix=f"{p}.ffn.gelu.mul")
        f = linear(f, f"{p}.ffn.output", cfg.ffn, cfg.hidden)
        h = layer_norm(g.op("Add", [f, h], prefix=f"{p}.ffn.residual"), f"{p}.ffn.layer_norm")

    g.nodes[-1].output[0] = "last_hidden_state"
    return g.model(
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [BATCH, cfg.seq])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [BATCH, cfg.seq, cfg.hidden])],
        f"BERT-like encoder: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, FFN {cfg.ffn}, "
        f"seq {cfg.seq}, vocab {cfg.vocab}",
    )


# ----------------------------------------------------------------------------------------------------------------
# ResNet-50
# ----------------------------------------------------------------------------------------------------------------


def build_resnet50(tiny: bool = False, seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 v1.5 (stride on the 3x3 conv): input float[batch, 3, H, W] -> logits float[batch, classes].

    Every convolution is a bias-free Conv followed by a real BatchNormalization (with non-trivial running
    statistics) and, where the network has one, a Relu, so the engines' Conv+BN(+Relu) fusion passes have
    something to fuse. He-initialised convolutions keep activations O(1); the last BatchNormalization of each
    bottleneck has a small scale (0.2) so the residual sum does not grow with depth.
    """
    cfg = RESNET[tiny]
    rng = _rng("resnet50", seed)
    g = _Graph("resnet50_tiny" if tiny else "resnet50")

    def conv_bn(x: str, name: str, c_in: int, c_out: int, k: int, stride: int, relu: bool, gamma: float = 1.0) -> str:
        w = g.const(f"{name}.weight", rng.standard_normal((c_out, c_in, k, k)) * math.sqrt(2.0 / (c_in * k * k)))
        y = g.op("Conv", [x, w], prefix=name, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        scale = g.const(f"{name}.bn.weight", gamma * (1.0 + 0.1 * rng.standard_normal(c_out)))
        bias = g.const(f"{name}.bn.bias", 0.1 * rng.standard_normal(c_out))
        mean = g.const(f"{name}.bn.running_mean", 0.1 * rng.standard_normal(c_out))
        var = g.const(f"{name}.bn.running_var", rng.uniform(0.5, 1.5, c_out))
        y = g.op("BatchNormalization", [y, scale, bias, mean, var], prefix=f"{name}.bn", epsilon=cfg.epsilon)
        return g.op("Relu", [y], prefix=f"{name}.relu") if relu else y

    h = conv_bn("input", "conv1", 3, cfg.stem, 7, 2, relu=True)
    h = g.op("MaxPool", [h], prefix="maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = cfg.stem
    for stage, (width, blocks) in enumerate(zip(cfg.widths, cfg.blocks)):
        c_out = width * cfg.expansion
        for block in range(blocks):
            p = f"layer{stage + 1}.{block}"
            stride = 2 if block == 0 and stage > 0 else 1
            y = conv_bn(h, f"{p}.conv1", c_in, width, 1, 1, relu=True)
            y = conv_bn(y, f"{p}.conv2", width, width, 3, stride, relu=True)
            y = conv_bn(y, f"{p}.conv3", width, c_out, 1, 1, relu=False, gamma=0.2)
            shortcut = conv_bn(h, f"{p}.downsample", c_in, c_out, 1, stride, relu=False) if block == 0 else h
            h = g.op("Relu", [g.op("Add", [y, shortcut], prefix=f"{p}.add")], prefix=f"{p}.relu")
            c_in = c_out
    h = g.op("GlobalAveragePool", [h], prefix="avgpool")
    h = g.op("Flatten", [h], prefix="flatten", axis=1)
    w = g.const("fc.weight", rng.standard_normal((cfg.classes, c_in)) * math.sqrt(1.0 / c_in))
    b = g.const("fc.bias", 0.1 * rng.standard_normal(cfg.classes))
    h = g.op("Gemm", [h, w, b], prefix="fc", transB=1)
    g.nodes[-1].output[0] = "logits"
    return g.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, 3, cfg.image, cfg.image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, cfg.classes])],
        f"ResNet-50 v1.5: stem {cfg.stem}, widths {list(cfg.widths)}, blocks {list(cfg.blocks)}, "
        f"input {cfg.image}x{cfg.image}",
    )


BUILDERS = {"mlp": build_mlp, "bert": build_bert, "resnet50": build_resnet50}


# ----------------------------------------------------------------------------------------------------------------
# float16 conversion and files
# ----------------------------------------------------------------------------------------------------------------


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Returns a copy whose float32 initializers and graph inputs/outputs are float16; every op then computes in
    float16 (LayerNormalization and Softmax included; LayerNormalization's stash_type keeps its statistics in
    float32). Integer tensors (input_ids, Reshape shapes) are unchanged."""
    fp16 = onnx.ModelProto()
    fp16.CopyFrom(model)
    graph = fp16.graph
    graph.name += "_fp16"
    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT:
            graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.checker.check_model(fp16)
    return fp16


def file_name(name: str, tiny: bool, dtype: str) -> str:
    """``<name>[_tiny][_fp16].onnx``: e.g. ``bert.onnx``, ``resnet50_tiny_fp16.onnx``."""
    return f"{name}{'_tiny' if tiny else ''}{'_fp16' if dtype == 'fp16' else ''}.onnx"


def save(model: onnx.ModelProto, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    external = model.ByteSize() > EXTERNAL_DATA_THRESHOLD
    onnx.save(model, str(path), save_as_external_data=external, location=path.name + ".data" if external else None)


def generate(
    out: pathlib.Path | str = "models/zoo",
    *,
    tiny_only: bool = False,
    dtypes: Sequence[str] = ("fp32", "fp16"),
    names: Sequence[str] = MODEL_NAMES,
    seed: int = 0,
    verbose: bool = False,
) -> Dict[str, pathlib.Path]:
    """Writes the selected models into ``out``; returns {file stem: path}, e.g. {"mlp_tiny_fp16": ...}."""
    out = pathlib.Path(out)
    written: Dict[str, pathlib.Path] = {}
    for name in names:
        for tiny in (True,) if tiny_only else (True, False):
            model = BUILDERS[name](tiny=tiny, seed=seed)
            for dtype in dtypes:
                path = out / file_name(name, tiny, dtype)
                save(to_fp16(model) if dtype == "fp16" else model, path)
                written[path.stem] = path
                if verbose:
                    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
            del model
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="models/zoo", help="output folder (default: models/zoo, git-ignored)")
    parser.add_argument("--tiny-only", action="store_true", help="write only the tiny variants (used by the tests)")
    parser.add_argument("--dtype", choices=("fp32", "fp16", "both"), default="both", help="weight and I/O type")
    parser.add_argument("--model", choices=MODEL_NAMES, action="append", help="only this model (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    args = parser.parse_args(argv)
    dtypes = ("fp32", "fp16") if args.dtype == "both" else (args.dtype,)
    generate(args.out, tiny_only=args.tiny_only, dtypes=dtypes, names=args.model or MODEL_NAMES, seed=args.seed,
             verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
