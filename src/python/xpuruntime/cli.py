"""The ``xpuruntime`` command line: devices, run, bench, explain, profile, audit, tune, compare, quantize
and generate.

Run ``xpuruntime --help`` (or ``python -m xpuruntime --help``); docs/cli.md has every command with an example.

Exit codes: 0 success; 1 a run failed (a runtime error, or ``compare`` found a mismatch); 2 a bad argument (a
missing file, an unknown engine, a malformed policy, ``--inputs`` that do not fit the model), reported as one line
on stderr, never as a traceback (``--traceback`` shows it when debugging the CLI itself).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple

import numpy as np

PROG = "xpuruntime"
POLICY_SUFFIXES = (".json", ".yaml", ".yml")


class UsageError(Exception):
    """A bad argument: printed as one line, exit code 2."""


class CommandFailed(Exception):
    """The command ran but failed (e.g. the profiler is missing from this build): one line, exit code 1."""


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``xpuruntime run: error: ... (see xpuruntime run --help)``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got '{text}'") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _int_range(text: str) -> Tuple[int, int]:
    try:
        low, high = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH (integers), got '{text}'") from None
    if high <= low:
        raise argparse.ArgumentTypeError(f"expected LOW < HIGH, got {low},{high}")
    return low, high


def _engines() -> List[str]:
    from . import _core

    return list(_core.known_engines())


def _engine_help(engine_default: str) -> str:
    """--engine's help: which engines run on the CPU here and which do not (every known name stays a choice, so that
    asking for one this build lacks says what to install)."""
    from . import _core

    availability = _core.engine_availability()
    here = ", ".join(name for name, ok, _ in availability if ok)
    missing = ", ".join(name for name, ok, _ in availability if not ok)
    return (f"the engine (default: {engine_default}); available here on the CPU: {here}"
            + (f"; not available: {missing} (`xpuruntime devices` says why)" if missing else ""))


def _add_model_args(parser: argparse.ArgumentParser, engine_default: str = "auto") -> None:
    parser.add_argument("model", help="the ONNX model file")
    parser.add_argument("--engine", default=engine_default, choices=_engines(), help=_engine_help(engine_default))
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--policy", metavar="FILE", help="a KernelPolicy file (.json, .yaml, .yml)")
    parser.add_argument("--exec-policy", metavar="FILE", help="an ExecutionPolicy file (.json, .yaml, .yml)")
    parser.add_argument("--fp16", action="store_true", help="run in float16 (ExecutionPolicy precision=fp16)")


def _add_input_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", metavar="FILE.npz",
                        help="input arrays by input name (.npz; .npy for a one-input model); default: random")
    parser.add_argument("--batch", type=_positive_int, default=1,
                        help="the size of every symbolic dimension of random inputs (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    parser.add_argument("--int-range", type=_int_range, default=(0, 2), metavar="LOW,HIGH",
                        help="integer random inputs are drawn from [LOW, HIGH) (default: 0,2: valid indices and "
                             "masks for any model)")


def build_parser() -> argparse.ArgumentParser:
    """The ``xpuruntime`` argument parser (one subcommand per command)."""
    parser = _Parser(prog=PROG, description="xpuruntime: run, benchmark, explain, profile, tune, compare and "
                                             "quantize ONNX models. Every command: xpuruntime COMMAND --help.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks of errors (debugging)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = commands.add_parser("devices", help="list the devices and how this xpuruntime was built")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser("run", help="run a model once and print (or save) its outputs")
    _add_model_args(p)
    _add_input_args(p)
    p.add_argument("--output", "-o", metavar="FILE.npz", help="save the outputs (numpy .npz, by output name)")

    p = commands.add_parser("bench", help="latency percentiles and throughput")
    _add_model_args(p)
    _add_input_args(p)
    p.add_argument("--warmup", type=_non_negative_int, default=10, help="untimed runs first (default: 10)")
    p.add_argument("--iterations", "-n", type=_positive_int, default=100, help="timed runs (default: 100)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is drawn only on a terminal)")

    p = commands.add_parser("explain", help="what runs each node and why: engine, kernels, rejected candidates, "
                                            "copies, syncs, memory plan")
    _add_model_args(p)
    _add_input_args(p)
    p.add_argument("--format", choices=("text", "json", "html"), default="text", help="report format (default: text)")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE (default: stdout)")
    p.add_argument("--profile", action="store_true",
                   help="time the runs with the profiler and add per-node times (always on for --format html, "
                        "which draws the timeline)")
    p.add_argument("--iterations", type=_positive_int, default=3, help="runs behind the timeline (default: 3)")

    p = commands.add_parser("profile", help="profile runs into a Chrome trace (Perfetto, chrome://tracing)")
    _add_model_args(p)
    _add_input_args(p)
    p.add_argument("--output", "-o", metavar="TRACE.json", required=True, help="the Chrome trace file to write")
    p.add_argument("--iterations", "-n", type=_positive_int, default=10, help="profiled runs (default: 10)")
    p.add_argument("--warmup", type=_non_negative_int, default=1, help="unprofiled runs first (default: 1)")

    p = commands.add_parser("audit", help="the roofline audit: each node's time against its floor (bytes over the "
                                          "copy bandwidth, FLOPs over the peak), the furthest first")
    _add_model_args(p)
    _add_input_args(p)
    p.add_argument("--iterations", "-n", type=_positive_int, default=5, help="profiled runs (default: 5)")
    p.add_argument("--warmup", type=_non_negative_int, default=2, help="unprofiled runs first (default: 2)")
    p.add_argument("--top", type=_non_negative_int, default=15, help="nodes shown (default: 15; 0: all)")
    p.add_argument("--ceiling", action="append", default=[], metavar="KEY=VALUE",
                   help="override a ceiling of the device: bandwidth=BYTES_PER_S or a peak in FLOP/s (fp32, tf32, "
                        "fp16, bf16, fp8, int8, fp64, vector); repeatable or comma-separated")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = commands.add_parser("tune", help="autotune every node's kernel and write a KernelPolicy that pins them")
    _add_model_args(p, engine_default="native")
    _add_input_args(p)
    p.add_argument("--output", "-o", metavar="POLICY", required=True,
                   help="the KernelPolicy file to write (.json, .yaml, .yml), e.g. policy.lock.json")

    p = commands.add_parser("compare", help="run two engines on the same inputs and compare every output "
                                            "(exit code 1 on a mismatch)")
    _add_model_args(p)
    _add_input_args(p)
    p.add_argument("--engines", default="native,onnxruntime", metavar="A,B",
                   help="the engines to compare; B is the reference (default: native,onnxruntime)")
    p.add_argument("--rtol", type=_non_negative_float, default=1e-3, help="relative tolerance (default: 1e-3)")
    p.add_argument("--atol", type=_non_negative_float, default=1e-4, help="absolute tolerance (default: 1e-4)")
    p.add_argument("--intermediates", action="store_true",
                   help="also compare every intermediate value and report the first diverging node")
    p.add_argument("--reference-device", metavar="DEVICE",
                   help="where the reference engine B runs (default: --device), e.g. --device cuda "
                        "--reference-device cpu")
    p.add_argument("--bisect-passes", action="store_true",
                   help="on a mismatch, run engine A (native) again with every graph pass off, then with each one "
                        "off alone, and name the passes whose removal makes the outputs agree")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--verbose", "-v", action="store_true", help="list every intermediate value")

    p = commands.add_parser("quantize", help="post-training quantization: write a QDQ model (int8, fp8 or int4 "
                                             "weights) and its decisions")
    p.add_argument("model", help="the float ONNX model file")
    p.add_argument("--calibration", metavar="FILE.npz",
                   help="calibration data: arrays by input name (.npz; .npy for a one-input model), samples along "
                        "the first axis (needed for int8 and fp8 unless --decisions replays)")
    p.add_argument("--precision", default="int8", choices=("int8", "fp8", "int4-weights"),
                   help="int8 (default), fp8 (float8e4m3fn) or int4-weights (weight-only)")
    p.add_argument("--method", choices=("minmax", "percentile", "entropy"),
                   help="activation ranges (default: entropy for int8, minmax for fp8)")
    p.add_argument("--percentile", type=_non_negative_float, default=99.99,
                   help="the percentile kept by --method percentile (default 99.99)")
    p.add_argument("--output", "--out", "-o", metavar="FILE.onnx", required=True, help="the QDQ model to write")
    p.add_argument("--exclude", nargs="+", default=[], metavar="NODE_OR_OP",
                   help="node names or op types to keep in float")
    p.add_argument("--op-types", nargs="+", metavar="OP", help="op types to quantize (default Conv Gemm MatMul)")
    p.add_argument("--activation-matmuls", action="store_true",
                   help="also quantize MatMuls of two activations (attention's batched products; default: float, "
                        "so that the attention runs fused)")
    p.add_argument("--activation-type", choices=("int8", "uint8"), default="int8",
                   help="int8: symmetric activations (default); uint8: asymmetric")
    p.add_argument("--per-tensor", action="store_true", help="one scale per weight instead of per output channel")
    p.add_argument("--quantize-bias", action="store_true", help="int8: int32 biases (default: biases stay float)")
    p.add_argument("--block-size", type=_positive_int, default=32, help="int4 block size (default 32)")
    p.add_argument("--batch-size", type=_positive_int, default=32,
                   help="calibration samples per run where the model's batch dimension is symbolic (default 32)")
    p.add_argument("--device", default="cpu", help="where the calibration runs: cpu (default), cuda or cuda:N")
    p.add_argument("--engine", default="auto", choices=_engines(), help="the engine of the calibration runs")
    p.add_argument("--decisions", metavar="FILE.json", help="replay these decisions instead of calibrating")
    p.add_argument("--decisions-out", metavar="FILE.json",
                   help="write the decisions (default: the output's name with .json)")
    p.add_argument("--report", action="store_true",
                   help="also measure each quantized node's cost (sensitivity, worst first) on --eval data")
    p.add_argument("--eval", metavar="FILE.npz", help="evaluation data of --report (default: the calibration data)")

    p = commands.add_parser("generate", help="generate tokens with a decoder model (docs/generation.md)")
    _add_model_args(p)
    p.add_argument("--prompt-ids", action="append", required=True, metavar="ID,ID,...",
                   help="a prompt's token ids; repeat for a batch (rows of different lengths are left-padded)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=32, help="new tokens per row at most (default 32)")
    p.add_argument("--max-length", type=_non_negative_int, default=0,
                   help="prompt + new tokens at most (default 0: no limit beyond --max-new-tokens)")
    sampling = p.add_mutually_exclusive_group()
    sampling.add_argument("--greedy", action="store_true", help="argmax decoding (the default)")
    sampling.add_argument("--temperature", type=float, metavar="T", help="sample at temperature T (> 0)")
    p.add_argument("--top-k", type=_non_negative_int, default=0, help="sample from the k most likely (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (1: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 0; 1: off (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--stop-ids", default="", metavar="ID,ID,...", help="token ids that end a row")
    p.add_argument("--pad-id", type=_non_negative_int, default=0, help="the padding token id (default 0)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence every step")
    p.add_argument("--stream", action="store_true", help="print tokens as they are made (one prompt)")
    p.add_argument("--stats", action="store_true",
                   help="print where the time went: prefill and decode apart, the cache's occupancy")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--profile", action="store_true",
                   help="profile the generation: a per-node table of the prefill and one of the decode steps "
                        "(time, share, roofline), on stderr ('profile' in --json)")
    p.add_argument("--explain", action="store_true",
                   help="print what the generation ran (rows, padding, the cache's layout, size and occupancy, the "
                        "prefill and the decode apart) on stderr ('explain' in --json)")
    p.add_argument("--cache-layout", choices=("auto", "dynamic", "static"), default="auto",
                   help="the Concat form's decode cache: dynamic (exact length), static (fixed size, one decode "
                        "shape); auto: static where the model has position_ids and an attention_mask "
                        "(docs/generation.md)")
    p.add_argument("--sampling", choices=("auto", "host", "device"), default="auto",
                   help="where sampled tokens are drawn: host (the Sampler), device (where the logits are: the "
                        "sample_rows kernel on a GPU); auto: host for now (docs/generation.md)")
    p.add_argument("--continuous", action="store_true",
                   help="serve the prompts as separate requests through continuous batching over a paged cache "
                        "(docs/generation.md 'Continuous batching')")
    p.add_argument("--max-batch", type=_positive_int, default=8, help="--continuous: requests decoded together (8)")
    p.add_argument("--block-size", type=_positive_int, default=16, help="--continuous: positions per block (16)")
    p.add_argument("--num-blocks", type=_non_negative_int, default=0,
                   help="--continuous: blocks in the pool (0: max-batch x the blocks of 1024 positions)")
    p.add_argument("--no-prefix-sharing", action="store_true", help="--continuous: compute every prompt in full")
    p.add_argument("--reservation", choices=("on_demand", "whole_length"), default="on_demand",
                   help="--continuous: a request's blocks as decoding needs them, preempting the request submitted "
                        "last when the pool is full (on_demand), or its whole length at admission (whole_length)")
    return parser


# ---------------------------------------------------------------------------------------------------------------
# Sessions and inputs
# ---------------------------------------------------------------------------------------------------------------


def _existing_file(path: str, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{what} '{path}' does not exist")
    if not p.is_file():
        raise UsageError(f"{what} '{path}' is not a file")
    return p


def _policy_suffix(path: str, option: str) -> None:
    if Path(path).suffix.lower() not in POLICY_SUFFIXES:
        raise UsageError(f"{option} '{path}': expected a .json, .yaml or .yml file")


def load_policies(args: argparse.Namespace):
    """The KernelPolicy and ExecutionPolicy of ``--policy``/``--exec-policy`` (None when not given)."""
    import xpuruntime as xrt

    kernel_policy = exec_policy = None
    if getattr(args, "policy", None):
        _policy_suffix(args.policy, "--policy")
        _existing_file(args.policy, "policy file")
        kernel_policy = xrt.KernelPolicy.load(args.policy)
    if getattr(args, "exec_policy", None):
        _policy_suffix(args.exec_policy, "--exec-policy")
        _existing_file(args.exec_policy, "execution policy file")
        exec_policy = xrt.ExecutionPolicy.load(args.exec_policy)
    return kernel_policy, exec_policy


def make_session(args: argparse.Namespace, *, engine: Optional[str] = None, model: Any = None,
                 kernel_policy: Any = None, device: Optional[str] = None,
                 disabled_passes: Optional[List[str]] = None):
    """An InferenceSession from the common options (model, --engine, --device, --policy, --exec-policy, --fp16);
    ``device`` and ``disabled_passes`` (native engine) override or add to them."""
    import xpuruntime as xrt

    loaded_kernel_policy, exec_policy = load_policies(args)
    if model is None:
        model = _existing_file(args.model, "model file")
    device = xrt.Device(device or args.device)  # a malformed --device is reported as such, not as a model problem
    extra = {"disabled_passes": disabled_passes} if disabled_passes else {}
    try:
        return xrt.InferenceSession(model, device=device, engine=engine or args.engine,
                                    kernel_policy=kernel_policy if kernel_policy is not None else loaded_kernel_policy,
                                    exec_policy=exec_policy, fp16=args.fp16, **extra)
    except xrt.InvalidArgumentError as error:
        raise UsageError(f"model '{args.model}': {error}") from None


def _numpy_dtype(name: str, input_name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        raise UsageError(f"input '{input_name}' is {name}, which numpy cannot generate; pass it with --inputs") from None


def _shape_str(shape: Sequence[Any]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def random_inputs(session: Any, batch: int = 1, seed: int = 0, int_range: Tuple[int, int] = (0, 2)) -> Dict[str, np.ndarray]:
    """Random feeds for ``session``: symbolic dimensions set to ``batch``, floats standard normal, integers in
    ``[int_range[0], int_range[1])``, booleans 0/1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) else batch for d in info.shape]
        dtype = _numpy_dtype(info.dtype, info.name)
        if dtype == np.bool_:
            feeds[info.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            feeds[info.name] = rng.integers(int_range[0], int_range[1], size=shape).astype(dtype)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _read_named_arrays(file: Path, path: str, option: str, names: List[str]) -> Dict[str, np.ndarray]:
    """The arrays of an .npz (by input name) or .npy (a one-input model) file given as ``option``, one per name in
    ``names``: no unknown name, none missing (UsageError naming ``option`` and ``path`` otherwise)."""
    try:
        if file.suffix.lower() == ".npy":
            if len(names) != 1:
                raise UsageError(f"{option} '{path}' is one array (.npy) but the model has {len(names)} inputs "
                                 f"({', '.join(names)}); use an .npz with one array per input name")
            arrays = {names[0]: np.load(file, allow_pickle=False)}
        else:
            with np.load(file, allow_pickle=False) as npz:
                if not hasattr(npz, "files"):
                    raise UsageError(f"{option} '{path}' is not an .npz archive")
                arrays = {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError) as error:
        raise UsageError(f"cannot read {option} '{path}': {error}") from None
    unknown = sorted(set(arrays) - set(names))
    if unknown:
        raise UsageError(f"{option} '{path}' has unknown input(s) {', '.join(unknown)}; the model's inputs are: "
                         f"{', '.join(names)}")
    missing = [n for n in names if n not in arrays]
    if missing:
        raise UsageError(f"{option} '{path}' lacks input(s) {', '.join(missing)}; the model's inputs are: "
                         f"{', '.join(names)}")
    return arrays


def load_inputs(session: Any, path: str) -> Dict[str, np.ndarray]:
    """Feeds from an .npz (arrays by input name) or .npy (a one-input model) file, checked against the model's
    inputs: every input present, no unknown names, ranks and fixed dimensions equal. An array keeps its dtype when
    it is the input's; otherwise it is converted only when that keeps every value (numpy's safe casting: int32 ->
    int64) or its kind (float64 -> float32), and refused (UsageError) when it would change integers into floats or
    back (int64 -> float32)."""
    file = _existing_file(path, "inputs file")
    infos = session.get_inputs()
    arrays = _read_named_arrays(file, path, "--inputs", [i.name for i in infos])
    feeds = {}
    for info in infos:
        value = np.asarray(arrays[info.name])
        declared = list(info.shape)
        fits = value.ndim == len(declared) and all(not isinstance(d, int) or d == s for d, s in zip(declared, value.shape))
        if not fits:
            raise UsageError(f"--inputs: input '{info.name}' expects shape {_shape_str(declared)} ({info.dtype}), "
                             f"got {_shape_str(value.shape)}")
        dtype = _numpy_dtype(info.dtype, info.name)
        if value.dtype != dtype:
            same_kind = value.dtype.kind == dtype.kind and np.can_cast(value.dtype, dtype, casting="same_kind")
            if not same_kind and not np.can_cast(value.dtype, dtype, casting="safe"):
                raise UsageError(f"--inputs: input '{info.name}' expects {info.dtype}, got {value.dtype} (converting "
                                 f"would change its values' kind; save it as {info.dtype})")
            value = value.astype(dtype)
        feeds[info.name] = np.ascontiguousarray(value)
    return feeds


def make_feeds(args: argparse.Namespace, session: Any) -> Dict[str, np.ndarray]:
    if getattr(args, "inputs", None):
        return load_inputs(session, args.inputs)
    return random_inputs(session, args.batch, args.seed, args.int_range)


def to_numpy(value: Any) -> np.ndarray:
    """An output as a numpy array (device tensors are copied to the host)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "to_numpy"):
        return value.to_numpy()
    return np.asarray(value)


def _profiler_factory() -> Optional[Callable[..., Any]]:
    """``xpuruntime.profile`` when this xpuruntime has the profiler, else None (imported lazily)."""
    import xpuruntime as xrt

    return getattr(xrt, "profile", None)


# ---------------------------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------------------------


def cmd_devices(args: argparse.Namespace) -> int:
    import xpuruntime as xrt

    devices = []
    for device in xrt.get_all_devices():
        kind = str(device.type)
        entry = {"device": kind if kind == "cpu" else f"{kind}:{device.index}", "type": kind,
                 "name": device.name, "total_memory": int(device.total_memory)}
        if str(device.type) == "cuda":
            entry.update(compute_capability=device.compute_capability, sm_count=device.sm_count,
                         driver_version=device.driver_version, runtime_version=device.runtime_version,
                         fp16=device.supports_fp16, bf16=device.supports_bf16, fp8=device.supports_fp8)
        devices.append(entry)
    info = dict(xrt.build_info())
    cuda_reason = "" if xrt.cuda_available() else xrt.runtime.cuda_unavailable_reason()
    # Which engines run on each kind of device here (the first GPU stands for the others), and why the rest do not.
    targets = ["cpu"] + (["cuda:0"] if xrt.get_device_count() else [])
    available = {t: xrt.available_engines(t) for t in targets}
    unavailable = {t: xrt.unavailable_engines(t) for t in targets}
    if args.json:
        print(json.dumps({"devices": devices, "build": info, "cuda_unavailable_reason": cuda_reason or None,
                          "engines": _engines(), "available_engines": available,
                          "unavailable_engines": unavailable}, indent=2, default=str))
        return 0
    print(f"xpuruntime {info.get('version')} ({info.get('build_type')}, {info.get('compiler')}; "
          f"CUDA {'on' if info.get('with_cuda') else 'off'}, NVTX {'on' if info.get('with_nvtx') else 'off'})")
    for d in devices:
        line = f"  {d['device']:8} {d['name']}  {d['total_memory'] / 2**30:.1f} GiB"
        if d["type"] == "cuda":
            line += f"  compute capability {d['compute_capability']}, {d['sm_count']} SMs"
        print(line)
    if cuda_reason:
        print(f"no CUDA device: {cuda_reason}")
    for target in targets:
        print(f"engines on {target}: {', '.join(available[target]) or 'none'}")
        for name, reason in unavailable[target].items():
            print(f"  not available: {name}: {reason}")
    return 0


def _describe(name: str, value: np.ndarray) -> str:
    text = f"{name}: {value.dtype}{_shape_str(value.shape)}"
    if value.size and (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
        v = value.astype(np.float64)
        finite = v[np.isfinite(v)]
        if finite.size:
            text += f"  min {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}"
        if finite.size != v.size:
            text += f"  ({v.size - finite.size} non-finite)"
        flat = value.reshape(-1)
        text += f"  first {np.array2string(flat[:6], precision=5, separator=', ')}"
    return text


def cmd_run(args: argparse.Namespace) -> int:
    session = make_session(args)
    feeds = make_feeds(args, session)
    start = time.perf_counter()
    outputs = session.run(feeds)
    elapsed = (time.perf_counter() - start) * 1e3
    arrays = {name: to_numpy(value) for name, value in outputs.items()}
    print(f"{args.model}: engine {session.engine} on {args.device}, {elapsed:.3f} ms (first run)")
    for name, value in feeds.items():
        print(f"  input  {_describe(name, value)}")
    for name, value in arrays.items():
        print(f"  output {_describe(name, value)}")
    if args.output:
        try:
            np.savez(args.output, **arrays)
        except OSError as error:
            raise UsageError(f"cannot write --output '{args.output}': {error.strerror or error}") from None
        print(f"wrote {args.output}")
    return 0


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label = total, label
        self.enabled = enabled and sys.stderr.isatty()
        self.last = -1

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / self.total)
        if filled == self.last and done != self.total:
            return
        self.last = filled
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}")
        if done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(sorted_values), q))


def cmd_bench(args: argparse.Namespace) -> int:
    session = make_session(args)
    feeds = make_feeds(args, session)
    batch = args.batch
    if args.inputs:  # the batch is the leading dimension of the first input with a symbolic one
        for info in session.get_inputs():
            if info.shape and not isinstance(info.shape[0], int):
                batch = int(feeds[info.name].shape[0])
                break
    warm = _Progress(args.warmup, "warm-up", not args.no_progress)
    for i in range(args.warmup):
        session.run(feeds)
        warm.update(i + 1)
    bar = _Progress(args.iterations, "bench  ", not args.no_progress)
    times = []
    total_start = time.perf_counter()
    for i in range(args.iterations):
        start = time.perf_counter()
        session.run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
        bar.update(i + 1)
    wall = time.perf_counter() - total_start
    times.sort()
    mean = sum(times) / len(times)
    result = {
        "model": args.model, "engine": session.engine, "device": args.device, "batch": batch,
        "warmup": args.warmup, "iterations": args.iterations,
        "latency_ms": {"mean": mean, "min": times[0], "p50": _percentile(times, 50), "p90": _percentile(times, 90),
                       "p99": _percentile(times, 99), "max": times[-1],
                       "std": float(np.std(np.asarray(times)))},
        "throughput": {"runs_per_s": args.iterations / wall, "samples_per_s": args.iterations * batch / wall},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    lat = result["latency_ms"]
    print(f"{args.model}: engine {session.engine} on {args.device}, batch {batch}, {args.warmup} warm-up + "
          f"{args.iterations} timed runs")
    print(f"  latency ms: mean {lat['mean']:.3f}  p50 {lat['p50']:.3f}  p90 {lat['p90']:.3f}  p99 {lat['p99']:.3f}"
          f"  min {lat['min']:.3f}  max {lat['max']:.3f}  std {lat['std']:.3f}")
    print(f"  throughput: {result['throughput']['runs_per_s']:.1f} runs/s, "
          f"{result['throughput']['samples_per_s']:.1f} samples/s")
    return 0


def _write_text(path: Optional[str], text: str) -> None:
    if not path:
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write '{path}': {error.strerror or error}") from None


def _check_writable(path: str, option: str) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{option} '{path}': the folder {parent} does not exist")


def cmd_explain(args: argparse.Namespace) -> int:
    from . import report

    if args.output:
        _check_writable(args.output, "--output")
    session = make_session(args)
    feeds = make_feeds(args, session)
    session.run(feeds)  # plans and (ONNX Runtime) execution providers are known after the first run
    events = summary = None
    source = None
    if args.profile or args.format == "html":
        profile = _profiler_factory()
        if profile is not None:
            with profile(record_shapes=True) as profiler:
                for i in range(args.iterations):
                    with profiler.range(f"iteration {i}"):
                        session.run(feeds)
            events, summary, source = profiler.events(), profiler.summary(), "profiler"
        else:
            # No profiler in this xpuruntime: the timeline shows host-timed session.run spans.
            events = report.host_timed_events(lambda: session.run(feeds), args.iterations)
            source = "host timer"
    run_info = {"inputs": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in feeds.items()},
                "timed_iterations": args.iterations if events is not None else 0}
    data = report.build_report(session, model=args.model, events=events, summary=summary, timeline_source=source,
                               run_info=run_info)
    _write_text(args.output, report.render(data, args.format))
    if args.output:
        print(f"wrote {args.output} ({args.format}, {len(data['nodes'])} nodes)", file=sys.stderr)
    return 0


def _require_profiler(command: str):
    """xpuruntime.profile, or CommandFailed naming `command` when this build has no profiler."""
    profile = _profiler_factory()
    if profile is None:
        raise CommandFailed("this xpuruntime has no profiler (xpuruntime.profile); build one with it to use "
                            f"'xpuruntime {command}'")
    return profile


def _profiled_runs(args: argparse.Namespace, command: str, ranges: bool = False):
    """The model of `args` run --warmup times, then --iterations times under the profiler (each run in a range
    'iteration i' when `ranges`); returns the profiler. `command` names the subcommand in the missing-profiler error."""
    profile = _require_profiler(command)
    session = make_session(args)
    feeds = make_feeds(args, session)
    for _ in range(args.warmup):
        session.run(feeds)
    with profile(record_shapes=True) as profiler:
        for i in range(args.iterations):
            if ranges:
                with profiler.range(f"iteration {i}"):
                    session.run(feeds)
            else:
                session.run(feeds)
    return profiler


def cmd_profile(args: argparse.Namespace) -> int:
    _check_writable(args.output, "--output")
    profiler = _profiled_runs(args, "profile", ranges=True)
    profiler.export_chrome_trace(args.output)
    print(profiler.summary_table())
    print(f"wrote {args.output} ({len(profiler.events())} events, {args.iterations} runs; open it in "
          f"https://ui.perfetto.dev or chrome://tracing)")
    return 0


def _parse_ceilings(entries: Sequence[str]) -> Dict[str, float]:
    """--ceiling KEY=VALUE entries (each may hold several, comma-separated) as a dict; UsageError when malformed."""
    figures: Dict[str, float] = {}
    for entry in entries:
        for item in filter(None, (part.strip() for part in entry.split(","))):
            key, sep, value = item.partition("=")
            try:
                number = float(value)
            except ValueError:
                number = -1.0
            if not sep or number <= 0:
                raise UsageError(f"--ceiling '{item}': expected KEY=VALUE with a positive number (e.g. "
                                 "bandwidth=4.23e12 or fp16=727e12)")
            figures[key.strip()] = number
    return figures


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


GROUP_FLAG_SHARE = 0.10  # a group of one op and kernel flagged over 10% of the run at under half its floor


def audit_groups(rows: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The audited nodes grouped by op and kernel, the most lost time first: where a model's time goes when no node
    alone is over 2% of the run (a detector's many small post-processing nodes, a transformer's dozens of small
    elementwise kernels).
    Each group: op, kernel, backend, nodes, time_us (a run, summed), share, floor_us, efficiency (floors over times),
    lost_share (share x (1 - efficiency)) and flagged (over GROUP_FLAG_SHARE of the run at under 50% of its floor)."""
    groups: Dict[tuple, Dict[str, Any]] = {}
    for r in rows:
        key = (r["op"] or r["op_type"], r["kernel"], r["backend"])
        g = groups.setdefault(key, {"op": key[0], "kernel": key[1], "backend": key[2], "nodes": 0, "time_us": 0.0,
                                    "share": 0.0, "floor_us": 0.0})
        calls = max(r["calls"], 1)
        g["nodes"] += 1
        g["time_us"] += r["mean_us"]
        g["share"] += r["share"]
        g["floor_us"] += r["floor_us"] / calls
    out = []
    for g in groups.values():
        g["efficiency"] = g["floor_us"] / g["time_us"] if g["time_us"] > 0 else 0.0
        g["lost_share"] = g["share"] * max(0.0, 1.0 - g["efficiency"])
        g["flagged"] = g["share"] > GROUP_FLAG_SHARE and g["efficiency"] < 0.5
        out.append(g)
    return sorted(out, key=lambda g: g["lost_share"], reverse=True)


def audit_report(rows: Sequence[Mapping[str, Any]], ceilings: Mapping[str, Mapping[str, Any]], top: int,
                 groups: Sequence[Mapping[str, Any]] = ()) -> str:
    """The audit as text: the ceilings, then one line per node (lost share first) with its reason below, flagged
    nodes marked."""
    lines = []
    for device, c in ceilings.items():
        by_value: Dict[float, List[str]] = {}
        for key, value in c["peaks"].items():
            by_value.setdefault(value, []).append(key)
        peaks = "; ".join(f"{'/'.join(sorted(keys))} {_si(value, 'FLOP/s')}"
                          for value, keys in sorted(by_value.items(), reverse=True))
        lines.append(f"ceilings of {device}: copy bandwidth {_si(c['bandwidth'], 'B/s')} "
                     f"({c['source'].get('bandwidth', '')}); peaks {peaks}")
        sources = sorted({v for k, v in c["source"].items() if k != "bandwidth"})
        lines.append(f"  peaks from: {'; '.join(sources)}")
    header = ["", "node", "op", "kernel", "time", "share", "floor", "bound", "eff", "lost"]
    table = []
    for r in rows:
        table.append(["!" if r["flagged"] else "", r["node"], r["op"] or r["op_type"], f"{r['kernel']} ({r['backend']})",
                      f"{r['mean_us']:.1f} us", f"{100 * r['share']:.1f}%", f"{r['floor_us'] / max(r['calls'], 1):.1f} us",
                      r["bound"], f"{100 * r['efficiency']:.0f}%", f"{100 * r['lost_share']:.1f}%"])
    widths = [max(len(str(row[k])) for row in [header] + table) for k in range(len(header))]
    lines.append("")
    for row in [header] + table:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    flagged = [r for r in rows if r["flagged"]]
    if groups:
        lines.append("")
        lines.append("by op and kernel (every audited node):")
        for g in groups[:max(top, 10) if top else len(groups)]:
            lines.append(f"  {'!' if g['flagged'] else ' '} {g['op']} / {g['kernel']} ({g['backend']}): {g['nodes']} "
                         f"node(s), {g['time_us']:.1f} us a run, {100 * g['share']:.1f}% of it at "
                         f"{100 * g['efficiency']:.0f}% of their floor, {100 * g['lost_share']:.1f}% lost")
    lines.append("")
    lines.append("why each kernel was chosen:")
    for r in rows:
        lines.append(f"  {r['node']}: {r['reason'] or '-'}")
    lines.append("")
    lines.append(f"time = mean per run; floor = max(bytes / bandwidth, FLOPs / peak); eff = floor / time; lost = share "
                 f"x (1 - eff). {len(flagged)} node(s) marked '!' cost more than 2% of the run at under 50% of "
                 f"their floor" + (f" (top {top} shown)" if top else "") +
                 (f"; a group marked '!' costs more than {100 * GROUP_FLAG_SHARE:.0f}% at under 50%" if groups else ""))
    return "\n".join(lines) + "\n"


def cmd_audit(args: argparse.Namespace) -> int:
    _require_profiler("audit")
    figures = _parse_ceilings(args.ceiling)
    profiler = _profiled_runs(args, "audit")
    devices = sorted({r["device"] for r in profiler.summary() if r["ceiling"]})
    for device in devices if figures else []:
        profiler.set_ceilings(device, **figures)
    every = profiler.audit(0)  # ranked by lost share: --top is its head; the groups sum all of it
    rows = every[:args.top] if args.top else every
    groups = audit_groups(every)
    ceilings = {d: profiler.ceilings(d) for d in devices}
    if args.json:
        print(json.dumps({"model": args.model, "device": args.device, "iterations": args.iterations,
                          "ceilings": ceilings, "nodes": rows, "groups": groups}, indent=1))
    else:
        print(f"model {args.model} on {args.device}, {args.iterations} profiled runs")
        print(audit_report(rows, ceilings, args.top, groups), end="")
    return 0


def resolved_policy(explanation: Any, base: Any = None):
    """A KernelPolicy pinning, per registry op, the kernel each node of ``explanation`` runs.

    Returns ``(policy, decisions, conflicts)``: ``decisions`` maps each op to ``(kernel, [(node, rule,
    candidates)])``; ``conflicts`` lists ops whose nodes chose different kernels (those get a preferred rule,
    most frequent kernel first, since one rule per op cannot pin two kernels)."""
    import xpuruntime as xrt

    by_op: Dict[str, List[dict]] = {}
    for node in explanation.nodes:
        if node.get("op") and node.get("rule"):
            by_op.setdefault(node["op"], []).append(node)
    policy = xrt.KernelPolicy(auto_strategy=base.auto_strategy if base is not None else "FirstSupported")
    decisions: Dict[str, Any] = {}
    conflicts = []
    for op in sorted(by_op):
        nodes = by_op[op]
        counts: Dict[str, int] = {}
        for n in nodes:
            counts[n["kernel"]] = counts.get(n["kernel"], 0) + 1
        kernels = sorted(counts, key=lambda k: (-counts[k], k))
        if len(kernels) == 1:
            policy.pin(op, kernels[0])
        else:
            policy.prefer(op, *kernels)
            conflicts.append(op)
        decisions[op] = (kernels, [(n["node"], n["rule"], n.get("candidates", [])) for n in nodes])
    return policy, decisions, conflicts


def cmd_tune(args: argparse.Namespace) -> int:
    import xpuruntime as xrt

    _policy_suffix(args.output, "--output")
    _check_writable(args.output, "--output")
    base, _ = load_policies(args)
    policy = base.copy() if base is not None else xrt.KernelPolicy()
    policy.auto_strategy = "BestPerformance"  # `auto` rules (and ops without a rule) time every supported kernel
    session = make_session(args, kernel_policy=policy)
    feeds = make_feeds(args, session)
    session.run(feeds)
    explanation = session.explain()
    tuned, decisions, conflicts = resolved_policy(explanation, base)
    if not decisions:
        raise CommandFailed(f"engine '{session.engine}' makes no kernel decisions to tune (only the native engine's "
                            f"dispatcher does); run tune with --engine native")
    try:
        tuned.save(args.output)
    except OSError as error:
        raise UsageError(f"cannot write --output '{args.output}': {error}") from None
    print(f"{args.model}: engine {session.engine} on {args.device}, batch {args.batch}: autotuned "
          f"{sum(len(d[1]) for d in decisions.values())} nodes, {len(decisions)} ops")
    for op, (kernels, nodes) in decisions.items():
        timings = {}
        for _, _, candidates in nodes:
            for c in candidates:
                if c.get("time_us") is not None:
                    timings.setdefault(c["kernel"], []).append(c["time_us"])
        timed = ", ".join(f"{k} {sum(v) / len(v):.1f} us" for k, v in sorted(timings.items()))
        rules = sorted({rule for _, rule, _ in nodes})
        print(f"  {op:20} -> {' | '.join(kernels):12} ({len(nodes)} nodes, {', '.join(rules)}"
              f"{'; timed: ' + timed if timed else ''})")
    for op in conflicts:
        print(f"note: the nodes of '{op}' chose different kernels ({', '.join(decisions[op][0])}); one rule per op "
              f"cannot pin both, so '{op}' gets a preferred rule in that order", file=sys.stderr)
    print(f"wrote {args.output}; run the model under it with (or load it with xrt.KernelPolicy.load):")
    print("  " + tune_follow_up(args, session.engine))
    return 0


def tune_follow_up(args: argparse.Namespace, engine: str) -> str:
    """The ``xpuruntime run`` command that runs the tuned model under the written policy, as tune prints it: the
    engine that was tuned (a policy of pinned kernels needs the native engine; ``auto`` would pick onnxruntime on
    the CPU, which cannot honour pins), the same device, execution policy, precision and inputs."""
    import shlex

    command = ["xpuruntime", "run", str(args.model), "--engine", engine, "--device", args.device,
               "--policy", str(args.output)]
    if args.exec_policy:
        command += ["--exec-policy", str(args.exec_policy)]
    if args.fp16:
        command.append("--fp16")
    if args.inputs:
        command += ["--inputs", str(args.inputs)]
    elif args.batch != 1:
        command += ["--batch", str(args.batch)]
    return shlex.join(command)


def error_stats(actual: np.ndarray, reference: np.ndarray, rtol: float, atol: float) -> dict:
    """Error statistics of ``actual`` against ``reference``: max abs, max rel, mean abs, the number of elements
    outside ``|a - r| <= atol + rtol * |r|`` (NaN matches NaN only), and ``passed``."""
    out = {"shape": list(reference.shape), "dtype": str(reference.dtype), "actual_shape": list(actual.shape),
           "actual_dtype": str(actual.dtype), "elements": int(reference.size)}
    if actual.shape != reference.shape:
        out.update(max_abs=None, max_rel=None, mean_abs=None, mismatches=int(reference.size), passed=False,
                   note=f"shape {_shape_str(actual.shape)} != reference {_shape_str(reference.shape)}")
        return out
    a = actual.astype(np.float64)
    r = reference.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(r)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - r)
        diff = np.where(both_nan | (a == r), 0.0, diff)  # equal infinities differ by 0, not NaN
        rel = diff / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
        bad = ~(diff <= atol + rtol * np.abs(r))
    bad &= ~both_nan
    finite = np.isfinite(diff)
    out.update(
        max_abs=float(diff[finite].max()) if finite.any() else (math.inf if diff.size else 0.0),
        max_rel=float(rel[np.isfinite(rel)].max()) if np.isfinite(rel).any() else (math.inf if rel.size else 0.0),
        mean_abs=float(diff[finite].mean()) if finite.any() else (math.inf if diff.size else 0.0),
        mismatches=int(bad.sum()),
        passed=bool(not bad.any()),
    )
    if actual.dtype != reference.dtype:
        out["note"] = f"dtype {actual.dtype} vs reference {reference.dtype}"
    return out


