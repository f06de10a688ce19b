"""The int8 GEMM (qlinear: cuBLASLt's IMMA kernel and cuda_raw's dp4a kernel, docs/quantization.md "The GPU kernels
of qlinear") against the float16 GEMM of the same shape (the runtime's own `linear` op under the default policy), on
the GPU, at BERT-base's shapes.

For each M (default 2048 = 128 x 16 and 8192 = 128 x 64 tokens, and 1 2 4 8 16) and (K, N) (default (768, 768),
(768, 3072), (3072, 768), (768, 2304): attention output, FFN in, FFN out, fused QKV):
  int8 cublasLt  qlinear(x int8 [M, K], W int8 [N, K], per-channel w_scale, float32 bias, x_zero_point --zero-point)
                 -> --output (default int8, requantized: the form of a quantized_fusion chain), pinned to "cublasLt"
  int8 int8_mma  the same pinned to "int8_mma" (cuda_raw's pipelined tensor-core kernel, epilogue in registers)
  int8 dp4a      the same pinned to "dp4a" (--no-dp4a skips it)
  int8 wgmma     the same pinned to "int8_wgmma" (Hopper's warpgroup MMA, epilogue in registers; --no-wgmma skips it)
  wgmma tuned    int8_wgmma with every tile and pipeline it has timed on the shape and the fastest kept (an auto rule
                 of int8_wgmma alone, strategy BestPerformance: its plan names the winner)
  fp8 cublasLt   qlinear_fp8(x float8e4m3fn [M, K], W float8e4m3fn [N, K], per-channel w_scale, float32 bias) -> the
                 matching output (float8e4m3fn for int8/uint8, else --output's float; float32 for int32): cuBLASLt's
                 float8 tensor cores (Note [cuBLASLt float8 GEMMs]) and its epilogue kernel (--no-fp8 skips it)
  float16        y = xrt.ops.linear(x16, W16[N, K], bias16) on the same shapes
Each is timed as the per-call time of --inner calls captured into one xpuruntime CUDA graph and replayed (no host
overhead), median of --iters replays; the calls cycle through copies of the weights whose total exceeds --rotate MiB
(default 256, above the H200's 50 MiB L2), so that the small-M rows read their weights from HBM.
TOPS = 2 M N K / time (int8 ops, float8 or float16 FLOPs); ratio = float16 time / int8 time (> 1: int8 is faster),
fp16/fp8 = float16 time / float8 time. Also
checks the cublasLt and dp4a outputs equal bit for bit and prints the plan each kernel took.

    python benchmarks/bench_quant_gemm.py [--m 2048 8192 1 16] [--output int8|float16|int32] [--out quant_gemm.md]
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys

import numpy as np

import xpuruntime as xrt
from xpuruntime.quantization import _model
from timing import graph_ms  # noqa: E402 (benchmarks/ is the script's folder)

SHAPES = [(768, 768), (768, 3072), (3072, 768), (768, 2304)]
MS = [2048, 8192, 1, 2, 4, 8, 16]


def copies(arrays, total_bytes: int, limit_bytes: int, convert=None):
    """Enough copies on the GPU of `arrays` (each copy its own memory) that together they exceed `limit_bytes`."""
    gpu = xrt.Device("cuda:0")
    count = max(1, math.ceil(limit_bytes / total_bytes))
    out = []
    for _ in range(count):
        tensors = tuple(xrt.from_numpy(a).to(gpu) for a in arrays)
        out.append(tuple(convert(t) for t in tensors) if convert else tensors)
    return out


def weights(rng, k: int, n: int, args):
    """The int8 copies (W [N, K], w_scale [N], bias [N]) and the float16 ones (W16 [N, K], bias16 [N])."""
    w = rng.integers(-127, 128, size=(n, k)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.02, size=n).astype(np.float32)
    bias = rng.uniform(-1, 1, size=n).astype(np.float32)
    w16 = (w.astype(np.float32) * w_scale[:, None]).astype(np.float32)
    int8 = copies([w, w_scale, bias], w.nbytes, args.rotate << 20)
    half = copies([w16, bias], w16.nbytes // 2, args.rotate << 20, convert=lambda t: xrt.ops.cast(t, "float16"))
    fp8 = []
    if not args.no_fp8:  # the float8e4m3fn codes of values in [-4, 4] (the int8 values / 32), viewed as float8
        codes = _model.float_to_e4m3(w.astype(np.float32) / 32)
        fp8 = [(c.view("float8e4m3fn"), s, b) for c, s, b in copies([codes, w_scale, bias], codes.nbytes,
                                                                       args.rotate << 20)]
    return int8, half, fp8


def fp8_attrs(args, k: int) -> dict:
    """qlinear_fp8's attributes for --output: a float8e4m3fn output where the int8 GEMM requantizes."""
    output = {"int8": "float8e4m3fn", "uint8": "float8e4m3fn", "int32": "float32"}.get(args.output, args.output)
    attrs = {"weight_layout": "nk", "x_scale": 0.05, "output_dtype": output, "activation": "none"}
    if output == "float8e4m3fn":
        attrs["y_scale"] = 0.05 * 0.01 * 2 * 2 * math.sqrt(k) / 100
    return attrs


