"""The int8 convolution (qconv2d) against the float16 convolution (conv2d) of the same shape, on the GPU, at every
convolution shape of ResNet-50 after its stem (torchvision's layout: stride on the 3x3), channels-last, with the counts
ResNet-50 has of each, so that the sums estimate the network's convolution time in each precision.

For each batch (default 1, 16, 64) and shape (input H = W, C, O, kernel, stride):
  int8    qconv2d(x int8 NHWC, W int8 [O, kh, kw, C], per-channel w_scale, float32 bias, relu) -> int8 (requantized:
          the form of a quantized_fusion chain), the dispatcher's choice (cuda_raw "int8_mma": the pipelined
          tensor-core kernel, Note [Pipelined int8 convolution]); --kernel pins another (e.g. cuda_raw)
  float16 conv2d(x float16 NHWC, W float16 [O, kh, kw, C], bias, relu), the dispatcher's choice (cuDNN)
Each is the per-call time of --inner calls captured into one xpuruntime CUDA graph and replayed, median of --iters
replays. TOPS = 2 N OH OW O C kh kw / time; fp16 / int8 > 1: int8 is faster. The plan each took is printed.

    python benchmarks/bench_quant_conv.py [--batches 1 16 64] [--kernel int8_mma] [--out quant_conv.md]
    python benchmarks/bench_quant_conv.py --profile 1 --batches 1 16   # the kernels of the first shapes (torch.profiler)
"""

from __future__ import annotations

import argparse
import datetime
import sys

import numpy as np

import xpuruntime as xrt
from timing import graph_ms  # noqa: E402 (benchmarks/ is the script's folder)

# (input H = W, C, O, kernel, stride, count in ResNet-50)
RESNET50 = [
    (56, 64, 64, 1, 1, 1), (56, 64, 64, 3, 1, 3), (56, 64, 256, 1, 1, 4), (56, 256, 64, 1, 1, 2),
    (56, 256, 128, 1, 1, 1), (56, 128, 128, 3, 2, 1), (28, 128, 512, 1, 1, 4), (56, 256, 512, 1, 2, 1),
    (28, 512, 128, 1, 1, 3), (28, 128, 128, 3, 1, 3),
    (28, 512, 256, 1, 1, 1), (28, 256, 256, 3, 2, 1), (14, 256, 1024, 1, 1, 6), (28, 512, 1024, 1, 2, 1),
    (14, 1024, 256, 1, 1, 5), (14, 256, 256, 3, 1, 5),
    (14, 1024, 512, 1, 1, 1), (14, 512, 512, 3, 2, 1), (7, 512, 2048, 1, 1, 3), (14, 1024, 2048, 1, 2, 1),
    (7, 2048, 512, 1, 1, 2), (7, 512, 512, 3, 1, 2),
]


def run_shape(batch: int, shape, args) -> dict:
    h, c, o, k, stride, count = shape
    gpu = xrt.Device("cuda:0")
    rng = np.random.default_rng(batch * 1000 + h + c + o + k)
    pad = k // 2
    oh = (h + 2 * pad - k) // stride + 1
    x8 = xrt.from_numpy(rng.integers(-128, 128, size=(batch, h, h, c)).astype(np.int8)).to(gpu)
    w8 = xrt.from_numpy(rng.integers(-127, 128, size=(o, k, k, c)).astype(np.int8)).to(gpu)
    w_scale = xrt.from_numpy(rng.uniform(0.002, 0.02, size=o).astype(np.float32)).to(gpu)
    bias = xrt.from_numpy(rng.uniform(-1, 1, size=o).astype(np.float32)).to(gpu)
    attrs = {"layout": "NHWC", "strides": [stride, stride], "pads": [pad, pad, pad, pad], "x_scale": 0.05,
             "y_scale": 0.05 * 0.01 * 64 * 64 * np.sqrt(c * k * k) / 60, "output_dtype": "int8",
             "activation": "relu"}
    policy = xrt.KernelPolicy(qconv2d=f"pin:{args.kernel}") if args.kernel else None
    (_,), decision = xrt.ops.call("qconv2d", [x8, w8, w_scale, bias], attrs, policy=policy, return_decision=True)
    t8 = graph_ms([lambda: xrt.ops.call("qconv2d", [x8, w8, w_scale, bias], attrs, policy=policy)] * args.inner,
                  args.iters)
    x16 = xrt.ops.cast(xrt.from_numpy(rng.uniform(-1, 1, (batch, h, h, c)).astype(np.float32)).to(gpu), "float16")
    w16 = xrt.ops.cast(xrt.from_numpy(rng.uniform(-0.05, 0.05, (o, k, k, c)).astype(np.float32)).to(gpu), "float16")
    b16 = xrt.ops.cast(bias, "float16")
    attrs16 = {"layout": "NHWC", "strides": [stride, stride], "pads": [pad, pad, pad, pad], "activation": "relu"}
    (_,), decision16 = xrt.ops.call("conv2d", [x16, w16, b16], attrs16, return_decision=True)
    t16 = graph_ms([lambda: xrt.ops.call("conv2d", [x16, w16, b16], attrs16)] * args.inner, args.iters)
    ops = 2.0 * batch * oh * oh * o * c * k * k
    return {"batch": batch, "h": h, "c": c, "o": o, "k": k, "stride": stride, "count": count,
            "int8_us": t8 * 1e3, "fp16_us": t16 * 1e3, "int8_tops": ops / (t8 * 1e-3) / 1e12,
            "fp16_tflops": ops / (t16 * 1e-3) / 1e12,
            "int8_plan": f"{decision.kernel}: {decision.plan_summary}",
            "fp16_plan": f"{decision16.kernel}: {decision16.plan_summary}"}


