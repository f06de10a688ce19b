#!/usr/bin/env python3
"""Runs the ONNX backend node tests (one model per operator case) through an xpuruntime InferenceSession engine.

Each test folder holds ``model.onnx`` and ``test_data_set_*/input_*.pb`` / ``output_*.pb`` (serialized
TensorProto; sequence and optional values are SequenceProto / OptionalProto). For every folder this builds
``xpuruntime.InferenceSession(model, device=..., engine=...)``, feeds each data set's inputs by the session's
input names (``get_inputs()`` order is ``input_0``, ``input_1``, ...), runs ``run(None, feeds)`` and compares
the outputs with the ONNX backend-test rule: same dtype and shape, ``assert_allclose(rtol=1e-3, atol=1e-7)`` for
floating dtypes (NaN equals NaN), exact equality for the others.

Sequence and optional values are fed and returned as ONNX Runtime's Python API does: a sequence as a list of
arrays, an empty optional as None, an optional holding a value as that value (an array or a list). The expected
values (SequenceProto / OptionalProto, read as the model declares them) take the same form, and the rule above
applies per element: a sequence must have as many elements as expected, an empty optional must come back as None.

bfloat16 values, which numpy cannot hold, travel as xpuruntime Tensors: a bfloat16 input is fed as its uint16 bit
patterns viewed as bfloat16 (``xrt.from_numpy(bits).view("bfloat16")``), a bfloat16 output comes back from
``run`` as a bfloat16 Tensor and is compared as float32 values within one unit in the last place of bfloat16
(Note [bfloat16 tolerance] below).

Each test gets one status:
  pass   every data set matched.
  fail   a value, shape or dtype differed (the detail says where).
  error  creating the session or running it raised (the detail is the exception type and its first line).
  skip   the model uses values xpuruntime cannot represent (strings, maps, complex, also inside sequences and
         optionals), or sequences and optionals that the engine refuses (UnsupportedOperationError when the session
         is made: the onnxruntime engine exchanges tensors only); the detail says which.

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

# Note [bfloat16 tolerance]
# bfloat16 keeps 8 significant bits, so one unit in its last place is 2^-8..2^-7 of the value: the backend-test
# rtol of 1e-3 is finer than the format itself. Debian's test data (ONNX 1.12's cast.py) made its float32 ->
# bfloat16 Cast outputs by dropping the low 16 bits, while ONNX's own onnx.helper.float32_to_bfloat16, ONNX
# Runtime, PyTorch and CUDA round to nearest even (as xpuruntime does); the two differ by one unit in the last
# place on 5 of the 12 values. bfloat16 outputs are therefore compared with rtol = 2^-7 (one unit in the last
# place at any magnitude): a rounding difference passes, any larger error fails. ONNX 1.12's own runner compared
# these outputs as their uint16 bit patterns with rtol=1e-3, i.e. up to ~16 units in the last place.
BFLOAT16_RTOL = 2.0 ** -7
BFLOAT16 = 16  # TensorProto.BFLOAT16

# TensorProto.DataType values xpuruntime has a tensor dtype for. numpy holds them all but bfloat16, which the
# runner passes as xpuruntime Tensors (see the module docstring).
_SUPPORTED_ELEM_TYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
    11: "float64", 12: "uint32", 13: "uint64", BFLOAT16: "bfloat16",
}
_UNSUPPORTED_ELEM_TYPES = {8: "string tensors", 14: "complex64 tensors", 15: "complex128 tensors"}


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
    """Why a value of this TypeProto cannot be fed to or returned by xpuruntime, or None when it can: tensors of the
    supported element types, sequences of them and optionals of those."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        elem = type_proto.tensor_type.elem_type
        if elem in _SUPPORTED_ELEM_TYPES:
            return None
        return _UNSUPPORTED_ELEM_TYPES.get(elem, f"tensor element type {elem}")
    if kind == "sequence_type":
        elem = type_proto.sequence_type.elem_type
        if elem.WhichOneof("value") != "tensor_type":
            return f"sequences of {_describe_type(elem) or elem.WhichOneof('value')}"
        return _describe_type(elem)
    if kind == "optional_type":
        elem = type_proto.optional_type.elem_type
        if elem.WhichOneof("value") not in ("tensor_type", "sequence_type"):
            return f"optionals of {_describe_type(elem) or elem.WhichOneof('value')}"
        return _describe_type(elem)
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


