"""Dispatch overhead: policy lookup + launch of a tiny op, from C++ and from Python, against torch's own.

Runs build/benchmarks/bench_dispatch (C++) and times from Python in the same process:
  xpuruntime  xrt.ops.add on 1-element tensors (CPU; and CUDA xpuruntime tensors when a GPU is present)
  torch       torch.add on 1-element tensors (when torch is installed)
Prints a markdown table (microseconds per call; best of 7 batches) and writes it to --out.

    python benchmarks/dispatch_bench.py --bench build/benchmarks/bench_dispatch --out results.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess

import numpy as np

import xpuruntime as xrt
from timing import best_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default="build/benchmarks/bench_dispatch")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    rows = []
    output = subprocess.run([args.bench], check=True, capture_output=True, text=True).stdout
    for line in output.splitlines():
        item = json.loads(line)
        rows.append((item["device"], f"C++ {item['path']}", item["us_per_call"]))

    devices = ["cpu"] + (["cuda:0"] if xrt.get_device_count() > 0 else [])
    for device in devices:
        a = xrt.from_numpy(np.zeros(1, np.float32)).to(device)
        b = xrt.from_numpy(np.zeros(1, np.float32)).to(device)
        sync = (lambda: xrt.synchronize()) if device != "cpu" else None
        rows.append((device, "Python xrt.ops.add", best_us(lambda: xrt.ops.add(a, b), 5000, warmup=501, sync=sync)))
    try:
        import torch

        for device in devices:
            ta = torch.zeros(1, device=device)
            tb = torch.zeros(1, device=device)
            sync = torch.cuda.synchronize if device != "cpu" else None
            rows.append((device, "Python torch.add", best_us(lambda: torch.add(ta, tb), 5000, warmup=501, sync=sync)))
    except ImportError:
        pass

    table = ["| device | path | us per call |", "| --- | --- | --- |"]
    table += [f"| {d} | {p} | {us:.2f} |" for d, p, us in rows]
    text = f"Dispatch overhead, {datetime.date.today()}\n\n" + "\n".join(table) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
