#!/usr/bin/env python3
"""Runs the ONNX backend node tests (one model per operator case) through an xpuruntime InferenceSession engine.

Each test folder holds ``model.onnx`` and ``test_data_set_*/input_*.pb`` / ``output_*.pb`` (serialized
TensorProto; sequence and optional values are SequenceProto / OptionalProto). For every folder this builds
``xpuruntime.InferenceSession(model, device=..., engine=...)``, feeds each data set's inputs by the session's
input names (``get_inputs()`` order is ``input_0``, ``input_1``, ...), runs ``run(None, feeds)`` and compares
the outputs with the ONNX backend-test rule: same dtype and shape, ``assert_allclose(rtol=1e-3, atol=1e-7)`` for
floating dtypes (NaN equals NaN), exact equality for the others.

Each test gets one status:
  pass   every data set matched.
  fail   a value, shape or dtype differed (the detail says where).
  error  creating the session or running it raised (the detail is the exception type and its first line).
  skip   the model uses values xpuruntime cannot represent (strings, sequences, optionals, maps, bfloat16,
         unsigned 16/32/64-bit, complex); the detail says which.

Usage:
  PYTHONPATH=src/python /usr/bin/python3 scripts/run_onnx_node_tests.py [--engine onnxruntime] [--device cpu]
      [--data DIR] [-k SUBSTRING] [--json OUT] [--verbose] [--max-data-sets N] [--min-pass N]

The exit code is 0 unless --min-pass N is given and fewer than N tests passed (then 1). Needs the ``onnx``
Python package (Debian: python3-onnx) to read the protobuf files; the test data is Debian's libonnx-testdata.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

DEFAULT_DATA = "/usr/share/libonnx-testdata/data/node"
RTOL = 1e-3
ATOL = 1e-7
STATUSES = ("pass", "fail", "error", "skip")

# TensorProto.DataType values xpuruntime has a tensor dtype for (and numpy can hold). bfloat16 (16) is a
# runtime dtype but has no numpy type, so feeds/expected values cannot be expressed: those tests are skipped.
_SUPPORTED_ELEM_TYPES = {
    1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
    11: "float64",
}
_UNSUPPORTED_ELEM_TYPES = {
    8: "string tensors", 16: "bfloat16 (no numpy type)", 4: "uint16 tensors", 12: "uint32 tensors",
    13: "uint64 tensors", 14: "complex64 tensors", 15: "complex128 tensors",
}


@dataclass
class Result:
    status: str
    detail: str = ""


@dataclass
class Summary:
    results: Dict[str, Result] = field(default_factory=dict)
    wall_s: float = 0.0

    def names(self, status: str) -> List[str]:
        return sorted(n for n, r in self.results.items() if r.status == status)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results.values() if r.status == status)

    @property
    def passed(self) -> int:
        return self.count("pass")

    def line(self) -> str:
        return (f"{self.count('pass')} passed, {self.count('fail')} failed, {self.count('error')} errors, "
                f"{self.count('skip')} skipped of {len(self.results)}")

    def to_json(self) -> Dict[str, Dict[str, str]]:
        return {n: {"status": r.status, "detail": r.detail} for n, r in sorted(self.results.items())}


def _import_onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:  # the caller reports this; the test module skips on it
        raise RuntimeError(f"the ONNX node-test runner needs the 'onnx' Python package "
                           f"(Debian: apt install python3-onnx; pip: pip install onnx): {exc}") from exc
    return onnx, numpy_helper


def _describe_type(type_proto) -> Optional[str]:
    """Why a value of this TypeProto cannot be fed to or returned by xpuruntime, or None when it can."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        elem = type_proto.tensor_type.elem_type
        if elem in _SUPPORTED_ELEM_TYPES:
            return None
        return _UNSUPPORTED_ELEM_TYPES.get(elem, f"tensor element type {elem}")
    if kind == "sequence_type":
        return "sequences"
    if kind == "optional_type":
        return "optionals"
    if kind == "map_type":
        return "maps"
    if kind == "sparse_tensor_type":
        return "sparse tensors"
    return f"values of type '{kind}'"


