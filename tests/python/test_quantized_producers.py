"""Quantized models from producers we did not write, on the native engine's CUDA path (issue 41, precision).

Small real architectures, exported by the real-model suite's own code (scripts/model_suite.py: `_vision`,
`build_bert`, `realistic_weights`, `_export_one` with PyTorch's dynamo exporter, opset 18): torchvision's ResNet-18 at
64x64, the suite's tiny transformers BERT, and an MLP on [batch, 5, 48] inputs (its Linear layers export as MatMul +
Add with K = 48, 96, 40: int4 blocks of 32 that end short). Each is quantized by

  ort_static_qdq_uint8 / _int8  onnxruntime.quantization.quantize_static, QDQ format, per-channel int8 weights,
                                activations QUInt8 / QInt8, MinMax over a CalibrationDataReader of random feeds
  ort_dynamic                   onnxruntime.quantization.quantize_dynamic of the MatMuls: DynamicQuantizeLinear ->
                                MatMulInteger -> Cast -> Mul (ONNX Runtime's CPU has no ConvInteger with int8
                                weights, so the CNN is left to the static producers)
  ort_matmul_nbits_asym / _sym  onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer: com.microsoft
                                MatMulNBits, 4 bits, blocks of 32, with and without zero points (GPT-2's Conv1D
                                layers export as Gemm, which it does not take: the MLP and BERT stand in)
  pt2e_xnnpack                  PyTorch 2 export quantization (prepare_pt2e / convert_pt2e with XNNPACKQuantizer,
                                per-channel symmetric), then torch.onnx.export(dynamo=True); PyTorch 2.11 moved this
                                API to torchao: skipped, saying so, where neither has it
  xrt_int8 / _fp8 / _int4_weights  xrt.quantize

and each quantized file then runs on the native engine on cuda:0 with ExecutionPolicy(fallback="error") and on ONNX
Runtime's CPU InferenceSession (the reference), on the same feeds.

Every node ran on the GPU: fallback="error" already refuses, at session creation, a model with any node that no CUDA
kernel can run (Note [Mixed execution]); explain() then shows it from the other side: no step that runs on the host
(kernel "onnx_ref" or a cpu-backend kernel), no copy from the device to the host and no "runs on the CPU" sync in
the transfers. ("(dispatched at run time)" steps are labelled backend cpu in explain() but are dispatched for the
session's device when they run: on cuda:0 only CUDA kernels are candidates.) For producers of int8 Q/DQ, the form
the quantized_fusion pass fuses into qlinear / qconv2d, at least one step must run at precision int8, so that a model
silently dequantized to float does not pass. (MatMulInteger after DynamicQuantizeLinear has zero points known only
at run time, which qlinear's attributes cannot hold: how it runs on CUDA is left open; only where and what it
computes is checked.)

Note [The ONNX Runtime reference runs the Q/DQ graph as written]: the reference session sets
session.disable_quant_qdq=1 and disables the rules ReluQuantRewrite and ClipQuantRewrite (as the onnxruntime
engine does for float8 models, Note [Float8 QDQ through ORT's CPU]). ONNX Runtime's fused int8 kernels compute the
same values within a step, but its DequantizeLinear(int4) -> MatMul fusion makes MatMulNBits at accuracy level 4,
which quantizes the activations to int8: that would measure ONNX Runtime's approximation, not ours. Its other graph
optimizations run.

Tolerances (PRODUCERS, per producer): the quantized model is the same file on both sides, so they differ only where
a value lands on the other side of a rounding boundary before a QuantizeLinear (one step of that activation: 1/255
of its range in 8 bits, 1/8 of its magnitude's binade in float8) and by float rounding elsewhere; a step at one layer
moves the output by a few of its own steps at most. Cosine similarity >= 0.99 (0.999 for the dynamic and
weight-only forms, which requantize nothing or only a MatMul's input) and max |native - ORT| <= a fraction of the
reference output's range (max - min): 5% for int8 Q/DQ (about 12 output steps), 10% for float8, 2% for dynamic and
weight-only. A wrong zero point, scale, sign or layout moves the output by its whole range
(test_agreement_catches_a_wrong_answer). Both the first run and the second (a CUDA graph replay) are compared.

Needs a CUDA device, onnx, onnxruntime with onnxruntime.quantization, torch with its dynamo ONNX exporter
(onnxscript), torchvision (ResNet) and transformers (BERT); skipped, naming what is missing, otherwise. The checks'
own tests at the end run everywhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]

if "model_suite" in sys.modules:  # test_model_suite.py loaded it first
    suite = sys.modules["model_suite"]
else:
    _spec = importlib.util.spec_from_file_location("model_suite", ROOT / "scripts" / "model_suite.py")
    suite = importlib.util.module_from_spec(_spec)
    sys.modules["model_suite"] = suite  # dataclasses look their module up
    _spec.loader.exec_module(suite)

IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; ONNX Runtime 1.29 (the onnxruntime engine) reads at most 13
RUNTIME_DISPATCH = "(dispatched at run time)"
CALIBRATION_SEEDS = (10, 11, 12, 13)


# ---------------------------------------------------------------------------------------------------------------
# The checks (plain functions; their own tests at the end of the file run without a GPU)
# ---------------------------------------------------------------------------------------------------------------


def agreement(got: np.ndarray, ref: np.ndarray) -> Tuple[float, float, float]:
    """``(cosine, max abs error, range of ref)``; a shape mismatch is cosine -1 and an infinite error."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return -1.0, float("inf"), 0.0
    span = float(ref.max() - ref.min()) if ref.size else 0.0
    if not np.all(np.isfinite(got)):
        return -1.0, float("inf"), span
    a, r = got.ravel(), ref.ravel()
    na, nr = np.linalg.norm(a), np.linalg.norm(r)
    cosine = 1.0 if na == 0 and nr == 0 else float(np.dot(a, r) / max(na * nr, 1e-300))
    return cosine, float(np.max(np.abs(a - r))) if a.size else 0.0, span


