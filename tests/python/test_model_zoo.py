"""The model zoo (scripts/make_model_zoo.py): the tiny MLP, BERT and ResNet-50, float32 and float16, generated
into a temporary folder, checked for structure (opset, IR version, symbolic batch, the ops the engines fuse),
and run through InferenceSession(engine="onnxruntime") on the CPU against independent NumPy float64 references
computed from the models' own initializers.

Tolerances: float32 models agree with the float64 reference to rtol = atol = 1e-4 (outputs are O(1)). float16
models hold float16 weights and I/O and compute in float16 (ONNX Runtime's CPU provider may run an op it has
no float16 kernel for in float32 between Casts it inserts), so they are compared with the float64 reference of
the float16 weights at rtol = atol = 3e-2 (measured worst case ~1.1e-2: ~10 bits of mantissa over a few dozen
ops). docs/model_zoo.md lists the same numbers."""

from __future__ import annotations

import math
import pathlib
import sys
from typing import Dict

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx", reason="the model zoo is generated with the onnx package (python3-onnx)")
from onnx import numpy_helper  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import make_model_zoo as zoo  # noqa: E402

TOLERANCE = {"fp32": 1e-4, "fp16": 3e-2}
BATCHES = (1, 3)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Dict[str, pathlib.Path]:
    return zoo.generate(tmp_path_factory.mktemp("zoo"), tiny_only=True)


@pytest.fixture(scope="module")
def ort_engine(models) -> None:
    try:
        xrt.InferenceSession(models["mlp_tiny"], engine="onnxruntime")
    except xrt.UnsupportedOperationError as error:
        pytest.skip(f"this build has no ONNX Runtime engine: {error}")


def weights(path: pathlib.Path) -> Dict[str, np.ndarray]:
    """The model's initializers as float64 (integer ones unchanged), read with onnx.numpy_helper."""
    model = onnx.load(str(path))
    out = {}
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        out[init.name] = value.astype(np.float64) if value.dtype.kind == "f" else value
    return out


# ----------------------------------------------------------------------------------------------------------------
# NumPy float64 references, written from the architecture, not from the graph
# ----------------------------------------------------------------------------------------------------------------


