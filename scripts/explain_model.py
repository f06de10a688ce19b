#!/usr/bin/env python3
"""Prints what the native engine runs for a model: explain() (kernels, reasons, memory plan), then the latency
with CUDA graphs on and off. A debugging aid for the session benchmark.

    python3 scripts/explain_model.py MODEL.onnx [--device cuda:0] [--batch 1] [--iterations 50]
"""
import argparse
import time

import numpy as np

import xpuruntime as xrt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    for graphs in (True, False):
        policy = xrt.ExecutionPolicy(cuda_graphs=graphs)
        session = xrt.InferenceSession(args.model, device=args.device, engine="native", exec_policy=policy)
        feeds = {}
        for info in session.get_inputs():
            shape = [args.batch if isinstance(d, str) else d for d in info.shape]
            if info.dtype == "int64":
                feeds[info.name] = np.random.randint(0, 100, size=shape).astype(np.int64)
            else:
                feeds[info.name] = np.random.standard_normal(shape).astype(info.dtype)
        for _ in range(5):
            session.run(feeds)
        start = time.perf_counter()
        for _ in range(args.iterations):
            session.run(feeds)
        ms = (time.perf_counter() - start) / args.iterations * 1e3
        if graphs:
            print(session.explain())
        print(f"cuda_graphs={graphs}: {ms:.3f} ms per run (host inputs, batch {args.batch})")


if __name__ == "__main__":
    main()