def within(got: np.ndarray, ref: np.ndarray, cosine_min: float, relative: float) -> Tuple[bool, str]:
    cosine, max_abs, span = agreement(got, ref)
    bound = relative * span
    ok = cosine >= cosine_min and max_abs <= bound
    return ok, f"cosine {cosine:.6f} (>= {cosine_min}), max abs {max_abs:.4g} (<= {bound:.4g} = {relative} x range)"


def host_work(session) -> List[str]:
    """What of a CUDA session's last plan ran on the host, or moved data there: [] when everything ran on the GPU."""
    e = session.explain()
    found = [] if str(e.device).startswith("cuda") else [f"session device {e.device}"]
    for n in e.nodes:
        if n["kernel"] == "onnx_ref" or (n["backend"] == "cpu" and n["kernel"] != RUNTIME_DISPATCH):
            found.append(f"node {n['node']} ({n['op_type']}): kernel {n['kernel']} on backend {n['backend']}")
    for t in e.transfers:
        if t["direction"] == "device->host" or "runs on the CPU" in t["reason"]:
            found.append(f"transfer {t['kind']} {t['value']}: {t['reason']}")
    return found


def int8_steps(session) -> List[str]:
    return [n["node"] for n in session.explain().nodes if n["precision"] == "int8"]


def to_host(value) -> np.ndarray:
    return np.asarray(value.cpu().numpy() if hasattr(value, "cpu") else value)


# ---------------------------------------------------------------------------------------------------------------
# Float models, exported by the suite's code
# ---------------------------------------------------------------------------------------------------------------


