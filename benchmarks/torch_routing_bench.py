"""Routed kernels inside PyTorch against PyTorch's own backends: attention and linear, forward and forward+backward.

For each case it times, on torch's current stream with CUDA events:

  attention   torch default       F.scaled_dot_product_attention with PyTorch's own backend choice (cuDNN attention
                                  on Hopper; no routing)
              torch flash         the same call under SDPBackend.FLASH_ATTENTION
              routed cudnn        the same call under xpuruntime.pytorch.set_kernel_policy(attention="pin:cudnn"):
                                  xpuruntime's cudnn kernel (cuDNN's fused attention through its graph API) forward
                                  with the log-sum-exp; backward = PyTorch's cuDNN attention backward on the
                                  forward's output and log-sum-exp (xpuruntime has no attention backward kernel)
              routed flash_v2     the same call under attention="pin:flash_v2": xpuruntime's flash_v2 forward with
                                  the log-sum-exp; backward = PyTorch's FlashAttention backward on them
              routed torch        the same call under attention="pin:torch": the policy names PyTorch's own dispatch,
                                  and the routed call costs only the routing mode's (native) host path
              routed auto         the same call under attention="auto:BestPerformance": xpuruntime's attention
                                  kernels and PyTorch's SDPA backends timed on the call's shapes, the fastest kept
                                  (PyTorch's only when faster by more than a 5% margin)
  linear      torch               F.linear (PyTorch's default GEMM library)
              torch cublaslt      F.linear with torch.backends.cuda.preferred_blas_library("cublaslt")
              routed cublasLt     F.linear under set_kernel_policy(matmul="pin:cublasLt"): xpuruntime's cuBLASLt plan
                                  (the heuristic's first algorithm), outputs and workspace from torch's allocator
              routed auto         F.linear under set_kernel_policy(matmul="auto:BestPerformance"): xpuruntime's
                                  GEMM kernels and cuBLASLt's algorithms (tactics) timed on the call's shapes, the
                                  fastest kept (forward and each backward GEMM on their own shapes)

"fwd" runs the call without autograd; "fwd+bwd" runs it on inputs that require grad and back-propagates a fixed
gradient. Each sample is `--repeat` back-to-back calls between two events (host overhead hides behind the GPU unless
the kernels are shorter than the Python path); the table shows the median of `--iters` samples after `--warmup` calls
(the implementations of a case are sampled in blocks of 5 taken in turn, so that falling GPU clocks weigh the same on
each), TFLOP/s (attention: 4*B*H*S*S*D forward, 2.5x that for the backward, halved when causal; linear: 2*M*K*N
forward, 3x for fwd+bwd), the ratio to the first (PyTorch) row of the case, and the largest difference of the output
from that row. The small cases are also timed as CUDA graph replays ("(graph)": the same calls captured with
torch.cuda.graph, routed ones included), which leaves the GPU work alone, without either side's host overhead. A last
section times tiny calls, where the routed path's host overhead shows.

    python3 benchmarks/torch_routing_bench.py --out torch_routing.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import sys
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xrt_torch
from timing import torch_graph

ATTENTION_CASES = [  # (batch, heads, seq, head_dim, causal)
    (8, 16, 4096, 128, False),
    (8, 16, 4096, 128, True),
    (16, 16, 1024, 64, True),
    (32, 16, 256, 64, False),
]
#: Small cases, also timed as CUDA graph replays: the GPU work alone, without either side's host overhead.
GRAPHED_CASES = [(32, 16, 256, 64, False), (512, 1024, 1024)]
LINEAR_CASES = [  # (tokens M, in K, out N)
    (8192, 4096, 4096),
    (4096, 4096, 11008),
    (16384, 1024, 1024),
    (512, 1024, 1024),
]


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """The replay of ``fn`` captured into a CUDA graph. Routed calls are captured like any torch call: their kernels
    run on torch's current stream."""
    return torch_graph(fn).replay


