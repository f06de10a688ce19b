"""Bad and hostile model files (issue: reliability): declared sizes are checked against the file before anything is
allocated, and external data never leaves the model's folder (Note [External data stays inside the model's folder]
in src/cpp/frontends/onnx/onnx_check.cpp, Note [Sizes checked before allocation] in
src/cpp/engines/native/import/onnx_import.cpp). Each gives a typed error."""

import os
import stat
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import xpuruntime as xrt
from conftest import requires_ort

# The external-data checks hold for both engines: the onnxruntime engine runs the native engine's checks before
# ONNX Runtime reads a file (Note [External data through ORT] in src/cpp/engines/onnxruntime/ort_engine.cpp).
ENGINES = ("native", pytest.param("onnxruntime", marks=requires_ort))


def _model(initializer: TensorProto) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["x", initializer.name], ["y"])], "g", [x], [y],
                              initializer=[initializer])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _external(name: str, location: str, offset=None, length=None, dims=(2,)) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
    return t


def _write(folder, name, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_external_data_inside_the_folder_loads(tmp_path):
    _write(tmp_path, "w.bin", np.array([1.0, 2.0], np.float32).tobytes())
    path = _write(tmp_path, "m.onnx", _model(_external("w", "w.bin")))
    out = xrt.InferenceSession(path, engine="native").run({"x": np.zeros(2, np.float32)})["y"]
    np.testing.assert_array_equal(out, [1.0, 2.0])
    # Bytes read files only from a folder the caller names.
    model = open(path, "rb").read()
    with pytest.raises(xrt.InvalidArgumentError, match="given as bytes with no folder"):
        xrt.InferenceSession(model, engine="native")
    out = xrt.InferenceSession(model, engine="native", external_data_dir=tmp_path).run({"x": np.zeros(2, np.float32)})
    np.testing.assert_array_equal(out["y"], [1.0, 2.0])


@requires_ort
def test_external_data_on_the_onnxruntime_engine(tmp_path, monkeypatch):
    """The onnxruntime engine reads external data from the model's folder (it got the bytes without the folder and
    looked in the working directory): by path, by a relative path from the model's folder, and as bytes with
    external_data_dir=; the outputs equal the native engine's."""
    weights = np.array([1.5, -2.0], np.float32)
    _write(tmp_path, "w.bin", weights.tobytes())
    path = _write(tmp_path, "m.onnx", _model(_external("w", "w.bin")))
    model = open(path, "rb").read()
    x = np.array([0.25, 4.0], np.float32)
    expected = xrt.InferenceSession(path, engine="native").run({"x": x})["y"]
    np.testing.assert_array_equal(expected, x + weights)
    runs = {"by path": lambda: xrt.InferenceSession(path, engine="onnxruntime"),
            "bytes + external_data_dir": lambda: xrt.InferenceSession(model, engine="onnxruntime",
                                                                       external_data_dir=tmp_path)}
    for way, make in runs.items():
        np.testing.assert_array_equal(make().run({"x": x})["y"], expected, err_msg=way)
    monkeypatch.chdir(tmp_path)  # a relative path: its folder is "."
    np.testing.assert_array_equal(xrt.InferenceSession("m.onnx", engine="onnxruntime").run({"x": x})["y"], expected)
    # ORT does not look in the working directory for a model given as bytes: refused as the native engine refuses it.
    with pytest.raises(xrt.InvalidArgumentError, match="given as bytes with no folder"):
        xrt.InferenceSession(model, engine="onnxruntime")
    # xpuruntime.onnxruntime's session config entry names the folder too.
    import xpuruntime.onnxruntime as ort
    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(tmp_path))
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("location,match", [
    ("/etc/passwd", "absolute path"),
    ("../outside.bin", r"leaves the model's folder \('..'\)"),
    ("sub/../../outside.bin", r"leaves the model's folder"),
    ("link.bin", "outside the model's folder"),
    ("zero", r"resolves to '/dev/zero', outside the model's folder"),
])
def test_external_data_that_leaves_the_folder_is_refused(tmp_path, location, match, engine):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "sub").mkdir()
    outside = _write(tmp_path, "outside.bin", np.ones(2, np.float32).tobytes())
    os.symlink(outside, folder / "link.bin")
    os.symlink("/dev/zero", folder / "zero")  # a character device through a link: outside the folder
    path = _write(folder, "m.onnx", _model(_external("w", location)))
    with pytest.raises(xrt.InvalidArgumentError, match=match):
        xrt.InferenceSession(path, engine=engine)


