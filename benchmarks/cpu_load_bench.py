"""The CPU engines under a competing load: xpuruntime's native engine against ONNX Runtime's CPU engine, idle and
with the machine busy, in one run (issue 42, item 4; docs/benchmarks.md "The CPU engine under load").

For each model (the tiny model zoo of scripts/make_model_zoo.py, written to --zoo when missing, and the tiny real
exports of models/suite/tiny in float32), each load (0: idle; N: N busy processes started by this script, each a
Python loop that never sleeps, e.g. 2x and 4x the cores this process may use) and each engine:

  native       xrt.InferenceSession(engine="native", device="cpu") with the default ExecutionPolicy (all cores)
  native_1t    the same with intra_op_threads=1 (--single-thread: the reference the issue compared with)
  onnxruntime  xrt.InferenceSession(engine="onnxruntime", device="cpu"), ONNX Runtime's CPU EP, default policy

it times --iterations calls (after --warmup untimed ones; at most --seconds per case) of session.run on batch-1
random inputs, each call timed on its own, and prints p50, p99 and p99/p50. Calls run back to back, or with
--gap-ms of sleep before each (a server answering requests: the thread sleeps between them, which the OS scheduler
treats differently from a thread that never sleeps). The same session objects serve every
load, so the loads differ only in what else runs on the machine. The load processes are started before a load's
cases and killed after them.

    .venv/bin/python benchmarks/cpu_load_bench.py [--loads 0,2x,4x] [--models zoo:mlp,zoo:resnet50,suite:resnet]
        [--iterations 200] [--warmup 20] [--seconds 20] [--gap-ms 0] [--single-thread] [--allow-spinning 1]
        [--json out.json] [--markdown out.md]

A load is an integer (processes) or "<k>x" (k times the cores in sched_getaffinity). --allow-spinning passes
ExecutionPolicy.allow_spinning to the native engine (docs/native_engine.md, "CPU threads"). The 1-minute load average
printed with the table says what else ran on the machine (it counts the busy processes too).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import Dict, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_model_zoo as zoo  # noqa: E402

import xpuruntime as xrt  # noqa: E402

DEFAULT_MODELS = ("zoo:mlp", "zoo:bert", "zoo:resnet50", "suite:resnet", "suite:bert")
ENGINES = ("native", "native_1t", "onnxruntime")
# A process that keeps one core busy: never sleeps, never allocates.
BUSY = "while True:\n    pass\n"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def parse_load(text: str) -> int:
    text = text.strip()
    if text.endswith("x"):
        return int(round(float(text[:-1]) * usable_cores()))
    return int(text)


def model_path(spec: str, zoo_dir: pathlib.Path) -> pathlib.Path:
    """`zoo:<name>` (the tiny float32 zoo model, written when missing), `zoo-full:<name>` (its full-size one),
    `suite:<name>` (models/suite/tiny's dynamo float32 export) or a path to an .onnx file."""
    kind, _, name = spec.partition(":")
    if kind in ("zoo", "zoo-full"):
        tiny = kind == "zoo"
        path = zoo_dir / zoo.file_name(name, tiny, "fp32")
        if not path.exists():
            zoo.save(zoo.BUILDERS[name](tiny=tiny), path)
        return path
    if kind == "suite":
        return ROOT / "models" / "suite" / "tiny" / f"{name}.dynamo.float32.onnx"
    return pathlib.Path(spec)


def make_feeds(session, seed: int = 0) -> Dict[str, np.ndarray]:
    """Batch-1 random inputs: a symbolic dim is 1 for the first axis and 16 elsewhere (sequence lengths); int64
    inputs are token ids below 100 (or ones for masks)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        shape = [(1 if axis == 0 else 16) if isinstance(d, str) or d is None else int(d)
                 for axis, d in enumerate(info.shape)]
        if info.dtype == "int64":
            is_mask = "mask" in info.name
            feeds[info.name] = (np.ones(shape, np.int64) if is_mask else rng.integers(0, 100, size=shape,
                                                                                       dtype=np.int64))
        else:
            feeds[info.name] = (0.5 * rng.standard_normal(shape)).astype(info.dtype)
    return feeds


def make_session(path: pathlib.Path, engine: str, allow_spinning: Optional[bool]):
    policy = xrt.ExecutionPolicy(intra_op_threads=1) if engine == "native_1t" else xrt.ExecutionPolicy()
    if allow_spinning is not None and engine != "onnxruntime" and hasattr(policy, "allow_spinning"):
        policy.allow_spinning = allow_spinning
    return xrt.InferenceSession(str(path), device="cpu", engine="onnxruntime" if engine == "onnxruntime" else "native",
                                exec_policy=policy)


def time_calls(session, feeds, iterations: int, warmup: int, seconds: float, gap_ms: float) -> Dict:
    """p50/p99/mean/max milliseconds of session.run, each call timed on its own, `gap_ms` of sleep between calls;
    stops after `seconds`."""
    for _ in range(warmup):
        session.run(feeds)
    samples: List[float] = []
    deadline = time.perf_counter() + seconds
    for _ in range(iterations):
        if gap_ms > 0:
            time.sleep(gap_ms / 1e3)
        start = time.perf_counter_ns()
        session.run(feeds)
        samples.append((time.perf_counter_ns() - start) / 1e6)
        if time.perf_counter() > deadline and len(samples) >= 20:
            break
    values = np.asarray(samples)
    p50 = float(np.percentile(values, 50))
    p99 = float(np.percentile(values, 99))
    return {"p50_ms": p50, "p99_ms": p99, "ratio": p99 / p50 if p50 > 0 else float("nan"),
            "mean_ms": float(values.mean()), "max_ms": float(values.max()), "calls": len(samples)}


class Load:
    """`count` busy processes for the duration of a `with` block (killed, each by its own handle, on exit)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.processes: List[subprocess.Popen] = []

    def __enter__(self) -> "Load":
        for _ in range(self.count):
            self.processes.append(subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.DEVNULL))
        if self.count:
            time.sleep(1.0)  # let the scheduler see them busy
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()


