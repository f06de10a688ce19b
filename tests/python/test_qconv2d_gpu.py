"""The int8 convolution qconv2d on the GPU, end to end (issue 41; docs/quantization.md, "Int8 convolutions on the GPU").

A Q/DQ CNN whose input is already quantized (uint8), so that every node after the quantized_fusion pass is a QConv:
a 3-channel stem, a 16 -> 32 stride-2 convolution and a 32 -> 64 1x1 one (channels multiples of 16, one group: the
nhwc_layout pass makes them channels-last for cuda_raw's tensor-core kernel int8_mma), and a grouped 64 -> 32 one
(NCHW, cuda_raw's generic kernel); per-channel weight scales, biases, Relu, uint8 and int8 activations with zero
points, an int8 intermediate as a second graph output. On cuda:0 every qconv2d runs on the kernel its shape calls for
and the outputs equal the CPU plan's bit for bit (each GPU kernel equals the cpu kernel's bits; the C++ tests in
tests/cpp/backends/cuda_raw/test_quant_conv.cpp check them op by op), with the layout pass on and off.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xpuruntime as xrt
from conftest import requires_gpu


def _qdq_cnn(symmetric: bool = False) -> bytes:
    """The CNN above; ``symmetric``: int8 activations with zero point 0 throughout (xrt.quantize's default form)."""
    rng = np.random.default_rng(2026)
    inits = []
    nodes = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    const("s0", np.array(0.02, np.float32))
    const("z0", np.array(0, np.int8) if symmetric else np.array(128, np.uint8))
    nodes.append(helper.make_node("DequantizeLinear", ["xq", "s0", "z0"], ["x"]))

    def conv(name: str, inp: str, out: str, shape, attrs, quantize=None):
        k = shape[1] * shape[2] * shape[3]
        w = rng.integers(-127, 128, shape).astype(np.int8)
        const(f"{name}_w", w)
        const(f"{name}_ws", (rng.uniform(0.5, 1.5, shape[0]) * (1.7 / (127 * np.sqrt(k)))).astype(np.float32))
        const(f"{name}_b", rng.uniform(-0.3, 0.3, shape[0]).astype(np.float32))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_w", f"{name}_ws"], [f"{name}_wf"], axis=0))
        nodes.append(helper.make_node("Conv", [inp, f"{name}_wf", f"{name}_b"], [f"{name}_c"], name=name, **attrs))
        if quantize is None:
            nodes.append(helper.make_node("Relu", [f"{name}_c"], [out]))
            return
        s, z, dtype = quantize
        const(f"{name}_s", np.array(s, np.float32))
        const(f"{name}_z", np.array(z, dtype))
        nodes.append(helper.make_node("Relu", [f"{name}_c"], [f"{name}_r"]))
        nodes.append(helper.make_node("QuantizeLinear", [f"{name}_r", f"{name}_s", f"{name}_z"], [f"{name}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [out]))

    zero_point = 0 if symmetric else -128
    wide = (0.0125, 0, np.int8) if symmetric else (0.025, 0, np.uint8)
    conv("stem", "x", "a1", (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}, (0.03, zero_point, np.int8))
    conv("down", "a1", "a2", (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, (0.03, zero_point, np.int8))
    conv("wide", "a2", "a3", (64, 32, 1, 1), {}, wide)
    conv("grouped", "a3", "y", (32, 32, 3, 3), {"pads": [1, 0, 1, 2], "group": 2})
    graph = helper.make_graph(
        nodes, "qdq_cnn", [helper.make_tensor_value_info("xq", TensorProto.INT8 if symmetric else TensorProto.UINT8,
                                                         [2, 3, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32, 10, 10]),
         helper.make_tensor_value_info("wide_q", TensorProto.INT8 if symmetric else TensorProto.UINT8,
                                       [2, 64, 10, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _qconv_kernels(session) -> list:
    return [n["kernel"] for n in session.explain().nodes if n["op"] == "qconv2d"]


@requires_gpu
@pytest.mark.parametrize("layout_pass", [True, False])
def test_int8_convolutions_on_the_gpu_equal_the_cpu_plan(layout_pass):
    model = _qdq_cnn()
    feeds = {"xq": np.random.default_rng(7).integers(0, 256, (2, 3, 20, 20)).astype(np.uint8)}
    cpu = xrt.InferenceSession(model, engine="native", device="cpu")
    assert _qconv_kernels(cpu) == ["cpu"] * 4
    disabled = [] if layout_pass else ["nhwc_layout"]
    gpu = xrt.InferenceSession(model, engine="native", device="cuda:0", disabled_passes=disabled)
    expected_kernels = ["cuda_raw", "int8_mma", "int8_mma", "cuda_raw"] if layout_pass else ["cuda_raw"] * 4
    assert _qconv_kernels(gpu) == expected_kernels
    want = cpu.run(feeds)
    for _ in range(2):  # the first run and a second one (a captured graph where the session replays one)
        got = gpu.run(feeds)
        for name in ("y", "wide_q"):
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert float(np.abs(want["y"]).max()) > 0  # the Relus leave something to compare


@requires_gpu
def test_symmetric_int8_convolutions_run_on_cudnn_within_one_level_and_a_pin_gives_the_cpu_bits():
    # Zero points 0 (xrt.quantize's default): the two convolutions of 16 and 32 input channels run on cuDNN's fused
    # int8 convolution (Note [cuDNN int8 convolution]), within one level of the cpu kernel; KernelPolicy(qconv2d=
    # "int8_mma") is the policy that gives the cpu kernel's bits.
    model = _qdq_cnn(symmetric=True)
    feeds = {"xq": np.random.default_rng(8).integers(-128, 128, (2, 3, 20, 20)).astype(np.int8)}
    want = xrt.InferenceSession(model, engine="native", device="cpu").run(feeds)
    if "cudnn" not in {k.name for k in xrt.kernels("qconv2d")}:
        pytest.skip("built without cuDNN")
    gpu = xrt.InferenceSession(model, engine="native", device="cuda:0")
    assert _qconv_kernels(gpu) == ["cuda_raw", "cudnn", "cudnn", "cuda_raw"]
    reasons = [n for n in gpu.explain().nodes if n["op"] == "qconv2d" and n["kernel"] == "cuda_raw"]
    assert reasons, "the stem and the grouped convolution stay on cuda_raw"
    for _ in range(2):
        got = gpu.run(feeds)
        levels = np.abs(np.asarray(got["wide_q"]).astype(np.int32) - np.asarray(want["wide_q"]).astype(np.int32))
        assert levels.max() <= 1
        assert np.count_nonzero(levels) <= 0.02 * levels.size
        # y is computed from wide_q's levels: one level of 0.0125 where they differ, through a 3x3 convolution
        np.testing.assert_allclose(np.asarray(got["y"]), np.asarray(want["y"]), rtol=0,
                                   atol=0.05 * float(np.abs(np.asarray(want["y"])).max()))
    pinned = xrt.InferenceSession(model, engine="native", device="cuda:0",
                                  kernel_policy=xrt.KernelPolicy(qconv2d="int8_mma"))
    assert _qconv_kernels(pinned) == ["cuda_raw", "int8_mma", "int8_mma", "cuda_raw"]
    got = pinned.run(feeds)
    for name in ("y", "wide_q"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