def profile(batch: int, shape, args) -> None:
    """The CUDA kernels of 20 eager int8 and float16 calls of one shape, as torch.profiler (CUPTI) records them."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    h, c, o, k, stride, _ = shape
    gpu = xrt.Device("cuda:0")
    rng = np.random.default_rng(0)
    pad = k // 2
    x8 = xrt.from_numpy(rng.integers(-128, 128, size=(batch, h, h, c)).astype(np.int8)).to(gpu)
    w8 = xrt.from_numpy(rng.integers(-127, 128, size=(o, k, k, c)).astype(np.int8)).to(gpu)
    w_scale = xrt.from_numpy(rng.uniform(0.002, 0.02, size=o).astype(np.float32)).to(gpu)
    bias = xrt.from_numpy(rng.uniform(-1, 1, size=o).astype(np.float32)).to(gpu)
    attrs = {"layout": "NHWC", "strides": [stride, stride], "pads": [pad, pad, pad, pad], "x_scale": 0.05,
             "y_scale": 1.0, "output_dtype": "int8", "activation": "relu"}
    for _ in range(3):
        xrt.ops.call("qconv2d", [x8, w8, w_scale, bias], attrs)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            xrt.ops.call("qconv2d", [x8, w8, w_scale, bias], attrs)
        torch.cuda.synchronize()
    print(f"-- profile batch {batch}, H {h}, {c} -> {o}, k {k}, s {stride}: 20 calls")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
        print(f"   {e.count:4d} x {e.device_time_total / max(e.count, 1):8.2f} us  {e.key[:110]}")


def table(rows, args) -> str:
    lines = [f"bench_quant_conv, {datetime.date.today()}, {xrt.Device('cuda:0')}, inner {args.inner}, "
             f"iters {args.iters}", "",
             "| batch | H | C -> O | k, s | count | int8 us | TOPS | fp16 us | TFLOPS | fp16 / int8 |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['h']} | {r['c']} -> {r['o']} | {r['k']}, {r['stride']} | {r['count']} | "
                     f"{r['int8_us']:.2f} | {r['int8_tops']:.0f} | {r['fp16_us']:.2f} | {r['fp16_tflops']:.0f} | "
                     f"{r['fp16_us'] / r['int8_us']:.2f} |")
    lines.append("")
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        t8 = sum(r["int8_us"] * r["count"] for r in mine)
        t16 = sum(r["fp16_us"] * r["count"] for r in mine)
        lines.append(f"- batch {batch}: ResNet-50's 52 convolutions after the stem, weighted by count: int8 "
                     f"{t8:.0f} us, float16 {t16:.0f} us, fp16 / int8 {t16 / t8:.2f}")
    lines.append("")
    lines.append("Plans (last batch): " + "; ".join(sorted({r["int8_plan"] for r in rows if r["batch"] == batch})))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--kernel", default="", help="pin qconv2d to this kernel (default: the dispatcher's choice)")
    parser.add_argument("--inner", type=int, default=10, help="calls per captured graph")
    parser.add_argument("--iters", type=int, default=20, help="timed graph replays per measurement")
    parser.add_argument("--out", default=None, help="also write the table here")
    parser.add_argument("--profile", type=int, default=0, help="profile the first N shapes of each batch instead")
    args = parser.parse_args(argv)
    if xrt.get_device_count() == 0:
        print("bench_quant_conv: no CUDA device", file=sys.stderr)
        return 1
    if args.profile:
        for batch in args.batches:
            for shape in RESNET50[:args.profile]:
                profile(batch, shape, args)
        return 0
    rows = [run_shape(batch, shape, args) for batch in args.batches for shape in RESNET50]
    text = table(rows, args)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
