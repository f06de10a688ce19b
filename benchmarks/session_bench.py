"""End-to-end latency of the model zoo through xpuruntime.InferenceSession, against ONNX Runtime used directly
and PyTorch.

For each zoo model (scripts/make_model_zoo.py: mlp, bert, resnet50; float16 on CUDA, float32 on the CPU) and
batch size (1 and 32), with inputs already on the device, it times:

  ort                xrt.InferenceSession(engine="onnxruntime"), ExecutionPolicy(cuda_graphs=False)
  ort_graphs         the same with cuda_graphs=True (CUDA only; staging copies included, see docs/engines.md)
  native             xrt.InferenceSession(engine="native") with its default policy (CUDA graphs on; skipped with a
                     note when the native engine is not available or cannot run the model)
  native_tuned       the same with KernelPolicy(TUNED_POLICY): cuDNN's timed conv algorithm search (ORT's default)
                     and timed GEMM kernel choice
  native_cpp         the native engine's InferenceSession called from C++ (benchmarks/session_direct_bench.cpp):
                     no Python call in the timing, like ort_direct
  ort_graphs_cpp     the onnxruntime engine with CUDA graphs, called from C++ the same way (CUDA only)
  native_cpp_iob     native_cpp with the inputs and outputs bound once (IoBinding, run_with_binding): the same I/O
                     as ort_direct's
  ort_graphs_cpp_iob ort_graphs_cpp the same way: the engine replays ORT's graph over the bound tensors (CUDA only)
  ort_direct         ONNX Runtime's C++ API, same EP and options, I/O bound on the device (benchmarks/
                     ort_direct_bench.cpp, built by benchmarks/CMakeLists.txt when ONNX Runtime is found)
  ort_direct_graphs  the same with enable_cuda_graph=1 (CUDA only)
  torch_eager        an equivalent torch model built from the same weights (torch.inference_mode)
  torch_graphs       that model captured in a torch.cuda.CUDAGraph and replayed (CUDA only)

Each latency is the median and the 90th percentile over --iterations calls after --warmup calls; every call is
timed on the host and followed by a device synchronization inside its timing (synchronize-based timing), so
asynchronous work is counted. `best_mean_ms` in the JSON is benchmarks/timing.py's best-of-batches mean of
back-to-back calls. Outputs of every variant are compared with the `ort` variant's (max abs difference).

    python3 benchmarks/session_bench.py [--device cuda] [--models mlp,bert,resnet50] [--batches 1,32]
        [--dtype fp16] [--iterations 200] [--warmup 20] [--ort-direct build-gpu/benchmarks/ort_direct_bench]
        [--json out.json] [--markdown out.md]
    python3 benchmarks/session_bench.py --device cpu --tiny      # a quick check on a machine without a GPU

On CUDA the ONNX Runtime variants need the CUDA execution provider: XPURT_ORT_CUDA_PROVIDER (scripts/
stage_ort_cuda.sh, scripts/ort_cuda_unstage.sh). torch is imported only when a torch variant runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import platform
import re
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import make_model_zoo as zoo  # noqa: E402
from timing import best_us  # noqa: E402

import xpuruntime as xrt  # noqa: E402

VARIANTS = ("ort", "ort_graphs", "native", "native_tuned", "native_cpp", "ort_graphs_cpp", "native_cpp_iob",
            "ort_graphs_cpp_iob", "ort_direct", "ort_direct_graphs", "torch_eager", "torch_graphs")
# The policy of the native_tuned variant: cuDNN's timed algorithm search for convolutions (what ONNX Runtime's CUDA
# EP does by default, cudnn_conv_algo_search=EXHAUSTIVE) and timed kernel choice for GEMMs.
TUNED_POLICY = {"conv": "cudnn_search", "matmul": "auto:BestPerformance"}
CUDA_ONLY = {"ort_graphs", "ort_graphs_cpp", "ort_graphs_cpp_iob", "ort_direct_graphs", "torch_graphs"}
# Max abs difference from the `ort` variant above which a variant's output is reported as a mismatch.
TOLERANCE = {"fp32": 1e-3, "fp16": 5e-2}


# ---------------------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------------------


def latency(fn: Callable[[], object], iterations: int, warmup: int, sync: Optional[Callable[[], object]]) -> Dict:
    """Median / p90 / mean / min milliseconds of `fn` followed by `sync`, each call timed on its own."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        fn()
        if sync:
            sync()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    samples = np.asarray(samples)
    mean_batch = max(1, min(iterations, 50))
    return {
        "median_ms": float(np.percentile(samples, 50)),
        "p90_ms": float(np.percentile(samples, 90)),
        "mean_ms": float(samples.mean()),
        "min_ms": float(samples.min()),
        "best_mean_ms": best_us(fn, mean_batch, repeats=3, warmup=0, sync=sync) / 1e3,
        "iterations": iterations,
    }


