"""xpuruntime.onnxruntime as a drop-in for ONNX Runtime's Python API: the capi layout and its exception classes,
and each API added for ONNX Runtime's own API test file (docs/engines.md, "ONNX Runtime's own API tests"). The
models are built here; results are checked against numpy."""

import os
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save_model

import xpuruntime as xrt
import xpuruntime.onnxruntime as ort
from conftest import has_onnxruntime_engine, requires_gpu
from xpuruntime.onnxruntime.capi import _pybind_state as C
from xpuruntime.onnxruntime.capi.onnxruntime_inference_collection import check_and_normalize_provider_args
from xpuruntime.onnxruntime.capi.onnxruntime_pybind11_state import (EPFail, Fail, InvalidArgument, NoSuchFile,
                                                                    NotImplemented, OrtValueVector, RunOptions)

requires_ort_engine = pytest.mark.skipif(not has_onnxruntime_engine(), reason="built without the onnxruntime engine")

W = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)


def mul_model(path=None, opset=17):
    """Y = X * W (W an initializer that is not an input)."""
    graph = helper.make_graph([helper.make_node("Mul", ["X", "W"], ["Y"], name="mul_0")], "mul",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])],
                              [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if path is not None:
        save_model(model, str(path))
    return model.SerializeToString()


def two_input_model():
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["C"], name="add_0")], "add",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2]),
                               helper.make_tensor_value_info("B", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("C", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def external_add_model(folder, data_name="c.bin", c=(1.0, 2.0)):
    """Y = X + C, C a float initializer in the external file `data_name` next to the model."""
    values = np.array(c, np.float32)
    (folder / data_name).write_bytes(values.tobytes())
    tensor = TensorProto(name="C", data_type=TensorProto.FLOAT, dims=[2])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", data_name), ("offset", "0"), ("length", str(values.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["X", "C"], ["Y"])], "add_external",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    save_model(model, str(folder / "add.onnx"))
    return folder / "add.onnx"


# ---- the capi layout and the exception classes ----

def test_capi_modules_expose_the_exception_classes_and_objects():
    assert C.Fail is Fail and C.OrtValue is ort.OrtValue and C.OrtValueVector is OrtValueVector
    assert RunOptions is ort.RunOptions and isinstance(C.get_default_session_options(), ort.SessionOptions)
    for name in ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
                 "InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail"):
        cls = getattr(C, name)
        assert issubclass(cls, xrt.XpuRuntimeError) and issubclass(cls, RuntimeError), name
        assert getattr(ort, name) is cls
    assert issubclass(InvalidArgument, xrt.InvalidArgumentError) and issubclass(InvalidArgument, ValueError)
    assert issubclass(NotImplemented, xrt.UnsupportedOperationError)


def test_core_errors_become_ort_classes_that_are_still_the_core_types():
    from xpuruntime.onnxruntime._errors import ort_class_for, translate
    cuda = ort_class_for(xrt.CudaError)
    assert issubclass(cuda, EPFail) and issubclass(cuda, xrt.CudaError) and cuda.__name__ == "EPFail"
    typed = translate(xrt.InvalidTypeError("bad type"))
    assert isinstance(typed, InvalidArgument) and isinstance(typed, xrt.InvalidTypeError)
    assert str(typed) == "bad type"
    assert isinstance(translate(xrt.XpuRuntimeError("x")), Fail)
    plain = ValueError("not ours")
    assert translate(plain) is plain


def test_missing_model_file_is_nosuchfile_and_an_xpuruntime_error(tmp_path):
    with pytest.raises(NoSuchFile):
        ort.InferenceSession(str(tmp_path / "absent.onnx"))
    with pytest.raises(xrt.InvalidArgumentError):
        ort.InferenceSession(str(tmp_path / "absent.onnx"))


def test_wrong_dtype_from_the_engine_is_caught_by_both_names():
    sess = ort.InferenceSession(mul_model(), providers=["CPUExecutionProvider"])
    for cls in (InvalidArgument, xrt.XpuRuntimeError):
        with pytest.raises(cls):
            sess.run(None, {"X": np.ones((3, 2), np.int32)})


def test_values_and_options_raise_the_ort_classes_too():
    with pytest.raises(InvalidArgument) as raised:
        ort.OrtValue.ortvalue_from_numpy(np.array(["a", "b"]))  # the core's InvalidTypeError
    assert isinstance(raised.value, xrt.InvalidTypeError)
    with pytest.raises(InvalidArgument):
        ort.SessionOptions().add_free_dimension_override_by_name("batch", -1)
    with pytest.raises(InvalidArgument):
        ort.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32)).update_inplace(np.zeros(3, np.float32))


