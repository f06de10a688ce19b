"""Models checked against the ONNX standard before anything runs on them (Note [Models checked against ONNX's schemas]
in src/cpp/frontends/onnx/onnx_validate.cpp), the arity every graph pass checks (Note [Patterns check arity]) and scalars
read from tensors (Note [Scalars read from tensors]): the crash roots and silent wrong answers of issue 39, each
reproduced with a model of two or three nodes."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import xpuruntime as xrt

from conftest import requires_ort

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
FEED = {"x": np.ones((2, 3, 4, 4), np.float32)}


def _model(nodes, inputs=(X,), outputs=(Y,), opset=17, ir=8, initializers=(), opsets=None) -> bytes:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model.SerializeToString()


def _session(model, engine="native", **kwargs):
    return xrt.InferenceSession(model, device="cpu", engine=engine, **kwargs)


ENGINES = ["native", pytest.param("onnxruntime", marks=requires_ort)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_matmul_with_one_input_before_a_softmax_is_a_typed_error(engine):
    # The attention-fusion pass read the MatMul's second input without checking it existed: a SIGSEGV.
    model = _model([helper.make_node("MatMul", ["x"], ["m"], name="mm"), helper.make_node("Softmax", ["m"], ["y"])])
    with pytest.raises(xrt.XpuRuntimeError) as info:
        _session(model, engine)
    assert str(info.value)
    if engine == "native":
        assert isinstance(info.value, xrt.InvalidArgumentError)
        assert "node 'mm' (MatMul, ai.onnx opset 13) has 1 input; MatMul takes 2" in str(info.value)


def _empty_limit_range() -> bytes:
    # Squeeze(Shape(x)[2:1]) is an empty int64 tensor: Range's limit has no element.
    return _model([
        helper.make_node("Shape", ["x"], ["s"], start=2, end=1),
        helper.make_node("Squeeze", ["s"], ["limit"]),
        helper.make_node("Constant", [], ["start"], value=helper.make_tensor("start", TensorProto.INT64, [], [0])),
        helper.make_node("Constant", [], ["delta"], value=helper.make_tensor("delta", TensorProto.INT64, [], [1])),
        helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="range"),
    ], outputs=[helper.make_tensor_value_info("y", TensorProto.INT64, None)])


def test_range_with_an_empty_limit_computed_from_shapes_is_a_typed_error():
    # Folded while the session was built (the limit comes from x's static shape), this was a SIGSEGV.
    with pytest.raises(xrt.InvalidArgumentError, match="input 'limit': expected a scalar \\(one element\\), got a "
                                                       "tensor of 0 elements"):
        _session(_empty_limit_range()).run(FEED)


@pytest.mark.parametrize("engine", ENGINES)
def test_range_with_an_empty_limit_fed_at_run_time_is_a_typed_error(engine):
    limit = helper.make_tensor_value_info("limit", TensorProto.INT64, ["n"])
    model = _model([helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="range")], inputs=[limit],
                   outputs=[helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                   initializers=[helper.make_tensor("start", TensorProto.INT64, [], [0]),
                                 helper.make_tensor("delta", TensorProto.INT64, [], [1])])
    sess = _session(model, engine)
    # Before: an out-of-bounds heap read that returned 120,064 elements of garbage.
    with pytest.raises(xrt.XpuRuntimeError, match="limit"):
        sess.run({"limit": np.zeros((0,), np.int64)})
    # The session runs on afterwards; a one-element limit of rank 1 is a scalar too.
    np.testing.assert_array_equal(sess.run({"limit": np.array([5], np.int64)})["y"], np.arange(5))


def test_range_counts_int64_elements_exactly():
    # The element count came from doubles, which round past 2^53: Range(2^60 + 1, 2^60 + 4) had no elements.
    start = (1 << 60) + 1
    values = [helper.make_tensor_value_info(n, TensorProto.INT64, []) for n in ("a", "b", "d")]
    model = _model([helper.make_node("Range", ["a", "b", "d"], ["y"])], inputs=values,
                   outputs=[helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    out = _session(model).run({"a": np.array(start, np.int64), "b": np.array(start + 3, np.int64),
                               "d": np.array(1, np.int64)})["y"]
    assert out.tolist() == [start, start + 1, start + 2]
    out = _session(model).run({"a": np.array(10, np.int64), "b": np.array(-(1 << 62), np.int64),
                               "d": np.array(-(1 << 61), np.int64)})["y"]
    assert out.tolist() == [10, 10 - (1 << 61), 10 - (2 << 61)]


@pytest.mark.parametrize("field,value", [("opset", 999), ("ir", 999)])
def test_an_opset_or_ir_version_newer_than_known_is_refused_unless_the_policy_allows_it(field, value):
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], **{field: value})
    expected = "opset 999, newer than the newest xpuruntime knows" if field == "opset" else \
        "IR version 999 is newer than the newest xpuruntime knows"
    with pytest.raises(xrt.UnsupportedOperationError, match=expected) as info:
        _session(model)
    assert "allow_newer_opsets" in str(info.value)
    if field == "opset":
        assert "node 'relu' (Relu)" in str(info.value)
    policy = xrt.ExecutionPolicy(allow_newer_opsets=True)
    out = _session(model, exec_policy=policy).run(FEED)["y"]
    np.testing.assert_array_equal(out, FEED["x"])


def test_allow_newer_opsets_is_serialized_only_when_set():
    default = xrt.ExecutionPolicy()
    assert "allow_newer_opsets" not in default.to_json()
    allowed = xrt.ExecutionPolicy(allow_newer_opsets=True)
    assert '"allow_newer_opsets": true' in allowed.to_json()
    assert xrt.ExecutionPolicy.from_json(allowed.to_json()).allow_newer_opsets
    assert allowed.fingerprint != default.fingerprint
    with pytest.raises(xrt.InvalidArgumentError, match="must be True or False"):
        xrt.ExecutionPolicy(allow_newer_opsets="yes")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_op_type_that_is_not_utf8_gives_a_message(engine):
    model = _model([helper.make_node("ReXlu", ["x"], ["y"])]).replace(b"ReXlu", b"Re\xfflu")
    with pytest.raises(xrt.XpuRuntimeError) as info:
        _session(model, engine)
    assert str(info.value)  # was empty: Python could not decode the message
    if engine == "native":
        assert "Re\\xfflu" in str(info.value)


def _cast(**attrs):
    return helper.make_node("Cast", ["x"], ["y"], name="cast", **attrs)


@pytest.mark.parametrize("nodes,opset,error,message", [
    ([helper.make_node("Relu", ["x"], ["y"], name="r", alpha=1.0)], 17, xrt.InvalidArgumentError,
     "node 'r' \\(Relu, ai.onnx opset 14\\) has an attribute 'alpha', which Relu does not take"),
    ([_cast(to=1.5)], 17, xrt.InvalidTypeError, "attribute 'to' of node 'cast' \\(Cast.* must be an int, got a float"),
    ([_cast()], 17, xrt.InvalidArgumentError, "is missing its required attribute 'to' \\(an int\\)"),
    ([helper.make_node("LayerNormalization", ["x", "x"], ["y"], name="ln")], 13, xrt.InvalidArgumentError,
     "node 'ln' \\(LayerNormalization\\) needs ai.onnx opset 17 or newer; the model imports opset 13"),
    ([helper.make_node("NoSuchOp", ["x"], ["y"], name="n")], 17, xrt.InvalidArgumentError,
     "ai.onnx has no operator 'NoSuchOp'"),
    ([helper.make_node("Conv", ["x", ""], ["y"], name="c")], 17, xrt.InvalidArgumentError,
     "input 1 \\('W'\\) is required but has no name"),
    ([helper.make_node("Relu", ["x"], ["y", "z"], name="r")], 17, xrt.InvalidArgumentError,
     "has 2 outputs; Relu takes 1"),
    ([helper.make_node("Relu", ["x", "x"], ["y"], name="r")], 17, xrt.InvalidArgumentError,
     "has 2 inputs; Relu takes 1"),
])
def test_nodes_that_break_their_schema_are_refused_when_read(nodes, opset, error, message):
    with pytest.raises(error, match=message):
        _session(_model(nodes, opset=opset))


def test_a_bad_node_inside_a_loop_body_is_refused():
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("MatMul", ["v"], ["v_out"], name="bad")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []), cond,
                 helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)])
    loop = helper.make_node("Loop", ["n", "c", "x"], ["y"], body=body)
    model = _model([loop], initializers=[helper.make_tensor("n", TensorProto.INT64, [], [2]),
                                         helper.make_tensor("c", TensorProto.BOOL, [], [True])])
    with pytest.raises(xrt.InvalidArgumentError, match="node 'bad' \\(MatMul, ai.onnx opset 13\\) has 1 input"):
        _session(model)


def test_a_domain_imported_twice_is_refused():
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   opsets=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx", 13)])
    with pytest.raises(xrt.InvalidArgumentError, match="lists the domain ai.onnx twice"):
        _session(model)


def test_error_messages_escape_bytes_that_are_not_utf8():
    # Note [Printable messages]: every error message is valid UTF-8 and never empty.
    x = helper.make_tensor_value_info("x\xff", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Relu", ["missing"], ["y"])], inputs=[x])
    model = model.replace("x\xff".encode(), b"x\xff")
    with pytest.raises(xrt.XpuRuntimeError) as info:
        _session(model)
    assert str(info.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_model_path_that_is_a_fifo_or_a_directory_is_a_typed_error(tmp_path, engine):
    # Opening a FIFO for reading blocks until a writer comes: session creation hung forever.
    import os
    import threading
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    errors = []

    def create():
        try:
            _session(str(fifo), engine)
        except xrt.XpuRuntimeError as e:
            errors.append(e)

    thread = threading.Thread(target=create, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # release the blocked open so that the suite goes on, then fail
        with open(fifo, "wb"):
            pass
        thread.join(10)
        pytest.fail("session creation blocked on a FIFO named as the model")
    assert len(errors) == 1 and "is a FIFO, not a regular file" in str(errors[0])
    with pytest.raises(xrt.InvalidArgumentError, match="is a directory, not a regular file"):
        _session(str(tmp_path), engine)


def _typed(name, elem, shape=(2, 2)):
    return helper.make_tensor_value_info(name, elem, list(shape))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("nodes,inputs,message", [
    # Two inputs of one type variable with different types (MatMul's T).
    ([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
     [_typed("a", TensorProto.FLOAT), _typed("b", TensorProto.FLOAT16)],
     "input 1 \\('B'\\) of node 'mm' \\(MatMul, ai.onnx opset 13\\) is tensor\\(float16\\) but input 0 is "
     "tensor\\(float\\); both are MatMul's T, one type"),
    # An index input of a float type (Slice's Tind).
    ([helper.make_node("Slice", ["a", "s", "e"], ["y"], name="sl")],
     [_typed("a", TensorProto.FLOAT), _typed("s", TensorProto.FLOAT, [1]), _typed("e", TensorProto.INT64, [1])],
     "input 1 \\('starts'\\) of node 'sl' \\(Slice, ai.onnx opset 13\\) is 's' of type tensor\\(float\\); "
     "Slice's Tind takes tensor\\(int32\\), tensor\\(int64\\)"),
    # A fixed type (Reshape's shape is int64).
    ([helper.make_node("Reshape", ["a", "s"], ["y"], name="r")],
     [_typed("a", TensorProto.FLOAT), _typed("s", TensorProto.INT32, [2])],
     "input 1 \\('shape'\\) of node 'r' \\(Reshape, ai.onnx opset 14\\) is 's' of type tensor\\(int32\\); it must be "
     "tensor\\(int64\\)"),
])
def test_inputs_of_the_wrong_type_are_refused_when_read(engine, nodes, inputs, message):
    with pytest.raises(xrt.InvalidTypeError, match=message):
        _session(_model(nodes, inputs=inputs), engine)


def test_types_are_checked_only_where_the_model_states_them():
    # An intermediate value without value_info has no stated type: the node is left to the engine's own inference.
    nodes = [helper.make_node("Cast", ["a"], ["c"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT)]
    out = _session(_model(nodes, inputs=[_typed("a", TensorProto.FLOAT)])).run({"a": np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(out["y"], np.ones((2, 2), np.float32))


@requires_ort
def test_the_onnxruntime_engine_checks_the_schemas_before_onnx_runtime_reads_the_model():
    # ONNX Runtime 1.29 aborted the process (an assertion in its own code) on a fuzzed GPT-2 export whose Tanh carries
    # an INTS attribute Tanh does not take; the engine now refuses such a model first, as the native engine does.
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "model",
                        "regression-ort-tanh-with-an-attribute-it-does-not-take.onnx")
    for engine in ("onnxruntime", "native"):
        with pytest.raises(xrt.InvalidArgumentError, match="'node_tanh_1' \\(Tanh, ai.onnx opset 13\\) has an "
                                                           "attribute 'group', which Tanh does not take"):
            _session(path, engine)


def test_a_loop_trip_count_of_int64_max_is_read_exactly():
    # Note [Scalars read from tensors]: M went through a double, and INT64_MAX rounded to 2^63, whose conversion back
    # to int64 is undefined (UBSan, found by CI's structural fuzzing; on x86 it gave INT64_MIN, and the Loop ran no
    # iteration at all). The body counts to 3 and then ends the loop through its condition.
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    acc = helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1])
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "one"], ["acc_out"]),
         helper.make_node("Less", ["i", "two"], ["cond_out"])],
        "body", [i, cond, acc],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1])],
        initializer=[helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
                     helper.make_tensor("two", TensorProto.INT64, [], [2])])
    loop = helper.make_node("Loop", ["m", "c", "start"], ["y"], body=body)
    model = _model([loop], inputs=[], outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                   initializers=[helper.make_tensor("m", TensorProto.INT64, [], [(1 << 63) - 1]),
                                 helper.make_tensor("c", TensorProto.BOOL, [], [True]),
                                 helper.make_tensor("start", TensorProto.FLOAT, [1], [0.0])])
    np.testing.assert_array_equal(_session(model).run({})["y"], [3.0])
    # A trip count of another type is refused when the model is read (Loop's M is tensor(int64)).
    model = _model([loop], inputs=[], outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                   initializers=[helper.make_tensor("m", TensorProto.FLOAT, [], [1e30]),
                                 helper.make_tensor("c", TensorProto.BOOL, [], [True]),
                                 helper.make_tensor("start", TensorProto.FLOAT, [1], [0.0])])
    with pytest.raises(xrt.InvalidTypeError, match="input 0 \\('M'\\) of .*Loop.* is 'm' of type tensor\\(float\\)"):
        _session(model)
