"""The GPU kernels of one linear training step (forward + backward), PyTorch's own against the routed call.

For each case it runs `--steps` steps of `F.linear(x, w, b)` followed by a backward of a fixed gradient under
torch.profiler (CUDA activity only), once with PyTorch's default GEMM, once with
`preferred_blas_library("cublaslt")` and once routed by `xpuruntime.pytorch.set_kernel_policy(matmul="pin:cublasLt")`,
and prints every kernel with its count and mean time per launch. It shows where the routed backward's time goes:
the same GEMM kernels, and the bias gradient summed by cuBLASLt's BGRADB epilogue (`globalKernelBgradAB`) where
PyTorch launches a separate reduction (`reduce_kernel`).

    python3 benchmarks/torch_routing_kernels.py --cases 16384x1024x1024,512x1024x1024
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import xpuruntime as xrt
import xpuruntime.pytorch as xrt_torch


def kernels_of_steps(step, steps: int) -> List[tuple]:
    """(name, launches, mean us) of every GPU kernel `steps` calls of `step` ran, longest total first."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    return [(e.key, e.count, e.device_time_total / e.count) for e in events]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="16384x1024x1024,512x1024x1024,8192x4096x4096",
                        help="comma-separated MxKxN")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or xrt.get_device_count() == 0:
        print("torch_routing_kernels: needs a CUDA device visible to both PyTorch and xpuruntime", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    print(f"GPU kernels of {args.steps} linear training steps, {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}, {args.dtype}, {datetime.date.today()}; us per launch\n")
    print("| case | impl | kernel | launches per step | us per launch |")
    print("| --- | --- | --- | ---: | ---: |")
    gen = torch.Generator("cuda").manual_seed(0)
    for case in args.cases.split(","):
        m, k, n = (int(v) for v in case.split("x"))
        x = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen).requires_grad_()
        w = (torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k ** 0.5).requires_grad_()
        b = torch.randn(n, device="cuda", dtype=dtype, generator=gen).requires_grad_()
        g = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)

        def step():
            torch.autograd.backward(F.linear(x, w, b), g)
            x.grad = w.grad = b.grad = None

        for impl in ("torch", "torch cublaslt", "routed cublasLt"):
            previous = torch.backends.cuda.preferred_blas_library()
            torch.backends.cuda.preferred_blas_library("cublaslt" if impl == "torch cublaslt" else "cublas")
            if impl.startswith("routed"):
                xrt_torch.set_kernel_policy(matmul="pin:cublasLt")
            try:
                rows = kernels_of_steps(step, args.steps)
            finally:
                xrt_torch.set_kernel_policy(None)
                torch.backends.cuda.preferred_blas_library(previous)
            for name, count, mean in rows:
                print(f"| M{m} K{k} N{n} | {impl} | {name[:90]} | {count / args.steps:g} | {mean:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