def test_missing_inputs_use_onnxruntime_text():
    sess = ort.InferenceSession(two_input_model())
    with pytest.raises(ValueError, match=r"Required inputs \(\['B'\]\) are missing from input feed \(\['A'\]\)"):
        sess.run(None, {"A": np.ones(2, np.float32)})


def test_unknown_provider_text():
    sess = ort.InferenceSession(mul_model())
    with pytest.raises(RuntimeError, match="Unknown Provider Type: NoSuchProvider"):
        sess.set_providers(["NoSuchProvider"])


def test_check_and_normalize_provider_args():
    assert check_and_normalize_provider_args(None, None, []) == ([], [])
    assert check_and_normalize_provider_args([("a", {1: 2}), "b"], None, []) == (["a", "b"], [{"1": "2"}, {}])
    with pytest.warns(UserWarning, match="Duplicate provider 'a'"):
        names, opts = check_and_normalize_provider_args(["a", "b", "a"], [{"x": 1}, {}, {"y": 2}], [])
    assert (names, opts) == (["a", "b"], [{"x": "1"}, {}])
    for providers, options in ((3, None), ([3], None), (["a"], 3), (["a"], ["no"]), (["a", "b"], [{}]),
                               ([("a", {})], [{}])):
        with pytest.raises(ValueError):
            check_and_normalize_provider_args(providers, options, [])


def test_cuda_provider_options_are_checked_and_listed_with_defaults():
    from xpuruntime.onnxruntime import _cuda_provider_options
    options = _cuda_provider_options({"gpu_mem_limit": "1024", "user_compute_stream": "12345"})
    assert options["gpu_mem_limit"] == "1024" and options["has_user_compute_stream"] == "1"
    assert options["enable_cuda_graph"] == "1" and options["cudnn_conv_algo_search"] == "HEURISTIC"
    assert _cuda_provider_options({"user_compute_stream": "0"})["has_user_compute_stream"] == "0"
    for bad in ({"gpu_mem_limit": "-1024"}, {"gpu_mem_limit": "1024.1024"}, {"gpu_mem_limit": "wrong_value"},
                {"arena_extend_strategy": "wrong_value"}, {"device_id": "-1"}, {"invalid_option": "123"}):
        with pytest.raises(InvalidArgument):
            _cuda_provider_options(bad)
    # checked before a machine without CUDA falls back to the CPU
    with pytest.raises(RuntimeError, match="unknown provider option"):
        ort.InferenceSession(mul_model(), providers=[("CUDAExecutionProvider", {"invalid_option": 1})])


@requires_gpu
def test_cuda_provider_options_round_trip_on_the_gpu():
    sess = ort.InferenceSession(mul_model(), providers=["CUDAExecutionProvider"])
    options = sess.get_provider_options()["CUDAExecutionProvider"]
    assert options["gpu_mem_limit"] == str(2**64 - 1) and options["device_id"] == "0"
    options["gpu_mem_limit"] = str(1 << 30)
    options["enable_cuda_graph"] = "0"
    sess.set_providers(["CUDAExecutionProvider"], [options])
    again = sess.get_provider_options()["CUDAExecutionProvider"]
    assert (again["gpu_mem_limit"], again["enable_cuda_graph"]) == (str(1 << 30), "0")
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(sess.run(None, {"X": x})[0], x * W)
    with pytest.raises(InvalidArgument, match="device_id"):
        sess.set_providers(["CUDAExecutionProvider"], [{"device_id": xrt.get_device_count()}])


# ---- module functions ----

def test_build_info_and_available_providers():
    info = ort.get_build_info()
    assert info.startswith("Build Info: xpuruntime " + xrt.__version__)
    providers = ort.get_available_providers()
    assert providers[-1] == "CPUExecutionProvider"
    assert ("CUDAExecutionProvider" in providers) == (xrt.get_device_count() > 0)


