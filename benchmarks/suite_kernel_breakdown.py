"""Where the GPU time goes on the real-model suite's full-size float16 exports: the native engine's session run and
`torch.compile` (default mode) replayed from a CUDA graph, side by side, per kernel name (torch.profiler's CUPTI
records, which include replayed graphs' kernels).

    python3 benchmarks/suite_kernel_breakdown.py --specs convnext:16,gpt2:1 [--top 24] [--runs 5] [--dir models/suite/full]

Per (model, batch) and side it prints the kernels per run, the GPU busy time per run (the sum of kernel durations:
compare this, the wall time under the profiler includes its own per-call overhead) and the top kernels by time.
Needs a GPU, torch, and the suite's builders (scripts/model_suite.py); exports a model first when its file is
missing.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def print_decisions(session, op_types: set) -> None:
    """The native plan's kernel decisions of nodes whose op type is in `op_types`."""
    if not op_types:
        return
    for n in session.explain().nodes:
        if n.get("op") not in op_types and str(n.get("op_type")).split(":")[-1] not in op_types:
            continue
        print(f"  {n['node']}: {n['kernel']} [{n.get('rule', '')}] {n.get('reason', '')}")
        for c in n.get("candidates", []):
            if c.get("time_us") is not None and c["time_us"] > 0:
                print(f"      {c['kernel']}: {c['time_us']:.2f} us {c.get('reason', '')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--specs", default="convnext:16", help="model:batch,... (names of scripts/model_suite.py)")
    parser.add_argument("--top", type=int, default=24)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dir", default=str(ROOT / "models" / "suite" / "full"))
    parser.add_argument("--explain", default="", help="ops or op types (conv2d, FusedConv; comma-separated) whose "
                        "kernel decisions to print after the native side: kernel, rule, reason, candidates' timings")
    args = parser.parse_args()
    import torch
    import model_suite as suite
    import model_suite_bench as msb
    from kernel_breakdown import profile_runs
    from timing import torch_graph
    import xpuruntime as xrt
    directory = pathlib.Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    for spec in args.specs.split(","):
        name, batch = spec.split(":")
        batch = int(batch)
        path, built = msb.full_model(name, directory)
        suite.realistic_weights(built.module, built.inputs)
        module = built.module.cuda().half().eval()
        feeds = msb.feeds_for(built, batch, args.seq)
        session = xrt.InferenceSession(str(path), device="cuda:0", engine="native",
                                       exec_policy=xrt.ExecutionPolicy(fallback="error"))
        device_feeds = {k: xrt.from_dlpack(v.cuda()) for k, v in feeds.items()}
        profile_runs(f"{name} batch {batch} native", lambda: session.run(device_feeds),
                     lambda: xrt.synchronize("cuda:0"), args.runs, args.top)
        print_decisions(session, set(filter(None, args.explain.split(","))))
        inputs = [v.cuda() for v in feeds.values()]
        with torch.inference_mode():
            compiled = torch.compile(module)
            for _ in range(3):
                compiled(*inputs)
            torch.cuda.synchronize()
            graph = torch_graph(lambda: compiled(*inputs))
            profile_runs(f"{name} batch {batch} torch.compile + CUDA graph", graph.replay, torch.cuda.synchronize,
                         args.runs, args.top)
        session = None  # its memory goes back before the next model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