def time_fp8(m: int, k: int, fp8, inner: int, args, row: dict) -> None:
    """The qlinear_fp8 GEMM on `fp8`'s weight copies into `row` (fp8_us, fp8_tflops, the plan)."""
    rng = np.random.default_rng(m + k)
    codes = _model.float_to_e4m3(rng.uniform(-4, 4, (m, k)).astype(np.float32))
    x8 = xrt.from_numpy(codes).to(xrt.Device("cuda:0")).view("float8e4m3fn")
    attrs = fp8_attrs(args, k)
    (_,), decision = xrt.ops.call("qlinear_fp8", [x8, *fp8[0]], attrs, return_decision=True)
    row["plans"]["fp8 cublasLt"] = f"{decision.kernel}: {decision.plan_summary}"
    calls = [(lambda c=c: xrt.ops.call("qlinear_fp8", [x8, *c], attrs)) for c in (fp8[i % len(fp8)]
                                                                                 for i in range(inner))]
    t = graph_ms(calls, args.iters)
    row["fp8_us"] = t * 1e3
    row["fp8_tflops"] = 2.0 * m * row["n"] * k / (t * 1e-3) / 1e12


def qlinear_attrs(args, k: int) -> dict:
    attrs = {"weight_layout": "nk", "x_scale": 0.05, "x_zero_point": args.zero_point, "output_dtype": args.output,
             "activation": "none"}
    if args.output in ("int8", "uint8"):
        attrs.update(y_scale=0.05 * 0.01 * 64 * 64 * math.sqrt(k) / 60, y_zero_point=0)
    if args.output == "int32":
        del attrs["x_scale"]
    return attrs