def test_logger_callback_receives_session_messages_and_checks_arguments():
    messages = []
    try:
        ort.set_default_logger_callback(lambda *record: messages.append(record), severity=0)
        ort.InferenceSession(mul_model())
        assert any("session created" in m[4] for m in messages)
        assert all(isinstance(m[0], int) and isinstance(m[4], str) for m in messages)
        with pytest.raises(RuntimeError):
            ort.set_default_logger_callback(print, severity=5)
        with pytest.raises(RuntimeError):
            ort.set_default_logger_callback("not callable")

        def raising(*_):
            raise ValueError("boom")
        ort.set_default_logger_callback(raising, severity=0)
        with pytest.warns(RuntimeWarning, match="log callback raised"):
            ort.InferenceSession(mul_model())
    finally:
        ort.set_default_logger_callback(None)
        ort.set_default_logger_severity(2)
    count = len(messages)
    ort.InferenceSession(mul_model())
    assert len(messages) == count  # no callback any more


# ---- models, options and initializers ----

def test_external_data_by_path_resolves_next_to_the_model(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    path = external_add_model(folder)
    monkeypatch.chdir(tmp_path)  # not the model's folder
    x = np.array([10.0, 20.0], np.float32)
    np.testing.assert_array_equal(ort.InferenceSession(str(path)).run(None, {"X": x})[0], [11.0, 22.0])


@requires_ort_engine
def test_optimized_model_filepath_writes_a_loadable_model(tmp_path):
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(mul_model(), so, providers=["CPUExecutionProvider"])
    assert (tmp_path / "opt.onnx").stat().st_size > 0  # written when the session is created
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = ort.InferenceSession(str(tmp_path / "opt.onnx")).run(None, {"X": x})[0]
    np.testing.assert_array_equal(y, x * W)


@requires_ort_engine
def test_session_config_entries_reach_onnx_runtime(tmp_path):
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt_ext.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt_ext.bin")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1")
    sess = ort.InferenceSession(mul_model(), so, providers=["CPUExecutionProvider"])
    assert (tmp_path / "opt_ext.bin").exists()  # ONNX Runtime read the two entries
    assert any("ONNX Runtime's session config" in o for o in sess.explain().options)


@requires_ort_engine
def test_core_session_takes_optimized_model_path_and_config_on_the_onnxruntime_engine(tmp_path):
    # the C++ contract under the options above (SessionOptions::optimized_model_path, ::session_config)
    path = tmp_path / "core_opt.onnx"
    sess = xrt.InferenceSession(mul_model(), engine="onnxruntime", optimized_model_path=str(path),
                                session_config=[("session.optimized_model_external_initializers_file_name",
                                                 "core_opt.bin"),
                                                ("session.optimized_model_external_initializers_min_size_in_bytes",
                                                 "1")])
    assert path.exists() and (tmp_path / "core_opt.bin").exists()
    assert any(o.startswith("optimized_model_filepath=") for o in sess.explain().options)
    with pytest.raises(xrt.InvalidArgumentError, match="disabled_passes is an option of the native engine"):
        xrt.InferenceSession(mul_model(), engine="onnxruntime", disabled_passes=["gemm_fusion"])


def test_add_initializer_replaces_the_models_value():
    so = ort.SessionOptions()
    w = np.full((3, 2), 2.0, np.float32)
    so.add_initializer("W", ort.OrtValue.ortvalue_from_numpy(w))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(ort.InferenceSession(mul_model(), so).run(None, {"X": x})[0], x * w)
    np.testing.assert_array_equal(ort.InferenceSession(mul_model()).run(None, {"X": x})[0], x * W)
    so.add_initializer("NoSuchName", w)
    with pytest.raises(InvalidArgument, match="no initializer 'NoSuchName'"):
        ort.InferenceSession(mul_model(), so)


def test_external_initializers_from_values_and_from_memory(tmp_path):
    path = external_add_model(tmp_path, data_name="absent.bin")
    os.remove(tmp_path / "absent.bin")
    x = np.array([10.0, 20.0], np.float32)
    with pytest.raises(xrt.XpuRuntimeError):
        ort.InferenceSession(str(path))  # the file is gone
    so = ort.SessionOptions()
    so.add_external_initializers(["C"], [ort.OrtValue.ortvalue_from_numpy(np.array([3.0, 4.0], np.float32))])
    np.testing.assert_array_equal(ort.InferenceSession(str(path), so).run(None, {"X": x})[0], [13.0, 24.0])
    so = ort.SessionOptions()
    data = np.array([5.0, 6.0], np.float32).tobytes()
    so.add_external_initializers_from_files_in_memory(["absent.bin"], [data], [len(data)])
    np.testing.assert_array_equal(ort.InferenceSession(str(path), so).run(None, {"X": x})[0], [15.0, 26.0])
    with pytest.raises(InvalidArgument):
        so.add_external_initializers_from_files_in_memory(["absent.bin"], [data], [len(data) + 1])


