"""Single-op models on the CPU: the native engine against ONNX Runtime in the same process (issue 42, "no kernel off a
cliff"). Each row is a one-node ONNX model (MaxPool and AveragePool 3x3 stride 2 pad 1, and Relu, whose time is
mostly the output's memory) at ResNet's shapes and at the tiny suite's; each session is timed as the median of
--iterations calls of session.run (numpy in, numpy out), best of --repeat rounds, the engines interleaved round by
round so that a busy machine slows both.

    .venv/bin/python benchmarks/cpu_pool_bench.py [--iterations 300] [--repeat 4] [--threads 1] [--markdown out.md]

--threads is both sessions' ExecutionPolicy(intra_op_threads=) (0: each engine's default). Needs the onnxruntime engine (scripts/setup.sh fetches it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from typing import List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src", "python"))

import xpuruntime as xrt  # noqa: E402

SHAPES = [(1, 64, 112, 112), (1, 64, 56, 56), (3, 64, 16, 16), (3, 64, 15, 15)]
OPS = ["MaxPool", "AveragePool", "Relu"]


def model(op: str, shape) -> bytes:
    from onnx import TensorProto, helper

    attrs = {} if op == "Relu" else {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def median_us(session, feeds, iterations: int) -> float:
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e6


def sessions(data: bytes, threads: int):
    """The native and the onnxruntime engine's sessions, both with ExecutionPolicy(intra_op_threads=threads)."""
    extra = {"exec_policy": xrt.ExecutionPolicy(intra_op_threads=threads)} if threads else {}
    return (xrt.InferenceSession(data, engine="native", device="cpu", **extra),
            xrt.InferenceSession(data, engine="onnxruntime", device="cpu", **extra))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of both engines (0: defaults)")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    lines: List[str] = [
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, intra-op threads {args.threads or 'default'}; median us of {args.iterations} calls, "
        f"best of {args.repeat} interleaved rounds",
        "",
        "| op | shape | native us | ONNX Runtime us | native / ORT |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for op in OPS:
        for shape in SHAPES:
            x = np.random.default_rng(0).normal(0, 1, shape).astype(np.float32)
            native, ort = sessions(model(op, shape), args.threads)
            best = {"native": float("inf"), "ort": float("inf")}
            for _ in range(args.repeat):
                for name, session in (("native", native), ("ort", ort)):
                    median_us(session, {"x": x}, 10)
                    best[name] = min(best[name], median_us(session, {"x": x}, args.iterations))
            lines.append(f"| {op} | {'x'.join(map(str, shape))} | {best['native']:.1f} | {best['ort']:.1f} | "
                         f"{best['native'] / best['ort']:.2f} |")
            print(lines[-1], flush=True)
    finish(lines, args.markdown)
    return 0


def finish(lines: List[str], markdown) -> None:
    """Prints the table and writes it to `markdown` (a path) when given."""
    text = "\n".join(lines)
    print("\n" + text)
    if markdown:
        with open(markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
