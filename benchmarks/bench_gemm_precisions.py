"""What the GEMMs of a quantized model can gain: torch's float16, float8 and int8 GEMMs at BERT-base's shapes.

For M = 128, 2048 and 8192 (sequence 128 at batch 1, 16 and 64) and the four GEMMs of one BERT-base layer (qkv
2304x768, out 768x768, fc1 3072x768, fc2 768x3072; [M, K] @ [N, K]^T with a bias, float16 output), times
`torch.addmm` in float16, `torch._scaled_mm` in float8e4m3fn without and with `use_fast_accum` (the cuBLASLt call the
native engine's qlinear_fp8 makes, with and without ExecutionPolicy(fp8_fast_accumulation=True)) and `torch._int_mm`
in int8 (int32 output, no epilogue). Each is captured 20 times in a CUDA graph; the figure is the median of 30
replays per call, microseconds. The ratios say what a quantized model's GEMMs can gain over float16 on this device
(docs/benchmarks.md, "Quantized models on the GPU"; docs/quantization.md, "Float8 GEMMs").

    python3 benchmarks/bench_gemm_precisions.py [--m 128,2048,8192]

Needs torch with CUDA on a GPU with float8 tensor cores (sm_89+).
"""

from __future__ import annotations

import argparse

SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]  # (N, K) of one BERT-base layer


def graph_time(torch, fn, reps: int = 20, rounds: int = 30) -> float:
    """Microseconds per call of `fn`: `reps` calls captured in a CUDA graph, the median of `rounds` replays."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def time_shape(torch, m: int, n: int, k: int):
    """(float16, float8, float8 with fast accumulation, int8) microseconds for one [m, k] x [n, k]^T GEMM."""
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device="cuda")
    ai = torch.randint(-100, 100, (m, k), device="cuda", dtype=torch.int8)
    wi = torch.randint(-100, 100, (n, k), device="cuda", dtype=torch.int8)

    def fp8(fast: bool):
        return lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, bias=bias, out_dtype=torch.float16,
                                        use_fast_accum=fast)

    return (graph_time(torch, lambda: torch.addmm(bias, a, w.t())), graph_time(torch, fp8(False)),
            graph_time(torch, fp8(True)), graph_time(torch, lambda: torch._int_mm(ai, wi.t())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="128,2048,8192", help="rows of x (batch x sequence)")
    args = ap.parse_args()
    import torch

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; microseconds per GEMM (CUDA graph)\n")
    print("| M | N | K | float16 | float8 | float8 fast | int8 | float16 / float8 | float16 / float8 fast | "
          "float16 / int8 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in (int(v) for v in args.m.split(",") if v):
        total = [0.0] * 4
        for n, k in SHAPES:
            t = time_shape(torch, m, n, k)
            total = [s + v for s, v in zip(total, t)]
            print(f"| {m} | {n} | {k} | " + " | ".join(f"{v:.2f}" for v in t) +
                  f" | {t[0] / t[1]:.2f} | {t[0] / t[2]:.2f} | {t[0] / t[3]:.2f} |")
        print(f"| {m} | layer | sum | " + " | ".join(f"{v:.2f}" for v in total) +
              f" | {total[0] / total[1]:.2f} | {total[0] / total[2]:.2f} | {total[0] / total[3]:.2f} |")


if __name__ == "__main__":
    main()