def test_load_config_from_model(monkeypatch, tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "relu",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {"ort_config": '{"session_options": {"inter_op_num_threads": 3, '
                                                 '"intra_op_num_threads": 1}}'})
    data = model.SerializeToString()
    assert ort.InferenceSession(data).get_session_options().inter_op_num_threads == 0
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    so = ort.InferenceSession(data).get_session_options()
    assert (so.inter_op_num_threads, so.intra_op_num_threads) == (3, 1)
    # the engine gets the model without ort_config: ONNX Runtime inside it does not apply it again (its own
    # profiler would write a second trace)
    helper.set_model_props(model, {"ort_config": '{"session_options": {"enable_profiling": 1}}'})
    monkeypatch.chdir(tmp_path)
    sess = ort.InferenceSession(model.SerializeToString())
    assert sess.get_session_options().enable_profiling
    sess.run(None, {"X": np.ones(2, np.float32)})
    trace = sess.end_profiling()
    assert os.listdir(tmp_path) == [trace]
    helper.set_model_props(model, {"ort_config": '{"session_options": {"no_such_option": 1}}'})
    with pytest.raises(ort.InvalidGraph, match="no_such_option"):
        ort.InferenceSession(model.SerializeToString())


def test_session_config_entry_missing_key_text():
    with pytest.raises(RuntimeError, match="SessionOptions does not have configuration with key: K"):
        ort.SessionOptions().get_session_config_entry("K")


# ---- values ----

def test_ortvalue_array_protocol_size_and_element_type():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    view = np.asarray(v)
    assert view.ctypes.data == v.data_ptr() and view.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(v, dtype=np.float64), a.astype(np.float64))
    assert v.tensor_size_in_bytes() == 24 and v.element_type() == TensorProto.FLOAT
    assert ort.OrtValue.ortvalue_from_numpy(np.ones(5, np.int64)).tensor_size_in_bytes() == 40
    assert v._ortvalue is v and v._get_c_value() is v


def test_ortvalue_from_numpy_with_onnx_type():
    bits = np.array([1, 2, 3], np.uint64)
    v = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.INT64)
    assert v.element_type() == TensorProto.INT64 and v.shape() == [3]
    np.testing.assert_array_equal(v.numpy(), [1, 2, 3])
    half = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.array([0x3F80], np.uint16), TensorProto.BFLOAT16)
    assert half.element_type() == TensorProto.BFLOAT16
    with pytest.raises(InvalidArgument, match="bytes"):
        ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ones(2, np.float32), TensorProto.INT64)
    with pytest.raises(NotImplemented):
        ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ones(2, np.float32), TensorProto.STRING)


def test_dlpack_capsules():
    a = np.array([1, 2, 255], np.uint8)
    assert C.is_dlpack_uint8_tensor(ort.OrtValue.ortvalue_from_numpy(a).to_dlpack())
    assert not C.is_dlpack_uint8_tensor(ort.OrtValue.ortvalue_from_numpy(a.view(np.int8)).to_dlpack())
    f = ort.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))
    g = C.OrtValue.from_dlpack(f.to_dlpack(), False)
    assert g.data_ptr() == f.data_ptr()
    b = ort.OrtValue.from_dlpack(ort.OrtValue.ortvalue_from_numpy(np.array([True, False])))
    assert b.numpy().dtype == np.bool_


