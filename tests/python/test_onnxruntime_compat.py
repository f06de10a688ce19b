"""xpuruntime.onnxruntime: ONNX Runtime's Python API on xpuruntime (docs/engines.md, "ONNX Runtime's API"). The
examples at the top are ONNX Runtime's own documentation examples with only the import changed."""

import json
import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import xpuruntime as xrt
import xpuruntime.onnxruntime as ort
from conftest import has_onnxruntime_engine, requires_gpu

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models", "tiny_classifier.onnx")


def softmax_reference(x):
    sess = xrt.InferenceSession(MODEL, device="cpu", engine="native")
    return sess.run({"x": x})["probs"]


# ---- ONNX Runtime's documentation examples, only the import changed ----

def test_readme_example_runs_unchanged():
    # https://onnxruntime.ai/docs/get-started/with-python.html ("import onnxruntime as ort" -> this module)
    X = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    input_name = sess.get_inputs()[0].name
    label_name = sess.get_outputs()[0].name
    pred_onx = sess.run([label_name], {input_name: X.astype(np.float32)})[0]
    np.testing.assert_allclose(pred_onx, softmax_reference(X), rtol=1e-5, atol=1e-6)


def test_session_options_example_runs_unchanged(tmp_path):
    # https://onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html (Python API usage)
    sess_options = ort.SessionOptions()
    sess_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess_options.optimized_model_filepath = str(tmp_path / "optimized_model.onnx")
    sess_options.intra_op_num_threads = 1
    session = ort.InferenceSession(MODEL, sess_options, providers=["native", "CPUExecutionProvider"])
    x = np.ones((2, 8), np.float32)
    session.run(None, {"x": x})
    assert (tmp_path / "optimized_model.onnx").exists()
    optimized = onnx.load(str(tmp_path / "optimized_model.onnx"))
    assert any(n.domain == "com.xpuruntime" for n in optimized.graph.node)  # the fused Gemm + Relu
    options = "\n".join(session.explain().options)
    assert "ORT_ENABLE_EXTENDED -> native passes off: nhwc_layout" in options
    assert "intra_op_num_threads=1 -> ExecutionPolicy.intra_op_threads" in options


def test_iobinding_example_runs_unchanged():
    # https://onnxruntime.ai/docs/api/python/api_summary.html (Data on device), on the CPU
    X = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"], engine="native")
    X_ortvalue = ort.OrtValue.ortvalue_from_numpy(X, "cpu", 0)
    io_binding = session.io_binding()
    io_binding.bind_ortvalue_input("x", X_ortvalue)
    io_binding.bind_output("probs")
    session.run_with_iobinding(io_binding)
    Y = io_binding.copy_outputs_to_cpu()[0]
    np.testing.assert_allclose(Y, softmax_reference(X), rtol=1e-5, atol=1e-6)
    assert isinstance(io_binding.get_outputs()[0], ort.OrtValue)


# ---- the mapping ----

def test_module_level_names():
    assert ort.get_available_providers()[-1] == "CPUExecutionProvider"
    assert "TensorrtExecutionProvider" in ort.get_all_providers()
    assert ort.get_device() in ("CPU", "GPU")
    assert ort.__version__ == xrt.__version__ == ort.get_version_string()
    assert int(ort.GraphOptimizationLevel.ORT_ENABLE_ALL) == 99


def test_node_args_use_onnx_type_names():
    sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    (x,) = sess.get_inputs()
    assert (x.name, x.type, x.shape) == ("x", "tensor(float)", ["batch", 8])
    assert sess.get_outputs()[0].type == "tensor(float)"


