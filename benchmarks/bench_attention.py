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

The bias cases (BIAS_CASES: relative-position tables, per-batch position biases, key biases, a bias with the causal
rule; float16, odd lengths such as Swin's 49) pass an additive bias of a broadcast shape as the op's mask and time:
  xpuruntime flash_v2 / cudnn / unfused   xrt.ops.attention(q, k, v, bias, ...) pinned to each kernel
  torch sdpa attn_mask  F.scaled_dot_product_attention(q, k, v, attn_mask=bias) as torch dispatches it (the causal
                        rule folded into the bias: SDPA takes attn_mask or is_causal, not both)
  torch efficient / cudnn  the same under SDPBackend.EFFICIENT_ATTENTION / CUDNN_ATTENTION
  torch eager chain     softmax(q @ k^T * scale + bias) @ v as eager PyTorch writes it (the unfused chain)
  torch compile chain   that chain under torch.compile (skipped with --no-compile)
with the ratio taken to "torch sdpa attn_mask".

    python3 benchmarks/bench_attention.py --out attention.md
    python3 benchmarks/bench_attention.py --cases bias --out attention_bias.md
    python3 benchmarks/bench_attention.py --cases decode --out attention_decode.md   # DECODE_CASES: flash_decode
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


# (label, batch, heads, seq, head_dim, bias shape with B/H/S as letters, causal): the models that add terms to the
# scores (Note [Attention with additive terms] in fusion_transformer.cpp).
BIAS_CASES = [
    ("swin window, rel-pos table", 512, 4, 49, 32, "1HSS", False),   # Swin-T stage 1 at batch 8 (64 windows each)
    ("window D64, rel-pos table", 512, 4, 49, 64, "1HSS", False),    # the same windows at a head dim flash_v2 runs
    ("t5/deberta position bias", 16, 12, 512, 64, "BHSS", False),    # a computed [B, H, S, S] bias
    ("key bias", 16, 12, 512, 64, "111S", False),
    ("alibi causal", 4, 16, 2048, 128, "1HSS", True),
    ("clip text 77, [S, S]", 64, 8, 77, 64, "SS", True),
]


# (label, batch, heads, kv heads, keys, head_dim): decode steps (one query row per head against a cache, a padding
# mask [B, 1, 1, Sk] as decoders feed it), where flash_decode splits the keys (Note [Split-K decode attention]).
DECODE_CASES = [
    ("1B Llama decode", 1, 32, 8, 576, 64),
    ("1B Llama decode", 8, 32, 8, 576, 64),
    ("1B Llama decode", 64, 32, 8, 576, 64),
    ("8B Llama decode, long cache", 1, 32, 8, 4096, 128),
    ("8B Llama decode, long cache", 16, 32, 8, 4096, 128),
    ("MQA decode", 1, 32, 1, 2048, 128),
]


def bias_shape(letters: str, batch: int, heads: int, seq: int) -> tuple:
    return tuple({"B": batch, "H": heads, "S": seq, "1": 1}[c] for c in letters)


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


def reference_with_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """float32 math SDPA with an additive 4-d `bias` (its batch dim 1 or B), one batch element at a time."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    with sdpa_kernel(SDPBackend.MATH):
        for b in range(q.shape[0]):
            mask = bias[b : b + 1] if bias.shape[0] > 1 else bias
            out[b : b + 1] = F.scaled_dot_product_attention(q[b : b + 1].float(), k[b : b + 1].float(),
                                                            v[b : b + 1].float(), attn_mask=mask.float())
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


def xrt_attention_bias(kernel: str, q, k, v, bias, causal: bool) -> Callable[[], object]:
    policy = xrt.KernelPolicy(attention=f"pin:{kernel}")
    qx, kx, vx, bx = xrt.from_dlpack(q), xrt.from_dlpack(k), xrt.from_dlpack(v), xrt.from_dlpack(bias)
    stream = torch.cuda.current_stream()

    def run():
        return xrt.ops.attention(qx, kx, vx, bx, causal=causal, policy=policy, stream=stream)
    return run


def eager_chain(q, k, v, bias) -> torch.Tensor:
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5) + bias
    return torch.softmax(scores, dim=-1) @ v


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


def run_decode_cases(args, device: torch.device, names: set) -> list:
    """The DECODE_CASES rows: xpuruntime's kernels (flash_decode, flash_v2, cudnn) pinned, against torch's SDPA with
    enable_gqa as torch dispatches it; float16, a padding mask with the first 7 keys of row 0 masked; the K/V bytes
    read over the time in the TFLOP/s column (GB/s: measure() is given 1e3 x the bytes as its FLOPs); ratio = torch
    sdpa time / time."""
    results = []
    for label, batch, heads, kv_heads, keys, dim in DECODE_CASES:
        q = torch.randn((batch, heads, 1, dim), dtype=torch.float16, device=device)
        k = torch.randn((batch, kv_heads, keys, dim), dtype=torch.float16, device=device)
        v = torch.randn((batch, kv_heads, keys, dim), dtype=torch.float16, device=device)
        mask = torch.zeros((batch, 1, 1, keys), dtype=torch.float16, device=device)
        mask[0, :, :, :7] = float("-inf")
        group = heads // kv_heads
        ref = reference_with_bias(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask)
        bytes_read = 2.0 * k.numel() * k.element_size()
        rows = []
        for kernel in ("flash_decode", "flash_v2", "cudnn"):
            row_label = f"xpuruntime {kernel}"
            if kernel not in names:
                rows.append({"impl": row_label, "ms": None, "tflops": None, "err": None,
                             "note": f"no '{kernel}' kernel in this build"})
                continue
            rows.append(measure(row_label, lambda kernel=kernel: xrt_attention_bias(kernel, q, k, v, mask, False),
                                ref, bytes_read * 1e3, args))
        rows.append(measure("torch sdpa", lambda: lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=True), ref, bytes_read * 1e3, args))
        baseline = next((r["ms"] for r in rows if r["impl"] == "torch sdpa"), None)
        for row in rows:
            row["case"] = f"{label}: B{batch} H{heads} Hkv{kv_heads} Sk{keys} D{dim} fp16 (GB/s column)"
            row["ratio"] = baseline / row["ms"] if baseline and row["ms"] else None
            results.append(row)
            print(row, flush=True)
        del q, k, v, mask, ref
        torch.cuda.empty_cache()
    return results


def run_bias_cases(args, device: torch.device, names: set) -> list:
    """The BIAS_CASES rows: xpuruntime's kernels with the bias as the op's mask against torch's SDPA with attn_mask,
    the eager chain and its torch.compile; ratio = torch sdpa attn_mask time / time."""
    results = []
    compiled = None if args.no_compile else torch.compile(eager_chain)
    for label, batch, heads, seq, dim, letters, causal in BIAS_CASES:
        shape = (batch, heads, seq, dim)
        q = torch.randn(shape, dtype=torch.float16, device=device)
        k = torch.randn(shape, dtype=torch.float16, device=device)
        v = torch.randn(shape, dtype=torch.float16, device=device)
        bias = torch.randn(bias_shape(letters, batch, heads, seq), dtype=torch.float16, device=device)
        # What torch is given: the bias with the causal rule folded in (-inf after each query), broadcast to 4-d.
        full = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        if causal:
            future = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)
            full = full.masked_fill(future, float("-inf"))
        ref = reference_with_bias(q, k, v, full)
        flops = 4.0 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
        rows = []
        for kernel in ("flash_v2", "cudnn", "unfused"):
            row_label = f"xpuruntime {kernel}"
            if kernel not in names:
                rows.append({"impl": row_label, "ms": None, "tflops": None, "err": None,
                             "note": f"no '{kernel}' kernel in this build"})
                continue
            rows.append(measure(row_label, lambda kernel=kernel: xrt_attention_bias(kernel, q, k, v, bias, causal),
                                ref, flops, args))
        rows.append(measure("torch sdpa attn_mask", lambda: lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=full), ref, flops, args))
        for row_label, backend in (("torch efficient", SDPBackend.EFFICIENT_ATTENTION),
                                   ("torch cudnn", SDPBackend.CUDNN_ATTENTION)):
            rows.append(measure(row_label, lambda: lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=full),
                                ref, flops, args, context=lambda backend=backend: sdpa_kernel(backend)))
        rows.append(measure("torch eager chain", lambda: lambda: eager_chain(q, k, v, full), ref, flops, args))
        if compiled is not None:
            rows.append(measure("torch compile chain", lambda: lambda: compiled(q, k, v, full), ref, flops, args))
        baseline = next((r["ms"] for r in rows if r["impl"] == "torch sdpa attn_mask"), None)
        for row in rows:
            row["case"] = (f"{label}: B{batch} H{heads} S{seq} D{dim} fp16 bias{list(bias.shape)}"
                           f"{' causal' if causal else ''}")
            row["ratio"] = baseline / row["ms"] if baseline and row["ms"] else None
            results.append(row)
            print(row, flush=True)
        del q, k, v, bias, full, ref
        torch.cuda.empty_cache()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--iters", type=int, default=30, help="timed samples per measurement (median kept)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before timing")
    parser.add_argument("--repeat", type=int, default=0,
                        help="calls per timed sample (default: 1 for the long cases, 20 for the short ones)")
    parser.add_argument("--cases", choices=("all", "plain", "bias", "decode"), default="all",
                        help="the plain cases, the bias cases (BIAS_CASES), the decode steps (DECODE_CASES), or all")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row of the bias cases")
    args = parser.parse_args()

    if not torch.cuda.is_available() or xrt.get_device_count() == 0:
        print("bench_attention needs a CUDA GPU visible to both torch and xpuruntime", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    device = torch.device("cuda:0")
    names = {info.name for info in xrt.kernels("attention")}

    results = []
    for batch, heads, seq, dim, causal in CASES if args.cases in ("all", "plain") else []:
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

    if args.cases in ("all", "bias"):
        results.extend(run_bias_cases(args, device, names))
    if args.cases in ("all", "decode"):
        results.extend(run_decode_cases(args, device, names))

    def cell(value: Optional[float], fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    gpu = torch.cuda.get_device_name(device)
    lines = [f"Attention forward, {gpu}, torch {torch.__version__}, xpuruntime {xrt.__version__}, "
             f"{datetime.date.today().isoformat()}; median of {args.iters} samples; ratio = torch flash time / "
             f"time (> 1 is faster; bias cases: torch sdpa attn_mask time / time); max err = max |out - fp32 reference|", "",
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