def test_ort_device_and_memory_info():
    cpu, cuda = ort.OrtDevice.make("cpu", 0), ort.OrtDevice.make("cuda", 1)
    assert (cpu.device_type(), cpu.device_id(), cpu.device_vendor_id()) == (0, 0, ort.OrtDeviceVendorId.NONE)
    assert (cuda.device_type(), cuda.device_id(), cuda.device_vendor_id()) == (1, 1, 0x10DE)
    with pytest.raises(InvalidArgument):
        ort.OrtDevice.make("tpu", 0)
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    assert (info.name, info.device_id, info.mem_type, info.device_vendor_id) == ("Cpu", 0, ort.OrtMemType.DEFAULT, 0)
    v2 = ort.OrtMemoryInfo.create_v2("T", ort.OrtMemoryInfoDeviceType.GPU, 0x10DE, 1,
                                     ort.OrtDeviceMemoryType.HOST_ACCESSIBLE, 64,
                                     ort.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
    assert (v2.device_id, v2.device_vendor_id, v2.device_mem_type) == (1, 0x10DE, ort.OrtDeviceMemoryType.HOST_ACCESSIBLE)
    cfg = ort.OrtArenaCfg({"max_mem": 16, "arena_extend_strategy": 1})
    assert (cfg.max_mem, cfg.arena_extend_strategy, cfg.initial_chunk_size_bytes) == (16, 1, -1)
    with pytest.raises(InvalidArgument):
        ort.OrtArenaCfg({"no_such_key": 1})


def test_sparse_tensors_are_host_containers():
    cpu = ort.OrtDevice.make("cpu", 0)
    st = ort.SparseTensor.sparse_coo_from_numpy([4, 4], np.array([1.0, 2.0], np.float32),
                                                np.array([1, 6], np.int64), cpu)
    assert st.format() == ort.OrtSparseFormat.ORT_SPARSE_COO and st.data_type() == "sparse_tensor(float)"
    assert not st.values().flags.writeable and list(st.as_coo_view().indices()) == [1, 6]
    value = ort.OrtValue.ort_value_from_sparse_tensor(st)
    assert value.is_sparse_tensor() and not value.is_tensor() and value.as_sparse_tensor() is st
    csr = ort.SparseTensor.sparse_csr_from_numpy([2, 3], np.array(["a", "b"]), np.array([0, 2], np.int64),
                                                 np.array([0, 1, 2], np.int64), cpu)
    assert csr.data_type() == "sparse_tensor(string)" and list(csr.as_csrc_view().outer()) == [0, 1, 2]
    with pytest.raises(InvalidArgument, match="rows \\+ 1 outer"):
        ort.SparseTensor.sparse_csr_from_numpy([2, 3], np.ones(2, np.float32), np.array([0, 2], np.int64),
                                               np.array([0, 2], np.int64), cpu)
    with pytest.raises(NotImplemented):
        st.to_cuda(ort.OrtDevice.make("cuda", 0))
    sess = ort.InferenceSession(two_input_model())
    with pytest.raises(NotImplemented, match="dense"):
        sess.run(None, {"A": value, "B": np.ones(2, np.float32)})


# ---- the session ----

def test_lists_feed_tensor_inputs_and_strings_are_refused_with_a_typed_error():
    sess = ort.InferenceSession(mul_model())
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(sess.run(None, {"X": x.tolist()})[0], x * W)
    for strings in (np.array([["a", "b"]] * 3), np.array([[b"a", b"b"]] * 3), np.array([["a", "b"]] * 3, object)):
        with pytest.raises(NotImplemented, match="string tensors"):
            sess.run(None, {"X": strings})


def test_memory_infos_and_ep_devices():
    sess = ort.InferenceSession(two_input_model())
    infos = sess.get_input_memory_infos()
    assert [i.name for i in infos] == ["Cpu", "Cpu"] and len(sess.get_output_memory_infos()) == 1
    assert sess.get_input_epdevices() == [None, None]


def test_run_with_ort_values_through_sess():
    sess = ort.InferenceSession(mul_model())
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = sess._sess.run_with_ort_values({"X": ort.OrtValue.ortvalue_from_numpy(x)}, ["Y"], RunOptions())
    assert isinstance(out, OrtValueVector) and isinstance(out[0], ort.OrtValue)
    np.testing.assert_array_equal(out[0].numpy(), x * W)


def test_run_async_calls_back_with_results_and_with_errors():
    sess = ort.InferenceSession(mul_model())
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    done, got = threading.Event(), {}

    def callback(results, data, error):
        got.update(results=results, data=data, error=error, thread=threading.current_thread().name)
        done.set()
    sess.run_async(["Y"], {"X": x}, callback, "data")
    assert done.wait(30)
    assert got["error"] == "" and got["data"] == "data" and got["thread"] != threading.current_thread().name
    np.testing.assert_array_equal(got["results"][0], x * W)
    done.clear()
    sess.run_async(["Y"], {}, callback, None)
    assert done.wait(30) and got["results"] is None and "Required inputs" in got["error"]


def test_graph_assignment_info_needs_the_config_entry():
    with pytest.raises(Fail, match="session.record_ep_graph_assignment_info"):
        ort.InferenceSession(mul_model()).get_provider_graph_assignment_info()
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    subgraphs = ort.InferenceSession(mul_model(), so).get_provider_graph_assignment_info()
    assert [(s.ep_name, [(n.op_type, n.name) for n in s.get_nodes()]) for s in subgraphs] == \
        [("CPUExecutionProvider", [("Mul", "mul_0")])]


def test_overridable_initializers_are_listed():
    graph = helper.make_graph([helper.make_node("Add", ["X", "B"], ["Y"])], "bias",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2]),
                               helper.make_tensor_value_info("B", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
                              [numpy_helper.from_array(np.ones(2, np.float32), "B")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess = ort.InferenceSession(data)
    (b,) = sess.get_overridable_initializers()
    assert (b.name, b.type, b.shape) == ("B", "tensor(float)", [2])
    np.testing.assert_array_equal(sess.run(None, {"X": np.zeros(2, np.float32)})[0], [1, 1])  # B may be left out


def test_adapter_files_round_trip_and_feed_a_run(tmp_path):
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(3)
    adapter.set_model_version(5)
    adapter.set_parameters({"B": ort.OrtValue.ortvalue_from_numpy(np.array([10.0, 20.0], np.float32)),
                            "I": ort.OrtValue.ortvalue_from_numpy(np.arange(6).reshape(2, 3))})
    path = str(tmp_path / "a.onnx_adapter")
    adapter.export_adapter(path)
    back = ort.AdapterFormat.read_adapter(path)
    assert (back.get_adapter_version(), back.get_model_version()) == (3, 5)
    params = back.get_parameters()
    assert params["I"].element_type() == TensorProto.INT64 and params["I"].shape() == [2, 3]
    np.testing.assert_array_equal(params["I"].numpy(), np.arange(6).reshape(2, 3))
    # a model whose B is an overridable initializer: the active adapter's B is what the run uses
    adapter.set_parameters({"B": ort.OrtValue.ortvalue_from_numpy(np.array([10.0, 20.0], np.float32))})
    adapter.export_adapter(path)
    graph = helper.make_graph([helper.make_node("Add", ["X", "B"], ["Y"])], "bias",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 2]),
                               helper.make_tensor_value_info("B", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2])],
                              [numpy_helper.from_array(np.zeros(2, np.float32), "B")])
    sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                .SerializeToString())
    lora = ort.LoraAdapter()
    lora.Load(path)
    options = ort.RunOptions()
    options.add_active_adapter(lora)
    np.testing.assert_array_equal(sess.run(None, {"X": a}, options)[0], a + [10.0, 20.0])
    np.testing.assert_array_equal(sess.run(None, {"X": a})[0], a)
    (tmp_path / "bad.onnx_adapter").write_bytes(b"\0" * 16)
    with pytest.raises(ort.InvalidProtobuf):
        lora.Load(str(tmp_path / "bad.onnx_adapter"))
    with pytest.raises(xrt.InvalidTypeError):
        options.add_active_adapter("not an adapter")
    other = ort.AdapterFormat()
    other.set_parameters({"NotInTheModel": ort.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32))})
    other.export_adapter(str(tmp_path / "other.onnx_adapter"))
    wrong = ort.LoraAdapter()
    wrong.Load(str(tmp_path / "other.onnx_adapter"))
    options = ort.RunOptions()
    options.add_active_adapter(wrong)
    with pytest.raises(InvalidArgument, match="no initializer 'NotInTheModel'"):
        sess.run(None, {"X": a}, options)


def test_sequences_and_optionals_through_run():
    graph = helper.make_graph([helper.make_node("SequenceConstruct", ["A", "B"], ["S"])], "seq",
                              [helper.make_tensor_value_info("A", TensorProto.INT64, [2]),
                               helper.make_tensor_value_info("B", TensorProto.INT64, [2])],
                              [helper.make_tensor_sequence_value_info("S", TensorProto.INT64, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess = ort.InferenceSession(data)
    assert sess.get_outputs()[0].type == "seq(tensor(int64))"
    (seq,) = sess.run(None, {"A": np.array([1, 2]), "B": np.array([3, 4])})
    assert isinstance(seq, list) and [s.tolist() for s in seq] == [[1, 2], [3, 4]]
    length = helper.make_graph([helper.make_node("SequenceLength", ["S"], ["N"])], "len",
                               [helper.make_tensor_sequence_value_info("S", TensorProto.FLOAT, None)],
                               [helper.make_tensor_value_info("N", TensorProto.INT64, [])])
    sess = ort.InferenceSession(helper.make_model(length, opset_imports=[helper.make_opsetid("", 17)])
                                .SerializeToString())
    assert int(sess.run(None, {"S": [np.ones(2, np.float32)] * 3})[0]) == 3
