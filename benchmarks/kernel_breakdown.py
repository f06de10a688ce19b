"""Where the GPU time of one InferenceSession run goes: the CUDA kernels, memcpys and memsets of a few runs, as
CUPTI records them (through torch.profiler, which collects every kernel of the process, including xpuruntime's and
ONNX Runtime's, and the kernels of replayed CUDA graphs), aggregated per kernel name.

    python3 benchmarks/kernel_breakdown.py --models bert,resnet50 --batches 1 --engines native,onnxruntime \
        [--graphs 1] [--runs 5] [--top 25] [--zoo /tmp/zoo]

Per (model, batch, engine) it prints: kernels per run, the sum of kernel durations per run (GPU busy time), the
host wall time per run, and the top kernels by total time. Needs torch (for its CUPTI-based profiler) and a GPU.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import session_bench as sb  # noqa: E402

import xpuruntime as xrt  # noqa: E402


def profile_runs(tag, fn, sync, runs, top):
    """Runs `fn` 5 times, then `runs` times under torch.profiler; prints the kernels per run, the GPU busy time per
    run (the sum of kernel durations), the wall time per run and the `top` kernels by total time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(runs):
            fn()
        sync()
        wall = (time.perf_counter() - start) / runs
    totals = collections.defaultdict(lambda: [0, 0.0])
    count = 0
    busy = 0.0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        dur = event.device_time if hasattr(event, "device_time") else event.cuda_time
        totals[event.name][0] += 1
        totals[event.name][1] += dur
        count += 1
        busy += dur
    print(f"\n== {tag}: {count / runs:.0f} device records/run, busy {busy / runs / 1000:.3f} ms/run, "
          f"wall {wall * 1000:.3f} ms/run")
    for name, (n, total) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {total / runs:9.1f} us  x{n / runs:5.1f}  {name[:150]}")


def breakdown(path, engine, graphs, batch, runs, top):
    policy = xrt.ExecutionPolicy(cuda_graphs=bool(graphs))
    session = xrt.InferenceSession(str(path), device="cuda", engine=engine, exec_policy=policy)
    feeds_np = sb.make_inputs(session, batch)
    feeds = {k: xrt.from_numpy(v).to("cuda") for k, v in feeds_np.items()}
    profile_runs(f"{path.name} batch {batch} engine {engine} graphs {graphs}", lambda: session.run(feeds),
                 lambda: xrt.synchronize("cuda"), runs, top)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,resnet50")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--engines", default="native,onnxruntime")
    parser.add_argument("--graphs", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--zoo", default=str(ROOT / "models" / "zoo"))
    args = parser.parse_args()
    zoo_dir = pathlib.Path(args.zoo)
    zoo_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        path = sb.model_path(zoo_dir, name, False, "fp16")
        for batch in (int(b) for b in args.batches.split(",")):
            for engine in args.engines.split(","):
                try:
                    breakdown(path, engine, bool(args.graphs), batch, args.runs, args.top)
                except Exception as error:  # noqa: BLE001 - a diagnostic: report and go on
                    print(f"\n== {name} batch {batch} engine {engine}: {type(error).__name__}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