def value_kinds(model) -> Optional[str]:
    """"sequences", "optionals" or "sequences and optionals" when the graph's fed inputs or outputs include them,
    else None."""
    initializers = {i.name for i in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in initializers] + list(model.graph.output)
    kinds = {v.type.WhichOneof("value") for v in values}
    names = [name for kind, name in (("sequence_type", "sequences"), ("optional_type", "optionals")) if kind in kinds]
    return " and ".join(names) or None


def _declared_types(model):
    """The TypeProtos the graph declares for its fed inputs and its outputs, in the order of the data sets'
    input_*.pb / output_*.pb files."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v.type for v in model.graph.input if v.name not in initializers]
    return inputs, [v.type for v in model.graph.output]


def _tensor_elem_type(type_proto) -> Optional[int]:
    """The element type of a tensor type, or of the tensors a sequence or optional type holds (None if unknown)."""
    if type_proto is None:
        return None
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return type_proto.tensor_type.elem_type
    if kind in ("sequence_type", "optional_type"):
        return _tensor_elem_type(getattr(type_proto, kind).elem_type)
    return None


def bfloat16_bits(tensor) -> np.ndarray:
    """The uint16 bit patterns of a bfloat16 value serialized as a TensorProto. ONNX stores them in raw_data or
    int32_data, typed BFLOAT16, or UINT16 as in the data ONNX 1.12 generated (the model says bfloat16)."""
    onnx, _ = _import_onnx()
    if tensor.data_type not in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.UINT16):
        raise ValueError(f"a bfloat16 value stored as TensorProto type {tensor.data_type}")
    if tensor.HasField("raw_data"):
        bits = np.frombuffer(tensor.raw_data, dtype="<u2").astype(np.uint16)
    else:
        bits = np.asarray(tensor.int32_data, dtype=np.int64).astype(np.uint16)
    return bits.reshape(tuple(tensor.dims))


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> their float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _tensor_value(tensor, elem_type: Optional[int]):
    """A TensorProto as a numpy array; a bfloat16 one (``elem_type`` 16) as its uint16 bits."""
    _, numpy_helper = _import_onnx()
    if elem_type == BFLOAT16:
        return bfloat16_bits(tensor)
    return numpy_helper.to_array(tensor)


def _sequence_value(sequence, elem_type: Optional[int]) -> list:
    """A SequenceProto of tensors as a list of numpy arrays."""
    onnx, _ = _import_onnx()
    if sequence.elem_type not in (onnx.SequenceProto.TENSOR, onnx.SequenceProto.UNDEFINED):
        raise ValueError(f"a sequence of SequenceProto element type {sequence.elem_type} (tensors only)")
    return [_tensor_value(t, elem_type) for t in sequence.tensor_values]


def _read_value(path: str, type_proto):
    """One input_*.pb / output_*.pb file read as the model declares the value: a TensorProto as an array (bfloat16:
    its uint16 bits), a SequenceProto as a list of arrays, an OptionalProto as None or what it holds."""
    onnx, _ = _import_onnx()
    kind = type_proto.WhichOneof("value") if type_proto is not None else "tensor_type"
    elem_type = _tensor_elem_type(type_proto)
    with open(path, "rb") as f:
        data = f.read()
    if kind == "sequence_type":
        sequence = onnx.SequenceProto()
        sequence.ParseFromString(data)
        return _sequence_value(sequence, elem_type)
    if kind == "optional_type":
        optional = onnx.OptionalProto()
        optional.ParseFromString(data)
        if optional.elem_type == onnx.OptionalProto.TENSOR:
            return _tensor_value(optional.tensor_value, elem_type)
        if optional.elem_type == onnx.OptionalProto.SEQUENCE:
            return _sequence_value(optional.sequence_value, elem_type)
        if optional.elem_type == onnx.OptionalProto.UNDEFINED:
            return None
        raise ValueError(f"an optional of OptionalProto element type {optional.elem_type}")
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return _tensor_value(tensor, elem_type)


def _feed(value, elem_type: Optional[int]):
    """What run() is fed for one input: the array, or for bfloat16 its bits viewed as a bfloat16 Tensor; the same
    per element for a sequence (a list); None (an empty optional) as is."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_feed(v, elem_type) for v in value]
    if elem_type != BFLOAT16:
        return value
    import xpuruntime as xrt

    return xrt.from_numpy(np.ascontiguousarray(value, dtype=np.uint16)).view("bfloat16")


def _data_sets(test_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(test_dir, "test_data_set_*")),
                  key=lambda p: int(p.rsplit("_", 1)[-1]) if p.rsplit("_", 1)[-1].isdigit() else 0)