def interleaved_ms(timed: List[Tuple[Callable, Callable[[], object]]], warmup: int, iters: int, repeat: int,
                   block: int = 5) -> List[float]:
    """Median milliseconds per call of each (context, fn) in `timed`, sampled in blocks taken in turn: `block`
    samples of every fn (inside its context, after one untimed call) before the next block of any, so that the
    GPU's clocks (which fall under sustained load) and other drift of the machine weigh the same on every
    implementation, while each block still measures a warm steady state. A sample is `repeat` back-to-back calls
    between CUDA events."""
    for context, fn in timed:
        with context():
            for _ in range(warmup):
                fn()
    torch.cuda.synchronize()
    samples: List[List[float]] = [[] for _ in timed]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while len(samples[0]) < iters:
        for j, (context, fn) in enumerate(timed):
            with context():
                fn()  # untimed: the first call after entering a context may do per-entry work
                for _ in range(min(block, iters - len(samples[j]))):
                    start.record()
                    for _ in range(repeat):
                        fn()
                    stop.record()
                    stop.synchronize()
                    samples[j].append(start.elapsed_time(stop) / repeat)
    return [statistics.median(s) for s in samples]


@contextlib.contextmanager
def routed(**rules):
    scope = xrt_torch.set_kernel_policy(**rules)
    try:
        yield scope
    finally:
        xrt_torch.set_kernel_policy(None)


def attention_impls():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return [("torch default", contextlib.nullcontext),
            ("torch flash", lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])),
            ("routed cudnn", lambda: routed(attention="pin:cudnn")),
            ("routed flash_v2", lambda: routed(attention="pin:flash_v2")),
            ("routed torch", lambda: routed(attention="pin:torch")),
            ("routed auto", lambda: routed(attention="auto:BestPerformance"))]


def linear_impls():
    @contextlib.contextmanager
    def blas(name):
        previous = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(name)
        try:
            yield
        finally:
            torch.backends.cuda.preferred_blas_library(previous)

    return [("torch", contextlib.nullcontext), ("torch cublaslt", lambda: blas("cublaslt")),
            ("routed cublasLt", lambda: routed(matmul="pin:cublasLt")),
            ("routed auto", lambda: routed(matmul="auto:BestPerformance"))]


def run_case(kind: str, case: tuple, dtype: torch.dtype, args) -> List[Tuple]:
    gen = torch.Generator("cuda").manual_seed(0)
    if kind == "attention":
        b, h, s, d, causal = case
        inputs = [torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3)]
        call = lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal)  # noqa: E731
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        name = f"B{b} H{h} S{s} D{d}{' causal' if causal else ''}"
        impls = attention_impls()
        bwd_factor = 2.5
    else:
        m, k, n = case
        inputs = [torch.randn(m, k, device="cuda", dtype=dtype, generator=gen) / k ** 0.5,
                  torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k ** 0.5,
                  torch.randn(n, device="cuda", dtype=dtype, generator=gen)]
        call = F.linear
        flops = 2 * m * k * n
        name = f"M{m} K{k} N{n}"
        impls = linear_impls()
        bwd_factor = 2.0
    grads_in = [t.detach().clone().requires_grad_() for t in inputs]
    out_grad = torch.randn(call(*inputs).shape, device="cuda", dtype=dtype, generator=gen)
    rows = []
    modes = ["fwd", "fwd+bwd"] + (["fwd (graph)", "fwd+bwd (graph)"] if case in GRAPHED_CASES else [])
    for mode in modes:
        # Each implementation's output, decision note and timed callable (a graph replay for "(graph)"), then all
        # of them timed in turn (interleaved_ms).
        outs: dict = {}
        notes: dict = {}
        errors: dict = {}
        timed: list = []
        for impl, context in impls:
            with context() as scope:
                fn = _step(call, inputs, grads_in, out_grad, mode)
                try:
                    outs[impl] = fn().detach().float()
                    if mode.endswith("(graph)"):
                        timed.append((impl, contextlib.nullcontext, graphed(fn)))
                    else:
                        timed.append((impl, context, fn))
                except (RuntimeError, xrt.XpuRuntimeError) as error:
                    errors[impl] = str(error).split("\n")[0][:80]
                    continue
                if scope is not None and hasattr(scope, "log"):
                    kernels = scope.log.kernels(None)
                    notes[impl] = ", ".join(f"{op}: {'/'.join(k)}" for op, k in kernels.items())
        times = dict(zip([t[0] for t in timed], interleaved_ms([(c, f) for _, c, f in timed], args.warmup,
                                                                args.iters, args.repeat)))
        baseline_ms: Optional[float] = None
        baseline_out: Optional[torch.Tensor] = None
        total = flops * (1 + bwd_factor if mode.startswith("fwd+bwd") else 1)
        for impl, _ in impls:
            if impl in errors:
                rows.append((kind, name, mode, impl, None, None, None, None, errors[impl]))
                continue
            ms, out = times[impl], outs[impl]
            if baseline_ms is None:
                baseline_ms, baseline_out = ms, out
            err = (out - baseline_out).abs().max().item()
            rows.append((kind, name, mode, impl, ms, total / ms / 1e9, baseline_ms / ms, err, notes.get(impl, "")))
    return rows


