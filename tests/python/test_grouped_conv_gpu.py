"""Note [Grouped convolutions as GEMMs] (backends/cuda_raw/grouped_conv.cu): conv2d's `grouped_gemm` kernel takes
channels-last grouped convolutions whose groups reduce over 1024 or more values, ranks before cuDNN for them and is
timed against cuDNN's plans, the faster kept; its outputs agree with the cpu kernel's, from Python."""

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

# wav2vec 2.0's positional convolution (768 channels in 16 groups, kernel 128 along time) at a quarter of its width,
# and a 2-D case with an odd group width (40 channels a group: the element-wise gather) and a stride.
CASES = [
    dict(n=1, h=1, w=49, c=192, o=192, kh=1, kw=128, groups=4, strides=[1, 1], pads=[0, 64, 0, 64]),
    dict(n=2, h=9, w=11, c=120, o=60, kh=5, kw=7, groups=3, strides=[2, 1], pads=[2, 3, 2, 3]),
]


def grouped_inputs(case, rng):
    x = rng.uniform(-1, 1, (case["n"], case["h"], case["w"], case["c"])).astype(np.float16)
    w = rng.uniform(-0.1, 0.1, (case["o"], case["kh"], case["kw"], case["c"] // case["groups"])).astype(np.float16)
    b = rng.uniform(-0.5, 0.5, case["o"]).astype(np.float16)
    attrs = {"layout": "NHWC", "groups": case["groups"], "strides": case["strides"], "pads": case["pads"],
             "activation": "gelu"}
    return x, w, b, attrs


def cpu_reference(x, w, b, attrs):
    inputs = [xrt.from_numpy(a.astype(np.float32)) for a in (x, w, b)]
    return xrt.ops.call("conv2d", inputs + [None], attrs)[0].numpy()


@requires_gpu
@pytest.mark.parametrize("case", CASES, ids=["wav2vec2_like", "odd_groups_2d"])
def test_grouped_gemm_is_timed_against_cudnn_and_agrees_with_the_cpu(case):
    x, w, b, attrs = grouped_inputs(case, np.random.default_rng(3))
    gpu = [xrt.from_numpy(a).to("cuda:0") for a in (x, w, b)]
    outputs, decision = xrt.ops.call("conv2d", gpu + [None], attrs, return_decision=True)
    want = cpu_reference(x, w, b, attrs)
    got = outputs[0].cpu().numpy().astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=2e-2 * float(np.abs(want).max()))
    assert decision.rule == "autotuned" and "grouped GEMMs" in decision.reason, decision.reason
    timed = {c["kernel"] for c in decision.candidates if c.get("time_us") is not None}
    assert {"grouped_gemm", "cudnn"} <= timed, decision.candidates


@requires_gpu
def test_grouped_gemm_pinned_by_a_kernel_policy():
    case = CASES[0]
    x, w, b, attrs = grouped_inputs(case, np.random.default_rng(4))
    gpu = [xrt.from_numpy(a).to("cuda:0") for a in (x, w, b)]
    outputs, decision = xrt.ops.call("conv2d", gpu + [None], attrs, policy=xrt.KernelPolicy(conv2d="grouped_gemm"),
                                     return_decision=True)
    assert decision.kernel == "grouped_gemm", decision.reason
    want = cpu_reference(x, w, b, attrs)
    np.testing.assert_allclose(outputs[0].cpu().numpy().astype(np.float32), want, rtol=1e-2,
                               atol=2e-2 * float(np.abs(want).max()))