def expose_intermediates(model_path: Path) -> Tuple[bytes, List[dict], List[str]]:
    """The model with every node output also a graph output (edited with the onnx package; external data is
    loaded into the model). Returns ``(serialized model, nodes, skipped)``: ``nodes`` in topological order as
    ``{"node", "op_type", "outputs"}``; ``skipped``: outputs whose type shape inference could not give."""
    try:
        import onnx
        from onnx import shape_inference
    except ImportError:
        raise CommandFailed("--intermediates edits the model with the onnx Python package; install it "
                            "(Debian: python3-onnx)") from None
    try:
        model = onnx.load(str(model_path))
    except Exception as error:  # the onnx package raises DecodeError and others for a malformed file
        raise UsageError(f"cannot read model '{model_path}' with the onnx package: {error}") from None
    inferred = shape_inference.infer_shapes(model)
    types = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi
    existing = {o.name for o in model.graph.output}
    nodes, skipped = [], []
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        outputs = []
        for out in node.output:
            if not out:
                continue
            outputs.append(out)
            if out in existing:
                continue
            if out not in types:
                skipped.append(out)
                outputs.pop()
                continue
            added = model.graph.output.add()
            added.CopyFrom(types[out])
            existing.add(out)
        nodes.append({"node": name, "op_type": node.op_type, "outputs": outputs})
    return model.SerializeToString(), nodes, skipped


