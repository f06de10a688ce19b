"""The CPU engines on the real-model suite and on single convolutions, pools and GEMMs at ImageNet sizes:
xpuruntime's native engine against ONNX Runtime's CPU EP, in one run on one machine (issue 42; docs/benchmarks.md
"The CPU engine: instruction sets, packed GEMM, convolutions without im2col").

Cases:
  suite:<name>   every dynamo float32 export of models/suite/tiny (its stored inputs, batch 3)
  op:<name>      one node at the size a full model has it (ResNet-50's 3x3 and stem, MobileNet's depthwise and
                 pointwise, ResNeXt's grouped 3x3, the ResNet max pool, BERT-base's linear layers at 128 tokens)

Variants:
  native         xrt.InferenceSession(engine="native", device="cpu"), default policy (all cores): the window loops
                 and packed GEMM of the best instruction set this CPU has
  native_before  the same with XPURT_CPU_ISA=baseline (SSE2 window loops) and XPURT_CPU_GEMM=blas (OpenBLAS, im2col
                 tiles): the instruction-set and GEMM mechanisms switched off, in the same process
  onnxruntime    xrt.InferenceSession(engine="onnxruntime", device="cpu"): ONNX Runtime's CPU EP, default options

The variants are timed in interleaved rounds (--rounds, each --calls calls per variant after --block-warmup untimed
ones, each call timed on its own)
so that a change in the machine's load hits all of them alike; the table gives medians over every call. Outputs are
compared with ONNX Runtime's (max |difference| over max |reference|).

    .venv/bin/python benchmarks/cpu_suite_bench.py [--cases suite:resnet,op:conv3x3_r50] [--rounds 5] [--calls 20]
        [--skip-before] [--threads 1] [--clock process] [--json out.json] [--markdown out.md]

--threads N gives both engines ExecutionPolicy(intra_op_threads=N) (0, the default: each engine's own default);
--sequential times each variant alone instead (its session closed before the next one's is made, so no engine's
spinning workers take a core from another's calls), the best of --rounds blocks of --calls back-to-back calls.
--clock process times each call's process CPU time (time.process_time: less disturbed by other jobs on a shared
machine than the wall clock, but with several threads it adds their times) instead of the wall clock.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import sys
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src" / "python"))
import xpuruntime as xrt  # noqa: E402

SUITE = ROOT / "models" / "suite" / "tiny"


def _conv(n: int, c: int, hw: int, o: int, k: int, s: int, p: int, groups: int = 1, relu: bool = True):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((o, c // groups, k, k)) * 0.1).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["z" if relu else "y"], kernel_shape=[k, k], strides=[s, s],
                              pads=[p] * 4, group=groups)]
    if relu:
        nodes.append(helper.make_node("Relu", ["z"], ["y"]))
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), {"x": x}


def _max_pool(n: int, c: int, hw: int):
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                                pads=[1, 1, 1, 1])], "pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = np.random.default_rng(0).standard_normal((n, c, hw, hw)).astype(np.float32)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), {"x": x}


def _linear(m: int, n: int, k: int):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    x = rng.standard_normal((m, k)).astype(np.float32)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), {"x": x}


def _log_softmax(rows: int, width: int):
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)], "log_softmax",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), {"x": x}


def _reduce(op: str, shape: Tuple[int, ...], axes, dtype: str = "float32"):
    """One ReduceMax/ReduceSum/... (opset 18: axes as an input; none: every axis)."""
    from onnx import TensorProto, helper
    elem = TensorProto.BOOL if dtype == "bool" else TensorProto.FLOAT
    inputs, inits = ["x"], []
    if axes is not None:
        inputs.append("axes")
        inits.append(helper.make_tensor("axes", TensorProto.INT64, [len(axes)], list(axes)))
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], keepdims=0)], "reduce",
                              [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x = x > 100.0 if dtype == "bool" else x  # bools all false: any() reads every byte
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString(), {"x": x}


OPS: Dict[str, Tuple[str, Callable]] = {
    "conv3x3_r50": ("ResNet-50 3x3, 64 ch at 56x56, +ReLU", lambda: _conv(1, 64, 56, 64, 3, 1, 1)),
    "stem7x7s2": ("ResNet stem 7x7 stride 2, 3->64 at 224x224, +ReLU", lambda: _conv(1, 3, 224, 64, 7, 2, 3)),
    "conv3x3s2": ("3x3 stride 2, 128->256 at 28x28, +ReLU", lambda: _conv(1, 128, 28, 256, 3, 2, 1)),
    "pointwise": ("MobileNet 1x1, 96->24 at 56x56", lambda: _conv(1, 96, 56, 24, 1, 1, 0, relu=False)),
    "conv3x3_late": ("ResNet-50 last 3x3, 512 ch at 7x7, +ReLU", lambda: _conv(1, 512, 7, 512, 3, 1, 1)),
    "pointwise_late": ("ResNet-50 last 1x1, 2048->512 at 7x7, +ReLU", lambda: _conv(1, 2048, 7, 512, 1, 1, 0)),
    "conv3x3_14": ("ResNet-50 3x3, 256 ch at 14x14, +ReLU", lambda: _conv(1, 256, 14, 256, 3, 1, 1)),
    "depthwise": ("MobileNet depthwise 3x3, 96 ch at 112x112, +ReLU", lambda: _conv(1, 96, 112, 96, 3, 1, 1, 96)),
    "depthwise_s2": ("depthwise 3x3 stride 2, 144 ch at 56x56, +ReLU", lambda: _conv(1, 144, 56, 144, 3, 2, 1, 144)),
    "depthwise5x5": ("EfficientNet depthwise 5x5, 240 ch at 28x28", lambda: _conv(1, 240, 28, 240, 5, 1, 2, 240)),
    "grouped": ("ResNeXt grouped 3x3, 32 groups, 256 ch at 28x28", lambda: _conv(1, 256, 28, 256, 3, 1, 1, 32)),
    "max_pool": ("ResNet max pool 3x3 stride 2, 64 ch at 112x112", lambda: _max_pool(1, 64, 112)),
    "linear_768": ("BERT-base linear 128x768 @ 768x768", lambda: _linear(128, 768, 768)),
    "linear_3072": ("BERT-base FFN 128x768 @ 768x3072", lambda: _linear(128, 3072, 768)),
    "linear_16": ("BERT-base FFN at 16 tokens, 16x768 @ 768x3072", lambda: _linear(16, 3072, 768)),
    "log_softmax_vocab": ("LogSoftmax over 64 rows of 50,257 (an LM head)", lambda: _log_softmax(64, 50257)),
    "reduce_max_all": ("x.max() of 10M floats (Note [Few long rows split])",
                       lambda: _reduce("ReduceMax", (10485760,), None)),
    "reduce_sum_rows": ("sum of 3 rows of 1M floats", lambda: _reduce("ReduceSum", (3, 1048576), [1])),
    "any_bool": ("isinf(x).any() after predicate_reduction: any of 10M bools, all false",
                 lambda: _reduce("ReduceMax", (10485760,), None, "bool")),
}

BEFORE_ENV = {"XPURT_CPU_ISA": "baseline", "XPURT_CPU_GEMM": "blas"}


def _suite_case(name: str):
    data = np.load(SUITE / f"{name}.npz")
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
    return str(SUITE / f"{name}.dynamo.float32.onnx"), feeds


def _session(model, variant: str, threads: int = 0):
    """A session of `variant`; native_before's environment is read when its plans are built (the first runs)."""
    policy = xrt.ExecutionPolicy(intra_op_threads=threads)
    engine = "onnxruntime" if variant == "onnxruntime" else "native"
    return xrt.InferenceSession(model, engine=engine, device="cpu", exec_policy=policy)


