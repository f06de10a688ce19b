"""Allocator hot path: allocate+free pairs from C++ and Python, against cudaMalloc and torch's allocator.

Runs build/benchmarks/bench_allocator (C++) and times from Python in the same process:
  xpuruntime  runtime.allocate(n, device) + Buffer.free()
  torch       torch.empty(n, dtype=torch.uint8, device=...) + del   (when torch with CUDA is installed)
Prints a markdown table (microseconds per allocate+free pair; best of 7 repeats) and writes it to --out.

    python benchmarks/allocator_bench.py --bench build/benchmarks/bench_allocator --out results.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys

import xpuruntime as xrt
from timing import best_us

SIZES = [4096, 1 << 20, 64 << 20]


def python_results(device: str) -> list[dict]:
    rows = []
    if device.startswith("cuda"):
        allocate = xrt.runtime.allocate
        for n in SIZES:
            rows.append({"impl": "xpuruntime runtime.allocate (Python)", "bytes": n,
                         "us_per_pair": best_us(lambda: allocate(n, device).free(), 100000)})
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            empty, u8, dev = torch.empty, torch.uint8, torch.device(device)
            for n in SIZES:
                rows.append({"impl": "torch.empty + del (Python)", "bytes": n,
                             "us_per_pair": best_us(lambda: empty(n, dtype=u8, device=dev), 100000)})
    sim = xrt.runtime.CachingAllocator.simulated(1 << 30)
    for n in SIZES:
        rows.append({"impl": "xpuruntime caching, simulated memory (Python)", "bytes": n,
                     "us_per_pair": best_us(lambda: sim.free(sim.allocate(n)), 100000)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default="build/benchmarks/bench_allocator", help="the C++ benchmark binary")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()

    device = "cuda:0" if xrt.get_device_count() > 0 else "cpu"
    cpp = subprocess.run([args.bench], check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in cpp.stdout.splitlines() if line.startswith("{")]
    rows += python_results(device)

    name = xrt.Device(device).name if device != "cpu" else "no GPU (" + xrt.get_all_devices()[0].name + ")"
    labels = {4096: "4 KiB", 1 << 20: "1 MiB", 64 << 20: "64 MiB"}
    lines = [f"Allocator hot path, microseconds per allocate+free pair (best of 7), {name}, "
             f"{datetime.date.today().isoformat()}", "",
             "| implementation | " + " | ".join(labels[n] for n in SIZES) + " |",
             "| --- |" + " ---: |" * len(SIZES)]
    for impl in dict.fromkeys(r["impl"] for r in rows):
        cells = {r["bytes"]: r["us_per_pair"] for r in rows if r["impl"] == impl}
        lines.append(f"| {impl} | " + " | ".join(f"{cells[n]:.3f}" for n in SIZES) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