def mlp_reference(w: Dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = x.astype(np.float64)
    for i in range(zoo.MLP[True].layers):
        h = np.maximum(h @ w[f"fc{i}.weight"].T + w[f"fc{i}.bias"], 0.0)
    return h


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def bert_reference(w: Dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    cfg = zoo.BERT[True]
    b, s = ids.shape
    d = cfg.hidden // cfg.heads

    def ln(x, name):
        return _layer_norm(x, w[f"{name}.weight"], w[f"{name}.bias"], cfg.epsilon)

    def linear(x, name):
        return x @ w[f"{name}.weight"] + w[f"{name}.bias"]

    h = ln(w["embeddings.word_embeddings"][ids] + w["embeddings.position_embeddings"][:s], "embeddings.layer_norm")
    for i in range(cfg.layers):
        p = f"layer{i}.attention"
        q, k, v = (linear(h, f"{p}.{n}").reshape(b, s, cfg.heads, d).transpose(0, 2, 1, 3) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, cfg.hidden)
        h = ln(linear(ctx, f"{p}.output") + h, f"{p}.layer_norm")
        f = linear(h, f"layer{i}.ffn.intermediate")
        f = 0.5 * f * (1.0 + _erf(f / math.sqrt(2.0)))
        h = ln(linear(f, f"layer{i}.ffn.output") + h, f"layer{i}.ffn.layer_norm")
    return h


def _conv2d(x: np.ndarray, weight: np.ndarray, stride: int) -> np.ndarray:
    """Cross-correlation with 'same'-style padding k // 2 (what the zoo's Conv nodes use), via im2col."""
    n, c, hgt, wid = x.shape
    o, _, k, _ = weight.shape
    pad = k // 2
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (hgt + 2 * pad - k) // stride + 1
    ow = (wid + 2 * pad - k) // stride + 1
    cols = np.empty((n, c, k, k, oh, ow))
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
    return np.einsum("nckluv,ockl->nouv", cols, weight, optimize=True)


def _max_pool_3x3_s2(x: np.ndarray) -> np.ndarray:
    n, c, hgt, wid = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    oh, ow = (hgt - 1) // 2 + 1, (wid - 1) // 2 + 1
    return np.max([xp[:, :, i:i + 2 * oh:2, j:j + 2 * ow:2] for i in range(3) for j in range(3)], axis=0)


def resnet_reference(w: Dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    cfg = zoo.RESNET[True]

    def conv_bn(h, name, stride, relu):
        h = _conv2d(h, w[f"{name}.weight"], stride)
        bn = lambda key: w[f"{name}.bn.{key}"][None, :, None, None]  # noqa: E731
        h = (h - bn("running_mean")) / np.sqrt(bn("running_var") + cfg.epsilon) * bn("weight") + bn("bias")
        return np.maximum(h, 0.0) if relu else h

    h = _max_pool_3x3_s2(conv_bn(x.astype(np.float64), "conv1", 2, True))
    for stage, blocks in enumerate(cfg.blocks):
        for block in range(blocks):
            p = f"layer{stage + 1}.{block}"
            stride = 2 if block == 0 and stage > 0 else 1
            y = conv_bn(h, f"{p}.conv1", 1, True)
            y = conv_bn(y, f"{p}.conv2", stride, True)
            y = conv_bn(y, f"{p}.conv3", 1, False)
            shortcut = conv_bn(h, f"{p}.downsample", stride, False) if block == 0 else h
            h = np.maximum(y + shortcut, 0.0)
    return h.mean(axis=(2, 3)) @ w["fc.weight"].T + w["fc.bias"]


REFERENCES = {"mlp": mlp_reference, "bert": bert_reference, "resnet50": resnet_reference}


def make_input(name: str, batch: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(batch)
    if name == "bert":
        cfg = zoo.BERT[True]
        return rng.integers(0, cfg.vocab, (batch, cfg.seq), dtype=np.int64)
    shape = (batch, zoo.MLP[True].width) if name == "mlp" else (batch, 3, zoo.RESNET[True].image, zoo.RESNET[True].image)
    return rng.standard_normal(shape).astype(np.float16 if dtype == "fp16" else np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------


def test_models_are_opset17_ir8_with_a_symbolic_batch(models):
    assert sorted(models) == sorted(f"{n}_tiny{s}" for n in zoo.MODEL_NAMES for s in ("", "_fp16"))
    for stem, path in models.items():
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        assert model.ir_version == 8, stem
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)], stem
        for value in list(model.graph.input) + list(model.graph.output):
            assert value.type.tensor_type.shape.dim[0].dim_param == "batch", (stem, value.name)
        float_type = onnx.TensorProto.FLOAT16 if stem.endswith("fp16") else onnx.TensorProto.FLOAT
        assert model.graph.output[0].type.tensor_type.elem_type == float_type, stem
        assert all(i.data_type in (float_type, onnx.TensorProto.INT64) for i in model.graph.initializer), stem


def test_models_contain_the_ops_the_engines_fuse(models):
    ops = {stem: [n.op_type for n in onnx.load(str(p)).graph.node] for stem, p in models.items()}
    assert ops["mlp_tiny"] == ["Gemm", "Relu"] * 4
    assert {"Gather", "LayerNormalization", "Softmax", "Erf", "Reshape", "Transpose", "Div"} <= set(ops["bert_tiny"])
    assert ops["bert_tiny"].count("LayerNormalization") == 1 + 2 * zoo.BERT[True].layers
    resnet = ops["resnet50_tiny"]
    convs = [i for i, op in enumerate(resnet) if op == "Conv"]
    assert len(convs) == 1 + 4 + 3 * sum(zoo.RESNET[True].blocks)  # stem, 4 downsamples, 3 per bottleneck
    assert all(resnet[i + 1] == "BatchNormalization" for i in convs)
    assert resnet[-4:] == ["Relu", "GlobalAveragePool", "Flatten", "Gemm"] and "MaxPool" in resnet


def test_generation_is_deterministic_and_the_cli_writes_the_chosen_dtype(tmp_path):
    assert zoo.build_bert(tiny=True).SerializeToString() == zoo.build_bert(tiny=True).SerializeToString()
    assert zoo.build_mlp(tiny=True, seed=1).SerializeToString() != zoo.build_mlp(tiny=True).SerializeToString()
    assert zoo.main(["--out", str(tmp_path), "--tiny-only", "--dtype", "fp16", "--model", "mlp"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp_tiny_fp16.onnx"]


@pytest.mark.usefixtures("ort_engine")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_tiny_model_matches_the_numpy_reference(models, name, dtype):
    path = models[zoo.file_name(name, True, dtype).removesuffix(".onnx")]
    session = xrt.InferenceSession(path, engine="onnxruntime")
    (info,) = session.get_inputs()
    assert info.shape[0] == "batch" and all(isinstance(d, int) for d in info.shape[1:]), info
    (output,) = session.get_outputs()
    w = weights(path)
    for batch in BATCHES:
        x = make_input(name, batch, dtype)
        result = session.run({info.name: x})[output.name]
        expected = REFERENCES[name](w, x)
        assert result.shape == expected.shape
        assert result.dtype == (np.float16 if dtype == "fp16" else np.float32)
        assert np.isfinite(result).all()
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(result.astype(np.float64), expected, rtol=tol, atol=tol, err_msg=f"{name} {dtype} batch {batch}")