@pytest.mark.skipif(xrt.get_device_count() > 0, reason="checks the fallback of a machine without CUDA")
def test_cuda_provider_without_a_device_falls_back_to_cpu_with_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = ort.InferenceSession(MODEL, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert any("CUDAExecutionProvider" in str(w.message) for w in caught)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert any("no CUDA device 0 here" in o for o in sess.explain().options)
    assert sess.run(None, {"x": np.ones((1, 8), np.float32)})[0].shape == (1, 4)


@requires_gpu
def test_cuda_provider_maps_to_the_device_and_cpu_fallback():
    sess = ort.InferenceSession(MODEL, providers=[("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"])
    assert sess.get_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert sess.get_provider_options()["CUDAExecutionProvider"]["device_id"] == "0"
    assert any("fallback='cpu'" in o for o in sess.explain().options)
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], softmax_reference(x), rtol=1e-3, atol=1e-4)
    strict = ort.InferenceSession(MODEL, providers=["CUDAExecutionProvider"])
    assert not any("fallback='cpu'" in o for o in strict.explain().options)


def test_engine_providers_and_npu_runtimes_say_what_to_install():
    with pytest.raises(xrt.UnsupportedOperationError, match="TensorRT"):
        ort.InferenceSession(MODEL, providers=["TensorrtExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(xrt.UnsupportedOperationError, match="OpenVINO"):
        ort.InferenceSession(MODEL, providers=["OpenVINOExecutionProvider"])
    with pytest.raises(xrt.UnsupportedOperationError, match="QNN"):
        ort.InferenceSession(MODEL, providers=["QNNExecutionProvider"])
    with pytest.raises(xrt.InvalidArgumentError, match="Unknown Provider Type: CUDAProvider"):
        ort.InferenceSession(MODEL, providers=["CUDAProvider"])
    with pytest.raises(xrt.InvalidArgumentError, match="provider_options has 1 entries for 2 providers"):
        ort.InferenceSession(MODEL, providers=["CPUExecutionProvider", "native"], provider_options=[{}])
    with pytest.raises(xrt.InvalidTypeError, match="list of provider names"):
        ort.InferenceSession(MODEL, providers="CPUExecutionProvider")


def test_the_seeds_npu_spelling():
    # The design's example: InferenceSession("model.onnx", device="npu", backend="openvino", ...)
    with pytest.raises(xrt.UnsupportedOperationError, match="OpenVINO.*QNN"):
        xrt.InferenceSession(MODEL, device="npu", backend="openvino",
                             exec_policy=xrt.ExecutionPolicy(precision="int8", static_shape=True))
    with pytest.raises(xrt.UnsupportedOperationError, match="the openvino engine .* is not implemented in this version"):
        xrt.InferenceSession(MODEL, backend="openvino")
    with pytest.raises(xrt.UnsupportedOperationError, match="installing the QNN SDK does not add it"):
        xrt.InferenceSession(MODEL, engine="qnn")
    with pytest.raises(xrt.InvalidArgumentError, match="disagree"):
        xrt.InferenceSession(MODEL, engine="native", backend="onnxruntime")
    assert xrt.InferenceSession(MODEL, backend="native").engine == "native"
    with pytest.raises(TypeError, match="xpuruntime.onnxruntime.InferenceSession"):
        xrt.InferenceSession(MODEL, providers=["CPUExecutionProvider"])


def test_graph_optimization_levels_turn_native_passes_off():
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    expected = softmax_reference(x)
    for level, fused in ((ort.GraphOptimizationLevel.ORT_DISABLE_ALL, False),
                         (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, False),
                         (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, True)):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        sess = ort.InferenceSession(MODEL, so, providers=["native"])
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)
        kernels = {n["op_type"] for n in sess.explain().nodes}
        assert ("xpuruntime:Linear" in kernels) == fused, (level, kernels)


def test_session_options_kept_and_refused():
    so = ort.SessionOptions()
    so.inter_op_num_threads = 4
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    so.enable_mem_pattern = False
    so.use_deterministic_compute = True
    so.add_session_config_entry("session.load_model_format", "ONNX")
    assert so.get_session_config_entry("session.load_model_format") == "ONNX"
    with pytest.raises(xrt.InvalidArgumentError):
        so.get_session_config_entry("nope")
    sess = ort.InferenceSession(MODEL, so, providers=["native"])
    options = "\n".join(sess.explain().options)
    for text in ("inter_op_num_threads=4: ignored", "execution_mode ORT_PARALLEL: ignored",
                 "enable_mem_pattern=False: ignored", "use_deterministic_compute -> ExecutionPolicy.deterministic",
                 "session config entry session.load_model_format=ONNX: kept"):
        assert text in options
    with pytest.raises(xrt.UnsupportedOperationError, match="custom-op libraries"):
        so.register_custom_ops_library("libcustom.so")
    so.add_initializer("no_such_initializer", np.ones(3, np.float32))  # applied when a session is made
    with pytest.raises(xrt.InvalidArgumentError, match="no initializer 'no_such_initializer'"):
        ort.InferenceSession(MODEL, so, providers=["native"])
    with pytest.raises(xrt.InvalidArgumentError):
        so.add_free_dimension_override_by_name("batch", -1)


def test_free_dimension_overrides_fix_the_shapes():
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 3)
    sess = ort.InferenceSession(MODEL, so, providers=["native"])
    assert sess.get_inputs()[0].shape == [3, 8]
    assert sess.run(None, {"x": np.ones((3, 8), np.float32)})[0].shape == (3, 4)
    with pytest.raises(xrt.XpuRuntimeError):
        sess.run(None, {"x": np.ones((2, 8), np.float32)})