def cmd_compare(args: argparse.Namespace) -> int:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    known = _engines()
    if len(engines) != 2:
        raise UsageError(f"--engines takes two engines separated by a comma (e.g. native,onnxruntime), got "
                         f"'{args.engines}'")
    for engine in engines:
        if engine not in known:
            raise UsageError(f"--engines: unknown engine '{engine}'; valid engines: {', '.join(known)}")
    model_path = _existing_file(args.model, "model file")
    model: Any = model_path
    nodes: List[dict] = []
    skipped: List[str] = []
    if args.intermediates:
        model, nodes, skipped = expose_intermediates(model_path)
    if args.bisect_passes and engines[0] != "native":
        raise UsageError(f"--bisect-passes turns off the native engine's graph passes: engine A must be native, got "
                         f"'{engines[0]}'")
    devices = [args.device, args.reference_device or args.device]
    sessions = [make_session(args, engine=e, model=model, device=d) for e, d in zip(engines, devices)]
    feeds = make_feeds(args, sessions[1])
    results = []
    for session in sessions:
        outputs = session.run(feeds)
        results.append({name: to_numpy(value) for name, value in outputs.items()})
    actual, reference = results
    original = [o.name for o in sessions[1].get_outputs()]
    compared: Dict[str, dict] = {}
    for name in reference:
        if name not in actual:
            compared[name] = {"passed": False, "note": f"engine {engines[0]} did not produce it", "mismatches": None}
            continue
        compared[name] = error_stats(actual[name], reference[name], args.rtol, args.atol)
    model_outputs = _model_output_names(model_path) if args.intermediates else original
    first_divergence = None
    intermediates = []
    if args.intermediates:
        for nd in nodes:
            for out in nd["outputs"]:
                if out in compared:
                    intermediates.append({"node": nd["node"], "op_type": nd["op_type"], "value": out, **compared[out]})
        for item in intermediates:
            if not item["passed"]:
                first_divergence = item
                break
    passed = all(c["passed"] for c in compared.values())
    bisect = None
    if args.bisect_passes:
        reference_outputs = {n: reference[n] for n in original if n in reference}
        bisect = bisect_passes(args, model_path, feeds, reference_outputs) if not passed else {"skipped": "no mismatch"}
    result = {
        "model": args.model, "engines": engines, "reference": engines[1], "device": args.device,
        "reference_device": devices[1], "bisect_passes": bisect,
        "rtol": args.rtol, "atol": args.atol,
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in feeds.items()},
        "outputs": {n: compared[n] for n in model_outputs if n in compared},
        "intermediates": intermediates if args.intermediates else None,
        "skipped_intermediates": skipped if args.intermediates else None,
        "first_diverging_node": first_divergence,
        "passed": passed,
    }
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        _print_comparison(result, args.verbose)
    return 0 if passed else 1


