"""Batch inference over a Dask cluster (issue 46; docs/benchmarks.md): throughput with N workers against one
process, and the Dask overhead per partition.

For each model and each N of --workers, in one run:
  one process   one InferenceSession in this process runs the partitions one after the other (all cores on the CPU,
                cuda:0 on the GPU): records/s = records / wall time;
  N workers     xpuruntime.dask.ClusterSession over a cluster of N worker processes (one thread each): on the CPU a
                distributed.LocalCluster whose sessions get cores/N intra-op threads each, on the GPU one worker per
                GPU (local_gpu_cluster, device="cuda"); the input persisted on the workers first (data already in the
                cluster, as when each worker reads its share), the outputs gathered to the client; records/s as above.
Each figure is the best of --repeats after one untimed pass (sessions made, plans built); the one-process run is
timed again right before each cluster pass, so that on a shared machine both see the same load. Derived, against
the one-process time paired with that cluster's passes:
  speedup     N-worker records/s / one-process records/s; efficiency = speedup / N (the target on GPUs: >= 0.9);
  overhead    per partition = (N x the N-worker time - the one-process time) / partitions: worker time a partition
              costs beyond running the model (scheduling, moving its input and output, Python around the run).

    .venv/bin/python benchmarks/dask_bench.py --models resnet,bert --workers 1,2            # CPU, tiny exports
    python3 benchmarks/dask_bench.py --device cuda --size full --precision float16 --models resnet,bert \\
        --workers 1,2,4,8 --batch 64 --partitions 64 [--markdown out.md] [--json out.json]    # one worker per GPU

--size tiny takes models/suite/tiny/<model>.dynamo.<precision>.onnx; --size full the full-size float16 exports of
benchmarks/model_suite_bench.py (exported into --dir when missing, which needs PyTorch).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def model_path(name: str, size: str, precision: str, directory: pathlib.Path) -> pathlib.Path:
    if size == "tiny":
        return ROOT / "models" / "suite" / "tiny" / f"{name}.dynamo.{precision}.onnx"
    from model_suite_bench import full_model  # PyTorch exports it when missing

    return full_model(name, directory)[0]


def make_feeds(session, records: int, seq: int, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """Random inputs for every model input: symbolic batch -> records, other symbolic dims -> seq; token ids in
    [0, 100), masks all ones, float inputs standard normal."""
    feeds = {}
    for info in session.get_inputs():
        shape = [records] + [d if isinstance(d, int) else seq for d in info.shape[1:]]
        if "int" in info.dtype:
            feeds[info.name] = (np.ones(shape, info.dtype) if "mask" in info.name
                                else rng.integers(0, 100, shape).astype(info.dtype))
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
    return feeds


def one_process(path, device: str, engine: str, feeds, batch: int) -> Callable[[], float]:
    """One session in this process; returns a callable that runs every partition once and gives the seconds."""
    import xpuruntime as xrt

    session = xrt.InferenceSession(str(path), device="cuda:0" if device == "cuda" else device, engine=engine)
    n = len(next(iter(feeds.values())))
    blocks = [{k: v[i:i + batch] for k, v in feeds.items()} for i in range(0, n, batch)]

    def run_all() -> float:
        start = time.perf_counter()
        for block in blocks:
            out = session.run(block)
            for value in out.values():   # to the host, as the cluster's results are
                value if isinstance(value, np.ndarray) else value.to_numpy()
        return time.perf_counter() - start

    run_all()   # plans built
    return run_all


def cluster_run(path, device: str, engine: str, feeds, batch: int, workers: int, repeats: int,
                baseline: Callable[[], float]) -> Tuple[float, float]:
    """The best seconds of the cluster over ``repeats`` and of ``baseline`` timed right before each: on a shared
    machine the two see the same load."""
    import dask.array as da
    import distributed
    import xpuruntime as xrt
    import xpuruntime.dask as xdask

    if device == "cuda":
        cluster = xdask.local_gpu_cluster(list(range(workers)), dashboard_address=None)
        exec_policy = None
    else:
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        exec_policy = xrt.ExecutionPolicy(intra_op_threads=max(1, (os.cpu_count() or 1) // workers))
    with cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(workers)
        model = xdask.ClusterSession(path, client, device=device, engine=engine, exec_policy=exec_policy)
        best, best_baseline = float("inf"), float("inf")
        for repeat in range(repeats + 1):   # the first: every worker makes its session, plans built
            # New input keys each time (the tasks are pure: the same keys could be answered from memory).
            arrays = {k: da.from_array(v, chunks=(batch,) + v.shape[1:], name=f"bench-{k}-{repeat}").persist()
                      for k, v in feeds.items()}
            distributed.wait(list(arrays.values()))
            outputs = model.run(arrays)
            one = baseline()
            start = time.perf_counter()
            client.compute(list(outputs.values()), sync=True)
            if repeat:
                best = min(best, time.perf_counter() - start)
                best_baseline = min(best_baseline, one)
            del arrays, outputs
    return best, best_baseline


def bench(args) -> List[Dict]:
    import xpuruntime as xrt

    rows = []
    for name in args.models.split(","):
        path = model_path(name, args.size, args.precision, args.dir)
        probe = xrt.InferenceSession(str(path), engine=args.engine)
        feeds = make_feeds(probe, args.batch * args.partitions, args.seq, np.random.default_rng(0))
        records = args.batch * args.partitions
        baseline = one_process(path, args.device, args.engine, feeds, args.batch)
        single_row = {"model": name, "workers": 0, "seconds": min(baseline() for _ in range(args.repeats))}
        rows.append(single_row)
        for n in [int(w) for w in args.workers.split(",")]:
            if args.device == "cuda" and n > xrt.get_device_count():
                print(f"{name}: {n} workers skipped: this machine has {xrt.get_device_count()} GPUs", flush=True)
                continue
            t, single = cluster_run(path, args.device, args.engine, feeds, args.batch, n, args.repeats, baseline)
            single_row["seconds"] = min(single_row["seconds"], single)
            rows.append({"model": name, "workers": n, "seconds": t, "records_per_s": records / t,
                         "baseline_seconds": single, "speedup": single / t, "efficiency": single / t / n,
                         "overhead_ms_per_partition": (n * t - single) / args.partitions * 1e3})
            print(f"{name}: {n} workers {records / t:.1f} records/s ({single / t:.2f}x one process)", flush=True)
        single_row["records_per_s"] = records / single_row["seconds"]
    return rows


def markdown(rows: List[Dict], args) -> str:
    lines = [f"{args.size} {args.precision} exports, engine {args.engine}, device {args.device}, batch {args.batch} "
             f"per partition, {args.partitions} partitions ({args.batch * args.partitions} records), best of "
             f"{args.repeats}:", "",
             "| model | run | records/s | time (s) | speedup (one process, s) | efficiency "
             "| Dask overhead per partition (ms) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r["workers"] == 0:
            lines.append(f"| {r['model']} | one process | {r['records_per_s']:.1f} | {r['seconds']:.3f} | 1.00 | - "
                         "| - |")
        else:
            lines.append(f"| {r['model']} | {r['workers']} workers | {r['records_per_s']:.1f} | {r['seconds']:.3f} | "
                         f"{r['speedup']:.2f} ({r['baseline_seconds']:.3f}) | {r['efficiency']:.2f} | "
                         f"{r['overhead_ms_per_partition']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet,bert")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts (GPUs on --device cuda)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--engine", default="native")
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--precision", choices=["float32", "float16"], default="float32")
    ap.add_argument("--dir", type=pathlib.Path, default=ROOT / "models" / "suite" / "full")
    ap.add_argument("--batch", type=int, default=32, help="records per partition")
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--seq", type=int, help="the symbolic sequence length of text models (default: 32 for the tiny "
                    "exports, 128 at full size)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", type=pathlib.Path)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args()
    args.seq = args.seq or (32 if args.size == "tiny" else 128)
    rows = bench(args)
    table = markdown(rows, args)
    header = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end\n\n")
    print("\n" + header + table)
    if args.markdown:
        args.markdown.write_text(header + table)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
