"""Multi-GPU figures (issue 20; docs/benchmarks.md): all-reduce bus bandwidth and tensor-parallel latency, measured
in one run on one machine.

1. all_reduce bus bandwidth, float32, 1 MiB .. 1 GiB, over every GPU of the machine:
     xrt       xrt.distributed.all_reduce on communicators from init_all, one thread per rank
     torch     torch.distributed.all_reduce (NCCL backend), one process per GPU, in the same run
   time = wall time of --iters back-to-back all-reduces / iters (after --warmup), each rank timed to its
   comm.wait() / torch.cuda.synchronize(); bus bandwidth = bytes * 2 (n - 1) / n / time (nccl-tests' definition).
2. Tensor-parallel latency of the real-model suite's full-size float16 exports (dynamo exporter; sequence 128):
   native engine on one GPU against ExecutionPolicy(tensor_parallel=n), CUDA graphs on, inputs on cuda:0;
   median ms, throughput (sequences/s) and scaling efficiency = (t1 / tn) / n.

    NCCL_NVLS_ENABLE=0 python3 benchmarks/distributed_bench.py --models llama,bert --batches 1,16 \\
        [--sizes-mib 1,4,16,64,256,1024] [--markdown out.md] [--json out.json]

NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the lent machines require.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import threading
import time
from typing import Dict, List

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def busbw(nbytes: int, seconds: float, n: int) -> float:
    return nbytes * 2 * (n - 1) / n / seconds / 1e9


def xrt_all_reduce(sizes: List[int], iters: int, warmup: int) -> Dict[int, float]:
    import xpuruntime as xrt
    n = xrt.get_device_count()
    comms = xrt.distributed.init_all([f"cuda:{i}" for i in range(n)], timeout=120)
    out: Dict[int, float] = {}
    for nbytes in sizes:
        count = nbytes // 4
        xs = [xrt.zeros([count], "float32", f"cuda:{r}") for r in range(n)]
        ys = [xrt.empty([count], "float32", f"cuda:{r}") for r in range(n)]
        times = [0.0] * n
        barrier = threading.Barrier(n)

        def work(r):
            c = comms[r]
            for _ in range(warmup):
                xrt.distributed.all_reduce(xs[r], c, out=ys[r])
            c.wait()
            barrier.wait()
            start = time.perf_counter()
            for _ in range(iters):
                xrt.distributed.all_reduce(xs[r], c, out=ys[r])
            c.wait()
            times[r] = (time.perf_counter() - start) / iters

        threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out[nbytes] = max(times)
    return out


def _torch_rank(rank: int, n: int, sizes: List[int], iters: int, warmup: int, port: int, queue) -> None:
    import torch
    import torch.distributed as td
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    td.init_process_group("nccl", rank=rank, world_size=n, device_id=torch.device(f"cuda:{rank}"))
    result = {}
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4, device=f"cuda:{rank}")
        for _ in range(warmup):
            td.all_reduce(x)
        torch.cuda.synchronize()
        td.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            td.all_reduce(x)
        torch.cuda.synchronize()
        result[nbytes] = (time.perf_counter() - start) / iters
    queue.put((rank, result))
    td.destroy_process_group()


def torch_all_reduce(sizes: List[int], iters: int, warmup: int) -> Dict[int, float]:
    import torch
    import torch.multiprocessing as mp
    n = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_torch_rank, args=(r, n, sizes, iters, warmup, port, queue)) for r in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(120)
    return {s: max(r[1][s] for r in results) for s in sizes}


def tp_latency(models: List[str], batches: List[int], seq: int, iterations: int, warmup: int) -> List[Dict]:
    import xpuruntime as xrt
    from model_suite_bench import feeds_for, full_model
    from session_bench import latency
    n = xrt.get_device_count()
    directory = ROOT / "models" / "suite" / "full"
    rows = []
    for name in models:
        path, built = full_model(name, directory)
        for batch in batches:
            feeds = feeds_for(built, batch, seq)
            device_feeds = {k: xrt.from_dlpack(v.cuda()) for k, v in feeds.items()}
            row: Dict = {"model": name, "batch": batch, "seq": seq}
            outputs = {}
            for ranks in sorted({1, 2, n} if n >= 2 else {1}):
                policy = xrt.ExecutionPolicy(tensor_parallel=ranks)
                t0 = time.perf_counter()
                session = xrt.InferenceSession(str(path), device="cuda:0", engine="native", exec_policy=policy)
                create_ms = (time.perf_counter() - t0) * 1e3
                first = session.run(device_feeds)
                outputs[ranks] = np.asarray(first[session.get_outputs()[0].name].cpu().numpy(), np.float32)
                stats = latency(lambda: session.run(device_feeds), iterations, warmup,
                                lambda: xrt.synchronize("cuda:0"))
                stats["create_ms"] = create_ms
                if ranks > 1:
                    stats["sharding"] = next((o for o in session.explain().options if "column-parallel and" in o), "")
                row[f"tp{ranks}"] = stats
                del session
            if n > 1:
                ref = outputs[1]
                row["rel_err"] = float(np.abs(outputs[n] - ref).max() / max(np.abs(ref).max(), 1e-6))
                row["speedup"] = row["tp1"]["median_ms"] / row[f"tp{n}"]["median_ms"]
                row["efficiency"] = row["speedup"] / n
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mib", default="1,4,16,64,256,1024")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="llama,bert")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: xrt, torch, tp")
    ap.add_argument("--json", type=pathlib.Path)
    ap.add_argument("--markdown", type=pathlib.Path)
    args = ap.parse_args()
    import xpuruntime as xrt
    n = xrt.get_device_count()
    if n < 1:
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 1
    skip = set(filter(None, args.skip.split(",")))
    sizes = [int(float(s) * (1 << 20)) for s in args.sizes_mib.split(",")]
    report: Dict = {"date": datetime.date.today().isoformat(), "gpus": n, "nccl": xrt.distributed.nccl_version()}
    try:
        import torch
        report["device"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        report["device"] = "?"
    lines = [f"# distributed_bench {report['date']}: {n} x {report['device']}, NCCL {report['nccl']}", ""]
    if n >= 2:
        ours = xrt_all_reduce(sizes, args.iters, args.warmup) if "xrt" not in skip else {}
        theirs = {}
        if "torch" not in skip:
            try:
                theirs = torch_all_reduce(sizes, args.iters, args.warmup)
            except Exception as error:  # noqa: BLE001 - reported in the table
                report["torch_error"] = f"{type(error).__name__}: {error}"
        report["all_reduce"] = [{"bytes": s, "xrt_s": ours.get(s), "torch_s": theirs.get(s)} for s in sizes]
        lines += [f"all_reduce float32 over {n} GPUs: bus bandwidth (GB/s, nccl-tests' definition)", "",
                  "| size | xrt (GB/s) | torch.distributed (GB/s) | xrt time (us) | torch time (us) |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for s in sizes:
            a, b = ours.get(s), theirs.get(s)
            lines.append(f"| {s / (1 << 20):g} MiB | {busbw(s, a, n) if a else float('nan'):.1f} | "
                         f"{busbw(s, b, n) if b else float('nan'):.1f} | {a * 1e6 if a else float('nan'):.1f} | "
                         f"{b * 1e6 if b else float('nan'):.1f} |")
        lines.append("")
        print("\n".join(lines), flush=True)
    if "tp" not in skip:
        rows = tp_latency(args.models.split(","), [int(b) for b in args.batches.split(",")], args.seq,
                          args.iterations, 10)
        report["tensor_parallel"] = rows
        lines += [f"tensor-parallel latency, float16, sequence {args.seq}, native engine, CUDA graphs "
                  f"(median ms; throughput in sequences/s)", "",
                  f"| model | batch | 1 GPU (ms) | 2 GPUs (ms) | {n} GPUs (ms) | speedup ({n}) | efficiency | "
                  f"1 GPU seq/s | {n} GPUs seq/s | max rel. diff |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows:
            t1 = r["tp1"]["median_ms"]
            t2 = r.get("tp2", {}).get("median_ms", float("nan"))
            tn = r.get(f"tp{n}", {}).get("median_ms", float("nan"))
            lines.append(f"| {r['model']} | {r['batch']} | {t1:.3f} | {t2:.3f} | {tn:.3f} | "
                         f"{r.get('speedup', 1):.2f}x | "
                         f"{r.get('efficiency', 1):.0%} | {r['batch'] / t1 * 1e3:.0f} | {r['batch'] / tn * 1e3:.0f} | "
                         f"{r.get('rel_err', 0):.1e} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