def unsupported_reason(model) -> Optional[str]:
    """Why the model's graph inputs/outputs cannot go through an InferenceSession, or None."""
    initializers = {i.name for i in model.graph.initializer}
    reasons = []
    for where, values in (("input", model.graph.input), ("output", model.graph.output)):
        for value in values:
            if where == "input" and value.name in initializers:
                continue
            reason = _describe_type(value.type)
            if reason is not None:
                reasons.append(f"{where} '{value.name}': {reason}")
    return "; ".join(reasons) if reasons else None


def _read_tensor(path: str):
    onnx, numpy_helper = _import_onnx()
    tensor = onnx.TensorProto()
    with open(path, "rb") as f:
        tensor.ParseFromString(f.read())
    return numpy_helper.to_array(tensor)


def _data_sets(test_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(test_dir, "test_data_set_*")),
                  key=lambda p: int(p.rsplit("_", 1)[-1]) if p.rsplit("_", 1)[-1].isdigit() else 0)


def _numbered(folder: str, prefix: str) -> List[str]:
    files = glob.glob(os.path.join(folder, f"{prefix}_*.pb"))
    return sorted(files, key=lambda p: int(os.path.basename(p)[len(prefix) + 1:-3]))


def compare(expected: np.ndarray, actual, index: int) -> Optional[str]:
    """None when ``actual`` matches ``expected`` by the ONNX backend-test rule, else what differs."""
    if not isinstance(actual, np.ndarray):
        return f"output {index}: expected a numpy array, got {type(actual).__name__}"
    if actual.dtype != expected.dtype:
        return f"output {index}: dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"output {index}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    if np.issubdtype(expected.dtype, np.floating):
        try:
            np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith(("Mismatched", "Max"))]
            return f"output {index}: values differ ({'; '.join(lines)})"
        return None
    if not np.array_equal(actual, expected):
        bad = int(np.count_nonzero(actual != expected))
        return f"output {index}: {bad} of {expected.size} elements differ"
    return None


# xpuruntime's library errors read "<library> error <code> in `<call>` at <file>:<line>. <reason>"; the call and
# the source location say nothing about the test, so the detail keeps the code and the reason.
_LIBRARY_ERROR = re.compile(r"^(?P<code>.*?) in `.*` at \S+:\d+\. (?P<reason>.*)$")


def _exception_detail(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    text = str(exc).strip()
    first = text.splitlines()[0].strip() if text else ""
    match = _LIBRARY_ERROR.match(first)
    if match:
        first = f"{match.group('code')}: {match.group('reason')}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run_test(test_dir: str, engine: str = "onnxruntime", device: str = "cpu",
             max_data_sets: Optional[int] = None) -> Result:
    """Runs one node test folder and classifies it."""
    import xpuruntime as xrt

    onnx, _ = _import_onnx()
    model_path = os.path.join(test_dir, "model.onnx")
    try:
        model = onnx.load(model_path)
    except Exception as exc:  # an unreadable test model is the data's problem, not the engine's
        return Result("skip", f"onnx cannot load model.onnx: {_exception_detail(exc)}")
    reason = unsupported_reason(model)
    if reason is not None:
        return Result("skip", reason)

    data_sets = _data_sets(test_dir)
    if max_data_sets is not None:
        data_sets = data_sets[:max_data_sets]
    if not data_sets:
        return Result("skip", "no test_data_set_* folder")

    try:
        session = xrt.InferenceSession(model_path, device=device, engine=engine)
        input_names = [i.name for i in session.get_inputs()]
    except Exception as exc:
        return Result("error", f"session: {_exception_detail(exc)}")

    for data_set in data_sets:
        label = os.path.basename(data_set)
        try:
            inputs = [_read_tensor(p) for p in _numbered(data_set, "input")]
            expected = [_read_tensor(p) for p in _numbered(data_set, "output")]
        except Exception as exc:
            return Result("skip", f"{label}: cannot read a value as a TensorProto: {_exception_detail(exc)}")
        if len(inputs) != len(input_names):
            return Result("error", f"{label}: {len(inputs)} input files for the session's "
                                   f"{len(input_names)} inputs {input_names}")
        feeds = dict(zip(input_names, inputs))
        try:
            actual = session.run(None, feeds)
        except Exception as exc:
            return Result("error", f"run ({label}): {_exception_detail(exc)}")
        if len(actual) != len(expected):
            return Result("fail", f"{label}: {len(actual)} outputs, expected {len(expected)}")
        for index, (want, got) in enumerate(zip(expected, actual)):
            problem = compare(want, got, index)
            if problem is not None:
                return Result("fail", f"{label}: {problem}")
    return Result("pass", f"{len(data_sets)} data set(s)")