def _dependencies():
    """The modules every case needs (skips naming the first one missing)."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxruntime.quantization")
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    if not hasattr(torch, "export"):
        pytest.skip(f"torch {torch.__version__} has no torch.export")
    return ort, torch


def _mlp():
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = torch.nn.Linear(48, 96), torch.nn.Linear(96, 40), torch.nn.Linear(40, 24)

        def forward(self, x):
            return self.fc3(torch.relu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))))

    torch.manual_seed(1)
    module = MLP().eval()
    return suite.Built(module, {"x": torch.randn(suite.EXPORT_BATCH, 5, 48)},
                       {"x": torch.randn(suite.TEST_BATCH, 5, 48)}, {"x": {0: "batch"}}, ["output"])


def _build(name: str):
    import torch

    torch.manual_seed(0)
    if name == "resnet18":
        torchvision = pytest.importorskip("torchvision")
        built = suite._vision(torchvision.models.resnet18(num_classes=10), 64)
    elif name == "bert":
        pytest.importorskip("transformers")
        built = suite.build_bert(True)
    else:
        built = _mlp()
    suite.realistic_weights(built.module, built.inputs)
    return built


def _random_feeds(built, seed: int) -> Dict[str, np.ndarray]:
    """Feeds at the test shapes (batch 3, sequence 11) from seed `seed`: floats standard normal, token ids below the
    largest id of the example, attention masks with the first row's last two positions padded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    feeds = {}
    for name, test in built.test_inputs.items():
        if test.is_floating_point():
            feeds[name] = torch.randn(test.shape, generator=g).numpy()
        elif "mask" in name:
            mask = torch.ones(test.shape, dtype=test.dtype)
            mask[0, -2:] = 0
            feeds[name] = mask.numpy()
        else:
            high = int(built.inputs[name].max()) + 1
            feeds[name] = torch.randint(0, high, tuple(test.shape), generator=g, dtype=test.dtype).numpy()
    return feeds


def save_model(model, path: pathlib.Path) -> pathlib.Path:
    """Saves `model` (a ModelProto) with an IR version both ONNX Runtimes read."""
    import onnx

    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.save(model, str(path))
    return path


@dataclass
class FloatModel:
    name: str
    built: object
    path: pathlib.Path  # the float32 dynamo export
    feeds: Dict[str, np.ndarray]  # the suite's test inputs
    calibration: List[Dict[str, np.ndarray]]


class Exports:
    """Float models built and exported once per module, on first use."""

    def __init__(self, folder: pathlib.Path):
        self.folder = folder
        self._models: Dict[str, FloatModel] = {}

    def get(self, name: str) -> FloatModel:
        if name not in self._models:
            built = _build(name)
            path = self.folder / f"{name}.dynamo.float32.onnx"
            suite._export_one(built, "dynamo", "float32", path, "cpu")
            feeds = {k: v.numpy() for k, v in built.test_inputs.items()}
            self._models[name] = FloatModel(name, built, path, feeds,
                                            [_random_feeds(built, s) for s in CALIBRATION_SEEDS])
        return self._models[name]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return Exports(tmp_path_factory.mktemp("quantized_producers"))


# ---------------------------------------------------------------------------------------------------------------
# Producers: each writes the quantized form of a float model to `out`
# ---------------------------------------------------------------------------------------------------------------


def _reader(feeds):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter(feeds)

        def get_next(self):
            return next(self._feeds, None)

    return Reader()


def _resave(path: pathlib.Path) -> None:
    import onnx

    save_model(onnx.load(str(path)), path)


def ort_static(activation: str) -> Callable[[FloatModel, pathlib.Path], None]:
    def make(fm: FloatModel, out: pathlib.Path) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        quantize_static(str(fm.path), str(out), _reader(fm.calibration), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=getattr(QuantType, activation),
                        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
        _resave(out)
    return make


def ort_dynamic(fm: FloatModel, out: pathlib.Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fm.path), str(out), op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8)
    _resave(out)


def _matmul_nbits_quantizer():
    try:  # ONNX Runtime >= 1.20
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError:
        from onnxruntime.quantization.matmul_4bits_quantizer import MatMul4BitsQuantizer as MatMulNBitsQuantizer
    return MatMulNBitsQuantizer


def ort_matmul_nbits(symmetric: bool) -> Callable[[FloatModel, pathlib.Path], None]:
    def make(fm: FloatModel, out: pathlib.Path) -> None:
        import onnx

        quantizer = _matmul_nbits_quantizer()(onnx.load(str(fm.path)), block_size=32, is_symmetric=symmetric)
        quantizer.process()
        save_model(quantizer.model.model, out)
    return make


# Where PT2E quantization lives: torchao (PyTorch 2.11 removed it from torch.ao), then torch.ao (older torch).
PT2E_APIS = (("torchao.quantization.pt2e.quantize_pt2e", "torchao.testing.pt2e._xnnpack_quantizer"),
             ("torchao.quantization.pt2e.quantize_pt2e", "executorch.backends.xnnpack.quantizer.xnnpack_quantizer"),
             ("torch.ao.quantization.quantize_pt2e", "torch.ao.quantization.quantizer.xnnpack_quantizer"))


