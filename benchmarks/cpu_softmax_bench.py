"""Softmax over attention scores on the CPU: the native engine against ONNX Runtime in the same process (issue 42, "no
kernel off a cliff"). Each row is a one-node ONNX model (Softmax over the last axis) at an attention's score shape
[batch, heads, queries, keys], with its scores N(0, 1) and, in the masked cases, the first half of every row's keys set
to a mask value as exporters write them (-1e4, -1e9, the lowest float32, -inf; "rows": every other batch entry masked
at every key but one half, as a padded batch's pad queries). Each session is timed as the median of --iterations calls
of session.run (numpy in, numpy out), best of --repeat rounds, the engines interleaved round by round so that a busy
machine slows both. A second table times softmax(q k^T / sqrt(d)) v as an exporter writes it (four nodes), which the
native engine fuses into its Attention op. The native engine's rows before 2026-12-05 22:20 UTC sent every masked score to std::exp (Note
[Vectorised exp on the CPU] in src/cpp/backends/cpu/cpu_fused.cpp).

    .venv/bin/python benchmarks/cpu_softmax_bench.py [--iterations 200] [--repeat 3] [--threads 1] [--markdown out.md]

Needs the onnxruntime engine (scripts/setup.sh fetches it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src", "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import xpuruntime as xrt  # noqa: E402
from cpu_pool_bench import median_us  # noqa: E402
from timing import emit_table  # noqa: E402

SHAPES = [(16, 2, 16, 80), (1, 12, 128, 128), (8, 32, 1, 1024)]
MASKS = {"none": None, "-1e4": -1e4, "-1e9": -1e9, "lowest": float(np.finfo(np.float32).min), "-inf": -np.inf,
         "rows": "rows"}


def model(shape) -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def attention_model(shape) -> bytes:
    """softmax(q k^T / sqrt(d)) v as an exporter writes it (MatMul, Mul, Softmax, MatMul): the native engine fuses it
    into its Attention op (Note [Attention rows in vectors] in src/cpp/backends/cpu/cpu_attention.cpp), ONNX Runtime
    runs the four nodes."""
    from onnx import TensorProto, helper, numpy_helper

    b, h, s, d = shape
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("q", "k", "v")]
    graph = helper.make_graph(nodes, "g", io, [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
                              [numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


ATTENTION_SHAPES = [(1, 12, 12, 64), (16, 12, 24, 64), (1, 12, 128, 64), (1, 12, 384, 64)]


def scores(shape, mask, rng) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    half = shape[-1] // 2
    if mask == "rows":
        x[::2, ..., half:] = np.finfo(np.float32).min
    elif mask is not None:
        x[..., :half] = mask
    return x


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="ExecutionPolicy(intra_op_threads=) of both (0: default)")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    policy = xrt.ExecutionPolicy(intra_op_threads=args.threads) if args.threads else xrt.ExecutionPolicy()
    lines = [f"cpu_softmax_bench, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, threads {args.threads or 'default'}"
             f", median of {args.iterations} calls, best of {args.repeat}", "",
             "| shape | masked | native us | onnxruntime us | onnxruntime / native |", "| --- | --- | ---: | ---: | ---: |"]
    for shape in SHAPES:
        onnx_model = model(shape)
        sessions = {engine: xrt.InferenceSession(onnx_model, engine=engine, exec_policy=policy)
                    for engine in ("native", "onnxruntime")}
        for name, mask in MASKS.items():
            feeds = {"x": scores(shape, mask, rng)}
            best = {engine: float("inf") for engine in sessions}
            for _ in range(args.repeat):
                for engine, session in sessions.items():
                    session.run(None, feeds)
                    best[engine] = min(best[engine], median_us(session, feeds, args.iterations))
            lines.append(f"| {list(shape)} | {name} | {best['native']:.1f} | {best['onnxruntime']:.1f} | "
                         f"{best['onnxruntime'] / best['native']:.2f} |")
    lines += ["", "| attention [B, H, S, D] | native us | onnxruntime us | onnxruntime / native | native kernel |",
              "| --- | ---: | ---: | ---: | --- |"]
    for shape in ATTENTION_SHAPES:
        onnx_model = attention_model(shape)
        sessions = {engine: xrt.InferenceSession(onnx_model, engine=engine, exec_policy=policy)
                    for engine in ("native", "onnxruntime")}
        feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
        best = {engine: float("inf") for engine in sessions}
        for _ in range(args.repeat):
            for engine, session in sessions.items():
                session.run(None, feeds)
                best[engine] = min(best[engine], median_us(session, feeds, args.iterations))
        fused = "Attention" in str(sessions["native"].explain())
        lines.append(f"| {list(shape)} | {best['native']:.1f} | {best['onnxruntime']:.1f} | "
                     f"{best['onnxruntime'] / best['native']:.2f} | {'fused Attention' if fused else 'unfused'} |")
    emit_table(lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