def _numbered(folder: str, prefix: str) -> List[str]:
    files = glob.glob(os.path.join(folder, f"{prefix}_*.pb"))
    return sorted(files, key=lambda p: int(os.path.basename(p)[len(prefix) + 1:-3]))


def _values_differ(actual: np.ndarray, expected: np.ndarray, index: int, rtol: float) -> Optional[str]:
    try:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=ATOL, equal_nan=True)
    except AssertionError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith(("Mismatched", "Max"))]
        return f"output {index}: values differ ({'; '.join(lines)})"
    return None


def compare_bfloat16(expected_bits: np.ndarray, actual, index: int) -> Optional[str]:
    """None when ``actual`` (a bfloat16 xpuruntime Tensor) matches the bfloat16 bit patterns ``expected_bits``
    as float32 values within rtol 2^-7 (Note [bfloat16 tolerance]), else what differs."""
    dtype = getattr(actual, "dtype", None)
    if isinstance(actual, np.ndarray) or dtype != "bfloat16":
        return f"output {index}: expected a bfloat16 xpuruntime Tensor, got {type(actual).__name__} of dtype {dtype}"
    if tuple(actual.shape) != expected_bits.shape:
        return f"output {index}: shape {list(actual.shape)}, expected {list(expected_bits.shape)}"
    got = bfloat16_to_float32(actual.view("uint16").numpy())
    return _values_differ(got, bfloat16_to_float32(expected_bits), index, BFLOAT16_RTOL)


def compare(expected: np.ndarray, actual, index: int) -> Optional[str]:
    """None when ``actual`` matches ``expected`` by the ONNX backend-test rule, else what differs."""
    if not isinstance(actual, np.ndarray):
        return f"output {index}: expected a numpy array, got {type(actual).__name__}"
    if actual.dtype != expected.dtype:
        return f"output {index}: dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"output {index}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    if np.issubdtype(expected.dtype, np.floating):
        return _values_differ(actual, expected, index, RTOL)
    if not np.array_equal(actual, expected):
        bad = int(np.count_nonzero(actual != expected))
        return f"output {index}: {bad} of {expected.size} elements differ"
    return None


def compare_value(expected, actual, index: int, elem_type: Optional[int] = None) -> Optional[str]:
    """None when ``actual`` matches ``expected``, else what differs. Tensors by :func:`compare` (bfloat16 ones,
    ``elem_type`` 16, by :func:`compare_bfloat16`); a sequence (a list) must be a list of as many elements, each
    compared so; an empty optional (None) must be None."""
    if expected is None:
        return None if actual is None else f"output {index}: expected None (an empty optional), got " \
                                             f"{type(actual).__name__}"
    if actual is None:
        return f"output {index}: got None (an empty optional), expected a value"
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"output {index}: expected a sequence (a list), got {type(actual).__name__}"
        if len(actual) != len(expected):
            return f"output {index}: a sequence of {len(actual)} elements, expected {len(expected)}"
        for position, (want, got) in enumerate(zip(expected, actual)):
            problem = compare_value(want, got, index, elem_type)
            if problem is not None:
                return f"{problem} (sequence element {position})"
        return None
    if elem_type == BFLOAT16:
        return compare_bfloat16(expected, actual, index)
    return compare(expected, actual, index)


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


def _frozen(model, input_files, in_types):
    """The model with every graph input but the first turned into an initializer holding this data set's value: the
    node's parameters (pads, axes, sizes, K, bounds, indices) become constants, as real exports have them, so the
    native engine lowers the node onto its registry op (``--freeze-inputs``). None when an input is not a tensor."""
    import copy
    from onnx import numpy_helper
    frozen = copy.deepcopy(model)
    initialized = {i.name for i in frozen.graph.initializer}
    graph_inputs = [i for i in frozen.graph.input if i.name not in initialized]
    for graph_input, path, declared in list(zip(graph_inputs, input_files, in_types))[1:]:
        value = _read_value(path, declared)
        if not isinstance(value, np.ndarray):
            return None
        frozen.graph.initializer.append(numpy_helper.from_array(value, graph_input.name))
        frozen.graph.input.remove(graph_input)
    return frozen


def _host_value(value):
    """A device tensor as the comparison takes it: a NumPy array (an xpuruntime Tensor for the dtypes NumPy lacks)."""
    if hasattr(value, "device") and getattr(value.device, "type", "cpu") != "cpu":
        value = value.cpu()
        if str(value.dtype) not in ("bfloat16", "uint16", "uint32", "uint64"):
            return np.asarray(value.numpy())
    return value


