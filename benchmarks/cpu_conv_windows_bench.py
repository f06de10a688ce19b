"""Convolutions over windows on the CPU engine, packed or as the engine chooses (in place, pixels as rows), in one
process.

Note [Windows read in place] and Note [Convolution with the pixels as rows] (src/cpp/backends/cpu/cpu_conv.cpp): a
convolution task reads its windows in place where its planes' rows carry few columns past the output's, and computes
the transposed product where its output channels fill the packed GEMM's lanes better than its pixels. This benchmark
builds one native session of each op case of cpu_suite_bench.py under XPURT_CPU_CONV_WINDOWS=packed and one under
auto, checks that their outputs are the same bits, and times them alternately (the best of --rounds rounds of --calls
calls each), with ONNX Runtime's CPU EP in the same rounds at --threads 1 (at more threads its spinning workers would
take cores from the others; cpu_suite_bench.py --sequential times it alone). Prints a markdown table.

    python benchmarks/cpu_conv_windows_bench.py --cases conv3x3_late,conv3x3_14 --threads 1 --rounds 7 --calls 20
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_suite_bench  # noqa: E402  (the op cases)
import xpuruntime as xrt  # noqa: E402


def time_case(name: str, threads: int, rounds: int, calls: int) -> str:
    title, make = cpu_suite_bench.OPS[name]
    model, feeds = make()
    policy = xrt.ExecutionPolicy(intra_op_threads=threads)
    sessions = {}
    previous = os.environ.get("XPURT_CPU_CONV_WINDOWS")
    try:
        for rows in ("packed", "auto"):  # read when the plan is built
            os.environ["XPURT_CPU_CONV_WINDOWS"] = rows
            sessions[rows] = xrt.InferenceSession(model, engine="native", device="cpu", exec_policy=policy)
    finally:
        if previous is None:
            os.environ.pop("XPURT_CPU_CONV_WINDOWS", None)
        else:
            os.environ["XPURT_CPU_CONV_WINDOWS"] = previous
    outputs = {rows: session.run(None, feeds)[0] for rows, session in sessions.items()}
    same = np.array_equal(outputs["packed"], outputs["auto"])
    if threads == 1:
        sessions["ort"] = xrt.InferenceSession(model, engine="onnxruntime", device="cpu", exec_policy=policy)
    best = {key: float("inf") for key in sessions}
    for _ in range(rounds):
        for key, session in sessions.items():
            start = time.perf_counter()
            for _ in range(calls):
                session.run(None, feeds)
            best[key] = min(best[key], (time.perf_counter() - start) / calls * 1e3)
    ort = f"{best['ort']:.3f} | {best['ort'] / best['auto']:.2f}" if "ort" in best else "- | -"
    return (f"| {title} | {threads} | {best['packed']:.3f} | {best['auto']:.3f} | "
            f"{best['packed'] / best['auto']:.2f}x | {ort} | {'yes' if same else 'NO'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="conv3x3_late,conv3x3_14,conv3x3s2,conv3x3_r50",
                        help="op cases of cpu_suite_bench.py (comma-separated)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print("| case | threads | packed ms | auto ms | speed-up | ONNX Runtime ms | ORT / auto | same bits |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name in args.cases.split(","):
        print(time_case(name, args.threads, args.rounds, args.calls), flush=True)


if __name__ == "__main__":
    main()