def test_run_options_terminate_and_config():
    sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    ro = ort.RunOptions()
    ro.logid = "req-7"
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    assert ro.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    assert sess.run(None, {"x": np.ones((1, 8), np.float32)}, ro)[0].shape == (1, 4)
    ro.terminate = True
    with pytest.raises(xrt.RunTerminatedError, match="run 'req-7' stopped before it started"):
        sess.run(None, {"x": np.ones((1, 8), np.float32)}, ro)
    ro.terminate = False
    assert sess.run(None, {"x": np.ones((1, 8), np.float32)}, ro)[0].shape == (1, 4)


def _model_with_metadata() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu_graph", [x], [y], doc_string="a relu")
    model = helper.make_model(graph, producer_name="compat-test", opset_imports=[helper.make_opsetid("", 17)],
                              doc_string="the model", domain="ai.example", model_version=7)
    model.ir_version = 8
    helper.set_model_props(model, {"author": "xpuruntime", "license": "Apache-2.0"})
    return model.SerializeToString()


def test_modelmeta():
    sess = ort.InferenceSession(_model_with_metadata(), providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta()
    assert (meta.producer_name, meta.graph_name, meta.domain, meta.description, meta.graph_description,
            meta.version) == ("compat-test", "relu_graph", "ai.example", "the model", "a relu", 7)
    assert meta.custom_metadata_map == {"author": "xpuruntime", "license": "Apache-2.0"}


def test_end_profiling_writes_a_chrome_trace(tmp_path):
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof_")
    sess = ort.InferenceSession(MODEL, so, providers=["native"])
    assert sess.get_profiling_start_time_ns() > 0
    sess.run(None, {"x": np.ones((2, 8), np.float32)})
    path = sess.end_profiling()
    assert path.startswith(str(tmp_path / "prof_")) and path.endswith(".json")
    trace = json.loads(open(path).read())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("cat") == "node" for e in events)
    assert sess.end_profiling() == ""


def test_ortvalue():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = ort.OrtValue.ortvalue_from_numpy(x)
    assert v.shape() == [2, 3] and v.data_type() == "tensor(float)" and v.device_name() == "cpu"
    assert v.is_tensor() and v.has_value() and v.data_ptr() != 0
    np.testing.assert_array_equal(v.numpy(), x)
    e = ort.OrtValue.ortvalue_from_shape_and_type([4], np.int64)
    assert e.shape() == [4] and e.data_type() == "tensor(int64)"
    np.testing.assert_array_equal(np.from_dlpack(v), x)
    with pytest.raises(xrt.InvalidArgumentError, match="device_type"):
        ort.OrtValue.ortvalue_from_numpy(x, "tpu")
    sess = ort.InferenceSession(MODEL, providers=["native"])
    out = sess.run_with_ort_values(None, {"x": ort.OrtValue.ortvalue_from_numpy(np.ones((2, 8), np.float32))})
    assert isinstance(out[0], ort.OrtValue) and out[0].shape() == [2, 4]


