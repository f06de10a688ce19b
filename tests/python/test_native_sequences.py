"""Sequences and optionals in the native engine, from Python: small hand-built models (onnx.helper) for every
sequence and optional op (SequenceEmpty/Construct/Insert/At/Erase/Length, SplitToSequence, ConcatFromSequence,
SequenceMap, Optional, OptionalHasElement, OptionalGetElement, Identity, If and Loop carrying them) checked against
NumPy, the I/O convention of ONNX Runtime's Python API (a sequence is a list of arrays, an empty optional None, an
optional holding a value that value), ValueInfo types, and the typed errors for feeds of the wrong kind (each names
the input). The ONNX backend node tests (test_onnx_node_tests.py) run the same ops on the ONNX test data."""

from __future__ import annotations

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx", reason="the models are built with the onnx package (python3-onnx)")
from onnx import TensorProto, helper  # noqa: E402

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def seq_type(elem_type=FLOAT, shape=None):
    return helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem_type, shape))


def opt_type(inner):
    return helper.make_optional_type_proto(inner)


def tensor_type(elem_type=FLOAT, shape=None):
    return helper.make_tensor_type_proto(elem_type, shape)


def model(nodes, inputs, outputs, initializers=(), opset=17):
    """A model from nodes and (name, TypeProto) inputs and outputs."""
    graph = helper.make_graph(nodes, "g", [helper.make_value_info(n, t) for n, t in inputs],
                              [helper.make_value_info(n, t) for n, t in outputs], initializer=list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def session(nodes, inputs, outputs, initializers=(), opset=17):
    return xrt.InferenceSession(model(nodes, inputs, outputs, initializers, opset), engine="native")


def const(name, array):
    return helper.make_tensor(name, TensorProto.INT64 if np.asarray(array).dtype == np.int64 else FLOAT,
                              np.shape(array), np.asarray(array).flatten().tolist())


def f32(*values):
    return np.array(values, dtype=np.float32)


def assert_arrays(actual, expected):
    assert isinstance(actual, list), type(actual)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


# ---- I/O and types ----

def identity_session():
    nodes = [helper.make_node("Identity", ["xs"], ["ys"]), helper.make_node("Identity", ["o"], ["p"])]
    return session(nodes, [("xs", seq_type(FLOAT, ["n"])), ("o", opt_type(tensor_type(INT64, [2])))],
                   [("ys", seq_type(FLOAT, ["n"])), ("p", opt_type(tensor_type(INT64, [2])))], opset=16)


def test_value_info_says_the_type():
    s = identity_session()
    xs, o = s.get_inputs()
    assert (xs.type, xs.kind, xs.dtype, xs.shape) == ("seq(tensor(float32))", "sequence", "float32", ["n"])
    assert (o.type, o.kind) == ("optional(tensor(int64))", "optional")
    assert repr(xs) == "<ValueInfo xs: seq(float32[n])>"
    assert [v.type for v in s.get_outputs()] == ["seq(tensor(float32))", "optional(tensor(int64))"]
    seq_opt = session([helper.make_node("Identity", ["a"], ["b"])], [("a", opt_type(seq_type()))],
                      [("b", opt_type(seq_type()))], opset=16)
    assert seq_opt.get_inputs()[0].type == "optional(seq(tensor(float32)))"
    plain = session([helper.make_node("Relu", ["x"], ["y"])], [("x", tensor_type(FLOAT, [2]))],
                    [("y", tensor_type(FLOAT, [2]))])
    assert (plain.get_inputs()[0].type, plain.get_inputs()[0].kind) == ("tensor(float32)", "tensor")


def test_lists_and_none_in_lists_and_none_out():
    s = identity_session()
    xs = [f32(1, 2), f32(3)]
    ys, p = s.run(None, {"xs": xs, "o": np.array([4, 5], dtype=np.int64)})
    assert_arrays(ys, xs)
    assert isinstance(p, np.ndarray) and p.tolist() == [4, 5]  # an optional holding a tensor: the tensor
    ys[0][0] = 100.0  # the outputs are the caller's: the feeds are not aliased
    assert xs[0][0] == 1.0
    out = s.run({"xs": (f32(7),), "o": None})  # a tuple is a sequence too; None is an empty optional
    assert_arrays(out["ys"], [f32(7)])
    assert out["p"] is None
    empty, _ = s.run(None, {"xs": [], "o": None})  # an empty list takes the declared element type
    assert empty == []


def test_sequence_ops_construct_at_insert_erase_length():
    nodes = [
        helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
        helper.make_node("SequenceAt", ["s", "minus_one"], ["last"]),
        helper.make_node("SequenceInsert", ["s", "a", "zero"], ["front"]),
        helper.make_node("SequenceErase", ["front"], ["erased"]),
        helper.make_node("SequenceLength", ["erased"], ["n"]),
        helper.make_node("SequenceEmpty", [], ["e"], dtype=INT64),
        helper.make_node("SequenceLength", ["e"], ["n_empty"]),
    ]
    inputs = [("a", tensor_type(FLOAT, [1])), ("b", tensor_type(FLOAT, [2])), ("c", tensor_type(FLOAT, [2, 2]))]
    s = session(nodes, inputs,
                [("last", tensor_type()), ("front", seq_type()), ("erased", seq_type()), ("n", tensor_type(INT64, [])),
                 ("n_empty", tensor_type(INT64, []))],
                [const("minus_one", np.array(-1, np.int64)), const("zero", np.array(0, np.int64))], opset=11)
    a, b, c = f32(1), f32(2, 3), np.ones((2, 2), np.float32)
    last, front, erased, n, n_empty = s.run(None, {"a": a, "b": b, "c": c})
    np.testing.assert_array_equal(last, c)
    assert_arrays(front, [a, a, b, c])
    assert_arrays(erased, [a, a, b])
    assert n.shape == () and n == 3 and n_empty == 0


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_split_to_sequence_and_concat_from_sequence_match_numpy(axis):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    nodes = [
        helper.make_node("SplitToSequence", ["x", "lengths"], ["parts"], axis=axis),
        helper.make_node("SplitToSequence", ["x"], ["rows"], axis=axis, keepdims=0),
        helper.make_node("ConcatFromSequence", ["parts"], ["joined"], axis=axis),
        helper.make_node("ConcatFromSequence", ["rows"], ["stacked"], axis=axis, new_axis=1),
    ]
    lengths = np.array([1, 3], np.int64) if x.shape[axis] == 4 else np.array([1, 2, 3], np.int64)
    s = session(nodes, [("x", tensor_type(FLOAT, [4, 6]))],
                [("parts", seq_type()), ("rows", seq_type()), ("joined", tensor_type()), ("stacked", tensor_type())],
                [const("lengths", lengths)], opset=11)
    parts, rows, joined, stacked = s.run(None, {"x": x})
    assert_arrays(parts, np.split(x, np.cumsum(lengths)[:-1], axis=axis))
    assert_arrays(rows, [np.take(x, i, axis=axis) for i in range(x.shape[axis])])
    np.testing.assert_array_equal(joined, x)
    np.testing.assert_array_equal(stacked, np.stack(rows, axis=axis))


def test_sequence_map_with_a_tensor_and_two_outputs():
    body = helper.make_graph(
        [helper.make_node("Add", ["e", "t"], ["sum"]), helper.make_node("Shape", ["e"], ["shape"])], "body",
        [helper.make_tensor_value_info("e", FLOAT, ["n"]), helper.make_tensor_value_info("t", FLOAT, [1])],
        [helper.make_tensor_value_info("sum", FLOAT, ["n"]), helper.make_tensor_value_info("shape", INT64, [1])])
    s = session([helper.make_node("SequenceMap", ["xs", "t"], ["sums", "shapes"], body=body)],
                [("xs", seq_type(FLOAT, ["n"])), ("t", tensor_type(FLOAT, [1]))],
                [("sums", seq_type(FLOAT, ["n"])), ("shapes", seq_type(INT64, [1]))])
    xs = [f32(1, 2, 3), f32(4), np.zeros(0, np.float32)]
    sums, shapes = s.run(None, {"xs": xs, "t": f32(10)})
    assert_arrays(sums, [x + 10 for x in xs])
    assert_arrays(shapes, [np.array([3]), np.array([1]), np.array([0])])
    sums, shapes = s.run(None, {"xs": [], "t": f32(10)})
    assert sums == [] and shapes == []


def test_optional_has_element_get_element_and_optional():
    nodes = [
        helper.make_node("OptionalHasElement", ["o"], ["has"]),
        helper.make_node("If", ["has"], ["value"],
                         then_branch=helper.make_graph([helper.make_node("OptionalGetElement", ["o"], ["got"])],
                                                       "then", [], [helper.make_tensor_value_info("got", FLOAT, [2])]),
                         else_branch=helper.make_graph([helper.make_node("Identity", ["fallback"], ["fb"])], "else",
                                                       [], [helper.make_tensor_value_info("fb", FLOAT, [2])])),
        helper.make_node("Optional", ["fallback"], ["wrapped"]),
        helper.make_node("Optional", [], ["nothing"], type=seq_type(INT64)),
    ]
    s = session(nodes, [("o", opt_type(tensor_type(FLOAT, [2])))],
                [("has", tensor_type(BOOL, [])), ("value", tensor_type(FLOAT, [2])),
                 ("wrapped", opt_type(tensor_type(FLOAT, [2]))), ("nothing", opt_type(seq_type(INT64)))],
                [helper.make_tensor("fallback", FLOAT, [2], [-1, -2])], opset=16)
    has, value, wrapped, nothing = s.run(None, {"o": f32(5, 6)})
    assert has.dtype == np.bool_ and bool(has) is True
    np.testing.assert_array_equal(value, f32(5, 6))
    np.testing.assert_array_equal(wrapped, f32(-1, -2))
    assert nothing is None
    has, value, _, _ = s.run(None, {"o": None})
    assert bool(has) is False
    np.testing.assert_array_equal(value, f32(-1, -2))


def test_optional_get_element_of_an_empty_optional_raises():
    s = session([helper.make_node("OptionalGetElement", ["o"], ["x"])], [("o", opt_type(seq_type()))],
                [("x", seq_type())], opset=15)
    assert_arrays(s.run(None, {"o": [f32(1)]})[0], [f32(1)])
    with pytest.raises(xrt.InvalidArgumentError, match="optional input 'o' is empty"):
        s.run(None, {"o": None})


def test_loop_carries_a_sequence_and_if_returns_one():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=FLOAT),
         helper.make_node("Unsqueeze", ["fi", "axes"], ["row"]),
         helper.make_node("SequenceInsert", ["seq_in", "row"], ["seq_out"])],
        "body",
        [helper.make_tensor_value_info("i", INT64, []), helper.make_tensor_value_info("cond", BOOL, []),
         helper.make_value_info("seq_in", seq_type())],
        [helper.make_tensor_value_info("cond_out", BOOL, []), helper.make_value_info("seq_out", seq_type())],
        initializer=[const("axes", np.array([0], np.int64))])
    then_branch = helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], ["pair"])], "then", [],
                                    [helper.make_value_info("pair", seq_type())])
    else_branch = helper.make_graph([helper.make_node("SequenceEmpty", [], ["none"])], "else", [],
                                    [helper.make_value_info("none", seq_type())])
    nodes = [helper.make_node("Loop", ["trips", "", "start"], ["grown"], body=body),
             helper.make_node("If", ["flag"], ["chosen"], then_branch=then_branch, else_branch=else_branch)]
    s = session(nodes, [("trips", tensor_type(INT64, [])), ("start", seq_type()), ("flag", tensor_type(BOOL, [])),
                        ("x", tensor_type(FLOAT, [1]))],
                [("grown", seq_type()), ("chosen", seq_type())], opset=16)
    feeds = {"trips": np.array(3, np.int64), "start": [f32(9)], "flag": np.array(True), "x": f32(5)}
    grown, chosen = s.run(None, feeds)
    assert_arrays(grown, [f32(9), f32(0), f32(1), f32(2)])
    assert_arrays(chosen, [f32(5), f32(5)])
    grown, chosen = s.run(None, {**feeds, "trips": np.array(0, np.int64), "flag": np.array(False)})
    assert_arrays(grown, [f32(9)])
    assert chosen == []