def run_shape(m: int, k: int, n: int, args, cache: dict) -> dict:
    gpu = xrt.Device("cuda:0")
    rng = np.random.default_rng(m + k + n)
    if (k, n) not in cache:
        cache.clear()
        cache[(k, n)] = weights(rng, k, n, args)
    int8, half, fp8 = cache[(k, n)]
    x_dtype = np.uint8 if args.uint8 else np.int8
    low, high = (0, 255) if args.uint8 else (-128, 127)
    x = xrt.from_numpy(rng.integers(low, high + 1, size=(m, k)).astype(x_dtype)).to(gpu)
    x16 = xrt.ops.cast(xrt.from_numpy(rng.uniform(-1, 1, (m, k)).astype(np.float32)).to(gpu), "float16")
    attrs = qlinear_attrs(args, k)
    raw = args.output == "int32"

    def q_inputs(c):
        w, s, b = c
        return [x, w, None if raw else s, None if raw else b]

    inner = max(args.inner, len(int8), len(half), len(fp8))
    kernels = (["cublasLt", "int8_mma"] + ([] if args.no_dp4a else ["dp4a"]) +
               ([] if args.no_wgmma else ["int8_wgmma"]))
    row = {"m": m, "k": k, "n": n, "plans": {}}
    outputs = {}
    ops = 2.0 * m * n * k
    if not args.no_wgmma:
        kernels.append("int8_wgmma_tuned")
    for kernel in kernels:
        policy = (xrt.KernelPolicy(qlinear={"mode": "auto", "kernels": ["int8_wgmma"], "strategy": "BestPerformance"})
                  if kernel == "int8_wgmma_tuned" else xrt.KernelPolicy(qlinear=f"pin:{kernel}"))
        (y,), decision = xrt.ops.call("qlinear", q_inputs(int8[0]), attrs, policy=policy, return_decision=True)
        outputs[kernel] = y.to("cpu").numpy()
        row["plans"][kernel] = f"{decision.kernel}: {decision.plan_summary}"
        calls = [(lambda c=c, p=policy: xrt.ops.call("qlinear", q_inputs(c), attrs, policy=p))
                 for c in (int8[i % len(int8)] for i in range(inner))]
        t = graph_ms(calls, args.iters)
        row[f"{kernel}_us"] = t * 1e3
        row[f"{kernel}_tops"] = ops / (t * 1e-3) / 1e12
    y16, decision16 = xrt.ops.linear(x16, half[0][0], half[0][1], return_decision=True)
    row["plans"]["float16"] = f"{decision16.kernel}: {decision16.plan_summary}"
    calls16 = [(lambda c=c: xrt.ops.linear(x16, c[0], c[1])) for c in (half[i % len(half)] for i in range(inner))]
    t16 = graph_ms(calls16, args.iters)
    row["fp16_us"] = t16 * 1e3
    row["fp16_tops"] = ops / (t16 * 1e-3) / 1e12
    row["ratio"] = row["fp16_us"] / row["cublasLt_us"]
    row["mma_ratio"] = row["fp16_us"] / row["int8_mma_us"]
    if not args.no_wgmma:
        row["wgmma_ratio"] = row["fp16_us"] / row["int8_wgmma_us"]
    if fp8:
        time_fp8(m, k, fp8, inner, args, row)
        row["fp8_ratio"] = row["fp16_us"] / row["fp8_us"]
    row["same_bits"] = all(np.array_equal(outputs["cublasLt"], v) for v in outputs.values())
    return row


