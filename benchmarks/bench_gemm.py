"""Square GEMM throughput of xpuruntime's cublasLt and cublas kernels against torch.matmul, and the per-call
dispatch overhead of tiny ops.

For each size n (default 1024, 4096, 8192) and dtype (bf16, fp16), C[n, n] = A[n, n] @ B[n, n] is timed as
  xpuruntime cublasLt   xrt.ops.matmul(a, b, policy=KernelPolicy(matmul="pin:cublasLt"))
  xpuruntime cublas     the same pinned to "cublas"
  torch                 torch.matmul(a, b)
on torch tensors passed zero-copy (xrt.from_dlpack, converted once), all on torch's current stream, with CUDA
events after a warm-up. Three timings per row, each the median over --iters repetitions:
  call     one call between two events: includes the Python -> C++ dispatch of that call (when the GPU is
           idle the launch latency shows; for large n the kernel dominates)
  loop     --inner calls back to back between two events, divided by --inner: the GPU queue stays full, so
           this is the kernel time unless the host cannot keep up
  graph    --inner calls captured once into a CUDA graph (xrt.runtime.graph / torch.cuda.graph), replayed
           between two events, divided by --inner: the kernel time without any host overhead
TFLOP/s = 2 n^3 / time (from the "loop" time); "vs torch" = torch's loop time / ours (> 1: we are faster).

Dispatch overhead: wall-clock microseconds per call of a tiny op from Python (1-element xrt.ops.add, a 1x1
xrt.ops.matmul pinned to each kernel), against torch's own (torch.add, torch.matmul), --tiny-iters calls back
to back, then one synchronize.

Prints a markdown table and writes it to --out.

    python benchmarks/bench_gemm.py --out gemm.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import torch

import xpuruntime as xrt
from timing import best_us, torch_graph

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def median_ms(fn, iters: int, warmup: int) -> float:
    """Median over `iters` of the milliseconds `fn()` takes between two events on the current stream."""
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for j in range(iters):
        start[j].record()
        fn()
        end[j].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def graph_ms_xrt(fn, inner: int, iters: int) -> float:
    """Per-call milliseconds of `inner` calls of `fn` captured into one xpuruntime CUDA graph."""
    fn()  # plans, cuBLAS handles and allocator blocks exist before the capture
    torch.cuda.synchronize()
    stream = xrt.runtime.Stream(xrt.Device("cuda:0"))
    graph = xrt.runtime.CudaGraph()
    with xrt.runtime.graph(graph, stream=stream):
        for _ in range(inner):
            fn()
    graph.replay(stream)
    stream.synchronize()
    times = []
    for _ in range(iters):
        begin = xrt.runtime.Event(xrt.Device("cuda:0"), enable_timing=True)
        done = xrt.runtime.Event(xrt.Device("cuda:0"), enable_timing=True)
        begin.record(stream)
        graph.replay(stream)
        done.record(stream)
        done.synchronize()
        times.append(begin.elapsed_time(done) / inner)
    return statistics.median(times)


def graph_ms_torch(fn, inner: int, iters: int) -> float:
    """Per-call milliseconds of `inner` calls of `fn` captured into one torch CUDA graph."""
    graph = torch_graph(fn, inner)
    graph.replay()
    torch.cuda.synchronize()
    return median_ms(graph.replay, iters, warmup=1) / inner


def gemm_rows(sizes, dtypes, iters: int, warmup: int, inner: int, use_graphs: bool) -> list[dict]:
    rows = []
    for name in dtypes:
        dtype = DTYPES[name]
        for n in sizes:
            torch.manual_seed(0)
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            xa, xb = xrt.from_dlpack(a), xrt.from_dlpack(b)
            reference = torch.matmul(a, b).float()
            impls = {
                "xpuruntime cublasLt": lambda: xrt.ops.matmul(xa, xb, policy=LT_POLICY),
                "xpuruntime cublas": lambda: xrt.ops.matmul(xa, xb, policy=BLAS_POLICY),
                "torch.matmul": lambda: torch.matmul(a, b),
            }
            flops = 2.0 * n ** 3
            torch_loop = None
            for impl, fn in impls.items():
                result = fn()
                out = result if isinstance(result, torch.Tensor) else torch.from_dlpack(result)
                error = ((out.float() - reference).abs().max() / reference.abs().max()).item()
                detail = ""
                if not impl.startswith("torch"):
                    _, decision = xrt.ops.matmul(xa, xb, policy=LT_POLICY if "Lt" in impl else BLAS_POLICY,
                                                 return_decision=True)
                    detail = decision.plan_summary
                call = median_ms(fn, iters, warmup)
                loop = median_ms(lambda: [fn() for _ in range(inner)], max(3, iters // 4), 1) / inner
                if use_graphs:
                    graph = graph_ms_torch(fn, inner, max(3, iters // 4)) if impl.startswith("torch") else \
                        graph_ms_xrt(fn, inner, max(3, iters // 4))
                else:
                    graph = float("nan")
                if impl.startswith("torch"):
                    torch_loop = loop
                rows.append({"dtype": name, "n": n, "impl": impl, "call_ms": call, "loop_ms": loop,
                             "graph_ms": graph, "tflops": flops / (loop * 1e-3) / 1e12, "error": error,
                             "plan": detail})
            for row in rows:
                if row["dtype"] == name and row["n"] == n:
                    row["vs_torch"] = torch_loop / row["loop_ms"]
            del a, b, xa, xb, reference
            torch.cuda.empty_cache()
    return rows


def per_call_us(fn, iters: int) -> float:
    return best_us(fn, iters, repeats=5, warmup=max(10, iters // 10), sync=torch.cuda.synchronize)


def overhead_rows(iters: int) -> list[dict]:
    one_a = torch.ones(1, device="cuda")
    one_b = torch.ones(1, device="cuda")
    xa, xb = xrt.from_dlpack(one_a), xrt.from_dlpack(one_b)
    m_a = torch.ones(1, 1, device="cuda", dtype=torch.float16)
    m_b = torch.ones(1, 1, device="cuda", dtype=torch.float16)
    xm_a, xm_b = xrt.from_dlpack(m_a), xrt.from_dlpack(m_b)
    cases = [
        ("add, 1 element (fp32)", "xpuruntime xrt.ops.add", lambda: xrt.ops.add(xa, xb)),
        ("add, 1 element (fp32)", "torch.add", lambda: torch.add(one_a, one_b)),
        ("matmul 1x1 (fp16)", "xpuruntime cublasLt", lambda: xrt.ops.matmul(xm_a, xm_b, policy=LT_POLICY)),
        ("matmul 1x1 (fp16)", "xpuruntime cublas", lambda: xrt.ops.matmul(xm_a, xm_b, policy=BLAS_POLICY)),
        ("matmul 1x1 (fp16)", "xpuruntime default policy", lambda: xrt.ops.matmul(xm_a, xm_b)),
        ("matmul 1x1 (fp16)", "torch.matmul", lambda: torch.matmul(m_a, m_b)),
    ]
    return [{"op": op, "impl": impl, "us_per_call": per_call_us(fn, iters)} for op, impl, fn in cases]


def table(gemm: list[dict], overhead: list[dict], device_name: str, args) -> str:
    lines = [f"GEMM C[n,n] = A[n,n] @ B[n,n], {device_name}, torch {torch.__version__}, "
             f"{datetime.date.today().isoformat()}; medians of {args.iters} (call) / {max(3, args.iters // 4)} "
             f"(loop, graph: {args.inner} calls each) repetitions", "",
             "| dtype | n | implementation | call ms | loop ms/call | graph ms/call | TFLOP/s (loop) | vs torch | "
             "max rel err vs torch |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in gemm:
        lines.append(f"| {r['dtype']} | {r['n']} | {r['impl']} | {r['call_ms']:.4f} | {r['loop_ms']:.4f} | "
                     f"{r['graph_ms']:.4f} | {r['tflops']:.1f} | {r['vs_torch']:.3f} | {r['error']:.2e} |")
    plans = [(r["dtype"], r["n"], r["impl"], r["plan"]) for r in gemm if r["plan"]]
    if plans:
        lines += ["", "Plans chosen:", ""]
        lines += [f"- {d} n={n} {impl}: `{plan}`" for d, n, impl, plan in plans]
    lines += ["", f"Dispatch overhead, wall-clock microseconds per call from Python (best of 5 x {args.tiny_iters} "
                  "calls, then one synchronize)", "",
              "| op | implementation | us/call |", "| --- | --- | ---: |"]
    for r in overhead:
        lines.append(f"| {r['op']} | {r['impl']} | {r['us_per_call']:.2f} |")
    return "\n".join(lines) + "\n"


LT_POLICY = None
BLAS_POLICY = None


def main() -> int:
    global LT_POLICY, BLAS_POLICY
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=sorted(DTYPES))
    parser.add_argument("--iters", type=int, default=50, help="timed repetitions per measurement")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--inner", type=int, default=20, help="calls per loop / per graph replay")
    parser.add_argument("--tiny-iters", type=int, default=2000, help="calls per dispatch-overhead measurement")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA graph timings")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()

    if not torch.cuda.is_available() or xrt.get_device_count() == 0:
        print("bench_gemm needs a CUDA device (torch and xpuruntime both see none)", file=sys.stderr)
        return 1
    LT_POLICY = xrt.KernelPolicy(matmul="pin:cublasLt")
    BLAS_POLICY = xrt.KernelPolicy(matmul="pin:cublas")
    # Run xpuruntime's ops on torch's current stream, so that torch's events time them.
    xrt.runtime.set_current_stream(xrt.runtime.Stream.from_handle(torch.cuda.current_stream().cuda_stream,
                                                                  xrt.Device("cuda:0")))
    gemm = gemm_rows(args.sizes, args.dtypes, args.iters, args.warmup, args.inner, not args.no_graphs)
    overhead = overhead_rows(args.tiny_iters)
    text = table(gemm, overhead, torch.cuda.get_device_name(0), args)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