def pt2e_api():
    """``(prepare_pt2e, convert_pt2e, XNNPACKQuantizer, get_symmetric_quantization_config)``, or a skip listing
    where each was looked for."""
    tried = []
    for api_name, quantizer_name in PT2E_APIS:
        try:
            api = importlib.import_module(api_name)
            quantizer = importlib.import_module(quantizer_name)
            return (api.prepare_pt2e, api.convert_pt2e, quantizer.XNNPACKQuantizer,
                    quantizer.get_symmetric_quantization_config)
        except Exception as error:  # noqa: BLE001  (ImportError, or a torchao built for another torch)
            tried.append(f"{api_name} + {quantizer_name}: {type(error).__name__}: {str(error)[:120]}")
    import torch

    pytest.skip(f"no PT2E quantization API with torch {torch.__version__} (PyTorch 2.11 moved it to torchao): "
                + "; ".join(tried))


def pt2e_xnnpack(fm: FloatModel, out: pathlib.Path) -> None:
    import torch

    prepare_pt2e, convert_pt2e, XNNPACKQuantizer, symmetric_config = pt2e_api()
    args = tuple(torch.from_numpy(v) for v in fm.feeds.values())
    graph = torch.export.export(fm.built.module, args).module()
    prepared = prepare_pt2e(graph, XNNPACKQuantizer().set_global(symmetric_config(is_per_channel=True)))
    with torch.no_grad():
        for feed in fm.calibration:
            prepared(*[torch.from_numpy(v) for v in feed.values()])
    converted = convert_pt2e(prepared)
    # Static shapes (the test's): the quantized graph is exported as it was calibrated.
    torch.onnx.export(converted, args, str(out), dynamo=True, opset_version=18, input_names=list(fm.feeds),
                      output_names=fm.built.outputs, external_data=False)
    _resave(out)


def xrt_quantize(precision: str) -> Callable[[FloatModel, pathlib.Path], None]:
    def make(fm: FloatModel, out: pathlib.Path) -> None:
        calibration = None if precision == "int4-weights" else fm.calibration
        save_model(xrt.quantize(str(fm.path), calibration, precision=precision).model, out)
    return make


@dataclass
class Producer:
    make: Callable[[FloatModel, pathlib.Path], None]
    marker: str  # an op type the quantized file must have: the producer did quantize
    int8: bool  # the quantized_fusion pass fuses its form: some step must run at precision int8
    cosine: float  # native vs ONNX Runtime: cosine similarity at least this
    relative: float  # and max abs error at most this times the reference output's range


PRODUCERS: Dict[str, Producer] = {
    "ort_static_qdq_uint8": Producer(ort_static("QUInt8"), "DequantizeLinear", True, 0.99, 0.05),
    "ort_static_qdq_int8": Producer(ort_static("QInt8"), "DequantizeLinear", True, 0.99, 0.05),
    "ort_dynamic": Producer(ort_dynamic, "MatMulInteger", False, 0.999, 0.02),
    "ort_matmul_nbits_asym": Producer(ort_matmul_nbits(False), "MatMulNBits", False, 0.999, 0.02),
    "ort_matmul_nbits_sym": Producer(ort_matmul_nbits(True), "MatMulNBits", False, 0.999, 0.02),
    "pt2e_xnnpack": Producer(pt2e_xnnpack, "DequantizeLinear", True, 0.99, 0.05),
    "xrt_int8": Producer(xrt_quantize("int8"), "DequantizeLinear", True, 0.99, 0.05),
    "xrt_fp8": Producer(xrt_quantize("fp8"), "DequantizeLinear", False, 0.99, 0.10),
    "xrt_int4_weights": Producer(xrt_quantize("int4-weights"), "DequantizeLinear", False, 0.999, 0.02),
}

CASES = [("ort_static_qdq_uint8", m) for m in ("resnet18", "bert", "mlp")] + \
        [("ort_static_qdq_int8", m) for m in ("resnet18", "bert", "mlp")] + \
        [("ort_dynamic", m) for m in ("bert", "mlp")] + \
        [("ort_matmul_nbits_asym", m) for m in ("bert", "mlp")] + \
        [("ort_matmul_nbits_sym", m) for m in ("bert", "mlp")] + \
        [("pt2e_xnnpack", m) for m in ("resnet18", "mlp")] + \
        [(p, m) for p in ("xrt_int8", "xrt_fp8") for m in ("resnet18", "bert", "mlp")] + \
        [("xrt_int4_weights", m) for m in ("bert", "mlp")]