def test_sequences_inside_a_tensor_model_run_with_plain_arrays():
    s = session([helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0),
                 helper.make_node("ConcatFromSequence", ["parts"], ["y"], axis=1)],
                [("x", tensor_type(FLOAT, [3, 2]))], [("y", tensor_type(FLOAT, [1, 6]))], opset=11)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(s.run({"x": x})["y"], x.reshape(1, 6))
    kinds = {n["op_type"]: n["kernel"] for n in s.explain().nodes}
    assert kinds["SplitToSequence"] == "onnx_ref" and kinds["ConcatFromSequence"] == "onnx_ref"


# ---- errors ----

def test_a_list_fed_to_a_tensor_input_is_a_type_error_naming_the_input():
    s = session([helper.make_node("Relu", ["x"], ["y"])], [("x", tensor_type(FLOAT, [2]))],
                [("y", tensor_type(FLOAT, [2]))])
    with pytest.raises(xrt.InvalidTypeError, match=r"input 'x' expects tensor\(float32\), got a sequence of 2"):
        s.run({"x": [f32(1, 2), f32(3, 4)]})
    seqs = identity_session()
    with pytest.raises(xrt.InvalidTypeError, match=r"input 'o' expects optional\(tensor\(int64\)\), got a sequence"):
        seqs.run({"xs": [f32(1)], "o": [np.array([1, 2], np.int64)]})


