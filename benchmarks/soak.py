#!/usr/bin/env python3
"""Load and soak (docs/reliability.md): one session run from many threads, many sessions at once, long runs and
session create/destroy cycles, with every output checked against a single-threaded reference and the process's
resident memory (and the device's, on CUDA) sampled from start to end.

    .venv/bin/python benchmarks/soak.py [--device cpu] [--model models/suite/tiny/bert.dynamo.float32.onnx]
        [--threads 16] [--runs 100000] [--cycles 1000] [--out soak.md]

Exits 1 when an output differs from the reference or memory (resident, or the device's reserved memory on CUDA)
grows past --max-growth-mib between the first and the
last tenth of a phase.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import threading
import time
from typing import Dict, List

import numpy as np

import xpuruntime as xrt

ROOT = pathlib.Path(__file__).resolve().parent.parent


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def device_mib(device: str) -> float:
    if not device.startswith("cuda"):
        return 0.0
    stats = xrt.runtime.memory_stats(device)
    return stats.get("reserved_bytes.all.current", stats.get("reserved_bytes.current", 0)) / 2 ** 20


def feeds_for(sess, rng, count: int) -> List[Dict[str, np.ndarray]]:
    """`count` different inputs at the model's declared shapes (symbolic dims: 2 and 8)."""
    out = []
    for _ in range(count):
        feed = {}
        for info in sess.get_inputs():
            shape = [d if isinstance(d, int) else (2 if i == 0 else 8) for i, d in enumerate(info.shape)]
            if info.dtype.startswith("int"):
                feed[info.name] = rng.integers(0, 50, size=shape).astype(info.dtype)
            elif info.dtype == "bool":
                feed[info.name] = rng.random(shape) > 0.5
            else:
                feed[info.name] = rng.standard_normal(shape).astype(info.dtype)
        out.append(feed)
    return out


class Phase:
    def __init__(self, name: str, device: str) -> None:
        self.name, self.device = name, device
        self.samples: List[tuple] = []
        self.runs = 0
        self.mismatches = 0
        self.lock = threading.Lock()
        self.start = time.perf_counter()
        self.sample()

    def sample(self) -> None:
        self.samples.append((time.perf_counter(), rss_mib(), device_mib(self.device)))

    def finish(self) -> Dict[str, float]:
        self.sample()
        elapsed = time.perf_counter() - self.start
        tenth = max(1, len(self.samples) // 10)
        first = np.mean([s[1] for s in self.samples[:tenth]])
        last = np.mean([s[1] for s in self.samples[-tenth:]])
        dev_first = np.mean([s[2] for s in self.samples[:tenth]])
        dev_last = np.mean([s[2] for s in self.samples[-tenth:]])
        return {"runs": self.runs, "seconds": elapsed, "runs_per_s": self.runs / elapsed if elapsed else 0.0,
                "rss_start": self.samples[0][1], "rss_end": self.samples[-1][1], "rss_growth": last - first,
                "dev_growth": dev_last - dev_first,
                "dev_start": self.samples[0][2], "dev_end": self.samples[-1][2], "mismatches": self.mismatches}


def check(outputs, reference) -> bool:
    return all(np.allclose(np.asarray(o), np.asarray(r), rtol=1e-5, atol=1e-6) for o, r in zip(outputs, reference))


def threaded(phase: Phase, sessions, feeds, references, runs: int) -> None:
    per_thread = runs // len(sessions)

    def work(k: int) -> None:
        sess = sessions[k]
        for i in range(per_thread):
            j = (i + k) % len(feeds)
            ok = check(sess.run(None, feeds[j]) if hasattr(sess, "get_providers") else
                       list(sess.run(feeds[j]).values()), references[j])
            with phase.lock:
                phase.runs += 1
                phase.mismatches += 0 if ok else 1
                if phase.runs % 2000 == 0:
                    phase.sample()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--engine", default="native")
    ap.add_argument("--model", default=str(ROOT / "models" / "suite" / "tiny" / "bert.dynamo.float32.onnx"))
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--runs", type=int, default=100000)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--max-growth-mib", type=float, default=64.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    policy = xrt.ExecutionPolicy(intra_op_threads=1)
    rng = np.random.default_rng(0)
    base = xrt.InferenceSession(args.model, device=args.device, engine=args.engine, exec_policy=policy)
    feeds = feeds_for(base, rng, 8)
    references = [list(base.run(f).values()) for f in feeds]
    results = {}

    phase = Phase(f"{args.threads} threads, one session", args.device)
    threaded(phase, [base] * args.threads, feeds, references, args.runs)
    results[phase.name] = phase.finish()

    phase = Phase(f"{args.threads} sessions, one thread each", args.device)
    sessions = [xrt.InferenceSession(args.model, device=args.device, engine=args.engine, exec_policy=policy)
                for _ in range(args.threads)]
    threaded(phase, sessions, feeds, references, max(args.threads, args.runs // 10))
    results[phase.name] = phase.finish()
    del sessions

    phase = Phase(f"{args.cycles} session create/run/destroy cycles", args.device)
    for c in range(args.cycles):
        sess = xrt.InferenceSession(args.model, device=args.device, engine=args.engine, exec_policy=policy)
        ok = check(list(sess.run(feeds[c % len(feeds)]).values()), references[c % len(feeds)])
        phase.runs += 1
        phase.mismatches += 0 if ok else 1
        del sess
        if c % 20 == 0:
            phase.sample()
    results[phase.name] = phase.finish()

    lines = [f"model {os.path.relpath(args.model, ROOT)}, device {args.device}, engine {args.engine}, "
             f"xpuruntime {xrt.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| phase | runs | runs/s | mismatches | RSS start -> end (MiB) | RSS growth, first to last tenth | "
             "device reserved start -> end (MiB) |", "| --- | ---: | ---: | ---: | --- | ---: | --- |"]
    failed = False
    for name, r in results.items():
        lines.append(f"| {name} | {r['runs']} | {r['runs_per_s']:.0f} | {r['mismatches']} | "
                     f"{r['rss_start']:.0f} -> {r['rss_end']:.0f} | {r['rss_growth']:+.1f} | "
                     f"{r['dev_start']:.0f} -> {r['dev_end']:.0f} |")
        # The device's reserved memory counts too: a leak there (Note [Pooled streams] in graph_exec.cpp) left RSS flat.
        failed |= r["mismatches"] > 0 or r["rss_growth"] > args.max_growth_mib or r["dev_growth"] > args.max_growth_mib
    text = "\n".join(lines)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