def _create_within(seconds, make, fifo=None):
    """make() in a thread, joined for `seconds`: its result or exception. A make() still blocked then (opening a FIFO
    waits for a writer) fails the test instead of hanging the suite; opening the FIFO for writing releases it."""
    outcome = {}

    def target():
        try:
            outcome["value"] = make()
        except BaseException as error:  # noqa: B036 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the blocked reader is there: this opens, and releases it
            os.close(fd)
            thread.join(seconds)
        pytest.fail(f"session creation still blocked after {seconds} s")
    return outcome


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", ["fifo", "directory", "fifo via an in-folder link"])
def test_external_data_must_be_a_regular_file(tmp_path, kind, engine):
    """Only regular files are read (Note [External data files are opened, not followed]): a FIFO named as external
    data blocked session creation forever (an open for reading waits for a writer); now it, a directory, and a
    link inside the folder to a FIFO are typed errors naming the tensor, the file and what it is, at once."""
    target = tmp_path / ("w.dir" if kind == "directory" else "w.fifo")
    if kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(target)
    location = target.name
    if kind == "fifo via an in-folder link":
        os.symlink(target.name, tmp_path / "w.bin")
        location = "w.bin"
    path = _write(tmp_path, "m.onnx", _model(_external("w", location)))
    outcome = _create_within(10, lambda: xrt.InferenceSession(path, engine=engine),
                             fifo=None if kind == "directory" else target)
    error = outcome.get("error")
    assert isinstance(error, xrt.InvalidArgumentError), outcome
    what = "a directory" if kind == "directory" else "a FIFO"
    assert f"tensor 'w': external data file '{target}' is {what}, not a regular file" in str(error)
    assert stat.S_ISDIR(os.stat(target).st_mode) if kind == "directory" else stat.S_ISFIFO(os.stat(target).st_mode)