def test_a_tensor_fed_to_a_sequence_input_is_a_type_error_naming_the_input():
    s = identity_session()
    with pytest.raises(xrt.InvalidTypeError,
                       match=r"input 'xs' expects seq\(tensor\(float32\)\), got a float32 tensor"):
        s.run({"xs": f32(1, 2), "o": None})
    with pytest.raises(xrt.InvalidTypeError, match=r"input 'xs' expects seq\(tensor\(float32\)\), got a sequence of 1 "
                                                   r"int64 tensor"):
        s.run({"xs": [np.array([1], np.int64)], "o": None})
    with pytest.raises(xrt.InvalidTypeError, match=r"input 'xs' expects seq\(tensor\(float32\)\), got an empty"):
        s.run({"xs": None, "o": None})
    with pytest.raises(xrt.InvalidTypeError, match="sequence of float32 tensors cannot hold element 1 of dtype int64"):
        s.run({"xs": [f32(1), np.array([1], np.int64)], "o": None})
    with pytest.raises(xrt.InvalidArgumentError, match="missing input 'o'"):
        s.run({"xs": [f32(1)]})


def test_cuda_sessions_refuse_sequence_values_at_creation():
    identity = model([helper.make_node("Identity", ["xs"], ["ys"])], [("xs", seq_type())], [("ys", seq_type())],
                     opset=16)
    if not xrt.cuda_available():  # no device to create the session on: refused before the model is looked at
        with pytest.raises(xrt.CudaError, match="no CUDA device is available"):
            xrt.InferenceSession(identity, device="cuda", engine="native")
        return
    with pytest.raises(xrt.UnsupportedOperationError) as info:
        xrt.InferenceSession(identity, device="cuda", engine="native")
    assert "sequence and optional values on the CPU only" in str(info.value)
    assert "'xs' (seq(tensor(float32)))" in str(info.value)


def test_the_onnxruntime_engine_takes_tensors_only():
    relu = model([helper.make_node("Relu", ["x"], ["y"])], [("x", tensor_type(FLOAT, [2]))],
                 [("y", tensor_type(FLOAT, [2]))])
    try:
        s = xrt.InferenceSession(relu, engine="onnxruntime")
    except xrt.UnsupportedOperationError as exc:
        pytest.skip(f"the onnxruntime engine is unavailable: {exc}")
    np.testing.assert_array_equal(s.run({"x": f32(-1, 2)})["y"], f32(0, 2))
    with pytest.raises(xrt.InvalidTypeError, match=r"input 'x' expects tensor\(float32\), got a sequence of 1"):
        s.run({"x": [f32(1, 2)]})
    with pytest.raises(xrt.UnsupportedOperationError, match="exchanges tensors only"):
        xrt.InferenceSession(model([helper.make_node("Identity", ["xs"], ["ys"])], [("xs", seq_type())],
                                   [("ys", seq_type())], opset=16), engine="onnxruntime")