def markdown(rows: List[Dict], loads: List[int]) -> str:
    lines = ["| model | engine | " + " | ".join(f"load {n}: p50 / p99 ms (p99/p50)" for n in loads) + " |",
             "|---|---|" + "---|" * len(loads)]
    keys = []
    for row in rows:
        if (row["model"], row["engine"]) not in keys:
            keys.append((row["model"], row["engine"]))
    for model, engine in keys:
        cells = []
        for n in loads:
            match = [r for r in rows if r["model"] == model and r["engine"] == engine and r["load"] == n]
            if not match or "error" in match[0]:
                cells.append(match[0]["error"][:40] if match else "-")
            else:
                r = match[0]
                cells.append(f"{r['p50_ms']:.3f} / {r['p99_ms']:.3f} ({r['ratio']:.1f}x)")
        lines.append(f"| {model} | {engine} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--loads", default="0,2x,4x", help="busy processes per load: N or <k>x (k x cores)")
    parser.add_argument("--engines", default="native,onnxruntime", help=f"a subset of {','.join(ENGINES)}")
    parser.add_argument("--single-thread", action="store_true", help="also native_1t (intra_op_threads=1)")
    parser.add_argument("--allow-spinning", choices=("0", "1"), default=None,
                        help="ExecutionPolicy.allow_spinning of the native sessions (default: the policy's)")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0, help="most seconds of timed calls per case")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="sleep between calls (0: back to back; e.g. 2: a request every ~2 ms, as a server)")
    parser.add_argument("--zoo", default=str(ROOT / "models" / "zoo"))
    parser.add_argument("--json", help="write the rows as JSON")
    parser.add_argument("--markdown", help="write the table as Markdown")
    args = parser.parse_args(argv)

    engines = [e for e in args.engines.split(",") if e]
    if args.single_thread and "native_1t" not in engines:
        engines.insert(1, "native_1t")
    loads = [parse_load(text) for text in args.loads.split(",") if text]
    allow_spinning = None if args.allow_spinning is None else args.allow_spinning == "1"
    zoo_dir = pathlib.Path(args.zoo)
    zoo_dir.mkdir(parents=True, exist_ok=True)

    sessions = {}
    for spec in [m for m in args.models.split(",") if m]:
        path = model_path(spec, zoo_dir)
        for engine in engines:
            try:
                session = make_session(path, engine, allow_spinning)
                sessions[(spec, engine)] = (session, make_feeds(session))
            except xrt.XpuRuntimeError as error:
                sessions[(spec, engine)] = (None, str(error).splitlines()[0])

    rows: List[Dict] = []
    load_averages = {}
    for load in loads:
        with Load(load):
            load_averages[load] = os.getloadavg()[0]
            for (spec, engine), (session, feeds) in sessions.items():
                row = {"model": spec, "engine": engine, "load": load}
                if session is None:
                    row["error"] = feeds
                else:
                    row.update(time_calls(session, feeds, args.iterations, args.warmup, args.seconds, args.gap_ms))
                    print(f"load {load:2d}  {spec:14s} {engine:12s} p50 {row['p50_ms']:8.3f} ms  p99 "
                          f"{row['p99_ms']:8.3f} ms  ({row['ratio']:.1f}x, {row['calls']} calls)", flush=True)
                rows.append(row)

    header = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{usable_cores()} usable cores ({os.cpu_count()} online), loads {loads} busy processes, "
              f"{'back-to-back calls' if args.gap_ms <= 0 else f'{args.gap_ms:g} ms between calls'}; 1-minute load "
              f"average at the start of each load: " + ", ".join(f"{v:.1f}" for v in load_averages.values()))
    table = markdown(rows, loads)
    print()
    print(header)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(header + "\n\n" + table + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