# ---------------------------------------------------------------------------------------------------------------
# Running them
# ---------------------------------------------------------------------------------------------------------------


def run_native_cuda(path: pathlib.Path, feeds: Dict[str, np.ndarray]):
    """The session and its outputs of two runs (the second replays the CUDA graph the first captured)."""
    session = xrt.InferenceSession(str(path), device="cuda:0", engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    first = {k: to_host(v) for k, v in session.run(feeds).items()}
    second = {k: to_host(v) for k, v in session.run(feeds).items()}
    return session, first, second


def run_ort_cpu(ort, path: pathlib.Path, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """ONNX Runtime's CPU on `path`, the Q/DQ graph as written (Note [The ONNX Runtime reference runs the Q/DQ graph
    as written] at the top of this file)."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    options.add_session_config_entry("optimization.disable_specified_optimizers", "ReluQuantRewrite;ClipQuantRewrite")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


@requires_gpu
@pytest.mark.parametrize("producer,model", CASES, ids=[f"{p}-{m}" for p, m in CASES])
def test_quantized_model_runs_on_cuda_like_onnxruntime(producer, model, exports):
    import onnx

    ort, _ = _dependencies()
    spec = PRODUCERS[producer]
    fm = exports.get(model)
    path = exports.folder / f"{model}.{producer}.onnx"
    spec.make(fm, path)
    op_types = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert spec.marker in op_types, f"{producer} wrote no {spec.marker}: {sorted(op_types)}"

    session, first, second = run_native_cuda(path, fm.feeds)
    assert host_work(session) == [], "\n".join(host_work(session))
    if spec.int8:
        assert int8_steps(session), f"no step ran at precision int8 on CUDA (quantized_fusion fused nothing): " \
                                    f"{sorted({n['op'] or n['op_type'] for n in session.explain().nodes})}"

    reference = run_ort_cpu(ort, path, fm.feeds)
    assert set(first) == set(reference)
    for name, ref in reference.items():
        for run, outputs in (("first run", first), ("second run (graph replay)", second)):
            ok, detail = within(outputs[name], ref, spec.cosine, spec.relative)
            assert ok, f"{name}, {run}: native cuda:0 vs ONNX Runtime CPU: {detail}"


# ---------------------------------------------------------------------------------------------------------------
# The checks' own tests (no GPU, ONNX Runtime or torch needed)
# ---------------------------------------------------------------------------------------------------------------


def test_agreement_catches_a_wrong_answer():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, 10)).astype(np.float32)
    step = (ref.max() - ref.min()) / 255
    near = ref + step * rng.integers(-3, 4, ref.shape)  # a few quantization steps off
    assert within(near, ref, 0.99, 0.05)[0]
    assert not within(ref + 0.2 * (ref.max() - ref.min()), ref, 0.99, 0.05)[0]  # a wrong zero point: an offset
    assert not within(-ref, ref, 0.99, 0.05)[0]  # a wrong sign
    assert not within(ref.T.reshape(ref.shape), ref, 0.99, 0.05)[0]  # a wrong layout
    assert not within(ref[:, :-1], ref, 0.99, 0.05)[0]
    assert not within(np.full_like(ref, np.nan), ref, 0.99, 0.05)[0]
    assert within(ref.astype(np.float64), ref, 0.999999, 0.0)[0]


def test_host_work_names_what_ran_on_the_cpu():
    session = xrt.InferenceSession(str(ROOT / "examples" / "models" / "tiny_classifier.onnx"), device="cpu",
                                   engine="native")
    session.run({i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
                 for i in session.get_inputs()})
    found = host_work(session)
    assert found and found[0] == "session device cpu"
    assert any("backend cpu" in f for f in found), found


def test_cases_cover_every_producer():
    assert {p for p, _ in CASES} == set(PRODUCERS)
    assert len(set(CASES)) == len(CASES)