def bisect_passes(args: argparse.Namespace, model_path: Path, feeds: Dict[str, np.ndarray],
                  reference: Dict[str, np.ndarray]) -> dict:
    """The native engine on --device again with every graph pass off, then with each pass off alone, each run's
    outputs against ``reference``: which passes the mismatch goes with (a pass whose removal makes every output
    agree), or none (a kernel, or passes only together)."""
    import xpuruntime as xrt

    def attempt(disabled: List[str]) -> dict:
        try:
            session = make_session(args, engine="native", model=model_path, disabled_passes=disabled)
            outputs = session.run(feeds)
        except xrt.XpuRuntimeError as error:
            return {"passed": False, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        stats = [error_stats(to_numpy(outputs[n]), r, args.rtol, args.atol) for n, r in reference.items()]
        return {"passed": all(s["passed"] for s in stats), "max_abs": max((s["max_abs"] for s in stats), default=0.0),
                "max_rel": max((s["max_rel"] for s in stats), default=0.0),
                "mismatches": sum(s["mismatches"] or 0 for s in stats)}

    names = list(xrt.graph_passes())
    each = [{"pass": name, **attempt([name])} for name in names]
    every = attempt(names)
    needed = [e["pass"] for e in each if "error" in e]  # without them the model cannot run here (op_decomposition)
    if "error" in every and needed:
        every = {**attempt([n for n in names if n not in needed]), "kept": needed}
    return {"all_off": every, "each_off": each, "culprits": [e["pass"] for e in each if e["passed"]]}


def _model_output_names(path: Path) -> List[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def _comparison_rows(items: Sequence[Tuple[str, dict]]) -> List[List[str]]:
    rows = []
    for name, c in items:
        mismatches = "-" if c.get("mismatches") is None else f"{c['mismatches']}/{c.get('elements', '?')}"
        rows.append([name, _shape_str(c.get("shape", [])), _fmt(c.get("max_abs")), _fmt(c.get("max_rel")),
                     _fmt(c.get("mean_abs")), mismatches, "PASS" if c["passed"] else "FAIL", c.get("note", "")])
    return rows


def _print_comparison(result: dict, verbose: bool) -> None:
    from .report import _table

    a, b = result["engines"]
    print(f"{result['model']}: {a} vs {b} (reference) on {result['device']}, rtol {result['rtol']:g}, atol "
          f"{result['atol']:g} (mismatch: |a - b| > atol + rtol * |b|)")
    header = ["output", "shape", "max abs", "max rel", "mean abs", "mismatches", "result", ""]
    for line in _table(header, _comparison_rows(list(result["outputs"].items()))):
        print("  " + line)
    if result["intermediates"] is not None:
        items = result["intermediates"]
        failed = [i for i in items if not i["passed"]]
        print(f"intermediates: {len(items)} values compared, {len(failed)} outside tolerance"
              + (f", {len(result['skipped_intermediates'])} without a type skipped" if result["skipped_intermediates"] else ""))
        shown = items if verbose else failed[:10]
        if shown:
            rows = _comparison_rows([(f"{i['node']} ({i['op_type']}) -> {i['value']}", i) for i in shown])
            for line in _table(["node -> value"] + header[1:], rows):
                print("  " + line)
        d = result["first_diverging_node"]
        if d is not None:
            print(f"first diverging node: {d['node']} ({d['op_type']}), output '{d['value']}': max abs "
                  f"{_fmt(d['max_abs'])}, max rel {_fmt(d['max_rel'])}, {d['mismatches']} mismatches")
        else:
            print("first diverging node: none (every intermediate value within tolerance)")
    if result.get("bisect_passes"):
        _print_bisection(result["bisect_passes"])
    print("PASSED" if result["passed"] else "FAILED")


def _print_bisection(bisect: dict) -> None:
    from .report import _table

    if "skipped" in bisect:
        print(f"pass bisection: skipped ({bisect['skipped']})")
        return

    def row(label: str, r: dict) -> List[str]:
        if "error" in r:
            return [label, "", "", "", r["error"]]
        return [label, _fmt(r["max_abs"]), _fmt(r["max_rel"]), str(r["mismatches"]), "ok" if r["passed"] else "MISMATCH"]

    print("pass bisection (engine A again, graph passes off):")
    kept = bisect["all_off"].get("kept")
    label = "every pass off" + (f" but {', '.join(kept)} (needed to run here)" if kept else "")
    rows = [row(label, bisect["all_off"])] + [row(f"{e['pass']} off", e) for e in bisect["each_off"]]
    for line in _table(["run", "max abs", "max rel", "mismatches", "result"], rows):
        print("  " + line)
    if bisect["culprits"]:
        print(f"the mismatch goes with: {', '.join(bisect['culprits'])}")
    elif bisect["all_off"].get("passed"):
        print("the mismatch goes with no single pass (several together: turn them off in pairs)")
    else:
        print("the mismatch stays with every pass off: a kernel (pin another with a KernelPolicy to find which)")


def _sample_feeds(model_path: Path, path: str, option: str, batch_size: int) -> List[Dict[str, np.ndarray]]:
    """Feeds cut from an .npz (arrays by input name) or .npy (one-input model) of samples along the first axis:
    ``batch_size`` samples each, or the model's fixed batch dimension when it has one."""
    import onnx

    file = _existing_file(path, f"{option} file")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in initializers]
    arrays = _read_named_arrays(file, path, option, [vi.name for vi in inputs])
    samples = {len(a) if np.ndim(a) else 0 for a in arrays.values()}
    if len(samples) != 1 or 0 in samples:
        raise UsageError(f"{option} '{path}': every array needs the same number of samples along its first axis")
    total = samples.pop()
    batch = batch_size
    dims = inputs[0].type.tensor_type.shape.dim if inputs else []
    if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
        batch = int(dims[0].dim_value)
    return [{k: a[start:start + batch] for k, a in arrays.items()} for start in range(0, total - batch + 1, batch)] \
        or [dict(arrays)]


def cmd_quantize(args: argparse.Namespace) -> int:
    import xpuruntime as xrt
    from .quantization import sensitivity

    model_path = _existing_file(args.model, "model file")
    _check_writable(args.output, "--output")
    decisions_out = args.decisions_out or str(Path(args.output).with_suffix(".json"))
    _check_writable(decisions_out, "--decisions-out")
    if args.decisions and args.calibration:
        raise UsageError("--calibration and --decisions: give one of them (--decisions replays a calibration)")
    if not args.decisions and not args.calibration and args.precision != "int4-weights":
        raise UsageError(f"--precision {args.precision} needs --calibration data (or --decisions to replay)")
    feeds = _sample_feeds(model_path, args.calibration, "--calibration", args.batch_size) if args.calibration else None
    xrt.Device(args.device)  # a malformed --device is reported as such
    if args.decisions:
        decisions = _existing_file(args.decisions, "decisions file")
        result = xrt.quantize(model_path, decisions=decisions, output_path=args.output)
    else:
        result = xrt.quantize(model_path, feeds, precision=args.precision, method=args.method,
                              percentile=args.percentile, activation_type=args.activation_type,
                              per_channel=False if args.per_tensor else None, quantize_bias=args.quantize_bias,
                              exclude=args.exclude, op_types=args.op_types, block_size=args.block_size,
                              device=args.device, engine=args.engine, output_path=args.output,
                              activation_matmuls=args.activation_matmuls)
    try:
        result.save_decisions(decisions_out)
    except OSError as error:
        raise UsageError(f"cannot write '{decisions_out}': {error.strerror or error}") from None
    print(f"{args.model}: {result.summary()}")
    print(f"wrote {args.output} and {decisions_out} (replay: xpuruntime quantize {args.model} --decisions "
          f"{decisions_out} -o ...)")
    if args.report:
        eval_feeds = _sample_feeds(model_path, args.eval, "--eval", args.batch_size) if args.eval else feeds
        if eval_feeds is None:
            raise UsageError("--report needs --eval data (or --calibration data to evaluate on)")
        print(sensitivity(model_path, eval_feeds=eval_feeds, decisions=result.decisions, device=args.device,
                          engine=args.engine))
    return 0


def _token_ids(text: str, option: str) -> List[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated token ids, got '{text}'") from None
    if any(t < 0 for t in ids):
        raise UsageError(f"{option} takes token ids >= 0, got '{text}'")
    return ids


def cmd_generate(args: argparse.Namespace) -> int:
    from .generation import GenerationConfig, Generator

    prompts = [_token_ids(text, "--prompt-ids") for text in args.prompt_ids]
    if any(not p for p in prompts):
        raise UsageError("--prompt-ids: a prompt needs at least one token id")
    if args.stream and len(prompts) != 1 and not args.continuous:
        raise UsageError("--stream prints one prompt's tokens; give one --prompt-ids (or --continuous: "
                         "request:token pairs)")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, max_length=args.max_length,
                              do_sample=args.temperature is not None,
                              temperature=args.temperature if args.temperature is not None else 1.0,
                              top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                              seed=args.seed, stop_tokens=_token_ids(args.stop_ids, "--stop-ids"),
                              pad_token_id=args.pad_id, cache="none" if args.no_cache else "auto",
                              cache_layout=args.cache_layout, sampling=args.sampling)
    if args.continuous:
        return _generate_continuous(args, prompts, config)
    generator = Generator(make_session(args), config)
    start = time.perf_counter()
    with _generation_profile(args) as profile:
        generation = generator.start(prompts)
        while not generation.done:
            step = generation.step()
            if args.stream and not args.json and step[0] is not None:
                print(step[0], end=" ", flush=True)
    if args.stream and not args.json:
        print()
    tokens = [list(row) for row in generation.tokens]
    seconds = time.perf_counter() - start
    made = sum(len(row) for row in tokens)
    stats = generation.stats
    if args.json:
        print(json.dumps({"prompts": prompts, "tokens": tokens, "uses_cache": generator.uses_cache,
                          "engine": generator.session.engine, "seconds": seconds,
                          "tokens_per_s": made / seconds if seconds > 0 else None,
                          "stats": {name: getattr(stats, name) for name in _GENERATION_STATS},
                          **({"explain": generation.explain()} if args.explain else {}),
                          **_profile_json(profile)}, indent=2))
        return 0
    if not args.stream:
        for row in tokens:
            print(",".join(str(t) for t in row))
    print(f"{made} tokens in {seconds * 1e3:.1f} ms ({'with the cache' if generator.uses_cache else 'recomputed'}, "
          f"{generator.session.engine} engine)", file=sys.stderr)
    if args.stats:
        print(stats, file=sys.stderr)
    if args.explain:
        print(generation.explain(), file=sys.stderr)
    _print_profile(profile)
    return 0


@contextlib.contextmanager
def _generation_profile(args: argparse.Namespace):
    """`generate --profile`: a Profiler recording the block (None without --profile)."""
    if not args.profile:
        yield None
        return
    from .runtime.profiler import profile
    with profile() as p:
        yield p


def _profile_json(p) -> Dict[str, Any]:
    """{"profile": {"prefill": rows, "decode": rows}} of a generation's profile (Note [Generation ranges]), or {}."""
    if p is None:
        return {}
    from .generation import DECODE_RANGE, PREFILL_RANGE
    return {"profile": {phase: p.summary(within=name)
                        for phase, name in (("prefill", PREFILL_RANGE), ("decode", DECODE_RANGE))}}


def _print_profile(p) -> None:
    """The per-node tables of the prefill and of the decode steps, on stderr."""
    if p is None:
        return
    from .generation import DECODE_RANGE, PREFILL_RANGE
    for phase, name in (("prefill", PREFILL_RANGE), ("decode steps", DECODE_RANGE)):
        print(f"\n{phase} (profiler range '{name}'):", file=sys.stderr)
        print(p.summary_table(max_rows=15, within=name), file=sys.stderr)


def _generate_continuous(args: argparse.Namespace, prompts: List[List[int]], config) -> int:
    """`generate --continuous`: every prompt a request of a ContinuousBatcher; one line of tokens per prompt."""
    from .generation import ContinuousBatcher, PagedCacheConfig

    if args.no_cache:
        raise UsageError("--continuous needs the model's cache; drop --no-cache")
    cache = PagedCacheConfig(max_batch=args.max_batch, block_size=args.block_size, num_blocks=args.num_blocks,
                             share_prefixes=not args.no_prefix_sharing, reservation=args.reservation)
    batcher = ContinuousBatcher(make_session(args), config, cache)
    start = time.perf_counter()
    ids = [batcher.submit(p) for p in prompts]
    with _generation_profile(args) as profile:
        for event in batcher.stream():
            if args.stream and not args.json:
                print(f"{event.request}:{event.token}", end=" ", flush=True)
    if args.stream and not args.json:
        print()
    seconds = time.perf_counter() - start
    tokens = [list(batcher.tokens(i)) for i in ids]
    made = sum(len(row) for row in tokens)
    stats = batcher.stats
    if args.json:
        print(json.dumps({"prompts": prompts, "tokens": tokens, "continuous": True, "engine": batcher.session.engine,
                          "seconds": seconds, "tokens_per_s": made / seconds if seconds > 0 else None,
                          "stats": {name: getattr(stats, name) for name in _BATCHER_STATS},
                          **({"explain": batcher.explain()} if args.explain else {}),
                          **_profile_json(profile)}, indent=2))
        return 0
    if not args.stream:
        for row in tokens:
            print(",".join(str(t) for t in row))
    print(f"{made} tokens in {seconds * 1e3:.1f} ms (continuous batching, {batcher.session.engine} engine)",
          file=sys.stderr)
    if args.stats:
        print(stats, file=sys.stderr)
    if args.explain:
        print(batcher.explain(), file=sys.stderr)
    _print_profile(profile)
    return 0


# The fields of BatcherStats that `generate --continuous --json` writes.
_BATCHER_STATS = ("waiting", "running", "finished", "steps", "prefills", "prefill_runs", "prefill_tokens",
                  "shared_tokens", "decode_steps", "decode_tokens", "decode_tokens_per_s", "max_running", "regathers",
                  "rows_joined", "preemptions", "recomputed_tokens", "prefill_ms", "decode_ms", "decode_regather_ms",
                  "decode_feeds_ms", "decode_run_ms", "decode_commit_ms", "decode_pick_ms", "blocks_total",
                  "blocks_used", "blocks_cached", "block_size", "pool_bytes")


# The fields of GenerationStats that `generate --json` writes (docs/generation.md "Statistics").
_GENERATION_STATS = ("prefill_tokens", "prefill_ms", "prefill_tokens_per_s", "decode_steps", "decode_tokens",
                     "decode_ms", "ms_per_decode_step", "decode_tokens_per_s", "decode_feeds_ms", "decode_run_ms",
                     "decode_commit_ms", "decode_pick_ms", "cache_length", "cache_capacity", "cache_occupancy",
                     "cache_bytes")


COMMANDS = {"devices": cmd_devices, "run": cmd_run, "bench": cmd_bench, "explain": cmd_explain,
            "profile": cmd_profile, "audit": cmd_audit, "tune": cmd_tune, "compare": cmd_compare, "quantize": cmd_quantize,
            "generate": cmd_generate}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the ``xpuruntime`` command line; returns the exit code (0, 1 on a failed run or a mismatch, 2 on a bad
    argument)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        import xpuruntime as xrt

        print(f"xpuruntime {xrt.__version__}")
        return 0
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    prog = f"{PROG} {args.command}"
    try:
        import xpuruntime as xrt

        try:
            return COMMANDS[args.command](args)
        except (UsageError, xrt.InvalidArgumentError, xrt.InvalidTypeError) as error:
            if args.traceback:
                raise
            print(f"{prog}: error: {_one_line(error)} (see {prog} --help)", file=sys.stderr)
            return 2
        except (CommandFailed, xrt.XpuRuntimeError) as error:
            if args.traceback:
                raise
            kind = "" if isinstance(error, CommandFailed) else f"{type(error).__name__}: "
            print(f"{prog}: {kind}{_one_line(error)}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): not an error of the command.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except Exception as error:  # a bug in xpuruntime: one line, the traceback with --traceback
        if args.traceback:
            raise
        print(f"{prog}: internal error: {type(error).__name__}: {_one_line(error)} (rerun with --traceback and "
              f"report it)", file=sys.stderr)
        return 1


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