def list_tests(data_dir: str, keyword: Optional[str] = None) -> List[str]:
    """The test folders (those with a model.onnx) under ``data_dir`` whose name contains ``keyword``."""
    names = sorted(n for n in os.listdir(data_dir) if os.path.isfile(os.path.join(data_dir, n, "model.onnx")))
    return [n for n in names if keyword is None or keyword in n]


def run_suite(data_dir: str = DEFAULT_DATA, engine: str = "onnxruntime", device: str = "cpu",
              keyword: Optional[str] = None, names: Optional[List[str]] = None, verbose: bool = False,
              max_data_sets: Optional[int] = None, out=sys.stdout) -> Summary:
    """Runs the selected tests (``names``, else every folder matching ``keyword``) and returns their results."""
    summary = Summary()
    start = time.perf_counter()
    selected = names if names is not None else list_tests(data_dir, keyword)
    for name in selected:
        result = run_test(os.path.join(data_dir, name), engine, device, max_data_sets)
        summary.results[name] = result
        if verbose:
            print(f"{result.status.upper():5} {name}  {result.detail}", file=out, flush=True)
    summary.wall_s = time.perf_counter() - start
    return summary


def print_summary(summary: Summary, out=sys.stdout) -> None:
    for status in ("fail", "error", "skip", "pass"):
        names = summary.names(status)
        if names:
            print(f"{status} ({len(names)}): {' '.join(names)}", file=out)
    print(f"{summary.line()} ({summary.wall_s:.1f} s)", file=out)


def _parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="onnxruntime", help="InferenceSession engine (default: onnxruntime)")
    parser.add_argument("--device", default="cpu", help="device, e.g. cpu or cuda:0 (default: cpu)")
    parser.add_argument("--data", default=DEFAULT_DATA, help=f"node test folder (default: {DEFAULT_DATA})")
    parser.add_argument("-k", dest="keyword", default=None, help="run only tests whose name contains this")
    parser.add_argument("--json", dest="json_out", default=None, help="write {test: {status, detail}} here")
    parser.add_argument("--verbose", action="store_true", help="print one line per test")
    parser.add_argument("--max-data-sets", type=int, default=None, help="use at most N data sets per test")
    parser.add_argument("--min-pass", type=int, default=None, help="exit 1 when fewer than N tests pass")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse_args(argv)
    if not os.path.isdir(args.data):
        print(f"error: no ONNX node-test folder at {args.data} (Debian: apt install libonnx-testdata; "
              f"or pass --data DIR)", file=sys.stderr)
        return 1 if args.min_pass is not None else 0
    _import_onnx()
    summary = run_suite(args.data, args.engine, args.device, args.keyword, verbose=args.verbose,
                        max_data_sets=args.max_data_sets)
    print_summary(summary)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary.to_json(), f, indent=1, sort_keys=True)
            f.write("\n")
    if args.min_pass is not None and summary.passed < args.min_pass:
        print(f"error: {summary.passed} tests passed, --min-pass asks for {args.min_pass}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