def _with_env(variant: str, call: Callable):
    saved = {k: os.environ.get(k) for k in BEFORE_ENV}
    if variant == "native_before":
        os.environ.update(BEFORE_ENV)
    try:
        return call()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _row(case: str, what: str, variants: List[str], times: Dict[str, float], outputs: Dict) -> Dict:
    reference = outputs.get("onnxruntime", outputs[variants[0]])
    row = {"case": case, "what": what}
    scale = max(float(max(np.abs(r).max() for r in reference if r.size)), 1e-30)
    for variant in variants:
        row[variant] = times[variant]
        row[f"{variant}_diff"] = float(max(np.abs(a.astype(np.float64) - r).max() if r.size else 0.0
                                           for a, r in zip(outputs[variant], reference))) / scale
    return row


def _run_sequential(case: str, what: str, model, feeds, variants: List[str], rounds: int, calls: int, warmup: int,
                    threads: int, clock: Callable[[], float]) -> Dict:
    """--sequential: each variant alone, its session made, warmed, timed and closed before the next one's exists (no
    other engine's workers spinning on the cores); the best of `rounds` blocks of `calls` back-to-back calls."""
    best, outputs = {}, {}
    for variant in variants:
        session = _with_env(variant, lambda: _session(model, variant, threads))
        outputs[variant] = _with_env(variant, lambda: [np.asarray(o) for o in session.run(None, feeds)])
        for _ in range(warmup):
            session.run(None, feeds)
        blocks = []
        for _ in range(rounds):
            start = clock()
            for _ in range(calls):
                session.run(None, feeds)
            blocks.append((clock() - start) / calls)
        best[variant] = float(min(blocks) * 1e3)
        del session
    return _row(case, what, variants, best, outputs)