def run_test(test_dir: str, engine: str = "onnxruntime", device: str = "cpu",
             max_data_sets: Optional[int] = None, freeze_inputs: bool = False) -> Result:
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
        if freeze_inputs:  # the sessions are made per data set; this one only names the inputs
            session = None
            initialized = {i.name for i in model.graph.initializer}
            input_names = [i.name for i in model.graph.input if i.name not in initialized]
        else:
            session = xrt.InferenceSession(model_path, device=device, engine=engine)
            input_names = [i.name for i in session.get_inputs()]
    except Exception as exc:
        kinds = value_kinds(model)
        if kinds and isinstance(exc, xrt.UnsupportedOperationError):
            # An engine that exchanges tensors only (the onnxruntime engine) cannot express the test.
            return Result("skip", f"engine '{engine}' does not take {kinds}: {_exception_detail(exc)}")
        return Result("error", f"session: {_exception_detail(exc)}")

    input_types, output_types = _declared_types(model)
    for data_set in data_sets:
        label = os.path.basename(data_set)
        try:
            input_files, output_files = _numbered(data_set, "input"), _numbered(data_set, "output")
            in_types = (input_types + [None] * len(input_files))[:len(input_files)]
            out_types = (output_types + [None] * len(output_files))[:len(output_files)]
            inputs = [_read_value(p, t) for p, t in zip(input_files, in_types)]
            expected = [_read_value(p, t) for p, t in zip(output_files, out_types)]
        except Exception as exc:
            return Result("skip", f"{label}: cannot read a value as the model declares it: {_exception_detail(exc)}")
        if len(inputs) != len(input_names):
            return Result("error", f"{label}: {len(inputs)} input files for the session's "
                                   f"{len(input_names)} inputs {input_names}")
        run_session, names = session, input_names
        if run_session is None and len(inputs) <= 1:  # nothing to freeze
            try:
                run_session = session = xrt.InferenceSession(model_path, device=device, engine=engine)
            except Exception as exc:
                return Result("error", f"session: {_exception_detail(exc)}")
        elif freeze_inputs and len(inputs) > 1:
            frozen = _frozen(model, input_files, in_types)
            if frozen is None:
                return Result("skip", f"{label}: --freeze-inputs takes tensor inputs only")
            try:
                run_session = xrt.InferenceSession(frozen.SerializeToString(), device=device, engine=engine)
            except Exception as exc:
                return Result("error", f"session ({label}, inputs frozen): {_exception_detail(exc)}")
            names = input_names[:1]
        feeds = {name: _feed(value, _tensor_elem_type(t)) for name, value, t in zip(names, inputs, in_types)}
        try:
            actual = [_host_value(v) for v in run_session.run(None, feeds)]
        except Exception as exc:
            return Result("error", f"run ({label}): {_exception_detail(exc)}")
        if len(actual) != len(expected):
            return Result("fail", f"{label}: {len(actual)} outputs, expected {len(expected)}")
        for index, (want, got) in enumerate(zip(expected, actual)):
            problem = compare_value(want, got, index, _tensor_elem_type(out_types[index]))
            if problem is not None:
                return Result("fail", f"{label}: {problem}")
    return Result("pass", f"{len(data_sets)} data set(s)")


def list_tests(data_dir: str, keyword: Optional[str] = None) -> List[str]:
    """The test folders (those with a model.onnx) under ``data_dir`` whose name contains ``keyword``."""
    names = sorted(n for n in os.listdir(data_dir) if os.path.isfile(os.path.join(data_dir, n, "model.onnx")))
    return [n for n in names if keyword is None or keyword in n]


def run_suite(data_dir: str = DEFAULT_DATA, engine: str = "onnxruntime", device: str = "cpu",
              keyword: Optional[str] = None, names: Optional[List[str]] = None, verbose: bool = False,
              max_data_sets: Optional[int] = None, out=sys.stdout, freeze_inputs: bool = False) -> Summary:
    """Runs the selected tests (``names``, else every folder matching ``keyword``) and returns their results."""
    summary = Summary()
    start = time.perf_counter()
    selected = names if names is not None else list_tests(data_dir, keyword)
    for name in selected:
        result = run_test(os.path.join(data_dir, name), engine, device, max_data_sets, freeze_inputs)
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
    parser.add_argument("--freeze-inputs", action="store_true",
                        help="turn every input but the first into a constant of each data set's value (the node's "
                             "parameters become constants, as in real exports: the native engine on CUDA lowers them)")
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
                        max_data_sets=args.max_data_sets, freeze_inputs=args.freeze_inputs)
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
