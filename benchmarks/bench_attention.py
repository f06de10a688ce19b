"""Attention forward on a CUDA GPU: xpuruntime's flash_v2, cudnn and unfused kernels against PyTorch's SDPA backends.

For each case (B, H, S, D, bfloat16, causal or not) it times, on torch's current stream with CUDA events:
  xpuruntime flash_v2   xrt.ops.attention(..., policy=KernelPolicy(attention="pin:flash_v2"))
  xpuruntime cudnn      the same pinned to "cudnn" (cuDNN's fused attention through its graph API)
  xpuruntime unfused    the same pinned to "unfused" (cuBLAS GEMM + softmax + GEMM), "n/a" when this build has
                        no such kernel or it cannot run the case
  torch flash           F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.FLASH_ATTENTION)
  torch cudnn           the same under SDPBackend.CUDNN_ATTENTION
The tensors are made by torch and handed to xpuruntime zero-copy through DLPack (xrt.from_dlpack). Each timing
sample is `--repeat` back-to-back calls between two events (so short kernels are not hidden behind Python);
the table shows the median of `--iters` samples after `--warmup` untimed calls, TFLOP/s with
FLOPs = 4 * B * H * Sq * Sk * D (halved when causal), the ratio to torch flash, and the largest absolute
difference from a float32 reference (torch's math SDPA on the upcast inputs, one batch at a time).

    python3 benchmarks/bench_attention.py --out attention.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import sys
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xpuruntime as xrt

CASES = [  # (batch, heads, seq, head_dim, causal)
    (8, 16, 4096, 128, False),
    (8, 16, 4096, 128, True),
    (8, 16, 128, 128, False),
    (8, 16, 128, 128, True),
]


def case_name(batch: int, heads: int, seq: int, dim: int, causal: bool) -> str:
    return f"B{batch} H{heads} S{seq} D{dim} bf16{' causal' if causal else ''}"


def time_ms(fn: Callable[[], object], warmup: int, iters: int, repeat: int) -> float:
    """Median milliseconds per call: `iters` samples of `repeat` back-to-back calls between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / repeat)
    return statistics.median(samples)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """float32 math SDPA, one batch element at a time (the S x S scores of a whole batch can be large)."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    with sdpa_kernel(SDPBackend.MATH):
        for b in range(q.shape[0]):
            out[b : b + 1] = F.scaled_dot_product_attention(q[b : b + 1].float(), k[b : b + 1].float(),
                                                            v[b : b + 1].float(), is_causal=causal)
    return out


def torch_sdpa(q, k, v, causal: bool) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def xrt_attention(kernel: str, q, k, v, causal: bool) -> Callable[[], object]:
    policy = xrt.KernelPolicy(attention=f"pin:{kernel}")
    qx, kx, vx = xrt.from_dlpack(q), xrt.from_dlpack(k), xrt.from_dlpack(v)
    stream = torch.cuda.current_stream()

    def run():
        return xrt.ops.attention(qx, kx, vx, causal=causal, policy=policy, stream=stream)
    return run


def as_torch(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else torch.from_dlpack(out)


def measure(name: str, make: Callable[[], Callable[[], object]], ref: torch.Tensor, flops: float, args,
            context=contextlib.nullcontext) -> dict:
    """Checks and times one implementation; `context` (e.g. a torch SDPA backend choice) is entered once around
    both, so that its cost stays out of the timed calls."""
    row = {"impl": name, "ms": None, "tflops": None, "err": None, "note": ""}
    try:
        with context():
            fn = make()
            out = as_torch(fn())
            torch.cuda.synchronize()
            row["err"] = (out.float() - ref).abs().max().item()
            repeat = args.repeat if args.repeat > 0 else (1 if flops > 1e11 else 20)
            row["ms"] = time_ms(fn, args.warmup, args.iters, repeat)
            row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
    except Exception as error:  # an unsupported case or a missing backend is a table entry, not a crash
        row["note"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        torch.cuda.synchronize()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--iters", type=int, default=30, help="timed samples per measurement (median kept)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before timing")
    parser.add_argument("--repeat", type=int, default=0,
                        help="calls per timed sample (default: 1 for the long cases, 20 for the short ones)")
    args = parser.parse_args()

    if not torch.cuda.is_available() or xrt.get_device_count() == 0:
        print("bench_attention needs a CUDA GPU visible to both torch and xpuruntime", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    device = torch.device("cuda:0")
    names = {info.name for info in xrt.kernels("attention")}

    results = []
    for batch, heads, seq, dim, causal in CASES:
        shape = (batch, heads, seq, dim)
        q = torch.randn(shape, dtype=torch.bfloat16, device=device)
        k = torch.randn(shape, dtype=torch.bfloat16, device=device)
        v = torch.randn(shape, dtype=torch.bfloat16, device=device)
        ref = reference(q, k, v, causal)
        flops = 4.0 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
        rows = []
        for kernel in ("flash_v2", "cudnn", "unfused"):
            label = f"xpuruntime {kernel}"
            if kernel not in names:
                rows.append({"impl": label, "ms": None, "tflops": None, "err": None,
                             "note": f"no '{kernel}' kernel in this build"})
                continue
            rows.append(measure(label, lambda kernel=kernel: xrt_attention(kernel, q, k, v, causal), ref, flops,
                                args))
        torch_backends = (("torch flash", SDPBackend.FLASH_ATTENTION), ("torch cudnn", SDPBackend.CUDNN_ATTENTION))
        for label, backend in torch_backends:
            rows.append(measure(label, lambda: torch_sdpa(q, k, v, causal), ref, flops, args,
                                context=lambda backend=backend: sdpa_kernel(backend)))
        baseline = next((r["ms"] for r in rows if r["impl"] == "torch flash"), None)
        for row in rows:
            row["case"] = case_name(batch, heads, seq, dim, causal)
            row["ratio"] = baseline / row["ms"] if baseline and row["ms"] else None
            results.append(row)
            print(row, flush=True)
        del q, k, v, ref
        torch.cuda.empty_cache()

    def cell(value: Optional[float], fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    gpu = torch.cuda.get_device_name(device)
    lines = [f"Attention forward, {gpu}, torch {torch.__version__}, xpuruntime {xrt.__version__}, "
             f"{datetime.date.today().isoformat()}; median of {args.iters} samples; ratio = torch flash time / "
             f"time (> 1 is faster); max err = max |out - fp32 reference|", "",
             "| case | impl | ms | TFLOP/s | vs torch flash | max abs err | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        lines.append(f"| {r['case']} | {r['impl']} | {cell(r['ms'], '.3f')} | {cell(r['tflops'], '.1f')} | "
                     f"{cell(r['ratio'], '.2f')} | {cell(r['err'], '.2e')} | {r['note']} |")
    table = "\n".join(lines)
    print()
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
