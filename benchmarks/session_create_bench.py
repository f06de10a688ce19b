"""Build cost of the real-model suite (issue 19, "Build cost"): session creation and the first run, each in a fresh
process, for xpuruntime's native engine (first process with an empty build cache, then a second process with the
cache the first one filled: generated kernels and kernel decisions, XPURT_CODEGEN_CACHE) and ONNX Runtime's CUDA EP (benchmarks/ort_direct_bench), on the suite's full-size
float16 dynamo exports (exported when missing, as benchmarks/model_suite_bench.py does).

Each native process initialises CUDA before its clock starts (ONNX Runtime's figure likewise starts after its
environment and execution provider are set up), then times InferenceSession(...) ("create") and the first run with
inputs on the device ("first run"). At batch > 1 creation builds the probe plan (Note [Support check at session
creation]) and the first run builds the plan of its batch. The native columns add where creation went, from
explain().build (Note [Build phases]): the phases summed over the plans built, the largest first.

    python3 benchmarks/session_create_bench.py --models resnet,bert --batches 1,16 [--dir models/suite/full] \\
        [--seq 128] [--json out.json] [--markdown out.md]

Needs XPURT_ORT_CUDA_PROVIDER for the ONNX Runtime column (scripts/stage_ort_cuda.sh, scripts/ort_cuda_unstage.sh).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def child(model: str, batch: int, seq: int, device: str) -> dict:
    """One native session in this process: create it, run it once, report the times and the build phases."""
    import numpy as np
    import xpuruntime as xrt
    xrt.from_numpy(np.zeros(1, np.float32)).to(device)  # CUDA initialised before the clock starts
    xrt.synchronize(device)
    t0 = time.perf_counter()
    session = xrt.InferenceSession(model, device=device, engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error"))
    create_ms = (time.perf_counter() - t0) * 1e3
    rng = np.random.default_rng(batch)
    feeds = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) else (batch if "batch" in d else seq) for d in info.shape]
        if info.dtype.startswith("float"):
            array = rng.standard_normal(shape).astype(np.float16 if info.dtype == "float16" else np.float32)
        elif "mask" in info.name:
            array = np.ones(shape, dtype=np.dtype(info.dtype))
        else:
            array = rng.integers(0, 100, shape).astype(np.dtype(info.dtype))
        feeds[info.name] = xrt.from_numpy(array).to(device)
    xrt.synchronize(device)
    t0 = time.perf_counter()
    session.run(feeds)
    xrt.synchronize(device)
    first_run_ms = (time.perf_counter() - t0) * 1e3
    build = session.explain().build
    phases: dict = collections.defaultdict(float)
    for b in build:
        phase = re.sub(r"^plan [^:]*: ", "", b["phase"])
        if phase != "total":
            phases[phase] += b["ms"]
    return {"create_ms": create_ms, "first_run_ms": first_run_ms, "phases": dict(phases), "build": build}


def run_child(model: pathlib.Path, batch: int, seq: int, device: str, cache: str) -> dict:
    env = dict(os.environ, XPURT_CODEGEN_CACHE=cache)
    done = subprocess.run([sys.executable, __file__, "--child", str(model), "--batches", str(batch), "--seq", str(seq),
                           "--device", device], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        from session_bench import failure
        return {"error": failure(done)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ort(model: pathlib.Path, batch: int, seq: int, device: str) -> dict:
    from model_suite_bench import Skip, find_bench, run_ort as ort
    if not device.startswith("cuda"):
        return {"error": "ONNX Runtime's column is measured on CUDA only"}
    try:
        return ort(find_bench(None), model, batch, seq, False, 1, 0)
    except Skip as e:
        return {"error": str(e)}


def top_phases(phases: dict, n: int = 4) -> str:
    """The n largest phases, the graph passes summed into one ("passes")."""
    merged: dict = collections.defaultdict(float)
    for phase, ms in phases.items():
        merged["passes" if phase.startswith("pass ") else phase] += ms
    ranked = sorted(merged.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{phase} {ms:.0f}" for phase, ms in ranked)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet,convnext,efficientnet,mobilenet_v3,vit,bert,gpt2,whisper_encoder,"
                        "llama")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dir", default=str(ROOT / "models" / "suite" / "full"))
    parser.add_argument("--device", default="cuda:0", help="the native sessions' device (cpu: a check of this script)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(child(args.child, batches[0], args.seq, args.device)))
        return 0

    from model_suite_bench import full_model
    directory = pathlib.Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        path = directory / f"{name}.dynamo.float16.onnx"
        if not path.exists():
            path = full_model(name, directory)[0]
        for batch in batches:
            with tempfile.TemporaryDirectory(prefix="xpurt-codegen-") as cache:
                cold = run_child(path, batch, args.seq, args.device, cache)
                warm = run_child(path, batch, args.seq, args.device, cache)
            ort = run_ort(path, batch, args.seq, args.device)
            rows.append({"model": name, "batch": batch, "native_cold": cold, "native_warm": warm, "ort": ort})
            print(json.dumps(rows[-1]), flush=True)

    def ms(r: dict, key: str) -> str:
        return "-" if "error" in r else f"{r[key]:.0f}"

    lines = [f"Session creation and first run (ms), each in a fresh process; {datetime.date.today()}", "",
             "| model | batch | create: native cold / warm / ORT | first run: native cold / warm / ORT | "
             "warm create / ORT | warm create + first run / ORT | where the warm process's plan builds went (ms) |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    ratios = []
    for r in rows:
        cold, warm, ort = r["native_cold"], r["native_warm"], r["ort"]
        ratio = both = "-"
        if "error" not in warm and "error" not in ort:
            ratio = f"{warm['create_ms'] / ort['create_ms']:.2f}x"
            both = f"{(warm['create_ms'] + warm['first_run_ms']) / (ort['create_ms'] + ort['first_run_ms']):.2f}x"
            ratios.append(warm["create_ms"] / ort["create_ms"])
        lines.append(f"| {r['model']} | {r['batch']} | {ms(cold, 'create_ms')} / {ms(warm, 'create_ms')} / "
                     f"{ms(ort, 'create_ms')} | {ms(cold, 'first_run_ms')} / {ms(warm, 'first_run_ms')} / "
                     f"{ms(ort, 'first_run_ms')} | {ratio} | {both} | "
                     f"{top_phases(warm.get('phases', {})) if 'error' not in warm else warm['error']} |")
    if ratios:
        lines += ["", f"Warm native creation / ONNX Runtime's: geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x, "
                  f"largest {max(ratios):.2f}x (the issue's target: at most 1.5x)."]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