def _step(call, inputs, grads_in, out_grad, mode: str) -> Callable[[], torch.Tensor]:
    """One timed call: forward without autograd, or forward + backward of a fixed gradient (grads cleared)."""
    if mode.startswith("fwd+bwd"):
        def fn():
            out = call(*grads_in)
            torch.autograd.backward(out, out_grad)
            for t in grads_in:
                t.grad = None
            return out
    else:
        def fn():
            with torch.no_grad():
                return call(*inputs)
    return fn


def overhead_rows(args) -> List[Tuple]:
    """Tiny calls: the host cost of the routed path (custom op, decision lookup, DLPack, C++ call)."""
    rows = []
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    impls = [("torch", contextlib.nullcontext), ("routed cublasLt", lambda: routed(matmul="pin:cublasLt"))]
    def call():
        with torch.no_grad():
            return F.linear(a, w)

    times = interleaved_ms([(context, call) for _, context in impls], args.warmup, args.iters, args.repeat)
    for (impl, _), ms in zip(impls, times):
        rows.append(("overhead", "M64 K64 N64 (host-bound)", "fwd", impl, ms, None, None, None, "per call"))
    return rows


def render(rows: List[Tuple], dtype: torch.dtype) -> str:
    gpu = torch.cuda.get_device_name()
    lines = [f"Routed kernels vs PyTorch's own, {gpu}, torch {torch.__version__}, xpuruntime {xrt.__version__}, "
             f"{str(dtype).replace('torch.', '')}, {datetime.date.today()}; median ms per call; "
             "ratio = PyTorch time / time (> 1 is faster)", "",
             "| op | case | pass | impl | ms | TFLOP/s | vs PyTorch | max abs diff | note |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for kind, name, mode, impl, ms, tflops, ratio, err, note in rows:
        fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
        lines.append(f"| {kind} | {name} | {mode} | {impl} | {fmt(ms, '.3f')} | {fmt(tflops, '.1f')} | "
                     f"{fmt(ratio, '.2f')} | {fmt(err, '.2e')} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--only", choices=["attention", "linear"], default=None)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or xrt.get_device_count() == 0:
        print("torch_routing_bench: needs a CUDA device visible to both PyTorch and xpuruntime", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    rows: List[Tuple] = []
    if args.only in (None, "attention"):
        for case in ATTENTION_CASES:
            rows += run_case("attention", case, dtype, args)
    if args.only in (None, "linear"):
        for case in LINEAR_CASES:
            rows += run_case("linear", case, dtype, args)
    rows += overhead_rows(args)
    table = render(rows, dtype)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
