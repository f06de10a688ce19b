"""Quantized ResNet-50 and BERT-base on the GPU: the native engine in float16, int8 and fp8, against ONNX Runtime's
CUDA EP on the same int8 files (issue 41; docs/benchmarks.md, docs/quantization.md).

For each model (the real-model suite's full-size configurations, scripts/model_suite.py; the dynamo exports in
float32 and float16 are made when missing, as benchmarks/model_suite_bench.py makes them) and each batch size
(sequence --seq for BERT), inputs and outputs on the device:

  fp32            the float32 export, native engine (the accuracy reference; timed too)
  fp16            the float16 export, native engine: the suite's own float16 run (model_suite_bench's "native")
  int8            xrt.quantize(float32 export, precision="int8") calibrated on random feeds, native engine
  int8_fp16       the int8 file in a float16 plan (ExecutionPolicy precision="fp16"): the float ops between the
                  quantized ones in float16
  fp8             xrt.quantize(..., precision="fp8"), native engine
  fp8_fp16        the fp8 file in a float16 plan
  fp8fast_fp16    the same with ExecutionPolicy(fp8_fast_accumulation=True) (docs/quantization.md, "Float8 GEMMs")
  ort_int8        ONNX Runtime's CUDA EP on the int8 file (benchmarks/ort_direct_bench, IoBinding on the device)
  ort_int8_graphs the same with enable_cuda_graph=1 (a subprocess: a capture that fails is a note, not a crash)

Every native session is ExecutionPolicy(fallback="error") with CUDA graphs on: every node on the GPU. Latencies are
medians over --iterations calls, each followed by a device synchronization inside its timing (session_bench.latency).
The first table has the medians and latency ratios (below 1 = faster): each quantized variant over fp16, and
best int8 / ORT (the faster of int8 and int8_fp16 over the best ORT variant on the same int8 file). The second table has each model's output
agreement with float32 on the same feeds (cosine similarity, max abs error, and max abs error / max |fp32|); the
float inputs are drawn in float16 so that every variant sees the same values.

    python3 benchmarks/quantized_bench.py [--models resnet,bert] [--batches 1,16,64] [--precisions int8,fp8]
        [--iterations 50] [--warmup 10] [--seq 128] [--dir models/suite/full] [--work DIR] [--skip-ort]
        [--ort-direct PATH] [--calibration-feeds 8] [--calibration-batch 4] [--calibration-device cuda:0]
        [--method entropy] [--out results.json] [--markdown results.md]

Needs torch, torchvision and transformers (to export the models when missing; the device image has them) and, for the
ORT variants, ort_direct_bench (built with ONNX Runtime found) and XPURT_ORT_CUDA_PROVIDER (scripts/stage_ort_cuda.sh,
scripts/ort_cuda_unstage.sh).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
from typing import Dict, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import model_suite as suite  # noqa: E402
from model_suite_bench import run_native, run_ort  # noqa: E402
from session_bench import Skip, find_bench  # noqa: E402

IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; ONNX Runtime 1.29 reads at most 13
NATIVE = ["fp32", "fp16", "int8", "int8_fp16", "fp8", "fp8_fp16", "fp8fast_fp16"]
QUANTIZED = NATIVE[2:]


def export(name: str, directory: pathlib.Path, dtype: str) -> pathlib.Path:
    """The full-size dynamo export of suite model `name` in `dtype`, exported when missing."""
    path = directory / f"{name}.dynamo.{dtype}.onnx"
    if not path.exists():
        suite.export(directory, False, [name], ["dynamo"], [dtype])
    if not path.exists():
        raise RuntimeError(f"the dynamo exporter could not write {path.name} (see {directory / 'manifest.json'})")
    return path


def built_model(name: str):
    """The suite's full-size module description of `name` (input names, dynamic axes, example ids), seed 0."""
    import torch

    torch.manual_seed(0)
    return next(a for a in suite.ARCHS if a.name == name).build(False)


