#!/usr/bin/env python3
"""Quantizes every float32 export of the real-model suite and compares each with its float model.

    .venv/bin/python scripts/quantization_suite.py models/suite/tiny [--precision int8 int4-weights] [--method minmax]

For each ``*.float32.onnx`` in the folder (scripts/model_suite.py writes them): calibrates on three random feeds
(``xpuruntime.cli.random_inputs``, seeds 0-2; the suite's weights are random too), quantizes, runs the float and the
quantized model on those feeds through each engine, and prints a Markdown table of the nodes quantized / left float
and each engine's cosine similarity and max abs error against the float model (docs/quantization.md). An engine that
refuses the quantized form shows its error's type.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

import xpuruntime as xrt
from xpuruntime import cli
from xpuruntime.quantization.sensitivity import output_error


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--precision", nargs="+", default=["int8", "int4-weights"])
    parser.add_argument("--method", default="minmax")
    parser.add_argument("--engines", nargs="+", default=["native", "onnxruntime"])
    args = parser.parse_args(argv)
    files = sorted(args.folder.glob("*.float32.onnx"))
    if not files:
        print(f"no *.float32.onnx in {args.folder}", file=sys.stderr)
        return 2
    header = ["model", "precision", "quantized / float"] + [f"{e}: cosine, max abs error" for e in args.engines]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for path in files:
        reference_session = xrt.InferenceSession(path, engine="native")
        feeds = [cli.random_inputs(reference_session, 1, seed) for seed in range(3)]
        reference = [{k: cli.to_numpy(v) for k, v in reference_session.run(f).items()} for f in feeds]
        for precision in args.precision:
            row = [path.name.replace(".float32.onnx", ""), precision]
            try:
                result = xrt.quantize(path, None if precision == "int4-weights" else feeds, precision=precision,
                                      method=None if precision == "int4-weights" else args.method)
            except xrt.XpuRuntimeError as error:
                print("| " + " | ".join(row + [f"not quantized: {type(error).__name__}"] + [""] * len(args.engines))
                      + " |")
                continue
            row.append(f"{len(result.quantized_nodes)} / {len(result.excluded)}")
            for engine in args.engines:
                try:
                    session = xrt.InferenceSession(result.to_bytes(), engine=engine)
                    outputs = [{k: cli.to_numpy(v) for k, v in session.run(f).items()} for f in feeds]
                    cosine, max_abs, _ = output_error(outputs, reference)
                    row.append(f"{cosine:.4f}, {max_abs:.3g}")
                except xrt.XpuRuntimeError as error:
                    row.append(f"refused ({type(error).__name__})")
            print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
