"""InferenceSession with the element types numpy handles awkwardly: the unsigned 16/32/64-bit integers (fed and
returned as numpy arrays, initializers stored in each ONNX field, the optimized graph exported with their types)
and bfloat16 (numpy has none: fed as uint16 bits viewed as bfloat16, returned as xpuruntime Tensors)."""

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx", reason="the test models are built with the onnx package (python3-onnx)")
from onnx import TensorProto, helper  # noqa: E402

OPSET = 17


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _engines():
    engines = ["native"]
    try:
        xrt.InferenceSession(_cast_model(TensorProto.FLOAT, TensorProto.BFLOAT16), engine="onnxruntime")
        engines.append("onnxruntime")
    except xrt.UnsupportedOperationError:
        pass
    return engines


def _cast_model(from_type, to_type):
    return _model([helper.make_node("Cast", ["x"], ["y"], to=to_type)],
                  [helper.make_tensor_value_info("x", from_type, [None])],
                  [helper.make_tensor_value_info("y", to_type, [None])])


def bf16_bits_rne(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (NaN -> quiet NaN)."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


ENGINES = _engines()


@pytest.mark.parametrize("engine", ENGINES)
def test_bfloat16_outputs_come_back_as_tensors(engine):
    session = xrt.InferenceSession(_cast_model(TensorProto.FLOAT, TensorProto.BFLOAT16), engine=engine)
    assert session.get_outputs()[0].dtype == "bfloat16"
    x = np.array([0.47892547, 0.48033667, 1.0, -2.5, 3.0e38, np.nan, np.inf, -np.inf], dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    assert isinstance(y, xrt.Tensor) and y.dtype == "bfloat16" and y.shape == x.shape and y.device == "cpu"
    np.testing.assert_array_equal(y.view("uint16").numpy(), bf16_bits_rne(x))
    as_dict = session.run({"x": x})
    np.testing.assert_array_equal(as_dict["y"].view("uint16").numpy(), bf16_bits_rne(x))


@pytest.mark.parametrize("engine", ENGINES)
def test_bfloat16_inputs_are_fed_as_viewed_bits(engine):
    session = xrt.InferenceSession(_cast_model(TensorProto.BFLOAT16, TensorProto.FLOAT), engine=engine)
    assert session.get_inputs()[0].dtype == "bfloat16"
    bits = np.array([0x3F80, 0xC020, 0x7F80, 0x0001, 0x7FC0], dtype=np.uint16)
    (y,) = session.run(None, {"x": xrt.from_numpy(bits).view("bfloat16")})
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    expected = (bits.astype(np.uint32) << 16).view(np.float32)  # exact
    np.testing.assert_array_equal(y, expected)
    with pytest.raises(xrt.InvalidTypeError, match="bfloat16"):
        session.run(None, {"x": bits})  # raw uint16 is not bfloat16


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", ["uint32", "uint64"])
def test_unsigned_arithmetic_and_comparisons_use_unsigned_values(engine, dtype):
    elem = {"uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64}[dtype]
    nodes = [helper.make_node("Max", ["a", "b"], ["max"]), helper.make_node("Min", ["a", "b"], ["min"]),
             helper.make_node("Mod", ["a", "b"], ["mod"]), helper.make_node("Greater", ["a", "b"], ["gt"]),
             helper.make_node("Add", ["a", "b"], ["sum"])]
    info = [helper.make_tensor_value_info(n, elem, [4]) for n in ("a", "b")]
    outs = [helper.make_tensor_value_info(n, elem, [4]) for n in ("max", "min", "mod", "sum")]
    outs.insert(3, helper.make_tensor_value_info("gt", TensorProto.BOOL, [4]))
    session = xrt.InferenceSession(_model(nodes, info, outs), engine=engine)
    assert [i.dtype for i in session.get_inputs()] == [dtype, dtype]
    top = np.iinfo(dtype).max
    a = np.array([top, top // 2 + 1, 7, 0], dtype=dtype)  # the top half would be negative as signed
    b = np.array([3, 5, top, 1], dtype=dtype)
    got = session.run({"a": a, "b": b})
    with np.errstate(over="ignore"):
        expected = {"max": np.maximum(a, b), "min": np.minimum(a, b), "mod": a % b, "gt": a > b, "sum": a + b}
    for name, want in expected.items():
        assert got[name].dtype == want.dtype, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_unsigned_initializers_load_from_every_onnx_field_and_export(tmp_path):
    # make_tensor puts uint16 values in int32_data and uint32/uint64 values in uint64_data.
    c16 = helper.make_tensor("c16", TensorProto.UINT16, [2], [65535, 2])
    c32 = helper.make_tensor("c32", TensorProto.UINT32, [2], [4294967295, 3])
    c64 = helper.make_tensor("c64", TensorProto.UINT64, [2], [63, 2**64 - 1])
    assert len(c16.int32_data) == 2 and len(c32.uint64_data) == 2 and len(c64.uint64_data) == 2
    nodes = [helper.make_node("BitShift", ["x16", "c16"], ["y16"], direction="RIGHT"),
             helper.make_node("Add", ["x32", "c32"], ["y32"]),
             helper.make_node("BitShift", ["x64", "c64"], ["y64"], direction="LEFT")]
    ins = [helper.make_tensor_value_info(f"x{w}", e, [2]) for w, e in
           ((16, TensorProto.UINT16), (32, TensorProto.UINT32), (64, TensorProto.UINT64))]
    outs = [helper.make_tensor_value_info(f"y{w}", e, [2]) for w, e in
            ((16, TensorProto.UINT16), (32, TensorProto.UINT32), (64, TensorProto.UINT64))]
    model = _model(nodes, ins, outs, [c16, c32, c64])
    saved = tmp_path / "optimized.onnx"
    session = xrt.InferenceSession(model, engine="native", optimized_model_path=saved)
    feeds = {"x16": np.array([0x8000, 0x00F0], np.uint16), "x32": np.array([1, 4], np.uint32),
             "x64": np.array([1, 3], np.uint64)}
    got = session.run(feeds)
    np.testing.assert_array_equal(got["y16"], np.array([0, 0x003C], np.uint16))  # a shift by >= 16 gives 0
    np.testing.assert_array_equal(got["y32"], np.array([0, 7], np.uint32))  # wraps
    np.testing.assert_array_equal(got["y64"], np.array([2**63, 0], np.uint64))
    # The optimized graph keeps the unsigned types (TensorProto 4/12/13) and loads back.
    exported = onnx.load(str(saved))
    types = {i.name: i.data_type for i in exported.graph.initializer}
    assert types.get("c16") == TensorProto.UINT16 and types.get("c32") == TensorProto.UINT32
    assert types.get("c64") == TensorProto.UINT64
    again = xrt.InferenceSession(saved, engine="native").run(feeds)
    for name in got:
        np.testing.assert_array_equal(again[name], got[name])