# ---------------------------------------------------------------------------------------------------------------
# models and inputs
# ---------------------------------------------------------------------------------------------------------------


def model_path(zoo_dir: pathlib.Path, name: str, tiny: bool, dtype: str) -> pathlib.Path:
    """The zoo file, written by make_model_zoo's builders when missing."""
    path = zoo_dir / zoo.file_name(name, tiny, dtype)
    if not path.exists():
        model = zoo.BUILDERS[name](tiny=tiny)
        zoo.save(zoo.to_fp16(model) if dtype == "fp16" else model, path)
    return path


def make_inputs(session: "xrt.InferenceSession", batch: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """Random inputs for every model input: symbolic dims take `batch`; int64 inputs are token ids below 1000."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        shape = [batch if isinstance(d, str) else int(d) for d in info.shape]
        if info.dtype == "int64":
            feeds[info.name] = rng.integers(0, 1000, size=shape, dtype=np.int64)
        else:
            feeds[info.name] = (0.5 * rng.standard_normal(shape)).astype(info.dtype)
    return feeds


def to_numpy(value) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch
        return value.detach().float().cpu().numpy()
    return value.cpu().numpy()


# ---------------------------------------------------------------------------------------------------------------
# variants
# ---------------------------------------------------------------------------------------------------------------


class Skip(Exception):
    """A variant that cannot run here; the message says why."""


def run_xrt(path, device, engine, graphs, feeds_np, iterations, warmup, kernel_policy=None):
    try:
        policy = xrt.ExecutionPolicy(cuda_graphs=graphs)
        session = xrt.InferenceSession(str(path), device=device, engine=engine, exec_policy=policy,
                                       kernel_policy=kernel_policy)
    except (xrt.UnsupportedOperationError, xrt.CudaError) as error:
        raise Skip(f"{engine}: {str(error).splitlines()[0]}") from error
    feeds = {k: (v if device == "cpu" else xrt.from_numpy(v).to(device)) for k, v in feeds_np.items()}
    output_name = session.get_outputs()[0].name
    result = to_numpy(session.run(feeds)[output_name])
    sync = (lambda: xrt.synchronize(device)) if device != "cpu" else None
    stats = latency(lambda: session.run(feeds), iterations, warmup, sync)
    # Only what went differently from the policy (graphs refused or not used), not the mapping itself.
    stats["notes"] = [f"{engine}: {n}" for n in session.explain().policy_notes
                      if "cuda_graph" in n and re.search(r"\bnot\b|failed", n)]
    return stats, result


def find_bench(explicit: Optional[str], binary: str = "ort_direct_bench") -> Optional[pathlib.Path]:
    if explicit:
        return pathlib.Path(explicit).parent / binary
    for candidate in ["build-gpu", "build"] + sorted(p.name for p in ROOT.glob("build-*")):
        path = ROOT / candidate / "benchmarks" / binary
        if path.exists():
            return path
    return None


def failure(done: subprocess.CompletedProcess) -> str:
    """Why a benchmark subprocess failed: the signal that killed it, or its exit code, and its last line of output
    that is not a warning (ANSI colours removed)."""
    import signal
    if done.returncode < 0:
        try:
            how = f"killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            how = f"killed by signal {-done.returncode}"
    else:
        how = f"exit code {done.returncode}"
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
             for line in (done.stderr or "").splitlines() + (done.stdout or "").splitlines()]
    lines = [line for line in lines if line]
    last = next((line for line in reversed(lines) if "[W:" not in line), lines[-1] if lines else "")
    return f"{how}: {last[:200]}" if last else how


def run_session_direct(binary, path, device, engine, batch, graphs, iterations, warmup, io_binding=False):
    if binary is None or not binary.exists():
        raise Skip("native_cpp/ort_graphs_cpp: no session_direct_bench binary (build the benchmarks)")
    command = [str(binary), "--model", str(path), "--engine", engine, "--batch", str(batch), "--device", device,
               "--graphs", "1" if graphs else "0", "--iterations", str(iterations), "--warmup", str(warmup),
               "--io-binding", "1" if io_binding else "0"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise Skip(f"{engine} from C++: {failure(done)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ort_direct(binary, path, device, batch, graphs, iterations, warmup):
    if binary is None or not binary.exists():
        raise Skip("ort_direct: no ort_direct_bench binary (build the benchmarks with ONNX Runtime found, or pass "
                   "--ort-direct)")
    command = [str(binary), "--model", str(path), "--batch", str(batch), "--device", "cpu" if device == "cpu" else
               "cuda", "--graphs", "1" if graphs else "0", "--iterations", str(iterations), "--warmup", str(warmup)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise Skip(f"ort_direct: {failure(done)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def torch_forward(torch, name: str, tiny: bool, weights: Dict[str, "object"]):
    """The zoo model `name` as a torch function of its input, mirroring make_model_zoo's graph node for node."""
    F = torch.nn.functional
    W = weights
    if name == "mlp":
        cfg = zoo.MLP[tiny]

        def forward(x):
            for i in range(cfg.layers):
                x = F.relu(F.linear(x, W[f"fc{i}.weight"], W[f"fc{i}.bias"]))
            return x

        return forward
    if name == "bert":
        cfg = zoo.BERT[tiny]
        d = cfg.hidden // cfg.heads

        def layer_norm(x, n):
            return F.layer_norm(x, (cfg.hidden,), W[f"{n}.weight"], W[f"{n}.bias"], cfg.epsilon)

        def linear(x, n):
            return x @ W[f"{n}.weight"] + W[f"{n}.bias"]  # stored [in, out], as MatMul + Add

        def forward(ids):
            b, s = ids.shape
            h = F.embedding(ids, W["embeddings.word_embeddings"]) + W["embeddings.position_embeddings"]
            h = layer_norm(h, "embeddings.layer_norm")
            for i in range(cfg.layers):
                p = f"layer{i}.attention"
                q = linear(h, f"{p}.query").view(b, s, cfg.heads, d).permute(0, 2, 1, 3)
                k = linear(h, f"{p}.key").view(b, s, cfg.heads, d).permute(0, 2, 3, 1)
                v = linear(h, f"{p}.value").view(b, s, cfg.heads, d).permute(0, 2, 1, 3)
                probs = torch.softmax((q @ k) / math.sqrt(d), dim=-1)
                context = (probs @ v).permute(0, 2, 1, 3).reshape(b, s, cfg.hidden)
                h = layer_norm(linear(context, f"{p}.output") + h, f"{p}.layer_norm")
                f = linear(h, f"layer{i}.ffn.intermediate")
                f = f * ((torch.erf(f / math.sqrt(2.0)) + 1) * 0.5)
                h = layer_norm(linear(f, f"layer{i}.ffn.output") + h, f"layer{i}.ffn.layer_norm")
            return h

        return forward
    if name == "resnet50":
        cfg = zoo.RESNET[tiny]

        def conv_bn(x, n, k, stride, relu):
            y = F.conv2d(x, W[f"{n}.weight"], stride=stride, padding=k // 2)
            y = F.batch_norm(y, W[f"{n}.bn.running_mean"], W[f"{n}.bn.running_var"], W[f"{n}.bn.weight"],
                             W[f"{n}.bn.bias"], training=False, eps=cfg.epsilon)
            return F.relu(y) if relu else y

        def forward(x):
            h = F.max_pool2d(conv_bn(x, "conv1", 7, 2, True), kernel_size=3, stride=2, padding=1)
            for stage, blocks in enumerate(cfg.blocks):
                for block in range(blocks):
                    p = f"layer{stage + 1}.{block}"
                    stride = 2 if block == 0 and stage > 0 else 1
                    y = conv_bn(h, f"{p}.conv1", 1, 1, True)
                    y = conv_bn(y, f"{p}.conv2", 3, stride, True)
                    y = conv_bn(y, f"{p}.conv3", 1, 1, False)
                    shortcut = conv_bn(h, f"{p}.downsample", 1, stride, False) if block == 0 else h
                    h = F.relu(y + shortcut)
            h = torch.flatten(F.adaptive_avg_pool2d(h, 1), 1)
            return F.linear(h, W["fc.weight"], W["fc.bias"])

        return forward
    raise ValueError(f"unknown model {name}")


def run_torch(path, name, tiny, device, feeds_np, graphs, iterations, warmup):
    try:
        import torch
    except ImportError as error:
        raise Skip("torch: not installed") from error
    import onnx
    from onnx import numpy_helper

    if device != "cpu" and not torch.cuda.is_available():
        raise Skip("torch: no CUDA device visible to torch")
    torch_device = torch.device("cpu" if device == "cpu" else device)
    # Same math as ONNX Runtime with use_tf32=0: no TF32; cuDNN may pick its fastest algorithm.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    model = onnx.load(str(path))
    weights = {init.name: torch.from_numpy(numpy_helper.to_array(init).copy()).to(torch_device)
               for init in model.graph.initializer}
    forward = torch_forward(torch, name, tiny, weights)
    (x_np,) = feeds_np.values()
    x = torch.from_numpy(x_np).to(torch_device)
    with torch.inference_mode():
        if not graphs:
            result = to_numpy(forward(x))
            sync = torch.cuda.synchronize if device != "cpu" else None

            def step():
                with torch.inference_mode():
                    forward(x)

            return latency(step, iterations, warmup, sync), result
        static_input = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                forward(static_input)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_output = forward(static_input)
        graph.replay()
        torch.cuda.synchronize()
        result = to_numpy(static_output)
    return latency(graph.replay, iterations, warmup, torch.cuda.synchronize), result


# ---------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------


def environment(device: str) -> Dict[str, str]:
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": platform.node(), "device": device, "xpuruntime": getattr(xrt, "__version__", "?")}
    if device != "cpu":
        try:
            env["device_name"] = str(xrt.get_device_info(device).name)
        except Exception:  # noqa: BLE001: the name is only a label
            env["device_name"] = "?"
    return env


def format_ms(row: Dict, variant: str) -> str:
    cell = row["variants"].get(variant)
    if cell is None:
        return "n/a"
    if "skipped" in cell:
        return "skip"
    text = f"{cell['median_ms']:.3f} ({cell['p90_ms']:.3f})"
    return text + " !" if cell.get("mismatch") else text


def table(rows: List[Dict], variants: List[str]) -> str:
    header = ["model", "batch"] + variants + ["native / ORT-graphs speedup"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = [row["model"], str(row["batch"])] + [format_ms(row, v) for v in variants]
        speedup = row.get("speedup")
        cells.append(f"{speedup:.2f}x" if speedup else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--tiny", action="store_true", help="the tiny zoo variants (quick; for CPU checks)")
    parser.add_argument("--models", default=",".join(zoo.MODEL_NAMES), help="comma-separated zoo models")
    parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    parser.add_argument("--dtype", choices=("fp16", "fp32"), default=None, help="default: fp16 on CUDA, fp32 on cpu")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated subset of " + ", ".join(VARIANTS))
    parser.add_argument("--iterations", type=int, default=None, help="timed calls (default 200; 20 on cpu)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 20; 3 on cpu)")
    parser.add_argument("--zoo", default=str(ROOT / "models" / "zoo"), help="zoo folder (models written when missing)")
    parser.add_argument("--ort-direct", default=None, help="the ort_direct_bench binary (default: build*/benchmarks/)")
    parser.add_argument("--json", default=None, help="write every number and note as JSON here")
    parser.add_argument("--markdown", default=None, help="write the table and notes as markdown here")
    args = parser.parse_args(argv)

    device = "cuda:0" if args.device == "cuda" else args.device
    on_cpu = device == "cpu"
    dtype = args.dtype or ("fp32" if on_cpu else "fp16")
    iterations = args.iterations or (20 if on_cpu else 200)
    warmup = args.warmup if args.warmup is not None else (3 if on_cpu else 20)
    variants = [v for v in args.variants.split(",") if v and not (on_cpu and v in CUDA_ONLY)]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; valid: {', '.join(VARIANTS)}")
    if not on_cpu and xrt.get_device_count() == 0:
        reason = xrt.runtime.device.cuda_unavailable_reason()
        parser.error(f"--device {args.device}: no CUDA device ({reason}); use --device cpu")
    ort_direct = find_bench(args.ort_direct)
    session_direct = find_bench(args.ort_direct, "session_direct_bench")
    zoo_dir = pathlib.Path(args.zoo)

    rows: List[Dict] = []
    notes: List[str] = []
    for name in [m for m in args.models.split(",") if m]:
        for batch in [int(b) for b in args.batches.split(",") if b]:
            path = model_path(zoo_dir, name, args.tiny, dtype)
            label = f"{name}{'_tiny' if args.tiny else ''}_{dtype}"
            probe = xrt.InferenceSession(str(path), engine="onnxruntime")
            feeds = make_inputs(probe, batch)
            del probe
            row = {"model": label, "batch": batch, "variants": {}}
            reference = None
            for variant in variants:
                try:
                    if variant in ("ort", "ort_graphs", "native", "native_tuned"):
                        engine = "native" if variant.startswith("native") else "onnxruntime"
                        # The native engine runs with its defaults (CUDA graphs on); native_tuned adds TUNED_POLICY.
                        graphs = variant in ("ort_graphs", "native", "native_tuned")
                        kernel_policy = xrt.KernelPolicy(TUNED_POLICY) if variant == "native_tuned" else None
                        stats, result = run_xrt(path, device, engine, graphs, feeds, iterations, warmup,
                                                kernel_policy)
                    elif variant in ("native_cpp", "ort_graphs_cpp", "native_cpp_iob", "ort_graphs_cpp_iob"):
                        engine = "native" if variant.startswith("native") else "onnxruntime"
                        stats, result = run_session_direct(session_direct, path, device, engine, batch,
                                                           not on_cpu, iterations, warmup,
                                                           io_binding=variant.endswith("_iob")), None
                    elif variant.startswith("ort_direct"):
                        stats, result = run_ort_direct(ort_direct, path, device, batch, variant.endswith("graphs"),
                                                       iterations, warmup), None
                    else:
                        stats, result = run_torch(path, name, args.tiny, device, feeds, variant == "torch_graphs",
                                                  iterations, warmup)
                except Skip as skip:
                    stats, result = {"skipped": str(skip)}, None
                    if str(skip) not in notes:
                        notes.append(str(skip))
                except Exception as error:  # noqa: BLE001: one failing variant must not hide the others
                    first_line = str(error).splitlines()[0] if str(error) else ""
                    message = f"{variant} on {label} batch {batch}: {type(error).__name__}: {first_line}"
                    stats, result = {"skipped": message}, None
                    notes.append(message)
                if result is not None:
                    if reference is None and variant == "ort":
                        reference = result
                    elif reference is not None:
                        diff = float(np.max(np.abs(result.astype(np.float64) - reference.astype(np.float64))))
                        stats["max_abs_diff_vs_ort"] = diff
                        if not diff <= TOLERANCE[dtype]:
                            stats["mismatch"] = True
                            notes.append(f"{variant} on {label} batch {batch}: output differs from ort by {diff:.3g}")
                for note in stats.pop("notes", []):
                    if note not in notes:
                        notes.append(note)
                row["variants"][variant] = stats
                sys.stderr.write(f"{label} batch {batch} {variant}: "
                                 f"{stats.get('median_ms', stats.get('skipped'))}\n")
            native = row["variants"].get("native", {})
            baseline = row["variants"].get("ort_graphs") or row["variants"].get("ort") or {}
            if "median_ms" in native and "median_ms" in baseline:
                row["speedup"] = baseline["median_ms"] / native["median_ms"]
            rows.append(row)

    env = environment(device)
    text = (f"Session latency, {env['date']}, {env.get('device_name', device)} ({device}), {dtype}, "
            f"{iterations} iterations after {warmup} warm-up; ms median (p90); ! = output differs from ort\n\n"
            + table(rows, variants) + "\n")
    if notes:
        text += "\nNotes:\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"environment": env, "dtype": dtype, "rows": rows,
                                                       "notes": notes}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
