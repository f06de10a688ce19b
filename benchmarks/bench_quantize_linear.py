"""Per-tensor QuantizeLinear of a float16 activation on the GPU, and the elementwise kernel that ends in one, against
the float16 ops they stand beside (issue 41; docs/benchmarks.md, docs/quantization.md).

For each x shape (default the BERT-base activations of batch 16 and 64: [2048, 768], [2048, 3072], [8192, 3072]):
  fp8 Q        quantize_linear(x, scale, zero point float8e4m3fn 0): what xrt.quantize(precision="fp8") writes
  fp8 Q no zp  the same without a zero point (opset 21's output_dtype)
  int8 Q       quantize_linear(x, scale, zero point int8 0)
  GELU         fused_elementwise("gelu x0; f16 t0") with a float16 output: the float op before the Q
  GELU->fp8    the same program with a float8e4m3fn output (Note [Quantized output of a fused program]): the two
               launches of GELU then Q in one
Each figure is the per-call time of --inner calls captured in order into one xpuruntime CUDA graph and replayed,
median of --iters replays (no host overhead). floor = the bytes x and a float8 y move over --bandwidth GB/s (the
H200's measured device copy, 4.2 TB/s).

    python benchmarks/bench_quantize_linear.py [--shapes 2048x768 2048x3072 8192x3072] [--inner 20] [--iters 50]
        [--out quantize.md]
"""

from __future__ import annotations

import argparse
import datetime

import numpy as np

import xpuruntime as xrt
from timing import graph_ms  # noqa: E402 (benchmarks/ is the script's folder)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["2048x768", "2048x3072", "8192x3072"])
    ap.add_argument("--inner", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--iters", type=int, default=50, help="replays timed (median)")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--bandwidth", type=float, default=4200.0, help="GB/s for the floor column")
    ap.add_argument("--out", default=None, help="write the table (markdown) here too")
    args = ap.parse_args()
    if xrt.get_device_count() == 0:
        print("no CUDA device: nothing to time")
        return 0
    dev = xrt.Device("cuda:0")

    def on_device(a):
        return xrt.from_numpy(np.ascontiguousarray(a)).to(dev)

    scale = on_device(np.array(args.scale, np.float16))
    zero_int8 = on_device(np.array(0, np.int8))
    zero_fp8 = xrt.from_numpy(np.zeros((), np.uint8)).view("float8e4m3fn").to(dev)
    gelu = {"program": "gelu x0; f16 t0"}
    gelu_fp8 = dict(gelu, output_dtype="float8e4m3fn", y_scale=args.scale, y_zero_point=0)
    head = ["x", "fp8 Q", "fp8 Q no zp", "int8 Q", "GELU", "GELU->fp8", "floor (x + fp8 y)"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    print(lines[0], flush=True)
    for text in args.shapes:
        shape = tuple(int(d) for d in text.split("x"))
        x = on_device(np.random.default_rng(0).normal(0, 2, shape).astype(np.float16))
        calls = [lambda: xrt.ops.call("quantize_linear", [x, scale, zero_fp8], {}),
                 lambda: xrt.ops.call("quantize_linear", [x, scale], {"output_dtype": "float8e4m3fn"}),
                 lambda: xrt.ops.call("quantize_linear", [x, scale, zero_int8], {}),
                 lambda: xrt.ops.call("fused_elementwise", [x], gelu),
                 lambda: xrt.ops.call("fused_elementwise", [x], gelu_fp8)]
        us = [graph_ms([call] * args.inner, args.iters) * 1000.0 for call in calls]
        floor = x.numel() * 3 / (args.bandwidth * 1e9) * 1e6
        row = [str(list(shape))] + [f"{t:.2f}" for t in us] + [f"{floor:.2f}"]
        lines.append("| " + " | ".join(row) + " |")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"{datetime.date.today()} on {dev}, microseconds per call\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