def test_set_providers_and_fallback_switches():
    sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    # CPUExecutionProvider is ONNX Runtime's own engine where this build has it, the native engine otherwise (a GPU
    # machine's build without .deps/onnxruntime).
    assert sess.engine == ("onnxruntime" if has_onnxruntime_engine() else "native")
    sess.set_providers(["native"])
    assert sess.engine == "native"
    sess.disable_fallback()
    sess.set_providers(["native", "CPUExecutionProvider"])
    assert sess.run(None, {"x": np.ones((1, 8), np.float32)})[0].shape == (1, 4)
    with pytest.raises(xrt.InvalidArgumentError, match="run_async: callback must be callable"):
        sess.run_async(None, {}, None, None)
    with pytest.raises(xrt.UnsupportedOperationError, match="raw buffer pointer"):
        sess.io_binding().bind_input("x", "cpu", 0, np.float32, [1, 8], 1234)


def test_remaining_supported_names():
    sess = ort.InferenceSession(MODEL, providers=["native"])
    assert sess.get_tuning_results() == []
    with pytest.raises(xrt.UnsupportedOperationError, match="set_autotune_cache"):
        sess.set_tuning_results([])
    so = sess.get_session_options()
    assert isinstance(so, ort.SessionOptions)
    assert sess.get_overridable_initializers() == []
    v = ort.OrtValue.ortvalue_from_numpy(np.zeros((2, 8), np.float32))
    v.update_inplace(np.full((2, 8), 2.0, np.float32))
    assert v.element_type() == 1 and not v.is_sparse_tensor() and not v.is_tensor_sequence()
    with pytest.raises(xrt.InvalidArgumentError, match="update_inplace"):
        v.update_inplace(np.zeros(3, np.float32))
    w = ort.OrtValue.from_dlpack(v)
    np.testing.assert_array_equal(w.numpy(), np.full((2, 8), 2.0, np.float32))
    binding = sess.io_binding()
    binding.bind_input("x", v)
    binding.bind_output("probs", "cpu")
    sess.run_with_iobinding(binding, ort.RunOptions())
    (out,) = binding.get_outputs_as_ortvaluevector()
    np.testing.assert_allclose(out.numpy(), softmax_reference(np.full((2, 8), 2.0, np.float32)), rtol=1e-5)
    binding.synchronize_outputs()
    binding.clear_binding_inputs()
    binding.clear_binding_outputs()
    ort.set_default_logger_severity(3)
    ort.set_default_logger_verbosity(0)
    with pytest.raises(xrt.InvalidArgumentError):
        ort.set_default_logger_severity(9)


def test_a_real_export_runs_unchanged_but_for_the_import():
    # A transformers BERT exported by PyTorch's dynamo exporter (the real-model suite's tiny set), run the way
    # ONNX Runtime's users write it, against PyTorch's float64 output.
    tiny = os.path.join(os.path.dirname(__file__), "..", "..", "models", "suite", "tiny")
    data = np.load(os.path.join(tiny, "bert.npz"))
    sess = ort.InferenceSession(os.path.join(tiny, "bert.dynamo.float32.onnx"),
                                providers=["native", "CPUExecutionProvider"])
    feeds = {i.name: data[f"in.{i.name}"] for i in sess.get_inputs()}
    (hidden,) = sess.run(None, feeds)
    np.testing.assert_allclose(hidden, data["ref.last_hidden_state"], rtol=1e-4, atol=1e-4)
    assert {n.name for n in sess.get_inputs()} == {"input_ids", "attention_mask"}
    assert sess.get_modelmeta().producer_name == "pytorch"
