"""Host time per run: what a replayed run costs beyond its kernels, native against PyTorch's CUDA graph replay.

At batch 1 a model's kernels take a few hundred microseconds, and the work around them (the Python call, the
inputs copied into the graph's buffers, the graph launch, the outputs copied out, the synchronization) is a
visible part of the latency. This benchmark times, each call followed by a device synchronization (as
model_suite_bench.py does):

  native          xrt.InferenceSession(engine="native").run(feeds) from Python, inputs already on the device
  native_cpp      the same session called from C++ (benchmarks/session_direct_bench.cpp; skipped without it)
  torch_graph     the PyTorch module captured in a torch.cuda.CUDAGraph and replayed (its inputs and outputs are
                  the graph's own buffers: no copies)
  torch_graph_io  the same graph with run()'s semantics: the input copied into the graph's buffer, the output
                  cloned out of it
  compile_graph   torch.compile (default mode) replayed from a CUDA graph (suite models only; --skip to leave out)

for `tiny` (one fused elementwise kernel on 8 halves: the floor, nothing but overhead) and the real-model suite's
full-size float16 exports (`efficientnet`, `mobilenet_v3`, ...: scripts/model_suite.py). Needs a CUDA device.

    python3 benchmarks/run_overhead_bench.py [--models tiny,efficientnet] [--iterations 2000] [--markdown F]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
from typing import Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from session_bench import Skip, find_bench, latency, run_session_direct  # noqa: E402
from timing import torch_graph  # noqa: E402

VARIANTS = ["native", "native_cpp", "torch_graph", "torch_graph_io", "compile_graph"]


def tiny_model(directory: pathlib.Path):
    """(x + 1) * 0.5 on a [1, 8] float16 input, as ONNX and as a torch module."""
    import numpy as np
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper

    one = numpy_helper.from_array(np.array([1.0], np.float16), "one")
    half = numpy_helper.from_array(np.array([0.5], np.float16), "half")
    nodes = [helper.make_node("Add", ["x", "one"], ["t"]), helper.make_node("Mul", ["t", "half"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8])], [one, half])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = directory / "tiny.onnx"
    onnx.save(model, str(path))

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return (x + 1) * 0.5

    return path, Tiny().cuda().half().eval(), {"x": torch.randn(1, 8).half()}


def measure(name: str, directory: pathlib.Path, iterations: int, warmup: int, skip: List[str], binary) -> List[Dict]:
    import torch
    import xpuruntime as xrt

    if name == "tiny":
        path, module, feeds = tiny_model(directory)
    else:
        from model_suite_bench import feeds_for, full_model, suite
        path, built = full_model(name, directory)
        suite.realistic_weights(built.module, built.inputs)
        module = built.module.cuda().half().eval()
        feeds = feeds_for(built, 1, 128)
    rows = []

    def row(variant, fn):
        if variant in skip:
            return
        try:
            stats = fn()
        except Skip as e:
            print(f"{name} {variant}: skipped ({e})", file=sys.stderr)
            return
        rows.append({**stats, "model": name, "variant": variant})
        print(json.dumps(rows[-1]), file=sys.stderr)

    def native():
        session = xrt.InferenceSession(str(path), device="cuda:0", engine="native")
        device_feeds = {k: xrt.from_dlpack(v.cuda()) for k, v in feeds.items()}
        return latency(lambda: session.run(device_feeds), iterations, warmup, lambda: xrt.synchronize("cuda:0"))

    def native_cpp():
        return run_session_direct(binary, path, "cuda", "native", 1, True, iterations, warmup)

    args = [v.cuda() for v in feeds.values()]
    sync = torch.cuda.synchronize

    def graph_of(fn):
        with torch.inference_mode():
            static = [a.clone() for a in args]
            out = {}

            def call():
                result = fn(*static)
                out["y"] = result[0] if isinstance(result, (tuple, list)) else result

            return torch_graph(call), static, out

    def torch_graph_plain():
        graph, _, _ = graph_of(module)
        return latency(graph.replay, iterations, warmup, sync)

    def torch_graph_io():
        graph, static, out = graph_of(module)

        def run():
            for s, a in zip(static, args):
                s.copy_(a)
            graph.replay()
            return out["y"].clone()

        with torch.inference_mode():
            return latency(run, iterations, warmup, sync)

    def compile_graph():
        if name == "tiny":
            raise Skip("not for tiny")
        with torch.inference_mode():
            fn = torch.compile(module)
            for _ in range(3):
                fn(*args)
            graph, _, _ = graph_of(fn)
            return latency(graph.replay, iterations, warmup, sync)

    row("native", native)
    row("native_cpp", native_cpp)
    row("torch_graph", torch_graph_plain)
    row("torch_graph_io", torch_graph_io)
    row("compile_graph", compile_graph)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,efficientnet,mobilenet_v3")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--skip", default="", help="variants to leave out, comma-separated")
    parser.add_argument("--export-dir", default="", help="where the suite's exports are (written when missing)")
    parser.add_argument("--bench-dir", default="", help="the folder holding session_direct_bench (default: found)")
    parser.add_argument("--markdown", default="")
    args = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("run_overhead_bench: needs a CUDA device", file=sys.stderr)
        return 1
    binary = find_bench(str(pathlib.Path(args.bench_dir) / "x") if args.bench_dir else None, "session_direct_bench")
    skip = [s for s in args.skip.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(args.export_dir or tmp)
        directory.mkdir(parents=True, exist_ok=True)
        rows = []
        for name in [m for m in args.models.split(",") if m]:
            rows += measure(name, directory, args.iterations, args.warmup, skip, binary)
    lines = [f"device: {torch.cuda.get_device_name()}", "",
             "| model | " + " | ".join(VARIANTS) + " |", "| --- |" + " ---: |" * len(VARIANTS)]
    for name in dict.fromkeys(r["model"] for r in rows):
        cells = []
        for variant in VARIANTS:
            r = next((r for r in rows if r["model"] == name and r["variant"] == variant), None)
            cells.append(f"{r['median_ms'] * 1e3:.1f}" if r else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Median microseconds per run (each run followed by a device synchronization).")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
