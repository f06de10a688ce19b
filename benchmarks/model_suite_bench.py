"""The real-model suite at full size on the GPU: xpuruntime's native engine against what a user would pick instead,
measured in one run on one machine (issue 18's table; docs/benchmarks.md).

For each architecture of scripts/model_suite.py (its full-size configuration, exported with PyTorch's dynamo
exporter in float16; exported here when missing) and each batch size (sequence 128 for text models), with inputs
and outputs on the device:

  native              xrt.InferenceSession(engine="native"), default policy (CUDA graphs on), fallback="error"
  native_policy       the same with --native-kernels' KernelPolicy and without --native-disabled-passes' graph
                      passes (only when either is given: an A/B in the same run, e.g. --native-kernels
                      attention=cudnn or --native-disabled-passes patch_embedding_gemm)
  ort                 ONNX Runtime's C++ API directly, CUDA EP, IoBinding on the device (benchmarks/ort_direct_bench)
  ort_graphs          the same with enable_cuda_graph=1 (a subprocess: a capture that fails cannot harm this one)
                      ort_graphs runs first and ort only where ort_graphs failed (ONNX Runtime with CUDA graphs where
                      it can: each ORT process pays its cuDNN algorithm search again, 3-7 s for a CNN); --ort-both
                      times both
  torch_eager         the PyTorch module (float16, torch.inference_mode)
  torch_graph         that module captured in a torch.cuda.CUDAGraph and replayed
  compile_graph       torch.compile(module) (default mode), warmed up, captured in a CUDA graph and replayed

plus session creation and the first run's time for native and ort. With --audit N the native session then runs N
times under xpuruntime's profiler and the row keeps its roofline audit (docs/profiling.md, "Roofline audit"): the
model's efficiency (the nodes' floors over their measured times) and the nodes flagged for costing more than 2% of
the run at under 50% of their floor, each with its kernel and why it was chosen; the rendered table is followed by
the audit summary over all rows (issue 42's "every node over 2% of its model's time at 50% of its floor").

Latencies are medians over --iterations calls, each followed by a device synchronization inside its timing. The native
output is compared with torch_eager's (max abs difference relative to max |torch|; with --skip torch_eager, with one
untimed eager call's). Each row's "wall_s" says how long each variant took to measure (session creation, compilation
and searches included), where a device call's time goes.

    python3 benchmarks/model_suite_bench.py --models resnet,bert --batches 1,16 \\
        [--dir models/suite/full] [--iterations 50] [--warmup 10] [--seq 128] [--json out.json] [--markdown out.md]
        [--prepare-jobs 8] [--ort-both]

--prepare-jobs N first runs N subprocesses (the models dealt round-robin) that export the missing files and compile each
model with torch.compile at every batch, in the same order the timing run does, so that the timing run finds the exports
on disk and Inductor's compiled graphs in its cache (what makes the whole suite fit in a device call; compile_graph's
compile_s is then the cached compile; a model prepared at all its batches leaves a marker file NAME.prepared in --dir,
and a later --prepare-jobs on the same machine skips it). Nothing is timed in them; their failures are printed and the
timing run meets them again. Each row is also printed as a JSON line when it is done; --render LOG prints the table of
the rows in a log (a run cut short still has its table; no GPU needed).

--resume ROWS spreads one table over several runs (the whole suite takes longer than one device call): the rows
already in the file ROWS (JSON lines, as printed) are kept, neither prepared nor timed again, each new row is appended
to it when it is done, and the table is of both. scripts/gpu_session.sh's SUITE calls pass a file that outlives the
call on the warm machine.

Needs torch, torchvision, timm and transformers (the device image has them) and, for the ort variants,
XPURT_ORT_CUDA_PROVIDER (scripts/stage_ort_cuda.sh, scripts/ort_cuda_unstage.sh).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import model_suite as suite  # noqa: E402


def _session_bench():
    """benchmarks/session_bench.py (Skip, failure, find_bench, latency), imported when first needed: it imports
    xpuruntime, which a --prepare-only process must not need (scripts/gpu_session.sh runs the preparation while
    xpuruntime is still being built)."""
    import session_bench
    return session_bench
from timing import torch_graph  # noqa: E402

VARIANTS = ["native", "native_policy", "ort", "ort_graphs", "torch_eager", "torch_graph", "compile_graph"]
# The order bench_model measures them in: ort_graphs before ort, which then runs only where ort_graphs failed.
MEASURE_ORDER = ["native", "native_policy", "ort_graphs", "ort", "torch_eager", "torch_graph", "compile_graph"]


def feeds_for(built, batch: int, seq: int):
    """Torch inputs of the full-size model at `batch` (and `seq` for the symbolic sequence, at most the model's
    positions: CLIP's text tower has 77), float ones in fp16."""
    import torch
    g = torch.Generator().manual_seed(batch)
    seq = min(seq, built.max_seq)
    out = {}
    for name, example in built.inputs.items():
        shape = list(example.shape)
        for axis, symbol in built.dynamic.get(name, {}).items():
            shape[axis] = batch if symbol == "batch" else seq
        if example.dtype.is_floating_point:
            out[name] = torch.randn(shape, generator=g).half()
        elif "mask" in name:
            out[name] = torch.ones(shape, dtype=example.dtype)
        else:
            out[name] = torch.randint(0, int(example.max()) + 1, shape, generator=g, dtype=example.dtype)
    return out


def run_native(path: pathlib.Path, feeds, iterations: int, warmup: int, kernels: Optional[Dict[str, str]] = None,
               disabled: Optional[List[str]] = None, precision: str = "fp32", profile: int = 0,
               profile_tag: str = "", policy: Optional[Dict] = None, audit: int = 0):
    """Times `path` on the native engine; with `profile` > 0 it then prints where the GPU time of `profile` runs went,
    per kernel (kernel_breakdown.profile_runs, CUPTI through torch.profiler). `policy`: more ExecutionPolicy fields.
    `audit` > 0: stats["audit"] is the roofline audit of that many runs (audit_of)."""
    import xpuruntime as xrt
    t0 = time.perf_counter()
    session = xrt.InferenceSession(str(path), device="cuda:0", engine="native",
                                   exec_policy=xrt.ExecutionPolicy(fallback="error", precision=precision,
                                                                   **(policy or {})),
                                   kernel_policy=xrt.KernelPolicy(**kernels) if kernels else None,
                                   disabled_passes=disabled or None)
    create_ms = (time.perf_counter() - t0) * 1e3
    device_feeds = {k: xrt.from_dlpack(v.cuda()) for k, v in feeds.items()}
    t0 = time.perf_counter()
    first = session.run(device_feeds)
    xrt.synchronize("cuda:0")
    first_run_ms = (time.perf_counter() - t0) * 1e3
    stats = _session_bench().latency(lambda: session.run(device_feeds), iterations, warmup,
                                     lambda: xrt.synchronize("cuda:0"))
    stats.update(create_ms=create_ms, first_run_ms=first_run_ms)
    if audit > 0:
        stats["audit"] = audit_of(lambda: session.run(device_feeds), audit)
    if profile > 0:
        from kernel_breakdown import profile_runs
        profile_runs(profile_tag or path.name, lambda: session.run(device_feeds), lambda: xrt.synchronize("cuda:0"),
                     profile, 30)
    output = first[session.get_outputs()[0].name]
    return stats, np.asarray(output.cpu().numpy() if hasattr(output, "cpu") else output, dtype=np.float32)


def audit_of(run: Callable[[], object], runs: int, top: int = 5) -> Dict:
    """The roofline audit of `runs` calls of `run` under xpuruntime's profiler: ``efficiency`` (the audited nodes'
    floors over their times, all together), ``audited_us`` (their time a run), ``nodes``, ``flagged`` (how many cost
    more than 2% of the run at under 50% of their floor) and ``worst``: up to `top` flagged nodes, most lost time
    first, each with its op, kernel, backend, share, efficiency, time a run and reason; ``groups``: up to `top` flagged
    groups of one op and kernel (xpuruntime.cli.audit_groups: over 10% of the run together at under 50% of their
    floor), which catch a model's time spread over many small nodes."""
    import xpuruntime as xrt
    from xpuruntime.cli import audit_groups
    with xrt.profile(record_shapes=True) as profiler:
        for _ in range(runs):
            run()
        xrt.synchronize("cuda:0")
    rows = profiler.audit()
    groups = [g for g in audit_groups(rows) if g["flagged"]]
    time_us = sum(r["total_us"] for r in rows)
    floor_us = sum(r["floor_us"] for r in rows)
    flagged = [r for r in rows if r["flagged"]]
    return {"efficiency": floor_us / time_us if time_us > 0 else 0.0, "audited_us": time_us / runs,
            "nodes": len(rows), "flagged": len(flagged),
            "worst": [{"node": r["node"], "op": r["op"] or r["op_type"], "kernel": r["kernel"], "backend": r["backend"],
                       "share": r["share"], "efficiency": r["efficiency"], "mean_us": r["mean_us"],
                       "reason": r["reason"]} for r in flagged[:top]],
            "groups": [{k: g[k] for k in ("op", "kernel", "backend", "nodes", "share", "efficiency")}
                       for g in groups[:top]]}


def run_ort(binary, path: pathlib.Path, batch: int, seq: int, graphs: bool, iterations: int, warmup: int,
            notes: List[str]):
    """ONNX Runtime's CUDA EP on the export as it is; where its process dies (ORT 1.29's CUDA plugin EP crashed on
    every export with nodes left on its CPU EP), again with the inputs' dynamic axes fixed in the session options
    (ort_direct_bench --static-shapes 1, what a user serving one shape would do), noted in `notes`."""
    if binary is None or not binary.exists():
        raise _session_bench().Skip("no ort_direct_bench binary (build the benchmarks with ONNX Runtime found)")
    variant = f"ort{'_graphs' if graphs else ''}"
    command = [str(binary), "--model", str(path), "--batch", str(batch), "--device", "cuda", "--graphs",
               "1" if graphs else "0", "--iterations", str(iterations), "--warmup", str(warmup),
               "--dim", f"batch={batch}", "--dim", f"sequence={seq}"]
    done = subprocess.run(command + ["--static-shapes", "0"], capture_output=True, text=True)
    if done.returncode < 0:  # killed by a signal: the same with static shapes
        first = _session_bench().failure(done)
        done = subprocess.run(command + ["--static-shapes", "1"], capture_output=True, text=True)
        if done.returncode == 0:
            notes.append(f"{variant}: with the input shapes fixed in the session options (as it is: {first[:120]})")
    if done.returncode != 0:
        raise _session_bench().Skip(f"{variant}: {_session_bench().failure(done)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_torch(module, feeds, mode: str, iterations: int, warmup: int):
    """Times `module` in `mode` ("eager", "graph", "compile"); eager also returns its first output as numpy (the
    reference native_rel_err compares with). "reference": that output only, nothing timed."""
    import torch
    args = [v.cuda() for v in feeds.values()]
    sync = torch.cuda.synchronize
    with torch.inference_mode():
        if mode in ("eager", "reference"):
            out = module(*args)
            stats = (_session_bench().latency(lambda: module(*args), iterations, warmup, sync) if mode == "eager"
                     else {})
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, dict):  # torchvision detectors: one dict per image
                first = first["boxes"]
            return stats, first.float().cpu().numpy()
        fn = module
        compile_s = None
        if mode == "compile":
            t0 = time.perf_counter()
            fn = torch.compile(module)
            for _ in range(3):
                fn(*args)
            sync()
            compile_s = time.perf_counter() - t0
        graph = torch_graph(lambda: fn(*args))
        stats = _session_bench().latency(graph.replay, iterations, warmup, sync)
        if compile_s is not None:
            stats["compile_s"] = compile_s
        return stats, None


def full_model(name: str, directory: pathlib.Path):
    """The full-size float16 export of suite model `name` in `directory` (exported when missing; the TorchScript
    export where the dynamo exporter cannot write it) and the PyTorch module it came from, built with seed 0."""
    import torch
    arch = next(a for a in suite.ARCHS if a.name == name)
    path = directory / f"{name}.dynamo.float16.onnx"
    if not path.exists():
        suite.export(directory, False, [name], ["dynamo"], ["float16"])
    if not path.exists():  # the dynamo exporter cannot write it (SSDlite's batched NMS): the TorchScript export
        path = directory / f"{name}.torchscript.float16.onnx"
        if not path.exists():
            suite.export(directory, False, [name], ["torchscript"], ["float16"])
    torch.manual_seed(0)
    return path, arch.build(False)


def bench_model(name: str, directory: pathlib.Path, batches: List[int], seq: int, iterations: int, warmup: int,
                binary, skip: List[str], kernels: Optional[Dict[str, str]] = None,
                disabled: Optional[List[str]] = None, on_row: Optional[Callable[[Dict], None]] = None,
                audit: int = 0, ort_both: bool = False) -> List[Dict]:
    import torch
    path, built = full_model(name, directory)
    suite.realistic_weights(built.module, built.inputs)
    module = built.module.cuda().half().eval()
    seq = min(seq, built.max_seq)  # as feeds_for: ONNX Runtime's runner is given the same sequence
    rows = []
    for batch in batches:
        feeds = feeds_for(built, batch, seq)
        row: Dict = {"model": name, "batch": batch, "notes": [], "wall_s": {}}
        reference = None
        for variant in MEASURE_ORDER:
            if variant in skip or (variant == "native_policy" and not kernels and not disabled):
                continue
            if variant == "ort" and "ort_graphs" in row and not ort_both:
                continue
            started = time.perf_counter()
            try:
                if variant == "native":
                    row[variant], native_out = run_native(path, feeds, iterations, warmup, audit=audit)
                elif variant == "native_policy":
                    row[variant], _ = run_native(path, feeds, iterations, warmup, kernels, disabled)
                    row[variant].update(kernels=kernels, disabled_passes=disabled)
                elif variant in ("ort", "ort_graphs"):
                    row[variant] = run_ort(binary, path, batch, seq, variant == "ort_graphs", iterations, warmup,
                                           row["notes"])
                elif variant == "torch_eager":
                    row[variant], reference = run_torch(module, feeds, "eager", iterations, warmup)
                else:
                    row[variant], _ = run_torch(module, feeds, "graph" if variant == "torch_graph" else "compile",
                                                iterations, warmup)
            except _session_bench().Skip as why:
                row["notes"].append(str(why))
            except Exception as error:  # noqa: BLE001: reported in the table
                row["notes"].append(f"{variant}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
            torch.cuda.synchronize()
            row["wall_s"][variant] = round(time.perf_counter() - started, 2)
        if "native" in row and reference is None:  # torch_eager skipped: one eager call for the reference
            try:
                _, reference = run_torch(module, feeds, "reference", 0, 0)
            except Exception as error:  # noqa: BLE001: reported in the table
                row["notes"].append(f"reference: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
        if "native" in row and reference is not None:
            if built.data_dependent:  # a detector's rows: their order follows score ties and NMS
                row["notes"].append("native_rel_err: data-dependent outputs are matched as sets "
                                    "(scripts/model_suite.py run), not by position here")
            elif native_out.shape == reference.shape:
                row["native_rel_err"] = float(np.abs(native_out - reference).max() /
                                              max(np.abs(reference).max(), 1e-6))
        rows.append(row)
        print(json.dumps(row), flush=True)
        if on_row is not None:
            on_row(row)
    return rows


def prepare_model(name: str, directory: pathlib.Path, batches: List[int], seq: int, skip: List[str]) -> None:
    """The work of --prepare-jobs for one model: its export, and torch.compile warmed at each batch as run_torch's
    compile mode does (a fresh torch.compile per batch, three calls), which fills Inductor's on-disk cache."""
    import torch
    marker = directory / f"{name}.prepared"
    wanted = ",".join(map(str, batches)) + ("" if "compile_graph" in skip else " compiled")
    if marker.exists() and marker.read_text() == wanted:
        print(f"prepared {name} before ({marker.name})", flush=True)
        return
    path, built = full_model(name, directory)
    if "compile_graph" in skip:
        marker.write_text(wanted)
        return
    module = built.module.cuda().half().eval()
    for batch in batches:
        args = [v.cuda() for v in feeds_for(built, batch, seq).values()]
        with torch.inference_mode():
            fn = torch.compile(module)
            for _ in range(3):
                fn(*args)
        torch.cuda.synchronize()
    marker.write_text(wanted)  # this machine's Inductor cache now holds its compiled graphs
    print(f"prepared {name} ({path.name})", flush=True)


def prepare_in_parallel(models: List[str], jobs: int, argv: List[str]) -> None:
    """--prepare-jobs: `jobs` subprocesses of this script with --prepare-only, the models dealt round-robin."""
    groups = [models[i::jobs] for i in range(jobs) if models[i::jobs]]
    base = []  # argv without --prepare-jobs N (or --prepare-jobs=N)
    drop = False
    for a in argv:
        if drop or a.startswith("--prepare-jobs="):
            drop = False
            continue
        drop = a == "--prepare-jobs"
        if not drop:
            base.append(a)
    t0 = time.perf_counter()
    import os
    threads = str(max(1, (os.cpu_count() or jobs) // len(groups)))  # the cores shared out, not oversubscribed
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    import tempfile
    logs = [tempfile.TemporaryFile(mode="w+") for _ in groups]  # files, not pipes: no process waits on a full pipe
    procs = [subprocess.Popen([sys.executable, __file__, *base, "--prepare-only", "--models", ",".join(g)],
                              stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
             for g, log in zip(groups, logs)]
    for group, proc, log in zip(groups, procs, logs):
        proc.wait()
        log.seek(0)
        failed = [line for line in log.read().splitlines() if line.startswith("prepare ")]
        if proc.returncode != 0 or failed:
            print(f"prepare {','.join(group)}: exit {proc.returncode}; " + "; ".join(failed)[-2000:], file=sys.stderr,
                  flush=True)
        log.close()
    print(f"prepared {len(models)} models in {len(groups)} processes, {time.perf_counter() - t0:.0f} s",
          file=sys.stderr, flush=True)


def resume_plan(models: List[str], batches: List[int], previous: List[Dict]):
    """--resume: ({model: its batches not yet in `previous`} for the models with any left, in order, and the rows of
    `previous` for these models and batches, the last of each (model, batch) kept)."""
    kept: Dict = {}
    for row in previous:
        if row.get("model") in models and row.get("batch") in batches:
            kept[(row["model"], row["batch"])] = row
    todo = {m: [b for b in batches if (m, b) not in kept] for m in models}
    rows = [kept[(m, b)] for m in models for b in batches if (m, b) in kept]
    return {m: left for m, left in todo.items() if left}, rows


def summary(rows: List[Dict]) -> str:
    """The issue-42 figures over the rows: geometric means of native / compile and native / best ORT, the cases
    below 0.9x of compile, and how many rows have each."""
    import math

    def ratios(other):
        out = []
        for r in rows:
            theirs = [r[v]["median_ms"] for v in other if v in r]
            if "native" in r and theirs:
                out.append((f"{r['model']} b{r['batch']}", min(theirs) / r["native"]["median_ms"]))
        return out

    lines = []
    for label, other in (("torch.compile + CUDA graph", ["compile_graph"]),
                         ("best ONNX Runtime", ["ort", "ort_graphs"])):
        pairs = ratios(other)
        if not pairs:
            continue
        mean = math.exp(sum(math.log(x) for _, x in pairs) / len(pairs))
        low = [f"{name} {x:.2f}x" for name, x in pairs if x < 0.9]
        lines.append(f"- native / {label}: geometric mean {mean:.2f}x over {len(pairs)} cases, "
                     f"{sum(x >= 1 for _, x in pairs)} ahead; below 0.9x: {', '.join(low) if low else 'none'}")
    return "\n".join(lines)


def audit_summary(rows: List[Dict]) -> str:
    """The roofline audit over the rows that have one (--audit): a line per case (efficiency, flagged nodes, the
    worst of them, and its flagged groups: xpuruntime.cli.audit_groups), then the flagged nodes of all cases grouped
    by op and kernel, most lost time first."""
    audited = [r for r in rows if "audit" in r.get("native", {})]
    if not audited:
        return ""
    lines = ["Roofline audit of the native runs (efficiency = the nodes' floors over their times; flagged: over 2% of "
             "the run at under 50% of its floor):", ""]
    groups: Dict = {}
    for r in audited:
        a = r["native"]["audit"]
        worst = a["worst"][0] if a["worst"] else None
        text = (f"; worst {worst['node']} ({worst['op']}, {worst['kernel']}) {100 * worst['share']:.1f}% of the run "
                f"at {100 * worst['efficiency']:.0f}%" if worst else "")
        lines.append(f"- {r['model']} b{r['batch']}: efficiency {100 * a['efficiency']:.0f}% over {a['nodes']} nodes, "
                     f"{a['flagged']} flagged{text}")
        for g in a.get("groups", []):  # ops whose nodes together cost over 10% of the run at under half their floor
            lines.append(f"  - group {g['op']} / {g['kernel']}: {g['nodes']} nodes, {100 * g['share']:.1f}% of the run "
                         f"at {100 * g['efficiency']:.0f}%")
        for w in a["worst"]:
            key = (w["op"], w["kernel"], w["backend"])
            lost = w["share"] * (1 - w["efficiency"])
            g = groups.setdefault(key, {"lost": 0.0, "cases": set(), "reason": w["reason"]})
            g["lost"] += lost
            g["cases"].add(f"{r['model']} b{r['batch']}")
    flagged = sum(r["native"]["audit"]["flagged"] for r in audited)
    lines += ["", f"{flagged} flagged nodes over {len(audited)} cases; by op and kernel (the lost shares summed over "
              "cases):"]
    for (op, kernel, backend), g in sorted(groups.items(), key=lambda kv: -kv[1]["lost"]):
        cases = sorted(g["cases"])
        listed = ", ".join(cases[:6]) + (", ..." if len(cases) > 6 else "")
        lines.append(f"- {op} / {kernel} ({backend}): {100 * g['lost']:.1f}% lost in {len(cases)} cases ({listed}); "
                     f"the first's reason: {(g['reason'] or '-')[:160]}")
    return "\n".join(lines)


def report(rows: List[Dict]) -> str:
    """The table of `rows`, the issue-42 summary under it, and the audit summary where rows have audits."""
    audits = audit_summary(rows)
    return table(rows) + "\n\n" + summary(rows) + ("\n\n" + audits if audits else "")


def rows_in_log(text: str) -> List[Dict]:
    """The rows bench_model printed (one JSON object per line, with "model" and "batch") in a run's output."""
    rows = []
    for line in text.splitlines():
        if line.startswith("{") and '"model"' in line:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "batch" in row:
                rows.append(row)
    return rows


def fmt(row: Dict, variant: str) -> str:
    return f"{row[variant]['median_ms']:.3f}" if variant in row else "-"


def table(rows: List[Dict]) -> str:
    columns = [v for v in VARIANTS if v != "native_policy" or any(v in r for r in rows)]
    names = {"native": "native", "native_policy": "native (A/B policy)", "ort": "ORT",
             "ort_graphs": "ORT + graphs", "torch_eager": "torch eager", "torch_graph": "torch graph",
             "compile_graph": "compile + graph"}
    head = ("| model | batch | " + " | ".join(names[v] for v in columns) + " | "
            "native / best ORT | native / compile | create native / ORT (ms) | first run native / ORT (ms) | "
            "native vs torch |")
    lines = [head, "| " + " | ".join(["---"] * 2 + ["---:"] * (len(columns) + 5)) + " |"]
    for r in rows:
        ort = [r[v]["median_ms"] for v in ("ort", "ort_graphs") if v in r]
        native = r["native"]["median_ms"] if "native" in r else None
        ratio_ort = f"{min(ort) / native:.2f}x" if native and ort else "-"
        ratio_compile = f"{r['compile_graph']['median_ms'] / native:.2f}x" if native and "compile_graph" in r else "-"
        theirs = r.get("ort") or r.get("ort_graphs")  # ort runs only where ort_graphs failed (or with --ort-both)
        create = (f"{r['native']['create_ms']:.0f} / {theirs['create_ms']:.0f}" if "native" in r and theirs
                  else "-")
        first = (f"{r['native']['first_run_ms']:.0f} / {theirs['first_run_ms']:.0f}" if "native" in r and theirs
                 else "-")
        err = f"{r['native_rel_err']:.1e}" if "native_rel_err" in r else "-"
        lines.append(f"| {r['model']} | {r['batch']} | " + " | ".join(fmt(r, v) for v in columns) +
                     f" | {ratio_ort} | {ratio_compile} | {create} | {first} | {err} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet,efficientnet,convnext,vit,bert,gpt2")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dir", type=pathlib.Path, default=ROOT / "models" / "suite" / "full")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--skip", default="", help="comma-separated variants to leave out")
    ap.add_argument("--ort-direct", default=None, help="path of ort_direct_bench (default: found under build*/)")
    ap.add_argument("--native-kernels", default="",
                    help="key=rule,... : also time the native engine under this KernelPolicy (variant native_policy)")
    ap.add_argument("--native-disabled-passes", default="",
                    help="pass,... : also time the native engine without these graph passes (variant native_policy)")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--markdown", type=pathlib.Path, default=None)
    ap.add_argument("--prepare-jobs", type=int, default=0,
                    help="export and compile the models in this many subprocesses before timing (see above)")
    ap.add_argument("--prepare-only", action="store_true",
                    help="only export and compile (with --prepare-jobs: in that many processes), time nothing")
    ap.add_argument("--resume", type=pathlib.Path, default=None,
                    help="JSON lines of rows done by earlier runs: kept, not timed again; new rows appended")
    ap.add_argument("--ort-both", action="store_true",
                    help="time ONNX Runtime without CUDA graphs also where its CUDA graph works")
    ap.add_argument("--audit", type=int, default=0,
                    help="after timing, profile this many native runs and keep their roofline audit in the row")
    ap.add_argument("--render", type=pathlib.Path, default=None,
                    help="print the table of the JSON rows in this log of an earlier run, and stop")
    args = ap.parse_args(argv)
    if args.render is not None:
        print(report(rows_in_log(args.render.read_text())))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("model_suite_bench: needs a CUDA device", file=sys.stderr)
        return 2
    binary = None if args.prepare_only else _session_bench().find_bench(args.ort_direct)
    kernels = dict(item.split("=", 1) for item in args.native_kernels.split(",") if item)
    models = [m for m in args.models.split(",") if m]
    skip = [s for s in args.skip.split(",") if s]
    batches = [int(b) for b in args.batches.split(",")]
    todo, rows = {m: batches for m in models}, []
    if args.resume is not None:
        previous = rows_in_log(args.resume.read_text()) if args.resume.exists() else []
        todo, rows = resume_plan(models, batches, previous)
        print(f"--resume {args.resume}: {len(rows)} rows kept, {sum(map(len, todo.values()))} to time", flush=True)
        models = list(todo)
    if args.prepare_jobs > 0 and models:
        args.dir.mkdir(parents=True, exist_ok=True)
        prepare_in_parallel(models, args.prepare_jobs, list(argv if argv is not None else sys.argv[1:]))
        if args.prepare_only:  # the parallel preparation alone (a device call of its own)
            return 0
    elif args.prepare_only:  # one of prepare_in_parallel's processes
        for name in models:
            try:
                prepare_model(name, args.dir, batches, args.seq, skip)
            except Exception as error:  # noqa: BLE001: the timing run reports it in its table
                print(f"prepare {name}: {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)
        return 0
    def keep(row: Dict) -> None:  # --resume: each row in the file as soon as it is done
        with args.resume.open("a") as out:
            out.write(json.dumps(row) + "\n")

    for name in models:
        rows += bench_model(name, args.dir, todo[name], args.seq, args.iterations, args.warmup, binary, skip, kernels,
                            [p for p in args.native_disabled_passes.split(",") if p],
                            keep if args.resume is not None else None, args.audit, args.ort_both)
    order = [m for m in args.models.split(",") if m]
    rows.sort(key=lambda r: (order.index(r["model"]), r["batch"]))  # kept and new rows in the suite's order
    device = torch.cuda.get_device_name(0)
    header = (f"{datetime.date.today()} on {device}, torch {torch.__version__}, float16, sequence {args.seq}, "
              f"median ms of {args.iterations} calls")
    text = header + "\n\n" + report(rows)
    notes = [f"- {r['model']} batch {r['batch']}: {n}" for r in rows for n in r["notes"]]
    if notes:
        text += "\n\n" + "\n".join(notes)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