@pytest.mark.parametrize("engine", ENGINES)
def test_external_data_of_an_attribute_tensor_in_a_subgraph_is_checked(tmp_path, engine):
    """Every tensor with external data is checked, not only top-level initializers: here a Constant's value inside an
    If branch names a FIFO (the onnxruntime engine's check walks attributes and subgraphs: check_external_data)."""
    os.mkfifo(tmp_path / "c.fifo")
    value = _external("c", "c.fifo")
    branch = helper.make_graph([helper.make_node("Constant", [], ["c"], value=value)], "then", [],
                               [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "s"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = _write(tmp_path, "m.onnx", model.SerializeToString())
    outcome = _create_within(10, lambda: xrt.InferenceSession(path, engine=engine), fifo=tmp_path / "c.fifo")
    assert isinstance(outcome.get("error"), xrt.InvalidArgumentError), outcome
    assert "tensor 'c': external data file" in str(outcome["error"]) and "is a FIFO" in str(outcome["error"])


@pytest.mark.parametrize("engine", ENGINES)
def test_external_data_through_a_link_inside_the_folder(tmp_path, engine):
    """A symbolic link inside the folder to a regular file inside it is resolved and read (as ONNX Runtime does);
    what is opened is the resolved file, with no link followed on the way (Note [External data files are opened, not
    followed])."""
    (tmp_path / "weights").mkdir()
    _write(tmp_path / "weights", "w.bin", np.array([3.0, 4.0], np.float32).tobytes())
    os.symlink("weights/w.bin", tmp_path / "w.bin")
    os.symlink("weights", tmp_path / "data")
    for location in ("w.bin", "data/w.bin"):
        path = _write(tmp_path, "m.onnx", _model(_external("w", location)))
        out = xrt.InferenceSession(path, engine=engine).run({"x": np.ones(2, np.float32)})["y"]
        np.testing.assert_array_equal(out, [4.0, 5.0])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("offset,length,match", [
    (0, 16, "length 16 does not match the tensor's 8 bytes"),
    (4, 8, r"outside the file"),
    (2 ** 62, 8, r"outside the file"),
    (0, None, r"external data of 8 bytes at offset 0 is outside the file '.*w.bin' \(6 bytes\)"),  # a short file
    ("-1", 8, "offset '-1' is not a non-negative integer"),
    (0, "8x", "length '8x' is not a non-negative integer"),
])
def test_external_offsets_and_lengths_are_checked(tmp_path, offset, length, match, engine):
    data = np.ones(2, np.float32).tobytes()
    _write(tmp_path, "w.bin", data[:6] if length is None else data)
    path = _write(tmp_path, "m.onnx", _model(_external("w", "w.bin", offset, length)))
    with pytest.raises(xrt.InvalidArgumentError, match=match):
        xrt.InferenceSession(path, engine=engine)


def test_huge_declared_initializers_are_refused_before_allocation(tmp_path):
    # 10^12 float32 elements with 8 bytes of data: a typed error, not a 4 TB allocation.
    t = numpy_helper.from_array(np.ones(2, np.float32), "w")
    del t.dims[:]
    t.dims.extend([10 ** 6, 10 ** 6])
    with pytest.raises(xrt.InvalidArgumentError, match="raw_data has 8 bytes but its shape and type need"):
        xrt.InferenceSession(_model(t), engine="native")
    # The same through typed data fields.
    t = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    del t.dims[:]
    t.dims.extend([10 ** 6, 10 ** 6])
    with pytest.raises(xrt.InvalidArgumentError, match="holds 2 values but its shape needs 1000000000000"):
        xrt.InferenceSession(_model(t), engine="native")
    # A shape whose byte size overflows int64.
    t = numpy_helper.from_array(np.ones(2, np.float32), "w")
    del t.dims[:]
    t.dims.extend([2 ** 31, 2 ** 31, 4])
    with pytest.raises(xrt.InvalidArgumentError, match="byte size overflows int64"):
        xrt.InferenceSession(_model(t), engine="native")
    # External data declaring more than the file holds.
    _write(tmp_path, "w.bin", np.ones(2, np.float32).tobytes())
    path = _write(tmp_path, "m.onnx", _model(_external("w", "w.bin", dims=(10 ** 6, 10 ** 6))))
    with pytest.raises(xrt.InvalidArgumentError, match="outside the file"):
        xrt.InferenceSession(path, engine="native")


def test_a_node_missing_a_required_input_is_a_typed_error():
    # Found by fuzz_model (tests/fuzz/corpus/model/regression-conv-missing-input.onnx): a Conv without its weight made
    # shape inference read past the node's inputs (a heap-buffer-overflow under AddressSanitizer).
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Conv", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(xrt.XpuRuntimeError):
        sess = xrt.InferenceSession(model.SerializeToString(), engine="native")
        sess.run({"x": np.ones((1, 1, 4, 4), np.float32)})
    regression = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "model",
                              "regression-conv-missing-input.onnx")
    try:
        xrt.InferenceSession(regression, engine="native")
    except xrt.XpuRuntimeError:
        pass  # a typed error is what this input must give; anything else (a crash) fails the test run


def test_memory_limit_caps_constant_folding():
    """ExecutionPolicy.memory_limit bounds what folding may allocate: an 8 MiB ConstantOfShape is folded without a
    limit and under a 16 MiB one, and left a node under a 4 MiB one (the pass says why), where running it needs more
    than the limit too: the run raises OutOfMemoryError naming the node (Note [Run memory budgets])."""
    nodes = [
        helper.make_node("Constant", [], ["shape"],
                         value=helper.make_tensor("s", TensorProto.INT64, [2], [1024, 2048])),
        helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill",
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
        helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
        helper.make_node("Add", ["x", "total"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    x = np.arange(3, dtype=np.float32)
    free = xrt.InferenceSession(model, engine="native")
    roomy = xrt.InferenceSession(model, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit="16MiB"))
    capped = xrt.InferenceSession(model, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit="4MiB"))
    for session in (free, roomy):
        np.testing.assert_allclose(session.run(None, {"x": x})[0], x + 0.5 * 1024 * 2048)
        ran = {n["op_type"] for n in session.explain().nodes}
        assert "ConstantOfShape" not in ran and "ReduceSum" not in ran  # folded into one constant
    assert "ConstantOfShape" in {n["op_type"] for n in capped.explain().nodes}  # 8 MiB > the limit: left to run
    with pytest.raises(xrt.OutOfMemoryError,
                       match=r"node 'fill' \(ConstantOfShape.*8\.00 MiB.*memory_limit = 4\.00 MiB"):
        capped.run(None, {"x": x})


def _loop_of_rows_model() -> bytes:
    """y = sum over `trips` iterations of a Loop whose scan output stacks one 16 KiB row (x + x) per iteration: a
    value whose size only the run knows (the reference library runs the Loop)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["x", "x"], ["row"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [4096])])
    nodes = [helper.make_node("Loop", ["trips", ""], ["rows"], name="repeat", body=body),
             helper.make_node("ReduceSum", ["rows"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096]),
                                              helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_memory_limit_caps_what_a_run_allocates():
    """What a run allocates beyond its plan (here a Loop's rows, known only as it runs) is charged to what the plan
    leaves of ExecutionPolicy.memory_limit (Note [Run memory budgets]): 16384 rows (256 MiB) under a 64 MiB limit
    raise OutOfMemoryError naming the node, the refused runs keep nothing, and the same session then runs loops that
    fit, also from several threads at once (each run has its own budget)."""
    model = _loop_of_rows_model()
    x = np.full(4096, 0.5, dtype=np.float32)
    session = xrt.InferenceSession(model, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit="64MiB"))
    session.run(None, {"x": x, "trips": np.array(1, np.int64)})  # the executor's arena exists from the first run
    before = xrt.runtime.memory_stats("cpu")["allocated_bytes.current"]
    for _ in range(3):
        with pytest.raises(xrt.OutOfMemoryError, match=r"node 'repeat' \(Loop, kernel onnx reference\).*"
                                                       r"memory_limit = 64\.00 MiB"):
            session.run(None, {"x": x, "trips": np.array(1 << 14, np.int64)})
    assert xrt.runtime.memory_stats("cpu")["allocated_bytes.current"] <= before  # the refused runs kept nothing
    for trips in (0, 1, 7, 1000):  # 1000 rows: 16 MiB (twice that while they are stacked)
        np.testing.assert_allclose(session.run(None, {"x": x, "trips": np.array(trips, np.int64)})[0], 4096.0 * trips)
    from concurrent.futures import ThreadPoolExecutor
    trips = [3, 1000, 5, 900] * 4
    with ThreadPoolExecutor(4) as pool:
        sums = list(pool.map(lambda t: session.run(None, {"x": x, "trips": np.array(t, np.int64)})[0], trips))
    np.testing.assert_allclose(sums, [4096.0 * t for t in trips])
    unlimited = xrt.InferenceSession(model, engine="native")
    np.testing.assert_allclose(unlimited.run(None, {"x": x, "trips": np.array(1 << 14, np.int64)})[0],
                               4096.0 * (1 << 14))


def _single_node_model(node, x_shape, y_shape, initializer=()) -> bytes:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              initializer=list(initializer))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("kind", ["cpu kernel", "onnx reference"])
def test_memory_limit_covers_the_scratch_kernels_take(kind):
    """Scratch memory a kernel takes beyond its inputs and outputs is charged to ExecutionPolicy.memory_limit
    (Note [Scratch memory under the budget]): the cpu kernel's padded input planes and flat output of a 3x3 Conv
    (Note [Convolution as a GEMM over windows]: about 2 MiB for 1 MiB in and out) and the reference library's buffers
    for a DFT of 2^17 points. Under a limit the plan fits but the scratch
    does not, the run is an OutOfMemoryError naming the node and keeps nothing; with room, the same answer as
    without a limit."""
    rng = np.random.default_rng(3)
    if kind == "cpu kernel":
        w = numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), "w")
        model = _single_node_model(helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
                                   [1, 64, 64, 64], [1, 64, 64, 64], [w])
        x = rng.standard_normal((1, 64, 64, 64)).astype(np.float32)
        tight, error = "3MiB", r"node 'conv' \(xpuruntime:FusedConv, kernel cpu\).*allocating 1\.\d\d MiB"
    else:
        model = _single_node_model(helper.make_node("DFT", ["x"], ["y"], name="dft"), [1, 1 << 17, 1],
                                   [1, 1 << 17, 2])
        x = rng.standard_normal((1, 1 << 17, 1)).astype(np.float32)
        tight, error = "4MiB", r"node 'dft' \(DFT, kernel onnx reference\)"
    expected = xrt.InferenceSession(model, engine="native").run(None, {"x": x})[0]
    capped = xrt.InferenceSession(model, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit=tight))
    with pytest.raises(xrt.OutOfMemoryError, match=error + r".*memory_limit = " + tight[:-3]):
        capped.run(None, {"x": x})
    before = xrt.runtime.memory_stats("cpu")["allocated_bytes.current"]
    with pytest.raises(xrt.OutOfMemoryError):
        capped.run(None, {"x": x})
    assert xrt.runtime.memory_stats("cpu")["allocated_bytes.current"] <= before  # the refused run kept nothing
    roomy = xrt.InferenceSession(model, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit="32MiB"))
    np.testing.assert_array_equal(roomy.run(None, {"x": x})[0], expected)


def test_memory_limit_caps_plans_of_data_dependent_shapes():
    """An Expand to a shape computed from float data ends the plan (Note [Segmented plans]); the next segment, planned
    for the shape the run found, is held to ExecutionPolicy.memory_limit like any plan."""
    nodes = [helper.make_node("Cast", ["rows"], ["rows_i"], to=TensorProto.INT64),
             helper.make_node("Constant", [], ["four"], value=helper.make_tensor("f", TensorProto.INT64, [1], [4])),
             helper.make_node("Concat", ["rows_i", "four"], ["shape"], axis=0),
             helper.make_node("Expand", ["x", "shape"], ["wide"], name="widen"),
             helper.make_node("ReduceSum", ["wide"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "expand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                                helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    session = xrt.InferenceSession(model, engine="native", exec_policy=xrt.ExecutionPolicy(memory_limit="64MiB"))
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    with pytest.raises(xrt.OutOfMemoryError,
                       match=r"needs 256 MiB.*more than ExecutionPolicy.memory_limit = 64\.00 MiB"):
        session.run(None, {"x": x, "rows": np.array([1 << 24], np.float32)})
    np.testing.assert_allclose(session.run(None, {"x": x, "rows": np.array([7], np.float32)})[0], 42.0)


def test_a_loop_reading_an_undefined_outer_name_is_not_segmented():
    # Found by fuzz_model (tests/fuzz/corpus/model/regression-loop-undefined-outer-name.onnx): a Loop whose body reads a
    # name nothing defines has shapes known only at run time and no node that can end a segment; splitting the plan
    # there read the type of the undefined name (a null dereference). It is not segmented now; the run reports it.
    regression = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "model",
                              "regression-loop-undefined-outer-name.onnx")
    try:
        sess = xrt.InferenceSession(regression, engine="native")
        sess.run({i.name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in i.shape],
                                   {"float32": np.float32, "int64": np.int64, "bool": np.bool_}.get(i.type, np.float32))
                  for i in sess.get_inputs()})
    except xrt.XpuRuntimeError:
        pass  # a typed error is what this input must give; anything else (a crash) fails the test run


@pytest.mark.parametrize("regression", [
    # Found by fuzz_model in CI: a chain of view ops over a value with a 0-sized dim reached refine() (Note [View
    # chains that are reshapes]), which divided a size by that 0: SIGFPE at session creation.
    "regression-view-chain-from-an-empty-source.onnx",
    # Found by fuzz_model_structure: a Reshape of an empty value read through a Transpose reached refine() with a 0
    # among the runs it merges (UBSan: division by zero).
    "regression-empty-tensor-through-view-chain.onnx",
])
def test_a_view_chain_over_an_empty_value_is_not_divided_by_zero(regression):
    # Such chains are left as they are now (tests/fuzz/corpus/model/<regression>).
    path = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "model", regression)
    try:
        sess = xrt.InferenceSession(path, engine="native")
        sess.run({i.name: np.zeros([d if isinstance(d, int) and d >= 0 else 1 for d in i.shape],
                                   {"float32": np.float32, "int64": np.int64, "bool": np.bool_}.get(i.type, np.float32))
                  for i in sess.get_inputs()})
    except xrt.XpuRuntimeError:
        pass  # a typed error is what this input may give; anything else (a crash) fails the test run


@pytest.mark.parametrize("op, inputs, constant", [
    ("CumSum", ["x", "c"], np.array(np.iinfo(np.int64).max, np.int64)),
    ("CumSum", ["x", "c"], np.array(np.iinfo(np.int64).min, np.int64)),
    ("Trilu", ["x", "c"], np.array(np.iinfo(np.int64).max, np.int64)),
])
def test_integer_constants_past_a_double_are_read_exactly(op, inputs, constant):
    # Found by fuzz_model_structure: CumSum's axis of 2^63 - 1 was read through a double and cast back to int64
    # (UBSan: outside the range of representable values). Such scalars are read as integers now: the axis is
    # refused as an axis, Trilu's k keeps nothing (or everything), as the reference library has it.
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(constant, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    try:
        y = np.asarray(xrt.InferenceSession(model, engine="native").run({"x": x})["y"])
    except xrt.XpuRuntimeError as e:
        assert op == "CumSum", e  # an axis out of range is a typed error
        return
    assert op == "Trilu"
    np.testing.assert_array_equal(y, np.triu(x, int(constant)))


def test_a_concat_of_a_0d_tensor_is_a_typed_error():
    # Found by fuzz_model's campaign (tests/fuzz/corpus/model/regression-concat-of-a-0d-input.onnx): a Concat whose
    # input has no declared shape, fed a 0-d tensor, indexed that tensor's empty shape (UBSan: reference binding to
    # null). The reference library now says Concat needs rank 1 or more.
    regression = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "model",
                              "regression-concat-of-a-0d-input.onnx")
    sess = xrt.InferenceSession(regression, engine="native")
    for _ in range(2):  # the same typed error each time: nothing left half-done
        with pytest.raises(xrt.XpuRuntimeError, match="0-d; Concat takes tensors of rank 1 or more"):
            sess.run({"data": np.zeros((), np.int16), "indices": np.zeros((3,), np.int64)})


def test_a_cast_whose_to_is_not_an_int_is_a_typed_error():
    # Found by fuzz_model's campaign (tests/fuzz/corpus/model/regression-cast-to-a-graph-attribute.onnx): a Cast whose
    # 'to' attribute is a graph passed the "is 'to' there" check (which looks in every attribute map) and then read the
    # int map with map::at: an untyped std::out_of_range escaped the run. The importer now checks attribute types
    # against ONNX's schemas (Note [Models checked against ONNX's schemas]): the model is refused when it is read.
    regression = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "model",
                              "regression-cast-to-a-graph-attribute.onnx")
    for _ in range(2):
        with pytest.raises(xrt.InvalidTypeError, match="attribute 'to' of .*Cast.* must be an int, got a graph"):
            xrt.InferenceSession(regression, engine="native")
    body = helper.make_graph([], "b", [], [])
    for to in (helper.make_attribute("to", body), helper.make_attribute("to", helper.make_tensor("t", 1, [], [1.0]))):
        node = helper.make_node("Cast", ["x"], ["y"], name="cast")
        node.attribute.append(to)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        with pytest.raises(xrt.InvalidTypeError, match="attribute 'to' of node 'cast' \\(Cast.* must be an int"):
            xrt.InferenceSession(model.SerializeToString(), engine="native")


def _conv_reference(x, w, strides, pads):
    """Direct 2-D convolution (no dilation, one group) of x [N, C, H, W] by w [O, C, kh, kw]."""
    n, _, height, width = x.shape
    o, _, kh, kw = w.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out_h = (height + pads[0] + pads[2] - kh) // strides[0] + 1
    out_w = (width + pads[1] + pads[3] - kw) // strides[1] + 1
    y = np.zeros((n, o, out_h, out_w), np.float32)
    for i in range(out_h):
        for j in range(out_w):
            window = padded[:, :, i * strides[0]:i * strides[0] + kh, j * strides[1]:j * strides[1] + kw]
            y[:, :, i, j] = np.einsum("nchw,ochw->no", window, w)
    return y


@pytest.mark.parametrize("strides", [[2, (1 << 63) - 1], [(1 << 63) - 1, 3], [(1 << 62) + 1, (1 << 63) - 1]])
def test_a_conv_stride_past_the_input_gives_one_window(strides):
    # Found by fuzz_model_structure's campaign (seed 1 under UBSan): a Conv whose stride is int64's largest value has
    # one output along that axis, and the cpu kernel's phase-split plane rounded extent + stride - 1 up past int64.
    # Along such an axis the plane now has one phase per padded position (phase_geometry in cpu_common.h).
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    pads = [1, 1, 1, 1]
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=strides, pads=pads, kernel_shape=[3, 3])
    expected = _conv_reference(x, w, [min(s, 64) for s in strides], pads)
    model = _single_node_model(node, x.shape, expected.shape, [numpy_helper.from_array(w, "w")])
    got = xrt.InferenceSession(model, engine="native").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op, attrs", [
    ("Conv", {"dilations": [1, 1 << 62], "kernel_shape": [3, 3]}),
    ("Conv", {"pads": [0, (1 << 63) - 2, 0, 8], "kernel_shape": [3, 3]}),
    ("MaxPool", {"dilations": [1 << 62, 1], "kernel_shape": [3, 3]}),
])
def test_window_geometry_past_int64_is_a_typed_error(op, attrs):
    # Window sizes, pads and dilations whose sums or products leave int64 are a malformed model: a typed error when
    # the session is made (the op's shape inference), never a wrapped size a kernel indexes with.
    inputs = ["x", "w"] if op == "Conv" else ["x"]
    node = helper.make_node(op, inputs, ["y"], **attrs)
    w = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    model = _single_node_model(node, [1, 3, 8, 8], None, [w] if op == "Conv" else [])
    with pytest.raises(xrt.XpuRuntimeError, match="window geometry .* overflows 64-bit integers"):
        xrt.InferenceSession(model, engine="native").run(None, {"x": np.ones((1, 3, 8, 8), np.float32)})


def test_plan_time_reference_runs_stay_under_a_budget():
    # Found by fuzz_model_structure (CI's bounded run; tests/fuzz/corpus/model/
    # regression-range-of-16-gib-at-plan-time.onnx, a mutant of a tiny decoder export): shape inference ran a node
    # whose output size follows from values in the reference library while the session was created, and it asked
    # for 2^31 int64 values (16 GiB; a crash under libFuzzer's malloc limit, 52 s and a 17 GB peak on this project's
    # machine, an OOM kill elsewhere). Such runs take a memory budget now
    # (Note [Plan-time reference runs under a budget]): the session is made (or refused with a typed error) with the
    # process's peak memory far below that. In a child process, so that its peak is its own.
    regression = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "model",
                              "regression-range-of-16-gib-at-plan-time.onnx")
    code = textwrap.dedent(f"""
        import resource, xpuruntime as xrt
        try:
            xrt.InferenceSession({regression!r}, engine="native")
        except xrt.XpuRuntimeError:
            pass
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) < 2 * 1024 * 1024, out.stdout  # KiB: under 2 GiB
