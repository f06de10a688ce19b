"""The int4 weight-only GEMM (matmul_nbits, cuda_raw: Note [Int4 GEMM on the GPU]) against the float16 GEMM of the
same shape (the runtime's own `linear` op, cuBLASLt/cuBLAS under the default policy), on the GPU.

For each M (default 1 2 4 8 16) and (K, N) (default (4096, 4096), (4096, 11008), (11008, 4096), (8192, 8192)):
  int4    y[M, N] = x[M, K] @ W^T with W int4 in blocks of --block along K (MatMulNBits' packed layout, float16
          scales, no zero points: the form xrt.quantize's weights take after the int4_weight_fusion pass), x float16
  float16 y = xrt.ops.linear(x, W16[N, K]) on the same x
Each is timed as the per-call time of --inner calls captured into one xpuruntime CUDA graph and replayed (no host
overhead), median of --iters replays. The calls cycle through copies of the weights whose total exceeds --rotate MiB
(default 256, above the H200's 50 MiB L2), so that each call reads its weights from HBM, not from L2.
GB/s = the int4 weight bytes (packed codes + scales) / time; % = of --peak GB/s, by default the device's copy
bandwidth (read + write bytes per second) as the roofline audit measures it in the same process (Profiler.ceilings;
the H200's measured 4.23 TB/s against its nominal 4.8), which the table states. Speed-up = float16 time / int4 time.
Also prints the plan each kernel took.

    python benchmarks/bench_int4_gemm.py [--m 1 2 4 8 16] [--block 32] [--tune] [--grids] [--out int4.md]
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys

import numpy as np

import xpuruntime as xrt
from timing import graph_ms  # noqa: E402 (benchmarks/ is the script's folder)

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (8192, 8192)]


def int4_weights(rng, k: int, n: int, block: int):
    """Packed codes [N, n_blocks, block / 2] and float16 scales [N, n_blocks] (numpy), and the float16 weight [N, K]
    they dequantize to (for the float16 GEMM)."""
    blocks = -(-k // block)
    codes = rng.integers(0, 16, size=(n, blocks, block), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, size=(n, blocks)).astype(np.float16)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    dense = ((codes.astype(np.float32) - 8) * scales.astype(np.float32)[..., None]).reshape(n, -1)[:, :k]
    return packed, scales, np.ascontiguousarray(dense.astype(np.float16))


def copies(arrays, total_bytes: int, limit_bytes: int):
    """Enough copies on the GPU of `arrays` (each copy its own memory) that together they exceed `limit_bytes`."""
    gpu = xrt.Device("cuda:0")
    count = max(1, math.ceil(limit_bytes / total_bytes))
    return [tuple(xrt.from_numpy(a).to(gpu) for a in arrays) for _ in range(count)]


def int4_cycle(x, int4_copies, attrs, inner: int, policy=None):
    """`inner` matmul_nbits calls on x, cycling through the weight copies (each call reads its weights from HBM)."""
    return [(lambda w=w, s=s: xrt.ops.call("matmul_nbits", [x, w, s], attrs, policy=policy))
            for w, s in (int4_copies[i % len(int4_copies)] for i in range(inner))]


def run_shape(m: int, k: int, n: int, args, cache: dict) -> dict:
    gpu = xrt.Device("cuda:0")
    rng = np.random.default_rng(m + k + n)
    key = (k, n)
    if key not in cache:
        cache.clear()
        packed, scales, dense = int4_weights(rng, k, n, args.block)
        int4_bytes = packed.nbytes + scales.nbytes
        cache[key] = (copies([packed, scales], int4_bytes, args.rotate << 20),
                      [c[0] for c in copies([dense], dense.nbytes, args.rotate << 20)], int4_bytes)
    int4_copies, dense_copies, int4_bytes = cache[key]
    x = xrt.ops.cast(xrt.from_numpy(rng.uniform(-1, 1, (m, k)).astype(np.float32)).to(gpu), "float16")
    attrs = {"block_size": args.block}
    inner = max(args.inner, len(int4_copies), len(dense_copies))
    int4_calls = int4_cycle(x, int4_copies, attrs, inner)
    dense_calls = [(lambda w=w: xrt.ops.linear(x, w)) for w in (dense_copies[i % len(dense_copies)]
                                                                  for i in range(inner))]
    (y4,), decision = xrt.ops.call("matmul_nbits", [x, *int4_copies[0]], attrs, return_decision=True)
    y16, dense_decision = xrt.ops.linear(x, dense_copies[0], return_decision=True)
    a = xrt.ops.cast(y4, "float32").to("cpu").numpy()
    b = xrt.ops.cast(y16, "float32").to("cpu").numpy()
    error = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    t4 = graph_ms(int4_calls, args.iters)
    t16 = graph_ms(dense_calls, args.iters)
    gbs = int4_bytes / (t4 * 1e-3) / 1e9
    row = {"m": m, "k": k, "n": n, "int4_us": t4 * 1e3, "gbs": gbs, "pct": 100 * gbs / args.peak,
           "fp16_us": t16 * 1e3, "fp16_gbs": dense_copies[0].nbytes / (t16 * 1e-3) / 1e9, "speedup": t16 / t4,
           "error": error, "plan": f"{decision.kernel}: {decision.plan_summary} {decision.plan_record}",
           "fp16_plan": f"{dense_decision.kernel}: {dense_decision.plan_summary}"}
    if args.grids:
        row["grids"] = time_grids(x, int4_copies, attrs, inner, args)
    if args.tune:
        # The grid autotuning picks (every tactic timed at plan time: Note [Tactics]), timed the same way.
        tuned = {"matmul_nbits": "auto:BestPerformance"}
        (_,), tuned_decision = xrt.ops.call("matmul_nbits", [x, *int4_copies[0]], attrs, policy=tuned,
                                            return_decision=True)
        row["tuned_us"] = graph_ms(int4_cycle(x, int4_copies, attrs, inner, tuned), args.iters) * 1e3
        row["tuned_plan"] = f"{tuned_decision.plan_record} ({tuned_decision.reason})"
    return row


GRIDS = [({"splits": splits, "tiles": tiles}, f"{tiles}x{splits}") for tiles in (4, 2, 1) for splits in (1, 2, 4)]
GRIDS += [({"kernel": "stream", "splits": splits, "tiles": tiles}, f"s{tiles}x{splits}")
          for tiles in (4, 2) for splits in (1, 2, 4)]
GRIDS += [({"kernel": "gemv", "splits": splits, "tiles": 2}, f"g2x{splits}") for splits in (1, 2, 4)]
GRIDS += [({"kernel": "stream", "ring": 8192, "splits": splits, "tiles": 4}, f"s4x{splits}r") for splits in (1, 2)]
GRIDS += [({"kernel": "stream", "splits": splits, "staging": staging, "tiles": tiles}, f"s{tiles}x{splits}{suffix}")
          for staging, suffix in (("none", "N"), ("scales", "S"), ("x", "X")) for tiles in (4, 2) for splits in (1, 2)]


def time_grids(x, int4_copies, attrs, inner: int, args) -> dict:
    """Each tensor-core grid (tiles of 8 columns per block, K splits) timed like the default plan: the plan record is
    written into an autotune cache entry for the op's key (made by one autotuned call), which the dispatcher then
    replays (Note [Tactics]). A record the kernel refuses for this shape is rebuilt afresh, and so left out."""
    import json
    import os
    import tempfile
    tuned = {"matmul_nbits": "auto:BestPerformance"}
    previous = xrt.ops.autotune_cache()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        xrt.ops.set_autotune_cache(os.path.join(tmp, "tuned.json"))
        xrt.ops.call("matmul_nbits", [x, *int4_copies[0]], attrs, policy=tuned)
        base = json.loads(xrt.ops.autotune_cache().to_json())
        for grid, name in GRIDS:
            record = json.dumps(grid, separators=(",", ":"))
            for entry in base["entries"].values():
                entry["plan_record"] = record
            path = os.path.join(tmp, f"grid_{name}.json")
            with open(path, "w") as f:
                json.dump(base, f)
            xrt.ops.set_autotune_cache(xrt.AutotuneCache(path, False))
            (_,), decision = xrt.ops.call("matmul_nbits", [x, *int4_copies[0]], attrs, policy=tuned,
                                          return_decision=True)
            if json.loads(decision.plan_record or "{}") != grid:
                continue
            out[name] = graph_ms(int4_cycle(x, int4_copies, attrs, inner, tuned), args.iters) * 1e3
    xrt.ops.set_autotune_cache(previous)
    return out


def table(rows, args, device_name: str) -> str:
    lines = [f"int4 weight-only GEMM (matmul_nbits, cuda_raw) vs float16 linear, {device_name}, block {args.block}, "
             f"float16 x and scales, {datetime.date.today().isoformat()}; per call in a CUDA graph of calls cycling "
             f"through > {args.rotate} MiB of weights (HBM, not L2), median of {args.iters} replays", "",
             "| M | K | N | int4 us | int4 GB/s | % of bandwidth | fp16 linear us | fp16 GB/s | speed-up | max rel diff |"
             + (" tuned us |" if args.tune else ""),
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
             + (" ---: |" if args.tune else "")]
    for r in rows:
        lines.append(f"| {r['m']} | {r['k']} | {r['n']} | {r['int4_us']:.2f} | {r['gbs']:.0f} | {r['pct']:.1f} | "
                     f"{r['fp16_us']:.2f} | {r['fp16_gbs']:.0f} | {r['speedup']:.2f} | {r['error']:.1e} |"
                     + (f" {r['tuned_us']:.2f} |" if args.tune else ""))
    if args.grids:
        lines += ["", "Every grid (tiles x splits: tiles of 8 columns per block, K splits; s: the streaming kernel, "
                  "r: its deep ring, N: nothing staged in shared memory, S: only the scales, X: only x, g: the GEMV "
                  "kernel of m <= 4), us per call:", ""]
        for r in rows:
            grids = ", ".join(f"{g} {t:.2f}" for g, t in sorted(r["grids"].items(), key=lambda item: item[1]))
            lines.append(f"- M={r['m']} K={r['k']} N={r['n']}: {grids}")
    lines += ["", f"GB/s: int4 weight bytes (packed codes + float16 scales) per second; % of {args.peak:.0f} GB/s "
                  f"({args.peak_source}). fp16 GB/s: the float16 weight's bytes.", "", "Plans:", ""]
    seen = set()
    for r in rows:
        for plan in (r["plan"], r["fp16_plan"]):
            line = f"- M={r['m']} K={r['k']} N={r['n']}: `{plan}`"
            if plan not in seen:
                seen.add(plan)
                lines.append(line)
        if args.tune:
            lines.append(f"- M={r['m']} K={r['k']} N={r['n']}, tuned: `{r['tuned_plan']}`")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--shapes", nargs="+", default=[f"{k}x{n}" for k, n in SHAPES], help="KxN, e.g. 4096x11008")
    parser.add_argument("--block", type=int, default=32, help="int4 block size along K (a power of two >= 16)")
    parser.add_argument("--iters", type=int, default=20, help="timed graph replays per measurement")
    parser.add_argument("--inner", type=int, default=20, help="calls per graph (at least one per weight copy)")
    parser.add_argument("--rotate", type=int, default=256, help="MiB of weight copies each measurement cycles through")
    parser.add_argument("--peak", type=float, default=0.0,
                        help="the GPU's memory bandwidth in GB/s (default: its copy bandwidth, measured)")
    parser.add_argument("--tune", action="store_true",
                        help="also time the grid auto:BestPerformance picks (column 'tuned us')")
    parser.add_argument("--grids", action="store_true",
                        help="also time every tensor-core grid (tiles per block x K splits) of each shape")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    if xrt.get_device_count() == 0:
        print(f"bench_int4_gemm needs a CUDA device: {xrt.runtime.cuda_unavailable_reason()}", file=sys.stderr)
        return 1
    args.peak_source = "given"
    if args.peak <= 0:
        ceilings = xrt.Profiler().ceilings("cuda:0")
        args.peak = ceilings["bandwidth"] / 1e9
        args.peak_source = f"the copy bandwidth, {ceilings['source'].get('bandwidth', 'measured')}"
    print(f"bandwidth for %: {args.peak:.0f} GB/s ({args.peak_source})", file=sys.stderr, flush=True)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    rows, cache = [], {}
    for k, n in shapes:
        for m in args.m:
            rows.append(run_shape(m, k, n, args, cache))
            r = rows[-1]
            tuned = f", tuned {r['tuned_us']:.2f} us {r['tuned_plan']}" if args.tune else ""
            print(f"M={m} K={k} N={n}: int4 {r['int4_us']:.2f} us ({r['pct']:.1f}%) {r['plan']}, "
                  f"fp16 {r['fp16_us']:.2f} us{tuned}", file=sys.stderr, flush=True)
    info = xrt.runtime.get_device_info(xrt.Device("cuda:0"))
    text = table(rows, args, getattr(info, "name", "cuda:0"))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