def feeds(built, batch: int, seq: int, seed: int) -> Dict[str, "object"]:
    """float32 torch inputs at `batch` (and `seq` for the symbolic sequence): floats standard normal rounded to
    float16 (the fp16 variant gets the same values), token ids below the example's largest, masks all ones."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, example in built.inputs.items():
        shape = list(example.shape)
        for axis, symbol in built.dynamic.get(name, {}).items():
            shape[axis] = batch if symbol == "batch" else seq
        if example.dtype.is_floating_point:
            out[name] = torch.randn(shape, generator=g).half().float()
        elif "mask" in name:
            out[name] = torch.ones(shape, dtype=example.dtype)
        else:
            out[name] = torch.randint(0, int(example.max()) + 1, shape, generator=g, dtype=example.dtype)
    return out


def quantize(name: str, fp32_path: pathlib.Path, built, args) -> Dict[str, pathlib.Path]:
    """xrt.quantize of the float32 export per precision of --precisions, saved under --work (IR 10)."""
    import onnx

    import xpuruntime as xrt

    args.work.mkdir(parents=True, exist_ok=True)
    calibration = [{k: v.numpy() for k, v in feeds(built, args.calibration_batch, args.seq, 1000 + i).items()}
                   for i in range(args.calibration_feeds)]
    files = {}
    for precision in args.precisions:
        result = xrt.quantize(str(fp32_path), calibration, precision=precision, method=args.method,
                              device=args.calibration_device)
        model = result.model
        model.ir_version = min(model.ir_version, IR_VERSION)
        files[precision] = args.work / f"{name}.xrt.{precision}.onnx"
        onnx.save(model, str(files[precision]))
        print(f"{name}: {precision}: {len(result.quantized_nodes)} nodes quantized, {len(result.excluded)} left float "
              f"-> {files[precision]}", flush=True)
    return files


def agreement(got: np.ndarray, ref: np.ndarray) -> Dict[str, float]:
    got, ref = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    if got.shape != ref.shape:
        return {"cosine": -1.0, "max_abs": float("inf"), "rel_max_abs": float("inf")}
    norm = np.linalg.norm(got) * np.linalg.norm(ref)
    max_abs = float(np.max(np.abs(got - ref)))
    return {"cosine": float(np.dot(got, ref) / norm) if norm > 0 else 1.0, "max_abs": max_abs,
            "rel_max_abs": max_abs / max(float(np.max(np.abs(ref))), 1e-12)}


def bench_batch(name: str, batch: int, files: Dict[str, pathlib.Path], built, binary, args):
    """One latency row and one accuracy row per (model, batch)."""
    import torch

    row: Dict = {"model": name, "batch": batch, "notes": []}
    inputs = feeds(built, batch, args.seq, batch)
    outputs: Dict[str, np.ndarray] = {}
    for variant in NATIVE:
        # int8_fp16: the int8 file in a float16 plan (Note [Quantized fusion in float16 plans]): the int8 ops as in
        # int8, the float ops between them in float16, as the fp16 row computes them.
        file_key = {"int8_fp16": "int8", "fp8_fp16": "fp8", "fp8fast_fp16": "fp8"}.get(variant, variant)
        if file_key not in files:
            continue
        device_feeds = {k: (v.half() if variant == "fp16" and v.is_floating_point() else v) for k, v in inputs.items()}
        try:
            row[variant], outputs[variant] = run_native(files[file_key], device_feeds, args.iterations, args.warmup,
                                                        precision="fp16" if variant.endswith("_fp16") else "fp32",
                                                        profile=args.profile, profile_tag=f"{name} b{batch} {variant}",
                                                        policy={"fp8_fast_accumulation": variant == "fp8fast_fp16"})
        except Exception as error:  # noqa: BLE001: reported in the table
            row["notes"].append(f"{variant}: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
        torch.cuda.synchronize()
    for precision in [] if args.skip_ort else args.ort_precisions:
        for graphs in (False, True):
            variant = f"ort_{precision}" + ("_graphs" if graphs else "")
            if precision not in files:
                continue
            try:
                row[variant] = run_ort(binary, files[precision], batch, args.seq, graphs, args.iterations,
                                       args.warmup)
            except Skip as why:
                row["notes"].append(f"{variant}: {why}")
    accuracy = {"model": name, "batch": batch}
    if "fp32" in outputs:
        for variant in ["fp16"] + QUANTIZED:
            if variant in outputs:
                accuracy[variant] = agreement(outputs[variant], outputs["fp32"])
    print(json.dumps(row), flush=True)
    return row, accuracy


def bench_model(name: str, binary, args):
    fp32 = export(name, args.dir, "float32")
    files = {"fp32": fp32, "fp16": export(name, args.dir, "float16")}
    built = built_model(name)
    files.update(quantize(name, fp32, built, args))
    rows, accuracy = [], []
    for batch in args.batches:
        row, acc = bench_batch(name, batch, files, built, binary, args)
        rows.append(row)
        accuracy.append(acc)
    return rows, accuracy


def ms(row: Dict, variant: str) -> Optional[float]:
    return row[variant]["median_ms"] if variant in row else None


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def latency_table(rows: List[Dict], ort_precisions: List[str]) -> str:
    ort = [f"ort_{p}{g}" for p in ort_precisions for g in ("", "_graphs")]
    columns = [c for c in NATIVE + ort if any(c in r for r in rows)]
    head = ["model", "batch"] + columns + [f"{v} / fp16" for v in QUANTIZED] + ["best int8 / best ORT int8"]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for r in rows:
        best_ort = min([m for m in (ms(r, "ort_int8"), ms(r, "ort_int8_graphs")) if m is not None], default=None)
        best_int8 = min([m for m in (ms(r, "int8"), ms(r, "int8_fp16")) if m is not None], default=None)
        cells = [r["model"], str(r["batch"])] + [f"{ms(r, c):.3f}" if c in r else "-" for c in columns]
        cells += [ratio(ms(r, v), ms(r, "fp16")) for v in QUANTIZED] + [ratio(best_int8, best_ort)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def accuracy_table(accuracy: List[Dict]) -> str:
    variants = [v for v in ["fp16"] + QUANTIZED if any(v in a for a in accuracy)]
    head = ["model", "batch"] + [f"{v}: cosine, max abs, / max abs fp32" for v in variants]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " --- |" * len(variants)]
    for a in accuracy:
        cells = [a["model"], str(a["batch"])]
        for v in variants:
            e = a.get(v)
            cells.append(f"{e['cosine']:.5f}, {e['max_abs']:.3g}, {e['rel_max_abs']:.2e}" if e else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet,bert", help="suite architectures (scripts/model_suite.py list)")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--precisions", default="int8,fp8", help="xrt.quantize precisions to time (int8, fp8)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dir", type=pathlib.Path, default=ROOT / "models" / "suite" / "full")
    ap.add_argument("--work", type=pathlib.Path, default=None,
                    help="where the quantized files go (default DIR/quantized)")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--skip-ort", action="store_true", help="leave ONNX Runtime out")
    ap.add_argument("--ort-precisions", default="int8", help="quantized files ORT's CUDA EP runs (int8, fp8)")
    ap.add_argument("--ort-direct", default=None, help="path of ort_direct_bench (default: found under build*/)")
    ap.add_argument("--calibration-feeds", type=int, default=8)
    ap.add_argument("--calibration-batch", type=int, default=4)
    ap.add_argument("--calibration-device", default="cuda:0", help="where xrt.quantize runs the float model")
    ap.add_argument("--method", default=None, help="calibration method (default: xrt.quantize's per precision)")
    ap.add_argument("--profile", type=int, default=0,
                    help="after timing each native variant, print its top kernels over this many runs (CUPTI)")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="write the results as JSON here")
    ap.add_argument("--markdown", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.precisions = [p for p in args.precisions.split(",") if p]
    args.ort_precisions = [p for p in args.ort_precisions.split(",") if p]
    bad = sorted(set(args.precisions + args.ort_precisions) - {"int8", "fp8"})
    if bad:
        ap.error(f"precisions are int8 and fp8, got {', '.join(bad)}")
    args.work = args.work or args.dir / "quantized"
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    import torch

    if not torch.cuda.is_available():
        print("quantized_bench: needs a CUDA device", file=sys.stderr)
        return 2
    binary = None if args.skip_ort else find_bench(args.ort_direct)
    rows, accuracy = [], []
    for name in [m for m in args.models.split(",") if m]:
        r, a = bench_model(name, binary, args)
        rows += r
        accuracy += a
    header = (f"{datetime.date.today()} on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, sequence "
              f"{args.seq}, median ms of {args.iterations} calls; ratios are latency ratios (below 1 = faster)")
    text = (header + "\n\n" + latency_table(rows, args.ort_precisions) + "\n\nOutput agreement with float32 "
            "(same feeds):\n\n" + accuracy_table(accuracy))
    notes = [f"- {r['model']} batch {r['batch']}: {n}" for r in rows for n in r["notes"]]
    if notes:
        text += "\n\n" + "\n".join(notes)
    print(text)
    if args.out:
        args.out.write_text(json.dumps({"header": header, "rows": rows, "accuracy": accuracy}, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