def run_case(case: str, variants: List[str], rounds: int, calls: int, warmup: int, block_warmup: int = 3,
             threads: int = 0, clock: Callable[[], float] = time.perf_counter, sequential: bool = False) -> Dict:
    kind, name = case.split(":", 1)
    if kind == "suite":
        model, feeds = _suite_case(name)
        what = f"{name} (models/suite/tiny, batch {next(iter(feeds.values())).shape[0]})"
    else:
        what, make = OPS[name]
        model, feeds = make()
    sessions, outputs = {}, {}
    if sequential:
        return _run_sequential(case, what, model, feeds, variants, rounds, calls, warmup, threads, clock)
    for variant in variants:
        session = _with_env(variant, lambda: _session(model, variant, threads))
        outputs[variant] = _with_env(variant, lambda: [np.asarray(o) for o in session.run(None, feeds)])
        for _ in range(warmup):
            session.run(None, feeds)
        sessions[variant] = session
    times: Dict[str, List[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            session = sessions[variant]
            # Untimed calls first: the engine that ran before may still hold the cores (ONNX Runtime's workers spin
            # after a run) and this engine's own workers may be parked (docs/benchmarks.md, 2026-12-05).
            for _ in range(block_warmup):
                session.run(None, feeds)
            for _ in range(calls):
                start = clock()
                session.run(None, feeds)
                times[variant].append(clock() - start)
    return _row(case, what, variants, {v: float(np.median(times[v]) * 1e3) for v in variants}, outputs)


def geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(rows: List[Dict], variants: List[str]) -> str:
    header = "| case | " + " | ".join(f"{v} ms" for v in variants) + " | onnxruntime / native |" + \
        (" onnxruntime / native_before |" if "native_before" in variants else "") + " max rel. diff (native) |"
    lines = [header, "|" + "---|" * (len(variants) + 3 + ("native_before" in variants))]
    for r in rows:
        cells = [f"{r[v]:.3f}" for v in variants]
        ratio = f"{r['onnxruntime'] / r['native']:.2f}"
        before = f" {r['onnxruntime'] / r['native_before']:.2f} |" if "native_before" in variants else ""
        lines.append(f"| {r['what']} | " + " | ".join(cells) + f" | {ratio} |{before} {r['native_diff']:.1e} |")
    for kind in ("suite", "op"):
        picked = [r for r in rows if r["case"].startswith(kind + ":")]
        if not picked:
            continue
        text = f"geometric mean of onnxruntime / native over {len(picked)} {kind} cases: " \
            f"{geomean([r['onnxruntime'] / r['native'] for r in picked]):.2f}"
        if "native_before" in variants:
            text += f" (native_before: {geomean([r['onnxruntime'] / r['native_before'] for r in picked]):.2f})"
        lines.append("")
        lines.append(text)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help="comma-separated suite:<name> / op:<name> (default: all)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-warmup", type=int, default=3,
                        help="untimed calls at the start of each variant's block of --calls (0: the old timing)")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--skip-before", action="store_true", help="leave out the native_before variant")
    parser.add_argument("--threads", type=int, default=0, help="intra_op_threads of both engines (0: their default)")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall")
    parser.add_argument("--sequential", action="store_true",
                        help="time each variant alone, the best of --rounds blocks of --calls (no interleaving)")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c] or \
        [f"suite:{p.name.split('.')[0]}" for p in sorted(SUITE.glob("*.dynamo.float32.onnx"))] + \
        [f"op:{name}" for name in OPS]
    variants = ["native"] + ([] if args.skip_before else ["native_before"]) + ["onnxruntime"]
    print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f}, threads "
          f"{args.threads or 'default'}, {args.clock} time", flush=True)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    rows = []
    for case in cases:
        row = run_case(case, variants, args.rounds, args.calls, args.warmup, args.block_warmup, args.threads, clock,
                       args.sequential)
        rows.append(row)
        print("  " + ", ".join([case] + [f"{v} {row[v]:.3f} ms" for v in variants]), flush=True)
    table = markdown(rows, variants)
    print()
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