def table(rows, args, device_name: str) -> str:
    dp4a = not args.no_dp4a
    fp8 = not args.no_fp8
    wgmma = not args.no_wgmma
    lines = [f"int8 GEMM (qlinear, x {'uint8' if args.uint8 else 'int8'} zero point {args.zero_point}, per-channel "
             f"scales, float32 bias, output {args.output}) vs float16 linear (with bias), {device_name}, "
             f"{datetime.date.today().isoformat()}; per call in a CUDA graph of calls cycling through > {args.rotate} "
             f"MiB of weights, median of {args.iters} replays", "",
             "| M | K | N | int8 cublasLt us | TOPS | int8 int8_mma us | TOPS |" +
             (" int8 dp4a us | TOPS |" if dp4a else "") +
             (" int8 int8_wgmma us | TOPS | wgmma tuned us |" if wgmma else "") +
             (" fp8 cublasLt us | TFLOPS |" if fp8 else "") +
             " fp16 linear us | TFLOPS | fp16 / int8 | fp16 / int8_mma |" +
             (" fp16 / int8_wgmma |" if wgmma else "") + (" fp16 / fp8 |" if fp8 else "") +
             " same bits |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if dp4a else "") +
             (" ---: | ---: | ---: |" if wgmma else "") + (" ---: | ---: |" if fp8 else "") +
             " ---: | ---: | ---: | ---: |" +
             (" ---: |" if wgmma else "") + (" ---: |" if fp8 else "") + " --- |"]
    for r in rows:
        line = (f"| {r['m']} | {r['k']} | {r['n']} | {r['cublasLt_us']:.2f} | {r['cublasLt_tops']:.1f} | "
                f"{r['int8_mma_us']:.2f} | {r['int8_mma_tops']:.1f} |")
        if dp4a:
            line += f" {r['dp4a_us']:.2f} | {r['dp4a_tops']:.1f} |"
        if wgmma:
            line += f" {r['int8_wgmma_us']:.2f} | {r['int8_wgmma_tops']:.1f} | {r['int8_wgmma_tuned_us']:.2f} |"
        if fp8:
            line += f" {r['fp8_us']:.2f} | {r['fp8_tflops']:.1f} |"
        line += f" {r['fp16_us']:.2f} | {r['fp16_tops']:.1f} | {r['ratio']:.2f} | {r['mma_ratio']:.2f} |"
        if wgmma:
            line += f" {r['wgmma_ratio']:.2f} |"
        if fp8:
            line += f" {r['fp8_ratio']:.2f} |"
        line += f" {'yes' if r['same_bits'] else 'NO'} |"
        lines.append(line)
    lines += ["", "fp16 / int8: the float16 time over the cublasLt int8 time (> 1: int8 is faster), the epilogue and "
                  "any prologue (alpha, folded zero points) included; fp16 / int8_mma the same for cuda_raw's "
                  "pipelined tensor-core kernel (Note [qlinear as a 1x1 convolution]); same bits: every int8 kernel "
                  "gave the same bytes." + (
                      " fp16 / fp8: the float16 time over the float8 one (qlinear_fp8 on cuBLASLt, its epilogue "
                      "kernel included)." if fp8 else ""), "", "Plans:", ""]
    seen = set()
    for r in rows:
        for name, plan in r["plans"].items():
            if plan not in seen:
                seen.add(plan)
                lines.append(f"- M={r['m']} K={r['k']} N={r['n']} {name}: `{plan}`")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="+", default=MS)
    parser.add_argument("--shapes", nargs="+", default=[f"{k}x{n}" for k, n in SHAPES], help="KxN, e.g. 768x3072")
    parser.add_argument("--output", default="int8", choices=["int8", "uint8", "float32", "float16", "int32"])
    parser.add_argument("--uint8", action="store_true", help="uint8 x (ONNX Runtime's default activations)")
    parser.add_argument("--zero-point", type=int, default=0, help="x's zero point (a nonzero one folds column sums)")
    parser.add_argument("--no-dp4a", action="store_true", help="skip the dp4a kernel (slow at the large M)")
    parser.add_argument("--no-wgmma", action="store_true", help="skip int8_wgmma (compute capability 9.0 only)")
    parser.add_argument("--no-fp8", action="store_true", help="skip the float8 GEMM (qlinear_fp8, sm_89+)")
    parser.add_argument("--iters", type=int, default=20, help="timed graph replays per measurement")
    parser.add_argument("--inner", type=int, default=20, help="calls per graph (at least one per weight copy)")
    parser.add_argument("--rotate", type=int, default=256, help="MiB of weight copies each measurement cycles through")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    if xrt.get_device_count() == 0:
        print(f"bench_quant_gemm needs a CUDA device: {xrt.runtime.cuda_unavailable_reason()}", file=sys.stderr)
        return 1
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    rows, cache = [], {}
    for k, n in shapes:
        for m in args.m:
            rows.append(run_shape(m, k, n, args, cache))
            r = rows[-1]
            fp8_text = f", fp8 {r['fp8_us']:.2f} us ({r['fp8_tflops']:.1f} TFLOPS)" if "fp8_us" in r else ""
            print(f"M={m} K={k} N={n}: int8 {r['cublasLt_us']:.2f} us ({r['cublasLt_tops']:.1f} TOPS){fp8_text}, fp16 "
                  f"{r['fp16_us']:.2f} us, ratio {r['ratio']:.2f}", file=sys.stderr, flush=True)
    info = xrt.runtime.get_device_info(xrt.Device("cuda:0"))
    text = table(rows, args, getattr(info, "name", "cuda:0"))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
