"""Profiler overhead: a native-engine session run with no profiler, with a profiler constructed but never started
(what "off" costs: one relaxed atomic load per run), and with a profiler recording (host events only, and on CUDA
with CUPTI activity).

For each zoo model (scripts/make_model_zoo.py: mlp, bert, resnet50; the tiny variants with --tiny) it times
`session.run` as benchmarks/timing.py's best-of-batches mean of back-to-back calls, with a device synchronization
at the end of each batch on CUDA. A recording profiler is restarted every batch so that its event list stays small
(the cost measured is recording, not a growing list). On CUDA a recording profiler makes the native engine run its
steps eagerly instead of replaying its CUDA graph (docs/profiling.md), so "on" includes that difference.

    python3 benchmarks/profiler_overhead.py [--device cuda] [--models mlp,bert,resnet50] [--batch 1]
        [--iterations 100] [--tiny] [--markdown out.md]
    python3 benchmarks/profiler_overhead.py --device cpu --tiny     # a quick check on a machine without a GPU
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import make_model_zoo as zoo  # noqa: E402

import xpuruntime as xrt  # noqa: E402


class Variant:
    """One way of running: ``before``/``after`` run untimed around each timed batch."""

    def __init__(self, name: str, before: Callable[[], object] = lambda: None,
                 after: Callable[[], object] = lambda: None) -> None:
        self.name, self.before, self.after = name, before, after
        self.best_us = float("inf")


def time_round_robin(fn: Callable[[], object], variants: List[Variant], iterations: int, repeats: int,
                     sync: Callable[[], object]) -> None:
    """Best of ``repeats`` batches of ``iterations`` calls per variant, the variants taking turns batch by batch so
    that drifts of the machine (other processes, clocks) spread over all of them."""
    for _ in range(max(1, iterations // 10)):
        fn()
    sync()
    for _ in range(repeats):
        for v in variants:
            v.before()
            start = time.perf_counter_ns()
            for _ in range(iterations):
                fn()
            sync()
            v.best_us = min(v.best_us, (time.perf_counter_ns() - start) / 1e3 / iterations)
            v.after()


def make_feeds(session: xrt.InferenceSession, batch: int, device: str) -> Dict[str, object]:
    feeds = {}
    rng = np.random.default_rng(0)
    for info in session.get_inputs():
        shape = [batch if not isinstance(d, int) else d for d in info.shape]
        if info.dtype.startswith("int"):
            value = rng.integers(0, 100, size=shape).astype(info.dtype)
        else:
            value = rng.standard_normal(shape).astype(info.dtype)
        feeds[info.name] = xrt.from_numpy(value).to(device) if device != "cpu" else value
    return feeds


def measure(path: pathlib.Path, device: str, batch: int, iterations: int, repeats: int) -> List[Dict[str, object]]:
    session = xrt.InferenceSession(path, device=device, engine="native")
    feeds = make_feeds(session, batch, device)
    sync = xrt.synchronize if device != "cpu" else (lambda: None)
    idle = xrt.profile()  # constructed, never started: the "off" path, the same code as no profiler at all
    variants = [Variant("no profiler"), Variant("profiler off")]
    events: Dict[str, List[int]] = {}
    modes = [("on, host events", False)] + ([("on, host + CUPTI", True)] if device != "cpu" else [])
    for name, cuda in modes:
        p = xrt.profile(cuda=cuda)
        label = f"profiler {name}"
        events[label] = []
        variants.append(Variant(label, before=p.start,
                                after=lambda p=p, label=label: (p.stop(), events[label].append(len(p.events())))))
    time_round_robin(lambda: session.run(feeds), variants, iterations, repeats, sync)
    del idle
    base = variants[0].best_us
    rows = []
    for v in variants:
        row: Dict[str, object] = {"variant": v.name, "us": v.best_us, "overhead_pct": 100.0 * (v.best_us - base) / base}
        if v.name in events:
            row["events_per_run"] = max(events[v.name]) / iterations
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if xrt.get_device_count() > 0 else "cpu")
    parser.add_argument("--models", default="mlp,bert,resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tiny", action="store_true", help="the tiny zoo models (fast; for a CPU check)")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    if args.device.startswith("cuda") and xrt.get_device_count() == 0:
        parser.error(f"--device {args.device}: no CUDA device ({xrt.runtime.cuda_unavailable_reason()})")
    if args.device == "cuda":
        args.device = "cuda:0"
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in zoo.MODEL_NAMES]
    if unknown:
        parser.error(f"unknown models {unknown}; valid: {', '.join(zoo.MODEL_NAMES)}")
    dtype = "fp16" if args.device != "cpu" else "fp32"
    lines = [f"device {args.device}, batch {args.batch}, {args.iterations} runs per batch, best of {args.repeats}",
             "", "| model | variant | us/run | overhead | events/run |", "|---|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        models = zoo.generate(pathlib.Path(tmp), tiny_only=args.tiny)
        for name in names:
            key = zoo.file_name(name, args.tiny, dtype).removesuffix(".onnx")
            if key not in models:
                print(f"{name}: no {key} model in the zoo; skipped", file=sys.stderr)
                continue
            for r in measure(models[key], args.device, args.batch, args.iterations, args.repeats):
                events = f"{r['events_per_run']:.0f}" if "events_per_run" in r else "-"
                lines.append(f"| {key} | {r['variant']} | {r['us']:.1f} | {r['overhead_pct']:+.1f}% | {events} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
